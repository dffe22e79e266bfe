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

/// A scenario's workload, drawn from its seed before the run starts.
pub(crate) struct Plan {
    pub(crate) msgs: Vec<MsgPlan>,
    pub(crate) recvs: Vec<RecvPlan>,
    pub(crate) atomics: Vec<AtomicPlan>,
    /// The endpoint whose counter word the atomics hit.
    pub(crate) counter_at: (u16, u16),
    /// Collectives, if the scenario has any.
    pub(crate) coll: Option<CollPlan>,
    /// Per (node, port): bytes of the data region.
    pub(crate) region_len: HashMap<(u16, u16), u64>,
}

/// wr_id of receive `i`: `RECV_BIT | i` (sends: `i`).
pub(crate) const RECV_BIT: u64 = 1 << 63;
/// wr_id of atomic `i`: `ATOMIC_BIT | i`.
pub(crate) const ATOMIC_BIT: u64 = 1 << 62;
/// Collective wr_ids: `COLL_BIT | op << 8 | rank`.
pub(crate) const COLL_BIT: u64 = 1 << 61;

impl Plan {
    /// Descriptors `ep` posts (its CQ must hold all their completions).
    pub(crate) fn posts_of(&self, ep: (u16, u16)) -> usize {
        self.msgs.iter().filter(|m| m.src == ep).count()
            + self.recvs.iter().filter(|r| r.dst == ep).count()
            + self.atomics.iter().filter(|a| a.src == ep).count()
            + self.coll.as_ref().map_or(0, |c| c.posts_of(ep))
    }
}
