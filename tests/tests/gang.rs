//! Gang scheduling on the chassis (docs/context-switch.md, `emp gang`): two
//! NICs with one port slot each, two jobs of two ranks each that both need
//! that slot on both NICs (and the same with four ranks on four NICs). The unmodified `tap-p2p` runs as both jobs
//! under `emp gang` with a 20 ms slice; both pass, with switches counted.

use emp_tests::harness::{emp, Cluster};

#[test]
fn two_jobs_share_single_slot_nics_in_time_slices() {
    two_jobs("gang2", 2);
}

/// Issue 15's case: two jobs × 4 ranks on 4 NICs of one slot each.
#[test]
fn two_four_rank_jobs_on_four_single_slot_nics() {
    two_jobs("gang4", 4);
}

/// Two `tap-p2p` jobs of `ranks` ranks on `ranks` NICs of one slot each.
fn two_jobs(name: &str, ranks: usize) {
    let c = Cluster::up(name, &["-n", &ranks.to_string(), "--ports", "1"]);
    let job = format!("{ranks} {}", env!("CARGO_BIN_EXE_tap-p2p"));
    let out = emp()
        .args(["gang", "--slice-ms", "20", "--stable-ms", "300", "--timeout", "240", "--dir"])
        .arg(c.path())
        .args(["--job", &job, "--job", &job])
        .env("EMP_TAP_BIG_MB", "16")
        .output()
        .expect("emp gang");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "emp gang exited {:?}", out.status);
    // Each job's rank 0 prints its TAP summary: both must be there.
    assert_eq!(stdout.matches("# 10 passed, 0 failed").count(), 2, "both jobs' TAP summaries");
    assert!(!stdout.contains("not ok"), "a TAP case failed");
    for i in 0..2 {
        assert!(stdout.contains(&format!("emp gang: job {i} exited with status 0")), "job {i}");
    }
    let switches: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("emp gang: 2 jobs, ")?.split_whitespace().next()?.parse().ok())
        .expect("the switch count line");
    assert!(switches >= 4, "only {switches} switches: the jobs did not take turns");
}

/// A job that fails while the other is switched out ends alone: the other
/// is switched back in and passes; `emp gang` reports the failure.
#[test]
fn a_failing_job_ends_alone_and_the_other_completes() {
    let c = Cluster::up("gangfail", &["-n", "2", "--ports", "1"]);
    let good = format!("2 {}", env!("CARGO_BIN_EXE_tap-p2p"));
    let out = emp()
        .args(["gang", "--slice-ms", "20", "--stable-ms", "300", "--timeout", "240", "--dir"])
        .arg(c.path())
        .args(["--job", &good, "--job", "2 false"])
        .env("EMP_TAP_BIG_MB", "16")
        .output()
        .expect("emp gang");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "the failing job's status");
    assert!(stdout.contains("# 10 passed, 0 failed"), "the good job's TAP summary");
    assert!(stdout.contains("emp gang: job 0 exited with status 0"));
    assert!(stdout.contains("emp gang: job 1 exited with status 1"));
}
