//! Collectives in the swarm: one group over a random set of endpoints (in
//! random rank order, several may share a NIC), random trees, and a random
//! sequence of barriers, reductions and broadcasts that every member posts
//! in the same order at its own skewed times. The checks each completion
//! must pass live here too; the scenario driver posts and polls.
//!
//! What a completion proves:
//! - a barrier, an allreduce and a reduce at its root: every member had
//!   posted that operation (nobody leaves before the last one arrives);
//! - a broadcast: the root had posted, and the bytes are the root's;
//! - a reduction: integer and min/max results equal the fold of every
//!   member's input exactly; float sums and products are within rounding
//!   of the exact value, and every member of an allreduce holds the same
//!   bits (fixed combining order).

use emp_uapi::coll::{reduce_tag, BarrierAlgo, CollHeader, Dtype, ReduceOp, TREE_ROOT};
use emp_uapi::desc::{Opcode, Sge, WorkDesc, WD_SIGNALED};
use emp_uapi::sram::GroupEntry;
use emp_uapi::Le;

use crate::cluster::{binomial_parents, group_entry};
use crate::rng::{fill_pattern, Rng};

/// Trees stored in the group: binomial, then two random ones.
const TREES: usize = 3;
/// Largest broadcast the swarm draws.
const BCAST_MAX: u64 = 64 << 10;
/// The partial-result buffer of the default firmware configuration.
const COLL_BUF: usize = 8192;

/// One collective operation, the same at every member.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum CollOp {
    Barrier { algo: BarrierAlgo, tree: u8 },
    Reduce { all: bool, root: u16, dtype: Dtype, op: ReduceOp, tree: u8, count: u32 },
    Bcast { root: u16, tree: u8, len: u32 },
}

impl CollOp {
    pub(crate) fn opcode(&self) -> Opcode {
        match self {
            CollOp::Barrier { .. } => Opcode::Barrier,
            CollOp::Reduce { all: true, .. } => Opcode::Allreduce,
            CollOp::Reduce { .. } => Opcode::Reduce,
            CollOp::Bcast { .. } => Opcode::Bcast,
        }
    }

    /// Bytes of each member's input and of its output buffer.
    fn bytes(&self) -> u64 {
        match *self {
            CollOp::Barrier { .. } => 0,
            CollOp::Reduce { dtype, count, .. } => count as u64 * dtype.size() as u64,
            CollOp::Bcast { len, .. } => len as u64,
        }
    }
}

/// The group and its operations.
pub(crate) struct CollPlan {
    /// Seed of the inputs.
    seed: u64,
    /// Endpoints by rank.
    pub members: Vec<(u16, u16)>,
    /// Parent arrays over relative ranks; tree 0 is binomial.
    trees: Vec<Vec<u8>>,
    /// Bounce slots per member (0 = none) and their size.
    bounce: (u16, u32),
    /// Per member: offset of its bounce slots in its data region.
    bounce_off: Vec<u64>,
    /// Operations, in the order every member posts them.
    pub ops: Vec<CollOp>,
    /// `[op][rank]`: when the member posts it (non-decreasing in op).
    pub post_at: Vec<Vec<u64>>,
    /// `[op][rank]`: input (and broadcast buffer) offset.
    in_off: Vec<Vec<u64>>,
    /// `[op][rank]`: result offset.
    out_off: Vec<Vec<u64>>,
}

/// Random valid tree: every relative rank's parent is a lower one.
fn random_tree(n: usize, r: &mut Rng) -> Vec<u8> {
    (0..n).map(|i| if i == 0 { TREE_ROOT } else { r.below(i as u64) as u8 }).collect()
}

impl CollPlan {
    /// Draws `count` operations over a group of endpoints from `eps`.
    /// `bump(ep, len, r)` reserves `len` bytes of `ep`'s data region.
    pub(crate) fn draw(
        seed: u64,
        count: u32,
        eps: &[(u16, u16)],
        spread_ns: u64,
        mtu: u32,
        r: &mut Rng,
        bump: &mut impl FnMut((u16, u16), u64, &mut Rng) -> u64,
    ) -> CollPlan {
        let mut pool = eps.to_vec();
        let n = r.range(1, pool.len().min(emp_uapi::coll::GROUP_INLINE_MAX) as u64) as usize;
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            members.push(pool.swap_remove(r.below(pool.len() as u64) as usize));
        }
        let mut trees = vec![binomial_parents(n)];
        trees.extend((1..TREES).map(|_| random_tree(n, r)));
        let bounce =
            if r.chance(0.5) { (r.range(1, 4) as u16, [1024u32, 16 << 10][r.below(2) as usize]) } else { (0, 0) };
        let max_reduce = (emp_uapi::wire::payload_capacity(mtu, 0) - CollHeader::SIZE).min(COLL_BUF);
        let ops: Vec<CollOp> = (0..count)
            .map(|_| {
                let root = r.below(n as u64) as u16;
                let tree = r.below(TREES as u64) as u8;
                match r.below(20) {
                    0..=6 => {
                        let algo =
                            [BarrierAlgo::PairwiseExchange, BarrierAlgo::Dissemination, BarrierAlgo::GatherRelease]
                                [r.below(3) as usize];
                        CollOp::Barrier { algo, tree: if algo == BarrierAlgo::GatherRelease { tree } else { 0 } }
                    }
                    7..=14 => {
                        let dtype = Dtype::ALL[r.below(6) as usize];
                        let ops: Vec<ReduceOp> = ReduceOp::ALL.into_iter().filter(|o| o.defined_for(dtype)).collect();
                        let op = ops[r.below(ops.len() as u64) as usize];
                        let count = r.range(1, (max_reduce / dtype.size()) as u64) as u32;
                        CollOp::Reduce { all: r.chance(0.5), root, dtype, op, tree, count }
                    }
                    _ => {
                        let len = match r.below(5) {
                            0 => 0,
                            1 | 2 => r.range(1, 2048),
                            _ => r.range(1, BCAST_MAX),
                        };
                        CollOp::Bcast { root, tree, len: len as u32 }
                    }
                }
            })
            .collect();
        // Each member posts the sequence at its own sorted random times:
        // members run many operations apart (early messages, full windows).
        let mut post_at = vec![vec![0u64; n]; ops.len()];
        #[allow(clippy::needless_range_loop)] // m names a member across every op's row
        for m in 0..n {
            let mut times: Vec<u64> = (0..ops.len()).map(|_| r.below(spread_ns + 1)).collect();
            times.sort_unstable();
            for (k, t) in times.into_iter().enumerate() {
                post_at[k][m] = t;
            }
        }
        let mut in_off = vec![vec![0u64; n]; ops.len()];
        let mut out_off = vec![vec![0u64; n]; ops.len()];
        for (k, op) in ops.iter().enumerate() {
            for (m, &ep) in members.iter().enumerate() {
                in_off[k][m] = bump(ep, op.bytes(), r);
                out_off[k][m] = bump(ep, op.bytes(), r);
            }
        }
        let bounce_off = members.iter().map(|&ep| bump(ep, bounce.0 as u64 * bounce.1 as u64, r)).collect();
        CollPlan { seed, members, trees, bounce, bounce_off, ops, post_at, in_off, out_off }
    }

    /// Operations `ep` posts.
    pub(crate) fn posts_of(&self, ep: (u16, u16)) -> usize {
        if self.members.contains(&ep) {
            self.ops.len()
        } else {
            0
        }
    }

    /// Member `rank`'s group table entry; `key` is its data region.
    pub(crate) fn entry(&self, rank: usize, key: u32) -> GroupEntry {
        let nodes: Vec<u16> = self.members.iter().map(|m| m.0).collect();
        let mut e = group_entry(1, 1, &nodes, rank as u16, &self.trees);
        // Members on any port, not just port 0.
        e.port = self.members[rank].1;
        for (i, &(n, p)) in self.members.iter().enumerate() {
            e.members[i] = (n as u32) << 16 | p as u32;
        }
        if self.bounce.0 > 0 {
            e.bounce_key = key;
            e.bounce_offset = self.bounce_off[rank];
            e.bounce_slots = self.bounce.0;
            e.bounce_slot_size = self.bounce.1;
        }
        e
    }

    /// What member `rank` writes into its data region before the run:
    /// (offset, bytes) of every reduction input and every broadcast it roots.
    pub(crate) fn inputs(&self, rank: usize) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        for (k, op) in self.ops.iter().enumerate() {
            match *op {
                CollOp::Reduce { .. } => out.push((self.in_off[k][rank], self.input(k, rank))),
                CollOp::Bcast { root, .. } if root as usize == rank => {
                    out.push((self.in_off[k][rank], self.bcast_data(k)))
                }
                _ => {}
            }
        }
        out
    }

    /// The descriptor member `rank` posts for operation `k` (group slot =
    /// its port).
    pub(crate) fn desc(&self, k: usize, rank: usize, key: u32, wr_id: u64) -> WorkDesc {
        let op = self.ops[k];
        let slot = self.members[rank].1;
        let mut d = WorkDesc { wr_id, opcode: op.opcode() as u8, flags: WD_SIGNALED, node: slot, ..Default::default() };
        let len = op.bytes() as u32;
        match op {
            CollOp::Barrier { algo, tree } => {
                d.port = algo as u16;
                d.tag = tree as u64;
            }
            CollOp::Reduce { all, root, dtype, op, tree, count } => {
                d.port = if all { 0 } else { root };
                d.tag = reduce_tag(dtype, op, tree);
                d.ignore = count as u64;
                d.num_sge = 2;
                d.sge[0] = Sge { key, len, offset: self.in_off[k][rank] };
                d.sge[1] = Sge { key, len, offset: self.out_off[k][rank] };
            }
            CollOp::Bcast { root, tree, .. } => {
                d.port = root;
                d.tag = tree as u64;
                if len > 0 {
                    d.num_sge = 1;
                    d.sge[0] = Sge { key, len, offset: self.in_off[k][rank] };
                }
            }
        }
        d
    }

    /// Where member `rank` finds operation `k`'s result, and how long it is.
    pub(crate) fn result_at(&self, k: usize, rank: usize) -> (u64, u64) {
        match self.ops[k] {
            CollOp::Bcast { .. } => (self.in_off[k][rank], self.ops[k].bytes()),
            op => (self.out_off[k][rank], op.bytes()),
        }
    }

    /// Member `rank`'s input to reduction `k`: random values, floats kept
    /// finite and in a range where sums and products stay meaningful.
    fn input(&self, k: usize, rank: usize) -> Vec<u8> {
        let CollOp::Reduce { dtype, op, count, .. } = self.ops[k] else { return Vec::new() };
        let mut r = Rng::new(self.seed ^ (k as u64) << 20 ^ (rank as u64) << 8 ^ 0xC0);
        let mut out = Vec::with_capacity(count as usize * dtype.size());
        for _ in 0..count {
            let f = if op == ReduceOp::Prod { 0.5 + r.unit() } else { r.unit() * 2e3 - 1e3 };
            let bits = r.next_u64();
            match dtype {
                Dtype::I32 | Dtype::U32 => out.extend_from_slice(&(bits as u32).to_le_bytes()),
                Dtype::I64 | Dtype::U64 => out.extend_from_slice(&bits.to_le_bytes()),
                Dtype::F32 => out.extend_from_slice(&(f as f32).to_le_bytes()),
                Dtype::F64 => out.extend_from_slice(&f.to_le_bytes()),
            }
        }
        out
    }

    fn bcast_data(&self, k: usize) -> Vec<u8> {
        let mut b = vec![0u8; self.ops[k].bytes() as usize];
        fill_pattern(self.seed ^ 0xB0_0000 ^ k as u64, 0, &mut b);
        b
    }

    /// Does member `rank`'s completion of operation `k` depend on member
    /// `other` having posted it?
    pub(crate) fn needs_post_of(&self, k: usize, rank: usize, other: usize) -> bool {
        match self.ops[k] {
            CollOp::Barrier { .. } | CollOp::Reduce { all: true, .. } => true,
            CollOp::Reduce { root, .. } => rank == root as usize,
            CollOp::Bcast { root, .. } => other == root as usize,
        }
    }

    /// Checks member `rank`'s result of operation `k` (`got`).
    pub(crate) fn check_result(&self, k: usize, rank: usize, got: &[u8]) -> Result<(), String> {
        match self.ops[k] {
            CollOp::Barrier { .. } => Ok(()),
            CollOp::Bcast { root, .. } => {
                if rank != root as usize && got != self.bcast_data(k).as_slice() {
                    let at = got.iter().zip(self.bcast_data(k)).position(|(a, b)| *a != b).unwrap_or(0);
                    return Err(format!(
                        "bcast {k}: rank {rank} differs from the root's data at byte {at} of {}",
                        got.len()
                    ));
                }
                Ok(())
            }
            CollOp::Reduce { all, root, dtype, op, .. } => {
                if !all && rank != root as usize {
                    return Ok(());
                }
                let inputs: Vec<Vec<u8>> = (0..self.members.len()).map(|m| self.input(k, m)).collect();
                let w = dtype.size();
                for (i, got) in got.chunks_exact(w).enumerate() {
                    let xs: Vec<&[u8]> = inputs.iter().map(|x| &x[i * w..(i + 1) * w]).collect();
                    check_element(dtype, op, &xs, got).map_err(|why| {
                        format!("reduce {k} ({} {}) rank {rank} element {i}: {why}", dtype.name(), op.name())
                    })?;
                }
                Ok(())
            }
        }
    }
}

/// Integer results and float min/max must be exact (order does not
/// matter for them); float sum/product within rounding of the exact value.
fn check_element(t: Dtype, op: ReduceOp, xs: &[&[u8]], got: &[u8]) -> Result<(), String> {
    let int = |b: &[u8]| -> u64 {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let float = |b: &[u8]| -> f64 {
        if b.len() == 4 {
            f32::from_le_bytes(b.try_into().expect("4")) as f64
        } else {
            f64::from_le_bytes(b.try_into().expect("8"))
        }
    };
    match t {
        Dtype::I32 | Dtype::I64 | Dtype::U32 | Dtype::U64 => {
            let bits = 8 * t.size() as u32;
            let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
            let signed = matches!(t, Dtype::I32 | Dtype::I64);
            // Sign-extend so that signed min/max compare correctly.
            let val = |v: u64| -> i128 {
                if signed && v >> (bits - 1) & 1 == 1 {
                    v as i128 - (1i128 << bits)
                } else {
                    v as i128
                }
            };
            let mut acc = int(xs[0]);
            for x in &xs[1..] {
                let y = int(x);
                acc = match op {
                    ReduceOp::Sum => acc.wrapping_add(y),
                    ReduceOp::Prod => acc.wrapping_mul(y),
                    ReduceOp::Min => {
                        if val(y) < val(acc) {
                            y
                        } else {
                            acc
                        }
                    }
                    ReduceOp::Max => {
                        if val(y) > val(acc) {
                            y
                        } else {
                            acc
                        }
                    }
                    ReduceOp::Band => acc & y,
                    ReduceOp::Bor => acc | y,
                    ReduceOp::Bxor => acc ^ y,
                } & mask;
            }
            let g = int(got);
            if g != acc {
                return Err(format!("{g:#x}, expected {acc:#x}"));
            }
        }
        Dtype::F32 | Dtype::F64 => {
            let vals: Vec<f64> = xs.iter().map(|x| float(x)).collect();
            let g = float(got);
            let (want, tol) = match op {
                ReduceOp::Min => (vals.iter().copied().fold(f64::INFINITY, f64::min), 0.0),
                ReduceOp::Max => (vals.iter().copied().fold(f64::NEG_INFINITY, f64::max), 0.0),
                ReduceOp::Sum => {
                    let eps = if t == Dtype::F32 { f32::EPSILON as f64 } else { f64::EPSILON };
                    let scale: f64 = vals.iter().map(|v| v.abs()).sum();
                    (vals.iter().sum(), 2.0 * vals.len() as f64 * eps * scale)
                }
                ReduceOp::Prod => {
                    let eps = if t == Dtype::F32 { f32::EPSILON as f64 } else { f64::EPSILON };
                    let p: f64 = vals.iter().product();
                    (p, 2.0 * vals.len() as f64 * eps * p.abs())
                }
                _ => return Err("bitwise operator on a float".into()),
            };
            if (g - want).abs() > tol {
                return Err(format!("{g}, expected {want} ± {tol}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_checks_catch_wrong_results() {
        let a = 5i32.to_le_bytes();
        let b = (-7i32).to_le_bytes();
        let xs: [&[u8]; 2] = [&a, &b];
        assert!(check_element(Dtype::I32, ReduceOp::Min, &xs, &(-7i32).to_le_bytes()).is_ok());
        assert!(check_element(Dtype::I32, ReduceOp::Min, &xs, &5i32.to_le_bytes()).is_err());
        assert!(check_element(Dtype::U32, ReduceOp::Min, &xs, &5i32.to_le_bytes()).is_ok());
        assert!(check_element(Dtype::I32, ReduceOp::Sum, &xs, &(-2i32).to_le_bytes()).is_ok());
        let (x, y) = (1.5f64.to_le_bytes(), 2.25f64.to_le_bytes());
        let fs: [&[u8]; 2] = [&x, &y];
        assert!(check_element(Dtype::F64, ReduceOp::Sum, &fs, &3.75f64.to_le_bytes()).is_ok());
        assert!(check_element(Dtype::F64, ReduceOp::Sum, &fs, &3.76f64.to_le_bytes()).is_err());
        assert!(check_element(Dtype::F64, ReduceOp::Max, &fs, &2.25f64.to_le_bytes()).is_ok());
    }

    #[test]
    fn plans_are_valid_groups() {
        for seed in 0..200 {
            let mut r = Rng::new(seed);
            let eps: Vec<(u16, u16)> = (0..9).flat_map(|n| (0..2).map(move |p| (n, p))).collect();
            let mut next = 0u64;
            let p = CollPlan::draw(seed, 12, &eps, 1_000_000, 1500, &mut r, &mut |_, len, _| {
                next += len;
                next - len
            });
            for rank in 0..p.members.len() {
                let (node, port) = p.members[rank];
                assert_eq!(
                    p.entry(rank, 7).check((node as u32) << 16 | port as u32),
                    Ok(()),
                    "seed {seed} rank {rank}"
                );
            }
            for k in 0..p.ops.len() {
                for m in 0..p.members.len() {
                    assert!(k == 0 || p.post_at[k][m] >= p.post_at[k - 1][m]);
                }
            }
        }
    }
}
