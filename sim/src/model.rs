//! `emp-sim model`: a NIC-offloaded collective against its host-based
//! baseline, both run by the real control program under one cost model
//! ([`crate::cost`]), in one deterministic run (design step 11,
//! `docs/design/collectives.md` §2).
//!
//! - **bcast** (seed 000 §6): the NIC broadcast, forwarded NIC to NIC frame
//!   by frame, on each of the trees `libemp`'s `create_group` stores
//!   (binomial, postal λ = 2, 3, 4, 6, 8), best tree taken; against the host
//!   binomial broadcast over tagged send/receive, each rank forwarding the
//!   whole message once it has it (MPICH's; `emp::coll::Comm::bcast_tree`).
//!   Metric: from the start until the last rank's host holds the message.
//! - **barrier** (seed 001 §3.5.3): the NIC pairwise-exchange barrier
//!   against the host pairwise exchange on the same schedule
//!   (`Comm::barrier_pe`); consecutive barriers, mean time per barrier.
//! - **allreduce** (seed 001 ch. 4): NIC allreduce (i64 sum, binomial tree)
//!   against the host binomial reduce to rank 0 and broadcast back
//!   (`Comm::allreduce`). Metric: from the start until the last rank has the
//!   result; also host time per rank (posting, copying and reaping).
//!
//! Every rank starts at the same instant. Each measured operation follows
//! a warm-up one (peers and translations are set up) and a quiet period.
//! Groups hold up to [`GROUP_MEMBERS_MAX`] (1024) members, so every size
//! the command takes is simulated; [`project`] fits a sweep.

use emp::tree::Tree;
use emp_firmware::Config;
use emp_uapi::coll::{barrier_step, BarrierAlgo, Dtype, ReduceOp, Step as BStep, GROUP_MEMBERS_MAX, TREE_ROOT_WIDE};
use emp_uapi::desc::{Cqe, Status};
use emp_uapi::sram::{admin_result, counter, FEATURE_OVERFLOW};

use crate::cluster::Cluster;
use crate::cost::{CostModel, PAPER_MTU, PAPER_WIRE_BPS, PAPER_WIRE_LATENCY_NS};
use crate::world::{Step, WireConfig};

/// Postal λ of the trees besides the binomial one (libemp's `GroupOpts` default).
pub const LAMBDAS: [u32; 5] = [2, 3, 4, 6, 8];
/// Largest group the NIC variants run in (larger sizes are projected).
pub const NODES_SIMULATED_MAX: u16 = GROUP_MEMBERS_MAX as u16;
/// Largest size the command accepts.
pub const NODES_MAX: u16 = 1024;
/// Consecutive barriers measured.
const BARRIERS: u32 = 20;
/// Virtual time any one measured operation may take.
const LIMIT_NS: u64 = 10_000_000_000;
/// Quiet time between operations (ACKs and timers settle).
const QUIET_NS: u64 = 5_000_000;

/// A cost model with the wire and MTU it goes with.
#[derive(Clone, Debug)]
pub struct Params {
    /// NIC and host costs.
    pub cost: CostModel,
    /// The wire (lossless here).
    pub wire: WireConfig,
    /// MTU.
    pub mtu: u32,
}

impl Params {
    /// Seed 000 §2's fits ([`CostModel::PAPER`]) on a Myrinet-like wire.
    pub fn paper() -> Params {
        let wire =
            WireConfig { latency_ns: PAPER_WIRE_LATENCY_NS, bandwidth_bps: PAPER_WIRE_BPS, ..WireConfig::default() };
        Params { cost: CostModel::PAPER, wire, mtu: PAPER_MTU }
    }

    /// Free work on the simulator's default wire (the simulator without a model).
    pub fn zero() -> Params {
        Params { cost: CostModel::ZERO, wire: WireConfig::default(), mtu: 1500 }
    }
}

/// One variant's result.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timing {
    /// The experiment's time (ns).
    pub ns: f64,
    /// Host time per rank per operation (ns), mean over ranks.
    pub host_cpu_ns: f64,
}

/// Both variants of one experiment.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Ranks.
    pub nodes: u16,
    /// NIC-offloaded.
    pub nic: Timing,
    /// Host-based baseline.
    pub host: Timing,
    /// What the NIC variant used (the tree, …).
    pub note: String,
}

impl Comparison {
    /// Host time over NIC time.
    pub fn ratio(&self) -> f64 {
        self.host.ns / self.nic.ns
    }
}

/// Which experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Experiment {
    /// Broadcast of `size` bytes.
    Bcast,
    /// Barrier.
    Barrier,
    /// Allreduce of `size / 8` i64 elements.
    Allreduce,
}

impl Experiment {
    /// Runs both variants on `n` ranks (≤ [`NODES_SIMULATED_MAX`]).
    pub fn run(self, p: &Params, n: u16, size: u64) -> Result<Comparison, String> {
        let (nic, note) = self.run_nic(p, n, size)?;
        let host = self.run_host(p, n, size)?;
        Ok(Comparison { nodes: n, nic, host, note })
    }

    /// The NIC-offloaded variant on `n` ranks (≤ [`NODES_SIMULATED_MAX`]),
    /// with a note on what it used.
    pub fn run_nic(self, p: &Params, n: u16, size: u64) -> Result<(Timing, String), String> {
        match self {
            Experiment::Bcast => bcast_nic_best(p, n, size),
            Experiment::Barrier => barrier_nic(p, n, BarrierAlgo::PairwiseExchange),
            Experiment::Allreduce => allreduce_nic(p, n, count_of(size)),
        }
    }

    /// The host-based variant on `n` ranks (≤ [`NODES_MAX`]: it needs no group).
    pub fn run_host(self, p: &Params, n: u16, size: u64) -> Result<Timing, String> {
        match self {
            Experiment::Bcast => bcast_host_binomial(p, n, size),
            Experiment::Barrier => barrier_host(p, n, BarrierAlgo::PairwiseExchange),
            Experiment::Allreduce => allreduce_host(p, n, count_of(size)),
        }
    }
}

fn count_of(size: u64) -> u32 {
    (size / 8).clamp(1, u32::MAX as u64) as u32
}

/// Parent arrays of the trees libemp's `create_group` stores: binomial, then postal λ ∈ [`LAMBDAS`].
pub fn group_trees(n: usize) -> Vec<(u32, Tree)> {
    let mut t = vec![(1, Tree::binomial(n))];
    t.extend(LAMBDAS.iter().map(|&l| (l, Tree::postal(n, l))));
    t
}

fn parents(t: &Tree) -> Vec<u16> {
    t.parent.iter().map(|p| p.unwrap_or(TREE_ROOT_WIDE)).collect()
}

/// `n` nodes, port 0 open; with `group`, group slot 0 over all of them
/// with libemp's trees.
fn cluster(p: &Params, n: u16, group: bool) -> Result<Cluster, String> {
    let max = if group { NODES_SIMULATED_MAX } else { NODES_MAX };
    if !(2..=max).contains(&n) {
        return Err(format!("{n} nodes: this run takes 2..={max}"));
    }
    if let Some(why) = p.cost.invalid() {
        return Err(why.into());
    }
    // Small unexpected messages are buffered (MPICH's unexpected queue), so a
    // host rank already in the next barrier does not wait out a refusal.
    // The papers' NICs acknowledged every message (GM, seed 001): so does
    // this model. With EMP's coalesced ACKs the host baseline's barrier
    // is faster (its ACKs leave the data's path): 8 nodes ~32.7 µs.
    let cfg = Config { overflow_slots: 256, overflow_slot_size: 256, ack_coalesce_max: 1, ..Config::default() };
    let mut c = Cluster::new(n, cfg, FEATURE_OVERFLOW, p.mtu, p.wire.clone());
    c.world.cost = p.cost;
    if !group {
        return Ok(c);
    }
    let members: Vec<u16> = (0..n).collect();
    let trees: Vec<Vec<u16>> = group_trees(n as usize).iter().map(|(_, t)| parents(t)).collect();
    let r = c.create_group_bounce_wide(0, 1, 1, &members, &trees, 2, 64 * 1024);
    if !r.iter().all(|&r| r == admin_result::OK) {
        return Err(format!("group creation failed: {r:?}"));
    }
    Ok(c)
}

/// A host program: reacts to each completion its host finished reaping.
trait Program {
    fn on_cqe(&mut self, c: &mut Cluster, node: u16, cqe: Cqe, seen: u64) -> Result<(), String>;
    fn done(&self) -> bool;
}

/// Runs `p` until it is done.
fn drive(c: &mut Cluster, p: &mut impl Program) -> Result<(), String> {
    let end = c.world.now + LIMIT_NS;
    let n = c.world.nodes.len() as u16;
    // Completions already reaped.
    for node in 0..n {
        for (cqe, seen) in c.take_ready(node) {
            p.on_cqe(c, node, cqe, seen)?;
        }
    }
    while !p.done() {
        let Some(s) = c.step() else { return Err("the simulation went idle before the operation finished".into()) };
        if c.world.now > end {
            return Err(format!("not finished after {} ms of virtual time", LIMIT_NS / 1_000_000));
        }
        let (Step::Nic(node) | Step::Host(node)) = s;
        for (cqe, seen) in c.take_ready(node) {
            if cqe.status != Status::Success as u8 {
                return Err(format!("node {node}: wr {} failed: {:?}", cqe.wr_id, Status::from_u8(cqe.status)));
            }
            p.on_cqe(c, node, cqe, seen)?;
        }
    }
    Ok(())
}

/// One measured operation: after a quiet period, `start` posts it at every
/// rank and the program drives it; returns the program, the start time and
/// the host time per rank it took.
fn measure<P: Program>(c: &mut Cluster, start: impl FnOnce(&mut Cluster) -> P) -> Result<(P, u64, f64), String> {
    c.run_for(QUIET_NS);
    let t0 = c.world.now;
    let busy0: u64 = c.host_busy_ns.iter().sum();
    let mut p = start(c);
    drive(c, &mut p)?;
    let busy = (c.host_busy_ns.iter().sum::<u64>() - busy0) as f64 / c.world.nodes.len() as f64;
    Ok((p, t0, busy))
}

pub(crate) fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 9) as u8).collect()
}

// ---- broadcast ----

struct Bcast {
    /// Per rank: the wr whose completion means "has the message".
    wr: Vec<Option<u64>>,
    /// Per rank: when its host had it.
    got: Vec<Option<u64>>,
    /// Host variant: the children each rank forwards to, and the tag.
    forward: Option<(Vec<Vec<u16>>, u64)>,
}

impl Program for Bcast {
    fn on_cqe(&mut self, c: &mut Cluster, node: u16, cqe: Cqe, seen: u64) -> Result<(), String> {
        let r = node as usize;
        if self.wr[r] != Some(cqe.wr_id) {
            return Ok(()); // A send's completion.
        }
        self.got[r] = Some(seen);
        if let Some((children, tag)) = &self.forward {
            let (off, len) = c.buffer(cqe.wr_id);
            for &child in &children[r] {
                c.send_from(node, child, *tag, off, len);
            }
        }
        Ok(())
    }
    fn done(&self) -> bool {
        self.wr.iter().zip(&self.got).all(|(w, g)| w.is_none() || g.is_some())
    }
}

impl Bcast {
    /// When the last of `ranks` had the message.
    fn last(&self, ranks: impl Iterator<Item = usize>) -> u64 {
        ranks.map(|r| self.got[r].expect("done")).max().unwrap_or(0)
    }
}

fn check_bcast(c: &Cluster, p: &Bcast, data: &[u8]) -> Result<(), String> {
    for (r, wr) in p.wr.iter().enumerate() {
        if let Some(wr) = *wr {
            if c.received(wr, data.len()) != data {
                return Err(format!("rank {r} holds different bytes"));
            }
        }
    }
    Ok(())
}

/// NIC broadcast of `data` from rank 0 down stored tree `tree`: until the
/// last leaf has it.
fn bcast_nic(c: &mut Cluster, tree: u8, leaves: &[usize], data: &[u8]) -> Result<(u64, f64), String> {
    let n = c.world.nodes.len() as u16;
    let (p, t0, cpu) = measure(c, |c| {
        let wr: Vec<Option<u64>> =
            (0..n).map(|r| (c.bcast(r, 0, 0, tree, data, r == 0), r != 0)).map(|(w, keep)| keep.then_some(w)).collect();
        Bcast { got: vec![None; n as usize], wr, forward: None }
    })?;
    check_bcast(c, &p, data)?;
    Ok((p.last(leaves.iter().copied()) - t0, cpu))
}

/// Host binomial broadcast of `data` from rank 0 (tag `tag`): until the
/// last rank has it.
fn bcast_host(c: &mut Cluster, tag: u64, data: &[u8]) -> Result<(u64, f64), String> {
    let n = c.world.nodes.len();
    let t = Tree::binomial(n);
    let (p, t0, cpu) = measure(c, |c| {
        let wr: Vec<Option<u64>> =
            (0..n).map(|r| t.parent[r].map(|p| c.recv(r as u16, (p, 0), tag, 0, data.len() as u64))).collect();
        for &child in &t.children[0] {
            c.send(0, child, tag, data);
        }
        Bcast { got: vec![None; n], wr, forward: Some((t.children.clone(), tag)) }
    })?;
    check_bcast(c, &p, data)?;
    Ok((p.last(1..n) - t0, cpu))
}

/// NIC broadcast of `size` bytes on each stored tree; the best one.
pub fn bcast_nic_best(p: &Params, n: u16, size: u64) -> Result<(Timing, String), String> {
    let data = pattern(size, n as u8);
    let trees = group_trees(n as usize);
    let mut c = cluster(p, n, true)?;
    let mut best: Option<(u64, f64, u32)> = None;
    let mut each = Vec::new();
    for (i, (lambda, t)) in trees.iter().enumerate() {
        let leaves: Vec<usize> = (1..n as usize).filter(|&r| t.children[r].is_empty()).collect();
        bcast_nic(&mut c, i as u8, &leaves, &data)?; // Warm-up.
        let (ns, cpu) = bcast_nic(&mut c, i as u8, &leaves, &data)?;
        each.push(format!("λ{lambda} {:.1}", ns as f64 / 1000.0));
        if best.is_none_or(|b| ns < b.0) {
            best = Some((ns, cpu, *lambda));
        }
    }
    let (nic_ns, nic_cpu, lambda) = best.expect("at least one tree");
    let tree = if lambda == 1 { "binomial".to_string() } else { format!("postal λ={lambda}") };
    let note = format!("best NIC tree: {tree}; each tree (µs): {}", each.join(", "));
    Ok((Timing { ns: nic_ns as f64, host_cpu_ns: nic_cpu }, note))
}

/// Host binomial broadcast of `size` bytes.
pub fn bcast_host_binomial(p: &Params, n: u16, size: u64) -> Result<Timing, String> {
    let data = pattern(size, n as u8);
    let mut c = cluster(p, n, false)?;
    bcast_host(&mut c, 1, &data)?;
    let (ns, cpu) = bcast_host(&mut c, 2, &data)?;
    Ok(Timing { ns: ns as f64, host_cpu_ns: cpu })
}

// ---- barrier ----

/// Consecutive NIC barriers.
struct BarrierNic {
    algo: BarrierAlgo,
    wr: Vec<u64>,
    left: Vec<u32>,
    exit: Vec<u64>,
}

impl Program for BarrierNic {
    fn on_cqe(&mut self, c: &mut Cluster, node: u16, cqe: Cqe, seen: u64) -> Result<(), String> {
        let r = node as usize;
        if cqe.wr_id != self.wr[r] {
            return Err(format!("rank {r}: unexpected completion {}", cqe.wr_id));
        }
        self.left[r] -= 1;
        self.exit[r] = seen;
        if self.left[r] > 0 {
            self.wr[r] = c.barrier(node, 0, self.algo, 0);
        }
        Ok(())
    }
    fn done(&self) -> bool {
        self.left.iter().all(|&l| l == 0)
    }
}

/// Consecutive host barriers on `algo`'s schedule (libemp's
/// `barrier_scheduled`: post every receive of the barrier, then walk the
/// schedule; a receive step waits for its message).
struct BarrierHost {
    algo: BarrierAlgo,
    n: u16,
    /// Per rank: barriers left, schedule position, this barrier's receives and which arrived.
    left: Vec<u32>,
    at: Vec<usize>,
    recvs: Vec<Vec<(u64, bool)>>,
    next_recv: Vec<usize>,
    exit: Vec<u64>,
    iter: Vec<u32>,
}

fn barrier_tag(iter: u32, round: u8) -> u64 {
    (1 << 40) | (iter as u64) << 8 | round as u64
}

impl BarrierHost {
    fn steps(&self, r: u16) -> impl Iterator<Item = BStep> + '_ {
        let (algo, n) = (self.algo, self.n);
        (0..).map_while(move |i| barrier_step(algo, n, r, i))
    }

    /// Enters the next barrier: its receives first.
    fn enter(&mut self, c: &mut Cluster, r: u16) {
        let it = self.iter[r as usize];
        let recvs: Vec<(u64, bool)> = self
            .steps(r)
            .filter_map(|s| match s {
                BStep::Recv { from, round } => Some((c.recv(r, (from, 0), barrier_tag(it, round), 0, 0), false)),
                BStep::Send { .. } => None,
            })
            .collect();
        let i = r as usize;
        (self.recvs[i], self.at[i], self.next_recv[i]) = (recvs, 0, 0);
        self.advance(c, r);
    }

    fn advance(&mut self, c: &mut Cluster, r: u16) {
        let i = r as usize;
        let it = self.iter[i];
        loop {
            match barrier_step(self.algo, self.n, r, self.at[i]) {
                Some(BStep::Send { to, round }) => {
                    c.send_from(r, to, barrier_tag(it, round), 0, 0);
                }
                Some(BStep::Recv { .. }) => {
                    if !self.recvs[i][self.next_recv[i]].1 {
                        return;
                    }
                    self.next_recv[i] += 1;
                }
                None => break,
            }
            self.at[i] += 1;
        }
        // Left the barrier once the host is done with its last step.
        self.exit[i] = c.host_free_at(r);
        self.left[i] -= 1;
        self.iter[i] += 1;
        if self.left[i] > 0 {
            self.enter(c, r);
        }
    }
}

impl Program for BarrierHost {
    fn on_cqe(&mut self, c: &mut Cluster, node: u16, cqe: Cqe, _seen: u64) -> Result<(), String> {
        let i = node as usize;
        if self.left[i] == 0 {
            return Ok(());
        }
        if let Some(slot) = self.recvs[i].iter_mut().find(|(wr, _)| *wr == cqe.wr_id) {
            slot.1 = true;
            self.advance(c, node);
        }
        Ok(())
    }
    fn done(&self) -> bool {
        self.left.iter().all(|&l| l == 0)
    }
}

fn last_exit(exit: &[u64], t0: u64) -> u64 {
    exit.iter().max().copied().unwrap_or(t0) - t0
}

/// NIC barriers on `algo`: mean time per barrier over consecutive barriers.
pub fn barrier_nic(p: &Params, n: u16, algo: BarrierAlgo) -> Result<(Timing, String), String> {
    let k = n as usize;
    let mut c = cluster(p, n, true)?;
    let nic_start = |iters: u32| {
        move |c: &mut Cluster| {
            let wr = (0..n).map(|r| c.barrier(r, 0, algo, 0)).collect();
            BarrierNic { algo, wr, left: vec![iters; k], exit: vec![0; k] }
        }
    };
    measure(&mut c, nic_start(2))?;
    let (prog, t0, cpu) = measure(&mut c, nic_start(BARRIERS))?;
    let per = BARRIERS as f64;
    let note = format!("{algo:?}, mean of {BARRIERS} consecutive barriers");
    Ok((Timing { ns: last_exit(&prog.exit, t0) as f64 / per, host_cpu_ns: cpu / per }, note))
}

/// Host barriers on `algo`'s schedule (pairwise exchange or
/// dissemination): mean time per barrier over consecutive barriers.
pub fn barrier_host(p: &Params, n: u16, algo: BarrierAlgo) -> Result<Timing, String> {
    if algo == BarrierAlgo::GatherRelease {
        return Err("gather-release has no host schedule here".into());
    }
    let k = n as usize;
    let mut c = cluster(p, n, false)?;
    let mut first_iter = 0;
    let mut host_run = |c: &mut Cluster, iters: u32| {
        let base = first_iter;
        first_iter += iters;
        let (prog, t0, cpu) = measure(c, |c| {
            let mut h = BarrierHost {
                algo,
                n,
                left: vec![iters; k],
                at: vec![0; k],
                recvs: vec![Vec::new(); k],
                next_recv: vec![0; k],
                exit: vec![0; k],
                iter: vec![base; k],
            };
            for r in 0..n {
                h.enter(c, r);
            }
            h
        })?;
        Ok::<_, String>((last_exit(&prog.exit, t0), cpu))
    };
    host_run(&mut c, 2)?;
    let (ns, cpu) = host_run(&mut c, BARRIERS)?;
    // Early messages wait in the overflow buffer; a refusal would cost an RNR delay.
    let nacks: u64 = (0..n).map(|r| c.counter(r, counter::NACKS_TX)).sum();
    if nacks > 0 {
        return Err(format!("host barrier: {nacks} refusals (overflow buffer too small)"));
    }
    let per = BARRIERS as f64;
    Ok(Timing { ns: ns as f64 / per, host_cpu_ns: cpu / per })
}

// ---- allreduce ----

/// NIC allreduce: every rank's one completion.
struct Once {
    wr: Vec<u64>,
    got: Vec<Option<u64>>,
}

impl Program for Once {
    fn on_cqe(&mut self, _c: &mut Cluster, node: u16, cqe: Cqe, seen: u64) -> Result<(), String> {
        if cqe.wr_id == self.wr[node as usize] {
            self.got[node as usize] = Some(seen);
        }
        Ok(())
    }
    fn done(&self) -> bool {
        self.got.iter().all(Option::is_some)
    }
}

/// Host binomial reduce to rank 0, then binomial broadcast of the result
/// (libemp's `Comm::allreduce`): i64 sum.
struct AllreduceHost {
    tree: Tree,
    tags: (u64, u64),
    /// Per rank: partial receives from its children (wr, value once arrived).
    partials: Vec<Vec<(u64, Option<Vec<u8>>)>>,
    /// Per rank: the receive of the result from the parent.
    down: Vec<Option<u64>>,
    acc: Vec<Vec<u8>>,
    sent_up: Vec<bool>,
    result: Vec<Option<(Vec<u8>, u64)>>,
}

fn add_i64(acc: &mut [u8], x: &[u8]) {
    for (a, b) in acc.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
        let s = i64::from_le_bytes(a.try_into().expect("8")).wrapping_add(i64::from_le_bytes(b.try_into().expect("8")));
        a.copy_from_slice(&s.to_le_bytes());
    }
}

impl AllreduceHost {
    fn progress(&mut self, c: &mut Cluster, r: usize) {
        if self.sent_up[r] || self.partials[r].iter().any(|p| p.1.is_none()) {
            return;
        }
        // Combined in ascending child order (the fixed order).
        let mut acc = self.acc[r].clone();
        for (_, v) in &self.partials[r] {
            add_i64(&mut acc, v.as_deref().expect("arrived"));
        }
        self.sent_up[r] = true;
        match self.tree.parent[r] {
            Some(p) => {
                c.send(r as u16, p, self.tags.0, &acc);
            }
            None => self.have_result(c, r, acc, c.host_free_at(r as u16)),
        }
    }

    fn have_result(&mut self, c: &mut Cluster, r: usize, v: Vec<u8>, at: u64) {
        for &child in &self.tree.children[r] {
            c.send(r as u16, child, self.tags.1, &v);
        }
        self.result[r] = Some((v, at));
    }
}

impl Program for AllreduceHost {
    fn on_cqe(&mut self, c: &mut Cluster, node: u16, cqe: Cqe, seen: u64) -> Result<(), String> {
        let r = node as usize;
        let len = self.acc[r].len();
        if let Some(i) = self.partials[r].iter().position(|p| p.0 == cqe.wr_id) {
            self.partials[r][i].1 = Some(c.received(cqe.wr_id, len));
            self.progress(c, r);
        } else if self.down[r] == Some(cqe.wr_id) {
            let v = c.received(cqe.wr_id, len);
            self.have_result(c, r, v, seen);
        }
        Ok(())
    }
    fn done(&self) -> bool {
        self.result.iter().all(Option::is_some)
    }
}

fn inputs(n: u16, count: u32) -> (Vec<Vec<u8>>, Vec<u8>) {
    let v: Vec<Vec<u8>> =
        (0..n).map(|r| (0..count).flat_map(|i| ((r as i64 + 1) * 1000 + i as i64).to_le_bytes()).collect()).collect();
    let mut want = vec![0u8; count as usize * 8];
    for x in &v {
        add_i64(&mut want, x);
    }
    (v, want)
}

/// NIC allreduce of `count` i64 (sum) on the binomial tree.
pub fn allreduce_nic(p: &Params, n: u16, count: u32) -> Result<(Timing, String), String> {
    let (input, want) = inputs(n, count);
    let mut c = cluster(p, n, true)?;
    let nic = |c: &mut Cluster| -> Result<(u64, f64), String> {
        let (p, t0, cpu) = measure(c, |c| {
            let wr: Vec<u64> =
                (0..n).map(|r| c.reduce(r, 0, true, 0, Dtype::I64, ReduceOp::Sum, 0, &input[r as usize])).collect();
            Once { got: vec![None; n as usize], wr }
        })?;
        for (r, &wr) in p.wr.iter().enumerate() {
            if c.received(wr, want.len()) != want {
                return Err(format!("NIC allreduce: rank {r} has a wrong result"));
            }
        }
        Ok((p.got.iter().map(|g| g.expect("done")).max().unwrap_or(t0) - t0, cpu))
    };
    nic(&mut c)?;
    let (ns, cpu) = nic(&mut c)?;
    Ok((Timing { ns: ns as f64, host_cpu_ns: cpu }, format!("{count} × i64 sum, binomial tree")))
}

/// Host binomial reduce to rank 0 and binomial broadcast of the result, `count` i64 (sum).
pub fn allreduce_host(p: &Params, n: u16, count: u32) -> Result<Timing, String> {
    let (input, want) = inputs(n, count);
    let len = want.len() as u64;
    let mut c = cluster(p, n, false)?;
    let mut round = 0u64;
    let mut host = |c: &mut Cluster| -> Result<(u64, f64), String> {
        round += 1;
        let tags = (2 << 40 | round << 1, 2 << 40 | round << 1 | 1);
        let (h, t0, cpu) = measure(c, |c| {
            let tree = Tree::binomial(n as usize);
            let mut h = AllreduceHost {
                partials: (0..n as usize)
                    .map(|r| {
                        tree.children[r].iter().map(|&ch| (c.recv(r as u16, (ch, 0), tags.0, 0, len), None)).collect()
                    })
                    .collect(),
                down: (0..n as usize)
                    .map(|r| tree.parent[r].map(|p| c.recv(r as u16, (p, 0), tags.1, 0, len)))
                    .collect(),
                acc: input.clone(),
                sent_up: vec![false; n as usize],
                result: vec![None; n as usize],
                tree,
                tags,
            };
            for r in 0..n as usize {
                h.progress(c, r);
            }
            h
        })?;
        let results: Vec<&(Vec<u8>, u64)> = h.result.iter().map(|x| x.as_ref().expect("done")).collect();
        if let Some(r) = results.iter().position(|x| x.0 != want) {
            return Err(format!("host allreduce: rank {r} has a wrong result"));
        }
        Ok((results.iter().map(|x| x.1).max().unwrap_or(t0) - t0, cpu))
    };
    host(&mut c)?;
    let (ns, cpu) = host(&mut c)?;
    Ok(Timing { ns: ns as f64, host_cpu_ns: cpu })
}

// ---- projection ----

/// Least-squares fit of `t = a + b·log2 n` (seed 001 Eqs 3.1 and 3.2 have
/// this shape); returns (a, b).
pub fn fit_log2(points: &[(u16, f64)]) -> (f64, f64) {
    let k = points.len() as f64;
    assert!(points.len() >= 2, "a fit needs two points");
    let xs: Vec<f64> = points.iter().map(|&(n, _)| (n as f64).log2()).collect();
    let (mx, my) = (xs.iter().sum::<f64>() / k, points.iter().map(|p| p.1).sum::<f64>() / k);
    let sxy: f64 = xs.iter().zip(points).map(|(x, p)| (x - mx) * (p.1 - my)).sum();
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let b = sxy / sxx;
    (my - b * mx, b)
}

/// The experiment at powers of two from 2 to `up_to`.
pub fn sweep(e: Experiment, p: &Params, up_to: u16, size: u64) -> Result<Vec<Comparison>, String> {
    let mut out = Vec::new();
    let mut n = 2u16;
    while n <= up_to.min(NODES_SIMULATED_MAX) {
        out.push(e.run(p, n, size)?);
        n *= 2;
    }
    Ok(out)
}

/// Projection of both variants to `n` ranks from a sweep, with each fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Projection {
    /// Ranks projected to.
    pub nodes: u16,
    /// (a, b) of the NIC variant's `a + b·log2 n`.
    pub nic_fit: (f64, f64),
    /// (a, b) of the host variant's.
    pub host_fit: (f64, f64),
}

impl Projection {
    /// Projected NIC time.
    pub fn nic_ns(&self) -> f64 {
        self.nic_fit.0 + self.nic_fit.1 * (self.nodes as f64).log2()
    }
    /// Projected host time.
    pub fn host_ns(&self) -> f64 {
        self.host_fit.0 + self.host_fit.1 * (self.nodes as f64).log2()
    }
}

/// Fits a sweep and projects it to `n` ranks.
pub fn project(sweep: &[Comparison], n: u16) -> Projection {
    let nic: Vec<(u16, f64)> = sweep.iter().map(|c| (c.nodes, c.nic.ns)).collect();
    let host: Vec<(u16, f64)> = sweep.iter().map(|c| (c.nodes, c.host.ns)).collect();
    Projection { nodes: n, nic_fit: fit_log2(&nic), host_fit: fit_log2(&host) }
}
