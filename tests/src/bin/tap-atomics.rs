//! Remote atomics TAP suite: run as 2 or more ranks (`emp run -n N --
//! tap-atomics`; keys are exchanged through the rendezvous directory).
//! Rank 0 prints TAP; every rank exits non-zero on a failure.

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use emp::host_atomics::{HostAtomicClient, HostAtomicServer};
use emp::mcs::McsLock;
use emp::rdv::Job;
use emp::{Buffer, Device, Endpoint, Error, Opcode, RemoteKey, RemoteWord, Status, Width, MR_REMOTE_ATOMIC};
use emp_tests::wait_for;

const T: Duration = Duration::from_secs(120);
/// Fetch-adds per rank on the shared counter.
const ADDS: u64 = 300;
/// Lock acquisitions per rank.
const LOCKS: u64 = 25;
/// Host-served fetch-adds per rank (other than 0).
const HOST_ADDS: u64 = 100;
/// Offsets in every rank's atomic region.
const COUNTER: u64 = 0;
const WORDS: u64 = 64;

struct Ctx {
    dev: Device,
    job: Job,
    eps: Vec<Endpoint>,
    /// This rank's region with remote-atomic rights.
    region: Buffer,
    /// Every rank's region key.
    keys: Vec<RemoteKey>,
    /// Local result words.
    results: Buffer,
}

impl Ctx {
    fn rank(&self) -> usize {
        self.job.rank
    }
    fn sync(&mut self, name: &str) -> Result<(), String> {
        self.job.barrier(&mut self.dev, name).map_err(|e| e.to_string())
    }
    fn word(&self, rank: usize, offset: u64, width: Width) -> RemoteWord {
        RemoteWord { key: self.keys[rank], offset, width }
    }
}

fn e(x: Error) -> String {
    x.to_string()
}

/// Every rank adds 1 to rank 0's counter `ADDS` times, up to 32 in flight.
fn hammer(c: &mut Ctx) -> Result<(), String> {
    let at = c.word(0, COUNTER, Width::W64);
    let (to, n, window) = (c.eps[0], ADDS as usize, 32usize);
    let mut last = None;
    for i in 0..n + window {
        if i >= window {
            let k = i - window;
            let wc = wait_for(&mut c.dev, k as u64, T)?;
            if wc.status != Status::Success || wc.opcode != Opcode::AtomicFetchAdd {
                return Err(format!("fetch-add {k}: {} ({:?})", wc.status.as_str(), wc.opcode));
            }
            let stored = c.results.atomic_u64(8 * (k % window)).load(SeqCst);
            if stored != wc.old {
                return Err(format!("fetch-add {k}: result word {stored}, completion {}", wc.old));
            }
            // One port's operations on one target run in posting order.
            if last.is_some_and(|l| l >= wc.old) {
                return Err(format!("fetch-add {k}: old {} after {last:?}", wc.old));
            }
            last = Some(wc.old);
        }
        if i < n {
            let r = c.results.sge(8 * (i % window), 8);
            c.dev.post_fetch_add(i as u64, to, at, 1, r).map_err(e)?;
        }
    }
    c.sync("hammer")?;
    if c.rank() == 0 {
        let total = c.region.atomic_u64(COUNTER as usize).load(SeqCst);
        let want = ADDS * c.job.size as u64;
        if total != want {
            return Err(format!("counter {total} after {want} fetch-adds"));
        }
    }
    Ok(())
}

/// CAS hit and miss, swap and wrapping fetch-add at both widths, rank 1 on
/// rank 0's words (blocking calls).
fn semantics(c: &mut Ctx) -> Result<(), String> {
    if c.rank() == 0 {
        c.region.atomic_u64(WORDS as usize).store(10, SeqCst);
        c.region.atomic_u64(WORDS as usize + 8).store(0x5555_5555_0000_0000 | 0xFFFF_FFFE, SeqCst);
    }
    c.sync("sem-init")?;
    if c.rank() == 1 {
        let to = c.eps[0];
        let w64 = c.word(0, WORDS, Width::W64);
        let w32 = c.word(0, WORDS + 8, Width::W32);
        let steps: [(&str, u64, u64); 7] = [
            ("64-bit CAS miss", c.dev.cmp_swap(to, w64, 11, 99).map_err(e)?, 10),
            ("64-bit CAS hit", c.dev.cmp_swap(to, w64, 10, 99).map_err(e)?, 10),
            ("64-bit swap", c.dev.swap(to, w64, u64::MAX).map_err(e)?, 99),
            ("64-bit fetch-add wraps", c.dev.fetch_add(to, w64, 2).map_err(e)?, u64::MAX),
            ("32-bit fetch-add wraps", c.dev.fetch_add(to, w32, 3).map_err(e)?, 0xFFFF_FFFE),
            ("32-bit CAS hit", c.dev.cmp_swap(to, w32, 1, 7).map_err(e)?, 1),
            ("32-bit swap", c.dev.swap(to, w32, 8).map_err(e)?, 7),
        ];
        for (what, got, want) in steps {
            if got != want {
                return Err(format!("{what}: old {got:#x}, expected {want:#x}"));
            }
        }
    }
    c.sync("sem-done")?;
    if c.rank() == 0 {
        let (a, b) =
            (c.region.atomic_u64(WORDS as usize).load(SeqCst), c.region.atomic_u64(WORDS as usize + 8).load(SeqCst));
        if a != 1 || b != 0x5555_5555_0000_0008 {
            return Err(format!("words {a:#x} {b:#x}: the 32-bit ops must leave the upper half alone"));
        }
    }
    Ok(())
}

/// What the NIC refuses, and what the library refuses before posting.
fn refusals(c: &mut Ctx) -> Result<(), String> {
    c.sync("ref")?;
    if c.rank() != 1 {
        return Ok(());
    }
    let to = c.eps[0];
    // Rank 0's key with an offset beyond its page-sized region.
    let beyond = c.word(0, 4096, Width::W64);
    match c.dev.fetch_add(to, beyond, 1) {
        Err(Error::Failed(Status::RemoteAccessError)) => {}
        r => return Err(format!("beyond the region: {r:?}")),
    }
    // Rank 1's own key is no key of rank 0's.
    let foreign_key = RemoteKey { key: c.keys[1].key ^ 0x0100_0000, ..c.keys[1] };
    let foreign = RemoteWord { key: foreign_key, offset: 0, width: Width::W64 };
    match c.dev.swap(to, foreign, 1) {
        Err(Error::Failed(Status::RemoteAccessError)) => {}
        r => return Err(format!("unknown key: {r:?}")),
    }
    // Rank 0's key with a wrong secret.
    let guessed = RemoteKey { secret: c.keys[0].secret ^ 1, ..c.keys[0] };
    match c.dev.swap(to, RemoteWord { key: guessed, offset: 0, width: Width::W64 }, 1) {
        Err(Error::Failed(Status::RemoteAccessError)) => {}
        r => return Err(format!("wrong secret: {r:?}")),
    }
    match c.dev.fetch_add(to, c.word(0, 4, Width::W64), 1) {
        Err(Error::InvalidArgument(_)) => {}
        r => return Err(format!("misaligned: {r:?}")),
    }
    // The library's check bypassed: the NIC refuses the descriptor itself.
    let mut d = emp_uapi::desc::WorkDesc {
        wr_id: 77,
        opcode: Opcode::AtomicFetchAdd as u8,
        flags: 1,
        num_sge: 2,
        node: to.node,
        port: to.port,
        tag: 1,
        ..Default::default()
    };
    d.sge[0] = c.results.sge(0, 8);
    d.sge[1] = emp_uapi::desc::RemoteSge { key: c.keys[0].key, secret: c.keys[0].secret, offset: 4 }.to_sge();
    c.dev.post_raw(true, &d).map_err(e)?;
    let wc = wait_for(&mut c.dev, 77, T)?;
    if wc.status != Status::BadDescriptor {
        return Err(format!("misaligned raw descriptor: {}", wc.status.as_str()));
    }
    Ok(())
}

/// The MCS lock serialises a read-modify-write made of two separate
/// remote operations (read with fetch-add 0, write with swap): no update
/// may be lost, and no two ranks may be inside at once.
fn mcs_lock(c: &mut Ctx) -> Result<(), String> {
    let mut lock = McsLock::create(&mut c.dev, &c.job, "tap", 0).map_err(e)?;
    let (home, counter) = lock.user_word(0, 0);
    let (_, inside) = lock.user_word(0, 1);
    for i in 0..LOCKS {
        lock.acquire(&mut c.dev).map_err(e)?;
        let others = c.dev.fetch_add(home, inside, 1).map_err(e)?;
        if others != 0 {
            return Err(format!("acquisition {i}: {others} other holders inside"));
        }
        let v = c.dev.fetch_add(home, counter, 0).map_err(e)?;
        std::thread::yield_now(); // widen the window a lost update would need
        c.dev.swap(home, counter, v + 1).map_err(e)?;
        c.dev.fetch_add(home, inside, u64::MAX).map_err(e)?;
        lock.release(&mut c.dev).map_err(e)?;
    }
    c.sync("mcs")?;
    let total = c.dev.fetch_add(home, counter, 0).map_err(e)?;
    let want = LOCKS * c.job.size as u64;
    if total != want {
        return Err(format!("counter {total} after {want} locked increments: updates lost"));
    }
    Ok(())
}

/// The baseline: rank 0's CPU serves fetch-adds sent as messages.
fn host_served(c: &mut Ctx) -> Result<(), String> {
    if c.rank() == 0 {
        let words = c.dev.alloc(64).map_err(e)?;
        let mut server = HostAtomicServer::new(&mut c.dev, words, 16).map_err(e)?;
        c.sync("host")?;
        let want = HOST_ADDS * (c.job.size as u64 - 1);
        while server.served() < want {
            if !server.serve_one(&mut c.dev, Some(T)).map_err(e)? {
                return Err(format!("served {} of {want} requests", server.served()));
            }
        }
        let total = server.words().atomic_u64(0).load(SeqCst);
        return if total == want { Ok(()) } else { Err(format!("host-served counter {total}, expected {want}")) };
    }
    let mut client = HostAtomicClient::new(&mut c.dev).map_err(e)?;
    c.sync("host")?;
    let mut last = None;
    for _ in 0..HOST_ADDS {
        let old = client.fetch_add(&mut c.dev, c.eps[0], 0, Width::W64, 1).map_err(e)?;
        if last.is_some_and(|l| l >= old) {
            return Err(format!("host fetch-add returned {old} after {last:?}"));
        }
        last = Some(old);
    }
    Ok(())
}

fn main() {
    let (job, mut dev, eps) = emp_tests::tap_start("tap-atomics", 2, emp_tests::WithoutRendezvous::Refuse);
    let quiet = job.rank != 0;
    let region = dev.alloc_mr(4096, MR_REMOTE_ATOMIC).expect("atomic region");
    let mine = region.remote_key().as_u64().to_string();
    let keys = job
        .exchange("atomic-keys", &mine, T)
        .expect("key exchange")
        .iter()
        .map(|k| RemoteKey::from_u64(k.parse().expect("key")))
        .collect();
    let results = dev.alloc(4096).expect("arena");
    let mut c = Ctx { dev, job, eps, region, keys, results };
    type Check = fn(&mut Ctx) -> Result<(), String>;
    let tests: [(&str, Check); 5] = [
        ("every rank fetch-adds one word of rank 0: total exact, olds in order", hammer),
        ("CAS hit/miss, swap, fetch-add at 32 and 64 bits", semantics),
        ("out of bounds, unknown key, misaligned refused", refusals),
        ("MCS lock: locked read-modify-writes lose no update", mcs_lock),
        ("host-based baseline: rank 0's CPU serves fetch-adds", host_served),
    ];
    emp_tests::run_tap(quiet, &mut c, &tests, |c, name| {
        let _ = c.sync(name);
    });
}
