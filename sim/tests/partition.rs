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
