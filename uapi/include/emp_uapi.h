/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * emp_uapi.h - EMP contracts, C view.
 *
 * Mirrors the Rust crate `emp-uapi` (uapi/src/), which is the source of
 * truth: the NIC memory map (SRAM header, admin mailbox, MR/route/group
 * tables, port windows), work descriptors and completions, physically
 * addressed translation formats, wire frames, the firmware image header,
 * the ioctl ABI of /dev/emp-nic, the direct-attach protocol of emp-nicd and
 * the in-process ABI of a loaded control program (firmware).
 *
 * Every structure has no implicit padding and is stored little-endian field
 * by field; on a little-endian host the in-memory layout below is the byte
 * image. On a big-endian host convert each field (le16toh / le32toh /
 * le64toh) when reading and writing shared memory or frames. The firmware
 * ABI structures (emp_fw_hal, emp_fw_config) are the exception: they are
 * passed in-process, in native byte order and layout.
 *
 * uapi/tests/c_layout.rs compiles this header and checks the size of every
 * structure, the offset and size of every field, and the value of every
 * constant against the Rust definitions.
 *
 * Usable from C (C11 or later), from C++ (C++11 or later) and from a kernel
 * build (__KERNEL__).
 */
#ifndef EMP_UAPI_H
#define EMP_UAPI_H

#ifdef __KERNEL__
#include <linux/types.h>  /* uint8_t .. uint64_t, int32_t, size_t */
#include <linux/stddef.h> /* offsetof */
#else
#include <stdint.h>
#include <stddef.h>
#endif

#if defined(__cplusplus)
#define EMP_STATIC_ASSERT(e, m) static_assert(e, m)
#else
#define EMP_STATIC_ASSERT(e, m) _Static_assert(e, m)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* General (lib.rs)                                                    */
/* ------------------------------------------------------------------ */

/* Node id / port number meaning "any" in a receive's source filter. */
#define EMP_ANY_NODE 0xFFFFU
#define EMP_ANY_PORT 0xFFFFU
/* Ethertype of EMP frames on raw Ethernet. */
#define EMP_ETHERTYPE_EMP 0x88B5U
/* Host page size assumed by the physically addressed formats. */
#define EMP_PAGE_SIZE 4096U

/* ------------------------------------------------------------------ */
/* Wire frames (wire.rs)                                               */
/*                                                                     */
/*   DATA, index 0:  emp_frame_header | emp_msg_header | payload       */
/*   DATA, index >0: emp_frame_header | payload                        */
/*   ACK / NACK:     emp_frame_header | emp_ack_body                   */
/*   COLL_DATA:      as DATA; the message payload starts with an       */
/*                   emp_coll_header (validated in frame 0)            */
/*   ATOMIC_REQ:     emp_frame_header | emp_atomic_body                */
/*                   (msg_seq = the per-peer atomic sequence)          */
/*   ATOMIC_RESP:    emp_frame_header | emp_atomic_result              */
/*                   (doubles as the ACK)                              */
/*   RMA:            as DATA; the payload starts with emp_rma_header   */
/*   RBCAST:         emp_frame_header | emp_rbcast_header | data       */
/*                   (reliable broadcast: data to a multicast address, */
/*                   ACKs to a collector; repairs are COLL_DATA of     */
/*                   kind EMP_COLL_KIND_RBCAST with the same body)     */
/*                                                                     */
/* Collective messages share the per-peer message sequence,            */
/* reliability and flow control of DATA; the NIC consumes them itself. */
/* Atomics have their own per-peer sequence, a window of               */
/* EMP_ATOMIC_WINDOW and a result cache at the target.                 */
/* ------------------------------------------------------------------ */

#define EMP_WIRE_VERSION 6U
/* Largest frame (headers + payload) a NIC accepts. */
#define EMP_MTU_MAX 9000U
/* Destination node ids from EMP_MCAST_BASE are multicast addresses. */
#define EMP_MCAST_BASE 0xF000U
#define EMP_MCAST_GROUPS 0x0F00U
/* Smallest MTU. */
#define EMP_MTU_MIN 256U

/* Frame kinds (emp_frame_header.kind). */
#define EMP_FRAME_DATA 1U
#define EMP_FRAME_ACK 2U
#define EMP_FRAME_NACK 3U
#define EMP_FRAME_COLL_DATA 4U   /* payload starts with an emp_coll_header */
#define EMP_FRAME_ATOMIC_REQ 5U  /* body: emp_atomic_body */
#define EMP_FRAME_ATOMIC_RESP 6U /* body: emp_atomic_result */
#define EMP_FRAME_RMA 7U         /* payload starts with an emp_rma_header */
#define EMP_FRAME_RBCAST 8U      /* body: emp_rbcast_header, then data */

/* NACK reasons (emp_ack_body.reason). */
#define EMP_NACK_LOSS 1U
#define EMP_NACK_NO_MATCH 2U
#define EMP_NACK_PORT_CLOSED 3U
#define EMP_NACK_PEER_TABLE_FULL 4U
#define EMP_NACK_TOO_LARGE 5U
#define EMP_NACK_STALE_EPOCH 6U   /* collective message for an older group epoch */
#define EMP_NACK_COLL_MISMATCH 7U /* receiver's collective instance disagrees */
#define EMP_NACK_REMOTE_ACCESS 8U /* remote write/read refused: key, secret, rights, bounds */
#define EMP_NACK_RETAINED 9U      /* header kept as an unexpected entry: wait for RDV_READ */

/* Header of every EMP frame (32 bytes). */
struct emp_frame_header {
	uint8_t version;      /* EMP_WIRE_VERSION */
	uint8_t kind;         /* EMP_FRAME_* */
	uint16_t dst_gen;     /* destination port generation as learned from
	                       * its ACKs (0 = not known yet) */
	uint16_t src_node;
	uint16_t dst_node;
	uint16_t src_port;
	uint16_t dst_port;
	uint16_t src_gen;     /* generation of the sending port */
	uint16_t payload_len; /* DATA: payload bytes after the header(s) */
	uint32_t msg_seq;
	uint32_t tx_floor;
	uint32_t frame_index;
	uint32_t frame_count;
};

/* Message header, carried by frame 0 of every message (24 bytes). */
struct emp_msg_header {
	uint64_t tag;
	uint64_t total_len;
	uint32_t imm;   /* the sender's immediate data with EMP_MSG_IMM, else 0 */
	uint32_t flags; /* EMP_MSG_* */
};
/* Message header flag: imm carries the sender's immediate data. */
#define EMP_MSG_IMM (1U << 0)

/* Body of ACK and NACK frames (16 bytes). */
struct emp_ack_body {
	uint32_t group;
	uint32_t missing_mask; /* NACK(LOSS): bit i = frame group_first + i missing */
	uint16_t rx_credits;
	uint8_t reason;        /* EMP_NACK_* for NACK, zero for ACK */
	uint8_t fc_level;      /* EMP_FC_GO, EMP_FC_SLOW (half the credits), EMP_FC_STOP */
	uint32_t rx_expected;  /* every message before it wholly received (cumulative ACK) */
};

/* group of an ACK that acknowledges no group: a flow-control update. */
#define EMP_ACK_NO_GROUP 0xFFFFFFFFU
#define EMP_FC_GO 0U
#define EMP_FC_SLOW 1U
#define EMP_FC_STOP 2U

/* Atomic requests a requester keeps unanswered per peer; the target caches
 * this many results per peer, so every retransmission hits the cache. */
#define EMP_ATOMIC_WINDOW 16U

/* Atomic operations on the wire (emp_atomic_body.op). */
#define EMP_ATOMIC_OP_FETCH_ADD 1U /* X -> X + operand */
#define EMP_ATOMIC_OP_CMP_SWAP 2U  /* X -> operand if X == compare */
#define EMP_ATOMIC_OP_SWAP 3U      /* X -> operand */

/* Body of an ATOMIC_REQ frame (40 bytes). */
struct emp_atomic_body {
	uint8_t op;        /* EMP_ATOMIC_OP_* */
	uint8_t width;     /* word width in bytes: 4 or 8 */
	uint16_t reserved; /* zero */
	uint32_t rkey;     /* remote key of the target region */
	uint64_t offset;   /* of the word within the region (naturally aligned) */
	uint64_t operand;  /* addend / new value */
	uint64_t compare;  /* compare value (CMP_SWAP), else 0 */
	uint32_t secret;   /* the region's remote-access secret */
	uint32_t reserved2; /* zero */
};

/* RMA operations (emp_rma_header.op). */
#define EMP_RMA_OP_WRITE 1U     /* data to (rkey, offset) */
#define EMP_RMA_OP_WRITE_IMM 2U /* and complete a receive matching tag = cookie */
#define EMP_RMA_OP_READ_REQ 3U  /* read len bytes at (rkey, offset); header only */
#define EMP_RMA_OP_READ_RESP 4U /* the data for the read named by cookie */
#define EMP_RMA_OP_RDV_READ 5U  /* rendezvous pull of send seq = offset; header only */

/* Header at the start of every RMA message's payload (32 bytes). */
struct emp_rma_header {
	uint8_t op;          /* EMP_RMA_OP_* */
	uint8_t reserved[3]; /* zero */
	uint32_t rkey;       /* target region key, else 0 */
	uint32_t secret;     /* the region's remote-access secret */
	uint32_t len;        /* READ_REQ: bytes to read, else 0 */
	uint64_t offset;     /* within the target region, else 0 */
	uint64_t cookie;     /* WRITE_IMM: immediate; READ_*: the read's name; else 0 */
};

/* Reliable-broadcast frame kinds (emp_rbcast_header.kind) and flags. */
#define EMP_RBCAST_DATA 1U      /* seq = the message's number in its root's sequence */
#define EMP_RBCAST_ACK 2U       /* cumulative: every message of root below seq is held */
#define EMP_RBCAST_POLL 3U      /* a root at zero credit asks for the re-post count */
#define EMP_RBCAST_NAK 4U       /* messages seq .. seq + span of root are missing */
#define EMP_RBCAST_ANNOUNCE 5U  /* a root's messages below seq were sent (multicast) */
#define EMP_RBCAST_PIGGY_ACK 1U /* ack_root / ack_next carry an ACK (DATA only) */
#define EMP_RBCAST_P2P 2U       /* a co-root copy (reliable point-to-point) */
#define EMP_RBCAST_FLAG_NAK 4U  /* DATA: members NAK gaps in the root's sequence */
#define EMP_RBCAST_REPAIR 8U    /* DATA: a repair, unicast RBCAST frame (unreliable) */

/* Header of a reliable-broadcast frame (44 bytes; seed 002). */
struct emp_rbcast_header {
	uint32_t group_id;
	uint32_t epoch;
	uint32_t seq;        /* DATA: number in the root's sequence; ACK: next expected */
	uint32_t reposted;   /* receive buffers the sender re-posted (credits, cumulative) */
	uint32_t ack_next;   /* with EMP_RBCAST_PIGGY_ACK: ACK for ack_root */
	uint16_t len;        /* data bytes after the header */
	uint16_t root;       /* root rank */
	uint16_t sender;     /* sender rank */
	uint16_t ack_root;
	uint8_t kind;        /* EMP_RBCAST_DATA / ACK / POLL / NAK / ANNOUNCE */
	uint8_t flags;       /* EMP_RBCAST_PIGGY_ACK | P2P | FLAG_NAK | REPAIR */
	uint8_t ack_every;   /* DATA: ACK every M messages, >= 1 */
	uint8_t reserved;    /* zero */
	uint16_t coroots;    /* DATA: the root's co-root count */
	uint16_t frag;       /* DATA: fragment index in the message */
	uint16_t frags;      /* DATA: fragments of the message, >= 1 */
	uint16_t span;       /* NAK: messages missing from seq on, >= 1 */
	uint32_t msg_len;    /* DATA: bytes of the whole message */
};

/* Body of an ATOMIC_RESP frame (16 bytes). */
struct emp_atomic_result {
	uint8_t status;      /* EMP_STATUS_* for the requester */
	uint8_t reserved[7]; /* zero */
	uint64_t old;        /* the word's value before the operation */
};

/* ------------------------------------------------------------------ */
/* Descriptors, completions, MR table (desc.rs)                        */
/* ------------------------------------------------------------------ */

#define EMP_SGE_MAX 6U

/*
 * Work descriptor opcodes (emp_work_desc.opcode, emp_cqe.opcode).
 * Collectives (MULTI_SEND .. ALLREDUCE) name a group: `node` is the group
 * slot. Per opcode, the fields mean:
 *   MULTI_SEND  port 0, tag, ignore = mask of destination ranks (nonzero),
 *               sge = payload, read once
 *   BCAST       port = root rank, tag = tree index (< EMP_TREES_MAX),
 *               ignore 0, sge = the buffer (root: source; others: destination)
 *   BARRIER     port = EMP_BARRIER_*, tag = tree index (gather-release),
 *               ignore 0, no sge
 *   REDUCE      port = root rank, tag = EMP_REDUCE_TAG(dtype, op, tree),
 *               ignore = element count (1 .. 2^32-1), sge[0] = input,
 *               sge[1] = result (root only); 1 or 2 sge
 *   ALLREDUCE   as REDUCE with port 0 and a result buffer on every member
 *   ATOMIC_*    node/port = target (not ANY), 2 sge: sge[0] = local result
 *               word (len = width 4 or 8), sge[1] = the remote word as an
 *               emp_remote_sge {key, secret, offset naturally aligned};
 *               tag = addend / new value, ignore = compare (CMP_SWAP, else 0);
 *               with width 4, tag and ignore fit in 32 bits
 *   RDMA_WRITE  node/port = target (not ANY), n >= 1 sge: sge[0..n-1] =
 *               local source, sge[n-1] = the remote region as an
 *               emp_remote_sge; ignore 0; with EMP_WD_IMM tag = immediate
 *               data (the target completes a matching posted receive as
 *               RECV_RDMA_IMM), else tag 0
 *   RDMA_READ   as RDMA_WRITE, sge[0..n-1] = local destination, tag 0
 *   RECV_RDMA_IMM  completions only
 */
#define EMP_OP_SEND 1U
#define EMP_OP_RECV 2U
#define EMP_OP_MULTI_SEND 3U
#define EMP_OP_BCAST 4U
#define EMP_OP_BARRIER 5U
#define EMP_OP_REDUCE 6U
#define EMP_OP_ALLREDUCE 7U
#define EMP_OP_ATOMIC_FETCH_ADD 8U
#define EMP_OP_ATOMIC_CMP_SWAP 9U
#define EMP_OP_ATOMIC_SWAP 10U
#define EMP_OP_RDMA_WRITE 11U
#define EMP_OP_RDMA_READ 12U
#define EMP_OP_RECV_RDMA_IMM 13U
#define EMP_OP_PROBE 14U /* receive ring: peek (or claim) an unexpected message; no SGEs */
#define EMP_OP_RBCAST 15U /* reliable broadcast over multicast; tag = EMP_RBCAST_TAG() */
#define EMP_OP_CANCEL 16U /* receive ring: take back the posted receive whose wr_id is tag */
#define EMP_OP_START 17U  /* run the persistent descriptor in slot tag of this ring's table */
/* Reliable broadcast algorithm (EMP_OP_RBCAST tag): co-roots (16 bits: the low
 * byte, then the high byte at bit 24), ACK every M, window, and the NAK bit. */
#define EMP_RBCAST_TAG_NAK (1ULL << 32)
#define EMP_RBCAST_TAG(coroots, ack_every, window)                                               \
	((uint64_t)((uint16_t)(coroots) & 0xFFU) | (uint64_t)(uint8_t)(ack_every) << 8 |          \
	 (uint64_t)(uint8_t)(window) << 16 | (uint64_t)((uint16_t)(coroots) >> 8) << 24)
#define EMP_RBCAST_TAG_NAKS(coroots, ack_every, window) (EMP_RBCAST_TAG(coroots, ack_every, window) | EMP_RBCAST_TAG_NAK)

/* Work descriptor flags. */
#define EMP_WD_SIGNALED (1U << 0)
#define EMP_WD_IMM (1U << 1) /* RDMA_WRITE: tag is immediate data; SEND: ignore (32 bits) is */
#define EMP_WD_CLAIM (1U << 2) /* PROBE: claim it; RECV: take the claimed message tag names */
#define EMP_WD_PERSIST (1U << 3) /* SEND/RECV: store in persistent slot `slot`, do not run */
#define EMP_WD_FLAGS_ALL (EMP_WD_SIGNALED | EMP_WD_IMM | EMP_WD_CLAIM | EMP_WD_PERSIST)
#define EMP_PERSIST_SLOTS 32U /* per ring and port */
#define EMP_START_BYTES 24U   /* an EMP_OP_START is read through its tag */

/* Completion status codes (emp_cqe.status). */
#define EMP_STATUS_SUCCESS 0U
#define EMP_STATUS_TRUNCATED 1U
#define EMP_STATUS_REMOTE_PORT_CLOSED 2U
#define EMP_STATUS_RETRY_LIMIT_EXCEEDED 3U
#define EMP_STATUS_BAD_KEY 4U
#define EMP_STATUS_ACCESS_DENIED 5U
#define EMP_STATUS_FLUSHED 6U
#define EMP_STATUS_TABLE_FULL 7U
#define EMP_STATUS_TOO_LARGE 8U
#define EMP_STATUS_BAD_DESCRIPTOR 9U
#define EMP_STATUS_SENDER_ABORTED 10U
#define EMP_STATUS_DMA_ERROR 11U
#define EMP_STATUS_RNR_RETRY_EXCEEDED 12U
#define EMP_STATUS_REMOTE_TABLE_FULL 13U
#define EMP_STATUS_GROUP_INVALID 14U      /* no such group slot, not this port's, or not a member */
#define EMP_STATUS_STALE_GROUP 15U        /* group re-created (new epoch) during the operation */
#define EMP_STATUS_INVALID_OP 16U         /* datatype and operation do not combine */
#define EMP_STATUS_COLL_MISMATCH 17U      /* members disagree on the collective */
#define EMP_STATUS_REMOTE_ACCESS_ERROR 18U /* target refused a remote atomic */
#define EMP_STATUS_NO_MESSAGE 19U /* probe found nothing; claimed receive names nothing */
#define EMP_STATUS_CANCELED 20U /* a receive taken back by EMP_OP_CANCEL */

/* Completion flag: owner (phase) bit, flips each time the CQ wraps. */
#define EMP_CQE_PHASE (1U << 0)
/* Completion flag: a receive or probe of a message with immediate data (emp_cqe.imm). */
#define EMP_CQE_IMM (1U << 1)

/* MR translation formats (emp_mr_entry.format). */
#define EMP_MR_FORMAT_INVALID 0U
#define EMP_MR_FORMAT_SHORT 1U
#define EMP_MR_FORMAT_CHAINED 2U
#define EMP_MR_FORMAT_INDIRECT 3U

/* Segments held inline in an MR entry. */
#define EMP_MR_INLINE_SEGS 7U
/* emp_phys_seg entries per indirect page. */
#define EMP_SEGS_PER_PAGE (EMP_PAGE_SIZE / 16U)
/* Segment flag: addr is the next page of segments, not data. */
#define EMP_SEG_LINK (1U << 0)

/* MR access bits (emp_mr_entry.access, emp_reg_mr.access). */
#define EMP_MR_LOCAL_READ (1U << 0)
#define EMP_MR_LOCAL_WRITE (1U << 1)
#define EMP_MR_REMOTE_READ (1U << 2)
#define EMP_MR_REMOTE_WRITE (1U << 3)
#define EMP_MR_REMOTE_ATOMIC (1U << 4)
#define EMP_MR_ACCESS_ALL 0x1FU

/* One scatter/gather element (16 bytes). */
struct emp_sge {
	uint32_t key;    /* memory region key */
	uint32_t len;
	uint64_t offset; /* within the region */
};

/* The remote end of a remote-access descriptor, in its last sge slot (16 bytes). */
struct emp_remote_sge {
	uint32_t key;    /* the target's region key */
	uint32_t secret; /* the region's remote-access secret */
	uint64_t offset; /* within the target's region */
};

/* A send or receive work descriptor (128 bytes), in a port ring slot. */
struct emp_work_desc {
	uint64_t wr_id;
	uint8_t opcode;    /* EMP_OP_* */
	uint8_t flags;     /* EMP_WD_* */
	uint8_t num_sge;
	uint8_t slot; /* EMP_WD_PERSIST: persistent slot; else zero */
	uint16_t node;     /* send: destination; recv: source or EMP_ANY_NODE */
	uint16_t port;     /* send: destination; recv: source or EMP_ANY_PORT */
	uint64_t tag;
	uint64_t ignore;   /* recv: tag bits ignored when matching; send: immediate
	                    * data with EMP_WD_IMM (32 bits), else zero */
	struct emp_sge sge[EMP_SGE_MAX];
};

/*
 * A completion queue entry (40 bytes). The NIC writes bytes 0..38, then
 * (after a DMA fence) `flags`, the last byte: read `flags` first, check its
 * phase, then (after an acquire fence) the rest.
 */
struct emp_cqe {
	uint64_t wr_id;
	uint64_t tag;
	uint32_t byte_len;
	uint32_t msg_len;
	uint32_t imm;       /* with EMP_CQE_IMM: the sender's immediate data */
	uint32_t reserved1;
	uint16_t src_node;
	uint16_t src_port;
	uint8_t status;   /* EMP_STATUS_* */
	uint8_t opcode;   /* EMP_OP_* */
	uint8_t reserved;
	uint8_t flags;    /* EMP_CQE_PHASE, EMP_CQE_IMM; the last byte, written last */
};

/* Byte offset of emp_cqe.flags (the last byte, written last). */
#define EMP_CQE_FLAGS_OFFSET 39U

/* A physically addressed segment (16 bytes). */
struct emp_phys_seg {
	uint64_t addr;
	uint32_t len;
	uint32_t flags; /* EMP_SEG_* */
};

/* An MR (translation) table entry in SRAM (144 bytes). */
struct emp_mr_entry {
	uint32_t key;    /* low 16 bits: index in the table */
	uint16_t port;   /* owning port */
	uint8_t access;  /* EMP_MR_* access bits */
	uint8_t format;  /* EMP_MR_FORMAT_* */
	uint64_t length;
	uint64_t indirect_addr;
	uint32_t indirect_count;
	uint32_t secret; /* remote-access secret, presented with the key */
	struct emp_phys_seg segs[EMP_MR_INLINE_SEGS];
};

/* ------------------------------------------------------------------ */
/* Collectives (coll.rs)                                               */
/* ------------------------------------------------------------------ */

/* Trees a group table entry holds (parent arrays). */
#define EMP_TREES_MAX 8U
/* Parent value of a tree's root in a parent array. */
#define EMP_TREE_ROOT 0xFFU
/* Parent value of a tree's root in a wide (16-bit) parent array (the body
 * of a group of more than EMP_GROUP_INLINE_MAX members). */
#define EMP_TREE_ROOT_WIDE 0xFFFFU
/* Ranks one MULTI_SEND mask covers: descriptor port = window w, ignore =
 * mask of ranks EMP_MULTISEND_WINDOW * w + i. */
#define EMP_MULTISEND_WINDOW 64U

/* Reduction element types. */
#define EMP_DTYPE_I32 1U
#define EMP_DTYPE_I64 2U
#define EMP_DTYPE_U32 3U
#define EMP_DTYPE_U64 4U
#define EMP_DTYPE_F32 5U /* IEEE-754 binary32 */
#define EMP_DTYPE_F64 6U /* IEEE-754 binary64 */

/* Reduction operators. Integer sum and product wrap; min/max keep the
 * accumulator unless the other value compares strictly less/greater.
 * The bitwise operators are undefined on floats (EMP_STATUS_INVALID_OP). */
#define EMP_REDUCE_SUM 1U
#define EMP_REDUCE_PROD 2U
#define EMP_REDUCE_MIN 3U
#define EMP_REDUCE_MAX 4U
#define EMP_REDUCE_BAND 5U
#define EMP_REDUCE_BOR 6U
#define EMP_REDUCE_BXOR 7U

/* The tag of a REDUCE / ALLREDUCE descriptor: dtype | op << 8 | tree << 16. */
#define EMP_REDUCE_TAG(dtype, op, tree) \
	((uint64_t)(dtype) | ((uint64_t)(op) << 8) | ((uint64_t)(tree) << 16))

/* Barrier algorithms (BARRIER descriptor `port`). */
#define EMP_BARRIER_PAIRWISE_EXCHANGE 0U
#define EMP_BARRIER_DISSEMINATION 1U
#define EMP_BARRIER_GATHER_RELEASE 2U /* up a group tree, release down it */

/* Round numbers of pairwise exchange's fix-up messages
 * (emp_coll_header.round; exchange rounds are 0..16). */
#define EMP_COLL_ROUND_PE_PRE 0xF0U
#define EMP_COLL_ROUND_PE_RELEASE 0xF1U

/* What a collective message is (emp_coll_header.kind). */
#define EMP_COLL_KIND_BCAST 1U           /* broadcast payload down a tree */
#define EMP_COLL_KIND_BARRIER_PE 2U      /* pairwise-exchange arrival */
#define EMP_COLL_KIND_BARRIER_DISS 3U    /* dissemination arrival */
#define EMP_COLL_KIND_BARRIER_GATHER 4U  /* gather-release: subtree arrived */
#define EMP_COLL_KIND_BARRIER_RELEASE 5U /* gather-release: release */
#define EMP_COLL_KIND_REDUCE_UP 6U       /* partial result, child -> parent */
#define EMP_COLL_KIND_ALLREDUCE_DOWN 7U  /* allreduce result down the tree */
#define EMP_COLL_KIND_RBCAST 8U          /* reliable broadcast repair / co-root copy */

/* Header at the start of every collective message's payload (32 bytes;
 * frame kind EMP_FRAME_COLL_DATA). */
struct emp_coll_header {
	uint32_t group_id;
	uint32_t epoch;
	uint32_t instance; /* the n-th collective posted on the group */
	uint8_t kind;      /* EMP_COLL_KIND_* */
	uint8_t round;     /* barrier round */
	uint8_t tree;      /* tree index (< EMP_TREES_MAX) */
	uint8_t dtype;     /* EMP_DTYPE_* (reductions; else 0) */
	uint8_t op;        /* EMP_REDUCE_* (reductions; else 0) */
	uint8_t reserved;  /* zero */
	uint16_t root;     /* root rank (broadcast, reduce) */
	uint16_t sender;   /* sender's rank in the group */
	uint16_t reserved2; /* zero */
	uint32_t count;    /* elements (reductions) or 0 */
	uint32_t reserved3; /* zero */
};

/* ------------------------------------------------------------------ */
/* NIC memory map (sram.rs)                                            */
/* ------------------------------------------------------------------ */

/* Board signature at SRAM offset 0: "EMP-NIC\0" little-endian. */
#define EMP_BOARD_SIGNATURE 0x0043494E2D504D45ULL
#define EMP_LAYOUT_VERSION 6U

/* NIC status (emp_sram_header.status). */
#define EMP_NIC_STATUS_RESET 0U
#define EMP_NIC_STATUS_LOADING 1U
#define EMP_NIC_STATUS_RUNNING 2U
#define EMP_NIC_STATUS_FAILED 3U

/* Why the NIC failed (emp_sram_header.fail_reason). */
#define EMP_FAIL_NONE 0U
#define EMP_FAIL_BAD_IMAGE_HEADER 1U
#define EMP_FAIL_WRONG_ABI 2U
#define EMP_FAIL_DIGEST_MISMATCH 3U
#define EMP_FAIL_BAD_SIGNATURE 4U
#define EMP_FAIL_LOAD_FAILED 5U
#define EMP_FAIL_BAD_LAYOUT 6U
#define EMP_FAIL_FIRMWARE_CRASHED 7U

/* Feature bits (emp_sram_header.features, emp_query.features). */
#define EMP_FEATURE_OVERFLOW (1U << 0)
#define EMP_FEATURE_MODIFIED_ACK_NACK (1U << 1)
#define EMP_FEATURE_ORDERED_REFUSAL (1U << 2) /* ports default to ordered refusal */
#define EMP_FEATURE_RX_DOUBLE_BUFFERING (1U << 3) /* NIC-to-host DMA two buffers deep */
#define EMP_FEATURE_IMMEDIATE_SENDING (1U << 4) /* one-frame sends go to the wire from host memory */

/* Matching modes (PORT_OPEN args[4]). */
#define EMP_MATCH_MODE_DEFAULT 0U
#define EMP_MATCH_MODE_UNEXPECTED 1U      /* unmatched messages held; later ones go on */
#define EMP_MATCH_MODE_ORDERED_REFUSAL 2U /* unmatched messages refused, order per sender */

/* Counter slots (emp_sram_header.counters[i]). */
#define EMP_COUNTER_TX_FRAMES 0U
#define EMP_COUNTER_RX_FRAMES 1U
#define EMP_COUNTER_RETRANSMITS 2U
#define EMP_COUNTER_DUPLICATES 3U
#define EMP_COUNTER_OUT_OF_ORDER 4U
#define EMP_COUNTER_ACKS_TX 5U
#define EMP_COUNTER_NACKS_TX 6U
#define EMP_COUNTER_DROPPED_UNEXPECTED 7U
#define EMP_COUNTER_DROPPED_MALFORMED 8U
#define EMP_COUNTER_TIMEOUTS 9U
#define EMP_COUNTER_MSGS_TX 10U
#define EMP_COUNTER_MSGS_RX 11U
#define EMP_COUNTER_MSGS_FAILED 12U
#define EMP_COUNTER_OVERFLOW_MSGS 13U
#define EMP_COUNTER_BAD_DESCRIPTORS 14U
#define EMP_COUNTER_ACKS_RX 15U
#define EMP_COUNTER_COLL_OPS 16U       /* collective operations completed */
#define EMP_COUNTER_COLL_EARLY 17U     /* collective messages before their op was posted */
#define EMP_COUNTER_COLL_REFUSED 18U   /* collective messages refused (sender retries) */
#define EMP_COUNTER_ATOMIC_REPLAYS 19U /* atomic requests answered from the result cache */
#define EMP_COUNTER_PEERS_RECLAIMED 20U /* idle peer entries reclaimed for a new peer */
#define EMP_COUNTER_REMOTE_REFUSED 21U  /* remote accesses refused (key, secret, rights, bounds) */
#define EMP_COUNTER_REMOTE_THROTTLED 22U /* refused: the source kept guessing keys */
#define EMP_COUNTER_UNEXP_EAGER 23U  /* unexpected messages held with their payload */
#define EMP_COUNTER_UNEXP_BYTES 24U  /* payload bytes of those */
#define EMP_COUNTER_UNEXP_RDV 25U    /* unexpected messages retained as a header (rendezvous) */
#define EMP_COUNTER_RDV_PULLS 26U    /* rendezvous pulls completed */
#define EMP_COUNTER_UNEXP_REFUSED_FULL 27U /* refused: unexpected pool and header table full */
#define EMP_COUNTER_COUNT 28U

/* Largest SRAM laid out; largest ring. */
#define EMP_SRAM_SIZE_MAX (1U << 30)
#define EMP_RING_ENTRIES_MAX 4096U

/* SRAM header at offset 0 (320 bytes). */
struct emp_sram_header {
	uint64_t magic;          /* EMP_BOARD_SIGNATURE */
	uint32_t layout_version; /* EMP_LAYOUT_VERSION */
	uint32_t status;         /* EMP_NIC_STATUS_* */
	uint32_t fail_reason;    /* EMP_FAIL_* */
	uint16_t node_id;
	uint16_t port_count;
	uint32_t mtu;
	uint32_t features;       /* EMP_FEATURE_* */
	uint32_t sram_size;
	uint32_t heartbeat;
	uint32_t admin_off;
	uint32_t staging_off;
	uint32_t staging_size;
	uint32_t mr_off;
	uint32_t mr_entries;
	uint32_t route_off;
	uint32_t route_entries;
	uint32_t group_off;
	uint32_t group_entries;
	uint32_t ports_off;
	uint32_t port_stride;
	uint32_t send_entries;
	uint32_t recv_entries;
	uint32_t staged_len;
	uint64_t counters[EMP_COUNTER_COUNT]; /* EMP_COUNTER_* */
};

/* Admin commands (emp_admin_mailbox.op). */
#define EMP_ADMIN_OP_NOP 0U
#define EMP_ADMIN_OP_PORT_OPEN 1U
#define EMP_ADMIN_OP_PORT_CLOSE 2U
#define EMP_ADMIN_OP_MR_FENCE 3U
#define EMP_ADMIN_OP_GROUP_SET 4U   /* load group slot args[0] (checked); a slot in
                                     * use is replaced (its ops fail STALE_GROUP) */
#define EMP_ADMIN_OP_GROUP_CLEAR 5U /* retire group slot args[0]: its ops finish FLUSHED */
/* Port context switch (docs/context-switch.md). */
#define EMP_ADMIN_OP_PORT_SUSPEND 6U
#define EMP_ADMIN_OP_PORT_STABLE 7U
#define EMP_ADMIN_OP_PORT_SAVE 8U
#define EMP_ADMIN_OP_PORT_RESTORE 9U
#define EMP_ADMIN_OP_PORT_RESUME 10U
#define EMP_ADMIN_OP_PORT_DISCARD 11U
#define EMP_PORT_ADDR_EXPLICIT 0x10000ULL /* PORT_OPEN args[5]: | wire address */
#define EMP_CTX_IMAGE_MAX 0x800000ULL /* largest port context image (PortSave/PortRestore) */

/* Admin result codes (emp_admin_mailbox.result). */
#define EMP_ADMIN_RESULT_OK 0U
#define EMP_ADMIN_RESULT_BAD_OP 1U
#define EMP_ADMIN_RESULT_BAD_ARG 2U
#define EMP_ADMIN_RESULT_BAD_STATE 3U
#define EMP_ADMIN_RESULT_BAD_KEY 4U
#define EMP_ADMIN_RESULT_NOT_STABLE 5U
#define EMP_ADMIN_RESULT_BAD_IMAGE 6U
#define EMP_ADMIN_RESULT_NO_ROOM 7U

/* Admin mailbox (64 bytes at admin_off). */
struct emp_admin_mailbox {
	uint32_t request_seq; /* host */
	uint32_t op;          /* host: EMP_ADMIN_OP_* */
	uint32_t done_seq;    /* NIC */
	uint32_t result;      /* NIC: EMP_ADMIN_RESULT_* */
	uint64_t args[6];     /* host */
};

/* Route table entry (32 bytes). */
struct emp_route_entry {
	uint32_t valid;     /* 1 = valid */
	uint32_t ipv4;      /* UDP backend; 0 if the address is IPv6 */
	uint16_t udp_port;  /* UDP backend */
	uint8_t mac[6];     /* packet backend */
	uint8_t ip6[16];    /* UDP backend: IPv6, or IPv4 as ::ffff:a.b.c.d */
};

/* Most members a group holds. */
#define EMP_GROUP_MEMBERS_MAX 1024U
/* Most members a group table entry holds inline. */
#define EMP_GROUP_INLINE_MAX 64U
/* Most members of a group using the reliable broadcast (= EMP_GROUP_MEMBERS_MAX;
 * the NIC sizes its per-member state by the group). */
#define EMP_RBCAST_MEMBERS_MAX 1024U

/*
 * Group table entry (1024 bytes): an ordered list of endpoints used by
 * collectives, and the trees the host built over them. A member is
 * (node << 16) | port. Written by the trusted side after checks: id != 0,
 * 1 <= member_count <= EMP_GROUP_MEMBERS_MAX, my_rank < member_count, no
 * endpoint twice, members[my_rank] is the caller (and its port is `port`),
 * 1 <= tree_count <= EMP_TREES_MAX, every parent array a tree, reserved
 * fields and unused members zero. The NIC loads it on GROUP_SET.
 *
 * A group of more than EMP_GROUP_INLINE_MAX members leaves members and
 * parents zero and is followed by a body: uint32_t members[member_count],
 * then tree_count arrays uint16_t parents[member_count] (EMP_TREE_ROOT_WIDE
 * for the root), zero-padded to a multiple of 1024 bytes. It takes
 * EMP_GROUP_SPAN(member_count, tree_count) consecutive table slots.
 */
#define EMP_GROUP_BODY_LEN(n, trees) \
	((n) > EMP_GROUP_INLINE_MAX ? 4U * (n) + 2U * (n) * (trees) : 0U)
#define EMP_GROUP_SPAN(n, trees) (1U + (EMP_GROUP_BODY_LEN(n, trees) + 1023U) / 1024U)
struct emp_group_entry {
	uint32_t group_id; /* 0 = unused */
	uint32_t epoch;    /* bumped on every re-creation */
	uint16_t member_count;
	uint16_t my_rank;  /* this NIC's rank in the group */
	uint16_t port;     /* owning port */
	uint8_t tree_count; /* trees in `parents` */
	uint8_t flags;     /* reserved, zero */
	/* bounce slots (application bypass) */
	uint32_t bounce_key;       /* region key */
	uint32_t bounce_slot_size; /* bytes per slot */
	uint64_t bounce_offset;    /* offset of slot 0 in the region */
	uint16_t bounce_slots;     /* 0 = none */
	uint16_t reserved0;        /* zero */
	uint32_t reserved1;        /* zero */
	uint8_t tree_lambda[EMP_TREES_MAX]; /* lambda each tree was built for */
	uint32_t members[EMP_GROUP_INLINE_MAX];
	/* Tree t is parents[64 t .. 64 t + member_count): the parent of each
	 * rank relative to the root, EMP_TREE_ROOT for rank 0. Tree 0 is
	 * binomial. */
	uint8_t parents[512];
	uint64_t reserved2[26];    /* zero */
};

/* Port states (emp_port_ctl.state). */
#define EMP_PORT_STATE_CLOSED 0U
#define EMP_PORT_STATE_OPEN 1U
#define EMP_PORT_STATE_SUSPENDED 2U

/* Control page at the start of every port window (first 192 bytes used). */
struct emp_port_ctl {
	/* host-written cache line */
	uint32_t send_prod;
	uint32_t recv_prod;
	uint32_t cq_cons;
	uint32_t arm;
	uint32_t host_pad[12];
	/* NIC-written cache line */
	uint32_t send_cons;
	uint32_t recv_cons;
	uint32_t cq_prod;      /* CQ slots taken (an entry is new by its phase byte) */
	uint32_t cq_overruns;
	uint32_t nic_sleeping; /* nonzero while the NIC sleeps on the doorbell:
	                        * the host rings the doorbell only then */
	uint32_t nic_alive;    /* advanced (never to 0) every EMP_NIC_ALIVE_PERIOD_NS
	                        * while the NIC runs; still for EMP_NIC_DEAD_NS = dead */
	uint32_t remote_refused;   /* remote accesses to this port refused */
	uint32_t remote_throttled; /* of those: the source kept guessing */
	uint32_t nic_pad[8];
	/* trusted side */
	uint32_t state;      /* EMP_PORT_STATE_* */
	uint32_t gen;
	uint32_t cq_key;
	uint32_t cq_entries; /* power of two */
	uint64_t cq_offset;
	uint64_t cfg_pad[5];
};

/* Offsets of emp_port_ctl fields, for single-word accesses. */
#define EMP_CTL_SEND_PROD 0U
#define EMP_CTL_RECV_PROD 4U
#define EMP_CTL_CQ_CONS 8U
#define EMP_CTL_ARM 12U
#define EMP_CTL_SEND_CONS 64U
#define EMP_CTL_RECV_CONS 68U
#define EMP_CTL_CQ_PROD 72U
#define EMP_CTL_CQ_OVERRUNS 76U
#define EMP_CTL_NIC_SLEEPING 80U
#define EMP_CTL_NIC_ALIVE 84U
#define EMP_NIC_ALIVE_PERIOD_NS 50000000ULL
#define EMP_NIC_DEAD_NS 2000000000ULL
#define EMP_CTL_STATE 128U
#define EMP_CTL_GEN 132U

/* ------------------------------------------------------------------ */
/* Firmware image (image.rs)                                           */
/* ------------------------------------------------------------------ */

/* Image magic: "EMPFWIMG" little-endian. */
#define EMP_IMAGE_MAGIC 0x474D495746504D45ULL
#define EMP_IMAGE_HEADER_VERSION 1U
#define EMP_FIRMWARE_ABI 6U
/* Bytes covered by the signature (everything before `signature`). */
#define EMP_IMAGE_SIGNED_LEN 152U
/* Largest payload accepted. */
#define EMP_IMAGE_PAYLOAD_MAX (64ULL << 20)

/* CPU plans (emp_image_header.cpu_plan). */
#define EMP_CPU_PLAN_BASE 0U
#define EMP_CPU_PLAN_SO 1U
#define EMP_CPU_PLAN_RO 2U
#define EMP_CPU_PLAN_SR 3U
#define EMP_CPU_PLAN_DSR 4U

/* Firmware image header (256 bytes), followed by the payload. */
struct emp_image_header {
	uint64_t magic;          /* EMP_IMAGE_MAGIC */
	uint32_t header_version; /* EMP_IMAGE_HEADER_VERSION */
	uint32_t abi;            /* EMP_FIRMWARE_ABI */
	uint8_t build_id[20];
	uint32_t cpu_plan;       /* EMP_CPU_PLAN_* */
	uint64_t payload_len;
	uint8_t sha256[32];      /* of the payload */
	uint8_t key_id[8];       /* first 8 bytes of SHA-256 of the public key */
	uint64_t reserved[8];
	uint8_t signature[64];   /* ed25519 over bytes 0..EMP_IMAGE_SIGNED_LEN */
	uint64_t reserved_tail[5];
};

/* ------------------------------------------------------------------ */
/* ioctl ABI of /dev/emp-nic (ioctl.rs)                                */
/*                                                                     */
/* Argument structs can grow at their end, as openat2's and clone3's   */
/* do (copy_struct_from_user). The command number carries the          */
/* caller's sizeof (_IOC_SIZE); the driver dispatches on type, number  */
/* and direction and takes the argument's size from _IOC_SIZE:         */
/*  - below the struct's first version (EMP_*_SIZE_VER0): EINVAL;      */
/*  - shorter than the driver's struct: the rest reads as zero;        */
/*  - longer: accepted when the bytes past the driver's struct are all */
/*    zero, else E2BIG;                                                */
/*  - the leading size field must equal _IOC_SIZE: EINVAL.             */
/* Results are written back only by the read-write commands, and never */
/* past the caller's size. An unknown command is ENOTTY. A caller      */
/* built with another sizeof uses EMP_IOC_ENCODE with that size.       */
/* ------------------------------------------------------------------ */

/* EMP_IOC_QUERY result (80 bytes). */
struct emp_query {
	uint32_t size; /* caller sets its command's size (_IOC_SIZE) */
	uint16_t port;
	uint16_t node_id;
	uint32_t mtu;
	uint32_t features;
	uint64_t window_size; /* mmap length of the port window */
	uint32_t send_entries;
	uint32_t recv_entries;
	uint64_t msg_max;
	uint32_t port_gen;
	uint16_t port_count;
	uint16_t reserved0;
	uint64_t pinned_pages; /* pages the driver holds pinned for this NIC */
	uint32_t group_entries; /* group table slots of the NIC */
	uint32_t groups_in_use; /* group table slots in use (all ports) */
	uint64_t reserved[2];
};

/* EMP_IOC_REG_MR argument (48 bytes). */
struct emp_reg_mr {
	uint32_t size;   /* caller sets its command's size (_IOC_SIZE) */
	uint32_t access; /* EMP_MR_* */
	uint64_t addr;
	uint64_t length;
	uint32_t key;    /* out */
	uint32_t secret; /* out: remote-access secret */
	uint64_t reserved[2];
};

/* EMP_IOC_DEREG_MR argument (8 bytes). */
struct emp_dereg_mr {
	uint32_t size;
	uint32_t key;
};

/* EMP_IOC_SET_EVENTFD argument (16 bytes). */
struct emp_set_eventfd {
	uint32_t size;
	int32_t fd;      /* eventfd, or -1 to detach */
	uint32_t signal; /* signal to send instead (0 = none) */
	uint32_t reserved;
};

/* EMP_IOC_ARM argument (8 bytes). */
struct emp_arm {
	uint32_t size;
	uint32_t events; /* bit 0 = next completion */
};

/* EMP_IOC_START argument (24 bytes): open the port with its CQ. */
struct emp_start {
	uint32_t size;
	uint32_t cq_entries; /* power of two */
	uint32_t cq_key;     /* region holding the CQ */
	uint32_t reserved;
	uint64_t cq_offset;  /* offset of the CQ in that region */
};

/*
 * EMP_IOC_GROUP_SET argument (32 bytes): load the struct emp_group_entry
 * at `entry` (caller's memory) for this port; the port must be started. A
 * group of more than EMP_GROUP_INLINE_MAX members has its body right after
 * the entry (EMP_GROUP_BODY_LEN bytes) and takes EMP_GROUP_SPAN slots;
 * `slot` is the first.
 */
struct emp_group_set {
	uint32_t size;
	uint32_t slot;   /* out: group table slot */
	uint64_t entry;  /* address of a struct emp_group_entry */
	uint64_t reserved[2];
};

/* EMP_IOC_GROUP_CLEAR argument (8 bytes): retire a slot of this port. */
struct emp_group_clear {
	uint32_t size;
	uint32_t slot;
};

/*
 * EMP_IOC_PORT_CTX argument (40 bytes): a context-switch step on this
 * file's port (docs/context-switch.md); `op` is EMP_PORT_CTX_*. SAVE and
 * RESTORE name the image in a region of this port (key, offset, len).
 */
struct emp_port_ctx {
	uint32_t size;
	uint32_t op;       /* EMP_PORT_CTX_* */
	uint32_t key;      /* SAVE / RESTORE: region holding the image */
	uint32_t reserved;
	uint64_t offset;   /* SAVE / RESTORE: offset of the image in it */
	uint64_t len;      /* SAVE: room; RESTORE: image length (<= EMP_CTX_IMAGE_MAX) */
	uint64_t result;   /* out: STABLE 1/0, SAVE image length, RESTORE slot */
};

#define EMP_PORT_CTX_SUSPEND 1U
#define EMP_PORT_CTX_STABLE 2U
#define EMP_PORT_CTX_SAVE 3U
#define EMP_PORT_CTX_RESTORE 4U
#define EMP_PORT_CTX_RESUME 5U
/* RESTORE takes images up to EMP_CTX_IMAGE_MAX (above); a gang save in
 * driver memory gets this much room. */
#define EMP_GANG_IMAGE_ROOM 1048576ULL

/*
 * EMP_IOC_GANG argument (32 bytes): the gang scheduler's step (an
 * EMP_GANG_* action) on every started port of process `pid` on this
 * NIC. Needs CAP_SYS_ADMIN; works on a file opened read-only (no port).
 */
struct emp_gang {
	uint32_t size;
	uint32_t action;
	int32_t pid;
	uint32_t reserved;
	uint64_t ports;    /* out: ports acted on / held */
	uint64_t stable;   /* out: STABLE: how many are stable */
};

/*
 * Command numbers use the asm-generic _IOC encoding on every architecture
 * (as the Rust constants do): dir:2 | size:14 | type:8 | nr:8. On x86,
 * arm, arm64 and riscv they equal _IOWR('E', nr, struct ...) /
 * _IOW('E', nr, struct ...) from <linux/ioctl.h>.
 */
#define EMP_IOC_MAGIC 0x45U /* 'E' */
#define EMP_IOC_DIR_WRITE 1U
#define EMP_IOC_DIR_READ 2U
#define EMP_IOC_ENCODE(dir, nr, size) \
	((uint32_t)(((uint32_t)(dir) << 30) | ((uint32_t)(size) << 16) | \
		    ((uint32_t)EMP_IOC_MAGIC << 8) | (uint32_t)(nr)))

/* First versions: the smallest size each command accepts. */
#define EMP_QUERY_SIZE_VER0 48U       /* through reserved0 */
#define EMP_REG_MR_SIZE_VER0 32U      /* through reserved0 */
#define EMP_DEREG_MR_SIZE_VER0 8U
#define EMP_SET_EVENTFD_SIZE_VER0 16U
#define EMP_ARM_SIZE_VER0 8U
#define EMP_START_SIZE_VER0 24U
#define EMP_GROUP_SET_SIZE_VER0 16U   /* through entry */
#define EMP_GROUP_CLEAR_SIZE_VER0 8U
#define EMP_PORT_CTX_SIZE_VER0 40U
#define EMP_GANG_SIZE_VER0 32U

/* The commands at the current sizes. */
#define EMP_IOC_QUERY \
	EMP_IOC_ENCODE(EMP_IOC_DIR_READ | EMP_IOC_DIR_WRITE, 1U, sizeof(struct emp_query))
#define EMP_IOC_REG_MR \
	EMP_IOC_ENCODE(EMP_IOC_DIR_READ | EMP_IOC_DIR_WRITE, 2U, sizeof(struct emp_reg_mr))
#define EMP_IOC_DEREG_MR \
	EMP_IOC_ENCODE(EMP_IOC_DIR_WRITE, 3U, sizeof(struct emp_dereg_mr))
#define EMP_IOC_ARM \
	EMP_IOC_ENCODE(EMP_IOC_DIR_WRITE, 4U, sizeof(struct emp_arm))
#define EMP_IOC_SET_EVENTFD \
	EMP_IOC_ENCODE(EMP_IOC_DIR_WRITE, 5U, sizeof(struct emp_set_eventfd))
#define EMP_IOC_START \
	EMP_IOC_ENCODE(EMP_IOC_DIR_WRITE, 6U, sizeof(struct emp_start))
#define EMP_IOC_GROUP_SET \
	EMP_IOC_ENCODE(EMP_IOC_DIR_READ | EMP_IOC_DIR_WRITE, 7U, sizeof(struct emp_group_set))
#define EMP_IOC_GROUP_CLEAR \
	EMP_IOC_ENCODE(EMP_IOC_DIR_WRITE, 8U, sizeof(struct emp_group_clear))
#define EMP_IOC_PORT_CTX \
	EMP_IOC_ENCODE(EMP_IOC_DIR_READ | EMP_IOC_DIR_WRITE, 9U, sizeof(struct emp_port_ctx))
#define EMP_IOC_GANG \
	EMP_IOC_ENCODE(EMP_IOC_DIR_READ | EMP_IOC_DIR_WRITE, 10U, sizeof(struct emp_gang))

/* ------------------------------------------------------------------ */
/* Direct attach to emp-nicd (attach.rs)                               */
/*                                                                     */
/* A process connects to the NIC's Unix socket (SOCK_SEQPACKET); every */
/* message is one struct emp_attach_msg, some carrying file            */
/* descriptors (SCM_RIGHTS). Control path only.                        */
/*                                                                     */
/*   ATTACH    reply: the port, geometry in arg[EMP_ATTACH_REPLY_*],   */
/*             three fds: port window memfd (map window_size bytes at  */
/*             offset 0), doorbell eventfd, event eventfd              */
/*   REG_ARENA memfd attached; arg[0] offset, arg[1] length,           */
/*             arg[2] access (EMP_MR_*) -> reply arg[0] key            */
/*   REG_VM    arg[0] address, arg[1] length, arg[2] access -> key     */
/*             (allow the daemon: prctl(PR_SET_PTRACER, daemon pid))   */
/*   START     arg[0] CQ key, arg[1] CQ offset, arg[2] CQ entries      */
/*   DEREG     arg[0] key                                              */
/*   STATS     reply arg[0..16] = NIC counters (EMP_COUNTER_*),        */
/*             arg[16] status, arg[17] fail reason, arg[18] ports in   */
/*             use, arg[19] node, arg[20] ports, arg[21] regions       */
/*   GROUP_SET arg[0] key, arg[1] offset of an encoded                 */
/*             emp_group_entry in the caller's registered memory       */
/*             (checked by the daemon) -> reply arg[0] slot            */
/*   GROUP_CLEAR arg[0] slot: retire it                                */
/*   STATS_EXT reply arg[i] = counter 16 + i (EMP_COUNTER_COLL_OPS ..) */
/*   WIRE_INFO reply: wire kind, link and wire counters, in            */
/*             arg[EMP_WIRE_REPLY_*]                                   */
/*   WIRE_ROUTES arg[0] first node -> arg[0] = nodes | count << 32,    */
/*             entry i in arg[1 + 3i ..= 3 + 3i]: IPv6 address (two   */
/*             big-endian words), udp port | big-endian MAC << 16      */
/*   WIRE_AUTH reply: auth mode, key ids, refusals in                  */
/*             arg[EMP_AUTH_REPLY_*]                                   */
/*   WIRE_REKEY arg[0] EMP_REKEY_INSTALL | EMP_REKEY_SWITCH (daemon's  */
/*             user or root) -> reply as WIRE_AUTH                     */
/*   WIRE_MCAST reply: multicast counters in arg[EMP_MCAST_REPLY_*]    */
/*                                                                     */
/* Closing the socket closes the port.                                 */
/* ------------------------------------------------------------------ */

#define EMP_ATTACH_VERSION 1U

/* Request / reply codes (emp_attach_msg.op). */
#define EMP_ATTACH_OP_ATTACH 1U
#define EMP_ATTACH_OP_REG_ARENA 2U
#define EMP_ATTACH_OP_REG_VM 3U
#define EMP_ATTACH_OP_START 4U
#define EMP_ATTACH_OP_DEREG 5U
#define EMP_ATTACH_OP_STATS 6U
#define EMP_ATTACH_OP_GROUP_SET 7U
#define EMP_ATTACH_OP_GROUP_CLEAR 8U
#define EMP_ATTACH_OP_STATS_EXT 9U
#define EMP_ATTACH_OP_WIRE_INFO 10U
#define EMP_ATTACH_OP_WIRE_ROUTES 11U
#define EMP_ATTACH_OP_WIRE_AUTH 20U
#define EMP_ATTACH_OP_WIRE_REKEY 21U
#define EMP_ATTACH_OP_WIRE_MCAST 22U
#define EMP_ATTACH_OP_PORT_SUSPEND 23U
#define EMP_ATTACH_OP_PORT_STABLE 24U
#define EMP_ATTACH_OP_PORT_SAVE 25U
#define EMP_ATTACH_OP_PORT_RESTORE 26U
#define EMP_ATTACH_OP_PORT_RESUME 27U
#define EMP_ATTACH_OP_GANG 28U
#define EMP_ATTACH_OP_BUSY 29U /* the NIC processors' working time: arg[0] ns, arg[1] batches */

/* GANG actions (arg[0]) on every port of process arg[1] (emp gang). */
#define EMP_GANG_SUSPEND 1
#define EMP_GANG_STABLE 2
#define EMP_GANG_SAVE 3
#define EMP_GANG_RESTORE 4
#define EMP_GANG_RESUME 5
#define EMP_GANG_PORTS 6

/* WIRE_MCAST reply fields (indices into emp_attach_msg.arg). */
#define EMP_MCAST_REPLY_SENT 0
#define EMP_MCAST_REPLY_RECEIVED 1
#define EMP_MCAST_REPLY_FALLBACK 2

/* WIRE_REKEY steps (arg[0]). */
#define EMP_REKEY_INSTALL 1
#define EMP_REKEY_SWITCH 2

/* WIRE_AUTH / WIRE_REKEY reply fields (indices into emp_attach_msg.arg). */
#define EMP_AUTH_REPLY_MODE 0
#define EMP_AUTH_REPLY_KEY_ID 1
#define EMP_AUTH_REPLY_NEXT_KEY_ID 2
#define EMP_AUTH_REPLY_PREVIOUS_KEY_ID 3
#define EMP_AUTH_REPLY_BAD_TAG 4
#define EMP_AUTH_REPLY_UNKNOWN_KEY 5
#define EMP_AUTH_REPLY_REPLAYED 6
#define EMP_AUTH_REPLY_TRAILER 7

/* WIRE_INFO reply fields (indices into emp_attach_msg.arg). */
#define EMP_WIRE_REPLY_KIND 0
#define EMP_WIRE_REPLY_NODES 1
#define EMP_WIRE_REPLY_LOCAL_NICS 2
#define EMP_WIRE_REPLY_LOCAL_INDEX 3
#define EMP_WIRE_REPLY_LINK_FLAGS 4
#define EMP_WIRE_REPLY_LINK_MTU 5
#define EMP_WIRE_REPLY_LINK_MAC 6
#define EMP_WIRE_REPLY_LINK_NAME 7
#define EMP_WIRE_REPLY_COUNTERS 9
#define EMP_WIRE_REPLY_DAEMON_PID 18
#define EMP_WIRE_REPLY_MTU 19
#define EMP_WIRE_REPLY_FROM_HOST 20
#define EMP_WIRE_ROUTES_PER_PAGE 7

/* WIRE_INFO wire counters: arg[EMP_WIRE_REPLY_COUNTERS + i]. */
#define EMP_WIRE_COUNTER_SENT 0
#define EMP_WIRE_COUNTER_RECEIVED 1
#define EMP_WIRE_COUNTER_LOST 2
#define EMP_WIRE_COUNTER_DUPLICATED 3
#define EMP_WIRE_COUNTER_REORDERED 4
#define EMP_WIRE_COUNTER_UNKNOWN_SOURCE 5
#define EMP_WIRE_COUNTER_SOURCE_MISMATCH 6
#define EMP_WIRE_COUNTER_FOREIGN_ETHERTYPE 7
#define EMP_WIRE_COUNTER_MALFORMED 8
#define EMP_WIRE_COUNTER_COUNT 9

/* WIRE_INFO wire kinds (arg[EMP_WIRE_REPLY_KIND]). */
#define EMP_WIRE_KIND_MEM 1
#define EMP_WIRE_KIND_UDP 2
#define EMP_WIRE_KIND_PACKET 3

/* WIRE_INFO link flags (arg[EMP_WIRE_REPLY_LINK_FLAGS]). */
#define EMP_LINK_KNOWN 1
#define EMP_LINK_UP 2
#define EMP_LINK_ERROR 4

/* Reply status codes (emp_attach_msg.status): errno numbers. */
#define EMP_ATTACH_STATUS_OK 0
#define EMP_ATTACH_STATUS_EINVAL 22
#define EMP_ATTACH_STATUS_ENOSPC 28
#define EMP_ATTACH_STATUS_ENOMEM 12
#define EMP_ATTACH_STATUS_EPERM 1
#define EMP_ATTACH_STATUS_ENOENT 2
#define EMP_ATTACH_STATUS_ENODEV 19
#define EMP_ATTACH_STATUS_EPROTO 71
#define EMP_ATTACH_STATUS_EOPNOTSUPP 95

/* Reply of ATTACH: indices into emp_attach_msg.arg. */
#define EMP_ATTACH_REPLY_DAEMON_PID 0U   /* for PR_SET_PTRACER */
#define EMP_ATTACH_REPLY_NODE 1U
#define EMP_ATTACH_REPLY_PORT 2U
#define EMP_ATTACH_REPLY_GEN 3U
#define EMP_ATTACH_REPLY_MTU 4U
#define EMP_ATTACH_REPLY_WINDOW_SIZE 5U  /* bytes of the window to map */
#define EMP_ATTACH_REPLY_SEND_ENTRIES 6U
#define EMP_ATTACH_REPLY_RECV_ENTRIES 7U
#define EMP_ATTACH_REPLY_FEATURES 8U     /* EMP_FEATURE_* */
#define EMP_ATTACH_REPLY_PORT_COUNT 9U
#define EMP_ATTACH_REPLY_NODES 10U       /* route table entries */
#define EMP_ATTACH_REPLY_MSG_MAX 11U

/* One request or reply (192 bytes). */
struct emp_attach_msg {
	uint32_t version;  /* EMP_ATTACH_VERSION */
	uint32_t op;       /* EMP_ATTACH_OP_* (a reply repeats the request's) */
	int32_t status;    /* reply: EMP_ATTACH_STATUS_* */
	uint32_t reserved; /* zero */
	uint64_t arg[22];  /* arguments / results, see above */
};

/* ------------------------------------------------------------------ */
/* Firmware (control program) ABI (fwabi.rs)                           */
/*                                                                     */
/* A firmware image's payload is an ELF shared object exporting the    */
/* symbols below; the NIC passes its hardware services as a table of   */
/* function pointers (struct emp_fw_hal). Native layout, in-process.   */
/* Call order: abi (must equal EMP_FIRMWARE_ABI), boot once, then      */
/* doorbell / frame / timeout as events happen, poll_timeout after     */
/* each, free at shutdown; one thread at a time per NIC.               */
/* ------------------------------------------------------------------ */

/* uint32_t emp_fw_abi(void); */
#define EMP_FW_SYM_ABI "emp_fw_abi"
/* void *emp_fw_boot(const struct emp_fw_hal *, const struct emp_fw_config *);
 * NULL when boot failed (the reason is in SRAM status). */
#define EMP_FW_SYM_BOOT "emp_fw_boot"
/* void emp_fw_doorbell(void *fw, const struct emp_fw_hal *, uint64_t now); */
#define EMP_FW_SYM_DOORBELL "emp_fw_doorbell"
/* void emp_fw_frames(void *fw, const struct emp_fw_hal *, uint64_t now,
 *                    const uint8_t *const *frames, const size_t *lens, size_t n);
 * n frames received, handled in order; the work they leave (rings freed
 * for, peers made ready, counters, interrupts) done once after the last */
#define EMP_FW_SYM_FRAMES "emp_fw_frames"
/* void emp_fw_timeout(void *fw, const struct emp_fw_hal *, uint64_t now); */
#define EMP_FW_SYM_TIMEOUT "emp_fw_timeout"
/* uint64_t emp_fw_poll_timeout(void *fw); next deadline, UINT64_MAX = none */
#define EMP_FW_SYM_POLL_TIMEOUT "emp_fw_poll_timeout"
/* size_t emp_fw_describe(void *fw, uint8_t *buf, size_t len); UTF-8 text */
#define EMP_FW_SYM_DESCRIBE "emp_fw_describe"
/* void emp_fw_free(void *fw); */
#define EMP_FW_SYM_FREE "emp_fw_free"
/* uint32_t emp_fw_cpus(void *nic); */
#define EMP_FW_SYM_CPUS "emp_fw_cpus"
/* uint32_t emp_fw_cpu(void *nic, const struct emp_fw_hal *hal, uint64_t now, uint32_t cpu); */
#define EMP_FW_SYM_CPU "emp_fw_cpu"
/* Optional (older images lack them: every CPU then runs on one thread). */
/* uint32_t emp_fw_cpu_pending(void *nic, uint32_t cpu); work waiting for that CPU */
#define EMP_FW_SYM_CPU_PENDING "emp_fw_cpu_pending"
/* uint32_t emp_fw_frame_cpu(void *nic); the CPU received frames go to */
#define EMP_FW_SYM_FRAME_CPU "emp_fw_frame_cpu"
/* Optional: a CPU on a thread of its own runs its jobs without the program. */
/* const void *emp_fw_cpu_area(void *nic); a reference to the CPUs' common area */
#define EMP_FW_SYM_CPU_AREA "emp_fw_cpu_area"
/* void emp_fw_cpu_area_free(const void *area); */
#define EMP_FW_SYM_CPU_AREA_FREE "emp_fw_cpu_area_free"
/* uint32_t emp_fw_cpu_jobs(const void *area, const struct emp_fw_hal *hal, uint32_t cpu); jobs run */
#define EMP_FW_SYM_CPU_JOBS "emp_fw_cpu_jobs"
/* uint32_t emp_fw_cpu_wants_program(const void *area, uint32_t cpu); nonzero: take the program */
#define EMP_FW_SYM_CPU_WANTS_PROGRAM "emp_fw_cpu_wants_program"
/* Optional, all five or none: the sides' entry points, each run holding one
 * side of the program (send, receive) beside the other's; the whole
 * program's entry points need both. Each returns EMP_FW_SIDE_WHOLE when
 * the whole program must run next, and from bit EMP_FW_SIDE_WAKE_SHIFT the
 * CPUs it queued steps for. */
/* uint32_t emp_fw_recv_side_frames(void *nic, const struct emp_fw_hal *hal, uint64_t now,
 *     const uint8_t *const *frames, const size_t *lens, size_t n, size_t *taken); */
#define EMP_FW_SYM_RECV_SIDE_FRAMES "emp_fw_recv_side_frames"
/* uint32_t emp_fw_recv_side_doorbell(void *nic, const struct emp_fw_hal *hal, uint64_t now); */
#define EMP_FW_SYM_RECV_SIDE_DOORBELL "emp_fw_recv_side_doorbell"
/* uint32_t emp_fw_send_side_doorbell(void *nic, const struct emp_fw_hal *hal, uint64_t now); */
#define EMP_FW_SYM_SEND_SIDE_DOORBELL "emp_fw_send_side_doorbell"
/* uint32_t emp_fw_send_side_cpu(void *nic, const struct emp_fw_hal *hal, uint64_t now, uint32_t cpu); */
#define EMP_FW_SYM_SEND_SIDE_CPU "emp_fw_send_side_cpu"
/* uint64_t emp_fw_deadline(void *nic); the next deadline as published, holding no lock */
#define EMP_FW_SYM_DEADLINE "emp_fw_deadline"
#define EMP_FW_SIDE_WHOLE 1U
#define EMP_FW_SIDE_WAKE_SHIFT 8U

/* A run of host memory by bus address. */
struct emp_fw_host_seg {
	uint64_t addr;
	uint64_t len;
};

#define EMP_FW_HOST_SEGS_MAX 16U /* segments per mac_transmit_host */

/* One window of host memory the NIC mapped (struct emp_fw_hal.dma_windows). */
struct emp_fw_dma_window {
	uint64_t tag;  /* addr >> EMP_FW_DMA_WINDOW_SHIFT held; UINT64_MAX: unused */
	uint8_t *base; /* first byte, in the NIC's process; NULL: unused */
	uint64_t len;  /* bytes at base */
};

#define EMP_FW_DMA_WINDOW_SHIFT 40U

/* Hardware services over an opaque context. DMA calls return 0 when done,
 * nonzero when the DMA failed. */
struct emp_fw_hal {
	void *ctx; /* passed back as the first argument of every call */
	/* read SRAM [off, off + len) into buf */
	void (*sram_read)(void *ctx, size_t off, uint8_t *buf, size_t len);
	/* write data to SRAM at off */
	void (*sram_write)(void *ctx, size_t off, const uint8_t *data, size_t len);
	/* DMA host memory at bus address addr into buf */
	int32_t (*dma_read)(void *ctx, uint64_t addr, uint8_t *buf, size_t len);
	/* DMA data into host memory at bus address addr */
	int32_t (*dma_write)(void *ctx, uint64_t addr, const uint8_t *data, size_t len);
	/* transmit a frame to dst_node */
	void (*mac_transmit)(void *ctx, uint16_t dst_node, const uint8_t *frame, size_t len);
	/* raise MSI-X vector */
	void (*raise_interrupt)(void *ctx, uint16_t vector);
	/* every dma_write issued before is visible to the host before any
	 * issued after (a write barrier; a CQE's phase byte follows one) */
	void (*dma_fence)(void *ctx);
	/* the MAC starts (join 1) or stops (0) receiving frames sent to
	 * multicast address addr (EMP_MCAST_BASE and up) */
	void (*mcast_membership)(void *ctx, uint16_t addr, uint8_t join);
	/* Immediate Sending: transmit header then the host memory segs names,
	 * read as the frame is sent; each seg checked like a DMA read first
	 * (nonzero, nothing sent, when one does not resolve) */
	int32_t (*mac_transmit_host)(void *ctx, uint16_t dst_node, const uint8_t *header, size_t header_len,
				     const struct emp_fw_host_seg *segs, size_t nsegs);
	/* SRAM mapped for the call: sram_len bytes the control program reads
	 * and writes in place (4-byte words as acquire loads and release
	 * stores); NULL: only through sram_read and sram_write */
	uint8_t *sram_base;
	size_t sram_len;
	/* host memory mapped for the call: addr is in window
	 * (addr >> EMP_FW_DMA_WINDOW_SHIFT) & 0xFFFF when its tag equals
	 * addr >> EMP_FW_DMA_WINDOW_SHIFT and offset + len fits; read and
	 * written in place (byte copies; dma_fence a release fence), anything
	 * else through dma_read / dma_write; NULL: every DMA through them */
	const struct emp_fw_dma_window *dma_windows;
	size_t dma_windows_len;
};

/* Control-program tunables passed at boot; zero means "use the default". */
struct emp_fw_config {
	uint32_t group_size;      /* frames per ACK group */
	uint32_t window_frames;   /* frames in flight per peer */
	uint64_t rto_ns;          /* initial retransmission timeout */
	uint64_t rto_ns_max;      /* retransmission timeout cap */
	uint32_t retry_limit;     /* retries per group */
	uint32_t overflow_slots;  /* overflow buffer slots */
	uint32_t tx_max;          /* outstanding sends per NIC */
	uint32_t recv_posted_max; /* posted receives per NIC */
	uint32_t gen_seed;        /* seed of port generations (vary per boot) */
	uint32_t cpu_plan;        /* NIC CPU plan (EMP_CPU_PLAN_*) */
};

/* ------------------------------------------------------------------ */
/* Compile-time layout checks                                          */
/* ------------------------------------------------------------------ */

EMP_STATIC_ASSERT(sizeof(struct emp_frame_header) == 32, "emp_frame_header");
EMP_STATIC_ASSERT(sizeof(struct emp_msg_header) == 24, "emp_msg_header");
EMP_STATIC_ASSERT(sizeof(struct emp_ack_body) == 16, "emp_ack_body");
EMP_STATIC_ASSERT(sizeof(struct emp_atomic_body) == 40, "emp_atomic_body");
EMP_STATIC_ASSERT(sizeof(struct emp_atomic_result) == 16, "emp_atomic_result");
EMP_STATIC_ASSERT(sizeof(struct emp_rma_header) == 32, "emp_rma_header");
EMP_STATIC_ASSERT(sizeof(struct emp_rbcast_header) == 44, "emp_rbcast_header");
EMP_STATIC_ASSERT(sizeof(struct emp_sge) == 16, "emp_sge");
EMP_STATIC_ASSERT(sizeof(struct emp_work_desc) == 128, "emp_work_desc");
EMP_STATIC_ASSERT(sizeof(struct emp_cqe) == 40, "emp_cqe");
EMP_STATIC_ASSERT(sizeof(struct emp_phys_seg) == 16, "emp_phys_seg");
EMP_STATIC_ASSERT(sizeof(struct emp_mr_entry) == 144, "emp_mr_entry");
EMP_STATIC_ASSERT(sizeof(struct emp_coll_header) == 32, "emp_coll_header");
EMP_STATIC_ASSERT(sizeof(struct emp_sram_header) == 320, "emp_sram_header");
EMP_STATIC_ASSERT(sizeof(struct emp_admin_mailbox) == 64, "emp_admin_mailbox");
EMP_STATIC_ASSERT(sizeof(struct emp_route_entry) == 32, "emp_route_entry");
EMP_STATIC_ASSERT(sizeof(struct emp_group_entry) == 1024, "emp_group_entry");
EMP_STATIC_ASSERT(sizeof(struct emp_port_ctl) == 192, "emp_port_ctl");
EMP_STATIC_ASSERT(sizeof(struct emp_image_header) == 256, "emp_image_header");
EMP_STATIC_ASSERT(sizeof(struct emp_query) == 80, "emp_query");
EMP_STATIC_ASSERT(sizeof(struct emp_reg_mr) == 48, "emp_reg_mr");
EMP_STATIC_ASSERT(sizeof(struct emp_dereg_mr) == 8, "emp_dereg_mr");
EMP_STATIC_ASSERT(sizeof(struct emp_set_eventfd) == 16, "emp_set_eventfd");
EMP_STATIC_ASSERT(sizeof(struct emp_arm) == 8, "emp_arm");
EMP_STATIC_ASSERT(sizeof(struct emp_start) == 24, "emp_start");
EMP_STATIC_ASSERT(sizeof(struct emp_attach_msg) == 192, "emp_attach_msg");
EMP_STATIC_ASSERT(sizeof(struct emp_fw_hal) == 14 * sizeof(void *), "emp_fw_hal");
EMP_STATIC_ASSERT(sizeof(struct emp_fw_dma_window) == 24, "emp_fw_dma_window");
EMP_STATIC_ASSERT(sizeof(struct emp_fw_host_seg) == 16, "emp_fw_host_seg");
EMP_STATIC_ASSERT(sizeof(struct emp_fw_config) == 48, "emp_fw_config");

EMP_STATIC_ASSERT(offsetof(struct emp_cqe, flags) == EMP_CQE_FLAGS_OFFSET, "emp_cqe.flags");
EMP_STATIC_ASSERT(offsetof(struct emp_image_header, signature) == EMP_IMAGE_SIGNED_LEN,
		  "emp_image_header.signature");
EMP_STATIC_ASSERT(offsetof(struct emp_port_ctl, send_cons) == EMP_CTL_SEND_CONS, "emp_port_ctl.send_cons");
EMP_STATIC_ASSERT(offsetof(struct emp_port_ctl, nic_sleeping) == EMP_CTL_NIC_SLEEPING,
		  "emp_port_ctl.nic_sleeping");
EMP_STATIC_ASSERT(offsetof(struct emp_port_ctl, state) == EMP_CTL_STATE, "emp_port_ctl.state");
EMP_STATIC_ASSERT(EMP_SEGS_PER_PAGE * sizeof(struct emp_phys_seg) == EMP_PAGE_SIZE, "EMP_SEGS_PER_PAGE");
EMP_STATIC_ASSERT(offsetof(struct emp_group_entry, bounce_offset) == 24, "emp_group_entry.bounce_offset");
EMP_STATIC_ASSERT(offsetof(struct emp_group_entry, members) == 48, "emp_group_entry.members");
EMP_STATIC_ASSERT(offsetof(struct emp_group_entry, parents) == 304, "emp_group_entry.parents");
EMP_STATIC_ASSERT(sizeof(((struct emp_group_entry *)0)->parents) == EMP_TREES_MAX * 64,
		  "emp_group_entry.parents: 64 bytes per tree");
EMP_STATIC_ASSERT(EMP_GROUP_INLINE_MAX <= 64, "a parent array holds every inline member");
EMP_STATIC_ASSERT(sizeof(((struct emp_sram_header *)0)->counters) == EMP_COUNTER_COUNT * 8,
		  "emp_sram_header.counters");
EMP_STATIC_ASSERT(EMP_REDUCE_TAG(EMP_DTYPE_F64, EMP_REDUCE_MAX, 7) == 0x070406U, "EMP_REDUCE_TAG");

#ifdef __cplusplus
}
#endif

#endif /* EMP_UAPI_H */
