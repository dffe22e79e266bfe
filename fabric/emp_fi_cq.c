/* libemp-fi.so, the libfabric provider "emp": completion queues. See
 * emp_fi.h and fabric/README.md. */

#include "emp_fi.h"

/* ---- completion queue ---------------------------------------------------- */

static void cq_write(const struct emp_fi_cq *cq, void *buf, size_t i, const struct cq_ent *e)
{
	switch (cq->format) {
	case FI_CQ_FORMAT_MSG: {
		struct fi_cq_msg_entry *o = (struct fi_cq_msg_entry *)buf + i;
		*o = (struct fi_cq_msg_entry){e->op_context, e->flags, e->len};
		break;
	}
	case FI_CQ_FORMAT_DATA: {
		struct fi_cq_data_entry *o = (struct fi_cq_data_entry *)buf + i;
		*o = (struct fi_cq_data_entry){e->op_context, e->flags, e->len, NULL, e->data};
		break;
	}
	case FI_CQ_FORMAT_TAGGED: {
		struct fi_cq_tagged_entry *o = (struct fi_cq_tagged_entry *)buf + i;
		*o = (struct fi_cq_tagged_entry){e->op_context, e->flags, e->len, NULL, e->data, e->tag};
		break;
	}
	default: {
		struct fi_cq_entry *o = (struct fi_cq_entry *)buf + i;
		o->op_context = e->op_context;
		break;
	}
	}
}

static ssize_t cq_readfrom(struct fid_cq *fid, void *buf, size_t count, fi_addr_t *src)
{
	struct emp_fi_cq *cq = container_of(fid, struct emp_fi_cq, cq);
	if (count && !buf)
		return -FI_EINVAL;
	pthread_mutex_lock(&cq->dom->lock);
	progress(cq->dom);
	ssize_t n = 0;
	if (!cq->count) {
		n = -FI_EAGAIN;
	} else if (cq->ring[cq->head].err) {
		n = -FI_EAVAIL;
	} else {
		while ((size_t)n < count && cq->count && !cq->ring[cq->head].err) {
			cq_write(cq, buf, (size_t)n, &cq->ring[cq->head]);
			if (src)
				src[n] = cq->ring[cq->head].src;
			cq->head = (cq->head + 1) % cq->size;
			cq->count--;
			n++;
		}
	}
	/* Nothing for a while: let the emulated NIC (a process that may share
	 * this core) run, instead of spinning through its time slice. Not at
	 * every empty read: MPI's progress loop yields too, and a yield per
	 * read doubled MPI's 8 B latency (7.1 µs against 3.8 µs here). */
	bool yield = false;
	if (n != -FI_EAGAIN) {
		cq->empty_reads = 0;
	} else if (++cq->empty_reads >= CQ_EMPTY_READS_PER_YIELD) {
		cq->empty_reads = 0;
		yield = true;
	}
	pthread_mutex_unlock(&cq->dom->lock);
	if (yield)
		sched_yield();
	return n;
}

static ssize_t cq_read(struct fid_cq *fid, void *buf, size_t count)
{
	return cq_readfrom(fid, buf, count, NULL);
}

static ssize_t cq_readerr(struct fid_cq *fid, struct fi_cq_err_entry *buf, uint64_t flags)
{
	struct emp_fi_cq *cq = container_of(fid, struct emp_fi_cq, cq);
	if (!buf)
		return -FI_EINVAL;
	if (flags)
		return -FI_EBADFLAGS;
	pthread_mutex_lock(&cq->dom->lock);
	ssize_t r = -FI_EAGAIN;
	if (cq->count && cq->ring[cq->head].err) {
		const struct cq_ent *e = &cq->ring[cq->head];
		buf->op_context = e->op_context;
		buf->flags = e->flags;
		buf->len = e->len;
		buf->buf = NULL;
		buf->data = e->data;
		buf->tag = e->tag;
		buf->olen = e->olen;
		buf->err = e->err;
		buf->prov_errno = e->prov_errno;
		buf->err_data = NULL;
		/* err_data_size exists from API 1.5 on; older callers' entries end before it. */
		if (FI_VERSION_GE(cq->dom->fab->fabric.api_version, FI_VERSION(1, 5)))
			buf->err_data_size = 0;
		cq->head = (cq->head + 1) % cq->size;
		cq->count--;
		r = 1;
	}
	pthread_mutex_unlock(&cq->dom->lock);
	return r;
}

static ssize_t cq_sreadfrom(struct fid_cq *fid, void *buf, size_t count, fi_addr_t *src, const void *cond,
			    int timeout)
{
	struct emp_fi_cq *cq = container_of(fid, struct emp_fi_cq, cq);
	struct emp_fi_domain *dom = cq->dom;
	(void)cond; /* FI_CQ_COND_NONE only (checked at open) */
	if (cq->wait == FI_WAIT_NONE)
		return -FI_ENOSYS;
	int64_t deadline = timeout < 0 ? -1 : now_ms() + timeout;
	for (;;) {
		ssize_t r = cq_readfrom(fid, buf, count, src);
		if (r != -FI_EAGAIN)
			return r;
		pthread_mutex_lock(&dom->lock);
		arm(dom);
		bool ready = cq->count > 0;
		pthread_mutex_unlock(&dom->lock);
		if (ready)
			continue;
		int left = -1;
		if (deadline >= 0) {
			int64_t l = deadline - now_ms();
			if (l <= 0)
				return -FI_EAGAIN;
			left = (int)l;
		}
		struct pollfd sig = {.fd = cq->signal_fd, .events = POLLIN};
		wait_event(dom, cq->signal_fd, left);
		if (poll(&sig, 1, 0) == 1) {
			drain_fd(cq->signal_fd);
			return -FI_EAGAIN; /* fi_cq_signal */
		}
	}
}

static ssize_t cq_sread(struct fid_cq *fid, void *buf, size_t count, const void *cond, int timeout)
{
	return cq_sreadfrom(fid, buf, count, NULL, cond, timeout);
}

static int cq_signal(struct fid_cq *fid)
{
	struct emp_fi_cq *cq = container_of(fid, struct emp_fi_cq, cq);
	uint64_t one = 1;
	return write(cq->signal_fd, &one, sizeof one) == sizeof one ? 0 : -errno;
}

static const char *cq_strerror(struct fid_cq *fid, int prov_errno, const void *err_data, char *buf, size_t len)
{
	(void)fid, (void)err_data;
	return wc_strerror(prov_errno, buf, len);
}

static int cq_close(struct fid *fid)
{
	struct emp_fi_cq *cq = container_of(fid, struct emp_fi_cq, cq.fid);
	struct emp_fi_domain *dom = cq->dom;
	pthread_mutex_lock(&dom->lock);
	if (cq->refs) {
		pthread_mutex_unlock(&dom->lock);
		return -FI_EBUSY;
	}
	dom->refs--;
	pthread_mutex_unlock(&dom->lock);
	close(cq->signal_fd);
	free(cq->ring);
	free(cq);
	return 0;
}

/* FI_GETWAIT / FI_GETWAITOBJ for a CQ or counter: both wait on the domain's
 * eventfd when opened with FI_WAIT_FD. */
int wait_control(enum fi_wait_obj wait, int event_fd, int command, void *arg)
{
	if (!arg)
		return -FI_EINVAL;
	switch (command) {
	case FI_GETWAIT:
		if (wait != FI_WAIT_FD)
			return -FI_ENODATA;
		*(int *)arg = event_fd;
		return 0;
	case FI_GETWAITOBJ:
		*(enum fi_wait_obj *)arg = wait;
		return 0;
	default:
		return -FI_ENOSYS;
	}
}

static int cq_control(struct fid *fid, int command, void *arg)
{
	struct emp_fi_cq *cq = container_of(fid, struct emp_fi_cq, cq.fid);
	return wait_control(cq->wait, cq->dom->event_fd, command, arg);
}

static struct fi_ops cq_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = cq_close,
	.bind = fid_no_bind,
	.control = cq_control,
	.ops_open = fid_no_ops_open,
};

static struct fi_ops_cq cq_ops = {
	.size = sizeof(struct fi_ops_cq),
	.read = cq_read,
	.readfrom = cq_readfrom,
	.readerr = cq_readerr,
	.sread = cq_sread,
	.sreadfrom = cq_sreadfrom,
	.signal = cq_signal,
	.strerror = cq_strerror,
};

/* Which wait objects we offer: none (poll), or the port's eventfd. */
int wait_obj_pick(enum fi_wait_obj asked, const struct emp_fi_domain *dom, enum fi_wait_obj *out)
{
	switch (asked) {
	case FI_WAIT_NONE:
		*out = FI_WAIT_NONE;
		return 0;
	case FI_WAIT_UNSPEC:
		*out = dom->event_fd >= 0 ? FI_WAIT_FD : FI_WAIT_UNSPEC;
		return 0;
	case FI_WAIT_FD:
		if (dom->event_fd < 0)
			return -FI_ENOSYS;
		*out = FI_WAIT_FD;
		return 0;
	default:
		return -FI_ENOSYS; /* wait sets, mutex/cond, yield, pollfd */
	}
}

int cq_open(struct fid_domain *fid, struct fi_cq_attr *attr, struct fid_cq **out, void *context)
{
	struct emp_fi_domain *dom = container_of(fid, struct emp_fi_domain, domain);
	if (!attr || !out)
		return -FI_EINVAL;
	switch (attr->format) {
	case FI_CQ_FORMAT_UNSPEC:
	case FI_CQ_FORMAT_CONTEXT:
	case FI_CQ_FORMAT_MSG:
	case FI_CQ_FORMAT_DATA:
	case FI_CQ_FORMAT_TAGGED:
		break;
	default:
		return -FI_EINVAL;
	}
	if (attr->flags & ~(uint64_t)FI_AFFINITY)
		return -FI_EBADFLAGS;
	if (attr->flags & FI_AFFINITY)
		return -FI_ENOSYS;
	if (attr->wait_cond != FI_CQ_COND_NONE || attr->wait_set)
		return -FI_ENOSYS;
	if (attr->size > CQ_SIZE_MAX)
		return -FI_EINVAL;
	struct emp_fi_cq *cq = calloc(1, sizeof *cq);
	if (!cq)
		return -FI_ENOMEM;
	int r = wait_obj_pick(attr->wait_obj, dom, &cq->wait);
	if (r) {
		free(cq);
		return r;
	}
	cq->size = attr->size ? attr->size : (size_t)dom->pi.send_entries + dom->pi.recv_entries;
	cq->ring = calloc(cq->size, sizeof *cq->ring);
	cq->signal_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!cq->ring || cq->signal_fd < 0) {
		if (cq->signal_fd >= 0)
			close(cq->signal_fd);
		free(cq->ring);
		free(cq);
		return -FI_ENOMEM;
	}
	cq->cq.fid.fclass = FI_CLASS_CQ;
	cq->cq.fid.context = context;
	cq->cq.fid.ops = &cq_fi_ops;
	cq->cq.ops = &cq_ops;
	cq->dom = dom;
	cq->format = attr->format == FI_CQ_FORMAT_UNSPEC ? FI_CQ_FORMAT_CONTEXT : attr->format;
	attr->format = cq->format;
	pthread_mutex_lock(&dom->lock);
	dom->refs++;
	pthread_mutex_unlock(&dom->lock);
	*out = &cq->cq;
	return 0;
}
