//! `emp bench ctxsw`: PM's Table 2 (seed 003 §4) on the chassis, in
//! microseconds — the wall time of a port's save (C6) and restore (C7)
//! against what its buffers hold: nothing; its send ring full of sends
//! posted while it was suspended; its NIC's eager pool full of messages
//! that arrived with no receive posted; both. Rank 0's port is switched,
//! rank 1 fills its receive buffer and takes its sends. Each condition is
//! switched `--iters` times (default 20), and every switch is checked:
//! after the resume every held message is received intact and every
//! queued send completes at rank 1. The times are what a process waits
//! for `Device::save` / `Device::restore`: its request to the NIC's
//! daemon, the control program's work, and the reply. The simulator's
//! NIC-time figures of the same table are `emp-sim pm`.

use std::time::{Duration, Instant};

use emp::rdv::Job;
use emp::{Device, Endpoint};

use super::{err, print_json, say, BenchArgs, Json, Waiter};

const T: Duration = Duration::from_secs(60);
/// Bytes of each message: PM's Table 2 filled its buffers with small ones.
const SMALL: usize = 8;
/// Room for the context image.
const IMAGE_ROOM: usize = 4 << 20;
/// Tag bit of the held messages (the queued sends use none).
const HELD: u64 = 1 << 40;

/// One row of Table 2, with PM's save and restore times (ms).
struct Condition {
    what: &'static str,
    sends: bool,
    recvs: bool,
    pm_ms: (f64, f64),
}

const TABLE2: [Condition; 4] = [
    Condition { what: "no message", sends: false, recvs: false, pm_ms: (0.13, 0.11) },
    Condition { what: "send buffer full", sends: true, recvs: false, pm_ms: (1.88, 1.40) },
    Condition { what: "receive buffer full", sends: false, recvs: true, pm_ms: (3.39, 1.95) },
    Condition { what: "send and receive full", sends: true, recvs: true, pm_ms: (5.15, 3.22) },
];

/// What one condition measured.
struct Row {
    what: &'static str,
    sends: usize,
    recvs: usize,
    image_bytes: u64,
    /// Save, then restore: (median, min) µs over the switches.
    save_us: (f64, f64),
    restore_us: (f64, f64),
    pm_ms: (f64, f64),
}

/// (median, min) of `v` (not empty).
fn median_min(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0])
}

/// One rank of `emp bench ctxsw`.
pub(super) fn rank(a: &BenchArgs, job: &Job, mut dev: Device, eps: &[Endpoint]) -> Result<(), String> {
    let switches = a.iters.unwrap_or(20).max(1);
    let info = *dev.info();
    // A full send ring: every slot but one (ring indices tell full from empty).
    let send_full = info.send_entries as usize - 1;
    // A full receive buffer: the eager pool's 64 slots (the NIC's default;
    // `--window` names another count).
    let recv_full = a.window.unwrap_or(64);
    if !(1..=4096).contains(&recv_full) {
        return Err(format!("--window {recv_full}: 1 to 4096 messages held"));
    }
    let peer = eps[job.rank ^ 1];
    let mut data = dev.alloc((send_full.max(recv_full) + 1) * SMALL).map_err(err)?;
    let image = dev.alloc(IMAGE_ROOM).map_err(err)?;
    let waiter = Waiter::blocking(true, T);
    let mut rows = Vec::new();
    for (ci, cond) in TABLE2.iter().enumerate() {
        let (sends, recvs) = (if cond.sends { send_full } else { 0 }, if cond.recvs { recv_full } else { 0 });
        let (mut save, mut restore, mut image_bytes) = (Vec::new(), Vec::new(), 0);
        for sw in 0..switches {
            let step = |s: &str| format!("ctxsw{ci}-{sw}-{s}");
            let tag = |i: usize| ((ci * switches + sw) as u64) << 20 | i as u64;
            if job.rank == 1 {
                // The receive buffer: messages rank 0 posted nothing for.
                for i in 0..recvs {
                    dev.post_send(i as u64, peer, HELD | tag(i), &[data.sge(i * SMALL, SMALL)]).map_err(err)?;
                }
                for i in 0..recvs {
                    waiter.ok(&mut dev, i as u64, "a held message's send")?;
                }
                job.barrier(&mut dev, &step("filled")).map_err(err)?;
                // The sends rank 0 queued while suspended arrive after its resume.
                for i in 0..sends {
                    dev.post_recv(i as u64, peer, tag(i), 0, &[data.sge(i * SMALL, SMALL)]).map_err(err)?;
                }
                job.barrier(&mut dev, &step("posted")).map_err(err)?;
                for i in 0..sends {
                    waiter.ok(&mut dev, i as u64, "a queued send's receive")?;
                    check(data.as_slice(), i, tag(i)).map_err(|e| format!("a queued send: {e}"))?;
                }
                job.barrier(&mut dev, &step("done")).map_err(err)?;
                continue;
            }
            job.barrier(&mut dev, &step("filled")).map_err(err)?;
            dev.suspend().map_err(err)?;
            let end = Instant::now() + T;
            while !dev.is_stable().map_err(err)? {
                if Instant::now() > end {
                    return Err(format!("{}: the port never became stable", cond.what));
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            // The send buffer: sends posted to a suspended port stay in its ring.
            for i in 0..sends {
                fill(data.as_mut_slice(), i, tag(i));
                dev.post_send(i as u64, peer, tag(i), &[data.sge(i * SMALL, SMALL)]).map_err(err)?;
            }
            let t = Instant::now();
            image_bytes = dev.save(&image).map_err(|e| format!("{}: save: {e}", cond.what))?;
            save.push(t.elapsed().as_secs_f64() * 1e6);
            let t = Instant::now();
            dev.restore(&image, image_bytes).map_err(|e| format!("{}: restore: {e}", cond.what))?;
            restore.push(t.elapsed().as_secs_f64() * 1e6);
            dev.resume().map_err(err)?;
            job.barrier(&mut dev, &step("posted")).map_err(err)?;
            for i in 0..sends {
                waiter.ok(&mut dev, i as u64, "a queued send")?;
            }
            // What the NIC held came through the switch: each message once, intact.
            for i in 0..recvs {
                let wr = 1_000_000 + i as u64;
                dev.post_recv(wr, peer, HELD | tag(i), 0, &[data.sge(i * SMALL, SMALL)]).map_err(err)?;
                let c = waiter.ok(&mut dev, wr, "a held message")?;
                if c.byte_len as usize != SMALL {
                    return Err(format!("held message {i}: {} bytes", c.byte_len));
                }
            }
            job.barrier(&mut dev, &step("done")).map_err(err)?;
        }
        if job.rank == 0 {
            let (save_us, restore_us) = (median_min(&mut save), median_min(&mut restore));
            rows.push(Row { what: cond.what, sends, recvs, image_bytes, save_us, restore_us, pm_ms: cond.pm_ms });
        }
    }
    if job.rank == 0 {
        report(a, switches, &rows);
    }
    Ok(())
}

/// Message `i`'s bytes: its tag, little-endian.
fn fill(buf: &mut [u8], i: usize, tag: u64) {
    buf[i * SMALL..(i + 1) * SMALL].copy_from_slice(&tag.to_le_bytes());
}

fn check(buf: &[u8], i: usize, tag: u64) -> Result<(), String> {
    let got = u64::from_le_bytes(buf[i * SMALL..(i + 1) * SMALL].try_into().expect("8 bytes"));
    (got == tag).then_some(()).ok_or(format!("message {i}: {got:#x}, want {tag:#x}"))
}

fn report(a: &BenchArgs, switches: usize, rows: &[Row]) {
    if a.json {
        let rows = rows
            .iter()
            .map(|r| {
                Json::Obj(vec![
                    ("condition", Json::str(r.what)),
                    ("sends", Json::Int(r.sends as u64)),
                    ("recvs", Json::Int(r.recvs as u64)),
                    ("image_bytes", Json::Int(r.image_bytes)),
                    ("save_us", Json::Num(r.save_us.0, 1)),
                    ("save_us_min", Json::Num(r.save_us.1, 1)),
                    ("restore_us", Json::Num(r.restore_us.0, 1)),
                    ("restore_us_min", Json::Num(r.restore_us.1, 1)),
                    ("pm_save_us", Json::Num(r.pm_ms.0 * 1e3, 0)),
                    ("pm_restore_us", Json::Num(r.pm_ms.1 * 1e3, 0)),
                ])
            })
            .collect();
        let doc = Json::Obj(vec![
            ("benchmark", Json::str("Ctxsw")),
            ("unit", Json::str("us")),
            ("switches", Json::Int(switches as u64)),
            ("rows", Json::Arr(rows)),
        ]);
        return print_json(&doc);
    }
    say(
        a,
        format!(
            "# PM Table 2 on the chassis: save (C6) and restore (C7) wall time, median (min) of {switches} switches"
        ),
    );
    say(
        a,
        "# sends: queued in the suspended port's send ring; recvs: held in its NIC's eager pool; PM's figures beside",
    );
    say(
        a,
        format!(
            "# {:<22} {:>6} {:>6} {:>10} {:>18} {:>18} {:>10} {:>10}",
            "condition", "sends", "recvs", "image B", "save µs", "restore µs", "PM save", "PM restore"
        ),
    );
    for r in rows {
        say(
            a,
            format!(
                "{:<24} {:>6} {:>6} {:>10} {:>9.1} ({:>6.1}) {:>9.1} ({:>6.1}) {:>8.0}µs {:>8.0}µs",
                r.what,
                r.sends,
                r.recvs,
                r.image_bytes,
                r.save_us.0,
                r.save_us.1,
                r.restore_us.0,
                r.restore_us.1,
                r.pm_ms.0 * 1e3,
                r.pm_ms.1 * 1e3
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_carries_its_tag_and_a_wrong_one_is_caught() {
        let mut b = vec![0u8; 4 * SMALL];
        fill(&mut b, 2, 0xABCD);
        assert!(check(&b, 2, 0xABCD).is_ok());
        assert!(check(&b, 2, 0xABCE).is_err());
        assert!(check(&b, 1, 0xABCD).is_err());
        assert_eq!(median_min(&mut [3.0, 1.0, 2.0]), (2.0, 1.0));
    }
}
