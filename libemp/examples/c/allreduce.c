/* Every rank contributes rank + 1; the NIC sums them (allreduce) and
 * broadcasts a greeting from rank 0, after a NIC barrier; then the last
 * rank sends a reply to everyone by reliable broadcast over the wire's
 * multicast, with NAKs (EMP_1.6).
 * Run with: emp run -n 4 -- ./allreduce   (rank r on NIC r, port 0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "emp.h"

int main(void)
{
	const char *r = getenv("EMP_RANK"), *s = getenv("EMP_SIZE");
	int rank = r ? atoi(r) : 0, size = s ? atoi(s) : 1, err = 0;
	struct emp_device *dev = emp_open_device(NULL, &err);
	if (!dev) {
		fprintf(stderr, "emp_open_device: %s\n", strerror(-err));
		return 1;
	}
	/* Every rank's port is open before the first collective. */
	if ((err = emp_job_barrier(dev))) {
		fprintf(stderr, "emp_job_barrier: %s\n", strerror(-err));
		return 1;
	}
	struct emp_endpoint members[64];
	for (int i = 0; i < size && i < 64; i++) {
		members[i].node = (uint16_t)i;
		members[i].port = 0;
	}
	struct emp_group *g = emp_group_create(dev, 1, members, (size_t)size, &err);
	if (!g) {
		fprintf(stderr, "emp_group_create: %s\n", strerror(-err));
		return 1;
	}
	uint32_t key, st = 0;
	uint64_t off;
	int64_t *buf = emp_alloc(dev, 4096, &key, &off);
	buf[0] = rank + 1;
	struct emp_sge in = { key, 8, off }, out = { key, 8, off + 8 };
	if (emp_barrier(dev, g, EMP_BARRIER_DISSEMINATION, &st) || emp_allreduce(dev, g, EMP_I64, EMP_SUM, &in, &out, &st)) {
		fprintf(stderr, "collective failed: %s\n", emp_wc_status_str(st));
		return 1;
	}
	char *msg = (char *)&buf[8];
	if (rank == 0)
		snprintf(msg, 64, "hello from rank 0 of %d", size);
	struct emp_sge m = { key, 64, off + 64 };
	if (emp_bcast(dev, g, 0, &m, 1, &st)) {
		fprintf(stderr, "bcast failed: %s\n", emp_wc_status_str(st));
		return 1;
	}
	char *reply = (char *)&buf[32];
	if (rank == size - 1)
		snprintf(reply, 64, "reply from rank %d", size - 1);
	struct emp_sge rm = { key, 64, off + 256 };
	struct emp_rbcast_algo naks = { .coroots = 0, .ack_every = 0, .window = 0, .naks = 1 };
	if (emp_rbcast_with(dev, g, size - 1, &naks, &rm, 1, &st)) {
		fprintf(stderr, "reliable bcast failed: %s\n", emp_wc_status_str(st));
		return 1;
	}
	printf("rank %d: sum %lld, \"%s\", \"%s\"\n", rank, (long long)buf[1], msg, reply);
	int ok = buf[1] == (int64_t)size * (size + 1) / 2;
	emp_group_destroy(dev, g);
	emp_close_device(dev); /* unmaps buf */
	return ok ? 0 : 1;
}
