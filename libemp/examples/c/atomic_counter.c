/* Remote atomics through libemp's C ABI: rank 0 exposes a counter word,
 * every other rank adds to it with NIC fetch-and-adds (blocking, then
 * nonblocking), and rank 0 checks the total without having done anything
 * but wait. Run with: emp run -n 3 -- ./atomic_counter   (on a fresh
 * cluster of as many NICs as ranks: rank r is NIC r, port 0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "emp.h"

#define ADDS 50
#define TAG_KEY 0x4bu
#define TAG_DONE 0xd0u

static int wait_one(struct emp_device *dev, struct emp_wc *wc, const char *what)
{
	int n = emp_wait_cq(dev, wc, 1, 30000);
	if (n <= 0) {
		fprintf(stderr, "%s: wait: %d\n", what, n);
		return 1;
	}
	if (wc->status != EMP_WC_SUCCESS) {
		fprintf(stderr, "%s: %s\n", what, emp_wc_status_str(wc->status));
		return 1;
	}
	return 0;
}

/* "Done" messages rank 0 received so far (they may complete while it
 * still sends keys). */
static int dones;

/* Waits for the completion of send wr_id, counting "done" receives seen
 * meanwhile; returns its status, or -1. */
static int wait_send(struct emp_device *dev, uint64_t wr_id)
{
	struct emp_wc wc;
	for (;;) {
		if (emp_wait_cq(dev, &wc, 1, 30000) != 1)
			return -1;
		if (wc.wr_id == wr_id)
			return (int)wc.status;
		if (wc.is_recv && wc.tag == TAG_DONE && wc.status == EMP_WC_SUCCESS)
			dones++;
		else
			return -1;
	}
}

/* Sends 8 bytes at off to (node, 0), retrying while the peer's port is
 * not open yet. */
static int send_word(struct emp_device *dev, uint32_t key, uint64_t off, uint16_t node, uint64_t tag)
{
	struct emp_sge s = { key, 8, off };
	int st = -1;
	for (int tries = 0; tries < 500; tries++) {
		while (emp_post_send(dev, 100 + node, node, 0, tag, &s, 1) == -11)
			;
		st = wait_send(dev, 100 + node);
		if (st == EMP_WC_SUCCESS)
			return 0;
		if (st != EMP_WC_REMOTE_PORT_CLOSED)
			break;
		usleep(10000);
	}
	fprintf(stderr, "send to node %u failed: %d\n", node, st);
	return 1;
}

int main(void)
{
	const char *r = getenv("EMP_RANK"), *n = getenv("EMP_SIZE");
	int rank = r ? atoi(r) : 0, size = n ? atoi(n) : 2, err = 0;
	struct emp_device *dev = emp_open_device(NULL, &err);
	if (!dev) {
		fprintf(stderr, "emp_open_device: %s\n", strerror(-err));
		return 1;
	}
	uint32_t key;
	uint64_t off;
	uint64_t *buf = emp_alloc(dev, 4096, &key, &off);
	struct emp_wc wc;
	if (rank == 0) {
		uint32_t akey;
		uint64_t aoff;
		volatile uint64_t *word = emp_alloc_mr(dev, 4096, EMP_ACCESS_REMOTE_ATOMIC, &akey, &aoff);
		if (!word) {
			fprintf(stderr, "emp_alloc_mr failed\n");
			return 1;
		}
		for (int i = 1; i < size; i++) {
			struct emp_sge s = { key, 8, off + 8 * i };
			emp_post_recv(dev, 200 + i, i, 0, TAG_DONE, 0, &s, 1);
		}
		/* Peers need the region's remote key: key and secret in one word. */
		uint64_t rkey;
		if (emp_remote_key(dev, akey, &rkey)) {
			fprintf(stderr, "emp_remote_key failed\n");
			return 1;
		}
		buf[0] = rkey;
		for (int i = 1; i < size; i++)
			if (send_word(dev, key, off, i, TAG_KEY))
				return 1;
		while (dones < size - 1) {
			if (wait_one(dev, &wc, "done"))
				return 1;
			dones++;
		}
		printf("counter = %llu (expected %d)\n", (unsigned long long)*word, (size - 1) * (ADDS + 1));
		return *word == (uint64_t)(size - 1) * (ADDS + 1) ? 0 : 1;
	}
	struct emp_sge k = { key, 8, off };
	emp_post_recv(dev, 1, 0, 0, TAG_KEY, 0, &k, 1);
	if (wait_one(dev, &wc, "key"))
		return 1;
	struct emp_remote_word at = { (uint32_t)buf[0], 8, 0, (uint32_t)(buf[0] >> 32), 0 };
	uint64_t old = 0, prev = 0;
	for (int i = 0; i < ADDS; i++) {
		int rc = emp_fetch_add(dev, 0, 0, &at, 1, &old);
		if (rc != 0) {
			fprintf(stderr, "emp_fetch_add: %d (%s)\n", rc, rc > 0 ? emp_wc_status_str(rc) : strerror(-rc));
			return 1;
		}
		if (i > 0 && old <= prev) {
			fprintf(stderr, "old %llu after %llu\n", (unsigned long long)old, (unsigned long long)prev);
			return 1;
		}
		prev = old;
	}
	/* Nonblocking: the old value arrives in the completion's tag and in
	 * the result word. */
	struct emp_sge res = { key, 8, off + 64 };
	if (emp_post_atomic_fetch_add(dev, 7, 0, 0, &at, 1, &res))
		return 1;
	if (wait_one(dev, &wc, "fetch-add"))
		return 1;
	if (wc.opcode != EMP_WC_ATOMIC_FETCH_ADD || wc.tag != buf[8] || wc.tag <= prev) {
		fprintf(stderr, "completion opcode %u old %llu, result word %llu\n", wc.opcode,
			(unsigned long long)wc.tag, (unsigned long long)buf[8]);
		return 1;
	}
	printf("rank %d: %d fetch-adds, last old value %llu\n", rank, ADDS + 1, (unsigned long long)wc.tag);
	return send_word(dev, key, off + 64, 0, TAG_DONE);
}
