//! `emp cluster up|status|down --config FILE`: a cluster of many hosts,
//! described by a cluster file (docs/cluster.md).
//!
//! Every per-host step is the same `emp` command with `--host H`, run on
//! that host through the host's `launch` prefix (`ip netns exec ns`, `ssh
//! h`, or nothing): `emp cluster up --config F --host H` starts H's
//! `emp-nicd` detached and waits until H's NICs serve and have booted;
//! `status` reads them; `down` stops the daemon through its pid file. So
//! the checks run where the sockets are, and a remote host needs only
//! `emp`, `emp-nicd`, the firmware and the cluster file at the same paths.
//! Without `--host`, these run on every host at once and their answers are
//! gathered here.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use emp_config::{ClusterConfig, Host};
use emp_uapi::sram::{FailReason, NicStatus};

use crate::cluster::sibling;

/// Options of the cluster-file forms of `emp cluster`.
#[derive(Debug, Clone, Default)]
pub struct FileArgs {
    /// The cluster file.
    pub config: PathBuf,
    /// Act on this host only, here (no `launch`).
    pub host: Option<String>,
    /// Path of `emp` on the hosts (default: this `emp`).
    pub emp: Option<PathBuf>,
    /// Signed firmware image (default: the file's `firmware`, else found as
    /// for `emp cluster up -n`, on each host).
    pub firmware: Option<PathBuf>,
    /// Directory of trusted firmware-signing keys on each host (default: the
    /// file's `trusted_keys`, else as `emp_config::trusted_keys_dir` finds it).
    pub trusted_keys: Option<PathBuf>,
    /// Seconds a host may take to bring its NICs up.
    pub timeout: u64,
    /// Extra `emp-nicd` arguments (after the file's `nicd_args`).
    pub nicd_args: Option<String>,
}

/// The daemon's pid file on its host.
pub fn pidfile(h: &Host) -> PathBuf {
    h.dir.join("nicd.pid")
}

/// The daemon's log on its host.
pub fn logfile(h: &Host) -> PathBuf {
    h.dir.join("nicd.log")
}

/// The cluster file of `a`, its absolute path, and `a.host` checked to be in it.
pub fn load(a: &FileArgs) -> Result<(ClusterConfig, PathBuf), String> {
    // Absolute, so the same path works after `launch` (ssh starts in $HOME).
    let path = std::fs::canonicalize(&a.config).map_err(|e| format!("{}: {e}", a.config.display()))?;
    let cfg = ClusterConfig::load(&path).map_err(|e| e.to_string())?;
    if let Some(h) = &a.host {
        if cfg.host(h).is_none() {
            let names: Vec<&str> = cfg.hosts.iter().map(|h| h.name.as_str()).collect();
            return Err(format!("{}: no host {h:?} (hosts: {})", path.display(), names.join(", ")));
        }
    }
    Ok((cfg, path))
}

/// Is `pid` a live (not zombie) `emp-nicd`? A pid file can outlive its
/// daemon and the pid be reused: never signal anything else.
fn nicd_running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the parenthesised command name.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    if state == Some('Z') || state.is_none() {
        return false;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    Path::new(std::ffi::OsStr::new(std::str::from_utf8(argv0).unwrap_or("")))
        .file_name()
        .is_some_and(|n| n == "emp-nicd")
}

fn read_pid(h: &Host) -> Option<i32> {
    std::fs::read_to_string(pidfile(h)).ok()?.trim().parse().ok()
}

/// The last `n` lines of the host's daemon log (at most the last 16 KiB).
fn log_tail(h: &Host, n: usize) -> String {
    let Ok(mut f) = std::fs::File::open(logfile(h)) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(16 << 10)));
    let mut text = String::new();
    let _ = f.read_to_string(&mut text);
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(n)..];
    tail.iter().map(|l| format!("\n    | {l}")).collect()
}

// --- this host ------------------------------------------------------------

/// Starts this host's daemon and waits for its NICs; on failure stops it
/// again and says why (with the end of its log).
fn up_here(a: &FileArgs, cfg: &ClusterConfig, path: &Path, name: &str) -> Result<String, String> {
    let h = cfg.host(name).expect("checked by load");
    std::fs::create_dir_all(&h.dir).map_err(|e| format!("host {name}: {}: {e}", h.dir.display()))?;
    if let Some(pid) = read_pid(h).filter(|&p| nicd_running(p)) {
        return Err(format!("host {name}: emp-nicd is already running (pid {pid}); `emp cluster down` first"));
    }
    let nodes: Vec<u16> = cfg.nodes_on(name).map(|n| n.id).collect();
    for &n in &nodes {
        // A socket left by a killed daemon would answer nothing.
        let _ = std::fs::remove_file(cfg.socket(n).expect("node of this file"));
    }
    let fw = crate::cluster::firmware(a.firmware.clone().or_else(|| cfg.firmware.clone()))?;
    let trusted = emp_config::trusted_keys_dir(a.trusted_keys.as_deref().or(cfg.trusted_keys.as_deref()));
    let nicd = sibling("emp-nicd");
    let log = std::fs::File::create(logfile(h)).map_err(|e| format!("host {name}: {}: {e}", logfile(h).display()))?;
    let mut cmd = Command::new(&nicd);
    cmd.arg("--config")
        .arg(path)
        .args(["--host", name])
        .arg("--socket-dir")
        .arg(&h.dir)
        .arg("--pidfile")
        .arg(pidfile(h))
        .arg("--firmware")
        .arg(&fw)
        .arg("--trusted")
        .arg(&trusted)
        .args(&cfg.nicd_args)
        .args(a.nicd_args.as_deref().unwrap_or("").split_whitespace())
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of the
    // parent; it detaches the daemon from the launcher's session (an ssh
    // session's end must not take it down).
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("host {name}: {}: {e}", nicd.display()))?;
    let pid = child.id() as i32;
    // Written here too (the daemon writes it once serving): a daemon that
    // hangs before that can still be stopped by `down`.
    std::fs::write(pidfile(h), format!("{pid}\n")).map_err(|e| format!("{}: {e}", pidfile(h).display()))?;
    let fail = |child: &mut Child, why: String| {
        let _ = stop_pid(pid);
        let _ = child.wait();
        let _ = std::fs::remove_file(pidfile(h));
        format!("host {name}: {why}; end of {}:{}", logfile(h).display(), log_tail(h, 12))
    };
    let end = Instant::now() + Duration::from_secs(a.timeout);
    for &n in &nodes {
        let sock = cfg.socket(n).expect("node of this file");
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                let why = format!("emp-nicd exited ({st}) before node {n} served");
                return Err(fail(&mut child, why));
            }
            match emp::nic_stats(&sock.to_string_lossy()) {
                Ok(r) if r.arg[16] == NicStatus::Running as u64 => break,
                Ok(r) if r.arg[16] == NicStatus::Loading as u64 && Instant::now() < end => {}
                Ok(r) => {
                    let why = FailReason::from_u32(r.arg[17] as u32).map(|f| f.as_str()).unwrap_or("unknown");
                    return Err(fail(&mut child, format!("node {n} did not boot: {why}")));
                }
                Err(_) if Instant::now() < end => {}
                Err(e) => {
                    let why = format!("node {n} not serving at {} after {} s: {e}", sock.display(), a.timeout);
                    return Err(fail(&mut child, why));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let list: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    Ok(format!("host {name}: emp-nicd pid {pid}, node {} running", list.join(",")))
}

/// SIGTERM, up to 5 s, then SIGKILL; only if `pid` is an emp-nicd.
fn stop_pid(pid: i32) -> Result<bool, String> {
    if !nicd_running(pid) {
        return Ok(false);
    }
    // SAFETY: signalling a process checked above to be an emp-nicd.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let end = Instant::now() + Duration::from_secs(5);
    while nicd_running(pid) && Instant::now() < end {
        reap_child(pid);
        std::thread::sleep(Duration::from_millis(10));
    }
    if nicd_running(pid) {
        // SAFETY: as above, escalating.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let end = Instant::now() + Duration::from_secs(2);
        while nicd_running(pid) && Instant::now() < end {
            reap_child(pid);
            std::thread::sleep(Duration::from_millis(10));
        }
        if nicd_running(pid) {
            return Err(format!("emp-nicd pid {pid} survived SIGKILL"));
        }
    }
    Ok(true)
}

/// Reaps `pid` if it is our child (it is when `up` stops what it started).
fn reap_child(pid: i32) {
    // SAFETY: non-blocking wait for one pid; fails harmlessly if not ours.
    unsafe { libc::waitpid(pid, core::ptr::null_mut(), libc::WNOHANG) };
}

fn down_here(cfg: &ClusterConfig, name: &str) -> Result<String, String> {
    let h = cfg.host(name).expect("checked by load");
    let said = match read_pid(h) {
        None => "no emp-nicd running (no pid file)".to_string(),
        Some(pid) => match stop_pid(pid) {
            Ok(true) => format!("emp-nicd pid {pid} stopped"),
            Ok(false) => format!("emp-nicd pid {pid} was not running"),
            Err(e) => return Err(format!("host {name}: {e}")),
        },
    };
    let _ = std::fs::remove_file(pidfile(h));
    for n in cfg.nodes_on(name) {
        let _ = std::fs::remove_file(cfg.socket(n.id).expect("node of this file"));
    }
    Ok(format!("host {name}: {said}"))
}

/// One row per node of this host; true if any of them runs.
fn status_here(cfg: &ClusterConfig, name: &str) -> (Vec<String>, bool) {
    let mut rows = Vec::new();
    let mut any = false;
    for n in cfg.nodes_on(name) {
        let sock = cfg.socket(n.id).expect("node of this file");
        rows.push(match emp::nic_stats(&sock.to_string_lossy()) {
            Ok(r) => {
                let st = NicStatus::from_u32(r.arg[16] as u32);
                any |= st == Some(NicStatus::Running);
                let st = st.map(|s| format!("{s:?}")).unwrap_or("?".into());
                let why = FailReason::from_u32(r.arg[17] as u32).map(|f| f.as_str()).unwrap_or("?");
                format!("{:<5} {:<12} {:<8} {:<28} {:>4}/{:<4}", n.id, name, st, why, r.arg[18], r.arg[20])
            }
            Err(e) => format!("{:<5} {:<12} {:<8} {e}", n.id, name, "down"),
        });
    }
    (rows, any)
}

const HEADER: &str = "node  host         status   reason                       ports";

// --- every host, through `launch` -----------------------------------------

/// Words passed through a launcher that may hand them to a remote shell
/// (ssh joins its arguments with spaces): refuse what a shell would split.
pub(crate) fn shell_safe(w: &str) -> bool {
    !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./:=@%+,".contains(&b))
}

/// Starts `emp cluster <verb> --config F --host H …` on every host at once.
fn on_every_host(a: &FileArgs, cfg: &ClusterConfig, path: &Path, verb: &str) -> Result<Vec<(String, Output)>, String> {
    let mut cmd: Vec<String> = vec!["cluster".into(), verb.into()];
    if verb == "up" {
        cmd.extend(["--timeout".into(), a.timeout.to_string()]);
        if let Some(f) = &a.firmware {
            let f = std::fs::canonicalize(f).unwrap_or_else(|_| f.clone());
            cmd.extend(["--firmware".into(), f.to_string_lossy().into_owned()]);
        }
        if let Some(k) = &a.trusted_keys {
            let k = std::fs::canonicalize(k).unwrap_or_else(|_| k.clone());
            cmd.extend(["--trusted-keys".into(), k.to_string_lossy().into_owned()]);
        }
        if let Some(n) = &a.nicd_args {
            cmd.push(format!("--nicd-args={n}"));
        }
    }
    run_on_every_host(a.emp.as_deref(), cfg, path, &cmd)
}

/// Runs `emp <cmd…> --config F --host H` on every host H of the file at
/// once, each through its `launch`; returns each host's output, in the
/// file's order.
pub fn run_on_every_host(
    emp: Option<&Path>,
    cfg: &ClusterConfig,
    path: &Path,
    cmd: &[String],
) -> Result<Vec<(String, Output)>, String> {
    let emp = match emp {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe().map_err(|e| format!("cannot find this emp: {e}"))?,
    };
    let mut kids: Vec<(String, Result<Child, String>)> = Vec::new();
    for h in &cfg.hosts {
        let mut argv: Vec<String> = h.launch.clone();
        argv.push(emp.to_string_lossy().into_owned());
        argv.extend(cmd.iter().cloned());
        argv.extend(["--config".into(), path.to_string_lossy().into_owned(), "--host".into(), h.name.clone()]);
        if !h.launch.is_empty() {
            if let Some(w) = argv[h.launch.len()..].iter().find(|w| !shell_safe(w)) {
                return Err(format!("host {}: {w:?} would be split by a remote shell; use plain paths", h.name));
            }
        }
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("host {}: cannot run {:?}: {e}", h.name, argv.join(" ")));
        kids.push((h.name.clone(), child));
    }
    let mut out = Vec::new();
    for (name, child) in kids {
        let o = match child {
            Ok(c) => c.wait_with_output().map_err(|e| format!("host {name}: {e}"))?,
            Err(e) => Output {
                status: std::os::unix::process::ExitStatusExt::from_raw(127 << 8),
                stdout: Vec::new(),
                stderr: e.into_bytes(),
            },
        };
        out.push((name, o));
    }
    Ok(out)
}

/// A command's output as text, without its trailing newline.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim_end().to_string()
}

/// `emp cluster up --config F [--host H]`.
pub fn up(a: &FileArgs) -> Result<(), String> {
    let (cfg, path) = load(a)?;
    if let Some(h) = &a.host {
        println!("{}", up_here(a, &cfg, &path, h)?);
        return Ok(());
    }
    let t0 = Instant::now();
    let results = on_every_host(a, &cfg, &path, "up")?;
    let failed: Vec<String> = results
        .iter()
        .filter(|(_, o)| !o.status.success())
        .map(|(name, o)| {
            let msg = text(&o.stderr);
            let msg = msg.strip_prefix("emp: ").unwrap_or(&msg).to_string();
            if msg.is_empty() {
                format!("host {name}: launch failed ({})", o.status)
            } else {
                msg
            }
        })
        .collect();
    if !failed.is_empty() {
        // Stop what did start: the cluster is all or nothing.
        let _ = on_every_host(a, &cfg, &path, "down");
        return Err(format!("cluster up failed; stopped every host\n{}", failed.join("\n")));
    }
    for (_, o) in &results {
        println!("{}", text(&o.stdout));
    }
    println!(
        "cluster up: {} nodes on {} hosts ({} wire) in {:.1} s",
        cfg.nodes.len(),
        cfg.hosts.len(),
        cfg.wire.as_str(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `emp cluster down --config F [--host H]`.
pub fn down(a: &FileArgs) -> Result<(), String> {
    let (cfg, path) = load(a)?;
    if let Some(h) = &a.host {
        println!("{}", down_here(&cfg, h)?);
        return Ok(());
    }
    let mut bad = Vec::new();
    for (name, o) in on_every_host(a, &cfg, &path, "down")? {
        if o.status.success() {
            println!("{}", text(&o.stdout));
        } else {
            bad.push(format!("host {name}: {}", text(&o.stderr)));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("some hosts did not stop:\n{}", bad.join("\n")))
    }
}

/// `emp cluster status --config F [--host H]`: fails when every NIC is down.
pub fn status(a: &FileArgs) -> Result<(), String> {
    let (cfg, path) = load(a)?;
    if let Some(h) = &a.host {
        let (rows, any) = status_here(&cfg, h);
        println!("{}", rows.join("\n"));
        return if any { Ok(()) } else { Err(format!("host {h}: every NIC is down")) };
    }
    println!("{HEADER}");
    let mut any = false;
    for (name, o) in on_every_host(a, &cfg, &path, "status")? {
        let rows = text(&o.stdout);
        if !rows.is_empty() {
            println!("{rows}");
        }
        if o.status.success() {
            any = true;
        } else if rows.is_empty() {
            println!("-     {name:<12} unreachable {}", text(&o.stderr));
        }
    }
    if any {
        Ok(())
    } else {
        Err("every NIC is down".into())
    }
}
