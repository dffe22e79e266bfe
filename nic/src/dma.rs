//! The DMA engine: bus addresses to host memory. A bus address names a
//! region the daemon registered, never raw process memory:
//! `space << 56 | region << 40 | offset`.
//! - arena (space 1): a memfd the process shared, mapped here: DMA is a copy;
//! - process VM (space 2): `process_vm_readv/writev` into the process.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use emp_uapi::fwabi::{DmaWindow, DMA_WINDOW_SHIFT};

/// Arena space.
pub const SPACE_ARENA: u64 = 1;
/// Process-memory space.
pub const SPACE_VM: u64 = 2;
/// Largest region (offset bits).
pub const REGION_MAX: u64 = 1 << DMA_WINDOW_SHIFT;

/// Bus address of `offset` in region `id` of `space`.
pub const fn bus_addr(space: u64, id: u16, offset: u64) -> u64 {
    (space << (DMA_WINDOW_SHIFT + 16)) | ((id as u64) << DMA_WINDOW_SHIFT) | offset
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
// SAFETY: `&Region` only allows bounds-checked byte copies in and out of
// memory that the host process changes concurrently anyway; no Rust value
// lives there.
unsafe impl Sync for Region {}

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

/// Bytes of host memory mapped in this process, held for a frame that
/// reads them after the DMA map's lock is gone (Immediate Sending: the
/// wire sends the payload straight from host memory). Holding one keeps
/// the mapping alive even if the host deregisters the region meanwhile.
#[derive(Clone)]
pub struct HostBytes {
    _region: Arc<Region>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: `ptr..ptr+len` lies in the shared mapping `_region` keeps alive;
// it is only read, by byte copies, which tolerate the host's concurrent stores.
unsafe impl Send for HostBytes {}

impl HostBytes {
    /// Where the bytes are (valid while `self` lives).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a copy of the bytes to `out`.
    pub fn append_to(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.resize(at + self.len, 0);
        // SAFETY: the source is in the live mapping (see the type); the
        // destination was just sized.
        unsafe { core::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr().add(at), self.len) };
    }
}

/// Most pieces of host memory one frame sends in place; a frame whose
/// payload is scattered over more is built by copying.
pub const HOST_PIECES_MAX: usize = 4;

/// A frame's payload left in host memory: up to [`HOST_PIECES_MAX`]
/// pieces, in order. No allocation: the pieces live inline.
#[derive(Clone, Default)]
pub struct HostPayload {
    pieces: [Option<HostBytes>; HOST_PIECES_MAX],
}

impl HostPayload {
    /// Adds the next piece; false (and nothing added) when full.
    pub fn push(&mut self, b: HostBytes) -> bool {
        match self.pieces.iter_mut().find(|p| p.is_none()) {
            Some(slot) => {
                *slot = Some(b);
                true
            }
            None => false,
        }
    }

    /// The pieces, in order.
    pub fn pieces(&self) -> impl Iterator<Item = &HostBytes> {
        self.pieces.iter().map_while(Option::as_ref)
    }

    /// True when there is no piece (an ordinary, built frame).
    pub fn is_empty(&self) -> bool {
        self.pieces[0].is_none()
    }

    /// Bytes over all pieces.
    pub fn len(&self) -> usize {
        self.pieces().map(HostBytes::len).sum()
    }

    /// Appends a copy of every piece to `out`.
    pub fn append_to(&self, out: &mut Vec<u8>) {
        out.reserve(self.len());
        self.pieces().for_each(|p| p.append_to(out));
    }
}

/// Regions by id (the MR slot that owns them), or a guest's whole RAM.
/// Shared with [`HostBytes`] a frame still reads, so a region removed
/// while a frame is on its way stays mapped until the frame is sent.
pub struct DmaMap {
    regions: Vec<Option<Arc<Region>>>,
    /// For a NIC serving a QEMU guest: its RAM, addressed physically (the
    /// guest's driver writes guest-physical addresses into the MR table).
    guest: Option<Arc<Region>>,
    /// The arenas of `regions` as the control program's windows, by id
    /// (`FwHal::dma_windows`): it copies in and out of them in place.
    windows: Vec<DmaWindow>,
}

// SAFETY: `windows` only names the mappings of the arenas `regions` holds
// (the same Arcs, dropped only with their window entry cleared first);
// they are shared memory reached by bounds-checked byte copies, as
// `Region` is (Send and Sync above).
unsafe impl Send for DmaMap {}
// SAFETY: as for Send; `&DmaMap` changes nothing.
unsafe impl Sync for DmaMap {}

/// A window that holds no address.
const NO_WINDOW: DmaWindow = DmaWindow { tag: u64::MAX, base: core::ptr::null_mut(), len: 0 };

impl DmaMap {
    /// Room for `n` regions.
    pub fn new(n: usize) -> DmaMap {
        DmaMap { regions: (0..n).map(|_| None).collect(), guest: None, windows: vec![NO_WINDOW; n] }
    }

    /// The arenas as the control program's windows (`FwHal::dma_windows`),
    /// valid while this map is neither changed nor dropped; `None` for a
    /// guest's RAM, which is addressed physically.
    pub fn windows(&self) -> Option<&[DmaWindow]> {
        self.guest.is_none().then_some(&self.windows[..])
    }

    /// Serves a guest: DMA goes to its RAM by physical address.
    pub fn set_guest(&mut self, ram: Region) {
        self.guest = Some(Arc::new(ram));
    }

    /// Installs region `id`.
    pub fn insert(&mut self, id: u16, r: Region) {
        self.windows[id as usize] = match &r {
            Region::Arena { base, len, .. } => {
                DmaWindow { tag: bus_addr(SPACE_ARENA, id, 0) >> DMA_WINDOW_SHIFT, base: *base, len: *len as u64 }
            }
            Region::Vm { .. } => NO_WINDOW,
        };
        self.regions[id as usize] = Some(Arc::new(r));
    }

    /// Removes region `id` (its mapping goes once no frame holds it).
    pub fn remove(&mut self, id: u16) {
        if let Some(r) = self.regions.get_mut(id as usize) {
            self.windows[id as usize] = NO_WINDOW;
            *r = None;
        }
    }

    fn resolve(&self, addr: u64) -> Option<(&Arc<Region>, u64)> {
        if let Some(g) = &self.guest {
            // Anything outside guest RAM is refused (Region bounds-checks).
            return Some((g, addr));
        }
        let space = addr >> (DMA_WINDOW_SHIFT + 16);
        let id = ((addr >> DMA_WINDOW_SHIFT) & 0xFFFF) as usize;
        let off = addr & (REGION_MAX - 1);
        let r = self.regions.get(id)?.as_ref()?;
        let ok = matches!((space, &**r), (SPACE_ARENA, Region::Arena { .. }) | (SPACE_VM, Region::Vm { .. }));
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

    /// The `len` bytes at `addr`, held where they are, when they are
    /// mapped in this process (an arena or a guest's RAM); `None` for
    /// process memory (reached by system calls) or a DMA that would fault.
    pub fn hold(&self, addr: u64, len: usize) -> Option<HostBytes> {
        self.check(addr, len).ok()?;
        let (r, off) = self.resolve(addr)?;
        let Region::Arena { base, .. } = &**r else { return None };
        // SAFETY: `off + len` is within the mapping (checked above).
        let ptr = unsafe { base.add(off as usize) }.cast_const();
        Some(HostBytes { _region: r.clone(), ptr, len })
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

/// A region for tests: `bytes` in a sealed memfd, mapped as a process's
/// arena is.
#[cfg(test)]
pub(crate) fn test_arena(bytes: &[u8]) -> Region {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain syscall creating a new descriptor.
    let fd = unsafe { libc::memfd_create(c"emp-test-arena".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = bytes.len().next_multiple_of(emp_uapi::PAGE_SIZE);
    // SAFETY: valid descriptor; sizing, then sealing it against shrinking.
    unsafe {
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len as libc::off_t), 0);
        assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
    }
    let r = Region::map_arena(fd, 0, len as u64).expect("map the arena");
    r.write(0, bytes).expect("fill it");
    r
}
