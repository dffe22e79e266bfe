//! The DMA engine: bus addresses to host memory. A bus address names a
//! region the daemon registered, never raw process memory:
//! `space << 56 | region << 40 | offset`.
//! - arena (space 1): a memfd the process shared, mapped here: DMA is a copy;
//! - process VM (space 2): `process_vm_readv/writev` into the process.

use std::os::fd::{AsRawFd, OwnedFd};

/// Arena space.
pub const SPACE_ARENA: u64 = 1;
/// Process-memory space.
pub const SPACE_VM: u64 = 2;
/// Largest region (offset bits).
pub const REGION_MAX: u64 = 1 << 40;

/// Bus address of `offset` in region `id` of `space`.
pub const fn bus_addr(space: u64, id: u16, offset: u64) -> u64 {
    (space << 56) | ((id as u64) << 40) | offset
}

/// A DMA that missed: outside every region, or the process memory is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaFault;

/// One registered region.
pub enum Region {
    /// A shared memfd, mapped in the daemon.
    Arena { base: *mut u8, len: usize, _fd: OwnedFd },
    /// Memory of process `pid` at `addr`.
    Vm { pid: i32, addr: u64, len: u64 },
}

// SAFETY: the arena mapping is shared memory owned by this Region; it is
// only accessed through bounds-checked copies.
unsafe impl Send for Region {}

impl Region {
    /// Maps `len` bytes at `offset` of a process's memfd.
    pub fn map_arena(fd: OwnedFd, offset: u64, len: u64) -> std::io::Result<Region> {
        if len == 0 || len >= REGION_MAX || !offset.is_multiple_of(emp_uapi::PAGE_SIZE as u64) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // The file must be sealed against shrinking: a process that
        // truncated a registered arena would make the NIC's DMA fault
        // (SIGBUS) and take every port down with it.
        // SAFETY: fcntl(F_GET_SEALS) on a valid fd.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        // Refuse a mapping beyond the file: touching it would SIGBUS the NIC.
        // SAFETY: fstat on a valid fd into a zeroed struct.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if offset.checked_add(len).is_none_or(|e| e > st.st_size as u64) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: mapping a file range we checked exists, shared, read-write.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Region::Arena { base: p.cast(), len: len as usize, _fd: fd })
    }

    /// Maps a guest's RAM file (QEMU `memory-backend-file,share=on`): bus
    /// address = guest-physical address = file offset.
    pub fn map_guest_ram(path: &std::path::Path) -> std::io::Result<Region> {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        let len = f.metadata()?.len();
        if len == 0 || len >= REGION_MAX {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let fd: OwnedFd = f.into();
        // SAFETY: mapping the whole file (length just read), shared, read-write.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Region::Arena { base: p.cast(), len: len as usize, _fd: fd })
    }

    /// Bytes in the region.
    pub fn len(&self) -> u64 {
        match self {
            Region::Arena { len, .. } => *len as u64,
            Region::Vm { len, .. } => *len,
        }
    }

    /// True when empty (never, for a registered region).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `buf.len()` bytes at `off` out of the region.
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        if off.checked_add(buf.len() as u64).is_none_or(|e| e > self.len()) {
            return Err(DmaFault);
        }
        match self {
            Region::Arena { base, .. } => {
                // SAFETY: in range (checked); shared memory the process may
                // change concurrently, which a byte copy tolerates.
                unsafe { core::ptr::copy_nonoverlapping(base.add(off as usize), buf.as_mut_ptr(), buf.len()) };
                Ok(())
            }
            Region::Vm { pid, addr, .. } => vm_io(*pid, addr + off, buf.as_mut_ptr(), buf.len(), false),
        }
    }

    /// Copies `data` into the region at `off`.
    pub fn write(&self, off: u64, data: &[u8]) -> Result<(), DmaFault> {
        if off.checked_add(data.len() as u64).is_none_or(|e| e > self.len()) {
            return Err(DmaFault);
        }
        match self {
            Region::Arena { base, .. } => {
                // SAFETY: in range (checked).
                unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), base.add(off as usize), data.len()) };
                Ok(())
            }
            Region::Vm { pid, addr, .. } => vm_io(*pid, addr + off, data.as_ptr() as *mut u8, data.len(), true),
        }
    }
}

fn vm_io(pid: i32, remote: u64, local: *mut u8, len: usize, write: bool) -> Result<(), DmaFault> {
    if len == 0 {
        return Ok(());
    }
    let l = libc::iovec { iov_base: local.cast(), iov_len: len };
    let r = libc::iovec { iov_base: remote as *mut libc::c_void, iov_len: len };
    // SAFETY: `l` describes a live local buffer of `len` bytes (the caller's
    // slice); the kernel checks the remote range and our permission.
    let n = unsafe {
        if write {
            libc::process_vm_writev(pid, &l, 1, &r, 1, 0)
        } else {
            libc::process_vm_readv(pid, &l, 1, &r, 1, 0)
        }
    };
    if n == len as isize {
        Ok(())
    } else {
        Err(DmaFault)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Region::Arena { base, len, .. } = self {
            // SAFETY: our own mapping, no longer used.
            unsafe { libc::munmap(base.cast(), *len) };
        }
    }
}

/// Regions by id (the MR slot that owns them), or a guest's whole RAM.
pub struct DmaMap {
    regions: Vec<Option<Region>>,
    /// For a NIC serving a QEMU guest: its RAM, addressed physically (the
    /// guest's driver writes guest-physical addresses into the MR table).
    guest: Option<Region>,
}

impl DmaMap {
    /// Room for `n` regions.
    pub fn new(n: usize) -> DmaMap {
        DmaMap { regions: (0..n).map(|_| None).collect(), guest: None }
    }

    /// Serves a guest: DMA goes to its RAM by physical address.
    pub fn set_guest(&mut self, ram: Region) {
        self.guest = Some(ram);
    }

    /// Installs region `id`.
    pub fn insert(&mut self, id: u16, r: Region) {
        self.regions[id as usize] = Some(r);
    }

    /// Removes region `id`.
    pub fn remove(&mut self, id: u16) -> Option<Region> {
        self.regions.get_mut(id as usize)?.take()
    }

    fn resolve(&self, addr: u64) -> Option<(&Region, u64)> {
        if let Some(g) = &self.guest {
            // Anything outside guest RAM is refused (Region bounds-checks).
            return Some((g, addr));
        }
        let space = addr >> 56;
        let id = ((addr >> 40) & 0xFFFF) as usize;
        let off = addr & (REGION_MAX - 1);
        let r = self.regions.get(id)?.as_ref()?;
        let ok = matches!((space, r), (SPACE_ARENA, Region::Arena { .. }) | (SPACE_VM, Region::Vm { .. }));
        ok.then_some((r, off))
    }

    /// Whether a DMA of `len` bytes at `addr` would land in a region
    /// (without moving a byte).
    pub fn check(&self, addr: u64, len: usize) -> Result<(), DmaFault> {
        let (r, off) = self.resolve(addr).ok_or(DmaFault)?;
        match off.checked_add(len as u64) {
            Some(end) if end <= r.len() => Ok(()),
            _ => Err(DmaFault),
        }
    }

    /// DMA read.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaFault> {
        let (r, off) = self.resolve(addr).ok_or(DmaFault)?;
        r.read(off, buf)
    }

    /// DMA write.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        let (r, off) = self.resolve(addr).ok_or(DmaFault)?;
        r.write(off, data)
    }
}
