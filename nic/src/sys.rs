//! The few Linux descriptors the NIC signals and sleeps on: eventfds
//! (doorbells, interrupts, the engine's wake-up) and epoll registration.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A new eventfd (close-on-exec) with extra `flags` such as `EFD_NONBLOCK`.
pub(crate) fn eventfd(flags: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd with valid flags returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, flags | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd.
pub(crate) fn signal(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from a live buffer to an eventfd.
    unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
}

/// Empties a nonblocking eventfd.
pub(crate) fn drain(fd: RawFd) {
    let mut b = [0u8; 8];
    // SAFETY: reading 8 bytes into a live buffer; nonblocking fd.
    unsafe { libc::read(fd, b.as_mut_ptr().cast(), 8) };
}

/// Wakes epoll instance `ep` when `fd` is readable; the event carries `fd`.
pub(crate) fn epoll_add(ep: RawFd, fd: RawFd) {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
    // SAFETY: valid epoll fd and target fd; `ev` is a live struct.
    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
}
