//! Blocking on a port's armed event: the eventfd is pollable (epoll) and
//! usable from io_uring; a process waiting on it wakes when a completion
//! arrives, and sleeps (no CPU) until then.

use std::time::{Duration, Instant};

use emp::{Completion, Device, EventSource, ANY};
use emp_tests::harness::Cluster;

fn dev(c: &Cluster, n: u16) -> Device {
    Device::open_path(&c.sock(n)).expect("open")
}

#[test]
fn armed_event_wakes_an_io_uring_read_and_an_epoll_waiter() {
    let c = Cluster::up("uring", &["-n", "2"]);
    let (mut a, mut b) = (dev(&c, 0), dev(&c, 1));
    let (sa, rb) = (a.alloc(64).unwrap(), b.alloc(64).unwrap());
    let mut wc = [Completion::default(); 4];

    // io_uring: a read of the eventfd completes only after the NIC signals.
    b.post_recv(1, ANY, 5, 0, &[rb.sge(0, 64)]).unwrap();
    b.arm();
    assert_eq!(b.poll_cq(&mut wc), 0);
    let mut ring = io_uring::IoUring::new(4).unwrap();
    let mut counter = [0u8; 8];
    let read =
        io_uring::opcode::Read::new(io_uring::types::Fd(b.event_fd()), counter.as_mut_ptr(), 8).build().user_data(7);
    // SAFETY: `counter` outlives the operation (we wait for it below).
    unsafe { ring.submission().push(&read).unwrap() };
    ring.submit().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(ring.completion().next().is_none(), "no completion yet: the read must still be pending");
    a.post_send(2, b.endpoint(), 5, &[sa.sge(0, 64)]).unwrap();
    ring.submit_and_wait(1).unwrap();
    let cqe = ring.completion().next().expect("the eventfd read completed");
    assert_eq!((cqe.user_data(), cqe.result()), (7, 8));
    assert!(u64::from_ne_bytes(counter) >= 1);
    assert_eq!(b.poll_cq(&mut wc), 1);
    assert!(wc[0].is_recv && wc[0].tag == 5);

    // epoll: the same descriptor wakes an epoll waiter.
    b.post_recv(3, ANY, 6, 0, &[rb.sge(0, 64)]).unwrap();
    b.arm();
    assert_eq!(b.poll_cq(&mut wc), 0);
    // SAFETY: plain epoll calls on descriptors we own.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 1 };
    // SAFETY: valid epoll fd, valid eventfd, live event struct.
    assert_eq!(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, b.event_fd(), &mut ev) }, 0);
    let to = b.endpoint();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        a.post_send(4, to, 6, &[sa.sge(0, 64)]).unwrap();
        a
    });
    let t = Instant::now();
    let mut out = [libc::epoll_event { events: 0, u64: 0 }; 1];
    // SAFETY: waiting on our epoll fd into a live array.
    let n = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 1, 10_000) };
    assert_eq!(n, 1, "epoll woke");
    assert!(t.elapsed() >= Duration::from_millis(20), "it slept until the message came");
    drop(sender.join().unwrap());
    assert_eq!(b.wait_cq(&mut wc, Some(Duration::from_secs(5))).unwrap(), 1);
    // SAFETY: closing our epoll fd.
    unsafe { libc::close(ep) };
}

#[test]
fn wait_wr_sets_other_completions_aside_for_poll_cq() {
    let c = Cluster::up("waitwr", &["-n", "2"]);
    let (mut a, mut b) = (dev(&c, 0), dev(&c, 1));
    let (sa, rb) = (a.alloc(64).unwrap(), b.alloc(128).unwrap());
    b.post_recv(1, ANY, 9, 0, &[rb.sge(0, 64)]).unwrap();
    b.post_recv(2, ANY, 9, 0, &[rb.sge(64, 64)]).unwrap();
    a.post_send(3, b.endpoint(), 9, &[sa.sge(0, 8)]).unwrap();
    a.post_send(4, b.endpoint(), 9, &[sa.sge(0, 8)]).unwrap();
    // Waiting for the second receive takes the first off the CQ too.
    assert_eq!(b.wait_wr(2, Some(Duration::from_secs(10))).unwrap().wr_id, 2);
    let mut wc = [Completion::default(); 4];
    assert_eq!(b.poll_cq(&mut wc), 1, "the first receive was set aside, not lost");
    assert_eq!(wc[0].wr_id, 1);
    assert_eq!(b.poll_cq(&mut wc), 0);
    assert!(matches!(b.wait_wr(7, Some(Duration::from_millis(50))), Err(emp::Error::Timeout)));
    for wr in [3, 4] {
        assert_eq!(a.wait_wr(wr, Some(Duration::from_secs(10))).unwrap().wr_id, wr);
    }
}
