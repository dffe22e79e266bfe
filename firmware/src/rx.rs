//! Receive side (EMP thesis §2.3.1, §3.1): classify the frame, find its
//! message, drop duplicates, accept out-of-order frames, DMA the payload
//! straight into the matched receive buffer, ACK each complete group, NACK
//! holes. Messages from one peer are matched strictly in sequence order.
//! A message whose header matches no posted receive becomes, in the
//! `Unexpected` matching mode, an unexpected entry of its port (payload in
//! the bounded eager pool, or its header alone: a rendezvous whose data is
//! pulled with an `RDV_READ` when a receive matches), and the sender's
//! later messages go on; receives posted later search the entries in
//! arrival order, so messages that match the same receive keep their order
//! (MPI's non-overtaking rule). In the `OrderedRefusal` mode it blocks
//! later ones from the same peer until a receive is posted (EMP's rule:
//! refuse, the sender retransmits) — unless the bounded overflow buffer
//! takes it.

use emp_uapi::coll::CollHeader;
use emp_uapi::desc::{Opcode, Status, MR_LOCAL_WRITE, MR_REMOTE_WRITE};
use emp_uapi::sram::counter;
use emp_uapi::wire::{self, FrameHeader, FrameKind, MsgHeader, NackReason};
use emp_uapi::{seq_le, seq_lt, Le};

use crate::cq::Completion;
use crate::mr::Buf;
use crate::recv_cpu::RecvCpu;
use crate::{FlowControl, Hal, LocalDesc, MatchMode, Nic};

/// Who a receive record reports to when it finishes. The receive path
/// treats both alike frame by frame; the dispatcher (`lib.rs`) routes what
/// a broadcast's record reports to the collective layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RxOwner {
    /// A posted receive (the record's `desc`): completes with a CQE.
    Recv,
    /// Broadcast data the NIC receives for collective op `op` (`stamp`
    /// names the op across slot reuse). The message opens with a
    /// `CollHeader`, which is not delivered.
    Bcast { op: u32, stamp: u32 },
    /// A remote write into the region in the record's `rma`; with
    /// immediate data, `desc` is the posted receive it completes. The
    /// message opens with an `RmaHeader`, which is not delivered.
    RmaWrite { imm: bool },
    /// The response to read `slot` (`stamp` names it across slot reuse),
    /// landing in the read's local buffer (`desc`).
    ReadResp { slot: u32, stamp: u32 },
}

/// A message being received into a matched receive.
#[derive(Debug)]
pub(crate) struct RxMsg {
    pub port: u16,
    pub peer: u32,
    pub seq: u32,
    pub desc: LocalDesc,
    pub tag: u64,
    pub total_len: u64,
    /// The sender's immediate data, reported in the receive's completion.
    pub imm: Option<u32>,
    pub frame_count: u32,
    /// Oldest incomplete group: every group below it is complete.
    base: u32,
    /// Which frames of groups `base..base + masks.len()` arrived, group g
    /// in slot `g % masks.len()` (bit i = its i-th frame; a group is at
    /// most 32 frames). A slot is cleared when `base` passes it. The sender
    /// sends nothing beyond (it agrees on `window_frames` and
    /// `group_size`); the slots come from a pool sized at boot
    /// (`RecvSide::rx_rings`), so the state does not grow with the message.
    masks: Box<[u32]>,
    pub frames_received: u32,
    pub highest: u32,
    pub last_activity: u64,
    pub error: Option<Status>,
    /// Leading message bytes not delivered (a collective's or RMA header).
    pub skip: u64,
    /// A remote write: the region its data goes to (instead of `desc`).
    pub rma: Option<crate::guard::RemoteTarget>,
    /// Who the record reports to when it finishes.
    pub owner: RxOwner,
    /// Frames received without a gap from frame 0.
    pub contig: u32,
    /// Frames acknowledged together (the NIC's `Config::group_size`).
    pub group_size: u32,
    /// Names this record across its slot's reuse (`Nic::next_stamp`), for
    /// jobs that outlive it (a completion written after it retired).
    pub stamp: u32,
    /// A payload of it was queued to another CPU as work, not as a job:
    /// its completion must follow it there as work too.
    pub payload_as_work: bool,
}

/// What recording a frame in its receive record found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameOutcome {
    /// Seen before. `group_complete`: its whole group is here (ACK it again).
    Duplicate { group_complete: bool },
    /// New. `out_of_order`: not the frame after the highest one seen.
    /// `group_done`: it completed its group. `missing`: when it is its
    /// group's last frame and the group is not complete, the frames still
    /// missing (bit i = the group's i-th frame), else 0. `all_done`: every
    /// frame of the message is in.
    Accepted { out_of_order: bool, group_done: bool, missing: u32, all_done: bool },
    /// Beyond the receive window (more than `window_frames` past the oldest
    /// incomplete group): a sender that disagrees on the window. Not kept.
    BeyondWindow,
}

impl RxMsg {
    /// A fresh record for the message whose first frame is `hdr`/`msg`,
    /// landing in `desc`, reporting to `owner`; nothing received yet.
    /// `masks` (cleared) holds the window's per-group state.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        port: u16,
        peer: u32,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        desc: LocalDesc,
        owner: RxOwner,
        group_size: u32,
        masks: Box<[u32]>,
        now: u64,
    ) -> RxMsg {
        assert!(!masks.is_empty() && masks.iter().all(|&m| m == 0));
        assert!((1..=32).contains(&group_size));
        RxMsg {
            port,
            peer,
            seq: hdr.msg_seq,
            desc,
            tag: msg.tag,
            total_len: msg.total_len,
            imm: msg.imm(),
            frame_count: hdr.frame_count,
            base: 0,
            masks,
            frames_received: 0,
            highest: 0,
            last_activity: now,
            error: None,
            skip: match owner {
                RxOwner::Recv => 0,
                RxOwner::Bcast { .. } => CollHeader::SIZE as u64,
                RxOwner::RmaWrite { .. } | RxOwner::ReadResp { .. } => wire::RmaHeader::SIZE as u64,
            },
            rma: None,
            owner,
            contig: 0,
            group_size,
            stamp: 0,
            payload_as_work: false,
        }
    }

    /// Does a frame agree with the message this record receives?
    fn fits(&self, hdr: &FrameHeader, msg: Option<&MsgHeader>, payload_len: usize, mtu: u32) -> bool {
        let f = hdr.frame_index;
        let off = wire::frame_offset(f, mtu);
        let expect_len = (wire::payload_capacity(mtu, f) as u64).min(self.total_len.saturating_sub(off));
        hdr.frame_count == self.frame_count
            && msg.is_none_or(|h| h.total_len == self.total_len && h.tag == self.tag && h.imm() == self.imm)
            && payload_len as u64 == expect_len
    }

    /// Groups of the message.
    fn group_count(&self) -> u32 {
        self.frame_count.div_ceil(self.group_size)
    }

    /// The mask of group `g` with every frame in.
    fn full_mask(&self, g: u32) -> u32 {
        let (first, end) = wire::group_range(self.group_size, self.frame_count, g);
        u32::MAX >> (32 - (end - first))
    }

    /// Records the arrival of frame `f` (< `frame_count`): the group's
    /// bitmask, the window and the contiguous prefix.
    pub fn record(&mut self, f: u32) -> FrameOutcome {
        assert!(f < self.frame_count, "frame {f} of {}", self.frame_count);
        let g = f / self.group_size;
        if g < self.base {
            return FrameOutcome::Duplicate { group_complete: true };
        }
        let ring = self.masks.len();
        if g - self.base >= ring as u32 {
            return FrameOutcome::BeyondWindow;
        }
        let full = self.full_mask(g);
        let (first, end) = wire::group_range(self.group_size, self.frame_count, g);
        let bit = 1u32 << (f - first);
        let mask = self.masks[g as usize % ring];
        if mask & bit != 0 {
            return FrameOutcome::Duplicate { group_complete: mask == full };
        }
        let out_of_order = f != 0 && f != self.highest + 1 && self.frames_received > 0;
        let mask = mask | bit;
        self.masks[g as usize % ring] = mask;
        self.frames_received += 1;
        self.highest = self.highest.max(f);
        let group_done = mask == full;
        let missing = if !group_done && f + 1 == end { full & !mask } else { 0 };
        if group_done && g == self.base {
            self.slide();
        }
        self.contig = if self.base == self.group_count() {
            self.frame_count
        } else {
            self.base * self.group_size + self.masks[self.base as usize % ring].trailing_ones()
        };
        FrameOutcome::Accepted { out_of_order, group_done, missing, all_done: self.frames_received == self.frame_count }
    }

    /// The oldest incomplete group completed: the window slides past every
    /// complete group at its start, clearing their slots.
    fn slide(&mut self) {
        let ring = self.masks.len();
        while self.base < self.group_count() && self.masks[self.base as usize % ring] == self.full_mask(self.base) {
            self.masks[self.base as usize % ring] = 0;
            self.base += 1;
        }
    }

    /// Bytes of per-message state (record and window): bounded by the
    /// window, not by the message's length.
    pub fn state_bytes(&self) -> usize {
        core::mem::size_of::<Self>() + core::mem::size_of_val(&*self.masks)
    }
}

/// Bounded table of receive records.
pub(crate) type RxTable = crate::slots::Slots<RxMsg>;

/// A small unexpected message's payload, held on the NIC until a receive
/// matches it (its entry, `Unexpected`, says whose it is).
#[derive(Debug, Default)]
struct OverflowSlot {
    data: Vec<u8>,
}

/// The bounded overflow buffer (Portals-style), `slots × slot_size` bytes.
#[derive(Debug)]
pub(crate) struct Overflow {
    slots: Vec<OverflowSlot>,
    free: Vec<u32>,
    slot_size: u32,
}

impl Overflow {
    pub(crate) fn new(slots: u32, slot_size: u32) -> Self {
        Overflow {
            slots: (0..slots).map(|_| OverflowSlot { data: Vec::with_capacity(slot_size as usize) }).collect(),
            free: (0..slots).rev().collect(),
            slot_size,
        }
    }
    pub(crate) fn used(&self) -> u32 {
        (self.slots.len() - self.free.len()) as u32
    }
    pub(crate) fn free(&mut self, s: u32) {
        self.slots[s as usize].data.clear();
        self.free.push(s);
    }
    pub(crate) fn available(&self) -> u32 {
        self.free.len() as u32
    }
}

/// A message no posted receive matched, kept for a later receive.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unexpected {
    pub port: u16,
    pub src_node: u16,
    pub src_port: u16,
    pub tag: u64,
    pub total_len: u64,
    /// The sender's immediate data.
    pub imm: Option<u32>,
    /// The eager pool slot holding its payload; `None`: a retained header
    /// (the data stays in the sender's buffer).
    pub data: Option<u32>,
    /// A retained header: the sender's peer entry and the message's
    /// sequence number there (what the pull names).
    pub peer: u32,
    pub seq: u32,
    /// A receive matched it and its data is being pulled (read slot, stamp).
    pub pull: Option<(u32, u32)>,
    /// A probe claimed it: only a claimed receive naming this handle
    /// (`claim_handle`) takes it.
    pub claimed: Option<u16>,
}

/// The handle a claiming probe reports for entry `e` claimed with `stamp`.
pub(crate) fn claim_handle(e: u32, stamp: u16) -> u32 {
    e << 16 | stamp as u32
}

/// Bounded table of unexpected entries (eager pool slots + retained headers).
pub(crate) type UnexpTable = crate::slots::Slots<Unexpected>;

/// A frame `accept_frame` took into a receive record.
pub(crate) struct Accepted {
    pub owner: RxOwner,
    /// Where the delivered bytes start in the frame's payload, when all of
    /// them reached memory (a broadcast forwards them from there).
    pub stored_from: Option<usize>,
    /// Frames received without a gap from frame 0.
    pub contig: u32,
    /// Every frame is in and the record is to be finished now.
    pub finish: bool,
}

/// Where an admitted DATA frame belongs (`RecvCpu::classify_data`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum DataVerdict {
    /// A frame of a message being received, into record `r`.
    Active(u32),
    /// A frame of a message finished here (its ACK was lost).
    Old,
    /// The header frame of the next message, a collective one: the
    /// collective layer decides.
    CollFirst,
    /// The header frame of the next message, a remote write, read request
    /// or read response: the RMA layer decides.
    RmaFirst,
    /// The header frame of the next message.
    NextMsg,
    /// A frame of a message whose header this port retained (rendezvous):
    /// its data comes by pull, the frame is not kept.
    Retained,
    /// A frame that cannot be matched yet (its message's header frame is
    /// missing, or an earlier message is not matched).
    Early,
}

/// A DATA frame's sender incarnation against the one the receiver knows
/// (`RecvCpu::incarnation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Incarnation {
    /// The same (or the first frame from it): admitted.
    Same,
    /// An older one: dropped.
    Old,
    /// A newer one: the receive side is reset for it.
    New,
}

/// What the receive path did with a DATA frame out of the ordinary, kept in
/// `RecvSide::trace` for diagnosis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RxTrace {
    /// From an older incarnation of the sender's port: dropped.
    OldIncarnation,
    /// Not the next frame expected (old, or early): answered or dropped.
    OutOfTurn,
    /// The next message, refused for lack of a buffer.
    Refused,
}

/// What happened to the header frame of the next message from a peer.
enum MatchOutcome {
    Matched(u32),
    /// A one-frame message for this posted receive, received here and now:
    /// it needs no receive record ([`RecvCpu::receive_whole`]).
    Whole(LocalDesc),
    Overflowed,
    /// Kept as a retained header: the sender waits for the pull.
    Retained,
    NotReady,
    TooLarge,
}

impl Nic {
    /// Admits a DATA frame: its port is open and of this incarnation, its
    /// sender has a peer entry of the right incarnation, and messages the
    /// sender gave up on are skipped. Returns the peer, or `None` when the
    /// frame was answered or dropped here.
    pub(crate) fn admit_data<H: Hal>(&mut self, hal: &mut H, now: u64, hdr: &FrameHeader) -> Option<u32> {
        let port = hdr.dst_port;
        let st = &self.ports[port as usize];
        if !st.open || (hdr.dst_gen != 0 && hdr.dst_gen != st.gen) {
            // Closed, or meant for an earlier process on this port: unless
            // that process had received it, refused.
            if !self.linger_answer(hal, now, hdr) {
                self.recv_cpu().send_raw_nack(hal, hdr, NackReason::PortClosed);
            }
            return None;
        }
        let Some(peer) = self.peer_for(now, port, hdr.src_node, hdr.src_port, hdr.tx_floor) else {
            self.recv_cpu().send_raw_nack(hal, hdr, NackReason::PeerTableFull);
            return None;
        };
        match self.recv_cpu().incarnation(now, peer, hdr) {
            Incarnation::Same => {}
            Incarnation::Old => return None,
            Incarnation::New => {
                while let Some(&r) = self.recv.peer(peer).rx_active.first() {
                    self.finish_rx(hal, now, r, Some(Status::SenderAborted));
                }
                self.unexp_drop_peer(peer);
                self.recv_cpu().new_incarnation(now, peer, hdr);
            }
        }
        self.skip_to_floor(hal, now, peer, hdr.tx_floor);
        self.recv_cpu().admitted(now, peer, hdr);
        Some(peer)
    }

    /// The sender finished or abandoned everything below `floor`: skip
    /// those messages and abort any partially received one.
    fn skip_to_floor<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32, floor: u32) {
        if !seq_lt(self.recv.peer(peer).rx_expected, floor) {
            return;
        }
        // Finishing a record takes it out of `rx_active`: the next one moves up.
        while let Some(r) = self.recv_cpu().aborted_by_floor(peer, floor) {
            self.finish_rx(hal, now, r, Some(Status::SenderAborted));
        }
        self.recv_cpu().set_floor(peer, floor);
    }

    /// May a receive be posted now? One that matches a retained header
    /// needs a read record and a send record for its pull; until both
    /// tables have room the receive waits in its ring (so it cannot pass
    /// the entry and take a later message).
    pub(crate) fn recv_fits(&self) -> bool {
        !self.rma_reads.is_full() && !self.send.tx.is_full()
    }

    /// Takes unexpected entry `e` out of its port's queue and the table,
    /// if it is still there; returns it.
    pub(crate) fn unexp_remove(&mut self, e: u32) -> Option<Unexpected> {
        let u = *self.recv.unexp.get(e)?;
        let q = &mut self.recv.ports[u.port as usize].unexpected;
        let i = q.iter().position(|&x| x == e)?;
        q.remove(i);
        self.recv.unexp.remove(e);
        match u.data {
            Some(s) => self.recv.overflow.free(s),
            None => {
                self.recv.rdv_held -= 1;
                self.recv.peer_mut(u.peer).rdv_entries -= 1;
            }
        }
        Some(u)
    }

    /// The payload of eager unexpected entry `e` (`None` for a retained header).
    pub(crate) fn eager_payload(&self, e: u32) -> Option<&[u8]> {
        let s = self.recv.unexp.get(e)?.data?;
        Some(&self.recv.overflow.slots[s as usize].data)
    }

    /// Largest payload an eager entry holds.
    pub(crate) fn eager_slot_size(&self) -> u32 {
        self.recv.overflow.slot_size
    }

    /// Eager entries that can be added now.
    pub(crate) fn eager_room(&self) -> u32 {
        self.recv.overflow.available().min(self.recv.unexp.capacity() - self.recv.unexp.used())
    }

    /// A restored context's unexpected entry, appended to `port`'s queue:
    /// eager (`retained` `None`: its payload into an overflow slot; the
    /// caller checked `eager_room`), or a retained header of message
    /// `seq`, `total_len` bytes, from `peer` (the caller checked the table
    /// and the header count).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn restore_unexpected(
        &mut self,
        port: u16,
        peer: u32,
        src: (u16, u16),
        tag: u64,
        imm: Option<u32>,
        payload: &[u8],
        retained: Option<(u64, u32)>,
    ) {
        let data = match retained {
            Some(_) => None,
            None => {
                let s = self.recv.overflow.free.pop().expect("room checked");
                self.recv.overflow.slots[s as usize].data.clear();
                self.recv.overflow.slots[s as usize].data.extend_from_slice(payload);
                Some(s)
            }
        };
        let (total_len, seq) = retained.unwrap_or((payload.len() as u64, 0));
        let entry = Unexpected {
            port,
            src_node: src.0,
            src_port: src.1,
            tag,
            total_len,
            imm,
            data,
            peer,
            seq,
            pull: None,
            claimed: None,
        };
        let e = self.recv.unexp.insert_checked(entry);
        self.recv.ports[port as usize].unexpected.push_back(e);
        if data.is_none() {
            self.recv.rdv_held += 1;
            self.recv.peer_mut(peer).rdv_entries += 1;
        }
    }

    /// The port closes: its unexpected entries go (pulls were flushed first).
    pub(crate) fn unexp_flush_port(&mut self, port: u16) {
        while let Some(&e) = self.recv.ports[port as usize].unexpected.front() {
            self.unexp_remove(e);
        }
    }

    /// The sender of retained headers is a new incarnation: its old
    /// messages' data is gone, so headers not being pulled are dropped (a
    /// pull already under way fails on its own, with an error).
    pub(crate) fn unexp_drop_peer(&mut self, peer: u32) {
        let port = self.peer(peer).port as usize;
        let mine: Vec<u32> = self.recv.ports[port]
            .unexpected
            .iter()
            .copied()
            .filter(|&e| self.recv.unexp.get(e).is_some_and(|u| u.data.is_none() && u.peer == peer && u.pull.is_none()))
            .collect();
        for e in mine {
            self.unexp_remove(e);
            self.count(counter::DROPPED_UNEXPECTED, 1);
        }
    }

    /// Checks the unexpected entries against the queues and pools.
    pub(crate) fn unexp_invariants(&self) -> Result<(), String> {
        let queued: usize = self.recv.ports.iter().map(|p| p.unexpected.len()).sum();
        if queued as u32 != self.recv.unexp.used() {
            return Err(format!("{} unexpected entries, {queued} queued", self.recv.unexp.used()));
        }
        let eager = self.recv.unexp.iter().filter(|(_, u)| u.data.is_some()).count() as u32;
        if eager != self.recv.overflow.used() || self.recv.unexp.used() - eager != self.recv.rdv_held {
            return Err(format!(
                "{eager} eager entries for {} pool slots; {} headers counted {}",
                self.recv.overflow.used(),
                self.recv.unexp.used() - eager,
                self.recv.rdv_held
            ));
        }
        for (e, u) in self.recv.unexp.iter().filter(|(_, u)| u.data.is_none()) {
            let p = self.peers[u.peer as usize].as_ref().ok_or_else(|| format!("header {e} of a free peer"))?;
            if p.port != u.port || (p.node, p.rport) != (u.src_node, u.src_port) {
                return Err(format!("header {e} names peer {} of another endpoint", u.peer));
            }
        }
        let held: u32 = self.live_peers().map(|(i, _)| self.recv.peer(i).rdv_entries).sum();
        if held != self.recv.rdv_held {
            return Err(format!("peers count {held} headers, {} held", self.recv.rdv_held));
        }
        Ok(())
    }

    /// Every quarter of the idle timeout: abort partially received
    /// messages no frame arrived for within the timeout (one timer for all
    /// records, not one per message).
    pub(crate) fn on_rx_sweep<H: Hal>(&mut self, hal: &mut H, now: u64) {
        for r in 0..self.cfg.rx_max {
            if self.recv.rx.get(r).is_some_and(|m| now >= m.last_activity + self.cfg.rx_idle_timeout_ns) {
                self.finish_rx(hal, now, r, Some(Status::SenderAborted));
            }
        }
        self.recv.sweep_at = (self.recv.rx.used() > 0).then_some(now + self.cfg.rx_idle_timeout_ns / 4);
    }
}

impl RecvCpu<'_> {
    /// The oldest unexpected entry of `port` that receive or probe `d`
    /// matches, passing by entries being pulled or claimed.
    pub(crate) fn find_unexpected(&self, port: u16, d: &LocalDesc) -> Option<u32> {
        self.recv.ports[port as usize].unexpected.iter().copied().find(|&e| {
            let u = self.recv.unexp.get(e).expect("queued entry is live");
            u.pull.is_none() && u.claimed.is_none() && d.matches(u.src_node, u.src_port, u.tag)
        })
    }

    /// A probe (`Opcode::Probe`): reports the oldest matching unexpected
    /// message without receiving it; with `WD_CLAIM` claims it.
    pub(crate) fn probe<H: Hal>(&mut self, hal: &mut H, port: u16, d: &LocalDesc) {
        let Some(e) = self.find_unexpected(port, d) else {
            return self.complete(hal, port, Completion::of(d, Opcode::Probe, Status::NoMessage));
        };
        let mut c = Completion::of(d, Opcode::Probe, Status::Success);
        if d.wd.flags & emp_uapi::desc::WD_CLAIM != 0 {
            let stamp = self.recv.stamp.next() as u16;
            self.recv.unexp.get_mut(e).claimed = Some(stamp);
            c.byte_len = claim_handle(e, stamp);
        }
        let u = self.recv.unexp.get(e).expect("found");
        c.tag = u.tag;
        c.src_node = u.src_node;
        c.src_port = u.src_port;
        c.msg_len = u.total_len.min(u32::MAX as u64) as u32;
        c.imm = u.imm;
        self.complete(hal, port, c);
    }

    /// A cancel (`Opcode::Cancel`, `tag` = the receive's `wr_id`): the
    /// oldest such receive still posted goes back, completed `Canceled`.
    pub(crate) fn cancel_recv<H: Hal>(&mut self, hal: &mut H, port: u16, d: &LocalDesc) {
        let posted = &mut self.recv.ports[port as usize].posted;
        let Some(i) = posted.iter().position(|r| r.wd.wr_id == d.wd.tag) else {
            return self.complete(hal, port, Completion::of(d, Opcode::Cancel, Status::NoMessage));
        };
        let r = posted.remove(i).expect("found");
        self.complete(hal, port, Completion::of(&r, Opcode::Recv, Status::Canceled));
        self.complete(hal, port, Completion::of(d, Opcode::Cancel, Status::Success));
    }

    /// A claimed receive (`WD_CLAIM`, `tag` = the handle): takes exactly
    /// the entry a probe claimed, else completes `NoMessage`. `Some` as
    /// [`RecvCpu::take_unexpected`].
    pub(crate) fn recv_claimed<H: Hal>(&mut self, hal: &mut H, port: u16, d: &LocalDesc) -> Option<u32> {
        let (e, stamp) = ((d.wd.tag >> 16) as u32, d.wd.tag as u16);
        let ok = self.recv.unexp.get(e).is_some_and(|u| u.port == port && u.claimed == Some(stamp) && u.pull.is_none());
        if !ok {
            self.complete(hal, port, Completion::of(d, Opcode::Recv, Status::NoMessage));
            return None;
        }
        self.take_unexpected(hal, port, e, d)
    }

    /// Receive `d` takes unexpected entry `e`: an eager one is copied and
    /// completed now; a retained header is returned, for its pull
    /// (`Nic::rdv_pull`: a read and a send record, the whole program's).
    pub(crate) fn take_unexpected<H: Hal>(&mut self, hal: &mut H, port: u16, e: u32, d: &LocalDesc) -> Option<u32> {
        let u = *self.recv.unexp.get(e).expect("found");
        let Some(s) = u.data else { return Some(e) };
        let q = &mut self.recv.ports[port as usize].unexpected;
        let i = q.iter().position(|&x| x == e).expect("queued");
        q.remove(i);
        self.recv.unexp.remove(e);
        let data = core::mem::take(&mut self.recv.overflow.slots[s as usize].data);
        let total = data.len() as u64;
        let n = total.min(d.len) as usize;
        let io =
            self.shared.lock().mr.sge_io(hal, self.layout, port, d.sges(), 0, Buf::ToHost(&data[..n]), MR_LOCAL_WRITE);
        self.recv.overflow.slots[s as usize].data = data;
        self.recv.overflow.free(s);
        let status = match io {
            Err(e) => e,
            Ok(()) if total > d.len => Status::Truncated,
            Ok(()) => Status::Success,
        };
        self.count(counter::MSGS_RX, 1);
        let mut c = Completion::of(d, Opcode::Recv, status);
        c.byte_len = n as u32;
        c.tag = u.tag;
        c.src_node = u.src_node;
        c.src_port = u.src_port;
        c.msg_len = total.min(u32::MAX as u64) as u32;
        c.imm = u.imm;
        self.complete(hal, port, c);
        None
    }

    /// A DATA frame (naming a slot by now), handled by the receive side
    /// alone when it can be: an open port, a known sender of the same
    /// incarnation, and a message of the receive path's own. `false` when
    /// it needs the whole program (`Nic::on_data`): a closed port, a new
    /// sender or incarnation, a floor that aborts records, a collective or
    /// remote-access message. What changed by then, the whole program's
    /// admission does again the same way.
    pub(crate) fn try_data<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        hdr: &FrameHeader,
        msg: Option<&MsgHeader>,
        payload: &[u8],
    ) -> bool {
        let st = &self.ports[hdr.dst_port as usize];
        if !st.open || (hdr.dst_gen != 0 && hdr.dst_gen != st.gen) {
            return false;
        }
        let Some(&peer) = self.peer_index.get(&(hdr.dst_port, hdr.src_node, hdr.src_port)) else { return false };
        match self.incarnation(now, peer, hdr) {
            Incarnation::Same => {}
            Incarnation::Old => return true,
            Incarnation::New => return false,
        }
        if seq_lt(self.recv.peer(peer).rx_expected, hdr.tx_floor) {
            if self.aborted_by_floor(peer, hdr.tx_floor).is_some() {
                return false;
            }
            self.set_floor(peer, hdr.tx_floor);
        }
        self.admitted(now, peer, hdr);
        let verdict = self.classify_data(peer, hdr);
        self.on_verdict(hal, now, peer, verdict, hdr, msg, payload)
    }

    /// Acts on the verdict for an admitted DATA frame from `peer`, unless
    /// it needs the whole program (`false`): a frame of a record another
    /// layer owns, or the first frame of a collective or remote-access
    /// message on a port that is not suspended.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_verdict<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        peer: u32,
        verdict: DataVerdict,
        hdr: &FrameHeader,
        msg: Option<&MsgHeader>,
        payload: &[u8],
    ) -> bool {
        if self.ports[hdr.dst_port as usize].suspended {
            // C1: a suspended port finishes the messages it is receiving
            // but starts none; the sender retries after resume.
            if let DataVerdict::NextMsg | DataVerdict::CollFirst | DataVerdict::RmaFirst = verdict {
                let tag = msg.map(|m| m.tag).filter(|_| !matches!(verdict, DataVerdict::CollFirst));
                self.refuse_next(hal, peer, hdr, tag);
                return true;
            }
        }
        match verdict {
            DataVerdict::Active(r) => {
                // A broadcast's frames feed its forwarding: the whole program's.
                let Some(owner) = self.recv.rx.get(r).map(|m| m.owner) else { return false };
                if matches!(owner, RxOwner::Bcast { .. }) {
                    return false;
                }
                if self.accept_frame(hal, now, r, hdr, msg, payload).is_some_and(|a| a.finish) {
                    if owner == RxOwner::Recv {
                        self.finish_recv(hal, r, None);
                    } else {
                        // A remote write's or read response's report is
                        // the whole program's (`Nic::after_recv`).
                        let (m, error) = self.retire_rx(r, None);
                        self.recv.done.push_back((m, error));
                    }
                }
            }
            DataVerdict::Old => self.on_old_data(hal, peer, hdr),
            DataVerdict::Retained => self.on_retained_data(hal, peer, hdr),
            DataVerdict::Early => self.on_early_data(hal, now, peer, hdr),
            DataVerdict::NextMsg => {
                let msg = msg.expect("frame 0 carries the message header");
                self.on_next_msg(hal, now, peer, hdr, msg, payload);
            }
            DataVerdict::CollFirst | DataVerdict::RmaFirst => return false,
        }
        true
    }

    /// Tracks the sender's port generation: a first frame sets it, one of
    /// an older incarnation is dropped here, a new incarnation
    /// ([`crate::Config::new_incarnation`]) is for the whole program to
    /// reset the receive side for (`Nic::admit_data`).
    fn incarnation(&mut self, now: u64, peer: u32, hdr: &FrameHeader) -> Incarnation {
        let p = self.recv.peer(peer);
        match p.rx_gen {
            Some(g) if g == hdr.src_gen => {}
            None => self.recv.peer_mut(peer).rx_gen = Some(hdr.src_gen),
            Some(g) if self.cfg.new_incarnation(g, p.rx_gen_ns, hdr.src_gen, now) => return Incarnation::New,
            Some(_) => {
                self.note(hdr, 0, RxTrace::OldIncarnation);
                self.count(counter::DROPPED_UNEXPECTED, 1);
                return Incarnation::Old;
            }
        }
        self.recv.peer_mut(peer).rx_gen_ns = now;
        Incarnation::Same
    }

    /// The sender's port is a new incarnation and its old one's records
    /// are gone: receive from it as from a new sender, from `tx_floor` on.
    pub(crate) fn new_incarnation(&mut self, now: u64, peer: u32, hdr: &FrameHeader) {
        let p = self.recv.peer_mut(peer);
        p.rx_gen = Some(hdr.src_gen);
        p.rx_gen_ns = now;
        p.rx_expected = hdr.tx_floor;
        p.rnr_seq = None;
    }

    /// A partially received message from `peer` below `floor` (the sender
    /// gave it up), if any: its record is to be aborted. A complete record
    /// only waits for its receiving CPU: it is kept.
    pub(crate) fn aborted_by_floor(&self, peer: u32, floor: u32) -> Option<u32> {
        let partial = |m: &RxMsg| seq_lt(m.seq, floor) && m.frames_received < m.frame_count;
        self.recv.peer(peer).rx_active.iter().copied().find(|&r| self.recv.rx.get(r).is_some_and(partial))
    }

    /// Skips the messages from `peer` below `floor` (none is being received).
    pub(crate) fn set_floor(&mut self, peer: u32, floor: u32) {
        let p = self.recv.peer_mut(peer);
        p.rx_expected = floor;
        if p.rnr_seq.is_some_and(|s| seq_lt(s, floor)) {
            p.rnr_seq = None;
        }
    }

    /// A DATA frame from `peer` was admitted: the highest sequence seen
    /// and when the entry was last used follow it.
    pub(crate) fn admitted(&mut self, now: u64, peer: u32, hdr: &FrameHeader) {
        let p = self.recv.peer_mut(peer);
        p.last_ns = now;
        if seq_lt(p.max_seen, hdr.msg_seq) {
            p.max_seen = hdr.msg_seq;
        }
    }

    /// Where an admitted DATA frame from `peer` belongs (reads state only).
    pub(crate) fn classify_data(&self, peer: u32, hdr: &FrameHeader) -> DataVerdict {
        let p = self.recv.peer(peer);
        let seq = hdr.msg_seq;
        if let Some(r) = p.rx_active.iter().copied().find(|&r| self.recv.rx.get(r).is_some_and(|m| m.seq == seq)) {
            return DataVerdict::Active(r);
        }
        if seq_lt(seq, p.rx_expected) {
            let retained =
                |&e: &u32| self.recv.unexp.get(e).is_some_and(|u| u.data.is_none() && u.peer == peer && u.seq == seq);
            if self.recv.ports[hdr.dst_port as usize].unexpected.iter().any(retained) {
                return DataVerdict::Retained;
            }
            return DataVerdict::Old;
        }
        if seq != p.rx_expected || hdr.frame_index != 0 {
            return DataVerdict::Early;
        }
        match FrameKind::from_u8(hdr.kind) {
            Some(FrameKind::CollData) => DataVerdict::CollFirst,
            Some(FrameKind::Rma) => DataVerdict::RmaFirst,
            _ => DataVerdict::NextMsg,
        }
    }

    /// A frame of a retained message: the sender missed the `Retained`
    /// answer (or keeps the message alive while it waits): answered on its
    /// group's last frame, not kept.
    pub(crate) fn on_retained_data<H: Hal>(&mut self, hal: &mut H, peer: u32, hdr: &FrameHeader) {
        self.count(counter::DUPLICATES, 1);
        let g = hdr.frame_index / self.cfg.group_size;
        let (_, end) = wire::group_range(self.cfg.group_size, hdr.frame_count, g);
        if hdr.frame_index == 0 || hdr.frame_index + 1 == end {
            self.send_nack(hal, peer, hdr.msg_seq, 0, 0, NackReason::Retained);
        }
    }

    /// A frame of a message finished here: its ACK was lost. ACK again.
    pub(crate) fn on_old_data<H: Hal>(&mut self, hal: &mut H, peer: u32, hdr: &FrameHeader) {
        self.note(hdr, self.recv.peer(peer).rx_expected, RxTrace::OutOfTurn);
        self.count(counter::DUPLICATES, 1);
        let g = hdr.frame_index / self.cfg.group_size;
        self.send_ack(hal, peer, hdr.msg_seq, g);
    }

    /// The header frame of the next (non-collective) message: match it
    /// against the posted receives or the overflow buffer, else refuse it.
    pub(crate) fn on_next_msg<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        peer: u32,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        payload: &[u8],
    ) {
        let seq = hdr.msg_seq;
        match self.try_match(now, peer, hdr, msg, payload) {
            MatchOutcome::Matched(r) => {
                // A record of the receive path's own (`RxOwner::Recv`).
                if self.accept_frame(hal, now, r, hdr, Some(msg), payload).is_some_and(|a| a.finish) {
                    self.finish_recv(hal, r, None);
                }
                self.nack_gap(hal, peer);
            }
            MatchOutcome::Whole(desc) => {
                self.receive_whole(hal, now, peer, hdr, msg, payload, &desc);
                self.nack_gap(hal, peer);
            }
            MatchOutcome::Overflowed => {
                self.ack_message(hal, now, peer, seq, 0);
                self.nack_gap(hal, peer);
            }
            MatchOutcome::Retained => {
                self.send_nack(hal, peer, seq, 0, 0, NackReason::Retained);
                self.nack_gap(hal, peer);
            }
            MatchOutcome::TooLarge => self.send_nack(hal, peer, seq, 0, 0, NackReason::TooLarge),
            MatchOutcome::NotReady => self.refuse_next(hal, peer, hdr, Some(msg.tag)),
        }
    }

    /// The next message from `peer` was taken (consumed by the NIC, or given
    /// a receive record): later ones may follow.
    pub(crate) fn rx_took_next(&mut self, peer: u32, seq: u32) {
        let p = self.recv.peer_mut(peer);
        p.rx_expected = seq.wrapping_add(1);
        p.rnr_seq = None;
        p.rnr_coll = false;
        p.rx_taken = true;
    }

    /// No buffer for the next message: NACK it as not ready and remember it
    /// (its tag; `None` for a collective message, lifted by `coll_kick`),
    /// so a matching post asks the sender for it at once.
    pub(crate) fn refuse_next<H: Hal>(&mut self, hal: &mut H, peer: u32, hdr: &FrameHeader, tag: Option<u64>) {
        let seq = hdr.msg_seq;
        self.note(hdr, self.recv.peer(peer).rx_expected, RxTrace::Refused);
        self.count(counter::DROPPED_UNEXPECTED, 1);
        let p = self.recv.peer_mut(peer);
        p.rnr_seq = Some(seq);
        p.rnr_coll = tag.is_none();
        if let Some(tag) = tag {
            p.rnr_tag = tag;
        }
        self.send_nack(hal, peer, seq, 0, 0, NackReason::NoMatch);
    }

    /// A frame of a message that cannot be matched yet: its own header is
    /// missing, or an earlier message of this peer is not matched. Dropped;
    /// answered once per group transmission, on its last frame.
    pub(crate) fn on_early_data<H: Hal>(&mut self, hal: &mut H, now: u64, peer: u32, hdr: &FrameHeader) {
        let seq = hdr.msg_seq;
        let expected = self.recv.peer(peer).rx_expected;
        self.note(hdr, expected, RxTrace::OutOfTurn);
        self.count(counter::DROPPED_UNEXPECTED, 1);
        let g = hdr.frame_index / self.cfg.group_size;
        let (_, end) = wire::group_range(self.cfg.group_size, hdr.frame_count, g);
        if hdr.frame_index + 1 != end {
            return;
        }
        let refused = self.recv.peer(peer).rnr_seq == Some(expected);
        if refused {
            if self.cfg.flow_control != FlowControl::ModifiedAckNack || seq == expected {
                // Alive but not ready: keeps the sender from burning retries.
                self.send_nack(hal, peer, seq, g, 0, NackReason::NoMatch);
            }
        } else if now >= self.recv.peer(peer).last_loss_nack_ns + self.cfg.rto_ns / 2 {
            // The expected message's header frame was lost: ask for it now.
            self.recv.peer_mut(peer).last_loss_nack_ns = now;
            self.send_nack(hal, peer, expected, 0, 1, NackReason::Loss);
        }
    }

    /// The next message became matchable, but frames of it or of later
    /// messages were already seen and dropped (they arrived before their
    /// turn): ask for it now rather than wait for the sender's timer.
    pub(crate) fn nack_gap<H: Hal>(&mut self, hal: &mut H, peer: u32) {
        let p = self.recv.peer(peer);
        if seq_le(p.rx_expected, p.max_seen) {
            let expected = p.rx_expected;
            self.recv.peer_mut(peer).last_loss_nack_ns = 0;
            self.send_nack(hal, peer, expected, 0, 1, NackReason::Loss);
        }
    }

    /// A receive was posted: if it matches a message this port refused,
    /// tell that sender to send it now instead of waiting out its backoff.
    pub(crate) fn kick_refused<H: Hal>(&mut self, hal: &mut H, port: u16, d: &LocalDesc) {
        for peer in 0..self.peers.len() as u32 {
            let refused = self.peers[peer as usize].as_ref().filter(|p| {
                let r = self.recv.peer(peer);
                p.port == port
                    && !r.rnr_coll
                    && r.rnr_seq == Some(r.rx_expected)
                    && d.matches(p.node, p.rport, r.rnr_tag)
            });
            if let Some(seq) = refused.map(|_| self.recv.peer(peer).rx_expected) {
                self.send_nack(hal, peer, seq, 0, 1, NackReason::Loss);
            }
        }
    }

    fn note(&mut self, hdr: &FrameHeader, expected: u32, outcome: RxTrace) {
        if self.recv.trace.len() == 32 {
            self.recv.trace.pop_front();
        }
        self.recv.trace.push_back((hdr.msg_seq, hdr.frame_index, expected, outcome));
    }

    /// Matches the header frame of the next message against the port's
    /// posted receives (in posting order), else the overflow buffer.
    fn try_match(&mut self, now: u64, peer: u32, hdr: &FrameHeader, msg: &MsgHeader, payload: &[u8]) -> MatchOutcome {
        if msg.total_len > self.cfg.msg_max {
            return MatchOutcome::TooLarge;
        }
        let port = hdr.dst_port;
        let frame_count = wire::frames_for(msg.total_len, self.mtu);
        if frame_count != hdr.frame_count as u64 {
            return MatchOutcome::TooLarge; // Sender's MTU differs: refuse loudly.
        }
        let posted = &self.recv.ports[port as usize].posted;
        if let Some(i) = posted.iter().position(|d| d.matches(hdr.src_node, hdr.src_port, msg.tag)) {
            let desc = posted[i];
            // A record for a message whose only frame is here, whose
            // payload this CPU stores now, would be opened and retired
            // within this frame: none is made. Any other message, or a
            // frame whose payload disagrees with its header, takes the
            // record's path (which checks and counts it).
            let whole = hdr.frame_count == 1 && payload.len() as u64 == msg.total_len;
            if whole && self.queued_to(crate::cpu::Step::Receiving).is_none() {
                self.recv.ports[port as usize].posted.remove(i);
                self.rx_took_next(peer, hdr.msg_seq);
                return MatchOutcome::Whole(desc);
            }
            let Some(r) = self.rx_open(now, peer, hdr, msg, desc, RxOwner::Recv) else {
                return MatchOutcome::NotReady;
            };
            self.recv.ports[port as usize].posted.remove(i);
            self.rx_took_next(peer, hdr.msg_seq);
            return MatchOutcome::Matched(r);
        }
        let mode = self.ports[port as usize].mode;
        let pool = mode == MatchMode::Unexpected || self.cfg.overflow_slots > 0;
        let mut entry = Unexpected {
            port,
            src_node: hdr.src_node,
            src_port: hdr.src_port,
            tag: msg.tag,
            total_len: msg.total_len,
            imm: msg.imm(),
            data: None,
            peer,
            seq: hdr.msg_seq,
            pull: None,
            claimed: None,
        };
        let fits = pool && hdr.frame_count == 1 && msg.total_len <= self.recv.overflow.slot_size as u64;
        if fits && !self.recv.unexp.is_full() {
            if let Some(s) = self.recv.overflow.free.pop() {
                self.recv.overflow.slots[s as usize].data.clear();
                self.recv.overflow.slots[s as usize].data.extend_from_slice(payload);
                entry.data = Some(s);
                let e = self.recv.unexp.insert_checked(entry);
                self.recv.ports[port as usize].unexpected.push_back(e);
                self.rx_took_next(peer, hdr.msg_seq);
                self.count(counter::OVERFLOW_MSGS, 1);
                self.count(counter::RX_FRAMES, 1);
                if mode == MatchMode::Unexpected {
                    self.count(counter::UNEXP_EAGER, 1);
                    self.count(counter::UNEXP_BYTES, msg.total_len);
                }
                return MatchOutcome::Overflowed;
            }
        }
        if mode == MatchMode::Unexpected {
            if self.recv.rdv_held < self.cfg.unexp_headers && !self.recv.unexp.is_full() {
                let e = self.recv.unexp.insert_checked(entry);
                self.recv.ports[port as usize].unexpected.push_back(e);
                self.recv.rdv_held += 1;
                self.recv.peer_mut(peer).rdv_entries += 1;
                self.rx_took_next(peer, hdr.msg_seq);
                self.count(counter::UNEXP_RDV, 1);
                return MatchOutcome::Retained;
            }
            self.count(counter::UNEXP_REFUSED_FULL, 1);
        }
        MatchOutcome::NotReady
    }

    /// Opens a receive record for the message whose header frame is
    /// `hdr`/`msg` from `peer`, landing in `desc`; `None` when the table is full.
    pub(crate) fn rx_open(
        &mut self,
        now: u64,
        peer: u32,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        desc: LocalDesc,
        owner: RxOwner,
    ) -> Option<u32> {
        if self.recv.rx.is_full() {
            return None;
        }
        let masks = self.recv.rx_rings.take();
        let mut rec = RxMsg::new(hdr.dst_port, peer, hdr, msg, desc, owner, self.cfg.group_size, masks, now);
        rec.stamp = self.recv.stamp.next();
        let r = self.recv.rx.insert_checked(rec);
        self.recv.peer_mut(peer).rx_active.push(r);
        self.arm_rx_sweep(now);
        Some(r)
    }

    /// Partially received messages are swept for idleness while any exists.
    pub(crate) fn arm_rx_sweep(&mut self, now: u64) {
        self.recv.sweep_at.get_or_insert(now + self.cfg.rx_idle_timeout_ns / 4);
    }

    /// A DATA frame of a matched message: recorded, stored, acknowledged.
    /// `None` when it was malformed or a duplicate.
    pub(crate) fn accept_frame<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        r: u32,
        hdr: &FrameHeader,
        msg: Option<&MsgHeader>,
        payload: &[u8],
    ) -> Option<Accepted> {
        let m = self.recv.rx.get(r).expect("live");
        if !m.fits(hdr, msg, payload.len(), self.mtu) {
            self.count(counter::DROPPED_MALFORMED, 1);
            return None;
        }
        let (peer, seq, owner) = (m.peer, m.seq, m.owner);
        let f = hdr.frame_index;
        let g = f / self.cfg.group_size;
        let (group_done, missing, all_done) = match self.recv.rx.get_mut(r).record(f) {
            FrameOutcome::Duplicate { group_complete } => {
                self.count(counter::DUPLICATES, 1);
                if group_complete {
                    self.send_ack(hal, peer, seq, g);
                }
                return None;
            }
            FrameOutcome::Accepted { out_of_order, group_done, missing, all_done } => {
                if out_of_order {
                    self.count(counter::OUT_OF_ORDER, 1);
                }
                (group_done, missing, all_done)
            }
            FrameOutcome::BeyondWindow => {
                // The sender ran further ahead than the window both sides
                // agree on: nothing of it is kept (the sender resends it).
                self.count(counter::DROPPED_UNEXPECTED, 1);
                return None;
            }
        };
        let (deferred, stored_from) = self.store_payload(hal, r, f, payload);
        self.count(counter::RX_FRAMES, 1);
        let m = self.recv.rx.get_mut(r);
        m.last_activity = now;
        let contig = m.contig;
        if group_done && all_done && owner == RxOwner::Recv {
            // A wholly received message: its ACK may be coalesced.
            self.ack_message(hal, now, peer, seq, g);
        } else if group_done {
            self.send_ack(hal, peer, seq, g);
        } else if missing != 0 {
            self.send_nack(hal, peer, seq, g, missing, NackReason::Loss);
        }
        let finish = all_done && deferred.is_none();
        if let (true, Some(cpu)) = (all_done, deferred) {
            // After this record's last payload DMA on the receiving CPU.
            self.finish_recv_on(hal, cpu, r);
        }
        Some(Accepted { owner, stored_from, contig, finish })
    }

    /// Writes frame `f`'s payload into the record's buffer, zero-copy; bytes
    /// beyond the buffer are dropped (truncation), a collective's header is
    /// not delivered. Returns the CPU the write was queued on (the record
    /// finishes there too), and where the delivered bytes start in
    /// `payload` when all of them were written.
    fn store_payload<H: Hal>(&mut self, hal: &mut H, r: u32, f: u32, payload: &[u8]) -> (Option<u8>, Option<usize>) {
        let m = self.recv.rx.get(r).expect("live");
        let (port, seq, desc, rma) = (m.port, m.seq, m.desc, m.rma);
        let off = wire::frame_offset(f, self.mtu);
        let (off, data_at) = match m.skip.checked_sub(off) {
            Some(cut) if cut > 0 => (0, (cut as usize).min(payload.len())),
            _ => (off - m.skip, 0),
        };
        let data = &payload[data_at..];
        let room = rma.map_or(desc.len, |t| t.len);
        let n = (room.saturating_sub(off)).min(data.len() as u64) as usize;
        // Forwarding reads what was received from host memory: the NIC's own
        // broadcasts are written before anything else happens.
        let deferred = match m.owner {
            RxOwner::Recv => self.dispatch(hal, crate::cpu::Step::Receiving),
            _ => None,
        };
        let io = match (deferred, rma) {
            _ if n == 0 => Ok(()),
            (Some(cpu), _) => self.enqueue_receive(hal, cpu, r, seq, off, &data[..n]),
            (None, Some(t)) => self.shared.lock().mr.remote_io(
                hal,
                self.layout,
                port,
                &t,
                off,
                Buf::ToHost(&data[..n]),
                MR_REMOTE_WRITE,
            ),
            (None, None) => self.shared.lock().mr.sge_io(
                hal,
                self.layout,
                port,
                desc.sges(),
                off,
                Buf::ToHost(&data[..n]),
                MR_LOCAL_WRITE,
            ),
        };
        let stored = io.is_ok() && n == data.len();
        if let Err(e) = io {
            self.rx_error(r, e);
        }
        (deferred, stored.then_some(data_at))
    }

    /// A payload DMA failed: the receive will complete with `e`.
    pub(crate) fn rx_error(&mut self, r: u32, e: Status) {
        self.recv.rx.get_mut(r).error.get_or_insert(e);
    }

    /// Removes a finished receive record; returns it and its error
    /// (`error`, which overrides, else the record's own). The dispatcher
    /// (`Nic::finish_rx`) reports it to its owner.
    pub(crate) fn retire_rx(&mut self, r: u32, error: Option<Status>) -> (RxMsg, Option<Status>) {
        let error = self.unlink_rx(r, error);
        (self.recv.rx.remove(r), error)
    }

    /// Unlinks finished receive record `r` from its peer and gives back
    /// its group windows; returns its error as [`RecvCpu::retire_rx`] does. The
    /// record stays in its slot for the caller to report, then free.
    fn unlink_rx(&mut self, r: u32, error: Option<Status>) -> Option<Status> {
        let m = self.recv.rx.get_mut(r);
        let used = (m.group_count() as usize).min(m.masks.len());
        let (masks, peer, own) = (core::mem::take(&mut m.masks), m.peer, m.error);
        self.recv.rx_rings.give(masks, used);
        let active = &mut self.recv.peer_mut(peer).rx_active;
        if let Some(i) = active.iter().position(|&x| x == r) {
            active.remove(i);
        }
        if error.is_none() {
            self.count(counter::MSGS_RX, 1);
        }
        error.or(own)
    }

    /// Retires a receive's record `r` (posted by the host) and completes
    /// it, without moving the record out of its table.
    pub(crate) fn finish_recv<H: Hal>(&mut self, hal: &mut H, r: u32, error: Option<Status>) {
        let (port, c) = self.retire_recv(r, error);
        self.complete(hal, port, c);
    }

    /// Completes receive record `r`, whose last payload DMA is queued on
    /// CPU `cpu`, there: its CQE is written by a job after that DMA
    /// ([`RecvCpu::complete_on`]), so the CPU takes no program for it. Else
    /// (no jobs, a payload of it queued as work, a CQ slot a job cannot
    /// name) the completion is queued there as work.
    fn finish_recv_on<H: Hal>(&mut self, hal: &mut H, cpu: u8, r: u32) {
        let m = self.recv.rx.get(r).expect("live");
        let seq = m.seq;
        // Nothing is retired unless the CQE's slot can be named.
        if self.cfg.cpu_jobs && !m.payload_as_work && m.owner == RxOwner::Recv && self.complete_on(hal, cpu, r) {
            return;
        }
        self.shared.lock().queues.enqueue(hal, cpu, crate::cpu::Work::Finish { slot: r, seq });
    }

    /// Retires receive record `r` (posted by the host); its port and
    /// completion (`error` overrides the record's own).
    pub(crate) fn retire_recv(&mut self, r: u32, error: Option<Status>) -> (u16, Completion) {
        let error = self.unlink_rx(r, error);
        let m = self.recv.rx.get(r).expect("live");
        debug_assert_eq!(m.owner, RxOwner::Recv);
        let c = self.recv_completion(&m.desc, m.peer, (m.tag, m.total_len, m.imm), error);
        let port = m.port;
        self.recv.rx.free(r);
        (port, c)
    }

    /// The completion of a receive into `desc` of the message
    /// (tag, length, immediate data) from `peer`, failed with `error`.
    fn recv_completion(
        &self,
        desc: &LocalDesc,
        peer: u32,
        (tag, total_len, imm): (u64, u64, Option<u32>),
        error: Option<Status>,
    ) -> Completion {
        let status = match error {
            Some(e) => e,
            None if total_len > desc.len => Status::Truncated,
            None => Status::Success,
        };
        let src = self.peer(peer);
        let mut c = Completion::of(desc, Opcode::Recv, status);
        c.byte_len = total_len.min(desc.len) as u32;
        c.tag = tag;
        c.src_node = src.node;
        c.src_port = src.rport;
        c.msg_len = total_len.min(u32::MAX as u64) as u32;
        c.imm = imm;
        c
    }

    /// Receives a one-frame message matched by `desc` in one step, as its
    /// record would have within this frame (`try_match` chose it): the
    /// payload into host memory, the ACK owed, the completion. A failed
    /// DMA completes the receive with its error, as the record's would.
    #[allow(clippy::too_many_arguments)]
    fn receive_whole<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        peer: u32,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        payload: &[u8],
        desc: &LocalDesc,
    ) {
        let port = hdr.dst_port;
        let ran_here = self.dispatch(hal, crate::cpu::Step::Receiving);
        debug_assert_eq!(ran_here, None, "try_match checked that it runs here");
        let n = desc.len.min(payload.len() as u64) as usize;
        let io = match n {
            0 => Ok(()),
            _ => self.shared.lock().mr.sge_io(
                hal,
                self.layout,
                port,
                desc.sges(),
                0,
                Buf::ToHost(&payload[..n]),
                MR_LOCAL_WRITE,
            ),
        };
        self.count(counter::RX_FRAMES, 1);
        self.ack_message(hal, now, peer, hdr.msg_seq, 0);
        self.count(counter::MSGS_RX, 1);
        let c = self.recv_completion(desc, peer, (msg.tag, msg.total_len, msg.imm()), io.err());
        self.complete(hal, port, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emp_uapi::desc::WorkDesc;

    fn record_in(frames: u32, group_size: u32, window_groups: usize) -> RxMsg {
        let hdr = FrameHeader { frame_count: frames, ..Default::default() };
        let msg = MsgHeader::new(7, frames as u64 * 1000, None);
        let desc = LocalDesc::new(&WorkDesc::default());
        let masks = vec![0; window_groups].into_boxed_slice();
        RxMsg::new(0, 0, &hdr, &msg, desc, RxOwner::Recv, group_size, masks, 0)
    }

    fn record(frames: u32, group_size: u32) -> RxMsg {
        record_in(frames, group_size, 16)
    }

    fn accepted(group_done: bool, missing: u32, all_done: bool) -> FrameOutcome {
        FrameOutcome::Accepted { out_of_order: false, group_done, missing, all_done }
    }

    impl FrameOutcome {
        fn with_out_of_order(self) -> FrameOutcome {
            match self {
                FrameOutcome::Accepted { group_done, missing, all_done, .. } => {
                    FrameOutcome::Accepted { out_of_order: true, group_done, missing, all_done }
                }
                other => other,
            }
        }
    }

    #[test]
    fn in_order_frames_complete_each_group_then_the_message() {
        let mut m = record(8, 3);
        let done_at = [2, 5, 7];
        for f in 0..8 {
            let out = m.record(f);
            assert_eq!(out, accepted(done_at.contains(&f), 0, f == 7), "frame {f}");
            assert_eq!(m.contig, f + 1);
        }
    }

    #[test]
    fn a_hole_is_reported_on_the_groups_last_frame() {
        let mut m = record(6, 3);
        assert_eq!(m.record(0), accepted(false, 0, false));
        // Frame 1 lost: frame 2 closes the group with frame 1 missing.
        let out = m.record(2);
        assert_eq!(
            out,
            FrameOutcome::Accepted { out_of_order: true, group_done: false, missing: 0b010, all_done: false }
        );
        assert_eq!(m.contig, 1);
        assert_eq!(
            m.record(1),
            FrameOutcome::Accepted { out_of_order: true, group_done: true, missing: 0, all_done: false }
        );
        assert_eq!(m.contig, 3);
    }

    #[test]
    fn duplicates_say_whether_their_group_is_complete() {
        let mut m = record(6, 3);
        m.record(3);
        assert_eq!(m.record(3), FrameOutcome::Duplicate { group_complete: false });
        m.record(4);
        m.record(5);
        assert_eq!(m.record(4), FrameOutcome::Duplicate { group_complete: true });
        assert_eq!((m.frames_received, m.contig), (3, 0));
    }

    #[test]
    fn a_short_last_group_completes_with_its_own_frames() {
        let mut m = record(4, 3);
        for f in [0, 1, 2] {
            m.record(f);
        }
        assert_eq!(m.record(3), accepted(true, 0, true));
    }

    #[test]
    fn the_window_slides_with_the_oldest_incomplete_group() {
        // Groups of 3, a window of 2 groups: frames 0..6 fit, frame 6 does not.
        let mut m = record_in(12, 3, 2);
        assert_eq!(m.record(6), FrameOutcome::BeyondWindow);
        assert_eq!(m.frames_received, 0, "a frame beyond the window is not kept");
        for f in [3, 4, 5] {
            m.record(f);
        }
        assert_eq!(m.record(6), FrameOutcome::BeyondWindow, "group 0 still holds the window");
        m.record(0);
        m.record(1);
        assert_eq!(m.contig, 2);
        m.record(2);
        // Groups 0 and 1 complete: the window is groups 2 and 3.
        assert_eq!(m.contig, 6);
        assert_eq!(m.record(4), FrameOutcome::Duplicate { group_complete: true });
        assert_eq!(m.record(11), accepted(false, 0b011, false).with_out_of_order());
        assert_eq!(m.record(6), accepted(false, 0, false).with_out_of_order());
        for f in 7..11 {
            m.record(f);
        }
        assert_eq!((m.contig, m.frames_received), (12, 12));
    }

    #[test]
    fn a_group_of_32_frames_fills_its_mask() {
        let mut m = record_in(64, 32, 1);
        for f in 0..31 {
            m.record(f);
        }
        assert_eq!(m.record(32), FrameOutcome::BeyondWindow);
        assert_eq!(m.record(31), accepted(true, 0, false));
        assert_eq!(m.contig, 32);
        assert_eq!(m.record(63), accepted(false, 0x7FFF_FFFF, false).with_out_of_order());
    }

    #[test]
    fn a_record_holds_as_much_state_for_1_gib_as_for_one_window() {
        let frames_1g = wire::frames_for(1 << 30, 1500) as u32;
        let (big, small) = (record_in(frames_1g, 3, 16), record_in(48, 3, 16));
        assert_eq!(big.state_bytes(), small.state_bytes());
        assert!(big.state_bytes() < 512, "{} bytes", big.state_bytes());
    }
}
