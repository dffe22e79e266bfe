//! Property tests of the codecs and validating decoders of `emp-uapi`.
//!
//! * Every `le_struct!` type: encode → decode round trips for arbitrary field
//!   values; the encoding equals the in-memory byte image (little-endian
//!   hosts); `decode` of arbitrary bytes never panics and is the inverse of
//!   `encode`; `encode` into a short buffer is refused.
//! * Validating decoders never panic on arbitrary input, and accept exactly
//!   what they document: `wire::Frame::parse`, `desc::WorkDesc::validate`,
//!   `desc::MrEntry::validate`, `image::ImageHeader::parse`,
//!   `sram::Layout::from_header`, `sram::Layout::new`.
//! * Frames built with `wire::emit_data_headers` / `wire::emit_ack` from
//!   arbitrary valid headers parse back to the same values, and every frame
//!   `parse` accepts re-emits to the same bytes.
//! * `Layout::new` either refuses its parameters or yields areas that do not
//!   overlap and fit in `sram_size`.

use core::mem::size_of;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use emp_uapi::attach::AttachMsg;
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
arb_struct!(arb_msg_header -> MsgHeader { tag: any::<u64>(), total_len: any::<u64>() });
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
    reserved0: any::<u8>(),
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
    reserved: any::<u32>(),
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
    reserved1: any::<[u64; 4]>(),
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
    reserved: any::<[u64; 2]>(),
});
arb_struct!(arb_group_entry -> GroupEntry {
    group_id: any::<u32>(),
    epoch: any::<u32>(),
    member_count: any::<u16>(),
    my_rank: any::<u16>(),
    port: any::<u16>(),
    reserved: any::<u16>(),
    members: any::<[u32; GROUP_MEMBERS_MAX]>(),
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
    nic_pad: any::<[u32; 11]>(),
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
    reserved: any::<[u64; 3]>(),
});
arb_struct!(arb_emp_reg_mr -> EmpRegMr {
    size: any::<u32>(),
    access: any::<u32>(),
    addr: any::<u64>(),
    length: any::<u64>(),
    key: any::<u32>(),
    reserved0: any::<u32>(),
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
                #[test]
                fn decode_arbitrary_bytes(bytes in vec(any::<u8>(), 0..600)) {
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
    }
}

/// What a successful parse promises about its result.
fn check_parsed(bytes: &[u8], f: &Frame<'_>) -> Result<(), TestCaseError> {
    let hdr = *f.header();
    prop_assert_eq!(hdr.version, WIRE_VERSION);
    prop_assert!(bytes.len() <= MTU_MAX as usize);
    match *f {
        Frame::Data { hdr, msg, payload } => {
            prop_assert_eq!(hdr.kind, FrameKind::Data as u8);
            prop_assert!(hdr.frame_index < hdr.frame_count);
            prop_assert_eq!(msg.is_some(), hdr.frame_index == 0);
            prop_assert_eq!(payload.len(), hdr.payload_len as usize);
            if let Some(m) = msg {
                prop_assert!(m.total_len >= payload.len() as u64);
            }
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
    (
        arb_frame_header(),
        arb_msg_header(),
        prop_oneof![0u64..20_000, 0u64..(1 << 32), any::<u64>()],
        any::<u32>(),
        prop_oneof![Just(true), any::<bool>()],
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(mut hdr, mut msg, total_len, count_seed, first, index_seed, len_seed, data_seed)| {
            msg.total_len = total_len;
            let max_frames = frames_for(total_len, MTU_MIN).min(u32::MAX as u64) as u32;
            hdr.version = WIRE_VERSION;
            hdr.kind = FrameKind::Data as u8;
            hdr.frame_count = 1 + count_seed % max_frames;
            hdr.frame_index = if first { 0 } else { index_seed % hdr.frame_count };
            let head = data_header_len(hdr.frame_index);
            let mut max_payload = MTU_MAX as u64 - head as u64;
            if hdr.frame_index == 0 {
                max_payload = max_payload.min(total_len);
            }
            hdr.payload_len = (len_seed as u64 % (max_payload + 1)) as u16;
            let payload = payload_bytes(hdr.payload_len as usize, data_seed);
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

/// A valid frame's bytes with one mutation: a byte changed, bytes cut off,
/// or bytes appended.
fn mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    let base = prop_oneof![
        valid_data_frame().prop_map(|(h, m, p)| build_data(&h, m.as_ref(), &p)),
        valid_ack_frame().prop_map(|(h, b)| build_ack(&h, &b)),
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
        kind in 0u8..5,
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

    /// A DATA frame whose length disagrees with `payload_len` is refused.
    #[test]
    fn data_frame_with_wrong_length_is_refused(
        (hdr, msg, payload) in valid_data_frame(),
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
        .prop_map(|(mut d, opcode, flags, num_sge, reserved0, node, port, ignore, clean_tail, small_offsets)| {
            d.opcode = opcode;
            d.flags = flags;
            d.num_sge = num_sge;
            d.reserved0 = reserved0;
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

/// `validate` accepts exactly what its documentation says.
fn work_desc_spec(d: &WorkDesc) -> Result<Opcode, DecodeError> {
    let op = Opcode::from_u8(d.opcode).ok_or(DecodeError::BadKind)?;
    if d.reserved0 != 0 || d.flags & !WD_FLAGS_ALL != 0 {
        return Err(DecodeError::ReservedNotZero);
    }
    if d.num_sge as usize > SGE_MAX {
        return Err(DecodeError::BadIndex);
    }
    if op == Opcode::Send && (d.ignore != 0 || d.node == ANY_NODE || d.port == ANY_PORT) {
        return Err(DecodeError::BadIndex);
    }
    let n = d.num_sge as usize;
    if d.sge[n..].iter().any(|s| s.key != 0 || s.len != 0 || s.offset != 0) {
        return Err(DecodeError::ReservedNotZero);
    }
    if d.sge[..n].iter().any(|s| s.offset as u128 + s.len as u128 > u64::MAX as u128) {
        return Err(DecodeError::BadLength);
    }
    Ok(op)
}

fn check_work_desc(d: &WorkDesc) -> Result<(), TestCaseError> {
    let got = d.validate();
    prop_assert_eq!(got, work_desc_spec(d));
    // The helpers never panic either, valid or not.
    let total = d.total_len();
    if got.is_ok() {
        let want: u64 = d.sge[..d.num_sge as usize].iter().map(|s| s.len as u64).sum();
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
        prop_oneof![6 => Just(0u32), 1 => any::<u32>()],
        0usize..=MR_INLINE_SEGS,
        prop_oneof![1 => Just(0u32), 4 => 1u32..=4096, 1 => 4096u32..=8192, 1 => any::<u32>()],
        prop_oneof![6 => Just(0u8), 1 => 1u8..4],
        prop_oneof![6 => Just(true), 1 => Just(false)],
        prop_oneof![6 => Just(true), 1 => Just(false)],
    )
        .prop_map(|(mut e, format, access, reserved, nsegs, seg_len, length_mode, clean_flags, shaped)| {
            e.format = format;
            e.access = access;
            e.reserved = reserved;
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
        prop_assert_eq!(e.reserved, 0);
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
