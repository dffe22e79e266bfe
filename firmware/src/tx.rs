//! Send side (EMP thesis §2.3.1, Fig. 2.4): a transmission record per
//! message; frames pulled from host memory one at a time and put on the
//! wire; a timer per group of frames; the group resent on timeout with
//! exponential backoff up to a retry limit; NACKs for fast recovery.

use emp_uapi::desc::{Opcode, Status, MR_LOCAL_READ};
use emp_uapi::seq_lt;
use emp_uapi::sram::counter;
use emp_uapi::wire::{self, AckBody, FrameHeader, FrameKind, MsgHeader, NackReason};

use crate::cpu::{job_segs, Step, Work};
use crate::cq::{Completer, Completion};
use crate::mr::Buf;
use crate::send_cpu::{SendCpu, SendStop};
use crate::timer::SendTimer;
use crate::{FlowControl, Hal, LocalDesc, Nic, SendSide};

/// One group of frames.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Group {
    pub acked: bool,
    /// Timeouts so far (reset when the receiver says it is alive but not ready).
    pub retries: u32,
    /// Stamp of the armed timer (0 = none).
    pub stamp: u32,
    /// Frames of this group sent and counted in the peer's window.
    pub inflight: u32,
    /// When a NACK last triggered a resend of this group.
    pub nack_resend_ns: Option<u64>,
}

/// The groups of a message the sender may have in flight: a sliding window
/// (TCP's snd_una + wnd). Every group below `una` is acknowledged; the
/// sender sends no frame `window_frames` or more beyond `una`'s first
/// frame, so at most `Config::window_groups` groups are live, group g in
/// slot `g % slots.len()`. A slot is cleared when `una` passes it, ready
/// for the group one window later. The slots come from a pool sized at
/// boot (`SendSide::tx_rings`): the state does not grow with the message.
#[derive(Debug)]
pub(crate) struct SendWindow {
    /// Oldest unacknowledged group.
    una: u32,
    /// Groups of the message.
    count: u32,
    slots: Box<[Group]>,
}

impl SendWindow {
    pub fn new(count: u32, slots: Box<[Group]>) -> SendWindow {
        assert!(!slots.is_empty());
        SendWindow { una: 0, count, slots }
    }

    /// Groups of the message.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Oldest unacknowledged group (`count` once every group is).
    pub fn una(&self) -> u32 {
        self.una
    }

    /// Every group is acknowledged.
    pub fn done(&self) -> bool {
        self.una == self.count
    }

    /// The live groups: from `una` to the end of the window or the message.
    pub fn live(&self) -> core::ops::Range<u32> {
        self.una..self.count.min(self.una.saturating_add(self.slots.len() as u32))
    }

    /// Group `g`'s state while it is live.
    pub fn get(&self, g: u32) -> Option<&Group> {
        self.live().contains(&g).then(|| &self.slots[g as usize % self.slots.len()])
    }

    pub fn get_mut(&mut self, g: u32) -> Option<&mut Group> {
        let n = self.slots.len();
        self.live().contains(&g).then(|| &mut self.slots[g as usize % n])
    }

    /// Group `g` was acknowledged: returns its frames that were in flight,
    /// or `None` when it is not live or was already acknowledged. The
    /// window slides past every acknowledged group at its start.
    pub fn ack(&mut self, g: u32) -> Option<u32> {
        let grp = self.get_mut(g).filter(|x| !x.acked)?;
        grp.acked = true;
        grp.stamp = 0;
        let freed = core::mem::take(&mut grp.inflight);
        let n = self.slots.len();
        while self.una < self.count && self.slots[self.una as usize % n].acked {
            self.slots[self.una as usize % n] = Group::default();
            self.una += 1;
        }
        Some(freed)
    }

    /// The slots, to give back to the pool, and how many of them the
    /// message could use (`Rings::give`).
    pub fn into_slots(self) -> (Box<[Group]>, usize) {
        let used = (self.count as usize).min(self.slots.len());
        (self.slots, used)
    }

    /// As [`SendWindow::into_slots`], leaving the window empty.
    pub fn take_slots(&mut self) -> (Box<[Group]>, usize) {
        let used = (self.count as usize).min(self.slots.len());
        (core::mem::take(&mut self.slots), used)
    }

    /// Bytes of state, the same for every message length.
    pub fn state_bytes(&self) -> usize {
        core::mem::size_of::<Self>() + core::mem::size_of_val(&*self.slots)
    }
}

/// A message being sent.
#[derive(Debug)]
pub(crate) struct TxMsg {
    pub port: u16,
    pub peer: u32,
    pub desc: LocalDesc,
    pub seq: u32,
    pub frame_count: u32,
    /// Next frame to send for the first time.
    pub next_frame: u32,
    /// Per-group state of the groups in flight.
    pub groups: SendWindow,
    pub inflight_frames: u32,
    pub rnr_retries: u32,
    /// Refused by the receiver (not ready) and waiting on an RNR timer.
    pub rnr_waiting: bool,
    /// When the message was queued (diagnosis: how long a stuck head waited).
    pub queued_ns: u64,
    /// An internal collective message (no host descriptor, no CQE).
    pub coll: Option<Box<crate::coll::CollTx>>,
    /// Frames whose data exists (a broadcast forwarded while it arrives);
    /// frames from here on wait.
    pub limit: u32,
    /// A remote write, read request or read response: its header and
    /// where its data comes from.
    pub rma: Option<crate::rma::RmaTx>,
    /// The receiver retained its header (rendezvous): nothing more is sent
    /// but a keepalive of frame 0, the buffer stays in use until pulled.
    pub held: bool,
    /// Its pull arrived: a read response carries its data.
    pub pulling: bool,
}

impl TxMsg {
    /// May frame `f` go out? Not `window_frames` or more beyond the first
    /// frame of the oldest unacknowledged group.
    pub fn in_window(&self, f: u32, group_size: u32, window_frames: u32) -> bool {
        (f as u64) < self.groups.una() as u64 * group_size as u64 + window_frames as u64
    }

    /// Bytes of per-message state (record and group window): bounded by
    /// the window, not by the message's length.
    pub fn state_bytes(&self) -> usize {
        core::mem::size_of::<Self>() - core::mem::size_of::<SendWindow>() + self.groups.state_bytes()
    }

    /// May the receiver retain it and pull its data? A message whose bytes
    /// are the descriptor's memory, as is: a send, or a multisend's copy
    /// (no collective header, host data). Not an RMA message, nor a
    /// collective one the receiving NIC consumes itself.
    pub fn pullable(&self) -> bool {
        match (&self.coll, &self.rma) {
            (None, None) => true,
            (Some(c), None) => c.hdr.is_none() && matches!(c.data, crate::coll::CollData::Host { .. }),
            _ => false,
        }
    }

    /// May a context switch save it to send again from its first frame?
    /// Only a message the receiver holds nothing of: never sent, or rewound
    /// on a suspended port (`Nic::rewind_refused`, `Nic::rewind_blocked`),
    /// nothing of it acknowledged, and of a kind an image carries
    /// ([`TxMsg::rewindable_unacked`]). A message the receiver started
    /// taking runs to its end first (C2–C4).
    pub fn restartable(&self) -> bool {
        self.next_frame == 0 && self.rewindable_unacked()
    }

    /// A plain send whose receiver retained its header and has not pulled
    /// it yet: a context image carries it as held (its descriptor and
    /// sequence number), to wait for the pull again after the restore.
    pub fn held_for_pull(&self) -> bool {
        self.held && !self.pulling && self.coll.is_none() && self.rma.is_none()
    }

    /// Nothing of it is acknowledged (nor retained, pulled), and a context
    /// image can carry it to send again: a plain send (its descriptor), or
    /// a barrier's or reduction's message (its collective header and the
    /// data the NIC holds). Not RMA, reliable-broadcast or host-data
    /// collective messages.
    pub fn rewindable_unacked(&self) -> bool {
        let none_acked =
            self.groups.una() == 0 && self.groups.live().all(|g| self.groups.get(g).is_some_and(|x| !x.acked));
        let kind_ok = match &self.coll {
            None => true,
            Some(c) => {
                c.hdr.is_some()
                    && c.op != crate::coll::RBCAST_OP
                    && !matches!(c.data, crate::coll::CollData::Host { .. })
            }
        };
        kind_ok && self.rma.is_none() && !self.held && !self.pulling && none_acked
    }

    /// Bytes of the message: the descriptor's, or an RMA header and its data.
    pub fn msg_len(&self) -> u64 {
        match &self.rma {
            Some(r) => crate::rma::HDR + r.data_len,
            None => self.desc.len,
        }
    }
}

/// Bounded table of transmission records.
pub(crate) type TxTable = crate::slots::Slots<TxMsg>;

/// How a finished send record is reported.
#[derive(Debug)]
pub(crate) enum TxDone {
    Coll(Box<crate::coll::CollTx>),
    Rma(crate::rma::RmaTx, LocalDesc),
    Send(Completion),
}

/// Where a data frame's headers end and what its payload is.
pub(crate) struct DataFrame {
    /// Header bytes written.
    head: usize,
    /// Payload bytes.
    len: usize,
    /// The payload's offset in the message.
    off: u64,
    port: u16,
    dst: u16,
    desc: LocalDesc,
}

impl Nic {
    /// Queues an RMA message (remote write, read request or response).
    pub(crate) fn enqueue_tx_rma(&mut self, now: u64, port: u16, peer: u32, desc: LocalDesc, rma: crate::rma::RmaTx) {
        self.send_cpu().enqueue_tx_as(now, port, peer, desc, None, Some(rma));
    }

    /// Queues an internal collective message on its peer.
    pub(crate) fn enqueue_tx_coll(
        &mut self,
        now: u64,
        port: u16,
        peer: u32,
        desc: LocalDesc,
        coll: crate::coll::CollTx,
    ) -> u32 {
        self.send_cpu().enqueue_tx_as(now, port, peer, desc, Some(Box::new(coll)), None)
    }

    /// A restored context's message, queued with the sequence number it
    /// had when saved (`ctxsw.rs`; the caller checked table room and order).
    pub(crate) fn restore_tx(
        &mut self,
        now: u64,
        port: u16,
        peer: u32,
        desc: LocalDesc,
        seq: u32,
        coll: Option<crate::coll::CollTx>,
    ) -> u32 {
        self.send_cpu().queue_tx(now, port, peer, desc, seq, coll.map(Box::new), None)
    }

    /// Takes a message out of its peer's queue without completing it: a
    /// saved context carries it (`ctxsw.rs`).
    pub(crate) fn unqueue_tx(&mut self, slot: u32) {
        let m = self.send.tx.remove(slot);
        let (window, used) = m.groups.into_slots();
        self.send.tx_rings.give(window, used);
        let p = self.send.peer_mut(m.peer);
        p.inflight_frames -= m.inflight_frames;
        crate::slots::remove_once(&mut p.tx_queue, slot);
    }

    /// Sends what windows and flow control allow, peer by peer: the send
    /// side's loop ([`SendCpu::send_peer`]), with what it stops for done
    /// here (an ACK the receive side holds, a frame built from a
    /// collective's or remote access's state).
    pub(crate) fn send_ready_peers<H: Hal>(&mut self, hal: &mut H, now: u64) {
        // Each peer is taken once per call; a peer that becomes ready again
        // while sending waits for the next call.
        let n = self.send.ready.len();
        for _ in 0..n {
            let Some(p) = self.send.ready.pop_front() else { break };
            if self.peers[p as usize].is_none() {
                continue;
            }
            self.send.peer_mut(p).ready = false;
            while let Some(stop) = self.send_cpu().send_peer(hal, now, p) {
                match stop {
                    SendStop::AckHeld { peer } => self.ack_first(hal, peer),
                    SendStop::Special { slot, frame } => {
                        self.whole = true;
                        match self.transmit(hal, slot, frame, false) {
                            Ok(()) => {
                                self.send.frames[1] += 1;
                                self.send_cpu().frame_sent(now, slot, frame);
                            }
                            Err(st) => self.finish_tx(hal, now, slot, st),
                        }
                    }
                }
            }
        }
        self.after_send(hal, now);
    }

    /// The ACK the receive side holds for `peer` goes before the data
    /// frame the send side stopped at.
    fn ack_first<H: Hal>(&mut self, hal: &mut H, peer: u32) {
        self.send.acks_first += 1;
        self.recv_cpu().flush_ack(hal, peer);
    }

    pub(crate) fn next_stamp(&mut self) -> u32 {
        self.stamp.next()
    }

    /// The transmission step for any record ([`SendCpu::transmit`]): what
    /// the send side stops for is done here.
    pub(crate) fn transmit<H: Hal>(&mut self, hal: &mut H, slot: u32, f: u32, retransmit: bool) -> Result<(), Status> {
        loop {
            match self.send_cpu().transmit(hal, slot, f, retransmit)? {
                None => return Ok(()),
                Some(SendStop::AckHeld { peer }) => self.ack_first(hal, peer),
                Some(SendStop::Special { .. }) => {
                    // Built here, now: the step runs on this CPU.
                    let here = self.dispatch(hal, crate::cpu::Step::Transmission);
                    debug_assert_eq!(here, None);
                    return self.send_frame(hal, slot, f, retransmit);
                }
            }
        }
    }

    /// Builds frame `f` of any message and transmits it: a collective's
    /// or remote access's from their state here, a plain send's on the
    /// send side ([`SendCpu::send_frame`]). An ACK held for the peer goes
    /// first.
    pub(crate) fn send_frame<H: Hal>(
        &mut self,
        hal: &mut H,
        slot: u32,
        f: u32,
        retransmit: bool,
    ) -> Result<(), Status> {
        let m = self.send.tx.get(slot).expect("live");
        let (peer, plain) = (m.peer, m.coll.is_none() && m.rma.is_none());
        self.recv_cpu().flush_ack(hal, peer);
        if plain {
            return self.send_cpu().send_frame(hal, slot, f, retransmit);
        }
        let mut buf = core::mem::take(&mut self.frame_buf);
        let DataFrame { head, len, off, port, dst, desc } = self.send_cpu().data_frame_head(slot, f, &mut buf);
        let m = self.send.tx.get(slot).expect("live");
        let r = match (&m.coll, m.rma) {
            (Some(c), _) => match Nic::coll_payload(c, off, &mut buf[head..head + len]) {
                // The rest is host data (broadcast, multisend): from the
                // op's frame cache, or read from the host.
                Some((at, data_off)) => self.coll_frame_data(hal, slot, f, data_off, &mut buf[head + at..head + len]),
                None => Ok(()),
            },
            (None, Some(rma)) => match Nic::rma_payload(&rma, off, &mut buf[head..head + len]) {
                Some((at, data_off)) => {
                    self.rma_data(hal, port, &desc, rma.source, data_off, &mut buf[head + at..head + len])
                }
                None => Ok(()),
            },
            (None, None) => unreachable!("a plain send's frame is the send side's"),
        };
        // Collective and RMA frames are built here, then sent whole.
        if r.is_ok() {
            hal.mac_transmit(dst, &buf[..head + len]);
        }
        self.frame_buf = buf;
        r?;
        self.count(if retransmit { counter::RETRANSMITS } else { counter::TX_FRAMES }, 1);
        Ok(())
    }

    /// Resends the frames of group `g` already sent once (all of them, or
    /// those in `mask` relative to the group's first frame).
    fn resend_group<H: Hal>(&mut self, hal: &mut H, slot: u32, g: u32, mask: u32) -> Result<(), Status> {
        self.resend_from(hal, slot, g, mask, 0)
    }

    /// Resends the frames of group `g` of record `slot` that `mask` names
    /// (bit `i`: the group's frame `i`), from frame `from` on.
    fn resend_from<H: Hal>(&mut self, hal: &mut H, slot: u32, g: u32, mask: u32, from: u32) -> Result<(), Status> {
        let m = self.send.tx.get(slot).expect("live");
        let (first, end) = wire::group_range(self.cfg.group_size, m.frame_count, g);
        let end = end.min(m.next_frame);
        for f in first.max(from)..end {
            if mask & (1 << (f - first)) != 0 {
                self.transmit(hal, slot, f, true)?;
            }
        }
        Ok(())
    }

    /// Goes on with a resend the send side stopped (`SendCpu::on_loss_nack`):
    /// from the frame it stopped at, then re-arms the group's timer.
    pub(crate) fn finish_resend<H: Hal>(&mut self, hal: &mut H, now: u64, r: Resend) {
        if self.send.tx.get(r.slot).is_none_or(|m| m.seq != r.seq) {
            return;
        }
        if let Err(st) = self.resend_from(hal, r.slot, r.group, r.mask, r.from) {
            return self.finish_tx(hal, now, r.slot, st);
        }
        if r.arm {
            self.send_cpu().arm_group(now, r.slot, r.group, None);
        }
    }

    pub(crate) fn on_group_timeout<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32, g: u32, stamp: u32) {
        // Stamps are unique across slot reuse; the slot may now hold a
        // shorter message, and an acknowledged group's slot another group.
        let Some(&grp) = self.send.tx.get(slot).and_then(|m| m.groups.get(g)) else { return };
        if grp.stamp != stamp || grp.acked {
            return;
        }
        if self.send.tx.get(slot).is_some_and(|m| m.held) {
            return self.on_held_keepalive(hal, now, slot);
        }
        let (port, peer) = self.send.tx.get(slot).map(|m| (m.port, m.peer)).expect("live");
        if self.ports[port as usize].suspended {
            // Behind a message it does not send, the receiver cannot take
            // it: rewound, not retried until it fails.
            self.rewind_blocked(peer);
            if self.send.tx.get(slot).expect("live").next_frame == 0 {
                return;
            }
        }
        if let Some(r) = self.send_cpu().group_timeout(hal, now, slot, g) {
            self.finish_resend(hal, now, r);
        }
        self.after_send(hal, now);
    }

    /// The receiver retained message `slot`'s header: stop sending it,
    /// take its frames out of the window, and keep it alive with frame 0
    /// every `rto_ns_max` until its pull arrives (the receiver answers
    /// `Retained` while it holds the header; `PortClosed` if it went).
    pub(crate) fn hold_tx(&mut self, now: u64, slot: u32) {
        let m = self.send.tx.get_mut(slot);
        if m.held {
            return;
        }
        m.held = true;
        m.rnr_waiting = false;
        let mut freed = 0;
        for g in m.groups.live() {
            let grp = m.groups.get_mut(g).expect("live");
            freed += core::mem::take(&mut grp.inflight);
            grp.stamp = 0;
            grp.retries = 0;
        }
        m.inflight_frames -= freed;
        let (peer, live0) = (m.peer, m.groups.get(0).is_some());
        self.send.peer_mut(peer).inflight_frames -= freed;
        if live0 {
            let keepalive = self.cfg.rto_ns_max;
            self.send_cpu().arm_group(now, slot, 0, Some(keepalive));
        }
        self.send.mark_ready(peer);
    }

    /// A held message's keepalive: frame 0 again, unless its pull is under
    /// way; a receiver silent for `retry_limit` keepalives is gone.
    fn on_held_keepalive<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32) {
        let m = self.send.tx.get_mut(slot);
        if m.pulling {
            return; // The response's own retransmission takes over.
        }
        let grp = m.groups.get_mut(0).expect("armed on group 0");
        grp.retries += 1;
        if grp.retries > self.cfg.retry_limit {
            return self.finish_tx(hal, now, slot, Status::RetryLimitExceeded);
        }
        if let Err(st) = self.transmit(hal, slot, 0, true) {
            return self.finish_tx(hal, now, slot, st);
        }
        let keepalive = self.cfg.rto_ns_max;
        self.send_cpu().arm_group(now, slot, 0, Some(keepalive));
    }

    /// The `FcProbe` timer: a sender told to stop may send its probe.
    pub(crate) fn on_fc_probe(&mut self, peer: u32) {
        if self.peers.get(peer as usize).is_some_and(Option::is_some) {
            self.send.mark_ready(peer);
        }
    }

    /// An ACK: its send-record half on the send side
    /// ([`SendCpu::on_ack`]), then the refused messages it lets go again
    /// and what the send side left to the whole program.
    pub(crate) fn on_ack<H: Hal>(&mut self, hal: &mut H, now: u64, hdr: &FrameHeader, body: &AckBody) {
        if let Some((peer, after)) = self.send_cpu().on_ack(hal, now, hdr, body) {
            self.whole = true;
            self.resume_refused(hal, now, peer, after);
        }
        self.after_send(hal, now);
    }

    /// A message the receiver had refused was accepted: the receiver has
    /// buffers again, so the later messages it also refused are resent now
    /// instead of each waiting out its own backoff.
    pub(crate) fn resume_refused<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32, after: u32) {
        // The queue is in sequence order; each message found is taken out
        // of waiting, and one that fails leaves the queue.
        let waiting = |nic: &Nic, s: u32| nic.send.tx.get(s).is_some_and(|m| m.rnr_waiting && seq_lt(after, m.seq));
        while let Some(s) = self.send.peer(peer).tx_queue.iter().copied().find(|&s| waiting(self, s)) {
            let m = self.send.tx.get_mut(s);
            m.rnr_waiting = false;
            m.rnr_retries = 0;
            // Resending changes no group's acknowledgement or frames in flight.
            for g in m.groups.live() {
                let grp = self.send.tx.get(s).expect("live").groups.get(g).expect("live");
                if grp.acked || grp.inflight == 0 {
                    continue;
                }
                if let Err(st) = self.resend_group(hal, s, g, u32::MAX) {
                    self.finish_tx(hal, now, s, st);
                    break;
                }
                self.send_cpu().arm_group(now, s, g, None);
            }
        }
    }

    pub(crate) fn on_nack<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        hdr: &FrameHeader,
        body: &AckBody,
        reason: NackReason,
    ) {
        let Some(peer) = self.find_peer(hdr.dst_port, hdr.src_node, hdr.src_port) else { return };
        if reason == NackReason::PortClosed {
            // Everything queued to a closed port fails now.
            while let Some(&slot) = self.send.peer(peer).tx_queue.front() {
                self.finish_tx(hal, now, slot, Status::RemotePortClosed);
            }
            self.send.peer_mut(peer).remote_gen = 0;
            return;
        }
        self.send_cpu().learn_remote(now, peer, hdr, body);
        if reason != NackReason::PeerTableFull {
            // A NACK from the peer's state is cumulative too (a raw one,
            // from a receiver keeping no state for us, carries no floor).
            if let Some(after) = self.send_cpu().ack_below(hal, peer, hdr, body.rx_expected) {
                self.resume_refused(hal, now, peer, after);
            }
            self.after_send(hal, now);
        }
        self.nack_rest(hal, now, peer, hdr, body, reason);
    }

    /// A NACK's step after what it acknowledges: what it says of the
    /// message it names.
    pub(crate) fn nack_rest<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        peer: u32,
        hdr: &FrameHeader,
        body: &AckBody,
        reason: NackReason,
    ) {
        let Some(slot) = self.send.find_tx(peer, hdr.msg_seq) else { return };
        let g = body.group;
        if g >= self.send.tx.get(slot).expect("live").groups.count() {
            return;
        }
        if reason == NackReason::Retained && self.send.tx.get(slot).expect("live").pullable() {
            // The receiver is alive and still holds the header.
            self.hold_tx(now, slot);
            if let Some(grp) = self.send.tx.get_mut(slot).groups.get_mut(0) {
                grp.retries = 0;
            }
            return;
        }
        if self.send.tx.get(slot).expect("live").held {
            return; // Only the pull moves a held message on.
        }
        match reason {
            NackReason::Loss if g == 0 && body.missing_mask & 1 != 0 => {
                // No header reached the receiver: nothing of the message was
                // kept, so every unacknowledged group goes again.
                let groups = self.send.tx.get(slot).expect("live").groups.live();
                for g in groups {
                    if self.send.tx.get(slot).is_none() {
                        break;
                    }
                    self.on_loss_nack(hal, now, slot, g, u32::MAX);
                }
            }
            NackReason::Loss => self.on_loss_nack(hal, now, slot, g, body.missing_mask),
            NackReason::NoMatch => self.on_not_ready(hal, now, peer, slot, g),
            NackReason::PeerTableFull => self.finish_tx(hal, now, slot, Status::RemoteTableFull),
            NackReason::TooLarge => self.finish_tx(hal, now, slot, Status::TooLarge),
            NackReason::StaleEpoch => self.finish_tx(hal, now, slot, Status::StaleGroup),
            NackReason::CollMismatch => self.finish_tx(hal, now, slot, Status::CollMismatch),
            NackReason::RemoteAccess => self.finish_tx(hal, now, slot, Status::RemoteAccessError),
            // Only a plain send can be retained: a forged or confused answer.
            NackReason::Retained => self.finish_tx(hal, now, slot, Status::RemoteAccessError),
            NackReason::PortClosed => unreachable!("handled above"),
        }
    }

    fn on_loss_nack<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32, g: u32, mask: u32) {
        if let Some(r) = self.send_cpu().on_loss_nack(hal, now, slot, g, mask) {
            self.finish_resend(hal, now, r);
        }
        self.after_send(hal, now);
    }

    /// The receiver is alive but had no buffer for the message: resend
    /// after a delay, without counting it as a lost attempt.
    fn on_not_ready<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32, slot: u32, g: u32) {
        let seq = self.send.tx.get(slot).expect("live").seq;
        if let Some(refused) = self.send.peer(peer).not_to_send {
            if seq_lt(refused, seq) {
                return; // Already rewound behind the refused message.
            }
        }
        let m = self.send.tx.get_mut(slot);
        m.rnr_retries += 1;
        m.rnr_waiting = true;
        if self.cfg.rnr_retry_limit != 0 && m.rnr_retries > self.cfg.rnr_retry_limit {
            return self.finish_tx(hal, now, slot, Status::RnrRetryExceeded);
        }
        // A group beyond the window was never sent: nothing to resend.
        let Some(grp) = m.groups.get_mut(g).filter(|x| !x.acked) else { return };
        grp.retries = 0;
        if grp.inflight > 0 {
            // RNR backoff: a receiver that stays unready costs less and less.
            let shift = (m.rnr_retries - 1).min(20);
            let delay = self.cfg.rnr_delay_ns.saturating_mul(1 << shift).min(self.cfg.rnr_delay_ns_max);
            self.send_cpu().arm_group(now, slot, g, Some(delay));
        }
        if self.cfg.flow_control == FlowControl::ModifiedAckNack && g == 0 {
            self.send.peer_mut(peer).not_to_send = Some(seq);
            self.rewind_after(peer, seq);
        }
        let port = self.send.tx.get(slot).expect("live").port;
        if self.ports[port as usize].suspended {
            self.rewind_refused(slot);
            self.rewind_blocked(peer);
        }
    }

    /// A suspended port's message the receiver just refused, nothing of it
    /// acknowledged, goes back to unsent (`ctxsw.rs`): its frames leave the
    /// window, so messages the receiver did start taking can finish, and it
    /// starts again from frame 0 after the resume. The receiver holds
    /// nothing of it (a late duplicate it took is deduplicated by sequence
    /// number when the message comes again).
    pub(crate) fn rewind_refused(&mut self, slot: u32) {
        if self.send.tx.get(slot).is_some_and(|m| m.rnr_waiting && m.rewindable_unacked()) {
            self.rewind_to_start(slot);
        }
    }

    /// A suspended port's messages behind one it does not send (unstarted
    /// or rewound): the receiver takes messages in sequence order, so it
    /// cannot take them before that one; with nothing of them acknowledged
    /// they are rewound too, rather than retransmitted until they fail.
    pub(crate) fn rewind_blocked(&mut self, peer: u32) {
        let mut blocked = false;
        for qi in 0..self.send.peer(peer).tx_queue.len() {
            let s = self.send.peer(peer).tx_queue[qi];
            let m = self.send.tx.get(s).expect("queued");
            if m.next_frame == 0 {
                blocked = true;
            } else if blocked && m.rewindable_unacked() {
                self.rewind_to_start(s);
            }
        }
    }

    fn rewind_to_start(&mut self, slot: u32) {
        let m = self.send.tx.get_mut(slot);
        let mut freed = 0;
        for g in m.groups.live() {
            let grp = m.groups.get_mut(g).expect("live");
            freed += core::mem::take(&mut grp.inflight);
            *grp = Group::default();
        }
        m.inflight_frames -= freed;
        m.next_frame = 0;
        m.rnr_waiting = false;
        let peer = m.peer;
        self.send.peer_mut(peer).inflight_frames -= freed;
        self.send.mark_ready(peer);
    }

    /// Modified ACK/NACK: the receiver refuses everything after a refused
    /// message, so every later message is sent again from its first
    /// unacknowledged group once the refused one is accepted.
    fn rewind_after(&mut self, peer: u32, seq: u32) {
        let gs = self.cfg.group_size;
        for qi in 0..self.send.peer(peer).tx_queue.len() {
            let s = self.send.peer(peer).tx_queue[qi];
            if !seq_lt(seq, self.send.tx.get(s).expect("queued").seq) {
                continue;
            }
            let m = self.send.tx.get_mut(s);
            let mut freed = 0;
            for g in m.groups.live() {
                let grp = m.groups.get_mut(g).expect("live");
                if grp.acked {
                    continue;
                }
                freed += core::mem::take(&mut grp.inflight);
                grp.stamp = 0;
                grp.retries = 0;
            }
            m.inflight_frames -= freed;
            // The oldest unacknowledged group is the first to go again.
            m.next_frame = m.next_frame.min(m.groups.una() * gs);
            self.send.peer_mut(peer).inflight_frames -= freed;
        }
    }

    /// Retires a transmission record and reports it ([`SendCpu::finish_tx`],
    /// then [`Nic::after_send`]).
    pub(crate) fn finish_tx<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32, status: Status) {
        self.send_cpu().finish_tx(hal, slot, status);
        self.after_send(hal, now);
    }

    /// What the send side left to the whole program: the reports of the
    /// collective and remote-access records it finished, and the
    /// operations that wait for a free record.
    pub(crate) fn after_send<H: Hal>(&mut self, hal: &mut H, now: u64) {
        let stalled = self.coll_stalled || self.rbcast_stalled;
        self.whole |= !self.send.done.is_empty() || (self.send.freed && stalled);
        while let Some((done, status, port)) = self.send.done.pop_front() {
            match done {
                TxDone::Coll(c) => self.coll_tx_done(hal, now, &c, status),
                TxDone::Rma(rma, desc) => self.rma_tx_done(hal, now, port, &desc, &rma, status),
                TxDone::Send(_) => unreachable!("the send side reports its own"),
            }
        }
        if core::mem::take(&mut self.send.freed) {
            self.rbcast_unstall(now);
            self.coll_unstall(hal, now);
        }
    }
}

impl SendSide {
    pub(crate) fn mark_ready(&mut self, peer: u32) {
        let p = self.peer_mut(peer);
        if !p.ready {
            p.ready = true;
            self.ready.push_back(peer);
        }
    }

    pub(crate) fn find_tx(&self, peer: u32, seq: u32) -> Option<u32> {
        self.peer(peer).tx_queue.iter().copied().find(|&s| self.tx.get(s).is_some_and(|m| m.seq == seq))
    }

    /// Every message below this sequence number is finished at the sender,
    /// or held: taken by the receiver as a retained header, so skipping it
    /// skips nothing the receiver still waits for.
    pub(crate) fn tx_floor(&self, peer: u32) -> u32 {
        let p = self.peer(peer);
        let first = p.tx_queue.iter().map(|&s| self.tx.get(s).expect("queued")).find(|m| !m.held);
        first.map_or(p.tx_seq_next, |m| m.seq)
    }
}

/// A resend the send side stopped at a frame it cannot send alone
/// (`SendStop`): group `group` of record `slot` (message `seq`), the frames
/// `mask` names from frame `from` on, and whether the group's timer is
/// re-armed after (`Nic::finish_resend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resend {
    pub(crate) slot: u32,
    pub(crate) seq: u32,
    pub(crate) group: u32,
    pub(crate) mask: u32,
    pub(crate) from: u32,
    pub(crate) arm: bool,
}

impl SendCpu<'_> {
    /// A loss NACK for group `g` of record `slot`: the frames `mask` names
    /// go again, once per half RTO (a burst of NACKs costs one resend),
    /// and the group's timer is re-armed. `Some` when the resend stopped at
    /// a frame the whole program must send: the rest of it.
    pub(crate) fn on_loss_nack<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        slot: u32,
        g: u32,
        mask: u32,
    ) -> Option<Resend> {
        // Groups outside the window are acknowledged, or have nothing in flight.
        let m = self.send.tx.get(slot).expect("live");
        let (seq, &grp) = (m.seq, m.groups.get(g)?);
        if grp.acked || grp.inflight == 0 || grp.nack_resend_ns.is_some_and(|t| now < t + self.cfg.rto_ns / 2) {
            return None;
        }
        self.send.tx.get_mut(slot).groups.get_mut(g).expect("live").nack_resend_ns = Some(now);
        let arm = grp.stamp != 0;
        match self.resend_group(hal, slot, g, mask) {
            Err(st) => self.finish_tx(hal, slot, st),
            Ok(Some(from)) => return Some(Resend { slot, seq, group: g, mask, from, arm }),
            Ok(None) if arm => self.arm_group(now, slot, g, None),
            Ok(None) => {}
        }
        None
    }

    /// A retransmission timeout of live group `g` of record `slot` (neither
    /// held nor on a suspended port): counted, then the group goes again
    /// and its timer is re-armed with backoff, or the record fails past its
    /// retries. `Some` when the resend stopped at a frame the whole program
    /// must send: the rest of it.
    pub(crate) fn group_timeout<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32, g: u32) -> Option<Resend> {
        self.count(counter::TIMEOUTS, 1);
        let m = self.send.tx.get_mut(slot);
        let seq = m.seq;
        let grp = m.groups.get_mut(g).expect("live");
        if grp.retries >= self.cfg.retry_limit {
            self.finish_tx(hal, slot, Status::RetryLimitExceeded);
            return None;
        }
        grp.retries += 1;
        match self.resend_group(hal, slot, g, u32::MAX) {
            Err(st) => self.finish_tx(hal, slot, st),
            Ok(Some(from)) => return Some(Resend { slot, seq, group: g, mask: u32::MAX, from, arm: true }),
            Ok(None) => self.arm_group(now, slot, g, None),
        }
        None
    }

    /// The send side's timers due by `now`, alone: retransmission timeouts
    /// and flow-control probes, in deadline order. Stops, the timer left
    /// armed, at a group whose message is held (its keepalive) or whose
    /// port is suspended (the rewind): the whole program's. `true` when it
    /// stopped, or left work to the whole program (a resend it could not
    /// finish, a record's report).
    pub(crate) fn timers_alone<H: Hal>(&mut self, hal: &mut H, now: u64) -> bool {
        while let Some(&t) = self.send.timers.peek_expired(now) {
            if let SendTimer::Group { slot, group, stamp } = t {
                let live = self
                    .send
                    .tx
                    .get(slot)
                    .filter(|m| m.groups.get(group).is_some_and(|x| x.stamp == stamp && !x.acked));
                if live.is_some_and(|m| m.held || self.ports[m.port as usize].suspended) {
                    return true;
                }
                self.send.timers.pop_expired(now);
                if live.is_some() {
                    self.send.resend = self.group_timeout(hal, now, slot, group);
                }
            } else if let Some(SendTimer::FcProbe { peer }) = self.send.timers.pop_expired(now) {
                if self.peers.get(peer as usize).is_some_and(Option::is_some) {
                    self.send.mark_ready(peer);
                }
            }
            if self.send.resend.is_some() || !self.send.done.is_empty() {
                return true;
            }
        }
        false
    }

    /// Resends the frames of group `g` of record `slot` that `mask` names;
    /// `Some(f)` when it stopped at frame `f` (nothing of it done).
    fn resend_group<H: Hal>(&mut self, hal: &mut H, slot: u32, g: u32, mask: u32) -> Result<Option<u32>, Status> {
        let m = self.send.tx.get(slot).expect("live");
        let (first, end) = wire::group_range(self.cfg.group_size, m.frame_count, g);
        for f in first..end.min(m.next_frame) {
            if mask & (1 << (f - first)) != 0 && self.transmit(hal, slot, f, true)?.is_some() {
                return Ok(Some(f));
            }
        }
        Ok(None)
    }

    /// Queues a validated send on its peer.
    pub(crate) fn enqueue_tx(&mut self, now: u64, port: u16, peer: u32, desc: LocalDesc) {
        self.enqueue_tx_as(now, port, peer, desc, None, None);
    }

    pub(crate) fn enqueue_tx_as(
        &mut self,
        now: u64,
        port: u16,
        peer: u32,
        desc: LocalDesc,
        coll: Option<Box<crate::coll::CollTx>>,
        rma: Option<crate::rma::RmaTx>,
    ) -> u32 {
        let seq = {
            let p = self.send.peer_mut(peer);
            let s = p.tx_seq_next;
            p.tx_seq_next = s.wrapping_add(1);
            s
        };
        let slot = self.queue_tx(now, port, peer, desc, seq, coll, rma);
        if self.cfg.fault_swap_sends && seq % 2 == 1 {
            self.fault_swap_with_previous(peer);
        }
        self.send.mark_ready(peer);
        slot
    }

    /// Puts message `seq` to `peer` into the tx table and at the end of
    /// the peer's queue, nothing of it sent yet; returns its slot.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn queue_tx(
        &mut self,
        now: u64,
        port: u16,
        peer: u32,
        desc: LocalDesc,
        seq: u32,
        coll: Option<Box<crate::coll::CollTx>>,
        rma: Option<crate::rma::RmaTx>,
    ) -> u32 {
        let len = rma.as_ref().map_or(desc.len, |r| crate::rma::HDR + r.data_len);
        let frame_count = wire::frames_for(len, self.mtu) as u32;
        let groups = frame_count.div_ceil(self.cfg.group_size);
        let slot = self.send.tx.insert_checked(TxMsg {
            port,
            peer,
            desc,
            seq,
            frame_count,
            next_frame: 0,
            groups: SendWindow::new(groups, self.send.tx_rings.take()),
            inflight_frames: 0,
            rnr_retries: 0,
            rnr_waiting: false,
            queued_ns: now,
            limit: coll.as_ref().map_or(u32::MAX, |c| c.limit),
            coll,
            rma,
            held: false,
            pulling: false,
        });
        self.send.peer_mut(peer).tx_queue.push_back(slot);
        slot
    }

    /// `Config::fault_swap_sends`: the last two queued messages to `peer`
    /// trade sequence numbers and places when the earlier one has not
    /// started, so the receiver gets them swapped (a deliberate ordering
    /// bug, for proving order checks).
    fn fault_swap_with_previous(&mut self, peer: u32) {
        let q = &self.send.peer(peer).tx_queue;
        let n = q.len();
        if n < 2 {
            return;
        }
        let (a, b) = (q[n - 2], q[n - 1]);
        let idle = |m: &TxMsg| m.next_frame == 0 && !m.held && m.coll.is_none() && m.rma.is_none();
        if !(idle(self.send.tx.get(a).expect("queued")) && idle(self.send.tx.get(b).expect("queued"))) {
            return;
        }
        let (sa, sb) = (self.send.tx.get(a).expect("queued").seq, self.send.tx.get(b).expect("queued").seq);
        self.send.tx.get_mut(a).seq = sb;
        self.send.tx.get_mut(b).seq = sa;
        let q = &mut self.send.peer_mut(peer).tx_queue;
        let n = q.len();
        q.swap(n - 2, n - 1);
    }

    fn count(&mut self, c: usize, n: u64) {
        self.counters.add(c, n);
    }

    /// Reports a finished descriptor ([`crate::Cqs::complete`]).
    pub(crate) fn complete<H: Hal>(&mut self, hal: &mut H, port: u16, c: Completion) {
        let g = self.shared.lock();
        let by = Completer { layout: self.layout, ports: self.ports, cpu: self.cpu, mr: g.mr, counters: self.counters };
        g.cqs.complete(hal, by, port, c)
    }

    /// Sends what `peer`'s window and flow control allow; `Some` when it
    /// stops for what the send side cannot do (the caller does it and
    /// calls again: everything this loop decides is read from the records,
    /// so it goes on where it stopped).
    pub(crate) fn send_peer<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32) -> Option<SendStop> {
        // Modified ACK/NACK: the receiver refuses everything after the
        // refused message, so nothing after it goes out. The refused
        // message itself may still send frames it has not sent yet (a
        // forwarded broadcast whose frames were not here when it was
        // refused): the receiver can only accept it, and answer, once it
        // holds every frame of a group.
        let refused = self.send.peer(peer).not_to_send;
        let msgs_max = match self.cfg.flow_control {
            FlowControl::Piggyback => self.piggyback_limit(now, peer),
            _ => u32::MAX,
        };
        let mut started = 0u32;
        let mut qi = 0usize;
        while let Some(&slot) = self.send.peer(peer).tx_queue.get(qi) {
            qi += 1;
            let (next, count) = {
                let m = self.send.tx.get(slot).expect("queued");
                if refused.is_some_and(|r| seq_lt(r, m.seq)) {
                    return None;
                }
                if m.held {
                    continue; // Waits for its pull; later messages go on.
                }
                // A rewind (`rewind_after`) may have put `next_frame` back
                // into a group whose ACK, for frames sent before it, came
                // since: acknowledged frames do not go again.
                let acked = m.groups.una().saturating_mul(self.cfg.group_size).min(m.frame_count);
                (m.next_frame.max(acked), m.frame_count)
            };
            if next > 0 || next == count {
                started += 1;
            }
            if next == count {
                continue;
            }
            if next == 0 {
                if started >= msgs_max {
                    return None;
                }
                // C1: a suspended port starts no message; later ones the
                // receiver started taking (an earlier one was refused and
                // rewound, `rewind_refused`) go on to their end.
                let m = self.send.tx.get(slot).expect("queued");
                if self.ports[m.port as usize].suspended && m.rewindable_unacked() {
                    continue;
                }
                started += 1;
            }
            let window = self.cfg.window_frames;
            for f in next..count {
                if self.send.peer(peer).inflight_frames >= window {
                    return None;
                }
                let m = self.send.tx.get(slot).expect("queued");
                if f >= m.limit {
                    // A forwarded broadcast frame not here yet: later
                    // messages to this peer wait behind it, in order.
                    return None;
                }
                if !m.in_window(f, self.cfg.group_size, window) {
                    // The oldest unacknowledged group holds the window (a
                    // loss): acknowledged groups above it do not open it,
                    // and later messages wait behind this one, in order.
                    return None;
                }
                match self.transmit(hal, slot, f, false) {
                    Ok(None) => {
                        self.send.frames[0] += 1;
                        self.frame_sent(now, slot, f);
                    }
                    Ok(Some(stop)) => return Some(stop),
                    Err(st) => {
                        self.finish_tx(hal, slot, st);
                        qi -= 1;
                        break;
                    }
                }
            }
        }
        None
    }

    /// Frame `f` of record `slot` went (or was handed to its CPU): it is
    /// in the window, and the group it completes is armed.
    pub(crate) fn frame_sent(&mut self, now: u64, slot: u32, f: u32) {
        let gs = self.cfg.group_size;
        let m = self.send.tx.get_mut(slot);
        let g = f / gs;
        let (_, end) = wire::group_range(gs, m.frame_count, g);
        m.next_frame = f + 1;
        m.inflight_frames += 1;
        m.groups.get_mut(g).expect("a frame in the window is of a live group").inflight += 1;
        let peer = m.peer;
        self.send.peer_mut(peer).inflight_frames += 1;
        if f + 1 == end {
            self.arm_group(now, slot, g, None);
        }
    }

    /// Arms (or re-arms) a group's retransmission timer.
    pub(crate) fn arm_group(&mut self, now: u64, slot: u32, g: u32, delay: Option<u64>) {
        let stamp = self.send.stamp.next();
        let (rto, rto_max) = (self.cfg.rto_ns, self.cfg.rto_ns_max);
        let grp = self.send.tx.get_mut(slot).groups.get_mut(g).expect("a live group is armed");
        grp.stamp = stamp;
        let backoff = rto.saturating_mul(1u64 << grp.retries.min(20)).min(rto_max);
        self.send.arm_timer(self.peers, now + delay.unwrap_or(backoff), SendTimer::Group { slot, group: g, stamp });
    }

    /// The transmission step: runs now, or on the CPU the plan gives it:
    /// with jobs, a plain frame as a job (headers built and payload named
    /// here, by send bookkeeping); others as work. Stops first, with
    /// nothing done, when the frame would be built here and an ACK is held
    /// for the peer, or it is a collective's or remote access's.
    pub(crate) fn transmit<H: Hal>(
        &mut self,
        hal: &mut H,
        slot: u32,
        f: u32,
        retransmit: bool,
    ) -> Result<Option<SendStop>, Status> {
        let m = self.send.tx.get(slot).expect("live");
        let (peer, plain) = (m.peer, m.coll.is_none() && m.rma.is_none());
        let queued = self.shared.lock().queues.queued_to(self.cfg, self.cpu, Step::Transmission);
        if (queued.is_none() || (self.cfg.cpu_jobs && plain)) && self.ack_held.get(peer) {
            return Ok(Some(SendStop::AckHeld { peer }));
        }
        if queued.is_none() && !plain {
            return Ok(Some(SendStop::Special { slot, frame: f }));
        }
        let to = self.shared.lock().queues.dispatch(hal, self.cfg, self.cpu, Step::Transmission);
        match to {
            Some(cpu) => {
                if !(self.cfg.cpu_jobs && plain && self.transmit_job(hal, cpu, slot, f, retransmit)?) {
                    let seq = self.send.tx.get(slot).expect("live").seq;
                    self.shared.lock().queues.enqueue(hal, cpu, Work::Transmit { slot, seq, frame: f, retransmit });
                }
            }
            None => self.send_frame(hal, slot, f, retransmit)?,
        }
        Ok(None)
    }

    /// Queues frame `f` of a plain send as a job for `cpu`: `false` when
    /// its payload is too scattered to name, for the caller to queue as
    /// work.
    fn transmit_job<H: Hal>(
        &mut self,
        hal: &mut H,
        cpu: u8,
        slot: u32,
        f: u32,
        retransmit: bool,
    ) -> Result<bool, Status> {
        let m = self.send.tx.get(slot).expect("live");
        let (seq, in_place) = (m.seq, self.immediate_sending && m.frame_count == 1);
        let mut buf = core::mem::take(self.frame_buf);
        let d = self.data_frame_head(slot, f, &mut buf);
        let mut head = [0u8; crate::cpu::HEAD_MAX];
        head[..d.head].copy_from_slice(&buf[..d.head]);
        *self.frame_buf = buf;
        let g = self.shared.lock();
        let segs = job_segs(hal, g.mr, self.layout, self.host_segs, d.port, &d.desc, d.off, d.len, MR_LOCAL_READ)?;
        let Some(segs) = segs else { return Ok(false) };
        let job = crate::cpu::Job::Transmit { slot, seq, dst: d.dst, head, head_len: d.head as u8, segs, in_place };
        g.queues.push_job(hal, cpu, job);
        drop(g);
        self.count(if retransmit { counter::RETRANSMITS } else { counter::TX_FRAMES }, 1);
        Ok(true)
    }

    /// Writes the headers of frame `f` of tx record `slot` into `buf`. An
    /// ACK held for the peer went first (an answer must never overtake the
    /// ACK of what it answers: the sender would see the answer before its
    /// send completed).
    pub(crate) fn data_frame_head(&self, slot: u32, f: u32, buf: &mut [u8]) -> DataFrame {
        let m = self.send.tx.get(slot).expect("live");
        // Beside the receive side, an ACK it holds now was held after the
        // check: it answers nothing this frame carries.
        debug_assert!(
            self.shared.per_access() || !self.ack_held.get(m.peer),
            "the ACK held for peer {} goes before its data",
            m.peer
        );
        let p = self.peers[m.peer as usize].as_ref().expect("live peer");
        let off = wire::frame_offset(f, self.mtu);
        let total = m.msg_len();
        let len = (wire::payload_capacity(self.mtu, f) as u64).min(total - off.min(total)) as usize;
        let kind = match (&m.coll, &m.rma) {
            (Some(c), _) if c.hdr.is_some() => FrameKind::CollData,
            (_, Some(_)) => FrameKind::Rma,
            _ => FrameKind::Data,
        };
        let hdr = FrameHeader {
            version: wire::WIRE_VERSION,
            kind: kind as u8,
            dst_gen: self.send.peer(m.peer).remote_gen,
            src_node: self.node,
            dst_node: p.node,
            src_port: self.ports[m.port as usize].addr,
            dst_port: p.rport,
            src_gen: self.ports[m.port as usize].gen,
            payload_len: len as u16,
            msg_seq: m.seq,
            tx_floor: self.send.tx_floor(m.peer),
            frame_index: f,
            frame_count: m.frame_count,
        };
        let msg = if m.rma.is_some() {
            MsgHeader::new(0, total, None)
        } else {
            MsgHeader::new(m.desc.wd.tag, total, m.desc.wd.send_imm())
        };
        let head = wire::emit_data_headers(&hdr, (f == 0).then_some(&msg), buf).expect("frame fits MTU_MAX");
        DataFrame { head, len, off, port: m.port, dst: p.node, desc: m.desc }
    }

    /// Builds frame `f` of a plain send from host memory and transmits it.
    pub(crate) fn send_frame<H: Hal>(
        &mut self,
        hal: &mut H,
        slot: u32,
        f: u32,
        retransmit: bool,
    ) -> Result<(), Status> {
        let mut buf = core::mem::take(self.frame_buf);
        let DataFrame { head, len, off, port, dst, desc } = self.data_frame_head(slot, f, &mut buf);
        let m = self.send.tx.get(slot).expect("live");
        debug_assert!(m.coll.is_none() && m.rma.is_none(), "a plain send");
        let r = if self.immediate_sending && m.frame_count == 1 {
            // Immediate Sending: the NIC reads the payload from host
            // memory as it sends. A retransmission names it again: the
            // send completes only once ACKed, so the host keeps it.
            let mut segs = core::mem::take(self.host_segs);
            segs.clear();
            let r = self.shared.lock().mr.sge_io(
                hal,
                self.layout,
                port,
                desc.sges(),
                off,
                Buf::Gather(len, &mut segs),
                MR_LOCAL_READ,
            );
            let r = match r {
                Ok(()) if !segs.overflowed => {
                    let sent = hal.mac_transmit_host(dst, &buf[..head], &segs.segs);
                    sent.map_err(|_| Status::DmaError)
                }
                // Too scattered to name: store and forward.
                Ok(()) => self.store_and_forward(hal, port, &desc, off, dst, &mut buf[..head + len], head),
                Err(st) => Err(st),
            };
            *self.host_segs = segs;
            r
        } else {
            self.store_and_forward(hal, port, &desc, off, dst, &mut buf[..head + len], head)
        };
        *self.frame_buf = buf;
        r?;
        self.count(if retransmit { counter::RETRANSMITS } else { counter::TX_FRAMES }, 1);
        Ok(())
    }

    /// Reads a plain send's payload into `frame` after its `head` bytes of
    /// headers, then hands the whole frame to the MAC.
    #[allow(clippy::too_many_arguments)]
    fn store_and_forward<H: Hal>(
        &mut self,
        hal: &mut H,
        port: u16,
        desc: &LocalDesc,
        off: u64,
        dst: u16,
        frame: &mut [u8],
        head: usize,
    ) -> Result<(), Status> {
        let g = self.shared.lock();
        g.mr.sge_io(hal, self.layout, port, desc.sges(), off, Buf::FromHost(&mut frame[head..]), MR_LOCAL_READ)?;
        drop(g);
        hal.mac_transmit(dst, frame);
        Ok(())
    }

    /// EMP's piggybacked flow control (thesis §2.3.1), both levels: the
    /// messages the receiver has room for (`credits`), and how much to slow
    /// down below that (`fc_level`): all of them, half (a shift: the Tigon
    /// had no divide), or none until an update — or, if the update was
    /// lost, one probe `rnr_delay_ns_max` after the stop.
    fn piggyback_limit(&self, now: u64, peer: u32) -> u32 {
        let p = self.send.peer(peer);
        match p.fc_level {
            wire::FC_GO => p.credits.max(1),
            wire::FC_SLOW => (p.credits >> 1).max(1),
            _ if now >= p.fc_stop_ns.saturating_add(self.cfg.rnr_delay_ns_max) => 1,
            _ => 0,
        }
    }

    /// Receive ack's send-record half (Table 3.2's update): an ACK for
    /// group `body.group` of message `hdr.msg_seq`, and for every message
    /// before `body.rx_expected` (cumulative). Returns the refused messages
    /// the receiver has buffers for again, `(peer, after)`: those to `peer`
    /// after sequence `after` go again now (`Nic::resume_refused`: a
    /// resend may build a collective's frame).
    pub(crate) fn on_ack<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        hdr: &FrameHeader,
        body: &AckBody,
    ) -> Option<(u32, u32)> {
        let peer = self.peer_index.get(&(hdr.dst_port, hdr.src_node, hdr.src_port)).copied()?;
        self.learn_remote(now, peer, hdr, body);
        let below = self.ack_below(hal, peer, hdr, body.rx_expected);
        let resume = |after: Option<u32>| Some((peer, after?));
        if body.group == wire::ACK_NO_GROUP {
            // A flow-control update: the new room may let messages go.
            self.send.mark_ready(peer);
            return resume(below);
        }
        let Some(slot) = self.send.find_tx(peer, hdr.msg_seq) else { return resume(below) };
        if self.send.tx.get(slot).is_some_and(|m| m.held) {
            // Its groups are not acknowledged: its pull's response completes it.
            return resume(below);
        }
        if self.send.peer(peer).not_to_send == Some(hdr.msg_seq) {
            // Modified ACK/NACK: the refused message was accepted; back to Normal.
            self.send.peer_mut(peer).not_to_send = None;
        }
        let m = self.send.tx.get_mut(slot);
        let was_refused = core::mem::take(&mut m.rnr_waiting);
        let seq = m.seq;
        if body.group >= m.groups.count() {
            return resume(below);
        }
        if let Some(n) = m.groups.ack(body.group) {
            // A message rewound on a suspended port (`rewind_refused`) that
            // the receiver took after all: it goes on past what is acknowledged.
            m.next_frame = m.next_frame.max(m.groups.una() * self.cfg.group_size).min(m.frame_count);
            m.inflight_frames -= n;
            let done = m.groups.done();
            self.send.peer_mut(peer).inflight_frames -= n;
            if done {
                self.finish_tx(hal, slot, Status::Success);
            }
        }
        self.send.mark_ready(peer);
        // Both resume the refused messages after the earlier one.
        match (below, was_refused) {
            (Some(b), true) if seq_lt(b, seq) => resume(Some(b)),
            (_, true) => resume(Some(seq)),
            (b, false) => resume(b),
        }
    }

    /// PM's cumulative ACK (seed 003 §3.3: Ack(r, i) frees every Buf(r, j),
    /// j ≤ i): the receiver has every message before `floor` wholly, so
    /// each still queued is done — but a held one, whose data the receiver
    /// pulls (its read response's ACK completes it). Only from a receiver
    /// that addressed this incarnation of the port: a stale ACK meant for an
    /// earlier process here names sequence numbers that are not ours.
    /// Returns the last refused message it finished, after which the
    /// refused ones go again.
    pub(crate) fn ack_below<H: Hal>(&mut self, hal: &mut H, peer: u32, hdr: &FrameHeader, floor: u32) -> Option<u32> {
        if hdr.dst_gen == 0 || hdr.dst_gen != self.ports[hdr.dst_port as usize].gen {
            return None;
        }
        let mut refused_done = None;
        let mut i = 0;
        // The queue is in sequence order; finishing a record takes it out.
        while let Some(&slot) = self.send.peer(peer).tx_queue.get(i) {
            let m = self.send.tx.get(slot).expect("queued");
            if !seq_lt(m.seq, floor) {
                break;
            }
            if m.held {
                i += 1;
                continue;
            }
            if m.rnr_waiting {
                refused_done = Some(m.seq);
            }
            self.finish_tx(hal, slot, Status::Success);
        }
        refused_done
    }

    /// Receiver state piggybacked on ACKs and NACKs: its room, and how
    /// much to slow down; a stop arms the probe that outlives a lost update.
    pub(crate) fn learn_remote(&mut self, now: u64, peer: u32, hdr: &FrameHeader, body: &AckBody) {
        let probe = self.cfg.flow_control == FlowControl::Piggyback;
        let p = self.send.peer_mut(peer);
        p.credits = body.rx_credits as u32;
        p.remote_gen = hdr.src_gen;
        let stopped = p.fc_level == wire::FC_STOP;
        p.fc_level = body.fc_level.min(wire::FC_STOP);
        if p.fc_level == wire::FC_STOP && !stopped {
            p.fc_stop_ns = now;
            if probe {
                let at = now.saturating_add(self.cfg.rnr_delay_ns_max);
                self.send.arm_timer(self.peers, at, SendTimer::FcProbe { peer });
            }
        }
    }

    /// Retires a transmission record and reports it: a plain send's
    /// completion here; a collective's or remote access's report is left
    /// to the whole program ([`SendSide::done`], `Nic::after_send`), and so
    /// are the operations that wait for a free record (`SendSide::freed`).
    pub(crate) fn finish_tx<H: Hal>(&mut self, hal: &mut H, slot: u32, status: Status) {
        // What the report needs is taken out and the record dropped where
        // it is: moving a whole record out of its table costs a copy.
        let m = self.send.tx.get_mut(slot);
        let (window, used) = m.groups.take_slots();
        let (peer, seq, inflight, port) = (m.peer, m.seq, m.inflight_frames, m.port);
        let done = match (m.coll.take(), m.rma) {
            (Some(c), _) => TxDone::Coll(c),
            (None, Some(rma)) => TxDone::Rma(rma, m.desc),
            (None, None) => {
                let mut c = Completion::of(&m.desc, Opcode::Send, status);
                c.byte_len = m.desc.len.min(u32::MAX as u64) as u32;
                TxDone::Send(c)
            }
        };
        self.send.tx.free(slot);
        self.send.tx_rings.give(window, used);
        let p = self.send.peer_mut(peer);
        p.inflight_frames -= inflight;
        crate::slots::remove_once(&mut p.tx_queue, slot);
        if p.not_to_send == Some(seq) {
            p.not_to_send = None;
        }
        if status == Status::Success {
            self.count(counter::MSGS_TX, 1);
        }
        self.send.mark_ready(peer);
        match done {
            TxDone::Send(c) => self.complete(hal, port, c),
            done => self.send.done.push_back((done, status, port)),
        }
        self.send.freed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(groups: u32, ring: usize) -> SendWindow {
        SendWindow::new(groups, vec![Group::default(); ring].into_boxed_slice())
    }

    #[test]
    fn acknowledged_groups_above_a_missing_one_do_not_slide_the_window() {
        let mut w = window(10, 3);
        assert_eq!(w.live(), 0..3);
        w.get_mut(1).unwrap().inflight = 3;
        assert_eq!(w.ack(1), Some(3));
        assert_eq!(w.ack(1), None, "acknowledged once");
        assert_eq!((w.una(), w.live()), (0, 0..3), "group 0 holds the window");
        assert!(w.get(3).is_none(), "beyond the window");
        assert_eq!(w.ack(0), Some(0));
        assert_eq!((w.una(), w.live()), (2, 2..5), "slides past every acknowledged group");
        assert!(w.get(1).is_none(), "below the window");
        let g4 = w.get(4).unwrap();
        assert!(!g4.acked && g4.inflight == 0, "group 4 starts clean in group 1's slot");
        for g in 2..10 {
            w.ack(g);
        }
        assert!(w.done());
        assert_eq!(w.live(), 10..10);
    }

    #[test]
    fn the_frame_window_starts_at_the_oldest_unacknowledged_group() {
        let mut w = window(100, 16);
        w.ack(0);
        let m = |groups| TxMsg {
            port: 0,
            peer: 0,
            desc: LocalDesc::new(&emp_uapi::desc::WorkDesc::default()),
            seq: 0,
            frame_count: 300,
            next_frame: 0,
            groups,
            inflight_frames: 0,
            rnr_retries: 0,
            rnr_waiting: false,
            queued_ns: 0,
            coll: None,
            limit: u32::MAX,
            rma: None,
            held: false,
            pulling: false,
        };
        let m = m(w);
        // Group 1 (frames 3..6) is the oldest unacknowledged: 48 frames from frame 3.
        assert!(m.in_window(50, 3, 48));
        assert!(!m.in_window(51, 3, 48));
    }

    #[test]
    fn only_a_message_of_the_descriptors_own_bytes_can_be_pulled() {
        let m = |rma: Option<crate::rma::RmaTx>| TxMsg {
            port: 0,
            peer: 0,
            desc: LocalDesc::new(&emp_uapi::desc::WorkDesc::default()),
            seq: 0,
            frame_count: 1,
            next_frame: 0,
            groups: window(1, 1),
            inflight_frames: 0,
            rnr_retries: 0,
            rnr_waiting: false,
            queued_ns: 0,
            coll: None,
            limit: u32::MAX,
            rma,
            held: false,
            pulling: false,
        };
        assert!(m(None).pullable(), "a send");
        let write = crate::rma::RmaTx {
            hdr: Default::default(),
            source: crate::rma::RmaSource::Local,
            data_len: 1,
            read: None,
            rdv_send: None,
        };
        assert!(!m(Some(write)).pullable(), "an RMA message leads with its header");
    }

    #[test]
    fn a_record_holds_as_much_state_for_1_gib_as_for_one_window() {
        let frames_1g = wire::frames_for(1 << 30, 1500) as u32;
        let big = window(frames_1g.div_ceil(3), 16);
        let small = window(16, 16);
        assert_eq!(big.state_bytes(), small.state_bytes());
        assert!(big.state_bytes() < 1024, "{} bytes", big.state_bytes());
    }
}
