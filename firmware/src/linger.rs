//! Closed ports' TIME-WAIT (TCP's, RFC 793 §3.5): for a while after a port
//! closes, the NIC remembers, per peer of the port, how far it had
//! delivered. A retransmission of a message it delivered — its ACK lost
//! on the wire, or owed and flushed at the close and lost — is then
//! acknowledged instead of refused as sent to a closed port, which would
//! fail a send that in fact arrived (a process that exits right after its
//! last receive, as `fi_pingpong`'s server does after the client's `fin`).
//! A message it did not deliver is refused as before.

use std::collections::VecDeque;

use emp_uapi::sram::counter;
use emp_uapi::wire::FrameHeader;

use emp_uapi::seq_lt;

use crate::{Hal, Nic};

/// Peers remembered at once across every closed port; the oldest goes
/// first when a close would exceed it.
pub(crate) const LINGER_MAX: usize = 256;

/// What a closed port had delivered from one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lingering {
    /// The port's slot and wire address, and its incarnation.
    slot: u16,
    addr: u16,
    gen: u16,
    /// The peer: node, port address, incarnation.
    node: u16,
    rport: u16,
    rgen: u16,
    /// Every message below this sequence number was delivered.
    floor: u32,
    /// Forgotten after this time (ns).
    until: u64,
}

/// The remembered peers of closed ports, oldest first (bounded:
/// [`LINGER_MAX`]).
#[derive(Debug)]
pub(crate) struct LingerTable {
    entries: VecDeque<Lingering>,
}

impl LingerTable {
    pub(crate) fn new() -> Self {
        LingerTable { entries: VecDeque::with_capacity(LINGER_MAX) }
    }

    fn expire(&mut self, now: u64) {
        while self.entries.front().is_some_and(|e| e.until <= now) {
            self.entries.pop_front();
        }
    }

    fn remember(&mut self, now: u64, e: Lingering) {
        self.expire(now);
        if self.entries.len() == LINGER_MAX {
            self.entries.pop_front();
        }
        self.entries.push_back(e);
    }

    /// The address and incarnation of the closed port that delivered the
    /// message of DATA frame `hdr`, if one did and is remembered. A frame
    /// that names no incarnation (its sender never heard from the port:
    /// every ACK lost) is taken as meant for the port's latest.
    fn delivered(&self, now: u64, hdr: &FrameHeader) -> Option<(u16, u16)> {
        let e = self.entries.iter().rev().find(|e| {
            e.until > now
                && (e.slot == hdr.dst_port || e.addr == hdr.dst_port)
                && (hdr.dst_gen == 0 || e.gen == hdr.dst_gen)
                && (e.node, e.rport, e.rgen) == (hdr.src_node, hdr.src_port, hdr.src_gen)
        })?;
        seq_lt(hdr.msg_seq, e.floor).then_some((e.addr, e.gen))
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

impl Nic {
    /// How long a closed port's peers are remembered: as long as a sender
    /// keeps retransmitting before it gives up.
    fn linger_ns(&self) -> u64 {
        self.cfg.rto_ns_max.saturating_mul(self.cfg.retry_limit as u64 + 1)
    }

    /// `port` is closing: remember how far each of its peers was
    /// delivered (before the close flushes what was half received).
    pub(crate) fn linger_port(&mut self, now: u64, port: u16) {
        let (addr, gen) = (self.ports[port as usize].addr, self.ports[port as usize].gen);
        let until = now.saturating_add(self.linger_ns());
        for i in 0..self.peers.len() as u32 {
            let Some(p) = self.peers[i as usize].as_ref().filter(|p| p.port == port) else { continue };
            let Some(rgen) = self.recv.peer(i).rx_gen else { continue }; // Never received from.
            let (node, rport) = (p.node, p.rport);
            let floor = self.recv_cpu().rx_ack_floor(i);
            self.linger.remember(now, Lingering { slot: port, addr, gen, node, rport, rgen, floor, until });
        }
    }

    /// A DATA frame for a closed port, or for an earlier incarnation of an
    /// open one: acknowledged when it repeats a message that port had
    /// delivered (true), else left to be refused (false).
    pub(crate) fn linger_answer<H: Hal>(&mut self, hal: &mut H, now: u64, hdr: &FrameHeader) -> bool {
        let Some((addr, gen)) = self.linger.delivered(now, hdr) else { return false };
        self.count(counter::DUPLICATES, 1);
        // The reply comes from the port's address (the frame names a slot by now).
        self.send_unaddressed_reply(hal, &FrameHeader { dst_port: addr, ..*hdr }, None, gen);
        true
    }
}
