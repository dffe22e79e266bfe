//! The `emp` command. Each subcommand group lives in its own module; this
//! file only parses the command line and reports errors as `emp: <message>`
//! with exit status 1.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod cluster;
mod fw;
mod run;

/// EMP: OS-bypass messaging on an emulated programmable NIC.
#[derive(Parser, Debug)]
#[command(name = "emp", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Firmware images: signing keys, packing, signing, inspection.
    Fw {
        #[command(subcommand)]
        cmd: fw::FwCmd,
    },
    /// A chassis of emulated NICs on this machine.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Run a program as N ranks on the cluster (EMP_DEVICE, EMP_RANK, EMP_SIZE).
    Run {
        /// Ranks.
        #[arg(short = 'n', long)]
        n: usize,
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Kill the job after this many seconds.
        #[arg(long)]
        timeout: Option<u64>,
        /// Program and arguments.
        #[arg(trailing_var_arg = true, required = true)]
        argv: Vec<String>,
    },
    /// NIC status of the running cluster.
    Info {
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// NIC counters of the running cluster.
    Stats {
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// OSU-style micro-benchmarks, EMP beside TCP loopback.
    Bench(bench::BenchArgs),
    /// One rank of a benchmark (started by `emp bench`).
    #[command(hide = true)]
    BenchRank(bench::BenchArgs),
}

#[derive(Subcommand, Debug)]
enum ClusterCmd {
    /// Start the NICs (emp-nicd daemons) in the background.
    Up {
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        #[command(flatten)]
        args: cluster::UpArgs,
    },
    /// Stop them.
    Down {
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Show them.
    Status {
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Fw { cmd } => fw::run(cmd),
        Cmd::Cluster { cmd: ClusterCmd::Up { dir, args } } => cluster::up(&cluster::dir_or_default(dir), &args),
        Cmd::Cluster { cmd: ClusterCmd::Down { dir } } => cluster::down(&cluster::dir_or_default(dir)),
        Cmd::Cluster { cmd: ClusterCmd::Status { dir } } | Cmd::Info { dir } => {
            cluster::status(&cluster::dir_or_default(dir))
        }
        Cmd::Stats { dir } => cluster::stats(&cluster::dir_or_default(dir)),
        Cmd::Run { n, dir, timeout, argv } => {
            match run::run(&cluster::dir_or_default(dir), n, &argv, timeout.map(std::time::Duration::from_secs)) {
                Ok(0) => Ok(()),
                Ok(code) => return ExitCode::from(code.clamp(1, 255) as u8),
                Err(e) => Err(e),
            }
        }
        Cmd::Bench(a) => bench::bench(&a),
        Cmd::BenchRank(a) => bench::rank(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("emp: {msg}");
            ExitCode::FAILURE
        }
    }
}
