//! The cluster file: one TOML file naming the hosts of an EMP cluster, the
//! NICs (nodes) each host runs, and how the nodes reach each other on the
//! wire. `emp-nicd --config F --host H` starts host H's NICs from it;
//! `emp cluster up --config F` starts every host's daemon; libemp reads it to
//! find a rank's NIC. docs/cluster.md describes the format for users.
//!
//! ```toml
//! [cluster]
//! wire = "udp"                 # "udp", "packet" or "mem"
//! mtu = 1500                   # optional
//! ports = 8                    # optional: ports (processes) per NIC
//! nic_cpus = 2                 # optional: CPUs per NIC (1 or 2; docs/nic-cpus.md)
//! auth = "mac"                 # optional: "off", "mac" or "aead" (udp, packet)
//! auth_key = "/etc/emp/wire.key"   # with auth: the cluster key file (`emp wire keygen`)
//!
//! [[host]]
//! name = "a"
//! launch = ["ip", "netns", "exec", "emp-bed-a"]   # runs a command there; [] = here
//! dir = "/tmp/emp-bed/a"       # state directory on that host (NIC sockets, log)
//!
//! [[node]]
//! id = 0
//! host = "a"
//! interface = "eth0"           # packet: the interface; udp: the IPv6 scope
//! mac = "02:00:c6:12:00:01"    # packet: this node's address
//! udp = "198.18.0.1:47000"     # udp: this node's address and port
//! ```
//!
//! Everything is checked on load, with an error that names the entry: node
//! ids are `0..N` with none missing, every node's host exists, each wire's
//! addresses are present, unicast and distinct.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

pub mod cores;
pub mod wirekey;

/// Most CPUs a NIC has (`cluster.nic_cpus`, `emp-nicd --nic-cpus`).
pub const NIC_CPUS_MAX: u32 = 2;
pub use wirekey::{WireKey, KEY_LEN};

/// Most nodes in one cluster (the NIC's route table is indexed by a `u16`
/// node id; 0xFFFF is reserved on the wire).
pub const NODES_MAX: usize = 4096;

/// Where `make install` puts the trusted firmware-signing keys (beside the
/// image the kernel driver requests, `/lib/firmware/emp/emp-fw.bin`).
pub const INSTALLED_TRUSTED_KEYS: &str = "/lib/firmware/emp";

/// The directory of public keys (`*.pub`) a NIC trusts to sign its control
/// program: `explicit` (a flag or the cluster file's `trusted_keys`), else
/// `$EMP_TRUSTED_KEYS`, else — for binaries run from a build tree
/// (`<tree>/target/<profile>/`) — the tree's `firmware-blobs/`, where
/// `make firmware` keeps the development key, else the installed
/// [`INSTALLED_TRUSTED_KEYS`]. It is configuration of the NIC, never derived
/// from where an image lies: an image signed by a key that sits beside it
/// must not boot for that reason alone.
pub fn trusted_keys_dir(explicit: Option<&Path>) -> PathBuf {
    if let Some(d) = explicit {
        return d.to_path_buf();
    }
    if let Some(d) = std::env::var_os("EMP_TRUSTED_KEYS").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().ok();
    let tree = exe.as_deref().and_then(|e| {
        let target = e.ancestors().nth(2)?;
        (target.file_name()? == "target").then(|| target.parent().map(|t| t.join("firmware-blobs")))?
    });
    match tree {
        Some(d) if d.is_dir() => d,
        _ => PathBuf::from(INSTALLED_TRUSTED_KEYS),
    }
}

/// How a cluster's NICs exchange frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireKind {
    /// An in-process switch: every node on one host, in one daemon.
    Mem,
    /// One UDP socket per NIC, at the node's `udp` address (IPv4 or IPv6).
    Udp,
    /// Raw Ethernet frames (ethertype 0x88B5) on the node's `interface`,
    /// addressed to its `mac`.
    Packet,
}

impl WireKind {
    /// The name used in the file and on command lines.
    pub fn as_str(self) -> &'static str {
        match self {
            WireKind::Mem => "mem",
            WireKind::Udp => "udp",
            WireKind::Packet => "packet",
        }
    }
}

/// Per-frame authentication of the network wires (docs/cluster.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Frames carry no proof of origin beyond their source address.
    #[default]
    Off,
    /// Every frame carries a tag (AES-256-GCM over header and payload) under
    /// the cluster key: integrity and origin, no confidentiality.
    Mac,
    /// As `mac`, and the payload (everything after the frame header) is
    /// encrypted.
    Aead,
}

impl AuthMode {
    /// The name used in the file and on command lines.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::Off => "off",
            AuthMode::Mac => "mac",
            AuthMode::Aead => "aead",
        }
    }
}

/// An Ethernet MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// Group (multicast or broadcast) addresses have bit 0 of the first octet set.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

impl std::str::FromStr for Mac {
    type Err = String;
    fn from_str(s: &str) -> Result<Mac, String> {
        let mut m = [0u8; 6];
        let mut parts = s.split(':');
        for b in m.iter_mut() {
            let p = parts.next().filter(|p| p.len() == 2).ok_or_else(|| format!("bad MAC address {s:?}"))?;
            *b = u8::from_str_radix(p, 16).map_err(|_| format!("bad MAC address {s:?}"))?;
        }
        if parts.next().is_some() {
            return Err(format!("bad MAC address {s:?}"));
        }
        Ok(Mac(m))
    }
}

/// A host: a machine (or network namespace) that runs one `emp-nicd`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Unique name; nodes refer to it.
    pub name: String,
    /// Argument vector prefix that runs a command on this host (e.g.
    /// `["ssh", "a"]` or `["ip", "netns", "exec", "ns-a"]`); empty: here.
    pub launch: Vec<String>,
    /// State directory on the host: the NIC sockets `nic<id>.sock`, the
    /// daemon's pid file and log.
    pub dir: PathBuf,
}

/// A node: one NIC, with its id and wire address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Node id, `0..nodes`.
    pub id: u16,
    /// Name of the host that runs it.
    pub host: String,
    /// Network interface: the one the `packet` wire sends on; for `udp` over
    /// an IPv6 link-local address, its scope.
    pub interface: Option<String>,
    /// This node's Ethernet address (`packet` wire).
    pub mac: Option<Mac>,
    /// This node's UDP address and port (`udp` wire).
    pub udp: Option<SocketAddr>,
}

/// A parsed and checked cluster file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The wire every node uses.
    pub wire: WireKind,
    /// MTU, if the file sets one.
    pub mtu: Option<u32>,
    /// Ports (processes) per NIC, if the file sets it.
    pub ports: Option<u16>,
    /// CPUs per NIC (1 or 2), if the file sets it.
    pub nic_cpus: Option<u32>,
    /// Signed firmware image, if the file names one.
    pub firmware: Option<PathBuf>,
    /// Directory of trusted firmware-signing keys, if the file names one.
    pub trusted_keys: Option<PathBuf>,
    /// Extra `emp-nicd` arguments for every host.
    pub nicd_args: Vec<String>,
    /// Per-frame authentication of the wire.
    pub auth: AuthMode,
    /// The cluster key file (present exactly when `auth` is not off).
    pub auth_key: Option<PathBuf>,
    /// Hosts, in file order.
    pub hosts: Vec<Host>,
    /// Nodes, indexed by id.
    pub nodes: Vec<Node>,
}

/// Why a cluster file was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    cluster: RawCluster,
    #[serde(default)]
    host: Vec<RawHost>,
    #[serde(default)]
    node: Vec<RawNode>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    wire: WireKind,
    mtu: Option<u32>,
    ports: Option<u16>,
    nic_cpus: Option<u32>,
    firmware: Option<PathBuf>,
    trusted_keys: Option<PathBuf>,
    #[serde(default)]
    nicd_args: Vec<String>,
    #[serde(default)]
    auth: AuthMode,
    auth_key: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: String,
    #[serde(default)]
    launch: Vec<String>,
    dir: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: u16,
    host: String,
    interface: Option<String>,
    mac: Option<String>,
    udp: Option<String>,
}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

impl ClusterConfig {
    /// Reads and checks a cluster file.
    pub fn load(path: &Path) -> Result<ClusterConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError(format!("{}: {e}", path.display())))?;
        ClusterConfig::parse(&text).map_err(|e| ConfigError(format!("{}: {e}", path.display())))
    }

    /// Parses and checks the text of a cluster file.
    pub fn parse(text: &str) -> Result<ClusterConfig, ConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| ConfigError(e.to_string().trim_end().to_string()))?;
        let c = raw.cluster;
        if let Some(m) = c.mtu {
            if !(576..=65000).contains(&m) {
                return err(format!("cluster.mtu {m} is outside 576..=65000"));
            }
        }
        if c.ports == Some(0) {
            return err("cluster.ports must be at least 1");
        }
        if let Some(k) = c.nic_cpus {
            if !(1..=NIC_CPUS_MAX).contains(&k) {
                return err(format!(
                    "cluster.nic_cpus {k} is outside 1..={NIC_CPUS_MAX} (the CPU plans split the control program over two CPUs)"
                ));
            }
        }
        match (c.auth, &c.auth_key) {
            (AuthMode::Off, Some(_)) => return err("cluster.auth_key is set but cluster.auth is \"off\""),
            (AuthMode::Mac | AuthMode::Aead, None) => {
                return err(format!(
                    "cluster.auth = {:?} needs cluster.auth_key (a key file: `emp wire keygen`)",
                    c.auth.as_str()
                ))
            }
            (_, Some(k)) if k.as_os_str().is_empty() => return err("cluster.auth_key is empty"),
            (AuthMode::Mac | AuthMode::Aead, Some(_)) if c.wire == WireKind::Mem => {
                return err("cluster.auth applies to the udp and packet wires; the mem wire never leaves its daemon")
            }
            _ => {}
        }
        let mut hosts = Vec::new();
        for h in raw.host {
            if h.name.is_empty() || h.name.contains(char::is_whitespace) {
                return err(format!("host name {:?} must be a non-empty word", h.name));
            }
            if hosts.iter().any(|x: &Host| x.name == h.name) {
                return err(format!("host {:?} is named twice", h.name));
            }
            if h.dir.as_os_str().is_empty() {
                return err(format!("host {:?}: dir is empty", h.name));
            }
            hosts.push(Host { name: h.name, launch: h.launch, dir: h.dir });
        }
        if hosts.is_empty() {
            return err("no [[host]]");
        }
        let n = raw.node.len();
        if n == 0 {
            return err("no [[node]]");
        }
        if n > NODES_MAX {
            return err(format!("{n} nodes; at most {NODES_MAX}"));
        }
        let mut slots: Vec<Option<Node>> = vec![None; n];
        for r in raw.node {
            let id = r.id;
            let Some(slot) = slots.get_mut(id as usize) else {
                return err(format!("node {id}: ids must be 0..{n} (one per [[node]])"));
            };
            if slot.is_some() {
                return err(format!("node {id} is listed twice"));
            }
            if !hosts.iter().any(|h| h.name == r.host) {
                return err(format!("node {id}: no [[host]] named {:?}", r.host));
            }
            let mac =
                r.mac.map(|m| m.parse::<Mac>()).transpose().map_err(|e| ConfigError(format!("node {id}: {e}")))?;
            let udp = r
                .udp
                .map(|u| u.parse::<SocketAddr>().map_err(|_| ConfigError(format!("node {id}: bad udp address {u:?}"))))
                .transpose()?;
            *slot = Some(Node { id, host: r.host, interface: r.interface, mac, udp });
        }
        let nodes: Vec<Node> = slots.into_iter().map(|s| s.expect("n ids in 0..n, none twice: all present")).collect();
        let cfg = ClusterConfig {
            wire: c.wire,
            mtu: c.mtu,
            ports: c.ports,
            nic_cpus: c.nic_cpus,
            firmware: c.firmware,
            trusted_keys: c.trusted_keys,
            nicd_args: c.nicd_args,
            auth: c.auth,
            auth_key: c.auth_key,
            hosts,
            nodes,
        };
        cfg.check_wire()?;
        Ok(cfg)
    }

    fn check_wire(&self) -> Result<(), ConfigError> {
        match self.wire {
            WireKind::Mem => {
                if self.nodes.iter().any(|n| n.host != self.nodes[0].host) {
                    return err("the mem wire is one daemon: every node must be on the same host");
                }
            }
            WireKind::Udp => {
                let mut seen = HashMap::new();
                for n in &self.nodes {
                    let Some(a) = n.udp else { return err(format!("node {}: the udp wire needs `udp`", n.id)) };
                    if a.ip().is_unspecified() || a.ip().is_multicast() || a.port() == 0 {
                        return err(format!("node {}: udp address {a} is not a unicast address and port", n.id));
                    }
                    if let Some(o) = seen.insert(a, n.id) {
                        return err(format!("nodes {o} and {} share udp address {a}", n.id));
                    }
                }
            }
            WireKind::Packet => {
                let mut seen = HashMap::new();
                for n in &self.nodes {
                    let (Some(m), Some(_)) = (n.mac, &n.interface) else {
                        return err(format!("node {}: the packet wire needs `interface` and `mac`", n.id));
                    };
                    if m.is_multicast() || m.0 == [0; 6] {
                        return err(format!("node {}: mac {m} is not a unicast address", n.id));
                    }
                    if let Some(o) = seen.insert(m, n.id) {
                        return err(format!("nodes {o} and {} share mac {m}", n.id));
                    }
                }
            }
        }
        Ok(())
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// Node `id`.
    pub fn node(&self, id: u16) -> Option<&Node> {
        self.nodes.get(id as usize)
    }

    /// The nodes host `name` runs, in id order.
    pub fn nodes_on<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Node> + 'a {
        self.nodes.iter().filter(move |n| n.host == name)
    }

    /// Socket of node `id`'s NIC on its host.
    pub fn socket(&self, id: u16) -> Option<PathBuf> {
        let n = self.node(id)?;
        Some(self.host(&n.host)?.dir.join(format!("nic{id}.sock")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
[cluster]
wire = "udp"
[[host]]
name = "a"
dir = "/tmp/a"
[[host]]
name = "b"
launch = ["ip", "netns", "exec", "b"]
dir = "/tmp/b"
[[node]]
id = 1
host = "b"
udp = "[fe80::2]:47001"
interface = "eth0"
[[node]]
id = 0
host = "a"
udp = "198.18.0.1:47000"
"#;

    #[test]
    fn trusted_keys_are_never_the_images_directory() {
        assert_eq!(trusted_keys_dir(Some(Path::new("/k"))), PathBuf::from("/k"));
        // Tests run from target/<profile>/deps: not a build tree's binary
        // directory, so without the variable the installed one is used.
        if std::env::var_os("EMP_TRUSTED_KEYS").is_none() {
            assert_eq!(trusted_keys_dir(None), PathBuf::from(INSTALLED_TRUSTED_KEYS));
        }
    }

    #[test]
    fn parses_and_indexes() {
        let c = ClusterConfig::parse(TWO).unwrap();
        assert_eq!(c.wire, WireKind::Udp);
        assert_eq!(c.nodes[0].udp.unwrap().to_string(), "198.18.0.1:47000");
        assert!(c.nodes[1].udp.unwrap().is_ipv6());
        assert_eq!(c.nodes_on("b").map(|n| n.id).collect::<Vec<_>>(), [1]);
        assert_eq!(c.socket(1).unwrap(), PathBuf::from("/tmp/b/nic1.sock"));
        assert_eq!(c.host("b").unwrap().launch[0], "ip");
    }

    fn refused(text: &str, want: &str) {
        let e = ClusterConfig::parse(text).unwrap_err().0;
        assert!(e.contains(want), "{e:?} does not say {want:?}");
    }

    #[test]
    fn refuses_bad_files_with_a_reason() {
        refused(&TWO.replace("id = 1", "id = 0"), "listed twice");
        refused(&TWO.replace("id = 1", "id = 2"), "ids must be 0..2");
        refused(&TWO.replace("host = \"b\"", "host = \"c\""), "no [[host]] named \"c\"");
        refused(&TWO.replace("198.18.0.1:47000", "[fe80::2]:47001"), "share udp address");
        refused(&TWO.replace("198.18.0.1:47000", "0.0.0.0:47000"), "not a unicast");
        refused(&TWO.replace("198.18.0.1:47000", "198.18.0.1"), "bad udp address");
        refused(&TWO.replace("udp = \"[fe80::2]:47001\"", ""), "needs `udp`");
        refused(&TWO.replace("wire = \"udp\"", "wire = \"token-ring\""), "unknown variant");
        refused(&TWO.replace("wire = \"udp\"", "wire = \"udp\"\nspeed = 9"), "unknown field");
        refused(&TWO.replace("wire = \"udp\"", "wire = \"mem\""), "same host");
        refused(&TWO.replace("name = \"b\"", "name = \"a\""), "named twice");
        refused("[cluster]\nwire = \"udp\"\n[[host]]\nname = \"a\"\ndir = \"/x\"\n", "no [[node]]");
        refused(&TWO.replace("wire = \"udp\"", "wire = \"udp\"\nmtu = 100"), "outside");
    }

    #[test]
    fn nic_cpus_is_one_or_two() {
        assert_eq!(ClusterConfig::parse(TWO).unwrap().nic_cpus, None);
        let two = TWO.replace("wire = \"udp\"", "wire = \"udp\"\nnic_cpus = 2");
        assert_eq!(ClusterConfig::parse(&two).unwrap().nic_cpus, Some(2));
        refused(&two.replace("nic_cpus = 2", "nic_cpus = 0"), "cluster.nic_cpus 0 is outside 1..=2");
        refused(&two.replace("nic_cpus = 2", "nic_cpus = 3"), "over two CPUs");
        refused(&two.replace("nic_cpus = 2", "nic_cpus = \"two\""), "invalid type");
    }

    #[test]
    fn auth_needs_a_key_and_a_network_wire() {
        let c = ClusterConfig::parse(TWO).unwrap();
        assert_eq!((c.auth, c.auth_key), (AuthMode::Off, None), "off unless asked");
        let mac = TWO.replace("wire = \"udp\"", "wire = \"udp\"\nauth = \"mac\"\nauth_key = \"/k/wire.key\"");
        let c = ClusterConfig::parse(&mac).unwrap();
        assert_eq!((c.auth, c.auth_key.unwrap()), (AuthMode::Mac, PathBuf::from("/k/wire.key")));
        assert_eq!(ClusterConfig::parse(&mac.replace("\"mac\"", "\"aead\"")).unwrap().auth, AuthMode::Aead);
        refused(&mac.replace("auth_key = \"/k/wire.key\"", ""), "needs cluster.auth_key");
        refused(&mac.replace("\"mac\"", "\"off\""), "auth is \"off\"");
        refused(&mac.replace("\"mac\"", "\"hmac\""), "unknown variant");
        refused(&mac.replace("/k/wire.key", ""), "auth_key is empty");
        let mem = mac.replace("wire = \"udp\"", "wire = \"mem\"").replace("host = \"b\"", "host = \"a\"");
        refused(&mem, "never leaves its daemon");
    }

    #[test]
    fn packet_needs_distinct_unicast_macs() {
        let p = TWO.replace("wire = \"udp\"", "wire = \"packet\"");
        refused(&p, "needs `interface` and `mac`");
        let ok = p
            .replace("id = 0\n", "id = 0\ninterface = \"e0\"\nmac = \"02:00:00:00:00:01\"\n")
            .replace("id = 1\n", "id = 1\nmac = \"02:00:00:00:00:02\"\n");
        let c = ClusterConfig::parse(&ok).unwrap();
        assert_eq!(c.nodes[1].mac.unwrap().to_string(), "02:00:00:00:00:02");
        refused(&ok.replace("02:00:00:00:00:02", "02:00:00:00:00:01"), "share mac");
        refused(&ok.replace("02:00:00:00:00:02", "03:00:00:00:00:02"), "not a unicast");
        refused(&ok.replace("02:00:00:00:00:02", "02:00:00:00:0:02"), "bad MAC");
    }
}
