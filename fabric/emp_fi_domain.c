/* libemp-fi.so, the libfabric provider "emp": domains. See emp_fi.h and
 * fabric/README.md. */

#include "emp_fi.h"

/* ---- domain -------------------------------------------------------------------- */

static int dom_close(struct fid *fid)
{
	struct emp_fi_domain *dom = container_of(fid, struct emp_fi_domain, domain.fid);
	pthread_mutex_lock(&dom->lock);
	if (dom->refs) {
		pthread_mutex_unlock(&dom->lock);
		return -FI_EBUSY;
	}
	pthread_mutex_unlock(&dom->lock);
	emp_close_device(dom->dev); /* closes the port: the NIC flushes what it held */
	pthread_mutex_lock(&dom->fab->lock);
	dom->fab->refs--;
	pthread_mutex_unlock(&dom->fab->lock);
	pthread_mutex_destroy(&dom->lock);
	if (dom->runs || dom->run_fallbacks)
		FI_INFO(&emp_prov, FI_LOG_DOMAIN, "bounce runs: %zu messages, %zu found none free (registered)\n",
			dom->runs, dom->run_fallbacks);
	mrc_fini(dom);
	free(dom->reqs);
	free(dom->slot_free);
	free(dom);
	return 0;
}

static struct fi_ops dom_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = dom_close,
	.bind = fid_no_bind,
	.control = fid_no_control,
	.ops_open = fid_no_ops_open,
};

static int dom_scalable_ep(struct fid_domain *d, struct fi_info *info, struct fid_ep **sep, void *context)
{
	(void)d, (void)info, (void)sep, (void)context;
	return -FI_ENOSYS;
}

static int dom_poll_open(struct fid_domain *d, struct fi_poll_attr *attr, struct fid_poll **p)
{
	(void)d, (void)attr, (void)p;
	return -FI_ENOSYS;
}

static int dom_stx(struct fid_domain *d, struct fi_tx_attr *attr, struct fid_stx **stx, void *context)
{
	(void)d, (void)attr, (void)stx, (void)context;
	return -FI_ENOSYS;
}

static int dom_srx(struct fid_domain *d, struct fi_rx_attr *attr, struct fid_ep **rx, void *context)
{
	(void)d, (void)attr, (void)rx, (void)context;
	return -FI_ENOSYS;
}

static int dom_query_atomic(struct fid_domain *d, enum fi_datatype t, enum fi_op o, struct fi_atomic_attr *attr,
			    uint64_t flags)
{
	(void)d;
	if (!attr)
		return -FI_EINVAL;
	if (flags & ~(uint64_t)(FI_FETCH_ATOMIC | FI_COMPARE_ATOMIC) ||
	    (flags & (FI_FETCH_ATOMIC | FI_COMPARE_ATOMIC)) == (FI_FETCH_ATOMIC | FI_COMPARE_ATOMIC))
		return -FI_EBADFLAGS;
	int kind = (flags & FI_COMPARE_ATOMIC) ? 2 : (flags & FI_FETCH_ATOMIC) ? 1 : 0;
	size_t count;
	int r = atomic_valid(t, o, kind, &count);
	if (r)
		return r;
	attr->count = count;
	attr->size = (t == FI_INT32 || t == FI_UINT32) ? 4 : 8;
	return 0;
}

static int dom_query_collective(struct fid_domain *d, enum fi_collective_op c, struct fi_collective_attr *attr,
				uint64_t flags)
{
	struct emp_fi_domain *dom = container_of(d, struct emp_fi_domain, domain);
	return coll_query(&dom->pi, c, attr, flags);
}

static struct fi_ops_domain dom_ops = {
	.size = sizeof(struct fi_ops_domain),
	.av_open = av_open,
	.cq_open = cq_open,
	.endpoint = ep_open,
	.scalable_ep = dom_scalable_ep,
	.cntr_open = cntr_open,
	.poll_open = dom_poll_open,
	.stx_ctx = dom_stx,
	.srx_ctx = dom_srx,
	.query_atomic = dom_query_atomic,
	.query_collective = dom_query_collective,
	.endpoint2 = ep_open2,
};

int dom_open(struct fid_fabric *fid, struct fi_info *info, struct fid_domain **out, void *context)
{
	struct emp_fi_fabric *fab = container_of(fid, struct emp_fi_fabric, fabric);
	if (!info || !out || !info->domain_attr)
		return -FI_EINVAL;
	if (info->domain_attr->name && strcmp(info->domain_attr->name, EMP_FI_NAME))
		return -FI_EINVAL;
	struct emp_fi_domain *dom = calloc(1, sizeof *dom);
	if (!dom)
		return -FI_ENOMEM;
	int err = 0;
	dom->dev = open_nic(&err);
	if (!dom->dev) {
		FI_WARN(&emp_prov, FI_LOG_DOMAIN, "opening this process's EMP NIC: %s\n", strerror(err < 0 ? -err : ENODEV));
		free(dom);
		return err < 0 ? err : -FI_ENODEV;
	}
	int r = emp_query_port(dom->dev, &dom->pi);
	if (r < 0)
		goto fail;
	dom->event_fd = emp_get_event_fd(dom->dev);
	dom->nreqs = (size_t)dom->pi.send_entries + dom->pi.recv_entries;
	dom->reqs = calloc(dom->nreqs, sizeof *dom->reqs);
	r = -FI_ENOMEM;
	if (!dom->reqs)
		goto fail;
	r = slots_init(dom);
	if (r)
		goto fail;
	r = mrc_init(dom);
	if (r)
		goto fail;
	for (size_t i = dom->nreqs; i-- > 0;) {
		dom->reqs[i].next = dom->free_reqs;
		dom->free_reqs = &dom->reqs[i];
	}
	pthread_mutex_init(&dom->lock, NULL);
	dom->domain.fid.fclass = FI_CLASS_DOMAIN;
	dom->domain.fid.context = context;
	dom->domain.fid.ops = &dom_fi_ops;
	dom->domain.ops = &dom_ops;
	dom->domain.mr = &mr_ops;
	dom->fab = fab;
	dom->mr_mode = (uint64_t)info->domain_attr->mr_mode;
	pthread_mutex_lock(&fab->lock);
	fab->refs++;
	pthread_mutex_unlock(&fab->lock);
	*out = &dom->domain;
	return 0;
fail:
	emp_close_device(dom->dev);
	mrc_fini(dom);
	free(dom->reqs);
	free(dom->slot_free);
	free(dom);
	return r;
}

int dom_open2(struct fid_fabric *f, struct fi_info *info, struct fid_domain **d, uint64_t flags, void *ctx)
{
	if (flags)
		return -FI_EBADFLAGS;
	return dom_open(f, info, d, ctx);
}
