//! The NIC's CPUs on host threads (EMP thesis ch. 3; docs/nic-cpus.md).
//!
//! The control program splits its steps over CPU A (0) and CPU B (1) by the
//! plan it booted with, and queues a step that belongs to the other CPU in
//! that CPU's queue (`firmware/src/cpu.rs`). Here each CPU of a NIC is a
//! host thread: CPU A is the engine's thread (doorbells, timers, the wire),
//! CPU B a thread of its own that runs B's queue and, when the plan
//! classifies frames on B (DSR), the received frames. Like the Tigon2's two
//! CPUs they share the control program's records: each side of the
//! program (send, receive) has a lock (`Core::side_locks`) a CPU holds
//! while it runs that side's entry points alone, what both sides write is
//! taken through the program's own semaphore per access, and the whole
//! program (`Core::program`, then both sides' locks) admits one CPU at a
//! time to everything. What a CPU owns alone is its hardware context (its
//! transmit outbox and frame buffers) and its jobs: data movement the other CPU queued in the
//! program's common area (a frame's headers and the host memory its payload
//! is read from, a received payload and where it goes, an ACK, a receive's
//! completion in the CQ slot the program took for it), which a CPU
//! thread runs **without** the lock, beside the other CPU's steps
//! (`firmware/src/cpu.rs`). Hand-offs between CPUs go through bounded
//! areas: the jobs, the frames waiting for CPU B, the frames CPU B
//! transmitted for the engine to put on the wire, spare frame buffers, and
//! a per-CPU "work waiting" flag.
//!
//! Where the machine has fewer cores than CPUs, an image lacks the
//! entry points this needs, or the plan uses one CPU, the CPUs are
//! multiplexed on the engine's thread: after every call it runs each CPU's
//! queue in turn, as the simulator does.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use core::ffi::c_void;

use emp_uapi::fwabi::{self, FwHal};
use emp_uapi::sram::ctl;

use crate::dmaq::WriteBehind;
use crate::fwlib::{AreaFns, FwLib, SideFns};
use crate::hw::{hal_for, HwCtx, Outgoing};
use crate::nic::NicShared;
use crate::sys::signal;

/// The most CPUs a NIC has: the plans split the program over two.
pub const CPUS_MAX: u32 = 2;

/// Frames waiting for a frame CPU other than A; beyond, the MAC drops them
/// (the protocol retransmits), as a full receive ring does.
const RX_MAX: usize = 1024;
/// Frames a CPU other than A transmitted, waiting for the engine's wire.
const TX_MAX: usize = 4096;
/// Received frames a CPU takes per turn.
const RX_BATCH: usize = 256;
/// Spare frame buffers kept between the CPUs.
const SPARE_MAX: usize = 1024;
/// A CPU's own spare buffers: it gives the rest back, and takes some when
/// it runs low.
const POOL_HIGH: usize = 64;
const POOL_LOW: usize = 8;
/// Multicast filter changes queued by CPUs other than A.
const MEMBERSHIP_MAX: usize = 1024;
/// A CPU thread polls this long after its last work before parking.
const SPIN: Duration = Duration::from_micros(50);

/// The control program's state: only touched with [`Core::program`] held.
struct Program(*mut c_void);

// SAFETY: the pointer is the control program's state, used by whichever
// thread holds the `Mutex<Program>`, never by two at once.
unsafe impl Send for Program {}

/// The program's common area of its CPUs (`emp_fw_cpu_area`): reached
/// without the program's lock, by its own entry points.
struct Area {
    fns: AreaFns,
    ptr: *const c_void,
}

// SAFETY: the area is the program's `Sync` common area (its rings and
// runners synchronise themselves); the reference is released once, in
// `Core`'s drop.
unsafe impl Send for Area {}
// SAFETY: as above.
unsafe impl Sync for Area {}

/// The program's state for the sides' entry points, which run holding one
/// side's lock (`Core::side_locks`) and not `Core::program`.
struct SideState(*mut c_void);

// SAFETY: used only by the sides' entry points, each called holding its
// side's lock; the firmware's contract lets the two sides run at once,
// and a whole-program call holds both locks.
unsafe impl Send for SideState {}
// SAFETY: as above.
unsafe impl Sync for SideState {}

/// `Core::side_locks`' indices.
const SEND_SIDE: usize = 0;
const RECV_SIDE: usize = 1;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic of another CPU's thread is already reported; keep serving.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes `m`; when another CPU holds it, counts the wait in `waits` and
/// its length in `wait_ns`.
fn take<'m, T>(m: &'m Mutex<T>, waits: &AtomicU64, wait_ns: &AtomicU64) -> MutexGuard<'m, T> {
    match m.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => {
            let began = Instant::now();
            let g = lock(m);
            waits.fetch_add(1, Ordering::Relaxed);
            wait_ns.fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
            g
        }
    }
}

/// One NIC's running control program and what its CPUs share.
pub(crate) struct Core {
    pub(crate) lib: Arc<FwLib>,
    nic: Arc<NicShared>,
    /// The whole program: the CPU holding it (and both sides' locks) runs
    /// any of the control program's entry points.
    program: Mutex<Program>,
    /// Threaded, and the image has the sides' entry points: a doorbell and
    /// received frames go to the sides first, each holding only its own
    /// side's lock (send, receive), beside the other.
    sides: Option<(SideFns, SideState)>,
    /// The send side's and the receive side's locks. Lock order: program,
    /// send side, receive side; a side's entry point holds only its own,
    /// and takes nothing else while it does.
    side_locks: [Mutex<()>; 2],
    /// CPUs in the plan.
    cpus: u32,
    /// The CPU received frames are handed to.
    frame_cpu: u32,
    /// CPUs past A have threads of their own.
    threaded: bool,
    /// Threaded, and the program has a common area: CPUs past A run their
    /// jobs without the program's lock.
    area: Option<Area>,
    /// Per CPU: steps or frames wait for it.
    wanted: [AtomicBool; CPUS_MAX as usize],
    /// Frames or filter changes other CPUs handed to the engine wait in
    /// `tx` and `memberships`.
    handed: AtomicBool,
    /// Frames for `frame_cpu` when it is not A.
    rx: Mutex<VecDeque<Vec<u8>>>,
    /// Frames other CPUs transmitted, for the engine's wire.
    tx: Mutex<Vec<Outgoing>>,
    memberships: Mutex<Vec<(u16, bool)>>,
    spare: Mutex<Vec<Vec<u8>>>,
    /// The program's next timer deadline (ns on the engine's clock).
    deadline: AtomicU64,
    /// The engine's clock at `created` (set on its first call): the other
    /// CPUs' `now` is the same clock.
    clock_base: OnceLock<u64>,
    created: Instant,
    stop: AtomicBool,
    threads: OnceLock<Vec<Thread>>,
    /// Receive double buffering: the NIC's DMA thread, shared by its CPUs.
    write_behind: OnceLock<Arc<Mutex<WriteBehind>>>,
    /// Jobs CPUs past A ran without the program, and the times they took
    /// it (`describe`: how much of their work ran beside CPU A's).
    jobs_unlocked: AtomicU64,
    program_calls: AtomicU64,
    /// Per CPU: the times it found the program taken by another CPU, and
    /// how long it waited for it in all (ns).
    program_waits: [AtomicU64; CPUS_MAX as usize],
    program_wait_ns: [AtomicU64; CPUS_MAX as usize],
    /// Calls of the sides' entry points per CPU, and those that left work
    /// to the whole program.
    side_calls: [AtomicU64; CPUS_MAX as usize],
    side_stops: [AtomicU64; CPUS_MAX as usize],
    /// Per CPU: the times it found a side's lock taken, and how long it
    /// waited for it in all (ns).
    side_waits: [AtomicU64; CPUS_MAX as usize],
    side_wait_ns: [AtomicU64; CPUS_MAX as usize],
    /// Frames dropped because an area was full.
    pub(crate) dropped_rx: AtomicU64,
    pub(crate) dropped_tx: AtomicU64,
}

impl Core {
    /// Wraps a booted program; `want_cpus` is the NIC's configured CPUs.
    pub(crate) fn new(lib: Arc<FwLib>, nic: Arc<NicShared>, state: *mut c_void) -> Core {
        // SAFETY: `state` was just returned by boot and is live.
        let cpus = unsafe { (lib.cpus)(state) }.clamp(1, CPUS_MAX);
        // SAFETY: as above.
        let frame_cpu = lib.frame_cpu.map_or(0, |f| unsafe { f(state) }).min(cpus - 1);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threaded = nic.cpus >= 2 && cpus >= 2 && lib.cpu_pending.is_some() && lib.frame_cpu.is_some() && cores >= 2;
        if nic.cpus >= 2 && cpus >= 2 && !threaded {
            tracing::info!(node = nic.node, cores, "NIC CPUs multiplexed on the engine thread");
        }
        let area = lib.area.filter(|_| threaded).map(|fns| Area {
            fns,
            // SAFETY: `state` is live; nothing else calls into it yet.
            ptr: unsafe { (fns.area)(state) },
        });
        let sides = lib.sides.filter(|_| threaded).map(|s| (s, SideState(state)));
        Core {
            lib,
            nic,
            program: Mutex::new(Program(state)),
            sides,
            side_locks: Default::default(),
            cpus,
            frame_cpu,
            threaded,
            area,
            wanted: Default::default(),
            handed: AtomicBool::new(false),
            rx: Mutex::new(VecDeque::with_capacity(RX_MAX)),
            tx: Mutex::new(Vec::new()),
            memberships: Mutex::new(Vec::new()),
            spare: Mutex::new(Vec::new()),
            deadline: AtomicU64::new(u64::MAX),
            clock_base: OnceLock::new(),
            created: Instant::now(),
            stop: AtomicBool::new(false),
            threads: OnceLock::new(),
            write_behind: OnceLock::new(),
            jobs_unlocked: AtomicU64::new(0),
            program_calls: AtomicU64::new(0),
            program_waits: Default::default(),
            program_wait_ns: Default::default(),
            side_calls: Default::default(),
            side_stops: Default::default(),
            side_waits: Default::default(),
            side_wait_ns: Default::default(),
            dropped_rx: AtomicU64::new(0),
            dropped_tx: AtomicU64::new(0),
        }
    }

    pub(crate) fn threaded(&self) -> bool {
        self.threaded
    }

    /// Received frames go to another CPU's thread.
    pub(crate) fn frames_elsewhere(&self) -> bool {
        self.threaded && self.frame_cpu != 0
    }

    /// The next deadline, or 0 when CPU A (the engine) has work waiting.
    pub(crate) fn deadline(&self) -> u64 {
        if self.wanted[0].load(Ordering::Acquire) {
            0
        } else if let Some((s, st)) = &self.sides {
            // What every store last published: sides run while others
            // call, so no one call's view is the latest.
            // SAFETY: live state; the entry point takes no lock.
            unsafe { (s.deadline)(st.0) }
        } else {
            self.deadline.load(Ordering::Acquire)
        }
    }

    /// The engine's clock now, for a CPU that is not the engine.
    fn now(&self) -> u64 {
        self.clock_base.get().copied().unwrap_or(0) + self.created.elapsed().as_nanos() as u64
    }

    /// Runs `f` on the program as CPU `cpu` with `hw`, then that CPU's
    /// queue; wakes the CPUs whose queues it filled.
    pub(crate) fn call(&self, cpu: u32, hw: &mut HwCtx, now: u64, f: impl FnOnce(&FwLib, *mut c_void, &FwHal)) {
        if cpu == 0 {
            self.clock_base.get_or_init(|| now.saturating_sub(self.created.elapsed().as_nanos() as u64));
            self.wanted[0].store(false, Ordering::Release);
        }
        debug_assert!(Arc::ptr_eq(&self.nic, hw.shared()), "a CPU's hardware is its NIC's");
        // The DMA map locked once for the call rather than per DMA (lock
        // order: program, then DMA map; nothing holding the map waits for
        // the program).
        let c = cpu as usize;
        // Another CPU holds the program, or runs a side: counted, for the
        // table dump.
        let prog = take(&self.program, &self.program_waits[c], &self.program_wait_ns[c]);
        let sides = self
            .sides
            .as_ref()
            .map(|_| self.side_locks.each_ref().map(|l| take(l, &self.side_waits[c], &self.side_wait_ns[c])));
        let dma = (!hw.writes_behind()).then(|| self.nic.dma.read().expect("dma"));
        if let Some(d) = &dma {
            hw.hold_dma(d);
        }
        let hal = hal_for(hw);
        let before = self.deadline.load(Ordering::Relaxed);
        f(&self.lib, prog.0, &hal);
        let mut others = [false; CPUS_MAX as usize];
        if self.threaded {
            // SAFETY: live state, valid hal, the lock is held.
            while unsafe { (self.lib.cpu)(prog.0, &hal, now, cpu) } > 0 {}
            let pending = self.lib.cpu_pending.expect("threaded needs it");
            for (c, other) in others.iter_mut().enumerate().take(self.cpus as usize) {
                // SAFETY: as above.
                *other = c as u32 != cpu && unsafe { pending(prog.0, c as u32) } > 0;
            }
        } else if self.cpus > 1 {
            // One CPU queues nothing for another: its plan runs every step
            // in place.
            loop {
                let mut ran = 0;
                for c in 0..self.cpus {
                    // SAFETY: as above.
                    ran += unsafe { (self.lib.cpu)(prog.0, &hal, now, c) };
                }
                if ran == 0 {
                    break;
                }
            }
        }
        // SAFETY: live state, the lock is held.
        let deadline = unsafe { (self.lib.poll_timeout)(prog.0) };
        self.deadline.store(deadline, Ordering::Release);
        hw.release_dma();
        drop(dma);
        drop(sides);
        drop(prog);
        if cpu != 0 && deadline < before {
            // The engine may be asleep until the old deadline.
            others[0] = true;
        }
        for (c, _) in others.iter().enumerate().filter(|(_, &o)| o) {
            self.want(c as u32);
        }
    }

    /// A doorbell as CPU `cpu`: on the receive side, then the send side,
    /// each alone holding its own side's lock, where the image and threads
    /// allow; the whole program when either stops.
    pub(crate) fn doorbell(&self, cpu: u32, hw: &mut HwCtx, now: u64) {
        if self.sides.is_some() {
            // SAFETY: live state, valid hal; `side_call` holds the side.
            let r = self.side_call(cpu, RECV_SIDE, hw, now, |s, st, hal| unsafe { (s.recv_doorbell)(st, hal, now) });
            if r & fwabi::SIDE_WHOLE == 0 {
                // SAFETY: as above.
                let r =
                    self.side_call(cpu, SEND_SIDE, hw, now, |s, st, hal| unsafe { (s.send_doorbell)(st, hal, now) });
                if r & fwabi::SIDE_WHOLE == 0 {
                    return;
                }
            }
            self.side_stops[cpu as usize].fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: live state under the lock, valid hal.
        self.call(cpu, hw, now, |lib, st, hal| unsafe { (lib.doorbell)(st, hal, now) });
    }

    /// Timers due, or work waiting for CPU A (`deadline()` said 0): CPU A's
    /// queue and the send side's timers on the send side alone first, then
    /// the receive side's due ACKs on the receive side alone, where the
    /// image and threads allow; the whole program when either stops or
    /// another timer is due.
    pub(crate) fn timeout(&self, hw: &mut HwCtx, now: u64) {
        if let Some((s, st)) = &self.sides {
            self.wanted[0].store(false, Ordering::Release);
            // SAFETY: live state, valid hal; `side_call` holds the send side.
            let r = self.side_call(0, SEND_SIDE, hw, now, |s, st, hal| unsafe { (s.send_cpu)(st, hal, now, 0) });
            // The receive side's due ACKs (and rings).
            // SAFETY: as above, the receive side held.
            let r = r | self.side_call(0, RECV_SIDE, hw, now, |s, st, hal| unsafe { (s.recv_doorbell)(st, hal, now) });
            // SAFETY: live state; the entry point takes no lock.
            let due = unsafe { (s.deadline)(st.0) } <= now;
            if r & fwabi::SIDE_WHOLE == 0 && !due {
                return;
            }
            if r & fwabi::SIDE_WHOLE != 0 {
                self.side_stops[0].fetch_add(1, Ordering::Relaxed);
            }
        }
        // SAFETY: live state under the lock, valid hal.
        self.call(0, hw, now, |lib, st, hal| unsafe { (lib.timeout)(st, hal, now) });
    }

    /// Received `frames` as CPU `cpu`: on the receive side alone (holding
    /// its lock) where the image and threads allow, then the whole program
    /// for those it left.
    pub(crate) fn frames(&self, cpu: u32, hw: &mut HwCtx, now: u64, frames: &[Vec<u8>]) {
        let mut from = 0;
        if self.sides.is_some() {
            let mut taken = 0;
            let r = self.side_call(cpu, RECV_SIDE, hw, now, |s, st, hal| {
                // SAFETY: live state, valid hal; `side_call` holds the
                // receive side.
                let (n, r) = unsafe { s.recv_frames(st, hal, now, frames) };
                taken = n;
                r
            });
            if r & fwabi::SIDE_WHOLE == 0 {
                return;
            }
            self.side_stops[cpu as usize].fetch_add(1, Ordering::Relaxed);
            from = taken;
        }
        self.program_calls.fetch_add(u64::from(cpu != 0), Ordering::Relaxed);
        self.call(cpu, hw, now, |lib, state, hal| {
            // SAFETY: live state under the lock, valid hal.
            unsafe { lib.frames(state, hal, now, &frames[from..]) };
        });
    }

    /// Runs `f`, a side's entry point, as CPU `cpu` holding only side
    /// `side`'s lock; wakes the CPUs it queued steps for, and the engine
    /// if the next deadline moved earlier. Returns `f`'s result.
    fn side_call(
        &self,
        cpu: u32,
        side: usize,
        hw: &mut HwCtx,
        now: u64,
        f: impl FnOnce(&SideFns, *mut c_void, &FwHal) -> u32,
    ) -> u32 {
        let (s, st) = self.sides.as_ref().expect("sides on");
        let c = cpu as usize;
        if cpu == 0 {
            self.clock_base.get_or_init(|| now.saturating_sub(self.created.elapsed().as_nanos() as u64));
        }
        let held = take(&self.side_locks[side], &self.side_waits[c], &self.side_wait_ns[c]);
        let dma = (!hw.writes_behind()).then(|| self.nic.dma.read().expect("dma"));
        if let Some(d) = &dma {
            hw.hold_dma(d);
        }
        let hal = hal_for(hw);
        // SAFETY: live state; the entry point takes no lock.
        let before = unsafe { (s.deadline)(st.0) };
        let r = f(s, st.0, &hal);
        // SAFETY: as above.
        let after = unsafe { (s.deadline)(st.0) };
        hw.release_dma();
        drop(dma);
        drop(held);
        self.side_calls[c].fetch_add(1, Ordering::Relaxed);
        let mut wake = r >> fwabi::SIDE_WAKE_SHIFT;
        if cpu != 0 && after < before {
            // The engine may be asleep until the old deadline.
            wake |= 1;
        }
        for other in (0..self.cpus).filter(|&o| wake & (1 << o) != 0) {
            if other == cpu {
                self.wanted[c].store(true, Ordering::Release);
            } else {
                self.want(other);
            }
        }
        r
    }

    /// Tells CPU `cpu` work waits for it.
    fn want(&self, cpu: u32) {
        self.wanted[cpu as usize].store(true, Ordering::SeqCst);
        self.wake(cpu);
    }

    /// Wakes CPU `cpu` if it sleeps (its flags already say why).
    fn wake(&self, cpu: u32) {
        if cpu == 0 {
            // Pairs with the engine's fence between saying it sleeps and
            // its last look at `deadline()` and `handed()`: one side sees
            // the other.
            fence(Ordering::SeqCst);
            let l = &self.nic.layout;
            if l.params.ports == 0 || self.nic.sram.u32(l.port(0).ctl(ctl::NIC_SLEEPING)) != 0 {
                signal(std::os::fd::AsRawFd::as_raw_fd(&self.nic.wake));
            }
        } else if let Some(t) = self.threads.get().and_then(|t| t.get(cpu as usize - 1)) {
            t.unpark();
        }
    }

    /// Hands the first `n` of received `frames` to the frame CPU's thread
    /// at once (MAC to CPU B), taking them out; returns how many. Those
    /// past the area's room stay in `frames`: dropped, as a full receive
    /// ring drops them (the caller keeps their buffers).
    pub(crate) fn hand_frames(&self, now: u64, frames: &mut VecDeque<Vec<u8>>, n: usize) -> usize {
        self.clock_base.get_or_init(|| now.saturating_sub(self.created.elapsed().as_nanos() as u64));
        let n = n.min(frames.len());
        let handed = {
            let mut rx = lock(&self.rx);
            let k = n.min(RX_MAX.saturating_sub(rx.len()));
            rx.extend(frames.drain(..k));
            k
        };
        if handed < n {
            self.dropped_rx.fetch_add((n - handed) as u64, Ordering::Relaxed);
        }
        if handed > 0 {
            self.want(self.frame_cpu);
        }
        handed
    }

    /// Whether other CPUs handed the engine frames or filter changes since
    /// it last took them ([`Core::take_handed`]).
    pub(crate) fn handed(&self) -> bool {
        self.handed.load(Ordering::Acquire)
    }

    /// Takes what other CPUs handed the engine into CPU A's context,
    /// without the program; false when nothing waited.
    pub(crate) fn take_handed(&self, hw: &mut HwCtx) -> bool {
        if !self.handed() || !self.handed.swap(false, Ordering::AcqRel) {
            return false;
        }
        self.collect(hw);
        true
    }

    /// Moves what other CPUs transmitted into CPU A's context, and keeps
    /// A's spare buffers within bounds.
    pub(crate) fn collect(&self, hw: &mut HwCtx) {
        if !self.threaded {
            return;
        }
        {
            let mut tx = lock(&self.tx);
            if !tx.is_empty() {
                hw.outbox.append(&mut tx);
            }
        }
        {
            let mut m = lock(&self.memberships);
            if !m.is_empty() {
                hw.memberships.append(&mut m);
            }
        }
        self.balance(&mut hw.pool);
    }

    /// Gives a CPU's surplus frame buffers to the others, or takes some.
    fn balance(&self, pool: &mut Vec<Vec<u8>>) {
        if pool.len() > POOL_HIGH {
            let mut spare = lock(&self.spare);
            let room = SPARE_MAX.saturating_sub(spare.len());
            let give = (pool.len() - POOL_HIGH / 2).min(room);
            spare.extend(pool.drain(pool.len() - give..));
        } else if pool.len() < POOL_LOW {
            let mut spare = lock(&self.spare);
            let take = spare.len().min(POOL_HIGH / 2);
            let at = spare.len() - take;
            pool.extend(spare.drain(at..));
        }
    }

    /// Describes the program's tables.
    pub(crate) fn describe(&self) -> String {
        let mut buf = vec![0u8; 64 << 10];
        let prog = lock(&self.program);
        let sides = self.sides.as_ref().map(|_| self.side_locks.each_ref().map(lock));
        // SAFETY: live state (the whole program held); `buf` is writable
        // for its length.
        let n = unsafe { (self.lib.describe)(prog.0, buf.as_mut_ptr(), buf.len()) };
        drop(sides);
        drop(prog);
        let mut s = String::from_utf8_lossy(&buf[..n.min(buf.len())]).into_owned();
        if self.threaded {
            s += &format!(
                "cpus: {} threads, frames on cpu {}, dropped rx {} tx {}, jobs without the program {}, program taken {}\n",
                self.cpus,
                self.frame_cpu,
                self.dropped_rx.load(Ordering::Relaxed),
                self.dropped_tx.load(Ordering::Relaxed),
                self.jobs_unlocked.load(Ordering::Relaxed),
                self.program_calls.load(Ordering::Relaxed),
            );
            for cpu in 0..self.cpus as usize {
                s += &format!(
                    "cpu {cpu}: program taken by another CPU {} times, waited {} us; \
                     sides' entry points {} calls, {} left work to the program; \
                     a side's lock taken by another CPU {} times, waited {} us\n",
                    self.program_waits[cpu].load(Ordering::Relaxed),
                    self.program_wait_ns[cpu].load(Ordering::Relaxed) / 1000,
                    self.side_calls[cpu].load(Ordering::Relaxed),
                    self.side_stops[cpu].load(Ordering::Relaxed),
                    self.side_waits[cpu].load(Ordering::Relaxed),
                    self.side_wait_ns[cpu].load(Ordering::Relaxed) / 1000,
                );
            }
        }
        s
    }

    /// Receive double buffering: every CPU's DMA writes go through `w`
    /// (set before [`Cpus::start`]).
    pub(crate) fn set_write_behind(&self, w: Arc<Mutex<WriteBehind>>) {
        let _ = self.write_behind.set(w);
    }

    /// Runs CPU `cpu` (≥ 1) until [`Cpus`] is dropped.
    fn cpu_thread(self: Arc<Core>, cpu: u32) {
        let mut hw = HwCtx::new(self.nic.clone());
        if let Some(w) = self.write_behind.get() {
            hw.set_write_behind(w.clone());
        }
        let mut frames: VecDeque<Vec<u8>> = VecDeque::with_capacity(RX_BATCH);
        let mut idle_since = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            let wanted = self.wanted[cpu as usize].swap(false, Ordering::AcqRel);
            if cpu == self.frame_cpu {
                let mut rx = lock(&self.rx);
                let n = rx.len().min(RX_BATCH);
                frames.extend(rx.drain(..n));
                if !rx.is_empty() {
                    // More than one batch: come back without parking.
                    self.wanted[cpu as usize].store(true, Ordering::Release);
                }
            }
            if !wanted && frames.is_empty() {
                if idle_since.elapsed() < SPIN {
                    std::thread::yield_now();
                } else {
                    std::thread::park_timeout(Duration::from_millis(100));
                }
                continue;
            }
            let began = Instant::now();
            let now = self.now();
            // Jobs first, without the program; the program only for what
            // needs it (received frames, work, failed jobs).
            if frames.is_empty() && !self.run_jobs(cpu, &mut hw) {
                self.hand_over(&mut hw);
                idle_since = Instant::now();
                self.nic.busy.add(idle_since.duration_since(began).as_nanos() as u64);
                continue;
            }
            if frames.is_empty() {
                // Its work or failed jobs: the whole program's.
                self.program_calls.fetch_add(1, Ordering::Relaxed);
                self.call(cpu, &mut hw, now, |_, _, _| {});
            } else {
                self.frames(cpu, &mut hw, now, frames.make_contiguous());
            }
            // Buffers of frames it took become its transmit buffers; the
            // surplus goes back to the other CPUs (`balance`).
            hw.pool.extend(frames.drain(..));
            if self.area.is_some() {
                // It queued jobs for itself (the payloads of the frames it
                // classified): run them next.
                self.wanted[cpu as usize].store(true, Ordering::Release);
            }
            self.hand_over(&mut hw);
            idle_since = Instant::now();
            self.nic.busy.add(idle_since.duration_since(began).as_nanos() as u64);
        }
    }

    /// Runs CPU `cpu`'s jobs without the program, if it has a common area;
    /// returns whether the CPU must take the program now.
    fn run_jobs(&self, cpu: u32, hw: &mut HwCtx) -> bool {
        let Some(a) = &self.area else { return true };
        // The DMA map is read-locked (regions change rarely): a CPU inside
        // the program holds it too.
        let dma = (!hw.writes_behind()).then(|| self.nic.dma.read().expect("dma"));
        if let Some(d) = &dma {
            hw.hold_dma(d);
        }
        let hal = hal_for(hw);
        // SAFETY: the area is live until `Core` drops; `hal` is this CPU's.
        let ran = unsafe { (a.fns.jobs)(a.ptr, &hal, cpu) };
        hw.release_dma();
        drop(dma);
        if ran > 0 {
            self.jobs_unlocked.fetch_add(ran as u64, Ordering::Relaxed);
            // There may be more: come back without parking.
            self.wanted[cpu as usize].store(true, Ordering::Release);
        }
        // SAFETY: as above.
        unsafe { (a.fns.wants_program)(a.ptr, cpu) != 0 }
    }

    /// Passes a CPU's transmitted frames and filter changes to the
    /// engine and wakes it.
    fn hand_over(&self, hw: &mut HwCtx) {
        let mut wake = false;
        if !hw.outbox.is_empty() {
            let mut tx = lock(&self.tx);
            let room = TX_MAX.saturating_sub(tx.len());
            if hw.outbox.len() > room {
                let lost = hw.outbox.len() - room;
                self.dropped_tx.fetch_add(lost as u64, Ordering::Relaxed);
                for o in hw.outbox.drain(room..) {
                    hw.pool.push(o.frame);
                }
            }
            tx.append(&mut hw.outbox);
            wake = true;
        }
        if !hw.memberships.is_empty() {
            let mut m = lock(&self.memberships);
            let room = MEMBERSHIP_MAX.saturating_sub(m.len());
            if hw.memberships.len() > room {
                tracing::warn!(node = self.nic.node, "multicast filter changes dropped: queue full");
                hw.memberships.truncate(room);
            }
            m.append(&mut hw.memberships);
            wake = true;
        }
        self.balance(&mut hw.pool);
        if wake {
            // The engine only needs to put them on the wire: no call into
            // the program for it (`take_handed`).
            self.handed.store(true, Ordering::SeqCst);
            self.wake(0);
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        let prog = self.program.get_mut().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: `state` came from boot; every CPU thread has been joined
        // (they hold an Arc to this Core), so nothing uses it afterwards.
        unsafe { (self.lib.free)(prog.0) };
        if let Some(a) = &self.area {
            // SAFETY: the one reference taken in `new`, valid past `free`
            // and not used afterwards.
            unsafe { (a.fns.free)(a.ptr) };
        }
    }
}

/// The threads of a NIC's CPUs past A; stops and joins them when dropped.
pub(crate) struct Cpus {
    core: Arc<Core>,
    handles: Vec<JoinHandle<()>>,
}

impl Cpus {
    /// Starts a thread for each CPU past A, if `core` is threaded.
    pub(crate) fn start(core: &Arc<Core>) -> std::io::Result<Cpus> {
        let mut handles = Vec::new();
        if core.threaded {
            for cpu in 1..core.cpus {
                let c = core.clone();
                let h = std::thread::Builder::new()
                    .name(format!("nic-cpu{cpu}-n{}", core.nic.node))
                    .spawn(move || c.cpu_thread(cpu));
                match h {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        let mut started = Cpus { core: core.clone(), handles };
                        started.stop();
                        return Err(e);
                    }
                }
            }
            let threads = handles.iter().map(|h| h.thread().clone()).collect();
            let _ = core.threads.set(threads);
        }
        Ok(Cpus { core: core.clone(), handles })
    }

    fn stop(&mut self) {
        self.core.stop.store(true, Ordering::Release);
        for h in &self.handles {
            h.thread().unpark();
        }
        for h in self.handles.drain(..) {
            if h.join().is_err() {
                tracing::error!(node = self.core.nic.node, "a NIC CPU thread panicked");
            }
        }
    }
}

impl Drop for Cpus {
    fn drop(&mut self) {
        self.stop();
    }
}
