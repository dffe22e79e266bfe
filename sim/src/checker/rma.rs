//! Remote writes and reads: each completes once, with the status the plan
//! expects; a read delivers exactly the target's bytes; a write with
//! immediate data completes exactly one receive at the target; and at
//! quiesce every target window holds what the successful writes put
//! there and nothing the refused ones carried.

use emp_uapi::desc::{Cqe, Opcode, Status};

use crate::plan::{Expect, Plan, RmaKind, RMA_BIT, RMA_RECV_BIT};

/// What every RMA operation (and its immediate receive) completed with.
pub(crate) struct Rma {
    done: Vec<Option<Status>>,
    imm_done: Vec<bool>,
}

/// Byte `off` of every RMA window before any write (the driver fills the
/// windows with it at setup).
pub(crate) fn initial_byte(off: u64) -> u8 {
    (off.wrapping_mul(7) % 253) as u8
}

/// The bytes RMA write `i` carries.
pub(crate) fn write_byte(i: usize, at: u64) -> u8 {
    ((i as u64 * 131 + at * 3) % 251) as u8 ^ 0x80
}

fn want(expect: Expect, status: Status) -> Status {
    match expect {
        Expect::Deliver => Status::Success,
        Expect::Fail(s) => s,
        Expect::DeliverOrFail(s) if status == s => s,
        Expect::DeliverOrFail(_) => Status::Success,
    }
}

impl Rma {
    pub(crate) fn new(plan: &Plan) -> Rma {
        Rma { done: vec![None; plan.rma.len()], imm_done: vec![false; plan.rma.len()] }
    }

    /// RMA operation `c.wr_id` completed at `(n, p)` (`read(offset, buf)`
    /// reads that endpoint's data region).
    pub(crate) fn on_completion(
        &mut self,
        plan: &Plan,
        (n, p): (u16, u16),
        status: Status,
        c: &Cqe,
        read: impl FnOnce(u64, &mut [u8]),
    ) -> Result<(), String> {
        let i = (c.wr_id & !RMA_BIT) as usize;
        let op = plan.rma.get(i).ok_or_else(|| format!("unknown RMA wr_id {i}"))?;
        let opcode = match op.kind {
            RmaKind::Read => Opcode::RdmaRead,
            _ => Opcode::RdmaWrite,
        };
        if op.src != (n, p) || c.opcode != opcode as u8 {
            return Err(format!("RMA {i} completed on ({n},{p}) opcode {}", c.opcode));
        }
        let want = want(op.expect, status);
        if status != want {
            return Err(format!("RMA {i} {:?} {:?}->{:?}: {status:?}, expected {want:?}", op.kind, op.src, op.dst));
        }
        if status == Status::Success && op.kind == RmaKind::Read {
            if c.byte_len as u64 != op.len {
                return Err(format!("RMA read {i}: byte_len {} of {}", c.byte_len, op.len));
            }
            let mut got = vec![0u8; op.len as usize];
            read(op.local_off, &mut got);
            if let Some(k) = (0..op.len).find(|&k| got[k as usize] != initial_byte(op.remote_off + k)) {
                return Err(format!("RMA read {i}: byte {k} is {} not the target's", got[k as usize]));
            }
        }
        if self.done[i].replace(status).is_some() {
            return Err(format!("RMA {i} completed twice"));
        }
        Ok(())
    }

    /// The receive write `c.wr_id` with immediate data consumed at `(n, p)`.
    pub(crate) fn on_imm_recv(
        &mut self,
        plan: &Plan,
        (n, p): (u16, u16),
        status: Status,
        c: &Cqe,
    ) -> Result<(), String> {
        let i = (c.wr_id & !RMA_RECV_BIT) as usize;
        let op = plan.rma.get(i).ok_or_else(|| format!("unknown RMA receive wr_id {i}"))?;
        let got = (status, c.opcode, c.tag, c.msg_len as u64, (c.src_node, c.src_port));
        let want = (Status::Success, Opcode::RecvRdmaImm as u8, op.imm_tag(i), op.len, op.src);
        if op.dst != (n, p) || got != want {
            return Err(format!("RMA {i}'s immediate receive on ({n},{p}): {got:?}, expected {want:?}"));
        }
        if std::mem::replace(&mut self.imm_done[i], true) {
            return Err(format!("RMA {i}'s immediate receive completed twice"));
        }
        Ok(())
    }

    /// At quiesce: every operation completed, every immediate write's
    /// receive with it, and each target window (`window(dst, off, buf)`
    /// reads it) holds the bytes the successful writes wrote and the
    /// initial bytes elsewhere. Returns the operations that succeeded.
    pub(crate) fn check(&self, plan: &Plan, mut window: impl FnMut((u16, u16), u64, &mut [u8])) -> Result<u64, String> {
        let mut ok = 0;
        for (i, op) in plan.rma.iter().enumerate() {
            let st = self.done[i].ok_or_else(|| format!("RMA {i} {:?} never completed", op.kind))?;
            let written = st == Status::Success && op.kind != RmaKind::Read;
            if op.kind == RmaKind::WriteImm && written != self.imm_done[i] {
                return Err(format!("RMA {i}: write {st:?} but its immediate receive done = {}", self.imm_done[i]));
            }
            ok += (st == Status::Success) as u64;
            if op.kind == RmaKind::Read || op.len == 0 {
                continue;
            }
            let mut got = vec![0u8; op.len as usize];
            window(op.dst, op.remote_off, &mut got);
            let placed = |k: u64| got[k as usize] == write_byte(i, k);
            let untouched = |k: u64| got[k as usize] == initial_byte(op.remote_off + k);
            let fine = match (st, op.expect) {
                (Status::Success, _) => (0..op.len).all(placed),
                // Given up across a partition: the target may hold any
                // part of it (its frames placed before the sender gave
                // up), but nothing else.
                (_, Expect::DeliverOrFail(_)) => (0..op.len).all(|k| placed(k) || untouched(k)),
                _ => (0..op.len).all(untouched),
            };
            if !fine {
                return Err(format!(
                    "RMA {i} {st:?}: target window at {} holds neither its data nor the original",
                    op.remote_off
                ));
            }
        }
        Ok(ok)
    }

    /// Operations the plan expects to fail.
    pub(crate) fn expected_errors(plan: &Plan) -> u64 {
        plan.rma.iter().filter(|o| matches!(o.expect, Expect::Fail(_))).count() as u64
    }
}
