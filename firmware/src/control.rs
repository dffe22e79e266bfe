//! Control frames (EMP thesis §2.3.1): ACKs and NACKs, and the headers
//! atomic replies share with them. Whoever decides to answer a frame (the
//! receive path, collectives, atomics) builds and emits the answer here.

use emp_uapi::sram::counter;
use emp_uapi::wire::{self, AckBody, FrameHeader, FrameKind, NackReason};
use emp_uapi::Le;

use crate::{Hal, Nic};

impl Nic {
    /// Receiver state piggybacked on ACKs: posted receives plus free
    /// overflow slots on the port, and a coarse "slow down" level.
    fn rx_credits(&self, port: u16) -> (u16, u8) {
        let st = &self.ports[port as usize];
        let posted = st.posted.len() as u32;
        // Messages the port would accept now: posted receives, then what
        // its mode holds for unexpected ones (the pool, retained headers).
        let held = match st.mode {
            crate::MatchMode::Unexpected => {
                let room = self.overflow.available() + self.cfg.unexp_headers.saturating_sub(self.rdv_held);
                room.min(self.unexp.capacity() - self.unexp.used())
            }
            crate::MatchMode::OrderedRefusal if self.cfg.overflow_slots > 0 => self.overflow.available(),
            crate::MatchMode::OrderedRefusal => 0,
        };
        let credits = posted + held;
        let level = match credits {
            0 => 2,
            1..=3 => 1,
            _ => 0,
        };
        (credits.min(u16::MAX as u32) as u16, level)
    }

    /// Header of a control frame (ACK, NACK, atomic reply) to `peer` about
    /// group `g` of message `seq`.
    pub(crate) fn ack_header(&self, peer: u32, kind: FrameKind, seq: u32, g: u32) -> FrameHeader {
        let p = self.peer(peer);
        FrameHeader {
            version: wire::WIRE_VERSION,
            kind: kind as u8,
            dst_gen: p.rx_gen.unwrap_or(0),
            src_node: self.node,
            dst_node: p.node,
            src_port: self.ports[p.port as usize].addr,
            dst_port: p.rport,
            src_gen: self.ports[p.port as usize].gen,
            payload_len: 0,
            msg_seq: seq,
            tx_floor: 0,
            frame_index: g * self.cfg.group_size,
            frame_count: 0,
        }
    }

    pub(crate) fn send_ack<H: Hal>(&mut self, hal: &mut H, peer: u32, seq: u32, g: u32) {
        let hdr = self.ack_header(peer, FrameKind::Ack, seq, g);
        let (rx_credits, fc_level) = self.rx_credits(self.peer(peer).port);
        let body =
            AckBody { group: g, rx_credits, fc_level, rx_expected: self.peer(peer).rx_expected, ..Default::default() };
        self.emit_control(hal, &hdr, &body);
        self.count(counter::ACKS_TX, 1);
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
        let body = AckBody {
            group: g,
            missing_mask: mask,
            rx_credits,
            reason: reason as u8,
            fc_level,
            rx_expected: self.peer(peer).rx_expected,
        };
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
        match self.dispatch(hal, crate::cpu::Step::SendAck) {
            Some(cpu) => self.enqueue(hal, cpu, crate::cpu::Work::Control { hdr: *hdr, body: *body }),
            None => self.put_control(hal, hdr, body),
        }
    }

    pub(crate) fn put_control<H: Hal>(&mut self, hal: &mut H, hdr: &FrameHeader, body: &AckBody) {
        let mut b = [0u8; FrameHeader::SIZE + AckBody::SIZE];
        wire::emit_ack(hdr, body, &mut b).expect("fits");
        hal.mac_transmit(hdr.dst_node, &b);
    }
}
