//! Frames from strangers: sources outside the cluster are refused and
//! counted, and forged peers cannot take the peer table from real ones.

use emp_firmware::Config;
use emp_sim::cluster::Cluster;
use emp_sim::world::WireConfig;
use emp_uapi::desc::{Cqe, Status};
use emp_uapi::sram::counter;
use emp_uapi::wire::{self, AckBody, AtomicBody, FrameHeader, FrameKind, MsgHeader};
use emp_uapi::{ANY_NODE, ANY_PORT};

const MS: u64 = 1_000_000;

fn cluster(nodes: u16) -> Cluster {
    Cluster::new(nodes, Config::default(), 0, 1500, WireConfig::default())
}

fn status(c: &Cqe) -> Status {
    Status::from_u8(c.status).unwrap()
}

fn header(kind: FrameKind, src: (u16, u16), dst_node: u16) -> FrameHeader {
    FrameHeader {
        version: wire::WIRE_VERSION,
        kind: kind as u8,
        src_node: src.0,
        src_port: src.1,
        dst_node,
        src_gen: 5,
        ..Default::default()
    }
}

/// A one-frame DATA message from `src` to port 0 of `dst_node`.
fn data_frame(src: (u16, u16), dst_node: u16, tag: u64, payload: &[u8]) -> Vec<u8> {
    message_frame(FrameKind::Data, src, dst_node, tag, payload)
}

/// A one-frame message of `kind` (DATA or collective DATA).
fn message_frame(kind: FrameKind, src: (u16, u16), dst_node: u16, tag: u64, payload: &[u8]) -> Vec<u8> {
    let hdr = FrameHeader { payload_len: payload.len() as u16, frame_count: 1, ..header(kind, src, dst_node) };
    let msg = MsgHeader::new(tag, payload.len() as u64, None);
    let mut b = vec![0u8; 256];
    let head = wire::emit_data_headers(&hdr, Some(&msg), &mut b).unwrap();
    b[head..head + payload.len()].copy_from_slice(payload);
    b.truncate(head + payload.len());
    b
}

#[test]
fn test_frames_from_a_node_outside_the_cluster_are_refused_and_counted() {
    let mut c = cluster(2);
    let r = c.recv(1, (ANY_NODE, ANY_PORT), 5, 0, 64);
    let stranger = (7, 0);
    c.world.inject_frame(1, &data_frame(stranger, 1, 5, b"forged"));
    let mut b = [0u8; 128];
    let n = wire::emit_ack(&header(FrameKind::Ack, stranger, 1), &AckBody::default(), &mut b).unwrap();
    c.world.inject_frame(1, &b[..n]);
    let nack = AckBody { reason: wire::NackReason::NoMatch as u8, ..Default::default() };
    let n = wire::emit_ack(&header(FrameKind::Nack, stranger, 1), &nack, &mut b).unwrap();
    c.world.inject_frame(1, &b[..n]);
    let body = AtomicBody { op: wire::atomic_op::FETCH_ADD, width: 8, ..Default::default() };
    let n = wire::emit_atomic_req(&header(FrameKind::AtomicReq, stranger, 1), &body, &mut b).unwrap();
    c.world.inject_frame(1, &b[..n]);
    c.world.inject_frame(1, &message_frame(FrameKind::CollData, stranger, 1, 5, b"x"));
    c.run_for(MS);
    assert!(c.completions(1).is_empty(), "a stranger's message reached an any-source receive");
    assert_eq!(c.counter(1, counter::DROPPED_MALFORMED), 5, "each stranger frame is counted as malformed");
    assert_eq!(c.counter(1, counter::ACKS_RX), 0);
    assert_eq!(c.world.nodes[1].nic.occupancy().peers, 0, "no peer entry for a stranger");
    // The receive is still there for a real sender.
    c.send(0, 1, 5, b"real");
    let rc = c.wait(1, r, 10 * MS).expect("the real message completes the receive");
    assert_eq!((status(&rc), rc.src_node, rc.byte_len), (Status::Success, 0, 4));
}

#[test]
fn test_forged_peers_cannot_exhaust_the_peer_table() {
    let mut c = cluster(3);
    let peers_max = Config::default().peers_max as u16;
    // A peer with history: node 0 has delivered a message to node 1.
    let r0 = c.recv(1, (0, 0), 1, 0, 64);
    c.send(0, 1, 1, b"first");
    assert_eq!(c.wait(1, r0, 10 * MS).map(|c| status(&c)), Some(Status::Success));
    // A buggy or forging node 2 claims twice the table's worth of ports
    // (its real port 0 excepted); nothing matches them, so each entry is
    // refused, never consumed.
    for p in 1..=2 * peers_max {
        c.world.inject_frame(1, &data_frame((2, p), 1, 9, b"junk"));
        if p % 64 == 0 {
            c.run_for(MS / 10);
        }
    }
    c.run_for(MS);
    // A real new peer gets an entry, and the old one kept its sequence.
    let r2 = c.recv(1, (2, 0), 2, 0, 64);
    let s2 = c.send(2, 1, 2, b"new peer");
    let r1 = c.recv(1, (0, 0), 1, 0, 64);
    let s1 = c.send(0, 1, 1, b"second");
    for (n, wr) in [(2, s2), (0, s1), (1, r2), (1, r1)] {
        let cqe = c.wait(n, wr, 100 * MS).expect("completes");
        assert_eq!(status(&cqe), Status::Success, "node {n} wr {wr}");
    }
    assert_eq!(c.received(r2, 8), b"new peer");
    assert_eq!(c.received(r1, 6), b"second");
    assert!(c.completions(1).is_empty(), "nothing delivered twice");
    assert!(c.counter(1, counter::PEERS_RECLAIMED) >= peers_max as u64, "refused entries were reclaimed");
}
