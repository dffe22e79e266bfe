//! Collectives on the NIC (seed 001 ch. 3, 4, 6): barrier, reduce,
//! allreduce and broadcast, run by the control program with no host
//! involvement between the post and the completion.
//!
//! Collective messages are ordinary EMP messages of kind `CollData`: they
//! share the per-peer sequence, ACKs, NACKs, retransmission and flow
//! control of data messages (seed 001 §3.2.3 option (a): ordered with the
//! sender's data). Only matching differs: the receiving NIC consumes them
//! itself, keyed by (group, epoch, instance), where the instance is the
//! n-th collective posted on the group (every member posts collectives in
//! the same order, the MPI communicator rule).
//!
//! A message may arrive before its operation is posted (seed 001 §3.2.1,
//! §4.2.1): the NIC records it in an operation record with no descriptor
//! yet, bounded by a per-group window of instances and a pool of partial
//! buffers; beyond either bound it is refused (NACK NoMatch), the sender
//! retries after its RNR backoff, and the refusal is lifted at once
//! (`coll_kick`) when the host posts or a buffer frees up.

use emp_uapi::coll::{
    abs_rank, barrier_step, rel_rank, BarrierAlgo, CollHeader, CollKind, Dtype, ReduceOp, Step, PE_PRE, PE_RELEASE,
};
use emp_uapi::desc::{Opcode, Status, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_uapi::seq_lt;
use emp_uapi::sram::counter;
use emp_uapi::wire::{self, FrameHeader, MsgHeader, NackReason};
use emp_uapi::Le;

use crate::group::GroupState;
use crate::host::Completion;
use crate::mr::Buf;
use crate::{Hal, LocalDesc, Nic};

/// What an operation does, fixed by its post or by its first message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Params {
    Barrier {
        algo: BarrierAlgo,
        tree: u8,
    },
    Bcast {
        root: u16,
        tree: u8,
        len: u64,
    },
    /// One message to several members; not an instance of the group's
    /// collective sequence (its frames are ordinary tagged data).
    Multi {
        mask: u64,
        len: u64,
    },
    Reduce(ReduceParams),
}

impl Params {
    fn bytes(&self) -> usize {
        match *self {
            Params::Barrier { .. } => 0,
            Params::Bcast { len, .. } | Params::Multi { len, .. } => len as usize,
            Params::Reduce(p) => p.bytes(),
        }
    }
}

/// A collective operation instance on this NIC: what every kind has, and
/// the kind's own state.
#[derive(Debug)]
pub(crate) struct CollOp {
    pub port: u16,
    pub group: u32,
    /// The n-th collective posted on the group (`u32::MAX`: a multisend,
    /// which is not in the sequence).
    pub instance: u32,
    /// Unique across slot reuse: internal messages name their op by it.
    pub stamp: u32,
    /// The host's descriptor; `None` while only early messages are known.
    pub desc: Option<(LocalDesc, Opcode)>,
    /// Internal messages not finished yet.
    pub pending_tx: u32,
    pub error: Option<Status>,
    /// The NIC's part is done; completes when `pending_tx` is 0 too.
    pub local_done: bool,
    /// Waiting for a free transmission record.
    pub stalled: bool,
    pub state: CollState,
}

/// The state of one kind of operation.
#[derive(Debug)]
pub(crate) enum CollState {
    Barrier(Barrier),
    Reduce(Reduce),
    Bcast(Bcast),
    Multi(Multi),
}

impl CollOp {
    fn new(port: u16, group: u32, instance: u32, stamp: u32, state: CollState) -> CollOp {
        CollOp {
            port,
            group,
            instance,
            stamp,
            desc: None,
            pending_tx: 0,
            error: None,
            local_done: false,
            stalled: false,
            state,
        }
    }
}

impl CollState {
    /// The state of an op posted before any of its messages arrived.
    fn posted(params: Params, ld: LocalDesc) -> CollState {
        match params {
            Params::Barrier { algo, tree } => CollState::Barrier(Barrier::new(algo, tree)),
            Params::Reduce(p) => CollState::Reduce(Reduce::new(p)),
            Params::Bcast { root, tree, len } => CollState::Bcast(Bcast::new(root, tree, len, ld, None)),
            Params::Multi { mask, len } => CollState::Multi(Multi::new(mask, len, ld)),
        }
    }

    pub(crate) fn params(&self) -> Params {
        match self {
            CollState::Barrier(b) => b.params(),
            CollState::Reduce(r) => Params::Reduce(r.params),
            CollState::Bcast(b) => b.params(),
            CollState::Multi(m) => m.params(),
        }
    }

    /// Where the data of the op's host-data messages is (broadcast, multisend).
    fn source(&self) -> Option<LocalDesc> {
        match self {
            CollState::Bcast(b) => Some(b.data),
            CollState::Multi(m) => Some(m.data),
            _ => None,
        }
    }

    /// The op's messages to its destinations (broadcast, multisend).
    fn fwd(&self) -> &[u32] {
        match self {
            CollState::Bcast(b) => &b.fwd,
            CollState::Multi(m) => &m.fwd,
            _ => &[],
        }
    }

    fn cache(&self) -> Option<&FrameCache> {
        match self {
            CollState::Bcast(b) => Some(&b.cache),
            CollState::Multi(m) => Some(&m.cache),
            _ => None,
        }
    }

    fn cache_mut(&mut self) -> Option<&mut FrameCache> {
        match self {
            CollState::Bcast(b) => Some(&mut b.cache),
            CollState::Multi(m) => Some(&mut m.cache),
            _ => None,
        }
    }

    /// The bounce slot a broadcast holds.
    fn bounce(&self) -> Option<u16> {
        match self {
            CollState::Bcast(b) => b.bounce,
            _ => None,
        }
    }

    /// Reduction partials held (before the post, from the shared pool).
    fn partials_held(&self) -> u32 {
        match self {
            CollState::Reduce(r) => r.partials_held(),
            _ => 0,
        }
    }
}

/// Payload of an internal (NIC-generated) message after its `CollHeader`.
#[derive(Debug)]
pub(crate) enum CollData {
    None,
    /// Bytes held on the NIC (partials, results).
    Nic(Vec<u8>),
    /// Host memory named by the message's descriptor (broadcast data: the
    /// root's buffer, or where an inner rank received it), going to the
    /// op's destination `dest` (its bit in the frame cache).
    Host {
        dest: u32,
    },
}

/// An internal message's collective side: its header and data, and the
/// operation told when it finishes.
#[derive(Debug)]
pub(crate) struct CollTx {
    /// `None`: an ordinary tagged message (multisend), kind DATA.
    pub hdr: Option<CollHeader>,
    pub data: CollData,
    pub op: u32,
    pub op_stamp: u32,
    /// Frames that can be sent now (`u32::MAX`: all).
    pub limit: u32,
}

/// What the receiver did with a collective message's first frame.
pub(crate) enum CollAccept {
    /// Taken whole (single-frame messages): ACK it.
    Consumed,
    /// A broadcast: received through this receive record.
    Receive(u32),
    /// Not now: NACK with this reason.
    Refuse(NackReason),
}

/// The op a collective message is for.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// Recorded already (posted, or by an earlier message).
    Existing { op: u32, group: u32 },
    /// Not known yet: recorded only if the message is accepted.
    Fresh(FreshOp),
}

/// An op record to create for a message that arrived before its post.
#[derive(Clone, Copy, Debug)]
struct FreshOp {
    port: u16,
    group: u32,
    instance: u32,
    stamp: u32,
}

impl FreshOp {
    fn op(self, state: CollState) -> CollOp {
        CollOp::new(self.port, self.group, self.instance, self.stamp, state)
    }
}

impl Target {
    fn group(&self) -> u32 {
        match *self {
            Target::Existing { group, .. } => group,
            Target::Fresh(f) => f.group,
        }
    }
}

impl Nic {
    /// Can the tables take one more posted collective of `op`?
    pub(crate) fn coll_fits(&self, op: Opcode) -> bool {
        !op.is_collective() || !self.coll_ops.is_full()
    }

    /// A collective descriptor from the send ring (validated by the caller).
    pub(crate) fn post_coll<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, ld: LocalDesc, opcode: Opcode) {
        let slot = ld.wd.node as u32;
        let checked = match self.groups.get(slot).filter(|g| g.port == port) {
            None => Err(Status::GroupInvalid),
            Some(_) => match opcode {
                Opcode::MultiSend => self.validate_multisend(hal, port, slot, &ld),
                Opcode::Barrier => self.validate_barrier(slot, &ld),
                Opcode::Reduce | Opcode::Allreduce => self.validate_reduce(hal, port, slot, &ld, opcode),
                Opcode::Bcast => self.validate_bcast(hal, port, slot, &ld),
                _ => Err(Status::BadDescriptor),
            },
        };
        match checked {
            Err(st) => self.complete(hal, port, Completion::of(&ld, opcode, st)),
            Ok(Params::Multi { mask, .. }) => self.post_multisend(hal, now, port, ld, mask),
            Ok(params) => self.post_instance(hal, now, port, ld, opcode, params),
        }
    }

    fn validate_barrier(&self, slot: u32, ld: &LocalDesc) -> Result<Params, Status> {
        let g = self.groups.get(slot).expect("checked by the caller");
        let algo = BarrierAlgo::from_u16(ld.wd.port).expect("validated");
        let tree = ld.wd.tag as u8;
        if algo == BarrierAlgo::GatherRelease && tree as usize >= g.trees.len() {
            return Err(Status::BadDescriptor);
        }
        Ok(Params::Barrier { algo, tree })
    }

    fn validate_reduce<H: Hal>(
        &self,
        hal: &mut H,
        port: u16,
        slot: u32,
        ld: &LocalDesc,
        opcode: Opcode,
    ) -> Result<Params, Status> {
        let g = self.groups.get(slot).expect("checked by the caller");
        let (dt, rop, tree) = emp_uapi::coll::reduce_tag_parts(ld.wd.tag);
        let (dtype, op) = (Dtype::from_u8(dt).expect("validated"), ReduceOp::from_u8(rop).expect("validated"));
        let all = opcode == Opcode::Allreduce;
        let root = ld.wd.port;
        if root >= g.n || tree as usize >= g.trees.len() {
            return Err(Status::BadDescriptor);
        }
        if !op.defined_for(dtype) {
            return Err(Status::InvalidOp);
        }
        let p = ReduceParams { all, root, tree, dtype, op, count: ld.wd.ignore as u32 };
        let bytes = p.bytes();
        if bytes > self.cfg.coll_buf_size as usize || CollHeader::SIZE + bytes > wire::payload_capacity(self.mtu, 0) {
            return Err(Status::TooLarge);
        }
        let sges = ld.sges();
        let wants_result = all || g.rank == root;
        if sges[0].len as usize != bytes || (wants_result && (sges.len() < 2 || sges[1].len as usize != bytes)) {
            return Err(Status::BadDescriptor);
        }
        self.check_sges(hal, port, &sges[..1], MR_LOCAL_READ)?;
        if wants_result {
            self.check_sges(hal, port, &sges[1..2], MR_LOCAL_WRITE)?;
        }
        Ok(Params::Reduce(p))
    }

    fn validate_bcast<H: Hal>(&self, hal: &mut H, port: u16, slot: u32, ld: &LocalDesc) -> Result<Params, Status> {
        let g = self.groups.get(slot).expect("checked by the caller");
        let (root, tree) = (ld.wd.port, ld.wd.tag as u8);
        if root >= g.n || tree as usize >= g.trees.len() {
            return Err(Status::BadDescriptor);
        }
        if ld.len > self.cfg.msg_max {
            return Err(Status::TooLarge);
        }
        let access = if g.rank == root { MR_LOCAL_READ } else { MR_LOCAL_WRITE };
        self.check_sges(hal, port, ld.sges(), access)?;
        Ok(Params::Bcast { root, tree, len: ld.len })
    }

    /// Posts the group's next instance: a new op, or the one its early
    /// messages recorded.
    fn post_instance<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        port: u16,
        ld: LocalDesc,
        opcode: Opcode,
        params: Params,
    ) {
        let slot = ld.wd.node as u32;
        let g = self.groups.slots[slot as usize].as_mut().expect("checked");
        let instance = g.next_instance;
        g.next_instance = instance.wrapping_add(1);
        let op = match self.find_op(slot, instance) {
            Some(op) => {
                let o = self.coll_ops.get_mut(op);
                o.desc = Some((ld, opcode));
                if o.state.params() != params {
                    o.error = Some(Status::CollMismatch);
                }
                op
            }
            None => {
                let stamp = self.next_stamp();
                let mut o = CollOp::new(port, slot, instance, stamp, CollState::posted(params, ld));
                o.desc = Some((ld, opcode));
                self.coll_ops.insert_checked(o)
            }
        };
        if let Params::Reduce(p) = params {
            self.reduce_load_input(hal, port, op, &ld, p);
        }
        self.release_early_buffers(op);
        self.coll_progress(hal, now, op);
        // Messages refused for lack of window may fit now.
        self.coll_kick(hal, port);
    }

    fn find_op(&self, group: u32, instance: u32) -> Option<u32> {
        self.coll_ops
            .iter()
            .find(|(_, o)| o.group == group && o.instance == instance && !matches!(o.state, CollState::Multi(_)))
            .map(|(s, _)| s)
    }

    /// Partials an op received before it was posted used the shared pool;
    /// once posted, the op owns them.
    fn release_early_buffers(&mut self, op: u32) {
        let held = self.coll_ops.get(op).expect("live").state.partials_held();
        self.coll_pool_used -= held.min(self.coll_pool_used);
    }

    /// The first frame of a `CollData` message that is next in sequence
    /// from its peer.
    pub(crate) fn coll_accept<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        payload: &[u8],
    ) -> CollAccept {
        let Ok(ch) = CollHeader::parse(payload) else { return CollAccept::Refuse(NackReason::CollMismatch) };
        let kind = CollKind::from_u8(ch.kind).expect("parsed");
        let target = match self.coll_target(hdr, msg, &ch, kind, payload.len()) {
            Ok(t) => t,
            Err(refused) => return refused,
        };
        let data = &payload[CollHeader::SIZE..];
        let r = match kind {
            CollKind::BarrierPe | CollKind::BarrierDiss | CollKind::BarrierGather | CollKind::BarrierRelease => {
                let algo = barrier_algo_of(kind).expect("barrier kind");
                let fresh = || Ok(CollState::Barrier(Barrier::new(algo, ch.tree)));
                self.accept_on(target, fresh, |s, g, _| match s {
                    CollState::Barrier(b) => b.accept(kind, &ch, g.n),
                    _ => Err(NackReason::CollMismatch),
                })
            }
            CollKind::ReduceUp | CollKind::AllreduceDown => self.accept_reduce(target, &ch, kind, data),
            CollKind::Bcast => match self.accept_bcast(hal, now, target, hdr, msg, &ch) {
                Ok(r) => return CollAccept::Receive(r),
                Err(e) => Err(e),
            },
        };
        match r {
            Ok(op) => {
                self.count(counter::RX_FRAMES, 1);
                self.count(counter::MSGS_RX, 1);
                self.coll_progress(hal, now, op);
                CollAccept::Consumed
            }
            Err(reason) => self.coll_refused(hal, now, target, reason),
        }
    }

    /// The op a collective message is for, once the message agrees with
    /// its group; a fresh op when it is the first message of an instance
    /// ahead of the posts, within the window.
    fn coll_target(
        &mut self,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        ch: &CollHeader,
        kind: CollKind,
        len: usize,
    ) -> Result<Target, CollAccept> {
        let port = hdr.dst_port;
        let Some(&slot) = self.groups.by_id.get(&(port, ch.group_id)) else {
            // Not created here yet (or already destroyed): retry later.
            return Err(self.coll_refuse());
        };
        let g = self.groups.get(slot).expect("indexed");
        if ch.epoch < g.epoch {
            return Err(CollAccept::Refuse(NackReason::StaleEpoch));
        }
        if ch.epoch > g.epoch {
            return Err(self.coll_refuse());
        }
        if g.rank_of(hdr.src_node, hdr.src_port) != Some(ch.sender as u16) {
            return Err(CollAccept::Refuse(NackReason::CollMismatch));
        }
        if kind != CollKind::Bcast && (hdr.frame_count != 1 || msg.total_len != len as u64) {
            return Err(CollAccept::Refuse(NackReason::TooLarge));
        }
        let ahead = ch.instance.wrapping_sub(g.next_instance);
        match self.find_op(slot, ch.instance) {
            Some(op) => Ok(Target::Existing { op, group: slot }),
            // Posted and finished (or never posted and behind us): the
            // members disagree on the sequence of collectives.
            None if seq_lt(ch.instance, g.next_instance) => Err(CollAccept::Refuse(NackReason::CollMismatch)),
            None if ahead >= self.cfg.coll_window || self.coll_ops.used() + 1 >= self.cfg.coll_ops_max => {
                Err(self.coll_refuse())
            }
            None => {
                let stamp = self.next_stamp();
                self.count(counter::COLL_EARLY, 1);
                Ok(Target::Fresh(FreshOp { port, group: slot, instance: ch.instance, stamp }))
            }
        }
    }

    /// Runs `accept` on the target op's state (`posted` tells whether the
    /// host posted it); a fresh op starts from `fresh()` and is recorded
    /// only if its first message is accepted.
    fn accept_on(
        &mut self,
        target: Target,
        fresh: impl FnOnce() -> Result<CollState, NackReason>,
        accept: impl FnOnce(&mut CollState, &GroupState, bool) -> Result<(), NackReason>,
    ) -> Result<u32, NackReason> {
        let g = self.groups.get(target.group()).expect("live group");
        match target {
            Target::Existing { op, .. } => {
                let o = self.coll_ops.get_mut(op);
                accept(&mut o.state, g, o.desc.is_some())?;
                Ok(op)
            }
            Target::Fresh(key) => {
                let mut state = fresh()?;
                accept(&mut state, g, false)?;
                Ok(self.coll_ops.insert_checked(key.op(state)))
            }
        }
    }

    /// A reduction partial or result; an early partial takes a buffer of
    /// the shared pool.
    fn accept_reduce(
        &mut self,
        target: Target,
        ch: &CollHeader,
        kind: CollKind,
        data: &[u8],
    ) -> Result<u32, NackReason> {
        let pool_room = self.coll_pool_used < self.cfg.coll_bufs;
        let fresh =
            || ReduceParams::of_header(ch).map(|p| CollState::Reduce(Reduce::new(p))).ok_or(NackReason::CollMismatch);
        let mut early = false;
        let op = self.accept_on(target, fresh, |s, g, posted| {
            early = !posted;
            let arrival = if posted { Arrival::Posted } else { Arrival::Early { pool_room } };
            match s {
                CollState::Reduce(r) => r.accept(ch, data, g, arrival),
                _ => Err(NackReason::CollMismatch),
            }
        })?;
        if early && kind == CollKind::ReduceUp {
            self.coll_pool_used += 1;
        }
        Ok(op)
    }

    /// A collective message was refused for `reason`.
    fn coll_refused<H: Hal>(&mut self, hal: &mut H, now: u64, target: Target, reason: NackReason) -> CollAccept {
        if reason == NackReason::NoMatch {
            return self.coll_refuse();
        }
        if let Target::Existing { op, .. } = target {
            if self.coll_ops.get(op).is_some_and(|o| o.desc.is_some()) {
                // The local operation cannot succeed either.
                self.coll_ops.get_mut(op).error.get_or_insert(Status::CollMismatch);
                self.coll_progress(hal, now, op);
            }
        }
        CollAccept::Refuse(reason)
    }

    fn coll_refuse(&mut self) -> CollAccept {
        self.count(counter::COLL_REFUSED, 1);
        CollAccept::Refuse(NackReason::NoMatch)
    }

    /// Drives an operation as far as its arrivals allow.
    pub(crate) fn coll_progress<H: Hal>(&mut self, hal: &mut H, now: u64, op: u32) {
        let Some(o) = self.coll_ops.get(op) else { return };
        // Early messages wait for the host's post, except a broadcast: its
        // NIC forwards without the host (application bypass).
        if o.desc.is_none() && !matches!(o.state, CollState::Bcast(_)) {
            return;
        }
        if o.error.is_none() {
            let r = match o.state {
                CollState::Barrier(_) => self.progress_barrier(now, op),
                CollState::Reduce(_) => self.progress_reduce(hal, now, op),
                CollState::Bcast(_) => self.progress_bcast(hal, now, op),
                CollState::Multi(_) => self.progress_multi(now, op),
            };
            if let Err(e) = r {
                self.coll_ops.get_mut(op).error.get_or_insert(e);
            }
        }
        self.coll_try_complete(hal, op);
    }

    fn coll_header(&self, op: u32, kind: CollKind, round: u8, root: u8, tree: u8) -> CollHeader {
        let o = self.coll_ops.get(op).expect("live");
        let g = self.groups.get(o.group).expect("live group");
        let (dtype, rop, count) = match &o.state {
            CollState::Reduce(r) => (r.params.dtype as u8, r.params.op as u8, r.params.count),
            _ => (0, 0, 0),
        };
        CollHeader {
            group_id: g.id,
            epoch: g.epoch,
            instance: o.instance,
            kind: kind as u8,
            round,
            root,
            tree,
            dtype,
            op: rop,
            sender: g.rank as u8,
            reserved: 0,
            count,
        }
    }

    /// Queues an internal message to group rank `to`. `Ok(false)`: no free
    /// transmission record; the op is retried when one frees.
    fn coll_send(&mut self, now: u64, op: u32, to: u16, hdr: CollHeader, data: CollData) -> Result<bool, Status> {
        self.coll_send_limited(now, op, to, Some(hdr), data, u32::MAX).map(|s| s.is_some())
    }

    /// Queues an internal message to group rank `to` of which only the
    /// first `limit` frames exist yet; returns its transmission record, or
    /// `None` when no record is free (the op is retried when one frees).
    fn coll_send_limited(
        &mut self,
        now: u64,
        op: u32,
        to: u16,
        hdr: Option<CollHeader>,
        data: CollData,
        limit: u32,
    ) -> Result<Option<u32>, Status> {
        if self.tx.is_full() {
            self.coll_ops.get_mut(op).stalled = true;
            self.coll_stalled = true;
            return Ok(None);
        }
        let o = self.coll_ops.get(op).expect("live");
        let g = self.groups.get(o.group).expect("live group");
        let (node, rport) = g.endpoint(to);
        let (port, stamp, src) = (o.port, o.stamp, o.state.source());
        let Some(peer) = self.peer_for(port, node, rport, 0) else { return Err(Status::TableFull) };
        let wd = WorkDesc { opcode: Opcode::Send as u8, node, port: rport, ..Default::default() };
        let mut desc = match &data {
            // The data's memory becomes the message's scatter/gather list.
            CollData::Host { .. } => {
                let src = src.expect("broadcast data located");
                let tag = if hdr.is_some() { 0 } else { src.wd.tag };
                LocalDesc {
                    wd: WorkDesc { node, port: rport, opcode: Opcode::Send as u8, tag, ignore: 0, ..src.wd },
                    ..src
                }
            }
            _ => LocalDesc::new(&wd),
        };
        let hlen = if hdr.is_some() { CollHeader::SIZE as u64 } else { 0 };
        desc.len = hlen
            + match &data {
                CollData::None => 0,
                CollData::Nic(v) => v.len() as u64,
                CollData::Host { .. } => desc.len,
            };
        let ctx = CollTx { hdr, data, op, op_stamp: stamp, limit };
        let slot = self.enqueue_tx_coll(now, port, peer, desc, ctx);
        let o = self.coll_ops.get_mut(op);
        o.pending_tx += 1;
        o.stalled = false;
        Ok(Some(slot))
    }

    /// Bytes `[off, off + out.len())` of an internal message: the header
    /// and NIC-held data are filled in; for host data, returns where in
    /// `out` it starts and its offset in the descriptor's memory.
    pub(crate) fn coll_payload(c: &CollTx, off: u64, out: &mut [u8]) -> Option<(usize, u64)> {
        let mut hb = [0u8; CollHeader::SIZE];
        let hlen = match &c.hdr {
            Some(h) => {
                h.put(&mut hb);
                CollHeader::SIZE as u64
            }
            None => 0,
        };
        let head = hlen.saturating_sub(off).min(out.len() as u64) as usize;
        if head > 0 {
            out[..head].copy_from_slice(&hb[off as usize..off as usize + head]);
        }
        let data_off = (off + head as u64) - hlen;
        let rest = &mut out[head..];
        if rest.is_empty() {
            return None;
        }
        match &c.data {
            CollData::Nic(v) => rest.copy_from_slice(&v[data_off as usize..data_off as usize + rest.len()]),
            CollData::None => rest.fill(0),
            CollData::Host { .. } => return Some((head, data_off)),
        }
        None
    }

    /// An internal message finished (ACKed, or failed).
    pub(crate) fn coll_tx_done<H: Hal>(&mut self, hal: &mut H, now: u64, c: &CollTx, status: Status) {
        let (op, stamp) = (c.op, c.op_stamp);
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return; // The op completed without waiting for this message (barriers).
        }
        if let CollData::Host { dest } = c.data {
            self.coll_cache_release(op, stamp, dest);
        }
        let o = self.coll_ops.get_mut(op);
        o.pending_tx -= 1;
        if status != Status::Success {
            if let CollState::Multi(m) = &mut o.state {
                m.failed += 1;
            }
            o.error.get_or_insert(status);
        }
        self.coll_progress(hal, now, op);
    }

    /// A transmission record freed: ops that waited for one go on.
    pub(crate) fn coll_unstall<H: Hal>(&mut self, hal: &mut H, now: u64) {
        if !core::mem::take(&mut self.coll_stalled) {
            return;
        }
        let stalled: Vec<u32> = self.coll_ops.iter().filter(|(_, o)| o.stalled).map(|(s, _)| s).collect();
        for op in stalled {
            if self.tx.is_full() {
                break;
            }
            self.coll_progress(hal, now, op);
        }
    }

    /// Completes the op when its NIC part and its messages are done (or it failed).
    fn coll_try_complete<H: Hal>(&mut self, hal: &mut H, op: u32) {
        let o = self.coll_ops.get(op).expect("live");
        let failed = o.error.is_some();
        // A barrier is complete when its last message has arrived, before
        // its own last message is acknowledged (seed 001 §3.5.4); data
        // operations wait for their messages, which may read host memory.
        let barrier = matches!(o.state, CollState::Barrier(_));
        let sends_done = o.pending_tx == 0 || (barrier && o.local_done && !failed);
        if o.desc.is_none() || !sends_done || !(o.local_done || failed) {
            return;
        }
        let o = self.coll_op_remove(op);
        if let Some(b) = o.state.bounce() {
            if let Some(g) = self.groups.slots[o.group as usize].as_mut() {
                g.bounce_free.push(b);
            }
        }
        let (ld, opcode) = o.desc.expect("posted");
        let status = o.error.unwrap_or(Status::Success);
        let mut c = Completion::of(&ld, opcode, status);
        c.byte_len = o.state.params().bytes() as u32;
        if let CollState::Multi(m) = &o.state {
            c.msg_len = m.undelivered();
        }
        self.count(counter::COLL_OPS, 1);
        self.complete(hal, o.port, c);
    }

    /// Retires an op record, with its cached frames.
    fn coll_op_remove(&mut self, op: u32) -> CollOp {
        let o = self.coll_ops.remove(op);
        self.coll_cache_used -= o.state.cache().map_or(0, FrameCache::len);
        o
    }

    /// Destinations of a broadcast (our children) or multisend.
    fn coll_dests(&self, o: &CollOp) -> u32 {
        match &o.state {
            CollState::Multi(m) => m.mask.count_ones(),
            CollState::Bcast(b) => {
                let g = self.groups.get(o.group).expect("live group");
                g.child_count(b.tree, rel_rank(g.rank, b.root, g.n))
            }
            _ => 0,
        }
    }

    /// Every op of a group (posted or early) ends with `status`; internal
    /// messages still queued are abandoned.
    pub(crate) fn coll_flush_group<H: Hal>(&mut self, hal: &mut H, now: u64, group: u32, status: Status) {
        let ops: Vec<u32> = self.coll_ops.iter().filter(|(_, o)| o.group == group).map(|(s, _)| s).collect();
        for op in ops {
            let o = self.coll_ops.get_mut(op);
            // Failed first, so finishing its messages cannot start new ones.
            o.error.get_or_insert(status);
            let stamp = o.stamp;
            let rxs: Vec<u32> = self
                .rx
                .iter()
                .filter(|(_, m)| m.owner == crate::rx::RxOwner::Bcast { op, stamp })
                .map(|(s, _)| s)
                .collect();
            for r in rxs {
                self.finish_rx(hal, now, r, Some(Status::Flushed));
            }
            let early = self.coll_ops.get(op).expect("live").desc.is_none();
            let txs: Vec<u32> = self
                .tx
                .iter()
                .filter(|(_, m)| m.coll.as_ref().is_some_and(|c| c.op == op && c.op_stamp == stamp))
                .map(|(s, _)| s)
                .collect();
            for t in txs {
                self.finish_tx(hal, now, t, Status::Flushed);
            }
            if early {
                // No descriptor to complete: the record just goes.
                let o = self.coll_op_remove(op);
                self.coll_pool_used -= o.state.partials_held().min(self.coll_pool_used);
                if let (Some(b), Some(g)) = (o.state.bounce(), self.groups.slots[o.group as usize].as_mut()) {
                    g.bounce_free.push(b);
                }
                continue;
            }
            if self.coll_ops.get(op).is_some_and(|o| o.stamp == stamp) {
                self.coll_try_complete(hal, op);
            }
        }
    }

    /// Refused collective messages of `port`'s peers may be acceptable now:
    /// ask their senders to resend at once instead of after their backoff.
    pub(crate) fn coll_kick<H: Hal>(&mut self, hal: &mut H, port: u16) {
        let refused: Vec<(u32, u32)> = self
            .peers
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let p = p.as_ref()?;
                (p.port == port && p.rnr_coll && p.rnr_seq == Some(p.rx_expected)).then_some((i as u32, p.rx_expected))
            })
            .collect();
        for (peer, seq) in refused {
            self.send_nack(hal, peer, seq, 0, 1, NackReason::Loss);
        }
    }
}

impl Nic {
    /// Collective bookkeeping agrees with itself.
    pub(crate) fn coll_invariants(&self) -> Result<(), String> {
        let mut early = 0;
        let mut cached = 0;
        let per_op = self.cfg.window_frames.min(self.cfg.coll_cache_frames);
        if self.coll_ops.used() == 0 && self.coll_pool_used == 0 && self.coll_cache_used == 0 {
            return Ok(()); // Nothing to check (the common case after every handler).
        }
        // Internal messages by (op, stamp), in one pass over the send table.
        let queued: Vec<(u32, u32)> =
            self.tx.iter().filter_map(|(_, m)| m.coll.as_ref().map(|c| (c.op, c.op_stamp))).collect();
        for (s, o) in self.coll_ops.iter() {
            let g = self.groups.get(o.group).ok_or_else(|| format!("coll op {s} of a free group slot {}", o.group))?;
            if g.port != o.port {
                return Err(format!("coll op {s} on port {} of a port-{} group", o.port, g.port));
            }
            let txs = queued.iter().filter(|&&q| q == (s, o.stamp)).count();
            if txs as u32 != o.pending_tx {
                return Err(format!("coll op {s}: {} pending messages, {txs} queued", o.pending_tx));
            }
            if let Some(cache) = o.state.cache() {
                cached += cache.len();
                if cache.len() > per_op {
                    return Err(format!("coll op {s} caches {} frames, bound {per_op}", cache.len()));
                }
                cache.check(self.coll_dests(o), self.mtu).map_err(|e| format!("coll op {s}: {e}"))?;
            }
            if o.desc.is_none() {
                early += o.state.partials_held();
                let ahead = o.instance.wrapping_sub(g.next_instance);
                if ahead >= self.cfg.coll_window {
                    return Err(format!("early coll op {s} is {ahead} instances ahead"));
                }
            }
        }
        if early != self.coll_pool_used {
            return Err(format!("{} pool buffers used, {early} held by early ops", self.coll_pool_used));
        }
        if cached != self.coll_cache_used || cached > self.cfg.coll_cache_frames {
            return Err(format!(
                "{} cached frames counted, {cached} held (bound {})",
                self.coll_cache_used, self.cfg.coll_cache_frames
            ));
        }
        Ok(())
    }
}

// ==== barrier ====

/// Arrival bits of the pairwise-exchange rounds that have no number.
const BIT_PE_PRE: u32 = 62;
const BIT_RELEASE: u32 = 63;

fn round_bit(round: u8) -> u32 {
    match round {
        PE_PRE => BIT_PE_PRE,
        PE_RELEASE => BIT_RELEASE,
        r => r as u32,
    }
}

/// The barrier algorithm a message kind belongs to.
pub(crate) fn barrier_algo_of(kind: CollKind) -> Option<BarrierAlgo> {
    match kind {
        CollKind::BarrierPe => Some(BarrierAlgo::PairwiseExchange),
        CollKind::BarrierDiss => Some(BarrierAlgo::Dissemination),
        CollKind::BarrierGather | CollKind::BarrierRelease => Some(BarrierAlgo::GatherRelease),
        _ => None,
    }
}

/// A barrier (seed 001 §3.5) as a pure state machine: arrivals go in
/// through [`Barrier::accept`]; [`Barrier::next`] says what to send, and
/// [`Barrier::sent`] moves past a send once it is queued.
#[derive(Debug)]
pub(crate) struct Barrier {
    pub algo: BarrierAlgo,
    /// Gather-release: the tree (rooted at rank 0) it runs on.
    pub tree: u8,
    /// Arrivals: bit = round (PE/dissemination; 62 = PE "pre", 63 = PE
    /// release) or child relative rank (gather).
    arrived: u64,
    /// Gather-release: the parent's release arrived.
    released: bool,
    /// Position in the schedule (gather-release: 0 gather, 1 wait for the
    /// release, 2 release the children).
    step: u32,
    /// Gather-release: releases sent so far.
    sub: u32,
}

/// What a barrier does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BarrierNext {
    /// Send `kind` (round `round`) to group rank `to`, then call [`Barrier::sent`].
    Send { to: u16, kind: CollKind, round: u8 },
    /// Waiting for an arrival.
    Wait,
    /// This member's part is done.
    Done,
}

impl Barrier {
    pub(crate) fn new(algo: BarrierAlgo, tree: u8) -> Barrier {
        Barrier { algo, tree, arrived: 0, released: false, step: 0, sub: 0 }
    }

    pub(crate) fn params(&self) -> Params {
        Params::Barrier { algo: self.algo, tree: self.tree }
    }

    /// A barrier message from `ch.sender` of a group of `n`.
    pub(crate) fn accept(&mut self, kind: CollKind, ch: &CollHeader, n: u16) -> Result<(), NackReason> {
        let algo = barrier_algo_of(kind).expect("barrier kind");
        if algo != self.algo || (algo == BarrierAlgo::GatherRelease && ch.tree != self.tree) {
            return Err(NackReason::CollMismatch);
        }
        if kind == CollKind::BarrierRelease {
            if self.released {
                return Err(NackReason::CollMismatch);
            }
            self.released = true;
            return Ok(());
        }
        let bit = match kind {
            CollKind::BarrierGather => rel_rank(ch.sender as u16, 0, n) as u32,
            _ => round_bit(ch.round),
        };
        if bit >= 64 || self.arrived & (1 << bit) != 0 {
            return Err(NackReason::CollMismatch);
        }
        self.arrived |= 1 << bit;
        Ok(())
    }

    /// Moves over the steps the arrivals allow, up to the next send.
    pub(crate) fn next(&mut self, g: &GroupState) -> BarrierNext {
        if self.algo == BarrierAlgo::GatherRelease {
            return self.next_gather_release(g);
        }
        let kind = if self.algo == BarrierAlgo::PairwiseExchange { CollKind::BarrierPe } else { CollKind::BarrierDiss };
        loop {
            match barrier_step(self.algo, g.n, g.rank, self.step as usize) {
                None => return BarrierNext::Done,
                Some(Step::Send { to, round }) => return BarrierNext::Send { to, kind, round },
                Some(Step::Recv { round, .. }) if self.arrived & (1 << round_bit(round)) == 0 => {
                    return BarrierNext::Wait
                }
                Some(Step::Recv { .. }) => self.step += 1,
            }
        }
    }

    /// Gather up the tree (rooted at rank 0), then release down it.
    fn next_gather_release(&mut self, g: &GroupState) -> BarrierNext {
        let rel = rel_rank(g.rank, 0, g.n);
        let children = g.children(self.tree, rel);
        let parent = g.parent(self.tree, rel);
        if self.step == 0 {
            if !children.iter().all(|&c| self.arrived & (1 << c) != 0) {
                return BarrierNext::Wait;
            }
            if let Some(p) = parent {
                return BarrierNext::Send { to: abs_rank(p, 0, g.n), kind: CollKind::BarrierGather, round: 0 };
            }
            self.step = 1;
        }
        if self.step == 1 {
            if parent.is_some() && !self.released {
                return BarrierNext::Wait;
            }
            self.step = 2;
        }
        match children.get(self.sub as usize) {
            Some(&c) => BarrierNext::Send { to: abs_rank(c, 0, g.n), kind: CollKind::BarrierRelease, round: 0 },
            None => BarrierNext::Done,
        }
    }

    /// The send [`Barrier::next`] asked for is queued.
    pub(crate) fn sent(&mut self) {
        match (self.algo, self.step) {
            (BarrierAlgo::GatherRelease, 0) => self.step = 1,
            (BarrierAlgo::GatherRelease, _) => self.sub += 1,
            _ => self.step += 1,
        }
    }
}

impl Nic {
    /// Sends the next steps of a barrier; `Ok` also when waiting.
    fn progress_barrier(&mut self, now: u64, op: u32) -> Result<(), Status> {
        loop {
            let o = self.coll_ops.get_mut(op);
            let g = self.groups.get(o.group).expect("live group");
            let CollState::Barrier(b) = &mut o.state else { unreachable!("barrier op") };
            let tree = b.tree;
            match b.next(g) {
                BarrierNext::Wait => return Ok(()),
                BarrierNext::Done => {
                    o.local_done = true;
                    return Ok(());
                }
                BarrierNext::Send { to, kind, round } => {
                    let h = self.coll_header(op, kind, round, 0, tree);
                    if !self.coll_send(now, op, to, h, CollData::None)? {
                        return Ok(());
                    }
                    let CollState::Barrier(b) = &mut self.coll_ops.get_mut(op).state else { unreachable!() };
                    b.sent();
                }
            }
        }
    }
}
// ==== reduce ====

/// What a reduction or allreduce combines, and along which tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReduceParams {
    /// Allreduce: the result goes back down the tree to every member.
    pub all: bool,
    pub root: u16,
    pub tree: u8,
    pub dtype: Dtype,
    pub op: ReduceOp,
    pub count: u32,
}

impl ReduceParams {
    pub(crate) fn bytes(&self) -> usize {
        self.dtype.size() * self.count as usize
    }

    /// The parameters a reduction message names (`None`: unknown type or operation).
    pub(crate) fn of_header(ch: &CollHeader) -> Option<ReduceParams> {
        let (dtype, op) = (Dtype::from_u8(ch.dtype)?, ReduceOp::from_u8(ch.op)?);
        Some(ReduceParams { all: ch.round == 1, root: ch.root as u16, tree: ch.tree, dtype, op, count: ch.count })
    }
}

/// Where a reduction is: partials combine in the fixed order of the
/// children, the subtree's result goes up, the result is delivered and,
/// for an allreduce, passed down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Combining the children's partials, child by child in ascending relative rank.
    Combine,
    /// The subtree's result goes to the parent (at the root, it is the result).
    Up,
    /// The result is here (root, or from the parent): it goes to the host.
    Deliver,
    /// Allreduce: the result goes to the children.
    Down,
    Done,
}

/// A reduction as a pure state machine: arrivals go in through
/// [`Reduce::accept`], the host's contribution through [`Reduce::own`];
/// [`Reduce::next`] combines what it can and says what to send or deliver,
/// and [`Reduce::sent`] / [`Reduce::delivered`] move past it once done.
#[derive(Debug)]
pub(crate) struct Reduce {
    pub params: ReduceParams,
    /// The own contribution, combined with the children's partials so far;
    /// `None` until the host posted it.
    acc: Option<Vec<u8>>,
    /// Partials from children, by position in the ascending child list.
    partials: Vec<Option<Vec<u8>>>,
    /// Children combined so far.
    combined: u32,
    /// The result: computed here (root), or received from the parent (allreduce).
    down: Option<Vec<u8>>,
    phase: Phase,
    /// Children the result was passed down to.
    sub: u32,
}

/// Whether a reduction can hold an early partial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// The op is posted: it owns its buffers.
    Posted,
    /// Not posted yet: a partial needs a buffer from the shared pool.
    Early { pool_room: bool },
}

/// What a reduction does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReduceNext {
    /// Send `data` as `kind` (round `round`) to group rank `to`, then call [`Reduce::sent`].
    Send { to: u16, kind: CollKind, round: u8, data: Vec<u8> },
    /// Write the result to the host, then call [`Reduce::delivered`].
    Deliver(Vec<u8>),
    /// Waiting for the post or an arrival.
    Wait,
    /// This member's part is done.
    Done,
}

impl Reduce {
    pub(crate) fn new(params: ReduceParams) -> Reduce {
        Reduce { params, acc: None, partials: Vec::new(), combined: 0, down: None, phase: Phase::Combine, sub: 0 }
    }

    /// The host's contribution, copied to the NIC at the post.
    pub(crate) fn own(&mut self, input: Vec<u8>) {
        self.acc = Some(input);
    }

    /// Partials held (before the post they come from the shared pool).
    pub(crate) fn partials_held(&self) -> u32 {
        self.partials.iter().filter(|p| p.is_some()).count() as u32
    }

    /// A child's partial (`ReduceUp`) or, for an allreduce, the result
    /// from the parent (`AllreduceDown`).
    pub(crate) fn accept(
        &mut self,
        ch: &CollHeader,
        data: &[u8],
        g: &GroupState,
        arrival: Arrival,
    ) -> Result<(), NackReason> {
        let p = ReduceParams::of_header(ch).ok_or(NackReason::CollMismatch)?;
        if p.bytes() != data.len() || p.root >= g.n || p.tree as usize >= g.trees.len() || p != self.params {
            return Err(NackReason::CollMismatch);
        }
        let rel = rel_rank(g.rank, p.root, g.n);
        let sender_rel = rel_rank(ch.sender as u16, p.root, g.n);
        match CollKind::from_u8(ch.kind) {
            Some(CollKind::ReduceUp) => {
                let children = g.children(p.tree, rel);
                let Some(i) = children.iter().position(|&c| c == sender_rel) else {
                    return Err(NackReason::CollMismatch);
                };
                if self.partials.get(i).is_some_and(|x| x.is_some()) {
                    return Err(NackReason::CollMismatch);
                }
                if arrival == (Arrival::Early { pool_room: false }) {
                    return Err(NackReason::NoMatch);
                }
                if self.partials.len() < children.len() {
                    self.partials.resize(children.len(), None);
                }
                self.partials[i] = Some(data.to_vec());
            }
            Some(CollKind::AllreduceDown) => {
                let from_parent = g.parent(p.tree, rel) == Some(sender_rel);
                if arrival != Arrival::Posted || !p.all || !from_parent || self.down.is_some() {
                    return Err(NackReason::CollMismatch);
                }
                self.down = Some(data.to_vec());
            }
            _ => unreachable!("reduce kinds only"),
        }
        Ok(())
    }

    /// Combines what has arrived and moves up to the next send or delivery.
    pub(crate) fn next(&mut self, g: &GroupState) -> ReduceNext {
        let ReduceParams { all, root, tree, dtype, op, .. } = self.params;
        let rel = rel_rank(g.rank, root, g.n);
        let children = g.children(tree, rel);
        loop {
            match self.phase {
                Phase::Combine => {
                    let Some(acc) = self.acc.as_mut() else { return ReduceNext::Wait };
                    self.partials.resize(children.len(), None);
                    while (self.combined as usize) < children.len() {
                        let Some(x) = self.partials[self.combined as usize].take() else { return ReduceNext::Wait };
                        let ok = crate::combine::combine(dtype, op, acc, &x);
                        debug_assert!(ok, "lengths checked on arrival");
                        self.combined += 1;
                    }
                    self.phase = Phase::Up;
                }
                Phase::Up => match g.parent(tree, rel) {
                    Some(p) => {
                        let data = self.acc.clone().expect("own contribution");
                        let (to, round) = (abs_rank(p, root, g.n), all as u8);
                        return ReduceNext::Send { to, kind: CollKind::ReduceUp, round, data };
                    }
                    None => {
                        self.down = self.acc.take();
                        self.phase = Phase::Deliver;
                    }
                },
                Phase::Deliver => match &self.down {
                    Some(result) => return ReduceNext::Deliver(result.clone()),
                    None => return ReduceNext::Wait,
                },
                Phase::Down => match children.get(self.sub as usize) {
                    Some(&c) => {
                        let data = self.down.clone().expect("result");
                        let to = abs_rank(c, root, g.n);
                        return ReduceNext::Send { to, kind: CollKind::AllreduceDown, round: 1, data };
                    }
                    None => self.phase = Phase::Done,
                },
                Phase::Done => return ReduceNext::Done,
            }
        }
    }

    /// The send [`Reduce::next`] asked for is queued.
    pub(crate) fn sent(&mut self) {
        match self.phase {
            Phase::Up => self.phase = if self.params.all { Phase::Deliver } else { Phase::Done },
            Phase::Down => self.sub += 1,
            p => unreachable!("no send in phase {p:?}"),
        }
    }

    /// The result is in the host's buffer.
    pub(crate) fn delivered(&mut self) {
        debug_assert_eq!(self.phase, Phase::Deliver);
        self.phase = if self.params.all { Phase::Down } else { Phase::Done };
    }
}

impl Nic {
    /// Combines partials in the fixed order, sends up, delivers results.
    fn progress_reduce<H: Hal>(&mut self, hal: &mut H, now: u64, op: u32) -> Result<(), Status> {
        loop {
            let o = self.coll_ops.get_mut(op);
            let g = self.groups.get(o.group).expect("live group");
            let CollState::Reduce(r) = &mut o.state else { unreachable!("reduce op") };
            let ReduceParams { root, tree, .. } = r.params;
            match r.next(g) {
                ReduceNext::Wait => return Ok(()),
                ReduceNext::Done => {
                    o.local_done = true;
                    return Ok(());
                }
                ReduceNext::Send { to, kind, round, data } => {
                    let h = self.coll_header(op, kind, round, root as u8, tree);
                    if !self.coll_send(now, op, to, h, CollData::Nic(data))? {
                        return Ok(());
                    }
                    self.reduce_mut(op).sent();
                }
                ReduceNext::Deliver(result) => {
                    let (ld, _) = o.desc.expect("posted");
                    let port = o.port;
                    self.sge_io(hal, port, &ld.sges()[1..2], 0, Buf::ToHost(&result), MR_LOCAL_WRITE)?;
                    self.reduce_mut(op).delivered();
                }
            }
        }
    }

    fn reduce_mut(&mut self, op: u32) -> &mut Reduce {
        match &mut self.coll_ops.get_mut(op).state {
            CollState::Reduce(r) => r,
            _ => unreachable!("reduce op"),
        }
    }

    /// The host's input is copied to the NIC at the post: the host may
    /// reuse its buffer at once.
    fn reduce_load_input<H: Hal>(&mut self, hal: &mut H, port: u16, op: u32, ld: &LocalDesc, p: ReduceParams) {
        let mut input = vec![0u8; p.bytes()];
        let r = self.sge_io(hal, port, &ld.sges()[..1], 0, Buf::FromHost(&mut input), MR_LOCAL_READ);
        let o = self.coll_ops.get_mut(op);
        match (r, &mut o.state) {
            (Ok(()), CollState::Reduce(red)) => red.own(input),
            (Ok(()), _) => {} // Joined an early op of another kind: failed already.
            (Err(e), _) => {
                o.error.get_or_insert(e);
            }
        }
    }
}
// ==== bcast ====

/// A broadcast: the root sends to its children; every other member
/// receives from its parent and forwards to its children frame by frame
/// as the data arrives, posted or not (application bypass).
#[derive(Debug)]
pub(crate) struct Bcast {
    pub root: u16,
    pub tree: u8,
    pub len: u64,
    /// Where the data is: the posted buffer, or the bounce slot a
    /// broadcast received before its post lands in.
    pub data: LocalDesc,
    /// The bounce slot holding the data, when it arrived before the post.
    pub bounce: Option<u16>,
    /// The receive record while the data arrives.
    pub rx: Option<u32>,
    /// The data has been received in full.
    pub rx_done: bool,
    /// Messages to the children (transmission records), `fwd[i]` to the
    /// i-th; raised frame by frame as the data arrives.
    pub fwd: Vec<u32>,
    pub cache: FrameCache,
}

impl Bcast {
    pub(crate) fn new(root: u16, tree: u8, len: u64, data: LocalDesc, bounce: Option<u16>) -> Bcast {
        Bcast { root, tree, len, data, bounce, rx: None, rx_done: false, fwd: Vec::new(), cache: FrameCache::default() }
    }

    pub(crate) fn params(&self) -> Params {
        Params::Bcast { root: self.root, tree: self.tree, len: self.len }
    }
}

impl Nic {
    /// Frame 0 of a broadcast from our parent: receive it into the posted
    /// buffer, or (application bypass) into a bounce slot, and start
    /// forwarding to our children while the rest arrives.
    fn accept_bcast<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        target: Target,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        ch: &CollHeader,
    ) -> Result<u32, NackReason> {
        let len = msg.total_len - CollHeader::SIZE as u64;
        self.check_bcast_arrival(target, hdr, msg, ch, len)?;
        let op = match target {
            // Posted: it lands in the posted buffer.
            Target::Existing { op, .. } => op,
            Target::Fresh(key) => self.bcast_bounce(key, ch, len)?,
        };
        let o = self.coll_ops.get(op).expect("live");
        let CollState::Bcast(b) = &o.state else { unreachable!("checked") };
        let (stamp, data) = (o.stamp, b.data);
        let port = hdr.dst_port;
        let peer = self.find_peer(port, hdr.src_node, hdr.src_port).expect("frame's peer exists");
        let owner = crate::rx::RxOwner::Bcast { op, stamp };
        let r = self.rx_open(now, peer, hdr, msg, data, owner).expect("checked not full");
        self.bcast_mut(op).rx = Some(r);
        // Children are fed from where the data lands, frame by frame.
        self.coll_progress(hal, now, op);
        Ok(r)
    }

    /// A broadcast's first frame agrees with the group and with the op it
    /// is for, and can be received now.
    fn check_bcast_arrival(
        &self,
        target: Target,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        ch: &CollHeader,
        len: u64,
    ) -> Result<(), NackReason> {
        let (root, tree) = (ch.root as u16, ch.tree);
        let g = self.groups.get(target.group()).expect("live group");
        let existing = match target {
            Target::Existing { op, .. } => Some(self.coll_ops.get(op).expect("live")),
            Target::Fresh(_) => None,
        };
        let same = existing.is_none_or(|o| o.state.params() == Params::Bcast { root, tree, len });
        if root >= g.n || tree as usize >= g.trees.len() || !same {
            return Err(NackReason::CollMismatch);
        }
        let rel = rel_rank(g.rank, root, g.n);
        // An early op of this kind is already receiving it.
        let again = existing.is_some_and(|o| o.desc.is_none());
        if rel == 0 || g.parent(tree, rel) != Some(rel_rank(ch.sender as u16, root, g.n)) || again {
            return Err(NackReason::CollMismatch);
        }
        if self.rx.is_full() || wire::frames_for(msg.total_len, self.mtu) != hdr.frame_count as u64 {
            return Err(NackReason::NoMatch);
        }
        Ok(())
    }

    /// Not posted: the broadcast lands in a bounce slot, if it fits one;
    /// records the op.
    fn bcast_bounce(&mut self, key: FreshOp, ch: &CollHeader, len: u64) -> Result<u32, NackReason> {
        let g = self.groups.slots[key.group as usize].as_mut().expect("live group");
        if len > g.bounce_slot_size as u64 {
            return Err(NackReason::NoMatch);
        }
        let Some(b) = g.bounce_free.pop() else { return Err(NackReason::NoMatch) };
        let (rkey, base, size) = (g.bounce_key, g.bounce_offset, g.bounce_slot_size as u64);
        let mut wd = WorkDesc { opcode: Opcode::Recv as u8, num_sge: 1, ..Default::default() };
        wd.sge[0] = emp_uapi::desc::Sge { key: rkey, len: len as u32, offset: base + b as u64 * size };
        let state = Bcast::new(ch.root as u16, ch.tree, len, LocalDesc::new(&wd), Some(b));
        Ok(self.coll_ops.insert_checked(key.op(CollState::Bcast(state))))
    }

    fn bcast_mut(&mut self, op: u32) -> &mut Bcast {
        match &mut self.coll_ops.get_mut(op).state {
            CollState::Bcast(b) => b,
            _ => unreachable!("broadcast op"),
        }
    }

    /// Frame `f` of a broadcast arrived and is in host memory as `data`:
    /// keep it, so forwarding sends it to every child without reading it
    /// back from the host.
    pub(crate) fn bcast_frame_received(&mut self, op: u32, stamp: u32, f: u32, data: &[u8]) {
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return;
        }
        let pending = self.coll_cache_pending(op, f);
        self.coll_cache_insert(op, f, pending, data);
    }

    /// Frames `0..contig` of a broadcast are in host memory: forwarding may
    /// send them.
    pub(crate) fn bcast_frames_here(&mut self, op: u32, stamp: u32, contig: u32) {
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return;
        }
        // Only this op's own forwarding records (a finished one's slot may
        // hold another message by now).
        for t in self.coll_ops.get(op).expect("live").state.fwd().to_vec() {
            let Some(m) = self.tx.get(t) else { continue };
            let ours = m.coll.as_ref().is_some_and(|c| c.op == op && c.op_stamp == stamp);
            if ours && m.limit < contig {
                let peer = m.peer;
                self.tx.get_mut(t).limit = contig;
                self.mark_ready(peer);
            }
        }
    }

    /// A broadcast finished arriving (or failed).
    pub(crate) fn bcast_rx_done<H: Hal>(&mut self, hal: &mut H, now: u64, op: u32, stamp: u32, error: Option<Status>) {
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return;
        }
        let b = self.bcast_mut(op);
        b.rx_done = true;
        b.rx = None;
        if let Some(e) = error {
            self.coll_ops.get_mut(op).error.get_or_insert(e);
        }
        self.coll_progress(hal, now, op);
    }

    /// Root: send to each child. Others: forward to each child (limited to
    /// the frames present); when posted after a bounce, copy to the user's
    /// buffer once everything arrived.
    fn progress_bcast<H: Hal>(&mut self, hal: &mut H, now: u64, op: u32) -> Result<(), Status> {
        let o = self.coll_ops.get(op).expect("live");
        let CollState::Bcast(b) = &o.state else { unreachable!("broadcast op") };
        let g = self.groups.get(o.group).expect("live group");
        let (root, tree, n) = (b.root, b.tree, g.n);
        let rel = rel_rank(g.rank, root, n);
        let children = g.children(tree, rel);
        let contig = if rel == 0 {
            u32::MAX
        } else {
            // Frames already here (the receive record, or all of them).
            b.rx.and_then(|r| self.rx.get(r)).map_or(if b.rx_done { u32::MAX } else { 0 }, |m| m.contig)
        };
        loop {
            let dest = self.coll_ops.get(op).expect("live").state.fwd().len() as u32;
            let Some(&c) = children.get(dest as usize) else { break };
            let h = self.coll_header(op, CollKind::Bcast, 0, root as u8, tree);
            let data = CollData::Host { dest };
            let Some(t) = self.coll_send_limited(now, op, abs_rank(c, root, n), Some(h), data, contig)? else {
                return Ok(());
            };
            self.bcast_mut(op).fwd.push(t);
        }
        let o = self.coll_ops.get(op).expect("live");
        let CollState::Bcast(b) = &o.state else { unreachable!("broadcast op") };
        if rel != 0 && (!b.rx_done || o.desc.is_none()) {
            return Ok(());
        }
        if let (Some(_), false) = (b.bounce, o.local_done) {
            // Posted after the data arrived in a bounce slot: copy it over.
            let (ld, _) = o.desc.expect("posted");
            let from = b.data;
            let mut tmp = vec![0u8; from.len as usize];
            let port = o.port;
            self.sge_io(hal, port, from.sges(), 0, Buf::FromHost(&mut tmp), MR_LOCAL_READ)?;
            self.sge_io(hal, port, ld.sges(), 0, Buf::ToHost(&tmp), MR_LOCAL_WRITE)?;
        }
        self.coll_ops.get_mut(op).local_done = true;
        Ok(())
    }
}
// ==== multisend ====

/// A multisend (seed 000 §5): one descriptor, the members in the rank
/// mask as destinations; each gets an ordinary tagged message (matched by
/// its posted receives, with its own sequence, window and flow control),
/// and each payload frame is read from host memory once for all.
#[derive(Debug)]
pub(crate) struct Multi {
    pub mask: u64,
    pub len: u64,
    /// The host's data.
    pub data: LocalDesc,
    /// Messages to the destinations (transmission records), `fwd[i]` to
    /// the i-th in ascending rank.
    pub fwd: Vec<u32>,
    pub cache: FrameCache,
    /// Destinations whose message failed.
    pub failed: u32,
}

impl Multi {
    pub(crate) fn new(mask: u64, len: u64, data: LocalDesc) -> Multi {
        Multi { mask, len, data, fwd: Vec::new(), cache: FrameCache::default(), failed: 0 }
    }

    pub(crate) fn params(&self) -> Params {
        Params::Multi { mask: self.mask, len: self.len }
    }

    /// The next destination to send to (in ascending rank), if any.
    fn next_dest(&self) -> Option<u16> {
        (0..64u16).filter(|&r| self.mask & (1 << r) != 0).nth(self.fwd.len())
    }

    /// Destinations that failed or were never sent to (after a failure).
    pub(crate) fn undelivered(&self) -> u32 {
        self.failed + (self.mask.count_ones() - self.fwd.len() as u32)
    }
}

impl Nic {
    fn validate_multisend<H: Hal>(&self, hal: &mut H, port: u16, slot: u32, ld: &LocalDesc) -> Result<Params, Status> {
        let g = self.groups.get(slot).expect("checked by the caller");
        let mask = ld.wd.ignore;
        if (g.n < 64 && mask >> g.n != 0) || mask & (1 << g.rank) != 0 {
            return Err(Status::BadDescriptor);
        }
        self.check_sges(hal, port, ld.sges(), MR_LOCAL_READ)?;
        if ld.len > self.cfg.msg_max {
            return Err(Status::TooLarge);
        }
        Ok(Params::Multi { mask, len: ld.len })
    }

    /// A multisend is not an instance of the group's collective sequence:
    /// it starts at once.
    fn post_multisend<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, ld: LocalDesc, mask: u64) {
        let slot = ld.wd.node as u32;
        let stamp = self.next_stamp();
        let state = CollState::Multi(Multi::new(mask, ld.len, ld));
        let mut o = CollOp::new(port, slot, u32::MAX, stamp, state);
        o.desc = Some((ld, Opcode::MultiSend));
        let op = self.coll_ops.insert_checked(o);
        self.coll_progress(hal, now, op);
    }

    fn progress_multi(&mut self, now: u64, op: u32) -> Result<(), Status> {
        loop {
            let CollState::Multi(m) = &self.coll_ops.get(op).expect("live").state else { unreachable!("multisend") };
            let dest = m.fwd.len() as u32;
            let Some(to) = m.next_dest() else { break };
            let Some(t) = self.coll_send_limited(now, op, to, None, CollData::Host { dest }, u32::MAX)? else {
                return Ok(());
            };
            let CollState::Multi(m) = &mut self.coll_ops.get_mut(op).state else { unreachable!() };
            m.fwd.push(t);
        }
        self.coll_ops.get_mut(op).local_done = true;
        Ok(())
    }
}
// ==== cache ====

/// A frame's payload kept on the NIC so that the op's destinations send it
/// without reading host memory again: filled when a broadcast frame arrives
/// (an inner rank forwards what it just received) or on the first host read
/// (root, multisend: the payload is DMA'd once, design §1.1). An entry lives
/// until every destination has sent the frame once; beyond the bound the
/// oldest frame goes and whoever still needs it reads the host.
#[derive(Debug)]
pub(crate) struct CachedFrame {
    pub frame: u32,
    /// Bit `i`: destination `i` (`CollData::Host { dest }`) has not sent it yet.
    pub pending: u64,
    /// The frame's data bytes (after any `CollHeader`).
    pub data: Vec<u8>,
}

/// One op's cached frames. Every method keeps the NIC-wide count of
/// cached frames (`used`) in step.
#[derive(Debug, Default)]
pub(crate) struct FrameCache {
    frames: Vec<CachedFrame>,
}

impl FrameCache {
    pub(crate) fn len(&self) -> u32 {
        self.frames.len() as u32
    }

    /// Copies frame `f` into `out` for destination `dest`, if cached; the
    /// entry goes once every destination has had it.
    pub(crate) fn take(&mut self, f: u32, dest: u32, out: &mut [u8], used: &mut u32) -> bool {
        let Some(i) = self.frames.iter().position(|e| e.frame == f) else { return false };
        let e = &mut self.frames[i];
        assert_eq!(e.data.len(), out.len(), "frame {f} cached with another length");
        out.copy_from_slice(&e.data);
        e.pending &= !(1u64 << dest);
        if e.pending == 0 {
            self.frames.swap_remove(i);
            *used -= 1;
        }
        true
    }

    /// Keeps frame `f`'s data for the destinations in `pending`. At the
    /// bound (`per_op` frames here, `nic_max` on the NIC) the oldest frame
    /// goes: it waits only for destinations far behind, which then read
    /// the host.
    pub(crate) fn insert(&mut self, f: u32, pending: u64, data: &[u8], per_op: usize, used: &mut u32, nic_max: u32) {
        if pending == 0 || data.is_empty() || per_op == 0 || self.frames.iter().any(|e| e.frame == f) {
            return;
        }
        if self.frames.len() >= per_op || *used >= nic_max {
            let Some(oldest) = self.frames.iter().enumerate().min_by_key(|(_, e)| e.frame).map(|(i, _)| i) else {
                return; // Other ops hold the whole cache.
            };
            self.frames.swap_remove(oldest);
            *used -= 1;
        }
        self.frames.push(CachedFrame { frame: f, pending, data: data.to_vec() });
        *used += 1;
        assert!(*used <= nic_max);
    }

    /// Destination `dest` needs no cached frame any more.
    pub(crate) fn release(&mut self, dest: u32, used: &mut u32) {
        let before = self.frames.len();
        for e in self.frames.iter_mut() {
            e.pending &= !(1u64 << dest);
        }
        self.frames.retain(|e| e.pending != 0);
        *used -= (before - self.frames.len()) as u32;
    }

    /// Every entry waits for some of the op's `dests` destinations, holds
    /// one frame of at most `mtu` bytes, and no frame is cached twice.
    pub(crate) fn check(&self, dests: u32, mtu: u32) -> Result<(), String> {
        let all = if dests >= 64 { u64::MAX } else { (1u64 << dests) - 1 };
        for (i, e) in self.frames.iter().enumerate() {
            if e.pending == 0 || e.pending & !all != 0 || e.data.is_empty() || e.data.len() > mtu as usize {
                return Err(format!(
                    "cached frame {} pending {:#x} of {dests}, {} B",
                    e.frame,
                    e.pending,
                    e.data.len()
                ));
            }
            if self.frames[..i].iter().any(|x| x.frame == e.frame) {
                return Err(format!("frame {} cached twice", e.frame));
            }
        }
        Ok(())
    }
}

impl Nic {
    /// Data of frame `f` (from data offset `data_off`) of internal message
    /// `tx`, whose data is in host memory: from the op's frame cache, or
    /// read from the host and kept for the destinations that still need it.
    pub(crate) fn coll_frame_data<H: Hal>(
        &mut self,
        hal: &mut H,
        tx: u32,
        f: u32,
        data_off: u64,
        out: &mut [u8],
    ) -> Result<(), Status> {
        let m = self.tx.get(tx).expect("live");
        let c = m.coll.as_ref().expect("collective message");
        let CollData::Host { dest } = c.data else { unreachable!("host data only") };
        let (op, stamp, port, desc) = (c.op, c.op_stamp, m.port, m.desc);
        let live = self.coll_ops.get(op).is_some_and(|o| o.stamp == stamp);
        if live {
            let cache = self.coll_ops.get_mut(op).state.cache_mut().expect("host data has a cache");
            if cache.take(f, dest, out, &mut self.coll_cache_used) {
                return Ok(());
            }
        }
        self.sge_io(hal, port, desc.sges(), data_off, Buf::FromHost(out), MR_LOCAL_READ)?;
        if live {
            let pending = self.coll_cache_pending(op, f) & !(1u64 << dest);
            self.coll_cache_insert(op, f, pending, out);
        }
        Ok(())
    }

    /// The op's destinations that have not sent frame `f` yet: their
    /// message is not queued yet, or has not reached `f` (finished ones
    /// need nothing).
    fn coll_cache_pending(&self, op: u32, f: u32) -> u64 {
        let o = self.coll_ops.get(op).expect("live");
        let dests = self.coll_dests(o);
        let fwd = o.state.fwd();
        assert!(dests <= 64 && fwd.len() as u32 <= dests);
        let mut pending = 0u64;
        for d in 0..dests {
            let needs = match fwd.get(d as usize) {
                None => true,
                // The slot may hold another message by now.
                Some(&t) => self.tx.get(t).is_some_and(|m| {
                    m.coll.as_ref().is_some_and(|c| {
                        c.op == op && c.op_stamp == o.stamp && matches!(c.data, CollData::Host { dest } if dest == d)
                    }) && m.next_frame <= f
                }),
            };
            pending |= (needs as u64) << d;
        }
        pending
    }

    /// Keeps frame `f`'s data in the op's cache for the destinations in `pending`.
    fn coll_cache_insert(&mut self, op: u32, f: u32, pending: u64, data: &[u8]) {
        let per_op = self.cfg.window_frames.min(self.cfg.coll_cache_frames) as usize;
        let nic_max = self.cfg.coll_cache_frames;
        let cache = self.coll_ops.get_mut(op).state.cache_mut().expect("host data has a cache");
        cache.insert(f, pending, data, per_op, &mut self.coll_cache_used, nic_max);
    }

    /// Destination `dest`'s message finished (sent, or failed): it needs
    /// no cached frame any more.
    fn coll_cache_release(&mut self, op: u32, stamp: u32, dest: u32) {
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return;
        }
        if let Some(cache) = self.coll_ops.get_mut(op).state.cache_mut() {
            cache.release(dest, &mut self.coll_cache_used);
        }
    }
}
