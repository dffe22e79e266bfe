//! Reduce and allreduce (seed 001 ch. 4): partials combine up a tree in a
//! fixed order, so every member gets the same result bit for bit; a pure
//! state machine that `Nic` performs.

use emp_uapi::coll::{abs_rank, rel_rank, CollHeader, CollKind, Dtype, ReduceOp};
use emp_uapi::desc::{Status, MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_uapi::wire::NackReason;

use super::{CollData, CollState};
use crate::group::GroupState;
use crate::mr::Buf;
use crate::{Hal, LocalDesc, Nic};

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
        Some(ReduceParams { all: ch.round == 1, root: ch.root, tree: ch.tree, dtype, op, count: ch.count })
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
        let sender_rel = rel_rank(ch.sender, p.root, g.n);
        match CollKind::from_u8(ch.kind) {
            Some(CollKind::ReduceUp) => {
                let children = g.child_ranks(p.tree, rel);
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
        let children = g.child_ranks(tree, rel);
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

    /// Appends the reduction's state to a context image (`ctxsw.rs`); its
    /// parameters travel in the op record's header.
    pub(crate) fn save(&self, out: &mut Vec<u8>) {
        let phase = match self.phase {
            Phase::Combine => 0u8,
            Phase::Up => 1,
            Phase::Deliver => 2,
            Phase::Down => 3,
            Phase::Done => 4,
        };
        let p = &self.params;
        out.extend_from_slice(&[p.all as u8, p.tree, p.dtype as u8, p.op as u8, phase, 0]);
        out.extend_from_slice(&p.root.to_le_bytes());
        for v in [p.count, self.combined, self.sub, self.partials.len() as u32] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let mut put = |b: &Option<Vec<u8>>| match b {
            Some(v) => {
                out.push(1);
                out.extend_from_slice(v);
            }
            None => out.push(0),
        };
        put(&self.acc);
        put(&self.down);
        for x in &self.partials {
            put(x);
        }
    }

    /// A reduction's state from an untrusted image, checked against its
    /// group `g` and the NIC's buffer size `buf_max`: whatever it holds,
    /// [`Reduce::next`] cannot fail on it. `posted`: the host posted it.
    pub(crate) fn load(
        r: &mut crate::image::Reader,
        g: &GroupState,
        buf_max: usize,
        posted: bool,
    ) -> Result<Reduce, &'static str> {
        let (all, tree, dtype, op, phase, pad) = (r.u8()?, r.u8()?, r.u8()?, r.u8()?, r.u8()?, r.u8()?);
        let root = r.u16()?;
        let (count, combined, sub, n_partials) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let (dtype, op) = (Dtype::from_u8(dtype).ok_or("reduce type")?, ReduceOp::from_u8(op).ok_or("reduce op")?);
        let params = ReduceParams { all: all == 1, root, tree, dtype, op, count };
        if all > 1 || pad != 0 || root >= g.n || tree as usize >= g.trees.len() || !op.defined_for(dtype) {
            return Err("reduce parameters");
        }
        if count == 0 || params.bytes() > buf_max {
            return Err("reduce size");
        }
        let phase = match phase {
            0 => Phase::Combine,
            1 => Phase::Up,
            2 => Phase::Deliver,
            3 => Phase::Down,
            4 => Phase::Done,
            _ => return Err("reduce phase"),
        };
        let children = g.child_count(tree, rel_rank(g.rank, root, g.n));
        if combined > children || sub > children || n_partials > children {
            return Err("reduce state");
        }
        let bytes = params.bytes();
        let mut get = || -> Result<Option<Vec<u8>>, &'static str> {
            match r.u8()? {
                0 => Ok(None),
                1 => Ok(Some(r.take(bytes)?.to_vec())),
                _ => Err("reduce buffer flag"),
            }
        };
        let (acc, down) = (get()?, get()?);
        let partials = (0..n_partials).map(|_| get()).collect::<Result<Vec<_>, _>>()?;
        // What `next` takes for granted in each phase.
        let consistent = match phase {
            Phase::Combine => (acc.is_some() || !posted) && (posted || down.is_none()),
            Phase::Up => acc.is_some(),
            Phase::Down => down.is_some() && params.all,
            Phase::Deliver | Phase::Done => true,
        };
        let combined_gone = partials.iter().take(combined as usize).all(Option::is_none);
        if !consistent || !combined_gone || (!posted && phase != Phase::Combine) {
            return Err("reduce state");
        }
        Ok(Reduce { params, acc, partials, combined, down, phase, sub })
    }
}

impl Nic {
    /// Combines partials in the fixed order, sends up, delivers results.
    pub(super) fn progress_reduce<H: Hal>(&mut self, hal: &mut H, now: u64, op: u32) -> Result<(), Status> {
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
                    let h = self.coll_header(op, kind, round, root, tree);
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
    pub(super) fn reduce_load_input<H: Hal>(
        &mut self,
        hal: &mut H,
        port: u16,
        op: u32,
        ld: &LocalDesc,
        p: ReduceParams,
    ) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::{test_group, test_header};
    use emp_uapi::coll::TREE_ROOT;

    const STAR: [u8; 3] = [TREE_ROOT, 0, 0];
    const SUM: ReduceParams =
        ReduceParams { all: true, root: 0, tree: 0, dtype: Dtype::U32, op: ReduceOp::Sum, count: 1 };

    fn msg(kind: CollKind, sender: u16) -> CollHeader {
        let mut h = test_header(kind, sender, 1);
        (h.dtype, h.op, h.count) = (Dtype::U32 as u8, ReduceOp::Sum as u8, 1);
        h
    }

    fn word(v: u32) -> Vec<u8> {
        v.to_le_bytes().to_vec()
    }

    #[test]
    fn root_combines_children_in_order_then_passes_the_result_down() {
        let g = test_group(0, &STAR);
        let mut r = Reduce::new(SUM);
        // Child 2's partial arrives before the post, child 1's after it.
        r.accept(&msg(CollKind::ReduceUp, 2), &word(20), &g, Arrival::Early { pool_room: true }).unwrap();
        assert_eq!(r.partials_held(), 1);
        assert_eq!(r.next(&g), ReduceNext::Wait);
        r.own(word(1));
        assert_eq!(r.next(&g), ReduceNext::Wait, "child 1 combines first");
        let again = r.accept(&msg(CollKind::ReduceUp, 2), &word(20), &g, Arrival::Posted);
        assert_eq!(again, Err(NackReason::CollMismatch));
        r.accept(&msg(CollKind::ReduceUp, 1), &word(10), &g, Arrival::Posted).unwrap();
        assert_eq!(r.next(&g), ReduceNext::Deliver(word(31)));
        r.delivered();
        for to in [1, 2] {
            assert_eq!(r.next(&g), ReduceNext::Send { to, kind: CollKind::AllreduceDown, round: 1, data: word(31) });
            r.sent();
        }
        assert_eq!(r.next(&g), ReduceNext::Done);
    }

    #[test]
    fn leaf_sends_up_then_delivers_what_its_parent_sends_down() {
        let g = test_group(1, &STAR);
        let mut r = Reduce::new(SUM);
        let down = msg(CollKind::AllreduceDown, 0);
        assert_eq!(r.accept(&down, &word(31), &g, Arrival::Early { pool_room: true }), Err(NackReason::CollMismatch));
        r.own(word(10));
        assert_eq!(r.next(&g), ReduceNext::Send { to: 0, kind: CollKind::ReduceUp, round: 1, data: word(10) });
        r.sent();
        assert_eq!(r.next(&g), ReduceNext::Wait);
        assert_eq!(
            r.accept(&msg(CollKind::AllreduceDown, 2), &word(31), &g, Arrival::Posted),
            Err(NackReason::CollMismatch)
        );
        r.accept(&down, &word(31), &g, Arrival::Posted).unwrap();
        assert_eq!(r.next(&g), ReduceNext::Deliver(word(31)));
        r.delivered();
        assert_eq!(r.next(&g), ReduceNext::Done);
    }

    #[test]
    fn early_partial_without_a_pool_buffer_is_refused_and_mismatches_are_named() {
        let g = test_group(0, &STAR);
        let mut r = Reduce::new(SUM);
        let up = msg(CollKind::ReduceUp, 1);
        assert_eq!(r.accept(&up, &word(1), &g, Arrival::Early { pool_room: false }), Err(NackReason::NoMatch));
        assert_eq!(r.accept(&up, &[0; 8], &g, Arrival::Posted), Err(NackReason::CollMismatch), "length");
        let mut other = up;
        other.op = ReduceOp::Max as u8;
        assert_eq!(r.accept(&other, &word(1), &g, Arrival::Posted), Err(NackReason::CollMismatch), "operation");
        assert_eq!(r.partials_held(), 0);
    }
}
