//! `emp cluster up|down|status`: a chassis of
//! emulated NICs on this machine, run as `emp-nicd` daemons in the
//! background, found through a state directory. (A cluster of many hosts,
//! from a cluster file, is `hosts.rs`.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use emp_uapi::sram::{FailReason, NicStatus};

/// Wire backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WireKind {
    /// In-process switch inside one daemon.
    Mem,
    /// UDP over loopback, one daemon per NIC.
    Udp,
}

/// `emp cluster up` options.
#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    /// NICs.
    #[arg(short = 'n', long, default_value_t = 4)]
    pub nics: u16,
    /// Wire backend.
    #[arg(long, value_enum, default_value_t = WireKind::Mem)]
    pub wire: WireKind,
    /// Frame loss probability.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Frame duplication probability.
    #[arg(long, default_value_t = 0.0)]
    pub dup: f64,
    /// Frame reordering probability.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Ports (processes) per NIC.
    #[arg(long, default_value_t = 8)]
    pub ports: u16,
    /// MTU (default: 9000, jumbo frames, on the in-memory switch; 1500 on UDP).
    #[arg(long)]
    pub mtu: Option<u32>,
    /// NIC CPU plan (base, so, ro, sr, dsr: EMP thesis ch. 3).
    #[arg(long, default_value = "base")]
    pub cpu_plan: String,
    /// CPUs per NIC (1 or 2): with 2, a two-CPU plan's CPU B gets a thread
    /// of its own in emp-nicd (docs/nic-cpus.md).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=emp_config::NIC_CPUS_MAX as i64))]
    pub nic_cpus: u32,
    /// Signed firmware image.
    #[arg(long)]
    pub firmware: Option<PathBuf>,
    /// Directory of the public keys (*.pub) the NICs trust to sign their
    /// firmware (default: $EMP_TRUSTED_KEYS, else the build tree's
    /// firmware-blobs/, else /lib/firmware/emp; never the image's directory).
    #[arg(long)]
    pub trusted_keys: Option<PathBuf>,
    /// UDP port of node 0.
    #[arg(long, default_value_t = 47000)]
    pub udp_base: u16,
    /// Extra arguments for every emp-nicd (e.g. "--overflow 8").
    #[arg(long, allow_hyphen_values = true)]
    pub nicd_args: Option<String>,
}

/// The cluster state directory: `--dir`, `$EMP_CLUSTER_DIR`, or
/// `/tmp/emp-<uid>`.
pub fn dir_or_default(d: Option<PathBuf>) -> PathBuf {
    d.or_else(|| std::env::var_os("EMP_CLUSTER_DIR").map(PathBuf::from)).unwrap_or_else(|| {
        // SAFETY: getuid has no preconditions.
        PathBuf::from(format!("/tmp/emp-{}", unsafe { libc::getuid() }))
    })
}

fn state_file(dir: &Path) -> PathBuf {
    dir.join("cluster")
}

/// Socket of NIC `n`.
pub fn socket(dir: &Path, n: u16) -> PathBuf {
    dir.join(format!("nic{n}.sock"))
}

/// A sibling binary of the running `emp` (target/release/emp-nicd), else PATH.
pub fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|p| p.join(name)))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// The firmware image: explicit, `$EMP_FIRMWARE`, ./firmware-blobs, the
/// repository's firmware-blobs next to the binary (target/release/../..), or
/// where `make install` puts it (the kernel's firmware directory).
pub(crate) fn firmware(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    let cands: Vec<PathBuf> = explicit
        .into_iter()
        .chain(std::env::var_os("EMP_FIRMWARE").map(PathBuf::from))
        .chain(Some(PathBuf::from("firmware-blobs/emp-fw.bin")))
        .chain(
            std::env::current_exe()
                .ok()
                .and_then(|e| e.ancestors().nth(3).map(|r| r.join("firmware-blobs/emp-fw.bin"))),
        )
        .chain(Some(PathBuf::from("/lib/firmware/emp/emp-fw.bin")))
        .collect();
    cands
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| format!("no firmware image (looked at {}); build it with `make firmware`", cands[0].display()))
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// Parsed state file.
pub struct State {
    /// NICs.
    pub nics: u16,
    /// Daemon pids.
    pub pids: Vec<i32>,
}

/// Reads the state of a running cluster.
pub fn read_state(dir: &Path) -> Result<State, String> {
    let text = std::fs::read_to_string(state_file(dir))
        .map_err(|_| format!("no cluster is up in {} (emp cluster up)", dir.display()))?;
    let mut nics = None;
    let mut pids = Vec::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        match w.next() {
            Some("nics") => nics = w.next().and_then(|v| v.parse().ok()),
            Some("pids") => pids = w.filter_map(|v| v.parse().ok()).collect(),
            _ => {}
        }
    }
    let nics = nics.ok_or("corrupt cluster state file")?;
    Ok(State { nics, pids })
}

/// `emp cluster up`: starts a cluster and says so on stdout.
pub fn up(dir: &Path, a: &UpArgs) -> Result<(), String> {
    println!("{}", start(dir, a)?);
    Ok(())
}

/// Starts a cluster; returns the line that says so (the caller decides
/// where it goes: `emp bench --json` keeps stdout for JSON).
pub fn start(dir: &Path, a: &UpArgs) -> Result<String, String> {
    if a.nics == 0 {
        return Err("-n must be at least 1".into());
    }
    if let Ok(s) = read_state(dir) {
        if s.pids.iter().any(|&p| alive(p)) {
            return Err(format!("a cluster is already up in {} (emp cluster down)", dir.display()));
        }
        let _ = std::fs::remove_file(state_file(dir));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let fw = firmware(a.firmware.clone())?;
    let trusted = emp_config::trusted_keys_dir(a.trusted_keys.as_deref());
    let nicd = sibling("emp-nicd");
    let groups: Vec<(u16, u16)> = match a.wire {
        WireKind::Mem => vec![(0, a.nics)],
        WireKind::Udp => (0..a.nics).map(|i| (i, 1)).collect(),
    };
    let mut pids = Vec::new();
    for (i, &(base, count)) in groups.iter().enumerate() {
        let log = std::fs::File::create(dir.join(format!("nicd.{i}.log"))).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&nicd);
        cmd.args(["--nics", &count.to_string(), "--node-base", &base.to_string(), "--nodes", &a.nics.to_string()])
            .args(["--wire", if a.wire == WireKind::Mem { "mem" } else { "udp" }])
            .args(["--loss", &a.loss.to_string(), "--dup", &a.dup.to_string(), "--reorder", &a.reorder.to_string()])
            .args(["--ports", &a.ports.to_string(), "--udp-base", &a.udp_base.to_string()])
            .args(["--cpu-plan", &a.cpu_plan, "--nic-cpus", &a.nic_cpus.to_string()])
            .args(["--mtu", &a.mtu.unwrap_or(if a.wire == WireKind::Mem { 9000 } else { 1500 }).to_string()])
            .arg("--socket-dir")
            .arg(dir)
            .arg("--firmware")
            .arg(&fw)
            .arg("--trusted")
            .arg(&trusted)
            .args(a.nicd_args.as_deref().unwrap_or("").split_whitespace())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().map_err(|e| format!("{}: {e}", nicd.display()))?;
        pids.push(child.id() as i32);
    }
    let pid_list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
    std::fs::write(state_file(dir), format!("nics {}\npids {}\n", a.nics, pid_list.join(" ")))
        .map_err(|e| e.to_string())?;
    // Wait for every NIC to serve, and check it booted.
    let end = Instant::now() + Duration::from_secs(20);
    for n in 0..a.nics {
        loop {
            match emp::nic_stats(&socket(dir, n).to_string_lossy()) {
                Ok(r) => {
                    if r.arg[16] != NicStatus::Running as u64 {
                        let why = FailReason::from_u32(r.arg[17] as u32).map(|f| f.as_str()).unwrap_or("unknown");
                        let _ = down(dir);
                        return Err(format!("NIC {n} did not boot: {why}"));
                    }
                    break;
                }
                Err(_) if Instant::now() < end && pids.iter().all(|&p| alive(p)) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => {
                    let log = std::fs::read_to_string(dir.join("nicd.0.log")).unwrap_or_default();
                    let _ = down(dir);
                    return Err(format!("NIC {n} is not serving: {e}\n{log}"));
                }
            }
        }
    }
    Ok(format!("cluster up: {} NICs ({:?} wire) in {}", a.nics, a.wire, dir.display()))
}

/// Stops a cluster.
pub fn down(dir: &Path) -> Result<(), String> {
    let s = read_state(dir)?;
    for &p in &s.pids {
        // SAFETY: sending SIGTERM to a daemon we started.
        unsafe { libc::kill(p, libc::SIGTERM) };
    }
    let end = Instant::now() + Duration::from_secs(5);
    while s.pids.iter().any(|&p| alive(p)) && Instant::now() < end {
        reap();
        std::thread::sleep(Duration::from_millis(10));
    }
    for &p in &s.pids {
        if alive(p) {
            // SAFETY: as above, escalating.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
    reap();
    for n in 0..s.nics {
        let _ = std::fs::remove_file(socket(dir, n));
    }
    let _ = std::fs::remove_file(state_file(dir));
    Ok(())
}

fn reap() {
    // SAFETY: non-blocking reap of any exited child.
    while unsafe { libc::waitpid(-1, core::ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

/// `emp cluster status`.
pub fn status(dir: &Path) -> Result<(), String> {
    let s = read_state(dir)?;
    println!("{:<5} {:<8} {:<28} {:>9}", "node", "status", "reason", "ports");
    for n in 0..s.nics {
        match emp::nic_stats(&socket(dir, n).to_string_lossy()) {
            Ok(r) => {
                let st = NicStatus::from_u32(r.arg[16] as u32).map(|s| format!("{s:?}")).unwrap_or("?".into());
                let why = FailReason::from_u32(r.arg[17] as u32).map(|f| f.as_str()).unwrap_or("?");
                println!("{:<5} {:<8} {:<28} {:>4}/{:<4}", n, st, why, r.arg[18], r.arg[20]);
            }
            Err(e) => println!("{n:<5} down     {e}"),
        }
    }
    Ok(())
}
