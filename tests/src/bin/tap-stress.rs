//! Stress of the NIC's CPUs under loss (docs/nic-cpus.md): run as 2 ranks
//! (`emp run -n 2 -- tap-stress`) on a chassis with a lossy wire. Rank 0
//! streams messages of mixed sizes to rank 1 with a window of sends in
//! flight, then the two ping-pong; every receive takes the next message
//! from its sender whatever its tag, so a lost message stalls (a timeout),
//! and a duplicated or reordered one lands in the wrong receive (its
//! sequence number and payload pattern say so). `EMP_STRESS_MSGS` sets the
//! streamed messages (default 600), `EMP_STRESS_ROUNDS` the ping-pongs
//! (default 300). Rank 0 prints TAP.

use std::time::Duration;

use emp_tests::{expect_ok, pattern};

/// Long enough for a message to get through heavy loss and a loaded host.
const T: Duration = Duration::from_secs(120);
/// Sends in flight, and receives posted ahead.
const WINDOW: usize = 16;
/// Message sizes streamed, in turn: one frame, several, a multi-frame one.
const SIZES: [usize; 5] = [8, 64, 1400, 4000, 20000];
const SLOT: usize = 32 << 10;
/// Matches any tag: receives take the sender's messages in its order.
const ANY_TAG: u64 = u64::MAX;

type Ctx = emp_tests::P2pCtx;

fn env_count(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn size_of(seq: u64) -> usize {
    SIZES[seq as usize % SIZES.len()]
}

/// Message `seq`'s payload: its number, then a pattern seeded by it.
fn fill(buf: &mut [u8], seq: u64) {
    pattern(seq, buf);
    buf[..8].copy_from_slice(&seq.to_le_bytes());
}

fn check(buf: &[u8], seq: u64) -> Result<(), String> {
    let got = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
    if got != seq {
        return Err(format!("receive {seq} got message {got} (lost, duplicated or reordered)"));
    }
    let mut want = vec![0u8; buf.len()];
    fill(&mut want, seq);
    match want.iter().zip(buf).position(|(w, g)| w != g) {
        None => Ok(()),
        Some(at) => Err(format!("message {seq}: byte {at} is {:#x}, want {:#x}", buf[at], want[at])),
    }
}

fn stream(c: &mut Ctx) -> Result<(), String> {
    let n = env_count("EMP_STRESS_MSGS", 600);
    match c.rank() {
        0 => {
            c.sync("stream")?;
            let mut inflight = std::collections::VecDeque::new();
            for seq in 0..n {
                if inflight.len() == WINDOW {
                    let wr = inflight.pop_front().expect("window");
                    expect_ok(&c.wait(wr)?)?;
                }
                let slot = seq as usize % WINDOW * SLOT;
                let len = size_of(seq);
                fill(&mut c.sbuf.as_mut_slice()[slot..slot + len], seq);
                inflight.push_back(c.send(1, seq, slot, len)?);
            }
            while let Some(wr) = inflight.pop_front() {
                expect_ok(&c.wait(wr)?)?;
            }
            Ok(())
        }
        _ => {
            let from = c.eps[0];
            let mut posted = std::collections::VecDeque::new();
            let mut next_post = 0;
            while next_post < n.min(WINDOW as u64) {
                posted.push_back(c.recv(from, 0, ANY_TAG, next_post as usize % WINDOW * SLOT, SLOT)?);
                next_post += 1;
            }
            c.sync("stream")?;
            for seq in 0..n {
                let wr = posted.pop_front().expect("posted ahead");
                let rc = c.wait(wr)?;
                expect_ok(&rc).map_err(|e| format!("receive {seq}: {e}"))?;
                let slot = seq as usize % WINDOW * SLOT;
                if rc.tag != seq || rc.byte_len as usize != size_of(seq) {
                    return Err(format!("receive {seq} matched tag {} of {} B", rc.tag, rc.byte_len));
                }
                check(&c.rbuf.as_slice()[slot..slot + size_of(seq)], seq)?;
                if next_post < n {
                    posted.push_back(c.recv(from, 0, ANY_TAG, next_post as usize % WINDOW * SLOT, SLOT)?);
                    next_post += 1;
                }
            }
            Ok(())
        }
    }
}

fn ping_pong(c: &mut Ctx) -> Result<(), String> {
    let rounds = env_count("EMP_STRESS_ROUNDS", 300);
    let peer = 1 - c.rank().min(1);
    let from = c.eps[peer];
    c.sync("pingpong")?;
    for k in 0..rounds {
        // Even messages go 0 → 1, odd ones 1 → 0.
        let (ping, pong) = (2 * k, 2 * k + 1);
        let (mine, theirs) = if c.rank() == 0 { (ping, pong) } else { (pong, ping) };
        let len = size_of(k);
        let r = c.recv(from, 0, ANY_TAG, 0, SLOT)?;
        if c.rank() == 0 {
            fill(&mut c.sbuf.as_mut_slice()[..len], mine);
            expect_ok(&send_wait(c, peer, mine, len)?)?;
        }
        let rc = c.wait(r)?;
        expect_ok(&rc).map_err(|e| format!("round {k}: {e}"))?;
        if rc.tag != theirs || rc.byte_len as usize != len {
            return Err(format!("round {k}: got tag {} of {} B, want {theirs}", rc.tag, rc.byte_len));
        }
        check(&c.rbuf.as_slice()[..len], theirs)?;
        if c.rank() == 1 {
            fill(&mut c.sbuf.as_mut_slice()[..len], mine);
            expect_ok(&send_wait(c, peer, mine, len)?)?;
        }
    }
    Ok(())
}

/// Sends `len` bytes from the send buffer's start and waits for it.
fn send_wait(c: &mut Ctx, to: usize, tag: u64, len: usize) -> Result<emp::Completion, String> {
    let wr = c.send(to, tag, 0, len)?;
    c.wait(wr)
}

fn main() {
    let (job, mut dev, eps) = emp_tests::tap_start("tap-stress", 2, emp_tests::WithoutRendezvous::Run);
    if job.size != 2 {
        eprintln!("tap-stress: runs as exactly 2 ranks");
        std::process::exit(2);
    }
    let quiet = job.rank != 0;
    let sbuf = dev.alloc(WINDOW * SLOT).expect("arena");
    let rbuf = dev.alloc(WINDOW * SLOT).expect("arena");
    let mut c = Ctx::new(dev, job, eps, sbuf, rbuf, T);
    let tests: [emp_tests::TapCase<Ctx>; 2] = [
        ("streamed messages of mixed sizes arrive once, whole and in order", stream),
        ("ping-pong of mixed sizes: every reply once, whole and in order", ping_pong),
    ];
    emp_tests::run_tap(quiet, &mut c, &tests, |c, name| {
        let _ = c.sync(name);
    });
}
