//! Control frames (EMP thesis §2.3.1): ACKs and NACKs, and the headers
//! atomic replies share with them. Whoever decides to answer a frame (the
//! receive path, collectives, atomics) builds and emits the answer here.
//!
//! Every ACK and NACK is cumulative (PM, seed 003 §3.3): its `rx_expected`
//! is the oldest message from the sender not wholly received here, so it
//! acknowledges every message before it. That lets the ACKs of a run of
//! wholly received messages be coalesced into one (`ack_message`): it is
//! owed until `Config::ack_delay_ns` passed, `ack_coalesce_max` messages
//! owe it, the receiver runs short of room, or another ACK goes to the
//! sender first. It also carries the receiver's room (`rx_credits`) and how
//! much to slow down (`fc_level`); a sender told to stop is sent an update
//! (`send_fc_updates`) once the port has room again.

use emp_uapi::seq_lt;
use emp_uapi::sram::counter;
use emp_uapi::wire::{self, AckBody, FrameHeader, FrameKind, NackReason};

use crate::recv_cpu::RecvCpu;
use crate::Hal;

impl RecvCpu<'_> {
    /// Receiver state piggybacked on ACKs: posted receives plus free
    /// overflow slots on the port, and a coarse "slow down" level.
    fn rx_credits(&self, port: u16) -> (u16, u8) {
        let st = &self.ports[port as usize];
        let posted = self.recv.ports[port as usize].posted.len() as u32;
        // Messages the port would accept now: posted receives, then what
        // its mode holds for unexpected ones (the pool, retained headers).
        let held = match st.mode {
            crate::MatchMode::Unexpected => {
                let room = self.recv.overflow.available() + self.cfg.unexp_headers.saturating_sub(self.recv.rdv_held);
                room.min(self.recv.unexp.capacity() - self.recv.unexp.used())
            }
            crate::MatchMode::OrderedRefusal if self.cfg.overflow_slots > 0 => self.recv.overflow.available(),
            crate::MatchMode::OrderedRefusal => 0,
        };
        let credits = posted + held;
        let level = match credits {
            0 => wire::FC_STOP,
            1..=3 => wire::FC_SLOW,
            _ => wire::FC_GO,
        };
        (credits.min(u16::MAX as u32) as u16, level)
    }

    /// The cumulative acknowledgement for `peer`: its next expected
    /// message, or the oldest before it not wholly received here (a record
    /// still missing frames, a retained header whose data is not pulled).
    pub(crate) fn rx_ack_floor(&self, peer: u32) -> u32 {
        let p = self.recv.peer(peer);
        let mut floor = p.rx_expected;
        for &r in &p.rx_active {
            let m = self.recv.rx.get(r).expect("active record");
            if m.frames_received < m.frame_count && seq_lt(m.seq, floor) {
                floor = m.seq;
            }
        }
        if p.rdv_entries > 0 {
            for &e in &self.recv.ports[self.peer(peer).port as usize].unexpected {
                let retained = self.recv.unexp.get(e).filter(|u| u.data.is_none() && u.peer == peer);
                if let Some(u) = retained.filter(|u| seq_lt(u.seq, floor)) {
                    floor = u.seq;
                }
            }
        }
        floor
    }

    /// Frames of a message are wholly received and `g` is the group that
    /// completed it: its ACK is owed, coalesced with the next messages'
    /// (module doc), unless coalescing is off or the receiver is short of
    /// room (the sender needs the news now).
    pub(crate) fn ack_message<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32, seq: u32, g: u32) {
        let limit = self.cfg.ack_coalesce_max.min(self.cfg.window_frames / 2).max(1);
        let port = self.peer(peer).port;
        if limit == 1 || self.rx_credits(port).1 != wire::FC_GO {
            self.flush_ack(hal, peer);
            return self.send_ack(hal, peer, seq, g);
        }
        if let Some((owed, _)) = self.recv.peer(peer).ack_owed {
            // The new ACK covers the owed one only if the floor passed it
            // (an earlier message may still be arriving): else send it now.
            if !seq_lt(owed, self.rx_ack_floor(peer)) {
                self.flush_ack(hal, peer);
            }
        }
        self.ack_held.set(peer, true);
        let p = self.recv.peer_mut(peer);
        p.ack_owed = Some((seq, g));
        p.acks_owed += 1;
        if p.acks_owed >= limit {
            return self.flush_ack(hal, peer);
        }
        if !p.ack_queued {
            p.ack_queued = true;
            let due = now + self.cfg.ack_delay_ns;
            self.recv.ack_due.push_back((due, peer));
            self.recv.ack_flush_at.get_or_insert(due);
        }
    }

    /// Sends the ACK `peer` is owed, if any.
    pub(crate) fn flush_ack<H: Hal>(&mut self, hal: &mut H, peer: u32) {
        let p = self.recv.peer_mut(peer);
        if let Some((seq, g)) = p.ack_owed.take() {
            p.acks_owed = 0;
            self.ack_held.set(peer, false);
            self.send_ack(hal, peer, seq, g);
        }
    }

    /// The ACK-flush timer (`RecvSide::ack_flush_at`): sends every
    /// coalesced ACK that fell due.
    pub(crate) fn on_ack_flush<H: Hal>(&mut self, hal: &mut H, now: u64) {
        self.recv.ack_flush_at = None;
        while let Some(&(due, peer)) = self.recv.ack_due.front() {
            if due > now {
                self.recv.ack_flush_at = Some(due);
                return;
            }
            self.recv.ack_due.pop_front();
            if self.peers[peer as usize].is_some() {
                self.recv.peer_mut(peer).ack_queued = false;
                self.flush_ack(hal, peer);
            }
        }
    }

    /// Senders told to stop whose port has room again get an update (an
    /// ACK of no group). Runs at the end of every entry point while any
    /// sender waits; if the update is lost the sender's probe takes over.
    pub(crate) fn send_fc_updates<H: Hal>(&mut self, hal: &mut H) {
        if !self.recv.fc_updates_owed {
            return;
        }
        self.recv.fc_updates_owed = false;
        for peer in 0..self.peers.len() as u32 {
            if !self.peer_live(peer) || !self.recv.peer(peer).fc_stop_sent {
                continue;
            }
            if self.rx_credits(self.peer(peer).port).1 == wire::FC_STOP {
                self.recv.fc_updates_owed = true;
                continue;
            }
            let seq = self.recv.peer(peer).rx_expected.wrapping_sub(1);
            self.send_ack(hal, peer, seq, wire::ACK_NO_GROUP);
        }
    }

    /// Header of a control frame (ACK, NACK, atomic reply) to `peer` about
    /// group `g` of message `seq`.
    pub(crate) fn ack_header(&self, peer: u32, kind: FrameKind, seq: u32, g: u32) -> FrameHeader {
        let p = self.peer(peer);
        FrameHeader {
            version: wire::WIRE_VERSION,
            kind: kind as u8,
            dst_gen: self.recv.peer(peer).rx_gen.unwrap_or(0),
            src_node: self.node,
            dst_node: p.node,
            src_port: self.ports[p.port as usize].addr,
            dst_port: p.rport,
            src_gen: self.ports[p.port as usize].gen,
            payload_len: 0,
            msg_seq: seq,
            tx_floor: 0,
            frame_index: if g == wire::ACK_NO_GROUP { 0 } else { g * self.cfg.group_size },
            frame_count: 0,
        }
    }

    /// An ACK of group `g` of message `seq` (or of none: `ACK_NO_GROUP`).
    /// It is cumulative, so it also carries any ACK owed to the peer.
    pub(crate) fn send_ack<H: Hal>(&mut self, hal: &mut H, peer: u32, seq: u32, g: u32) {
        let hdr = self.ack_header(peer, FrameKind::Ack, seq, g);
        let (rx_credits, fc_level) = self.rx_credits(self.peer(peer).port);
        let rx_expected = self.rx_ack_floor(peer);
        let body = AckBody { group: g, rx_credits, fc_level, rx_expected, ..Default::default() };
        self.note_fc_sent(peer, fc_level, rx_expected);
        self.emit_control(hal, &hdr, &body);
        self.count(counter::ACKS_TX, 1);
    }

    /// After a control frame to `peer` with `fc_level` and cumulative
    /// `floor`: an owed ACK the floor covers is paid; a stopped sender is
    /// remembered until it gets an update.
    fn note_fc_sent(&mut self, peer: u32, fc_level: u8, floor: u32) {
        let p = self.recv.peer_mut(peer);
        if p.ack_owed.is_some_and(|(s, _)| seq_lt(s, floor)) {
            p.ack_owed = None;
            p.acks_owed = 0;
            self.ack_held.set(peer, false);
        }
        p.fc_stop_sent = fc_level == wire::FC_STOP;
        if p.fc_stop_sent {
            self.recv.fc_updates_owed = true;
        }
    }

    pub(crate) fn send_nack<H: Hal>(
        &mut self,
        hal: &mut H,
        peer: u32,
        seq: u32,
        g: u32,
        mask: u32,
        reason: NackReason,
    ) {
        let hdr = self.ack_header(peer, FrameKind::Nack, seq, g);
        let (rx_credits, fc_level) = self.rx_credits(self.peer(peer).port);
        let rx_expected = self.rx_ack_floor(peer);
        let body = AckBody { group: g, missing_mask: mask, rx_credits, reason: reason as u8, fc_level, rx_expected };
        self.note_fc_sent(peer, fc_level, rx_expected);
        self.emit_control(hal, &hdr, &body);
        self.count(counter::NACKS_TX, 1);
    }

    /// Header of a control frame answering `to` from a port that keeps no
    /// state for its sender (closed port, full table): addressed from the
    /// frame itself.
    pub(crate) fn raw_reply_header(&self, to: &FrameHeader, kind: FrameKind) -> FrameHeader {
        FrameHeader {
            version: wire::WIRE_VERSION,
            kind: kind as u8,
            dst_gen: to.src_gen,
            src_node: self.node,
            dst_node: to.src_node,
            // `to` names the local slot (`receive_frame`); peers know its address.
            src_port: self.ports[to.dst_port as usize].addr,
            dst_port: to.src_port,
            src_gen: 0,
            payload_len: 0,
            msg_seq: to.msg_seq,
            tx_floor: 0,
            frame_index: 0,
            frame_count: 0,
        }
    }

    /// A NACK to a sender we keep no state for (closed port, full table).
    pub(crate) fn send_raw_nack<H: Hal>(&mut self, hal: &mut H, data: &FrameHeader, reason: NackReason) {
        let hdr = FrameHeader {
            frame_index: data.frame_index - data.frame_index % self.cfg.group_size,
            ..self.raw_reply_header(data, FrameKind::Nack)
        };
        let body = AckBody {
            group: data.frame_index / self.cfg.group_size,
            reason: reason as u8,
            fc_level: 2,
            ..Default::default()
        };
        self.emit_control(hal, &hdr, &body);
        self.count(counter::NACKS_TX, 1);
    }

    /// The send-ack step: runs now, or on the CPU the plan gives it.
    fn emit_control<H: Hal>(&mut self, hal: &mut H, hdr: &FrameHeader, body: &AckBody) {
        let g = self.shared.lock();
        match g.queues.dispatch(hal, self.cfg, self.cpu, crate::cpu::Step::SendAck) {
            Some(cpu) => g.queues.enqueue_control(hal, self.cfg, cpu, hdr, body),
            None => {
                drop(g);
                crate::cpu::put_control(hal, hdr, body)
            }
        }
    }
}
