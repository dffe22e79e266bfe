//! A scenario's plan: the workload a seed draws (`scenario::make_plan`),
//! which the driver posts and the checkers ([`crate::checker`]) hold the
//! run against. Plain data: it depends on nothing but the collective plan.

use std::collections::HashMap;

use emp_uapi::desc::Status;

use crate::collplan::CollPlan;

/// What a send (or an atomic) must end with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    Deliver,
    Fail(Status),
    /// Sent across a partition that outlasts the sender's retry budget:
    /// delivered (the send may still fail, its ACKs lost), or not
    /// delivered and the send failed with this status.
    DeliverOrFail(Status),
}

/// One tagged message: who sends it, when, and how it must end.
#[derive(Clone, Debug)]
pub(crate) struct MsgPlan {
    pub(crate) src: (u16, u16),
    pub(crate) dst: (u16, u16),
    pub(crate) len: u64,
    pub(crate) tag: u64,
    pub(crate) send_at: u64,
    pub(crate) buf_off: u64,
    pub(crate) expect: Expect,
    pub(crate) sge_pieces: usize,
    pub(crate) corrupt: u8,
    /// Posted as a stored descriptor and a start (thesis §2.3.3).
    pub(crate) persistent: bool,
}

/// One posted receive and what it matches.
#[derive(Clone, Debug)]
pub(crate) struct RecvPlan {
    pub(crate) dst: (u16, u16),
    pub(crate) post_at: u64,
    pub(crate) node: u16,
    pub(crate) port: u16,
    pub(crate) tag: u64,
    pub(crate) ignore: u64,
    pub(crate) buf_len: u64,
    pub(crate) buf_off: u64,
    /// Could match several messages: order is checked.
    pub(crate) ambiguous: bool,
    pub(crate) sge_pieces: usize,
    /// Posted as a stored descriptor and a start (thesis §2.3.3).
    pub(crate) persistent: bool,
}

/// A remote fetch-add(1) on the counter (or a misuse of one).
#[derive(Clone, Debug)]
pub(crate) struct AtomicPlan {
    pub(crate) src: (u16, u16),
    pub(crate) dst: (u16, u16),
    pub(crate) post_at: u64,
    /// Offset of the local result word in the source's data region.
    pub(crate) result_off: u64,
    /// What the remote key is: the counter's, or a wrong one.
    pub(crate) bad_key: bool,
    pub(crate) expect: Expect,
}

/// What an RMA operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RmaKind {
    Write,
    /// A write with immediate data: the target posts a receive for it.
    WriteImm,
    Read,
}

/// How an RMA operation names the target's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RmaBad {
    /// Rightly.
    No,
    /// With a wrong secret.
    Secret,
}

/// One remote write or read on `dst`'s RMA window.
#[derive(Clone, Debug)]
pub(crate) struct RmaPlan {
    pub(crate) src: (u16, u16),
    pub(crate) dst: (u16, u16),
    pub(crate) kind: RmaKind,
    pub(crate) post_at: u64,
    /// When the target posts the receive of a write with immediate data.
    pub(crate) recv_post_at: u64,
    pub(crate) len: u64,
    /// Offset in the target's window (writes: a slice no other op touches;
    /// reads: in the part no write touches).
    pub(crate) remote_off: u64,
    /// Offset of the local buffer in the source's data region.
    pub(crate) local_off: u64,
    pub(crate) bad: RmaBad,
    pub(crate) expect: Expect,
}

impl RmaPlan {
    /// Tag (= immediate data) of operation `i`'s receive: a class no message uses.
    pub(crate) fn imm_tag(&self, i: usize) -> u64 {
        RMA_IMM_CLASS << 32 | i as u64
    }
}

/// Tag class of immediate data (messages use classes 0..=7).
pub(crate) const RMA_IMM_CLASS: u64 = 9;

/// A scenario's workload, drawn from its seed before the run starts.
pub(crate) struct Plan {
    pub(crate) msgs: Vec<MsgPlan>,
    pub(crate) recvs: Vec<RecvPlan>,
    pub(crate) atomics: Vec<AtomicPlan>,
    /// The endpoint whose counter word the atomics hit.
    pub(crate) counter_at: (u16, u16),
    /// Collectives, if the scenario has any.
    pub(crate) coll: Option<CollPlan>,
    /// Remote writes and reads.
    pub(crate) rma: Vec<RmaPlan>,
    /// Per (node, port): bytes of the data region.
    pub(crate) region_len: HashMap<(u16, u16), u64>,
}

/// wr_id of receive `i`: `RECV_BIT | i` (sends: `i`).
pub(crate) const RECV_BIT: u64 = 1 << 63;
/// wr_id of atomic `i`: `ATOMIC_BIT | i`.
pub(crate) const ATOMIC_BIT: u64 = 1 << 62;
/// Collective wr_ids: `COLL_BIT | op << 8 | rank`.
pub(crate) const COLL_BIT: u64 = 1 << 61;
/// wr_id of RMA operation `i`: `RMA_BIT | i`.
pub(crate) const RMA_BIT: u64 = 1 << 60;
/// wr_id of the receive RMA write `i` with immediate data completes.
pub(crate) const RMA_RECV_BIT: u64 = RECV_BIT | RMA_BIT;

/// The immediate data message `id` carries (`WD_IMM`), if any: two in
/// three carry a value derived from the id (0 among them), the rest none,
/// so the checker knows what each receive must report without drawing
/// from the seed (every seed's other draws stay as they were).
pub(crate) fn msg_imm(id: usize) -> Option<u32> {
    match id % 3 {
        0 => None,
        1 => Some((id as u32).wrapping_mul(0x9E37_79B9) ^ 0x5A5A_0000),
        _ => Some(if id % 2 == 0 { 0 } else { id as u32 }),
    }
}

impl Plan {
    /// Descriptors `ep` posts (its CQ must hold all their completions).
    pub(crate) fn posts_of(&self, ep: (u16, u16)) -> usize {
        self.msgs.iter().filter(|m| m.src == ep).count()
            + self.recvs.iter().filter(|r| r.dst == ep).count()
            + self.atomics.iter().filter(|a| a.src == ep).count()
            + self.coll.as_ref().map_or(0, |c| c.posts_of(ep))
            + self.rma.iter().filter(|o| o.src == ep).count()
            + self.rma.iter().filter(|o| o.dst == ep && o.kind == RmaKind::WriteImm).count()
    }
}
