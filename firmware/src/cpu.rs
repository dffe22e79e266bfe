//! NIC CPUs (EMP thesis ch. 3). The control program's steps are assigned to
//! CPU A (0) or CPU B (1) by the plan chosen at boot; a step that belongs to
//! the other CPU is queued there (the thesis' cross-CPU event through the
//! common area) instead of running inline.
//!
//! Two kinds of hand-off, as the Tigon2's CPUs had:
//! - **Jobs** ([`Job`], in the common [`Area`]): data movement whose
//!   bookkeeping the queuing CPU already did — a plain frame's headers and
//!   the host segments its payload is read from, a received payload and the
//!   host segments it goes to, an ACK to put on the wire. The CPU that
//!   takes a job touches no record of the program: where the NIC runs its
//!   CPUs on threads, it runs its jobs without the program's lock
//!   ([`Area::run_jobs`]), beside the other CPU's steps. This is the state
//!   each CPU owns: its job queue, its frame scratch, its failures.
//! - **Work** ([`Work`], in the program's [`Queues`]): steps that read or
//!   change records (a receive's completion, an ACK's send-record update,
//!   frames built from a collective's or remote access's state); the CPU
//!   runs them holding the program (the thesis' semaphore).
//!
//! A CPU runs its jobs before its work, so everything queued to it keeps
//! the order that matters: a record's payloads before its completion, an
//! owed ACK before the frame that answers it (ACKs are always jobs).
//!
//! The steps are the thesis' Table 3.1 ones, and the plans its Table 3.2:
//!
//! | plan | send bookkeep | transmission | recv bookkeep | recv frame + receiving | send ack | recv ack |
//! |------|---------------|--------------|---------------|------------------------|----------|----------|
//! | base | A             | A            | A             | A                      | A        | A        |
//! | SO   | A             | B            | A             | A                      | B        | A        |
//! | RO   | A             | A            | A             | B                      | A        | A        |
//! | SR   | A             | B            | A             | B                      | B        | A        |
//! | DSR  | A             | A            | B             | B                      | A        | B classifies, A updates the send record |
//!
//! Send ack goes out when the frame that completes its group has been
//! received, before the receive completes; on another CPU it runs beside
//! the rest of the receive (§3.3: send ack in parallel with receiving).
//! Receive ack is a step of its own, and DSR splits it (Table 3.2): the
//! receive CPU classifies the ACK frame, the send CPU updates the send
//! record.
//!
//! Every step tells the hardware where it runs ([`Hal::cpu_step`]): the
//! NIC ignores it; the simulator's per-CPU cost model charges it on that
//! CPU's timeline.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use emp_uapi::fwabi::{HostSeg, HOST_SEGS_MAX};
use emp_uapi::image::cpu_plan;
use emp_uapi::wire::{AckBody, FrameHeader, MsgHeader, MTU_MAX};
use emp_uapi::Le;

use crate::mr::{Buf, HostSegs};
use emp_uapi::desc::Status;

use crate::{Hal, Nic};

/// Steps that can move between CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Transmission,
    /// Recv frame and receiving: the payload's DMA to the host.
    Receiving,
    SendAck,
    /// Frames are classified (receive bookkeeping) where they arrive.
    Classify,
    /// The send-record half of receive ack (DSR's split).
    AckUpdate,
}

/// A step of the thesis' Table 3.1 (and 3.2's splits) as it runs, for
/// [`Hal::cpu_step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CpuStep {
    /// Send bookkeeping of one frame (descriptor, fragmentation, record).
    SendBookkeep,
    /// One frame: DMA from the host, queue to the MAC.
    Transmission,
    /// An ACK or NACK frame handled whole on one CPU.
    RecvAck,
    /// DSR: the receive CPU's part of an ACK (classify, find the record).
    RecvAckClassify,
    /// DSR: the send CPU's part of an ACK (update the send record).
    RecvAckUpdate,
    /// Classify one received data frame against the receive records.
    RecvBookkeep,
    /// Record the frame in its receive record and start its DMA.
    RecvFrame,
    /// The payload's DMA to the host.
    Receiving,
    /// Build and transmit an ACK or NACK.
    SendAck,
    /// Publish a completion (the thesis' status word: no step of its own).
    Complete,
}

/// Which CPU runs `step` under `plan`.
pub(crate) const fn cpu_of(plan: u32, step: Step) -> u8 {
    match (plan, step) {
        (cpu_plan::SO, Step::Transmission | Step::SendAck) => 1,
        (cpu_plan::RO, Step::Receiving) => 1,
        (cpu_plan::SR, Step::Transmission | Step::Receiving | Step::SendAck) => 1,
        (cpu_plan::DSR, Step::Receiving | Step::Classify) => 1,
        _ => 0,
    }
}

/// CPUs a plan uses.
pub(crate) const fn cpus(plan: u32) -> u8 {
    if plan == cpu_plan::BASE {
        1
    } else {
        2
    }
}

/// Steps queued for another CPU that read or change the program's records:
/// run holding the program.
#[derive(Debug)]
pub(crate) enum Work {
    /// Send frame `frame` of tx record `slot` (message `seq`): frames built
    /// from a collective's or remote access's state, or a payload too
    /// scattered to name in a [`Job`].
    Transmit { slot: u32, seq: u32, frame: u32, retransmit: bool },
    /// DMA a received payload into rx record `slot` at message offset
    /// `off` (`data` is one of the area's payload buffers, returned after):
    /// a buffer too scattered to name in a [`Job`].
    Receive { slot: u32, seq: u32, off: u64, data: Vec<u8> },
    /// Every frame of rx record `slot` is in: complete the receive.
    Finish { slot: u32, seq: u32 },
    /// Update the send record an ACK names (DSR: classified on the other CPU).
    Ack { hdr: FrameHeader, body: AckBody },
}

/// Bound of each work queue: beyond it a step runs inline (never dropped).
pub(crate) const QUEUE_MAX: usize = 1 << 16;

/// Bound of each CPU's job queue: a CPU that finds it full runs the queued
/// jobs itself first, so nothing is dropped or reordered.
pub(crate) const JOBS_MAX: usize = 256;

/// Payload buffers kept for queued receives (`MTU_MAX` bytes each, made at
/// boot): a received frame waiting for the other CPU's DMA is copied into
/// one, so the receive path does not allocate per frame. Past the pool (a
/// CPU that outran the other), a new one is made and kept afterwards.
const PAYLOAD_BUFS: usize = 64;

/// `Area::wants_program` bits: work waits in the program's queue; failed
/// jobs wait to be reported.
const WANT_WORK: u32 = 1;
const WANT_FAILED: u32 = 2;

/// The headers of a data frame: the frame and message headers.
pub(crate) const HEAD_MAX: usize = FrameHeader::SIZE + MsgHeader::SIZE;

/// Host memory named by bus address, in order (at most `HOST_SEGS_MAX`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segs {
    segs: [HostSeg; HOST_SEGS_MAX],
    n: u8,
}

impl Segs {
    /// The segments gathered in `g`, unless it overflowed.
    pub(crate) fn from_gathered(g: &HostSegs) -> Option<Segs> {
        if g.overflowed {
            return None;
        }
        let mut s = Segs { segs: [HostSeg::default(); HOST_SEGS_MAX], n: g.segs.len() as u8 };
        s.segs[..g.segs.len()].copy_from_slice(&g.segs);
        Some(s)
    }

    fn as_slice(&self) -> &[HostSeg] {
        &self.segs[..self.n as usize]
    }
}

/// Data movement handed to another CPU, needing no record of the program.
#[derive(Debug)]
pub(crate) enum Job {
    /// Transmission of one plain data frame: its headers (built by send
    /// bookkeeping), then `len` payload bytes read from `segs` — or, with
    /// `in_place` (Immediate Sending), named to the MAC as they are.
    Transmit { slot: u32, seq: u32, dst: u16, head: [u8; HEAD_MAX], head_len: u8, segs: Segs, in_place: bool },
    /// Receiving: `data` DMAed to `segs` (the payload buffer goes back to
    /// the area's pool after).
    Receive { slot: u32, seq: u32, segs: Segs, data: Vec<u8> },
    /// Send ack: put an ACK/NACK on the wire.
    Control { hdr: FrameHeader, body: AckBody },
}

/// A job whose DMA failed, for its CPU to report holding the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failed {
    /// The send of tx record `slot` (message `seq`) fails with a DMA error.
    Transmit { slot: u32, seq: u32 },
    /// The receive of rx record `slot` (message `seq`) fails with one.
    Receive { slot: u32, seq: u32 },
}

/// What one CPU owns while it runs its jobs.
#[derive(Debug)]
struct Runner {
    /// One frame of scratch: a frame is built here from its headers and
    /// the payload read from host memory.
    frame: Vec<u8>,
    /// Failed jobs not yet reported (at most `JOBS_MAX` between two
    /// reports: a run takes at most that many).
    failed: Vec<Failed>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic inside a job is reported as a crash of the program.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The common area of a NIC's CPUs: their job queues and what each owns to
/// run them, and the payload buffers passed between them. Shared by the
/// program (which queues jobs, holding itself) and by a CPU running its
/// jobs without the program. Lock order: a runner, then a job queue or the
/// payload pool (leaves).
#[derive(Debug)]
pub struct Area {
    jobs: [Mutex<VecDeque<Job>>; 2],
    /// Jobs queued per CPU (as `jobs`' lengths; read without their locks,
    /// so a CPU with none takes no lock).
    queued: [AtomicU32; 2],
    runners: [Mutex<Runner>; 2],
    payloads: Mutex<Vec<Vec<u8>>>,
    /// Per CPU: work waiting in the program's queue, or failed jobs to
    /// report: the CPU must take the program. Written holding the program
    /// (work) or the CPU's runner (failures).
    wants_program: [AtomicU32; 2],
}

impl Area {
    fn new(plan: u32) -> Area {
        let two = cpus(plan) > 1;
        let (jobs, bufs, frame) = if two { (JOBS_MAX, PAYLOAD_BUFS, MTU_MAX as usize) } else { (0, 0, 0) };
        let runner = || Mutex::new(Runner { frame: vec![0; frame], failed: Vec::with_capacity(jobs) });
        Area {
            jobs: [Mutex::new(VecDeque::with_capacity(jobs)), Mutex::new(VecDeque::with_capacity(jobs))],
            queued: Default::default(),
            runners: [runner(), runner()],
            payloads: Mutex::new((0..bufs).map(|_| Vec::with_capacity(MTU_MAX as usize)).collect()),
            wants_program: Default::default(),
        }
    }

    /// Jobs waiting for `cpu`.
    pub fn jobs_pending(&self, cpu: usize) -> usize {
        self.queued.get(cpu).map_or(0, |q| q.load(Ordering::Acquire) as usize)
    }

    /// `cpu` has work that needs the program: queued work or failed jobs.
    pub fn wants_program(&self, cpu: usize) -> bool {
        self.wants_program.get(cpu).is_some_and(|w| w.load(Ordering::Acquire) != 0)
    }

    fn has_failed(&self, cpu: usize) -> bool {
        self.wants_program[cpu].load(Ordering::Acquire) & WANT_FAILED != 0
    }

    /// Runs `cpu`'s queued jobs (at most `JOBS_MAX`) with `hal`, the
    /// hardware of that CPU; returns how many ran. Needs no program: a CPU
    /// on a thread of its own runs this beside the other CPU's steps.
    pub fn run_jobs<H: Hal>(&self, hal: &mut H, cpu: usize) -> usize {
        if self.jobs_pending(cpu) == 0 {
            return 0;
        }
        let mut r = lock(&self.runners[cpu]);
        self.run_batch(hal, cpu, &mut r)
    }

    /// Waits for `cpu` to finish the jobs it is running, then runs every
    /// job still queued for it here.
    fn drain<H: Hal>(&self, hal: &mut H, cpu: usize) {
        let Some(runner) = self.runners.get(cpu) else { return };
        let mut r = lock(runner);
        while self.run_batch(hal, cpu, &mut r) > 0 {}
    }

    fn run_batch<H: Hal>(&self, hal: &mut H, cpu: usize, r: &mut Runner) -> usize {
        let mut ran = 0;
        while ran < JOBS_MAX {
            let Some(job) = lock(&self.jobs[cpu]).pop_front() else { break };
            self.queued[cpu].fetch_sub(1, Ordering::AcqRel);
            ran += 1;
            if let Some(f) = self.run(hal, cpu as u8, &mut r.frame, job) {
                r.failed.push(f);
                self.wants_program[cpu].fetch_or(WANT_FAILED, Ordering::Release);
            }
        }
        ran
    }

    fn run<H: Hal>(&self, hal: &mut H, cpu: u8, frame: &mut [u8], job: Job) -> Option<Failed> {
        match job {
            Job::Transmit { slot, seq, dst, head, head_len, segs, in_place } => {
                hal.cpu_step(cpu, CpuStep::Transmission, true);
                let head = &head[..head_len as usize];
                let sent = if in_place {
                    hal.mac_transmit_host(dst, head, segs.as_slice()).is_ok()
                } else {
                    frame_from_host(hal, frame, head, segs.as_slice())
                        .map(|n| hal.mac_transmit(dst, &frame[..n]))
                        .is_some()
                };
                (!sent).then_some(Failed::Transmit { slot, seq })
            }
            Job::Receive { slot, seq, segs, data } => {
                hal.cpu_step(cpu, CpuStep::RecvFrame, true);
                hal.cpu_step(cpu, CpuStep::Receiving, false);
                let mut at = 0;
                let mut ok = true;
                for s in segs.as_slice() {
                    let end = at + s.len as usize;
                    if hal.dma_write(s.addr, &data[at..end]).is_err() {
                        ok = false;
                        break;
                    }
                    at = end;
                }
                self.give_payload(data);
                (!ok).then_some(Failed::Receive { slot, seq })
            }
            Job::Control { hdr, body } => {
                hal.cpu_step(cpu, CpuStep::SendAck, true);
                put_control(hal, &hdr, &body);
                None
            }
        }
    }

    /// A payload buffer holding `data`, from the pool when it has one.
    fn take_payload(&self, data: &[u8]) -> Vec<u8> {
        let mut buf = lock(&self.payloads).pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        buf
    }

    fn give_payload(&self, buf: Vec<u8>) {
        lock(&self.payloads).push(buf);
    }

    /// Takes `cpu`'s failed jobs (holding the program and the runner).
    fn take_failed(&self, cpu: usize, out: &mut Vec<Failed>) {
        if !self.has_failed(cpu) {
            return;
        }
        let mut r = lock(&self.runners[cpu]);
        out.append(&mut r.failed);
        self.wants_program[cpu].fetch_and(!WANT_FAILED, Ordering::Release);
    }

    /// Says whether `cpu` has work in the program's queue (holding it).
    fn set_work_waiting(&self, cpu: usize, waiting: bool) {
        let w = &self.wants_program[cpu];
        if (w.load(Ordering::Relaxed) & WANT_WORK != 0) == waiting {
            return;
        }
        if waiting {
            self.wants_program[cpu].fetch_or(WANT_WORK, Ordering::Release);
        } else {
            self.wants_program[cpu].fetch_and(!WANT_WORK, Ordering::Release);
        }
    }
}

/// Builds a frame in `frame` from `head` and the payload read from host
/// memory at `segs`; its length, or `None` when a read fails.
fn frame_from_host<H: Hal>(hal: &mut H, frame: &mut [u8], head: &[u8], segs: &[HostSeg]) -> Option<usize> {
    frame[..head.len()].copy_from_slice(head);
    let mut at = head.len();
    for s in segs {
        let end = at.checked_add(usize::try_from(s.len).ok()?).filter(|&e| e <= frame.len())?;
        hal.dma_read(s.addr, &mut frame[at..end]).ok()?;
        at = end;
    }
    Some(at)
}

/// Puts an ACK or NACK on the wire.
pub(crate) fn put_control<H: Hal>(hal: &mut H, hdr: &FrameHeader, body: &AckBody) {
    let mut b = [0u8; FrameHeader::SIZE + AckBody::SIZE];
    emp_uapi::wire::emit_ack(hdr, body, &mut b).expect("fits");
    hal.mac_transmit(hdr.dst_node, &b);
}

/// The per-CPU work queues, and the area shared with the CPUs.
#[derive(Debug)]
pub(crate) struct Queues {
    q: [VecDeque<Work>; 2],
    area: Arc<Area>,
    /// Failed jobs being reported (scratch, `JOBS_MAX`).
    failed: Vec<Failed>,
}

impl Queues {
    /// Queues for `plan`; job queues and payload buffers only when it uses
    /// two CPUs.
    pub(crate) fn new(plan: u32) -> Queues {
        let jobs = if cpus(plan) > 1 { JOBS_MAX } else { 0 };
        Queues { q: Default::default(), area: Arc::new(Area::new(plan)), failed: Vec::with_capacity(jobs) }
    }
}

impl Nic {
    /// Where `step` runs: `Some(cpu)` to queue it there, `None` to run it
    /// now (its cost is then reported to `hal` here; a queued one's when it
    /// runs). Transmission is preceded by the frame's send bookkeeping,
    /// always here.
    pub(crate) fn dispatch<H: Hal>(&mut self, hal: &mut H, step: Step) -> Option<u8> {
        let cpu = cpu_of(self.cfg.cpu_plan, step);
        if step == Step::Transmission {
            hal.cpu_step(self.cpu, CpuStep::SendBookkeep, false);
        }
        if cpu != self.cpu && self.queues.q[cpu as usize].len() < QUEUE_MAX {
            return Some(cpu);
        }
        let here = match step {
            Step::Transmission => CpuStep::Transmission,
            Step::Receiving => {
                hal.cpu_step(self.cpu, CpuStep::RecvFrame, false);
                CpuStep::Receiving
            }
            Step::SendAck => CpuStep::SendAck,
            Step::Classify => CpuStep::RecvBookkeep,
            Step::AckUpdate => CpuStep::RecvAckUpdate,
        };
        hal.cpu_step(self.cpu, here, false);
        None
    }

    /// The CPU frames arrive on (a driver runs `handle_frame` there).
    pub fn frame_cpu(&self) -> usize {
        cpu_of(self.cfg.cpu_plan, Step::Classify) as usize
    }

    /// The common area of this NIC's CPUs, for a driver that runs a CPU's
    /// jobs without the program ([`Area::run_jobs`]).
    pub fn cpu_area(&self) -> Arc<Area> {
        self.queues.area.clone()
    }

    /// Receive ack: whole on this CPU, or (DSR) classified here and the send
    /// record updated on the send CPU.
    pub(crate) fn recv_ack<H: Hal>(&mut self, hal: &mut H, now: u64, hdr: &FrameHeader, body: &AckBody) {
        let cpu = cpu_of(self.cfg.cpu_plan, Step::AckUpdate);
        if cpu != self.cpu && self.queues.q[cpu as usize].len() < QUEUE_MAX {
            hal.cpu_step(self.cpu, CpuStep::RecvAckClassify, false);
            self.enqueue(hal, cpu, Work::Ack { hdr: *hdr, body: *body });
        } else {
            hal.cpu_step(self.cpu, CpuStep::RecvAck, false);
            self.on_ack(hal, now, hdr, body);
        }
    }

    /// Queues the DMA of received `data` into rx record `slot` (message
    /// `seq`) at message offset `off` on `cpu`, which `dispatch` gave: a job
    /// when the record's buffer there is named in at most `HOST_SEGS_MAX`
    /// segments (checked here, so a bad buffer fails now), else work.
    pub(crate) fn enqueue_receive<H: Hal>(
        &mut self,
        hal: &mut H,
        cpu: u8,
        slot: u32,
        seq: u32,
        off: u64,
        data: &[u8],
    ) -> Result<(), Status> {
        let m = self.rx.get(slot).expect("live");
        let (port, desc) = (m.port, m.desc);
        let mut g = core::mem::take(&mut self.host_segs);
        g.clear();
        let r =
            self.sge_io(hal, port, desc.sges(), off, Buf::Gather(data.len(), &mut g), emp_uapi::desc::MR_LOCAL_WRITE);
        let segs = Segs::from_gathered(&g);
        self.host_segs = g;
        r?;
        let data = self.queues.area.take_payload(data);
        match segs {
            Some(segs) => self.push_job(hal, cpu, Job::Receive { slot, seq, segs, data }),
            None => self.enqueue(hal, cpu, Work::Receive { slot, seq, off, data }),
        }
        Ok(())
    }

    /// Queues `job` for `cpu`; when its queue is full, runs what waits
    /// there first (in order: a CPU's jobs never overtake one another).
    pub(crate) fn push_job<H: Hal>(&mut self, hal: &mut H, cpu: u8, job: Job) {
        let area = &self.queues.area;
        let mut job = Some(job);
        while let Some(j) = job.take() {
            let mut q = lock(&area.jobs[cpu as usize]);
            if q.len() < JOBS_MAX {
                q.push_back(j);
                area.queued[cpu as usize].fetch_add(1, Ordering::AcqRel);
            } else {
                drop(q);
                job = Some(j);
                area.run_jobs(hal, cpu as usize);
            }
        }
        hal.cpu_event(cpu, 1);
    }

    /// Runs every CPU's queued jobs here, after waiting for a CPU running
    /// its own: afterwards no job names host memory by an old translation
    /// (`MrFence`).
    pub(crate) fn drain_jobs<H: Hal>(&mut self, hal: &mut H) {
        for cpu in 0..self.cpus() {
            self.queues.area.drain(hal, cpu);
        }
    }

    pub(crate) fn enqueue<H: Hal>(&mut self, hal: &mut H, cpu: u8, w: Work) {
        self.queues.q[cpu as usize].push_back(w);
        self.queues.area.set_work_waiting(cpu as usize, true);
        hal.cpu_event(cpu, 1);
    }

    /// NIC CPUs in use.
    pub fn cpus(&self) -> usize {
        cpus(self.cfg.cpu_plan) as usize
    }

    /// Steps waiting for `cpu`: its work, jobs and failed jobs.
    pub fn cpu_pending(&self, cpu: usize) -> usize {
        let Some(q) = self.queues.q.get(cpu) else { return 0 };
        let area = &self.queues.area;
        q.len() + area.jobs_pending(cpu) + usize::from(area.has_failed(cpu))
    }

    /// Runs CPU `cpu`'s queued steps: its jobs, then the failures of its
    /// jobs, then its work; returns how many ran.
    pub fn handle_cpu<H: Hal>(&mut self, hal: &mut H, now: u64, cpu: usize) -> usize {
        if cpu >= self.queues.q.len() {
            return 0;
        }
        let prev = core::mem::replace(&mut self.cpu, cpu as u8);
        let mut ran = self.queues.area.run_jobs(hal, cpu);
        ran += self.report_failed(hal, now, cpu);
        let n = self.queues.q[cpu].len();
        for _ in 0..n {
            let Some(w) = self.queues.q[cpu].pop_front() else { break };
            self.run_work(hal, now, w);
        }
        ran += n;
        self.queues.area.set_work_waiting(cpu, !self.queues.q[cpu].is_empty());
        self.send_ready_peers(hal, now);
        self.cpu = prev;
        self.publish(hal);
        ran
    }

    /// Fails the records whose jobs on `cpu` failed (if still the same
    /// messages); returns how many.
    fn report_failed<H: Hal>(&mut self, hal: &mut H, now: u64, cpu: usize) -> usize {
        let mut failed = core::mem::take(&mut self.queues.failed);
        self.queues.area.take_failed(cpu, &mut failed);
        let n = failed.len();
        for f in failed.drain(..) {
            match f {
                Failed::Transmit { slot, seq } => {
                    if self.tx.get(slot).is_some_and(|m| m.seq == seq) {
                        self.finish_tx(hal, now, slot, Status::DmaError);
                    }
                }
                Failed::Receive { slot, seq } => {
                    if self.rx.get(slot).is_some_and(|m| m.seq == seq) {
                        self.rx_error(slot, Status::DmaError);
                    }
                }
            }
        }
        self.queues.failed = failed;
        n
    }

    fn run_work<H: Hal>(&mut self, hal: &mut H, now: u64, w: Work) {
        let step = match &w {
            Work::Transmit { .. } => CpuStep::Transmission,
            Work::Receive { .. } => CpuStep::RecvFrame,
            Work::Finish { .. } => CpuStep::Complete,
            Work::Ack { .. } => CpuStep::RecvAckUpdate,
        };
        hal.cpu_step(self.cpu, step, true);
        match w {
            Work::Transmit { slot, seq, frame, retransmit } => {
                if self.tx.get(slot).is_some_and(|m| m.seq == seq) {
                    if let Err(st) = self.send_frame(hal, slot, frame, retransmit) {
                        self.finish_tx(hal, now, slot, st);
                    }
                }
            }
            Work::Receive { slot, seq, off, data } => {
                hal.cpu_step(self.cpu, CpuStep::Receiving, false);
                if let Some(m) = self.rx.get(slot).filter(|m| m.seq == seq) {
                    let (port, desc) = (m.port, m.desc);
                    let to = Buf::ToHost(&data);
                    if let Err(e) = self.sge_io(hal, port, desc.sges(), off, to, emp_uapi::desc::MR_LOCAL_WRITE) {
                        self.rx_error(slot, e);
                    }
                }
                self.queues.area.give_payload(data);
            }
            Work::Finish { slot, seq } => {
                if self.rx.get(slot).is_some_and(|m| m.seq == seq) {
                    self.finish_rx(hal, now, slot, None);
                }
            }
            Work::Ack { hdr, body } => {
                // The port may have closed since the ACK was classified.
                if self.ports.get(hdr.dst_port as usize).is_some_and(|p| p.open) {
                    self.on_ack(hal, now, &hdr, &body);
                }
            }
        }
    }
}
