//! Shared mappings owned by a device: the port window and the arena. A
//! leaf module, so that both backends can map what they attach and the
//! device can own it without either reaching into the other.

use std::os::fd::RawFd;

use crate::Result;

/// A read-write mapping, unmapped on drop.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    /// Maps `len` bytes of `fd` from offset 0, shared (the NIC sees every
    /// store).
    pub(crate) fn shared(fd: RawFd, len: usize) -> Result<Mapping> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh mapping of a descriptor the caller holds; no
        // existing memory is affected.
        let p = unsafe { libc::mmap(core::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        Mapping::checked(p, len)
    }

    /// `len` bytes of private anonymous memory, populated up front (the
    /// kernel backend pins it when it is registered).
    pub(crate) fn anonymous_populated(len: usize) -> Result<Mapping> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE;
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let p = unsafe { libc::mmap(core::ptr::null_mut(), len, prot, flags, -1, 0) };
        Mapping::checked(p, len)
    }

    fn checked(p: *mut libc::c_void, len: usize) -> Result<Mapping> {
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// The first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping; whoever borrowed from it is gone (the
        // device drops its mappings last).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
