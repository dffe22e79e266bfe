//! Groups larger than one group table entry (more than 64 members, up to
//! `GROUP_MEMBERS_MAX` = 1024): the real control program runs barrier
//! (every algorithm), broadcast and allreduce over 128 and 256 nodes, and
//! multisend to a rank window past 64; the table refuses a group that does
//! not fit and replaces what a wide group's slots overlapped. The 1024-node
//! run is `#[ignore]`d (minutes of wall time in a debug build); run it with
//! `cargo test --release -p emp-sim --test large_groups -- --ignored --nocapture`.

use std::time::Instant;

use emp_firmware::Config;
use emp_sim::cluster::{binomial_parents_wide, group_encoding, Cluster};
use emp_sim::world::WireConfig;
use emp_uapi::coll::{BarrierAlgo, Dtype, ReduceOp, TREE_ROOT_WIDE};
use emp_uapi::desc::{Cqe, Status};
use emp_uapi::sram::{admin_result, GroupEntry};
use emp_uapi::Le;

const MS: u64 = 1_000_000;

/// Every relative rank under the root: the root has n − 1 children.
fn flat_parents(n: usize) -> Vec<u16> {
    (0..n).map(|r| if r == 0 { TREE_ROOT_WIDE } else { 0 }).collect()
}

/// A 4-ary heap: rank r's parent is (r − 1) / 4.
fn quad_parents(n: usize) -> Vec<u16> {
    (0..n).map(|r| if r == 0 { TREE_ROOT_WIDE } else { ((r - 1) / 4) as u16 }).collect()
}

fn trees(n: usize) -> Vec<Vec<u16>> {
    vec![binomial_parents_wide(n), flat_parents(n), quad_parents(n)]
}

/// `n` nodes in group slot 0 (id 7, epoch 1) over the three trees.
fn group(n: u16, wire: WireConfig) -> Cluster {
    let mut c = Cluster::new(n, Config::default(), 0, 1500, wire);
    let members: Vec<u16> = (0..n).collect();
    let r = c.create_group_wide(0, 7, 1, &members, &trees(n as usize));
    assert!(r.iter().all(|&r| r == admin_result::OK), "group of {n}: {r:?}");
    c
}

fn status(c: &Option<Cqe>) -> Option<Status> {
    c.as_ref().map(|c| Status::from_u8(c.status).expect("known status"))
}

fn all_succeed(c: &mut Cluster, wrs: &[(u16, u64)], what: &str) {
    for (i, cqe) in c.wait_all(wrs, 20_000 * MS).iter().enumerate() {
        assert_eq!(status(cqe), Some(Status::Success), "{what}: rank {}", wrs[i].0);
    }
}

fn quiesced(c: &mut Cluster) {
    c.run_for(200 * MS);
    for n in &c.world.nodes {
        let o = n.nic.occupancy();
        assert_eq!(
            (o.coll_ops, o.coll_bufs_used, o.coll_cache_frames, o.tx_msgs, o.rx_msgs),
            (0, 0, 0, 0, 0),
            "node {} left {o:?}",
            n.nic.node()
        );
        n.nic.invariants().unwrap();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Barrier (each algorithm; gather-release on the binomial and the flat
/// tree), broadcast (multi-frame, from a rank past 64 and from the last,
/// over every tree) and allreduce (u64 sum, binomial and 4-ary) on a group
/// of all `n` nodes, each result checked on every rank.
fn run_collectives(n: u16, wire: WireConfig) {
    let mut c = group(n, wire);
    for (algo, tree) in [
        (BarrierAlgo::PairwiseExchange, 0),
        (BarrierAlgo::Dissemination, 0),
        (BarrierAlgo::GatherRelease, 0),
        (BarrierAlgo::GatherRelease, 1),
    ] {
        let wrs: Vec<(u16, u64)> = (0..n).map(|r| (r, c.barrier(r, 0, algo, tree))).collect();
        all_succeed(&mut c, &wrs, &format!("barrier {algo:?} tree {tree} n={n}"));
    }
    for (root, tree) in [(70u16, 0u8), (n - 1, 1), (0, 2)] {
        let data = pattern(5000, root as u8);
        let wrs: Vec<(u16, u64)> = (0..n).map(|r| (r, c.bcast(r, 0, root, tree, &data, r == root))).collect();
        all_succeed(&mut c, &wrs, &format!("bcast root {root} tree {tree} n={n}"));
        for &(r, wr) in &wrs {
            assert!(c.received(wr, data.len()) == data, "bcast root {root} tree {tree}: rank {r} got other data");
        }
    }
    let count = 4usize;
    for tree in [0u8, 2] {
        let input =
            |r: u16| -> Vec<u8> { (0..count as u64).flat_map(|i| ((r as u64 + 1) * (i + 1)).to_le_bytes()).collect() };
        let wrs: Vec<(u16, u64)> =
            (0..n).map(|r| (r, c.reduce(r, 0, true, 0, Dtype::U64, ReduceOp::Sum, tree, &input(r)))).collect();
        all_succeed(&mut c, &wrs, &format!("allreduce tree {tree} n={n}"));
        let total = n as u64 * (n as u64 + 1) / 2;
        let want: Vec<u8> = (0..count as u64).flat_map(|i| (total * (i + 1)).to_le_bytes()).collect();
        for &(r, wr) in &wrs {
            assert_eq!(c.received(wr, want.len()), want, "allreduce tree {tree} n={n}: rank {r}");
        }
    }
    quiesced(&mut c);
}

#[test]
fn test_collectives_over_128_nodes() {
    run_collectives(128, WireConfig::default());
}

#[test]
fn test_collectives_over_256_nodes() {
    run_collectives(256, WireConfig::default());
}

#[test]
fn test_collectives_over_128_nodes_under_loss() {
    let lossy = WireConfig { loss: 0.02, dup: 0.02, reorder: 0.05, reorder_jitter_ns: 50_000, ..WireConfig::default() };
    run_collectives(128, lossy);
}

/// The acceptance run: 1024 nodes, every collective. Prints its wall time.
#[test]
#[ignore = "long: 1024 simulated NICs; run with --ignored (release build recommended)"]
fn test_collectives_over_1024_nodes() {
    let t0 = Instant::now();
    run_collectives(1024, WireConfig::default());
    println!("1024 nodes: barrier x4, bcast x3, allreduce x2 in {:.1} s wall", t0.elapsed().as_secs_f64());
}

#[test]
fn test_multisend_reaches_a_rank_window_past_64() {
    let n = 200;
    let mut c = group(n, WireConfig::default());
    let data = pattern(3000, 9);
    // Window 2 is ranks 128..191: every other one of them.
    let mask = 0x5555_5555_5555_5555u64;
    let dests: Vec<u16> = (0..64).filter(|i| mask & (1 << i) != 0).map(|i| 128 + i).collect();
    let recvs: Vec<(u16, u64)> = dests.iter().map(|&r| (r, c.recv(r, (0, 0), 5, 0, data.len() as u64))).collect();
    let wr = c.multisend_window(0, 0, 2, mask, 5, &data);
    let cqe = c.wait(0, wr, 1_000 * MS);
    assert_eq!(status(&cqe), Some(Status::Success));
    for (r, w) in recvs {
        assert_eq!(status(&c.wait(r, w, 100 * MS)), Some(Status::Success), "rank {r}");
        assert!(c.received(w, data.len()) == data, "rank {r}");
    }
    // Window 3 (192..255) runs past the group's 200 members: bit 8 = rank 200.
    let wr = c.multisend_window(0, 0, 3, 1 << 8, 5, &data);
    assert_eq!(status(&c.wait(0, wr, 100 * MS)), Some(Status::BadDescriptor));
    // The sender itself, in window 0.
    let wr = c.multisend_window(0, 0, 0, 1, 5, &data);
    assert_eq!(status(&c.wait(0, wr, 100 * MS)), Some(Status::BadDescriptor));
    quiesced(&mut c);
}

#[test]
fn test_wide_group_takes_its_span_of_slots_and_replaces_what_it_overlaps() {
    let n = 300u16;
    let mut c = Cluster::new(n, Config::default(), 0, 1500, WireConfig::default());
    let members: Vec<u16> = (0..n).collect();
    let table = c.world.layout.params.group_entries;
    let encoded = group_encoding(7, 1, &members, 0, &trees(n as usize));
    let span = GroupEntry::get(&encoded).span();
    assert_eq!(span, 1 + (300 * 4 + 3 * 300 * 2usize).div_ceil(1024));
    // A small group in slot 3, then the wide group from slot 1: it covers
    // slot 3, so the small one goes.
    let small = group_encoding(9, 1, &[0, 1], 0, &[vec![TREE_ROOT_WIDE, 0]]);
    assert_eq!(c.set_group_bytes(0, 3, &small), admin_result::OK);
    assert_eq!(c.world.nodes[0].nic.occupancy().groups, 1);
    assert_eq!(c.set_group_bytes(0, 1, &encoded), admin_result::OK);
    assert_eq!(c.world.nodes[0].nic.occupancy().groups, 1, "the wide group replaced the small one");
    // A wide group that would run past the table's end is refused.
    let last = table - span as u32 + 1;
    let mut other = group_encoding(8, 1, &members, 0, &trees(n as usize));
    assert_eq!(c.set_group_bytes(0, last, &other), admin_result::BAD_ARG);
    // A body that is not the group's (a duplicate member) is refused.
    let at = GroupEntry::SIZE + 4 * 250;
    other.copy_within(GroupEntry::SIZE..GroupEntry::SIZE + 4, at);
    assert_eq!(c.set_group_bytes(0, 20, &other), admin_result::BAD_ARG);
    assert_eq!(c.world.nodes[0].nic.occupancy().groups, 1);
}
