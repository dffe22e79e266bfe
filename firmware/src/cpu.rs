//! NIC CPUs (EMP thesis ch. 3). The control program's steps are assigned to
//! CPU A (0) or CPU B (1) by the plan chosen at boot; a step that belongs to
//! the other CPU is queued there (the thesis' cross-CPU event through the
//! common area) instead of running inline.
//!
//! Two kinds of hand-off, as the Tigon2's CPUs had:
//! - **Jobs** ([`Job`], in the common [`Area`]): data movement whose
//!   bookkeeping the queuing CPU already did — a plain frame's headers and
//!   the host segments its payload is read from, a received payload and the
//!   host segments it goes to, an ACK to put on the wire, a receive's CQE
//!   and the CQ slot the program took for it. The CPU that
//!   takes a job touches no record of the program: where the NIC runs its
//!   CPUs on threads, it runs its jobs without the program's lock
//!   ([`Area::run_jobs`]), beside the other CPU's steps. This is the state
//!   each CPU owns: its job queue, its frame scratch, its failures.
//! - **Work** ([`Work`], in the program's [`Queues`]): steps that read or
//!   change records (an ACK's send-record update, frames built from a
//!   collective's or remote access's state, a receive whose payload was too
//!   scattered for a job, and its completion); the CPU
//!   runs them holding the program (the thesis' semaphore).
//!
//! Jobs are used once a driver running the CPUs on threads takes the area
//! (`Config::cpu_jobs`; the swarm turns it on for half its seeds): on one
//! thread, a job only costs a copy more than the work it replaces.
//!
//! A CPU runs its jobs before its work, so everything queued to it keeps
//! the order that matters: a record's payloads before its completion, an
//! owed ACK before the frame that answers it (with jobs, an ACK for
//! another CPU is always a job; without, both are work in one queue).
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use emp_uapi::desc::{Cqe, Status};
use emp_uapi::fwabi::HostSeg;
use emp_uapi::image::cpu_plan;
use emp_uapi::sram::counter;
use emp_uapi::wire::{AckBody, FrameHeader, MsgHeader, NackReason, MTU_MAX};
use emp_uapi::Le;

use emp_uapi::sram::Layout;

use crate::mr::{Buf, HostSegs, MrCache};
use crate::ring::{Consumer, Producer, Ring};

use crate::{Config, Hal, Nic};

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
    /// Put an ACK/NACK on the wire (as [`Job::Control`], without jobs).
    Control { hdr: FrameHeader, body: AckBody },
    /// Update the send record an ACK (or, with `nack`, a NACK) names
    /// (DSR: classified on the other CPU).
    Ack { hdr: FrameHeader, body: AckBody, nack: Option<NackReason> },
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

/// The headers of a data frame: the frame and message headers.
pub(crate) const HEAD_MAX: usize = FrameHeader::SIZE + MsgHeader::SIZE;

/// Most host segments a job names: a frame's payload rarely spans more
/// than a page boundary or two, and a small job keeps the rings small.
const JOB_SEGS_MAX: usize = 4;

/// Host memory named by bus address, in order (at most `JOB_SEGS_MAX`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segs {
    segs: [HostSeg; JOB_SEGS_MAX],
    n: u8,
}

impl Segs {
    /// The segments gathered in `g`, unless there are too many.
    pub(crate) fn from_gathered(g: &HostSegs) -> Option<Segs> {
        if g.overflowed || g.segs.len() > JOB_SEGS_MAX {
            return None;
        }
        let mut s = Segs { segs: [HostSeg::default(); JOB_SEGS_MAX], n: g.segs.len() as u8 };
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
    /// the area's pool after), for rx record `slot` (`id`: its stamp,
    /// unique across the slot's reuse).
    Receive { slot: u32, id: u32, segs: Segs, data: Vec<u8> },
    /// Send ack: put an ACK/NACK on the wire.
    Control { hdr: FrameHeader, body: AckBody },
    /// A receive's completion: `cqe` written to `segs` (its CQ slot, taken
    /// by the program), then the port's interrupt raised if the host armed
    /// it (SRAM word `arm`). It follows the receive's payload jobs (`rx`:
    /// its record's slot and stamp), and says `DmaError` if one failed.
    Complete { rx: (u32, u32), port: u16, cqe: Cqe, segs: Segs, arm: u32 },
}

/// A job whose DMA failed, for its CPU to report holding the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failed {
    /// The send of tx record `slot` (message `seq`) fails with a DMA error.
    Transmit { slot: u32, seq: u32 },
    /// The receive of rx record `slot` (stamp `id`) fails with one.
    Receive { slot: u32, id: u32 },
    /// A receive completed by a job on `port` went wrong after its record
    /// retired: a payload's DMA failed (`failed`: the job turned its
    /// success into `DmaError`), or the CQE could not be written
    /// (`!written`: the host unmapped its CQ).
    Completion { port: u16, failed: bool, written: bool },
}

/// What one CPU owns while it runs its jobs.
#[derive(Debug)]
struct Runner {
    /// The right to take this CPU's jobs.
    jobs: Consumer,
    /// The right to give payload buffers back to the program.
    returned: Producer,
    /// One frame of scratch: a frame is built here from its headers and
    /// the payload read from host memory.
    frame: Vec<u8>,
    /// Failed jobs not yet reported (at most `JOBS_MAX` between two
    /// reports: a run takes at most that many).
    failed: Vec<Failed>,
    /// Per rx record slot: the record (its stamp) whose payload DMA failed
    /// here, for its completion job to report (it may be retired by then).
    rx_failed: Vec<Option<u32>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic inside a job is reported as a crash of the program.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The common area of a NIC's CPUs: their job queues, what each owns to
/// run them, and the payload buffers they give back. Shared by the program
/// (which queues jobs, holding itself) and by a CPU running its jobs
/// without the program. The queues are single-producer single-consumer
/// rings (`ring.rs`): the program holds their producer side, a CPU's runner
/// (one mutex per CPU, taken per batch of jobs) their consumer side.
#[derive(Debug)]
pub struct Area {
    jobs: [Ring<Job>; 2],
    /// Payload buffers a CPU's jobs are done with, back to the program.
    returned: [Ring<Vec<u8>>; 2],
    runners: [Mutex<Runner>; 2],
    /// Per CPU: work waits in the program's queue (written holding the
    /// program), or failed jobs wait to be reported (written holding the
    /// CPU's runner). Either way the CPU must take the program.
    work_waiting: [AtomicBool; 2],
    failed: [AtomicBool; 2],
    /// Jobs run so far, all CPUs (added once per batch).
    jobs_run: AtomicU64,
}

/// The program's side of an [`Area`].
#[derive(Debug)]
struct AreaTokens {
    jobs: [Producer; 2],
    returned: [Consumer; 2],
}

impl Area {
    /// The area of `plan`'s CPUs, for a program of `rx_max` receive records.
    fn new(plan: u32, rx_max: u32) -> (Area, AreaTokens) {
        let two = cpus(plan) > 1;
        let rx_slots = if two { rx_max as usize } else { 0 };
        let (jobs, frame) = if two { (JOBS_MAX, MTU_MAX as usize) } else { (0, 0) };
        let (j0, jp0, jc0) = Ring::new(jobs);
        let (j1, jp1, jc1) = Ring::new(jobs);
        let (r0, rp0, rc0) = Ring::new(jobs + PAYLOAD_BUFS);
        let (r1, rp1, rc1) = Ring::new(jobs + PAYLOAD_BUFS);
        let runner = |jobs_c, returned| {
            Mutex::new(Runner {
                jobs: jobs_c,
                returned,
                frame: vec![0; frame],
                failed: Vec::with_capacity(jobs),
                rx_failed: vec![None; rx_slots],
            })
        };
        let area = Area {
            jobs: [j0, j1],
            returned: [r0, r1],
            runners: [runner(jc0, rp0), runner(jc1, rp1)],
            work_waiting: Default::default(),
            failed: Default::default(),
            jobs_run: AtomicU64::new(0),
        };
        (area, AreaTokens { jobs: [jp0, jp1], returned: [rc0, rc1] })
    }

    /// Jobs run so far, every CPU.
    pub fn jobs_run(&self) -> u64 {
        self.jobs_run.load(Ordering::Relaxed)
    }

    /// Jobs waiting for `cpu`.
    pub fn jobs_pending(&self, cpu: usize) -> usize {
        self.jobs.get(cpu).map_or(0, |q| q.len())
    }

    /// `cpu` has failed jobs to report (the program's).
    pub(crate) fn failed_jobs(&self, cpu: usize) -> bool {
        cpu < 2 && self.failed[cpu].load(Ordering::Acquire)
    }

    /// `cpu` has work that needs the program: queued work or failed jobs.
    pub fn wants_program(&self, cpu: usize) -> bool {
        cpu < 2 && (self.work_waiting[cpu].load(Ordering::Acquire) || self.failed[cpu].load(Ordering::Acquire))
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
            let Some(job) = self.jobs[cpu].pop(&mut r.jobs) else { break };
            ran += 1;
            self.run(hal, cpu, r, job);
        }
        if ran > 0 {
            self.jobs_run.fetch_add(ran as u64, Ordering::Relaxed);
        }
        ran
    }

    /// Runs `job` as CPU `cpu`, holding its runner `r`.
    fn run<H: Hal>(&self, hal: &mut H, cpu: usize, r: &mut Runner, job: Job) {
        let failed = match job {
            Job::Transmit { slot, seq, dst, head, head_len, segs, in_place } => {
                hal.cpu_step(cpu as u8, CpuStep::Transmission, true);
                let head = &head[..head_len as usize];
                let sent = if in_place {
                    hal.mac_transmit_host(dst, head, segs.as_slice()).is_ok()
                } else {
                    frame_from_host(hal, &mut r.frame, head, segs.as_slice())
                        .map(|n| hal.mac_transmit(dst, &r.frame[..n]))
                        .is_some()
                };
                (!sent).then_some(Failed::Transmit { slot, seq })
            }
            Job::Receive { slot, id, segs, data } => {
                hal.cpu_step(cpu as u8, CpuStep::RecvFrame, true);
                hal.cpu_step(cpu as u8, CpuStep::Receiving, false);
                let ok = segs_write(hal, segs.as_slice(), 0, &data);
                // Past the ring's room (buffers made when one CPU outran
                // the other), the buffer is freed.
                let _ = self.returned[cpu].push(&mut r.returned, data);
                if !ok {
                    if let Some(f) = r.rx_failed.get_mut(slot as usize) {
                        *f = Some(id);
                    }
                }
                (!ok).then_some(Failed::Receive { slot, id })
            }
            Job::Complete { rx: (slot, id), port, mut cqe, segs, arm } => {
                hal.cpu_step(cpu as u8, CpuStep::Complete, true);
                let payload_failed =
                    r.rx_failed.get_mut(slot as usize).is_some_and(|f| f.take_if(|s| *s == id).is_some());
                let failed = payload_failed && cqe.status == Status::Success as u8;
                if failed {
                    cqe.status = Status::DmaError as u8;
                }
                let ok =
                    crate::cq::publish_cqe(hal, &cqe, |hal, off, bytes| segs_write(hal, segs.as_slice(), off, bytes));
                if ok {
                    raise_if_armed(hal, arm as usize, port);
                }
                (failed || !ok).then_some(Failed::Completion { port, failed, written: ok })
            }
            Job::Control { hdr, body } => {
                hal.cpu_step(cpu as u8, CpuStep::SendAck, true);
                put_control(hal, &hdr, &body);
                None
            }
        };
        if let Some(f) = failed {
            r.failed.push(f);
            self.failed[cpu].store(true, Ordering::Release);
        }
    }

    /// Takes `cpu`'s failed jobs (holding the program).
    fn take_failed(&self, cpu: usize, out: &mut Vec<Failed>) {
        if !self.failed[cpu].load(Ordering::Acquire) {
            return;
        }
        let mut r = lock(&self.runners[cpu]);
        out.append(&mut r.failed);
        self.failed[cpu].store(false, Ordering::Release);
    }

    /// Says whether `cpu` has work in the program's queue (holding it).
    fn set_work_waiting(&self, cpu: usize, waiting: bool) {
        let w = &self.work_waiting[cpu];
        if w.load(Ordering::Relaxed) != waiting {
            w.store(waiting, Ordering::Release);
        }
    }
}

/// Raises `port`'s interrupt if the host armed it (SRAM word `arm`), and
/// disarms it: one interrupt per arming.
pub(crate) fn raise_if_armed<H: Hal>(hal: &mut H, arm: usize, port: u16) {
    if crate::sram_u32(hal, arm) != 0 {
        crate::sram_put_u32(hal, arm, 0);
        hal.raise_interrupt(1 + port);
    }
}

/// Writes `data` to the host memory `segs` names, from byte `off` of it;
/// whether every byte was written.
fn segs_write<H: Hal>(hal: &mut H, segs: &[HostSeg], off: usize, data: &[u8]) -> bool {
    let (mut skip, mut at) = (off, 0);
    for s in segs {
        let len = s.len as usize;
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = (len - skip).min(data.len() - at);
        if hal.dma_write(s.addr + skip as u64, &data[at..at + n]).is_err() {
            return false;
        }
        (skip, at) = (0, at + n);
        if at == data.len() {
            return true;
        }
    }
    at == data.len()
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

/// The per-CPU work queues, and the program's side of the area shared
/// with the CPUs.
#[derive(Debug)]
pub(crate) struct Queues {
    q: [VecDeque<Work>; 2],
    area: Arc<Area>,
    tokens: AreaTokens,
    /// Payload buffers for queued receives (`PAYLOAD_BUFS` made at boot).
    payloads: Vec<Vec<u8>>,
    /// Failed jobs being reported (scratch, `JOBS_MAX`).
    failed: Vec<Failed>,
    /// Work each CPU ran (steps holding the program).
    work_run: [u64; 2],
    /// CPUs past A run their jobs on threads of their own, without the
    /// program ([`Nic::cpu_area`]): holding it, they run them only when
    /// work must follow them.
    jobs_outside: bool,
}

impl Queues {
    /// Where `step` runs when CPU `cpu` reaches it under `cfg`'s plan:
    /// `Some(cpu)` to queue it there, `None` to run it now (its cost is
    /// then reported to `hal` here; a queued one's when it runs).
    /// Transmission is preceded by the frame's send bookkeeping, always here.
    pub(crate) fn dispatch<H: Hal>(&self, hal: &mut H, cfg: &Config, cpu: u8, step: Step) -> Option<u8> {
        if step == Step::Transmission {
            hal.cpu_step(cpu, CpuStep::SendBookkeep, false);
        }
        if let Some(to) = self.queued_to(cfg, cpu, step) {
            return Some(to);
        }
        let here = match step {
            Step::Transmission => CpuStep::Transmission,
            Step::Receiving => {
                hal.cpu_step(cpu, CpuStep::RecvFrame, false);
                CpuStep::Receiving
            }
            Step::SendAck => CpuStep::SendAck,
            Step::Classify => CpuStep::RecvBookkeep,
            Step::AckUpdate => CpuStep::RecvAckUpdate,
        };
        hal.cpu_step(cpu, here, false);
        None
    }

    /// Where [`Queues::dispatch`] would queue `step` (`None`: it runs
    /// here, now), without reporting anything.
    pub(crate) fn queued_to(&self, cfg: &Config, cpu: u8, step: Step) -> Option<u8> {
        let to = cpu_of(cfg.cpu_plan, step);
        // A CPU past A queues its own payload DMAs as jobs too: they then
        // run after it lets go of the program (DSR's B receives the frames
        // it classifies), beside the other CPU's steps.
        let job_here = to == cpu && to != 0 && cfg.cpu_jobs && step == Step::Receiving;
        ((to != cpu || job_here) && self.q[to as usize].len() < QUEUE_MAX).then_some(to)
    }

    /// Send ack on `cpu`, which `dispatch` gave.
    pub(crate) fn enqueue_control<H: Hal>(
        &mut self,
        hal: &mut H,
        cfg: &Config,
        cpu: u8,
        hdr: &FrameHeader,
        body: &AckBody,
    ) {
        if cfg.cpu_jobs {
            self.push_job(hal, cpu, Job::Control { hdr: *hdr, body: *body });
        } else {
            self.enqueue(hal, cpu, Work::Control { hdr: *hdr, body: *body });
        }
    }

    /// Queues `job` for `cpu`; when its queue is full, runs what waits
    /// there first (in order: a CPU's jobs never overtake one another).
    pub(crate) fn push_job<H: Hal>(&mut self, hal: &mut H, cpu: u8, job: Job) {
        let c = cpu as usize;
        let mut job = job;
        while let Err(j) = self.area.jobs[c].push(&mut self.tokens.jobs[c], job) {
            if self.area.run_jobs(hal, c) == 0 {
                // No queue at all (a one-CPU plan): run it here.
                self.area.run(hal, c, &mut lock(&self.area.runners[c]), j);
                break;
            }
            job = j;
        }
        hal.cpu_event(cpu, 1);
    }

    /// The common area (its jobs run without the program, and without
    /// the semaphore).
    pub(crate) fn area(&self) -> Arc<Area> {
        self.area.clone()
    }

    /// The first of `cpu`'s work if it is receive ack's send-record half
    /// (`Work::Ack`): the ACK's or NACK's header, body and reason.
    pub(crate) fn peek_ack(&self, cpu: u8) -> Option<(FrameHeader, AckBody, Option<NackReason>)> {
        let Some(&Work::Ack { hdr, body, nack }) = self.q[cpu as usize].front() else { return None };
        Some((hdr, body, nack))
    }

    /// Drops the first of `cpu`'s work (taken after [`Queues::peek_ack`]).
    pub(crate) fn pop_work(&mut self, cpu: u8) {
        self.q[cpu as usize].pop_front();
    }

    /// `cpu` ran `n` of its work outside the program (`Nic::send_side_cpu`).
    pub(crate) fn ran_work(&mut self, cpu: u8, n: usize) {
        let c = cpu as usize;
        self.work_run[c] += n as u64;
        self.area.set_work_waiting(c, !self.q[c].is_empty());
    }

    /// `cpu` has work waiting in its queue.
    pub(crate) fn has_work(&self, cpu: u8) -> bool {
        !self.q[cpu as usize].is_empty()
    }

    /// The CPUs with work or jobs waiting, one bit each.
    pub(crate) fn waiting(&self) -> u32 {
        (0..self.q.len())
            .filter(|&c| !self.q[c].is_empty() || self.area.jobs_pending(c) > 0 || self.area.wants_program(c))
            .fold(0, |m, c| m | 1 << c)
    }

    /// `cpu`'s work queue is at its bound: a step for it runs inline.
    pub(crate) fn full(&self, cpu: u8) -> bool {
        self.q[cpu as usize].len() >= QUEUE_MAX
    }

    /// Queues work `w` for `cpu`: a step it runs holding the program.
    pub(crate) fn enqueue<H: Hal>(&mut self, hal: &mut H, cpu: u8, w: Work) {
        self.q[cpu as usize].push_back(w);
        self.area.set_work_waiting(cpu as usize, true);
        hal.cpu_event(cpu, 1);
    }

    /// Queues for `plan`; job queues and payload buffers only when it uses
    /// two CPUs.
    pub(crate) fn new(plan: u32, rx_max: u32) -> Queues {
        let two = cpus(plan) > 1;
        let (area, tokens) = Area::new(plan, rx_max);
        let bufs = if two { PAYLOAD_BUFS } else { 0 };
        Queues {
            q: Default::default(),
            area: Arc::new(area),
            tokens,
            payloads: (0..bufs).map(|_| Vec::with_capacity(MTU_MAX as usize)).collect(),
            failed: Vec::with_capacity(if two { JOBS_MAX } else { 0 }),
            work_run: [0; 2],
            jobs_outside: false,
        }
    }

    /// A payload buffer holding `data`: a free one, one a CPU gave back, or
    /// (one CPU outran the other) a new one.
    pub(crate) fn take_payload(&mut self, data: &[u8]) -> Vec<u8> {
        if self.payloads.is_empty() {
            for (ring, c) in self.area.returned.iter().zip(&mut self.tokens.returned) {
                while let Some(b) = ring.pop(c) {
                    self.payloads.push(b);
                }
            }
        }
        let mut buf = self.payloads.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        buf
    }
}

impl Nic {
    /// Where `step` runs: `Some(cpu)` to queue it there, `None` to run it
    /// now ([`Queues::dispatch`]).
    pub(crate) fn dispatch<H: Hal>(&mut self, hal: &mut H, step: Step) -> Option<u8> {
        self.queues.dispatch(hal, &self.cfg, self.cpu, step)
    }

    /// The CPU frames arrive on (a driver runs `handle_frame` there).
    pub fn frame_cpu(&self) -> usize {
        cpu_of(self.cfg.cpu_plan, Step::Classify) as usize
    }

    /// The common area of this NIC's CPUs, for a driver that runs a CPU's
    /// jobs without the program ([`Area::run_jobs`]): from now on, data
    /// movement goes to another CPU as jobs ([`crate::Config::cpu_jobs`]).
    pub fn cpu_area(&mut self) -> Arc<Area> {
        self.cfg.cpu_jobs = true;
        self.queues.jobs_outside = true;
        self.queues.area.clone()
    }

    /// Jobs this NIC's CPUs ran so far.
    pub fn cpu_jobs_run(&self) -> u64 {
        self.queues.area.jobs_run()
    }

    /// Work queued for CPU `cpu` that it ran so far: steps it took the
    /// program for (failed jobs' reports included).
    pub fn cpu_work_run(&self, cpu: usize) -> u64 {
        self.queues.work_run.get(cpu).copied().unwrap_or(0)
    }

    /// Receive ack: whole on this CPU, or (DSR) classified here and the send
    /// record updated on the send CPU.
    pub(crate) fn recv_ack<H: Hal>(&mut self, hal: &mut H, now: u64, hdr: &FrameHeader, body: &AckBody) {
        if !self.recv_cpu().classify_ack(hal, hdr, body, None) {
            hal.cpu_step(self.cpu, CpuStep::RecvAck, false);
            self.on_ack(hal, now, hdr, body);
        }
    }

    /// A NACK frame, the same way: classified and handed over under DSR.
    pub(crate) fn recv_nack<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        hdr: &FrameHeader,
        body: &AckBody,
        reason: NackReason,
    ) {
        if !self.recv_cpu().classify_ack(hal, hdr, body, Some(reason)) {
            hal.cpu_step(self.cpu, CpuStep::RecvAck, false);
            self.on_nack(hal, now, hdr, body, reason);
        }
    }

    /// Runs every CPU's queued jobs here, after waiting for a CPU running
    /// its own: afterwards no job names host memory by an old translation
    /// (`MrFence`).
    pub(crate) fn drain_jobs<H: Hal>(&mut self, hal: &mut H) {
        for cpu in 0..self.cpus() {
            self.queues.area.drain(hal, cpu);
        }
    }

    /// NIC CPUs in use.
    pub fn cpus(&self) -> usize {
        cpus(self.cfg.cpu_plan) as usize
    }

    /// Steps waiting for `cpu`: its work, jobs and failed jobs.
    pub fn cpu_pending(&self, cpu: usize) -> usize {
        let Some(q) = self.queues.q.get(cpu) else { return 0 };
        let area = &self.queues.area;
        q.len() + area.jobs_pending(cpu) + usize::from(area.failed[cpu].load(Ordering::Acquire))
    }

    /// Runs CPU `cpu`'s queued steps: its jobs, then the failures of its
    /// jobs, then its work; returns how many ran.
    pub fn handle_cpu<H: Hal>(&mut self, hal: &mut H, now: u64, cpu: usize) -> usize {
        if cpu >= self.queues.q.len() {
            return 0;
        }
        let prev = core::mem::replace(&mut self.cpu, cpu as u8);
        self.after_sides(hal, now);
        // Jobs go before work; with no work, a CPU whose thread runs its
        // jobs without the program leaves them to it.
        let leave = self.queues.jobs_outside && cpu != 0 && self.queues.q[cpu].is_empty();
        let mut ran = if leave { 0 } else { self.queues.area.run_jobs(hal, cpu) };
        let failed = self.report_failed(hal, now, cpu);
        ran += failed;
        let n = self.queues.q[cpu].len();
        for _ in 0..n {
            let Some(w) = self.queues.q[cpu].pop_front() else { break };
            self.run_work(hal, now, w);
        }
        ran += n;
        self.queues.work_run[cpu] += (n + failed) as u64;
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
                    if self.send.tx.get(slot).is_some_and(|m| m.seq == seq) {
                        self.finish_tx(hal, now, slot, Status::DmaError);
                    }
                }
                Failed::Receive { slot, id } => {
                    if self.recv.rx.get(slot).is_some_and(|m| m.stamp == id) {
                        self.recv_cpu().rx_error(slot, Status::DmaError);
                    }
                }
                Failed::Completion { port, failed, written } => {
                    if failed {
                        // It was counted as received when its record retired.
                        self.count(counter::MSGS_FAILED, 1);
                        self.uncount(counter::MSGS_RX, 1);
                    }
                    if !written {
                        crate::cq::cq_overrun(hal, &self.layout, port);
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
            Work::Control { .. } => CpuStep::SendAck,
            Work::Ack { .. } => CpuStep::RecvAckUpdate,
        };
        hal.cpu_step(self.cpu, step, true);
        match w {
            Work::Transmit { slot, seq, frame, retransmit } => {
                if self.send.tx.get(slot).is_some_and(|m| m.seq == seq) {
                    if let Err(st) = self.send_frame(hal, slot, frame, retransmit) {
                        self.finish_tx(hal, now, slot, st);
                    }
                }
            }
            Work::Receive { slot, seq, off, data } => {
                hal.cpu_step(self.cpu, CpuStep::Receiving, false);
                if let Some(m) = self.recv.rx.get(slot).filter(|m| m.seq == seq) {
                    let (port, desc) = (m.port, m.desc);
                    let to = Buf::ToHost(&data);
                    if let Err(e) = self.sge_io(hal, port, desc.sges(), off, to, emp_uapi::desc::MR_LOCAL_WRITE) {
                        self.recv_cpu().rx_error(slot, e);
                    }
                }
                self.queues.payloads.push(data);
            }
            Work::Finish { slot, seq } => {
                if self.recv.rx.get(slot).is_some_and(|m| m.seq == seq) {
                    self.finish_rx(hal, now, slot, None);
                }
            }
            Work::Control { hdr, body } => put_control(hal, &hdr, &body),
            Work::Ack { hdr, body, nack } => {
                // The port may have closed since the ACK was classified.
                if self.ports.get(hdr.dst_port as usize).is_some_and(|p| p.open) {
                    match nack {
                        None => self.on_ack(hal, now, &hdr, &body),
                        Some(reason) => self.on_nack(hal, now, &hdr, &body, reason),
                    }
                }
            }
        }
    }
}

/// The host segments of `len` bytes at message offset `off` of `desc`'s
/// buffers on `port`, checked for `access` through `mr`, gathered in
/// `scratch`: `None` when more than a job names.
#[allow(clippy::too_many_arguments)]
pub(crate) fn job_segs<H: Hal>(
    hal: &mut H,
    mr: &mut MrCache,
    layout: &Layout,
    scratch: &mut HostSegs,
    port: u16,
    desc: &crate::LocalDesc,
    off: u64,
    len: usize,
    access: u8,
) -> Result<Option<Segs>, Status> {
    scratch.clear();
    let r = mr.sge_io(hal, layout, port, desc.sges(), off, Buf::Gather(len, scratch), access);
    r.map(|()| Segs::from_gathered(scratch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DmaError;
    use emp_uapi::desc::CQE_FLAGS_OFFSET;
    use emp_uapi::wire::FrameKind;

    /// Host memory of 4 KiB at bus address 0x1000; the rest refuses DMA.
    /// Records what the MAC was given.
    struct Hw {
        mem: Vec<u8>,
        sent: Vec<(u16, Vec<u8>)>,
        /// The ARM word of the port (SRAM offset `ARM`), and the interrupts raised.
        armed: u32,
        raised: Vec<u16>,
    }

    const ARM: usize = 0x40;

    fn hw(mem: Vec<u8>) -> Hw {
        Hw { mem, sent: Vec::new(), armed: 0, raised: Vec::new() }
    }

    impl Hw {
        fn range(&self, addr: u64, len: usize) -> Result<core::ops::Range<usize>, DmaError> {
            let at = addr.checked_sub(0x1000).ok_or(DmaError)? as usize;
            (at + len <= self.mem.len()).then_some(at..at + len).ok_or(DmaError)
        }
    }

    impl Hal for Hw {
        fn sram_read(&mut self, off: usize, buf: &mut [u8]) {
            buf.fill(0);
            if off == ARM {
                buf[..4].copy_from_slice(&self.armed.to_le_bytes());
            }
        }
        fn sram_write(&mut self, off: usize, data: &[u8]) {
            if off == ARM {
                self.armed = u32::from_le_bytes(data[..4].try_into().unwrap());
            }
        }
        fn dma_read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
            let r = self.range(addr, buf.len())?;
            buf.copy_from_slice(&self.mem[r]);
            Ok(())
        }
        fn dma_write(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
            let r = self.range(addr, data.len())?;
            self.mem[r].copy_from_slice(data);
            Ok(())
        }
        fn dma_fence(&mut self) {}
        fn mac_transmit(&mut self, dst: u16, frame: &[u8]) {
            self.sent.push((dst, frame.to_vec()));
        }
        fn mac_transmit_host(&mut self, dst: u16, head: &[u8], segs: &[HostSeg]) -> Result<(), DmaError> {
            let mut f = head.to_vec();
            for s in segs {
                let r = self.range(s.addr, s.len as usize)?;
                f.extend_from_slice(&self.mem[r]);
            }
            self.sent.push((dst, f));
            Ok(())
        }
        fn raise_interrupt(&mut self, vector: u16) {
            self.raised.push(vector);
        }
    }

    fn segs(list: &[(u64, u64)]) -> Segs {
        let mut g = HostSegs::new();
        g.segs.extend(list.iter().map(|&(addr, len)| HostSeg { addr, len }));
        Segs::from_gathered(&g).expect("few enough")
    }

    fn head(tag: u8) -> [u8; HEAD_MAX] {
        [tag; HEAD_MAX]
    }

    #[test]
    fn jobs_run_in_order_without_the_program_and_give_their_buffers_back() {
        let (area, mut t) = Area::new(cpu_plan::SR, 8);
        let mut hw = hw((0..4096).map(|i| i as u8).collect());
        let push = |t: &mut AreaTokens, j| area.jobs[1].push(&mut t.jobs[1], j).map_err(|_| "full").unwrap();
        // A frame from two pieces of host memory, an ACK, a payload written
        // into host memory, and the same frame named in place.
        let two = segs(&[(0x1000, 8), (0x1100, 4)]);
        push(
            &mut t,
            Job::Transmit { slot: 1, seq: 7, dst: 3, head: head(0xAA), head_len: 4, segs: two, in_place: false },
        );
        let hdr = FrameHeader { kind: FrameKind::Ack as u8, dst_node: 5, ..Default::default() };
        push(&mut t, Job::Control { hdr, body: AckBody::default() });
        push(&mut t, Job::Receive { slot: 2, id: 9, segs: segs(&[(0x1800, 3)]), data: vec![9, 8, 7] });
        push(
            &mut t,
            Job::Transmit { slot: 1, seq: 7, dst: 3, head: head(0xBB), head_len: 2, segs: two, in_place: true },
        );
        assert_eq!(area.jobs_pending(1), 4);
        assert!(!area.wants_program(1), "nothing here needs the program");
        assert_eq!(area.run_jobs(&mut hw, 1), 4);
        assert_eq!(area.jobs_pending(1), 0);
        let want: Vec<u8> = [0xAA; 4].iter().copied().chain(0..8).chain(0..4).collect();
        assert_eq!(hw.sent[0], (3, want), "headers, then the payload's pieces in order");
        assert_eq!(hw.sent[1].0, 5, "the ACK to its node");
        assert_eq!(&hw.mem[0x800..0x803], &[9, 8, 7], "the payload in host memory");
        assert_eq!(hw.sent[2].1[..2], [0xBB, 0xBB], "in place: the same frame");
        assert_eq!(hw.sent[2].1[2..], hw.sent[0].1[4..]);
        assert_eq!(area.jobs_run(), 4);
        // The payload buffer came back to the program.
        assert_eq!(area.returned[1].pop(&mut t.returned[1]), Some(vec![9, 8, 7]));
    }

    #[test]
    fn a_job_whose_dma_fails_is_reported_to_the_program_once() {
        let (area, mut t) = Area::new(cpu_plan::SR, 8);
        let mut hw = hw(vec![0; 4096]);
        let outside = segs(&[(0x9000, 8)]);
        let jobs = [
            Job::Receive { slot: 2, id: 9, segs: outside, data: vec![0; 8] },
            Job::Transmit { slot: 1, seq: 7, dst: 3, head: head(1), head_len: 4, segs: outside, in_place: false },
            Job::Transmit { slot: 4, seq: 8, dst: 3, head: head(1), head_len: 4, segs: outside, in_place: true },
        ];
        for j in jobs {
            area.jobs[1].push(&mut t.jobs[1], j).map_err(|_| "full").unwrap();
        }
        assert_eq!(area.run_jobs(&mut hw, 1), 3);
        assert!(hw.sent.is_empty(), "nothing half-read goes on the wire");
        assert!(area.wants_program(1), "failures need the program");
        let mut failed = Vec::new();
        area.take_failed(1, &mut failed);
        let want = [
            Failed::Receive { slot: 2, id: 9 },
            Failed::Transmit { slot: 1, seq: 7 },
            Failed::Transmit { slot: 4, seq: 8 },
        ];
        assert_eq!(failed, want);
        assert!(!area.wants_program(1));
        area.take_failed(1, &mut failed);
        assert_eq!(failed.len(), 3, "reported once");
    }

    fn cqe(status: Status, phase: u8) -> Cqe {
        Cqe { wr_id: 0x77, byte_len: 3, status: status as u8, flags: phase, ..Default::default() }
    }

    #[test]
    fn a_receive_completes_after_its_payload_without_the_program() {
        let (area, mut t) = Area::new(cpu_plan::RO, 8);
        let mut hw = hw(vec![0; 4096]);
        hw.armed = 1;
        let push = |t: &mut AreaTokens, j| area.jobs[1].push(&mut t.jobs[1], j).map_err(|_| "full").unwrap();
        push(&mut t, Job::Receive { slot: 2, id: 9, segs: segs(&[(0x1800, 3)]), data: vec![9, 8, 7] });
        // The CQE's slot in two pieces (the phase byte alone in the second).
        let slot = segs(&[(0x1100, CQE_FLAGS_OFFSET as u64), (0x1200, 1)]);
        push(&mut t, Job::Complete { rx: (2, 9), port: 3, cqe: cqe(Status::Success, 1), segs: slot, arm: ARM as u32 });
        assert!(!area.wants_program(1));
        assert_eq!(area.run_jobs(&mut hw, 1), 2);
        assert_eq!(&hw.mem[0x800..0x803], &[9, 8, 7]);
        let mut b = [0u8; Cqe::SIZE];
        b[..CQE_FLAGS_OFFSET].copy_from_slice(&hw.mem[0x100..0x100 + CQE_FLAGS_OFFSET]);
        b[CQE_FLAGS_OFFSET] = hw.mem[0x200];
        assert_eq!(Cqe::get(&b), cqe(Status::Success, 1), "the entry, phase byte included");
        assert_eq!((hw.armed, hw.raised.as_slice()), (0, &[4][..]), "the armed port's interrupt, once");
        assert!(!area.wants_program(1), "nothing to report");
    }

    #[test]
    fn a_completion_after_a_failed_payload_says_so_and_a_lost_cqe_is_reported() {
        let (area, mut t) = Area::new(cpu_plan::RO, 8);
        let mut hw = hw(vec![0; 4096]);
        let push = |t: &mut AreaTokens, j| area.jobs[1].push(&mut t.jobs[1], j).map_err(|_| "full").unwrap();
        let at = segs(&[(0x1100, Cqe::SIZE as u64)]);
        let jobs = [
            Job::Receive { slot: 2, id: 9, segs: segs(&[(0x9000, 3)]), data: vec![1; 3] },
            // Another record's completion in that slot is not affected.
            Job::Complete { rx: (2, 8), port: 3, cqe: cqe(Status::Success, 1), segs: at, arm: ARM as u32 },
            Job::Complete { rx: (2, 9), port: 3, cqe: cqe(Status::Success, 1), segs: at, arm: ARM as u32 },
            // A CQ the host unmapped.
            Job::Complete { rx: (5, 1), port: 4, cqe: cqe(Status::Truncated, 1), segs: segs(&[(0x9000, 40)]), arm: 0 },
        ];
        for j in jobs {
            push(&mut t, j);
        }
        assert_eq!(area.run_jobs(&mut hw, 1), 4);
        assert_eq!(Cqe::get(&hw.mem[0x100..0x100 + Cqe::SIZE]).status, Status::DmaError as u8);
        let mut failed = Vec::new();
        area.take_failed(1, &mut failed);
        let want = [
            Failed::Receive { slot: 2, id: 9 },
            Failed::Completion { port: 3, failed: true, written: true },
            Failed::Completion { port: 4, failed: false, written: false },
        ];
        assert_eq!(failed, want);
        assert!(hw.raised.is_empty(), "nothing armed");
    }

    #[test]
    fn a_payload_in_more_pieces_than_a_job_names_is_not_a_job() {
        let mut g = HostSegs::new();
        for i in 0..JOB_SEGS_MAX as u64 + 1 {
            g.segs.push(HostSeg { addr: 0x1000 + 0x100 * i, len: 8 });
        }
        assert!(Segs::from_gathered(&g).is_none());
        g.segs.pop();
        assert_eq!(Segs::from_gathered(&g).map(|s| s.as_slice().len()), Some(JOB_SEGS_MAX));
    }
}
