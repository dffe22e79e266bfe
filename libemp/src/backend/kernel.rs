//! The kernel backend: `/dev/emp-nic` from `emp.ko`. The control path is
//! the ioctls of `emp_uapi::ioctl` (QUERY, REG_MR, DEREG_MR, START,
//! SET_EVENTFD, ARM, GROUP_SET, GROUP_CLEAR, PORT_CTX, GANG); the NIC polls
//! the rings, so there is no doorbell.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use emp_uapi::desc::{Sge, MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_uapi::ioctl::{
    port_ctx, EmpArm, EmpDeregMr, EmpGang, EmpGroupClear, EmpGroupSet, EmpPortCtx, EmpQuery, EmpRegMr, EmpSetEventfd,
    EmpStart, EMP_IOC_ARM, EMP_IOC_DEREG_MR, EMP_IOC_GANG, EMP_IOC_GROUP_CLEAR, EMP_IOC_GROUP_SET, EMP_IOC_PORT_CTX,
    EMP_IOC_QUERY, EMP_IOC_REG_MR, EMP_IOC_SET_EVENTFD, EMP_IOC_START,
};
use emp_uapi::sram::GroupEntry;
use emp_uapi::Le;

use super::Attached;
use crate::map::Mapping;
use crate::{Error, PortInfo, Result};

/// Default arena for the kernel backend (pinned memory: keep it modest).
const ARENA_DEFAULT_MB: usize = 16;

/// An open `/dev/emp-nic` port.
pub(crate) struct Chardev {
    dev: OwnedFd,
    /// The window's length (mapped again after a restore).
    window_len: usize,
    /// The eventfd handed to the driver (SET_EVENTFD) when the NIC has an
    /// interrupt; without one, waiting polls.
    event: Option<OwnedFd>,
}

fn ioctl_buf(fd: RawFd, cmd: u32, buf: &mut [u8], what: &'static str) -> Result<()> {
    // SAFETY: `buf` is as large as the command's size field says.
    let r = unsafe { libc::ioctl(fd, cmd as _, buf.as_mut_ptr()) };
    if r != 0 {
        return Err(Error::Nic {
            op: what,
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO),
        });
    }
    Ok(())
}

/// Returns the key and its remote-access secret.
fn reg_mr(fd: RawFd, addr: u64, length: u64, access: u8) -> Result<(u32, u32)> {
    let mut b = [0u8; EmpRegMr::SIZE];
    EmpRegMr { size: EmpRegMr::SIZE as u32, access: access as u32, addr, length, ..Default::default() }.put(&mut b);
    ioctl_buf(fd, EMP_IOC_REG_MR, &mut b, "register memory")?;
    let r = EmpRegMr::get(&b);
    Ok((r.key, r.secret))
}

/// Hands the driver an eventfd for completion events; `None` when the NIC
/// has no interrupt (`EOPNOTSUPP`: e.g. an `ivshmem-plain` function).
fn set_event_fd(fd: RawFd) -> Result<Option<OwnedFd>> {
    // SAFETY: creating an eventfd; we own the result.
    let e = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if e < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a fresh descriptor we own.
    let event = unsafe { OwnedFd::from_raw_fd(e) };
    let mut b = [0u8; EmpSetEventfd::SIZE];
    EmpSetEventfd { size: EmpSetEventfd::SIZE as u32, fd: e, ..Default::default() }.put(&mut b);
    match ioctl_buf(fd, EMP_IOC_SET_EVENTFD, &mut b, "set event fd") {
        Ok(()) => Ok(Some(event)),
        Err(Error::Nic { errno: libc::EOPNOTSUPP, .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

impl Chardev {
    /// Opens a port through the driver: maps its window, pins and
    /// registers an arena (size from `EMP_ARENA_MB`), starts the port with
    /// a CQ of `cq_entries` at the arena's start and hands over an eventfd.
    pub(crate) fn open(path: &str, cq_entries: u32) -> Result<Attached<Chardev>> {
        let c = CString::new(path).map_err(|_| Error::NoDevice)?;
        // SAFETY: opening a valid C path.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: a fresh descriptor we own.
        let dev = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut b = [0u8; EmpQuery::SIZE];
        EmpQuery { size: EmpQuery::SIZE as u32, ..Default::default() }.put(&mut b);
        ioctl_buf(dev.as_raw_fd(), EMP_IOC_QUERY, &mut b, "query")?;
        let q = EmpQuery::get(&b);
        let info = PortInfo {
            node: q.node_id,
            port: q.port,
            mtu: q.mtu,
            send_entries: q.send_entries,
            recv_entries: q.recv_entries,
            nodes: u32::MAX,
            port_count: q.port_count as u32,
            msg_max: q.msg_max,
            features: q.features,
        };
        let window = Mapping::shared(dev.as_raw_fd(), q.window_size as usize)?;
        let arena_len =
            std::env::var("EMP_ARENA_MB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(ARENA_DEFAULT_MB) << 20;
        let arena = Mapping::anonymous_populated(arena_len)?;
        let (key, _) = reg_mr(dev.as_raw_fd(), arena.ptr() as u64, arena_len as u64, MR_LOCAL_READ | MR_LOCAL_WRITE)?;
        let mut s = [0u8; EmpStart::SIZE];
        EmpStart { size: EmpStart::SIZE as u32, cq_entries, cq_key: key, ..Default::default() }.put(&mut s);
        ioctl_buf(dev.as_raw_fd(), EMP_IOC_START, &mut s, "start port")?;
        let event = set_event_fd(dev.as_raw_fd())?;
        let window_len = q.window_size as usize;
        Ok(Attached { backend: Chardev { dev, window_len, event }, window, info, arena, arena_key: key })
    }

    /// REG_MR: pins and registers `[addr, addr + len)` of this process.
    pub(crate) fn reg_mr(&self, addr: u64, len: u64, access: u8) -> Result<(u32, u32)> {
        reg_mr(self.dev.as_raw_fd(), addr, len, access)
    }

    pub(crate) fn dereg_mr(&self, key: u32) -> Result<()> {
        let mut b = [0u8; EmpDeregMr::SIZE];
        EmpDeregMr { size: EmpDeregMr::SIZE as u32, key }.put(&mut b);
        ioctl_buf(self.dev.as_raw_fd(), EMP_IOC_DEREG_MR, &mut b, "deregister memory")
    }

    /// ARM through the driver, which must know the port is armed to route
    /// the interrupt (it writes the ARM word itself). False when the port
    /// has no interrupt or the driver refused: the caller arms the word.
    pub(crate) fn arm(&self) -> bool {
        if self.event.is_none() {
            return false;
        }
        let mut b = [0u8; EmpArm::SIZE];
        EmpArm { size: EmpArm::SIZE as u32, events: 1 }.put(&mut b);
        ioctl_buf(self.dev.as_raw_fd(), EMP_IOC_ARM, &mut b, "arm").is_ok()
    }

    pub(crate) fn event_fd(&self) -> Option<RawFd> {
        self.event.as_ref().map(|e| e.as_raw_fd())
    }

    /// GROUP_SET: the driver copies the group entry from `entry` (this
    /// process's memory), checks it and has the NIC load it; returns the
    /// slot.
    pub(crate) fn group_set(&self, entry: &[u8]) -> Result<u32> {
        if entry.len() < GroupEntry::SIZE {
            return Err(Error::InvalidArgument("group entry shorter than GroupEntry::SIZE".into()));
        }
        let mut b = [0u8; EmpGroupSet::SIZE];
        EmpGroupSet { size: EmpGroupSet::SIZE as u32, entry: entry.as_ptr() as u64, ..Default::default() }.put(&mut b);
        ioctl_buf(self.dev.as_raw_fd(), EMP_IOC_GROUP_SET, &mut b, "set group")?;
        Ok(EmpGroupSet::get(&b).slot)
    }

    /// PORT_CTX step `op` with no image (SUSPEND, STABLE, RESUME); returns
    /// the driver's result (STABLE: 1 when stable).
    pub(crate) fn port_ctx(&self, op: u32) -> Result<u64> {
        self.port_ctx_at(op, Sge { key: 0, offset: 0, len: 0 }, "context switch")
    }

    fn port_ctx_at(&self, op: u32, at: Sge, what: &'static str) -> Result<u64> {
        let mut b = [0u8; EmpPortCtx::SIZE];
        let q = EmpPortCtx {
            size: EmpPortCtx::SIZE as u32,
            op,
            key: at.key,
            offset: at.offset,
            len: at.len as u64,
            ..Default::default()
        };
        q.put(&mut b);
        ioctl_buf(self.dev.as_raw_fd(), EMP_IOC_PORT_CTX, &mut b, what)?;
        Ok(EmpPortCtx::get(&b).result)
    }

    /// C6 into registered memory `at` (its `len` is the room); returns the
    /// image's length.
    pub(crate) fn save(&self, at: Sge) -> Result<u64> {
        self.port_ctx_at(port_ctx::SAVE, at, "save port")
    }

    /// C7 from registered memory `at` into any free slot; returns the new
    /// slot's window (this file mapped again) and the slot.
    pub(crate) fn restore(&self, at: Sge) -> Result<(Mapping, u16)> {
        let slot = self.port_ctx_at(port_ctx::RESTORE, at, "restore port")?;
        Ok((Mapping::shared(self.dev.as_raw_fd(), self.window_len)?, slot as u16))
    }

    /// GROUP_CLEAR: retires a group slot of this port.
    pub(crate) fn group_clear(&self, slot: u32) -> Result<()> {
        let mut b = [0u8; EmpGroupClear::SIZE];
        EmpGroupClear { size: EmpGroupClear::SIZE as u32, slot }.put(&mut b);
        ioctl_buf(self.dev.as_raw_fd(), EMP_IOC_GROUP_CLEAR, &mut b, "clear group")
    }
}

/// GANG `action` on every port process `pid` holds on the NIC at `path`,
/// through a read-only file (which holds no port); returns (ports acted
/// on, stable ones for STABLE).
pub(crate) fn gang(path: &str, action: u64, pid: i32) -> Result<(u64, u64)> {
    let c = CString::new(path).map_err(|_| Error::NoDevice)?;
    // SAFETY: opening a valid C path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a fresh descriptor we own.
    let dev = unsafe { OwnedFd::from_raw_fd(fd) };
    let action = u32::try_from(action).map_err(|_| Error::invalid(format!("gang action {action}")))?;
    let mut b = [0u8; EmpGang::SIZE];
    EmpGang { size: EmpGang::SIZE as u32, action, pid, ..Default::default() }.put(&mut b);
    ioctl_buf(dev.as_raw_fd(), EMP_IOC_GANG, &mut b, "gang")?;
    let r = EmpGang::get(&b);
    Ok((r.ports, r.stable))
}
