/* libemp-fi.so, the libfabric provider "emp": FI_COLLECTIVE on EMP's NIC
 * groups and collectives (libemp's emp_group_create, emp_post_barrier /
 * _bcast / _reduce / _allreduce). See emp_fi.h and fabric/README.md.
 *
 * fi_av_set builds an ordered member list from an AV (its order is the
 * ranks: every member must build the same list). fi_join_collective
 * creates the EMP group on this port at once (EMP groups need no
 * handshake) and posts FI_JOIN_COMPLETE to the endpoint's EQ; the group's
 * id is derived from the member list and how many groups of that list this
 * endpoint joined before, so members that join their groups in the same
 * order (MPI's communicator rule, which EMP needs anyway) agree on it.
 * fi_barrier, fi_broadcast, fi_reduce and fi_allreduce run on the NICs and
 * complete in the transmit CQ with FI_COLLECTIVE. Reductions carry what
 * one NIC partial buffer holds (coll_reduce_max). Closing a group flushes
 * its unfinished collectives (FI_ECANCELED entries). The rest of
 * fi_collective(3) is -FI_EOPNOTSUPP. */

#include "emp_fi.h"

/* ---- AV sets ------------------------------------------------------------ */

struct emp_fi_av_set {
	struct fid_av_set set;
	struct emp_fi_av *av;
	fi_addr_t addrs[COLL_MEMBERS_MAX];
	size_t count;
};

static struct emp_fi_av_set *set_of(const struct fid_av_set *s)
{
	if (!s || s->fid.fclass != FI_CLASS_AV_SET)
		return NULL;
	return container_of(s, struct emp_fi_av_set, set);
}

static bool set_has(const struct emp_fi_av_set *s, fi_addr_t a)
{
	for (size_t i = 0; i < s->count; i++)
		if (s->addrs[i] == a)
			return true;
	return false;
}

static int set_insert(struct fid_av_set *fid, fi_addr_t addr)
{
	struct emp_fi_av_set *s = set_of(fid);
	if (!s)
		return -FI_EINVAL;
	struct emp_fi_domain *dom = s->av->dom;
	uint16_t node, port;
	pthread_mutex_lock(&dom->lock);
	int r = av_resolve(s->av, addr, &node, &port);
	if (!r && set_has(s, addr))
		r = -FI_EALREADY;
	if (!r && s->count == COLL_MEMBERS_MAX)
		r = -FI_ENOSPC; /* an EMP group has at most 64 members */
	if (!r)
		s->addrs[s->count++] = addr;
	pthread_mutex_unlock(&dom->lock);
	return r;
}

static int set_remove_locked(struct emp_fi_av_set *s, fi_addr_t addr)
{
	for (size_t i = 0; i < s->count; i++) {
		if (s->addrs[i] == addr) {
			memmove(&s->addrs[i], &s->addrs[i + 1], (s->count - i - 1) * sizeof s->addrs[0]);
			s->count--;
			return 0;
		}
	}
	return -FI_ENOENT;
}

static int set_remove(struct fid_av_set *fid, fi_addr_t addr)
{
	struct emp_fi_av_set *s = set_of(fid);
	if (!s)
		return -FI_EINVAL;
	pthread_mutex_lock(&s->av->dom->lock);
	int r = set_remove_locked(s, addr);
	pthread_mutex_unlock(&s->av->dom->lock);
	return r;
}

static int set_union_locked(struct emp_fi_av_set *d, const struct emp_fi_av_set *s)
{
	size_t extra = 0;
	for (size_t i = 0; i < s->count; i++)
		extra += !set_has(d, s->addrs[i]);
	if (d->count + extra > COLL_MEMBERS_MAX)
		return -FI_ENOSPC;
	for (size_t i = 0; i < s->count; i++)
		if (!set_has(d, s->addrs[i]))
			d->addrs[d->count++] = s->addrs[i];
	return 0;
}

/* Keeps (keep = true) or drops the members of d that are in s. */
static int set_filter_locked(struct emp_fi_av_set *d, const struct emp_fi_av_set *s, bool keep)
{
	size_t n = 0;
	for (size_t i = 0; i < d->count; i++)
		if (set_has(s, d->addrs[i]) == keep)
			d->addrs[n++] = d->addrs[i];
	d->count = n;
	return 0;
}

enum set_op { SET_UNION, SET_INTERSECT, SET_DIFF };

/* dst op= src, two sets of one AV, under the domain's lock. */
static int set_combine(struct fid_av_set *dst, const struct fid_av_set *src, enum set_op op)
{
	struct emp_fi_av_set *d = set_of(dst), *s = set_of(src);
	if (!d || !s || d->av != s->av)
		return -FI_EINVAL;
	pthread_mutex_lock(&d->av->dom->lock);
	int r = op == SET_UNION ? set_union_locked(d, s) : set_filter_locked(d, s, op == SET_INTERSECT);
	pthread_mutex_unlock(&d->av->dom->lock);
	return r;
}

static int set_union(struct fid_av_set *dst, const struct fid_av_set *src)
{
	return set_combine(dst, src, SET_UNION);
}

static int set_intersect(struct fid_av_set *dst, const struct fid_av_set *src)
{
	return set_combine(dst, src, SET_INTERSECT);
}

static int set_diff(struct fid_av_set *dst, const struct fid_av_set *src)
{
	return set_combine(dst, src, SET_DIFF);
}

/* A set has no address of its own before it is joined: fi_join_collective
 * takes the set itself. */
static int set_addr(struct fid_av_set *fid, fi_addr_t *coll_addr)
{
	if (!set_of(fid) || !coll_addr)
		return -FI_EINVAL;
	*coll_addr = FI_ADDR_NOTAVAIL;
	return 0;
}

static int set_close(struct fid *fid)
{
	struct emp_fi_av_set *s = container_of(fid, struct emp_fi_av_set, set.fid);
	struct emp_fi_domain *dom = s->av->dom;
	pthread_mutex_lock(&dom->lock);
	s->av->refs--;
	pthread_mutex_unlock(&dom->lock);
	free(s);
	return 0;
}

static struct fi_ops set_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = set_close,
	.bind = fid_no_bind,
	.control = fid_no_control,
	.ops_open = fid_no_ops_open,
};

static struct fi_ops_av_set set_ops = {
	.size = sizeof(struct fi_ops_av_set),
	.set_union = set_union,
	.intersect = set_intersect,
	.diff = set_diff,
	.insert = set_insert,
	.remove = set_remove,
	.addr = set_addr,
};

static int code_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/* The members attr names: FI_UNIVERSE (every address in the AV, in table
 * order, or for FI_AV_MAP in endpoint order), or start..end by stride of
 * an FI_AV_TABLE; FI_ADDR_NOTAVAIL as start gives an empty set. Called
 * with the domain lock. */
static int set_fill(struct emp_fi_av_set *s, const struct fi_av_set_attr *attr)
{
	const struct emp_fi_av *av = s->av;
	if (attr->flags & FI_UNIVERSE) {
		if (av->type == FI_AV_TABLE) {
			for (size_t i = 0; i < av->count; i++) {
				if (av->table[i] == ADDR_NONE)
					continue;
				if (s->count == COLL_MEMBERS_MAX)
					return -FI_ENOSPC;
				s->addrs[s->count++] = i;
			}
			return 0;
		}
		uint32_t codes[COLL_MEMBERS_MAX];
		size_t n = 0;
		for (size_t i = 0; i < av->hcap; i++) {
			if (av->hkeys[i] == ADDR_NONE)
				continue;
			if (n == COLL_MEMBERS_MAX)
				return -FI_ENOSPC;
			codes[n++] = av->hkeys[i];
		}
		qsort(codes, n, sizeof codes[0], code_cmp);
		for (size_t i = 0; i < n; i++)
			s->addrs[s->count++] = codes[i];
		return 0;
	}
	if (attr->start_addr == FI_ADDR_NOTAVAIL)
		return 0;
	if (av->type != FI_AV_TABLE && attr->start_addr != attr->end_addr)
		return -FI_EINVAL; /* a range of FI_AV_MAP addresses means nothing */
	if (attr->end_addr < attr->start_addr || (!attr->stride && attr->end_addr != attr->start_addr))
		return -FI_EINVAL;
	for (fi_addr_t a = attr->start_addr; a <= attr->end_addr; a += attr->stride ? attr->stride : 1) {
		uint16_t node, port;
		if (av_resolve(av, a, &node, &port))
			return -FI_EINVAL;
		if (s->count == COLL_MEMBERS_MAX)
			return -FI_ENOSPC;
		s->addrs[s->count++] = a;
		if (a > attr->end_addr - (attr->stride ? attr->stride : 1))
			break; /* the next step would pass the end (or wrap) */
	}
	return 0;
}

int av_set_open(struct fid_av *fid, struct fi_av_set_attr *attr, struct fid_av_set **out, void *context)
{
	struct emp_fi_av *av = container_of(fid, struct emp_fi_av, av);
	if (!attr || !out || fid->fid.fclass != FI_CLASS_AV)
		return -FI_EINVAL;
	if (attr->flags & ~(uint64_t)FI_UNIVERSE)
		return -FI_EBADFLAGS;
	if (attr->comm_key_size)
		return -FI_EOPNOTSUPP; /* EMP groups are named by their members, no key */
	if (attr->count > COLL_MEMBERS_MAX)
		return -FI_EINVAL;
	struct emp_fi_av_set *s = calloc(1, sizeof *s);
	if (!s)
		return -FI_ENOMEM;
	s->set.fid.fclass = FI_CLASS_AV_SET;
	s->set.fid.context = context;
	s->set.fid.ops = &set_fi_ops;
	s->set.ops = &set_ops;
	s->av = av;
	struct emp_fi_domain *dom = av->dom;
	pthread_mutex_lock(&dom->lock);
	int r = set_fill(s, attr);
	if (!r)
		av->refs++;
	pthread_mutex_unlock(&dom->lock);
	if (r) {
		free(s);
		return r;
	}
	*out = &s->set;
	return 0;
}

/* ---- joined groups -------------------------------------------------------- */

/* A collective address: COLL_ADDR_TAG | the group's slot on its endpoint. */
#define COLL_ADDR_TAG 0xC011EC7000000000ULL
#define COLL_ADDR_MASK 0xFFFFFFFF00000000ULL

struct emp_fi_mc {
	struct fid_mc mc;
	struct emp_fi_ep *ep;
	struct emp_group *g;
	uint32_t id;
	size_t slot;
	struct emp_endpoint members[COLL_MEMBERS_MAX];
	size_t count;
	size_t inflight; /* collectives posted, not yet completed */
};

/* FNV-1a over the member list and the join's sequence number. */
static uint32_t group_id(const struct emp_endpoint *m, size_t n, uint32_t seq)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++) {
		uint32_t c = ep_code(m[i].node, m[i].port);
		for (int b = 0; b < 4; b++)
			h = (h ^ ((c >> (8 * b)) & 0xFF)) * 16777619u;
	}
	for (int b = 0; b < 4; b++)
		h = (h ^ ((seq >> (8 * b)) & 0xFF)) * 16777619u;
	return h ? h : 1; /* 0 is no group */
}

static int mc_close(struct fid *fid)
{
	struct emp_fi_mc *mc = container_of(fid, struct emp_fi_mc, mc.fid);
	struct emp_fi_ep *ep = mc->ep;
	struct emp_fi_domain *dom = ep->dom;
	pthread_mutex_lock(&dom->lock);
	progress(dom);
	/* Collectives still in flight (members that never posted theirs) are
	 * flushed by the NIC when the group goes: they complete FI_ECANCELED
	 * and no longer name it. */
	for (size_t i = 0; mc->inflight && i < dom->nreqs; i++) {
		if (dom->reqs[i].in_use && dom->reqs[i].mc == mc) {
			dom->reqs[i].mc = NULL;
			mc->inflight--;
		}
	}
	int r = emp_group_destroy(dom->dev, mc->g);
	ep->mcs[mc->slot] = NULL;
	ep->nmcs--;
	pthread_mutex_unlock(&dom->lock);
	free(mc);
	return r < 0 ? r : 0;
}

static struct fi_ops mc_fi_ops = {
	.size = sizeof(struct fi_ops),
	.close = mc_close,
	.bind = fid_no_bind,
	.control = fid_no_control,
	.ops_open = fid_no_ops_open,
};

/* The entry counting the joins of this member list (found or added) in a
 * bounded table; its count is the next join's sequence number, and only a
 * join that succeeds advances it (a retried join gets the same id). */
static int join_hist_entry(struct emp_fi_ep *ep, uint32_t members_hash, size_t *idx)
{
	for (size_t i = 0; i < ep->njoin_hist; i++) {
		if (ep->join_hist[i].hash == members_hash) {
			*idx = i;
			return 0;
		}
	}
	if (ep->njoin_hist == COLL_JOIN_HIST_MAX)
		return -FI_ENOSPC;
	ep->join_hist[ep->njoin_hist].hash = members_hash;
	ep->join_hist[ep->njoin_hist].count = 0;
	*idx = ep->njoin_hist++;
	return 0;
}

int coll_join(struct emp_fi_ep *ep, const void *addr, uint64_t flags, struct fid_mc **out, void *context)
{
	const struct fi_collective_addr *ca = addr;
	struct emp_fi_domain *dom = ep->dom;
	if (!ca || !out)
		return -FI_EINVAL;
	if (flags & ~(uint64_t)FI_COLLECTIVE)
		return -FI_EBADFLAGS;
	if (!(ep->caps & FI_COLLECTIVE))
		return -FI_EOPNOTSUPP;
	const struct emp_fi_av_set *set = set_of(ca->set);
	if (!set)
		return -FI_EINVAL;
	struct emp_fi_mc *mc = calloc(1, sizeof *mc);
	if (!mc)
		return -FI_ENOMEM;
	int r = 0;
	pthread_mutex_lock(&dom->lock);
	if (!ep->enabled) {
		r = -FI_EOPBADSTATE;
		goto fail;
	}
	if (!ep->eq) {
		r = -FI_ENOEQ; /* FI_JOIN_COMPLETE goes to the endpoint's EQ */
		goto fail;
	}
	if (set->av != ep->av || !set->count) {
		r = -FI_EINVAL;
		goto fail;
	}
	for (size_t i = 0; i < set->count; i++) {
		r = av_resolve(set->av, set->addrs[i], &mc->members[i].node, &mc->members[i].port);
		if (r)
			goto fail; /* removed from the AV since */
	}
	mc->count = set->count;
	bool member = false;
	for (size_t i = 0; i < mc->count; i++)
		member |= mc->members[i].node == dom->pi.node && mc->members[i].port == dom->pi.port;
	if (!member) {
		r = -FI_EINVAL; /* this endpoint must be in the set */
		goto fail;
	}
	size_t slot = 0;
	while (slot < COLL_GROUPS_MAX && ep->mcs[slot])
		slot++;
	if (slot == COLL_GROUPS_MAX) {
		r = -FI_ENOSPC;
		goto fail;
	}
	size_t hist;
	r = join_hist_entry(ep, group_id(mc->members, mc->count, 0), &hist);
	if (r)
		goto fail;
	mc->id = group_id(mc->members, mc->count, ep->join_hist[hist].count);
	for (size_t i = 0; i < COLL_GROUPS_MAX; i++) {
		if (ep->mcs[i] && ep->mcs[i]->id == mc->id) {
			/* Two member lists hashed alike (1 in 2^32): re-creating
			 * the id would flush the open group. */
			r = -FI_EBUSY;
			goto fail;
		}
	}
	/* The EQ must take FI_JOIN_COMPLETE before the group exists: a group
	 * created and destroyed again would be a newer epoch of its id here
	 * than at the other members. Its lock keeps the room until then. */
	struct emp_fi_eq *eq = ep->eq;
	pthread_mutex_lock(&eq->lock);
	if (eq->count >= eq->size) {
		pthread_mutex_unlock(&eq->lock);
		r = -FI_EAGAIN;
		goto fail;
	}
	int err = 0;
	mc->g = emp_group_create(dom->dev, mc->id, mc->members, mc->count, &err);
	if (!mc->g) {
		pthread_mutex_unlock(&eq->lock);
		r = err < 0 ? err : -FI_EIO;
		goto fail;
	}
	mc->mc.fid.fclass = FI_CLASS_MC;
	mc->mc.fid.context = context;
	mc->mc.fid.ops = &mc_fi_ops;
	mc->mc.fi_addr = COLL_ADDR_TAG | slot;
	mc->ep = ep;
	mc->slot = slot;
	struct fi_eq_entry ev = {.fid = &mc->mc.fid, .context = context};
	eq_push_locked(eq, FI_JOIN_COMPLETE, &ev, sizeof ev); /* room checked above */
	pthread_mutex_unlock(&eq->lock);
	ep->mcs[slot] = mc;
	ep->nmcs++;
	ep->join_hist[hist].count++;
	pthread_mutex_unlock(&dom->lock);
	*out = &mc->mc;
	return 0;
fail:
	pthread_mutex_unlock(&dom->lock);
	free(mc);
	return r;
}

/* ---- collective operations ------------------------------------------------ */

/* The group a collective address names on this endpoint, or NULL. */
static struct emp_fi_mc *mc_of(struct emp_fi_ep *ep, fi_addr_t a)
{
	if ((a & COLL_ADDR_MASK) != COLL_ADDR_TAG || (a & ~COLL_ADDR_MASK) >= COLL_GROUPS_MAX)
		return NULL;
	return ep->mcs[a & ~COLL_ADDR_MASK];
}

static size_t dtype_size(enum fi_datatype t)
{
	switch (t) {
	case FI_INT8:
	case FI_UINT8: return 1;
	case FI_INT16:
	case FI_UINT16: return 2;
	case FI_INT32:
	case FI_UINT32:
	case FI_FLOAT: return 4;
	case FI_INT64:
	case FI_UINT64:
	case FI_DOUBLE: return 8;
	default: return 0;
	}
}

/* The NIC's reduction type and operator for t and op, or -FI_EOPNOTSUPP. */
static int reduce_map(enum fi_datatype t, enum fi_op op, enum emp_dtype *et, enum emp_reduce_op *eo)
{
	bool integer = true;
	switch (t) {
	case FI_INT32: *et = EMP_I32; break;
	case FI_INT64: *et = EMP_I64; break;
	case FI_UINT32: *et = EMP_U32; break;
	case FI_UINT64: *et = EMP_U64; break;
	case FI_FLOAT: *et = EMP_F32, integer = false; break;
	case FI_DOUBLE: *et = EMP_F64, integer = false; break;
	default: return -FI_EOPNOTSUPP;
	}
	switch (op) {
	case FI_SUM: *eo = EMP_SUM; break;
	case FI_PROD: *eo = EMP_PROD; break;
	case FI_MIN: *eo = EMP_MIN; break;
	case FI_MAX: *eo = EMP_MAX; break;
	case FI_BAND: *eo = EMP_BAND; break;
	case FI_BOR: *eo = EMP_BOR; break;
	case FI_BXOR: *eo = EMP_BXOR; break;
	default: return -FI_EOPNOTSUPP;
	}
	if (!integer && (op == FI_BAND || op == FI_BOR || op == FI_BXOR))
		return -FI_EOPNOTSUPP;
	return 0;
}

/* Bytes one NIC reduction carries: one frame, one partial buffer (8 KiB),
 * less a margin for the frame's headers. */
size_t coll_reduce_max(const struct emp_port_info *pi)
{
	size_t frame = pi->mtu > 256 ? pi->mtu - 256 : 0;
	return frame < 8192 ? frame : 8192;
}

enum coll_kind { CO_BARRIER, CO_BCAST, CO_REDUCE, CO_ALLREDUCE };

/* The member rank root_addr (an AV address) has in the group, or -1. */
static int root_rank(struct emp_fi_ep *ep, const struct emp_fi_mc *mc, fi_addr_t root_addr)
{
	uint16_t node, port;
	if (av_resolve(ep->av, root_addr, &node, &port))
		return -1;
	for (size_t i = 0; i < mc->count; i++)
		if (mc->members[i].node == node && mc->members[i].port == port)
			return (int)i;
	return -1;
}

static ssize_t coll_post(struct emp_fi_ep *ep, enum coll_kind kind, const void *buf, size_t count, void *desc,
			 void *result, fi_addr_t coll_addr, fi_addr_t root_addr, enum fi_datatype t, enum fi_op op,
			 uint64_t flags, void *context)
{
	struct emp_fi_domain *dom = ep->dom;
	if (!(ep->caps & FI_COLLECTIVE))
		return -FI_EOPNOTSUPP;
	if (!ep->enabled)
		return -FI_EOPBADSTATE;
	if (flags & ~(uint64_t)FI_COMPLETION)
		return -FI_EBADFLAGS;
	enum emp_dtype et = 0;
	enum emp_reduce_op eo = 0;
	size_t bytes = 0;
	if (kind == CO_BCAST) {
		size_t sz = dtype_size(t);
		if (!sz)
			return -FI_EOPNOTSUPP;
		if (count > dom->pi.msg_max / sz)
			return -FI_EMSGSIZE;
		bytes = count * sz;
	} else if (kind != CO_BARRIER) {
		int m = reduce_map(t, op, &et, &eo);
		if (m)
			return m;
		if (count > coll_reduce_max(&dom->pi) / dtype_size(t))
			return -FI_EMSGSIZE;
		bytes = count * dtype_size(t);
	}
	if (bytes && !buf)
		return -FI_EINVAL;
	pthread_mutex_lock(&dom->lock);
	ssize_t ret = 0;
	struct emp_fi_mc *mc = mc_of(ep, coll_addr);
	if (!mc) {
		ret = -FI_EINVAL;
		goto out;
	}
	int my_rank = emp_group_rank(mc->g);
	int root = 0;
	if (kind == CO_BCAST || kind == CO_REDUCE) {
		root = root_rank(ep, mc, root_addr);
		if (root < 0) {
			ret = -FI_EINVAL;
			goto out;
		}
	}
	bool gets_result = kind == CO_ALLREDUCE || (kind == CO_REDUCE && root == my_rank);
	if (bytes && gets_result && !result) {
		ret = -FI_EINVAL;
		goto out;
	}
	struct emp_req *r;
	ret = tx_req_get(ep, false, flags, context, FI_COLLECTIVE, &r);
	if (ret)
		goto out;
	r->mc = mc;
	uint64_t wr = (uint64_t)(uintptr_t)r;
	int p;
	if (kind == CO_BARRIER) {
		p = emp_post_barrier(dom->dev, wr, mc->g, EMP_BARRIER_DISSEMINATION);
	} else if (kind == CO_BCAST) {
		/* The root's buffer is the source, everyone else's the
		 * destination (copied out of a bounce slot on completion). */
		bool src = root == my_rank;
		r->buf = (void *)buf;
		r->len = bytes;
		r->copy_out = !src;
		struct emp_sge sge = {0};
		int n = place(dom, r, buf, bytes, desc, src, false, &sge);
		if (n < 0) {
			ret = n;
			r->ep = NULL;
			r->mc = NULL;
			req_release(dom, r);
			goto out;
		}
		p = emp_post_bcast(dom->dev, wr, mc->g, root, &sge, (size_t)n);
	} else {
		/* Both vectors in bounce slots (a reduction is at most 8 KiB):
		 * the send copied in now, the result copied out on completion. */
		struct emp_sge send = {0}, recv = {0};
		int n = place(dom, r, buf, bytes, NULL, true, true, &send);
		if (n >= 0 && gets_result && bytes) {
			r->out_slot = slot_get(dom, 1);
			if (r->out_slot < 0) {
				n = -FI_EAGAIN;
			} else {
				r->out_buf = result;
				r->out_len = bytes;
				recv = slot_sge(dom, r->out_slot, bytes);
			}
		}
		if (n < 0) {
			ret = n;
			r->ep = NULL;
			r->mc = NULL;
			req_release(dom, r);
			goto out;
		}
		if (kind == CO_ALLREDUCE)
			p = emp_post_allreduce(dom->dev, wr, mc->g, et, eo, &send, &recv);
		else
			p = emp_post_reduce(dom->dev, wr, mc->g, root, et, eo, &send, gets_result ? &recv : NULL);
	}
	ret = post_errno(p);
	if (ret) {
		r->ep = NULL;
		r->mc = NULL;
		req_release(dom, r);
		goto out;
	}
	mc->inflight++;
	tx_req_posted(r, false);
out:
	pthread_mutex_unlock(&dom->lock);
	return ret;
}

/* A collective finished: its group may be closed again. */
void coll_done(struct emp_req *r)
{
	if (r->mc) {
		r->mc->inflight--;
		r->mc = NULL;
	}
}

static ssize_t co_barrier2(struct fid_ep *ep, fi_addr_t coll_addr, uint64_t flags, void *context)
{
	return coll_post(EP(ep), CO_BARRIER, NULL, 0, NULL, NULL, coll_addr, FI_ADDR_NOTAVAIL, FI_UINT8, FI_SUM,
			 flags, context);
}

static ssize_t co_barrier(struct fid_ep *ep, fi_addr_t coll_addr, void *context)
{
	return co_barrier2(ep, coll_addr, 0, context);
}

static ssize_t co_bcast(struct fid_ep *ep, void *buf, size_t count, void *desc, fi_addr_t coll_addr,
			fi_addr_t root_addr, enum fi_datatype t, uint64_t flags, void *context)
{
	return coll_post(EP(ep), CO_BCAST, buf, count, desc, NULL, coll_addr, root_addr, t, FI_SUM, flags, context);
}

static ssize_t co_allreduce(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result,
			    void *result_desc, fi_addr_t coll_addr, enum fi_datatype t, enum fi_op op, uint64_t flags,
			    void *context)
{
	(void)result_desc;
	return coll_post(EP(ep), CO_ALLREDUCE, buf, count, desc, result, coll_addr, FI_ADDR_NOTAVAIL, t, op, flags,
			 context);
}

static ssize_t co_reduce(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result,
			 void *result_desc, fi_addr_t coll_addr, fi_addr_t root_addr, enum fi_datatype t,
			 enum fi_op op, uint64_t flags, void *context)
{
	(void)result_desc;
	return coll_post(EP(ep), CO_REDUCE, buf, count, desc, result, coll_addr, root_addr, t, op, flags, context);
}

/* alltoall, allgather, reduce_scatter: the NICs have no such operation. */
static ssize_t co_unsupported(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result,
			      void *result_desc, fi_addr_t coll_addr, enum fi_datatype t, uint64_t flags,
			      void *context)
{
	(void)ep, (void)buf, (void)count, (void)desc, (void)result, (void)result_desc, (void)coll_addr, (void)t,
		(void)flags, (void)context;
	return -FI_EOPNOTSUPP;
}

static ssize_t co_unsupported_op(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result,
				 void *result_desc, fi_addr_t coll_addr, enum fi_datatype t, enum fi_op op,
				 uint64_t flags, void *context)
{
	(void)op;
	return co_unsupported(ep, buf, count, desc, result, result_desc, coll_addr, t, flags, context);
}

/* scatter, gather. */
static ssize_t co_unsupported_rooted(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result,
				     void *result_desc, fi_addr_t coll_addr, fi_addr_t root_addr, enum fi_datatype t,
				     uint64_t flags, void *context)
{
	(void)root_addr;
	return co_unsupported(ep, buf, count, desc, result, result_desc, coll_addr, t, flags, context);
}

static ssize_t co_msg(struct fid_ep *ep, const struct fi_msg_collective *msg, struct fi_ioc *resultv,
		      void **result_desc, size_t result_count, uint64_t flags)
{
	struct fi_ioc *res = resultv;
	if (!msg || msg->iov_count > 1 || (msg->iov_count && !msg->msg_iov) || result_count > 1 ||
	    (result_count && !resultv))
		return -FI_EINVAL;
	(void)result_desc;
	const void *buf = msg->iov_count ? msg->msg_iov[0].addr : NULL;
	size_t count = msg->iov_count ? msg->msg_iov[0].count : 0;
	void *desc = msg->desc ? msg->desc[0] : NULL;
	void *result = result_count ? res[0].addr : NULL;
	switch (msg->coll) {
	case FI_BARRIER:
		return co_barrier2(ep, msg->coll_addr, flags, msg->context);
	case FI_BROADCAST:
		return coll_post(EP(ep), CO_BCAST, buf, count, desc, NULL, msg->coll_addr, msg->root_addr,
				 msg->datatype, FI_SUM, flags, msg->context);
	case FI_ALLREDUCE:
		return coll_post(EP(ep), CO_ALLREDUCE, buf, count, desc, result, msg->coll_addr, FI_ADDR_NOTAVAIL,
				 msg->datatype, msg->op, flags, msg->context);
	case FI_REDUCE:
		return coll_post(EP(ep), CO_REDUCE, buf, count, desc, result, msg->coll_addr, msg->root_addr,
				 msg->datatype, msg->op, flags, msg->context);
	default:
		return -FI_EOPNOTSUPP;
	}
}

struct fi_ops_collective coll_ops = {
	.size = sizeof(struct fi_ops_collective),
	.barrier = co_barrier,
	.broadcast = co_bcast,
	.alltoall = co_unsupported,
	.allreduce = co_allreduce,
	.allgather = co_unsupported,
	.reduce_scatter = co_unsupported_op,
	.reduce = co_reduce,
	.scatter = co_unsupported_rooted,
	.gather = co_unsupported_rooted,
	.msg = co_msg,
	.barrier2 = co_barrier2,
};

/* fi_query_collective: what coll_post runs, with its limits. */
int coll_query(const struct emp_port_info *pi, enum fi_collective_op coll, struct fi_collective_attr *attr,
	       uint64_t flags)
{
	if (!attr)
		return -FI_EINVAL;
	if (flags)
		return -FI_EBADFLAGS;
	attr->max_members = COLL_MEMBERS_MAX;
	attr->mode = 0;
	switch (coll) {
	case FI_BARRIER:
		attr->datatype_attr.count = 0;
		attr->datatype_attr.size = 0;
		return 0;
	case FI_BROADCAST: {
		size_t sz = dtype_size(attr->datatype);
		if (!sz)
			return -FI_EOPNOTSUPP;
		attr->datatype_attr.count = pi->msg_max / sz;
		attr->datatype_attr.size = sz;
		return 0;
	}
	case FI_ALLREDUCE:
	case FI_REDUCE: {
		enum emp_dtype et;
		enum emp_reduce_op eo;
		int r = reduce_map(attr->datatype, attr->op, &et, &eo);
		if (r)
			return r;
		size_t sz = dtype_size(attr->datatype);
		attr->datatype_attr.count = coll_reduce_max(pi) / sz;
		attr->datatype_attr.size = sz;
		return 0;
	}
	default:
		return -FI_EOPNOTSUPP;
	}
}
