//! The entry points a side runs alone (docs/nic-cpus.md, "Each CPU on its
//! own side"): the thesis' DSR ran its two CPUs at once, each on its own
//! part of the state, with the semaphore for what both write. Here a
//! doorbell, a batch of received frames, CPU A's queue and the sides'
//! timers first run on the sides' views alone — the receive side's
//! [`RecvCpu`], the send side's [`SendCpu`],
//! each reaching what both write only through the semaphore
//! ([`crate::sem`]) — and say when the whole program must go on
//! ([`SideRun::whole`]), with nothing of the step they stopped at done.
//!
//! A driver that runs the NIC's CPUs on threads holds a lock per side
//! (taken in the order send, then receive, when both are) and calls a
//! side's entry point holding only that side's: the receive side's while
//! CPU A runs the send side's. The whole program's entry points
//! (`Nic::handle_*`) need both. The safe wrappers
//! ([`Nic::frames_by_sides`], [`Nic::doorbell_by_sides`],
//! [`Nic::cpu_by_sides`], [`Nic::timeout_by_sides`]) do what such a
//! driver does, for one thread (the simulator).

use core::ptr::addr_of;
use core::sync::atomic::{AtomicU64, Ordering};

use emp_uapi::sram::{counter, ctl, SramHeader};
use emp_uapi::wire::{self, AckBody, Frame, FrameHeader, NackReason};

use crate::counters::Counters;
use crate::cpu::{cpu_of, raise_if_armed, Step};
use crate::host::route_valid;
use crate::recv_cpu::RecvCpu;
use crate::sem::Shared;
use crate::send_cpu::SendCpu;
use crate::{sram_put_u32, CpuStep, Hal, Nic, RecvTimer};

/// What a side's entry point did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SideRun {
    /// Received frames it handled, from the first: the whole program takes
    /// the rest.
    pub taken: usize,
    /// The whole program must run next (`Nic::handle_frames` with the
    /// frames not taken, `Nic::handle_doorbell`, `Nic::handle_cpu` or
    /// `Nic::handle_timeout`, as the entry point was): something needs
    /// more than the side reaches.
    pub whole: bool,
    /// CPUs with steps or jobs waiting, one bit each: what the caller
    /// wakes (beside its own).
    pub wake: u32,
}

/// The timers' next deadlines as each store last published them (the send
/// side's, the receive side's, the whole program's; `u64::MAX`: none): a
/// driver reads them without any side's lock.
#[derive(Debug)]
pub(crate) struct Deadlines([AtomicU64; 3]);

const SEND: usize = 0;
const RECV: usize = 1;
const WHOLE: usize = 2;

impl Deadlines {
    pub(crate) fn new() -> Deadlines {
        Deadlines(core::array::from_fn(|_| AtomicU64::new(u64::MAX)))
    }

    fn set(&self, store: usize, at: Option<u64>) {
        self.0[store].store(at.unwrap_or(u64::MAX), Ordering::Release);
    }

    fn earliest(&self) -> Option<u64> {
        let at = self.0.iter().map(|d| d.load(Ordering::Acquire)).min().expect("three");
        (at != u64::MAX).then_some(at)
    }
}

/// Whether operations wait for a free send record, as the whole program
/// last published it.
///
/// # Safety
/// `this` is live. (An atomic only the whole program writes.)
unsafe fn stalled(this: *const Nic) -> bool {
    // SAFETY: per the contract above.
    unsafe { &*addr_of!((*this).stalled) }.load(Ordering::Acquire)
}

/// The program's published deadlines, reached while sides run.
///
/// # Safety
/// `this` is live for `'a`. (A shared reference to atomics only: no one
/// holds a unique one to them but the whole program, which runs alone.)
unsafe fn deadlines<'a>(this: *const Nic) -> &'a Deadlines {
    // SAFETY: per the contract above.
    unsafe { &*addr_of!((*this).deadlines) }
}

impl Nic {
    /// Publishes every store's next deadline (the whole program ends a
    /// call).
    pub(crate) fn publish_deadlines(&self) {
        self.deadlines.set(SEND, self.send.timers.next_deadline());
        self.deadlines.set(RECV, self.recv.next_deadline());
        self.deadlines.set(WHOLE, self.timers.next_deadline());
    }

    /// The earliest deadline the stores published: what
    /// [`Nic::poll_timeout`] says, read while sides run.
    ///
    /// # Safety
    /// `this` is live (any side may be running).
    pub unsafe fn published_deadline(this: *const Nic) -> Option<u64> {
        // SAFETY: the caller keeps `this` live.
        unsafe { deadlines(this) }.earliest()
    }

    /// Received frames, on the receive side alone: DATA frames of plain
    /// messages from known senders, and (when the plan updates send
    /// records on another CPU) ACKs, classified and handed to it. Stops at
    /// the first frame that needs more, with nothing of it done, or after
    /// a frame that left a report to the whole program; else takes the
    /// receive rings and sends owed flow-control updates.
    ///
    /// # Safety
    /// `this` came from [`Nic::boot`] and is live; until this returns the
    /// caller runs nothing else on the receive side, nor any of the whole
    /// program's entry points (the send side's may run at once, on another
    /// thread).
    pub unsafe fn recv_side_frames<'f, H: Hal>(
        this: *mut Nic,
        hal: &mut H,
        now: u64,
        frames: impl IntoIterator<Item = &'f [u8]>,
    ) -> SideRun {
        // SAFETY: the caller's contract (above) is `RecvCpu::alone`'s; the
        // configuration is only read.
        let mut v = unsafe { RecvCpu::alone(this, cpu_of((*addr_of!((*this).cfg)).cpu_plan, Step::Classify)) };
        let mut run = SideRun::default();
        for bytes in frames {
            if !v.frame_alone(hal, now, bytes) {
                run.whole = true;
                break;
            }
            run.taken += 1;
            if !v.recv.done.is_empty() {
                run.whole = true;
                break;
            }
        }
        // The whole program, if it goes on, takes the rings after the rest.
        if !run.whole {
            run.whole = v.rings_alone(hal);
            v.send_fc_updates(hal);
        }
        if !run.whole {
            v.recv.alone[1] += 1;
        }
        // SAFETY: `this` is live (the caller's contract).
        SideRun { taken: run.taken, ..unsafe { v.end_alone(hal, this, run.whole) } }
    }

    /// A doorbell's receive-side part, alone: the receive rings (probes,
    /// cancels, receives, unexpected messages taken at once), the
    /// coalesced ACKs due by `now` (its ACK-flush timer), and owed
    /// flow-control updates. `whole` when a ring stopped for the whole
    /// program (retained headers wait), or its idle sweep is due (the
    /// whole program's).
    ///
    /// # Safety
    /// As [`Nic::recv_side_frames`].
    pub unsafe fn recv_side_doorbell<H: Hal>(this: *mut Nic, hal: &mut H, now: u64) -> SideRun {
        // SAFETY: the caller's contract is `RecvCpu::alone`'s.
        let mut v = unsafe { RecvCpu::alone(this, 0) };
        let whole = v.timers_alone(hal, now) || v.rings_alone(hal);
        v.send_fc_updates(hal);
        if !whole {
            v.recv.alone[0] += 1;
        }
        // SAFETY: `this` is live (the caller's contract).
        unsafe { v.end_alone(hal, this, whole) }
    }

    /// A doorbell's send-side part, alone: plain sends taken from the send
    /// rings and queued on their peers, then what windows and flow control
    /// let go. `whole` when an admin command waits, a ring or a peer's
    /// sending stopped for the whole program, or a record finished that
    /// it reports.
    ///
    /// # Safety
    /// `this` came from [`Nic::boot`] and is live; until this returns the
    /// caller runs nothing else on the send side, nor any of the whole
    /// program's entry points (the receive side's may run at once, on
    /// another thread).
    pub unsafe fn send_side_doorbell<H: Hal>(this: *mut Nic, hal: &mut H, now: u64) -> SideRun {
        // SAFETY: the caller's contract is `SendCpu::alone`'s.
        let (mut v, stalled) = unsafe { (SendCpu::alone(this, 0), stalled(this)) };
        let whole = crate::host::admin_pending(hal, v.layout)
            || v.rings_alone(hal, now)
            || v.send_ready_alone(hal, now, stalled);
        if !whole {
            v.send.doorbells_alone += 1;
        }
        // SAFETY: `this` is live (the caller's contract).
        unsafe { v.end_alone(hal, this, whole) }
    }

    /// CPU `cpu`'s queue, on the send side alone: its jobs (which need no
    /// record), then its work while that is receive ack's send-record half
    /// (`Work::Ack`, which DSR's receive side hands it), then the send
    /// side's timers due by `now` (`SendCpu::timers_alone`), then what the
    /// freed windows let go. Stops at the first other work, a failed job,
    /// or a finished record the whole program reports; refused messages an
    /// ACK lets go wait for it in `SendSide::resume`.
    ///
    /// # Safety
    /// As [`Nic::send_side_doorbell`].
    pub unsafe fn send_side_cpu<H: Hal>(this: *mut Nic, hal: &mut H, now: u64, cpu: u8) -> SideRun {
        // SAFETY: as in `send_side_doorbell`.
        let (mut v, stalled) = unsafe { (SendCpu::alone(this, cpu), stalled(this)) };
        let area = v.shared.lock().queues.area();
        area.run_jobs(hal, cpu as usize);
        let mut whole = area.failed_jobs(cpu as usize);
        let mut ran = 0;
        while !whole {
            let Some((hdr, body, nack)) = v.shared.lock().queues.peek_ack(cpu) else { break };
            // The port may have closed since the ACK was classified.
            let open = v.ports.get(hdr.dst_port as usize).is_some_and(|p| p.open);
            if open && nack.is_some_and(|r| !v.nack_alone_ok(r, &hdr, &body)) {
                whole = true;
                break;
            }
            v.shared.lock().queues.pop_work(cpu);
            ran += 1;
            hal.cpu_step(cpu, CpuStep::RecvAckUpdate, true);
            if open {
                match nack {
                    None => v.send.resume = v.on_ack(hal, now, &hdr, &body),
                    Some(_) => v.loss_nack_alone(hal, now, &hdr, &body),
                }
            }
            whole = v.send.resume.is_some() || v.send.resend.is_some() || !v.send.done.is_empty();
        }
        {
            let g = v.shared.lock();
            g.queues.ran_work(cpu, ran);
            whole |= g.queues.has_work(cpu);
        }
        whole = whole || v.timers_alone(hal, now) || v.send_ready_alone(hal, now, stalled);
        if !whole {
            v.send.queue_runs_alone += 1;
        }
        // SAFETY: `this` is live (the caller's contract).
        unsafe { v.end_alone(hal, this, whole) }
    }

    /// Received frames as a driver running the sides on threads handles
    /// them: the receive side alone first, then the whole program for
    /// what it left.
    pub fn frames_by_sides<H: Hal>(&mut self, hal: &mut H, now: u64, frames: &[&[u8]]) {
        // SAFETY: `self` is borrowed uniquely: nothing else runs.
        let run = unsafe { Nic::recv_side_frames(self, hal, now, frames.iter().copied()) };
        if run.whole {
            self.handle_frames(hal, now, frames[run.taken..].iter().copied());
        }
    }

    /// A doorbell as a driver running the sides on threads handles it:
    /// the receive side's part, then the send side's, each alone, then
    /// the whole program if either stopped.
    pub fn doorbell_by_sides<H: Hal>(&mut self, hal: &mut H, now: u64) {
        // SAFETY: `self` is borrowed uniquely: nothing else runs.
        let recv = unsafe { Nic::recv_side_doorbell(self, hal, now) };
        // SAFETY: as above.
        if recv.whole || unsafe { Nic::send_side_doorbell(self, hal, now) }.whole {
            self.handle_doorbell(hal, now);
        }
    }

    /// CPU `cpu`'s queue as a driver running the sides on threads runs
    /// it: CPU A's on the send side alone first (its jobs and the ACKs
    /// DSR's receive side handed it), then the whole program for the rest.
    pub fn cpu_by_sides<H: Hal>(&mut self, hal: &mut H, now: u64, cpu: usize) {
        // SAFETY: `self` is borrowed uniquely: nothing else runs.
        if cpu != 0 || unsafe { Nic::send_side_cpu(self, hal, now, 0) }.whole {
            self.handle_cpu(hal, now, cpu);
        }
    }

    /// Timers due (or CPU A's queue) as a driver running the sides on
    /// threads handles them: CPU A's queue and the send side's timers on
    /// the send side, the receive side's due ACKs on the receive side, each
    /// alone, then the whole program if either stopped or another timer
    /// is due.
    pub fn timeout_by_sides<H: Hal>(&mut self, hal: &mut H, now: u64) {
        // SAFETY: `self` is borrowed uniquely: nothing else runs.
        let send = unsafe { Nic::send_side_cpu(self, hal, now, 0) };
        // SAFETY: as above.
        let recv = unsafe { Nic::recv_side_doorbell(self, hal, now) };
        // SAFETY: as above.
        let due = unsafe { Nic::published_deadline(self) }.is_some_and(|at| at <= now);
        if send.whole || recv.whole || due {
            self.handle_timeout(hal, now);
        }
    }

    /// Entries the sides ran alone (receive side: its rings and timers on
    /// a doorbell or a timer, frame batches; send side: doorbells), beside
    /// the whole program's ([`Nic::entries`]).
    pub fn side_entries(&self) -> (u64, u64, u64) {
        (self.recv.alone[0], self.recv.alone[1], self.send.doorbells_alone)
    }

    /// CPU queue runs the send side made alone (`Nic::send_side_cpu`).
    pub fn side_queue_runs(&self) -> u64 {
        self.send.queue_runs_alone
    }
}

impl RecvCpu<'_> {
    /// One received frame, if the receive side takes it alone; `false`,
    /// with nothing of it done, when it needs the whole program.
    fn frame_alone<H: Hal>(&mut self, hal: &mut H, now: u64, bytes: &[u8]) -> bool {
        let mut frame = match Frame::parse(bytes) {
            // Multicast: a group's, the whole program's.
            Ok(f) if wire::is_mcast(f.header().dst_node) => return false,
            Ok(f) if f.header().dst_node == self.node && route_valid(hal, self.layout, f.header().src_node) => f,
            _ => {
                self.count(counter::DROPPED_MALFORMED, 1);
                return true;
            }
        };
        let Some(slot) = self.open_slot(frame.header().dst_port) else { return false };
        frame.header_mut().dst_port = slot;
        match frame {
            Frame::Data { hdr, msg, payload } => {
                hal.cpu_step(self.cpu, CpuStep::RecvBookkeep, false);
                if self.try_data(hal, now, &hdr, msg.as_ref(), payload) {
                    self.recv.data_frames[0] += 1;
                    return true;
                }
                // The whole program takes it from the start, its
                // bookkeeping step already charged.
                self.recv.charged = true;
                false
            }
            Frame::Ack { hdr, body } => {
                let taken = !self.ports[hdr.dst_port as usize].open || self.classify_ack(hal, &hdr, &body, None);
                if taken {
                    self.count(counter::ACKS_RX, 1);
                }
                taken
            }
            Frame::Nack { hdr, body, reason } => {
                let open = self.ports[hdr.dst_port as usize].open;
                let taken = !open || self.classify_ack(hal, &hdr, &body, Some(reason));
                if taken {
                    self.count(counter::ACKS_RX, 1);
                }
                taken
            }
            _ => false,
        }
    }

    /// The slot of the open port with wire address `addr` (the common
    /// case: its own slot number); `None` for the whole program to decide
    /// (a parked context's address, a closed port).
    fn open_slot(&self, addr: u16) -> Option<u16> {
        let a = addr as usize;
        if a < self.ports.len() && self.ports[a].open && self.ports[a].addr == addr {
            return Some(addr);
        }
        self.ports.iter().position(|p| p.open && p.addr == addr).map(|s| s as u16)
    }

    /// Sends the coalesced ACKs due by `now`; `true` when the idle sweep
    /// is due (the whole program's: it may fail records of other layers).
    fn timers_alone<H: Hal>(&mut self, hal: &mut H, now: u64) -> bool {
        match self.recv.peek_expired(now) {
            Some(RecvTimer::AckFlush) => self.on_ack_flush(hal, now),
            Some(RecvTimer::Sweep) => return true,
            None => return false,
        }
        // It re-arms only for ACKs due later: what is due now is the sweep.
        self.recv.peek_expired(now).is_some()
    }

    /// Takes every running port's receive ring; `true` when one stopped
    /// for the whole program.
    fn rings_alone<H: Hal>(&mut self, hal: &mut H) -> bool {
        for p in 0..self.ports.len() as u16 {
            if !self.ports[p as usize].takes_rings() {
                continue;
            }
            let w = self.layout.port(p);
            let (rc0, mut budget, mut cq_cons) = (self.recv.ports[p as usize].cons, w.recv_entries, None);
            let stopped = self.take_recvs(hal, p, &mut budget, &mut cq_cons);
            let rc = self.recv.ports[p as usize].cons;
            if rc != rc0 {
                sram_put_u32(hal, w.ctl(ctl::RECV_CONS), rc);
            }
            if stopped {
                return true;
            }
        }
        false
    }

    /// Ends a call of the receive side alone: publishes, says whom to
    /// wake, and publishes its next deadline.
    ///
    /// # Safety
    /// `this` is the program this view was made from, live.
    unsafe fn end_alone<H: Hal>(&mut self, hal: &mut H, this: *const Nic, whole: bool) -> SideRun {
        // SAFETY: CPU A's counts are atomics the receive side only reads.
        let other = unsafe { &*addr_of!((*this).counters) };
        let mut shared = self.shared.lend();
        publish_alone(hal, &mut shared, self.layout, self.ports, &self.recv.counters, other);
        self.shared = shared;
        let wake = self.shared.lock().queues.waiting();
        // SAFETY: per the contract above.
        unsafe { deadlines(this) }.set(RECV, self.recv.next_deadline());
        SideRun { taken: 0, whole, wake }
    }
}

impl SendCpu<'_> {
    /// Takes every running port's send ring; `true` when one stopped for
    /// the whole program (a send to a new peer, taken, waits for it in
    /// `SendSide::new_peer`).
    fn rings_alone<H: Hal>(&mut self, hal: &mut H, now: u64) -> bool {
        for p in 0..self.ports.len() as u16 {
            if !self.ports[p as usize].takes_rings() {
                continue;
            }
            let w = self.layout.port(p);
            let (sc0, mut budget, mut cq_cons) = (self.send.ports[p as usize].cons, w.send_entries, None);
            let stop = self.take_sends(hal, now, p, &mut budget, &mut cq_cons);
            let sc = self.send.ports[p as usize].cons;
            if sc != sc0 {
                sram_put_u32(hal, w.ctl(ctl::SEND_CONS), sc);
            }
            match stop {
                None => {}
                Some(crate::host::RingStop::Program) => return true,
                Some(crate::host::RingStop::NewPeer(ld)) => {
                    self.send.new_peer = Some((p, ld));
                    return true;
                }
            }
        }
        false
    }

    /// Sends what the ready peers' windows and flow control allow; `true`
    /// when the whole program must go on: a peer's sending stopped (the
    /// peer stays first in the ready queue, nothing of its next frame
    /// done), or a record finished whose report, or whose freeing, is the
    /// whole program's (`stalled`: operations wait for a free record).
    fn send_ready_alone<H: Hal>(&mut self, hal: &mut H, now: u64, stalled: bool) -> bool {
        for _ in 0..self.send.ready.len() {
            let Some(p) = self.send.ready.pop_front() else { break };
            if self.peers[p as usize].is_none() {
                continue;
            }
            self.send.peer_mut(p).ready = false;
            if self.send_peer(hal, now, p).is_some() {
                self.send.peer_mut(p).ready = true;
                self.send.ready.push_front(p);
                return true;
            }
        }
        // A freed record wakes what waits for one: the whole program's,
        // if anything waits (as it last said).
        if self.send.freed && !stalled {
            self.send.freed = false;
        }
        !self.send.done.is_empty() || self.send.freed
    }

    /// Can a NACK with `reason` be taken on the send side alone? A loss
    /// NACK for one group of a message whose frames it can resend, while
    /// no ACK is held for the peer (the resend would stop at once); not a
    /// lost header (every group goes again), nor any other reason.
    fn nack_alone_ok(&self, reason: NackReason, hdr: &FrameHeader, body: &AckBody) -> bool {
        if reason != NackReason::Loss || (body.group == 0 && body.missing_mask & 1 != 0) {
            return false;
        }
        let Some(&peer) = self.peer_index.get(&(hdr.dst_port, hdr.src_node, hdr.src_port)) else { return true };
        !self.ack_held.get(peer)
    }

    /// A loss NACK ([`SendCpu::nack_alone_ok`]) on the send side: what it
    /// says of the receiver's room and what it acknowledges, then the
    /// group's missing frames again. What needs the whole program waits
    /// for it: refused messages to resend first, with the rest of the NACK
    /// after them (`SendSide::resume`, `nack_rest`); a resend that stopped
    /// (`SendSide::resend`).
    fn loss_nack_alone<H: Hal>(&mut self, hal: &mut H, now: u64, hdr: &FrameHeader, body: &AckBody) {
        let Some(&peer) = self.peer_index.get(&(hdr.dst_port, hdr.src_node, hdr.src_port)) else { return };
        self.learn_remote(now, peer, hdr, body);
        if let Some(after) = self.ack_below(hal, peer, hdr, body.rx_expected) {
            self.send.resume = Some((peer, after));
        }
        if self.send.resume.is_some() || !self.send.done.is_empty() {
            self.send.nack_rest = Some((*hdr, *body));
            return;
        }
        let Some(slot) = self.send.find_tx(peer, hdr.msg_seq) else { return };
        let m = self.send.tx.get(slot).expect("live");
        if body.group >= m.groups.count() || m.held {
            return;
        }
        self.send.resend = self.on_loss_nack(hal, now, slot, body.group, body.missing_mask);
    }

    /// Ends a call of the send side alone: publishes, says whom to wake,
    /// and publishes its next deadline.
    ///
    /// # Safety
    /// `this` is the program this view was made from, live.
    unsafe fn end_alone<H: Hal>(&mut self, hal: &mut H, this: *const Nic, whole: bool) -> SideRun {
        // SAFETY: the receive side's counts are atomics the send side only
        // reads.
        let other = unsafe { &*addr_of!((*this).recv.counters) };
        let mut shared = self.shared.lend();
        publish_alone(hal, &mut shared, self.layout, self.ports, self.counters, other);
        self.shared = shared;
        let wake = self.shared.lock().queues.waiting();
        // SAFETY: per the contract above.
        unsafe { deadlines(this) }.set(SEND, self.send.timers.next_deadline());
        SideRun { taken: 0, whole, wake }
    }
}

/// Ends a side's call: raises the interrupt of every port a completion
/// was written to (by either side) whose host armed it, and publishes the
/// counters this side changed, each as the sum of both sides' counts.
/// Under the semaphore: the last to publish a counter wrote the latest
/// sum of both.
fn publish_alone<H: Hal>(
    hal: &mut H,
    shared: &mut Shared,
    layout: &emp_uapi::sram::Layout,
    ports: &[crate::Port],
    own: &Counters,
    other: &Counters,
) {
    let g = shared.lock();
    let mut written = core::mem::take(&mut g.cqs.written);
    for &port in &written {
        g.cqs.ports[port as usize].written = false;
        if ports[port as usize].open {
            raise_if_armed(hal, layout.port(port).ctl(ctl::ARM), port);
        }
    }
    written.clear();
    g.cqs.written = written;
    publish_counters(hal, own.take_dirty(), own, other);
}

/// Writes counters `dirty` (one bit each) to the SRAM header, each the sum
/// of `a`'s and `b`'s counts.
pub(crate) fn publish_counters<H: Hal>(hal: &mut H, mut dirty: u64, a: &Counters, b: &Counters) {
    let at = core::mem::offset_of!(SramHeader, counters);
    while dirty != 0 {
        let c = dirty.trailing_zeros() as usize;
        dirty &= dirty - 1;
        hal.sram_write(at + 8 * c, &a.sum(b, c).to_le_bytes());
    }
}
