//! The NIC daemon's engine thread is often late on a loaded machine (busy
//! copying a window, or not scheduled at all). A retransmission timer must
//! measure a lost frame or a silent peer, never that lateness: on the
//! in-memory wire, which loses nothing, stopping the daemon again and again
//! in the middle of 1 MiB transfers costs no timeout and no retransmission
//! (nic/src/engine.rs, `Engine::pass`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use emp::{Device, Endpoint};
use emp_tests::harness::Cluster;
use emp_uapi::sram::counter;

fn daemon_pids(c: &Cluster) -> Vec<i32> {
    let state = std::fs::read_to_string(c.path().join("cluster")).expect("cluster state file");
    let line = state.lines().find_map(|l| l.strip_prefix("pids ")).expect("pids line");
    line.split_whitespace().map(|p| p.parse().expect("pid")).collect()
}

/// Stops the daemons 3 ms in every 10 ms until dropped; the drop lets them
/// run again whatever happened.
struct Stopper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pids: Vec<i32>,
}

fn signal(pids: &[i32], sig: libc::c_int) {
    for &pid in pids {
        // SAFETY: signalling a daemon this test started.
        unsafe { libc::kill(pid, sig) };
    }
}

impl Stopper {
    fn start(pids: Vec<i32>) -> Stopper {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, p) = (stop.clone(), pids.clone());
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Acquire) {
                signal(&p, libc::SIGSTOP);
                std::thread::sleep(Duration::from_millis(3));
                signal(&p, libc::SIGCONT);
                std::thread::sleep(Duration::from_millis(7));
            }
        });
        Stopper { stop, thread: Some(thread), pids }
    }
}

impl Drop for Stopper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        signal(&self.pids, libc::SIGCONT);
    }
}

#[test]
fn a_late_engine_fires_no_retransmission_timer() {
    const LEN: usize = 256 << 10;
    const WINDOW: usize = 16;
    const WINDOWS: u64 = 12;
    let c = Cluster::up("engine-stall", &["-n", "2"]);
    let mut tx = Device::open_path(&c.sock(0)).expect("open NIC 0");
    let mut rx = Device::open_path(&c.sock(1)).expect("open NIC 1");
    let mut sbuf = tx.alloc(LEN * WINDOW).expect("alloc");
    let rbuf = rx.alloc(LEN * WINDOW).expect("alloc");
    let (to, from): (Endpoint, Endpoint) = (rx.endpoint(), tx.endpoint());
    let before = (tx.nic_counters().expect("counters"), rx.nic_counters().expect("counters"));
    let stopper = Stopper::start(daemon_pids(&c));
    let limit = Some(Duration::from_secs(30));
    for w in 0..WINDOWS {
        let pattern = |j: usize| (j as u64).wrapping_mul(2654435761).wrapping_add(w) as u8;
        sbuf.as_mut_slice().iter_mut().enumerate().for_each(|(j, b)| *b = pattern(j));
        let ids = |k: usize| (w * 2 * WINDOW as u64 + 2 * k as u64, w * 2 * WINDOW as u64 + 2 * k as u64 + 1);
        for k in 0..WINDOW {
            rx.post_recv(ids(k).1, from, k as u64, 0, &[rbuf.sge(k * LEN, LEN)]).expect("post_recv");
        }
        for k in 0..WINDOW {
            tx.post_send(ids(k).0, to, k as u64, &[sbuf.sge(k * LEN, LEN)]).expect("post_send");
        }
        for k in 0..WINDOW {
            let r = rx.wait_wr(ids(k).1, limit).expect("the receive completes");
            assert_eq!((r.status, r.byte_len as usize), (emp::Status::Success, LEN), "window {w} message {k}");
            assert_eq!(tx.wait_wr(ids(k).0, limit).expect("the send completes").status, emp::Status::Success);
        }
        assert!(rbuf.as_slice().iter().enumerate().all(|(j, &b)| b == pattern(j)), "window {w}: data intact");
    }
    drop(stopper);
    let after = (tx.nic_counters().expect("counters"), rx.nic_counters().expect("counters"));
    let delta = |c: usize| (after.0[c] - before.0[c], after.1[c] - before.1[c]);
    eprintln!(
        "timeouts {:?}, retransmits {:?}, duplicates {:?} (NIC 0, NIC 1)",
        delta(counter::TIMEOUTS),
        delta(counter::RETRANSMITS),
        delta(counter::DUPLICATES)
    );
    assert_eq!(delta(counter::TIMEOUTS), (0, 0), "retransmission timers fired on a wire that loses nothing");
    assert_eq!(delta(counter::RETRANSMITS), (0, 0), "frames sent twice on a wire that loses nothing");
}
