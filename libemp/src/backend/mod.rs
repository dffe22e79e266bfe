//! The control path of a device, by how the NIC is reached: an `emp-nicd`
//! socket ([`direct`]) or `/dev/emp-nic` ([`kernel`]). Registration,
//! doorbell, arming, the event descriptor, groups, counters and liveness go
//! through here; the data path (rings and CQ, `crate::device`) is the same
//! for both and never does. Like rdma-core's `verbs_context_ops`, minus the
//! post and poll entries: both backends share one descriptor format. Two
//! closed backends: an enum, not a trait object.

pub(crate) mod direct;
pub(crate) mod kernel;

use std::os::fd::RawFd;
use std::sync::atomic::AtomicU32;

use emp_uapi::desc::Sge;
use emp_uapi::ioctl::port_ctx;

use crate::map::Mapping;
use crate::{Error, PortInfo, Result};

/// Number of NIC counters (`emp_uapi::sram::counter`).
pub const COUNTERS: usize = emp_uapi::sram::counter::COUNT;

/// What opening a port yields: its control path and the memory the data
/// path runs on.
pub(crate) struct Attached<B> {
    pub(crate) backend: B,
    /// The port window: control page, send ring, receive ring.
    pub(crate) window: Mapping,
    pub(crate) info: PortInfo,
    /// Registered memory shared with the NIC; the CQ sits at its start.
    pub(crate) arena: Mapping,
    /// The arena's registration key.
    pub(crate) arena_key: u32,
}

impl<B> Attached<B> {
    fn map_backend<C>(self, f: impl FnOnce(B) -> C) -> Attached<C> {
        let Attached { backend, window, info, arena, arena_key } = self;
        Attached { backend: f(backend), window, info, arena, arena_key }
    }
}

/// How a device's control path is reached.
pub(crate) enum Backend {
    /// An `emp-nicd` NIC over its socket.
    Direct(direct::Daemon),
    /// `/dev/emp-nic` (emp.ko).
    Kernel(kernel::Chardev),
}

impl Backend {
    /// Opens `/dev/…` through the driver, anything else as an `emp-nicd`
    /// socket, and starts the port with a CQ of `cq_entries` at offset 0
    /// of the arena.
    pub(crate) fn open(path: &str, cq_entries: u32) -> Result<Attached<Backend>> {
        if path.starts_with("/dev/") {
            Ok(kernel::Chardev::open(path, cq_entries)?.map_backend(Backend::Kernel))
        } else {
            Ok(direct::Daemon::open(path, cq_entries)?.map_backend(Backend::Direct))
        }
    }

    /// Registers `[offset, offset + len)` of `arena` again with `access`.
    /// Returns the key and its remote-access secret (as does `reg_mr`).
    pub(crate) fn reg_arena_part(&self, arena: &Mapping, offset: usize, len: usize, access: u8) -> Result<(u32, u32)> {
        debug_assert!(offset.checked_add(len).is_some_and(|end| end <= arena.len()));
        match self {
            // The same memfd pages, registered by descriptor.
            Backend::Direct(d) => d.reg_arena_part(offset, len, access),
            Backend::Kernel(k) => k.reg_mr(arena.ptr() as u64 + offset as u64, len as u64, access),
        }
    }

    /// Does the NIC reach memory registered with [`Backend::reg_mr`] by
    /// virtual address at each access (direct attach: the daemon's
    /// `process_vm_readv`/`writev`), rather than through pages pinned at
    /// registration (the kernel driver)? Only then does a registration stay
    /// right when its memory is unmapped and mapped again, which is what a
    /// registration cache needs.
    pub(crate) fn mr_by_address(&self) -> bool {
        matches!(self, Backend::Direct(_))
    }

    /// Registers `[addr, addr + len)` of this process.
    pub(crate) fn reg_mr(&self, addr: u64, len: u64, access: u8) -> Result<(u32, u32)> {
        match self {
            Backend::Direct(d) => d.reg_vm(addr, len, access),
            Backend::Kernel(k) => k.reg_mr(addr, len, access),
        }
    }

    pub(crate) fn dereg_mr(&self, key: u32) -> Result<()> {
        match self {
            Backend::Direct(d) => d.dereg(key),
            Backend::Kernel(k) => k.dereg_mr(key),
        }
    }

    /// After a post has been published and fenced: wakes the NIC if it
    /// sleeps (`sleeping` is the port's NIC_SLEEPING word). The kernel
    /// backend's NIC polls, so there is nothing to ring.
    pub(crate) fn notify(&self, sleeping: &AtomicU32) {
        match self {
            Backend::Direct(d) => d.notify(sleeping),
            Backend::Kernel(_) => {}
        }
    }

    /// Arms the port through the control path where that is needed.
    /// False: the caller arms it by writing the port's ARM word.
    pub(crate) fn arm(&self) -> bool {
        match self {
            Backend::Direct(_) => false,
            Backend::Kernel(k) => k.arm(),
        }
    }

    /// The eventfd that becomes readable after an armed completion; `None`
    /// when the NIC has no interrupt (waiting polls).
    pub(crate) fn event_fd(&self) -> Option<RawFd> {
        match self {
            Backend::Direct(d) => Some(d.event_fd()),
            Backend::Kernel(k) => k.event_fd(),
        }
    }

    /// Loads a group entry into a NIC slot; returns the slot. `entry` is
    /// the encoded `GroupEntry` and `at` where it is in registered memory
    /// (the daemon reads it from there, the driver copies it from
    /// `entry`).
    pub(crate) fn group_set(&self, entry: &[u8], at: Sge) -> Result<u32> {
        match self {
            Backend::Direct(d) => d.group_set(at),
            Backend::Kernel(k) => k.group_set(entry),
        }
    }

    /// Context switch C1 (docs/context-switch.md).
    pub(crate) fn suspend(&self) -> Result<()> {
        match self {
            Backend::Direct(d) => d.port_ctx(emp_uapi::attach::op::PORT_SUSPEND),
            Backend::Kernel(k) => k.port_ctx(port_ctx::SUSPEND).map(|_| ()),
        }
    }

    /// C8.
    pub(crate) fn resume(&self) -> Result<()> {
        match self {
            Backend::Direct(d) => d.port_ctx(emp_uapi::attach::op::PORT_RESUME),
            Backend::Kernel(k) => k.port_ctx(port_ctx::RESUME).map(|_| ()),
        }
    }

    /// C2–C4.
    pub(crate) fn is_stable(&self) -> Result<bool> {
        match self {
            Backend::Direct(d) => d.is_stable(),
            Backend::Kernel(k) => k.port_ctx(port_ctx::STABLE).map(|r| r == 1),
        }
    }

    /// C6: the image's length.
    pub(crate) fn save(&self, at: Sge) -> Result<u64> {
        match self {
            Backend::Direct(d) => d.save(at),
            Backend::Kernel(k) => k.save(at),
        }
    }

    /// C7: the new window and the slot.
    pub(crate) fn restore(&self, at: Sge) -> Result<(Mapping, u16)> {
        match self {
            Backend::Direct(d) => d.restore(at),
            Backend::Kernel(k) => k.restore(at),
        }
    }

    /// Retires a group slot; its unfinished operations complete `Flushed`.
    pub(crate) fn group_clear(&self, slot: u32) -> Result<()> {
        match self {
            Backend::Direct(d) => d.group_clear(slot),
            Backend::Kernel(k) => k.group_clear(slot),
        }
    }

    /// Every NIC counter.
    pub(crate) fn counters(&self) -> Result<[u64; COUNTERS]> {
        match self {
            Backend::Direct(d) => d.counters(),
            Backend::Kernel(_) => {
                Err(Error::Protocol("NIC counters are read through emp-nicd, not /dev/emp-nic".into()))
            }
        }
    }

    /// The NIC processors' working time: (ns, batches).
    pub(crate) fn busy(&self) -> Result<(u64, u64)> {
        match self {
            Backend::Direct(d) => d.busy(),
            Backend::Kernel(_) => {
                Err(Error::Protocol("NIC busy time is read through emp-nicd, not /dev/emp-nic".into()))
            }
        }
    }

    /// Errors out if the NIC's owner is gone. The driver outlives the
    /// process, so only the daemon can vanish.
    pub(crate) fn check_alive(&self) -> Result<()> {
        match self {
            Backend::Direct(d) => d.check_alive(),
            Backend::Kernel(_) => Ok(()),
        }
    }
}
