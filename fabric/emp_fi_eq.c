/* libemp-fi.so, the libfabric provider "emp": event queues. See emp_fi.h and
 * fabric/README.md. */

#include "emp_fi.h"

static ssize_t eq_take(struct emp_fi_eq *eq, uint32_t *event, void *buf, size_t len, uint64_t flags)
{
	if (flags & ~(uint64_t)FI_PEEK)
		return -FI_EBADFLAGS;
	pthread_mutex_lock(&eq->lock);
	ssize_t r = -FI_EAGAIN;
	if (eq->count) {
		const struct eq_ent *e = &eq->ring[eq->head];
		if (len < e->len || (e->len && !buf)) {
			r = -FI_ETOOSMALL;
		} else {
			if (event)
				*event = e->event;
			memcpy(buf, e->data, e->len);
			r = (ssize_t)e->len;
			if (!(flags & FI_PEEK)) {
				eq->head = (eq->head + 1) % eq->size;
				if (!--eq->count)
					drain_fd(eq->fd);
			}
		}
	}
	pthread_mutex_unlock(&eq->lock);
	return r;
}

static ssize_t eq_read(struct fid_eq *fid, uint32_t *event, void *buf, size_t len, uint64_t flags)
{
	return eq_take(container_of(fid, struct emp_fi_eq, eq), event, buf, len, flags);
}

static ssize_t eq_readerr(struct fid_eq *fid, struct fi_eq_err_entry *buf, uint64_t flags)
{
	(void)fid;
	if (!buf)
		return -FI_EINVAL;
	return flags ? -FI_EBADFLAGS : -FI_EAGAIN; /* no error events */
}

/* Appends an entry (len <= EQ_ENTRY_MAX) and wakes a waiter: len, or
 * -FI_EAGAIN when the EQ is full. Called with eq->lock. */
ssize_t eq_push_locked(struct emp_fi_eq *eq, uint32_t event, const void *buf, size_t len)
{
	if (eq->count >= eq->size)
		return -FI_EAGAIN;
	struct eq_ent *e = &eq->ring[(eq->head + eq->count) % eq->size];
	e->event = event;
	e->len = len;
	if (len)
		memcpy(e->data, buf, len);
	eq->count++;
	uint64_t one = 1;
	ssize_t w = write(eq->fd, &one, sizeof one);
	(void)w;
	return (ssize_t)len;
}

static ssize_t eq_write(struct fid_eq *fid, uint32_t event, const void *buf, size_t len, uint64_t flags)
{
	struct emp_fi_eq *eq = container_of(fid, struct emp_fi_eq, eq);
	if (flags)
		return -FI_EBADFLAGS;
	if (len > EQ_ENTRY_MAX || (len && !buf))
		return -FI_EINVAL;
	pthread_mutex_lock(&eq->lock);
	ssize_t r = eq_push_locked(eq, event, buf, len);
	pthread_mutex_unlock(&eq->lock);
	return r;
}

static ssize_t eq_sread(struct fid_eq *fid, uint32_t *event, void *buf, size_t len, int timeout, uint64_t flags)
{
	struct emp_fi_eq *eq = container_of(fid, struct emp_fi_eq, eq);
	int64_t deadline = timeout < 0 ? -1 : now_ms() + timeout;
	for (;;) {
		ssize_t r = eq_take(eq, event, buf, len, flags);
		if (r != -FI_EAGAIN)
			return r;
		int left = -1;
		if (deadline >= 0) {
			int64_t l = deadline - now_ms();
			if (l <= 0)
				return -FI_EAGAIN;
			left = (int)l;
		}
		struct pollfd p = {.fd = eq->fd, .events = POLLIN};
		poll(&p, 1, left);
	}
}

static const char *eq_strerror(struct fid_eq *fid, int prov_errno, const void *err_data, char *buf, size_t len)
{
	(void)fid, (void)err_data;
	return wc_strerror(prov_errno, buf, len);
}

static int eq_close(struct fid *fid)
{
	struct emp_fi_eq *eq = container_of(fid, struct emp_fi_eq, eq.fid);
	pthread_mutex_lock(&eq->lock);
	int refs = eq->refs;
	pthread_mutex_unlock(&eq->lock);
	if (refs)
		return -FI_EBUSY;
	close(eq->fd);
	pthread_mutex_destroy(&eq->lock);
	free(eq->ring);
	free(eq);
	return 0;
}

static int eq_control(struct fid *fid, int command, void *arg)
{
	struct emp_fi_eq *eq = container_of(fid, struct emp_fi_eq, eq.fid);
	if (!arg)
		return -FI_EINVAL;
	switch (command) {
	case FI_GETWAIT:
		*(int *)arg = eq->fd;
		return 0;
	case FI_GETWAITOBJ:
		*(enum fi_wait_obj *)arg = FI_WAIT_FD;
		return 0;
	default:
		return -FI_ENOSYS;
	}
}

static struct fi_ops eq_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = eq_close,
	.bind = fid_no_bind,
	.control = eq_control,
	.ops_open = fid_no_ops_open,
};

static struct fi_ops_eq eq_ops = {
	.size = sizeof(struct fi_ops_eq),
	.read = eq_read,
	.readerr = eq_readerr,
	.write = eq_write,
	.sread = eq_sread,
	.strerror = eq_strerror,
};

int fab_eq_open(struct fid_fabric *f, struct fi_eq_attr *attr, struct fid_eq **out, void *context)
{
	(void)f;
	if (!attr || !out)
		return -FI_EINVAL;
	if (attr->flags & ~(uint64_t)FI_WRITE)
		return -FI_EBADFLAGS;
	if (attr->wait_set || (attr->wait_obj != FI_WAIT_NONE && attr->wait_obj != FI_WAIT_UNSPEC &&
			       attr->wait_obj != FI_WAIT_FD))
		return -FI_ENOSYS;
	if (attr->size > CQ_SIZE_MAX)
		return -FI_EINVAL;
	struct emp_fi_eq *eq = calloc(1, sizeof *eq);
	if (!eq)
		return -FI_ENOMEM;
	eq->size = attr->size ? attr->size : 64;
	eq->ring = calloc(eq->size, sizeof *eq->ring);
	eq->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!eq->ring || eq->fd < 0) {
		if (eq->fd >= 0)
			close(eq->fd);
		free(eq->ring);
		free(eq);
		return -FI_ENOMEM;
	}
	pthread_mutex_init(&eq->lock, NULL);
	eq->eq.fid.fclass = FI_CLASS_EQ;
	eq->eq.fid.context = context;
	eq->eq.fid.ops = &eq_fi_ops;
	eq->eq.ops = &eq_ops;
	*out = &eq->eq;
	return 0;
}
