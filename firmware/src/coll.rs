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
    Reduce {
        all: bool,
        root: u16,
        tree: u8,
        dtype: Dtype,
        op: ReduceOp,
        count: u32,
    },
}

impl Params {
    fn bytes(&self) -> usize {
        match *self {
            Params::Barrier { .. } => 0,
            Params::Bcast { len, .. } | Params::Multi { len, .. } => len as usize,
            Params::Reduce { dtype, count, .. } => dtype.size() * count as usize,
        }
    }
}

/// A collective operation instance on this NIC.
#[derive(Debug)]
pub(crate) struct CollOp {
    pub port: u16,
    pub group: u32,
    pub instance: u32,
    /// Unique across slot reuse: internal messages name their op by it.
    pub stamp: u32,
    /// The host's descriptor; `None` while only early messages are known.
    pub desc: Option<(LocalDesc, Opcode)>,
    pub params: Option<Params>,
    /// Barrier arrivals: bit = round (PE/dissemination; 62 = PE "pre",
    /// 63 = PE release) or child relative rank (gather).
    pub arrived: u64,
    /// Gather-release: the parent's release arrived.
    pub released: bool,
    /// Position in the barrier schedule / phase of the reduction.
    pub step: u32,
    /// Sub-position (releases sent so far).
    pub sub: u32,
    /// Reduction accumulator (own contribution first).
    pub acc: Vec<u8>,
    pub have_own: bool,
    /// Partials from children, by position in the ascending child list.
    pub partials: Vec<Option<Vec<u8>>>,
    /// Children combined so far.
    pub combined: u32,
    /// Allreduce: the result received from the parent.
    pub down: Option<Vec<u8>>,
    /// Internal messages not finished yet.
    pub pending_tx: u32,
    pub error: Option<Status>,
    /// The NIC's part is done; completes when `pending_tx` is 0 too.
    pub local_done: bool,
    /// Waiting for a free transmission record.
    pub stalled: bool,
    /// Broadcast: the message has been received in full.
    pub rx_done: bool,
    /// Broadcast received before the post: the bounce slot holding it.
    pub bounce: Option<u16>,
    /// Broadcast: where the data is (user buffer, or the bounce slot).
    pub data: Option<LocalDesc>,
    /// Broadcast: its receive record while it arrives.
    pub rx: Option<u32>,
    /// Broadcast and multisend: the messages to the destinations
    /// (transmission records), `fwd[i]` to destination `i`; a broadcast's
    /// are raised frame by frame as the data arrives.
    pub fwd: Vec<u32>,
    /// Broadcast and multisend: the frame cache (see [`CachedFrame`]).
    pub frames: Vec<CachedFrame>,
    /// Multisend: destinations that failed.
    pub failed: u32,
}

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
fn barrier_algo_of(kind: CollKind) -> Option<BarrierAlgo> {
    match kind {
        CollKind::BarrierPe => Some(BarrierAlgo::PairwiseExchange),
        CollKind::BarrierDiss => Some(BarrierAlgo::Dissemination),
        CollKind::BarrierGather | CollKind::BarrierRelease => Some(BarrierAlgo::GatherRelease),
        _ => None,
    }
}

impl Nic {
    /// Can the tables take one more posted collective of `op`?
    pub(crate) fn coll_fits(&self, op: Opcode) -> bool {
        !op.is_collective() || !self.coll_ops.is_full()
    }

    /// A collective descriptor from the send ring (validated by the caller).
    pub(crate) fn post_coll<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, ld: LocalDesc, opcode: Opcode) {
        let fail = |nic: &mut Nic, hal: &mut H, st: Status| nic.complete(hal, port, Completion::of(&ld, opcode, st));
        let slot = ld.wd.node as u32;
        let Some(g) = self.groups.get(slot).filter(|g| g.port == port) else {
            return fail(self, hal, Status::GroupInvalid);
        };
        let (n, trees) = (g.n, g.trees.len());
        if opcode == Opcode::MultiSend {
            return self.post_multisend(hal, now, port, slot, ld);
        }
        let params = match opcode {
            Opcode::Barrier => {
                let algo = BarrierAlgo::from_u16(ld.wd.port).expect("validated");
                let tree = ld.wd.tag as u8;
                if algo == BarrierAlgo::GatherRelease && tree as usize >= trees {
                    return fail(self, hal, Status::BadDescriptor);
                }
                Params::Barrier { algo, tree }
            }
            Opcode::Reduce | Opcode::Allreduce => {
                let (dt, rop, tree) = emp_uapi::coll::reduce_tag_parts(ld.wd.tag);
                let (dtype, op) = (Dtype::from_u8(dt).expect("validated"), ReduceOp::from_u8(rop).expect("validated"));
                let all = opcode == Opcode::Allreduce;
                let root = ld.wd.port;
                if root >= n || tree as usize >= trees {
                    return fail(self, hal, Status::BadDescriptor);
                }
                if !op.defined_for(dtype) {
                    return fail(self, hal, Status::InvalidOp);
                }
                let p = Params::Reduce { all, root, tree, dtype, op, count: ld.wd.ignore as u32 };
                let bytes = p.bytes();
                if bytes > self.cfg.coll_buf_size as usize
                    || CollHeader::SIZE + bytes > wire::payload_capacity(self.mtu, 0)
                {
                    return fail(self, hal, Status::TooLarge);
                }
                let sges = ld.sges();
                let wants_result = all || g.rank == root;
                if sges[0].len as usize != bytes || (wants_result && (sges.len() < 2 || sges[1].len as usize != bytes))
                {
                    return fail(self, hal, Status::BadDescriptor);
                }
                if let Err(st) = self.check_sges(hal, port, &sges[..1], MR_LOCAL_READ) {
                    return fail(self, hal, st);
                }
                if wants_result {
                    if let Err(st) = self.check_sges(hal, port, &sges[1..2], MR_LOCAL_WRITE) {
                        return fail(self, hal, st);
                    }
                }
                p
            }
            Opcode::Bcast => {
                let (root, tree) = (ld.wd.port, ld.wd.tag as u8);
                if root >= n || tree as usize >= trees {
                    return fail(self, hal, Status::BadDescriptor);
                }
                if ld.len > self.cfg.msg_max {
                    return fail(self, hal, Status::TooLarge);
                }
                let access = if g.rank == root { MR_LOCAL_READ } else { MR_LOCAL_WRITE };
                if let Err(st) = self.check_sges(hal, port, ld.sges(), access) {
                    return fail(self, hal, st);
                }
                Params::Bcast { root, tree, len: ld.len }
            }
            _ => return fail(self, hal, Status::BadDescriptor),
        };
        let g = self.groups.slots[slot as usize].as_mut().expect("checked");
        let instance = g.next_instance;
        g.next_instance = instance.wrapping_add(1);
        let op = match self.find_op(slot, instance) {
            Some(o) => o,
            None => {
                let stamp = self.next_stamp();
                self.coll_ops.insert_checked(CollOp::new(port, slot, instance, stamp))
            }
        };
        let rec = self.coll_ops.get_mut(op);
        rec.desc = Some((ld, opcode));
        match rec.params {
            Some(p) if p != params => rec.error = Some(Status::CollMismatch),
            _ => rec.params = Some(params),
        }
        if let Params::Reduce { .. } = params {
            // The input is copied to the NIC now: the host may reuse it.
            let mut acc = vec![0u8; params.bytes()];
            let r = self.sge_io(hal, port, &ld.sges()[..1], 0, Buf::FromHost(&mut acc), MR_LOCAL_READ);
            let rec = self.coll_ops.get_mut(op);
            match r {
                Ok(()) => {
                    rec.acc = acc;
                    rec.have_own = true;
                }
                Err(e) => {
                    rec.error.get_or_insert(e);
                }
            }
        }
        if let Params::Bcast { .. } = params {
            let rec = self.coll_ops.get_mut(op);
            if rec.bounce.is_none() {
                // Root: sends from here. Others: the message lands here.
                rec.data = Some(ld);
            }
        }
        self.release_early_buffers(op);
        self.coll_progress(hal, now, op);
        // Messages refused for lack of window may fit now.
        self.coll_kick(hal, port);
    }

    fn find_op(&self, group: u32, instance: u32) -> Option<u32> {
        self.coll_ops
            .iter()
            .find(|(_, o)| {
                o.group == group && o.instance == instance && !matches!(o.params, Some(Params::Multi { .. }))
            })
            .map(|(s, _)| s)
    }

    /// Partials an op received before it was posted used the shared pool;
    /// once posted, the op owns them.
    fn release_early_buffers(&mut self, op: u32) {
        let held = self.coll_ops.get(op).expect("live").partials.iter().filter(|p| p.is_some()).count() as u32;
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
        let port = hdr.dst_port;
        let Some(&slot) = self.groups.by_id.get(&(port, ch.group_id)) else {
            // Not created here yet (or already destroyed): retry later.
            return self.coll_refuse();
        };
        let g = self.groups.get(slot).expect("indexed");
        if ch.epoch < g.epoch {
            return CollAccept::Refuse(NackReason::StaleEpoch);
        }
        if ch.epoch > g.epoch {
            return self.coll_refuse();
        }
        if g.rank_of(hdr.src_node, hdr.src_port) != Some(ch.sender as u16) {
            return CollAccept::Refuse(NackReason::CollMismatch);
        }
        if kind != CollKind::Bcast && (hdr.frame_count != 1 || msg.total_len != payload.len() as u64) {
            return CollAccept::Refuse(NackReason::TooLarge);
        }
        let data = &payload[CollHeader::SIZE..];
        let ahead = ch.instance.wrapping_sub(g.next_instance);
        let op = match self.find_op(slot, ch.instance) {
            Some(o) => o,
            // Posted and finished (or never posted and behind us): the
            // members disagree on the sequence of collectives.
            None if seq_lt(ch.instance, g.next_instance) => return CollAccept::Refuse(NackReason::CollMismatch),
            None if ahead >= self.cfg.coll_window || self.coll_ops.used() + 1 >= self.cfg.coll_ops_max => {
                return self.coll_refuse();
            }
            None => {
                let stamp = self.next_stamp();
                let o = self.coll_ops.insert_checked(CollOp::new(port, slot, ch.instance, stamp));
                self.count(counter::COLL_EARLY, 1);
                o
            }
        };
        let r = match kind {
            CollKind::BarrierPe | CollKind::BarrierDiss | CollKind::BarrierGather | CollKind::BarrierRelease => {
                self.accept_barrier(op, &ch, kind)
            }
            CollKind::ReduceUp | CollKind::AllreduceDown => self.accept_reduce(op, &ch, kind, data),
            CollKind::Bcast => match self.accept_bcast(hal, now, op, hdr, msg, &ch) {
                Ok(r) => return CollAccept::Receive(r),
                Err(e) => Err(e),
            },
        };
        let is_empty_early = {
            let o = self.coll_ops.get(op).expect("live");
            o.desc.is_none()
                && o.arrived == 0
                && !o.released
                && o.partials.iter().all(|p| p.is_none())
                && o.down.is_none()
                && o.data.is_none()
        };
        match r {
            Ok(()) => {
                self.count(counter::RX_FRAMES, 1);
                self.count(counter::MSGS_RX, 1);
                self.coll_progress(hal, now, op);
                CollAccept::Consumed
            }
            Err(reason) => {
                if is_empty_early {
                    self.coll_op_remove(op);
                }
                if reason == NackReason::NoMatch {
                    return self.coll_refuse();
                }
                if self.coll_ops.get(op).is_some_and(|o| o.desc.is_some()) {
                    // The local operation cannot succeed either.
                    self.coll_ops.get_mut(op).error.get_or_insert(Status::CollMismatch);
                    self.coll_progress(hal, now, op);
                }
                CollAccept::Refuse(reason)
            }
        }
    }

    fn coll_refuse(&mut self) -> CollAccept {
        self.count(counter::COLL_REFUSED, 1);
        CollAccept::Refuse(NackReason::NoMatch)
    }

    fn accept_barrier(&mut self, op: u32, ch: &CollHeader, kind: CollKind) -> Result<(), NackReason> {
        let algo = barrier_algo_of(kind).expect("barrier kind");
        let o = self.coll_ops.get_mut(op);
        match o.params {
            None => o.params = Some(Params::Barrier { algo, tree: ch.tree }),
            Some(Params::Barrier { algo: a, tree })
                if a == algo && (algo != BarrierAlgo::GatherRelease || tree == ch.tree) => {}
            Some(_) => return Err(NackReason::CollMismatch),
        }
        if kind == CollKind::BarrierRelease {
            if o.released {
                return Err(NackReason::CollMismatch);
            }
            o.released = true;
            return Ok(());
        }
        let bit = match kind {
            CollKind::BarrierGather => {
                let g = self.groups.get(o.group).expect("live group");
                rel_rank(ch.sender as u16, 0, g.n) as u32
            }
            _ => round_bit(ch.round),
        };
        if bit >= 64 || o.arrived & (1 << bit) != 0 {
            return Err(NackReason::CollMismatch);
        }
        o.arrived |= 1 << bit;
        Ok(())
    }

    fn accept_reduce(&mut self, op: u32, ch: &CollHeader, kind: CollKind, data: &[u8]) -> Result<(), NackReason> {
        let (Some(dtype), Some(rop)) = (Dtype::from_u8(ch.dtype), ReduceOp::from_u8(ch.op)) else {
            return Err(NackReason::CollMismatch);
        };
        let p =
            Params::Reduce { all: ch.round == 1, root: ch.root as u16, tree: ch.tree, dtype, op: rop, count: ch.count };
        let o = self.coll_ops.get(op).expect("live");
        let g = self.groups.get(o.group).expect("live group");
        if p.bytes() != data.len() || (ch.root as u16) >= g.n || ch.tree as usize >= g.trees.len() {
            return Err(NackReason::CollMismatch);
        }
        if o.params.is_some_and(|q| q != p) {
            return Err(NackReason::CollMismatch);
        }
        let rel = rel_rank(g.rank, ch.root as u16, g.n);
        let sender_rel = rel_rank(ch.sender as u16, ch.root as u16, g.n);
        let posted = o.desc.is_some();
        match kind {
            CollKind::ReduceUp => {
                let children = g.children(ch.tree, rel);
                let Some(i) = children.iter().position(|&c| c == sender_rel) else {
                    return Err(NackReason::CollMismatch);
                };
                if o.partials.get(i).is_some_and(|x| x.is_some()) {
                    return Err(NackReason::CollMismatch);
                }
                if !posted {
                    if self.coll_pool_used >= self.cfg.coll_bufs {
                        return Err(NackReason::NoMatch);
                    }
                    self.coll_pool_used += 1;
                }
                let nchildren = children.len();
                let o = self.coll_ops.get_mut(op);
                o.params = Some(p);
                if o.partials.len() < nchildren {
                    o.partials.resize(nchildren, None);
                }
                o.partials[i] = Some(data.to_vec());
            }
            CollKind::AllreduceDown => {
                if !posted || !p.is_all() || g.parent(ch.tree, rel) != Some(sender_rel) || o.down.is_some() {
                    return Err(NackReason::CollMismatch);
                }
                let o = self.coll_ops.get_mut(op);
                o.params = Some(p);
                o.down = Some(data.to_vec());
            }
            _ => unreachable!("reduce kinds only"),
        }
        Ok(())
    }

    /// Drives an operation as far as its arrivals allow.
    pub(crate) fn coll_progress<H: Hal>(&mut self, hal: &mut H, now: u64, op: u32) {
        let Some(o) = self.coll_ops.get(op) else { return };
        // Early messages wait for the host's post, except a broadcast: its
        // NIC forwards without the host (application bypass).
        let bypass = matches!(o.params, Some(Params::Bcast { .. })) && o.data.is_some();
        if o.desc.is_none() && !bypass {
            return;
        }
        if o.error.is_none() {
            let r = match o.params.expect("set at post or arrival") {
                Params::Barrier { algo, tree } => self.progress_barrier(now, op, algo, tree),
                Params::Reduce { .. } => self.progress_reduce(hal, now, op),
                Params::Bcast { root, tree, .. } => self.progress_bcast(hal, now, op, root, tree),
                Params::Multi { mask, .. } => self.progress_multi(now, op, mask),
            };
            if let Err(e) = r {
                self.coll_ops.get_mut(op).error.get_or_insert(e);
            }
        }
        self.coll_try_complete(hal, op);
    }

    /// Sends the next steps of a barrier; `Ok` also when waiting.
    fn progress_barrier(&mut self, now: u64, op: u32, algo: BarrierAlgo, tree: u8) -> Result<(), Status> {
        let o = self.coll_ops.get(op).expect("live");
        let g = self.groups.get(o.group).expect("live group");
        let (n, rank) = (g.n, g.rank);
        if algo != BarrierAlgo::GatherRelease {
            let kind = if algo == BarrierAlgo::PairwiseExchange { CollKind::BarrierPe } else { CollKind::BarrierDiss };
            loop {
                let o = self.coll_ops.get(op).expect("live");
                match barrier_step(algo, n, rank, o.step as usize) {
                    None => {
                        self.coll_ops.get_mut(op).local_done = true;
                        return Ok(());
                    }
                    Some(Step::Send { to, round }) => {
                        let h = self.coll_header(op, kind, round, 0, tree);
                        if !self.coll_send(now, op, to, h, CollData::None)? {
                            return Ok(());
                        }
                    }
                    Some(Step::Recv { round, .. }) => {
                        if o.arrived & (1 << round_bit(round)) == 0 {
                            return Ok(());
                        }
                    }
                }
                self.coll_ops.get_mut(op).step += 1;
            }
        }
        // Gather up tree `tree` (rooted at rank 0), then release down it.
        let rel = rel_rank(rank, 0, n);
        let children = g.children(tree, rel);
        let parent = g.parent(tree, rel);
        if o.step == 0 {
            if !children.iter().all(|&c| o.arrived & (1 << c) != 0) {
                return Ok(());
            }
            if let Some(p) = parent {
                let h = self.coll_header(op, CollKind::BarrierGather, 0, 0, tree);
                if !self.coll_send(now, op, abs_rank(p, 0, n), h, CollData::None)? {
                    return Ok(());
                }
            }
            self.coll_ops.get_mut(op).step = 1;
        }
        let o = self.coll_ops.get(op).expect("live");
        if o.step == 1 {
            if parent.is_some() && !o.released {
                return Ok(());
            }
            self.coll_ops.get_mut(op).step = 2;
        }
        while (self.coll_ops.get(op).expect("live").sub as usize) < children.len() {
            let c = children[self.coll_ops.get(op).expect("live").sub as usize];
            let h = self.coll_header(op, CollKind::BarrierRelease, 0, 0, tree);
            if !self.coll_send(now, op, abs_rank(c, 0, n), h, CollData::None)? {
                return Ok(());
            }
            self.coll_ops.get_mut(op).sub += 1;
        }
        self.coll_ops.get_mut(op).local_done = true;
        Ok(())
    }

    /// Combines partials in the fixed order, sends up, delivers results.
    fn progress_reduce<H: Hal>(&mut self, hal: &mut H, now: u64, op: u32) -> Result<(), Status> {
        let o = self.coll_ops.get(op).expect("live");
        let Some(Params::Reduce { all, root, tree, dtype, op: rop, .. }) = o.params else { unreachable!() };
        let g = self.groups.get(o.group).expect("live group");
        let (n, rank) = (g.n, g.rank);
        let rel = rel_rank(rank, root, n);
        let children = g.children(tree, rel);
        let parent = g.parent(tree, rel);
        if !o.have_own {
            return Ok(());
        }
        // Step 0: combine, child by child, in ascending relative rank.
        if o.step == 0 {
            let o = self.coll_ops.get_mut(op);
            o.partials.resize(children.len(), None);
            while (o.combined as usize) < children.len() {
                let Some(x) = o.partials[o.combined as usize].take() else { return Ok(()) };
                let ok = crate::combine::combine(dtype, rop, &mut o.acc, &x);
                debug_assert!(ok, "lengths checked on arrival");
                o.combined += 1;
            }
            o.step = 1;
        }
        // Step 1: the subtree's result goes up (or is the result at the root).
        let o = self.coll_ops.get(op).expect("live");
        if o.step == 1 {
            match parent {
                Some(p) => {
                    let h = self.coll_header(op, CollKind::ReduceUp, all as u8, root as u8, tree);
                    let data = CollData::Nic(o.acc.clone());
                    if !self.coll_send(now, op, abs_rank(p, root, n), h, data)? {
                        return Ok(());
                    }
                    self.coll_ops.get_mut(op).step = if all { 2 } else { 4 };
                }
                None => {
                    let acc = core::mem::take(&mut self.coll_ops.get_mut(op).acc);
                    self.coll_ops.get_mut(op).down = Some(acc);
                    self.coll_ops.get_mut(op).step = 2;
                }
            }
        }
        // Step 2: the result is here (root, or from the parent): deliver it.
        let o = self.coll_ops.get(op).expect("live");
        if o.step == 2 {
            let Some(result) = o.down.as_ref() else { return Ok(()) };
            let (ld, _) = o.desc.expect("posted");
            let port = o.port;
            let result = result.clone();
            self.sge_io(hal, port, &ld.sges()[1..2], 0, Buf::ToHost(&result), MR_LOCAL_WRITE)?;
            self.coll_ops.get_mut(op).step = if all { 3 } else { 4 };
        }
        // Step 3 (allreduce): pass the result down.
        while self.coll_ops.get(op).expect("live").step == 3 {
            let o = self.coll_ops.get(op).expect("live");
            let Some(&c) = children.get(o.sub as usize) else {
                self.coll_ops.get_mut(op).step = 4;
                break;
            };
            let h = self.coll_header(op, CollKind::AllreduceDown, 1, root as u8, tree);
            let data = CollData::Nic(o.down.clone().expect("result"));
            if !self.coll_send(now, op, abs_rank(c, root, n), h, data)? {
                return Ok(());
            }
            self.coll_ops.get_mut(op).sub += 1;
        }
        if self.coll_ops.get(op).expect("live").step == 4 {
            self.coll_ops.get_mut(op).local_done = true;
        }
        Ok(())
    }

    /// Multisend (seed 000 §5): one descriptor, the members in the rank mask
    /// as destinations; each gets an ordinary tagged message (matched by its
    /// posted receives, with its own sequence, window and flow control),
    /// and each payload frame is read from host memory once for all.
    fn post_multisend<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, slot: u32, ld: LocalDesc) {
        let g = self.groups.get(slot).expect("checked by the caller");
        let mask = ld.wd.ignore;
        let bad_mask = (g.n < 64 && mask >> g.n != 0) || mask & (1 << g.rank) != 0;
        if bad_mask {
            return self.complete(hal, port, Completion::of(&ld, Opcode::MultiSend, Status::BadDescriptor));
        }
        if let Err(st) = self.check_sges(hal, port, ld.sges(), MR_LOCAL_READ) {
            return self.complete(hal, port, Completion::of(&ld, Opcode::MultiSend, st));
        }
        if ld.len > self.cfg.msg_max {
            return self.complete(hal, port, Completion::of(&ld, Opcode::MultiSend, Status::TooLarge));
        }
        let stamp = self.next_stamp();
        let op = self.coll_ops.insert_checked(CollOp::new(port, slot, u32::MAX, stamp));
        let o = self.coll_ops.get_mut(op);
        o.desc = Some((ld, Opcode::MultiSend));
        o.params = Some(Params::Multi { mask, len: ld.len });
        o.data = Some(ld);
        self.coll_progress(hal, now, op);
    }

    fn progress_multi(&mut self, now: u64, op: u32, mask: u64) -> Result<(), Status> {
        loop {
            let sub = self.coll_ops.get(op).expect("live").sub;
            // The sub-th destination, in ascending rank.
            let Some(to) = (0..64u16).filter(|&r| mask & (1 << r) != 0).nth(sub as usize) else { break };
            let Some(t) = self.coll_send_limited(now, op, to, None, CollData::Host { dest: sub }, u32::MAX)? else {
                return Ok(());
            };
            let o = self.coll_ops.get_mut(op);
            o.fwd.push(t);
            o.sub += 1;
        }
        self.coll_ops.get_mut(op).local_done = true;
        Ok(())
    }

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
        let hit = live.then(|| self.coll_ops.get(op).expect("live").frames.iter().position(|e| e.frame == f)).flatten();
        if let Some(i) = hit {
            let o = self.coll_ops.get_mut(op);
            let e = &mut o.frames[i];
            assert_eq!(e.data.len(), out.len(), "frame {f} cached with another length");
            out.copy_from_slice(&e.data);
            e.pending &= !(1u64 << dest);
            if e.pending == 0 {
                o.frames.swap_remove(i);
                self.coll_cache_used -= 1;
            }
            return Ok(());
        }
        self.sge_io(hal, port, desc.sges(), data_off, Buf::FromHost(out), MR_LOCAL_READ)?;
        if live {
            let pending = self.coll_cache_pending(op, f) & !(1u64 << dest);
            self.coll_cache_insert(op, f, pending, out);
        }
        Ok(())
    }

    /// Destinations of a broadcast (our children) or multisend.
    fn coll_dests(&self, o: &CollOp) -> u32 {
        match o.params {
            Some(Params::Multi { mask, .. }) => mask.count_ones(),
            Some(Params::Bcast { root, tree, .. }) => {
                let g = self.groups.get(o.group).expect("live group");
                g.child_count(tree, rel_rank(g.rank, root, g.n))
            }
            _ => 0,
        }
    }

    /// The op's destinations that have not sent frame `f` yet: their
    /// message is not queued yet, or has not reached `f` (finished ones
    /// need nothing).
    fn coll_cache_pending(&self, op: u32, f: u32) -> u64 {
        let o = self.coll_ops.get(op).expect("live");
        let dests = self.coll_dests(o);
        assert!(dests <= 64 && o.fwd.len() as u32 <= dests);
        let mut pending = 0u64;
        for d in 0..dests {
            let needs = match o.fwd.get(d as usize) {
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

    /// Keeps frame `f`'s data for the destinations in `pending`. At the
    /// bound (per op `window_frames`, per NIC `coll_cache_frames`) the op's
    /// oldest frame goes: it waits only for destinations far behind, which
    /// then read the host.
    fn coll_cache_insert(&mut self, op: u32, f: u32, pending: u64, data: &[u8]) {
        let per_op = self.cfg.window_frames.min(self.cfg.coll_cache_frames) as usize;
        let o = self.coll_ops.get(op).expect("live");
        if pending == 0 || data.is_empty() || per_op == 0 || o.frames.iter().any(|e| e.frame == f) {
            return;
        }
        let full = o.frames.len() >= per_op || self.coll_cache_used >= self.cfg.coll_cache_frames;
        if full {
            let Some(oldest) = o.frames.iter().enumerate().min_by_key(|(_, e)| e.frame).map(|(i, _)| i) else {
                return; // Other ops hold the whole cache.
            };
            self.coll_ops.get_mut(op).frames.swap_remove(oldest);
            self.coll_cache_used -= 1;
        }
        self.coll_ops.get_mut(op).frames.push(CachedFrame { frame: f, pending, data: data.to_vec() });
        self.coll_cache_used += 1;
        assert!(self.coll_cache_used <= self.cfg.coll_cache_frames);
    }

    /// Destination `dest`'s message finished (sent, or failed): it needs
    /// no cached frame any more.
    fn coll_cache_release(&mut self, op: u32, stamp: u32, dest: u32) {
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return;
        }
        let o = self.coll_ops.get_mut(op);
        let before = o.frames.len();
        for e in o.frames.iter_mut() {
            e.pending &= !(1u64 << dest);
        }
        o.frames.retain(|e| e.pending != 0);
        self.coll_cache_used -= (before - o.frames.len()) as u32;
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

    /// Retires an op record, with its cached frames.
    fn coll_op_remove(&mut self, op: u32) -> CollOp {
        let o = self.coll_ops.remove(op);
        self.coll_cache_used -= o.frames.len() as u32;
        o
    }

    /// Frame 0 of a broadcast from our parent: receive it into the posted
    /// buffer, or (application bypass) into a bounce slot, and start
    /// forwarding to our children while the rest arrives.
    fn accept_bcast<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        op: u32,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        ch: &CollHeader,
    ) -> Result<u32, NackReason> {
        let len = msg.total_len - CollHeader::SIZE as u64;
        let p = Params::Bcast { root: ch.root as u16, tree: ch.tree, len };
        let o = self.coll_ops.get(op).expect("live");
        let g = self.groups.get(o.group).expect("live group");
        if ch.root as u16 >= g.n || ch.tree as usize >= g.trees.len() || o.params.is_some_and(|q| q != p) {
            return Err(NackReason::CollMismatch);
        }
        let rel = rel_rank(g.rank, ch.root as u16, g.n);
        if rel == 0
            || g.parent(ch.tree, rel) != Some(rel_rank(ch.sender as u16, ch.root as u16, g.n))
            || o.data.is_some() && o.desc.is_none()
        {
            return Err(NackReason::CollMismatch);
        }
        if self.rx.is_full() || wire::frames_for(msg.total_len, self.mtu) != hdr.frame_count as u64 {
            return Err(NackReason::NoMatch);
        }
        let (stamp, group, posted) =
            (o.stamp, o.group, o.desc.map(|_| o.data.expect("posted broadcast has its buffer")));
        let data = match posted {
            Some(d) => d,
            None => {
                // Not posted: a bounce slot, if the message fits one.
                if len > g.bounce_slot_size as u64 || g.bounce_free.is_empty() {
                    return Err(NackReason::NoMatch);
                }
                let (key, base, size) = (g.bounce_key, g.bounce_offset, g.bounce_slot_size as u64);
                let b = self.groups.slots[group as usize].as_mut().expect("live").bounce_free.pop().expect("checked");
                let mut wd = WorkDesc { opcode: Opcode::Recv as u8, num_sge: 1, ..Default::default() };
                wd.sge[0] = emp_uapi::desc::Sge { key, len: len as u32, offset: base + b as u64 * size };
                self.coll_ops.get_mut(op).bounce = Some(b);
                LocalDesc::new(&wd)
            }
        };
        let port = hdr.dst_port;
        let peer = self.find_peer(port, hdr.src_node, hdr.src_port).expect("frame's peer exists");
        let owner = crate::rx::RxOwner::Bcast { op, stamp };
        let r = self.rx_open(now, peer, hdr, msg, data, owner).expect("checked not full");
        let o = self.coll_ops.get_mut(op);
        o.params = Some(p);
        o.data = Some(data);
        o.rx = Some(r);
        // Children are fed from where the data lands, frame by frame.
        self.coll_progress(hal, now, op);
        Ok(r)
    }

    /// Frames `0..contig` of a broadcast are in host memory: forwarding may
    /// send them.
    pub(crate) fn bcast_frames_here(&mut self, op: u32, stamp: u32, contig: u32) {
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return;
        }
        // Only this op's own forwarding records (a finished one's slot may
        // hold another message by now).
        for t in self.coll_ops.get(op).expect("live").fwd.clone() {
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
        let o = self.coll_ops.get_mut(op);
        o.rx_done = true;
        o.rx = None;
        if let Some(e) = error {
            o.error.get_or_insert(e);
        }
        self.coll_progress(hal, now, op);
    }

    /// Root: send to each child. Others: once the data is located, forward
    /// to each child (limited to the frames present); when posted after a
    /// bounce, copy to the user's buffer once everything arrived.
    fn progress_bcast<H: Hal>(&mut self, hal: &mut H, now: u64, op: u32, root: u16, tree: u8) -> Result<(), Status> {
        let o = self.coll_ops.get(op).expect("live");
        let g = self.groups.get(o.group).expect("live group");
        let n = g.n;
        let rel = rel_rank(g.rank, root, n);
        let children = g.children(tree, rel);
        if o.data.is_none() {
            return Ok(()); // Not arrived yet.
        }
        let contig = if rel == 0 {
            u32::MAX
        } else {
            // Frames already here (the receive record, or all of them).
            o.rx.and_then(|r| self.rx.get(r)).map_or(if o.rx_done { u32::MAX } else { 0 }, |m| m.contig)
        };
        while (self.coll_ops.get(op).expect("live").sub as usize) < children.len() {
            let sub = self.coll_ops.get(op).expect("live").sub;
            let c = children[sub as usize];
            let h = self.coll_header(op, CollKind::Bcast, 0, root as u8, tree);
            let data = CollData::Host { dest: sub };
            let Some(t) = self.coll_send_limited(now, op, abs_rank(c, root, n), Some(h), data, contig)? else {
                return Ok(());
            };
            let o = self.coll_ops.get_mut(op);
            o.fwd.push(t);
            o.sub += 1;
        }
        let o = self.coll_ops.get(op).expect("live");
        if rel != 0 && (!o.rx_done || o.desc.is_none()) {
            return Ok(());
        }
        if let (Some(_), false) = (o.bounce, o.local_done) {
            // Posted after the data arrived in a bounce slot: copy it over.
            let (ld, _) = o.desc.expect("posted");
            let from = o.data.expect("bounce located");
            let mut tmp = vec![0u8; from.len as usize];
            let port = o.port;
            self.sge_io(hal, port, from.sges(), 0, Buf::FromHost(&mut tmp), MR_LOCAL_READ)?;
            self.sge_io(hal, port, ld.sges(), 0, Buf::ToHost(&tmp), MR_LOCAL_WRITE)?;
        }
        self.coll_ops.get_mut(op).local_done = true;
        Ok(())
    }

    fn coll_header(&self, op: u32, kind: CollKind, round: u8, root: u8, tree: u8) -> CollHeader {
        let o = self.coll_ops.get(op).expect("live");
        let g = self.groups.get(o.group).expect("live group");
        let (dtype, rop, count) = match o.params {
            Some(Params::Reduce { dtype, op, count, .. }) => (dtype as u8, op as u8, count),
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
        let (port, stamp, src) = (o.port, o.stamp, o.data);
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
            o.failed += 1;
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
        let barrier = matches!(o.params, Some(Params::Barrier { .. }));
        let sends_done = o.pending_tx == 0 || (barrier && o.local_done && !failed);
        if o.desc.is_none() || !sends_done || !(o.local_done || failed) {
            return;
        }
        let o = self.coll_op_remove(op);
        if let Some(b) = o.bounce {
            if let Some(g) = self.groups.slots[o.group as usize].as_mut() {
                g.bounce_free.push(b);
            }
        }
        let (ld, opcode) = o.desc.expect("posted");
        let status = o.error.unwrap_or(Status::Success);
        let mut c = Completion::of(&ld, opcode, status);
        c.byte_len = o.params.map_or(0, |p| p.bytes() as u32);
        if let Some(Params::Multi { mask, .. }) = o.params {
            // Destinations that failed or were never sent to (after a failure).
            c.msg_len = o.failed + (mask.count_ones() - o.sub);
        }
        self.count(counter::COLL_OPS, 1);
        self.complete(hal, o.port, c);
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
                let held = o.partials.iter().filter(|p| p.is_some()).count() as u32;
                self.coll_pool_used -= held.min(self.coll_pool_used);
                if let (Some(b), Some(g)) = (o.bounce, self.groups.slots[o.group as usize].as_mut()) {
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
        let per_op = self.cfg.window_frames.min(self.cfg.coll_cache_frames) as usize;
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
            cached += o.frames.len() as u32;
            if o.frames.len() > per_op {
                return Err(format!("coll op {s} caches {} frames, bound {per_op}", o.frames.len()));
            }
            let dests = self.coll_dests(o);
            let all = if dests >= 64 { u64::MAX } else { (1u64 << dests) - 1 };
            for (i, e) in o.frames.iter().enumerate() {
                if e.pending == 0 || e.pending & !all != 0 || e.data.is_empty() || e.data.len() > self.mtu as usize {
                    return Err(format!(
                        "coll op {s}: cached frame {} pending {:#x} of {dests}, {} B",
                        e.frame,
                        e.pending,
                        e.data.len()
                    ));
                }
                if o.frames[..i].iter().any(|x| x.frame == e.frame) {
                    return Err(format!("coll op {s}: frame {} cached twice", e.frame));
                }
            }
            if o.desc.is_none() {
                early += o.partials.iter().filter(|p| p.is_some()).count() as u32;
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

impl Params {
    fn is_all(&self) -> bool {
        matches!(self, Params::Reduce { all: true, .. })
    }
}

impl CollOp {
    fn new(port: u16, group: u32, instance: u32, stamp: u32) -> CollOp {
        CollOp {
            port,
            group,
            instance,
            stamp,
            desc: None,
            params: None,
            arrived: 0,
            released: false,
            step: 0,
            sub: 0,
            acc: Vec::new(),
            have_own: false,
            partials: Vec::new(),
            combined: 0,
            down: None,
            pending_tx: 0,
            error: None,
            local_done: false,
            stalled: false,
            rx_done: false,
            bounce: None,
            data: None,
            rx: None,
            fwd: Vec::new(),
            frames: Vec::new(),
            failed: 0,
        }
    }
}
