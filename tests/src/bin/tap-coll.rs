//! NIC-offloaded collectives TAP suite: run as 2 or more ranks (`emp run
//! -n N -- tap-coll`). Rank 0 prints TAP; every rank exits non-zero on a
//! failure. Waits block on the port's event (8 ranks share 2 cores).

use std::time::Duration;

use emp::rdv::Job;
use emp::{BarrierAlgo, Buffer, Device, Dtype, Endpoint, Group, GroupOpts, ReduceOp, Status};
use emp_tests::{expect_ok, wait_for};

const T: Duration = Duration::from_secs(60);

struct Ctx {
    dev: Device,
    job: Job,
    eps: Vec<Endpoint>,
    g: Group,
    sbuf: Buffer,
    rbuf: Buffer,
    next_wr: u64,
}

impl Ctx {
    fn n(&self) -> usize {
        self.job.size
    }
    fn rank(&self) -> usize {
        self.job.rank
    }
    fn wr(&mut self) -> u64 {
        self.next_wr += 1;
        self.next_wr
    }
    fn sync(&mut self, name: &str) -> Result<(), String> {
        self.job.barrier(&mut self.dev, name).map_err(|e| e.to_string())
    }
}

fn barriers(c: &mut Ctx) -> Result<(), String> {
    for algo in [BarrierAlgo::PairwiseExchange, BarrierAlgo::Dissemination, BarrierAlgo::GatherRelease] {
        for _ in 0..200 {
            c.dev.barrier(&c.g, algo).map_err(|e| format!("{algo:?}: {e}"))?;
        }
    }
    Ok(())
}

fn barrier_holds_everyone(c: &mut Ctx) -> Result<(), String> {
    // The last rank arrives 200 ms late: nobody may leave before it.
    let late = c.n() - 1;
    let start = std::time::Instant::now();
    if c.rank() == late {
        std::thread::sleep(Duration::from_millis(200));
    }
    c.dev.barrier(&c.g, BarrierAlgo::Dissemination).map_err(|e| e.to_string())?;
    let waited = start.elapsed();
    if waited < Duration::from_millis(150) {
        return Err(format!("left the barrier after {waited:?}, before the late rank arrived"));
    }
    Ok(())
}

fn nonblocking_barriers_in_flight(c: &mut Ctx) -> Result<(), String> {
    let wrs: Vec<u64> = (0..6).map(|_| c.wr()).collect();
    for &wr in &wrs {
        c.dev.post_barrier(wr, &c.g, BarrierAlgo::PairwiseExchange).map_err(|e| e.to_string())?;
    }
    for wr in wrs {
        expect_ok(&wait_for(&mut c.dev, wr, T)?)?;
    }
    Ok(())
}

/// Per-rank input of element `i` for `op`, chosen so the result has a closed form.
fn input(op: ReduceOp, rank: usize, i: usize) -> i64 {
    match op {
        ReduceOp::Sum => (rank + 1 + i) as i64,
        ReduceOp::Prod => {
            if rank == 1 {
                3 + i as i64
            } else {
                1
            }
        }
        ReduceOp::Min => 100 - rank as i64 + i as i64,
        ReduceOp::Max => (rank * 7 + i) as i64,
        ReduceOp::Band => !(1i64 << rank) & 0xFFFF,
        ReduceOp::Bor | ReduceOp::Bxor => 1i64 << rank,
    }
}

fn expected(op: ReduceOp, n: usize, i: usize) -> i64 {
    match op {
        ReduceOp::Sum => (0..n).map(|r| (r + 1 + i) as i64).sum(),
        ReduceOp::Prod => 3 + i as i64,
        ReduceOp::Min => 100 - (n as i64 - 1) + i as i64,
        ReduceOp::Max => ((n - 1) * 7 + i) as i64,
        ReduceOp::Band => !((1i64 << n) - 1) & 0xFFFF,
        ReduceOp::Bor | ReduceOp::Bxor => (1i64 << n) - 1,
    }
}

fn encode(t: Dtype, v: i64, out: &mut [u8]) {
    match t {
        Dtype::I32 => out.copy_from_slice(&(v as i32).to_le_bytes()),
        Dtype::U32 => out.copy_from_slice(&(v as u32).to_le_bytes()),
        Dtype::I64 => out.copy_from_slice(&v.to_le_bytes()),
        Dtype::U64 => out.copy_from_slice(&(v as u64).to_le_bytes()),
        Dtype::F32 => out.copy_from_slice(&(v as f32).to_le_bytes()),
        Dtype::F64 => out.copy_from_slice(&(v as f64).to_le_bytes()),
    }
}

const COUNT: usize = 3;

fn allreduce_every_type_and_op(c: &mut Ctx) -> Result<(), String> {
    let (n, rank) = (c.n(), c.rank());
    for t in Dtype::ALL {
        for op in ReduceOp::ALL.into_iter().filter(|op| op.defined_for(t)) {
            let w = t.size();
            for i in 0..COUNT {
                encode(t, input(op, rank, i), &mut c.sbuf.as_mut_slice()[i * w..(i + 1) * w]);
            }
            c.rbuf.as_mut_slice()[..COUNT * w].fill(0xEE);
            let (s, r) = (c.sbuf.sge(0, COUNT * w), c.rbuf.sge(0, COUNT * w));
            c.dev.allreduce(&c.g, t, op, s, r).map_err(|e| format!("{} {}: {e}", t.name(), op.name()))?;
            for i in 0..COUNT {
                let mut want = vec![0u8; w];
                encode(t, expected(op, n, i), &mut want);
                let got = &c.rbuf.as_slice()[i * w..(i + 1) * w];
                if got != want.as_slice() {
                    return Err(format!("{} {} element {i}: got {got:?}, want {want:?}", t.name(), op.name()));
                }
            }
        }
    }
    Ok(())
}

fn reduce_to_every_root(c: &mut Ctx) -> Result<(), String> {
    let n = c.n();
    for root in 0..n {
        let mine = (c.rank() + 1) as u64;
        c.sbuf.as_mut_slice()[..8].copy_from_slice(&mine.to_le_bytes());
        c.rbuf.as_mut_slice()[..8].fill(0);
        let recv = (c.rank() == root).then(|| c.rbuf.sge(0, 8));
        c.dev.reduce(&c.g, root, Dtype::U64, ReduceOp::Sum, c.sbuf.sge(0, 8), recv).map_err(|e| e.to_string())?;
        if c.rank() == root {
            let got = u64::from_le_bytes(c.rbuf.as_slice()[..8].try_into().expect("8"));
            if got != (n * (n + 1) / 2) as u64 {
                return Err(format!("root {root}: sum {got}"));
            }
        }
    }
    Ok(())
}

fn float_allreduce_is_bitwise_identical_everywhere(c: &mut Ctx) -> Result<(), String> {
    // Sums of values whose rounding depends on the order: every rank must
    // still hold the same bits (fixed combining order), run after run.
    const K: usize = 64;
    for i in 0..K {
        let v = 1.0f64 / (c.rank() as f64 + i as f64 + 3.0) * 1e-3 + (i as f64) * 1e12;
        c.sbuf.as_mut_slice()[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    let mut first: Option<Vec<u8>> = None;
    for _ in 0..3 {
        let (s, r) = (c.sbuf.sge(0, K * 8), c.rbuf.sge(0, K * 8));
        c.dev.allreduce(&c.g, Dtype::F64, ReduceOp::Sum, s, r).map_err(|e| e.to_string())?;
        let got = c.rbuf.as_slice()[..K * 8].to_vec();
        if first.as_ref().is_some_and(|f| *f != got) {
            return Err("a repeated allreduce gave different bits".into());
        }
        first = Some(got);
    }
    // Same bits on every rank: min and max of the bit patterns agree.
    let bits = first.expect("ran");
    let mut lohi = Vec::new();
    for op in [ReduceOp::Min, ReduceOp::Max] {
        c.sbuf.as_mut_slice()[..K * 8].copy_from_slice(&bits);
        let (s, r) = (c.sbuf.sge(0, K * 8), c.rbuf.sge(0, K * 8));
        c.dev.allreduce(&c.g, Dtype::U64, op, s, r).map_err(|e| e.to_string())?;
        lohi.push(c.rbuf.as_slice()[..K * 8].to_vec());
    }
    if lohi[0] != lohi[1] || lohi[0] != bits {
        return Err("ranks disagree on the bits of the f64 sum".into());
    }
    Ok(())
}

fn long_reductions_are_chunked(c: &mut Ctx) -> Result<(), String> {
    let (n, rank) = (c.n(), c.rank());
    // 1 MiB of i64: 128 NIC reductions of one frame each, pipelined.
    const K: usize = 1 << 17;
    for i in 0..K {
        c.sbuf.as_mut_slice()[i * 8..i * 8 + 8].copy_from_slice(&input(ReduceOp::Sum, rank, i).to_le_bytes());
    }
    c.rbuf.as_mut_slice()[..K * 8].fill(0xEE);
    let (s, r) = (c.sbuf.sge(0, K * 8), c.rbuf.sge(0, K * 8));
    c.dev.allreduce(&c.g, Dtype::I64, ReduceOp::Sum, s, r).map_err(|e| format!("allreduce 1 MiB: {e}"))?;
    for i in 0..K {
        let got = i64::from_le_bytes(c.rbuf.as_slice()[i * 8..i * 8 + 8].try_into().expect("8"));
        if got != expected(ReduceOp::Sum, n, i) {
            return Err(format!("allreduce 1 MiB element {i}: {got}"));
        }
    }
    // A length that leaves a short last chunk, reduced to the last rank.
    const M: usize = 25_001;
    let root = n - 1;
    for i in 0..M {
        let v = input(ReduceOp::Max, rank, i) as u32;
        c.sbuf.as_mut_slice()[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    c.rbuf.as_mut_slice()[..M * 4].fill(0);
    let recv = (rank == root).then(|| c.rbuf.sge(0, M * 4));
    c.dev
        .reduce(&c.g, root, Dtype::U32, ReduceOp::Max, c.sbuf.sge(0, M * 4), recv)
        .map_err(|e| format!("reduce {M} u32: {e}"))?;
    if rank == root {
        for i in 0..M {
            let got = u32::from_le_bytes(c.rbuf.as_slice()[i * 4..i * 4 + 4].try_into().expect("4"));
            if got != expected(ReduceOp::Max, n, i) as u32 {
                return Err(format!("reduce {M} u32 element {i}: {got}"));
            }
        }
    }
    // The posted form carries one chunk at most: longer is TooLarge.
    let too_long = c.dev.reduce_chunk_bytes(Dtype::I64) + 8;
    let (s, r) = (c.sbuf.sge(0, too_long), c.rbuf.sge(0, too_long));
    let wr = c.wr();
    c.dev.post_allreduce(wr, &c.g, Dtype::I64, ReduceOp::Sum, s, r).map_err(|e| e.to_string())?;
    let done = c.dev.wait_wr(wr, Some(T)).map_err(|e| e.to_string())?;
    if done.status != Status::TooLarge {
        return Err(format!("posted allreduce of {too_long} B: {:?}", done.status));
    }
    Ok(())
}

fn fill(buf: &mut [u8], seed: usize) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i.wrapping_mul(131) ^ seed.wrapping_mul(7) ^ (i >> 9)) as u8;
    }
}

fn bcast_every_root_and_size(c: &mut Ctx) -> Result<(), String> {
    for root in 0..c.n() {
        for (k, len) in [0usize, 1, 5000, 100_000, 1 << 20].into_iter().enumerate() {
            let seed = root * 10 + k;
            let is_root = c.rank() == root;
            let buf = if is_root { &mut c.sbuf } else { &mut c.rbuf };
            if is_root {
                fill(&mut buf.as_mut_slice()[..len], seed);
            } else {
                buf.as_mut_slice()[..len].fill(0);
            }
            let sges: Vec<emp::Sge> = if len == 0 { vec![] } else { vec![buf.sge(0, len)] };
            c.dev.bcast(&c.g, root, &sges).map_err(|e| format!("root {root} len {len}: {e}"))?;
            if c.rank() != root {
                let mut want = vec![0u8; len];
                fill(&mut want, seed);
                if c.rbuf.as_slice()[..len] != want[..] {
                    return Err(format!("root {root} len {len}: bytes differ"));
                }
            }
        }
    }
    Ok(())
}

fn bcast_arrives_before_the_call(c: &mut Ctx) -> Result<(), String> {
    // Rank 0 broadcasts at once; the others call 100 ms later. Their NICs
    // forwarded meanwhile (application bypass): the late calls find the
    // data already there.
    let len = 4000;
    if c.rank() == 0 {
        fill(&mut c.sbuf.as_mut_slice()[..len], 77);
        c.dev.bcast(&c.g, 0, &[c.sbuf.sge(0, len)]).map_err(|e| e.to_string())?;
        return Ok(());
    }
    std::thread::sleep(Duration::from_millis(100));
    c.rbuf.as_mut_slice()[..len].fill(0);
    c.dev.bcast(&c.g, 0, &[c.rbuf.sge(0, len)]).map_err(|e| e.to_string())?;
    let mut want = vec![0u8; len];
    fill(&mut want, 77);
    if c.rbuf.as_slice()[..len] != want[..] {
        return Err("bounced bytes differ".into());
    }
    Ok(())
}

fn multisend_reaches_every_member(c: &mut Ctx) -> Result<(), String> {
    let len = 20_000;
    let tag = 0x4D53;
    if c.rank() == 0 {
        fill(&mut c.sbuf.as_mut_slice()[..len], 5);
        let others = ((1u64 << c.n()) - 1) & !1;
        c.sync("ms-posted")?;
        let wr = c.wr();
        c.dev.post_multisend(wr, &c.g, others, tag, &[c.sbuf.sge(0, len)]).map_err(|e| e.to_string())?;
        let done = wait_for(&mut c.dev, wr, T)?;
        expect_ok(&done)?;
        if done.msg_len != 0 {
            return Err(format!("{} destinations failed", done.msg_len));
        }
        return Ok(());
    }
    let wr = c.wr();
    let from = c.eps[0];
    c.dev.post_recv(wr, from, tag, 0, &[c.rbuf.sge(0, len)]).map_err(|e| e.to_string())?;
    c.sync("ms-posted")?;
    expect_ok(&wait_for(&mut c.dev, wr, T)?)?;
    let mut want = vec![0u8; len];
    fill(&mut want, 5);
    if c.rbuf.as_slice()[..len] != want[..] {
        return Err("multisend bytes differ".into());
    }
    Ok(())
}

fn misuse_is_an_error_completion(c: &mut Ctx) -> Result<(), String> {
    let (s, r) = (c.sbuf.sge(0, 8), c.rbuf.sge(0, 8));
    match c.dev.allreduce(&c.g, Dtype::F64, ReduceOp::Bxor, s, r) {
        Err(emp::Error::Failed(Status::InvalidOp)) => {}
        other => return Err(format!("bxor on f64: {other:?}")),
    }
    // A group this process destroyed is unknown to the NIC.
    let members = c.eps.clone();
    let g2 = c.dev.create_group(99, &members, &GroupOpts::default()).map_err(|e| e.to_string())?;
    let stale = g2.clone();
    c.dev.destroy_group(g2).map_err(|e| e.to_string())?;
    match c.dev.barrier(&stale, BarrierAlgo::Dissemination) {
        Err(emp::Error::Failed(Status::GroupInvalid)) => {}
        other => return Err(format!("barrier on a destroyed group: {other:?}")),
    }
    // Not a member.
    let others: Vec<Endpoint> = c.eps.iter().copied().filter(|&e| e != c.dev.endpoint()).collect();
    match c.dev.create_group(98, &others, &GroupOpts::default()) {
        Err(emp::Error::InvalidArgument(_)) => Ok(()),
        other => Err(format!("group without this port: {other:?}")),
    }
}

fn groups_recreated_reuse_their_bounce_memory(c: &mut Ctx) -> Result<(), String> {
    // 100 × 4 MiB of bounce slots is more than the whole arena: only
    // reusing a destroyed group's memory lets this finish.
    let opts = GroupOpts { bounce_slots: 4, bounce_slot_size: 1 << 20, ..GroupOpts::default() };
    let members = c.eps.clone();
    for i in 0..100 {
        let g = c.dev.create_group(200 + i % 3, &members, &opts).map_err(|e| format!("group {i}: {e}"))?;
        c.dev.destroy_group(g).map_err(|e| format!("destroy {i}: {e}"))?;
    }
    // Re-creating an id without destroying it reuses the slot and its memory too.
    for i in 0..100 {
        c.dev.create_group(300, &members, &opts).map_err(|e| format!("re-creation {i}: {e}"))?;
    }
    let g = c.dev.create_group(300, &members, &opts).map_err(|e| e.to_string())?;
    c.dev.destroy_group(g).map_err(|e| e.to_string())
}

fn main() {
    let (job, mut dev, eps) = emp_tests::tap_start("tap-coll", 2, emp_tests::WithoutRendezvous::Run);
    let quiet = job.rank != 0;
    let g = match dev.create_group(1, &eps, &GroupOpts::default()) {
        Ok(g) => g,
        Err(e) => {
            println!("TAP version 13\n1..0 # SKIP cannot create a group: {e}");
            std::process::exit(1);
        }
    };
    let sbuf = dev.alloc(2 << 20).expect("arena");
    let rbuf = dev.alloc(2 << 20).expect("arena");
    let mut c = Ctx { dev, job, eps, g, sbuf, rbuf, next_wr: 0 };
    // Every rank's port open and group created before the first
    // collective: a static job (ranks in VMs) has not met yet.
    if let Err(e) = c.sync("start") {
        eprintln!("tap-coll: start barrier: {e}");
        std::process::exit(2);
    }
    let tests: [emp_tests::TapCase<Ctx>; 12] = [
        ("600 barriers: pairwise exchange, dissemination, gather-release", barriers),
        ("nobody leaves a barrier before the last rank arrives", barrier_holds_everyone),
        ("6 nonblocking barriers in flight", nonblocking_barriers_in_flight),
        ("allreduce: every type and operator", allreduce_every_type_and_op),
        ("reduce to every root", reduce_to_every_root),
        ("f64 allreduce bitwise identical on every rank and run", float_allreduce_is_bitwise_identical_everywhere),
        ("1 MiB allreduce and odd-length reduce, chunked; posted form TooLarge", long_reductions_are_chunked),
        ("broadcast from every root, 0 B to 1 MiB", bcast_every_root_and_size),
        ("broadcast before the call: forwarded and bounced (application bypass)", bcast_arrives_before_the_call),
        ("multisend: one post reaches every member", multisend_reaches_every_member),
        ("misuse: error completions and errors, no hang", misuse_is_an_error_completion),
        ("200 groups created on 4 MiB of bounce slots each: memory reused", groups_recreated_reuse_their_bounce_memory),
    ];
    emp_tests::run_tap(quiet, &mut c, &tests, |c, name| {
        let _ = c.sync(name);
    });
}
