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
//! receive path through it.

use emp_uapi::sram::Layout;

use crate::cpu::{Queues, Step};
use crate::cq::Completer;
use crate::host::Completion;
use crate::mr::MrCache;
use crate::{Config, Cqs, Hal, Nic, Peer, Port, RecvSide};

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

    /// Reports a finished descriptor ([`Cqs::complete`]), through this
    /// side's MR cache.
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
}
