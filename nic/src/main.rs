//! `emp-nicd`: hosts one or more emulated EMP NICs (a chassis) on a wire,
//! each loading and verifying a signed control-program image, each serving
//! direct-attach clients on `<socket-dir>/nic<node>.sock`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use emp_nic::attach::{self, socket_path};
use emp_nic::engine::Engine;
use emp_nic::firmware::boot_staged;
use emp_nic::image::TrustedKeys;
use emp_nic::nic::{power_on, NicConfig, SramBacking};
use emp_nic::wire::{Faults, MemWire, UdpWire, Wire};
use emp_uapi::fwabi::FwConfig;
use emp_uapi::sram::{LayoutParams, NicStatus, FEATURE_MODIFIED_ACK_NACK, FEATURE_OVERFLOW};

#[derive(Parser, Debug)]
#[command(name = "emp-nicd", about = "Emulated EMP NICs: a chassis of NICs running signed firmware")]
struct Args {
    /// NICs in this daemon.
    #[arg(long, default_value_t = 1)]
    nics: u16,
    /// Node id of the first NIC.
    #[arg(long, default_value_t = 0)]
    node_base: u16,
    /// Nodes in the cluster (route table size); default: node-base + nics.
    #[arg(long)]
    nodes: Option<u16>,
    /// Wire backend.
    #[arg(long, value_enum, default_value_t = WireKind::Mem)]
    wire: WireKind,
    /// UDP port of node 0 (node n uses base + n, on 127.0.0.1).
    #[arg(long, default_value_t = 47000)]
    udp_base: u16,
    /// Frame loss probability injected on transmit.
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Frame duplication probability.
    #[arg(long, default_value_t = 0.0)]
    dup: f64,
    /// Frame reordering probability (mem wire: delayed by up to --jitter-us).
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Largest extra delay of a reordered frame.
    #[arg(long, default_value_t = 50)]
    jitter_us: u64,
    /// Seed of the fault injector.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for the NIC sockets.
    #[arg(long, default_value = "/tmp/emp")]
    socket_dir: PathBuf,
    /// Signed firmware image.
    #[arg(long, default_value = "firmware-blobs/emp-fw.bin")]
    firmware: PathBuf,
    /// Directory of trusted public keys (*.pub).
    #[arg(long, default_value = "firmware-blobs")]
    trusted: PathBuf,
    /// Ports (processes) per NIC.
    #[arg(long, default_value_t = 8)]
    ports: u16,
    /// MTU.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
    /// Overflow buffer slots for small unexpected messages.
    #[arg(long, default_value_t = 0)]
    overflow: u32,
    /// Use PM's Modified ACK/NACK flow control.
    #[arg(long)]
    modified_ack_nack: bool,
    /// NIC CPU plan (EMP thesis ch. 3): how the control program's steps are
    /// split over two NIC CPUs.
    #[arg(long, value_enum, default_value_t = Plan::Base)]
    cpu_plan: Plan,
    /// Spin this long (µs) after the last work before sleeping.
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// Guest NICs: put NIC n's SRAM in `<dir>/sram<n>`; QEMU guests reach
    /// it as the ivshmem BAR2, either mapping the file (`ivshmem-plain`, no
    /// interrupts) or through `<socket-dir>/ivshmem<n>.sock`
    /// (`ivshmem-doorbell,vectors=1`: MSI-X). The guest's driver stages the
    /// firmware.
    #[arg(long)]
    vm_sram_dir: Option<PathBuf>,
    /// Write the pid here once every NIC is serving.
    #[arg(long)]
    pidfile: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Plan {
    Base,
    So,
    Ro,
    Sr,
    Dsr,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum WireKind {
    Mem,
    Udp,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Release);
}

extern "C" fn on_usr1(_: libc::c_int) {
    emp_nic::engine::DUMP.store(true, Ordering::Release);
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("EMP_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let a = Args::parse();
    match run(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("emp-nicd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: Args) -> Result<ExitCode, String> {
    if a.nics == 0 || a.ports == 0 {
        return Err("--nics and --ports must be at least 1".into());
    }
    let nodes = a.nodes.unwrap_or(a.node_base + a.nics);
    if a.node_base as u32 + a.nics as u32 > nodes as u32 {
        return Err(format!("nodes {}..{} do not fit in --nodes {nodes}", a.node_base, a.node_base + a.nics));
    }
    for (name, p) in [("--loss", a.loss), ("--dup", a.dup), ("--reorder", a.reorder)] {
        if !(0.0..1.0).contains(&p) {
            return Err(format!("{name} must be in [0, 1)"));
        }
    }
    let image = match &a.vm_sram_dir {
        Some(_) => Vec::new(),
        None => {
            std::fs::read(&a.firmware).map_err(|e| format!("{}: {e} (run `make firmware`)", a.firmware.display()))?
        }
    };
    let trusted = Arc::new(TrustedKeys::load_dir(&a.trusted).map_err(|e| format!("trusted keys: {e}"))?);
    let staging = if a.vm_sram_dir.is_some() { 16 << 20 } else { (image.len().div_ceil(4096) * 4096).max(4096) };
    if let Some(d) = &a.vm_sram_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    std::fs::create_dir_all(&a.socket_dir).map_err(|e| format!("{}: {e}", a.socket_dir.display()))?;
    let mut features = 0;
    if a.overflow > 0 {
        features |= FEATURE_OVERFLOW;
    }
    if a.modified_ack_nack {
        features |= FEATURE_MODIFIED_ACK_NACK;
    }
    let mut nics = Vec::new();
    let mut failed = 0;
    for i in 0..a.nics {
        let node = a.node_base + i;
        let cfg = NicConfig {
            node,
            nodes,
            mtu: a.mtu,
            features,
            layout: LayoutParams {
                ports: a.ports,
                route_entries: nodes as u32,
                staging_size: staging as u32,
                ..LayoutParams::default()
            },
            fw: FwConfig {
                overflow_slots: a.overflow,
                gen_seed: std::process::id() ^ (node as u32) << 8,
                cpu_plan: a.cpu_plan as u32,
                ..Default::default()
            },
            udp_base: a.udp_base,
        };
        let sram_path = a.vm_sram_dir.as_ref().map(|d| d.join(format!("sram{node}")));
        let backing = match &sram_path {
            Some(p) => SramBacking::File(p),
            None => SramBacking::Memfd,
        };
        let shared = power_on(&cfg, backing).map_err(|e| format!("nic {node}: {e}"))?;
        let fw = if a.vm_sram_dir.is_none() {
            // Direct attach: the daemon is the driver and stages the image.
            let _ = shared.stage(&image);
            boot_staged(&shared, &trusted, cfg.fw)
        } else {
            None
        };
        if a.vm_sram_dir.is_none() && shared.status().0 != NicStatus::Running {
            failed += 1;
        }
        attach::serve(shared.clone(), socket_path(&a.socket_dir, node)).map_err(|e| format!("socket: {e}"))?;
        if let Some(p) = &sram_path {
            // A QEMU guest connects here (`-device ivshmem-doorbell,vectors=1`).
            let sock = a.socket_dir.join(format!("ivshmem{node}.sock"));
            emp_nic::ivshmem::serve(shared.clone(), sock, p.clone(), 1).map_err(|e| format!("ivshmem socket: {e}"))?;
        }
        nics.push((shared, fw, cfg.fw));
    }
    let faults = Faults { loss: a.loss, dup: a.dup, reorder: a.reorder, jitter_ns: a.jitter_us * 1000, seed: a.seed };
    let local: Vec<u16> = (a.node_base..a.node_base + a.nics).collect();
    let wire: Box<dyn Wire> = match a.wire {
        WireKind::Mem => Box::new(MemWire::new(&local, faults)),
        WireKind::Udp => {
            let binds: Vec<_> = local.iter().map(|&n| UdpWire::loopback(a.udp_base, n)).collect();
            let routes: HashMap<_, _> = (0..nodes).map(|n| (n, UdpWire::loopback(a.udp_base, n))).collect();
            Box::new(UdpWire::new(&binds, routes, faults).map_err(|e| format!("udp: {e}"))?)
        }
    };
    // SAFETY: installing an async-signal-safe handler (it only stores an atomic).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut engine = Engine::new(nics, wire, stop.clone(), trusted).map_err(|e| format!("engine: {e}"))?;
    engine.spin_ns = a.spin_us * 1000;
    if let Some(d) = &a.vm_sram_dir {
        // Guests map their RAM from `<dir>/ram<node>` (QEMU creates it).
        for i in 0..a.nics {
            engine.set_guest_ram(i as usize, d.join(format!("ram{}", a.node_base + i)));
        }
        engine.max_sleep_ns = Some(50_000);
    }
    if let Some(p) = &a.pidfile {
        std::fs::write(p, format!("{}\n", std::process::id())).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    tracing::info!(nics = a.nics, failed, dir = %a.socket_dir.display(), "serving");
    std::thread::spawn(move || {
        while !STOP.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        stop.store(true, Ordering::Release);
    });
    engine.run();
    for n in local {
        let _ = std::fs::remove_file(socket_path(&a.socket_dir, n));
        let _ = std::fs::remove_file(a.socket_dir.join(format!("ivshmem{n}.sock")));
    }
    if let Some(p) = &a.pidfile {
        let _ = std::fs::remove_file(p);
    }
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}
