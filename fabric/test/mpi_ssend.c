/* Synchronous sends under MPI, on 3 ranks or more: Open MPI's mtl ofi
 * acknowledges an MPI_Ssend with a message from the receiver, and finds
 * the sender of any message in the remote CQ data when the provider has
 * it (its "ofi_tag_full" layout). Over emp without remote CQ data on
 * tagged messages, the sender of an MPI_Ssend to a rank other than 0
 * waited for ever (docs/libfabric.md). Here every rank MPI_Ssends to every
 * other (64 B and 1 MiB), MPI_Issend goes round a ring, receives with
 * MPI_ANY_SOURCE and MPI_Probe must name the right source, and Open MPI's
 * own barrier (its default algorithm, which uses synchronous sends at 3
 * ranks or more) runs. Prints "# N passed, M failed" on rank 0, which
 * gathers every rank's count. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static void check(int ok, int rank, const char *what, size_t n)
{
	if (!ok)
		printf("not ok - rank %d, %zu B: %s\n", rank, n, what);
	if (ok)
		passed++;
	else
		failed++;
}

static void fill(unsigned char *b, size_t n, int from, int to)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 13 + from * 31 + to * 7);
}

/* Every ordered pair (i, j): i MPI_Ssends to j in turn, j receives with
 * MPI_ANY_SOURCE and checks the source, tag and bytes. */
static void all_pairs(int rank, int size, size_t n)
{
	unsigned char *buf = malloc(n), *want = malloc(n);
	for (int shift = 1; shift < size; shift++) {
		int to = (rank + shift) % size, from = (rank - shift + size) % size;
		/* Half the ranks send first, so no cycle of blocking Ssends waits. */
		for (int phase = 0; phase < 2; phase++) {
			int sending = (phase == 0) == ((rank / shift) % 2 == 0);
			if (sending) {
				fill(buf, n, rank, to);
				MPI_Ssend(buf, (int)n, MPI_BYTE, to, 100 + shift, MPI_COMM_WORLD);
			} else {
				MPI_Status st;
				int count = -1;
				memset(buf, 0, n);
				MPI_Recv(buf, (int)n, MPI_BYTE, MPI_ANY_SOURCE, 100 + shift, MPI_COMM_WORLD, &st);
				MPI_Get_count(&st, MPI_BYTE, &count);
				fill(want, n, from, rank);
				check(st.MPI_SOURCE == from && st.MPI_TAG == 100 + shift && count == (int)n &&
					      !memcmp(buf, want, n),
				      rank, "MPI_Ssend received with MPI_ANY_SOURCE: source, tag, data", n);
			}
		}
	}
	free(buf);
	free(want);
}

/* MPI_Issend to the right neighbour, MPI_Probe(ANY_SOURCE) then MPI_Recv
 * from the left one. */
static void ring(int rank, int size, size_t n)
{
	unsigned char *out = malloc(n), *in = malloc(n), *want = malloc(n);
	int right = (rank + 1) % size, left = (rank - 1 + size) % size;
	fill(out, n, rank, right);
	MPI_Request rq;
	MPI_Issend(out, (int)n, MPI_BYTE, right, 7, MPI_COMM_WORLD, &rq);
	MPI_Status st;
	MPI_Probe(MPI_ANY_SOURCE, 7, MPI_COMM_WORLD, &st);
	int count = -1;
	MPI_Get_count(&st, MPI_BYTE, &count);
	check(st.MPI_SOURCE == left && count == (int)n, rank, "MPI_Probe(ANY_SOURCE) names the sender", n);
	MPI_Recv(in, (int)n, MPI_BYTE, st.MPI_SOURCE, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	MPI_Wait(&rq, MPI_STATUS_IGNORE);
	fill(want, n, left, rank);
	check(!memcmp(in, want, n), rank, "MPI_Issend ring: data intact", n);
	free(out);
	free(in);
	free(want);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	for (int i = 0; i < 20; i++)
		MPI_Barrier(MPI_COMM_WORLD);
	check(1, rank, "20 barriers (Open MPI's default algorithm)", 0);
	size_t sizes[] = {0, 64, 1 << 20};
	for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		all_pairs(rank, size, sizes[k]);
		ring(rank, size, sizes[k]);
		MPI_Barrier(MPI_COMM_WORLD);
	}
	int mine[2] = {passed, failed}, sum[2] = {0, 0};
	MPI_Reduce(mine, sum, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0)
		printf("# %d passed, %d failed\n", sum[0], sum[1]);
	MPI_Finalize();
	return rank == 0 && sum[1] ? 1 : 0;
}
