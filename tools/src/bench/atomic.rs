//! `emp bench atomic`: latency of one remote atomic from rank 1 on a word
//! of rank 0, executed by rank 0's NIC versus served by rank 0's CPU (the
//! host-based baseline, `emp::host_atomics`: request and reply are tagged
//! messages), measured in the same run by the same method, mean over the
//! iterations. Fetch-and-add of 1, and compare-and-swap that always hits
//! (the paper's CAS hit). `--sizes` picks the word widths in bytes (4, 8;
//! default 8).
//!
//! Waiting: by default every rank polls its completion queue, yielding the
//! CPU between polls (the paper's "poll" server); `--blocking` waits as
//! `Device::wait_wr` does, spinning briefly and then sleeping on the port's
//! event (its "spin-block"). The host server needs a CPU either way: on
//! this machine's two cores it competes with the client and the NIC.

use std::time::{Duration, Instant};

use emp::host_atomics::{HostAtomicClient, HostAtomicServer};
use emp::rdv::Job;
use emp::{Device, Endpoint, MemSpan, RemoteKey, RemoteWord, Width, MR_REMOTE_ATOMIC};

use super::{err, print_json, BenchArgs, Json, Waiter};

/// Tag of the message carrying rank 0's key (reserved for the benchmark).
const KEY_TAG: u64 = 0xB0A7_0000;
const T: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    FetchAdd,
    CmpSwap,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::FetchAdd => "fetch-add",
            Op::CmpSwap => "cmp-swap",
        }
    }
}

struct Row {
    op: Op,
    width: u32,
    nic: f64,
    host: f64,
}

/// One NIC atomic, posted and waited for; returns the old value.
fn nic_op(
    dev: &mut Device,
    to: Endpoint,
    at: RemoteWord,
    op: Op,
    v: u64,
    result: MemSpan,
    waiter: Waiter,
) -> Result<u64, String> {
    let r = result.sge(0, at.width.bytes() as usize);
    match op {
        Op::FetchAdd => dev.post_fetch_add(3, to, at, 1, r),
        Op::CmpSwap => dev.post_cmp_swap(3, to, at, v, v + 1, r),
    }
    .map_err(err)?;
    Ok(waiter.ok(dev, 3, op.name())?.old)
}

/// Rank 0's word, as rank 1 names it: sent over EMP (works in static jobs too).
fn share_key(dev: &mut Device, job: &Job, peer: Endpoint, key: RemoteKey) -> Result<RemoteKey, String> {
    // Once per run, outside the timed loops: block whatever `--blocking` says.
    let blocking = Waiter::blocking(true, T);
    let b = dev.alloc(8).map_err(err)?;
    if job.rank == 1 {
        dev.post_recv(1, peer, KEY_TAG, 0, &[b.sge(0, 8)]).map_err(err)?;
    }
    job.barrier(dev, "atomic-key").map_err(err)?;
    if job.rank == 0 {
        b.atomic_u64(0).store(key.as_u64(), std::sync::atomic::Ordering::SeqCst);
        dev.post_send(2, peer, KEY_TAG, &[b.sge(0, 8)]).map_err(err)?;
        blocking.ok(dev, 2, "sending the key")?;
        return Ok(key);
    }
    blocking.ok(dev, 1, "receiving the key")?;
    Ok(RemoteKey::from_u64(b.atomic_u64(0).load(std::sync::atomic::Ordering::SeqCst)))
}

/// One timed loop of `warm + iters` operations by the client; `op(i)`
/// returns the old value, which must follow from the previous one.
fn timed(warm: usize, iters: usize, kind: Op, mut op: impl FnMut(u64) -> Result<u64, String>) -> Result<f64, String> {
    let mut expect = None;
    let mut t0 = Instant::now();
    let mut v = 0u64;
    for i in 0..warm + iters {
        if i == warm {
            t0 = Instant::now();
        }
        let old = op(v)?;
        if expect.is_some_and(|e| e != old) {
            return Err(format!("{}: old value {old}, expected {expect:?}", kind.name()));
        }
        v = old + 1;
        expect = Some(v);
    }
    Ok(t0.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

/// One rank of `emp bench atomic`.
pub(super) fn rank(a: &BenchArgs, job: &Job, mut dev: Device, eps: &[Endpoint]) -> Result<(), String> {
    let widths: Vec<u32> = if a.sizes.is_empty() { vec![8] } else { a.sizes.iter().map(|&s| s as u32).collect() };
    if let Some(w) = widths.iter().find(|&&w| Width::from_bytes(w).is_none()) {
        return Err(format!("atomic: --sizes are word widths, 4 or 8 (not {w})"));
    }
    let (iters, warm) = a.iters.map(|n| (n, (n / 10).max(1))).unwrap_or((2000, 200));
    let peer = eps[1 - job.rank];
    // Rank 0's words: NIC atomics hit `region`, the host server `served`.
    let region = dev.alloc_mr(4096, MR_REMOTE_ATOMIC).map_err(err)?;
    let served = dev.alloc(64).map_err(err)?;
    let key = share_key(&mut dev, job, peer, region.remote_key())?;
    let mut server = if job.rank == 0 { Some(HostAtomicServer::new(&mut dev, served, 4).map_err(err)?) } else { None };
    let mut client =
        if job.rank == 1 { Some(HostAtomicClient::new(&mut dev).map_err(err)?.polling(!a.blocking)) } else { None };
    let result = dev.alloc(8).map_err(err)?.span();
    let waiter = Waiter::blocking(a.blocking, T);
    let mut rows = Vec::new();
    for (wi, &width) in widths.iter().enumerate() {
        let w = Width::from_bytes(width).expect("checked");
        for op in [Op::FetchAdd, Op::CmpSwap] {
            // Fresh words per row: every row starts from 0.
            let slot = (wi * 2 + (op == Op::CmpSwap) as usize) as u64 * 8;
            let at = RemoteWord { key, offset: slot, width: w };
            job.barrier(&mut dev, &format!("nic-{width}-{}", op.name())).map_err(err)?;
            let nic = if job.rank == 1 {
                timed(warm, iters, op, |v| nic_op(&mut dev, eps[0], at, op, v, result, waiter))?
            } else {
                0.0
            };
            job.barrier(&mut dev, &format!("host-{width}-{}", op.name())).map_err(err)?;
            let host = match (&mut server, &mut client) {
                (Some(s), _) => {
                    serve(s, &mut dev, (warm + iters) as u64, a.blocking)?;
                    0.0
                }
                (_, Some(c)) => timed(warm, iters, op, |v| {
                    match op {
                        Op::FetchAdd => c.fetch_add(&mut dev, eps[0], slot, w, 1),
                        Op::CmpSwap => c.cmp_swap(&mut dev, eps[0], slot, w, v, v + 1),
                    }
                    .map_err(err)
                })?,
                _ => unreachable!("rank 0 serves, rank 1 measures"),
            };
            rows.push(Row { op, width, nic, host });
        }
    }
    // Rank 1 measured: it reports.
    if job.rank == 1 {
        if a.json {
            print_json(&json(&rows));
        } else {
            print_table(&rows, a.blocking);
        }
    }
    job.barrier(&mut dev, "bench-done").map_err(err)
}

/// Rank 0's CPU serves `n` more requests.
fn serve(s: &mut HostAtomicServer, dev: &mut Device, n: u64, blocking: bool) -> Result<(), String> {
    let want = s.served() + n;
    let mut idle_since = Instant::now();
    while s.served() < want {
        let served =
            if blocking { s.serve_one(dev, Some(T)).map_err(err)? } else { s.try_serve_one(dev).map_err(err)? };
        if served {
            idle_since = Instant::now();
        } else if blocking || idle_since.elapsed() > T {
            return Err("host server: the client stopped sending".into());
        } else {
            std::thread::yield_now();
        }
    }
    Ok(())
}

fn print_table(rows: &[Row], blocking: bool) {
    let how = if blocking { "blocking waits (spin, then sleep on the event)" } else { "polling waits" };
    println!("# EMP remote atomic latency (us), rank 1 on a word of rank 0: executed by rank 0's NIC vs served by");
    println!("# rank 0's CPU (request and reply as tagged messages); {how}, same run");
    println!("# {:<10} {:>6} {:>12} {:>12} {:>10}", "Op", "Width", "NIC", "Host", "Host/NIC");
    for r in rows {
        println!("{:<12} {:>6} {:>12.2} {:>12.2} {:>10.3}", r.op.name(), r.width, r.nic, r.host, r.host / r.nic);
    }
}

/// `{"benchmark":"Atomic","unit":"us","rows":[{"op":"fetch-add","width":8,"nic":…,"host":…},…]}`.
fn json(rows: &[Row]) -> Json {
    let rows = rows
        .iter()
        .map(|r| {
            Json::Obj(vec![
                ("op", Json::str(r.op.name())),
                ("width", Json::Int(r.width as u64)),
                ("nic", Json::Num(r.nic, 3)),
                ("host", Json::Num(r.host, 3)),
            ])
        })
        .collect();
    Json::Obj(vec![("benchmark", Json::str("Atomic")), ("unit", Json::str("us")), ("rows", Json::Arr(rows))])
}
