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

use core::ptr::{addr_of, addr_of_mut};

use emp_uapi::desc::{Cqe, Status};
use emp_uapi::sram::{ctl, Layout};
use emp_uapi::wire::{AckBody, FrameHeader, NackReason};
use emp_uapi::Le;

use crate::cpu::{cpu_of, job_segs, Job, Step, Work};
use crate::cq::{Completer, Completion};
use crate::mr::Buf;
use crate::peer::AckHeld;
use crate::sem::{Guard, Shared};
use crate::{Config, CpuStep, Hal, Nic, Peer, Port, RecvSide};

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
    /// What both sides write: the CQs, the program's MR cache (one for
    /// every CPU, what the thesis' and PM's figures were reproduced with),
    /// the hand-offs to other CPUs.
    pub(crate) shared: Shared<'a>,
    /// The common area's word of the ACKs it holds back (it writes it).
    pub(crate) ack_held: &'a AckHeld,
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
            shared: Shared::Held { cqs: &mut self.cqs, mr: &mut self.mr, queues: &mut self.queues },
            ack_held: &self.ack_held,
        }
    }
}

impl<'a> RecvCpu<'a> {
    /// The receive side's view for a CPU running it alone, beside the
    /// send side's (`crate::sides`): built from the program's fields, never
    /// a reference to the whole program; what both sides write is taken
    /// through the semaphore per access.
    ///
    /// # Safety
    /// `this` is live, and while the view lives nothing reaches the
    /// receive side or runs the whole program; the send side's view may
    /// (it reaches none of these fields mutably but the semaphore's, and
    /// the atomics of the common area).
    pub(crate) unsafe fn alone(this: *mut Nic, cpu: u8) -> RecvCpu<'a> {
        // SAFETY: per the contract above, these fields are read by others
        // at most, the receive side is ours, and the semaphore's fields are
        // reached only through it.
        unsafe {
            RecvCpu {
                cfg: &*addr_of!((*this).cfg),
                layout: &*addr_of!((*this).layout),
                node: *addr_of!((*this).node),
                mtu: *addr_of!((*this).mtu),
                ports: &*addr_of!((*this).ports),
                peers: &*addr_of!((*this).peers),
                peer_index: &*addr_of!((*this).peer_index),
                cpu,
                recv: &mut *addr_of_mut!((*this).recv),
                shared: Shared::taken(this),
                ack_held: &*addr_of!((*this).ack_held),
            }
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
        self.shared.lock().queues.dispatch(hal, self.cfg, self.cpu, step)
    }

    /// Where `step` would be queued ([`Queues::queued_to`]).
    pub(crate) fn queued_to(&mut self, step: Step) -> Option<u8> {
        self.shared.lock().queues.queued_to(self.cfg, self.cpu, step)
    }

    /// Receive ack's first half (DSR's split, Table 3.2): when the send
    /// record's update runs on another CPU, the ACK is classified here and
    /// handed to it (`Work::Ack`); `false` when it is whole on this CPU.
    pub(crate) fn classify_ack<H: Hal>(
        &mut self,
        hal: &mut H,
        hdr: &FrameHeader,
        body: &AckBody,
        nack: Option<NackReason>,
    ) -> bool {
        let cpu = cpu_of(self.cfg.cpu_plan, Step::AckUpdate);
        if cpu == self.cpu {
            return false;
        }
        let c = self.shared.lock();
        if c.queues.full(cpu) {
            return false;
        }
        hal.cpu_step(self.cpu, CpuStep::RecvAckClassify, false);
        c.queues.enqueue(hal, cpu, Work::Ack { hdr: *hdr, body: *body, nack });
        true
    }

    /// Reports a finished descriptor ([`Cqs::complete`]), counted on the
    /// receive side.
    pub(crate) fn complete<H: Hal>(&mut self, hal: &mut H, port: u16, c: Completion) {
        let g = self.shared.lock();
        let by = Completer {
            layout: self.layout,
            ports: self.ports,
            cpu: self.cpu,
            mr: g.mr,
            counters: &mut self.recv.counters,
        };
        g.cqs.complete(hal, by, port, c)
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
        let g = self.shared.lock();
        if !self.cfg.cpu_jobs {
            let data = g.queues.take_payload(data);
            g.queues.enqueue(hal, cpu, Work::Receive { slot, seq, off, data });
            return Ok(());
        }
        let m = self.recv.rx.get(slot).expect("live");
        let (port, desc, id) = (m.port, m.desc, m.stamp);
        let scratch = &mut self.recv.host_segs;
        let segs =
            job_segs(hal, g.mr, self.layout, scratch, port, &desc, off, data.len(), emp_uapi::desc::MR_LOCAL_WRITE)?;
        let data = g.queues.take_payload(data);
        match segs {
            Some(segs) => g.queues.push_job(hal, cpu, Job::Receive { slot, id, segs, data }),
            None => {
                self.recv.rx.get_mut(slot).payload_as_work = true;
                g.queues.enqueue(hal, cpu, Work::Receive { slot, seq, off, data })
            }
        }
        Ok(())
    }

    /// Completes receive record `r` on CPU `cpu` without the program when
    /// a job can name the CQ's next slot on its port (checked for
    /// writing): the slot is taken here, the record retired, and a job
    /// writes the CQE there after the jobs queued before it (the receive's
    /// payload). The host reads its CQ in order, so an entry written after
    /// it here stays unseen until this one is. `false`, with nothing
    /// done, when a job cannot name the slot. The semaphore is held from
    /// naming the slot to taking it, so the other side takes no slot
    /// between.
    pub(crate) fn complete_on(&mut self, hal: &mut impl Hal, cpu: u8, r: u32) -> bool {
        let mut shared = self.shared.lend();
        let done = self.complete_on_held(hal, &mut shared.lock(), cpu, r);
        self.shared = shared;
        done
    }

    /// [`RecvCpu::complete_on`], the semaphore held (`g`).
    fn complete_on_held(&mut self, hal: &mut impl Hal, g: &mut Guard, cpu: u8, r: u32) -> bool {
        let m = self.recv.rx.get(r).expect("live");
        let (port, id) = (m.port, m.stamp);
        let Some(cq) = g.cqs.next_slot(hal, self.layout, self.ports, g.mr, port) else { return false };
        let h = &mut self.recv.host_segs;
        h.clear();
        let io = g.mr.checked_io(hal, cq.checked, cq.off, Buf::Gather(Cqe::SIZE, h));
        let Some(segs) = io.ok().and(crate::cpu::Segs::from_gathered(h)) else { return false };
        let (port, c) = self.retire_recv(r, None);
        if let Some(cqe) = g.cqs.next_cqe(hal, self.cpu, self.ports, &self.recv.counters, port, c) {
            g.cqs.advance(hal, self.layout, port);
            let arm = self.layout.port(port).ctl(ctl::ARM) as u32;
            g.queues.push_job(hal, cpu, crate::cpu::Job::Complete { rx: (r, id), port, cqe, segs, arm });
        }
        true
    }
}
