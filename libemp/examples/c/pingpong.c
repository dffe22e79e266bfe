/* Two ranks exchange a tagged message through libemp's C ABI.
 * Run with: emp run -n 2 -- ./pingpong   (ranks find each other by node:
 * rank r uses NIC r, port 0, as `emp run` places them on a fresh cluster). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "emp.h"

static int check(struct emp_wc *wc, const char *what)
{
	if (wc->status != EMP_WC_SUCCESS) {
		fprintf(stderr, "%s: %s\n", what, emp_wc_status_str(wc->status));
		return 1;
	}
	return 0;
}

int main(void)
{
	const char *r = getenv("EMP_RANK");
	int rank = r ? atoi(r) : 0, err = 0;
	struct emp_device *dev = emp_open_device(NULL, &err);
	if (!dev) {
		fprintf(stderr, "emp_open_device: %s\n", strerror(-err));
		return 1;
	}
	struct emp_port_info info;
	emp_query_port(dev, &info);
	uint32_t key;
	uint64_t off;
	char *buf = emp_alloc(dev, 4096, &key, &off);
	struct emp_sge sge = { key, 64, off };
	struct emp_wc wc;
	uint16_t peer = rank == 0 ? 1 : 0;
	if (emp_post_recv(dev, 1, peer, 0, 42, 0, &sge, 1)) return 1;
	if (rank == 0) {
		snprintf(buf + 2048, 64, "ping from node %u", info.node);
		struct emp_sge s = { key, 64, off + 2048 };
		while (emp_post_send(dev, 2, peer, 0, 42, &s, 1) == -11) ;
	}
	int got_recv = 0, got_send = rank == 0 ? 0 : 1, tries = 0;
	while (!got_recv || !got_send) {
		int n = emp_wait_cq(dev, &wc, 1, 10000);
		if (n <= 0) { fprintf(stderr, "wait: %d\n", n); return 1; }
		if (!wc.is_recv && wc.status == EMP_WC_REMOTE_PORT_CLOSED && rank == 0 && tries++ < 500) {
			/* The peer has not opened its port yet: try again shortly. */
			usleep(10000);
			struct emp_sge s = { key, 64, off + 2048 };
			while (emp_post_send(dev, 2, peer, 0, 42, &s, 1) == -11) ;
			continue;
		}
		if (check(&wc, wc.is_recv ? "recv" : "send")) return 1;
		if (wc.is_recv) {
			got_recv = 1;
			printf("rank %d got \"%s\" (%u bytes, tag %llu)\n", rank, buf, wc.byte_len, (unsigned long long)wc.tag);
			if (rank == 1) {
				snprintf(buf + 2048, 64, "pong from node %u", info.node);
				struct emp_sge s = { key, 64, off + 2048 };
				while (emp_post_send(dev, 2, peer, 0, 42, &s, 1) == -11) ;
				got_send = 0;
			}
		} else {
			got_send = 1;
		}
	}
	emp_close_device(dev);
	return 0;
}
