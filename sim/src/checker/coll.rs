//! Collectives: a member's operation completes once, successfully, only
//! after every member it depends on has posted, with the right result; an
//! allreduce leaves the same bits on every member.

use emp_uapi::desc::{Cqe, Opcode, Status};

use crate::collplan::CollPlan;
use crate::plan::COLL_BIT;

/// `[op][rank]` posted and completed, and each allreduce's first result.
pub(crate) struct Collectives {
    posted: Vec<Vec<bool>>,
    done: Vec<Vec<bool>>,
    /// Per allreduce: the first member's result bits (all must match).
    bits: Vec<Option<Vec<u8>>>,
}

impl Collectives {
    pub(crate) fn new(plan: Option<&CollPlan>) -> Collectives {
        let table = |c: &CollPlan| vec![vec![false; c.members.len()]; c.ops.len()];
        Collectives {
            posted: plan.map_or(Vec::new(), table),
            done: plan.map_or(Vec::new(), table),
            bits: plan.map_or(Vec::new(), |c| vec![None; c.ops.len()]),
        }
    }

    /// Member `rank` put operation `k` in its ring.
    pub(crate) fn on_post(&mut self, k: usize, rank: usize) {
        self.posted[k][rank] = true;
    }

    /// Collective `c.wr_id` (`COLL_BIT | op << 8 | rank`) completed at
    /// `(n, p)` (`read(offset, buf)` reads the endpoint's data region).
    pub(crate) fn on_completion(
        &mut self,
        plan: Option<&CollPlan>,
        (n, p): (u16, u16),
        status: Status,
        c: &Cqe,
        read: impl FnOnce(u64, &mut [u8]),
    ) -> Result<(), String> {
        let coll = plan.ok_or("collective completion without a plan")?;
        let (k, rank) = (((c.wr_id & !COLL_BIT) >> 8) as usize, (c.wr_id & 0xFF) as usize);
        let op = *coll.ops.get(k).ok_or_else(|| format!("unknown collective {k}"))?;
        if coll.members.get(rank) != Some(&(n, p)) || c.opcode != op.opcode() as u8 {
            return Err(format!("collective {k} rank {rank} completed on ({n},{p}) opcode {}", c.opcode));
        }
        if std::mem::replace(&mut self.done[k][rank], true) {
            return Err(format!("collective {k} ({op:?}) completed twice at rank {rank}"));
        }
        if status != Status::Success {
            return Err(format!("collective {k} ({op:?}) rank {rank}: {status:?}"));
        }
        if let Some(other) = (0..coll.members.len()).find(|&o| coll.needs_post_of(k, rank, o) && !self.posted[k][o]) {
            return Err(format!("collective {k} ({op:?}) completed at rank {rank} before rank {other} posted it"));
        }
        let (off, len) = coll.result_at(k, rank);
        let mut got = vec![0u8; len as usize];
        read(off, &mut got);
        coll.check_result(k, rank, &got)?;
        if op.opcode() == Opcode::Allreduce {
            match &self.bits[k] {
                Some(first) if *first != got => {
                    return Err(format!("allreduce {k}: rank {rank} holds other bits than the first member"))
                }
                Some(_) => {}
                None => self.bits[k] = Some(got),
            }
        }
        Ok(())
    }

    /// Member operations completed so far.
    pub(crate) fn completed(&self) -> u64 {
        self.done.iter().flatten().filter(|&&d| d).count() as u64
    }
}
