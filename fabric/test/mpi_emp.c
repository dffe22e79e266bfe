/* A small MPI program for Open MPI over the emp libfabric provider (or any
 * other transport): ping-pong with a data check at several sizes, wildcard
 * receives (any source, any tag, in the sender's order), and every collective
 * (barrier, allreduce, bcast, allgather(v), reduce, scatter, gather,
 * alltoall, reduce_scatter, scan, exscan).
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

	{
		long v = rank + 1, sum = -1;
		MPI_Reduce(&v, &sum, 1, MPI_LONG, MPI_SUM, size - 1, MPI_COMM_WORLD);
		check(rank != size - 1 || sum == (long)size * (size + 1) / 2, "MPI_Reduce sum to the last rank");
	}
	{
		int *all = malloc(sizeof(int) * (size_t)size), mine = -1, ok = 1;
		for (int r = 0; r < size; r++)
			all[r] = r * 7;
		MPI_Scatter(all, 1, MPI_INT, &mine, 1, MPI_INT, 0, MPI_COMM_WORLD);
		ok &= mine == rank * 7;
		mine = rank * 3;
		memset(all, 0xff, sizeof(int) * (size_t)size);
		MPI_Gather(&mine, 1, MPI_INT, all, 1, MPI_INT, 0, MPI_COMM_WORLD);
		for (int r = 0; rank == 0 && r < size; r++)
			ok &= all[r] == r * 3;
		check(ok, "MPI_Scatter and MPI_Gather");
		free(all);
	}
	{
		int *out = malloc(sizeof(int) * (size_t)size), *in = malloc(sizeof(int) * (size_t)size), ok = 1;
		for (int r = 0; r < size; r++)
			out[r] = rank * 100 + r;
		MPI_Alltoall(out, 1, MPI_INT, in, 1, MPI_INT, MPI_COMM_WORLD);
		for (int r = 0; r < size; r++)
			ok &= in[r] == r * 100 + rank;
		check(ok, "MPI_Alltoall");
		int *counts = malloc(sizeof(int) * (size_t)size), got = -1;
		for (int r = 0; r < size; r++)
			counts[r] = 1;
		MPI_Reduce_scatter(out, &got, counts, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
		/* Element r of the sum: sum over ranks k of k * 100 + r. */
		check(got == 100 * size * (size - 1) / 2 + rank * size, "MPI_Reduce_scatter");
		free(counts);
		free(out);
		free(in);
	}
	{
		long v = rank + 1, inc = 0, exc = 0;
		MPI_Scan(&v, &inc, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
		MPI_Exscan(&v, &exc, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
		long want = (long)(rank + 1) * (rank + 2) / 2;
		check(inc == want && (rank == 0 || exc == want - v), "MPI_Scan and MPI_Exscan");
	}
	{
		int *all = malloc(sizeof(int) * (size_t)size * 2), *counts = malloc(sizeof(int) * (size_t)size);
		int *displs = malloc(sizeof(int) * (size_t)size), mine[2] = {rank, -rank}, ok = 1;
		for (int r = 0; r < size; r++) {
			counts[r] = 1 + (r & 1);
			displs[r] = 2 * r;
		}
		MPI_Allgatherv(mine, counts[rank], MPI_INT, all, counts, displs, MPI_INT, MPI_COMM_WORLD);
		for (int r = 0; r < size; r++)
			ok &= all[2 * r] == r && (!(r & 1) || all[2 * r + 1] == -r);
		check(ok, "MPI_Allgatherv");
		free(all);
		free(counts);
		free(displs);
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
