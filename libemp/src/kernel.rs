//! The kernel backend: `/dev/emp-nic` from `emp.ko`. The control path is
//! ioctls (QUERY, REG_MR, DEREG_MR, START, SET_EVENTFD, ARM, GROUP_SET,
//! GROUP_CLEAR); the data path is the same
//! mapped window and completion queue as direct attach.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use emp_uapi::desc::{MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_uapi::ioctl::{
    EmpArm, EmpDeregMr, EmpGroupClear, EmpGroupSet, EmpQuery, EmpRegMr, EmpSetEventfd, EmpStart, EMP_IOC_ARM,
    EMP_IOC_DEREG_MR, EMP_IOC_GROUP_CLEAR, EMP_IOC_GROUP_SET, EMP_IOC_QUERY, EMP_IOC_REG_MR, EMP_IOC_SET_EVENTFD,
    EMP_IOC_START,
};
use emp_uapi::sram::GroupEntry;
use emp_uapi::Le;

use crate::direct::{map_shared, Control, CQ_ENTRIES};
use crate::{Device, Error, PortInfo, Result};

/// Default arena for the kernel backend (pinned memory: keep it modest).
const ARENA_DEFAULT_MB: usize = 16;

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

pub(crate) fn reg_mr(fd: RawFd, addr: u64, length: u64, access: u8) -> Result<u32> {
    let mut b = [0u8; EmpRegMr::SIZE];
    EmpRegMr { size: EmpRegMr::SIZE as u32, access: access as u32, addr, length, ..Default::default() }.put(&mut b);
    ioctl_buf(fd, EMP_IOC_REG_MR, &mut b, "register memory")?;
    Ok(EmpRegMr::get(&b).key)
}

pub(crate) fn dereg_mr(fd: RawFd, key: u32) -> Result<()> {
    let mut b = [0u8; EmpDeregMr::SIZE];
    EmpDeregMr { size: EmpDeregMr::SIZE as u32, key }.put(&mut b);
    ioctl_buf(fd, EMP_IOC_DEREG_MR, &mut b, "deregister memory")
}

/// GROUP_SET: the driver copies the group entry (`GroupEntry::SIZE`
/// bytes) from `entry`, checks it and has the NIC load it; returns the slot.
pub(crate) fn group_set(fd: RawFd, entry: &[u8]) -> Result<u32> {
    if entry.len() < GroupEntry::SIZE {
        return Err(Error::InvalidArgument("group entry shorter than GroupEntry::SIZE".into()));
    }
    let mut b = [0u8; EmpGroupSet::SIZE];
    EmpGroupSet { size: EmpGroupSet::SIZE as u32, entry: entry.as_ptr() as u64, ..Default::default() }.put(&mut b);
    ioctl_buf(fd, EMP_IOC_GROUP_SET, &mut b, "set group")?;
    Ok(EmpGroupSet::get(&b).slot)
}

/// GROUP_CLEAR: retires a group slot of this port.
pub(crate) fn group_clear(fd: RawFd, slot: u32) -> Result<()> {
    let mut b = [0u8; EmpGroupClear::SIZE];
    EmpGroupClear { size: EmpGroupClear::SIZE as u32, slot }.put(&mut b);
    ioctl_buf(fd, EMP_IOC_GROUP_CLEAR, &mut b, "clear group")
}

/// ARM: the next completion signals the port's eventfd.
pub(crate) fn arm(fd: RawFd) -> Result<()> {
    let mut b = [0u8; EmpArm::SIZE];
    EmpArm { size: EmpArm::SIZE as u32, events: 1 }.put(&mut b);
    ioctl_buf(fd, EMP_IOC_ARM, &mut b, "arm")
}

/// Hands the driver an eventfd for completion events; `None` when the NIC
/// has no interrupt (`EOPNOTSUPP`: e.g. an `ivshmem-plain` function).
fn event_fd(fd: RawFd) -> Result<Option<OwnedFd>> {
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

/// Opens a port through the driver.
pub(crate) fn open(path: &str) -> Result<Device> {
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
    let window_len = q.window_size as usize;
    let window = map_shared(dev.as_raw_fd(), window_len)?;
    let arena_len =
        std::env::var("EMP_ARENA_MB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(ARENA_DEFAULT_MB) << 20;
    // SAFETY: a fresh private anonymous mapping, pinned by REG_MR below.
    let arena = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            arena_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    if arena == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().into());
    }
    let key = reg_mr(dev.as_raw_fd(), arena as u64, arena_len as u64, MR_LOCAL_READ | MR_LOCAL_WRITE)?;
    let mut s = [0u8; EmpStart::SIZE];
    EmpStart { size: EmpStart::SIZE as u32, cq_entries: CQ_ENTRIES, cq_key: key, ..Default::default() }.put(&mut s);
    ioctl_buf(dev.as_raw_fd(), EMP_IOC_START, &mut s, "start port")?;
    let event = event_fd(dev.as_raw_fd())?;
    Ok(Device::assemble(
        Control::Kernel { dev, event },
        window,
        window_len,
        info,
        (arena.cast(), arena_len, key, None),
        0,
    ))
}
