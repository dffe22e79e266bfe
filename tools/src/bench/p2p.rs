//! `emp bench latency|bw|bibw`: OSU-style micro-benchmarks between two
//! ranks, EMP and TCP measured side by side in the same run by the same
//! method (the TCP side is implemented here too): TCP over loopback on one
//! machine, over the cluster's link between two hosts (`--config`).
//!
//! - latency: ping-pong, one-way latency = round trip / 2 (µs);
//! - bw: the sender streams windows of 64 messages, the receiver answers
//!   each window with a 4-byte ack (MB/s, 10^6 bytes);
//! - bibw: both ranks stream at once (MB/s, both directions summed).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use emp::rdv::Job;
use emp::{Buffer, Completion, Device, Endpoint, MemSpan, Status};

use super::{err, print_json, BenchArgs, Json, Kind, Waiter};

const WINDOW: usize = 64;

fn default_sizes(k: Kind) -> Vec<usize> {
    match k {
        Kind::Latency => vec![1, 8, 64, 512, 4096, 16384, 65536, 262144, 1 << 20],
        _ => vec![64, 1024, 8192, 65536, 262144, 1 << 20],
    }
}

fn iters_for(k: Kind, size: usize, given: Option<usize>) -> (usize, usize) {
    if let Some(n) = given {
        return (n, (n / 10).max(1));
    }
    match k {
        Kind::Latency if size <= 4096 => (2000, 200),
        Kind::Latency if size <= 65536 => (500, 50),
        Kind::Latency => (100, 10),
        _ if size <= 65536 => (40, 4),
        _ => (8, 2),
    }
}

/// Counts completions; any error completion aborts the benchmark.
struct Cq {
    sends: usize,
    /// Data receives.
    recvs: usize,
    /// Handshake receives (tag bit HS).
    hs: usize,
    waiter: Waiter,
    buf: [Completion; 64],
}

/// Tag bit of handshake messages.
const HS: u64 = 1 << 32;

/// How long [`Cq::until`] waits for progress before calling the run stalled.
const STALL: Duration = Duration::from_secs(30);

impl Cq {
    fn new(blocking: bool) -> Cq {
        Cq { sends: 0, recvs: 0, hs: 0, waiter: Waiter::blocking(blocking, STALL), buf: [Completion::default(); 64] }
    }

    fn poll(&mut self, dev: &mut Device) -> Result<(), String> {
        let n = self.waiter.reap(dev, &mut self.buf).map_err(err)?;
        for c in &self.buf[..n] {
            if c.status != Status::Success {
                return Err(format!("completion {} failed: {}", c.wr_id, c.status.as_str()));
            }
            match (c.is_recv, c.tag & HS != 0) {
                (false, _) => self.sends += 1,
                (true, false) => self.recvs += 1,
                (true, true) => self.hs += 1,
            }
        }
        Ok(())
    }

    fn until(&mut self, dev: &mut Device, what: impl Fn(&Cq) -> bool) -> Result<(), String> {
        let end = Instant::now() + STALL;
        while !what(self) {
            self.poll(dev)?;
            if Instant::now() > end {
                return Err(format!(
                    "stalled: {} sends, {} receives, {} handshakes complete",
                    self.sends, self.recvs, self.hs
                ));
            }
        }
        Ok(())
    }
}

struct Emp {
    dev: Device,
    cq: Cq,
    peer: Endpoint,
    rank: usize,
    sbuf: Buffer,
    rbuf: Buffer,
    ack: Buffer,
    posted_sends: usize,
    job: Job,
}

impl Emp {
    fn send(&mut self, tag: u64, b: MemSpan, len: usize) -> Result<(), String> {
        loop {
            match self.dev.post_send(0, self.peer, tag, &[b.sge(0, len)]) {
                Ok(()) => {
                    self.posted_sends += 1;
                    return Ok(());
                }
                Err(emp::Error::RingFull) => self.cq.poll(&mut self.dev)?,
                Err(e) => return Err(err(e)),
            }
        }
    }

    fn recv(&mut self, tag: u64, b: MemSpan, len: usize) -> Result<(), String> {
        loop {
            match self.dev.post_recv(1, self.peer, tag, 0, &[b.sge(0, len)]) {
                Ok(()) => return Ok(()),
                Err(emp::Error::RingFull) => self.cq.poll(&mut self.dev)?,
                Err(e) => return Err(err(e)),
            }
        }
    }

    /// Waits until every posted send completed (buffers may be reused).
    fn drain_sends(&mut self) -> Result<(), String> {
        let n = self.posted_sends;
        self.cq.until(&mut self.dev, |c| c.sends >= n)
    }

    /// Ping-pong; `tag` is unique per size so a receive left posted at the
    /// end never matches a later size's messages.
    fn latency(&mut self, tag: u64, size: usize, iters: usize, warm: usize) -> Result<f64, String> {
        let (s, r) = (self.sbuf.span(), self.rbuf.span());
        self.recv(tag, r, size)?;
        self.job.barrier(&mut self.dev, &format!("lat{tag}")).map_err(err)?;
        let mut t0 = Instant::now();
        for i in 0..warm + iters {
            if i == warm {
                t0 = Instant::now();
            }
            let want = self.cq.recvs + 1;
            if self.rank == 0 {
                self.send(tag, s, size)?;
                self.cq.until(&mut self.dev, |c| c.recvs >= want)?;
                self.recv(tag, r, size)?;
            } else {
                self.cq.until(&mut self.dev, |c| c.recvs >= want)?;
                // The next receive goes up before the reply, so the next
                // ping never finds it missing.
                self.recv(tag, r, size)?;
                self.send(tag, s, size)?;
            }
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64;
        self.drain_sends()?;
        Ok(us)
    }

    /// Windows of 64 messages after a handshake that says the peer's
    /// receives are posted.
    fn bw(&mut self, tag: u64, size: usize, windows: usize, warm: usize, bidir: bool) -> Result<f64, String> {
        let (s, r, a) = (self.sbuf.span(), self.rbuf.span(), self.ack.span());
        let sender = bidir || self.rank == 0;
        let receiver = bidir || self.rank == 1;
        self.recv(tag | HS, a, 4)?;
        self.job.barrier(&mut self.dev, &format!("bw{tag}")).map_err(err)?;
        // Absolute targets: posting may poll, and a handshake can be
        // counted before this window's wait begins.
        let hs0 = self.cq.hs;
        let mut t0 = Instant::now();
        for w in 0..warm + windows {
            if w == warm {
                t0 = Instant::now();
            }
            let r0 = self.cq.recvs;
            if receiver {
                for _ in 0..WINDOW {
                    self.recv(tag, r, size)?;
                }
            }
            self.send(tag | HS, a, 4)?;
            let h = hs0 + w + 1;
            self.cq.until(&mut self.dev, |c| c.hs >= h)?;
            self.recv(tag | HS, a, 4)?; // for the next window
            if sender {
                for _ in 0..WINDOW {
                    self.send(tag, s, size)?;
                }
            }
            let want_r = r0 + if receiver { WINDOW } else { 0 };
            let want_s = self.posted_sends;
            self.cq.until(&mut self.dev, |c| c.recvs >= want_r && c.sends >= want_s)?;
        }
        let secs = t0.elapsed().as_secs_f64();
        let dirs = if bidir { 2.0 } else { 1.0 };
        Ok((size * WINDOW * windows) as f64 * dirs / secs / 1e6)
    }
}

struct Tcp {
    s: TcpStream,
    rank: usize,
    buf: Vec<u8>,
    /// Where it goes, for the report (`TCP to 198.18.0.1:41234`).
    path: String,
}

impl Tcp {
    fn latency(&mut self, size: usize, iters: usize, warm: usize) -> Result<f64, String> {
        let e = |e: std::io::Error| e.to_string();
        let mut t0 = Instant::now();
        let msg = vec![1u8; size];
        for i in 0..warm + iters {
            if i == warm {
                t0 = Instant::now();
            }
            if self.rank == 0 {
                self.s.write_all(&msg).map_err(e)?;
                self.s.read_exact(&mut self.buf[..size]).map_err(e)?;
            } else {
                self.s.read_exact(&mut self.buf[..size]).map_err(e)?;
                self.s.write_all(&msg).map_err(e)?;
            }
        }
        Ok(t0.elapsed().as_secs_f64() * 1e6 / (2 * iters) as f64)
    }

    fn bw(&mut self, size: usize, windows: usize, warm: usize, bidir: bool) -> Result<f64, String> {
        let e = |e: std::io::Error| e.to_string();
        let msg = vec![2u8; size];
        let mut t0 = Instant::now();
        let sender = bidir || self.rank == 0;
        let receiver = bidir || self.rank == 1;
        for w in 0..warm + windows {
            if w == warm {
                t0 = Instant::now();
            }
            let writer = if sender {
                let mut s = self.s.try_clone().map_err(e)?;
                let m = msg.clone();
                Some(std::thread::spawn(move || -> std::io::Result<()> {
                    for _ in 0..WINDOW {
                        s.write_all(&m)?;
                    }
                    Ok(())
                }))
            } else {
                None
            };
            if receiver {
                for _ in 0..WINDOW {
                    self.s.read_exact(&mut self.buf[..size]).map_err(e)?;
                }
            }
            if let Some(t) = writer {
                t.join().map_err(|_| "writer panicked".to_string())?.map_err(e)?;
            }
            // The window's ack, both ways, like the EMP side.
            self.s.write_all(&[0u8; 4]).map_err(e)?;
            self.s.read_exact(&mut self.buf[..4]).map_err(e)?;
        }
        let dirs = if bidir { 2.0 } else { 1.0 };
        Ok((size * WINDOW * windows) as f64 * dirs / t0.elapsed().as_secs_f64() / 1e6)
    }
}

/// One rank of `emp bench latency|bw|bibw`.
pub(super) fn rank(a: &BenchArgs, job: &Job, mut dev: Device, eps: &[Endpoint]) -> Result<(), String> {
    let sizes = if a.sizes.is_empty() { default_sizes(a.kind) } else { a.sizes.clone() };
    let max = sizes.iter().copied().max().unwrap_or(1).max(4);
    let peer = eps[1 - job.rank];
    let (sbuf, rbuf, ack) = (dev.alloc(max).map_err(err)?, dev.alloc(max).map_err(err)?, dev.alloc(64).map_err(err)?);
    let cq = Cq::new(a.blocking);
    let mut emp = Emp { dev, cq, peer, rank: job.rank, sbuf, rbuf, ack, posted_sends: 0, job: job.clone() };
    let mut tcp = if a.no_tcp { None } else { Some(tcp_connect(job, max, a.tcp_at.as_deref())?) };
    let mut rows = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let (n, warm) = iters_for(a.kind, size, a.iters);
        let tag = (i as u64 + 1) << 40;
        let e = match a.kind {
            Kind::Latency => emp.latency(tag, size, n, warm)?,
            Kind::Bw => emp.bw(tag, size, n, warm, false)?,
            Kind::Bibw => emp.bw(tag, size, n, warm, true)?,
            k => return Err(format!("{} is not a point-to-point benchmark", k.name())),
        };
        let t = match tcp.as_mut() {
            None => None,
            Some(t) => Some(match a.kind {
                Kind::Latency => t.latency(size, n, warm)?,
                _ => t.bw(size, n, warm, a.kind == Kind::Bibw)?,
            }),
        };
        rows.push((size, e, t));
        if job.rank == 0 && !a.json && rows.len() == 1 {
            print_header(a, tcp.as_ref().map(|t| t.path.as_str()));
        }
        if job.rank == 0 && !a.json {
            print_row(size, e, t);
        }
    }
    if job.rank == 0 && a.json {
        let paths = (a.emp_path.as_deref().unwrap_or(""), tcp.as_ref().map(|t| t.path.as_str()));
        print_json(&json(a.kind, paths, &rows));
    }
    emp.job.barrier(&mut emp.dev, "bench-done").map_err(err)
}

/// The TCP side of the comparison. Rank 0 listens and publishes its
/// address through the rendezvous; rank 1 connects. Over loopback by
/// default; `tcp_at` (from `emp bench --config`) is rank 0's IP address or
/// the interface whose address it listens on, so TCP crosses the link EMP
/// does. `EMP_BENCH_TCP=host:port` names rank 0's address instead (e.g.
/// between two VMs over virtio-net, where a static job has no rendezvous
/// directory): rank 0 listens on that port, rank 1 connects, retrying for 30 s.
fn tcp_connect(job: &Job, max: usize, tcp_at: Option<&str>) -> Result<Tcp, String> {
    let e = |e: std::io::Error| e.to_string();
    let named = std::env::var("EMP_BENCH_TCP").ok();
    let (s, path) = if let Some(addr) = named {
        let sa: SocketAddr = addr.parse().map_err(|_| format!("EMP_BENCH_TCP={addr}: not host:port"))?;
        let s = if job.rank == 0 {
            let l =
                TcpListener::bind(("0.0.0.0", sa.port())).map_err(|err| format!("listen on {}: {err}", sa.port()))?;
            l.accept().map_err(e)?.0
        } else {
            let end = Instant::now() + Duration::from_secs(30);
            loop {
                match TcpStream::connect(sa) {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(50)),
                    Err(err) => return Err(format!("connect to {sa}: {err}")),
                }
            }
        };
        (s, format!("TCP to {sa}"))
    } else if job.rank == 0 {
        let ip = match tcp_at {
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
            Some(at) => listen_ip(at)?,
        };
        let l = TcpListener::bind((ip, 0)).map_err(|err| format!("TCP listen on {ip}: {err}"))?;
        let sa = l.local_addr().map_err(e)?;
        job.exchange("tcp", &sa.to_string(), Duration::from_secs(30)).map_err(err)?;
        (l.accept().map_err(e)?.0, format!("TCP to {sa}"))
    } else {
        let all = job.exchange("tcp", "", Duration::from_secs(30)).map_err(err)?;
        let sa: SocketAddr =
            all[0].trim().parse().map_err(|_| format!("rank 0 published {:?}: not ip:port", all[0]))?;
        let s = TcpStream::connect_timeout(&sa, Duration::from_secs(10))
            .map_err(|err| format!("connect to {sa}: {err}"))?;
        (s, format!("TCP to {sa}"))
    };
    s.set_nodelay(true).map_err(e)?;
    Ok(Tcp { s, rank: job.rank, buf: vec![0; max], path })
}

/// The address rank 0 listens on: `at` itself when it is an IP address,
/// else the address of interface `at` here (IPv4 first; an IPv6 link-local
/// address would need the peer's scope, so only a global one).
fn listen_ip(at: &str) -> Result<IpAddr, String> {
    if let Ok(ip) = at.parse::<IpAddr>() {
        return Ok(ip);
    }
    let addrs = interface_addrs(at).map_err(|e| format!("addresses of {at}: {e}"))?;
    let v4 = addrs.iter().find(|a| a.is_ipv4());
    let v6 = addrs.iter().find(|a| matches!(a, IpAddr::V6(v6) if !v6.is_unicast_link_local()));
    v4.or(v6).copied().ok_or_else(|| {
        format!("interface {at} has no IPv4 or global IPv6 address for the TCP baseline (add one, or use --no-tcp)")
    })
}

/// The IP addresses of interface `name` in this network namespace.
fn interface_addrs(name: &str) -> std::io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        // SAFETY: ifa_name is a NUL-terminated string of the same list.
        let ifname = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        if ifa.ifa_addr.is_null() || ifname.to_bytes() != name.as_bytes() {
            continue;
        }
        // SAFETY: a non-null sockaddr of the list; its family says which kind it is.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        if family == libc::AF_INET {
            // SAFETY: AF_INET: the address is a sockaddr_in.
            let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
            out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
        } else if family == libc::AF_INET6 {
            // SAFETY: AF_INET6: the address is a sockaddr_in6.
            let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
            out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
        }
    }
    // SAFETY: the list getifaddrs returned, freed once; nothing of it is used after.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

fn unit(k: Kind) -> &'static str {
    match k {
        Kind::Latency => "us",
        _ => "MB/s",
    }
}

fn print_header(a: &BenchArgs, tcp: Option<&str>) {
    let k = a.kind;
    let what = match k {
        Kind::Latency => "one-way latency, ping-pong",
        Kind::Bw => "bandwidth, windows of 64",
        _ => "bidirectional bandwidth, windows of 64",
    };
    let device = std::env::var("EMP_DEVICE").unwrap_or_default();
    let emp_path = match &a.emp_path {
        _ if device.starts_with("/dev/") => format!("EMP through {device}"),
        Some(p) => p.clone(),
        None => format!("EMP through {device}"),
    };
    match tcp {
        Some(t) => {
            println!("# EMP {what} ({}); {emp_path} vs {t}, same run", unit(k));
            println!("# {:<10} {:>12} {:>12} {:>10}", "Size", "EMP", "TCP", "EMP/TCP");
        }
        None => {
            println!("# EMP {what} ({}); {emp_path}", unit(k));
            println!("# {:<10} {:>12}", "Size", "EMP");
        }
    }
}

fn print_row(size: usize, e: f64, t: Option<f64>) {
    match t {
        Some(t) => println!("{:<12} {:>12.2} {:>12.2} {:>10.3}", size, e, t, e / t),
        None => println!("{:<12} {:>12.2}", size, e),
    }
}

/// `{"benchmark":"Latency","unit":"us","emp_path":…,"tcp_path":…,"rows":[{"size":1,"emp":…,"tcp":…},…]}`.
fn json(k: Kind, (emp_path, tcp_path): (&str, Option<&str>), rows: &[(usize, f64, Option<f64>)]) -> Json {
    let rows = rows
        .iter()
        .map(|&(size, e, t)| {
            let mut row = vec![("size", Json::Int(size as u64)), ("emp", Json::Num(e, 3))];
            if let Some(t) = t {
                row.push(("tcp", Json::Num(t, 3)));
            }
            Json::Obj(row)
        })
        .collect();
    Json::Obj(vec![
        ("benchmark", Json::str(format!("{k:?}"))),
        ("unit", Json::str(unit(k))),
        ("emp_path", Json::str(emp_path)),
        ("tcp_path", tcp_path.map_or(Json::Null, Json::str)),
        ("rows", Json::Arr(rows)),
    ])
}
