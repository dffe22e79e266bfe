/* libemp-fi.so, the libfabric provider "emp": counters. See emp_fi.h and
 * fabric/README.md. */

#include "emp_fi.h"

/* ---- counters ---------------------------------------------------------------- */

static uint64_t cntr_read(struct fid_cntr *fid)
{
	struct emp_fi_cntr *c = container_of(fid, struct emp_fi_cntr, cntr);
	pthread_mutex_lock(&c->dom->lock);
	progress(c->dom);
	uint64_t v = c->value;
	pthread_mutex_unlock(&c->dom->lock);
	return v;
}

static uint64_t cntr_readerr(struct fid_cntr *fid)
{
	struct emp_fi_cntr *c = container_of(fid, struct emp_fi_cntr, cntr);
	pthread_mutex_lock(&c->dom->lock);
	progress(c->dom);
	uint64_t v = c->err;
	pthread_mutex_unlock(&c->dom->lock);
	return v;
}

static int cntr_update(struct fid_cntr *fid, uint64_t value, bool err, bool add)
{
	struct emp_fi_cntr *c = container_of(fid, struct emp_fi_cntr, cntr);
	pthread_mutex_lock(&c->dom->lock);
	uint64_t *p = err ? &c->err : &c->value;
	*p = add ? *p + value : value;
	pthread_mutex_unlock(&c->dom->lock);
	return 0;
}

static int cntr_add(struct fid_cntr *c, uint64_t v) { return cntr_update(c, v, false, true); }
static int cntr_set(struct fid_cntr *c, uint64_t v) { return cntr_update(c, v, false, false); }
static int cntr_adderr(struct fid_cntr *c, uint64_t v) { return cntr_update(c, v, true, true); }
static int cntr_seterr(struct fid_cntr *c, uint64_t v) { return cntr_update(c, v, true, false); }

static int cntr_wait(struct fid_cntr *fid, uint64_t threshold, int timeout)
{
	struct emp_fi_cntr *c = container_of(fid, struct emp_fi_cntr, cntr);
	struct emp_fi_domain *dom = c->dom;
	if (c->wait == FI_WAIT_NONE)
		return -FI_EOPBADSTATE;
	int64_t deadline = timeout < 0 ? -1 : now_ms() + timeout;
	pthread_mutex_lock(&dom->lock);
	uint64_t err0 = c->err;
	for (;;) {
		progress(dom);
		if (c->value >= threshold || c->err != err0)
			break;
		arm(dom);
		if (c->value >= threshold || c->err != err0)
			break;
		int left = -1;
		if (deadline >= 0) {
			int64_t l = deadline - now_ms();
			if (l <= 0) {
				pthread_mutex_unlock(&dom->lock);
				return -FI_ETIMEDOUT;
			}
			left = (int)l;
		}
		pthread_mutex_unlock(&dom->lock);
		wait_event(dom, -1, left);
		pthread_mutex_lock(&dom->lock);
	}
	int r = c->err != err0 ? -FI_EAVAIL : 0;
	pthread_mutex_unlock(&dom->lock);
	return r;
}

static int cntr_close(struct fid *fid)
{
	struct emp_fi_cntr *c = container_of(fid, struct emp_fi_cntr, cntr.fid);
	struct emp_fi_domain *dom = c->dom;
	pthread_mutex_lock(&dom->lock);
	if (c->refs) {
		pthread_mutex_unlock(&dom->lock);
		return -FI_EBUSY;
	}
	dom->refs--;
	pthread_mutex_unlock(&dom->lock);
	free(c);
	return 0;
}

static int cntr_control(struct fid *fid, int command, void *arg)
{
	struct emp_fi_cntr *c = container_of(fid, struct emp_fi_cntr, cntr.fid);
	return wait_control(c->wait, c->dom->event_fd, command, arg);
}

static struct fi_ops cntr_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = cntr_close,
	.bind = fid_no_bind,
	.control = cntr_control,
	.ops_open = fid_no_ops_open,
};

static struct fi_ops_cntr cntr_ops = {
	.size = sizeof(struct fi_ops_cntr),
	.read = cntr_read,
	.readerr = cntr_readerr,
	.add = cntr_add,
	.set = cntr_set,
	.wait = cntr_wait,
	.adderr = cntr_adderr,
	.seterr = cntr_seterr,
};

int cntr_open(struct fid_domain *fid, struct fi_cntr_attr *attr, struct fid_cntr **out, void *context)
{
	struct emp_fi_domain *dom = container_of(fid, struct emp_fi_domain, domain);
	if (!out)
		return -FI_EINVAL;
	enum fi_wait_obj wait = FI_WAIT_NONE;
	if (attr) {
		if (attr->events != FI_CNTR_EVENTS_COMP)
			return -FI_ENOSYS;
		if (attr->flags)
			return -FI_EBADFLAGS;
		if (attr->wait_set)
			return -FI_ENOSYS;
		int r = wait_obj_pick(attr->wait_obj, dom, &wait);
		if (r)
			return r;
	} else if (wait_obj_pick(FI_WAIT_UNSPEC, dom, &wait)) {
		wait = FI_WAIT_NONE;
	}
	struct emp_fi_cntr *c = calloc(1, sizeof *c);
	if (!c)
		return -FI_ENOMEM;
	c->cntr.fid.fclass = FI_CLASS_CNTR;
	c->cntr.fid.context = context;
	c->cntr.fid.ops = &cntr_fi_ops;
	c->cntr.ops = &cntr_ops;
	c->dom = dom;
	c->wait = wait;
	pthread_mutex_lock(&dom->lock);
	dom->refs++;
	pthread_mutex_unlock(&dom->lock);
	*out = &c->cntr;
	return 0;
}
