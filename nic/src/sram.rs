//! SRAM in shared memory. The whole SRAM is one mapping in the daemon, but
//! each port window is its own memfd mapped over its place (`MAP_FIXED`):
//! a process is handed only its port's memfd, so it can map its window and
//! nothing else of the NIC.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};

use emp_uapi::sram::Layout;

/// The NIC's memory.
pub struct Sram {
    base: *mut u8,
    len: usize,
    _whole: OwnedFd,
    ports: Vec<OwnedFd>,
}

// SAFETY: the mapping is shared memory meant for concurrent access by the
// engine thread, control threads and client processes; every access goes
// through bounds-checked raw copies or atomics, never through references.
unsafe impl Send for Sram {}
// SAFETY: as above.
unsafe impl Sync for Sram {}

fn memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).expect("no NUL");
    // SAFETY: `cname` is a valid C string; the flags are valid.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on a valid fd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Port windows are handed to processes: none may resize the memory the
    // NIC has mapped (a shrink would fault the NIC).
    // SAFETY: fcntl(F_ADD_SEALS) on our own memfd.
    if unsafe {
        libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL)
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Creates a zero-filled memfd of `len` bytes (also used for firmware payloads).
pub fn new_memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    memfd(name, len)
}

impl Sram {
    /// Allocates SRAM for `layout`, with a separate memfd per port window.
    pub fn new(layout: &Layout) -> io::Result<Sram> {
        let len = layout.sram_size as usize;
        let whole = memfd("emp-sram", len)?;
        // SAFETY: mapping a fresh memfd of `len` bytes, shared, read-write.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                whole.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut s = Sram { base: base.cast(), len, _whole: whole, ports: Vec::new() };
        let stride = layout.port_stride as usize;
        for p in 0..layout.params.ports {
            let fd = memfd(&format!("emp-port{p}"), stride)?;
            let at = layout.port(p).base;
            assert!(at + stride <= len && at.is_multiple_of(emp_uapi::PAGE_SIZE));
            // SAFETY: `at..at+stride` lies inside our own mapping (checked
            // above), page aligned; MAP_FIXED replaces those pages with the
            // port's memfd, which is what we want.
            let r = unsafe {
                libc::mmap(
                    s.base.add(at).cast(),
                    stride,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if r == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            s.ports.push(fd);
        }
        Ok(s)
    }

    /// SRAM in a file (e.g. under /dev/shm) that QEMU maps as the ivshmem
    /// BAR2 of a guest (`memory-backend-file,share=on`): the guest's driver
    /// sees the same bytes. Ports are reached through the guest's driver,
    /// so no per-port memfds exist.
    pub fn from_file(path: &std::path::Path, layout: &Layout) -> io::Result<Sram> {
        let len = layout.sram_size as usize;
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        f.set_len(len as u64)?;
        let fd: OwnedFd = f.into();
        // SAFETY: mapping a file we just sized to `len`, shared, read-write.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Sram { base: base.cast(), len, _whole: fd, ports: Vec::new() })
    }

    /// The mapping's first byte, for a control program that reads and
    /// writes SRAM in place (`FwHal::sram_base`): valid while this lives.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.base
    }

    /// Bytes of SRAM.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty SRAM (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd behind port window `p` (`None` for file-backed SRAM).
    pub fn port_fd(&self, p: u16) -> Option<BorrowedFd<'_>> {
        self.ports.get(p as usize).map(|f| f.as_fd())
    }

    fn check(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|e| e <= self.len)
    }

    /// Copies SRAM bytes out; out-of-range reads yield zeros.
    pub fn read(&self, off: usize, buf: &mut [u8]) {
        if buf.len() == 4 && off.is_multiple_of(4) && self.check(off, 4) {
            // The control program's ring indices and flags: one load, not
            // a call to memcpy.
            buf.copy_from_slice(&self.u32(off).to_ne_bytes());
            return;
        }
        if !self.check(off, buf.len()) {
            buf.fill(0);
            return;
        }
        // SAFETY: the range is inside the mapping (checked); the memory is
        // shared and may change concurrently, which a byte copy tolerates.
        unsafe { core::ptr::copy_nonoverlapping(self.base.add(off), buf.as_mut_ptr(), buf.len()) };
        fence(Ordering::Acquire);
    }

    /// Copies bytes into SRAM; out-of-range writes are dropped.
    pub fn write(&self, off: usize, data: &[u8]) {
        if let Ok(word) = <[u8; 4]>::try_from(data) {
            if off.is_multiple_of(4) && self.check(off, 4) {
                // As in `read`: a release store orders it as the fence below does.
                self.put_u32(off, u32::from_ne_bytes(word));
                return;
            }
        }
        if !self.check(off, data.len()) {
            return;
        }
        fence(Ordering::Release);
        // SAFETY: the range is inside the mapping (checked).
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(off), data.len()) };
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && self.check(off, 4), "SRAM word {off:#x} out of range");
        // SAFETY: in range and 4-byte aligned (asserted); AtomicU32 has the
        // layout of u32 and shared memory is what atomics are for.
        unsafe { &*self.base.add(off).cast::<AtomicU32>() }
    }

    /// Loads a 32-bit word.
    pub fn u32(&self, off: usize) -> u32 {
        self.word(off).load(Ordering::Acquire)
    }

    /// Stores a 32-bit word.
    pub fn put_u32(&self, off: usize, v: u32) {
        self.word(off).store(v, Ordering::Release)
    }
}

impl Drop for Sram {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are our mapping; nothing uses it after drop.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
