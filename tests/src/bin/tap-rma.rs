//! Remote write and read TAP suite: run as 2 or more ranks (`emp run -n N
//! -- tap-rma`; remote keys are exchanged through the rendezvous
//! directory). Rank 0 prints TAP; every rank exits non-zero on a failure.

use std::time::Duration;

use emp::rdv::Job;
use emp::{Buffer, Device, Endpoint, Opcode, RemoteAddr, RemoteKey, Status, MR_REMOTE_READ, MR_REMOTE_WRITE};
use emp_tests::wait_for;

const T: Duration = Duration::from_secs(120);
/// Bytes of every rank's window; each writer owns a slice of `SLICE` bytes.
const WINDOW: usize = 1 << 20;
const SLICE: usize = 8192;
/// Where the large transfer lands in rank 1's window (after the slices).
const LARGE_AT: usize = 256 << 10;
const LARGE: usize = 700 << 10;

struct Ctx {
    dev: Device,
    job: Job,
    eps: Vec<Endpoint>,
    /// This rank's window: remote write and read allowed.
    window: Buffer,
    /// Every rank's window key, and its read-only region's key.
    keys: Vec<(RemoteKey, RemoteKey)>,
    /// Local buffers.
    local: Buffer,
}

impl Ctx {
    fn rank(&self) -> usize {
        self.job.rank
    }
    fn sync(&mut self, name: &str) -> Result<(), String> {
        self.job.barrier(&mut self.dev, name).map_err(|e| e.to_string())
    }
    fn at(&self, rank: usize, off: usize) -> RemoteAddr {
        RemoteAddr { key: self.keys[rank].0, offset: off as u64 }
    }
}

fn pattern(a: usize, b: usize, i: usize) -> u8 {
    ((a * 131 + b * 17 + i * 7) % 251) as u8
}

fn ok(c: &mut Ctx, wr: u64, op: Opcode) -> Result<emp::Completion, String> {
    let wc = wait_for(&mut c.dev, wr, T)?;
    if wc.status != Status::Success || wc.opcode != op {
        return Err(format!("wr {wr}: {} ({:?})", wc.status.as_str(), wc.opcode));
    }
    Ok(wc)
}

/// Every rank writes its slice of every other rank's window, then reads
/// it back; every window holds exactly what was written.
fn all_to_all(c: &mut Ctx) -> Result<(), String> {
    let (me, n) = (c.rank(), c.eps.len());
    for t in (0..n).filter(|&t| t != me) {
        let src = &mut c.local.as_mut_slice()[..SLICE];
        for (i, b) in src.iter_mut().enumerate() {
            *b = pattern(me, t, i);
        }
        let (sge, at) = (c.local.sge(0, SLICE), c.at(t, me * SLICE));
        c.dev.post_write(t as u64, c.eps[t], &[sge], at).map_err(|e| e.to_string())?;
        let wc = ok(c, t as u64, Opcode::RdmaWrite)?;
        if wc.byte_len as usize != SLICE {
            return Err(format!("write to {t}: byte_len {}", wc.byte_len));
        }
    }
    c.sync("written")?;
    for s in (0..n).filter(|&s| s != me) {
        let got = &c.window.as_slice()[s * SLICE..(s + 1) * SLICE];
        if let Some(i) = (0..SLICE).find(|&i| got[i] != pattern(s, me, i)) {
            return Err(format!("rank {s}'s slice of my window: byte {i} wrong"));
        }
    }
    for t in (0..n).filter(|&t| t != me) {
        let (sge, at) = (c.local.sge(SLICE, SLICE), c.at(t, me * SLICE));
        c.dev.post_read(100 + t as u64, c.eps[t], &[sge], at).map_err(|e| e.to_string())?;
        ok(c, 100 + t as u64, Opcode::RdmaRead)?;
        let got = &c.local.as_slice()[SLICE..2 * SLICE];
        if let Some(i) = (0..SLICE).find(|&i| got[i] != pattern(me, t, i)) {
            return Err(format!("read back from {t}: byte {i} wrong"));
        }
    }
    Ok(())
}

/// A write with immediate data completes one receive at the target.
fn immediate(c: &mut Ctx) -> Result<(), String> {
    let (me, n) = (c.rank(), c.eps.len());
    let (to, from) = ((me + 1) % n, (me + n - 1) % n);
    let tag = 0x1_0000 + from as u64;
    c.dev.post_recv(7, c.eps[from], tag, 0, &[]).map_err(|e| e.to_string())?;
    c.sync("imm-posted")?;
    c.local.as_mut_slice()[..5].copy_from_slice(b"hello");
    let (sge, at) = (c.local.sge(0, 5), c.at(to, WINDOW - 5));
    c.dev.post_write_imm(8, c.eps[to], &[sge], at, 0x1_0000 + me as u64).map_err(|e| e.to_string())?;
    ok(c, 8, Opcode::RdmaWrite)?;
    let wc = wait_for(&mut c.dev, 7, T)?;
    let got = (wc.status, wc.opcode, wc.is_recv, wc.tag, wc.msg_len, wc.src);
    let want = (Status::Success, Opcode::RecvRdmaImm, true, tag, 5, c.eps[from]);
    if got != want {
        return Err(format!("immediate receive: {got:?}, expected {want:?}"));
    }
    if &c.window.as_slice()[WINDOW - 5..] != b"hello" {
        return Err("the data is not in the window when the receive completes".into());
    }
    Ok(())
}

/// Rank 0 writes 700 KiB (hundreds of frames, many windows) to rank 1 and
/// reads it back.
fn large(c: &mut Ctx) -> Result<(), String> {
    if c.rank() == 0 {
        for (i, b) in c.local.as_mut_slice()[..LARGE].iter_mut().enumerate() {
            *b = pattern(i / 1000, 3, i);
        }
        let (sge, at) = (c.local.sge(0, LARGE), c.at(1, LARGE_AT));
        c.dev.post_write(20, c.eps[1], &[sge], at).map_err(|e| e.to_string())?;
        ok(c, 20, Opcode::RdmaWrite)?;
        // Back into two pieces of local memory: a scatter list.
        let half = LARGE / 2;
        let sges = [c.local.sge(LARGE, half), c.local.sge(LARGE + half, LARGE - half)];
        c.dev.post_read(21, c.eps[1], &sges, c.at(1, LARGE_AT)).map_err(|e| e.to_string())?;
        ok(c, 21, Opcode::RdmaRead)?;
        let (a, b) = c.local.as_slice()[..2 * LARGE].split_at(LARGE);
        if a != b {
            return Err("the read-back differs from what was written".into());
        }
    }
    Ok(())
}

/// Refusals: a foreign key, a wrong secret, a key without the right, an
/// out-of-range offset — each an error completion at the initiator, the
/// target's memory unchanged and the refusal counted in its port.
fn refusals(c: &mut Ctx) -> Result<(), String> {
    let me = c.rank();
    c.window.as_mut_slice()[..SLICE].fill(0xEE);
    c.window.as_mut_slice()[WINDOW - 64..].fill(0xDD);
    let (before, _) = c.dev.remote_refusals();
    c.sync("marked")?;
    if me == 1 {
        let (rw, ro) = c.keys[0];
        let mine = c.keys[1].0;
        c.local.as_mut_slice()[..64].fill(1);
        let cases: [(RemoteAddr, bool, &str); 7] = [
            (RemoteAddr { key: RemoteKey { key: rw.key ^ 0x0100_0000, ..rw }, offset: 0 }, true, "unknown key"),
            (RemoteAddr { key: mine, offset: 0 }, true, "another rank's key"),
            (RemoteAddr { key: RemoteKey { secret: rw.secret ^ 1, ..rw }, offset: 0 }, true, "wrong secret"),
            (RemoteAddr { key: ro, offset: 0 }, true, "no remote-write right"),
            (RemoteAddr { key: rw, offset: (WINDOW - 32) as u64 }, true, "beyond the window"),
            (RemoteAddr { key: RemoteKey { secret: rw.secret ^ 1, ..rw }, offset: 0 }, false, "read, wrong secret"),
            (RemoteAddr { key: rw, offset: (WINDOW - 32) as u64 }, false, "read beyond the window"),
        ];
        for (i, (at, write, why)) in cases.into_iter().enumerate() {
            let wr = 30 + i as u64;
            let sge = c.local.sge(0, 64);
            let r = if write {
                c.dev.post_write(wr, c.eps[0], &[sge], at)
            } else {
                c.dev.post_read(wr, c.eps[0], &[c.local.sge(64, 64)], at)
            };
            r.map_err(|e| e.to_string())?;
            let wc = wait_for(&mut c.dev, wr, T)?;
            if wc.status != Status::RemoteAccessError {
                return Err(format!("{why}: {}", wc.status.as_str()));
            }
        }
        // A read with the read-only key is allowed.
        c.dev
            .post_read(40, c.eps[0], &[c.local.sge(64, 64)], RemoteAddr { key: ro, offset: 0 })
            .map_err(|e| e.to_string())?;
        ok(c, 40, Opcode::RdmaRead)?;
    }
    c.sync("refused")?;
    if me == 0 {
        let w = c.window.as_slice();
        if w[..SLICE].iter().any(|&b| b != 0xEE) || w[WINDOW - 64..].iter().any(|&b| b != 0xDD) {
            return Err("a refused write changed the target's memory".into());
        }
        let (after, throttled) = c.dev.remote_refusals();
        if after.wrapping_sub(before) < 7 || throttled != 0 {
            return Err(format!("port counters: {} refusals ({throttled} throttled), expected 7", after - before));
        }
    }
    Ok(())
}

/// Guesses at rank 0's window secret (its key known: the worst case).
const GUESSES: u32 = 1000;

/// A key guesser: rank 1 tries `GUESSES` secrets with rank 0's key; none
/// reaches the window, rank 0's port counts every refusal, and most of
/// them as throttled (the guesser's node is cut off after 16 in a second).
fn guesser(c: &mut Ctx) -> Result<(), String> {
    let me = c.rank();
    c.window.as_mut_slice()[..64].fill(0xC3);
    let (before, throttled_before) = c.dev.remote_refusals();
    c.sync("guess-ready")?;
    if me == 1 {
        let rw = c.keys[0].0;
        let mut x = 0x2545_F491_4F6C_DD1Du64 ^ rw.secret as u64;
        let start = std::time::Instant::now();
        let mut hits = 0;
        for i in 0..GUESSES {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let guess = if x as u32 == rw.secret { !rw.secret } else { x as u32 };
            let at = RemoteAddr { key: RemoteKey { secret: guess, ..rw }, offset: 0 };
            c.dev.post_write(1000 + i as u64, c.eps[0], &[c.local.sge(0, 8)], at).map_err(|e| e.to_string())?;
            let wc = wait_for(&mut c.dev, 1000 + i as u64, T)?;
            hits += (wc.status == Status::Success) as u32;
        }
        let secs = start.elapsed().as_secs_f64();
        println!("# {GUESSES} guesses in {secs:.3} s ({:.0}/s), {hits} reached the window", GUESSES as f64 / secs);
        if hits != 0 {
            return Err(format!("{hits} guesses reached the window"));
        }
    }
    c.sync("guessed")?;
    if me == 0 {
        if c.window.as_slice()[..64].iter().any(|&b| b != 0xC3) {
            return Err("a guess changed the window".into());
        }
        let (after, throttled) = c.dev.remote_refusals();
        let (refused, throttled) = (after.wrapping_sub(before), throttled.wrapping_sub(throttled_before));
        println!("# rank 0's port: {refused} refused, {throttled} of them throttled");
        if refused < GUESSES || throttled < GUESSES / 2 {
            return Err(format!("port counters: {refused} refused, {throttled} throttled"));
        }
    }
    Ok(())
}

fn main() {
    let (job, mut dev, eps) = emp_tests::tap_start("tap-rma", 2, emp_tests::WithoutRendezvous::Refuse);
    let quiet = job.rank != 0;
    let window = dev.alloc_mr(WINDOW, MR_REMOTE_WRITE | MR_REMOTE_READ).expect("window");
    let read_only = dev.alloc_mr(4096, MR_REMOTE_READ).expect("read-only region");
    let mine = format!("{} {}", window.remote_key().as_u64(), read_only.remote_key().as_u64());
    let keys = job
        .exchange("rma-keys", &mine, T)
        .expect("key exchange")
        .iter()
        .map(|k| {
            let mut w = k.split_whitespace().map(|v| RemoteKey::from_u64(v.parse().expect("key")));
            (w.next().expect("window key"), w.next().expect("read-only key"))
        })
        .collect();
    let local = dev.alloc(2 * LARGE).expect("arena");
    let mut c = Ctx { dev, job, eps, window, keys, local };
    type Check = fn(&mut Ctx) -> Result<(), String>;
    let tests: [(&str, Check); 5] = [
        ("every rank writes and reads back a slice of every other rank's window", all_to_all),
        ("a write with immediate data completes one receive at the target", immediate),
        ("700 KiB written and read back into a scatter list, exact", large),
        ("foreign key, wrong secret, no right, out of range: refused, memory unchanged, counted", refusals),
        ("a key guesser reaches nothing and is throttled (last: it stays cut off a while)", guesser),
    ];
    emp_tests::run_tap(quiet, &mut c, &tests, |c, name| {
        let _ = c.sync(name);
    });
}
