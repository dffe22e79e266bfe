//! Reliable broadcast over the simulator's multicast switch (seed 002):
//! every member delivers every broadcast exactly once, in root order,
//! intact, under loss, duplication, reordering and a partition, with the
//! window, credits and co-roots as the paper has them; windows and credits
//! stay within their bounds at every step; nothing is held at quiesce.
//! Two tests break the mechanism on purpose and check the scenario then
//! fails: co-roots that never repair, and ACKs that ignore the skew.

use std::cell::RefCell;
use std::rc::Rc;

use emp_firmware::Config;
use emp_sim::cluster::{binomial_parents, binomial_parents_wide, Cluster};
use emp_sim::world::{Partition, WireConfig};
use emp_uapi::coll::{rbcast_tag, RbcastAlgo};
use emp_uapi::desc::{Opcode, Status};
use emp_uapi::sram::admin_result;
use emp_uapi::wire::{rbcast_kind, rbcast_payload_max, Frame};

const MS: u64 = 1_000_000;

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed.wrapping_mul(7)) as u8 ^ (seed >> 8) as u8).collect()
}

fn group(n: u16, cfg: Config, wire: WireConfig, seed: u64) -> Cluster {
    let mut c = Cluster::new(n, cfg, 0, 1500, wire);
    c.world.reseed(seed);
    let members: Vec<u16> = (0..n).collect();
    // Past 64 members the group takes several table entries (wide form).
    let r = if n > 64 {
        c.create_group_wide(0, 7, 1, &members, &[binomial_parents_wide(n as usize)])
    } else {
        c.create_group(0, 7, 1, &members, &[binomial_parents(n as usize)])
    };
    assert!(r.iter().all(|&r| r == admin_result::OK), "group of {n}: {r:?}");
    c
}

/// One scenario: `count` broadcasts, root of broadcast i `root(i)`,
/// posted in batches by every member; checks delivery, order and
/// integrity, the bounds after every step, and quiescence.
struct Scenario {
    n: u16,
    count: u32,
    algo: RbcastAlgo,
    wire: WireConfig,
    cfg: Config,
    seed: u64,
    batch: u32,
    len: usize,
    roots: fn(u32, u16) -> u16,
    limit_ns: u64,
}

impl Scenario {
    fn new(n: u16, count: u32) -> Scenario {
        Scenario {
            n,
            count,
            algo: RbcastAlgo { coroots: 0, ack_every: 1, window: 0, nak: false },
            wire: WireConfig { loss: 0.0, dup: 0.0, reorder: 0.0, ..WireConfig::default() },
            cfg: Config::default(),
            seed: 1,
            batch: 8,
            len: 200,
            roots: |_, _| 0,
            limit_ns: 60_000 * MS,
        }
    }

    /// Runs it; `Err` says what went wrong (a test may expect that).
    fn run(&self) -> Result<Cluster, String> {
        self.run_timed().map(|(c, _)| c)
    }

    /// As [`Scenario::run`], with the time the last broadcast completed.
    fn run_timed(&self) -> Result<(Cluster, u64), String> {
        let mut c = group(self.n, self.cfg, self.wire.clone(), self.seed);
        let tag = rbcast_tag(self.algo);
        let (slots, window) = (self.cfg.rbcast_rx_slots as i64, self.cfg.rbcast_window as usize);
        let single_root = (0..self.count).all(|i| (self.roots)(i, self.n) == (self.roots)(0, self.n));
        let end = c.world.now + self.limit_ns;
        let mut done = 0u32;
        while done < self.count {
            let batch: Vec<u32> = (done..(done + self.batch).min(self.count)).collect();
            // wr ids per (broadcast, member)
            let mut wrs: Vec<Vec<u64>> = Vec::new();
            for &i in &batch {
                let root = (self.roots)(i, self.n);
                let data = pattern(self.len + (i as usize % 7), i);
                wrs.push((0..self.n).map(|m| c.rbcast(m, 0, root, tag, &data, m == root)).collect());
            }
            let mut got: Vec<Vec<(u64, u8, u32)>> = vec![Vec::new(); self.n as usize];
            let want = batch.len() * self.n as usize;
            let mut seen = 0;
            while seen < want {
                if c.world.now > end || c.step().is_none() {
                    let state: Vec<String> = (0..self.n)
                        .map(|m| {
                            let nic = &c.world.nodes[m as usize].nic;
                            let d = nic.rbcast_delivered(0);
                            format!("{m}: {:?} {d:?} {:?}", nic.rbcast_occupancy(), nic.rbcast_stats())
                        })
                        .collect();
                    return Err(format!(
                        "stuck at broadcast {done}: {seen} of {want} completions by {} ns\n{}",
                        c.world.now,
                        state.join("\n")
                    ));
                }
                for m in 0..self.n {
                    for (cqe, _) in c.take_ready(m) {
                        got[m as usize].push((cqe.wr_id, cqe.status, cqe.byte_len));
                        seen += 1;
                    }
                }
                self.check_bounds(&c, slots, window, single_root)?;
            }
            for m in 0..self.n {
                // Exactly once; receives in posting (= root) order (a
                // root's own post completes at once, ahead of them).
                let own = |wr: &u64| {
                    batch.iter().zip(&wrs).any(|(&i, w)| w[m as usize] == *wr && (self.roots)(i, self.n) == m)
                };
                let order: Vec<u64> = got[m as usize].iter().map(|g| g.0).filter(|wr| !own(wr)).collect();
                let posted: Vec<u64> = wrs.iter().map(|w| w[m as usize]).filter(|wr| !own(wr)).collect();
                if order != posted || got[m as usize].len() != batch.len() {
                    return Err(format!("member {m}: completions {order:?}, posted {posted:?}"));
                }
                for (k, &i) in batch.iter().enumerate() {
                    let wr = wrs[k][m as usize];
                    let &(_, st, len) = got[m as usize].iter().find(|g| g.0 == wr).expect("completed");
                    let data = pattern(self.len + (i as usize % 7), i);
                    if st != Status::Success as u8 || len as usize != data.len() {
                        return Err(format!("member {m} broadcast {i}: status {st} len {len}"));
                    }
                    if m != (self.roots)(i, self.n) && c.received(wrs[k][m as usize], data.len()) != data {
                        return Err(format!("member {m} broadcast {i}: different bytes"));
                    }
                }
            }
            done += batch.len() as u32;
        }
        let finished = c.world.now;
        // Quiesce: the timers run out once every entry is acknowledged.
        while c.world.now < end && c.step().is_some() {
            self.check_bounds(&c, slots, window, single_root)?;
        }
        for m in 0..self.n {
            let nic = &c.world.nodes[m as usize].nic;
            if nic.rbcast_occupancy() != (0, 0, 0) || nic.occupancy().tx_msgs != 0 {
                return Err(format!(
                    "member {m} holds {:?} (window, slots, posted) and {} messages at quiesce",
                    nic.rbcast_occupancy(),
                    nic.occupancy().tx_msgs
                ));
            }
            // Per root, the sequence numbers delivered: one per fragment.
            let delivered: u32 = nic.rbcast_delivered(0).unwrap().iter().sum();
            let frame = rbcast_payload_max(1500);
            let want: u32 = (0..self.count)
                .filter(|&i| (self.roots)(i, self.n) != m)
                .map(|i| (self.len + i as usize % 7).div_ceil(frame).max(1) as u32)
                .sum();
            if delivered != want {
                return Err(format!("member {m} delivered {delivered} fragments, {want} sent to it"));
            }
        }
        Ok((c, finished))
    }

    /// Windows and credits within their bounds.
    fn check_bounds(&self, c: &Cluster, slots: i64, window: usize, single_root: bool) -> Result<(), String> {
        for m in 0..self.n {
            let nic = &c.world.nodes[m as usize].nic;
            let (w, s, p) = nic.rbcast_occupancy();
            if w > window || s > slots as usize || p > self.cfg.rbcast_posted_max as usize {
                return Err(format!("member {m}: window {w}/{window}, slots {s}/{slots}, posted {p}"));
            }
        }
        if single_root {
            let root = (self.roots)(0, self.n);
            let nic = &c.world.nodes[root as usize].nic;
            let sent = nic.rbcast_stats().sent as i64;
            let s = emp_firmware::rbcast::sub_group_size(self.n, self.algo.coroots);
            for m in 1..s.min(self.n) {
                let m = (root + m) % self.n;
                let (credit, _) = nic.rbcast_credit(0, m).unwrap();
                if !(0..=slots).contains(&credit) {
                    return Err(format!("root's credit for {m} is {credit}, bound {slots}"));
                }
                // What the root may have outstanding at m: its credits.
                let delivered = c.world.nodes[m as usize].nic.rbcast_delivered(0).unwrap()[root as usize] as i64;
                if sent - delivered > slots {
                    return Err(format!("root sent {sent}, member {m} delivered {delivered}: beyond {slots} buffers"));
                }
            }
        }
        Ok(())
    }
}

fn lossy(loss: f64) -> WireConfig {
    WireConfig { loss, dup: 0.05, reorder: 0.2, ..WireConfig::default() }
}

#[test]
fn clean_wire_every_member_delivers_in_order() {
    for n in [2u16, 3, 8] {
        let s = Scenario::new(n, 40);
        let c = s.run().unwrap_or_else(|e| panic!("n {n}: {e}"));
        let st = c.world.nodes[0].nic.rbcast_stats();
        assert_eq!(st.sent, 40);
        assert_eq!(st.repairs, 0, "nothing lost, nothing repaired");
        // One transmission per broadcast, whatever n.
        assert_eq!(c.world.stats.mcast_sent, 40);
    }
}

#[test]
fn loss_duplication_reordering_2_to_64_nodes() {
    let mut seed = 10;
    for n in [2u16, 5, 16, 33, 64] {
        for loss in [0.0, 0.05, 0.2] {
            for coroots in [0u16, 3] {
                seed += 1;
                let mut s = Scenario::new(n, 24);
                s.wire = lossy(loss);
                s.seed = seed;
                s.algo = RbcastAlgo { coroots: coroots.min(n - 1), ack_every: 3, window: 0, nak: false };
                s.run().unwrap_or_else(|e| panic!("n {n} loss {loss} coroots {coroots} seed {seed}: {e}"));
            }
        }
    }
}

#[test]
fn rotating_roots_with_co_roots_under_loss() {
    for (n, seed) in [(6u16, 3u64), (17, 4), (32, 5)] {
        let mut s = Scenario::new(n, 30);
        s.wire = lossy(0.1);
        s.seed = seed;
        s.algo = RbcastAlgo { coroots: 2, ack_every: 2, window: 0, nak: false };
        s.roots = |i, n| (i as u16 * 5) % n;
        s.run().unwrap_or_else(|e| panic!("n {n}: {e}"));
    }
}

#[test]
fn a_partition_heals_and_every_member_catches_up() {
    let n = 12u16;
    let mut s = Scenario::new(n, 40);
    let side: Vec<bool> = (0..n).map(|m| m >= 7).collect();
    s.wire = WireConfig { partition: Some(Partition { start_ns: 0, end_ns: 30 * MS, side }), ..lossy(0.05) };
    s.algo = RbcastAlgo { coroots: 2, ack_every: 4, window: 0, nak: false };
    let c = s.run().unwrap_or_else(|e| panic!("{e}"));
    assert!(c.world.stats.partitioned > 0, "the partition cut something");
    let repairs: u64 = (0..n).map(|m| c.world.nodes[m as usize].nic.rbcast_stats().repairs).sum();
    assert!(repairs > 0, "the far side was repaired over the reliable path");
}

#[test]
fn a_small_window_and_few_credits_stall_the_root_but_lose_nothing() {
    let mut s = Scenario::new(9, 60);
    s.cfg.rbcast_window = 2;
    s.cfg.rbcast_rx_slots = 3;
    s.batch = 20;
    s.wire = lossy(0.1);
    s.algo = RbcastAlgo { coroots: 1, ack_every: 2, window: 0, nak: false };
    let c = s.run().unwrap_or_else(|e| panic!("{e}"));
    let st = c.world.nodes[0].nic.rbcast_stats();
    assert!(st.window_full + st.credit_stalls > 0, "the root had to wait: {st:?}");
}

#[test]
fn the_per_call_window_limit_is_honoured() {
    let mut s = Scenario::new(4, 30);
    s.batch = 30;
    s.algo = RbcastAlgo { coroots: 0, ack_every: 1, window: 1, nak: false };
    s.cfg.rbcast_ack_delay_ns = 5 * MS;
    let c = s.run().unwrap_or_else(|e| panic!("{e}"));
    assert!(c.world.nodes[0].nic.rbcast_stats().window_full > 0);
}

/// Fault injection: co-roots that never retransmit. Members of their
/// sub-groups that lose a multicast never get it, so the same scenario
/// that passes with repairs must fail without them.
#[test]
fn co_roots_that_do_not_repair_break_delivery() {
    let scenario = |repair: bool| {
        let mut s = Scenario::new(12, 30);
        s.wire = lossy(0.15);
        s.seed = 77;
        s.algo = RbcastAlgo { coroots: 3, ack_every: 1, window: 0, nak: false };
        s.cfg.rbcast_coroot_repair = repair;
        s.limit_ns = 3_000 * MS;
        s.run()
    };
    scenario(true).unwrap_or_else(|e| panic!("with repairs: {e}"));
    let err = scenario(false).err().expect("without co-root repairs the scenario must fail");
    assert!(err.contains("stuck") || err.contains("holds"), "{err}");
}

/// Lazy ACKs (§4.4): with ACK every M and the skew B mod M = i mod M, a
/// clean run sends about (n - 1) / M ACKs per broadcast, spread so that
/// no broadcast draws more than ceil((n - 1) / M) of them. Ignoring M
/// (ACK every message) or the skew (everyone at B mod M = 0) fails this.
#[test]
fn skewed_ack_every_m_spreads_the_acks() {
    let (n, m, count) = (16u16, 4u8, 64u32);
    let log: Rc<RefCell<Vec<(u16, u32)>>> = Rc::default();
    let mut s = Scenario::new(n, count);
    s.algo = RbcastAlgo { coroots: 0, ack_every: m, window: 0, nak: false };
    // Owed ACKs wait long: only the skewed ones go during the run.
    s.cfg.rbcast_ack_delay_ns = 1_000 * MS;
    s.cfg.rbcast_rto_ns = 2_000 * MS;
    s.cfg.rbcast_rx_slots = 64;
    s.batch = 16;
    let mut c = group(n, s.cfg, s.wire.clone(), 1);
    let l = log.clone();
    c.world.drop_filter = Some(Box::new(move |src, _dst, b: &[u8]| {
        if let Ok(Frame::Rbcast { body, .. }) = Frame::parse(b) {
            if body.kind == rbcast_kind::ACK {
                l.borrow_mut().push((src, body.seq));
            }
        }
        false
    }));
    let tag = rbcast_tag(s.algo);
    for i in 0..count {
        let data = pattern(100, i);
        let wrs: Vec<(u16, u64)> = (0..n).map(|r| (r, c.rbcast(r, 0, 0, tag, &data, r == 0))).collect();
        for (r, cqe) in c.wait_all(&wrs, 500 * MS).into_iter().enumerate() {
            assert_eq!(cqe.map(|c| c.status), Some(Status::Success as u8), "broadcast {i} member {r}");
        }
    }
    let acks = log.borrow().clone();
    // Each ACK is the member's turn: it covers message B = seq - 1 with B mod M = i mod M.
    for &(src, seq) in &acks {
        assert_eq!((seq - 1) % m as u32, src as u32 % m as u32, "member {src} ACKed at {seq}: not its turn");
    }
    let per_bcast = (n as u32 - 1).div_ceil(m as u32) as usize;
    for b in 0..count {
        let k = acks.iter().filter(|&&(_, seq)| seq == b + 1).count();
        assert!(k <= per_bcast, "broadcast {b} drew {k} ACKs, skew allows {per_bcast}");
    }
    let expect = (count as usize * (n as usize - 1)).div_ceil(m as usize);
    assert!(
        acks.len() <= expect + n as usize && acks.len() + n as usize >= expect,
        "{} ACKs for {count} broadcasts to {} members, lazy ACK expects about {expect}",
        acks.len(),
        n - 1
    );
    assert_eq!(c.world.nodes[0].nic.rbcast_stats().repairs, 0, "nothing was taken for lost");
}

#[test]
fn bad_requests_are_refused_with_a_clear_status() {
    let mut c =
        group(3, Config::default(), WireConfig { loss: 0.0, dup: 0.0, reorder: 0.0, ..WireConfig::default() }, 1);
    let tag = rbcast_tag(RbcastAlgo::default());
    // More fragments than the window (16 entries) holds: the tree's job.
    let too_large = 16 * rbcast_payload_max(1500) + 1;
    let wr = c.rbcast(0, 0, 0, tag, &vec![1u8; too_large], true);
    assert_eq!(c.wait(0, wr, 10 * MS).map(|q| q.status), Some(Status::TooLarge as u8));
    // ... and than the call's own window limit.
    let wr = c.rbcast(0, 0, 0, rbcast_tag(RbcastAlgo { window: 2, ..Default::default() }), &[1u8; 3000], true);
    assert_eq!(c.wait(0, wr, 10 * MS).map(|q| q.status), Some(Status::TooLarge as u8));
    // No such group slot.
    let wr = c.rbcast(0, 5, 0, tag, &[1, 2, 3], true);
    assert_eq!(c.wait(0, wr, 10 * MS).map(|q| q.status), Some(Status::GroupInvalid as u8));
    // More co-roots than members.
    let wr = c.rbcast(0, 0, 0, rbcast_tag(RbcastAlgo { coroots: 3, ..Default::default() }), &[1], true);
    assert_eq!(c.wait(0, wr, 10 * MS).map(|q| q.status), Some(Status::BadDescriptor as u8));
    // Nothing was lost: a good broadcast still goes through.
    let data = pattern(64, 9);
    let wrs: Vec<(u16, u64)> = (0..3).map(|r| (r, c.rbcast(r, 0, 0, tag, &data, r == 0))).collect();
    for (r, cqe) in c.wait_all(&wrs, 100 * MS).into_iter().enumerate() {
        assert_eq!(cqe.map(|c| c.status), Some(Status::Success as u8), "member {r}");
        if r > 0 {
            assert_eq!(c.received(wrs[r].1, 64), data);
        }
    }
    let _ = Opcode::Rbcast;
}

/// A swarm: every knob drawn from the seed (members 2–256, loss, duplication,
/// reordering, a partition, co-roots, M, windows, credits, roots, sizes).
/// A failure names its seed; `EMP_SIM_RBCAST_SEEDS` sets how many run.
#[test]
fn swarm_of_seeded_scenarios() {
    let first: u64 = std::env::var("EMP_SIM_RBCAST_FIRST").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let seeds: u64 = std::env::var("EMP_SIM_RBCAST_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(70);
    let huge = std::env::var_os("EMP_SIM_RBCAST_HUGE").is_some();
    for seed in first..first + seeds {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut draw = |k: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % k
        };
        // One scenario in eight is a wide group (65–256 members); with
        // `EMP_SIM_RBCAST_HUGE` set, one in sixteen 257–1024 members (slow).
        let n = match draw(16) {
            0 if huge => 257 + draw(768) as u16,
            0 | 1 => 65 + draw(192) as u16,
            _ => 2 + draw(63) as u16,
        };
        let mut s = Scenario::new(n, 8 + draw(24) as u32);
        s.seed = seed;
        let loss = draw(21) as f64 / 100.0;
        s.wire = WireConfig {
            loss,
            dup: draw(11) as f64 / 100.0,
            reorder: draw(31) as f64 / 100.0,
            ..WireConfig::default()
        };
        if draw(4) == 0 {
            let side: Vec<bool> = (0..n).map(|_| draw(2) == 1).collect();
            let start = draw(5) * MS;
            s.wire.partition = Some(Partition { start_ns: start, end_ns: start + (1 + draw(20)) * MS, side });
        }
        s.algo = RbcastAlgo {
            coroots: draw(n.min(9) as u64) as u16,
            ack_every: 1 + draw(10) as u8,
            window: draw(3) as u8 * draw(9) as u8,
            // One in three: NAK-based or hybrid (§9).
            nak: draw(3) == 0,
        };
        if s.algo.nak && draw(2) == 0 {
            s.algo.ack_every = 0;
        }
        s.cfg.rbcast_window = 1 + draw(16) as u32;
        s.cfg.rbcast_rx_slots = 1 + draw(24) as u32;
        s.batch = 1 + draw(16) as u32;
        // Up to as many fragments as the window and the slots take (§4.5).
        let limit = match s.algo.window {
            0 => s.cfg.rbcast_window,
            w => (w as u32).min(s.cfg.rbcast_window),
        }
        .min(s.cfg.rbcast_rx_slots) as usize;
        let frame = rbcast_payload_max(1500);
        s.len = if draw(3) == 0 { draw((limit * frame - 6) as u64) as usize } else { draw(frame as u64 - 6) as usize };
        if draw(2) == 0 {
            s.roots = |i, n| (i as u16 * 7 + 3) % n;
        }
        s.run().unwrap_or_else(|e| {
            panic!(
                "seed {seed}: n {n} loss {loss} algo {:?} window {} slots {} batch {}: {e}",
                s.algo, s.cfg.rbcast_window, s.cfg.rbcast_rx_slots, s.batch
            )
        });
    }
}

/// Groups wider than a 64-bit member set (§7's scale): the root alone
/// collects 255 ACKs (its pending set spans four words), then co-roots
/// split the ACKs, with roots that rotate, under loss.
#[test]
fn wide_groups_of_128_and_256_members_under_loss() {
    for (n, coroots, ack_every, seed) in
        [(128u16, 0u16, 1u8, 21u64), (128, 15, 4, 22), (256, 0, 8, 23), (256, 31, 2, 24)]
    {
        let mut s = Scenario::new(n, 10);
        s.wire = lossy(0.05);
        s.seed = seed;
        s.batch = 5;
        s.algo = RbcastAlgo { coroots, ack_every, window: 0, nak: false };
        if coroots != 0 {
            s.roots = |i, n| (i as u16 * 37 + n - 1) % n;
        }
        let c = s.run().unwrap_or_else(|e| panic!("n {n} coroots {coroots} seed {seed}: {e}"));
        let repairs: u64 = (0..n).map(|m| c.world.nodes[m as usize].nic.rbcast_stats().repairs).sum();
        assert!(repairs > 0, "n {n}: 5 % loss over {n} receivers must need repairs");
    }
}

/// 1024 members (the paper's §7 scale), 128 co-roots (its optimum), ranks
/// beyond a byte on the wire. Slow in a debug build: run with
/// `cargo test -p emp-sim --release --test rbcast -- --ignored`.
#[test]
#[ignore]
fn a_1024_member_group_with_128_co_roots() {
    for (coroots, roots) in [(128u16, (|_, _| 0) as fn(u32, u16) -> u16), (0, |i, n| (i as u16 * 301 + n - 1) % n)] {
        let mut s = Scenario::new(1024, 6);
        s.wire = lossy(0.02);
        s.seed = 31;
        s.batch = 3;
        s.algo = RbcastAlgo { coroots, ack_every: 8, window: 0, nak: false };
        s.roots = roots;
        s.run().unwrap_or_else(|e| panic!("coroots {coroots}: {e}"));
    }
}

/// Large messages (§4.2 / §5.1): split into MTU fragments, each its own
/// window entry with its own sequence number, reassembled in order,
/// exactly once, under loss, duplication and reordering, with and without
/// co-roots, fragments of several roots interleaved.
#[test]
fn large_messages_travel_as_fragments_under_loss() {
    let frame = rbcast_payload_max(1500);
    let mut seed = 40;
    for n in [2u16, 5, 16, 40] {
        for (len, loss) in [(frame + 1, 0.0), (5_000, 0.1), (16 * frame - 6, 0.2)] {
            seed += 1;
            let mut s = Scenario::new(n, 10);
            s.len = len;
            s.seed = seed;
            s.wire = lossy(loss);
            s.batch = 4;
            s.algo = RbcastAlgo { coroots: n / 5, ack_every: 2, window: 0, nak: false };
            if n > 2 {
                s.roots = |i, n| (i as u16 * 3) % n;
            }
            let c = s.run().unwrap_or_else(|e| panic!("n {n} len {len} loss {loss} seed {seed}: {e}"));
            let frags = (len + 6).div_ceil(frame) as u64;
            let sent: u64 = (0..n).map(|m| c.world.nodes[m as usize].nic.rbcast_stats().sent).sum();
            let fragmented: u64 = (0..n).map(|m| c.world.nodes[m as usize].nic.rbcast_stats().fragmented).sum();
            assert_eq!(fragmented, 10, "every broadcast was fragmented");
            assert!(sent >= 10 * (frags - 1) && sent <= 10 * frags, "{sent} fragments for 10 x {len} bytes");
        }
    }
}

/// A 12-fragment broadcast through a 4-entry per-call window limit on a
/// 16-entry window does not fit (refused, nothing sent); through the whole
/// window it does, and a small window with few credits only stalls it.
#[test]
fn fragments_stall_the_root_on_window_and_credits_but_lose_nothing() {
    let frame = rbcast_payload_max(1500);
    let mut s = Scenario::new(6, 12);
    s.cfg.rbcast_window = 6;
    s.cfg.rbcast_rx_slots = 6;
    s.len = 5 * frame;
    s.batch = 12;
    s.wire = lossy(0.1);
    s.algo = RbcastAlgo { coroots: 1, ack_every: 3, window: 0, nak: false };
    let c = s.run().unwrap_or_else(|e| panic!("{e}"));
    let st = c.world.nodes[0].nic.rbcast_stats();
    assert!(st.window_full + st.credit_stalls > 0, "6 fragments through 6 entries must wait: {st:?}");
}

/// The swarm's knobs on groups of 257–1024 members (beyond any 256-bit
/// member set, up to the paper's §7 scale): loss, duplication,
/// reordering, co-roots, M, NAKs, rotating roots. A few seeds here; the
/// swarm draws such groups too with `EMP_SIM_RBCAST_HUGE=1`.
#[test]
fn huge_groups_of_257_to_1024_members_under_loss() {
    let cases: [(u16, u16, u8, bool, u64); 3] =
        [(300, 7, 0, true, 61), (517, 63, 2, true, 62), (1024, 255, 8, false, 64)];
    for (n, coroots, ack_every, nak, seed) in cases {
        let mut s = Scenario::new(n, 4);
        s.wire = WireConfig { loss: 0.03, dup: 0.02, reorder: 0.1, ..WireConfig::default() };
        s.seed = seed;
        s.batch = 2;
        s.len = 64;
        s.algo = RbcastAlgo { coroots, ack_every, window: 0, nak };
        s.roots = |i, n| (i as u16 * 211 + n - 1) % n;
        let c = s.run().unwrap_or_else(|e| panic!("n {n} coroots {coroots} nak {nak} seed {seed}: {e}"));
        let repairs: u64 = (0..n).map(|m| c.world.nodes[m as usize].nic.rbcast_stats().repairs).sum();
        assert!(repairs > 0, "n {n}: 3 % loss over {n} receivers must need repairs");
    }
}

/// NAK-based and hybrid reliability (the paper's §9): with a timeout far
/// beyond the run, every loss is repaired through a NAK — a gap shown by a
/// later message, or by the root's announcement when the last ones are
/// lost — and the run ends long before one timeout; the ACK-based scheme
/// under the same losses waits for the timeout. Fails if members stop
/// NAKing, collectors stop repairing on a NAK, or roots stop announcing.
#[test]
fn naks_repair_losses_without_waiting_for_the_timeout() {
    let rto = 400 * MS;
    for (n, coroots, ack_every) in [(8u16, 0u16, 0u8), (16, 3, 4), (33, 0, 10)] {
        let run = |nak: bool| {
            let mut s = Scenario::new(n, 24);
            s.wire = WireConfig { loss: 0.08, dup: 0.0, reorder: 0.0, ..WireConfig::default() };
            s.seed = 70 + n as u64;
            s.cfg.rbcast_rto_ns = rto;
            s.batch = 6;
            s.algo = RbcastAlgo { coroots, ack_every: if nak { ack_every } else { ack_every.max(1) }, window: 0, nak };
            let (c, finished) = s.run_timed().unwrap_or_else(|e| panic!("n {n} nak {nak}: {e}"));
            let st: Vec<_> = (0..n).map(|m| c.world.nodes[m as usize].nic.rbcast_stats()).collect();
            let sum = |f: fn(&emp_firmware::rbcast::RbcastStats) -> u64| st.iter().map(f).sum::<u64>();
            (finished, sum(|s| s.repairs), sum(|s| s.nak_repairs), sum(|s| s.naks_sent), sum(|s| s.announces))
        };
        let (t_nak, repairs, nak_repairs, naks, announces) = run(true);
        assert!(naks > 0 && nak_repairs > 0, "n {n}: 8 % loss must be NAKed and repaired: {naks} NAKs, {nak_repairs}");
        assert!(announces > 0, "n {n}: the last broadcasts of a batch are found lost through announcements");
        assert!(repairs >= nak_repairs);
        assert!(t_nak < rto, "n {n}: NAK run took {t_nak} ns, the timeout is {rto}");
        let (t_ack, ..) = run(false);
        assert!(t_ack > rto, "n {n}: the ACK scheme under the same loss waits for the timeout ({t_ack} ns)");
    }
}

/// NAK-based reliability takes far fewer ACK frames than ACK-every-one:
/// members acknowledge only every half window.
#[test]
fn the_nak_scheme_sends_fewer_acks() {
    let acks = |algo: RbcastAlgo| {
        let mut s = Scenario::new(16, 64);
        s.algo = algo;
        s.batch = 16;
        let c = s.run().unwrap_or_else(|e| panic!("{algo:?}: {e}"));
        (0..16).map(|m| c.world.nodes[m as usize].nic.rbcast_stats().acks_sent).sum::<u64>()
    };
    let every = acks(RbcastAlgo { ack_every: 1, ..Default::default() });
    let nak = acks(RbcastAlgo { ack_every: 0, nak: true, ..Default::default() });
    assert!(nak * 4 <= every, "NAK scheme {nak} ACK frames, ACK every one {every}");
}

/// One step of a member's program in [`program_order_scenario`].
#[derive(Clone, Copy, Debug)]
enum Op {
    Rbcast { root: u16, len: usize },
    TreeBcast { root: u16, len: usize },
    Barrier,
}

/// Every member runs the same program of collectives in order, posting
/// each only once its previous one completed, as a blocking MPI program
/// does: a root's reliable broadcast completes at once, so its next
/// collective's messages reach members still waiting for a lost
/// multicast, which refuse them as not ready. A repair must not wait
/// behind those (it once rode the ordered point-to-point stream, and the
/// group deadlocked). Returns an error that names the stuck member.
fn program_order_scenario(n: u16, ops: &[Op], algo: RbcastAlgo, wire: WireConfig, seed: u64) -> Result<(), String> {
    let mut c = group(n, Config::default(), wire, seed);
    let tag = rbcast_tag(algo);
    let mut next = vec![0usize; n as usize];
    // Per member: the op in flight (index, wr id).
    let mut inflight: Vec<Option<(usize, u64)>> = vec![None; n as usize];
    let end = c.world.now + 20_000 * MS;
    let data = |i: usize, len: usize| pattern(len, i as u32);
    loop {
        for m in 0..n {
            if inflight[m as usize].is_none() && next[m as usize] < ops.len() {
                let i = next[m as usize];
                let wr = match ops[i] {
                    Op::Rbcast { root, len } => c.rbcast(m, 0, root, tag, &data(i, len), m == root),
                    Op::TreeBcast { root, len } => c.bcast(m, 0, root, 0, &data(i, len), m == root),
                    Op::Barrier => c.barrier(m, 0, emp_uapi::coll::BarrierAlgo::Dissemination, 0),
                };
                inflight[m as usize] = Some((i, wr));
            }
        }
        if next.iter().all(|&k| k == ops.len()) {
            return Ok(());
        }
        if c.world.now > end || c.step().is_none() {
            let at: Vec<String> = (0..n)
                .map(|m| {
                    let nic = &c.world.nodes[m as usize].nic;
                    format!("{m}: at {:?} {:?}", inflight[m as usize].map(|(i, _)| ops[i]), nic.rbcast_stats())
                })
                .collect();
            return Err(format!("stuck at {} ns:\n{}", c.world.now, at.join("\n")));
        }
        for m in 0..n {
            for (cqe, _) in c.take_ready(m) {
                let Some((i, wr)) = inflight[m as usize] else { return Err(format!("member {m}: stray {cqe:?}")) };
                if cqe.wr_id != wr || cqe.status != Status::Success as u8 {
                    return Err(format!("member {m} op {i} {:?}: {cqe:?}", ops[i]));
                }
                let (root, len) = match ops[i] {
                    Op::Rbcast { root, len } | Op::TreeBcast { root, len } => (root, len),
                    Op::Barrier => (m, 0),
                };
                if m != root && c.received(wr, len) != data(i, len) {
                    return Err(format!("member {m} op {i} {:?}: different bytes", ops[i]));
                }
                inflight[m as usize] = None;
                next[m as usize] += 1;
            }
        }
    }
}

/// Reliable broadcasts (every scheme, with and without co-roots) mixed
/// with NIC tree broadcasts and barriers in program order, under loss:
/// no member is ever left waiting for a repair (the deadlock of a repair
/// queued behind a refused collective message).
#[test]
fn reliable_broadcasts_mixed_with_tree_broadcasts_in_program_order_under_loss() {
    let seeds: u64 = std::env::var("EMP_SIM_RBCAST_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(70) / 3;
    for seed in 0..seeds.max(8) {
        let mut x = seed.wrapping_mul(0xA076_1D64_78BD_642F) | 1;
        let mut draw = |k: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % k
        };
        let n = 3 + draw(8) as u16;
        let ops: Vec<Op> = (0..24)
            .map(|_| {
                let root = draw(n as u64) as u16;
                match draw(5) {
                    0 | 1 => Op::Rbcast { root, len: 1 + draw(600) as usize },
                    2 | 3 => Op::TreeBcast { root, len: 1 + draw(4000) as usize },
                    _ => Op::Barrier,
                }
            })
            .collect();
        let algo = RbcastAlgo {
            coroots: draw(n.min(4) as u64) as u16,
            ack_every: 1 + draw(4) as u8,
            window: 0,
            nak: draw(2) == 0,
        };
        let loss = (2 + draw(9)) as f64 / 100.0;
        let wire = WireConfig { loss, dup: 0.02, reorder: 0.05, ..WireConfig::default() };
        program_order_scenario(n, &ops, algo, wire, seed)
            .unwrap_or_else(|e| panic!("seed {seed}: n {n} loss {loss} algo {algo:?}: {e}"));
    }
}
