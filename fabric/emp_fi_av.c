/* libemp-fi.so, the libfabric provider "emp": address vectors (FI_AV_MAP /
 * FI_AV_TABLE) and the shared "not supported" fid ops. See emp_fi.h and
 * fabric/README.md. */

#include "emp_fi.h"

/* ---- address vector ----------------------------------------------------- */

static size_t hslot(uint32_t key, size_t cap)
{
	return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

fi_addr_t av_reverse(const struct emp_fi_av *av, uint32_t key)
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
int av_resolve(const struct emp_fi_av *av, fi_addr_t a, uint16_t *node, uint16_t *port)
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

int name_copy_out(uint32_t code, void *addr, size_t *addrlen)
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

int fid_no_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
	(void)fid, (void)bfid, (void)flags;
	return -FI_ENOSYS;
}

int fid_no_control(struct fid *fid, int command, void *arg)
{
	(void)fid, (void)command, (void)arg;
	return -FI_ENOSYS;
}

int fid_no_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops, void *context)
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
	.av_set = av_set_open,
};

int av_open(struct fid_domain *fid, struct fi_av_attr *attr, struct fid_av **out, void *context)
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
