//! `emp bench latency|bw|bibw`: OSU-style micro-benchmarks between two
//! ranks, EMP and TCP over loopback measured side by side in the same run
//! by the same method (the TCP side is implemented here too).
//!
//! - latency: ping-pong, one-way latency = round trip / 2 (µs);
//! - bw: the sender streams windows of 64 messages, the receiver answers
//!   each window with a 4-byte ack (MB/s, 10^6 bytes);
//! - bibw: both ranks stream at once (MB/s, both directions summed);
//! - atomic: remote atomic latency, NIC-executed vs host-served
//!   (`crate::bench_atomic`).
//!
//! Collective benchmarks (barrier, bcast, bcast-skew, allreduce, reduce)
//! run `--nodes N` ranks; see `bench_coll`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use emp::rdv::Job;
use emp::{Buffer, Completion, Device, Endpoint, MemSpan, Status};

use crate::cluster::{self, UpArgs, WireKind};

/// Which benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// Ping-pong latency.
    Latency,
    /// Unidirectional bandwidth.
    Bw,
    /// Bidirectional bandwidth.
    Bibw,
    /// Remote atomic latency: NIC vs host-based responder.
    Atomic,
    /// Collective: consecutive barriers (`--nodes`, `--algo`).
    Barrier,
    /// Collective: broadcast from rank 0, closed by a leaf's 0-byte answer.
    Bcast,
    /// Collective: broadcast with random arrival skew (`--skew-us`).
    BcastSkew,
    /// Collective: allreduce (sum), wall and CPU time in the call.
    Allreduce,
    /// Collective: reduce (sum) to rank 0, wall and CPU time in the call.
    Reduce,
}

impl Kind {
    /// Run by `bench_coll` over `--nodes` ranks.
    pub fn is_collective(self) -> bool {
        matches!(self, Kind::Barrier | Kind::Bcast | Kind::BcastSkew | Kind::Allreduce | Kind::Reduce)
    }
}

/// Options shared by `emp bench` and its ranks.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Benchmark.
    #[arg(value_enum)]
    pub kind: Kind,
    /// Message sizes (comma separated); default depends on the benchmark.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// Iterations (latency) or windows (bandwidth) per size; default scales with size.
    #[arg(long)]
    pub iters: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Skip the TCP comparison.
    #[arg(long)]
    pub no_tcp: bool,
    /// Wait for completions by blocking on the port's event (arm + eventfd)
    /// instead of polling: what ranks should do when they outnumber cores
    /// (e.g. guests under TCG sharing the host's CPUs with the NIC).
    #[arg(long)]
    pub blocking: bool,
    /// Cluster directory (default: a private 2-NIC chassis for this run).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Collectives: ranks (default 8), one NIC each on the private chassis.
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Collectives: variants to measure (comma separated; default: all that
    /// run the benchmark; the host baseline is always measured; `list`
    /// lists them).
    #[arg(long, value_delimiter = ',')]
    pub algo: Vec<String>,
    /// bcast-skew: mean pairwise arrival skew in µs (delays U[0, 3×skew]).
    #[arg(long, default_value_t = 333.0)]
    pub skew_us: f64,
    /// allreduce/reduce: element types (comma separated; default i64,f64).
    /// `--sizes` counts elements for these.
    #[arg(long, value_delimiter = ',')]
    pub dtypes: Vec<String>,
    /// Collectives: poll for completions even with more than 2 ranks
    /// (default: block when ranks outnumber the 2 cores).
    #[arg(long)]
    pub poll: bool,
    /// Wire of the private chassis: `mem` runs every NIC in one engine
    /// thread; `udp` runs one emp-nicd per NIC, so NICs work in parallel
    /// as the papers' NIC processors did (one per host).
    #[arg(long, value_enum, default_value_t = WireKind::Mem)]
    pub wire: WireKind,
}

const WINDOW: usize = 64;

fn default_sizes(k: Kind) -> Vec<usize> {
    match k {
        Kind::Latency => vec![1, 8, 64, 512, 4096, 16384, 65536, 262144, 1 << 20],
        Kind::Bw | Kind::Bibw => vec![64, 1024, 8192, 65536, 262144, 1 << 20],
        Kind::Atomic => vec![8],
        _ => crate::bench_coll::default_sizes(k),
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

/// `emp bench …`: starts a private chassis unless `--dir` names a running
/// cluster, runs two ranks (collectives: `--nodes`), prints rank 0's report.
pub fn bench(a: &BenchArgs) -> Result<(), String> {
    if a.kind.is_collective() && a.algo.iter().any(|s| s == "list") {
        crate::bench_coll::list(a.kind);
        return Ok(());
    }
    if a.kind.is_collective() {
        crate::bench_coll::select(a.kind, &a.algo)?;
    }
    let ranks = if a.kind.is_collective() { a.nodes.unwrap_or(8) } else { 2 };
    if ranks == 0 || ranks > u16::MAX as usize {
        return Err(format!("--nodes {ranks}: at least 1"));
    }
    let (dir, private) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => {
            let d = std::env::temp_dir().join(format!("emp-bench-{}", std::process::id()));
            let up = UpArgs {
                nics: ranks as u16,
                wire: a.wire,
                loss: 0.0,
                dup: 0.0,
                reorder: 0.0,
                ports: 4,
                mtu: None,
                cpu_plan: "base".into(),
                firmware: None,
                // Private: clear of a cluster someone else runs.
                udp_base: 20000 + (std::process::id() % 400) as u16 * 64,
                nicd_args: None,
            };
            cluster::up(&d, &up).map_err(|e| format!("starting a chassis for the benchmark: {e}"))?;
            (d, true)
        }
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let kind = clap::ValueEnum::to_possible_value(&a.kind).map(|v| v.get_name().to_string()).unwrap_or_default();
    let mut argv = vec![exe.to_string_lossy().into_owned(), "bench-rank".into(), kind];
    if !a.sizes.is_empty() {
        argv.push(format!("--sizes={}", a.sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",")));
    }
    if let Some(i) = a.iters {
        argv.push(format!("--iters={i}"));
    }
    if a.json {
        argv.push("--json".into());
    }
    if a.no_tcp {
        argv.push("--no-tcp".into());
    }
    if a.blocking {
        argv.push("--blocking".into());
    }
    if a.kind.is_collective() {
        argv.push(format!("--nodes={ranks}"));
        argv.push(format!("--skew-us={}", a.skew_us));
        if !a.algo.is_empty() {
            argv.push(format!("--algo={}", a.algo.join(",")));
        }
        if !a.dtypes.is_empty() {
            argv.push(format!("--dtypes={}", a.dtypes.join(",")));
        }
        if a.poll {
            argv.push("--poll".into());
        }
    }
    let r = crate::run::run(&dir, ranks, &argv, Some(Duration::from_secs(3600)));
    if private {
        let _ = cluster::down(&dir);
        let _ = std::fs::remove_dir_all(&dir);
    }
    match r? {
        0 => Ok(()),
        c => Err(format!("benchmark ranks failed (status {c})")),
    }
}

/// Counts completions; any error completion aborts the benchmark.
struct Cq {
    sends: usize,
    /// Data receives.
    recvs: usize,
    /// Handshake receives (tag bit HS).
    hs: usize,
    blocking: bool,
    buf: [Completion; 64],
}

/// Tag bit of handshake messages.
const HS: u64 = 1 << 32;

impl Cq {
    fn new() -> Cq {
        Cq { sends: 0, recvs: 0, hs: 0, blocking: false, buf: [Completion::default(); 64] }
    }

    fn poll(&mut self, dev: &mut Device) -> Result<(), String> {
        let n = if self.blocking {
            match dev.wait_cq(&mut self.buf, Some(Duration::from_millis(100))) {
                Ok(n) => n,
                Err(emp::Error::Timeout) => 0,
                Err(e) => return Err(e.to_string()),
            }
        } else {
            dev.poll_cq(&mut self.buf)
        };
        if n == 0 {
            // Yield: the NIC and the other rank share two cores with us.
            std::thread::yield_now();
        }
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
        let end = Instant::now() + Duration::from_secs(30);
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
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn recv(&mut self, tag: u64, b: MemSpan, len: usize) -> Result<(), String> {
        loop {
            match self.dev.post_recv(1, self.peer, tag, 0, &[b.sge(0, len)]) {
                Ok(()) => return Ok(()),
                Err(emp::Error::RingFull) => self.cq.poll(&mut self.dev)?,
                Err(e) => return Err(e.to_string()),
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
        self.job.barrier(&mut self.dev, &format!("lat{tag}")).map_err(|e| e.to_string())?;
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
        self.job.barrier(&mut self.dev, &format!("bw{tag}")).map_err(|e| e.to_string())?;
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

/// One rank of a benchmark (`emp bench-rank`, started by `emp bench`).
pub fn rank(a: &BenchArgs) -> Result<(), String> {
    let job = Job::from_env().map_err(|e| e.to_string())?;
    if a.kind.is_collective() {
        return crate::bench_coll::rank(a, job);
    }
    if job.size != 2 {
        return Err("benchmarks run with exactly 2 ranks".into());
    }
    let sizes = if a.sizes.is_empty() { default_sizes(a.kind) } else { a.sizes.clone() };
    let max = sizes.iter().copied().max().unwrap_or(1).max(4);
    let mut dev = Device::open().map_err(|e| e.to_string())?;
    let eps = job.endpoints(dev.endpoint()).map_err(|e| e.to_string())?;
    if a.kind == Kind::Atomic {
        return crate::bench_atomic::rank(a, &job, dev, &eps);
    }
    let peer = eps[1 - job.rank];
    let (sbuf, rbuf, ack) = (
        dev.alloc(max).map_err(|e| e.to_string())?,
        dev.alloc(max).map_err(|e| e.to_string())?,
        dev.alloc(64).map_err(|e| e.to_string())?,
    );
    let mut cq = Cq::new();
    cq.blocking = a.blocking;
    let mut emp = Emp { dev, cq, peer, rank: job.rank, sbuf, rbuf, ack, posted_sends: 0, job: job.clone() };
    let mut tcp = if a.no_tcp { None } else { Some(tcp_connect(&job, max)?) };
    let mut rows = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let (n, warm) = iters_for(a.kind, size, a.iters);
        let tag = (i as u64 + 1) << 40;
        let e = match a.kind {
            Kind::Latency => emp.latency(tag, size, n, warm)?,
            Kind::Bw => emp.bw(tag, size, n, warm, false)?,
            Kind::Bibw => emp.bw(tag, size, n, warm, true)?,
            Kind::Atomic => unreachable!("handled by bench_atomic"),
            k => return Err(format!("{k:?} is a collective benchmark")),
        };
        let t = match tcp.as_mut() {
            None => None,
            Some(t) => Some(match a.kind {
                Kind::Latency => t.latency(size, n, warm)?,
                Kind::Bw => t.bw(size, n, warm, false)?,
                Kind::Bibw => t.bw(size, n, warm, true)?,
                Kind::Atomic => unreachable!("handled by bench_atomic"),
                k => return Err(format!("{k:?} is a collective benchmark")),
            }),
        };
        rows.push((size, e, t));
        if job.rank == 0 && !a.json && rows.len() == 1 {
            print_header(a.kind, tcp.is_some());
        }
        if job.rank == 0 && !a.json {
            print_row(a.kind, size, e, t);
        }
    }
    if job.rank == 0 && a.json {
        print_json(a.kind, &rows);
    }
    emp.job.barrier(&mut emp.dev, "bench-done").map_err(|e| e.to_string())
}

/// The TCP side of the comparison. Over loopback by default (the port is
/// exchanged through the rendezvous directory); `EMP_BENCH_TCP=host:port`
/// names rank 0's address instead (e.g. between two VMs over virtio-net,
/// where a static job has no rendezvous directory): rank 0 listens on that
/// port, rank 1 connects, retrying for 30 s.
fn tcp_connect(job: &Job, max: usize) -> Result<Tcp, String> {
    let e = |e: std::io::Error| e.to_string();
    let named = std::env::var("EMP_BENCH_TCP").ok();
    let s = if let Some(addr) = named {
        let sa: std::net::SocketAddr = addr.parse().map_err(|_| format!("EMP_BENCH_TCP={addr}: not host:port"))?;
        if job.rank == 0 {
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
        }
    } else if job.rank == 0 {
        let l = TcpListener::bind("127.0.0.1:0").map_err(e)?;
        let port = l.local_addr().map_err(e)?.port();
        job.exchange("tcp", &port.to_string(), Duration::from_secs(30)).map_err(|e| e.to_string())?;
        l.accept().map_err(e)?.0
    } else {
        let all = job.exchange("tcp", "", Duration::from_secs(30)).map_err(|e| e.to_string())?;
        TcpStream::connect(("127.0.0.1", all[0].trim().parse::<u16>().map_err(|e| e.to_string())?)).map_err(e)?
    };
    s.set_nodelay(true).map_err(e)?;
    Ok(Tcp { s, rank: job.rank, buf: vec![0; max] })
}

fn unit(k: Kind) -> &'static str {
    match k {
        Kind::Latency | Kind::Atomic => "us",
        _ => "MB/s",
    }
}

fn print_header(k: Kind, tcp: bool) {
    let what = match k {
        Kind::Latency => "one-way latency, ping-pong",
        Kind::Bw => "bandwidth, windows of 64",
        Kind::Bibw => "bidirectional bandwidth, windows of 64",
        Kind::Atomic => "remote atomic latency",
        _ => "collective (see bench_coll)",
    };
    let tcp_path = match std::env::var("EMP_BENCH_TCP") {
        Ok(a) => format!("TCP to {a}"),
        Err(_) => "TCP loopback".into(),
    };
    let device = std::env::var("EMP_DEVICE").unwrap_or_default();
    let emp_path =
        if device.starts_with("/dev/") { format!("EMP through {device}") } else { "EMP on an emp-nicd chassis".into() };
    println!("# EMP {what} ({}); {emp_path} vs {tcp_path}, same run", unit(k));
    if tcp {
        println!("# {:<10} {:>12} {:>12} {:>10}", "Size", "EMP", "TCP", "EMP/TCP");
    } else {
        println!("# {:<10} {:>12}", "Size", "EMP");
    }
}

fn print_row(_k: Kind, size: usize, e: f64, t: Option<f64>) {
    match t {
        Some(t) => println!("{:<12} {:>12.2} {:>12.2} {:>10.3}", size, e, t, e / t),
        None => println!("{:<12} {:>12.2}", size, e),
    }
}

fn print_json(k: Kind, rows: &[(usize, f64, Option<f64>)]) {
    let body: Vec<String> = rows
        .iter()
        .map(|(s, e, t)| match t {
            Some(t) => format!("{{\"size\":{s},\"emp\":{e:.3},\"tcp\":{t:.3}}}"),
            None => format!("{{\"size\":{s},\"emp\":{e:.3}}}"),
        })
        .collect();
    println!("{{\"benchmark\":\"{:?}\",\"unit\":\"{}\",\"rows\":[{}]}}", k, unit(k), body.join(","));
}
