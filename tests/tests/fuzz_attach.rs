//! Direct-attach requests at volume against a real `emp-nicd`: random and
//! mutated-valid requests (every op, edge-value arguments, wrong versions,
//! short and long messages, memfds of random sizes, eventfds and `/dev/null`
//! passed as arenas, too many descriptors), over connections opened and
//! dropped at random. Afterwards the daemon must be alive, every port and
//! region the fuzzer took must be released, and a legitimate process must
//! still send and receive. A few seconds in `make test`;
//! `EMP_FUZZ_SECONDS=600 cargo test -p emp-tests --test fuzz_attach --
//! --nocapture` for a long run. Needs `make build`.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use emp::{Device, Status};
use emp_tests::harness::Cluster;
use emp_uapi::attach::{op, AttachMsg, ATTACH_VERSION};
use emp_uapi::Le;
use nix::sys::socket::{
    connect, recvmsg, sendmsg, socket, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn arg(&mut self) -> u64 {
        match self.below(8) {
            0 => self.next(),
            1 => u64::MAX - self.below(2),
            2 => 1 << self.below(64),
            3 => 0,
            _ => self.below(4096),
        }
    }
}

fn budget() -> Duration {
    Duration::from_secs_f64(std::env::var("EMP_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4.0))
}

fn connect_nic(path: &std::path::Path) -> OwnedFd {
    let s = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).expect("socket");
    connect(s.as_raw_fd(), &UnixAddr::new(path).expect("addr")).expect("connect to the NIC");
    let tv = libc::timeval { tv_sec: 5, tv_usec: 0 };
    // SAFETY: setting a receive timeout on our socket from a live timeval.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as u32,
        )
    };
    assert_eq!(r, 0);
    s
}

/// A descriptor to pass along with a request.
fn some_fd(rng: &mut Rng) -> OwnedFd {
    // SAFETY: plain syscalls creating descriptors we then own.
    unsafe {
        let fd = match rng.below(3) {
            0 => {
                let fd = libc::memfd_create(c"emp-fuzz".as_ptr(), libc::MFD_CLOEXEC);
                libc::ftruncate(fd, (rng.below(4) * 4096 + rng.below(2) * rng.below(5000)) as i64);
                fd
            }
            1 => libc::eventfd(0, libc::EFD_CLOEXEC),
            _ => libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC),
        };
        assert!(fd >= 0);
        OwnedFd::from_raw_fd(fd)
    }
}

/// One request and its reply; false when the daemon closed the connection
/// (its answer to a protocol error) or did not answer.
fn exchange(sock: RawFd, rng: &mut Rng) -> Result<bool, String> {
    let mut m = AttachMsg {
        version: if rng.below(16) == 0 { rng.next() as u32 } else { ATTACH_VERSION },
        op: if rng.below(16) == 0 { rng.next() as u32 } else { rng.below(11) as u32 },
        status: if rng.below(8) == 0 { rng.next() as i32 } else { 0 },
        reserved: if rng.below(8) == 0 { rng.next() as u32 } else { 0 },
        arg: [0; 22],
    };
    for a in &mut m.arg[..1 + rng.below(22) as usize] {
        *a = rng.arg();
    }
    let mut b = vec![0u8; AttachMsg::SIZE + 16];
    m.put(&mut b);
    let len = match rng.below(10) {
        0 => rng.below(b.len() as u64 + 1) as usize,
        _ => AttachMsg::SIZE,
    };
    let fds: Vec<OwnedFd> = match rng.below(6) {
        0..=2 => vec![],
        3 | 4 => vec![some_fd(rng)],
        _ => (0..1 + rng.below(8)).map(|_| some_fd(rng)).collect(),
    };
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cm: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    if sendmsg::<()>(sock, &[IoSlice::new(&b[..len])], cm, MsgFlags::MSG_NOSIGNAL, None).is_err() {
        return Ok(false);
    }
    let mut rb = [0u8; AttachMsg::SIZE + 1];
    let mut cspace = nix::cmsg_space!([RawFd; 8]);
    let mut iov = [IoSliceMut::new(&mut rb)];
    let r = match recvmsg::<()>(sock, &mut iov, Some(&mut cspace), MsgFlags::MSG_CMSG_CLOEXEC) {
        Ok(r) => r,
        Err(nix::errno::Errno::EAGAIN) => return Err(format!("no reply in 5 s to {m:?} ({len} bytes)")),
        Err(_) => return Ok(false),
    };
    // Own (and so close) whatever the daemon passed back.
    for c in r.cmsgs().into_iter().flatten() {
        if let ControlMessageOwned::ScmRights(v) = c {
            // SAFETY: SCM_RIGHTS gave us new descriptors we own.
            drop(v.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }).collect::<Vec<_>>());
        }
    }
    if r.bytes == 0 {
        return Ok(false);
    }
    if r.bytes != AttachMsg::SIZE {
        return Err(format!("a reply of {} bytes to {m:?}", r.bytes));
    }
    Ok(true)
}

/// (ports in use, regions registered) as the daemon reports them.
fn usage(path: &std::path::Path) -> (u64, u64) {
    let s = connect_nic(path);
    let m = AttachMsg { version: ATTACH_VERSION, op: op::STATS, ..Default::default() };
    let mut b = [0u8; AttachMsg::SIZE];
    m.put(&mut b);
    sendmsg::<()>(s.as_raw_fd(), &[IoSlice::new(&b)], &[], MsgFlags::MSG_NOSIGNAL, None).expect("send STATS");
    let mut rb = [0u8; AttachMsg::SIZE];
    let n = nix::sys::socket::recv(s.as_raw_fd(), &mut rb, MsgFlags::empty()).expect("the daemon answers STATS");
    assert_eq!(n, AttachMsg::SIZE);
    let r = AttachMsg::decode(&rb).expect("reply");
    (r.arg[18], r.arg[21])
}

/// Descriptors the (only) daemon holds.
fn daemon_fds(c: &Cluster) -> usize {
    let state = std::fs::read_to_string(c.path().join("cluster")).expect("cluster state file");
    let pid = state.lines().find_map(|l| l.strip_prefix("pids ")).expect("pids line").trim().to_string();
    std::fs::read_dir(format!("/proc/{pid}/fd")).expect("daemon fds").count()
}

#[test]
fn fuzz_direct_attach_requests() {
    let c = Cluster::up("fuzzattach", &["-n", "1"]);
    let path = c.socket(0);
    let before = usage(&path);
    let fds_before = daemon_fds(&c);
    let seed = 0x00a7_7ac4_u64;
    let mut rng = Rng(seed);
    let (start, mut requests, mut connections) = (Instant::now(), 0u64, 0u64);
    while start.elapsed() < budget() {
        let sock = connect_nic(&path);
        connections += 1;
        for _ in 0..1 + rng.below(40) {
            requests += 1;
            match exchange(sock.as_raw_fd(), &mut rng) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => panic!("request {requests} (seed {seed:#x}): {e}"),
            }
        }
    }
    // Dropped connections release their ports and regions.
    let deadline = Instant::now() + Duration::from_secs(10);
    let after = loop {
        let u = usage(&path);
        if u == before || Instant::now() > deadline {
            break u;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "fuzz attach seed {seed:#x}: {requests} requests over {connections} connections, 0 crashes; \
         (ports, regions) before {before:?} after {after:?}"
    );
    assert_eq!(after, before, "ports or regions leaked by fuzzed connections");
    let fds_after = daemon_fds(&c);
    eprintln!("daemon descriptors: {fds_before} before, {fds_after} after");
    assert!(fds_after <= fds_before + 2, "the daemon leaked descriptors: {fds_before} before, {fds_after} after");
    // A legitimate process is still served.
    let mut dev = Device::open_path(&c.sock(0)).expect("open after fuzzing");
    let buf = dev.alloc(128).expect("alloc");
    let me = dev.endpoint();
    dev.post_recv(1, me, 9, 0, &[buf.sge(64, 64)]).expect("post_recv");
    dev.post_send(2, me, 9, &[buf.sge(0, 64)]).expect("post_send");
    for wr in [2, 1] {
        let wc = dev.wait_wr(wr, Some(Duration::from_secs(10))).expect("completion");
        assert_eq!(wc.status, Status::Success);
    }
}

/// Found by the fuzzer: a request carrying more descriptors than the daemon
/// had room for was truncated, and the descriptors that did arrive leaked
/// (the daemon ran out: EMFILE on the next ATTACH).
#[test]
fn descriptors_beyond_what_a_request_uses_are_closed() {
    let c = Cluster::up("fdleak", &["-n", "1"]);
    let path = c.socket(0);
    let before = daemon_fds(&c);
    let m = AttachMsg { version: ATTACH_VERSION, op: op::STATS, ..Default::default() };
    let mut b = [0u8; AttachMsg::SIZE];
    m.put(&mut b);
    let mut rng = Rng(1);
    for n in [1usize, 4, 5, 8, 64, 200] {
        let sock = connect_nic(&path);
        let fds: Vec<OwnedFd> = (0..n).map(|_| some_fd(&mut rng)).collect();
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let cmsg = [ControlMessage::ScmRights(&raw)];
        sendmsg::<()>(sock.as_raw_fd(), &[IoSlice::new(&b)], &cmsg, MsgFlags::MSG_NOSIGNAL, None).expect("send");
        let mut rb = [0u8; AttachMsg::SIZE];
        let got = nix::sys::socket::recv(sock.as_raw_fd(), &mut rb, MsgFlags::empty()).expect("reply");
        assert_eq!(got, AttachMsg::SIZE, "STATS with {n} descriptors is answered");
    }
    // The connections are closed; their client threads end.
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon_fds(&c) > before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = daemon_fds(&c);
    assert!(
        after <= before,
        "descriptors passed with requests stay open in the daemon: {before} before, {after} after"
    );
}
