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

//!
//! One file per kind of operation, each with its state (a variant of
//! [`CollState`]) and the `Nic` steps that perform it: `barrier`, `reduce`
//! (barrier and reduction are pure state machines that say what to send;
//! `Nic` sends it), `bcast`, `multisend`; `cache` keeps the frames a
//! broadcast or multisend sends to several destinations. This file holds
//! what every kind shares: the op record, posting, the dispatch of arriving
//! messages, internal messages and completion.

mod barrier;
mod bcast;
mod cache;
mod multisend;
mod reduce;

use emp_uapi::coll::{rel_rank, BarrierAlgo, CollHeader, CollKind, Dtype, ReduceOp};
use emp_uapi::desc::{Opcode, Status, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_uapi::seq_lt;
use emp_uapi::sram::counter;
use emp_uapi::wire::{self, FrameHeader, MsgHeader, NackReason};
use emp_uapi::Le;

use crate::cq::Completion;
use crate::group::GroupState;
use crate::{Hal, LocalDesc, Nic};

use barrier::barrier_algo_of;
pub(crate) use barrier::Barrier;
use bcast::Bcast;
use cache::FrameCache;
use multisend::Multi;
use reduce::Arrival;
pub(crate) use reduce::{Reduce, ReduceParams};

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
        base: u16,
        len: u64,
    },
    Reduce(ReduceParams),
}

impl Params {
    pub(crate) fn bytes(&self) -> usize {
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
    pub(crate) fn new(port: u16, group: u32, instance: u32, stamp: u32, state: CollState) -> CollOp {
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
            Params::Multi { mask, base, len } => CollState::Multi(Multi::new(mask, base, len, ld)),
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
    pub(crate) fn partials_held(&self) -> u32 {
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

/// The `op` of the reliable broadcast's copies' `CollTx` (`rbcast/`): no
/// collective operation record owns them (their `op_stamp` is the group
/// state's stamp).
pub(crate) const RBCAST_OP: u32 = u32::MAX;

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
        if opcode == Opcode::Rbcast {
            // Not an instance of the group's collective sequence: its own
            // per-root sequence orders it (`rbcast/`).
            return self.rbcast_post(hal, now, port, ld);
        }
        let slot = ld.wd.node as u32;
        let checked = match self.groups.get(slot).filter(|g| g.port == port) {
            None => Err(Status::GroupInvalid),
            Some(_) => match opcode {
                Opcode::MultiSend => self.validate_multisend(hal, port, slot, &ld),
                Opcode::Barrier => self.validate_barrier(self.groups.get(slot).expect("checked"), &ld),
                Opcode::Reduce | Opcode::Allreduce => {
                    self.validate_reduce(hal, port, self.groups.get(slot).expect("checked"), &ld, opcode)
                }
                Opcode::Bcast => self.validate_bcast(hal, port, slot, &ld),
                _ => Err(Status::BadDescriptor),
            },
        };
        match checked {
            Err(st) => self.complete(hal, port, Completion::of(&ld, opcode, st)),
            Ok(Params::Multi { mask, base, .. }) => self.post_multisend(hal, now, port, ld, mask, base),
            Ok(params) => self.post_instance(hal, now, port, ld, opcode, params),
        }
    }

    /// A barrier's descriptor on group `g` (also a restored one's, `ctxsw.rs`).
    pub(crate) fn validate_barrier(&self, g: &GroupState, ld: &LocalDesc) -> Result<Params, Status> {
        let algo = BarrierAlgo::from_u16(ld.wd.port).expect("validated");
        let tree = ld.wd.tag as u8;
        if algo == BarrierAlgo::GatherRelease && tree as usize >= g.trees.len() {
            return Err(Status::BadDescriptor);
        }
        Ok(Params::Barrier { algo, tree })
    }

    /// A reduction's descriptor on group `g` of `port` (also a restored
    /// one's, `ctxsw.rs`).
    pub(crate) fn validate_reduce<H: Hal>(
        &self,
        hal: &mut H,
        port: u16,
        g: &GroupState,
        ld: &LocalDesc,
        opcode: Opcode,
    ) -> Result<Params, Status> {
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
        if kind == CollKind::Rbcast {
            return self.rbcast_accept_p2p(hal, now, hdr, msg, payload);
        }
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
            CollKind::Rbcast => unreachable!("handled above"),
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
        if g.rank_of(hdr.src_node, hdr.src_port) != Some(ch.sender) {
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

    fn coll_header(&self, op: u32, kind: CollKind, round: u8, root: u16, tree: u8) -> CollHeader {
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
            sender: g.rank,
            count,
            ..Default::default()
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
        if self.send.tx.is_full() {
            self.coll_ops.get_mut(op).stalled = true;
            self.coll_stalled = true;
            return Ok(None);
        }
        let o = self.coll_ops.get(op).expect("live");
        let g = self.groups.get(o.group).expect("live group");
        let (node, rport) = g.endpoint(to);
        let (port, stamp, src) = (o.port, o.stamp, o.state.source());
        let Some(peer) = self.peer_for(now, port, node, rport, 0) else { return Err(Status::TableFull) };
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
        if op == RBCAST_OP {
            return self.rbcast_p2p_done(c);
        }
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
            if self.send.tx.is_full() {
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
            let Some(o) = self.coll_ops.get(op).filter(|o| o.group == group) else { continue };
            let stamp = o.stamp;
            // Failed first, so finishing its messages cannot start new ones.
            self.coll_ops.get_mut(op).error.get_or_insert(status);
            let rxs: Vec<u32> = self
                .recv
                .rx
                .iter()
                .filter(|(_, m)| m.owner == crate::rx::RxOwner::Bcast { op, stamp })
                .map(|(s, _)| s)
                .collect();
            for r in rxs {
                self.finish_rx(hal, now, r, Some(Status::Flushed));
            }
            // Finishing its receive may have completed (and retired) it.
            let live = |nic: &Self| nic.coll_ops.get(op).is_some_and(|o| o.stamp == stamp);
            if !live(self) {
                continue;
            }
            let early = self.coll_ops.get(op).expect("live").desc.is_none();
            let txs: Vec<u32> = self
                .send
                .tx
                .iter()
                .filter(|(_, m)| m.coll.as_ref().is_some_and(|c| c.op == op && c.op_stamp == stamp))
                .map(|(s, _)| s)
                .collect();
            for t in txs {
                self.finish_tx(hal, now, t, Status::Flushed);
            }
            if early {
                if !live(self) {
                    continue;
                }
                // No descriptor to complete: the record just goes.
                let o = self.coll_op_remove(op);
                self.coll_pool_used -= o.state.partials_held().min(self.coll_pool_used);
                if let (Some(b), Some(g)) = (o.state.bounce(), self.groups.slots[o.group as usize].as_mut()) {
                    g.bounce_free.push(b);
                }
                continue;
            }
            if live(self) {
                self.coll_try_complete(hal, op);
            }
        }
    }

    /// Refused collective messages of `port`'s peers may be acceptable now:
    /// ask their senders to resend at once instead of after their backoff.
    pub(crate) fn coll_kick<H: Hal>(&mut self, hal: &mut H, port: u16) {
        let refused: Vec<(u32, u32)> = self
            .live_peers()
            .filter(|&(i, p)| {
                let r = self.recv.peer(i);
                p.port == port && r.rnr_coll && r.rnr_seq == Some(r.rx_expected)
            })
            .map(|(i, _)| (i, self.recv.peer(i).rx_expected))
            .collect();
        for (peer, seq) in refused {
            self.recv_cpu().send_nack(hal, peer, seq, 0, 1, NackReason::Loss);
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
            self.send.tx.iter().filter_map(|(_, m)| m.coll.as_ref().map(|c| (c.op, c.op_stamp))).collect();
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

/// A loaded group for the state machines' unit tests: member `rank` of
/// `parents.len()` (at most 64), with one tree (`parents`, over relative ranks).
#[cfg(test)]
pub(crate) fn test_group(rank: u16, parents: &[u8]) -> GroupState {
    let n = parents.len();
    let mut e = emp_uapi::sram::GroupEntry {
        group_id: 1,
        epoch: 1,
        member_count: n as u16,
        my_rank: rank,
        tree_count: 1,
        ..Default::default()
    };
    for r in 0..n {
        e.members[r] = (r as u32 + 1) << 16;
    }
    e.parents[..n].copy_from_slice(parents);
    GroupState::load(&emp_uapi::sram::GroupView { entry: &e, body: &[] }, 1)
}

/// A collective header from `sender` for the state machines' unit tests.
#[cfg(test)]
fn test_header(kind: CollKind, sender: u16, round: u8) -> CollHeader {
    CollHeader {
        group_id: 1,
        epoch: 1,
        instance: 0,
        kind: kind as u8,
        round,
        root: 0,
        tree: 0,
        dtype: 0,
        op: 0,
        sender,
        ..Default::default()
    }
}
