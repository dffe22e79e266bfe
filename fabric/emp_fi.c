/* libemp-fi.so: the libfabric provider "emp", an external provider
 * (FI_PROVIDER_PATH) over libemp's C ABI (emp.h). See fabric/README.md for
 * the design and docs/libfabric.md for what is supported.
 *
 * Objects: a domain owns one EMP port (emp_open_device / emp_job_open_device)
 * with its single hardware CQ; the provider's CQs and counters are software
 * queues filled by progress() from that CQ. Every bound object is refcounted
 * so closing something in use fails with -FI_EBUSY instead of leaving
 * dangling pointers. One mutex per domain serialises everything
 * (FI_THREAD_SAFE); waiting blocks on the port's eventfd. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/providers/fi_log.h>
#include <rdma/providers/fi_prov.h>

#include "emp.h"

#define EMP_FI_NAME "emp"
#define EMP_FI_PROV_VERSION FI_VERSION(0, 1)
/* Unregistered buffers up to this size are copied through registered
 * "bounce" slots; larger ones are registered for the operation. */
#define BOUNCE_SIZE (64u * 1024u)
#define BOUNCE_SLOTS_MAX 512u
#define INJECT_SIZE 4096u
/* With both FI_MSG and FI_TAGGED on one endpoint, untagged messages carry
 * this tag bit, which tagged ones may not use (mem_tag_format says so). */
#define MSG_TAG_BIT (1ULL << 63)
#define ADDR_MAGIC 0x31504d45u /* "EMP1" */
#define AV_MAX (1u << 24)
#define CQ_SIZE_MAX (1u << 20)
#define POLL_BATCH 32

#define EMP_PRIMARY_CAPS (FI_MSG | FI_TAGGED | FI_SEND | FI_RECV)
#define EMP_SECONDARY_CAPS (FI_SOURCE | FI_DIRECTED_RECV | FI_LOCAL_COMM | FI_REMOTE_COMM)
#define EMP_CAPS (EMP_PRIMARY_CAPS | EMP_SECONDARY_CAPS)
#define EMP_MR_MODES (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED)
#define EMP_TX_OP_FLAGS (FI_COMPLETION | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE)
#define EMP_RX_OP_FLAGS (FI_COMPLETION)
#define EMP_MR_ACCESS (FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE)

/* What fi_getname returns and fi_av_insert takes: an EMP endpoint. */
struct emp_fi_name {
	uint16_t node;
	uint16_t port;
	uint32_t magic;
};

struct emp_fi_fabric {
	struct fid_fabric fabric;
	int refs;
	pthread_mutex_t lock;
};

enum req_kind { REQ_SEND, REQ_RECV };

struct emp_fi_ep;

struct emp_req {
	struct emp_req *next; /* free list, or the orphan list */
	bool in_use;
	enum req_kind kind;
	struct emp_fi_ep *ep; /* NULL once the endpoint is closed */
	void *context;
	uint64_t cq_flags;  /* FI_SEND|FI_MSG, FI_RECV|FI_TAGGED, ... */
	bool want_entry;    /* a success entry (errors always get one) */
	bool cq_reserved;   /* holds a slot of its CQ */
	void *buf;
	size_t len;
	int slot;	    /* bounce slot, or -1 */
	int64_t tmp_key;    /* registration for this operation, or -1 */
	bool cancelled;	    /* reported as canceled; the NIC still holds it */
	/* A canceled receive's message that landed after all (an orphan). */
	size_t got_len;
	size_t msg_len;
	uint64_t got_tag;
	uint16_t src_node, src_port;
};

struct emp_fi_domain {
	struct fid_domain domain;
	struct emp_fi_fabric *fab;
	pthread_mutex_t lock;
	struct emp_device *dev;
	struct emp_port_info pi;
	int event_fd;
	uint64_t mr_mode;
	int refs;
	struct emp_fi_ep *ep;
	struct emp_req *reqs, *free_reqs;
	size_t nreqs;
	char *bounce;
	uint32_t bounce_key;
	uint64_t bounce_off;
	int *free_slots;
	size_t nslots, nfree_slots;
	struct emp_req *orphans; /* oldest first */
	size_t zombies;		 /* canceled receives the NIC still holds */
};

struct cq_ent {
	void *op_context;
	uint64_t flags;
	size_t len;
	uint64_t tag;
	fi_addr_t src;
	int err;
	size_t olen;
	int prov_errno;
};

struct emp_fi_cq {
	struct fid_cq cq;
	struct emp_fi_domain *dom;
	enum fi_cq_format format;
	enum fi_wait_obj wait;
	struct cq_ent *ring;
	size_t size, head, count, reserved;
	int refs;
	int signal_fd;
};

struct emp_fi_cntr {
	struct fid_cntr cntr;
	struct emp_fi_domain *dom;
	enum fi_wait_obj wait;
	uint64_t value, err;
	int refs;
};

struct emp_fi_av {
	struct fid_av av;
	struct emp_fi_domain *dom;
	enum fi_av_type type;
	uint32_t *table; /* FI_AV_TABLE: index -> node<<16|port, or ADDR_NONE */
	size_t count, cap;
	uint32_t *hkeys; /* reverse map: node<<16|port -> fi_addr */
	fi_addr_t *hvals;
	size_t hcap, hused;
	int refs;
};
#define ADDR_NONE 0xFFFFFFFFu

struct emp_fi_mr {
	struct fid_mr mr;
	struct emp_fi_domain *dom;
	uintptr_t addr;
	size_t len;
};

struct emp_fi_ep {
	struct fid_ep ep;
	struct emp_fi_domain *dom;
	uint64_t caps;
	bool msg_and_tagged;
	struct emp_fi_av *av;
	struct emp_fi_cq *tx_cq, *rx_cq;
	bool tx_selective, rx_selective;
	struct emp_fi_cntr *tx_cntr, *rx_cntr;
	struct emp_fi_eq *eq;
	uint64_t tx_op_flags, rx_op_flags;
	bool enabled;
	size_t tx_inflight, rx_inflight, tx_size, rx_size;
};

static struct fi_provider emp_prov;

/* ---- the NIC ---------------------------------------------------------- */

/* This process's NIC: EMP_DEVICE when set (no launcher machinery), else the
 * job's (EMP_CLUSTER + host + local rank, emp_job_open_device). */
static struct emp_device *open_nic(int *err)
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
static int query_nic(struct emp_port_info *pi)
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

static int status_errno(uint32_t status)
{
	switch (status) {
	case EMP_WC_SUCCESS: return 0;
	case EMP_WC_TRUNCATED: return FI_ETRUNC;
	case EMP_WC_FLUSHED: return FI_ECANCELED;
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

static ssize_t post_errno(int r)
{
	return (r == -EAGAIN || r == -ENOBUFS) ? -FI_EAGAIN : r;
}

/* Reads an eventfd's counter if it is readable, so the next poll blocks. */
static void drain_fd(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	if (fd >= 0 && poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
		uint64_t v;
		ssize_t n = read(fd, &v, sizeof v);
		(void)n;
	}
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- address vector ----------------------------------------------------- */

static inline uint32_t ep_code(uint16_t node, uint16_t port)
{
	return (uint32_t)node << 16 | port;
}

static size_t hslot(uint32_t key, size_t cap)
{
	return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

static fi_addr_t av_reverse(const struct emp_fi_av *av, uint32_t key)
{
	if (!av || !av->hcap)
		return FI_ADDR_NOTAVAIL;
	for (size_t i = hslot(key, av->hcap);; i = (i + 1) & (av->hcap - 1)) {
		if (av->hkeys[i] == ADDR_NONE)
			return FI_ADDR_NOTAVAIL;
		if (av->hkeys[i] == key)
			return av->hvals[i];
	}
}

static void hash_put(uint32_t *keys, fi_addr_t *vals, size_t cap, uint32_t key, fi_addr_t val)
{
	for (size_t i = hslot(key, cap);; i = (i + 1) & (cap - 1)) {
		if (keys[i] == key)
			return; /* the first insertion keeps the name */
		if (keys[i] == ADDR_NONE) {
			keys[i] = key;
			vals[i] = val;
			return;
		}
	}
}

static int av_hash_resize(struct emp_fi_av *av, size_t cap)
{
	uint32_t *keys = malloc(cap * sizeof *keys);
	fi_addr_t *vals = malloc(cap * sizeof *vals);
	if (!keys || !vals) {
		free(keys);
		free(vals);
		return -FI_ENOMEM;
	}
	memset(keys, 0xFF, cap * sizeof *keys);
	for (size_t i = 0; i < av->hcap; i++)
		if (av->hkeys[i] != ADDR_NONE)
			hash_put(keys, vals, cap, av->hkeys[i], av->hvals[i]);
	free(av->hkeys);
	free(av->hvals);
	av->hkeys = keys;
	av->hvals = vals;
	av->hcap = cap;
	return 0;
}

/* Rebuilds the reverse map from scratch (after removals). */
static int av_hash_rebuild(struct emp_fi_av *av, const uint32_t *removed, size_t nremoved)
{
	if (av->type == FI_AV_TABLE) {
		memset(av->hkeys, 0xFF, av->hcap * sizeof *av->hkeys);
		av->hused = 0;
		for (size_t i = 0; i < av->count; i++)
			if (av->table[i] != ADDR_NONE) {
				hash_put(av->hkeys, av->hvals, av->hcap, av->table[i], i);
				av->hused++;
			}
		return 0;
	}
	size_t cap = av->hcap;
	uint32_t *keys = av->hkeys;
	fi_addr_t *vals = av->hvals;
	av->hkeys = NULL;
	av->hvals = NULL;
	av->hcap = 0;
	av->hused = 0;
	int r = av_hash_resize(av, cap ? cap : 16);
	if (r) {
		av->hkeys = keys;
		av->hvals = vals;
		av->hcap = cap;
		return r;
	}
	for (size_t i = 0; i < cap; i++) {
		bool gone = keys[i] == ADDR_NONE;
		for (size_t j = 0; !gone && j < nremoved; j++)
			gone = keys[i] == removed[j];
		if (!gone) {
			hash_put(av->hkeys, av->hvals, av->hcap, keys[i], vals[i]);
			av->hused++;
		}
	}
	free(keys);
	free(vals);
	return 0;
}

/* fi_addr -> EMP endpoint; -FI_EINVAL for an address not in the AV. */
static int av_resolve(const struct emp_fi_av *av, fi_addr_t a, uint16_t *node, uint16_t *port)
{
	uint32_t code;
	if (!av || a == FI_ADDR_UNSPEC || a == FI_ADDR_NOTAVAIL)
		return -FI_EINVAL;
	if (av->type == FI_AV_MAP) {
		if (a > 0xFFFFFFFEull || av_reverse(av, (uint32_t)a) == FI_ADDR_NOTAVAIL)
			return -FI_EINVAL;
		code = (uint32_t)a;
	} else {
		if (a >= av->count || av->table[a] == ADDR_NONE)
			return -FI_EINVAL;
		code = av->table[a];
	}
	*node = code >> 16;
	*port = code & 0xFFFF;
	return 0;
}

static int name_parse(const void *addr, uint32_t *code)
{
	struct emp_fi_name n;
	memcpy(&n, addr, sizeof n);
	if (n.magic != ADDR_MAGIC || n.node == EMP_ANY_NODE || n.port == EMP_ANY_PORT)
		return -FI_EINVAL;
	*code = ep_code(n.node, n.port);
	return 0;
}

static int av_insert(struct fid_av *fid, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags,
		     void *context)
{
	struct emp_fi_av *av = container_of(fid, struct emp_fi_av, av);
	(void)context;
	if (flags & ~FI_MORE)
		return -FI_EBADFLAGS;
	if (count && !addr)
		return -FI_EINVAL;
	pthread_mutex_lock(&av->dom->lock);
	int done = 0;
	for (size_t i = 0; i < count; i++) {
		uint32_t code;
		fi_addr_t out = FI_ADDR_NOTAVAIL;
		if (name_parse((const char *)addr + i * sizeof(struct emp_fi_name), &code) == 0) {
			if ((av->hused + 1) * 2 > av->hcap && av_hash_resize(av, av->hcap ? av->hcap * 2 : 64))
				goto store;
			if (av->type == FI_AV_MAP) {
				out = code;
			} else {
				if (av->count == av->cap) {
					size_t cap = av->cap ? av->cap * 2 : 64;
					uint32_t *t = cap <= AV_MAX ? realloc(av->table, cap * sizeof *t) : NULL;
					if (!t)
						goto store;
					av->table = t;
					av->cap = cap;
				}
				out = av->count;
				av->table[av->count++] = code;
			}
			if (av_reverse(av, code) == FI_ADDR_NOTAVAIL) {
				hash_put(av->hkeys, av->hvals, av->hcap, code, out);
				av->hused++;
			}
			done++;
		}
store:
		if (fi_addr)
			fi_addr[i] = out;
	}
	pthread_mutex_unlock(&av->dom->lock);
	return done;
}

static int av_insertsvc(struct fid_av *av, const char *node, const char *service, fi_addr_t *fi_addr,
			uint64_t flags, void *context)
{
	(void)av, (void)node, (void)service, (void)fi_addr, (void)flags, (void)context;
	return -FI_ENOSYS;
}

static int av_insertsym(struct fid_av *av, const char *node, size_t nodecnt, const char *service, size_t svccnt,
			fi_addr_t *fi_addr, uint64_t flags, void *context)
{
	(void)av, (void)node, (void)nodecnt, (void)service, (void)svccnt, (void)fi_addr, (void)flags, (void)context;
	return -FI_ENOSYS;
}

static int av_remove(struct fid_av *fid, fi_addr_t *fi_addr, size_t count, uint64_t flags)
{
	struct emp_fi_av *av = container_of(fid, struct emp_fi_av, av);
	if (flags)
		return -FI_EBADFLAGS;
	if (count && !fi_addr)
		return -FI_EINVAL;
	pthread_mutex_lock(&av->dom->lock);
	int r = 0;
	uint32_t *removed = calloc(count ? count : 1, sizeof *removed);
	if (!removed) {
		r = -FI_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < count; i++) {
		uint16_t node, port;
		if (av_resolve(av, fi_addr[i], &node, &port)) {
			r = -FI_EINVAL;
			goto out;
		}
		removed[i] = ep_code(node, port);
	}
	for (size_t i = 0; i < count; i++)
		if (av->type == FI_AV_TABLE)
			av->table[fi_addr[i]] = ADDR_NONE;
	r = av_hash_rebuild(av, removed, count);
out:
	free(removed);
	pthread_mutex_unlock(&av->dom->lock);
	return r;
}

static void name_fill(struct emp_fi_name *n, uint32_t code)
{
	n->node = code >> 16;
	n->port = code & 0xFFFF;
	n->magic = ADDR_MAGIC;
}

static int name_copy_out(uint32_t code, void *addr, size_t *addrlen)
{
	struct emp_fi_name n;
	name_fill(&n, code);
	size_t room = *addrlen;
	*addrlen = sizeof n;
	if (!addr || room < sizeof n) {
		if (addr && room)
			memcpy(addr, &n, room);
		return -FI_ETOOSMALL;
	}
	memcpy(addr, &n, sizeof n);
	return 0;
}

static int av_lookup(struct fid_av *fid, fi_addr_t fi_addr, void *addr, size_t *addrlen)
{
	struct emp_fi_av *av = container_of(fid, struct emp_fi_av, av);
	uint16_t node, port;
	if (!addrlen)
		return -FI_EINVAL;
	pthread_mutex_lock(&av->dom->lock);
	int r = av_resolve(av, fi_addr, &node, &port);
	if (r == 0 && av->type == FI_AV_MAP && av_reverse(av, ep_code(node, port)) == FI_ADDR_NOTAVAIL)
		r = -FI_ENOENT;
	pthread_mutex_unlock(&av->dom->lock);
	if (r)
		return r == -FI_EINVAL ? -FI_ENOENT : r;
	return name_copy_out(ep_code(node, port), addr, addrlen);
}

static const char *av_straddr(struct fid_av *fid, const void *addr, char *buf, size_t *len)
{
	(void)fid;
	struct emp_fi_name n;
	char tmp[64];
	if (!addr || !buf || !len)
		return NULL;
	memcpy(&n, addr, sizeof n);
	int w = n.magic == ADDR_MAGIC ? snprintf(tmp, sizeof tmp, "fi_emp://%u:%u", n.node, n.port)
				      : snprintf(tmp, sizeof tmp, "fi_emp://invalid");
	if (*len)
		snprintf(buf, *len, "%s", tmp);
	*len = (size_t)w + 1;
	return buf;
}

static int av_set(struct fid_av *av, struct fi_av_set_attr *attr, struct fid_av_set **set, void *context)
{
	(void)av, (void)attr, (void)set, (void)context;
	return -FI_ENOSYS;
}

static int fid_no_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
	(void)fid, (void)bfid, (void)flags;
	return -FI_ENOSYS;
}

static int fid_no_control(struct fid *fid, int command, void *arg)
{
	(void)fid, (void)command, (void)arg;
	return -FI_ENOSYS;
}

static int fid_no_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops, void *context)
{
	(void)fid, (void)name, (void)flags, (void)ops, (void)context;
	return -FI_ENOSYS;
}

static int av_close(struct fid *fid)
{
	struct emp_fi_av *av = container_of(fid, struct emp_fi_av, av.fid);
	struct emp_fi_domain *dom = av->dom;
	pthread_mutex_lock(&dom->lock);
	if (av->refs) {
		pthread_mutex_unlock(&dom->lock);
		return -FI_EBUSY;
	}
	dom->refs--;
	pthread_mutex_unlock(&dom->lock);
	free(av->table);
	free(av->hkeys);
	free(av->hvals);
	free(av);
	return 0;
}

static struct fi_ops av_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = av_close,
	.bind = fid_no_bind,
	.control = fid_no_control,
	.ops_open = fid_no_ops_open,
};

static struct fi_ops_av av_ops = {
	.size = sizeof(struct fi_ops_av),
	.insert = av_insert,
	.insertsvc = av_insertsvc,
	.insertsym = av_insertsym,
	.remove = av_remove,
	.lookup = av_lookup,
	.straddr = av_straddr,
	.av_set = av_set,
};

static int av_open(struct fid_domain *fid, struct fi_av_attr *attr, struct fid_av **out, void *context)
{
	struct emp_fi_domain *dom = container_of(fid, struct emp_fi_domain, domain);
	if (!attr || !out)
		return -FI_EINVAL;
	enum fi_av_type type = attr->type == FI_AV_UNSPEC ? FI_AV_MAP : attr->type;
	if (type != FI_AV_MAP && type != FI_AV_TABLE)
		return -FI_EINVAL;
	if (attr->rx_ctx_bits || attr->name)
		return -FI_ENOSYS; /* no scalable endpoints, no shared AVs */
	if (attr->flags & ~(uint64_t)FI_SYMMETRIC)
		return attr->flags & FI_EVENT ? -FI_ENOEQ : -FI_EBADFLAGS;
	if (attr->count > AV_MAX)
		return -FI_EINVAL;
	struct emp_fi_av *av = calloc(1, sizeof *av);
	if (!av)
		return -FI_ENOMEM;
	av->av.fid.fclass = FI_CLASS_AV;
	av->av.fid.context = context;
	av->av.fid.ops = &av_fi_ops;
	av->av.ops = &av_ops;
	av->dom = dom;
	av->type = type;
	size_t cap = 64;
	while (cap < attr->count * 2)
		cap *= 2;
	if (av_hash_resize(av, cap)) {
		free(av);
		return -FI_ENOMEM;
	}
	pthread_mutex_lock(&dom->lock);
	dom->refs++;
	pthread_mutex_unlock(&dom->lock);
	*out = &av->av;
	return 0;
}

/* ---- event queue ------------------------------------------------------------ */

/* EMP endpoints are connectionless and the AV takes no FI_EVENT, so the
 * provider itself posts no events: an EQ carries what the application
 * writes (fi_eq_write), and endpoints may be bound to one. */
#define EQ_ENTRY_MAX 128

struct eq_ent {
	uint32_t event;
	size_t len;
	uint8_t data[EQ_ENTRY_MAX];
};

struct emp_fi_eq {
	struct fid_eq eq;
	pthread_mutex_t lock;
	struct eq_ent *ring;
	size_t size, head, count;
	int fd; /* readable while entries wait */
	int refs;
};

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

static ssize_t eq_write(struct fid_eq *fid, uint32_t event, const void *buf, size_t len, uint64_t flags)
{
	struct emp_fi_eq *eq = container_of(fid, struct emp_fi_eq, eq);
	if (flags)
		return -FI_EBADFLAGS;
	if (len > EQ_ENTRY_MAX || (len && !buf))
		return -FI_EINVAL;
	pthread_mutex_lock(&eq->lock);
	ssize_t r = -FI_EAGAIN;
	if (eq->count < eq->size) {
		struct eq_ent *e = &eq->ring[(eq->head + eq->count) % eq->size];
		e->event = event;
		e->len = len;
		memcpy(e->data, buf, len);
		eq->count++;
		uint64_t one = 1;
		ssize_t w = write(eq->fd, &one, sizeof one);
		(void)w;
		r = (ssize_t)len;
	}
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
	const char *s = emp_wc_status_str((uint32_t)prov_errno);
	if (buf && len) {
		snprintf(buf, len, "%s", s);
		return buf;
	}
	return s;
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

static int fab_eq_open(struct fid_fabric *f, struct fi_eq_attr *attr, struct fid_eq **out, void *context)
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

/* ---- requests, bounce slots, progress ---------------------------------- */

static struct emp_req *req_get(struct emp_fi_domain *dom)
{
	struct emp_req *r = dom->free_reqs;
	if (!r)
		return NULL;
	dom->free_reqs = r->next;
	memset(r, 0, sizeof *r);
	r->in_use = true;
	r->slot = -1;
	r->tmp_key = -1;
	return r;
}

static inline char *slot_ptr(struct emp_fi_domain *dom, int slot)
{
	return dom->bounce + (size_t)slot * BOUNCE_SIZE;
}

/* Gives back what a request holds and the request itself. */
static void req_release(struct emp_fi_domain *dom, struct emp_req *r)
{
	if (r->tmp_key >= 0)
		emp_dereg_mr(dom->dev, (uint32_t)r->tmp_key);
	if (r->slot >= 0)
		dom->free_slots[dom->nfree_slots++] = r->slot;
	struct emp_fi_ep *ep = r->ep;
	if (ep) {
		if (r->kind == REQ_SEND)
			ep->tx_inflight--;
		else
			ep->rx_inflight--;
		struct emp_fi_cq *cq = r->kind == REQ_SEND ? ep->tx_cq : ep->rx_cq;
		if (r->cq_reserved && cq)
			cq->reserved--;
	}
	r->in_use = false;
	r->next = dom->free_reqs;
	dom->free_reqs = r;
}

/* Appends an entry (its slot was reserved when the operation was posted). */
static void cq_push(struct emp_fi_cq *cq, const struct cq_ent *e)
{
	size_t tail = (cq->head + cq->count) % cq->size;
	cq->ring[tail] = *e;
	cq->count++;
}

static void req_report(struct emp_req *r, int err, size_t len, size_t olen, uint64_t tag, uint16_t node,
		       uint16_t port, uint32_t status)
{
	struct emp_fi_ep *ep = r->ep;
	bool rx = r->kind == REQ_RECV;
	struct emp_fi_cq *cq = rx ? ep->rx_cq : ep->tx_cq;
	struct emp_fi_cntr *cntr = rx ? ep->rx_cntr : ep->tx_cntr;
	if (cntr) {
		if (err)
			cntr->err++;
		else
			cntr->value++;
	}
	if (!cq || !r->cq_reserved || (!err && !r->want_entry))
		return;
	struct cq_ent e = {
		.op_context = r->context,
		.flags = r->cq_flags,
		.len = rx ? len : 0,
		.tag = (r->cq_flags & FI_TAGGED) ? tag : 0,
		.src = FI_ADDR_NOTAVAIL,
		.err = err,
		.olen = olen,
		.prov_errno = (int)status,
	};
	if (rx && (ep->caps & FI_SOURCE))
		e.src = av_reverse(ep->av, ep_code(node, port));
	cq_push(cq, &e);
	cq->reserved--;
	r->cq_reserved = false;
}

static void complete(struct emp_fi_domain *dom, const struct emp_wc *wc)
{
	struct emp_req *r = (struct emp_req *)(uintptr_t)wc->wr_id;
	if (r < dom->reqs || r >= dom->reqs + dom->nreqs || !r->in_use)
		return; /* not ours */
	if (r->kind == REQ_RECV && r->cancelled) {
		dom->zombies--;
		bool landed = r->ep && (wc->status == EMP_WC_SUCCESS || wc->status == EMP_WC_TRUNCATED);
		if (!landed) {
			req_release(dom, r);
			return;
		}
		/* A message matched a receive the application canceled: keep
		 * it for the next matching receive. */
		r->got_len = wc->byte_len;
		r->msg_len = wc->msg_len > wc->byte_len ? wc->msg_len : wc->byte_len;
		r->got_tag = wc->tag;
		r->src_node = wc->src_node;
		r->src_port = wc->src_port;
		r->next = NULL;
		struct emp_req **p = &dom->orphans;
		while (*p)
			p = &(*p)->next;
		*p = r;
		return;
	}
	if (!r->ep) {
		req_release(dom, r);
		return;
	}
	size_t len = wc->byte_len;
	if (r->kind == REQ_RECV && r->slot >= 0 && len)
		memcpy(r->buf, slot_ptr(dom, r->slot), len < r->len ? len : r->len);
	int err = status_errno(wc->status);
	size_t olen = (err == FI_ETRUNC && wc->msg_len > len) ? wc->msg_len - len : 0;
	req_report(r, err, len, olen, wc->tag, wc->src_node, wc->src_port, wc->status);
	req_release(dom, r);
}

/* Takes every completion the port has. Called with the domain lock. */
static void progress(struct emp_fi_domain *dom)
{
	struct emp_wc wc[POLL_BATCH];
	for (;;) {
		int n = emp_poll_cq(dom->dev, wc, POLL_BATCH);
		for (int i = 0; i < n; i++)
			complete(dom, &wc[i]);
		if (n < POLL_BATCH)
			return;
	}
}

/* Arms the port's event, then takes what came meanwhile: afterwards the
 * eventfd fires on the next completion. */
static void arm(struct emp_fi_domain *dom)
{
	drain_fd(dom->event_fd);
	emp_req_notify_cq(dom->dev);
	progress(dom);
}

/* Blocks until the port's event (or fd2) fires or timeout_ms passes. */
static void wait_event(struct emp_fi_domain *dom, int fd2, int timeout_ms)
{
	struct pollfd p[2] = {{.fd = dom->event_fd, .events = POLLIN}, {.fd = fd2, .events = POLLIN}};
	if (dom->event_fd < 0) {
		/* A NIC without an interrupt: sleep briefly, then poll again. */
		usleep(50);
		return;
	}
	poll(p, fd2 >= 0 ? 2 : 1, timeout_ms);
}

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
		*o = (struct fi_cq_data_entry){e->op_context, e->flags, e->len, NULL, 0};
		break;
	}
	case FI_CQ_FORMAT_TAGGED: {
		struct fi_cq_tagged_entry *o = (struct fi_cq_tagged_entry *)buf + i;
		*o = (struct fi_cq_tagged_entry){e->op_context, e->flags, e->len, NULL, 0, e->tag};
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
	pthread_mutex_unlock(&cq->dom->lock);
	/* Nothing yet: let the emulated NIC (a process that may share this
	 * core) run, instead of spinning through its time slice. */
	if (n == -FI_EAGAIN)
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
		buf->data = 0;
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
	const char *s = emp_wc_status_str((uint32_t)prov_errno);
	if (buf && len) {
		snprintf(buf, len, "%s", s);
		return buf;
	}
	return s;
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
static int wait_control(enum fi_wait_obj wait, int event_fd, int command, void *arg)
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
static int wait_obj_pick(enum fi_wait_obj asked, const struct emp_fi_domain *dom, enum fi_wait_obj *out)
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

static int cq_open(struct fid_domain *fid, struct fi_cq_attr *attr, struct fid_cq **out, void *context)
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

static int cntr_open(struct fid_domain *fid, struct fi_cntr_attr *attr, struct fid_cntr **out, void *context)
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

/* ---- memory registration --------------------------------------------------- */

static int mr_close(struct fid *fid)
{
	struct emp_fi_mr *mr = container_of(fid, struct emp_fi_mr, mr.fid);
	struct emp_fi_domain *dom = mr->dom;
	int r = emp_dereg_mr(dom->dev, (uint32_t)mr->mr.key);
	pthread_mutex_lock(&dom->lock);
	dom->refs--;
	pthread_mutex_unlock(&dom->lock);
	free(mr);
	return r < 0 ? r : 0;
}

static struct fi_ops mr_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = mr_close,
	.bind = fid_no_bind,
	.control = fid_no_control,
	.ops_open = fid_no_ops_open,
};

static int mr_reg(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset,
		  uint64_t requested_key, uint64_t flags, struct fid_mr **out, void *context)
{
	struct emp_fi_domain *dom = container_of(fid, struct emp_fi_domain, domain.fid);
	(void)offset, (void)requested_key; /* keys are the NIC's (FI_MR_PROV_KEY); no RMA yet */
	if (fid->fclass != FI_CLASS_DOMAIN || !out)
		return -FI_EINVAL;
	if (flags)
		return -FI_EBADFLAGS;
	if ((access & ~(uint64_t)EMP_MR_ACCESS) || (!buf && len) || !len)
		return -FI_EINVAL;
	uint32_t emp_access = EMP_ACCESS_LOCAL_READ | EMP_ACCESS_LOCAL_WRITE;
	if (access & FI_REMOTE_READ)
		emp_access |= EMP_ACCESS_REMOTE_READ;
	if (access & FI_REMOTE_WRITE)
		emp_access |= EMP_ACCESS_REMOTE_WRITE;
	struct emp_fi_mr *mr = calloc(1, sizeof *mr);
	if (!mr)
		return -FI_ENOMEM;
	int64_t key = emp_reg_mr(dom->dev, buf, len, emp_access);
	if (key < 0) {
		free(mr);
		return (int)key;
	}
	mr->mr.fid.fclass = FI_CLASS_MR;
	mr->mr.fid.context = context;
	mr->mr.fid.ops = &mr_fi_ops;
	mr->mr.mem_desc = mr;
	mr->mr.key = (uint64_t)key;
	mr->dom = dom;
	mr->addr = (uintptr_t)buf;
	mr->len = len;
	pthread_mutex_lock(&dom->lock);
	dom->refs++;
	pthread_mutex_unlock(&dom->lock);
	*out = &mr->mr;
	return 0;
}

static int mr_regv(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access, uint64_t offset,
		   uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context)
{
	if (count != 1 || !iov)
		return -FI_EINVAL; /* mr_iov_limit is 1 */
	return mr_reg(fid, iov[0].iov_base, iov[0].iov_len, access, offset, requested_key, flags, mr, context);
}

static int mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags, struct fid_mr **mr)
{
	if (!attr)
		return -FI_EINVAL;
	if (attr->iface != FI_HMEM_SYSTEM)
		return -FI_ENOSYS;
	return mr_regv(fid, attr->mr_iov, attr->iov_count, attr->access, attr->offset, attr->requested_key, flags,
		       mr, attr->context);
}

static struct fi_ops_mr mr_ops = {
	.size = sizeof(struct fi_ops_mr),
	.reg = mr_reg,
	.regv = mr_regv,
	.regattr = mr_regattr,
};

/* ---- data transfer ------------------------------------------------------------ */

/* Where the NIC reads or writes [buf, buf+len): the caller's registration
 * (desc), a bounce slot, or a registration for this operation alone. */
static int place(struct emp_fi_domain *dom, struct emp_req *r, const void *buf, size_t len, void *desc,
		 bool copy_in, bool force_bounce, struct emp_sge *sge)
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
		if (!dom->nfree_slots)
			return -FI_EAGAIN;
		r->slot = dom->free_slots[--dom->nfree_slots];
		if (copy_in)
			memcpy(slot_ptr(dom, r->slot), buf, len);
		*sge = (struct emp_sge){dom->bounce_key, (uint32_t)len, dom->bounce_off + (uint64_t)r->slot * BOUNCE_SIZE};
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

static ssize_t do_send(struct emp_fi_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t tag,
		       bool tagged, void *context, uint64_t flags, unsigned how)
{
	struct emp_fi_domain *dom = ep->dom;
	if (!(ep->caps & (tagged ? FI_TAGGED : FI_MSG)))
		return -FI_EOPNOTSUPP;
	if (!ep->enabled)
		return -FI_EOPBADSTATE;
	if (flags & (FI_REMOTE_CQ_DATA | FI_DELIVERY_COMPLETE | FI_MATCH_COMPLETE | FI_FENCE | FI_MULTICAST))
		return -FI_EBADFLAGS;
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
	if (ep->tx_inflight >= ep->tx_size)
		progress(dom);
	struct emp_fi_cq *cq = ep->tx_cq;
	bool need_cq = cq && !(how & SEND_NO_ENTRY);
	if (ep->tx_inflight >= ep->tx_size || (need_cq && cq->count + cq->reserved >= cq->size)) {
		ret = -FI_EAGAIN;
		goto out;
	}
	struct emp_req *r = req_get(dom);
	if (!r) {
		ret = -FI_EAGAIN;
		goto out;
	}
	r->kind = REQ_SEND;
	r->ep = ep;
	r->context = context;
	r->cq_flags = FI_SEND | (tagged ? FI_TAGGED : FI_MSG);
	r->want_entry = !(how & SEND_NO_ENTRY) && (!ep->tx_selective || (flags & FI_COMPLETION));
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
	ret = post_errno(emp_post_send(dom->dev, (uint64_t)(uintptr_t)r, node, port, emp_tag, &sge, (size_t)n));
	if (ret) {
		r->ep = NULL;
		req_release(dom, r);
		goto out;
	}
	ep->tx_inflight++;
	if (need_cq) {
		cq->reserved++;
		r->cq_reserved = true;
	}
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

static ssize_t do_recv(struct emp_fi_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag,
		       uint64_t ignore, bool tagged, void *context, uint64_t flags)
{
	struct emp_fi_domain *dom = ep->dom;
	if (!(ep->caps & (tagged ? FI_TAGGED : FI_MSG)))
		return -FI_EOPNOTSUPP;
	if (!ep->enabled)
		return -FI_EOPBADSTATE;
	if (flags & (FI_PEEK | FI_CLAIM | FI_DISCARD | FI_MULTI_RECV))
		return -FI_EOPNOTSUPP; /* no unexpected-message store to probe (yet) */
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
	for (struct emp_req **p = &dom->orphans; *p; p = &(*p)->next) {
		struct emp_req *o = *p;
		if (o->ep != ep || !orphan_matches(o, node, port, emp_tag, emp_ignore))
			continue;
		*p = o->next;
		size_t n = o->got_len < len ? o->got_len : len;
		if (n)
			memcpy(buf, slot_ptr(dom, o->slot), n);
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
	ret = post_errno(emp_post_recv(dom->dev, (uint64_t)(uintptr_t)r, node, port, emp_tag, emp_ignore, &sge,
				       (size_t)n));
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
out:
	pthread_mutex_unlock(&dom->lock);
	return ret;
}

#define EP(fid) container_of(fid, struct emp_fi_ep, ep)

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
	return do_recv(EP(ep), buf, len, desc, src, 0, 0, false, context, EP(ep)->rx_op_flags);
}

static ssize_t msg_recvv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src,
			 void *context)
{
	void *b, *d;
	size_t l;
	int r = one_iov(iov, desc, count, &b, &l, &d);
	return r ? r : do_recv(EP(ep), b, l, d, src, 0, 0, false, context, EP(ep)->rx_op_flags);
}

static ssize_t msg_recvmsg(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags)
{
	void *b, *d;
	size_t l;
	if (!msg)
		return -FI_EINVAL;
	int r = one_iov(msg->msg_iov, msg->desc, msg->iov_count, &b, &l, &d);
	return r ? r : do_recv(EP(ep), b, l, d, msg->addr, 0, 0, false, msg->context, flags);
}

static ssize_t msg_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, void *context)
{
	return do_send(EP(ep), buf, len, desc, dest, 0, false, context, EP(ep)->tx_op_flags, 0);
}

static ssize_t msg_sendv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest,
			 void *context)
{
	void *b, *d;
	size_t l;
	int r = one_iov(iov, desc, count, &b, &l, &d);
	return r ? r : do_send(EP(ep), b, l, d, dest, 0, false, context, EP(ep)->tx_op_flags, 0);
}

static ssize_t msg_sendmsg(struct fid_ep *ep, const struct fi_msg *msg, uint64_t flags)
{
	void *b, *d;
	size_t l;
	if (!msg)
		return -FI_EINVAL;
	int r = one_iov(msg->msg_iov, msg->desc, msg->iov_count, &b, &l, &d);
	return r ? r
		 : do_send(EP(ep), b, l, d, msg->addr, 0, false, msg->context, flags,
			   (flags & FI_INJECT) ? SEND_INJECT : 0);
}

static ssize_t msg_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest)
{
	return do_send(EP(ep), buf, len, NULL, dest, 0, false, NULL, 0, SEND_INJECT | SEND_NO_ENTRY);
}

static ssize_t msg_senddata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
			    fi_addr_t dest, void *context)
{
	(void)ep, (void)buf, (void)len, (void)desc, (void)data, (void)dest, (void)context;
	return -FI_ENOSYS; /* no FI_REMOTE_CQ_DATA: EMP messages carry no immediate data */
}

static ssize_t msg_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest)
{
	(void)ep, (void)buf, (void)len, (void)data, (void)dest;
	return -FI_ENOSYS;
}

static struct fi_ops_msg msg_ops = {
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
	return do_recv(EP(ep), buf, len, desc, src, tag, ignore, true, context, EP(ep)->rx_op_flags);
}

static ssize_t tag_recvv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src,
			 uint64_t tag, uint64_t ignore, void *context)
{
	void *b, *d;
	size_t l;
	int r = one_iov(iov, desc, count, &b, &l, &d);
	return r ? r : do_recv(EP(ep), b, l, d, src, tag, ignore, true, context, EP(ep)->rx_op_flags);
}

static ssize_t tag_recvmsg(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags)
{
	void *b, *d;
	size_t l;
	if (!msg)
		return -FI_EINVAL;
	int r = one_iov(msg->msg_iov, msg->desc, msg->iov_count, &b, &l, &d);
	return r ? r : do_recv(EP(ep), b, l, d, msg->addr, msg->tag, msg->ignore, true, msg->context, flags);
}

static ssize_t tag_send(struct fid_ep *ep, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t tag,
			void *context)
{
	return do_send(EP(ep), buf, len, desc, dest, tag, true, context, EP(ep)->tx_op_flags, 0);
}

static ssize_t tag_sendv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest,
			 uint64_t tag, void *context)
{
	void *b, *d;
	size_t l;
	int r = one_iov(iov, desc, count, &b, &l, &d);
	return r ? r : do_send(EP(ep), b, l, d, dest, tag, true, context, EP(ep)->tx_op_flags, 0);
}

static ssize_t tag_sendmsg(struct fid_ep *ep, const struct fi_msg_tagged *msg, uint64_t flags)
{
	void *b, *d;
	size_t l;
	if (!msg)
		return -FI_EINVAL;
	int r = one_iov(msg->msg_iov, msg->desc, msg->iov_count, &b, &l, &d);
	return r ? r
		 : do_send(EP(ep), b, l, d, msg->addr, msg->tag, true, msg->context, flags,
			   (flags & FI_INJECT) ? SEND_INJECT : 0);
}

static ssize_t tag_inject(struct fid_ep *ep, const void *buf, size_t len, fi_addr_t dest, uint64_t tag)
{
	return do_send(EP(ep), buf, len, NULL, dest, tag, true, NULL, 0, SEND_INJECT | SEND_NO_ENTRY);
}

static ssize_t tag_senddata(struct fid_ep *ep, const void *buf, size_t len, void *desc, uint64_t data,
			    fi_addr_t dest, uint64_t tag, void *context)
{
	(void)ep, (void)buf, (void)len, (void)desc, (void)data, (void)dest, (void)tag, (void)context;
	return -FI_ENOSYS;
}

static ssize_t tag_injectdata(struct fid_ep *ep, const void *buf, size_t len, uint64_t data, fi_addr_t dest,
			      uint64_t tag)
{
	(void)ep, (void)buf, (void)len, (void)data, (void)dest, (void)tag;
	return -FI_ENOSYS;
}

static struct fi_ops_tagged tagged_ops = {
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

/* FI_RMA, FI_ATOMIC and FI_COLLECTIVE are not offered yet: every call says so
 * instead of leaving a NULL function pointer for the inline wrappers to call. */
#define NOSYS_BODY return -FI_ENOSYS
static ssize_t rma_read(struct fid_ep *e, void *b, size_t l, void *d, fi_addr_t s, uint64_t a, uint64_t k, void *c)
{ (void)e, (void)b, (void)l, (void)d, (void)s, (void)a, (void)k, (void)c; NOSYS_BODY; }
static ssize_t rma_readv(struct fid_ep *e, const struct iovec *i, void **d, size_t n, fi_addr_t s, uint64_t a,
			 uint64_t k, void *c)
{ (void)e, (void)i, (void)d, (void)n, (void)s, (void)a, (void)k, (void)c; NOSYS_BODY; }
static ssize_t rma_msg(struct fid_ep *e, const struct fi_msg_rma *m, uint64_t f) { (void)e, (void)m, (void)f; NOSYS_BODY; }
static ssize_t rma_write(struct fid_ep *e, const void *b, size_t l, void *d, fi_addr_t s, uint64_t a, uint64_t k,
			 void *c)
{ (void)e, (void)b, (void)l, (void)d, (void)s, (void)a, (void)k, (void)c; NOSYS_BODY; }
static ssize_t rma_writev(struct fid_ep *e, const struct iovec *i, void **d, size_t n, fi_addr_t s, uint64_t a,
			  uint64_t k, void *c)
{ (void)e, (void)i, (void)d, (void)n, (void)s, (void)a, (void)k, (void)c; NOSYS_BODY; }
static ssize_t rma_inject(struct fid_ep *e, const void *b, size_t l, fi_addr_t s, uint64_t a, uint64_t k)
{ (void)e, (void)b, (void)l, (void)s, (void)a, (void)k; NOSYS_BODY; }
static ssize_t rma_writedata(struct fid_ep *e, const void *b, size_t l, void *d, uint64_t x, fi_addr_t s,
			     uint64_t a, uint64_t k, void *c)
{ (void)e, (void)b, (void)l, (void)d, (void)x, (void)s, (void)a, (void)k, (void)c; NOSYS_BODY; }
static ssize_t rma_injectdata(struct fid_ep *e, const void *b, size_t l, uint64_t x, fi_addr_t s, uint64_t a,
			      uint64_t k)
{ (void)e, (void)b, (void)l, (void)x, (void)s, (void)a, (void)k; NOSYS_BODY; }

static struct fi_ops_rma rma_ops = {
	.size = sizeof(struct fi_ops_rma),
	.read = rma_read, .readv = rma_readv, .readmsg = rma_msg,
	.write = rma_write, .writev = rma_writev, .writemsg = rma_msg,
	.inject = rma_inject, .writedata = rma_writedata, .injectdata = rma_injectdata,
};

static ssize_t at_write(struct fid_ep *e, const void *b, size_t n, void *d, fi_addr_t s, uint64_t a, uint64_t k,
			enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_writev(struct fid_ep *e, const struct fi_ioc *i, void **d, size_t n, fi_addr_t s, uint64_t a,
			 uint64_t k, enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)i, (void)d, (void)n, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_writemsg(struct fid_ep *e, const struct fi_msg_atomic *m, uint64_t f) { (void)e, (void)m, (void)f; NOSYS_BODY; }
static ssize_t at_inject(struct fid_ep *e, const void *b, size_t n, fi_addr_t s, uint64_t a, uint64_t k,
			 enum fi_datatype t, enum fi_op o)
{ (void)e, (void)b, (void)n, (void)s, (void)a, (void)k, (void)t, (void)o; NOSYS_BODY; }
static ssize_t at_rw(struct fid_ep *e, const void *b, size_t n, void *d, void *r, void *rd, fi_addr_t s, uint64_t a,
		     uint64_t k, enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)r, (void)rd, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_rwv(struct fid_ep *e, const struct fi_ioc *i, void **d, size_t n, struct fi_ioc *r, void **rd,
		      size_t rn, fi_addr_t s, uint64_t a, uint64_t k, enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)i, (void)d, (void)n, (void)r, (void)rd, (void)rn, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_rwmsg(struct fid_ep *e, const struct fi_msg_atomic *m, struct fi_ioc *r, void **rd, size_t rn,
			uint64_t f)
{ (void)e, (void)m, (void)r, (void)rd, (void)rn, (void)f; NOSYS_BODY; }
static ssize_t at_cw(struct fid_ep *e, const void *b, size_t n, void *d, const void *cmp, void *cd, void *r, void *rd,
		     fi_addr_t s, uint64_t a, uint64_t k, enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)cmp, (void)cd, (void)r, (void)rd, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_cwv(struct fid_ep *e, const struct fi_ioc *i, void **d, size_t n, const struct fi_ioc *cmp,
		      void **cd, size_t cn, struct fi_ioc *r, void **rd, size_t rn, fi_addr_t s, uint64_t a,
		      uint64_t k, enum fi_datatype t, enum fi_op o, void *c)
{ (void)e, (void)i, (void)d, (void)n, (void)cmp, (void)cd, (void)cn, (void)r, (void)rd, (void)rn, (void)s, (void)a, (void)k, (void)t, (void)o, (void)c; NOSYS_BODY; }
static ssize_t at_cwmsg(struct fid_ep *e, const struct fi_msg_atomic *m, const struct fi_ioc *cmp, void **cd,
			size_t cn, struct fi_ioc *r, void **rd, size_t rn, uint64_t f)
{ (void)e, (void)m, (void)cmp, (void)cd, (void)cn, (void)r, (void)rd, (void)rn, (void)f; NOSYS_BODY; }
static int at_valid(struct fid_ep *e, enum fi_datatype t, enum fi_op o, size_t *n)
{ (void)e, (void)t, (void)o, (void)n; NOSYS_BODY; }

static struct fi_ops_atomic atomic_ops = {
	.size = sizeof(struct fi_ops_atomic),
	.write = at_write, .writev = at_writev, .writemsg = at_writemsg, .inject = at_inject,
	.readwrite = at_rw, .readwritev = at_rwv, .readwritemsg = at_rwmsg,
	.compwrite = at_cw, .compwritev = at_cwv, .compwritemsg = at_cwmsg,
	.writevalid = at_valid, .readwritevalid = at_valid, .compwritevalid = at_valid,
};

static ssize_t co_barrier(struct fid_ep *e, fi_addr_t a, void *c) { (void)e, (void)a, (void)c; NOSYS_BODY; }
static ssize_t co_barrier2(struct fid_ep *e, fi_addr_t a, uint64_t f, void *c) { (void)e, (void)a, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_bcast(struct fid_ep *e, void *b, size_t n, void *d, fi_addr_t a, fi_addr_t r, enum fi_datatype t,
			uint64_t f, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)a, (void)r, (void)t, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_a2a(struct fid_ep *e, const void *b, size_t n, void *d, void *r, void *rd, fi_addr_t a,
		      enum fi_datatype t, uint64_t f, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)r, (void)rd, (void)a, (void)t, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_red(struct fid_ep *e, const void *b, size_t n, void *d, void *r, void *rd, fi_addr_t a,
		      enum fi_datatype t, enum fi_op o, uint64_t f, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)r, (void)rd, (void)a, (void)t, (void)o, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_rooted_red(struct fid_ep *e, const void *b, size_t n, void *d, void *r, void *rd, fi_addr_t a,
			     fi_addr_t root, enum fi_datatype t, enum fi_op o, uint64_t f, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)r, (void)rd, (void)a, (void)root, (void)t, (void)o, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_rooted(struct fid_ep *e, const void *b, size_t n, void *d, void *r, void *rd, fi_addr_t a,
			 fi_addr_t root, enum fi_datatype t, uint64_t f, void *c)
{ (void)e, (void)b, (void)n, (void)d, (void)r, (void)rd, (void)a, (void)root, (void)t, (void)f, (void)c; NOSYS_BODY; }
static ssize_t co_msg(struct fid_ep *e, const struct fi_msg_collective *m, struct fi_ioc *r, void **rd, size_t rn,
		      uint64_t f)
{ (void)e, (void)m, (void)r, (void)rd, (void)rn, (void)f; NOSYS_BODY; }

static struct fi_ops_collective coll_ops = {
	.size = sizeof(struct fi_ops_collective),
	.barrier = co_barrier, .broadcast = co_bcast, .alltoall = co_a2a, .allreduce = co_red,
	.allgather = co_a2a, .reduce_scatter = co_red, .reduce = co_rooted_red, .scatter = co_rooted,
	.gather = co_rooted, .msg = co_msg, .barrier2 = co_barrier2,
};

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
		if (!q->in_use || q->ep != ep || q->kind != REQ_RECV || q->cancelled || q->context != context)
			continue;
		/* EMP cannot take a posted receive back from the NIC. One whose
		 * bytes land in a bounce slot (or nowhere) can be retired here:
		 * a message that still matches it is kept for the next receive.
		 * One placed in the caller's own memory cannot. */
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
	(void)ep, (void)addr, (void)flags, (void)mc, (void)context;
	return -FI_ENOSYS;
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
		if (flags & ~(FI_SEND | FI_RECV) || !flags) {
			r = -FI_EBADFLAGS; /* no FI_READ/FI_WRITE/FI_REMOTE_*: no RMA */
		} else if (c->dom != dom || ((flags & FI_SEND) && ep->tx_cntr) || ((flags & FI_RECV) && ep->rx_cntr)) {
			r = -FI_EINVAL;
		} else {
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
		else
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
		uint64_t allowed = tx ? EMP_TX_OP_FLAGS : EMP_RX_OP_FLAGS;
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
	for (size_t i = 0; i < dom->nreqs; i++) {
		struct emp_req *q = &dom->reqs[i];
		if (!q->in_use || q->ep != ep)
			continue;
		if (q->tmp_key >= 0) {
			emp_dereg_mr(dom->dev, (uint32_t)q->tmp_key);
			q->tmp_key = -1;
		}
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

static uint64_t primary_or_both(uint64_t caps)
{
	return (caps & (FI_MSG | FI_TAGGED)) ? caps : caps | FI_MSG | FI_TAGGED;
}

static int ep_open(struct fid_domain *fid, struct fi_info *info, struct fid_ep **out, void *context)
{
	struct emp_fi_domain *dom = container_of(fid, struct emp_fi_domain, domain);
	if (!info || !out || !info->ep_attr || !info->tx_attr || !info->rx_attr)
		return -FI_EINVAL;
	if (info->ep_attr->type != FI_EP_RDM || (info->caps & ~(uint64_t)EMP_CAPS))
		return -FI_EINVAL;
	if ((info->tx_attr->op_flags & ~(uint64_t)EMP_TX_OP_FLAGS) ||
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

static int ep_open2(struct fid_domain *d, struct fi_info *info, struct fid_ep **ep, uint64_t flags, void *context)
{
	if (flags)
		return -FI_EBADFLAGS;
	return ep_open(d, info, ep, context);
}

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
	free(dom->reqs);
	free(dom->free_slots);
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
	(void)d, (void)t, (void)o, (void)attr, (void)flags;
	return -FI_EOPNOTSUPP;
}

static int dom_query_collective(struct fid_domain *d, enum fi_collective_op c, struct fi_collective_attr *attr,
				uint64_t flags)
{
	(void)d, (void)c, (void)attr, (void)flags;
	return -FI_EOPNOTSUPP;
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

static int dom_open(struct fid_fabric *fid, struct fi_info *info, struct fid_domain **out, void *context)
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
	dom->nslots = dom->nreqs < BOUNCE_SLOTS_MAX ? dom->nreqs : BOUNCE_SLOTS_MAX;
	dom->reqs = calloc(dom->nreqs, sizeof *dom->reqs);
	dom->free_slots = calloc(dom->nslots, sizeof *dom->free_slots);
	dom->bounce = emp_alloc(dom->dev, dom->nslots * BOUNCE_SIZE, &dom->bounce_key, &dom->bounce_off);
	r = -FI_ENOMEM;
	if (!dom->reqs || !dom->free_slots || !dom->bounce)
		goto fail;
	for (size_t i = dom->nreqs; i-- > 0;) {
		dom->reqs[i].next = dom->free_reqs;
		dom->free_reqs = &dom->reqs[i];
	}
	for (size_t i = 0; i < dom->nslots; i++)
		dom->free_slots[i] = (int)(dom->nslots - 1 - i);
	dom->nfree_slots = dom->nslots;
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
	free(dom->reqs);
	free(dom->free_slots);
	free(dom);
	return r;
}

static int dom_open2(struct fid_fabric *f, struct fi_info *info, struct fid_domain **d, uint64_t flags, void *ctx)
{
	if (flags)
		return -FI_EBADFLAGS;
	return dom_open(f, info, d, ctx);
}

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

static int fabric_open(struct fi_fabric_attr *attr, struct fid_fabric **out, void *context)
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

/* ---- fi_getinfo ------------------------------------------------------------------ */

/* "fi_emp://N:P" or "N:P" -> an address. */
static int parse_node(const char *s, struct emp_fi_name *n)
{
	unsigned node, port;
	char extra;
	if (!strncmp(s, "fi_emp://", 9))
		s += 9;
	if (sscanf(s, "%u:%u%c", &node, &port, &extra) != 2 || node >= EMP_ANY_NODE || port >= EMP_ANY_PORT)
		return -1;
	n->node = (uint16_t)node;
	n->port = (uint16_t)port;
	n->magic = ADDR_MAGIC;
	return 0;
}

/* Everything in the hints EMP cannot do: the first such hint, or NULL. */
static const char *hints_refused(uint32_t version, const struct fi_info *h, const struct emp_port_info *pi)
{
	if (!h)
		return NULL;
	if (h->caps & ~(uint64_t)EMP_CAPS)
		return "h->caps & ~(uint64_t)EMP_CAPS";
	if (h->addr_format != FI_FORMAT_UNSPEC)
		return "h->addr_format != FI_FORMAT_UNSPEC";
	if (h->ep_attr) {
		const struct fi_ep_attr *e = h->ep_attr;
		if (e->type != FI_EP_UNSPEC && e->type != FI_EP_RDM)
			return "e->type != FI_EP_UNSPEC && e->type != FI_EP_RDM";
		if (e->protocol != FI_PROTO_UNSPEC || e->max_msg_size > pi->msg_max || e->auth_key_size)
			return "e->protocol != FI_PROTO_UNSPEC || e->max_msg_size > pi->msg_max || e->auth_key_size";
		if (e->tx_ctx_cnt > 1 || e->rx_ctx_cnt > 1)
			return "e->tx_ctx_cnt > 1 || e->rx_ctx_cnt > 1";
		if (e->msg_prefix_size || e->max_order_raw_size || e->max_order_war_size || e->max_order_waw_size)
			return "e->msg_prefix_size || e->max_order_raw_size || e->max_order_war_size || e->max_order_waw_size";
		bool both = (h->caps & FI_MSG) && (h->caps & FI_TAGGED);
		if (both && (e->mem_tag_format & MSG_TAG_BIT))
			return "both && (e->mem_tag_format & MSG_TAG_BIT)";
	}
	if (h->domain_attr) {
		const struct fi_domain_attr *d = h->domain_attr;
		if (d->name && strcmp(d->name, EMP_FI_NAME))
			return "d->name && strcmp(d->name, EMP_FI_NAME)";
		/* A size wish is harmless without FI_REMOTE_CQ_DATA (refused above):
		 * we answer 0. */
		if (d->auth_key_size)
			return "domain auth_key";
		if (d->ep_cnt > 1 || d->tx_ctx_cnt > 1 || d->rx_ctx_cnt > 1)
			return "domain ep_cnt/tx_ctx_cnt/rx_ctx_cnt > 1 (one endpoint per domain)";
		if (d->max_ep_stx_ctx || d->max_ep_srx_ctx || d->mr_iov_limit > 1)
			return "d->max_ep_stx_ctx || d->max_ep_srx_ctx || d->mr_iov_limit > 1";
		if (FI_VERSION_GE(version, FI_VERSION(1, 5)) && (d->caps & ~(uint64_t)EMP_CAPS))
			return "FI_VERSION_GE(version, FI_VERSION(1, 5)) && (d->caps & ~(uint64_t)EMP_CAPS)";
		if (FI_VERSION_LT(version, FI_VERSION(1, 5)) && d->mr_mode == FI_MR_SCALABLE)
			return "FI_VERSION_LT(version, FI_VERSION(1, 5)) && d->mr_mode == FI_MR_SCALABLE";
		if (d->av_type != FI_AV_UNSPEC && d->av_type != FI_AV_MAP && d->av_type != FI_AV_TABLE)
			return "d->av_type != FI_AV_UNSPEC && d->av_type != FI_AV_MAP && d->av_type != FI_AV_TABLE";
	}
	if (h->fabric_attr && h->fabric_attr->name && strcmp(h->fabric_attr->name, EMP_FI_NAME))
		return "h->fabric_attr && h->fabric_attr->name && strcmp(h->fabric_attr->name, EMP_FI_NAME)";
	if (h->tx_attr) {
		const struct fi_tx_attr *t = h->tx_attr;
		if ((t->caps & ~(uint64_t)EMP_CAPS) || (t->op_flags & ~(uint64_t)EMP_TX_OP_FLAGS))
			return "(t->caps & ~(uint64_t)EMP_CAPS) || (t->op_flags & ~(uint64_t)EMP_TX_OP_FLAGS)";
		if ((t->msg_order & ~FI_ORDER_SAS) || t->comp_order != FI_ORDER_NONE)
			return "(t->msg_order & ~FI_ORDER_SAS) || t->comp_order != FI_ORDER_NONE";
		if (t->inject_size > INJECT_SIZE || t->size > pi->send_entries || t->iov_limit > 1 || t->rma_iov_limit)
			return "t->inject_size > INJECT_SIZE || t->size > pi->send_entries || t->iov_limit > 1 || t->rma_iov_limit";
	}
	if (h->rx_attr) {
		const struct fi_rx_attr *r = h->rx_attr;
		if ((r->caps & ~(uint64_t)EMP_CAPS) || (r->op_flags & ~(uint64_t)EMP_RX_OP_FLAGS))
			return "(r->caps & ~(uint64_t)EMP_CAPS) || (r->op_flags & ~(uint64_t)EMP_RX_OP_FLAGS)";
		if ((r->msg_order & ~FI_ORDER_SAS) || r->comp_order != FI_ORDER_NONE)
			return "(r->msg_order & ~FI_ORDER_SAS) || r->comp_order != FI_ORDER_NONE";
		if (r->total_buffered_recv || r->size > pi->recv_entries || r->iov_limit > 1)
			return "r->total_buffered_recv || r->size > pi->recv_entries || r->iov_limit > 1";
	}
	if (h->src_addr && h->src_addrlen != sizeof(struct emp_fi_name))
		return "h->src_addr && h->src_addrlen != sizeof(struct emp_fi_name)";
	if (h->dest_addr && h->dest_addrlen != sizeof(struct emp_fi_name))
		return "h->dest_addr && h->dest_addrlen != sizeof(struct emp_fi_name)";
	return NULL;
}

static int emp_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
		       const struct fi_info *hints, struct fi_info **info)
{
	(void)service;
	struct emp_port_info pi;
	if (!info)
		return -FI_EINVAL;
	int nic = query_nic(&pi);
	if (nic) {
		FI_INFO(&emp_prov, FI_LOG_CORE, "no EMP NIC for this process: %s\n", strerror(-nic));
		return -FI_ENODATA;
	}
	const char *why = hints_refused(version, hints, &pi);
	if (why) {
		FI_INFO(&emp_prov, FI_LOG_CORE, "hints refused: %s\n", why);
		return -FI_ENODATA;
	}
	struct emp_fi_name dest;
	bool have_dest = false;
	if (node && !(flags & FI_SOURCE)) {
		if (parse_node(node, &dest))
			return -FI_ENODATA;
		have_dest = true;
	} else if (hints && hints->dest_addr) {
		memcpy(&dest, hints->dest_addr, sizeof dest);
		if (dest.magic != ADDR_MAGIC)
			return -FI_ENODATA;
		have_dest = true;
	}
	uint64_t asked = hints ? hints->caps : 0;
	uint64_t caps = asked & (FI_MSG | FI_TAGGED);
	if (!caps)
		caps = FI_MSG | FI_TAGGED;
	caps |= (asked & (FI_SEND | FI_RECV)) ? asked & (FI_SEND | FI_RECV) : 0;
	caps |= asked ? asked & EMP_SECONDARY_CAPS : EMP_SECONDARY_CAPS;
	bool both = (caps & FI_MSG) && (caps & FI_TAGGED);

	struct fi_info *fi = fi_allocinfo();
	if (!fi)
		return -FI_ENOMEM;
	fi->caps = caps;
	fi->mode = 0; /* EMP needs no FI_CONTEXT, prefix, or local MR mode bit */
	fi->addr_format = FI_FORMAT_UNSPEC;
	if (have_dest) {
		fi->dest_addr = malloc(sizeof dest);
		if (!fi->dest_addr) {
			fi_freeinfo(fi);
			return -FI_ENOMEM;
		}
		memcpy(fi->dest_addr, &dest, sizeof dest);
		fi->dest_addrlen = sizeof dest;
	}
	const struct fi_tx_attr *ht = hints ? hints->tx_attr : NULL;
	const struct fi_rx_attr *hr = hints ? hints->rx_attr : NULL;
	const struct fi_domain_attr *hd = hints ? hints->domain_attr : NULL;

	fi->tx_attr->caps = caps;
	fi->tx_attr->op_flags = ht ? ht->op_flags : 0;
	fi->tx_attr->msg_order = FI_ORDER_SAS; /* EMP delivers in order per peer */
	fi->tx_attr->comp_order = FI_ORDER_NONE;
	fi->tx_attr->inject_size = INJECT_SIZE;
	fi->tx_attr->size = pi.send_entries;
	fi->tx_attr->iov_limit = 1;
	fi->tx_attr->rma_iov_limit = 0;

	fi->rx_attr->caps = caps;
	fi->rx_attr->op_flags = hr ? hr->op_flags : 0;
	fi->rx_attr->msg_order = FI_ORDER_SAS;
	fi->rx_attr->comp_order = FI_ORDER_NONE;
	fi->rx_attr->total_buffered_recv = 0; /* unexpected messages wait at the sender */
	fi->rx_attr->size = pi.recv_entries;
	fi->rx_attr->iov_limit = 1;

	fi->ep_attr->type = FI_EP_RDM;
	fi->ep_attr->protocol = FI_PROTO_UNSPEC;
	fi->ep_attr->protocol_version = 1;
	fi->ep_attr->max_msg_size = pi.msg_max;
	fi->ep_attr->mem_tag_format = both ? ~MSG_TAG_BIT : ~0ULL;
	fi->ep_attr->tx_ctx_cnt = 1;
	fi->ep_attr->rx_ctx_cnt = 1;

	struct fi_domain_attr *d = fi->domain_attr;
	d->name = strdup(EMP_FI_NAME);
	d->threading = hd && hd->threading != FI_THREAD_UNSPEC ? hd->threading : FI_THREAD_SAFE;
	/* The NIC runs the protocol: transfers progress without the caller. */
	d->control_progress = hd && hd->control_progress != FI_PROGRESS_UNSPEC ? hd->control_progress : FI_PROGRESS_AUTO;
	d->data_progress = hd && hd->data_progress != FI_PROGRESS_UNSPEC ? hd->data_progress : FI_PROGRESS_AUTO;
	d->resource_mgmt = hd && hd->resource_mgmt != FI_RM_UNSPEC ? hd->resource_mgmt : FI_RM_ENABLED;
	d->av_type = hd ? hd->av_type : FI_AV_UNSPEC;
	if (FI_VERSION_LT(version, FI_VERSION(1, 5))) {
		d->mr_mode = FI_MR_BASIC;
	} else if (!hd) {
		d->mr_mode = EMP_MR_MODES;
	} else if (hd->mr_mode == FI_MR_BASIC) {
		d->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	} else {
		/* EMP needs none of them for messages (unregistered memory is
		 * bounced or registered per operation); offered ones are kept
		 * so the caller's registrations give zero copy. */
		d->mr_mode = hd->mr_mode & EMP_MR_MODES;
	}
	d->mr_key_size = sizeof(uint32_t);
	d->cq_data_size = 0;
	d->cq_cnt = 64;
	d->ep_cnt = 1;
	d->tx_ctx_cnt = 1;
	d->rx_ctx_cnt = 1;
	d->max_ep_tx_ctx = 1;
	d->max_ep_rx_ctx = 1;
	d->max_ep_stx_ctx = 0;
	d->max_ep_srx_ctx = 0;
	d->cntr_cnt = 64;
	d->mr_iov_limit = 1;
	d->caps = FI_LOCAL_COMM | FI_REMOTE_COMM;
	d->mode = 0;
	d->max_err_data = 0;

	fi->fabric_attr->name = strdup(EMP_FI_NAME);
	/* prov_name: the core fills it in (it would append to ours). */
	fi->fabric_attr->prov_version = EMP_FI_PROV_VERSION;
	fi->fabric_attr->api_version = FI_VERSION(1, 17);
	if (!d->name || !fi->fabric_attr->name) {
		fi_freeinfo(fi);
		return -FI_ENOMEM;
	}
	*info = fi;
	return 0;
}

static void emp_cleanup(void)
{
}

static struct fi_provider emp_prov = {
	.version = EMP_FI_PROV_VERSION,
	.fi_version = FI_VERSION(1, 17),
	.name = EMP_FI_NAME,
	.getinfo = emp_getinfo,
	.fabric = fabric_open,
	.cleanup = emp_cleanup,
};

__attribute__((visibility("default"))) FI_EXT_INI
{
	return &emp_prov;
}
