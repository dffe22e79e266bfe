//! One emulated NIC: its SRAM, DMA map, ports, and the trusted-side
//! operations (what a driver does: register memory, open and close ports
//! through the admin mailbox). The control program itself runs on the
//! engine thread (`engine.rs`), loaded by `firmware.rs`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use emp_uapi::desc::{MrEntry, MrFormat, PhysSeg, MR_ACCESS_ALL, MR_INLINE_SEGS};
use emp_uapi::fwabi::FwConfig;
use emp_uapi::sram::{
    admin_result, ctl, AdminMailbox, AdminOp, FailReason, GroupEntry, GroupView, Layout, LayoutParams, NicStatus,
    PortCtl, RouteEntry, SramHeader,
};
use emp_uapi::Le;

use crate::dma::{bus_addr, DmaMap, Region, SPACE_ARENA, SPACE_VM};
use crate::sram::Sram;
use crate::sys::{eventfd, signal};

/// How a NIC is built.
#[derive(Clone, Debug)]
pub struct NicConfig {
    /// Node id.
    pub node: u16,
    /// Nodes in the route table (ids `0..nodes`).
    pub nodes: u16,
    /// MTU.
    pub mtu: u32,
    /// `FEATURE_*` bits.
    pub features: u32,
    /// SRAM geometry.
    pub layout: LayoutParams,
    /// Control-program tunables.
    pub fw: FwConfig,
    /// How every node is reached (written to the SRAM route table).
    pub routes: crate::route::RouteTable,
    /// NIC CPUs (`cpus.rs`): 1 runs the control program on the engine
    /// thread; 2 gives a two-CPU plan's second CPU a thread of its own.
    pub cpus: u32,
}

/// An allocated port.
pub struct PortState {
    /// Doorbell eventfd (process → NIC).
    pub doorbell: OwnedFd,
    /// Event eventfd (NIC → process).
    pub event: OwnedFd,
    /// Owning process.
    pub pid: i32,
    /// Keys of regions it registered.
    pub keys: Vec<u32>,
    /// START done.
    pub started: bool,
    /// The port's wire address (its slot until restored into another).
    pub addr: u16,
    /// Unique among the ports this NIC ever gave out (a process may hold
    /// several, one after another in the same slot).
    pub id: u64,
}

/// A port context saved by its process (docs/context-switch.md): its slot
/// is free, its registrations belong to no slot, the NIC keeps its wire
/// address parked under this identity.
pub struct ParkedPort {
    /// Wire address and generation (what `PortRestore` must name).
    pub addr: u16,
    /// Generation.
    pub gen: u16,
    /// The port's state, eventfds and keys kept for the restore.
    pub state: PortState,
}

/// The owner the daemon gives a parked port's MR entries: no slot.
const PARKED_OWNER: u16 = u16::MAX;

/// Room of the daemon memory a gang-switched port is saved into; the
/// control program refuses (`NO_ROOM`) an image that does not fit.
const GANG_IMAGE_ROOM: usize = 8 << 20;

/// A port the gang scheduler switched out: saved into daemon memory (a
/// region registered to the port, so it travels with the context), to be
/// restored into the slot it had, which its process still maps.
struct GangSaved {
    pid: i32,
    slot: u16,
    image_key: u32,
    len: u64,
    parked: ParkedPort,
}

/// A context-switch admin result as an errno.
fn ctx_result(r: u32) -> Result<(), Errno> {
    match r {
        admin_result::OK => Ok(()),
        admin_result::NOT_STABLE => Err(libc::EAGAIN),
        admin_result::NO_ROOM => Err(libc::ENOSPC),
        admin_result::BAD_KEY => Err(libc::ENOENT),
        admin_result::BAD_STATE => Err(libc::EALREADY),
        admin_result::BAD_IMAGE => Err(libc::EBADMSG),
        _ => Err(libc::EINVAL),
    }
}

/// Errors of trusted-side operations: an errno.
pub type Errno = i32;

// Lock order of `NicShared`.
//
// Two kinds of thread share a NIC: the engine, whose control-program HAL
// calls take `dma` (DMA), `ports` and `guest_irq` (interrupts), and the
// control threads (one per attached process, the ivshmem server, `main`),
// which take any of them through the trusted-side operations below.
//
// * `admin` is outermost. A control thread holds it while it waits for the
//   engine to complete a mailbox command, and the engine completes it only
//   after its HAL calls got their locks. So `admin` is never taken while
//   holding any other lock, and the engine never takes `admin`.
// * `dma`, `ports`, `mr_free`, `key_salt`, `groups`, `parked_addrs` and `guest_irq` are
//   leaves: each is taken on its own and released before the next one is
//   taken (or `admin`). No two are ever held together, so there is no order
//   among them to get wrong; keep it that way rather than nest.
// * The exception to the rule above: `dma` is a read-write lock, and a NIC
//   CPU holds it for reading through a whole call into the program
//   (`cpus.rs`: the program, then `dma`) or a whole batch of its jobs
//   (`dma`, then that CPU's runner inside the program's common area). Under
//   it the HAL takes leaves (`ports` to raise an interrupt). The program's
//   holder may wait for a runner (an `MrFence` drains the jobs; a full job
//   ring), and a runner's holder waits for nothing: its jobs only move
//   bytes and queue frames. Region changes take `dma` for writing, alone.
// * `ports` guards the lifetime of each port's eventfds: whoever signals or
//   sends one holds `ports` meanwhile, because `release_port` closes them.
// * Receive double buffering's DMA thread (`dmaq.rs`) takes only leaves
//   (`dma` per write, `ports` or `guest_irq` per queued interrupt), so the
//   NIC CPUs may wait for it (a drain, a free buffer) under the program's
//   lock: nothing it waits for waits for the program.
//
// `wake` and `ports_changed` are lock-free (an eventfd and an atomic).

/// The parts of a NIC shared between the engine and control threads (lock
/// order: see the comment above).
pub struct NicShared {
    /// Node id.
    pub node: u16,
    /// SRAM geometry.
    pub layout: Layout,
    /// SRAM.
    pub sram: Sram,
    /// DMA regions by MR slot.
    pub dma: RwLock<DmaMap>,
    /// Ports by number.
    pub ports: Mutex<Vec<Option<PortState>>>,
    mr_free: Mutex<Vec<u16>>,
    admin: Mutex<()>,
    /// Wakes the engine (admin requests).
    pub wake: OwnedFd,
    /// Set when the port set changed (the engine re-reads its sleep set).
    pub ports_changed: AtomicBool,
    /// Wire addresses of saved (parked) ports: no new port takes them.
    parked_addrs: Mutex<Vec<u16>>,
    /// Ports switched out by the gang scheduler (bounded by the slots: at
    /// most one entry per port a process held).
    gang: Mutex<Vec<GangSaved>>,
    /// The next `PortState::id`.
    next_port_id: std::sync::atomic::AtomicU64,

    key_salt: Mutex<u32>,
    /// Group table slots in use: (`PortState::id` of the owning port, group
    /// id). Keyed by the port's identity, not its slot: a switched-out
    /// port's groups stay in the table (docs/context-switch.md) while
    /// another port in its slot creates its own, of any id.
    groups: Mutex<Vec<Option<(u64, u32)>>>,
    /// Largest message.
    pub msg_max: u64,
    /// NIC CPUs ([`NicConfig::cpus`]).
    pub cpus: u32,
    /// A guest NIC's interrupt: the eventfd behind the guest's MSI-X
    /// vector 0 (ivshmem-doorbell), while a guest is attached.
    pub guest_irq: Mutex<Option<OwnedFd>>,
    /// The NIC's processors' working time: nanoseconds spent on this NIC's
    /// doorbells, frames and timers, and the batches (`op::BUSY`).
    pub busy: BusyClock,
}

/// Working time of a NIC's processors, apart from their polling: what a
/// message costs the NIC (`emp bench rate`), where the threads' run time
/// also holds the spinning between messages.
#[derive(Default)]
pub struct BusyClock {
    ns: AtomicU64,
    batches: AtomicU64,
}

impl BusyClock {
    /// One batch of work that took `ns`.
    pub fn add(&self, ns: u64) {
        // Relaxed: a statistic, read on its own.
        self.ns.fetch_add(ns, Ordering::Relaxed);
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// (nanoseconds, batches) so far.
    pub fn read(&self) -> (u64, u64) {
        (self.ns.load(Ordering::Relaxed), self.batches.load(Ordering::Relaxed))
    }
}

impl NicShared {
    /// Status word from SRAM.
    pub fn status(&self) -> (NicStatus, FailReason) {
        let h: SramHeader = self.header();
        (
            NicStatus::from_u32(h.status).unwrap_or(NicStatus::Failed),
            FailReason::from_u32(h.fail_reason).unwrap_or(FailReason::FirmwareCrashed),
        )
    }

    /// The SRAM header.
    pub fn header(&self) -> SramHeader {
        let mut b = [0u8; SramHeader::SIZE];
        self.sram.read(0, &mut b);
        SramHeader::get(&b)
    }

    fn running(&self) -> Result<(), Errno> {
        match self.status().0 {
            NicStatus::Running => Ok(()),
            _ => Err(libc::ENODEV),
        }
    }

    /// Runs an admin command and waits (bounded) for the control program.
    pub fn admin(&self, op: AdminOp, args: [u64; 6]) -> Result<u32, Errno> {
        self.running()?;
        let _g = self.admin.lock().expect("admin lock");
        let off = self.layout.admin_off as usize;
        let mut b = [0u8; AdminMailbox::SIZE];
        self.sram.read(off, &mut b);
        let mut mb = AdminMailbox::get(&b);
        mb.op = op as u32;
        mb.args = args;
        mb.request_seq = mb.request_seq.wrapping_add(1);
        let want = mb.request_seq;
        mb.put(&mut b);
        // Arguments first, the sequence number (which the engine watches) last.
        self.sram.write(off + 4, &b[4..]);
        self.sram.put_u32(off, want);
        signal(self.wake.as_raw_fd());
        let start = Instant::now();
        let deadline = start + Duration::from_secs(5);
        let done_off = off + core::mem::offset_of!(AdminMailbox, done_seq);
        while self.sram.u32(done_off) != want {
            if Instant::now() > deadline || self.running().is_err() {
                return Err(libc::ETIMEDOUT);
            }
            // A running engine answers within microseconds: yield for a
            // while (a 20 µs sleep costs 60–80 µs of timer slack), then sleep.
            if start.elapsed() < ADMIN_SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        Ok(self.sram.u32(off + core::mem::offset_of!(AdminMailbox, result)))
    }

    /// Allocates a free port to process `pid`.
    pub fn alloc_port(&self, pid: i32) -> Result<u16, Errno> {
        self.running()?;
        let parked = self.parked_addrs.lock().expect("parked").clone();
        let mut ports = self.ports.lock().expect("ports");
        let p = ports.iter().position(|p| p.is_none()).ok_or(libc::EBUSY)? as u16;
        // The port's wire address: its slot, unless a saved port elsewhere
        // holds that (docs/context-switch.md); then one above the slots.
        let taken = |a: u16| parked.contains(&a) || ports.iter().flatten().any(|s| s.addr == a);
        let addr = (p..u16::MAX).step_by(ports.len().max(1)).find(|&a| !taken(a)).ok_or(libc::EBUSY)?;
        let doorbell = eventfd(libc::EFD_NONBLOCK).map_err(|_| libc::EMFILE)?;
        let event = eventfd(0).map_err(|_| libc::EMFILE)?;
        let w = self.layout.port(p);
        let mut z = [0u8; PortCtl::SIZE];
        PortCtl::default().put(&mut z);
        self.sram.write(w.base, &z);
        let id = self.next_port_id.fetch_add(1, Ordering::Relaxed);
        ports[p as usize] = Some(PortState { doorbell, event, pid, keys: Vec::new(), started: false, addr, id });
        self.ports_changed.store(true, Ordering::Release);
        Ok(p)
    }

    /// A fresh (key, secret) for `slot`: the secret's 32 bits come from the
    /// OS's generator (`getrandom`), so a remote peer cannot predict them.
    fn new_key(&self, slot: u16) -> Result<(u32, u32), Errno> {
        let mut b = [0u8; 4];
        // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        if n != b.len() as isize {
            return Err(libc::EAGAIN);
        }
        Ok(MrEntry::make_key(&mut self.key_salt.lock().expect("salt"), slot, u32::from_ne_bytes(b)))
    }

    fn install_mr(&self, port: u16, region: Region, access: u8, space: u64) -> Result<(u32, u32), Errno> {
        if access & !MR_ACCESS_ALL != 0 || access == 0 {
            return Err(libc::EINVAL);
        }
        let len = region.len();
        let seg_max = 1u64 << 31;
        if len.div_ceil(seg_max) > MR_INLINE_SEGS as u64 {
            return Err(libc::EINVAL);
        }
        let slot = self.mr_free.lock().expect("mr").pop().ok_or(libc::ENOSPC)?;
        let (key, secret) = self.new_key(slot).inspect_err(|_| self.mr_free.lock().expect("mr").push(slot))?;
        let mut e =
            MrEntry { key, port, access, format: MrFormat::Chained as u8, length: len, secret, ..Default::default() };
        let mut at = 0;
        let mut i = 0;
        while at < len {
            let n = (len - at).min(seg_max);
            e.segs[i] = PhysSeg { addr: bus_addr(space, slot, at), len: n as u32, flags: 0 };
            at += n;
            i += 1;
        }
        self.dma.write().expect("dma").insert(slot, region);
        let mut b = [0u8; MrEntry::SIZE];
        e.put(&mut b);
        self.sram.write(self.layout.mr_entry(slot as usize), &b);
        if let Some(ps) = self.ports.lock().expect("ports").get_mut(port as usize).and_then(|p| p.as_mut()) {
            ps.keys.push(key);
        }
        Ok((key, secret))
    }

    /// Registers `len` bytes at `offset` of a process's memfd.
    /// Returns the key and its remote-access secret.
    pub fn reg_arena(&self, port: u16, fd: OwnedFd, offset: u64, len: u64, access: u8) -> Result<(u32, u32), Errno> {
        self.running()?;
        let r = Region::map_arena(fd, offset, len).map_err(|e| e.raw_os_error().unwrap_or(libc::EINVAL))?;
        self.install_mr(port, r, access, SPACE_ARENA)
    }

    /// Registers process memory reached by `process_vm_*`.
    /// Returns the key and its remote-access secret.
    pub fn reg_vm(&self, port: u16, pid: i32, addr: u64, len: u64, access: u8) -> Result<(u32, u32), Errno> {
        self.running()?;
        if len == 0 || len >= crate::dma::REGION_MAX || addr.checked_add(len).is_none() {
            return Err(libc::EINVAL);
        }
        let r = Region::Vm { pid, addr, len };
        // Prove the NIC can reach both ends now, rather than failing later.
        let mut b = [0u8; 1];
        if r.read(0, &mut b).is_err() || r.read(len - 1, &mut b).is_err() {
            return Err(libc::EPERM);
        }
        self.install_mr(port, r, access, SPACE_VM)
    }

    /// Deregisters `key` of `port`: invalidate the entry, fence the NIC,
    /// then unmap.
    pub fn dereg(&self, port: u16, key: u32) -> Result<(), Errno> {
        let (slot, _) = self.port_mr(port, key)?;
        let mut b = [0u8; MrEntry::SIZE];
        MrEntry::default().put(&mut b);
        self.sram.write(self.layout.mr_entry(slot), &b);
        if self.running().is_ok() {
            // After the fence no DMA uses the old translation.
            self.admin(AdminOp::MrFence, [slot as u64, 0, 0, 0, 0, 0])?;
        }
        self.dma.write().expect("dma").remove(slot as u16);
        self.mr_free.lock().expect("mr").push(slot as u16);
        if let Some(ps) = self.ports.lock().expect("ports").get_mut(port as usize).and_then(|p| p.as_mut()) {
            ps.keys.retain(|&k| k != key);
        }
        Ok(())
    }

    /// Opens `port` with its completion queue.
    pub fn start(&self, port: u16, cq_key: u32, cq_off: u64, cq_entries: u64) -> Result<(), Errno> {
        let addr = self.port_addr(port).ok_or(libc::EINVAL)?;
        let addr_arg = if addr == port { 0 } else { emp_uapi::sram::PORT_ADDR_EXPLICIT | addr as u64 };
        let r = self.admin(AdminOp::PortOpen, [port as u64, cq_key as u64, cq_off, cq_entries, 0, addr_arg])?;
        match r {
            admin_result::OK => {
                if let Some(ps) = self.ports.lock().expect("ports").get_mut(port as usize).and_then(|p| p.as_mut()) {
                    ps.started = true;
                }
                Ok(())
            }
            admin_result::BAD_KEY => Err(libc::ENOENT),
            admin_result::BAD_STATE => Err(libc::EALREADY),
            _ => Err(libc::EINVAL),
        }
    }

    /// The wire address of attached `port` (peers address it by this).
    pub fn port_addr(&self, port: u16) -> Option<u16> {
        self.ports.lock().expect("ports").get(port as usize)?.as_ref().map(|s| s.addr)
    }

    /// C1: suspends `port` (docs/context-switch.md).
    pub fn suspend(&self, port: u16) -> Result<(), Errno> {
        self.running()?;
        ctx_result(self.admin(AdminOp::PortSuspend, [port as u64, 0, 0, 0, 0, 0])?)
    }

    /// C8: resumes `port`.
    pub fn resume(&self, port: u16) -> Result<(), Errno> {
        self.running()?;
        ctx_result(self.admin(AdminOp::PortResume, [port as u64, 0, 0, 0, 0, 0])?)
    }

    /// C2–C4: is suspended `port` stable?
    pub fn is_stable(&self, port: u16) -> Result<bool, Errno> {
        self.running()?;
        match self.admin(AdminOp::PortStable, [port as u64, 0, 0, 0, 0, 0])? {
            admin_result::NOT_STABLE => Ok(false),
            r => ctx_result(r).map(|_| true),
        }
    }

    /// C6: saves stable suspended `port` into its region `key` at `offset`
    /// (at most `room` bytes) and frees the slot. The registrations stay,
    /// owned by no slot; the caller keeps the returned parked port (and
    /// the image's length) for the restore.
    pub fn save(&self, port: u16, key: u32, offset: u64, room: u64) -> Result<(ParkedPort, u64), Errno> {
        self.running()?;
        let gen = self.sram.u32(self.layout.port(port).ctl(ctl::GEN)) as u16;
        ctx_result(self.admin(AdminOp::PortSave, [port as u64, key as u64, offset, room, 0, 0])?)?;
        let mut len = [0u8; 4];
        let len = self.read_region(port, key, offset + 8, &mut len).map(|_| u32::from_le_bytes(len) as u64);
        let state = self.ports.lock().expect("ports")[port as usize].take().expect("a saved port was attached");
        self.parked_addrs.lock().expect("parked").push(state.addr);
        self.ports_changed.store(true, Ordering::Release);
        self.move_mrs(&state.keys, port, PARKED_OWNER);
        let parked = ParkedPort { addr: state.addr, gen, state };
        match len {
            Ok(len) => Ok((parked, len)),
            Err(e) => {
                self.discard(parked);
                Err(e)
            }
        }
    }

    /// C7: restores parked `p` from its region `key` at `offset` (`len`
    /// bytes) into a free slot, suspended; returns the slot. When refused,
    /// `p` stays parked and comes back with the error.
    pub fn restore(&self, p: ParkedPort, key: u32, offset: u64, len: u64) -> Result<u16, (ParkedPort, Errno)> {
        self.restore_into(p, key, offset, len, None)
    }

    /// [`NicShared::restore`] into slot `want` if given (`EBUSY` if it is
    /// taken), else into any free slot.
    fn restore_into(
        &self,
        p: ParkedPort,
        key: u32,
        offset: u64,
        len: u64,
        want: Option<u16>,
    ) -> Result<u16, (ParkedPort, Errno)> {
        if let Err(e) = self.running() {
            return Err((p, e));
        }
        let ParkedPort { addr, gen, mut state } = p;
        let (keys, id) = (state.keys.clone(), state.id);
        // The slot is taken (with the port's eventfds) before the NIC is
        // asked, so no other process can be given it meanwhile.
        let slot = {
            let mut ports = self.ports.lock().expect("ports");
            let free = match want {
                Some(w) => ports.get(w as usize).is_some_and(|s| s.is_none()).then_some(w as usize),
                None => ports.iter().position(|s| s.is_none()),
            };
            let Some(slot) = free else {
                return Err((ParkedPort { addr, gen, state }, libc::EBUSY));
            };
            state.started = true;
            ports[slot] = Some(state);
            slot as u16
        };
        self.move_mrs(&keys, PARKED_OWNER, slot);
        self.move_groups(id, slot);
        let r = self
            .admin(AdminOp::PortRestore, [slot as u64, key as u64, offset, len, addr as u64 | (gen as u64) << 16, 0]);
        match r.and_then(ctx_result) {
            Ok(()) => {
                self.unpark_addr(addr);
                self.ports_changed.store(true, Ordering::Release);
                signal(self.wake.as_raw_fd());
                Ok(slot)
            }
            Err(e) => {
                self.move_mrs(&keys, slot, PARKED_OWNER);
                let state = self.ports.lock().expect("ports")[slot as usize].take().expect("reserved above");
                Err((ParkedPort { addr, gen, state }, e))
            }
        }
    }

    /// A parked port's process went away: the NIC forgets the context and
    /// its registrations go.
    pub fn discard(&self, p: ParkedPort) {
        let _ = self.admin(AdminOp::PortDiscard, [p.addr as u64 | (p.gen as u64) << 16, 0, 0, 0, 0, 0]);
        self.unpark_addr(p.addr);
        self.free_groups_of(p.state.id);
        for &k in &p.state.keys {
            let _ = self.dereg(PARKED_OWNER, k);
        }
    }

    /// The slots process `pid` holds a started port in (one merely
    /// attached has no NIC state to switch).
    fn slots_of(&self, pid: i32) -> Vec<u16> {
        let ports = self.ports.lock().expect("ports");
        (0..ports.len() as u16)
            .filter(|&p| ports[p as usize].as_ref().is_some_and(|s| s.pid == pid && s.started))
            .collect()
    }

    /// How many started ports process `pid` holds.
    pub fn gang_ports(&self, pid: i32) -> usize {
        self.slots_of(pid).len()
    }

    /// Gang C1 on every port of `pid`; returns how many.
    pub fn gang_suspend(&self, pid: i32) -> Result<usize, Errno> {
        let slots = self.slots_of(pid);
        for &p in &slots {
            self.suspend(p)?;
        }
        Ok(slots.len())
    }

    /// Gang C8 on every port of `pid`; returns how many.
    pub fn gang_resume(&self, pid: i32) -> Result<usize, Errno> {
        let slots = self.slots_of(pid);
        for &p in &slots {
            self.resume(p)?;
        }
        Ok(slots.len())
    }

    /// Gang C2–C4: (ports of `pid`, how many of them are stable).
    pub fn gang_stable(&self, pid: i32) -> Result<(usize, usize), Errno> {
        let slots = self.slots_of(pid);
        let mut stable = 0;
        for &p in &slots {
            stable += self.is_stable(p)? as usize;
        }
        Ok((slots.len(), stable))
    }

    /// Gang C6: saves every (stable, suspended) port of `pid` into daemon
    /// memory and frees its slot; returns how many. A port that cannot be
    /// saved stops the walk with its error; those saved stay saved.
    pub fn gang_save(&self, pid: i32) -> Result<usize, Errno> {
        let slots = self.slots_of(pid);
        let mut gang = self.gang.lock().expect("gang");
        for &slot in &slots {
            let fd = crate::sram::new_memfd("emp-gang-image", GANG_IMAGE_ROOM).map_err(|_| libc::ENOMEM)?;
            let (image_key, _) = self.reg_arena(slot, fd, 0, GANG_IMAGE_ROOM as u64, emp_uapi::desc::MR_ACCESS_ALL)?;
            match self.save(slot, image_key, 0, GANG_IMAGE_ROOM as u64) {
                Ok((parked, len)) => gang.push(GangSaved { pid, slot, image_key, len, parked }),
                Err(e) => {
                    let _ = self.dereg(slot, image_key);
                    return Err(e);
                }
            }
        }
        Ok(slots.len())
    }

    /// Gang C7: restores every saved port of `pid` into the slot it had,
    /// suspended; returns how many. One that cannot be restored stays
    /// saved and stops the walk with its error.
    pub fn gang_restore(&self, pid: i32) -> Result<usize, Errno> {
        let mut gang = self.gang.lock().expect("gang");
        let mut n = 0;
        while let Some(i) = gang.iter().position(|g| g.pid == pid) {
            let g = gang.swap_remove(i);
            match self.restore_into(g.parked, g.image_key, 0, g.len, Some(g.slot)) {
                Ok(slot) => {
                    // The image has done its work; its memory goes.
                    let _ = self.dereg(slot, g.image_key);
                    n += 1;
                }
                Err((parked, e)) => {
                    gang.push(GangSaved { parked, ..g });
                    return Err(e);
                }
            }
        }
        Ok(n)
    }

    /// The id of the port in `slot` (`PortState::id`).
    pub fn port_id(&self, slot: u16) -> Option<u64> {
        self.ports.lock().expect("ports").get(slot as usize)?.as_ref().map(|s| s.id)
    }

    /// Is port `id` switched out by the gang scheduler?
    pub fn gang_holds(&self, id: u64) -> bool {
        self.gang.lock().expect("gang").iter().any(|g| g.parked.state.id == id)
    }

    /// The connection that held port `id` (last in `slot`) closed:
    /// releases the port, or discards its context if it is switched out
    /// (the slot may then belong to another port, which keeps it).
    pub fn release_port_of(&self, id: u64, slot: u16) {
        let saved = {
            let mut gang = self.gang.lock().expect("gang");
            gang.iter().position(|g| g.parked.state.id == id).map(|i| gang.swap_remove(i))
        };
        match saved {
            Some(g) => self.discard(g.parked),
            None => {
                if self.port_id(slot) == Some(id) {
                    self.release_port(slot);
                }
            }
        }
    }

    /// Frees the group table slots of port `id` (it closed, or its saved
    /// context was discarded).
    fn free_groups_of(&self, id: u64) {
        for g in self.groups.lock().expect("groups").iter_mut() {
            if g.is_some_and(|(p, _)| p == id) {
                *g = None;
            }
        }
    }

    /// Points the group entries of port `id` at slot `to` (a context
    /// restored into another slot: the NIC loads them again from here).
    fn move_groups(&self, id: u64, to: u16) {
        let heads: Vec<usize> = {
            let groups = self.groups.lock().expect("groups");
            // A group's slots are one run; its entry is in the first.
            (0..groups.len())
                .filter(|&s| groups[s].is_some_and(|(p, _)| p == id) && (s == 0 || groups[s - 1] != groups[s]))
                .collect()
        };
        for s in heads {
            let mut b = [0u8; GroupEntry::SIZE];
            self.sram.read(self.layout.group_entry(s), &mut b);
            let mut e = GroupEntry::get(&b);
            e.port = to;
            e.put(&mut b);
            self.sram.write(self.layout.group_entry(s), &b);
        }
    }

    fn unpark_addr(&self, addr: u16) {
        let mut parked = self.parked_addrs.lock().expect("parked");
        if let Some(i) = parked.iter().position(|&a| a == addr) {
            parked.swap_remove(i);
        }
    }

    /// Gives the MR entries of `keys` owned by `from` to `to`, fencing each.
    fn move_mrs(&self, keys: &[u32], from: u16, to: u16) {
        for &k in keys {
            let Ok((slot, mut e)) = self.port_mr(from, k) else { continue };
            e.port = to;
            let mut b = [0u8; MrEntry::SIZE];
            e.put(&mut b);
            self.sram.write(self.layout.mr_entry(slot), &b);
            let _ = self.admin(AdminOp::MrFence, [slot as u64, 0, 0, 0, 0, 0]);
        }
    }

    /// Releases a port: closes it on the NIC (flushing its work), then
    /// deregisters everything it registered.
    pub fn release_port(&self, port: u16) {
        let (started, keys, id) = match self.ports.lock().expect("ports").get(port as usize).and_then(|p| p.as_ref()) {
            Some(ps) => (ps.started, ps.keys.clone(), ps.id),
            None => return,
        };
        if started {
            let _ = self.admin(AdminOp::PortClose, [port as u64, 0, 0, 0, 0, 0]);
        }
        self.free_groups_of(id);
        for k in keys {
            let _ = self.dereg(port, k);
        }
        self.ports.lock().expect("ports")[port as usize] = None;
        self.ports_changed.store(true, Ordering::Release);
        signal(self.wake.as_raw_fd());
    }

    /// The valid MR entry `key` of `port`, and its slot (`ENOENT` otherwise).
    fn port_mr(&self, port: u16, key: u32) -> Result<(usize, MrEntry), Errno> {
        let slot = MrEntry::slot_of(key);
        if slot >= self.layout.params.mr_entries as usize {
            return Err(libc::ENOENT);
        }
        let mut b = [0u8; MrEntry::SIZE];
        self.sram.read(self.layout.mr_entry(slot), &mut b);
        let e = MrEntry::get(&b);
        if e.key != key || e.port != port || e.format == MrFormat::Invalid as u8 {
            return Err(libc::ENOENT);
        }
        Ok((slot, e))
    }

    /// Reads `buf.len()` bytes at `offset` of region `key`, which must be `port`'s.
    fn read_region(&self, port: u16, key: u32, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let (_, e) = self.port_mr(port, key)?;
        if e.format != MrFormat::Chained as u8 {
            return Err(libc::ENOENT);
        }
        if offset.checked_add(buf.len() as u64).is_none_or(|end| end > e.length) {
            return Err(libc::EINVAL);
        }
        let dma = self.dma.read().expect("dma");
        let (mut at, mut done) = (0u64, 0usize);
        for seg in e.segs.iter().take_while(|s| s.len > 0) {
            let (lo, hi) = (at, at + seg.len as u64);
            let want = offset + done as u64;
            if done < buf.len() && want < hi {
                let n = ((hi - want) as usize).min(buf.len() - done);
                dma.read(seg.addr + (want - lo), &mut buf[done..done + n]).map_err(|_| libc::EFAULT)?;
                done += n;
            }
            at = hi;
        }
        if done == buf.len() {
            Ok(())
        } else {
            Err(libc::EFAULT)
        }
    }

    /// Loads the group encoded at (`key`, `offset`) of `port`'s memory:
    /// its entry and, for a group of more than 64 members, the body right
    /// after it (`GroupEntry::body_len` bytes). It is checked (the caller
    /// is the member at its rank, the trees are trees) and written to
    /// `GroupEntry::span` consecutive free slots; the same (port, id) reuses
    /// its slots where the new span fits (a re-creation must bring a newer
    /// epoch). Returns the first slot.
    pub fn set_group(&self, port: u16, key: u32, offset: u64) -> Result<u32, Errno> {
        self.running()?;
        let mut head = [0u8; GroupEntry::SIZE];
        self.read_region(port, key, offset, &mut head)?;
        let mut e = GroupEntry::decode(&head).map_err(|_| libc::EINVAL)?;
        let (owner, addr) = {
            let ports = self.ports.lock().expect("ports");
            let ps = ports.get(port as usize).and_then(|p| p.as_ref()).ok_or(libc::EINVAL)?;
            (ps.id, ps.addr)
        };
        let span = e.span();
        let table = self.layout.params.group_entries as usize;
        if span > table {
            tracing::info!(node = self.node, port, span, table, "group larger than the group table");
            return Err(if e.member_count as usize > emp_uapi::coll::GROUP_MEMBERS_MAX {
                libc::EINVAL
            } else {
                libc::ENOSPC
            });
        }
        // The entry and its body, padded with zeros to whole slots.
        let mut encoded = vec![0u8; span * GroupEntry::SIZE];
        let body_len = e.body_len();
        if body_len > 0 {
            let body_at = offset.checked_add(GroupEntry::SIZE as u64).ok_or(libc::EFAULT)?;
            self.read_region(port, key, body_at, &mut encoded[GroupEntry::SIZE..GroupEntry::SIZE + body_len])?;
        }
        // The caller is the member at its rank under its wire address (peers
        // address it so); the entry the NIC loads names its slot.
        e.port = addr;
        let caller = (self.node as u32) << 16 | addr as u32;
        if let Err(why) = (GroupView { entry: &e, body: &encoded[GroupEntry::SIZE..] }).check(caller) {
            tracing::info!(node = self.node, port, reason = why.as_str(), "group entry refused");
            return Err(libc::EINVAL);
        }
        e.port = port;
        let me = Some((owner, e.group_id));
        let (slot, before) = {
            let mut groups = self.groups.lock().expect("groups");
            let before: Vec<usize> = (0..table).filter(|&s| groups[s] == me).collect();
            let fits = |s: usize| s + span <= table && groups[s..s + span].iter().all(|g| g.is_none() || *g == me);
            let slot = before.first().copied().filter(|&s| fits(s)).or_else(|| (0..table).find(|&s| fits(s)));
            let slot = slot.ok_or(libc::ENOSPC)?;
            groups[slot..slot + span].fill(me);
            (slot, before)
        };
        e.put(&mut encoded[..GroupEntry::SIZE]);
        self.sram.write(self.layout.group_entry(slot), &encoded);
        let result = self.admin(AdminOp::GroupSet, [slot as u64, 0, 0, 0, 0, 0]);
        let ok = matches!(result, Ok(admin_result::OK));
        let mut groups = self.groups.lock().expect("groups");
        let run = slot..slot + span;
        for s in 0..table {
            // Success: the group's old slots outside the new run are free.
            // Failure: the NIC kept what the slots held (nothing, or the
            // older epoch of the same group, which stays usable).
            let release =
                if ok { before.contains(&s) && !run.contains(&s) } else { run.contains(&s) && !before.contains(&s) };
            if release {
                groups[s] = None;
            }
        }
        match result {
            Ok(admin_result::OK) => Ok(slot as u32),
            Err(_) => Err(libc::ETIMEDOUT),
            Ok(_) => Err(libc::EINVAL),
        }
    }

    /// Retires the group whose first slot is `slot` of `port` (and frees
    /// every slot it spans).
    pub fn clear_group(&self, port: u16, slot: u64) -> Result<(), Errno> {
        let s = usize::try_from(slot).map_err(|_| libc::EINVAL)?;
        let id = self.port_id(port).ok_or(libc::ENOENT)?;
        let owner = {
            let groups = self.groups.lock().expect("groups");
            let owner = groups.get(s).copied().flatten().filter(|&(p, _)| p == id).ok_or(libc::ENOENT)?;
            // Only a group's first slot names it.
            if groups.iter().position(|g| *g == Some(owner)) != Some(s) {
                return Err(libc::ENOENT);
            }
            owner
        };
        let r = self.admin(AdminOp::GroupClear, [slot, 0, 0, 0, 0, 0]);
        for g in self.groups.lock().expect("groups").iter_mut().filter(|g| **g == Some(owner)) {
            *g = None;
        }
        match r? {
            admin_result::OK => Ok(()),
            _ => Err(libc::ENOENT),
        }
    }

    /// MR slots in use.
    pub fn mrs_in_use(&self) -> usize {
        self.layout.params.mr_entries as usize - self.mr_free.lock().expect("mr").len()
    }

    /// Raises interrupt `vector` (≥ 1): port `vector - 1`'s eventfd, or a
    /// guest's MSI-X vector.
    pub(crate) fn raise_interrupt(&self, vector: u16) {
        {
            let ports = self.ports.lock().expect("ports");
            if let Some(Some(p)) = ports.get(vector as usize - 1) {
                // Under the lock: `release_port` cannot close the eventfd meanwhile.
                signal(p.event.as_raw_fd());
                return;
            }
        } // `ports` released: it is never held while taking `guest_irq` (see `NicShared`).
        if let Some(irq) = &*self.guest_irq.lock().expect("guest_irq") {
            // A guest's port: one MSI-X vector; the guest's driver finds the
            // port(s) whose armed event the control program consumed.
            signal(irq.as_raw_fd());
        }
    }

    /// NIC counters from SRAM.
    pub fn counters(&self) -> [u64; emp_uapi::sram::counter::COUNT] {
        self.header().counters
    }
}

/// How long an admin request polls for its answer before sleeping between polls.
const ADMIN_SPIN: Duration = Duration::from_micros(200);

/// Where a NIC's SRAM lives.
pub enum SramBacking<'a> {
    /// Private memfds (direct attach).
    Memfd,
    /// A file QEMU maps as a guest's BAR2.
    File(&'a std::path::Path),
}

/// Builds a NIC in RESET: SRAM with its header and routes, no firmware.
pub fn power_on(cfg: &NicConfig, backing: SramBacking<'_>) -> std::io::Result<Arc<NicShared>> {
    let layout = Layout::new(cfg.layout).map_err(|e| std::io::Error::other(format!("layout: {e}")))?;
    let sram = match backing {
        SramBacking::Memfd => Sram::new(&layout)?,
        SramBacking::File(p) => Sram::from_file(p, &layout)?,
    };
    let mut hb = [0u8; SramHeader::SIZE];
    layout.header(cfg.node, cfg.mtu, cfg.features).put(&mut hb);
    sram.write(0, &hb);
    for n in 0..cfg.nodes.min(layout.params.route_entries as u16) {
        let r: RouteEntry = cfg.routes.entry(n);
        let mut b = [0u8; RouteEntry::SIZE];
        r.put(&mut b);
        sram.write(layout.route_entry(n as usize), &b);
    }
    Ok(Arc::new(NicShared {
        node: cfg.node,
        layout,
        sram,
        dma: RwLock::new(DmaMap::new(layout.params.mr_entries as usize)),
        ports: Mutex::new((0..layout.params.ports).map(|_| None).collect()),
        mr_free: Mutex::new((0..layout.params.mr_entries as u16).rev().collect()),
        admin: Mutex::new(()),
        wake: eventfd(libc::EFD_NONBLOCK)?,
        ports_changed: AtomicBool::new(true),
        parked_addrs: Mutex::new(Vec::new()),
        gang: Mutex::new(Vec::new()),
        next_port_id: std::sync::atomic::AtomicU64::new(1),
        key_salt: Mutex::new(cfg.node as u32 ^ std::process::id() ^ 0x5EED),
        groups: Mutex::new(vec![None; layout.params.group_entries as usize]),

        msg_max: 1 << 30,
        cpus: cfg.cpus.max(1),
        guest_irq: Mutex::new(None),
        busy: BusyClock::default(),
    }))
}

impl NicShared {
    pub(crate) fn set_status(&self, st: NicStatus, r: FailReason) {
        self.sram.put_u32(core::mem::offset_of!(SramHeader, fail_reason), r as u32);
        self.sram.put_u32(core::mem::offset_of!(SramHeader, status), st as u32);
    }

    /// What the driver does: writes `image` into the staging area and sets
    /// status LOADING (the NIC then verifies and starts it).
    pub fn stage(&self, image: &[u8]) -> Result<(), FailReason> {
        if image.len() > self.layout.params.staging_size as usize {
            self.set_status(NicStatus::Failed, FailReason::BadImageHeader);
            return Err(FailReason::BadImageHeader);
        }
        self.sram.write(self.layout.staging_off as usize, image);
        self.sram.put_u32(core::mem::offset_of!(SramHeader, staged_len), image.len() as u32);
        self.set_status(NicStatus::Loading, FailReason::None);
        Ok(())
    }

    /// True when a driver asked the NIC to start a staged image.
    pub fn loading(&self) -> bool {
        self.status().0 == NicStatus::Loading
    }
}
