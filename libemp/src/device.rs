//! `Device`: an open port. The data path (post, poll, wait) runs here,
//! inline and the same for every backend: stores into the mapped rings,
//! loads from the CQ in the arena (`crate::ring`). Everything else goes
//! through the control path (`crate::backend`).

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use emp_uapi::desc::{Opcode, Sge, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE, SGE_MAX, WD_IMM, WD_SIGNALED};
use emp_uapi::sram::{ctl, GroupEntry, NIC_DEAD_NS};
use emp_uapi::{Le, PAGE_SIZE};

use crate::backend::{Backend, COUNTERS};
use crate::map::Mapping;
use crate::ring::{CompletionQueue, RingKind, Window, WorkRing};
use crate::{Buffer, Completion, Endpoint, Error, EventSource, MemoryRegion, PortInfo, Result};

/// Work request ids of the library's blocking calls: this prefix (bits 63
/// and 61) plus a 48-bit counter. (`rdv` uses bit 63 alone and 63 + 62.)
pub const INTERNAL_WR: u64 = 0xA000_0000_0000_0000;

/// Empty polls between two looks at the NIC's liveness word (one clock
/// read per batch keeps the empty poll cheap).
const LIVENESS_POLLS: u32 = 256;

/// Bytes of the scratch buffer: a group entry or an atomic's result word.
const SCRATCH: usize = 4096;
const _: () = assert!(GroupEntry::SIZE <= SCRATCH && 8 <= SCRATCH, "scratch too small for its uses");

/// An open port on an EMP NIC.
pub struct Device {
    // The mappings come first: they are unmapped before the backend closes
    // the port (field order is drop order).
    window: Window,
    /// Registered memory shared with the NIC: the CQ, then what `alloc`
    /// hands out.
    arena: Mapping,
    arena_key: u32,
    arena_next: usize,
    /// Remote-access secrets of this port's registrations, by key (for
    /// [`Device::remote_key`]).
    secrets: std::collections::HashMap<u32, u32>,
    backend: Backend,
    info: PortInfo,
    send: WorkRing,
    recv: WorkRing,
    cq: CompletionQueue,
    /// Completions taken from the CQ by `wait_wr` for someone else.
    stash: VecDeque<Completion>,
    /// Group epochs used by this process.
    pub(crate) groups: crate::group::GroupBook,
    /// Registered scratch memory (allocated on first use): group entries
    /// for GROUP_SET, the result word of blocking atomics. Both uses are
    /// synchronous, so one buffer serves them.
    scratch: Option<Buffer>,
    /// Next work request id of the library's own blocking calls.
    internal_wr: u64,
    /// How long a wait polls before it arms the port and sleeps.
    spin: Duration,
    /// The NIC's liveness word as last seen, when it was seen to change,
    /// and empty polls since the last look (see `check_nic`).
    alive_seen: u32,
    alive_changed: Instant,
    empty_polls: u32,
    /// The NIC was found dead: every later call fails.
    nic_dead: bool,
    /// The port is saved (context switch): no window until restored.
    saved: bool,
}

// SAFETY: the raw pointers are mappings owned by this Device; it is used
// by one thread at a time (it is not Sync).
unsafe impl Send for Device {}

impl Device {
    /// Opens the device named by `EMP_DEVICE` (see [`Device::open_path`]).
    ///
    /// # Errors
    /// [`Error::NoDevice`] when `EMP_DEVICE` is not set; otherwise as
    /// [`Device::open_path`].
    ///
    /// # Examples
    /// ```no_run
    /// let dev = emp::Device::open()?;
    /// println!("port {}", dev.endpoint());
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn open() -> Result<Device> {
        let path = std::env::var("EMP_DEVICE").map_err(|_| Error::NoDevice)?;
        Device::open_path(&path)
    }

    /// Opens the NIC a rank of `job` uses ([`Job::device_path`](crate::rdv::Job::device_path)):
    /// `EMP_DEVICE`, else this host's node in the cluster file `EMP_CLUSTER`
    /// for the rank's local rank.
    ///
    /// # Errors
    /// As [`Job::device_path`](crate::rdv::Job::device_path), then as [`Device::open_path`].
    pub fn open_for_job(job: &crate::rdv::Job) -> Result<Device> {
        let path = job.device_path()?;
        let path = path.to_str().ok_or_else(|| Error::invalid(format!("device path {path:?} is not UTF-8")))?;
        Device::open_path(path)
    }

    /// Opens `/dev/emp-nic…` (the kernel driver) or an `emp-nicd` socket;
    /// the arena size comes from `EMP_ARENA_MB`, the spin before sleeping
    /// from `EMP_SPIN_US`. Closing (dropping) the device closes the port
    /// and releases everything registered through it.
    ///
    /// # Errors
    /// [`Error::Os`] when the path cannot be opened or mapped,
    /// [`Error::Protocol`] when the daemon cannot be reached or answers
    /// nonsense, [`Error::Nic`] when the NIC refuses the port.
    ///
    /// # Examples
    /// ```no_run
    /// let dev = emp::Device::open_path("/dev/emp-nic0")?;
    /// assert!(dev.info().send_entries.is_power_of_two());
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn open_path(path: &str) -> Result<Device> {
        let a = Backend::open(path, CompletionQueue::ENTRIES)?;
        let cq = CompletionQueue::new(&a.arena);
        Ok(Device {
            send: WorkRing::new(RingKind::Send, &a.info),
            recv: WorkRing::new(RingKind::Recv, &a.info),
            window: Window::new(a.window),
            cq,
            arena: a.arena,
            arena_key: a.arena_key,
            arena_next: CompletionQueue::BYTES.next_multiple_of(PAGE_SIZE),
            secrets: Default::default(),
            backend: a.backend,
            info: a.info,
            stash: VecDeque::new(),
            groups: Default::default(),
            scratch: None,
            internal_wr: 0,
            spin: std::env::var("EMP_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(Duration::from_micros(20), Duration::from_micros),
            alive_seen: 0,
            alive_changed: Instant::now(),
            empty_polls: 0,
            nic_dead: false,
            saved: false,
        })
    }

    /// Context switch C1 (docs/context-switch.md): the NIC stops taking
    /// this port's descriptors and starting its messages; posting may go
    /// on until the rings are full. Direct attach, or the kernel driver
    /// (`EMP_IOC_PORT_CTX`).
    ///
    /// # Errors
    /// [`Error::Nic`] (`EALREADY` when suspended already, `ENOTTY` from a
    /// driver without the ioctl, `EAGAIN` while the gang scheduler has the
    /// port switched out).
    pub fn suspend(&mut self) -> Result<()> {
        self.backend.suspend()
    }

    /// C2–C4: is the suspended port stable (nothing of it half sent or half
    /// received)? Only a stable port can be saved.
    ///
    /// # Errors
    /// As [`Device::suspend`].
    pub fn is_stable(&mut self) -> Result<bool> {
        self.backend.is_stable()
    }

    /// C6: saves the stable suspended port as a context image into `buf`
    /// (this device's memory) and gives its NIC slot up; returns the
    /// image's length. Until [`Device::restore`], nothing may be posted or
    /// polled: the port's window is unmapped.
    ///
    /// # Errors
    /// [`Error::Nic`]: `EAGAIN` not stable, `ENOSPC` `buf` too small,
    /// `ENOENT` `buf` not this port's memory.
    pub fn save(&mut self, buf: &Buffer) -> Result<u64> {
        self.save_at(buf.sge(0, buf.len()))
    }

    /// As [`Device::save`], into registered memory `at` (`at.len` is the room).
    ///
    /// # Errors
    /// As [`Device::save`].
    pub fn save_at(&mut self, at: Sge) -> Result<u64> {
        if self.saved {
            return Err(Error::invalid("save: the port is saved already"));
        }
        let len = self.backend.save(at)?;
        // The slot's window may go to another process: drop our view of it.
        self.window = Window::new(Mapping::anonymous_populated(self.window.len())?);
        self.saved = true;
        Ok(len)
    }

    /// C7: restores the port saved into `buf` (`len` bytes) into a free
    /// slot of the NIC, maybe another one; the port keeps its endpoint, so
    /// peers reach it unchanged. It comes back suspended: [`Device::resume`].
    ///
    /// # Errors
    /// [`Error::Nic`]: `EBADMSG` the image failed its checks (nothing
    /// changed: fix it and try again), `EBUSY` no free slot, `ENOSPC` no
    /// table room; [`Error::InvalidArgument`] when the port is not saved.
    pub fn restore(&mut self, buf: &Buffer, len: u64) -> Result<()> {
        if len > buf.len() as u64 {
            return Err(Error::invalid(format!("restore: {len} bytes from a {} byte buffer", buf.len())));
        }
        self.restore_at(buf.sge(0, len as usize))
    }

    /// As [`Device::restore`], from registered memory `at` (`at.len` bytes).
    ///
    /// # Errors
    /// As [`Device::restore`].
    pub fn restore_at(&mut self, at: Sge) -> Result<()> {
        if !self.saved {
            return Err(Error::invalid("restore: the port is not saved"));
        }
        let (window, _slot) = self.backend.restore(at)?;
        self.window = Window::new(window);
        self.saved = false;
        Ok(())
    }

    /// C8: the suspended port goes on.
    ///
    /// # Errors
    /// As [`Device::suspend`].
    pub fn resume(&mut self) -> Result<()> {
        self.backend.resume()
    }

    /// What this port is.
    pub fn info(&self) -> &PortInfo {
        &self.info
    }

    /// This port's endpoint.
    pub fn endpoint(&self) -> Endpoint {
        self.info.endpoint()
    }

    /// Registered, NIC-shared memory of `len` bytes (64-byte aligned),
    /// from the arena registered at open: no system call. It lives until
    /// the device is closed.
    ///
    /// # Errors
    /// [`Error::ArenaFull`] when the arena has no `len` bytes left.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// let mut buf = dev.alloc(4096)?;
    /// buf.as_mut_slice()[..5].copy_from_slice(b"hello");
    /// let sge = buf.sge(0, 5); // what a post names
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn alloc(&mut self, len: usize) -> Result<Buffer> {
        let off = self.arena_next.next_multiple_of(64);
        if off.checked_add(len).is_none_or(|e| e > self.arena.len()) {
            return Err(Error::ArenaFull);
        }
        self.arena_next = off + len;
        // SAFETY: `off + len <= arena.len()`, inside our mapping.
        let ptr = unsafe { self.arena.ptr().add(off) };
        // The arena has local rights only: no remote access reaches it.
        Ok(Buffer { ptr, len, key: self.arena_key, secret: 0, offset: off as u64 })
    }

    /// Like [`Device::alloc`], in a registration of its own with `access`
    /// rights added to local read and write: e.g. [`crate::MR_REMOTE_ATOMIC`]
    /// for words other ports may target with remote atomics. The buffer
    /// starts on a page and its SGEs and remote words are relative to it.
    ///
    /// # Errors
    /// [`Error::ArenaFull`], or the NIC's refusal of the registration
    /// ([`Error::Nic`]).
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// let words = dev.alloc_mr(4096, emp::MR_REMOTE_ATOMIC)?;
    /// let counter = words.remote_word(0, emp::Width::W64); // hand this to peers
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn alloc_mr(&mut self, len: usize, access: u8) -> Result<Buffer> {
        let off = self.arena_next.next_multiple_of(PAGE_SIZE);
        let span = len.max(1).next_multiple_of(PAGE_SIZE);
        if off.checked_add(span).is_none_or(|e| e > self.arena.len()) {
            return Err(Error::ArenaFull);
        }
        let access = access | MR_LOCAL_READ | MR_LOCAL_WRITE;
        let (key, secret) = self.backend.reg_arena_part(&self.arena, off, span, access)?;
        // SAFETY: `off + span <= arena.len()`, inside our mapping.
        let ptr = unsafe { self.arena.ptr().add(off) };
        self.arena_next = off + span;
        self.secrets.insert(key, secret);
        Ok(Buffer { ptr, len, key, secret, offset: 0 })
    }

    /// Registers arbitrary memory of this process. The NIC reaches it with
    /// `process_vm_readv/writev`, which this call permits with
    /// `prctl(PR_SET_PTRACER)`.
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay mapped until `dereg_mr`, and must not
    /// be accessed while a posted operation on it is in flight.
    ///
    /// # Errors
    /// The NIC's refusal ([`Error::Nic`]: e.g. a full MR table), or a
    /// broken control path ([`Error::Protocol`]).
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// let mut data = vec![0u8; 1 << 20];
    /// // SAFETY: `data` outlives the registration and is left alone while
    /// // operations on it are in flight.
    /// let mr = unsafe { dev.reg_mr(data.as_mut_ptr(), data.len(), emp::MR_LOCAL_WRITE) }?;
    /// dev.post_recv(1, emp::ANY, 7, 0, &[mr.sge(data.as_ptr() as usize, data.len())])?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub unsafe fn reg_mr(&mut self, addr: *const u8, len: usize, access: u8) -> Result<MemoryRegion> {
        let (key, secret) = self.backend.reg_mr(addr as u64, len as u64, access)?;
        self.secrets.insert(key, secret);
        Ok(MemoryRegion { key, secret, addr: addr as usize, len })
    }

    /// True when the NIC reaches memory registered with
    /// [`Device::reg_mr`] by virtual address at every access (direct
    /// attach), false when the registration pinned its pages (the kernel
    /// driver). With `true` a registration keeps meaning "these addresses
    /// of this process" even after the memory is unmapped and mapped again,
    /// so a caller may keep registrations of memory it does not own and
    /// reuse them (a registration cache); with `false` it must not.
    pub fn mr_by_address(&self) -> bool {
        self.backend.mr_by_address()
    }

    /// Deregisters a region; the NIC no longer reaches it.
    ///
    /// # Errors
    /// [`Error::Nic`] when the key is not this port's.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let data = vec![0u8; 4096];
    /// // SAFETY: `data` outlives the registration.
    /// let mr = unsafe { dev.reg_mr(data.as_ptr(), data.len(), emp::MR_LOCAL_READ) }?;
    /// dev.dereg_mr(mr)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn dereg_mr(&mut self, mr: MemoryRegion) -> Result<()> {
        self.backend.dereg_mr(mr.key)?;
        self.secrets.remove(&mr.key);
        Ok(())
    }

    /// The remote key (key and secret) of a region this port registered
    /// with [`Device::alloc_mr`] or [`Device::reg_mr`]; `None` for any
    /// other key.
    pub fn remote_key(&self, key: u32) -> Option<crate::RemoteKey> {
        self.secrets.get(&key).map(|&secret| crate::RemoteKey { key, secret })
    }

    /// Writes `d` into the send (or receive) ring and wakes the NIC if it
    /// sleeps.
    pub(crate) fn post(&mut self, send: bool, d: &WorkDesc) -> Result<()> {
        self.post_bytes(send, d, WorkDesc::SIZE)
    }

    /// As [`Device::post`], writing the descriptor's first `len` bytes.
    pub(crate) fn post_bytes(&mut self, send: bool, d: &WorkDesc, len: usize) -> Result<()> {
        if self.nic_dead {
            return Err(nic_dead());
        }
        if self.saved {
            return Err(Error::invalid("the port is saved (context switch): restore it first"));
        }
        let ring = if send { &mut self.send } else { &mut self.recv };
        ring.push_bytes(&self.window, d, len)?;
        // Pairs with the NIC's fence before it sleeps: either it sees our
        // index, or we see that it sleeps and ring the doorbell.
        fence(Ordering::SeqCst);
        self.backend.notify(self.window.word(ctl::NIC_SLEEPING));
        Ok(())
    }

    pub(crate) fn desc(
        opcode: Opcode,
        wr_id: u64,
        ep: Endpoint,
        tag: u64,
        ignore: u64,
        sges: &[Sge],
    ) -> Result<WorkDesc> {
        if sges.len() > SGE_MAX {
            return Err(Error::TooManySges);
        }
        let mut d = WorkDesc {
            wr_id,
            opcode: opcode as u8,
            flags: WD_SIGNALED,
            num_sge: sges.len() as u8,
            node: ep.node,
            port: ep.port,
            tag,
            ignore,
            ..Default::default()
        };
        d.sge[..sges.len()].copy_from_slice(sges);
        Ok(d)
    }

    /// Posts a tagged send of the bytes named by `sges` (at most 6) to
    /// `dst`. Its completion, with `wr_id`, comes through
    /// [`Device::poll_cq`] / [`Device::wait_cq`]; leave the bytes alone
    /// until then.
    ///
    /// # Errors
    /// [`Error::RingFull`] (take completions, then post again),
    /// [`Error::TooManySges`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// let mut buf = dev.alloc(64)?;
    /// buf.as_mut_slice()[..2].copy_from_slice(b"hi");
    /// let peer = emp::Endpoint { node: 1, port: 0 };
    /// dev.post_send(1, peer, 7, &[buf.sge(0, 2)])?;
    /// let c = dev.wait_wr(1, None)?;
    /// assert_eq!(c.status, emp::Status::Success);
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_send(&mut self, wr_id: u64, dst: Endpoint, tag: u64, sges: &[Sge]) -> Result<()> {
        let d = Self::desc(Opcode::Send, wr_id, dst, tag, 0, sges)?;
        self.post(true, &d)
    }

    /// As [`Device::post_send`], with 32 bits of immediate data that the
    /// receive's completion reports ([`Completion::imm`]), as do probes
    /// that find the message (libfabric's remote CQ data).
    ///
    /// # Errors
    /// As [`Device::post_send`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// let buf = dev.alloc(64)?;
    /// let peer = emp::Endpoint { node: 1, port: 0 };
    /// dev.post_send_imm(1, peer, 7, &[buf.sge(0, 8)], 42)?;
    /// // At the peer, the receive's completion has `imm == Some(42)`.
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_send_imm(&mut self, wr_id: u64, dst: Endpoint, tag: u64, sges: &[Sge], imm: u32) -> Result<()> {
        let mut d = Self::desc(Opcode::Send, wr_id, dst, tag, imm as u64, sges)?;
        d.flags |= WD_IMM;
        self.post(true, &d)
    }

    /// Posts a receive for a message from `src` (or [`crate::ANY`]) whose tag
    /// equals `tag` in every bit not set in `ignore`; the message lands in
    /// the bytes named by `sges`.
    ///
    /// # Errors
    /// As [`Device::post_send`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// let buf = dev.alloc(4096)?;
    /// // Any sender, tags 0x100..=0x1FF.
    /// dev.post_recv(2, emp::ANY, 0x100, 0xFF, &[buf.sge(0, 4096)])?;
    /// let c = dev.wait_wr(2, None)?;
    /// println!("{} bytes from {}, tag {:#x}", c.byte_len, c.src, c.tag);
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_recv(&mut self, wr_id: u64, src: Endpoint, tag: u64, ignore: u64, sges: &[Sge]) -> Result<()> {
        let d = Self::desc(Opcode::Recv, wr_id, src, tag, ignore, sges)?;
        self.post(false, &d)
    }

    /// Posts a raw descriptor (tests of the NIC's input validation).
    ///
    /// # Errors
    /// [`Error::RingFull`].
    pub fn post_raw(&mut self, send: bool, d: &WorkDesc) -> Result<()> {
        self.post(send, d)
    }

    /// Takes up to `out.len()` completions (those [`Device::wait_wr`] set
    /// aside first); returns how many. Never blocks, makes no system call.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// let mut wc = [emp::Completion::default(); 16];
    /// let n = dev.poll_cq(&mut wc);
    /// for c in &wc[..n] {
    ///     println!("wr {} {:?}", c.wr_id, c.status);
    /// }
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn poll_cq(&mut self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(c) = self.stash.pop_front() else { break };
            out[n] = c;
            n += 1;
        }
        n + self.cq.poll(&self.window, &mut out[n..])
    }

    /// As [`Device::poll_cq`], but reports a dead NIC: when the queue has
    /// been empty for a while, it looks at the liveness word the NIC
    /// advances (no system call); once that stood still for
    /// [`NIC_DEAD_NS`], this and every later call on the device fail.
    ///
    /// # Errors
    /// [`Error::Protocol`] when the NIC died.
    pub fn try_poll_cq(&mut self, out: &mut [Completion]) -> Result<usize> {
        if self.nic_dead {
            return Err(nic_dead());
        }
        let n = self.poll_cq(out);
        if n == 0 {
            self.check_nic()?;
        }
        Ok(n)
    }

    /// Remote accesses to this port the NIC refused (bad key, secret,
    /// rights or bounds), and of those how many because their source was
    /// throttled for guessing keys: free-running counts from the port's
    /// control page (no system call).
    pub fn remote_refusals(&self) -> (u32, u32) {
        let w = |off| self.window.word(off).load(Ordering::Relaxed);
        (w(ctl::REMOTE_REFUSED), w(ctl::REMOTE_THROTTLED))
    }

    /// Called on an empty poll: every [`LIVENESS_POLLS`] of them, compares
    /// the NIC's liveness word with what it was (0: a NIC that does not
    /// keep one).
    fn check_nic(&mut self) -> Result<()> {
        if self.nic_dead {
            return Err(nic_dead());
        }
        self.empty_polls += 1;
        if self.empty_polls < LIVENESS_POLLS {
            return Ok(());
        }
        self.empty_polls = 0;
        let now = Instant::now();
        let v = self.window.word(ctl::NIC_ALIVE).load(Ordering::Relaxed);
        if v != self.alive_seen || v == 0 {
            self.alive_seen = v;
            self.alive_changed = now;
        } else if now.duration_since(self.alive_changed) >= Duration::from_nanos(NIC_DEAD_NS) {
            self.nic_dead = true;
            return Err(nic_dead());
        }
        Ok(())
    }

    /// Waits for the completion of work request `wr_id`; other completions
    /// are set aside for the next [`Device::poll_cq`] / [`Device::wait_cq`].
    /// What is set aside is bounded by the work outstanding (the send and
    /// receive rings). `None` = wait forever.
    ///
    /// # Errors
    /// [`Error::Timeout`], or [`Error::Protocol`] when the NIC daemon went
    /// away. An error *completion* is returned as `Ok`, with its status.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let buf = dev.alloc(64)?;
    /// dev.post_recv(9, emp::ANY, 7, 0, &[buf.sge(0, 64)])?;
    /// let c = dev.wait_wr(9, Some(std::time::Duration::from_secs(1)))?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn wait_wr(&mut self, wr_id: u64, timeout: Option<Duration>) -> Result<Completion> {
        let start = Instant::now();
        let mut buf = [Completion::default(); 16];
        loop {
            if let Some(i) = self.stash.iter().position(|c| c.wr_id == wr_id) {
                return Ok(self.stash.remove(i).expect("found"));
            }
            let left = match timeout {
                Some(t) => Some(t.checked_sub(start.elapsed()).ok_or(Error::Timeout)?),
                None => None,
            };
            let n = self.wait_ring(&mut buf, left)?;
            self.stash.extend(&buf[..n]);
        }
    }

    /// Takes the completion of work request `wr_id` if the NIC has
    /// written it, without waiting; other completions are set aside as in
    /// [`Device::wait_wr`]. For callers that poll.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// while dev.poll_wr(9).is_none() {
    ///     std::hint::spin_loop(); // or other work
    /// }
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn poll_wr(&mut self, wr_id: u64) -> Option<Completion> {
        let mut buf = [Completion::default(); 16];
        loop {
            let n = self.cq.poll(&self.window, &mut buf);
            self.stash.extend(&buf[..n]);
            if n < buf.len() {
                break;
            }
        }
        let i = self.stash.iter().position(|c| c.wr_id == wr_id)?;
        self.stash.remove(i)
    }

    /// How long waits poll before sleeping on the port's event (default
    /// 20 µs, or `EMP_SPIN_US`). Zero: sleep at once, which costs the least
    /// CPU when the NIC does the work (offloaded collectives).
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// dev.set_spin(std::time::Duration::ZERO);
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// The current spin before sleeping (see [`Device::set_spin`]).
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// Asks for an event on the next completion (like `ibv_req_notify_cq`):
    /// the descriptor of [`EventSource::event_fd`] becomes readable. Poll
    /// the CQ once more after arming, or a completion that came just
    /// before may never signal. [`Device::wait_cq`] does all this itself.
    ///
    /// # Examples
    /// ```no_run
    /// use emp::EventSource;
    /// # let mut dev = emp::Device::open()?;
    /// let mut wc = [emp::Completion::default(); 16];
    /// dev.arm();
    /// if dev.poll_cq(&mut wc) == 0 {
    ///     let mut pfd = libc::pollfd { fd: dev.event_fd(), events: libc::POLLIN, revents: 0 };
    ///     // SAFETY: one valid pollfd.
    ///     unsafe { libc::poll(&mut pfd, 1, -1) };
    /// }
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn arm(&mut self) {
        if self.backend.arm() {
            return;
        }
        // Release, then a full fence: the NIC reads ARM after writing a
        // CQE, and we poll the CQ again after this returns.
        self.window.word(ctl::ARM).store(1, Ordering::Release);
        fence(Ordering::SeqCst);
    }

    /// Waits for completions: polls briefly (see [`Device::set_spin`]),
    /// then arms and blocks on the event descriptor. Returns how many were
    /// taken (at least one). `None` = wait forever.
    ///
    /// # Errors
    /// [`Error::Timeout`], or [`Error::Protocol`] when the NIC daemon went
    /// away.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// let mut wc = [emp::Completion::default(); 16];
    /// let n = dev.wait_cq(&mut wc, Some(std::time::Duration::from_secs(5)))?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn wait_cq(&mut self, out: &mut [Completion], timeout: Option<Duration>) -> Result<usize> {
        if self.nic_dead {
            return Err(nic_dead());
        }
        if !self.stash.is_empty() {
            return Ok(self.poll_cq(out));
        }
        self.wait_ring(out, timeout)
    }

    fn wait_ring(&mut self, out: &mut [Completion], timeout: Option<Duration>) -> Result<usize> {
        let start = Instant::now();
        let spin_until = start + self.spin;
        loop {
            let n = self.cq.poll(&self.window, out);
            if n > 0 {
                return Ok(n);
            }
            self.check_nic()?;
            if Instant::now() < spin_until {
                std::hint::spin_loop();
                continue;
            }
            self.arm();
            let n = self.cq.poll(&self.window, out);
            if n > 0 {
                return Ok(n);
            }
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(l) => l.as_millis().min(1000) as i32,
                    None => return Err(Error::Timeout),
                },
                None => 1000,
            };
            let Some(event) = self.backend.event_fd() else {
                // A NIC without an interrupt (kernel backend, no MSI-X): poll.
                if timeout.is_some_and(|t| start.elapsed() > t) {
                    return Err(Error::Timeout);
                }
                std::thread::sleep(Duration::from_micros(50));
                continue;
            };
            let mut pfd = libc::pollfd { fd: event, events: libc::POLLIN, revents: 0 };
            // SAFETY: polling one valid descriptor.
            let r = unsafe { libc::poll(&mut pfd, 1, left.max(1)) };
            if r > 0 {
                let mut b = [0u8; 8];
                // SAFETY: reading the eventfd counter into a live buffer.
                unsafe { libc::read(event, b.as_mut_ptr().cast(), 8) };
            }
            self.backend.check_alive()?;
        }
    }

    /// The registered scratch buffer (allocated on first use).
    fn scratch(&mut self) -> Result<&mut Buffer> {
        if self.scratch.is_none() {
            self.scratch = Some(self.alloc(SCRATCH)?);
        }
        Ok(self.scratch.as_mut().expect("allocated"))
    }

    /// Where blocking atomics have the NIC write the old value: the first
    /// `len` (at most 8) bytes of the scratch buffer.
    pub(crate) fn atomic_result_sge(&mut self, len: usize) -> Result<Sge> {
        debug_assert!(len <= 8);
        Ok(self.scratch()?.sge(0, len))
    }

    /// Loads an encoded group (entry, then its body for more than 64
    /// members) into the NIC's group table; returns its first slot. The
    /// scratch buffer grows once to the largest group's size (21 KiB).
    pub(crate) fn set_group_encoded(&mut self, encoded: &[u8]) -> Result<u32> {
        if encoded.len() < GroupEntry::SIZE {
            return Err(Error::invalid("group encoding shorter than its entry"));
        }
        if self.scratch.as_ref().is_some_and(|b| b.len() < encoded.len()) {
            self.scratch = Some(self.alloc(encoded.len().max(SCRATCH))?);
        }
        let buf = self.scratch()?;
        buf.as_mut_slice()[..encoded.len()].copy_from_slice(encoded);
        let at = buf.sge(0, encoded.len());
        let buf = self.scratch.as_ref().expect("allocated above");
        self.backend.group_set(&buf.as_slice()[..encoded.len()], at)
    }

    /// Retires a NIC group slot.
    pub(crate) fn clear_group_slot(&mut self, slot: u32) -> Result<()> {
        self.backend.group_clear(slot)
    }

    /// A work request id for the library's own blocking calls ([`INTERNAL_WR`]).
    pub(crate) fn internal_wr(&mut self) -> u64 {
        self.internal_wr = self.internal_wr.wrapping_add(1) & ((1 << 48) - 1);
        INTERNAL_WR | self.internal_wr
    }

    /// NIC counters (`emp_uapi::sram::counter`).
    ///
    /// # Errors
    /// [`Error::Protocol`] through `/dev/emp-nic` (the driver does not
    /// export them) or when the daemon went away.
    ///
    /// # Examples
    /// ```no_run
    /// # let dev = emp::Device::open()?;
    /// let counters = dev.nic_counters()?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn nic_counters(&self) -> Result<[u64; COUNTERS]> {
        self.backend.counters()
    }

    /// The NIC processors' working time so far: (nanoseconds, batches) the
    /// emulated NIC's engine and CPU threads spent on this NIC's doorbells,
    /// frames and timers, their polling that found nothing excluded.
    ///
    /// # Errors
    /// [`Error::Protocol`] through the kernel driver (only `emp-nicd`
    /// keeps the figure) or when the daemon cannot be reached.
    pub fn nic_busy(&self) -> Result<(u64, u64)> {
        self.backend.busy()
    }
}

fn nic_dead() -> Error {
    Error::Protocol(format!("the NIC stopped: its liveness word stood still for {} s", NIC_DEAD_NS / 1_000_000_000))
}

impl EventSource for Device {
    fn event_fd(&self) -> RawFd {
        self.backend.event_fd().unwrap_or(-1)
    }
}
