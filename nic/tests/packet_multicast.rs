//! The packet wire's Ethernet multicast: in a network namespace of its own
//! with a veth pair, node 1 receives what node 0 sends to a group MAC only
//! while it has joined the group; frames between the NICs of one wire
//! loop back inside it. Needs CAP_NET_ADMIN and CAP_NET_RAW
//! (prints "skipped: …" without them).

use std::collections::VecDeque;
use std::process::Command;

use emp_nic::route::{Route, RouteTable};
use emp_nic::wire::{Faults, PacketWire, Wire};
use emp_uapi::wire::{emit_ack, AckBody, FrameHeader, FrameKind, WIRE_VERSION};

const GROUP: [u8; 6] = [0x01, 0x00, 0x5e, 0x12, 0x00, 0x07];
const MACS: [[u8; 6]; 2] = [[2, 0, 0xc6, 0x12, 1, 1], [2, 0, 0xc6, 0x12, 1, 2]];

fn caps() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap_or(0)
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().expect("run");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn ack(src: u16, dst: u16) -> Vec<u8> {
    let hdr = FrameHeader {
        version: WIRE_VERSION,
        kind: FrameKind::Ack as u8,
        src_node: src,
        dst_node: dst,
        frame_count: 1,
        ..Default::default()
    };
    let mut out = vec![0u8; 128];
    let n = emit_ack(&hdr, &AckBody::default(), &mut out).unwrap();
    out.truncate(n);
    out
}

fn delivered(w: &mut PacketWire, rx: &mut [VecDeque<Vec<u8>>]) -> usize {
    let before = rx[1].len();
    for _ in 0..20 {
        w.poll(0, rx);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    rx[1].len() - before
}

#[test]
fn multicast_group_join_send_leave() {
    const NET_ADMIN: u64 = 1 << 12;
    const NET_RAW: u64 = 1 << 13;
    if caps() & (NET_ADMIN | NET_RAW) != NET_ADMIN | NET_RAW {
        println!("skipped: needs CAP_NET_ADMIN and CAP_NET_RAW, which this process lacks");
        return;
    }
    let ns = Netns(format!("ew-mc{}", std::process::id() % 100_000));
    let _ = Command::new("ip").args(["netns", "del", &ns.0]).output();
    sh(&["ip", "netns", "add", &ns.0]);
    let ex = |a: &[&str]| sh(&[&["ip", "-n", &ns.0][..], a].concat());
    ex(&["link", "add", "ewm0", "type", "veth", "peer", "name", "ewm1"]);
    for (i, m) in MACS.iter().enumerate() {
        let mac = m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        ex(&["link", "set", &format!("ewm{i}"), "address", &mac]);
        ex(&["link", "set", &format!("ewm{i}"), "up"]);
    }
    let name = ns.0.clone();
    std::thread::spawn(move || {
        let f = std::fs::File::open(format!("/var/run/netns/{name}")).unwrap();
        // SAFETY: setns(2) on an open namespace file; affects this thread only.
        assert_eq!(unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) }, 0);
        let routes = RouteTable::new(MACS.iter().map(|&m| Route { udp: None, mac: Some(m) }).collect());
        let locals = [("ewm0".to_string(), 0), ("ewm1".to_string(), 1)];
        let mut w = PacketWire::new(&locals, routes, 1500, Faults::default()).unwrap();
        assert!(w.link(1).unwrap().up);
        assert_eq!(w.rings(0), (true, true), "PACKET_RX_RING and PACKET_TX_RING");
        let mut rx = vec![VecDeque::new(), VecDeque::new()];
        // Unicast on the link works.
        w.send_to_mac(0, MACS[1], &ack(0, 1));
        w.flush(0);
        assert_eq!(delivered(&mut w, &mut rx), 1, "unicast to node 1");
        // Between NICs of one daemon, and from a NIC to itself, frames loop
        // back inside the wire: a link never returns a frame to its sender.
        w.send(0, 0, 1, ack(0, 1));
        w.send(0, 0, 0, ack(0, 0));
        w.flush(0);
        assert_eq!(delivered(&mut w, &mut rx), 1, "looped to node 1");
        assert_eq!(rx[0].len(), 1, "looped to node 0 itself");
        // A group node 1 has not joined: not delivered.
        w.send_to_mac(0, GROUP, &ack(0, 1));
        w.flush(0);
        assert_eq!(delivered(&mut w, &mut rx), 0, "group not joined");
        w.join(1, GROUP).unwrap();
        w.send_to_mac(0, GROUP, &ack(0, 1));
        w.flush(0);
        assert_eq!(delivered(&mut w, &mut rx), 1, "joined group");
        w.leave(1, GROUP).unwrap();
        w.send_to_mac(0, GROUP, &ack(0, 1));
        w.flush(0);
        assert_eq!(delivered(&mut w, &mut rx), 0, "left group");
        assert!(w.join(1, MACS[0]).is_err(), "a unicast MAC is no group");
        let s = w.stats();
        assert_eq!((s.unknown_source, s.source_mismatch, s.malformed), (0, 0, 0), "{s:?}");
    })
    .join()
    .expect("multicast thread");
}
