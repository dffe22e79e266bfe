//! The send window bounds per-message state: a 1 GiB message holds no more
//! NIC state than a message of one window, on either side, and a sender
//! whose oldest group is lost stops at the window instead of running ahead.

mod common;

use common::Pair;
use emp_firmware::Config;
use emp_uapi::desc::Status;
use emp_uapi::sram::counter;
use emp_uapi::wire::{self, Frame, FrameKind};

const GIB: u64 = 1 << 30;
const MTU: u32 = 9000;

/// Runs until both nodes hold one live record each (sender and receiver)
/// and the receiver took at least `frames` more frames; returns the state
/// bytes of both.
fn state_mid_flight(p: &mut Pair, frames: u64) -> (usize, usize) {
    let start = p.counter(1, counter::RX_FRAMES);
    while p.counter(1, counter::RX_FRAMES) < start + frames {
        assert!(p.step(), "the message stalled");
    }
    assert_eq!((p.occupancy(0).tx_msgs, p.occupancy(1).rx_msgs), (1, 1), "both records live");
    (p.message_state_bytes(0), p.message_state_bytes(1))
}

fn run_until_done(p: &mut Pair) -> (Status, Status) {
    let (mut sent, mut got) = (None, None);
    while sent.is_none() || got.is_none() {
        assert!(p.step(), "no completion");
        sent = sent.or_else(|| p.poll(0));
        got = got.or_else(|| p.poll(1));
    }
    let st = |c: emp_uapi::desc::Cqe| Status::from_u8(c.status).unwrap();
    (st(sent.unwrap()), st(got.unwrap()))
}

#[test]
fn test_1_gib_message_holds_the_state_of_one_window() {
    let cfg = Config::default();
    let mut p = Pair::new(cfg, MTU, [GIB, 1 << 20]);
    // A message of exactly one window, mid-flight.
    let window_bytes = cfg.window_frames as u64 * wire::payload_capacity(MTU, 1) as u64;
    p.recv(1, 1, 0, window_bytes);
    p.send(0, 1, 0, window_bytes);
    let small = state_mid_flight(&mut p, 2);
    assert_eq!(run_until_done(&mut p), (Status::Success, Status::Success));

    // 1 GiB (msg_max), into a 64 KiB receive (the rest is truncated, so the
    // receiver's memory stays untouched), streamed to the end.
    p.recv(1, 2, 0, 64 << 10);
    p.send(0, 2, 0, GIB);
    let big = state_mid_flight(&mut p, 100 * cfg.window_frames as u64);
    assert_eq!(big, small, "(sender, receiver) state bytes: 1 GiB vs one window");
    assert_eq!(run_until_done(&mut p), (Status::Success, Status::Truncated));
    let frames = wire::frames_for(GIB, MTU) + wire::frames_for(window_bytes, MTU);
    assert_eq!(p.counter(1, counter::RX_FRAMES), frames, "every frame crossed");
    assert_eq!(p.counter(0, counter::RETRANSMITS), 0);
}

#[test]
fn test_lost_oldest_group_stops_the_sender_at_the_window() {
    // Frame 1 of a long message is lost once, and every NACK too, so only
    // the retransmission timer repairs it: meanwhile the ACKs of the groups
    // above group 0 must not let the sender run past the window.
    let cfg = Config::default();
    let mut p = Pair::new(cfg, 1500, [4 << 20, 4 << 20]);
    let mut dropped = false;
    p.world.drop_filter = Some(Box::new(move |_, _, bytes: &[u8]| match Frame::parse(bytes) {
        Ok(Frame::Nack { .. }) => true,
        Ok(Frame::Data { hdr, .. }) if hdr.kind == FrameKind::Data as u8 && hdr.frame_index == 1 && !dropped => {
            dropped = true;
            true
        }
        _ => false,
    }));
    let len = 2 << 20;
    let data: Vec<u8> = (0..len as u32).map(|i| (i * 13 + 5) as u8).collect();
    p.write(0, 0, &data);
    p.recv(1, 3, 0, len);
    p.send(0, 3, 0, len);
    // Until the loss is repaired (by a NACK or the timer), the sender has
    // sent no frame beyond the window.
    while p.counter(0, counter::RETRANSMITS) == 0 {
        assert!(p.step());
        let sent = p.counter(0, counter::TX_FRAMES);
        assert!(sent <= cfg.window_frames as u64, "{sent} frames sent with frame 1 unacknowledged");
    }
    assert_eq!(run_until_done(&mut p), (Status::Success, Status::Success));
    assert_eq!(p.read(1, 0, len as usize), data);
    assert_eq!(p.counter(1, counter::DROPPED_UNEXPECTED), 0, "nothing arrived beyond the window");
}

#[test]
fn test_one_frame_message_takes_no_receive_record() {
    // One receive record, held by a three-frame message whose frame 1 is
    // lost once: a one-frame message behind it is still received at once
    // (it needs no record), not refused for want of one.
    let cfg = Config { rx_max: 1, ..Config::default() };
    let mut p = Pair::new(cfg, 1500, [1 << 20, 1 << 20]);
    let mut dropped = false;
    p.world.drop_filter = Some(Box::new(move |_, _, bytes: &[u8]| match Frame::parse(bytes) {
        Ok(Frame::Data { hdr, .. }) if hdr.kind == FrameKind::Data as u8 && hdr.frame_index == 1 && !dropped => {
            dropped = true;
            true
        }
        _ => false,
    }));
    let big: Vec<u8> = (0..4000u32).map(|i| (i * 7 + 3) as u8).collect();
    p.write(0, 0, &big);
    p.write(0, 8192, b"one frame");
    let (big_rx, small_rx) = (p.recv(1, 1, 0, 4000), p.recv(1, 2, 8192, 64));
    p.send(0, 1, 0, 4000);
    p.send(0, 2, 8192, 9);
    let mut done = Vec::new();
    while done.len() < 2 {
        assert!(p.step(), "a receive stalled");
        while let Some(c) = p.poll(1) {
            assert_eq!(Status::from_u8(c.status), Some(Status::Success));
            if c.wr_id == small_rx {
                assert_eq!(p.occupancy(1).rx_msgs, 1, "the long message's record is live");
            }
            done.push(c.wr_id);
        }
    }
    assert_eq!(done, [small_rx, big_rx], "the one-frame message completed first");
    assert_eq!((p.read(1, 8192, 9), p.read(1, 0, 4000)), (b"one frame".to_vec(), big));
    assert_eq!(p.counter(1, counter::DROPPED_UNEXPECTED), 0, "nothing refused");
    assert_eq!(p.occupancy(1).rx_msgs, 0);
}

#[test]
fn test_an_armed_port_is_interrupted_once_after_its_completions() {
    use emp_sim::host::Sram;
    use emp_uapi::sram::ctl;
    let mut p = Pair::new(Config::default(), 1500, [1 << 16, 1 << 16]);
    let arm = p.world.layout.port(0).ctl(ctl::ARM);
    let arm_word = |p: &mut Pair, n: usize| Sram(&mut p.world.nodes[n].sram).u32(arm);
    let exchange = |p: &mut Pair, n: u32| {
        let mut got = 0;
        for i in 0..n {
            p.recv(1, i as u64, 64 * i as u64, 64);
        }
        for i in 0..n {
            p.send(0, i as u64, 64 * i as u64, 8);
        }
        while got < 2 * n {
            assert!(p.step(), "stalled");
            got += p.poll(0).is_some() as u32 + p.poll(1).is_some() as u32;
        }
    };
    let irqs = |p: &Pair| [p.world.nodes[0].interrupts, p.world.nodes[1].interrupts];
    // Not armed: completions raise nothing (the admin mailbox's own
    // interrupts, of the ports' opening, came before).
    let before = irqs(&p);
    exchange(&mut p, 3);
    assert_eq!(irqs(&p), before);
    // Both hosts arm: one interrupt each, however many entries follow,
    // and the NIC disarms.
    for n in 0..2 {
        Sram(&mut p.world.nodes[n].sram).put_u32(arm, 1);
    }
    exchange(&mut p, 3);
    assert_eq!(irqs(&p), before.map(|i| i + 1));
    assert_eq!([arm_word(&mut p, 0), arm_word(&mut p, 1)], [0, 0], "disarmed");
    exchange(&mut p, 2);
    assert_eq!(irqs(&p), before.map(|i| i + 1), "once per arming");
}
