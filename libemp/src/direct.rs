//! Direct attach: the device is an `emp-nicd` NIC reached over its Unix
//! socket (see `emp_uapi::attach`). The socket is the control path; the
//! data path is the mapped port window and a shared memfd arena.

use std::collections::VecDeque;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use emp_uapi::attach::{attach_reply as ar, op, AttachMsg, ATTACH_VERSION};
use emp_uapi::desc::{Cqe, Opcode, Sge, Status, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE, SGE_MAX, WD_SIGNALED};
use emp_uapi::ring;
use emp_uapi::sram::{ctl, PortWindow};
use emp_uapi::{Le, PAGE_SIZE};
use nix::sys::socket::{
    connect, recvmsg, sendmsg, socket, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};

use crate::{Buffer, Completion, Endpoint, Error, EventSource, MemoryRegion, PortInfo, Result};

/// Default arena size (pages are allocated only when touched).
const ARENA_DEFAULT: usize = 256 << 20;
/// Completion queue entries.
pub(crate) const CQ_ENTRIES: u32 = 4096;

/// How the device's control path is reached.
pub(crate) enum Control {
    /// An `emp-nicd` socket, with the port's doorbell and event eventfds.
    Direct { sock: OwnedFd, doorbell: OwnedFd, event: OwnedFd },
    /// `/dev/emp-nic` (emp.ko): ioctls; the NIC polls the rings. `event`
    /// is the eventfd handed to the driver (SET_EVENTFD) when the NIC has
    /// an interrupt; without one, waiting polls.
    Kernel { dev: OwnedFd, event: Option<OwnedFd> },
}

/// An open port on an EMP NIC.
pub struct Device {
    ctl: Control,
    window: *mut u8,
    window_len: usize,
    info: PortInfo,
    arena: *mut u8,
    arena_len: usize,
    arena_key: u32,
    arena_next: usize,
    _arena_fd: Option<OwnedFd>,
    cq_head: u32,
    /// Completions taken from the CQ by `wait_wr` for someone else.
    stash: VecDeque<Completion>,
    send_prod: u32,
    recv_prod: u32,
    daemon_pid: i32,
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
}

// SAFETY: the raw pointers are mappings owned by this Device; it is used
// by one thread at a time (it is not Sync).
unsafe impl Send for Device {}

fn memfd(name: &str, len: usize) -> Result<OwnedFd> {
    let c = std::ffi::CString::new(name).expect("no NUL");
    // SAFETY: valid C string and flags.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on a valid fd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // The NIC maps this memory: it must never shrink under it.
    // SAFETY: fcntl(F_ADD_SEALS) on our own memfd.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(fd)
}

pub(crate) fn map_shared(fd: RawFd, len: usize) -> Result<*mut u8> {
    // SAFETY: mapping `len` bytes of a descriptor we hold, shared, RW.
    let p =
        unsafe { libc::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(p.cast())
}

fn request(sock: RawFd, opcode: u32, args: &[u64], fds: &[RawFd]) -> Result<(AttachMsg, Vec<OwnedFd>)> {
    let mut m = AttachMsg { version: ATTACH_VERSION, op: opcode, ..Default::default() };
    m.arg[..args.len()].copy_from_slice(args);
    let mut b = [0u8; AttachMsg::SIZE];
    m.put(&mut b);
    let iov = [std::io::IoSlice::new(&b)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cm: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(sock, &iov, cm, MsgFlags::MSG_NOSIGNAL, None).map_err(|e| Error::Protocol(format!("send: {e}")))?;
    let mut rb = [0u8; AttachMsg::SIZE];
    let mut cspace = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(&mut rb)];
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut cspace), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| Error::Protocol(format!("receive: {e}")))?;
    let mut got = Vec::new();
    for c in msg.cmsgs().map_err(|e| Error::Protocol(e.to_string()))? {
        if let ControlMessageOwned::ScmRights(v) = c {
            // SAFETY: SCM_RIGHTS handed us new descriptors.
            got.extend(v.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    if msg.bytes != AttachMsg::SIZE {
        return Err(Error::Protocol(if msg.bytes == 0 {
            "the NIC daemon went away".into()
        } else {
            "short reply".into()
        }));
    }
    let r = AttachMsg::get(&rb);
    if r.op != opcode {
        return Err(Error::Protocol(format!("reply to op {} for op {opcode}", r.op)));
    }
    Ok((r, got))
}

fn op_name(o: u32) -> &'static str {
    match o {
        op::ATTACH => "attach",
        op::REG_ARENA => "register arena",
        op::REG_VM => "register memory",
        op::START => "start port",
        op::DEREG => "deregister memory",
        op::GROUP_SET => "set group",
        op::GROUP_CLEAR => "clear group",
        _ => "stats",
    }
}

fn call(sock: RawFd, opcode: u32, args: &[u64], fds: &[RawFd]) -> Result<(AttachMsg, Vec<OwnedFd>)> {
    let (r, f) = request(sock, opcode, args, fds)?;
    if r.status != 0 {
        return Err(Error::Nic { op: op_name(opcode), errno: r.status });
    }
    Ok((r, f))
}

/// NIC counters and status read through a NIC's socket without attaching.
pub fn nic_stats(path: &str) -> Result<AttachMsg> {
    let sock = connect_to(path)?;
    Ok(call(sock.as_raw_fd(), op::STATS, &[], &[])?.0)
}

/// Every NIC counter (`emp_uapi::sram::counter`), read through a NIC's socket.
pub fn nic_counters_at(path: &str) -> Result<[u64; COUNTERS]> {
    let sock = connect_to(path)?;
    all_counters(sock.as_raw_fd())
}

/// Work request ids of the library's blocking calls: this prefix (bits 63
/// and 61) plus a 48-bit counter. (`rdv` uses bit 63 alone and 63 + 62.)
pub const INTERNAL_WR: u64 = 0xA000_0000_0000_0000;

/// Number of NIC counters.
pub const COUNTERS: usize = emp_uapi::sram::counter::COUNT;

fn all_counters(sock: RawFd) -> Result<[u64; COUNTERS]> {
    let (base, _) = call(sock, op::STATS, &[], &[])?;
    let (ext, _) = call(sock, op::STATS_EXT, &[], &[])?;
    let mut c = [0u64; COUNTERS];
    c[..16].copy_from_slice(&base.arg[..16]);
    c[16..].copy_from_slice(&ext.arg[..COUNTERS - 16]);
    Ok(c)
}

fn connect_to(path: &str) -> Result<OwnedFd> {
    let sock = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
    connect(sock.as_raw_fd(), &UnixAddr::new(path)?).map_err(|e| Error::Protocol(format!("connect {path}: {e}")))?;
    Ok(sock)
}

impl Device {
    /// Opens the device named by `EMP_DEVICE`.
    pub fn open() -> Result<Device> {
        let path = std::env::var("EMP_DEVICE").map_err(|_| Error::NoDevice)?;
        Device::open_path(&path)
    }

    /// Opens `/dev/emp-nic…` (the kernel driver) or an `emp-nicd` socket;
    /// the arena size comes from `EMP_ARENA_MB`.
    pub fn open_path(path: &str) -> Result<Device> {
        if path.starts_with("/dev/") {
            return crate::kernel::open(path);
        }
        let arena_len = std::env::var("EMP_ARENA_MB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map(|mb| mb << 20)
            .unwrap_or(ARENA_DEFAULT);
        let sock = connect_to(path)?;
        let (r, mut fds) = call(sock.as_raw_fd(), op::ATTACH, &[], &[])?;
        if fds.len() != 3 {
            return Err(Error::Protocol(format!("attach returned {} descriptors, expected 3", fds.len())));
        }
        let event = fds.pop().expect("3");
        let doorbell = fds.pop().expect("3");
        let window_fd = fds.pop().expect("3");
        let window_len = r.arg[ar::WINDOW_SIZE] as usize;
        let info = PortInfo {
            node: r.arg[ar::NODE] as u16,
            port: r.arg[ar::PORT] as u16,
            mtu: r.arg[ar::MTU] as u32,
            send_entries: r.arg[ar::SEND_ENTRIES] as u32,
            recv_entries: r.arg[ar::RECV_ENTRIES] as u32,
            nodes: r.arg[ar::NODES] as u32,
            port_count: r.arg[ar::PORT_COUNT] as u32,
            msg_max: r.arg[ar::MSG_MAX],
            features: r.arg[ar::FEATURES] as u32,
        };
        let ok_geometry = info.send_entries.is_power_of_two()
            && info.recv_entries.is_power_of_two()
            && window_len >= PAGE_SIZE + (info.send_entries + info.recv_entries) as usize * WorkDesc::SIZE;
        if !ok_geometry {
            return Err(Error::Protocol("port geometry does not fit the window".into()));
        }
        let window = map_shared(window_fd.as_raw_fd(), window_len)?;
        let arena_fd = memfd("emp-arena", arena_len)?;
        let arena = map_shared(arena_fd.as_raw_fd(), arena_len)?;
        let access = (MR_LOCAL_READ | MR_LOCAL_WRITE) as u64;
        let (r2, _) = call(sock.as_raw_fd(), op::REG_ARENA, &[0, arena_len as u64, access], &[arena_fd.as_raw_fd()])?;
        let arena_key = r2.arg[0] as u32;
        call(sock.as_raw_fd(), op::START, &[arena_key as u64, 0, CQ_ENTRIES as u64], &[])?;
        Ok(Device::assemble(
            Control::Direct { sock, doorbell, event },
            window,
            window_len,
            info,
            (arena, arena_len, arena_key, Some(arena_fd)),
            r.arg[ar::DAEMON_PID] as i32,
        ))
    }

    /// A device from its parts; the CQ sits at the start of the arena.
    pub(crate) fn assemble(
        ctl: Control,
        window: *mut u8,
        window_len: usize,
        info: PortInfo,
        arena: (*mut u8, usize, u32, Option<OwnedFd>),
        daemon_pid: i32,
    ) -> Device {
        Device {
            ctl,
            window,
            window_len,
            info,
            arena: arena.0,
            arena_len: arena.1,
            arena_key: arena.2,
            arena_next: (CQ_ENTRIES as usize * Cqe::SIZE).next_multiple_of(PAGE_SIZE),
            _arena_fd: arena.3,
            cq_head: 0,
            stash: VecDeque::new(),
            send_prod: 0,
            recv_prod: 0,
            daemon_pid,
            groups: Default::default(),
            scratch: None,
            internal_wr: 0,
            spin: std::env::var("EMP_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(Duration::from_micros(20), Duration::from_micros),
        }
    }

    /// What this port is.
    pub fn info(&self) -> &PortInfo {
        &self.info
    }

    /// This port's endpoint.
    pub fn endpoint(&self) -> Endpoint {
        self.info.endpoint()
    }

    /// Registered, NIC-shared memory of `len` bytes (64-byte aligned).
    pub fn alloc(&mut self, len: usize) -> Result<Buffer> {
        let off = self.arena_next.next_multiple_of(64);
        if off.checked_add(len).is_none_or(|e| e > self.arena_len) {
            return Err(Error::ArenaFull);
        }
        self.arena_next = off + len;
        // SAFETY: `off + len <= arena_len`, inside our mapping.
        let ptr = unsafe { self.arena.add(off) };
        Ok(Buffer { ptr, len, key: self.arena_key, offset: off as u64 })
    }

    /// Like [`Device::alloc`], in a registration of its own with `access`
    /// rights added to local read and write: e.g. [`crate::MR_REMOTE_ATOMIC`]
    /// for words other ports may target with remote atomics. The buffer
    /// starts on a page and its SGEs and remote words are relative to it.
    pub fn alloc_mr(&mut self, len: usize, access: u8) -> Result<Buffer> {
        let off = self.arena_next.next_multiple_of(PAGE_SIZE);
        let span = len.max(1).next_multiple_of(PAGE_SIZE);
        if off.checked_add(span).is_none_or(|e| e > self.arena_len) {
            return Err(Error::ArenaFull);
        }
        let access = access | MR_LOCAL_READ | MR_LOCAL_WRITE;
        // SAFETY: `off + span <= arena_len`, inside our mapping.
        let ptr = unsafe { self.arena.add(off) };
        let key = match (&self.ctl, &self._arena_fd) {
            // The same memfd pages, registered again with other rights.
            (Control::Direct { sock, .. }, Some(fd)) => {
                let args = [off as u64, span as u64, access as u64];
                call(sock.as_raw_fd(), op::REG_ARENA, &args, &[fd.as_raw_fd()])?.0.arg[0] as u32
            }
            (Control::Kernel { dev, .. }, _) => {
                crate::kernel::reg_mr(dev.as_raw_fd(), ptr as u64, span as u64, access)?
            }
            (Control::Direct { .. }, None) => {
                return Err(Error::Protocol("direct attach without an arena descriptor".into()))
            }
        };
        self.arena_next = off + span;
        Ok(Buffer { ptr, len, key, offset: 0 })
    }

    /// The 8-byte result word of blocking operations.
    pub(crate) fn atomic_scratch(&mut self) -> Result<Buffer> {
        self.scratch(8)
    }

    /// Registers arbitrary memory of this process. The NIC reaches it with
    /// `process_vm_readv/writev`, which this call permits with
    /// `prctl(PR_SET_PTRACER)`.
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay mapped until `dereg_mr`, and must not
    /// be accessed while a posted operation on it is in flight.
    pub unsafe fn reg_mr(&mut self, addr: *const u8, len: usize, access: u8) -> Result<MemoryRegion> {
        // SAFETY: prctl with a pid argument has no memory effects.
        unsafe { libc::prctl(libc::PR_SET_PTRACER, self.daemon_pid as libc::c_ulong, 0, 0, 0) };
        let key = match &self.ctl {
            Control::Direct { sock, .. } => {
                call(sock.as_raw_fd(), op::REG_VM, &[addr as u64, len as u64, access as u64], &[])?.0.arg[0] as u32
            }
            Control::Kernel { dev, .. } => crate::kernel::reg_mr(dev.as_raw_fd(), addr as u64, len as u64, access)?,
        };
        Ok(MemoryRegion { key, addr: addr as usize, len })
    }

    /// Deregisters a region.
    pub fn dereg_mr(&mut self, mr: MemoryRegion) -> Result<()> {
        match &self.ctl {
            Control::Direct { sock, .. } => call(sock.as_raw_fd(), op::DEREG, &[mr.key as u64], &[]).map(|_| ()),
            Control::Kernel { dev, .. } => crate::kernel::dereg_mr(dev.as_raw_fd(), mr.key),
        }
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.window_len);
        // SAFETY: in-window, aligned; shared memory accessed atomically.
        unsafe { &*self.window.add(off).cast::<AtomicU32>() }
    }

    pub(crate) fn post(&mut self, send: bool, d: &WorkDesc) -> Result<()> {
        // The mapping starts at this port's window.
        let w = PortWindow { base: 0, send_entries: self.info.send_entries, recv_entries: self.info.recv_entries };
        let (prod, cons_off, prod_off, entries) = if send {
            (self.send_prod, ctl::SEND_CONS, ctl::SEND_PROD, w.send_entries)
        } else {
            (self.recv_prod, ctl::RECV_CONS, ctl::RECV_PROD, w.recv_entries)
        };
        let cons = self.word(cons_off).load(Ordering::Acquire);
        if !ring::has_room(prod, cons, entries) {
            return Err(Error::RingFull);
        }
        let mut b = [0u8; WorkDesc::SIZE];
        d.put(&mut b);
        let slot = if send { w.send_slot(prod) } else { w.recv_slot(prod) };
        // SAFETY: the slot lies inside the window (geometry checked at open).
        unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), self.window.add(slot), WorkDesc::SIZE) };
        let next = prod.wrapping_add(1);
        // The descriptor is visible before the index that publishes it.
        self.word(prod_off).store(next, Ordering::Release);
        if send {
            self.send_prod = next;
        } else {
            self.recv_prod = next;
        }
        // Pairs with the NIC's fence before it sleeps: either it sees our
        // index, or we see that it sleeps and ring the doorbell.
        fence(Ordering::SeqCst);
        if let Control::Direct { doorbell, .. } = &self.ctl {
            if self.word(ctl::NIC_SLEEPING).load(Ordering::Relaxed) != 0 {
                let one = 1u64.to_ne_bytes();
                // SAFETY: 8-byte write to our doorbell eventfd.
                unsafe { libc::write(doorbell.as_raw_fd(), one.as_ptr().cast(), 8) };
            }
        }
        Ok(())
    }

    fn desc(opcode: Opcode, wr_id: u64, ep: Endpoint, tag: u64, ignore: u64, sges: &[Sge]) -> Result<WorkDesc> {
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

    /// Posts a tagged send of the bytes named by `sges` to `dst`.
    pub fn post_send(&mut self, wr_id: u64, dst: Endpoint, tag: u64, sges: &[Sge]) -> Result<()> {
        let d = Self::desc(Opcode::Send, wr_id, dst, tag, 0, sges)?;
        self.post(true, &d)
    }

    /// Posts a receive for a message from `src` (or [`crate::ANY`]) whose tag
    /// equals `tag` in every bit not set in `ignore`.
    pub fn post_recv(&mut self, wr_id: u64, src: Endpoint, tag: u64, ignore: u64, sges: &[Sge]) -> Result<()> {
        let d = Self::desc(Opcode::Recv, wr_id, src, tag, ignore, sges)?;
        self.post(false, &d)
    }

    /// Posts a raw descriptor (tests of the NIC's input validation).
    pub fn post_raw(&mut self, send: bool, d: &WorkDesc) -> Result<()> {
        self.post(send, d)
    }

    /// Takes up to `out.len()` completions (those [`Device::wait_wr`] set
    /// aside first); returns how many.
    pub fn poll_cq(&mut self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(c) = self.stash.pop_front() else { break };
            out[n] = c;
            n += 1;
        }
        n + self.poll_ring(&mut out[n..])
    }

    /// Waits for the completion of work request `wr_id`; other completions
    /// are set aside for the next [`Device::poll_cq`] / [`Device::wait_cq`].
    /// What is set aside is bounded by the work outstanding (the send and
    /// receive rings). `None` = wait forever.
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
    pub fn poll_wr(&mut self, wr_id: u64) -> Option<Completion> {
        let mut buf = [Completion::default(); 16];
        loop {
            let n = self.poll_ring(&mut buf);
            self.stash.extend(&buf[..n]);
            if n < buf.len() {
                break;
            }
        }
        let i = self.stash.iter().position(|c| c.wr_id == wr_id)?;
        self.stash.remove(i)
    }

    /// Takes completions from the CQ ring itself.
    fn poll_ring(&mut self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let idx = ring::slot(self.cq_head, CQ_ENTRIES);
            // SAFETY: the CQ occupies the first CQ_ENTRIES * 32 bytes of the arena.
            let entry = unsafe { self.arena.add(idx as usize * Cqe::SIZE) };
            // SAFETY: reading the flags byte (the entry's last) of a live
            // entry; the NIC makes it visible after the rest of the entry
            // (a DMA fence between), so observing the phase means the body is
            // complete once the acquire fence below orders our reads.
            let flags = unsafe { core::ptr::read_volatile(entry.add(emp_uapi::desc::CQE_FLAGS_OFFSET)) };
            if !ring::cqe_is_new(flags, self.cq_head, CQ_ENTRIES) {
                break;
            }
            fence(Ordering::Acquire);
            let mut b = [0u8; Cqe::SIZE];
            // SAFETY: the entry is complete (phase observed above).
            unsafe { core::ptr::copy_nonoverlapping(entry, b.as_mut_ptr(), Cqe::SIZE) };
            let c = Cqe::get(&b);
            let opcode = Opcode::from_u8(c.opcode).unwrap_or(Opcode::Send);
            out[n] = Completion {
                wr_id: c.wr_id,
                status: Status::from_u8(c.status).unwrap_or(Status::BadDescriptor),
                is_recv: opcode == Opcode::Recv,
                byte_len: c.byte_len,
                tag: c.tag,
                src: Endpoint { node: c.src_node, port: c.src_port },
                msg_len: c.msg_len,
                opcode,
                old: if opcode.is_atomic() { c.tag } else { 0 },
            };
            n += 1;
            self.cq_head = self.cq_head.wrapping_add(1);
        }
        if n > 0 {
            self.word(ctl::CQ_CONS).store(self.cq_head, Ordering::Release);
        }
        n
    }

    /// How long waits poll before sleeping on the port's event (default
    /// 20 µs, or `EMP_SPIN_US`). Zero: sleep at once, which costs the least
    /// CPU when the NIC does the work (offloaded collectives).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// The current spin before sleeping (see [`Device::set_spin`]).
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// Asks for an event on the next completion (like `ibv_req_notify_cq`).
    pub fn arm(&mut self) {
        if let Control::Kernel { dev, event: Some(_) } = &self.ctl {
            // The driver must know the port is armed to route the
            // interrupt; it writes the ARM word itself.
            if crate::kernel::arm(dev.as_raw_fd()).is_ok() {
                return;
            }
        }
        self.word(ctl::ARM).store(1, Ordering::Release);
        fence(Ordering::SeqCst);
    }

    /// Waits for completions: polls briefly, then arms and blocks on the
    /// event descriptor. `None` = wait forever.
    pub fn wait_cq(&mut self, out: &mut [Completion], timeout: Option<Duration>) -> Result<usize> {
        if !self.stash.is_empty() {
            return Ok(self.poll_cq(out));
        }
        self.wait_ring(out, timeout)
    }

    fn wait_ring(&mut self, out: &mut [Completion], timeout: Option<Duration>) -> Result<usize> {
        let start = Instant::now();
        let spin_until = start + self.spin;
        loop {
            let n = self.poll_ring(out);
            if n > 0 {
                return Ok(n);
            }
            if Instant::now() < spin_until {
                std::hint::spin_loop();
                continue;
            }
            self.arm();
            let n = self.poll_ring(out);
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
            let (Control::Direct { event, .. } | Control::Kernel { event: Some(event), .. }) = &self.ctl else {
                // A NIC without an interrupt (kernel backend, no MSI-X): poll.
                if timeout.is_some_and(|t| start.elapsed() > t) {
                    return Err(Error::Timeout);
                }
                std::thread::sleep(Duration::from_micros(50));
                continue;
            };
            let event = event.as_raw_fd();
            let mut pfd = libc::pollfd { fd: event, events: libc::POLLIN, revents: 0 };
            // SAFETY: polling one valid descriptor.
            let r = unsafe { libc::poll(&mut pfd, 1, left.max(1)) };
            if r > 0 {
                let mut b = [0u8; 8];
                // SAFETY: reading the eventfd counter into a live buffer.
                unsafe { libc::read(event, b.as_mut_ptr().cast(), 8) };
            }
            self.check_daemon()?;
        }
    }

    /// Errors out if the NIC daemon is gone (the socket hung up).
    fn check_daemon(&self) -> Result<()> {
        let Control::Direct { sock, .. } = &self.ctl else { return Ok(()) };
        let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: polling one valid descriptor without blocking.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        if r > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLIN) != 0 {
            return Err(Error::Protocol("the NIC daemon went away".into()));
        }
        Ok(())
    }

    /// Registered scratch memory for control requests (allocated once).
    pub(crate) fn scratch(&mut self, len: usize) -> Result<Buffer> {
        const SCRATCH: usize = 4096;
        if len > SCRATCH {
            return Err(Error::invalid("control request larger than the scratch buffer"));
        }
        if self.scratch.is_none() {
            self.scratch = Some(self.alloc(SCRATCH)?);
        }
        Ok(self.scratch.expect("allocated"))
    }

    /// A work request id for the library's own blocking calls ([`INTERNAL_WR`]).
    pub(crate) fn internal_wr(&mut self) -> u64 {
        self.internal_wr = self.internal_wr.wrapping_add(1) & ((1 << 48) - 1);
        INTERNAL_WR | self.internal_wr
    }

    /// A control request to the NIC (`emp_uapi::attach::op`): over the
    /// daemon's socket, or the matching ioctl of `/dev/emp-nic` (group
    /// requests; the reply carries what the daemon's would).
    pub(crate) fn control(&mut self, opcode: u32, args: &[u64]) -> Result<AttachMsg> {
        let dev = match &self.ctl {
            Control::Direct { sock, .. } => return Ok(call(sock.as_raw_fd(), opcode, args, &[])?.0),
            Control::Kernel { dev, .. } => dev.as_raw_fd(),
        };
        let mut out = AttachMsg { version: ATTACH_VERSION, op: opcode, ..Default::default() };
        match (opcode, args) {
            // (key, offset) of the entry in registered memory: the driver
            // copies it from our address space instead.
            (op::GROUP_SET, &[key, offset]) => {
                let entry = self.arena_bytes(key, offset, emp_uapi::sram::GroupEntry::SIZE)?;
                out.arg[0] = crate::kernel::group_set(dev, entry)? as u64;
            }
            (op::GROUP_CLEAR, &[slot]) => {
                let slot = u32::try_from(slot).map_err(|_| Error::InvalidArgument("group slot out of range".into()))?;
                crate::kernel::group_clear(dev, slot)?;
            }
            _ => return Err(Error::Unsupported("this control request through /dev/emp-nic")),
        }
        Ok(out)
    }

    /// `len` bytes at `offset` of the arena (`key` must be the arena's).
    fn arena_bytes(&self, key: u64, offset: u64, len: usize) -> Result<&[u8]> {
        let start = usize::try_from(offset).map_err(|_| Error::InvalidArgument("offset beyond the arena".into()))?;
        if key != self.arena_key as u64 || start.checked_add(len).is_none_or(|end| end > self.arena_len) {
            return Err(Error::InvalidArgument("control request memory is not in the arena".into()));
        }
        // SAFETY: [start, start + len) lies inside the arena mapping, which
        // lives as long as `self`.
        Ok(unsafe { std::slice::from_raw_parts(self.arena.add(start), len) })
    }

    /// NIC counters (`emp_uapi::sram::counter`).
    pub fn nic_counters(&self) -> Result<[u64; COUNTERS]> {
        let Control::Direct { sock, .. } = &self.ctl else {
            return Err(Error::Protocol("NIC counters are read through emp-nicd, not /dev/emp-nic".into()));
        };
        all_counters(sock.as_raw_fd())
    }
}

impl EventSource for Device {
    fn event_fd(&self) -> RawFd {
        match &self.ctl {
            Control::Direct { event, .. } => event.as_raw_fd(),
            Control::Kernel { event: Some(e), .. } => e.as_raw_fd(),
            Control::Kernel { event: None, .. } => -1,
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: our own mappings, not used after this.
        unsafe {
            libc::munmap(self.window.cast(), self.window_len);
            libc::munmap(self.arena.cast(), self.arena_len);
        }
        // Closing the socket (or the device file) makes the NIC close the
        // port and release everything registered.
    }
}
