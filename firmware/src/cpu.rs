//! NIC CPUs (EMP thesis ch. 3). The control program's steps are assigned to
//! CPU A (0) or CPU B (1) by the plan chosen at boot; a step that belongs to
//! the other CPU is queued there (the thesis' cross-CPU event through the
//! common area) instead of running inline. Every CPU of a NIC runs on the
//! host thread that drives the NIC, one after the other: the queues change
//! which step runs when, exactly as the thesis' pipelining does, while the
//! state stays one structure (the thesis' single semaphore).
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

use emp_uapi::image::cpu_plan;
use emp_uapi::wire::{AckBody, FrameHeader};

use crate::mr::Buf;
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

/// Work queued for another CPU.
#[derive(Debug)]
pub(crate) enum Work {
    /// Send frame `frame` of tx record `slot` (message `seq`).
    Transmit { slot: u32, seq: u32, frame: u32, retransmit: bool },
    /// DMA a received payload into rx record `slot` at message offset
    /// `off` (`data` is one of `Queues`' payload buffers, returned after).
    Receive { slot: u32, seq: u32, off: u64, data: Vec<u8> },
    /// Every frame of rx record `slot` is in: complete the receive.
    Finish { slot: u32, seq: u32 },
    /// Put an ACK/NACK on the wire.
    Control { hdr: FrameHeader, body: AckBody },
    /// Update the send record an ACK names (DSR: classified on the other CPU).
    Ack { hdr: FrameHeader, body: AckBody },
}

/// Bound of each queue: beyond it a step runs inline (never dropped).
pub(crate) const QUEUE_MAX: usize = 1 << 16;

/// Payload buffers for queued receive steps. Both drivers run the other
/// CPU's queue after every call, and a call takes in at most one frame, so
/// one or two are in use at a time.
const PAYLOAD_BUFS: usize = 16;

/// The per-CPU queues.
#[derive(Debug)]
pub(crate) struct Queues {
    q: [VecDeque<Work>; 2],
    /// Free payload buffers (`mtu` bytes each, made at boot): a received
    /// frame waiting for the other CPU's DMA is copied into one, so the
    /// receive path does not allocate per frame.
    payloads: Vec<Vec<u8>>,
}

impl Queues {
    /// Queues for `plan`; payload buffers only when it moves receiving to
    /// another CPU.
    pub(crate) fn new(plan: u32, mtu: u32) -> Queues {
        let bufs = if cpus(plan) > 1 { PAYLOAD_BUFS } else { 0 };
        Queues { q: Default::default(), payloads: (0..bufs).map(|_| Vec::with_capacity(mtu as usize)).collect() }
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
    /// `seq`) at message offset `off` on `cpu`, which `dispatch` gave.
    pub(crate) fn enqueue_receive<H: Hal>(&mut self, hal: &mut H, cpu: u8, slot: u32, seq: u32, off: u64, data: &[u8]) {
        // Past the pool (a driver that let the queue grow), a new buffer:
        // the step must still be queued, in order with the record's finish.
        let mut buf = self.queues.payloads.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        self.enqueue(hal, cpu, Work::Receive { slot, seq, off, data: buf });
    }

    pub(crate) fn enqueue<H: Hal>(&mut self, hal: &mut H, cpu: u8, w: Work) {
        self.queues.q[cpu as usize].push_back(w);
        hal.cpu_event(cpu, 1);
    }

    /// NIC CPUs in use.
    pub fn cpus(&self) -> usize {
        cpus(self.cfg.cpu_plan) as usize
    }

    /// Work waiting for `cpu`.
    pub fn cpu_pending(&self, cpu: usize) -> usize {
        self.queues.q.get(cpu).map_or(0, |q| q.len())
    }

    /// Runs CPU `cpu`'s queued steps; returns how many ran.
    pub fn handle_cpu<H: Hal>(&mut self, hal: &mut H, now: u64, cpu: usize) -> usize {
        let Some(n) = self.queues.q.get(cpu).map(|q| q.len()) else { return 0 };
        let prev = core::mem::replace(&mut self.cpu, cpu as u8);
        for _ in 0..n {
            let Some(w) = self.queues.q[cpu].pop_front() else { break };
            self.run_work(hal, now, w);
        }
        self.send_ready_peers(hal, now);
        self.cpu = prev;
        self.publish(hal);
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
                self.queues.payloads.push(data);
            }
            Work::Finish { slot, seq } => {
                if self.rx.get(slot).is_some_and(|m| m.seq == seq) {
                    self.finish_rx(hal, now, slot, None);
                }
            }
            Work::Control { hdr, body } => self.put_control(hal, &hdr, &body),
            Work::Ack { hdr, body } => {
                // The port may have closed since the ACK was classified.
                if self.ports.get(hdr.dst_port as usize).is_some_and(|p| p.open) {
                    self.on_ack(hal, now, &hdr, &body);
                }
            }
        }
    }
}
