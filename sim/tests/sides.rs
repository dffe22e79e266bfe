//! The receive side at work (`RecvCpu`, docs/nic-cpus.md) reaches nothing
//! of the send side, by its type, and the send side (`SendCpu`) nothing of
//! the receive side. These tests check that each is the one that handles a
//! stream: only what needs the whole program (the first frame from a new
//! sender, an ACK the receive side holds) goes past it.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

use common::Pair;
use emp_firmware::Config;
use emp_sim::cluster::Cluster;
use emp_sim::world::WireConfig;
use emp_uapi::desc::{Opcode, Status, MR_LOCAL_READ, MR_LOCAL_WRITE, MR_REMOTE_READ, MR_REMOTE_WRITE};
use emp_uapi::sram::counter;
use emp_uapi::wire::Frame;

#[test]
fn a_streams_data_frames_are_taken_by_the_receive_side_alone() {
    let mut p = Pair::new(Config::default(), 1500, [1 << 20, 1 << 20]);
    // Retransmissions, gaps and NACKs too.
    lose_every_20th_data_frame(&mut p);
    const MSGS: u64 = 100;
    for i in 0..MSGS {
        // One-frame and three-frame messages, alternating.
        let len = if i % 2 == 0 { 64 } else { 4000 };
        p.recv(1, i, i * 4096, len);
        p.send(0, i, i * 4096, len);
    }
    let (mut sent, mut got) = (0, 0);
    while sent < MSGS || got < MSGS {
        assert!(p.step(), "the stream stalled at {sent} sent, {got} received");
        while let Some(c) = p.poll(0) {
            assert_eq!(Status::from_u8(c.status), Some(Status::Success));
            sent += 1;
        }
        while let Some(c) = p.poll(1) {
            assert_eq!(Status::from_u8(c.status), Some(Status::Success));
            got += 1;
        }
    }
    assert!(p.counter(0, counter::RETRANSMITS) > 0, "frames were lost and sent again");
    let (alone, whole) = p.world.nodes[1].nic.data_frames();
    assert_eq!(whole, 1, "only the new sender's first frame needs the whole program");
    assert!(alone + whole >= p.counter(1, counter::RX_FRAMES), "every frame taken went one way or the other");
    assert!(alone >= MSGS * 2, "{alone} frames taken alone");
    assert_eq!(p.world.nodes[1].nic.recv_descs(), (MSGS, 0), "the receive side posted every receive alone");
    let [_, (batches, batches_whole)] = p.world.nodes[1].nic.entries();
    eprintln!("receiver's frame batches: {batches} by the sides alone, {batches_whole} with the whole program");
    assert!(batches > 10 * batches_whole, "the receiver's frame batches needed only the sides");
}

/// The send side (`SendCpu`) sends a stream's frames alone: it stops for
/// nothing when no collective is queued and no ACK is held.
#[test]
fn a_streams_frames_are_sent_by_the_send_side_alone() {
    let mut p = Pair::new(Config::default(), 1500, [1 << 20, 1 << 20]);
    const MSGS: u64 = 60;
    for i in 0..MSGS {
        let len = if i % 2 == 0 { 64 } else { 4000 };
        p.recv(1, i, i * 4096, len);
        p.send(0, i, i * 4096, len);
    }
    let mut sent = 0;
    while sent < MSGS {
        assert!(p.step(), "the stream stalled at {sent} sent");
        while let Some(c) = p.poll(0) {
            assert_eq!(Status::from_u8(c.status), Some(Status::Success));
            sent += 1;
        }
        while p.poll(1).is_some() {}
    }
    let (alone, built, _) = p.world.nodes[0].nic.send_frames();
    assert_eq!(built, 0, "no frame needed the whole program");
    assert_eq!(alone, p.counter(0, counter::TX_FRAMES), "every first transmission was the send side's");
    assert_eq!(alone, MSGS / 2 * 4, "one frame and three frames, alternating");
    let (descs, descs_whole) = p.world.nodes[0].nic.send_descs();
    assert_eq!(descs_whole, 1, "only the first send, to a new peer, needed the whole program");
    assert_eq!(descs, MSGS - 1, "the send side took the others from the ring alone");
    let [_, (batches, batches_whole)] = p.world.nodes[0].nic.entries();
    eprintln!("sender's frame batches (ACKs): {batches} by the sides alone, {batches_whole} with the whole program");
    assert!(batches > 10 * batches_whole.max(1), "the sender's ACKs needed only the sides");
}

/// An answer never overtakes the ACK of what it answers: with ACKs held
/// back for coalescing (`ack_delay_ns`), the send side stops before the
/// reply (`SendStop::AckHeld`) and the held ACK goes on the wire first.
#[test]
fn a_reply_goes_after_the_ack_the_receive_side_held() {
    let d = Config::default();
    let cfg = Config { ack_delay_ns: d.rto_ns / 2, ..d };
    let mut p = Pair::new(cfg, 1500, [1 << 16, 1 << 16]);
    // What node 1 puts on the wire, in order: ACK floors and DATA sequences.
    let wire: Rc<RefCell<Vec<(bool, u32)>>> = Rc::default();
    let seen = wire.clone();
    p.world.drop_filter = Some(Box::new(move |src, _, bytes: &[u8]| {
        match Frame::parse(bytes) {
            Ok(Frame::Ack { body, .. }) if src == 1 => seen.borrow_mut().push((true, body.rx_expected)),
            Ok(Frame::Data { hdr, .. }) if src == 1 => seen.borrow_mut().push((false, hdr.msg_seq)),
            _ => {}
        }
        false
    }));
    const ROUNDS: u64 = 20;
    let mut got = [0u64; 2];
    for i in 0..ROUNDS {
        p.recv(1, i, 0, 64);
        p.recv(0, i, 4096, 64);
        p.send(0, i, 0, 64);
        while got[1] <= i {
            assert!(p.step(), "round {i}: the ping never arrived");
            while let Some(c) = p.poll(1) {
                got[1] += u64::from(c.opcode == Opcode::Recv as u8);
            }
            while let Some(c) = p.poll(0) {
                got[0] += u64::from(c.opcode == Opcode::Recv as u8);
            }
        }
        p.send(1, i, 4096, 64);
        while got[0] <= i {
            assert!(p.step(), "round {i}: the reply never arrived");
            while let Some(c) = p.poll(0) {
                got[0] += u64::from(c.opcode == Opcode::Recv as u8);
            }
            while p.poll(1).is_some() {}
        }
    }
    let wire = wire.borrow();
    for (at, &(ack, seq)) in wire.iter().enumerate() {
        if !ack {
            let acked = wire[..at].iter().any(|&(a, floor)| a && floor > seq);
            assert!(acked, "reply {seq} went before the ACK of ping {seq}: {wire:?}");
        }
    }
    for n in 0..2 {
        let [(doorbells, whole), _] = p.world.nodes[n].nic.entries();
        eprintln!("node {n}'s doorbells: {doorbells} by the sides alone, {whole} with the whole program");
        assert!(doorbells >= ROUNDS - 2 && whole <= 2, "node {n}: posting and sending needed only the sides");
    }
    let (_, _, acks_first) = p.world.nodes[1].nic.send_frames();
    assert!(acks_first >= ROUNDS, "the send side stopped for the held ACK {acks_first} times");
}

/// A remote write's and a read response's frames after the first are the
/// receive side's too: only the first (the remote-access header) and the
/// report of the retired record need the whole program.
#[test]
fn remote_access_frames_after_the_first_are_the_receive_sides() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let rw = MR_LOCAL_READ | MR_LOCAL_WRITE | MR_REMOTE_READ | MR_REMOTE_WRITE;
    let key = c.reg_mr(0, 64 << 10, rw);
    let secret = c.secret(0, key);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let wr = c.rma_write(1, 0, &data, (key, secret, 100), None);
    let cqe = c.wait(1, wr, 1_000_000_000).expect("the write completes");
    assert_eq!(Status::from_u8(cqe.status), Some(Status::Success));
    let wr = c.rma_read(1, 0, data.len() as u64, (key, secret, 100));
    let cqe = c.wait(1, wr, 1_000_000_000).expect("the read completes");
    assert_eq!(Status::from_u8(cqe.status), Some(Status::Success));
    let [(alone0, whole0), (alone1, whole1)] = [0, 1].map(|n| c.world.nodes[n].nic.data_frames());
    // The target: the write's first frame and the read request; the
    // initiator: the response's first frame.
    assert_eq!((whole0, whole1), (2, 1), "only the first frames needed the whole program");
    // 10 000 bytes and a remote-access header, at 1 500 bytes a frame: 7
    // frames each way, 6 after the first.
    assert_eq!((alone0, alone1), (6, 6), "the rest were the receive side's");
}

/// Every 20th DATA frame on the wire is lost.
fn lose_every_20th_data_frame(p: &mut Pair) {
    let mut data = 0u32;
    p.world.drop_filter = Some(Box::new(move |_, _, bytes: &[u8]| {
        matches!(Frame::parse(bytes), Ok(Frame::Data { .. })) && {
            data += 1;
            data % 20 == 0
        }
    }));
}

/// The completions each node saw, in order: (opcode, tag, status).
type Seen = [Vec<(u8, u64, u8)>; 2];

/// Streams `MSGS` messages from node 0 to node 1 (one frame and three,
/// alternating; every 20th DATA frame lost) and returns the completions
/// each node saw.
fn stream(cfg: Config, sides: bool) -> (Pair, Seen) {
    let mut p = Pair::new(cfg, 1500, [1 << 20, 1 << 20]);
    p.world.sides = sides;
    lose_every_20th_data_frame(&mut p);
    const MSGS: u64 = 100;
    let len = |i: u64| if i % 2 == 0 { 64 } else { 4000 };
    for i in 0..MSGS {
        p.recv(1, i, i * 4096, len(i));
    }
    // Sends in batches of 10, each posted once the one before completed:
    // a doorbell per batch.
    let (mut seen, mut posted): (Seen, u64) = Default::default();
    while seen[0].len() < MSGS as usize || seen[1].len() < MSGS as usize {
        if seen[0].len() as u64 == posted && posted < MSGS {
            for i in posted..posted + 10 {
                p.send(0, i, i * 4096, len(i));
            }
            posted += 10;
        }
        assert!(p.step(), "the stream stalled at {} sent, {} received", seen[0].len(), seen[1].len());
        for (n, s) in seen.iter_mut().enumerate() {
            while let Some(c) = p.poll(n as u16) {
                s.push((c.opcode, c.tag, c.status));
            }
        }
    }
    (p, seen)
}

/// The sides' entry points (`Nic::recv_side_frames`,
/// `Nic::recv_side_doorbell`, `Nic::send_side_doorbell`), which a daemon
/// calls holding one side's lock, handle a stream by themselves: the
/// whole program runs only for the first send to a new peer, its first
/// frame, and loss. What the hosts see is what they see without them.
#[test]
fn a_stream_runs_on_the_sides_entry_points_alone() {
    let (_, without) = stream(Config::default(), false);
    let (p, with) = stream(Config::default(), true);
    assert_eq!(with, without, "the same completions, in the same order, with the sides' entry points");
    assert!(with[1].iter().all(|&(_, _, st)| st == Status::Success as u8));
    let (rx_doorbells, rx_batches, _) = p.world.nodes[1].nic.side_entries();
    let [(_, _), (_, batches_whole)] = p.world.nodes[1].nic.entries();
    eprintln!("receiver: {rx_doorbells} doorbells and {rx_batches} frame batches alone, {batches_whole} batches whole");
    assert!(rx_batches > 10 * batches_whole, "the receiver's frames went to the receive side alone");
    assert!(rx_doorbells > 0, "the receiver's receives were posted by the receive side alone");
    let (_, _, tx_doorbells) = p.world.nodes[0].nic.side_entries();
    let [(a, w), _] = p.world.nodes[0].nic.entries();
    eprintln!("sender: {tx_doorbells} doorbells alone, {} whole", a + w);
    assert!(tx_doorbells >= 9, "the sender's doorbells after the first needed only the send side");
    assert!(a + w <= 2, "only the port's opening and the first send (to a new peer) took the whole program");
    assert_eq!(p.world.nodes[0].nic.send_descs().1, 1, "the send to a new peer went to the whole program");
    // The counters both sides published sum to what the NICs counted.
    assert_eq!(p.counter(1, counter::MSGS_RX), 100);
    assert_eq!(p.counter(0, counter::MSGS_TX), 100);
}

/// Under DSR the receive side classifies an ACK or NACK and hands it to
/// CPU A (receive ack's first half): at the sender, the ACK frames'
/// batches run on the receive side alone too, and CPU A updates the send
/// records and resends what loss NACKs name on the send side alone.
#[test]
fn under_dsr_the_senders_acks_are_classified_on_the_receive_side_alone() {
    let cfg = Config { cpu_plan: emp_uapi::image::cpu_plan::DSR, ..Config::default() };
    let (_, without) = stream(cfg, false);
    let (p, with) = stream(cfg, true);
    assert_eq!(with, without, "the same completions, in the same order, with the sides' entry points");
    let (_, batches, _) = p.world.nodes[0].nic.side_entries();
    let [_, (_, batches_whole)] = p.world.nodes[0].nic.entries();
    eprintln!("sender's ACK batches: {batches} alone, {batches_whole} whole");
    // Every 20th DATA frame is lost: loss NACKs are classified alone too.
    assert_eq!(batches_whole, 0, "the sender's ACKs and NACKs were classified alone ({batches} batches)");
    // And CPU A updated the send records from them on the send side alone.
    let runs = p.world.nodes[0].nic.side_queue_runs();
    eprintln!("sender's CPU A: {runs} queue runs on the send side alone");
    assert!(runs * 2 > batches, "CPU A took the classified ACKs alone: {runs} runs for {batches} batches");
}
