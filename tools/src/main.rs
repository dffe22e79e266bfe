//! The `emp` command. Each subcommand group lives in its own module; this
//! file only parses the command line and reports errors as `emp: <message>`
//! with exit status 1.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod cluster;
mod fw;
mod gang;
mod gang_agent;
mod hosts;
mod info;
mod run;
mod soak;
mod wire;

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
    /// The wire's cluster key: make one, rotate it on a running cluster.
    Wire {
        #[command(subcommand)]
        cmd: wire::WireCmd,
    },
    /// A chassis of emulated NICs on this machine.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Gang-schedule two or more jobs on the cluster's NICs, switching every
    /// node's ports to the next job each time slice (docs/context-switch.md).
    Gang {
        /// A job: "RANKS program [args…]" (repeat for each job).
        #[arg(long = "job", required = true)]
        jobs: Vec<String>,
        /// Time slice in milliseconds.
        #[arg(long, default_value_t = 100)]
        slice_ms: u64,
        /// How long a switch waits for a job's ports to become stable before
        /// resuming them and retrying next slice, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        stable_ms: u64,
        /// Cluster directory (also where the jobs' rendezvous directories go).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// The NICs' devices through emp.ko instead of the cluster's
        /// daemons, comma-separated (e.g. /dev/emp-nic,/dev/emp-nic1): rank r
        /// uses device r mod their number. Needs CAP_SYS_ADMIN.
        #[arg(long, value_delimiter = ',')]
        devices: Vec<String>,
        /// A cluster file instead (docs/cluster.md): rank r on node r mod
        /// nodes, started, stopped and switched by an `emp gang-agent` the
        /// scheduler runs on the node's host through its `launch` (this
        /// emp's path must work there).
        #[arg(long, conflicts_with = "devices")]
        config: Option<std::path::PathBuf>,
        /// Kill every job after this many seconds.
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Run a program as N ranks on the cluster (EMP_DEVICE, EMP_RANK, EMP_SIZE).
    Run {
        /// Ranks.
        #[arg(short = 'n', long)]
        n: usize,
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Cluster file: rank r runs on node r mod nodes, on that node's host
        /// (through its `launch`).
        #[arg(long, conflicts_with = "dir")]
        config: Option<std::path::PathBuf>,
        /// With --config: the rendezvous directory, one every host sees
        /// [default: a fresh directory under $TMPDIR, enough on one machine].
        #[arg(long, requires = "config")]
        rdv_dir: Option<std::path::PathBuf>,
        /// Kill the job after this many seconds.
        #[arg(long)]
        timeout: Option<u64>,
        /// Program and arguments.
        #[arg(trailing_var_arg = true, required = true)]
        argv: Vec<String>,
    },
    /// The running cluster's NICs: status, wire, link, wire counters and
    /// routes (fails when every NIC is down).
    Info {
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        #[command(flatten)]
        file: ViewOpts,
        /// Routes to show (of each host's first NIC).
        #[arg(long, default_value_t = 32)]
        routes: usize,
    },
    /// Every NIC counter of the running cluster (fails when every NIC is down).
    Stats {
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        #[command(flatten)]
        file: ViewOpts,
    },
    /// OSU-style micro-benchmarks, EMP beside TCP loopback.
    Bench(bench::BenchArgs),
    /// One rank of a benchmark (started by `emp bench`).
    #[command(hide = true)]
    BenchRank(bench::BenchArgs),
    /// `emp gang --config`'s agent on one node's host (started by it,
    /// through the host's launch): requests on stdin, replies on stdout.
    #[command(hide = true)]
    GangAgent {
        /// The node's NIC: its daemon's socket on this host.
        #[arg(long)]
        nic: String,
    },
    /// A soak: N ranks, mixed traffic of random sizes, frame loss, ranks
    /// killed and replaced at random; every byte verified (docs/soak.md).
    Soak(soak::SoakArgs),
    /// One rank of a soak (started by `emp soak`).
    #[command(hide = true)]
    SoakRank(soak::RankArgs),
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
        #[command(flatten)]
        file: FileOpts,
        /// With --config: seconds a host may take to bring its NICs up.
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
    /// Stop them.
    Down {
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        #[command(flatten)]
        file: FileOpts,
    },
    /// Show them (fails when every NIC is down).
    Status {
        /// Cluster directory.
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        #[command(flatten)]
        file: FileOpts,
    },
}

/// A cluster of many hosts, from a cluster file (docs/cluster.md).
#[derive(clap::Args, Debug, Clone)]
struct FileOpts {
    /// Cluster file: act on every host it names, through each host's `launch`.
    #[arg(long, conflicts_with_all = ["dir", "nics", "wire", "loss", "dup", "reorder", "ports", "mtu", "cpu_plan", "udp_base"])]
    config: Option<std::path::PathBuf>,
    /// With --config: only this host, here (what the command runs on each
    /// host through its `launch`).
    #[arg(long, requires = "config")]
    host: Option<String>,
    /// With --config: path of `emp` on the hosts [default: this emp].
    #[arg(long, requires = "config")]
    emp: Option<std::path::PathBuf>,
}

/// `emp info` / `emp stats` on a cluster file.
#[derive(clap::Args, Debug, Clone)]
struct ViewOpts {
    /// Cluster file: ask every host it names, through each host's `launch`.
    #[arg(long, conflicts_with = "dir")]
    config: Option<std::path::PathBuf>,
    /// With --config: only this host, here.
    #[arg(long, requires = "config")]
    host: Option<String>,
    /// With --config: path of `emp` on the hosts [default: this emp].
    #[arg(long, requires = "config")]
    emp: Option<std::path::PathBuf>,
}

impl ViewOpts {
    fn target(&self, dir: Option<std::path::PathBuf>) -> info::Target {
        match &self.config {
            Some(c) => info::Target::File(hosts::FileArgs {
                config: c.clone(),
                host: self.host.clone(),
                emp: self.emp.clone(),
                ..Default::default()
            }),
            None => info::Target::Dir(cluster::dir_or_default(dir)),
        }
    }
}

impl FileOpts {
    fn args(&self, config: std::path::PathBuf) -> hosts::FileArgs {
        hosts::FileArgs { config, host: self.host.clone(), emp: self.emp.clone(), ..Default::default() }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Fw { cmd } => fw::run(cmd),
        Cmd::Wire { cmd } => wire::run(cmd),
        Cmd::Cluster { cmd: ClusterCmd::Up { dir, args, file, timeout } } => match file.config.clone() {
            Some(c) => hosts::up(&hosts::FileArgs {
                firmware: args.firmware.clone(),
                trusted_keys: args.trusted_keys.clone(),
                timeout,
                nicd_args: args.nicd_args.clone(),
                ..file.args(c)
            }),
            None => cluster::up(&cluster::dir_or_default(dir), &args),
        },
        Cmd::Cluster { cmd: ClusterCmd::Down { dir, file } } => match file.config.clone() {
            Some(c) => hosts::down(&file.args(c)),
            None => cluster::down(&cluster::dir_or_default(dir)),
        },
        Cmd::Cluster { cmd: ClusterCmd::Status { dir, file } } => match file.config.clone() {
            Some(c) => hosts::status(&file.args(c)),
            None => cluster::status(&cluster::dir_or_default(dir)),
        },
        Cmd::Info { dir, file, routes } => info::info(&file.target(dir), routes),
        Cmd::Stats { dir, file } => info::stats(&file.target(dir)),
        Cmd::Run { n, dir, config, rdv_dir, timeout, argv } => {
            let timeout = timeout.map(std::time::Duration::from_secs);
            let job = match config {
                Some(c) => run::run_on_hosts(&c, rdv_dir, n, &argv, timeout),
                None => run::run(&cluster::dir_or_default(dir), n, &argv, timeout),
            };
            match job {
                Ok(0) => Ok(()),
                Ok(code) => return ExitCode::from(code.clamp(1, 255) as u8),
                Err(e) => Err(e),
            }
        }
        Cmd::Gang { jobs, slice_ms, stable_ms, dir, devices, config, timeout } => {
            let args = gang::GangArgs {
                dir: cluster::dir_or_default(dir),
                devices,
                config,
                jobs,
                slice: std::time::Duration::from_millis(slice_ms),
                stable: std::time::Duration::from_millis(stable_ms),
                timeout: timeout.map(std::time::Duration::from_secs),
            };
            match gang::gang(&args) {
                Ok(0) => Ok(()),
                Ok(code) => return ExitCode::from(code.clamp(1, 255) as u8),
                Err(e) => Err(e),
            }
        }
        Cmd::Bench(a) => bench::bench(&a),
        Cmd::BenchRank(a) => bench::rank(&a),
        Cmd::GangAgent { nic } => gang_agent::serve(&nic).map(|_| ()),
        Cmd::Soak(a) => soak::soak(&a),
        Cmd::SoakRank(a) => soak::rank(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("emp: {msg}");
            ExitCode::FAILURE
        }
    }
}
