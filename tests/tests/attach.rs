//! A hostile or broken client on the direct-attach socket: malformed
//! requests get error replies, a doorbell storm on one port does not
//! disturb the others, and the daemon keeps serving.

use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use emp::{Completion, Device, Status};
use emp_tests::harness::Cluster;
use emp_uapi::attach::{op, AttachMsg, ATTACH_VERSION};
use emp_uapi::Le;
use nix::sys::socket::{
    connect, recvmsg, send, sendmsg, socket, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};

fn raw(path: &str) -> OwnedFd {
    let s = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).unwrap();
    connect(s.as_raw_fd(), &UnixAddr::new(path).unwrap()).unwrap();
    s
}

/// Sends `bytes` (with `fds`) and returns the reply and descriptors.
fn exchange(s: RawFd, bytes: &[u8], fds: &[RawFd]) -> (AttachMsg, Vec<OwnedFd>) {
    let iov = [std::io::IoSlice::new(bytes)];
    let cm = [ControlMessage::ScmRights(fds)];
    sendmsg::<()>(s, &iov, if fds.is_empty() { &[] } else { &cm }, MsgFlags::empty(), None).unwrap();
    let mut b = [0u8; AttachMsg::SIZE];
    let mut space = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(&mut b)];
    let m = recvmsg::<()>(s, &mut iov, Some(&mut space), MsgFlags::empty()).unwrap();
    let mut got = Vec::new();
    for c in m.cmsgs().unwrap() {
        if let ControlMessageOwned::ScmRights(v) = c {
            // SAFETY: received descriptors are ours.
            got.extend(v.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    assert_eq!(m.bytes, AttachMsg::SIZE, "every request gets one full reply");
    (AttachMsg::get(&b), got)
}

fn msg(opcode: u32, args: &[u64]) -> [u8; AttachMsg::SIZE] {
    let mut m = AttachMsg { version: ATTACH_VERSION, op: opcode, ..Default::default() };
    m.arg[..args.len()].copy_from_slice(args);
    let mut b = [0u8; AttachMsg::SIZE];
    m.put(&mut b);
    b
}

fn ping_pong(a: &mut Device, b: &mut Device, rounds: u64) {
    let (sa, rb) = (a.alloc(4096).unwrap(), b.alloc(4096).unwrap());
    let mut wc = [Completion::default(); 8];
    for i in 0..rounds {
        b.post_recv(i, a.endpoint(), i, 0, &[rb.sge(0, 4096)]).unwrap();
        a.post_send(i, b.endpoint(), i, &[sa.sge(0, (i as usize * 37) % 4096)]).unwrap();
        let mut got = (false, false);
        let end = Instant::now() + Duration::from_secs(20);
        while !(got.0 && got.1) {
            assert!(Instant::now() < end, "round {i} stalled");
            let n = b.poll_cq(&mut wc);
            for c in &wc[..n] {
                assert_eq!(c.status, Status::Success);
                got.1 = true;
            }
            let n = a.poll_cq(&mut wc);
            for c in &wc[..n] {
                assert_eq!(c.status, Status::Success);
                got.0 = true;
            }
        }
    }
}

#[test]
fn malformed_requests_get_errors_and_the_daemon_keeps_serving() {
    let c = Cluster::up("garbage", &["-n", "2"]);
    let s = raw(&c.sock(0));
    // Before ATTACH, port operations are refused.
    let (r, _) = exchange(s.as_raw_fd(), &msg(op::START, &[1, 0, 64]), &[]);
    assert_ne!(r.status, 0);
    // Wrong version, unknown op, short and long messages.
    let mut bad = msg(op::ATTACH, &[]);
    bad[0] = 99;
    assert_ne!(exchange(s.as_raw_fd(), &bad, &[]).0.status, 0);
    assert_ne!(exchange(s.as_raw_fd(), &msg(777, &[]), &[]).0.status, 0);
    assert_ne!(exchange(s.as_raw_fd(), &[1, 2, 3], &[]).0.status, 0);
    // A real attach, then nonsense on the port.
    let (r, fds) = exchange(s.as_raw_fd(), &msg(op::ATTACH, &[]), &[]);
    assert_eq!((r.status, fds.len()), (0, 3));
    assert_ne!(exchange(s.as_raw_fd(), &msg(op::ATTACH, &[]), &[]).0.status, 0, "attach twice");
    assert_ne!(exchange(s.as_raw_fd(), &msg(op::REG_ARENA, &[0, 4096, 3]), &[]).0.status, 0, "no fd");
    let (p0, _p1) = nix::unistd::pipe().unwrap();
    assert_ne!(
        exchange(s.as_raw_fd(), &msg(op::REG_ARENA, &[0, 4096, 3]), &[p0.as_raw_fd()]).0.status,
        0,
        "a pipe is no memory"
    );
    // A memfd that could shrink under the NIC is refused.
    let name = std::ffi::CString::new("unsealed").unwrap();
    // SAFETY: creating and sizing a memfd we own.
    let mfd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC)) };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::ftruncate(mfd.as_raw_fd(), 65536) }, 0);
    assert_eq!(
        exchange(s.as_raw_fd(), &msg(op::REG_ARENA, &[0, 65536, 3]), &[mfd.as_raw_fd()]).0.status,
        libc::EPERM,
        "unsealed memfd"
    );
    assert_ne!(exchange(s.as_raw_fd(), &msg(op::REG_VM, &[16, 4096, 3]), &[]).0.status, 0, "unmapped address");
    assert_ne!(exchange(s.as_raw_fd(), &msg(op::REG_VM, &[0x1000, u64::MAX, 3]), &[]).0.status, 0, "huge length");
    assert_ne!(exchange(s.as_raw_fd(), &msg(op::DEREG, &[12345]), &[]).0.status, 0, "unknown key");
    assert_ne!(exchange(s.as_raw_fd(), &msg(op::START, &[0xdead, 0, 64]), &[]).0.status, 0, "bad CQ key");
    assert_ne!(exchange(s.as_raw_fd(), &msg(op::START, &[0, 0, 63]), &[]).0.status, 0, "CQ not a power of two");
    send(s.as_raw_fd(), &[0u8; 0], MsgFlags::empty()).ok();
    drop(s);
    // Others are unaffected and the released port is reusable.
    let (mut a, mut b) = (Device::open_path(&c.sock(0)).unwrap(), Device::open_path(&c.sock(1)).unwrap());
    ping_pong(&mut a, &mut b, 50);
}

#[test]
fn doorbell_storm_on_one_port_does_not_disturb_others() {
    let c = Cluster::up("storm", &["-n", "2"]);
    let s = raw(&c.sock(0));
    let (r, fds) = exchange(s.as_raw_fd(), &msg(op::ATTACH, &[]), &[]);
    assert_eq!(r.status, 0);
    let doorbell = fds[1].as_raw_fd();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let storm = std::thread::spawn(move || {
        let one = 1u64.to_ne_bytes();
        let mut n = 0u64;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: writing 8 bytes to an eventfd we hold.
            unsafe { libc::write(doorbell, one.as_ptr().cast(), 8) };
            n += 1;
        }
        n
    });
    let (mut a, mut b) = (Device::open_path(&c.sock(0)).unwrap(), Device::open_path(&c.sock(1)).unwrap());
    ping_pong(&mut a, &mut b, 500);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(storm.join().unwrap() > 1000, "the storm really ran");
    drop(fds);
}

#[test]
fn a_process_cannot_resize_its_port_window() {
    let c = Cluster::up("resize", &["-n", "1"]);
    let s = raw(&c.sock(0));
    let (r, fds) = exchange(s.as_raw_fd(), &msg(op::ATTACH, &[]), &[]);
    assert_eq!(r.status, 0);
    // SAFETY: ftruncate on a descriptor we received; it must be refused.
    assert_ne!(unsafe { libc::ftruncate(fds[0].as_raw_fd(), 0) }, 0, "shrinking the window must fail");
    // SAFETY: as above.
    assert_ne!(unsafe { libc::ftruncate(fds[0].as_raw_fd(), 1 << 30) }, 0, "growing the window must fail");
    drop(s);
    let mut d = Device::open_path(&c.sock(0)).expect("the NIC still serves");
    let _ = d.alloc(64).unwrap();
}

#[test]
fn a_port_cannot_use_another_ports_memory_key() {
    let c = Cluster::up("isolation", &["-n", "2"]);
    let mut owner = Device::open_path(&c.sock(0)).unwrap();
    let mut thief = Device::open_path(&c.sock(0)).unwrap();
    let mut peer = Device::open_path(&c.sock(1)).unwrap();
    assert_ne!(owner.endpoint(), thief.endpoint(), "one port per process");
    let mut secret = owner.alloc(4096).unwrap();
    secret.as_mut_slice()[..6].copy_from_slice(b"secret");
    let rb = peer.alloc(4096).unwrap();
    peer.post_recv(1, thief.endpoint(), 9, 0, &[rb.sge(0, 4096)]).unwrap();
    // The thief names the owner's region by its key: the NIC refuses.
    thief.post_send(2, peer.endpoint(), 9, &[secret.sge(0, 6)]).unwrap();
    let mut wc = [Completion::default(); 4];
    let n = thief.wait_cq(&mut wc, Some(Duration::from_secs(10))).unwrap();
    assert_eq!((n, wc[0].status), (1, Status::BadKey));
    assert_eq!(peer.poll_cq(&mut wc), 0, "nothing was sent");
    assert_ne!(&rb.as_slice()[..6], b"secret");
}
