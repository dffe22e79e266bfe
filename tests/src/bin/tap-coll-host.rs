//! Host-based collectives TAP suite (`emp::coll::Comm`): run as 1 or more
//! ranks (`emp run -n N -- tap-coll-host`). Every rank computes every
//! rank's deterministic inputs, so results are checked against the
//! reference reduction locally; barrier timing is checked on the machine's
//! monotonic clock, exchanged through the rendezvous directory (ranks on
//! one host). Rank 0 prints TAP; a test is `ok` only if it passed on every
//! rank, and every rank exits non-zero on a failure.

use std::time::Duration;

use emp::coll::{reduce_ref, Comm, CommOpts, Dtype, ReduceOp, Wait};
use emp::rdv::Job;
use emp::tree::Tree;
use emp::{Buffer, Completion, Device, Endpoint};
use emp_tests::{check_pattern, pattern, Tap};
use emp_uapi::coll::abs_rank;

/// Per-call limit inside the tests: a hang becomes a failure quickly.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

struct Ctx {
    dev: Device,
    job: Job,
    eps: Vec<Endpoint>,
    /// Broadcast buffer (registered), 1 MiB.
    buf: Buffer,
    /// Next communicator context: every test gets fresh tags.
    context: u8,
}

impl Ctx {
    fn rank(&self) -> usize {
        self.job.rank
    }
    fn n(&self) -> usize {
        self.job.size
    }
    fn comm_with(&mut self, wait: Wait, segment_bytes: usize) -> Result<Comm, String> {
        self.context = self.context.wrapping_add(1);
        let opts = CommOpts { context: self.context, wait, timeout: CALL_TIMEOUT, segment_bytes };
        Comm::with_opts(&mut self.dev, &self.eps, self.job.rank, opts).map_err(|e| e.to_string())
    }
    fn comm(&mut self) -> Result<Comm, String> {
        self.comm_with(Wait::Block, CommOpts::default().segment_bytes)
    }
    /// Every rank's `value` for `key`, through the rendezvous directory.
    fn exchange(&self, key: &str, value: &str) -> Result<Vec<String>, String> {
        self.job.exchange(key, value, Duration::from_secs(120)).map_err(|e| format!("exchange {key}: {e}"))
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn e2s(e: emp::Error) -> String {
    e.to_string()
}

/// One check of the suite.
type Test = fn(&mut Ctx) -> Result<(), String>;

type BarrierFn<'a> = &'a mut dyn FnMut(&mut Device, &mut Comm) -> emp::Result<()>;

/// Runs `iters` barriers (with `late`, one rank in turn arrives 3 ms late)
/// and checks the barrier property on the shared monotonic clock: no rank
/// leaves barrier i before the last rank entered it. Afterwards no
/// completion of the communicator is left in the CQ.
fn barrier_property(c: &mut Ctx, key: &str, iters: usize, late: bool, f: BarrierFn) -> Result<(), String> {
    let mut comm = c.comm()?;
    let mut log = String::with_capacity(iters * 24);
    for i in 0..iters {
        if late && i % c.n() == c.rank() {
            std::thread::sleep(Duration::from_millis(3));
        }
        let enter = now_ns();
        f(&mut c.dev, &mut comm).map_err(|e| format!("barrier {i}: {e}"))?;
        log.push_str(&format!("{enter} {} ", now_ns()));
    }
    comm.flush(&mut c.dev).map_err(e2s)?;
    let mut left = [Completion::default(); 4];
    if c.dev.poll_cq(&mut left) != 0 {
        return Err(format!("completion left in the CQ after flush: {:?}", left[0]));
    }
    let all = c.exchange(key, &log)?;
    let times: Vec<Vec<u64>> =
        all.iter().map(|s| s.split_whitespace().map(|v| v.parse().unwrap_or(0)).collect()).collect();
    for i in 0..iters {
        let last_in = times.iter().map(|t| t[2 * i]).max().unwrap_or(0);
        let (first_out, who) = times.iter().enumerate().map(|(r, t)| (t[2 * i + 1], r)).min().unwrap_or((0, 0));
        if first_out < last_in {
            return Err(format!(
                "barrier {i}: rank {who} left {} µs before the last rank arrived",
                (last_in - first_out) / 1000
            ));
        }
    }
    Ok(())
}

fn barrier_pe(c: &mut Ctx) -> Result<(), String> {
    barrier_property(c, "pe", 20, true, &mut |d, m| m.barrier_pe(d))
}

fn barrier_diss(c: &mut Ctx) -> Result<(), String> {
    barrier_property(c, "diss", 20, true, &mut |d, m| m.barrier_dissemination(d))
}

fn barrier_gb(c: &mut Ctx) -> Result<(), String> {
    let n = c.n();
    for lambda in [1, 2, 4] {
        let tree = Tree::postal(n, lambda);
        barrier_property(c, &format!("gb{lambda}"), 12, true, &mut |d, m| m.barrier_gb(d, &tree))
            .map_err(|e| format!("λ={lambda}: {e}"))?;
    }
    Ok(())
}

fn barriers_back_to_back(c: &mut Ctx) -> Result<(), String> {
    let tree = Tree::postal(c.n(), 2);
    barrier_property(c, "b2b-pe", 1000, false, &mut |d, m| m.barrier_pe(d)).map_err(|e| format!("PE: {e}"))?;
    barrier_property(c, "b2b-diss", 1000, false, &mut |d, m| m.barrier_dissemination(d))
        .map_err(|e| format!("dissemination: {e}"))?;
    barrier_property(c, "b2b-gb", 1000, false, &mut |d, m| m.barrier_gb(d, &tree)).map_err(|e| format!("GB: {e}"))?;
    // The three kinds interleaved on one communicator.
    let mut k = 0;
    barrier_property(c, "b2b-mixed", 300, false, &mut |d, m| {
        k += 1;
        match k % 3 {
            0 => m.barrier_pe(d),
            1 => m.barrier_dissemination(d),
            _ => m.barrier_gb(d, &tree),
        }
    })
    .map_err(|e| format!("mixed: {e}"))
}

fn barriers_polling(c: &mut Ctx) -> Result<(), String> {
    let mut comm = c.comm_with(Wait::Poll, CommOpts::default().segment_bytes)?;
    for _ in 0..200 {
        comm.barrier_pe(&mut c.dev).map_err(e2s)?;
        comm.barrier_dissemination(&mut c.dev).map_err(e2s)?;
    }
    let mine = (c.rank() as u64 + 1).to_le_bytes();
    let mut sum = [0u8; 8];
    comm.allreduce(&mut c.dev, Dtype::U64, ReduceOp::Sum, &mine, &mut sum).map_err(e2s)?;
    let n = c.n() as u64;
    if u64::from_le_bytes(sum) != n * (n + 1) / 2 {
        return Err(format!("sum of 1..={n} came out {}", u64::from_le_bytes(sum)));
    }
    comm.flush(&mut c.dev).map_err(e2s)
}

fn roots(n: usize) -> Vec<usize> {
    let mut r = vec![0, 1 % n, n - 1, n / 2];
    r.sort_unstable();
    r.dedup();
    r
}

/// Broadcasts from several roots, sizes 0 B to 1 MiB, back to back; every
/// non-root's buffer starts as garbage.
fn bcast_with(c: &mut Ctx, wait: Wait, tree: Option<&Tree>, sizes: &[usize]) -> Result<(), String> {
    let mut comm = c.comm_with(wait, CommOpts::default().segment_bytes)?;
    for root in roots(c.n()) {
        for (i, &len) in sizes.iter().enumerate() {
            let span = c.buf.range(0, len);
            let id = 5000 + (root * 16 + i) as u64;
            let is_root = c.rank() == root;
            let bytes = &mut c.buf.as_mut_slice()[..len];
            if is_root {
                pattern(id, bytes);
            } else {
                bytes.fill(0xAA);
            }
            let r = match tree {
                None => comm.bcast_binomial(&mut c.dev, root, span),
                Some(t) => comm.bcast_tree(&mut c.dev, root, t, span),
            };
            r.map_err(|e| format!("root {root}, {len} B: {e}"))?;
            check_pattern(id, &c.buf.as_slice()[..len]).map_err(|e| format!("root {root}, {len} B: {e}"))?;
        }
    }
    comm.flush(&mut c.dev).map_err(e2s)
}

fn bcast_binomial(c: &mut Ctx) -> Result<(), String> {
    bcast_with(c, Wait::Block, None, &[0, 1, 65536, 1 << 20])
}

fn bcast_postal(c: &mut Ctx) -> Result<(), String> {
    let n = c.n();
    for lambda in [2, 3, 8] {
        let tree = Tree::postal(n, lambda);
        bcast_with(c, Wait::Block, Some(&tree), &[0, 1, 65536]).map_err(|e| format!("λ={lambda}: {e}"))?;
    }
    bcast_with(c, Wait::Poll, None, &[1, 65536]).map_err(|e| format!("polling: {e}"))
}

/// Rank `rank`'s input for (t, op, count): integers from a byte pattern;
/// floats of mixed magnitude and sign (so the combining order shows), with
/// a NaN, a signed zero and an infinity at fixed places on some ranks.
fn input(rank: usize, t: Dtype, op: ReduceOp, count: usize) -> Vec<u8> {
    let seed = (rank as u64) << 32 | (t as u64) << 16 | (op as u64) << 8 | (count as u64 & 0xFF);
    let mut v = vec![0u8; count * t.size()];
    pattern(seed, &mut v);
    if !t.is_float() {
        return v;
    }
    let mut out = Vec::with_capacity(v.len());
    for (i, raw) in v.chunks(t.size()).enumerate() {
        let r = u32::from_le_bytes(raw[..4].try_into().expect("4"));
        let mut x = (r >> 8) as f64 / (1u64 << 24) as f64 * 2f64.powi((r & 0x3F) as i32 - 20);
        if r & 0x40 != 0 {
            x = -x;
        }
        // Products stay finite-ish; sums see cancellation.
        if op == ReduceOp::Prod {
            x = 1.0 + x.fract() * 0.01;
        }
        x = match (i, rank) {
            (3, 1) => f64::NAN,
            (5, 0) => -0.0,
            (5, _) => 0.0,
            (6, 2) => f64::INFINITY,
            _ => x,
        };
        match t {
            Dtype::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            _ => out.extend_from_slice(&x.to_le_bytes()),
        }
    }
    out
}

fn first_diff(t: Dtype, got: &[u8], want: &[u8]) -> String {
    let s = t.size();
    match got.chunks(s).zip(want.chunks(s)).position(|(a, b)| a != b) {
        Some(i) => format!(
            "element {i} of {}: got {:02x?}, want {:02x?}",
            got.len() / s,
            &got[i * s..(i + 1) * s],
            &want[i * s..(i + 1) * s]
        ),
        None => format!("lengths {} and {}", got.len(), want.len()),
    }
}

const COUNTS: [usize; 4] = [1, 7, 1000, 10_000];

fn allreduce_all_types(c: &mut Ctx) -> Result<(), String> {
    let mut comm = c.comm()?;
    let n = c.n();
    let parent = comm.binomial().parent.clone();
    for t in Dtype::ALL {
        for op in ReduceOp::ALL {
            if !op.defined_for(t) {
                let mut out = vec![0u8; t.size()];
                match comm.allreduce(&mut c.dev, t, op, &vec![0u8; t.size()], &mut out) {
                    Err(emp::Error::InvalidOp { .. }) => continue,
                    other => return Err(format!("{} on {}: {other:?}, expected InvalidOp", op.name(), t.name())),
                }
            }
            for count in COUNTS {
                let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(r, t, op, count)).collect();
                let want = reduce_ref(t, op, &parent, &inputs).map_err(e2s)?;
                let mut got = vec![0xA5u8; want.len()];
                let what = format!("{} {} × {count}", t.name(), op.name());
                comm.allreduce(&mut c.dev, t, op, &inputs[c.job.rank], &mut got).map_err(|e| format!("{what}: {e}"))?;
                if got != want {
                    return Err(format!("{what}: {}", first_diff(t, &got, &want)));
                }
            }
        }
    }
    comm.flush(&mut c.dev).map_err(e2s)
}

fn reduce_to_roots(c: &mut Ctx) -> Result<(), String> {
    let mut comm = c.comm()?;
    let n = c.n();
    let parent = comm.binomial().parent.clone();
    for root in roots(n) {
        for (t, op) in [
            (Dtype::I64, ReduceOp::Sum),
            (Dtype::F64, ReduceOp::Sum),
            (Dtype::F32, ReduceOp::Max),
            (Dtype::U32, ReduceOp::Bxor),
        ] {
            for count in [1, 1000, 10_000] {
                let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(r, t, op, count)).collect();
                // The tree is over ranks relative to the root.
                let rel: Vec<Vec<u8>> =
                    (0..n).map(|i| inputs[abs_rank(i as u16, root as u16, n as u16) as usize].clone()).collect();
                let want = reduce_ref(t, op, &parent, &rel).map_err(e2s)?;
                let mut got = vec![0u8; want.len()];
                let out = (c.rank() == root).then_some(&mut got[..]);
                let what = format!("root {root}, {} {} × {count}", t.name(), op.name());
                comm.reduce(&mut c.dev, root, t, op, &inputs[c.job.rank], out).map_err(|e| format!("{what}: {e}"))?;
                if c.rank() == root && got != want {
                    return Err(format!("{what}: {}", first_diff(t, &got, &want)));
                }
            }
        }
    }
    comm.flush(&mut c.dev).map_err(e2s)
}

/// Two communicators over the same endpoints, one cutting vectors into
/// 64-byte segments, their calls interleaved: contexts keep them apart.
fn two_communicators_segmented(c: &mut Ctx) -> Result<(), String> {
    let mut a = c.comm()?;
    let mut b = c.comm_with(Wait::Block, 64)?;
    let n = c.n();
    let parent = a.binomial().parent.clone();
    for round in 0..5 {
        let t = if round % 2 == 0 { Dtype::F64 } else { Dtype::I32 };
        let inputs: Vec<Vec<u8>> = (0..n).map(|r| input(r + round, t, ReduceOp::Sum, 1000)).collect();
        let want = reduce_ref(t, ReduceOp::Sum, &parent, &inputs).map_err(e2s)?;
        let (mut ga, mut gb) = (vec![0u8; want.len()], vec![0u8; want.len()]);
        b.allreduce(&mut c.dev, t, ReduceOp::Sum, &inputs[c.job.rank], &mut gb)
            .map_err(|e| format!("segmented: {e}"))?;
        a.barrier_dissemination(&mut c.dev).map_err(e2s)?;
        a.allreduce(&mut c.dev, t, ReduceOp::Sum, &inputs[c.job.rank], &mut ga).map_err(e2s)?;
        b.barrier_pe(&mut c.dev).map_err(e2s)?;
        if ga != want || gb != want {
            return Err(format!(
                "round {round}: whole {}, segmented {}",
                first_diff(t, &ga, &want),
                first_diff(t, &gb, &want)
            ));
        }
    }
    a.flush(&mut c.dev).map_err(e2s)?;
    b.flush(&mut c.dev).map_err(e2s)
}

fn misuse_is_refused(c: &mut Ctx) -> Result<(), String> {
    let n = c.n();
    let invalid = |r: emp::Result<()>, what: &str| match r {
        Err(emp::Error::InvalidArgument(_)) => Ok(()),
        other => Err(format!("{what}: {other:?}, expected InvalidArgument")),
    };
    if n > 1 {
        let wrong = (c.rank() + 1) % n;
        invalid(Comm::new(&mut c.dev, &c.eps, wrong).map(|_| ()), "someone else's rank")?;
    }
    invalid(Comm::new(&mut c.dev, &c.eps, n).map(|_| ()), "rank out of range")?;
    let mut twice = c.eps.clone();
    twice.push(c.eps[0]);
    invalid(Comm::new(&mut c.dev, &twice, c.job.rank).map(|_| ()), "an endpoint twice")?;
    let mut comm = c.comm()?;
    invalid(comm.bcast_binomial(&mut c.dev, n, c.buf.range(0, 8)), "bcast root out of range")?;
    invalid(comm.barrier_gb(&mut c.dev, &Tree::binomial(n + 1)), "tree of the wrong size")?;
    invalid(comm.allreduce(&mut c.dev, Dtype::I64, ReduceOp::Sum, &[0u8; 16], &mut [0u8; 8]), "short result buffer")?;
    invalid(comm.allreduce(&mut c.dev, Dtype::I64, ReduceOp::Sum, &[0u8; 12], &mut [0u8; 12]), "partial element")?;
    if c.rank() == 0 {
        invalid(
            comm.reduce(&mut c.dev, 0, Dtype::I32, ReduceOp::Sum, &[0u8; 4], None),
            "root without a result buffer",
        )?;
    }
    // Refusals happen before any message: the communicator still works.
    comm.barrier_pe(&mut c.dev).map_err(e2s)?;
    let mut out = [0u8; 8];
    comm.allreduce(&mut c.dev, Dtype::I64, ReduceOp::Max, &(c.job.rank as i64).to_le_bytes(), &mut out).map_err(e2s)?;
    if i64::from_le_bytes(out) != n as i64 - 1 {
        return Err(format!("max rank came out {}", i64::from_le_bytes(out)));
    }
    comm.flush(&mut c.dev).map_err(e2s)
}

fn main() {
    let (job, mut dev, eps) = emp_tests::tap_start(
        "tap-coll-host",
        1,
        emp_tests::WithoutRendezvous::Skip("needs a rendezvous directory (emp run) for its timing checks"),
    );
    let quiet = job.rank != 0;
    let buf = dev.alloc(1 << 20).expect("arena");
    let mut c = Ctx { dev, job, eps, buf, context: 0 };
    let tests: [(&str, Test); 11] = [
        ("pairwise-exchange barrier: nobody leaves before the last arrives", barrier_pe),
        ("dissemination barrier: nobody leaves before the last arrives", barrier_diss),
        ("gather-release barrier over postal trees λ = 1, 2, 4", barrier_gb),
        ("1000 back-to-back barriers of each kind, then 300 mixed; CQ clean after", barriers_back_to_back),
        ("polling waits: 400 barriers and an allreduce", barriers_polling),
        ("binomial bcast of 0 B, 1 B, 64 KiB, 1 MiB from several roots", bcast_binomial),
        ("bcast down postal trees λ = 2, 3, 8, and polling", bcast_postal),
        ("allreduce, every dtype × op, 1..10000 elements, bit-equal to reduce_ref", allreduce_all_types),
        ("reduce to several roots, bit-equal to reduce_ref over relative ranks", reduce_to_roots),
        ("two communicators interleaved, one in 64-byte segments", two_communicators_segmented),
        ("misuse refused before any message; communicator still works", misuse_is_refused),
    ];
    let mut tap = Tap::new(tests.len(), quiet);
    for (i, (name, f)) in tests.iter().enumerate() {
        let mine = f(&mut c);
        // A test passes only if it passed everywhere.
        let verdict = match &mine {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("rank {}: {e}", c.rank()),
        };
        let all = c.exchange(&format!("verdict{i}"), &verdict);
        let failures: Vec<String> = match all {
            Ok(v) => v.into_iter().filter(|s| s != "ok").collect(),
            Err(e) => vec![e],
        };
        tap.check(name, if failures.is_empty() { Ok(()) } else { Err(failures.join("; ")) });
    }
    std::process::exit(tap.finish());
}
