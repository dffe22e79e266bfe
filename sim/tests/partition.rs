//! Partitions against the retry budget: one that heals within the budget
//! loses nothing; one that outlasts it makes sends across it fail with
//! `RetryLimitExceeded`, which the checker expects instead of reporting.

use emp_sim::scenario::{run, Spec};
use emp_sim::world::Partition;

fn partitioned(seed: u64, ms: u64) -> Spec {
    let mut spec = Spec::basic(seed, 4, 50);
    spec.wire.partition =
        Some(Partition { start_ns: 0, end_ns: ms * 1_000_000, side: (0..4).map(|n| n < 2).collect() });
    spec
}

#[test]
fn test_partition_within_the_retry_budget_loses_nothing() {
    let spec = partitioned(1, 1_000);
    assert!(!spec.partition_outlasts_budget());
    let r = run(&spec).unwrap_or_else(|f| panic!("{f:?}"));
    assert_eq!((r.delivered, r.expected_errors), (50, 0));
}

#[test]
fn test_partition_beyond_the_retry_budget_fails_sends_across_it() {
    for seed in 1..4 {
        let spec = partitioned(seed, 5_000);
        assert!(spec.retry_budget_ns() > 2_000_000_000 && spec.partition_outlasts_budget());
        let r = run(&spec).unwrap_or_else(|f| panic!("seed {seed}: {f:?}"));
        assert!(r.expected_errors > 0, "seed {seed}: sends across the partition must give up");
        assert_eq!(r.delivered + r.expected_errors, 50, "seed {seed}: every message accounted for");
    }
}

/// A sender waiting for a receiver that had no buffer (receiver not ready)
/// when the receiver's NIC then goes silent for good (it died): the sends
/// must still fail once the retry budget is spent, not wait forever.
#[test]
fn test_receiver_not_ready_then_dead_fails_the_waiting_sends() {
    use emp_firmware::Config;
    use emp_sim::cluster::Cluster;
    use emp_sim::world::WireConfig;
    use emp_uapi::desc::Status;
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let wrs: Vec<u64> = (0..3).map(|i| c.send(0, 1, 7, &vec![i as u8; 4000])).collect();
    c.run_for(20_000_000); // Refused for lack of a receive: RNR.
    assert!(c.completions(0).is_empty(), "nothing completes while the receiver is not ready");
    let now = c.world.now;
    c.world.wire.partition = Some(Partition { start_ns: now, end_ns: u64::MAX, side: vec![true, false] });
    let budget = Config::default().retry_budget_ns();
    for wr in wrs {
        let cqe = c.wait(0, wr, 4 * budget).unwrap_or_else(|| {
            panic!("send {wr} still waits {} s after its receiver died", 4 * budget / 1_000_000_000)
        });
        assert_eq!(Status::from_u8(cqe.status), Some(Status::RetryLimitExceeded), "{cqe:?}");
    }
}
