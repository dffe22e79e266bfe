/* libemp-fi.so, the libfabric provider "emp": FI_ATOMIC on the NIC's
 * atomics (emp_post_atomic_fetch_add / _cmp_swap / _swap). See emp_fi.h
 * and fabric/README.md.
 *
 * The target's NIC runs one operation on one naturally aligned 4- or
 * 8-byte word: so count is 1, the types are FI_INT32, FI_UINT32, FI_INT64
 * and FI_UINT64, and the operations those NIC primitives give exactly:
 *   fi_atomic        FI_SUM (fetch-add), FI_ATOMIC_WRITE (swap)
 *   fi_fetch_atomic  FI_SUM, FI_ATOMIC_WRITE, FI_ATOMIC_READ (fetch-add 0)
 *   fi_compare_atomic FI_CSWAP (compare-and-swap)
 * Everything else is -FI_EOPNOTSUPP, in the *valid calls and
 * fi_query_atomic as in the operations. Keys and addresses are RMA's (a
 * 64-bit key = the region's key and secret, addresses are offsets); the
 * region needs FI_REMOTE_WRITE (which registers it for remote atomics). */

#include "emp_fi.h"

enum at_kind { AT_WRITE, AT_FETCH, AT_COMPARE };

static size_t at_width(enum fi_datatype t)
{
	switch (t) {
	case FI_INT32:
	case FI_UINT32: return 4;
	case FI_INT64:
	case FI_UINT64: return 8;
	default: return 0;
	}
}

int atomic_valid(enum fi_datatype t, enum fi_op o, int kind, size_t *count)
{
	if (!at_width(t))
		return -FI_EOPNOTSUPP;
	bool ok;
	switch ((enum at_kind)kind) {
	case AT_WRITE: ok = o == FI_SUM || o == FI_ATOMIC_WRITE; break;
	case AT_FETCH: ok = o == FI_SUM || o == FI_ATOMIC_WRITE || o == FI_ATOMIC_READ; break;
	case AT_COMPARE: ok = o == FI_CSWAP; break;
	default: ok = false;
	}
	if (!ok)
		return -FI_EOPNOTSUPP;
	if (count)
		*count = 1;
	return 0;
}

/* One word's operand as the NIC takes it: the low `width` bytes. */
static uint64_t load_word(const void *p, size_t width)
{
	if (width == 4) {
		uint32_t v;
		memcpy(&v, p, 4);
		return v;
	}
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

static ssize_t at_post(struct emp_fi_ep *ep, enum at_kind kind, const void *buf, size_t count, const void *compare,
		       void *result, fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype t, enum fi_op op,
		       void *context, uint64_t flags, bool inject)
{
	struct emp_fi_domain *dom = ep->dom;
	uint64_t dir = kind == AT_WRITE ? FI_WRITE : FI_READ;
	if (!(ep->caps & FI_ATOMIC) || !(ep->caps & dir))
		return -FI_EOPNOTSUPP;
	if (!ep->enabled)
		return -FI_EOPBADSTATE;
	if (flags & ~(uint64_t)(FI_COMPLETION | FI_INJECT | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE |
				FI_DELIVERY_COMPLETE | FI_MORE))
		return -FI_EBADFLAGS;
	int v = atomic_valid(t, op, kind, NULL);
	if (v)
		return v;
	size_t width = at_width(t);
	if (count != 1)
		return -FI_EINVAL; /* the NIC runs one word per operation */
	if ((op != FI_ATOMIC_READ && !buf) || (kind == AT_COMPARE && !compare) || (kind != AT_WRITE && !result))
		return -FI_EINVAL;
	if (addr % width)
		return -FI_EINVAL; /* naturally aligned words only */
	uint64_t operand = op == FI_ATOMIC_READ ? 0 : load_word(buf, width);
	uint64_t cmp = kind == AT_COMPARE ? load_word(compare, width) : 0;
	struct emp_remote_word at = {
		.key = (uint32_t)key, .width = (uint32_t)width, .offset = addr, .secret = (uint32_t)(key >> 32)};
	uint16_t node, port;
	pthread_mutex_lock(&dom->lock);
	ssize_t ret = av_resolve(ep->av, dest, &node, &port);
	if (ret)
		goto out;
	struct emp_req *r;
	ret = tx_req_get(ep, inject, flags, context, FI_ATOMIC | dir, &r);
	if (ret)
		goto out;
	/* The NIC writes the old value to a result word in a bounce slot; the
	 * completion carries it too, and that goes to the caller's result. */
	r->buf = result;
	r->len = kind == AT_WRITE ? 0 : width;
	r->result_from_tag = kind != AT_WRITE;
	struct emp_sge res;
	uint64_t scratch = 0;
	int n = place(dom, r, &scratch, width, NULL, false, true, &res);
	if (n < 0) {
		ret = n;
		r->ep = NULL;
		req_release(dom, r);
		goto out;
	}
	uint64_t wr = (uint64_t)(uintptr_t)r;
	int p;
	if (kind == AT_COMPARE)
		p = emp_post_atomic_cmp_swap(dom->dev, wr, node, port, &at, cmp, operand, &res);
	else if (op == FI_ATOMIC_WRITE)
		p = emp_post_atomic_swap(dom->dev, wr, node, port, &at, operand, &res);
	else
		p = emp_post_atomic_fetch_add(dom->dev, wr, node, port, &at, operand, &res);
	ret = post_errno(p);
	if (ret) {
		r->ep = NULL;
		req_release(dom, r);
		goto out;
	}
	tx_req_posted(r, inject);
out:
	pthread_mutex_unlock(&dom->lock);
	return ret;
}

/* An ioc list as one word: count 1 in one entry (iov_limit 1). */
static int one_ioc(const struct fi_ioc *ioc, size_t n, const void **buf, size_t *count)
{
	if (n != 1 || !ioc)
		return -FI_EINVAL;
	*buf = ioc[0].addr;
	*count = ioc[0].count;
	return 0;
}

/* A message's target: one rma_ioc whose count matches the local one. */
static int msg_target(const struct fi_msg_atomic *m, const void **buf, size_t *count)
{
	if (!m || m->rma_iov_count != 1 || !m->rma_iov)
		return -FI_EINVAL;
	int r = one_ioc(m->msg_iov, m->iov_count, buf, count);
	if (!r && m->rma_iov[0].count != *count)
		r = -FI_EINVAL;
	return r;
}

static ssize_t at_write(struct fid_ep *ep, const void *buf, size_t count, void *desc, fi_addr_t dest, uint64_t addr,
			uint64_t key, enum fi_datatype t, enum fi_op op, void *context)
{
	(void)desc;
	return at_post(EP(ep), AT_WRITE, buf, count, NULL, NULL, dest, addr, key, t, op, context, EP(ep)->tx_op_flags,
		       false);
}

static ssize_t at_writev(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t n, fi_addr_t dest,
			 uint64_t addr, uint64_t key, enum fi_datatype t, enum fi_op op, void *context)
{
	(void)desc;
	const void *b;
	size_t c;
	int r = one_ioc(iov, n, &b, &c);
	return r ? r
		 : at_post(EP(ep), AT_WRITE, b, c, NULL, NULL, dest, addr, key, t, op, context, EP(ep)->tx_op_flags,
			   false);
}

static ssize_t at_writemsg(struct fid_ep *ep, const struct fi_msg_atomic *m, uint64_t flags)
{
	const void *b;
	size_t c;
	int r = msg_target(m, &b, &c);
	return r ? r
		 : at_post(EP(ep), AT_WRITE, b, c, NULL, NULL, m->addr, m->rma_iov[0].addr, m->rma_iov[0].key,
			   m->datatype, m->op, m->context, flags, flags & FI_INJECT);
}

static ssize_t at_inject(struct fid_ep *ep, const void *buf, size_t count, fi_addr_t dest, uint64_t addr,
			 uint64_t key, enum fi_datatype t, enum fi_op op)
{
	return at_post(EP(ep), AT_WRITE, buf, count, NULL, NULL, dest, addr, key, t, op, NULL, 0, true);
}

static ssize_t at_rw(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result, void *rdesc,
		     fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype t, enum fi_op op, void *context)
{
	(void)desc, (void)rdesc;
	return at_post(EP(ep), AT_FETCH, buf, count, NULL, result, dest, addr, key, t, op, context,
		       EP(ep)->tx_op_flags, false);
}

static ssize_t at_rwv(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t n, struct fi_ioc *res,
		      void **rdesc, size_t rn, fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype t,
		      enum fi_op op, void *context)
{
	(void)desc, (void)rdesc;
	const void *b, *rb;
	size_t c, rc;
	int r = one_ioc(iov, n, &b, &c);
	if (!r)
		r = one_ioc(res, rn, &rb, &rc);
	if (!r && rc != c)
		r = -FI_EINVAL;
	return r ? r
		 : at_post(EP(ep), AT_FETCH, b, c, NULL, (void *)rb, dest, addr, key, t, op, context,
			   EP(ep)->tx_op_flags, false);
}

static ssize_t at_rwmsg(struct fid_ep *ep, const struct fi_msg_atomic *m, struct fi_ioc *res, void **rdesc,
			size_t rn, uint64_t flags)
{
	(void)rdesc;
	const void *b, *rb;
	size_t c, rc;
	int r = msg_target(m, &b, &c);
	if (!r)
		r = one_ioc(res, rn, &rb, &rc);
	if (!r && rc != c)
		r = -FI_EINVAL;
	if (!r && (flags & FI_INJECT))
		r = -FI_EBADFLAGS; /* a fetch has a result to report */
	return r ? r
		 : at_post(EP(ep), AT_FETCH, b, c, NULL, (void *)rb, m->addr, m->rma_iov[0].addr, m->rma_iov[0].key,
			   m->datatype, m->op, m->context, flags, false);
}

static ssize_t at_cw(struct fid_ep *ep, const void *buf, size_t count, void *desc, const void *compare, void *cdesc,
		     void *result, void *rdesc, fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype t,
		     enum fi_op op, void *context)
{
	(void)desc, (void)cdesc, (void)rdesc;
	return at_post(EP(ep), AT_COMPARE, buf, count, compare, result, dest, addr, key, t, op, context,
		       EP(ep)->tx_op_flags, false);
}

static ssize_t at_cwv(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t n, const struct fi_ioc *cmp,
		      void **cdesc, size_t cn, struct fi_ioc *res, void **rdesc, size_t rn, fi_addr_t dest,
		      uint64_t addr, uint64_t key, enum fi_datatype t, enum fi_op op, void *context)
{
	(void)desc, (void)cdesc, (void)rdesc;
	const void *b, *cb, *rb;
	size_t c, cc, rc;
	int r = one_ioc(iov, n, &b, &c);
	if (!r)
		r = one_ioc(cmp, cn, &cb, &cc);
	if (!r)
		r = one_ioc(res, rn, &rb, &rc);
	if (!r && (cc != c || rc != c))
		r = -FI_EINVAL;
	return r ? r
		 : at_post(EP(ep), AT_COMPARE, b, c, cb, (void *)rb, dest, addr, key, t, op, context,
			   EP(ep)->tx_op_flags, false);
}

static ssize_t at_cwmsg(struct fid_ep *ep, const struct fi_msg_atomic *m, const struct fi_ioc *cmp, void **cdesc,
			size_t cn, struct fi_ioc *res, void **rdesc, size_t rn, uint64_t flags)
{
	(void)cdesc, (void)rdesc;
	const void *b, *cb, *rb;
	size_t c, cc, rc;
	int r = msg_target(m, &b, &c);
	if (!r)
		r = one_ioc(cmp, cn, &cb, &cc);
	if (!r)
		r = one_ioc(res, rn, &rb, &rc);
	if (!r && (cc != c || rc != c))
		r = -FI_EINVAL;
	if (!r && (flags & FI_INJECT))
		r = -FI_EBADFLAGS;
	return r ? r
		 : at_post(EP(ep), AT_COMPARE, b, c, cb, (void *)rb, m->addr, m->rma_iov[0].addr, m->rma_iov[0].key,
			   m->datatype, m->op, m->context, flags, false);
}

/* The *valid calls answer for this endpoint: without FI_ATOMIC, nothing. */
static int at_valid_kind(struct fid_ep *ep, enum fi_datatype t, enum fi_op o, size_t *count, enum at_kind kind)
{
	if (!count)
		return -FI_EINVAL;
	if (!(EP(ep)->caps & FI_ATOMIC))
		return -FI_EOPNOTSUPP;
	return atomic_valid(t, o, kind, count);
}

static int at_writevalid(struct fid_ep *ep, enum fi_datatype t, enum fi_op o, size_t *count)
{
	return at_valid_kind(ep, t, o, count, AT_WRITE);
}

static int at_readwritevalid(struct fid_ep *ep, enum fi_datatype t, enum fi_op o, size_t *count)
{
	return at_valid_kind(ep, t, o, count, AT_FETCH);
}

static int at_compwritevalid(struct fid_ep *ep, enum fi_datatype t, enum fi_op o, size_t *count)
{
	return at_valid_kind(ep, t, o, count, AT_COMPARE);
}

struct fi_ops_atomic atomic_ops = {
	.size = sizeof(struct fi_ops_atomic),
	.write = at_write,
	.writev = at_writev,
	.writemsg = at_writemsg,
	.inject = at_inject,
	.readwrite = at_rw,
	.readwritev = at_rwv,
	.readwritemsg = at_rwmsg,
	.compwrite = at_cw,
	.compwritev = at_cwv,
	.compwritemsg = at_cwmsg,
	.writevalid = at_writevalid,
	.readwritevalid = at_readwritevalid,
	.compwritevalid = at_compwritevalid,
};
