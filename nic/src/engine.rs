//! The engine: one host thread running the control programs of every NIC of
//! a chassis (NIC CPUs share host threads: the machine has 2 cores). It
//! polls ring indices while there is work, spins briefly when work stops,
//! then sleeps on the doorbells, the wire and a timer: an idle NIC costs no
//! CPU, and a process posting to a polling NIC makes no system call.
//! The control programs themselves are `firmware.rs`'s [`Firmware`]s; the
//! engine moves their frames over the wire and calls them when due.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use emp_uapi::fwabi::FwConfig;
use emp_uapi::sram::{ctl, AdminMailbox, NicStatus, NIC_ALIVE_PERIOD_NS};

use crate::firmware::{boot_staged, Firmware};
use crate::fwlib::FRAMES_PER_CALL;
use crate::image::TrustedKeys;
use crate::nic::NicShared;
use crate::sys::{drain, epoll_add, signal};
use crate::wire::Wire;

struct Card {
    shared: Arc<NicShared>,
    fw: Option<Firmware>,
    /// Tunables for a control program a driver asks this NIC to start.
    fw_cfg: FwConfig,
    /// The guest RAM file this NIC DMAs into (guest NICs).
    guest_ram: Option<std::path::PathBuf>,
    /// Last seen host-written words: admin seq, then per port send/recv/cq.
    seen: Vec<u32>,
    /// Calls into the control program by kind, for the table dump.
    calls: Calls,
}

/// The engine's calls into one NIC's control program (table dump): how
/// much each call batches.
#[derive(Clone, Copy, Debug, Default)]
struct Calls {
    doorbells: u64,
    frame_batches: u64,
    frames: u64,
    timers: u64,
}

/// The engine thread's state.
pub struct Engine {
    cards: Vec<Card>,
    rx: Vec<VecDeque<Vec<u8>>>,
    wire: Box<dyn Wire>,
    t0: Instant,
    epoll: OwnedFd,
    timer: OwnedFd,
    /// Spin this long after the last work before sleeping.
    pub spin_ns: u64,
    /// Never sleep longer than this (guests ring no doorbell yet: the NIC
    /// polls their rings).
    pub max_sleep_ns: Option<u64>,
    /// Event priority (EMP thesis §2.2.1): each pass hands a NIC its
    /// received frames (MAC_RX) before the host's doorbell (MAILBOX)
    /// instead of after, so a sender hears ACKs and NACKs before it takes
    /// more sends.
    pub mac_rx_first: bool,
    stop: Arc<AtomicBool>,
    /// The wire's descriptors: woken by them, never drained like eventfds.
    wire_fds: Vec<RawFd>,
    pool: Vec<Vec<u8>>,
    trusted: Arc<TrustedKeys>,
    /// When the liveness words advance next, and their current value.
    next_beat_ns: u64,
    alive: u32,
}

impl Engine {
    /// An engine for these NICs (local index = position) on `wire`.
    pub fn new(
        nics: Vec<(Arc<NicShared>, Option<Firmware>, FwConfig)>,
        wire: Box<dyn Wire>,
        stop: Arc<AtomicBool>,
        trusted: Arc<TrustedKeys>,
    ) -> std::io::Result<Engine> {
        // SAFETY: plain syscalls creating new descriptors.
        let (ep, tfd) = unsafe {
            (
                libc::epoll_create1(libc::EPOLL_CLOEXEC),
                libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC),
            )
        };
        if ep < 0 || tfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fresh descriptors we own.
        let (epoll, timer) = unsafe { (OwnedFd::from_raw_fd(ep), OwnedFd::from_raw_fd(tfd)) };
        epoll_add(ep, tfd);
        let wire_fds = wire.fds();
        for &fd in &wire_fds {
            epoll_add(ep, fd);
        }
        let cards: Vec<Card> = nics
            .into_iter()
            .map(|(shared, fw, fw_cfg)| {
                epoll_add(ep, shared.wake.as_raw_fd());
                let n = 1 + 3 * shared.layout.params.ports as usize;
                Card { shared, fw, fw_cfg, guest_ram: None, seen: vec![0; n], calls: Calls::default() }
            })
            .collect();
        let rx = cards.iter().map(|_| VecDeque::new()).collect();
        Ok(Engine {
            cards,
            rx,
            wire,
            t0: Instant::now(),
            epoll,
            timer,
            spin_ns: 50_000,
            max_sleep_ns: None,
            mac_rx_first: false,
            stop,
            wire_fds,
            pool: Vec::new(),
            trusted,
            next_beat_ns: 0,
            alive: 0,
        })
    }

    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// Did the host write anything the control program must look at?
    fn host_changed(c: &mut Card) -> bool {
        let s = &c.shared;
        let admin = s.layout.admin_off as usize;
        let mut changed = s.sram.u32(admin) != s.sram.u32(admin + core::mem::offset_of!(AdminMailbox, done_seq));
        for p in 0..s.layout.params.ports {
            let w = s.layout.port(p);
            for (k, off) in [ctl::SEND_PROD, ctl::RECV_PROD, ctl::CQ_CONS].into_iter().enumerate() {
                let v = s.sram.u32(w.ctl(off));
                let slot = &mut c.seen[1 + 3 * p as usize + k];
                if *slot != v {
                    *slot = v;
                    changed = true;
                }
            }
        }
        changed
    }

    fn flush(&mut self, i: usize, now: u64) {
        if let Some(fw) = self.cards[i].fw.as_mut() {
            for (addr, join) in fw.take_memberships() {
                if let Err(e) = self.wire.set_membership(i, addr, join) {
                    tracing::warn!(local = i, "multicast filter {addr:#x}: {e}");
                }
            }
            for o in fw.take_outbox() {
                if o.host.is_empty() {
                    self.wire.send(now, i, o.dst, o.frame);
                } else {
                    self.wire.send_host(now, i, o.dst, o.frame, o.host);
                }
            }
        }
    }

    /// One pass over every NIC; true when anything was done. First up to
    /// [`SETTLE_ROUNDS`] rounds of doorbells and received frames, each
    /// round taking what the previous one put on the wire, then the timers.
    /// A frame one NIC of this engine sends in a round reaches its peer in
    /// the next and the answer comes back in the one after, so the timers
    /// run at a time by which every answer due was handled: now, when the
    /// wire went quiet; else the start of the round before the last (what
    /// was sent since is still being answered). They fire NIC by NIC in
    /// deadline order, what each sends handled before the next fires: a
    /// receiver's coalesced ACK (a timer) reaches its sender before the
    /// sender's later retransmission timer. A retransmission timer then
    /// measures a lost frame or a silent peer, never how long this thread
    /// took to come round again (busy copying, or not scheduled at all).
    fn pass(&mut self) -> bool {
        let (mut work, now) = self.settle();
        for _ in 0..self.cards.len().min(TIMER_FIRINGS) {
            let due = self.cards.iter().enumerate().filter_map(|(i, c)| Some((c.fw.as_ref()?.deadline(), i)));
            let Some((_, i)) = due.filter(|&(d, _)| d <= now).min() else { break };
            let began = self.now();
            let fw = self.cards[i].fw.as_mut().expect("has a deadline");
            fw.swap_frame_pool(&mut self.pool);
            fw.timeout(now);
            fw.swap_frame_pool(&mut self.pool);
            self.cards[i].calls.timers += 1;
            self.flush(i, now);
            self.cards[i].shared.busy.add(self.now().saturating_sub(began));
            self.wire.flush(now);
            work = true;
            self.settle();
        }
        work
    }

    /// Rounds of doorbells and received frames until the wire is quiet or
    /// [`SETTLE_ROUNDS`] ran; returns whether any did something, and the
    /// time the timers may run at (see [`Engine::pass`]).
    fn settle(&mut self) -> (bool, u64) {
        let mut work = false;
        let mut starts = [0u64; SETTLE_ROUNDS];
        for (round, start) in starts.iter_mut().enumerate() {
            *start = self.now();
            let delivered = self.wire.poll(*start, &mut self.rx);
            if round > 0 && delivered == 0 && self.rx.iter().all(VecDeque::is_empty) {
                return (work, self.now());
            }
            work |= self.round(*start) | (delivered > 0);
            self.wire.flush(*start);
        }
        (work, starts[SETTLE_ROUNDS - 2])
    }

    /// Every NIC's doorbell and received frames once; true when any did.
    fn round(&mut self, now: u64) -> bool {
        let mac_rx_first = self.mac_rx_first;
        let mut work = false;
        // When the current card's work began: a card that found nothing
        // reads no clock, so its poll is charged to the next that works.
        let mut began = now;
        for i in 0..self.cards.len() {
            let c = &mut self.cards[i];
            let mut did = false;
            if c.fw.is_none() {
                // A driver staged an image and set LOADING: verify and start it.
                if c.shared.loading() {
                    if let Some(ram) = &c.guest_ram {
                        match crate::dma::Region::map_guest_ram(ram) {
                            Ok(r) => c.shared.dma.write().expect("dma").set_guest(r),
                            Err(e) => tracing::error!(node = c.shared.node, "guest RAM {}: {e}", ram.display()),
                        }
                    }
                    c.fw = boot_staged(&c.shared, &self.trusted, c.fw_cfg);
                    work = true;
                }
                continue;
            }
            // One pool of frame buffers for the whole chassis: frames one NIC
            // receives become the buffers another transmits from.
            c.fw.as_mut().expect("checked").swap_frame_pool(&mut self.pool);
            if !mac_rx_first && Self::host_changed(c) {
                c.fw.as_mut().expect("checked").doorbell(now);
                c.calls.doorbells += 1;
                did = true;
            }
            if !self.rx[i].is_empty() {
                c.calls.frame_batches += 1;
                c.calls.frames += self.rx[i].len().min(FRAMES_PER_CALL) as u64;
                c.fw.as_mut().expect("checked").frames(now, &mut self.rx[i], FRAMES_PER_CALL);
                did = true;
            }
            if mac_rx_first && Self::host_changed(c) {
                c.fw.as_mut().expect("checked").doorbell(now);
                c.calls.doorbells += 1;
                did = true;
            }
            // What a NIC CPU thread transmitted, for the wire (`flush`).
            did |= c.fw.as_mut().expect("checked").take_handed();
            // A timer armed with no delay while handling this round (a
            // coalesced ACK) fires now, as the hardware's would: a host
            // that saw its receive complete may close its port at once.
            // Only when nothing is overdue (those wait for `pass`).
            let fw = c.fw.as_mut().expect("checked");
            if fw.deadline() == now {
                fw.timeout(now);
                c.calls.timers += 1;
                did = true;
            }
            c.fw.as_mut().expect("checked").swap_frame_pool(&mut self.pool);
            self.flush(i, now);
            if did {
                let ended = self.now();
                self.cards[i].shared.busy.add(ended.saturating_sub(began));
                began = ended;
                work = true;
            }
        }
        work
    }

    /// Advances every port's liveness word on each NIC whose control
    /// program runs (a failed or stopped one stays still, so its hosts learn
    /// it is gone without a system call), once per [`NIC_ALIVE_PERIOD_NS`].
    fn beat(&mut self, now: u64) {
        if now < self.next_beat_ns {
            return;
        }
        self.next_beat_ns = now + NIC_ALIVE_PERIOD_NS;
        self.alive = self.alive.wrapping_add(1).max(1);
        for c in &self.cards {
            if c.fw.is_none() || c.shared.header().status != NicStatus::Running as u32 {
                continue;
            }
            for p in 0..c.shared.layout.params.ports {
                c.shared.sram.put_u32(c.shared.layout.port(p).ctl(ctl::NIC_ALIVE), self.alive);
            }
        }
    }

    fn set_sleeping(&self, v: u32) {
        for c in &self.cards {
            for p in 0..c.shared.layout.params.ports {
                c.shared.sram.put_u32(c.shared.layout.port(p).ctl(ctl::NIC_SLEEPING), v);
            }
        }
    }

    fn refresh_doorbells(&mut self, registered: &mut Vec<RawFd>) {
        if !self.cards.iter().any(|c| c.shared.ports_changed.swap(false, Ordering::AcqRel)) {
            return;
        }
        let ep = self.epoll.as_raw_fd();
        for fd in registered.drain(..) {
            // SAFETY: removing a descriptor we added (it may already be closed: harmless).
            unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, core::ptr::null_mut()) };
        }
        for c in &self.cards {
            for p in c.shared.ports.lock().expect("ports").iter().flatten() {
                let fd = p.doorbell.as_raw_fd();
                epoll_add(ep, fd);
                registered.push(fd);
            }
        }
    }

    fn sleep(&mut self) {
        let now = self.now();
        let mut due = self.cards.iter().filter_map(|c| c.fw.as_ref()).map(Firmware::deadline).min().unwrap_or(u64::MAX);
        due = due.min(self.wire.next_due().unwrap_or(u64::MAX)).min(self.next_beat_ns);
        if due <= now + 2_000 {
            std::thread::yield_now();
            return;
        }
        if let Some(max) = self.max_sleep_ns {
            std::thread::sleep(std::time::Duration::from_nanos((due - now).min(max)));
            return;
        }
        self.set_sleeping(1);
        // Pairs with the host's fence between publishing a producer index
        // and reading `nic_sleeping`: one of the two sides sees the other.
        fence(Ordering::SeqCst);
        // A NIC CPU thread may have handed this one work meanwhile (`cpus.rs`).
        let handed = self.cards.iter().any(|c| c.fw.as_ref().is_some_and(|f| f.deadline() <= now || f.handed()));
        if handed || self.cards.iter_mut().any(Self::host_changed) {
            // Rewind the snapshot so the next pass sees the change too.
            for c in &mut self.cards {
                c.seen.iter_mut().for_each(|v| *v = v.wrapping_sub(1));
            }
            self.set_sleeping(0);
            return;
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: if due == u64::MAX {
                libc::timespec { tv_sec: 0, tv_nsec: 0 }
            } else {
                let d = due - now;
                libc::timespec { tv_sec: (d / 1_000_000_000) as i64, tv_nsec: (d % 1_000_000_000) as i64 }
            },
        };
        // SAFETY: valid timerfd and a live itimerspec.
        unsafe { libc::timerfd_settime(self.timer.as_raw_fd(), 0, &spec, core::ptr::null_mut()) };
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 32];
        // SAFETY: valid epoll fd; `evs` is writable for 32 entries.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), evs.as_mut_ptr(), 32, 1000) };
        for ev in evs.iter().take(n.max(0) as usize) {
            let fd = ev.u64 as RawFd;
            if !self.wire_fds.contains(&fd) {
                drain(fd);
            }
        }
        self.set_sleeping(0);
    }

    /// Logs every NIC's protocol tables (on SIGUSR1: see [`DUMP`]).
    fn dump(&self) {
        for c in &self.cards {
            let mut text = c.fw.as_ref().map(|f| f.describe()).unwrap_or_else(|| "not running".into());
            for p in 0..c.shared.layout.params.ports {
                let w = c.shared.layout.port(p);
                let r = |o| c.shared.sram.u32(w.ctl(o));
                text += &format!(
                    "  window {p}: send_prod {} recv_prod {} cq_cons {} arm {} sleeping {} | seen {:?}\n",
                    r(ctl::SEND_PROD),
                    r(ctl::RECV_PROD),
                    r(ctl::CQ_CONS),
                    r(ctl::ARM),
                    r(ctl::NIC_SLEEPING),
                    &c.seen[1 + 3 * p as usize..4 + 3 * p as usize]
                );
            }
            let k = c.calls;
            text += &format!(
                "engine calls: doorbells {}, frame batches {} carrying {} frames, timers {}\n",
                k.doorbells, k.frame_batches, k.frames, k.timers
            );
            tracing::info!(node = c.shared.node, "tables:\n{text}");
        }
    }

    /// NIC `i` serves a guest whose RAM is the file at `path`.
    pub fn set_guest_ram(&mut self, i: usize, path: std::path::PathBuf) {
        self.cards[i].guest_ram = Some(path);
    }

    /// Runs until `stop` is set.
    pub fn run(mut self) {
        let mut registered = Vec::new();
        let mut idle_since = self.now();
        while !self.stop.load(Ordering::Acquire) {
            if DUMP.swap(false, Ordering::AcqRel) {
                self.dump();
            }
            self.refresh_doorbells(&mut registered);
            self.beat(self.now());
            if self.pass() {
                idle_since = self.now();
                continue;
            }
            if self.now() - idle_since < self.spin_ns {
                // Poll, but give the core away between polls: on a small
                // machine the processes we serve need it to post work.
                std::thread::yield_now();
                continue;
            }
            self.sleep();
        }
    }
}

/// Rounds of doorbells and frames per pass before the timers (see
/// `Engine::pass`): at least 3 (a frame, its answer, the answer handled).
const SETTLE_ROUNDS: usize = 4;

/// NICs whose timers fire in one pass (the rest in the next).
const TIMER_FIRINGS: usize = 16;

/// Set (e.g. from a SIGUSR1 handler) to log every NIC's tables once.
pub static DUMP: AtomicBool = AtomicBool::new(false);

/// Wakes an engine from another thread (e.g. to stop it).
pub fn wake(shared: &NicShared) {
    signal(shared.wake.as_raw_fd());
}
