/* FI_RMA unit tests of the emp provider (part of fi_emp_unit, TAP): what
 * fi_getinfo answers, each call's bad parameters, writes and reads of
 * every form through bounce slots, per-operation registrations and the
 * caller's MRs, remote CQ data, counters, and the target NIC's refusals
 * (foreign key, wrong secret, missing right, out of range) as error
 * entries that leave the target's memory unchanged. */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_rma.h>

#include "fi_emp_unit.h"

static struct fi_info *rma_hints(uint64_t caps)
{
	struct fi_info *h = fi_allocinfo();
	h->caps = caps;
	h->ep_attr->type = FI_EP_RDM;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	h->fabric_attr->prov_name = strdup("emp");
	return h;
}

/* fi_getinfo's return for hints h (freed). */
static int rma_getinfo_ret(struct fi_info *h)
{
	struct fi_info *out = NULL;
	int r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &out);
	fi_freeinfo(out);
	fi_freeinfo(h);
	return r;
}

void test_rma_getinfo(void)
{
	struct fi_info *h, *out = NULL;

	h = rma_hints(FI_MSG | FI_RMA);
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &out), 0);
	check(out && (out->caps & FI_RMA) && (out->caps & FI_MSG) && !(out->caps & FI_TAGGED), "caps as asked (msg+rma)");
	check(out && out->domain_attr->mr_key_size == 8, "RMA keys are 64 bits (key + secret)");
	check(out && !(out->domain_attr->mr_mode & FI_MR_VIRT_ADDR) && (out->domain_attr->mr_mode & FI_MR_PROV_KEY),
	      "RMA: offsets, provider keys (mr_mode %#x)", out ? out->domain_attr->mr_mode : 0);
	check(out && out->domain_attr->cq_data_size == 4, "remote CQ data: 4 bytes without FI_TAGGED");
	check(out && out->tx_attr->rma_iov_limit == 1, "rma_iov_limit 1");
	fi_freeinfo(out);
	fi_freeinfo(h);
	out = NULL;

	h = rma_hints(FI_TAGGED | FI_RMA);
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &out), 0);
	check(out && out->domain_attr->cq_data_size == 0, "no remote CQ data with FI_TAGGED");
	fi_freeinfo(out);
	fi_freeinfo(h);
	out = NULL;

	h = rma_hints(FI_TAGGED);
	EXPECT(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &out), 0);
	check(out && !(out->caps & FI_RMA), "FI_RMA only when asked");
	fi_freeinfo(out);
	fi_freeinfo(h);
	out = NULL;

	h = rma_hints(FI_MSG | FI_RMA);
	h->domain_attr->mr_mode = FI_MR_BASIC;
	EXPECT(rma_getinfo_ret(h), -FI_ENODATA);
	h = rma_hints(FI_MSG | FI_RMA);
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR; /* the caller would pick keys */
	EXPECT(rma_getinfo_ret(h), -FI_ENODATA);
	h = rma_hints(FI_MSG | FI_RMA);
	h->domain_attr->cq_data_size = 8;
	EXPECT(rma_getinfo_ret(h), -FI_ENODATA);
	h = rma_hints(FI_TAGGED | FI_RMA);
	h->domain_attr->cq_data_size = 4;
	EXPECT(rma_getinfo_ret(h), -FI_ENODATA);
	h = rma_hints(FI_MSG | FI_RMA);
	h->tx_attr->rma_iov_limit = 2;
	EXPECT(rma_getinfo_ret(h), -FI_ENODATA);
	h = rma_hints(FI_MSG | FI_RMA | FI_RMA_EVENT);
	EXPECT(rma_getinfo_ret(h), -FI_ENODATA);
	h = rma_hints(FI_MSG | FI_RMA);
	EXPECT(fi_getinfo(FI_VERSION(1, 4), NULL, NULL, 0, h, &out), -FI_ENODATA);
	fi_freeinfo(h);
}

struct rside {
	struct fid_domain *dom;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_cntr *cntr; /* FI_WRITE | FI_READ */
	fi_addr_t peer;
};

static void open_rside(struct fid_fabric *fabric, struct fi_info *info, struct rside *s)
{
	struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_FD};
	struct fi_av_attr av_attr = {.type = FI_AV_MAP};
	struct fi_cntr_attr cntr_attr = {.events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC};
	EXPECT(fi_domain(fabric, info, &s->dom, NULL), 0);
	EXPECT(fi_cq_open(s->dom, &cq_attr, &s->cq, NULL), 0);
	EXPECT(fi_av_open(s->dom, &av_attr, &s->av, NULL), 0);
	EXPECT(fi_cntr_open(s->dom, &cntr_attr, &s->cntr, NULL), 0);
	EXPECT(fi_endpoint(s->dom, info, &s->ep, NULL), 0);
	EXPECT(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_ep_bind(s->ep, &s->av->fid, 0), 0);
	EXPECT(fi_ep_bind(s->ep, &s->cntr->fid, FI_REMOTE_WRITE), -FI_EOPNOTSUPP); /* no FI_RMA_EVENT */
	EXPECT(fi_ep_bind(s->ep, &s->cntr->fid, FI_WRITE | FI_READ), 0);
	EXPECT(fi_ep_bind(s->ep, &s->cntr->fid, FI_WRITE), -FI_EINVAL); /* already bound */
	char b[8];
	if (info->caps & FI_RMA)
		EXPECT(fi_write(s->ep, b, sizeof b, NULL, 0, 0, 0, NULL), -FI_EOPBADSTATE);
	else
		EXPECT(fi_atomic(s->ep, b, 1, NULL, 0, 0, 0, FI_UINT64, FI_SUM, NULL), -FI_EOPBADSTATE);
	EXPECT(fi_enable(s->ep), 0);
}

static void close_rside(struct rside *s)
{
	EXPECT(fi_close(&s->cntr->fid), -FI_EBUSY);
	EXPECT(fi_close(&s->ep->fid), 0);
	EXPECT(fi_close(&s->cq->fid), 0);
	EXPECT(fi_close(&s->av->fid), 0);
	EXPECT(fi_close(&s->cntr->fid), 0);
	EXPECT(fi_close(&s->dom->fid), 0);
}

/* The next entry, -FI_EAVAIL for an error entry, or -FI_ETIMEDOUT (~10 s). */
static ssize_t next_entry(struct fid_cq *cq, struct fi_cq_tagged_entry *e)
{
	for (int i = 0; i < 10000; i++) {
		ssize_t r = fi_cq_read(cq, e, 1);
		if (r != -FI_EAGAIN)
			return r;
		r = fi_cq_sread(cq, e, 0, NULL, 1);
		(void)r;
	}
	return -FI_ETIMEDOUT;
}

/* One successful operation's entry: its flags and context. */
static void expect_done(struct fid_cq *cq, uint64_t flags, void *ctx, const char *what)
{
	struct fi_cq_tagged_entry e = {0};
	ssize_t r = next_entry(cq, &e);
	check(r == 1 && e.flags == flags && e.op_context == ctx, "%s completes (ret %zd, flags %#llx, ctx %p)", what, r,
	      (unsigned long long)e.flags, e.op_context);
}

/* One refused operation's error entry: FI_EACCES, its flags and context. */
static void expect_refused(struct fid_cq *cq, uint64_t flags, void *ctx, const char *what)
{
	struct fi_cq_tagged_entry e;
	ssize_t r = next_entry(cq, &e);
	struct fi_cq_err_entry err = {0};
	ssize_t re = r == -FI_EAVAIL ? fi_cq_readerr(cq, &err, 0) : 0;
	check(r == -FI_EAVAIL && re == 1 && err.err == FI_EACCES && err.flags == flags && err.op_context == ctx,
	      "%s: error entry FI_EACCES (ret %zd, err %d, flags %#llx)", what, r, err.err,
	      (unsigned long long)err.flags);
}

#define REGION (256u * 1024u)
#define BIG (200u * 1024u) /* above the bounce size: registered for the operation */

void test_rma(struct fid_fabric *fabric, uint64_t caps)
{
	struct fi_info *h = rma_hints(caps), *info = NULL;
	int r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &info);
	fi_freeinfo(h);
	check(r == 0, "fi_getinfo for RMA endpoints, caps %#llx (%d)", (unsigned long long)caps, r);
	if (r)
		return;
	bool cq_data = !(caps & FI_TAGGED);
	struct rside a, b;
	open_rside(fabric, info, &a);
	open_rside(fabric, info, &b);
	char na[64], nb[64];
	size_t la = sizeof na, lb = sizeof nb;
	EXPECT(fi_getname(&a.ep->fid, na, &la), 0);
	EXPECT(fi_getname(&b.ep->fid, nb, &lb), 0);
	EXPECT(fi_av_insert(a.av, nb, 1, &a.peer, 0, NULL), 1);
	EXPECT(fi_av_insert(b.av, na, 1, &b.peer, 0, NULL), 1);

	/* The target's regions: read/write, read only, and no remote right. */
	char *rw = calloc(1, REGION), *ro = calloc(1, 4096), *none = calloc(1, 4096), *snap = malloc(REGION);
	char *local = malloc(REGION), *big = malloc(BIG);
	struct fid_mr *mr_rw, *mr_ro, *mr_none, *mr_local;
	EXPECT(fi_mr_reg(b.dom, rw, REGION, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr_rw, NULL), 0);
	EXPECT(fi_mr_reg(b.dom, ro, 4096, FI_REMOTE_READ, 0, 0, 0, &mr_ro, NULL), 0);
	EXPECT(fi_mr_reg(b.dom, none, 4096, FI_SEND | FI_RECV, 0, 0, 0, &mr_none, NULL), 0);
	EXPECT(fi_mr_reg(a.dom, local, REGION, FI_READ | FI_WRITE, 0, 0, 0, &mr_local, NULL), 0);
	uint64_t k_rw = fi_mr_key(mr_rw), k_ro = fi_mr_key(mr_ro), k_none = fi_mr_key(mr_none);
	check((k_rw >> 32) != 0 || (k_ro >> 32) != 0, "keys carry a secret in their high 32 bits (%#llx, %#llx)",
	      (unsigned long long)k_rw, (unsigned long long)k_ro);
	memset(ro, 'r', 4096);

	/* Bad parameters. */
	char src[256];
	memset(src, 'w', sizeof src);
	EXPECT(fi_write(a.ep, NULL, 8, NULL, a.peer, 0, k_rw, NULL), -FI_EINVAL);
	EXPECT(fi_write(a.ep, src, 8, NULL, 12345, 0, k_rw, NULL), -FI_EINVAL); /* not in the AV */
	EXPECT(fi_write(a.ep, src, 64, NULL, a.peer, UINT64_MAX - 8, k_rw, NULL), -FI_EINVAL); /* wraps */
	EXPECT(fi_inject_write(a.ep, big, BIG, a.peer, 0, k_rw), -FI_EMSGSIZE);
	struct iovec iov2[2] = {{src, 8}, {src + 8, 8}};
	EXPECT(fi_writev(a.ep, iov2, NULL, 2, a.peer, 0, k_rw, NULL), -FI_EINVAL); /* iov_limit 1 */
	struct fi_rma_iov riov = {.addr = 0, .len = 16, .key = k_rw};
	struct fi_msg_rma m = {.msg_iov = iov2, .iov_count = 1, .addr = a.peer, .rma_iov = &riov, .rma_iov_count = 1};
	EXPECT(fi_writemsg(a.ep, &m, 0), -FI_EINVAL); /* 8 local bytes, 16 remote */
	riov.len = 8;
	m.rma_iov_count = 2;
	EXPECT(fi_writemsg(a.ep, &m, 0), -FI_EINVAL);
	m.rma_iov_count = 1;
	EXPECT(fi_writemsg(a.ep, &m, FI_FENCE), -FI_EBADFLAGS);
	EXPECT(fi_readmsg(a.ep, &m, FI_INJECT), -FI_EBADFLAGS);
	EXPECT(fi_writemsg(a.ep, NULL, 0), -FI_EINVAL);
	if (cq_data)
		EXPECT(fi_writedata(a.ep, src, 8, NULL, 1ULL << 32, a.peer, 0, k_rw, NULL), -FI_EINVAL); /* 4 bytes */
	else
		EXPECT(fi_writedata(a.ep, src, 8, NULL, 1, a.peer, 0, k_rw, NULL), -FI_EOPNOTSUPP);

	/* Writes: bounced, the caller's MR, registered for the operation. */
	EXPECT(fi_write(a.ep, src, 64, NULL, a.peer, 100, k_rw, (void *)1), 0);
	expect_done(a.cq, FI_RMA | FI_WRITE, (void *)1, "fi_write (bounced)");
	check(memcmp(rw + 100, src, 64) == 0 && rw[99] == 0 && rw[164] == 0, "the target holds exactly the 64 bytes");
	for (size_t i = 0; i < REGION; i++)
		local[i] = (char)(i * 7 + 3);
	EXPECT(fi_write(a.ep, local, REGION, fi_mr_desc(mr_local), a.peer, 0, k_rw, (void *)2), 0);
	expect_done(a.cq, FI_RMA | FI_WRITE, (void *)2, "fi_write 256 KiB from the caller's MR");
	check(memcmp(rw, local, REGION) == 0, "256 KiB written intact");
	for (size_t i = 0; i < BIG; i++)
		big[i] = (char)(i * 13 + 1);
	struct iovec iov = {big, BIG};
	EXPECT(fi_writev(a.ep, &iov, NULL, 1, a.peer, 4096, k_rw, (void *)3), 0);
	expect_done(a.cq, FI_RMA | FI_WRITE, (void *)3, "fi_writev 200 KiB unregistered");
	check(memcmp(rw + 4096, big, BIG) == 0, "200 KiB written intact");
	iov = (struct iovec){src, 32};
	riov = (struct fi_rma_iov){.addr = 8, .len = 32, .key = k_rw};
	m = (struct fi_msg_rma){.msg_iov = &iov, .iov_count = 1, .addr = a.peer, .rma_iov = &riov, .rma_iov_count = 1,
				.context = (void *)4};
	EXPECT(fi_writemsg(a.ep, &m, FI_COMPLETION | FI_DELIVERY_COMPLETE), 0);
	expect_done(a.cq, FI_RMA | FI_WRITE, (void *)4, "fi_writemsg");
	check(memcmp(rw + 8, src, 32) == 0, "fi_writemsg's bytes are there");
	EXPECT(fi_write(a.ep, src, 0, NULL, a.peer, 0, k_rw, (void *)5), 0);
	expect_done(a.cq, FI_RMA | FI_WRITE, (void *)5, "a 0-byte write");

	/* fi_inject_write: no entry; the counter says when it is done. */
	uint64_t before = fi_cntr_read(a.cntr);
	char inj[16] = "injected bytes!";
	EXPECT(fi_inject_write(a.ep, inj, sizeof inj, a.peer, 2000, k_rw), 0);
	memset(inj, 0, sizeof inj); /* the provider copied it */
	EXPECT(fi_cntr_wait(a.cntr, before + 1, 10000), 0);
	check(memcmp(rw + 2000, "injected bytes!", 16) == 0, "fi_inject_write's bytes are there");
	struct fi_cq_tagged_entry e;
	EXPECT(fi_cq_read(a.cq, &e, 1), -FI_EAGAIN);

	/* Reads: bounced, into the caller's MR, registered for the operation. */
	char dst[256] = {0};
	EXPECT(fi_read(a.ep, dst, 64, NULL, a.peer, 100, k_ro, (void *)6), 0);
	expect_done(a.cq, FI_RMA | FI_READ, (void *)6, "fi_read (bounced)");
	check(memcmp(dst, ro, 64) == 0 && dst[64] == 0, "read the 64 bytes");
	memset(local, 0, REGION);
	EXPECT(fi_read(a.ep, local, REGION, fi_mr_desc(mr_local), a.peer, 0, k_rw, (void *)7), 0);
	expect_done(a.cq, FI_RMA | FI_READ, (void *)7, "fi_read 256 KiB into the caller's MR");
	check(memcmp(local, rw, REGION) == 0, "256 KiB read intact");
	memset(big, 0, BIG);
	iov = (struct iovec){big, BIG};
	EXPECT(fi_readv(a.ep, &iov, NULL, 1, a.peer, 4096, k_rw, (void *)8), 0);
	expect_done(a.cq, FI_RMA | FI_READ, (void *)8, "fi_readv 200 KiB unregistered");
	check(memcmp(big, rw + 4096, BIG) == 0, "200 KiB read intact");
	iov = (struct iovec){dst, 16};
	riov = (struct fi_rma_iov){.addr = 2000, .len = 16, .key = k_rw};
	m = (struct fi_msg_rma){.msg_iov = &iov, .iov_count = 1, .addr = a.peer, .rma_iov = &riov, .rma_iov_count = 1,
				.context = (void *)9};
	EXPECT(fi_readmsg(a.ep, &m, FI_COMPLETION), 0);
	expect_done(a.cq, FI_RMA | FI_READ, (void *)9, "fi_readmsg");
	check(memcmp(dst, "injected bytes!", 16) == 0, "fi_readmsg's bytes");

	/* Refusals by the target's NIC: error entries, memory unchanged. Once:
	 * the NIC throttles a source refused 16 times in a second. */
	if (!cq_data)
		goto skip_refusals;
	memcpy(snap, rw, REGION);
	EXPECT(fi_write(a.ep, src, 64, NULL, a.peer, 0, k_rw ^ (1ULL << 40), (void *)10), 0);
	expect_refused(a.cq, FI_RMA | FI_WRITE, (void *)10, "a wrong secret");
	EXPECT(fi_write(a.ep, src, 64, NULL, a.peer, 0, (k_rw & ~0xFFFFFFFFULL) | 0x7FFFFFF0u, (void *)11), 0);
	expect_refused(a.cq, FI_RMA | FI_WRITE, (void *)11, "a foreign key");
	EXPECT(fi_write(a.ep, src, 64, NULL, a.peer, 0, k_ro, (void *)12), 0);
	expect_refused(a.cq, FI_RMA | FI_WRITE, (void *)12, "a write without FI_REMOTE_WRITE");
	EXPECT(fi_read(a.ep, dst, 64, NULL, a.peer, 0, k_none, (void *)13), 0);
	expect_refused(a.cq, FI_RMA | FI_READ, (void *)13, "a read without FI_REMOTE_READ");
	EXPECT(fi_write(a.ep, src, 64, NULL, a.peer, REGION - 32, k_rw, (void *)14), 0);
	expect_refused(a.cq, FI_RMA | FI_WRITE, (void *)14, "a write past the region's end");
	EXPECT(fi_read(a.ep, dst, 64, NULL, a.peer, 4090, k_ro, (void *)15), 0);
	expect_refused(a.cq, FI_RMA | FI_READ, (void *)15, "a read past the region's end");
	check(memcmp(snap, rw, REGION) == 0, "the target's memory is unchanged by the refused writes");
	check(ro[0] == 'r' && none[0] == 0, "the other regions too");
	check(fi_cntr_readerr(a.cntr) == 6, "the counter counted 6 errors (%llu)",
	      (unsigned long long)fi_cntr_readerr(a.cntr));
skip_refusals:
	check(fi_cntr_read(a.cntr) == 10, "10 successes counted (%llu)", (unsigned long long)fi_cntr_read(a.cntr));
	size_t cnt;
	EXPECT(fi_atomicvalid(a.ep, FI_UINT64, FI_SUM, &cnt), -FI_EOPNOTSUPP); /* no FI_ATOMIC asked */
	EXPECT(fi_atomic(a.ep, src, 1, NULL, a.peer, 0, k_rw, FI_UINT64, FI_SUM, NULL), -FI_EOPNOTSUPP);
	EXPECT(fi_barrier(a.ep, 0, NULL), -FI_EOPNOTSUPP); /* no FI_COLLECTIVE asked */

	/* Remote CQ data: the target's CQ gets the data. */
	if (cq_data) {
		EXPECT(fi_writedata(a.ep, src, 48, NULL, 0xC0FFEE, a.peer, 300, k_rw, (void *)16), 0);
		expect_done(a.cq, FI_RMA | FI_WRITE, (void *)16, "fi_writedata");
		struct fi_cq_tagged_entry t = {0};
		ssize_t n = next_entry(b.cq, &t);
		check(n == 1 && t.flags == (FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA) && t.data == 0xC0FFEE &&
			      t.len == 48,
		      "the target's entry: flags %#llx data %#llx len %zu (ret %zd)", (unsigned long long)t.flags,
		      (unsigned long long)t.data, t.len, n);
		check(memcmp(rw + 300, src, 48) == 0, "fi_writedata's bytes are there");
		for (uint64_t i = 0; i < 40; i++) /* more than the pool: it refills */
			EXPECT(fi_inject_writedata(a.ep, &i, sizeof i, i, a.peer, 8 * i, k_rw), 0);
		int got = 0, in_order = 1;
		for (uint64_t i = 0; i < 40; i++) {
			if (next_entry(b.cq, &t) != 1)
				break;
			got++;
			in_order &= t.data == i;
		}
		check(got == 40 && in_order, "40 writes with data: %d entries, in order %d", got, in_order);
	}

	EXPECT(fi_close(&mr_rw->fid), 0);
	EXPECT(fi_close(&mr_ro->fid), 0);
	EXPECT(fi_close(&mr_none->fid), 0);
	EXPECT(fi_close(&mr_local->fid), 0);
	close_rside(&a);
	close_rside(&b);

	/* Endpoints closed with operations in flight (here the receives kept
	 * for remote CQ data) give their CQ slots back: a small CQ outlives
	 * many endpoints. */
	if (cq_data) {
		struct fid_domain *dom;
		struct fid_cq *cq;
		struct fid_av *av;
		struct fid_ep *ep;
		struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_DATA, .size = 8};
		struct fi_av_attr aa = {.type = FI_AV_MAP};
		EXPECT(fi_domain(fabric, info, &dom, NULL), 0);
		EXPECT(fi_cq_open(dom, &ca, &cq, NULL), 0);
		EXPECT(fi_av_open(dom, &aa, &av, NULL), 0);
		int cycles_ok = 0;
		for (int i = 0; i < 12; i++) {
			if (fi_endpoint(dom, info, &ep, NULL))
				break;
			int bound = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV) == 0 &&
				    fi_ep_bind(ep, &av->fid, 0) == 0 && fi_enable(ep) == 0;
			cycles_ok += bound && fi_close(&ep->fid) == 0;
		}
		check(cycles_ok == 12, "12 endpoints on one small CQ, each closed with its receives posted (%d)",
		      cycles_ok);
		EXPECT(fi_endpoint(dom, info, &ep, NULL), 0);
		EXPECT(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), 0);
		EXPECT(fi_ep_bind(ep, &av->fid, 0), 0);
		EXPECT(fi_enable(ep), 0);
		int posted = 0;
		for (int i = 0; i < 6; i++)
			posted += fi_recv(ep, dst, 8, NULL, FI_ADDR_UNSPEC, NULL) == 0;
		check(posted == 6, "the CQ still takes 6 receives beside the endpoint's 2 for remote CQ data (%d)",
		      posted);
		EXPECT(fi_close(&ep->fid), 0);
		EXPECT(fi_close(&cq->fid), 0);
		EXPECT(fi_close(&av->fid), 0);
		EXPECT(fi_close(&dom->fid), 0);
	}
	fi_freeinfo(info);
	free(rw);
	free(ro);
	free(none);
	free(snap);
	free(local);
	free(big);
}

void test_atomic(struct fid_fabric *fabric)
{
	struct fi_info *h = rma_hints(FI_MSG | FI_ATOMIC), *info = NULL;
	int r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &info);
	fi_freeinfo(h);
	check(r == 0 && info && (info->caps & FI_ATOMIC) && !(info->caps & FI_RMA), "fi_getinfo for FI_ATOMIC (%d)", r);
	if (r)
		return;
	struct rside a, b;
	open_rside(fabric, info, &a);
	open_rside(fabric, info, &b);
	char na[64], nb[64];
	size_t la = sizeof na, lb = sizeof nb;
	EXPECT(fi_getname(&a.ep->fid, na, &la), 0);
	EXPECT(fi_getname(&b.ep->fid, nb, &lb), 0);
	EXPECT(fi_av_insert(a.av, nb, 1, &a.peer, 0, NULL), 1);
	EXPECT(fi_av_insert(b.av, na, 1, &b.peer, 0, NULL), 1);

	/* What the NIC runs, and nothing else. */
	size_t cnt = 0;
	EXPECT(fi_atomicvalid(a.ep, FI_UINT64, FI_SUM, &cnt), 0);
	check(cnt == 1, "one word per operation (%zu)", cnt);
	EXPECT(fi_atomicvalid(a.ep, FI_INT32, FI_ATOMIC_WRITE, &cnt), 0);
	EXPECT(fi_atomicvalid(a.ep, FI_UINT64, FI_PROD, &cnt), -FI_EOPNOTSUPP);
	EXPECT(fi_atomicvalid(a.ep, FI_DOUBLE, FI_SUM, &cnt), -FI_EOPNOTSUPP);
	EXPECT(fi_atomicvalid(a.ep, FI_UINT64, FI_CSWAP, &cnt), -FI_EOPNOTSUPP);
	EXPECT(fi_atomicvalid(a.ep, FI_UINT64, FI_SUM, NULL), -FI_EINVAL);
	EXPECT(fi_fetch_atomicvalid(a.ep, FI_UINT32, FI_ATOMIC_READ, &cnt), 0);
	EXPECT(fi_fetch_atomicvalid(a.ep, FI_UINT64, FI_BOR, &cnt), -FI_EOPNOTSUPP);
	EXPECT(fi_compare_atomicvalid(a.ep, FI_INT64, FI_CSWAP, &cnt), 0);
	EXPECT(fi_compare_atomicvalid(a.ep, FI_INT64, FI_CSWAP_NE, &cnt), -FI_EOPNOTSUPP);
	struct fi_atomic_attr aa = {0};
	EXPECT(fi_query_atomic(a.dom, FI_INT32, FI_SUM, &aa, 0), 0);
	check(aa.count == 1 && aa.size == 4, "fi_query_atomic: count %zu size %zu", aa.count, aa.size);
	EXPECT(fi_query_atomic(a.dom, FI_UINT64, FI_CSWAP, &aa, FI_COMPARE_ATOMIC), 0);
	EXPECT(fi_query_atomic(a.dom, FI_FLOAT, FI_SUM, &aa, 0), -FI_EOPNOTSUPP);
	EXPECT(fi_query_atomic(a.dom, FI_UINT64, FI_SUM, &aa, FI_FETCH_ATOMIC | FI_COMPARE_ATOMIC), -FI_EBADFLAGS);

	uint64_t *words = calloc(64, sizeof *words), *ro = calloc(8, sizeof *ro);
	struct fid_mr *mr_w, *mr_ro;
	EXPECT(fi_mr_reg(b.dom, words, 64 * sizeof *words, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr_w, NULL), 0);
	EXPECT(fi_mr_reg(b.dom, ro, 8 * sizeof *ro, FI_REMOTE_READ, 0, 0, 0, &mr_ro, NULL), 0);
	uint64_t k = fi_mr_key(mr_w), k_ro = fi_mr_key(mr_ro);
	words[0] = 10;
	uint64_t v = 5, res = 0, cmp;

	/* Bad parameters. */
	EXPECT(fi_atomic(a.ep, &v, 2, NULL, a.peer, 0, k, FI_UINT64, FI_SUM, NULL), -FI_EINVAL);
	EXPECT(fi_atomic(a.ep, &v, 1, NULL, a.peer, 4, k, FI_UINT64, FI_SUM, NULL), -FI_EINVAL); /* misaligned */
	EXPECT(fi_atomic(a.ep, &v, 1, NULL, a.peer, 0, k, FI_UINT64, FI_PROD, NULL), -FI_EOPNOTSUPP);
	EXPECT(fi_atomic(a.ep, &v, 1, NULL, a.peer, 0, k, FI_DOUBLE, FI_SUM, NULL), -FI_EOPNOTSUPP);
	EXPECT(fi_atomic(a.ep, NULL, 1, NULL, a.peer, 0, k, FI_UINT64, FI_SUM, NULL), -FI_EINVAL);
	EXPECT(fi_fetch_atomic(a.ep, &v, 1, NULL, NULL, NULL, a.peer, 0, k, FI_UINT64, FI_SUM, NULL), -FI_EINVAL);
	EXPECT(fi_atomic(a.ep, &v, 1, NULL, 999, 0, k, FI_UINT64, FI_SUM, NULL), -FI_EINVAL); /* not in the AV */
	struct fi_ioc ioc = {&v, 1}, rioc = {&res, 1};
	struct fi_rma_ioc tgt = {.addr = 0, .count = 2, .key = k};
	struct fi_msg_atomic am = {.msg_iov = &ioc, .iov_count = 1, .addr = a.peer, .rma_iov = &tgt, .rma_iov_count = 1,
				   .datatype = FI_UINT64, .op = FI_SUM};
	EXPECT(fi_atomicmsg(a.ep, &am, 0), -FI_EINVAL); /* counts differ */
	tgt.count = 1;
	EXPECT(fi_atomicmsg(a.ep, &am, FI_FENCE), -FI_EBADFLAGS);
	EXPECT(fi_fetch_atomicmsg(a.ep, &am, &rioc, NULL, 1, FI_INJECT), -FI_EBADFLAGS);

	/* The operations. */
	EXPECT(fi_atomic(a.ep, &v, 1, NULL, a.peer, 0, k, FI_UINT64, FI_SUM, (void *)1), 0);
	expect_done(a.cq, FI_ATOMIC | FI_WRITE, (void *)1, "fi_atomic FI_SUM");
	check(words[0] == 15, "10 + 5 = %llu", (unsigned long long)words[0]);
	v = 1;
	EXPECT(fi_fetch_atomic(a.ep, &v, 1, NULL, &res, NULL, a.peer, 0, k, FI_UINT64, FI_SUM, (void *)2), 0);
	expect_done(a.cq, FI_ATOMIC | FI_READ, (void *)2, "fi_fetch_atomic FI_SUM");
	check(res == 15 && words[0] == 16, "fetched %llu, now %llu", (unsigned long long)res,
	      (unsigned long long)words[0]);
	EXPECT(fi_fetch_atomic(a.ep, NULL, 1, NULL, &res, NULL, a.peer, 0, k, FI_UINT64, FI_ATOMIC_READ, (void *)3), 0);
	expect_done(a.cq, FI_ATOMIC | FI_READ, (void *)3, "fi_fetch_atomic FI_ATOMIC_READ");
	check(res == 16 && words[0] == 16, "read %llu", (unsigned long long)res);
	v = 42;
	EXPECT(fi_atomic(a.ep, &v, 1, NULL, a.peer, 8, k, FI_INT64, FI_ATOMIC_WRITE, (void *)4), 0);
	expect_done(a.cq, FI_ATOMIC | FI_WRITE, (void *)4, "fi_atomic FI_ATOMIC_WRITE");
	check(words[1] == 42, "wrote %llu", (unsigned long long)words[1]);
	v = 7, cmp = 42;
	EXPECT(fi_compare_atomic(a.ep, &v, 1, NULL, &cmp, NULL, &res, NULL, a.peer, 8, k, FI_UINT64, FI_CSWAP,
				 (void *)5),
	       0);
	expect_done(a.cq, FI_ATOMIC | FI_READ, (void *)5, "fi_compare_atomic (equal)");
	check(res == 42 && words[1] == 7, "swapped: old %llu, now %llu", (unsigned long long)res,
	      (unsigned long long)words[1]);
	v = 9, cmp = 42;
	EXPECT(fi_compare_atomic(a.ep, &v, 1, NULL, &cmp, NULL, &res, NULL, a.peer, 8, k, FI_UINT64, FI_CSWAP,
				 (void *)6),
	       0);
	expect_done(a.cq, FI_ATOMIC | FI_READ, (void *)6, "fi_compare_atomic (different)");
	check(res == 7 && words[1] == 7, "not swapped: %llu", (unsigned long long)words[1]);
	uint32_t *w32 = (uint32_t *)&words[2], v32 = 0xFFFFFFFFu, r32 = 0;
	w32[0] = 1;
	w32[1] = 0xAAAAAAAAu;
	EXPECT(fi_fetch_atomic(a.ep, &v32, 1, NULL, &r32, NULL, a.peer, 16, k, FI_UINT32, FI_SUM, (void *)7), 0);
	expect_done(a.cq, FI_ATOMIC | FI_READ, (void *)7, "32-bit fetch-add");
	check(r32 == 1 && w32[0] == 0 && w32[1] == 0xAAAAAAAAu, "wraps at 32 bits, the next word untouched");
	ioc = (struct fi_ioc){&v, 1};
	v = 100;
	rioc = (struct fi_ioc){&res, 1};
	tgt = (struct fi_rma_ioc){.addr = 24, .count = 1, .key = k};
	am = (struct fi_msg_atomic){.msg_iov = &ioc, .iov_count = 1, .addr = a.peer, .rma_iov = &tgt,
				    .rma_iov_count = 1, .datatype = FI_UINT64, .op = FI_ATOMIC_WRITE, .context = (void *)8};
	EXPECT(fi_fetch_atomicmsg(a.ep, &am, &rioc, NULL, 1, 0), 0);
	expect_done(a.cq, FI_ATOMIC | FI_READ, (void *)8, "fi_fetch_atomicmsg (swap)");
	check(res == 0 && words[3] == 100, "swapped in %llu", (unsigned long long)words[3]);
	uint64_t before = fi_cntr_read(a.cntr);
	v = 3;
	EXPECT(fi_inject_atomic(a.ep, &v, 1, a.peer, 0, k, FI_UINT64, FI_SUM), 0);
	EXPECT(fi_cntr_wait(a.cntr, before + 1, 10000), 0);
	check(words[0] == 19, "fi_inject_atomic: 16 + 3 = %llu", (unsigned long long)words[0]);

	/* Refusals: error entries, memory unchanged. */
	v = 1;
	EXPECT(fi_atomic(a.ep, &v, 1, NULL, a.peer, 0, k_ro, FI_UINT64, FI_SUM, (void *)9), 0);
	expect_refused(a.cq, FI_ATOMIC | FI_WRITE, (void *)9, "an atomic on a region without FI_REMOTE_WRITE");
	EXPECT(fi_atomic(a.ep, &v, 1, NULL, a.peer, 0, k ^ (1ULL << 50), FI_UINT64, FI_SUM, (void *)10), 0);
	expect_refused(a.cq, FI_ATOMIC | FI_WRITE, (void *)10, "an atomic with a wrong secret");
	EXPECT(fi_fetch_atomic(a.ep, &v, 1, NULL, &res, NULL, a.peer, 64 * 8, k, FI_UINT64, FI_SUM, (void *)11), 0);
	expect_refused(a.cq, FI_ATOMIC | FI_READ, (void *)11, "an atomic past the region's end");
	check(words[0] == 19 && ro[0] == 0, "memory unchanged by the refused atomics");

	EXPECT(fi_close(&mr_w->fid), 0);
	EXPECT(fi_close(&mr_ro->fid), 0);
	close_rside(&a);
	close_rside(&b);
	fi_freeinfo(info);
	free(words);
	free(ro);
}

#define NCOLL 3

struct cside {
	struct fid_domain *dom;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_eq *eq;
	struct fid_av_set *set;
	struct fid_mc *mc;
	fi_addr_t coll;
};

static void open_cside(struct fid_fabric *fabric, struct fi_info *info, struct cside *s, bool with_eq)
{
	struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_FD};
	struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
	struct fi_eq_attr eq_attr = {.size = 8, .wait_obj = FI_WAIT_UNSPEC};
	EXPECT(fi_domain(fabric, info, &s->dom, NULL), 0);
	EXPECT(fi_cq_open(s->dom, &cq_attr, &s->cq, NULL), 0);
	EXPECT(fi_av_open(s->dom, &av_attr, &s->av, NULL), 0);
	EXPECT(fi_endpoint(s->dom, info, &s->ep, NULL), 0);
	EXPECT(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_ep_bind(s->ep, &s->av->fid, 0), 0);
	s->eq = NULL;
	if (with_eq) {
		EXPECT(fi_eq_open(fabric, &eq_attr, &s->eq, NULL), 0);
		EXPECT(fi_ep_bind(s->ep, &s->eq->fid, 0), 0);
	}
	EXPECT(fi_enable(s->ep), 0);
}

static void close_cside(struct cside *s)
{
	EXPECT(fi_close(&s->ep->fid), 0);
	EXPECT(fi_close(&s->cq->fid), 0);
	EXPECT(fi_close(&s->av->fid), 0);
	if (s->eq)
		EXPECT(fi_close(&s->eq->fid), 0);
	EXPECT(fi_close(&s->dom->fid), 0);
}

/* Waits for one entry on each side's CQ: all FI_COLLECTIVE with ctx. */
static void expect_all_done(struct cside *s, void *ctx, const char *what)
{
	int ok = 0;
	for (int i = 0; i < NCOLL; i++) {
		struct fi_cq_tagged_entry e = {0};
		ssize_t r = next_entry(s[i].cq, &e);
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry err = {0};
			fi_cq_readerr(s[i].cq, &err, 0);
			printf("# %s: member %d error %d (%s), prov_errno %d\n", what, i, err.err, fi_strerror(err.err),
			       err.prov_errno);
		}
		ok += r == 1 && e.flags == FI_COLLECTIVE && e.op_context == ctx;
	}
	check(ok == NCOLL, "%s completes at all %d members (%d did)", what, NCOLL, ok);
}

void test_coll(struct fid_fabric *fabric)
{
	struct fi_info *h = rma_hints(FI_MSG | FI_COLLECTIVE), *info = NULL;
	int r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &info);
	fi_freeinfo(h);
	check(r == 0 && info && (info->caps & FI_COLLECTIVE), "fi_getinfo for FI_COLLECTIVE (%d)", r);
	if (r)
		return;
	struct cside s[NCOLL];
	for (int i = 0; i < NCOLL; i++)
		open_cside(fabric, info, &s[i], true);
	char names[NCOLL][64];
	for (int i = 0; i < NCOLL; i++) {
		size_t l = sizeof names[i];
		EXPECT(fi_getname(&s[i].ep->fid, names[i], &l), 0);
	}
	for (int i = 0; i < NCOLL; i++)
		for (int j = 0; j < NCOLL; j++)
			EXPECT(fi_av_insert(s[i].av, names[j], 1, NULL, 0, NULL), 1); /* fi_addr j */

	/* fi_query_collective. */
	struct fi_collective_attr qa = {.op = FI_SUM, .datatype = FI_INT64};
	EXPECT(fi_query_collective(s[0].dom, FI_ALLREDUCE, &qa, 0), 0);
	check(qa.datatype_attr.count >= 64 && qa.datatype_attr.size == 8 && qa.max_members == 64,
	      "allreduce: up to %zu int64 per operation, %zu members", qa.datatype_attr.count, qa.max_members);
	qa = (struct fi_collective_attr){.op = FI_LOR, .datatype = FI_INT64};
	EXPECT(fi_query_collective(s[0].dom, FI_ALLREDUCE, &qa, 0), -FI_EOPNOTSUPP);
	qa = (struct fi_collective_attr){.op = FI_BAND, .datatype = FI_DOUBLE};
	EXPECT(fi_query_collective(s[0].dom, FI_ALLREDUCE, &qa, 0), -FI_EOPNOTSUPP);
	qa = (struct fi_collective_attr){.datatype = FI_UINT8};
	EXPECT(fi_query_collective(s[0].dom, FI_BROADCAST, &qa, 0), 0);
	EXPECT(fi_query_collective(s[0].dom, FI_BARRIER, &qa, 0), 0);
	EXPECT(fi_query_collective(s[0].dom, FI_ALLTOALL, &qa, 0), -FI_EOPNOTSUPP);
	EXPECT(fi_query_collective(s[0].dom, FI_GATHER, &qa, 0), -FI_EOPNOTSUPP);
	EXPECT(fi_query_collective(s[0].dom, FI_BARRIER, NULL, 0), -FI_EINVAL);

	/* AV sets: parameters and set algebra. */
	struct fi_av_set_attr sa = {.count = NCOLL, .start_addr = 0, .end_addr = NCOLL - 1, .stride = 1};
	struct fid_av_set *tmp, *one;
	sa.flags = 1ULL << 3;
	EXPECT(fi_av_set(s[0].av, &sa, &tmp, NULL), -FI_EBADFLAGS);
	sa.flags = 0;
	uint8_t key = 1;
	sa.comm_key_size = 1, sa.comm_key = &key;
	EXPECT(fi_av_set(s[0].av, &sa, &tmp, NULL), -FI_EOPNOTSUPP);
	sa.comm_key_size = 0, sa.comm_key = NULL;
	sa.end_addr = 7;
	EXPECT(fi_av_set(s[0].av, &sa, &tmp, NULL), -FI_EINVAL); /* 3..7 are not in the AV */
	sa.end_addr = NCOLL - 1;
	EXPECT(fi_av_set(s[0].av, &sa, &tmp, NULL), 0);
	sa.start_addr = sa.end_addr = 1;
	EXPECT(fi_av_set(s[0].av, &sa, &one, NULL), 0);
	EXPECT(fi_av_set_insert(tmp, 1), -FI_EALREADY);
	EXPECT(fi_av_set_insert(tmp, 9), -FI_EINVAL);
	EXPECT(fi_av_set_diff(tmp, one), 0);
	EXPECT(fi_av_set_remove(tmp, 1), -FI_ENOENT);
	EXPECT(fi_av_set_union(tmp, one), 0);
	EXPECT(fi_av_set_intersect(tmp, one), 0);
	EXPECT(fi_av_set_remove(tmp, 1), 0);
	fi_addr_t ca = 0;
	EXPECT(fi_av_set_addr(tmp, &ca), 0);
	EXPECT(fi_close(&s[0].av->fid), -FI_EBUSY); /* sets use it */
	EXPECT(fi_join_collective(s[0].ep, ca, tmp, 0, &s[0].mc, NULL), -FI_EINVAL); /* an empty set */
	EXPECT(fi_close(&tmp->fid), 0);
	EXPECT(fi_join_collective(s[0].ep, ca, one, 0, &s[0].mc, NULL), -FI_EINVAL); /* not a member */
	EXPECT(fi_close(&one->fid), 0);

	/* An endpoint without an EQ cannot be told the join completed. */
	struct cside x;
	open_cside(fabric, info, &x, false);
	sa = (struct fi_av_set_attr){.count = NCOLL, .flags = FI_UNIVERSE};
	struct fid_av_set *xs;
	EXPECT(fi_av_insert(x.av, names[0], 1, NULL, 0, NULL), 1);
	size_t xl = sizeof names[0];
	char xn[64];
	EXPECT(fi_getname(&x.ep->fid, xn, &xl), 0);
	EXPECT(fi_av_insert(x.av, xn, 1, NULL, 0, NULL), 1);
	EXPECT(fi_av_set(x.av, &sa, &xs, NULL), 0);
	struct fid_mc *xmc;
	EXPECT(fi_join_collective(x.ep, FI_ADDR_NOTAVAIL, xs, 0, &xmc, NULL), -FI_ENOEQ);
	EXPECT(fi_close(&xs->fid), 0);
	close_cside(&x);

	/* Join: everyone's set is the whole AV, in the same order. Member 0
	 * first finds its EQ full: the join fails and, retried, gets the same
	 * group as the others (the barrier below proves it). */
	for (int i = 0; i < NCOLL; i++) {
		EXPECT(fi_av_set(s[i].av, &sa, &s[i].set, NULL), 0);
		if (i == 0) {
			int filled = 0;
			while (fi_eq_write(s[0].eq, FI_NOTIFY, &filled, sizeof filled, 0) == sizeof filled)
				filled++;
			EXPECT(fi_join_collective(s[0].ep, FI_ADDR_NOTAVAIL, s[0].set, 0, &s[0].mc, NULL), -FI_EAGAIN);
			uint32_t ev;
			int v;
			while (fi_eq_read(s[0].eq, &ev, &v, sizeof v, 0) == sizeof v)
				filled--;
			check(filled == 0, "member 0's EQ drained");
		}
		EXPECT(fi_join_collective(s[i].ep, FI_ADDR_NOTAVAIL, s[i].set, 0, &s[i].mc, (void *)(uintptr_t)(50 + i)),
		       0);
		uint32_t ev = 0;
		struct fi_eq_entry ent = {0};
		ssize_t n = fi_eq_read(s[i].eq, &ev, &ent, sizeof ent, 0);
		check(n == (ssize_t)sizeof ent && ev == FI_JOIN_COMPLETE && ent.fid == &s[i].mc->fid &&
			      ent.context == (void *)(uintptr_t)(50 + i),
		      "member %d: FI_JOIN_COMPLETE on its EQ (%zd, event %u)", i, n, ev);
		s[i].coll = fi_mc_addr(s[i].mc);
	}

	/* Bad parameters. */
	uint64_t v[4] = {0}, res[4] = {0};
	EXPECT(fi_barrier(s[0].ep, 12345, NULL), -FI_EINVAL);
	EXPECT(fi_broadcast(s[0].ep, v, 4, NULL, s[0].coll, 7, FI_UINT64, 0, NULL), -FI_EINVAL); /* root */
	EXPECT(fi_broadcast(s[0].ep, v, 4, NULL, s[0].coll, 0, FI_LONG_DOUBLE, 0, NULL), -FI_EOPNOTSUPP);
	EXPECT(fi_allreduce(s[0].ep, v, 1, NULL, res, NULL, s[0].coll, FI_DOUBLE, FI_BXOR, 0, NULL), -FI_EOPNOTSUPP);
	EXPECT(fi_allreduce(s[0].ep, v, 1, NULL, res, NULL, s[0].coll, FI_INT64, FI_LAND, 0, NULL), -FI_EOPNOTSUPP);
	EXPECT(fi_allreduce(s[0].ep, v, 1 << 20, NULL, res, NULL, s[0].coll, FI_INT64, FI_SUM, 0, NULL), -FI_EMSGSIZE);
	EXPECT(fi_allreduce(s[0].ep, v, 1, NULL, NULL, NULL, s[0].coll, FI_INT64, FI_SUM, 0, NULL), -FI_EINVAL);
	EXPECT(fi_allreduce(s[0].ep, v, 1, NULL, res, NULL, s[0].coll, FI_INT64, FI_SUM, FI_INJECT, NULL),
	       -FI_EBADFLAGS);
	EXPECT(fi_alltoall(s[0].ep, v, 1, NULL, res, NULL, s[0].coll, FI_INT64, 0, NULL), -FI_EOPNOTSUPP);
	EXPECT(fi_allgather(s[0].ep, v, 1, NULL, res, NULL, s[0].coll, FI_INT64, 0, NULL), -FI_EOPNOTSUPP);
	EXPECT(fi_scatter(s[0].ep, v, 1, NULL, res, NULL, s[0].coll, 0, FI_INT64, 0, NULL), -FI_EOPNOTSUPP);

	/* The operations, posted by every member, completed by the NICs. */
	for (int i = 0; i < NCOLL; i++)
		EXPECT(fi_barrier(s[i].ep, s[i].coll, (void *)1), 0);
	expect_all_done(s, (void *)1, "fi_barrier");

	uint64_t bc[NCOLL][4];
	for (int i = 0; i < NCOLL; i++)
		for (int k = 0; k < 4; k++)
			bc[i][k] = i == 1 ? 0xB0B0 + (uint64_t)k : 0;
	for (int i = 0; i < NCOLL; i++)
		EXPECT(fi_broadcast(s[i].ep, bc[i], 4, NULL, s[i].coll, 1, FI_UINT64, 0, (void *)2), 0);
	expect_all_done(s, (void *)2, "fi_broadcast from member 1");
	int same = 1;
	for (int i = 0; i < NCOLL; i++)
		for (int k = 0; k < 4; k++)
			same &= bc[i][k] == 0xB0B0 + (uint64_t)k;
	check(same, "every member has the root's 4 words");

	int64_t in[NCOLL][3], out[NCOLL][3];
	for (int i = 0; i < NCOLL; i++) {
		for (int k = 0; k < 3; k++) {
			in[i][k] = (int64_t)(i + 1) * (k - 1); /* k = 0 negative */
			out[i][k] = 0;
		}
	}
	for (int i = 0; i < NCOLL; i++)
		EXPECT(fi_allreduce(s[i].ep, in[i], 3, NULL, out[i], NULL, s[i].coll, FI_INT64, FI_SUM, 0, (void *)3),
		       0);
	expect_all_done(s, (void *)3, "fi_allreduce FI_SUM int64");
	same = 1;
	for (int i = 0; i < NCOLL; i++)
		same &= out[i][0] == -6 && out[i][1] == 0 && out[i][2] == 6;
	check(same, "every member has the sums (%lld %lld %lld)", (long long)out[0][0], (long long)out[0][1],
	      (long long)out[0][2]);

	double dv[NCOLL], dr[NCOLL];
	for (int i = 0; i < NCOLL; i++)
		dv[i] = 1.5 * i, dr[i] = -1;
	for (int i = 0; i < NCOLL; i++)
		EXPECT(fi_reduce(s[i].ep, &dv[i], 1, NULL, &dr[i], NULL, s[i].coll, 0, FI_DOUBLE, FI_MAX, 0, (void *)4),
		       0);
	expect_all_done(s, (void *)4, "fi_reduce FI_MAX double to member 0");
	check(dr[0] == 3.0 && dr[1] == -1 && dr[2] == -1, "only the root has the maximum (%g)", dr[0]);

	/* Lifecycle: groups before their endpoint, sets before their AV; a
	 * group closed under a collective the others never joined flushes it. */
	EXPECT(fi_close(&s[0].ep->fid), -FI_EBUSY);
	EXPECT(fi_barrier(s[0].ep, s[0].coll, (void *)5), 0);
	EXPECT(fi_close(&s[0].mc->fid), 0);
	struct fi_cq_tagged_entry fe;
	struct fi_cq_err_entry ferr = {0};
	ssize_t fr = next_entry(s[0].cq, &fe);
	ssize_t fre = fr == -FI_EAVAIL ? fi_cq_readerr(s[0].cq, &ferr, 0) : 0;
	check(fr == -FI_EAVAIL && fre == 1 && ferr.err == FI_ECANCELED && ferr.op_context == (void *)5,
	      "the lone barrier is flushed: FI_ECANCELED (ret %zd, err %d, prov_errno %d)", fr, ferr.err,
	      ferr.prov_errno);
	s[0].mc = NULL;
	for (int i = 0; i < NCOLL; i++) {
		if (s[i].mc)
			EXPECT(fi_close(&s[i].mc->fid), 0);
		EXPECT(fi_close(&s[i].set->fid), 0);
	}
	for (int i = 0; i < NCOLL; i++)
		close_cside(&s[i]);
	fi_freeinfo(info);
}
