//! `emp info` and `emp stats`: what the NICs of a running cluster say about
//! themselves. `info`: each NIC's status, its wire and link (interface,
//! up/down, MTU, MAC), the wire's counters (one set per daemon) and the
//! route table; `stats`: every NIC counter. Both work on a one-machine
//! chassis (`--dir`) and on a cluster file (`--config`): there each host
//! answers for its own NICs, run through its `launch` like `emp cluster
//! status`, and the answers are gathered here.

use std::path::{Path, PathBuf};

use emp::{Link, WireInfo};
use emp_uapi::attach::wire_counter;
use emp_uapi::sram::{counter, FailReason, NicStatus};

use crate::cluster::{read_state, socket};
use crate::hosts::{load, run_on_every_host, text, FileArgs};

/// What `emp info` and `emp stats` look at.
pub enum Target {
    /// A one-machine chassis started by `emp cluster up -n`.
    Dir(PathBuf),
    /// A cluster file (every host, or `args.host` here).
    File(FileArgs),
}

/// The NICs of one host or chassis: (node, socket).
fn nics_here(t: &Target) -> Result<(String, Vec<(u16, PathBuf)>), String> {
    match t {
        Target::Dir(d) => {
            let s = read_state(d)?;
            Ok((format!("chassis {}", d.display()), (0..s.nics).map(|n| (n, socket(d, n))).collect()))
        }
        Target::File(a) => {
            let (cfg, _) = load(a)?;
            let h = a.host.as_deref().expect("one host here");
            let nics = cfg.nodes_on(h).map(|n| (n.id, cfg.socket(n.id).expect("node of this file"))).collect();
            Ok((format!("host {h}"), nics))
        }
    }
}

fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn fmt_link(l: &Link) -> String {
    match l {
        Link::None => "-".into(),
        Link::Unreadable { interface } => format!("{interface} unreadable"),
        Link::Known { interface, up, mtu, mac } => {
            format!("{interface} {} mtu {mtu} mac {}", if *up { "up" } else { "DOWN" }, fmt_mac(mac))
        }
    }
}

/// The wire counters as `name=value` words (what scripts and tests read).
pub fn fmt_counters(w: &WireInfo) -> String {
    let counts = wire_counter::NAMES.iter().zip(&w.counters).map(|(n, v)| format!("{n}={v}"));
    counts.chain([format!("from_host={}", w.from_host)]).collect::<Vec<_>>().join(" ")
}

/// A daemon's wire authentication as one line (`auth=mac key=2 … bad_tag=0 …`).
pub fn fmt_auth(a: &emp::WireAuth) -> String {
    let mut s = format!("auth={}", a.mode);
    if a.mode != "off" {
        s += &format!(
            " key={} next_key={} previous_key={} trailer={}",
            a.key_id, a.next_key_id, a.previous_key_id, a.trailer
        );
    }
    s + &format!(" bad_tag={} unknown_key={} replayed={}", a.bad_tag, a.unknown_key, a.replayed)
}

/// The report of one host or chassis, and whether any of its NICs runs.
fn info_report(label: &str, nics: &[(u16, PathBuf)], max_routes: usize) -> (String, bool) {
    let mut out = format!("{label}\n");
    out += &format!("{:<5} {:<8} {:<24} {:>9}  {:<7} link\n", "node", "status", "reason", "ports", "wire");
    let mut any = false;
    // Daemons seen (pid → the nodes on its wire, its counters), in order.
    let mut daemons: Vec<(u32, Vec<u16>, WireInfo)> = Vec::new();
    // A NIC on a network wire whose route table to show.
    let mut route_source: Option<(u16, &Path)> = None;
    for (n, sock) in nics {
        let path = sock.to_string_lossy();
        let stats = match emp::nic_stats(&path) {
            Ok(r) => r,
            Err(e) => {
                out += &format!("{n:<5} {:<8} {e}\n", "down");
                continue;
            }
        };
        let st = NicStatus::from_u32(stats.arg[16] as u32);
        any |= st == Some(NicStatus::Running);
        let st = st.map(|s| format!("{s:?}")).unwrap_or("?".into());
        let why = FailReason::from_u32(stats.arg[17] as u32).map(|f| f.as_str()).unwrap_or("?");
        let ports = format!("{}/{}", stats.arg[18], stats.arg[20]);
        let (wire, link) = match emp::nic_wire_info(&path) {
            Ok(w) => {
                let line = (w.kind.as_str().to_string(), fmt_link(&w.link));
                if w.kind != emp::WireKind::Mem {
                    route_source.get_or_insert((*n, sock));
                }
                match daemons.iter_mut().find(|d| d.0 == w.daemon_pid) {
                    // The later read is the fresher count.
                    Some(d) => {
                        d.1.push(*n);
                        d.2 = w;
                    }
                    None => daemons.push((w.daemon_pid, vec![*n], w)),
                }
                line
            }
            Err(e) => ("?".into(), format!("wire unreadable: {e}")),
        };
        out += &format!("{n:<5} {st:<8} {why:<24} {ports:>9}  {wire:<7} {link}\n");
    }
    for (pid, nodes, w) in &daemons {
        let list: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        let shared =
            if w.local_nics as usize > nodes.len() { format!(", {} NICs on it", w.local_nics) } else { String::new() };
        out += &format!("wire of emp-nicd pid {pid} (node {}{shared}): {}\n", list.join(","), fmt_counters(w));
        let sock = nics.iter().find(|(n, _)| *n == nodes[0]).map(|(_, s)| s.to_string_lossy());
        if let Some(m) = sock.as_ref().and_then(|s| emp::nic_wire_mcast(s).ok()) {
            out += &format!(
                "  multicast: mcast_sent={} mcast_received={} mcast_fallback={}\n",
                m.sent, m.received, m.fallback
            );
        }
        if let Some(a) = sock.and_then(|s| emp::nic_wire_auth(&s).ok()) {
            out += &format!("  {}\n", fmt_auth(&a));
        }
    }
    if !daemons.is_empty() && route_source.is_none() {
        out += "routes: none (the mem wire switches between the NICs of one daemon)\n";
    }
    if let Some((n, sock)) = route_source {
        match emp::nic_routes(&sock.to_string_lossy(), 0, max_routes) {
            Ok((total, routes)) => {
                out += &format!("routes of node {n} ({total} nodes):\n");
                for r in &routes {
                    let udp = r.udp.map(|a| a.to_string()).unwrap_or("-".into());
                    let mac = r.mac.as_ref().map(fmt_mac).unwrap_or("-".into());
                    out += &format!("  node {:<5} udp {udp:<40} mac {mac}\n", r.node);
                }
                if (routes.len() as u32) < total {
                    out += &format!("  … {} more (emp info --routes {total})\n", total - routes.len() as u32);
                }
            }
            Err(e) => out += &format!("routes of node {n}: unreadable: {e}\n"),
        }
    }
    (out.trim_end().to_string(), any)
}

/// `emp info`: fails when every NIC is down.
pub fn info(t: &Target, max_routes: usize) -> Result<(), String> {
    if let Target::File(a) = t {
        if a.host.is_none() {
            let cmd = vec!["info".into(), "--routes".into(), max_routes.to_string()];
            return gather(a, &cmd);
        }
    }
    let (label, nics) = nics_here(t)?;
    let (report, any) = info_report(&label, &nics, max_routes);
    println!("{report}");
    if any {
        Ok(())
    } else {
        Err(format!("{label}: every NIC is down"))
    }
}

/// Runs `emp <cmd> --config F --host H` on every host and prints the
/// answers in the file's order; fails when no host answered.
fn gather(a: &FileArgs, cmd: &[String]) -> Result<(), String> {
    let (cfg, path) = load(a)?;
    let mut any = false;
    let mut first = true;
    for (name, o) in run_on_every_host(a.emp.as_deref(), &cfg, &path, cmd)? {
        if !first {
            println!();
        }
        first = false;
        let out = text(&o.stdout);
        if !out.is_empty() {
            println!("{out}");
        }
        if o.status.success() {
            any = true;
        } else {
            let err = text(&o.stderr);
            let err = err.strip_prefix("emp: ").unwrap_or(&err);
            if out.is_empty() {
                println!("host {name}: unreachable: {err}");
            } else {
                println!("{err}");
            }
        }
    }
    if any {
        Ok(())
    } else {
        Err("every NIC is down".into())
    }
}

/// `emp stats`: every NIC counter, a column per NIC ("-": unreachable);
/// fails when no NIC answered.
pub fn stats(t: &Target) -> Result<(), String> {
    if let Target::File(a) = t {
        if a.host.is_none() {
            return gather(a, &["stats".into()]);
        }
    }
    let (label, nics) = nics_here(t)?;
    let rows: Vec<Option<[u64; emp::COUNTERS]>> =
        nics.iter().map(|(_, s)| emp::nic_counters_at(&s.to_string_lossy()).ok()).collect();
    println!("{label}");
    print!("{:<20}", "counter");
    for (n, _) in &nics {
        print!(" {:>12}", format!("nic{n}"));
    }
    println!();
    for (i, name) in counter::NAMES.iter().enumerate() {
        print!("{name:<20}");
        for r in &rows {
            match r {
                Some(c) => print!(" {:>12}", c[i]),
                None => print!(" {:>12}", "-"),
            }
        }
        println!();
    }
    if rows.iter().any(Option::is_some) {
        Ok(())
    } else {
        Err(format!("{label}: every NIC is down"))
    }
}
