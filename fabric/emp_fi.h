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

/* This internal header holds the objects every part shares and the
 * functions the parts call across files; fabric/emp_fi_*.c are the parts,
 * one concern each. Not installed. */
#ifndef EMP_FI_H
#define EMP_FI_H

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
 * "bounce" slots. Larger ones, up to BOUNCE_RUN_MAX, are copied through a
 * run of consecutive slots where the NIC reaches the bounce memory without
 * pinning (direct attach) and runs are free; the rest are registered for
 * the operation (docs/libfabric.md, "Bounce runs"). */
#define BOUNCE_SIZE (64u * 1024u)
#define BOUNCE_SLOTS_MAX 512u
#define BOUNCE_RUN_MAX (4u << 20)
/* Slots for runs, in MiB (FI_EMP_BOUNCE_MB; 0: no runs). */
#define BOUNCE_RUN_MB_DEFAULT 64u
#define BOUNCE_RUN_MB_MAX 1024u
#define INJECT_SIZE 4096u
/* A non-blocking CQ read that found nothing this many times in a row gives
 * the CPU away once (docs/libfabric.md, "Point-to-point performance"). */
#define CQ_EMPTY_READS_PER_YIELD 16u
/* With both FI_MSG and FI_TAGGED on one endpoint, untagged messages carry
 * this tag bit, which tagged ones may not use (mem_tag_format says so). */
#define MSG_TAG_BIT (1ULL << 63)
#define ADDR_MAGIC 0x31504d45u /* "EMP1" */
#define AV_MAX (1u << 24)
#define CQ_SIZE_MAX (1u << 20)
#define POLL_BATCH 32

/* Directions of the primary caps: none named means all of them. */
#define EMP_DIR_CAPS (FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE)
#define EMP_PRIMARY_CAPS (FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_COLLECTIVE | EMP_DIR_CAPS)
#define EMP_SECONDARY_CAPS (FI_SOURCE | FI_DIRECTED_RECV | FI_LOCAL_COMM | FI_REMOTE_COMM)
#define EMP_CAPS (EMP_PRIMARY_CAPS | EMP_SECONDARY_CAPS)
#define EMP_MR_MODES (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED)
#define EMP_TX_OP_FLAGS (FI_COMPLETION | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE)
/* The transmit op flags an endpoint with these caps may default to: RMA,
 * atomics and collectives complete once done at the target, so an endpoint
 * without messages (whose completion promises less) may ask for
 * FI_DELIVERY_COMPLETE. */
static inline uint64_t tx_op_flags_ok(uint64_t caps)
{
	bool one_sided = (caps & (FI_RMA | FI_ATOMIC | FI_COLLECTIVE)) && !(caps & (FI_MSG | FI_TAGGED));
	return EMP_TX_OP_FLAGS | (one_sided ? FI_DELIVERY_COMPLETE : 0);
}
#define EMP_RX_OP_FLAGS (FI_COMPLETION)
#define EMP_MR_ACCESS (FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE)
/* RMA: op flags fi_writemsg/fi_readmsg take. EMP completes a write when the
 * target acknowledged it, after the data is in its memory: delivery
 * complete. */
#define EMP_RMA_FLAGS                                                                                        \
	(FI_COMPLETION | FI_INJECT | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE | FI_DELIVERY_COMPLETE | FI_MORE | \
	 FI_REMOTE_CQ_DATA)
/* Remote CQ data rides a write with immediate data (emp_post_write_imm),
 * which completes a receive at the target matching (initiator, tag =
 * immediate). The provider keeps a few receives posted for them with tag
 * IMM_TAG_BIT | data and the low 32 bits ignored: untagged messages (tag 0
 * or MSG_TAG_BIT) never match them, tagged ones could, so remote CQ data
 * (4 bytes) is offered on endpoints without FI_TAGGED only. */
#define IMM_TAG_BIT (1ULL << 62)
#define IMM_DATA_MASK 0xFFFFFFFFULL
#define CQ_DATA_SIZE 4u
#define IMM_POOL_MAX 16u
/* Collectives: members of an EMP group, groups one endpoint has joined at
 * once, distinct member lists it remembers join counts of. */
#define COLL_MEMBERS_MAX 64u
#define COLL_GROUPS_MAX 64u
#define COLL_JOIN_HIST_MAX 64u

struct emp_fi_mc;

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
	int slot;	    /* bounce slot (the first of a run), or -1 */
	unsigned nslot;	    /* slots from slot: 1, or a run's */
	int64_t tmp_key;    /* registration for this operation, or -1 */
	int mrc_ent;	    /* the registration cache's entry it uses, or -1 */
	bool cancelled;	    /* reported as canceled; the NIC still holds it */
	bool copy_out;	    /* an RMA read: the bounce slot's bytes go to buf */
	bool imm_pool;	    /* one of the endpoint's receives for remote CQ data */
	bool discard;	    /* FI_CLAIM | FI_DISCARD: completes with no data */
	bool result_from_tag; /* an atomic fetch: the old value (wc.tag) goes to buf */
	struct emp_fi_mc *mc; /* a collective's group */
	int out_slot;	      /* a reduction's result slot, or -1 */
	void *out_buf;	      /* where that slot's out_len bytes go */
	size_t out_len;
	/* A canceled receive's message that landed after all (an orphan). */
	size_t got_len;
	size_t msg_len;
	uint64_t got_tag;
	uint16_t src_node, src_port;
	/* A receive's remote CQ data (the sender's immediate data), if any. */
	bool got_data;
	uint32_t data;
	/* A receive posted to the NIC by its match (not a claimed one): what it
	 * matches, in EMP terms, and when it was posted, so a message that
	 * lands in a canceled receive can go to the oldest live one it matches
	 * (orphans_rehome). */
	bool matchable;
	uint16_t want_node, want_port;
	uint64_t want_tag, want_ignore;
	uint64_t post_seq;
	void *heap; /* an orphan's bytes when they are not in a bounce slot */
};

/* A message FI_PEEK | FI_CLAIM claimed, until the paired FI_CLAIM receive:
 * known by the caller's fi_context pointer (never dereferenced). */
#define CLAIMS_MAX 64u
struct emp_fi_claim {
	void *context;
	struct emp_fi_ep *ep;
	struct emp_req *orphan;	  /* a message that landed in a canceled receive, or NULL */
	struct emp_probed nic;	  /* else the NIC's claim */
};

/* The registration cache (emp_fi_mrcache.c): registrations of unregistered
 * large buffers kept for reuse, page-aligned [lo, hi). */
#define MRC_DEFAULT 0u /* off unless asked: docs/libfabric.md, "Registration cache" */
#define MRC_MAX 128u
struct mrc_ent {
	uintptr_t lo, hi;
	uint32_t key;
	bool valid;
	unsigned users;	   /* operations in flight on it: never evicted then */
	uint64_t last_use; /* the cache's clock at the last hit */
};
struct mr_cache {
	struct mrc_ent *ents; /* cap entries; NULL when off */
	size_t cap;
	uint64_t clock;
	size_t hits, misses, evictions;
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
	uint64_t *slot_free; /* a bit per bounce slot, set when free */
	size_t nslots, nfree_slots;
	size_t run_slots, run_slots_max; /* slots held by runs, and their budget */
	size_t runs, run_fallbacks; /* messages through runs, and those that found none */
	struct emp_req *orphans; /* oldest first */
	struct emp_fi_claim claims[CLAIMS_MAX];
	size_t nclaims;
	size_t zombies;		 /* canceled receives the NIC still holds */
	struct mr_cache mrc;
	uint64_t recv_seq;	 /* receives posted so far (emp_req.post_seq) */
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
	uint64_t data; /* remote CQ data (FI_REMOTE_CQ_DATA) */
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
	unsigned empty_reads; /* fi_cq_read calls in a row that found nothing */
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
	struct emp_fi_cntr *write_cntr, *read_cntr; /* FI_WRITE / FI_READ */
	size_t imm_posted;			     /* receives posted for remote CQ data */
	struct emp_fi_mc *mcs[COLL_GROUPS_MAX];	     /* joined collective groups */
	size_t nmcs;
	struct {
		uint32_t hash, count;
	} join_hist[COLL_JOIN_HIST_MAX]; /* groups joined per member list */
	size_t njoin_hist;
	struct emp_fi_eq *eq;
	uint64_t tx_op_flags, rx_op_flags;
	bool enabled;
	size_t tx_inflight, rx_inflight, tx_size, rx_size;
};


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

extern struct fi_provider emp_prov;

#define EP(fid) container_of(fid, struct emp_fi_ep, ep)

/* Operations not offered yet say so instead of leaving a NULL function
 * pointer for libfabric's inline wrappers to call. */
#define NOSYS_BODY return -FI_ENOSYS

/* Small helpers used by several parts. */
static inline uint32_t ep_code(uint16_t node, uint16_t port)
{
	return (uint32_t)node << 16 | port;
}

static inline char *slot_ptr(struct emp_fi_domain *dom, int slot)
{
	return dom->bounce + (size_t)slot * BOUNCE_SIZE;
}

static inline struct emp_sge slot_sge(struct emp_fi_domain *dom, int slot, size_t len)
{
	return (struct emp_sge){dom->bounce_key, (uint32_t)len, dom->bounce_off + (uint64_t)slot * BOUNCE_SIZE};
}

/* emp_fi_nic.c */
/* Setting `name` from the environment: *out unchanged when unset or empty;
 * -FI_EINVAL (with a warning saying `what` it is) unless a number from 0
 * to max. */
int env_number(const char *name, unsigned long max, const char *what, unsigned long *out);
struct emp_device *open_nic(int *err);
int query_nic(struct emp_port_info *pi);
int status_errno(uint32_t status);
ssize_t post_errno(int r);
void drain_fd(int fd);
int64_t now_ms(void);

/* emp_fi_av.c */
fi_addr_t av_reverse(const struct emp_fi_av *av, uint32_t key);
int av_resolve(const struct emp_fi_av *av, fi_addr_t a, uint16_t *node, uint16_t *port);
int name_copy_out(uint32_t code, void *addr, size_t *addrlen);
int fid_no_bind(struct fid *fid, struct fid *bfid, uint64_t flags);
int fid_no_control(struct fid *fid, int command, void *arg);
int fid_no_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops, void *context);
int av_open(struct fid_domain *fid, struct fi_av_attr *attr, struct fid_av **out, void *context);
/* emp_fi_eq.c */
ssize_t eq_push_locked(struct emp_fi_eq *eq, uint32_t event, const void *buf, size_t len);
int fab_eq_open(struct fid_fabric *f, struct fi_eq_attr *attr, struct fid_eq **out, void *context);
/* emp_fi_progress.c */
struct emp_req *req_get(struct emp_fi_domain *dom);
ssize_t tx_req_get(struct emp_fi_ep *ep, bool no_entry, uint64_t flags, void *context, uint64_t cq_flags,
		   struct emp_req **out);
void tx_req_posted(struct emp_req *r, bool no_entry);
const char *wc_strerror(int prov_errno, char *buf, size_t len);
void req_release(struct emp_fi_domain *dom, struct emp_req *r);
int slots_init(struct emp_fi_domain *dom);
int slot_get(struct emp_fi_domain *dom, size_t n);
void slot_put(struct emp_fi_domain *dom, int first, size_t n);
void cq_push(struct emp_fi_cq *cq, const struct cq_ent *e);
void req_report(struct emp_req *r, int err, size_t len, size_t olen, uint64_t tag, uint16_t node,
		uint16_t port, uint32_t status);
void progress(struct emp_fi_domain *dom);
void arm(struct emp_fi_domain *dom);
void wait_event(struct emp_fi_domain *dom, int fd2, int timeout_ms);
/* emp_fi_cq.c */
int wait_control(enum fi_wait_obj wait, int event_fd, int command, void *arg);
int wait_obj_pick(enum fi_wait_obj asked, const struct emp_fi_domain *dom, enum fi_wait_obj *out);
int cq_open(struct fid_domain *fid, struct fi_cq_attr *attr, struct fid_cq **out, void *context);
/* emp_fi_cntr.c */
int cntr_open(struct fid_domain *fid, struct fi_cntr_attr *attr, struct fid_cntr **out, void *context);
/* emp_fi_mr.c */
extern struct fi_ops_mr mr_ops;
/* emp_fi_msg.c */
/* The registration cache (emp_fi_mrcache.c), under the domain lock. init
 * reads FI_EMP_MR_CACHE (-FI_EINVAL when malformed); get returns the entry
 * covering [buf, buf+len) with its key, now in use, or -1 (off, or nothing
 * free: register for the operation instead); put ends a use; flush
 * deregisters everything (endpoint close); fini frees the table. */
int mrc_init(struct emp_fi_domain *dom);
int mrc_get(struct emp_fi_domain *dom, const void *buf, size_t len, uint32_t *key);
uint64_t mrc_offset(const struct emp_fi_domain *dom, int ent, const void *buf);
void mrc_put(struct emp_fi_domain *dom, int ent);
void mrc_flush(struct emp_fi_domain *dom);
void mrc_fini(struct emp_fi_domain *dom);
int place(struct emp_fi_domain *dom, struct emp_req *r, const void *buf, size_t len, void *desc, bool copy_in,
	  bool force_bounce, struct emp_sge *sge);
void orphans_rehome(struct emp_fi_domain *dom);
bool orphan_swap(struct emp_fi_domain *dom, struct emp_req *l, const struct emp_wc_ex *wcx);
const char *orphan_bytes(struct emp_fi_domain *dom, const struct emp_req *o);
extern struct fi_ops_msg msg_ops;
extern struct fi_ops_tagged tagged_ops;
/* emp_fi_rma.c */
extern struct fi_ops_rma rma_ops;
bool rma_cq_data_ok(uint64_t caps);
bool cq_data_ok(uint64_t caps);
int imm_pool_fill(struct emp_fi_ep *ep);
void imm_complete(struct emp_fi_domain *dom, struct emp_req *r, const struct emp_wc *wc);
/* emp_fi_atomic.c */
extern struct fi_ops_atomic atomic_ops;
/* 0, with *count = 1, when the NIC runs op on t for kind 0 (fi_atomic),
 * 1 (fi_fetch_atomic) or 2 (fi_compare_atomic); else -FI_EOPNOTSUPP. */
int atomic_valid(enum fi_datatype t, enum fi_op o, int kind, size_t *count);
/* emp_fi_coll.c */
extern struct fi_ops_collective coll_ops;
int av_set_open(struct fid_av *fid, struct fi_av_set_attr *attr, struct fid_av_set **out, void *context);
int coll_join(struct emp_fi_ep *ep, const void *addr, uint64_t flags, struct fid_mc **out, void *context);
void coll_done(struct emp_req *r);
size_t coll_reduce_max(const struct emp_port_info *pi);
int coll_query(const struct emp_port_info *pi, enum fi_collective_op coll, struct fi_collective_attr *attr,
	       uint64_t flags);
/* emp_fi_ep.c */
int ep_open(struct fid_domain *fid, struct fi_info *info, struct fid_ep **out, void *context);
int ep_open2(struct fid_domain *d, struct fi_info *info, struct fid_ep **ep, uint64_t flags, void *context);
/* emp_fi_domain.c */
int dom_open(struct fid_fabric *fid, struct fi_info *info, struct fid_domain **out, void *context);
int dom_open2(struct fid_fabric *f, struct fi_info *info, struct fid_domain **d, uint64_t flags, void *ctx);
/* emp_fi_fabric.c */
int fabric_open(struct fi_fabric_attr *attr, struct fid_fabric **out, void *context);

#endif /* EMP_FI_H */
