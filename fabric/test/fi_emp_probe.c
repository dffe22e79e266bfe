/* The provider's unit test program, part: probing unexpected messages with
 * fi_trecvmsg's FI_PEEK, FI_CLAIM and FI_DISCARD (fi_tagged(3)) on two
 * endpoints of one NIC, small and large (rendezvous) messages, and the
 * calls' bad parameters; and the out-of-order tags program through the
 * provider (tag 2 received before tag 1, 64 B and 4 MiB). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_tagged.h>

#include "fi_emp_unit.h"

struct pside {
	struct fid_domain *dom;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_av *av;
	fi_addr_t peer;
};

static void popen_side(struct fid_fabric *fabric, struct fi_info *info, struct pside *s)
{
	struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_FD};
	struct fi_av_attr av_attr = {.type = FI_AV_MAP};
	EXPECT(fi_domain(fabric, info, &s->dom, NULL), 0);
	EXPECT(fi_cq_open(s->dom, &cq_attr, &s->cq, NULL), 0);
	EXPECT(fi_av_open(s->dom, &av_attr, &s->av, NULL), 0);
	EXPECT(fi_endpoint(s->dom, info, &s->ep, NULL), 0);
	EXPECT(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV), 0);
	EXPECT(fi_ep_bind(s->ep, &s->av->fid, 0), 0);
	EXPECT(fi_enable(s->ep), 0);
}

static void pclose_side(struct pside *s)
{
	EXPECT(fi_close(&s->ep->fid), 0);
	EXPECT(fi_close(&s->cq->fid), 0);
	EXPECT(fi_close(&s->av->fid), 0);
	EXPECT(fi_close(&s->dom->fid), 0);
}

int entry_or_error(struct fid_cq *cq, struct fi_cq_tagged_entry *e, fi_addr_t *src, struct fi_cq_err_entry *ee)
{
	for (int i = 0; i < 10000; i++) {
		ssize_t r = fi_cq_readfrom(cq, e, 1, src);
		if (r == 1)
			return 1;
		if (r == -FI_EAVAIL) {
			memset(ee, 0, sizeof *ee);
			return fi_cq_readerr(cq, ee, 0) == 1 ? 0 : -1;
		}
		r = fi_cq_sread(cq, e, 0, NULL, 1);
		(void)r;
	}
	return -1;
}

/* fi_trecvmsg with FI_PEEK | extra: 1 when a message was found (its entry
 * in *e), 0 on the FI_ENOMSG error entry, < 0 otherwise. */
static int peek(struct pside *s, uint64_t tag, uint64_t ignore, uint64_t extra, void *ctx, struct fi_cq_tagged_entry *e,
		fi_addr_t *src)
{
	struct fi_msg_tagged m = {.addr = FI_ADDR_UNSPEC, .tag = tag, .ignore = ignore, .context = ctx};
	ssize_t r = fi_trecvmsg(s->ep, &m, FI_PEEK | extra);
	if (r)
		return (int)r;
	struct fi_cq_err_entry ee;
	int got = entry_or_error(s->cq, e, src, &ee);
	if (got == 0)
		return ee.err == FI_ENOMSG && ee.op_context == ctx ? 0 : -1;
	return got == 1 && e->op_context == ctx ? 1 : -1;
}

/* Peeks until the message is there (it is on its way). */
static int peek_arrived(struct pside *s, uint64_t tag, uint64_t extra, void *ctx, struct fi_cq_tagged_entry *e,
			fi_addr_t *src)
{
	int r = 0;
	for (int i = 0; i < 2000 && r == 0; i++) {
		r = peek(s, tag, 0, extra, ctx, e, src);
		if (r == 0)
			usleep(1000);
	}
	return r;
}

static void fill(char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (char)(i * 13 + seed);
}

/* Posts a send of n bytes with tag from a to b. A small one completes once
 * the receiving NIC holds it, a large one (rendezvous) only once a receive
 * took its data, so its completion is taken later (sent()). */
static void send_one(struct pside *a, const char *buf, size_t n, uint64_t tag)
{
	EXPECT(fi_tsend(a->ep, buf, n, NULL, a->peer, tag, (void *)(uintptr_t)tag), 0);
}

/* The completion of the send with tag, successful. */
static void sent(struct pside *a, size_t n, uint64_t tag)
{
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry ee;
	int r = entry_or_error(a->cq, &e, NULL, &ee);
	check(r == 1 && e.op_context == (void *)(uintptr_t)tag, "%zu B: the send with tag %#llx completed (%d, err %d)", n,
	      (unsigned long long)tag, r, r == 0 ? ee.err : 0);
}

static void probe_size(struct pside *a, struct pside *b, size_t n)
{
	char *sbuf = malloc(n), *rbuf = malloc(n);
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry ee;
	fi_addr_t src = FI_ADDR_NOTAVAIL;
	struct fi_context ctx, ctx2;
	fill(sbuf, n, (unsigned)n);

	/* FI_PEEK: nothing there, then the message's tag, length and source;
	 * it stays for the next probe. */
	EXPECT(peek(b, 0x71, 0, 0, &ctx, &e, NULL), 0);
	send_one(a, sbuf, n, 0x71);
	EXPECT(peek_arrived(b, 0x71, 0, &ctx, &e, &src), 1);
	check(e.len == n && e.tag == 0x71 && (e.flags & FI_RECV) && (e.flags & FI_TAGGED) && src == b->peer,
	      "%zu B: FI_PEEK reports len %zu tag %#llx and the source", n, e.len, (unsigned long long)e.tag);
	EXPECT(peek(b, 0x70, 0x0f, 0, &ctx, &e, NULL), 1); /* ignore bits match it too */
	check(e.tag == 0x71, "%zu B: FI_PEEK with ignore bits finds tag %#llx", n, (unsigned long long)e.tag);

	/* FI_PEEK | FI_CLAIM: the caller's; later probes pass it by; FI_CLAIM
	 * with the same fi_context receives it, once. */
	EXPECT(peek(b, 0x71, 0, FI_CLAIM, &ctx, &e, NULL), 1);
	check(e.len == n && (e.flags & FI_CLAIM), "%zu B: FI_PEEK | FI_CLAIM claimed it", n);
	EXPECT(peek(b, 0x71, 0, 0, &ctx2, &e, NULL), 0);
	memset(&ctx2, 0, sizeof ctx2);
	struct fi_msg_tagged m = {.addr = FI_ADDR_UNSPEC, .tag = 0x71, .context = &ctx2};
	struct iovec iov = {.iov_base = rbuf, .iov_len = n};
	m.msg_iov = &iov;
	m.iov_count = 1;
	EXPECT(fi_trecvmsg(b->ep, &m, FI_CLAIM), -FI_EINVAL); /* ctx2 claimed nothing */
	memset(rbuf, 0, n);
	m.context = &ctx;
	EXPECT(fi_trecvmsg(b->ep, &m, FI_CLAIM), 0);
	check(entry_or_error(b->cq, &e, NULL, &ee) == 1 && e.op_context == &ctx && e.len == n && e.tag == 0x71,
	      "%zu B: FI_CLAIM received the claimed message", n);
	check(!memcmp(sbuf, rbuf, n), "%zu B: claimed data intact", n);
	sent(a, n, 0x71);
	EXPECT(fi_trecvmsg(b->ep, &m, FI_CLAIM), -FI_EINVAL); /* used */

	/* FI_PEEK | FI_DISCARD drops it. */
	send_one(a, sbuf, n, 0x72);
	EXPECT(peek_arrived(b, 0x72, FI_DISCARD, &ctx, &e, NULL), 1);
	check(e.len == n && (e.flags & FI_DISCARD), "%zu B: FI_PEEK | FI_DISCARD found it", n);
	EXPECT(peek(b, 0x72, 0, 0, &ctx, &e, NULL), 0);
	sent(a, n, 0x72);

	/* FI_CLAIM | FI_DISCARD drops a claimed one. */
	send_one(a, sbuf, n, 0x73);
	EXPECT(peek_arrived(b, 0x73, FI_CLAIM, &ctx, &e, NULL), 1);
	m.tag = 0x73;
	m.context = &ctx;
	EXPECT(fi_trecvmsg(b->ep, &m, FI_CLAIM | FI_DISCARD), 0);
	check(entry_or_error(b->cq, &e, NULL, &ee) == 1 && e.op_context == &ctx && e.len == 0,
	      "%zu B: FI_CLAIM | FI_DISCARD completed with no data (len %zu)", n, e.len);
	EXPECT(peek(b, 0x73, 0, 0, &ctx, &e, NULL), 0);
	sent(a, n, 0x73);

	/* Order: two messages with one tag, a claim takes the older. */
	char *sbuf2 = malloc(n); /* a rendezvous send's buffer is read when pulled */
	fill(sbuf, n, 1);
	send_one(a, sbuf, n, 0x74);
	fill(sbuf2, n, 2);
	send_one(a, sbuf2, n, 0x74);
	EXPECT(peek_arrived(b, 0x74, FI_CLAIM, &ctx, &e, NULL), 1);
	m.tag = 0x74;
	m.context = &ctx;
	EXPECT(fi_trecvmsg(b->ep, &m, FI_CLAIM), 0);
	check(entry_or_error(b->cq, &e, NULL, &ee) == 1 && e.len == n, "%zu B: claimed the first of two", n);
	check(!memcmp(sbuf, rbuf, n), "%zu B: the older message's data", n);
	EXPECT(fi_trecv(b->ep, rbuf, n, NULL, FI_ADDR_UNSPEC, 0x74, 0, (void *)0xb4), 0);
	check(entry_or_error(b->cq, &e, NULL, &ee) == 1 && e.op_context == (void *)0xb4, "%zu B: a receive took the second", n);
	check(!memcmp(sbuf2, rbuf, n), "%zu B: the newer message's data", n);
	sent(a, n, 0x74);
	sent(a, n, 0x74);
	free(sbuf);
	free(sbuf2);
	free(rbuf);
}

/* The out-of-order tags program: a sends tag 1 then tag 2, b receives tag
 * 2 first (tag 1 waits on b's NIC as an unexpected message, or as a
 * rendezvous header when large), then tag 1. */
static void out_of_order(struct pside *a, struct pside *b, size_t n)
{
	char *one = malloc(n), *two = malloc(n), *r = malloc(n);
	struct fi_cq_tagged_entry e;
	struct fi_cq_err_entry ee;
	fill(one, n, 11);
	fill(two, n, 22);
	send_one(a, one, n, 1);
	send_one(a, two, n, 2);
	memset(r, 0, n);
	EXPECT(fi_trecv(b->ep, r, n, NULL, FI_ADDR_UNSPEC, 2, 0, (void *)0xb2), 0);
	check(entry_or_error(b->cq, &e, NULL, &ee) == 1 && e.op_context == (void *)0xb2 && e.tag == 2 && e.len == n &&
		      !memcmp(r, two, n),
	      "%zu B out of order: tag 2 received first, data intact", n);
	memset(r, 0, n);
	EXPECT(fi_trecv(b->ep, r, n, NULL, FI_ADDR_UNSPEC, 1, 0, (void *)0xb1), 0);
	check(entry_or_error(b->cq, &e, NULL, &ee) == 1 && e.op_context == (void *)0xb1 && e.tag == 1 && e.len == n &&
		      !memcmp(r, one, n),
	      "%zu B out of order: then tag 1, data intact", n);
	/* Both sends complete, in whichever order. */
	int done = 0;
	for (int i = 0; i < 2; i++)
		done += entry_or_error(a->cq, &e, NULL, &ee) == 1 && (e.op_context == (void *)1 || e.op_context == (void *)2);
	check(done == 2, "%zu B out of order: both sends completed", n);
	free(one);
	free(two);
	free(r);
}

void test_probe(struct fid_fabric *fabric, struct fi_info *info)
{
	struct pside a, b;
	popen_side(fabric, info, &a);
	popen_side(fabric, info, &b);
	char na[64], nb[64];
	size_t la = sizeof na, lb = sizeof nb;
	EXPECT(fi_getname(&a.ep->fid, na, &la), 0);
	EXPECT(fi_getname(&b.ep->fid, nb, &lb), 0);
	EXPECT(fi_av_insert(a.av, nb, 1, &a.peer, 0, NULL), 1);
	EXPECT(fi_av_insert(b.av, na, 1, &b.peer, 0, NULL), 1);

	/* Bad parameters. */
	struct fi_context ctx;
	memset(&ctx, 0, sizeof ctx);
	struct fi_msg_tagged m = {.addr = FI_ADDR_UNSPEC, .tag = 1, .context = &ctx};
	EXPECT(fi_trecvmsg(b.ep, &m, FI_DISCARD), -FI_EINVAL);	/* needs FI_PEEK or FI_CLAIM */
	EXPECT(fi_trecvmsg(b.ep, &m, FI_CLAIM), -FI_EINVAL);	/* nothing claimed with ctx */
	EXPECT(fi_trecvmsg(b.ep, &m, FI_PEEK | FI_CLAIM | FI_DISCARD), -FI_EINVAL);
	EXPECT(fi_trecvmsg(b.ep, &m, FI_PEEK | FI_MULTI_RECV), -FI_EOPNOTSUPP);
	m.context = NULL;
	EXPECT(fi_trecvmsg(b.ep, &m, FI_PEEK | FI_CLAIM), -FI_EINVAL); /* the claim needs an fi_context */
	EXPECT(fi_trecvmsg(b.ep, &m, FI_CLAIM), -FI_EINVAL);
	m.addr = 0x7777777;
	m.context = &ctx;
	EXPECT(fi_trecvmsg(b.ep, &m, FI_PEEK), -FI_EINVAL); /* not in the AV */
	EXPECT(fi_trecvmsg(b.ep, NULL, FI_PEEK), -FI_EINVAL);
	struct fi_cq_tagged_entry e;
	EXPECT(fi_cq_read(b.cq, &e, 1), -FI_EAGAIN); /* refused calls leave no entry */

	probe_size(&a, &b, 64);
	probe_size(&a, &b, 4u << 20);
	out_of_order(&a, &b, 64);
	out_of_order(&a, &b, 4u << 20);
	pclose_side(&a);
	pclose_side(&b);
}
