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
//!    rank, the trees are trees).
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
    /// encoded `GroupEntry` in the caller's registered memory → reply
    /// `arg[0]` = slot.
    pub const GROUP_SET: u32 = 7;
    /// Retire group slot `arg[0]`.
    pub const GROUP_CLEAR: u32 = 8;
    /// Counters beyond the first 16: reply `arg[i]` = counter 16 + i.
    pub const STATS_EXT: u32 = 9;
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
