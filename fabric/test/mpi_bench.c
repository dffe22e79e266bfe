/* The MPI benchmark `emp bench mpi` runs over every transport (EMP through
 * the libfabric provider, libfabric tcp and udp, Open MPI's shared memory):
 * the same program, the same methods, the OSU micro-benchmarks' ones.
 *
 *   mpi_bench [-m latency,bw,mr,barrier,allreduce] [-s 8,1024,...]
 *             [-a 8,64,...] [-r REPS] [-w WINDOW] [-q]
 *
 * -m  measures (default all); -s sizes in bytes for latency, bw and mr;
 * -a  sizes in bytes for allreduce (sums of doubles, so multiples of 8);
 * -r  repetitions of each measurement: the median is reported (the machine
 *     is shared and noisy), with the minimum beside it;
 * -w  window of bw and mr (messages in flight, OSU's 64; fewer for large
 *     messages, whose window's receive buffers stay within 16 MiB);
 * -q  quick: few iterations (a smoke check that the program runs).
 *
 *   latency    ranks 0 and 1 ping-pong (osu_latency): one-way µs;
 *   bw         rank 0 posts a window of nonblocking sends, rank 1 the
 *              receives, then a 4-byte answer (osu_bw): MB/s (10^6 B/s);
 *   mr         the same windows of small messages between every pair of
 *              ranks i and i + n/2 (osu_mbw_mr): messages/s of all pairs;
 *   barrier    consecutive MPI_Barrier over all ranks: µs per call;
 *   allreduce  MPI_Allreduce (sum of doubles) over all ranks, a barrier
 *              before each call (seed 001 §4.3.3): µs per call, the
 *              maximum over ranks of each rank's mean. Results checked.
 *
 * Rank 0 prints one line per figure:
 *   result MEASURE RANKS SIZE MEDIAN MIN UNIT
 * and "# ..." comments; data of latency and bw is checked once per size
 * ("error ..." and exit 1 when wrong). Needs 2 ranks or more. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_SIZES = 64, MAX_REPS = 101, TAG = 7, ACK = 8 };

/* Receive buffers of one window, each message its own slot: at most this
 * much, so large messages get a smaller window (16 MiB is 16 of 1 MiB). */
#define WINDOW_BYTES ((size_t)16 << 20)

static int rank, nranks, quick, window = 64, reps = 5;

static void die(const char *what)
{
	if (rank == 0)
		fprintf(stderr, "mpi_bench: %s\n", what);
	MPI_Abort(MPI_COMM_WORLD, 2);
}

static int parse_sizes(const char *arg, size_t *out)
{
	int n = 0;
	char *copy = strdup(arg), *save = NULL;
	for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		char *end;
		unsigned long long v = strtoull(t, &end, 10);
		if (*end || n == MAX_SIZES || v > (64ULL << 20)) {
			free(copy);
			return -1;
		}
		out[n++] = (size_t)v;
	}
	free(copy);
	return n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Median and minimum of rank 0's samples, printed as one result line. */
static void report(const char *measure, size_t size, double *v, int n, const char *unit, int higher_is_better)
{
	if (rank != 0)
		return;
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	double median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
	double best = higher_is_better ? v[n - 1] : v[0];
	printf("result %s %d %zu %.3f %.3f %s\n", measure, nranks, size, median, best, unit);
	fflush(stdout);
}

static int iters_for(size_t size, int small, int large)
{
	/* Over 1 MiB a fifth of large (at least 3): a 4 MiB ping-pong moves
	 * 8 MiB per iteration, and the slow transports dominate the run. */
	int huge = large / 5 > 3 ? large / 5 : 3;
	int it = size <= 8192 ? small : size <= 65536 ? small / 4 : size <= (1 << 20) ? large : huge;
	if (quick)
		it = it / 50 > 2 ? it / 50 : 2;
	return it;
}

static void fill(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 131 + seed);
}

static int check(const unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != (unsigned char)(i * 131 + seed))
			return 0;
	return 1;
}

/* One message each way with a data check, before a size is timed. */
static void verify_pingpong(unsigned char *s, unsigned char *r, size_t size)
{
	int ok = 1, all;
	if (rank == 0) {
		fill(s, size, 1);
		MPI_Send(s, (int)size, MPI_BYTE, 1, TAG, MPI_COMM_WORLD);
		MPI_Recv(r, (int)size, MPI_BYTE, 1, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		ok = check(r, size, 2);
	} else if (rank == 1) {
		MPI_Recv(r, (int)size, MPI_BYTE, 0, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		ok = check(r, size, 1);
		fill(s, size, 2);
		MPI_Send(s, (int)size, MPI_BYTE, 0, TAG, MPI_COMM_WORLD);
	}
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
	if (!all) {
		if (rank == 0)
			printf("error latency %zu: data differs\n", size);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
}

static void latency(const size_t *sizes, int n, unsigned char *s, unsigned char *r)
{
	for (int k = 0; k < n; k++) {
		size_t size = sizes[k];
		double v[MAX_REPS];
		int iters = iters_for(size, 2000, 100), warm = iters / 10 + 1;
		verify_pingpong(s, r, size);
		for (int rep = 0; rep < reps; rep++) {
			double t0 = 0;
			MPI_Barrier(MPI_COMM_WORLD);
			for (int i = -warm; i < iters; i++) {
				if (i == 0)
					t0 = MPI_Wtime();
				if (rank == 0) {
					MPI_Send(s, (int)size, MPI_BYTE, 1, TAG, MPI_COMM_WORLD);
					MPI_Recv(r, (int)size, MPI_BYTE, 1, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				} else if (rank == 1) {
					MPI_Recv(r, (int)size, MPI_BYTE, 0, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
					MPI_Send(s, (int)size, MPI_BYTE, 0, TAG, MPI_COMM_WORLD);
				}
			}
			v[rep] = (MPI_Wtime() - t0) * 1e6 / iters / 2;
		}
		report("latency", size, v, reps, "us", 0);
	}
}

/* Windows of `size`-byte messages from each sender to its receiver, each
 * window answered with a 4-byte ack (osu_bw, osu_mbw_mr). Returns seconds. */
static int window_for(size_t size)
{
	size_t fit = size ? WINDOW_BYTES / size : (size_t)window;
	return fit < 1 ? 1 : fit < (size_t)window ? (int)fit : window;
}

static double windows(int sender, int receiver, size_t size, int iters, int warm, unsigned char *s, unsigned char *r,
		      MPI_Request *rq)
{
	int win = window_for(size);
	double t0 = 0;
	int ack = 0;
	MPI_Barrier(MPI_COMM_WORLD);
	for (int i = -warm; i < iters; i++) {
		if (i == 0)
			t0 = MPI_Wtime();
		if (sender) {
			for (int w = 0; w < win; w++)
				MPI_Isend(s, (int)size, MPI_BYTE, receiver, TAG, MPI_COMM_WORLD, &rq[w]);
			MPI_Waitall(win, rq, MPI_STATUSES_IGNORE);
			MPI_Recv(&ack, 1, MPI_INT, receiver, ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else if (receiver >= 0) {
			/* Each receive of a window into its own slot of r. */
			for (int w = 0; w < win; w++)
				MPI_Irecv(r + (size_t)w * size, (int)size, MPI_BYTE, receiver, TAG, MPI_COMM_WORLD, &rq[w]);
			MPI_Waitall(win, rq, MPI_STATUSES_IGNORE);
			MPI_Send(&ack, 1, MPI_INT, receiver, ACK, MPI_COMM_WORLD);
		}
	}
	double t = MPI_Wtime() - t0;
	MPI_Barrier(MPI_COMM_WORLD);
	return t;
}

static void bandwidth(const size_t *sizes, int n, unsigned char *s, unsigned char *r, MPI_Request *rq)
{
	for (int k = 0; k < n; k++) {
		size_t size = sizes[k];
		double v[MAX_REPS];
		int iters = iters_for(size, 100, 10);
		verify_pingpong(s, r, size);
		for (int rep = 0; rep < reps; rep++) {
			/* Rank 0 sends to 1; rank 1 receives from 0; others idle. */
			int peer = rank == 0 ? 1 : rank == 1 ? 0 : -1;
			double t = windows(rank == 0, peer, size, iters, 2, s, r, rq);
			MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
			v[rep] = (double)size * window_for(size) * iters / t / 1e6;
		}
		report("bw", size, v, reps, "MB/s", 1);
	}
}

static void message_rate(const size_t *sizes, int n, unsigned char *s, unsigned char *r, MPI_Request *rq)
{
	int pairs = nranks / 2;
	int sender = rank < pairs, peer = rank < pairs ? rank + pairs : rank < 2 * pairs ? rank - pairs : -1;
	for (int k = 0; k < n; k++) {
		size_t size = sizes[k];
		double v[MAX_REPS];
		int iters = iters_for(size, 200, 10);
		for (int rep = 0; rep < reps; rep++) {
			double t = windows(sender && peer >= 0, peer, size, iters, 2, s, r, rq), slowest;
			/* The rate of all pairs over the slowest sender's time. */
			MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
			v[rep] = (double)pairs * window_for(size) * iters / slowest;
		}
		report("mr", size, v, reps, "msg/s", 1);
	}
}

static void barrier(void)
{
	double v[MAX_REPS];
	int iters = quick ? 20 : 2000;
	for (int rep = 0; rep < reps; rep++) {
		MPI_Barrier(MPI_COMM_WORLD);
		for (int i = 0; i < 50; i++)
			MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (int i = 0; i < iters; i++)
			MPI_Barrier(MPI_COMM_WORLD);
		double mine = (MPI_Wtime() - t0) * 1e6 / iters, mean;
		MPI_Allreduce(&mine, &mean, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		v[rep] = mean / nranks;
	}
	report("barrier", 0, v, reps, "us", 0);
}

static void allreduce(const size_t *sizes, int n)
{
	for (int k = 0; k < n; k++) {
		size_t count = sizes[k] / sizeof(double);
		if (!count)
			count = 1;
		double *in = malloc(count * sizeof *in), *out = malloc(count * sizeof *out);
		double v[MAX_REPS];
		int iters = iters_for(count * sizeof(double), 1000, 50);
		for (size_t i = 0; i < count; i++)
			in[i] = (double)(rank + 1) * (double)(i % 7 + 1);
		/* Sums of small integers are exact in any order. */
		MPI_Allreduce(in, out, (int)count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		int ok = 1, all;
		double ranks_sum = (double)nranks * (nranks + 1) / 2;
		for (size_t i = 0; i < count; i++)
			ok &= out[i] == ranks_sum * (double)(i % 7 + 1);
		MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
		if (!all) {
			if (rank == 0)
				printf("error allreduce %zu: wrong sum\n", count * sizeof(double));
			MPI_Abort(MPI_COMM_WORLD, 1);
		}
		for (int rep = 0; rep < reps; rep++) {
			double inside = 0, worst;
			for (int i = -(iters / 10) - 1; i < iters; i++) {
				MPI_Barrier(MPI_COMM_WORLD);
				double t0 = MPI_Wtime();
				MPI_Allreduce(in, out, (int)count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
				if (i >= 0)
					inside += MPI_Wtime() - t0;
			}
			double mine = inside * 1e6 / iters;
			MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
			v[rep] = worst;
		}
		report("allreduce", count * sizeof(double), v, reps, "us", 0);
		free(in);
		free(out);
	}
}

static int wants(const char *list, const char *m)
{
	size_t n = strlen(m);
	for (const char *p = list; (p = strstr(p, m)); p += n)
		if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == 0))
			return 1;
	return 0;
}

int main(int argc, char **argv)
{
	size_t sizes[MAX_SIZES], ar_sizes[MAX_SIZES];
	int nsizes = 0, nar = 0, opt;
	const char *measures = "latency,bw,mr,barrier,allreduce";
	static const size_t default_sizes[] = {8, 64, 512, 4096, 32768, 262144, 1 << 20, 4 << 20};
	static const size_t default_ar[] = {8, 64, 512, 4096, 32768};

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	while ((opt = getopt(argc, argv, "m:s:a:r:w:q")) != -1) {
		switch (opt) {
		case 'm':
			measures = optarg;
			break;
		case 's':
			if ((nsizes = parse_sizes(optarg, sizes)) <= 0)
				die("-s: sizes are comma-separated byte counts up to 64 MiB");
			break;
		case 'a':
			if ((nar = parse_sizes(optarg, ar_sizes)) <= 0)
				die("-a: sizes are comma-separated byte counts up to 64 MiB");
			break;
		case 'r':
			reps = atoi(optarg);
			if (reps < 1 || reps > MAX_REPS)
				die("-r: repetitions from 1 to 101");
			break;
		case 'w':
			window = atoi(optarg);
			if (window < 1 || window > 1024)
				die("-w: window from 1 to 1024");
			break;
		case 'q':
			quick = 1;
			break;
		default:
			die("usage: mpi_bench [-m measures] [-s sizes] [-a sizes] [-r reps] [-w window] [-q]");
		}
	}
	for (const char *p = measures; *p;) {
		size_t n = strcspn(p, ",");
		static const char *known[] = {"latency", "bw", "mr", "barrier", "allreduce"};
		int ok = 0;
		for (size_t i = 0; i < 5; i++)
			ok |= strlen(known[i]) == n && !strncmp(p, known[i], n);
		if (!ok)
			die("-m: measures are latency, bw, mr, barrier, allreduce");
		p += n + (p[n] == ',');
	}
	if (nranks < 2)
		die("needs 2 ranks or more");
	if (!nsizes) {
		nsizes = (int)(sizeof default_sizes / sizeof *default_sizes);
		memcpy(sizes, default_sizes, sizeof default_sizes);
	}
	if (!nar) {
		nar = (int)(sizeof default_ar / sizeof *default_ar);
		memcpy(ar_sizes, default_ar, sizeof default_ar);
	}
	size_t largest = 4;
	for (int i = 0; i < nsizes; i++)
		largest = sizes[i] > largest ? sizes[i] : largest;
	/* bw's receiver takes a window of messages into distinct slots. */
	size_t rbytes = largest;
	for (int i = 0; i < nsizes; i++)
		if ((size_t)window_for(sizes[i]) * sizes[i] > rbytes)
			rbytes = (size_t)window_for(sizes[i]) * sizes[i];
	unsigned char *s = malloc(largest), *r = malloc(rbytes);
	MPI_Request *rq = malloc(sizeof *rq * (size_t)window);
	if (!s || !r || !rq)
		die("out of memory for the buffers");
	memset(s, 1, largest);
	memset(r, 0, rbytes);
	if (rank == 0)
		printf("# mpi_bench: %d ranks, %d repetitions (median, min), window %d%s\n", nranks, reps, window,
		       quick ? ", quick" : "");

	if (wants(measures, "latency"))
		latency(sizes, nsizes, s, r);
	if (wants(measures, "bw"))
		bandwidth(sizes, nsizes, s, r, rq);
	if (wants(measures, "mr")) {
		size_t small[MAX_SIZES];
		int nsmall = 0;
		for (int i = 0; i < nsizes; i++)
			if (sizes[i] <= 8192)
				small[nsmall++] = sizes[i];
		message_rate(small, nsmall, s, r, rq);
	}
	if (wants(measures, "barrier"))
		barrier();
	if (wants(measures, "allreduce"))
		allreduce(ar_sizes, nar);

	free(s);
	free(r);
	free(rq);
	MPI_Finalize();
	return 0;
}
