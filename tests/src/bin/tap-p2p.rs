//! Point-to-point TAP suite: run as 2 or more ranks (`emp run -n N --
//! tap-p2p`). Rank 0 prints TAP; every rank exits non-zero on a failure.

use std::time::Duration;

use emp::{Status, ANY, MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_tests::{check_pattern, expect_ok, pattern};

const T: Duration = Duration::from_secs(60);

/// The largest message (64 MiB; `EMP_TAP_BIG_MB` lowers it where pinned
/// memory is scarce, e.g. in small VMs).
fn big() -> usize {
    std::env::var("EMP_TAP_BIG_MB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(64) << 20
}

type Ctx = emp_tests::P2pCtx;

fn tag(test: u64, n: u64) -> u64 {
    test << 48 | n
}

fn ping_pong(c: &mut Ctx) -> Result<(), String> {
    let t = tag(1, 0);
    match c.rank() {
        0 => {
            let r = c.recv(c.eps[1], t, 0, 0, 8)?;
            c.sync("pp")?;
            pattern(1, &mut c.sbuf.as_mut_slice()[..8]);
            let s = c.send(1, t, 0, 8)?;
            expect_ok(&c.wait(s)?)?;
            let rc = c.wait(r)?;
            expect_ok(&rc)?;
            if rc.byte_len != 8 || rc.src != c.eps[1] || rc.tag != t {
                return Err(format!("reply {rc:?}"));
            }
            check_pattern(2, &c.rbuf.as_slice()[..8])
        }
        1 => {
            let r = c.recv(c.eps[0], t, 0, 0, 8)?;
            c.sync("pp")?;
            expect_ok(&c.wait(r)?)?;
            check_pattern(1, &c.rbuf.as_slice()[..8])?;
            pattern(2, &mut c.sbuf.as_mut_slice()[..8]);
            let s = c.send(0, t, 0, 8)?;
            expect_ok(&c.wait(s)?)
        }
        _ => c.sync("pp"),
    }
}

fn sizes(c: &mut Ctx) -> Result<(), String> {
    let big = big();
    for (i, &len) in [0usize, 1, 1500, 4096, 65537, 1 << 20, (16 << 20).min(big), big].iter().enumerate() {
        let t = tag(2, i as u64);
        let name = format!("size{i}");
        match c.rank() {
            0 => {
                pattern(100 + i as u64, &mut c.sbuf.as_mut_slice()[..len]);
                c.sync(&name)?;
                let s = c.send(1, t, 0, len)?;
                expect_ok(&c.wait(s)?).map_err(|e| format!("{len} B: {e}"))?;
            }
            1 => {
                let r = c.recv(c.eps[0], t, 0, 0, len)?;
                c.sync(&name)?;
                let rc = c.wait(r)?;
                expect_ok(&rc).map_err(|e| format!("{len} B: {e}"))?;
                if rc.byte_len as usize != len {
                    return Err(format!("{len} B arrived as {}", rc.byte_len));
                }
                check_pattern(100 + i as u64, &c.rbuf.as_slice()[..len])?;
            }
            _ => c.sync(&name)?,
        }
    }
    Ok(())
}

fn wildcard(c: &mut Ctx) -> Result<(), String> {
    let t = tag(3, 0);
    let others = c.job.size - 1;
    if c.rank() == 0 {
        let wrs: Vec<u64> = (0..others).map(|k| c.recv(ANY, t, 0, k * 64, 64)).collect::<Result<_, _>>()?;
        c.sync("wild")?;
        let mut seen = vec![false; c.job.size];
        for (k, wr) in wrs.into_iter().enumerate() {
            let rc = c.wait(wr)?;
            expect_ok(&rc)?;
            let from = c.eps.iter().position(|e| *e == rc.src).ok_or(format!("unknown sender {}", rc.src))?;
            let got = &c.rbuf.as_slice()[k * 64..k * 64 + 8];
            if u64::from_le_bytes(got.try_into().expect("8")) != from as u64 || seen[from] {
                return Err(format!("receive {k}: from rank {from}, payload {got:?}"));
            }
            seen[from] = true;
        }
        Ok(())
    } else {
        let mine = c.rank() as u64;
        c.sbuf.as_mut_slice()[..8].copy_from_slice(&mine.to_le_bytes());
        c.sync("wild")?;
        let s = c.send(0, t, 0, 8)?;
        expect_ok(&c.wait(s)?)
    }
}

fn ignore_mask(c: &mut Ctx) -> Result<(), String> {
    let base = tag(4, 0xAB00);
    match c.rank() {
        0 => {
            let r = c.recv(c.eps[1], base, 0xFF, 0, 16)?;
            c.sync("mask")?;
            let rc = c.wait(r)?;
            expect_ok(&rc)?;
            if rc.tag != base | 0x42 {
                return Err(format!("matched tag {:#x}", rc.tag));
            }
            Ok(())
        }
        1 => {
            c.sync("mask")?;
            let s = c.send(0, base | 0x42, 0, 16)?;
            expect_ok(&c.wait(s)?)
        }
        _ => c.sync("mask"),
    }
}

fn unexpected(c: &mut Ctx) -> Result<(), String> {
    let t = tag(5, 0);
    match c.rank() {
        0 => {
            c.sync("unexp")?;
            // The message arrives before the receive: EMP drops it and the
            // sender retransmits until this receive is posted.
            std::thread::sleep(Duration::from_millis(30));
            let r = c.recv(c.eps[1], t, 0, 0, 3000)?;
            let rc = c.wait(r)?;
            expect_ok(&rc)?;
            check_pattern(5, &c.rbuf.as_slice()[..3000])
        }
        1 => {
            pattern(5, &mut c.sbuf.as_mut_slice()[..3000]);
            c.sync("unexp")?;
            let s = c.send(0, t, 0, 3000)?;
            expect_ok(&c.wait(s)?)
        }
        _ => c.sync("unexp"),
    }
}

fn truncation(c: &mut Ctx) -> Result<(), String> {
    let t = tag(6, 0);
    match c.rank() {
        0 => {
            let r = c.recv(c.eps[1], t, 0, 0, 100)?;
            c.sync("trunc")?;
            let rc = c.wait(r)?;
            if rc.status != Status::Truncated || rc.byte_len != 100 || rc.msg_len != 1000 {
                return Err(format!("got {rc:?}"));
            }
            check_pattern(6, &c.rbuf.as_slice()[..100])
        }
        1 => {
            pattern(6, &mut c.sbuf.as_mut_slice()[..1000]);
            c.sync("trunc")?;
            let s = c.send(0, t, 0, 1000)?;
            expect_ok(&c.wait(s)?)
        }
        _ => c.sync("trunc"),
    }
}

fn ordering(c: &mut Ctx) -> Result<(), String> {
    let t = tag(7, 0);
    const N: usize = 50;
    match c.rank() {
        0 => {
            let wrs: Vec<u64> = (0..N).map(|k| c.recv(c.eps[1], t, 0, k * 8, 8)).collect::<Result<_, _>>()?;
            c.sync("order")?;
            for (k, wr) in wrs.into_iter().enumerate() {
                expect_ok(&c.wait(wr)?)?;
                let v = u64::from_le_bytes(c.rbuf.as_slice()[k * 8..k * 8 + 8].try_into().expect("8"));
                if v != k as u64 {
                    return Err(format!("receive {k} got message {v}"));
                }
            }
            Ok(())
        }
        1 => {
            for k in 0..N {
                c.sbuf.as_mut_slice()[k * 8..k * 8 + 8].copy_from_slice(&(k as u64).to_le_bytes());
            }
            c.sync("order")?;
            let wrs: Vec<u64> = (0..N).map(|k| c.send(0, t, k * 8, 8)).collect::<Result<_, _>>()?;
            for wr in wrs {
                expect_ok(&c.wait(wr)?)?;
            }
            Ok(())
        }
        _ => c.sync("order"),
    }
}

fn scatter_gather(c: &mut Ctx) -> Result<(), String> {
    let t = tag(8, 0);
    match c.rank() {
        0 => {
            let wr = c.wr();
            let sges = [c.rbuf.sge(1000, 3000), c.rbuf.sge(10_000, 7000)];
            c.dev.post_recv(wr, c.eps[1], t, 0, &sges).map_err(|e| e.to_string())?;
            c.sync("sg")?;
            expect_ok(&c.wait(wr)?)?;
            let mut got = c.rbuf.as_slice()[1000..4000].to_vec();
            got.extend_from_slice(&c.rbuf.as_slice()[10_000..17_000]);
            check_pattern(8, &got)
        }
        1 => {
            let mut whole = vec![0u8; 10_000];
            pattern(8, &mut whole);
            let s = c.sbuf.as_mut_slice();
            s[0..2000].copy_from_slice(&whole[0..2000]);
            s[50_000..55_000].copy_from_slice(&whole[2000..7000]);
            s[90_000..93_000].copy_from_slice(&whole[7000..10_000]);
            c.sync("sg")?;
            let wr = c.wr();
            let sges = [c.sbuf.sge(0, 2000), c.sbuf.sge(50_000, 5000), c.sbuf.sge(90_000, 3000)];
            c.dev.post_send(wr, c.eps[0], t, &sges).map_err(|e| e.to_string())?;
            expect_ok(&c.wait(wr)?)
        }
        _ => c.sync("sg"),
    }
}

fn process_memory(c: &mut Ctx) -> Result<(), String> {
    let t = tag(9, 0);
    let mut mine = vec![0u8; 200_000];
    match c.rank() {
        0 | 1 => {
            // SAFETY: `mine` outlives the registration (deregistered below)
            // and is only read after the operation completed.
            let mr = unsafe { c.dev.reg_mr(mine.as_ptr(), mine.len(), MR_LOCAL_READ | MR_LOCAL_WRITE) }
                .map_err(|e| e.to_string())?;
            let wr = c.wr();
            if c.rank() == 0 {
                c.dev.post_recv(wr, c.eps[1], t, 0, &[mr.sge(mr.addr, mine.len())]).map_err(|e| e.to_string())?;
                c.sync("vm")?;
                expect_ok(&c.wait(wr)?)?;
            } else {
                pattern(9, &mut mine);
                c.sync("vm")?;
                c.dev.post_send(wr, c.eps[0], t, &[mr.sge(mr.addr, mine.len())]).map_err(|e| e.to_string())?;
                expect_ok(&c.wait(wr)?)?;
            }
            c.dev.dereg_mr(mr).map_err(|e| e.to_string())?;
            if c.rank() == 0 {
                check_pattern(9, &mine)
            } else {
                Ok(())
            }
        }
        _ => c.sync("vm"),
    }
}

fn bad_input(c: &mut Ctx) -> Result<(), String> {
    if c.rank() == 0 {
        let wr = c.wr();
        let mut s = c.sbuf.sge(0, 10);
        s.key ^= 0x0004_0000;
        c.dev.post_send(wr, c.eps[1], tag(10, 0), &[s]).map_err(|e| e.to_string())?;
        let rc = c.wait(wr)?;
        if rc.status != Status::BadKey {
            return Err(format!("bad key gave {}", rc.status.as_str()));
        }
        let wr = c.wr();
        let d = emp_uapi::desc::WorkDesc { wr_id: wr, opcode: 0x77, num_sge: 9, ..Default::default() };
        c.dev.post_raw(true, &d).map_err(|e| e.to_string())?;
        let rc = c.wait(wr)?;
        if rc.status != Status::BadDescriptor {
            return Err(format!("garbage descriptor gave {}", rc.status.as_str()));
        }
    }
    // The port still works afterwards.
    ping_pong(c)
}

fn main() {
    let (job, mut dev, eps) = emp_tests::tap_start("tap-p2p", 2, emp_tests::WithoutRendezvous::Run);
    let quiet = job.rank != 0;
    let sbuf = dev.alloc(big() + 4096).expect("arena");
    let rbuf = dev.alloc(big() + 4096).expect("arena");
    let mut c = Ctx::new(dev, job, eps, sbuf, rbuf, T);
    let tests: [emp_tests::TapCase<Ctx>; 10] = [
        ("tagged ping-pong, 8 B", ping_pong),
        ("messages of 0 B to 64 MiB (EMP_TAP_BIG_MB) arrive intact", sizes),
        ("any-source receives get one message from every rank", wildcard),
        ("tag ignore mask matches", ignore_mask),
        ("unexpected message delivered after a late receive", unexpected),
        ("short buffer: truncated, prefix intact", truncation),
        ("50 messages matched in order", ordering),
        ("scatter/gather on both sides", scatter_gather),
        ("process memory registered by address", process_memory),
        ("bad key and garbage descriptor refused; port still works", bad_input),
    ];
    emp_tests::run_tap(quiet, &mut c, &tests, |c, name| {
        let _ = c.sync(name);
    });
}
