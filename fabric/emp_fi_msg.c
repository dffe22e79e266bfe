/* libemp-fi.so, the libfabric provider "emp": data transfer: FI_MSG and
 * FI_TAGGED sends and receives. See emp_fi.h and fabric/README.md. */

#include "emp_fi.h"

/* ---- data transfer ------------------------------------------------------------ */

/* Where the NIC reads or writes [buf, buf+len): the caller's registration
 * (desc), a bounce slot, the registration cache's entry, or a registration
 * for this operation alone. */
int place(struct emp_fi_domain *dom, struct emp_req *r, const void *buf, size_t len, void *desc, bool copy_in,
	  bool force_bounce, struct emp_sge *sge)
{
	if (!len)
		return 0;
	if (desc && !force_bounce) {
		const struct emp_fi_mr *mr = desc;
		uintptr_t a = (uintptr_t)buf;
		if (mr->mr.fid.fclass != FI_CLASS_MR || mr->dom != dom || a < mr->addr || a + len > mr->addr + mr->len)
			return -FI_EINVAL;
		*sge = (struct emp_sge){(uint32_t)mr->mr.key, (uint32_t)len, a - mr->addr};
		return 1;
	}
	if (len <= BOUNCE_SIZE) {
		int slot = slot_get(dom, 1);
		if (slot < 0)
			return -FI_EAGAIN;
		r->slot = slot;
		r->nslot = 1;
		if (copy_in)
			memcpy(slot_ptr(dom, slot), buf, len);
		*sge = slot_sge(dom, slot, len);
		return 1;
	}
	/* A run of slots: one copy by the host each way, and none of the
	 * NIC's page walks (process_vm_readv/writev per frame) of memory
	 * registered for this operation. None free: registered instead,
	 * never waiting for one (a run can be held by a send whose receiver
	 * has not posted yet). */
	size_t n = (len + BOUNCE_SIZE - 1) / BOUNCE_SIZE;
	if (!force_bounce && len <= BOUNCE_RUN_MAX && dom->run_slots_max) {
		int slot = dom->run_slots + n <= dom->run_slots_max ? slot_get(dom, n) : -1;
		if (slot >= 0) {
			r->slot = slot;
			r->nslot = (unsigned)n;
			dom->run_slots += n;
			dom->runs++;
			if (copy_in)
				memcpy(slot_ptr(dom, slot), buf, len);
			*sge = slot_sge(dom, slot, len);
			return 1;
		}
		dom->run_fallbacks++;
	}
	uint32_t cached_key;
	int ent = mrc_get(dom, buf, len, &cached_key);
	if (ent >= 0) {
		r->mrc_ent = ent;
		*sge = (struct emp_sge){cached_key, (uint32_t)len, mrc_offset(dom, ent, buf)};
		return 1;
	}
	uint32_t access = copy_in ? EMP_ACCESS_LOCAL_READ : EMP_ACCESS_LOCAL_WRITE;
	int64_t key = emp_reg_mr(dom->dev, buf, len, access);
	if (key < 0)
		return (int)key;
	r->tmp_key = key;
	*sge = (struct emp_sge){(uint32_t)key, (uint32_t)len, 0};
	return 1;
}

#define SEND_INJECT 1u	   /* copy the data now (fi_inject, FI_INJECT) */
#define SEND_NO_ENTRY 2u   /* never a success entry (fi_inject) */

/* A send; with FI_REMOTE_CQ_DATA in flags, `data` rides along as EMP
 * immediate data and the receiver's completion reports it. */
static ssize_t do_send(struct emp_fi_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t tag,
		       bool tagged, void *context, uint64_t flags, uint64_t data, unsigned how)
{
	struct emp_fi_domain *dom = ep->dom;
	if (!(ep->caps & (tagged ? FI_TAGGED : FI_MSG)))
		return -FI_EOPNOTSUPP;
	if (!ep->enabled)
		return -FI_EOPBADSTATE;
	if (flags & (FI_DELIVERY_COMPLETE | FI_MATCH_COMPLETE | FI_FENCE | FI_MULTICAST))
		return -FI_EBADFLAGS;
	if ((flags & FI_REMOTE_CQ_DATA) && !cq_data_ok(ep->caps))
		return -FI_EOPNOTSUPP; /* cq_data_size 0: FI_RMA with FI_TAGGED */
	if ((flags & FI_REMOTE_CQ_DATA) && data > IMM_DATA_MASK)
		return -FI_EINVAL; /* cq_data_size is 4 */
	if (len && !buf)
		return -FI_EINVAL;
	if (len > dom->pi.msg_max || len > UINT32_MAX)
		return -FI_EMSGSIZE;
	if ((how & SEND_INJECT) && len > INJECT_SIZE)
		return -FI_EMSGSIZE;
	uint64_t emp_tag = tagged ? tag : (ep->msg_and_tagged ? MSG_TAG_BIT : 0);
	if (tagged && ep->msg_and_tagged && (tag & MSG_TAG_BIT))
		return -FI_EINVAL;
	uint16_t node, port;
	pthread_mutex_lock(&dom->lock);
	ssize_t ret = av_resolve(ep->av, dest, &node, &port);
	if (ret)
		goto out;
	struct emp_req *r;
	ret = tx_req_get(ep, (how & SEND_NO_ENTRY), flags, context, FI_SEND | (tagged ? FI_TAGGED : FI_MSG), &r);
	if (ret)
		goto out;
	r->buf = (void *)buf;
	r->len = len;
	struct emp_sge sge;
	int n = place(dom, r, buf, len, desc, true, how & SEND_INJECT, &sge);
	if (n < 0) {
		ret = n;
		r->ep = NULL; /* never counted as in flight */
		req_release(dom, r);
		goto out;
	}
	if (flags & FI_REMOTE_CQ_DATA)
		ret = post_errno(emp_post_send_imm(dom->dev, (uint64_t)(uintptr_t)r, node, port, emp_tag, &sge, (size_t)n,
						   (uint32_t)data));
	else
		ret = post_errno(emp_post_send(dom->dev, (uint64_t)(uintptr_t)r, node, port, emp_tag, &sge, (size_t)n));
	if (ret) {
		r->ep = NULL;
		req_release(dom, r);
		goto out;
	}
	tx_req_posted(r, (how & SEND_NO_ENTRY));
out:
	pthread_mutex_unlock(&dom->lock);
	return ret;
}

static bool orphan_matches(const struct emp_req *o, uint16_t node, uint16_t port, uint64_t tag, uint64_t ignore)
{
	if (((o->got_tag ^ tag) & ~ignore) != 0)
		return false;
	return node == EMP_ANY_NODE || (o->src_node == node && o->src_port == port);
}

/* Where an orphan's bytes are: its bounce slot, or a copy of a message
 * that had landed in the caller's memory (orphan_swap). */
const char *orphan_bytes(struct emp_fi_domain *dom, const struct emp_req *o)
{
	return o->heap ? o->heap : slot_ptr(dom, o->slot);
}

/* The oldest orphan of l's endpoint that l matches, or NULL. */
static struct emp_req **orphan_for(struct emp_fi_domain *dom, const struct emp_req *l)
{
	for (struct emp_req **p = &dom->orphans; *p; p = &(*p)->next)
		if ((*p)->ep == l->ep && orphan_matches(*p, l->want_node, l->want_port, l->want_tag, l->want_ignore))
			return p;
	return NULL;
}

/* Receive l completes with orphan o's message (its bytes copied into l's
 * buffer, truncation reported as an error entry). */
static void orphan_deliver(struct emp_fi_domain *dom, const struct emp_req *o, struct emp_req *l)
{
	size_t n = o->got_len < l->len ? o->got_len : l->len;
	if (n)
		memcpy(l->buf, orphan_bytes(dom, o), n);
	l->got_data = o->got_data;
	l->data = o->data;
	bool trunc = o->msg_len > l->len;
	req_report(l, trunc ? FI_ETRUNC : 0, n, trunc ? o->msg_len - n : 0, o->got_tag, o->src_node, o->src_port,
		   trunc ? EMP_WC_TRUNCATED : EMP_WC_SUCCESS);
}

/* Live receive l, placed in the caller's memory, completed with a message
 * while an older message it matches waits as an orphan (orphans_rehome
 * could not give it to l): l gets the orphan, as the NIC would have
 * matched them, and l's own message becomes an orphan, copied out of the
 * caller's memory, for the next matching receive. False (l completes as
 * it is) when there is no such orphan or no request to hold the copy. */
bool orphan_swap(struct emp_fi_domain *dom, struct emp_req *l, const struct emp_wc_ex *wcx)
{
	const struct emp_wc *wc = &wcx->wc;
	if (!l->matchable || l->cancelled || !l->ep ||
	    (wc->status != EMP_WC_SUCCESS && wc->status != EMP_WC_TRUNCATED))
		return false;
	struct emp_req **p = orphan_for(dom, l);
	if (!p)
		return false;
	struct emp_req *n = req_get(dom);
	if (!n)
		return false;
	size_t got = wc->byte_len < l->len ? wc->byte_len : l->len;
	const char *src = l->slot >= 0 ? slot_ptr(dom, l->slot) : l->buf;
	n->heap = malloc(got ? got : 1);
	if (!n->heap) {
		req_release(dom, n);
		return false;
	}
	memcpy(n->heap, src, got);
	n->kind = REQ_RECV;
	n->ep = l->ep;
	n->ep->rx_inflight++; /* an orphan holds a receive, as a canceled one did */
	n->cancelled = true;
	n->got_len = got;
	n->msg_len = wc->msg_len > wc->byte_len ? wc->msg_len : wc->byte_len;
	n->got_tag = wc->tag;
	n->src_node = wc->src_node;
	n->src_port = wc->src_port;
	n->got_data = l->got_data;
	n->data = l->data;
	struct emp_req *o = *p;
	*p = o->next;
	struct emp_req **tail = &dom->orphans;
	while (*tail)
		tail = &(*tail)->next;
	n->next = NULL;
	*tail = n;
	orphan_deliver(dom, o, l);
	req_release(dom, o);
	req_release(dom, l);
	orphans_rehome(dom);
	return true;
}

/* Live receive l takes orphan o's message: l completes with it now and
 * stays on the NIC as a canceled receive, whose next message becomes an
 * orphan in turn. */
static void orphan_to_live(struct emp_fi_domain *dom, struct emp_req *o, struct emp_req *l)
{
	orphan_deliver(dom, o, l);
	l->cancelled = true;
	dom->zombies++;
	req_release(dom, o);
}

/* A canceled receive the NIC still held took a message that a receive
 * posted after it also matches (MPI_Cancel of an MPI_ANY_SOURCE receive,
 * then the next message): that live receive, already on the NIC, would
 * never see the orphan. Each orphan, oldest first, goes to the oldest live
 * receive it matches, when that one's bytes land in a bounce slot (or
 * nowhere); one placed in the caller's memory cannot be retired: the orphan waits, and
 * goes to it when it completes (orphan_swap). Domain lock held. */
void orphans_rehome(struct emp_fi_domain *dom)
{
	for (struct emp_req **p = &dom->orphans; *p;) {
		struct emp_req *o = *p, *oldest = NULL;
		for (size_t i = 0; i < dom->nreqs; i++) {
			struct emp_req *q = &dom->reqs[i];
			if (!q->in_use || !q->matchable || q->cancelled || q->ep != o->ep ||
			    !orphan_matches(o, q->want_node, q->want_port, q->want_tag, q->want_ignore))
				continue;
			if (!oldest || q->post_seq < oldest->post_seq)
				oldest = q;
		}
		if (!oldest || (oldest->slot < 0 && oldest->len)) {
			p = &o->next;
			continue;
		}
		*p = o->next;
		orphan_to_live(dom, o, oldest);
	}
}

/* The claim made with context, or NULL. */
static struct emp_fi_claim *claim_find(struct emp_fi_domain *dom, const struct emp_fi_ep *ep, const void *context)
{
	for (size_t i = 0; i < dom->nclaims; i++)
		if (dom->claims[i].context == context && dom->claims[i].ep == ep)
			return &dom->claims[i];
	return NULL;
}

static void claim_drop(struct emp_fi_domain *dom, struct emp_fi_claim *c)
{
	*c = dom->claims[--dom->nclaims];
}

static ssize_t do_recv(struct emp_fi_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag,
		       uint64_t ignore, bool tagged, void *context, uint64_t flags, const struct emp_probed *claimed)
{
	struct emp_fi_domain *dom = ep->dom;
	if (!(ep->caps & (tagged ? FI_TAGGED : FI_MSG)))
		return -FI_EOPNOTSUPP;
	if (!ep->enabled)
		return -FI_EOPBADSTATE;
	if (flags & FI_MULTI_RECV)
		return -FI_EOPNOTSUPP;
	if ((flags & (FI_PEEK | FI_CLAIM | FI_DISCARD)) && !claimed)
		return -FI_EOPNOTSUPP; /* probing: fi_trecvmsg only (tag_peek, tag_claimed) */
	if (len && !buf)
		return -FI_EINVAL;
	if (len > UINT32_MAX)
		return -FI_EMSGSIZE;
	uint64_t emp_tag = tag, emp_ignore = ignore;
	if (!tagged) {
		emp_tag = ep->msg_and_tagged ? MSG_TAG_BIT : 0;
		emp_ignore = 0;
	} else if (ep->msg_and_tagged) {
		if (tag & MSG_TAG_BIT)
			return -FI_EINVAL;
		emp_ignore &= ~MSG_TAG_BIT;
	}
	uint16_t node = EMP_ANY_NODE, port = EMP_ANY_PORT;
	pthread_mutex_lock(&dom->lock);
	ssize_t ret = 0;
	if ((ep->caps & FI_DIRECTED_RECV) && src != FI_ADDR_UNSPEC) {
		ret = av_resolve(ep->av, src, &node, &port);
		if (ret)
			goto out;
	}
	if (ep->rx_inflight >= ep->rx_size)
		progress(dom);
	struct emp_fi_cq *cq = ep->rx_cq;
	if (ep->rx_inflight >= ep->rx_size || (cq && cq->count + cq->reserved >= cq->size)) {
		ret = -FI_EAGAIN;
		goto out;
	}
	/* A message that landed in a canceled receive goes to the first
	 * receive that matches it. */
	if (dom->zombies)
		progress(dom);
	for (struct emp_req **p = &dom->orphans; *p && !claimed; p = &(*p)->next) {
		struct emp_req *o = *p;
		if (o->ep != ep || !orphan_matches(o, node, port, emp_tag, emp_ignore))
			continue;
		*p = o->next;
		size_t n = o->got_len < len ? o->got_len : len;
		if (n)
			memcpy(buf, orphan_bytes(dom, o), n);
		o->context = context;
		o->cq_flags = FI_RECV | (tagged ? FI_TAGGED : FI_MSG);
		o->want_entry = !ep->rx_selective || (flags & FI_COMPLETION);
		o->cancelled = false;
		if (cq) {
			cq->reserved++;
			o->cq_reserved = true;
		}
		bool trunc = o->msg_len > len;
		req_report(o, trunc ? FI_ETRUNC : 0, n, trunc ? o->msg_len - n : 0, o->got_tag, o->src_node,
			   o->src_port, trunc ? EMP_WC_TRUNCATED : EMP_WC_SUCCESS);
		req_release(dom, o);
		goto out;
	}
	struct emp_req *r = req_get(dom);
	if (!r) {
		ret = -FI_EAGAIN;
		goto out;
	}
	r->kind = REQ_RECV;
	r->ep = ep;
	r->context = context;
	r->cq_flags = FI_RECV | (tagged ? FI_TAGGED : FI_MSG);
	r->want_entry = !ep->rx_selective || (flags & FI_COMPLETION);
	r->discard = claimed && (flags & FI_DISCARD);
	r->buf = buf;
	r->len = len;
	struct emp_sge sge;
	int n = place(dom, r, buf, len, desc, false, false, &sge);
	if (n < 0) {
		ret = n;
		r->ep = NULL; /* never counted as in flight */
		req_release(dom, r);
		goto out;
	}
	if (claimed)
		ret = post_errno(emp_post_recv_claimed(dom->dev, (uint64_t)(uintptr_t)r, claimed, &sge, (size_t)n));
	else
		ret = post_errno(emp_post_recv(dom->dev, (uint64_t)(uintptr_t)r, node, port, emp_tag, emp_ignore,
					       &sge, (size_t)n));
	if (ret) {
		r->ep = NULL;
		req_release(dom, r);
		goto out;
	}
	ep->rx_inflight++;
	if (cq) {
		cq->reserved++;
		r->cq_reserved = true;
	}
	if (!claimed) {
		r->matchable = true;
		r->want_node = node;
		r->want_port = port;
		r->want_tag = emp_tag;
		r->want_ignore = emp_ignore;
		r->post_seq = dom->recv_seq++;
	}
out:
	pthread_mutex_unlock(&dom->lock);
	return ret;
}

static int one_iov(const struct iovec *iov, void **desc, size_t count, void **buf, size_t *len, void **d)
{
	if (count > 1)
		return -FI_EINVAL; /* iov_limit is 1 */
	if (count == 1 && !iov)
		return -FI_EINVAL;
	*buf = count ? iov[0].iov_base : NULL;
	*len = count ? iov[0].iov_len : 0;
	*d = (count && desc) ? desc[0] : NULL;
	return 0;
}

static ssize_t msg_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, void *context)
{
	return do_recv(EP(ep), buf, len, desc, src, 0, 0, false, context, EP(ep)->rx_op_flags, NULL);
}

static ssize_t msg_recvv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src,
			 void *context)
{
	void *b, *d;
	size_t l;
	int r = one_iov(iov, desc, count, &b, &l, &d);
	return r ? r : do_recv(EP(ep), b, l, d, src, 0, 0, false, context, EP(ep)->rx_op_flags, NULL);
}

static ssize_t msg_recvmsg(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags)
{
	void *b, *d;
	size_t l;
	if (!msg)
		return -FI_EINVAL;
	int r = one_iov(msg->msg_iov, msg->desc, msg->iov_count, &b, &l, &d);
	return r ? r : do_recv(EP(ep), b, l, d, msg->addr, 0, 0, false, msg->context, flags, NULL);
}

static ssize_t msg_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, void *context)
{
	return do_send(EP(ep), buf, len, desc, dest, 0, false, context, EP(ep)->tx_op_flags, 0, 0);
}

static ssize_t msg_sendv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest,
			 void *context)
{
	void *b, *d;
	size_t l;
	int r = one_iov(iov, desc, count, &b, &l, &d);
	return r ? r : do_send(EP(ep), b, l, d, dest, 0, false, context, EP(ep)->tx_op_flags, 0, 0);
}

static ssize_t msg_sendmsg(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags)
{
	void *b, *d;
	size_t l;
	if (!msg)
		return -FI_EINVAL;
	int r = one_iov(msg->msg_iov, msg->desc, msg->iov_count, &b, &l, &d);
	return r ? r
		 : do_send(EP(ep), b, l, d, msg->addr, 0, false, msg->context, flags, msg->data,
			   (flags & FI_INJECT) ? SEND_INJECT : 0);
}

static ssize_t msg_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest)
{
	return do_send(EP(ep), buf, len, NULL, dest, 0, false, NULL, 0, 0, SEND_INJECT | SEND_NO_ENTRY);
}

static ssize_t msg_senddata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
			    fi_addr_t dest, void *context)
{
	return do_send(EP(ep), buf, len, desc, dest, 0, false, context, EP(ep)->tx_op_flags | FI_REMOTE_CQ_DATA, data,
		       0);
}

static ssize_t msg_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest)
{
	return do_send(EP(ep), buf, len, NULL, dest, 0, false, NULL, FI_REMOTE_CQ_DATA, data,
		       SEND_INJECT | SEND_NO_ENTRY);
}

struct fi_ops_msg msg_ops = {
	.size = sizeof(struct fi_ops_msg),
	.recv = msg_recv,
	.recvv = msg_recvv,
	.recvmsg = msg_recvmsg,
	.send = msg_send,
	.sendv = msg_sendv,
	.sendmsg = msg_sendmsg,
	.inject = msg_inject,
	.senddata = msg_senddata,
	.injectdata = msg_injectdata,
};

static ssize_t tag_recv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag,
			uint64_t ignore, void *context)
{
	return do_recv(EP(ep), buf, len, desc, src, tag, ignore, true, context, EP(ep)->rx_op_flags, NULL);
}

static ssize_t tag_recvv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src,
			 uint64_t tag, uint64_t ignore, void *context)
{
	void *b, *d;
	size_t l;
	int r = one_iov(iov, desc, count, &b, &l, &d);
	return r ? r : do_recv(EP(ep), b, l, d, src, tag, ignore, true, context, EP(ep)->rx_op_flags, NULL);
}

/* ---- probing unexpected messages: FI_PEEK, FI_CLAIM, FI_DISCARD ---- */

/* Queues a peek's answer: the message's length, tag and source, or an
 * FI_ENOMSG error entry. The caller checked there is room. */
static void peek_report(struct emp_fi_ep *ep, void *context, uint64_t flags, bool found, size_t len, uint64_t tag,
			uint16_t node, uint16_t port, bool has_data, uint32_t data)
{
	struct emp_fi_cq *cq = ep->rx_cq;
	struct cq_ent e = {
		.op_context = context,
		.flags = FI_RECV | FI_TAGGED | (flags & (FI_CLAIM | FI_DISCARD)),
		.len = found ? len : 0,
		.tag = found ? tag : 0,
		.src = FI_ADDR_NOTAVAIL,
		.err = found ? 0 : FI_ENOMSG,
		.prov_errno = found ? EMP_WC_SUCCESS : EMP_WC_NO_MESSAGE,
	};
	if (found && (ep->caps & FI_SOURCE))
		e.src = av_reverse(ep->av, ep_code(node, port));
	if (found && has_data) {
		e.flags |= FI_REMOTE_CQ_DATA;
		e.data = data;
	}
	cq_push(cq, &e);
}

/* fi_trecvmsg with FI_PEEK: asks the NIC for the oldest unexpected message
 * this receive would take (a message that landed in a canceled receive
 * counts too) and answers in the CQ at once. With FI_CLAIM the message is
 * the caller's, its claim kept in the fi_context; with FI_DISCARD it is
 * dropped. */
static ssize_t tag_peek(struct emp_fi_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags)
{
	struct emp_fi_domain *dom = ep->dom;
	if (!(ep->caps & FI_TAGGED))
		return -FI_EOPNOTSUPP;
	if (!ep->enabled)
		return -FI_EOPBADSTATE;
	if (flags & FI_MULTI_RECV)
		return -FI_EOPNOTSUPP;
	if ((flags & FI_CLAIM) && (flags & FI_DISCARD))
		return -FI_EINVAL;
	if ((flags & FI_CLAIM) && !msg->context)
		return -FI_EINVAL; /* the claim lives in the caller's fi_context */
	if (!ep->rx_cq)
		return -FI_ENOCQ; /* a peek answers only through the CQ */
	uint64_t tag = msg->tag, ignore = msg->ignore;
	if (ep->msg_and_tagged) {
		if (tag & MSG_TAG_BIT)
			return -FI_EINVAL;
		ignore &= ~MSG_TAG_BIT;
	}
	uint16_t node = EMP_ANY_NODE, port = EMP_ANY_PORT;
	pthread_mutex_lock(&dom->lock);
	ssize_t ret = 0;
	struct emp_fi_cq *cq = ep->rx_cq;
	if ((ep->caps & FI_DIRECTED_RECV) && msg->addr != FI_ADDR_UNSPEC) {
		ret = av_resolve(ep->av, msg->addr, &node, &port);
		if (ret)
			goto out;
	}
	if (cq->count + cq->reserved >= cq->size) {
		ret = -FI_EAGAIN;
		goto out;
	}
	if (flags & FI_CLAIM) {
		if (claim_find(dom, ep, msg->context)) {
			ret = -FI_EINVAL; /* this fi_context holds a claim not yet received */
			goto out;
		}
		if (dom->nclaims == CLAIMS_MAX) {
			ret = -FI_EAGAIN; /* until claimed messages are received */
			goto out;
		}
	}
	if (dom->zombies)
		progress(dom);
	for (struct emp_req **p = &dom->orphans; *p; p = &(*p)->next) {
		struct emp_req *o = *p;
		if (o->ep != ep || !orphan_matches(o, node, port, tag, ignore))
			continue;
		peek_report(ep, msg->context, flags, true, o->msg_len, o->got_tag, o->src_node, o->src_port, o->got_data,
			    o->data);
		if (flags & (FI_CLAIM | FI_DISCARD))
			*p = o->next;
		if (flags & FI_CLAIM)
			dom->claims[dom->nclaims++] = (struct emp_fi_claim){.context = msg->context, .ep = ep, .orphan = o};
		else if (flags & FI_DISCARD) {
			req_release(dom, o);
		}
		goto out;
	}
	/* A discard takes the message off the NIC with a receive of nothing:
	 * its request is taken first, so a found message is never left
	 * claimed by nobody. */
	struct emp_req *drop = NULL;
	if (flags & FI_DISCARD) {
		drop = req_get(dom);
		if (!drop) {
			ret = -FI_EAGAIN;
			goto out;
		}
		drop->kind = REQ_RECV; /* no endpoint: released, silently, on completion */
	}
	struct emp_probed_ex got_ex;
	int found = emp_probe_ex(dom->dev, node, port, tag, ignore, (flags & (FI_CLAIM | FI_DISCARD)) != 0, &got_ex);
	struct emp_probed got = got_ex.msg;
	if (found < 0) {
		ret = post_errno(found);
		if (drop)
			req_release(dom, drop);
		goto out;
	}
	if (drop && !found)
		req_release(dom, drop);
	if (drop && found) {
		ret = post_errno(emp_post_recv_claimed(dom->dev, (uint64_t)(uintptr_t)drop, &got, NULL, 0));
		if (ret) {
			req_release(dom, drop);
			goto out;
		}
	}
	if (found && (flags & FI_CLAIM))
		dom->claims[dom->nclaims++] = (struct emp_fi_claim){.context = msg->context, .ep = ep, .nic = got};
	peek_report(ep, msg->context, flags, found, got.len, got.tag, got.src_node, got.src_port,
		    found && (got_ex.flags & EMP_WC_WITH_IMM), got_ex.imm);
out:
	pthread_mutex_unlock(&dom->lock);
	return ret;
}

/* fi_trecvmsg with FI_CLAIM (no FI_PEEK): receives the message an earlier
 * FI_PEEK | FI_CLAIM with this fi_context claimed (or drops it with
 * FI_DISCARD). */
static ssize_t tag_claimed(struct emp_fi_ep *ep, void *buf, size_t len, void *desc, void *context, uint64_t flags)
{
	struct emp_fi_domain *dom = ep->dom;
	if (!(ep->caps & FI_TAGGED))
		return -FI_EOPNOTSUPP;
	if (!context)
		return -FI_EINVAL;
	if (len && !buf)
		return -FI_EINVAL;
	if (flags & FI_DISCARD)
		len = 0;
	pthread_mutex_lock(&dom->lock);
	struct emp_fi_claim *c = claim_find(dom, ep, context);
	if (!c) {
		pthread_mutex_unlock(&dom->lock);
		return -FI_EINVAL; /* no FI_PEEK | FI_CLAIM claimed with this context */
	}
	if (!c->orphan) {
		struct emp_probed claim = c->nic;
		pthread_mutex_unlock(&dom->lock);
		ssize_t r = do_recv(ep, buf, len, desc, FI_ADDR_UNSPEC, 0, 0, true, context, flags & ~FI_CLAIM, &claim);
		pthread_mutex_lock(&dom->lock);
		c = r == 0 ? claim_find(dom, ep, context) : NULL;
		if (c)
			claim_drop(dom, c); /* used: a second FI_CLAIM is refused */
		pthread_mutex_unlock(&dom->lock);
		return r;
	}
	/* A message that had landed in a canceled receive: its bytes are in
	 * the bounce slot. */
	struct emp_fi_cq *cq = ep->rx_cq;
	if (cq && cq->count + cq->reserved >= cq->size) {
		pthread_mutex_unlock(&dom->lock);
		return -FI_EAGAIN;
	}
	struct emp_req *o = c->orphan;
	claim_drop(dom, c);
	size_t n = o->got_len < len ? o->got_len : len;
	if (n)
		memcpy(buf, orphan_bytes(dom, o), n);
	o->context = context;
	o->cq_flags = FI_RECV | FI_TAGGED;
	o->want_entry = !ep->rx_selective || (flags & FI_COMPLETION);
	o->cancelled = false;
	if (cq) {
		cq->reserved++;
		o->cq_reserved = true;
	}
	bool trunc = !(flags & FI_DISCARD) && o->msg_len > len;
	req_report(o, trunc ? FI_ETRUNC : 0, n, trunc ? o->msg_len - n : 0, o->got_tag, o->src_node, o->src_port,
		   trunc ? EMP_WC_TRUNCATED : EMP_WC_SUCCESS);
	req_release(dom, o);
	pthread_mutex_unlock(&dom->lock);
	return 0;
}

static ssize_t tag_recvmsg(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags)
{
	void *b, *d;
	size_t l;
	if (!msg)
		return -FI_EINVAL;
	int r = one_iov(msg->msg_iov, msg->desc, msg->iov_count, &b, &l, &d);
	if (r)
		return r;
	if (flags & FI_PEEK)
		return tag_peek(EP(ep), msg, flags);
	if (flags & FI_CLAIM)
		return tag_claimed(EP(ep), b, l, d, msg->context, flags);
	if (flags & FI_DISCARD)
		return -FI_EINVAL; /* only with FI_PEEK or FI_CLAIM */
	return do_recv(EP(ep), b, l, d, msg->addr, msg->tag, msg->ignore, true, msg->context, flags, NULL);
}

static ssize_t tag_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t tag,
			void *context)
{
	return do_send(EP(ep), buf, len, desc, dest, tag, true, context, EP(ep)->tx_op_flags, 0, 0);
}

static ssize_t tag_sendv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest,
			 uint64_t tag, void *context)
{
	void *b, *d;
	size_t l;
	int r = one_iov(iov, desc, count, &b, &l, &d);
	return r ? r : do_send(EP(ep), b, l, d, dest, tag, true, context, EP(ep)->tx_op_flags, 0, 0);
}

static ssize_t tag_sendmsg(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags)
{
	void *b, *d;
	size_t l;
	if (!msg)
		return -FI_EINVAL;
	int r = one_iov(msg->msg_iov, msg->desc, msg->iov_count, &b, &l, &d);
	return r ? r
		 : do_send(EP(ep), b, l, d, msg->addr, msg->tag, true, msg->context, flags, msg->data,
			   (flags & FI_INJECT) ? SEND_INJECT : 0);
}

static ssize_t tag_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest, uint64_t tag)
{
	return do_send(EP(ep), buf, len, NULL, dest, tag, true, NULL, 0, 0, SEND_INJECT | SEND_NO_ENTRY);
}

static ssize_t tag_senddata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
			    fi_addr_t dest, uint64_t tag, void *context)
{
	return do_send(EP(ep), buf, len, desc, dest, tag, true, context, EP(ep)->tx_op_flags | FI_REMOTE_CQ_DATA,
		       data, 0);
}

static ssize_t tag_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest,
			      uint64_t tag)
{
	return do_send(EP(ep), buf, len, NULL, dest, tag, true, NULL, FI_REMOTE_CQ_DATA, data,
		       SEND_INJECT | SEND_NO_ENTRY);
}

struct fi_ops_tagged tagged_ops = {
	.size = sizeof(struct fi_ops_tagged),
	.recv = tag_recv,
	.recvv = tag_recvv,
	.recvmsg = tag_recvmsg,
	.send = tag_send,
	.sendv = tag_sendv,
	.sendmsg = tag_sendmsg,
	.inject = tag_inject,
	.senddata = tag_senddata,
	.injectdata = tag_injectdata,
};
