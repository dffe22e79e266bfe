//! Command-line front end of the simulator.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use emp_firmware::FlowControl;
use emp_sim::world::Partition;
use emp_sim::{run, Spec};

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
    /// NIC CPU plan: 0 base, 1 SO, 2 RO, 3 SR, 4 DSR (EMP thesis ch. 3).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4))]
    cpu_plan: u32,
}

#[derive(Clone, Copy, ValueEnum)]
enum Flow {
    Off,
    Piggyback,
    Mack,
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Swarm { seed, count, verbose }) => swarm(seed, count, verbose),
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
    spec.cpu_plan = a.cpu_plan;
    spec.atomics = a.atomics;
    spec.collectives = a.collectives;
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
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
