/* libemp-fi.so, the libfabric provider "emp": the registration cache.
 *
 * A buffer without a descriptor and larger than a bounce slot is registered
 * for its operation. Registering and deregistering each cost a round trip
 * to the NIC's daemon (and the deregistration a fence of the NIC), about
 * 50 µs each, p90 several hundred on a loaded machine: per 1 MiB message
 * more than the transfer. MPI libraries send from and receive into the same
 * buffers over and over, so the domain can keep those registrations, at
 * most `cap` of them (FI_EMP_MR_CACHE=cap), and reuse one that covers a
 * later buffer. It is off by default: measured under Open MPI on the shared
 * 2-core machine, large transfers were slower with it than with the round
 * trips (docs/libfabric.md, "Registration cache"), for a reason not yet
 * found.
 *
 * That is right only when the NIC reaches registered memory by virtual
 * address at each access (libemp's emp_mr_by_address: direct attach), so
 * a registration still means "these addresses" after the application freed
 * the memory and got it back mapped anew; through the kernel driver the
 * pages were pinned at registration and a kept one could go stale, so there
 * the cache is off and every such operation registers its own.
 *
 * Entries are page-aligned and grow: a miss next to or overlapping an idle
 * entry registers the union in its place, so a window of receives into
 * consecutive slots of one buffer ends up as one entry. The daemon refuses
 * a range whose ends it cannot read, and then the exact range is registered
 * instead. The domain lock is held for every call. */

#include "emp_fi.h"

#define PAGE_MASK ((uintptr_t)4095)
/* Both ways, so one entry serves sends and receives on the same memory. The
 * key never leaves the process (no remote rights). */
#define MRC_ACCESS (EMP_ACCESS_LOCAL_READ | EMP_ACCESS_LOCAL_WRITE)

int mrc_init(struct emp_fi_domain *dom)
{
	struct mr_cache *c = &dom->mrc;
	memset(c, 0, sizeof *c);
	unsigned long cap = MRC_DEFAULT;
	int r = env_number("FI_EMP_MR_CACHE", MRC_MAX, "the registration cache's entries (0: off)", &cap);
	if (r)
		return r;
	if (cap && emp_mr_by_address(dom->dev) != 1) {
		FI_INFO(&emp_prov, FI_LOG_DOMAIN, "registration cache off: this NIC pins registered pages\n");
		cap = 0;
	}
	if (!cap)
		return 0;
	c->ents = calloc(cap, sizeof *c->ents);
	if (!c->ents)
		return -FI_ENOMEM;
	c->cap = cap;
	return 0;
}

/* Deregisters every entry; requests that held one hold nothing now. */
void mrc_flush(struct emp_fi_domain *dom)
{
	struct mr_cache *c = &dom->mrc;
	for (size_t i = 0; i < c->cap; i++) {
		if (c->ents[i].valid)
			emp_dereg_mr(dom->dev, c->ents[i].key);
		c->ents[i].valid = false;
		c->ents[i].users = 0;
	}
	for (size_t i = 0; i < dom->nreqs; i++)
		dom->reqs[i].mrc_ent = -1;
}

void mrc_fini(struct emp_fi_domain *dom)
{
	struct mr_cache *c = &dom->mrc;
	if (c->cap)
		FI_INFO(&emp_prov, FI_LOG_DOMAIN, "registration cache: %zu hits, %zu misses, %zu evictions\n", c->hits,
			c->misses, c->evictions);
	/* The registrations go with the port (emp_close_device). */
	free(c->ents);
	memset(c, 0, sizeof *c);
}

/* An idle entry to replace: a free one, else the least recently used idle
 * one (deregistered here); -1 when every entry is in use. */
static ssize_t victim(struct emp_fi_domain *dom)
{
	struct mr_cache *c = &dom->mrc;
	ssize_t best = -1;
	for (size_t i = 0; i < c->cap; i++) {
		struct mrc_ent *e = &c->ents[i];
		if (!e->valid)
			return (ssize_t)i;
		if (!e->users && (best < 0 || e->last_use < c->ents[best].last_use))
			best = (ssize_t)i;
	}
	if (best >= 0) {
		emp_dereg_mr(dom->dev, c->ents[best].key);
		c->ents[best].valid = false;
		c->evictions++;
	}
	return best;
}

/* Registers [lo, hi) into entry i. */
static int fill(struct emp_fi_domain *dom, size_t i, uintptr_t lo, uintptr_t hi)
{
	int64_t key = emp_reg_mr(dom->dev, (const void *)lo, hi - lo, MRC_ACCESS);
	if (key < 0)
		return (int)key;
	dom->mrc.ents[i] = (struct mrc_ent){.lo = lo, .hi = hi, .key = (uint32_t)key, .valid = true};
	return 0;
}

int mrc_get(struct emp_fi_domain *dom, const void *buf, size_t len, uint32_t *key)
{
	struct mr_cache *c = &dom->mrc;
	if (!c->cap || !len)
		return -1;
	uintptr_t a = (uintptr_t)buf;
	if (a + len < a || a + len > UINTPTR_MAX - PAGE_MASK)
		return -1;
	uintptr_t lo = a & ~PAGE_MASK, hi = (a + len + PAGE_MASK) & ~PAGE_MASK;
	c->clock++;
	ssize_t adj = -1;
	for (size_t i = 0; i < c->cap; i++) {
		struct mrc_ent *e = &c->ents[i];
		if (!e->valid)
			continue;
		if (e->lo <= lo && hi <= e->hi) {
			e->users++;
			e->last_use = c->clock;
			c->hits++;
			*key = e->key;
			return (int)i;
		}
		if (adj < 0 && !e->users && e->lo <= hi && lo <= e->hi)
			adj = (ssize_t)i;
	}
	c->misses++;
	if (adj >= 0) {
		/* Grow an idle neighbour: register the union, then let the old go. */
		struct mrc_ent old = c->ents[adj];
		uintptr_t ulo = old.lo < lo ? old.lo : lo, uhi = old.hi > hi ? old.hi : hi;
		if (fill(dom, (size_t)adj, ulo, uhi) == 0) {
			emp_dereg_mr(dom->dev, old.key);
			goto got;
		}
		c->ents[adj] = old;
	}
	adj = victim(dom);
	if (adj < 0 || fill(dom, (size_t)adj, lo, hi) != 0)
		return -1; /* every entry busy, or the page-aligned range refused */
got:
	c->ents[adj].users = 1;
	c->ents[adj].last_use = c->clock;
	*key = c->ents[adj].key;
	return (int)adj;
}

uint64_t mrc_offset(const struct emp_fi_domain *dom, int ent, const void *buf)
{
	return (uintptr_t)buf - dom->mrc.ents[ent].lo;
}

void mrc_put(struct emp_fi_domain *dom, int ent)
{
	if (ent >= 0 && (size_t)ent < dom->mrc.cap && dom->mrc.ents[ent].users)
		dom->mrc.ents[ent].users--;
}
