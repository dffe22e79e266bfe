//! Matching of unexpected messages: a message no posted receive matches
//! does not block later ones (the `unexpected` mode: eager pool, retained
//! headers pulled by rendezvous), same-match order holds, the tables stay
//! bounded with flow control when full, and every path ends in a
//! completion. The `ordered-refusal` mode keeps the thesis' rule, under
//! which the out-of-order tags program does not finish.

use emp_firmware::{Config, MatchMode};
use emp_sim::cluster::Cluster;
use emp_sim::world::WireConfig;
use emp_uapi::desc::{Cqe, Status};
use emp_uapi::sram::{counter, match_mode};
use emp_uapi::{ANY_NODE, ANY_PORT};

const MS: u64 = 1_000_000;

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect()
}

fn status(c: &Cqe) -> Status {
    Status::from_u8(c.status).unwrap()
}

fn cluster_with(cfg: Config, wire: WireConfig) -> Cluster {
    Cluster::new(2, cfg, 0, 1500, wire)
}

/// Rank 0 sends tag 1 then tag 2; rank 1 receives tag 2 first, then tag 1.
/// Returns whether both receives completed within `limit_ns` with the
/// right data (and both sends completed).
fn out_of_order_tags(c: &mut Cluster, len: usize, limit_ns: u64) -> bool {
    out_of_order_tags_of(c, [len, len], limit_ns)
}

/// As [`out_of_order_tags`], tag 1's message `lens[0]` bytes, tag 2's `lens[1]`.
fn out_of_order_tags_of(c: &mut Cluster, lens: [usize; 2], limit_ns: u64) -> bool {
    let (m1, m2) = (data(lens[0], 1), data(lens[1], 2));
    let s1 = c.send(0, 1, 1, &m1);
    let s2 = c.send(0, 1, 2, &m2);
    c.run_for(2 * MS);
    let r2 = c.recv(1, (0, 0), 2, 0, lens[1] as u64);
    let Some(rc2) = c.wait(1, r2, limit_ns) else { return false };
    assert_eq!((status(&rc2), rc2.tag, rc2.byte_len as usize), (Status::Success, 2, lens[1]));
    assert_eq!(c.received(r2, lens[1]), m2);
    let r1 = c.recv(1, (0, 0), 1, 0, lens[0] as u64);
    let rc1 = c.wait(1, r1, limit_ns).expect("tag 1 delivered once its receive is posted");
    assert_eq!((status(&rc1), rc1.tag, rc1.msg_len as usize), (Status::Success, 1, lens[0]));
    assert_eq!(c.received(r1, lens[0]), m1);
    for s in [s1, s2] {
        assert_eq!(status(&c.wait(0, s, limit_ns).expect("send completes")), Status::Success);
    }
    true
}

#[test]
fn test_out_of_order_tags_small_complete() {
    let mut c = cluster_with(Config::default(), WireConfig::default());
    assert!(out_of_order_tags(&mut c, 64, 50 * MS));
    // Both arrived before any receive: both waited in the eager pool.
    assert_eq!(c.counter(1, counter::UNEXP_EAGER), 2);
    assert_eq!(c.counter(1, counter::UNEXP_BYTES), 128);
    assert_eq!(c.counter(1, counter::UNEXP_RDV), 0);
}

#[test]
fn test_out_of_order_tags_64k_and_4m_complete_by_rendezvous() {
    // (Two 4 MiB messages and their receives would not fit the simulated
    // 8 MiB regions: tag 2's is 3.5 MiB.)
    for lens in [[64 << 10, 64 << 10], [4 << 20, 7 << 19]] {
        let len = lens[0];
        let mut c = cluster_with(Config::default(), WireConfig::default());
        assert!(out_of_order_tags_of(&mut c, lens, 2_000 * MS), "{len} bytes");
        assert_eq!(c.counter(1, counter::UNEXP_RDV), 2, "{len}: both headers were retained");
        assert_eq!(c.counter(1, counter::RDV_PULLS), 2, "{len}: both were pulled");
        assert_eq!(c.world.nodes[1].nic.occupancy().unexp_entries, 0);
    }
}

#[test]
fn test_out_of_order_tags_hang_under_ordered_refusal() {
    // The thesis' and PM's rule: tag 1 is refused and blocks tag 2.
    for len in [64, 64 << 10] {
        let cfg = Config { matching: MatchMode::OrderedRefusal, ..Config::default() };
        let mut c = cluster_with(cfg, WireConfig::default());
        assert!(!out_of_order_tags(&mut c, len, 200 * MS), "{len}: tag 2 was not blocked");
    }
    // The same NIC, the receiving port opened in ordered-refusal mode.
    let mut c = cluster_with(Config::default(), WireConfig::default());
    c.reopen_port_mode(1, match_mode::ORDERED_REFUSAL);
    assert!(!out_of_order_tags(&mut c, 64, 200 * MS));
    // And back to the unexpected mode on reopening.
    let mut c = cluster_with(Config { matching: MatchMode::OrderedRefusal, ..Config::default() }, Default::default());
    c.reopen_port_mode(1, match_mode::UNEXPECTED);
    assert!(out_of_order_tags(&mut c, 64, 50 * MS));
}

#[test]
fn test_rendezvous_send_completes_only_after_the_pull() {
    let mut c = cluster_with(Config::default(), WireConfig::default());
    let m = data(100_000, 7);
    let s = c.send(0, 1, 5, &m);
    c.run_for(200 * MS);
    assert!(c.completions(0).is_empty(), "the send's buffer is still the message's only copy");
    assert_eq!(c.counter(1, counter::UNEXP_RDV), 1);
    let r = c.recv(1, (ANY_NODE, ANY_PORT), 0, u64::MAX, 100_000);
    let rc = c.wait(1, r, 100 * MS).unwrap();
    assert_eq!((status(&rc), rc.tag, rc.src_node), (Status::Success, 5, 0));
    assert_eq!(c.received(r, 100_000), m);
    assert_eq!(status(&c.wait(0, s, 100 * MS).unwrap()), Status::Success);
}

#[test]
fn test_same_match_order_holds_across_eager_and_rendezvous() {
    // Small, large, small, large with one tag, all unexpected: receives
    // posted later take them in sending order, wildcard or not.
    let mut c = cluster_with(Config::default(), WireConfig::default());
    let lens = [100, 20_000, 300, 5_000, 0, 1_000];
    let msgs: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| data(l, i as u8)).collect();
    let sends: Vec<u64> = msgs.iter().map(|m| c.send(0, 1, 9, m)).collect();
    // A message of another tag in between is not taken by them.
    let other = c.send(0, 1, 77, &data(50, 99));
    c.run_for(5 * MS);
    for (i, m) in msgs.iter().enumerate() {
        let r =
            if i % 2 == 0 { c.recv(1, (0, 0), 9, 0, 20_000) } else { c.recv(1, (ANY_NODE, ANY_PORT), 8, 1, 20_000) };
        let rc = c.wait(1, r, 200 * MS).unwrap();
        assert_eq!((status(&rc), rc.msg_len as usize), (Status::Success, m.len()), "message {i}");
        assert_eq!(c.received(r, m.len()), *m, "message {i} in order");
    }
    let r = c.recv(1, (ANY_NODE, ANY_PORT), 0, u64::MAX, 64);
    assert_eq!(c.wait(1, r, 50 * MS).unwrap().tag, 77);
    for s in sends.into_iter().chain([other]) {
        assert_eq!(status(&c.wait(0, s, 200 * MS).unwrap()), Status::Success);
    }
}

#[test]
fn test_rendezvous_into_a_short_receive_is_truncated() {
    let mut c = cluster_with(Config::default(), WireConfig::default());
    let m = data(10_000, 3);
    let s = c.send(0, 1, 4, &m);
    c.run_for(2 * MS);
    let r = c.recv(1, (0, 0), 4, 0, 3_000);
    let rc = c.wait(1, r, 100 * MS).unwrap();
    assert_eq!((status(&rc), rc.byte_len, rc.msg_len), (Status::Truncated, 3_000, 10_000));
    assert_eq!(c.received(r, 3_000), m[..3_000]);
    assert_eq!(status(&c.wait(0, s, 100 * MS).unwrap()), Status::Success);
}

#[test]
fn test_full_tables_refuse_then_deliver_without_loss() {
    // One eager slot, one header: the third unexpected message is refused
    // (counted) and sent again once the tables have room.
    let cfg = Config { unexp_slots: 1, unexp_headers: 1, ..Config::default() };
    let mut c = cluster_with(cfg, WireConfig::default());
    let msgs: Vec<Vec<u8>> = (0..5).map(|i| data(if i % 2 == 0 { 200 } else { 4_000 }, i as u8)).collect();
    let sends: Vec<u64> = msgs.iter().enumerate().map(|(i, m)| c.send(0, 1, i as u64, m)).collect();
    c.run_for(5 * MS);
    assert!(c.counter(1, counter::UNEXP_REFUSED_FULL) > 0);
    let occ = c.world.nodes[1].nic.occupancy();
    assert!(occ.unexp_entries <= 2 && occ.overflow_used <= 1, "{occ:?}");
    // Receive the last one first: it is not among the entries held, so
    // it can only arrive once the earlier ones are taken.
    let mut rs: Vec<(usize, u64)> = Vec::new();
    for i in (0..5).rev() {
        rs.push((i, c.recv(1, (0, 0), i as u64, 0, 4_000)));
    }
    for (i, r) in rs {
        let rc = c.wait(1, r, 2_000 * MS).unwrap_or_else(|| panic!("message {i}"));
        assert_eq!(status(&rc), Status::Success);
        assert_eq!(c.received(r, msgs[i].len()), msgs[i]);
    }
    for s in sends {
        assert_eq!(status(&c.wait(0, s, 2_000 * MS).unwrap()), Status::Success);
    }
}

#[test]
fn test_rendezvous_exactly_once_under_loss_and_reordering() {
    for seed in 0..6u8 {
        let wire = WireConfig { loss: 0.1, reorder: 0.2, dup: 0.05, ..WireConfig::default() };
        let mut c = cluster_with(Config { gen_seed: seed as u16 + 1, ..Config::default() }, wire);
        let lens = [30_000, 80, 70_000, 1_200];
        let msgs: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| data(l, seed ^ i as u8)).collect();
        let sends: Vec<u64> = msgs.iter().enumerate().map(|(i, m)| c.send(0, 1, i as u64 % 2, m)).collect();
        c.run_for(20 * MS);
        // Tag 1's two messages first, then tag 0's: each in its order.
        for i in [1, 3, 0, 2] {
            let r = c.recv(1, (0, 0), i as u64 % 2, 0, 70_000);
            let rc = c.wait(1, r, 10_000 * MS).unwrap_or_else(|| panic!("seed {seed} message {i}"));
            assert_eq!((status(&rc), rc.msg_len as usize), (Status::Success, lens[i]), "seed {seed} message {i}");
            assert_eq!(c.received(r, lens[i]), msgs[i], "seed {seed} message {i}");
        }
        for s in sends {
            assert_eq!(status(&c.wait(0, s, 10_000 * MS).unwrap()), Status::Success, "seed {seed}");
        }
        c.run_for(500 * MS);
        assert!(c.completions(1).is_empty(), "seed {seed}: nothing delivered twice");
        assert_eq!(c.world.nodes[1].nic.occupancy().unexp_entries, 0);
    }
}

#[test]
fn test_receiver_closing_with_retained_headers_fails_the_sends() {
    let mut c = cluster_with(Config::default(), WireConfig::default());
    let s = c.send(0, 1, 1, &data(9_000, 1));
    c.run_for(2 * MS);
    assert_eq!(c.world.nodes[1].nic.occupancy().unexp_entries, 1);
    c.reopen_port(1);
    assert_eq!(c.world.nodes[1].nic.occupancy().unexp_entries, 0, "the close freed the entry");
    let rc = c.wait(0, s, 5_000 * MS).expect("the held send learns the receiver went");
    assert_eq!(status(&rc), Status::RemotePortClosed);
}

#[test]
fn test_sender_closing_fails_the_pull_not_hangs() {
    let mut c = cluster_with(Config::default(), WireConfig::default());
    let s = c.send(0, 1, 1, &data(9_000, 1));
    c.run_for(2 * MS);
    assert_eq!(c.close_port(0), Some(emp_uapi::sram::admin_result::OK));
    let _ = s;
    let r = c.recv(1, (0, 0), 1, 0, 9_000);
    let rc = c.wait(1, r, 40_000 * MS).expect("the receive completes");
    assert_ne!(status(&rc), Status::Success);
    assert_eq!(c.world.nodes[1].nic.occupancy().unexp_entries, 0);
}

#[test]
fn test_probe_peeks_and_claim_reserves_one_message() {
    let mut c = cluster_with(Config::default(), WireConfig::default());
    let (small, large) = (data(40, 1), data(30_000, 2));
    let s1 = c.send(0, 1, 3, &small);
    let s2 = c.send(0, 1, 3, &large);
    c.run_for(5 * MS);
    // Nothing matches tag 4: NoMessage, nothing consumed.
    let p = c.probe(1, (ANY_NODE, ANY_PORT), 4, 0, false);
    assert_eq!(status(&c.wait(1, p, 10 * MS).unwrap()), Status::NoMessage);
    // A plain probe sees the oldest of tag 3, twice: it takes nothing.
    for _ in 0..2 {
        let p = c.probe(1, (0, 0), 3, 0, false);
        let pc = c.wait(1, p, 10 * MS).unwrap();
        assert_eq!((status(&pc), pc.tag, pc.msg_len, pc.src_node), (Status::Success, 3, 40, 0));
    }
    // Claim the large one (pass the small one by claiming it first, then
    // the next probe finds the large one).
    let p = c.probe(1, (0, 0), 3, 0, true);
    let first = c.wait(1, p, 10 * MS).unwrap();
    assert_eq!((status(&first), first.msg_len), (Status::Success, 40));
    let p = c.probe(1, (ANY_NODE, ANY_PORT), 0, u64::MAX, true);
    let second = c.wait(1, p, 10 * MS).unwrap();
    assert_eq!((status(&second), second.msg_len), (Status::Success, 30_000), "a claimed message is passed by");
    // An ordinary receive now finds nothing: both are claimed.
    let p = c.probe(1, (ANY_NODE, ANY_PORT), 0, u64::MAX, false);
    assert_eq!(status(&c.wait(1, p, 10 * MS).unwrap()), Status::NoMessage);
    // Claimed receives take exactly their messages, the large one first.
    let r2 = c.recv_claimed(1, second.byte_len, 30_000);
    let rc = c.wait(1, r2, 100 * MS).unwrap();
    assert_eq!((status(&rc), rc.byte_len), (Status::Success, 30_000));
    assert_eq!(c.received(r2, 30_000), large);
    let r1 = c.recv_claimed(1, first.byte_len, 40);
    assert_eq!(status(&c.wait(1, r1, 10 * MS).unwrap()), Status::Success);
    assert_eq!(c.received(r1, 40), small);
    // A handle used once (or made up) names nothing.
    let again = c.recv_claimed(1, first.byte_len, 40);
    assert_eq!(status(&c.wait(1, again, 10 * MS).unwrap()), Status::NoMessage);
    for s in [s1, s2] {
        assert_eq!(status(&c.wait(0, s, 100 * MS).unwrap()), Status::Success);
    }
    assert_eq!(c.world.nodes[1].nic.occupancy().unexp_entries, 0);
}
