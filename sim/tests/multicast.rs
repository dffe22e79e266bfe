//! Multicast through the simulator's switch: one transmission from a
//! control program reaches the ports that joined the address on every
//! other node, each link faulted on its own; a NIC whose port has not
//! joined drops what arrives for it.

use emp_firmware::mcast::McastError;
use emp_firmware::Config;
use emp_sim::cluster::Cluster;
use emp_sim::world::WireConfig;
use emp_uapi::wire::{emit_ack, AckBody, FrameHeader, FrameKind, MCAST_BASE, WIRE_VERSION};

const GROUP: u16 = MCAST_BASE + 2;

fn frame(src: u16) -> Vec<u8> {
    frame_to(src, 0)
}

fn frame_to(src: u16, dst_port: u16) -> Vec<u8> {
    let hdr = FrameHeader {
        version: WIRE_VERSION,
        kind: FrameKind::Ack as u8,
        src_node: src,
        dst_node: GROUP,
        dst_port,
        frame_count: 1,
        ..Default::default()
    };
    let mut out = vec![0u8; 128];
    let n = emit_ack(&hdr, &AckBody::default(), &mut out).unwrap();
    out.truncate(n);
    out
}

fn cluster(nodes: u16, wire: WireConfig) -> Cluster {
    Cluster::new(nodes, Config::default(), 0, 1500, wire)
}

fn run(c: &mut Cluster) {
    while c.step().is_some() {}
}

#[test]
fn one_transmission_reaches_joined_ports_only() {
    let mut c = cluster(5, WireConfig { loss: 0.0, dup: 0.0, reorder: 0.0, ..WireConfig::default() });
    for n in [1, 2, 4] {
        c.world.mcast_membership(n, 0, GROUP, true).unwrap();
    }
    assert_eq!(c.world.mcast_membership(1, 3, GROUP, true), Err(McastError::BadPort), "port 3 is not open");
    assert_eq!(c.world.mcast_membership(1, 0, 7, true), Err(McastError::NotMulticast));
    c.world.mcast_transmit(0, &frame(0)).unwrap();
    assert_eq!(c.world.mcast_transmit(0, &frame(1)), Err(McastError::BadFrame), "another node's frame");
    let mut long = frame(0);
    long.resize(1501, 0);
    assert_eq!(c.world.mcast_transmit(0, &long), Err(McastError::BadFrame), "beyond the MTU");
    run(&mut c);
    let got: Vec<(u64, u64, u64)> = c.world.nodes.iter().map(|n| n.nic.mcast_counts()).collect();
    assert_eq!(got, [(1, 0, 0), (0, 1, 0), (0, 1, 0), (0, 0, 0), (0, 1, 0)]);
    assert_eq!((c.world.stats.frames, c.world.stats.mcast_sent, c.world.stats.mcast_copies), (1, 1, 3));
    // To port 1, which joined nothing: the members' NICs receive it (the
    // address is in their filters) and drop it.
    c.world.mcast_transmit(0, &frame_to(0, 1)).unwrap();
    run(&mut c);
    assert_eq!(c.world.nodes[1].nic.mcast_counts(), (0, 1, 1), "dropped: port 1 did not join");
    assert_eq!(c.world.nodes[3].nic.mcast_counts(), (0, 0, 0), "no member: never reached");
    c.world.mcast_membership(2, 0, GROUP, false).unwrap();
    c.world.mcast_transmit(0, &frame(0)).unwrap();
    run(&mut c);
    assert_eq!(c.world.nodes[2].nic.mcast_counts(), (0, 1, 1), "node 2 left: nothing more");
    assert_eq!(c.world.nodes[1].nic.mcast_counts(), (0, 2, 1));
}

#[test]
fn loss_is_per_link() {
    let members = 6u16;
    let mut c = cluster(members + 1, WireConfig { loss: 0.3, dup: 0.0, reorder: 0.2, ..WireConfig::default() });
    for n in 1..=members {
        c.world.mcast_membership(n, 0, GROUP, true).unwrap();
    }
    let sends = 300u64;
    for _ in 0..sends {
        c.world.mcast_transmit(0, &frame(0)).unwrap();
        run(&mut c);
    }
    let got: Vec<u64> = (1..=members).map(|n| c.world.nodes[n as usize].nic.mcast_counts().1).collect();
    let total: u64 = got.iter().sum();
    let s = c.world.stats;
    assert_eq!((s.mcast_sent, s.mcast_copies), (sends, sends * members as u64));
    assert_eq!(total + s.lost, sends * members as u64, "each copy delivered or lost: {got:?} {s:?}");
    for (i, g) in got.iter().enumerate() {
        assert!(*g > 150 && *g < 260, "member {} got {g} of {sends} at 30 % loss", i + 1);
    }
    // Per-link loss: the members did not all lose the same copies.
    assert!(got.windows(2).any(|w| w[0] != w[1]), "{got:?}");
}
