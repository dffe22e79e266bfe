//! Gang scheduling on the chassis (docs/context-switch.md, `emp gang`): two
//! NICs with one port slot each, two jobs of two ranks each that both need
//! that slot on both NICs (and the same with four ranks on four NICs). The unmodified `tap-p2p` runs as both jobs
//! under `emp gang` with a 20 ms slice; both pass, with switches counted.
//! The same with `tap-coll` (groups, barriers, reductions, broadcasts,
//! multisends): contexts are switched out between and in the middle of
//! barriers and reductions (docs/context-switch.md).

use emp_tests::harness::{emp, Cluster};

#[test]
fn two_jobs_share_single_slot_nics_in_time_slices() {
    two_jobs("gang2", 2, env!("CARGO_BIN_EXE_tap-p2p"), 10);
}

/// Issue 15's case: two jobs × 4 ranks on 4 NICs of one slot each.
#[test]
fn two_four_rank_jobs_on_four_single_slot_nics() {
    two_jobs("gang4", 4, env!("CARGO_BIN_EXE_tap-p2p"), 10);
}

/// Two jobs of collectives, each with its own group of the same id on the
/// same slots, switched in turn (20 ms slices).
#[test]
fn two_collective_jobs_share_single_slot_nics_in_time_slices() {
    two_jobs("gangcoll", 2, env!("CARGO_BIN_EXE_tap-coll"), 12);
}

/// Two jobs of reliable broadcasts (every scheme: window, co-roots, ACK
/// every M, NAKs) on the same single-slot NICs, switched in turn: their
/// groups' reliable-broadcast state travels in the saved contexts, and the
/// second job, at other wire addresses in the same slots, is reached by
/// its own frames only.
#[test]
fn two_reliable_broadcast_jobs_share_single_slot_nics_in_time_slices() {
    two_jobs_with("gangrb", 3, env!("CARGO_BIN_EXE_tap-rbcast"), 3, &[("EMP_TAP_RBCAST_ROUNDS", "150")]);
}

/// Two jobs running `program` (a TAP suite of `cases` cases) with `ranks`
/// ranks on `ranks` NICs of one slot each.
fn two_jobs(name: &str, ranks: usize, program: &str, cases: usize) {
    two_jobs_with(name, ranks, program, cases, &[]);
}

/// As [`two_jobs`], with `env` set for the jobs.
fn two_jobs_with(name: &str, ranks: usize, program: &str, cases: usize, env: &[(&str, &str)]) {
    let c = Cluster::up(name, &["-n", &ranks.to_string(), "--ports", "1"]);
    let job = format!("{ranks} {program}");
    let out = emp()
        .args(["gang", "--slice-ms", "20", "--stable-ms", "300", "--timeout", "240", "--dir"])
        .arg(c.path())
        .args(["--job", &job, "--job", &job])
        .env("EMP_TAP_BIG_MB", "16")
        .envs(env.iter().copied())
        .output()
        .expect("emp gang");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "emp gang exited {:?}", out.status);
    // Each job's rank 0 prints its TAP summary: both must be there.
    assert_eq!(stdout.matches(&format!("# {cases} passed, 0 failed")).count(), 2, "both jobs' TAP summaries");
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

/// The daemon's side of a switch, driven directly: a port switched out is
/// refused requests (`EAGAIN`), its slot goes to another port, a restore
/// into the taken slot is refused (`EBUSY`) and changes nothing, and when
/// the switched-out port's connection closes its context is discarded while
/// the port now in the slot keeps working.
#[test]
fn a_port_closed_while_switched_out_is_discarded_and_its_slot_kept() {
    use emp::{nic_gang, Completion, Device, Error, Status};
    use emp_uapi::attach::gang;
    use std::time::{Duration, Instant};

    let c = Cluster::up("gangclose", &["-n", "1", "--ports", "1"]);
    let sock = c.sock(0);
    let me = std::process::id() as i32;
    let mut a = Device::open_path(&sock).expect("first port");
    assert_eq!(nic_gang(&sock, gang::PORTS, me).expect("ports").arg[0], 1);
    assert_eq!(nic_gang(&sock, gang::SUSPEND, me).expect("suspend").arg[0], 1);
    let end = Instant::now() + Duration::from_secs(10);
    while nic_gang(&sock, gang::STABLE, me).expect("stable").arg[1] != 1 {
        assert!(Instant::now() < end, "an idle port never became stable");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(nic_gang(&sock, gang::SAVE, me).expect("save").arg[0], 1);
    // Its own requests are refused meanwhile (its process would be stopped).
    match a.suspend() {
        Err(Error::Nic { errno, .. }) => assert_eq!(errno, libc::EAGAIN),
        r => panic!("a switched-out port's request was served: {r:?}"),
    }
    // The only slot is free: another port takes it.
    let mut b = Device::open_path(&sock).expect("a second port in the freed slot");
    match nic_gang(&sock, gang::RESTORE, me) {
        Err(Error::Nic { errno, .. }) => assert_eq!(errno, libc::EBUSY),
        r => panic!("restored into a taken slot: {r:?}"),
    }
    drop(a);
    // The daemon discards the context on its own thread; then nothing is left to restore.
    let end = Instant::now() + Duration::from_secs(10);
    while nic_gang(&sock, gang::RESTORE, me).map(|m| m.arg[0]).is_err() {
        assert!(Instant::now() < end, "the closed port's context was never discarded");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(nic_gang(&sock, gang::PORTS, me).expect("ports").arg[0], 1, "the second port kept its slot");
    // And it works: a message to itself.
    let buf = b.alloc(8192).expect("alloc");
    let me_ep = b.endpoint();
    b.post_recv(1, me_ep, 7, 0, &[buf.sge(4096, 64)]).expect("recv");
    b.post_send(2, me_ep, 7, &[buf.sge(0, 64)]).expect("send");
    let (mut wc, mut done) = ([Completion::default(); 4], 0);
    let end = Instant::now() + Duration::from_secs(10);
    while done < 2 {
        assert!(Instant::now() < end, "the port in the slot stalled");
        let n = b.poll_cq(&mut wc);
        for cqe in &wc[..n] {
            assert_eq!(cqe.status, Status::Success);
            done += 1;
        }
    }
}
