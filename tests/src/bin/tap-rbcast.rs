//! Reliable broadcast over wire multicast (seed 002) TAP suite: run as 3 or
//! more ranks (`emp run -n N -- tap-rbcast`). Rank 0 prints TAP; every rank
//! exits non-zero on a failure.

use std::time::Duration;

use emp::rdv::Job;
use emp::{Buffer, Device, Group, GroupOpts, RbcastAlgo, Status};
use emp_tests::{expect_ok, wait_for};

const T: Duration = Duration::from_secs(60);

struct Ctx {
    dev: Device,
    job: Job,
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
    /// Largest reliable broadcast at this port's MTU.
    fn max_len(&self) -> usize {
        emp_uapi::wire::rbcast_payload_max(self.dev.info().mtu)
    }
}

fn fill(buf: &mut [u8], seed: usize) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i.wrapping_mul(37) ^ seed.wrapping_mul(11) ^ (i >> 7)) as u8;
    }
}

/// ACK-based (the paper's), then NAK-based and hybrid (its §9).
fn algos(n: usize) -> [RbcastAlgo; 5] {
    [
        RbcastAlgo { coroots: 0, ack_every: 1, window: 0, nak: false },
        RbcastAlgo { coroots: 1, ack_every: 2, window: 4, nak: false },
        RbcastAlgo { coroots: (n - 1) as u16, ack_every: 10, window: 0, nak: false },
        RbcastAlgo { coroots: 0, ack_every: 0, window: 0, nak: true },
        RbcastAlgo { coroots: 1, ack_every: 4, window: 0, nak: true },
    ]
}

fn every_root_size_and_algorithm(c: &mut Ctx) -> Result<(), String> {
    let max = c.max_len();
    for (a, algo) in algos(c.n()).into_iter().enumerate() {
        for root in 0..c.n() {
            for (k, len) in [0usize, 1, 100, max].into_iter().enumerate() {
                let seed = a * 100 + root * 10 + k;
                let is_root = c.rank() == root;
                let buf = if is_root { &mut c.sbuf } else { &mut c.rbuf };
                if is_root {
                    fill(&mut buf.as_mut_slice()[..len], seed);
                } else {
                    buf.as_mut_slice()[..len].fill(0);
                }
                let sges: Vec<emp::Sge> = if len == 0 { vec![] } else { vec![buf.sge(0, len)] };
                c.dev.rbcast(&c.g, root, algo, &sges).map_err(|e| format!("{algo:?} root {root} len {len}: {e}"))?;
                if !is_root {
                    let mut want = vec![0u8; len];
                    fill(&mut want, seed);
                    if c.rbuf.as_slice()[..len] != want[..] {
                        return Err(format!("{algo:?} root {root} len {len}: bytes differ"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Back-to-back broadcasts in flight: the root's complete at once (its
/// NIC holds the data), everyone's in order, each buffer its own message.
/// 96 of them, times `EMP_TAP_RBCAST_ROUNDS` (a longer run, e.g. under
/// `emp gang`).
fn back_to_back_in_order(c: &mut Ctx) -> Result<(), String> {
    let rounds = std::env::var("EMP_TAP_RBCAST_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1usize);
    let (count, len) = (96 * rounds.max(1), 512usize);
    let algo = RbcastAlgo { coroots: 1, ack_every: 4, window: 0, nak: false };
    let mut done = 0;
    while done < count {
        let batch: Vec<usize> = (done..(done + 16).min(count)).collect();
        let mut wrs = Vec::new();
        for &i in &batch {
            let root = i % c.n();
            let at = (i % 32) * len;
            let is_root = c.rank() == root;
            let buf = if is_root { &mut c.sbuf } else { &mut c.rbuf };
            if is_root {
                fill(&mut buf.as_mut_slice()[at..at + len], i);
            }
            let sge = buf.sge(at, len);
            let wr = c.wr();
            c.dev.post_rbcast(wr, &c.g, root, algo, &[sge]).map_err(|e| format!("post {i}: {e}"))?;
            wrs.push((wr, i));
        }
        for (wr, i) in wrs {
            expect_ok(&wait_for(&mut c.dev, wr, T)?)?;
            if c.rank() != i % c.n() {
                let at = (i % 32) * len;
                let mut want = vec![0u8; len];
                fill(&mut want, i);
                if c.rbuf.as_slice()[at..at + len] != want[..] {
                    return Err(format!("broadcast {i}: bytes differ"));
                }
            }
        }
        done += batch.len();
    }
    Ok(())
}

/// One reliable broadcast of `len` bytes from rank 0, checked at every
/// member.
fn bcast_checked(c: &mut Ctx, len: usize, seed: usize) -> Result<(), String> {
    let algo = RbcastAlgo::default();
    let root = c.rank() == 0;
    let buf = if root { &mut c.sbuf } else { &mut c.rbuf };
    if root {
        fill(&mut buf.as_mut_slice()[..len], seed);
    }
    let sge = buf.sge(0, len);
    c.dev.rbcast(&c.g, 0, algo, &[sge]).map_err(|e| format!("{len} bytes: {e}"))?;
    let mut want = vec![0u8; len];
    fill(&mut want, seed);
    if !root && c.rbuf.as_slice()[..len] != want[..] {
        return Err(format!("{len} bytes differ"));
    }
    Ok(())
}

fn too_large_is_refused_and_nothing_is_lost(c: &mut Ctx) -> Result<(), String> {
    let algo = RbcastAlgo::default();
    // Above the window's fragments (16 at most by default, even at the mem
    // wire's jumbo MTU), with the tree threshold out of the way.
    c.g.set_rbcast_threshold(usize::MAX);
    let len = 1 << 20;
    let refused = c.dev.rbcast(&c.g, 0, algo, &[c.rbuf.sge(0, len)]);
    c.g.set_rbcast_threshold(emp::RBCAST_THRESHOLD_DEFAULT);
    match refused {
        Err(emp::Error::Failed(Status::TooLarge)) => {}
        other => return Err(format!("{len} bytes through the window: {other:?}")),
    }
    match c.dev.post_rbcast(1, &c.g, c.n(), algo, &[]) {
        Err(emp::Error::InvalidArgument(_)) => {}
        other => return Err(format!("root beyond the group: {other:?}")),
    }
    // The next ones go through back to back: one frame, three fragments,
    // and above the threshold (by the NIC tree). A member that lost a
    // multicast is repaired off the ordered point-to-point stream, so the
    // root's next collective message, which the member refuses while it
    // waits, cannot hold the repair back (the deadlock this case once had).
    bcast_checked(c, 64, 5)?;
    bcast_checked(c, 2 * c.max_len() + 100, 6)?;
    bcast_checked(c, emp::RBCAST_THRESHOLD_DEFAULT + 4096, 7)
}

fn main() {
    let (job, mut dev, eps) = emp_tests::tap_start("tap-rbcast", 3, emp_tests::WithoutRendezvous::Run);
    let quiet = job.rank != 0;
    let g = match dev.create_group(7, &eps, &GroupOpts::default()) {
        Ok(g) => g,
        Err(e) => {
            println!("TAP version 13\n1..0 # SKIP cannot create a group: {e}");
            std::process::exit(1);
        }
    };
    let sbuf = dev.alloc(1 << 20).expect("arena");
    let rbuf = dev.alloc(1 << 20).expect("arena");
    let mut c = Ctx { dev, job, g, sbuf, rbuf, next_wr: 0 };
    if let Err(e) = c.job.barrier(&mut c.dev, "start") {
        eprintln!("tap-rbcast: start barrier: {e}");
        std::process::exit(2);
    }
    let tests: [emp_tests::TapCase<Ctx>; 3] = [
        ("reliable broadcast: every root, 0 B to one frame, three algorithms", every_root_size_and_algorithm),
        ("back-to-back reliable broadcasts in flight, rotating roots, in order", back_to_back_in_order),
        (
            "too large for the window and a bad root are refused; fragments and the tree above the threshold go through",
            too_large_is_refused_and_nothing_is_lost,
        ),
    ];
    emp_tests::run_tap(quiet, &mut c, &tests, |c, name| {
        let _ = c.job.barrier(&mut c.dev, name);
    });
}
