//! Command-line front end of the simulator.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use emp_firmware::FlowControl;
use emp_sim::cost::CostModel;
use emp_sim::model::{self, Comparison, Experiment, Params, NODES_MAX, NODES_SIMULATED_MAX};
use emp_sim::world::Partition;
use emp_sim::{run, Report, Spec};

#[derive(Parser)]
#[command(name = "emp-sim", about = "Deterministic simulation of EMP NICs running the real control program")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    one: OneArgs,
}

#[derive(clap::Args, Clone)]
struct OneArgs {
    /// NICs.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=1000))]
    nodes: u16,
    /// Messages.
    #[arg(long, default_value_t = 1000)]
    messages: u32,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Frame loss probability.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Frame duplication probability.
    #[arg(long, default_value_t = 0.0)]
    dup: f64,
    /// Frame reordering probability.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Partition half the nodes for this many ms (starting at 0), then heal.
    #[arg(long)]
    partition_ms: Option<u64>,
    /// Largest message in bytes.
    #[arg(long, default_value_t = 65536)]
    max_size: u64,
    /// MTU.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Frames per ACK group.
    #[arg(long, default_value_t = 3)]
    group: u32,
    /// Flow control.
    #[arg(long, value_enum, default_value_t = Flow::Off)]
    flow: Flow,
    /// Overflow buffer slots for small unexpected messages (0 = EMP's drop rule).
    #[arg(long, default_value_t = 0)]
    overflow: u32,
    /// Matching mode of every port: `unexpected` (unmatched messages held,
    /// later ones go on) or `ordered-refusal` (refused, order per sender).
    #[arg(long, value_enum, default_value_t = Matching::Unexpected)]
    matching: Matching,
    /// Eager pool slots of the unexpected mode.
    #[arg(long, default_value_t = emp_firmware::Config::default().unexp_slots)]
    unexp_slots: u32,
    /// Retained-header entries of the unexpected mode.
    #[arg(long, default_value_t = emp_firmware::Config::default().unexp_headers)]
    unexp_headers: u32,
    /// Ports per NIC.
    #[arg(long, default_value_t = 1)]
    ports: u16,
    /// Remote fetch-adds on one shared counter word.
    #[arg(long, default_value_t = 0)]
    atomics: u32,
    /// Collective operations (barrier, reduce, allreduce, bcast) on one
    /// group over random endpoints, posted at skewed times.
    #[arg(long, default_value_t = 0)]
    collectives: u32,
    /// Remote writes (some with immediate data) and reads between random
    /// endpoints' RMA windows.
    #[arg(long, default_value_t = 0)]
    rma: u32,
    /// NIC CPU plan: 0 base, 1 SO, 2 RO, 3 SR, 4 DSR (EMP thesis ch. 3).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4))]
    cpu_plan: u32,
    /// The NICs' writes to host memory appear late, in random byte order,
    /// ordered only by DMA fences.
    #[arg(long)]
    weak_dma: bool,
    /// The NICs have Immediate Sending: one-frame sends go out with their
    /// payload read straight from host memory.
    #[arg(long)]
    immediate_sending: bool,
    /// Probability a send or receive is posted as a persistent descriptor
    /// (stored, then started: thesis §2.3.3).
    #[arg(long, default_value_t = 0.0)]
    persistent: f64,
}

#[derive(Clone, Copy, ValueEnum)]
enum Flow {
    Off,
    Piggyback,
    Mack,
}

#[derive(Clone, Copy, ValueEnum)]
enum Matching {
    Unexpected,
    OrderedRefusal,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run many random scenarios (every knob drawn from the seed).
    Swarm {
        /// First seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Number of seeds.
        #[arg(long, default_value_t = 100)]
        count: u64,
        /// Print each scenario's knobs and report.
        #[arg(long)]
        verbose: bool,
    },
    /// A NIC-offloaded collective against its host-based baseline under a
    /// cost model: both times and their ratio, in one deterministic run.
    Model {
        /// Which collective.
        #[arg(value_enum)]
        what: What,
        /// Ranks (every size up to 1024 is simulated; `--sweep` adds a fit).
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(2..=NODES_MAX as i64))]
        nodes: u16,
        /// Message bytes (bcast; default 16384) or vector bytes (allreduce, i64 elements; default 8).
        #[arg(long)]
        size: Option<u64>,
        /// Cost parameter set.
        #[arg(long, value_enum, default_value_t = CostSet::Paper)]
        cost: CostSet,
        /// Override one cost, e.g. `--set host_copy_ps_per_byte=0` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Also run 2, 4, … up to --nodes (at most 64) and fit a + b·log2 N.
        #[arg(long)]
        sweep: bool,
    },
    /// The EMP thesis' NIC CPU plans (seed 004 ch. 3) on per-CPU timelines:
    /// its stated latencies and bandwidths against ours, and with --plot its
    /// latency and bandwidth curves per plan (docs/thesis-cpus.md).
    Thesis {
        /// Ping-pong round trips per latency.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        iters: u32,
        /// Messages per bandwidth run.
        #[arg(long, default_value_t = 48, value_parser = clap::value_parser!(u64).range(8..=1_000_000))]
        msgs: u64,
        /// Also run every plan over message sizes and draw latency.svg,
        /// bandwidth.svg and bidirectional.svg into this directory.
        #[arg(long, value_name = "DIR")]
        plot: Option<std::path::PathBuf>,
        /// Which of a NIC's waiting events its CPU takes first (§2.2.1):
        /// the host's doorbell (`mailbox`, the Tigon2's) or a received frame.
        #[arg(long, value_enum, default_value_t = Priority::Mailbox)]
        event_priority: Priority,
    },
    /// Seed 002's evaluation and §7 model on the real control program:
    /// the paper's figures beside ours, and with --plot each of its curves
    /// beside ours as SVG (docs/rbcast-reproduction.md).
    BcastRepro {
        /// Largest group measured (a power of two from 8 up to the control
        /// program's group limit); the model always goes to 1024.
        #[arg(long, default_value_t = emp_uapi::coll::RBCAST_MEMBERS_MAX as u16)]
        nodes: u16,
        /// Broadcasts per point of the skew figure.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        skew_trials: u32,
        /// Draw fig6 … fig12 SVGs into this directory.
        #[arg(long, value_name = "DIR")]
        plot: Option<std::path::PathBuf>,
    },
    /// PM (seed 003) on the cost model with PM's parameters: Table 2
    /// (context save/restore time against buffer occupancy, through the
    /// real context switch) and Immediate Sending's effect on latency and
    /// throughput (Figs. 6–7), paper against ours (docs/immediate-sending.md).
    Pm {
        /// Ping-pong round trips per latency.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        iters: u32,
        /// Messages per throughput run (fewer than 200 overstate it: the
        /// first ones arrive in a burst).
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(8..=1_000_000))]
        msgs: u64,
        /// Also draw table2.svg, latency.svg and throughput.svg into this directory.
        #[arg(long, value_name = "DIR")]
        plot: Option<std::path::PathBuf>,
    },
    /// The swarm on every core for a given time, each seed run twice and
    /// its two results compared (determinism); reports seeds per second.
    SwarmTime {
        /// Run this long.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// First seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Worker threads (default: every core).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Seeded random fuzzing of the control program's untrusted inputs
    /// (wire frames, work descriptors) for a given time; replays one
    /// failing execution with `--replay`.
    Fuzz {
        /// What to fuzz.
        #[arg(long, value_enum)]
        target: FuzzTarget,
        /// Run this long.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Seed of the run (execution i has a seed derived from it).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Run only the execution with this seed (as a crash report gives it).
        #[arg(long)]
        replay: Option<u64>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Priority {
    Mailbox,
    MacRx,
}

#[derive(Clone, Copy, ValueEnum)]
enum FuzzTarget {
    Frames,
    Descriptors,
}

#[derive(Clone, Copy, ValueEnum)]
enum What {
    Bcast,
    Barrier,
    Allreduce,
}

#[derive(Clone, Copy, ValueEnum)]
enum CostSet {
    /// Seed 000 §2's FM/LANai 4.3 fits (emp_sim::cost).
    Paper,
    /// Free work, the simulator's default wire.
    Zero,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Swarm { seed, count, verbose }) => swarm(seed, count, verbose),
        Some(Cmd::SwarmTime { seconds, seed, threads }) => swarm_time(seconds, seed, threads),
        Some(Cmd::Fuzz { target, seconds, seed, replay }) => fuzz_cmd(target, seconds, seed, replay),
        Some(Cmd::Model { what, nodes, size, cost, set, sweep }) => model_cmd(what, nodes, size, cost, &set, sweep),
        Some(Cmd::BcastRepro { nodes, skew_trials, plot }) => bcast_repro_cmd(nodes, skew_trials, plot.as_deref()),
        Some(Cmd::Thesis { iters, msgs, plot, event_priority }) => {
            thesis_cmd(iters, msgs, plot.as_deref(), event_priority)
        }
        Some(Cmd::Pm { iters, msgs, plot }) => pm_cmd(iters, msgs, plot.as_deref()),
        None => one(&cli.one),
    }
}

fn one(a: &OneArgs) -> ExitCode {
    if !(0.0..1.0).contains(&a.loss) || !(0.0..=1.0).contains(&a.dup) || !(0.0..=1.0).contains(&a.reorder) {
        eprintln!("emp-sim: --loss must be in [0, 1), --dup and --reorder in [0, 1]");
        return ExitCode::from(2);
    }
    let mut spec = Spec::basic(a.seed, a.nodes, a.messages);
    spec.ports = a.ports.max(1);
    spec.size_max = a.max_size;
    spec.mtu = a.mtu;
    spec.group_size = a.group;
    spec.overflow_slots = a.overflow;
    spec.matching = match a.matching {
        Matching::Unexpected => emp_firmware::MatchMode::Unexpected,
        Matching::OrderedRefusal => emp_firmware::MatchMode::OrderedRefusal,
    };
    spec.unexp_slots = a.unexp_slots;
    spec.unexp_headers = a.unexp_headers;
    spec.cpu_plan = a.cpu_plan;
    spec.weak_dma = a.weak_dma;
    spec.immediate_sending = a.immediate_sending;
    if !(0.0..=1.0).contains(&a.persistent) {
        eprintln!("emp-sim: --persistent {}: a probability, 0 to 1", a.persistent);
        return ExitCode::from(2);
    }
    spec.persistent = a.persistent;
    spec.atomics = a.atomics;
    spec.collectives = a.collectives;
    spec.rma = a.rma;
    spec.flow = match a.flow {
        Flow::Off => FlowControl::Off,
        Flow::Piggyback => FlowControl::Piggyback,
        Flow::Mack => FlowControl::ModifiedAckNack,
    };
    spec.wire.loss = a.loss;
    spec.wire.dup = a.dup;
    spec.wire.reorder = a.reorder;
    spec.wire.partition = a.partition_ms.map(|ms| Partition {
        start_ns: 0,
        end_ns: ms * 1_000_000,
        side: (0..a.nodes).map(|n| n < a.nodes / 2).collect(),
    });
    if spec.partition_outlasts_budget() && (spec.atomics > 0 || spec.collectives > 0) {
        eprintln!(
            "emp-sim: a partition longer than the retry budget ({} ms) is checked for point-to-point messages \
             only: drop --atomics/--collectives",
            spec.retry_budget_ns() / 1_000_000
        );
        return ExitCode::from(2);
    }
    if !(emp_uapi::wire::MTU_MIN..=emp_uapi::wire::MTU_MAX).contains(&a.mtu) || !(1..=32).contains(&a.group) {
        eprintln!("emp-sim: --mtu must be 256..=9000 and --group 1..=32");
        return ExitCode::from(2);
    }
    let t = Instant::now();
    match run(&spec) {
        Ok(r) => {
            let wall = t.elapsed().as_secs_f64();
            println!("{}", r.render());
            // Wall-clock speed goes to stderr: stdout is identical for identical seeds.
            eprintln!("wall {:.3} s, {:.0} frames/s simulated", wall, r.wire.frames as f64 / wall);
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("{f}");
            ExitCode::FAILURE
        }
    }
}

fn swarm(seed: u64, count: u64, verbose: bool) -> ExitCode {
    let t = Instant::now();
    let (mut ok, mut failed, mut frames) = (0u64, 0u64, 0u64);
    for s in seed..seed + count {
        let spec = Spec::swarm(s);
        if verbose {
            println!("{spec:?}");
        }
        match run(&spec) {
            Ok(r) => {
                ok += 1;
                frames += r.wire.frames;
                if verbose {
                    println!("{}", r.render());
                }
            }
            Err(f) => {
                failed += 1;
                eprintln!("{f}");
            }
        }
    }
    let wall = t.elapsed().as_secs_f64();
    println!("{ok} passed, {failed} failed ({frames} frames, {:.0} frames/s)", frames as f64 / wall);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn us(ns: f64) -> String {
    format!("{:.1} µs", ns / 1000.0)
}

fn print_one(c: &Comparison) {
    println!("  NIC-offloaded {:>12}   host time per rank {:>9}   ({})", us(c.nic.ns), us(c.nic.host_cpu_ns), c.note);
    println!("  host-based    {:>12}   host time per rank {:>9}", us(c.host.ns), us(c.host.host_cpu_ns));
    println!("  ratio         {:>9.2}x   host time ratio {:>8.2}x", c.ratio(), c.host.host_cpu_ns / c.nic.host_cpu_ns);
}

fn model_cmd(what: What, nodes: u16, size: Option<u64>, set: CostSet, overrides: &[String], sweep: bool) -> ExitCode {
    let (mut p, set_name) = match set {
        CostSet::Paper => (Params::paper(), "paper"),
        CostSet::Zero => (Params::zero(), "zero"),
    };
    for o in overrides {
        if let Err(e) = p.cost.set(o) {
            eprintln!("emp-sim: --set {e}");
            return ExitCode::from(2);
        }
    }
    let (e, name, size) = match what {
        What::Bcast => (Experiment::Bcast, "bcast", size.unwrap_or(16 * 1024)),
        What::Barrier => (Experiment::Barrier, "barrier (pairwise exchange, mean of consecutive barriers)", 0),
        What::Allreduce => (Experiment::Allreduce, "allreduce (i64 sum)", size.unwrap_or(8)),
    };
    if e == Experiment::Allreduce && (size == 0 || size % 8 != 0) {
        eprintln!("emp-sim: allreduce --size must be a positive multiple of 8");
        return ExitCode::from(2);
    }
    let sized = if e == Experiment::Barrier { String::new() } else { format!(", {size} B") };
    let custom = if p.cost == CostModel::PAPER || p.cost == CostModel::ZERO { "" } else { " (with overrides)" };
    println!("model {name}, {nodes} nodes{sized}, cost {set_name}{custom}: {:?}", p.cost);
    let result = (|| -> Result<(), String> {
        if nodes <= NODES_SIMULATED_MAX {
            print_one(&e.run(&p, nodes, size)?);
        }
        if !sweep && nodes <= NODES_SIMULATED_MAX {
            return Ok(());
        }
        let points = model::sweep(e, &p, nodes, size)?;
        println!("  {:>6} {:>14} {:>14} {:>7}", "nodes", "NIC", "host", "ratio");
        for c in &points {
            println!("  {:>6} {:>14} {:>14} {:>6.2}x", c.nodes, us(c.nic.ns), us(c.host.ns), c.ratio());
        }
        if points.len() < 2 {
            return Ok(());
        }
        let pr = model::project(&points, nodes);
        let fit = |(a, b): (f64, f64)| format!("{:.2} µs + {:.2} µs·log2 N", a / 1000.0, b / 1000.0);
        println!(
            "  fit over 2..{}: NIC {}; host {}",
            points.last().expect("points").nodes,
            fit(pr.nic_fit),
            fit(pr.host_fit)
        );
        if nodes > NODES_SIMULATED_MAX {
            // Beyond the largest group the NIC variant is projected; the
            // host variant needs no group and is simulated.
            let host = e.run_host(&p, nodes, size)?;
            println!(
                "  {nodes} nodes (groups hold at most {NODES_SIMULATED_MAX} members, so the NIC variant is projected):"
            );
            println!("  NIC-offloaded {:>12}   projected", us(pr.nic_ns()));
            println!("  host-based    {:>12}   simulated (the fit projects {})", us(host.ns), us(pr.host_ns()));
            println!("  ratio         {:>9.2}x", host.ns / pr.nic_ns());
        }
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("emp-sim: model: {err}");
            ExitCode::FAILURE
        }
    }
}

fn fuzz_cmd(target: FuzzTarget, seconds: u64, seed: u64, replay: Option<u64>) -> ExitCode {
    use emp_sim::fuzz;
    let target = match target {
        FuzzTarget::Frames => fuzz::Target::Frames,
        FuzzTarget::Descriptors => fuzz::Target::Descriptors,
    };
    if let Some(s) = replay {
        return match fuzz::execute(target, s) {
            Ok(n) => {
                println!("{target:?} execution {s}: {n} inputs, clean");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("{target:?} execution {s}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let start = Instant::now();
    let r = fuzz::run(target, seed, std::time::Duration::from_secs(seconds), u64::MAX);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "fuzz {target:?} seed {seed}: {} executions ({:.0}/s), {} inputs, {} crashes",
        r.executions,
        r.executions as f64 / secs,
        r.inputs,
        r.crashes.len()
    );
    for (s, e) in &r.crashes {
        println!("crash: --replay {s}: {e}");
    }
    if r.crashes.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One seed's outcome, comparable between two runs.
fn swarm_outcome(seed: u64) -> Result<Report, String> {
    run(&Spec::swarm(seed)).map_err(|f| f.to_string())
}

fn swarm_time(seconds: u64, first: u64, threads: Option<usize>) -> ExitCode {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let threads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let next = AtomicU64::new(first);
    let done = AtomicU64::new(0);
    // (seed, what went wrong), bounded: the first 32 are enough to act on.
    let bad: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    let start = Instant::now();
    let budget = std::time::Duration::from_secs(seconds);
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| {
                while start.elapsed() < budget {
                    let s = next.fetch_add(1, Ordering::Relaxed);
                    let (a, b) = (swarm_outcome(s), swarm_outcome(s));
                    let problem = match (&a, &b) {
                        _ if a != b => Some(format!("not deterministic: {a:?} then {b:?}")),
                        (Err(e), _) => Some(e.clone()),
                        _ => None,
                    };
                    done.fetch_add(1, Ordering::Relaxed);
                    if let Some(p) = problem {
                        let mut v = bad.lock().unwrap_or_else(|e| e.into_inner());
                        if v.len() < 32 {
                            v.push((s, p));
                        }
                    }
                }
            });
        }
    });
    let wall = start.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    let bad = bad.into_inner().unwrap_or_else(|e| e.into_inner());
    let rate = n as f64 / wall;
    println!(
        "{n} seeds from {first}, each run twice, on {threads} threads in {wall:.1} s: {rate:.1} seeds/s \
         ({:.2} M seeds/day); {} failed or differed",
        rate * 86_400.0 / 1e6,
        bad.len()
    );
    for (s, p) in &bad {
        println!("seed {s}: {p}");
    }
    if bad.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn thesis_cmd(iters: u32, msgs: u64, plot: Option<&std::path::Path>, priority: Priority) -> ExitCode {
    use emp_sim::thesis::{self, Machine};
    use emp_sim::world::EventOrder;
    let mut m = Machine::thesis();
    m.order = match priority {
        Priority::Mailbox => EventOrder::MailboxFirst,
        Priority::MacRx => EventOrder::MacRxFirst,
    };
    println!(
        "EMP thesis ch. 3 on per-CPU timelines: Table 3.1/3.2 step costs, hand-off {} ns, DMA {} ps/B, GigE, MTU {}, {:?}",
        m.steps.handoff_ns,
        m.steps.dma_ps_per_byte,
        thesis::MTU,
        m.order
    );
    let result = (|| -> Result<bool, String> {
        let r = thesis::reproduce(&m, iters, msgs)?;
        println!("  {:<22} {:>14} {:>10} {:>8}  {:<4} source", "figure", "thesis", "ours", "diff", "±15%");
        let mut all = true;
        for row in &r.rows {
            let p = &row.paper;
            let stated =
                if p.low == p.high { format!("{:.2}", p.low) } else { format!("{:.0}–{:.0}", p.low, p.high) };
            let ok = row.holds();
            all &= ok;
            println!(
                "  {:<22} {:>9} {:<4} {:>10.2} {:>+7.1}%  {:<4} {}",
                p.what,
                stated,
                p.unit,
                row.ours,
                row.deviation() * 100.0,
                if ok { "yes" } else { "no" },
                p.source
            );
        }
        for j in &r.jumps {
            println!(
                "  latency jump, {}: {} B {:.2} µs -> {} B {:.2} µs ({:+.2} µs beyond the bytes)",
                j.what,
                j.below,
                j.lat_below,
                j.above,
                j.lat_above,
                j.excess()
            );
        }
        if let Some(dir) = plot {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let lat_sizes = thesis::curve_sizes(16 * 1024);
            let lat = thesis::curves(&lat_sizes, |plan, s| thesis::latency(&m, plan, s, iters.min(10)))?;
            let marks: Vec<(u64, f64)> = r.rows[..4].iter().map(|row| (10, row.paper.low)).collect();
            thesis::plot::draw(&dir.join("latency.svg"), "one-way latency (ping-pong / 2)", "µs", &lat, &marks)?;
            let bw_sizes = thesis::curve_sizes(64 * 1024);
            let bw = thesis::curves(&bw_sizes, |plan, s| thesis::bandwidth(&m, plan, s, msgs, false))?;
            let marks = [(thesis::BW_SIZE, 840.0), (thesis::BW_SIZE, 880.0), (thesis::BW_SIZE, 964.0)];
            thesis::plot::draw(&dir.join("bandwidth.svg"), "unidirectional bandwidth", "Mb/s", &bw, &marks)?;
            let bi = thesis::curves(&bw_sizes, |plan, s| thesis::bandwidth(&m, plan, s, msgs, true))?;
            let marks = [(thesis::BW_SIZE, 940.0), (thesis::BW_SIZE, 1100.0)];
            thesis::plot::draw(&dir.join("bidirectional.svg"), "bidirectional bandwidth (sum)", "Mb/s", &bi, &marks)?;
            println!("  plots: {}/{{latency,bandwidth,bidirectional}}.svg", dir.display());
        }
        Ok(all)
    })();
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("  figures outside ±15%: docs/thesis-cpus.md explains why the thesis' own numbers prevent them");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("emp-sim thesis: {e}");
            ExitCode::FAILURE
        }
    }
}

fn bcast_repro_cmd(nodes: u16, skew_trials: u32, plot: Option<&std::path::Path>) -> ExitCode {
    use emp_sim::bcast_repro::{self, Machine};
    let max = emp_uapi::coll::RBCAST_MEMBERS_MAX as u16;
    if !(8..=max).contains(&nodes) || !nodes.is_power_of_two() {
        eprintln!("emp-sim bcast-repro: --nodes {nodes}: a power of two in 8..={max} (the group's member limit)");
        return ExitCode::FAILURE;
    }
    let m = Machine::ib_sdr();
    let c = &m.cost;
    println!(
        "seed 002 reproduced: IB 4x SDR-like wire {} Gb/s, {} ns switch, MTU {}; HCA {}/{} ns per frame rx/tx, DMA {} ps/B; host post {} ns, reap {} ns, copy {} ps/B",
        m.wire.bandwidth_bps / 1_000_000_000,
        m.wire.latency_ns,
        m.mtu,
        c.nic_rx_frame_ns,
        c.nic_tx_frame_ns,
        c.nic_dma_ps_per_byte,
        c.host_post_ns,
        c.host_cqe_ns,
        c.host_copy_ps_per_byte
    );
    let started = std::time::Instant::now();
    let run = || -> Result<(), String> {
        let r = bcast_repro::reproduce(&m, nodes, skew_trials)?;
        let p = r.params;
        println!(
            "§7 parameters measured here (µs): T_pp {:.2}, T_sr {:.2}, reliable hop {:.2}, T_cc+T_ud {:.2}, T_pack {:.2}, T_um {:.2}",
            p.t_pp / 1e3,
            p.t_sr / 1e3,
            p.t_hop_rc / 1e3,
            p.t_base / 1e3,
            p.t_pack / 1e3,
            p.t_um / 1e3
        );
        println!("  {:<58} {:<36} ours", "figure", "paper");
        for row in &r.rows {
            println!("  {:<58} {:<36} {}", row.what, row.paper, row.ours);
            println!("  {:<58} {:<36} ({})", "", "", row.how);
        }
        println!(
            "Reliability under loss, 8 nodes, 64 B back to back: µs/bcast, and per bcast ACK, NAK frames, repairs"
        );
        println!(
            "  {:<34} {}",
            "scheme",
            bcast_repro::LOSSES.map(|l| format!("{:>26}", format!("{:.0} % loss", l * 100.0))).join("")
        );
        for (a, pts) in &r.loss_sweeps {
            let cells: Vec<String> = pts
                .iter()
                .map(|q| {
                    let c = q.counts;
                    format!(
                        "{:>26}",
                        format!("{:.1} | {:.1} {:.1} {:.1}", q.per_bcast / 1e3, c.acks, c.naks, c.repairs)
                    )
                })
                .collect();
            println!("  {:<34} {}", a.label(), cells.join(""));
        }
        if let Some(dir) = plot {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            for f in &r.figures {
                bcast_repro::plot::draw(dir, f)?;
            }
            println!("plots: {} ({} SVGs)", dir.display(), r.figures.len());
        }
        println!("wall time {:.1} s", started.elapsed().as_secs_f64());
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("emp-sim bcast-repro: {e}");
            ExitCode::FAILURE
        }
    }
}

fn pm_cmd(iters: u32, msgs: u64, plot: Option<&std::path::Path>) -> ExitCode {
    use emp_sim::pm::{self, Machine};
    let m = Machine::pm(true, true);
    println!(
        "PM (seed 003) on the cost model: link {} MB/s, DMA {:.1} MB/s, LANai {} µs per frame, host {} µs, MTU {}",
        pm::LINK_BPS / 8_000_000,
        1e6 / pm::DMA_PS_PER_BYTE as f64,
        pm::NIC_FRAME_NS as f64 / 1000.0,
        pm::HOST_NS as f64 / 1000.0,
        pm::MTU
    );
    let result = (|| -> Result<(), String> {
        println!("Table 2: context switch time (ms), the real PortSave/PortRestore, image DMA at the model's rate");
        println!(
            "  {:<24} {:>6} {:>6} {:>9} {:>7} {:>7} {:>9} {:>9}",
            "condition", "sends", "held", "image B", "PM save", "PM rst", "ours save", "ours rst"
        );
        let t2 = pm::table2(&m)?;
        for (t, s) in &t2 {
            println!(
                "  {:<24} {:>6} {:>6} {:>9} {:>7.2} {:>7.2} {:>9.3} {:>9.3}",
                t.what, t.sends, t.recvs, s.image_bytes, t.paper_save_ms, t.paper_restore_ms, s.save_ms, s.restore_ms
            );
        }
        let f = pm::figures(iters, msgs)?;
        println!("Stated figures (the paper's plots carry no other numbers)");
        println!("  {:<28} {:>8} {:>10} {:>8}  source", "figure", "PM", "ours", "diff");
        for (p, ours) in pm::STATED.iter().zip(f.stated) {
            println!(
                "  {:<28} {:>5.1} {:<4} {:>8.2} {:>+7.1}%  {}",
                p.what,
                p.paper,
                p.unit,
                ours,
                (ours - p.paper) / p.paper * 100.0,
                p.source
            );
        }
        println!("Fig. 6: one-way latency (µs)        Fig. 7: throughput (MB/s)");
        println!(
            "  {:>6} {:>9} {:>9} {:>7}   {:>9} {:>9} {:>9}",
            "bytes", "IS", "no IS", "IS/no", "IS+DB", "IS only", "neither"
        );
        for (i, &(size, lat_on)) in f.latency[0].1.iter().enumerate() {
            let lat_off = f.latency[1].1[i].1;
            let bw = |k: usize| f.throughput[k].1[i].1;
            println!(
                "  {:>6} {:>9.2} {:>9.2} {:>7.3}   {:>9.2} {:>9.2} {:>9.2}",
                size,
                lat_on,
                lat_off,
                lat_on / lat_off,
                bw(0),
                bw(1),
                bw(2)
            );
        }
        if let Some(dir) = plot {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let marks = [(8, pm::STATED[0].paper)];
            emp_sim::thesis::plot::draw(
                &dir.join("latency.svg"),
                "PM Fig. 6: one-way latency",
                "µs",
                &f.latency,
                &marks,
            )?;
            let marks = [(4096, pm::STATED[1].paper)];
            emp_sim::thesis::plot::draw(
                &dir.join("throughput.svg"),
                "PM Fig. 7: throughput",
                "MB/s",
                &f.throughput,
                &marks,
            )?;
            pm::plot_table2(&dir.join("table2.svg"), &t2)?;
            println!("  plots: {}/{{table2,latency,throughput}}.svg", dir.display());
        }
        Ok(())
    })();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("emp-sim pm: {e}");
            ExitCode::FAILURE
        }
    }
}
