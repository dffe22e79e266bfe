/* Remote write and read through libemp's C ABI: rank 1 exposes a window
 * and hands its remote key (key and secret) to rank 0; rank 0 writes into
 * it with immediate data (rank 1's posted receive completes), reads it
 * back, and checks that a wrong secret is refused. Run with:
 * emp run -n 2 -- ./rma_pair   (rank r is NIC r, port 0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "emp.h"

#define TAG_KEY 0x4bu
#define TAG_DONE 0xd0u
#define IMM 0x77u

static int wait_wr(struct emp_device *dev, uint64_t wr_id, struct emp_wc *wc)
{
	for (;;) {
		int n = emp_wait_cq(dev, wc, 1, 30000);
		if (n != 1) {
			fprintf(stderr, "wait for %llu: %d\n", (unsigned long long)wr_id, n);
			return 1;
		}
		if (wc->wr_id == wr_id)
			return 0;
		fprintf(stderr, "unexpected completion %llu\n", (unsigned long long)wc->wr_id);
		return 1;
	}
}

/* Sends 8 bytes at off to (node, 0), retrying while its port is not open yet. */
static int send_word(struct emp_device *dev, uint32_t key, uint64_t off, uint16_t node, uint64_t tag)
{
	struct emp_sge s = { key, 8, off };
	struct emp_wc wc;
	for (int tries = 0; tries < 500; tries++) {
		while (emp_post_send(dev, 9, node, 0, tag, &s, 1) == -11)
			;
		if (wait_wr(dev, 9, &wc))
			return 1;
		if (wc.status == EMP_WC_SUCCESS)
			return 0;
		if (wc.status != EMP_WC_REMOTE_PORT_CLOSED)
			break;
		usleep(10000);
	}
	fprintf(stderr, "send to node %u failed\n", node);
	return 1;
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
	uint32_t key;
	uint64_t off;
	char *buf = emp_alloc(dev, 8192, &key, &off);
	struct emp_wc wc;
	static const char msg[] = "hello from rank 0";
	if (rank == 1) {
		uint32_t wkey;
		uint64_t woff;
		char *window = emp_alloc_mr(dev, 4096, EMP_ACCESS_REMOTE_WRITE | EMP_ACCESS_REMOTE_READ, &wkey, &woff);
		uint64_t rkey;
		if (!window || emp_remote_key(dev, wkey, &rkey)) {
			fprintf(stderr, "window registration failed\n");
			return 1;
		}
		struct emp_sge done = { key, 8, off + 8 };
		emp_post_recv(dev, 1, 0, 0, IMM, 0, NULL, 0);
		emp_post_recv(dev, 2, 0, 0, TAG_DONE, 0, &done, 1);
		memcpy(buf, &rkey, 8);
		if (send_word(dev, key, off, 0, TAG_KEY) || wait_wr(dev, 1, &wc))
			return 1;
		if (wc.status != EMP_WC_SUCCESS || wc.opcode != EMP_WC_RECV_RDMA_IMM || wc.tag != IMM ||
		    wc.msg_len != sizeof msg || memcmp(window + 100, msg, sizeof msg)) {
			fprintf(stderr, "the immediate receive or the window is wrong: %s\n", emp_wc_status_str(wc.status));
			return 1;
		}
		printf("window: %s\n", window + 100);
		return wait_wr(dev, 2, &wc) || wc.status != EMP_WC_SUCCESS;
	}
	struct emp_sge k = { key, 8, off };
	emp_post_recv(dev, 1, 1, 0, TAG_KEY, 0, &k, 1);
	if (wait_wr(dev, 1, &wc) || wc.status != EMP_WC_SUCCESS)
		return 1;
	uint64_t rkey;
	memcpy(&rkey, buf, 8);
	memcpy(buf + 64, msg, sizeof msg);
	struct emp_sge src = { key, sizeof msg, off + 64 }, dst = { key, sizeof msg, off + 256 };
	if (emp_post_write_imm(dev, 2, 1, 0, &src, 1, rkey, 100, IMM) || wait_wr(dev, 2, &wc) ||
	    wc.status != EMP_WC_SUCCESS || wc.opcode != EMP_WC_RDMA_WRITE) {
		fprintf(stderr, "write: %s\n", emp_wc_status_str(wc.status));
		return 1;
	}
	if (emp_post_read(dev, 3, 1, 0, &dst, 1, rkey, 100) || wait_wr(dev, 3, &wc) || wc.status != EMP_WC_SUCCESS ||
	    wc.opcode != EMP_WC_RDMA_READ || memcmp(buf + 256, msg, sizeof msg)) {
		fprintf(stderr, "read: %s\n", emp_wc_status_str(wc.status));
		return 1;
	}
	/* The key without its secret is refused; the window is unchanged. */
	uint64_t guessed = rkey ^ (1ull << 32);
	if (emp_post_write(dev, 4, 1, 0, &src, 1, guessed, 0) || wait_wr(dev, 4, &wc) ||
	    wc.status != EMP_WC_REMOTE_ACCESS_ERROR) {
		fprintf(stderr, "a wrong secret was not refused: %s\n", emp_wc_status_str(wc.status));
		return 1;
	}
	if (send_word(dev, key, off, 1, TAG_DONE))
		return 1;
	printf("rma ok: wrote, read back, wrong secret refused\n");
	return 0;
}
