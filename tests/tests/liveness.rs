//! A rank busy-polling its completion queue learns without a system call
//! that its NIC died: the liveness word the NIC advances stands still, and
//! every later call fails.

use std::time::{Duration, Instant};

use emp::{Completion, Device, Endpoint};
use emp_tests::harness::Cluster;
use emp_uapi::sram::NIC_DEAD_NS;

fn daemon_pids(c: &Cluster) -> Vec<i32> {
    let state = std::fs::read_to_string(c.path().join("cluster")).expect("cluster state file");
    let line = state.lines().find_map(|l| l.strip_prefix("pids ")).expect("pids line");
    line.split_whitespace().map(|p| p.parse().expect("pid")).collect()
}

#[test]
fn a_polling_rank_learns_its_nic_died() {
    let c = Cluster::up("liveness", &["-n", "1"]);
    let mut dev = Device::open_path(&c.sock(0)).expect("open");
    let buf = dev.alloc(64).expect("alloc");
    let mut wc = [Completion::default(); 4];
    // Alive: polls come back empty, for longer than the death threshold.
    let until = Instant::now() + Duration::from_nanos(NIC_DEAD_NS) + Duration::from_millis(500);
    while Instant::now() < until {
        assert_eq!(dev.try_poll_cq(&mut wc).expect("the NIC is alive"), 0);
    }
    for pid in daemon_pids(&c) {
        // SAFETY: signalling a daemon this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    }
    let killed = Instant::now();
    let bound = Duration::from_nanos(NIC_DEAD_NS) + Duration::from_secs(3);
    let err = loop {
        match dev.try_poll_cq(&mut wc) {
            Ok(0) => assert!(killed.elapsed() < bound, "no error {bound:?} after the NIC died"),
            Ok(n) => panic!("{n} completions from a dead NIC"),
            Err(e) => break e,
        }
    };
    eprintln!("dead NIC detected after {:?}: {err}", killed.elapsed());
    assert!(dev.try_poll_cq(&mut wc).is_err(), "every later poll fails");
    assert!(dev.wait_cq(&mut wc, Some(Duration::ZERO)).is_err(), "a zero-timeout wait fails");
    assert!(dev.post_send(1, Endpoint { node: 0, port: 0 }, 1, &[buf.sge(0, 8)]).is_err(), "a post fails");
}
