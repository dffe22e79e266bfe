/* libemp-fi.so, the libfabric provider "emp": the NIC: opening this
 * process's port, its limits, status and errno mapping. See emp_fi.h and
 * fabric/README.md. */

#include "emp_fi.h"

/* ---- the NIC ---------------------------------------------------------- */

/* This process's NIC: EMP_DEVICE when set (no launcher machinery), else the
 * job's (EMP_CLUSTER + host + local rank, emp_job_open_device). */
struct emp_device *open_nic(int *err)
{
	if (getenv("EMP_DEVICE"))
		return emp_open_device(NULL, err);
	if (getenv("EMP_CLUSTER"))
		return emp_job_open_device(err);
	*err = -ENODEV;
	return NULL;
}

static pthread_mutex_t info_lock = PTHREAD_MUTEX_INITIALIZER;
static int info_state; /* 0: not asked yet, 1: known, < 0: errno */
static struct emp_port_info info_cache;

/* The port's limits for fi_getinfo, learned once by opening a port. */
int query_nic(struct emp_port_info *pi)
{
	pthread_mutex_lock(&info_lock);
	if (info_state == 0) {
		int err = 0;
		struct emp_device *dev = open_nic(&err);
		if (!dev) {
			info_state = err < 0 ? err : -ENODEV;
		} else {
			int r = emp_query_port(dev, &info_cache);
			emp_close_device(dev);
			info_state = r < 0 ? r : 1;
		}
	}
	int st = info_state;
	*pi = info_cache;
	pthread_mutex_unlock(&info_lock);
	return st < 0 ? st : 0;
}

int status_errno(uint32_t status)
{
	switch (status) {
	case EMP_WC_SUCCESS: return 0;
	case EMP_WC_TRUNCATED: return FI_ETRUNC;
	case EMP_WC_FLUSHED:
	/* A collective whose group was destroyed (fi_close of its fid_mc) or
	 * re-created under it. */
	case EMP_WC_GROUP_INVALID:
	case EMP_WC_STALE_GROUP:
	case EMP_WC_CANCELED: return FI_ECANCELED; /* a receive fi_cancel took back */
	case EMP_WC_COLL_MISMATCH: return FI_EINVAL; /* members posted different operations */
	case EMP_WC_REMOTE_PORT_CLOSED: return FI_ECONNREFUSED;
	case EMP_WC_RETRY_LIMIT_EXCEEDED:
	case EMP_WC_RNR_RETRY_EXCEEDED: return FI_ETIMEDOUT;
	case EMP_WC_BAD_KEY:
	case EMP_WC_ACCESS_DENIED:
	case EMP_WC_REMOTE_ACCESS_ERROR: return FI_EACCES;
	case EMP_WC_TOO_LARGE: return FI_EMSGSIZE;
	case EMP_WC_SENDER_ABORTED: return FI_ECONNABORTED;
	case EMP_WC_TABLE_FULL:
	case EMP_WC_REMOTE_TABLE_FULL: return FI_ENOSPC;
	case EMP_WC_BAD_DESCRIPTOR:
	case EMP_WC_INVALID_OP: return FI_EINVAL;
	default: return FI_EIO;
	}
}

ssize_t post_errno(int r)
{
	return (r == -EAGAIN || r == -ENOBUFS) ? -FI_EAGAIN : r;
}

/* Reads an eventfd's counter if it is readable, so the next poll blocks. */
void drain_fd(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	if (fd >= 0 && poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
		uint64_t v;
		ssize_t n = read(fd, &v, sizeof v);
		(void)n;
	}
}

int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int env_number(const char *name, unsigned long max, const char *what, unsigned long *out)
{
	const char *env = getenv(name);
	if (!env || !*env)
		return 0;
	char *end;
	errno = 0;
	unsigned long v = strtoul(env, &end, 10);
	if (errno || *end || env[0] == '-' || v > max) {
		FI_WARN(&emp_prov, FI_LOG_DOMAIN, "%s=%s: %s is a number from 0 to %lu\n", name, env, what, max);
		return -FI_EINVAL;
	}
	*out = v;
	return 0;
}
