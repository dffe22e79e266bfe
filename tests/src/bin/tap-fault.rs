//! Faults across hosts (`tap-fault <mode>`, 2 ranks, `emp run --config`;
//! scripts/netns/faults.sh injects the fault while the job runs). Rank 0
//! streams 1 MiB messages to rank 1 for `EMP_FAULT_SECS` (default 6) and
//! prints TAP; rank 1 checks every message it receives.
//! - `flap`: the link is down for a moment mid-stream: every message must
//!   arrive intact, and one must have waited out the outage (at least
//!   `EMP_FAULT_MIN_STALL_MS`, default 200: proof the fault hit the
//!   transfer), by retransmission.
//! - `cut`: the link stays down longer than the retry budget: a send must
//!   fail with RetryLimitExceeded (not hang, not succeed) within 30 s; once
//!   the link is back (the script restores it), a new message goes through.
//! - `restart`: rank 1's daemon is stopped and started again mid-stream:
//!   rank 0's send must fail with an error status within 30 s; rank 1 must
//!   see its device fail rather than hang.

use std::time::{Duration, Instant};

use emp::rdv::Job;
use emp::{Buffer, Device, Endpoint, Status};
use emp_tests::{check_pattern, pattern, Tap};

/// Stream message size.
const MSG: usize = 1 << 20;
const AFTER: u64 = 1 << 40;
const END: &[u8; 8] = b"end-mark";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Ends {
    dev: Device,
    job: Job,
    eps: Vec<Endpoint>,
    buf: Buffer,
}

/// Rank 0: sends message i (pattern i) one at a time until `secs` passed or
/// a send fails. Returns (messages sent, longest send, the failure).
fn stream(e: &mut Ends, secs: u64) -> (u64, Duration, Option<(Status, Duration)>) {
    let start = Instant::now();
    let (mut i, mut longest) = (0u64, Duration::ZERO);
    while start.elapsed() < Duration::from_secs(secs) {
        pattern(i, &mut e.buf.as_mut_slice()[..MSG]);
        let t = Instant::now();
        if let Err(err) = e.dev.post_send(i + 1, e.eps[1], i, &[e.buf.sge(0, MSG)]) {
            eprintln!("# post_send {i}: {err}");
            return (i, longest, Some((Status::BadDescriptor, t.elapsed())));
        }
        match e.dev.wait_wr(i + 1, Some(Duration::from_secs(30))) {
            Ok(c) if c.status == Status::Success => {}
            Ok(c) => return (i, longest, Some((c.status, t.elapsed()))),
            // No completion at all within 30 s: a hang, reported as such.
            Err(err) => {
                eprintln!("# send {i}: {err}");
                return (i, longest, Some((Status::Success, t.elapsed())));
            }
        }
        longest = longest.max(t.elapsed());
        i += 1;
    }
    (i, longest, None)
}

/// Rank 1: receives messages 0.. in order until the end message (8 bytes,
/// tagged with the count: the next index) or an error; returns the count.
fn drain(e: &mut Ends) -> Result<u64, String> {
    let mut i = 0u64;
    loop {
        // Exact tags: a message of a later phase never matches this one.
        e.dev.post_recv(i + 1, e.eps[0], i, 0, &[e.buf.sge(0, MSG)]).map_err(|x| x.to_string())?;
        let c = e.dev.wait_wr(i + 1, Some(Duration::from_secs(60))).map_err(|x| format!("message {i}: {x}"))?;
        if c.status != Status::Success {
            return Err(format!("message {i}: {}", c.status.as_str()));
        }
        if c.byte_len == 8 {
            return match e.buf.as_slice()[..8] == *END {
                true => Ok(i),
                false => Err(format!("message {i}: 8 bytes, not the end mark")),
            };
        }
        check_pattern(i, &e.buf.as_slice()[..MSG])?;
        i += 1;
    }
}

fn send_small(e: &mut Ends, wr: u64, tag: u64, timeout: Duration) -> Result<Status, String> {
    e.buf.as_mut_slice()[..8].copy_from_slice(END);
    e.dev.post_send(wr, e.eps[1], tag, &[e.buf.sge(0, 8)]).map_err(|x| x.to_string())?;
    e.dev.wait_wr(wr, Some(timeout)).map(|c| c.status).map_err(|x| x.to_string())
}

fn flap(e: &mut Ends, tap: &mut Tap) {
    let secs = env_u64("EMP_FAULT_SECS", 6);
    let min_stall = Duration::from_millis(env_u64("EMP_FAULT_MIN_STALL_MS", 200));
    if e.job.rank == 1 {
        let v = drain(e);
        let _ = e.job.exchange("rx", &format!("{v:?}").replace('\n', " "), Duration::from_secs(120));
        std::process::exit(if v.is_ok() { 0 } else { 1 });
    }
    let (n, longest, fail) = stream(e, secs);
    let end = send_small(e, 1 << 30, n, Duration::from_secs(30));
    let rx = e.job.exchange("rx", "", Duration::from_secs(120)).map(|v| v[1].clone()).unwrap_or_default();
    tap.check(
        &format!("{n} MiB streamed across a link flap arrive intact (rank 1: {rx})"),
        match (fail, end) {
            (Some((st, t)), _) => Err(format!("send {n} ended with {} after {t:?}", st.as_str())),
            (None, Ok(Status::Success)) if rx.starts_with("Ok(") => Ok(()),
            (None, end) => Err(format!("end message: {end:?}; receiver: {rx}")),
        },
    );
    tap.check(
        &format!("the outage stalled a message ({longest:?} >= {min_stall:?}): retransmission recovered it"),
        if longest >= min_stall { Ok(()) } else { Err("no message waited out the link being down".into()) },
    );
}

/// Rank 1 of `cut`: receives the stream (the message cut off mid-way may
/// end with an error, or never) until the message sent after the link is
/// back arrives; "ok" or what went wrong.
fn cut_receiver(e: &mut Ends) -> String {
    const AFTER_WR: u64 = u64::MAX;
    if let Err(x) = e.dev.post_recv(AFTER_WR, e.eps[0], AFTER, 0, &[e.buf.sge(MSG, 8)]) {
        return x.to_string();
    }
    let mut i = 0u64;
    let mut wc = [emp::Completion::default(); 4];
    let end = Instant::now() + Duration::from_secs(150);
    loop {
        if let Err(x) = e.dev.post_recv(i, e.eps[0], i, 0, &[e.buf.sge(0, MSG)]) {
            return x.to_string();
        }
        let mut next = false;
        while !next {
            let left = end.saturating_duration_since(Instant::now());
            let got = match e.dev.wait_cq(&mut wc, Some(left)) {
                Ok(0) | Err(emp::Error::Timeout) => return "no message after the link came back".into(),
                Ok(k) => k,
                Err(x) => return x.to_string(),
            };
            for c in &wc[..got] {
                if c.wr_id == AFTER_WR {
                    return if c.status == Status::Success { "ok".into() } else { c.status.as_str().into() };
                }
                if c.wr_id == i && c.status == Status::Success {
                    if let Err(x) = check_pattern(i, &e.buf.as_slice()[..MSG]) {
                        return x;
                    }
                    i += 1;
                    next = true;
                } else {
                    // The message the cut broke: its receive ends (or not); keep
                    // waiting for the one after.
                    println!("# rank 1: message {} ended with {}", c.wr_id, c.status.as_str());
                }
            }
        }
    }
}

fn cut(e: &mut Ends, tap: &mut Tap) {
    let secs = env_u64("EMP_FAULT_SECS", 30);
    if e.job.rank == 1 {
        let v = cut_receiver(e);
        let _ = e.job.exchange("rx", &v, Duration::from_secs(120));
        std::process::exit(if v == "ok" { 0 } else { 1 });
    }
    let (n, _, fail) = stream(e, secs);
    tap.check(
        &format!("a send across a link down past the retry budget fails with RetryLimitExceeded (after {n} MiB)"),
        match fail {
            Some((Status::RetryLimitExceeded, t)) if t < Duration::from_secs(30) => {
                println!("# send {n} failed after {t:?}");
                Ok(())
            }
            Some((st, t)) => Err(format!("send {n} ended with {} after {t:?}", st.as_str())),
            None => Err(format!("every send for {secs} s succeeded: the link was never cut")),
        },
    );
    // The script brings the link back; keep trying for a while.
    let t = Instant::now();
    let mut last = Err("not tried".to_string());
    let mut wr = 1 << 31;
    while t.elapsed() < Duration::from_secs(40) {
        wr += 1;
        last = send_small(e, wr, AFTER, Duration::from_secs(30));
        if last == Ok(Status::Success) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let rx = e.job.exchange("rx", "", Duration::from_secs(120)).map(|v| v[1].clone()).unwrap_or_default();
    tap.check(
        &format!("once the link is back a new message arrives (after {:?})", t.elapsed()),
        if last == Ok(Status::Success) && rx == "ok" { Ok(()) } else { Err(format!("send: {last:?}; receiver: {rx}")) },
    );
}

fn restart(e: &mut Ends, tap: &mut Tap) {
    let secs = env_u64("EMP_FAULT_SECS", 30);
    if e.job.rank == 1 {
        // Receive until the device fails under us (the daemon stopped).
        let t = Instant::now();
        let v = drain(e);
        println!("# rank 1: {v:?} after {:?}", t.elapsed());
        std::process::exit(if v.is_err() && t.elapsed() < Duration::from_secs(secs + 30) { 0 } else { 1 });
    }
    let (n, _, fail) = stream(e, secs);
    tap.check(
        &format!("a send to a peer whose daemon restarted fails cleanly (after {n} MiB)"),
        match fail {
            Some((Status::Success, t)) => Err(format!("send {n}: no completion within {t:?}")),
            Some((st, t)) => {
                println!("# send {n} ended with {} after {t:?}", st.as_str());
                Ok(())
            }
            None => Err(format!("every send for {secs} s succeeded: the daemon never went away")),
        },
    );
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let job = Job::from_env().unwrap_or_else(|e| {
        eprintln!("tap-fault: {e}");
        std::process::exit(2)
    });
    if job.size != 2 || !job.has_rendezvous() {
        eprintln!("tap-fault: run as 2 ranks with a rendezvous (emp run -n 2)");
        std::process::exit(2);
    }
    let mut dev = Device::open().unwrap_or_else(|e| {
        eprintln!("tap-fault: {e}");
        std::process::exit(2)
    });
    let eps = job.endpoints(dev.endpoint()).expect("endpoints");
    let buf = dev.alloc(MSG + 64).expect("buffer");
    let mut e = Ends { dev, job, eps, buf };
    let planned = match mode.as_str() {
        "flap" | "cut" => 2,
        "restart" => 1,
        _ => {
            eprintln!("usage: tap-fault flap|cut|restart");
            std::process::exit(2)
        }
    };
    let mut tap = Tap::new(planned, e.job.rank != 0);
    e.job.sync("go").expect("sync");
    // Rank 0 says when the stream starts: the script injects the fault after.
    if e.job.rank == 0 {
        println!("# streaming");
    }
    match mode.as_str() {
        "flap" => flap(&mut e, &mut tap),
        "cut" => cut(&mut e, &mut tap),
        _ => restart(&mut e, &mut tap),
    }
    std::process::exit(tap.finish());
}
