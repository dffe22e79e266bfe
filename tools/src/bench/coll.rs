//! `emp bench barrier|bcast|bcast-skew|allreduce|reduce --nodes N`:
//! collective benchmarks over N rank processes (one NIC each on a private
//! chassis), every variant measured in the same run by the methods of
//! `docs/design/collectives.md` §2:
//!
//! - **barrier**: `--iters` (10,000) consecutive barriers; mean time per
//!   barrier, averaged over ranks (seed 001 §3.5.3).
//! - **bcast**: per iteration the root (rank 0) broadcasts and one leaf
//!   answers with a 0-byte message; `--iters` (1,000) iterations timed at
//!   the root, repeated for every leaf that is the last child of its parent
//!   in the variant's tree; the max over those leaves (seed 000 §6).
//!   With `--turns` the receivers instead take turns answering, one per
//!   iteration, and the mean iteration time is reported (seed 002 §6.2).
//! - **bcast-skew**: `--iters` (1,000) trials of barrier, then every
//!   non-root rank spins for a uniform random delay in [0, 3 × `--skew-us`]
//!   (so the mean pairwise skew is `--skew-us`) and calls bcast; the root
//!   calls at once. Mean time inside the call over trials and ranks (seed
//!   001 §6.3; seed 002 §6.4).
//! - **bcast-tput**: `--iters` (1,000) back-to-back broadcasts from rank 0
//!   between two timing barriers; the root's time per broadcast (seed 002
//!   §6.3: broadcasts finished over the total time, inverted so that FoI
//!   > 1 still means faster).
//! - **allreduce**, **reduce** (to rank 0): per iteration a barrier, then
//!   the call; wall time and thread CPU time (`CLOCK_THREAD_CPUTIME_ID`)
//!   inside the call, mean over `--iters` (10,000) iterations and ranks
//!   (seed 001 §4.3.3); sum over `--dtypes` (i64, f64) of `--sizes`
//!   elements (1, 8, 64). Results are checked against `reduce_ref` first.
//!
//! Variants are the entries of [`VARIANTS`]: the host baselines over
//! tagged send/recv, and the NIC-offloaded collectives (`nic-*`), which
//! create a group on the NIC and post one descriptor per call; `nic-rb` is
//! the reliable broadcast over wire multicast (seed 002), one column per
//! scheme (window, co-roots, ACK every 10). A NIC
//! variant waits the way the host baseline does (`--poll` or blocking).
//! Each table has a column per variant and, per non-baseline variant, an
//! FoI column = baseline time / variant time (> 1: faster than the host
//! baseline). Timing barriers and result gathering run on a communicator
//! of their own, the same for every variant.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use emp::coll::{reduce_ref, Comm, CommOpts, Dtype, ReduceOp, Wait};
use emp::rdv::Job;
use emp::tree::Tree;
use emp::{Buffer, Device, MemSpan, Status};

use super::{err, print_json, BenchArgs, Json, Kind, Rng, Waiter};

/// One implementation of the collectives under test, set up once per rank
/// (a NIC variant creates its group in [`Variant::make`]). Operations a
/// variant lacks fail; [`VARIANTS`] only offers it for kinds it has.
pub trait Coll {
    /// Column label.
    fn label(&self) -> String;
    /// One barrier.
    fn barrier(&mut self, _dev: &mut Device, _comm: &mut Comm) -> emp::Result<()> {
        Err(unsupported(&self.label(), "barrier"))
    }
    /// One broadcast of `buf` from `root`.
    fn bcast(&mut self, _dev: &mut Device, _comm: &mut Comm, _root: usize, _buf: MemSpan) -> emp::Result<()> {
        Err(unsupported(&self.label(), "bcast"))
    }
    /// The tree (relative to the root) the broadcast follows, for picking
    /// the leaves whose answer ends an iteration.
    fn bcast_tree(&self, n: usize) -> Tree {
        Tree::binomial(n)
    }
    /// One allreduce.
    fn allreduce(
        &mut self,
        _dev: &mut Device,
        _comm: &mut Comm,
        _t: Dtype,
        _op: ReduceOp,
        _send: &[u8],
        _recv: &mut [u8],
    ) -> emp::Result<()> {
        Err(unsupported(&self.label(), "allreduce"))
    }
    /// One reduce to `root` (`recv` at the root only).
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        _dev: &mut Device,
        _comm: &mut Comm,
        _root: usize,
        _t: Dtype,
        _op: ReduceOp,
        _send: &[u8],
        _recv: Option<&mut [u8]>,
    ) -> emp::Result<()> {
        Err(unsupported(&self.label(), "reduce"))
    }
}

fn unsupported(label: &str, what: &str) -> emp::Error {
    emp::Error::InvalidArgument(format!("variant {label} has no {what}"))
}

/// A variant on the command line (`--algo NAME`).
pub struct Variant {
    /// Its `--algo` name.
    pub name: &'static str,
    /// One line on what it is.
    pub about: &'static str,
    /// The benchmarks it runs.
    pub kinds: &'static [Kind],
    /// Builds what to measure on this rank: one instance, or several for a
    /// sweep (one column each).
    pub make: MakeFn,
}

/// Builds a variant's instances on one rank.
pub type MakeFn = fn(&mut Device, &Comm) -> emp::Result<Vec<Box<dyn Coll>>>;

const TREE_KINDS: &[Kind] = &[Kind::Bcast, Kind::BcastSkew, Kind::BcastTput];
const ALL_TREE_KINDS: &[Kind] = &[Kind::Bcast, Kind::BcastSkew, Kind::BcastTput, Kind::Allreduce, Kind::Reduce];

/// Every variant; the host baselines first.
pub const VARIANTS: &[Variant] = &[
    Variant { name: "host-pe", about: "host pairwise-exchange barrier (MPICH's), tagged send/recv", kinds: &[Kind::Barrier], make: make_host_pe },
    Variant { name: "host-diss", about: "host dissemination barrier", kinds: &[Kind::Barrier], make: make_host_diss },
    Variant { name: "host-gb", about: "host gather-release barrier, one column per postal tree λ = 1, 2, 3, 4, 6, 8", kinds: &[Kind::Barrier], make: make_host_gb },
    Variant {
        name: "host-binomial",
        about: "host binomial tree (whole message per hop, only inside the call; reductions in the fixed order)",
        kinds: ALL_TREE_KINDS,
        make: make_host_binomial,
    },
    Variant { name: "host-postal", about: "host bcast down postal trees λ = 2, 3, 4, 6, 8 (one column each)", kinds: TREE_KINDS, make: make_host_postal },
    Variant { name: "nic-pe", about: "NIC pairwise-exchange barrier (one descriptor, the NIC runs the schedule)", kinds: &[Kind::Barrier], make: make_nic_pe },
    Variant { name: "nic-diss", about: "NIC dissemination barrier", kinds: &[Kind::Barrier], make: make_nic_diss },
    Variant { name: "nic-gr", about: "NIC gather-release barrier, one column per stored tree λ = 1, 2, 3, 4, 6, 8", kinds: &[Kind::Barrier], make: make_nic_gr },
    Variant {
        name: "nic",
        about: "NIC collectives: bcast forwarded NIC to NIC, pipelined, down the tree the cost model picks; reduce/allreduce combined on the NICs",
        kinds: ALL_TREE_KINDS,
        make: make_nic,
    },
    Variant {
        name: "nic-postal",
        about: "NIC bcast down each stored postal tree λ = 1, 2, 3, 4, 6, 8 (one column each: the paper's min over λ)",
        kinds: TREE_KINDS,
        make: make_nic_postal,
    },
    Variant {
        name: "nic-rb",
        about: "NIC reliable bcast over wire multicast (seed 002): columns window, co-roots 1 and 3, ACK every 10; window fragments up to 16 KiB, the NIC tree above (§4.5)",
        kinds: TREE_KINDS,
        make: make_nic_rb,
    },
];

/// The baseline of each benchmark (ratios divide by it; always measured).
pub fn baseline(k: Kind) -> &'static str {
    match k {
        Kind::Barrier => "host-pe",
        _ => "host-binomial",
    }
}

/// λ values swept by the postal-tree variants (`GroupOpts` defaults).
const LAMBDAS: [u32; 6] = [1, 2, 3, 4, 6, 8];

/// Distinct postal trees over `n` ranks for λ ≥ `from` (a large λ gives
/// the flat tree; identical trees are measured once).
fn postal_sweep(n: usize, from: u32, skip_binomial: bool) -> Vec<(u32, Tree)> {
    let binomial = Tree::binomial(n);
    let mut out: Vec<(u32, Tree)> = Vec::new();
    for l in LAMBDAS.into_iter().filter(|&l| l >= from) {
        let t = Tree::postal(n, l);
        if (skip_binomial && t == binomial) || out.iter().any(|(_, u)| *u == t) {
            continue;
        }
        out.push((l, t));
    }
    out
}

enum HostBarrier {
    Pe,
    Diss,
    Gb(u32, Tree),
}

impl Coll for HostBarrier {
    fn label(&self) -> String {
        match self {
            HostBarrier::Pe => "host-pe".into(),
            HostBarrier::Diss => "host-diss".into(),
            HostBarrier::Gb(l, _) => format!("host-gb(λ={l})"),
        }
    }
    fn barrier(&mut self, dev: &mut Device, comm: &mut Comm) -> emp::Result<()> {
        match self {
            HostBarrier::Pe => comm.barrier_pe(dev),
            HostBarrier::Diss => comm.barrier_dissemination(dev),
            HostBarrier::Gb(_, t) => comm.barrier_gb(dev, t),
        }
    }
}

/// Host broadcast/reduction on the binomial tree (`tree` = `None`) or a
/// postal tree (broadcast only).
struct HostTree {
    label: String,
    tree: Option<Tree>,
}

impl Coll for HostTree {
    fn label(&self) -> String {
        self.label.clone()
    }
    fn bcast(&mut self, dev: &mut Device, comm: &mut Comm, root: usize, buf: MemSpan) -> emp::Result<()> {
        match &self.tree {
            None => comm.bcast_binomial(dev, root, buf),
            Some(t) => comm.bcast_tree(dev, root, t, buf),
        }
    }
    fn bcast_tree(&self, n: usize) -> Tree {
        self.tree.clone().unwrap_or_else(|| Tree::binomial(n))
    }
    fn allreduce(
        &mut self,
        dev: &mut Device,
        comm: &mut Comm,
        t: Dtype,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> emp::Result<()> {
        if self.tree.is_some() {
            return Err(unsupported(&self.label, "allreduce"));
        }
        comm.allreduce(dev, t, op, send, recv)
    }
    fn reduce(
        &mut self,
        dev: &mut Device,
        comm: &mut Comm,
        root: usize,
        t: Dtype,
        op: ReduceOp,
        send: &[u8],
        recv: Option<&mut [u8]>,
    ) -> emp::Result<()> {
        if self.tree.is_some() {
            return Err(unsupported(&self.label, "reduce"));
        }
        comm.reduce(dev, root, t, op, send, recv)
    }
}

fn make_host_pe(_: &mut Device, _: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    Ok(vec![Box::new(HostBarrier::Pe)])
}

fn make_host_diss(_: &mut Device, _: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    Ok(vec![Box::new(HostBarrier::Diss)])
}

fn make_host_gb(_: &mut Device, c: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    Ok(postal_sweep(c.size(), 1, false)
        .into_iter()
        .map(|(l, t)| Box::new(HostBarrier::Gb(l, t)) as Box<dyn Coll>)
        .collect())
}

fn make_host_binomial(_: &mut Device, _: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    Ok(vec![Box::new(HostTree { label: "host-binomial".into(), tree: None })])
}

fn make_host_postal(_: &mut Device, c: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    Ok(postal_sweep(c.size(), 2, true)
        .into_iter()
        .map(|(l, t)| Box::new(HostTree { label: format!("host-postal(λ={l})"), tree: Some(t) }) as Box<dyn Coll>)
        .collect())
}

/// Group ids of the NIC variants (every rank builds variants in the same order).
static NEXT_GROUP: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0x0B00);

/// A NIC-offloaded variant: a group on the NIC, registered buffers for
/// reductions (the benchmark's slices are copied in and out), and how to wait.
struct Nic {
    label: String,
    group: emp::Group,
    what: NicWhat,
    bounce: Buffer,
    next_wr: u64,
}

#[derive(Clone, Copy)]
enum NicWhat {
    Barrier(emp::BarrierAlgo, u8),
    /// Broadcast over a fixed stored tree, or (None) the cost model's pick; reductions.
    Tree(Option<u8>),
    /// Reliable broadcast over wire multicast with this scheme: window
    /// fragments up to the group's threshold, the NIC tree above it (§4.5).
    Rbcast(emp::RbcastAlgo),
}

fn nic_group(dev: &mut Device, c: &Comm) -> emp::Result<emp::Group> {
    let id = NEXT_GROUP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let opts = emp::GroupOpts { lambdas: LAMBDAS[1..].to_vec(), bounce_slots: 4, bounce_slot_size: 64 << 10 };
    dev.create_group(id, c.members(), &opts)
}

fn nic_variant(dev: &mut Device, c: &Comm, label: String, what: NicWhat) -> emp::Result<Box<dyn Coll>> {
    let group = nic_group(dev, c)?;
    let bounce = dev.alloc(128 << 10)?;
    Ok(Box::new(Nic { label, group, what, bounce, next_wr: 0 }))
}

impl Nic {
    /// Posts through `post` and waits for it as the host baseline waits.
    fn run(
        &mut self,
        dev: &mut Device,
        comm: &Comm,
        post: impl FnOnce(&mut Device, u64, &emp::Group) -> emp::Result<()>,
    ) -> emp::Result<()> {
        self.next_wr += 1;
        let wr = 0x4E00_0000_0000_0000 | self.next_wr;
        post(dev, wr, &self.group)?;
        let waiter = Waiter::new(comm.opts().wait, comm.opts().timeout);
        // Blocking: the NIC does the work, so sleep on the port's event at
        // once rather than spin first (the host baseline must progress its
        // algorithm itself, so it keeps the default spin).
        let spin = dev.spin();
        if waiter.wait == Wait::Block {
            dev.set_spin(Duration::ZERO);
        }
        let c = waiter.wr(dev, wr);
        dev.set_spin(spin);
        match c?.status {
            Status::Success => Ok(()),
            st => Err(emp::Error::Failed(st)),
        }
    }
}

impl Coll for Nic {
    fn label(&self) -> String {
        self.label.clone()
    }
    fn barrier(&mut self, dev: &mut Device, comm: &mut Comm) -> emp::Result<()> {
        let NicWhat::Barrier(algo, tree) = self.what else { return Err(unsupported(&self.label, "barrier")) };
        self.run(dev, comm, |d, wr, g| match algo {
            emp::BarrierAlgo::GatherRelease => d.post_barrier_tree(wr, g, tree),
            a => d.post_barrier(wr, g, a),
        })
    }
    fn bcast(&mut self, dev: &mut Device, comm: &mut Comm, root: usize, buf: MemSpan) -> emp::Result<()> {
        let sges: Vec<emp::Sge> = if buf.is_empty() { vec![] } else { vec![buf.sge(0, buf.len())] };
        match self.what {
            NicWhat::Tree(tree) => self.run(dev, comm, |d, wr, g| match tree {
                Some(t) => d.post_bcast_tree(wr, g, root, t, &sges),
                None => d.post_bcast(wr, g, root, &sges),
            }),
            NicWhat::Rbcast(algo) => self.run(dev, comm, |d, wr, g| d.post_rbcast(wr, g, root, algo, &sges)),
            NicWhat::Barrier(..) => Err(unsupported(&self.label, "bcast")),
        }
    }
    fn bcast_tree(&self, n: usize) -> Tree {
        match self.what {
            NicWhat::Tree(Some(t)) => self.group.trees()[t as usize].1.clone(),
            // One multicast reaches every receiver straight from the root.
            NicWhat::Rbcast(_) => flat_tree(n),
            _ => Tree::binomial(n),
        }
    }
    fn allreduce(
        &mut self,
        dev: &mut Device,
        comm: &mut Comm,
        t: Dtype,
        op: ReduceOp,
        send: &[u8],
        recv: &mut [u8],
    ) -> emp::Result<()> {
        let n = send.len();
        self.bounce.as_mut_slice()[..n].copy_from_slice(send);
        let (s, r) = (self.bounce.sge(0, n), self.bounce.sge(64 << 10, n));
        self.run(dev, comm, |d, wr, g| d.post_allreduce(wr, g, t, op, s, r))?;
        recv.copy_from_slice(&self.bounce.as_slice()[64 << 10..(64 << 10) + n]);
        Ok(())
    }
    fn reduce(
        &mut self,
        dev: &mut Device,
        comm: &mut Comm,
        root: usize,
        t: Dtype,
        op: ReduceOp,
        send: &[u8],
        recv: Option<&mut [u8]>,
    ) -> emp::Result<()> {
        let n = send.len();
        self.bounce.as_mut_slice()[..n].copy_from_slice(send);
        let (s, r) = (self.bounce.sge(0, n), recv.as_ref().map(|_| self.bounce.sge(64 << 10, n)));
        self.run(dev, comm, |d, wr, g| d.post_reduce(wr, g, root, t, op, s, r))?;
        if let Some(out) = recv {
            out.copy_from_slice(&self.bounce.as_slice()[64 << 10..(64 << 10) + n]);
        }
        Ok(())
    }
}

fn make_nic_pe(d: &mut Device, c: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    Ok(vec![nic_variant(d, c, "nic-pe".into(), NicWhat::Barrier(emp::BarrierAlgo::PairwiseExchange, 0))?])
}

fn make_nic_diss(d: &mut Device, c: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    Ok(vec![nic_variant(d, c, "nic-diss".into(), NicWhat::Barrier(emp::BarrierAlgo::Dissemination, 0))?])
}

/// One column per distinct stored tree.
fn nic_tree_sweep(
    d: &mut Device,
    c: &Comm,
    label: &str,
    what: impl Fn(u8) -> NicWhat,
) -> emp::Result<Vec<Box<dyn Coll>>> {
    let sweep = postal_sweep(c.size(), 1, false);
    let mut out = Vec::new();
    for (l, tree) in sweep {
        let idx = LAMBDAS.iter().position(|&x| x == l).expect("swept λ is stored") as u8;
        let v = nic_variant(d, c, format!("{label}(λ={l})"), what(idx))?;
        debug_assert!(v.bcast_tree(c.size()) == tree || matches!(what(idx), NicWhat::Barrier(..)));
        out.push(v);
    }
    Ok(out)
}

fn make_nic_gr(d: &mut Device, c: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    nic_tree_sweep(d, c, "nic-gr", |t| NicWhat::Barrier(emp::BarrierAlgo::GatherRelease, t))
}

fn make_nic(d: &mut Device, c: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    Ok(vec![nic_variant(d, c, "nic".into(), NicWhat::Tree(None))?])
}

fn make_nic_postal(d: &mut Device, c: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    nic_tree_sweep(d, c, "nic-postal", |t| NicWhat::Tree(Some(t)))
}

/// The root's children are every other rank (a large λ gives the flat tree).
fn flat_tree(n: usize) -> Tree {
    Tree::postal(n, n.max(2) as u32)
}

/// Co-root counts measured (seed 002's Co-root2 is one co-root on 8 nodes;
/// 3 gives sub-groups of n / 4), where the group has room for them.
const RB_COROOTS: [u16; 2] = [1, 3];
/// ACK every M (seed 002's Aggregate10).
const RB_ACK_EVERY: u8 = 10;

/// The reliable-broadcast schemes measured over `n` ranks, with their labels.
fn rb_schemes(n: usize) -> Vec<(String, emp::RbcastAlgo)> {
    let window = emp::RbcastAlgo { coroots: 0, ack_every: 1, window: 0, nak: false };
    let mut out = vec![("rb-window".to_string(), window)];
    for c in RB_COROOTS.into_iter().filter(|&c| (c as usize) + 1 < n) {
        out.push((format!("rb-coroot({c})"), emp::RbcastAlgo { coroots: c, ..window }));
    }
    out.push((format!("rb-ack{RB_ACK_EVERY}"), emp::RbcastAlgo { ack_every: RB_ACK_EVERY, ..window }));
    // The paper's §9: NAK-based (ACKs every half window), and hybrid (NAKs
    // beside ACK every M).
    out.push(("rb-nak".to_string(), emp::RbcastAlgo { ack_every: 0, nak: true, ..window }));
    out.push((format!("rb-hybrid{RB_ACK_EVERY}"), emp::RbcastAlgo { ack_every: RB_ACK_EVERY, nak: true, ..window }));
    out
}

fn make_nic_rb(d: &mut Device, c: &Comm) -> emp::Result<Vec<Box<dyn Coll>>> {
    rb_schemes(c.size()).into_iter().map(|(label, algo)| nic_variant(d, c, label, NicWhat::Rbcast(algo))).collect()
}

/// The variants `--algo` names for `kind` (all that run it when empty), the
/// baseline first.
pub fn select(kind: Kind, algo: &[String]) -> Result<Vec<&'static Variant>, String> {
    let runs = |v: &&Variant| v.kinds.contains(&kind);
    let known = || VARIANTS.iter().filter(runs).map(|v| v.name).collect::<Vec<_>>().join(", ");
    let mut names: Vec<&str> = if algo.is_empty() {
        VARIANTS.iter().filter(runs).map(|v| v.name).collect()
    } else {
        algo.iter().map(String::as_str).collect()
    };
    names.retain(|&n| n != baseline(kind));
    names.insert(0, baseline(kind));
    names.dedup();
    names
        .into_iter()
        .map(|n| match VARIANTS.iter().find(|v| v.name == n) {
            Some(v) if runs(&v) => Ok(v),
            Some(_) => Err(format!("--algo {n} does not run {}; it has: {}", kind.name(), known())),
            None => Err(format!("unknown --algo {n}; {} has: {}", kind.name(), known())),
        })
        .collect()
}

/// `--algo list`: the variants that run `kind`, with what they are.
pub fn list(kind: Kind) {
    println!("# variants of {} (baseline: {})", kind.name(), baseline(kind));
    for v in VARIANTS.iter().filter(|v| v.kinds.contains(&kind)) {
        println!("{:<16} {}", v.name, v.about);
    }
}

/// Default `--sizes`: bytes for broadcasts, elements for reductions.
pub fn default_sizes(k: Kind) -> Vec<usize> {
    match k {
        Kind::Bcast => vec![1, 1024, 16384, 65536],
        Kind::BcastSkew => vec![1, 2048],
        Kind::BcastTput => vec![1, 1024],
        Kind::Allreduce | Kind::Reduce => vec![1, 8, 64],
        _ => vec![0],
    }
}

fn default_iters(k: Kind) -> usize {
    match k {
        Kind::Bcast | Kind::BcastSkew | Kind::BcastTput => 1000,
        _ => 10_000,
    }
}

/// Blocking waits unless `--poll`, or when ranks outnumber the 2 cores.
fn wait_mode(a: &BenchArgs, n: usize) -> Wait {
    if a.poll {
        Wait::Poll
    } else if a.blocking || n > 2 {
        Wait::Block
    } else {
        Wait::Poll
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Longest wait for a benchmark-level work request (the bcast answers).
const BENCH_WR_TIMEOUT: Duration = Duration::from_secs(120);

/// Bench-level 0-byte answers (bcast): user tag space, one tag per iteration.
const ACK_TAG: u64 = 0x00BE << 48;
const ACK_WR: u64 = 0x00BE << 48;

/// A table: one row per size, one column per variant, then FoI columns.
struct Table {
    title: String,
    row_name: &'static str,
    cols: Vec<String>,
    rows: Vec<(String, Vec<f64>)>,
}

impl Table {
    fn print(&self) {
        println!("# {}", self.title);
        let w: Vec<usize> = self.cols.iter().map(|c| c.chars().count().max(11) + 1).collect();
        let foi: Vec<String> = self.cols.iter().skip(1).map(|c| format!("FoI {c}")).collect();
        let fw: Vec<usize> = foi.iter().map(|c| c.chars().count().max(8) + 1).collect();
        let mut h = format!("# {:<8}", self.row_name);
        for (c, w) in self.cols.iter().zip(&w) {
            h.push_str(&format!("{c:>w$}"));
        }
        for (c, w) in foi.iter().zip(&fw) {
            h.push_str(&format!("{c:>w$}"));
        }
        println!("{h}");
        for (label, vals) in &self.rows {
            let mut line = format!("{label:<10}");
            for (v, w) in vals.iter().zip(&w) {
                line.push_str(&format!("{v:>w$.2}"));
            }
            for (v, w) in vals.iter().skip(1).zip(&fw) {
                line.push_str(&format!("{:>w$.3}", vals[0] / v));
            }
            println!("{line}");
        }
    }
}

/// One rank's state for a collective benchmark.
struct Bench {
    dev: Device,
    /// The communicator host variants run on.
    comm: Comm,
    /// Timing barriers and result gathering (its own context).
    ctl: Comm,
    job: Job,
    a: BenchArgs,
    wait: Wait,
    tables: Vec<Table>,
    /// JSON records: {variant, size, dtype, metric, value, foi}.
    records: Vec<Json>,
}

impl Bench {
    fn n(&self) -> usize {
        self.job.size
    }

    fn sync(&mut self) -> Result<(), String> {
        self.ctl.barrier_dissemination(&mut self.dev).map_err(|e| format!("timing barrier: {e}"))
    }

    /// Every rank's `v`, averaged element by element (on rank 0's copy and
    /// everyone else's).
    fn mean_over_ranks(&mut self, v: &[f64]) -> Result<Vec<f64>, String> {
        let mine: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut sum = vec![0u8; mine.len()];
        self.ctl
            .allreduce(&mut self.dev, Dtype::F64, ReduceOp::Sum, &mine, &mut sum)
            .map_err(|e| format!("gathering results: {e}"))?;
        let n = self.n() as f64;
        Ok(sum.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8")) / n).collect())
    }

    fn table(
        &mut self,
        title: String,
        row_name: &'static str,
        cols: &[String],
        rows: Vec<(String, Vec<f64>)>,
        metric: &str,
        dtype: Option<Dtype>,
    ) {
        for (label, vals) in &rows {
            for (c, v) in cols.iter().zip(vals) {
                self.records.push(Json::Obj(vec![
                    ("variant", Json::str(c)),
                    ("size", label.parse::<u64>().map_or(Json::Null, Json::Int)),
                    ("dtype", dtype.map_or(Json::Null, |t| Json::str(t.name()))),
                    ("metric", Json::str(metric)),
                    ("value", Json::Num(*v, 4)),
                    ("foi", Json::Num(vals[0] / v, 4)),
                ]));
            }
        }
        self.tables.push(Table { title, row_name, cols: cols.to_vec(), rows });
    }

    fn iters(&self) -> (usize, usize) {
        let n = self.a.iters.unwrap_or(default_iters(self.a.kind));
        (n, (n / 10).clamp(5, 1000))
    }

    fn barrier(&mut self, vs: &mut [Box<dyn Coll>]) -> Result<(), String> {
        let (iters, warm) = self.iters();
        let mut times = Vec::with_capacity(vs.len());
        for v in vs.iter_mut() {
            let label = v.label();
            let e = |e: emp::Error| format!("{label}: {e}");
            for _ in 0..warm {
                v.barrier(&mut self.dev, &mut self.comm).map_err(e)?;
            }
            self.sync()?;
            let t0 = Instant::now();
            for _ in 0..iters {
                v.barrier(&mut self.dev, &mut self.comm).map_err(e)?;
            }
            times.push(t0.elapsed().as_secs_f64() * 1e6 / iters as f64);
        }
        let mean = self.mean_over_ranks(&times)?;
        let cols: Vec<String> = vs.iter().map(|v| v.label()).collect();
        let title = format!("barrier: {iters} consecutive barriers, mean time per barrier per rank (us)");
        self.table(title, "", &cols, vec![("barrier".into(), mean)], "time_us", None);
        Ok(())
    }

    /// Ranks (= relative ranks, the root is 0) that are leaves and the last
    /// child of their parent.
    fn closing_leaves(tree: &Tree) -> Vec<usize> {
        (1..tree.len())
            .filter(|&r| {
                tree.children[r].is_empty()
                    && tree.parent[r].is_some_and(|p| tree.children[p as usize].last() == Some(&(r as u16)))
            })
            .collect()
    }

    /// Waits for one of the benchmark's own work requests (not the
    /// variant's) as the variants wait.
    fn wait_wr(&mut self, wr: u64, what: &str) -> Result<(), String> {
        Waiter::new(self.wait, BENCH_WR_TIMEOUT).ok(&mut self.dev, wr, what).map(drop)
    }

    /// The root's mean iteration time (us) of bcast + the 0-byte answer of
    /// one of `answerers`, iteration i answered by `answerers[i % len]`; 0
    /// on other ranks.
    fn bcast_leaf(
        &mut self,
        v: &mut dyn Coll,
        buf: MemSpan,
        answerers: &[usize],
        iters: usize,
        warm: usize,
    ) -> Result<f64, String> {
        let rank = self.job.rank;
        let members = self.comm.members().to_vec();
        let label = v.label();
        let mut acks: VecDeque<u64> = VecDeque::new();
        self.sync()?;
        let mut t0 = Instant::now();
        for i in 0..warm + iters {
            if i == warm {
                t0 = Instant::now();
            }
            let (tag, wr) = (ACK_TAG | i as u64, ACK_WR | i as u64);
            let leaf = answerers[i % answerers.len()];
            if rank == 0 {
                self.dev.post_recv(wr, members[leaf], tag, 0, &[]).map_err(err)?;
            }
            v.bcast(&mut self.dev, &mut self.comm, 0, buf).map_err(|e| format!("{label}: {e}"))?;
            if rank == 0 {
                self.wait_wr(wr, "answer from the leaf")?;
            } else if rank == leaf {
                self.dev.post_send(wr, members[0], tag, &[]).map_err(err)?;
                acks.push_back(wr);
                // Reap answers already acknowledged, without waiting.
                while let Some(&w) = acks.front() {
                    match self.dev.poll_wr(w) {
                        Some(c) if c.status != Status::Success => {
                            return Err(format!("answer to the root: {}", c.status.as_str()))
                        }
                        Some(_) => {
                            acks.pop_front();
                        }
                        None => break,
                    }
                }
            }
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
        while let Some(w) = acks.pop_front() {
            self.wait_wr(w, "answer to the root")?;
        }
        Ok(if rank == 0 { us } else { 0.0 })
    }

    fn sizes(&self) -> Vec<usize> {
        if self.a.sizes.is_empty() {
            default_sizes(self.a.kind)
        } else {
            self.a.sizes.clone()
        }
    }

    fn bcast(&mut self, vs: &mut [Box<dyn Coll>]) -> Result<(), String> {
        let (iters, warm) = self.iters();
        let sizes = self.sizes();
        let buf = self.dev.alloc(sizes.iter().copied().max().unwrap_or(0)).map_err(err)?;
        let mut rows = Vec::new();
        let n = self.n();
        let leaves_used: Vec<String> =
            vs.iter().map(|v| format!("{} {:?}", v.label(), Self::closing_leaves(&v.bcast_tree(n)))).collect();
        let receivers: Vec<usize> = (1..n).collect();
        for &size in &sizes {
            let mut row = Vec::new();
            for v in vs.iter_mut() {
                let b = buf.range(0, size);
                if self.a.turns {
                    row.push(self.bcast_leaf(v.as_mut(), b, &receivers, iters, warm)?);
                    continue;
                }
                let mut worst: f64 = 0.0;
                for leaf in Self::closing_leaves(&v.bcast_tree(n)) {
                    worst = worst.max(self.bcast_leaf(v.as_mut(), b, &[leaf], iters, warm)?);
                }
                row.push(worst);
            }
            rows.push((size.to_string(), row));
        }
        let cols: Vec<String> = vs.iter().map(|v| v.label()).collect();
        let title = if self.a.turns {
            format!(
                "bcast from rank 0 + 0-byte answer, the {} receivers taking turns, {iters} iterations, mean iteration (us at the root)",
                n - 1
            )
        } else {
            format!(
                "bcast from rank 0 + 0-byte answer from a leaf, {iters} iterations, max over last-child leaves (us at the root); leaves {}",
                leaves_used.join("; ")
            )
        };
        self.table(title, "Size", &cols, rows, "time_us", None);
        Ok(())
    }

    fn bcast_skew(&mut self, vs: &mut [Box<dyn Coll>]) -> Result<(), String> {
        let (iters, warm) = self.iters();
        let sizes = self.sizes();
        let skew_max = Duration::from_secs_f64(3.0 * self.a.skew_us / 1e6);
        let buf = self.dev.alloc(sizes.iter().copied().max().unwrap_or(0)).map_err(err)?;
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (self.job.rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        let mut rows = Vec::new();
        for &size in &sizes {
            let b = buf.range(0, size);
            let mut mine = Vec::new();
            for v in vs.iter_mut() {
                let label = v.label();
                let mut inside = Duration::ZERO;
                for trial in 0..warm + iters {
                    self.sync()?;
                    if self.job.rank != 0 {
                        let until = Instant::now() + skew_max.mul_f64(rng.unit());
                        while Instant::now() < until {
                            // Busy, but the ranks share two cores.
                            std::thread::yield_now();
                        }
                    }
                    let t0 = Instant::now();
                    v.bcast(&mut self.dev, &mut self.comm, 0, b).map_err(|e| format!("{label}: {e}"))?;
                    if trial >= warm {
                        inside += t0.elapsed();
                    }
                }
                mine.push(inside.as_secs_f64() * 1e6 / iters as f64);
            }
            rows.push((size.to_string(), self.mean_over_ranks(&mine)?));
        }
        let cols: Vec<String> = vs.iter().map(|v| v.label()).collect();
        let title = format!(
            "bcast-skew: {iters} trials, non-roots delayed U[0, {:.0}] us (mean pairwise skew {:.0} us); mean time inside bcast over ranks (us)",
            3.0 * self.a.skew_us,
            self.a.skew_us
        );
        self.table(title, "Size", &cols, rows, "time_in_call_us", None);
        Ok(())
    }

    /// Back-to-back broadcasts from rank 0 between two timing barriers: the
    /// root's time per broadcast (us). Every rank calls each broadcast in
    /// turn, as an MPI program's loop of `MPI_Bcast` does.
    fn bcast_tput(&mut self, vs: &mut [Box<dyn Coll>]) -> Result<(), String> {
        let (iters, warm) = self.iters();
        let sizes = self.sizes();
        let buf = self.dev.alloc(sizes.iter().copied().max().unwrap_or(0)).map_err(err)?;
        let mut rows = Vec::new();
        for &size in &sizes {
            let b = buf.range(0, size);
            let mut row = Vec::new();
            for v in vs.iter_mut() {
                let label = v.label();
                for _ in 0..warm {
                    v.bcast(&mut self.dev, &mut self.comm, 0, b).map_err(|e| format!("{label}: {e}"))?;
                }
                self.sync()?;
                let t0 = Instant::now();
                for _ in 0..iters {
                    v.bcast(&mut self.dev, &mut self.comm, 0, b).map_err(|e| format!("{label}: {e}"))?;
                }
                // Finished: every receiver has every broadcast.
                self.sync()?;
                row.push(t0.elapsed().as_secs_f64() * 1e6 / iters as f64);
            }
            rows.push((size.to_string(), row));
        }
        let cols: Vec<String> = vs.iter().map(|v| v.label()).collect();
        let title = format!(
            "bcast-tput: {iters} back-to-back bcasts from rank 0 between two barriers, time per bcast (us at the root; bcasts/s = 1e6 / it)"
        );
        self.table(title, "Size", &cols, rows, "us_per_bcast", None);
        Ok(())
    }

    fn dtypes(&self) -> Result<Vec<Dtype>, String> {
        let names: Vec<String> =
            if self.a.dtypes.is_empty() { vec!["i64".into(), "f64".into()] } else { self.a.dtypes.clone() };
        names
            .iter()
            .map(|s| {
                Dtype::ALL
                    .into_iter()
                    .find(|t| t.name() == s)
                    .ok_or_else(|| format!("unknown --dtypes {s} (i32, i64, u32, u64, f32, f64)"))
            })
            .collect()
    }

    /// Rank `r`'s input vector of `count` elements.
    fn input(t: Dtype, r: usize, count: usize) -> Vec<u8> {
        (0..count)
            .flat_map(|i| match t {
                Dtype::I32 => ((r * 1000 + i) as i32).to_le_bytes().to_vec(),
                Dtype::U32 => ((r * 1000 + i) as u32).to_le_bytes().to_vec(),
                Dtype::I64 => ((r * 1000 + i) as i64 - 7).to_le_bytes().to_vec(),
                Dtype::U64 => ((r * 1000 + i) as u64).to_le_bytes().to_vec(),
                Dtype::F32 => (1.0f32 / (r + 1) as f32 + i as f32).to_le_bytes().to_vec(),
                Dtype::F64 => (1.0f64 / (r + 1) as f64 + i as f64 * 0.1).to_le_bytes().to_vec(),
            })
            .collect()
    }

    /// One call of the reduction benchmark: allreduce, or reduce to rank 0.
    fn reduction(&mut self, v: &mut dyn Coll, t: Dtype, send: &[u8], recv: &mut [u8]) -> emp::Result<()> {
        if self.a.kind == Kind::Reduce {
            let out = (self.job.rank == 0).then_some(recv);
            v.reduce(&mut self.dev, &mut self.comm, 0, t, ReduceOp::Sum, send, out)
        } else {
            v.allreduce(&mut self.dev, &mut self.comm, t, ReduceOp::Sum, send, recv)
        }
    }

    fn reductions(&mut self, vs: &mut [Box<dyn Coll>]) -> Result<(), String> {
        let (iters, warm) = self.iters();
        let n = self.n();
        let what = if self.a.kind == Kind::Reduce { "reduce to rank 0" } else { "allreduce" };
        let parent = Tree::binomial(n).parent;
        for t in self.dtypes()? {
            let (mut wall_rows, mut cpu_rows) = (Vec::new(), Vec::new());
            for count in self.sizes() {
                let inputs: Vec<Vec<u8>> = (0..n).map(|r| Self::input(t, r, count)).collect();
                let want = reduce_ref(t, ReduceOp::Sum, &parent, &inputs).map_err(err)?;
                let mine = inputs[self.job.rank].clone();
                let mut out = vec![0u8; mine.len()];
                let mut per = Vec::new();
                for v in vs.iter_mut() {
                    let label = v.label();
                    // Correct first: bit-equal to the reference fold.
                    self.reduction(v.as_mut(), t, &mine, &mut out).map_err(|e| format!("{label}: {e}"))?;
                    let checked = self.a.kind == Kind::Allreduce || self.job.rank == 0;
                    if checked && out != want {
                        return Err(format!(
                            "{label}: {what} of {count} × {} differs from reduce_ref on rank {}",
                            t.name(),
                            self.job.rank
                        ));
                    }
                    for _ in 0..warm {
                        self.reduction(v.as_mut(), t, &mine, &mut out).map_err(|e| format!("{label}: {e}"))?;
                    }
                    let (mut wall, mut cpu) = (0f64, 0u64);
                    for _ in 0..iters {
                        self.sync()?;
                        let (t0, c0) = (Instant::now(), thread_cpu_ns());
                        self.reduction(v.as_mut(), t, &mine, &mut out).map_err(|e| format!("{label}: {e}"))?;
                        cpu += thread_cpu_ns() - c0;
                        wall += t0.elapsed().as_secs_f64();
                    }
                    per.push(wall * 1e6 / iters as f64);
                    per.push(cpu as f64 / 1e3 / iters as f64);
                }
                let mean = self.mean_over_ranks(&per)?;
                wall_rows.push((count.to_string(), mean.iter().step_by(2).copied().collect()));
                cpu_rows.push((count.to_string(), mean.iter().skip(1).step_by(2).copied().collect()));
            }
            let cols: Vec<String> = vs.iter().map(|v| v.label()).collect();
            let head = format!(
                "{what}, {} sum, per iteration a barrier then the call, {iters} iterations, mean over ranks",
                t.name()
            );
            self.table(
                format!("{head}: wall time inside the call (us)"),
                "Count",
                &cols,
                wall_rows,
                "time_in_call_us",
                Some(t),
            );
            self.table(
                format!("{head}: host CPU time inside the call (us)"),
                "Count",
                &cols,
                cpu_rows,
                "cpu_in_call_us",
                Some(t),
            );
        }
        Ok(())
    }
}

/// One rank of a collective benchmark (`emp bench-rank barrier|…`).
pub(super) fn rank(a: &BenchArgs, job: Job) -> Result<(), String> {
    let n = job.size;
    let mut dev = Device::open().map_err(err)?;
    let eps = job.endpoints(dev.endpoint()).map_err(err)?;
    let wait = wait_mode(a, n);
    let opts = |context| CommOpts { context, wait, timeout: Duration::from_secs(300), ..CommOpts::default() };
    let comm = Comm::with_opts(&mut dev, &eps, job.rank, opts(0)).map_err(err)?;
    let ctl = Comm::with_opts(&mut dev, &eps, job.rank, opts(0xFE)).map_err(err)?;
    let mut vs: Vec<Box<dyn Coll>> = Vec::new();
    for v in select(a.kind, &a.algo)? {
        vs.extend((v.make)(&mut dev, &comm).map_err(|e| format!("setting up {}: {e}", v.name))?);
    }
    if a.kind != Kind::Barrier && n < 2 {
        return Err("broadcasts and reductions need --nodes 2 or more".into());
    }
    let mut b = Bench { dev, comm, ctl, job, a: a.clone(), wait, tables: Vec::new(), records: Vec::new() };
    match a.kind {
        Kind::Barrier => b.barrier(&mut vs)?,
        Kind::Bcast => b.bcast(&mut vs)?,
        Kind::BcastSkew => b.bcast_skew(&mut vs)?,
        Kind::BcastTput => b.bcast_tput(&mut vs)?,
        Kind::Allreduce | Kind::Reduce => b.reductions(&mut vs)?,
        k => return Err(format!("{} is not a collective benchmark", k.name())),
    }
    b.sync()?;
    b.comm.flush(&mut b.dev).map_err(err)?;
    b.ctl.flush(&mut b.dev).map_err(err)?;
    if b.job.rank == 0 {
        b.report();
    }
    Ok(())
}

impl Bench {
    /// Rank 0's report: every table, or with `--json` one document of
    /// every table's records.
    fn report(&self) {
        let (kind, n) = (self.a.kind, self.n());
        if self.a.json {
            print_json(&Json::Obj(vec![
                ("benchmark", Json::str(kind.name())),
                ("nodes", Json::Int(n as u64)),
                ("wait", Json::str(if self.wait == Wait::Block { "block" } else { "poll" })),
                ("baseline", Json::str(baseline(kind))),
                ("records", Json::Arr(self.records.clone())),
            ]));
            return;
        }
        let waits = if self.wait == Wait::Block { "blocking (arm + eventfd)" } else { "polling" };
        println!(
            "# EMP {}: {n} ranks, one per NIC on an emp-nicd chassis; waits: {waits}; FoI = {} / variant",
            kind.name(),
            baseline(kind)
        );
        for t in &self.tables {
            t.print();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_baseline_comes_first_and_unknown_names_are_refused() {
        let names = |k, a: &[&str]| {
            select(k, &a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map(|v| v.iter().map(|v| v.name).collect::<Vec<_>>())
        };
        assert_eq!(
            names(Kind::Barrier, &[]).unwrap(),
            ["host-pe", "host-diss", "host-gb", "nic-pe", "nic-diss", "nic-gr"]
        );
        assert_eq!(names(Kind::Barrier, &["host-gb"]).unwrap(), ["host-pe", "host-gb"]);
        assert_eq!(names(Kind::Barrier, &["nic-pe"]).unwrap(), ["host-pe", "nic-pe"]);
        assert_eq!(names(Kind::Allreduce, &[]).unwrap(), ["host-binomial", "nic"]);
        assert_eq!(names(Kind::Bcast, &["host-postal", "host-binomial"]).unwrap(), ["host-binomial", "host-postal"]);
        let e = names(Kind::Allreduce, &["host-postal"]).unwrap_err();
        assert!(e.contains("does not run allreduce") && e.contains("host-binomial"), "{e}");
        assert!(names(Kind::Barrier, &["nic"]).unwrap_err().contains("does not run barrier"));
        assert!(names(Kind::Barrier, &["nic-foo"]).unwrap_err().contains("unknown --algo nic-foo"));
    }

    #[test]
    fn sweeps_skip_duplicate_trees_and_leaves_close_iterations() {
        // 4 ranks: λ = 2 and above all give the flat tree.
        assert_eq!(postal_sweep(4, 1, false).iter().map(|(l, _)| *l).collect::<Vec<_>>(), [1, 2]);
        assert!(postal_sweep(2, 2, true).is_empty(), "2 ranks: every tree is the binomial one");
        // Binomial over 8: 0→[1,2,4] 1→[3,5] 2→[6] 3→[7]; last-child leaves 4, 5, 6, 7.
        assert_eq!(Bench::closing_leaves(&Tree::binomial(8)), [4, 5, 6, 7]);
        // Flat tree: only the last child closes an iteration.
        assert_eq!(Bench::closing_leaves(&Tree::postal(4, 2)), [3]);
    }

    #[test]
    fn rb_schemes_fit_the_group_and_answer_from_one_multicast() {
        let labels = |n| rb_schemes(n).into_iter().map(|(l, _)| l).collect::<Vec<_>>();
        assert_eq!(labels(8), ["rb-window", "rb-coroot(1)", "rb-coroot(3)", "rb-ack10", "rb-nak", "rb-hybrid10"]);
        // 3 ranks: one co-root leaves a sub-group of 1 (itself); 3 do not fit.
        assert_eq!(labels(3), ["rb-window", "rb-coroot(1)", "rb-ack10", "rb-nak", "rb-hybrid10"]);
        assert_eq!(labels(2), ["rb-window", "rb-ack10", "rb-nak", "rb-hybrid10"]);
        let algos: Vec<_> = rb_schemes(16).into_iter().map(|(_, a)| (a.coroots, a.ack_every, a.nak)).collect();
        assert_eq!(algos, [(0, 1, false), (1, 1, false), (3, 1, false), (0, 10, false), (0, 0, true), (0, 10, true)]);
        // Every receiver hangs off the root: the flat tree.
        let t = flat_tree(16);
        assert_eq!(t.children[0].len(), 15);
        assert_eq!(Bench::closing_leaves(&t), [15]);
        let names = select(Kind::BcastTput, &["nic-rb".to_string()]).unwrap();
        assert_eq!(names.iter().map(|v| v.name).collect::<Vec<_>>(), ["host-binomial", "nic-rb"]);
        let e = select(Kind::Allreduce, &["nic-rb".to_string()]).err().expect("refused");
        assert!(e.contains("does not run allreduce"), "{e}");
    }
}
