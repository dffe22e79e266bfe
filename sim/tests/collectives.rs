//! NIC-offloaded collectives in the simulator: barrier (pairwise exchange,
//! dissemination, gather-release), reduce and allreduce, under loss,
//! duplication and reordering, checked against a reference the test
//! computes on its own.

use emp_firmware::Config;
use emp_sim::cluster::{binomial_parents, group_entry, Cluster};
use emp_sim::rng::Rng;
use emp_sim::world::WireConfig;
use emp_uapi::coll::{BarrierAlgo, Dtype, ReduceOp, TREE_ROOT};
use emp_uapi::desc::{Cqe, Status};
use emp_uapi::sram::{admin_result, counter};

const MS: u64 = 1_000_000;
const ALGOS: [BarrierAlgo; 3] = [BarrierAlgo::PairwiseExchange, BarrierAlgo::Dissemination, BarrierAlgo::GatherRelease];

fn lossy() -> WireConfig {
    WireConfig { loss: 0.05, dup: 0.05, reorder: 0.1, reorder_jitter_ns: 50_000, ..WireConfig::default() }
}

fn flat_parents(n: usize) -> Vec<u8> {
    (0..n).map(|r| if r == 0 { TREE_ROOT } else { 0 }).collect()
}

/// A chain 0 ← 1 ← 2 …: the deepest tree.
fn chain_parents(n: usize) -> Vec<u8> {
    (0..n).map(|r| if r == 0 { TREE_ROOT } else { (r - 1) as u8 }).collect()
}

/// `n` nodes in one group (slot 0, id 7, epoch 1) with trees binomial, flat, chain.
fn group(n: u16, cfg: Config, wire: WireConfig) -> Cluster {
    let mut c = Cluster::new(n, cfg, 0, 1500, wire);
    let members: Vec<u16> = (0..n).collect();
    let trees = vec![binomial_parents(n as usize), flat_parents(n as usize), chain_parents(n as usize)];
    assert!(c.create_group(0, 7, 1, &members, &trees).iter().all(|&r| r == admin_result::OK));
    c
}

fn status(c: &Option<Cqe>) -> Option<Status> {
    c.as_ref().map(|c| Status::from_u8(c.status).expect("known status"))
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

#[test]
fn test_barrier_every_algorithm_and_size_completes() {
    for algo in ALGOS {
        for n in 1..=17u16 {
            for tree in [0u8, 1, 2] {
                if algo != BarrierAlgo::GatherRelease && tree > 0 {
                    continue;
                }
                let mut c = group(n, Config::default(), WireConfig::default());
                let wrs: Vec<(u16, u64)> = (0..n).map(|r| (r, c.barrier(r, 0, algo, tree))).collect();
                for (i, cqe) in c.wait_all(&wrs, 100 * MS).iter().enumerate() {
                    assert_eq!(status(cqe), Some(Status::Success), "{algo:?} n={n} tree={tree} rank {i}");
                }
                quiesced(&mut c);
            }
        }
    }
}

#[test]
fn test_barrier_nobody_leaves_before_the_last_arrives() {
    for algo in ALGOS {
        let n = 11;
        let mut c = group(n, Config::default(), WireConfig::default());
        for late in [0u16, 5, 10] {
            let mut wrs: Vec<(u16, u64)> =
                (0..n).filter(|&r| r != late).map(|r| (r, c.barrier(r, 0, algo, 0))).collect();
            c.run_for(50 * MS);
            for r in 0..n {
                assert!(c.completions(r).is_empty(), "{algo:?}: rank {r} left while rank {late} had not arrived");
            }
            wrs.push((late, c.barrier(late, 0, algo, 0)));
            for cqe in c.wait_all(&wrs, 100 * MS) {
                assert_eq!(status(&cqe), Some(Status::Success), "{algo:?}");
            }
        }
        // Messages for a barrier the host had not posted yet were recorded, not dropped.
        let early: u64 = (0..n).map(|r| c.counter(r, counter::COLL_EARLY)).sum();
        assert!(early > 0, "{algo:?}: no early message recorded");
        quiesced(&mut c);
    }
}

#[test]
fn test_barrier_under_loss_dup_reorder_up_to_64_nodes() {
    for (n, rounds) in [(2u16, 30), (5, 20), (16, 10), (64, 3)] {
        let mut c = group(n, Config::default(), lossy());
        for round in 0..rounds {
            let algo = ALGOS[round % 3];
            let wrs: Vec<(u16, u64)> = (0..n).map(|r| (r, c.barrier(r, 0, algo, 0))).collect();
            for cqe in c.wait_all(&wrs, 5_000 * MS) {
                assert_eq!(status(&cqe), Some(Status::Success), "n={n} round {round} {algo:?}");
            }
        }
        let retrans: u64 = (0..n).map(|r| c.counter(r, counter::RETRANSMITS)).sum();
        assert!(retrans > 0, "n={n}: the loss never hit a barrier message");
        quiesced(&mut c);
    }
}

#[test]
fn test_barriers_posted_ahead_are_windowed_and_all_complete() {
    // Rank 0 posts 20 barriers at once; the others post theirs late. Beyond
    // the window the NIC refuses, the senders retry, nothing is lost.
    let n = 4;
    let cfg = Config { coll_window: 4, ..Config::default() };
    let mut c = group(n, cfg, WireConfig::default());
    let mut wrs: Vec<(u16, u64)> = (0..20).map(|_| (0, c.barrier(0, 0, BarrierAlgo::Dissemination, 0))).collect();
    c.run_for(20 * MS);
    for r in 1..n {
        for _ in 0..20 {
            wrs.push((r, c.barrier(r, 0, BarrierAlgo::Dissemination, 0)));
        }
    }
    for cqe in c.wait_all(&wrs, 5_000 * MS) {
        assert_eq!(status(&cqe), Some(Status::Success));
    }
    let refused: u64 = (0..n).map(|r| c.counter(r, counter::COLL_REFUSED)).sum();
    assert!(refused > 0, "the window never refused");
    quiesced(&mut c);
}

// ---- reductions ----

/// The fixed combining order (own value, then each child's subtree in
/// ascending relative rank), computed by libemp's reference reduction.
fn reference(t: Dtype, op: ReduceOp, parents: &[u8], root: usize, inputs: &[Vec<u8>]) -> Vec<u8> {
    let n = inputs.len();
    let parent: Vec<Option<u16>> = parents.iter().map(|&p| (p != TREE_ROOT).then_some(p as u16)).collect();
    let by_rel: Vec<Vec<u8>> = (0..n).map(|rel| inputs[(rel + root) % n].clone()).collect();
    emp::coll::reduce::reduce_ref(t, op, &parent, &by_rel).expect("a valid reduction")
}

fn random_input(rng: &mut Rng, t: Dtype, count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|_| match t {
            Dtype::F32 => ((rng.below(2_000_001) as f32 - 1e6) / 997.0).to_le_bytes().to_vec(),
            Dtype::F64 => ((rng.below(2_000_000_001) as f64 - 1e9) / 1_009.0).to_le_bytes().to_vec(),
            _ => (0..t.size()).map(|_| rng.below(256) as u8).collect(),
        })
        .collect()
}

fn run_reduce(
    c: &mut Cluster,
    rng: &mut Rng,
    all: bool,
    root: u16,
    t: Dtype,
    op: ReduceOp,
    tree: u8,
    count: usize,
    parents: &[u8],
) {
    let n = c.world.nodes.len() as u16;
    let inputs: Vec<Vec<u8>> = (0..n).map(|_| random_input(rng, t, count)).collect();
    let wrs: Vec<(u16, u64)> =
        (0..n).map(|r| (r, c.reduce(r, 0, all, root, t, op, tree, &inputs[r as usize]))).collect();
    let want = reference(t, op, parents, root as usize, &inputs);
    for (r, cqe) in c.wait_all(&wrs, 5_000 * MS).into_iter().enumerate() {
        let what = format!(
            "{} {} {} n={n} root={root} tree={tree} rank {r}",
            if all { "allreduce" } else { "reduce" },
            t.name(),
            op.name()
        );
        assert_eq!(status(&cqe), Some(Status::Success), "{what}");
        if all || r as u16 == root {
            assert_eq!(c.received(wrs[r].1, want.len()), want, "{what}: result differs from the reference");
        }
    }
}

#[test]
fn test_reduce_and_allreduce_every_type_and_op_match_the_reference() {
    let mut rng = Rng::new(5);
    for n in [2u16, 3, 7] {
        let mut c = group(n, Config::default(), WireConfig::default());
        let trees = [binomial_parents(n as usize), flat_parents(n as usize), chain_parents(n as usize)];
        for t in Dtype::ALL {
            for op in ReduceOp::ALL.into_iter().filter(|op| op.defined_for(t)) {
                let tree = rng.below(3) as u8;
                let root = rng.below(n as u64) as u16;
                run_reduce(&mut c, &mut rng, false, root, t, op, tree, 5, &trees[tree as usize]);
                run_reduce(&mut c, &mut rng, true, 0, t, op, tree, 5, &trees[tree as usize]);
            }
        }
        quiesced(&mut c);
    }
}

#[test]
fn test_allreduce_under_loss_is_bitwise_reproducible_up_to_64_nodes() {
    for n in [4u16, 16, 64] {
        let mut c = group(n, Config::default(), lossy());
        let parents = binomial_parents(n as usize);
        for seed in 0..3 {
            // Same inputs, different network luck: the same bits every time.
            let mut rng = Rng::new(100 + n as u64);
            run_reduce(&mut c, &mut rng, true, 0, Dtype::F64, ReduceOp::Sum, 0, 32, &parents);
            let _ = seed;
        }
        quiesced(&mut c);
    }
}

#[test]
fn test_early_partials_beyond_the_pool_are_refused_then_combined() {
    // One pool buffer: partials for unposted reductions are refused and
    // retried; the result is still exact.
    let n = 8;
    let cfg = Config { coll_bufs: 1, ..Config::default() };
    let mut c = group(n, cfg, WireConfig::default());
    let mut rng = Rng::new(9);
    let inputs: Vec<Vec<u8>> = (0..n).map(|_| random_input(&mut rng, Dtype::I64, 4)).collect();
    // Leaves first: their partials reach inner ranks that have not posted.
    let mut order: Vec<u16> = (0..n).rev().collect();
    order.rotate_left(1);
    let mut wrs = Vec::new();
    for &r in &order {
        wrs.push((r, c.reduce(r, 0, true, 0, Dtype::I64, ReduceOp::Sum, 0, &inputs[r as usize])));
        c.run_for(5 * MS);
    }
    let want = reference(Dtype::I64, ReduceOp::Sum, &binomial_parents(n as usize), 0, &inputs);
    for (r, wr) in wrs.clone() {
        let cqe = c.wait(r, wr, 5_000 * MS);
        assert_eq!(status(&cqe), Some(Status::Success));
        assert_eq!(c.received(wr, want.len()), want);
    }
    let refused: u64 = (0..n).map(|r| c.counter(r, counter::COLL_REFUSED)).sum();
    assert!(refused > 0, "the pool never ran out");
    quiesced(&mut c);
}

#[test]
fn test_misuse_gets_error_completions() {
    let n = 3;
    let mut c = group(n, Config::default(), WireConfig::default());
    // Unknown group slot.
    let wr = c.barrier(0, 5, BarrierAlgo::Dissemination, 0);
    assert_eq!(status(&c.wait(0, wr, 10 * MS)), Some(Status::GroupInvalid));
    // Bitwise op on floats.
    let wr = c.reduce(0, 0, true, 0, Dtype::F64, ReduceOp::Bxor, 0, &[0u8; 8]);
    assert_eq!(status(&c.wait(0, wr, 10 * MS)), Some(Status::InvalidOp));
    // Too large for one frame.
    let wr = c.reduce(0, 0, true, 0, Dtype::U64, ReduceOp::Sum, 0, &vec![0u8; 8 * 1024]);
    assert_eq!(status(&c.wait(0, wr, 10 * MS)), Some(Status::TooLarge));
    // Members disagree on the count: both sides fail, nobody hangs.
    let a = c.reduce(0, 0, true, 0, Dtype::U64, ReduceOp::Sum, 0, &[1u8; 16]);
    let b = c.reduce(1, 0, true, 0, Dtype::U64, ReduceOp::Sum, 0, &[1u8; 8]);
    let d = c.reduce(2, 0, true, 0, Dtype::U64, ReduceOp::Sum, 0, &[1u8; 16]);
    let got: Vec<Option<Status>> = c.wait_all(&[(0, a), (1, b), (2, d)], 1_000 * MS).iter().map(status).collect();
    assert!(got.contains(&Some(Status::CollMismatch)), "{got:?}");
    assert!(got.iter().all(|s| s.is_some()), "someone hangs: {got:?}");
    // Barrier kinds disagree.
    let a = c.barrier(0, 0, BarrierAlgo::PairwiseExchange, 0);
    let b = c.barrier(1, 0, BarrierAlgo::Dissemination, 0);
    let d = c.barrier(2, 0, BarrierAlgo::Dissemination, 0);
    let got: Vec<Option<Status>> = c.wait_all(&[(0, a), (1, b), (2, d)], 1_000 * MS).iter().map(status).collect();
    assert!(got.contains(&Some(Status::CollMismatch)), "{got:?}");
}

#[test]
fn test_group_recreated_midflight_fails_stale_and_new_epoch_works() {
    let n = 4;
    let mut c = group(n, Config::default(), WireConfig::default());
    let members: Vec<u16> = (0..n).collect();
    let trees = vec![binomial_parents(n as usize)];
    // Ranks 0..2 enter a barrier; rank 3 re-creates the group first.
    let wrs: Vec<(u16, u64)> = (0..3).map(|r| (r, c.barrier(r, 0, BarrierAlgo::Dissemination, 0))).collect();
    c.run_for(2 * MS);
    assert_eq!(c.set_group(3, 0, &group_entry(7, 2, &members, 3, &trees)), admin_result::OK);
    // Rank 3 joins the barrier on epoch 2: epoch-1 messages are stale to it.
    let w3 = c.barrier(3, 0, BarrierAlgo::Dissemination, 0);
    // The others re-create too: their epoch-1 barriers fail StaleGroup.
    for r in 0..3 {
        assert_eq!(c.set_group(r, 0, &group_entry(7, 2, &members, r, &trees)), admin_result::OK);
    }
    for (r, wr) in &wrs {
        assert_eq!(status(&c.wait(*r, *wr, 100 * MS)), Some(Status::StaleGroup), "rank {r}");
    }
    let mut all: Vec<(u16, u64)> = (0..3).map(|r| (r, c.barrier(r, 0, BarrierAlgo::Dissemination, 0))).collect();
    all.push((3, w3));
    for cqe in c.wait_all(&all, 1_000 * MS) {
        assert_eq!(status(&cqe), Some(Status::Success));
    }
    // An epoch that does not increase is refused.
    assert_eq!(c.set_group(0, 0, &group_entry(7, 2, &members, 0, &trees)), admin_result::BAD_ARG);
    quiesced(&mut c);
}

#[test]
fn test_group_set_checks_and_port_close_clears() {
    let mut c = Cluster::new(3, Config::default(), 0, 1500, WireConfig::default());
    let members = [0u16, 1, 2];
    let tree = vec![binomial_parents(3)];
    // Wrong rank for this node, cyclic tree, no tree, duplicate member, slot out of range.
    assert_eq!(c.set_group(0, 0, &group_entry(1, 1, &members, 1, &tree)), admin_result::BAD_ARG);
    assert_eq!(c.set_group(0, 0, &group_entry(1, 1, &members, 0, &[vec![TREE_ROOT, 2, 1]])), admin_result::BAD_ARG);
    assert_eq!(c.set_group(0, 0, &group_entry(1, 1, &members, 0, &[])), admin_result::BAD_ARG);
    assert_eq!(c.set_group(0, 0, &group_entry(1, 1, &[0, 1, 1], 0, &tree)), admin_result::BAD_ARG);
    assert_eq!(c.set_group(0, 99, &group_entry(1, 1, &members, 0, &tree)), admin_result::BAD_ARG);
    assert_eq!(c.world.nodes[0].nic.occupancy().groups, 0);
    assert_eq!(c.set_group(0, 0, &group_entry(1, 1, &members, 0, &tree)), admin_result::OK);
    assert_eq!(c.world.nodes[0].nic.occupancy().groups, 1);
    // A barrier nobody else joins is flushed when the port closes.
    let wr = c.barrier(0, 0, BarrierAlgo::PairwiseExchange, 0);
    c.run_for(MS);
    c.close_port(0);
    let cq: Vec<Cqe> = c.completions(0);
    assert!(cq.iter().any(|q| q.wr_id == wr && q.status == Status::Flushed as u8), "{cq:?}");
    let o = c.world.nodes[0].nic.occupancy();
    assert_eq!((o.groups, o.coll_ops), (0, 0));
    assert_eq!(c.clear_group(1, 0), admin_result::BAD_STATE, "nothing loaded there");
}

// ---- broadcast ----

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 8) as u8).collect()
}

fn bcast_group(n: u16, wire: WireConfig) -> Cluster {
    let mut c = Cluster::new(n, Config::default(), 0, 1500, wire);
    let members: Vec<u16> = (0..n).collect();
    let trees = vec![binomial_parents(n as usize), flat_parents(n as usize), chain_parents(n as usize)];
    assert!(c.create_group_bounce(0, 7, 1, &members, &trees, 2, 16 * 1024).iter().all(|&r| r == admin_result::OK));
    c
}

/// Everyone posts; every buffer ends equal to the root's.
fn run_bcast(c: &mut Cluster, root: u16, tree: u8, data: &[u8], limit_ns: u64) -> Vec<u64> {
    let n = c.world.nodes.len() as u16;
    let wrs: Vec<(u16, u64)> = (0..n).map(|r| (r, c.bcast(r, 0, root, tree, data, r == root))).collect();
    for (r, cqe) in c.wait_all(&wrs, limit_ns).into_iter().enumerate() {
        assert_eq!(
            status(&cqe),
            Some(Status::Success),
            "bcast n={n} root={root} tree={tree} len={} rank {r}",
            data.len()
        );
        if r as u16 != root {
            assert!(c.received(wrs[r].1, data.len()) == data, "rank {r} got different bytes (len {})", data.len());
        }
    }
    wrs.iter().map(|w| w.1).collect()
}

#[test]
fn test_bcast_every_root_tree_and_size() {
    for n in [1u16, 2, 3, 5, 8, 13, 17] {
        let mut c = bcast_group(n, WireConfig::default());
        for tree in 0..3u8 {
            for root in [0, n / 2, n - 1] {
                for len in [0usize, 1, 1400, 5000, 70_000] {
                    run_bcast(&mut c, root, tree, &pattern(len, root as u8 ^ tree), 1_000 * MS);
                }
            }
        }
        quiesced(&mut c);
    }
}

#[test]
fn test_bcast_under_loss_dup_reorder_up_to_64_nodes() {
    for n in [4u16, 16, 64] {
        let mut c = bcast_group(n, lossy());
        for (i, len) in [10usize, 20_000, 3000].into_iter().enumerate() {
            run_bcast(&mut c, (i as u16 * 5) % n, i as u8 % 3, &pattern(len, i as u8), 20_000 * MS);
        }
        let retrans: u64 = (0..n).map(|r| c.counter(r, counter::RETRANSMITS)).sum();
        assert!(retrans > 0, "n={n}: loss never hit");
        quiesced(&mut c);
    }
}

#[test]
fn test_bcast_is_pipelined_down_a_chain() {
    // 8 ranks in a chain, 1 MiB: forwarding frame by frame costs about one
    // message time plus a frame per hop; store-and-forward would cost 7.
    let n = 8;
    let mut c = bcast_group(n, WireConfig::default());
    let data = pattern(1 << 20, 3);
    let start = c.world.now;
    run_bcast(&mut c, 0, 2, &data, 10_000 * MS);
    let took = c.world.now - start;
    let one_hop = (data.len() as u64 * 8 * 1_000_000_000) / WireConfig::default().bandwidth_bps;
    assert!(took < 2 * one_hop, "1 MiB down a chain of {n} took {took} ns; one hop is {one_hop} ns: not pipelined");
    quiesced(&mut c);
}

#[test]
fn test_bcast_application_bypass_inner_rank_not_posted() {
    // Chain 0 → 1 → 2 → 3: rank 1 has not called broadcast, yet its NIC
    // forwards to 2 and 3, which complete; rank 1 gets the data when it posts.
    let n = 4;
    let mut c = bcast_group(n, WireConfig::default());
    let data = pattern(10_000, 9);
    let mut wrs = vec![(0, c.bcast(0, 0, 0, 2, &data, true))];
    for r in [2u16, 3] {
        wrs.push((r, c.bcast(r, 0, 0, 2, &data, false)));
    }
    for (r, wr) in wrs.clone() {
        assert_eq!(status(&c.wait(r, wr, 100 * MS)), Some(Status::Success), "rank {r} waited for rank 1's host");
    }
    for &(r, wr) in &wrs[1..] {
        assert!(c.received(wr, data.len()) == data);
        let _ = r;
    }
    c.run_for(50 * MS);
    let late = c.bcast(1, 0, 0, 2, &data, false);
    assert_eq!(status(&c.wait(1, late, 100 * MS)), Some(Status::Success));
    assert!(c.received(late, data.len()) == data, "rank 1 got the bounced bytes");
    quiesced(&mut c);
}

#[test]
fn test_bcast_larger_than_a_bounce_slot_waits_for_the_post() {
    let n = 3;
    let mut c = bcast_group(n, WireConfig::default());
    let data = pattern(40_000, 1); // > 16 KiB bounce slot
    let w0 = c.bcast(0, 0, 0, 2, &data, true);
    c.run_for(30 * MS);
    assert!(c.completions(0).is_empty(), "the root finished although nobody could take the data");
    let w1 = c.bcast(1, 0, 0, 2, &data, false);
    let w2 = c.bcast(2, 0, 0, 2, &data, false);
    for (r, wr) in [(0, w0), (1, w1), (2, w2)] {
        assert_eq!(status(&c.wait(r, wr, 1_000 * MS)), Some(Status::Success));
    }
    assert!(c.received(w2, data.len()) == data);
    let refused: u64 = (0..n).map(|r| c.counter(r, counter::COLL_REFUSED)).sum();
    assert!(refused > 0);
    quiesced(&mut c);
}

#[test]
fn test_forwarded_bcast_refused_mid_group_under_modified_ack_nack_completes() {
    // Found by the swarm: rank 1 forwards frames to rank 2 as they arrive;
    // rank 2 has no call posted and no bounce slot, so it refuses the
    // message while rank 1 has sent only part of group 0. Modified
    // ACK/NACK then holds everything after the refused message; holding
    // the rest of the refused message itself too left rank 2 (once
    // posted) waiting for frames that never came: RetryLimitExceeded.
    let cfg = Config { flow_control: emp_firmware::FlowControl::ModifiedAckNack, group_size: 8, ..Config::default() };
    let wire = WireConfig { bandwidth_bps: 1_000_000_000, latency_ns: 2_000, ..WireConfig::default() };
    let mut c = group(3, cfg, wire);
    let data = pattern(14_332, 3);
    let w0 = c.bcast(0, 0, 0, 2, &data, true);
    let w1 = c.bcast(1, 0, 0, 2, &data, false);
    c.run_for(5 * MS);
    assert!(c.counter(2, counter::COLL_REFUSED) > 0, "rank 2 must have refused the forwarded message");
    let w2 = c.bcast(2, 0, 0, 2, &data, false);
    for (r, wr) in [(0, w0), (1, w1), (2, w2)] {
        assert_eq!(status(&c.wait(r, wr, 2_000 * MS)), Some(Status::Success), "rank {r}");
    }
    assert!(c.received(w2, data.len()) == data);
    quiesced(&mut c);
}

#[test]
fn test_bcast_inner_rank_forwards_without_reading_the_host() {
    // Root 0 → [1, 2]; rank 1 → [3..=7]. Rank 1 forwards each frame to its
    // five children from the frame as it arrived: no host read-back. The
    // root reads its buffer once for both children (as multisend does);
    // leaves read nothing.
    let n = 8u16;
    let mut c = Cluster::new(n, Config::default(), 0, 1500, WireConfig::default());
    let members: Vec<u16> = (0..n).collect();
    let parents = vec![TREE_ROOT, 0, 0, 1, 1, 1, 1, 1];
    assert!(c.create_group_bounce(0, 7, 1, &members, &[parents], 2, 16 * 1024).iter().all(|&r| r == admin_result::OK));
    // Warm-up: peers exist and translations are cached.
    run_bcast(&mut c, 0, 0, &pattern(3000, 1), 1_000 * MS);
    for len in [1usize, 1400, 20_000, 70_000] {
        let data = pattern(len, len as u8);
        let before: Vec<u64> = (0..n).map(|r| c.dma_read_bytes(r)).collect();
        run_bcast(&mut c, 0, 0, &data, 1_000 * MS);
        let read: Vec<u64> = (0..n).map(|r| c.dma_read_bytes(r) - before[r as usize]).collect();
        let mut want = vec![0u64; n as usize];
        want[0] = len as u64;
        assert_eq!(read, want, "host bytes DMA-read per rank, {len} B broadcast");
    }
    quiesced(&mut c);
}

#[test]
fn test_bcast_frame_cache_bound_and_laggards_under_loss() {
    // A tiny frame cache (evictions all the time) under loss, duplication
    // and reordering, and a member that posts late (its parent forwards
    // while it refuses): still exact, and nothing stays cached.
    for cache in [0u32, 2, 5] {
        let cfg = Config { coll_cache_frames: cache, ..Config::default() };
        let n = 16u16;
        let mut c = Cluster::new(n, cfg, 0, 1500, lossy());
        let members: Vec<u16> = (0..n).collect();
        let trees = vec![binomial_parents(n as usize), flat_parents(n as usize)];
        assert!(c.create_group_bounce(0, 7, 1, &members, &trees, 2, 16 * 1024).iter().all(|&r| r == admin_result::OK));
        for (i, len) in [30_000usize, 9000].into_iter().enumerate() {
            run_bcast(&mut c, (3 * i as u16) % n, i as u8, &pattern(len, i as u8), 20_000 * MS);
        }
        // Rank 2 (inner in the binomial tree) posts late, 100 KB is larger
        // than a bounce slot: its children and itself wait for the post,
        // and the root's message to it stops at its window (48 frames).
        let data = pattern(100_000, 7);
        let mut wrs: Vec<(u16, u64)> =
            (0..n).filter(|&r| r != 2).map(|r| (r, c.bcast(r, 0, 0, 0, &data, r == 0))).collect();
        c.run_for(30 * MS);
        // The root keeps (at most `cache`) frames only rank 2 still needs.
        let held = c.world.nodes[0].nic.occupancy().coll_cache_frames;
        assert!(held <= cache && (cache == 0 || held > 0), "cache {cache}: root holds {held} frames");
        for node in &c.world.nodes {
            node.nic.invariants().unwrap();
        }
        wrs.push((2, c.bcast(2, 0, 0, 0, &data, false)));
        for (r, wr) in wrs {
            assert_eq!(status(&c.wait(r, wr, 20_000 * MS)), Some(Status::Success), "cache {cache} rank {r}");
            if r != 0 {
                assert!(c.received(wr, data.len()) == data, "cache {cache} rank {r}");
            }
        }
        quiesced(&mut c);
    }
}

#[test]
fn test_bcast_cached_frames_are_freed_by_group_recreation_and_port_close() {
    // Rank 1 forwards to 2 (posted) and 3 (not posted; 100 KB exceeds its
    // bounce slot, so it refuses, and the message to it stops at its
    // window): rank 1 keeps the frames rank 3 has not been sent until its
    // group is re-created or its port closes.
    for close in [false, true] {
        let n = 4u16;
        let mut c = Cluster::new(n, Config::default(), 0, 1500, WireConfig::default());
        let members: Vec<u16> = (0..n).collect();
        let trees = vec![vec![TREE_ROOT, 0, 1, 1]];
        assert!(c.create_group_bounce(0, 7, 1, &members, &trees, 2, 16 * 1024).iter().all(|&r| r == admin_result::OK));
        let data = pattern(100_000, 5);
        let wrs: Vec<(u16, u64)> = (0..3).map(|r| (r, c.bcast(r, 0, 0, 0, &data, r == 0))).collect();
        assert_eq!(status(&c.wait(2, wrs[2].1, 1_000 * MS)), Some(Status::Success));
        assert!(c.received(wrs[2].1, data.len()) == data);
        let held = c.world.nodes[1].nic.occupancy().coll_cache_frames;
        assert!(held > 0, "rank 1 keeps nothing for its lagging child");
        c.world.nodes[1].nic.invariants().unwrap();
        if close {
            c.close_port(1);
            assert_eq!(c.world.nodes[1].nic.occupancy(), emp_firmware::Occupancy::default());
        } else {
            assert_eq!(c.set_group(1, 0, &group_entry(7, 2, &members, 1, &trees)), admin_result::OK);
            assert_eq!(status(&c.wait(1, wrs[1].1, 100 * MS)), Some(Status::StaleGroup));
            let o = c.world.nodes[1].nic.occupancy();
            assert_eq!((o.coll_ops, o.coll_cache_frames), (0, 0), "{o:?}");
        }
        c.world.nodes[1].nic.invariants().unwrap();
    }
}

#[test]
fn test_bcast_length_mismatch_fails_both_sides() {
    let mut c = bcast_group(2, WireConfig::default());
    let w0 = c.bcast(0, 0, 0, 0, &pattern(100, 1), true);
    let w1 = c.bcast(1, 0, 0, 0, &pattern(50, 1), false);
    assert_eq!(status(&c.wait(0, w0, 1_000 * MS)), Some(Status::CollMismatch));
    assert_eq!(status(&c.wait(1, w1, 1_000 * MS)), Some(Status::CollMismatch));
    quiesced(&mut c);
}

// ---- multisend ----

#[test]
fn test_multisend_reads_the_payload_once_for_fifteen_destinations() {
    let n = 16;
    let mut c = group(n, Config::default(), WireConfig::default());
    let data = pattern(16 * 1024, 4);
    // One unicast first: what one message costs in host reads (payload;
    // translation lists are then cached).
    let r = c.recv(1, (0, 0), 78, 0, data.len() as u64);
    let s = c.send(0, 1, 78, &data);
    assert_eq!(status(&c.wait(0, s, 100 * MS)), Some(Status::Success));
    assert_eq!(status(&c.wait(1, r, 100 * MS)), Some(Status::Success));
    let recvs: Vec<(u16, u64)> = (1..n).map(|r| (r, c.recv(r, (0, 0), 77, 0, data.len() as u64))).collect();
    let before = c.dma_read_bytes(0);
    let s = c.send(0, 1, 79, &data);
    let r = c.recv(1, (0, 0), 79, 0, data.len() as u64);
    assert_eq!(status(&c.wait(0, s, 100 * MS)), Some(Status::Success));
    assert_eq!(status(&c.wait(1, r, 100 * MS)), Some(Status::Success));
    let unicast = c.dma_read_bytes(0) - before;
    assert_eq!(unicast, data.len() as u64, "a warm unicast reads exactly its payload");
    let before = c.dma_read_bytes(0);
    let mask = ((1u64 << n) - 1) & !1;
    let wr = c.multisend(0, 0, mask, 77, &data);
    let cqe = c.wait(0, wr, 1_000 * MS);
    assert_eq!(status(&cqe), Some(Status::Success));
    assert_eq!(cqe.unwrap().msg_len, 0, "no destination failed");
    for (r, w) in recvs {
        assert_eq!(status(&c.wait(r, w, 100 * MS)), Some(Status::Success));
        assert!(c.received(w, data.len()) == data, "rank {r}");
    }
    let read = c.dma_read_bytes(0) - before;
    assert_eq!(read, data.len() as u64, "multisend to 15 destinations read {read} B from the host");
    quiesced(&mut c);
}

#[test]
fn test_multisend_late_receiver_catches_up_and_closed_one_fails() {
    let n = 4;
    let mut c = group(n, Config::default(), lossy());
    let data = pattern(9000, 2);
    let r1 = c.recv(1, (0, 0), 5, 0, 9000);
    let r3 = c.recv(3, (0, 0), 5, 0, 9000);
    let wr = c.multisend(0, 0, 0b1110, 5, &data);
    assert_eq!(status(&c.wait(1, r1, 1_000 * MS)), Some(Status::Success));
    assert_eq!(status(&c.wait(3, r3, 1_000 * MS)), Some(Status::Success));
    assert!(c.wait(0, wr, 20 * MS).is_none(), "rank 2 has not posted: the multisend is not done");
    let r2 = c.recv(2, (0, 0), 5, 0, 9000);
    assert_eq!(status(&c.wait(2, r2, 1_000 * MS)), Some(Status::Success));
    assert!(c.received(r2, 9000) == data);
    let cqe = c.wait(0, wr, 1_000 * MS).expect("one completion");
    assert_eq!((Status::from_u8(cqe.status), cqe.msg_len), (Some(Status::Success), 0));
    // A destination whose port is closed: the others still get it.
    c.close_port(3);
    let r1 = c.recv(1, (0, 0), 6, 0, 100);
    let r2 = c.recv(2, (0, 0), 6, 0, 100);
    let wr = c.multisend(0, 0, 0b1110, 6, &data[..100]);
    let cqe = c.wait(0, wr, 5_000 * MS).expect("completes");
    assert_eq!((Status::from_u8(cqe.status), cqe.msg_len), (Some(Status::RemotePortClosed), 1));
    for (r, w) in [(1, r1), (2, r2)] {
        assert_eq!(status(&c.wait(r, w, 100 * MS)), Some(Status::Success), "rank {r}");
    }
}

#[test]
fn test_multisend_bad_mask_is_refused() {
    let mut c = group(3, Config::default(), WireConfig::default());
    for mask in [0b001u64 /* self */, 0b1000 /* beyond the group */] {
        let wr = c.multisend(0, 0, mask, 1, &[1, 2, 3]);
        assert_eq!(status(&c.wait(0, wr, 10 * MS)), Some(Status::BadDescriptor), "mask {mask:#b}");
    }
}

/// A group removed (emp's `destroy_group`, as a rank giving up on a round
/// whose member died does) while a member is still receiving a broadcast:
/// flushing the receive finishes the operation, which must not then be
/// looked up again. Found by `emp soak` (the NIC panicked "live" in
/// `coll_flush_group` and went FAILED). Clears at every moment of a
/// multi-frame broadcast on every member, so one of them lands mid-receive.
#[test]
fn test_group_cleared_mid_broadcast_flushes_without_panic() {
    let data = pattern(60_000, 3);
    let mut mid_receive = 0;
    for delay_us in (0..400).step_by(10) {
        let mut c = bcast_group(4, WireConfig::default());
        let wrs: Vec<(u16, u64)> = (0..4).map(|r| (r, c.bcast(r, 0, 0, 2, &data, r == 0))).collect();
        c.run_for(delay_us * 1000);
        for r in 0..4u16 {
            mid_receive += (c.world.nodes[r as usize].nic.occupancy().rx_msgs > 0) as u32;
            assert_eq!(c.clear_group(r, 0), admin_result::OK, "delay {delay_us} µs, rank {r}");
        }
        for (r, cqe) in c.wait_all(&wrs, 100 * MS).into_iter().enumerate() {
            let st = status(&cqe);
            // GroupInvalid: the descriptor was still in the ring when the group went.
            let ended = matches!(st, Some(Status::Success | Status::Flushed | Status::GroupInvalid));
            assert!(ended, "delay {delay_us} µs, rank {r}: {st:?}");
        }
        c.run_for(100 * MS);
        for r in 0..4 {
            let o = c.world.nodes[r].nic.occupancy();
            assert_eq!((o.groups, o.coll_ops), (0, 0), "delay {delay_us} µs, rank {r}");
        }
    }
    assert!(mid_receive > 0, "no clear landed while a member was receiving");
}
