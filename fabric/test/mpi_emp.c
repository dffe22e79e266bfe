/* A small MPI program for Open MPI over the emp libfabric provider (or any
 * other transport): ping-pong with a data check at several sizes, wildcard
 * receives (any source, any tag, in the sender's order), and every
 * collective (blocking, and the nonblocking barrier, allreduce and bcast).
 * Rank 0 prints "# N passed, M failed" and, for comparing transports, the
 * 8-byte one-way latency ("latency 8 B: X us"). Needs 2 ranks or more. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size, passed, failed;

static void check(int ok, const char *what)
{
	int all_ok;
	MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
	if (rank == 0)
		printf("%s - %s\n", all_ok ? "ok" : "not ok", what);
	if (all_ok)
		passed++;
	else
		failed++;
}

static void fill(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 31 + seed);
}

static int pingpong(size_t n, int iters)
{
	unsigned char *s = malloc(n ? n : 1), *r = malloc(n ? n : 1);
	int ok = 1;
	for (int i = 0; i < iters && ok; i++) {
		if (rank == 0) {
			fill(s, n, (unsigned)i);
			MPI_Send(s, (int)n, MPI_BYTE, 1, i, MPI_COMM_WORLD);
			MPI_Recv(r, (int)n, MPI_BYTE, 1, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			fill(s, n, (unsigned)i + 1);
			ok = !memcmp(s, r, n);
		} else if (rank == 1) {
			MPI_Recv(r, (int)n, MPI_BYTE, 0, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			fill(s, n, (unsigned)i);
			ok = !memcmp(s, r, n);
			fill(s, n, (unsigned)i + 1);
			MPI_Send(s, (int)n, MPI_BYTE, 0, i, MPI_COMM_WORLD);
		}
	}
	free(s);
	free(r);
	return ok;
}

int main(int argc, char **argv)
{
	char what[128];
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size < 2) {
		fprintf(stderr, "mpi_emp: needs 2 ranks or more\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}

	size_t sizes[] = {0, 1, 8, 1024, 4096, 65536, 1 << 20, 4 << 20};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		snprintf(what, sizeof what, "ping-pong %zu B, data checked", sizes[i]);
		check(pingpong(sizes[i], sizes[i] > 65536 ? 5 : 50), what);
	}

	/* Wildcards: every other rank sends 3 tagged messages to rank 0, which
	 * takes them with MPI_ANY_SOURCE/MPI_ANY_TAG; per sender they come in
	 * order (non-overtaking). */
	{
		int ok = 1;
		if (rank == 0) {
			int *next = calloc((size_t)size, sizeof *next);
			for (int k = 0; k < 3 * (size - 1); k++) {
				int v;
				MPI_Status st;
				MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
				int src = st.MPI_SOURCE;
				ok &= src > 0 && src < size && st.MPI_TAG == 100 + next[src] && v == src * 10 + next[src];
				if (src > 0 && src < size)
					next[src]++;
			}
			free(next);
		} else {
			for (int k = 0; k < 3; k++) {
				int v = rank * 10 + k;
				MPI_Send(&v, 1, MPI_INT, 0, 100 + k, MPI_COMM_WORLD);
			}
		}
		check(ok, "wildcard receives: any source, any tag, in order per sender");
	}

	/* Nonblocking, both directions at once. */
	{
		int peer = rank ^ 1, ok = 1;
		if (peer < size) {
			enum { N = 16 };
			int out[N], in[N];
			MPI_Request rq[2 * N];
			for (int k = 0; k < N; k++) {
				out[k] = rank * 1000 + k;
				MPI_Irecv(&in[k], 1, MPI_INT, peer, k, MPI_COMM_WORLD, &rq[k]);
			}
			for (int k = 0; k < N; k++)
				MPI_Isend(&out[k], 1, MPI_INT, peer, k, MPI_COMM_WORLD, &rq[N + k]);
			MPI_Waitall(2 * N, rq, MPI_STATUSES_IGNORE);
			for (int k = 0; k < N; k++)
				ok &= in[k] == peer * 1000 + k;
		}
		check(ok, "Isend/Irecv both ways, Waitall");
	}

	/* Collectives. */
	MPI_Barrier(MPI_COMM_WORLD);
	check(1, "MPI_Barrier");
	{
		long v = rank + 1, sum = 0;
		MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
		check(sum == (long)size * (size + 1) / 2, "MPI_Allreduce sum");
	}
	{
		size_t n = 1 << 20;
		unsigned char *b = malloc(n), *want = malloc(n);
		fill(want, n, 99);
		if (rank == 0)
			memcpy(b, want, n);
		MPI_Bcast(b, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
		check(!memcmp(b, want, n), "MPI_Bcast 1 MiB");
		free(b);
		free(want);
	}
	{
		int *all = malloc(sizeof(int) * (size_t)size), ok = 1;
		MPI_Allgather(&rank, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
		for (int r = 0; r < size; r++)
			ok &= all[r] == r;
		check(ok, "MPI_Allgather");
		free(all);
	}

	/* The rest of MPI's collectives, each result checked. */
	{
		int n = size, *all = malloc(sizeof(int) * (size_t)n * 4), *cnt = malloc(sizeof(int) * (size_t)n),
		    *dsp = malloc(sizeof(int) * (size_t)n), v, ok;
		long lv = rank + 1, lsum = 0;

		MPI_Reduce(&lv, &lsum, 1, MPI_LONG, MPI_SUM, n - 1, MPI_COMM_WORLD);
		check(rank != n - 1 || lsum == (long)n * (n + 1) / 2, "MPI_Reduce sum to the last rank");

		for (int r = 0; r < n; r++)
			all[r] = -1;
		v = rank * 3;
		MPI_Gather(&v, 1, MPI_INT, all, 1, MPI_INT, 0, MPI_COMM_WORLD);
		ok = 1;
		for (int r = 0; rank == 0 && r < n; r++)
			ok &= all[r] == r * 3;
		check(ok, "MPI_Gather");

		for (int r = 0; r < n; r++)
			all[r] = r * 5;
		v = -1;
		MPI_Scatter(all, 1, MPI_INT, &v, 1, MPI_INT, 0, MPI_COMM_WORLD);
		check(v == rank * 5, "MPI_Scatter");

		/* Alltoall: rank r sends r*100+d to rank d. */
		int *out = all, *in = all + 2 * n;
		for (int d = 0; d < n; d++)
			out[d] = rank * 100 + d;
		MPI_Alltoall(out, 1, MPI_INT, in, 1, MPI_INT, MPI_COMM_WORLD);
		ok = 1;
		for (int s2 = 0; s2 < n; s2++)
			ok &= in[s2] == s2 * 100 + rank;
		check(ok, "MPI_Alltoall");

		/* The v-forms: one element per rank, laid out in reverse. */
		for (int r = 0; r < n; r++) {
			cnt[r] = 1;
			dsp[r] = n - 1 - r;
		}
		MPI_Alltoallv(out, cnt, dsp, MPI_INT, in, cnt, dsp, MPI_INT, MPI_COMM_WORLD);
		ok = 1;
		for (int s2 = 0; s2 < n; s2++)
			ok &= in[n - 1 - s2] == s2 * 100 + (n - 1 - rank);
		check(ok, "MPI_Alltoallv");
		v = rank + 7;
		MPI_Allgatherv(&v, 1, MPI_INT, in, cnt, dsp, MPI_INT, MPI_COMM_WORLD);
		ok = 1;
		for (int r = 0; r < n; r++)
			ok &= in[n - 1 - r] == r + 7;
		check(ok, "MPI_Allgatherv");
		MPI_Gatherv(&v, 1, MPI_INT, in, cnt, dsp, MPI_INT, 0, MPI_COMM_WORLD);
		ok = 1;
		for (int r = 0; rank == 0 && r < n; r++)
			ok &= in[n - 1 - r] == r + 7;
		check(ok, "MPI_Gatherv");
		for (int r = 0; r < n; r++)
			out[n - 1 - r] = r * 11;
		v = -1;
		MPI_Scatterv(out, cnt, dsp, MPI_INT, &v, 1, MPI_INT, 0, MPI_COMM_WORLD);
		check(v == rank * 11, "MPI_Scatterv");

		/* Reduce_scatter(_block): element d of every rank's vector,
		 * d + rank, summed, lands on rank d. */
		for (int d = 0; d < n; d++)
			out[d] = d + rank;
		v = -1;
		MPI_Reduce_scatter_block(out, &v, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		check(v == n * rank + n * (n - 1) / 2, "MPI_Reduce_scatter_block");
		v = -1;
		MPI_Reduce_scatter(out, &v, cnt, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		check(v == n * rank + n * (n - 1) / 2, "MPI_Reduce_scatter");

		int one = rank + 1, pre = -1;
		MPI_Scan(&one, &pre, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		check(pre == (rank + 1) * (rank + 2) / 2, "MPI_Scan");
		pre = -1;
		MPI_Exscan(&one, &pre, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		check(rank == 0 || pre == rank * (rank + 1) / 2, "MPI_Exscan");

		int mx = -1;
		MPI_Allreduce(&rank, &mx, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
		check(mx == n - 1, "MPI_Allreduce max");

		/* Nonblocking collectives. */
		MPI_Request rq[2];
		long isum = 0;
		MPI_Ibarrier(MPI_COMM_WORLD, &rq[0]);
		MPI_Iallreduce(&lv, &isum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &rq[1]);
		MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
		check(isum == (long)n * (n + 1) / 2, "MPI_Ibarrier and MPI_Iallreduce");
		int b = rank == 0 ? 4242 : 0;
		MPI_Ibcast(&b, 1, MPI_INT, 0, MPI_COMM_WORLD, &rq[0]);
		MPI_Wait(&rq[0], MPI_STATUS_IGNORE);
		check(b == 4242, "MPI_Ibcast");
		free(all);
		free(cnt);
		free(dsp);
	}

	/* 8-byte one-way latency between ranks 0 and 1 (for comparisons; the
	 * test does not judge it). */
	{
		char b[8] = {0};
		int iters = 5000;
		double t0 = 0;
		MPI_Barrier(MPI_COMM_WORLD);
		for (int i = -100; i < iters; i++) {
			if (i == 0)
				t0 = MPI_Wtime();
			if (rank == 0) {
				MPI_Send(b, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
				MPI_Recv(b, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			} else if (rank == 1) {
				MPI_Recv(b, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				MPI_Send(b, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
			}
		}
		if (rank == 0)
			printf("latency 8 B: %.2f us\n", (MPI_Wtime() - t0) * 1e6 / iters / 2);
	}

	if (rank == 0)
		printf("# %d passed, %d failed\n", passed, failed);
	MPI_Finalize();
	return failed ? 1 : 0;
}
