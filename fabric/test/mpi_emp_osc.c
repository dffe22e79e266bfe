/* MPI one-sided communication for Open MPI's osc rdma over btl ofi over the
 * emp provider (FI_RMA + FI_ATOMIC): puts and gets of several sizes under
 * fence, accumulate, fetch-and-op, passive-target locks. Not
 * MPI_Compare_and_swap: Open MPI 4.1's btl ofi dereferences the NULL local
 * handle osc rdma passes for its result (mca_btl_ofi_acswap), a crash in
 * Open MPI whatever the provider; fi_compare_atomic itself is tested in
 * fi_emp_unit.
 * Rank 0 prints "# N passed, M failed". Needs 2 ranks or more. */
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

#define WIN_BYTES (1u << 20)

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach mpirun as they come */
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	int right = (rank + 1) % size, left = (rank + size - 1) % size;
	unsigned char *base;
	MPI_Win win;
	MPI_Win_allocate(WIN_BYTES, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
	unsigned char *src = malloc(WIN_BYTES), *dst = malloc(WIN_BYTES);

	/* Put to the right neighbour, several sizes, under fence. */
	static const size_t sizes[] = {8, 4096, 65536, WIN_BYTES};
	for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
		size_t n = sizes[s];
		memset(base, 0, WIN_BYTES);
		for (size_t i = 0; i < n; i++)
			src[i] = (unsigned char)(i * 7 + (size_t)rank + s);
		MPI_Win_fence(0, win);
		MPI_Put(src, (int)n, MPI_BYTE, right, 0, (int)n, MPI_BYTE, win);
		MPI_Win_fence(0, win);
		int ok = 1;
		for (size_t i = 0; i < n && ok; i++)
			ok = base[i] == (unsigned char)(i * 7 + (size_t)left + s);
		char what[64];
		snprintf(what, sizeof what, "MPI_Put %zu B under fence", n);
		check(ok, what);
	}

	/* Get from the left neighbour what it holds. */
	for (size_t i = 0; i < WIN_BYTES; i++)
		base[i] = (unsigned char)(i + (size_t)rank * 3);
	MPI_Win_fence(0, win);
	MPI_Get(dst, 65536, MPI_BYTE, left, 100, 65536, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	int ok = 1;
	for (size_t i = 0; i < 65536 && ok; i++)
		ok = dst[i] == (unsigned char)(i + 100 + (size_t)left * 3);
	check(ok, "MPI_Get 64 KiB under fence");

	/* Accumulate: everyone adds rank + 1 into rank 0's word. */
	int64_t *word = (int64_t *)base;
	MPI_Win_fence(0, win);
	word[0] = 0;
	MPI_Win_fence(0, win);
	int64_t add = rank + 1;
	MPI_Accumulate(&add, 1, MPI_INT64_T, 0, 0, 1, MPI_INT64_T, MPI_SUM, win);
	MPI_Win_fence(0, win);
	int64_t want = (int64_t)size * (size + 1) / 2;
	int64_t got = word[0];
	MPI_Bcast(&got, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
	check(got == want, "MPI_Accumulate MPI_SUM from every rank");

	/* Passive target: fetch-and-op under lock_all. */
	MPI_Win_fence(0, win);
	word[1] = 0;
	MPI_Win_fence(0, win);
	MPI_Win_lock_all(0, win);
	int64_t one = 1, old = -2;
	MPI_Fetch_and_op(&one, &old, MPI_INT64_T, 0, 8, MPI_SUM, win);
	MPI_Win_flush(0, win);
	MPI_Win_unlock_all(win);
	MPI_Barrier(MPI_COMM_WORLD);
	int64_t counter = word[1];
	MPI_Bcast(&counter, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
	check(old >= 0 && old < size && counter == size, "MPI_Fetch_and_op: each rank saw a distinct old value");

	/* Exclusive lock, put, unlock: the data is there after unlock. */
	if (rank == 1) {
		int64_t v = 0x5A5A;
		MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
		MPI_Put(&v, 1, MPI_INT64_T, 0, 24, 1, MPI_INT64_T, win);
		MPI_Win_unlock(0, win);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	int64_t seen = 0;
	if (rank == 0) {
		MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
		seen = word[3];
		MPI_Win_unlock(0, win);
	}
	MPI_Bcast(&seen, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
	check(seen == 0x5A5A, "MPI_Win_lock exclusive + MPI_Put");

	MPI_Win_free(&win);
	free(src);
	free(dst);
	if (rank == 0)
		printf("# %d passed, %d failed\n", passed, failed);
	MPI_Finalize();
	return failed ? 1 : 0;
}
