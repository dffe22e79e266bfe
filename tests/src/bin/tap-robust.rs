//! Robustness TAP programs (`tap-robust <mode>`):
//! - `garbage` (>= 3 ranks): rank 0 floods its rings with random
//!   descriptors while the other ranks exchange messages; they must not
//!   notice. Rank 1 prints TAP.
//! - `victim` (2 ranks, started directly): rank 1 dies mid-way through a
//!   64 MiB receive; rank 0's send must end with an error completion and
//!   the NIC must reclaim rank 1's port and memory. Rank 0 prints TAP.
//! - `orphan` (1 rank): waits on a receive; when the daemon is killed the
//!   wait must fail promptly, not hang.

use std::time::{Duration, Instant};

use emp::rdv::Job;
use emp::{Completion, Device, Status};
use emp_tests::{check_pattern, expect_ok, pattern, wait_for, Tap};
use emp_uapi::desc::WorkDesc;
use emp_uapi::Le;

fn garbage(job: &Job, dev: &mut Device) -> i32 {
    let eps = job.endpoints(dev.endpoint()).expect("endpoints");
    let mut tap = Tap::new(2, job.rank != 1);
    if job.rank == 0 {
        let mut x: u64 = 0x1234_5678;
        let mut bytes = [0u8; WorkDesc::SIZE];
        let mut wc = [Completion::default(); 64];
        job.sync("go").expect("sync");
        let end = Instant::now() + Duration::from_secs(3);
        let mut posted = 0;
        while Instant::now() < end {
            for b in bytes.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let d = WorkDesc::get(&bytes);
            if dev.post_raw(x & 1 == 0, &d).is_ok() {
                posted += 1;
            }
            dev.poll_cq(&mut wc);
        }
        let bad = dev.nic_counters().map(|c| c[emp_uapi::sram::counter::BAD_DESCRIPTORS]).unwrap_or(0);
        eprintln!("tap-robust: rank 0 posted {posted} garbage descriptors; its NIC refused {bad}");
        job.exchange("bad", &bad.to_string(), Duration::from_secs(60)).expect("exchange");
        return 0;
    }
    let peer = if job.rank == 1 { 2 } else { 1 };
    let mut buf = dev.alloc(1 << 20).expect("arena");
    let rbuf = dev.alloc(1 << 20).expect("arena");
    job.sync("go").expect("sync");
    let mut run = || -> Result<(), String> {
        if job.rank > 2 {
            return Ok(());
        }
        for i in 0..300u64 {
            let len = (i as usize * 7919) % 65536;
            if job.rank == 1 {
                pattern(i, &mut buf.as_mut_slice()[..len]);
                let rw = 2 * i + 1;
                dev.post_recv(rw, eps[peer], i, 0, &[rbuf.sge(0, len)]).map_err(|e| e.to_string())?;
                dev.post_send(2 * i, eps[peer], i, &[buf.sge(0, len)]).map_err(|e| e.to_string())?;
                expect_ok(&wait_for(dev, 2 * i, Duration::from_secs(30))?)?;
                expect_ok(&wait_for(dev, rw, Duration::from_secs(30))?)?;
                check_pattern(i + 1000, &rbuf.as_slice()[..len])?;
            } else {
                dev.post_recv(2 * i + 1, eps[peer], i, 0, &[rbuf.sge(0, len)]).map_err(|e| e.to_string())?;
                expect_ok(&wait_for(dev, 2 * i + 1, Duration::from_secs(30))?)?;
                check_pattern(i, &rbuf.as_slice()[..len])?;
                pattern(i + 1000, &mut buf.as_mut_slice()[..len]);
                dev.post_send(2 * i, eps[peer], i, &[buf.sge(0, len)]).map_err(|e| e.to_string())?;
                expect_ok(&wait_for(dev, 2 * i, Duration::from_secs(30))?)?;
            }
        }
        Ok(())
    };
    tap.check("300 exchanges intact while another port posts garbage", run());
    let bad = job.exchange("bad", "", Duration::from_secs(60)).map(|v| v[0].trim().parse::<u64>().unwrap_or(0));
    tap.check(
        "rank 0's NIC refused its garbage descriptors",
        match bad {
            Ok(n) if n > 0 => Ok(()),
            Ok(_) => Err("no bad descriptor counted".into()),
            Err(e) => Err(e.to_string()),
        },
    );
    tap.finish()
}

fn victim(job: &Job, dev: &mut Device) -> i32 {
    const LEN: usize = 64 << 20;
    let eps = job.endpoints(dev.endpoint()).expect("endpoints");
    let buf = dev.alloc(LEN).expect("arena");
    if job.rank == 1 {
        dev.post_recv(1, eps[0], 5, 0, &[buf.sge(0, LEN)]).expect("post");
        job.sync("ready").expect("sync");
        std::thread::sleep(Duration::from_millis(3));
        // Die mid-transfer, holding registered memory and a posted receive.
        std::process::abort();
    }
    let mut tap = Tap::new(3, false);
    let nic1 = std::env::var("EMP_PEER_DEVICE").expect("EMP_PEER_DEVICE");
    job.sync("ready").expect("sync");
    dev.post_send(1, eps[1], 5, &[buf.sge(0, LEN)]).expect("post");
    let r = wait_for(dev, 1, Duration::from_secs(60));
    tap.check(
        "sender gets an error completion when the receiver dies",
        match r {
            Ok(c) if c.status == Status::RemotePortClosed => Ok(()),
            Ok(c) => Err(format!("completed with {}", c.status.as_str())),
            Err(e) => Err(e),
        },
    );
    let end = Instant::now() + Duration::from_secs(10);
    let mut last = (u64::MAX, u64::MAX);
    while Instant::now() < end {
        if let Ok(s) = emp::nic_stats(&nic1) {
            last = (s.arg[18], s.arg[21]);
            if last == (0, 0) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    tap.check(
        "the NIC reclaimed the dead process's port",
        if last.0 == 0 { Ok(()) } else { Err(format!("{} ports in use", last.0)) },
    );
    tap.check(
        "the NIC released its memory registrations",
        if last.1 == 0 { Ok(()) } else { Err(format!("{} regions held", last.1)) },
    );
    tap.finish()
}

fn orphan(dev: &mut Device) -> i32 {
    let buf = dev.alloc(64).expect("arena");
    dev.post_recv(1, emp::ANY, 1, 0, &[buf.sge(0, 64)]).expect("post");
    println!("waiting");
    let mut wc = [Completion::default(); 4];
    let t = Instant::now();
    let r = dev.wait_cq(&mut wc, Some(Duration::from_secs(30)));
    let mut tap = Tap::new(1, false);
    tap.check(
        "a client sees an error, not a hang, when the daemon goes away",
        match r {
            Err(emp::Error::Protocol(_)) if t.elapsed() < Duration::from_secs(10) => Ok(()),
            other => Err(format!("after {:?}: {other:?}", t.elapsed())),
        },
    );
    tap.finish()
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let mut dev = Device::open().unwrap_or_else(|e| {
        eprintln!("tap-robust: {e}");
        std::process::exit(2)
    });
    let code = match mode.as_str() {
        "orphan" => orphan(&mut dev),
        "garbage" | "victim" => {
            let job = Job::from_env().unwrap_or_else(|e| {
                eprintln!("tap-robust: {e}");
                std::process::exit(2)
            });
            if mode == "garbage" {
                garbage(&job, &mut dev)
            } else {
                victim(&job, &mut dev)
            }
        }
        _ => {
            eprintln!("usage: tap-robust garbage|victim|orphan");
            2
        }
    };
    std::process::exit(code);
}
