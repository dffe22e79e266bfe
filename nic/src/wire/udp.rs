//! The `udp` wire: one UDP socket per local NIC, bound to its node's
//! address (IPv4 or IPv6; a link-local IPv6 address scoped to the node's
//! interface), peers from the route table. A datagram is accepted only from
//! the address the route table gives the node its header claims, and, with
//! authentication on, only once its trailer checks out (`auth.rs`).

use std::collections::VecDeque;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use super::auth::Auth;
use super::batch::{RecvBatch, SendBatch, SLOT};
use super::{
    check_source, claimed_source_of, inject, open_frame, DelayLine, Faults, Prng, Refused, Wire, WireCounters,
};
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

    /// Queues one datagram for this pass's `sendmmsg`; one the socket
    /// refuses (buffer full) is a lost frame (reliability recovers it).
    fn transmit(&mut self, src: usize, to: SocketAddr, frame: &[u8]) {
        if frame.len() > SLOT {
            WireCounters::add(&self.stats.lost, 1);
            return;
        }
        if self.tx[src].full() {
            let lost = self.tx[src].flush(self.socks[src].as_raw_fd());
            WireCounters::add(&self.stats.lost, lost as u64);
        }
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
    fn send(&mut self, now: u64, src: usize, dst: u16, frame: Vec<u8>) {
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
                    let mut f = self.spare.pop().unwrap_or_default();
                    f.clear();
                    f.extend_from_slice(self.batch.data(k));
                    match open_frame(self.auth.as_mut(), i, from, &mut f) {
                        Ok(()) => {
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
        }
        WireCounters::add(&self.stats.received, n as u64);
        n
    }

    fn next_due(&self) -> Option<u64> {
        self.delayed.next_due()
    }

    fn fds(&self) -> Vec<RawFd> {
        self.socks.iter().map(|s| s.as_raw_fd()).collect()
    }

    fn counters(&self) -> Arc<WireCounters> {
        self.stats.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::ack_frame;
    use super::*;
    use crate::route::Route;

    fn table(addrs: &[SocketAddr]) -> RouteTable {
        RouteTable::new(addrs.iter().map(|&a| Route { udp: Some(a), mac: None }).collect())
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
        let probe = |_: ()| UdpSocket::bind(format!("{lo}:0")).unwrap().local_addr().unwrap();
        let (a, b) = (probe(()), probe(()));
        let mut w = UdpWire::new(&[a, b], table(&[a, b]), Faults::default()).unwrap();
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
    fn link_delay_holds_frames_until_due_in_order() {
        let probe = |_: ()| UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let (a, b) = (probe(()), probe(()));
        let delay = 2_000_000;
        let faults = Faults { link_delay_ns: delay, ..Faults::default() };
        let mut w = UdpWire::new(&[a, b], table(&[a, b]), faults).unwrap();
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
        let probe = |_: ()| UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let (a, b) = (probe(()), probe(()));
        let mut w = UdpWire::new(&[a, b], table(&[a, b]), Faults::default()).unwrap();
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
