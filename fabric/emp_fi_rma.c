/* libemp-fi.so, the libfabric provider "emp": FI_RMA on EMP's remote write
 * and read (emp_post_write / emp_post_write_imm / emp_post_read). See
 * emp_fi.h and fabric/README.md.
 *
 * Key model: an MR's 64-bit key (fi_mr_key) is EMP's remote key, the
 * region's 32-bit key and its 32-bit secret; remote addresses are offsets
 * into the region (FI_MR_PROV_KEY, no FI_MR_VIRT_ADDR). The target's NIC
 * checks key, secret, rights (FI_REMOTE_READ / FI_REMOTE_WRITE) and bounds
 * and refuses with an error completion here, leaving its memory as it was. */

#include "emp_fi.h"

#define RMA_INJECT 1u	/* copy the data now (fi_inject_write*, FI_INJECT) */
#define RMA_NO_ENTRY 2u /* never a success entry (fi_inject_write*) */

/* Remote CQ data needs the target's pool of receives, which only an
 * endpoint without FI_TAGGED keeps (emp_fi.h says why). */
bool rma_cq_data_ok(uint64_t caps)
{
	return (caps & FI_RMA) && !(caps & FI_TAGGED);
}

/* Remote CQ data on this endpoint: messages carry it as EMP immediate
 * data (emp_post_send_imm), writes as above; an endpoint with FI_RMA and
 * FI_TAGGED has it for neither (cq_data_size is one number). */
bool cq_data_ok(uint64_t caps)
{
	return rma_cq_data_ok(caps) || ((caps & (FI_MSG | FI_TAGGED)) && !(caps & FI_RMA));
}

static ssize_t rma_post(struct emp_fi_ep *ep, bool write, void *buf, size_t len, void *desc, fi_addr_t dest,
			uint64_t addr, uint64_t key, void *context, uint64_t flags, uint64_t data, unsigned how)
{
	struct emp_fi_domain *dom = ep->dom;
	if (!(ep->caps & FI_RMA) || !(ep->caps & (write ? FI_WRITE : FI_READ)))
		return -FI_EOPNOTSUPP;
	if (!ep->enabled)
		return -FI_EOPBADSTATE;
	if ((flags & ~(uint64_t)EMP_RMA_FLAGS) || (!write && (flags & (FI_INJECT | FI_REMOTE_CQ_DATA))))
		return -FI_EBADFLAGS;
	if (flags & FI_REMOTE_CQ_DATA) {
		if (!rma_cq_data_ok(ep->caps))
			return -FI_EOPNOTSUPP;
		if (data & ~IMM_DATA_MASK)
			return -FI_EINVAL; /* cq_data_size is 4 */
	}
	if (flags & FI_INJECT)
		how |= RMA_INJECT;
	if (len && !buf)
		return -FI_EINVAL;
	if (len > dom->pi.msg_max || len > UINT32_MAX)
		return -FI_EMSGSIZE;
	if ((how & RMA_INJECT) && len > INJECT_SIZE)
		return -FI_EMSGSIZE;
	if (addr + len < addr)
		return -FI_EINVAL;
	uint16_t node, port;
	pthread_mutex_lock(&dom->lock);
	ssize_t ret = av_resolve(ep->av, dest, &node, &port);
	if (ret)
		goto out;
	struct emp_req *r;
	ret = tx_req_get(ep, (how & RMA_NO_ENTRY), flags, context, FI_RMA | (write ? FI_WRITE : FI_READ), &r);
	if (ret)
		goto out;
	r->copy_out = !write;
	r->buf = buf;
	r->len = len;
	struct emp_sge sge = {0};
	int n = place(dom, r, buf, len, desc, write, how & RMA_INJECT, &sge);
	if (n < 0) {
		ret = n;
		r->ep = NULL; /* never counted as in flight */
		req_release(dom, r);
		goto out;
	}
	uint64_t wr = (uint64_t)(uintptr_t)r;
	int p;
	if (!write)
		p = emp_post_read(dom->dev, wr, node, port, &sge, (size_t)n, key, addr);
	else if (flags & FI_REMOTE_CQ_DATA)
		p = emp_post_write_imm(dom->dev, wr, node, port, &sge, (size_t)n, key, addr, IMM_TAG_BIT | data);
	else
		p = emp_post_write(dom->dev, wr, node, port, &sge, (size_t)n, key, addr);
	ret = post_errno(p);
	if (ret) {
		r->ep = NULL;
		req_release(dom, r);
		goto out;
	}
	tx_req_posted(r, (how & RMA_NO_ENTRY));
out:
	pthread_mutex_unlock(&dom->lock);
	return ret;
}

/* iov_limit and rma_iov_limit are 1. */
static int rma_one_iov(const struct iovec *iov, void **desc, size_t count, void **buf, size_t *len, void **d)
{
	if (count > 1 || (count && !iov))
		return -FI_EINVAL;
	*buf = count ? iov[0].iov_base : NULL;
	*len = count ? iov[0].iov_len : 0;
	*d = count && desc ? desc[0] : NULL;
	return 0;
}

static ssize_t rma_msg(struct emp_fi_ep *ep, bool write, const struct fi_msg_rma *m, uint64_t flags)
{
	void *b, *d;
	size_t l;
	if (!m || m->rma_iov_count != 1 || !m->rma_iov)
		return -FI_EINVAL;
	int r = rma_one_iov(m->msg_iov, m->desc, m->iov_count, &b, &l, &d);
	if (r)
		return r;
	if (m->rma_iov[0].len != l)
		return -FI_EINVAL; /* EMP moves one contiguous range each way */
	return rma_post(ep, write, b, l, d, m->addr, m->rma_iov[0].addr, m->rma_iov[0].key, m->context, flags,
			m->data, 0);
}

static ssize_t rma_read(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t addr,
			uint64_t key, void *context)
{
	return rma_post(EP(ep), false, buf, len, desc, src, addr, key, context, EP(ep)->tx_op_flags, 0, 0);
}

static ssize_t rma_readv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src,
			 uint64_t addr, uint64_t key, void *context)
{
	void *b, *d;
	size_t l;
	int r = rma_one_iov(iov, desc, count, &b, &l, &d);
	return r ? r : rma_post(EP(ep), false, b, l, d, src, addr, key, context, EP(ep)->tx_op_flags, 0, 0);
}

static ssize_t rma_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags)
{
	return rma_msg(EP(ep), false, msg, flags);
}

static ssize_t rma_write(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t addr,
			 uint64_t key, void *context)
{
	return rma_post(EP(ep), true, (void *)buf, len, desc, dest, addr, key, context,
			EP(ep)->tx_op_flags & ~(uint64_t)FI_REMOTE_CQ_DATA, 0, 0);
}

static ssize_t rma_writev(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest,
			  uint64_t addr, uint64_t key, void *context)
{
	void *b, *d;
	size_t l;
	int r = rma_one_iov(iov, desc, count, &b, &l, &d);
	return r ? r
		 : rma_post(EP(ep), true, b, l, d, dest, addr, key, context,
			    EP(ep)->tx_op_flags & ~(uint64_t)FI_REMOTE_CQ_DATA, 0, 0);
}

static ssize_t rma_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags)
{
	return rma_msg(EP(ep), true, msg, flags);
}

static ssize_t rma_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest, uint64_t addr,
			  uint64_t key)
{
	return rma_post(EP(ep), true, (void *)buf, len, NULL, dest, addr, key, NULL, 0, 0, RMA_INJECT | RMA_NO_ENTRY);
}

static ssize_t rma_writedata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
			     fi_addr_t dest, uint64_t addr, uint64_t key, void *context)
{
	return rma_post(EP(ep), true, (void *)buf, len, desc, dest, addr, key, context,
			EP(ep)->tx_op_flags | FI_REMOTE_CQ_DATA, data, 0);
}

static ssize_t rma_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest,
			      uint64_t addr, uint64_t key)
{
	return rma_post(EP(ep), true, (void *)buf, len, NULL, dest, addr, key, NULL, FI_REMOTE_CQ_DATA, data,
			RMA_INJECT | RMA_NO_ENTRY);
}

struct fi_ops_rma rma_ops = {
	.size = sizeof(struct fi_ops_rma),
	.read = rma_read,
	.readv = rma_readv,
	.readmsg = rma_readmsg,
	.write = rma_write,
	.writev = rma_writev,
	.writemsg = rma_writemsg,
	.inject = rma_inject,
	.writedata = rma_writedata,
	.injectdata = rma_injectdata,
};

/* ---- the target's receives for remote CQ data ------------------------- */

/* Keeps the endpoint's pool of receives for writes with remote CQ data
 * posted: at most IMM_POOL_MAX, a quarter of its receive budget and of its
 * receive CQ (each holds a CQ slot for its entry). A write with data waits
 * at the initiator's NIC while none is posted. Called with the domain
 * lock; 0 or a negative error. */
int imm_pool_fill(struct emp_fi_ep *ep)
{
	struct emp_fi_domain *dom = ep->dom;
	struct emp_fi_cq *cq = ep->rx_cq;
	if (!rma_cq_data_ok(ep->caps) || !(ep->caps & FI_REMOTE_WRITE) || !cq)
		return 0;
	size_t want = IMM_POOL_MAX;
	if (want > ep->rx_size / 4)
		want = ep->rx_size / 4;
	if (want > cq->size / 4)
		want = cq->size / 4;
	while (ep->imm_posted < want && ep->rx_inflight < ep->rx_size && cq->count + cq->reserved < cq->size) {
		struct emp_req *r = req_get(dom);
		if (!r)
			return ep->imm_posted ? 0 : -FI_ENOMEM;
		r->kind = REQ_RECV;
		r->ep = ep;
		r->imm_pool = true;
		r->cq_flags = FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA;
		r->want_entry = true;
		struct emp_sge none = {0};
		int p = emp_post_recv(dom->dev, (uint64_t)(uintptr_t)r, EMP_ANY_NODE, EMP_ANY_PORT, IMM_TAG_BIT,
				      IMM_DATA_MASK, &none, 0);
		if (p < 0) {
			r->ep = NULL;
			req_release(dom, r);
			/* A full ring refills on the next completion. */
			return (p == -EAGAIN || p == -ENOBUFS || ep->imm_posted) ? 0 : p;
		}
		ep->rx_inflight++;
		ep->imm_posted++;
		cq->reserved++;
		r->cq_reserved = true;
	}
	return 0;
}

/* A write with remote CQ data landed (or the pool receive was flushed):
 * an entry for the target's receive CQ, then a fresh receive. */
void imm_complete(struct emp_fi_domain *dom, struct emp_req *r, const struct emp_wc *wc)
{
	struct emp_fi_ep *ep = r->ep;
	ep->imm_posted--;
	if (wc->status != EMP_WC_FLUSHED && r->cq_reserved && ep->rx_cq) {
		bool ok = wc->status == EMP_WC_SUCCESS || wc->status == EMP_WC_TRUNCATED;
		struct cq_ent e = {
			.flags = r->cq_flags,
			.len = wc->msg_len,
			.src = FI_ADDR_NOTAVAIL,
			.err = ok ? 0 : status_errno(wc->status),
			.prov_errno = (int)wc->status,
			.data = wc->tag & IMM_DATA_MASK,
		};
		if (ep->caps & FI_SOURCE)
			e.src = av_reverse(ep->av, ep_code(wc->src_node, wc->src_port));
		cq_push(ep->rx_cq, &e);
		ep->rx_cq->reserved--;
		r->cq_reserved = false;
	}
	bool flushed = wc->status == EMP_WC_FLUSHED;
	req_release(dom, r);
	if (!flushed && ep->enabled)
		imm_pool_fill(ep);
}
