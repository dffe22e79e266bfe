//! Immediate data on sends (`WD_IMM`, libfabric's remote CQ data): the
//! receive's completion reports it (`Cqe::imm` with `CQE_IMM`) whichever
//! way the message reached the receive — a receive posted first, the eager
//! pool, a retained header pulled by rendezvous, a claimed probe — and a
//! probe that finds the message reports it too; a send without it reports
//! none. Under loss, duplication and reordering as on a clean wire.

use emp_firmware::Config;
use emp_sim::cluster::Cluster;
use emp_sim::world::WireConfig;
use emp_uapi::desc::{Cqe, Status, CQE_IMM};
use emp_uapi::sram::counter;
use emp_uapi::ANY_NODE;

const MS: u64 = 1_000_000;

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn imm_of(c: &Cqe) -> Option<u32> {
    (c.flags & CQE_IMM != 0).then_some(c.imm)
}

fn ok(c: &Cqe) {
    assert_eq!(Status::from_u8(c.status), Some(Status::Success), "{c:?}");
}

/// One message of `len` bytes with `imm` (or none), received into a
/// receive posted before (`posted_first`) or after it arrived; returns the
/// receive's completion after checking the data.
fn one(c: &mut Cluster, len: usize, imm: Option<u32>, posted_first: bool, tag: u64) -> Cqe {
    let m = data(len, tag as u8);
    let recv = |c: &mut Cluster| c.recv(1, (ANY_NODE, 0xFFFF), tag, 0, len as u64);
    let r = if posted_first { Some(recv(c)) } else { None };
    let s = match imm {
        Some(v) => c.send_imm(0, 1, tag, &m, v),
        None => c.send(0, 1, tag, &m),
    };
    if r.is_none() {
        c.run_for(2 * MS);
    }
    let r = r.unwrap_or_else(|| recv(c));
    let rc = c.wait(1, r, 4_000 * MS).expect("receive completes");
    ok(&rc);
    assert_eq!((rc.tag, rc.byte_len as usize), (tag, len));
    assert_eq!(c.received(r, len), m, "{len} bytes");
    ok(&c.wait(0, s, 4_000 * MS).expect("send completes"));
    rc
}

fn every_path(wire: WireConfig) {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, wire);
    let mut tag = 1;
    for len in [0usize, 8, 1000, 5000, 64 << 10] {
        for posted_first in [true, false] {
            for imm in [Some(0xA5A5_0000 | tag as u32), Some(0), None] {
                let rc = one(&mut c, len, imm, posted_first, tag);
                assert_eq!(imm_of(&rc), imm, "{len} bytes, posted first {posted_first}");
                tag += 1;
            }
        }
    }
    // Unexpected small messages went through the eager pool, large ones by
    // rendezvous: every path was taken.
    assert!(c.counter(1, counter::UNEXP_EAGER) > 0);
    assert!(c.counter(1, counter::RDV_PULLS) > 0);
}

#[test]
fn test_immediate_data_on_every_receive_path() {
    every_path(WireConfig::default());
}

#[test]
fn test_immediate_data_under_loss_duplication_and_reordering() {
    every_path(WireConfig { loss: 0.05, reorder: 0.2, dup: 0.05, ..WireConfig::default() });
}

#[test]
fn test_probe_and_claimed_receive_report_immediate_data() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    for (len, tag) in [(64usize, 7u64), (200 << 10, 8)] {
        let m = data(len, 3);
        let s = c.send_imm(0, 1, tag, &m, 0xC0FF_EE00 + tag as u32);
        c.run_for(2 * MS);
        let p = c.probe(1, (ANY_NODE, 0xFFFF), tag, 0, false);
        let pc = c.wait(1, p, 100 * MS).expect("peek answers");
        ok(&pc);
        assert_eq!((pc.tag, pc.msg_len as usize, imm_of(&pc)), (tag, len, Some(0xC0FF_EE00 + tag as u32)));
        let p = c.probe(1, (ANY_NODE, 0xFFFF), tag, 0, true);
        let pc = c.wait(1, p, 100 * MS).expect("claim answers");
        ok(&pc);
        assert_eq!(imm_of(&pc), Some(0xC0FF_EE00 + tag as u32), "claiming probe");
        let r = c.recv_claimed(1, pc.byte_len, len as u64);
        let rc = c.wait(1, r, 4_000 * MS).expect("claimed receive completes");
        ok(&rc);
        assert_eq!(imm_of(&rc), Some(0xC0FF_EE00 + tag as u32), "claimed receive");
        assert_eq!(c.received(r, len), m);
        ok(&c.wait(0, s, 4_000 * MS).expect("send completes"));
    }
}

#[test]
fn test_send_completion_carries_no_immediate_data() {
    let mut c = Cluster::new(2, Config::default(), 0, 1500, WireConfig::default());
    let r = c.recv(1, (0, 0), 5, 0, 16);
    let s = c.send_imm(0, 1, 5, &data(16, 1), 99);
    let sc = c.wait(0, s, 100 * MS).expect("send completes");
    ok(&sc);
    assert_eq!(imm_of(&sc), None, "the sender's completion reports no immediate data");
    assert_eq!(imm_of(&c.wait(1, r, 100 * MS).expect("receive")), Some(99));
}
