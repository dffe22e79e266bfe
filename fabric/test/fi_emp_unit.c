/* Unit tests of the emp libfabric provider, fabtests style, as TAP: each
 * call's bad parameters, AV/CQ/MR/counter lifecycles, cancellation,
 * truncation reported as an error entry, waiting on the port's eventfd.
 * Two endpoints in one process, each on its own domain (its own EMP port)
 * of the NIC EMP_DEVICE names. Needs FI_PROVIDER_PATH to find the provider.
 * Ends with "# N passed, M failed"; exit status 1 when anything failed. */
#define _GNU_SOURCE
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <sys/mman.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include "fi_emp_unit.h"

static int passed, failed, numbered;

void check(int ok, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("%s %d - ", ok ? "ok" : "not ok", ++numbered);
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	if (ok)
		passed++;
	else
		failed++;
	fflush(stdout);
}

static struct fi_info *hints_base(uint64_t caps)
{
	struct fi_info *h = fi_allocinfo();
	h->caps = caps;
	h->ep_attr->type = FI_EP_RDM;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	h->fabric_attr->prov_name = strdup("emp");
	return h;
}

static int getinfo_ret(struct fi_info *h)
{
	struct fi_info *out = NULL;
	int r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &out);
	fi_freeinfo(out);
	fi_freeinfo(h);
	return r;
}

static void test_getinfo(void)
{
	struct fi_info *h, *out = NULL;

	h = hints_base(FI_TAGGED);
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &out), 0);
	check(out && out->ep_attr->mem_tag_format == ~0ULL, "tagged only: every tag bit is the caller's");
	check(out && out->ep_attr->max_msg_size > 0 && out->tx_attr->size > 0 && out->rx_attr->size > 0,
	      "sizes from the port's rings");
	check(out && (out->caps & FI_TAGGED) && !(out->caps & FI_MSG), "caps as asked (FI_TAGGED)");
	fi_freeinfo(out);
	fi_freeinfo(h);
	out = NULL;

	h = hints_base(FI_MSG | FI_TAGGED);
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &out), 0);
	check(out && out->ep_attr->mem_tag_format == (~0ULL >> 1), "msg + tagged: top tag bit reserved");
	fi_freeinfo(out);
	fi_freeinfo(h);

	h = hints_base(FI_TAGGED);
	h->ep_attr->type = FI_EP_MSG;
	EXPECT(getinfo_ret(h), -FI_ENODATA);
	h = hints_base(FI_TAGGED);
	h->tx_attr->inject_size = 1 << 20;
	EXPECT(getinfo_ret(h), -FI_ENODATA);
	h = hints_base(FI_TAGGED);
	h->tx_attr->size = 1 << 30;
	EXPECT(getinfo_ret(h), -FI_ENODATA);
	h = hints_base(FI_TAGGED | FI_REMOTE_CQ_DATA);
	EXPECT(getinfo_ret(h), -FI_ENODATA);
	h = hints_base(FI_TAGGED);
	h->domain_attr->cq_data_size = 8; /* EMP's immediate data is 4 bytes */
	EXPECT(getinfo_ret(h), -FI_ENODATA);
	/* What Open MPI's mtl ofi asks before it puts the source rank in the
	 * remote CQ data (its "ofi_tag_full" layout). */
	h = hints_base(FI_TAGGED | FI_DIRECTED_RECV);
	h->domain_attr->cq_data_size = 4;
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &out), 0);
	check(out && out->domain_attr->cq_data_size == 4, "cq_data_size 4 with FI_TAGGED");
	fi_freeinfo(out);
	fi_freeinfo(h);
	out = NULL;
	h = hints_base(FI_TAGGED);
	h->tx_attr->msg_order = FI_ORDER_RAW;
	EXPECT(getinfo_ret(h), -FI_ENODATA);
	h = hints_base(FI_TAGGED);
	h->addr_format = FI_SOCKADDR_IN;
	EXPECT(getinfo_ret(h), -FI_ENODATA);
	h = hints_base(FI_TAGGED);
	h->ep_attr->max_msg_size = SIZE_MAX;
	EXPECT(getinfo_ret(h), -FI_ENODATA);
}

struct side {
	struct fid_domain *dom;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_cntr *rx_cntr;
	fi_addr_t peer;
};

static struct fid_fabric *fabric;
static struct fi_info *info;

static void open_side(struct side *s, enum fi_av_type av_type, uint64_t cq_flags)
{
	struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_FD};
	struct fi_av_attr av_attr = {.type = av_type};
	struct fi_cntr_attr cntr_attr = {.events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC};
	EXPECT(fi_domain(fabric, info, &s->dom, NULL), 0);
	EXPECT(fi_cq_open(s->dom, &cq_attr, &s->cq, NULL), 0);
	EXPECT(fi_av_open(s->dom, &av_attr, &s->av, NULL), 0);
	EXPECT(fi_cntr_open(s->dom, &cntr_attr, &s->rx_cntr, NULL), 0);
	EXPECT(fi_endpoint(s->dom, info, &s->ep, NULL), 0);
	EXPECT(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV | cq_flags), 0);
	EXPECT(fi_ep_bind(s->ep, &s->av->fid, 0), 0);
	EXPECT(fi_ep_bind(s->ep, &s->rx_cntr->fid, FI_RECV), 0);
	EXPECT(fi_enable(s->ep), 0);
}

static void close_side(struct side *s)
{
	EXPECT(fi_close(&s->cq->fid), -FI_EBUSY); /* still bound */
	EXPECT(fi_close(&s->dom->fid), -FI_EBUSY);
	EXPECT(fi_close(&s->ep->fid), 0);
	EXPECT(fi_close(&s->cq->fid), 0);
	EXPECT(fi_close(&s->av->fid), 0);
	EXPECT(fi_close(&s->rx_cntr->fid), 0);
	EXPECT(fi_close(&s->dom->fid), 0);
}

/* Exchanges names: each side's AV gets the other's address. */
static void connect_sides(struct side *a, struct side *b)
{
	char na[64], nb[64];
	size_t la = sizeof na, lb = sizeof nb;
	EXPECT(fi_getname(&a->ep->fid, na, &la), 0);
	EXPECT(fi_getname(&b->ep->fid, nb, &lb), 0);
	EXPECT(fi_av_insert(a->av, nb, 1, &a->peer, 0, NULL), 1);
	EXPECT(fi_av_insert(b->av, na, 1, &b->peer, 0, NULL), 1);
}

/* Polls until an entry (or an error entry) comes, at most ~10 s. */
static ssize_t wait_cq(struct fid_cq *cq, struct fi_cq_tagged_entry *e, fi_addr_t *src)
{
	for (int i = 0; i < 10000; i++) {
		ssize_t r = fi_cq_readfrom(cq, e, 1, src);
		if (r != -FI_EAGAIN)
			return r;
		r = fi_cq_sread(cq, e, 0, NULL, 1); /* blocks on the eventfd, 1 ms */
		(void)r;
	}
	return -FI_ETIMEDOUT;
}

/* Fills n bytes at p with a pattern of seed. */
static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31 + seed * 7 + 1);
}

/* One tagged message of len bytes from s (a) into r (b), both without
 * descriptors; true when it arrived intact. */
static int transfer(struct side *a, struct side *b, void *s, void *r, size_t len, uint64_t tag)
{
	struct fi_cq_tagged_entry e;
	memset(r, 0, len);
	EXPECT(fi_trecv(b->ep, r, len, NULL, FI_ADDR_UNSPEC, tag, 0, (void *)0xd1), 0);
	EXPECT(fi_tsend(a->ep, s, len, NULL, a->peer, tag, (void *)0xd2), 0);
	int ok = wait_cq(b->cq, &e, NULL) == 1 && e.len == len;
	ok &= wait_cq(a->cq, &e, NULL) == 1;
	return ok && !memcmp(s, r, len);
}

/* The registration cache (FI_EMP_MR_CACHE): registrations of unregistered
 * large buffers kept and reused must never deliver stale data, whether the
 * buffer's bytes changed, its memory was unmapped and mapped anew at the
 * same address, or more buffers are in flight than the cache has entries;
 * a malformed setting refuses the domain. */
static void test_mr_cache(void)
{
	struct fid_domain *d = NULL;
	setenv("FI_EMP_MR_CACHE", "abc", 1);
	EXPECT(fi_domain(fabric, info, &d, NULL), -FI_EINVAL);
	setenv("FI_EMP_MR_CACHE", "129", 1);
	EXPECT(fi_domain(fabric, info, &d, NULL), -FI_EINVAL);
	setenv("FI_EMP_MR_CACHE", "4", 1);
	struct side a, b;
	open_side(&a, FI_AV_MAP, 0);
	open_side(&b, FI_AV_MAP, 0);
	connect_sides(&a, &b);
	const size_t len = 1u << 20;
	unsigned char *s = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	unsigned char *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	check(s != MAP_FAILED && r != MAP_FAILED, "mr cache: buffers mapped");
	int same = 1;
	for (unsigned i = 0; i < 3; i++) {
		fill(s, len, i);
		same &= transfer(&a, &b, s, r, len, 0x700 + i);
	}
	check(same, "mr cache: one buffer sent three times with new bytes each time, each intact");
	/* Unmapped and mapped again at the same addresses, with new bytes. */
	munmap(s, len);
	munmap(r, len);
	unsigned char *s2 =
		mmap(s, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	unsigned char *r2 =
		mmap(r, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	check(s2 == s && r2 == r, "mr cache: memory mapped again at the same addresses");
	if (s2 == s && r2 == r) {
		fill(s, len, 9);
		check(transfer(&a, &b, s, r, len, 0x710), "mr cache: after unmap and map the new bytes arrive");
		/* Only part of the old range mapped now: a message inside it. */
		munmap(s + len / 2, len / 2);
		fill(s, len / 2, 10);
		check(transfer(&a, &b, s + 4096, r + 8192, len / 2 - 4096, 0x711),
		      "mr cache: a message in what remains mapped of a cached range");
		munmap(s, len / 2);
		munmap(r, len);
	} else {
		if (s2 != MAP_FAILED)
			munmap(s2, len);
		if (r2 != MAP_FAILED)
			munmap(r2, len);
	}
	/* Eight buffers in flight each way, twice the cache's entries: the
	 * rest registered for the operation. */
	enum { N = 8 };
	const size_t blen = 200u << 10;
	unsigned char *sb[N], *rb[N];
	struct fi_cq_tagged_entry e;
	int ok = 1;
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < N; i++) {
			if (!round) {
				sb[i] = malloc(blen);
				rb[i] = malloc(blen);
			}
			fill(sb[i], blen, (unsigned)(i + 20 * round));
			memset(rb[i], 0, blen);
			EXPECT(fi_trecv(b.ep, rb[i], blen, NULL, FI_ADDR_UNSPEC, 0x800 + (uint64_t)i, 0, NULL), 0);
		}
		for (int i = 0; i < N; i++)
			EXPECT(fi_tsend(a.ep, sb[i], blen, NULL, a.peer, 0x800 + (uint64_t)i, NULL), 0);
		for (int i = 0; i < N; i++) {
			ok &= wait_cq(b.cq, &e, NULL) == 1 && e.len == blen;
			ok &= wait_cq(a.cq, &e, NULL) == 1;
		}
		for (int i = 0; i < N; i++)
			ok &= !memcmp(sb[i], rb[i], blen);
	}
	check(ok, "mr cache: %d buffers in flight each way on a 4-entry cache, twice, all intact", N);
	/* Closing with entries cached (and the port closing) leaves nothing. */
	close_side(&a);
	close_side(&b);
	for (int i = 0; i < N; i++) {
		free(sb[i]);
		free(rb[i]);
	}
	unsetenv("FI_EMP_MR_CACHE");
}

/* Waits until b's NIC holds a message of `tag` (FI_PEEK finds it). */
static int arrived(struct side *b, uint64_t tag)
{
	for (int i = 0; i < 2000; i++) {
		struct fi_msg_tagged m = {.addr = FI_ADDR_UNSPEC, .tag = tag, .context = (void *)0xbe};
		struct fi_cq_tagged_entry e;
		struct fi_cq_err_entry ee;
		if (fi_trecvmsg(b->ep, &m, FI_PEEK))
			return 0;
		int got = entry_or_error(b->cq, &e, NULL, &ee);
		if (got == 1)
			return e.tag == tag;
		if (got < 0 || ee.err != FI_ENOMSG)
			return 0;
		usleep(1000);
	}
	return 0;
}

/* Bounce runs (FI_EMP_BOUNCE_MB): an unregistered message larger than a
 * bounce slot, up to 4 MiB, is copied into a run of consecutive slots when
 * it is posted, and the NIC reads it from there. Seen from outside: bytes
 * the sender changes after fi_tsend returned (which libfabric forbids;
 * done here on purpose) do not reach the receiver. When no run is free the
 * message is registered instead, and the NIC pulls it from the caller's
 * memory when the receive comes (the messages wait unexpected at the
 * receiver: rendezvous), changed bytes and all. A malformed setting
 * refuses the domain. */
static void test_bounce_runs(void)
{
	struct fid_domain *d = NULL;
	setenv("FI_EMP_BOUNCE_MB", "x", 1);
	EXPECT(fi_domain(fabric, info, &d, NULL), -FI_EINVAL);
	setenv("FI_EMP_BOUNCE_MB", "1025", 1);
	EXPECT(fi_domain(fabric, info, &d, NULL), -FI_EINVAL);
	setenv("FI_EMP_BOUNCE_MB", "-1", 1);
	EXPECT(fi_domain(fabric, info, &d, NULL), -FI_EINVAL);
	/* 2 MiB, 32 slots: two runs of 11 slots (700 KiB), not three. */
	setenv("FI_EMP_BOUNCE_MB", "2", 1);
	struct side a, b;
	open_side(&a, FI_AV_MAP, 0);
	open_side(&b, FI_AV_MAP, 0);
	connect_sides(&a, &b);
	enum { N = 4, RUNS = 2 };
	const size_t len = 700u << 10;
	unsigned char *sb[N], *rb[N], *want = malloc(len);
	struct fi_cq_tagged_entry e;
	int posted = 1, ok = 1;
	for (int i = 0; i < N; i++) {
		sb[i] = malloc(len);
		rb[i] = calloc(1, len);
		fill(sb[i], len, (unsigned)(50 + i));
		posted &= fi_tsend(a.ep, sb[i], len, NULL, a.peer, 0x900 + (uint64_t)i, NULL) == 0;
	}
	for (int i = 0; i < N; i++)
		memset(sb[i], 0xEE, len);
	for (int i = 0; i < N; i++)
		posted &= arrived(&b, 0x900 + (uint64_t)i);
	check(posted, "bounce runs: %d sends of %zu B posted, all waiting at the receiver", N, len);
	for (int i = 0; i < N; i++)
		EXPECT(fi_trecv(b.ep, rb[i], len, NULL, FI_ADDR_UNSPEC, 0x900 + (uint64_t)i, 0, NULL), 0);
	for (int i = 0; i < N; i++) {
		ok &= wait_cq(b.cq, &e, NULL) == 1 && e.len == len;
		ok &= wait_cq(a.cq, &e, NULL) == 1;
	}
	check(ok, "bounce runs: every message completed at both ends");
	int runs_ok = 1, regs_ok = 1;
	for (int i = 0; i < N; i++) {
		fill(want, len, (unsigned)(50 + i));
		if (i >= RUNS)
			memset(want, 0xEE, len);
		(i < RUNS ? &runs_ok : &regs_ok)[0] &= !memcmp(rb[i], want, len);
	}
	check(runs_ok, "bounce runs: the first %d messages carry the bytes of when they were posted", RUNS);
	check(regs_ok, "bounce runs: the others, with no run free, were read from the sender's memory later");
	/* Runs given back: the same again, with new bytes and every message
	 * through a run since they go one at a time, odd sizes included. */
	const size_t sizes[] = {(64u << 10) + 1, 3u << 19, 700u << 10, (2u << 20) - 3};
	int again = 1;
	for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		unsigned char *s = malloc(sizes[k]), *r = malloc(sizes[k]);
		fill(s, sizes[k], (unsigned)k);
		again &= transfer(&a, &b, s, r, sizes[k], 0x910 + k);
		free(s);
		free(r);
	}
	check(again, "bounce runs: messages of 64 KiB + 1 B to 2 MiB - 3 B after the runs came back, intact");
	close_side(&a);
	close_side(&b);
	for (int i = 0; i < N; i++) {
		free(sb[i]);
		free(rb[i]);
	}
	free(want);
	unsetenv("FI_EMP_BOUNCE_MB");
}

static void test_calls(void)
{
	struct fid_domain *dom;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_mr *mr;
	struct fid_ep *ep;
	char buf[256];

	EXPECT(fi_domain(fabric, info, &dom, NULL), 0);

	/* CQ parameters */
	struct fi_cq_attr ca = {.format = (enum fi_cq_format)99};
	EXPECT(fi_cq_open(dom, &ca, &cq, NULL), -FI_EINVAL);
	ca = (struct fi_cq_attr){.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_MUTEX_COND};
	EXPECT(fi_cq_open(dom, &ca, &cq, NULL), -FI_ENOSYS);
	ca = (struct fi_cq_attr){.format = FI_CQ_FORMAT_CONTEXT, .wait_cond = FI_CQ_COND_THRESHOLD};
	EXPECT(fi_cq_open(dom, &ca, &cq, NULL), -FI_ENOSYS);
	ca = (struct fi_cq_attr){.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE, .size = 8};
	EXPECT(fi_cq_open(dom, &ca, &cq, NULL), 0);
	struct fi_cq_entry ce;
	struct fi_cq_err_entry ee = {0};
	EXPECT(fi_cq_read(cq, &ce, 1), -FI_EAGAIN);
	EXPECT(fi_cq_readerr(cq, &ee, 0), -FI_EAGAIN);
	EXPECT(fi_cq_readerr(cq, &ee, 1), -FI_EBADFLAGS);
	EXPECT(fi_cq_sread(cq, &ce, 1, NULL, 0), -FI_ENOSYS); /* no wait object */
	EXPECT(fi_close(&cq->fid), 0);
	ca = (struct fi_cq_attr){.format = FI_CQ_FORMAT_MSG, .wait_obj = FI_WAIT_FD};
	EXPECT(fi_cq_open(dom, &ca, &cq, NULL), 0);
	int fd = -1;
	EXPECT(fi_control(&cq->fid, FI_GETWAIT, &fd), 0);
	check(fd >= 0, "FI_GETWAIT gives the port's eventfd (%d)", fd);
	EXPECT(fi_cq_sread(cq, &ce, 1, NULL, 20), -FI_EAGAIN); /* times out, nothing there */
	EXPECT(fi_cq_signal(cq), 0);
	EXPECT(fi_cq_sread(cq, &ce, 1, NULL, 5000), -FI_EAGAIN); /* woken by the signal */
	EXPECT(fi_close(&cq->fid), 0);

	/* AV parameters and lifecycle */
	struct fi_av_attr aa = {.type = FI_AV_TABLE, .rx_ctx_bits = 4};
	EXPECT(fi_av_open(dom, &aa, &av, NULL), -FI_ENOSYS);
	aa = (struct fi_av_attr){.type = FI_AV_TABLE, .flags = FI_EVENT};
	EXPECT(fi_av_open(dom, &aa, &av, NULL), -FI_ENOEQ);
	aa = (struct fi_av_attr){.type = (enum fi_av_type)42};
	EXPECT(fi_av_open(dom, &aa, &av, NULL), -FI_EINVAL);
	for (int t = 0; t < 2; t++) {
		aa = (struct fi_av_attr){.type = t ? FI_AV_TABLE : FI_AV_MAP};
		EXPECT(fi_av_open(dom, &aa, &av, NULL), 0);
		struct {
			uint16_t node, port;
			uint32_t magic;
		} names[3] = {{3, 7, 0x31504d45u}, {3, 8, 0x31504d45u}, {3, 9, 0xdeadbeefu}};
		fi_addr_t fa[3];
		EXPECT(fi_av_insert(av, names, 3, fa, 0, NULL), 2);
		check(fa[2] == FI_ADDR_NOTAVAIL, "%s: a malformed address is FI_ADDR_NOTAVAIL", t ? "table" : "map");
		EXPECT(fi_av_insert(av, names, 1, fa, FI_SYNC_ERR, NULL), -FI_EBADFLAGS);
		size_t len = sizeof buf;
		EXPECT(fi_av_lookup(av, fa[1], buf, &len), 0);
		check(len == 8 && !memcmp(buf, &names[1], 8), "lookup gives the inserted address back");
		len = 4;
		EXPECT(fi_av_lookup(av, fa[1], buf, &len), -FI_ETOOSMALL);
		len = sizeof buf;
		fi_av_straddr(av, &names[0], buf, &len);
		check(!strcmp(buf, "fi_emp://3:7"), "straddr: %s", buf);
		EXPECT(fi_av_remove(av, &fa[0], 1, 0), 0);
		len = sizeof buf;
		EXPECT(fi_av_lookup(av, fa[0], buf, &len), -FI_ENOENT);
		EXPECT(fi_av_lookup(av, fa[1], buf, &len), 0);
		EXPECT(fi_av_remove(av, &fa[0], 1, 1), -FI_EBADFLAGS);
		EXPECT(fi_close(&av->fid), 0);
	}

	/* MR parameters and lifecycle */
	static char region[8192];
	EXPECT(fi_mr_reg(dom, region, 0, FI_SEND, 0, 0, 0, &mr, NULL), -FI_EINVAL);
	EXPECT(fi_mr_reg(dom, region, sizeof region, 1ULL << 40, 0, 0, 0, &mr, NULL), -FI_EINVAL);
	EXPECT(fi_mr_reg(dom, region, sizeof region, FI_SEND, 0, 0, FI_RMA_EVENT, &mr, NULL), -FI_EBADFLAGS);
	EXPECT(fi_mr_reg(dom, region, sizeof region, FI_SEND | FI_RECV, 0, 0, 0, &mr, NULL), 0);
	check(fi_mr_desc(mr) != NULL, "an MR has a descriptor, key %llu", (unsigned long long)fi_mr_key(mr));
	EXPECT(fi_close(&mr->fid), 0);

	/* Endpoint state and bind errors */
	EXPECT(fi_endpoint(dom, info, &ep, NULL), 0);
	struct fid_ep *ep2;
	EXPECT(fi_endpoint(dom, info, &ep2, NULL), -FI_EBUSY); /* one endpoint per port */
	EXPECT(fi_tsend(ep, buf, 8, NULL, 0, 1, NULL), -FI_EOPBADSTATE);
	EXPECT(fi_enable(ep), -FI_ENOAV);
	aa = (struct fi_av_attr){.type = FI_AV_MAP};
	EXPECT(fi_av_open(dom, &aa, &av, NULL), 0);
	EXPECT(fi_ep_bind(ep, &av->fid, 0), 0);
	EXPECT(fi_ep_bind(ep, &av->fid, 0), -FI_EINVAL);
	EXPECT(fi_enable(ep), -FI_ENOCQ);
	ca = (struct fi_cq_attr){.format = FI_CQ_FORMAT_TAGGED};
	EXPECT(fi_cq_open(dom, &ca, &cq, NULL), 0);
	EXPECT(fi_ep_bind(ep, &cq->fid, FI_REMOTE_WRITE), -FI_EBADFLAGS);
	EXPECT(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_enable(ep), 0);
	EXPECT(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT), -FI_EOPBADSTATE);
	size_t nl = 2;
	EXPECT(fi_getname(&ep->fid, buf, &nl), -FI_ETOOSMALL);
	check(nl == 8, "getname says how long a name is (%zu)", nl);
	EXPECT(fi_tsend(ep, buf, 8, NULL, 12345, 1, NULL), -FI_EINVAL); /* not in the AV */
	EXPECT(fi_tsend(ep, buf, 8, NULL, FI_ADDR_UNSPEC, 1, NULL), -FI_EINVAL);
	EXPECT(fi_tsend(ep, NULL, 8, NULL, 0, 1, NULL), -FI_EINVAL);
	EXPECT(fi_tinject(ep, buf, 1 << 20, 0, 1), -FI_EMSGSIZE);
	EXPECT(fi_send(ep, buf, 8, NULL, 0, NULL), -FI_EOPNOTSUPP); /* FI_TAGGED endpoint */
	EXPECT(fi_write(ep, buf, 8, NULL, 0, 0, 0, NULL), -FI_EOPNOTSUPP); /* no FI_RMA asked */
	EXPECT(fi_read(ep, buf, 8, NULL, 0, 0, 0, NULL), -FI_EOPNOTSUPP);
	EXPECT(fi_tsenddata(ep, buf, 8, NULL, 1ULL << 32, 0, 1, NULL), -FI_EINVAL); /* cq_data_size 4 */
	EXPECT(fi_senddata(ep, buf, 8, NULL, 5, 0, NULL), -FI_EOPNOTSUPP); /* FI_TAGGED endpoint */
	struct iovec iov[2] = {{buf, 4}, {buf + 4, 4}};
	EXPECT(fi_tsendv(ep, iov, NULL, 2, 0, 1, NULL), -FI_EINVAL); /* iov_limit 1 */
	struct fi_msg_tagged tm = {.msg_iov = iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .tag = 1};
	EXPECT(fi_trecvmsg(ep, &tm, FI_MULTI_RECV), -FI_EOPNOTSUPP); /* FI_PEEK and co: fi_emp_probe.c */
	EXPECT(fi_cancel(&ep->fid, (void *)0x1234), -FI_ENOENT);
	EXPECT(fi_setopt(&ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, buf, sizeof(size_t)), -FI_ENOPROTOOPT);
	EXPECT(fi_close(&av->fid), -FI_EBUSY);
	EXPECT(fi_close(&ep->fid), 0);
	EXPECT(fi_close(&cq->fid), 0);
	EXPECT(fi_close(&av->fid), 0);
	EXPECT(fi_close(&dom->fid), 0);
}

static void test_traffic(enum fi_av_type av_type)
{
	const char *t = av_type == FI_AV_MAP ? "map" : "table";
	struct side a, b;
	open_side(&a, av_type, 0);
	open_side(&b, av_type, 0);
	connect_sides(&a, &b);
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry ee;
	fi_addr_t src = 0;
	char sbuf[256], rbuf[256];
	for (int i = 0; i < 256; i++)
		sbuf[i] = (char)(i * 7 + 1);

	/* Tagged, directed, FI_SOURCE */
	memset(rbuf, 0, sizeof rbuf);
	EXPECT(fi_trecv(b.ep, rbuf, sizeof rbuf, NULL, b.peer, 0x55, 0, (void *)0xb1), 0);
	EXPECT(fi_tsend(a.ep, sbuf, 200, NULL, a.peer, 0x55, (void *)0xa1), 0);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xa1 && (e.flags & FI_SEND) && (e.flags & FI_TAGGED), "%s: send completion",
	      t);
	EXPECT(wait_cq(b.cq, &e, &src), 1);
	check(e.op_context == (void *)0xb1 && e.len == 200 && e.tag == 0x55 && (e.flags & FI_RECV),
	      "%s: receive completion: len %zu tag %#llx", t, e.len, (unsigned long long)e.tag);
	check(src == b.peer, "%s: FI_SOURCE names the sender's fi_addr", t);
	check(!memcmp(sbuf, rbuf, 200), "%s: data intact", t);
	check(fi_cntr_read(b.rx_cntr) == 1, "%s: receive counter 1", t);

	/* Wildcard: ignore bits; inject (no send completion) */
	EXPECT(fi_trecv(b.ep, rbuf, sizeof rbuf, NULL, FI_ADDR_UNSPEC, 0x100, 0xFF, (void *)0xb2), 0);
	EXPECT(fi_tinject(a.ep, sbuf, 16, a.peer, 0x1AB), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xb2 && e.tag == 0x1AB && e.len == 16, "%s: wildcard receive got tag %#llx", t,
	      (unsigned long long)e.tag);
	EXPECT(fi_cntr_wait(b.rx_cntr, 2, 5000), 0);
	EXPECT(fi_cq_read(a.cq, &e, 1), -FI_EAGAIN); /* inject: no entry */

	/* Truncation is an error entry */
	EXPECT(fi_trecv(b.ep, rbuf, 10, NULL, FI_ADDR_UNSPEC, 9, 0, (void *)0xb3), 0);
	EXPECT(fi_tsend(a.ep, sbuf, 100, NULL, a.peer, 9, (void *)0xa3), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), -FI_EAVAIL);
	memset(&ee, 0, sizeof ee);
	EXPECT(fi_cq_readerr(b.cq, &ee, 0), 1);
	check(ee.err == FI_ETRUNC && ee.olen == 90 && ee.len == 10 && ee.op_context == (void *)0xb3,
	      "%s: truncation: err %d olen %zu len %zu", t, ee.err, ee.olen, ee.len);
	check(!memcmp(rbuf, sbuf, 10), "%s: the first 10 bytes landed", t);
	char sbufe[64];
	check(fi_cq_strerror(b.cq, ee.prov_errno, NULL, sbufe, sizeof sbufe) != NULL, "%s: strerror: %s", t, sbufe);
	EXPECT(wait_cq(a.cq, &e, NULL), 1); /* the sender's send completed */
	check(fi_cntr_readerr(b.rx_cntr) == 1, "%s: receive error counter 1", t);

	/* Remote CQ data: the sender's data with FI_REMOTE_CQ_DATA in the
	 * receive's entry, whether the receive was posted before (senddata),
	 * after the message waited unexpected (injectdata), or after a 200 KiB
	 * message's header was retained (tsendmsg, rendezvous); an FI_PEEK
	 * reports it too; a plain send carries none. */
	EXPECT(fi_trecv(b.ep, rbuf, sizeof rbuf, NULL, FI_ADDR_UNSPEC, 0x60, 0, (void *)0xc1), 0);
	EXPECT(fi_tsenddata(a.ep, sbuf, 24, NULL, 0xfeedf00d, a.peer, 0x60, (void *)0xc2), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xc1 && (e.flags & FI_REMOTE_CQ_DATA) && e.data == 0xfeedf00d && e.len == 24 &&
		      !memcmp(rbuf, sbuf, 24),
	      "%s: tsenddata: flags %#llx data %#llx", t, (unsigned long long)e.flags, (unsigned long long)e.data);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xc2 && !(e.flags & FI_REMOTE_CQ_DATA), "%s: the send's own entry has no data", t);
	EXPECT(fi_tinjectdata(a.ep, sbuf, 16, 7, a.peer, 0x61), 0);
	usleep(20000); /* it waits at b's NIC, unexpected */
	struct iovec piov = {rbuf, sizeof rbuf};
	struct fi_msg_tagged pm = {.msg_iov = &piov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .tag = 0x61,
				   .context = (void *)0xc3};
	EXPECT(fi_trecvmsg(b.ep, &pm, FI_PEEK), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xc3 && (e.flags & FI_REMOTE_CQ_DATA) && e.data == 7 && e.len == 16,
	      "%s: FI_PEEK reports the data: flags %#llx data %#llx", t, (unsigned long long)e.flags,
	      (unsigned long long)e.data);
	EXPECT(fi_trecv(b.ep, rbuf, sizeof rbuf, NULL, FI_ADDR_UNSPEC, 0x61, 0, (void *)0xc4), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xc4 && (e.flags & FI_REMOTE_CQ_DATA) && e.data == 7 && e.len == 16,
	      "%s: injectdata, received unexpected: data %#llx", t, (unsigned long long)e.data);
	size_t mid = 200u << 10;
	char *ms_ = malloc(mid), *mr_ = calloc(1, mid);
	for (size_t i = 0; i < mid; i++)
		ms_[i] = (char)(i * 11 + 3);
	struct iovec siov = {ms_, mid};
	struct fi_msg_tagged sm = {.msg_iov = &siov, .iov_count = 1, .addr = a.peer, .tag = 0x62,
				   .context = (void *)0xc5, .data = 0x12345678};
	EXPECT(fi_tsendmsg(a.ep, &sm, FI_COMPLETION | FI_REMOTE_CQ_DATA), 0);
	usleep(20000); /* its header is retained at b's NIC */
	EXPECT(fi_trecv(b.ep, mr_, mid, NULL, FI_ADDR_UNSPEC, 0x62, 0, (void *)0xc6), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xc6 && (e.flags & FI_REMOTE_CQ_DATA) && e.data == 0x12345678 && e.len == mid &&
		      !memcmp(ms_, mr_, mid),
	      "%s: 200 KiB by rendezvous with data %#llx", t, (unsigned long long)e.data);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);
	free(ms_);
	free(mr_);
	EXPECT(fi_trecv(b.ep, rbuf, sizeof rbuf, NULL, FI_ADDR_UNSPEC, 0x63, 0, (void *)0xc7), 0);
	EXPECT(fi_tsend(a.ep, sbuf, 8, NULL, a.peer, 0x63, (void *)0xc8), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xc7 && !(e.flags & FI_REMOTE_CQ_DATA), "%s: a plain send carries no data", t);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);

	/* Cancellation: an error entry, and a message that matched the
	 * canceled receive reaches the next matching one. */
	EXPECT(fi_trecv(b.ep, rbuf, sizeof rbuf, NULL, FI_ADDR_UNSPEC, 77, 0, (void *)0xb4), 0);
	EXPECT(fi_cancel(&b.ep->fid, (void *)0xb4), 0);
	EXPECT(fi_cancel(&b.ep->fid, (void *)0xb4), -FI_ENOENT);
	EXPECT(fi_cq_read(b.cq, &e, 1), -FI_EAVAIL);
	memset(&ee, 0, sizeof ee);
	EXPECT(fi_cq_readerr(b.cq, &ee, 0), 1);
	check(ee.err == FI_ECANCELED && ee.op_context == (void *)0xb4, "%s: canceled receive: err %d", t, ee.err);
	EXPECT(fi_tsend(a.ep, sbuf, 33, NULL, a.peer, 77, (void *)0xa5), 0);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);
	memset(rbuf, 0, sizeof rbuf);
	EXPECT(fi_trecv(b.ep, rbuf, sizeof rbuf, NULL, FI_ADDR_UNSPEC, 77, 0, (void *)0xb5), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xb5 && e.len == 33 && !memcmp(rbuf, sbuf, 33),
	      "%s: the message after cancel reached the next receive", t);

	/* hpcc's pattern (MPIRandomAccess cancels its MPI_ANY_SOURCE,
	 * MPI_ANY_TAG receive, then the next phase posts its receives): the
	 * canceled wildcard receive takes no later message (the NIC took it
	 * back); the receive posted after the cancel gets it, twice. */
	EXPECT(fi_trecv(b.ep, rbuf, sizeof rbuf, NULL, FI_ADDR_UNSPEC, 0, ~0ULL, (void *)0xb7), 0);
	EXPECT(fi_cancel(&b.ep->fid, (void *)0xb7), 0);
	EXPECT(fi_cq_read(b.cq, &e, 1), -FI_EAVAIL);
	memset(&ee, 0, sizeof ee);
	EXPECT(fi_cq_readerr(b.cq, &ee, 0), 1);
	check(ee.err == FI_ECANCELED && ee.op_context == (void *)0xb7, "%s: canceled wildcard receive", t);
	char small[24];
	for (int round = 0; round < 2; round++) {
		void *ctx = (void *)(uintptr_t)(0xb8 + round);
		size_t n = round ? 12 : 20;
		memset(small, 0, sizeof small);
		EXPECT(fi_trecv(b.ep, small, sizeof small, NULL, FI_ADDR_UNSPEC, 78, 0, ctx), 0);
		EXPECT(fi_tsend(a.ep, sbuf + round, n, NULL, a.peer, 78, (void *)0xa7), 0);
		EXPECT(wait_cq(a.cq, &e, NULL), 1);
		EXPECT(wait_cq(b.cq, &e, NULL), 1);
		check(e.op_context == ctx && e.len == n && e.tag == 78 && !memcmp(small, sbuf + round, n),
		      "%s: round %d: the receive posted after a wildcard cancel got the message: ctx %p len %zu", t,
		      round, e.op_context, e.len);
	}
	/* And a receive of another tag. */
	EXPECT(fi_trecv(b.ep, small, sizeof small, NULL, FI_ADDR_UNSPEC, 79, 0, (void *)0xba), 0);
	EXPECT(fi_tsend(a.ep, sbuf, 8, NULL, a.peer, 79, (void *)0xa8), 0);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xba && e.len == 8, "%s: tag 79 past the leftover canceled receive", t);
	/* The same when the receive posted after the cancel lies in the
	 * caller's memory (over 64 KiB, hpcc's LatencyBandwidth): it gets the
	 * first message, in order, and the next receive the second (which
	 * waits for it, by rendezvous). Before that, a tag-78 message sent
	 * with no receive posted waits for the next one. */
	EXPECT(fi_tsend(a.ep, sbuf, 4, NULL, a.peer, 78, (void *)0xa9), 0);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);
	EXPECT(fi_trecv(b.ep, small, sizeof small, NULL, FI_ADDR_UNSPEC, 78, 0, (void *)0xbb), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xbb && e.len == 4, "%s: tag 78's leftover message", t);
	EXPECT(fi_trecv(b.ep, rbuf, sizeof rbuf, NULL, FI_ADDR_UNSPEC, 0, ~0ULL, (void *)0xbc), 0);
	EXPECT(fi_cancel(&b.ep->fid, (void *)0xbc), 0);
	EXPECT(fi_cq_read(b.cq, &e, 1), -FI_EAVAIL);
	EXPECT(fi_cq_readerr(b.cq, &ee, 0), 1);
	size_t large = 100u << 10;
	char *l1 = calloc(1, large), *l2 = calloc(1, large), *ls = malloc(large);
	for (size_t i = 0; i < large; i++)
		ls[i] = (char)(i * 5 + 9);
	EXPECT(fi_trecv(b.ep, l1, large, NULL, FI_ADDR_UNSPEC, 80, 0, (void *)0xbd), 0);
	EXPECT(fi_tsend(a.ep, sbuf, 20, NULL, a.peer, 80, (void *)0xaa), 0);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);
	EXPECT(fi_tsend(a.ep, ls, large, NULL, a.peer, 80, (void *)0xab), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xbd && e.len == 20 && !memcmp(l1, sbuf, 20),
	      "%s: a receive in the caller's memory gets the first message: ctx %p len %zu", t, e.op_context, e.len);
	EXPECT(fi_trecv(b.ep, l2, large, NULL, FI_ADDR_UNSPEC, 80, 0, (void *)0xbe), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.op_context == (void *)0xbe && e.len == large && !memcmp(l2, ls, large),
	      "%s: and the next receive the second: ctx %p len %zu", t, e.op_context, e.len);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);
	free(l1);
	free(l2);
	free(ls);

	/* Large, unregistered (registered for the operation) */
	size_t big = 3u << 20;
	char *s = malloc(big), *r = calloc(1, big);
	for (size_t i = 0; i < big; i++)
		s[i] = (char)(i * 13 + 5);
	EXPECT(fi_trecv(b.ep, r, big, NULL, FI_ADDR_UNSPEC, 1000, 0, (void *)0xb6), 0);
	EXPECT(fi_tsend(a.ep, s, big, NULL, a.peer, 1000, (void *)0xa6), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.len == big && !memcmp(s, r, big), "%s: 3 MiB unregistered message intact", t);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);

	/* Registered memory (FI_MR_LOCAL descriptors: zero copy) */
	struct fid_mr *ms, *mrr;
	EXPECT(fi_mr_reg(a.dom, s, big, FI_SEND, 0, 0, 0, &ms, NULL), 0);
	EXPECT(fi_mr_reg(b.dom, r, big, FI_RECV, 0, 0, 0, &mrr, NULL), 0);
	memset(r, 0, big);
	EXPECT(fi_trecv(b.ep, r + 1, 4096, fi_mr_desc(mrr), FI_ADDR_UNSPEC, 1001, 0, (void *)0xb7), 0);
	EXPECT(fi_tsend(a.ep, s + 3, 4096, fi_mr_desc(ms), a.peer, 1001, (void *)0xa7), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	check(e.len == 4096 && !memcmp(s + 3, r + 1, 4096), "%s: registered buffers, offsets inside", t);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);
	EXPECT(fi_tsend(a.ep, s + big - 8, 64, fi_mr_desc(ms), a.peer, 1, NULL), -FI_EINVAL); /* outside the MR */
	EXPECT(fi_close(&ms->fid), 0);
	EXPECT(fi_close(&mrr->fid), 0);
	free(s);
	free(r);

	/* Waiting: trywait, then the fd fires when a message comes */
	int fd = -1;
	EXPECT(fi_control(&b.cq->fid, FI_GETWAIT, &fd), 0);
	EXPECT(fi_trecv(b.ep, rbuf, sizeof rbuf, NULL, FI_ADDR_UNSPEC, 5, 0, (void *)0xb8), 0);
	struct fid *fids[1] = {&b.cq->fid};
	EXPECT(fi_trywait(fabric, fids, 1), 0);
	EXPECT(fi_tsend(a.ep, sbuf, 8, NULL, a.peer, 5, (void *)0xa8), 0);
	struct pollfd p = {.fd = fd, .events = POLLIN};
	EXPECT(poll(&p, 1, 5000), 1);
	EXPECT(fi_trywait(fabric, fids, 1), -FI_EAGAIN);
	EXPECT(fi_cq_read(b.cq, &e, 1), 1);
	check(e.op_context == (void *)0xb8, "%s: woken by the eventfd", t);
	EXPECT(fi_cq_sread(a.cq, &e, 1, NULL, 5000), 1);

	close_side(&a);
	close_side(&b);
}

/* FI_SELECTIVE_COMPLETION: only FI_COMPLETION operations report success. */
static void test_selective(void)
{
	struct side a, b;
	open_side(&a, FI_AV_MAP, FI_SELECTIVE_COMPLETION);
	open_side(&b, FI_AV_MAP, 0);
	connect_sides(&a, &b);
	char buf[64] = "selective";
	struct fi_cq_tagged_entry e;
	EXPECT(fi_trecv(b.ep, buf, sizeof buf, NULL, FI_ADDR_UNSPEC, 1, 0, NULL), 0);
	EXPECT(fi_trecv(b.ep, buf, sizeof buf, NULL, FI_ADDR_UNSPEC, 2, 0, NULL), 0);
	EXPECT(fi_tsend(a.ep, buf, 10, NULL, a.peer, 1, (void *)1), 0);
	struct iovec iov = {buf, 10};
	struct fi_msg_tagged m = {.msg_iov = &iov, .iov_count = 1, .addr = a.peer, .tag = 2, .context = (void *)2};
	EXPECT(fi_tsendmsg(a.ep, &m, FI_COMPLETION), 0);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	EXPECT(wait_cq(b.cq, &e, NULL), 1);
	EXPECT(wait_cq(a.cq, &e, NULL), 1);
	check(e.op_context == (void *)2, "only the FI_COMPLETION send reported (context %p)", e.op_context);
	EXPECT(fi_cq_read(a.cq, &e, 1), -FI_EAGAIN);
	close_side(&a);
	close_side(&b);
}

int main(void)
{
	printf("TAP version 13\n");
	test_getinfo();
	struct fi_info *h = hints_base(FI_TAGGED | FI_DIRECTED_RECV | FI_SOURCE);
	int r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &info);
	fi_freeinfo(h);
	check(r == 0, "fi_getinfo for the endpoints (%d)", r);
	if (r)
		goto done;
	EXPECT(fi_fabric(info->fabric_attr, &fabric, NULL), 0);
	test_calls();
	test_traffic(FI_AV_MAP);
	test_traffic(FI_AV_TABLE);
	test_selective();
	test_mr_cache();
	test_bounce_runs();
	test_probe(fabric, info);
	test_rma_getinfo();
	test_rma(fabric, FI_MSG | FI_RMA);
	test_rma(fabric, FI_TAGGED | FI_RMA);
	test_atomic(fabric);
	test_coll(fabric);
	EXPECT(fi_close(&fabric->fid), 0);
	fi_freeinfo(info);
done:
	printf("1..%d\n# %d passed, %d failed\n", numbered, passed, failed);
	return failed ? 1 : 0;
}
