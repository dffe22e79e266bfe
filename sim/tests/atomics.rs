//! Remote atomics on a scripted `Cluster`: exactly-once execution under
//! loss, duplication and reordering, the result cache, the requester
//! window, CAS/swap semantics at both widths, refusals, incarnations and
//! closed ports. Named `test_<situation>_<event>` as in smoltcp.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;

use emp_firmware::{Config, Occupancy};
use emp_sim::cluster::Cluster;
use emp_sim::world::{Partition, WireConfig};
use emp_uapi::desc::{
    Cqe, Opcode, RemoteSge, Sge, Status, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE, MR_REMOTE_ATOMIC, WD_SIGNALED,
};
use emp_uapi::sram::counter;
use emp_uapi::wire::{self, atomic_op, AtomicBody, Frame, FrameHeader, FrameKind, ATOMIC_WINDOW};
use emp_uapi::Le;

const MS: u64 = 1_000_000;
const ATOMIC_RW: u8 = MR_LOCAL_READ | MR_LOCAL_WRITE | MR_REMOTE_ATOMIC;

fn status(c: &Cqe) -> Status {
    Status::from_u8(c.status).unwrap()
}

fn cluster(nodes: u16, wire: WireConfig) -> Cluster {
    Cluster::new(nodes, Config::default(), 0, 1500, wire)
}

/// Waits for `wr` on `node` and checks the completion's atomic fields.
fn done(c: &mut Cluster, node: u16, wr: u64, op: Opcode, width: u32) -> Cqe {
    let cqe = c.wait(node, wr, 10_000 * MS).unwrap_or_else(|| panic!("atomic {wr} on node {node} never completed"));
    assert_eq!(cqe.opcode, op as u8, "the CQE carries the descriptor's opcode");
    if status(&cqe) == Status::Success {
        assert_eq!(cqe.byte_len, width);
        assert_eq!(c.received(wr, width as usize), cqe.tag.to_le_bytes()[..width as usize], "result word = CQE tag");
    }
    cqe
}

/// Quiesce: no atomic record held anywhere, every invariant holds.
fn quiet(c: &mut Cluster) {
    c.run_for(100 * MS);
    for (n, node) in c.world.nodes.iter().enumerate() {
        assert_eq!(node.nic.occupancy().atomics, 0, "node {n} holds atomic records");
        node.nic.invariants().unwrap_or_else(|e| panic!("node {n}: {e}"));
    }
}

/// `per_node` fetch-add(1)s from every node but 0 on one 64-bit word of
/// node 0; returns (final value, olds).
fn hammer(c: &mut Cluster, per_node: u64) -> (u64, Vec<u64>) {
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let nodes = c.world.nodes.len() as u16;
    let mut wrs = Vec::new();
    for i in 0..per_node {
        for n in 1..nodes {
            wrs.push((n, c.atomic(n, Opcode::AtomicFetchAdd, 0, (key, 64, 8), 1, 0), i));
        }
    }
    let mut olds = Vec::new();
    let mut last = vec![None; nodes as usize];
    for (n, wr, _) in wrs {
        let cqe = done(c, n, wr, Opcode::AtomicFetchAdd, 8);
        assert_eq!(status(&cqe), Status::Success);
        // One requester's operations run in its posting order.
        assert!(last[n as usize].is_none_or(|p| p < cqe.tag), "node {n}: old {} after {:?}", cqe.tag, last[n as usize]);
        last[n as usize] = Some(cqe.tag);
        olds.push(cqe.tag);
    }
    quiet(c);
    (c.read_word(0, key, 64, 8), olds)
}

fn assert_permutation(mut olds: Vec<u64>, n: u64) {
    olds.sort_unstable();
    assert_eq!(olds, (0..n).collect::<Vec<_>>(), "returned olds must be a permutation of 0..{n}");
}

#[test]
fn test_many_requesters_lossy_wire_fetch_add_exactly_once() {
    let wire = WireConfig { loss: 0.1, dup: 0.05, reorder: 0.2, ..WireConfig::default() };
    let mut c = cluster(6, wire);
    let (word, olds) = hammer(&mut c, 40);
    assert_eq!(word, 200);
    assert_permutation(olds, 200);
    assert!(c.counter(0, counter::ATOMIC_REPLAYS) > 0, "lost responses are answered from the cache");
    assert!(c.world.stats.lost > 0 && c.world.stats.reordered > 0);
}

#[test]
fn test_every_nic_cpu_plan_fetch_add_exactly_once() {
    for plan in 0..=4 {
        let cfg = Config { cpu_plan: plan, ..Config::default() };
        let wire = WireConfig { loss: 0.05, reorder: 0.1, ..WireConfig::default() };
        let mut c = Cluster::new(4, cfg, 0, 1500, wire);
        let (word, olds) = hammer(&mut c, 20);
        assert_eq!(word, 60, "plan {plan}");
        assert_permutation(olds, 60);
    }
}

#[test]
fn test_duplicating_wire_fetch_add_counts_each_once() {
    let wire = WireConfig { dup: 0.3, ..WireConfig::default() };
    let mut c = cluster(4, wire);
    let (word, olds) = hammer(&mut c, 50);
    assert_eq!(word, 150);
    assert_permutation(olds, 150);
    assert!(c.counter(0, counter::ATOMIC_REPLAYS) > 0, "duplicated requests are replayed, not re-executed");
}

#[test]
fn test_first_response_dropped_replayed_from_cache() {
    let mut c = cluster(2, WireConfig::default());
    let seen = Rc::new(RefCell::new(HashSet::new()));
    let log = seen.clone();
    c.world.drop_filter = Some(Box::new(move |_, _, b| match Frame::parse(b) {
        // Every request's first response is lost: its retransmission
        // must be answered from the cache, never executed again.
        Ok(Frame::AtomicResp { hdr, .. }) => log.borrow_mut().insert(hdr.msg_seq),
        _ => false,
    }));
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let wrs: Vec<u64> = (0..20).map(|_| c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 0, 8), 1, 0)).collect();
    for (i, wr) in wrs.into_iter().enumerate() {
        let cqe = done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8);
        assert_eq!((status(&cqe), cqe.tag), (Status::Success, i as u64), "one requester: executed in order");
    }
    quiet(&mut c);
    assert_eq!(c.read_word(0, key, 0, 8), 20, "exactly once");
    assert_eq!(seen.borrow().len(), 20);
    assert!(
        c.counter(0, counter::ATOMIC_REPLAYS) >= 20,
        "each retransmission replayed: {}",
        c.counter(0, counter::ATOMIC_REPLAYS)
    );
    assert!(c.counter(1, counter::TIMEOUTS) > 0);
}

#[test]
fn test_more_than_window_outstanding_requester_holds_back() {
    let mut c = cluster(2, WireConfig::default());
    let hold = Rc::new(RefCell::new(true));
    let sent = Rc::new(RefCell::new(HashSet::new()));
    let (h, s) = (hold.clone(), sent.clone());
    c.world.drop_filter = Some(Box::new(move |_, _, b| match Frame::parse(b) {
        Ok(Frame::AtomicReq { hdr, .. }) => {
            s.borrow_mut().insert(hdr.msg_seq);
            false
        }
        // No answer yet: the requester sees nothing come back.
        Ok(Frame::AtomicResp { .. }) => *h.borrow(),
        _ => false,
    }));
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let wrs: Vec<u64> = (0..40).map(|_| c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 8, 8), 1, 0)).collect();
    c.run_for(3 * MS); // several retransmission timeouts
    assert_eq!(*sent.borrow(), (0..ATOMIC_WINDOW).collect::<HashSet<_>>(), "only the first window may go out");
    assert!(c.completions(1).is_empty());
    assert_eq!(c.world.nodes[1].nic.occupancy().atomics, 40, "the rest wait in the requester");
    assert_eq!(c.read_word(0, key, 8, 8), ATOMIC_WINDOW as u64, "the window was executed once");
    *hold.borrow_mut() = false;
    for (i, wr) in wrs.into_iter().enumerate() {
        assert_eq!(done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8).tag, i as u64);
    }
    assert_eq!(sent.borrow().len(), 40);
    quiet(&mut c);
    assert_eq!(c.read_word(0, key, 8, 8), 40);
}

/// CAS hit and miss, swap and wrapping fetch-add at `width`; the word's
/// neighbours must not be touched.
fn semantics(width: u32) {
    let mut c = cluster(2, WireConfig::default());
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let at = (key, 16, width);
    let mask = if width == 4 { 0xFFFF_FFFF } else { u64::MAX };
    c.write_word(0, key, 8, 8, 0x1111_1111_1111_1111);
    c.write_word(0, key, 24, 8, 0x2222_2222_2222_2222);
    c.write_word(0, key, 16, width, 0x0123_4567_89AB_CDEF & mask);
    let op = |c: &mut Cluster, o: Opcode, operand: u64, compare: u64| {
        let wr = c.atomic(1, o, 0, at, operand, compare);
        let cqe = done(c, 1, wr, o, width);
        assert_eq!(status(&cqe), Status::Success, "{o:?}");
        cqe.tag
    };
    let v0 = 0x0123_4567_89AB_CDEF & mask;
    // CAS miss: returns the value, writes nothing.
    assert_eq!(op(&mut c, Opcode::AtomicCmpSwap, 7, v0 ^ 1), v0);
    assert_eq!(c.read_word(0, key, 16, width), v0);
    // CAS hit.
    assert_eq!(op(&mut c, Opcode::AtomicCmpSwap, 7, v0), v0);
    assert_eq!(c.read_word(0, key, 16, width), 7);
    // Swap.
    assert_eq!(op(&mut c, Opcode::AtomicSwap, mask - 1, 0), 7);
    assert_eq!(c.read_word(0, key, 16, width), mask - 1);
    // Fetch-add wraps at the width.
    assert_eq!(op(&mut c, Opcode::AtomicFetchAdd, 3, 0), mask - 1);
    assert_eq!(c.read_word(0, key, 16, width), 1);
    assert_eq!(c.read_word(0, key, 8, 8), 0x1111_1111_1111_1111, "word below untouched");
    if width == 4 {
        assert_eq!(c.read_word(0, key, 20, 4), 0, "the other half of the 64-bit slot untouched");
    }
    assert_eq!(c.read_word(0, key, 24, 8), 0x2222_2222_2222_2222, "word above untouched");
    quiet(&mut c);
}

#[test]
fn test_32_bit_word_cas_swap_fetch_add_semantics() {
    semantics(4);
}

#[test]
fn test_64_bit_word_cas_swap_fetch_add_semantics() {
    semantics(8);
}

#[test]
fn test_refused_targets_remote_access_error() {
    let mut c = cluster(2, WireConfig::default());
    let ok = c.reg_mr(0, 4096, ATOMIC_RW);
    let no_atomic = c.reg_mr(0, 4096, MR_LOCAL_READ | MR_LOCAL_WRITE);
    let short = c.reg_mr(0, 4100, ATOMIC_RW);
    c.write_word(0, no_atomic, 0, 8, 5);
    let bad = [
        ((no_atomic, 0, 8), "no MR_REMOTE_ATOMIC"),
        ((c.data_key(0), 0, 8), "the port's data region has no remote rights"),
        ((ok, 4096, 8), "beyond the region"),
        ((short, 4096, 8), "straddles the end"),
        ((ok ^ 0x0100_0000, 0, 8), "stale key of a valid slot"),
        ((0x33 << 16 | 60, 0, 4), "key of an empty slot"),
    ];
    for (at, why) in bad {
        let wr = c.atomic(1, Opcode::AtomicFetchAdd, 0, at, 1, 0);
        let cqe = done(&mut c, 1, wr, Opcode::AtomicFetchAdd, at.2);
        assert_eq!(status(&cqe), Status::RemoteAccessError, "{why}");
    }
    assert_eq!(c.read_word(0, no_atomic, 0, 8), 5, "refused means not executed");
    // The same requester still works afterwards.
    let wr = c.atomic(1, Opcode::AtomicFetchAdd, 0, (ok, 0, 8), 1, 0);
    assert_eq!(status(&done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8)), Status::Success);
    quiet(&mut c);
}

fn raw_atomic(c: &Cluster, op: Opcode, dst: u16, result: Sge, remote: Sge, tag: u64, ignore: u64) -> WorkDesc {
    let _ = c;
    let mut d = WorkDesc {
        opcode: op as u8,
        flags: WD_SIGNALED,
        num_sge: 2,
        node: dst,
        port: 0,
        tag,
        ignore,
        ..Default::default()
    };
    d.sge[0] = result;
    d.sge[1] = remote;
    d
}

#[test]
fn test_malformed_atomic_descriptors_refused_locally() {
    let mut c = cluster(2, WireConfig::default());
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let local = c.data_key(1);
    let r8 = Sge { key: local, len: 8, offset: 0 };
    // The remote end: key, secret (in the SGE's length), offset.
    let w8 = RemoteSge { key, secret: c.secret(0, key), offset: 8 }.to_sge();
    let cases = [
        (
            raw_atomic(&c, Opcode::AtomicFetchAdd, 0, r8, Sge { offset: 4, ..w8 }, 1, 0),
            Status::BadDescriptor,
            "misaligned",
        ),
        (raw_atomic(&c, Opcode::AtomicFetchAdd, 0, Sge { len: 3, ..r8 }, w8, 1, 0), Status::BadDescriptor, "width 3"),
        (
            raw_atomic(&c, Opcode::AtomicFetchAdd, 0, Sge { len: 4, ..r8 }, Sge { offset: 6, ..w8 }, 1, 0),
            Status::BadDescriptor,
            "a 4-byte word misaligned",
        ),
        (raw_atomic(&c, Opcode::AtomicFetchAdd, 0, r8, w8, 1, 9), Status::BadDescriptor, "compare on a fetch-add"),
        (
            raw_atomic(&c, Opcode::AtomicSwap, 0, Sge { len: 4, ..r8 }, w8, 1 << 32, 0),
            Status::BadDescriptor,
            "operand wider than 32 bits",
        ),
        (raw_atomic(&c, Opcode::AtomicCmpSwap, 9, r8, w8, 1, 0), Status::BadDescriptor, "no route to node 9"),
        (
            raw_atomic(&c, Opcode::AtomicCmpSwap, 0, Sge { key: local ^ 0x0100_0000, ..r8 }, w8, 1, 0),
            Status::BadKey,
            "bad local key",
        ),
        (
            raw_atomic(&c, Opcode::AtomicCmpSwap, 0, Sge { offset: (8 << 20) - 4, ..r8 }, w8, 1, 0),
            Status::AccessDenied,
            "result beyond the region",
        ),
    ];
    for (d, want, why) in cases {
        let wr = c.post_raw(1, d, true);
        let cqe = c.wait(1, wr, 10 * MS).unwrap_or_else(|| panic!("{why}: no completion"));
        assert_eq!((status(&cqe), cqe.opcode), (want, d.opcode), "{why}");
    }
    let mut one = raw_atomic(&c, Opcode::AtomicFetchAdd, 0, r8, w8, 1, 0);
    one.num_sge = 1;
    one.sge[1] = Sge::default();
    let wr = c.post_raw(1, one, true);
    assert_eq!(status(&c.wait(1, wr, 10 * MS).unwrap()), Status::BadDescriptor, "one SGE");
    assert_eq!(c.read_word(0, key, 8, 8), 0, "nothing reached the target");
    assert_eq!(c.world.stats.frames, 0, "nothing went on the wire");
    quiet(&mut c);
}

/// A hand-made request the requester's validation would never let out:
/// the target must check alignment and width itself.
#[test]
fn test_forged_misaligned_request_refused_by_target() {
    let mut c = cluster(2, WireConfig::default());
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    c.write_word(0, key, 0, 8, 0x0101_0101_0101_0101);
    let answers = Rc::new(RefCell::new(Vec::new()));
    let log = answers.clone();
    c.world.drop_filter = Some(Box::new(move |_, _, b| {
        if let Ok(Frame::AtomicResp { hdr, result }) = Frame::parse(b) {
            log.borrow_mut().push((hdr.msg_seq, result.status));
        }
        false
    }));
    let hdr = FrameHeader {
        version: wire::WIRE_VERSION,
        kind: FrameKind::AtomicReq as u8,
        src_node: 1,
        dst_node: 0,
        src_gen: 77,
        ..Default::default()
    };
    let mut b = [0u8; FrameHeader::SIZE + AtomicBody::SIZE];
    let secret = c.secret(0, key);
    for (seq, offset, width) in [(0u32, 3u64, 8u8), (1, 2, 4), (2, 8, 8)] {
        let body =
            AtomicBody { op: atomic_op::FETCH_ADD, width, rkey: key, offset, operand: 1, secret, ..Default::default() };
        let n = wire::emit_atomic_req(&FrameHeader { msg_seq: seq, ..hdr }, &body, &mut b).unwrap();
        c.world.inject_frame(0, &b[..n]);
        c.run_for(MS);
    }
    let e = Status::RemoteAccessError as u8;
    assert_eq!(*answers.borrow(), vec![(0, e), (1, e), (2, Status::Success as u8)]);
    assert_eq!(c.read_word(0, key, 0, 8), 0x0101_0101_0101_0101);
    assert_eq!(c.read_word(0, key, 8, 8), 1);
}

#[test]
fn test_requester_reincarnation_resets_the_cache() {
    let mut c = cluster(2, WireConfig::default());
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    for i in 0..5 {
        let wr = c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 0, 8), 1, 0);
        assert_eq!(done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8).tag, i);
    }
    // A new process on node 1's port: its sequence numbers restart at 0,
    // and must be executed, not answered with the old process's results.
    c.reopen_port(1);
    for i in 5..10 {
        let wr = c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 0, 8), 1, 0);
        assert_eq!(done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8).tag, i);
    }
    quiet(&mut c);
    assert_eq!(c.read_word(0, key, 0, 8), 10);
    assert_eq!(c.counter(0, counter::ATOMIC_REPLAYS), 0);
}

#[test]
fn test_closed_target_port_remote_port_closed() {
    let mut c = cluster(2, WireConfig::default());
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let wr = c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 0, 8), 1, 0);
    assert_eq!(status(&done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8)), Status::Success);
    assert_eq!(c.close_port(0), Some(0));
    let wrs: Vec<u64> = (0..30).map(|_| c.atomic(1, Opcode::AtomicSwap, 0, (key, 0, 8), 5, 0)).collect();
    for wr in wrs {
        assert_eq!(status(&done(&mut c, 1, wr, Opcode::AtomicSwap, 8)), Status::RemotePortClosed);
    }
    assert!(c.world.now < 50 * MS, "failed fast, not by the retry limit");
    quiet(&mut c);
    assert_eq!(c.read_word(0, key, 0, 8), 1);
}

#[test]
fn test_reopened_target_port_old_generation_refused() {
    let mut c = cluster(2, WireConfig::default());
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let wr = c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 0, 8), 1, 0);
    assert_eq!(status(&done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8)), Status::Success);
    // The target's process is replaced: requests addressed to the old one
    // fail, and the requester then reaches the new one.
    c.reopen_port(0);
    let wr = c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 0, 8), 1, 0);
    assert_eq!(status(&done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8)), Status::RemotePortClosed);
    let wr = c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 0, 8), 1, 0);
    let cqe = done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8);
    assert_eq!((status(&cqe), cqe.tag), (Status::Success, 1));
    quiet(&mut c);
}

#[test]
fn test_partitioned_forever_atomic_fails_retry_limit() {
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
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let wrs: Vec<u64> = (0..20).map(|_| c.atomic(1, Opcode::AtomicCmpSwap, 0, (key, 0, 4), 1, 0)).collect();
    for wr in wrs {
        assert_eq!(status(&done(&mut c, 1, wr, Opcode::AtomicCmpSwap, 4)), Status::RetryLimitExceeded);
    }
    // 16 in the window first, then the 4 held back: 6 timeouts each.
    assert_eq!(c.counter(1, counter::TIMEOUTS), 20 * 6);
    quiet(&mut c);
}

#[test]
fn test_partition_heals_atomics_complete_once() {
    let wire = WireConfig {
        partition: Some(Partition { start_ns: 0, end_ns: 20 * MS, side: vec![true, false, false] }),
        ..WireConfig::default()
    };
    let mut c = cluster(3, wire);
    let (word, olds) = hammer(&mut c, 30);
    assert_eq!(word, 60);
    assert_permutation(olds, 60);
}

#[test]
fn test_port_close_flushes_outstanding_atomics() {
    let wire = WireConfig {
        partition: Some(Partition { start_ns: 0, end_ns: u64::MAX, side: vec![true, false] }),
        ..WireConfig::default()
    };
    let mut c = cluster(2, wire);
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let wrs: Vec<u64> = (0..25).map(|_| c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 0, 8), 1, 0)).collect();
    c.run_for(MS);
    assert_eq!(c.world.nodes[1].nic.occupancy().atomics, 25);
    assert_eq!(c.close_port(1), Some(0));
    let flushed: HashSet<u64> =
        c.completions(1).iter().filter(|x| status(x) == Status::Flushed).map(|x| x.wr_id).collect();
    assert_eq!(flushed, wrs.into_iter().collect::<HashSet<_>>());
    assert_eq!(c.world.nodes[1].nic.occupancy(), Occupancy { ports_open: 0, ..Occupancy::default() });
}

#[test]
fn test_atomic_table_full_descriptors_wait_in_the_ring() {
    let cfg = Config { atomic_max: 4, ..Config::default() };
    let mut c = Cluster::new(2, cfg, 0, 1500, WireConfig { loss: 0.05, ..WireConfig::default() });
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    // More than the table and the ring: the host waits for ring room.
    let wrs: Vec<u64> = (0..100).map(|_| c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 0, 8), 1, 0)).collect();
    for (i, wr) in wrs.into_iter().enumerate() {
        let cqe = done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8);
        assert_eq!((status(&cqe), cqe.tag), (Status::Success, i as u64));
    }
    quiet(&mut c);
    assert_eq!(c.read_word(0, key, 0, 8), 100);
}

#[test]
fn test_atomics_and_messages_share_a_peer() {
    let mut c = cluster(2, WireConfig { loss: 0.05, reorder: 0.1, ..WireConfig::default() });
    let key = c.reg_mr(0, 4096, ATOMIC_RW);
    let mut recvs = Vec::new();
    let mut ops = Vec::new();
    for i in 0..30u64 {
        recvs.push(c.recv(0, (1, 0), i, 0, 3000));
        c.send(1, 0, i, &vec![i as u8; 3000]);
        ops.push(c.atomic(1, Opcode::AtomicFetchAdd, 0, (key, 0, 8), 2, 0));
    }
    for (i, r) in recvs.into_iter().enumerate() {
        let rc = c.wait(0, r, 10_000 * MS).unwrap();
        assert_eq!(status(&rc), Status::Success);
        assert_eq!(c.received(r, 3000), vec![i as u8; 3000]);
    }
    for (i, wr) in ops.into_iter().enumerate() {
        assert_eq!(done(&mut c, 1, wr, Opcode::AtomicFetchAdd, 8).tag, 2 * i as u64);
    }
    quiet(&mut c);
    assert_eq!(c.read_word(0, key, 0, 8), 60);
}
