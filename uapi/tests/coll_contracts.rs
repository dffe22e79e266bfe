//! The collective contracts of `emp-uapi` that are not codecs (those are in
//! `proptest_codecs.rs`):
//!
//! * `coll::barrier_step`: never panics; every schedule is finite and stays
//!   finished; sends and receives pair up exactly; simulated as a network of
//!   ranks, pairwise exchange and dissemination never deadlock and no rank
//!   finishes before every rank has arrived (knowledge propagation), for
//!   every group size up to twice `GROUP_MEMBERS_MAX`; step counts and
//!   round numbers are the documented ones.
//! * `coll::tree_valid` accepts exactly the parent arrays that are trees
//!   (checked against an independent definition), `rel_rank` / `abs_rank`
//!   are inverse.
//! * The enum decoders (`Dtype`, `ReduceOp`, `BarrierAlgo`, `CollKind`,
//!   `Opcode`, `Status`, `FrameKind`, `NackReason`, `AdminOp`) round-trip,
//!   `reduce_tag` and `reduce_tag_parts` are inverse, `Status::as_cstr` texts
//!   are distinct and non-empty, `counter::NAMES` is complete.

use std::collections::{BTreeMap, VecDeque};

use proptest::collection::vec;
use proptest::prelude::*;

use emp_uapi::coll::*;
use emp_uapi::desc::{Opcode, Status};
use emp_uapi::sram::{counter, AdminOp};
use emp_uapi::wire::{FrameKind, NackReason};

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------
// Barrier schedules
// ---------------------------------------------------------------------------

/// Longer than any schedule can be (2 steps per round, ≤ 16 rounds, + 2).
const STEPS_MAX: usize = 40;

fn schedule(algo: BarrierAlgo, n: u16, rank: u16) -> Vec<Step> {
    let s: Vec<Step> = (0..STEPS_MAX).map_while(|i| barrier_step(algo, n, rank, i)).collect();
    // Finished means finished: no step after the first None.
    for i in s.len()..s.len() + 8 {
        assert_eq!(barrier_step(algo, n, rank, i), None, "{algo:?} n={n} rank={rank}: step {i} after the end");
    }
    s
}

fn log2_floor(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

fn log2_ceil(n: usize) -> usize {
    if n <= 1 {
        0
    } else {
        log2_floor(n - 1) + 1
    }
}

/// Runs every rank's schedule as a process with FIFO channels per
/// (from, to, round). A message carries the set of ranks its sender knows
/// to have arrived. Returns each rank's knowledge when it finished, or
/// why the run got stuck.
fn simulate(algo: BarrierAlgo, n: u16) -> Result<Vec<u128>, String> {
    assert!(n as usize <= 128);
    let scheds: Vec<Vec<Step>> = (0..n).map(|r| schedule(algo, n, r)).collect();
    let mut pc = vec![0usize; n as usize];
    let mut know: Vec<u128> = (0..n).map(|r| 1u128 << r).collect();
    let mut chan: BTreeMap<(u16, u16, u8), VecDeque<u128>> = BTreeMap::new();
    loop {
        let mut progressed = false;
        for r in 0..n as usize {
            while let Some(step) = scheds[r].get(pc[r]) {
                match *step {
                    Step::Send { to, round } => {
                        chan.entry((r as u16, to, round)).or_default().push_back(know[r]);
                    }
                    Step::Recv { from, round } => {
                        match chan.get_mut(&(from, r as u16, round)).and_then(|q| q.pop_front()) {
                            Some(k) => know[r] |= k,
                            None => break,
                        }
                    }
                }
                pc[r] += 1;
                progressed = true;
            }
        }
        if (0..n as usize).all(|r| pc[r] == scheds[r].len()) {
            break;
        }
        if !progressed {
            let stuck: Vec<_> =
                (0..n as usize).filter(|&r| pc[r] < scheds[r].len()).map(|r| (r, scheds[r][pc[r]])).collect();
            return Err(format!("deadlock; waiting: {stuck:?}"));
        }
    }
    let left: Vec<_> = chan.iter().filter(|(_, q)| !q.is_empty()).map(|(k, q)| (*k, q.len())).collect();
    if !left.is_empty() {
        return Err(format!("messages never received: {left:?}"));
    }
    Ok(know)
}

#[test]
fn barriers_synchronise_every_group_size() {
    for algo in [BarrierAlgo::PairwiseExchange, BarrierAlgo::Dissemination] {
        for n in 1..=(2 * GROUP_MEMBERS_MAX).min(128) as u16 {
            let all = if n == 128 { u128::MAX } else { (1u128 << n) - 1 };
            let know = simulate(algo, n).unwrap_or_else(|e| panic!("{algo:?} n={n}: {e}"));
            for (r, k) in know.iter().enumerate() {
                assert_eq!(*k, all, "{algo:?} n={n}: rank {r} finished before every rank arrived");
            }
        }
    }
}

#[test]
fn barrier_step_counts_and_rounds() {
    for n in 1..=300u16 {
        let nn = n as usize;
        let s = 1usize << log2_floor(nn);
        for r in 0..n {
            let rr = r as usize;
            // Dissemination: ⌈log2 N⌉ rounds, send then receive, round k
            // with the ranks 2^k away.
            let d = schedule(BarrierAlgo::Dissemination, n, r);
            assert_eq!(d.len(), 2 * log2_ceil(nn), "dissemination n={n} r={r}");
            for (i, st) in d.iter().enumerate() {
                let k = i / 2;
                let dist = 1usize << k;
                let want = if i % 2 == 0 {
                    Step::Send { to: ((rr + dist) % nn) as u16, round: k as u8 }
                } else {
                    Step::Recv { from: ((rr + nn - dist % nn) % nn) as u16, round: k as u8 }
                };
                assert_eq!(*st, want, "dissemination n={n} r={r} step {i}");
            }
            // Pairwise exchange.
            let p = schedule(BarrierAlgo::PairwiseExchange, n, r);
            let want_len = if rr >= s { 2 } else { 2 * log2_floor(s) + if rr + s < nn { 2 } else { 0 } };
            assert_eq!(p.len(), want_len, "pairwise exchange n={n} r={r}");
            assert!(p.len() <= 2 * log2_floor(nn) + 2, "more than ⌊log2 N⌋ + 1 rounds");
            for st in &p {
                let (peer, round) = match *st {
                    Step::Send { to, round } => (to, round),
                    Step::Recv { from, round } => (from, round),
                };
                assert!(peer < n && peer != r, "pairwise exchange n={n} r={r}: peer {peer}");
                assert!(round < 16 || round == PE_PRE || round == PE_RELEASE, "round {round}");
                if round < 16 {
                    assert_eq!(peer as usize, rr ^ (1 << round), "exchange partner");
                }
            }
            if rr >= s {
                let partner = (rr - s) as u16;
                assert_eq!(
                    p,
                    [Step::Send { to: partner, round: PE_PRE }, Step::Recv { from: partner, round: PE_RELEASE }]
                );
            }
            // Gather-release has no schedule of its own (it follows a tree).
            assert_eq!(barrier_step(BarrierAlgo::GatherRelease, n, r, 0), None);
        }
        // Ranks outside the group have no steps.
        for algo in [BarrierAlgo::PairwiseExchange, BarrierAlgo::Dissemination] {
            assert_eq!(barrier_step(algo, n, n, 0), None);
            assert_eq!(barrier_step(algo, 0, 0, 0), None);
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// Any inputs, including huge indices and ranks outside the group.
    #[test]
    fn barrier_step_never_panics(algo in 0u16..3, n in any::<u16>(), rank in any::<u16>(), index in any::<usize>()) {
        let algo = BarrierAlgo::from_u16(algo).unwrap();
        if let Some(st) = barrier_step(algo, n, rank, index) {
            prop_assert!(rank < n);
            let peer = match st {
                Step::Send { to, .. } => to,
                Step::Recv { from, .. } => from,
            };
            prop_assert!(peer < n);
        }
        let _ = barrier_step(algo, n, rank, index % STEPS_MAX);
    }

    /// Sends and receives pair up: every (from, to, round) is sent exactly
    /// as often as it is received, for large groups too.
    #[test]
    fn barrier_sends_match_receives(algo in 0u16..2, n in 1u16..2000) {
        let algo = BarrierAlgo::from_u16(algo).unwrap();
        let mut balance: BTreeMap<(u16, u16, u8), i32> = BTreeMap::new();
        for r in 0..n {
            for st in schedule(algo, n, r) {
                match st {
                    Step::Send { to, round } => *balance.entry((r, to, round)).or_default() += 1,
                    Step::Recv { from, round } => *balance.entry((from, r, round)).or_default() -= 1,
                }
            }
        }
        let bad: Vec<_> = balance.iter().filter(|(_, &b)| b != 0).take(5).collect();
        prop_assert!(bad.is_empty(), "unmatched messages: {:?}", bad);
    }
}

// ---------------------------------------------------------------------------
// Trees and relative ranks
// ---------------------------------------------------------------------------

/// Independent definition: every rank reaches the root following parents
/// (depth by relaxation), the root is marked, every parent is a rank < n.
fn is_tree(parent: &[u8], n: usize) -> bool {
    if n == 0 || parent.len() < n || parent[0] != TREE_ROOT {
        return false;
    }
    let mut reached = vec![false; n];
    reached[0] = true;
    for _ in 0..n {
        for r in 1..n {
            let p = parent[r] as usize;
            if p < n && reached[p] {
                reached[r] = true;
            }
        }
    }
    reached.iter().all(|&x| x)
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A random tree over `n` relative ranks (parents not always smaller).
fn random_tree(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut order: Vec<u8> = (0..n as u8).collect();
    for i in (2..n).rev() {
        let j = 1 + (next(&mut x) % i as u64) as usize;
        order.swap(i, j);
    }
    let mut parent = vec![0u8; n];
    parent[0] = TREE_ROOT;
    for i in 1..n {
        parent[order[i] as usize] = order[(next(&mut x) % i as u64) as usize];
    }
    parent
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn tree_valid_arbitrary(parent in vec(any::<u8>(), 0..70), n in 0usize..72) {
        prop_assert_eq!(tree_valid(&parent, n), is_tree(&parent, n));
    }

    /// Arrays close to trees: a random tree with one entry changed.
    #[test]
    fn tree_valid_near_trees(n in 1usize..=64, seed in any::<u64>(), at in any::<usize>(), v in any::<u8>(), small in any::<bool>()) {
        let mut parent = random_tree(n, seed);
        prop_assert!(tree_valid(&parent, n), "random tree refused: {:?}", parent);
        let v = if small { v % (n as u8 + 2) } else { v };
        parent[at % n] = v;
        prop_assert_eq!(tree_valid(&parent, n), is_tree(&parent, n), "{:?}", parent);
        // A prefix of a tree over fewer ranks is judged on those ranks only.
        let m = 1 + at % n;
        prop_assert_eq!(tree_valid(&parent, m), is_tree(&parent, m));
    }

    #[test]
    fn relative_ranks_are_inverse(n in 1u16..=u16::MAX, root in any::<u16>(), rank in any::<u16>()) {
        let (root, rank) = (root % n, rank % n);
        let rel = rel_rank(rank, root, n);
        prop_assert!(rel < n);
        prop_assert_eq!(abs_rank(rel, root, n), rank);
        prop_assert_eq!(rel_rank(root, root, n), 0);
        prop_assert_eq!(abs_rank(0, root, n), root);
    }
}

// ---------------------------------------------------------------------------
// Enums, tags, texts
// ---------------------------------------------------------------------------

#[test]
fn coll_enums_round_trip() {
    let dtypes: Vec<Dtype> = (0..=255).filter_map(Dtype::from_u8).collect();
    assert_eq!(dtypes, Dtype::ALL);
    for t in Dtype::ALL {
        assert_eq!(Dtype::from_u8(t as u8), Some(t));
        assert_eq!(t.size(), if matches!(t, Dtype::I32 | Dtype::U32 | Dtype::F32) { 4 } else { 8 });
        assert_eq!(t.is_float(), matches!(t, Dtype::F32 | Dtype::F64));
    }
    let ops: Vec<ReduceOp> = (0..=255).filter_map(ReduceOp::from_u8).collect();
    assert_eq!(ops, ReduceOp::ALL);
    for op in ReduceOp::ALL {
        let bitwise = matches!(op, ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor);
        for t in Dtype::ALL {
            assert_eq!(op.defined_for(t), !(bitwise && t.is_float()), "{op:?} on {t:?}");
        }
    }
    let mut names: Vec<&str> =
        Dtype::ALL.iter().map(|t| t.name()).chain(ReduceOp::ALL.iter().map(|o| o.name())).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), Dtype::ALL.len() + ReduceOp::ALL.len(), "names distinct");
    for v in 0..=0xFFFFu16 {
        if let Some(a) = BarrierAlgo::from_u16(v) {
            assert_eq!(a as u16, v);
        } else {
            assert!(v > 2);
        }
    }
    for v in 0..=255u8 {
        if let Some(k) = CollKind::from_u8(v) {
            assert_eq!(k as u8, v);
        } else {
            assert!(v == 0 || v > 7);
        }
    }
    const { assert!(PE_PRE >= 16 && PE_RELEASE >= 16 && PE_PRE != PE_RELEASE, "fix-up rounds differ from exchange rounds") };
}

#[test]
fn reduce_tags_round_trip() {
    for t in Dtype::ALL {
        for op in ReduceOp::ALL {
            for tree in 0..=255u8 {
                let tag = reduce_tag(t, op, tree);
                assert!(tag < 1 << 24);
                assert_eq!(reduce_tag_parts(tag), (t as u8, op as u8, tree));
            }
        }
    }
    assert_eq!(reduce_tag(Dtype::F64, ReduceOp::Max, 7), 0x07_04_06);
}

#[test]
fn rbcast_tags_round_trip() {
    use emp_uapi::coll::{rbcast_algo, rbcast_tag, RbcastAlgo, RBCAST_TAG_NAK};
    for coroots in (0..=1100u16).chain([u16::MAX]) {
        for ack_every in [0u8, 1, 10, 255] {
            for window in [0u8, 3, 255] {
                for nak in [false, true] {
                    let a = RbcastAlgo { coroots, ack_every, window, nak };
                    assert_eq!(rbcast_algo(rbcast_tag(a)), Some(a));
                }
            }
        }
    }
    // A tag of the three byte fields alone (before 16-bit co-root counts
    // and NAKs) means what it always did.
    assert_eq!(
        rbcast_algo(7 | 10 << 8 | 4 << 16),
        Some(RbcastAlgo { coroots: 7, ack_every: 10, window: 4, nak: false })
    );
    assert_eq!(rbcast_algo(2 << 24), Some(RbcastAlgo { coroots: 512, ..Default::default() }));
    assert_eq!(rbcast_algo(RBCAST_TAG_NAK), Some(RbcastAlgo { nak: true, ..Default::default() }));
    assert_eq!(rbcast_algo(1 << 33), None, "bits beyond the fields");
}

#[test]
fn wire_and_desc_enums_round_trip() {
    let mut n_ops = 0;
    for v in 0..=255u8 {
        if let Some(op) = Opcode::from_u8(v) {
            n_ops += 1;
            assert_eq!(op as u8, v);
            assert!(!(op.is_collective() && op.is_atomic()));
            assert_eq!(op.is_collective(), (3..=7).contains(&v) || v == 15, "{op:?}");
            assert_eq!(op.is_atomic(), (8..=10).contains(&v), "{op:?}");
            assert_eq!(op.is_rma(), (11..=12).contains(&v), "{op:?}");
            assert_eq!(op.is_remote_access(), (8..=12).contains(&v), "{op:?}");
        }
        if let Some(k) = FrameKind::from_u8(v) {
            assert_eq!(k as u8, v);
        }
        if let Some(r) = NackReason::from_u8(v) {
            assert_eq!(r as u8, v);
        }
    }
    assert_eq!(n_ops, 17);
    assert_eq!((0..=255u8).filter_map(FrameKind::from_u8).count(), 8);
    assert_eq!((0..=255u8).filter_map(NackReason::from_u8).count(), 9);
    for v in 0..64u32 {
        if let Some(a) = AdminOp::from_u32(v) {
            assert_eq!(a as u32, v);
        }
    }
    assert_eq!(AdminOp::from_u32(4), Some(AdminOp::GroupSet));
    assert_eq!(AdminOp::from_u32(5), Some(AdminOp::GroupClear));
}

#[test]
fn status_texts() {
    let all: Vec<Status> = (0..=255u8).filter_map(Status::from_u8).collect();
    assert_eq!(all.len(), 21, "statuses 0..=20");
    let mut texts = Vec::new();
    for (i, s) in all.iter().enumerate() {
        assert_eq!(*s as u8 as usize, i, "statuses are dense");
        let c = s.as_cstr();
        assert!(!c.to_bytes().is_empty(), "{s:?}");
        assert_eq!(s.as_str(), c.to_str().unwrap(), "{s:?}");
        texts.push(s.as_str());
    }
    texts.sort();
    texts.dedup();
    assert_eq!(texts.len(), all.len(), "status texts distinct");
}

#[test]
fn counter_names() {
    assert_eq!(counter::NAMES.len(), counter::COUNT);
    let mut n = counter::NAMES.to_vec();
    n.sort();
    n.dedup();
    assert_eq!(n.len(), counter::COUNT, "counter names distinct");
    assert_eq!(counter::NAMES[counter::COLL_OPS], "coll_ops");
    assert_eq!(counter::NAMES[counter::COLL_EARLY], "coll_early");
    assert_eq!(counter::NAMES[counter::COLL_REFUSED], "coll_refused");
    assert_eq!(counter::NAMES[counter::ATOMIC_REPLAYS], "atomic_replays");
    assert_eq!(counter::NAMES[counter::PEERS_RECLAIMED], "peers_reclaimed");
    assert_eq!(counter::NAMES[counter::REMOTE_REFUSED], "remote_refused");
    assert_eq!(counter::NAMES[counter::REMOTE_THROTTLED], "remote_throttled");
    assert_eq!(counter::NAMES[counter::UNEXP_EAGER], "unexp_eager");
    assert_eq!(counter::NAMES[counter::UNEXP_BYTES], "unexp_bytes");
    assert_eq!(counter::NAMES[counter::UNEXP_RDV], "unexp_rdv");
    assert_eq!(counter::NAMES[counter::RDV_PULLS], "rdv_pulls");
    assert_eq!(counter::NAMES[counter::UNEXP_REFUSED_FULL], "unexp_refused_full");
    assert_eq!(counter::UNEXP_REFUSED_FULL + 1, counter::COUNT);
}
