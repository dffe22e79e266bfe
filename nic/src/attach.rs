//! Direct attach server: one listening Unix socket per NIC, one thread per
//! connected process (few, long-lived). See `emp_uapi::attach` for the
//! protocol. Whatever a client sends, the worst it gets is an error reply
//! or a closed connection; its death releases everything it held.

use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use emp_uapi::attach::{
    attach_reply as ar, auth_reply, gang, link_flags, op, rekey, route_page, status, wire_counter, wire_kind,
    wire_reply as wr, AttachMsg, ATTACH_VERSION, ROUTES_PER_PAGE,
};
use emp_uapi::Le;
use nix::sys::socket::{
    accept, bind, getsockopt, listen, recvmsg, sendmsg, socket, sockopt, AddressFamily, Backlog, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};

use crate::nic::{NicShared, ParkedPort};
use crate::wire::auth::{AuthMode, TRAILER};
use crate::wire::{WireKindInfo, WireView};

/// The wire a NIC is on, as `WIRE_INFO` reports it.
#[derive(Clone)]
pub struct WireSeat {
    /// The daemon's wire.
    pub view: Arc<WireView>,
    /// This NIC's local index on it.
    pub local: usize,
}

/// Socket path of node `node` under `dir`.
pub fn socket_path(dir: &Path, node: u16) -> PathBuf {
    dir.join(format!("nic{node}.sock"))
}

/// Binds the NIC's socket and serves it on a new thread.
pub fn serve(nic: Arc<NicShared>, path: PathBuf, wire: WireSeat) -> std::io::Result<()> {
    let _ = std::fs::remove_file(&path);
    let fd = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
    bind(fd.as_raw_fd(), &UnixAddr::new(&path)?)?;
    listen(&fd, Backlog::new(64)?)?;
    std::thread::Builder::new().name(format!("emp-attach{}", nic.node)).spawn(move || loop {
        match accept(fd.as_raw_fd()) {
            Ok(c) => {
                // SAFETY: accept returned a new descriptor we own.
                let conn = unsafe { OwnedFd::from_raw_fd(c) };
                let nic = nic.clone();
                let wire = wire.clone();
                let _ = std::thread::Builder::new().name("emp-client".into()).spawn(move || client(nic, wire, conn));
            }
            Err(e) => {
                tracing::warn!("accept: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    })?;
    Ok(())
}

fn reply(conn: RawFd, mut m: AttachMsg, st: i32, fds: &[RawFd]) -> bool {
    m.version = ATTACH_VERSION;
    m.status = st;
    let mut b = [0u8; AttachMsg::SIZE];
    m.put(&mut b);
    let iov = [std::io::IoSlice::new(&b)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cm: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(conn, &iov, cm, MsgFlags::MSG_NOSIGNAL, None).is_ok()
}

/// Descriptors one `SCM_RIGHTS` message carries at most (include/net/scm.h).
const SCM_MAX_FD: usize = 253;

fn client(nic: Arc<NicShared>, wire: WireSeat, conn: OwnedFd) {
    let creds = getsockopt(&conn, sockopt::PeerCredentials).ok();
    let pid = creds.map(|c| c.pid()).unwrap_or(0);
    // Key rotation is the daemon's owner's (or root's) to ask for.
    // SAFETY: geteuid has no preconditions.
    let owner = creds.is_some_and(|c| c.uid() == 0 || c.uid() == unsafe { libc::geteuid() });
    let mut port: Option<u16> = None;
    let mut parked: Option<ParkedPort> = None;
    // The id of the port this connection attached (`PortState::id`).
    let mut port_id: Option<u64> = None;
    let mut buf = [0u8; AttachMsg::SIZE + 1];
    // Room for every descriptor one message can carry (the kernel's
    // SCM_MAX_FD): with less, a request carrying more is truncated and the
    // descriptors that did arrive cannot be reached to be closed (the
    // control messages of a truncated receive are not parsed).
    let mut cspace = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    loop {
        let (n, fds) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            match recvmsg::<()>(conn.as_raw_fd(), &mut iov, Some(&mut cspace), MsgFlags::MSG_CMSG_CLOEXEC) {
                Ok(m) => {
                    let mut fds: Vec<OwnedFd> = Vec::new();
                    if let Ok(cmsgs) = m.cmsgs() {
                        for c in cmsgs {
                            if let ControlMessageOwned::ScmRights(v) = c {
                                // SAFETY: SCM_RIGHTS gave us new descriptors we now own.
                                fds.extend(v.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                            }
                        }
                    }
                    (m.bytes, fds)
                }
                Err(_) => break,
            }
        };
        if n == 0 {
            break; // The process closed the socket or died.
        }
        let req = match AttachMsg::decode(&buf[..n]) {
            Ok(m) if n == AttachMsg::SIZE => m,
            _ => {
                if !reply(conn.as_raw_fd(), AttachMsg::default(), status::EINVAL, &[]) {
                    break;
                }
                continue;
            }
        };
        if req.version != ATTACH_VERSION {
            if !reply(conn.as_raw_fd(), req, status::EOPNOTSUPP, &[]) {
                break;
            }
            continue;
        }
        if req.op == op::WIRE_REKEY {
            let mut out = AttachMsg { op: req.op, ..Default::default() };
            let st = if owner { wire_rekey(&wire.view, req.arg[0], &mut out) } else { status::EPERM };
            if !reply(conn.as_raw_fd(), out, st, &[]) {
                break;
            }
            continue;
        }
        if req.op == op::GANG {
            let mut out = AttachMsg { op: req.op, ..Default::default() };
            let st = if !owner {
                status::EPERM
            } else if port.is_some() || parked.is_some() {
                status::EPROTO // The scheduler's connection holds no port.
            } else {
                gang_request(&nic, req, &mut out)
            };
            if !reply(conn.as_raw_fd(), out, st, &[]) {
                break;
            }
            continue;
        }
        if port_id.is_some_and(|id| nic.gang_holds(id)) {
            // Switched out by the gang scheduler (the process should be stopped).
            if !reply(conn.as_raw_fd(), AttachMsg { op: req.op, ..Default::default() }, libc::EAGAIN, &[]) {
                break;
            }
            continue;
        }
        if !handle(&nic, &wire, conn.as_raw_fd(), pid, &mut port, &mut parked, req, fds) {
            break;
        }
        if port_id.is_none() {
            port_id = port.and_then(|p| nic.port_id(p));
        }
    }
    if let Some(p) = port {
        tracing::info!(node = nic.node, port = p, pid, "process detached: releasing its port");
        match port_id {
            Some(id) => nic.release_port_of(id, p),
            None => nic.release_port(p),
        }
    }
    if let Some(pp) = parked {
        tracing::info!(node = nic.node, addr = pp.addr, pid, "process detached while saved: discarding its context");
        nic.discard(pp);
    }
}

fn handle(
    nic: &NicShared,
    wire: &WireSeat,
    conn: RawFd,
    pid: i32,
    port: &mut Option<u16>,
    parked: &mut Option<ParkedPort>,
    req: AttachMsg,
    mut fds: Vec<OwnedFd>,
) -> bool {
    let mut out = AttachMsg { op: req.op, ..Default::default() };
    let st = match (req.op, *port) {
        (op::PORT_RESTORE, None) if parked.is_some() => {
            let (Ok(key), Some(pp)) = (u32::try_from(req.arg[0]), parked.take()) else {
                return reply(conn, out, status::ENOENT, &[]);
            };
            match nic.restore(pp, key, req.arg[1], req.arg[2]) {
                Ok(slot) => {
                    *port = Some(slot);
                    out.arg[0] = slot as u64;
                    out.arg[1] = nic.ports.lock().expect("ports")[slot as usize].as_ref().map_or(0, |s| s.addr) as u64;
                    let Some(window) = nic.sram.port_fd(slot) else {
                        return reply(conn, out, status::EOPNOTSUPP, &[]);
                    };
                    return reply(conn, out, status::OK, &[window.as_raw_fd()]);
                }
                Err((pp, e)) => {
                    *parked = Some(pp);
                    e
                }
            }
        }
        // A saved port's process may only restore it (or go).
        (_, None) if parked.is_some() => status::EPROTO,
        (op::PORT_SUSPEND, Some(p)) => nic.suspend(p).err().unwrap_or(status::OK),
        (op::PORT_RESUME, Some(p)) => nic.resume(p).err().unwrap_or(status::OK),
        (op::PORT_STABLE, Some(p)) => match nic.is_stable(p) {
            Ok(stable) => {
                out.arg[0] = stable as u64;
                status::OK
            }
            Err(e) => e,
        },
        (op::PORT_SAVE, Some(p)) => match u32::try_from(req.arg[0]) {
            Ok(key) => match nic.save(p, key, req.arg[1], req.arg[2]) {
                Ok((pp, len)) => {
                    *port = None;
                    *parked = Some(pp);
                    out.arg[0] = len;
                    status::OK
                }
                Err(e) => e,
            },
            Err(_) => status::ENOENT,
        },
        (op::STATS, _) => {
            let h = nic.header();
            out.arg[..16].copy_from_slice(&h.counters[..16]);
            out.arg[16] = h.status as u64;
            out.arg[17] = h.fail_reason as u64;
            out.arg[18] = nic.ports.lock().expect("ports").iter().filter(|p| p.is_some()).count() as u64;
            out.arg[19] = nic.node as u64;
            out.arg[20] = h.port_count as u64;
            out.arg[21] = nic.mrs_in_use() as u64;
            status::OK
        }
        (op::STATS_EXT, _) => {
            let h = nic.header();
            let ext = &h.counters[16..];
            out.arg[..ext.len()].copy_from_slice(ext);
            status::OK
        }
        (op::BUSY, _) => {
            (out.arg[0], out.arg[1]) = nic.busy.read();
            status::OK
        }
        (op::WIRE_INFO, _) => {
            wire_info(nic, wire, &mut out);
            status::OK
        }
        (op::WIRE_ROUTES, _) => routes_page(&wire.view, req.arg[0], &mut out),
        (op::WIRE_AUTH, _) => {
            auth_info(&wire.view, &mut out);
            status::OK
        }
        (op::WIRE_MCAST, _) => {
            let c = wire.view.counters.snapshot();
            out.arg[emp_uapi::attach::mcast_reply::SENT] = c.mcast_sent;
            out.arg[emp_uapi::attach::mcast_reply::RECEIVED] = c.mcast_received;
            out.arg[emp_uapi::attach::mcast_reply::FALLBACK] = c.mcast_fallback;
            status::OK
        }
        (op::ATTACH, None) => match nic.alloc_port(pid) {
            Ok(p) => {
                *port = Some(p);
                let h = nic.header();
                out.arg[ar::DAEMON_PID] = std::process::id() as u64;
                out.arg[ar::NODE] = nic.node as u64;
                // The endpoint peers use: the port's wire address.
                out.arg[ar::PORT] = nic.port_addr(p).unwrap_or(p) as u64;
                out.arg[ar::GEN] = 0;
                out.arg[ar::MTU] = h.mtu as u64;
                out.arg[ar::WINDOW_SIZE] = h.port_stride as u64;
                out.arg[ar::SEND_ENTRIES] = h.send_entries as u64;
                out.arg[ar::RECV_ENTRIES] = h.recv_entries as u64;
                out.arg[ar::FEATURES] = h.features as u64;
                out.arg[ar::PORT_COUNT] = h.port_count as u64;
                out.arg[ar::NODES] = h.route_entries as u64;
                out.arg[ar::MSG_MAX] = nic.msg_max;
                let ports = nic.ports.lock().expect("ports");
                let ps = ports[p as usize].as_ref().expect("just allocated");
                let Some(window) = nic.sram.port_fd(p) else {
                    drop(ports);
                    nic.release_port(p);
                    *port = None;
                    return reply(conn, out, status::EOPNOTSUPP, &[]);
                };
                let fds = [window.as_raw_fd(), ps.doorbell.as_raw_fd(), ps.event.as_raw_fd()];
                return reply(conn, out, status::OK, &fds);
            }
            Err(e) => e,
        },
        (op::ATTACH, Some(_)) => status::EPROTO,
        (_, None) => status::EPROTO,
        (op::REG_ARENA, Some(p)) => match (fds.len(), u8::try_from(req.arg[2])) {
            (1, Ok(access)) => match nic.reg_arena(p, fds.remove(0), req.arg[0], req.arg[1], access) {
                Ok((k, secret)) => {
                    out.arg[0] = k as u64;
                    out.arg[1] = secret as u64;
                    status::OK
                }
                Err(e) => e,
            },
            _ => status::EINVAL,
        },
        (op::REG_VM, Some(p)) => match u8::try_from(req.arg[2]) {
            Ok(access) => match nic.reg_vm(p, pid, req.arg[0], req.arg[1], access) {
                Ok((k, secret)) => {
                    out.arg[0] = k as u64;
                    out.arg[1] = secret as u64;
                    status::OK
                }
                Err(e) => e,
            },
            Err(_) => status::EINVAL,
        },
        (op::START, Some(p)) => match u32::try_from(req.arg[0]) {
            Ok(key) => nic.start(p, key, req.arg[1], req.arg[2]).err().unwrap_or(status::OK),
            Err(_) => status::EINVAL,
        },
        (op::GROUP_SET, Some(p)) => match u32::try_from(req.arg[0]) {
            Ok(key) => match nic.set_group(p, key, req.arg[1]) {
                Ok(slot) => {
                    out.arg[0] = slot as u64;
                    status::OK
                }
                Err(e) => e,
            },
            Err(_) => status::ENOENT,
        },
        (op::GROUP_CLEAR, Some(p)) => nic.clear_group(p, req.arg[0]).err().unwrap_or(status::OK),
        (op::DEREG, Some(p)) => match u32::try_from(req.arg[0]) {
            Ok(key) => nic.dereg(p, key).err().unwrap_or(status::OK),
            Err(_) => status::ENOENT,
        },
        _ => status::EOPNOTSUPP,
    };
    reply(conn, out, st, &[])
}

/// A `GANG` request: `arg[0]` = action on every port of process `arg[1]`.
fn gang_request(nic: &NicShared, req: AttachMsg, out: &mut AttachMsg) -> i32 {
    let Ok(pid) = i32::try_from(req.arg[1]) else { return status::EINVAL };
    if pid <= 0 {
        return status::EINVAL;
    }
    let r = match req.arg[0] {
        gang::SUSPEND => nic.gang_suspend(pid),
        gang::RESUME => nic.gang_resume(pid),
        gang::PORTS => Ok(nic.gang_ports(pid)),
        gang::SAVE => nic.gang_save(pid),
        gang::RESTORE => nic.gang_restore(pid),
        gang::STABLE => nic.gang_stable(pid).map(|(n, stable)| {
            out.arg[1] = stable as u64;
            n
        }),
        _ => Err(status::EINVAL),
    };
    match r {
        Ok(n) => {
            out.arg[0] = n as u64;
            status::OK
        }
        Err(e) => e,
    }
}

/// The `WIRE_INFO` reply.
fn wire_info(nic: &NicShared, wire: &WireSeat, out: &mut AttachMsg) {
    let v = &wire.view;
    out.arg[wr::KIND] = match v.kind {
        WireKindInfo::Mem => wire_kind::MEM,
        WireKindInfo::Udp => wire_kind::UDP,
        WireKindInfo::Packet { .. } => wire_kind::PACKET,
    };
    out.arg[wr::NODES] = v.routes.len() as u64;
    out.arg[wr::LOCAL_NICS] = v.interfaces.len() as u64;
    out.arg[wr::LOCAL_INDEX] = wire.local as u64;
    out.arg[wr::DAEMON_PID] = std::process::id() as u64;
    out.arg[wr::MTU] = nic.header().mtu as u64;
    let c = v.counters.snapshot();
    let counts = [
        c.frames,
        c.received,
        c.lost,
        c.duplicated,
        c.reordered,
        c.unknown_source,
        c.source_mismatch,
        c.foreign_ethertype,
        c.malformed,
    ];
    out.arg[wr::COUNTERS..wr::COUNTERS + wire_counter::COUNT].copy_from_slice(&counts);
    out.arg[wr::FROM_HOST] = c.from_host;
    let name = v.interfaces.get(wire.local).cloned().flatten().unwrap_or_default();
    let mut name_bytes = [0u8; 16];
    let n = name.len().min(15);
    name_bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
    out.arg[wr::LINK_NAME] = u64::from_le_bytes(name_bytes[..8].try_into().expect("8 bytes"));
    out.arg[wr::LINK_NAME + 1] = u64::from_le_bytes(name_bytes[8..].try_into().expect("8 bytes"));
    out.arg[wr::LINK_FLAGS] = match v.link(wire.local) {
        None => 0,
        Some(Err(e)) => {
            tracing::debug!(interface = name, "link state: {e}");
            link_flags::KNOWN | link_flags::ERROR
        }
        Some(Ok(l)) => {
            let mut mac = [0u8; 8];
            mac[2..].copy_from_slice(&l.mac);
            out.arg[wr::LINK_MTU] = l.mtu as u64;
            out.arg[wr::LINK_MAC] = u64::from_be_bytes(mac);
            link_flags::KNOWN | if l.up { link_flags::UP } else { 0 }
        }
    };
}

/// The `WIRE_AUTH` reply.
fn auth_info(v: &WireView, out: &mut AttachMsg) {
    let c = v.counters.snapshot();
    out.arg[auth_reply::BAD_TAG] = c.bad_tag;
    out.arg[auth_reply::UNKNOWN_KEY] = c.unknown_key;
    out.arg[auth_reply::REPLAYED] = c.replayed;
    let Some(a) = &v.auth else { return };
    out.arg[auth_reply::MODE] = match a.mode {
        AuthMode::Off => 0,
        AuthMode::Mac => 1,
        AuthMode::Aead => 2,
    };
    let ids = a.ids();
    out.arg[auth_reply::KEY_ID] = ids.current as u64;
    out.arg[auth_reply::NEXT_KEY_ID] = ids.next as u64;
    out.arg[auth_reply::PREVIOUS_KEY_ID] = ids.previous as u64;
    out.arg[auth_reply::TRAILER] = TRAILER as u64;
}

/// A `WIRE_REKEY` step; replies as `WIRE_AUTH`.
fn wire_rekey(v: &WireView, step: u64, out: &mut AttachMsg) -> i32 {
    let Some(a) = &v.auth else { return status::EOPNOTSUPP };
    let st = match step {
        rekey::INSTALL => match a.install() {
            Ok(_) => status::OK,
            Err(e) => {
                tracing::warn!("wire rekey refused: {e}");
                status::EINVAL
            }
        },
        rekey::SWITCH => {
            a.switch();
            status::OK
        }
        _ => status::EINVAL,
    };
    auth_info(v, out);
    st
}

/// The `WIRE_ROUTES` reply: the page of the route table from node `first`.
fn routes_page(v: &WireView, first: u64, out: &mut AttachMsg) -> i32 {
    let nodes = v.routes.len() as u64;
    if first > nodes {
        return status::EINVAL;
    }
    let count = (nodes - first).min(ROUTES_PER_PAGE as u64);
    out.arg[0] = route_page::header(nodes as u32, count as u32);
    for i in 0..count as usize {
        let w = route_page::encode(&v.route_words((first as usize + i) as u16));
        out.arg[1 + 3 * i..4 + 3 * i].copy_from_slice(&w);
    }
    status::OK
}
