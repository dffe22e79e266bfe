/* libemp-fi.so, the libfabric provider "emp": endpoints. See emp_fi.h and
 * fabric/README.md. */

#include "emp_fi.h"

/* ---- endpoint ---------------------------------------------------------------- */

static ssize_t ep_cancel(fid_t fid, void *context)
{
	struct emp_fi_ep *ep = container_of(fid, struct emp_fi_ep, ep.fid);
	struct emp_fi_domain *dom = ep->dom;
	if (fid->fclass != FI_CLASS_EP)
		return -FI_EINVAL;
	pthread_mutex_lock(&dom->lock);
	progress(dom);
	ssize_t r = -FI_ENOENT;
	for (size_t i = 0; i < dom->nreqs; i++) {
		struct emp_req *q = &dom->reqs[i];
		if (!q->in_use || q->ep != ep || q->kind != REQ_RECV || q->cancelled || q->imm_pool ||
		    q->context != context)
			continue;
		/* The NIC takes it back if no message matched it yet: its own
		 * completion (EMP_WC_CANCELED) then reports FI_ECANCELED. One
		 * a message matched completes as it would have. */
		int c = emp_cancel_recv(dom->dev, (uint64_t)(uintptr_t)q);
		if (c >= 0) {
			r = 0;
			break;
		}
		/* The NIC could not answer (a control program without cancel).
		 * A receive whose bytes land in a bounce slot (or nowhere) is
		 * retired here: a message that still matches it is kept for the
		 * next receive. One placed in the caller's own memory cannot be. */
		FI_INFO(&emp_prov, FI_LOG_EP_DATA, "the NIC did not cancel: %s\n", strerror(-c));
		if (q->slot < 0 && q->len) {
			r = -FI_EBUSY;
			break;
		}
		q->cancelled = true;
		dom->zombies++;
		if (ep->rx_cq && q->cq_reserved) {
			struct cq_ent e = {.op_context = context, .flags = q->cq_flags, .src = FI_ADDR_NOTAVAIL,
					   .err = FI_ECANCELED, .prov_errno = EMP_WC_FLUSHED};
			cq_push(ep->rx_cq, &e);
			ep->rx_cq->reserved--;
			q->cq_reserved = false;
		}
		r = 0;
		break;
	}
	pthread_mutex_unlock(&dom->lock);
	return r;
}

static int ep_getopt(fid_t fid, int level, int optname, void *optval, size_t *optlen)
{
	(void)fid, (void)optval, (void)optlen;
	if (level != FI_OPT_ENDPOINT)
		return -FI_ENOPROTOOPT;
	(void)optname;
	return -FI_ENOPROTOOPT;
}

static int ep_setopt(fid_t fid, int level, int optname, const void *optval, size_t optlen)
{
	(void)fid, (void)optval, (void)optlen;
	if (level != FI_OPT_ENDPOINT)
		return -FI_ENOPROTOOPT;
	(void)optname;
	return -FI_ENOPROTOOPT;
}

static int ep_no_ctx(struct fid_ep *sep, int index, void *attr, struct fid_ep **ep, void *context)
{
	(void)sep, (void)index, (void)attr, (void)ep, (void)context;
	return -FI_ENOSYS;
}

static int ep_tx_ctx(struct fid_ep *sep, int index, struct fi_tx_attr *attr, struct fid_ep **ep, void *context)
{
	return ep_no_ctx(sep, index, attr, ep, context);
}

static int ep_rx_ctx(struct fid_ep *sep, int index, struct fi_rx_attr *attr, struct fid_ep **ep, void *context)
{
	return ep_no_ctx(sep, index, attr, ep, context);
}

static ssize_t ep_rx_size_left(struct fid_ep *fid)
{
	struct emp_fi_ep *ep = EP(fid);
	if (!ep->enabled)
		return -FI_EOPBADSTATE;
	pthread_mutex_lock(&ep->dom->lock);
	progress(ep->dom);
	ssize_t n = (ssize_t)(ep->rx_size - ep->rx_inflight);
	pthread_mutex_unlock(&ep->dom->lock);
	return n;
}

static ssize_t ep_tx_size_left(struct fid_ep *fid)
{
	struct emp_fi_ep *ep = EP(fid);
	if (!ep->enabled)
		return -FI_EOPBADSTATE;
	pthread_mutex_lock(&ep->dom->lock);
	progress(ep->dom);
	ssize_t n = (ssize_t)(ep->tx_size - ep->tx_inflight);
	pthread_mutex_unlock(&ep->dom->lock);
	return n;
}

static struct fi_ops_ep ep_ops = {
	.size = sizeof(struct fi_ops_ep),
	.cancel = ep_cancel,
	.getopt = ep_getopt,
	.setopt = ep_setopt,
	.tx_ctx = ep_tx_ctx,
	.rx_ctx = ep_rx_ctx,
	.rx_size_left = ep_rx_size_left,
	.tx_size_left = ep_tx_size_left,
};

static int cm_getname(fid_t fid, void *addr, size_t *addrlen)
{
	struct emp_fi_ep *ep = container_of(fid, struct emp_fi_ep, ep.fid);
	if (!addrlen)
		return -FI_EINVAL;
	return name_copy_out(ep_code(ep->dom->pi.node, ep->dom->pi.port), addr, addrlen);
}

static int cm_setname(fid_t fid, void *addr, size_t addrlen)
{
	(void)fid, (void)addr, (void)addrlen;
	return -FI_ENOSYS; /* the NIC assigns the port */
}

static int cm_getpeer(struct fid_ep *ep, void *addr, size_t *addrlen)
{
	(void)ep, (void)addr, (void)addrlen;
	return -FI_ENOSYS; /* connectionless */
}

static int cm_connect(struct fid_ep *ep, const void *addr, const void *param, size_t paramlen)
{
	(void)ep, (void)addr, (void)param, (void)paramlen;
	return -FI_ENOSYS;
}

static int cm_listen(struct fid_pep *pep)
{
	(void)pep;
	return -FI_ENOSYS;
}

static int cm_accept(struct fid_ep *ep, const void *param, size_t paramlen)
{
	(void)ep, (void)param, (void)paramlen;
	return -FI_ENOSYS;
}

static int cm_reject(struct fid_pep *pep, fid_t handle, const void *param, size_t paramlen)
{
	(void)pep, (void)handle, (void)param, (void)paramlen;
	return -FI_ENOSYS;
}

static int cm_shutdown(struct fid_ep *ep, uint64_t flags)
{
	(void)ep, (void)flags;
	return -FI_ENOSYS;
}

static int cm_join(struct fid_ep *ep, const void *addr, uint64_t flags, struct fid_mc **mc, void *context)
{
	if (flags & FI_COLLECTIVE)
		return coll_join(EP(ep), addr, flags, mc, context);
	return -FI_ENOSYS; /* no multicast */
}

static struct fi_ops_cm cm_ops = {
	.size = sizeof(struct fi_ops_cm),
	.setname = cm_setname,
	.getname = cm_getname,
	.getpeer = cm_getpeer,
	.connect = cm_connect,
	.listen = cm_listen,
	.accept = cm_accept,
	.reject = cm_reject,
	.shutdown = cm_shutdown,
	.join = cm_join,
};

static int ep_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
	struct emp_fi_ep *ep = container_of(fid, struct emp_fi_ep, ep.fid);
	struct emp_fi_domain *dom = ep->dom;
	if (!bfid)
		return -FI_EINVAL;
	int r = 0;
	pthread_mutex_lock(&dom->lock);
	if (ep->enabled) {
		r = -FI_EOPBADSTATE;
		goto out;
	}
	switch (bfid->fclass) {
	case FI_CLASS_AV: {
		struct emp_fi_av *av = container_of(bfid, struct emp_fi_av, av.fid);
		if (flags) {
			r = -FI_EBADFLAGS;
		} else if (ep->av || av->dom != dom) {
			r = -FI_EINVAL;
		} else {
			ep->av = av;
			av->refs++;
		}
		break;
	}
	case FI_CLASS_CQ: {
		struct emp_fi_cq *cq = container_of(bfid, struct emp_fi_cq, cq.fid);
		if (flags & ~(FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION) || !(flags & (FI_TRANSMIT | FI_RECV))) {
			r = -FI_EBADFLAGS;
		} else if (cq->dom != dom || ((flags & FI_TRANSMIT) && ep->tx_cq) || ((flags & FI_RECV) && ep->rx_cq)) {
			r = -FI_EINVAL;
		} else {
			if (flags & FI_TRANSMIT) {
				ep->tx_cq = cq;
				ep->tx_selective = flags & FI_SELECTIVE_COMPLETION;
				cq->refs++;
			}
			if (flags & FI_RECV) {
				ep->rx_cq = cq;
				ep->rx_selective = flags & FI_SELECTIVE_COMPLETION;
				cq->refs++;
			}
		}
		break;
	}
	case FI_CLASS_CNTR: {
		struct emp_fi_cntr *c = container_of(bfid, struct emp_fi_cntr, cntr.fid);
		if (flags & (FI_REMOTE_READ | FI_REMOTE_WRITE)) {
			r = -FI_EOPNOTSUPP; /* no FI_RMA_EVENT: the target's NIC tells its host nothing */
		} else if (flags & ~(FI_SEND | FI_RECV | FI_READ | FI_WRITE) || !flags) {
			r = -FI_EBADFLAGS;
		} else if (c->dom != dom || ((flags & FI_SEND) && ep->tx_cntr) || ((flags & FI_RECV) && ep->rx_cntr) ||
			   ((flags & FI_READ) && ep->read_cntr) || ((flags & FI_WRITE) && ep->write_cntr)) {
			r = -FI_EINVAL;
		} else {
			if (flags & FI_READ) {
				ep->read_cntr = c;
				c->refs++;
			}
			if (flags & FI_WRITE) {
				ep->write_cntr = c;
				c->refs++;
			}
			if (flags & FI_SEND) {
				ep->tx_cntr = c;
				c->refs++;
			}
			if (flags & FI_RECV) {
				ep->rx_cntr = c;
				c->refs++;
			}
		}
		break;
	}
	case FI_CLASS_EQ: {
		struct emp_fi_eq *eq = container_of(bfid, struct emp_fi_eq, eq.fid);
		if (flags) {
			r = -FI_EBADFLAGS;
		} else if (ep->eq) {
			r = -FI_EINVAL;
		} else {
			pthread_mutex_lock(&eq->lock);
			eq->refs++;
			pthread_mutex_unlock(&eq->lock);
			ep->eq = eq;
		}
		break;
	}
	default:
		r = -FI_EINVAL;
	}
out:
	pthread_mutex_unlock(&dom->lock);
	return r;
}

static int ep_control(struct fid *fid, int command, void *arg)
{
	struct emp_fi_ep *ep = container_of(fid, struct emp_fi_ep, ep.fid);
	int r = 0;
	pthread_mutex_lock(&ep->dom->lock);
	switch (command) {
	case FI_ENABLE:
		if (!ep->av)
			r = -FI_ENOAV;
		else if ((!ep->tx_cq && !ep->tx_cntr) || (!ep->rx_cq && !ep->rx_cntr))
			r = -FI_ENOCQ;
		else if (!ep->enabled && (r = imm_pool_fill(ep)) == 0)
			ep->enabled = true;
		break;
	case FI_GETOPSFLAG:
	case FI_SETOPSFLAG: {
		uint64_t *f = arg;
		if (!f || !(*f & (FI_TRANSMIT | FI_RECV)) || ((*f & FI_TRANSMIT) && (*f & FI_RECV))) {
			r = -FI_EINVAL;
			break;
		}
		bool tx = *f & FI_TRANSMIT;
		uint64_t *ops = tx ? &ep->tx_op_flags : &ep->rx_op_flags;
		uint64_t allowed = tx ? tx_op_flags_ok(ep->caps) : EMP_RX_OP_FLAGS;
		if (command == FI_GETOPSFLAG) {
			*f = *ops | (tx ? FI_TRANSMIT : FI_RECV);
		} else {
			uint64_t v = *f & ~(uint64_t)(FI_TRANSMIT | FI_RECV);
			if (v & ~allowed)
				r = -FI_EINVAL;
			else
				*ops = v;
		}
		break;
	}
	default:
		r = -FI_ENOSYS;
	}
	pthread_mutex_unlock(&ep->dom->lock);
	return r;
}

static int ep_close(struct fid *fid)
{
	struct emp_fi_ep *ep = container_of(fid, struct emp_fi_ep, ep.fid);
	struct emp_fi_domain *dom = ep->dom;
	pthread_mutex_lock(&dom->lock);
	if (ep->nmcs) {
		pthread_mutex_unlock(&dom->lock);
		return -FI_EBUSY; /* its collective groups are still open */
	}
	progress(dom);
	/* What the NIC still holds completes later and is dropped; memory the
	 * caller lent it is taken back now (the NIC then fails those). */
	for (struct emp_req **p = &dom->orphans; *p;) {
		struct emp_req *o = *p;
		if (o->ep == ep) {
			*p = o->next;
			o->ep = NULL;
			req_release(dom, o);
		} else {
			p = &o->next;
		}
	}
	/* Claims never received: a claimed orphan goes; the NIC drops its
	 * claimed messages when the port closes. */
	for (size_t i = 0; i < dom->nclaims;) {
		struct emp_fi_claim *c = &dom->claims[i];
		if (c->ep != ep) {
			i++;
			continue;
		}
		if (c->orphan) {
			c->orphan->ep = NULL;
			req_release(dom, c->orphan);
		}
		*c = dom->claims[--dom->nclaims];
	}
	/* The NIC must not reach the application's memory for this endpoint's
	 * operations after the close: no cached registration stays either. */
	mrc_flush(dom);
	for (size_t i = 0; i < dom->nreqs; i++) {
		struct emp_req *q = &dom->reqs[i];
		if (!q->in_use || q->ep != ep)
			continue;
		if (q->tmp_key >= 0) {
			emp_dereg_mr(dom->dev, (uint32_t)q->tmp_key);
			q->tmp_key = -1;
		}
		/* Its CQ entry will never be written: give the slot back, the CQ
		 * may be bound to the next endpoint. */
		struct emp_fi_cq *qcq = q->kind == REQ_SEND ? ep->tx_cq : ep->rx_cq;
		if (q->cq_reserved && qcq)
			qcq->reserved--;
		q->cq_reserved = false;
		q->ep = NULL;
	}
	if (ep->av)
		ep->av->refs--;
	if (ep->tx_cq)
		ep->tx_cq->refs--;
	if (ep->rx_cq)
		ep->rx_cq->refs--;
	if (ep->tx_cntr)
		ep->tx_cntr->refs--;
	if (ep->rx_cntr)
		ep->rx_cntr->refs--;
	if (ep->read_cntr)
		ep->read_cntr->refs--;
	if (ep->write_cntr)
		ep->write_cntr->refs--;
	if (ep->eq) {
		pthread_mutex_lock(&ep->eq->lock);
		ep->eq->refs--;
		pthread_mutex_unlock(&ep->eq->lock);
	}
	dom->ep = NULL;
	dom->refs--;
	pthread_mutex_unlock(&dom->lock);
	free(ep);
	return 0;
}

static struct fi_ops ep_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = ep_close,
	.bind = ep_bind,
	.control = ep_control,
	.ops_open = fid_no_ops_open,
};

/* Caps as libfabric reads them: no transfer class named means msg and
 * tagged; no direction named means every direction. */
static uint64_t primary_or_both(uint64_t caps)
{
	if (!(caps & (FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_COLLECTIVE)))
		caps |= FI_MSG | FI_TAGGED;
	if (!(caps & EMP_DIR_CAPS))
		caps |= EMP_DIR_CAPS;
	return caps;
}

int ep_open(struct fid_domain *fid, struct fi_info *info, struct fid_ep **out, void *context)
{
	struct emp_fi_domain *dom = container_of(fid, struct emp_fi_domain, domain);
	if (!info || !out || !info->ep_attr || !info->tx_attr || !info->rx_attr)
		return -FI_EINVAL;
	if (info->ep_attr->type != FI_EP_RDM || (info->caps & ~(uint64_t)EMP_CAPS))
		return -FI_EINVAL;
	if ((info->tx_attr->op_flags & ~tx_op_flags_ok(info->caps)) ||
	    (info->rx_attr->op_flags & ~(uint64_t)EMP_RX_OP_FLAGS))
		return -FI_EBADFLAGS;
	struct emp_fi_ep *ep = calloc(1, sizeof *ep);
	if (!ep)
		return -FI_ENOMEM;
	pthread_mutex_lock(&dom->lock);
	if (dom->ep) {
		pthread_mutex_unlock(&dom->lock);
		free(ep);
		return -FI_EBUSY; /* one endpoint per domain (ep_cnt 1): it owns the port */
	}
	ep->ep.fid.fclass = FI_CLASS_EP;
	ep->ep.fid.context = context;
	ep->ep.fid.ops = &ep_fi_ops;
	ep->ep.ops = &ep_ops;
	ep->ep.cm = &cm_ops;
	ep->ep.msg = &msg_ops;
	ep->ep.tagged = &tagged_ops;
	ep->ep.rma = &rma_ops;
	ep->ep.atomic = &atomic_ops;
	ep->ep.collective = &coll_ops;
	ep->dom = dom;
	ep->caps = primary_or_both(info->caps ? info->caps : EMP_CAPS);
	ep->msg_and_tagged = (ep->caps & FI_MSG) && (ep->caps & FI_TAGGED);
	ep->tx_op_flags = info->tx_attr->op_flags;
	ep->rx_op_flags = info->rx_attr->op_flags;
	ep->tx_size = info->tx_attr->size && info->tx_attr->size < dom->pi.send_entries ? info->tx_attr->size
											  : dom->pi.send_entries;
	ep->rx_size = info->rx_attr->size && info->rx_attr->size < dom->pi.recv_entries ? info->rx_attr->size
											  : dom->pi.recv_entries;
	dom->ep = ep;
	dom->refs++;
	pthread_mutex_unlock(&dom->lock);
	*out = &ep->ep;
	return 0;
}

int ep_open2(struct fid_domain *d, struct fi_info *info, struct fid_ep **ep, uint64_t flags, void *context)
{
	if (flags)
		return -FI_EBADFLAGS;
	return ep_open(d, info, ep, context);
}
