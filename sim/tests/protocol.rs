//! Targeted protocol tests: one mechanism each, scripted on a `Cluster`.
//! Named `test_<situation>_<event>` as in smoltcp.

use emp_firmware::{Config, FlowControl, MatchMode};
use emp_sim::cluster::Cluster;
use emp_sim::world::{Partition, WireConfig};
use emp_uapi::desc::{Opcode, Status, WorkDesc};
use emp_uapi::sram::{counter, FEATURE_MODIFIED_ACK_NACK, FEATURE_OVERFLOW};
use emp_uapi::wire::{Frame, FrameKind};
use emp_uapi::{ANY_NODE, ANY_PORT};

const MS: u64 = 1_000_000;

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn cluster(nodes: u16) -> Cluster {
    Cluster::new(nodes, Config::default(), 0, 1500, WireConfig::default())
}

fn status(c: &emp_uapi::desc::Cqe) -> Status {
    Status::from_u8(c.status).unwrap()
}

#[test]
fn test_posted_receive_message_delivered() {
    let mut c = cluster(2);
    let msg = data(10_000, 1);
    let r = c.recv(1, (0, 0), 42, 0, 10_000);
    let s = c.send(0, 1, 42, &msg);
    let rc = c.wait(1, r, 10 * MS).expect("receive completes");
    let sc = c.wait(0, s, 10 * MS).expect("send completes");
    assert_eq!((status(&rc), status(&sc)), (Status::Success, Status::Success));
    assert_eq!((rc.byte_len, rc.msg_len, rc.tag, rc.src_node, rc.src_port), (10_000, 10_000, 42, 0, 0));
    assert_eq!(c.received(r, 10_000), msg);
    // 10 000 B at MTU 1500 = 7 frames = 3 groups of 3: one ACK per group.
    assert_eq!(c.counter(0, counter::TX_FRAMES), 7);
    assert_eq!(c.counter(1, counter::ACKS_TX), 3);
    assert_eq!(c.counter(0, counter::RETRANSMITS), 0);
}

#[test]
fn test_zero_length_message_delivered() {
    let mut c = cluster(2);
    let r = c.recv(1, (0, 0), 1, 0, 0);
    c.send(0, 1, 1, &[]);
    let rc = c.wait(1, r, 10 * MS).unwrap();
    assert_eq!((status(&rc), rc.byte_len), (Status::Success, 0));
}

#[test]
fn test_ordered_refusal_drops_unexpected_message_until_receive_posted() {
    let cfg = Config { matching: MatchMode::OrderedRefusal, ..Config::default() };
    let mut c = Cluster::new(2, cfg, 0, 1500, WireConfig::default());
    let msg = data(3000, 2);
    let s = c.send(0, 1, 9, &msg);
    c.run_for(5 * MS);
    assert!(c.completions(0).is_empty(), "no receive yet: the send must not complete");
    assert!(c.counter(1, counter::DROPPED_UNEXPECTED) > 0, "EMP drops unexpected frames");
    assert!(c.counter(1, counter::NACKS_TX) > 0, "receiver says it is not ready");
    let r = c.recv(1, (0, 0), 9, 0, 3000);
    let rc = c.wait(1, r, 20 * MS).expect("delivered after posting");
    assert_eq!(status(&rc), Status::Success);
    assert_eq!(c.received(r, 3000), msg);
    assert_eq!(status(&c.wait(0, s, 20 * MS).unwrap()), Status::Success);
}

#[test]
fn test_overflow_buffer_takes_small_unexpected_message() {
    let cfg = Config { overflow_slots: 4, ..Config::default() };
    let mut c = Cluster::new(2, cfg, FEATURE_OVERFLOW, 1500, WireConfig::default());
    let msg = data(200, 3);
    let s = c.send(0, 1, 5, &msg);
    assert_eq!(status(&c.wait(0, s, 10 * MS).unwrap()), Status::Success, "acked from the overflow buffer");
    assert_eq!(c.counter(1, counter::OVERFLOW_MSGS), 1);
    assert_eq!(c.counter(0, counter::RETRANSMITS), 0);
    let r = c.recv(1, (ANY_NODE, ANY_PORT), 5, 0, 500);
    let rc = c.wait(1, r, 10 * MS).unwrap();
    assert_eq!((status(&rc), rc.byte_len), (Status::Success, 200));
    assert_eq!(c.received(r, 200), msg);
    assert_eq!(c.world.nodes[1].nic.occupancy().overflow_used, 0);
}

#[test]
fn test_wildcards_and_ignore_mask_match_in_posting_order() {
    let mut c = cluster(3);
    let any = c.recv(2, (ANY_NODE, ANY_PORT), 0xAB00, 0xFF, 100); // tag 0xABxx from anyone
    let from1 = c.recv(2, (1, 0), 0, u64::MAX, 100); // anything from node 1
    let exact = c.recv(2, (0, 0), 0x77, 0, 100);
    c.send(0, 2, 0x77, &data(10, 1));
    c.run_for(2 * MS);
    c.send(1, 2, 0xAB42, &data(20, 2));
    c.run_for(2 * MS);
    c.send(1, 2, 0x1234, &data(30, 3));
    let got_exact = c.wait(2, exact, 10 * MS).unwrap();
    let got_any = c.wait(2, any, 10 * MS).unwrap();
    let got_from1 = c.wait(2, from1, 10 * MS).unwrap();
    assert_eq!((got_exact.tag, got_exact.byte_len), (0x77, 10));
    // 0xAB42 from node 1 matches both `any` and `from1`: the earlier posted wins.
    assert_eq!((got_any.tag, got_any.src_node), (0xAB42, 1));
    assert_eq!((got_from1.tag, got_from1.byte_len), (0x1234, 30));
}

#[test]
fn test_short_buffer_message_truncated() {
    let mut c = cluster(2);
    let msg = data(5000, 4);
    let r = c.recv(1, (0, 0), 1, 0, 1000);
    let s = c.send(0, 1, 1, &msg);
    let rc = c.wait(1, r, 10 * MS).unwrap();
    assert_eq!((status(&rc), rc.byte_len, rc.msg_len), (Status::Truncated, 1000, 5000));
    assert_eq!(c.received(r, 1000), msg[..1000]);
    assert_eq!(status(&c.wait(0, s, 10 * MS).unwrap()), Status::Success);
}

#[test]
fn test_closed_port_send_fails_remote_port_closed() {
    let mut c = cluster(2);
    assert_eq!(c.close_port(1), Some(0));
    let s = c.send(0, 1, 1, &data(100, 5));
    assert_eq!(status(&c.wait(0, s, 10 * MS).unwrap()), Status::RemotePortClosed);
    assert_eq!(c.world.nodes[0].nic.occupancy().tx_msgs, 0);
}

#[test]
fn test_receiver_dies_mid_transfer_sender_gets_error() {
    let mut c = cluster(2);
    let r = c.recv(1, (0, 0), 1, 0, 1 << 20);
    let s = c.send(0, 1, 1, &data(1 << 20, 6));
    c.run_for(50_000); // some frames are through
    assert!(c.world.nodes[1].nic.occupancy().rx_msgs == 1);
    assert_eq!(c.close_port(1), Some(0));
    let flushed = c.completions(1);
    assert_eq!(flushed.iter().find(|x| x.wr_id == r).map(status), Some(Status::Flushed));
    assert_eq!(status(&c.wait(0, s, 50 * MS).unwrap()), Status::RemotePortClosed);
    assert_eq!(c.world.nodes[1].nic.occupancy(), emp_firmware::Occupancy::default());
}

#[test]
fn test_partitioned_forever_send_fails_retry_limit() {
    let cfg = Config {
        retry_limit: 5,
        rto_ns: 100_000,
        rto_ns_max: 1_000_000,
        rx_idle_timeout_ns: 100 * MS,
        ..Config::default()
    };
    let wire = WireConfig {
        partition: Some(Partition { start_ns: 0, end_ns: u64::MAX, side: vec![true, false] }),
        ..WireConfig::default()
    };
    let mut c = Cluster::new(2, cfg, 0, 1500, wire);
    c.recv(1, (0, 0), 1, 0, 100);
    let s = c.send(0, 1, 1, &data(100, 7));
    assert_eq!(status(&c.wait(0, s, 100 * MS).unwrap()), Status::RetryLimitExceeded);
    assert_eq!(c.counter(0, counter::TIMEOUTS), 6);
}

#[test]
fn test_partition_heals_message_delivered() {
    let wire = WireConfig {
        partition: Some(Partition { start_ns: 0, end_ns: 30 * MS, side: vec![true, false] }),
        ..WireConfig::default()
    };
    let mut c = Cluster::new(2, Config::default(), 0, 1500, wire);
    let msg = data(20_000, 8);
    let r = c.recv(1, (0, 0), 1, 0, 20_000);
    c.send(0, 1, 1, &msg);
    let rc = c.wait(1, r, 10_000 * MS).unwrap();
    assert_eq!(status(&rc), Status::Success);
    assert!(c.world.now > 30 * MS);
    assert_eq!(c.received(r, 20_000), msg);
}

#[test]
fn test_lost_frame_nack_recovers_before_timeout() {
    // Drop data frame 1 of the first transmission only.
    let mut c = cluster(2);
    let mut dropped = false;
    c.world.drop_filter = Some(Box::new(move |_, _, b| {
        if let Ok(Frame::Data { hdr, .. }) = Frame::parse(b) {
            if hdr.frame_index == 1 && !dropped {
                dropped = true;
                return true;
            }
        }
        false
    }));
    let msg = data(6000, 9);
    let r = c.recv(1, (0, 0), 1, 0, 6000);
    c.send(0, 1, 1, &msg);
    let rc = c.wait(1, r, 100 * MS).unwrap();
    assert_eq!(status(&rc), Status::Success);
    assert_eq!(c.received(r, 6000), msg);
    assert!(c.counter(1, counter::NACKS_TX) >= 1, "the hole was NACKed");
    assert_eq!(c.counter(0, counter::TIMEOUTS), 0, "recovered by NACK, not by the timer");
    assert!(c.world.now < Config::default().rto_ns, "faster than one RTO");
}

#[test]
fn test_duplicated_frames_delivered_once() {
    let wire = WireConfig { dup: 1.0, ..WireConfig::default() };
    let mut c = Cluster::new(2, Config::default(), 0, 1500, wire);
    let msg = data(9000, 10);
    let r = c.recv(1, (0, 0), 1, 0, 9000);
    let r2 = c.recv(1, (0, 0), 1, 0, 9000);
    c.send(0, 1, 1, &msg);
    assert_eq!(status(&c.wait(1, r, 10 * MS).unwrap()), Status::Success);
    c.run_for(20 * MS);
    assert!(c.completions(1).iter().all(|x| x.wr_id != r2), "a duplicate must not be a second message");
    assert!(c.counter(1, counter::DUPLICATES) > 0);
}

#[test]
fn test_bad_key_and_malformed_descriptor_refused() {
    let mut c = cluster(2);
    let key = c.data_key(0);
    let mut d = WorkDesc { opcode: Opcode::Send as u8, flags: 1, num_sge: 1, node: 1, port: 0, ..Default::default() };
    d.sge[0] = emp_uapi::desc::Sge { key: key ^ 0x0001_0000, len: 10, offset: 0 };
    let bad_key = c.post_raw(0, d, true);
    d.sge[0].key = key;
    d.sge[0].offset = u64::MAX - 4;
    let out_of_range = c.post_raw(0, d, true);
    d.sge[0].offset = 0;
    d.num_sge = 9;
    let malformed = c.post_raw(0, d, true);
    d.num_sge = 1;
    d.opcode = 77;
    let bad_op = c.post_raw(0, d, true);
    assert_eq!(status(&c.wait(0, bad_key, MS).unwrap()), Status::BadKey);
    assert_eq!(status(&c.wait(0, out_of_range, MS).unwrap()), Status::BadDescriptor);
    assert_eq!(status(&c.wait(0, malformed, MS).unwrap()), Status::BadDescriptor);
    assert_eq!(status(&c.wait(0, bad_op, MS).unwrap()), Status::BadDescriptor);
    // The port still works.
    let r = c.recv(1, (0, 0), 3, 0, 10);
    c.send(0, 1, 3, &data(10, 1));
    assert_eq!(status(&c.wait(1, r, 10 * MS).unwrap()), Status::Success);
}

#[test]
fn test_access_beyond_region_refused() {
    let mut c = cluster(2);
    let key = c.data_key(0);
    let mut d = WorkDesc { opcode: Opcode::Send as u8, flags: 1, num_sge: 1, node: 1, port: 0, ..Default::default() };
    d.sge[0] = emp_uapi::desc::Sge { key, len: 4096, offset: (8 << 20) - 100 };
    let w = c.post_raw(0, d, true);
    assert_eq!(status(&c.wait(0, w, MS).unwrap()), Status::AccessDenied);
}

#[test]
fn test_peer_table_full_send_fails() {
    let cfg = Config { peers_max: 1, ..Config::default() };
    let mut c = Cluster::new(3, cfg, 0, 1500, WireConfig::default());
    c.recv(1, (0, 0), 1, 0, 10);
    let a = c.send(0, 1, 1, &data(10, 1));
    let b = c.send(0, 2, 1, &data(10, 1));
    assert_eq!(status(&c.wait(0, b, MS).unwrap()), Status::TableFull);
    assert_eq!(status(&c.wait(0, a, 10 * MS).unwrap()), Status::Success);
}

#[test]
fn test_jumbo_mtu_fewer_frames() {
    let mut c = Cluster::new(2, Config::default(), 0, 9000, WireConfig::default());
    let msg = data(64_000, 11);
    let r = c.recv(1, (0, 0), 1, 0, 64_000);
    c.send(0, 1, 1, &msg);
    assert_eq!(status(&c.wait(1, r, 10 * MS).unwrap()), Status::Success);
    assert_eq!(c.received(r, 64_000), msg);
    assert_eq!(c.counter(0, counter::TX_FRAMES), emp_uapi::wire::frames_for(64_000, 9000));
}

/// A burst of messages behind one the receiver is not ready for: PM's
/// Modified ACK/NACK stops the sender, EMP's rule keeps retransmitting.
/// The receives take any tag, so they see the order the NIC delivered in:
/// `Err` names the first receive that got another message than its own.
fn burst_behind_unready_head_with(cfg: Config, features: u32) -> Result<(u64, Vec<u64>), String> {
    let cfg = Config { matching: MatchMode::OrderedRefusal, ..cfg };
    let mut c = Cluster::new(2, cfg, features, 1500, WireConfig::default());
    let sends: Vec<u64> = (0..8).map(|i| c.send(0, 1, i, &data(4000, i as u8))).collect();
    c.run_for(3 * MS);
    let recvs: Vec<u64> = (0..8).map(|_| c.recv(1, (0, 0), 0, u64::MAX, 4000)).collect();
    for (i, &r) in recvs.iter().enumerate() {
        let rc = c.wait(1, r, 100 * MS).unwrap();
        assert_eq!(status(&rc), Status::Success);
        if rc.tag != i as u64 || c.received(r, 4000) != data(4000, i as u8) {
            return Err(format!("receive {i} got message {}: reordered", rc.tag));
        }
    }
    for s in sends {
        assert_eq!(status(&c.wait(0, s, 100 * MS).unwrap()), Status::Success);
    }
    Ok((c.counter(0, counter::RETRANSMITS), recvs))
}

fn burst_behind_unready_head(flow: FlowControl, features: u32) -> (u64, Vec<u64>) {
    let cfg = Config { flow_control: flow, ..Config::default() };
    burst_behind_unready_head_with(cfg, features).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn test_modified_ack_nack_sends_less_than_emp_drop_rule() {
    let (emp, _) = burst_behind_unready_head(FlowControl::Off, 0);
    let (pm, _) = burst_behind_unready_head(FlowControl::ModifiedAckNack, FEATURE_MODIFIED_ACK_NACK);
    assert!(pm < emp, "Modified ACK/NACK retransmitted {pm} frames, EMP {emp}");
}

#[test]
fn test_piggyback_flow_control_delivers_in_order() {
    burst_behind_unready_head(FlowControl::Piggyback, 0);
}

#[test]
fn test_the_in_order_check_sees_a_sender_that_reorders() {
    // The fault knob swaps pairs of sends' sequence numbers: the same run
    // must fail the order check, under every flow control.
    for flow in [FlowControl::Off, FlowControl::Piggyback, FlowControl::ModifiedAckNack] {
        let cfg = Config { flow_control: flow, fault_swap_sends: true, ..Config::default() };
        let got = burst_behind_unready_head_with(cfg, 0);
        assert!(got.as_ref().is_err_and(|e| e.contains("reordered")), "{flow:?}: {got:?}");
    }
}

#[test]
fn test_ack_frames_carry_receiver_credits() {
    let cfg = Config { matching: MatchMode::OrderedRefusal, ..Config::default() };
    let mut c = Cluster::new(2, cfg, 0, 1500, WireConfig::default());
    for t in 0..5 {
        c.recv(1, (0, 0), t, 0, 10);
    }
    let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let log = seen.clone();
    c.world.drop_filter = Some(Box::new(move |_, _, b| {
        if let Ok(Frame::Ack { hdr, body }) = Frame::parse(b) {
            assert_eq!(hdr.kind, FrameKind::Ack as u8);
            log.borrow_mut().push(body.rx_credits);
        }
        false
    }));
    let s = c.send(0, 1, 0, &data(10, 1));
    c.wait(0, s, 10 * MS).unwrap();
    assert_eq!(*seen.borrow(), vec![4], "4 receives still posted after the first matched");
}

#[test]
fn test_large_message_over_lossy_reordering_wire() {
    let wire = WireConfig { loss: 0.1, reorder: 0.2, dup: 0.02, ..WireConfig::default() };
    let mut c = Cluster::new(2, Config::default(), 0, 1500, wire);
    let msg = data(4 << 20, 12);
    let r = c.recv(1, (0, 0), 1, 0, 4 << 20);
    let s = c.send(0, 1, 1, &msg);
    assert_eq!(status(&c.wait(1, r, 10_000 * MS).unwrap()), Status::Success);
    assert!(c.received(r, 4 << 20) == msg, "4 MiB intact");
    assert_eq!(status(&c.wait(0, s, 10_000 * MS).unwrap()), Status::Success);
    assert!(c.counter(1, counter::OUT_OF_ORDER) > 0);
    assert!(c.counter(0, counter::RETRANSMITS) > 0);
}

/// The `emp bench bw` pattern: windows of 64 messages, each preceded by a
/// handshake in both directions that says the receives are posted.
#[test]
fn test_windowed_stream_with_handshakes() {
    let mut c = cluster(2);
    const HS: u64 = 1 << 32;
    let w_count = 30;
    // Pre-post the first handshake receive on both sides.
    c.recv(0, (1, 0), HS, 0, 4);
    c.recv(1, (0, 0), HS, 0, 4);
    let mut hs = [0usize; 2];
    let mut data_recv = 0usize;
    let mut sends_done = [0usize; 2];
    let mut sends_posted = [0usize; 2];
    for w in 0..w_count {
        for _ in 0..64 {
            c.recv(1, (0, 0), 0, 0, 1024);
        }
        for r in 0..2u16 {
            c.send(r, 1 - r, HS, &[0; 4]);
            sends_posted[r as usize] += 1;
        }
        // Both wait for the peer's handshake, then post the next one.
        let mut guard = 0;
        while hs[0] <= w || hs[1] <= w {
            c.run_for(10_000);
            for r in 0..2u16 {
                for x in c.completions(r) {
                    assert_eq!(status(&x), Status::Success, "window {w} rank {r}: {x:?}");
                    if x.opcode == Opcode::Recv as u8 {
                        if x.tag & HS != 0 {
                            hs[r as usize] += 1
                        } else {
                            data_recv += 1
                        }
                    } else {
                        sends_done[r as usize] += 1;
                    }
                }
            }
            guard += 1;
            assert!(
                guard < 10_000,
                "window {w}: handshakes {hs:?}\n{}\n{}",
                c.world.nodes[0].nic.describe_peers(),
                c.world.nodes[1].nic.describe_peers()
            );
        }
        c.recv(0, (1, 0), HS, 0, 4);
        // The receiver is slow to post its next handshake receive.
        c.run_for(700_000);
        c.recv(1, (0, 0), HS, 0, 4);
        for _ in 0..64 {
            c.send(0, 1, 0, &[7; 1024]);
        }
        sends_posted[0] += 64;
        let want = 64 * (w + 1);
        let mut guard = 0;
        while data_recv < want || sends_done[0] < sends_posted[0] {
            c.run_for(10_000);
            for r in 0..2u16 {
                for x in c.completions(r) {
                    assert_eq!(status(&x), Status::Success);
                    if x.opcode == Opcode::Recv as u8 {
                        if x.tag & HS != 0 {
                            hs[r as usize] += 1
                        } else {
                            data_recv += 1
                        }
                    } else {
                        sends_done[r as usize] += 1;
                    }
                }
            }
            guard += 1;
            assert!(guard < 10_000, "window {w} data stalled at {data_recv}/{want}");
        }
    }
    let drops = c.counter(1, counter::DROPPED_UNEXPECTED);
    assert!(c.world.now < 200 * MS, "took {} ms, {drops} drops", c.world.now / MS);
}

/// After a burst the receiver was not ready for, posting the receives must
/// release every message within a few round trips, not one backoff per
/// message (the receiver asks for the next message as soon as it can take
/// it, and the sender resends the refused ones when the first is accepted).
#[test]
fn test_refused_burst_resumes_within_round_trips() {
    for len in [1000usize, 4000] {
        let mut c = cluster(2);
        let sends: Vec<u64> = (0..64).map(|i| c.send(0, 1, 9, &data(len, i as u8))).collect();
        c.run_for(20 * MS); // every message refused, backoffs grown
        let t0 = c.world.now;
        let recvs: Vec<u64> = (0..64).map(|_| c.recv(1, (0, 0), 9, 0, len as u64)).collect();
        for (i, r) in recvs.iter().enumerate() {
            let rc = c.wait(1, *r, 100 * MS).unwrap();
            assert_eq!(status(&rc), Status::Success);
            assert_eq!(c.received(*r, len), data(len, i as u8), "message {i} in order");
        }
        let took = c.world.now - t0;
        assert!(took < 3 * MS, "{len} B: 64 refused messages took {} µs after the receives were posted", took / 1000);
        for s in sends {
            assert_eq!(status(&c.wait(0, s, 100 * MS).unwrap()), Status::Success);
        }
    }
}
