//! `emp-nicd`: hosts one or more emulated EMP NICs (a chassis) on a wire,
//! each loading and verifying a signed control-program image, each serving
//! direct-attach clients on `<socket-dir>/nic<node>.sock`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use emp_nic::attach::{self, socket_path, WireSeat};
use emp_nic::engine::Engine;
use emp_nic::firmware::boot_staged;
use emp_nic::image::TrustedKeys;
use emp_nic::nic::{power_on, NicConfig, SramBacking};
use emp_nic::route::RouteTable;
use emp_nic::wire::auth::{Auth, AuthMode, AuthShared, TRAILER};
use emp_nic::wire::{Faults, MemWire, PacketOptions, PacketWire, UdpWire, Wire, WireKindInfo, WireView};
use emp_uapi::fwabi::FwConfig;
use emp_uapi::sram::{
    LayoutParams, NicStatus, FEATURE_IMMEDIATE_SENDING, FEATURE_MODIFIED_ACK_NACK, FEATURE_ORDERED_REFUSAL,
    FEATURE_OVERFLOW, FEATURE_RX_DOUBLE_BUFFERING,
};

#[derive(Parser, Debug)]
#[command(name = "emp-nicd", about = "Emulated EMP NICs: a chassis of NICs running signed firmware")]
struct Args {
    /// Cluster file (TOML, docs/cluster.md): start the nodes it puts on
    /// `--host`, with its wire, addresses and settings (flags given here
    /// override its settings).
    #[arg(long, requires = "host", conflicts_with_all = ["nics", "node_base", "nodes", "udp_base"])]
    config: Option<PathBuf>,
    /// With --config: which host of the file this daemon is.
    #[arg(long, requires = "config")]
    host: Option<String>,
    /// NICs in this daemon (without --config).
    #[arg(long, default_value_t = 1)]
    nics: u16,
    /// Node id of the first NIC (without --config).
    #[arg(long, default_value_t = 0)]
    node_base: u16,
    /// Nodes in the cluster (route table size); default: node-base + nics.
    #[arg(long)]
    nodes: Option<u16>,
    /// Wire backend [default: the cluster file's, else mem].
    #[arg(long, value_enum)]
    wire: Option<WireKind>,
    /// UDP port of node 0 (node n uses base + n, on 127.0.0.1; without --config).
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
    /// Link delay (µs): every frame this daemon's NICs send leaves this
    /// long after it was sent, order kept (the udp and packet wires; `tc
    /// netem`'s delay where the kernel has none; docs/cluster.md).
    #[arg(long, default_value_t = 0)]
    link_delay_us: u64,
    /// Seed of the fault injector.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for the NIC sockets [default: the host's `dir`, else /tmp/emp].
    #[arg(long)]
    socket_dir: Option<PathBuf>,
    /// Signed firmware image [default: the file's `firmware`, else firmware-blobs/emp-fw.bin].
    #[arg(long)]
    firmware: Option<PathBuf>,
    /// Directory of trusted public keys (*.pub) [default: the file's
    /// `trusted_keys`, else $EMP_TRUSTED_KEYS, else the build tree's
    /// firmware-blobs/, else /lib/firmware/emp; never the image's directory].
    #[arg(long)]
    trusted: Option<PathBuf>,
    /// Ports (processes) per NIC [default: the file's `ports`, else 8].
    #[arg(long)]
    ports: Option<u16>,
    /// MTU [default: the file's `mtu`, else 1500].
    #[arg(long)]
    mtu: Option<u32>,
    /// Overflow buffer slots for small unexpected messages.
    #[arg(long, default_value_t = 0)]
    overflow: u32,
    /// Use PM's Modified ACK/NACK flow control (its ports refuse unexpected
    /// messages in order, whatever `--matching` says).
    #[arg(long)]
    modified_ack_nack: bool,
    /// Receive double buffering (PM §3.2): the NIC's DMA writes into host
    /// memory run on a DMA thread from two frame buffers, beside the
    /// engine taking in the next frame (docs/immediate-sending.md).
    #[arg(long)]
    rx_double_buffering: bool,
    /// Immediate Sending (PM §3.2): a one-frame send goes to the wire
    /// built straight from host memory, not first copied into the NIC
    /// (docs/immediate-sending.md).
    #[arg(long)]
    immediate_sending: bool,
    /// What a port does with a message no posted receive matches:
    /// `unexpected` holds it (small ones with their payload, others as a
    /// header whose data is pulled when a receive matches) and later
    /// messages go on; `ordered-refusal` refuses it and holds every later
    /// message from its sender behind it (the EMP thesis' and PM's rule).
    #[arg(long, value_enum, default_value_t = Matching::Unexpected)]
    matching: Matching,
    /// NIC CPU plan (EMP thesis ch. 3): how the control program's steps are
    /// split over two NIC CPUs.
    #[arg(long, value_enum, default_value_t = Plan::Base)]
    cpu_plan: Plan,
    /// NIC CPUs (1 or 2) [default: the file's `nic_cpus`, else 1]: with 2,
    /// a two-CPU plan's CPU B runs on a thread of its own beside the
    /// engine's (CPU A) where the machine has the cores (docs/nic-cpus.md).
    #[arg(long)]
    nic_cpus: Option<u32>,
    /// Which of a NIC's pending events it takes first in each pass (EMP
    /// thesis §2.2.1): the host's doorbell (`mailbox`, the Tigon2's order)
    /// or received frames (`mac-rx`: ACKs and NACKs before more sends).
    #[arg(long, value_enum, default_value_t = EventPriority::Mailbox)]
    event_priority: EventPriority,
    /// Host cores every thread of this daemon runs on (`1`, `2-3`): the
    /// NICs' own processors, as a real NIC has them, so the processes it
    /// serves keep the other cores [default: any core].
    #[arg(long)]
    nic_cores: Option<String>,
    /// Control program: initial retransmission timeout (µs) [default: the
    /// program's, 500]. Above the worst scheduling delay of a loaded host,
    /// or every late ACK is a spurious retransmission.
    #[arg(long)]
    rto_us: Option<u64>,
    /// Control program: unacknowledged frames in flight per peer [default:
    /// the program's, 48]. Every NIC of a cluster must use the same.
    #[arg(long)]
    window_frames: Option<u32>,
    /// packet wire: receive with `recvmmsg` instead of a PACKET_RX_RING
    /// (to compare the two).
    #[arg(long)]
    no_rx_ring: bool,
    /// packet wire: transmit with `sendmmsg` instead of a PACKET_TX_RING
    /// (to compare the two).
    #[arg(long)]
    no_tx_ring: bool,
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
    /// First port generation of this daemon's NICs [default: from the pid]
    /// (tests: a restart whose generations look older to the peers).
    #[arg(long, hide = true)]
    gen_seed: Option<u32>,
    /// Write the pid here once every NIC is serving.
    #[arg(long)]
    pidfile: Option<PathBuf>,
}

/// `--event-priority`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum EventPriority {
    Mailbox,
    MacRx,
}

/// `--matching`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Matching {
    Unexpected,
    OrderedRefusal,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Plan {
    Base,
    So,
    Ro,
    Sr,
    Dsr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum WireKind {
    Mem,
    Udp,
    Packet,
}

impl WireKind {
    fn from_config(w: emp_config::WireKind) -> Result<WireKind, String> {
        match w {
            emp_config::WireKind::Mem => Ok(WireKind::Mem),
            emp_config::WireKind::Udp => Ok(WireKind::Udp),
            emp_config::WireKind::Packet => Ok(WireKind::Packet),
        }
    }
}

/// What this daemon runs, from the cluster file or the chassis flags.
struct Setup {
    /// Node ids of the local NICs (local index = position).
    local: Vec<u16>,
    routes: RouteTable,
    wire: WireKind,
    mtu: u32,
    ports: u16,
    socket_dir: PathBuf,
    firmware: PathBuf,
    trusted: PathBuf,
    /// The cluster file's node entries of the local NICs (interfaces).
    nodes: Vec<Option<emp_config::Node>>,
    /// Per-frame authentication and the key file.
    auth: AuthMode,
    auth_key: Option<PathBuf>,
    /// NIC CPUs.
    nic_cpus: u32,
}

fn setup(a: &Args) -> Result<Setup, String> {
    let Some(path) = &a.config else {
        if a.nics == 0 {
            return Err("--nics must be at least 1".into());
        }
        let nodes = a.nodes.unwrap_or(a.node_base + a.nics);
        if a.node_base as u32 + a.nics as u32 > nodes as u32 {
            return Err(format!("nodes {}..{} do not fit in --nodes {nodes}", a.node_base, a.node_base + a.nics));
        }
        let local: Vec<u16> = (a.node_base..a.node_base + a.nics).collect();
        return Ok(Setup {
            nodes: local.iter().map(|_| None).collect(),
            local,
            routes: RouteTable::loopback(nodes, a.udp_base),
            wire: a.wire.unwrap_or(WireKind::Mem),
            mtu: a.mtu.unwrap_or(1500),
            ports: a.ports.unwrap_or(8),
            socket_dir: a.socket_dir.clone().unwrap_or_else(|| "/tmp/emp".into()),
            firmware: a.firmware.clone().unwrap_or_else(|| "firmware-blobs/emp-fw.bin".into()),
            trusted: emp_config::trusted_keys_dir(a.trusted.as_deref()),
            auth: AuthMode::Off,
            auth_key: None,
            nic_cpus: a.nic_cpus.unwrap_or(1),
        });
    };
    let c = emp_config::ClusterConfig::load(path).map_err(|e| e.to_string())?;
    let name = a.host.as_deref().expect("clap: --config requires --host");
    let host = c.host(name).ok_or_else(|| {
        let names: Vec<&str> = c.hosts.iter().map(|h| h.name.as_str()).collect();
        format!("{}: no host {name:?} (hosts: {})", path.display(), names.join(", "))
    })?;
    let here: Vec<&emp_config::Node> = c.nodes_on(name).collect();
    if here.is_empty() {
        return Err(format!("{}: host {name:?} runs no node", path.display()));
    }
    let wire = match a.wire {
        Some(w) => w,
        None => WireKind::from_config(c.wire)?,
    };
    if wire == WireKind::Mem && here.len() != c.nodes.len() {
        return Err("the mem wire reaches only this daemon's NICs: every node must be on this host".into());
    }
    Ok(Setup {
        local: here.iter().map(|n| n.id).collect(),
        nodes: here.iter().map(|&n| Some(n.clone())).collect(),
        routes: RouteTable::from_config(&c),
        wire,
        mtu: a.mtu.or(c.mtu).unwrap_or(1500),
        ports: a.ports.or(c.ports).unwrap_or(8),
        socket_dir: a.socket_dir.clone().unwrap_or_else(|| host.dir.clone()),
        firmware: a.firmware.clone().or(c.firmware.clone()).unwrap_or_else(|| "firmware-blobs/emp-fw.bin".into()),
        trusted: emp_config::trusted_keys_dir(a.trusted.as_deref().or(c.trusted_keys.as_deref())),
        auth: if wire == WireKind::Mem { AuthMode::Off } else { c.auth },
        auth_key: c.auth_key.clone(),
        nic_cpus: a.nic_cpus.or(c.nic_cpus).unwrap_or(1),
    })
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
    // Before any thread starts: each inherits the mask.
    if let Some(list) = &a.nic_cores {
        emp_config::cores::parse(list)
            .and_then(|cores| emp_config::cores::pin(&cores))
            .map_err(|e| format!("--nic-cores: {e}"))?;
    }
    let p = setup(&a)?;
    if !(1..=emp_config::NIC_CPUS_MAX).contains(&p.nic_cpus) {
        return Err(format!(
            "--nic-cpus {} is outside 1..={} (the CPU plans split the control program over two CPUs)",
            p.nic_cpus,
            emp_config::NIC_CPUS_MAX
        ));
    }
    if p.ports == 0 {
        return Err("--ports must be at least 1".into());
    }
    let nodes = p.routes.len() as u16;
    // Authentication: the key is read before anything starts, so a bad
    // key file stops the daemon with its reason.
    let auth = match (p.auth, &p.auth_key) {
        (AuthMode::Off, _) => None,
        (mode, Some(path)) => Some(AuthShared::load(mode, path)?),
        (mode, None) => return Err(format!("auth {:?} without a key file", mode.as_str())),
    };
    for (name, p) in [("--loss", a.loss), ("--dup", a.dup), ("--reorder", a.reorder)] {
        if !(0.0..1.0).contains(&p) {
            return Err(format!("{name} must be in [0, 1)"));
        }
    }
    let image = match &a.vm_sram_dir {
        Some(_) => Vec::new(),
        None => {
            std::fs::read(&p.firmware).map_err(|e| format!("{}: {e} (run `make firmware`)", p.firmware.display()))?
        }
    };
    let trusted = Arc::new(TrustedKeys::load_dir(&p.trusted).map_err(|e| format!("trusted keys: {e}"))?);
    let staging = if a.vm_sram_dir.is_some() { 16 << 20 } else { (image.len().div_ceil(4096) * 4096).max(4096) };
    if let Some(d) = &a.vm_sram_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    std::fs::create_dir_all(&p.socket_dir).map_err(|e| format!("{}: {e}", p.socket_dir.display()))?;
    // The wire first: a refused socket (capability, MTU) leaves nothing behind.
    if a.rto_us == Some(0) || a.window_frames == Some(0) {
        return Err("--rto-us and --window-frames must be at least 1".into());
    }
    if a.link_delay_us > 1_000_000 {
        return Err(format!("--link-delay-us {}: at most 1000000 (1 s)", a.link_delay_us));
    }
    let faults = Faults {
        loss: a.loss,
        dup: a.dup,
        reorder: a.reorder,
        jitter_ns: a.jitter_us * 1000,
        link_delay_ns: a.link_delay_us * 1000,
        seed: a.seed,
    };
    let local = p.local.clone();
    // The control programs' MTU: the trailer rides in what the wire carries.
    let nic_mtu = if auth.is_some() { p.mtu - TRAILER as u32 } else { p.mtu };
    let new_auth = || auth.as_ref().map(|s| Auth::new(s.clone(), local.len(), nodes as usize));
    let wire: Box<dyn Wire> = match p.wire {
        WireKind::Mem => Box::new(MemWire::new(&local, faults)),
        WireKind::Udp => {
            let mut binds = Vec::new();
            for (&n, entry) in local.iter().zip(&p.nodes) {
                let a = p.routes.get(n).and_then(|r| r.udp).ok_or_else(|| format!("node {n} has no udp address"))?;
                let iface = entry.as_ref().and_then(|e| e.interface.as_deref());
                binds.push(emp_nic::route::with_scope(a, iface).map_err(|e| format!("node {n}: {e}"))?);
            }
            let wrong_family =
                p.routes.iter().filter_map(|(n, r)| Some((n, r.udp?))).find(|(_, a)| a.is_ipv4() != binds[0].is_ipv4());
            if let Some((n, a)) = wrong_family {
                // A socket of one family cannot send to the other.
                return Err(format!("udp: node {n} ({a}) and node {} ({}) differ in IP family", local[0], binds[0]));
            }
            let mut w = UdpWire::new(&binds, p.routes.clone(), faults).map_err(|e| format!("udp: {e}"))?;
            // IP multicast where the host routes it, else replicated unicast (warned, counted).
            let mode = w.enable_multicast();
            tracing::info!("udp wire multicast: {mode:?}");
            if let Some(a) = new_auth() {
                w.authenticate(a);
            }
            Box::new(w)
        }
        WireKind::Packet => {
            let mut locals = Vec::new();
            for (&n, entry) in local.iter().zip(&p.nodes) {
                let iface = entry.as_ref().and_then(|e| e.interface.clone());
                locals.push((
                    iface.ok_or_else(|| format!("node {n}: the packet wire needs --config and `interface`"))?,
                    n,
                ));
            }
            let opts = PacketOptions { rx_ring: !a.no_rx_ring, tx_ring: !a.no_tx_ring };
            let mut w = PacketWire::with_options(&locals, p.routes.clone(), p.mtu, faults, opts)
                .map_err(|e| format!("packet: {e}"))?;
            if let Some(a) = new_auth() {
                w.authenticate(a);
            }
            Box::new(w)
        }
    };
    let interfaces: Vec<Option<String>> =
        p.nodes.iter().map(|e| e.as_ref().and_then(|e| e.interface.clone())).collect();
    let view = Arc::new(WireView {
        kind: match p.wire {
            WireKind::Mem => WireKindInfo::Mem,
            WireKind::Udp => WireKindInfo::Udp,
            WireKind::Packet => WireKindInfo::Packet { interfaces: interfaces.iter().flatten().cloned().collect() },
        },
        interfaces,
        routes: p.routes.clone(),
        counters: wire.counters(),
        auth: auth.clone(),
    });
    let mut features = 0;
    if a.overflow > 0 {
        features |= FEATURE_OVERFLOW;
    }
    if a.modified_ack_nack {
        features |= FEATURE_MODIFIED_ACK_NACK;
    }
    if a.rx_double_buffering {
        features |= FEATURE_RX_DOUBLE_BUFFERING;
    }
    if a.immediate_sending {
        features |= FEATURE_IMMEDIATE_SENDING;
    }
    if matches!(a.matching, Matching::OrderedRefusal) {
        features |= FEATURE_ORDERED_REFUSAL;
    }
    let mut nics = Vec::new();
    let mut failed = 0;
    for (local_index, &node) in p.local.iter().enumerate() {
        let cfg = NicConfig {
            node,
            nodes,
            mtu: nic_mtu,
            features,
            layout: LayoutParams {
                ports: p.ports,
                route_entries: nodes as u32,
                staging_size: staging as u32,
                ..LayoutParams::default()
            },
            fw: FwConfig {
                overflow_slots: a.overflow,
                gen_seed: a.gen_seed.unwrap_or_else(std::process::id) ^ (node as u32) << 8,
                cpu_plan: a.cpu_plan as u32,
                // 0: the program's default.
                rto_ns: a.rto_us.unwrap_or(0).saturating_mul(1000),
                window_frames: a.window_frames.unwrap_or(0),
                ..Default::default()
            },
            routes: p.routes.clone(),
            cpus: p.nic_cpus,
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
        let seat = WireSeat { view: view.clone(), local: local_index };
        attach::serve(shared.clone(), socket_path(&p.socket_dir, node), seat).map_err(|e| format!("socket: {e}"))?;
        if let Some(sram) = &sram_path {
            // A QEMU guest connects here (`-device ivshmem-doorbell,vectors=1`).
            let sock = p.socket_dir.join(format!("ivshmem{node}.sock"));
            emp_nic::ivshmem::serve(shared.clone(), sock, sram.clone(), 1)
                .map_err(|e| format!("ivshmem socket: {e}"))?;
        }
        nics.push((shared, fw, cfg.fw));
    }
    // SAFETY: installing an async-signal-safe handler (it only stores an atomic).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t);
    }
    let wire_counters = wire.counters();
    let stop = Arc::new(AtomicBool::new(false));
    let mut engine = Engine::new(nics, wire, stop.clone(), trusted).map_err(|e| format!("engine: {e}"))?;
    engine.spin_ns = a.spin_us * 1000;
    engine.mac_rx_first = matches!(a.event_priority, EventPriority::MacRx);
    if let Some(d) = &a.vm_sram_dir {
        // Guests map their RAM from `<dir>/ram<node>` (QEMU creates it).
        for (i, n) in local.iter().enumerate() {
            engine.set_guest_ram(i, d.join(format!("ram{n}")));
        }
        engine.max_sleep_ns = Some(50_000);
    }
    if let Some(p) = &a.pidfile {
        std::fs::write(p, format!("{}\n", std::process::id())).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let auth_mode = p.auth.as_str();
    tracing::info!(nics = local.len(), failed, auth = auth_mode, dir = %p.socket_dir.display(), "serving");
    std::thread::spawn(move || {
        while !STOP.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        stop.store(true, Ordering::Release);
    });
    engine.run();
    for n in local {
        let _ = std::fs::remove_file(socket_path(&p.socket_dir, n));
        let _ = std::fs::remove_file(p.socket_dir.join(format!("ivshmem{n}.sock")));
    }
    if let Some(p) = &a.pidfile {
        let _ = std::fs::remove_file(p);
    }
    tracing::info!(wire = ?wire_counters.snapshot(), "stopped");
    Ok(ExitCode::SUCCESS)
}
