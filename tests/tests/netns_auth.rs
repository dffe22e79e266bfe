//! Wire authentication across hosts (`[cluster] auth`): two network
//! namespaces joined by a veth pair (198.18.40.0/24), one `emp-nicd` in
//! each. Across hosts a source address proves nothing: a frame forged in
//! namespace a with node 0's own source MAC (packet wire) or IP and port
//! (udp wire, a hand-built IPv4/UDP datagram through AF_PACKET) is accepted
//! by node 1 without authentication, and dropped as `bad_tag` with it; a
//! genuine frame captured on the link and sent again is dropped as
//! `replayed`; tap-p2p passes with authentication on, and while the key is
//! rotated under it; a daemon with another key talks to nobody. Needs
//! CAP_NET_ADMIN and the release binaries (`make build`); without the
//! capability it says "skipped: …".

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use emp_tests::harness::{assert_tap, bin_dir, emp, image, root};
use emp_tests::veth::{ack, has_cap_net_admin, in_netns, mac_str, Bed, Daemons};

const MAC: [[u8; 6]; 2] = [[2, 0, 0xc6, 0x12, 40, 1], [2, 0, 0xc6, 0x12, 40, 2]];
const IP: [[u8; 4]; 2] = [[198, 18, 40, 1], [198, 18, 40, 2]];
const PORT: [u16; 2] = [47400, 47401];
const ETHERTYPE_EMP: u16 = 0x88B5;
/// Key id, counter and tag.
const TRAILER: usize = 28;

/// This file's bed: namespaces `au-…`, [`IP`] and [`MAC`].
fn bed(tag: &str) -> Bed {
    Bed::up("au", tag, &MAC, &IP)
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The cluster file: `auth` "off" or a mode with `key`.
fn cluster_file(dir: &Path, name: &str, wire: &str, bed: &Bed, auth: &str, key: &Path) -> PathBuf {
    let mut t = format!("[cluster]\nwire = \"{wire}\"\nmtu = 1500\n");
    if auth != "off" {
        t += &format!("auth = \"{auth}\"\nauth_key = \"{}\"\n", key.display());
    }
    for h in ["a", "b"] {
        t += &format!("[[host]]\nname = \"{h}\"\ndir = \"{}\"\n", dir.join(h).display());
    }
    for (id, host) in [(0usize, "a"), (1, "b")] {
        let ip = IP[id];
        t += &format!(
            "[[node]]\nid = {id}\nhost = \"{host}\"\ninterface = \"{}\"\nmac = \"{}\"\nudp = \"{}.{}.{}.{}:{}\"\n",
            bed.ifs[id],
            mac_str(&MAC[id]),
            ip[0],
            ip[1],
            ip[2],
            ip[3],
            PORT[id]
        );
    }
    let p = dir.join(name);
    std::fs::write(&p, t).expect("write cluster file");
    p
}

fn keygen(path: &Path, next: bool) {
    keygen_with(path, if next { &["--next"] } else { &[] });
}

fn keygen_with(path: &Path, args: &[&str]) {
    let mut c = emp();
    c.args(["wire", "keygen", "--out"]).arg(path).args(args);
    let o = c.output().expect("emp wire keygen");
    assert!(o.status.success(), "keygen: {}", String::from_utf8_lossy(&o.stderr));
}

/// A packet socket on `ifn` (this thread's namespace) seeing every frame.
fn packet_socket(ifn: &str) -> (i32, libc::sockaddr_ll) {
    let all = (libc::ETH_P_ALL as u16).to_be() as i32;
    // SAFETY: plain socket(2); checked.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, all) };
    assert!(fd >= 0, "packet socket: {}", std::io::Error::last_os_error());
    let name = std::ffi::CString::new(ifn).expect("name");
    // SAFETY: NUL-terminated name.
    let idx = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert!(idx > 0);
    // SAFETY: sockaddr_ll is plain old data.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = all as u16;
    sll.sll_ifindex = idx as i32;
    sll.sll_halen = 6;
    // SAFETY: binding to a live sockaddr_ll of its size.
    let r = unsafe {
        libc::bind(fd, (&sll as *const libc::sockaddr_ll).cast(), std::mem::size_of::<libc::sockaddr_ll>() as u32)
    };
    assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
    (fd, sll)
}

/// Raw Ethernet frames out of `ifn`, any source address.
fn send_raw(ifn: &str, frames: &[Vec<u8>]) {
    let (fd, sll) = packet_socket(ifn);
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

/// An Ethernet frame carrying an IPv4/UDP datagram from node 0's address
/// and port to node 1's: what only node 0's socket should be able to send.
fn spoofed_udp(payload: &[u8]) -> Vec<u8> {
    let udp_len = 8 + payload.len();
    let total = 20 + udp_len;
    let mut ip = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip.extend_from_slice(&IP[0]);
    ip.extend_from_slice(&IP[1]);
    let sum = ip.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum::<u32>();
    let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let mut udp = Vec::new();
    udp.extend_from_slice(&PORT[0].to_be_bytes());
    udp.extend_from_slice(&PORT[1].to_be_bytes());
    udp.extend_from_slice(&(udp_len as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]); // no checksum (allowed on IPv4)
    udp.extend_from_slice(payload);
    eth(MAC[1], MAC[0], 0x0800, &[ip, udp].concat())
}

/// The forger's best: an ACK claiming node 0, from node 0's own address,
/// with (auth on) a trailer of the right size and key id but no key.
fn forgeries(wire: &str, trailer: bool, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut f = ack(0, 1);
            if trailer {
                let mut t = [0u8; TRAILER];
                t[..4].copy_from_slice(&1u32.to_le_bytes());
                t[4..12].copy_from_slice(&(u64::MAX - i as u64).to_le_bytes());
                f.extend_from_slice(&t);
            }
            match wire {
                "packet" => eth(MAC[1], MAC[0], ETHERTYPE_EMP, &f),
                _ => spoofed_udp(&f),
            }
        })
        .collect()
}

/// The first frame from node 0 to node 1 the socket `fd` saw (EMP over
/// Ethernet, or over UDP to node 1's port), as it crossed the link.
fn captured(fd: i32, wire: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 10_000];
    loop {
        // SAFETY: reading into a live buffer of its length, without blocking.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n <= 0 {
            return None;
        }
        let f = &buf[..n as usize];
        if f.len() < 14 || f[6..12] != MAC[0] {
            continue;
        }
        let ty = u16::from_be_bytes([f[12], f[13]]);
        let ours = match wire {
            "packet" => ty == ETHERTYPE_EMP,
            _ => ty == 0x0800 && f.len() > 42 && f[23] == 17 && f[36..38] == PORT[1].to_be_bytes(),
        };
        if ours {
            return Some(f.to_vec());
        }
    }
}

fn wait_for(p: &Path) {
    let t = Instant::now();
    while !p.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "{} did not appear", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(dir: &Path, bed: &Bed, cfgs: [&Path; 2]) -> Daemons {
    let nicd = bin_dir().join("emp-nicd");
    let mut daemons = Daemons(Vec::new());
    for (i, host) in ["a", "b"].iter().enumerate() {
        // A killed daemon leaves its socket: wait for the new one's.
        let _ = std::fs::remove_file(dir.join(host).join(format!("nic{i}.sock")));
        let log = std::fs::File::create(dir.join(format!("{host}.log"))).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", &bed.ns[i]])
            .arg(&nicd)
            .arg("--config")
            .arg(cfgs[i])
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
    daemons
}

fn spawn_tap(dir: &Path, bed: &Bed, rdv: &str, timeout_s: u32) -> Vec<Child> {
    std::fs::create_dir_all(dir.join(rdv)).expect("rdv");
    (0..2)
        .map(|r| {
            Command::new("ip")
                .args(["netns", "exec", &bed.ns[r], "timeout", &timeout_s.to_string()])
                .arg(env!("CARGO_BIN_EXE_tap-p2p"))
                .env("EMP_DEVICE", dir.join(["a", "b"][r]).join(format!("nic{r}.sock")))
                .env("EMP_RANK", r.to_string())
                .env("EMP_SIZE", "2")
                .env("EMP_RDV_DIR", dir.join(rdv))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("tap-p2p")
        })
        .collect()
}

fn wait_tap(ranks: Vec<Child>) -> Vec<Output> {
    ranks.into_iter().map(|c| c.wait_with_output().expect("wait")).collect()
}

fn stats(dir: &Path, node: usize) -> (emp::WireInfo, emp::WireAuth) {
    let s = dir.join(["a", "b"][node]).join(format!("nic{node}.sock"));
    let s = s.to_string_lossy();
    (emp::nic_wire_info(&s).expect("WIRE_INFO"), emp::nic_wire_auth(&s).expect("WIRE_AUTH"))
}

/// Waits until node 1's wire has seen `n` more frames than `base`.
fn settle(dir: &Path, seen: impl Fn(&emp::WireInfo, &emp::WireAuth) -> u64, n: u64) {
    let t = Instant::now();
    loop {
        let (w, a) = stats(dir, 1);
        if seen(&w, &a) >= n || t.elapsed() > Duration::from_secs(5) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("au-auth-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    Scratch(dir)
}

/// Without authentication, frames forged with node 0's source address are
/// taken as node 0's: the defect this feature closes.
fn forged_frames_are_believed_without_auth(wire: &str) {
    let s = scratch(&format!("off-{wire}"));
    let dir = &s.0;
    let bed = bed(&format!("o{}", &wire[..1]));
    let cfg = cluster_file(dir, "off.toml", wire, &bed, "off", Path::new(""));
    let _d = start(dir, &bed, [&cfg, &cfg]);
    in_netns(&bed.ns[0], || send_raw(&bed.ifs[0], &forgeries(wire, false, 5)));
    settle(dir, |w, _| w.counter("received").unwrap(), 5);
    let (w, a) = stats(dir, 1);
    assert_eq!(w.counter("received"), Some(5), "all 5 forged frames reached node 1's control program: {w:?}");
    assert_eq!(
        (w.counter("source_mismatch"), w.counter("unknown_source"), w.counter("malformed")),
        (Some(0), Some(0), Some(0)),
        "the source check believed them: {w:?}"
    );
    assert_eq!((a.mode, a.bad_tag), ("off", 0));
}

/// With authentication: forgeries are dropped as bad tags, a captured frame
/// replayed is dropped as a replay, and real traffic passes.
fn forged_and_replayed_frames_are_dropped_with_auth(wire: &str, mode: &str) {
    let s = scratch(&format!("{mode}-{wire}"));
    let dir = &s.0;
    let bed = bed(&format!("{}{}", &mode[..1], &wire[..1]));
    let key = dir.join("wire.key");
    keygen(&key, false);
    let cfg = cluster_file(dir, "auth.toml", wire, &bed, mode, &key);
    let _d = start(dir, &bed, [&cfg, &cfg]);
    in_netns(&bed.ns[0], || send_raw(&bed.ifs[0], &forgeries(wire, true, 5)));
    settle(dir, |_, a| a.bad_tag, 5);
    let (w, a) = stats(dir, 1);
    assert_eq!((a.mode, a.key_id, a.trailer), (mode, 1, TRAILER as u32));
    assert_eq!(a.bad_tag, 5, "every forgery dropped as a bad tag: {a:?}");
    assert_eq!(w.counter("received"), Some(0), "none reached the control program: {w:?}");
    assert_eq!(w.mtu, 1500 - TRAILER as u32, "the control program's MTU leaves room for the trailer");
    // Real traffic, captured on node 1's side of the link.
    let (cap, _) = in_netns(&bed.ns[1], || packet_socket(&bed.ifs[1]));
    let outs = wait_tap(spawn_tap(dir, &bed, "rdv", 120));
    let genuine = captured(cap, wire).expect("a frame from node 0 was captured");
    // SAFETY: our descriptor.
    unsafe { libc::close(cap) };
    assert_tap(&outs[0], 10);
    assert!(outs[1].status.success(), "rank 1: {}", String::from_utf8_lossy(&outs[1].stderr));
    let mut genuine = genuine;
    if wire == "udp" {
        // The veth left the UDP checksum to "hardware" (partial): a replay
        // without one (allowed on IPv4) carries the same datagram.
        genuine[40..42].copy_from_slice(&[0, 0]);
    }
    let (_, before) = stats(dir, 1);
    in_netns(&bed.ns[0], || send_raw(&bed.ifs[0], &[genuine.clone(), genuine.clone()]));
    settle(dir, |_, a| a.replayed, before.replayed + 2);
    let (w, a) = stats(dir, 1);
    assert_eq!(a.replayed, before.replayed + 2, "the captured frame, sent again, is a replay: {a:?}");
    assert_eq!((a.bad_tag, a.unknown_key), (5, 0), "{a:?}");
    let text = String::from_utf8_lossy(&emp().arg("info").arg("--config").arg(&cfg).output().expect("info").stdout)
        .into_owned();
    assert!(text.contains(&format!("auth={mode} key=1")) && text.contains("bad_tag=5"), "emp info: {text}");
    assert!(w.counter("received").unwrap() > 0);
}

#[test]
fn udp_forgery_from_node_0s_address_is_believed_without_auth() {
    if !has_cap_net_admin() {
        return println!("skipped: network namespaces need CAP_NET_ADMIN, which this process lacks");
    }
    forged_frames_are_believed_without_auth("udp");
}

#[test]
fn packet_forgery_with_node_0s_mac_is_believed_without_auth() {
    if !has_cap_net_admin() {
        return println!("skipped: network namespaces need CAP_NET_ADMIN, which this process lacks");
    }
    forged_frames_are_believed_without_auth("packet");
}

#[test]
fn udp_mac_drops_forgeries_and_replays() {
    if !has_cap_net_admin() {
        return println!("skipped: network namespaces need CAP_NET_ADMIN, which this process lacks");
    }
    forged_and_replayed_frames_are_dropped_with_auth("udp", "mac");
}

#[test]
fn packet_mac_drops_forgeries_and_replays() {
    if !has_cap_net_admin() {
        return println!("skipped: network namespaces need CAP_NET_ADMIN, which this process lacks");
    }
    forged_and_replayed_frames_are_dropped_with_auth("packet", "mac");
}

#[test]
fn packet_aead_drops_forgeries_and_replays() {
    if !has_cap_net_admin() {
        return println!("skipped: network namespaces need CAP_NET_ADMIN, which this process lacks");
    }
    forged_and_replayed_frames_are_dropped_with_auth("packet", "aead");
}

/// The key rotated while tap-p2p runs: nothing lost, both daemons end on
/// the new key; then a daemon with another key talks to nobody.
#[test]
fn udp_rotation_mid_traffic_loses_nothing_and_a_wrong_key_talks_to_nobody() {
    if !has_cap_net_admin() {
        return println!("skipped: network namespaces need CAP_NET_ADMIN, which this process lacks");
    }
    let s = scratch("rotate");
    let dir = &s.0;
    let bed = bed("r");
    let key = dir.join("wire.key");
    keygen(&key, false);
    let cfg = cluster_file(dir, "auth.toml", "udp", &bed, "mac", &key);
    let mut d = start(dir, &bed, [&cfg, &cfg]);
    let ranks = spawn_tap(dir, &bed, "rdv", 120);
    std::thread::sleep(Duration::from_millis(300));
    keygen(&key, true);
    let rekey = emp().args(["wire", "rekey", "--config"]).arg(&cfg).output().expect("emp wire rekey");
    let outs = wait_tap(ranks);
    let said = String::from_utf8_lossy(&rekey.stdout).into_owned();
    assert!(rekey.status.success(), "rekey: {said}{}", String::from_utf8_lossy(&rekey.stderr));
    assert!(said.contains("host a: switch: mac sending with key 2, key 1 still accepted"), "{said}");
    assert_tap(&outs[0], 10);
    assert!(outs[1].status.success(), "rank 1: {}", String::from_utf8_lossy(&outs[1].stderr));
    for node in 0..2 {
        let (w, a) = stats(dir, node);
        assert_eq!((a.key_id, a.previous_key_id), (2, 1), "node {node}: {a:?}");
        assert_eq!((a.bad_tag, a.unknown_key, a.replayed), (0, 0, 0), "node {node}: nothing refused: {a:?}");
        assert!(w.counter("received").unwrap() > 0);
    }
    // After the rotation, traffic under key 2 alone.
    let outs = wait_tap(spawn_tap(dir, &bed, "rdv2", 120));
    assert_tap(&outs[0], 10);
    drop(std::mem::replace(&mut d, Daemons(Vec::new())));

    // Host b with a key of its own: every frame either way is a bad tag.
    let other = dir.join("other.key");
    keygen_with(&other, &["--id", "2"]); // a's id, another key
    let cfg_b = cluster_file(dir, "other.toml", "udp", &bed, "mac", &other);
    let _d = start(dir, &bed, [&cfg, &cfg_b]);
    let outs = wait_tap(spawn_tap(dir, &bed, "rdv3", 8));
    assert!(!outs[0].status.success(), "rank 0 reached a NIC with another key");
    let (w1, a1) = stats(dir, 1);
    assert!(a1.bad_tag > 0, "rank 0's frames dropped as bad tags: {a1:?}");
    assert_eq!(w1.counter("received"), Some(0), "nothing reached node 1's control program: {w1:?}");
}
