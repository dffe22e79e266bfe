//! Port context switch (PM §3.4, C1–C8; docs/context-switch.md): ports
//! suspended, saved into host memory, restored (into the same or another
//! slot) and resumed at random moments while messages stream both ways,
//! with loss; every message arrives exactly once, in order, with its
//! bytes, and never at another job's port; a corrupted image is refused
//! and changes nothing.

use emp_firmware::{image_checksum, Config, Occupancy};
use emp_sim::cluster::{binomial_parents_wide, Cluster, SavedContext};
use emp_sim::host::work_desc;
use emp_sim::rng::Rng;
use emp_sim::world::WireConfig;
use emp_uapi::coll::{rbcast_tag, BarrierAlgo, Dtype, RbcastAlgo, ReduceOp};
use emp_uapi::desc::WorkDesc;
use emp_uapi::desc::{Cqe, Opcode, Status, CQE_IMM};
use emp_uapi::sram::{admin_result as ar, AdminOp, PORT_ADDR_EXPLICIT};
use emp_uapi::{Le, ANY_NODE, ANY_PORT};

const MS: u64 = 1_000_000;

fn data(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(31).wrapping_add(seed * 7) as u8).collect()
}

fn status(c: &Cqe) -> Status {
    Status::from_u8(c.status).unwrap()
}

/// Suspends `n`, waits up to `limit_ns` for stability, and saves it;
/// `None` (still suspended) when it did not become stable in time.
fn try_suspend_and_save(c: &mut Cluster, n: u16, limit_ns: u64) -> Option<SavedContext> {
    assert_eq!(c.suspend(n), ar::OK);
    let mut waited = 0;
    while !c.is_stable(n) {
        if waited >= limit_ns {
            return None;
        }
        c.run_for(50_000);
        waited += 50_000;
    }
    Some(c.save(n).unwrap_or_else(|r| panic!("save refused: {r}")))
}

/// Suspends `n`, waits for stability (it must come: its peers run), and saves it.
fn suspend_and_save(c: &mut Cluster, n: u16) -> SavedContext {
    try_suspend_and_save(c, n, 2_000 * MS).unwrap_or_else(|| {
        let slot = c.port_slot(n);
        let nic = &c.world.nodes[n as usize].nic;
        panic!("node {n} never stable ({:?}):\n{}", nic.port_unstable(slot), nic.describe_peers())
    })
}

/// A free slot of `n`, at random (the one it left is free too).
fn free_slot(c: &Cluster, n: u16, rng: &mut Rng) -> u16 {
    let nic = &c.world.nodes[n as usize].nic;
    let free: Vec<u16> = (0..4).filter(|&s| !nic.port_is_open(s)).collect();
    free[rng.below(free.len() as u64) as usize]
}

/// Two ranks stream `msgs` messages (1 B – 20 KB, 1 to 14 frames) to each
/// other while, at random moments, one or both (gang-style) are switched
/// out and back into a random slot. The last [`LATE`] sends of each are
/// posted along the way, and a switch may catch a host half way through
/// writing one (unpublished): it finishes and publishes it after resuming.
/// Returns how many saved images carried queued sends (switched
/// mid-stream), and how many sends a switch caught half written.
fn stream_with_switches(seed: u64, loss: f64, msgs: usize) -> (usize, usize) {
    let wire = WireConfig { loss, dup: loss / 2.0, reorder: loss, ..WireConfig::default() };
    let mut c = Cluster::new(2, Config::default(), 0, 1500, wire);
    let mut rng = Rng::new(seed);
    let lens: Vec<Vec<usize>> = (0..2).map(|_| (0..msgs).map(|_| rng.range(1, 20_000) as usize).collect()).collect();
    // Receives first, every one for any tag: every message finds a
    // receive (no rendezvous), and the i-th receive must take the i-th
    // message (matching in the sender's order).
    let mut recvs = [Vec::new(), Vec::new()];
    for n in 0..2u16 {
        let from = 1 - n;
        for _ in 0..msgs {
            recvs[n as usize].push(c.recv(n, (from, 0), 0, u64::MAX, 20_000));
        }
    }
    let mut sends = [Vec::new(), Vec::new()];
    let send = |c: &mut Cluster, n: usize, i: usize| {
        let (n16, i64) = (n as u16, i as u64);
        c.send(n16, 1 - n16, i64, &data(lens[n][i], seed + i64 * 2 + n as u64))
    };
    let early = msgs.saturating_sub(LATE);
    for i in 0..early {
        for (n, s) in sends.iter_mut().enumerate() {
            s.push(send(&mut c, n, i));
        }
    }
    // The next late message of each node, and (node, descriptor, bytes
    // written) of one caught half written by a switch.
    let mut late = [early, early];
    let mut half_written = 0;
    let mut got: Vec<Vec<Cqe>> = vec![Vec::new(), Vec::new()];
    let mut switches = 0;
    let mut mid_stream = 0;
    let mut aborted = 0;
    let done = |got: &Vec<Vec<Cqe>>| got.iter().all(|g| g.len() == 2 * msgs);
    while !done(&got) {
        assert!(c.world.now < 20_000 * MS, "seed {seed}: stuck, {} and {} completions", got[0].len(), got[1].len());
        c.run_for(rng.range(5_000, 150_000));
        for (n, g) in got.iter_mut().enumerate() {
            g.extend(c.completions(n as u16));
        }
        for n in 0..2 {
            // Late sends go out by themselves once switches are over.
            if late[n] < msgs && (switches >= 8 || rng.chance(0.2)) {
                sends[n].push(send(&mut c, n, late[n]));
                late[n] += 1;
            }
        }
        if done(&got) || switches >= 8 || (switches > 0 && !rng.chance(0.6)) {
            continue;
        }
        switches += 1;
        let who: Vec<u16> = match rng.below(3) {
            0 => vec![0],
            1 => vec![1],
            _ => vec![0, 1],
        };
        // One node alone always becomes stable (its peer runs). A gang may
        // not: when a message was half taken by one member as the other
        // stopped it, the scheduler gives up this switch (restores and
        // resumes everyone) and tries again later.
        let mut saved: Vec<(u16, SavedContext)> = Vec::new();
        let mut gave_up = false;
        let mut suspended = Vec::new();
        let mut unfinished = Vec::new();
        for &n in &who {
            let nu = n as usize;
            if late[nu] < msgs && rng.chance(0.5) {
                // Stopped in the middle of posting: part of the descriptor
                // is in the ring, the producer index not yet moved.
                let i = late[nu];
                let written = rng.range(1, WorkDesc::SIZE as u64) as usize;
                let (wr, bytes) =
                    c.send_unpublished(n, 1 - n, i as u64, &data(lens[nu][i], seed + i as u64 * 2 + n as u64), written);
                sends[nu].push(wr);
                late[nu] += 1;
                unfinished.push((n, bytes, written));
            }
            suspended.push(n);
            let limit = if who.len() == 1 { 2_000 * MS } else { 20 * MS };
            match try_suspend_and_save(&mut c, n, limit) {
                Some(ctx) => saved.push((n, ctx)),
                None if who.len() == 1 => panic!("seed {seed}: node {n} alone never stable"),
                None => {
                    gave_up = true;
                    break;
                }
            }
        }
        aborted += gave_up as usize;
        for (n, ctx) in &saved {
            let image = c.image(*n, ctx);
            mid_stream += (u16::from_le_bytes([image[68], image[69]]) > 0) as usize;
        }
        for (n, g) in got.iter_mut().enumerate() {
            g.extend(c.completions(n as u16));
        }
        // Switched out for a while: peers' frames are refused, not lost.
        c.run_for(rng.range(0, 5 * MS));
        for (n, ctx) in saved {
            let slot = free_slot(&c, n, &mut rng);
            assert_eq!(c.restore(n, &ctx, slot), ar::OK, "restore into slot {slot}");
        }
        for n in suspended {
            assert_eq!(c.resume(n), ar::OK);
        }
        for (n, bytes, written) in unfinished {
            c.finish_unpublished(n, &bytes, written);
            half_written += 1;
        }
    }
    assert!(switches > aborted, "seed {seed}: every switch given up");
    assert_eq!(late, [msgs, msgs], "seed {seed}: late sends left");
    for n in 0..2u16 {
        let from = 1 - n as usize;
        let g = &got[n as usize];
        // Exactly once: one completion per work request.
        let mut seen = std::collections::HashMap::new();
        for cqe in g {
            *seen.entry(cqe.wr_id).or_insert(0) += 1;
        }
        assert!(seen.values().all(|&k| k == 1), "seed {seed}: a completion twice");
        for &s in &sends[n as usize] {
            let cqe = g.iter().find(|x| x.wr_id == s).expect("send completed");
            assert_eq!(status(cqe), Status::Success, "seed {seed}: send");
        }
        // In order: the i-th receive posted took the i-th message sent, with its bytes.
        for (i, &r) in recvs[n as usize].iter().enumerate() {
            let cqe = g.iter().find(|x| x.wr_id == r).expect("receive completed");
            let len = lens[from][i];
            assert_eq!(
                (status(cqe), cqe.tag, cqe.byte_len as usize),
                (Status::Success, i as u64, len),
                "seed {seed}: receive {i}"
            );
            assert_eq!(c.received(r, len), data(len, seed + i as u64 * 2 + from as u64), "seed {seed}: bytes of {i}");
        }
    }
    for n in 0..2 {
        assert!(c.world.nodes[n].nic.parked().is_empty());
        c.world.nodes[n].nic.invariants().unwrap();
    }
    (mid_stream, half_written)
}

/// Sends of each node in [`stream_with_switches`] posted along the way.
const LATE: usize = 4;

/// Seeds per random test (`EMP_CTXSW_SEEDS` overrides; a failure names its seed).
fn seeds() -> u64 {
    std::env::var("EMP_CTXSW_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30)
}

#[test]
fn test_switches_at_random_moments_lose_nothing() {
    let (mid, half): (Vec<usize>, Vec<usize>) = (0..seeds()).map(|seed| stream_with_switches(seed, 0.0, 40)).unzip();
    let (mid, half) = (mid.iter().sum::<usize>(), half.iter().sum::<usize>());
    assert!(mid > 10, "only {mid} switches caught messages queued");
    assert!(half > 10, "only {half} switches caught a send half written");
}

#[test]
fn test_switches_with_loss_lose_nothing() {
    let (mid, half): (Vec<usize>, Vec<usize>) =
        (0..seeds()).map(|seed| stream_with_switches(1_000_000 + seed, 0.03, 40)).unzip();
    let (mid, half) = (mid.iter().sum::<usize>(), half.iter().sum::<usize>());
    assert!(mid > 10, "only {mid} switches caught messages queued");
    assert!(half > 10, "only {half} switches caught a send half written");
}

/// The immediate data message `i` of the eager test carries: none, zero
/// (present, distinct from none) or a value.
fn eager_imm(i: u64) -> Option<u32> {
    match i % 3 {
        0 => None,
        1 => Some(0),
        _ => Some(0xC0DE_0000 | i as u32),
    }
}

/// Small messages that arrived before their receives travel in the image
/// (the eager pool's contents, with their immediate data) and are received
/// after the restore.
#[test]
fn test_unexpected_messages_travel_in_the_image() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let sends: Vec<u64> = (0..5)
        .map(|i| match eager_imm(i) {
            Some(v) => c.send_imm(0, 1, i, &data(100 + i as usize, i), v),
            None => c.send(0, 1, i, &data(100 + i as usize, i)),
        })
        .collect();
    c.run_for(5 * MS);
    assert_eq!(c.world.nodes[1].nic.occupancy().unexp_entries, 5);
    let ctx = suspend_and_save(&mut c, 1);
    assert_eq!(c.world.nodes[1].nic.occupancy().unexp_entries, 0);
    assert_eq!(c.restore(1, &ctx, 2), ar::OK);
    assert_eq!(c.resume(1), ar::OK);
    assert_eq!(c.port_slot(1), 2);
    for i in 0..5u64 {
        let r = c.recv(1, (0, 0), i, 0, 200);
        let cqe = c.wait(1, r, 50 * MS).expect("received after the restore");
        assert_eq!((status(&cqe), cqe.tag, cqe.byte_len), (Status::Success, i, 100 + i as u32));
        assert_eq!((cqe.flags & CQE_IMM != 0).then_some(cqe.imm), eager_imm(i), "message {i}'s immediate data");
        assert_eq!(c.received(r, 100 + i as usize), data(100 + i as usize, i));
    }
    for s in sends {
        assert_eq!(status(&c.wait(0, s, 50 * MS).unwrap()), Status::Success);
    }
}

/// While job A's context is saved, job B runs in A's old slot under its own
/// address: the messages sent to A are refused (and retried), never given
/// to B; A, restored into another slot, receives them all, in order.
#[test]
fn test_another_job_in_the_slot_gets_nothing() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let ctx = suspend_and_save(&mut c, 1);
    // A's address is parked: slot 0 cannot open under it.
    let mut b_refused = c.open_other_job(1, 0, 0).expect_err("the parked address is taken");
    assert_eq!(b_refused, ar::BAD_STATE);
    let mut b = c.open_other_job(1, 0, 9).expect("B opens in A's slot under address 9");
    let layout = c.world.layout;
    for i in 0..8 {
        let d = work_desc(Opcode::Recv as u8, 1000 + i, ANY_NODE, ANY_PORT, 0, u64::MAX, b.data.key, i * 4096, 4096, 1);
        let node = &mut c.world.nodes[1];
        assert!(b.post(&mut node.sram, &layout, &d, false));
        c.world.ring(1);
    }
    let sends: Vec<u64> = (0..10).map(|i| c.send(0, 1, i, &data(3000, i))).collect();
    c.run_for(20 * MS);
    let node = &mut c.world.nodes[1];
    assert!(b.poll_cq(&mut node.sram, &layout, &node.mem).is_none(), "job B received a message of job A");
    assert!(c.counter(1, emp_uapi::sram::counter::NACKS_TX) > 0, "A's messages were refused while it was out");
    // A comes back into slot 2 while B keeps slot 0.
    assert_eq!(c.restore(1, &ctx, 2), ar::OK);
    assert_eq!(c.resume(1), ar::OK);
    for i in 0..10u64 {
        let r = c.recv(1, (0, 0), i, 0, 3000);
        let cqe = c.wait(1, r, 100 * MS).expect("A receives after its restore");
        assert_eq!((status(&cqe), cqe.tag), (Status::Success, i));
        assert_eq!(c.received(r, 3000), data(3000, i));
    }
    for s in sends {
        assert_eq!(status(&c.wait(0, s, 100 * MS).unwrap()), Status::Success);
    }
    let node = &mut c.world.nodes[1];
    assert!(b.poll_cq(&mut node.sram, &layout, &node.mem).is_none());
    b_refused = c.admin(1, AdminOp::PortClose, [0; 6]);
    assert_eq!(b_refused, ar::OK);
}

/// A host stops at any instruction: here half way through writing a send
/// descriptor it has not published yet. Another job then runs in the slot
/// and writes the same ring slots. Back (in its old slot or another), the
/// first job finds both rings as it left them, and the send it finishes
/// and publishes goes out intact. (The VM gang test lost such a send: the
/// NIC ran the other job's bytes, "bad memory key", and the next message
/// matched its receive.)
#[test]
fn test_a_half_written_descriptor_survives_another_job_in_the_slot() {
    const WRITTEN: usize = 40;
    for back_to in [0u16, 2] {
        let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
        // History: five slots of the send ring consumed.
        for i in 0..5 {
            let s = c.send(1, 0, i, &data(100, i));
            let r = c.recv(0, (1, 0), i, 0, 100);
            assert_eq!(status(&c.wait(0, r, 50 * MS).expect("history received")), Status::Success);
            assert_eq!(status(&c.wait(1, s, 50 * MS).expect("history sent")), Status::Success);
        }
        let (wr, bytes) = c.send_unpublished(1, 0, 42, &data(700, 42), WRITTEN);
        let rings = c.ring_bytes(1);
        // The NIC zeroed the slots it consumed: only the half-written one is not.
        let at = 5 * WorkDesc::SIZE;
        assert!(rings[at..at + WRITTEN] == bytes[..WRITTEN]);
        assert!(rings[..at].iter().chain(&rings[at + WRITTEN..]).all(|&x| x == 0), "consumed slots left as they were");
        let ctx = suspend_and_save(&mut c, 1);
        assert!(c.image(1, &ctx).len() >= 84 + emp_firmware::UNPUBLISHED_IMAGE, "the half-written slot travels");
        // Job B opens in the slot: none of A's descriptors are left for it
        // to read. It sends through the same ring slots.
        let mut b = c.open_other_job(1, 0, 9).expect("B opens in the slot");
        assert!(c.ring_bytes(1).iter().all(|&x| x == 0), "back_to {back_to}: B's rings hold A's descriptors");
        let layout = c.world.layout;
        let b_recvs: Vec<u64> = (0..8).map(|i| c.recv(0, (1, 9), 500 + i, 0, 100)).collect();
        for i in 0..8 {
            let d = work_desc(Opcode::Send as u8, 900 + i, 0, 0, 500 + i, 0, b.data.key, i * 100, 100, 1);
            assert!(b.post(&mut c.world.nodes[1].sram, &layout, &d, true));
            c.world.ring(1);
        }
        for r in b_recvs {
            assert_eq!(status(&c.wait(0, r, 50 * MS).expect("B's message")), Status::Success);
        }
        assert_eq!(c.admin(1, AdminOp::PortClose, [0; 6]), ar::OK);
        assert_eq!(c.restore(1, &ctx, back_to), ar::OK);
        assert!(c.ring_bytes(1) == rings, "back_to {back_to}: A's rings are not as it left them");
        assert_eq!(c.resume(1), ar::OK);
        c.finish_unpublished(1, &bytes, WRITTEN);
        let r = c.recv(0, (1, 0), 42, 0, 700);
        let cqe = c.wait(0, r, 50 * MS).expect("the half-written send arrives");
        assert_eq!((status(&cqe), cqe.byte_len), (Status::Success, 700), "back_to {back_to}");
        assert_eq!(c.received(r, 700), data(700, 42));
        assert_eq!(status(&c.wait(1, wr, 50 * MS).expect("its completion")), Status::Success);
    }
}

/// Every corruption of a saved image is refused, and the NIC is left as it
/// was: the slot stays free, the context stays parked, no table changes;
/// the intact image then restores and the job goes on.
#[test]
fn test_corrupted_image_is_refused_and_changes_nothing() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    // State worth saving: a queued send, posted receives, an unexpected message.
    c.send(0, 1, 77, &data(50, 1));
    c.run_for(2 * MS);
    let recvs: Vec<u64> = (0..3).map(|i| c.recv(1, (0, 0), i, 0, 5000)).collect();
    let ctx = suspend_and_save(&mut c, 1);
    let good = c.image(1, &ctx);
    let before: (Occupancy, Vec<(u16, u16)>) = (c.world.nodes[1].nic.occupancy(), c.world.nodes[1].nic.parked());
    let mut rng = Rng::new(5);
    let mut cases: Vec<(String, Vec<u8>, u64)> = Vec::new();
    for _ in 0..40 {
        let mut b = good.clone();
        let at = rng.below(b.len() as u64) as usize;
        b[at] ^= 1 << rng.below(8);
        cases.push((format!("bit flipped at {at}"), b, ctx.len));
    }
    cases.push(("truncated".into(), good.clone(), ctx.len - 1));
    cases.push(("header only".into(), good.clone(), 80));
    cases.push(("shorter than a header".into(), good.clone(), 10));
    // Well formed, checksum fixed, but lying: counts beyond the bytes, a
    // foreign identity, a ring index beyond the ring.
    let fixed = |mut b: Vec<u8>| {
        let sum = image_checksum(&b);
        b[12..16].copy_from_slice(&sum.to_le_bytes());
        b
    };
    let mut b = good.clone();
    b[66..68].copy_from_slice(&u16::MAX.to_le_bytes()); // peers
    cases.push(("peer count too large".into(), fixed(b), ctx.len));
    let mut b = good.clone();
    b[18..20].copy_from_slice(&(ctx.addr + 1).to_le_bytes()); // address
    cases.push(("another context's address".into(), fixed(b), ctx.len));
    let mut b = good.clone();
    b[52..56].copy_from_slice(&1000u32.to_le_bytes()); // send producer
    cases.push(("send producer beyond the ring".into(), fixed(b), ctx.len));
    let mut b = good.clone();
    b[0] ^= 0xFF;
    cases.push(("bad magic".into(), fixed(b), ctx.len));
    for (what, bytes, len) in cases {
        c.write_image(1, &ctx, &bytes);
        let r = c.restore_len(1, &ctx, 1, len);
        assert_ne!(r, ar::OK, "{what}: restored");
        assert!(matches!(r, ar::BAD_IMAGE | ar::NO_ROOM), "{what}: result {r}");
        let nic = &c.world.nodes[1].nic;
        assert!(nic.restore_refusal().is_some(), "{what}: no reason kept");
        assert!(!nic.port_is_open(1), "{what}: the slot opened");
        assert_eq!((nic.occupancy(), nic.parked()), before, "{what}: state changed");
    }
    c.write_image(1, &ctx, &good);
    assert_eq!(c.restore(1, &ctx, 1), ar::OK);
    assert_eq!(c.resume(1), ar::OK);
    let r = c.recv(1, (0, 0), 77, 0, 50);
    assert_eq!(status(&c.wait(1, r, 50 * MS).unwrap()), Status::Success);
    assert_eq!(c.received(r, 50), data(50, 1));
    let sends: Vec<u64> = (0..3).map(|i| c.send(0, 1, i, &data(4000, i + 9))).collect();
    for (i, r) in recvs.into_iter().enumerate() {
        let Some(cqe) = c.wait(1, r, 50 * MS) else {
            panic!(
                "posted receive {i} lost:\n{}\n{}\n{:?}",
                c.world.nodes[1].nic.describe_peers(),
                c.world.nodes[0].nic.describe_peers(),
                c.completions(0)
            );
        };
        assert_eq!((status(&cqe), cqe.tag), (Status::Success, i as u64));
        assert_eq!(c.received(r, 4000), data(4000, i as u64 + 9));
    }
    for s in sends {
        assert_eq!(status(&c.wait(0, s, 50 * MS).unwrap()), Status::Success);
    }
    let _ = PORT_ADDR_EXPLICIT;
}

/// Byte offset of the image header's count of collective ops.
const OPS_COUNT_AT: usize = 74;

fn ops_in_image(image: &[u8]) -> u16 {
    u16::from_le_bytes([image[OPS_COUNT_AT], image[OPS_COUNT_AT + 1]])
}

/// Rank `r`'s allreduce input of round `k`: `COUNT` i64 values.
const COUNT: usize = 16;
fn coll_input(r: u16, k: usize) -> Vec<u8> {
    (0..COUNT).flat_map(|j| ((r as i64 + 1) * 1000 + k as i64 * 7 + j as i64).to_le_bytes()).collect()
}

fn coll_sum(n: u16, k: usize) -> Vec<u8> {
    (0..COUNT)
        .flat_map(|j| (0..n).map(|r| (r as i64 + 1) * 1000 + k as i64 * 7 + j as i64).sum::<i64>().to_le_bytes())
        .collect()
}

/// Suspends every rank (C1), waits up to `limit_ns` until all are stable
/// (C2–C5), and saves them all (C6); `None` when not all became stable
/// (every rank resumed: the switch is put off, as `emp gang` does).
fn gang_save(c: &mut Cluster, n: u16, limit_ns: u64) -> Option<Vec<SavedContext>> {
    for r in 0..n {
        assert_eq!(c.suspend(r), ar::OK);
    }
    let mut waited = 0;
    while !(0..n).all(|r| c.is_stable(r)) {
        if waited >= limit_ns {
            if std::env::var_os("EMP_CTXSW_TRACE").is_some() {
                for r in 0..n {
                    let nic = &c.world.nodes[r as usize].nic;
                    eprintln!("rank {r}: {:?}", nic.port_unstable(c.port_slot(r)));
                }
            }
            for r in 0..n {
                assert_eq!(c.resume(r), ar::OK);
            }
            return None;
        }
        c.run_for(50_000);
        waited += 50_000;
    }
    Some((0..n).map(|r| c.save(r).unwrap_or_else(|e| panic!("rank {r}: stable but save refused: {e}"))).collect())
}

/// After a gang save: parked for a while (peers' frames refused for
/// retry), then every rank restored into a random free slot and resumed.
fn gang_restore(c: &mut Cluster, saved: &[SavedContext], rng: &mut Rng, seed: u64) {
    c.run_for(rng.range(0, 3 * MS));
    for (r, ctx) in saved.iter().enumerate() {
        let slot = free_slot(c, r as u16, rng);
        assert_eq!(
            c.restore(r as u16, ctx, slot),
            ar::OK,
            "seed {seed}: rank {r}: {:?}",
            c.world.nodes[r].nic.restore_refusal()
        );
    }
    for r in 0..saved.len() as u16 {
        assert_eq!(c.resume(r), ar::OK);
    }
}

/// Half the time, at most 12 tries a run: the whole job switched out
/// (`gang_save`, put off when not stable within `stable_ns`), parked and
/// restored (`gang_restore`); an image `caught` says holds an operation
/// in progress counts as a switch mid-operation.
fn maybe_gang_switch(
    c: &mut Cluster,
    n: u16,
    rng: &mut Rng,
    run: &mut CollRun,
    stable_ns: u64,
    caught: fn(&[u8]) -> bool,
    seed: u64,
) {
    if run.switches + run.put_off >= 12 || !rng.chance(0.5) {
        return;
    }
    let Some(saved) = gang_save(c, n, stable_ns) else {
        run.put_off += 1;
        return;
    };
    run.switches += 1;
    for (r, ctx) in saved.iter().enumerate() {
        run.mid_collective += caught(&c.image(r as u16, ctx)) as usize;
    }
    gang_restore(c, &saved, rng, seed);
}

/// After `quiet_ns` more: no rank completes anything twice, none is
/// parked, every NIC's invariants hold.
fn quiesced(c: &mut Cluster, n: u16, quiet_ns: u64, seed: u64) {
    c.run_for(quiet_ns);
    for r in 0..n {
        assert!(c.completions(r).is_empty(), "seed {seed}: rank {r}: a completion twice");
        let nic = &c.world.nodes[r as usize].nic;
        assert!(nic.parked().is_empty(), "seed {seed}: rank {r}: still parked");
        nic.invariants().unwrap_or_else(|e| panic!("seed {seed}: rank {r}: {e}"));
    }
}

/// What a run of collectives under switches saw.
#[derive(Default, Debug)]
struct CollRun {
    switches: usize,
    put_off: usize,
    /// Images that carried collective ops (switched mid-collective).
    mid_collective: usize,
}

impl CollRun {
    fn add(&mut self, r: CollRun) {
        self.switches += r.switches;
        self.put_off += r.put_off;
        self.mid_collective += r.mid_collective;
    }

    /// Switches were made, and some caught a collective in progress.
    fn check(&self) {
        eprintln!("{self:?}");
        assert!(self.switches > 0, "no switch made: {self:?}");
        assert!(self.mid_collective > 0, "no switch caught a collective in progress: {self:?}");
    }
}

/// `n` ranks (one per NIC, one group, binomial tree) run `rounds` rounds
/// of a barrier (algorithm `algo`), an allreduce and a reduce to a rotating
/// root, each rank posting a round as soon as its previous one completed,
/// while at random moments all ranks are switched out together (gang
/// style), parked for a while and restored each into a random free slot.
/// Every operation completes once, successfully, in posting order, with
/// the right result.
fn collectives_with_switches(seed: u64, n: u16, loss: f64, rounds: usize, algo: BarrierAlgo) -> CollRun {
    let wire = WireConfig { loss, dup: loss / 2.0, reorder: loss, ..WireConfig::default() };
    let mut c = Cluster::new(n, Config::default(), 0, 1500, wire);
    let members: Vec<u16> = (0..n).collect();
    let trees = vec![binomial_parents_wide(n as usize)];
    assert!(c.create_group_wide(0, 7, 1, &members, &trees).iter().all(|&r| r == ar::OK));
    let mut rng = Rng::new(seed);
    let mut run = CollRun::default();
    // Per rank: the round it is in and that round's (wr, kind) in posting order.
    let mut round = vec![0usize; n as usize];
    let mut posted: Vec<Vec<(u64, u8)>> = vec![Vec::new(); n as usize];
    let mut seen: Vec<Vec<Cqe>> = vec![Vec::new(); n as usize];
    let post_round = |c: &mut Cluster, r: u16, k: usize| -> Vec<(u64, u8)> {
        let b = c.barrier(r, 0, algo, 0);
        let a = c.reduce(r, 0, true, 0, Dtype::I64, ReduceOp::Sum, 0, &coll_input(r, k));
        let root = (k % n as usize) as u16;
        let d = c.reduce(r, 0, false, root, Dtype::I64, ReduceOp::Sum, 0, &coll_input(r, k + 1));
        vec![(b, 0), (a, 1), (d, 2)]
    };
    for r in 0..n {
        posted[r as usize] = post_round(&mut c, r, 0);
    }
    while round.iter().any(|&k| k < rounds) {
        assert!(c.world.now < 60_000 * MS, "seed {seed}: stuck in rounds {round:?}");
        c.run_for(rng.range(2_000, 200_000));
        for r in 0..n {
            seen[r as usize].extend(c.completions(r));
            let k = round[r as usize];
            if k >= rounds || seen[r as usize].len() < 3 {
                continue;
            }
            // Operations of a round may complete in any order, each once.
            let mut got: Vec<Cqe> = seen[r as usize].drain(..).collect();
            got.sort_by_key(|c| c.wr_id);
            assert_eq!(got.len(), 3, "seed {seed}: rank {r} round {k}: more completions than operations");
            for (cqe, &(wr, kind)) in got.iter().zip(&posted[r as usize]) {
                assert_eq!((cqe.wr_id, status(cqe)), (wr, Status::Success), "seed {seed}: rank {r} round {k}");
                let root = (k % n as usize) as u16;
                match kind {
                    1 => assert_eq!(c.received(wr, COUNT * 8), coll_sum(n, k), "seed {seed}: allreduce {k} at {r}"),
                    2 if r == root => {
                        assert_eq!(c.received(wr, COUNT * 8), coll_sum(n, k + 1), "seed {seed}: reduce {k} at {r}")
                    }
                    _ => {}
                }
            }
            round[r as usize] = k + 1;
            if k + 1 < rounds {
                posted[r as usize] = post_round(&mut c, r, k + 1);
            }
        }
        maybe_gang_switch(&mut c, n, &mut rng, &mut run, 20 * MS, |i| ops_in_image(i) > 0, seed);
    }
    quiesced(&mut c, n, 20 * MS, seed);
    run
}

#[test]
fn test_gang_switches_mid_collective_lose_nothing() {
    let mut total = CollRun::default();
    // 80 ranks: a wide group (two table slots).
    for seed in 0..seeds().div_ceil(40).max(5) {
        let n = [8, 16, 12, 64, 80][seed as usize % 5];
        let algo =
            [BarrierAlgo::Dissemination, BarrierAlgo::PairwiseExchange, BarrierAlgo::GatherRelease][seed as usize % 3];
        total.add(collectives_with_switches(seed, n, 0.0, 6, algo));
    }
    total.check();
}

#[test]
fn test_gang_switches_mid_collective_with_loss_lose_nothing() {
    let mut total = CollRun::default();
    for seed in 0..seeds().div_ceil(40).max(3) {
        let n = [8, 12, 16][seed as usize % 3];
        let algo =
            [BarrierAlgo::GatherRelease, BarrierAlgo::Dissemination, BarrierAlgo::PairwiseExchange][seed as usize % 3];
        total.add(collectives_with_switches(1000 + seed, n, 0.03, 5, algo));
    }
    total.check();
}

/// A context saved mid-collective (its group, a barrier and an allreduce
/// recorded, their messages queued): every single-byte corruption and every
/// truncation is refused and changes nothing; with the checksum forged to
/// match, a corruption is refused unchanged or, where it still makes a valid
/// image (a value, not a structure), accepted with the NIC's invariants
/// intact; the intact image then restores into another slot and both
/// collectives complete with the right result.
#[test]
fn test_corrupted_collective_image_is_refused_and_changes_nothing() {
    let n = 4u16;
    let mut c = Cluster::new(n, Config::default(), 0, 1500, WireConfig::default());
    let members: Vec<u16> = (0..n).collect();
    assert!(c.create_group_wide(0, 7, 1, &members, &[binomial_parents_wide(n as usize)]).iter().all(|&r| r == ar::OK));
    // Rank 3 posts nothing yet: the others' barrier and allreduce wait for it.
    let mut wrs: Vec<Vec<u64>> = vec![Vec::new(); n as usize];
    for r in 0..n - 1 {
        wrs[r as usize].push(c.barrier(r, 0, BarrierAlgo::Dissemination, 0));
        wrs[r as usize].push(c.reduce(r, 0, true, 0, Dtype::I64, ReduceOp::Sum, 0, &coll_input(r, 0)));
    }
    c.run_for(5 * MS);
    // Rank 1 holds early messages and its own posted ops: switched out.
    let ctx = suspend_and_save(&mut c, 1);
    let good = c.image(1, &ctx);
    assert!(ops_in_image(&good) >= 2, "the image carries the collectives in progress");
    let before = parked_state(&c);
    let refused_unchanged =
        |c: &mut Cluster, what: &str, bytes: &[u8], len: u64| refused_unchanged(c, &ctx, &before, what, bytes, len);
    let fixed = with_checksum;
    let mut rng = Rng::new(11);
    let mut accepted = 0;
    for at in 0..good.len() {
        let mut b = good.clone();
        b[at] ^= 1 << rng.below(8);
        assert!(refused_unchanged(&mut c, &format!("bit flipped at {at}"), &b, ctx.len), "bit flip at {at} restored");
        if at < 16 {
            continue; // Header identity and checksum fields: covered above.
        }
        if !refused_unchanged(&mut c, &format!("forged flip at {at}"), &fixed(b), ctx.len) {
            // Still a valid image: the NIC holds it consistently; park it again.
            accepted += 1;
            c.world.nodes[1].nic.invariants().unwrap_or_else(|e| panic!("forged flip at {at}: {e}"));
            let again = suspend_and_save_again(&mut c);
            assert_eq!(again.len, ctx.len, "forged flip at {at}: re-saved image of another length");
        }
    }
    for len in [ctx.len - 1, ctx.len / 2, 80, 79] {
        assert!(refused_unchanged(&mut c, &format!("truncated to {len}"), &good, len), "truncated to {len}");
    }
    eprintln!("{} forged single-byte corruptions still valid images of {} bytes", accepted, good.len());
    c.write_image(1, &ctx, &good);
    assert_eq!(c.restore(1, &ctx, 2), ar::OK, "{:?}", c.world.nodes[1].nic.restore_refusal());
    assert_eq!(c.resume(1), ar::OK);
    wrs[3].push(c.barrier(3, 0, BarrierAlgo::Dissemination, 0));
    wrs[3].push(c.reduce(3, 0, true, 0, Dtype::I64, ReduceOp::Sum, 0, &coll_input(3, 0)));
    for r in 0..n {
        for (i, &wr) in wrs[r as usize].iter().enumerate() {
            let cqe = c.wait(r, wr, 200 * MS).unwrap_or_else(|| panic!("rank {r} op {i} never completed"));
            assert_eq!(status(&cqe), Status::Success, "rank {r} op {i}");
        }
        assert_eq!(c.received(wrs[r as usize][1], COUNT * 8), coll_sum(n, 0), "allreduce at {r}");
    }
}

/// Rank 1's NIC as a refused restore must leave it: occupancy and parked contexts.
fn parked_state(c: &Cluster) -> (Occupancy, Vec<(u16, u16)>) {
    (c.world.nodes[1].nic.occupancy(), c.world.nodes[1].nic.parked())
}

/// `b` with its header's checksum made right (a forged image).
fn with_checksum(mut b: Vec<u8>) -> Vec<u8> {
    let sum = image_checksum(&b);
    b[12..16].copy_from_slice(&sum.to_le_bytes());
    b
}

/// Rank 1's saved context `ctx` replaced by `bytes` and restored (`len`
/// bytes) into slot 1: false when accepted; else it must be refused as a
/// bad image (or for room) with the slot closed and `before` unchanged.
fn refused_unchanged(
    c: &mut Cluster,
    ctx: &SavedContext,
    before: &(Occupancy, Vec<(u16, u16)>),
    what: &str,
    bytes: &[u8],
    len: u64,
) -> bool {
    c.write_image(1, ctx, bytes);
    let r = c.restore_len(1, ctx, 1, len);
    if r == ar::OK {
        return false;
    }
    assert!(matches!(r, ar::BAD_IMAGE | ar::NO_ROOM), "{what}: result {r}");
    let nic = &c.world.nodes[1].nic;
    assert!(!nic.port_is_open(1), "{what}: the slot opened");
    assert_eq!(&(nic.occupancy(), nic.parked()), before, "{what}: state changed");
    true
}

/// Rank 1, restored and suspended, saved again (in the same place).
fn suspend_and_save_again(c: &mut Cluster) -> SavedContext {
    let mut waited = 0;
    while !c.is_stable(1) {
        assert!(waited < 100 * MS, "a restored forged image never stable");
        c.run_for(50_000);
        waited += 50_000;
    }
    c.save(1).unwrap_or_else(|r| panic!("save refused: {r}"))
}

/// Bytes of a reliable broadcast of round `k` from `root`.
fn rb_data(k: usize, root: u16) -> Vec<u8> {
    data(100 + (k * 37 + root as usize * 11) % 900, (k as u64) << 8 | root as u64)
}

/// The count of reliable-broadcast states an image carries (header bytes 78..80).
fn rbcast_in_image(image: &[u8]) -> u16 {
    u16::from_le_bytes([image[78], image[79]])
}

/// `n` ranks (one per NIC, one group) run `rounds` reliable broadcasts
/// from rotating roots with scheme `algo`, each rank posting the next as
/// soon as its last completed (roots run ahead: their posts complete at
/// once), while at random moments the whole job is switched out (gang
/// style), parked for a while and each rank restored into a random free
/// slot. Every member receives every broadcast once, in posting order,
/// with its bytes. Returns the switches, those put off, and how many
/// images carried reliable-broadcast state.
fn rbcasts_with_switches(seed: u64, n: u16, loss: f64, rounds: usize, algo: RbcastAlgo) -> CollRun {
    let wire = WireConfig { loss, dup: loss / 2.0, reorder: loss, ..WireConfig::default() };
    let mut c = Cluster::new(n, Config::default(), 0, 1500, wire);
    c.world.reseed(seed);
    let members: Vec<u16> = (0..n).collect();
    let trees = vec![binomial_parents_wide(n as usize)];
    assert!(c.create_group_wide(0, 7, 1, &members, &trees).iter().all(|&r| r == ar::OK));
    let tag = rbcast_tag(algo);
    let mut rng = Rng::new(seed);
    let mut run = CollRun::default();
    let mut round = vec![0usize; n as usize];
    let mut posted = vec![0u64; n as usize];
    let root_of = |k: usize| (k % n as usize) as u16;
    let post =
        |c: &mut Cluster, r: u16, k: usize| c.rbcast(r, 0, root_of(k), tag, &rb_data(k, root_of(k)), r == root_of(k));
    for r in 0..n {
        posted[r as usize] = post(&mut c, r, 0);
    }
    while round.iter().any(|&k| k < rounds) {
        if c.world.now >= 60_000 * MS {
            for r in 0..n {
                let nic = &c.world.nodes[r as usize].nic;
                eprintln!(
                    "rank {r}: slot {} {:?} {:?} {:?} {:?}",
                    c.port_slot(r),
                    nic.rbcast_occupancy(),
                    nic.rbcast_delivered(0),
                    nic.rbcast_stats(),
                    nic.port_unstable(c.port_slot(r))
                );
            }
            panic!("seed {seed}: stuck in rounds {round:?}");
        }
        c.run_for(rng.range(2_000, 300_000));
        for r in 0..n {
            for cqe in c.completions(r) {
                let k = round[r as usize];
                assert!(k < rounds, "seed {seed}: rank {r}: a completion after its last broadcast");
                assert_eq!(
                    (cqe.wr_id, status(&cqe)),
                    (posted[r as usize], Status::Success),
                    "seed {seed}: rank {r} round {k}"
                );
                let want = rb_data(k, root_of(k));
                if r != root_of(k) {
                    assert_eq!(c.received(cqe.wr_id, want.len()), want, "seed {seed}: rank {r} round {k}: bytes");
                }
                round[r as usize] = k + 1;
                if k + 1 < rounds {
                    posted[r as usize] = post(&mut c, r, k + 1);
                }
            }
        }
        maybe_gang_switch(&mut c, n, &mut rng, &mut run, 100 * MS, |i| rbcast_in_image(i) > 0, seed);
    }
    quiesced(&mut c, n, 200 * MS, seed);
    for r in 0..n {
        let nic = &c.world.nodes[r as usize].nic;
        assert_eq!(nic.rbcast_occupancy(), (0, 0, 0), "seed {seed}: rank {r}: held at quiesce");
    }
    run
}

/// Reliable broadcasts' state travels in the image: a job that
/// broadcasts reliably is switched (it used never to become stable) and
/// loses, duplicates and reorders nothing, with every scheme, under loss.
#[test]
fn test_gang_switches_between_reliable_broadcasts_lose_nothing() {
    let mut total = CollRun::default();
    for seed in 0..seeds().div_ceil(40).max(6) {
        let n = [4, 8, 6, 12][seed as usize % 4];
        let algo = [
            RbcastAlgo { coroots: 0, ack_every: 1, window: 0, nak: false },
            RbcastAlgo { coroots: 1, ack_every: 3, window: 0, nak: false },
            RbcastAlgo { coroots: 0, ack_every: 0, window: 0, nak: true },
        ][seed as usize % 3];
        let loss = if seed % 2 == 1 { 0.03 } else { 0.0 };
        total.add(rbcasts_with_switches(seed, n, loss, 30, algo));
    }
    total.check();
}

/// A member's reliable-broadcast state (a posted receive, two messages
/// held for receives not posted yet) is in its image; every byte of that
/// record corrupted (checksum fixed) is refused with nothing changed, or
/// is a consistent state the NIC can hold and save again; the good image
/// restored into another slot delivers what it held, in order.
#[test]
fn test_corrupted_rbcast_state_is_refused_and_changes_nothing() {
    let n = 3u16;
    let mut c = Cluster::new(n, Config::default(), 0, 1500, WireConfig::default());
    let members: Vec<u16> = (0..n).collect();
    assert!(c.create_group_wide(0, 7, 1, &members, &[binomial_parents_wide(n as usize)]).iter().all(|&r| r == ar::OK));
    let tag = rbcast_tag(RbcastAlgo::default());
    let lens = [200usize, 300, 400];
    let msg = |k: usize| data(lens[k], 90 + k as u64);
    // Root 0 broadcasts three; rank 2 takes them all, rank 1 only the first.
    let mut wrs1 = vec![c.rbcast(1, 0, 0, tag, &msg(0), false)];
    let wrs2: Vec<u64> = (0..3).map(|k| c.rbcast(2, 0, 0, tag, &msg(k), false)).collect();
    for k in 0..3 {
        c.rbcast(0, 0, 0, tag, &msg(k), true);
    }
    // Rank 1 then waits for a broadcast of root 2's.
    wrs1.push(c.rbcast(1, 0, 2, tag, &msg(0), false));
    c.run_for(20 * MS);
    let ctx = suspend_and_save(&mut c, 1);
    let good = c.image(1, &ctx);
    assert_eq!(rbcast_in_image(&good), 1, "the image carries the group's reliable-broadcast state");
    // The record ends the image: fixed part, a row per member, the posted
    // receive (descriptor and root), the two held messages (header, data).
    let record = 46 + n as usize * 20 + (WorkDesc::SIZE + 4) + 2 * 16 + lens[1] + lens[2];
    let from = good.len() - record;
    assert_eq!(u16::from_le_bytes([good[from + 2], good[from + 3]]), n, "the record's member count at its place");
    let before = parked_state(&c);
    let refused_unchanged =
        |c: &mut Cluster, what: &str, bytes: &[u8]| refused_unchanged(c, &ctx, &before, what, bytes, ctx.len);
    let fixed = with_checksum;
    let mut rng = Rng::new(13);
    let (mut refused, mut accepted) = (0, 0);
    for at in from..good.len() {
        let mut b = good.clone();
        b[at] ^= 1 << rng.below(8);
        if refused_unchanged(&mut c, &format!("record byte {}", at - from), &fixed(b)) {
            refused += 1;
        } else {
            accepted += 1;
            c.world.nodes[1].nic.invariants().unwrap_or_else(|e| panic!("record byte {}: {e}", at - from));
            let again = suspend_and_save_again(&mut c);
            assert_eq!(again.len, ctx.len, "record byte {}: re-saved image of another length", at - from);
        }
    }
    // Named corruptions, each refused: another member count, a held
    // message's sequence beyond what was received, a posted receive whose
    // root is this rank, more receives than the NIC keeps.
    let le16 = |b: &mut Vec<u8>, at: usize, v: u16| b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    let held = from + 46 + n as usize * 20 + WorkDesc::SIZE + 4;
    let posted_root = held - 4;
    for (what, at, v) in [
        ("member count", from + 2, n + 1),
        ("posted receive's root", posted_root, 1),
        ("held message's root", held, 3),
        ("posted count", from + 42, 1000),
    ] {
        let mut b = good.clone();
        le16(&mut b, at, v);
        assert!(refused_unchanged(&mut c, what, &fixed(b)), "{what} accepted");
    }
    let mut b = good.clone();
    b[held + 4..held + 8].copy_from_slice(&9u32.to_le_bytes());
    assert!(refused_unchanged(&mut c, "held sequence", &fixed(b)), "held sequence accepted");
    eprintln!("record of {record} bytes: {refused} corruptions refused, {accepted} still valid states");
    // Flips in the held bytes are valid states; most of the rest are not.
    assert!(refused >= (record - lens[1] - lens[2]) / 2, "too few corruptions refused");
    c.write_image(1, &ctx, &good);
    assert_eq!(c.restore(1, &ctx, 2), ar::OK, "{:?}", c.world.nodes[1].nic.restore_refusal());
    assert_eq!(c.resume(1), ar::OK);
    // Root 2 broadcasts; rank 1 then takes root 0's two held messages.
    let from_2 = data(lens[0], 77);
    c.rbcast(2, 0, 2, tag, &from_2, true);
    let w0 = c.rbcast(0, 0, 2, tag, &from_2, false);
    wrs1.extend((1..3).map(|k| c.rbcast(1, 0, 0, tag, &msg(k), false)));
    for (i, &wr) in wrs1.iter().enumerate() {
        let cqe = c.wait(1, wr, 200 * MS).unwrap_or_else(|| panic!("rank 1's receive {i} never completed"));
        assert_eq!(status(&cqe), Status::Success, "rank 1 receive {i}");
    }
    assert_eq!(c.received(wrs1[1], lens[0]), from_2, "root 2's broadcast at rank 1");
    for k in 1..3 {
        assert_eq!(c.received(wrs1[k + 1], lens[k]), msg(k), "held message {k} at rank 1");
    }
    for (k, &wr) in wrs2.iter().enumerate() {
        assert_eq!(status(&c.wait(2, wr, 200 * MS).expect("rank 2")), Status::Success, "rank 2 receive {k}");
    }
    assert_eq!(status(&c.wait(0, w0, 200 * MS).expect("rank 0")), Status::Success);
}

/// Rendezvous in the images: large messages whose receives are not posted
/// are retained at the receiver (their headers) and held at the sender
/// (their data, until pulled). Both ends are switched out — the receiver
/// first, so the sender's keepalives reach a parked context, whose answer
/// must not finish a send it has not pulled — and back into other slots; then the receives come, in another order, and each
/// pulls its message intact; every send completes once, only after its
/// pull. With loss, duplication and reordering too. A retained entry
/// naming a message its sender never sent (beyond the peer's sequence) is
/// refused.
fn retained_messages_travel(loss: f64, seed: u64, count: u64) {
    let wire = WireConfig { loss, dup: loss / 2.0, reorder: loss, ..WireConfig::default() };
    let mut c = Cluster::new(2, Config::default(), 0, 1500, wire);
    c.world.reseed(seed);
    let lens = [20_000usize, 61_000, 9_000, 140_000];
    let sends: Vec<u64> = (0..count)
        .map(|i| match i % 2 {
            0 => c.send(0, 1, 50 + i, &data(lens[i as usize], i)),
            _ => c.send_imm(0, 1, 50 + i, &data(lens[i as usize], i), 0xAB00 | i as u32),
        })
        .collect();
    c.run_for(20 * MS);
    assert_eq!(c.world.nodes[1].nic.occupancy().unexp_entries as u64, count, "seed {seed}: the headers are retained");
    assert!(c.completions(0).is_empty(), "seed {seed}: a send completed before its pull");
    let rx = suspend_and_save(&mut c, 1);
    // Keepalives (every rto_ns_max) reach the parked receiver.
    let dups = c.counter(1, emp_uapi::sram::counter::DUPLICATES);
    c.run_for(120 * MS);
    assert!(
        c.counter(1, emp_uapi::sram::counter::DUPLICATES) > dups,
        "seed {seed}: no keepalive reached the parked context"
    );
    assert!(c.completions(0).is_empty(), "seed {seed}: a parked receiver finished a send it never pulled");
    let tx = suspend_and_save(&mut c, 0);
    for (n, ctx) in [(1u16, &rx), (0, &tx)] {
        let image = c.image(n, ctx);
        assert!(image.len() > 80, "seed {seed}: node {n}'s image");
    }
    // Forged: the receiver's image claims a fifth retained message, one
    // beyond what its sender ever sent. Its checksum fixed, it is refused.
    let good = c.image(1, &rx);
    let n_unexp = u16::from_le_bytes([good[70], good[71]]);
    assert_eq!(n_unexp as u64, count, "seed {seed}: the retained headers in the image");
    let mut forged = good.clone();
    let seq_at = forged.len() - 16 + 8; // the last entry's sequence number
    let seq = u32::from_le_bytes(forged[seq_at..seq_at + 4].try_into().unwrap());
    forged[seq_at..seq_at + 4].copy_from_slice(&(seq + 10).to_le_bytes());
    let sum = image_checksum(&forged);
    forged[12..16].copy_from_slice(&sum.to_le_bytes());
    c.write_image(1, &rx, &forged);
    assert_eq!(c.restore(1, &rx, 3), ar::BAD_IMAGE, "seed {seed}: a retained message never sent");
    c.write_image(1, &rx, &good);
    assert_eq!(c.restore(0, &tx, 2), ar::OK, "{:?}", c.world.nodes[0].nic.restore_refusal());
    assert_eq!(c.restore(1, &rx, 3), ar::OK, "{:?}", c.world.nodes[1].nic.restore_refusal());
    assert_eq!(c.resume(0), ar::OK);
    assert_eq!(c.resume(1), ar::OK);
    c.run_for(20 * MS);
    assert!(c.completions(0).is_empty(), "seed {seed}: a send completed before its receive was posted");
    for i in [3u64, 1, 0, 2].into_iter().filter(|&i| i < count) {
        let len = lens[i as usize];
        let r = c.recv(1, (0, 0), 50 + i, 0, len as u64);
        let cqe = c.wait(1, r, 2_000 * MS).unwrap_or_else(|| panic!("seed {seed}: message {i} never pulled"));
        assert_eq!((status(&cqe), cqe.tag, cqe.byte_len as usize), (Status::Success, 50 + i, len), "seed {seed}");
        let imm = (i % 2 == 1).then_some(0xAB00 | i as u32);
        assert_eq!((cqe.flags & CQE_IMM != 0).then_some(cqe.imm), imm, "seed {seed}: message {i}'s immediate data");
        assert_eq!(c.received(r, len), data(len, i), "seed {seed}: message {i}'s bytes");
    }
    for (i, s) in sends.into_iter().enumerate() {
        let cqe = c.wait(0, s, 2_000 * MS).unwrap_or_else(|| panic!("seed {seed}: send {i} never completed"));
        assert_eq!(status(&cqe), Status::Success, "seed {seed}: send {i}");
    }
    c.run_for(50 * MS);
    for n in 0..2 {
        assert!(c.completions(n).is_empty(), "seed {seed}: node {n}: a completion twice");
        let nic = &c.world.nodes[n as usize].nic;
        assert_eq!(nic.occupancy().unexp_entries, 0, "seed {seed}: node {n}");
        nic.invariants().unwrap_or_else(|e| panic!("seed {seed}: node {n}: {e}"));
    }
}

#[test]
fn test_retained_messages_travel_in_both_images() {
    retained_messages_travel(0.0, 1, 4);
    retained_messages_travel(0.0, 1, 1);
    for seed in 2..6 {
        retained_messages_travel(0.03, seed, [1, 4][seed as usize % 2]);
    }
}
