//! The EMP thesis' chapter 3 reproduced on per-CPU timelines
//! (`emp_sim::thesis`, `docs/thesis-cpus.md`): a regression in the control
//! program's step dispatch or in the model moves these figures.

use emp_sim::cluster::Cluster;
use emp_sim::cost::StepCosts;
use emp_sim::thesis::{self, Machine, Reproduction, TOLERANCE};
use emp_uapi::image::cpu_plan;

/// Figures the thesis' own numbers keep out of ±15 % (docs/thesis-cpus.md,
/// "Where the thesis contradicts itself"), held to ±25 % instead.
const EXPLAINED: [&str; 3] = ["base latency, 10 B", "RO latency, 10 B", "DSR latency, 10 B"];
const EXPLAINED_TOLERANCE: f64 = 0.25;

fn reproduction() -> Reproduction {
    thesis::reproduce(&Machine::thesis(), 4, 24).expect("every experiment runs")
}

#[test]
fn stated_figures_are_reproduced_within_their_tolerance() {
    let r = reproduction();
    for row in &r.rows {
        let bound = if EXPLAINED.contains(&row.paper.what) { EXPLAINED_TOLERANCE } else { TOLERANCE };
        assert!(
            row.deviation().abs() <= bound,
            "{}: ours {:.2} against {:.2}..{:.2} ({:+.1} %, bound {:.0} %)",
            row.paper.what,
            row.ours,
            row.paper.low,
            row.paper.high,
            row.deviation() * 100.0,
            bound * 100.0
        );
    }
    // Every bandwidth figure holds to ±15 % (none is explained away).
    assert!(r.rows.iter().filter(|r| r.paper.unit == "Mb/s").all(|r| r.holds()), "{:?}", r.rows);
}

#[test]
fn plans_rank_as_the_thesis_ranks_them() {
    let r = reproduction();
    let ours = |what: &str| r.rows.iter().find(|r| r.paper.what == what).expect("a stated figure").ours;
    // RO removes the receive-side bottleneck: well above base, near the wire.
    assert!(ours("RO bandwidth") > 1.08 * ours("base bandwidth"), "{:?}", r.rows);
    // SO's pipelining pays off only when both directions load the NIC.
    assert!(ours("SO bidirectional") > 1.15 * ours("base bidirectional"), "{:?}", r.rows);
    // RO's split receive shortens the one-way path.
    assert!(ours("RO latency, 10 B") < ours("base latency, 10 B"), "{:?}", r.rows);
    let m = Machine::thesis();
    let bw = |plan| thesis::bandwidth(&m, plan, thesis::BW_SIZE, 24, false).expect("runs");
    let (base, so, dsr) = (bw(cpu_plan::BASE), bw(cpu_plan::SO), bw(cpu_plan::DSR));
    // SO: "the same as in the base case" (the receiver is the bottleneck);
    // DSR "marginally better".
    assert!((so / base - 1.0).abs() < 0.10, "SO {so:.0} base {base:.0}");
    assert!(dsr >= base && dsr < 1.10 * base, "DSR {dsr:.0} base {base:.0}");
}

#[test]
fn latency_jumps_at_a_frame_and_at_a_page() {
    let r = reproduction();
    let (frame, page) = (&r.jumps[0], &r.jumps[1]);
    // One more frame: a transmission and a whole receive path more.
    assert!(frame.excess() > 5.0, "{frame:?}");
    // A frame across a page boundary: one more DMA on each side.
    assert!(page.excess() > 0.3, "{page:?}");
    // Between the edges, bytes alone cost little.
    assert!(page.baseline.abs() < 0.1 && frame.baseline.abs() < 0.1, "{r:?}");
}

#[test]
fn steps_land_on_the_cpus_their_plan_names() {
    // Unidirectional bulk traffic; per receiving NIC, CPU B's share of the work.
    let m = Machine::thesis();
    let share_b = |plan| {
        let mut c: Cluster = {
            let mut c =
                Cluster::new(2, emp_firmware::Config { cpu_plan: plan, ..Default::default() }, 0, 1500, m.wire.clone());
            c.world.cpu_costs = Some(StepCosts::THESIS);
            c
        };
        let r = c.recv(1, (0, 0), 1, 0, 64 * 1024);
        let s = c.send(0, 1, 1, &vec![7u8; 64 * 1024]);
        assert!(c.wait(1, r, 1_000_000_000).is_some() && c.wait(0, s, 1_000_000_000).is_some());
        let t = &c.world.nodes[1].cpus;
        (t.busy_ps[1] as f64 / (t.busy_ps[0] + t.busy_ps[1]) as f64, t.handoffs)
    };
    let (base, handoffs) = share_b(cpu_plan::BASE);
    assert_eq!((base, handoffs), (0.0, [0, 0]), "base runs on CPU A alone");
    // SO: only send ack on B at the receiver (2.5 of 15.75 µs per group of 3 frames).
    let (so, _) = share_b(cpu_plan::SO);
    assert!(so > 0.0 && so < 0.1, "SO {so}");
    // RO: recv frame and receiving on B (7 of about 14 µs per frame).
    let (ro, handoffs) = share_b(cpu_plan::RO);
    assert!((0.4..0.6).contains(&ro) && handoffs[1] > 40, "RO {ro} {handoffs:?}");
    // DSR: the whole receive on B, send ack handed to A.
    let (dsr, handoffs) = share_b(cpu_plan::DSR);
    assert!(dsr > 0.8 && handoffs[0] > 10, "DSR {dsr} {handoffs:?}");
}

#[test]
fn event_priority_decides_between_a_doorbell_and_a_frame_due_together() {
    use emp_sim::world::{EventOrder, WireConfig};
    use emp_uapi::sram::counter;
    // A send's doorbell and a (malformed) frame due at the same instant:
    // after one event, either the send left and the frame waits, or the
    // frame was looked at (and the rings polled after it: the send left too).
    let first = |order| {
        let mut c = Cluster::new(2, emp_firmware::Config::default(), 0, 1500, WireConfig::default());
        c.world.event_order = order;
        c.world.doorbell_ns = 0;
        c.send(0, 1, 1, b"ping");
        c.world.inject_frame(0, &[0xEE; 20]);
        c.world.step().expect("two events are due");
        match (c.world.stats.frames, c.counter(0, counter::DROPPED_MALFORMED)) {
            (1, 0) => "mailbox",
            (1, 1) => "mac_rx",
            other => panic!("{order:?}: {other:?}"),
        }
    };
    assert_eq!(first(EventOrder::Arrival), "mailbox", "queued first");
    assert_eq!(first(EventOrder::MailboxFirst), "mailbox");
    assert_eq!(first(EventOrder::MacRxFirst), "mac_rx");
}

#[test]
fn every_plan_delivers_exactly_once_in_order_under_loss_on_per_cpu_timelines() {
    use emp_sim::world::WireConfig;
    // Both directions at once, so every CPU of every plan has work, on a
    // wire that loses, duplicates and reorders; the steps' hand-offs (DSR's
    // receive ack classified on one CPU, applied on the other) run late in
    // virtual time, as the per-CPU model schedules them.
    const MSGS: u64 = 60;
    let wire = WireConfig { loss: 0.05, dup: 0.02, reorder: 0.1, reorder_jitter_ns: 30_000, ..Machine::thesis().wire };
    for (plan, name) in thesis::PLANS {
        let cfg = emp_firmware::Config { cpu_plan: plan, rto_ns: 2_000_000, ..Default::default() };
        let mut c = Cluster::new(2, cfg, 0, 1500, wire.clone());
        c.world.cpu_costs = Some(StepCosts::THESIS);
        let len = |i: u64| 10 + (i * 2_741) % 9_000;
        let data =
            |from: u16, i: u64| (0..len(i)).map(|b| (b as u8) ^ (i as u8) ^ (from as u8 * 0x55)).collect::<Vec<u8>>();
        let mut recvs = Vec::new();
        for (src, dst) in [(0u16, 1u16), (1, 0)] {
            for i in 0..MSGS {
                // One tag for all: the i-th receive must take the i-th message.
                recvs.push((src, dst, i, c.recv(dst, (src, 0), 7, 0, len(i))));
            }
        }
        let mut sends = Vec::new();
        for i in 0..MSGS {
            for (src, dst) in [(0u16, 1u16), (1, 0)] {
                sends.push((src, c.send(src, dst, 7, &data(src, i))));
            }
        }
        for &(src, dst, i, wr) in &recvs {
            let cqe =
                c.wait(dst, wr, 20_000_000_000).unwrap_or_else(|| panic!("{name}: {src}->{dst} #{i} never arrived"));
            assert_eq!(cqe.status, 0, "{name}: {src}->{dst} #{i}: {cqe:?}");
            assert_eq!(cqe.byte_len as u64, len(i), "{name}: {src}->{dst} #{i} took another message");
            assert_eq!(
                c.received(wr, len(i) as usize),
                data(src, i),
                "{name}: {src}->{dst} #{i} out of order or corrupted"
            );
        }
        for &(src, wr) in &sends {
            let cqe = c.wait(src, wr, 20_000_000_000).unwrap_or_else(|| panic!("{name}: send {wr} never completed"));
            assert_eq!(cqe.status, 0, "{name}: send {wr}: {cqe:?}");
        }
        c.run_for(100_000_000);
        for n in 0..2 {
            assert!(c.completions(n).is_empty(), "{name}: node {n} completed something twice");
        }
        assert!(c.world.stats.lost > 0, "{name}: the wire lost nothing");
    }
}

#[test]
fn with_jobs_cpu_b_of_so_ro_and_sr_never_takes_the_program() {
    // A NIC running its CPUs on threads hands CPU B its steps as jobs:
    // transmissions, send acks, payload DMAs and receives' completions
    // (SO, RO, SR), none of which needs the program's records. DSR's B
    // classifies frames, which does: frames run holding the program.
    const MSGS: u64 = 40;
    for (plan, name) in thesis::PLANS {
        let cfg = emp_firmware::Config { cpu_plan: plan, cpu_jobs: true, ..Default::default() };
        let mut c = Cluster::new(2, cfg, 0, 1500, Machine::thesis().wire);
        let len = |i: u64| 10 + (i * 2_741) % 9_000;
        let mut recvs = Vec::new();
        for (src, dst) in [(0u16, 1u16), (1, 0)] {
            for i in 0..MSGS {
                recvs.push((dst, i, c.recv(dst, (src, 0), 7, 0, len(i))));
            }
        }
        let sends: Vec<_> = (0..MSGS)
            .flat_map(|i| [(0u16, 1u16), (1, 0)].map(|(src, dst)| (src, i, dst)))
            .map(|(src, i, dst)| (src, c.send(src, dst, 7, &vec![i as u8; len(i) as usize])))
            .collect();
        for &(dst, i, wr) in &recvs {
            let cqe = c.wait(dst, wr, 10_000_000_000).unwrap_or_else(|| panic!("{name}: #{i} to {dst} never arrived"));
            assert_eq!((cqe.status, cqe.byte_len as u64), (0, len(i)), "{name}: #{i} to {dst}");
            assert_eq!(c.received(wr, len(i) as usize), vec![i as u8; len(i) as usize], "{name}: #{i} to {dst}");
        }
        for &(src, wr) in &sends {
            let cqe = c.wait(src, wr, 10_000_000_000).unwrap_or_else(|| panic!("{name}: send {wr} never completed"));
            assert_eq!(cqe.status, 0, "{name}: send {wr}");
        }
        for n in 0..2 {
            let nic = &c.world.nodes[n].nic;
            match plan {
                cpu_plan::BASE => assert_eq!(nic.cpu_jobs_run(), 0, "{name}: one CPU, no jobs"),
                // B classifies frames (holding the program), A applies the ACKs.
                cpu_plan::DSR => assert!(nic.cpu_work_run(0) > 0, "{name}: A updated no send record"),
                _ => {
                    assert!(nic.cpu_jobs_run() > MSGS, "{name}: node {n} ran {} jobs", nic.cpu_jobs_run());
                    assert_eq!(nic.cpu_work_run(1), 0, "{name}: node {n}'s CPU B took the program");
                }
            }
        }
    }
}
