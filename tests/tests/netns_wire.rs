//! The network wires between hosts: two network namespaces joined by a
//! veth pair (198.18.0.0/15 addresses, locally administered MACs), one
//! `emp-nicd --config --host` in each, tap-p2p with a rank in each, over
//! the `packet` and the `udp` wire. Forged frames (unknown source, a node's
//! address claiming another node, truncated, a foreign ethertype) are sent
//! at node 1 first: each is counted and dropped, and the real traffic
//! still passes; the daemon's counters (`emp::nic_wire_info`, `emp info
//! --config`) show them. Needs CAP_NET_ADMIN (namespaces) and the release binaries
//! (`make build`); without the capability it says "skipped: …".

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use emp_tests::harness::{assert_tap, bin_dir, image, root};
use emp_tests::veth::{ack, has_cap_net_admin, in_netns, mac_str, Bed, Daemons};

const MAC: [[u8; 6]; 3] = [[2, 0, 0xc6, 0x12, 0, 1], [2, 0, 0xc6, 0x12, 0, 2], [2, 0, 0xc6, 0x12, 0, 3]];

/// This file's bed: namespaces `ew-…`, 198.18.0.1 and .2.
fn bed(tag: &str) -> Bed {
    Bed::up("ew", tag, &[MAC[0], MAC[1]], &[[198, 18, 0, 1], [198, 18, 0, 2]])
}

fn cluster_file(dir: &Path, wire: &str, bed: &Bed) -> PathBuf {
    let mut t = format!("[cluster]\nwire = \"{wire}\"\nmtu = 1500\n");
    for h in ["a", "b", "c"] {
        t += &format!("[[host]]\nname = \"{h}\"\ndir = \"{}\"\n", dir.join(h).display());
    }
    // Node 2 is in the route table but runs nowhere: its address is the
    // forger's "known node claiming to be another".
    for (id, host, ifn, ip) in [(0, "a", &bed.ifs[0], 1), (1, "b", &bed.ifs[1], 2), (2, "c", &bed.ifs[0], 1)] {
        t += &format!(
            "[[node]]\nid = {id}\nhost = \"{host}\"\ninterface = \"{ifn}\"\nmac = \"{}\"\nudp = \"198.18.0.{ip}:{}\"\n",
            mac_str(&MAC[id]),
            47100 + id
        );
    }
    let p = dir.join("cluster.toml");
    std::fs::write(&p, t).expect("write cluster file");
    p
}

/// Raw Ethernet frames out of `ifn` (in the current thread's namespace).
fn send_raw(ifn: &str, frames: &[Vec<u8>]) {
    // SAFETY: plain socket(2); checked, closed below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
    let name = std::ffi::CString::new(ifn).expect("name");
    // SAFETY: NUL-terminated name.
    let idx = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert!(idx > 0);
    // SAFETY: sockaddr_ll is plain old data.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_ifindex = idx as i32;
    sll.sll_halen = 6;
    for f in frames {
        // SAFETY: `f` and `sll` are live for the call, lengths as passed.
        let r = unsafe {
            libc::sendto(
                fd,
                f.as_ptr().cast(),
                f.len(),
                0,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(r, f.len() as isize, "sendto: {}", std::io::Error::last_os_error());
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
}

fn eth(dst: [u8; 6], src: [u8; 6], ty: u16, payload: &[u8]) -> Vec<u8> {
    [&dst[..], &src[..], &ty.to_be_bytes(), payload].concat()
}

/// Sends the forged frames at node 1 from namespace a; returns what node
/// 1's wire must count: (unknown_source, source_mismatch, malformed).
fn forge(wire: &str, bed: &Bed) -> (u64, u64, u64) {
    match wire {
        "packet" => in_netns(&bed.ns[0], || {
            let stranger = [2, 0, 0xc6, 0x12, 0, 0x99];
            send_raw(
                &bed.ifs[0],
                &[
                    eth(MAC[1], stranger, 0x88B5, &ack(0, 1)),     // unknown MAC
                    eth(MAC[1], MAC[0], 0x88B5, &ack(7, 1)),       // node 7: in no route
                    eth(MAC[1], MAC[2], 0x88B5, &ack(0, 1)),       // node 2's MAC claiming node 0
                    eth(MAC[1], MAC[0], 0x88B5, &ack(0, 1)[..20]), // truncated
                    eth(MAC[1], MAC[0], 0x0800, &ack(0, 1)),       // foreign ethertype: the kernel filters it
                ],
            );
            (2, 1, 1)
        }),
        _ => in_netns(&bed.ns[0], || {
            let to = "198.18.0.2:47101";
            let stranger = std::net::UdpSocket::bind("198.18.0.1:47199").expect("bind");
            stranger.send_to(&ack(0, 1), to).expect("send"); // unknown address
            stranger.send_to(&ack(0, 1)[..20], to).expect("send"); // truncated (and unknown)
            let node2 = std::net::UdpSocket::bind("198.18.0.1:47102").expect("bind node 2's address");
            node2.send_to(&ack(0, 1), to).expect("send"); // node 2's address claiming node 0
            node2.send_to(&ack(9, 1), to).expect("send"); // node 9: in no route
            (2, 1, 1)
        }),
    }
}

fn wait_for(p: &Path) {
    let t = Instant::now();
    while !p.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "{} did not appear", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_wire(wire: &str) {
    if !has_cap_net_admin() {
        println!("skipped: network namespaces need CAP_NET_ADMIN, which this process lacks");
        return;
    }
    let bed = bed(&wire[..1]);
    let dir = std::env::temp_dir().join(format!("ew-wire-{}-{wire}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("rdv")).expect("dir");
    let cfg = cluster_file(&dir, wire, &bed);
    let nicd = bin_dir().join("emp-nicd");
    let mut daemons = Daemons(Vec::new());
    for (i, host) in ["a", "b"].iter().enumerate() {
        let log = std::fs::File::create(dir.join(format!("{host}.log"))).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", &bed.ns[i]])
            .arg(&nicd)
            .arg("--config")
            .arg(&cfg)
            .args(["--host", host, "--firmware"])
            .arg(image())
            .arg("--trusted")
            .arg(root().join("firmware-blobs"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("emp-nicd");
        daemons.0.push(child);
    }
    for (i, host) in ["a", "b"].iter().enumerate() {
        wait_for(&dir.join(host).join(format!("nic{i}.sock")));
    }
    let (unknown, mismatch, malformed) = forge(wire, &bed);
    let ranks: Vec<Child> = (0..2)
        .map(|r| {
            Command::new("ip")
                .args(["netns", "exec", &bed.ns[r], "timeout", "120"])
                .arg(env!("CARGO_BIN_EXE_tap-p2p"))
                .env("EMP_DEVICE", dir.join(["a", "b"][r]).join(format!("nic{r}.sock")))
                .env("EMP_RANK", r.to_string())
                .env("EMP_SIZE", "2")
                .env("EMP_RDV_DIR", dir.join("rdv"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("tap-p2p")
        })
        .collect();
    let outs: Vec<_> = ranks.into_iter().map(|c| c.wait_with_output().expect("wait")).collect();
    // The counters as the running daemon reports them (WIRE_INFO), and as `emp info` shows them.
    let wire_b = emp::nic_wire_info(&dir.join("b/nic1.sock").to_string_lossy());
    let info = emp_tests::harness::emp().arg("info").arg("--config").arg(&cfg).output().expect("emp info");
    daemons.stop();
    let log_b = std::fs::read_to_string(dir.join("b.log")).unwrap_or_default();
    eprintln!("node 1's daemon ({wire}):\n{log_b}");
    assert_tap(&outs[0], 10);
    assert!(outs[1].status.success(), "rank 1: {}", String::from_utf8_lossy(&outs[1].stderr));
    let w = wire_b.expect("node 1 answers WIRE_INFO");
    assert_eq!(w.kind.as_str(), wire);
    assert_eq!(
        w.link,
        emp::Link::Known { interface: bed.ifs[1].clone(), up: true, mtu: 1500, mac: MAC[1] },
        "node 1's link, read in its namespace"
    );
    assert!(w.counter("received").unwrap() > 0, "tap-p2p's frames were received: {w:?}");
    for (field, want) in
        [("unknown_source", unknown), ("source_mismatch", mismatch), ("malformed", malformed), ("foreign_ethertype", 0)]
    {
        assert_eq!(w.counter(field), Some(want), "{field}: {w:?}");
    }
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(info.status.success(), "emp info --config: {text}{}", String::from_utf8_lossy(&info.stderr));
    for (n, host) in [(0, "a"), (1, "b")] {
        assert!(text.contains(&format!("host {host}\n")), "{text}");
        let row = text.lines().find(|l| l.starts_with(&format!("{n} "))).unwrap_or_else(|| panic!("node {n}: {text}"));
        assert!(row.contains("Running") && row.contains(&format!("{} up mtu 1500", bed.ifs[n])), "{row}");
    }
    assert!(text.lines().any(|l| l.starts_with("2 ") && l.contains("down")), "node 2 runs nowhere: {text}");
    assert!(text.contains(&format!("source_mismatch={mismatch} foreign_ethertype=0 malformed={malformed}")), "{text}");
    assert!(text.contains(&format!("mac {}", mac_str(&MAC[2]))), "the route table: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tap_p2p_across_namespaces_packet_wire_with_forged_frames() {
    run_wire("packet");
}

#[test]
fn tap_p2p_across_namespaces_udp_wire_with_forged_frames() {
    run_wire("udp");
}
