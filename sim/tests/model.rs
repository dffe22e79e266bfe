//! The simulator's cost model (design step 11): the zero model changes
//! nothing, and under seed 000's fits (`paper`) the NIC-offloaded
//! collectives keep their measured advantage over the host baselines. These
//! are CI guards: a NIC that stopped forwarding frame by frame, or that
//! needed its host at each hop, fails them.

use emp_firmware::Config;
use emp_sim::cluster::{binomial_parents, Cluster};
use emp_sim::cost::CostModel;
use emp_sim::model::{self, fit_log2, Experiment, Params};
use emp_sim::world::WireConfig;
use emp_uapi::coll::{BarrierAlgo, Dtype, ReduceOp, TREE_ROOT};
use emp_uapi::desc::Status;
use emp_uapi::sram::admin_result;

const MS: u64 = 1_000_000;

/// A fixed mixed workload (unicast, broadcast, barrier, allreduce over 8
/// nodes); what its timing looks like: (virtual time after each
/// completion, events, frames, bytes).
fn fixed_workload(c: &mut Cluster) -> (Vec<u64>, u64, u64, u64) {
    let n = 8u16;
    let members: Vec<u16> = (0..n).collect();
    assert!(c
        .create_group_bounce(0, 7, 1, &members, &[binomial_parents(n as usize)], 2, 16 * 1024)
        .iter()
        .all(|&r| r == admin_result::OK));
    let mut times = Vec::new();
    let data: Vec<u8> = (0..70_000u32).map(|i| (i * 7) as u8).collect();
    let r = c.recv(3, (0, 0), 5, 0, data.len() as u64);
    let s = c.send(0, 3, 5, &data);
    for (node, wr) in [(3, r), (0, s)] {
        assert!(c.wait(node, wr, 100 * MS).is_some());
        times.push(c.world.now);
    }
    let wrs: Vec<(u16, u64)> = (0..n).map(|r| (r, c.bcast(r, 0, 0, 0, &data[..20_000], r == 0))).collect();
    for (node, wr) in wrs {
        assert!(c.wait(node, wr, 100 * MS).is_some());
        times.push(c.world.now);
    }
    let wrs: Vec<(u16, u64)> = (0..n).map(|r| (r, c.barrier(r, 0, BarrierAlgo::PairwiseExchange, 0))).collect();
    for (node, wr) in wrs {
        assert!(c.wait(node, wr, 100 * MS).is_some());
        times.push(c.world.now);
    }
    let wrs: Vec<(u16, u64)> =
        (0..n).map(|r| (r, c.reduce(r, 0, true, 0, Dtype::I64, ReduceOp::Sum, 0, &(r as i64).to_le_bytes()))).collect();
    for (node, wr) in wrs {
        assert!(c.wait(node, wr, 100 * MS).is_some());
        times.push(c.world.now);
    }
    c.run_for(50 * MS);
    (times, c.world.events, c.world.stats.frames, c.world.stats.bytes)
}

#[test]
fn test_zero_model_leaves_event_order_and_time_unchanged() {
    // Recorded before the cost model existed (commit 6c2cce2), re-recorded
    // when message headers grew by 8 bytes (wire version 4, immediate
    // data: each message's first frame 8 bytes longer on the wire) and when
    // the collective header grew from 24 to 32 bytes (16-bit ranks for
    // groups of 1024: 8 bytes more on each of the 45 collective frames);
    // the same events and frames each time. 352 events, not 351: the
    // coalesced ACK of the point-to-point message is sent by a timer event
    // of its own (at the same virtual time). If the firmware's own
    // behaviour changes on purpose, re-record it from a run with
    // `CostModel::ZERO`.
    let before: (Vec<u64>, u64, u64, u64) = (
        [vec![64_688, 69_756], vec![131_293; 8], vec![147_729; 8], vec![174_643, 179_711, 179_711], vec![184_779; 5]]
            .concat(),
        352,
        273,
        222_816,
    );
    let mut c = Cluster::new(8, Config::default(), 0, 1500, WireConfig::default());
    assert!(c.world.cost.is_zero(), "zero is the default");
    assert_eq!(fixed_workload(&mut c), before);
    let mut c = Cluster::new(8, Config::default(), 0, 1500, WireConfig::default());
    c.world.cost = CostModel::ZERO;
    assert_eq!(fixed_workload(&mut c), before);
    assert!(c.host_busy_ns.iter().all(|&b| b == 0));
    assert!(c.world.nodes.iter().all(|n| n.nic_busy_ns == 0));
}

#[test]
fn test_paper_costs_reproduce_the_multisend_worked_example() {
    // Seed 000 §2: one packet to 6 destinations, multisend
    // t_Send + 5·t_Xmit + t_Recv = 153.2 µs against 6·t_Send + t_Recv =
    // 333.7 µs. EMP's NIC also reads the payload by DMA (see emp_sim::cost),
    // so the simulator is somewhat slower; the factor stays about 2.
    let p = Params::paper();
    let n = 7u16;
    let mut c = Cluster::new(n, Config::default(), 0, p.mtu, p.wire.clone());
    c.world.cost = p.cost;
    let members: Vec<u16> = (0..n).collect();
    assert!(c.create_group(0, 1, 1, &members, &[binomial_parents(n as usize)]).iter().all(|&r| r == admin_result::OK));
    let data = vec![0x5A; 1520]; // One frame.
    let mut run = |multi: bool, tag: u64| {
        c.run_for(5 * MS);
        let recvs: Vec<u64> = (1..n).map(|r| c.recv(r, (0, 0), tag, 0, data.len() as u64)).collect();
        c.run_for(MS);
        let t0 = c.world.now;
        if multi {
            c.multisend(0, 0, 0b111_1110, tag, &data);
        } else {
            for d in 1..n {
                c.send(0, d, tag, &data);
            }
        }
        let each: Vec<u64> =
            (1..n).map(|r| c.wait_seen(r, recvs[r as usize - 1], 100 * MS).expect("delivered").1 - t0).collect();
        let last = t0 + *each.iter().max().expect("six");
        (last - t0) as f64 / 1000.0
    };
    run(true, 1);
    let multi = run(true, 2);
    run(false, 3);
    let unicast = run(false, 4);
    assert!((153.2..153.2 * 1.2).contains(&multi), "multisend {multi:.1} µs (paper's model: 153.2)");
    assert!((333.7 * 0.95..333.7 * 1.1).contains(&unicast), "unicast {unicast:.1} µs (paper's model: 333.7)");
    assert!(unicast / multi > 1.8, "factor {:.2} (paper's model: 2.18)", unicast / multi);
}

#[test]
fn test_paper_bcast_16k_to_16_nodes_beats_host_binomial_by_1_85() {
    // Seed 000 §6 / design §2: 1.85× for 16 KiB to 16 nodes, best stored tree.
    let c = Experiment::Bcast.run(&Params::paper(), 16, 16 * 1024).unwrap();
    assert!(
        c.ratio() >= 1.85,
        "bcast 16 KiB / 16 nodes: NIC {:.1} µs, host {:.1} µs, ratio {:.2} ({})",
        c.nic.ns / 1e3,
        c.host.ns / 1e3,
        c.ratio(),
        c.note
    );
    // The NIC variant's hosts only post and reap (the root copies once).
    assert!(c.host.host_cpu_ns > 5.0 * c.nic.host_cpu_ns, "{c:?}");
}

/// Time until the last rank of an `n`-rank chain (0 → 1 → … → n−1) has a
/// `len`-byte NIC broadcast, under `paper` costs (after a warm-up).
fn chain_bcast_ns(n: u16, len: usize) -> u64 {
    let p = Params::paper();
    let mut c = Cluster::new(n, Config::default(), 0, p.mtu, p.wire.clone());
    c.world.cost = p.cost;
    let members: Vec<u16> = (0..n).collect();
    let chain: Vec<u8> = (0..n as usize).map(|r| if r == 0 { TREE_ROOT } else { (r - 1) as u8 }).collect();
    assert!(c.create_group_bounce(0, 1, 1, &members, &[chain], 2, 64 * 1024).iter().all(|&r| r == admin_result::OK));
    let data = vec![3u8; len];
    let mut took = 0;
    for _ in 0..2 {
        c.run_for(5 * MS);
        let t0 = c.world.now;
        let wrs: Vec<u64> = (0..n).map(|r| c.bcast(r, 0, 0, 0, &data, r == 0)).collect();
        let last = n - 1;
        let (cqe, seen) = c.wait_seen(last, wrs[last as usize], 1_000 * MS).expect("the last rank completes");
        assert_eq!(cqe.status, Status::Success as u8);
        took = seen - t0;
        for r in 0..last {
            assert_eq!(c.wait(r, wrs[r as usize], 1_000 * MS).map(|q| q.status), Some(Status::Success as u8));
        }
    }
    took
}

#[test]
fn test_paper_bcast_forwarding_stays_pipelined_under_costs() {
    // 64 KiB down a chain of 8: frame-by-frame forwarding costs about one
    // message time plus a frame time per hop; store-and-forward would cost
    // 7 message times (over 3× the two-rank time).
    let (two, eight) = (chain_bcast_ns(2, 64 * 1024), chain_bcast_ns(8, 64 * 1024));
    assert!(eight < 2 * two, "chain of 8 took {eight} ns, of 2 {two} ns: not pipelined");
}

#[test]
fn test_paper_barrier_ratio_and_the_shape_of_seed_001_eq_3_1_3_2() {
    let p = Params::paper();
    let sweep = model::sweep(Experiment::Barrier, &p, 32, 0).unwrap();
    let at = |n: u16| sweep.iter().find(|c| c.nodes == n).expect("in the sweep");
    // Measured: 1.80 (8 nodes) and 1.89 (16); seed 001 measured 1.83 and
    // 1.78 at GM level. Its 2.2× was MPI level (more host work per message);
    // and its barrier packets were unacknowledged, where EMP's NIC handles
    // a data frame and an ACK each way per round.
    assert!(at(8).ratio() >= 1.75, "8 nodes: {:?}", at(8));
    assert!(at(16).ratio() >= 1.85, "16 nodes: {:?}", at(16));
    for w in sweep.windows(2) {
        assert!(w[1].ratio() > w[0].ratio(), "the factor grows with N: {sweep:?}");
    }
    // T_host = log2 N·(Send + SDMA + Net + Recv + RDMA + HRecv): no intercept.
    let (ha, hb) = fit_log2(&sweep.iter().map(|c| (c.nodes, c.host.ns)).collect::<Vec<_>>());
    // T_NIC = (Send + RDMA + HRecv) + log2 N·(Net + Recv): a smaller slope.
    let (na, nb) = fit_log2(&sweep.iter().map(|c| (c.nodes, c.nic.ns)).collect::<Vec<_>>());
    assert!(ha.abs() < 0.25 * hb, "host: {ha:.0} + {hb:.0}·log2 N");
    assert!(na > 0.0 && nb < 0.6 * hb, "NIC: {na:.0} + {nb:.0}·log2 N against host {hb:.0}·log2 N");
    // Per barrier the NIC variant's host posts one descriptor and reaps one completion.
    let cost = p.cost;
    assert!(at(16).nic.host_cpu_ns <= (cost.host_post_ns + cost.host_cqe_ns) as f64 + 1.0, "{:?}", at(16));
}

#[test]
fn test_paper_allreduce_latency_and_host_time() {
    // Seed 001 §4.3: latency FoI 1.19 at 16 nodes; host CPU FoI 2.7.
    let c = Experiment::Allreduce.run(&Params::paper(), 16, 8).unwrap();
    assert!(c.ratio() >= 1.15, "{c:?}");
    assert!(c.host.host_cpu_ns >= 2.7 * c.nic.host_cpu_ns, "{c:?}");
}

#[test]
fn test_projection_fits_log2_and_matches_a_larger_simulated_host_run() {
    let (a, b) = fit_log2(&[(2, 5.0), (4, 8.0), (16, 14.0)]);
    assert!((a - 2.0).abs() < 1e-9 && (b - 3.0).abs() < 1e-9, "{a} {b}");
    // The host variant needs no group: simulate it beyond 64 ranks and
    // compare with the projection from 2..64.
    let p = Params::paper();
    let sweep = model::sweep(Experiment::Allreduce, &p, 64, 8).unwrap();
    let pr = model::project(&sweep, 128);
    let host = Experiment::Allreduce.run_host(&p, 128, 8).unwrap();
    assert!((host.ns / pr.host_ns() - 1.0).abs() < 0.03, "simulated {} ns, projected {} ns", host.ns, pr.host_ns());
    assert!(pr.host_ns() / pr.nic_ns() > sweep.last().expect("points").ratio());
}

#[test]
fn test_zero_costs_make_the_variants_close() {
    // Without costs the host does nothing that takes time: what is left is
    // the wire, where forwarding on the NIC can only save a little.
    let c = Experiment::Barrier.run(&Params::zero(), 8, 0).unwrap();
    assert_eq!((c.nic.host_cpu_ns, c.host.host_cpu_ns), (0.0, 0.0));
    assert!(c.ratio() < 1.5, "{c:?}");
}
