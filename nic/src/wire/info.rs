//! What `emp info` learns about a NIC's wire (`WIRE_INFO`, `WIRE_ROUTES` of
//! the direct-attach protocol): the wire's kind, the route table, the
//! wire's live counters, and the state of each local NIC's interface, read
//! from the kernel when asked (control path, never the engine's thread).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use emp_uapi::attach::RouteWords;

use super::auth::AuthShared;
use super::packet::{link_state, LinkState};
use super::{WireCounters, WireKindInfo};
use crate::route::RouteTable;

/// A daemon's wire as its attach servers report it, shared by all its NICs.
pub struct WireView {
    /// The wire's kind.
    pub kind: WireKindInfo,
    /// Each local NIC's interface, when it has one (packet; udp when the
    /// cluster file names it).
    pub interfaces: Vec<Option<String>>,
    /// The route table the wire uses.
    pub routes: RouteTable,
    /// The wire's counters (one set for the whole daemon).
    pub counters: Arc<WireCounters>,
    /// The wire's authentication and keys, when on.
    pub auth: Option<Arc<AuthShared>>,
}

impl WireView {
    /// The link of local NIC `local`: `None` without an interface, else
    /// its state now or why it cannot be read.
    pub fn link(&self, local: usize) -> Option<std::io::Result<LinkState>> {
        let name = self.interfaces.get(local)?.as_deref()?;
        Some(query_socket().and_then(|s| link_state(s.as_raw_fd(), name)))
    }

    /// Node `node`'s route as `WIRE_ROUTES` carries it.
    pub fn route_words(&self, node: u16) -> RouteWords {
        let Some(r) = self.routes.get(node) else { return RouteWords::default() };
        let mut w = RouteWords { mac: r.mac.unwrap_or_default(), ..Default::default() };
        if let Some(a) = r.udp {
            w.udp_port = a.port();
            w.ip6 = match a.ip() {
                std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                std::net::IpAddr::V6(v6) => v6.octets(),
            };
        }
        w
    }
}

/// A socket to ask interface ioctls through (any socket of this network
/// namespace answers them).
fn query_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::Route;

    #[test]
    fn routes_and_links_as_reported() {
        let v = WireView {
            kind: WireKindInfo::Udp,
            interfaces: vec![Some("lo".into()), None, Some("eno-no-such-if".into())],
            routes: RouteTable::new(vec![
                Route { udp: Some("198.18.160.1:47000".parse().unwrap()), mac: Some([2, 0, 0xc6, 0x12, 0, 1]) },
                Route { udp: Some("[fe80::2]:47001".parse().unwrap()), mac: None },
            ]),
            counters: Arc::default(),
            auth: None,
        };
        let lo = v.link(0).unwrap().unwrap();
        assert_eq!((lo.interface.as_str(), lo.mtu > 0), ("lo", true));
        assert!(v.link(1).is_none(), "no interface, no link");
        assert!(v.link(2).unwrap().is_err(), "a missing interface is an error, not a link");
        assert!(v.link(3).is_none());
        let r0 = v.route_words(0);
        assert_eq!((r0.udp_port, r0.mac), (47000, [2, 0, 0xc6, 0x12, 0, 1]));
        assert_eq!(std::net::Ipv6Addr::from(r0.ip6).to_ipv4_mapped(), Some([198, 18, 160, 1].into()));
        let r1 = v.route_words(1);
        assert_eq!((r1.udp_port, r1.mac, r1.ip6[0]), (47001, [0; 6], 0xfe));
        assert_eq!(v.route_words(2), RouteWords::default());
    }
}
