//! `emp bench mpi`: one MPI benchmark program (`mpi_bench`, built from
//! fabric/test/mpi_bench.c by `make build`) run by Open MPI's `mpirun`
//! over every transport in one run, so the figures compare like with like:
//!
//! - `emp`: EMP through the libfabric provider (`libemp-fi.so`, `pml cm`,
//!   `mtl ofi`, provider `emp`) on a private chassis of `--nodes` NICs;
//! - `tcp`: libfabric's `tcp` provider through the same `mtl ofi`;
//! - `udp`: libfabric's `udp` provider under `ofi_rxd` (`udp;ofi_rxd`);
//! - `shm`: Open MPI's own shared memory (`pml ob1`, `btl self,vader`).
//!
//! Measures (osu_latency, osu_bw, osu_mbw_mr, MPI_Barrier, MPI_Allreduce)
//! are the program's; each is repeated `--reps` times in the program and
//! its median reported. Ranks 2 (every measure), then 4, … up to `--nodes`
//! (barrier and allreduce). Open MPI's collectives reach the network only
//! through point-to-point here (its `coll` framework has no component that
//! uses a libfabric provider's `FI_COLLECTIVE`), so its barrier over EMP is
//! a barrier over EMP's point-to-point; beside it this command measures
//! EMP's own NIC barrier (`emp bench barrier`, NIC variants) on the same
//! chassis, labelled as such. Output: one OSU-style table per measure with
//! a column per transport and EMP's ratio to tcp, or `--json`; with
//! `--plot-dir D`, one SVG per measure against message size (or ranks).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{print_json, say, BenchArgs, Json};
use crate::cluster::{self, UpArgs};

/// A transport `mpirun` is told to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Transport {
    Emp,
    /// As `Emp`, with libemp-mpicoll.so preloaded: MPI_Barrier and
    /// MPI_Allreduce on the NICs (collectives only).
    EmpColl,
    Tcp,
    Udp,
    Shm,
}

const TRANSPORTS: [Transport; 5] = [Transport::Emp, Transport::EmpColl, Transport::Tcp, Transport::Udp, Transport::Shm];

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Emp => "emp",
            Transport::EmpColl => "emp-coll",
            Transport::Tcp => "tcp",
            Transport::Udp => "udp",
            Transport::Shm => "shm",
        }
    }

    fn parse(s: &str) -> Result<Transport, String> {
        TRANSPORTS
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("--transports: unknown transport {s:?} (emp, emp-coll, tcp, udp, shm)"))
    }

    /// What it is, for the report.
    fn about(self) -> &'static str {
        match self {
            Transport::Emp => "pml cm, mtl ofi, libfabric provider emp (libemp-fi.so)",
            Transport::EmpColl => "emp, with libemp-mpicoll.so: MPI_Barrier, MPI_Allreduce on the NICs",
            Transport::Tcp => "pml cm, mtl ofi, libfabric provider tcp",
            Transport::Udp => "pml cm, mtl ofi, libfabric provider udp;ofi_rxd",
            Transport::Shm => "pml ob1, btl self,vader (Open MPI shared memory)",
        }
    }

    /// mpirun's MCA options selecting it.
    fn mca(self) -> Vec<&'static str> {
        let ofi = |prov| vec!["--mca", "pml", "cm", "--mca", "mtl", "ofi", "--mca", "mtl_ofi_provider_include", prov];
        match self {
            Transport::Emp | Transport::EmpColl => ofi("emp"),
            Transport::Tcp => ofi("tcp"),
            Transport::Udp => ofi("udp;ofi_rxd"),
            Transport::Shm => vec!["--mca", "pml", "ob1", "--mca", "btl", "self,vader"],
        }
    }
}

/// A measure of the program, in its output's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Measure {
    Latency,
    Bw,
    Mr,
    Barrier,
    Allreduce,
}

const MEASURES: [Measure; 5] = [Measure::Latency, Measure::Bw, Measure::Mr, Measure::Barrier, Measure::Allreduce];

impl Measure {
    fn name(self) -> &'static str {
        match self {
            Measure::Latency => "latency",
            Measure::Bw => "bw",
            Measure::Mr => "mr",
            Measure::Barrier => "barrier",
            Measure::Allreduce => "allreduce",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Measure::Latency => "MPI one-way latency, ping-pong (osu_latency), µs",
            Measure::Bw => "MPI bandwidth, windows of nonblocking sends (osu_bw), MB/s",
            Measure::Mr => "MPI message rate, 1 pair, windows (osu_mbw_mr), messages/s",
            Measure::Barrier => "MPI_Barrier, µs per call (mean over ranks)",
            Measure::Allreduce => "MPI_Allreduce (sum of doubles), µs per call (max over ranks of the mean)",
        }
    }

    /// Larger is better (rates), else smaller (times).
    fn higher_is_better(self) -> bool {
        matches!(self, Measure::Bw | Measure::Mr)
    }
}

/// One figure: (measure, ranks, size) → median (and min) per transport.
#[derive(Clone, Copy, Debug)]
struct Figure {
    median: f64,
    best: f64,
}

type Key = (Measure, usize, usize);

/// Everything a run measured.
#[derive(Default)]
struct Results {
    figures: BTreeMap<Key, BTreeMap<Transport, Figure>>,
    /// EMP's NIC barrier at each rank count: (variant, µs).
    nic_barrier: BTreeMap<usize, (String, f64)>,
    /// Transports that failed, with why (a run goes on without them).
    failed: Vec<(Transport, usize, String)>,
}

/// `result MEASURE RANKS SIZE MEDIAN MIN UNIT` lines of mpi_bench.
fn parse_results(out: &str) -> Result<Vec<(Key, Figure)>, String> {
    let mut v = Vec::new();
    for line in out.lines() {
        if let Some(e) = line.strip_prefix("error ") {
            return Err(format!("mpi_bench found wrong data: {e}"));
        }
        let Some(rest) = line.strip_prefix("result ") else { continue };
        let w: Vec<&str> = rest.split_whitespace().collect();
        let bad = || format!("mpi_bench: unreadable line {line:?}");
        if w.len() != 6 {
            return Err(bad());
        }
        let m = MEASURES.into_iter().find(|m| m.name() == w[0]).ok_or_else(bad)?;
        let ranks = w[1].parse().map_err(|_| bad())?;
        let size = w[2].parse().map_err(|_| bad())?;
        let median: f64 = w[3].parse().map_err(|_| bad())?;
        let best: f64 = w[4].parse().map_err(|_| bad())?;
        v.push(((m, ranks, size), Figure { median, best }));
    }
    Ok(v)
}

/// The rank counts collectives run at: 2, 4, 8, … and `max` itself.
fn rank_counts(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = std::iter::successors(Some(2usize), |r| Some(r * 2)).take_while(|&r| r < max).collect();
    v.push(max);
    v
}

/// Where `make build` put a file: next to `emp`, under `lib/`.
fn built(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let p = exe.parent().unwrap_or(Path::new(".")).join("lib").join(name);
    if p.exists() {
        Ok(p)
    } else {
        Err(format!("{} missing: run `make build` (fabric/build.sh builds it)", p.display()))
    }
}

fn on_path(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").iter().flat_map(std::env::split_paths).map(|d| d.join(tool)).find(|p| p.is_file())
}

/// The private chassis of a run, brought down and removed on every path.
struct Chassis {
    dir: PathBuf,
    cluster: PathBuf,
}

impl Chassis {
    fn up(a: &BenchArgs, nics: usize) -> Result<Chassis, String> {
        let dir = std::env::temp_dir().join(format!("emp-bench-mpi-{}", std::process::id()));
        let udp_base = 20000 + (std::process::id() % 400) as u16 * 64;
        let up = UpArgs {
            nics: nics as u16,
            wire: a.wire,
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            ports: 4,
            mtu: None,
            cpu_plan: "base".into(),
            nic_cpus: 1,
            firmware: None,
            trusted_keys: None,
            udp_base,
            nicd_args: a.nic_cores.as_ref().map(|c| format!("--nic-cores {c}")),
        };
        let started = cluster::start(&dir, &up).map_err(|e| format!("starting a chassis for the benchmark: {e}"))?;
        say(a, started);
        let ch = Chassis { cluster: dir.join("cluster.toml"), dir };
        // The provider finds each rank's NIC in a cluster file (EMP_CLUSTER)
        // by host and local rank: all nodes on one host, "chassis".
        let wire = format!("{:?}", a.wire).to_lowercase();
        let mut text = format!("[cluster]\nwire = \"{wire}\"\n\n[[host]]\nname = \"chassis\"\ndir = {:?}\n", ch.dir);
        for id in 0..nics {
            text.push_str(&format!("\n[[node]]\nid = {id}\nhost = \"chassis\"\n"));
            if wire == "udp" {
                text.push_str(&format!("udp = \"127.0.0.1:{}\"\n", udp_base as usize + id));
            }
        }
        std::fs::write(&ch.cluster, text).map_err(|e| format!("{}: {e}", ch.cluster.display()))?;
        Ok(ch)
    }
}

impl Drop for Chassis {
    fn drop(&mut self) {
        let _ = cluster::down(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `cmd` with its output captured, killed after `limit`.
fn output_within(mut cmd: Command, limit: Duration) -> Result<(bool, String), String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    // Drain both pipes while waiting: a full pipe would stall the job.
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = format!("{}{}", out.join().unwrap_or_default(), err.join().unwrap_or_default());
    match status {
        Some(st) => Ok((st.success(), text)),
        None => Ok((false, format!("{text}\n{KILLED}{} s)", limit.as_secs()))),
    }
}

/// The options of one run of the program.
struct Plan {
    mpirun: PathBuf,
    program: PathBuf,
    provider_dir: PathBuf,
    sizes: String,
    /// `sizes` for `udp`: the default sizes stop at [`UDP_SIZE_MAX`].
    udp_sizes: String,
    allreduce_sizes: String,
    reps: usize,
    quick: bool,
    /// One transport's job at one rank count (mpirun's `--timeout`).
    limit: Duration,
    /// With `--nic-cores`: the cores EMP's ranks run on (the others').
    emp_cores: Option<Cores>,
}

/// A set of host cores, built before a fork so the child only makes the
/// system call.
#[derive(Clone, Copy)]
struct Cores(libc::cpu_set_t);

impl Cores {
    fn of(cores: &[usize]) -> Cores {
        Cores(emp_config::cores::set_of(cores))
    }

    /// `cmd`, and every process it starts, runs on these cores.
    fn apply(self, cmd: &mut Command) {
        let set = self.0;
        // SAFETY: the closure makes one system call on a set copied before
        // the fork: nothing in it allocates or takes a lock.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(cmd, move || {
                if libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// `--nic-cores`: the NICs' cores and the rest, for EMP's ranks.
fn split_cores(list: &str) -> Result<(Vec<usize>, Vec<usize>), String> {
    let nic = emp_config::cores::parse(list).map_err(|e| format!("--nic-cores: {e}"))?;
    let all = emp_config::cores::allowed().map_err(|e| format!("sched_getaffinity: {e}"))?;
    if let Some(c) = nic.iter().find(|c| !all.contains(c)) {
        return Err(format!(
            "--nic-cores: core {c} is not one this process may run on ({})",
            emp_config::cores::show(&all)
        ));
    }
    let ranks: Vec<usize> = all.into_iter().filter(|c| !nic.contains(c)).collect();
    if ranks.is_empty() {
        return Err(format!("--nic-cores {list}: no core left for the ranks"));
    }
    Ok((nic, ranks))
}

impl Plan {
    fn command(&self, t: Transport, ranks: usize, measures: &str, ch: &Chassis) -> Command {
        let mut cmd = Command::new(&self.mpirun);
        cmd.args(["-n", &ranks.to_string(), "--bind-to", "none", "--oversubscribe"]);
        cmd.args(["--timeout", &self.limit.as_secs().to_string()]);
        // Ranks give the CPU away while they wait, whatever the transport:
        // the NIC daemons and other ranks share the cores (with more ranks
        // than cores, a spinning rank holds a core its peer needs for a
        // whole time slice), and on an idle core a yield returns at once.
        cmd.args(["--mca", "mpi_yield_when_idle", "1"]);
        cmd.args(t.mca());
        if matches!(t, Transport::Emp | Transport::EmpColl) {
            cmd.arg("-x").arg(format!("FI_PROVIDER_PATH={}", self.provider_dir.display()));
            cmd.arg("-x").arg(format!("EMP_CLUSTER={}", ch.cluster.display()));
            cmd.args(["-x", "EMP_HOST=chassis"]);
        }
        if let (Some(c), true) = (self.emp_cores, matches!(t, Transport::Emp | Transport::EmpColl)) {
            c.apply(&mut cmd);
        }
        if t == Transport::EmpColl {
            cmd.arg("-x").arg(format!("LD_PRELOAD={}", self.provider_dir.join("libemp-mpicoll.so").display()));
            // A fallback to Open MPI's collectives would be measured as the
            // NIC's: the library says so, and the run fails on it below.
            cmd.args(["-x", "EMP_MPICOLL_VERBOSE=1"]);
        }
        cmd.arg(&self.program).args(["-m", measures, "-r", &self.reps.to_string()]);
        let sizes = if t == Transport::Udp { &self.udp_sizes } else { &self.sizes };
        cmd.args(["-s", sizes, "-a", &self.allreduce_sizes]);
        if self.quick {
            cmd.arg("-q");
        }
        cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env_remove("FI_PROVIDER")
            .env_remove("EMP_DEVICE")
            .env_remove("EMP_RANK")
            .env_remove("EMP_SIZE")
            .env_remove("EMP_RDV_DIR");
        cmd
    }
}

/// The largest default message size over `udp;ofi_rxd`: its large
/// messages crawl (a 256 KiB ping-pong takes tens of ms on the 2-core
/// machine), and at 4 MiB one transport would take the run's whole time.
/// `--sizes` is taken as given.
const UDP_SIZE_MAX: usize = 256 << 10;

/// What output_within adds to the output of a job it killed.
const KILLED: &str = "(killed after ";

/// What Open MPI's `mpirun --timeout` prints when it ends a job.
const MPIRUN_TIME_LIMIT: &str = "time limit for job execution has been reached";

/// `emp bench mpi`.
pub fn run(a: &BenchArgs) -> Result<(), String> {
    if a.dir.is_some() || a.config.is_some() {
        return Err("emp bench mpi runs on a private chassis of its own (no --dir/--config)".into());
    }
    let transports: Vec<Transport> = if a.transports.is_empty() {
        TRANSPORTS.to_vec()
    } else {
        a.transports.iter().map(|s| Transport::parse(s)).collect::<Result<_, _>>()?
    };
    let max_ranks = a.nodes.unwrap_or(8);
    if !(2..=64).contains(&max_ranks) {
        return Err(format!("--nodes {max_ranks}: from 2 to 64 ranks"));
    }
    let reps = a.reps.unwrap_or(if a.quick { 1 } else { 3 });
    if !(1..=101).contains(&reps) {
        return Err(format!("--reps {reps}: from 1 to 101"));
    }
    let default_sizes: &[usize] =
        if a.quick { &[8, 4096] } else { &[8, 64, 512, 4096, 32768, 262144, 1 << 20, 4 << 20] };
    let sizes: &[usize] = if a.sizes.is_empty() { default_sizes } else { &a.sizes };
    if let Some(s) = sizes.iter().find(|&&s| s > 64 << 20) {
        return Err(format!("--sizes: {s} B is over 64 MiB"));
    }
    let limit_s = a.transport_timeout.unwrap_or(if a.quick { 120 } else { 240 });
    if !(10..=86_400).contains(&limit_s) {
        return Err(format!("--transport-timeout {limit_s}: from 10 to 86400 seconds"));
    }
    let join = |v: &[usize]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",");
    let allreduce_sizes: Vec<usize> = if a.quick { vec![8] } else { vec![8, 64, 512, 4096, 32768] };
    let split = a.nic_cores.as_deref().map(split_cores).transpose()?;
    let mpirun = on_path("mpirun").ok_or("mpirun not found: scripts/setup.sh installs openmpi-bin")?;
    let program = built("mpi_bench")?;
    let provider_dir = built("libemp-fi.so")?.parent().expect("in lib/").to_path_buf();
    let plan = Plan {
        mpirun,
        program,
        provider_dir,
        sizes: join(sizes),
        udp_sizes: if a.sizes.is_empty() {
            join(&sizes.iter().copied().filter(|&s| s <= UDP_SIZE_MAX).collect::<Vec<_>>())
        } else {
            join(sizes)
        },
        allreduce_sizes: join(&allreduce_sizes),
        reps,
        quick: a.quick,
        limit: Duration::from_secs(limit_s),
        emp_cores: split.as_ref().map(|(_, ranks)| Cores::of(ranks)),
    };
    if let Some((nic, ranks)) = &split {
        say(
            a,
            format!(
                "# emp's NICs on cores {}, its ranks on cores {}; the other transports' ranks on every core",
                emp_config::cores::show(nic),
                emp_config::cores::show(ranks)
            ),
        );
    }
    let counts = rank_counts(max_ranks);
    let ch = Chassis::up(a, max_ranks)?;
    let mut res = Results::default();
    // mpirun ends a job at the plan's limit; this kills it if even that hangs.
    let limit = plan.limit + Duration::from_secs(30);
    for &ranks in &counts {
        let all = if ranks == 2 { "latency,bw,mr,barrier,allreduce" } else { "barrier,allreduce" };
        // Transports one after another at each rank count: a noisy spell
        // of the machine hits neighbouring columns alike.
        for &t in &transports {
            if res.failed.iter().any(|(f, _, _)| *f == t) {
                continue;
            }
            // emp-coll's point-to-point is emp's.
            let measures = if t == Transport::EmpColl { "barrier,allreduce" } else { all };
            say(a, format!("# {ranks} ranks over {}: {measures}", t.name()));
            let (mut ok, out) = output_within(plan.command(t, ranks, measures, &ch), limit)?;
            // Fell back to Open MPI's collectives: not the NICs' figures.
            let fell_back = t == Transport::EmpColl && out.contains("emp-mpicoll:");
            ok &= !fell_back;
            let parsed = parse_results(&out);
            // Every figure the job printed is a finished measurement,
            // kept even when the job failed or ran out of time later.
            if let (Ok(figs), false) = (&parsed, fell_back) {
                for (k, f) in figs {
                    res.figures.entry(*k).or_default().insert(t, *f);
                }
            }
            match (ok, parsed) {
                (true, Ok(figs)) if !figs.is_empty() => {}
                // A job that ran to its end printed what it printed on
                // purpose: a line it got wrong is the program's bug.
                (true, Err(e)) => return Err(format!("{} at {ranks} ranks: {e}\n{out}", t.name())),
                _ => {
                    // Its figures are in the results already: the why is the rest.
                    let mut tail: Vec<&str> = out.lines().filter(|l| !l.starts_with("result ")).collect();
                    tail.drain(..tail.len().saturating_sub(15));
                    let timed_out = format!("timed out after {} s (--transport-timeout)", plan.limit.as_secs());
                    if out.contains(MPIRUN_TIME_LIMIT) || out.contains(KILLED) {
                        tail.push(&timed_out);
                    }
                    say(
                        a,
                        format!("# {} at {ranks} ranks failed; left out of the rest:\n{}", t.name(), tail.join("\n")),
                    );
                    res.failed.push((t, ranks, tail.join("\n")));
                }
            }
        }
        if transports.contains(&Transport::Emp) {
            match nic_barrier(a, &ch, ranks, plan.emp_cores) {
                Ok(b) => {
                    res.nic_barrier.insert(ranks, b);
                }
                Err(e) => say(a, format!("# EMP NIC barrier at {ranks} ranks: {e}")),
            }
        }
    }
    drop(ch);
    if res.figures.is_empty() {
        return Err("no transport ran the benchmark".into());
    }
    let doc = json(&res, &transports, a, reps);
    if let Some(d) = &a.plot_dir {
        plot::all(d, &res, &transports)?;
        // The JSON beside the plots too: one run gives table, JSON and plots.
        let file = d.join("mpi.json");
        std::fs::write(&file, format!("{doc}\n")).map_err(|e| format!("{}: {e}", file.display()))?;
        say(a, format!("# plots and {} in {}", file.file_name().and_then(|f| f.to_str()).unwrap_or(""), d.display()));
    }
    if a.json {
        print_json(&doc);
    } else {
        tables(&res, &transports, a, reps);
    }
    Ok(())
}

/// EMP's own barrier on the NICs (`emp bench barrier --algo nic-pe,nic-diss`
/// on the same chassis): the best NIC variant, µs per barrier.
fn nic_barrier(a: &BenchArgs, ch: &Chassis, ranks: usize, cores: Option<Cores>) -> Result<(String, f64), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    if let Some(c) = cores {
        c.apply(&mut cmd);
    }
    cmd.args(["bench", "barrier", "--algo", "nic-pe,nic-diss", "--json", "--nodes", &ranks.to_string()])
        .arg("--dir")
        .arg(&ch.dir)
        .args(["--iters", if a.quick { "200" } else { "5000" }]);
    let (ok, out) = output_within(cmd, Duration::from_secs(600))?;
    if !ok {
        return Err(format!("emp bench barrier failed:\n{out}"));
    }
    let best = nic_variants(&out)
        .into_iter()
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .ok_or_else(|| format!("no NIC variant in emp bench barrier's report:\n{out}"))?;
    Ok(best)
}

/// The `nic-*` records of `emp bench barrier --json` (coll.rs's records:
/// `{"variant":"nic-pe",…,"value":N,…}`), as (variant, value).
fn nic_variants(json: &str) -> Vec<(String, f64)> {
    let mut v = Vec::new();
    for rec in json.split("{\"variant\":\"").skip(1) {
        let Some((name, rest)) = rec.split_once('"') else { continue };
        let Some(val) = rest.split("\"value\":").nth(1) else { continue };
        let num: String =
            val.chars().take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-' || *c == 'e').collect();
        if let (true, Ok(x)) = (name.starts_with("nic"), num.parse::<f64>()) {
            v.push((name.to_string(), x));
        }
    }
    v
}

/// EMP's ratio to tcp: how many times better EMP is (> 1: EMP better).
fn gain(m: Measure, emp: f64, tcp: f64) -> f64 {
    if m.higher_is_better() {
        emp / tcp
    } else {
        tcp / emp
    }
}

fn size_label(m: Measure, ranks: usize, size: usize) -> String {
    match m {
        Measure::Barrier => format!("{ranks} ranks"),
        Measure::Allreduce => format!("{ranks}r {size}"),
        _ => size.to_string(),
    }
}

fn tables(res: &Results, transports: &[Transport], a: &BenchArgs, reps: usize) {
    println!("# emp bench mpi: Open MPI, the same program over each transport, one run; median of {reps}");
    for t in transports {
        println!("#   {:<8} {}", t.name(), t.about());
    }
    let ratio = transports.contains(&Transport::Emp) && transports.contains(&Transport::Tcp);
    for m in MEASURES {
        let rows: Vec<(&Key, &BTreeMap<Transport, Figure>)> = res.figures.iter().filter(|(k, _)| k.0 == m).collect();
        if rows.is_empty() {
            continue;
        }
        println!("\n# {}", m.title());
        let mut head = format!("# {:<10}", if m == Measure::Barrier { "Ranks" } else { "Size" });
        for t in transports {
            head.push_str(&format!(" {:>12}", t.name()));
        }
        if m == Measure::Barrier && !res.nic_barrier.is_empty() {
            head.push_str(&format!(" {:>12}", "emp-nic"));
        }
        let coll = transports.contains(&Transport::EmpColl)
            && transports.contains(&Transport::Tcp)
            && matches!(m, Measure::Barrier | Measure::Allreduce);
        if ratio {
            head.push_str(&format!(" {:>10}", "emp÷tcp"));
            if m == Measure::Barrier && !res.nic_barrier.is_empty() {
                head.push_str(&format!(" {:>10}", "nic÷tcp"));
            }
        }
        if coll {
            head.push_str(&format!(" {:>10}", "coll÷tcp"));
        }
        println!("{head}");
        for ((_, ranks, size), per) in rows {
            let mut line = format!("{:<12}", size_label(m, *ranks, *size));
            for t in transports {
                match per.get(t) {
                    Some(f) => line.push_str(&format!(" {:>12.2}", f.median)),
                    None => line.push_str(&format!(" {:>12}", "-")),
                }
            }
            let nic = res.nic_barrier.get(ranks).filter(|_| m == Measure::Barrier);
            if m == Measure::Barrier && !res.nic_barrier.is_empty() {
                match nic {
                    Some((_, us)) => line.push_str(&format!(" {us:>12.2}")),
                    None => line.push_str(&format!(" {:>12}", "-")),
                }
            }
            if ratio {
                let tcp = per.get(&Transport::Tcp).map(|f| f.median);
                match (per.get(&Transport::Emp), tcp) {
                    (Some(e), Some(t)) => line.push_str(&format!(" {:>9.2}×", gain(m, e.median, t))),
                    _ => line.push_str(&format!(" {:>10}", "-")),
                }
                if m == Measure::Barrier && !res.nic_barrier.is_empty() {
                    match (nic, tcp) {
                        (Some((_, us)), Some(t)) => line.push_str(&format!(" {:>9.2}×", t / us)),
                        _ => line.push_str(&format!(" {:>10}", "-")),
                    }
                }
            }
            if coll {
                match (per.get(&Transport::EmpColl), per.get(&Transport::Tcp)) {
                    (Some(e), Some(t)) => line.push_str(&format!(" {:>9.2}×", gain(m, e.median, t.median))),
                    _ => line.push_str(&format!(" {:>10}", "-")),
                }
            }
            println!("{line}");
        }
        if m == Measure::Barrier && !res.nic_barrier.is_empty() {
            println!(
                "# emp: Open MPI's MPI_Barrier over EMP's point-to-point (Open MPI's coll cannot reach FI_COLLECTIVE);"
            );
            let names: Vec<String> = res.nic_barrier.iter().map(|(r, (n, _))| format!("{r} ranks {n}")).collect();
            println!(
                "# emp-nic: EMP's own barrier on the NICs (emp bench barrier; best variant: {})",
                names.join(", ")
            );
        }
    }
    if ratio {
        println!(
            "\n# emp÷tcp: how many times better EMP is than libfabric tcp (time ratio tcp/emp, rate ratio emp/tcp)"
        );
    }
    for (t, ranks, why) in &res.failed {
        println!("# {} failed at {ranks} ranks: {}", t.name(), why.lines().last().unwrap_or(""));
    }
    let _ = a;
}

fn json(res: &Results, transports: &[Transport], a: &BenchArgs, reps: usize) -> Json {
    let rows = res
        .figures
        .iter()
        .map(|((m, ranks, size), per)| {
            let mut fields = vec![
                ("measure", Json::str(m.name())),
                ("ranks", Json::Int(*ranks as u64)),
                ("size", Json::Int(*size as u64)),
            ];
            let mut vals = Vec::new();
            for t in transports {
                vals.push(match per.get(t) {
                    Some(f) => Json::Obj(vec![
                        ("transport", Json::str(t.name())),
                        ("median", Json::Num(f.median, 3)),
                        ("min_or_max", Json::Num(f.best, 3)),
                    ]),
                    None => Json::Obj(vec![("transport", Json::str(t.name())), ("median", Json::Null)]),
                });
            }
            fields.push(("values", Json::Arr(vals)));
            let ratio = match (per.get(&Transport::Emp), per.get(&Transport::Tcp)) {
                (Some(e), Some(t)) => Json::Num(gain(*m, e.median, t.median), 3),
                _ => Json::Null,
            };
            fields.push(("emp_over_tcp", ratio));
            if let (Some(e), Some(t)) = (per.get(&Transport::EmpColl), per.get(&Transport::Tcp)) {
                fields.push(("emp_coll_over_tcp", Json::Num(gain(*m, e.median, t.median), 3)));
            }
            Json::Obj(fields)
        })
        .collect();
    let nic = res
        .nic_barrier
        .iter()
        .map(|(r, (v, us))| {
            Json::Obj(vec![("ranks", Json::Int(*r as u64)), ("variant", Json::str(v)), ("us", Json::Num(*us, 3))])
        })
        .collect();
    let failed = res
        .failed
        .iter()
        .map(|(t, r, why)| {
            Json::Obj(vec![
                ("transport", Json::str(t.name())),
                ("ranks", Json::Int(*r as u64)),
                ("why", Json::str(why)),
            ])
        })
        .collect();
    let units = MEASURES
        .iter()
        .map(|m| Json::Obj(vec![("measure", Json::str(m.name())), ("what", Json::str(m.title()))]))
        .collect();
    Json::Obj(vec![
        ("benchmark", Json::str("mpi")),
        ("reps", Json::Int(reps as u64)),
        ("wire", Json::str(format!("{:?}", a.wire).to_lowercase())),
        ("nic_cores", a.nic_cores.as_deref().map_or(Json::Null, Json::str)),
        (
            "transports",
            Json::Arr(
                transports
                    .iter()
                    .map(|t| Json::Obj(vec![("name", Json::str(t.name())), ("what", Json::str(t.about()))]))
                    .collect(),
            ),
        ),
        ("measures", Json::Arr(units)),
        ("emp_over_tcp", Json::str("times better than tcp: tcp/emp for times, emp/tcp for rates")),
        ("emp_coll_over_tcp", Json::str("the same for emp-coll (barrier, allreduce)")),
        ("results", Json::Arr(rows)),
        ("emp_nic_barrier", Json::Arr(nic)),
        ("failed", Json::Arr(failed)),
    ])
}

/// SVG plots, one per measure, log-log, a line per transport.
mod plot {
    use std::path::Path;

    use plotters::prelude::*;

    use super::{Measure, Results, Transport, MEASURES};

    /// One line of a plot: its legend, colour and points.
    type Line = (String, RGBColor, Vec<(f64, f64)>);

    fn color(t: Transport) -> RGBColor {
        match t {
            Transport::Emp => RGBColor(200, 30, 30),
            Transport::EmpColl => RGBColor(230, 140, 20),
            Transport::Tcp => RGBColor(30, 60, 200),
            Transport::Udp => RGBColor(30, 150, 60),
            Transport::Shm => RGBColor(120, 120, 120),
        }
    }

    /// (x, y) series of `t` for measure `m` (allreduce: at the largest rank count).
    fn series(res: &Results, m: Measure, t: Transport) -> Vec<(f64, f64)> {
        let top = res.figures.keys().filter(|k| k.0 == m).map(|k| k.1).max().unwrap_or(2);
        res.figures
            .iter()
            .filter(|(k, _)| k.0 == m && (m != Measure::Allreduce || k.1 == top))
            .filter_map(|((_, ranks, size), per)| {
                let x = if m == Measure::Barrier { *ranks } else { (*size).max(1) };
                per.get(&t).map(|f| (x as f64, f.median))
            })
            .collect()
    }

    pub fn all(dir: &Path, res: &Results, transports: &[Transport]) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for m in MEASURES {
            let mut lines: Vec<Line> = transports
                .iter()
                .map(|&t| (t.name().to_string(), color(t), series(res, m, t)))
                .filter(|(_, _, s)| !s.is_empty())
                .collect();
            if m == Measure::Barrier && !res.nic_barrier.is_empty() {
                let s = res.nic_barrier.iter().map(|(r, (_, us))| (*r as f64, *us)).collect();
                lines.push(("emp NIC barrier".into(), RGBColor(230, 140, 0), s));
            }
            if lines.is_empty() {
                continue;
            }
            let path = dir.join(format!("mpi-{}.svg", m.name()));
            draw(&path, m, &lines).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
    }

    fn draw(path: &Path, m: Measure, lines: &[Line]) -> Result<(), String> {
        let pts = lines.iter().flat_map(|l| l.2.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        // Room around the points on the log axes.
        let (x0, x1) = (x0 / 1.5, x1 * 1.5);
        let (y0, y1) = ((y0 / 2.0).max(1e-3), y1 * 2.0);
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        let e = |e: DrawingAreaErrorKind<_>| e.to_string();
        root.fill(&WHITE).map_err(e)?;
        let xdesc = if m == Measure::Barrier {
            "ranks"
        } else if m == Measure::Allreduce {
            "bytes (at the most ranks)"
        } else {
            "message size, bytes"
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(m.title(), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
            .map_err(e)?;
        chart.configure_mesh().x_desc(xdesc).y_desc(m.title().rsplit(", ").next().unwrap_or("")).draw().map_err(e)?;
        for (name, c, s) in lines {
            let c = *c;
            chart
                .draw_series(LineSeries::new(s.iter().copied(), c.stroke_width(2)))
                .map_err(e)?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
            chart.draw_series(s.iter().map(|&p| Circle::new(p, 3, c.filled()))).map_err(e)?;
        }
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(e)?;
        root.present().map_err(e)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_are_read_and_errors_refused() {
        let out =
            "# mpi_bench: 2 ranks\nresult latency 2 8 3.500 3.100 us\nnoise\nresult bw 2 1048576 900.0 950.0 MB/s\n";
        let v = parse_results(out).expect("parsed");
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].0, (Measure::Latency, 2, 8));
        assert_eq!(v[1].1.best, 950.0);
        assert!(parse_results("result latency 2 eight 1 1 us\n").is_err());
        assert!(parse_results("result warp 2 8 1 1 us\n").is_err());
        assert!(parse_results("error latency 8: data differs\n").unwrap_err().contains("wrong data"));
    }

    #[test]
    fn a_job_past_its_limit_is_killed_and_said_so() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; exec sleep 600"]);
        let (ok, out) = output_within(cmd, Duration::from_secs(1)).expect("sh runs");
        assert!(!ok, "a killed job is a failure");
        assert!(out.starts_with("started\n") && out.contains(KILLED), "{out}");
        let (ok, out) = output_within(Command::new("true"), Duration::from_secs(60)).expect("true runs");
        assert!(ok && !out.contains(KILLED), "{out}");
    }

    #[test]
    fn rank_counts_double_up_to_the_maximum() {
        assert_eq!(rank_counts(2), vec![2]);
        assert_eq!(rank_counts(8), vec![2, 4, 8]);
        assert_eq!(rank_counts(6), vec![2, 4, 6]);
    }

    #[test]
    fn nic_variants_are_read_from_the_barrier_report() {
        let j = r#"{"benchmark":"barrier","records":[{"variant":"host-pe","size":null,"metric":"us","value":30.5,"foi":1.0},{"variant":"nic-pe","size":null,"metric":"us","value":12.25,"foi":2.4},{"variant":"nic-diss","value":10.5}]}"#;
        assert_eq!(nic_variants(j), vec![("nic-pe".to_string(), 12.25), ("nic-diss".to_string(), 10.5)]);
    }

    #[test]
    fn the_ratio_is_how_many_times_better_emp_is() {
        assert_eq!(gain(Measure::Latency, 2.0, 8.0), 4.0);
        assert_eq!(gain(Measure::Bw, 2000.0, 500.0), 4.0);
    }
}
