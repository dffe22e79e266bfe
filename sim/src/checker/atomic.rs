//! Remote atomics: each fetch-add runs exactly once, and the result word
//! a completion reports is the one the NIC wrote.

use emp_uapi::desc::{Cqe, Opcode, Status};

use crate::plan::{Expect, Plan, ATOMIC_BIT};

/// What every atomic completed with: (status, old value).
pub(crate) struct Atomics {
    done: Vec<Option<(Status, u64)>>,
}

impl Atomics {
    pub(crate) fn new(plan: &Plan) -> Atomics {
        Atomics { done: vec![None; plan.atomics.len()] }
    }

    /// Atomic `c.wr_id` completed at `(n, p)`: with the planned status,
    /// once, and on success with the old value also in its result word
    /// (`read(offset, buf)` reads the endpoint's data region).
    pub(crate) fn on_completion(
        &mut self,
        plan: &Plan,
        (n, p): (u16, u16),
        status: Status,
        c: &Cqe,
        read: impl FnOnce(u64, &mut [u8]),
    ) -> Result<(), String> {
        let i = (c.wr_id & !ATOMIC_BIT) as usize;
        let a = plan.atomics.get(i).ok_or_else(|| format!("unknown atomic wr_id {i}"))?;
        if a.src != (n, p) || c.opcode != Opcode::AtomicFetchAdd as u8 {
            return Err(format!("atomic {i} completed on ({n},{p}) opcode {}", c.opcode));
        }
        let want = match a.expect {
            Expect::Deliver => Status::Success,
            Expect::Fail(s) => s,
            Expect::DeliverOrFail(s) if status == s => s,
            Expect::DeliverOrFail(_) => Status::Success,
        };
        if status != want {
            return Err(format!("atomic {i} {:?}->{:?}: {status:?}, expected {want:?}", a.src, a.dst));
        }
        if status == Status::Success {
            let mut b = [0u8; 8];
            read(a.result_off, &mut b);
            if u64::from_le_bytes(b) != c.tag {
                return Err(format!("atomic {i}: result word {} but CQE old value {}", u64::from_le_bytes(b), c.tag));
            }
        }
        if self.done[i].replace((status, c.tag)).is_some() {
            return Err(format!("atomic {i} completed twice"));
        }
        Ok(())
    }

    /// Every fetch-add ran exactly once: the olds are `0..k` and the
    /// counter word (`counter()` reads it) is `k`. Returns `k`.
    pub(crate) fn check_counter(&self, plan: &Plan, counter: impl FnOnce() -> u64) -> Result<u64, String> {
        if plan.atomics.is_empty() {
            return Ok(0);
        }
        let mut olds: Vec<u64> = plan
            .atomics
            .iter()
            .zip(&self.done)
            .filter(|(a, _)| a.expect == Expect::Deliver)
            .map(|(_, d)| d.map(|(_, old)| old))
            .collect::<Option<_>>()
            .ok_or("an atomic never completed")?;
        olds.sort_unstable();
        let k = olds.len() as u64;
        if let Some(i) = olds.iter().enumerate().position(|(i, &o)| o != i as u64) {
            return Err(format!("atomic olds are not a permutation of 0..{k}: position {i} holds {}", olds[i]));
        }
        let word = counter();
        if word != k {
            return Err(format!("counter ends at {word} after {k} fetch-adds"));
        }
        Ok(k)
    }

    /// Atomics the plan expects to fail (they count as expected errors).
    pub(crate) fn expected_errors(plan: &Plan) -> u64 {
        plan.atomics.iter().filter(|a| a.expect != Expect::Deliver).count() as u64
    }
}
