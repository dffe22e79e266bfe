/* The out-of-order tags program under MPI: rank 0 sends tag 1 then tag 2
 * to rank 1, which receives tag 2 first (MPI's non-overtaking rule orders
 * only messages that match the same receive), for 64 B and 4 MiB, after
 * MPI_Iprobe and MPI_Probe with MPI_ANY_SOURCE have seen both. Prints
 * "# N passed, M failed" on rank 1. Needs 2 ranks; others only join. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static void check(int ok, const char *what, size_t n)
{
	printf("%s - %zu B: %s\n", ok ? "ok" : "not ok", n, what);
	if (ok)
		passed++;
	else
		failed++;
}

static void fill(unsigned char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 7 + seed);
}

static void round_trip(int rank, size_t n)
{
	unsigned char *one = malloc(n), *two = malloc(n), *want = malloc(n);
	if (rank == 0) {
		fill(one, n, 1);
		fill(two, n, 2);
		MPI_Request rq[2];
		MPI_Isend(one, (int)n, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &rq[0]);
		MPI_Isend(two, (int)n, MPI_BYTE, 1, 2, MPI_COMM_WORLD, &rq[1]);
		MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
	} else if (rank == 1) {
		MPI_Status st;
		int flag = 0, count = -1;
		/* Both are on their way: poll until tag 2 is there. */
		while (!flag)
			MPI_Iprobe(MPI_ANY_SOURCE, 2, MPI_COMM_WORLD, &flag, &st);
		MPI_Get_count(&st, MPI_BYTE, &count);
		check(st.MPI_SOURCE == 0 && st.MPI_TAG == 2 && count == (int)n, "MPI_Iprobe(ANY_SOURCE, tag 2)", n);
		MPI_Probe(MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, &st);
		MPI_Get_count(&st, MPI_BYTE, &count);
		check(st.MPI_SOURCE == 0 && st.MPI_TAG == 1 && count == (int)n, "MPI_Probe(ANY_SOURCE, tag 1)", n);
		MPI_Recv(two, (int)n, MPI_BYTE, MPI_ANY_SOURCE, 2, MPI_COMM_WORLD, &st);
		fill(want, n, 2);
		check(st.MPI_SOURCE == 0 && !memcmp(two, want, n), "tag 2 received first, data intact", n);
		MPI_Recv(one, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &st);
		fill(want, n, 1);
		check(!memcmp(one, want, n), "then tag 1, data intact", n);
	}
	free(one);
	free(two);
	free(want);
}

int main(int argc, char **argv)
{
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size < 2) {
		fprintf(stderr, "mpi_ooo: needs 2 ranks\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	round_trip(rank, 64);
	round_trip(rank, 4u << 20);
	if (rank == 1)
		printf("# %d passed, %d failed\n", passed, failed);
	int bad = failed, any;
	MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	MPI_Finalize();
	return any ? 1 : 0;
}
