//! The `udp` wire: one UDP socket per local NIC, bound to its node's
//! address (IPv4 or IPv6; a link-local IPv6 address scoped to the node's
//! interface), peers from the route table. A datagram is accepted only from
//! the address the route table gives the node its header claims, and, with
//! authentication on, only once its trailer checks out (`auth.rs`).

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::Arc;

use super::auth::Auth;
use super::batch::{RecvBatch, SendBatch, SLOT};
use super::{
    check_source, claimed_source_of, inject, open_frame, DelayLine, Faults, Memberships, Prng, Refused, Wire,
    WireCounters,
};
use crate::dma::HostPayload;
use crate::route::RouteTable;

/// One UDP socket per local NIC.
pub struct UdpWire {
    socks: Vec<UdpSocket>,
    /// Per local NIC: each node's address as that NIC's socket reaches it
    /// (link-local peers take the local interface's scope).
    dests: Vec<Vec<Option<SocketAddr>>>,
    routes: RouteTable,
    faults: Faults,
    rng: Prng,
    stats: Arc<WireCounters>,
    batch: Box<RecvBatch>,
    /// Frames waiting out `faults.link_delay_ns`: (local NIC, to, frame).
    delayed: DelayLine<(usize, SocketAddr, Vec<u8>)>,
    /// Per local NIC: datagrams queued for one `sendmmsg` per engine pass.
    tx: Vec<SendBatch>,
    /// Seals and opens every frame, when the cluster authenticates.
    auth: Option<Auth>,
    /// Buffers of sent frames, which received frames are copied into: no
    /// allocation per frame (bounded by [`SPARE_MAX`]).
    spare: Vec<Vec<u8>>,
    /// Multicast, once enabled.
    mcast: Option<UdpMcast>,
}

/// Most spare frame buffers a [`UdpWire`] keeps (about 1.5 MB at MTU 1500).
const SPARE_MAX: usize = 1024;

impl UdpWire {
    /// Binds `binds[i]` (scoped) for local NIC i; `routes` gives every node's address.
    pub fn new(binds: &[SocketAddr], routes: RouteTable, faults: Faults) -> std::io::Result<UdpWire> {
        let socks = binds
            .iter()
            .map(|a| {
                let s = UdpSocket::bind(a).map_err(|e| std::io::Error::new(e.kind(), format!("bind {a}: {e}")))?;
                s.set_nonblocking(true)?;
                socket_buffers(s.as_raw_fd());
                Ok(s)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let dests = binds
            .iter()
            .map(|b| {
                let scope = match b {
                    SocketAddr::V6(v6) => v6.scope_id(),
                    SocketAddr::V4(_) => 0,
                };
                routes
                    .iter()
                    .map(|(_, r)| {
                        r.udp.map(|a| match a {
                            SocketAddr::V6(mut v6) if v6.ip().is_unicast_link_local() && v6.scope_id() == 0 => {
                                v6.set_scope_id(scope);
                                SocketAddr::V6(v6)
                            }
                            a => a,
                        })
                    })
                    .collect()
            })
            .collect();
        Ok(UdpWire {
            socks,
            dests,
            routes,
            rng: Prng(faults.seed | 1),
            delayed: DelayLine::new(faults.link_delay_ns),
            tx: binds.iter().map(|_| SendBatch::new()).collect(),
            faults,
            stats: Arc::default(),
            batch: Box::new(RecvBatch::new()),
            spare: Vec::new(),
            auth: None,
            mcast: None,
        })
    }

    /// Seals every frame sent and opens every frame received with `auth`
    /// (frames without a valid trailer are dropped from now on).
    pub fn authenticate(&mut self, auth: Auth) {
        self.auth = Some(auth);
    }

    /// Local NIC i's bound address.
    pub fn local_addr(&self, i: usize) -> std::io::Result<SocketAddr> {
        self.socks[i].local_addr()
    }
}

/// Bytes asked for each socket buffer: a window of jumbo frames in each
/// direction (the default, ~200 KiB, holds less than one: a burst beyond it
/// is dropped and costs a retransmission timeout). The kernel caps it at
/// net.core.rmem_max / wmem_max.
const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// Sizes `fd`'s receive and send buffers to [`SOCKET_BUFFER`].
pub(crate) fn socket_buffers(fd: RawFd) {
    for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        // SAFETY: an int option, passed by pointer with its size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&SOCKET_BUFFER as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
}

/// The socket address the kernel wrote into `s`.
pub(crate) fn sockaddr_to_std(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match s.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is large enough for.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6, which it is large enough for.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(a.sin6_port), a.sin6_flowinfo, a.sin6_scope_id)))
        }
        _ => None,
    }
}

impl UdpWire {
    /// Keeps a frame's buffer for a later received frame, up to [`SPARE_MAX`].
    fn keep(&mut self, frame: Vec<u8>) {
        if self.spare.len() < SPARE_MAX {
            self.spare.push(frame);
        }
    }

    /// Checks datagram `i` of the batch; the node it came from.
    fn accept(&self, i: usize) -> Result<u16, Refused> {
        if self.batch.truncated(i) {
            return Err(Refused::Malformed);
        }
        let claimed = claimed_source_of(self.batch.data(i), self.auth.is_some())?;
        let from = sockaddr_to_std(self.batch.name(i)).and_then(|a| self.routes.node_of_udp(&a));
        check_source(claimed, from, self.routes.len())
    }

    /// Makes room in local NIC `src`'s batch by sending it when full.
    fn make_room(&mut self, src: usize) {
        if self.tx[src].full() {
            let lost = self.tx[src].flush(self.socks[src].as_raw_fd());
            WireCounters::add(&self.stats.lost, lost as u64);
        }
    }

    /// Queues one datagram for this pass's `sendmmsg`; one the socket
    /// refuses (buffer full) is a lost frame (reliability recovers it).
    fn transmit(&mut self, src: usize, to: SocketAddr, frame: &[u8]) {
        if frame.len() > SLOT {
            WireCounters::add(&self.stats.lost, 1);
            return;
        }
        self.make_room(src);
        let auth = &mut self.auth;
        // Sealed in the send slot itself: no copy, no allocation.
        let queued = self.tx[src].push_to_with(&to, |slot| {
            slot[..frame.len()].copy_from_slice(frame);
            match auth {
                Some(a) => a.seal(src, slot, frame.len()),
                None => Some(frame.len()),
            }
        });
        if !queued {
            WireCounters::add(&self.stats.lost, 1);
        }
    }
}

impl Wire for UdpWire {
    /// Sent in place from host memory when nothing must hold or rewrite
    /// the frame after this call: no link delay, no authentication (its
    /// seal covers the whole frame), unicast. Loss and duplicates still apply.
    fn send_host(&mut self, now: u64, src: usize, dst: u16, frame: Vec<u8>, host: HostPayload) {
        let addr = self.dests[src].get(dst as usize).copied().flatten();
        let in_place = self.auth.is_none() && !self.delayed.active() && !emp_uapi::wire::is_mcast(dst);
        let (Some(addr), true, true) = (addr, in_place, frame.len() + host.len() <= SLOT) else {
            let mut frame = frame;
            host.append_to(&mut frame);
            return self.send(now, src, dst, frame);
        };
        let (_, copies) = inject(&self.faults, &mut self.rng, &self.stats);
        for _ in 0..copies {
            self.make_room(src);
            self.tx[src].push_host_to(&addr, &frame, host.clone());
            WireCounters::add(&self.stats.from_host, 1);
        }
        self.keep(frame);
    }

    fn send(&mut self, now: u64, src: usize, dst: u16, frame: Vec<u8>) {
        if emp_uapi::wire::is_mcast(dst) {
            return self.send_mcast(now, src, dst, frame);
        }
        let Some(addr) = self.dests[src].get(dst as usize).copied().flatten() else {
            WireCounters::add(&self.stats.frames, 1);
            WireCounters::add(&self.stats.lost, 1);
            return;
        };
        // Delays are not modelled on UDP: a delayed copy is sent at once
        // after the others, which still reorders it.
        let (_, copies) = inject(&self.faults, &mut self.rng, &self.stats);
        if self.delayed.active() {
            let lost = self.delayed.push_copies(now, copies, frame, |f| (src, addr, f));
            WireCounters::add(&self.stats.lost, lost);
            return;
        }
        for _ in 0..copies {
            self.transmit(src, addr, &frame);
        }
        self.keep(frame);
    }

    fn flush(&mut self, now: u64) {
        while let Some((src, to, frame)) = self.delayed.pop_due(now) {
            self.transmit(src, to, &frame);
            self.keep(frame);
        }
        for (batch, sock) in self.tx.iter_mut().zip(&self.socks) {
            let lost = batch.flush(sock.as_raw_fd());
            WireCounters::add(&self.stats.lost, lost as u64);
        }
    }

    fn poll(&mut self, _now: u64, rx: &mut [VecDeque<Vec<u8>>]) -> usize {
        if let Some(a) = self.auth.as_mut() {
            a.refresh();
        }
        let mut n = 0;
        let mut mcast = 0;
        for (i, queue) in rx.iter_mut().enumerate().take(self.socks.len()) {
            // Bounded: at most 4 batches per socket per pass.
            for _ in 0..4 {
                let got = self.batch.recv(self.socks[i].as_raw_fd());
                for k in 0..got {
                    let from = match self.accept(k) {
                        Ok(from) => from,
                        Err(why) => {
                            self.stats.refused(why);
                            continue;
                        }
                    };
                    if !self.mcast_keeps(i, from, self.batch.data(k)) {
                        continue; // Replicated multicast for a group not joined.
                    }
                    let mut f = self.spare.pop().unwrap_or_default();
                    f.clear();
                    f.extend_from_slice(self.batch.data(k));
                    match open_frame(self.auth.as_mut(), i, from, &mut f) {
                        Ok(()) => {
                            mcast += super::is_mcast_frame(&f) as u64;
                            queue.push_back(f);
                            n += 1;
                        }
                        Err(why) => {
                            self.stats.refused(why);
                            self.keep(f);
                        }
                    }
                }
                if got < super::batch::BATCH {
                    break;
                }
            }
            let m = self.poll_mcast(i, queue);
            mcast += m as u64;
            n += m;
        }
        WireCounters::add(&self.stats.received, n as u64);
        WireCounters::add(&self.stats.mcast_received, mcast);
        n
    }

    fn set_membership(&mut self, local: usize, addr: u16, join: bool) -> Result<(), String> {
        let m = self.mcast.as_mut().ok_or("udp wire: multicast is not enabled")?;
        if !m.groups.set(local, addr, join)? {
            return Ok(());
        }
        if let (Some(sock), UdpMcastMode::Ip { .. }) = (m.socks.get(local), &m.mode) {
            let bind = m.binds[local];
            let group = mcast_ip(addr, bind.is_ipv4());
            if let Err(e) = ip_membership(sock, &bind, group, join) {
                let _ = m.groups.set(local, addr, !join);
                return Err(format!("{bind}: {} {group}: {e}", if join { "join" } else { "leave" }));
            }
        }
        Ok(())
    }

    fn next_due(&self) -> Option<u64> {
        self.delayed.next_due()
    }

    fn fds(&self) -> Vec<RawFd> {
        let mcast = self.mcast.iter().flat_map(|m| &m.socks);
        self.socks.iter().chain(mcast).map(|s| s.as_raw_fd()).collect()
    }

    fn counters(&self) -> Arc<WireCounters> {
        self.stats.clone()
    }
}

/// `IPV6_MULTICAST_ALL` (Linux ≥ 4.20), not in every libc.
const IPV6_MULTICAST_ALL: libc::c_int = 29;

/// The IP group of multicast address `addr`: IPv4 `239.254.hi.lo`
/// (administratively scoped), IPv6 `ff12::454d:50:hilo` (transient,
/// link-local scope); `hi:lo` the group index. Sent with TTL / hop limit 1,
/// so no router forwards them.
pub fn mcast_ip(addr: u16, v4: bool) -> IpAddr {
    let g = addr.wrapping_sub(emp_uapi::wire::MCAST_BASE);
    if v4 {
        Ipv4Addr::new(239, 254, (g >> 8) as u8, g as u8).into()
    } else {
        Ipv6Addr::new(0xff12, 0, 0, 0, 0, 0x454d, 0x50, g).into()
    }
}

/// How a UDP wire multicasts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UdpMcastMode {
    /// IP multicast to the group at this port.
    Ip {
        /// The port every node's multicast socket listens on.
        port: u16,
    },
    /// One unicast copy per node: the network refused multicast (the reason).
    Replicated(String),
}

/// IP multicast state of a UDP wire.
struct UdpMcast {
    /// Per local NIC: a socket on the multicast port, joined to its groups
    /// (none in replicated mode).
    socks: Vec<UdpSocket>,
    mode: UdpMcastMode,
    groups: Memberships,
    /// Node id of each local NIC (a NIC does not receive its own multicast).
    nodes: Vec<Option<u16>>,
    /// Each local NIC's bound address (its interface, its family).
    binds: Vec<SocketAddr>,
}

fn setsockopt_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> std::io::Result<()> {
    // SAFETY: an int option, passed by pointer with its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A UDP socket bound to the wildcard address at `port` that shares the
/// port with the daemon's other multicast sockets and receives only the
/// groups it joins itself.
fn mcast_socket(port: u16, v4: bool) -> std::io::Result<UdpSocket> {
    let family = if v4 { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns; the socket closes it.
    let sock = unsafe { UdpSocket::from_raw_fd(fd) };
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    if v4 {
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, 0)?;
    } else {
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
        // Older kernels lack it: then every group joined on the host arrives and the receiver filters.
        let _ = setsockopt_int(fd, libc::IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0);
    }
    let any: SocketAddr = if v4 { (Ipv4Addr::UNSPECIFIED, port).into() } else { (Ipv6Addr::UNSPECIFIED, port).into() };
    let (storage, len) = std_to_sockaddr(&any);
    // SAFETY: `storage` holds a sockaddr of `len` bytes for the family of the socket.
    if unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) } < 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(e.kind(), format!("bind {any}: {e}")));
    }
    socket_buffers(fd);
    Ok(sock)
}

/// `a` as a sockaddr for the kernel.
fn std_to_sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large enough for, and aligned for, a sockaddr_in.
            let sin = unsafe { &mut *(&mut s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large enough for, and aligned for, a sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (s, len as libc::socklen_t)
}

/// Makes unicast socket `sock` (bound to `bind`) send multicast out of its
/// own interface only: TTL / hop limit 1 (never routed), loopback on (other
/// NICs on this host are members too).
fn mcast_sender(sock: &UdpSocket, bind: &SocketAddr) -> std::io::Result<()> {
    let fd = sock.as_raw_fd();
    match bind {
        SocketAddr::V4(v4) => {
            let mreq = libc::ip_mreqn {
                imr_multiaddr: libc::in_addr { s_addr: 0 },
                imr_address: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
                imr_ifindex: 0,
            };
            // SAFETY: an ip_mreqn, passed by pointer with its size.
            let r = unsafe {
                libc::setsockopt(
                    fd,
                    libc::IPPROTO_IP,
                    libc::IP_MULTICAST_IF,
                    (&mreq as *const libc::ip_mreqn).cast(),
                    std::mem::size_of::<libc::ip_mreqn>() as libc::socklen_t,
                )
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            sock.set_multicast_ttl_v4(1)?;
            sock.set_multicast_loop_v4(true)
        }
        SocketAddr::V6(v6) => {
            if v6.scope_id() != 0 {
                setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_IF, v6.scope_id() as libc::c_int)?;
            }
            setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_HOPS, 1)?;
            sock.set_multicast_loop_v6(true)
        }
    }
}

/// Joins or leaves `group` on `sock` through the interface of `bind`.
fn ip_membership(sock: &UdpSocket, bind: &SocketAddr, group: IpAddr, join: bool) -> std::io::Result<()> {
    match (bind, group) {
        (SocketAddr::V4(b), IpAddr::V4(g)) if join => sock.join_multicast_v4(&g, b.ip()),
        (SocketAddr::V4(b), IpAddr::V4(g)) => sock.leave_multicast_v4(&g, b.ip()),
        (SocketAddr::V6(b), IpAddr::V6(g)) if join => sock.join_multicast_v6(&g, b.scope_id()),
        (SocketAddr::V6(b), IpAddr::V6(g)) => sock.leave_multicast_v6(&g, b.scope_id()),
        _ => Err(std::io::Error::other("multicast group and address differ in family")),
    }
}

impl UdpWire {
    /// Turns multicast on: every local NIC sends multicast from its own
    /// socket (TTL 1, loopback on) and receives its groups on a socket at
    /// the multicast port, one above the highest port in the route table
    /// (every node computes the same). Where the host refuses IP multicast
    /// (no multicast route, the port taken), multicast is replicated
    /// unicast instead: the returned mode says which, and why. Call before
    /// the engine asks for [`Wire::fds`].
    pub fn enable_multicast(&mut self) -> UdpMcastMode {
        let binds: Vec<SocketAddr> =
            self.socks.iter().map(|s| s.local_addr().unwrap_or_else(|_| (Ipv4Addr::UNSPECIFIED, 0).into())).collect();
        let nodes = binds.iter().map(|a| self.routes.node_of_udp(a)).collect();
        let mode = self.try_ip_multicast();
        let (socks, mode) = match mode {
            Ok(socks) => (socks, UdpMcastMode::Ip { port: self.mcast_port() }),
            Err(why) => {
                tracing::warn!("udp wire: no IP multicast ({why}): multicast is replicated unicast, one copy per node");
                (Vec::new(), UdpMcastMode::Replicated(why))
            }
        };
        let groups = Memberships::new(self.socks.len());
        self.mcast = Some(UdpMcast { socks, mode: mode.clone(), groups, nodes, binds });
        mode
    }

    /// The port multicast groups are sent to.
    fn mcast_port(&self) -> u16 {
        self.routes.iter().filter_map(|(_, r)| r.udp.map(|a| a.port())).max().unwrap_or(0).wrapping_add(1)
    }

    /// The multicast sockets, after checking the host can route one group.
    fn try_ip_multicast(&mut self) -> Result<Vec<UdpSocket>, String> {
        let port = self.mcast_port();
        if port == 0 {
            return Err("no multicast port: the route table has no UDP port below 65535".into());
        }
        let mut socks = Vec::new();
        for (i, s) in self.socks.iter().enumerate() {
            let bind = s.local_addr().map_err(|e| e.to_string())?;
            mcast_sender(s, &bind).map_err(|e| format!("{bind}: multicast sender: {e}"))?;
            let group = mcast_ip(emp_uapi::wire::MCAST_BASE, bind.is_ipv4());
            // A route lookup for a group through this interface, without sending anything.
            let probe = UdpSocket::bind(SocketAddr::new(bind.ip(), 0)).map_err(|e| format!("probe {bind}: {e}"))?;
            mcast_sender(&probe, &bind).map_err(|e| format!("{bind}: multicast sender: {e}"))?;
            probe.connect(SocketAddr::new(group, port)).map_err(|e| format!("{bind}: no route to {group}: {e}"))?;
            let m = mcast_socket(port, bind.is_ipv4()).map_err(|e| format!("multicast socket for NIC {i}: {e}"))?;
            ip_membership(&m, &bind, group, true).map_err(|e| format!("{bind}: join {group}: {e}"))?;
            ip_membership(&m, &bind, group, false).map_err(|e| format!("{bind}: leave {group}: {e}"))?;
            socks.push(m);
        }
        Ok(socks)
    }

    /// How this wire multicasts (`None`: not enabled).
    pub fn mcast_mode(&self) -> Option<&UdpMcastMode> {
        self.mcast.as_ref().map(|m| &m.mode)
    }

    /// One multicast transmission from local NIC `src` to `addr`.
    fn send_mcast(&mut self, now: u64, src: usize, addr: u16, frame: Vec<u8>) {
        let Some(m) = self.mcast.as_ref() else {
            WireCounters::add(&self.stats.frames, 1);
            WireCounters::add(&self.stats.lost, 1);
            return;
        };
        WireCounters::add(&self.stats.mcast_sent, 1);
        let to = match &m.mode {
            UdpMcastMode::Ip { port } => SocketAddr::new(mcast_ip(addr, m.binds[src].is_ipv4()), *port),
            UdpMcastMode::Replicated(_) => {
                // One copy to every other node; their wires keep it only for a member.
                WireCounters::add(&self.stats.mcast_fallback, 1);
                let me = m.nodes[src];
                for n in 0..self.dests[src].len() {
                    let Some(a) = self.dests[src][n] else { continue };
                    if Some(n as u16) != me {
                        self.send_to(now, src, a, frame.clone());
                    }
                }
                return;
            }
        };
        // One datagram; fault injection's loss applies per receiver (`poll_mcast`).
        WireCounters::add(&self.stats.frames, 1);
        if self.delayed.active() {
            let lost = self.delayed.push_copies(now, 1, frame, |f| (src, to, f));
            WireCounters::add(&self.stats.lost, lost);
            return;
        }
        self.transmit(src, to, &frame);
    }

    /// Multicast as one unicast copy per node from now on (what
    /// [`UdpWire::enable_multicast`] falls back to), saying why.
    pub fn enable_replicated_multicast(&mut self, why: &str) {
        let binds: Vec<SocketAddr> =
            self.socks.iter().map(|s| s.local_addr().unwrap_or_else(|_| (Ipv4Addr::UNSPECIFIED, 0).into())).collect();
        let nodes = binds.iter().map(|a| self.routes.node_of_udp(a)).collect();
        let groups = Memberships::new(self.socks.len());
        let mode = UdpMcastMode::Replicated(why.into());
        self.mcast = Some(UdpMcast { socks: Vec::new(), mode, groups, nodes, binds });
    }

    /// Sends one frame to `addr`, through fault injection and the link delay.
    fn send_to(&mut self, now: u64, src: usize, addr: SocketAddr, frame: Vec<u8>) {
        let (_, copies) = inject(&self.faults, &mut self.rng, &self.stats);
        if self.delayed.active() {
            let lost = self.delayed.push_copies(now, copies, frame, |f| (src, addr, f));
            WireCounters::add(&self.stats.lost, lost);
            return;
        }
        for _ in 0..copies {
            self.transmit(src, addr, &frame);
        }
    }

    /// Keeps a frame received by local NIC `local` when it is unicast, or
    /// multicast to an address the NIC joined and not its own.
    fn mcast_keeps(&self, local: usize, from: u16, frame: &[u8]) -> bool {
        let Some(dst) = super::frame_dst(frame).filter(|d| emp_uapi::wire::is_mcast(*d)) else { return true };
        self.mcast.as_ref().is_some_and(|m| m.groups.joined(local, dst) && m.nodes[local] != Some(from))
    }

    /// Receives what local NIC `i`'s multicast socket holds into `queue`.
    fn poll_mcast(&mut self, i: usize, queue: &mut VecDeque<Vec<u8>>) -> usize {
        let Some(fd) = self.mcast.as_ref().and_then(|m| m.socks.get(i)).map(|s| s.as_raw_fd()) else { return 0 };
        let mut n = 0;
        for _ in 0..4 {
            let got = self.batch.recv(fd);
            for k in 0..got {
                let checked = self.accept(k).and_then(|from| {
                    if !self.mcast_keeps(i, from, self.batch.data(k)) {
                        return Ok(None);
                    }
                    if self.rng.chance(self.faults.loss) {
                        WireCounters::add(&self.stats.lost, 1);
                        return Ok(None);
                    }
                    let mut f = self.batch.data(k).to_vec();
                    open_frame(self.auth.as_mut(), i, from, &mut f).map(|_| Some(f))
                });
                match checked {
                    Ok(Some(f)) => {
                        queue.push_back(f);
                        n += 1;
                    }
                    Ok(None) => {}
                    Err(why) => self.stats.refused(why),
                }
            }
            if got < super::batch::BATCH {
                break;
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{ack_frame, data_headers};
    use super::*;
    use crate::route::Route;

    fn table(addrs: &[SocketAddr]) -> RouteTable {
        RouteTable::new(addrs.iter().map(|&a| Route { udp: Some(a), mac: None }).collect())
    }

    /// A wire of `n` NICs on loopback `lo`, routed to one another, and
    /// their addresses: ports free a moment ago, drawn again when one was
    /// taken meanwhile (tests run in parallel and draw from the same
    /// ephemeral range, so a probed port can be gone when it is bound).
    pub(super) fn on_loopback(lo: &str, n: usize, faults: Faults) -> (UdpWire, Vec<SocketAddr>) {
        for _ in 0..20 {
            // Held together, so one draw never repeats a port.
            let socks: Vec<UdpSocket> = (0..n).map(|_| UdpSocket::bind(format!("{lo}:0")).unwrap()).collect();
            let addrs: Vec<SocketAddr> = socks.iter().map(|s| s.local_addr().unwrap()).collect();
            drop(socks);
            match UdpWire::new(&addrs, table(&addrs), faults) {
                Ok(w) => return (w, addrs),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("no {n} free ports on {lo} in 20 draws");
    }

    fn poll_until(w: &mut UdpWire, rx: &mut [VecDeque<Vec<u8>>], want_seen: u64) {
        for _ in 0..200 {
            w.poll(0, rx);
            let s = w.stats();
            let refused = s.unknown_source + s.source_mismatch + s.malformed + s.bad_tag + s.unknown_key + s.replayed;
            if s.received + refused >= want_seen {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Two nodes on loopback (one wire, two sockets) and a forger socket.
    fn checks_on(lo: &str) {
        let (mut w, addrs) = on_loopback(lo, 2, Faults::default());
        let b = addrs[1];
        let mut rx = vec![VecDeque::new(), VecDeque::new()];
        // Real traffic: node 0 → node 1.
        w.send(0, 0, 1, ack_frame(0, 1));
        w.flush(0);
        poll_until(&mut w, &mut rx, 1);
        assert_eq!(rx[1].len(), 1, "a frame from node 0's address claiming node 0 is accepted");
        let forger = UdpSocket::bind(format!("{lo}:0")).unwrap();
        forger.send_to(&ack_frame(0, 1), b).unwrap(); // unknown address
        forger.send_to(&ack_frame(0, 1)[..10], b).unwrap(); // truncated
        forger.send_to(&ack_frame(9, 1), b).unwrap(); // node 9 is in no route (and unknown address)
                                                      // Node 1's own socket claiming to be node 0: a known address, the wrong node.
        w.socks[1].send_to(&ack_frame(0, 1), b).unwrap();
        poll_until(&mut w, &mut rx, 5);
        let s = w.stats();
        assert_eq!(s.received, 1, "{s:?}");
        assert_eq!(s.unknown_source, 2, "{s:?}");
        assert_eq!(s.malformed, 1, "{s:?}");
        assert_eq!(s.source_mismatch, 1, "{s:?}");
        assert_eq!(rx[1].len(), 1, "nothing forged was delivered");
        // Still works.
        w.send(0, 1, 0, ack_frame(1, 0));
        w.flush(0);
        poll_until(&mut w, &mut rx, 6);
        assert_eq!(rx[0].len(), 1);
    }

    #[test]
    fn immediate_sending_goes_out_from_host_memory_in_place() {
        use crate::dma::{bus_addr, test_arena, DmaMap, SPACE_ARENA};
        let (mut w, _) = on_loopback("127.0.0.1", 2, Faults::default());
        let mut rx = vec![VecDeque::new(), VecDeque::new()];
        let host: Vec<u8> = (0..8192u32).map(|i| (i * 31 + 7) as u8).collect();
        let mut map = DmaMap::new(4);
        map.insert(1, test_arena(&host));
        let hold = |map: &DmaMap, off: u64, len: usize| map.hold(bus_addr(SPACE_ARENA, 1, off), len).unwrap();
        let mut payload = HostPayload::default();
        assert!(payload.push(hold(&map, 100, 3000)) && payload.push(hold(&map, 6000, 1500)));
        // An ordinary frame first, then the one from host memory: the
        // batch keeps their order.
        w.send(0, 0, 1, ack_frame(0, 1));
        w.send_host(0, 0, 1, data_headers(0, 1, 4500), payload);
        // The host deregisters the region before the wire sends: the frame
        // holds the mapping, so its bytes still go.
        map.remove(1);
        w.flush(0);
        poll_until(&mut w, &mut rx, 2);
        let mut want = data_headers(0, 1, 4500);
        want.extend_from_slice(&host[100..3100]);
        want.extend_from_slice(&host[6000..7500]);
        assert_eq!(rx[1].len(), 2, "{:?}", w.stats());
        assert_eq!(rx[1][0], ack_frame(0, 1));
        assert_eq!(rx[1][1], want, "headers, then the host pieces in order");
        assert_eq!((w.stats().from_host, w.stats().frames), (1, 2));
        // Duplicated on the wire: each copy from host memory.
        drop(w);
        let (mut w, _) = on_loopback("127.0.0.1", 2, Faults { dup: 1.0, ..Faults::default() });
        map.insert(1, test_arena(&host));
        let mut payload = HostPayload::default();
        assert!(payload.push(hold(&map, 0, 64)));
        w.send_host(0, 0, 1, data_headers(0, 1, 64), payload);
        w.flush(0);
        rx[1].clear();
        poll_until(&mut w, &mut rx, 2);
        assert_eq!(rx[1].len(), 2);
        assert_eq!(w.stats().from_host, 2);
    }

    #[test]
    fn link_delay_holds_frames_until_due_in_order() {
        let delay = 2_000_000;
        let faults = Faults { link_delay_ns: delay, ..Faults::default() };
        let (mut w, _) = on_loopback("127.0.0.1", 2, faults);
        let mut rx = vec![VecDeque::new(), VecDeque::new()];
        let (first, mut second) = (ack_frame(0, 1), ack_frame(0, 1));
        second[8] ^= 0x5a; // some header byte: tells the two apart
        w.send(1_000, 0, 1, first.clone());
        w.send(5_000, 0, 1, second.clone());
        assert_eq!(w.next_due(), Some(1_000 + delay), "the engine must wake for the first frame");
        w.flush(1_000 + delay - 1);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(w.poll(0, &mut rx), 0, "nothing leaves before its delay");
        w.flush(1_000 + delay);
        assert_eq!(w.next_due(), Some(5_000 + delay));
        poll_until(&mut w, &mut rx, 1);
        assert_eq!(rx[1].len(), 1);
        w.flush(5_000 + delay);
        assert_eq!(w.next_due(), None);
        poll_until(&mut w, &mut rx, 2);
        let got: Vec<Vec<u8>> = rx[1].drain(..).collect();
        assert_eq!(got, vec![first, second], "in the order sent");
    }

    /// With auth, a frame from the right address is still refused unless
    /// sealed with the cluster key, and a captured one cannot be replayed.
    #[test]
    fn auth_refuses_forgeries_from_the_right_address_and_replays() {
        use super::super::auth::{Auth, AuthMode, AuthShared, TRAILER};
        use std::os::unix::fs::PermissionsExt;
        let key = |name: &str, byte: u8| {
            let p = std::env::temp_dir().join(format!("emp-udp-auth-{}-{name}.key", std::process::id()));
            std::fs::write(&p, emp_config::WireKey { id: 1, key: [byte; 32] }.to_text()).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            p
        };
        let (good, bad) = (key("good", 3), key("bad", 4));
        let (mut w, addrs) = on_loopback("127.0.0.1", 2, Faults::default());
        let b = addrs[1];
        w.authenticate(Auth::new(AuthShared::load(AuthMode::Mac, &good).unwrap(), 2, 2));
        let mut rx = vec![VecDeque::new(), VecDeque::new()];
        w.send(0, 0, 1, ack_frame(0, 1));
        w.flush(0);
        poll_until(&mut w, &mut rx, 1);
        assert_eq!(rx[1].pop_front(), Some(ack_frame(0, 1)), "sealed, opened, trailer cut off");
        let seal = |k: &std::path::Path| {
            let mut forger = Auth::new(AuthShared::load(AuthMode::Mac, k).unwrap(), 1, 2);
            let f = ack_frame(0, 1);
            let mut buf = vec![0u8; f.len() + TRAILER];
            buf[..f.len()].copy_from_slice(&f);
            forger.seal(0, &mut buf, f.len()).unwrap();
            buf
        };
        // From node 0's own socket: the right source address every time.
        let from_a = &w.socks[0];
        from_a.send_to(&ack_frame(0, 1), b).unwrap(); // unsealed: no trailer
        from_a.send_to(&seal(&bad), b).unwrap(); // another key
        let captured = seal(&good);
        from_a.send_to(&captured, b).unwrap(); // a genuine frame …
        from_a.send_to(&captured, b).unwrap(); // … replayed
        poll_until(&mut w, &mut rx, 4);
        let s = w.stats();
        assert_eq!((s.received, s.malformed, s.bad_tag, s.replayed), (2, 1, 1, 1), "{s:?}");
        assert_eq!(rx[1].len(), 1, "only the genuine frame, once");
        let _ = (std::fs::remove_file(good), std::fs::remove_file(bad));
    }

    #[test]
    fn udp_v4_refuses_forged_sources() {
        checks_on("127.0.0.1");
    }

    #[test]
    fn udp_v6_refuses_forged_sources() {
        if UdpSocket::bind("[::1]:0").is_err() {
            eprintln!("skipped: no IPv6 loopback here");
            return;
        }
        checks_on("[::1]");
    }
}

#[cfg(test)]
mod mcast_tests {
    use super::super::tests::ack_frame;
    use super::tests::on_loopback;
    use super::*;
    use emp_uapi::wire::MCAST_BASE;

    const GROUP: u16 = MCAST_BASE + 9;

    /// `n` NICs on loopback, multicast on (IP, or replicated when `why`).
    fn wire(n: usize, faults: Faults, replicated: Option<&str>) -> UdpWire {
        let (mut w, _) = on_loopback("127.0.0.1", n, faults);
        match replicated {
            Some(why) => w.enable_replicated_multicast(why),
            None => {
                let mode = w.enable_multicast();
                eprintln!("loopback multicast mode: {mode:?}");
            }
        }
        w
    }

    fn poll_for(w: &mut UdpWire, rx: &mut [VecDeque<Vec<u8>>], want: u64) {
        for _ in 0..100 {
            w.poll(0, rx);
            if w.stats().received + w.stats().lost >= want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        w.poll(0, rx); // Anything more would be a copy too many.
    }

    fn one_transmission_reaches_members_only(replicated: Option<&str>) {
        let mut w = wire(5, Faults::default(), replicated);
        let mut rx = vec![VecDeque::new(); 5];
        for d in [0, 1, 2, 4] {
            w.set_membership(d, GROUP, true).unwrap();
        }
        w.send(0, 0, GROUP, ack_frame(0, GROUP));
        w.flush(0);
        poll_for(&mut w, &mut rx, 3);
        let got: Vec<usize> = rx.iter().map(VecDeque::len).collect();
        assert_eq!(got, [0, 1, 1, 0, 1], "every member but the sender, no non-member");
        let s = w.stats();
        assert_eq!((s.mcast_sent, s.mcast_received), (1, 3), "{s:?}");
        match w.mcast_mode().unwrap() {
            UdpMcastMode::Ip { .. } => assert_eq!((s.frames, s.mcast_fallback), (1, 0), "one datagram: {s:?}"),
            UdpMcastMode::Replicated(_) => assert_eq!((s.frames, s.mcast_fallback), (4, 1), "a copy per node: {s:?}"),
        }
        w.set_membership(1, GROUP, false).unwrap();
        w.send(0, 0, GROUP, ack_frame(0, GROUP));
        w.flush(0);
        poll_for(&mut w, &mut rx, 5);
        let got: Vec<usize> = rx.iter().map(VecDeque::len).collect();
        assert_eq!(got, [0, 1, 2, 0, 2], "a member that left gets nothing");
    }

    #[test]
    fn ip_multicast_on_loopback_reaches_members_only() {
        one_transmission_reaches_members_only(None);
    }

    #[test]
    fn replicated_multicast_reaches_members_only() {
        one_transmission_reaches_members_only(Some("test"));
    }

    #[test]
    fn multicast_loss_is_per_receiver() {
        let members = 4;
        let mut w = wire(members + 1, Faults { loss: 0.5, seed: 11, ..Faults::default() }, None);
        let mut rx = vec![VecDeque::new(); members + 1];
        for d in 1..=members {
            w.set_membership(d, GROUP, true).unwrap();
        }
        let sends = 100u64;
        let mut partial = 0;
        for _ in 0..sends {
            let before = w.stats().received;
            w.send(0, 0, GROUP, ack_frame(0, GROUP));
            w.flush(0);
            for _ in 0..50 {
                w.poll(0, &mut rx);
                let s = w.stats();
                if s.received + s.lost >= (w.stats().mcast_sent) * members as u64 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let got = w.stats().received - before;
            partial += (got > 0 && got < members as u64) as u32;
        }
        let s = w.stats();
        assert_eq!(s.mcast_sent, sends);
        assert_eq!(s.received + s.lost, sends * members as u64, "each copy delivered or lost: {s:?}");
        assert!(partial > sends as u32 / 2, "losses independent per receiver: {partial} partial of {sends}");
    }

    #[test]
    fn multicast_needs_enabling_and_a_group() {
        let (mut w, _) = on_loopback("127.0.0.1", 1, Faults::default());
        assert!(w.set_membership(0, GROUP, true).unwrap_err().contains("not enabled"));
        w.enable_replicated_multicast("test");
        assert!(w.set_membership(0, 5, true).unwrap_err().contains("not a multicast address"));
        assert_eq!(mcast_ip(MCAST_BASE + 0x102, true).to_string(), "239.254.1.2");
        assert_eq!(mcast_ip(MCAST_BASE + 0x102, false).to_string(), "ff12::454d:50:102");
    }
}
