//! `emp`: the EMP verbs library. Open a device, register memory, post tagged
//! sends and receives straight into the NIC's rings, poll completions, block
//! on an armed event.
//!
//! ```no_run
//! let mut dev = emp::Device::open()?;          // EMP_DEVICE
//! let buf = dev.alloc(4096)?;                  // registered, zero-copy
//! dev.post_recv(1, emp::ANY, 7, 0, &[buf.sge(0, 4096)])?;
//! let mut wc = [emp::Completion::default(); 16];
//! let n = dev.wait_cq(&mut wc, None)?;
//! # Ok::<(), emp::Error>(())
//! ```
//!
//! The data path (post, poll) is loads and stores to the mapped port window
//! and shared memory: no system call. The only exception is the doorbell
//! after a post when the NIC has gone to sleep (it polls while busy).

#![warn(missing_docs)]

pub mod atomic;
mod backend;
pub mod coll;
mod device;
pub mod ffi;
pub mod group;
pub mod host_atomics;
mod map;
pub mod mcs;
mod persist;
mod pmix;
mod probe;
pub mod rdv;
mod ring;
pub mod rma;
pub mod schedule;
pub mod tree;

use std::fmt;
use std::os::fd::RawFd;

pub use atomic::{RemoteWord, Width};
pub use backend::direct::{
    nic_counters_at, nic_gang, nic_routes, nic_stats, nic_wire_auth, nic_wire_info, nic_wire_mcast, nic_wire_rekey,
    Link, RouteInfo, WireAuth, WireInfo, WireKind, WireMcast,
};
pub use backend::COUNTERS;
pub use device::{Device, INTERNAL_WR};
pub use emp_uapi::coll::{BarrierAlgo, Dtype, RbcastAlgo, ReduceOp};
pub use emp_uapi::desc::RemoteSge;
pub use emp_uapi::desc::{
    Opcode, Sge, Status, MR_LOCAL_READ, MR_LOCAL_WRITE, MR_REMOTE_ATOMIC, MR_REMOTE_READ, MR_REMOTE_WRITE,
    PERSIST_SLOTS,
};
pub use emp_uapi::{ANY_NODE, ANY_PORT};
pub use group::{CostModel, Group, GroupOpts, RBCAST_THRESHOLD_DEFAULT};
pub use probe::{Claim, Probed};

/// An endpoint: (node, port).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// Node id.
    pub node: u16,
    /// Port on that node.
    pub port: u16,
}

/// "Any source" for receives.
pub const ANY: Endpoint = Endpoint { node: ANY_NODE, port: ANY_PORT };

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.node, self.port)
    }
}

/// Errors of the control path and of posting.
#[derive(Debug)]
pub enum Error {
    /// A system call failed.
    Os(std::io::Error),
    /// `EMP_DEVICE` is not set and no path was given.
    NoDevice,
    /// The NIC refused a request (errno from the daemon).
    Nic {
        /// The request refused.
        op: &'static str,
        /// Why (a positive errno).
        errno: i32,
    },
    /// The daemon went away or spoke nonsense.
    Protocol(String),
    /// The ring has no free slot: poll completions, then post again.
    RingFull,
    /// Too many scatter/gather entries (at most 6).
    TooManySges,
    /// Out of registered arena memory.
    ArenaFull,
    /// Timed out waiting.
    Timeout,
    /// An operation completed with an error status.
    Failed(Status),
    /// Not available on this kind of device.
    Unsupported(&'static str),
    /// A reduction operator not defined for the element type (bitwise on
    /// floats).
    InvalidOp {
        /// The element type.
        dtype: emp_uapi::coll::Dtype,
        /// The operator not defined on it.
        op: emp_uapi::coll::ReduceOp,
    },
    /// A library call got arguments it cannot use (checked before anything
    /// is posted); says which and why.
    InvalidArgument(String),
    /// The job could not be set up: no launcher's environment (neither
    /// `emp run`'s nor PMIx's), a PMIx call failed, the rendezvous timed
    /// out, or the cluster file does not say which NIC this rank uses.
    Job(String),
    /// A host-run collective failed: `what` names the call, its instance,
    /// the rank and the step; `cause` is the underlying error (an error
    /// completion, [`Status::CollMismatch`] for a message of the wrong size,
    /// a timeout).
    Collective {
        /// The call, its instance, the rank and the step.
        what: String,
        /// The underlying error.
        cause: Box<Error>,
    },
}

impl Error {
    /// The completion status behind this error, seen through
    /// [`Error::Collective`], if it has one.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Failed(st) => Some(*st),
            Error::Collective { cause, .. } => cause.status(),
            _ => None,
        }
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub(crate) fn invalid(why: impl Into<String>) -> Error {
        Error::InvalidArgument(why.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Os(e) => write!(f, "{e}"),
            Error::NoDevice => write!(
                f,
                "EMP_DEVICE is not set (path of an emp-nicd socket or /dev/emp-nic) and, for a job, neither is \
                 EMP_CLUSTER (a cluster file: this host's nodes, by local rank)"
            ),
            Error::Nic { op, errno } => write!(f, "{op}: {}", std::io::Error::from_raw_os_error(*errno)),
            Error::Protocol(s) => write!(f, "NIC connection: {s}"),
            Error::RingFull => write!(f, "ring full"),
            Error::TooManySges => write!(f, "too many scatter/gather entries"),
            Error::ArenaFull => write!(f, "registered arena exhausted"),
            Error::Timeout => write!(f, "timed out"),
            Error::Failed(st) => write!(f, "completed with error: {}", st.as_str()),
            Error::Unsupported(what) => write!(f, "not supported: {what}"),
            Error::InvalidOp { dtype, op } => write!(f, "{} is not defined on {}", op.name(), dtype.name()),
            Error::InvalidArgument(s) => write!(f, "invalid argument: {s}"),
            Error::Job(s) => write!(f, "job: {s}"),
            Error::Collective { what, cause } => write!(f, "{what}: {cause}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Os(e) => Some(e),
            Error::Collective { cause, .. } => Some(cause.as_ref()),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Os(e)
    }
}

impl From<nix::Error> for Error {
    fn from(e: nix::Error) -> Self {
        Error::Os(std::io::Error::from_raw_os_error(e as i32))
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

/// What a port is.
#[derive(Clone, Copy, Debug, Default)]
pub struct PortInfo {
    /// This port's endpoint.
    pub node: u16,
    /// Port number.
    pub port: u16,
    /// MTU.
    pub mtu: u32,
    /// Send ring entries.
    pub send_entries: u32,
    /// Receive ring entries.
    pub recv_entries: u32,
    /// Nodes reachable.
    pub nodes: u32,
    /// Ports per NIC.
    pub port_count: u32,
    /// Largest message.
    pub msg_max: u64,
    /// NIC feature bits.
    pub features: u32,
}

impl PortInfo {
    /// This port as an endpoint.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint { node: self.node, port: self.port }
    }
}

/// A work completion (like `ibv_wc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The posted cookie.
    pub wr_id: u64,
    /// Outcome.
    pub status: Status,
    /// True for a receive.
    pub is_recv: bool,
    /// Bytes transferred.
    pub byte_len: u32,
    /// Receive: the message's tag.
    pub tag: u64,
    /// Receive: the sender.
    pub src: Endpoint,
    /// Receive: the message's full length.
    pub msg_len: u32,
    /// The completed descriptor's opcode (like `ibv_wc.opcode`).
    pub opcode: Opcode,
    /// Remote atomics: the word's value before the operation (also
    /// written to the descriptor's result word). 0 otherwise.
    pub old: u64,
    /// Receive or probe: the immediate data the sender attached
    /// ([`Device::post_send_imm`]), if any.
    pub imm: Option<u32>,
}

impl Default for Completion {
    fn default() -> Self {
        Completion {
            wr_id: 0,
            status: Status::Success,
            is_recv: false,
            byte_len: 0,
            tag: 0,
            src: Endpoint { node: 0, port: 0 },
            msg_len: 0,
            opcode: Opcode::Send,
            old: 0,
            imm: None,
        }
    }
}

/// Registered memory handed out by [`Device::alloc`]: lives in the shared
/// arena (true zero-copy) until the device is closed.
///
/// A `Buffer` is the only handle through which Rust code reaches its bytes:
/// it is neither `Clone` nor `Copy`, and its sub-ranges ([`Buffer::range`])
/// are [`MemSpan`]s, which name memory for the NIC but give no access to it.
/// So [`Buffer::as_mut_slice`] needs `&mut self`, like any owner.
///
/// # Examples
/// ```no_run
/// # let mut dev = emp::Device::open()?;
/// let mut buf = dev.alloc(8192)?;
/// buf.as_mut_slice()[..4].copy_from_slice(b"ping");
/// let (head, tail) = (buf.range(0, 4096), buf.range(4096, 4096)); // Copy handles
/// dev.post_recv(1, emp::ANY, 7, 0, &[tail.sge(0, tail.len())])?;
/// dev.post_send(2, emp::Endpoint { node: 1, port: 0 }, 7, &[head.sge(0, 4)])?;
/// # Ok::<(), emp::Error>(())
/// ```
#[derive(Debug)]
pub struct Buffer {
    ptr: *mut u8,
    len: usize,
    key: u32,
    secret: u32,
    offset: u64,
}

// SAFETY: a Buffer is the sole handle to its part of the device's arena,
// which outlives it; moving it to another thread moves that access with it.
// What the NIC writes concurrently is the posting caller's business, as with
// any DMA buffer.
unsafe impl Send for Buffer {}

impl Buffer {
    /// The bytes, to read (valid while the device is open). The NIC writes
    /// received data here: read it only after the receive completed.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr/len describe a live part of the arena mapping; no
        // `&mut` to it exists while `self` is borrowed shared (the only way
        // to one is `as_mut_slice(&mut self)`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, to write (see [`Buffer::as_slice`]); write only what no
    /// posted send is still reading.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr/len describe a live part of the arena mapping that
        // only this Buffer reaches (the arena hands each part out once and
        // a Buffer cannot be copied), and `&mut self` makes this view
        // exclusive for its lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather entry for `len` bytes at `off` within this buffer.
    ///
    /// # Panics
    /// If the range is not inside this buffer.
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        self.span().sge(off, len)
    }

    /// The key other ports name this buffer's region by, with its
    /// remote-access secret (hand it to them out of band). Only a buffer of
    /// [`Device::alloc_mr`] with remote rights can be reached with it.
    pub fn remote_key(&self) -> RemoteKey {
        RemoteKey { key: self.key, secret: self.secret }
    }

    /// Byte `off` of this buffer as another port addresses it in remote
    /// writes and reads ([`Device::post_write`], [`Device::post_read`]).
    ///
    /// # Panics
    /// If `off` is beyond the buffer.
    pub fn remote_addr(&self, off: usize) -> RemoteAddr {
        assert!(off <= self.len, "remote address beyond buffer");
        RemoteAddr { key: self.remote_key(), offset: self.offset + off as u64 }
    }

    /// The whole buffer as the NIC names it.
    pub fn span(&self) -> MemSpan {
        MemSpan { key: self.key, offset: self.offset, len: self.len }
    }

    /// The `len` bytes at `off`, as the NIC names them (for posting; reach
    /// the bytes themselves through [`Buffer::as_mut_slice`]).
    ///
    /// # Panics
    /// If the range is not inside this buffer.
    pub fn range(&self, off: usize, len: usize) -> MemSpan {
        self.span().range(off, len)
    }
}

/// A span of registered memory as the NIC names it: key, offset, length.
/// `Copy`, and grants no access to the bytes: it is what posting needs
/// (SGEs), taken from a [`Buffer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemSpan {
    key: u32,
    offset: u64,
    len: usize,
}

impl MemSpan {
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A scatter/gather entry for `len` bytes at `off` within this span.
    ///
    /// # Panics
    /// If the range is not inside this span.
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        assert!(off.checked_add(len).is_some_and(|end| end <= self.len), "sge beyond buffer");
        Sge { key: self.key, len: len as u32, offset: self.offset + off as u64 }
    }

    /// The `len` bytes at `off` as a span of their own.
    ///
    /// # Panics
    /// If the range is not inside this span.
    pub fn range(&self, off: usize, len: usize) -> MemSpan {
        assert!(off.checked_add(len).is_some_and(|end| end <= self.len), "range beyond buffer");
        MemSpan { key: self.key, offset: self.offset + off as u64, len }
    }
}

impl From<&Buffer> for MemSpan {
    fn from(b: &Buffer) -> MemSpan {
        b.span()
    }
}

/// A region registered by address (the NIC reaches it through
/// `process_vm_readv/writev`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRegion {
    /// Key.
    pub key: u32,
    /// Remote-access secret (see [`RemoteKey`]).
    pub secret: u32,
    /// Start address.
    pub addr: usize,
    /// Length.
    pub len: usize,
}

/// How another port names a registered region in remote accesses: the
/// region's key and the 32-bit secret the NIC generated with it (from the
/// OS's random generator). The target NIC checks both, so a remote key
/// has 48 bits of which at least 32 cannot be guessed. Exchange it as one
/// `u64` ([`RemoteKey::as_u64`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RemoteKey {
    /// The region's key.
    pub key: u32,
    /// The region's remote-access secret.
    pub secret: u32,
}

impl RemoteKey {
    /// As one word: the secret in the high 32 bits, the key in the low.
    pub const fn as_u64(self) -> u64 {
        (self.secret as u64) << 32 | self.key as u64
    }

    /// From [`RemoteKey::as_u64`].
    pub const fn from_u64(v: u64) -> RemoteKey {
        RemoteKey { key: v as u32, secret: (v >> 32) as u32 }
    }
}

/// A byte of another port's registered memory: region and offset within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// The region.
    pub key: RemoteKey,
    /// Byte offset within the region.
    pub offset: u64,
}

impl RemoteAddr {
    /// The address `n` bytes further on.
    pub fn offset_by(self, n: u64) -> RemoteAddr {
        RemoteAddr { offset: self.offset + n, ..self }
    }
}

impl MemoryRegion {
    /// The key other ports name this region by (see [`RemoteKey`]).
    pub fn remote_key(&self) -> RemoteKey {
        RemoteKey { key: self.key, secret: self.secret }
    }

    /// A scatter/gather entry for `[addr, addr+len)` inside the region.
    pub fn sge(&self, addr: usize, len: usize) -> Sge {
        assert!(addr >= self.addr && addr + len <= self.addr + self.len, "sge outside region");
        Sge { key: self.key, len: len as u32, offset: (addr - self.addr) as u64 }
    }
}

/// Something with a pollable event descriptor.
pub trait EventSource {
    /// The eventfd that becomes readable after an armed completion.
    fn event_fd(&self) -> RawFd;
}
