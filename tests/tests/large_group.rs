//! A group larger than one group table entry on real `emp-nicd` daemons:
//! 72 ports on 9 NICs (mem wire) form one group of 72 (more than the 64 an
//! entry holds inline), create it through direct attach with libemp's
//! default trees, and run barrier (every algorithm), broadcast from a rank
//! past 64 and allreduce, each result checked on every member; a multisend
//! reaches ranks of the second 64-rank window. One test process opens every
//! port (a process per rank would be 72 processes on a 2-core machine).
//! Needs `make build` first (release binaries and the signed image).
//!
//! The group table is per NIC and every local member holds its own copy:
//! 8 ports × `GroupEntry::span` (3 slots for 72 members and 6 trees) = 24
//! of the NIC's 64 slots.

use std::time::Duration;

use emp::{BarrierAlgo, Device, Dtype, Endpoint, Group, GroupOpts, ReduceOp};
use emp_tests::harness::Cluster;
use emp_tests::{expect_ok, wait_for};

const NICS: u16 = 9;
const PORTS: u16 = 8;
const WAIT: Duration = Duration::from_secs(60);

fn wait_all(devs: &mut [Device], wr: u64, what: &str) {
    for (r, d) in devs.iter_mut().enumerate() {
        let c = wait_for(d, wr, WAIT).unwrap_or_else(|e| panic!("{what}: rank {r}: {e}"));
        expect_ok(&c).unwrap_or_else(|e| panic!("{what}: rank {r}: {e}"));
    }
}

#[test]
fn group_of_72_on_nine_nics_runs_every_collective() {
    // Small arenas: 72 devices in one process (set before any thread reads it).
    std::env::set_var("EMP_ARENA_MB", "4");
    let c = Cluster::up("group72", &["-n", &NICS.to_string(), "--ports", &PORTS.to_string()]);
    let n = (NICS * PORTS) as usize;
    let mut devs: Vec<Device> =
        (0..n).map(|i| Device::open_path(&c.sock(i as u16 / PORTS)).expect("open a port")).collect();
    let eps: Vec<Endpoint> = devs.iter().map(|d| d.endpoint()).collect();
    let groups: Vec<Group> = devs
        .iter_mut()
        .enumerate()
        .map(|(r, d)| d.create_group(5, &eps, &GroupOpts::default()).unwrap_or_else(|e| panic!("rank {r}: {e}")))
        .collect();
    assert!(groups.iter().enumerate().all(|(r, g)| g.rank() == r && g.size() == n));

    for (i, algo) in
        [BarrierAlgo::PairwiseExchange, BarrierAlgo::Dissemination, BarrierAlgo::GatherRelease].into_iter().enumerate()
    {
        let wr = 10 + i as u64;
        for (d, g) in devs.iter_mut().zip(&groups) {
            d.post_barrier(wr, g, algo).expect("post barrier");
        }
        wait_all(&mut devs, wr, &format!("barrier {algo:?}"));
    }

    // Broadcast 5000 bytes (several frames) from rank 70.
    let root = 70;
    let len = 5000;
    let mut bufs: Vec<_> = devs.iter_mut().map(|d| d.alloc(len).expect("alloc")).collect();
    for (i, b) in bufs[root].as_mut_slice().iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let want = bufs[root].as_slice().to_vec();
    for ((d, g), b) in devs.iter_mut().zip(&groups).zip(&bufs) {
        d.post_bcast(20, g, root, &[b.sge(0, len)]).expect("post bcast");
    }
    wait_all(&mut devs, 20, "bcast");
    for (r, b) in bufs.iter().enumerate() {
        assert!(b.as_slice() == &want[..], "bcast: rank {r} got other data");
    }

    // Allreduce: u64 sum of rank + 1 over 4 elements (times the index).
    let mut io: Vec<_> = devs.iter_mut().map(|d| d.alloc(64).expect("alloc")).collect();
    for (r, b) in io.iter_mut().enumerate() {
        for i in 0..4 {
            b.as_mut_slice()[8 * i..8 * i + 8].copy_from_slice(&((r as u64 + 1) * (i as u64 + 1)).to_le_bytes());
        }
    }
    for ((d, g), b) in devs.iter_mut().zip(&groups).zip(&io) {
        d.post_allreduce(30, g, Dtype::U64, ReduceOp::Sum, b.sge(0, 32), b.sge(32, 32)).expect("post allreduce");
    }
    wait_all(&mut devs, 30, "allreduce");
    let total = (n * (n + 1) / 2) as u64;
    for (r, b) in io.iter().enumerate() {
        for i in 0..4 {
            let got = u64::from_le_bytes(b.as_slice()[32 + 8 * i..40 + 8 * i].try_into().expect("8 bytes"));
            assert_eq!(got, total * (i as u64 + 1), "allreduce: rank {r} element {i}");
        }
    }

    // Multisend from rank 0 to ranks 64..71 (window 1, mask 0xFF).
    let msg = 300;
    let mut rx: Vec<_> = (64..n).map(|r| devs[r].alloc(msg).expect("alloc")).collect();
    for (i, r) in (64..n).enumerate() {
        devs[r].post_recv(40, eps[0], 9, 0, &[rx[i].sge(0, msg)]).expect("post recv");
    }
    let mut src = devs[0].alloc(msg).expect("alloc");
    src.as_mut_slice().fill(0x5A);
    devs[0].post_multisend_window(41, &groups[0], 1, 0xFF, 9, &[src.sge(0, msg)]).expect("post multisend");
    let c0 = wait_for(&mut devs[0], 41, WAIT).expect("multisend");
    expect_ok(&c0).expect("multisend ok");
    for (i, r) in (64..n).enumerate() {
        let c = wait_for(&mut devs[r], 40, WAIT).unwrap_or_else(|e| panic!("multisend: rank {r}: {e}"));
        expect_ok(&c).unwrap_or_else(|e| panic!("multisend: rank {r}: {e}"));
        assert!(rx[i].as_slice().iter().all(|&b| b == 0x5A), "multisend: rank {r} got other data");
    }
    rx.clear();

    for (d, g) in devs.iter_mut().zip(groups) {
        d.destroy_group(g).expect("destroy group");
    }

    // The daemon's slot runs: NIC 0's table has 64 slots; a group of 1024
    // with the default 6 trees takes 17 (members elsewhere need not exist
    // for the table: only the caller is checked). Three fit, a fourth does
    // not (ENOSPC) and nothing is lost: destroying one makes room again.
    let mut big: Vec<Endpoint> = (1..1024).map(|i| Endpoint { node: 100 + i, port: 0 }).collect();
    big.insert(0, eps[0]);
    let mut held = Vec::new();
    for id in 0..3 {
        held.push(devs[0].create_group(50 + id, &big, &GroupOpts::default()).expect("a group of 1024"));
    }
    match devs[0].create_group(60, &big, &GroupOpts::default()) {
        Err(emp::Error::Nic { errno, .. }) => assert_eq!(errno, libc::ENOSPC, "a fourth group of 1024"),
        other => panic!("a fourth group of 1024: {other:?}, want ENOSPC"),
    }
    // Re-creating one id fits in its own run (the table is full otherwise).
    let again = devs[0].create_group(50, &big, &GroupOpts::default()).expect("re-create in its own slots");
    devs[0].destroy_group(held.remove(1)).expect("destroy");
    let back = devs[0].create_group(60, &big, &GroupOpts::default()).expect("room again after a destroy");
    for g in [again, back].into_iter().chain(held.into_iter().skip(1)) {
        devs[0].destroy_group(g).expect("destroy");
    }
}
