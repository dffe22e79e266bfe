//! Persistent descriptors (EMP thesis §2.3.3): a send and a receive stored
//! once run again at every 24-byte start, with the start's wr_id and the
//! buffer's bytes of the moment; what is left of an older descriptor in
//! the start's ring slot is never read; bad starts and stores are refused
//! with a completion; the tables travel in a saved context and are emptied
//! when the port closes.

use emp_firmware::{image_checksum, Config};
use emp_sim::cluster::Cluster;
use emp_sim::host::work_desc;
use emp_sim::world::WireConfig;
use emp_uapi::desc::{Cqe, Opcode, Status, WorkDesc, PERSIST_SLOTS, WD_PERSIST};
use emp_uapi::sram::admin_result as ar;
use emp_uapi::Le;

const MS: u64 = 1_000_000;
const LEN: u64 = 3000;
/// Where node 0's stored send reads and node 1's stored receive writes.
const SRC: u64 = 1 << 20;
const DST: u64 = 2 << 20;

fn status(c: &Cqe) -> Status {
    Status::from_u8(c.status).unwrap()
}

fn payload(round: u64) -> Vec<u8> {
    (0..LEN).map(|i| (i.wrapping_mul(13) ^ round.wrapping_mul(101)) as u8).collect()
}

/// Node 0 stores a send of (SRC, LEN) to node 1 with `tag` in send slot
/// `s`; node 1 stores a receive of tag `tag` into (DST, LEN) in receive
/// slot `r`.
fn store_pair(c: &mut Cluster, s: u8, r: u8, tag: u64) {
    let d = work_desc(Opcode::Send as u8, 0, 1, 0, tag, 0, c.data_key(0), SRC, LEN, 2);
    c.store(0, s, d, true);
    let d = work_desc(Opcode::Recv as u8, 0, 0, 0, tag, 0, c.data_key(1), DST, LEN, 3);
    c.store(1, r, d, false);
}

/// One round: node 0's buffer gets this round's bytes, both slots start,
/// the message arrives whole under the starts' wr_ids.
fn round(c: &mut Cluster, s: u8, r: u8, tag: u64, i: u64) {
    c.write_data(0, SRC, &payload(i));
    let rw = c.start(1, r, false, DST, LEN);
    let sw = c.start(0, s, true, SRC, LEN);
    let rc = c.wait(1, rw, 50 * MS).expect("the started receive completes");
    assert_eq!((status(&rc), rc.wr_id, rc.opcode, rc.tag), (Status::Success, rw, Opcode::Recv as u8, tag));
    assert_eq!(rc.byte_len as u64, LEN);
    assert_eq!(c.received(rw, LEN as usize), payload(i), "round {i}: the buffer's bytes of the moment");
    let sc = c.wait(0, sw, 50 * MS).expect("the started send completes");
    assert_eq!((status(&sc), sc.wr_id, sc.opcode), (Status::Success, sw, Opcode::Send as u8));
}

#[test]
fn test_stored_send_and_receive_run_at_every_start() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    store_pair(&mut c, 7, 3, 55);
    c.run_for(MS);
    assert!(c.completions(0).is_empty() && c.completions(1).is_empty(), "a store reports only a failure");
    for i in 0..20 {
        round(&mut c, 7, 3, 55, i);
    }
    // A store replaces what the slot held.
    store_pair(&mut c, 7, 3, 56);
    round(&mut c, 7, 3, 56, 99);
    assert_eq!(c.counter(0, emp_uapi::sram::counter::BAD_DESCRIPTORS), 0);
}

#[test]
fn test_stored_descriptors_survive_a_context_switch_into_another_slot() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    store_pair(&mut c, 0, PERSIST_SLOTS as u8 - 1, 9);
    round(&mut c, 0, PERSIST_SLOTS as u8 - 1, 9, 0);
    for n in [0, 1] {
        assert_eq!(c.suspend(n), ar::OK);
        c.run_for(MS);
        assert!(c.is_stable(n));
        let old = c.port_slot(n);
        let ctx = c.save(n).expect("saved");
        // Another job in the slot it left finds the tables empty.
        let mut b = c.open_other_job(n, old, 9).expect("the slot opens for another job");
        let layout = c.world.layout;
        let tag = if n == 0 { 0 } else { PERSIST_SLOTS as u64 - 1 };
        let d = WorkDesc { wr_id: 77, opcode: Opcode::Start as u8, tag, ..Default::default() };
        assert!(b.post(&mut c.world.nodes[n as usize].sram, &layout, &d, n == 0));
        c.world.ring(n);
        c.run_for(MS);
        let node = &mut c.world.nodes[n as usize];
        let cqe = b.poll_cq(&mut node.sram, &layout, &node.mem).expect("the start is refused");
        assert_eq!((status(&cqe), cqe.wr_id), (Status::BadDescriptor, 77), "another job ran a stored descriptor");
        assert_eq!(c.admin(n, emp_uapi::sram::AdminOp::PortClose, [old as u64, 0, 0, 0, 0, 0]), ar::OK);
        assert_eq!(c.restore(n, &ctx, 2), ar::OK);
        assert_eq!(c.resume(n), ar::OK);
        assert_eq!(c.port_slot(n), 2);
    }
    for i in 1..5 {
        round(&mut c, 0, PERSIST_SLOTS as u8 - 1, 9, i);
    }
}

#[test]
fn test_a_corrupted_stored_descriptor_in_an_image_is_refused() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    store_pair(&mut c, 4, 5, 1);
    c.run_for(MS);
    assert_eq!(c.suspend(1), ar::OK);
    c.run_for(MS);
    let ctx = c.save(1).expect("saved");
    let good = c.image(1, &ctx);
    assert_eq!(u16::from_le_bytes([good[76], good[77]]), 1, "one stored descriptor in the header's count");
    let at = good.len() - (4 + WorkDesc::SIZE);
    let fixed = |mut b: Vec<u8>| {
        let sum = image_checksum(&b);
        b[12..16].copy_from_slice(&sum.to_le_bytes());
        b
    };
    let cases: [(&str, usize, u8); 5] = [
        ("ring 2", at, 2),
        ("on the send ring: a receive there", at, 1),
        ("slot beyond the table", at + 1, PERSIST_SLOTS as u8),
        ("padding", at + 2, 1),
        ("stored with its store flag", at + 4 + 9, WD_PERSIST | 1),
    ];
    for (what, off, v) in cases {
        let mut b = good.clone();
        b[off] = v;
        c.write_image(1, &ctx, &fixed(b));
        assert_eq!(c.restore(1, &ctx, 1), ar::BAD_IMAGE, "{what}");
        assert!(!c.world.nodes[1].nic.port_is_open(1), "{what}: the slot opened");
    }
    let mut b = good.clone();
    b[76] = 2; // one more than the bytes hold
    c.write_image(1, &ctx, &fixed(b));
    assert_eq!(c.restore(1, &ctx, 1), ar::BAD_IMAGE, "count beyond the bytes");
    c.write_image(1, &ctx, &good);
    assert_eq!(c.restore(1, &ctx, 1), ar::OK);
    assert_eq!(c.resume(1), ar::OK);
    round(&mut c, 4, 5, 1, 3);
}

#[test]
fn test_bad_starts_and_stores_complete_as_bad_descriptors() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let bad = |c: &mut Cluster, n: u16, wr: u64, op: Opcode| {
        let cqe = c.wait(n, wr, 10 * MS).expect("a refusal completes");
        assert_eq!((status(&cqe), cqe.opcode), (Status::BadDescriptor, op as u8), "wr {wr}");
    };
    // An empty slot, on either ring.
    let w = c.start(0, 3, true, 0, 0);
    bad(&mut c, 0, w, Opcode::Start);
    let w = c.start(1, 3, false, 0, 0);
    bad(&mut c, 1, w, Opcode::Start);
    // A slot beyond the table; a start with a flag.
    let d = WorkDesc { opcode: Opcode::Start as u8, tag: PERSIST_SLOTS as u64, ..Default::default() };
    let w = c.post_raw(0, d, true);
    bad(&mut c, 0, w, Opcode::Start);
    let d = WorkDesc { opcode: Opcode::Start as u8, flags: 1, tag: 3, ..Default::default() };
    let w = c.post_raw(0, d, true);
    bad(&mut c, 0, w, Opcode::Start);
    // A receive stored through the send ring is neither stored nor run.
    let mut d = work_desc(Opcode::Recv as u8, 0, 0, 0, 1, 0, c.data_key(0), 0, 64, 1);
    (d.flags, d.slot) = (d.flags | WD_PERSIST, 2);
    let w = c.post_raw(0, d, true);
    bad(&mut c, 0, w, Opcode::Recv);
    let w = c.start(0, 2, true, 0, 0);
    bad(&mut c, 0, w, Opcode::Start);
    // A stored send whose memory is gone fails at its start, not its store.
    let d = work_desc(Opcode::Send as u8, 0, 1, 0, 1, 0, 0xBAD0, 0, 64, 1);
    c.store(0, 6, d, true);
    let w = c.start(0, 6, true, 0, 0);
    let cqe = c.wait(0, w, 10 * MS).unwrap();
    assert_eq!((status(&cqe), cqe.opcode), (Status::BadKey, Opcode::Send as u8));
    // A closed port forgets its tables: the slot reopened is empty.
    store_pair(&mut c, 1, 1, 4);
    round(&mut c, 1, 1, 4, 0);
    let slot = c.port_slot(0);
    assert_eq!(c.close_port(0), Some(ar::OK));
    let mut b = c.open_other_job(0, slot, 9).expect("the slot opens again");
    let layout = c.world.layout;
    let d = WorkDesc { wr_id: 77, opcode: Opcode::Start as u8, tag: 1, ..Default::default() };
    assert!(b.post(&mut c.world.nodes[0].sram, &layout, &d, true));
    c.world.ring(0);
    c.run_for(MS);
    let node = &mut c.world.nodes[0];
    let cqe = b.poll_cq(&mut node.sram, &layout, &node.mem).expect("the start is refused");
    assert_eq!((status(&cqe), cqe.wr_id), (Status::BadDescriptor, 77));
}
