//! The `packet` wire: raw Ethernet frames (ethertype 0x88B5, the EMP frame
//! as payload) on each local NIC's interface through an AF_PACKET socket,
//! addressed by the route table's MACs. Receive and transmit are batched
//! (`recvmmsg`; `sendmmsg` once per engine pass). Frames are accepted only
//! from the MAC the route table gives the node their header claims, and,
//! with authentication on, only once their trailer checks out (`auth.rs`).
//! Needs CAP_NET_RAW (and nothing else).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use emp_uapi::ETHERTYPE_EMP;

use super::auth::{Auth, TRAILER};
use super::batch::{RecvBatch, SendBatch, BATCH};
use super::{
    check_source, claimed_source_of, inject, open_frame, DelayLine, Faults, Prng, Refused, Wire, WireCounters,
};
use crate::route::{if_index, RouteTable};

/// Ethernet header: destination, source, ethertype.
pub const ETH_HEADER: usize = 14;

/// What the link looks like now (`emp info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkState {
    /// Interface name.
    pub interface: String,
    /// Administratively up and carrier present.
    pub up: bool,
    /// The interface's MTU.
    pub mtu: u32,
    /// The interface's hardware address.
    pub mac: [u8; 6],
}

/// An ifreq as the SIOCGIF* ioctls use it: the name, then a union whose
/// first bytes hold an int (MTU), a short (flags) or a sockaddr (hwaddr).
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

fn if_ioctl(fd: RawFd, name: &str, req: libc::c_ulong) -> std::io::Result<[u8; 24]> {
    let mut r = IfReq { name: [0; libc::IFNAMSIZ], data: [0; 24] };
    if name.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::other(format!("interface name {name:?} is too long")));
    }
    r.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `r` is a writable ifreq-sized buffer for the duration of the call.
    if unsafe { libc::ioctl(fd, req as _, &mut r) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r.data)
}

/// The state of interface `name`, asked through socket `fd`.
pub fn link_state(fd: RawFd, name: &str) -> std::io::Result<LinkState> {
    let mtu = i32::from_ne_bytes(if_ioctl(fd, name, libc::SIOCGIFMTU)?[..4].try_into().expect("4 bytes"));
    let flags = i16::from_ne_bytes(if_ioctl(fd, name, libc::SIOCGIFFLAGS)?[..2].try_into().expect("2 bytes")) as i32;
    let hw = if_ioctl(fd, name, libc::SIOCGIFHWADDR)?;
    let mut mac = [0; 6];
    mac.copy_from_slice(&hw[2..8]);
    Ok(LinkState {
        interface: name.into(),
        up: flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0,
        mtu: mtu.max(0) as u32,
        mac,
    })
}

/// What is wrong with a received Ethernet frame, or its EMP payload and
/// the node it came from. `me` is the receiving node's MAC; frames to
/// another unicast address (a shared segment floods them) are `Ok(None)`:
/// not ours, not an error. `sealed`: the wire authenticates (only the
/// header is checked here; the trailer is checked by `auth.rs`).
pub fn check_frame(
    eth: &[u8],
    me: &[u8; 6],
    groups: &[[u8; 6]],
    routes: &RouteTable,
    sealed: bool,
) -> Result<Option<(u16, std::ops::Range<usize>)>, Refused> {
    if eth.len() < ETH_HEADER {
        return Err(Refused::Malformed);
    }
    let dst: [u8; 6] = eth[..6].try_into().expect("6 bytes");
    let src: [u8; 6] = eth[6..12].try_into().expect("6 bytes");
    if u16::from_be_bytes([eth[12], eth[13]]) != ETHERTYPE_EMP {
        return Err(Refused::ForeignEthertype);
    }
    if dst != *me && dst != [0xff; 6] && !groups.contains(&dst) {
        return Ok(None);
    }
    let claimed = claimed_source_of(&eth[ETH_HEADER..], sealed)?;
    let node = check_source(claimed, routes.node_of_mac(&src), routes.len())?;
    Ok(Some((node, ETH_HEADER..eth.len())))
}

/// One local NIC's socket.
struct Port {
    sock: OwnedFd,
    interface: String,
    /// The interface's index, resolved when the socket was opened (in the
    /// socket's network namespace).
    ifindex: i32,
    mac: [u8; 6],
    /// Multicast MACs joined.
    groups: Vec<[u8; 6]>,
    tx: Box<SendBatch>,
    /// The rings (None, or without one of them: the kernel refused them;
    /// `recvmmsg` and `sendmmsg` instead).
    rings: Option<Rings>,
}

/// AF_PACKET sockets, one per local NIC.
pub struct PacketWire {
    ports: Vec<Port>,
    routes: RouteTable,
    faults: Faults,
    rng: Prng,
    stats: Arc<WireCounters>,
    rx: Box<RecvBatch>,
    /// Node id of each local NIC, by local index.
    local: Vec<u16>,
    /// Frames from one local NIC to another (or to itself): a link does not
    /// send a frame back out of the port it came in on, so they never
    /// leave the daemon, as a real NIC loops its own traffic back.
    looped: VecDeque<(usize, Vec<u8>)>,
    /// Frames waiting out `faults.link_delay_ns`: (local NIC, to MAC, frame).
    delayed: DelayLine<(usize, [u8; 6], Vec<u8>)>,
    /// Seals and opens every frame that leaves the daemon, when the cluster
    /// authenticates.
    auth: Option<Auth>,
}

/// Most frames in flight between local NICs: each NIC's send window is
/// bounded, so this only guards against a runaway sender.
const LOOPED_MAX: usize = 4096;

/// TPACKET_V2 rings shared with the kernel, in one mapping (the receive
/// ring first, then the transmit ring). Receive: the kernel copies each
/// frame into the next free slot and flips its status word to the user; the
/// wire copies it out and hands the slot back, so polling is a load, not a
/// system call. Transmit: the wire writes frames into free slots and marks
/// them for sending; one `send()` per engine pass sends them all, the kernel
/// building its packets from the ring's pages (a NIC's driver DMAs them from
/// there; a veth copies them when the packet crosses to its peer).
struct Rings {
    map: *mut u8,
    /// Bytes mapped.
    len: usize,
    rx: bool,
    tx: bool,
    /// The next receive slot the kernel fills.
    rx_head: usize,
    /// The next transmit slot the wire fills.
    tx_head: usize,
    /// Transmit slots filled since the last `send()`.
    tx_queued: usize,
}

/// Bytes per ring slot: the tpacket2 header, the sockaddr_ll, and a jumbo
/// frame (a longer one arrives marked TP_STATUS_COPY and is refused).
const RING_FRAME: usize = 16 << 10;
/// Slots per block (a block is what the kernel allocates contiguously).
const RING_BLOCK: usize = 4 * RING_FRAME;
/// Slots per ring: a few windows of jumbo frames (4 MiB per ring).
const RING_FRAMES: usize = 256;
/// `PACKET_VERSION` value of TPACKET_V2.
const TPACKET_V2: libc::c_int = 1;
/// The tpacket2 header's size, aligned: where a received frame's
/// sockaddr_ll and a sent frame's bytes start (the kernel's default for the
/// latter without PACKET_TX_HAS_OFF).
const HDR_ALIGNED: usize = std::mem::size_of::<libc::tpacket2_hdr>().next_multiple_of(16);

// SAFETY: the mapping belongs to the rings alone and is only touched
// through them (slots the kernel handed over, and the atomic status words).
unsafe impl Send for Rings {}

impl Rings {
    /// Sets up and maps the rings of packet socket `fd` (before it is bound,
    /// so no frame lands in its ordinary queue first).
    fn new(fd: RawFd, rx: bool, tx: bool) -> std::io::Result<Rings> {
        let set = |opt: libc::c_int, v: *const libc::c_void, len: usize| {
            // SAFETY: `v` points at a live option value of `len` bytes.
            if unsafe { libc::setsockopt(fd, libc::SOL_PACKET, opt, v, len as libc::socklen_t) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        let int = std::mem::size_of::<libc::c_int>();
        let version = TPACKET_V2;
        set(libc::PACKET_VERSION, (&version as *const libc::c_int).cast(), int)?;
        let req = libc::tpacket_req {
            tp_block_size: RING_BLOCK as u32,
            tp_block_nr: (RING_FRAMES * RING_FRAME / RING_BLOCK) as u32,
            tp_frame_size: RING_FRAME as u32,
            tp_frame_nr: RING_FRAMES as u32,
        };
        let req_len = std::mem::size_of::<libc::tpacket_req>();
        if tx {
            // A malformed slot is skipped rather than stopping the ring
            // (set before any ring exists, or the kernel refuses it).
            let one: libc::c_int = 1;
            set(libc::PACKET_LOSS, (&one as *const libc::c_int).cast(), int)?;
        }
        if rx {
            set(libc::PACKET_RX_RING, (&req as *const libc::tpacket_req).cast(), req_len)?;
        }
        if tx {
            set(libc::PACKET_TX_RING, (&req as *const libc::tpacket_req).cast(), req_len)?;
        }
        let len = RING_FRAMES * RING_FRAME * (rx as usize + tx as usize);
        // SAFETY: mapping the rings just configured on `fd`, shared with the kernel.
        let map = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if map == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Rings { map: map.cast(), len, rx, tx, rx_head: 0, tx_head: 0, tx_queued: 0 })
    }

    /// Slot `i` of the receive ring, or of the transmit ring.
    fn slot(&self, tx: bool, i: usize) -> *mut u8 {
        let ring = if tx && self.rx { RING_FRAMES } else { 0 };
        // SAFETY: slot `i` < RING_FRAMES of a mapped ring lies inside the mapping.
        unsafe { self.map.add((ring + i) * RING_FRAME) }
    }

    /// The status word of a slot, shared with the kernel.
    fn status(&self, tx: bool, i: usize) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: a slot starts 16-byte aligned with the u32 tp_status
        // first; the kernel and we access it atomically.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(self.slot(tx, i).cast()) }
    }

    /// The frame in the head receive slot, if the kernel has filled it:
    /// whether it was truncated (TP_STATUS_COPY), its packet type, its bytes.
    fn rx_peek(&self) -> Option<(bool, u8, &[u8])> {
        // Acquire: the frame's bytes are visible once the status says so.
        let st = self.status(false, self.rx_head).load(std::sync::atomic::Ordering::Acquire);
        if st & libc::TP_STATUS_USER == 0 {
            return None;
        }
        // SAFETY: the kernel handed this slot over: it holds a tpacket2_hdr,
        // then (aligned) a sockaddr_ll, and the frame at tp_mac, all inside
        // the slot; it writes none of them again until we release it.
        unsafe {
            let slot = self.slot(false, self.rx_head);
            let hdr = &*slot.cast::<libc::tpacket2_hdr>();
            let sll = &*slot.add(HDR_ALIGNED).cast::<libc::sockaddr_ll>();
            let (at, n) = (hdr.tp_mac as usize, hdr.tp_snaplen as usize);
            if at + n > RING_FRAME {
                return Some((true, sll.sll_pkttype, &[]));
            }
            Some((st & libc::TP_STATUS_COPY != 0, sll.sll_pkttype, std::slice::from_raw_parts(slot.add(at), n)))
        }
    }

    /// Gives the head receive slot back to the kernel and moves on.
    fn rx_release(&mut self) {
        // Release: we are done reading the slot before the kernel reuses it.
        self.status(false, self.rx_head).store(libc::TP_STATUS_KERNEL, std::sync::atomic::Ordering::Release);
        self.rx_head = (self.rx_head + 1) % RING_FRAMES;
    }

    /// Room for a frame in the head transmit slot (the kernel has sent
    /// what it held before)?
    fn tx_free(&self) -> bool {
        self.status(true, self.tx_head).load(std::sync::atomic::Ordering::Acquire) == libc::TP_STATUS_AVAILABLE
    }

    /// Fills the head transmit slot (which must be free) with a frame of
    /// `len` bytes written by `fill`, and marks it for sending.
    fn tx_push(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) {
        debug_assert!(self.tx_free() && HDR_ALIGNED + len <= RING_FRAME);
        let slot = self.slot(true, self.tx_head);
        // SAFETY: the slot is ours (status AVAILABLE): the frame area after
        // the header, `len` ≤ RING_FRAME - HDR_ALIGNED bytes, then the header.
        unsafe {
            fill(std::slice::from_raw_parts_mut(slot.add(HDR_ALIGNED), len));
            let hdr = &mut *slot.cast::<libc::tpacket2_hdr>();
            hdr.tp_len = len as u32;
            hdr.tp_snaplen = len as u32;
        }
        // Release: the frame is written before the kernel may read it.
        self.status(true, self.tx_head).store(libc::TP_STATUS_SEND_REQUEST, std::sync::atomic::Ordering::Release);
        self.tx_head = (self.tx_head + 1) % RING_FRAMES;
        self.tx_queued += 1;
    }

    /// Asks the kernel to send every marked slot (without waiting for it).
    fn tx_kick(&mut self, fd: RawFd) -> std::io::Result<()> {
        if self.tx_queued == 0 {
            return Ok(());
        }
        self.tx_queued = 0;
        // SAFETY: send(2) without a buffer: the frames are in the ring.
        if unsafe { libc::send(fd, std::ptr::null(), 0, libc::MSG_DONTWAIT) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Rings {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `new`, used by nothing after.
        unsafe { libc::munmap(self.map.cast(), self.len) };
    }
}

/// Drops one datagram from the socket's ordinary queue (where the kernel
/// puts the whole of a frame too long for a ring slot).
fn drop_queued(fd: RawFd) {
    let mut b = [0u8; 64];
    // SAFETY: reading at most 64 bytes into a live buffer, without blocking.
    unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT | libc::MSG_TRUNC) };
}

/// How a packet wire does its I/O.
#[derive(Clone, Copy, Debug)]
pub struct PacketOptions {
    /// Receive through a PACKET_RX_RING (else, or when the kernel refuses
    /// one, with `recvmmsg`).
    pub rx_ring: bool,
    /// Transmit through a PACKET_TX_RING (else, or when the kernel refuses
    /// one, with `sendmmsg`).
    pub tx_ring: bool,
}

impl Default for PacketOptions {
    fn default() -> Self {
        PacketOptions { rx_ring: true, tx_ring: true }
    }
}

fn open_packet_socket(interface: &str, opts: PacketOptions) -> Result<(OwnedFd, i32, Option<Rings>), String> {
    if !(opts.rx_ring || opts.tx_ring) {
        return open_packet_socket_with(interface, None);
    }
    match open_packet_socket_with(interface, Some(opts)) {
        Err(e) if e.starts_with("rings: ") => {
            // A half-configured socket may hold a ring nobody reads: start
            // over with a fresh one.
            tracing::warn!(interface, "{e}: recvmmsg and sendmmsg instead");
            open_packet_socket_with(interface, None)
        }
        r => r,
    }
}

fn open_packet_socket_with(
    interface: &str,
    rings: Option<PacketOptions>,
) -> Result<(OwnedFd, i32, Option<Rings>), String> {
    // Protocol 0: nothing is received until bind names the ethertype, after
    // the receive ring is in place.
    // SAFETY: plain socket(2); the result is checked.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => format!(
                "an AF_PACKET socket needs CAP_NET_RAW ({e}): run emp-nicd with that capability \
                 (`setcap cap_net_raw+ep emp-nicd`, or ambient CAP_NET_RAW; docs/cluster.md)"
            ),
            _ => format!("AF_PACKET socket: {e}"),
        });
    }
    // SAFETY: a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let ifindex = if_index(interface)? as i32;
    let rings = match rings {
        None => None,
        Some(o) => Some(Rings::new(fd, o.rx_ring, o.tx_ring).map_err(|e| format!("rings: {e}"))?),
    };
    // SAFETY: sockaddr_ll is plain old data.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETHERTYPE_EMP.to_be();
    sll.sll_ifindex = ifindex;
    // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
    let r = unsafe {
        libc::bind(
            fd,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(format!("bind to {interface}: {}", std::io::Error::last_os_error()));
    }
    // Our own transmissions are not for us (Linux ≥ 4.20; older kernels
    // show them as PACKET_OUTGOING, which the source check refuses anyway).
    let one: libc::c_int = 1;
    // SAFETY: an int option, passed by pointer with its size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            23, // PACKET_IGNORE_OUTGOING
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    // Room for a burst of jumbo frames in each direction (without rings).
    super::udp::socket_buffers(fd);
    Ok((sock, ifindex, rings))
}

fn membership(fd: RawFd, ifindex: i32, mac: &[u8; 6], kind: libc::c_int, add: bool) -> std::io::Result<()> {
    #[repr(C)]
    struct PacketMreq {
        ifindex: libc::c_int,
        kind: libc::c_ushort,
        alen: libc::c_ushort,
        address: [u8; 8],
    }
    let mut m = PacketMreq { ifindex, kind: kind as u16, alen: 6, address: [0; 8] };
    m.address[..6].copy_from_slice(mac);
    let opt = if add { 1 } else { 2 }; // PACKET_ADD_MEMBERSHIP, PACKET_DROP_MEMBERSHIP
                                       // SAFETY: a packet_mreq, passed by pointer with its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_PACKET,
            opt,
            (&m as *const PacketMreq).cast(),
            std::mem::size_of::<PacketMreq>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl PacketWire {
    /// One socket per local NIC: `locals[i]` = (interface, node id);
    /// `mtu` is the EMP frame size, which must fit the link's MTU.
    pub fn new(locals: &[(String, u16)], routes: RouteTable, mtu: u32, faults: Faults) -> Result<PacketWire, String> {
        Self::with_options(locals, routes, mtu, faults, PacketOptions::default())
    }

    /// As [`PacketWire::new`], with `opts`.
    pub fn with_options(
        locals: &[(String, u16)],
        routes: RouteTable,
        mtu: u32,
        faults: Faults,
        opts: PacketOptions,
    ) -> Result<PacketWire, String> {
        let mut ports = Vec::new();
        for (interface, node) in locals {
            let mac = routes
                .get(*node)
                .and_then(|r| r.mac)
                .ok_or_else(|| format!("node {node}: the packet wire needs its `mac`"))?;
            let (sock, ifindex, rings) =
                open_packet_socket(interface, opts).map_err(|e| format!("node {node}: {e}"))?;
            let link = link_state(sock.as_raw_fd(), interface).map_err(|e| format!("{interface}: {e}"))?;
            if mtu > link.mtu {
                return Err(format!(
                    "node {node}: MTU {mtu} is larger than {interface}'s MTU {} (set `mtu` ≤ {} in the cluster \
                     file, or raise the link's: `ip link set {interface} mtu {mtu}`)",
                    link.mtu, link.mtu
                ));
            }
            if link.mac != mac {
                // Frames to the node's MAC are not the interface's own:
                // receive them anyway.
                tracing::warn!(
                    node,
                    interface,
                    "node MAC differs from the interface's hardware address: listening promiscuously"
                );
                membership(sock.as_raw_fd(), ifindex, &mac, 1, true)
                    .map_err(|e| format!("{interface}: promisc: {e}"))?;
            }
            ports.push(Port {
                sock,
                interface: interface.clone(),
                ifindex,
                mac,
                groups: Vec::new(),
                tx: Box::new(SendBatch::new()),
                rings,
            });
        }
        Ok(PacketWire {
            ports,
            routes,
            rng: Prng(faults.seed | 1),
            faults,
            stats: Arc::default(),
            rx: Box::new(RecvBatch::new()),
            local: locals.iter().map(|&(_, node)| node).collect(),
            looped: VecDeque::new(),
            delayed: DelayLine::new(faults.link_delay_ns),
            auth: None,
        })
    }

    /// Seals every frame sent and opens every frame received with `auth`
    /// (frames without a valid trailer are dropped from now on; frames
    /// between this daemon's own NICs never leave it and are not sealed).
    pub fn authenticate(&mut self, auth: Auth) {
        self.auth = Some(auth);
    }

    /// Local NIC `i` receives frames sent to multicast MAC `group`.
    pub fn join(&mut self, i: usize, group: [u8; 6]) -> Result<(), String> {
        if group[0] & 1 == 0 {
            return Err(format!("{} is not a multicast address", fmt_mac(&group)));
        }
        let p = &mut self.ports[i];
        if p.groups.contains(&group) {
            return Ok(());
        }
        let ifindex = p.ifindex;
        membership(p.sock.as_raw_fd(), ifindex, &group, 0, true).map_err(|e| format!("join: {e}"))?;
        p.groups.push(group);
        Ok(())
    }

    /// Local NIC `i` stops receiving frames sent to `group`.
    pub fn leave(&mut self, i: usize, group: [u8; 6]) -> Result<(), String> {
        let p = &mut self.ports[i];
        let Some(at) = p.groups.iter().position(|g| *g == group) else { return Ok(()) };
        let ifindex = p.ifindex;
        membership(p.sock.as_raw_fd(), ifindex, &group, 0, false).map_err(|e| format!("leave: {e}"))?;
        p.groups.swap_remove(at);
        Ok(())
    }

    /// Local NIC `src` sends `frame` to Ethernet address `to` (a node's or a
    /// multicast group's); queued until [`Wire::flush`].
    pub fn send_to_mac(&mut self, src: usize, to: [u8; 6], frame: &[u8]) {
        let p = &mut self.ports[src];
        let me = p.mac;
        if self.auth.as_ref().is_some_and(|a| !a.sealable(src, frame)) {
            WireCounters::add(&self.stats.lost, 1);
            return;
        }
        let auth = &mut self.auth;
        let wire_len = ETH_HEADER + frame.len() + if auth.is_some() { TRAILER } else { 0 };
        // Built in the ring or batch slot itself, sealed there: no copy, no allocation.
        let mut fill = |b: &mut [u8]| {
            b[..6].copy_from_slice(&to);
            b[6..12].copy_from_slice(&me);
            b[12..14].copy_from_slice(&ETHERTYPE_EMP.to_be_bytes());
            b[ETH_HEADER..ETH_HEADER + frame.len()].copy_from_slice(frame);
            if let Some(a) = auth {
                let sealed = a.seal(src, &mut b[ETH_HEADER..], frame.len());
                debug_assert!(sealed.is_some(), "sealable, with room for the trailer");
            }
        };
        if let Some(ring) = p.rings.as_mut().filter(|r| r.tx) {
            if HDR_ALIGNED + wire_len > RING_FRAME {
                WireCounters::add(&self.stats.lost, 1);
                return;
            }
            // The ring is full of frames the kernel has not sent yet: send
            // them and give the link a moment rather than lose this one.
            let mut stalls = 0;
            while !ring.tx_free() && stalls < 64 {
                let _ = ring.tx_kick(p.sock.as_raw_fd());
                stalls += 1;
                std::thread::yield_now();
            }
            if !ring.tx_free() {
                WireCounters::add(&self.stats.lost, 1);
                return;
            }
            ring.tx_push(wire_len, fill);
            return;
        }
        if p.tx.full() {
            let lost = p.tx.flush(p.sock.as_raw_fd());
            WireCounters::add(&self.stats.lost, lost as u64);
        }
        if wire_len > super::batch::SLOT {
            WireCounters::add(&self.stats.lost, 1);
            return;
        }
        p.tx.push(|slot| {
            fill(&mut slot[..wire_len]);
            wire_len
        });
    }

    /// The link of local NIC `i` now.
    pub fn link(&self, i: usize) -> std::io::Result<LinkState> {
        let p = &self.ports[i];
        link_state(p.sock.as_raw_fd(), &p.interface)
    }

    /// Does local NIC `i` receive and transmit through rings (else
    /// `recvmmsg`, `sendmmsg`)?
    pub fn rings(&self, i: usize) -> (bool, bool) {
        self.ports[i].rings.as_ref().map_or((false, false), |r| (r.rx, r.tx))
    }

    /// Interface names, by local NIC.
    pub fn interfaces(&self) -> Vec<String> {
        self.ports.iter().map(|p| p.interface.clone()).collect()
    }
}

/// `aa:bb:…`
pub fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

impl PacketWire {
    /// One multicast transmission from local NIC `src`: one Ethernet frame
    /// to the address's group MAC ([`emp_uapi::wire::mcast_mac`]); the
    /// link delivers it to every interface that joined, and fault
    /// injection's loss applies per receiver ([`PacketWire::mcast_lost`]).
    fn send_mcast(&mut self, now: u64, src: usize, addr: u16, frame: Vec<u8>) {
        WireCounters::add(&self.stats.frames, 1);
        WireCounters::add(&self.stats.mcast_sent, 1);
        let to = emp_uapi::wire::mcast_mac(addr);
        if self.delayed.active() {
            let lost = self.delayed.push_copies(now, 1, frame, |f| (src, to, f));
            WireCounters::add(&self.stats.lost, lost);
            return;
        }
        self.send_to_mac(src, to, &frame);
    }

    /// Does fault injection lose this receiver's copy of multicast frame `f`?
    fn mcast_lost(rng: &mut Prng, faults: &Faults, stats: &WireCounters, f: &[u8]) -> bool {
        if !super::is_mcast_frame(f) {
            return false;
        }
        if rng.chance(faults.loss) {
            WireCounters::add(&stats.lost, 1);
            return true;
        }
        WireCounters::add(&stats.mcast_received, 1);
        false
    }
}

impl Wire for PacketWire {
    fn send(&mut self, now: u64, src: usize, dst: u16, frame: Vec<u8>) {
        if emp_uapi::wire::is_mcast(dst) {
            return self.send_mcast(now, src, dst, frame);
        }
        if let Some(i) = self.local.iter().position(|&n| n == dst) {
            WireCounters::add(&self.stats.frames, 1);
            if self.looped.len() >= LOOPED_MAX {
                WireCounters::add(&self.stats.lost, 1);
            } else {
                self.looped.push_back((i, frame));
            }
            return;
        }
        let Some(to) = self.routes.get(dst).and_then(|r| r.mac) else {
            WireCounters::add(&self.stats.frames, 1);
            WireCounters::add(&self.stats.lost, 1);
            return;
        };
        let (_, copies) = inject(&self.faults, &mut self.rng, &self.stats);
        if self.delayed.active() {
            let lost = self.delayed.push_copies(now, copies, frame, |f| (src, to, f));
            WireCounters::add(&self.stats.lost, lost);
            return;
        }
        for _ in 0..copies {
            self.send_to_mac(src, to, &frame);
        }
    }

    fn flush(&mut self, now: u64) {
        while let Some((src, to, frame)) = self.delayed.pop_due(now) {
            self.send_to_mac(src, to, &frame);
        }
        for p in &mut self.ports {
            if let Some(ring) = p.rings.as_mut().filter(|r| r.tx) {
                // A refused send (link down, no buffers) leaves the frames
                // marked: the next pass sends them, or they are lost when
                // the ring is still full by then.
                let _ = ring.tx_kick(p.sock.as_raw_fd());
                continue;
            }
            let lost = p.tx.flush(p.sock.as_raw_fd());
            WireCounters::add(&self.stats.lost, lost as u64);
        }
    }

    fn poll(&mut self, _now: u64, rx: &mut [VecDeque<Vec<u8>>]) -> usize {
        if let Some(a) = self.auth.as_mut() {
            a.refresh();
        }
        let sealed = self.auth.is_some();
        let mut n = 0;
        while let Some((i, f)) = self.looped.pop_front() {
            rx[i].push_back(f);
            n += 1;
        }
        for (local, (p, queue)) in self.ports.iter_mut().zip(rx.iter_mut()).enumerate() {
            if let Some(ring) = p.rings.as_mut().filter(|r| r.rx) {
                // Bounded: at most 4 batches' worth per socket per pass.
                for _ in 0..4 * BATCH {
                    let Some((truncated, pkttype, eth)) = ring.rx_peek() else { break };
                    if pkttype == libc::PACKET_OUTGOING {
                        // Our own frame, on kernels that show it.
                    } else if truncated {
                        self.stats.refused(Refused::Malformed);
                        drop_queued(p.sock.as_raw_fd());
                    } else {
                        let checked = check_frame(eth, &p.mac, &p.groups, &self.routes, sealed).and_then(|ours| {
                            let Some((from, range)) = ours else { return Ok(None) };
                            let mut f = eth[range].to_vec();
                            open_frame(self.auth.as_mut(), local, from, &mut f).map(|_| Some(f))
                        });
                        match checked {
                            Ok(Some(f)) if Self::mcast_lost(&mut self.rng, &self.faults, &self.stats, &f) => {}
                            Ok(Some(f)) => {
                                queue.push_back(f);
                                n += 1;
                            }
                            Ok(None) => {}
                            Err(why) => self.stats.refused(why),
                        }
                    }
                    ring.rx_release();
                }
                continue;
            }
            // Bounded: at most 4 batches per socket per pass.
            for _ in 0..4 {
                let got = self.rx.recv(p.sock.as_raw_fd());
                for k in 0..got {
                    // SAFETY: an AF_PACKET socket names its senders with sockaddr_ll, which fits the storage.
                    let sll =
                        unsafe { &*(self.rx.name(k) as *const libc::sockaddr_storage).cast::<libc::sockaddr_ll>() };
                    if sll.sll_pkttype == libc::PACKET_OUTGOING {
                        continue; // PACKET_OUTGOING: our own frame, on kernels that show it.
                    }
                    if self.rx.truncated(k) {
                        self.stats.refused(Refused::Malformed);
                        continue;
                    }
                    let eth = self.rx.data(k);
                    let checked = check_frame(eth, &p.mac, &p.groups, &self.routes, sealed).and_then(|ours| {
                        let Some((from, range)) = ours else { return Ok(None) };
                        let mut f = eth[range].to_vec();
                        open_frame(self.auth.as_mut(), local, from, &mut f).map(|_| Some(f))
                    });
                    match checked {
                        Ok(Some(f)) if Self::mcast_lost(&mut self.rng, &self.faults, &self.stats, &f) => {}
                        Ok(Some(f)) => {
                            queue.push_back(f);
                            n += 1;
                        }
                        Ok(None) => {}
                        Err(why) => self.stats.refused(why),
                    }
                }
                if got < BATCH {
                    break;
                }
            }
        }
        WireCounters::add(&self.stats.received, n as u64);
        n
    }

    fn next_due(&self) -> Option<u64> {
        if self.looped.is_empty() {
            self.delayed.next_due()
        } else {
            Some(0)
        }
    }

    fn fds(&self) -> Vec<RawFd> {
        self.ports.iter().map(|p| p.sock.as_raw_fd()).collect()
    }

    fn counters(&self) -> Arc<WireCounters> {
        self.stats.clone()
    }

    fn set_membership(&mut self, local: usize, addr: u16, join: bool) -> Result<(), String> {
        if !emp_uapi::wire::is_mcast(addr) {
            return Err(format!("{addr:#x} is not a multicast address"));
        }
        if local >= self.ports.len() {
            return Err(format!("no local NIC {local}"));
        }
        let mac = emp_uapi::wire::mcast_mac(addr);
        if join {
            if self.ports[local].groups.len() >= super::MCAST_JOINED_MAX {
                return Err(format!(
                    "local NIC {local} already joined {} multicast addresses",
                    super::MCAST_JOINED_MAX
                ));
            }
            self.join(local, mac)
        } else {
            self.leave(local, mac)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::ack_frame;
    use super::*;
    use crate::route::Route;

    const A: [u8; 6] = [2, 0, 0xc6, 0x12, 0, 1];
    const B: [u8; 6] = [2, 0, 0xc6, 0x12, 0, 2];
    const GROUP: [u8; 6] = [0x01, 0, 0x5e, 0x12, 0, 1];

    fn table() -> RouteTable {
        RouteTable::new(vec![Route { udp: None, mac: Some(A) }, Route { udp: None, mac: Some(B) }])
    }

    fn eth(dst: [u8; 6], src: [u8; 6], ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&dst);
        f.extend_from_slice(&src);
        f.extend_from_slice(&ty.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn frame_checks() {
        let t = table();
        let good = eth(B, A, ETHERTYPE_EMP, &ack_frame(0, 1));
        let (node, range) = check_frame(&good, &B, &[], &t, false).unwrap().unwrap();
        assert_eq!(node, 0);
        assert_eq!(&good[range], &ack_frame(0, 1)[..]);
        assert_eq!(check_frame(&good[..13], &B, &[], &t, false), Err(Refused::Malformed));
        assert_eq!(check_frame(&good[..30], &B, &[], &t, false), Err(Refused::Malformed));
        assert_eq!(
            check_frame(&eth(B, A, 0x0800, &ack_frame(0, 1)), &B, &[], &t, false),
            Err(Refused::ForeignEthertype)
        );
        let stranger = [2, 0, 0xc6, 0x12, 0, 9];
        assert_eq!(
            check_frame(&eth(B, stranger, ETHERTYPE_EMP, &ack_frame(0, 1)), &B, &[], &t, false),
            Err(Refused::UnknownSource)
        );
        assert_eq!(
            check_frame(&eth(B, A, ETHERTYPE_EMP, &ack_frame(1, 1)), &B, &[], &t, false),
            Err(Refused::SourceMismatch),
            "A's MAC claiming node 1"
        );
        assert_eq!(
            check_frame(&eth(B, A, ETHERTYPE_EMP, &ack_frame(5, 1)), &B, &[], &t, false),
            Err(Refused::UnknownSource),
            "node 5 is in no route"
        );
        assert_eq!(check_frame(&good, &A, &[], &t, false), Ok(None), "another node's unicast is not ours");
        let to_group = eth(GROUP, A, ETHERTYPE_EMP, &ack_frame(0, 1));
        assert_eq!(check_frame(&to_group, &B, &[], &t, false), Ok(None), "a group not joined");
        assert!(check_frame(&to_group, &B, &[GROUP], &t, false).unwrap().is_some(), "a joined group");
    }

    #[test]
    fn loopback_link_state_is_readable() {
        // SAFETY: plain socket(2); closed below by OwnedFd.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        assert!(fd >= 0);
        // SAFETY: fresh descriptor.
        let s = unsafe { OwnedFd::from_raw_fd(fd) };
        let l = link_state(s.as_raw_fd(), "lo").unwrap();
        assert!(l.up && l.mtu >= 1500, "{l:?}");
        assert!(link_state(s.as_raw_fd(), "ew-none").is_err());
    }
}
