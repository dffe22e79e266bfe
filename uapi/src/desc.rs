//! Work descriptors (host → NIC, in the port's rings in SRAM), completions
//! (NIC → host, in the completion queue in host memory), and the physically
//! addressed translation formats the driver (or daemon) writes into the MR
//! table for the NIC (EMP thesis §2.3.2: short, chained, indirect).

use crate::{le_struct, DecodeError, Le, ANY_NODE, ANY_PORT};

/// Scatter/gather entries carried inline in a work descriptor.
pub const SGE_MAX: usize = 6;

/// Work descriptor opcodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    /// Tagged send to (node, port). With [`WD_IMM`], `ignore` (at most
    /// 32 bits) is immediate data: the receive completion reports it
    /// ([`CQE_IMM`], `Cqe::imm`). Else `ignore` = 0.
    Send = 1,
    /// Tagged receive, matched on (source, tag & !ignore).
    Recv = 2,
    /// One message to several members of a group, payload read once.
    /// `node` = group slot, `port` = rank window w, `ignore` = mask of
    /// destination ranks 64 w .. 64 w + 63 (bit i = rank 64 w + i), `tag`.
    MultiSend = 3,
    /// Broadcast down a group tree, forwarded NIC to NIC. `node` = group
    /// slot, `port` = root rank, `tag` = tree index; `sge` = the buffer
    /// (the root's source, everyone else's destination).
    Bcast = 4,
    /// Barrier. `node` = group slot, `port` = [`crate::coll::BarrierAlgo`],
    /// `tag` = tree index (gather-release only). No `sge`.
    Barrier = 5,
    /// Reduce to `port` (root rank). `node` = group slot, `tag` =
    /// [`crate::coll::reduce_tag`] (dtype, op, tree), `ignore` = element
    /// count; `sge[0]` = input, `sge[1]` = result (root only).
    Reduce = 6,
    /// Reduce, then broadcast the result: as [`Opcode::Reduce`] with
    /// `port` = 0 and a result buffer on every member.
    Allreduce = 7,
    /// Remote atomic fetch-and-add at (`node`, `port`): `tag` = addend,
    /// `sge[0]` = local result word (its `len` is the width, 4 or 8),
    /// `sge[1]` = the remote word as a [`RemoteSge`].
    AtomicFetchAdd = 8,
    /// Remote compare-and-swap: `tag` = new value, `ignore` = compare.
    AtomicCmpSwap = 9,
    /// Remote swap: `tag` = new value.
    AtomicSwap = 10,
    /// Remote write (one-sided put) to (`node`, `port`): `sge[..n-1]` =
    /// local source, `sge[n-1]` = the remote region as a [`RemoteSge`]
    /// (`n` = `num_sge` ≥ 1; one entry alone writes zero bytes). With
    /// [`WD_IMM`], `tag` is immediate data: the target consumes a posted
    /// receive matching (initiator, `tag`) and completes it as
    /// [`Opcode::RecvRdmaImm`]. Else `tag` = 0.
    RdmaWrite = 11,
    /// Remote read (one-sided get): as [`Opcode::RdmaWrite`], `sge[..n-1]`
    /// = local destination; `tag` = 0.
    RdmaRead = 12,
    /// Completions only (never a descriptor): a posted receive consumed by
    /// a remote write with immediate data (`tag` = the immediate,
    /// `msg_len` = bytes written to the region, `byte_len` = 0).
    RecvRdmaImm = 13,
    /// Probe (receive ring): is there an unexpected message matching
    /// (`node`, `port`, `tag` & !`ignore`), as a receive would match it?
    /// No SGEs. Completes `Success` with the oldest such message's `tag`,
    /// source and `msg_len`, or [`Status::NoMessage`]; nothing is received.
    /// With [`WD_CLAIM`] the message is also claimed: later receives and
    /// probes pass it by, and only a claimed receive whose `tag` is the
    /// completion's `byte_len` (the claim handle) takes it.
    Probe = 14,
    /// Reliable broadcast over wire multicast (seed 002). `node` = group
    /// slot, `port` = root rank, `tag` = [`crate::coll::rbcast_tag`]
    /// (co-roots, ACK every M, window), `ignore` = 0; `sge` = the buffer
    /// (the root's source, everyone else's destination), at most
    /// [`crate::wire::rbcast_payload_max`] bytes. The root's completes as
    /// soon as its NIC copied the data into its window.
    Rbcast = 15,
    /// Cancel (receive ring): takes back the oldest receive posted on this
    /// port whose `wr_id` is `tag`, if the NIC still holds it unmatched.
    /// That receive then completes [`Status::Canceled`] and the cancel
    /// `Success`; else the cancel completes [`Status::NoMessage`] and the
    /// receive (matched, or not posted) completes as it would have. No
    /// SGEs; `node`, `port` and `ignore` are 0. Through the receive ring,
    /// so it comes after every receive posted before it.
    Cancel = 16,
    /// Start a persistent descriptor (EMP thesis §2.3.3, MPI_Start): the
    /// send (on the send ring) or receive (on the receive ring) this port
    /// stored with [`WD_PERSIST`] in slot `tag` of that ring's table runs
    /// as if posted now, with this descriptor's `wr_id`; its completion
    /// reports the stored opcode. The NIC reads only the slot's first
    /// [`START_BYTES`] (`wr_id`, `opcode`, `flags` = 0, `num_sge` = 0,
    /// `slot` = 0, `node` = 0, `port` = 0, `tag`): a re-post writes 24
    /// bytes, the NIC decodes and validates nothing else. An empty slot
    /// completes [`Status::BadDescriptor`].
    Start = 17,
}

impl Opcode {
    /// Decodes an opcode byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Opcode::Send),
            2 => Some(Opcode::Recv),
            3 => Some(Opcode::MultiSend),
            4 => Some(Opcode::Bcast),
            5 => Some(Opcode::Barrier),
            6 => Some(Opcode::Reduce),
            7 => Some(Opcode::Allreduce),
            8 => Some(Opcode::AtomicFetchAdd),
            9 => Some(Opcode::AtomicCmpSwap),
            10 => Some(Opcode::AtomicSwap),
            11 => Some(Opcode::RdmaWrite),
            12 => Some(Opcode::RdmaRead),
            13 => Some(Opcode::RecvRdmaImm),
            14 => Some(Opcode::Probe),
            15 => Some(Opcode::Rbcast),
            16 => Some(Opcode::Cancel),
            17 => Some(Opcode::Start),
            _ => None,
        }
    }

    /// A collective over a group (the descriptor's `node` is a group slot).
    pub const fn is_collective(self) -> bool {
        matches!(
            self,
            Opcode::MultiSend | Opcode::Bcast | Opcode::Barrier | Opcode::Reduce | Opcode::Allreduce | Opcode::Rbcast
        )
    }

    /// A remote atomic.
    pub const fn is_atomic(self) -> bool {
        matches!(self, Opcode::AtomicFetchAdd | Opcode::AtomicCmpSwap | Opcode::AtomicSwap)
    }

    /// A remote memory access: remote write or read.
    pub const fn is_rma(self) -> bool {
        matches!(self, Opcode::RdmaWrite | Opcode::RdmaRead)
    }

    /// Names another port's memory: the descriptor's last SGE is a [`RemoteSge`].
    pub const fn is_remote_access(self) -> bool {
        self.is_atomic() || self.is_rma()
    }
}

/// Descriptor flag: produce a completion (always on for receives).
pub const WD_SIGNALED: u8 = 1 << 0;
/// Descriptor flag: a remote write carries `tag` as immediate data; a
/// send carries `ignore` (32 bits) as immediate data.
pub const WD_IMM: u8 = 1 << 1;
/// Descriptor flag: on a probe, claim the message found; on a receive,
/// take the claimed message whose handle is `tag` (`node`, `port` and
/// `ignore` zero).
pub const WD_CLAIM: u8 = 1 << 2;
/// Descriptor flag: on a send or receive, store it in slot `slot` of its
/// ring's persistent table (replacing what was there) instead of running
/// it; [`Opcode::Start`] runs it, as often as the host likes. A store
/// reports only a failure; the stored `WD_SIGNALED` applies to each start.
/// Not with [`WD_CLAIM`].
pub const WD_PERSIST: u8 = 1 << 3;
/// All defined descriptor flags.
pub const WD_FLAGS_ALL: u8 = WD_SIGNALED | WD_IMM | WD_CLAIM | WD_PERSIST;
/// Slots of each ring's persistent table, per port.
pub const PERSIST_SLOTS: usize = 32;
/// Bytes of a ring slot an [`Opcode::Start`] is read from (through `tag`).
pub const START_BYTES: usize = 24;

le_struct! {
    /// One scatter/gather element: `len` bytes at `offset` within the memory
    /// region named by `key` (16 bytes).
    pub struct Sge {
        /// Memory region key (from registration).
        pub key: u32,
        /// Length in bytes.
        pub len: u32,
        /// Offset within the region.
        pub offset: u64,
    }
    size = 16;
}

le_struct! {
    /// The remote end of a remote-access descriptor (atomics, remote write
    /// and read), in the descriptor's last scatter/gather slot (16 bytes,
    /// the size of an [`Sge`]): the target's region `key`, the `secret`
    /// registered with it (see [`MrEntry::make_key`]) and the `offset`
    /// within it. The length is the local side's.
    pub struct RemoteSge {
        /// The target's memory region key.
        pub key: u32,
        /// The region's remote-access secret.
        pub secret: u32,
        /// Offset within the target's region.
        pub offset: u64,
    }
    size = 16;
}

impl RemoteSge {
    /// Its encoding in a descriptor's SGE slot.
    pub const fn to_sge(self) -> Sge {
        Sge { key: self.key, len: self.secret, offset: self.offset }
    }

    /// Reads a descriptor's SGE slot as the remote end.
    pub const fn from_sge(s: Sge) -> RemoteSge {
        RemoteSge { key: s.key, secret: s.len, offset: s.offset }
    }
}

le_struct! {
    /// A send or receive work descriptor (128 bytes), written by the host
    /// into a port ring slot in SRAM; the NIC copies it when it consumes the
    /// slot.
    pub struct WorkDesc {
        /// Caller's cookie, echoed in the completion.
        pub wr_id: u64,
        /// [`Opcode`].
        pub opcode: u8,
        /// `WD_*` flags.
        pub flags: u8,
        /// Valid entries in `sge`.
        pub num_sge: u8,
        /// With [`WD_PERSIST`], the persistent slot it is stored in (below
        /// [`PERSIST_SLOTS`]); else zero.
        pub slot: u8,
        /// Send: destination node. Receive: source node or [`ANY_NODE`].
        pub node: u16,
        /// Send: destination port. Receive: source port or [`ANY_PORT`].
        pub port: u16,
        /// Tag sent / tag wanted.
        pub tag: u64,
        /// Receive: bits set here are ignored when matching the tag. Send:
        /// the immediate data with [`WD_IMM`] (at most 32 bits), else zero.
        pub ignore: u64,
        /// Scatter/gather list.
        pub sge: [Sge; SGE_MAX],
    }
    size = 128;
}

impl WorkDesc {
    /// Validates a descriptor read from a host-writable ring. Checks only
    /// what can be checked without the MR table.
    pub fn validate(&self) -> Result<Opcode, DecodeError> {
        let op = Opcode::from_u8(self.opcode).ok_or(DecodeError::BadKind)?;
        if self.flags & WD_PERSIST == 0 && self.slot != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        if self.flags & !WD_FLAGS_ALL != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        if self.num_sge as usize > SGE_MAX {
            return Err(DecodeError::BadIndex);
        }
        if self.flags & WD_IMM != 0 && !matches!(op, Opcode::RdmaWrite | Opcode::Send) {
            return Err(DecodeError::ReservedNotZero);
        }
        if self.flags & WD_CLAIM != 0 && !matches!(op, Opcode::Probe | Opcode::Recv) {
            return Err(DecodeError::ReservedNotZero);
        }
        if self.flags & WD_PERSIST != 0
            && (!matches!(op, Opcode::Send | Opcode::Recv)
                || self.flags & WD_CLAIM != 0
                || self.slot as usize >= PERSIST_SLOTS)
        {
            return Err(DecodeError::BadIndex);
        }
        if op == Opcode::Recv
            && self.flags & WD_CLAIM != 0
            && (self.node != 0 || self.port != 0 || self.ignore != 0 || self.tag > u32::MAX as u64)
        {
            return Err(DecodeError::BadIndex);
        }
        if op == Opcode::Send && (self.node == ANY_NODE || self.port == ANY_PORT) {
            return Err(DecodeError::BadIndex);
        }
        if op == Opcode::Send && self.ignore > if self.flags & WD_IMM != 0 { u32::MAX as u64 } else { 0 } {
            return Err(DecodeError::BadIndex);
        }
        self.validate_operands(op)?;
        let unused = &self.sge[self.num_sge as usize..];
        if unused.iter().any(|s| *s != Sge::default()) {
            return Err(DecodeError::ReservedNotZero);
        }
        if self.local_sges().iter().any(|s| s.offset.checked_add(s.len as u64).is_none()) {
            return Err(DecodeError::BadLength);
        }
        if op.is_rma() && self.remote().offset.checked_add(self.total_len()).is_none() {
            return Err(DecodeError::BadLength);
        }
        Ok(op)
    }

    /// A start read from the first [`START_BYTES`] of a ring slot: the
    /// rest of the slot (what an earlier descriptor left) is not its.
    pub fn from_start_head(head: &[u8; START_BYTES]) -> WorkDesc {
        let mut b = [0u8; WorkDesc::SIZE];
        b[..START_BYTES].copy_from_slice(head);
        WorkDesc::get(&b)
    }

    /// The SGEs that name this port's memory (all of them, but the last
    /// of a remote-access descriptor).
    pub fn local_sges(&self) -> &[Sge] {
        let n = (self.num_sge as usize).min(SGE_MAX);
        let remote = Opcode::from_u8(self.opcode).is_some_and(|op| op.is_remote_access());
        &self.sge[..if remote { n.saturating_sub(1) } else { n }]
    }

    /// The remote end of a remote-access descriptor (its last SGE).
    pub fn remote(&self) -> RemoteSge {
        let n = (self.num_sge as usize).clamp(1, SGE_MAX);
        RemoteSge::from_sge(self.sge[n - 1])
    }

    /// The per-opcode rules for the fields collectives and atomics reuse.
    fn validate_operands(&self, op: Opcode) -> Result<(), DecodeError> {
        use crate::coll::{BarrierAlgo, Dtype, ReduceOp, GROUP_MEMBERS_MAX, TREES_MAX};
        let n = self.num_sge;
        let ok = match op {
            Opcode::Send | Opcode::Recv => true,
            Opcode::Probe => n == 0,
            Opcode::Cancel => n == 0 && self.node == 0 && self.port == 0 && self.ignore == 0,
            Opcode::Start => {
                n == 0
                    && self.flags == 0
                    && self.node == 0
                    && self.port == 0
                    && self.ignore == 0
                    && self.tag < PERSIST_SLOTS as u64
            }
            Opcode::MultiSend => {
                (self.port as usize) < GROUP_MEMBERS_MAX.div_ceil(crate::coll::MULTISEND_WINDOW) && self.ignore != 0
            }
            Opcode::Bcast => {
                (self.port as usize) < GROUP_MEMBERS_MAX && self.tag < TREES_MAX as u64 && self.ignore == 0
            }
            Opcode::Rbcast => {
                (self.port as usize) < crate::coll::RBCAST_MEMBERS_MAX
                    && crate::coll::rbcast_algo(self.tag)
                        .is_some_and(|a| (a.coroots as usize) < crate::coll::RBCAST_MEMBERS_MAX)
                    && self.ignore == 0
            }
            Opcode::Barrier => {
                BarrierAlgo::from_u16(self.port).is_some() && self.tag < TREES_MAX as u64 && self.ignore == 0 && n == 0
            }
            Opcode::Reduce | Opcode::Allreduce => {
                let (dt, rop, tree) = crate::coll::reduce_tag_parts(self.tag);
                let root_ok =
                    if op == Opcode::Allreduce { self.port == 0 } else { (self.port as usize) < GROUP_MEMBERS_MAX };
                root_ok
                    && self.tag >> 24 == 0
                    && (tree as usize) < TREES_MAX
                    && Dtype::from_u8(dt).is_some()
                    && ReduceOp::from_u8(rop).is_some()
                    && self.ignore > 0
                    && self.ignore <= u32::MAX as u64
                    && (n == 1 || n == 2)
            }
            Opcode::AtomicFetchAdd | Opcode::AtomicCmpSwap | Opcode::AtomicSwap => {
                let (local, remote) = (self.sge[0], RemoteSge::from_sge(self.sge[1]));
                n == 2
                    && self.node != ANY_NODE
                    && self.port != ANY_PORT
                    && (local.len == 4 || local.len == 8)
                    && remote.offset % local.len as u64 == 0
                    && (op == Opcode::AtomicCmpSwap || self.ignore == 0)
                    && (local.len == 8 || (self.tag >> 32 == 0 && self.ignore >> 32 == 0))
            }
            Opcode::RdmaWrite | Opcode::RdmaRead => {
                n >= 1
                    && self.node != ANY_NODE
                    && self.port != ANY_PORT
                    && self.ignore == 0
                    && (self.flags & WD_IMM != 0 || self.tag == 0)
            }
            Opcode::RecvRdmaImm => false,
        };
        if ok {
            Ok(())
        } else {
            Err(DecodeError::BadIndex)
        }
    }

    /// A send's immediate data ([`WD_IMM`]), if it carries any.
    pub fn send_imm(&self) -> Option<u32> {
        (self.opcode == Opcode::Send as u8 && self.flags & WD_IMM != 0).then_some(self.ignore as u32)
    }

    /// Total bytes described by the local scatter/gather list.
    pub fn total_len(&self) -> u64 {
        self.local_sges().iter().map(|s| s.len as u64).sum()
    }

    /// Does a receive with this descriptor's filter accept a message from
    /// (node, port) with `tag`?
    pub fn matches(&self, node: u16, port: u16, tag: u64) -> bool {
        (self.node == ANY_NODE || self.node == node)
            && (self.port == ANY_PORT || self.port == port)
            && (self.tag ^ tag) & !self.ignore == 0
    }
}

/// Completion status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// Done.
    Success = 0,
    /// Receive buffer shorter than the message: the prefix was delivered.
    Truncated = 1,
    /// The destination port is not open (or closed during the transfer).
    RemotePortClosed = 2,
    /// No acknowledgement after the retry limit.
    RetryLimitExceeded = 3,
    /// A key does not name a valid region of this port.
    BadKey = 4,
    /// Offset/length outside the region, or access rights missing.
    AccessDenied = 5,
    /// The port was closed with this work outstanding.
    Flushed = 6,
    /// A NIC table (peers, messages) is full.
    TableFull = 7,
    /// Message larger than the NIC's limit.
    TooLarge = 8,
    /// The descriptor itself is malformed.
    BadDescriptor = 9,
    /// The sender abandoned a message this receive had matched.
    SenderAborted = 10,
    /// A DMA to or from host memory failed.
    DmaError = 11,
    /// Receiver-not-ready retries exhausted (only with a finite RNR limit).
    RnrRetryExceeded = 12,
    /// The remote peer table was full.
    RemoteTableFull = 13,
    /// No such group slot, not this port's, or the caller is not a member.
    GroupInvalid = 14,
    /// The group was re-created (new epoch) while the operation ran.
    StaleGroup = 15,
    /// The datatype and operation do not combine (bitwise on floats).
    InvalidOp = 16,
    /// Members disagree on the collective (kind, root, tree, type, op, count).
    CollMismatch = 17,
    /// The target refused a remote access: atomic, write or read (key,
    /// secret, rights, bounds, alignment; or the source was throttled for
    /// guessing keys).
    RemoteAccessError = 18,
    /// A probe found no unexpected message that matches; or a claimed
    /// receive names no message claimed on this port.
    NoMessage = 19,
    /// A receive taken back by an [`Opcode::Cancel`] before any message
    /// matched it.
    Canceled = 20,
}

impl Status {
    /// Decodes a status byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        use Status::*;
        Some(match v {
            0 => Success,
            1 => Truncated,
            2 => RemotePortClosed,
            3 => RetryLimitExceeded,
            4 => BadKey,
            5 => AccessDenied,
            6 => Flushed,
            7 => TableFull,
            8 => TooLarge,
            9 => BadDescriptor,
            10 => SenderAborted,
            11 => DmaError,
            12 => RnrRetryExceeded,
            13 => RemoteTableFull,
            14 => GroupInvalid,
            15 => StaleGroup,
            16 => InvalidOp,
            17 => CollMismatch,
            18 => RemoteAccessError,
            19 => NoMessage,
            20 => Canceled,
            _ => return None,
        })
    }

    /// Human-readable text, like `ibv_wc_status_str` (NUL-terminated for C).
    pub const fn as_cstr(self) -> &'static core::ffi::CStr {
        use Status::*;
        match self {
            Success => c"success",
            Truncated => c"message truncated",
            RemotePortClosed => c"remote port closed",
            RetryLimitExceeded => c"retry limit exceeded",
            BadKey => c"bad memory key",
            AccessDenied => c"access outside region or rights",
            Flushed => c"flushed: port closed",
            TableFull => c"NIC table full",
            TooLarge => c"message too large",
            BadDescriptor => c"malformed descriptor",
            SenderAborted => c"sender aborted the message",
            DmaError => c"DMA error",
            RnrRetryExceeded => c"receiver-not-ready retries exceeded",
            RemoteTableFull => c"remote NIC table full",
            GroupInvalid => c"unknown group, or caller not a member",
            StaleGroup => c"group re-created during the operation",
            InvalidOp => c"operation undefined for the datatype",
            CollMismatch => c"members disagree on the collective",
            RemoteAccessError => c"remote access refused by the target",
            NoMessage => c"no unexpected message matches",
            Canceled => c"receive canceled",
        }
    }

    /// Human-readable text, like `ibv_wc_status_str`.
    pub fn as_str(self) -> &'static str {
        self.as_cstr().to_str().unwrap_or("?")
    }
}

/// Completion flag: the owner bit; flips each time the CQ wraps (the host
/// knows an entry is new when it equals the expected phase).
pub const CQE_PHASE: u8 = 1 << 0;
/// Completion flag: a receive (or probe) of a message sent with immediate
/// data; `Cqe::imm` holds it.
pub const CQE_IMM: u8 = 1 << 1;

le_struct! {
    /// A completion queue entry (40 bytes), DMA-written by the NIC.
    ///
    /// Publication: the NIC writes bytes `0..31`, then a DMA fence, then
    /// `flags` — the entry's last byte, carrying the [`CQE_PHASE`] bit — on
    /// its own (mlx5's `op_own` is likewise a CQE's last byte). A host that
    /// reads `flags` with the phase it expects ([`crate::ring::cqe_is_new`])
    /// and then, after an acquire fence, the other bytes, never sees a torn
    /// entry, whatever order the bytes of one DMA become visible in.
    pub struct Cqe {
        /// The descriptor's cookie.
        pub wr_id: u64,
        /// Receive: the message's tag.
        pub tag: u64,
        /// Bytes transferred (receive: bytes delivered into the buffer).
        pub byte_len: u32,
        /// Receive: the message's full length (> byte_len when truncated).
        pub msg_len: u32,
        /// Receive or probe with [`CQE_IMM`]: the sender's immediate data.
        pub imm: u32,
        /// Reserved, zero.
        pub reserved1: u32,
        /// Receive: source node.
        pub src_node: u16,
        /// Receive: source port.
        pub src_port: u16,
        /// [`Status`].
        pub status: u8,
        /// [`Opcode`] of the completed descriptor.
        pub opcode: u8,
        /// Reserved, zero.
        pub reserved: u8,
        /// [`CQE_PHASE`] bit, [`CQE_IMM`]. The last byte, made visible last.
        pub flags: u8,
    }
    size = 40;
}

// A start is everything up to its `tag`.
const _: () = assert!(START_BYTES == core::mem::offset_of!(WorkDesc, ignore));

/// Byte offset of `Cqe::flags`: the entry's last byte, written last.
pub const CQE_FLAGS_OFFSET: usize = core::mem::offset_of!(Cqe, flags);
const _: () = assert!(CQE_FLAGS_OFFSET == Cqe::SIZE - 1, "the phase byte must be the CQE's last byte");

/// Translation formats of an MR table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum MrFormat {
    /// Entry unused.
    Invalid = 0,
    /// One segment of at most one page, inline.
    Short = 1,
    /// Up to [`MR_INLINE_SEGS`] segments inline.
    Chained = 2,
    /// Segments in host memory: `indirect_addr` is a page of [`PhysSeg`];
    /// a segment with [`SEG_LINK`] points at the next such page.
    Indirect = 3,
}

impl MrFormat {
    /// Decodes a format byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(MrFormat::Invalid),
            1 => Some(MrFormat::Short),
            2 => Some(MrFormat::Chained),
            3 => Some(MrFormat::Indirect),
            _ => None,
        }
    }
}

/// Segments held inline in an MR entry (EMP's chained format: 7 pages).
pub const MR_INLINE_SEGS: usize = 7;
/// [`PhysSeg`] entries per indirect page.
pub const SEGS_PER_PAGE: usize = crate::PAGE_SIZE / PhysSeg::SIZE;
/// Segment flag: `addr` is the next page of segments, not data.
pub const SEG_LINK: u32 = 1 << 0;

/// MR access: the NIC may read (local send source).
pub const MR_LOCAL_READ: u8 = 1 << 0;
/// MR access: the NIC may write (local receive target, completion queue).
pub const MR_LOCAL_WRITE: u8 = 1 << 1;
/// MR access: remote peers may read with the key.
pub const MR_REMOTE_READ: u8 = 1 << 2;
/// MR access: remote peers may write with the key.
pub const MR_REMOTE_WRITE: u8 = 1 << 3;
/// MR access: remote atomics with the key.
pub const MR_REMOTE_ATOMIC: u8 = 1 << 4;
/// All defined access bits.
pub const MR_ACCESS_ALL: u8 = 0x1F;

le_struct! {
    /// A physically addressed segment: `len` bytes at host physical (or DMA)
    /// address `addr` (16 bytes). EMP used 16-bit lengths; ours are 32-bit
    /// so contiguous runs longer than a page take one entry.
    pub struct PhysSeg {
        /// Host physical / DMA address.
        pub addr: u64,
        /// Length in bytes (0 only for a link).
        pub len: u32,
        /// `SEG_*` flags.
        pub flags: u32,
    }
    size = 16;
}

le_struct! {
    /// An MR (translation) table entry in SRAM (144 bytes). Written only by
    /// the trusted side (driver or daemon); the NIC reads it on every use.
    pub struct MrEntry {
        /// Key; the low 16 bits are this entry's index in the table.
        pub key: u32,
        /// Owning port.
        pub port: u16,
        /// `MR_*` access bits.
        pub access: u8,
        /// [`MrFormat`].
        pub format: u8,
        /// Bytes in the region.
        pub length: u64,
        /// Indirect: address of the first page of segments.
        pub indirect_addr: u64,
        /// Indirect: number of data segments (links not counted).
        pub indirect_count: u32,
        /// Remote-access secret: 32 unpredictable bits a remote peer must
        /// present with `key` (see [`RemoteSge`]); 0 in entries without
        /// remote rights is allowed but matches no real request.
        pub secret: u32,
        /// Short/Chained: the segments.
        pub segs: [PhysSeg; MR_INLINE_SEGS],
    }
    size = 144;
}

impl MrEntry {
    /// Index of the table slot a key names.
    pub const fn slot_of(key: u32) -> usize {
        (key & 0xFFFF) as usize
    }

    /// A fresh (key, secret) for table `slot`: advances the registering
    /// party's generator state `salt` (an LCG) and puts 15 of its bits,
    /// never zero, above the slot, so a stale key of a reused slot no longer
    /// matches; the secret is `random` (32 bits from the OS's generator:
    /// getrandom in emp-nicd, `get_random_u32` in the driver), never 0. A
    /// remote peer must present both, so a guess has at least 32
    /// unpredictable bits to find. The one generator: emp-nicd and the
    /// driver both call it.
    pub fn make_key(salt: &mut u32, slot: u16, random: u32) -> (u32, u32) {
        *salt = salt.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let key = (((*salt >> 8) & 0x7FFF) | 1) << 16 | slot as u32;
        (key, random.max(1))
    }

    /// Validates an entry the NIC is about to use; returns its format.
    pub fn validate(&self) -> Result<MrFormat, DecodeError> {
        let format = MrFormat::from_u8(self.format).ok_or(DecodeError::BadKind)?;
        if self.access & !MR_ACCESS_ALL != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        let inline = |n: usize| -> Result<(), DecodeError> {
            let sum: u64 = self.segs[..n].iter().map(|s| s.len as u64).sum();
            if self.segs[..n].iter().any(|s| s.flags != 0) || self.segs[n..].iter().any(|s| *s != PhysSeg::default()) {
                return Err(DecodeError::ReservedNotZero);
            }
            if sum != self.length {
                return Err(DecodeError::BadLength);
            }
            Ok(())
        };
        match format {
            MrFormat::Invalid => {}
            MrFormat::Short => {
                if self.length > crate::PAGE_SIZE as u64 {
                    return Err(DecodeError::BadLength);
                }
                inline(1)?;
            }
            MrFormat::Chained => {
                let n = self.segs.iter().take_while(|s| s.len != 0).count();
                inline(n)?;
            }
            MrFormat::Indirect => {
                if self.indirect_count == 0 || self.segs.iter().any(|s| *s != PhysSeg::default()) {
                    return Err(DecodeError::BadLength);
                }
            }
        }
        Ok(format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_desc_validation() {
        let mut d = WorkDesc { opcode: Opcode::Send as u8, num_sge: 1, node: 1, port: 2, ..Default::default() };
        d.sge[0] = Sge { key: 1, len: 10, offset: 0 };
        assert_eq!(d.validate(), Ok(Opcode::Send));
        d.sge[1].len = 1; // beyond num_sge
        assert_eq!(d.validate(), Err(DecodeError::ReservedNotZero));
        d.sge[1].len = 0;
        d.num_sge = 7;
        assert_eq!(d.validate(), Err(DecodeError::BadIndex));
        d.num_sge = 1;
        d.node = ANY_NODE;
        assert_eq!(d.validate(), Err(DecodeError::BadIndex));
    }

    #[test]
    fn send_immediate_data_is_32_bits_and_only_with_the_flag() {
        let mut d = WorkDesc { opcode: Opcode::Send as u8, num_sge: 1, node: 1, port: 2, ..Default::default() };
        d.sge[0] = Sge { key: 1, len: 10, offset: 0 };
        d.ignore = 7;
        assert_eq!(d.validate(), Err(DecodeError::BadIndex), "immediate data without WD_IMM");
        d.flags = WD_IMM;
        assert_eq!(d.validate(), Ok(Opcode::Send));
        assert_eq!(d.send_imm(), Some(7));
        d.ignore = u32::MAX as u64 + 1;
        assert_eq!(d.validate(), Err(DecodeError::BadIndex), "wider than 32 bits");
        d.ignore = 0;
        assert_eq!(d.send_imm(), Some(0));
        d.flags = 0;
        assert_eq!(d.send_imm(), None);
        let r = WorkDesc { opcode: Opcode::Recv as u8, flags: WD_IMM, ..Default::default() };
        assert_eq!(r.validate(), Err(DecodeError::ReservedNotZero), "WD_IMM on a receive");
    }

    #[test]
    fn matching_with_wildcards_and_mask() {
        let r = WorkDesc { node: ANY_NODE, port: 3, tag: 0xAB00, ignore: 0xFF, ..Default::default() };
        assert!(r.matches(7, 3, 0xAB42));
        assert!(!r.matches(7, 4, 0xAB42));
        assert!(!r.matches(7, 3, 0xAC42));
    }

    #[test]
    fn status_round_trip() {
        for v in 0..=255u8 {
            if let Some(s) = Status::from_u8(v) {
                assert_eq!(s as u8, v);
                assert!(!s.as_str().is_empty());
            }
        }
    }
}
