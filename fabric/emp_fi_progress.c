/* libemp-fi.so, the libfabric provider "emp": requests, bounce slots and
 * progress: turning the port's completions into CQ entries. See emp_fi.h and
 * fabric/README.md. */

#include "emp_fi.h"

/* ---- requests, bounce slots, progress ---------------------------------- */

struct emp_req *req_get(struct emp_fi_domain *dom)
{
	struct emp_req *r = dom->free_reqs;
	if (!r)
		return NULL;
	dom->free_reqs = r->next;
	memset(r, 0, sizeof *r);
	r->in_use = true;
	r->slot = -1;
	r->nslot = 0;
	r->tmp_key = -1;
	r->mrc_ent = -1;
	r->out_slot = -1;
	return r;
}

/* ---- bounce slots ---- */

static bool slot_is_free(const struct emp_fi_domain *dom, size_t i)
{
	return dom->slot_free[i / 64] >> (i % 64) & 1;
}

static void slots_mark(struct emp_fi_domain *dom, size_t first, size_t n, bool free_)
{
	for (size_t i = first; i < first + n; i++) {
		uint64_t bit = 1ULL << (i % 64);
		dom->slot_free[i / 64] = free_ ? dom->slot_free[i / 64] | bit : dom->slot_free[i / 64] & ~bit;
	}
	dom->nfree_slots = free_ ? dom->nfree_slots + n : dom->nfree_slots - n;
}

/* The domain's bounce memory: a slot for each request, as many as
 * BOUNCE_SLOTS_MAX, and where the NIC reaches it without pinning it
 * (direct attach: the arena is a shared file, its pages made only when
 * touched) FI_EMP_BOUNCE_MB more for runs. Runs take at most that budget,
 * so a request always finds its single slot. */
int slots_init(struct emp_fi_domain *dom)
{
	size_t single = dom->nreqs < BOUNCE_SLOTS_MAX ? dom->nreqs : BOUNCE_SLOTS_MAX;
	unsigned long mb = BOUNCE_RUN_MB_DEFAULT;
	int r = env_number("FI_EMP_BOUNCE_MB", BOUNCE_RUN_MB_MAX, "the bounce memory for large messages in MiB (0: none)",
			   &mb);
	if (r)
		return r;
	if (mb && emp_mr_by_address(dom->dev) != 1) {
		FI_INFO(&emp_prov, FI_LOG_DOMAIN, "bounce runs off: this NIC pins registered pages\n");
		mb = 0;
	}
	size_t runs = mb * ((1u << 20) / BOUNCE_SIZE);
	dom->bounce = emp_alloc(dom->dev, (single + runs) * BOUNCE_SIZE, &dom->bounce_key, &dom->bounce_off);
	if (!dom->bounce && runs) {
		FI_INFO(&emp_prov, FI_LOG_DOMAIN, "bounce runs off: no room for %lu MiB in the arena\n", mb);
		runs = 0;
		dom->bounce = emp_alloc(dom->dev, single * BOUNCE_SIZE, &dom->bounce_key, &dom->bounce_off);
	}
	dom->nslots = single + runs;
	dom->slot_free = calloc((dom->nslots + 63) / 64, sizeof *dom->slot_free);
	if (!dom->bounce || !dom->slot_free)
		return -FI_ENOMEM;
	slots_mark(dom, 0, dom->nslots, true);
	dom->run_slots_max = runs;
	return 0;
}

/* The first of n free consecutive slots, taken, or -1. A single slot comes
 * from the bottom and a run from the top, so singles do not split runs. */
int slot_get(struct emp_fi_domain *dom, size_t n)
{
	if (!n || n > dom->nfree_slots)
		return -1;
	if (n == 1) {
		for (size_t w = 0; w < (dom->nslots + 63) / 64; w++) {
			if (dom->slot_free[w]) {
				size_t i = w * 64 + (size_t)__builtin_ctzll(dom->slot_free[w]);
				slots_mark(dom, i, 1, false);
				return (int)i;
			}
		}
		return -1;
	}
	size_t run = 0;
	for (size_t i = dom->nslots; i-- > 0;) {
		if (!slot_is_free(dom, i)) {
			run = 0;
			continue;
		}
		if (++run == n) {
			slots_mark(dom, i, n, false);
			return (int)i;
		}
	}
	return -1;
}

void slot_put(struct emp_fi_domain *dom, int first, size_t n)
{
	slots_mark(dom, (size_t)first, n, true);
}

/* A request for one of `ep`'s transmit operations, once its transmit queue
 * and (unless the operation reports nothing: `no_entry`) its CQ have room,
 * progressing first when the queue is full; -FI_EAGAIN when there is none.
 * The domain lock is held. */
ssize_t tx_req_get(struct emp_fi_ep *ep, bool no_entry, uint64_t flags, void *context, uint64_t cq_flags,
		   struct emp_req **out)
{
	struct emp_fi_domain *dom = ep->dom;
	if (ep->tx_inflight >= ep->tx_size)
		progress(dom);
	struct emp_fi_cq *cq = ep->tx_cq;
	bool need_cq = cq && !no_entry;
	if (ep->tx_inflight >= ep->tx_size || (need_cq && cq->count + cq->reserved >= cq->size))
		return -FI_EAGAIN;
	struct emp_req *r = req_get(dom);
	if (!r)
		return -FI_EAGAIN;
	r->kind = REQ_SEND;
	r->ep = ep;
	r->context = context;
	r->cq_flags = cq_flags;
	r->want_entry = !no_entry && (!ep->tx_selective || (flags & FI_COMPLETION));
	*out = r;
	return 0;
}

/* A request from tx_req_get was posted: it holds a transmit slot, and its
 * CQ entry's room when it reports one. */
void tx_req_posted(struct emp_req *r, bool no_entry)
{
	r->ep->tx_inflight++;
	if (r->ep->tx_cq && !no_entry) {
		r->ep->tx_cq->reserved++;
		r->cq_reserved = true;
	}
}

/* fi_cq_strerror/fi_eq_strerror: a provider errno is an EMP completion
 * status; copied into buf when the caller gives one. */
const char *wc_strerror(int prov_errno, char *buf, size_t len)
{
	const char *s = emp_wc_status_str((uint32_t)prov_errno);
	if (buf && len) {
		snprintf(buf, len, "%s", s);
		return buf;
	}
	return s;
}

/* Gives back what a request holds and the request itself. */
void req_release(struct emp_fi_domain *dom, struct emp_req *r)
{
	if (r->tmp_key >= 0)
		emp_dereg_mr(dom->dev, (uint32_t)r->tmp_key);
	mrc_put(dom, r->mrc_ent);
	r->mrc_ent = -1;
	if (r->slot >= 0) {
		slot_put(dom, r->slot, r->nslot);
		if (r->nslot > 1)
			dom->run_slots -= r->nslot;
	}
	if (r->out_slot >= 0)
		slot_put(dom, r->out_slot, 1);
	free(r->heap);
	r->heap = NULL;
	coll_done(r);
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
void cq_push(struct emp_fi_cq *cq, const struct cq_ent *e)
{
	size_t tail = (cq->head + cq->count) % cq->size;
	cq->ring[tail] = *e;
	cq->count++;
}

void req_report(struct emp_req *r, int err, size_t len, size_t olen, uint64_t tag, uint16_t node,
		       uint16_t port, uint32_t status)
{
	struct emp_fi_ep *ep = r->ep;
	bool rx = r->kind == REQ_RECV;
	struct emp_fi_cq *cq = rx ? ep->rx_cq : ep->tx_cq;
	struct emp_fi_cntr *cntr = rx ? ep->rx_cntr : ep->tx_cntr;
	if (r->cq_flags & (FI_RMA | FI_ATOMIC))
		cntr = (r->cq_flags & FI_READ) ? ep->read_cntr : ep->write_cntr;
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
	if (rx && r->got_data) {
		e.flags |= FI_REMOTE_CQ_DATA;
		e.data = r->data;
	}
	cq_push(cq, &e);
	cq->reserved--;
	r->cq_reserved = false;
}

static void complete(struct emp_fi_domain *dom, const struct emp_wc_ex *wcx)
{
	const struct emp_wc *wc = &wcx->wc;
	struct emp_req *r = (struct emp_req *)(uintptr_t)wc->wr_id;
	if (r < dom->reqs || r >= dom->reqs + dom->nreqs || !r->in_use)
		return; /* not ours */
	r->got_data = wc->is_recv && (wcx->wc_flags & EMP_WC_WITH_IMM);
	r->data = wcx->imm;
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
		orphans_rehome(dom);
		return;
	}
	if (!r->ep) {
		req_release(dom, r);
		return;
	}
	size_t len = wc->byte_len;
	if (r->imm_pool) {
		imm_complete(dom, r, wc);
		return;
	}
	if (dom->orphans && r->kind == REQ_RECV && orphan_swap(dom, r, wcx))
		return;
	if ((r->kind == REQ_RECV || r->copy_out) && r->slot >= 0 && len)
		memcpy(r->buf, slot_ptr(dom, r->slot), len < r->len ? len : r->len);
	int err = status_errno(wc->status);
	if (r->discard && err == FI_ETRUNC) {
		err = 0; /* dropped, as asked */
		len = 0;
	}
	if (r->out_slot >= 0 && !err)
		memcpy(r->out_buf, slot_ptr(dom, r->out_slot), r->out_len);
	if (r->result_from_tag && !err && r->buf)
		memcpy(r->buf, &wc->tag, r->len); /* the low bytes: little-endian */
	size_t olen = (err == FI_ETRUNC && wc->msg_len > len) ? wc->msg_len - len : 0;
	if (err)
		FI_INFO(&emp_prov, FI_LOG_CQ, "%s failed: NIC status %u (%s), peer %u:%u, tag 0x%" PRIx64 "\n",
			r->kind == REQ_RECV ? "receive" : "send", wc->status, fi_strerror(err), wc->src_node,
			wc->src_port, wc->tag);
	req_report(r, err, len, olen, wc->tag, wc->src_node, wc->src_port, wc->status);
	req_release(dom, r);
}

/* Takes every completion the port has. Called with the domain lock. */
void progress(struct emp_fi_domain *dom)
{
	struct emp_wc_ex wc[POLL_BATCH];
	for (;;) {
		int n = emp_poll_cq_ex(dom->dev, wc, POLL_BATCH);
		for (int i = 0; i < n; i++)
			complete(dom, &wc[i]);
		if (n < POLL_BATCH)
			return;
	}
}

/* Arms the port's event, then takes what came meanwhile: afterwards the
 * eventfd fires on the next completion. */
void arm(struct emp_fi_domain *dom)
{
	drain_fd(dom->event_fd);
	emp_req_notify_cq(dom->dev);
	progress(dom);
}

/* Blocks until the port's event (or fd2) fires or timeout_ms passes. */
void wait_event(struct emp_fi_domain *dom, int fd2, int timeout_ms)
{
	struct pollfd p[2] = {{.fd = dom->event_fd, .events = POLLIN}, {.fd = fd2, .events = POLLIN}};
	if (dom->event_fd < 0) {
		/* A NIC without an interrupt: sleep briefly, then poll again. */
		usleep(50);
		return;
	}
	poll(p, fd2 >= 0 ? 2 : 1, timeout_ms);
}
