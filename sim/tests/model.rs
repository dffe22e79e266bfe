//! The simulator's cost model (design step 11).

use emp_firmware::Config;
use emp_sim::cluster::{binomial_parents, Cluster};
use emp_sim::world::WireConfig;
use emp_uapi::coll::{BarrierAlgo, Dtype, ReduceOp};
use emp_uapi::sram::admin_result;

const MS: u64 = 1_000_000;

/// A fixed mixed workload (unicast, broadcast, barrier, allreduce over 8
/// nodes); returns what its timing looks like: (virtual time after each
/// completion, events, frames, bytes).
fn fixed_workload(c: &mut Cluster) -> (Vec<u64>, u64, u64, u64) {
    let n = 8u16;
    let members: Vec<u16> = (0..n).collect();
    assert!(c.create_group_bounce(0, 7, 1, &members, &[binomial_parents(n as usize)], 2, 16 * 1024).iter().all(|&r| r == admin_result::OK));
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
    let wrs: Vec<(u16, u64)> = (0..n).map(|r| (r, c.reduce(r, 0, true, 0, Dtype::I64, ReduceOp::Sum, 0, &(r as i64).to_le_bytes()))).collect();
    for (node, wr) in wrs {
        assert!(c.wait(node, wr, 100 * MS).is_some());
        times.push(c.world.now);
    }
    c.run_for(50 * MS);
    (times, c.world.events, c.world.stats.frames, c.world.stats.bytes)
}

#[test]
fn golden_print() {
    let mut c = Cluster::new(8, Config::default(), 0, 1500, WireConfig::default());
    let g = fixed_workload(&mut c);
    println!("{g:?}");
}
