/* libemp-fi.so, the libfabric provider "emp": fabrics. See emp_fi.h and
 * fabric/README.md. */

#include "emp_fi.h"

/* ---- fabric ------------------------------------------------------------------ */

static int fab_close(struct fid *fid)
{
	struct emp_fi_fabric *fab = container_of(fid, struct emp_fi_fabric, fabric.fid);
	pthread_mutex_lock(&fab->lock);
	int refs = fab->refs;
	pthread_mutex_unlock(&fab->lock);
	if (refs)
		return -FI_EBUSY;
	pthread_mutex_destroy(&fab->lock);
	free(fab);
	return 0;
}

static int fab_passive_ep(struct fid_fabric *f, struct fi_info *info, struct fid_pep **pep, void *context)
{
	(void)f, (void)info, (void)pep, (void)context;
	return -FI_ENOSYS;
}


static int fab_wait_open(struct fid_fabric *f, struct fi_wait_attr *attr, struct fid_wait **w)
{
	(void)f, (void)attr, (void)w;
	return -FI_ENOSYS;
}

/* fi_trywait: 0 when every CQ/counter is empty and armed (its fd will
 * fire), -FI_EAGAIN when something is there to read first. */
static int fab_trywait(struct fid_fabric *f, struct fid **fids, int count)
{
	(void)f;
	if (count < 0 || (count && !fids))
		return -FI_EINVAL;
	for (int i = 0; i < count; i++) {
		struct emp_fi_domain *dom;
		bool ready;
		if (fids[i]->fclass == FI_CLASS_CQ) {
			struct emp_fi_cq *cq = container_of(fids[i], struct emp_fi_cq, cq.fid);
			if (cq->wait != FI_WAIT_FD)
				return -FI_EINVAL;
			dom = cq->dom;
			pthread_mutex_lock(&dom->lock);
			arm(dom);
			ready = cq->count > 0;
		} else if (fids[i]->fclass == FI_CLASS_CNTR) {
			struct emp_fi_cntr *c = container_of(fids[i], struct emp_fi_cntr, cntr.fid);
			if (c->wait != FI_WAIT_FD)
				return -FI_EINVAL;
			dom = c->dom;
			pthread_mutex_lock(&dom->lock);
			uint64_t v = c->value, e = c->err;
			arm(dom);
			ready = c->value != v || c->err != e;
		} else {
			return -FI_EINVAL;
		}
		pthread_mutex_unlock(&dom->lock);
		if (ready)
			return -FI_EAGAIN;
	}
	return 0;
}

static struct fi_ops fab_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = fab_close,
	.bind = fid_no_bind,
	.control = fid_no_control,
	.ops_open = fid_no_ops_open,
};

static struct fi_ops_fabric fab_ops = {
	.size = sizeof(struct fi_ops_fabric),
	.domain = dom_open,
	.passive_ep = fab_passive_ep,
	.eq_open = fab_eq_open,
	.wait_open = fab_wait_open,
	.trywait = fab_trywait,
	.domain2 = dom_open2,
};

int fabric_open(struct fi_fabric_attr *attr, struct fid_fabric **out, void *context)
{
	if (!attr || !out)
		return -FI_EINVAL;
	if (attr->name && strcmp(attr->name, EMP_FI_NAME))
		return -FI_ENODATA;
	struct emp_fi_fabric *fab = calloc(1, sizeof *fab);
	if (!fab)
		return -FI_ENOMEM;
	pthread_mutex_init(&fab->lock, NULL);
	fab->fabric.fid.fclass = FI_CLASS_FABRIC;
	fab->fabric.fid.context = context;
	fab->fabric.fid.ops = &fab_fi_ops;
	fab->fabric.ops = &fab_ops;
	fab->fabric.api_version = FI_VERSION(1, 0); /* the core sets the caller's version after we return */
	*out = &fab->fabric;
	return 0;
}
