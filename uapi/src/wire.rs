//! EMP wire frames.
//!
//! Every frame starts with a [`FrameHeader`]. The first frame of a message
//! (frame index 0 of a DATA frame) carries a [`MsgHeader`] right after it
//! (EMP thesis §2.3.1: "the first frame also carries a message header that
//! embeds the frame header"). ACK and NACK frames carry an [`AckBody`] with
//! the receiver's piggybacked buffer state.
//!
//! ```text
//! DATA, index 0:  FrameHeader | MsgHeader | payload
//! DATA, index >0: FrameHeader | payload
//! ACK / NACK:     FrameHeader | AckBody
//! COLL_DATA:      as DATA; the message payload starts with a CollHeader
//! ATOMIC_REQ:     FrameHeader | AtomicBody     (msg_seq = atomic sequence)
//! ATOMIC_RESP:    FrameHeader | AtomicResult   (doubles as the ACK)
//! RMA:            as DATA; the message payload starts with an RmaHeader
//! RBCAST:         FrameHeader | RbcastHeader | payload   (reliable broadcast)
//! ```
//! RBCAST frames are the reliable broadcast's (seed 002): its data goes to a
//! multicast address (unreliable, one transmission), its ACKs to one
//! collector; its repairs and co-root copies ride the reliable
//! point-to-point path as `COLL_DATA` messages of kind
//! `CollKind::Rbcast` whose payload is the same `RbcastHeader | payload`.
//! Remote writes, read requests and read responses are RMA messages: they
//! share the per-peer message sequence, reliability and flow control of
//! DATA (so each is executed once, however often it is retransmitted);
//! the target places a write's data in the region its [`RmaHeader`] names
//! instead of a posted receive, and answers a read request with a read
//! response, an RMA message of its own.
//! Collective messages share the per-peer message sequence, reliability
//! and flow control of DATA; only the receiver's matching differs (the NIC
//! consumes them itself). Atomics have their own per-peer sequence, a
//! window of [`ATOMIC_WINDOW`] and a result cache at the target.
//! On raw Ethernet the frame follows a 14-byte MAC header with ethertype
//! [`crate::ETHERTYPE_EMP`]; on UDP it is the datagram.

use crate::{le_struct, DecodeError, Le};

/// Wire protocol version carried in every frame. 3: remote accesses carry
/// the region's 32-bit secret. 4: message headers carry immediate data.
/// 5: reliable-broadcast headers carry 16-bit co-root counts and NAKs.
/// 6: reliable-broadcast repairs are unicast `RBCAST` frames (`REPAIR`).
pub const WIRE_VERSION: u8 = 6;
/// Largest frame (header + payload) a NIC accepts: jumbo MTU.
pub const MTU_MAX: u32 = 9000;
/// Smallest MTU that still carries headers plus a useful payload.
pub const MTU_MIN: u32 = 256;

/// Multicast addresses share the node id space: a frame header's
/// `dst_node` (and the NIC's transmit address) from [`MCAST_BASE`] up names
/// multicast group `dst_node - MCAST_BASE`, not a node. Node ids stay below
/// it. Delivery is unreliable by design (as InfiniBand UD multicast): one
/// transmission, a copy to every member, each copy lost on its own.
pub const MCAST_BASE: u16 = 0xF000;
/// Multicast addresses: `MCAST_BASE .. MCAST_BASE + MCAST_GROUPS`.
pub const MCAST_GROUPS: u16 = 0x0F00;

/// Is `dst` a multicast address?
pub const fn is_mcast(dst: u16) -> bool {
    dst >= MCAST_BASE && dst < MCAST_BASE + MCAST_GROUPS
}

/// Multicast address `addr`'s group index (`None`: not a multicast address).
pub const fn mcast_group(addr: u16) -> Option<u16> {
    if is_mcast(addr) {
        Some(addr - MCAST_BASE)
    } else {
        None
    }
}

/// The Ethernet address of multicast address `addr` on the raw-Ethernet
/// wire: group bit and locally-administered bit set (`03:00:c6:12:hi:lo`,
/// `hi:lo` the group index), so it collides with no assigned range.
pub const fn mcast_mac(addr: u16) -> [u8; 6] {
    let g = addr.wrapping_sub(MCAST_BASE);
    [0x03, 0x00, 0xc6, 0x12, (g >> 8) as u8, g as u8]
}

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Message data.
    Data = 1,
    /// Acknowledges one complete group of frames.
    Ack = 2,
    /// Negative acknowledgement: a hole, a receiver not ready, a closed port.
    Nack = 3,
    /// Collective message data (payload starts with a `CollHeader`).
    CollData = 4,
    /// Remote atomic request.
    AtomicReq = 5,
    /// Remote atomic response.
    AtomicResp = 6,
    /// Remote write, read request or read response (payload starts with an [`RmaHeader`]).
    Rma = 7,
    /// Reliable broadcast data (to a multicast address) or ACK (to a
    /// collector): an [`RbcastHeader`], then the data.
    Rbcast = 8,
}

impl FrameKind {
    /// Decodes a kind byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(FrameKind::Data),
            2 => Some(FrameKind::Ack),
            3 => Some(FrameKind::Nack),
            4 => Some(FrameKind::CollData),
            5 => Some(FrameKind::AtomicReq),
            6 => Some(FrameKind::AtomicResp),
            7 => Some(FrameKind::Rma),
            8 => Some(FrameKind::Rbcast),
            _ => None,
        }
    }
}

/// Why a NACK was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NackReason {
    /// Frames of the group are missing (`missing_mask`): fast retransmission.
    Loss = 1,
    /// No posted receive matches and no overflow slot: receiver not ready.
    /// The sender retransmits later; this does not count as a lost attempt.
    NoMatch = 2,
    /// The destination port is not open.
    PortClosed = 3,
    /// The receiver's peer table is full.
    PeerTableFull = 4,
    /// The message is larger than the receiver accepts.
    TooLarge = 5,
    /// A collective message for an older epoch of the group.
    StaleEpoch = 6,
    /// The receiver's collective instance disagrees with the message.
    CollMismatch = 7,
    /// A remote write or read refused: key, secret, rights or bounds (or
    /// the source is throttled for guessing keys).
    RemoteAccess = 8,
    /// The message matched no posted receive and the receiver kept its
    /// header as an unexpected entry (rendezvous): the sender stops sending
    /// it, keeps its buffer readable and waits for the receiver's
    /// `RDV_READ`; the send completes once that pull's response is
    /// acknowledged.
    Retained = 9,
}

impl NackReason {
    /// Decodes a reason byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(NackReason::Loss),
            2 => Some(NackReason::NoMatch),
            3 => Some(NackReason::PortClosed),
            4 => Some(NackReason::PeerTableFull),
            5 => Some(NackReason::TooLarge),
            6 => Some(NackReason::StaleEpoch),
            7 => Some(NackReason::CollMismatch),
            8 => Some(NackReason::RemoteAccess),
            9 => Some(NackReason::Retained),
            _ => None,
        }
    }
}

le_struct! {
    /// Header of every EMP frame (32 bytes).
    pub struct FrameHeader {
        /// [`WIRE_VERSION`].
        pub version: u8,
        /// [`FrameKind`].
        pub kind: u8,
        /// Generation of the destination port as last learned from its ACKs
        /// (0 = not known yet). A port re-opened by another process has a
        /// new generation and refuses frames meant for its predecessor.
        pub dst_gen: u16,
        /// Sending node.
        pub src_node: u16,
        /// Destination node.
        pub dst_node: u16,
        /// Sending port.
        pub src_port: u16,
        /// Destination port.
        pub dst_port: u16,
        /// Generation of the sending port (changes each time the port is
        /// opened, so a receiver can tell a new incarnation from stale frames).
        pub src_gen: u16,
        /// Bytes of payload after the header(s) (DATA only; 0 otherwise).
        pub payload_len: u16,
        /// Per-(endpoint → endpoint) message sequence number.
        pub msg_seq: u32,
        /// Every message before this sequence number is finished or abandoned
        /// by the sender: the receiver may skip them.
        pub tx_floor: u32,
        /// Frame index within the message (DATA) / first frame of the
        /// acknowledged group (ACK/NACK).
        pub frame_index: u32,
        /// Frames in the message.
        pub frame_count: u32,
    }
    size = 32;
}

le_struct! {
    /// Message header, carried by frame 0 of every message (24 bytes).
    pub struct MsgHeader {
        /// Tag the receiver matches on.
        pub tag: u64,
        /// Total message length in bytes.
        pub total_len: u64,
        /// The sender's immediate data with [`MSG_IMM`], else zero.
        pub imm: u32,
        /// `MSG_*` flags.
        pub flags: u32,
    }
    size = 24;
}

/// Message header flag: `imm` is the sender's immediate data (a send
/// posted with `WD_IMM`), reported in the receive's completion.
pub const MSG_IMM: u32 = 1 << 0;

impl MsgHeader {
    /// The header of a message with `tag`, `total_len` bytes and, if
    /// `Some`, immediate data.
    pub const fn new(tag: u64, total_len: u64, imm: Option<u32>) -> MsgHeader {
        match imm {
            Some(imm) => MsgHeader { tag, total_len, imm, flags: MSG_IMM },
            None => MsgHeader { tag, total_len, imm: 0, flags: 0 },
        }
    }

    /// The immediate data, if the message carries any.
    pub const fn imm(&self) -> Option<u32> {
        if self.flags & MSG_IMM != 0 {
            Some(self.imm)
        } else {
            None
        }
    }
}

le_struct! {
    /// Body of ACK and NACK frames (16 bytes).
    pub struct AckBody {
        /// Group index acknowledged (ACK) or reported (NACK);
        /// [`ACK_NO_GROUP`] in an ACK that only carries receiver state.
        pub group: u32,
        /// NACK(Loss): bit i set = frame `group_first + i` is missing.
        pub missing_mask: u32,
        /// Piggybacked receiver state: receives posted and free overflow
        /// slots on the destination port (saturating).
        pub rx_credits: u16,
        /// [`NackReason`] for NACK, zero for ACK.
        pub reason: u8,
        /// Flow-control feedback, how much to slow down (EMP thesis
        /// §2.3.1's second level): [`FC_GO`], [`FC_SLOW`] (keep at most
        /// half of `rx_credits` messages started) or [`FC_STOP`] (start
        /// none until an ACK says otherwise).
        pub fc_level: u8,
        /// Receiver's next expected message sequence number from this
        /// sender, held back to the oldest message it has not wholly
        /// received (a partly received one, a retained header): every
        /// message before it is in, so this acknowledges them all at once
        /// (PM's cumulative Ack(r, i), seed 003 §3.3).
        pub rx_expected: u32,
    }
    size = 16;
}

/// [`AckBody::group`] of an ACK that acknowledges no group: a flow-control
/// update (its `rx_credits`, `fc_level` and cumulative `rx_expected` only).
pub const ACK_NO_GROUP: u32 = u32::MAX;

/// [`AckBody::fc_level`]: the receiver has room, send up to `rx_credits`.
pub const FC_GO: u8 = 0;
/// [`AckBody::fc_level`]: the receiver is short: start at most half of `rx_credits`.
pub const FC_SLOW: u8 = 1;
/// [`AckBody::fc_level`]: the receiver has no room: start nothing new.
pub const FC_STOP: u8 = 2;

/// Atomic requests a requester keeps unanswered per peer; the target
/// caches this many results per peer, so every retransmission hits the cache.
pub const ATOMIC_WINDOW: u32 = 16;

/// Atomic operations on the wire (`AtomicBody::op`).
pub mod atomic_op {
    /// X → X + operand.
    pub const FETCH_ADD: u8 = 1;
    /// X → operand if X == compare.
    pub const CMP_SWAP: u8 = 2;
    /// X → operand.
    pub const SWAP: u8 = 3;
}

le_struct! {
    /// Body of an ATOMIC_REQ frame (40 bytes).
    pub struct AtomicBody {
        /// [`atomic_op`].
        pub op: u8,
        /// Word width in bytes: 4 or 8.
        pub width: u8,
        /// Reserved, zero.
        pub reserved: u16,
        /// Remote key of the target region.
        pub rkey: u32,
        /// Offset of the word within the region (naturally aligned).
        pub offset: u64,
        /// Addend / new value.
        pub operand: u64,
        /// Compare value (CAS), else 0.
        pub compare: u64,
        /// The region's remote-access secret (`desc::MrEntry::secret`).
        pub secret: u32,
        /// Reserved, zero.
        pub reserved2: u32,
    }
    size = 40;
}

le_struct! {
    /// Body of an ATOMIC_RESP frame (16 bytes).
    pub struct AtomicResult {
        /// Completion status byte (`desc::Status`) for the requester.
        pub status: u8,
        /// Reserved, zero.
        pub reserved: [u8; 7],
        /// The word's value before the operation.
        pub old: u64,
    }
    size = 16;
}

/// RMA operations on the wire (`RmaHeader::op`).
pub mod rma_op {
    /// Write the message's data at (`rkey`, `offset`) of the target.
    pub const WRITE: u8 = 1;
    /// As `WRITE`, then complete a posted receive matching (initiator,
    /// tag = `cookie`, the immediate data).
    pub const WRITE_IMM: u8 = 2;
    /// Read `len` bytes at (`rkey`, `offset`) of the target; the answer is
    /// a `READ_RESP` carrying `cookie`. The message is the header alone.
    pub const READ_REQ: u8 = 3;
    /// The data a `READ_REQ` asked for, for the read named by `cookie`.
    pub const READ_RESP: u8 = 4;
    /// Rendezvous pull: read `len` bytes of the send message `offset` (its
    /// sequence number on this peer) that the requester retained as an
    /// unexpected header; answered by a `READ_RESP` carrying `cookie`. No
    /// key: the sender's NIC serves only its own retained send's buffer.
    pub const RDV_READ: u8 = 5;
}

le_struct! {
    /// Header at the start of every RMA message's payload (32 bytes).
    pub struct RmaHeader {
        /// [`rma_op`].
        pub op: u8,
        /// Reserved, zero.
        pub reserved: [u8; 3],
        /// Target region key (WRITE, WRITE_IMM, READ_REQ), else 0.
        pub rkey: u32,
        /// The region's remote-access secret, with `rkey`.
        pub secret: u32,
        /// READ_REQ: bytes to read; else 0.
        pub len: u32,
        /// Offset within the target region (with `rkey`), else 0.
        pub offset: u64,
        /// WRITE_IMM: the immediate data; READ_REQ and READ_RESP: the
        /// initiator's name for the read; WRITE: 0.
        pub cookie: u64,
    }
    size = 32;
}

impl RmaHeader {
    /// Parses and validates the header at the start of an RMA message of
    /// `total_len` bytes from untrusted bytes.
    pub fn parse(b: &[u8], total_len: u64) -> Result<RmaHeader, DecodeError> {
        let h = RmaHeader::decode(b)?;
        if h.reserved != [0; 3] {
            return Err(DecodeError::ReservedNotZero);
        }
        let addressed = h.rkey != 0 || h.secret != 0 || h.offset != 0;
        let ok = match h.op {
            rma_op::WRITE => h.len == 0 && h.cookie == 0,
            rma_op::WRITE_IMM => h.len == 0,
            rma_op::READ_REQ => total_len == RmaHeader::SIZE as u64,
            rma_op::READ_RESP => h.len == 0 && !addressed,
            rma_op::RDV_READ => total_len == RmaHeader::SIZE as u64 && h.rkey == 0 && h.secret == 0,
            _ => return Err(DecodeError::BadKind),
        };
        if !ok {
            return Err(DecodeError::ReservedNotZero);
        }
        Ok(h)
    }
}

/// [`RbcastHeader::kind`] values.
pub mod rbcast_kind {
    /// A broadcast message (`seq` = its number in its root's sequence).
    pub const DATA: u8 = 1;
    /// A cumulative ACK: the sender holds every message of `root` below `seq`.
    pub const ACK: u8 = 2;
    /// A root at zero credit for the receiver asks for its re-post count
    /// (answered with an ACK to the sender).
    pub const POLL: u8 = 3;
    /// NAK-based reliability (§9): the sender lacks `root`'s messages
    /// `seq .. seq + span` (and holds every one below `seq`: also a
    /// cumulative ACK), to its collector.
    pub const NAK: u8 = 4;
    /// NAK-based reliability: a root's multicast announcement that its
    /// messages below `seq` were sent, so a member that lost the last ones
    /// (no later message shows the gap) NAKs them.
    pub const ANNOUNCE: u8 = 5;
}

/// [`RbcastHeader::flags`] bits.
pub mod rbcast_flag {
    /// `ack_root` / `ack_next` carry a piggybacked cumulative ACK (DATA only).
    pub const PIGGY_ACK: u8 = 1 << 0;
    /// A co-root copy sent over the reliable point-to-point path (inside a
    /// `COLL_DATA` message, never in an `RBCAST` frame).
    pub const P2P: u8 = 1 << 1;
    /// DATA: the root's scheme has NAKs (`RbcastAlgo::nak`): members NAK
    /// gaps in its sequence.
    pub const NAK: u8 = 1 << 2;
    /// DATA: a repair, unicast to one member in an `RBCAST` frame, off the
    /// ordered point-to-point stream (so it never waits behind a message
    /// the member refuses); unreliable, repeated by the collector until
    /// the member's ACK.
    pub const REPAIR: u8 = 1 << 3;
    /// All defined flags.
    pub const ALL: u8 = PIGGY_ACK | P2P | NAK | REPAIR;
}

le_struct! {
    /// Header of a reliable-broadcast frame (seed 002), after the
    /// [`FrameHeader`] of an `RBCAST` frame or after the `CollHeader` of a
    /// point-to-point copy (44 bytes). Ranks are group ranks. A message
    /// larger than one frame travels as `frags` fragments with consecutive
    /// `seq`, each its own window entry (§4.5).
    pub struct RbcastHeader {
        /// Group id.
        pub group_id: u32,
        /// Group epoch.
        pub epoch: u32,
        /// DATA: the message's number in its root's sequence (from 0).
        /// ACK: every message of `root` below it is held (cumulative).
        pub seq: u32,
        /// Receive buffers the sender re-posted so far in this group
        /// (cumulative; the multicast credits of §5.4, piggybacked).
        pub reposted: u32,
        /// With [`rbcast_flag::PIGGY_ACK`]: a cumulative ACK for `ack_root`.
        pub ack_next: u32,
        /// Data bytes after the header.
        pub len: u16,
        /// Root rank of the message (DATA) or of the acknowledged sequence (ACK).
        pub root: u16,
        /// Sender's rank.
        pub sender: u16,
        /// With [`rbcast_flag::PIGGY_ACK`]: the root `ack_next` is for.
        pub ack_root: u16,
        /// [`rbcast_kind`].
        pub kind: u8,
        /// [`rbcast_flag`] bits.
        pub flags: u8,
        /// DATA: ACK every this many messages (§4.4), at least 1.
        pub ack_every: u8,
        /// Zero.
        pub reserved: u8,
        /// DATA: the root's co-root count (§4.3), 0 = the root alone.
        pub coroots: u16,
        /// DATA: this fragment's index in its message (from 0).
        pub frag: u16,
        /// DATA: fragments of the message, at least 1.
        pub frags: u16,
        /// NAK: messages missing from `seq` on (at least 1).
        pub span: u16,
        /// DATA: bytes of the whole message (every fragment).
        pub msg_len: u32,
    }
    size = 44;
}

impl RbcastHeader {
    /// Decodes and validates a header from untrusted bytes followed by
    /// exactly `len` data bytes.
    pub fn parse(b: &[u8]) -> Result<RbcastHeader, DecodeError> {
        let h = RbcastHeader::decode(b)?;
        if h.flags & !rbcast_flag::ALL != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        let ranks = crate::coll::GROUP_MEMBERS_MAX;
        if h.root as usize >= ranks || h.sender as usize >= ranks || h.ack_root as usize >= ranks {
            return Err(DecodeError::BadIndex);
        }
        if h.reserved != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        let (p2p, repair) = (h.flags & rbcast_flag::P2P != 0, h.flags & rbcast_flag::REPAIR != 0);
        if repair && (p2p || h.kind != rbcast_kind::DATA) {
            return Err(DecodeError::ReservedNotZero);
        }
        let control_zero = h.len == 0
            && h.flags == 0
            && h.coroots == 0
            && h.ack_every == 0
            && h.frag == 0
            && h.frags == 0
            && h.msg_len == 0;
        match h.kind {
            rbcast_kind::DATA
                if h.ack_every >= 1
                    && (h.coroots as usize) < ranks
                    && h.frag < h.frags
                    && h.span == 0
                    && h.len as u32 <= h.msg_len => {}
            rbcast_kind::ACK | rbcast_kind::POLL if control_zero && h.span == 0 => {}
            // The root's scheme rides along, as on its DATA.
            rbcast_kind::ANNOUNCE
                if h.len == 0
                    && h.flags == rbcast_flag::NAK
                    && h.ack_every >= 1
                    && (h.coroots as usize) < ranks
                    && h.frag == 0
                    && h.frags == 0
                    && h.span == 0
                    && h.msg_len == 0 => {}
            rbcast_kind::NAK if control_zero && h.span >= 1 => {}
            rbcast_kind::DATA | rbcast_kind::ACK | rbcast_kind::POLL | rbcast_kind::NAK | rbcast_kind::ANNOUNCE => {
                return Err(DecodeError::ReservedNotZero)
            }
            _ => return Err(DecodeError::BadKind),
        }
        if h.flags & rbcast_flag::PIGGY_ACK == 0 && (h.ack_root != 0 || h.ack_next != 0) {
            return Err(DecodeError::ReservedNotZero);
        }
        if b.len() != RbcastHeader::SIZE + h.len as usize {
            return Err(DecodeError::BadLength);
        }
        Ok(h)
    }
}

/// Writes an RBCAST frame (`hdr.payload_len` must equal `body.len` and
/// `data.len()`) into `out`; returns its length.
pub fn emit_rbcast(hdr: &FrameHeader, body: &RbcastHeader, data: &[u8], out: &mut [u8]) -> Result<usize, DecodeError> {
    debug_assert_eq!(hdr.kind, FrameKind::Rbcast as u8);
    let len = FrameHeader::SIZE + RbcastHeader::SIZE + data.len();
    if hdr.payload_len as usize != data.len() || body.len as usize != data.len() {
        return Err(DecodeError::BadLength);
    }
    if out.len() < len {
        return Err(DecodeError::Truncated);
    }
    hdr.encode(out)?;
    body.encode(&mut out[FrameHeader::SIZE..])?;
    out[FrameHeader::SIZE + RbcastHeader::SIZE..len].copy_from_slice(data);
    Ok(len)
}

/// Bytes of data one reliable broadcast message carries at `mtu`: it must
/// fit one multicast frame and one point-to-point copy (frame 0 of a
/// `COLL_DATA` message, behind its `CollHeader`).
pub const fn rbcast_payload_max(mtu: u32) -> usize {
    payload_capacity(mtu, 0) - crate::coll::CollHeader::SIZE - RbcastHeader::SIZE
}

/// Bytes of headers before the payload in a DATA frame.
pub const fn data_header_len(frame_index: u32) -> usize {
    if frame_index == 0 {
        FrameHeader::SIZE + MsgHeader::SIZE
    } else {
        FrameHeader::SIZE
    }
}

/// Payload bytes one DATA frame carries at `mtu` (frame 0 carries less).
pub const fn payload_capacity(mtu: u32, frame_index: u32) -> usize {
    mtu as usize - data_header_len(frame_index)
}

/// Number of frames a message of `len` bytes needs at `mtu` (at least one:
/// a zero-length message is one frame).
pub const fn frames_for(len: u64, mtu: u32) -> u64 {
    let first = payload_capacity(mtu, 0) as u64;
    if len <= first {
        1
    } else {
        let rest = payload_capacity(mtu, 1) as u64;
        1 + (len - first).div_ceil(rest)
    }
}

/// Byte offset within the message of the first payload byte of `frame_index`.
pub const fn frame_offset(frame_index: u32, mtu: u32) -> u64 {
    if frame_index == 0 {
        0
    } else {
        payload_capacity(mtu, 0) as u64 + (frame_index as u64 - 1) * payload_capacity(mtu, 1) as u64
    }
}

/// Frames `[first, end)` of group `group` of a message of `frame_count`
/// frames, groups being `group_size` frames acknowledged together (the
/// last group may be shorter). Sender and receiver must agree on it: ACKs
/// and NACKs name groups.
pub const fn group_range(group_size: u32, frame_count: u32, group: u32) -> (u32, u32) {
    let first = group * group_size;
    let end = first + group_size;
    (first, if end < frame_count { end } else { frame_count })
}

/// A validated frame, borrowing its payload from the received bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A data frame; `msg` is present exactly when `hdr.frame_index == 0`.
    Data { hdr: FrameHeader, msg: Option<MsgHeader>, payload: &'a [u8] },
    /// An acknowledgement.
    Ack { hdr: FrameHeader, body: AckBody },
    /// A negative acknowledgement with its reason.
    Nack { hdr: FrameHeader, body: AckBody, reason: NackReason },
    /// A remote atomic request.
    AtomicReq { hdr: FrameHeader, body: AtomicBody },
    /// A remote atomic response.
    AtomicResp { hdr: FrameHeader, result: AtomicResult },
    /// A reliable-broadcast data frame or ACK.
    Rbcast { hdr: FrameHeader, body: RbcastHeader, data: &'a [u8] },
}

impl<'a> Frame<'a> {
    /// Parses and validates a frame from untrusted bytes. Never panics.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let hdr = FrameHeader::decode(bytes)?;
        if hdr.version != WIRE_VERSION {
            return Err(DecodeError::BadVersion);
        }
        if bytes.len() > MTU_MAX as usize {
            return Err(DecodeError::BadLength);
        }
        let rest = &bytes[FrameHeader::SIZE..];
        match FrameKind::from_u8(hdr.kind).ok_or(DecodeError::BadKind)? {
            kind @ (FrameKind::Data | FrameKind::CollData | FrameKind::Rma) => {
                if hdr.frame_count == 0 || hdr.frame_index >= hdr.frame_count {
                    return Err(DecodeError::BadIndex);
                }
                let (msg, payload) = if hdr.frame_index == 0 {
                    let msg = MsgHeader::decode(rest)?;
                    if msg.flags & !MSG_IMM != 0 || (msg.flags & MSG_IMM == 0 && msg.imm != 0) {
                        return Err(DecodeError::ReservedNotZero);
                    }
                    (Some(msg), &rest[MsgHeader::SIZE..])
                } else {
                    (None, rest)
                };
                if payload.len() != hdr.payload_len as usize {
                    return Err(DecodeError::BadLength);
                }
                if let Some(m) = msg {
                    // A message that claims more frames than its length could
                    // need (at the smallest MTU) is malformed.
                    if m.total_len < hdr.payload_len as u64 || hdr.frame_count as u64 > frames_for(m.total_len, MTU_MIN)
                    {
                        return Err(DecodeError::BadLength);
                    }
                    if kind == FrameKind::CollData {
                        // The collective header leads the message.
                        if m.total_len < crate::coll::CollHeader::SIZE as u64 {
                            return Err(DecodeError::BadLength);
                        }
                        crate::coll::CollHeader::parse(payload)?;
                    }
                    if kind == FrameKind::Rma {
                        // The RMA header leads the message, whole in frame 0.
                        if m.total_len < RmaHeader::SIZE as u64 {
                            return Err(DecodeError::BadLength);
                        }
                        RmaHeader::parse(payload, m.total_len)?;
                    }
                }
                Ok(Frame::Data { hdr, msg, payload })
            }
            kind @ (FrameKind::Ack | FrameKind::Nack) => {
                if hdr.payload_len != 0 {
                    return Err(DecodeError::BadLength);
                }
                let body = AckBody::decode(rest)?;
                if rest.len() != AckBody::SIZE {
                    return Err(DecodeError::BadLength);
                }
                if kind == FrameKind::Ack {
                    if body.reason != 0 || body.missing_mask != 0 {
                        return Err(DecodeError::ReservedNotZero);
                    }
                    Ok(Frame::Ack { hdr, body })
                } else {
                    let reason = NackReason::from_u8(body.reason).ok_or(DecodeError::BadKind)?;
                    Ok(Frame::Nack { hdr, body, reason })
                }
            }
            FrameKind::AtomicReq => {
                if hdr.payload_len != 0 || rest.len() != AtomicBody::SIZE {
                    return Err(DecodeError::BadLength);
                }
                let body = AtomicBody::decode(rest)?;
                let known = matches!(body.op, atomic_op::FETCH_ADD | atomic_op::CMP_SWAP | atomic_op::SWAP);
                if !known {
                    return Err(DecodeError::BadKind);
                }
                if body.reserved != 0 || body.reserved2 != 0 || (body.op != atomic_op::CMP_SWAP && body.compare != 0) {
                    return Err(DecodeError::ReservedNotZero);
                }
                if body.width != 4 && body.width != 8 {
                    return Err(DecodeError::BadLength);
                }
                Ok(Frame::AtomicReq { hdr, body })
            }
            FrameKind::AtomicResp => {
                if hdr.payload_len != 0 || rest.len() != AtomicResult::SIZE {
                    return Err(DecodeError::BadLength);
                }
                let result = AtomicResult::decode(rest)?;
                if result.reserved != [0; 7] {
                    return Err(DecodeError::ReservedNotZero);
                }
                Ok(Frame::AtomicResp { hdr, result })
            }
            FrameKind::Rbcast => {
                let body = RbcastHeader::parse(rest)?;
                if hdr.payload_len != body.len || hdr.frame_index != 0 || hdr.frame_count != 1 {
                    return Err(DecodeError::BadLength);
                }
                if body.flags & rbcast_flag::P2P != 0 {
                    return Err(DecodeError::ReservedNotZero);
                }
                Ok(Frame::Rbcast { hdr, body, data: &rest[RbcastHeader::SIZE..] })
            }
        }
    }

    /// The frame header.
    pub fn header(&self) -> &FrameHeader {
        match self {
            Frame::Data { hdr, .. }
            | Frame::Ack { hdr, .. }
            | Frame::Nack { hdr, .. }
            | Frame::AtomicReq { hdr, .. }
            | Frame::AtomicResp { hdr, .. }
            | Frame::Rbcast { hdr, .. } => hdr,
        }
    }

    /// The header, to rewrite (a NIC names the local slot in `dst_port`
    /// once it resolved the wire address).
    pub fn header_mut(&mut self) -> &mut FrameHeader {
        match self {
            Frame::Data { hdr, .. }
            | Frame::Ack { hdr, .. }
            | Frame::Nack { hdr, .. }
            | Frame::AtomicReq { hdr, .. }
            | Frame::AtomicResp { hdr, .. }
            | Frame::Rbcast { hdr, .. } => hdr,
        }
    }
}

/// Writes the headers of a DATA frame into `out` and returns the offset where
/// the payload (`hdr.payload_len` bytes) goes. `msg` must be `Some` exactly
/// for frame 0.
pub fn emit_data_headers(hdr: &FrameHeader, msg: Option<&MsgHeader>, out: &mut [u8]) -> Result<usize, DecodeError> {
    debug_assert!(matches!(FrameKind::from_u8(hdr.kind), Some(FrameKind::Data | FrameKind::CollData | FrameKind::Rma)));
    debug_assert_eq!(msg.is_some(), hdr.frame_index == 0);
    let head = data_header_len(hdr.frame_index);
    if out.len() < head + hdr.payload_len as usize {
        return Err(DecodeError::Truncated);
    }
    hdr.encode(out)?;
    if let Some(m) = msg {
        m.encode(&mut out[FrameHeader::SIZE..])?;
    }
    Ok(head)
}

/// Writes an ACK or NACK frame into `out`; returns its length.
pub fn emit_ack(hdr: &FrameHeader, body: &AckBody, out: &mut [u8]) -> Result<usize, DecodeError> {
    debug_assert!(hdr.kind == FrameKind::Ack as u8 || hdr.kind == FrameKind::Nack as u8);
    let len = FrameHeader::SIZE + AckBody::SIZE;
    if out.len() < len {
        return Err(DecodeError::Truncated);
    }
    hdr.encode(out)?;
    body.encode(&mut out[FrameHeader::SIZE..])?;
    Ok(len)
}

/// Writes an ATOMIC_REQ frame into `out`; returns its length.
pub fn emit_atomic_req(hdr: &FrameHeader, body: &AtomicBody, out: &mut [u8]) -> Result<usize, DecodeError> {
    debug_assert_eq!(hdr.kind, FrameKind::AtomicReq as u8);
    if out.len() < FrameHeader::SIZE + AtomicBody::SIZE {
        return Err(DecodeError::Truncated);
    }
    hdr.encode(out)?;
    body.encode(out.get_mut(FrameHeader::SIZE..).ok_or(DecodeError::Truncated)?)?;
    Ok(FrameHeader::SIZE + AtomicBody::SIZE)
}

/// Writes an ATOMIC_RESP frame into `out`; returns its length.
pub fn emit_atomic_resp(hdr: &FrameHeader, result: &AtomicResult, out: &mut [u8]) -> Result<usize, DecodeError> {
    debug_assert_eq!(hdr.kind, FrameKind::AtomicResp as u8);
    if out.len() < FrameHeader::SIZE + AtomicResult::SIZE {
        return Err(DecodeError::Truncated);
    }
    hdr.encode(out)?;
    result.encode(out.get_mut(FrameHeader::SIZE..).ok_or(DecodeError::Truncated)?)?;
    Ok(FrameHeader::SIZE + AtomicResult::SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendezvous_pull_names_a_message_not_a_key() {
        let h = RmaHeader { op: rma_op::RDV_READ, offset: 7, len: 4096, cookie: 9, ..Default::default() };
        let mut b = [0u8; RmaHeader::SIZE];
        h.put(&mut b);
        assert_eq!(RmaHeader::parse(&b, RmaHeader::SIZE as u64), Ok(h));
        assert!(RmaHeader::parse(&b, RmaHeader::SIZE as u64 + 1).is_err(), "a pull carries no data");
        let keyed = RmaHeader { rkey: 5, ..h };
        keyed.put(&mut b);
        assert!(RmaHeader::parse(&b, RmaHeader::SIZE as u64).is_err(), "a pull carries no key");
        assert_eq!(NackReason::from_u8(NackReason::Retained as u8), Some(NackReason::Retained));
    }

    #[test]
    fn multicast_addresses_are_above_node_ids() {
        assert!(!is_mcast(MCAST_BASE - 1) && is_mcast(MCAST_BASE) && is_mcast(MCAST_BASE + MCAST_GROUPS - 1));
        assert!(!is_mcast(MCAST_BASE + MCAST_GROUPS) && !is_mcast(u16::MAX));
        assert_eq!((mcast_group(MCAST_BASE + 0x102), mcast_group(7)), (Some(0x102), None));
        let m = mcast_mac(MCAST_BASE + 0x102);
        assert_eq!(m, [0x03, 0x00, 0xc6, 0x12, 0x01, 0x02]);
        assert_eq!(m[0] & 3, 3, "group and locally administered bits");
    }

    /// Byte-exact fixture: an ACK for group 2 of message 7, 0 -> 1.
    static ACK_BYTES: [u8; 48] = [
        6, 2, 0, 0, // version, kind, dst_gen
        0, 0, 1, 0, // src_node 0, dst_node 1
        3, 0, 4, 0, // src_port 3, dst_port 4
        9, 0, 0, 0, // src_gen 9, payload_len 0
        7, 0, 0, 0, // msg_seq
        5, 0, 0, 0, // tx_floor
        6, 0, 0, 0, // frame_index
        10, 0, 0, 0, // frame_count
        2, 0, 0, 0, // group
        0, 0, 0, 0, // missing_mask
        12, 0, 0, 1, // rx_credits 12, reason 0, fc_level 1
        8, 0, 0, 0, // rx_expected
    ];

    fn ack_fixture() -> (FrameHeader, AckBody) {
        let hdr = FrameHeader {
            version: WIRE_VERSION,
            kind: FrameKind::Ack as u8,
            src_node: 0,
            dst_node: 1,
            src_port: 3,
            dst_port: 4,
            src_gen: 9,
            msg_seq: 7,
            tx_floor: 5,
            frame_index: 6,
            frame_count: 10,
            ..Default::default()
        };
        let body = AckBody { group: 2, rx_credits: 12, fc_level: 1, rx_expected: 8, ..Default::default() };
        (hdr, body)
    }

    #[test]
    fn test_ack_construct() {
        let (hdr, body) = ack_fixture();
        let mut out = [0u8; 64];
        let n = emit_ack(&hdr, &body, &mut out).unwrap();
        assert_eq!(&out[..n], &ACK_BYTES[..]);
    }

    #[test]
    fn test_ack_deconstruct() {
        let (hdr, body) = ack_fixture();
        assert_eq!(Frame::parse(&ACK_BYTES).unwrap(), Frame::Ack { hdr, body });
    }

    #[test]
    fn group_range_cuts_the_last_group_short() {
        assert_eq!(group_range(3, 8, 0), (0, 3));
        assert_eq!(group_range(3, 8, 2), (6, 8));
        assert_eq!(group_range(3, 9, 2), (6, 9));
        assert_eq!(group_range(1, 1, 0), (0, 1));
    }

    #[test]
    fn frames_for_boundaries() {
        let mtu = 1500;
        let first = payload_capacity(mtu, 0) as u64;
        let rest = payload_capacity(mtu, 1) as u64;
        assert_eq!(frames_for(0, mtu), 1);
        assert_eq!(frames_for(first, mtu), 1);
        assert_eq!(frames_for(first + 1, mtu), 2);
        assert_eq!(frames_for(first + rest, mtu), 2);
        assert_eq!(frames_for(first + rest + 1, mtu), 3);
        assert_eq!(frame_offset(2, mtu), first + rest);
    }

    #[test]
    fn data_frame_rejects_bad_lengths() {
        let hdr = FrameHeader { version: WIRE_VERSION, kind: 1, frame_count: 1, payload_len: 4, ..Default::default() };
        let msg = MsgHeader::new(1, 4, None);
        let mut buf = [0u8; 64];
        let at = emit_data_headers(&hdr, Some(&msg), &mut buf).unwrap();
        assert!(Frame::parse(&buf[..at + 4]).is_ok());
        assert_eq!(Frame::parse(&buf[..at + 3]), Err(DecodeError::BadLength));
        assert_eq!(Frame::parse(&buf[..10]), Err(DecodeError::Truncated));
        buf[0] = 1;
        assert_eq!(Frame::parse(&buf[..at + 4]), Err(DecodeError::BadVersion));
    }

    #[test]
    fn immediate_data_rides_in_the_message_header() {
        let hdr = FrameHeader { version: WIRE_VERSION, kind: 1, frame_count: 1, payload_len: 4, ..Default::default() };
        let msg = MsgHeader::new(9, 4, Some(0xdead_beef));
        let mut buf = [0u8; 64];
        let at = emit_data_headers(&hdr, Some(&msg), &mut buf).unwrap();
        match Frame::parse(&buf[..at + 4]) {
            Ok(Frame::Data { msg: Some(m), .. }) => assert_eq!(m.imm(), Some(0xdead_beef)),
            other => panic!("{other:?}"),
        }
        let bare = MsgHeader { imm: 5, ..MsgHeader::new(9, 4, None) };
        emit_data_headers(&hdr, Some(&bare), &mut buf).unwrap();
        assert_eq!(Frame::parse(&buf[..at + 4]), Err(DecodeError::ReservedNotZero), "imm without MSG_IMM");
        let odd = MsgHeader { flags: 2, ..msg };
        emit_data_headers(&hdr, Some(&odd), &mut buf).unwrap();
        assert_eq!(Frame::parse(&buf[..at + 4]), Err(DecodeError::ReservedNotZero), "unknown flag");
    }

    #[test]
    fn coll_data_needs_a_valid_coll_header() {
        use crate::coll::CollHeader;
        let ch = CollHeader { group_id: 1, epoch: 1, kind: 2, ..Default::default() };
        let hdr = FrameHeader {
            version: WIRE_VERSION,
            kind: FrameKind::CollData as u8,
            frame_count: 1,
            payload_len: CollHeader::SIZE as u16,
            ..Default::default()
        };
        let msg = MsgHeader::new(0, CollHeader::SIZE as u64, None);
        let mut buf = [0u8; 128];
        let at = emit_data_headers(&hdr, Some(&msg), &mut buf).unwrap();
        let end = at + CollHeader::SIZE;
        ch.put(&mut buf[at..end]);
        assert!(matches!(Frame::parse(&buf[..end]), Ok(Frame::Data { .. })));
        buf[at + 12] = 99; // unknown collective kind
        assert_eq!(Frame::parse(&buf[..end]), Err(DecodeError::BadKind));
    }

    #[test]
    fn atomic_frames_round_trip_and_validate() {
        let hdr =
            FrameHeader { version: WIRE_VERSION, kind: FrameKind::AtomicReq as u8, msg_seq: 3, ..Default::default() };
        let body = AtomicBody {
            op: atomic_op::CMP_SWAP,
            width: 8,
            rkey: 5,
            offset: 16,
            operand: 2,
            compare: 1,
            ..Default::default()
        };
        let mut out = [0u8; 80];
        let n = emit_atomic_req(&hdr, &body, &mut out).unwrap();
        assert_eq!(n, 72);
        assert_eq!(Frame::parse(&out[..n]), Ok(Frame::AtomicReq { hdr, body }));
        let mut bad = out;
        bad[FrameHeader::SIZE + 1] = 3; // width 3
        assert_eq!(Frame::parse(&bad[..n]), Err(DecodeError::BadLength));
        let swap = AtomicBody { op: atomic_op::SWAP, ..body };
        emit_atomic_req(&hdr, &swap, &mut out).unwrap();
        assert_eq!(Frame::parse(&out[..n]), Err(DecodeError::ReservedNotZero), "compare must be 0 for swap");
        let rh = FrameHeader { kind: FrameKind::AtomicResp as u8, ..hdr };
        let res = AtomicResult { status: 0, old: 42, ..Default::default() };
        let n = emit_atomic_resp(&rh, &res, &mut out).unwrap();
        assert_eq!(Frame::parse(&out[..n]), Ok(Frame::AtomicResp { hdr: rh, result: res }));
        assert_eq!(Frame::parse(&out[..n - 1]), Err(DecodeError::BadLength));
    }
}
