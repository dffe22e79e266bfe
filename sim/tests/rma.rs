//! Remote write and read on a scripted `Cluster`: data placed and fetched
//! exactly once under loss, duplication and reordering, immediate data
//! completing a receive at the target, and every refusal (foreign key,
//! wrong secret, missing right, out of range) reported to the initiator
//! with the target's memory unchanged. Named `test_<situation>_<event>`.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

use emp_firmware::Config;
use emp_sim::cluster::Cluster;
use emp_sim::world::WireConfig;
use emp_uapi::desc::{
    Cqe, Opcode, Status, MR_LOCAL_READ, MR_LOCAL_WRITE, MR_REMOTE_ATOMIC, MR_REMOTE_READ, MR_REMOTE_WRITE,
};
use emp_uapi::sram::counter;
use emp_uapi::wire::{Frame, FrameKind};

const MS: u64 = 1_000_000;
const RW: u8 = MR_LOCAL_READ | MR_LOCAL_WRITE | MR_REMOTE_READ | MR_REMOTE_WRITE;

fn status(c: &Cqe) -> Status {
    Status::from_u8(c.status).unwrap()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8).collect()
}

fn done(c: &mut Cluster, n: u16, wr: u64) -> Cqe {
    c.wait(n, wr, 60_000 * MS).unwrap_or_else(|| panic!("wr {wr} on node {n} never completed"))
}

/// Quiesce: no record held anywhere, every invariant holds.
fn quiet(c: &mut Cluster) {
    c.run_for(200 * MS);
    for (n, node) in c.world.nodes.iter().enumerate() {
        let o = node.nic.occupancy();
        assert_eq!((o.tx_msgs, o.rx_msgs, o.rma_reads), (0, 0, 0), "node {n} holds records: {o:?}");
        node.nic.invariants().unwrap_or_else(|e| panic!("node {n}: {e}"));
    }
}

#[test]
fn test_write_then_read_round_trip() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let key = c.reg_mr(0, 64 << 10, RW);
    let secret = c.secret(0, key);
    let data = pattern(1, 10_000);
    let wr = c.rma_write(1, 0, &data, (key, secret, 100), None);
    let cqe = done(&mut c, 1, wr);
    assert_eq!((status(&cqe), cqe.opcode, cqe.byte_len), (Status::Success, Opcode::RdmaWrite as u8, 10_000));
    assert_eq!(c.read_region(0, key, 100, data.len()), data);
    assert_eq!(c.read_region(0, key, 0, 100), vec![0; 100], "bytes before the write untouched");
    assert_eq!(c.read_region(0, key, 10_100, 100), vec![0; 100], "bytes after the write untouched");
    assert!(c.completions(0).is_empty(), "a plain write completes nothing at the target");
    // Read it back, and a part the target's host wrote itself.
    c.write_region(0, key, 20_000, b"written by the target's host");
    let wr = c.rma_read(1, 0, data.len() as u64, (key, secret, 100));
    let cqe = done(&mut c, 1, wr);
    assert_eq!((status(&cqe), cqe.opcode, cqe.byte_len), (Status::Success, Opcode::RdmaRead as u8, 10_000));
    assert_eq!(c.received(wr, data.len()), data);
    let wr = c.rma_read(1, 0, 28, (key, secret, 20_000));
    assert_eq!(status(&done(&mut c, 1, wr)), Status::Success);
    assert_eq!(c.received(wr, 28), b"written by the target's host");
    quiet(&mut c);
}

#[test]
fn test_zero_length_and_one_frame_edges() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let key = c.reg_mr(0, 8192, RW);
    let secret = c.secret(0, key);
    // Exactly filling the last byte of the region, and zero bytes at its end.
    let data = pattern(2, 1);
    let wr = c.rma_write(1, 0, &data, (key, secret, 8191), None);
    assert_eq!(status(&done(&mut c, 1, wr)), Status::Success);
    assert_eq!(c.read_region(0, key, 8191, 1), data);
    let wr = c.rma_write(1, 0, &[], (key, secret, 8192), None);
    assert_eq!(status(&done(&mut c, 1, wr)), Status::Success);
    let wr = c.rma_read(1, 0, 0, (key, secret, 0));
    assert_eq!(status(&done(&mut c, 1, wr)), Status::Success);
    quiet(&mut c);
}

#[test]
fn test_lossy_wire_each_write_and_read_exactly_once() {
    let wire = WireConfig { loss: 0.1, dup: 0.1, reorder: 0.2, ..WireConfig::default() };
    let mut c = Cluster::new(3, Config::default(), 0, 1500, wire);
    let key = c.reg_mr(0, 1 << 20, RW);
    let secret = c.secret(0, key);
    // Writers 1 and 2 each own half the region; sizes from one byte to
    // many windows.
    let sizes = [1usize, 100, 1454, 1455, 5000, 70_000, 200_000];
    // Writes in flight together do not overlap: their frames may be placed
    // in any order (a completion says the data is in).
    let at = |i: usize| sizes[..i].iter().sum::<usize>() + 8 * i;
    let mut expect = vec![0u8; 1 << 20];
    let mut wrs = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        for n in 1..3u16 {
            let off = (n as usize - 1) * (512 << 10) + at(i);
            let data = pattern(i as u64 * 10 + n as u64, len);
            expect[off..off + len].copy_from_slice(&data);
            wrs.push((n, c.rma_write(n, 0, &data, (key, secret, off as u64), None)));
        }
    }
    for (n, wr) in wrs {
        assert_eq!(status(&done(&mut c, n, wr)), Status::Success);
    }
    assert!(c.read_region(0, key, 0, 1 << 20) == expect, "the region is what the writes wrote");
    // The target's host overwrites a written range: a late duplicate of a
    // write must not bring the old data back.
    c.write_region(0, key, 0, &[0xAB; 64]);
    expect[..64].fill(0xAB);
    let mut reads = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let off = (512 << 10) + at(i);
        reads.push((c.rma_read(1, 0, len as u64, (key, secret, off as u64)), off, len));
    }
    for (wr, off, len) in reads {
        assert_eq!(status(&done(&mut c, 1, wr)), Status::Success);
        assert!(c.received(wr, len) == expect[off..off + len], "read of {len} at {off}");
    }
    quiet(&mut c);
    assert_eq!(c.read_region(0, key, 0, 64), vec![0xAB; 64], "no write was executed twice");
    assert!(c.counter(0, counter::DUPLICATES) > 0, "the wire did duplicate");
}

#[test]
fn test_lost_acks_write_with_immediate_completes_one_receive() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let key = c.reg_mr(0, 4096, RW);
    let secret = c.secret(0, key);
    // Every first ACK and RMA frame from the target is lost: requests are
    // retransmitted and must be acknowledged again, never executed again.
    let seen = Rc::new(RefCell::new(HashSet::new()));
    let log = seen.clone();
    c.world.drop_filter = Some(Box::new(move |from, _, b| match Frame::parse(b) {
        Ok(Frame::Ack { hdr, body }) if from == 0 => log.borrow_mut().insert((hdr.msg_seq, body.group, 0)),
        Ok(Frame::Data { hdr, .. }) if from == 0 && hdr.kind == FrameKind::Rma as u8 => {
            log.borrow_mut().insert((hdr.msg_seq, hdr.frame_index, 1))
        }
        _ => false,
    }));
    let r1 = c.recv(0, (1, 0), 77, 0, 16);
    let w = c.rma_write(1, 0, b"imm data", (key, secret, 8), Some(77));
    let cqe = done(&mut c, 1, w);
    assert_eq!((status(&cqe), cqe.opcode), (Status::Success, Opcode::RdmaWrite as u8));
    let rc = done(&mut c, 0, r1);
    assert_eq!(
        (status(&rc), rc.opcode, rc.tag, rc.msg_len, rc.byte_len, rc.src_node),
        (Status::Success, Opcode::RecvRdmaImm as u8, 77, 8, 0, 1)
    );
    assert_eq!(c.read_region(0, key, 8, 8), b"imm data");
    let rd = c.rma_read(1, 0, 8, (key, secret, 8));
    assert_eq!(status(&done(&mut c, 1, rd)), Status::Success);
    assert_eq!(c.received(rd, 8), b"imm data");
    // A second receive with the same tag is still posted: nothing consumed it twice.
    c.run_for(500 * MS);
    let r2 = c.recv(0, (1, 0), 77, 0, 16);
    assert!(c.wait(0, r2, 100 * MS).is_none(), "one write, one receive");
    let w2 = c.rma_write(1, 0, b"second", (key, secret, 100), Some(77));
    assert_eq!(status(&done(&mut c, 1, w2)), Status::Success);
    assert_eq!(status(&done(&mut c, 0, r2)), Status::Success);
    quiet(&mut c);
}

#[test]
fn test_immediate_without_a_receive_waits_for_one() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let key = c.reg_mr(0, 4096, RW);
    let secret = c.secret(0, key);
    let w = c.rma_write(1, 0, b"early", (key, secret, 0), Some(5));
    c.run_for(20 * MS);
    assert!(c.completions(1).is_empty(), "not done while no receive matches");
    assert_eq!(c.read_region(0, key, 0, 5), vec![0; 5], "nothing written before a receive takes it");
    let r = c.recv(0, (1, 0), 5, 0, 0);
    assert_eq!(status(&done(&mut c, 1, w)), Status::Success);
    assert_eq!(status(&done(&mut c, 0, r)), Status::Success);
    assert_eq!(c.read_region(0, key, 0, 5), b"early");
    quiet(&mut c);
}

/// Every refusal: an error completion at the initiator, the target's
/// memory unchanged, the refusal counted, and the peer still usable.
#[test]
fn test_refusals_leave_target_memory_unchanged() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let rw = c.reg_mr(0, 4096, RW);
    let ro = c.reg_mr(0, 4096, MR_LOCAL_READ | MR_LOCAL_WRITE | MR_REMOTE_READ);
    let wo = c.reg_mr(0, 4096, MR_LOCAL_READ | MR_LOCAL_WRITE | MR_REMOTE_WRITE);
    let atomic_only = c.reg_mr(0, 4096, MR_LOCAL_READ | MR_LOCAL_WRITE | MR_REMOTE_ATOMIC);
    let mine = c.reg_mr(1, 4096, RW); // node 1's own region: foreign at node 0
    let s = |c: &Cluster, k| c.secret(0, k);
    for k in [rw, ro, wo, atomic_only] {
        c.write_region(0, k, 0, &[0x5A; 4096]);
    }
    let data = pattern(9, 64);
    let (srw, sro, swo, sat) = (s(&c, rw), s(&c, ro), s(&c, wo), s(&c, atomic_only));
    let writes = [
        ((mine, c.secret(1, mine), 0), "a key of another node"),
        ((rw ^ 0x0100_0000, srw, 0), "a key no region has"),
        ((rw, srw ^ 1, 0), "the wrong secret"),
        ((rw, 0, 0), "no secret"),
        ((ro, sro, 0), "a region without the remote-write right"),
        ((atomic_only, sat, 0), "an atomics-only region"),
        ((rw, srw, 4096 - 63), "one byte beyond the region"),
        ((rw, srw, 1 << 40), "far beyond the region"),
    ];
    for (remote, why) in writes {
        let wr = c.rma_write(1, 0, &data, remote, None);
        let cqe = done(&mut c, 1, wr);
        assert_eq!((status(&cqe), cqe.opcode), (Status::RemoteAccessError, Opcode::RdmaWrite as u8), "write: {why}");
    }
    let reads = [
        ((rw ^ 0x0100_0000, srw, 0), "a key no region has"),
        ((rw, srw.wrapping_add(1), 0), "the wrong secret"),
        ((wo, swo, 0), "a region without the remote-read right"),
        ((rw, srw, 4000), "past the region's end"),
    ];
    for (remote, why) in reads {
        let wr = c.rma_read(1, 0, 100, remote);
        let cqe = done(&mut c, 1, wr);
        assert_eq!((status(&cqe), cqe.opcode), (Status::RemoteAccessError, Opcode::RdmaRead as u8), "read: {why}");
        assert_eq!(c.received(wr, 100), vec![0; 100], "read: {why}: nothing delivered");
    }
    for k in [rw, ro, wo, atomic_only] {
        assert_eq!(c.read_region(0, k, 0, 4096), vec![0x5A; 4096], "target memory unchanged");
    }
    assert_eq!(c.counter(0, counter::REMOTE_REFUSED), 12, "every refusal counted");
    // An offset that wraps never leaves the initiator.
    let wr = c.rma_write(1, 0, &data, (rw, srw, u64::MAX - 8), None);
    assert_eq!(status(&done(&mut c, 1, wr)), Status::BadDescriptor);
    // Refusals are charged to the source, not fatal to the peer.
    let wr = c.rma_write(1, 0, &data, (rw, srw, 0), None);
    assert_eq!(status(&done(&mut c, 1, wr)), Status::Success);
    assert_eq!(c.read_region(0, rw, 0, 64), data);
    quiet(&mut c);
}

#[test]
fn test_refused_write_does_not_block_later_messages() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let rw = c.reg_mr(0, 4096, RW);
    let s = c.secret(0, rw);
    let r = c.recv(0, (1, 0), 3, 0, 64);
    let bad = c.rma_write(1, 0, &pattern(1, 3000), (rw, s ^ 7, 0), None);
    let send = c.send(1, 0, 3, b"after the refused write");
    assert_eq!(status(&done(&mut c, 1, bad)), Status::RemoteAccessError);
    assert_eq!(status(&done(&mut c, 1, send)), Status::Success);
    assert_eq!(status(&done(&mut c, 0, r)), Status::Success);
    assert_eq!(c.received(r, 23), b"after the refused write");
    quiet(&mut c);
}

#[test]
fn test_response_lost_beyond_the_budget_fails_the_read() {
    let cfg = Config { rx_idle_timeout_ns: 4_000 * MS, ..Config::default() };
    let mut c = Cluster::new(2, cfg, 0, 1500, WireConfig::default());
    let key = c.reg_mr(0, 4096, RW);
    let secret = c.secret(0, key);
    // The request gets through and is acknowledged; every response is lost.
    c.world.drop_filter = Some(Box::new(|from, _, b| {
        from == 0 && matches!(Frame::parse(b), Ok(Frame::Data { hdr, .. }) if hdr.kind == FrameKind::Rma as u8)
    }));
    let wr = c.rma_read(1, 0, 64, (key, secret, 0));
    let cqe = done(&mut c, 1, wr);
    assert_eq!(status(&cqe), Status::RetryLimitExceeded);
    c.world.drop_filter = None;
    quiet(&mut c);
    // The peer works afterwards.
    let wr = c.rma_read(1, 0, 64, (key, secret, 0));
    assert_eq!(status(&done(&mut c, 1, wr)), Status::Success);
    quiet(&mut c);
}

#[test]
fn test_port_close_flushes_outstanding_reads() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let key = c.reg_mr(0, 4096, RW);
    let secret = c.secret(0, key);
    c.world.drop_filter = Some(Box::new(|from, _, _| from == 0)); // the target never answers
    let wr = c.rma_read(1, 0, 64, (key, secret, 0));
    c.run_for(5 * MS);
    assert_eq!(c.world.nodes[1].nic.occupancy().rma_reads, 1);
    c.close_port(1);
    let flushed = c.completions(1);
    assert!(flushed.iter().any(|q| q.wr_id == wr && status(q) == Status::Flushed), "{flushed:?}");
    assert_eq!(c.world.nodes[1].nic.occupancy().rma_reads, 0);
}
