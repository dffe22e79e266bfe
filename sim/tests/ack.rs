//! PM's cumulative, coalesced ACK (seed 003 §3.3) and EMP's piggybacked
//! flow control with both of its levels (thesis §2.3.1), scripted on a
//! `Cluster`: every ACK acknowledges every message before its
//! `rx_expected`, a run of wholly received messages costs one ACK, a lost
//! ACK is made good by the next one, and a sender obeys the receiver's room.

use std::cell::RefCell;
use std::rc::Rc;

use emp_firmware::{Config, FlowControl, MatchMode};
use emp_sim::cluster::Cluster;
use emp_sim::world::WireConfig;
use emp_uapi::desc::{Cqe, Status};
use emp_uapi::sram::counter;
use emp_uapi::wire::{Frame, FC_STOP};

const MS: u64 = 1_000_000;
const US: u64 = 1_000;

fn status(c: &Cqe) -> Status {
    Status::from_u8(c.status).unwrap()
}

fn payload(i: u32) -> Vec<u8> {
    i.to_le_bytes().repeat(2)
}

/// Streams `n` 8-byte messages from node 0 to node 1 into receives posted
/// before (any tag, in order); checks each receive got the message of its
/// position, whole, and every send succeeded. Returns the receiver's ACK
/// frames.
fn stream(c: &mut Cluster, n: u32) -> u64 {
    let recvs: Vec<u64> = (0..n).map(|_| c.recv(1, (0, 0), 0, u64::MAX, 8)).collect();
    let sends: Vec<u64> = (0..n).map(|i| c.send(0, 1, i as u64, &payload(i))).collect();
    for (i, &r) in recvs.iter().enumerate() {
        let rc = c.wait(1, r, 500 * MS).unwrap_or_else(|| panic!("receive {i} never completed"));
        assert_eq!((status(&rc), rc.tag), (Status::Success, i as u64), "receive {i} got message {}", rc.tag);
        assert_eq!(c.received(r, 8), payload(i as u32), "message {i} intact");
    }
    for (i, &s) in sends.iter().enumerate() {
        let sc = c.wait(0, s, 500 * MS).unwrap_or_else(|| panic!("send {i} never completed"));
        assert_eq!(status(&sc), Status::Success, "send {i}");
    }
    c.counter(1, counter::ACKS_TX)
}

fn coalescing(delay_ns: u64, max: u32) -> Config {
    Config { ack_delay_ns: delay_ns, ack_coalesce_max: max, ..Config::default() }
}

#[test]
fn test_streaming_small_messages_costs_one_ack_per_run() {
    let n = 240;
    let mut each = Cluster::new(2, coalescing(0, 1), 0, 1500, WireConfig::default());
    let one_per_msg = stream(&mut each, n);
    assert_eq!(one_per_msg, n as u64, "coalescing off: one ACK per message");
    let mut run = Cluster::new(2, coalescing(20 * US, 16), 0, 1500, WireConfig::default());
    let coalesced = stream(&mut run, n);
    assert!(coalesced * 8 <= n as u64, "{coalesced} ACKs for {n} messages");
    assert_eq!(run.counter(0, counter::RETRANSMITS), 0, "no ACK came too late");
}

#[test]
fn test_a_lone_message_is_acked_without_delay() {
    // With no delay the coalesced ACK leaves when the frames that came in
    // together are handled: a lone send completes exactly as soon as with
    // one ACK per message.
    let done_at = |cfg: Config| {
        let mut c = Cluster::new(2, cfg, 0, 1500, WireConfig::default());
        c.recv(1, (0, 0), 7, 0, 8);
        let s = c.send(0, 1, 7, &payload(7));
        let (sc, seen) = c.wait_seen(0, s, 10 * MS).expect("send completes");
        assert_eq!(status(&sc), Status::Success);
        seen
    };
    assert_eq!(done_at(coalescing(0, 16)), done_at(coalescing(0, 1)));
}

#[test]
fn test_a_lost_ack_is_made_good_by_the_next_cumulative_one() {
    // Every ACK on its own (no coalescing), and the first one lost: the
    // second acknowledges both messages, before any retransmission timer.
    let mut c = Cluster::new(2, coalescing(0, 1), 0, 1500, WireConfig::default());
    let dropped = Rc::new(RefCell::new(0u32));
    let d = dropped.clone();
    c.world.drop_filter = Some(Box::new(move |src, _, b| {
        let first_ack = src == 1 && matches!(Frame::parse(b), Ok(Frame::Ack { .. })) && *d.borrow() == 0;
        if first_ack {
            *d.borrow_mut() += 1;
        }
        first_ack
    }));
    let r: Vec<u64> = (0..2).map(|i| c.recv(1, (0, 0), i, 0, 8)).collect();
    let s: Vec<u64> = (0..2).map(|i| c.send(0, 1, i, &payload(i as u32))).collect();
    for w in r {
        assert_eq!(status(&c.wait(1, w, 10 * MS).unwrap()), Status::Success);
    }
    for w in s {
        assert_eq!(status(&c.wait(0, w, 10 * MS).unwrap()), Status::Success);
    }
    assert_eq!(*dropped.borrow(), 1, "the first ACK was lost");
    assert_eq!(c.counter(1, counter::ACKS_TX), 2);
    assert_eq!(c.counter(0, counter::TIMEOUTS), 0, "freed by the second ACK, not by a retransmission");
    assert_eq!(c.counter(0, counter::RETRANSMITS), 0);
}

#[test]
fn test_every_ack_lost_but_the_last_frees_everything() {
    // A stream whose ACKs are all lost until the last message's: that one
    // frees every message before it.
    let n = 20u32;
    let mut c = Cluster::new(2, coalescing(0, 1), 0, 1500, WireConfig::default());
    let acks = Rc::new(RefCell::new(0u32));
    let a = acks.clone();
    c.world.drop_filter = Some(Box::new(move |src, _, b| {
        if src != 1 || !matches!(Frame::parse(b), Ok(Frame::Ack { .. })) {
            return false;
        }
        *a.borrow_mut() += 1;
        *a.borrow() < n
    }));
    let r: Vec<u64> = (0..n).map(|i| c.recv(1, (0, 0), i as u64, 0, 8)).collect();
    // One at a time, so the receiver ACKs each before the next arrives.
    let mut s = Vec::new();
    for i in 0..n {
        s.push(c.send(0, 1, i as u64, &payload(i)));
        c.run_for(20 * US);
    }
    for w in r {
        assert_eq!(status(&c.wait(1, w, 10 * MS).unwrap()), Status::Success);
    }
    for w in s {
        assert_eq!(status(&c.wait(0, w, 10 * MS).unwrap()), Status::Success);
    }
    assert_eq!(c.counter(0, counter::TIMEOUTS), 0, "the last ACK freed all {n}");
}

#[test]
fn test_coalesced_acks_keep_every_message_exactly_once_under_loss_dup_reorder() {
    for (i, (loss, dup, reorder)) in
        [(0.1, 0.0, 0.0), (0.0, 0.1, 0.0), (0.0, 0.0, 0.4), (0.1, 0.05, 0.3)].into_iter().enumerate()
    {
        let wire = WireConfig { loss, dup, reorder, ..WireConfig::default() };
        let mut c = Cluster::new(2, coalescing([0, 5 * US, 40 * US, 100 * US][i], 16), 0, 1500, wire);
        stream(&mut c, 120);
        let o = c.world.nodes[0].nic.occupancy();
        assert_eq!(o.tx_msgs, 0, "every send record freed (loss {loss}, dup {dup}, reorder {reorder})");
    }
}

#[test]
fn test_multi_frame_message_in_progress_holds_the_cumulative_ack_back() {
    // A 30 000-byte message (21 frames) then small ones, all under loss: a
    // small one's ACK must not free the large one while its frames are
    // still missing. The large send succeeds only once all its frames are in.
    let wire = WireConfig { loss: 0.15, ..WireConfig::default() };
    let mut c = Cluster::new(2, coalescing(10 * US, 16), 0, 1500, wire);
    let big: Vec<u8> = (0..30_000).map(|i| (i % 251) as u8).collect();
    let rb = c.recv(1, (0, 0), 1, 0, 30_000);
    let rs: Vec<u64> = (0..10).map(|i| c.recv(1, (0, 0), 100 + i, 0, 8)).collect();
    let sb = c.send(0, 1, 1, &big);
    let ss: Vec<u64> = (0..10).map(|i| c.send(0, 1, 100 + i, &payload(i as u32))).collect();
    for w in ss {
        assert_eq!(status(&c.wait(0, w, 500 * MS).unwrap()), Status::Success);
    }
    assert_eq!(status(&c.wait(0, sb, 500 * MS).unwrap()), Status::Success);
    assert_eq!(status(&c.wait(1, rb, 500 * MS).unwrap()), Status::Success);
    assert_eq!(c.received(rb, 30_000), big);
    for w in rs {
        assert_eq!(status(&c.wait(1, w, 500 * MS).unwrap()), Status::Success);
    }
}

/// A receiver that posts one receive every `period_ns` (two at first),
/// ordered refusal without an overflow buffer, so every message that finds
/// no receive is refused and must be sent again; the sender posts `n`
/// messages at once. Returns (refusals by the receiver, STOP levels it
/// sent).
fn slow_receiver(flow: FlowControl, n: u32, period_ns: u64) -> (u64, u32) {
    let cfg = Config { flow_control: flow, matching: MatchMode::OrderedRefusal, ..Config::default() };
    let mut c = Cluster::new(2, cfg, 0, 1500, WireConfig::default());
    let stops = Rc::new(RefCell::new(0u32));
    let s2 = stops.clone();
    c.world.drop_filter = Some(Box::new(move |src, _, b| {
        if let Ok(Frame::Ack { body, .. } | Frame::Nack { body, .. }) = Frame::parse(b) {
            if src == 1 && body.fc_level == FC_STOP {
                *s2.borrow_mut() += 1;
            }
        }
        false
    }));
    let mut recvs: Vec<u64> = (0..2).map(|_| c.recv(1, (0, 0), 0, u64::MAX, 8)).collect();
    let sends: Vec<u64> = (0..n).map(|i| c.send(0, 1, i as u64, &payload(i))).collect();
    while recvs.len() < n as usize {
        c.run_for(period_ns);
        recvs.push(c.recv(1, (0, 0), 0, u64::MAX, 8));
    }
    for (i, &r) in recvs.iter().enumerate() {
        let rc = c.wait(1, r, 2_000 * MS).unwrap_or_else(|| panic!("receive {i} never completed"));
        assert_eq!((status(&rc), rc.tag), (Status::Success, i as u64), "in order");
    }
    for s in sends {
        assert_eq!(status(&c.wait(0, s, 2_000 * MS).unwrap()), Status::Success);
    }
    let refused = c.counter(1, counter::DROPPED_UNEXPECTED);
    let stops = *stops.borrow();
    (refused, stops)
}

#[test]
fn test_a_sender_that_obeys_credits_is_never_refused_by_a_slow_receiver() {
    let (refused, stops) = slow_receiver(FlowControl::Piggyback, 40, 50 * US);
    assert!(stops > 0, "the receiver ran out of room and said stop");
    assert_eq!(refused, 0, "a sender within the receiver's credits sends nothing it must send again");
    // The same run with a sender that ignores credits: refused, again and again.
    let (ignored, _) = slow_receiver(FlowControl::Off, 40, 50 * US);
    assert!(ignored > 10, "ignoring credits costs refusals ({ignored})");
}

#[test]
fn test_a_stopped_sender_whose_update_is_lost_probes() {
    // Every flow-control update (an ACK of no group) is lost: the sender
    // told to stop still finishes, by probing after `rnr_delay_ns_max`.
    let cfg = Config { flow_control: FlowControl::Piggyback, matching: MatchMode::OrderedRefusal, ..Config::default() };
    let mut c = Cluster::new(2, cfg, 0, 1500, WireConfig::default());
    c.world.drop_filter = Some(Box::new(
        |_, _, b| matches!(Frame::parse(b), Ok(Frame::Ack { body, .. }) if body.group == emp_uapi::wire::ACK_NO_GROUP),
    ));
    let r0 = c.recv(1, (0, 0), 0, u64::MAX, 8);
    let s: Vec<u64> = (0..3).map(|i| c.send(0, 1, i, &payload(i as u32))).collect();
    c.run_for(MS);
    let rest: Vec<u64> = (0..2).map(|_| c.recv(1, (0, 0), 0, u64::MAX, 8)).collect();
    for (i, w) in [r0].into_iter().chain(rest).enumerate() {
        let rc = c.wait(1, w, 100 * MS).expect("receive completes");
        assert_eq!(rc.tag, i as u64);
    }
    for w in s {
        assert_eq!(status(&c.wait(0, w, 100 * MS).unwrap()), Status::Success);
    }
}

/// A held-back ACK leaves before any frame the receiver then sends that
/// peer: an answer never reaches a sender before the ACK of what it
/// answers, so the sender's send completes before the answer's receive
/// (a program waiting for its send, then for the answer, sees them in
/// that order).
#[test]
fn test_an_answer_never_overtakes_the_ack_it_follows() {
    let cfg = Config { ack_delay_ns: 200 * US, ..Config::default() };
    let mut c = Cluster::new(2, cfg, 0, 1500, WireConfig::default());
    for round in 0..20u32 {
        let answer = c.recv(0, (1, 0), 1000 + round as u64, 0, 8);
        let question = c.recv(1, (0, 0), round as u64, 0, 8);
        let sent = c.send(0, 1, round as u64, &payload(round));
        c.wait(1, question, 50 * MS).expect("the question arrives");
        // The receiver's host answers at once, well inside the ACK delay.
        let reply = c.send(1, 0, 1000 + round as u64, &payload(round + 1));
        let (_, got_answer) = c.wait_seen(0, answer, 50 * MS).expect("the answer arrives");
        let (sc, send_done) = c.wait_seen(0, sent, 50 * MS).expect("the send completes");
        assert_eq!(status(&sc), Status::Success);
        assert!(
            send_done <= got_answer,
            "round {round}: the answer ({got_answer} ns) overtook the ACK ({send_done} ns)"
        );
        assert_eq!(status(&c.wait(1, reply, 50 * MS).unwrap()), Status::Success);
    }
}

#[test]
fn test_a_receiver_that_closes_right_after_its_receive_still_acks_it() {
    // The ACK is owed (coalescing, 200 µs delay) when the receiver's process
    // exits: closing the port must send it, or the sender retransmits into
    // a closed port and fails a send that in fact arrived.
    let mut c = Cluster::new(2, coalescing(200 * US, 16), 0, 1500, WireConfig::default());
    let r = c.recv(1, (0, 0), 3, 0, 8);
    let s = c.send(0, 1, 3, &payload(3));
    let rc = c.wait(1, r, 10 * MS).expect("receive completes");
    assert_eq!(status(&rc), Status::Success);
    assert_eq!(c.counter(1, counter::ACKS_TX), 0, "the ACK is still owed");
    c.close_port(1);
    let sc = c.wait(0, s, 500 * MS).expect("send completes");
    assert_eq!(status(&sc), Status::Success, "the delivered message's send succeeds");
}

#[test]
fn test_a_delivered_message_whose_ack_is_lost_after_the_receiver_closed_still_succeeds() {
    // TIME-WAIT: the receiver delivers the message, its ACK (flushed at the
    // close) is lost, and the port closes. The sender's retransmission
    // must be acknowledged by what the closed port remembers, not refused
    // as sent to a closed port; a message never delivered still fails.
    let mut c = Cluster::new(2, coalescing(200 * US, 16), 0, 1500, WireConfig::default());
    let acks_lost = Rc::new(RefCell::new(0u32));
    let lost = acks_lost.clone();
    c.world.drop_filter = Some(Box::new(move |src, _, b| {
        let ack = src == 1 && matches!(Frame::parse(b), Ok(Frame::Ack { .. })) && *lost.borrow() == 0;
        if ack {
            *lost.borrow_mut() += 1;
        }
        ack
    }));
    let r = c.recv(1, (0, 0), 3, 0, 8);
    let s = c.send(0, 1, 3, &payload(3));
    assert_eq!(status(&c.wait(1, r, 10 * MS).expect("receive completes")), Status::Success);
    c.close_port(1);
    let sc = c.wait(0, s, 2_000 * MS).expect("send completes");
    assert_eq!(*acks_lost.borrow(), 1, "the close's ACK was lost");
    assert!(c.counter(0, counter::RETRANSMITS) >= 1, "the sender retransmitted into the closed port");
    assert_eq!(status(&sc), Status::Success, "the delivered message's send succeeds");
    // The next message finds the port closed.
    let s2 = c.send(0, 1, 4, &payload(4));
    let sc2 = c.wait(0, s2, 2_000 * MS).expect("send completes");
    assert_eq!(status(&sc2), Status::RemotePortClosed, "a message not delivered is refused");
}
