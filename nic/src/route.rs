//! The route table: how each node of the cluster is reached on the wire.
//! The daemon builds it from the cluster file (or, for the one-machine
//! chassis, loopback ports), writes it into every NIC's SRAM route table
//! and gives it to the wire, which also uses it to check where a frame
//! came from.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use emp_uapi::sram::RouteEntry;

/// How to reach one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Route {
    /// UDP address and port (`udp` wire).
    pub udp: Option<SocketAddr>,
    /// Ethernet address (`packet` wire).
    pub mac: Option<[u8; 6]>,
}

/// Routes of every node, indexed by node id, with reverse maps for source
/// checks.
#[derive(Clone, Debug, Default)]
pub struct RouteTable {
    routes: Vec<Route>,
    by_mac: HashMap<[u8; 6], u16>,
    by_udp: HashMap<(IpAddr, u16), u16>,
}

impl RouteTable {
    /// A table of `routes[node]`.
    pub fn new(routes: Vec<Route>) -> RouteTable {
        let by_mac = routes.iter().enumerate().filter_map(|(n, r)| Some((r.mac?, n as u16))).collect();
        let by_udp = routes.iter().enumerate().filter_map(|(n, r)| Some((canon(&r.udp?), n as u16))).collect();
        RouteTable { routes, by_mac, by_udp }
    }

    /// The one-machine chassis: node n at `127.0.0.1:base_port + n`.
    pub fn loopback(nodes: u16, base_port: u16) -> RouteTable {
        RouteTable::new(
            (0..nodes)
                .map(|n| Route {
                    udp: Some(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), base_port.wrapping_add(n))),
                    mac: None,
                })
                .collect(),
        )
    }

    /// The routes a cluster file gives.
    pub fn from_config(c: &emp_config::ClusterConfig) -> RouteTable {
        RouteTable::new(c.nodes.iter().map(|n| Route { udp: n.udp, mac: n.mac.map(|m| m.0) }).collect())
    }

    /// Nodes in the table.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// True when the table has no node.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Node `node`'s route.
    pub fn get(&self, node: u16) -> Option<&Route> {
        self.routes.get(node as usize)
    }

    /// Every route, by node id.
    pub fn iter(&self) -> impl Iterator<Item = (u16, &Route)> {
        self.routes.iter().enumerate().map(|(n, r)| (n as u16, r))
    }

    /// The node whose Ethernet address is `mac`.
    pub fn node_of_mac(&self, mac: &[u8; 6]) -> Option<u16> {
        self.by_mac.get(mac).copied()
    }

    /// The node whose UDP address is `a` (scope and flow label aside).
    pub fn node_of_udp(&self, a: &SocketAddr) -> Option<u16> {
        self.by_udp.get(&canon(a)).copied()
    }

    /// The SRAM route table entry of `node` (invalid when it is not in the table).
    pub fn entry(&self, node: u16) -> RouteEntry {
        let Some(r) = self.get(node) else { return RouteEntry::default() };
        let mut e = RouteEntry { valid: 1, mac: r.mac.unwrap_or_default(), ..Default::default() };
        if let Some(a) = r.udp {
            e.udp_port = a.port();
            match a.ip() {
                IpAddr::V4(v4) => {
                    e.ipv4 = u32::from_le_bytes(v4.octets());
                    e.ip6 = v4.to_ipv6_mapped().octets();
                }
                IpAddr::V6(v6) => e.ip6 = v6.octets(),
            }
        }
        e
    }
}

/// The UDP address an SRAM route entry holds (scope not included).
pub fn entry_udp(e: &RouteEntry) -> Option<SocketAddr> {
    if e.valid != 1 || e.udp_port == 0 {
        return None;
    }
    let ip: IpAddr = if e.ip_is_v4() {
        Ipv4Addr::new(e.ip6[12], e.ip6[13], e.ip6[14], e.ip6[15]).into()
    } else if e.ip6 != [0; 16] {
        Ipv6Addr::from(e.ip6).into()
    } else {
        // Written before the IPv6 field was filled: the IPv4 field alone.
        Ipv4Addr::from(e.ipv4.to_le_bytes()).into()
    };
    Some(SocketAddr::new(ip, e.udp_port))
}

/// `a` with its IPv6 scope: a link-local address is only meaningful on one
/// interface, `iface` (resolved on this host); any other address as is.
pub fn with_scope(a: SocketAddr, iface: Option<&str>) -> Result<SocketAddr, String> {
    let SocketAddr::V6(mut v6) = a else { return Ok(a) };
    if !v6.ip().is_unicast_link_local() || v6.scope_id() != 0 {
        return Ok(a);
    }
    let name = iface.ok_or_else(|| format!("{a} is link-local: the node needs `interface` (its scope)"))?;
    v6.set_scope_id(if_index(name)?);
    Ok(SocketAddr::V6(v6))
}

/// The index of network interface `name` on this host.
pub fn if_index(name: &str) -> Result<u32, String> {
    let c = std::ffi::CString::new(name).map_err(|_| format!("bad interface name {name:?}"))?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(format!("interface {name:?}: {}", std::io::Error::last_os_error()));
    }
    Ok(i)
}

/// Same host and port, whatever the IPv6 flow label or scope: a datagram's
/// source as the kernel reports it against the address in the table.
pub fn same_udp_source(a: &SocketAddr, b: &SocketAddr) -> bool {
    canon(a) == canon(b)
}

fn canon(a: &SocketAddr) -> (IpAddr, u16) {
    let ip = match a.ip() {
        // An IPv4 peer seen on a dual-stack IPv6 socket.
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    };
    (ip, a.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_carry_both_families() {
        let t = RouteTable::new(vec![
            Route { udp: Some("198.18.0.1:47000".parse().unwrap()), mac: Some([2, 0, 0xc6, 0x12, 0, 1]) },
            Route { udp: Some("[fe80::2]:47001".parse().unwrap()), mac: None },
            Route::default(),
        ]);
        let e0 = t.entry(0);
        assert_eq!(e0.valid, 1);
        assert_eq!(e0.ipv4.to_le_bytes(), [198, 18, 0, 1]);
        assert!(e0.ip_is_v4());
        assert_eq!(e0.mac, [2, 0, 0xc6, 0x12, 0, 1]);
        assert_eq!(entry_udp(&e0).unwrap().to_string(), "198.18.0.1:47000");
        let e1 = t.entry(1);
        assert_eq!(e1.ipv4, 0);
        assert!(!e1.ip_is_v4());
        assert_eq!(entry_udp(&e1).unwrap().to_string(), "[fe80::2]:47001");
        assert_eq!(entry_udp(&t.entry(2)), None);
        assert_eq!(t.entry(3).valid, 0, "a node outside the table has no valid entry");
        assert_eq!(t.node_of_mac(&[2, 0, 0xc6, 0x12, 0, 1]), Some(0));
        assert_eq!(t.node_of_mac(&[2, 0, 0xc6, 0x12, 0, 9]), None);
        assert_eq!(t.node_of_udp(&"198.18.0.1:47000".parse().unwrap()), Some(0));
        assert_eq!(t.node_of_udp(&"[fe80::2%3]:47001".parse().unwrap()), Some(1));
        assert_eq!(t.node_of_udp(&"198.18.0.1:47001".parse().unwrap()), None);
    }

    #[test]
    fn link_local_takes_the_interface_scope() {
        let g: SocketAddr = "198.18.0.1:1".parse().unwrap();
        assert_eq!(with_scope(g, None).unwrap(), g);
        let ll: SocketAddr = "[fe80::1]:1".parse().unwrap();
        assert!(with_scope(ll, None).unwrap_err().contains("needs `interface`"));
        let SocketAddr::V6(s) = with_scope(ll, Some("lo")).unwrap() else { panic!("v6") };
        assert_eq!(s.scope_id(), if_index("lo").unwrap());
        assert!(with_scope(ll, Some("ew-no-such-if")).unwrap_err().contains("ew-no-such-if"));
    }

    #[test]
    fn loopback_is_base_plus_node() {
        let t = RouteTable::loopback(3, 47000);
        assert_eq!(t.len(), 3);
        assert_eq!(t.get(2).unwrap().udp.unwrap().to_string(), "127.0.0.1:47002");
    }

    #[test]
    fn udp_sources_compare_host_and_port_only() {
        let a: SocketAddr = "198.18.0.1:47000".parse().unwrap();
        assert!(same_udp_source(&a, &"[::ffff:198.18.0.1]:47000".parse().unwrap()));
        assert!(!same_udp_source(&a, &"198.18.0.1:47001".parse().unwrap()));
        assert!(!same_udp_source(&a, &"198.18.0.2:47000".parse().unwrap()));
        let mut l: std::net::SocketAddrV6 = "[fe80::2]:47001".parse().unwrap();
        let r = SocketAddr::V6(l);
        l.set_scope_id(7);
        assert!(same_udp_source(&r, &SocketAddr::V6(l)));
    }
}
