//! The receive side at work: a view of the program for the CPU doing
//! receive bookkeeping (CPU B under DSR, docs/nic-cpus.md). It owns the
//! receive side's records ([`RecvSide`]), reads what the admin commands
//! set (configuration, ports, the peer table's keys), writes the CQs
//! (the one structure both sides write: the semaphore's), and hands steps
//! of other CPUs to the common area. It reaches nothing of the send side:
//! what the receive path's functions on this view touch is what CPU B
//! owns, checked by the compiler.
//!
//! The whole program builds one with [`Nic::recv_cpu`] and calls the
//! receive path through it. This file also holds the receive side's
//! hand-offs to other CPUs: a payload's DMA, and a completion written by a
//! job after it.

use emp_uapi::desc::{Cqe, Status};
use emp_uapi::sram::{ctl, Layout};
use emp_uapi::wire::{AckBody, FrameHeader};
use emp_uapi::Le;

use crate::cpu::{cpu_of, job_segs, Job, Queues, Step, Work};
use crate::cq::{Completer, Completion};
use crate::mr::{Buf, MrCache};
use crate::peer::AckHeld;
use crate::{Config, CpuStep, Cqs, Hal, Nic, Peer, Port, RecvSide};

/// The receive side and what it may reach (module doc).
pub(crate) struct RecvCpu<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) layout: &'a Layout,
    pub(crate) node: u16,
    pub(crate) mtu: u32,
    pub(crate) ports: &'a [Port],
    pub(crate) peers: &'a [Option<Peer>],
    pub(crate) peer_index: &'a crate::keymap::KeyMap<(u16, u16, u16), u32>,
    /// The CPU running it.
    pub(crate) cpu: u8,
    pub(crate) recv: &'a mut RecvSide,
    /// The program's MR cache: one for every CPU (what the thesis' and
    /// PM's figures were reproduced with), lent to the receive side.
    pub(crate) mr: &'a mut MrCache,
    pub(crate) cqs: &'a mut Cqs,
    pub(crate) queues: &'a mut Queues,
    /// The common area's word of the ACKs it holds back (it writes it).
    pub(crate) ack_held: &'a mut AckHeld,
}

impl Nic {
    /// The receive side's view of this program, on the CPU running now.
    pub(crate) fn recv_cpu(&mut self) -> RecvCpu<'_> {
        RecvCpu {
            cfg: &self.cfg,
            layout: &self.layout,
            node: self.node,
            mtu: self.mtu,
            ports: &self.ports,
            peers: &self.peers,
            peer_index: &self.peer_index,
            cpu: self.cpu,
            recv: &mut self.recv,
            mr: &mut self.mr,
            cqs: &mut self.cqs,
            queues: &mut self.queues,
            ack_held: &mut self.ack_held,
        }
    }
}

impl RecvCpu<'_> {
    pub(crate) fn count(&mut self, c: usize, n: u64) {
        self.recv.counters.add(c, n);
    }

    /// The peer table's part of live entry `i`.
    pub(crate) fn peer(&self, i: u32) -> &Peer {
        self.peers[i as usize].as_ref().expect("live peer")
    }

    pub(crate) fn peer_live(&self, i: u32) -> bool {
        self.peers.get(i as usize).is_some_and(Option::is_some)
    }

    /// Where `step` runs ([`Queues::dispatch`]).
    pub(crate) fn dispatch<H: Hal>(&mut self, hal: &mut H, step: Step) -> Option<u8> {
        self.queues.dispatch(hal, self.cfg, self.cpu, step)
    }

    /// Where `step` would be queued ([`Queues::queued_to`]).
    pub(crate) fn queued_to(&self, step: Step) -> Option<u8> {
        self.queues.queued_to(self.cfg, self.cpu, step)
    }

    /// Receive ack's first half (DSR's split, Table 3.2): when the send
    /// record's update runs on another CPU, the ACK is classified here and
    /// handed to it (`Work::Ack`); `false` when it is whole on this CPU.
    pub(crate) fn classify_ack<H: Hal>(&mut self, hal: &mut H, hdr: &FrameHeader, body: &AckBody) -> bool {
        let cpu = cpu_of(self.cfg.cpu_plan, Step::AckUpdate);
        if cpu == self.cpu || self.queues.full(cpu) {
            return false;
        }
        hal.cpu_step(self.cpu, CpuStep::RecvAckClassify, false);
        self.queues.enqueue(hal, cpu, Work::Ack { hdr: *hdr, body: *body });
        true
    }

    /// Reports a finished descriptor ([`Cqs::complete`]), counted on the
    /// receive side.
    pub(crate) fn complete<H: Hal>(&mut self, hal: &mut H, port: u16, c: Completion) {
        let by = Completer {
            layout: self.layout,
            ports: self.ports,
            cpu: self.cpu,
            mr: self.mr,
            counters: &mut self.recv.counters,
        };
        self.cqs.complete(hal, by, port, c)
    }

    /// Queues the DMA of received `data` into rx record `slot` (message
    /// `seq`) at message offset `off` on `cpu`, which `dispatch` gave: with
    /// jobs, a job when the record's buffer there is named in at most
    /// `JOB_SEGS_MAX` segments (checked here, so a bad buffer fails now);
    /// else work.
    pub(crate) fn enqueue_receive<H: Hal>(
        &mut self,
        hal: &mut H,
        cpu: u8,
        slot: u32,
        seq: u32,
        off: u64,
        data: &[u8],
    ) -> Result<(), Status> {
        if !self.cfg.cpu_jobs {
            let data = self.queues.take_payload(data);
            self.queues.enqueue(hal, cpu, Work::Receive { slot, seq, off, data });
            return Ok(());
        }
        let m = self.recv.rx.get(slot).expect("live");
        let (port, desc, id) = (m.port, m.desc, m.stamp);
        let (mr, scratch) = (&mut *self.mr, &mut self.recv.host_segs);
        let segs =
            job_segs(hal, mr, self.layout, scratch, port, &desc, off, data.len(), emp_uapi::desc::MR_LOCAL_WRITE)?;
        let data = self.queues.take_payload(data);
        match segs {
            Some(segs) => self.queues.push_job(hal, cpu, Job::Receive { slot, id, segs, data }),
            None => {
                self.recv.rx.get_mut(slot).payload_as_work = true;
                self.queues.enqueue(hal, cpu, Work::Receive { slot, seq, off, data })
            }
        }
        Ok(())
    }

    /// Host memory of the CQ's next slot on `port`, when a job can name it
    /// (checked for writing): where another CPU writes this port's next
    /// CQE without the program ([`RecvCpu::complete_on`]); `None` when a job
    /// cannot name it.
    pub(crate) fn next_cqe_segs<H: Hal>(&mut self, hal: &mut H, port: u16) -> Option<crate::cpu::Segs> {
        let cq = self.cqs.next_slot(hal, self.layout, self.ports, self.mr, port)?;
        let g = &mut self.recv.host_segs;
        g.clear();
        let r = self.mr.checked_io(hal, cq.checked, cq.off, Buf::Gather(Cqe::SIZE, g));
        r.ok().and(crate::cpu::Segs::from_gathered(g))
    }

    /// Completes a descriptor on CPU `cpu` (which `dispatch` gave) without
    /// the program: the CQ's next slot (`segs`, from
    /// [`RecvCpu::next_cqe_segs`]) is taken here, and a job writes the CQE
    /// there after the jobs queued before it (a receive's payload, `rx`
    /// naming its record: slot and stamp). The host reads its CQ in order, so
    /// an entry written after it here stays unseen until this one is.
    pub(crate) fn complete_on<H: Hal>(
        &mut self,
        hal: &mut H,
        cpu: u8,
        port: u16,
        rx: (u32, u32),
        c: Completion,
        segs: crate::cpu::Segs,
    ) {
        let Some(cqe) = self.cqs.next_cqe(hal, self.cpu, self.ports, &mut self.recv.counters, port, c) else { return };
        self.cqs.advance(hal, self.layout, port);
        let arm = self.layout.port(port).ctl(ctl::ARM) as u32;
        self.queues.push_job(hal, cpu, crate::cpu::Job::Complete { rx, port, cqe, segs, arm });
    }
}
