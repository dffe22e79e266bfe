/* EMP verbs library, C ABI (libemp.so). Errors are negative errno values.
 *
 *   struct emp_device *dev = emp_open_device(NULL, &err);   // EMP_DEVICE
 *   uint32_t key; uint64_t off;
 *   char *buf = emp_alloc(dev, 4096, &key, &off);             // registered
 *   struct emp_sge sge = { key, 4096, off };
 *   emp_post_recv(dev, 1, EMP_ANY_NODE, EMP_ANY_PORT, 7, 0, &sge, 1);
 *   struct emp_wc wc;
 *   int n = emp_wait_cq(dev, &wc, 1, -1);
 *
 * Posting and polling make no system call.
 */
#ifndef EMP_H
#define EMP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EMP_ANY_NODE 0xFFFFu
#define EMP_ANY_PORT 0xFFFFu

/* Memory access rights. */
#define EMP_ACCESS_LOCAL_READ   (1u << 0)
#define EMP_ACCESS_LOCAL_WRITE  (1u << 1)
#define EMP_ACCESS_REMOTE_READ  (1u << 2)
#define EMP_ACCESS_REMOTE_WRITE (1u << 3)
#define EMP_ACCESS_REMOTE_ATOMIC (1u << 4)

/* Completion status codes (struct emp_wc.status). */
enum emp_wc_status {
	EMP_WC_SUCCESS = 0,
	EMP_WC_TRUNCATED = 1,
	EMP_WC_REMOTE_PORT_CLOSED = 2,
	EMP_WC_RETRY_LIMIT_EXCEEDED = 3,
	EMP_WC_BAD_KEY = 4,
	EMP_WC_ACCESS_DENIED = 5,
	EMP_WC_FLUSHED = 6,
	EMP_WC_TABLE_FULL = 7,
	EMP_WC_TOO_LARGE = 8,
	EMP_WC_BAD_DESCRIPTOR = 9,
	EMP_WC_SENDER_ABORTED = 10,
	EMP_WC_DMA_ERROR = 11,
	EMP_WC_RNR_RETRY_EXCEEDED = 12,
	EMP_WC_REMOTE_TABLE_FULL = 13,
	EMP_WC_GROUP_INVALID = 14,
	EMP_WC_STALE_GROUP = 15,
	EMP_WC_INVALID_OP = 16,
	EMP_WC_COLL_MISMATCH = 17,
	EMP_WC_REMOTE_ACCESS_ERROR = 18,
	EMP_WC_NO_MESSAGE = 19, /* since EMP_1.3: a probe or claimed receive found nothing */
	EMP_WC_CANCELED = 20,   /* since EMP_1.7: a receive taken back by emp_cancel_recv */
};

/* The operation a completion reports (struct emp_wc.opcode). */
enum emp_wc_opcode {
	EMP_WC_SEND = 1,
	EMP_WC_RECV = 2,
	EMP_WC_ATOMIC_FETCH_ADD = 8,
	EMP_WC_ATOMIC_CMP_SWAP = 9,
	EMP_WC_ATOMIC_SWAP = 10,
	EMP_WC_RDMA_WRITE = 11,     /* since EMP_1.2 */
	EMP_WC_RDMA_READ = 12,      /* since EMP_1.2 */
	EMP_WC_RECV_RDMA_IMM = 13,  /* a receive consumed by a write with immediate data (is_recv = 1) */
	EMP_WC_PROBE = 14,          /* since EMP_1.3; only the library's own probes */
	EMP_WC_CANCEL = 16,         /* since EMP_1.7; only the library's own cancels */
	EMP_WC_START = 17,          /* since EMP_1.8: a start of a persistent slot that holds nothing */
};

/* Reduction element types and operators (NIC-offloaded reduce/allreduce). */
enum emp_dtype { EMP_I32 = 1, EMP_I64 = 2, EMP_U32 = 3, EMP_U64 = 4, EMP_F32 = 5, EMP_F64 = 6 };
enum emp_reduce_op { EMP_SUM = 1, EMP_PROD = 2, EMP_MIN = 3, EMP_MAX = 4, EMP_BAND = 5, EMP_BOR = 6, EMP_BXOR = 7 };
/* Barrier algorithms run by the NIC. */
enum emp_barrier_algo { EMP_BARRIER_PAIRWISE = 0, EMP_BARRIER_DISSEMINATION = 1, EMP_BARRIER_GATHER_RELEASE = 2 };

/* An endpoint: (node, port). */
struct emp_endpoint {
	uint16_t node;
	uint16_t port;
};

struct emp_group;

struct emp_device;

/* A scatter/gather entry: len bytes at offset within the region named by key. */
struct emp_sge {
	uint32_t key;
	uint32_t len;
	uint64_t offset;
};

struct emp_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t is_recv;
	uint32_t byte_len;
	uint32_t msg_len;
	uint64_t tag;		/* atomics: the word's value before the operation */
	uint16_t src_node;
	uint16_t src_port;
	uint8_t opcode;		/* enum emp_wc_opcode */
	uint8_t reserved[3];
};

/* A word in another port's memory, registered there with
 * EMP_ACCESS_REMOTE_ATOMIC: width (4 or 8) bytes at offset, naturally
 * aligned, of the region named by key and its remote-access secret (the
 * region owner's emp_remote_key: key = low 32 bits, secret = high 32).
 * EMP_1.2 added secret and reserved (zero): the target NIC refuses a
 * remote access without the region's secret. */
struct emp_remote_word {
	uint32_t key;
	uint32_t width;
	uint64_t offset;
	uint32_t secret;
	uint32_t reserved;
};

struct emp_port_info {
	uint16_t node;
	uint16_t port;
	uint32_t mtu;
	uint32_t nodes;
	uint32_t send_entries;
	uint32_t recv_entries;
	uint32_t reserved;
	uint64_t msg_max;
};

struct emp_device *emp_open_device(const char *path, int *err);
void emp_close_device(struct emp_device *dev);
int emp_query_port(struct emp_device *dev, struct emp_port_info *info);
void *emp_alloc(struct emp_device *dev, size_t len, uint32_t *key, uint64_t *offset);
int64_t emp_reg_mr(struct emp_device *dev, const void *addr, size_t len, uint32_t access);
int emp_dereg_mr(struct emp_device *dev, uint32_t key);
int emp_post_send(struct emp_device *dev, uint64_t wr_id, uint16_t node, uint16_t port, uint64_t tag,
		  const struct emp_sge *sge, size_t n);
int emp_post_recv(struct emp_device *dev, uint64_t wr_id, uint16_t node, uint16_t port, uint64_t tag,
		  uint64_t ignore, const struct emp_sge *sge, size_t n);
/* Takes up to n completions without blocking or a system call; returns how
 * many (0 = none yet), or -EPIPE once the NIC is found dead: while the queue
 * is empty it looks (every few hundred polls) at the liveness word the NIC
 * advances; when that stood still for EMP_NIC_DEAD_NS (2 s), this and every
 * later call on the device (polls, waits, posts) return -EPIPE. */
int emp_poll_cq(struct emp_device *dev, struct emp_wc *wc, size_t n);
/* Waits up to timeout_ms (-1 = forever, 0 = poll once) for completions;
 * returns how many (at least 1), -ETIMEDOUT when none came in time, or
 * -EPIPE when the NIC died (as emp_poll_cq) or its daemon went away. */
int emp_wait_cq(struct emp_device *dev, struct emp_wc *wc, size_t n, int timeout_ms);
int emp_req_notify_cq(struct emp_device *dev);
int emp_get_event_fd(struct emp_device *dev);
const char *emp_wc_status_str(uint32_t status);

/* The job (since EMP_1.1; docs/launch.md). A process started by `emp run`
 * (EMP_RANK, EMP_SIZE, EMP_RDV_DIR) or by a PMIx launcher (mpirun,
 * prterun, srun --mpi=pmix: PMIX_NAMESPACE, PMIX_RANK; libpmix.so.2 is
 * loaded then) learns its rank, the job's size and every rank's endpoint,
 * instead of assuming rank r is NIC r, port 0. Errors are negative errno
 * values: -EPROTO when the process was not started by a launcher or the
 * launcher's exchange failed (the reason is printed on stderr once). */
/* Recognizes the job; 0 or a negative errno. Optional: every emp_job_*
 * call does it first. Later calls return the first one's result. */
int emp_job_init(void);
/* This process's rank, or a negative errno. */
int emp_job_rank(void);
/* Ranks in the job, or a negative errno. */
int emp_job_size(void);
/* Opens the NIC this rank uses: EMP_DEVICE if set; else, with EMP_CLUSTER
 * naming a cluster file, the nodes of this host (EMP_HOST, else the
 * hostname) taken round robin by local rank (EMP_LOCAL_RANK,
 * PMIX_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, ...). NULL and *err (if
 * non-NULL): -ENODEV when neither variable is set, -EPROTO when the
 * cluster file does not name this host or cannot be read. */
struct emp_device *emp_job_open_device(int *err);
/* Collective, every rank once: publishes dev's endpoint and writes rank
 * r's endpoint into eps[r] for every rank (n must be at least the job's
 * size, else -EINVAL). 0 or a negative errno. */
int emp_job_endpoints(struct emp_device *dev, struct emp_endpoint *eps, size_t n);

/* Groups and NIC-offloaded collectives. Every member creates its groups,
 * and posts collectives on a group, in the same order. Nonblocking forms
 * complete in the CQ (wr_id); blocking forms return 0 or a negative errno
 * (-EIO when the operation completed with an error status, which is then
 * in *status if non-NULL). */
/* Waits until every rank of the job (emp run's or a PMIx launcher's, see
 * emp_job_init) has called it: through the rendezvous directory or a PMIx
 * fence, in a static job with messages over EMP. */
int emp_job_barrier(struct emp_device *dev);
struct emp_group *emp_group_create(struct emp_device *dev, uint32_t id, const struct emp_endpoint *members,
				   size_t n, int *err);
int emp_group_destroy(struct emp_device *dev, struct emp_group *g);
int emp_group_rank(const struct emp_group *g);
int emp_group_size(const struct emp_group *g);
/* Reliable broadcasts on g larger than bytes go by the NIC tree broadcast
 * instead of multicast fragments through the window (default 16 KiB; 0 =
 * always the tree). 0, or -EINVAL for a NULL group. */
int emp_group_set_rbcast_threshold(struct emp_group *g, size_t bytes);
int emp_post_barrier(struct emp_device *dev, uint64_t wr_id, const struct emp_group *g, enum emp_barrier_algo algo);
int emp_post_bcast(struct emp_device *dev, uint64_t wr_id, const struct emp_group *g, int root,
		   const struct emp_sge *sge, size_t n);
int emp_post_multisend(struct emp_device *dev, uint64_t wr_id, const struct emp_group *g, uint64_t ranks,
		       uint64_t tag, const struct emp_sge *sge, size_t n);
/* Since EMP_1.4: groups hold up to 1024 members (emp_group_create). A
 * multisend mask names 64 ranks: bit i of ranks is rank 64 * window + i
 * (emp_post_multisend is window 0). -EINVAL for a window past the group. */
int emp_post_multisend_window(struct emp_device *dev, uint64_t wr_id, const struct emp_group *g, uint16_t window,
			      uint64_t ranks, uint64_t tag, const struct emp_sge *sge, size_t n);
int emp_post_reduce(struct emp_device *dev, uint64_t wr_id, const struct emp_group *g, int root,
		    enum emp_dtype t, enum emp_reduce_op op, const struct emp_sge *send, const struct emp_sge *recv);
int emp_post_allreduce(struct emp_device *dev, uint64_t wr_id, const struct emp_group *g, enum emp_dtype t,
		       enum emp_reduce_op op, const struct emp_sge *send, const struct emp_sge *recv);
int emp_barrier(struct emp_device *dev, const struct emp_group *g, enum emp_barrier_algo algo, uint32_t *status);
int emp_bcast(struct emp_device *dev, const struct emp_group *g, int root, const struct emp_sge *sge, size_t n,
	      uint32_t *status);
int emp_allreduce(struct emp_device *dev, const struct emp_group *g, enum emp_dtype t, enum emp_reduce_op op,
		  const struct emp_sge *send, const struct emp_sge *recv, uint32_t *status);
/* Reliable broadcast over wire multicast (seed 002; EMP_1.4): coroots = 0
 * for the root alone, ack_every = ACK every M broadcasts (skewed; 0 or 1 =
 * every one), window = window entries the root may use (0 = all). Larger
 * than one frame: MTU fragments through the window, up to the group's
 * threshold (emp_group_set_rbcast_threshold), the NIC tree broadcast above
 * it; more fragments than the NIC's window: EMP_STATUS_TOO_LARGE. The
 * root's completes once its NIC holds the data. */
int emp_post_rbcast(struct emp_device *dev, uint64_t wr_id, const struct emp_group *g, int root, uint8_t coroots,
		    uint8_t ack_every, uint8_t window, const struct emp_sge *sge, size_t n);
int emp_rbcast(struct emp_device *dev, const struct emp_group *g, int root, uint8_t coroots, uint8_t ack_every,
	       uint8_t window, const struct emp_sge *sge, size_t n, uint32_t *status);
/* Since EMP_1.6: the algorithm as a structure, with co-root counts up to the
 * group's size (1024 members) and NAKs: naks = 1 makes members report a gap
 * in the root's sequence at once and collectors repair it at once; with
 * ack_every = 0 members then ACK only every half window (NAK-based), with
 * ack_every = M >= 1 every M broadcasts as well (hybrid). naks > 1 or a
 * reserved byte not zero: -EINVAL. */
struct emp_rbcast_algo {
	uint16_t coroots;    /* co-roots, below the group's size (0: the root alone) */
	uint8_t ack_every;   /* ACK every M (0 or 1: every one; with naks, 0: every half window) */
	uint8_t window;      /* window entries the root may use (0: all) */
	uint8_t naks;        /* 0: ACK-based (the paper's); 1: NAKs as well */
	uint8_t reserved[3]; /* zero */
};
int emp_post_rbcast_with(struct emp_device *dev, uint64_t wr_id, const struct emp_group *g, int root,
			 const struct emp_rbcast_algo *algo, const struct emp_sge *sge, size_t n);
int emp_rbcast_with(struct emp_device *dev, const struct emp_group *g, int root, const struct emp_rbcast_algo *algo,
		    const struct emp_sge *sge, size_t n, uint32_t *status);
/* Registered memory with its own access rights (e.g. EMP_ACCESS_REMOTE_ATOMIC). */
void *emp_alloc_mr(struct emp_device *dev, size_t len, uint32_t access, uint32_t *key, uint64_t *offset);

/* Remote atomics, executed by the target's NIC. Nonblocking: 0 or a negative
 * errno; the completion's tag and the result word get the old value. */
int emp_post_atomic_fetch_add(struct emp_device *dev, uint64_t wr_id, uint16_t node, uint16_t port,
			      const struct emp_remote_word *at, uint64_t add, const struct emp_sge *result);
int emp_post_atomic_cmp_swap(struct emp_device *dev, uint64_t wr_id, uint16_t node, uint16_t port,
			     const struct emp_remote_word *at, uint64_t compare, uint64_t swap,
			     const struct emp_sge *result);
int emp_post_atomic_swap(struct emp_device *dev, uint64_t wr_id, uint16_t node, uint16_t port,
			 const struct emp_remote_word *at, uint64_t value, const struct emp_sge *result);
/* Blocking: 0 with *old set, a negative errno, or a positive enum emp_wc_status
 * when the operation completed with an error. */
int emp_fetch_add(struct emp_device *dev, uint16_t node, uint16_t port, const struct emp_remote_word *at,
		  uint64_t add, uint64_t *old);
int emp_cmp_swap(struct emp_device *dev, uint16_t node, uint16_t port, const struct emp_remote_word *at,
		 uint64_t compare, uint64_t swap, uint64_t *old);
int emp_swap(struct emp_device *dev, uint16_t node, uint16_t port, const struct emp_remote_word *at,
	     uint64_t value, uint64_t *old);

/* Remote keys (since EMP_1.2). Another port names a region this port
 * registered by a 64-bit remote key: the region's key in the low 32 bits,
 * the 32-bit secret the NIC drew from the OS's random generator in the
 * high 32. The target NIC checks both (and the rights and bounds), counts
 * refusals, and refuses every remote access of a source that keeps
 * guessing for a while (EMP_WC_REMOTE_ACCESS_ERROR). */
/* Writes the remote key of region `key` (from emp_alloc_mr or emp_reg_mr
 * on this device) to *rkey: 0, or -ENOENT for a key this device did not
 * register, -EINVAL for a NULL rkey. */
int emp_remote_key(struct emp_device *dev, uint32_t key, uint64_t *rkey);

/* Remote write and read (since EMP_1.2; verbs' RDMA WRITE / READ): the NICs
 * move the bytes of sge[0..n) (this device's registered memory, n <= 5) to
 * or from remote_offset of the region `rkey` names at (node, port),
 * registered there with EMP_ACCESS_REMOTE_WRITE / EMP_ACCESS_REMOTE_READ.
 * 0, -EAGAIN when the ring is full, or a negative errno (-EINVAL: n > 5 or
 * a range that wraps). The operation completes here (EMP_WC_RDMA_WRITE /
 * EMP_WC_RDMA_READ, byte_len = bytes moved), exactly once whatever the
 * wire does; the target refuses a foreign key, a wrong secret, a missing
 * right or a range beyond the region with EMP_WC_REMOTE_ACCESS_ERROR and
 * leaves its memory unchanged. */
int emp_post_write(struct emp_device *dev, uint64_t wr_id, uint16_t node, uint16_t port, const struct emp_sge *sge,
		   size_t n, uint64_t rkey, uint64_t remote_offset);
/* As emp_post_write; then the target completes one of its posted receives
 * matching (this endpoint, tag = imm) as EMP_WC_RECV_RDMA_IMM (tag = imm,
 * msg_len = bytes written). The write waits until such a receive exists. */
int emp_post_write_imm(struct emp_device *dev, uint64_t wr_id, uint16_t node, uint16_t port,
		       const struct emp_sge *sge, size_t n, uint64_t rkey, uint64_t remote_offset, uint64_t imm);
int emp_post_read(struct emp_device *dev, uint64_t wr_id, uint16_t node, uint16_t port, const struct emp_sge *sge,
		  size_t n, uint64_t rkey, uint64_t remote_offset);

/* Since EMP_1.3: probing unexpected messages (MPI_Iprobe, MPI_Improbe /
 * MPI_Mrecv; FI_PEEK, FI_CLAIM, FI_DISCARD). A message no posted receive
 * took waits on the NIC; a probe reports the oldest one a receive for
 * (node, port, tag, ignore) would take, without receiving it. */
struct emp_probed {
	uint64_t tag;
	uint32_t len;      /* the message's length */
	uint32_t handle;   /* emp_probe_claim: the claim, for emp_post_recv_claimed */
	uint16_t src_node;
	uint16_t src_port;
	uint32_t reserved;
};
/* Returns 1 and fills *out when such a message waits, 0 when none does,
 * or a negative errno. Waits only for the NIC's answer. */
int emp_probe(struct emp_device *dev, uint16_t node, uint16_t port, uint64_t tag, uint64_t ignore,
	      struct emp_probed *out);
/* As emp_probe, and claims the message: later receives and probes pass it
 * by; only emp_post_recv_claimed with *out takes it. */
int emp_probe_claim(struct emp_device *dev, uint16_t node, uint16_t port, uint64_t tag, uint64_t ignore,
		    struct emp_probed *out);
/* Posts a receive of exactly the claimed message (n = 0 discards it). It
 * completes as a receive; EMP_WC_NO_MESSAGE if the claim was used. */
int emp_post_recv_claimed(struct emp_device *dev, uint64_t wr_id, const struct emp_probed *claimed,
			  const struct emp_sge *sge, size_t n);

/* Since EMP_1.7: takes back the posted receive wr_id (the oldest posted on
 * this port with that wr_id) if no message matched it yet (MPI_Cancel,
 * fi_cancel). Returns 1 when canceled: its completion, status
 * EMP_WC_CANCELED, follows on the CQ; 0 when the NIC holds no such
 * unmatched receive: it completes as it would have; or a negative errno.
 * Waits only for the NIC's answer. */
int emp_cancel_recv(struct emp_device *dev, uint64_t wr_id);

/* Since EMP_1.9: how long blocking calls (emp_wait_cq, emp_barrier, ...)
 * poll the CQ before sleeping on the port's event, in µs (default 20, or
 * EMP_SPIN_US); 0 sleeps at once, the least CPU when the NIC does the
 * work. Returns 0 or -EINVAL. */
int emp_set_spin_us(struct emp_device *dev, uint32_t us);

/* Since EMP_1.8: persistent descriptors (MPI_Send_init / MPI_Recv_init /
 * MPI_Start; EMP thesis 2.3.3). A send or receive is stored on the NIC in
 * slot `slot` (below EMP_PERSIST_SLOTS) of its ring's table, replacing
 * what the slot held; each start then writes 24 bytes into the ring and
 * the NIC runs the stored descriptor with the start's wr_id, reading the
 * buffer as it is at that moment. A store completes only when it fails
 * (wr_id 0); starting an empty slot completes EMP_WC_BAD_DESCRIPTOR with
 * opcode EMP_WC_START. Each returns 0, -EAGAIN when the ring is full, or a
 * negative errno (-EINVAL for a slot out of range). */
#define EMP_PERSIST_SLOTS 32U
int emp_send_init(struct emp_device *dev, uint8_t slot, uint16_t node, uint16_t port, uint64_t tag,
		  const struct emp_sge *sge, size_t n);
int emp_recv_init(struct emp_device *dev, uint8_t slot, uint16_t node, uint16_t port, uint64_t tag,
		  uint64_t ignore, const struct emp_sge *sge, size_t n);
int emp_start_send(struct emp_device *dev, uint64_t wr_id, uint8_t slot);
int emp_start_recv(struct emp_device *dev, uint64_t wr_id, uint8_t slot);

/* Since EMP_1.4: port context switch (docs/context-switch.md; direct
 * attach and, with an emp.ko that has EMP_IOC_PORT_CTX, the kernel
 * driver; an older driver answers -ENOTTY). Each returns 0 or a
 * negative errno. Suspend (C1); emp_port_is_stable returns 1 once nothing
 * is half sent or received (C2-C4), 0 before; save writes the port's NIC
 * state into registered memory (key, offset, at most room bytes; *len =
 * its length) and gives the NIC slot up: nothing may be posted until
 * restore (-EBADMSG: the image failed its checks, nothing changed), which
 * brings it back suspended, maybe in another slot, with the same endpoint;
 * resume (C8). */
int emp_port_suspend(struct emp_device *dev);
int emp_port_is_stable(struct emp_device *dev);
int emp_port_save(struct emp_device *dev, uint32_t key, uint64_t offset, uint64_t room, uint64_t *len);
int emp_port_restore(struct emp_device *dev, uint32_t key, uint64_t offset, uint64_t len);
int emp_port_resume(struct emp_device *dev);

/* Since EMP_1.4: immediate data on sends (libfabric's remote CQ data, the
 * source rank MPI libraries put there). The receive's completion, and a
 * probe that finds the message, report it with EMP_WC_WITH_IMM. */
#define EMP_WC_WITH_IMM (1u << 0)
struct emp_wc_ex {
	struct emp_wc wc;
	uint32_t imm;      /* with EMP_WC_WITH_IMM in wc_flags */
	uint32_t wc_flags; /* EMP_WC_WITH_* */
};
struct emp_probed_ex {
	struct emp_probed msg;
	uint32_t imm;      /* with EMP_WC_WITH_IMM in flags */
	uint32_t flags;    /* EMP_WC_WITH_* */
};
/* As emp_post_send, with 32 bits of immediate data. */
int emp_post_send_imm(struct emp_device *dev, uint64_t wr_id, uint16_t node, uint16_t port, uint64_t tag,
		      const struct emp_sge *sge, size_t n, uint32_t imm);
/* As emp_poll_cq / emp_wait_cq, with each completion's immediate data. */
int emp_poll_cq_ex(struct emp_device *dev, struct emp_wc_ex *wc, size_t n);
int emp_wait_cq_ex(struct emp_device *dev, struct emp_wc_ex *wc, size_t n, int timeout_ms);
/* As emp_probe (claim 0) or emp_probe_claim (claim nonzero), with the
 * message's immediate data; out->msg goes to emp_post_recv_claimed. */
int emp_probe_ex(struct emp_device *dev, uint16_t node, uint16_t port, uint64_t tag, uint64_t ignore, int claim,
		 struct emp_probed_ex *out);

/* Since EMP_1.5: 1 when the NIC reaches memory registered with
 * emp_reg_mr by virtual address at each access (direct attach), so a
 * registration stays right when its memory is unmapped and mapped again and
 * may be kept and reused (a registration cache); 0 when registering pinned
 * the pages (the kernel driver: a cached registration could go stale). */
int emp_mr_by_address(struct emp_device *dev);

#ifdef __cplusplus
}
#endif
#endif
