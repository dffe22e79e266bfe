//! Direct attach: how a host process talks to `emp-nicd` without a kernel
//! module. The process connects to the NIC's Unix socket
//! (`SOCK_SEQPACKET`); every message is one [`AttachMsg`], some carrying
//! file descriptors (`SCM_RIGHTS`). This is the control path only: sends,
//! receives and completions go through the mapped port window and shared
//! memory with no system call.
//!
//! 1. `ATTACH` → reply with the port, its generation and geometry, plus
//!    three fds: the port window (a memfd of `window_size` bytes, mapped at
//!    offset 0), the doorbell eventfd (process → NIC) and the event eventfd
//!    (NIC → process).
//! 2. `REG_ARENA` with a memfd → the NIC maps it; `arg[0]` = offset,
//!    `arg[1]` = length, `arg[2]` = access bits → reply `arg[0]` = key,
//!    `arg[1]` = its remote-access secret (`desc::MrEntry::secret`). True
//!    zero-copy: the NIC's DMA engine reads and writes that memory directly.
//! 3. `REG_VM`: `arg[0]` = virtual address, `arg[1]` = length, `arg[2]` =
//!    access → key and secret, as `REG_ARENA`. The NIC reaches the memory with
//!    `process_vm_readv/writev` (the process allows it with
//!    `prctl(PR_SET_PTRACER, daemon pid)`; the reply's `arg[0]` on ATTACH is
//!    the daemon's pid).
//! 4. `START`: `arg[0]` = CQ key, `arg[1]` = CQ offset, `arg[2]` = CQ
//!    entries → the port opens.
//! 5. `DEREG`: `arg[0]` = key. `STATS` (also before `ATTACH`): reply
//!    `arg[..16]` = NIC counters, `arg[16]` = status, `arg[17]` = fail
//!    reason, `arg[18]` = ports in use, `arg[19]` = node, `arg[20]` = ports,
//!    `arg[21]` = memory regions registered; `STATS_EXT`: `arg[i]` =
//!    counter 16 + i.
//! 6. `GROUP_SET` / `GROUP_CLEAR`: load or retire a group table entry for
//!    collectives (checked by the daemon: the caller is the member at its
//!    rank, the trees are trees); a group of up to 1024 members brings its
//!    body after the entry and takes several consecutive slots.
//! 8. Context switch (docs/context-switch.md): `PORT_SUSPEND`,
//!    `PORT_STABLE` (reply `arg[0]` = 1 when stable), `PORT_SAVE` (`arg[0]`
//!    = key, `arg[1]` = offset, `arg[2]` = room of a region of the port →
//!    reply `arg[0]` = the image's length; the port is then saved: no port
//!    until restored), `PORT_RESTORE` (`arg[0]` = key, `arg[1]` = offset,
//!    `arg[2]` = length → reply `arg[0]` = the slot it went to, `arg[1]` =
//!    its wire address, and the new slot's window fd; the doorbell and
//!    event eventfds stay), `PORT_RESUME`. Closing the socket while saved
//!    discards the context.
//! 9. Gang scheduling (docs/context-switch.md, `emp gang`): `GANG`
//!    (`arg[0]` = a [`gang`] action, `arg[1]` = a process id), from the
//!    daemon's owner (or root) on a connection that holds no port, acts on
//!    every port that process holds on this NIC: a switched-out port is
//!    saved into daemon memory and restored into the same slot, so the
//!    process's mapped window stays its own. Reply `arg[0]` = ports acted
//!    on; for `STABLE`, `arg[1]` = how many of them are stable.
//! 7. `WIRE_INFO` (also before `ATTACH`): the wire the NIC is on, its link
//!    and the wire's counters, in `arg` at the indices of [`wire_reply`].
//!    `WIRE_ROUTES`: `arg[0]` = first node → one page of the route table
//!    (at most [`ROUTES_PER_PAGE`] entries, see [`route_page`]): a table of
//!    any size is read a page at a time, every reply bounded.
//!
//! Closing the socket (or dying) closes the port: outstanding work is
//! flushed, every region deregistered, every table entry freed.

use crate::le_struct;

/// Version of this protocol.
pub const ATTACH_VERSION: u32 = 1;

/// Request / reply codes.
pub mod op {
    /// Allocate a port.
    pub const ATTACH: u32 = 1;
    /// Register a shared memfd arena (fd attached).
    pub const REG_ARENA: u32 = 2;
    /// Register process memory by address.
    pub const REG_VM: u32 = 3;
    /// Open the port with its completion queue.
    pub const START: u32 = 4;
    /// Deregister a region.
    pub const DEREG: u32 = 5;
    /// Read the NIC's counters.
    pub const STATS: u32 = 6;
    /// Write group table entry: `arg[0]` = key and `arg[1]` = offset of an
    /// encoded `GroupEntry` in the caller's registered memory, followed
    /// there by its body when the group has more than 64 members
    /// (`GroupEntry::body_len` bytes) → reply `arg[0]` = the first of the
    /// `GroupEntry::span` slots it takes.
    pub const GROUP_SET: u32 = 7;
    /// Retire group slot `arg[0]`.
    pub const GROUP_CLEAR: u32 = 8;
    /// Counters beyond the first 16: reply `arg[i]` = counter 16 + i.
    pub const STATS_EXT: u32 = 9;
    /// The NIC's wire, link and wire counters (see [`super::wire_reply`]).
    pub const WIRE_INFO: u32 = 10;
    /// One page of the route table from node `arg[0]` (see [`super::route_page`]).
    pub const WIRE_ROUTES: u32 = 11;
    /// The wire's authentication: mode, key ids and refusal counters (see
    /// [`super::auth_reply`]).
    pub const WIRE_AUTH: u32 = 20;
    /// Key rotation, for the whole daemon: `arg[0]` = [`super::rekey::INSTALL`]
    /// (reread the key file; a new key id is accepted, not sent with yet)
    /// or [`super::rekey::SWITCH`] (send with the installed key; the old one
    /// stays accepted for a grace period) → reply as `WIRE_AUTH`. Only from
    /// the daemon's own user or root (`EPERM`); `EOPNOTSUPP` when the wire
    /// does not authenticate; `EINVAL` with a bad key file (the daemon logs
    /// why and keeps its keys).
    pub const WIRE_REKEY: u32 = 21;
    /// The wire's multicast counters (see [`super::mcast_reply`]).
    pub const WIRE_MCAST: u32 = 22;
    /// Context switch C1: suspend the port.
    pub const PORT_SUSPEND: u32 = 23;
    /// C2–C4: reply `arg[0]` = 1 when the suspended port is stable.
    pub const PORT_STABLE: u32 = 24;
    /// C6: save the port into its own memory (see the module docs).
    pub const PORT_SAVE: u32 = 25;
    /// C7: restore the saved port into a free slot (see the module docs).
    pub const PORT_RESTORE: u32 = 26;
    /// C8: resume the port.
    pub const PORT_RESUME: u32 = 27;
    /// Gang scheduling: act on another process's ports (see the module docs).
    pub const GANG: u32 = 28;
    /// The NIC's processors' working time: reply `arg[0]` = nanoseconds
    /// the engine and NIC CPU threads spent handling this NIC's doorbells,
    /// frames and timers (polling that found nothing excluded), `arg[1]` =
    /// the batches they handled.
    pub const BUSY: u32 = 29;
}

/// `GANG` actions (`arg[0]`), on every port of process `arg[1]`.
pub mod gang {
    /// C1 on each of its open ports.
    pub const SUSPEND: u64 = 1;
    /// C2–C4: reply `arg[1]` = how many of its suspended ports are stable.
    pub const STABLE: u64 = 2;
    /// C6 into daemon memory; its slots become free for another job.
    pub const SAVE: u64 = 3;
    /// C7 of its saved ports, each into the slot it had (`EBUSY` if taken).
    pub const RESTORE: u64 = 4;
    /// C8 on each of its ports.
    pub const RESUME: u64 = 5;
    /// Reply `arg[0]` = how many started ports it holds (nothing changes).
    pub const PORTS: u64 = 6;
}

/// Reply fields of `WIRE_MCAST`, in `arg` (one set per daemon).
pub mod mcast_reply {
    /// Multicast transmissions (one per transmission at the sender).
    pub const SENT: usize = 0;
    /// Multicast frames handed to a member NIC.
    pub const RECEIVED: usize = 1;
    /// Transmissions sent as replicated unicast (no IP multicast).
    pub const FALLBACK: usize = 2;
}

/// `WIRE_REKEY` steps.
pub mod rekey {
    /// Reread the key file and accept its key.
    pub const INSTALL: u64 = 1;
    /// Send with the installed key.
    pub const SWITCH: u64 = 2;
}

/// Reply fields of `WIRE_AUTH` and `WIRE_REKEY`, in `arg`.
pub mod auth_reply {
    /// 0 off, 1 mac, 2 aead.
    pub const MODE: usize = 0;
    /// Key id sent with (0: none).
    pub const KEY_ID: usize = 1;
    /// Key id installed, accepted, not yet sent with (0: none).
    pub const NEXT_KEY_ID: usize = 2;
    /// Key id still accepted after a switch (0: none).
    pub const PREVIOUS_KEY_ID: usize = 3;
    /// Frames dropped: the tag did not match.
    pub const BAD_TAG: usize = 4;
    /// Frames dropped: sealed under a key id not held.
    pub const UNKNOWN_KEY: usize = 5;
    /// Frames dropped: replayed or too far behind.
    pub const REPLAYED: usize = 6;
    /// Bytes of trailer every frame carries.
    pub const TRAILER: usize = 7;
}

/// Reply status codes (`AttachMsg::status`); values are errno numbers so a
/// client can report them as OS errors.
pub mod status {
    /// Done.
    pub const OK: i32 = 0;
    /// Bad argument (EINVAL).
    pub const EINVAL: i32 = 22;
    /// No free port / MR slot (EBUSY / ENOSPC).
    pub const ENOSPC: i32 = 28;
    /// Out of memory or mapping failed (ENOMEM).
    pub const ENOMEM: i32 = 12;
    /// Permission: memory not reachable (EPERM).
    pub const EPERM: i32 = 1;
    /// Unknown key (ENOENT).
    pub const ENOENT: i32 = 2;
    /// The NIC is not running (ENODEV).
    pub const ENODEV: i32 = 19;
    /// Wrong state for this request (EALREADY / EPROTO).
    pub const EPROTO: i32 = 71;
    /// Unknown op or version (EOPNOTSUPP).
    pub const EOPNOTSUPP: i32 = 95;
}

le_struct! {
    /// One request or reply (192 bytes).
    pub struct AttachMsg {
        /// [`ATTACH_VERSION`].
        pub version: u32,
        /// [`op`] code (a reply repeats the request's).
        pub op: u32,
        /// Reply: [`status`] code.
        pub status: i32,
        /// Reserved, zero.
        pub reserved: u32,
        /// Arguments / results (see the module docs).
        pub arg: [u64; 22],
    }
    size = 192;
}

/// Reply fields of `ATTACH`, in `arg`.
pub mod attach_reply {
    /// The daemon's pid (for `PR_SET_PTRACER`).
    pub const DAEMON_PID: usize = 0;
    /// Node id.
    pub const NODE: usize = 1;
    /// Port number.
    pub const PORT: usize = 2;
    /// Port generation.
    pub const GEN: usize = 3;
    /// MTU.
    pub const MTU: usize = 4;
    /// Bytes of the window to map.
    pub const WINDOW_SIZE: usize = 5;
    /// Send ring entries.
    pub const SEND_ENTRIES: usize = 6;
    /// Receive ring entries.
    pub const RECV_ENTRIES: usize = 7;
    /// Feature bits.
    pub const FEATURES: usize = 8;
    /// Ports on the NIC.
    pub const PORT_COUNT: usize = 9;
    /// Nodes reachable (route table entries).
    pub const NODES: usize = 10;
    /// Largest message.
    pub const MSG_MAX: usize = 11;
}

/// Reply fields of `WIRE_INFO`, in `arg`.
pub mod wire_reply {
    /// [`super::wire_kind`] code.
    pub const KIND: usize = 0;
    /// Nodes in the route table.
    pub const NODES: usize = 1;
    /// NICs of this daemon on the same wire (they share its counters).
    pub const LOCAL_NICS: usize = 2;
    /// This NIC's index among them.
    pub const LOCAL_INDEX: usize = 3;
    /// [`super::link_flags`] of the NIC's interface.
    pub const LINK_FLAGS: usize = 4;
    /// The interface's MTU.
    pub const LINK_MTU: usize = 5;
    /// The interface's MAC address, big-endian in the low 48 bits.
    pub const LINK_MAC: usize = 6;
    /// The interface's name: 16 bytes, NUL-padded, in `arg[7]` and `arg[8]`
    /// (little-endian words).
    pub const LINK_NAME: usize = 7;
    /// The wire counters from here, in [`super::wire_counter`] order.
    pub const COUNTERS: usize = 9;
    /// The daemon's pid (NICs with the same pid share one wire).
    pub const DAEMON_PID: usize = 18;
    /// The NIC's MTU.
    pub const MTU: usize = 19;
    /// Datagrams the wire sent with their payload read in place from host
    /// memory (Immediate Sending: no copy before the socket's own).
    pub const FROM_HOST: usize = 20;
}

/// Wire counters in a `WIRE_INFO` reply: index from [`wire_reply::COUNTERS`].
pub mod wire_counter {
    /// Frames sent.
    pub const SENT: usize = 0;
    /// Frames received and handed to a NIC.
    pub const RECEIVED: usize = 1;
    /// Lost on transmit: injected loss, no route, or refused by the socket.
    pub const LOST: usize = 2;
    /// Duplicated by fault injection.
    pub const DUPLICATED: usize = 3;
    /// Delayed out of order by fault injection.
    pub const REORDERED: usize = 4;
    /// Dropped: from an address, or claiming a node, not in the route table.
    pub const UNKNOWN_SOURCE: usize = 5;
    /// Dropped: from one node's address, claiming to be another node.
    pub const SOURCE_MISMATCH: usize = 6;
    /// Dropped: an Ethernet frame of another ethertype.
    pub const FOREIGN_ETHERTYPE: usize = 7;
    /// Dropped: too short, truncated, or not a valid EMP frame.
    pub const MALFORMED: usize = 8;
    /// How many.
    pub const COUNT: usize = 9;
    /// Their names, in order (as `emp info` prints them).
    pub const NAMES: [&str; COUNT] = [
        "sent",
        "received",
        "lost",
        "duplicated",
        "reordered",
        "unknown_source",
        "source_mismatch",
        "foreign_ethertype",
        "malformed",
    ];
}

/// `WIRE_INFO` wire kinds.
pub mod wire_kind {
    /// The in-process switch between the NICs of one daemon.
    pub const MEM: u64 = 1;
    /// UDP datagrams.
    pub const UDP: u64 = 2;
    /// Raw Ethernet frames (AF_PACKET).
    pub const PACKET: u64 = 3;
}

/// `WIRE_INFO` link flags.
pub mod link_flags {
    /// The NIC has a named interface (the other link fields are valid
    /// unless [`ERROR`] is set).
    pub const KNOWN: u64 = 1;
    /// Administratively up with carrier.
    pub const UP: u64 = 2;
    /// The interface could not be read (gone, renamed).
    pub const ERROR: u64 = 4;
}

/// Route entries in one `WIRE_ROUTES` reply.
pub const ROUTES_PER_PAGE: usize = 7;

// A page and the `WIRE_INFO` fields fit in `AttachMsg::arg`, the counters
// before the pid.
const _: () = assert!(3 * ROUTES_PER_PAGE < 22);
const _: () = assert!(
    wire_reply::MTU < wire_reply::FROM_HOST
        && wire_reply::FROM_HOST <= 21
        && wire_reply::COUNTERS + wire_counter::COUNT <= wire_reply::DAEMON_PID
);

/// One route table entry as `WIRE_ROUTES` carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteWords {
    /// IPv6 address (IPv4 as `::ffff:a.b.c.d`); meaningful when `udp_port` is not 0.
    pub ip6: [u8; 16],
    /// UDP port, 0 when the node has no UDP address.
    pub udp_port: u16,
    /// Ethernet address, all zero when the node has none.
    pub mac: [u8; 6],
}

/// The `WIRE_ROUTES` reply layout: `arg[0]` = nodes in the table (low 32
/// bits) | entries in this page << 32; entry `i` (node first + i) in
/// `arg[1 + 3i ..= 3 + 3i]`.
pub mod route_page {
    use super::RouteWords;

    /// Packs the page header.
    pub fn header(nodes: u32, count: u32) -> u64 {
        nodes as u64 | (count as u64) << 32
    }

    /// (nodes in the table, entries in this page).
    pub fn parse_header(w: u64) -> (u32, u32) {
        (w as u32, (w >> 32) as u32)
    }

    /// Entry `r` as three words.
    pub fn encode(r: &RouteWords) -> [u64; 3] {
        let mut mac = [0u8; 8];
        mac[2..].copy_from_slice(&r.mac);
        [
            u64::from_be_bytes(r.ip6[..8].try_into().expect("8 bytes")),
            u64::from_be_bytes(r.ip6[8..].try_into().expect("8 bytes")),
            r.udp_port as u64 | u64::from_be_bytes(mac) << 16,
        ]
    }

    /// The entry three words hold.
    pub fn decode(w: &[u64; 3]) -> RouteWords {
        let mut ip6 = [0u8; 16];
        ip6[..8].copy_from_slice(&w[0].to_be_bytes());
        ip6[8..].copy_from_slice(&w[1].to_be_bytes());
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&(w[2] >> 16).to_be_bytes()[2..]);
        RouteWords { ip6, udp_port: w[2] as u16, mac }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_words_round_trip() {
        let r = RouteWords {
            ip6: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            udp_port: 47001,
            mac: [2, 0, 0xc6, 0x12, 0xa0, 0xff],
        };
        assert_eq!(route_page::decode(&route_page::encode(&r)), r);
        assert_eq!(route_page::decode(&[0; 3]), RouteWords::default());
        assert_eq!(route_page::parse_header(route_page::header(70000, 7)), (70000, 7));
    }
}
