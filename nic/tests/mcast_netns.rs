//! Multicast across network namespaces: four namespaces, one node each,
//! on a bridge (multicast snooping off) in a fifth. Node 0 transmits one
//! frame to a multicast address, on the `udp` wire (IP multicast) and on
//! the `packet` wire (an Ethernet group); nodes 1–3 joined it and each
//! receive it, the sender's wire counts one transmission. Needs
//! CAP_NET_ADMIN and CAP_NET_RAW (prints "skipped: …" without them).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::Command;

use emp_nic::route::{Route, RouteTable};
use emp_nic::wire::{Faults, PacketWire, UdpMcastMode, UdpWire, Wire};
use emp_uapi::wire::{emit_ack, AckBody, FrameHeader, FrameKind, MCAST_BASE, WIRE_VERSION};

const NODES: usize = 4;
const GROUP: u16 = MCAST_BASE + 3;

fn caps() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap_or(0)
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().expect("run");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The namespaces of the bed; removed (with their links) when dropped.
struct Bed {
    names: Vec<String>,
}

impl Drop for Bed {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

fn mac(node: usize) -> [u8; 6] {
    [2, 0, 0xc6, 0x12, 100, node as u8 + 1]
}

fn addr(node: usize) -> SocketAddr {
    format!("198.18.100.{}:47000", node + 1).parse().unwrap()
}

/// Builds the bed: `<tag>b` holds the bridge, `<tag>0..3` a node each.
fn bed(tag: &str) -> Bed {
    let br = format!("{tag}b");
    let mut b = Bed { names: vec![br.clone()] };
    for n in 0..NODES {
        let _ = Command::new("ip").args(["netns", "del", &format!("{tag}{n}")]).output();
    }
    let _ = Command::new("ip").args(["netns", "del", &br]).output();
    sh(&["ip", "netns", "add", &br]);
    sh(&["ip", "-n", &br, "link", "add", "mcbr", "type", "bridge", "mcast_snooping", "0"]);
    sh(&["ip", "-n", &br, "link", "set", "mcbr", "up"]);
    for n in 0..NODES {
        let ns = format!("{tag}{n}");
        sh(&["ip", "netns", "add", &ns]);
        b.names.push(ns.clone());
        let (port, nic) = (format!("mcp{n}"), format!("mcv{n}"));
        sh(&["ip", "-n", &br, "link", "add", &port, "type", "veth", "peer", "name", &nic, "netns", &ns]);
        sh(&["ip", "-n", &br, "link", "set", &port, "master", "mcbr", "up"]);
        let m = mac(n).iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        sh(&["ip", "-n", &ns, "link", "set", &nic, "address", &m, "multicast", "on", "up"]);
        sh(&["ip", "-n", &ns, "addr", "add", &format!("198.18.100.{}/24", n + 1), "dev", &nic]);
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
    }
    b
}

/// Runs `f` on a thread inside namespace `ns` (sockets it opens stay there).
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(path).unwrap();
        // SAFETY: setns(2) on an open namespace file; affects this thread only.
        assert_eq!(unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) }, 0);
        f()
    })
    .join()
    .expect("netns thread")
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

fn routes() -> RouteTable {
    RouteTable::new((0..NODES).map(|n| Route { udp: Some(addr(n)), mac: Some(mac(n)) }).collect())
}

/// Sends one multicast from wire 0 (after everyone else joined), then
/// polls every wire: what each received.
fn one_multicast(wires: &mut [Box<dyn Wire>], what: &str) {
    for (n, w) in wires.iter_mut().enumerate().skip(1) {
        w.set_membership(0, GROUP, true).unwrap_or_else(|e| panic!("{what}: node {n} join: {e}"));
    }
    // Node 0 is no member: it must not receive its own frame either way.
    std::thread::sleep(std::time::Duration::from_millis(50)); // IGMP / MLD reports settle
    wires[0].send(0, 0, GROUP, ack(0, GROUP));
    wires[0].flush(0);
    let mut got = vec![0; NODES];
    for _ in 0..100 {
        for (n, w) in wires.iter_mut().enumerate() {
            let mut rx = vec![VecDeque::new()];
            w.poll(0, &mut rx);
            for f in rx[0].drain(..) {
                assert_eq!(f, ack(0, GROUP), "{what}: node {n} got the frame intact");
                got[n] += 1;
            }
        }
        if got[1..].iter().all(|&g| g == 1) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::thread::sleep(std::time::Duration::from_millis(30));
    for (n, w) in wires.iter_mut().enumerate() {
        let mut rx = vec![VecDeque::new()];
        w.poll(0, &mut rx);
        got[n] += rx[0].len();
    }
    assert_eq!(got, [0, 1, 1, 1], "{what}: each member once, the sender not");
    let s = wires[0].stats();
    assert_eq!((s.frames, s.mcast_sent, s.mcast_fallback), (1, 1, 0), "{what}: one transmission: {s:?}");
    for (n, w) in wires.iter().enumerate().skip(1) {
        let s = w.stats();
        assert_eq!((s.received, s.mcast_received, s.frames), (1, 1, 0), "{what}: node {n}: {s:?}");
    }
    // A member that leaves gets nothing more.
    wires[3].set_membership(0, GROUP, false).unwrap();
    wires[0].send(0, 0, GROUP, ack(0, GROUP));
    wires[0].flush(0);
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut rx = vec![VecDeque::new()];
    wires[3].poll(0, &mut rx);
    assert!(rx[0].is_empty(), "{what}: node 3 left the group");
}

#[test]
fn one_transmission_reaches_three_namespaces() {
    const NET_ADMIN: u64 = 1 << 12;
    const NET_RAW: u64 = 1 << 13;
    if caps() & (NET_ADMIN | NET_RAW) != NET_ADMIN | NET_RAW {
        println!("skipped: needs CAP_NET_ADMIN and CAP_NET_RAW, which this process lacks");
        return;
    }
    let tag = format!("mc{}", std::process::id() % 100_000);
    let b = bed(&tag);
    let mut udp: Vec<Box<dyn Wire>> = Vec::new();
    let mut packet: Vec<Box<dyn Wire>> = Vec::new();
    for n in 0..NODES {
        let (u, p) = in_netns(&b.names[1 + n], move || {
            let mut u = UdpWire::new(&[addr(n)], routes(), Faults::default()).unwrap();
            let mode = u.enable_multicast();
            assert_eq!(mode, UdpMcastMode::Ip { port: 47001 }, "IP multicast on the bridge");
            let p = PacketWire::new(&[(format!("mcv{n}"), n as u16)], routes(), 1500, Faults::default()).unwrap();
            (u, p)
        });
        udp.push(Box::new(u));
        packet.push(Box::new(p));
    }
    one_multicast(&mut udp, "udp");
    one_multicast(&mut packet, "packet");
    drop((udp, packet));
    drop(b);
}
