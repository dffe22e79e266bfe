//! Barriers (seed 001 §3.5): pairwise exchange, dissemination and
//! gather-release, as a pure state machine that `Nic` performs.

use emp_uapi::coll::{abs_rank, barrier_step, rel_rank, BarrierAlgo, CollHeader, CollKind, Step, PE_PRE, PE_RELEASE};
use emp_uapi::desc::Status;
use emp_uapi::wire::NackReason;

use super::{CollData, CollState, Params};
use crate::group::GroupState;
use crate::Nic;

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
    /// release).
    arrived: u64,
    /// Gather-release: bit r = relative rank r's subtree has arrived (a
    /// group has up to 1024 members; sized on the first arrival).
    gathered: Vec<u64>,
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
        Barrier { algo, tree, arrived: 0, gathered: Vec::new(), released: false, step: 0, sub: 0 }
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
        if kind == CollKind::BarrierGather {
            let r = rel_rank(ch.sender, 0, n) as usize;
            if r >= n as usize || self.has_gathered(r as u16) {
                return Err(NackReason::CollMismatch);
            }
            self.gathered.resize((n as usize).div_ceil(64), 0);
            self.gathered[r / 64] |= 1 << (r % 64);
            return Ok(());
        }
        let bit = round_bit(ch.round);
        if bit >= 64 || self.arrived & (1 << bit) != 0 {
            return Err(NackReason::CollMismatch);
        }
        self.arrived |= 1 << bit;
        Ok(())
    }

    /// Has relative rank `rel`'s gather arrived?
    fn has_gathered(&self, rel: u16) -> bool {
        let r = rel as usize;
        self.gathered.get(r / 64).is_some_and(|w| w & (1 << (r % 64)) != 0)
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
        let children = g.child_ranks(self.tree, rel);
        let parent = g.parent(self.tree, rel);
        if self.step == 0 {
            if !children.iter().all(|&c| self.has_gathered(c)) {
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

    /// Appends the barrier's state to a context image (`ctxsw.rs`).
    pub(crate) fn save(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[self.algo as u8, self.tree, self.released as u8, 0]);
        out.extend_from_slice(&self.step.to_le_bytes());
        out.extend_from_slice(&self.sub.to_le_bytes());
        out.extend_from_slice(&self.arrived.to_le_bytes());
        out.extend_from_slice(&(self.gathered.len() as u32).to_le_bytes());
        for w in &self.gathered {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    /// A barrier's state from an untrusted image, checked against its
    /// group `g`: whatever it holds, [`Barrier::next`] cannot fail on it.
    pub(crate) fn load(r: &mut crate::image::Reader, g: &GroupState) -> Result<Barrier, &'static str> {
        let (algo, tree, released, pad) = (r.u8()?, r.u8()?, r.u8()?, r.u8()?);
        let algo = BarrierAlgo::from_u16(algo as u16).ok_or("barrier algorithm")?;
        let (step, sub, arrived, words) = (r.u32()?, r.u32()?, r.u64()?, r.u32()? as usize);
        if pad != 0 || released > 1 || (tree as usize >= g.trees.len() && algo == BarrierAlgo::GatherRelease) {
            return Err("barrier state");
        }
        // Gather-release has steps 0..=2 and a release per child; the
        // others' schedules are at most 2 log2(n) + 2 steps.
        let (step_max, sub_max) = match algo {
            BarrierAlgo::GatherRelease => (2, g.child_count(tree, rel_rank(g.rank, 0, g.n))),
            _ => (2 * 16 + 2, 0),
        };
        if step > step_max || sub > sub_max || words > (g.n as usize).div_ceil(64) {
            return Err("barrier state");
        }
        let gathered = (0..words).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
        let bits_past_n = gathered.iter().enumerate().any(|(i, &w)| {
            let first = i * 64;
            (0..64).any(|b| w & (1 << b) != 0 && first + b >= g.n as usize)
        });
        if bits_past_n {
            return Err("barrier state: arrivals beyond the group");
        }
        Ok(Barrier { algo, tree, arrived, gathered, released: released == 1, step, sub })
    }
}

impl Nic {
    /// Sends the next steps of a barrier; `Ok` also when waiting.
    pub(super) fn progress_barrier(&mut self, now: u64, op: u32) -> Result<(), Status> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::{test_group, test_header};
    use emp_uapi::coll::TREE_ROOT;

    const STAR: [u8; 3] = [TREE_ROOT, 0, 0];

    #[test]
    fn gather_release_root_waits_for_every_child_then_releases_each() {
        let g = test_group(0, &STAR);
        let mut b = Barrier::new(BarrierAlgo::GatherRelease, 0);
        assert_eq!(b.next(&g), BarrierNext::Wait);
        b.accept(CollKind::BarrierGather, &test_header(CollKind::BarrierGather, 2, 0), g.n).unwrap();
        assert_eq!(b.next(&g), BarrierNext::Wait);
        let again = b.accept(CollKind::BarrierGather, &test_header(CollKind::BarrierGather, 2, 0), g.n);
        assert_eq!(again, Err(NackReason::CollMismatch));
        b.accept(CollKind::BarrierGather, &test_header(CollKind::BarrierGather, 1, 0), g.n).unwrap();
        for to in [1, 2] {
            assert_eq!(b.next(&g), BarrierNext::Send { to, kind: CollKind::BarrierRelease, round: 0 });
            // Not queued (no transmission record): asked again.
            assert_eq!(b.next(&g), BarrierNext::Send { to, kind: CollKind::BarrierRelease, round: 0 });
            b.sent();
        }
        assert_eq!(b.next(&g), BarrierNext::Done);
    }

    #[test]
    fn gather_release_leaf_reports_then_waits_for_its_release() {
        let g = test_group(1, &STAR);
        let mut b = Barrier::new(BarrierAlgo::GatherRelease, 0);
        assert_eq!(b.next(&g), BarrierNext::Send { to: 0, kind: CollKind::BarrierGather, round: 0 });
        b.sent();
        assert_eq!(b.next(&g), BarrierNext::Wait);
        let release = test_header(CollKind::BarrierRelease, 0, 0);
        b.accept(CollKind::BarrierRelease, &release, g.n).unwrap();
        assert_eq!(b.accept(CollKind::BarrierRelease, &release, g.n), Err(NackReason::CollMismatch));
        assert_eq!(b.next(&g), BarrierNext::Done);
    }

    #[test]
    fn dissemination_sends_each_round_and_waits_for_its_arrival() {
        let g = test_group(0, &[TREE_ROOT, 0]);
        let mut b = Barrier::new(BarrierAlgo::Dissemination, 0);
        // An early arrival counts once its round comes.
        b.accept(CollKind::BarrierDiss, &test_header(CollKind::BarrierDiss, 1, 0), g.n).unwrap();
        assert_eq!(b.next(&g), BarrierNext::Send { to: 1, kind: CollKind::BarrierDiss, round: 0 });
        b.sent();
        assert_eq!(b.next(&g), BarrierNext::Done);
        let other = test_header(CollKind::BarrierPe, 1, 0);
        assert_eq!(b.accept(CollKind::BarrierPe, &other, g.n), Err(NackReason::CollMismatch));
    }
}
