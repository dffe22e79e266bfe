//! Point-to-point delivery: exactly once, byte-identical, with the planned
//! status and length, and without overtaking.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use emp_uapi::desc::{Cqe, Opcode, Status, CQE_IMM};
use emp_uapi::{ANY_NODE, ANY_PORT};

use crate::plan::{msg_imm, Expect, Plan, RECV_BIT};
use crate::rng::fill_pattern;

/// What every send and receive completed with, as the driver reaps them.
pub(crate) struct Delivery {
    send_done: Vec<Option<Status>>,
    recv_done: Vec<Option<Cqe>>,
    /// Per message: the receive that got it.
    delivered_to: Vec<Option<u32>>,
}

/// Counts for the run's report, once every message is accounted for.
pub(crate) struct Tally {
    pub(crate) delivered: u64,
    pub(crate) expected_errors: u64,
    pub(crate) truncated: u64,
}

impl Delivery {
    pub(crate) fn new(plan: &Plan) -> Delivery {
        Delivery {
            send_done: vec![None; plan.msgs.len()],
            recv_done: vec![None; plan.recvs.len()],
            delivered_to: vec![None; plan.msgs.len()],
        }
    }

    /// Send `c.wr_id` completed at endpoint `(n, p)` with `status`.
    pub(crate) fn on_send(&mut self, plan: &Plan, (n, p): (u16, u16), status: Status, c: &Cqe) -> Result<(), String> {
        let i = c.wr_id as usize;
        let m = plan.msgs.get(i).ok_or_else(|| format!("unknown send wr_id {i}"))?;
        if m.src != (n, p) || c.opcode != Opcode::Send as u8 {
            return Err(format!("send {i} completed on ({n},{p}) opcode {}", c.opcode));
        }
        if self.send_done[i].replace(status).is_some() {
            return Err(format!("send {i} completed twice"));
        }
        let want = match m.expect {
            Expect::Deliver => Status::Success,
            Expect::Fail(s) => s,
            Expect::DeliverOrFail(s) if status == s => s,
            Expect::DeliverOrFail(_) => Status::Success,
        };
        if status != want {
            return Err(format!("send {i} {:?}->{:?} len {}: {:?}, expected {:?}", m.src, m.dst, m.len, status, want));
        }
        Ok(())
    }

    /// Receive `c.wr_id` completed at `(n, p)`: it got the message its tag
    /// names, once, whole or truncated as planned, with the message's bytes
    /// in the buffer (`read(offset, buf)` reads the endpoint's data region).
    pub(crate) fn on_recv(
        &mut self,
        plan: &Plan,
        (n, p): (u16, u16),
        status: Status,
        c: Cqe,
        read: impl FnOnce(u64, &mut [u8]),
    ) -> Result<(), String> {
        let ri = (c.wr_id & !RECV_BIT) as usize;
        let rv = plan.recvs.get(ri).ok_or_else(|| format!("unknown recv wr_id {ri}"))?;
        if rv.dst != (n, p) || c.opcode != Opcode::Recv as u8 {
            return Err(format!("recv {ri} completed on ({n},{p})"));
        }
        if self.recv_done[ri].replace(c).is_some() {
            return Err(format!("recv {ri} completed twice"));
        }
        let id = (c.tag & 0xFFFF_FFFF) as usize;
        let m = plan.msgs.get(id).ok_or_else(|| format!("recv {ri} got unknown tag {:#x}", c.tag))?;
        if m.tag != c.tag || m.dst != (n, p) || (c.src_node, c.src_port) != m.src {
            return Err(format!(
                "recv {ri} got message {id} with tag/src {:#x}/{:?} meant for {:?}",
                c.tag,
                (c.src_node, c.src_port),
                m.dst
            ));
        }
        let imm = (c.flags & CQE_IMM != 0).then_some(c.imm);
        if imm != msg_imm(id) {
            return Err(format!("recv {ri} of message {id}: immediate data {imm:?}, sent {:?}", msg_imm(id)));
        }
        if let Some(prev) = self.delivered_to[id].replace(ri as u32) {
            return Err(format!("message {id} delivered twice (recvs {prev} and {ri})"));
        }
        let want = if m.len > rv.buf_len { Status::Truncated } else { Status::Success };
        let want_len = m.len.min(rv.buf_len);
        if status != want || c.byte_len as u64 != want_len || c.msg_len as u64 != m.len {
            return Err(format!(
                "recv {ri} of message {id} (len {}, buf {}): {:?} byte_len {} msg_len {}",
                m.len, rv.buf_len, status, c.byte_len, c.msg_len
            ));
        }
        let mut got = vec![0u8; want_len as usize];
        let mut exp = vec![0u8; want_len as usize];
        read(rv.buf_off, &mut got);
        fill_pattern(id as u64, 0, &mut exp);
        if got != exp {
            let at = got.iter().zip(&exp).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("message {id} corrupted at byte {at} of {want_len}"));
        }
        Ok(())
    }

    /// Non-overtaking: ambiguous receives of one tag class at one endpoint,
    /// in posting order, got each source's messages in increasing id order.
    /// Call once every receive completed.
    pub(crate) fn check_order(&self, plan: &Plan) -> Result<(), String> {
        #[allow(clippy::type_complexity)] // ((dst, port), posting seq) -> [(src msg id, recv, len)]
        let mut by_dst: BTreeMap<((u16, u16), u64), Vec<(u64, usize, u32)>> = BTreeMap::new();
        let mut posted_seq: HashMap<(u16, u16), u64> = HashMap::new();
        let mut order: Vec<usize> = (0..plan.recvs.len()).collect();
        order.sort_by_key(|&i| plan.recvs[i].post_at); // Stable: posting order.
        for i in order {
            let rv = &plan.recvs[i];
            let k = posted_seq.entry(rv.dst).or_insert(0);
            *k += 1;
            if rv.ambiguous {
                // Left open only when its message was lost (`tally` checks that).
                let Some(c) = self.recv_done[i] else { continue };
                by_dst.entry((rv.dst, rv.tag >> 32)).or_default().push((*k, i, (c.tag & 0xFFFF_FFFF) as u32));
            }
        }
        for (dst, list) in by_dst {
            let mut last: HashMap<(u16, u16), u32> = HashMap::new();
            for (_, ri, id) in list {
                let src = plan.msgs[id as usize].src;
                if let Some(&prev) = last.get(&src) {
                    if prev > id {
                        return Err(format!(
                            "order: at {dst:?} recv {ri} got message {id} from {src:?} after message {prev}"
                        ));
                    }
                }
                last.insert(src, id);
            }
        }
        Ok(())
    }

    /// Every message was delivered, or failed as planned and was not.
    pub(crate) fn tally(&self, plan: &Plan) -> Result<Tally, String> {
        let mut t = Tally { delivered: 0, expected_errors: 0, truncated: 0 };
        for (i, m) in plan.msgs.iter().enumerate() {
            match m.expect {
                Expect::Deliver if self.delivered_to[i].is_none() => {
                    return Err(format!("message {i} never delivered"))
                }
                Expect::Deliver => t.delivered += 1,
                Expect::Fail(_) => {
                    if self.delivered_to[i].is_some() {
                        return Err(format!("failed message {i} was delivered"));
                    }
                    t.expected_errors += 1;
                }
                Expect::DeliverOrFail(_) if self.delivered_to[i].is_some() => t.delivered += 1,
                Expect::DeliverOrFail(s) if self.send_done[i] == Some(s) => t.expected_errors += 1,
                Expect::DeliverOrFail(_) => {
                    return Err(format!("message {i} neither delivered nor failed: {:?}", self.send_done[i]))
                }
            }
        }
        let open: u32 = self.receives_left_open(plan, u16::MAX).iter().sum();
        let not_done = self.recv_done.iter().filter(|c| c.is_none()).count() as u32;
        if not_done != open {
            return Err(format!("{not_done} receives never completed, {open} messages lost to the partition"));
        }
        t.truncated = self.recv_done.iter().flatten().filter(|c| c.status == Status::Truncated as u8).count() as u64;
        Ok(t)
    }

    /// Messages whose send failed as a partition allowed and that were not
    /// delivered: their receives will never complete.
    pub(crate) fn receives_never_due(&self, plan: &Plan) -> u64 {
        self.lost(plan).count() as u64
    }

    /// Per node (ids below `nodes`; `u16::MAX`: all summed into slot 0),
    /// the receives left posted for lost messages.
    pub(crate) fn receives_left_open(&self, plan: &Plan, nodes: u16) -> Vec<u32> {
        let mut open = vec![0u32; if nodes == u16::MAX { 1 } else { nodes as usize }];
        for i in self.lost(plan) {
            let n = if nodes == u16::MAX { 0 } else { plan.msgs[i].dst.0 as usize };
            open[n] += 1;
        }
        open
    }

    fn lost<'a>(&'a self, plan: &'a Plan) -> impl Iterator<Item = usize> + 'a {
        plan.msgs.iter().enumerate().filter_map(move |(i, m)| match m.expect {
            Expect::DeliverOrFail(s) if self.send_done[i] == Some(s) && self.delivered_to[i].is_none() => Some(i),
            _ => None,
        })
    }

    /// The first sends and receives still outstanding, with the receives a
    /// stuck send could match: for a liveness failure.
    pub(crate) fn describe_pending(&self, plan: &Plan) -> String {
        let mut s = String::new();
        let sends: Vec<usize> = (0..self.send_done.len()).filter(|&i| self.send_done[i].is_none()).take(8).collect();
        for i in sends {
            let m = &plan.msgs[i];
            let _ = write!(s, "\n  send {i} {:?}->{:?} len {} tag {:#x} at {}", m.src, m.dst, m.len, m.tag, m.send_at);
            for (ri, r) in plan.recvs.iter().enumerate() {
                let matches = r.dst == m.dst
                    && (r.node == ANY_NODE || r.node == m.src.0)
                    && (r.port == ANY_PORT || r.port == m.src.1)
                    && (r.tag ^ m.tag) & !r.ignore == 0;
                if matches {
                    let got = self.recv_done[ri].map(|c| c.tag);
                    let _ = write!(s, "\n    could match recv {ri} posted at {} done with {:x?}", r.post_at, got);
                }
            }
        }
        let recvs: Vec<usize> = (0..self.recv_done.len()).filter(|&i| self.recv_done[i].is_none()).take(8).collect();
        for i in recvs {
            let r = &plan.recvs[i];
            let _ = write!(
                s,
                "\n  recv {i} at {:?} from {:?} tag {:#x}/{:#x} at {}",
                r.dst,
                (r.node, r.port),
                r.tag,
                r.ignore,
                r.post_at
            );
        }
        s
    }
}
