//! Matching TAP suite: run as 2 or more ranks (`emp run -n N -- tap-match`;
//! ranks above 1 only take part in the barriers). Rank 0 sends tag 1 then
//! tag 2 and rank 1 receives tag 2 first: over NICs in the default
//! `unexpected` matching mode this completes for small (eager) and large
//! (rendezvous) messages. Rank 0 prints TAP; every rank exits non-zero on
//! a failure.

use std::time::Duration;

use emp::{Status, ANY};
use emp_tests::{check_pattern, expect_ok, pattern};
use emp_uapi::sram::counter;

const T: Duration = Duration::from_secs(120);
/// The largest message.
const BIG: usize = 4 << 20;

type Ctx = emp_tests::P2pCtx;

fn tag(test: u64, n: u64) -> u64 {
    test << 48 | n
}

/// Rank 0 sends tag 1 (`len` bytes) then tag 2; rank 1 receives tag 2
/// first, then tag 1, after both were sent (a barrier in between: the
/// barrier's own messages come after both and are not blocked either).
fn out_of_order(c: &mut Ctx, test: u64, len: usize) -> Result<(), String> {
    let (t1, t2) = (tag(test, 1), tag(test, 2));
    let name = format!("ooo{test}");
    match c.rank() {
        0 => {
            pattern(test * 10 + 1, &mut c.sbuf.as_mut_slice()[..len]);
            pattern(test * 10 + 2, &mut c.sbuf.as_mut_slice()[BIG..BIG + len]);
            let s1 = c.send(1, t1, 0, len)?;
            let s2 = c.send(1, t2, BIG, len)?;
            c.sync(&name)?;
            for s in [s2, s1] {
                expect_ok(&c.wait(s)?).map_err(|e| format!("{len} B send: {e}"))?;
            }
            Ok(())
        }
        1 => {
            c.sync(&name)?;
            // Under loss the barrier may finish while tag 1 is still being
            // retransmitted: wait until the NIC holds it, so it is
            // unexpected whatever the wire did.
            let t0 = std::time::Instant::now();
            while c.dev.probe(c.eps[0], t1, 0).map_err(|e| format!("probe: {e}"))?.is_none() {
                if t0.elapsed() > T {
                    return Err(format!("{len} B tag 1 never arrived"));
                }
            }
            let r2 = c.recv(c.eps[0], t2, 0, BIG, len)?;
            let rc = c.wait(r2)?;
            expect_ok(&rc).map_err(|e| format!("{len} B tag 2: {e}"))?;
            if rc.tag != t2 || rc.byte_len as usize != len {
                return Err(format!("tag 2's receive got {rc:?}"));
            }
            check_pattern(test * 10 + 2, &c.rbuf.as_slice()[BIG..BIG + len])?;
            let r1 = c.recv(c.eps[0], t1, 0, 0, len)?;
            let rc = c.wait(r1)?;
            expect_ok(&rc).map_err(|e| format!("{len} B tag 1: {e}"))?;
            if rc.tag != t1 || rc.byte_len as usize != len {
                return Err(format!("tag 1's receive got {rc:?}"));
            }
            check_pattern(test * 10 + 1, &c.rbuf.as_slice()[..len])
        }
        _ => c.sync(&name),
    }
}

fn small(c: &mut Ctx) -> Result<(), String> {
    // Rank 0 sends as soon as it starts: read the count before it may.
    let before = c.counter(counter::UNEXP_EAGER)?;
    c.sync("small-start")?;
    out_of_order(c, 1, 64)?;
    if c.rank() == 1 && c.counter_reaching(counter::UNEXP_EAGER, before + 1)? == before {
        return Err("no message went to the eager pool".into());
    }
    Ok(())
}

fn large_64k(c: &mut Ctx) -> Result<(), String> {
    let before = c.counter(counter::RDV_PULLS)?;
    out_of_order(c, 2, 64 << 10)?;
    // Tag 1 is always unexpected (its receive is posted only after the
    // NIC held it and tag 2 completed); tag 2 is too only when it arrives
    // before rank 1 posts its receive, which timing decides.
    if c.rank() == 1 && c.counter_reaching(counter::RDV_PULLS, before + 1)? < before + 1 {
        return Err("the 64 KiB messages were not pulled by rendezvous".into());
    }
    Ok(())
}

fn large_4m(c: &mut Ctx) -> Result<(), String> {
    out_of_order(c, 3, BIG)
}

/// Messages of one tag, mixed sizes, all unexpected: receives posted later
/// (exact and any-source with an ignore mask) take them in sending order.
fn same_match_order(c: &mut Ctx) -> Result<(), String> {
    let lens = [100usize, 200_000, 10, 70_000, 0, 3000];
    let t = tag(4, 7);
    match c.rank() {
        0 => {
            let mut at = 0;
            let mut sends = Vec::new();
            for (i, &len) in lens.iter().enumerate() {
                pattern(400 + i as u64, &mut c.sbuf.as_mut_slice()[at..at + len]);
                sends.push(c.send(1, t, at, len)?);
                at += len;
            }
            c.sync("order")?;
            for s in sends {
                expect_ok(&c.wait(s)?)?;
            }
            Ok(())
        }
        1 => {
            c.sync("order")?;
            for (i, &len) in lens.iter().enumerate() {
                let r = if i % 2 == 0 {
                    c.recv(c.eps[0], t, 0, 0, 256 << 10)?
                } else {
                    c.recv(ANY, t, 0xFF, 0, 256 << 10)?
                };
                let rc = c.wait(r)?;
                expect_ok(&rc)?;
                if rc.byte_len as usize != len {
                    return Err(format!("receive {i} got {} B, expected message {i} of {len} B", rc.byte_len));
                }
                check_pattern(400 + i as u64, &c.rbuf.as_slice()[..len]).map_err(|e| format!("message {i}: {e}"))?;
            }
            Ok(())
        }
        _ => c.sync("order"),
    }
}

/// A rendezvous message into a short receive: truncated, prefix intact,
/// and the send still completes.
fn truncated(c: &mut Ctx) -> Result<(), String> {
    let t = tag(5, 0);
    match c.rank() {
        0 => {
            pattern(500, &mut c.sbuf.as_mut_slice()[..50_000]);
            let s = c.send(1, t, 0, 50_000)?;
            c.sync("trunc")?;
            expect_ok(&c.wait(s)?)
        }
        1 => {
            c.sync("trunc")?;
            let r = c.recv(c.eps[0], t, 0, 0, 20_000)?;
            let rc = c.wait(r)?;
            if rc.status != Status::Truncated || rc.byte_len != 20_000 || rc.msg_len != 50_000 {
                return Err(format!("{rc:?}"));
            }
            // A prefix of the pattern is the pattern of the prefix.
            check_pattern(500, &c.rbuf.as_slice()[..20_000])
        }
        _ => c.sync("trunc"),
    }
}

/// Probe peeks without receiving; probe_claim reserves one message that
/// only its claimed receive takes, whatever its size.
fn probe_and_claim(c: &mut Ctx) -> Result<(), String> {
    let t = tag(6, 1);
    let lens = [64usize, 100_000];
    match c.rank() {
        0 => {
            pattern(600, &mut c.sbuf.as_mut_slice()[..lens[0]]);
            pattern(601, &mut c.sbuf.as_mut_slice()[BIG..BIG + lens[1]]);
            let s1 = c.send(1, t, 0, lens[0])?;
            let s2 = c.send(1, t, BIG, lens[1])?;
            c.sync("probe")?;
            for s in [s1, s2] {
                expect_ok(&c.wait(s)?)?;
            }
            Ok(())
        }
        1 => {
            c.sync("probe")?;
            let e = |e: emp::Error| e.to_string();
            if let Some(m) = c.dev.probe(ANY, tag(6, 99), 0).map_err(e)? {
                return Err(format!("a probe for a tag nobody sent found {m:?}"));
            }
            // The messages are on their way: wait for the first to be held.
            let t0 = std::time::Instant::now();
            let first = loop {
                if let Some(m) = c.dev.probe(c.eps[0], t, 0).map_err(e)? {
                    break m;
                }
                if t0.elapsed() > T {
                    return Err("no message to probe".into());
                }
            };
            if first.len as usize != lens[0] || first.tag != t || first.src != c.eps[0] {
                return Err(format!("probe found {first:?}"));
            }
            let small = c.dev.probe_claim(ANY, t, 0).map_err(e)?.ok_or("claim found nothing")?;
            let large = loop {
                if let Some(m) = c.dev.probe_claim(ANY, t, 0).map_err(e)? {
                    break m;
                }
                if t0.elapsed() > T {
                    return Err("the second message never waited".into());
                }
            };
            if (small.msg.len as usize, large.msg.len as usize) != (lens[0], lens[1]) {
                return Err(format!("claimed {small:?} then {large:?}"));
            }
            if let Some(m) = c.dev.probe(ANY, t, 0).map_err(e)? {
                return Err(format!("a claimed message was probed again: {m:?}"));
            }
            // The large one first: claims pick the message, not the order.
            let (wr1, wr2) = (c.wr(), c.wr());
            let s = c.rbuf.sge(BIG, lens[1]);
            c.dev.post_recv_claimed(wr2, &large, &[s]).map_err(e)?;
            let rc = c.wait(wr2)?;
            expect_ok(&rc)?;
            check_pattern(601, &c.rbuf.as_slice()[BIG..BIG + lens[1]])?;
            let s = c.rbuf.sge(0, lens[0]);
            c.dev.post_recv_claimed(wr1, &small, &[s]).map_err(e)?;
            expect_ok(&c.wait(wr1)?)?;
            check_pattern(600, &c.rbuf.as_slice()[..lens[0]])?;
            let again = c.wr();
            c.dev.post_recv_claimed(again, &small, &[]).map_err(e)?;
            match c.wait(again)?.status {
                Status::NoMessage => Ok(()),
                st => Err(format!("a used claim received again: {}", st.as_str())),
            }
        }
        _ => c.sync("probe"),
    }
}

/// Immediate data (`post_send_imm`, libfabric's remote CQ data) reaches
/// the receive's completion on every path: a receive posted first, the
/// eager pool, a retained header pulled by rendezvous; a probe reports it;
/// a plain send carries none.
fn immediate_data(c: &mut Ctx) -> Result<(), String> {
    let e = |e: emp::Error| e.to_string();
    // (tag, bytes, immediate data), sent after rank 1 posted the first receive.
    let msgs = [
        (tag(7, 1), 64usize, Some(0xA1u32)),
        (tag(7, 2), 64, Some(0)),
        (tag(7, 3), 100_000, Some(0xA3)),
        (tag(7, 4), 64, None),
    ];
    match c.rank() {
        0 => {
            c.sync("imm-posted")?;
            let mut wrs = Vec::new();
            for (i, &(t, len, imm)) in msgs.iter().enumerate() {
                let off = i * (128 << 10);
                pattern(700 + i as u64, &mut c.sbuf.as_mut_slice()[off..off + len]);
                let (wr, sge) = (c.wr(), c.sbuf.sge(off, len));
                match imm {
                    Some(v) => c.dev.post_send_imm(wr, c.eps[1], t, &[sge], v).map_err(e)?,
                    None => c.dev.post_send(wr, c.eps[1], t, &[sge]).map_err(e)?,
                }
                wrs.push(wr);
            }
            c.sync("imm-sent")?;
            for wr in wrs {
                let sc = c.wait(wr)?;
                expect_ok(&sc)?;
                if sc.imm.is_some() {
                    return Err(format!("a send's own completion reports immediate data: {sc:?}"));
                }
            }
            Ok(())
        }
        1 => {
            let first = c.wr();
            c.dev.post_recv(first, c.eps[0], msgs[0].0, 0, &[c.rbuf.sge(0, msgs[0].1)]).map_err(e)?;
            c.sync("imm-posted")?;
            c.sync("imm-sent")?;
            let t0 = std::time::Instant::now();
            let (t, len, imm) = msgs[2];
            let seen = loop {
                if let Some(m) = c.dev.probe(ANY, t, 0).map_err(e)? {
                    break m;
                }
                if t0.elapsed() > T {
                    return Err("the rendezvous message never waited".into());
                }
            };
            if (seen.len as usize, seen.imm) != (len, imm) {
                return Err(format!("probe found {seen:?}, want {len} B with {imm:?}"));
            }
            for (i, &(t, len, imm)) in msgs.iter().enumerate() {
                let off = i * (128 << 10);
                let wr = if i == 0 {
                    first
                } else {
                    let wr = c.wr();
                    c.dev.post_recv(wr, ANY, t, 0, &[c.rbuf.sge(off, len)]).map_err(e)?;
                    wr
                };
                let rc = c.wait(wr)?;
                expect_ok(&rc)?;
                if (rc.tag, rc.byte_len as usize, rc.imm) != (t, len, imm) {
                    return Err(format!("message {i}: got {rc:?}, want tag {t:#x}, {len} B, {imm:?}"));
                }
                check_pattern(700 + i as u64, &c.rbuf.as_slice()[off..off + len])?;
            }
            Ok(())
        }
        _ => {
            c.sync("imm-posted")?;
            c.sync("imm-sent")
        }
    }
}

/// A receive no message matched is taken back (completes `Canceled`) and
/// takes no later message, even a wildcard one (hpcc's canceled
/// `MPI_ANY_SOURCE` receive); a matched one is not, and completes; a
/// cancel of nothing finds nothing.
fn cancel(c: &mut Ctx) -> Result<(), String> {
    let e = |e: emp::Error| e.to_string();
    let t = tag(8, 1);
    match c.rank() {
        0 => {
            c.sync("cancel-posted")?;
            for (i, len) in [(0u64, 100usize), (1, 200_000)] {
                pattern(800 + i, &mut c.sbuf.as_mut_slice()[..len]);
                let s = c.send(1, t + i, 0, len)?;
                expect_ok(&c.wait(s)?)?;
                c.sync(&format!("cancel-sent{i}"))?;
            }
            Ok(())
        }
        1 => {
            // A wildcard receive, canceled before anything was sent.
            let wild = c.recv(ANY, 0, u64::MAX, 0, 64)?;
            if !c.dev.cancel_recv(wild).map_err(e)? {
                return Err("an unmatched receive was not canceled".into());
            }
            let rc = c.wait(wild)?;
            if rc.status != Status::Canceled {
                return Err(format!("the canceled receive completed {}", rc.status.as_str()));
            }
            if c.dev.cancel_recv(wild).map_err(e)? {
                return Err("a receive was canceled twice".into());
            }
            c.sync("cancel-posted")?;
            // The messages sent after it reach the receives posted after it.
            for (i, len) in [(0u64, 100usize), (1, 200_000)] {
                let r = c.recv(c.eps[0], t + i, 0, 0, len)?;
                let rc = c.wait(r)?;
                expect_ok(&rc).map_err(|s| format!("message {i}: {s}"))?;
                check_pattern(800 + i, &c.rbuf.as_slice()[..len])?;
                // Matched and done: nothing to take back.
                if c.dev.cancel_recv(r).map_err(e)? {
                    return Err("a completed receive was canceled".into());
                }
                c.sync(&format!("cancel-sent{i}"))?;
            }
            Ok(())
        }
        _ => {
            c.sync("cancel-posted")?;
            c.sync("cancel-sent0")?;
            c.sync("cancel-sent1")
        }
    }
}

fn main() {
    let (job, mut dev, eps) = emp_tests::tap_start("tap-match", 2, emp_tests::WithoutRendezvous::Run);
    let quiet = job.rank != 0;
    let sbuf = dev.alloc(2 * BIG + 4096).expect("arena");
    let rbuf = dev.alloc(2 * BIG + 4096).expect("arena");
    let mut c = Ctx::new(dev, job, eps, sbuf, rbuf, T);
    let tests: [emp_tests::TapCase<Ctx>; 8] = [
        ("out-of-order tags, 64 B (eager): tag 2 received first", small),
        ("out-of-order tags, 64 KiB (rendezvous pull)", large_64k),
        ("out-of-order tags, 4 MiB (rendezvous pull)", large_4m),
        ("same-match order across eager and rendezvous, exact and any-source", same_match_order),
        ("rendezvous into a short receive: truncated, send completes", truncated),
        ("probe peeks, probe_claim reserves one message for its claimed receive", probe_and_claim),
        ("immediate data reaches the receive on every path, and probes", immediate_data),
        ("cancel takes back an unmatched receive, never a matched one", cancel),
    ];
    emp_tests::run_tap(quiet, &mut c, &tests, |c, name| {
        let _ = c.sync(name);
    });
}
