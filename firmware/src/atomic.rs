//! Remote atomics (Buntinas PhD, seed 001 ch. 5): fetch-and-add,
//! compare-and-swap and swap on a 32- or 64-bit word of a region the
//! target port registered with `MR_REMOTE_ATOMIC`, executed by the target
//! NIC without its host.
//!
//! Requester: an `AtomicTx` record per operation (bounded by
//! `Config::atomic_max`), a per-peer atomic sequence apart from the message
//! sequence, at most [`ATOMIC_WINDOW`] requests unanswered per peer (later
//! ones wait, in order), and a retransmission timer per request with the
//! message path's RTO, backoff and retry limit. The response is the ACK.
//!
//! Responder: per peer, the next sequence to execute and a result cache of
//! the last [`ATOMIC_WINDOW`] executed requests. Only `seq == expected` is
//! executed: read the word (one DMA), compute, write it back if it changed
//! (a second DMA; a CAS miss writes nothing), cache (status, old), reply.
//! A duplicate of an executed request gets the cached reply and is never
//! executed again; requests up to a window ahead wait in a bounded buffer
//! until their turn; anything else is dropped.
//!
//! Exactly once: the requester sends `s` only while
//! `s < oldest_unanswered + W`, and the responder has executed everything
//! below `oldest_unanswered`, so every request that can still be (re)sent lies in
//! `[expected - W, expected + W)`: below `expected` it hits the cache, above
//! it fits the wait buffer. Every request carries the requester's floor (its
//! oldest unanswered sequence) in `tx_floor`: sequences below it were given
//! up (retry limit) and are skipped, never executed late.
//!
//! Atomicity: the NIC runs one operation at a time, inline in the classify
//! step (never deferred to another NIC CPU), so NIC atomics are atomic with
//! respect to each other. They are **not** atomic with respect to loads and
//! stores of the target's host CPU: a host store racing a NIC atomic on the
//! same word can be lost (seed 001 §5.2.3 needed a NIC–host mutex for
//! that). Host code should touch such words only when the protocol above it
//! says no remote atomic is in flight, or go through the NIC itself. Words
//! are little-endian; a 32-bit operation touches exactly its 4 bytes.
//! A request that fails `RetryLimitExceeded` may or may not have executed.

use std::collections::VecDeque;

use emp_uapi::desc::{Opcode, RemoteSge, Status, MR_LOCAL_WRITE, MR_REMOTE_ATOMIC};
use emp_uapi::sram::counter;
use emp_uapi::wire::{self, atomic_op, AtomicBody, AtomicResult, FrameHeader, FrameKind, ATOMIC_WINDOW};
use emp_uapi::{seq_lt, Le};

use crate::cq::Completion;
use crate::guard::RemoteTarget;
use crate::mr::Buf;
use crate::timer::Timer;
use crate::{Hal, LocalDesc, Nic};

const W: u32 = ATOMIC_WINDOW;

/// One remote atomic being requested.
#[derive(Debug)]
pub(crate) struct AtomicTx {
    pub port: u16,
    pub peer: u32,
    pub desc: LocalDesc,
    pub op: Opcode,
    pub seq: u32,
    /// On the wire at least once (inside the window).
    pub sent: bool,
    /// Timeouts so far.
    pub retries: u32,
    /// Stamp of the armed timer.
    pub stamp: u32,
}

/// Bounded table of atomic requests.
pub(crate) type AtomicTable = crate::slots::Slots<AtomicTx>;

/// A cached result: what `seq` returned.
#[derive(Clone, Copy, Debug, Default)]
struct Cached {
    valid: bool,
    seq: u32,
    status: u8,
    old: u64,
}

/// Responder state for one requester (allocated on its first request).
#[derive(Debug)]
pub(crate) struct AtomicRx {
    /// The requester's port generation this state belongs to.
    gen: u16,
    /// Last time a request of `gen` arrived.
    gen_ns: u64,
    /// Next sequence to execute.
    expected: u32,
    /// Results of the last `W` executed requests, slot `seq % W`.
    cache: [Cached; W as usize],
    /// Requests ahead of `expected` (at most `W - 1` ahead), slot `seq % W`.
    waiting: [Option<(u32, AtomicBody)>; W as usize],
}

impl AtomicRx {
    fn new(gen: u16, expected: u32, now: u64) -> AtomicRx {
        AtomicRx { gen, gen_ns: now, expected, cache: [Cached::default(); W as usize], waiting: [None; W as usize] }
    }
}

/// Bytes of a responder state in a context image ([`AtomicRx::save`]).
pub(crate) const ATOMIC_RX_IMAGE: usize = 8 + W as usize * 16;

impl AtomicRx {
    /// Appends the state a saved context carries: the requester's
    /// generation, the next sequence and the replay cache. Requests held
    /// ahead of their turn are not kept: unanswered, their requester sends
    /// them again.
    pub(crate) fn save(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.gen.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.expected.to_le_bytes());
        for c in &self.cache {
            out.extend_from_slice(&[c.valid as u8, c.status, 0, 0]);
            out.extend_from_slice(&c.seq.to_le_bytes());
            out.extend_from_slice(&c.old.to_le_bytes());
        }
    }

    /// Reads what [`AtomicRx::save`] wrote (`ATOMIC_RX_IMAGE` bytes, untrusted).
    pub(crate) fn load(b: &[u8], now: u64) -> Result<Box<AtomicRx>, &'static str> {
        let b = b.get(..ATOMIC_RX_IMAGE).ok_or("atomic state truncated")?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        if u16_at(2) != 0 {
            return Err("atomic state: reserved bytes not zero");
        }
        let mut rx = Box::new(AtomicRx::new(u16_at(0), u32_at(4), now));
        for (i, c) in rx.cache.iter_mut().enumerate() {
            let at = 8 + i * 16;
            if b[at] > 1 || b[at + 2] != 0 || b[at + 3] != 0 {
                return Err("atomic cache entry: bad flag or reserved bytes");
            }
            let old = u64::from_le_bytes(b[at + 8..at + 16].try_into().expect("8 bytes"));
            *c = Cached { valid: b[at] == 1, status: b[at + 1], seq: u32_at(at + 4), old };
        }
        Ok(rx)
    }
}

/// A peer's atomic state, both directions.
#[derive(Debug, Default)]
pub(crate) struct PeerAtomics {
    /// Requester: next sequence number to assign.
    pub seq_next: u32,
    /// Requester: outstanding requests (atomic slots) in sequence order.
    pub queue: VecDeque<u32>,
    /// Responder: state for this requester, once it sent a request.
    pub rx: Option<Box<AtomicRx>>,
}

fn wire_op(op: Opcode) -> u8 {
    match op {
        Opcode::AtomicFetchAdd => atomic_op::FETCH_ADD,
        Opcode::AtomicCmpSwap => atomic_op::CMP_SWAP,
        _ => atomic_op::SWAP,
    }
}

/// The word's new value (only the low `width` bytes count).
fn compute(body: &AtomicBody, old: u64) -> u64 {
    let mask = if body.width == 4 { u32::MAX as u64 } else { u64::MAX };
    let new = match body.op {
        atomic_op::FETCH_ADD => old.wrapping_add(body.operand),
        atomic_op::CMP_SWAP if old == body.compare & mask => body.operand,
        atomic_op::CMP_SWAP => old,
        _ => body.operand,
    };
    new & mask
}

impl Nic {
    /// The peek before a descriptor is taken from the send ring: may it be
    /// consumed now (room for its NIC record)?
    pub(crate) fn atomic_fits(&self) -> bool {
        !self.atomics.is_full()
    }

    /// A validated remote atomic descriptor from the send ring.
    pub(crate) fn post_atomic<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, ld: LocalDesc, op: Opcode) {
        debug_assert!(op.is_atomic() && ld.wd.num_sge == 2);
        if !self.route_valid(hal, ld.wd.node) {
            return self.bad_descriptor(hal, port, &ld, op);
        }
        // Only the local result word is ours to check; sge[1] names the
        // target's memory and is checked there.
        if let Err(st) = self.check_sges(hal, port, &ld.sges()[..1], MR_LOCAL_WRITE) {
            return self.complete(hal, port, Completion::of(&ld, op, st));
        }
        let Some(peer) = self.peer_for(now, port, ld.wd.node, ld.wd.port, 0) else {
            return self.complete(hal, port, Completion::of(&ld, op, Status::TableFull));
        };
        let seq = {
            let a = &mut self.peer_mut(peer).atomic;
            let s = a.seq_next;
            a.seq_next = s.wrapping_add(1);
            s
        };
        let rec = AtomicTx { port, peer, desc: ld, op, seq, sent: false, retries: 0, stamp: 0 };
        let slot = self.atomics.insert_checked(rec);
        self.peer_mut(peer).atomic.queue.push_back(slot);
        self.atomic_pump(hal, now, peer);
    }

    /// Oldest sequence the requester may still send to `peer`.
    fn atomic_floor(&self, peer: u32) -> u32 {
        let a = &self.peer(peer).atomic;
        match a.queue.front() {
            Some(&s) => self.atomics.get(s).expect("queued").seq,
            None => a.seq_next,
        }
    }

    /// Sends every queued request of `peer` inside the window for the first time.
    fn atomic_pump<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32) {
        let floor = self.atomic_floor(peer);
        let mut ready = [0u32; W as usize];
        let mut n = 0;
        for &s in self.peer(peer).atomic.queue.iter().take(W as usize) {
            let a = self.atomics.get(s).expect("queued");
            if a.seq.wrapping_sub(floor) >= W {
                break;
            }
            if !a.sent {
                ready[n] = s;
                n += 1;
            }
        }
        for &s in &ready[..n] {
            self.atomics.get_mut(s).sent = true;
            self.atomic_transmit(hal, s);
            self.atomic_arm(now, s);
        }
    }

    fn atomic_arm(&mut self, now: u64, slot: u32) {
        let stamp = self.next_stamp();
        let (rto, rto_max) = (self.cfg.rto_ns, self.cfg.rto_ns_max);
        let a = self.atomics.get_mut(slot);
        a.stamp = stamp;
        let backoff = rto.saturating_mul(1u64 << a.retries.min(20)).min(rto_max);
        self.arm_timer(now + backoff, Timer::Atomic { slot, stamp });
    }

    /// Puts request `slot` on the wire (first time or again).
    fn atomic_transmit<H: Hal>(&mut self, hal: &mut H, slot: u32) {
        let a = self.atomics.get(slot).expect("live");
        let p = self.peer(a.peer);
        let (wd, remote, width) = (&a.desc.wd, RemoteSge::from_sge(a.desc.wd.sge[1]), a.desc.wd.sge[0].len);
        let hdr = FrameHeader {
            version: wire::WIRE_VERSION,
            kind: FrameKind::AtomicReq as u8,
            dst_gen: self.send.peer(a.peer).remote_gen,
            src_node: self.node,
            dst_node: p.node,
            src_port: self.ports[a.port as usize].addr,
            dst_port: p.rport,
            src_gen: self.ports[a.port as usize].gen,
            payload_len: 0,
            msg_seq: a.seq,
            tx_floor: self.atomic_floor(a.peer),
            frame_index: 0,
            frame_count: 0,
        };
        let body = AtomicBody {
            op: wire_op(a.op),
            width: width as u8,
            reserved: 0,
            rkey: remote.key,
            offset: remote.offset,
            operand: wd.tag,
            compare: if a.op == Opcode::AtomicCmpSwap { wd.ignore } else { 0 },
            secret: remote.secret,
            reserved2: 0,
        };
        let mut b = [0u8; FrameHeader::SIZE + AtomicBody::SIZE];
        let n = wire::emit_atomic_req(&hdr, &body, &mut b).expect("fits");
        hal.mac_transmit(hdr.dst_node, &b[..n]);
    }

    /// `Timer::Atomic` fired: resend, or give up after `retry_limit`.
    pub(crate) fn on_atomic_timeout<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32, stamp: u32) {
        let Some(&AtomicTx { stamp: armed, peer, retries, .. }) = self.atomics.get(slot) else { return };
        if armed != stamp {
            return; // Answered, and the slot reused.
        }
        self.count(counter::TIMEOUTS, 1);
        if retries >= self.cfg.retry_limit {
            self.atomic_finish(hal, slot, Status::RetryLimitExceeded, 0);
            return self.atomic_pump(hal, now, peer);
        }
        self.atomics.get_mut(slot).retries += 1;
        self.atomic_transmit(hal, slot);
        self.atomic_arm(now, slot);
    }

    /// Retires request `slot`: the old value goes to the local result word
    /// and into the completion's `tag`. The caller pumps the window.
    fn atomic_finish<H: Hal>(&mut self, hal: &mut H, slot: u32, status: Status, old: u64) {
        let a = self.atomics.remove(slot);
        let p = self.peer_mut(a.peer);
        p.atomic.queue.retain(|&s| s != slot);
        let (node, rport) = (p.node, p.rport);
        let result = a.desc.wd.sge[0];
        let mut status = status;
        if status == Status::Success {
            let bytes = old.to_le_bytes();
            let io = self.region_io(
                hal,
                a.port,
                result.key,
                result.offset,
                Buf::ToHost(&bytes[..result.len as usize]),
                MR_LOCAL_WRITE,
            );
            if let Err(e) = io {
                status = e;
            }
        }
        let mut c = Completion::of(&a.desc, a.op, status);
        c.byte_len = result.len;
        c.tag = old;
        c.src_node = node;
        c.src_port = rport;
        self.complete(hal, a.port, c);
    }

    /// The port closes: every atomic it requested completes `Flushed`
    /// (its responder state goes with its peer entries).
    pub(crate) fn atomic_flush_port<H: Hal>(&mut self, hal: &mut H, port: u16) {
        let mine: Vec<u32> = self.atomics.iter().filter(|(_, a)| a.port == port).map(|(s, _)| s).collect();
        for s in mine {
            self.atomic_finish(hal, s, Status::Flushed, 0);
        }
    }

    /// An ATOMIC_RESP: completes the request it answers.
    pub(crate) fn on_atomic_resp<H: Hal>(&mut self, hal: &mut H, now: u64, hdr: &FrameHeader, res: &AtomicResult) {
        let port = hdr.dst_port;
        if !self.ports[port as usize].open || hdr.dst_gen != self.ports[port as usize].gen {
            return; // For an earlier process on this port.
        }
        let Some(peer) = self.find_peer(port, hdr.src_node, hdr.src_port) else { return };
        let found = self
            .peer(peer)
            .atomic
            .queue
            .iter()
            .copied()
            .find(|&s| self.atomics.get(s).is_some_and(|a| a.seq == hdr.msg_seq));
        let Some(slot) = found else {
            return self.count(counter::DUPLICATES, 1);
        };
        let status = Status::from_u8(res.status).unwrap_or(Status::RemoteAccessError);
        if status == Status::RemotePortClosed {
            // The target port is gone: so is every request queued to it.
            while let Some(&s) = self.peer(peer).atomic.queue.front() {
                self.atomic_finish(hal, s, Status::RemotePortClosed, 0);
            }
            self.send.peer_mut(peer).remote_gen = 0;
            return;
        }
        self.send.peer_mut(peer).remote_gen = hdr.src_gen;
        self.atomic_finish(hal, slot, status, res.old);
        self.atomic_pump(hal, now, peer);
    }

    /// An ATOMIC_REQ: execute it (in sequence order, once), replay it from
    /// the cache, hold it for its turn, or drop it.
    pub(crate) fn on_atomic_req<H: Hal>(&mut self, hal: &mut H, now: u64, hdr: &FrameHeader, body: &AtomicBody) {
        let port = hdr.dst_port;
        let st = &self.ports[port as usize];
        if !st.open || (hdr.dst_gen != 0 && hdr.dst_gen != st.gen) {
            return self.atomic_reply_raw(hal, hdr, Status::RemotePortClosed);
        }
        let Some(peer) = self.peer_for(now, port, hdr.src_node, hdr.src_port, 0) else {
            return self.atomic_reply_raw(hal, hdr, Status::RemoteTableFull);
        };
        if !self.atomic_incarnation(now, peer, hdr) {
            return self.count(counter::DROPPED_UNEXPECTED, 1);
        }
        let rx = self.peer_mut(peer).atomic.rx.as_mut().expect("set up by atomic_incarnation");
        let seq = hdr.msg_seq;
        if seq == rx.expected {
            self.atomic_execute(hal, now, peer, seq, body);
            return self.atomic_run_waiting(hal, now, peer);
        }
        if seq_lt(seq, rx.expected) {
            let c = rx.cache[(seq % W) as usize];
            if c.valid && c.seq == seq {
                self.count(counter::ATOMIC_REPLAYS, 1);
                let st = Status::from_u8(c.status).expect("cached statuses are valid");
                return self.atomic_reply(hal, peer, seq, st, c.old);
            }
            // Older than the cache or skipped: its requester is past it.
            return self.count(counter::DUPLICATES, 1);
        }
        if seq.wrapping_sub(rx.expected) < W {
            // Early (an earlier request was lost or reordered): its turn comes.
            rx.waiting[(seq % W) as usize] = Some((seq, *body));
            return;
        }
        self.count(counter::DROPPED_UNEXPECTED, 1);
    }

    /// Tracks the requester's incarnation and floor; false for a request
    /// from an earlier incarnation ([`crate::Config::new_incarnation`]). A
    /// new incarnation starts afresh: its
    /// sequence numbers restart and must not hit the old cache.
    fn atomic_incarnation(&mut self, now: u64, peer: u32, hdr: &FrameHeader) -> bool {
        let known = self.peer(peer).atomic.rx.as_ref().map(|rx| (rx.gen, rx.gen_ns));
        if let Some((gen, gen_ns)) = known {
            if gen != hdr.src_gen && !self.cfg.new_incarnation(gen, gen_ns, hdr.src_gen, now) {
                return false;
            }
        }
        let a = &mut self.peer_mut(peer).atomic;
        let rx = a.rx.get_or_insert_with(|| Box::new(AtomicRx::new(hdr.src_gen, hdr.tx_floor, now)));
        if rx.gen != hdr.src_gen {
            **rx = AtomicRx::new(hdr.src_gen, hdr.tx_floor, now);
        }
        rx.gen_ns = now;
        if seq_lt(rx.expected, hdr.tx_floor) {
            // Requests below the floor were given up: never run them late.
            rx.expected = hdr.tx_floor;
            for w in rx.waiting.iter_mut() {
                if w.is_some_and(|(s, _)| seq_lt(s, hdr.tx_floor)) {
                    *w = None;
                }
            }
        }
        true
    }

    /// Runs the requests that were waiting for their turn.
    fn atomic_run_waiting<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32) {
        for _ in 0..W {
            let rx = self.peer_mut(peer).atomic.rx.as_mut().expect("live");
            let i = (rx.expected % W) as usize;
            match rx.waiting[i].take() {
                Some((seq, body)) if seq == rx.expected => self.atomic_execute(hal, now, peer, seq, &body),
                _ => return,
            }
        }
    }

    /// Executes request `seq` (the expected one), caches and answers it.
    fn atomic_execute<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32, seq: u32, body: &AtomicBody) {
        let (status, old) = match self.atomic_apply(hal, now, peer, body) {
            Ok(old) => (Status::Success, old),
            Err(()) => (Status::RemoteAccessError, 0),
        };
        let rx = self.peer_mut(peer).atomic.rx.as_mut().expect("live");
        debug_assert_eq!(seq, rx.expected);
        rx.cache[(seq % W) as usize] = Cached { valid: true, seq, status: status as u8, old };
        rx.expected = seq.wrapping_add(1);
        self.atomic_reply(hal, peer, seq, status, old);
    }

    /// The operation itself on the target's host memory: one DMA to read,
    /// one to write back when the value changes.
    fn atomic_apply<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32, body: &AtomicBody) -> Result<u64, ()> {
        let (port, src) = (self.peer(peer).port, self.peer(peer).node);
        let width = body.width as usize;
        let t = RemoteTarget { key: body.rkey, secret: body.secret, offset: body.offset, len: width as u64 };
        self.remote_admit(hal, now, src, port, &t, MR_REMOTE_ATOMIC).map_err(|_| ())?;
        if !body.offset.is_multiple_of(width as u64) {
            return Err(());
        }
        let mut b = [0u8; 8];
        self.region_io(hal, port, body.rkey, body.offset, Buf::FromHost(&mut b[..width]), MR_REMOTE_ATOMIC)
            .map_err(|_| ())?;
        let old = u64::from_le_bytes(b);
        let new = compute(body, old);
        if new != old {
            let nb = new.to_le_bytes();
            self.region_io(hal, port, body.rkey, body.offset, Buf::ToHost(&nb[..width]), MR_REMOTE_ATOMIC)
                .map_err(|_| ())?;
        }
        Ok(old)
    }

    fn atomic_reply<H: Hal>(&mut self, hal: &mut H, peer: u32, seq: u32, status: Status, old: u64) {
        let mut hdr = self.recv_cpu().ack_header(peer, FrameKind::AtomicResp, seq, 0);
        // Atomics keep their own record of the requester's incarnation.
        hdr.dst_gen = self.peer(peer).atomic.rx.as_ref().map_or(0, |r| r.gen);
        put_resp(hal, &hdr, status, old);
    }

    /// A reply to a requester we keep no state for (closed port, full table).
    fn atomic_reply_raw<H: Hal>(&mut self, hal: &mut H, req: &FrameHeader, status: Status) {
        let hdr = self.recv_cpu().raw_reply_header(req, FrameKind::AtomicResp);
        put_resp(hal, &hdr, status, 0);
        self.count(counter::NACKS_TX, 1);
    }

    /// Checks the atomic tables; returns the first rule broken.
    pub(crate) fn atomic_invariants(&self) -> Result<(), String> {
        let mut queued = 0u32;
        for (i, p) in self.live_peers() {
            let mut prev: Option<u32> = None;
            let floor = p.atomic.queue.front().and_then(|&s| self.atomics.get(s)).map(|a| a.seq);
            for &s in &p.atomic.queue {
                let a = self.atomics.get(s).ok_or_else(|| format!("peer {i} queues free atomic slot {s}"))?;
                if a.peer != i {
                    return Err(format!("atomic slot {s} belongs to peer {} not {i}", a.peer));
                }
                if prev.is_some_and(|q| !seq_lt(q, a.seq)) {
                    return Err(format!("peer {i}: atomic queue out of sequence order at {}", a.seq));
                }
                if a.sent && floor.is_some_and(|f| a.seq.wrapping_sub(f) >= W) {
                    return Err(format!("peer {i}: atomic {} sent beyond the window", a.seq));
                }
                if !seq_lt(a.seq, p.atomic.seq_next) {
                    return Err(format!("peer {i}: atomic {} not below seq_next {}", a.seq, p.atomic.seq_next));
                }
                prev = Some(a.seq);
                queued += 1;
            }
            if let Some(rx) = &p.atomic.rx {
                for (k, w) in rx.waiting.iter().enumerate() {
                    let Some((s, _)) = w else { continue };
                    if s % W != k as u32 || !seq_lt(rx.expected, *s) || s.wrapping_sub(rx.expected) >= W {
                        return Err(format!("peer {i}: waiting atomic {s} in slot {k} with expected {}", rx.expected));
                    }
                }
            }
        }
        if queued != self.atomics.used() {
            return Err(format!("{} atomic records, {queued} queued", self.atomics.used()));
        }
        Ok(())
    }
}

fn put_resp<H: Hal>(hal: &mut H, hdr: &FrameHeader, status: Status, old: u64) {
    let res = AtomicResult { status: status as u8, reserved: [0; 7], old };
    let mut b = [0u8; FrameHeader::SIZE + AtomicResult::SIZE];
    let n = wire::emit_atomic_resp(hdr, &res, &mut b).expect("fits");
    hal.mac_transmit(hdr.dst_node, &b[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(op: u8, width: u8, operand: u64, compare: u64) -> AtomicBody {
        AtomicBody { op, width, operand, compare, ..Default::default() }
    }

    #[test]
    fn fetch_add_wraps_at_the_width() {
        assert_eq!(compute(&body(atomic_op::FETCH_ADD, 4, 2, 0), 0xFFFF_FFFF), 1);
        assert_eq!(compute(&body(atomic_op::FETCH_ADD, 8, 2, 0), 0xFFFF_FFFF), 0x1_0000_0001);
        assert_eq!(compute(&body(atomic_op::FETCH_ADD, 8, 1, 0), u64::MAX), 0);
    }

    #[test]
    fn cmp_swap_writes_only_on_a_hit() {
        assert_eq!(compute(&body(atomic_op::CMP_SWAP, 8, 9, 5), 5), 9);
        assert_eq!(compute(&body(atomic_op::CMP_SWAP, 8, 9, 5), 6), 6);
        // 32-bit: the compare value's low word is what counts.
        assert_eq!(compute(&body(atomic_op::CMP_SWAP, 4, 9, 5), 5), 9);
        assert_eq!(compute(&body(atomic_op::CMP_SWAP, 4, 9, 1 << 32 | 5), 5), 9);
    }

    #[test]
    fn swap_takes_the_operand() {
        assert_eq!(compute(&body(atomic_op::SWAP, 8, 7, 0), 3), 7);
        assert_eq!(compute(&body(atomic_op::SWAP, 4, 7, 0), 3), 7);
    }

    #[test]
    fn wire_ops_match_opcodes() {
        assert_eq!(wire_op(Opcode::AtomicFetchAdd), atomic_op::FETCH_ADD);
        assert_eq!(wire_op(Opcode::AtomicCmpSwap), atomic_op::CMP_SWAP);
        assert_eq!(wire_op(Opcode::AtomicSwap), atomic_op::SWAP);
    }
}
