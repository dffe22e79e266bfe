//! The NIC memory map (SRAM). For a guest it is the ivshmem BAR2; for direct
//! attach a shared memfd. Offsets are computed once by [`Layout::new`] and
//! published in the [`SramHeader`], which the NIC validates at boot.
//!
//! ```text
//! 0x0000  SramHeader (page)            board signature, status, counters
//! 0x1000  AdminMailbox (page)          trusted host <-> NIC commands
//!         firmware staging area        image written here before boot
//!         MR table                     MrEntry × mr_entries
//!         route table                  RouteEntry × route_entries
//!         group table                  GroupEntry × group_entries
//!         port windows                 PortCtl page + send ring + recv ring, × ports
//! ```
//! Each field says who writes it. Producer and consumer indices live on
//! separate cache lines.

use crate::desc::{MrEntry, WorkDesc};
use crate::ring;
use crate::{le_struct, DecodeError, Le, PAGE_SIZE};

/// Board signature at SRAM offset 0: "EMP-NIC\0" little-endian.
pub const BOARD_SIGNATURE: u64 = u64::from_le_bytes(*b"EMP-NIC\0");
/// Version of this memory map and of the structures the NIC and host share
/// through it (descriptors, CQEs). 3: the CQE's phase byte moved to its last
/// byte, published after a DMA fence. 4: a counter of reclaimed peer entries
/// (the header is 264 bytes) and the port's liveness word in its control page.
/// 5: remote keys carry a 32-bit secret (the MR entry's former reserved
/// word; a remote-access descriptor's last SGE is a `desc::RemoteSge`),
/// remote write and read opcodes, counters of refused and throttled remote
/// accesses (the header is 280 bytes) and per port in its control page.
/// 6: counters of unexpected messages and rendezvous pulls (the header is
/// 320 bytes); a port's matching mode in `PortOpen` `args[4]`.
pub const LAYOUT_VERSION: u32 = 6;

/// NIC status (header `status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum NicStatus {
    /// Powered, no firmware.
    Reset = 0,
    /// An image is being verified / started.
    Loading = 1,
    /// Firmware running.
    Running = 2,
    /// Boot refused or firmware died; see `fail_reason`.
    Failed = 3,
}

impl NicStatus {
    /// Decodes a status word.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(NicStatus::Reset),
            1 => Some(NicStatus::Loading),
            2 => Some(NicStatus::Running),
            3 => Some(NicStatus::Failed),
            _ => None,
        }
    }
}

/// Why the NIC is in [`NicStatus::Failed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum FailReason {
    /// Not failed.
    None = 0,
    /// Image has no valid header.
    BadImageHeader = 1,
    /// Image built for another firmware ABI.
    WrongAbi = 2,
    /// Payload digest does not match the header.
    DigestMismatch = 3,
    /// No signature, or not by a trusted key.
    BadSignature = 4,
    /// The payload could not be loaded / has no entry point.
    LoadFailed = 5,
    /// The SRAM layout is invalid for the firmware.
    BadLayout = 6,
    /// The firmware stopped on an internal error.
    FirmwareCrashed = 7,
}

impl FailReason {
    /// Decodes a reason word.
    pub const fn from_u32(v: u32) -> Option<Self> {
        use FailReason::*;
        Some(match v {
            0 => None,
            1 => BadImageHeader,
            2 => WrongAbi,
            3 => DigestMismatch,
            4 => BadSignature,
            5 => LoadFailed,
            6 => BadLayout,
            7 => FirmwareCrashed,
            _ => return Option::None,
        })
    }

    /// Human-readable reason.
    pub const fn as_str(self) -> &'static str {
        use FailReason::*;
        match self {
            None => "none",
            BadImageHeader => "bad firmware image header",
            WrongAbi => "firmware built for another ABI",
            DigestMismatch => "firmware digest mismatch (tampered image)",
            BadSignature => "firmware signature missing or untrusted",
            LoadFailed => "firmware payload could not be loaded",
            BadLayout => "invalid SRAM layout",
            FirmwareCrashed => "firmware crashed",
        }
    }
}

/// Feature bit: bounded overflow buffer for small unexpected messages.
pub const FEATURE_OVERFLOW: u32 = 1 << 0;
/// Feature bit: PM Modified ACK/NACK flow control (else EMP piggyback).
pub const FEATURE_MODIFIED_ACK_NACK: u32 = 1 << 1;
/// Feature bit: ports open in the `ordered-refusal` matching mode unless
/// their open asks otherwise (else `unexpected`; see [`match_mode`]).
pub const FEATURE_ORDERED_REFUSAL: u32 = 1 << 2;
/// Feature bit: receive double buffering (PM, seed 003 §3.2): the NIC's
/// DMA writes into host memory run beside it, two buffers deep, and a DMA
/// fence waits for them. The control program sees no difference.
pub const FEATURE_RX_DOUBLE_BUFFERING: u32 = 1 << 3;
/// Feature bit: Immediate Sending (PM, seed 003 §3.2): the control program
/// hands the MAC a one-frame data message's header with its payload still
/// in host memory (`FwHal::mac_transmit_host`), and the NIC builds the frame
/// on the wire straight from host memory, without a copy into NIC memory.
pub const FEATURE_IMMEDIATE_SENDING: u32 = 1 << 4;

/// Matching modes a port opens in (`PortOpen` `args[4]`).
pub mod match_mode {
    /// The NIC's default (`unexpected`, or `ordered-refusal` under
    /// `FEATURE_ORDERED_REFUSAL` or Modified ACK/NACK).
    pub const DEFAULT: u64 = 0;
    /// A message no posted receive matches is accepted as an unexpected
    /// entry (payload in the eager pool, or its header alone for a
    /// rendezvous pull) and later messages from its sender go on.
    pub const UNEXPECTED: u64 = 1;
    /// The EMP thesis' and PM's rule: such a message is refused (the sender
    /// retransmits it) and every later message from its sender waits behind
    /// it; only the optional overflow buffer (`FEATURE_OVERFLOW`) takes small ones.
    pub const ORDERED_REFUSAL: u64 = 2;
}

/// Counter slots in the header (`counters[i]`), written by the NIC.
pub mod counter {
    /// DATA frames transmitted (first transmissions).
    pub const TX_FRAMES: usize = 0;
    /// DATA frames received and accepted.
    pub const RX_FRAMES: usize = 1;
    /// DATA frames retransmitted.
    pub const RETRANSMITS: usize = 2;
    /// Duplicate DATA frames dropped.
    pub const DUPLICATES: usize = 3;
    /// DATA frames accepted out of order.
    pub const OUT_OF_ORDER: usize = 4;
    /// ACK frames sent.
    pub const ACKS_TX: usize = 5;
    /// NACK frames sent.
    pub const NACKS_TX: usize = 6;
    /// Frames dropped: no matching receive / not in order / no header yet.
    pub const DROPPED_UNEXPECTED: usize = 7;
    /// Frames dropped as malformed.
    pub const DROPPED_MALFORMED: usize = 8;
    /// Group retransmission timeouts.
    pub const TIMEOUTS: usize = 9;
    /// Messages sent successfully.
    pub const MSGS_TX: usize = 10;
    /// Messages delivered.
    pub const MSGS_RX: usize = 11;
    /// Messages completed with an error (either side).
    pub const MSGS_FAILED: usize = 12;
    /// Messages taken into the overflow buffer.
    pub const OVERFLOW_MSGS: usize = 13;
    /// Descriptors refused as malformed.
    pub const BAD_DESCRIPTORS: usize = 14;
    /// ACK/NACK frames received.
    pub const ACKS_RX: usize = 15;
    /// Collective operations completed.
    pub const COLL_OPS: usize = 16;
    /// Collective messages recorded before their operation was posted.
    pub const COLL_EARLY: usize = 17;
    /// Collective messages refused (window or buffers full; the sender retries).
    pub const COLL_REFUSED: usize = 18;
    /// Remote atomic requests answered from the result cache (duplicates).
    pub const ATOMIC_REPLAYS: usize = 19;
    /// Idle peer entries reclaimed to make room for a new peer.
    pub const PEERS_RECLAIMED: usize = 20;
    /// Remote accesses refused (key, secret, rights, bounds), all ports.
    pub const REMOTE_REFUSED: usize = 21;
    /// Remote accesses refused because their source kept guessing keys.
    pub const REMOTE_THROTTLED: usize = 22;
    /// Unexpected messages taken with their payload into the eager pool.
    pub const UNEXP_EAGER: usize = 23;
    /// Payload bytes of those messages.
    pub const UNEXP_BYTES: usize = 24;
    /// Unexpected messages whose header alone was retained (rendezvous).
    pub const UNEXP_RDV: usize = 25;
    /// Rendezvous pulls completed (the data read from the sender).
    pub const RDV_PULLS: usize = 26;
    /// Unexpected messages refused because the pool and the header table
    /// were full (flow control: the sender retries).
    pub const UNEXP_REFUSED_FULL: usize = 27;
    /// Number of counters.
    pub const COUNT: usize = 28;
    /// Names, for tools.
    pub const NAMES: [&str; COUNT] = [
        "tx_frames",
        "rx_frames",
        "retransmits",
        "duplicates",
        "out_of_order",
        "acks_tx",
        "nacks_tx",
        "dropped_unexpected",
        "dropped_malformed",
        "timeouts",
        "msgs_tx",
        "msgs_rx",
        "msgs_failed",
        "overflow_msgs",
        "bad_descriptors",
        "acks_rx",
        "coll_ops",
        "coll_early",
        "coll_refused",
        "atomic_replays",
        "peers_reclaimed",
        "remote_refused",
        "remote_throttled",
        "unexp_eager",
        "unexp_bytes",
        "unexp_rdv",
        "rdv_pulls",
        "unexp_refused_full",
    ];
}

le_struct! {
    /// SRAM header at offset 0 (320 bytes).
    pub struct SramHeader {
        /// [`BOARD_SIGNATURE`]. Hardware.
        pub magic: u64,
        /// [`LAYOUT_VERSION`]. Hardware.
        pub layout_version: u32,
        /// [`NicStatus`]. Hardware / NIC.
        pub status: u32,
        /// [`FailReason`]. Hardware / NIC.
        pub fail_reason: u32,
        /// This NIC's node id. Hardware (configured).
        pub node_id: u16,
        /// Number of port windows. Hardware.
        pub port_count: u16,
        /// MTU in bytes (frame = EMP headers + payload). Hardware.
        pub mtu: u32,
        /// `FEATURE_*` bits. Hardware (configured).
        pub features: u32,
        /// SRAM size in bytes. Hardware.
        pub sram_size: u32,
        /// Incremented by the running NIC. NIC.
        pub heartbeat: u32,
        /// Offset of the admin mailbox.
        pub admin_off: u32,
        /// Offset of the firmware staging area.
        pub staging_off: u32,
        /// Size of the staging area.
        pub staging_size: u32,
        /// Offset of the MR table.
        pub mr_off: u32,
        /// MR table entries.
        pub mr_entries: u32,
        /// Offset of the route table.
        pub route_off: u32,
        /// Route table entries (= max node id + 1).
        pub route_entries: u32,
        /// Offset of the group table.
        pub group_off: u32,
        /// Group table entries.
        pub group_entries: u32,
        /// Offset of port window 0.
        pub ports_off: u32,
        /// Bytes between port windows (page multiple).
        pub port_stride: u32,
        /// Entries in each port's send ring (power of two).
        pub send_entries: u32,
        /// Entries in each port's receive ring (power of two).
        pub recv_entries: u32,
        /// Trusted side: bytes of the firmware image written into the
        /// staging area; set before status goes to LOADING, which asks the
        /// NIC to verify and start it.
        pub staged_len: u32,
        /// Counters (see [`counter`]). NIC.
        pub counters: [u64; counter::COUNT],
    }
    size = 320;
}

/// Parameters from which a [`Layout`] is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutParams {
    /// Port windows.
    pub ports: u16,
    /// MR table entries.
    pub mr_entries: u32,
    /// Route table entries.
    pub route_entries: u32,
    /// Group table entries.
    pub group_entries: u32,
    /// Staging area bytes (page multiple).
    pub staging_size: u32,
    /// Send ring entries per port (power of two).
    pub send_entries: u32,
    /// Receive ring entries per port (power of two).
    pub recv_entries: u32,
}

impl Default for LayoutParams {
    fn default() -> Self {
        LayoutParams {
            ports: 8,
            mr_entries: 256,
            route_entries: 64,
            group_entries: 64,
            staging_size: 8 << 20,
            send_entries: 64,
            recv_entries: 64,
        }
    }
}

/// Computed SRAM layout: offsets of every area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Inputs.
    pub params: LayoutParams,
    /// Admin mailbox offset.
    pub admin_off: u32,
    /// Staging area offset.
    pub staging_off: u32,
    /// MR table offset.
    pub mr_off: u32,
    /// Route table offset.
    pub route_off: u32,
    /// Group table offset.
    pub group_off: u32,
    /// First port window offset.
    pub ports_off: u32,
    /// Port window stride.
    pub port_stride: u32,
    /// Total SRAM bytes (power of two: ivshmem BARs are).
    pub sram_size: u32,
}

const fn page_up(v: u64) -> u64 {
    v.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64
}

/// Largest SRAM we lay out.
pub const SRAM_SIZE_MAX: u64 = 1 << 30;
/// Largest ring.
pub const RING_ENTRIES_MAX: u32 = 4096;

impl Layout {
    /// Computes the layout; refuses parameters that do not fit.
    pub fn new(p: LayoutParams) -> Result<Layout, DecodeError> {
        let ring_ok = |n: u32| n.is_power_of_two() && n <= RING_ENTRIES_MAX;
        if p.ports == 0 || !ring_ok(p.send_entries) || !ring_ok(p.recv_entries) {
            return Err(DecodeError::BadLength);
        }
        if p.mr_entries == 0 || p.mr_entries > 0x10000 || p.route_entries == 0 || p.route_entries > 0xFFFF {
            return Err(DecodeError::BadLength);
        }
        if !(p.staging_size as usize).is_multiple_of(PAGE_SIZE) {
            return Err(DecodeError::BadLength);
        }
        let admin = PAGE_SIZE as u64;
        let staging = admin + PAGE_SIZE as u64;
        let mr = staging + p.staging_size as u64;
        let route = page_up(mr + p.mr_entries as u64 * MrEntry::SIZE as u64);
        let group = page_up(route + p.route_entries as u64 * RouteEntry::SIZE as u64);
        let ports = page_up(group + p.group_entries as u64 * GroupEntry::SIZE as u64);
        let stride = PortWindow::stride(p.send_entries, p.recv_entries);
        let end = ports + stride as u64 * p.ports as u64;
        let size = end.next_power_of_two();
        if size > SRAM_SIZE_MAX {
            return Err(DecodeError::BadLength);
        }
        Ok(Layout {
            params: p,
            admin_off: admin as u32,
            staging_off: staging as u32,
            mr_off: mr as u32,
            route_off: route as u32,
            group_off: group as u32,
            ports_off: ports as u32,
            port_stride: stride,
            sram_size: size as u32,
        })
    }

    /// A fresh header (status RESET) describing this layout.
    pub fn header(&self, node_id: u16, mtu: u32, features: u32) -> SramHeader {
        SramHeader {
            magic: BOARD_SIGNATURE,
            layout_version: LAYOUT_VERSION,
            node_id,
            port_count: self.params.ports,
            mtu,
            features,
            sram_size: self.sram_size,
            admin_off: self.admin_off,
            staging_off: self.staging_off,
            staging_size: self.params.staging_size,
            mr_off: self.mr_off,
            mr_entries: self.params.mr_entries,
            route_off: self.route_off,
            route_entries: self.params.route_entries,
            group_off: self.group_off,
            group_entries: self.params.group_entries,
            ports_off: self.ports_off,
            port_stride: self.port_stride,
            send_entries: self.params.send_entries,
            recv_entries: self.params.recv_entries,
            ..Default::default()
        }
    }

    /// Validates a header read from SRAM and recomputes the layout from it:
    /// the offsets in the header must be exactly the computed ones.
    pub fn from_header(h: &SramHeader) -> Result<Layout, DecodeError> {
        if h.magic != BOARD_SIGNATURE {
            return Err(DecodeError::BadMagic);
        }
        if h.layout_version != LAYOUT_VERSION {
            return Err(DecodeError::BadVersion);
        }
        if h.mtu < crate::wire::MTU_MIN || h.mtu > crate::wire::MTU_MAX {
            return Err(DecodeError::BadLength);
        }
        let l = Layout::new(LayoutParams {
            ports: h.port_count,
            mr_entries: h.mr_entries,
            route_entries: h.route_entries,
            group_entries: h.group_entries,
            staging_size: h.staging_size,
            send_entries: h.send_entries,
            recv_entries: h.recv_entries,
        })?;
        let same = l.admin_off == h.admin_off
            && l.staging_off == h.staging_off
            && l.mr_off == h.mr_off
            && l.route_off == h.route_off
            && l.group_off == h.group_off
            && l.ports_off == h.ports_off
            && l.port_stride == h.port_stride
            && l.sram_size <= h.sram_size;
        if !same {
            return Err(DecodeError::BadLength);
        }
        Ok(l)
    }

    /// Offset of MR table entry `slot`.
    pub const fn mr_entry(&self, slot: usize) -> usize {
        self.mr_off as usize + slot * MrEntry::SIZE
    }

    /// Offset of route table entry `node`.
    pub const fn route_entry(&self, node: usize) -> usize {
        self.route_off as usize + node * RouteEntry::SIZE
    }

    /// Offset of group table entry `slot`.
    pub const fn group_entry(&self, slot: usize) -> usize {
        self.group_off as usize + slot * GroupEntry::SIZE
    }

    /// The window of `port`.
    pub const fn port(&self, port: u16) -> PortWindow {
        PortWindow {
            base: self.ports_off as usize + port as usize * self.port_stride as usize,
            send_entries: self.params.send_entries,
            recv_entries: self.params.recv_entries,
        }
    }
}

/// Admin commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum AdminOp {
    /// No-op (ping).
    Nop = 0,
    /// Open a port: `args[0]` = port, `args[1]` = CQ key, `args[2]` = CQ offset,
    /// `args[3]` = CQ entries (power of two), `args[4]` = [`match_mode`],
    /// `args[5]` = 0 for the port's wire address to be its slot number, or
    /// [`PORT_ADDR_EXPLICIT`] | address (an address in use or parked is refused).
    PortOpen = 1,
    /// Close a port: `args[0]` = port. Flushes its work, frees its tables.
    PortClose = 2,
    /// The trusted side invalidated MR slot `args[0]`; the NIC acknowledges
    /// that no further DMA uses the old translation.
    MrFence = 3,
    /// The trusted side wrote group table slot `args[0]` (checked): the NIC
    /// loads it. A slot in use is replaced (its operations fail `StaleGroup`).
    GroupSet = 4,
    /// Group slot `args[0]` is retired: its operations finish `Flushed`.
    GroupClear = 5,
    /// Context switch C1 (PM §3.4): port `args[0]` stops consuming its rings
    /// and starting messages; frames of messages already started, ACKs and
    /// NACKs go on; new messages arriving for it are refused (NACK, the
    /// sender retries).
    PortSuspend = 6,
    /// C2–C4: `OK` when suspended port `args[0]` is stable (nothing of its
    /// own in flight, nothing being received, no ACK owed), `NOT_STABLE`
    /// otherwise.
    PortStable = 7,
    /// C6: saves stable suspended port `args[0]` as a context image into its
    /// own region `args[1]` (key) at `args[2]` (offset), at most `args[3]`
    /// bytes, then frees the slot; its wire address stays parked (frames
    /// for it are refused, to be retried) until restored or discarded.
    PortSave = 8,
    /// C7: restores the image in region `args[1]` at `args[2]`, `args[3]`
    /// bytes, into free slot `args[0]` (any slot; the trusted side moved the
    /// context's MR entries to it), which must be the parked context
    /// `args[4]` = address | generation << 16. The image is checked whole
    /// first; a bad one is refused (`BAD_IMAGE`) and changes nothing. The
    /// port comes back suspended.
    PortRestore = 9,
    /// C8: suspended port `args[0]` resumes.
    PortResume = 10,
    /// Forgets parked context `args[0]` = address | generation << 16 (its
    /// job is gone): frames for it are then answered `PortClosed`.
    PortDiscard = 11,
}

impl AdminOp {
    /// Decodes an op word.
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(AdminOp::Nop),
            1 => Some(AdminOp::PortOpen),
            2 => Some(AdminOp::PortClose),
            3 => Some(AdminOp::MrFence),
            4 => Some(AdminOp::GroupSet),
            5 => Some(AdminOp::GroupClear),
            6 => Some(AdminOp::PortSuspend),
            7 => Some(AdminOp::PortStable),
            8 => Some(AdminOp::PortSave),
            9 => Some(AdminOp::PortRestore),
            10 => Some(AdminOp::PortResume),
            11 => Some(AdminOp::PortDiscard),
            _ => None,
        }
    }
}

/// Admin result codes (`AdminMailbox::result`).
pub mod admin_result {
    /// Done.
    pub const OK: u32 = 0;
    /// Unknown op.
    pub const BAD_OP: u32 = 1;
    /// Bad argument (port out of range, CQ not a power of two, …).
    pub const BAD_ARG: u32 = 2;
    /// Port already open / not open.
    pub const BAD_STATE: u32 = 3;
    /// CQ key does not name a writable region of the port.
    pub const BAD_KEY: u32 = 4;
    /// The port is not stable yet (context switch: try again later).
    pub const NOT_STABLE: u32 = 5;
    /// A context image failed its checks (magic, version, length,
    /// checksum, a field out of bounds, an identity other than the one
    /// parked): refused, nothing changed.
    pub const BAD_IMAGE: u32 = 6;
    /// The context image does not fit the region given, or the NIC lacks
    /// table room to restore it: nothing changed.
    pub const NO_ROOM: u32 = 7;
}

/// `PortOpen`'s `args[5]` flag: the low 16 bits are the wire address.
pub const PORT_ADDR_EXPLICIT: u64 = 1 << 16;

/// Largest port context image (`PortSave`/`PortRestore`, docs/context-switch.md)
/// a NIC writes or reads: room the trusted side gives a save never needs to
/// exceed this, and a restore of a longer image is refused.
pub const CTX_IMAGE_MAX: usize = 8 << 20;

le_struct! {
    /// Admin mailbox (64 bytes at `admin_off`). The trusted host writes
    /// `op` and `args`, then increments `request_seq`; the NIC executes and
    /// sets `result` then `done_seq = request_seq`.
    pub struct AdminMailbox {
        /// Host: sequence of the posted command.
        pub request_seq: u32,
        /// Host: [`AdminOp`].
        pub op: u32,
        /// NIC: sequence of the last completed command.
        pub done_seq: u32,
        /// NIC: [`admin_result`] code.
        pub result: u32,
        /// Host: arguments.
        pub args: [u64; 6],
    }
    size = 64;
}

le_struct! {
    /// Route table entry (32 bytes): how to reach node `index` on the wire.
    pub struct RouteEntry {
        /// 1 = valid.
        pub valid: u32,
        /// IPv4 address (UDP backend), network order as u32 LE of octets;
        /// 0 when the node's address is IPv6 or it has none.
        pub ipv4: u32,
        /// UDP port (UDP backend).
        pub udp_port: u16,
        /// Ethernet MAC (packet backend).
        pub mac: [u8; 6],
        /// The node's IP address (UDP backend) in network order, as IPv6:
        /// an IPv4 address in its IPv4-mapped form `::ffff:a.b.c.d` (the
        /// family flag is that prefix: [`RouteEntry::ip_is_v4`]); all zero
        /// when the node has no IP address (mem and packet wires).
        pub ip6: [u8; 16],
    }
    size = 32;
}

impl RouteEntry {
    /// True when [`RouteEntry::ip6`] holds an IPv4 address: it starts with
    /// the IPv4-mapped prefix `::ffff:` (RFC 4291 §2.5.5.2).
    pub fn ip_is_v4(&self) -> bool {
        self.ip6[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
    }
}

pub use crate::coll::{GROUP_INLINE_MAX, GROUP_MEMBERS_MAX};

le_struct! {
    /// Group table entry (1024 bytes): an ordered list of endpoints used by
    /// collectives, and the trees the host built over them. A member is
    /// `(node << 16) | port`. Written by the trusted side after checks
    /// ([`GroupView::check`]); the NIC loads it on `GroupSet`.
    ///
    /// A group of at most [`GROUP_INLINE_MAX`] members is this entry alone.
    /// A larger one (up to [`GROUP_MEMBERS_MAX`]) leaves `members` and
    /// `parents` zero and carries a *body* of [`GroupEntry::body_len`]
    /// bytes right after the entry: `members` as `u32` × `member_count`,
    /// then `tree_count` parent arrays of `u16` × `member_count`
    /// ([`crate::coll::TREE_ROOT_WIDE`] for the root), zero-padded to a
    /// whole entry. In the group table it occupies [`GroupEntry::span`]
    /// consecutive slots (its own, then the body's), so the table is the
    /// NIC's member pool: a small group costs one slot, a group of 1024
    /// with one tree seven.
    pub struct GroupEntry {
        /// Group id (0 = unused).
        pub group_id: u32,
        /// Epoch: bumped on every re-creation so stale frames are recognised.
        pub epoch: u32,
        /// Members in use.
        pub member_count: u16,
        /// This NIC's rank in the group.
        pub my_rank: u16,
        /// Owning port.
        pub port: u16,
        /// Trees in `parents`.
        pub tree_count: u8,
        /// Reserved, zero.
        pub flags: u8,
        /// Bounce slots (application bypass): region key, slot size, offset.
        pub bounce_key: u32,
        /// Bytes per bounce slot.
        pub bounce_slot_size: u32,
        /// Offset of slot 0 in the bounce region.
        pub bounce_offset: u64,
        /// Bounce slots (0 = none).
        pub bounce_slots: u16,
        /// Reserved, zero.
        pub reserved0: u16,
        /// Reserved, zero.
        pub reserved1: u32,
        /// λ each tree was built for (informational).
        pub tree_lambda: [u8; 8],
        /// Members.
        pub members: [u32; GROUP_INLINE_MAX],
        /// Tree t is `parents[64 t .. 64 t + member_count]`: the parent of
        /// each relative rank (relative to the broadcast or reduce root),
        /// [`crate::coll::TREE_ROOT`] for rank 0. Tree 0 is binomial.
        /// (Zero in a wide group: its trees are in the body.)
        pub parents: [u8; 512],
        /// Reserved, zero.
        pub reserved2: [u64; 26],
    }
    size = 1024;
}

/// Why a group entry was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupError {
    /// Id 0, no members, more than [`GROUP_MEMBERS_MAX`], or rank out of range.
    BadShape,
    /// A group of more than [`GROUP_INLINE_MAX`] members without its whole
    /// body, or with nonzero padding after it.
    BadBody,
    /// Two members name the same endpoint.
    DuplicateMember,
    /// `members[my_rank]` is not the caller's endpoint.
    NotMember,
    /// No tree, more than 8, or a parent array that is not a tree.
    BadTree,
    /// A reserved field is not zero.
    Reserved,
}

impl GroupError {
    /// Human-readable text.
    pub const fn as_str(self) -> &'static str {
        match self {
            GroupError::BadShape => "group id 0, member count outside 1..=1024, or rank out of range",
            GroupError::BadBody => "a group of more than 64 members needs its whole body after the entry",
            GroupError::DuplicateMember => "an endpoint is listed twice",
            GroupError::NotMember => "the caller is not the member at its rank",
            GroupError::BadTree => "tree count outside 1..=8 or a parent array is not a tree",
            GroupError::Reserved => "reserved field not zero",
        }
    }
}

impl GroupEntry {
    /// Parent array of tree `t` of a group held inline (empty for `t` ≥ 8;
    /// at most 64 entries whatever `member_count` claims; a wide group's
    /// trees are in its body: [`GroupView::parent`]).
    pub fn tree(&self, t: usize) -> &[u8] {
        let n = (self.member_count as usize).min(GROUP_INLINE_MAX);
        self.parents.get(64 * t..64 * t + n).unwrap_or(&[])
    }

    /// Are members and trees in a body after the entry (more than
    /// [`GROUP_INLINE_MAX`] members)?
    pub const fn is_wide(&self) -> bool {
        self.member_count as usize > GROUP_INLINE_MAX
    }

    /// Bytes of the body that follows the entry (0 for an inline group).
    pub const fn body_len(&self) -> usize {
        if !self.is_wide() {
            return 0;
        }
        let n = self.member_count as usize;
        4 * n + 2 * n * self.tree_count as usize
    }

    /// Group table slots (and encoded size in entries) the group takes:
    /// its entry and the body, padded to whole entries.
    pub const fn span(&self) -> usize {
        1 + self.body_len().div_ceil(Self::SIZE)
    }

    /// The checks for an inline group (a wide one is refused `BadBody`:
    /// check it with its body through [`GroupView::check`]).
    pub fn check(&self, caller: u32) -> Result<(), GroupError> {
        GroupView { entry: self, body: &[] }.check(caller)
    }
}

/// A group table entry and its body (empty for an inline group), read
/// through one interface whatever the group's size.
#[derive(Clone, Copy, Debug)]
pub struct GroupView<'a> {
    /// The entry.
    pub entry: &'a GroupEntry,
    /// The bytes after it: at least [`GroupEntry::body_len`] for a wide group.
    pub body: &'a [u8],
}

impl GroupView<'_> {
    /// Member `rank`: `(node << 16) | port` (0 past the end or the body).
    pub fn member(&self, rank: usize) -> u32 {
        if !self.entry.is_wide() {
            return self.entry.members.get(rank).copied().unwrap_or(0);
        }
        match self.body.get(4 * rank..4 * rank + 4) {
            Some(b) if rank < self.entry.member_count as usize => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            _ => 0,
        }
    }

    /// Parent of relative rank `rel` in tree `t`, [`crate::coll::TREE_ROOT_WIDE`]
    /// at the root (and past the end, which no valid tree reaches).
    pub fn parent(&self, t: usize, rel: usize) -> u16 {
        use crate::coll::{TREE_ROOT, TREE_ROOT_WIDE};
        let n = self.entry.member_count as usize;
        if rel >= n || t >= crate::coll::TREES_MAX {
            return TREE_ROOT_WIDE;
        }
        if !self.entry.is_wide() {
            return match self.entry.tree(t).get(rel) {
                Some(&p) if p != TREE_ROOT => p as u16,
                _ => TREE_ROOT_WIDE,
            };
        }
        let at = 4 * n + 2 * (t * n + rel);
        match self.body.get(at..at + 2) {
            Some(b) => u16::from_le_bytes([b[0], b[1]]),
            None => TREE_ROOT_WIDE,
        }
    }

    /// The checks the trusted side makes before writing an entry (and its
    /// body) on behalf of `caller` = `(node << 16) | port`; the NIC makes
    /// them again when it loads the group. Allocation-free: O(n²) for the
    /// duplicate check and O(n · depth) per tree.
    pub fn check(&self, caller: u32) -> Result<(), GroupError> {
        let e = self.entry;
        let n = e.member_count as usize;
        if e.group_id == 0 || n == 0 || n > GROUP_MEMBERS_MAX || e.my_rank as usize >= n {
            return Err(GroupError::BadShape);
        }
        let trees = e.tree_count as usize;
        if e.is_wide() {
            let len = e.body_len();
            if self.body.len() < len {
                return Err(GroupError::BadBody);
            }
            if self.body[len..].iter().any(|&b| b != 0) {
                return Err(GroupError::BadBody);
            }
        }
        if (1..n).any(|i| {
            let a = self.member(i);
            (0..i).any(|j| self.member(j) == a)
        }) {
            return Err(GroupError::DuplicateMember);
        }
        if self.member(e.my_rank as usize) != caller || caller & 0xFFFF != e.port as u32 {
            return Err(GroupError::NotMember);
        }
        if trees == 0
            || trees > crate::coll::TREES_MAX
            || (0..trees).any(|t| !crate::coll::tree_valid_by(n, |r| self.parent(t, r)))
        {
            return Err(GroupError::BadTree);
        }
        let inline = n.min(GROUP_INLINE_MAX);
        let inline_used = if e.is_wide() { 0 } else { inline };
        if e.flags != 0
            || e.reserved0 != 0
            || e.reserved1 != 0
            || e.reserved2 != [0; 26]
            || e.members[inline_used..].iter().any(|&x| x != 0)
            || (e.is_wide() && e.parents.iter().any(|&p| p != 0))
        {
            return Err(GroupError::Reserved);
        }
        Ok(())
    }
}

/// Port states (`PortCtl::state`).
pub mod port_state {
    /// Closed.
    pub const CLOSED: u32 = 0;
    /// Open and serving.
    pub const OPEN: u32 = 1;
    /// Open but suspended for a context switch (`AdminOp::PortSuspend`).
    pub const SUSPENDED: u32 = 2;
}

le_struct! {
    /// The control page at the start of every port window (first 192 bytes
    /// used; the rest of the page is reserved).
    pub struct PortCtl {
        /// Host: send ring producer index (free-running).
        pub send_prod: u32,
        /// Host: receive ring producer index (free-running).
        pub recv_prod: u32,
        /// Host: completion queue consumer index (free-running).
        pub cq_cons: u32,
        /// Host: event-arm word; nonzero asks for an interrupt on the next
        /// completion. The NIC clears it when it fires.
        pub arm: u32,
        /// Reserved (cache line of host-written words).
        pub host_pad: [u32; 12],
        /// NIC: send ring consumer index.
        pub send_cons: u32,
        /// NIC: receive ring consumer index.
        pub recv_cons: u32,
        /// NIC: CQ slots taken for completions (free-running). A slot's
        /// entry may be written after the index moves past it (by another
        /// NIC CPU): the host knows an entry by its phase byte, never by
        /// this index.
        pub cq_prod: u32,
        /// NIC: completions dropped because the CQ was full.
        pub cq_overruns: u32,
        /// NIC: nonzero while the NIC sleeps on the doorbell; the host
        /// writes the doorbell only then (no system call while it polls).
        pub nic_sleeping: u32,
        /// NIC: liveness word, advanced (never to 0) every
        /// [`NIC_ALIVE_PERIOD_NS`] while the NIC runs its control program;
        /// a host that sees it stand still for [`NIC_DEAD_NS`] takes the NIC
        /// for dead. 0 = a NIC that does not advance it.
        pub nic_alive: u32,
        /// NIC: remote accesses to this port refused (key, secret, rights,
        /// bounds; throttled ones included), free-running.
        pub remote_refused: u32,
        /// NIC: of those, refused because their source kept guessing.
        pub remote_throttled: u32,
        /// Reserved (cache line of NIC-written words).
        pub nic_pad: [u32; 8],
        /// Trusted side: [`port_state`].
        pub state: u32,
        /// Trusted side: generation of this opening.
        pub gen: u32,
        /// Trusted side: CQ region key.
        pub cq_key: u32,
        /// Trusted side: CQ entries (power of two).
        pub cq_entries: u32,
        /// Trusted side: CQ offset in the region.
        pub cq_offset: u64,
        /// Reserved.
        pub cfg_pad: [u64; 5],
    }
    size = 192;
}

/// Where a port's pieces are in SRAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortWindow {
    /// Offset of the window (its `PortCtl`).
    pub base: usize,
    /// Send ring entries.
    pub send_entries: u32,
    /// Receive ring entries.
    pub recv_entries: u32,
}

impl PortWindow {
    /// Bytes of one window: a control page and the two rings, page aligned.
    pub const fn stride(send_entries: u32, recv_entries: u32) -> u32 {
        page_up(PAGE_SIZE as u64 + (send_entries + recv_entries) as u64 * WorkDesc::SIZE as u64) as u32
    }

    /// Offset of field `off` of the control page.
    pub const fn ctl(&self, off: usize) -> usize {
        self.base + off
    }

    /// Offset of send ring slot `idx` (wrapped).
    pub const fn send_slot(&self, idx: u32) -> usize {
        self.base + PAGE_SIZE + ring::slot(idx, self.send_entries) as usize * WorkDesc::SIZE
    }

    /// Offset of slot `idx` (wrapped) of the send ring, or the receive ring.
    pub const fn ring_slot(&self, send: bool, idx: u32) -> usize {
        if send {
            self.send_slot(idx)
        } else {
            self.recv_slot(idx)
        }
    }

    /// Offset of receive ring slot `idx` (wrapped).
    pub const fn recv_slot(&self, idx: u32) -> usize {
        self.base
            + PAGE_SIZE
            + self.send_entries as usize * WorkDesc::SIZE
            + ring::slot(idx, self.recv_entries) as usize * WorkDesc::SIZE
    }
}

/// How often a running NIC advances every port's [`PortCtl::nic_alive`].
pub const NIC_ALIVE_PERIOD_NS: u64 = 50_000_000;
/// How long [`PortCtl::nic_alive`] may stand still before a host takes
/// the NIC for dead (many periods: a loaded machine may delay a few).
pub const NIC_DEAD_NS: u64 = 2_000_000_000;

/// Offsets of `PortCtl` fields, for single-word accesses.
pub mod ctl {
    use super::PortCtl;
    use core::mem::offset_of;
    /// See [`PortCtl::send_prod`].
    pub const SEND_PROD: usize = offset_of!(PortCtl, send_prod);
    /// See [`PortCtl::recv_prod`].
    pub const RECV_PROD: usize = offset_of!(PortCtl, recv_prod);
    /// See [`PortCtl::cq_cons`].
    pub const CQ_CONS: usize = offset_of!(PortCtl, cq_cons);
    /// See [`PortCtl::arm`].
    pub const ARM: usize = offset_of!(PortCtl, arm);
    /// See [`PortCtl::send_cons`].
    pub const SEND_CONS: usize = offset_of!(PortCtl, send_cons);
    /// See [`PortCtl::recv_cons`].
    pub const RECV_CONS: usize = offset_of!(PortCtl, recv_cons);
    /// See [`PortCtl::cq_prod`].
    pub const CQ_PROD: usize = offset_of!(PortCtl, cq_prod);
    /// See [`PortCtl::cq_overruns`].
    pub const CQ_OVERRUNS: usize = offset_of!(PortCtl, cq_overruns);
    /// See [`PortCtl::nic_sleeping`].
    pub const NIC_SLEEPING: usize = offset_of!(PortCtl, nic_sleeping);
    /// See [`PortCtl::nic_alive`].
    pub const NIC_ALIVE: usize = offset_of!(PortCtl, nic_alive);
    /// See [`PortCtl::remote_refused`].
    pub const REMOTE_REFUSED: usize = offset_of!(PortCtl, remote_refused);
    /// See [`PortCtl::remote_throttled`].
    pub const REMOTE_THROTTLED: usize = offset_of!(PortCtl, remote_throttled);
    /// See [`PortCtl::state`].
    pub const STATE: usize = offset_of!(PortCtl, state);
    /// See [`PortCtl::gen`].
    pub const GEN: usize = offset_of!(PortCtl, gen);
    const _: () = assert!(SEND_PROD / 64 != SEND_CONS / 64, "indices share a cache line");
    const _: () = assert!(RECV_PROD / 64 != RECV_CONS / 64, "indices share a cache line");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_round_trips_through_header() {
        let l = Layout::new(LayoutParams::default()).unwrap();
        assert!(l.sram_size.is_power_of_two());
        assert_eq!(l.port_stride as usize % PAGE_SIZE, 0);
        let h = l.header(3, 1500, 0);
        let mut b = [0u8; SramHeader::SIZE];
        h.encode(&mut b).unwrap();
        assert_eq!(Layout::from_header(&SramHeader::decode(&b).unwrap()), Ok(l));
        let end = l.port(l.params.ports - 1).recv_slot(l.params.recv_entries - 1) + WorkDesc::SIZE;
        assert!(end <= l.sram_size as usize);
    }

    /// A wide group of `n` on nodes 1..=n, port 3, this NIC rank `me`, one
    /// binomial tree: its entry and its body padded to whole entries.
    fn wide_group(n: usize, me: usize) -> (GroupEntry, [u8; 8 * GroupEntry::SIZE]) {
        let e = GroupEntry {
            group_id: 5,
            epoch: 1,
            member_count: n as u16,
            my_rank: me as u16,
            port: 3,
            tree_count: 1,
            ..Default::default()
        };
        let mut body = [0u8; 8 * GroupEntry::SIZE];
        for r in 0..n {
            body[4 * r..4 * r + 4].copy_from_slice(&(((r as u32 + 1) << 16) | 3).to_le_bytes());
            let p = if r == 0 { crate::coll::TREE_ROOT_WIDE } else { (r - (1 << r.ilog2())) as u16 };
            body[4 * n + 2 * r..4 * n + 2 * r + 2].copy_from_slice(&p.to_le_bytes());
        }
        (e, body)
    }

    #[test]
    fn wide_group_body_is_checked() {
        let (e, body) = wide_group(1024, 700);
        assert_eq!((e.body_len(), e.span()), (6144, 7));
        let len = (e.span() - 1) * GroupEntry::SIZE;
        let caller = (701 << 16) | 3;
        let v = GroupView { entry: &e, body: &body[..len] };
        assert_eq!(v.check(caller), Ok(()));
        assert_eq!((v.member(1023), v.parent(0, 1023), v.parent(0, 0)), ((1024 << 16) | 3, 511, 0xFFFF));
        // Without its body, or with a short one, or junk in the padding.
        assert_eq!(e.check(caller), Err(GroupError::BadBody));
        assert_eq!(GroupView { entry: &e, body: &body[..e.body_len() - 1] }.check(caller), Err(GroupError::BadBody));
        let mut junk = body;
        junk[len + 3] = 1;
        assert_eq!(GroupView { entry: &e, body: &junk[..len + 8] }.check(caller), Err(GroupError::BadBody));
        // A duplicate far apart, a cycle, a member inline.
        let mut dup = body;
        dup.copy_within(0..4, 4 * 1000);
        assert_eq!(GroupView { entry: &e, body: &dup[..len] }.check(caller), Err(GroupError::DuplicateMember));
        let mut cyc = body;
        cyc[4096 + 2 * 512..4096 + 2 * 512 + 2].copy_from_slice(&513u16.to_le_bytes());
        cyc[4096 + 2 * 513..4096 + 2 * 513 + 2].copy_from_slice(&512u16.to_le_bytes());
        assert_eq!(GroupView { entry: &e, body: &cyc[..len] }.check(caller), Err(GroupError::BadTree));
        let mut inline = e;
        inline.members[0] = 1;
        assert_eq!(GroupView { entry: &inline, body: &body[..len] }.check(caller), Err(GroupError::Reserved));
        // 65 members is the smallest wide group; 64 stay inline.
        let (e65, b65) = wide_group(65, 0);
        assert_eq!((e65.body_len(), e65.span()), (65 * 6, 2));
        assert_eq!(GroupView { entry: &e65, body: &b65[..GroupEntry::SIZE] }.check((1 << 16) | 3), Ok(()));
        assert_eq!(GroupEntry { member_count: 64, tree_count: 8, ..Default::default() }.span(), 1);
    }

    #[test]
    fn header_with_moved_offset_is_refused() {
        let l = Layout::new(LayoutParams::default()).unwrap();
        let mut h = l.header(0, 1500, 0);
        h.mr_off += 16;
        assert_eq!(Layout::from_header(&h), Err(DecodeError::BadLength));
        h = l.header(0, 1500, 0);
        h.magic ^= 1;
        assert_eq!(Layout::from_header(&h), Err(DecodeError::BadMagic));
    }
}
