//! `emp bench rate`: message rate, OSU `mbw_mr`-style. `--pairs P` pairs
//! of ranks (rank 2k sends to rank 2k+1; on a chassis of two NICs every
//! sender is on NIC 0 and every receiver on NIC 1) stream windows of small
//! messages: the receiver pre-posts a window of receives and says so with a
//! 4-byte handshake, the sender posts the window and waits for its
//! completions. Reported: messages/s over all pairs (the slowest pair's
//! time), and the **NIC CPU time per message**: the emulated NICs' engine
//! threads' run time (`/proc/<pid>/task/<pid>/schedstat`, nanoseconds) over
//! the run divided by the messages — sender, receiver and acknowledgement
//! work together, what one message costs the NIC processors.
//!
//! Also the **ACK frames per message**: every NIC's `acks_tx` counter over
//! the run (each rank reads its own NIC's; one reading per NIC counts)
//! divided by the messages — one per message before ACKs were coalesced.
//!
//! Beside it, in the same run, TCP over loopback by the same method (one
//! connection per pair, a write per message, a 4-byte answer per window),
//! with its CPU per message: both ends' user + system time
//! (`getrusage`), which is where the kernel's TCP stack runs.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use emp::rdv::Job;
use emp::{Buffer, Completion, Device, Endpoint, Status};

use super::{err, print_json, say, BenchArgs, Json, Waiter};

/// Messages per window unless `--window` says otherwise (OSU's default).
pub(super) const DEFAULT_WINDOW: usize = 64;

/// Tag bit of the window handshakes.
const HS: u64 = 1 << 32;

/// How long a window may make no progress before the run is called stalled.
const STALL: Duration = Duration::from_secs(30);

/// Run time (ns) of thread `tid` of process `pid`: the scheduler's own
/// accounting (`schedstat`, ns), else `stat`'s utime + stime (clock ticks).
pub(super) fn thread_cpu_ns(pid: i32, tid: i32) -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")) {
        if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
            return Some(ns);
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    ticks_to_ns(utime_stime(&stat)?)
}

/// Run time (ns) of every thread of process `pid` (`stat`, clock ticks).
fn process_cpu_ns(pid: i32) -> Option<u64> {
    ticks_to_ns(utime_stime(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?)
}

/// utime + stime (fields 14 and 15) of a `stat` line; the command name in
/// parentheses may hold spaces, so fields count from its closing `)`.
fn utime_stime(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    Some(f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?)
}

fn ticks_to_ns(ticks: u64) -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks * 1_000_000_000 / hz as u64)
}

/// The emulated NICs' CPU time now: (NIC CPU threads, whole daemons), ns.
/// The engine (CPU A) runs on each daemon's main thread, other NIC CPUs on
/// threads named `nic-cpu*`. `None` when a daemon is
/// gone or not ours to read.
fn nic_cpu(pids: &[i32]) -> Option<(u64, u64)> {
    if pids.is_empty() {
        return None;
    }
    let mut engine = 0;
    let mut all = 0;
    for &p in pids {
        engine += thread_cpu_ns(p, p)? + cpu_threads_ns(p);
        all += process_cpu_ns(p)?;
    }
    Some((engine, all))
}

/// Run time (ns) of daemon `pid`'s NIC CPU threads past the engine's
/// (`nic-cpu*`, `emp-nicd --nic-cpus 2`): NIC processor time too.
fn cpu_threads_ns(pid: i32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("nic-cpu")))
        .filter_map(|t| t.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|tid| thread_cpu_ns(pid, tid))
        .sum()
}

/// This process's user + system time (ns), all threads.
fn self_cpu_ns() -> u64 {
    // SAFETY: an all-zero rusage is a valid value for getrusage to fill.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: `ru` is a live rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(ru.ru_utime) + us(ru.ru_stime)) * 1000
}

/// Windows (and warm-up windows) per size.
fn windows_for(size: usize, given: Option<usize>) -> (usize, usize) {
    match given {
        Some(n) => (n, (n / 10).max(1)),
        None if size <= 4096 => (2000, 200),
        None => (200, 20),
    }
}

/// One pair's side of the EMP measurement.
struct Emp {
    dev: Device,
    peer: Endpoint,
    sender: bool,
    buf: Buffer,
    hs: Buffer,
    waiter: Waiter,
    cqes: [Completion; 64],
    sends: usize,
    recvs: usize,
    hss: usize,
    /// The window's messages are starts of persistent slot 0 (stored per size).
    persistent: bool,
}

/// The persistent slot (send and receive) a window's messages start.
const SLOT: u8 = 0;

impl Emp {
    fn poll(&mut self) -> Result<(), String> {
        let n = self.waiter.reap(&mut self.dev, &mut self.cqes).map_err(err)?;
        for c in &self.cqes[..n] {
            if c.status != Status::Success {
                return Err(format!("completion {} failed: {}", c.wr_id, c.status.as_str()));
            }
            match (c.is_recv, c.tag & HS != 0) {
                (false, _) => self.sends += 1,
                (true, false) => self.recvs += 1,
                (true, true) => self.hss += 1,
            }
        }
        Ok(())
    }

    fn until(&mut self, what: impl Fn(&Emp) -> bool) -> Result<(), String> {
        let end = Instant::now() + STALL;
        while !what(self) {
            self.poll()?;
            if Instant::now() > end {
                return Err(format!(
                    "stalled: {} sends, {} receives, {} handshakes complete",
                    self.sends, self.recvs, self.hss
                ));
            }
        }
        Ok(())
    }

    /// Stores this size's send and receive in the persistent slots.
    fn store(&mut self, tag: u64, len: usize) -> Result<(), String> {
        let sge = [self.buf.span().sge(0, len)];
        self.dev.send_init(SLOT, self.peer, tag, &sge).map_err(err)?;
        self.dev.recv_init(SLOT, self.peer, tag, 0, &sge).map_err(err)
    }

    fn send(&mut self, tag: u64, len: usize, hs: bool) -> Result<(), String> {
        let span = if hs { self.hs.span() } else { self.buf.span() };
        loop {
            let posted = if self.persistent && !hs {
                self.dev.start_send(0, SLOT)
            } else {
                self.dev.post_send(0, self.peer, tag, &[span.sge(0, len)])
            };
            match posted {
                Ok(()) => return Ok(()),
                Err(emp::Error::RingFull) => self.poll()?,
                Err(e) => return Err(err(e)),
            }
        }
    }

    fn recv(&mut self, tag: u64, len: usize, hs: bool) -> Result<(), String> {
        let span = if hs { self.hs.span() } else { self.buf.span() };
        loop {
            let posted = if self.persistent && !hs {
                self.dev.start_recv(1, SLOT)
            } else {
                self.dev.post_recv(1, self.peer, tag, 0, &[span.sge(0, len)])
            };
            match posted {
                Ok(()) => return Ok(()),
                Err(emp::Error::RingFull) => self.poll()?,
                Err(e) => return Err(err(e)),
            }
        }
    }

    /// Streams `windows` windows after `warm` ones; returns this rank's
    /// seconds over the measured windows.
    fn run(&mut self, tag: u64, size: usize, window: usize, windows: usize, warm: usize) -> Result<f64, String> {
        // Absolute targets: the next window's handshake can come in while
        // this window's sends are still completing.
        let hs0 = self.hss;
        let mut t0 = Instant::now();
        for w in 0..warm + windows {
            if w == warm {
                t0 = Instant::now();
            }
            if self.sender {
                let h = hs0 + w + 1;
                self.until(|e| e.hss >= h)?;
                // The next window's handshake finds its receive posted.
                self.recv(tag | HS, 4, true)?;
                let s = self.sends + window;
                for _ in 0..window {
                    self.send(tag, size, false)?;
                }
                self.until(|e| e.sends >= s)?;
            } else {
                let r = self.recvs + window;
                for _ in 0..window {
                    self.recv(tag, size, false)?;
                }
                // The handshake's completion is counted with the window's.
                let s = self.sends + 1;
                self.send(tag | HS, 4, true)?;
                self.until(|e| e.recvs >= r && e.sends >= s)?;
            }
        }
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// One pair's side of the TCP measurement.
struct Tcp {
    s: TcpStream,
    sender: bool,
    buf: Vec<u8>,
}

impl Tcp {
    fn run(&mut self, size: usize, window: usize, windows: usize, warm: usize) -> Result<f64, String> {
        let e = |e: std::io::Error| e.to_string();
        let msg = vec![3u8; size];
        let mut t0 = Instant::now();
        for w in 0..warm + windows {
            if w == warm {
                t0 = Instant::now();
            }
            if self.sender {
                for _ in 0..window {
                    self.s.write_all(&msg).map_err(e)?;
                }
                self.s.read_exact(&mut self.buf[..4]).map_err(e)?;
            } else {
                for _ in 0..window {
                    self.s.read_exact(&mut self.buf[..size]).map_err(e)?;
                }
                self.s.write_all(&[0u8; 4]).map_err(e)?;
            }
        }
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// One TCP connection per pair over loopback: the sender listens and
/// publishes its address, its receiver connects.
fn tcp_pair(job: &Job, sender: bool, max: usize) -> Result<Tcp, String> {
    let e = |e: std::io::Error| e.to_string();
    let listener = if sender { Some(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(e)?) } else { None };
    let mine = match &listener {
        Some(l) => l.local_addr().map_err(e)?.to_string(),
        None => String::new(),
    };
    let all = job.exchange("rate-tcp", &mine, STALL).map_err(err)?;
    let s = match listener {
        Some(l) => l.accept().map_err(e)?.0,
        None => {
            let at = &all[job.rank & !1];
            let sa: SocketAddr = at.trim().parse().map_err(|_| format!("rank {} published {at:?}", job.rank & !1))?;
            TcpStream::connect_timeout(&sa, Duration::from_secs(10)).map_err(|err| format!("connect to {sa}: {err}"))?
        }
    };
    s.set_nodelay(true).map_err(e)?;
    Ok(Tcp { s, sender, buf: vec![0; max.max(4)] })
}

/// Every rank's `value`, through the rendezvous, as numbers.
fn gather(job: &Job, key: &str, value: f64) -> Result<Vec<f64>, String> {
    let all = job.exchange(key, &value.to_string(), STALL).map_err(err)?;
    all.iter().map(|v| v.trim().parse().map_err(|_| format!("{key}: rank published {v:?}"))).collect()
}

/// One size's figures.
struct Row {
    size: usize,
    msgs: u64,
    emp_rate: f64,
    /// Engine threads' ns per message, whole daemons' ns per message.
    nic_ns: Option<(f64, f64)>,
    /// TCP rate and both ends' CPU ns per message.
    tcp: Option<(f64, f64)>,
    /// ACK frames the NICs sent per message (handshakes' included).
    acks_per_msg: Option<f64>,
    /// The NICs' working time per message (ns): their processors' time
    /// with the polling that found nothing left out.
    busy_ns: Option<f64>,
}

/// This rank's NIC's ACK frames sent so far (`None`: counters unreadable).
fn acks_sent(dev: &Device) -> Option<u64> {
    dev.nic_counters().ok().map(|c| c[emp_uapi::sram::counter::ACKS_TX])
}

/// This rank's NIC's working time so far, ns (`None`: not readable).
fn busy_ns(dev: &Device) -> Option<u64> {
    dev.nic_busy().ok().map(|(ns, _)| ns)
}

/// What all the ranks' NICs counted between two readings, each NIC
/// counted once: every rank publishes `node:before:after` (or `node:-`).
fn sum_per_nic(job: &Job, key: &str, node: u16, reading: Option<(u64, u64)>) -> Result<Option<u64>, String> {
    let mine = match reading {
        Some((b, a)) => format!("{node}:{b}:{a}"),
        None => format!("{node}:-"),
    };
    let all = job.exchange(key, &mine, STALL).map_err(err)?;
    let mut per_nic = std::collections::BTreeMap::new();
    for v in &all {
        let f: Vec<&str> = v.trim().split(':').collect();
        let (Some(n), Some(b), Some(a)) = (f.first(), f.get(1), f.get(2)) else { return Ok(None) };
        let (Ok(n), Ok(b), Ok(a)) = (n.parse::<u16>(), b.parse::<u64>(), a.parse::<u64>()) else { return Ok(None) };
        per_nic.insert(n, a.wrapping_sub(b));
    }
    Ok(Some(per_nic.values().sum()))
}

/// One rank of `emp bench rate`.
pub(super) fn rank(a: &BenchArgs, job: &Job) -> Result<(), String> {
    if job.size < 2 || job.size % 2 != 0 {
        return Err(format!("rate runs pairs of ranks; got {} ranks", job.size));
    }
    let pairs = job.size / 2;
    let window = a.window.unwrap_or(DEFAULT_WINDOW);
    let sizes = if a.sizes.is_empty() { vec![8] } else { a.sizes.clone() };
    let max = sizes.iter().copied().max().unwrap_or(8).max(4);
    let mut dev = Device::open().map_err(err)?;
    let info = *dev.info();
    if window == 0 || window > info.recv_entries as usize || window > info.send_entries as usize {
        return Err(format!("--window {window}: 1 to {} (the port's rings)", info.recv_entries.min(info.send_entries)));
    }
    let eps = job.endpoints(dev.endpoint()).map_err(err)?;
    let sender = job.rank % 2 == 0;
    let peer = eps[job.rank ^ 1];
    let (buf, hs) = (dev.alloc(max).map_err(err)?, dev.alloc(64).map_err(err)?);
    let waiter = Waiter::blocking(a.blocking, STALL);
    let mut emp = Emp {
        dev,
        peer,
        sender,
        buf,
        hs,
        waiter,
        cqes: [Completion::default(); 64],
        sends: 0,
        recvs: 0,
        hss: 0,
        persistent: a.persistent,
    };
    let mut tcp = if a.no_tcp { None } else { Some(tcp_pair(job, sender, max)?) };
    let pids = &a.nicd_pids;
    if job.rank == 0 && nic_cpu(pids).is_none() {
        say(a, "# NIC CPU: not measured (no emulated NIC daemon of this machine to read)");
    }
    let mut rows = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let (windows, warm) = windows_for(size, a.iters);
        let msgs = (pairs * window * windows) as u64;
        let tag = (i as u64 + 1) << 40;
        if a.persistent {
            emp.store(tag, size)?;
        }
        if sender {
            emp.recv(tag | HS, 4, true)?;
        }
        emp.dev_barrier(job, &format!("rate{i}"))?;
        let before = if job.rank == 0 { nic_cpu(pids) } else { None };
        let acks_before = acks_sent(&emp.dev);
        let busy_before = busy_ns(&emp.dev);
        let secs = emp.run(tag, size, window, windows, warm)?;
        // Every rank's last completion is in: its NIC sent every ACK it owed
        // for this rank's messages except, at most, the last run's.
        emp.dev_barrier(job, &format!("rate{i}-end"))?;
        let after = if job.rank == 0 { nic_cpu(pids) } else { None };
        let acks = acks_before.zip(acks_sent(&emp.dev));
        let busy = busy_before.zip(busy_ns(&emp.dev));
        let slowest = gather(job, &format!("rate{i}-secs"), secs)?.into_iter().fold(0.0, f64::max);
        // Warm-up windows cost NIC CPU too: charge it to every message sent.
        let sent = (pairs * window * (windows + warm)) as f64;
        let nic_ns = match (before, after) {
            (Some(b), Some(a)) => Some(((a.0 - b.0) as f64 / sent, (a.1 - b.1) as f64 / sent)),
            _ => None,
        };
        let node = emp.dev.endpoint().node;
        let acks_per_msg = sum_per_nic(job, &format!("rate{i}-acks"), node, acks)?.map(|n| n as f64 / sent);
        let busy_ns = sum_per_nic(job, &format!("rate{i}-busy"), node, busy)?.map(|n| n as f64 / sent);
        let tcp_row = match tcp.as_mut() {
            None => None,
            Some(t) => {
                job.sync(&format!("rate{i}-tcp")).map_err(err)?;
                let cpu0 = self_cpu_ns();
                let secs = t.run(size, window, windows, warm)?;
                let cpu = (self_cpu_ns() - cpu0) as f64;
                let slowest = gather(job, &format!("rate{i}-tcp-secs"), secs)?.into_iter().fold(0.0, f64::max);
                let cpu_all: f64 = gather(job, &format!("rate{i}-tcp-cpu"), cpu)?.into_iter().sum();
                Some((msgs as f64 / slowest, cpu_all / sent))
            }
        };
        let row = Row { size, msgs, emp_rate: msgs as f64 / slowest, nic_ns, tcp: tcp_row, acks_per_msg, busy_ns };
        if job.rank == 0 && !a.json {
            if rows.is_empty() {
                print_header(a, pairs, window);
            }
            print_row(&row);
        }
        rows.push(row);
    }
    if job.rank == 0 && a.json {
        print_json(&json(a, pairs, window, &rows));
    }
    emp.dev_barrier(job, "rate-done")
}

impl Emp {
    fn dev_barrier(&mut self, job: &Job, name: &str) -> Result<(), String> {
        job.barrier(&mut self.dev, name).map_err(err)
    }
}

fn print_header(a: &BenchArgs, pairs: usize, window: usize) {
    let emp_path = a
        .emp_path
        .clone()
        .unwrap_or_else(|| format!("EMP through {}", std::env::var("EMP_DEVICE").unwrap_or_default()));
    let how = if a.persistent { "persistent descriptors (24-byte starts)" } else { "posted descriptors" };
    println!(
        "# EMP message rate, {pairs} pair(s), windows of {window}, {how}; {emp_path} vs TCP over loopback, same run"
    );
    println!(
        "# NIC µs/msg: the emulated NICs' CPU threads' time per message (engine + nic-cpu*; sender, receiver, ACKs)"
    );
    println!("# busy µs/msg: of that, the time they spent working (on doorbells, frames, timers), polling left out");
    println!("# TCP µs/msg: both ends' user + system CPU time per message");
    println!("# ACKs/msg: ACK frames the NICs sent per message (coalesced; the handshakes' included)");
    println!(
        "# {:<8} {:>10} {:>12} {:>10} {:>12} {:>13} {:>9} {:>12} {:>12} {:>9}",
        "Size",
        "Messages",
        "EMP msg/s",
        "EMP MB/s",
        "NIC µs/msg",
        "busy µs/msg",
        "ACKs/msg",
        "TCP msg/s",
        "TCP µs/msg",
        "EMP/TCP"
    );
}

fn print_row(r: &Row) {
    let nic = r.nic_ns.map_or("-".to_string(), |(e, _)| format!("{:.3}", e / 1e3));
    let (tr, tc, ratio) = match r.tcp {
        Some((rate, ns)) => (format!("{rate:.0}"), format!("{:.3}", ns / 1e3), format!("{:.3}", r.emp_rate / rate)),
        None => ("-".into(), "-".into(), "-".into()),
    };
    let acks = r.acks_per_msg.map_or("-".to_string(), |a| format!("{a:.3}"));
    let busy = r.busy_ns.map_or("-".to_string(), |b| format!("{:.3}", b / 1e3));
    println!(
        "{:<10} {:>10} {:>12.0} {:>10.1} {:>12} {:>13} {:>9} {:>12} {:>12} {:>9}",
        r.size,
        r.msgs,
        r.emp_rate,
        r.emp_rate * r.size as f64 / 1e6,
        nic,
        busy,
        acks,
        tr,
        tc,
        ratio
    );
}

/// `{"benchmark":"Rate","unit":"msg/s","pairs":1,"window":64,…,"rows":[{"size":8,"messages":…,"emp":…,
/// "nic_us_per_msg":…,"nicd_us_per_msg":…,"nic_busy_us_per_msg":…,"tcp":…,"tcp_us_per_msg":…},…]}`.
fn json(a: &BenchArgs, pairs: usize, window: usize, rows: &[Row]) -> Json {
    let rows = rows
        .iter()
        .map(|r| {
            let mut row = vec![
                ("size", Json::Int(r.size as u64)),
                ("messages", Json::Int(r.msgs)),
                ("emp", Json::Num(r.emp_rate, 0)),
                ("emp_mb_per_s", Json::Num(r.emp_rate * r.size as f64 / 1e6, 1)),
            ];
            match r.nic_ns {
                Some((engine, all)) => {
                    row.push(("nic_us_per_msg", Json::Num(engine / 1e3, 4)));
                    row.push(("nicd_us_per_msg", Json::Num(all / 1e3, 4)));
                }
                None => {
                    row.push(("nic_us_per_msg", Json::Null));
                    row.push(("nicd_us_per_msg", Json::Null));
                }
            }
            row.push(("nic_busy_us_per_msg", r.busy_ns.map_or(Json::Null, |b| Json::Num(b / 1e3, 4))));
            row.push(("acks_per_msg", r.acks_per_msg.map_or(Json::Null, |a| Json::Num(a, 4))));
            if let Some((rate, ns)) = r.tcp {
                row.push(("tcp", Json::Num(rate, 0)));
                row.push(("tcp_us_per_msg", Json::Num(ns / 1e3, 4)));
            }
            Json::Obj(row)
        })
        .collect();
    Json::Obj(vec![
        ("benchmark", Json::str("Rate")),
        ("unit", Json::str("msg/s")),
        ("pairs", Json::Int(pairs as u64)),
        ("window", Json::Int(window as u64)),
        ("descriptors", Json::str(if a.persistent { "persistent" } else { "posted" })),
        ("emp_path", Json::str(a.emp_path.as_deref().unwrap_or(""))),
        ("tcp_path", if a.no_tcp { Json::Null } else { Json::str("TCP over loopback") }),
        ("rows", Json::Arr(rows)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_command_name() {
        let line = "42 (emp nicd) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 3 0 1 2 3";
        assert_eq!(utime_stime(line), Some(12));
        assert_eq!(utime_stime("garbage"), None);
    }

    #[test]
    fn this_thread_has_a_run_time_and_it_grows() {
        let pid = std::process::id() as i32;
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let a = thread_cpu_ns(pid, tid).expect("own thread readable");
        // Spin until the accounting moves (however loaded the machine, a
        // spinning thread gets run time); bounded so a stuck figure fails.
        let end = Instant::now() + Duration::from_secs(10);
        let mut x = 0u64;
        let mut b = a;
        while b == a && Instant::now() < end {
            for _ in 0..100_000 {
                x = x.wrapping_add(std::hint::black_box(1));
            }
            b = thread_cpu_ns(pid, tid).expect("own thread readable");
        }
        assert!(b > a, "spinning shows as run time: {a} -> {b} ({x})");
        assert!(nic_cpu(&[]).is_none(), "no daemon, no figure");
        assert!(nic_cpu(&[pid]).is_some());
    }
}
