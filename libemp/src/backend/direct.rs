//! Direct attach: the port of an `emp-nicd` NIC reached over its Unix
//! socket (`emp_uapi::attach`). The socket carries control requests; the
//! port's doorbell and event are eventfds the daemon hands over at attach;
//! the arena is a sealed memfd the daemon maps.

use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use emp_uapi::attach::{
    attach_reply as ar, link_flags, op, route_page, wire_counter, wire_kind, wire_reply as wr, AttachMsg,
    ATTACH_VERSION, ROUTES_PER_PAGE,
};
use emp_uapi::desc::{Sge, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_uapi::ring;
use emp_uapi::{Le, PAGE_SIZE};
use nix::sys::socket::{
    connect, recvmsg, sendmsg, socket, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};

use super::{Attached, COUNTERS};
use crate::map::Mapping;
use crate::{Error, PortInfo, Result};

/// Default arena size (pages are allocated only when touched).
const ARENA_DEFAULT: usize = 256 << 20;

/// An attached `emp-nicd` port.
pub(crate) struct Daemon {
    sock: OwnedFd,
    doorbell: OwnedFd,
    event: OwnedFd,
    /// The arena's memfd: parts of it are registered again by descriptor.
    arena: OwnedFd,
    /// The daemon's process: it reaches memory registered by address with
    /// `process_vm_readv/writev`.
    pid: i32,
    /// Bytes of a port window (to map the new one after a restore).
    window_len: usize,
}

fn memfd(name: &str, len: usize) -> Result<OwnedFd> {
    let c = std::ffi::CString::new(name).expect("no NUL");
    // SAFETY: valid C string and flags.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ftruncate on a valid fd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // The NIC maps this memory: it must never shrink under it.
    // SAFETY: fcntl(F_ADD_SEALS) on our own memfd.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(fd)
}

/// One request and its reply, with descriptors passed either way.
fn request(sock: RawFd, opcode: u32, args: &[u64], fds: &[RawFd]) -> Result<(AttachMsg, Vec<OwnedFd>)> {
    let mut m = AttachMsg { version: ATTACH_VERSION, op: opcode, ..Default::default() };
    m.arg[..args.len()].copy_from_slice(args);
    let mut b = [0u8; AttachMsg::SIZE];
    m.put(&mut b);
    let iov = [std::io::IoSlice::new(&b)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cm: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(sock, &iov, cm, MsgFlags::MSG_NOSIGNAL, None).map_err(|e| Error::Protocol(format!("send: {e}")))?;
    let mut rb = [0u8; AttachMsg::SIZE];
    let mut cspace = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(&mut rb)];
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut cspace), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| Error::Protocol(format!("receive: {e}")))?;
    let mut got = Vec::new();
    for c in msg.cmsgs().map_err(|e| Error::Protocol(e.to_string()))? {
        if let ControlMessageOwned::ScmRights(v) = c {
            // SAFETY: SCM_RIGHTS handed us new descriptors.
            got.extend(v.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    if msg.bytes != AttachMsg::SIZE {
        return Err(Error::Protocol(if msg.bytes == 0 {
            "the NIC daemon went away".into()
        } else {
            "short reply".into()
        }));
    }
    let r = AttachMsg::get(&rb);
    if r.op != opcode {
        return Err(Error::Protocol(format!("reply to op {} for op {opcode}", r.op)));
    }
    Ok((r, got))
}

fn op_name(o: u32) -> &'static str {
    match o {
        op::ATTACH => "attach",
        op::REG_ARENA => "register arena",
        op::REG_VM => "register memory",
        op::START => "start port",
        op::DEREG => "deregister memory",
        op::GROUP_SET => "set group",
        op::GROUP_CLEAR => "clear group",
        op::WIRE_INFO => "wire info",
        op::WIRE_ROUTES => "route table",
        op::WIRE_AUTH => "wire auth",
        op::WIRE_REKEY => "wire rekey",
        op::GANG => "gang switch",
        op::WIRE_MCAST => "wire multicast",
        op::PORT_SUSPEND => "suspend port",
        op::PORT_STABLE => "port stable",
        op::PORT_SAVE => "save port",
        op::PORT_RESTORE => "restore port",
        op::PORT_RESUME => "resume port",
        _ => "stats",
    }
}

/// A request whose non-zero reply status becomes [`Error::Nic`].
fn call(sock: RawFd, opcode: u32, args: &[u64], fds: &[RawFd]) -> Result<(AttachMsg, Vec<OwnedFd>)> {
    let (r, f) = request(sock, opcode, args, fds)?;
    if r.status != 0 {
        return Err(Error::Nic { op: op_name(opcode), errno: r.status });
    }
    Ok((r, f))
}

fn connect_to(path: &str) -> Result<OwnedFd> {
    let sock = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
    connect(sock.as_raw_fd(), &UnixAddr::new(path)?).map_err(|e| Error::Protocol(format!("connect {path}: {e}")))?;
    Ok(sock)
}

fn all_counters(sock: RawFd) -> Result<[u64; COUNTERS]> {
    let (base, _) = call(sock, op::STATS, &[], &[])?;
    let (ext, _) = call(sock, op::STATS_EXT, &[], &[])?;
    let mut c = [0u64; COUNTERS];
    c[..16].copy_from_slice(&base.arg[..16]);
    c[16..].copy_from_slice(&ext.arg[..COUNTERS - 16]);
    Ok(c)
}

/// NIC counters and status read through a NIC's socket without attaching.
///
/// # Errors
/// [`Error::Protocol`] when the socket cannot be reached or answers
/// nonsense; [`Error::Nic`] when the daemon refuses.
///
/// # Examples
/// ```no_run
/// let stats = emp::nic_stats("/run/emp/nic0.sock")?;
/// println!("{:?}", stats.arg);
/// # Ok::<(), emp::Error>(())
/// ```
pub fn nic_stats(path: &str) -> Result<AttachMsg> {
    let sock = connect_to(path)?;
    Ok(call(sock.as_raw_fd(), op::STATS, &[], &[])?.0)
}

/// A gang-scheduling request (`emp_uapi::attach::gang`) for every port
/// process `pid` holds on the NIC at `path`, made by the daemon's owner on
/// a connection of its own (docs/context-switch.md, `emp gang`); a path
/// under `/dev/` goes to emp.ko instead (`EMP_IOC_GANG` on a read-only
/// file, which holds no port; needs `CAP_SYS_ADMIN`). Returns the reply:
/// `arg[0]` = ports acted on, `arg[1]` = stable ones for `STABLE`.
///
/// # Errors
/// [`Error::Nic`] with the daemon's or driver's errno (`EPERM` for another
/// user, `EBUSY` when a slot to restore into is taken), or a socket or
/// device error.
pub fn nic_gang(path: &str, action: u64, pid: i32) -> Result<AttachMsg> {
    if path.starts_with("/dev/") {
        let (ports, stable) = super::kernel::gang(path, action, pid)?;
        let mut reply = AttachMsg { op: op::GANG, ..Default::default() };
        reply.arg[0] = ports;
        reply.arg[1] = stable;
        return Ok(reply);
    }
    let sock = connect_to(path)?;
    Ok(call(sock.as_raw_fd(), op::GANG, &[action, pid as u64], &[])?.0)
}

/// Every NIC counter (`emp_uapi::sram::counter`), read through a NIC's
/// socket without attaching.
///
/// # Errors
/// As [`nic_stats`].
///
/// # Examples
/// ```no_run
/// let c = emp::nic_counters_at("/run/emp/nic0.sock")?;
/// assert_eq!(c.len(), emp::COUNTERS);
/// # Ok::<(), emp::Error>(())
/// ```
pub fn nic_counters_at(path: &str) -> Result<[u64; COUNTERS]> {
    let sock = connect_to(path)?;
    all_counters(sock.as_raw_fd())
}

/// The kind of wire a NIC is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireKind {
    /// The in-process switch between the NICs of one daemon.
    Mem,
    /// UDP datagrams.
    Udp,
    /// Raw Ethernet frames.
    Packet,
}

impl WireKind {
    /// Its name in cluster files.
    pub fn as_str(self) -> &'static str {
        match self {
            WireKind::Mem => "mem",
            WireKind::Udp => "udp",
            WireKind::Packet => "packet",
        }
    }
}

/// The state of a NIC's network interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Link {
    /// The NIC has no interface of its own (mem; udp without `interface`).
    None,
    /// The interface could not be read (gone or renamed).
    Unreadable {
        /// Its name.
        interface: String,
    },
    /// The interface now.
    Known {
        /// Its name.
        interface: String,
        /// Administratively up with carrier.
        up: bool,
        /// Its MTU.
        mtu: u32,
        /// Its hardware address.
        mac: [u8; 6],
    },
}

/// A NIC's wire, as its daemon reports it ([`nic_wire_info`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireInfo {
    /// The wire's kind.
    pub kind: WireKind,
    /// Nodes in the route table.
    pub nodes: u32,
    /// NICs of the daemon on this wire: they share its counters.
    pub local_nics: u32,
    /// This NIC's index among them.
    pub local_index: u32,
    /// The daemon's pid: NICs with the same pid share one wire.
    pub daemon_pid: u32,
    /// The NIC's MTU.
    pub mtu: u32,
    /// The NIC's interface.
    pub link: Link,
    /// The wire's counters, in `emp_uapi::attach::wire_counter` order
    /// (names in `wire_counter::NAMES`).
    pub counters: [u64; wire_counter::COUNT],
    /// Datagrams sent with their payload read in place from host memory
    /// (Immediate Sending on a network wire).
    pub from_host: u64,
}

impl WireInfo {
    /// Counter `i` of `emp_uapi::attach::wire_counter` by its name.
    pub fn counter(&self, name: &str) -> Option<u64> {
        wire_counter::NAMES.iter().position(|n| *n == name).map(|i| self.counters[i])
    }
}

/// One node's route ([`nic_routes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteInfo {
    /// Node id.
    pub node: u16,
    /// Its UDP address (IPv6 link-local scope not included).
    pub udp: Option<std::net::SocketAddr>,
    /// Its Ethernet address.
    pub mac: Option<[u8; 6]>,
}

/// The wire of the NIC at `path`: kind, link and counters, read without
/// attaching.
///
/// # Errors
/// As [`nic_stats`]; a daemon without the request answers [`Error::Nic`]
/// (EOPNOTSUPP).
///
/// # Examples
/// ```no_run
/// let w = emp::nic_wire_info("/run/emp/nic0.sock")?;
/// println!("{} wire, {} frames refused as malformed", w.kind.as_str(), w.counter("malformed").unwrap());
/// # Ok::<(), emp::Error>(())
/// ```
pub fn nic_wire_info(path: &str) -> Result<WireInfo> {
    let sock = connect_to(path)?;
    let (r, _) = call(sock.as_raw_fd(), op::WIRE_INFO, &[], &[])?;
    let kind = match r.arg[wr::KIND] {
        wire_kind::MEM => WireKind::Mem,
        wire_kind::UDP => WireKind::Udp,
        wire_kind::PACKET => WireKind::Packet,
        k => return Err(Error::Protocol(format!("unknown wire kind {k}"))),
    };
    let mut name = [0u8; 16];
    name[..8].copy_from_slice(&r.arg[wr::LINK_NAME].to_le_bytes());
    name[8..].copy_from_slice(&r.arg[wr::LINK_NAME + 1].to_le_bytes());
    let end = name.iter().position(|&b| b == 0).unwrap_or(16);
    let interface = String::from_utf8_lossy(&name[..end]).into_owned();
    let flags = r.arg[wr::LINK_FLAGS];
    let link = if flags & link_flags::KNOWN == 0 {
        Link::None
    } else if flags & link_flags::ERROR != 0 {
        Link::Unreadable { interface }
    } else {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&r.arg[wr::LINK_MAC].to_be_bytes()[2..]);
        Link::Known { interface, up: flags & link_flags::UP != 0, mtu: r.arg[wr::LINK_MTU] as u32, mac }
    };
    let mut counters = [0u64; wire_counter::COUNT];
    counters.copy_from_slice(&r.arg[wr::COUNTERS..wr::COUNTERS + wire_counter::COUNT]);
    Ok(WireInfo {
        kind,
        nodes: r.arg[wr::NODES] as u32,
        local_nics: r.arg[wr::LOCAL_NICS] as u32,
        local_index: r.arg[wr::LOCAL_INDEX] as u32,
        daemon_pid: r.arg[wr::DAEMON_PID] as u32,
        mtu: r.arg[wr::MTU] as u32,
        link,
        counters,
        from_host: r.arg[wr::FROM_HOST],
    })
}

/// A NIC's wire multicast counters, as its daemon reports them ([`nic_wire_mcast`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireMcast {
    /// Multicast transmissions (one per transmission, however many members).
    pub sent: u64,
    /// Multicast frames handed to a member NIC.
    pub received: u64,
    /// Transmissions sent as one unicast copy per node (no IP multicast).
    pub fallback: u64,
}

/// The multicast counters of the wire of the NIC at `path` (its daemon's),
/// read without attaching.
///
/// # Errors
/// As [`nic_wire_info`].
///
/// # Examples
/// ```no_run
/// let m = emp::nic_wire_mcast("/run/emp/nic0.sock")?;
/// println!("{} multicast sent, {} replicated", m.sent, m.fallback);
/// # Ok::<(), emp::Error>(())
/// ```
pub fn nic_wire_mcast(path: &str) -> Result<WireMcast> {
    use emp_uapi::attach::mcast_reply as m;
    let sock = connect_to(path)?;
    let (r, _) = call(sock.as_raw_fd(), op::WIRE_MCAST, &[], &[])?;
    Ok(WireMcast { sent: r.arg[m::SENT], received: r.arg[m::RECEIVED], fallback: r.arg[m::FALLBACK] })
}

/// A NIC's wire authentication, as its daemon reports it ([`nic_wire_auth`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireAuth {
    /// "off", "mac" or "aead".
    pub mode: &'static str,
    /// Key id sent with (0: none).
    pub key_id: u32,
    /// Key id installed by a rotation, accepted, not sent with yet (0: none).
    pub next_key_id: u32,
    /// Key id still accepted after a switch (0: none).
    pub previous_key_id: u32,
    /// Frames dropped: the tag did not match (forged, altered, another key).
    pub bad_tag: u64,
    /// Frames dropped: sealed under a key id the daemon does not hold.
    pub unknown_key: u64,
    /// Frames dropped: replayed, or too far behind the newest.
    pub replayed: u64,
    /// Bytes of trailer on every frame.
    pub trailer: u32,
}

fn wire_auth_of(r: &AttachMsg) -> WireAuth {
    use emp_uapi::attach::auth_reply as a;
    WireAuth {
        mode: match r.arg[a::MODE] {
            1 => "mac",
            2 => "aead",
            _ => "off",
        },
        key_id: r.arg[a::KEY_ID] as u32,
        next_key_id: r.arg[a::NEXT_KEY_ID] as u32,
        previous_key_id: r.arg[a::PREVIOUS_KEY_ID] as u32,
        bad_tag: r.arg[a::BAD_TAG],
        unknown_key: r.arg[a::UNKNOWN_KEY],
        replayed: r.arg[a::REPLAYED],
        trailer: r.arg[a::TRAILER] as u32,
    }
}

/// The wire authentication of the NIC at `path` (its daemon's): mode, key
/// ids and frames refused, read without attaching.
///
/// # Errors
/// As [`nic_wire_info`].
///
/// # Examples
/// ```no_run
/// let a = emp::nic_wire_auth("/run/emp/nic0.sock")?;
/// println!("{} key {}: {} forged frames dropped", a.mode, a.key_id, a.bad_tag);
/// # Ok::<(), emp::Error>(())
/// ```
pub fn nic_wire_auth(path: &str) -> Result<WireAuth> {
    let sock = connect_to(path)?;
    Ok(wire_auth_of(&call(sock.as_raw_fd(), op::WIRE_AUTH, &[], &[])?.0))
}

/// One step of a key rotation of the daemon of the NIC at `path`:
/// `switch` false rereads its key file and accepts the new key; true sends
/// with it (the old one stays accepted for a grace period). Returns the
/// state after the step.
///
/// # Errors
/// As [`nic_wire_info`]; [`Error::Nic`] with EOPNOTSUPP when the wire does
/// not authenticate, EINVAL when the daemon refuses its key file (it logs
/// why and keeps its keys), EPERM for another user than the daemon's.
///
/// # Examples
/// ```no_run
/// emp::nic_wire_rekey("/run/emp/nic0.sock", false)?; // every daemon first …
/// emp::nic_wire_rekey("/run/emp/nic0.sock", true)?; // … then every daemon
/// # Ok::<(), emp::Error>(())
/// ```
pub fn nic_wire_rekey(path: &str, switch: bool) -> Result<WireAuth> {
    use emp_uapi::attach::rekey;
    let sock = connect_to(path)?;
    let step = if switch { rekey::SWITCH } else { rekey::INSTALL };
    Ok(wire_auth_of(&call(sock.as_raw_fd(), op::WIRE_REKEY, &[step], &[])?.0))
}

/// Up to `max` routes of the route table of the NIC at `path`, from node
/// `first`, and how many nodes the table holds. The daemon answers a page
/// at a time, so a large table costs one request per
/// `emp_uapi::attach::ROUTES_PER_PAGE` routes asked for.
///
/// # Errors
/// As [`nic_wire_info`]; `first` beyond the table is [`Error::Nic`] (EINVAL).
///
/// # Examples
/// ```no_run
/// let (nodes, routes) = emp::nic_routes("/run/emp/nic0.sock", 0, 64)?;
/// for r in &routes {
///     println!("node {}: {:?} {:?}", r.node, r.udp, r.mac);
/// }
/// assert!(routes.len() as u32 <= nodes);
/// # Ok::<(), emp::Error>(())
/// ```
pub fn nic_routes(path: &str, first: u32, max: usize) -> Result<(u32, Vec<RouteInfo>)> {
    let sock = connect_to(path)?;
    let mut out = Vec::new();
    let mut at = first;
    let mut nodes = 0;
    while out.len() < max {
        let (r, _) = call(sock.as_raw_fd(), op::WIRE_ROUTES, &[at as u64], &[])?;
        let (n, count) = route_page::parse_header(r.arg[0]);
        nodes = n;
        if count as usize > ROUTES_PER_PAGE || at as u64 + count as u64 > n as u64 {
            return Err(Error::Protocol(format!("route page of {count} entries at node {at} of {n}")));
        }
        for i in 0..count as usize {
            if out.len() == max {
                break;
            }
            let w: [u64; 3] = r.arg[1 + 3 * i..4 + 3 * i].try_into().expect("3 words");
            let e = route_page::decode(&w);
            let ip = std::net::Ipv6Addr::from(e.ip6);
            let ip: std::net::IpAddr = ip.to_ipv4_mapped().map(Into::into).unwrap_or(ip.into());
            out.push(RouteInfo {
                node: (at as usize + i) as u16,
                udp: (e.udp_port != 0).then(|| std::net::SocketAddr::new(ip, e.udp_port)),
                mac: (e.mac != [0; 6]).then_some(e.mac),
            });
        }
        at += count;
        if count == 0 || at >= n {
            break;
        }
    }
    Ok((nodes, out))
}

impl Daemon {
    /// Attaches a port of the NIC at `path`, maps its window, registers a
    /// fresh arena (size from `EMP_ARENA_MB`) and starts the port with a CQ
    /// of `cq_entries` at the arena's start.
    pub(crate) fn open(path: &str, cq_entries: u32) -> Result<Attached<Daemon>> {
        let arena_len = std::env::var("EMP_ARENA_MB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map(|mb| mb << 20)
            .unwrap_or(ARENA_DEFAULT);
        let sock = connect_to(path)?;
        let (r, mut fds) = call(sock.as_raw_fd(), op::ATTACH, &[], &[])?;
        if fds.len() != 3 {
            return Err(Error::Protocol(format!("attach returned {} descriptors, expected 3", fds.len())));
        }
        let event = fds.pop().expect("3");
        let doorbell = fds.pop().expect("3");
        let window_fd = fds.pop().expect("3");
        let window_len = r.arg[ar::WINDOW_SIZE] as usize;
        let info = PortInfo {
            node: r.arg[ar::NODE] as u16,
            port: r.arg[ar::PORT] as u16,
            mtu: r.arg[ar::MTU] as u32,
            send_entries: r.arg[ar::SEND_ENTRIES] as u32,
            recv_entries: r.arg[ar::RECV_ENTRIES] as u32,
            nodes: r.arg[ar::NODES] as u32,
            port_count: r.arg[ar::PORT_COUNT] as u32,
            msg_max: r.arg[ar::MSG_MAX],
            features: r.arg[ar::FEATURES] as u32,
        };
        let ok_geometry = ring::valid_entries(info.send_entries)
            && ring::valid_entries(info.recv_entries)
            && window_len >= PAGE_SIZE + (info.send_entries + info.recv_entries) as usize * WorkDesc::SIZE;
        if !ok_geometry {
            return Err(Error::Protocol("port geometry does not fit the window".into()));
        }
        let window = Mapping::shared(window_fd.as_raw_fd(), window_len)?;
        let arena_fd = memfd("emp-arena", arena_len)?;
        let arena = Mapping::shared(arena_fd.as_raw_fd(), arena_len)?;
        let access = (MR_LOCAL_READ | MR_LOCAL_WRITE) as u64;
        let (r2, _) = call(sock.as_raw_fd(), op::REG_ARENA, &[0, arena_len as u64, access], &[arena_fd.as_raw_fd()])?;
        let arena_key = r2.arg[0] as u32;
        call(sock.as_raw_fd(), op::START, &[arena_key as u64, 0, cq_entries as u64], &[])?;
        let pid = r.arg[ar::DAEMON_PID] as i32;
        let backend = Daemon { sock, doorbell, event, arena: arena_fd, pid, window_len };
        Ok(Attached { backend, window, info, arena, arena_key })
    }

    /// Registers `[offset, offset + len)` of the arena memfd again, with
    /// `access`.
    pub(crate) fn reg_arena_part(&self, offset: usize, len: usize, access: u8) -> Result<(u32, u32)> {
        let args = [offset as u64, len as u64, access as u64];
        let r = call(self.sock.as_raw_fd(), op::REG_ARENA, &args, &[self.arena.as_raw_fd()])?.0;
        Ok((r.arg[0] as u32, r.arg[1] as u32))
    }

    /// Registers memory of this process by address; lets the daemon reach
    /// it (`prctl(PR_SET_PTRACER)`).
    pub(crate) fn reg_vm(&self, addr: u64, len: u64, access: u8) -> Result<(u32, u32)> {
        // SAFETY: prctl with a pid argument has no memory effects.
        unsafe { libc::prctl(libc::PR_SET_PTRACER, self.pid as libc::c_ulong, 0, 0, 0) };
        let r = call(self.sock.as_raw_fd(), op::REG_VM, &[addr, len, access as u64], &[])?.0;
        Ok((r.arg[0] as u32, r.arg[1] as u32))
    }

    pub(crate) fn dereg(&self, key: u32) -> Result<()> {
        call(self.sock.as_raw_fd(), op::DEREG, &[key as u64], &[]).map(|_| ())
    }

    /// Rings the doorbell if the NIC is asleep (`sleeping` is the port's
    /// NIC_SLEEPING word). The caller has published its index and fenced.
    pub(crate) fn notify(&self, sleeping: &AtomicU32) {
        if sleeping.load(Ordering::Relaxed) != 0 {
            let one = 1u64.to_ne_bytes();
            // SAFETY: 8-byte write to our doorbell eventfd.
            unsafe { libc::write(self.doorbell.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }

    pub(crate) fn event_fd(&self) -> RawFd {
        self.event.as_raw_fd()
    }

    /// A context-switch request without a result (`PORT_SUSPEND`, `PORT_RESUME`).
    pub(crate) fn port_ctx(&self, opcode: u32) -> Result<()> {
        call(self.sock.as_raw_fd(), opcode, &[], &[]).map(|_| ())
    }

    pub(crate) fn is_stable(&self) -> Result<bool> {
        Ok(call(self.sock.as_raw_fd(), op::PORT_STABLE, &[], &[])?.0.arg[0] == 1)
    }

    /// Saves the port into registered memory `at` (its `len` is the room);
    /// returns the image's length.
    pub(crate) fn save(&self, at: Sge) -> Result<u64> {
        Ok(call(self.sock.as_raw_fd(), op::PORT_SAVE, &[at.key as u64, at.offset, at.len as u64], &[])?.0.arg[0])
    }

    /// Restores the port from registered memory `at`; returns the new
    /// window mapped and the slot it went to.
    pub(crate) fn restore(&self, at: Sge) -> Result<(Mapping, u16)> {
        let (r, fds) = call(self.sock.as_raw_fd(), op::PORT_RESTORE, &[at.key as u64, at.offset, at.len as u64], &[])?;
        let [window] = <[OwnedFd; 1]>::try_from(fds)
            .map_err(|f| Error::Protocol(format!("restore returned {} descriptors, expected 1", f.len())))?;
        Ok((Mapping::shared(window.as_raw_fd(), self.window_len)?, r.arg[0] as u16))
    }

    /// GROUP_SET: the daemon reads the entry from registered memory `at`.
    pub(crate) fn group_set(&self, at: Sge) -> Result<u32> {
        Ok(call(self.sock.as_raw_fd(), op::GROUP_SET, &[at.key as u64, at.offset], &[])?.0.arg[0] as u32)
    }

    pub(crate) fn group_clear(&self, slot: u32) -> Result<()> {
        call(self.sock.as_raw_fd(), op::GROUP_CLEAR, &[slot as u64], &[]).map(|_| ())
    }

    pub(crate) fn counters(&self) -> Result<[u64; COUNTERS]> {
        all_counters(self.sock.as_raw_fd())
    }

    pub(crate) fn busy(&self) -> Result<(u64, u64)> {
        let (r, _) = call(self.sock.as_raw_fd(), op::BUSY, &[], &[])?;
        Ok((r.arg[0], r.arg[1]))
    }

    /// Errors out if the daemon is gone (the socket hung up).
    pub(crate) fn check_alive(&self) -> Result<()> {
        let mut pfd = libc::pollfd { fd: self.sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: polling one valid descriptor without blocking.
        let r = unsafe { libc::poll(&mut pfd, 1, 0) };
        if r > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLIN) != 0 {
            return Err(Error::Protocol("the NIC daemon went away".into()));
        }
        Ok(())
    }
}
