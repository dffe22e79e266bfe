//! `emp bench`: OSU-style micro-benchmarks, each measured beside its
//! baseline in the same run by the same method. One file per benchmark
//! family, as rdma-core's `examples/` keeps one per pingpong:
//!
//! - [`p2p`]: `latency`, `bw`, `bibw` between two ranks, EMP beside TCP;
//! - [`rate`]: `rate`, message rate of 1…N sender/receiver pairs with the
//!   NICs' CPU time per message, EMP beside TCP;
//! - [`atomic`]: remote atomic latency, NIC-executed vs host-served;
//! - [`ctxsw`]: `ctxsw`, PM's Table 2 on the chassis: a port's save and
//!   restore time against what its buffers hold;
//! - [`coll`]: `barrier`, `bcast`, `bcast-skew`, `bcast-tput`, `allreduce`, `reduce` over
//!   `--nodes N` ranks, NIC-offloaded variants beside host baselines;
//! - [`mpi`]: `mpi`, one MPI program under Open MPI's `mpirun` over EMP's
//!   libfabric provider, libfabric tcp and udp, and shared memory.
//!
//! This file holds what they share: the options, the chassis a run starts
//! and the dispatch of a rank to its benchmark, the one way to wait for a
//! completion ([`Waiter`]), the JSON report ([`Json`], [`print_json`]) and the seeded
//! [`Rng`]. The benchmarks depend only on this module, never on each other.
//!
//! With `--json`, stdout carries the JSON document and nothing else: every
//! human-readable line goes to stderr ([`say`]).

mod atomic;
mod coll;
mod ctxsw;
mod mpi;
mod p2p;
mod rate;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use emp::coll::Wait;
use emp::rdv::Job;
use emp::{Completion, Device, Status};
use emp_config::{ClusterConfig, WireKind};
use emp_uapi::sram::counter;

use crate::cluster::{self, UpArgs};

/// Which benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// Ping-pong latency.
    Latency,
    /// Unidirectional bandwidth.
    Bw,
    /// Bidirectional bandwidth.
    Bibw,
    /// Message rate of `--pairs` sender/receiver pairs (OSU mbw_mr), with
    /// the NICs' CPU time per message.
    Rate,
    /// Remote atomic latency: NIC vs host-based responder.
    Atomic,
    /// Port context switch: save and restore time against buffer
    /// occupancy (PM's Table 2), `--iters` switches per condition.
    Ctxsw,
    /// Collective: consecutive barriers (`--nodes`, `--algo`).
    Barrier,
    /// Collective: broadcast from rank 0, closed by a leaf's 0-byte answer.
    Bcast,
    /// Collective: broadcast with random arrival skew (`--skew-us`).
    BcastSkew,
    /// Collective: back-to-back broadcasts from rank 0, time per broadcast.
    BcastTput,
    /// Collective: allreduce (sum), wall and CPU time in the call.
    Allreduce,
    /// Collective: reduce (sum) to rank 0, wall and CPU time in the call.
    Reduce,
    /// MPI under Open MPI (latency, bandwidth, message rate, barrier,
    /// allreduce) over EMP's libfabric provider, libfabric tcp and udp, and
    /// shared memory, one run (`--transports`, `--reps`, `--plot-dir`).
    Mpi,
}

impl Kind {
    /// Its name on the command line (`bcast-skew`).
    fn name(self) -> String {
        ValueEnum::to_possible_value(&self).map(|v| v.get_name().to_string()).unwrap_or_default()
    }

    /// Run by [`coll`] over `--nodes` ranks.
    pub fn is_collective(self) -> bool {
        matches!(self, Kind::Barrier | Kind::Bcast | Kind::BcastSkew | Kind::BcastTput | Kind::Allreduce | Kind::Reduce)
    }
}

/// Options shared by `emp bench` and its ranks.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Benchmark.
    #[arg(value_enum)]
    pub kind: Kind,
    /// Message sizes (comma separated); default depends on the benchmark.
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// Iterations (latency) or windows (bandwidth) per size; default scales with size.
    #[arg(long)]
    pub iters: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Skip the TCP comparison.
    #[arg(long)]
    pub no_tcp: bool,
    /// rate: post the windows' sends and receives as persistent
    /// descriptors (stored once per size, each then a 24-byte start).
    #[arg(long)]
    pub persistent: bool,
    /// Wait for completions by blocking on the port's event (arm + eventfd)
    /// instead of polling: what ranks should do when they outnumber cores
    /// (e.g. guests under TCG sharing the host's CPUs with the NIC).
    #[arg(long)]
    pub blocking: bool,
    /// Cluster directory (default: a private 2-NIC chassis for this run).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Cluster file of a running cluster (`emp cluster up --config`): the
    /// ranks run on its nodes 0, 1, … through their hosts' `launch`, as
    /// `emp run --config` starts them, and TCP goes between the same hosts
    /// over the same link (docs/cluster.md, "Benchmarks across hosts").
    #[arg(long, conflicts_with_all = ["dir", "wire"])]
    pub config: Option<PathBuf>,
    /// Rank 0's TCP address (set by `emp bench --config`): an IP address or
    /// an interface whose address rank 0 listens on and publishes.
    #[arg(long, hide = true)]
    pub tcp_at: Option<String>,
    /// What the EMP side runs over, for the report (set by `emp bench`).
    #[arg(long, hide = true)]
    pub emp_path: Option<String>,
    /// rate: sender/receiver pairs (default 1); senders on NIC 0, receivers
    /// on NIC 1 of the private chassis.
    #[arg(long)]
    pub pairs: Option<usize>,
    /// rate: messages per window (default 64, at most the port's rings);
    /// ctxsw: messages held in the full receive buffer (default 64, the
    /// NIC's eager pool).
    #[arg(long)]
    pub window: Option<usize>,
    /// The emulated NIC daemons whose CPU time `rate` reads (set by `emp bench`).
    #[arg(long, hide = true, value_delimiter = ',')]
    pub nicd_pids: Vec<i32>,
    /// Collectives: ranks (default 8), one NIC each on the private chassis.
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Collectives: variants to measure (comma separated; default: all that
    /// run the benchmark; the host baseline is always measured; `list`
    /// lists them).
    #[arg(long, value_delimiter = ',')]
    pub algo: Vec<String>,
    /// bcast-skew: mean pairwise arrival skew in µs (delays U[0, 3×skew]).
    #[arg(long, default_value_t = 333.0)]
    pub skew_us: f64,
    /// bcast: the receivers take turns answering, one per iteration, and
    /// the mean iteration time is reported (seed 002 §6.2), instead of the
    /// max over the tree's last-child leaves (seed 000 §6).
    #[arg(long)]
    pub turns: bool,
    /// allreduce/reduce: element types (comma separated; default i64,f64).
    /// `--sizes` counts elements for these.
    #[arg(long, value_delimiter = ',')]
    pub dtypes: Vec<String>,
    /// Collectives: poll for completions even with more than 2 ranks
    /// (default: block when ranks outnumber the 2 cores).
    #[arg(long)]
    pub poll: bool,
    /// Wire of the private chassis: `mem` runs every NIC in one engine
    /// thread; `udp` runs one emp-nicd per NIC, so NICs work in parallel
    /// as the papers' NIC processors did (one per host).
    #[arg(long, value_enum, default_value_t = cluster::WireKind::Mem)]
    pub wire: cluster::WireKind,
    /// rate: NIC CPUs per NIC to compare (e.g. 1,2): one private chassis
    /// per count, run one after the other in this run (docs/nic-cpus.md).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Vec<u32>,
    /// rate: NIC CPU plans to compare (base, so, ro, sr, dsr; default so
    /// when `--cpus` is given, else base).
    #[arg(long, value_delimiter = ',')]
    pub cpu_plans: Vec<String>,
    /// mpi: transports to compare (comma separated; default emp,tcp,udp,shm).
    #[arg(long, value_delimiter = ',')]
    pub transports: Vec<String>,
    /// mpi: repetitions of each measurement, the median reported (default 3).
    #[arg(long)]
    pub reps: Option<usize>,
    /// mpi: seconds one transport may take at one rank count before it is
    /// reported as failed and left out of the rest (default 240; --quick 120).
    #[arg(long)]
    pub transport_timeout: Option<u64>,
    /// mpi: a quick check that every transport runs (2 sizes, few iterations).
    #[arg(long)]
    pub quick: bool,
    /// mpi: host cores for the emulated NICs (`emp-nicd --nic-cores`, e.g.
    /// `1`), as a real NIC has processors of its own; EMP's ranks then run
    /// on the other cores, the other transports' ranks on every core.
    #[arg(long)]
    pub nic_cores: Option<String>,
    /// mpi: write one SVG plot per measure (against message size) here.
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
    /// latency, bw, bibw: run on one private chassis per setting (`on`:
    /// `emp-nicd --rx-double-buffering`, `off`), both up at once, the
    /// settings taking turns size by size, so their figures are measured
    /// side by side in one run (docs/immediate-sending.md).
    #[arg(long, value_delimiter = ',', value_name = "on,off")]
    pub rx_double_buffering: Vec<String>,
    /// latency, bw, bibw: as `--rx-double-buffering`, for Immediate Sending
    /// (`on`: `emp-nicd --immediate-sending`, `off`).
    #[arg(long, value_delimiter = ',', value_name = "on,off")]
    pub immediate_sending: Vec<String>,
}

/// `emp bench …`: starts a private chassis unless `--dir` names a running
/// cluster, runs two ranks (collectives: `--nodes`), prints rank 0's report.
pub fn bench(a: &BenchArgs) -> Result<(), String> {
    if a.kind == Kind::Mpi {
        return mpi::run(a);
    }
    if a.kind.is_collective() && a.algo.iter().any(|s| s == "list") {
        coll::list(a.kind);
        return Ok(());
    }
    if a.kind.is_collective() {
        coll::select(a.kind, &a.algo)?;
    }
    let ranks = match a.kind {
        k if k.is_collective() => a.nodes.unwrap_or(8),
        Kind::Rate => 2 * a.pairs.unwrap_or(1),
        _ => 2,
    };
    if ranks == 0 || ranks > u16::MAX as usize {
        return Err(match a.kind {
            Kind::Rate => "--pairs: 1 to 32767".to_string(),
            _ => format!("--nodes {ranks}: at least 1"),
        });
    }
    if a.kind != Kind::Rate && (a.pairs.is_some() || (a.window.is_some() && a.kind != Kind::Ctxsw)) {
        return Err("--pairs and --window are options of `emp bench rate` (ctxsw: --window, the messages held)".into());
    }
    if a.nic_cores.is_some() && a.kind != Kind::Mpi {
        return Err("--nic-cores is an option of `emp bench mpi` (elsewhere: emp-nicd --nic-cores)".into());
    }
    if a.persistent && a.kind != Kind::Rate {
        return Err("--persistent is an option of `emp bench rate`".into());
    }
    if a.window == Some(0) {
        return Err("--window 0: at least 1 message per window".into());
    }
    match (a.rx_double_buffering.is_empty(), a.immediate_sending.is_empty()) {
        (true, true) => {}
        (false, true) => return compare_nic_feature(a, ranks, NicFeature::RX_DOUBLE_BUFFERING),
        (true, false) => return compare_nic_feature(a, ranks, NicFeature::IMMEDIATE_SENDING),
        (false, false) => return Err("--rx-double-buffering and --immediate-sending: one comparison per run".into()),
    }
    if let Some(config) = &a.config {
        return bench_on_hosts(a, config, ranks);
    }
    if !a.cpus.is_empty() || !a.cpu_plans.is_empty() {
        return rate_per_plan_and_cpus(a, ranks);
    }
    // rate: every sender on NIC 0, every receiver on NIC 1 (ranks go to
    // NICs round robin), as mbw_mr runs its pairs between two nodes.
    let nics = if a.kind == Kind::Rate { 2 } else { ranks };
    let (dir, private) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => (private_chassis(a, nics)?, true),
    };
    let r = rank_argv(a, ranks).and_then(|argv| run_rate_or_other(&dir, ranks, argv, a.kind));
    if private {
        let _ = cluster::down(&dir);
        let _ = std::fs::remove_dir_all(&dir);
    }
    match r? {
        0 => Ok(()),
        c => Err(format!("benchmark ranks failed (status {c})")),
    }
}

/// Runs the ranks of a benchmark on the chassis in `dir` (rate: rank 0
/// reads the daemons' CPU accounting, their pids from the state file).
fn run_rate_or_other(dir: &Path, ranks: usize, mut argv: Vec<String>, kind: Kind) -> Result<i32, String> {
    if kind == Kind::Rate {
        // The daemons' CPU accounting is read by rank 0 on this machine.
        if let Ok(s) = cluster::read_state(dir) {
            let pids: Vec<String> = s.pids.iter().map(|p| p.to_string()).collect();
            argv.push(format!("--nicd-pids={}", pids.join(",")));
        }
    }
    crate::run::run(dir, ranks, &argv, Some(Duration::from_secs(3600)))
}

/// `emp bench rate --cpus 1,2 [--cpu-plans so,ro]`: one private chassis
/// per plan and NIC CPU count, run one after the other in this run, so
/// their figures compare under the same load.
fn rate_per_plan_and_cpus(a: &BenchArgs, ranks: usize) -> Result<(), String> {
    if a.kind != Kind::Rate {
        return Err("--cpus and --cpu-plans are options of `emp bench rate`".into());
    }
    if a.dir.is_some() || a.config.is_some() {
        return Err("--cpus and --cpu-plans start private chassis: not with --dir or --config".into());
    }
    let cpus = if a.cpus.is_empty() { vec![1] } else { a.cpus.clone() };
    if let Some(k) = cpus.iter().find(|&&k| !(1..=emp_config::NIC_CPUS_MAX).contains(&k)) {
        return Err(format!("--cpus {k}: 1 to {}", emp_config::NIC_CPUS_MAX));
    }
    let default_plan = if a.cpus.is_empty() { "base" } else { "so" };
    let plans: Vec<String> = if a.cpu_plans.is_empty() { vec![default_plan.into()] } else { a.cpu_plans.clone() };
    const PLANS: [&str; 5] = ["base", "so", "ro", "sr", "dsr"];
    if let Some(p) = plans.iter().find(|p| !PLANS.contains(&p.as_str())) {
        return Err(format!("--cpu-plans {p}: one of {}", PLANS.join(", ")));
    }
    for plan in &plans {
        for &k in &cpus {
            let mut argv = rank_argv(a, ranks)?;
            let wire = if a.wire == cluster::WireKind::Mem { "mem" } else { "udp" };
            argv.retain(|x| !x.starts_with("--emp-path="));
            argv.push(format!("--emp-path=EMP, plan {plan}, {k} NIC CPU(s) per NIC, private {wire}-wire chassis"));
            let dir = private_chassis_as(a, 2, plan, k)?;
            let r = run_rate_or_other(&dir, ranks, argv, a.kind);
            let _ = cluster::down(&dir);
            let _ = std::fs::remove_dir_all(&dir);
            match r? {
                0 => {}
                c => return Err(format!("benchmark ranks failed (status {c}) for plan {plan}, {k} NIC CPU(s)")),
            }
        }
    }
    Ok(())
}

/// `emp bench … --config F`: rank r on node r of the running cluster `F`
/// (through `emp run --config`'s launcher); TCP between the same hosts, to
/// node 0's address on the cluster's link.
fn bench_on_hosts(a: &BenchArgs, config: &Path, ranks: usize) -> Result<(), String> {
    let cfg = ClusterConfig::load(config).map_err(|e| e.to_string())?;
    if cfg.nodes.len() < ranks {
        return Err(format!(
            "{}: {} node(s); this benchmark runs {ranks} ranks, one per node",
            config.display(),
            cfg.nodes.len()
        ));
    }
    let node0 = cfg.node(0).expect("ids are 0..N");
    // TCP over the link EMP uses: node 0's interface on the packet wire
    // (rank 0 resolves its address there), its UDP address on the udp wire.
    let tcp_at = match (cfg.wire, &node0.interface, node0.udp) {
        (WireKind::Packet, Some(i), _) => Some(i.clone()),
        (_, _, Some(u)) => Some(u.ip().to_string()),
        (_, Some(i), None) => Some(i.clone()),
        (_, None, None) => None,
    };
    let mut argv = rank_argv(a, ranks)?;
    if let Some(t) = tcp_at {
        argv.push(format!("--tcp-at={t}"));
    }
    let hosts: Vec<&str> = cfg.nodes.iter().take(ranks).map(|n| n.host.as_str()).collect();
    argv.push(format!(
        "--emp-path=EMP over the {} wire, nodes 0-{} on hosts {}",
        cfg.wire.as_str(),
        ranks - 1,
        hosts.join(",")
    ));
    // The NICs' protocol counters around the run (retransmissions and
    // timeouts say where a slow figure comes from), when their sockets are
    // reachable from here (namespaces of one machine).
    let sockets: Vec<(u16, String)> =
        (0..ranks as u16).filter_map(|n| Some((n, cfg.socket(n)?.to_string_lossy().into_owned()))).collect();
    let before: Vec<Option<[u64; emp::COUNTERS]>> = sockets.iter().map(|(_, s)| emp::nic_counters_at(s).ok()).collect();
    let status = crate::run::run_on_hosts(config, None, ranks, &argv, Some(Duration::from_secs(3600)))?;
    for ((node, sock), b) in sockets.iter().zip(before) {
        let (Some(b), Ok(after)) = (b, emp::nic_counters_at(sock)) else { continue };
        let shown = ["tx_frames", "rx_frames", "retransmits", "timeouts", "duplicates", "out_of_order", "nacks_tx"];
        let deltas: Vec<String> = counter::NAMES
            .iter()
            .enumerate()
            .filter(|(_, name)| shown.contains(name))
            .map(|(i, name)| format!("{name} {}", after[i].wrapping_sub(b[i])))
            .collect();
        say(a, format!("# node {node} during the run: {}", deltas.join(", ")));
    }
    match status {
        0 => Ok(()),
        c => Err(format!("benchmark ranks failed (status {c})")),
    }
}

/// A NIC feature `emp bench` compares on and off.
struct NicFeature {
    /// The `emp bench` option and the `emp-nicd` flag (the same spelling).
    flag: &'static str,
    /// As the report names it.
    label: &'static str,
    /// The settings asked for.
    settings: fn(&BenchArgs) -> &[String],
}

impl NicFeature {
    const RX_DOUBLE_BUFFERING: NicFeature = NicFeature {
        flag: "--rx-double-buffering",
        label: "receive double buffering",
        settings: |a| &a.rx_double_buffering,
    };
    const IMMEDIATE_SENDING: NicFeature =
        NicFeature { flag: "--immediate-sending", label: "Immediate Sending", settings: |a| &a.immediate_sending };
}

/// `--rx-double-buffering on,off` or `--immediate-sending on,off`: one
/// private chassis per setting, up at once; for each size, the ranks run on
/// each chassis in turn. Every chassis is taken down on every path.
fn compare_nic_feature(a: &BenchArgs, ranks: usize, f: NicFeature) -> Result<(), String> {
    let flag = f.flag;
    if !matches!(a.kind, Kind::Latency | Kind::Bw | Kind::Bibw) {
        return Err(format!("{flag} compares latency, bw and bibw"));
    }
    if a.dir.is_some() || a.config.is_some() {
        return Err(format!("{flag} starts its own chassis: no --dir or --config"));
    }
    let mut settings = Vec::new();
    for s in (f.settings)(a) {
        let on = match s.as_str() {
            "on" => true,
            "off" => false,
            other => return Err(format!("{flag} {other:?}: on or off")),
        };
        if settings.contains(&on) {
            return Err(format!("{flag}: {s} given twice"));
        }
        settings.push(on);
    }
    let sizes: Vec<usize> = if a.sizes.is_empty() { (0..=16).map(|p| 1usize << p).collect() } else { a.sizes.clone() };
    let mut chassis: Vec<(bool, PathBuf)> = Vec::new();
    let result = (|| -> Result<(), String> {
        for (i, &on) in settings.iter().enumerate() {
            let extra = on.then(|| flag.to_string());
            chassis.push((on, private_chassis_named(a, ranks, 1 + i as u16, extra)?));
        }
        for &size in &sizes {
            for (on, dir) in &chassis {
                let one = BenchArgs {
                    sizes: vec![size],
                    rx_double_buffering: Vec::new(),
                    immediate_sending: Vec::new(),
                    ..a.clone()
                };
                let mut argv = rank_argv(&one, ranks)?;
                let setting = if *on { "on" } else { "off" };
                for arg in argv.iter_mut().filter(|s| s.starts_with("--emp-path=")) {
                    *arg += &format!(", {} {setting}", f.label);
                }
                say(a, format!("# {} B, {} {setting}", size, f.label));
                match crate::run::run(dir, ranks, &argv, Some(Duration::from_secs(3600)))? {
                    0 => {}
                    c => return Err(format!("benchmark ranks failed (status {c})")),
                }
            }
        }
        Ok(())
    })();
    for (_, dir) in &chassis {
        let _ = cluster::down(dir);
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

/// Starts a chassis of `nics` NICs for this run alone; returns its directory.
fn private_chassis(a: &BenchArgs, nics: usize) -> Result<PathBuf, String> {
    private_chassis_with(a, nics, 0, "base", 1, None)
}

/// [`private_chassis`] with NIC CPU plan `plan` and `cpus` CPUs per NIC.
fn private_chassis_as(a: &BenchArgs, nics: usize, plan: &str, cpus: u32) -> Result<PathBuf, String> {
    private_chassis_with(a, nics, 0, plan, cpus, None)
}

/// As [`private_chassis`], the `slot`-th (0–3) of this run (one run may
/// start several: their UDP ports do not overlap up to 16 NICs each), its
/// daemons given `nicd_args`.
fn private_chassis_named(a: &BenchArgs, nics: usize, slot: u16, nicd_args: Option<String>) -> Result<PathBuf, String> {
    private_chassis_with(a, nics, slot, "base", 1, nicd_args)
}

fn private_chassis_with(
    a: &BenchArgs,
    nics: usize,
    slot: u16,
    plan: &str,
    cpus: u32,
    nicd_args: Option<String>,
) -> Result<PathBuf, String> {
    if slot > 3 || (a.wire == cluster::WireKind::Udp && nics > 16 && slot > 0) {
        return Err("at most 4 private chassis per run, of at most 16 NICs on the udp wire".into());
    }
    let name = if slot == 0 { String::new() } else { format!("-{slot}") };
    let d = std::env::temp_dir().join(format!("emp-bench-{}{name}", std::process::id()));
    let up = UpArgs {
        nics: nics as u16,
        wire: a.wire,
        loss: 0.0,
        dup: 0.0,
        reorder: 0.0,
        ports: 4,
        mtu: None,
        cpu_plan: plan.into(),
        nic_cpus: cpus,
        firmware: None,
        trusted_keys: None,
        // Private: clear of a cluster someone else runs (and of this run's others).
        udp_base: 20000 + (std::process::id() % 400) as u16 * 64 + slot * 16,
        nicd_args,
    };
    let started = cluster::start(&d, &up).map_err(|e| format!("starting a chassis for the benchmark: {e}"))?;
    say(a, started);
    Ok(d)
}

/// The command line of one rank: `emp bench-rank` with the options it reads.
fn rank_argv(a: &BenchArgs, ranks: usize) -> Result<Vec<String>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut argv = vec![exe.to_string_lossy().into_owned(), "bench-rank".into(), a.kind.name()];
    if !a.sizes.is_empty() {
        argv.push(format!("--sizes={}", a.sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",")));
    }
    if let Some(i) = a.iters {
        argv.push(format!("--iters={i}"));
    }
    if a.json {
        argv.push("--json".into());
    }
    if a.no_tcp {
        argv.push("--no-tcp".into());
    }
    if a.blocking {
        argv.push("--blocking".into());
    }
    if a.persistent {
        argv.push("--persistent".into());
    }
    if let Some(w) = a.window {
        argv.push(format!("--window={w}"));
    }
    if a.dir.is_none() && a.config.is_none() {
        let nics = if a.kind == Kind::Rate { 2 } else { ranks };
        argv.push(format!(
            "--emp-path=EMP on a private {}-wire chassis of {nics} NICs",
            format!("{:?}", a.wire).to_lowercase()
        ));
    }
    if a.kind.is_collective() {
        argv.push(format!("--nodes={ranks}"));
        argv.push(format!("--skew-us={}", a.skew_us));
        if !a.algo.is_empty() {
            argv.push(format!("--algo={}", a.algo.join(",")));
        }
        if !a.dtypes.is_empty() {
            argv.push(format!("--dtypes={}", a.dtypes.join(",")));
        }
        if a.poll {
            argv.push("--poll".into());
        }
        if a.turns {
            argv.push("--turns".into());
        }
    }
    Ok(argv)
}

/// One rank of a benchmark (`emp bench-rank`, started by `emp bench`).
pub fn rank(a: &BenchArgs) -> Result<(), String> {
    if a.kind == Kind::Mpi {
        return Err("emp bench mpi has no ranks of its own: mpirun starts its program".into());
    }
    let job = Job::from_env().map_err(err)?;
    if a.kind.is_collective() {
        return coll::rank(a, job);
    }
    if a.kind == Kind::Rate {
        return rate::rank(a, &job);
    }
    if job.size != 2 {
        return Err("benchmarks run with exactly 2 ranks".into());
    }
    let dev = Device::open().map_err(err)?;
    let eps = job.endpoints(dev.endpoint()).map_err(err)?;
    match a.kind {
        Kind::Atomic => atomic::rank(a, &job, dev, &eps),
        Kind::Ctxsw => ctxsw::rank(a, &job, dev, &eps),
        _ => p2p::rank(a, &job, dev, &eps),
    }
}

/// An `emp::Error` as the benchmarks report it.
fn err(e: emp::Error) -> String {
    e.to_string()
}

/// A human-readable line: on stdout, or on stderr with `--json` (stdout
/// then carries the JSON document only, so it pipes into `jq`).
fn say(a: &BenchArgs, line: impl fmt::Display) {
    if a.json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// The one way a benchmark waits for its completions: polling the
/// completion queue and yielding the CPU between polls (the NIC and the
/// other ranks share the machine's two cores), or blocking on the port's
/// event (`Device::wait_wr`: a brief spin, then sleep).
#[derive(Clone, Copy, Debug)]
struct Waiter {
    wait: Wait,
    /// Longest wait for one work request.
    timeout: Duration,
}

impl Waiter {
    fn new(wait: Wait, timeout: Duration) -> Waiter {
        Waiter { wait, timeout }
    }

    /// `Wait::Block` when `blocking`, else `Wait::Poll`.
    fn blocking(blocking: bool, timeout: Duration) -> Waiter {
        Waiter::new(if blocking { Wait::Block } else { Wait::Poll }, timeout)
    }

    /// Waits for work request `wr`; its completion, whatever its status
    /// (`emp::Error::Timeout` after `timeout`).
    fn wr(&self, dev: &mut Device, wr: u64) -> emp::Result<Completion> {
        if self.wait == Wait::Block {
            return dev.wait_wr(wr, Some(self.timeout));
        }
        let end = Instant::now() + self.timeout;
        loop {
            if let Some(c) = dev.poll_wr(wr) {
                return Ok(c);
            }
            if Instant::now() > end {
                return Err(emp::Error::Timeout);
            }
            std::thread::yield_now();
        }
    }

    /// Waits for `wr` and requires it to have succeeded; errors name `what`.
    fn ok(&self, dev: &mut Device, wr: u64, what: &str) -> Result<Completion, String> {
        let c = self.wr(dev, wr).map_err(|e| format!("{what}: {e}"))?;
        match c.status {
            Status::Success => Ok(c),
            st => Err(format!("{what}: {}", st.as_str())),
        }
    }

    /// For benchmarks that count completions rather than wait for one:
    /// moves what completed into `buf` (blocking: waiting up to 100 ms for
    /// something to), yielding the CPU when nothing had.
    fn reap(&self, dev: &mut Device, buf: &mut [Completion]) -> emp::Result<usize> {
        let n = match self.wait {
            Wait::Block => match dev.wait_cq(buf, Some(Duration::from_millis(100))) {
                Ok(n) => n,
                Err(emp::Error::Timeout) => 0,
                Err(e) => return Err(e),
            },
            Wait::Poll => dev.poll_cq(buf),
        };
        if n == 0 {
            std::thread::yield_now();
        }
        Ok(n)
    }
}

/// A JSON value, written by hand (the tools take no serde): what the
/// reports need. Printed compact, keys in the order given.
#[derive(Clone, Debug)]
enum Json {
    Null,
    Int(u64),
    /// A number printed with this many decimals (`null` if not finite:
    /// JSON has no infinity).
    Num(f64, usize),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(&'static str, Json)>),
}

impl Json {
    fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Json::Null => f.write_str("null"),
            Json::Int(v) => write!(f, "{v}"),
            Json::Num(v, _) if !v.is_finite() => f.write_str("null"),
            Json::Num(v, decimals) => write!(f, "{v:.decimals$}"),
            Json::Str(s) => {
                f.write_str("\"")?;
                for c in s.chars() {
                    match c {
                        '"' => f.write_str("\\\"")?,
                        '\\' => f.write_str("\\\\")?,
                        c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                        c => write!(f, "{c}")?,
                    }
                }
                f.write_str("\"")
            }
            Json::Arr(items) => {
                f.write_str("[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Json::Obj(fields) => {
                f.write_str("{")?;
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{}:{v}", Json::str(*k))?;
                }
                f.write_str("}")
            }
        }
    }
}

/// Prints a run's JSON document: with `--json`, the only line on stdout.
fn print_json(doc: &Json) {
    println!("{doc}");
}

/// xorshift64*: small and seeded, so a run's random choices (e.g. the
/// skew delays) are reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_compact_escaped_and_has_no_infinities() {
        let v = Json::Obj(vec![
            ("name", Json::str("a \"λ\"\\\n")),
            ("n", Json::Int(3)),
            ("x", Json::Num(1.23456, 3)),
            ("inf", Json::Num(f64::INFINITY, 3)),
            ("rows", Json::Arr(vec![Json::Null, Json::Arr(vec![])])),
        ]);
        assert_eq!(v.to_string(), r#"{"name":"a \"λ\"\\\u000a","n":3,"x":1.235,"inf":null,"rows":[null,[]]}"#);
    }

    #[test]
    fn the_rng_is_seeded_and_unit_stays_in_range() {
        let (mut a, mut b) = (Rng(42), Rng(42));
        for _ in 0..1000 {
            let x = a.unit();
            assert!((0.0..1.0).contains(&x));
            assert_eq!(x, b.unit());
        }
        assert_ne!(Rng(1).next(), Rng(2).next());
    }
}
