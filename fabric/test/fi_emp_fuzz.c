/* A seeded fuzzer of the emp libfabric provider's entry points: random
 * calls with random (often invalid) arguments on objects opened, bound,
 * enabled and closed in random orders, plus random traffic between the
 * endpoints it has. It stays inside libfabric's contract for the caller
 * (no freed or garbage pointers: a closed object is never used again,
 * buffers are real) and checks that the provider never crashes or hangs
 * and answers every call with success or a proper -FI_E* code.
 *
 *   fi_emp_fuzz [--seed N] [--calls N]     (defaults: time-based seed, 3000)
 *
 * Needs FI_PROVIDER_PATH and EMP_DEVICE (one NIC; every domain is a port of
 * it). Prints the seed first (rerun with it to reproduce), then
 * "# fuzz: seed S, N calls, M bad returns"; exit status 1 when a return
 * was bad, and a watchdog ends a hung run with status 2. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static uint64_t below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static bool coin(unsigned percent)
{
	return below(100) < percent;
}

static uint64_t ncalls, nbad;
/* How often each return came: [0] successes, [e] -e. */
static uint64_t seen[FI_ERRNO_MAX];
static const char *last_call = "start";

/* A return is proper when it is success (0 or a count) or a negative
 * errno: a POSIX one or a libfabric FI_E* one. */
static void ret_check(const char *call, long r)
{
	ncalls++;
	last_call = call;
	if (r >= 0) {
		seen[0]++;
		return;
	}
	long e = -r;
	if (e < FI_ERRNO_MAX)
		seen[e]++;
	bool posix = e >= 1 && e <= 133;
	bool fabric = e >= FI_ERRNO_OFFSET && e < FI_ERRNO_MAX;
	if (!posix && !fabric) {
		nbad++;
		printf("not ok - %s returned %ld, not an -FI_E* code\n", call, r);
	}
}

#define CALL(expr) ret_check(#expr, (long)(expr))

/* ---- the objects ---------------------------------------------------------- */

#define MAX_DOM 3
#define MAX_PER 3 /* CQs, counters, AVs, MRs, sets per domain */
#define ARENA (2u << 20)

enum { INFO_MSG, INFO_TAGGED, INFO_RMA, INFO_ATOMIC, INFO_COLL, INFO_N };

struct dom {
	struct fid_domain *dom;
	struct fid_ep *ep;
	int ep_info;
	struct fid_cq *cq[MAX_PER];
	struct fid_cntr *cntr[MAX_PER];
	struct fid_av *av[MAX_PER];
	struct fid_mr *mr[MAX_PER];
	struct fid_av_set *set[MAX_PER];
	struct fid_mc *mc[MAX_PER];
	fi_addr_t coll[MAX_PER];
};

static struct fid_fabric *fabric;
static struct fid_eq *eqs[MAX_PER];
static struct fi_info *infos[INFO_N];
static struct dom doms[MAX_DOM];
static char *arena;
static char names[MAX_DOM][64];
static bool named[MAX_DOM];

static uint64_t any_key(void)
{
	for (int tries = 0; tries < 4; tries++) {
		struct dom *d = &doms[below(MAX_DOM)];
		struct fid_mr *mr = d->mr[below(MAX_PER)];
		if (mr && coin(80))
			return fi_mr_key(mr);
	}
	return rnd();
}

static void *any_desc(struct dom *d)
{
	struct fid_mr *mr = d->mr[below(MAX_PER)];
	return mr && coin(50) ? fi_mr_desc(mr) : NULL;
}

/* A buffer in the arena, or NULL now and then; len may pass the arena's
 * end only as far as the arena's slack (never memory we do not own). */
static void *any_buf(size_t *len)
{
	static const size_t sizes[] = {0, 1, 8, 64, 4096, 65536, 65537, 200000, 1u << 20};
	*len = coin(80) ? sizes[below(sizeof sizes / sizeof sizes[0])] : below(ARENA / 2);
	if (coin(3))
		return NULL;
	return arena + below(ARENA / 2);
}

static fi_addr_t any_addr(void)
{
	switch (below(5)) {
	case 0: return FI_ADDR_UNSPEC;
	case 1: return rnd();
	default: return below(4);
	}
}

static uint64_t any_flags(void)
{
	return coin(50) ? 0 : (1ULL << below(64)) | (coin(30) ? (1ULL << below(64)) : 0);
}

/* ---- one random call ------------------------------------------------------ */

static void do_open(struct dom *d)
{
	int i = (int)below(MAX_PER);
	switch (below(7)) {
	case 0:
		if (!d->dom) {
			struct fi_info *fi = infos[below(INFO_N)];
			if (fi)
				CALL(fi_domain(fabric, fi, &d->dom, NULL));
		}
		break;
	case 1:
		if (d->dom && !d->cq[i]) {
			static const enum fi_wait_obj waits[] = {FI_WAIT_NONE, FI_WAIT_UNSPEC, FI_WAIT_FD,
								 FI_WAIT_MUTEX_COND, FI_WAIT_SET, FI_WAIT_POLLFD};
			struct fi_cq_attr a = {.format = (enum fi_cq_format)below(7),
					       .wait_obj = waits[below(6)],
					       .size = coin(70) ? 0 : below(1u << 22),
					       .flags = coin(80) ? 0 : any_flags(),
					       .wait_cond = coin(90) ? FI_CQ_COND_NONE : FI_CQ_COND_THRESHOLD};
			CALL(fi_cq_open(d->dom, &a, &d->cq[i], NULL));
		}
		break;
	case 2:
		if (d->dom && !d->cntr[i]) {
			struct fi_cntr_attr a = {.events = coin(90) ? FI_CNTR_EVENTS_COMP : (enum fi_cntr_events)3,
						 .wait_obj = coin(70) ? FI_WAIT_UNSPEC : (enum fi_wait_obj)below(6),
						 .flags = coin(80) ? 0 : any_flags()};
			CALL(fi_cntr_open(d->dom, &a, &d->cntr[i], NULL));
		}
		break;
	case 3:
		if (d->dom && !d->av[i]) {
			struct fi_av_attr a = {.type = (enum fi_av_type)below(4),
					       .count = coin(80) ? 0 : below(1u << 26),
					       .flags = coin(80) ? 0 : any_flags(),
					       .rx_ctx_bits = coin(90) ? 0 : (int)below(8)};
			CALL(fi_av_open(d->dom, &a, &d->av[i], NULL));
		}
		break;
	case 4:
		if (d->dom && !d->mr[i]) {
			size_t len;
			void *buf = any_buf(&len);
			uint64_t access = coin(80) ? (FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE) &
							 rnd()
						   : rnd();
			CALL(fi_mr_reg(d->dom, buf, len, access, 0, rnd(), coin(80) ? 0 : any_flags(), &d->mr[i], NULL));
		}
		break;
	case 5:
		if (d->dom && !d->ep) {
			int which = (int)below(INFO_N);
			struct fi_info *fi = infos[which] ? fi_dupinfo(infos[which]) : NULL;
			if (!fi)
				break;
			if (coin(10))
				fi->caps |= 1ULL << below(64);
			if (coin(10))
				fi->tx_attr->op_flags |= 1ULL << below(64);
			if (coin(5))
				fi->ep_attr->type = (enum fi_ep_type)below(5);
			CALL(fi_endpoint(d->dom, fi, &d->ep, NULL));
			if (d->ep)
				d->ep_info = which;
			fi_freeinfo(fi);
		}
		break;
	case 6:
		if (!eqs[i]) {
			struct fi_eq_attr a = {.size = coin(80) ? below(64) : below(1u << 20),
					       .wait_obj = coin(80) ? FI_WAIT_UNSPEC : (enum fi_wait_obj)below(6),
					       .flags = coin(80) ? 0 : any_flags()};
			CALL(fi_eq_open(fabric, &a, &eqs[i], NULL));
		}
		break;
	}
}

static void do_bind(struct dom *d)
{
	if (!d->ep)
		return;
	int i = (int)below(MAX_PER);
	uint64_t fl = coin(70) ? (uint64_t[]){FI_TRANSMIT, FI_RECV, FI_TRANSMIT | FI_RECV, FI_SEND, FI_READ | FI_WRITE,
					       FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION}[below(6)]
			       : any_flags();
	switch (below(5)) {
	case 0:
		if (d->cq[i])
			CALL(fi_ep_bind(d->ep, &d->cq[i]->fid, fl));
		break;
	case 1:
		if (d->cntr[i])
			CALL(fi_ep_bind(d->ep, &d->cntr[i]->fid, fl));
		break;
	case 2:
		if (d->av[i])
			CALL(fi_ep_bind(d->ep, &d->av[i]->fid, coin(80) ? 0 : fl));
		break;
	case 3:
		if (eqs[i])
			CALL(fi_ep_bind(d->ep, &eqs[i]->fid, coin(80) ? 0 : fl));
		break;
	case 4:
		CALL(fi_enable(d->ep));
		break;
	}
}

static void do_av(struct dom *d)
{
	struct fid_av *av = d->av[below(MAX_PER)];
	if (!av)
		return;
	fi_addr_t out[4];
	switch (below(6)) {
	case 0: {
		int peer = (int)below(MAX_DOM);
		if (!named[peer] && doms[peer].ep) {
			size_t l = sizeof names[peer];
			CALL(fi_getname(&doms[peer].ep->fid, names[peer], &l));
			named[peer] = true;
		}
		if (named[peer])
			CALL(fi_av_insert(av, names[peer], 1, coin(80) ? out : NULL, coin(90) ? 0 : any_flags(), NULL));
		break;
	}
	case 1: {
		char junk[32];
		for (size_t k = 0; k < sizeof junk; k++)
			junk[k] = (char)rnd();
		CALL(fi_av_insert(av, junk, below(4), out, 0, NULL));
		break;
	}
	case 2: {
		fi_addr_t a = any_addr();
		CALL(fi_av_remove(av, &a, 1, coin(90) ? 0 : any_flags()));
		break;
	}
	case 3: {
		char buf[64];
		size_t l = below(sizeof buf);
		CALL(fi_av_lookup(av, any_addr(), buf, &l));
		break;
	}
	case 4: {
		int i = (int)below(MAX_PER);
		if (d->set[i]) {
			switch (below(4)) {
			case 0: CALL(fi_av_set_insert(d->set[i], any_addr())); break;
			case 1: CALL(fi_av_set_remove(d->set[i], any_addr())); break;
			case 2: {
				struct fid_av_set *o = d->set[below(MAX_PER)];
				if (o)
					CALL(fi_av_set_union(d->set[i], o));
				break;
			}
			default: {
				fi_addr_t ca;
				CALL(fi_av_set_addr(d->set[i], &ca));
			}
			}
		} else {
			struct fi_av_set_attr a = {.count = below(80),
						   .start_addr = coin(20) ? FI_ADDR_NOTAVAIL : below(3),
						   .end_addr = below(4),
						   .stride = below(3),
						   .flags = coin(50) ? FI_UNIVERSE : (coin(80) ? 0 : any_flags())};
			CALL(fi_av_set(av, &a, &d->set[i], NULL));
		}
		break;
	}
	case 5: {
		int i = (int)below(MAX_PER);
		if (d->ep && d->set[i] && !d->mc[i]) {
			CALL(fi_join_collective(d->ep, FI_ADDR_NOTAVAIL, d->set[i], coin(90) ? 0 : any_flags(), &d->mc[i],
						NULL));
			if (d->mc[i])
				d->coll[i] = fi_mc_addr(d->mc[i]);
		}
		break;
	}
	}
}

static void do_transfer(struct dom *d)
{
	if (!d->ep)
		return;
	size_t len;
	void *buf = any_buf(&len);
	void *desc = any_desc(d);
	void *ctx = (void *)(uintptr_t)below(1000);
	uint64_t fl = coin(70) ? 0 : (coin(50) ? FI_COMPLETION : any_flags());
	struct iovec iov = {buf, len};
	switch (below(16)) {
	case 0: CALL(fi_send(d->ep, buf, len, desc, any_addr(), ctx)); break;
	case 1: CALL(fi_recv(d->ep, buf, len, desc, any_addr(), ctx)); break;
	case 2: CALL(fi_tsend(d->ep, buf, len, desc, any_addr(), rnd() >> below(64), ctx)); break;
	case 3: CALL(fi_trecv(d->ep, buf, len, desc, any_addr(), below(8), coin(50) ? 0 : rnd(), ctx)); break;
	case 4: CALL(fi_inject(d->ep, buf, len, any_addr())); break;
	case 5: {
		struct fi_msg_tagged m = {.msg_iov = &iov, .desc = &desc, .iov_count = below(3), .addr = any_addr(),
					  .tag = below(8), .ignore = coin(50) ? 0 : rnd(), .context = ctx};
		if (coin(50))
			CALL(fi_tsendmsg(d->ep, &m, fl));
		else
			CALL(fi_trecvmsg(d->ep, &m, fl));
		break;
	}
	case 6: CALL(fi_write(d->ep, buf, len, desc, any_addr(), below(1u << 21), any_key(), ctx)); break;
	case 7: CALL(fi_read(d->ep, buf, len, desc, any_addr(), below(1u << 21), any_key(), ctx)); break;
	case 8: CALL(fi_writedata(d->ep, buf, len, desc, coin(80) ? below(1u << 31) : rnd(), any_addr(), below(4096),
				  any_key(), ctx));
		break;
	case 9: CALL(fi_inject_write(d->ep, buf, len, any_addr(), below(4096), any_key())); break;
	case 10: {
		struct fi_rma_iov r = {.addr = below(4096), .len = coin(80) ? len : below(4096), .key = any_key()};
		struct fi_msg_rma m = {.msg_iov = &iov, .desc = &desc, .iov_count = below(3), .addr = any_addr(),
				       .rma_iov = &r, .rma_iov_count = below(3), .context = ctx, .data = rnd()};
		if (coin(50))
			CALL(fi_writemsg(d->ep, &m, fl));
		else
			CALL(fi_readmsg(d->ep, &m, fl));
		break;
	}
	case 11: {
		uint64_t v = rnd(), c = rnd(), *res = (uint64_t *)(arena + ARENA - 64);
		enum fi_datatype t = (enum fi_datatype)below(FI_DATATYPE_LAST + 2);
		enum fi_op op = (enum fi_op)below(FI_ATOMIC_OP_LAST + 2);
		size_t cnt = coin(80) ? 1 : below(4);
		uint64_t addr = coin(80) ? 8 * below(512) : rnd();
		switch (below(3)) {
		case 0: CALL(fi_atomic(d->ep, &v, cnt, NULL, any_addr(), addr, any_key(), t, op, ctx)); break;
		case 1:
			CALL(fi_fetch_atomic(d->ep, &v, cnt, NULL, res, NULL, any_addr(), addr, any_key(), t, op, ctx));
			break;
		default:
			CALL(fi_compare_atomic(d->ep, &v, cnt, NULL, &c, NULL, res, NULL, any_addr(), addr, any_key(), t,
					       op, ctx));
		}
		size_t n;
		CALL(fi_atomicvalid(d->ep, t, op, &n));
		CALL(fi_fetch_atomicvalid(d->ep, t, op, &n));
		CALL(fi_compare_atomicvalid(d->ep, t, op, &n));
		break;
	}
	case 12: {
		int i = (int)below(MAX_PER);
		fi_addr_t coll = d->mc[i] && coin(80) ? d->coll[i] : rnd();
		char *res = arena + ARENA - 16384;
		enum fi_datatype t = coin(80) ? (enum fi_datatype)(FI_INT32 + below(6)) : (enum fi_datatype)rnd();
		enum fi_op op = (enum fi_op)below(FI_ATOMIC_OP_LAST + 1);
		/* Counts the arena holds (buf has 1 MiB after it), or ones far
		 * past any limit, refused before memory is touched. */
		size_t cnt = coin(80) ? below(64) : coin(50) ? below(1u << 17) : SIZE_MAX / 2;
		switch (below(5)) {
		case 0: CALL(fi_barrier(d->ep, coll, ctx)); break;
		case 1: CALL(fi_broadcast(d->ep, buf, cnt, desc, coll, any_addr(), t, fl, ctx)); break;
		case 2: CALL(fi_allreduce(d->ep, buf, cnt, desc, res, NULL, coll, t, op, fl, ctx)); break;
		case 3: CALL(fi_reduce(d->ep, buf, cnt, desc, res, NULL, coll, any_addr(), t, op, fl, ctx)); break;
		default: CALL(fi_alltoall(d->ep, buf, cnt, desc, res, NULL, coll, t, fl, ctx));
		}
		break;
	}
	case 13: CALL(fi_cancel(&d->ep->fid, ctx)); break;
	case 14: {
		size_t v = 0, l = coin(80) ? sizeof v : below(16);
		if (coin(50))
			CALL(fi_getopt(&d->ep->fid, (int)below(3), (int)below(8), &v, &l));
		else
			CALL(fi_setopt(&d->ep->fid, (int)below(3), (int)below(8), &v, l));
		break;
	}
	default: {
		uint64_t f = coin(50) ? FI_TRANSMIT : FI_RECV;
		f |= coin(20) ? any_flags() : 0;
		CALL(fi_control(&d->ep->fid, coin(50) ? FI_GETOPSFLAG : (int)below(40), &f));
	}
	}
}

static void do_poll(struct dom *d)
{
	struct fi_cq_tagged_entry e[4];
	struct fi_cq_err_entry err = {0};
	fi_addr_t src[4];
	int i = (int)below(MAX_PER);
	switch (below(6)) {
	case 0:
		if (d->cq[i])
			CALL(fi_cq_read(d->cq[i], e, coin(90) ? 1 + below(4) : 0));
		break;
	case 1:
		if (d->cq[i])
			CALL(fi_cq_readfrom(d->cq[i], e, 1 + below(4), src));
		break;
	case 2:
		if (d->cq[i])
			CALL(fi_cq_readerr(d->cq[i], &err, coin(90) ? 0 : any_flags()));
		break;
	case 3:
		if (d->cq[i])
			CALL(fi_cq_sread(d->cq[i], e, 1, NULL, (int)below(3)));
		break;
	case 4:
		if (d->cntr[i]) {
			ncalls++;
			(void)fi_cntr_read(d->cntr[i]);
			(void)fi_cntr_readerr(d->cntr[i]);
			CALL(fi_cntr_wait(d->cntr[i], fi_cntr_read(d->cntr[i]) + below(2), (int)below(3)));
			if (coin(20))
				CALL(fi_cntr_add(d->cntr[i], below(3)));
		}
		break;
	default:
		if (eqs[i]) {
			uint32_t ev;
			char b[256]; /* more than any length passed below */
			if (coin(30))
				CALL(fi_eq_write(eqs[i], FI_NOTIFY, b, below(200), coin(90) ? 0 : any_flags()));
			CALL(fi_eq_read(eqs[i], &ev, b, coin(80) ? sizeof b : below(sizeof b), 0));
		}
	}
}

static void do_info(void)
{
	struct fi_info *h = fi_allocinfo(), *out = NULL;
	h->caps = coin(50) ? (FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_COLLECTIVE) & rnd() : rnd();
	h->mode = coin(80) ? 0 : rnd();
	h->ep_attr->type = (enum fi_ep_type)below(5);
	h->domain_attr->mr_mode = coin(50) ? (int)(rnd() & 0x3FFF) : FI_MR_PROV_KEY | FI_MR_LOCAL;
	h->domain_attr->cq_data_size = below(10);
	h->domain_attr->threading = (enum fi_threading)below(7);
	h->domain_attr->av_type = (enum fi_av_type)below(4);
	h->tx_attr->op_flags = coin(70) ? 0 : any_flags();
	h->tx_attr->rma_iov_limit = below(3);
	h->tx_attr->size = coin(80) ? 0 : rnd() >> below(64);
	h->ep_attr->mem_tag_format = coin(80) ? 0 : rnd();
	h->fabric_attr->prov_name = strdup("emp");
	CALL(fi_getinfo(FI_VERSION(1, (int)below(19)), coin(10) ? "fi_emp://1:2" : NULL, NULL, coin(90) ? 0 : FI_SOURCE,
			h, &out));
	fi_freeinfo(out);
	fi_freeinfo(h);
	struct dom *d = &doms[below(MAX_DOM)];
	if (d->dom) {
		struct fi_atomic_attr aa;
		struct fi_collective_attr ca = {.op = (enum fi_op)below(20), .datatype = (enum fi_datatype)below(16)};
		CALL(fi_query_atomic(d->dom, (enum fi_datatype)below(16), (enum fi_op)below(20), &aa,
				     coin(70) ? 0 : any_flags()));
		CALL(fi_query_collective(d->dom, (enum fi_collective_op)below(11), &ca, coin(80) ? 0 : any_flags()));
	}
}

/* Closes one object; a refusal (-FI_EBUSY: still in use) keeps it. */
static void close_obj(struct fid **p)
{
	if (!*p)
		return;
	int r = fi_close(*p);
	ret_check("fi_close", r);
	if (r == 0)
		*p = NULL;
}

static void do_close(struct dom *d)
{
	int i = (int)below(MAX_PER);
	switch (below(9)) {
	case 0: close_obj((struct fid **)&d->cq[i]); break;
	case 1: close_obj((struct fid **)&d->cntr[i]); break;
	case 2: close_obj((struct fid **)&d->av[i]); break;
	case 3: close_obj((struct fid **)&d->mr[i]); break;
	case 4: close_obj((struct fid **)&d->set[i]); break;
	case 5: close_obj((struct fid **)&d->mc[i]); break;
	case 6:
		close_obj((struct fid **)&d->ep);
		if (!d->ep)
			named[d - doms] = false;
		break;
	case 7: close_obj((struct fid **)&d->dom); break;
	default: close_obj((struct fid **)&eqs[i]);
	}
}

/* Closes everything, children first; what still refuses is reported. */
static int close_all(void)
{
	int left = 0;
	for (int d = 0; d < MAX_DOM; d++) {
		struct dom *x = &doms[d];
		for (int i = 0; i < MAX_PER; i++)
			close_obj((struct fid **)&x->mc[i]);
		close_obj((struct fid **)&x->ep);
		for (int i = 0; i < MAX_PER; i++) {
			close_obj((struct fid **)&x->set[i]);
			close_obj((struct fid **)&x->cq[i]);
			close_obj((struct fid **)&x->cntr[i]);
			close_obj((struct fid **)&x->mr[i]);
		}
		for (int i = 0; i < MAX_PER; i++)
			close_obj((struct fid **)&x->av[i]);
		close_obj((struct fid **)&x->dom);
		left += x->dom != NULL;
	}
	for (int i = 0; i < MAX_PER; i++) {
		close_obj((struct fid **)&eqs[i]);
		left += eqs[i] != NULL;
	}
	return left;
}

static void watchdog(int sig)
{
	(void)sig;
	static const char m[] = "not ok - the fuzzer hung (watchdog)\n";
	ssize_t w = write(1, m, sizeof m - 1);
	(void)w;
	_exit(2);
}

static struct fi_info *get_info(uint64_t caps)
{
	struct fi_info *h = fi_allocinfo(), *out = NULL;
	h->caps = caps;
	h->ep_attr->type = FI_EP_RDM;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	h->fabric_attr->prov_name = strdup("emp");
	int r = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &out);
	fi_freeinfo(h);
	return r ? NULL : out;
}

int main(int argc, char **argv)
{
	uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	uint64_t calls = 3000;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--seed"))
			seed = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--calls"))
			calls = strtoull(argv[i + 1], NULL, 0);
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("# fi_emp_fuzz --seed %" PRIu64 " --calls %" PRIu64 "\n", seed, calls);
	rng_state = seed ? seed : 1;
	signal(SIGALRM, watchdog);
	arena = aligned_alloc(4096, ARENA + 4096);
	if (!arena)
		return 3;
	memset(arena, 0, ARENA + 4096);
	static const uint64_t caps[INFO_N] = {FI_MSG, FI_TAGGED, FI_MSG | FI_RMA, FI_ATOMIC, FI_MSG | FI_COLLECTIVE};
	for (int i = 0; i < INFO_N; i++)
		infos[i] = get_info(caps[i]);
	if (!infos[INFO_TAGGED] || fi_fabric(infos[INFO_TAGGED]->fabric_attr, &fabric, NULL)) {
		printf("not ok - no emp provider (FI_PROVIDER_PATH, EMP_DEVICE?)\n");
		return 3;
	}
	for (uint64_t n = 0; n < calls; n++) {
		alarm(60); /* one call, or one step's calls, never takes this long */
		struct dom *d = &doms[below(MAX_DOM)];
		switch (below(20)) {
		case 0 ... 3: do_open(d); break;
		case 4 ... 6: do_bind(d); break;
		case 7 ... 8: do_av(d); break;
		case 9 ... 14: do_transfer(d); break;
		case 15 ... 17: do_poll(d); break;
		case 18: do_info(); break;
		default:
			if (coin(40))
				do_close(d);
		}
	}
	alarm(120);
	int left = close_all();
	alarm(0);
	if (left)
		printf("not ok - %d objects still refuse to close after their children closed\n", left);
	CALL(fi_close(&fabric->fid));
	for (int i = 0; i < INFO_N; i++)
		fi_freeinfo(infos[i]);
	free(arena);
	printf("# returns: %" PRIu64 " successes", seen[0]);
	for (int e = 1; e < FI_ERRNO_MAX; e++)
		if (seen[e])
			printf(", %" PRIu64 " %s", seen[e], fi_strerror(e));
	printf("\n");
	printf("# fuzz: seed %" PRIu64 ", %" PRIu64 " calls, %" PRIu64 " bad returns, last %s\n", seed, ncalls, nbad,
	       last_call);
	return nbad || left ? 1 : 0;
}
