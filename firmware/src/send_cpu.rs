//! The send side at work: a view of the program for the CPU doing send
//! bookkeeping (CPU A under every plan, docs/nic-cpus.md). It owns the
//! send side's records ([`SendSide`]: send records and their windows, the
//! ready queue, the send halves of peers and ports, its timers), reads
//! what the admin commands set (configuration, ports, the peer table) and
//! the common area's word of the ACKs the receive side holds back
//! ([`AckHeld`]), writes the CQs (the one structure both sides write: the
//! semaphore's), and hands steps of other CPUs to the common area. It
//! reaches nothing of the receive side, nor of the collectives, remote
//! access or reliable broadcast: what needs them comes back to the whole
//! program as an outcome — a stop ([`SendStop`]), or a finished record's
//! report ([`SendSide::done`]).
//!
//! The whole program builds one with [`Nic::send_cpu`] and calls the send
//! path through it: sending what windows allow (`SendCpu::send_peer`),
//! the transmission step, a plain send's frames, receive ack's
//! send-record half (`SendCpu::on_ack`), retiring records.

use core::ptr::{addr_of, addr_of_mut};

use emp_uapi::sram::Layout;

use crate::counters::Counters;
use crate::keymap::KeyMap;
use crate::mr::HostSegs;
use crate::peer::AckHeld;
use crate::sem::Shared;
use crate::{Config, Nic, Peer, Port, SendSide};

/// The send side and what it may reach (module doc).
pub(crate) struct SendCpu<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) layout: &'a Layout,
    pub(crate) node: u16,
    pub(crate) mtu: u32,
    pub(crate) ports: &'a [Port],
    pub(crate) peers: &'a [Option<Peer>],
    pub(crate) peer_index: &'a KeyMap<(u16, u16, u16), u32>,
    /// The CPU running it.
    pub(crate) cpu: u8,
    pub(crate) send: &'a mut SendSide,
    /// What both sides write: the CQs, the program's MR cache, the
    /// hand-offs to other CPUs.
    pub(crate) shared: Shared<'a>,
    /// CPU A's counts (and the whole program's).
    pub(crate) counters: &'a Counters,
    /// The ACKs the receive side holds back: one goes before a data frame
    /// to its peer.
    pub(crate) ack_held: &'a AckHeld,
    /// One frame of scratch, and the host segments of one frame.
    pub(crate) frame_buf: &'a mut Vec<u8>,
    pub(crate) host_segs: &'a mut HostSegs,
    /// Immediate Sending (`Nic::immediate_sending`).
    pub(crate) immediate_sending: bool,
}

/// Why the send side stopped: what comes next needs more than it reaches.
/// Nothing of the frame it stopped at was done; the caller does what it
/// says, then calls again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SendStop {
    /// The receive side holds back an ACK for `peer` (its coalescing): the
    /// ACK goes first.
    AckHeld { peer: u32 },
    /// Frame `frame` of record `slot` is a collective's or remote access's,
    /// built on this CPU now from their state.
    Special { slot: u32, frame: u32 },
}

impl<'a> SendCpu<'a> {
    /// The send side's view for a CPU running it alone, beside the
    /// receive side's (`crate::sides`): built from the program's fields,
    /// never a reference to the whole program; what both sides write is
    /// taken through the semaphore per access.
    ///
    /// # Safety
    /// `this` is live, and while the view lives nothing reaches the send
    /// side (its records, CPU A's counts, the frame scratch) or runs the
    /// whole program; the receive side's view may (it reaches none of
    /// these fields mutably but the semaphore's, and the atomics of the
    /// common area).
    pub(crate) unsafe fn alone(this: *mut Nic, cpu: u8) -> SendCpu<'a> {
        // SAFETY: per the contract above, these fields are read by others
        // at most, the send side's are ours, and the semaphore's fields
        // are reached only through it.
        unsafe {
            SendCpu {
                cfg: &*addr_of!((*this).cfg),
                layout: &*addr_of!((*this).layout),
                node: *addr_of!((*this).node),
                mtu: *addr_of!((*this).mtu),
                ports: &*addr_of!((*this).ports),
                peers: &*addr_of!((*this).peers),
                peer_index: &*addr_of!((*this).peer_index),
                cpu,
                send: &mut *addr_of_mut!((*this).send),
                shared: Shared::taken(this),
                counters: &*addr_of!((*this).counters),
                ack_held: &*addr_of!((*this).ack_held),
                frame_buf: &mut *addr_of_mut!((*this).frame_buf),
                host_segs: &mut *addr_of_mut!((*this).host_segs),
                immediate_sending: *addr_of!((*this).immediate_sending),
            }
        }
    }
}

impl Nic {
    /// The send side's view of this program, on the CPU running now.
    pub(crate) fn send_cpu(&mut self) -> SendCpu<'_> {
        SendCpu {
            cfg: &self.cfg,
            layout: &self.layout,
            node: self.node,
            mtu: self.mtu,
            ports: &self.ports,
            peers: &self.peers,
            peer_index: &self.peer_index,
            cpu: self.cpu,
            send: &mut self.send,
            shared: Shared::Held { cqs: &mut self.cqs, mr: &mut self.mr, queues: &mut self.queues },
            counters: &self.counters,
            ack_held: &self.ack_held,
            frame_buf: &mut self.frame_buf,
            host_segs: &mut self.host_segs,
            immediate_sending: self.immediate_sending,
        }
    }
}
