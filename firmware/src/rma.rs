//! Remote write and read (one-sided; seed 001 ch. 2's directed sends and
//! ch. 5's remote write, verbs' RDMA WRITE / READ).
//!
//! Both ride the reliable message path: an RMA message is a DATA-shaped
//! message of kind `Rma` whose payload starts with an [`RmaHeader`], so it
//! takes the peer's next message sequence number, is acknowledged,
//! retransmitted and deduplicated like any message, and is therefore
//! executed exactly once at the target.
//!
//! - **Write**: the initiator's send record reads the local source; the
//!   target admits the message on its header frame (key, secret, rights,
//!   bounds for the whole length: `guard.rs`) and stores every frame's data
//!   straight into the named region instead of a posted receive. It
//!   completes at the initiator when acknowledged (`RdmaWrite`). With
//!   immediate data the target also consumes a posted receive that matches
//!   (initiator, tag = the immediate), completed as `RecvRdmaImm` once all
//!   the data is in; no such receive means "not ready", as for a send.
//! - **Read**: the initiator keeps a read record ([`ReadTx`], bounded by
//!   `Config::rma_reads_max`) and sends a one-frame READ_REQ message naming
//!   it (`cookie` = slot and stamp). The target admits it, takes it (so a
//!   retransmitted request is acknowledged again, never executed twice) and
//!   answers with a READ_RESP message of its own, whose data its send
//!   record reads from the region (re-checked frame by frame). The
//!   initiator stores that data into the read's local buffer and completes
//!   the read (`RdmaRead`) when all of it is in. A read whose response does
//!   not arrive within `rx_idle_timeout_ns` of its request's
//!   acknowledgement fails `RetryLimitExceeded` (the target gave up).
//!
//! - **Rendezvous pull** (`RDV_READ`): a read of a send message the
//!   receiver retained as an unexpected header (`rx.rs`), started when a
//!   receive matches it. It names the message by its sequence number on
//!   the peer, not a key: the sender's NIC serves only that held send's
//!   own buffer, and completes the send when its `READ_RESP` is
//!   acknowledged. The read record completes the receive (`Recv`).
//!
//! A refusal is a NACK `RemoteAccess` of the message's header frame: the
//! target leaves its memory untouched and does not take the message, the
//! initiator completes the operation with `RemoteAccessError` and its
//! floor moves past it.

use emp_uapi::desc::{
    Opcode, RemoteSge, Status, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE, MR_REMOTE_READ, MR_REMOTE_WRITE, WD_IMM,
};
use emp_uapi::sram::counter;
use emp_uapi::wire::{self, rma_op, FrameHeader, MsgHeader, NackReason, RmaHeader};
use emp_uapi::Le;

use crate::cq::Completion;
use crate::guard::RemoteTarget;
use crate::mr::Buf;
use crate::rx::RxOwner;
use crate::timer::Timer;
use crate::{Hal, LocalDesc, Nic};

/// Bytes of the header that leads every RMA message.
pub(crate) const HDR: u64 = RmaHeader::SIZE as u64;

/// Where an RMA message's data (after its header) comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RmaSource {
    /// The send record's local SGEs (a write).
    Local,
    /// A region of this port named by a remote access (a read response).
    Remote(RemoteTarget),
    /// No data (a read request).
    None,
}

/// The RMA part of a send record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RmaTx {
    pub hdr: RmaHeader,
    pub source: RmaSource,
    /// Data bytes after the header.
    pub data_len: u64,
    /// A read request: the read record (slot, stamp) it belongs to.
    pub read: Option<(u32, u32)>,
    /// A rendezvous pull's response: the held send (slot, seq) it carries
    /// the data of, completed with it.
    pub rdv_send: Option<(u32, u32)>,
}

/// A remote read being performed.
#[derive(Debug)]
pub(crate) struct ReadTx {
    pub port: u16,
    pub peer: u32,
    pub desc: LocalDesc,
    pub stamp: u32,
    /// Stamp of the armed response timer: nonzero once the request was
    /// acknowledged and only the response is awaited.
    pub timer: u32,
    /// Data bytes the response must carry.
    pub want: u64,
    /// A rendezvous pull: the unexpected entry it fetches, whose receive
    /// (`desc`) it completes.
    pub rdv: Option<RdvPull>,
}

/// What a rendezvous pull's read record keeps of its unexpected entry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RdvPull {
    pub entry: u32,
    pub tag: u64,
    pub total_len: u64,
    pub imm: Option<u32>,
}

/// Bounded table of read records.
pub(crate) type ReadTable = crate::slots::Slots<ReadTx>;

fn cookie(slot: u32, stamp: u32) -> u64 {
    (slot as u64) << 32 | stamp as u64
}

fn uncookie(c: u64) -> (u32, u32) {
    ((c >> 32) as u32, c as u32)
}

impl Nic {
    /// The peek before a descriptor is taken from the send ring: may an
    /// RMA of `op` be consumed now (room for its records)?
    pub(crate) fn rma_fits(&self, op: Opcode) -> bool {
        op != Opcode::RdmaRead || !self.rma_reads.is_full()
    }

    /// A validated remote write or read from the send ring.
    pub(crate) fn post_rma<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, ld: LocalDesc, op: Opcode) {
        debug_assert!(op.is_rma());
        if !self.route_valid(hal, ld.wd.node) {
            return self.bad_descriptor(hal, port, &ld, op);
        }
        let local_access = if op == Opcode::RdmaWrite { MR_LOCAL_READ } else { MR_LOCAL_WRITE };
        if let Err(st) = self.check_sges(hal, port, ld.sges(), local_access) {
            return self.complete(hal, port, Completion::of(&ld, op, st));
        }
        // A read's length travels in 32 bits; either fits the message limit.
        if ld.len + HDR > self.cfg.msg_max || ld.len > u32::MAX as u64 {
            return self.complete(hal, port, Completion::of(&ld, op, Status::TooLarge));
        }
        let Some(peer) = self.peer_for(now, port, ld.wd.node, ld.wd.port, 0) else {
            return self.complete(hal, port, Completion::of(&ld, op, Status::TableFull));
        };
        let remote: RemoteSge = ld.wd.remote();
        let mut hdr =
            RmaHeader { rkey: remote.key, secret: remote.secret, offset: remote.offset, ..Default::default() };
        let rma = if op == Opcode::RdmaWrite {
            let imm = ld.wd.flags & WD_IMM != 0;
            hdr.op = if imm { rma_op::WRITE_IMM } else { rma_op::WRITE };
            hdr.cookie = if imm { ld.wd.tag } else { 0 };
            RmaTx { hdr, source: RmaSource::Local, data_len: ld.len, read: None, rdv_send: None }
        } else {
            let stamp = self.next_stamp();
            let read = ReadTx { port, peer, desc: ld, stamp, timer: 0, want: ld.len, rdv: None };
            let slot = self.rma_reads.insert_checked(read);
            hdr.op = rma_op::READ_REQ;
            hdr.len = ld.len as u32;
            hdr.cookie = cookie(slot, stamp);
            RmaTx { hdr, source: RmaSource::None, data_len: 0, read: Some((slot, stamp)), rdv_send: None }
        };
        self.enqueue_tx_rma(now, port, peer, ld, rma);
    }

    /// A posted receive `d` matched retained header `e`: pull its data from
    /// the sender into `d` (the caller checked `recv_fits`).
    pub(crate) fn rdv_pull(&mut self, now: u64, port: u16, e: u32, d: &LocalDesc) {
        let u = *self.recv.unexp.get(e).expect("live entry");
        let want = u.total_len.min(d.len);
        let stamp = self.next_stamp();
        let rdv = Some(RdvPull { entry: e, tag: u.tag, total_len: u.total_len, imm: u.imm });
        let slot = self.rma_reads.insert_checked(ReadTx { port, peer: u.peer, desc: *d, stamp, timer: 0, want, rdv });
        self.recv.unexp.get_mut(e).pull = Some((slot, stamp));
        let hdr = RmaHeader {
            op: rma_op::RDV_READ,
            offset: u.seq as u64,
            len: want as u32,
            cookie: cookie(slot, stamp),
            ..Default::default()
        };
        let rma = RmaTx { hdr, source: RmaSource::None, data_len: 0, read: Some((slot, stamp)), rdv_send: None };
        self.enqueue_tx_rma(now, port, u.peer, LocalDesc::new(&WorkDesc::default()), rma);
    }

    /// Payload bytes `[off, off + out.len())` of an RMA message: the header
    /// part is written here; returns where the data part starts in `out`
    /// and its offset in the data, when there is data to read.
    pub(crate) fn rma_payload(rma: &RmaTx, off: u64, out: &mut [u8]) -> Option<(usize, u64)> {
        let mut hb = [0u8; RmaHeader::SIZE];
        rma.hdr.put(&mut hb);
        let head = HDR.saturating_sub(off).min(out.len() as u64) as usize;
        if head > 0 {
            out[..head].copy_from_slice(&hb[off as usize..off as usize + head]);
        }
        (head < out.len()).then(|| (head, off + head as u64 - HDR))
    }

    /// Reads the data part of an RMA message's frame from host memory.
    pub(crate) fn rma_data<H: Hal>(
        &mut self,
        hal: &mut H,
        port: u16,
        desc: &LocalDesc,
        source: RmaSource,
        data_off: u64,
        out: &mut [u8],
    ) -> Result<(), Status> {
        match source {
            RmaSource::Local => self.sge_io(hal, port, desc.sges(), data_off, Buf::FromHost(out), MR_LOCAL_READ),
            RmaSource::Remote(t) => self.remote_io(hal, port, &t, data_off, Buf::FromHost(out), MR_REMOTE_READ),
            RmaSource::None => Err(Status::AccessDenied),
        }
    }

    /// An RMA send record retired (`finish_tx`): a write completes, a read
    /// request hands over to its read record, a read response (the
    /// target's own message) reports nothing.
    pub(crate) fn rma_tx_done<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        port: u16,
        desc: &LocalDesc,
        rma: &RmaTx,
        status: Status,
    ) {
        match (rma.hdr.op, rma.read) {
            (rma_op::WRITE | rma_op::WRITE_IMM, _) => {
                let mut c = Completion::of(desc, Opcode::RdmaWrite, status);
                c.byte_len = rma.data_len.min(u32::MAX as u64) as u32;
                self.complete(hal, port, c);
            }
            (rma_op::READ_REQ | rma_op::RDV_READ, Some((slot, stamp))) => {
                if self.rma_reads.get(slot).is_none_or(|r| r.stamp != stamp) {
                    return; // The response came first and completed the read.
                }
                // A request given up while its response is arriving (its
                // ACKs lost): the response decides, not the request.
                if status != Status::Success && !self.read_arriving(slot, stamp) {
                    return self.read_finish(hal, slot, status);
                }
                self.read_arm(now, slot);
            }
            _ => {
                if status != Status::Success {
                    self.count(counter::MSGS_FAILED, 1);
                }
                // A rendezvous response: the held send it carried is done.
                if let Some((s, seq)) = rma.rdv_send {
                    if self.send.tx.get(s).is_some_and(|m| m.seq == seq && m.held) {
                        self.finish_tx(hal, now, s, status);
                    }
                }
            }
        }
    }

    fn read_arm(&mut self, now: u64, slot: u32) {
        let t = self.next_stamp();
        self.rma_reads.get_mut(slot).timer = t;
        self.arm_timer(now + self.cfg.rx_idle_timeout_ns, Timer::RmaRead { slot, stamp: t });
    }

    /// A read's response timer fired: still arriving, wait on; else the
    /// target gave the response up.
    pub(crate) fn on_read_timeout<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32, stamp: u32) {
        let Some(r) = self.rma_reads.get(slot) else { return };
        if r.timer != stamp {
            return;
        }
        if self.read_arriving(slot, r.stamp) {
            return self.read_arm(now, slot);
        }
        self.count(counter::TIMEOUTS, 1);
        self.read_finish(hal, slot, Status::RetryLimitExceeded);
    }

    /// Is the response to read (`slot`, `stamp`) being received?
    fn read_arriving(&self, slot: u32, stamp: u32) -> bool {
        let Some(r) = self.rma_reads.get(slot) else { return false };
        let owner = RxOwner::ReadResp { slot, stamp };
        self.recv.peer(r.peer).rx_active.iter().any(|&x| self.recv.rx.get(x).is_some_and(|m| m.owner == owner))
    }

    /// Retires read `slot` and completes its descriptor (a rendezvous
    /// pull: its receive, and its unexpected entry goes).
    fn read_finish<H: Hal>(&mut self, hal: &mut H, slot: u32, status: Status) {
        let r = self.rma_reads.remove(slot);
        let (node, rport) = (self.peer(r.peer).node, self.peer(r.peer).rport);
        if let Some(p) = r.rdv {
            if self.recv.unexp.get(p.entry).is_some_and(|u| u.pull == Some((slot, r.stamp))) {
                self.unexp_remove(p.entry);
            }
            let status = match status {
                Status::Success if p.total_len > r.desc.len => Status::Truncated,
                s => s,
            };
            if status == Status::Success || status == Status::Truncated {
                self.count(counter::RDV_PULLS, 1);
            }
            let mut c = Completion::of(&r.desc, Opcode::Recv, status);
            if matches!(status, Status::Success | Status::Truncated) {
                c.byte_len = r.want as u32;
            }
            c.tag = p.tag;
            c.src_node = node;
            c.src_port = rport;
            c.msg_len = p.total_len.min(u32::MAX as u64) as u32;
            c.imm = p.imm;
            return self.complete(hal, r.port, c);
        }
        let mut c = Completion::of(&r.desc, Opcode::RdmaRead, status);
        if status == Status::Success {
            c.byte_len = r.desc.len.min(u32::MAX as u64) as u32;
        }
        c.src_node = node;
        c.src_port = rport;
        self.complete(hal, r.port, c);
    }

    /// A read response's receive record finished.
    pub(crate) fn read_resp_done<H: Hal>(&mut self, hal: &mut H, slot: u32, stamp: u32, error: Option<Status>) {
        if self.rma_reads.get(slot).is_some_and(|r| r.stamp == stamp) {
            self.read_finish(hal, slot, error.unwrap_or(Status::Success));
        }
    }

    /// The port closes: its reads complete `Flushed` (their send records
    /// and receive records were flushed first).
    pub(crate) fn rma_flush_port<H: Hal>(&mut self, hal: &mut H, port: u16) {
        let mine: Vec<u32> = self.rma_reads.iter().filter(|(_, r)| r.port == port).map(|(s, _)| s).collect();
        for s in mine {
            self.read_finish(hal, s, Status::Flushed);
        }
    }

    /// The header frame of the next message from `peer` is an RMA one.
    pub(crate) fn on_rma_first<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        peer: u32,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        payload: &[u8],
    ) {
        let seq = hdr.msg_seq;
        let Ok(rh) = RmaHeader::parse(payload, msg.total_len) else {
            return self.count(counter::DROPPED_MALFORMED, 1); // Checked by Frame::parse.
        };
        if msg.total_len > self.cfg.msg_max || wire::frames_for(msg.total_len, self.mtu) != hdr.frame_count as u64 {
            return self.recv_cpu().send_nack(hal, peer, seq, 0, 0, NackReason::TooLarge);
        }
        let port = hdr.dst_port;
        let data_len = msg.total_len - HDR;
        match rh.op {
            rma_op::WRITE | rma_op::WRITE_IMM => {
                let t = RemoteTarget { key: rh.rkey, secret: rh.secret, offset: rh.offset, len: data_len };
                if self.remote_admit(hal, now, hdr.src_node, port, &t, MR_REMOTE_WRITE).is_err() {
                    return self.recv_cpu().send_nack(hal, peer, seq, 0, 0, NackReason::RemoteAccess);
                }
                let (owner, desc, at) = if rh.op == rma_op::WRITE_IMM {
                    let posted = &self.recv.ports[port as usize].posted;
                    match posted.iter().position(|d| d.matches(hdr.src_node, hdr.src_port, rh.cookie)) {
                        Some(i) => (RxOwner::RmaWrite { imm: true }, posted[i], Some(i)),
                        None => return self.recv_cpu().refuse_next(hal, peer, hdr, Some(rh.cookie)),
                    }
                } else {
                    (RxOwner::RmaWrite { imm: false }, LocalDesc::new(&WorkDesc::default()), None)
                };
                let msg = MsgHeader { tag: rh.cookie, ..*msg };
                let Some(r) = self.recv_cpu().rx_open(now, peer, hdr, &msg, desc, owner) else {
                    return self.recv_cpu().refuse_next(hal, peer, hdr, Some(rh.cookie));
                };
                self.recv.rx.get_mut(r).rma = Some(t);
                if let Some(i) = at {
                    self.recv.ports[port as usize].posted.remove(i);
                }
                self.recv_cpu().rx_took_next(peer, seq);
                self.deliver(hal, now, r, hdr, Some(&msg), payload);
                self.recv_cpu().nack_gap(hal, peer);
            }
            rma_op::READ_REQ => {
                let t = RemoteTarget { key: rh.rkey, secret: rh.secret, offset: rh.offset, len: rh.len as u64 };
                if self.remote_admit(hal, now, hdr.src_node, port, &t, MR_REMOTE_READ).is_err() {
                    return self.recv_cpu().send_nack(hal, peer, seq, 0, 0, NackReason::RemoteAccess);
                }
                if rh.len as u64 + HDR > self.cfg.msg_max {
                    return self.recv_cpu().send_nack(hal, peer, seq, 0, 0, NackReason::TooLarge);
                }
                if self.send.tx.is_full() {
                    // No record for the answer now: the requester retries.
                    return self.recv_cpu().refuse_next(hal, peer, hdr, Some(0));
                }
                self.recv_cpu().rx_took_next(peer, seq);
                self.count(counter::RX_FRAMES, 1);
                self.count(counter::MSGS_RX, 1);
                self.recv_cpu().send_ack(hal, peer, seq, 0);
                let resp = RmaHeader { op: rma_op::READ_RESP, cookie: rh.cookie, ..Default::default() };
                let rma =
                    RmaTx { hdr: resp, source: RmaSource::Remote(t), data_len: t.len, read: None, rdv_send: None };
                self.enqueue_tx_rma(now, port, peer, LocalDesc::new(&WorkDesc::default()), rma);
                self.recv_cpu().nack_gap(hal, peer);
            }
            rma_op::RDV_READ => self.on_rdv_read(hal, now, peer, hdr, &rh),
            _ => {
                // READ_RESP: the data of one of our reads.
                let (slot, stamp) = uncookie(rh.cookie);
                let read = self.rma_reads.get(slot).filter(|r| r.stamp == stamp && r.peer == peer && r.port == port);
                match read.map(|r| (r.desc, r.want)) {
                    Some((desc, want)) if want == data_len => {
                        let owner = RxOwner::ReadResp { slot, stamp };
                        let Some(r) = self.recv_cpu().rx_open(now, peer, hdr, msg, desc, owner) else {
                            return self.recv_cpu().refuse_next(hal, peer, hdr, Some(0));
                        };
                        self.recv_cpu().rx_took_next(peer, seq);
                        self.deliver(hal, now, r, hdr, Some(msg), payload);
                    }
                    _ => {
                        // A response for a read given up (or a forgery):
                        // taken and dropped, so the responder stops sending.
                        self.count(counter::DROPPED_UNEXPECTED, 1);
                        self.recv_cpu().rx_took_next(peer, seq);
                        self.recv_cpu().send_ack(hal, peer, seq, 0);
                    }
                }
                self.recv_cpu().nack_gap(hal, peer);
            }
        }
    }

    /// A rendezvous pull of our send `rh.offset` to this peer: its buffer
    /// is read into a `READ_RESP`, and the send completes with that
    /// response. A pull of no pullable message (finished, another kind,
    /// pulled already, longer than the message) is refused.
    fn on_rdv_read<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32, hdr: &FrameHeader, rh: &RmaHeader) {
        let seq = hdr.msg_seq;
        let target = u32::try_from(rh.offset).ok().and_then(|s| self.send.find_tx(peer, s));
        let held = target.filter(|&s| {
            let m = self.send.tx.get(s).expect("queued");
            m.pullable() && !m.pulling && rh.len as u64 <= m.desc.len
        });
        let Some(s) = held else {
            return self.recv_cpu().send_nack(hal, peer, seq, 0, 0, NackReason::RemoteAccess);
        };
        if self.send.tx.is_full() {
            // No record for the answer now: the puller retries.
            return self.recv_cpu().refuse_next(hal, peer, hdr, Some(0));
        }
        self.hold_tx(now, s);
        let m = self.send.tx.get_mut(s);
        m.pulling = true;
        let (port, desc, send_seq) = (m.port, m.desc, m.seq);
        self.recv_cpu().rx_took_next(peer, seq);
        self.count(counter::RX_FRAMES, 1);
        self.count(counter::MSGS_RX, 1);
        self.recv_cpu().send_ack(hal, peer, seq, 0);
        let resp = RmaHeader { op: rma_op::READ_RESP, cookie: rh.cookie, ..Default::default() };
        let rma = RmaTx {
            hdr: resp,
            source: RmaSource::Local,
            data_len: rh.len as u64,
            read: None,
            rdv_send: Some((s, send_seq)),
        };
        self.enqueue_tx_rma(now, port, peer, desc, rma);
        self.recv_cpu().nack_gap(hal, peer);
    }

    /// A remote write's receive record finished: with immediate data, its
    /// receive completes (a plain write reports nothing at the target).
    pub(crate) fn rma_write_done<H: Hal>(
        &mut self,
        hal: &mut H,
        m: &crate::rx::RxMsg,
        imm: bool,
        error: Option<Status>,
    ) {
        if !imm {
            return;
        }
        let src = self.peer(m.peer);
        let mut c = Completion::of(&m.desc, Opcode::RecvRdmaImm, error.unwrap_or(Status::Success));
        c.tag = m.tag;
        c.src_node = src.node;
        c.src_port = src.rport;
        c.msg_len = (m.total_len - HDR).min(u32::MAX as u64) as u32;
        self.complete(hal, m.port, c);
    }

    /// Checks the read records; returns the first rule broken.
    pub(crate) fn rma_invariants(&self) -> Result<(), String> {
        for (s, r) in self.rma_reads.iter() {
            let p =
                self.peers[r.peer as usize].as_ref().ok_or_else(|| format!("read {s} of a free peer {}", r.peer))?;
            if p.port != r.port {
                return Err(format!("read {s} on port {} but its peer is of port {}", r.port, p.port));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tx(hdr: RmaHeader) -> RmaTx {
        RmaTx { hdr, source: RmaSource::Local, data_len: 100, read: None, rdv_send: None }
    }

    #[test]
    fn the_header_leads_the_payload() {
        let h = RmaHeader { op: rma_op::WRITE, rkey: 0x1_0002, secret: 7, offset: 40, ..Default::default() };
        let mut out = [0xEEu8; 50];
        assert_eq!(Nic::rma_payload(&tx(h), 0, &mut out), Some((32, 0)));
        assert_eq!(RmaHeader::parse(&out, 132), Ok(h));
        // A frame that starts inside the header, and one past it.
        let mut part = [0u8; 10];
        assert_eq!(Nic::rma_payload(&tx(h), 28, &mut part), Some((4, 0)));
        assert_eq!(Nic::rma_payload(&tx(h), 40, &mut part), Some((0, 8)));
        let mut only = [0u8; 32];
        assert_eq!(Nic::rma_payload(&tx(h), 0, &mut only), None, "a header-only frame has no data");
    }

    #[test]
    fn cookies_name_slot_and_stamp() {
        assert_eq!(uncookie(cookie(5, 0xDEAD_BEEF)), (5, 0xDEAD_BEEF));
    }
}
