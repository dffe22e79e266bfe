//! Checks `include/emp_uapi.h` against the Rust definitions.
//!
//! A C program is generated that includes the header and prints, for every
//! structure, its size and the offset, size, element size and element kind
//! of every field (for pointer fields: whether the C type is the one the
//! Rust type maps to), the value of every constant (ioctl numbers included)
//! and of every string constant (firmware symbol names).
//! It is compiled with the system C compiler (`$CC`, else `cc`, `gcc`,
//! `clang`), run, and every line is compared with the Rust side
//! (`size_of`, `offset_of!`, the constants). A missing C compiler is a
//! failure, not a skip.
//!
//! Completeness is checked too: every `le_struct!` and every other
//! `#[repr(C)]` struct in `src/` must be listed here, the listed fields must
//! tile their structure exactly (so none is forgotten), every `pub const` in
//! `src/` (numeric or string) must have a C counterpart, and every value the
//! enums decode must have a C constant.

use core::ffi::c_void;
use core::mem::{offset_of, size_of};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use emp_uapi::attach::{self, AttachMsg};
use emp_uapi::coll::{self, BarrierAlgo, CollHeader, CollKind, Dtype, ReduceOp};
use emp_uapi::desc::{self, *};
use emp_uapi::fwabi::{self, DmaWindow, FwConfig, FwHal, HostSeg};
use emp_uapi::image::{self, *};
use emp_uapi::ioctl::*;
use emp_uapi::sram::{self, *};
use emp_uapi::wire::{self, *};
use emp_uapi::Le;

// ---------------------------------------------------------------------------
// Field descriptions
// ---------------------------------------------------------------------------

/// What a field's element is, as C sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Elem {
    /// A fixed-width integer type (its `<stdint.h>` name).
    Int(&'static str),
    /// Another EMP structure (its C tag name).
    Struct(&'static str),
    /// A data or function pointer: the C type it must be (compatible with,
    /// in the `__builtin_types_compatible_p` sense), spelled with single
    /// spaces.
    Ptr(&'static str),
}

/// Type information of a field type.
trait Kind {
    /// Size of one element.
    const ELEM_SIZE: usize;
    /// Element kind.
    const ELEM: Elem;
    /// Is the field an array (C `f[N]`)?
    const ARRAY: bool = false;
}

macro_rules! int_kind {
    ($($t:ty => $e:literal),*) => {$(
        impl Kind for $t {
            const ELEM_SIZE: usize = size_of::<$t>();
            const ELEM: Elem = Elem::Int($e);
        }
    )*};
}
int_kind!(u8 => "uint8_t", u16 => "uint16_t", u32 => "uint32_t", u64 => "uint64_t", i32 => "int32_t", i64 => "int64_t");
// `size_t` is `uint64_t` on the targets (LP64): C's type test cannot tell them apart.
int_kind!(usize => "uint64_t");

impl Kind for Sge {
    const ELEM_SIZE: usize = size_of::<Sge>();
    const ELEM: Elem = Elem::Struct("emp_sge");
}
impl Kind for PhysSeg {
    const ELEM_SIZE: usize = size_of::<PhysSeg>();
    const ELEM: Elem = Elem::Struct("emp_phys_seg");
}

/// Pointer types of the firmware ABI and their C spelling. Each Rust type
/// is distinct, so the C type checked for a field follows from the Rust
/// field's type: a changed Rust signature no longer compiles here (no
/// `Kind` impl) until its C spelling is updated too.
macro_rules! ptr_kind {
    ($($c:literal => $t:ty),* $(,)?) => {$(
        impl Kind for $t {
            const ELEM_SIZE: usize = size_of::<$t>();
            const ELEM: Elem = Elem::Ptr($c);
        }
    )*};
}
ptr_kind! {
    "void *" => *mut c_void,
    "uint8_t *" => *mut u8,
    "const struct emp_fw_dma_window *" => *const DmaWindow,
    "void (*)(void *, size_t, uint8_t *, size_t)" => extern "C" fn(*mut c_void, usize, *mut u8, usize),
    "void (*)(void *, size_t, const uint8_t *, size_t)" => extern "C" fn(*mut c_void, usize, *const u8, usize),
    "int32_t (*)(void *, uint64_t, uint8_t *, size_t)" => extern "C" fn(*mut c_void, u64, *mut u8, usize) -> i32,
    "int32_t (*)(void *, uint64_t, const uint8_t *, size_t)" => extern "C" fn(*mut c_void, u64, *const u8, usize) -> i32,
    "void (*)(void *, uint16_t, const uint8_t *, size_t)" => extern "C" fn(*mut c_void, u16, *const u8, usize),
    "void (*)(void *, uint16_t)" => extern "C" fn(*mut c_void, u16),
    "void (*)(void *, uint16_t, uint8_t)" => extern "C" fn(*mut c_void, u16, u8),
    "void (*)(void *)" => extern "C" fn(*mut c_void),
    "int32_t (*)(void *, uint16_t, const uint8_t *, size_t, const struct emp_fw_host_seg *, size_t)" =>
        extern "C" fn(*mut c_void, u16, *const u8, usize, *const HostSeg, usize) -> i32,
}

impl<T: Kind, const N: usize> Kind for [T; N] {
    const ELEM_SIZE: usize = T::ELEM_SIZE;
    const ELEM: Elem = T::ELEM;
    const ARRAY: bool = true;
}

#[derive(Debug)]
struct FieldDesc {
    name: &'static str,
    offset: usize,
    size: usize,
    elem_size: usize,
    elem: Elem,
    array: bool,
}

fn field<F: Kind>(name: &'static str, offset: usize, _v: &F) -> FieldDesc {
    FieldDesc { name, offset, size: size_of::<F>(), elem_size: F::ELEM_SIZE, elem: F::ELEM, array: F::ARRAY }
}

/// Like [`field`], typed through a projection (no value of the structure
/// needed: `FwHal` has no `Default`).
fn field_of<S, F: Kind>(name: &'static str, offset: usize, _p: impl Fn(&S) -> &F) -> FieldDesc {
    FieldDesc { name, offset, size: size_of::<F>(), elem_size: F::ELEM_SIZE, elem: F::ELEM, array: F::ARRAY }
}

#[derive(Debug)]
struct StructDesc {
    /// C tag, without `struct`.
    c: &'static str,
    /// Rust type name.
    rust: &'static str,
    size: usize,
    /// `Le::SIZE` for `le_struct!` types; `None` for plain `#[repr(C)]`
    /// structures (native layout, no byte encoding).
    le_size: Option<usize>,
    fields: Vec<FieldDesc>,
}

macro_rules! st {
    ($c:literal, $ty:ident { $($f:ident),* $(,)? }) => {
        StructDesc {
            c: $c,
            rust: stringify!($ty),
            size: size_of::<$ty>(),
            le_size: Some(<$ty as Le>::SIZE),
            fields: vec![$( field(stringify!($f), offset_of!($ty, $f), &<$ty as Default>::default().$f) ),*],
        }
    };
}

/// A plain `#[repr(C)]` structure (not `le_struct!`).
macro_rules! st_repr_c {
    ($c:literal, $ty:ident { $($f:ident),* $(,)? }) => {
        StructDesc {
            c: $c,
            rust: stringify!($ty),
            size: size_of::<$ty>(),
            le_size: None,
            fields: vec![$( field_of(stringify!($f), offset_of!($ty, $f), |s: &$ty| &s.$f) ),*],
        }
    };
}

fn structs() -> Vec<StructDesc> {
    vec![
        st!(
            "emp_frame_header",
            FrameHeader {
                version,
                kind,
                dst_gen,
                src_node,
                dst_node,
                src_port,
                dst_port,
                src_gen,
                payload_len,
                msg_seq,
                tx_floor,
                frame_index,
                frame_count,
            }
        ),
        st!("emp_msg_header", MsgHeader { tag, total_len, imm, flags }),
        st!("emp_ack_body", AckBody { group, missing_mask, rx_credits, reason, fc_level, rx_expected }),
        st!("emp_atomic_body", AtomicBody { op, width, reserved, rkey, offset, operand, compare, secret, reserved2 }),
        st!("emp_atomic_result", AtomicResult { status, reserved, old }),
        st!("emp_rma_header", RmaHeader { op, reserved, rkey, secret, len, offset, cookie }),
        st!(
            "emp_rbcast_header",
            RbcastHeader {
                group_id,
                epoch,
                seq,
                reposted,
                ack_next,
                len,
                root,
                sender,
                ack_root,
                kind,
                flags,
                ack_every,
                reserved,
                coroots,
                frag,
                frags,
                span,
                msg_len
            }
        ),
        st!("emp_sge", Sge { key, len, offset }),
        st!("emp_remote_sge", RemoteSge { key, secret, offset }),
        st!("emp_work_desc", WorkDesc { wr_id, opcode, flags, num_sge, slot, node, port, tag, ignore, sge }),
        st!(
            "emp_cqe",
            Cqe { wr_id, tag, byte_len, msg_len, imm, reserved1, src_node, src_port, status, opcode, reserved, flags }
        ),
        st!("emp_phys_seg", PhysSeg { addr, len, flags }),
        st!("emp_mr_entry", MrEntry { key, port, access, format, length, indirect_addr, indirect_count, secret, segs }),
        st!(
            "emp_coll_header",
            CollHeader {
                group_id,
                epoch,
                instance,
                kind,
                round,
                tree,
                dtype,
                op,
                reserved,
                root,
                sender,
                reserved2,
                count,
                reserved3
            }
        ),
        st!(
            "emp_sram_header",
            SramHeader {
                magic,
                layout_version,
                status,
                fail_reason,
                node_id,
                port_count,
                mtu,
                features,
                sram_size,
                heartbeat,
                admin_off,
                staging_off,
                staging_size,
                mr_off,
                mr_entries,
                route_off,
                route_entries,
                group_off,
                group_entries,
                ports_off,
                port_stride,
                send_entries,
                recv_entries,
                staged_len,
                counters,
            }
        ),
        st!("emp_admin_mailbox", AdminMailbox { request_seq, op, done_seq, result, args }),
        st!("emp_route_entry", RouteEntry { valid, ipv4, udp_port, mac, ip6 }),
        st!(
            "emp_group_entry",
            GroupEntry {
                group_id,
                epoch,
                member_count,
                my_rank,
                port,
                tree_count,
                flags,
                bounce_key,
                bounce_slot_size,
                bounce_offset,
                bounce_slots,
                reserved0,
                reserved1,
                tree_lambda,
                members,
                parents,
                reserved2,
            }
        ),
        st!(
            "emp_port_ctl",
            PortCtl {
                send_prod,
                recv_prod,
                cq_cons,
                arm,
                host_pad,
                send_cons,
                recv_cons,
                cq_prod,
                cq_overruns,
                nic_sleeping,
                nic_alive,
                remote_refused,
                remote_throttled,
                nic_pad,
                state,
                gen,
                cq_key,
                cq_entries,
                cq_offset,
                cfg_pad,
            }
        ),
        st!(
            "emp_image_header",
            ImageHeader {
                magic,
                header_version,
                abi,
                build_id,
                cpu_plan,
                payload_len,
                sha256,
                key_id,
                reserved,
                signature,
                reserved_tail,
            }
        ),
        st!(
            "emp_query",
            EmpQuery {
                size,
                port,
                node_id,
                mtu,
                features,
                window_size,
                send_entries,
                recv_entries,
                msg_max,
                port_gen,
                port_count,
                reserved0,
                pinned_pages,
                group_entries,
                groups_in_use,
                reserved,
            }
        ),
        st!("emp_reg_mr", EmpRegMr { size, access, addr, length, key, secret, reserved }),
        st!("emp_dereg_mr", EmpDeregMr { size, key }),
        st!("emp_set_eventfd", EmpSetEventfd { size, fd, signal, reserved }),
        st!("emp_arm", EmpArm { size, events }),
        st!("emp_start", EmpStart { size, cq_entries, cq_key, reserved, cq_offset }),
        st!("emp_group_set", EmpGroupSet { size, slot, entry, reserved }),
        st!("emp_group_clear", EmpGroupClear { size, slot }),
        st!("emp_port_ctx", EmpPortCtx { size, op, key, reserved, offset, len, result }),
        st!("emp_gang", EmpGang { size, action, pid, reserved, ports, stable }),
        st!("emp_attach_msg", AttachMsg { version, op, status, reserved, arg }),
        st_repr_c!(
            "emp_fw_hal",
            FwHal {
                ctx,
                sram_read,
                sram_write,
                dma_read,
                dma_write,
                mac_transmit,
                raise_interrupt,
                dma_fence,
                mcast_membership,
                mac_transmit_host,
                sram_base,
                sram_len,
                dma_windows,
                dma_windows_len
            }
        ),
        st_repr_c!("emp_fw_dma_window", DmaWindow { tag, base, len }),
        st_repr_c!("emp_fw_host_seg", HostSeg { addr, len }),
        st_repr_c!(
            "emp_fw_config",
            FwConfig {
                group_size,
                window_frames,
                rto_ns,
                rto_ns_max,
                retry_limit,
                overflow_slots,
                tx_max,
                recv_posted_max,
                gen_seed,
                cpu_plan,
            }
        ),
    ]
}

// ---------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------

struct ConstDesc {
    c: &'static str,
    /// Rust expression (for messages and the completeness check).
    rust: &'static str,
    value: u64,
}

macro_rules! consts {
    ($($c:ident = $e:expr),* $(,)?) => {
        vec![$( ConstDesc { c: stringify!($c), rust: stringify!($e), value: ($e) as u64 } ),*]
    };
}

fn constants() -> Vec<ConstDesc> {
    use emp_uapi::{ANY_NODE, ANY_PORT, ETHERTYPE_EMP, PAGE_SIZE};
    consts![
        // lib.rs
        EMP_ANY_NODE = ANY_NODE,
        EMP_ANY_PORT = ANY_PORT,
        EMP_ETHERTYPE_EMP = ETHERTYPE_EMP,
        EMP_PAGE_SIZE = PAGE_SIZE,
        // wire.rs
        EMP_WIRE_VERSION = wire::WIRE_VERSION,
        EMP_MSG_IMM = wire::MSG_IMM,
        EMP_MTU_MAX = wire::MTU_MAX,
        EMP_MCAST_BASE = wire::MCAST_BASE,
        EMP_MCAST_GROUPS = wire::MCAST_GROUPS,
        EMP_MTU_MIN = wire::MTU_MIN,
        EMP_FRAME_DATA = FrameKind::Data as u8,
        EMP_FRAME_ACK = FrameKind::Ack as u8,
        EMP_FRAME_NACK = FrameKind::Nack as u8,
        EMP_FRAME_COLL_DATA = FrameKind::CollData as u8,
        EMP_FRAME_ATOMIC_REQ = FrameKind::AtomicReq as u8,
        EMP_FRAME_ATOMIC_RESP = FrameKind::AtomicResp as u8,
        EMP_FRAME_RMA = FrameKind::Rma as u8,
        EMP_FRAME_RBCAST = FrameKind::Rbcast as u8,
        EMP_RBCAST_DATA = wire::rbcast_kind::DATA,
        EMP_RBCAST_ACK = wire::rbcast_kind::ACK,
        EMP_RBCAST_POLL = wire::rbcast_kind::POLL,
        EMP_RBCAST_NAK = wire::rbcast_kind::NAK,
        EMP_RBCAST_ANNOUNCE = wire::rbcast_kind::ANNOUNCE,
        EMP_RBCAST_FLAG_NAK = wire::rbcast_flag::NAK,
        EMP_RBCAST_PIGGY_ACK = wire::rbcast_flag::PIGGY_ACK,
        EMP_RBCAST_P2P = wire::rbcast_flag::P2P,
        EMP_RBCAST_REPAIR = wire::rbcast_flag::REPAIR,
        EMP_NACK_LOSS = NackReason::Loss as u8,
        EMP_NACK_NO_MATCH = NackReason::NoMatch as u8,
        EMP_NACK_PORT_CLOSED = NackReason::PortClosed as u8,
        EMP_NACK_PEER_TABLE_FULL = NackReason::PeerTableFull as u8,
        EMP_NACK_TOO_LARGE = NackReason::TooLarge as u8,
        EMP_NACK_STALE_EPOCH = NackReason::StaleEpoch as u8,
        EMP_NACK_COLL_MISMATCH = NackReason::CollMismatch as u8,
        EMP_NACK_REMOTE_ACCESS = NackReason::RemoteAccess as u8,
        EMP_NACK_RETAINED = NackReason::Retained as u8,
        EMP_ATOMIC_WINDOW = wire::ATOMIC_WINDOW,
        EMP_ACK_NO_GROUP = wire::ACK_NO_GROUP,
        EMP_FC_GO = wire::FC_GO,
        EMP_FC_SLOW = wire::FC_SLOW,
        EMP_FC_STOP = wire::FC_STOP,
        EMP_ATOMIC_OP_FETCH_ADD = wire::atomic_op::FETCH_ADD,
        EMP_ATOMIC_OP_CMP_SWAP = wire::atomic_op::CMP_SWAP,
        EMP_ATOMIC_OP_SWAP = wire::atomic_op::SWAP,
        EMP_RMA_OP_WRITE = wire::rma_op::WRITE,
        EMP_RMA_OP_WRITE_IMM = wire::rma_op::WRITE_IMM,
        EMP_RMA_OP_READ_REQ = wire::rma_op::READ_REQ,
        EMP_RMA_OP_READ_RESP = wire::rma_op::READ_RESP,
        EMP_RMA_OP_RDV_READ = wire::rma_op::RDV_READ,
        // desc.rs
        EMP_SGE_MAX = desc::SGE_MAX,
        EMP_OP_SEND = Opcode::Send as u8,
        EMP_OP_RECV = Opcode::Recv as u8,
        EMP_OP_MULTI_SEND = Opcode::MultiSend as u8,
        EMP_OP_BCAST = Opcode::Bcast as u8,
        EMP_OP_BARRIER = Opcode::Barrier as u8,
        EMP_OP_REDUCE = Opcode::Reduce as u8,
        EMP_OP_ALLREDUCE = Opcode::Allreduce as u8,
        EMP_OP_ATOMIC_FETCH_ADD = Opcode::AtomicFetchAdd as u8,
        EMP_OP_ATOMIC_CMP_SWAP = Opcode::AtomicCmpSwap as u8,
        EMP_OP_ATOMIC_SWAP = Opcode::AtomicSwap as u8,
        EMP_OP_RDMA_WRITE = Opcode::RdmaWrite as u8,
        EMP_OP_RDMA_READ = Opcode::RdmaRead as u8,
        EMP_OP_RECV_RDMA_IMM = Opcode::RecvRdmaImm as u8,
        EMP_OP_PROBE = Opcode::Probe as u8,
        EMP_OP_RBCAST = Opcode::Rbcast as u8,
        EMP_OP_CANCEL = Opcode::Cancel as u8,
        EMP_OP_START = Opcode::Start as u8,
        EMP_WD_SIGNALED = desc::WD_SIGNALED,
        EMP_WD_IMM = desc::WD_IMM,
        EMP_WD_CLAIM = desc::WD_CLAIM,
        EMP_WD_FLAGS_ALL = desc::WD_FLAGS_ALL,
        EMP_WD_PERSIST = desc::WD_PERSIST,
        EMP_PERSIST_SLOTS = desc::PERSIST_SLOTS,
        EMP_START_BYTES = desc::START_BYTES,
        EMP_STATUS_SUCCESS = Status::Success as u8,
        EMP_STATUS_TRUNCATED = Status::Truncated as u8,
        EMP_STATUS_REMOTE_PORT_CLOSED = Status::RemotePortClosed as u8,
        EMP_STATUS_RETRY_LIMIT_EXCEEDED = Status::RetryLimitExceeded as u8,
        EMP_STATUS_BAD_KEY = Status::BadKey as u8,
        EMP_STATUS_ACCESS_DENIED = Status::AccessDenied as u8,
        EMP_STATUS_FLUSHED = Status::Flushed as u8,
        EMP_STATUS_TABLE_FULL = Status::TableFull as u8,
        EMP_STATUS_TOO_LARGE = Status::TooLarge as u8,
        EMP_STATUS_BAD_DESCRIPTOR = Status::BadDescriptor as u8,
        EMP_STATUS_SENDER_ABORTED = Status::SenderAborted as u8,
        EMP_STATUS_DMA_ERROR = Status::DmaError as u8,
        EMP_STATUS_RNR_RETRY_EXCEEDED = Status::RnrRetryExceeded as u8,
        EMP_STATUS_REMOTE_TABLE_FULL = Status::RemoteTableFull as u8,
        EMP_STATUS_GROUP_INVALID = Status::GroupInvalid as u8,
        EMP_STATUS_STALE_GROUP = Status::StaleGroup as u8,
        EMP_STATUS_INVALID_OP = Status::InvalidOp as u8,
        EMP_STATUS_COLL_MISMATCH = Status::CollMismatch as u8,
        EMP_STATUS_REMOTE_ACCESS_ERROR = Status::RemoteAccessError as u8,
        EMP_STATUS_NO_MESSAGE = Status::NoMessage as u8,
        EMP_STATUS_CANCELED = Status::Canceled as u8,
        EMP_CQE_PHASE = desc::CQE_PHASE,
        EMP_CQE_IMM = desc::CQE_IMM,
        EMP_CQE_FLAGS_OFFSET = desc::CQE_FLAGS_OFFSET,
        EMP_MR_FORMAT_INVALID = MrFormat::Invalid as u8,
        EMP_MR_FORMAT_SHORT = MrFormat::Short as u8,
        EMP_MR_FORMAT_CHAINED = MrFormat::Chained as u8,
        EMP_MR_FORMAT_INDIRECT = MrFormat::Indirect as u8,
        EMP_MR_INLINE_SEGS = desc::MR_INLINE_SEGS,
        EMP_SEGS_PER_PAGE = desc::SEGS_PER_PAGE,
        EMP_SEG_LINK = desc::SEG_LINK,
        EMP_MR_LOCAL_READ = desc::MR_LOCAL_READ,
        EMP_MR_LOCAL_WRITE = desc::MR_LOCAL_WRITE,
        EMP_MR_REMOTE_READ = desc::MR_REMOTE_READ,
        EMP_MR_REMOTE_WRITE = desc::MR_REMOTE_WRITE,
        EMP_MR_REMOTE_ATOMIC = desc::MR_REMOTE_ATOMIC,
        EMP_MR_ACCESS_ALL = desc::MR_ACCESS_ALL,
        // coll.rs
        EMP_TREES_MAX = coll::TREES_MAX,
        EMP_TREE_ROOT = coll::TREE_ROOT,
        EMP_TREE_ROOT_WIDE = coll::TREE_ROOT_WIDE,
        EMP_DTYPE_I32 = Dtype::I32 as u8,
        EMP_DTYPE_I64 = Dtype::I64 as u8,
        EMP_DTYPE_U32 = Dtype::U32 as u8,
        EMP_DTYPE_U64 = Dtype::U64 as u8,
        EMP_DTYPE_F32 = Dtype::F32 as u8,
        EMP_DTYPE_F64 = Dtype::F64 as u8,
        EMP_REDUCE_SUM = ReduceOp::Sum as u8,
        EMP_REDUCE_PROD = ReduceOp::Prod as u8,
        EMP_REDUCE_MIN = ReduceOp::Min as u8,
        EMP_REDUCE_MAX = ReduceOp::Max as u8,
        EMP_REDUCE_BAND = ReduceOp::Band as u8,
        EMP_REDUCE_BOR = ReduceOp::Bor as u8,
        EMP_REDUCE_BXOR = ReduceOp::Bxor as u8,
        EMP_BARRIER_PAIRWISE_EXCHANGE = BarrierAlgo::PairwiseExchange as u8,
        EMP_BARRIER_DISSEMINATION = BarrierAlgo::Dissemination as u8,
        EMP_BARRIER_GATHER_RELEASE = BarrierAlgo::GatherRelease as u8,
        EMP_COLL_ROUND_PE_PRE = coll::PE_PRE,
        EMP_COLL_ROUND_PE_RELEASE = coll::PE_RELEASE,
        EMP_COLL_KIND_BCAST = CollKind::Bcast as u8,
        EMP_COLL_KIND_BARRIER_PE = CollKind::BarrierPe as u8,
        EMP_COLL_KIND_BARRIER_DISS = CollKind::BarrierDiss as u8,
        EMP_COLL_KIND_BARRIER_GATHER = CollKind::BarrierGather as u8,
        EMP_COLL_KIND_BARRIER_RELEASE = CollKind::BarrierRelease as u8,
        EMP_COLL_KIND_REDUCE_UP = CollKind::ReduceUp as u8,
        EMP_COLL_KIND_ALLREDUCE_DOWN = CollKind::AllreduceDown as u8,
        EMP_COLL_KIND_RBCAST = CollKind::Rbcast as u8,
        EMP_RBCAST_TAG_NAK = coll::RBCAST_TAG_NAK,
        // sram.rs
        EMP_BOARD_SIGNATURE = sram::BOARD_SIGNATURE,
        EMP_LAYOUT_VERSION = sram::LAYOUT_VERSION,
        EMP_NIC_ALIVE_PERIOD_NS = sram::NIC_ALIVE_PERIOD_NS,
        EMP_NIC_DEAD_NS = sram::NIC_DEAD_NS,
        EMP_NIC_STATUS_RESET = NicStatus::Reset as u32,
        EMP_NIC_STATUS_LOADING = NicStatus::Loading as u32,
        EMP_NIC_STATUS_RUNNING = NicStatus::Running as u32,
        EMP_NIC_STATUS_FAILED = NicStatus::Failed as u32,
        EMP_FAIL_NONE = FailReason::None as u32,
        EMP_FAIL_BAD_IMAGE_HEADER = FailReason::BadImageHeader as u32,
        EMP_FAIL_WRONG_ABI = FailReason::WrongAbi as u32,
        EMP_FAIL_DIGEST_MISMATCH = FailReason::DigestMismatch as u32,
        EMP_FAIL_BAD_SIGNATURE = FailReason::BadSignature as u32,
        EMP_FAIL_LOAD_FAILED = FailReason::LoadFailed as u32,
        EMP_FAIL_BAD_LAYOUT = FailReason::BadLayout as u32,
        EMP_FAIL_FIRMWARE_CRASHED = FailReason::FirmwareCrashed as u32,
        EMP_FEATURE_OVERFLOW = sram::FEATURE_OVERFLOW,
        EMP_FEATURE_MODIFIED_ACK_NACK = sram::FEATURE_MODIFIED_ACK_NACK,
        EMP_FEATURE_ORDERED_REFUSAL = sram::FEATURE_ORDERED_REFUSAL,
        EMP_FEATURE_RX_DOUBLE_BUFFERING = sram::FEATURE_RX_DOUBLE_BUFFERING,
        EMP_FEATURE_IMMEDIATE_SENDING = sram::FEATURE_IMMEDIATE_SENDING,
        EMP_MATCH_MODE_DEFAULT = sram::match_mode::DEFAULT,
        EMP_MATCH_MODE_UNEXPECTED = sram::match_mode::UNEXPECTED,
        EMP_MATCH_MODE_ORDERED_REFUSAL = sram::match_mode::ORDERED_REFUSAL,
        EMP_COUNTER_TX_FRAMES = counter::TX_FRAMES,
        EMP_COUNTER_RX_FRAMES = counter::RX_FRAMES,
        EMP_COUNTER_RETRANSMITS = counter::RETRANSMITS,
        EMP_COUNTER_DUPLICATES = counter::DUPLICATES,
        EMP_COUNTER_OUT_OF_ORDER = counter::OUT_OF_ORDER,
        EMP_COUNTER_ACKS_TX = counter::ACKS_TX,
        EMP_COUNTER_NACKS_TX = counter::NACKS_TX,
        EMP_COUNTER_DROPPED_UNEXPECTED = counter::DROPPED_UNEXPECTED,
        EMP_COUNTER_DROPPED_MALFORMED = counter::DROPPED_MALFORMED,
        EMP_COUNTER_TIMEOUTS = counter::TIMEOUTS,
        EMP_COUNTER_MSGS_TX = counter::MSGS_TX,
        EMP_COUNTER_MSGS_RX = counter::MSGS_RX,
        EMP_COUNTER_MSGS_FAILED = counter::MSGS_FAILED,
        EMP_COUNTER_OVERFLOW_MSGS = counter::OVERFLOW_MSGS,
        EMP_COUNTER_BAD_DESCRIPTORS = counter::BAD_DESCRIPTORS,
        EMP_COUNTER_ACKS_RX = counter::ACKS_RX,
        EMP_COUNTER_COLL_OPS = counter::COLL_OPS,
        EMP_COUNTER_COLL_EARLY = counter::COLL_EARLY,
        EMP_COUNTER_COLL_REFUSED = counter::COLL_REFUSED,
        EMP_COUNTER_ATOMIC_REPLAYS = counter::ATOMIC_REPLAYS,
        EMP_COUNTER_PEERS_RECLAIMED = counter::PEERS_RECLAIMED,
        EMP_COUNTER_REMOTE_REFUSED = counter::REMOTE_REFUSED,
        EMP_COUNTER_REMOTE_THROTTLED = counter::REMOTE_THROTTLED,
        EMP_COUNTER_UNEXP_EAGER = counter::UNEXP_EAGER,
        EMP_COUNTER_UNEXP_BYTES = counter::UNEXP_BYTES,
        EMP_COUNTER_UNEXP_RDV = counter::UNEXP_RDV,
        EMP_COUNTER_RDV_PULLS = counter::RDV_PULLS,
        EMP_COUNTER_UNEXP_REFUSED_FULL = counter::UNEXP_REFUSED_FULL,
        EMP_COUNTER_COUNT = counter::COUNT,
        EMP_SRAM_SIZE_MAX = sram::SRAM_SIZE_MAX,
        EMP_RING_ENTRIES_MAX = sram::RING_ENTRIES_MAX,
        EMP_ADMIN_OP_NOP = AdminOp::Nop as u32,
        EMP_ADMIN_OP_PORT_OPEN = AdminOp::PortOpen as u32,
        EMP_ADMIN_OP_PORT_CLOSE = AdminOp::PortClose as u32,
        EMP_ADMIN_OP_MR_FENCE = AdminOp::MrFence as u32,
        EMP_ADMIN_OP_GROUP_SET = AdminOp::GroupSet as u32,
        EMP_ADMIN_OP_GROUP_CLEAR = AdminOp::GroupClear as u32,
        EMP_ADMIN_OP_PORT_SUSPEND = AdminOp::PortSuspend as u32,
        EMP_ADMIN_OP_PORT_STABLE = AdminOp::PortStable as u32,
        EMP_ADMIN_OP_PORT_SAVE = AdminOp::PortSave as u32,
        EMP_ADMIN_OP_PORT_RESTORE = AdminOp::PortRestore as u32,
        EMP_ADMIN_OP_PORT_RESUME = AdminOp::PortResume as u32,
        EMP_ADMIN_OP_PORT_DISCARD = AdminOp::PortDiscard as u32,
        EMP_PORT_ADDR_EXPLICIT = sram::PORT_ADDR_EXPLICIT,
        EMP_CTX_IMAGE_MAX = sram::CTX_IMAGE_MAX,
        EMP_ADMIN_RESULT_OK = admin_result::OK,
        EMP_ADMIN_RESULT_BAD_OP = admin_result::BAD_OP,
        EMP_ADMIN_RESULT_BAD_ARG = admin_result::BAD_ARG,
        EMP_ADMIN_RESULT_BAD_STATE = admin_result::BAD_STATE,
        EMP_ADMIN_RESULT_BAD_KEY = admin_result::BAD_KEY,
        EMP_ADMIN_RESULT_NOT_STABLE = admin_result::NOT_STABLE,
        EMP_ADMIN_RESULT_BAD_IMAGE = admin_result::BAD_IMAGE,
        EMP_ADMIN_RESULT_NO_ROOM = admin_result::NO_ROOM,
        EMP_GROUP_MEMBERS_MAX = sram::GROUP_MEMBERS_MAX,
        EMP_GROUP_INLINE_MAX = sram::GROUP_INLINE_MAX,
        EMP_MULTISEND_WINDOW = coll::MULTISEND_WINDOW,
        EMP_RBCAST_MEMBERS_MAX = coll::RBCAST_MEMBERS_MAX,
        EMP_PORT_STATE_CLOSED = port_state::CLOSED,
        EMP_PORT_STATE_OPEN = port_state::OPEN,
        EMP_PORT_STATE_SUSPENDED = port_state::SUSPENDED,
        EMP_CTL_SEND_PROD = ctl::SEND_PROD,
        EMP_CTL_RECV_PROD = ctl::RECV_PROD,
        EMP_CTL_CQ_CONS = ctl::CQ_CONS,
        EMP_CTL_ARM = ctl::ARM,
        EMP_CTL_SEND_CONS = ctl::SEND_CONS,
        EMP_CTL_RECV_CONS = ctl::RECV_CONS,
        EMP_CTL_CQ_PROD = ctl::CQ_PROD,
        EMP_CTL_CQ_OVERRUNS = ctl::CQ_OVERRUNS,
        EMP_CTL_NIC_SLEEPING = ctl::NIC_SLEEPING,
        EMP_CTL_NIC_ALIVE = ctl::NIC_ALIVE,
        EMP_CTL_STATE = ctl::STATE,
        EMP_CTL_GEN = ctl::GEN,
        // image.rs
        EMP_IMAGE_MAGIC = image::IMAGE_MAGIC,
        EMP_IMAGE_HEADER_VERSION = image::IMAGE_HEADER_VERSION,
        EMP_FIRMWARE_ABI = image::FIRMWARE_ABI,
        EMP_FW_HOST_SEGS_MAX = fwabi::HOST_SEGS_MAX,
        EMP_FW_DMA_WINDOW_SHIFT = fwabi::DMA_WINDOW_SHIFT,
        EMP_FW_SIDE_WHOLE = fwabi::SIDE_WHOLE,
        EMP_FW_SIDE_WAKE_SHIFT = fwabi::SIDE_WAKE_SHIFT,
        EMP_IMAGE_SIGNED_LEN = image::SIGNED_LEN,
        EMP_IMAGE_PAYLOAD_MAX = image::PAYLOAD_MAX,
        EMP_CPU_PLAN_BASE = cpu_plan::BASE,
        EMP_CPU_PLAN_SO = cpu_plan::SO,
        EMP_CPU_PLAN_RO = cpu_plan::RO,
        EMP_CPU_PLAN_SR = cpu_plan::SR,
        EMP_CPU_PLAN_DSR = cpu_plan::DSR,
        // ioctl.rs
        EMP_IOC_MAGIC = EMP_IOC_MAGIC,
        EMP_IOC_QUERY = EMP_IOC_QUERY,
        EMP_IOC_REG_MR = EMP_IOC_REG_MR,
        EMP_IOC_DEREG_MR = EMP_IOC_DEREG_MR,
        EMP_IOC_ARM = EMP_IOC_ARM,
        EMP_IOC_SET_EVENTFD = EMP_IOC_SET_EVENTFD,
        EMP_IOC_START = EMP_IOC_START,
        EMP_IOC_GROUP_SET = EMP_IOC_GROUP_SET,
        EMP_IOC_GROUP_CLEAR = EMP_IOC_GROUP_CLEAR,
        EMP_IOC_PORT_CTX = EMP_IOC_PORT_CTX,
        EMP_IOC_GANG = EMP_IOC_GANG,
        EMP_PORT_CTX_SUSPEND = port_ctx::SUSPEND,
        EMP_PORT_CTX_STABLE = port_ctx::STABLE,
        EMP_PORT_CTX_SAVE = port_ctx::SAVE,
        EMP_PORT_CTX_RESTORE = port_ctx::RESTORE,
        EMP_PORT_CTX_RESUME = port_ctx::RESUME,
        EMP_GANG_IMAGE_ROOM = EMP_GANG_IMAGE_ROOM,
        EMP_QUERY_SIZE_VER0 = EMP_QUERY_SIZE_VER0,
        EMP_REG_MR_SIZE_VER0 = EMP_REG_MR_SIZE_VER0,
        EMP_DEREG_MR_SIZE_VER0 = EMP_DEREG_MR_SIZE_VER0,
        EMP_SET_EVENTFD_SIZE_VER0 = EMP_SET_EVENTFD_SIZE_VER0,
        EMP_ARM_SIZE_VER0 = EMP_ARM_SIZE_VER0,
        EMP_START_SIZE_VER0 = EMP_START_SIZE_VER0,
        EMP_GROUP_SET_SIZE_VER0 = EMP_GROUP_SET_SIZE_VER0,
        EMP_GROUP_CLEAR_SIZE_VER0 = EMP_GROUP_CLEAR_SIZE_VER0,
        EMP_PORT_CTX_SIZE_VER0 = EMP_PORT_CTX_SIZE_VER0,
        EMP_GANG_SIZE_VER0 = EMP_GANG_SIZE_VER0,
        // attach.rs
        EMP_ATTACH_VERSION = attach::ATTACH_VERSION,
        EMP_ATTACH_OP_ATTACH = attach::op::ATTACH,
        EMP_ATTACH_OP_REG_ARENA = attach::op::REG_ARENA,
        EMP_ATTACH_OP_REG_VM = attach::op::REG_VM,
        EMP_ATTACH_OP_START = attach::op::START,
        EMP_ATTACH_OP_DEREG = attach::op::DEREG,
        EMP_ATTACH_OP_STATS = attach::op::STATS,
        EMP_ATTACH_OP_GROUP_SET = attach::op::GROUP_SET,
        EMP_ATTACH_OP_GROUP_CLEAR = attach::op::GROUP_CLEAR,
        EMP_ATTACH_OP_STATS_EXT = attach::op::STATS_EXT,
        EMP_ATTACH_OP_WIRE_INFO = attach::op::WIRE_INFO,
        EMP_ATTACH_OP_WIRE_ROUTES = attach::op::WIRE_ROUTES,
        EMP_ATTACH_OP_WIRE_AUTH = attach::op::WIRE_AUTH,
        EMP_ATTACH_OP_WIRE_REKEY = attach::op::WIRE_REKEY,
        EMP_ATTACH_OP_WIRE_MCAST = attach::op::WIRE_MCAST,
        EMP_ATTACH_OP_PORT_SUSPEND = attach::op::PORT_SUSPEND,
        EMP_ATTACH_OP_PORT_STABLE = attach::op::PORT_STABLE,
        EMP_ATTACH_OP_PORT_SAVE = attach::op::PORT_SAVE,
        EMP_ATTACH_OP_PORT_RESTORE = attach::op::PORT_RESTORE,
        EMP_ATTACH_OP_PORT_RESUME = attach::op::PORT_RESUME,
        EMP_ATTACH_OP_GANG = attach::op::GANG,
        EMP_ATTACH_OP_BUSY = attach::op::BUSY,
        EMP_GANG_SUSPEND = attach::gang::SUSPEND,
        EMP_GANG_STABLE = attach::gang::STABLE,
        EMP_GANG_SAVE = attach::gang::SAVE,
        EMP_GANG_RESTORE = attach::gang::RESTORE,
        EMP_GANG_RESUME = attach::gang::RESUME,
        EMP_GANG_PORTS = attach::gang::PORTS,
        EMP_MCAST_REPLY_SENT = attach::mcast_reply::SENT,
        EMP_MCAST_REPLY_RECEIVED = attach::mcast_reply::RECEIVED,
        EMP_MCAST_REPLY_FALLBACK = attach::mcast_reply::FALLBACK,
        EMP_REKEY_INSTALL = attach::rekey::INSTALL,
        EMP_REKEY_SWITCH = attach::rekey::SWITCH,
        EMP_AUTH_REPLY_MODE = attach::auth_reply::MODE,
        EMP_AUTH_REPLY_KEY_ID = attach::auth_reply::KEY_ID,
        EMP_AUTH_REPLY_NEXT_KEY_ID = attach::auth_reply::NEXT_KEY_ID,
        EMP_AUTH_REPLY_PREVIOUS_KEY_ID = attach::auth_reply::PREVIOUS_KEY_ID,
        EMP_AUTH_REPLY_BAD_TAG = attach::auth_reply::BAD_TAG,
        EMP_AUTH_REPLY_UNKNOWN_KEY = attach::auth_reply::UNKNOWN_KEY,
        EMP_AUTH_REPLY_REPLAYED = attach::auth_reply::REPLAYED,
        EMP_AUTH_REPLY_TRAILER = attach::auth_reply::TRAILER,
        EMP_WIRE_REPLY_KIND = attach::wire_reply::KIND,
        EMP_WIRE_REPLY_NODES = attach::wire_reply::NODES,
        EMP_WIRE_REPLY_LOCAL_NICS = attach::wire_reply::LOCAL_NICS,
        EMP_WIRE_REPLY_LOCAL_INDEX = attach::wire_reply::LOCAL_INDEX,
        EMP_WIRE_REPLY_LINK_FLAGS = attach::wire_reply::LINK_FLAGS,
        EMP_WIRE_REPLY_LINK_MTU = attach::wire_reply::LINK_MTU,
        EMP_WIRE_REPLY_LINK_MAC = attach::wire_reply::LINK_MAC,
        EMP_WIRE_REPLY_LINK_NAME = attach::wire_reply::LINK_NAME,
        EMP_WIRE_REPLY_COUNTERS = attach::wire_reply::COUNTERS,
        EMP_WIRE_REPLY_DAEMON_PID = attach::wire_reply::DAEMON_PID,
        EMP_WIRE_REPLY_MTU = attach::wire_reply::MTU,
        EMP_WIRE_REPLY_FROM_HOST = attach::wire_reply::FROM_HOST,
        EMP_WIRE_ROUTES_PER_PAGE = attach::ROUTES_PER_PAGE,
        EMP_WIRE_COUNTER_SENT = attach::wire_counter::SENT,
        EMP_WIRE_COUNTER_RECEIVED = attach::wire_counter::RECEIVED,
        EMP_WIRE_COUNTER_LOST = attach::wire_counter::LOST,
        EMP_WIRE_COUNTER_DUPLICATED = attach::wire_counter::DUPLICATED,
        EMP_WIRE_COUNTER_REORDERED = attach::wire_counter::REORDERED,
        EMP_WIRE_COUNTER_UNKNOWN_SOURCE = attach::wire_counter::UNKNOWN_SOURCE,
        EMP_WIRE_COUNTER_SOURCE_MISMATCH = attach::wire_counter::SOURCE_MISMATCH,
        EMP_WIRE_COUNTER_FOREIGN_ETHERTYPE = attach::wire_counter::FOREIGN_ETHERTYPE,
        EMP_WIRE_COUNTER_MALFORMED = attach::wire_counter::MALFORMED,
        EMP_WIRE_COUNTER_COUNT = attach::wire_counter::COUNT,
        EMP_WIRE_KIND_MEM = attach::wire_kind::MEM,
        EMP_WIRE_KIND_UDP = attach::wire_kind::UDP,
        EMP_WIRE_KIND_PACKET = attach::wire_kind::PACKET,
        EMP_LINK_KNOWN = attach::link_flags::KNOWN,
        EMP_LINK_UP = attach::link_flags::UP,
        EMP_LINK_ERROR = attach::link_flags::ERROR,
        EMP_ATTACH_STATUS_OK = attach::status::OK,
        EMP_ATTACH_STATUS_EINVAL = attach::status::EINVAL,
        EMP_ATTACH_STATUS_ENOSPC = attach::status::ENOSPC,
        EMP_ATTACH_STATUS_ENOMEM = attach::status::ENOMEM,
        EMP_ATTACH_STATUS_EPERM = attach::status::EPERM,
        EMP_ATTACH_STATUS_ENOENT = attach::status::ENOENT,
        EMP_ATTACH_STATUS_ENODEV = attach::status::ENODEV,
        EMP_ATTACH_STATUS_EPROTO = attach::status::EPROTO,
        EMP_ATTACH_STATUS_EOPNOTSUPP = attach::status::EOPNOTSUPP,
        EMP_ATTACH_REPLY_DAEMON_PID = attach::attach_reply::DAEMON_PID,
        EMP_ATTACH_REPLY_NODE = attach::attach_reply::NODE,
        EMP_ATTACH_REPLY_PORT = attach::attach_reply::PORT,
        EMP_ATTACH_REPLY_GEN = attach::attach_reply::GEN,
        EMP_ATTACH_REPLY_MTU = attach::attach_reply::MTU,
        EMP_ATTACH_REPLY_WINDOW_SIZE = attach::attach_reply::WINDOW_SIZE,
        EMP_ATTACH_REPLY_SEND_ENTRIES = attach::attach_reply::SEND_ENTRIES,
        EMP_ATTACH_REPLY_RECV_ENTRIES = attach::attach_reply::RECV_ENTRIES,
        EMP_ATTACH_REPLY_FEATURES = attach::attach_reply::FEATURES,
        EMP_ATTACH_REPLY_PORT_COUNT = attach::attach_reply::PORT_COUNT,
        EMP_ATTACH_REPLY_NODES = attach::attach_reply::NODES,
        EMP_ATTACH_REPLY_MSG_MAX = attach::attach_reply::MSG_MAX,
    ]
}

struct StrConstDesc {
    c: &'static str,
    /// Rust expression (for messages and the completeness check).
    rust: &'static str,
    value: &'static str,
}

macro_rules! str_consts {
    ($($c:ident = $e:expr),* $(,)?) => {
        vec![$( StrConstDesc { c: stringify!($c), rust: stringify!($e), value: $e } ),*]
    };
}

/// String constants: C string-literal macros.
fn string_constants() -> Vec<StrConstDesc> {
    str_consts![
        // fwabi.rs
        EMP_FW_SYM_ABI = fwabi::SYM_ABI,
        EMP_FW_SYM_BOOT = fwabi::SYM_BOOT,
        EMP_FW_SYM_DOORBELL = fwabi::SYM_DOORBELL,
        EMP_FW_SYM_FRAMES = fwabi::SYM_FRAMES,
        EMP_FW_SYM_TIMEOUT = fwabi::SYM_TIMEOUT,
        EMP_FW_SYM_POLL_TIMEOUT = fwabi::SYM_POLL_TIMEOUT,
        EMP_FW_SYM_DESCRIBE = fwabi::SYM_DESCRIBE,
        EMP_FW_SYM_FREE = fwabi::SYM_FREE,
        EMP_FW_SYM_CPUS = fwabi::SYM_CPUS,
        EMP_FW_SYM_CPU = fwabi::SYM_CPU,
        EMP_FW_SYM_CPU_PENDING = fwabi::SYM_CPU_PENDING,
        EMP_FW_SYM_FRAME_CPU = fwabi::SYM_FRAME_CPU,
        EMP_FW_SYM_CPU_AREA = fwabi::SYM_CPU_AREA,
        EMP_FW_SYM_CPU_AREA_FREE = fwabi::SYM_CPU_AREA_FREE,
        EMP_FW_SYM_CPU_JOBS = fwabi::SYM_CPU_JOBS,
        EMP_FW_SYM_CPU_WANTS_PROGRAM = fwabi::SYM_CPU_WANTS_PROGRAM,
        EMP_FW_SYM_RECV_SIDE_FRAMES = fwabi::SYM_RECV_SIDE_FRAMES,
        EMP_FW_SYM_RECV_SIDE_DOORBELL = fwabi::SYM_RECV_SIDE_DOORBELL,
        EMP_FW_SYM_SEND_SIDE_DOORBELL = fwabi::SYM_SEND_SIDE_DOORBELL,
        EMP_FW_SYM_SEND_SIDE_CPU = fwabi::SYM_SEND_SIDE_CPU,
        EMP_FW_SYM_DEADLINE = fwabi::SYM_DEADLINE,
    ]
}

/// Function-like macros of the header, checked through sample calls:
/// (output name, C expression, Rust value).
fn c_expressions() -> Vec<(String, String, u64)> {
    let mut v = Vec::new();
    for t in Dtype::ALL {
        for op in ReduceOp::ALL {
            for tree in [0u8, 1, (coll::TREES_MAX - 1) as u8] {
                v.push((
                    format!("EMP_REDUCE_TAG/{}/{}/{tree}", t.name(), op.name()),
                    format!(
                        "EMP_REDUCE_TAG(EMP_DTYPE_{}, EMP_REDUCE_{}, {tree})",
                        t.name().to_uppercase(),
                        op.name().to_uppercase()
                    ),
                    coll::reduce_tag(t, op, tree),
                ));
            }
        }
    }
    for (coroots, m, w) in [(0u16, 0u8, 0u8), (7, 10, 4), (255, 1, 16), (256, 2, 0), (511, 255, 255), (1023, 8, 64)] {
        for nak in [false, true] {
            let a = coll::RbcastAlgo { coroots, ack_every: m, window: w, nak };
            let mac = if nak { "EMP_RBCAST_TAG_NAKS" } else { "EMP_RBCAST_TAG" };
            v.push((format!("{mac}/{coroots}/{m}/{w}"), format!("{mac}({coroots}, {m}, {w})"), coll::rbcast_tag(a)));
        }
    }
    // The macro yields a value as wide as the descriptor's tag.
    v.push((
        "sizeof/EMP_REDUCE_TAG".into(),
        "sizeof(EMP_REDUCE_TAG(EMP_DTYPE_I32, EMP_REDUCE_SUM, 0))".into(),
        size_of::<u64>() as u64,
    ));
    for (n, trees) in [(1u16, 1u8), (64, 8), (65, 1), (1024, 1), (1024, 8)] {
        let e = sram::GroupEntry { member_count: n, tree_count: trees, ..Default::default() };
        v.push((
            format!("EMP_GROUP_BODY_LEN/{n}/{trees}"),
            format!("EMP_GROUP_BODY_LEN({n}U, {trees}U)"),
            e.body_len() as u64,
        ));
        v.push((format!("EMP_GROUP_SPAN/{n}/{trees}"), format!("EMP_GROUP_SPAN({n}U, {trees}U)"), e.span() as u64));
    }
    v
}

/// Rust `pub const`s deliberately without a C counterpart.
const NOT_IN_C: &[&str] = &[
    // Counter names for tools: strings.
    "NAMES",
    // `Dtype::ALL` / `ReduceOp::ALL`: arrays of every enum value, for tests
    // and tools (each value has its own EMP_DTYPE_* / EMP_REDUCE_* constant).
    "ALL",
];

/// The ioctl commands and their `<linux/ioctl.h>` spelling:
/// (C name, `_IOWR` or `_IOW`, nr, C struct).
const LINUX_IOCTLS: &[(&str, &str, u32, &str)] = &[
    ("EMP_IOC_QUERY", "_IOWR", 1, "emp_query"),
    ("EMP_IOC_REG_MR", "_IOWR", 2, "emp_reg_mr"),
    ("EMP_IOC_DEREG_MR", "_IOW", 3, "emp_dereg_mr"),
    ("EMP_IOC_ARM", "_IOW", 4, "emp_arm"),
    ("EMP_IOC_SET_EVENTFD", "_IOW", 5, "emp_set_eventfd"),
    ("EMP_IOC_START", "_IOW", 6, "emp_start"),
    ("EMP_IOC_GROUP_SET", "_IOWR", 7, "emp_group_set"),
    ("EMP_IOC_GROUP_CLEAR", "_IOW", 8, "emp_group_clear"),
    ("EMP_IOC_PORT_CTX", "_IOWR", 9, "emp_port_ctx"),
    ("EMP_IOC_GANG", "_IOWR", 10, "emp_gang"),
];

/// Architectures whose `<linux/ioctl.h>` uses the asm-generic encoding that
/// the Rust constants hard-code.
const GENERIC_IOCTL_ARCH: bool = cfg!(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "riscv64",
        target_arch = "loongarch64",
        target_arch = "s390x"
    )
));

// ---------------------------------------------------------------------------
// Expected lines and the C program
// ---------------------------------------------------------------------------

fn elem_str(e: Elem) -> String {
    match e {
        Elem::Int(t) => t.into(),
        Elem::Struct(s) => format!("struct_{s}"),
        Elem::Ptr(c) => c.into(),
    }
}

/// Key → value pairs the C program must print.
fn expected() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for s in structs() {
        m.insert(format!("size {}", s.c), format!("{}", s.size));
        for f in &s.fields {
            m.insert(
                format!("field {} {}", s.c, f.name),
                format!("offset={} size={} elem_size={} elem={}", f.offset, f.size, f.elem_size, elem_str(f.elem)),
            );
        }
    }
    for c in constants() {
        m.insert(format!("const {}", c.c), format!("{}", c.value));
    }
    for c in string_constants() {
        m.insert(format!("str {}", c.c), c.value.into());
    }
    for (name, _, value) in c_expressions() {
        m.insert(format!("expr {name}"), format!("{value}"));
    }
    if GENERIC_IOCTL_ARCH {
        let by_name: BTreeMap<_, _> = constants().into_iter().map(|c| (c.c, c.value)).collect();
        for (name, _, _, _) in LINUX_IOCTLS {
            m.insert(format!("linux {name}"), format!("{}", by_name[name]));
        }
    }
    m
}

fn c_program() -> String {
    let mut p = String::new();
    p.push_str("#include <stdio.h>\n#include <stddef.h>\n#include \"emp_uapi.h\"\n");
    if GENERIC_IOCTL_ARCH {
        p.push_str("#include <linux/ioctl.h>\n");
    }
    // The exact <stdint.h> type of an integer field (no integer promotion
    // in a _Generic controlling expression).
    p.push_str(
        "#define EMP_INT_TYPE(x) _Generic((x), \\\n\
         \tuint8_t: \"uint8_t\", uint16_t: \"uint16_t\", uint32_t: \"uint32_t\", uint64_t: \"uint64_t\", \\\n\
         \tint8_t: \"int8_t\", int16_t: \"int16_t\", int32_t: \"int32_t\", int64_t: \"int64_t\", \\\n\
         \tdefault: \"(not-a-fixed-width-integer)\")\n",
    );
    p.push_str("int main(void)\n{\n");
    for s in structs() {
        let t = format!("struct {}", s.c);
        p.push_str(&format!("\tprintf(\"size {} %zu\\n\", sizeof({t}));\n", s.c));
        for f in &s.fields {
            let lv = format!("(({t} *)0)->{}", f.name);
            let el = if f.array { format!("{lv}[0]") } else { lv.clone() };
            let kind = match f.elem {
                Elem::Int(_) => format!("EMP_INT_TYPE({el})"),
                Elem::Struct(c) => format!(
                    "(__builtin_types_compatible_p(__typeof__({el}), struct {c}) ? \"struct_{c}\" : \"(not_struct_{c})\")"
                ),
                Elem::Ptr(c) => format!(
                    "(__builtin_types_compatible_p(__typeof__({el}), {c}) ? \"{c}\" : \"(not: {c})\")"
                ),
            };
            p.push_str(&format!(
                "\tprintf(\"field {} {} offset=%zu size=%zu elem_size=%zu elem=%s\\n\", offsetof({t}, {}), sizeof({lv}), sizeof({el}), {kind});\n",
                s.c, f.name, f.name
            ));
        }
    }
    for c in constants() {
        p.push_str(&format!("\tprintf(\"const {0} %llu\\n\", (unsigned long long)({0}));\n", c.c));
    }
    for c in string_constants() {
        // `"" X` compiles only when X is a string literal.
        p.push_str(&format!("\tprintf(\"str {0} %s\\n\", \"\" {0});\n", c.c));
    }
    for (name, expr, _) in c_expressions() {
        p.push_str(&format!("\tprintf(\"expr {name} %llu\\n\", (unsigned long long)({expr}));\n"));
    }
    if GENERIC_IOCTL_ARCH {
        for (name, mac, nr, st) in LINUX_IOCTLS {
            p.push_str(&format!(
                "\tprintf(\"linux {name} %llu\\n\", (unsigned long long)({mac}('E', {nr}, struct {st})));\n"
            ));
        }
    }
    p.push_str("\treturn 0;\n}\n");
    p
}

// ---------------------------------------------------------------------------
// Compiling and running
// ---------------------------------------------------------------------------

fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// A compiler command (program + leading arguments) that runs: `$env_var`
/// when set (and then only it), else the first candidate that runs.
fn find_compiler(env_var: &str, candidates: &[&str]) -> Result<Vec<String>, String> {
    let runs = |cmd: &[String]| {
        Command::new(&cmd[0]).args(&cmd[1..]).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
    };
    if let Ok(v) = std::env::var(env_var) {
        let words: Vec<String> = v.split_whitespace().map(String::from).collect();
        if !words.is_empty() {
            return if runs(&words) {
                Ok(words)
            } else {
                Err(format!("{env_var}={v:?} is set but `{v} --version` does not run"))
            };
        }
    }
    candidates
        .iter()
        .map(|c| vec![c.to_string()])
        .find(|cmd| runs(cmd))
        .ok_or_else(|| format!("{env_var} is not set and none of {candidates:?} runs"))
}

/// A fresh, unique directory under the system temp dir, removed on drop
/// unless the test failed (then it is kept for inspection).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "emp-uapi-{tag}-{}-{nanos}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            eprintln!("kept {} for inspection", self.0.display());
        }
    }
}

fn compile(cmd: &[String], flags: &[&str], src: &Path, out: &Path) {
    let o = Command::new(&cmd[0])
        .args(&cmd[1..])
        .args(flags)
        .arg("-I")
        .arg(include_dir())
        .arg(src)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} {flags:?} failed on {}:\n{}{}",
        src.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn split_line(l: &str) -> Option<(String, String)> {
    // "size S N", "field S f rest…", "const N V", "linux N V", "str N V", "expr N V"
    let words: Vec<&str> = l.split_whitespace().collect();
    match words.first().copied()? {
        "size" | "const" | "linux" | "str" | "expr" if words.len() == 3 => {
            Some((format!("{} {}", words[0], words[1]), words[2].into()))
        }
        "field" if words.len() >= 4 => Some((words[..3].join(" "), words[3..].join(" "))),
        _ => None,
    }
}

/// "struct emp_cqe field flags (Cqe::flags)" style names for messages.
fn describe(key: &str) -> String {
    let w: Vec<&str> = key.split(' ').collect();
    let rust_of = |c: &str| structs().into_iter().find(|s| s.c == c).map(|s| s.rust).unwrap_or("?");
    match w[0] {
        "size" => format!("sizeof(struct {}) (Rust {})", w[1], rust_of(w[1])),
        "field" => format!("struct {} field {} (Rust {}::{})", w[1], w[2], rust_of(w[1]), w[2]),
        "const" => {
            let r = constants().into_iter().find(|c| c.c == w[1]).map(|c| c.rust).unwrap_or("?");
            format!("constant {} (Rust {r})", w[1])
        }
        "linux" => format!("{} vs <linux/ioctl.h> _IOW/_IOWR", w[1]),
        "str" => {
            let r = string_constants().into_iter().find(|c| c.c == w[1]).map(|c| c.rust).unwrap_or("?");
            format!("string constant {} (Rust {r})", w[1])
        }
        "expr" => {
            let e = c_expressions().into_iter().find(|e| e.0 == w[1]).map(|e| e.1).unwrap_or_else(|| "?".into());
            format!("C expression {e}")
        }
        _ => key.into(),
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// The Rust-side tables are complete and self-consistent: every `le_struct!`
/// and `#[repr(C)]` struct is listed, listed fields tile their structure,
/// every constant and enum value has a C name.
#[test]
fn rust_tables_are_complete() {
    let mut errors = Vec::new();

    // Every le_struct! in src/ is listed.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut in_src = Vec::new();
    let mut repr_c = Vec::new();
    let mut const_idents = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut in_macro = false;
        let mut after_repr_c = false;
        let struct_name = |t: &str| {
            t["pub struct ".len()..].split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap().to_string()
        };
        for line in text.lines() {
            let t = line.trim();
            if t.starts_with("le_struct! {") {
                in_macro = true;
            } else if in_macro && t.starts_with("pub struct ") {
                in_src.push(struct_name(t));
                in_macro = false;
            } else if t.starts_with("#[repr(C)]") {
                after_repr_c = true;
            } else if after_repr_c && t.starts_with("pub struct ") {
                // (The `le_struct!` definition's own `pub struct $name` yields "".)
                let name = struct_name(t);
                if !name.is_empty() {
                    repr_c.push(name);
                }
                after_repr_c = false;
            }
            if let Some(rest) = t.strip_prefix("pub const ") {
                if !rest.starts_with("fn ") {
                    let id = rest.split(':').next().unwrap().trim();
                    const_idents.push(id.to_string());
                }
            }
        }
    }
    let listed: Vec<&str> = structs().iter().map(|s| s.rust).collect();
    for s in &in_src {
        if !listed.contains(&s.as_str()) {
            errors.push(format!("le_struct {s} (in src/) has no entry in c_layout.rs / emp_uapi.h"));
        }
    }
    for s in &repr_c {
        if !listed.contains(&s.as_str()) {
            errors.push(format!("#[repr(C)] struct {s} (in src/) has no entry in c_layout.rs / emp_uapi.h"));
        }
    }
    assert!(in_src.len() >= 20, "found only {} le_structs in src/: {in_src:?}", in_src.len());
    assert!(repr_c.len() >= 2, "found only {} plain #[repr(C)] structs in src/: {repr_c:?}", repr_c.len());
    for s in structs() {
        let is_le = in_src.iter().any(|n| n == s.rust);
        if is_le != s.le_size.is_some() {
            errors.push(format!(
                "{}: listed with st!/st_repr_c! but is{} an le_struct",
                s.rust,
                if is_le { "" } else { " not" }
            ));
        }
    }

    // Fields tile each structure exactly: no field forgotten.
    for s in structs() {
        if let Some(le_size) = s.le_size {
            if s.size != le_size {
                errors.push(format!("{}: size_of {} != Le::SIZE {le_size}", s.rust, s.size));
            }
        }
        let mut fields: Vec<&FieldDesc> = s.fields.iter().collect();
        fields.sort_by_key(|f| f.offset);
        let mut at = 0;
        for f in fields {
            if f.offset != at {
                errors.push(format!(
                    "{}::{}: at offset {} but previous field ends at {at} (field missing from the list?)",
                    s.rust, f.name, f.offset
                ));
            }
            if f.size % f.elem_size != 0 || (!f.array && f.size != f.elem_size) {
                errors.push(format!("{}::{}: size {} / element size {}", s.rust, f.name, f.size, f.elem_size));
            }
            at = f.offset + f.size;
        }
        if at != s.size {
            errors.push(format!(
                "{}: fields end at {at}, struct is {} bytes (field missing from the list?)",
                s.rust, s.size
            ));
        }
    }

    // Every pub const (numeric or string) has a C counterpart.
    let consts = constants();
    let str_consts = string_constants();
    let covered: Vec<&str> = consts
        .iter()
        .filter(|c| !c.rust.contains(" as "))
        .map(|c| c.rust)
        .chain(str_consts.iter().map(|c| c.rust))
        .map(|r| r.rsplit("::").next().unwrap().trim())
        .collect();
    for id in &const_idents {
        if !covered.contains(&id.as_str()) && !NOT_IN_C.contains(&id.as_str()) {
            errors.push(format!("pub const {id} (in src/) has no C constant in emp_uapi.h / c_layout.rs"));
        }
    }
    let mut names: Vec<&str> = consts.iter().map(|c| c.c).chain(str_consts.iter().map(|c| c.c)).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), consts.len() + str_consts.len(), "duplicate C constant names");

    // Every enum value has a C constant.
    fn count(f: impl Fn(u32) -> bool) -> usize {
        (0..=0xFFFF).filter(|&v| f(v)).count()
    }
    let prefixed = |p: &str| consts.iter().filter(|c| c.c.starts_with(p)).count();
    let atomic_op_accepted = |op: u8| {
        let hdr = FrameHeader { version: wire::WIRE_VERSION, kind: FrameKind::AtomicReq as u8, ..Default::default() };
        let body = AtomicBody { op, width: 8, ..Default::default() };
        let mut b = [0u8; FrameHeader::SIZE + AtomicBody::SIZE];
        emit_atomic_req(&hdr, &body, &mut b).is_ok() && Frame::parse(&b).is_ok()
    };
    let enums: [(&str, usize, usize); 12] = [
        ("EMP_FRAME_", count(|v| v <= 255 && FrameKind::from_u8(v as u8).is_some()), prefixed("EMP_FRAME_")),
        ("EMP_NACK_", count(|v| v <= 255 && NackReason::from_u8(v as u8).is_some()), prefixed("EMP_NACK_")),
        ("EMP_OP_", count(|v| v <= 255 && Opcode::from_u8(v as u8).is_some()), prefixed("EMP_OP_")),
        ("EMP_STATUS_", count(|v| v <= 255 && Status::from_u8(v as u8).is_some()), prefixed("EMP_STATUS_")),
        ("EMP_MR_FORMAT_", count(|v| v <= 255 && MrFormat::from_u8(v as u8).is_some()), prefixed("EMP_MR_FORMAT_")),
        ("EMP_NIC_STATUS_", count(|v| NicStatus::from_u32(v).is_some()), prefixed("EMP_NIC_STATUS_")),
        ("EMP_FAIL_", count(|v| FailReason::from_u32(v).is_some()), prefixed("EMP_FAIL_")),
        ("EMP_DTYPE_", count(|v| v <= 255 && Dtype::from_u8(v as u8).is_some()), prefixed("EMP_DTYPE_")),
        ("EMP_REDUCE_", count(|v| v <= 255 && ReduceOp::from_u8(v as u8).is_some()), prefixed("EMP_REDUCE_")),
        ("EMP_BARRIER_", count(|v| BarrierAlgo::from_u16(v as u16).is_some()), prefixed("EMP_BARRIER_")),
        ("EMP_COLL_KIND_", count(|v| v <= 255 && CollKind::from_u8(v as u8).is_some()), prefixed("EMP_COLL_KIND_")),
        ("EMP_ATOMIC_OP_", count(|v| v <= 255 && atomic_op_accepted(v as u8)), prefixed("EMP_ATOMIC_OP_")),
    ];
    for (p, decodable, listed) in enums {
        if decodable != listed {
            errors.push(format!("{p}*: the Rust enum decodes {decodable} values, {listed} C constants listed"));
        }
    }
    let admin_ops = count(|v| AdminOp::from_u32(v).is_some());
    if admin_ops != prefixed("EMP_ADMIN_OP_") {
        errors.push(format!("EMP_ADMIN_OP_*: AdminOp decodes {admin_ops} values"));
    }
    // The `ALL` tables the expression checks iterate are complete.
    if Dtype::ALL.len() != count(|v| v <= 255 && Dtype::from_u8(v as u8).is_some()) {
        errors.push("Dtype::ALL does not list every decodable dtype".into());
    }
    if ReduceOp::ALL.len() != count(|v| v <= 255 && ReduceOp::from_u8(v as u8).is_some()) {
        errors.push("ReduceOp::ALL does not list every decodable operator".into());
    }
    // Counter slots: one C constant per slot 0..COUNT (plus EMP_COUNTER_COUNT).
    let mut slots: Vec<u64> = consts
        .iter()
        .filter(|c| c.c.starts_with("EMP_COUNTER_") && c.c != "EMP_COUNTER_COUNT")
        .map(|c| c.value)
        .collect();
    slots.sort();
    if slots != (0..counter::COUNT as u64).collect::<Vec<_>>() {
        errors.push(format!("EMP_COUNTER_*: slots {slots:?}, want 0..{}", counter::COUNT));
    }
    // Codes without a Rust decoder: distinct values.
    for p in ["EMP_ATTACH_OP_", "EMP_ADMIN_RESULT_", "EMP_COLL_ROUND_"] {
        let mut v: Vec<u64> = consts.iter().filter(|c| c.c.starts_with(p)).map(|c| c.value).collect();
        let n = v.len();
        v.sort();
        v.dedup();
        if v.len() != n {
            errors.push(format!("{p}*: two constants share a value"));
        }
    }

    assert!(errors.is_empty(), "{} problem(s):\n  {}", errors.len(), errors.join("\n  "));
}

/// The C header's layout and constants equal the Rust ones.
#[test]
fn c_header_matches_rust() {
    let cc = find_compiler("CC", &["cc", "gcc", "clang"]).unwrap_or_else(|e| {
        panic!(
            "no C compiler found ({e}): set CC or install cc/gcc/clang. The C header \
             include/emp_uapi.h cannot be checked against the Rust layout without one."
        )
    });
    let dir = TempDir::new("c-layout");
    let src = dir.0.join("layout.c");
    let exe = dir.0.join("layout");
    std::fs::write(&src, c_program()).unwrap();
    compile(&cc, &["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"], &src, &exe);
    let out = Command::new(&exe).output().unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    assert!(out.status.success(), "{} exited with {}", exe.display(), out.status);
    let stdout = String::from_utf8(out.stdout).unwrap();

    let mut got = BTreeMap::new();
    for line in stdout.lines() {
        let (k, v) = split_line(line).unwrap_or_else(|| panic!("unparsable output line {line:?}"));
        assert!(got.insert(k.clone(), v).is_none(), "duplicate output line for {k}");
    }

    let want = expected();
    let mut errors = Vec::new();
    for (k, w) in &want {
        match got.get(k) {
            None => errors.push(format!("{}: not printed by the C program", describe(k))),
            Some(g) if g != w => errors.push(format!("{}: C has `{g}`, Rust has `{w}`", describe(k))),
            Some(_) => {}
        }
    }
    for k in got.keys() {
        if !want.contains_key(k) {
            errors.push(format!("{}: printed by C but not expected", describe(k)));
        }
    }
    assert!(
        errors.is_empty(),
        "C header disagrees with Rust ({} problem(s)):\n  {}",
        errors.len(),
        errors.join("\n  ")
    );
    assert!(want.len() > 200, "suspiciously few checks: {}", want.len());
}

/// The header also compiles as C++ (for C++ users of libemp), with its
/// static assertions. Skipped with a message when no C++ compiler exists:
/// the C check above is the mandatory one.
#[test]
fn c_header_compiles_as_cxx() {
    let cxx = match find_compiler("CXX", &["c++", "g++", "clang++"]) {
        Ok(c) => c,
        Err(e) if std::env::var_os("CXX").is_none() => {
            eprintln!("no C++ compiler found ({e}); C++ compile check of emp_uapi.h not run");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let dir = TempDir::new("cxx");
    let src = dir.0.join("hdr.cpp");
    let exe = dir.0.join("hdr");
    std::fs::write(
        &src,
        "#include \"emp_uapi.h\"\n\
         static_assert(sizeof(emp_work_desc) == 128, \"work desc\");\n\
         int main() { emp_query q = {}; q.size = sizeof q; return EMP_IOC_QUERY == 0 ? 1 : (int)(q.size != 80); }\n",
    )
    .unwrap();
    compile(&cxx, &["-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic"], &src, &exe);
    let st = Command::new(&exe).status().unwrap();
    assert!(st.success(), "C++ check program failed: {st}");
}
