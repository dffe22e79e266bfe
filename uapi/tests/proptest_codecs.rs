//! Property tests of the codecs and validating decoders of `emp-uapi`.
//!
//! * Every `le_struct!` type: encode → decode round trips for arbitrary field
//!   values; the encoding equals the in-memory byte image (little-endian
//!   hosts); `decode` of arbitrary bytes never panics and is the inverse of
//!   `encode`; `encode` into a short buffer is refused.
//! * Validating decoders never panic on arbitrary input, and accept exactly
//!   what they document: `wire::Frame::parse` (DATA, ACK, NACK, COLL_DATA,
//!   ATOMIC_REQ, ATOMIC_RESP), `coll::CollHeader::parse`,
//!   `desc::WorkDesc::validate` (with the per-opcode operand rules of the
//!   collectives and atomics), `desc::MrEntry::validate`,
//!   `sram::GroupEntry::check`, `image::ImageHeader::parse`,
//!   `sram::Layout::from_header`, `sram::Layout::new`.
//! * Frames built with `wire::emit_data_headers` / `wire::emit_ack` /
//!   `wire::emit_atomic_req` / `wire::emit_atomic_resp` from arbitrary valid
//!   headers parse back to the same values, and every frame `parse` accepts
//!   re-emits to the same bytes.
//! * `GroupEntry::check` refuses each `GroupError` case (hand-built entries).
//! * `Layout::new` either refuses its parameters or yields areas that do not
//!   overlap and fit in `sram_size`.

use core::mem::size_of;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use emp_uapi::attach::AttachMsg;
use emp_uapi::coll::{
    reduce_tag, reduce_tag_parts, CollHeader, CollKind, Dtype, ReduceOp, RBCAST_MEMBERS_MAX, TREES_MAX, TREE_ROOT,
};
use emp_uapi::desc::*;
use emp_uapi::image::*;
use emp_uapi::ioctl::*;
use emp_uapi::sram::*;
use emp_uapi::wire::*;
use emp_uapi::{DecodeError, Le, ANY_NODE, ANY_PORT, PAGE_SIZE};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        // Failures print the minimal input; do not write regression files
        // into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Strategies constructing every le_struct from arbitrary field values
// ---------------------------------------------------------------------------

/// Nested pairs `(s1, (s2, (… , Just(()))))`: no tuple-arity limit.
macro_rules! nest_strategy {
    () => { Just(()) };
    ($s:expr $(, $rest:expr)*) => { ($s, nest_strategy!($($rest),*)) };
}
macro_rules! nest_pattern {
    () => { () };
    ($f:ident $(, $rest:ident)*) => { ($f, nest_pattern!($($rest),*)) };
}

/// `fn $name() -> impl Strategy<Value = $ty>` with one strategy per field.
macro_rules! arb_struct {
    ($name:ident -> $ty:ident { $($f:ident : $s:expr),* $(,)? }) => {
        fn $name() -> impl Strategy<Value = $ty> {
            nest_strategy!($($s),*).prop_map(|nest_pattern!($($f),*)| $ty { $($f),* })
        }
    };
}

arb_struct!(arb_frame_header -> FrameHeader {
    version: any::<u8>(),
    kind: any::<u8>(),
    dst_gen: any::<u16>(),
    src_node: any::<u16>(),
    dst_node: any::<u16>(),
    src_port: any::<u16>(),
    dst_port: any::<u16>(),
    src_gen: any::<u16>(),
    payload_len: any::<u16>(),
    msg_seq: any::<u32>(),
    tx_floor: any::<u32>(),
    frame_index: any::<u32>(),
    frame_count: any::<u32>(),
});
/// A message header as a sender builds it: immediate data only with `MSG_IMM`.
fn arb_msg_header() -> impl Strategy<Value = MsgHeader> {
    (any::<u64>(), any::<u64>(), proptest::option::of(any::<u32>()))
        .prop_map(|(tag, total_len, imm)| MsgHeader::new(tag, total_len, imm))
}
arb_struct!(arb_ack_body -> AckBody {
    group: any::<u32>(),
    missing_mask: any::<u32>(),
    rx_credits: any::<u16>(),
    reason: any::<u8>(),
    fc_level: any::<u8>(),
    rx_expected: any::<u32>(),
});
arb_struct!(arb_sge -> Sge { key: any::<u32>(), len: any::<u32>(), offset: any::<u64>() });
arb_struct!(arb_work_desc -> WorkDesc {
    wr_id: any::<u64>(),
    opcode: any::<u8>(),
    flags: any::<u8>(),
    num_sge: any::<u8>(),
    slot: any::<u8>(),
    node: any::<u16>(),
    port: any::<u16>(),
    tag: any::<u64>(),
    ignore: any::<u64>(),
    sge: proptest::array::uniform::<_, SGE_MAX>(arb_sge()),
});
arb_struct!(arb_cqe -> Cqe {
    wr_id: any::<u64>(),
    byte_len: any::<u32>(),
    status: any::<u8>(),
    opcode: any::<u8>(),
    reserved: any::<u8>(),
    flags: any::<u8>(),
    tag: any::<u64>(),
    src_node: any::<u16>(),
    src_port: any::<u16>(),
    msg_len: any::<u32>(),
    imm: any::<u32>(),
    reserved1: any::<u32>(),
});
arb_struct!(arb_phys_seg -> PhysSeg { addr: any::<u64>(), len: any::<u32>(), flags: any::<u32>() });
arb_struct!(arb_mr_entry -> MrEntry {
    key: any::<u32>(),
    port: any::<u16>(),
    access: any::<u8>(),
    format: any::<u8>(),
    length: any::<u64>(),
    indirect_addr: any::<u64>(),
    indirect_count: any::<u32>(),
    secret: any::<u32>(),
    segs: proptest::array::uniform::<_, MR_INLINE_SEGS>(arb_phys_seg()),
});
arb_struct!(arb_sram_header -> SramHeader {
    magic: any::<u64>(),
    layout_version: any::<u32>(),
    status: any::<u32>(),
    fail_reason: any::<u32>(),
    node_id: any::<u16>(),
    port_count: any::<u16>(),
    mtu: any::<u32>(),
    features: any::<u32>(),
    sram_size: any::<u32>(),
    heartbeat: any::<u32>(),
    admin_off: any::<u32>(),
    staging_off: any::<u32>(),
    staging_size: any::<u32>(),
    mr_off: any::<u32>(),
    mr_entries: any::<u32>(),
    route_off: any::<u32>(),
    route_entries: any::<u32>(),
    group_off: any::<u32>(),
    group_entries: any::<u32>(),
    ports_off: any::<u32>(),
    port_stride: any::<u32>(),
    send_entries: any::<u32>(),
    recv_entries: any::<u32>(),
    staged_len: any::<u32>(),
    counters: any::<[u64; counter::COUNT]>(),
});
arb_struct!(arb_admin_mailbox -> AdminMailbox {
    request_seq: any::<u32>(),
    op: any::<u32>(),
    done_seq: any::<u32>(),
    result: any::<u32>(),
    args: any::<[u64; 6]>(),
});
arb_struct!(arb_route_entry -> RouteEntry {
    valid: any::<u32>(),
    ipv4: any::<u32>(),
    udp_port: any::<u16>(),
    mac: any::<[u8; 6]>(),
    ip6: any::<[u8; 16]>(),
});
arb_struct!(arb_group_entry -> GroupEntry {
    group_id: any::<u32>(),
    epoch: any::<u32>(),
    member_count: any::<u16>(),
    my_rank: any::<u16>(),
    port: any::<u16>(),
    tree_count: any::<u8>(),
    flags: any::<u8>(),
    bounce_key: any::<u32>(),
    bounce_slot_size: any::<u32>(),
    bounce_offset: any::<u64>(),
    bounce_slots: any::<u16>(),
    reserved0: any::<u16>(),
    reserved1: any::<u32>(),
    tree_lambda: any::<[u8; 8]>(),
    members: any::<[u32; GROUP_INLINE_MAX]>(),
    parents: any::<[u8; 512]>(),
    // (Length inferred from the field.)
    reserved2: proptest::array::uniform(any::<u64>()),
});
arb_struct!(arb_coll_header -> CollHeader {
    group_id: any::<u32>(),
    epoch: any::<u32>(),
    instance: any::<u32>(),
    kind: any::<u8>(),
    round: any::<u8>(),
    tree: any::<u8>(),
    dtype: any::<u8>(),
    op: any::<u8>(),
    reserved: any::<u8>(),
    root: any::<u16>(),
    sender: any::<u16>(),
    reserved2: any::<u16>(),
    count: any::<u32>(),
    reserved3: any::<u32>(),
});
arb_struct!(arb_atomic_body -> AtomicBody {
    op: any::<u8>(),
    width: any::<u8>(),
    reserved: any::<u16>(),
    rkey: any::<u32>(),
    offset: any::<u64>(),
    operand: any::<u64>(),
    compare: any::<u64>(),
    secret: any::<u32>(),
    reserved2: any::<u32>(),
});
arb_struct!(arb_atomic_result -> AtomicResult {
    status: any::<u8>(),
    reserved: any::<[u8; 7]>(),
    old: any::<u64>(),
});
arb_struct!(arb_port_ctl -> PortCtl {
    send_prod: any::<u32>(),
    recv_prod: any::<u32>(),
    cq_cons: any::<u32>(),
    arm: any::<u32>(),
    host_pad: any::<[u32; 12]>(),
    send_cons: any::<u32>(),
    recv_cons: any::<u32>(),
    cq_prod: any::<u32>(),
    cq_overruns: any::<u32>(),
    nic_sleeping: any::<u32>(),
    nic_alive: any::<u32>(),
    remote_refused: any::<u32>(),
    remote_throttled: any::<u32>(),
    nic_pad: any::<[u32; 8]>(),
    state: any::<u32>(),
    gen: any::<u32>(),
    cq_key: any::<u32>(),
    cq_entries: any::<u32>(),
    cq_offset: any::<u64>(),
    cfg_pad: any::<[u64; 5]>(),
});
arb_struct!(arb_image_header -> ImageHeader {
    magic: any::<u64>(),
    header_version: any::<u32>(),
    abi: any::<u32>(),
    build_id: any::<[u8; 20]>(),
    cpu_plan: any::<u32>(),
    payload_len: any::<u64>(),
    sha256: any::<[u8; 32]>(),
    key_id: any::<[u8; 8]>(),
    reserved: any::<[u64; 8]>(),
    signature: any::<[u8; 64]>(),
    reserved_tail: any::<[u64; 5]>(),
});
arb_struct!(arb_emp_query -> EmpQuery {
    size: any::<u32>(),
    port: any::<u16>(),
    node_id: any::<u16>(),
    mtu: any::<u32>(),
    features: any::<u32>(),
    window_size: any::<u64>(),
    send_entries: any::<u32>(),
    recv_entries: any::<u32>(),
    msg_max: any::<u64>(),
    port_gen: any::<u32>(),
    port_count: any::<u16>(),
    reserved0: any::<u16>(),
    pinned_pages: any::<u64>(),
    group_entries: any::<u32>(),
    groups_in_use: any::<u32>(),
    reserved: any::<[u64; 2]>(),
});
arb_struct!(arb_emp_reg_mr -> EmpRegMr {
    size: any::<u32>(),
    access: any::<u32>(),
    addr: any::<u64>(),
    length: any::<u64>(),
    key: any::<u32>(),
    secret: any::<u32>(),
    reserved: any::<[u64; 2]>(),
});
arb_struct!(arb_emp_dereg_mr -> EmpDeregMr { size: any::<u32>(), key: any::<u32>() });
arb_struct!(arb_emp_set_eventfd -> EmpSetEventfd {
    size: any::<u32>(),
    fd: any::<i32>(),
    signal: any::<u32>(),
    reserved: any::<u32>(),
});
arb_struct!(arb_emp_arm -> EmpArm { size: any::<u32>(), events: any::<u32>() });
arb_struct!(arb_emp_start -> EmpStart { size: any::<u32>(), cq_entries: any::<u32>(), cq_key: any::<u32>(), reserved: any::<u32>(), cq_offset: any::<u64>() });
arb_struct!(arb_emp_group_set -> EmpGroupSet { size: any::<u32>(), slot: any::<u32>(), entry: any::<u64>(), reserved: any::<[u64; 2]>() });
arb_struct!(arb_emp_group_clear -> EmpGroupClear { size: any::<u32>(), slot: any::<u32>() });
arb_struct!(arb_emp_port_ctx -> EmpPortCtx {
    size: any::<u32>(), op: any::<u32>(), key: any::<u32>(), reserved: any::<u32>(),
    offset: any::<u64>(), len: any::<u64>(), result: any::<u64>()
});
arb_struct!(arb_emp_gang -> EmpGang {
    size: any::<u32>(), action: any::<u32>(), pid: any::<i32>(), reserved: any::<u32>(),
    ports: any::<u64>(), stable: any::<u64>()
});
arb_struct!(arb_attach_msg -> AttachMsg {
    version: any::<u32>(),
    op: any::<u32>(),
    status: any::<i32>(),
    reserved: any::<u32>(),
    arg: any::<[u64; 22]>(),
});

// ---------------------------------------------------------------------------
// Generic codec properties
// ---------------------------------------------------------------------------

/// The in-memory bytes of a value. Sound for `le_struct!` types: they are
/// `repr(C)` with no padding (checked at compile time by the macro), so every
/// byte is initialised.
fn memory_image<T: Le>(v: &T) -> Vec<u8> {
    assert_eq!(size_of::<T>(), T::SIZE, "le_struct without padding");
    // SAFETY: `v` is a valid reference to `size_of::<T>()` initialised bytes
    // (no padding, see above); we only read them.
    unsafe { core::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }.to_vec()
}

fn check_round_trip<T: Le + PartialEq + core::fmt::Debug>(v: &T) -> Result<(), TestCaseError> {
    let mut buf = vec![0xA5u8; T::SIZE + 8];
    v.encode(&mut buf).map_err(|e| TestCaseError::fail(format!("encode: {e}")))?;
    prop_assert!(buf[T::SIZE..].iter().all(|&b| b == 0xA5), "encode wrote past SIZE");
    let back = T::decode(&buf).map_err(|e| TestCaseError::fail(format!("decode: {e}")))?;
    prop_assert_eq!(&back, v);
    // Exact-size buffer works too.
    let mut exact = vec![0u8; T::SIZE];
    v.encode(&mut exact).unwrap();
    prop_assert_eq!(&exact[..], &buf[..T::SIZE]);
    prop_assert_eq!(&T::decode(&exact).unwrap(), v);
    // The encoding is the in-memory layout on a little-endian host (the
    // crate's promise: no transmute needed, C sees the same bytes).
    if cfg!(target_endian = "little") {
        prop_assert_eq!(memory_image(v), exact);
    }
    Ok(())
}

fn check_decode_any<T: Le + PartialEq + core::fmt::Debug>(bytes: &[u8]) -> Result<(), TestCaseError> {
    match T::decode(bytes) {
        Ok(v) => {
            prop_assert!(bytes.len() >= T::SIZE);
            // Every byte pattern is a value and re-encodes to itself.
            let mut out = vec![0u8; T::SIZE];
            v.encode(&mut out).unwrap();
            prop_assert_eq!(&out[..], &bytes[..T::SIZE]);
        }
        Err(e) => {
            prop_assert!(bytes.len() < T::SIZE);
            prop_assert_eq!(e, DecodeError::Truncated);
        }
    }
    Ok(())
}

fn check_encode_short<T: Le>(v: &T, n: usize) -> Result<(), TestCaseError> {
    let mut buf = vec![0x5Au8; n];
    prop_assert_eq!(v.encode(&mut buf), Err(DecodeError::Truncated));
    prop_assert!(buf.iter().all(|&b| b == 0x5A), "a refused encode wrote bytes");
    Ok(())
}

macro_rules! codec_props {
    ($($m:ident: $ty:ty = $strategy:expr;)*) => {$(
        mod $m {
            use super::*;
            proptest! {
                #![proptest_config(config())]
                #[test]
                fn round_trip(v in $strategy) {
                    check_round_trip::<$ty>(&v)?;
                }
                // Lengths on both sides of SIZE (GroupEntry is 1 KiB).
                #[test]
                fn decode_arbitrary_bytes(bytes in vec(any::<u8>(), 0..(2 * <$ty as Le>::SIZE + 16))) {
                    check_decode_any::<$ty>(&bytes)?;
                }
                #[test]
                fn encode_short_buffer_refused(v in $strategy, n in 0..<$ty as Le>::SIZE) {
                    check_encode_short::<$ty>(&v, n)?;
                }
            }
        }
    )*};
}

codec_props! {
    frame_header: FrameHeader = arb_frame_header();
    msg_header: MsgHeader = arb_msg_header();
    ack_body: AckBody = arb_ack_body();
    atomic_body: AtomicBody = arb_atomic_body();
    atomic_result: AtomicResult = arb_atomic_result();
    coll_header: CollHeader = arb_coll_header();
    sge: Sge = arb_sge();
    work_desc: WorkDesc = arb_work_desc();
    cqe: Cqe = arb_cqe();
    phys_seg: PhysSeg = arb_phys_seg();
    mr_entry: MrEntry = arb_mr_entry();
    sram_header: SramHeader = arb_sram_header();
    admin_mailbox: AdminMailbox = arb_admin_mailbox();
    route_entry: RouteEntry = arb_route_entry();
    group_entry: GroupEntry = arb_group_entry();
    port_ctl: PortCtl = arb_port_ctl();
    image_header: ImageHeader = arb_image_header();
    emp_query: EmpQuery = arb_emp_query();
    emp_reg_mr: EmpRegMr = arb_emp_reg_mr();
    emp_dereg_mr: EmpDeregMr = arb_emp_dereg_mr();
    emp_set_eventfd: EmpSetEventfd = arb_emp_set_eventfd();
    emp_arm: EmpArm = arb_emp_arm();
    emp_start: EmpStart = arb_emp_start();
    emp_group_set: EmpGroupSet = arb_emp_group_set();
    emp_group_clear: EmpGroupClear = arb_emp_group_clear();
    emp_port_ctx: EmpPortCtx = arb_emp_port_ctx();
    emp_gang: EmpGang = arb_emp_gang();
    attach_msg: AttachMsg = arb_attach_msg();
}

/// `Default` is the all-zero encoding for every type.
#[test]
fn default_is_all_zero() {
    fn zero<T: Le + Default + PartialEq + core::fmt::Debug>() {
        let mut b = vec![0xFFu8; T::SIZE];
        T::default().encode(&mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0), "{}", core::any::type_name::<T>());
        assert_eq!(T::decode(&vec![0u8; T::SIZE]).unwrap(), T::default());
    }
    zero::<FrameHeader>();
    zero::<MsgHeader>();
    zero::<AckBody>();
    zero::<AtomicBody>();
    zero::<AtomicResult>();
    zero::<CollHeader>();
    zero::<Sge>();
    zero::<WorkDesc>();
    zero::<Cqe>();
    zero::<PhysSeg>();
    zero::<MrEntry>();
    zero::<SramHeader>();
    zero::<AdminMailbox>();
    zero::<RouteEntry>();
    zero::<GroupEntry>();
    zero::<PortCtl>();
    zero::<ImageHeader>();
    zero::<EmpQuery>();
    zero::<EmpRegMr>();
    zero::<EmpDeregMr>();
    zero::<EmpSetEventfd>();
    zero::<EmpArm>();
    zero::<EmpStart>();
    zero::<EmpGroupSet>();
    zero::<EmpGroupClear>();
    zero::<EmpPortCtx>();
    zero::<EmpGang>();
    zero::<AttachMsg>();
}

// ---------------------------------------------------------------------------
// Wire frames
// ---------------------------------------------------------------------------

/// Re-emits a parsed frame with the crate's own emitters.
fn re_emit(f: &Frame<'_>) -> Vec<u8> {
    match *f {
        Frame::Data { hdr, msg, payload } => {
            let mut out = vec![0u8; data_header_len(hdr.frame_index) + payload.len()];
            let at = emit_data_headers(&hdr, msg.as_ref(), &mut out).unwrap();
            out[at..].copy_from_slice(payload);
            out
        }
        Frame::Ack { hdr, body } | Frame::Nack { hdr, body, .. } => {
            let mut out = vec![0u8; FrameHeader::SIZE + AckBody::SIZE];
            let n = emit_ack(&hdr, &body, &mut out).unwrap();
            out.truncate(n);
            out
        }
        Frame::AtomicReq { hdr, body } => build_atomic_req(&hdr, &body),
        Frame::AtomicResp { hdr, result } => build_atomic_resp(&hdr, &result),
        Frame::Rbcast { hdr, body, data } => {
            let mut out = vec![0u8; FrameHeader::SIZE + RbcastHeader::SIZE + data.len()];
            let n = emit_rbcast(&hdr, &body, data, &mut out).unwrap();
            out.truncate(n);
            out
        }
    }
}

/// What a successful parse promises about its result.
fn check_parsed(bytes: &[u8], f: &Frame<'_>) -> Result<(), TestCaseError> {
    let hdr = *f.header();
    prop_assert_eq!(hdr.version, WIRE_VERSION);
    prop_assert!(bytes.len() <= MTU_MAX as usize);
    match *f {
        Frame::Data { hdr, msg, payload } => {
            prop_assert!(
                hdr.kind == FrameKind::Data as u8 || hdr.kind == FrameKind::CollData as u8,
                "Frame::Data of kind {}",
                hdr.kind
            );
            prop_assert!(hdr.frame_index < hdr.frame_count);
            prop_assert_eq!(msg.is_some(), hdr.frame_index == 0);
            prop_assert_eq!(payload.len(), hdr.payload_len as usize);
            if let Some(m) = msg {
                prop_assert!(m.total_len >= payload.len() as u64);
                prop_assert!(hdr.frame_count as u64 <= frames_for(m.total_len, MTU_MIN));
                if hdr.kind == FrameKind::CollData as u8 {
                    // A collective message leads with a valid CollHeader.
                    prop_assert!(m.total_len >= CollHeader::SIZE as u64);
                    let ch = CollHeader::parse(payload);
                    prop_assert!(ch.is_ok(), "COLL_DATA frame 0 accepted with header {:?}", ch);
                    check_coll_header_accepted(&ch.unwrap())?;
                }
            }
        }
        Frame::AtomicReq { hdr, body } => {
            prop_assert_eq!(hdr.kind, FrameKind::AtomicReq as u8);
            prop_assert_eq!(hdr.payload_len, 0);
            prop_assert_eq!(bytes.len(), FrameHeader::SIZE + AtomicBody::SIZE);
            prop_assert!(matches!(body.op, atomic_op::FETCH_ADD | atomic_op::CMP_SWAP | atomic_op::SWAP));
            prop_assert!(body.width == 4 || body.width == 8);
            prop_assert_eq!(body.reserved, 0);
            if body.op != atomic_op::CMP_SWAP {
                prop_assert_eq!(body.compare, 0);
            }
        }
        Frame::AtomicResp { hdr, result } => {
            prop_assert_eq!(hdr.kind, FrameKind::AtomicResp as u8);
            prop_assert_eq!(hdr.payload_len, 0);
            prop_assert_eq!(bytes.len(), FrameHeader::SIZE + AtomicResult::SIZE);
            prop_assert_eq!(result.reserved, [0u8; 7]);
        }
        Frame::Ack { hdr, body } => {
            prop_assert_eq!(hdr.kind, FrameKind::Ack as u8);
            prop_assert_eq!(hdr.payload_len, 0);
            prop_assert_eq!(body.reason, 0);
        }
        Frame::Nack { hdr, body, reason } => {
            prop_assert_eq!(hdr.kind, FrameKind::Nack as u8);
            prop_assert_eq!(hdr.payload_len, 0);
            prop_assert_eq!(body.reason, reason as u8);
        }
        Frame::Rbcast { hdr, body, data } => {
            prop_assert_eq!(hdr.kind, FrameKind::Rbcast as u8);
            prop_assert_eq!((hdr.payload_len, body.len as usize), (data.len() as u16, data.len()));
            prop_assert!(matches!(
                body.kind,
                rbcast_kind::DATA | rbcast_kind::ACK | rbcast_kind::POLL | rbcast_kind::NAK | rbcast_kind::ANNOUNCE
            ));
            prop_assert_eq!(body.flags & rbcast_flag::P2P, 0);
            if body.flags & rbcast_flag::REPAIR != 0 {
                prop_assert_eq!(body.kind, rbcast_kind::DATA);
            }
            let ranks = emp_uapi::coll::GROUP_MEMBERS_MAX as u16;
            prop_assert!(body.root < ranks && body.sender < ranks && body.ack_root < ranks);
        }
    }
    // Everything parse accepts is exactly what the emitters produce.
    prop_assert_eq!(re_emit(f), bytes.to_vec());
    Ok(())
}

fn parse_checked(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(f) = Frame::parse(bytes) {
        check_parsed(bytes, &f)?;
    }
    Ok(())
}

/// Payload bytes derived from a seed (cheaper than generating 9000 bytes).
fn payload_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A valid DATA frame: header, message header (frame 0), payload.
fn valid_data_frame() -> impl Strategy<Value = (FrameHeader, Option<MsgHeader>, Vec<u8>)> {
    valid_msg_frame(FrameKind::Data)
}

/// A valid COLL_DATA frame: as DATA, and frame 0's payload starts with a
/// valid `CollHeader` (so the message is at least `CollHeader::SIZE` long).
fn valid_coll_frame() -> impl Strategy<Value = (FrameHeader, Option<MsgHeader>, Vec<u8>)> {
    valid_msg_frame(FrameKind::CollData)
}

fn valid_msg_frame(kind: FrameKind) -> impl Strategy<Value = (FrameHeader, Option<MsgHeader>, Vec<u8>)> {
    let coll = kind == FrameKind::CollData;
    (
        arb_frame_header(),
        arb_msg_header(),
        prop_oneof![0u64..20_000, 0u64..(1 << 32), any::<u64>()],
        any::<u32>(),
        prop_oneof![Just(true), any::<bool>()],
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        valid_coll_header(),
    )
        .prop_map(move |(mut hdr, mut msg, total_len, count_seed, first, index_seed, len_seed, data_seed, ch)| {
            let min_len = if coll { CollHeader::SIZE as u64 } else { 0 };
            msg.total_len = total_len.max(min_len);
            let max_frames = frames_for(msg.total_len, MTU_MIN).min(u32::MAX as u64) as u32;
            hdr.version = WIRE_VERSION;
            hdr.kind = kind as u8;
            hdr.frame_count = 1 + count_seed % max_frames;
            hdr.frame_index = if first { 0 } else { index_seed % hdr.frame_count };
            let head = data_header_len(hdr.frame_index);
            let mut max_payload = MTU_MAX as u64 - head as u64;
            let mut min_payload = 0;
            if hdr.frame_index == 0 {
                max_payload = max_payload.min(msg.total_len);
                min_payload = min_len;
            }
            hdr.payload_len = (min_payload + len_seed as u64 % (max_payload - min_payload + 1)) as u16;
            let mut payload = payload_bytes(hdr.payload_len as usize, data_seed);
            if coll && hdr.frame_index == 0 {
                ch.encode(&mut payload).unwrap();
            }
            (hdr, (hdr.frame_index == 0).then_some(msg), payload)
        })
}

/// A valid ACK or NACK frame.
fn valid_ack_frame() -> impl Strategy<Value = (FrameHeader, AckBody)> {
    (arb_frame_header(), arb_ack_body(), any::<bool>(), 1u8..=5).prop_map(|(mut hdr, mut body, nack, reason)| {
        hdr.version = WIRE_VERSION;
        hdr.payload_len = 0;
        if nack {
            hdr.kind = FrameKind::Nack as u8;
            body.reason = reason;
        } else {
            hdr.kind = FrameKind::Ack as u8;
            body.reason = 0;
            body.missing_mask = 0;
        }
        (hdr, body)
    })
}

fn build_data(hdr: &FrameHeader, msg: Option<&MsgHeader>, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; data_header_len(hdr.frame_index) + payload.len()];
    let at = emit_data_headers(hdr, msg, &mut out).unwrap();
    assert_eq!(at, data_header_len(hdr.frame_index));
    out[at..].copy_from_slice(payload);
    out
}

fn build_ack(hdr: &FrameHeader, body: &AckBody) -> Vec<u8> {
    let mut out = vec![0u8; 64];
    let n = emit_ack(hdr, body, &mut out).unwrap();
    out.truncate(n);
    out
}

fn build_atomic_req(hdr: &FrameHeader, body: &AtomicBody) -> Vec<u8> {
    let mut out = vec![0u8; 80];
    let n = emit_atomic_req(hdr, body, &mut out).unwrap();
    assert_eq!(n, FrameHeader::SIZE + AtomicBody::SIZE);
    out.truncate(n);
    out
}

fn build_atomic_resp(hdr: &FrameHeader, result: &AtomicResult) -> Vec<u8> {
    let mut out = vec![0u8; 80];
    let n = emit_atomic_resp(hdr, result, &mut out).unwrap();
    assert_eq!(n, FrameHeader::SIZE + AtomicResult::SIZE);
    out.truncate(n);
    out
}

/// A header for a frame of `kind` with no payload (ACK-like kinds).
fn bodied_header(mut hdr: FrameHeader, kind: FrameKind) -> FrameHeader {
    hdr.version = WIRE_VERSION;
    hdr.kind = kind as u8;
    hdr.payload_len = 0;
    hdr
}

/// A body `parse` accepts in an ATOMIC_REQ frame.
fn valid_atomic_body() -> impl Strategy<Value = AtomicBody> {
    (arb_atomic_body(), 1u8..=3, prop_oneof![Just(4u8), Just(8u8)]).prop_map(|(mut b, op, width)| {
        b.op = op;
        b.width = width;
        b.reserved = 0;
        b.reserved2 = 0;
        if op != atomic_op::CMP_SWAP {
            b.compare = 0;
        }
        b
    })
}

/// A valid ATOMIC_REQ frame.
fn valid_atomic_req_frame() -> impl Strategy<Value = (FrameHeader, AtomicBody)> {
    (arb_frame_header(), valid_atomic_body()).prop_map(|(h, b)| (bodied_header(h, FrameKind::AtomicReq), b))
}

/// A valid ATOMIC_RESP frame.
fn valid_atomic_resp_frame() -> impl Strategy<Value = (FrameHeader, AtomicResult)> {
    (arb_frame_header(), arb_atomic_result()).prop_map(|(h, mut r)| {
        r.reserved = [0; 7];
        (bodied_header(h, FrameKind::AtomicResp), r)
    })
}

/// What `parse` must answer for an ATOMIC_REQ frame (right version and
/// kind, at most MTU_MAX bytes), from the frame format's documentation.
fn atomic_req_spec(bytes: &[u8]) -> Result<AtomicBody, DecodeError> {
    let hdr = FrameHeader::decode(bytes).unwrap();
    if hdr.payload_len != 0 || bytes.len() != FrameHeader::SIZE + AtomicBody::SIZE {
        return Err(DecodeError::BadLength);
    }
    let b = AtomicBody::decode(&bytes[FrameHeader::SIZE..]).unwrap();
    if !(1..=3).contains(&b.op) {
        return Err(DecodeError::BadKind);
    }
    if b.reserved != 0 || b.reserved2 != 0 || (b.op != atomic_op::CMP_SWAP && b.compare != 0) {
        return Err(DecodeError::ReservedNotZero);
    }
    if b.width != 4 && b.width != 8 {
        return Err(DecodeError::BadLength);
    }
    Ok(b)
}

/// What `parse` must answer for an ATOMIC_RESP frame.
fn atomic_resp_spec(bytes: &[u8]) -> Result<AtomicResult, DecodeError> {
    let hdr = FrameHeader::decode(bytes).unwrap();
    if hdr.payload_len != 0 || bytes.len() != FrameHeader::SIZE + AtomicResult::SIZE {
        return Err(DecodeError::BadLength);
    }
    let r = AtomicResult::decode(&bytes[FrameHeader::SIZE..]).unwrap();
    if r.reserved != [0; 7] {
        return Err(DecodeError::ReservedNotZero);
    }
    Ok(r)
}

/// Atomic frames near the validity boundary: header and body fields mostly
/// right, the length mostly right.
fn plausible_atomic_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        arb_frame_header(),
        any::<bool>(),
        arb_atomic_body(),
        prop_oneof![6 => 1u8..=3, 1 => any::<u8>()],
        prop_oneof![3 => Just(4u8), 3 => Just(8u8), 1 => any::<u8>()],
        prop_oneof![6 => Just(true), 1 => Just(false)],
        prop_oneof![6 => Just(true), 1 => Just(false)],
        prop_oneof![6 => Just(0u16), 1 => any::<u16>()],
        prop_oneof![8 => Just(0isize), 1 => -8isize..8],
    )
        .prop_map(|(h, req, mut b, op, width, clear_reserved, clear_compare, payload_len, dlen)| {
            let kind = if req { FrameKind::AtomicReq } else { FrameKind::AtomicResp };
            let mut hdr = bodied_header(h, kind);
            hdr.payload_len = payload_len;
            b.op = op;
            b.width = width;
            if clear_reserved {
                b.reserved = 0;
                b.reserved2 = 0;
            }
            if clear_compare && op != atomic_op::CMP_SWAP {
                b.compare = 0;
            }
            let mut bytes = vec![0u8; FrameHeader::SIZE + AtomicBody::SIZE];
            hdr.encode(&mut bytes).unwrap();
            if req {
                b.encode(&mut bytes[FrameHeader::SIZE..]).unwrap();
            } else {
                // A result from the same random bytes: status, reserved, old.
                let mut r = AtomicResult::decode(&bytes[FrameHeader::SIZE..]).unwrap();
                r.status = b.op;
                r.old = b.operand;
                if clear_reserved {
                    r.reserved = [0; 7];
                } else {
                    r.reserved = [b.width, 0, 0, 0, 0, 0, (b.rkey | 1) as u8];
                }
                bytes.truncate(FrameHeader::SIZE + AtomicResult::SIZE);
                r.encode(&mut bytes[FrameHeader::SIZE..]).unwrap();
            }
            let len = (bytes.len() as isize + dlen).max(FrameHeader::SIZE as isize) as usize;
            bytes.resize(len, 0xEE);
            bytes
        })
}

/// A valid frame's bytes with one mutation: a byte changed, bytes cut off,
/// or bytes appended.
fn mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    let base = prop_oneof![
        valid_data_frame().prop_map(|(h, m, p)| build_data(&h, m.as_ref(), &p)),
        valid_coll_frame().prop_map(|(h, m, p)| build_data(&h, m.as_ref(), &p)),
        valid_ack_frame().prop_map(|(h, b)| build_ack(&h, &b)),
        valid_atomic_req_frame().prop_map(|(h, b)| build_atomic_req(&h, &b)),
        valid_atomic_resp_frame().prop_map(|(h, r)| build_atomic_resp(&h, &r)),
    ];
    (base, 0u8..4, any::<usize>(), any::<u8>(), vec(any::<u8>(), 1..40)).prop_map(|(mut b, how, at, val, extra)| {
        match how {
            0 => {} // unmodified
            1 => {
                let i = at % b.len();
                b[i] = if b[i] == val { val.wrapping_add(1) } else { val };
            }
            2 => b.truncate(at % b.len()),
            _ => b.extend_from_slice(&extra),
        }
        b
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn frame_parse_arbitrary_bytes_never_panics(bytes in vec(any::<u8>(), 0..600)) {
        parse_checked(&bytes)?;
    }

    /// Arbitrary bytes behind a plausible header (right version and kind),
    /// so the checks past the first ones are reached too.
    #[test]
    fn frame_parse_plausible_bytes_never_panics(
        hdr in arb_frame_header(),
        kind in 0u8..8,
        rest in prop_oneof![vec(any::<u8>(), 0..64), vec(any::<u8>(), 0..9100)],
    ) {
        let mut hdr = hdr;
        hdr.version = WIRE_VERSION;
        hdr.kind = kind;
        let mut bytes = vec![0u8; FrameHeader::SIZE];
        hdr.encode(&mut bytes).unwrap();
        bytes.extend_from_slice(&rest);
        parse_checked(&bytes)?;
    }

    #[test]
    fn frame_parse_mutated_frames_never_panics(bytes in mutated_frame()) {
        parse_checked(&bytes)?;
    }

    #[test]
    fn data_frame_round_trips((hdr, msg, payload) in valid_data_frame()) {
        let bytes = build_data(&hdr, msg.as_ref(), &payload);
        let parsed = Frame::parse(&bytes);
        prop_assert_eq!(parsed, Ok(Frame::Data { hdr, msg, payload: &payload[..] }));
        check_parsed(&bytes, &parsed.unwrap())?;
    }

    #[test]
    fn data_frame_emit_refuses_short_buffer((hdr, msg, payload) in valid_data_frame(), cut in 1usize..64) {
        let need = data_header_len(hdr.frame_index) + payload.len();
        let mut out = vec![0u8; need.saturating_sub(cut)];
        prop_assert_eq!(emit_data_headers(&hdr, msg.as_ref(), &mut out), Err(DecodeError::Truncated));
    }

    #[test]
    fn ack_frame_round_trips((hdr, body) in valid_ack_frame()) {
        let bytes = build_ack(&hdr, &body);
        prop_assert_eq!(bytes.len(), FrameHeader::SIZE + AckBody::SIZE);
        let parsed = Frame::parse(&bytes);
        let want = if hdr.kind == FrameKind::Ack as u8 {
            Frame::Ack { hdr, body }
        } else {
            Frame::Nack { hdr, body, reason: NackReason::from_u8(body.reason).unwrap() }
        };
        prop_assert_eq!(parsed, Ok(want));
        check_parsed(&bytes, &parsed.unwrap())?;
        let mut short = vec![0u8; bytes.len() - 1];
        prop_assert_eq!(emit_ack(&hdr, &body, &mut short), Err(DecodeError::Truncated));
    }

    #[test]
    fn coll_frame_round_trips((hdr, msg, payload) in valid_coll_frame()) {
        let bytes = build_data(&hdr, msg.as_ref(), &payload);
        let parsed = Frame::parse(&bytes);
        prop_assert_eq!(parsed, Ok(Frame::Data { hdr, msg, payload: &payload[..] }));
        check_parsed(&bytes, &parsed.unwrap())?;
    }

    /// Frame 0 of a COLL_DATA message with an arbitrary (often invalid)
    /// collective header: `parse` answers exactly what `CollHeader::parse`
    /// answers (everything else about the frame is valid). Frames > 0 carry
    /// no header and are not looked into.
    #[test]
    fn coll_frame_header_is_validated(
        (hdr, msg, payload) in valid_coll_frame(),
        ch in prop_oneof![arb_coll_header(), plausible_coll_header()],
    ) {
        let mut payload = payload;
        ch.encode(&mut payload).unwrap_or(()); // frames > 0 may be shorter
        let bytes = build_data(&hdr, msg.as_ref(), &payload);
        let parsed = Frame::parse(&bytes);
        if hdr.frame_index == 0 {
            prop_assert_eq!(parsed.map(|_| ()), coll_header_spec(&payload).map(|_| ()));
        } else {
            prop_assert_eq!(parsed, Ok(Frame::Data { hdr, msg, payload: &payload[..] }));
        }
        if let Ok(f) = parsed {
            check_parsed(&bytes, &f)?;
        }
    }

    /// The same bytes as DATA are not looked into: any payload goes.
    #[test]
    fn data_frame_payload_is_not_a_coll_header((hdr, msg, payload) in valid_coll_frame(), junk in any::<[u8; 24]>()) {
        let mut hdr = hdr;
        hdr.kind = FrameKind::Data as u8;
        let mut payload = payload;
        let n = payload.len().min(24);
        payload[..n].copy_from_slice(&junk[..n]);
        let bytes = build_data(&hdr, msg.as_ref(), &payload);
        prop_assert_eq!(Frame::parse(&bytes), Ok(Frame::Data { hdr, msg, payload: &payload[..] }));
    }

    #[test]
    fn atomic_req_frame_round_trips((hdr, body) in valid_atomic_req_frame()) {
        let bytes = build_atomic_req(&hdr, &body);
        let parsed = Frame::parse(&bytes);
        prop_assert_eq!(parsed, Ok(Frame::AtomicReq { hdr, body }));
        check_parsed(&bytes, &parsed.unwrap())?;
        // One byte short or long: refused.
        prop_assert_eq!(Frame::parse(&bytes[..bytes.len() - 1]), Err(DecodeError::BadLength));
        let mut long = bytes.clone();
        long.push(0);
        prop_assert_eq!(Frame::parse(&long), Err(DecodeError::BadLength));
    }

    #[test]
    fn atomic_resp_frame_round_trips((hdr, result) in valid_atomic_resp_frame()) {
        let bytes = build_atomic_resp(&hdr, &result);
        let parsed = Frame::parse(&bytes);
        prop_assert_eq!(parsed, Ok(Frame::AtomicResp { hdr, result }));
        check_parsed(&bytes, &parsed.unwrap())?;
        prop_assert_eq!(Frame::parse(&bytes[..bytes.len() - 1]), Err(DecodeError::BadLength));
    }

    #[test]
    fn atomic_emit_refuses_short_buffer(
        (hdr, body) in valid_atomic_req_frame(),
        (rhdr, result) in valid_atomic_resp_frame(),
        n in 0usize..FrameHeader::SIZE,
    ) {
        let mut out = vec![0u8; n];
        prop_assert_eq!(emit_atomic_req(&hdr, &body, &mut out), Err(DecodeError::Truncated));
        prop_assert_eq!(emit_atomic_resp(&rhdr, &result, &mut out), Err(DecodeError::Truncated));
        let mut out = vec![0u8; FrameHeader::SIZE + n % AtomicResult::SIZE];
        prop_assert_eq!(emit_atomic_req(&hdr, &body, &mut out), Err(DecodeError::Truncated));
        prop_assert_eq!(emit_atomic_resp(&rhdr, &result, &mut out), Err(DecodeError::Truncated));
    }

    /// Atomic frames near the boundary: `parse` answers what the format
    /// documents.
    #[test]
    fn atomic_frame_parse_plausible(bytes in plausible_atomic_frame()) {
        let kind = bytes[1];
        let got = Frame::parse(&bytes);
        if kind == FrameKind::AtomicReq as u8 {
            let want = atomic_req_spec(&bytes);
            prop_assert_eq!(got, want.map(|body| Frame::AtomicReq { hdr: FrameHeader::decode(&bytes).unwrap(), body }));
        } else {
            let want = atomic_resp_spec(&bytes);
            prop_assert_eq!(got, want.map(|result| Frame::AtomicResp { hdr: FrameHeader::decode(&bytes).unwrap(), result }));
        }
        parse_checked(&bytes)?;
    }

    /// A DATA frame whose length disagrees with `payload_len` is refused.
    #[test]
    fn data_frame_with_wrong_length_is_refused(
        (hdr, msg, payload) in prop_oneof![valid_data_frame(), valid_coll_frame()],
        extra in 1usize..16,
        shorter in any::<bool>(),
    ) {
        let mut bytes = build_data(&hdr, msg.as_ref(), &payload);
        if shorter {
            prop_assume!(payload.len() >= extra);
            bytes.truncate(bytes.len() - extra);
        } else {
            bytes.extend(core::iter::repeat_n(0u8, extra));
        }
        prop_assert!(Frame::parse(&bytes).is_err());
    }
}

// ---------------------------------------------------------------------------
// Descriptors and MR entries
// ---------------------------------------------------------------------------

/// Work descriptors near the validity boundary: each rule holds with high
/// probability, so accepted descriptors of both opcodes are common.
fn plausible_work_desc() -> impl Strategy<Value = WorkDesc> {
    (
        arb_work_desc(),
        prop_oneof![8 => 1u8..=2, 1 => Just(0u8), 1 => any::<u8>()],
        prop_oneof![4 => Just(0u8), 4 => Just(WD_SIGNALED), 1 => any::<u8>()],
        prop_oneof![8 => 0u8..=(SGE_MAX as u8), 1 => any::<u8>()],
        prop_oneof![8 => Just(0u8), 1 => any::<u8>()],
        prop_oneof![1 => Just(ANY_NODE), 6 => 0u16..4],
        prop_oneof![1 => Just(ANY_PORT), 6 => 0u16..4],
        prop_oneof![1 => Just(0u64), 1 => any::<u64>()],
        prop_oneof![8 => Just(true), 1 => Just(false)],
        prop_oneof![8 => Just(true), 1 => Just(false)],
    )
        .prop_map(|(mut d, opcode, flags, num_sge, slot, node, port, ignore, clean_tail, small_offsets)| {
            d.opcode = opcode;
            d.flags = flags;
            d.num_sge = num_sge;
            d.slot = slot;
            d.node = node;
            d.port = port;
            d.ignore = if opcode == Opcode::Send as u8 && ignore != 0 && clean_tail { 0 } else { ignore };
            if clean_tail {
                for s in d.sge.iter_mut().skip(num_sge as usize) {
                    *s = Sge::default();
                }
            }
            if small_offsets {
                for s in d.sge.iter_mut().take(num_sge as usize) {
                    s.offset >>= 1;
                }
            }
            d
        })
}

/// xorshift64 step (cheap derived randomness inside `prop_map`).
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Fills the operand fields of `d` (opcode already set) so that they obey
/// `Opcode`'s documented rules; other fields get valid values too.
fn shape_operands(d: &mut WorkDesc, seed: u64) {
    let mut x = seed | 1;
    let op = Opcode::from_u8(d.opcode).unwrap();
    d.slot = 0;
    d.flags &= WD_FLAGS_ALL & !WD_IMM & !WD_PERSIST; // a remote write's own choice, below
    if op != Opcode::Probe {
        d.flags &= !WD_CLAIM; // a probe's own choice
    }
    let members = GROUP_MEMBERS_MAX as u64;
    let trees = TREES_MAX as u64;
    let mut n = (d.num_sge as usize).min(SGE_MAX);
    for s in d.sge.iter_mut() {
        s.offset >>= 1; // no offset + len overflow
    }
    match op {
        Opcode::Send | Opcode::Recv => {
            if op == Opcode::Send {
                d.ignore = 0;
                d.node %= ANY_NODE;
                d.port %= ANY_PORT;
            }
        }
        Opcode::MultiSend => {
            d.port = (next(&mut x) % (members / 64)) as u16;
            d.ignore = next(&mut x).max(1);
        }
        Opcode::Bcast => {
            d.port = (next(&mut x) % members) as u16;
            d.tag = next(&mut x) % trees;
            d.ignore = 0;
        }
        Opcode::Rbcast => {
            let rb = RBCAST_MEMBERS_MAX as u64;
            d.port = (next(&mut x) % rb) as u16;
            let coroots = next(&mut x) % rb;
            d.tag = (next(&mut x) & (1 << 32 | 0xFF_FF00)) | (coroots & 0xFF) | (coroots >> 8) << 24;
            d.ignore = 0;
        }
        Opcode::Barrier => {
            d.port = (next(&mut x) % 3) as u16;
            d.tag = next(&mut x) % trees;
            d.ignore = 0;
            n = 0;
        }
        Opcode::Reduce | Opcode::Allreduce => {
            let t = Dtype::ALL[(next(&mut x) % 6) as usize];
            let r = ReduceOp::ALL[(next(&mut x) % 7) as usize];
            d.tag = reduce_tag(t, r, (next(&mut x) % trees) as u8);
            d.port = if op == Opcode::Allreduce { 0 } else { (next(&mut x) % members) as u16 };
            d.ignore = if next(&mut x).is_multiple_of(4) { u32::MAX as u64 } else { 1 + next(&mut x) % 4096 };
            n = 1 + (next(&mut x) % 2) as usize;
        }
        Opcode::AtomicFetchAdd | Opcode::AtomicCmpSwap | Opcode::AtomicSwap => {
            d.node %= ANY_NODE;
            d.port %= ANY_PORT;
            let width: u32 = if next(&mut x).is_multiple_of(2) { 4 } else { 8 };
            n = 2;
            d.sge[0].len = width;
            d.sge[0].offset = next(&mut x) >> 8;
            d.sge[1].len = next(&mut x) as u32; // the remote end's secret
            d.sge[1].offset = (next(&mut x) >> 8) / width as u64 * width as u64;
            d.ignore = if op == Opcode::AtomicCmpSwap { next(&mut x) } else { 0 };
            if width == 4 {
                d.tag &= u32::MAX as u64;
                d.ignore &= u32::MAX as u64;
            }
        }
        Opcode::RdmaWrite | Opcode::RdmaRead => {
            d.node %= ANY_NODE;
            d.port %= ANY_PORT;
            d.ignore = 0;
            n = n.max(1);
            let imm = op == Opcode::RdmaWrite && next(&mut x).is_multiple_of(2);
            d.flags = if imm { d.flags | WD_IMM } else { d.flags & !WD_IMM };
            if !imm {
                d.tag = 0;
            }
            d.sge[n - 1].offset >>= 2; // the remote end: room for the length
        }
        Opcode::RecvRdmaImm => {}
        Opcode::Probe => n = 0,
        Opcode::Cancel => {
            (d.node, d.port, d.ignore) = (0, 0, 0);
            n = 0;
        }
        Opcode::Start => {
            (d.node, d.port, d.ignore, d.flags) = (0, 0, 0, 0);
            d.tag %= PERSIST_SLOTS as u64;
            n = 0;
        }
    }
    // Now and then a send or receive stored in a persistent slot.
    if matches!(op, Opcode::Send | Opcode::Recv) && d.flags & WD_CLAIM == 0 && next(&mut x).is_multiple_of(4) {
        d.flags |= WD_PERSIST;
        d.slot = (next(&mut x) % PERSIST_SLOTS as u64) as u8;
    }
    d.num_sge = n as u8;
    for s in d.sge.iter_mut().skip(n) {
        *s = Sge::default();
    }
}

/// Descriptors of every opcode a host may post (RECV_RDMA_IMM is a completion only), shaped to be valid.
fn shaped_work_desc() -> impl Strategy<Value = WorkDesc> {
    (arb_work_desc(), 1u8..=16, any::<u64>()).prop_map(|(mut d, opcode, seed)| {
        d.opcode = match opcode {
            13 => Opcode::Probe as u8,
            14 => Opcode::Rbcast as u8,
            15 => Opcode::Cancel as u8,
            16 => Opcode::Start as u8,
            o => o,
        };
        shape_operands(&mut d, seed);
        d
    })
}

/// Shaped descriptors with (usually) one field of the operand rules broken.
fn plausible_operand_work_desc() -> impl Strategy<Value = WorkDesc> {
    (shaped_work_desc(), 0u8..24, any::<u64>()).prop_map(|(mut d, which, v)| {
        let small = v % 70;
        match which {
            0 => d.port = small as u16,
            1 => d.port = v as u16,
            2 => d.port = ANY_PORT,
            3 => d.node = ANY_NODE,
            4 => d.tag = small % 10,
            5 => d.tag = v,
            6 => d.tag |= 1 << (v % 64),
            7 => d.ignore = 0,
            8 => d.ignore = small,
            9 => d.ignore = v,
            10 => d.ignore = u32::MAX as u64 + 1 + small,
            11 => d.sge[1].len = small as u32,
            12 => d.sge[1].offset += 1 + small % 7,
            13 => d.sge[0].len = small as u32 % 9,
            14 => d.num_sge = (small % 7) as u8,
            16 => d.slot = small as u8,
            17 => d.flags ^= WD_PERSIST,
            15 => {
                // A reduce tag with another dtype / operator / tree byte.
                let shift = 8 * (v % 3);
                d.tag = (d.tag & !(0xFF << shift)) | ((small % 12) << shift);
            }
            _ => {} // unmodified
        }
        d
    })
}

/// `validate` accepts exactly what its documentation says.
fn work_desc_spec(d: &WorkDesc) -> Result<Opcode, DecodeError> {
    let op = Opcode::from_u8(d.opcode).ok_or(DecodeError::BadKind)?;
    // The slot is a stored descriptor's alone.
    if (d.flags & WD_PERSIST == 0 && d.slot != 0) || d.flags & !WD_FLAGS_ALL != 0 {
        return Err(DecodeError::ReservedNotZero);
    }
    if d.num_sge as usize > SGE_MAX {
        return Err(DecodeError::BadIndex);
    }
    // Immediate data: a write's, or a send's (in `ignore`, 32 bits).
    if d.flags & WD_IMM != 0 && op != Opcode::RdmaWrite && op != Opcode::Send {
        return Err(DecodeError::ReservedNotZero);
    }
    // Claiming: a probe's choice; a receive's names a handle (32 bits) alone.
    if d.flags & WD_CLAIM != 0 && op != Opcode::Probe && op != Opcode::Recv {
        return Err(DecodeError::ReservedNotZero);
    }
    // Stored: a send or receive, not claimed, in one of 32 slots.
    if d.flags & WD_PERSIST != 0
        && (!matches!(op, Opcode::Send | Opcode::Recv) || d.flags & WD_CLAIM != 0 || d.slot >= 32)
    {
        return Err(DecodeError::BadIndex);
    }
    if op == Opcode::Recv && d.flags & WD_CLAIM != 0 && (d.node | d.port != 0 || d.ignore != 0 || d.tag >> 32 != 0) {
        return Err(DecodeError::BadIndex);
    }
    let imm_max = if d.flags & WD_IMM != 0 { u32::MAX as u64 } else { 0 };
    if op == Opcode::Send && (d.ignore > imm_max || d.node == ANY_NODE || d.port == ANY_PORT) {
        return Err(DecodeError::BadIndex);
    }
    if !operands_spec(d, op) {
        return Err(DecodeError::BadIndex);
    }
    let n = d.num_sge as usize;
    if d.sge[n..].iter().any(|s| s.key != 0 || s.len != 0 || s.offset != 0) {
        return Err(DecodeError::ReservedNotZero);
    }
    // The last SGE of a remote access is the remote end: key, secret, offset.
    let local = if op.is_atomic() || op.is_rma() { n - 1 } else { n };
    if d.sge[..local].iter().any(|s| s.offset as u128 + s.len as u128 > u64::MAX as u128) {
        return Err(DecodeError::BadLength);
    }
    let total: u128 = d.sge[..local].iter().map(|s| s.len as u128).sum();
    if op.is_rma() && d.sge[n - 1].offset as u128 + total > u64::MAX as u128 {
        return Err(DecodeError::BadLength);
    }
    Ok(op)
}

/// The per-opcode field rules, as `Opcode`'s documentation states them
/// (written independently of the implementation: plain numeric ranges).
fn operands_spec(d: &WorkDesc, op: Opcode) -> bool {
    let n = d.num_sge;
    let members = GROUP_MEMBERS_MAX as u64;
    let trees = TREES_MAX as u64;
    match op {
        Opcode::Send | Opcode::Recv => true,
        // No buffer.
        Opcode::Probe => n == 0,
        // The receive's wr_id in tag; nothing else.
        Opcode::Cancel => n == 0 && d.node == 0 && d.port == 0 && d.ignore == 0,
        // A slot index below 32 in tag; nothing else, no flag.
        Opcode::Start => n == 0 && d.flags == 0 && d.node == 0 && d.port == 0 && d.ignore == 0 && d.tag < 32,
        // A rank window below 1024 / 64, a nonzero rank mask.
        Opcode::MultiSend => (d.port as u64) < members / 64 && d.ignore != 0,
        // root rank, tree index, no ignore.
        Opcode::Bcast => (d.port as u64) < members && d.tag < trees && d.ignore == 0,
        // root rank and co-roots below the reliable broadcast's 1024 members;
        // tag = co-roots' low byte | ACK every M << 8 | window << 16 |
        // co-roots' high byte << 24 | NAK << 32.
        Opcode::Rbcast => {
            let rb = RBCAST_MEMBERS_MAX as u64;
            let coroots = (d.tag & 0xFF) | (d.tag >> 24 & 0xFF) << 8;
            (d.port as u64) < rb && d.tag < 1 << 33 && coroots < rb && d.ignore == 0
        }
        // algorithm 0..=2, tree index, no ignore, no buffer.
        Opcode::Barrier => d.port <= 2 && d.tag < trees && d.ignore == 0 && n == 0,
        // tag = dtype | op << 8 | tree << 16; ignore = count; input (+ result).
        Opcode::Reduce | Opcode::Allreduce => {
            let dtype = d.tag & 0xFF;
            let rop = (d.tag >> 8) & 0xFF;
            let tree = (d.tag >> 16) & 0xFF;
            let root_ok = if op == Opcode::Allreduce { d.port == 0 } else { (d.port as u64) < members };
            root_ok
                && d.tag < 1 << 24
                && (1..=6).contains(&dtype)
                && (1..=7).contains(&rop)
                && tree < trees
                && (1..=u32::MAX as u64).contains(&d.ignore)
                && (n == 1 || n == 2)
        }
        // A target endpoint; sge[0] local result word of width 4 or 8,
        // sge[1] the remote word {key, secret, offset}, naturally aligned;
        // compare only for CAS; 32-bit operands for width 4.
        Opcode::AtomicFetchAdd | Opcode::AtomicCmpSwap | Opcode::AtomicSwap => {
            let (local, remote) = (d.sge[0], d.sge[1]);
            let width = local.len as u64;
            n == 2
                && d.node != ANY_NODE
                && d.port != ANY_PORT
                && (width == 4 || width == 8)
                && remote.offset % width == 0
                && (op == Opcode::AtomicCmpSwap || d.ignore == 0)
                && (width == 8 || (d.tag <= u32::MAX as u64 && d.ignore <= u32::MAX as u64))
        }
        // A target endpoint, at least the remote end, no ignore; a tag only
        // as a write's immediate data.
        Opcode::RdmaWrite | Opcode::RdmaRead => {
            n >= 1 && d.node != ANY_NODE && d.port != ANY_PORT && d.ignore == 0 && (d.flags & WD_IMM != 0 || d.tag == 0)
        }
        // Completions only.
        Opcode::RecvRdmaImm => false,
    }
}

/// What an accepted descriptor promises, per opcode class.
fn check_accepted_work_desc(d: &WorkDesc, op: Opcode) -> Result<(), TestCaseError> {
    prop_assert_eq!(op as u8, d.opcode);
    prop_assert!(!(op.is_atomic() && op.is_collective()));
    prop_assert_eq!(op.is_collective(), (3..=7).contains(&d.opcode) || d.opcode == 15);
    prop_assert_eq!(op.is_atomic(), (8..=10).contains(&d.opcode));
    if op.is_atomic() {
        let (width, remote) = (d.sge[0].len, d.remote());
        prop_assert_eq!(d.num_sge, 2);
        prop_assert!(width == 4 || width == 8, "atomic width {}", width);
        prop_assert_eq!(remote.offset % width as u64, 0, "atomic word not naturally aligned");
        prop_assert_eq!(d.total_len(), width as u64, "the remote end is not local data");
        prop_assert!(d.node != ANY_NODE && d.port != ANY_PORT);
    }
    if op.is_rma() {
        prop_assert!(d.num_sge >= 1);
        prop_assert_eq!(d.local_sges().len() + 1, d.num_sge as usize);
        prop_assert!(d.remote().offset.checked_add(d.total_len()).is_some());
    }
    match op {
        Opcode::Barrier => prop_assert_eq!(d.total_len(), 0),
        Opcode::Reduce | Opcode::Allreduce => {
            let (dt, rop, tree) = reduce_tag_parts(d.tag);
            let (dt, rop) = (Dtype::from_u8(dt).unwrap(), ReduceOp::from_u8(rop).unwrap());
            prop_assert_eq!(reduce_tag(dt, rop, tree), d.tag);
            prop_assert!(d.ignore >= 1 && d.ignore <= u32::MAX as u64);
        }
        _ => {}
    }
    Ok(())
}

fn check_work_desc(d: &WorkDesc) -> Result<(), TestCaseError> {
    let got = d.validate();
    prop_assert_eq!(got, work_desc_spec(d));
    if let Ok(op) = got {
        check_accepted_work_desc(d, op)?;
    }
    // The helpers never panic either, valid or not.
    let total = d.total_len();
    if got.is_ok() {
        // The remote end of a remote access is not local data.
        let remote = Opcode::from_u8(d.opcode).is_some_and(|op| op.is_remote_access());
        let local = d.num_sge as usize - remote as usize;
        let want: u64 = d.sge[..local].iter().map(|s| s.len as u64).sum();
        prop_assert_eq!(total, want);
    }
    let _ = d.matches(d.node, d.port, d.tag);
    if got.is_ok() {
        prop_assert!(d.matches(d.node, d.port, d.tag), "a receive matches its own filter");
    }
    Ok(())
}

/// MR entries near the validity boundary: each rule holds with high
/// probability, so accepted entries of every format are common.
fn plausible_mr_entry() -> impl Strategy<Value = MrEntry> {
    (
        arb_mr_entry(),
        prop_oneof![8 => 0u8..=3, 1 => any::<u8>()],
        prop_oneof![1 => any::<u8>(), 4 => 0u8..=MR_ACCESS_ALL],
        any::<u32>(),
        0usize..=MR_INLINE_SEGS,
        prop_oneof![1 => Just(0u32), 4 => 1u32..=4096, 1 => 4096u32..=8192, 1 => any::<u32>()],
        prop_oneof![6 => Just(0u8), 1 => 1u8..4],
        prop_oneof![6 => Just(true), 1 => Just(false)],
        prop_oneof![6 => Just(true), 1 => Just(false)],
    )
        .prop_map(|(mut e, format, access, secret, nsegs, seg_len, length_mode, clean_flags, shaped)| {
            e.format = format;
            e.access = access;
            e.secret = secret;
            // Shape the segments the way the format wants them.
            let nsegs = match format {
                f if f == MrFormat::Short as u8 && shaped => 1,
                f if (f == MrFormat::Invalid as u8 || f == MrFormat::Indirect as u8) && shaped => 0,
                _ => nsegs,
            };
            for (i, s) in e.segs.iter_mut().enumerate() {
                if i < nsegs {
                    s.len = if seg_len == 0 { 0 } else { seg_len.wrapping_add(i as u32).max(1) };
                    if clean_flags {
                        s.flags = 0;
                    }
                } else {
                    *s = PhysSeg::default();
                }
            }
            let sum: u64 = e.segs.iter().map(|s| s.len as u64).sum();
            e.length = match length_mode {
                0 => sum,
                1 => sum.wrapping_add(1),
                2 => e.segs[0].len as u64,
                _ => e.length,
            };
            if format == MrFormat::Indirect as u8 && shaped && e.indirect_count == 0 {
                e.indirect_count = 1;
            }
            e
        })
}

fn check_mr_entry(e: &MrEntry) -> Result<(), TestCaseError> {
    let got = e.validate();
    if let Ok(f) = got {
        prop_assert_eq!(f as u8, e.format);
        prop_assert_eq!(e.access & !MR_ACCESS_ALL, 0);
        let sum: u64 = e.segs.iter().map(|s| s.len as u64).sum();
        match f {
            MrFormat::Invalid => {}
            MrFormat::Short => {
                prop_assert!(e.length <= PAGE_SIZE as u64);
                prop_assert_eq!(e.length, e.segs[0].len as u64);
                prop_assert!(e.segs[1..].iter().all(|s| *s == PhysSeg::default()));
                prop_assert_eq!(e.segs[0].flags, 0);
            }
            MrFormat::Chained => {
                prop_assert_eq!(e.length, sum);
                prop_assert!(e.segs.iter().all(|s| s.flags == 0));
                // Segments in use are a prefix.
                let n = e.segs.iter().take_while(|s| s.len != 0).count();
                prop_assert!(e.segs[n..].iter().all(|s| *s == PhysSeg::default()));
            }
            MrFormat::Indirect => {
                prop_assert!(e.indirect_count != 0);
                prop_assert!(e.segs.iter().all(|s| *s == PhysSeg::default()));
            }
        }
    } else {
        prop_assert!(got.is_err());
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn work_desc_validate_arbitrary(d in arb_work_desc()) {
        check_work_desc(&d)?;
    }

    #[test]
    fn work_desc_validate_plausible(d in plausible_work_desc()) {
        check_work_desc(&d)?;
    }

    #[test]
    fn work_desc_validate_plausible_operands(d in plausible_operand_work_desc()) {
        check_work_desc(&d)?;
    }

    /// Descriptors built the way `Opcode`'s documentation says are accepted.
    #[test]
    fn work_desc_shaped_operands_accepted(d in shaped_work_desc()) {
        prop_assert_eq!(d.validate(), Ok(Opcode::from_u8(d.opcode).unwrap()), "{:?}", d);
        check_work_desc(&d)?;
    }

    /// `validate` never panics, and an atomic it accepts names a 4- or
    /// 8-byte, naturally aligned remote word (arbitrary descriptors, and
    /// atomics near the boundary).
    #[test]
    fn work_desc_atomic_accepted_only_when_aligned(
        d in prop_oneof![
            arb_work_desc(),
            arb_work_desc().prop_map(|mut d| { d.opcode = 8 + d.opcode % 3; d }),
            plausible_operand_work_desc().prop_map(|mut d| { d.opcode = 8 + d.opcode % 3; d }),
        ],
    ) {
        let got = d.validate();
        if let Ok(op) = got {
            if op.is_atomic() {
                let (width, r) = (d.sge[0].len, d.remote());
                prop_assert!(width == 4 || width == 8);
                prop_assert_eq!(r.offset % width as u64, 0);
            }
        }
        prop_assert_eq!(got, work_desc_spec(&d));
    }

    #[test]
    fn work_desc_validate_from_bytes(bytes in vec(any::<u8>(), WorkDesc::SIZE..=WorkDesc::SIZE)) {
        check_work_desc(&WorkDesc::decode(&bytes).unwrap())?;
    }

    #[test]
    fn mr_entry_validate_arbitrary(e in arb_mr_entry()) {
        check_mr_entry(&e)?;
    }

    #[test]
    fn mr_entry_validate_plausible(e in plausible_mr_entry()) {
        check_mr_entry(&e)?;
    }

    #[test]
    fn mr_entry_slot_of_is_low_bits(key in any::<u32>()) {
        prop_assert_eq!(MrEntry::slot_of(key), (key & 0xFFFF) as usize);
    }

    #[test]
    fn mr_make_key_names_its_slot_and_changes_with_each_call(
        salt in any::<u32>(),
        slot in any::<u16>(),
        random in any::<u32>(),
    ) {
        let mut s = salt;
        let (a, secret) = MrEntry::make_key(&mut s, slot, random);
        prop_assert_eq!(MrEntry::slot_of(a), slot as usize);
        prop_assert!(a >> 16 != 0, "a key is never just its slot");
        prop_assert_ne!(s, salt, "the generator advanced");
        prop_assert_eq!(secret, random.max(1), "the secret is the caller's randomness, never 0");
        let (b, _) = MrEntry::make_key(&mut s, slot, random);
        prop_assert_eq!(MrEntry::slot_of(b), slot as usize);
    }
}

// ---------------------------------------------------------------------------
// Firmware image header
// ---------------------------------------------------------------------------

/// `ImageHeader::parse` accepts exactly what its documentation says.
fn image_spec(image: &[u8]) -> Result<ImageHeader, DecodeError> {
    if image.len() < ImageHeader::SIZE {
        return Err(DecodeError::Truncated);
    }
    let h = ImageHeader::decode(image).unwrap();
    if h.magic != IMAGE_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    if h.header_version != IMAGE_HEADER_VERSION {
        return Err(DecodeError::BadVersion);
    }
    if h.reserved.iter().any(|&r| r != 0) || h.reserved_tail.iter().any(|&r| r != 0) {
        return Err(DecodeError::ReservedNotZero);
    }
    let payload = (image.len() - ImageHeader::SIZE) as u64;
    if h.payload_len == 0 || h.payload_len > PAYLOAD_MAX || h.payload_len != payload {
        return Err(DecodeError::BadLength);
    }
    Ok(h)
}

/// Images near the validity boundary: header fields mostly right, payload
/// length agreeing or not.
fn plausible_image() -> impl Strategy<Value = Vec<u8>> {
    (
        arb_image_header(),
        prop_oneof![8 => Just(IMAGE_MAGIC), 1 => any::<u64>()],
        prop_oneof![8 => Just(IMAGE_HEADER_VERSION), 1 => any::<u32>()],
        prop_oneof![8 => Just(true), 1 => Just(false)],
        prop_oneof![8 => Just(true), 1 => Just(false)],
        0usize..300,
        prop_oneof![
            8 => Just(None),
            1 => Just(Some(0u64)),
            1 => Just(Some(PAYLOAD_MAX + 1)),
            1 => any::<u64>().prop_map(Some),
        ],
        any::<u64>(),
    )
        .prop_map(|(mut h, magic, version, clear_reserved, clear_tail, payload, len_override, seed)| {
            h.magic = magic;
            h.header_version = version;
            if clear_reserved {
                h.reserved = [0; 8];
            }
            if clear_tail {
                h.reserved_tail = [0; 5];
            }
            h.payload_len = len_override.unwrap_or(payload as u64);
            let mut img = vec![0u8; ImageHeader::SIZE];
            h.encode(&mut img).unwrap();
            img.extend(payload_bytes(payload, seed));
            img
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn image_parse_arbitrary_bytes(bytes in vec(any::<u8>(), 0..600)) {
        prop_assert_eq!(ImageHeader::parse(&bytes), image_spec(&bytes));
    }

    #[test]
    fn image_parse_plausible(img in plausible_image()) {
        let got = ImageHeader::parse(&img);
        prop_assert_eq!(got, image_spec(&img));
        if let Ok(h) = got {
            prop_assert_eq!(h.is_unsigned(), h.signature == [0u8; 64]);
            prop_assert!(SIGNED_LEN <= ImageHeader::SIZE);
        }
    }
}

// ---------------------------------------------------------------------------
// SRAM layout
// ---------------------------------------------------------------------------

/// Checks that a computed layout is internally consistent: areas do not
/// overlap, fit in `sram_size`, are aligned, and the port windows hold
/// their control page and rings.
fn check_layout(l: &Layout, p: &LayoutParams) -> Result<(), TestCaseError> {
    prop_assert_eq!(&l.params, p);
    let page = PAGE_SIZE as u64;
    let sram = l.sram_size as u64;
    prop_assert!(l.sram_size.is_power_of_two(), "sram_size {} not a power of two", sram);
    prop_assert!(sram <= SRAM_SIZE_MAX);
    // Documented parameter constraints hold for every accepted layout.
    prop_assert!(p.ports > 0);
    prop_assert!(p.send_entries.is_power_of_two() && p.send_entries <= RING_ENTRIES_MAX);
    prop_assert!(p.recv_entries.is_power_of_two() && p.recv_entries <= RING_ENTRIES_MAX);
    prop_assert!(p.mr_entries > 0 && p.mr_entries <= 0x10000, "MR slot must fit a key's low 16 bits");
    prop_assert!(p.route_entries > 0 && p.route_entries <= 0xFFFF);
    prop_assert_eq!(p.staging_size as u64 % page, 0);

    let stride = l.port_stride as u64;
    prop_assert_eq!(stride % page, 0);
    prop_assert!(stride >= page + (p.send_entries as u64 + p.recv_entries as u64) * WorkDesc::SIZE as u64);
    prop_assert!(PortCtl::SIZE as u64 <= page);

    let areas: [(&str, u64, u64); 7] = [
        ("header", 0, page),
        ("admin", l.admin_off as u64, AdminMailbox::SIZE as u64),
        ("staging", l.staging_off as u64, p.staging_size as u64),
        ("mr", l.mr_off as u64, p.mr_entries as u64 * MrEntry::SIZE as u64),
        ("route", l.route_off as u64, p.route_entries as u64 * RouteEntry::SIZE as u64),
        ("group", l.group_off as u64, p.group_entries as u64 * GroupEntry::SIZE as u64),
        ("ports", l.ports_off as u64, stride * p.ports as u64),
    ];
    for (name, off, len) in areas {
        prop_assert!(off + len <= sram, "{} [{:#x}, +{:#x}) beyond sram_size {:#x}", name, off, len, sram);
    }
    for (i, a) in areas.iter().enumerate() {
        for b in &areas[i + 1..] {
            if a.2 == 0 || b.2 == 0 {
                continue;
            }
            let disjoint = a.1 + a.2 <= b.1 || b.1 + b.2 <= a.1;
            prop_assert!(disjoint, "{} [{:#x}, +{:#x}) overlaps {} [{:#x}, +{:#x})", a.0, a.1, a.2, b.0, b.1, b.2);
        }
    }
    for (name, off) in [
        ("admin", l.admin_off),
        ("staging", l.staging_off),
        ("mr", l.mr_off),
        ("route", l.route_off),
        ("group", l.group_off),
        ("ports", l.ports_off),
    ] {
        prop_assert_eq!(off as u64 % page, 0, "{} not page aligned", name);
    }
    // Table entry helpers stay inside their tables.
    prop_assert_eq!(l.mr_entry(p.mr_entries as usize - 1) + MrEntry::SIZE, l.mr_off as usize + areas[3].2 as usize);
    prop_assert_eq!(
        l.route_entry(p.route_entries as usize - 1) + RouteEntry::SIZE,
        l.route_off as usize + areas[4].2 as usize
    );
    if p.group_entries > 0 {
        prop_assert_eq!(
            l.group_entry(p.group_entries as usize - 1) + GroupEntry::SIZE,
            l.group_off as usize + areas[5].2 as usize
        );
    }
    // Port windows: control page, then the send ring, then the receive
    // ring, all inside the window.
    for port in [0, p.ports / 2, p.ports - 1] {
        let w = l.port(port);
        let base = w.base as u64;
        prop_assert_eq!(base, l.ports_off as u64 + port as u64 * stride);
        prop_assert!(base + stride <= sram);
        prop_assert_eq!(w.send_slot(0) as u64, base + page);
        let send_end = w.send_slot(p.send_entries - 1) as u64 + WorkDesc::SIZE as u64;
        prop_assert_eq!(w.recv_slot(0) as u64, send_end);
        let recv_end = w.recv_slot(p.recv_entries - 1) as u64 + WorkDesc::SIZE as u64;
        prop_assert!(recv_end <= base + stride);
        // Indices wrap.
        prop_assert_eq!(w.send_slot(p.send_entries), w.send_slot(0));
        prop_assert_eq!(w.recv_slot(u32::MAX), w.recv_slot(p.recv_entries - 1));
        prop_assert_eq!(w.ctl(ctl::STATE), w.base + ctl::STATE);
    }
    Ok(())
}

fn arb_layout_params() -> impl Strategy<Value = LayoutParams> {
    (any::<u16>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
        |(ports, mr_entries, route_entries, group_entries, staging_size, send_entries, recv_entries)| LayoutParams {
            ports,
            mr_entries,
            route_entries,
            group_entries,
            staging_size,
            send_entries,
            recv_entries,
        },
    )
}

fn ring_size() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => (0u32..=13).prop_map(|s| 1 << s), // 1 ..= 8192 (> RING_ENTRIES_MAX refused)
        1 => 0u32..5000,
    ]
}

/// Parameters around the accepted range (some refused).
fn plausible_layout_params() -> impl Strategy<Value = LayoutParams> {
    (
        prop_oneof![0u16..=3, 0u16..=300, any::<u16>()],
        prop_oneof![0u32..=2048, 0xFF00u32..=0x10100],
        prop_oneof![0u32..=256, 0xFF00u32..=0x10100],
        prop_oneof![0u32..=64, 0u32..=100_000],
        prop_oneof![
            (0u32..=512).prop_map(|p| p * PAGE_SIZE as u32),
            (0u32..=8192).prop_map(|p| p * PAGE_SIZE as u32),
            any::<u32>()
        ],
        ring_size(),
        ring_size(),
    )
        .prop_map(|(ports, mr_entries, route_entries, group_entries, staging_size, send_entries, recv_entries)| {
            LayoutParams { ports, mr_entries, route_entries, group_entries, staging_size, send_entries, recv_entries }
        })
}

/// Parameters that obviously fit: must be accepted.
fn small_layout_params() -> impl Strategy<Value = LayoutParams> {
    (1u16..=16, 1u32..=1024, 1u32..=256, 0u32..=64, 0u32..=256, 0u32..=9, 0u32..=9).prop_map(
        |(ports, mr_entries, route_entries, group_entries, staging_pages, s, r)| LayoutParams {
            ports,
            mr_entries,
            route_entries,
            group_entries,
            staging_size: staging_pages * PAGE_SIZE as u32,
            send_entries: 1 << s,
            recv_entries: 1 << r,
        },
    )
}

fn check_layout_new(p: &LayoutParams) -> Result<Option<Layout>, TestCaseError> {
    match Layout::new(*p) {
        Ok(l) => {
            check_layout(&l, p)?;
            Ok(Some(l))
        }
        Err(e) => {
            prop_assert_eq!(e, DecodeError::BadLength);
            Ok(None)
        }
    }
}

/// A header describing a layout goes through `from_header` unchanged.
fn check_header_round_trip(l: &Layout, node: u16, mtu: u32, features: u32) -> Result<(), TestCaseError> {
    let h = l.header(node, mtu, features);
    let mut b = vec![0u8; SramHeader::SIZE];
    h.encode(&mut b).unwrap();
    let h2 = SramHeader::decode(&b).unwrap();
    prop_assert_eq!(h2, h);
    prop_assert_eq!(h.status, NicStatus::Reset as u32);
    prop_assert_eq!(h.fail_reason, FailReason::None as u32);
    prop_assert_eq!(Layout::from_header(&h2), Ok(*l));
    Ok(())
}

/// Which `SramHeader` field (by index) to perturb, and how.
fn perturb(h: &mut SramHeader, which: u8, v: u32) {
    match which % 20 {
        0 => h.magic ^= 1 << (v % 64),
        1 => h.layout_version = v,
        2 => h.mtu = v,
        3 => h.port_count = v as u16,
        4 => h.sram_size = v,
        5 => h.admin_off = v,
        6 => h.staging_off = v,
        7 => h.staging_size = v,
        8 => h.mr_off = v,
        9 => h.mr_entries = v,
        10 => h.route_off = v,
        11 => h.route_entries = v,
        12 => h.group_off = v,
        13 => h.group_entries = v,
        14 => h.ports_off = v,
        15 => h.port_stride = v,
        16 => h.send_entries = v,
        17 => h.recv_entries = v,
        18 => h.sram_size = h.sram_size.wrapping_sub(v % 8192),
        _ => h.mtu = MTU_MIN + v % (MTU_MAX - MTU_MIN + 1),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn layout_new_arbitrary_params(p in arb_layout_params()) {
        check_layout_new(&p)?;
    }

    #[test]
    fn layout_new_plausible_params(p in plausible_layout_params()) {
        if let Some(l) = check_layout_new(&p)? {
            check_header_round_trip(&l, 0, 1500, 0)?;
        }
    }

    #[test]
    fn layout_new_small_params_accepted(
        p in small_layout_params(),
        node in any::<u16>(),
        mtu in MTU_MIN..=MTU_MAX,
        features in any::<u32>(),
    ) {
        let l = check_layout_new(&p)?;
        prop_assert!(l.is_some(), "small parameters refused: {:?}", p);
        check_header_round_trip(&l.unwrap(), node, mtu, features)?;
    }

    #[test]
    fn layout_from_header_arbitrary(h in arb_sram_header()) {
        if let Ok(l) = Layout::from_header(&h) {
            check_layout(&l, &l.params)?;
        }
    }

    #[test]
    fn layout_from_header_arbitrary_bytes(bytes in vec(any::<u8>(), SramHeader::SIZE..=SramHeader::SIZE)) {
        let h = SramHeader::decode(&bytes).unwrap();
        if let Ok(l) = Layout::from_header(&h) {
            check_layout(&l, &l.params)?;
        }
    }

    /// A valid header with one field changed: refused, or accepted only if
    /// it still describes the same layout (e.g. a larger `sram_size`, a
    /// different MTU in range).
    #[test]
    fn layout_from_header_perturbed(
        p in small_layout_params(),
        mtu in MTU_MIN..=MTU_MAX,
        which in any::<u8>(),
        v in any::<u32>(),
    ) {
        let l = Layout::new(p).unwrap();
        let mut h = l.header(1, mtu, 0);
        perturb(&mut h, which, v);
        if let Ok(l2) = Layout::from_header(&h) {
            check_layout(&l2, &l2.params)?;
            prop_assert_eq!(l2.admin_off, h.admin_off);
            prop_assert_eq!(l2.staging_off, h.staging_off);
            prop_assert_eq!(l2.mr_off, h.mr_off);
            prop_assert_eq!(l2.route_off, h.route_off);
            prop_assert_eq!(l2.group_off, h.group_off);
            prop_assert_eq!(l2.ports_off, h.ports_off);
            prop_assert_eq!(l2.port_stride, h.port_stride);
            prop_assert!(l2.sram_size <= h.sram_size);
            prop_assert!((MTU_MIN..=MTU_MAX).contains(&h.mtu));
            prop_assert_eq!(h.magic, BOARD_SIGNATURE);
            prop_assert_eq!(h.layout_version, LAYOUT_VERSION);
        }
    }
}

// ---------------------------------------------------------------------------
// Collective headers
// ---------------------------------------------------------------------------

fn is_reduction_kind(kind: u8) -> bool {
    kind == CollKind::ReduceUp as u8 || kind == CollKind::AllreduceDown as u8
}

/// What `CollHeader::parse` must answer, from its documentation: reserved
/// zero, a known kind, sender/root ranks below `GROUP_MEMBERS_MAX`, a tree
/// index below `TREES_MAX`, and for reductions a known dtype and operator
/// that combine (no bitwise operator on floats) and a nonzero count.
fn coll_header_spec(bytes: &[u8]) -> Result<CollHeader, DecodeError> {
    if bytes.len() < CollHeader::SIZE {
        return Err(DecodeError::Truncated);
    }
    let h = CollHeader::decode(bytes).unwrap();
    if h.reserved != 0 || h.reserved2 != 0 || h.reserved3 != 0 {
        return Err(DecodeError::ReservedNotZero);
    }
    if !(1..=8).contains(&h.kind) {
        return Err(DecodeError::BadKind);
    }
    let members = GROUP_MEMBERS_MAX as u16;
    if h.sender >= members || h.root >= members || h.tree as usize >= TREES_MAX {
        return Err(DecodeError::BadIndex);
    }
    if is_reduction_kind(h.kind) {
        let float = h.dtype == 5 || h.dtype == 6;
        let bitwise = (5..=7).contains(&h.op);
        if !(1..=6).contains(&h.dtype) || !(1..=7).contains(&h.op) || (float && bitwise) || h.count == 0 {
            return Err(DecodeError::BadKind);
        }
    } else if h.dtype != 0 || h.op != 0 || h.count != 0 {
        return Err(DecodeError::ReservedNotZero);
    }
    Ok(h)
}

/// What an accepted header promises.
fn check_coll_header_accepted(h: &CollHeader) -> Result<(), TestCaseError> {
    let kind = CollKind::from_u8(h.kind);
    prop_assert!(kind.is_some());
    prop_assert_eq!(kind.unwrap() as u8, h.kind);
    prop_assert_eq!(h.reserved, 0);
    prop_assert!((h.sender as usize) < GROUP_MEMBERS_MAX);
    prop_assert!((h.root as usize) < GROUP_MEMBERS_MAX);
    prop_assert!((h.tree as usize) < TREES_MAX);
    if is_reduction_kind(h.kind) {
        let t = Dtype::from_u8(h.dtype).unwrap();
        let op = ReduceOp::from_u8(h.op).unwrap();
        prop_assert!(op.defined_for(t));
        prop_assert!(h.count > 0);
    } else {
        prop_assert_eq!((h.dtype, h.op, h.count), (0, 0, 0));
    }
    Ok(())
}

/// Headers `CollHeader::parse` accepts (dtype, op and count are zero
/// unless the kind is a reduction).
fn valid_coll_header() -> impl Strategy<Value = CollHeader> {
    (
        arb_coll_header(),
        1u8..=7,
        0..GROUP_MEMBERS_MAX as u16,
        0..GROUP_MEMBERS_MAX as u16,
        0..TREES_MAX as u8,
        0..Dtype::ALL.len(),
        0..ReduceOp::ALL.len(),
        1u32..=u32::MAX,
    )
        .prop_map(|(mut h, kind, root, sender, tree, t, op, count)| {
            h.kind = kind;
            h.root = root;
            h.sender = sender;
            h.tree = tree;
            (h.reserved, h.reserved2, h.reserved3) = (0, 0, 0);
            if is_reduction_kind(kind) {
                let t = Dtype::ALL[t];
                let op = ReduceOp::ALL[op];
                h.dtype = t as u8;
                h.op = if op.defined_for(t) { op as u8 } else { ReduceOp::Sum as u8 };
                h.count = count;
            } else {
                (h.dtype, h.op, h.count) = (0, 0, 0);
            }
            h
        })
}

/// Valid headers with (usually) one field moved across its boundary.
fn plausible_coll_header() -> impl Strategy<Value = CollHeader> {
    (valid_coll_header(), 0u8..16, any::<u8>(), any::<u32>()).prop_map(|(mut h, which, b, w)| {
        let m = GROUP_MEMBERS_MAX as u16;
        match which {
            0 => h.reserved = b | 1,
            1 => h.kind = b % 10, // 0, 8 and 9 unknown
            2 => h.sender = m - 2 + b as u16 % 4,
            3 => h.root = m - 2 + b as u16 % 4,
            10 => h.reserved2 = b as u16 | 1,
            11 => h.reserved3 = w | 1,
            4 => h.tree = TREES_MAX as u8 - 2 + b % 4,
            5 => h.dtype = b % 8, // 0 and 7 unknown
            6 => h.op = b % 9,    // 0 and 8 unknown
            7 => h.count = 0,
            8 => {
                // A float reduction, perhaps with a bitwise operator.
                h.kind = CollKind::ReduceUp as u8 + b % 2;
                h.dtype = Dtype::F32 as u8 + (b >> 1) % 2;
                h.op = 1 + (w % 7) as u8;
                h.count = w | 1;
            }
            9 => h.count = w,
            _ => {}
        }
        h
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn coll_header_parse_arbitrary_bytes(bytes in vec(any::<u8>(), 0..64)) {
        let got = CollHeader::parse(&bytes);
        prop_assert_eq!(got, coll_header_spec(&bytes));
        if let Ok(h) = got {
            check_coll_header_accepted(&h)?;
        }
    }

    #[test]
    fn coll_header_parse_plausible(h in plausible_coll_header(), extra in vec(any::<u8>(), 0..8)) {
        let mut bytes = vec![0u8; CollHeader::SIZE];
        h.encode(&mut bytes).unwrap();
        bytes.extend_from_slice(&extra); // trailing bytes are the payload
        let got = CollHeader::parse(&bytes);
        prop_assert_eq!(got, coll_header_spec(&bytes));
        if let Ok(back) = got {
            prop_assert_eq!(back, h);
            check_coll_header_accepted(&back)?;
        }
    }

    #[test]
    fn coll_header_valid_accepted(h in valid_coll_header(), cut in 1usize..=CollHeader::SIZE) {
        let mut bytes = vec![0u8; CollHeader::SIZE];
        h.encode(&mut bytes).unwrap();
        prop_assert_eq!(CollHeader::parse(&bytes), Ok(h));
        prop_assert_eq!(CollHeader::parse(&bytes[..CollHeader::SIZE - cut]), Err(DecodeError::Truncated));
    }
}

/// COLL_DATA fixtures: the collective header is checked in frame 0 only,
/// and the message must be long enough to hold it.
#[test]
fn coll_frame_fixtures() {
    let ch = CollHeader {
        group_id: 9,
        epoch: 3,
        instance: 17,
        kind: CollKind::AllreduceDown as u8,
        root: 0,
        tree: 1,
        dtype: Dtype::F64 as u8,
        op: ReduceOp::Max as u8,
        sender: 5,
        count: 2,
        ..Default::default()
    };
    let mut payload = vec![0u8; 32 + 16];
    ch.encode(&mut payload).unwrap();
    payload[32..].copy_from_slice(&2.5f64.to_le_bytes().repeat(2));
    let hdr = FrameHeader {
        version: WIRE_VERSION,
        kind: FrameKind::CollData as u8,
        frame_count: 1,
        payload_len: payload.len() as u16,
        ..Default::default()
    };
    let msg = MsgHeader::new(0, payload.len() as u64, None);
    let bytes = build_data(&hdr, Some(&msg), &payload);
    assert_eq!(Frame::parse(&bytes), Ok(Frame::Data { hdr, msg: Some(msg), payload: &payload[..] }));
    // The header sits right after FrameHeader | MsgHeader.
    const HEADERS: usize = FrameHeader::SIZE + MsgHeader::SIZE;
    assert_eq!(CollHeader::decode(&bytes[HEADERS..]).unwrap(), ch);

    // Bitwise operator on f64: refused as BadKind.
    let mut bad = bytes.clone();
    bad[HEADERS + 16] = ReduceOp::Bxor as u8;
    assert_eq!(Frame::parse(&bad), Err(DecodeError::BadKind));
    // Sender rank GROUP_MEMBERS_MAX: BadIndex.
    let mut bad = bytes.clone();
    bad[HEADERS + 20..HEADERS + 22].copy_from_slice(&(GROUP_MEMBERS_MAX as u16).to_le_bytes());
    assert_eq!(Frame::parse(&bad), Err(DecodeError::BadIndex));
    // Reserved byte set.
    let mut bad = bytes.clone();
    bad[HEADERS + 17] = 1;
    assert_eq!(Frame::parse(&bad), Err(DecodeError::ReservedNotZero));
    // The same bytes as DATA are fine: the NIC does not look into DATA.
    let mut as_data = bad.clone();
    as_data[1] = FrameKind::Data as u8;
    assert!(matches!(Frame::parse(&as_data), Ok(Frame::Data { .. })));

    // A message shorter than a CollHeader: BadLength.
    let short = MsgHeader::new(0, 23, None);
    let h23 = FrameHeader { payload_len: 23, ..hdr };
    assert_eq!(Frame::parse(&build_data(&h23, Some(&short), &payload[..23])), Err(DecodeError::BadLength));
    // Frame 0 carrying less than a header of a longer message: Truncated.
    let long = MsgHeader::new(0, 4000, None);
    let h2 = FrameHeader { payload_len: 20, frame_count: 2, ..hdr };
    assert_eq!(Frame::parse(&build_data(&h2, Some(&long), &payload[..20])), Err(DecodeError::Truncated));
    // Frame 1 carries no header: anything goes.
    let h1 = FrameHeader { frame_index: 1, frame_count: 2, payload_len: 3, ..hdr };
    assert!(Frame::parse(&build_data(&h1, None, &[0xFF; 3])).is_ok());
}

// ---------------------------------------------------------------------------
// Group table entries
// ---------------------------------------------------------------------------

/// Is `parent[..n]` a tree over relative ranks rooted at 0? Independent of
/// `coll::tree_valid`: ranks get a depth by relaxation from the root.
fn is_tree_spec(parent: &[u8], n: usize) -> bool {
    if n == 0 || parent.len() < n || parent[0] != TREE_ROOT {
        return false;
    }
    let mut depth: Vec<Option<usize>> = vec![None; n];
    depth[0] = Some(0);
    for _ in 0..n {
        for r in 1..n {
            let p = parent[r] as usize;
            if p < n {
                if let Some(dp) = depth[p] {
                    depth[r] = Some(dp + 1);
                }
            }
        }
    }
    depth.iter().all(|d| d.is_some())
}

/// What `GroupEntry::check` must answer, from `GroupError`'s documentation,
/// in the order the checks are documented.
fn group_check_spec(e: &GroupEntry, caller: u32) -> Result<(), GroupError> {
    let n = e.member_count as usize;
    if e.group_id == 0 || n == 0 || n > GROUP_MEMBERS_MAX || e.my_rank as usize >= n {
        return Err(GroupError::BadShape);
    }
    // More than fit inline: the body is missing.
    if n > GROUP_INLINE_MAX {
        return Err(GroupError::BadBody);
    }
    let mut seen = std::collections::HashSet::new();
    if !e.members[..n].iter().all(|m| seen.insert(*m)) {
        return Err(GroupError::DuplicateMember);
    }
    if e.members[e.my_rank as usize] != caller || (caller & 0xFFFF) as u16 != e.port {
        return Err(GroupError::NotMember);
    }
    let trees = e.tree_count as usize;
    if trees == 0 || trees > TREES_MAX || !(0..trees).all(|t| is_tree_spec(&e.parents[64 * t..64 * (t + 1)], n)) {
        return Err(GroupError::BadTree);
    }
    if e.flags != 0
        || e.reserved0 != 0
        || e.reserved1 != 0
        || e.reserved2.iter().any(|&r| r != 0)
        || e.members[n..].iter().any(|&m| m != 0)
    {
        return Err(GroupError::Reserved);
    }
    Ok(())
}

/// A random tree over `parent.len()` relative ranks: a random order of
/// ranks 1.. hangs each under a random earlier one (so parents are not
/// always smaller than their children).
fn random_tree(parent: &mut [u8], x: &mut u64) {
    let n = parent.len();
    let mut order: Vec<u8> = (0..n as u8).collect();
    for i in (2..n).rev() {
        let j = 1 + (next(x) % i as u64) as usize;
        order.swap(i, j);
    }
    parent[0] = TREE_ROOT;
    for i in 1..n {
        parent[order[i] as usize] = order[(next(x) % i as u64) as usize];
    }
}

/// A group entry `check` accepts for the returned caller. Bytes `check`
/// does not read (bounce fields, λs, parents beyond the member count or of
/// unused trees) stay arbitrary.
fn valid_group_entry() -> impl Strategy<Value = (GroupEntry, u32)> {
    (arb_group_entry(), 1usize..=GROUP_INLINE_MAX, any::<u64>(), 1..=TREES_MAX as u8, any::<u32>()).prop_map(
        |(mut e, n, seed, trees, salt)| {
            let mut x = seed | 1;
            e.group_id = e.group_id.max(1);
            e.member_count = n as u16;
            e.my_rank = (next(&mut x) % n as u64) as u16;
            e.members = [0; GROUP_INLINE_MAX];
            for (i, m) in e.members[..n].iter_mut().enumerate() {
                // Distinct: multiplication by an odd constant is a bijection.
                *m = (i as u32 + 1).wrapping_mul(0x9E37_79B1) ^ salt;
            }
            let caller = e.members[e.my_rank as usize];
            e.port = caller as u16;
            e.tree_count = trees;
            for t in 0..trees as usize {
                random_tree(&mut e.parents[64 * t..64 * t + n], &mut x);
            }
            e.flags = 0;
            e.reserved0 = 0;
            e.reserved1 = 0;
            e.reserved2.fill(0);
            (e, caller)
        },
    )
}

/// Valid entries with (usually) one rule broken.
fn plausible_group_entry() -> impl Strategy<Value = (GroupEntry, u32)> {
    (valid_group_entry(), 0u8..28, any::<u64>()).prop_map(|((mut e, mut caller), which, v)| {
        let n = e.member_count as usize;
        let t = (v % e.tree_count as u64) as usize;
        let r = if n > 1 { 1 + (v >> 8) as usize % (n - 1) } else { 0 };
        match which {
            0 => e.group_id = 0,
            1 => e.member_count = 0,
            2 => e.member_count = (GROUP_INLINE_MAX as u64 + 1 + v % 2000) as u16,
            3 => e.my_rank = (n as u64 + v % 3) as u16,
            4 if n > 1 => {
                let i = (v % n as u64) as usize;
                let j = (i + 1 + (v >> 16) as usize % (n - 1)) % n;
                e.members[j] = e.members[i];
            }
            5 => e.members[e.my_rank as usize] ^= 1 << (16 + v % 16), // another node
            6 => e.port = e.port.wrapping_add(1 + v as u16 % 7),
            7 => caller ^= 1 << (v % 32),
            8 => e.tree_count = 0,
            9 => e.tree_count = (TREES_MAX as u64 + 1 + v % 200) as u8,
            10 if n > 1 => e.parents[64 * t + r] = r as u8, // self loop
            11 if n > 2 => {
                // Two ranks naming each other.
                let s = 1 + (r % (n - 1)) % (n - 1).max(1);
                let s = if s == r { 1 + r % (n - 1) } else { s };
                e.parents[64 * t + r] = s as u8;
                e.parents[64 * t + s] = r as u8;
            }
            12 => e.parents[64 * t] = (v % 0xFF) as u8, // root not TREE_ROOT
            13 if n > 1 => e.parents[64 * t + r] = (n as u64 + v % 200).min(0xFF) as u8,
            14 => e.flags = v as u8 | 1,
            15 => e.reserved0 = v as u16 | 1,
            16 => e.reserved1 = v as u32 | 1,
            17 => {
                let i = (v % e.reserved2.len() as u64) as usize;
                e.reserved2[i] = v | 1;
            }
            18 if n < GROUP_INLINE_MAX => e.members[n + (v >> 8) as usize % (GROUP_INLINE_MAX - n)] = v as u32 | 1,
            19 if n > 1 => e.member_count -= 1,
            20 if n < GROUP_INLINE_MAX => e.member_count += 1,
            21 => e.tree_count = e.tree_count % TREES_MAX as u8 + 1,
            _ => {}
        }
        (e, caller)
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn group_entry_check_arbitrary(e in arb_group_entry(), caller in any::<u32>()) {
        prop_assert_eq!(e.check(caller), group_check_spec(&e, caller));
    }

    #[test]
    fn group_entry_check_arbitrary_bytes(bytes in vec(any::<u8>(), GroupEntry::SIZE..=GroupEntry::SIZE), caller in any::<u32>()) {
        let e = GroupEntry::decode(&bytes).unwrap();
        prop_assert_eq!(e.check(caller), group_check_spec(&e, caller));
    }

    #[test]
    fn group_entry_check_valid_accepted((e, caller) in valid_group_entry()) {
        prop_assert_eq!(e.check(caller), Ok(()));
        for t in 0..e.tree_count as usize {
            prop_assert_eq!(e.tree(t), &e.parents[64 * t..64 * t + e.member_count as usize]);
            prop_assert!(emp_uapi::coll::tree_valid(e.tree(t), e.member_count as usize));
        }
        // Survives the trip through SRAM bytes.
        let mut b = vec![0u8; GroupEntry::SIZE];
        e.encode(&mut b).unwrap();
        prop_assert_eq!(GroupEntry::decode(&b).unwrap().check(caller), Ok(()));
    }

    #[test]
    fn group_entry_check_plausible((e, caller) in plausible_group_entry()) {
        prop_assert_eq!(e.check(caller), group_check_spec(&e, caller));
    }
}

/// A hand-built 4-member group: nodes 1..=4 on port 7; this NIC is rank 2.
/// Tree 0 is binomial (0 <- 1, 0 <- 2, 1 <- 3), tree 1 a chain.
fn hand_group_entry() -> (GroupEntry, u32) {
    let mut e = GroupEntry {
        group_id: 42,
        epoch: 1,
        member_count: 4,
        my_rank: 2,
        port: 7,
        tree_count: 2,
        bounce_key: 0x0001_0003,
        bounce_slot_size: 4096,
        bounce_offset: 8192,
        bounce_slots: 4,
        tree_lambda: [1, 3, 0, 0, 0, 0, 0, 0],
        ..Default::default()
    };
    for r in 0..4 {
        e.members[r] = ((r as u32 + 1) << 16) | 7;
    }
    e.parents[..4].copy_from_slice(&[TREE_ROOT, 0, 0, 1]);
    e.parents[64..68].copy_from_slice(&[TREE_ROOT, 0, 1, 2]);
    (e, (3 << 16) | 7)
}

/// A change to a group entry.
type Edit = Box<dyn Fn(&mut GroupEntry)>;

#[test]
fn group_entry_check_rejects_each_case() {
    let (good, caller) = hand_group_entry();
    assert_eq!(good.check(caller), Ok(()));

    // The byte image: fields at their documented offsets.
    let mut b = vec![0u8; GroupEntry::SIZE];
    good.encode(&mut b).unwrap();
    assert_eq!(&b[0..4], &42u32.to_le_bytes());
    assert_eq!(b[14], 2, "tree_count at 14");
    assert_eq!(&b[24..32], &8192u64.to_le_bytes(), "bounce_offset at 24");
    assert_eq!(&b[40..42], &[1, 3], "tree_lambda at 40");
    assert_eq!(&b[48 + 8..48 + 12], &((3u32 << 16) | 7).to_le_bytes(), "members at 48");
    // parents and reserved2 follow the members array.
    let parents = 48 + 4 * GROUP_INLINE_MAX;
    assert_eq!(core::mem::offset_of!(GroupEntry, parents), parents);
    assert_eq!(&b[parents..parents + 4], &[TREE_ROOT, 0, 0, 1], "tree 0");
    assert_eq!(&b[parents + 64..parents + 68], &[TREE_ROOT, 0, 1, 2], "tree 1 at +64");
    assert_eq!(core::mem::offset_of!(GroupEntry, reserved2), parents + 512);
    assert!(b[parents + 512..].iter().all(|&x| x == 0), "reserved2 last, zero");
    const { assert!(GROUP_INLINE_MAX <= 64, "a parent array (64 bytes) holds every member") };

    let cases: Vec<(&str, Edit, GroupError)> = vec![
        ("group id 0", Box::new(|e| e.group_id = 0), GroupError::BadShape),
        ("no members", Box::new(|e| e.member_count = 0), GroupError::BadShape),
        ("too many members", Box::new(|e| e.member_count = GROUP_MEMBERS_MAX as u16 + 1), GroupError::BadShape),
        (
            "wide group without its body",
            Box::new(|e| e.member_count = GROUP_INLINE_MAX as u16 + 1),
            GroupError::BadBody,
        ),
        ("rank = member count", Box::new(|e| e.my_rank = 4), GroupError::BadShape),
        ("endpoint twice", Box::new(|e| e.members[3] = e.members[0]), GroupError::DuplicateMember),
        ("caller twice", Box::new(|e| e.members[0] = e.members[2]), GroupError::DuplicateMember),
        ("another endpoint at my rank", Box::new(|e| e.members[2] = (9 << 16) | 7), GroupError::NotMember),
        ("rank names another member", Box::new(|e| e.my_rank = 1), GroupError::NotMember),
        ("port is not the caller's", Box::new(|e| e.port = 8), GroupError::NotMember),
        ("no tree", Box::new(|e| e.tree_count = 0), GroupError::BadTree),
        ("9 trees", Box::new(|e| e.tree_count = TREES_MAX as u8 + 1), GroupError::BadTree),
        ("tree without root", Box::new(|e| e.parents[0] = 0), GroupError::BadTree),
        ("two roots", Box::new(|e| e.parents[3] = TREE_ROOT), GroupError::BadTree),
        ("parent out of range", Box::new(|e| e.parents[3] = 4), GroupError::BadTree),
        ("cycle in tree 1", Box::new(|e| e.parents[64 + 1..64 + 3].copy_from_slice(&[2, 1])), GroupError::BadTree),
        ("self loop", Box::new(|e| e.parents[64 + 3] = 3), GroupError::BadTree),
        ("tree 2 in use but empty", Box::new(|e| e.tree_count = 3), GroupError::BadTree),
        ("flags", Box::new(|e| e.flags = 1), GroupError::Reserved),
        ("reserved0", Box::new(|e| e.reserved0 = 1), GroupError::Reserved),
        ("reserved1", Box::new(|e| e.reserved1 = 1), GroupError::Reserved),
        ("reserved2", Box::new(|e| *e.reserved2.last_mut().unwrap() = 1), GroupError::Reserved),
        ("member beyond the count", Box::new(|e| e.members[4] = (5 << 16) | 7), GroupError::Reserved),
    ];
    for (what, f, want) in &cases {
        let mut e = good;
        f(&mut e);
        assert_eq!(e.check(caller), Err(*want), "{what}");
        assert_eq!(group_check_spec(&e, caller), Err(*want), "spec: {what}");
    }
    // Every GroupError variant is exercised and has a text.
    for v in [
        GroupError::BadShape,
        GroupError::BadBody,
        GroupError::DuplicateMember,
        GroupError::NotMember,
        GroupError::BadTree,
        GroupError::Reserved,
    ] {
        assert!(cases.iter().any(|c| c.2 == v), "{v:?} not exercised");
        assert!(!v.as_str().is_empty());
    }
    // A caller on another port than the entry's.
    assert_eq!(good.check((3 << 16) | 8), Err(GroupError::NotMember));

    // What `check` does not look at: accepted either way.
    let accepted: Vec<(&str, Edit)> = vec![
        ("parents beyond member_count", Box::new(|e| e.parents[4] = 0xAA)),
        ("parents of unused trees", Box::new(|e| e.parents[64 * 5] = 0x11)),
        ("lambdas", Box::new(|e| e.tree_lambda = [9; 8])),
        ("bounce fields", Box::new(|e| e.bounce_slots = 0)),
        (
            "one member, one tree",
            Box::new(|e| {
                e.member_count = 1;
                e.my_rank = 0;
                e.members = [0; GROUP_INLINE_MAX];
                e.members[0] = (3 << 16) | 7;
                e.tree_count = 1;
            }),
        ),
        (
            "all trees, all members",
            Box::new(|e| {
                e.member_count = GROUP_INLINE_MAX as u16;
                for r in 0..GROUP_INLINE_MAX {
                    e.members[r] = ((r as u32 + 1) << 16) | 7;
                }
                e.tree_count = TREES_MAX as u8;
                for t in 0..TREES_MAX {
                    e.parents[64 * t] = TREE_ROOT;
                    for r in 1..GROUP_INLINE_MAX {
                        e.parents[64 * t + r] = ((r - 1) / (t + 1)) as u8; // (t+1)-ary heap
                    }
                }
            }),
        ),
    ];
    for (what, f) in &accepted {
        let mut e = good;
        f(&mut e);
        assert_eq!(e.check(caller), Ok(()), "{what}");
    }
}
