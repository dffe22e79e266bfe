/* Every rank learns the job from its launcher and its peers' endpoints,
 * then passes a token around the ring of ranks: rank r sends to rank r+1
 * and receives from rank r-1, wherever they are. No rank assumes rank r is
 * NIC r, port 0: under `emp run -n 8` on 4 NICs two ranks share a NIC on
 * different ports; under mpirun ranks find their NIC through EMP_CLUSTER.
 * Run with: emp run -n 4 -- ./job_ring
 *       or: EMP_CLUSTER=cluster.toml mpirun -n 4 ./job_ring */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "emp.h"

#define TAG 7
#define RING_MAX 1024

/* Waits until the receive (if *want_recv) and the send (if *want_send)
 * completed, in whichever order they do; the receive's completion goes to
 * *got. */
static int wait_for(struct emp_device *dev, int *want_recv, int *want_send, struct emp_wc *got)
{
	while (*want_recv || *want_send) {
		struct emp_wc wc;
		int n = emp_wait_cq(dev, &wc, 1, 30000);
		if (n <= 0) {
			fprintf(stderr, "wait: %s\n", n ? strerror(-n) : "timed out");
			return 1;
		}
		if (wc.status != EMP_WC_SUCCESS) {
			fprintf(stderr, "%s: %s\n", wc.is_recv ? "recv" : "send", emp_wc_status_str(wc.status));
			return 1;
		}
		if (wc.is_recv) {
			*got = wc;
			*want_recv = 0;
		} else {
			*want_send = 0;
		}
	}
	return 0;
}

int main(void)
{
	int err = emp_job_init();
	if (err) {
		fprintf(stderr, "emp_job_init: %s\n", strerror(-err));
		return 1;
	}
	int rank = emp_job_rank(), size = emp_job_size();
	if (size < 2 || size > RING_MAX) {
		fprintf(stderr, "job_ring: needs 2 to %d ranks, has %d\n", RING_MAX, size);
		return 2;
	}
	struct emp_device *dev = emp_job_open_device(&err);
	if (!dev) {
		fprintf(stderr, "emp_job_open_device: %s\n", strerror(-err));
		return 1;
	}
	static struct emp_endpoint eps[RING_MAX];
	if ((err = emp_job_endpoints(dev, eps, RING_MAX))) {
		fprintf(stderr, "emp_job_endpoints: %s\n", strerror(-err));
		return 1;
	}
	struct emp_endpoint next = eps[(rank + 1) % size], prev = eps[(rank + size - 1) % size];
	uint32_t key;
	uint64_t off;
	char *buf = emp_alloc(dev, 4096, &key, &off);
	if (!buf) {
		fprintf(stderr, "emp_alloc failed\n");
		return 1;
	}
	struct emp_sge in = { key, 1024, off }, out = { key, 1024, off + 2048 };
	if ((err = emp_post_recv(dev, 1, prev.node, prev.port, TAG, 0, &in, 1))) {
		fprintf(stderr, "emp_post_recv: %s\n", strerror(-err));
		return 1;
	}
	/* Every receive is posted before any token moves. */
	if ((err = emp_job_barrier(dev))) {
		fprintf(stderr, "emp_job_barrier: %s\n", strerror(-err));
		return 1;
	}
	struct emp_wc got;
	int want_recv = 1, want_send = 0;
	if (rank != 0 && wait_for(dev, &want_recv, &want_send, &got))
		return 1;
	/* The token lists every rank it went through. */
	if (rank == 0)
		snprintf(buf + 2048, 1024, "0");
	else {
		size_t len = strnlen(buf, 1000);
		memcpy(buf + 2048, buf, len);
		snprintf(buf + 2048 + len, 1024 - len, ",%d", rank);
	}
	while ((err = emp_post_send(dev, 2, next.node, next.port, TAG, &out, 1)) == -11)
		usleep(100);
	if (err) {
		fprintf(stderr, "emp_post_send: %s\n", strerror(-err));
		return 1;
	}
	want_send = 1;
	if (wait_for(dev, &want_recv, &want_send, &got))
		return 1;
	printf("rank %d of %d on node %u port %u: got \"%s\" from node %u port %u\n", rank, size, eps[rank].node,
	       eps[rank].port, buf, got.src_node, got.src_port);
	int ok = got.src_node == prev.node && got.src_port == prev.port;
	if ((err = emp_job_barrier(dev))) {
		fprintf(stderr, "emp_job_barrier: %s\n", strerror(-err));
		return 1;
	}
	emp_close_device(dev);
	return ok ? 0 : 1;
}
