//! Integration tests with real `emp-nicd` processes: the TAP programs over
//! direct attach on mem and UDP wires, with loss; host-based collectives
//! with 2, 3, 5 and 8 ranks; a client killed mid-transfer; a daemon that
//! goes away; a tampered firmware image; the C example. They need the release binaries and the signed image, which
//! `make test` builds first (`EMP_BIN_DIR` overrides where they are).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The machine has 2 cores: one chassis at a time.
static SERIAL: Mutex<()> = Mutex::new(());

use emp_tests::harness::{assert_tap, compile_c_example, emp, image, root, Cluster};

#[test]
fn tap_p2p_two_ranks_mem_wire() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("p2p2", &["-n", "2"]);
    assert_tap(&c.run(2, &[env!("CARGO_BIN_EXE_tap-p2p")]), 10);
}

#[test]
fn tap_p2p_eight_ranks_on_four_nics_with_loss() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("p2p8", &["-n", "4", "--loss", "0.05", "--dup", "0.02", "--reorder", "0.1"]);
    assert_tap(&c.run(8, &[env!("CARGO_BIN_EXE_tap-p2p")]), 10);
    let stats = emp().args(["stats", "--dir"]).arg(&c.dir).output().expect("stats");
    let text = String::from_utf8_lossy(&stats.stdout);
    let retrans: u64 = text
        .lines()
        .find(|l| l.starts_with("retransmits"))
        .expect("row")
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>().unwrap())
        .sum();
    assert!(retrans > 0, "loss was injected, so frames must have been retransmitted:\n{text}");
}

#[test]
fn tap_p2p_on_two_nic_cpus_every_plan() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for plan in ["so", "ro", "sr", "dsr"] {
        let c = Cluster::up(&format!("plan-{plan}"), &["-n", "2", "--cpu-plan", plan, "--loss", "0.02"]);
        assert_tap(&c.run(2, &[env!("CARGO_BIN_EXE_tap-p2p")]), 10);
    }
}

/// The `/proc/PID/task/TID` directories of the `emp-nicd` serving the
/// chassis in `dir`.
fn nicd_tasks(dir: &Path) -> Vec<PathBuf> {
    let want = dir.to_string_lossy().into_owned();
    let mut tasks = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let p = e.path();
        let Ok(cmd) = std::fs::read(p.join("cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("emp-nicd") && cmd.contains(&want) {
            tasks.extend(std::fs::read_dir(p.join("task")).into_iter().flatten().flatten().map(|t| t.path()));
        }
    }
    tasks
}

/// Names of the threads of the `emp-nicd` serving the chassis in `dir`.
fn nicd_threads(dir: &Path) -> Vec<String> {
    let name = |t: &PathBuf| std::fs::read_to_string(t.join("comm")).ok().map(|n| n.trim().to_string());
    nicd_tasks(dir).iter().filter_map(name).collect()
}

/// Each thread's allowed cores (`Cpus_allowed_list`) of the `emp-nicd`
/// serving the chassis in `dir`, by thread name.
fn nicd_thread_cores(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for t in nicd_tasks(dir) {
        let name = std::fs::read_to_string(t.join("comm")).unwrap_or_default().trim().to_string();
        let status = std::fs::read_to_string(t.join("status")).unwrap_or_default();
        if let Some(l) = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")) {
            out.push((name, l.trim().to_string()));
        }
    }
    out
}

/// `emp-nicd --nic-cores`: every thread of the daemon (engine, attach
/// threads, the second NIC CPU's) stays on the cores given, the NICs
/// serve, and a list it cannot honour is refused with the reason.
#[test]
fn nic_cores_keep_every_daemon_thread_on_them() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let core = (cores - 1).to_string();
    let c = Cluster::up(
        "nic-cores",
        &["-n", "2", "--cpu-plan", "dsr", "--nic-cpus", "2", "--nicd-args", &format!("--nic-cores {core}")],
    );
    assert_tap(&c.run(2, &[env!("CARGO_BIN_EXE_tap-p2p")]), 10);
    let threads = nicd_thread_cores(&c.dir);
    assert!(threads.len() >= 3, "{threads:?}");
    assert!(threads.iter().all(|(_, l)| *l == core), "not all on core {core}: {threads:?}");
    drop(c);
    let nicd = emp_tests::harness::bin_dir().join("emp-nicd");
    for (list, why) in [("4095", "beyond the kernel's"), ("1-0", "runs backwards"), ("x", "not a core number")] {
        let out = Command::new(&nicd).args(["--nics", "1", "--nic-cores", list]).output().expect("emp-nicd");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("--nic-cores") && err.contains(why), "{list}: {err}");
    }
}

/// The NIC CPUs on threads of their own (`--nic-cpus 2`), every plan, under
/// 8 % loss plus duplication and reordering: streamed and ping-pong
/// messages arrive once, whole and in order, and nothing deadlocks.
/// `EMP_STRESS_LONG=1` runs 50 times the messages (minutes per plan).
#[test]
fn two_nic_cpu_threads_under_loss_every_plan() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let long = std::env::var_os("EMP_STRESS_LONG").is_some();
    let (msgs, rounds) = if long { ("30000", "15000") } else { ("600", "300") };
    for plan in ["base", "so", "ro", "sr", "dsr"] {
        let args =
            ["-n", "2", "--cpu-plan", plan, "--nic-cpus", "2", "--loss", "0.08", "--dup", "0.01", "--reorder", "0.02"];
        let c = Cluster::up(&format!("stress-{plan}"), &args);
        let threads = nicd_threads(&c.dir);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if plan != "base" && cores >= 2 {
            assert!(threads.iter().any(|t| t == "nic-cpu1-n0"), "{plan}: no CPU B thread in {threads:?}");
        } else {
            assert!(!threads.iter().any(|t| t.starts_with("nic-cpu")), "{plan}: {threads:?}");
        }
        let out = tap_stress(&c.dir, msgs, rounds, if long { "3600" } else { "300" });
        eprintln!("plan {plan}:");
        assert_tap(&out, 2);
        assert!(stats_row(&c.dir, "retransmits") > 0, "{plan}: 8 % loss, yet no retransmission");
        let dump = table_dump(&c.dir);
        // The engine's calls per NIC: frames reach the program in batches.
        let (batches, frames) = (dumped(&dump, "frame batches "), dumped(&dump, " carrying "));
        assert_eq!((batches.len(), frames.len()), (2, 2), "{plan}: a line per NIC in {dump}");
        assert!(batches.iter().zip(&frames).all(|(b, f)| *b > 0 && f >= b), "{plan}: {batches:?} {frames:?}");
        // Each NIC's receive side takes the DATA frames alone but for what
        // needs the whole program (a new sender's first, and the like).
        let (alone, whole) = (dumped(&dump, "DATA frames alone "), dumped(&dump, "with the whole program "));
        assert_eq!((alone.len(), whole.len()), (2, 2), "{plan}: a line per NIC in {dump}");
        assert!(alone.iter().zip(&whole).all(|(a, w)| a > w), "{plan}: alone {alone:?}, whole {whole:?}");
        let recvs = (dumped(&dump, "receives taken alone "), dumped(&dump, ", by the whole program "));
        assert_eq!((recvs.0.len(), recvs.1.len()), (2, 2), "{plan}: a line per NIC in {dump}");
        eprintln!("plan {plan}: DATA frames per NIC, receive side alone {alone:?}, whole program {whole:?}; receives {recvs:?}");
        // And each NIC's send side sends the frames alone but for those the
        // whole program builds (a remote read's response: the pulls).
        let (sent, built) = (dumped(&dump, "frames sent alone "), dumped(&dump, "built by the whole program "));
        assert_eq!((sent.len(), built.len()), (2, 2), "{plan}: a line per NIC in {dump}");
        assert!(sent.iter().all(|&s| s > 0), "{plan}: send side alone {sent:?}");
        let descs = (dumped(&dump, "descriptors taken alone "), dumped(&dump, "needing the whole program "));
        assert!(descs.0.iter().all(|&d| d > 0), "{plan}: descriptors taken alone {descs:?}");
        eprintln!(
            "plan {plan}: frames per NIC, send side alone {sent:?}, whole program {built:?}; descriptors {descs:?}"
        );
        // Which calls needed more than the sides' views (docs/nic-cpus.md).
        let doorbells = (dumped(&dump, "doorbells alone "), dumped(&dump, "doorbells with the program "));
        let batches = (dumped(&dump, "frame batches alone "), dumped(&dump, "frame batches with the program "));
        assert_eq!((doorbells.0.len(), batches.1.len()), (2, 2), "{plan}: a line per NIC in {dump}");
        eprintln!(
            "plan {plan}: per NIC, doorbells (sides alone, whole program) {doorbells:?}, frame batches {batches:?}"
        );
        if plan != "base" && cores >= 2 {
            // CPU B's transmissions, receiving DMAs, completions and ACKs
            // are jobs it runs without the program, beside CPU A (DSR's B
            // queues the DMAs of the frames it classifies for itself).
            let unlocked: u64 = dumped(&dump, "jobs without the program ").iter().sum();
            assert!(unlocked > 0, "{plan}: CPU B ran no job without the program");
            let waits = dumped(&dump, "program taken by another CPU ");
            assert_eq!(waits.len(), 4, "{plan}: each CPU of each NIC says how often it waited: {dump}");
            eprintln!("plan {plan}: {unlocked} jobs without the program, program found taken {waits:?}");
            // The sides' entry points, each holding only its side's lock:
            // the doorbells' and the received batches' common case.
            let sides = (
                dumped(&dump, "receive-side rings and timers "),
                dumped(&dump, "receive-side batches "),
                dumped(&dump, "send-side doorbells "),
            );
            assert_eq!((sides.0.len(), sides.1.len(), sides.2.len()), (2, 2, 2), "{plan}: a line per NIC in {dump}");
            assert!(sides.2.iter().all(|&d| d > 0), "{plan}: no doorbell's send side ran alone: {sides:?}");
            assert!(
                sides.1.iter().all(|&b| b > 0),
                "{plan}: no batch of frames ran on the receive side alone: {sides:?}"
            );
            if plan == "dsr" {
                // CPU A takes the ACKs DSR's B classified on the send side alone.
                let runs = dumped(&dump, "send-side queue runs ");
                assert!(runs.iter().all(|&r| r > 0), "{plan}: no send-side queue run alone: {runs:?}");
            }
            let calls = dumped(&dump, "sides' entry points ");
            let lock_waits = dumped(&dump, "a side's lock taken by another CPU ");
            eprintln!("plan {plan}: sides alone {sides:?}; per CPU, side calls {calls:?}, a side's lock found taken {lock_waits:?}");
        }
    }
}

/// tap-stress on two ranks of the chassis in `dir`: `msgs` streamed
/// messages, then `rounds` ping-pong rounds, within `timeout` seconds.
fn tap_stress(dir: &Path, msgs: &str, rounds: &str, timeout: &str) -> std::process::Output {
    emp()
        .args(["run", "--timeout", timeout, "-n", "2", "--dir"])
        .arg(dir)
        .env("EMP_STRESS_MSGS", msgs)
        .env("EMP_STRESS_ROUNDS", rounds)
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_tap-stress"))
        .output()
        .expect("emp run")
}

/// The daemon's table dump (SIGUSR1) of the two-NIC chassis in `dir`: what
/// it logged, once both NICs' tables are in.
fn table_dump(dir: &Path) -> String {
    const LAST: &str = "engine calls: ";
    let log = dir.join("nicd.0.log");
    let before = std::fs::read_to_string(&log).unwrap_or_default().len();
    let pid = nicd_tasks(dir)
        .first()
        .and_then(|t| t.parent()?.parent()?.file_name()?.to_str()?.parse::<i32>().ok())
        .expect("the chassis' emp-nicd");
    // SAFETY: a signal to the daemon this test started; it dumps its tables.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0, "SIGUSR1 to {pid}");
    for _ in 0..100 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let dump = &text[before.min(text.len())..];
        if dump.matches(LAST).count() >= 2 {
            return dump.to_string();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("no table dump with {LAST:?} for both NICs in {}", log.display());
}

/// The number after `key` on each line of `dump` that has it.
fn dumped(dump: &str, key: &str) -> Vec<u64> {
    dump.lines()
        .filter_map(|l| l.split(key).nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .collect()
}

/// Receive double buffering (`emp-nicd --rx-double-buffering`): the NIC's
/// writes into host memory run on a DMA thread; every message still
/// arrives once, in order, whole (tap-p2p's checks), with loss and
/// reordering, on 2 and on 4 NICs.
#[test]
fn tap_p2p_with_rx_double_buffering() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("p2p-db2", &["-n", "2", "--nicd-args", "--rx-double-buffering"]);
    assert_tap(&c.run(2, &[env!("CARGO_BIN_EXE_tap-p2p")]), 10);
    let c = Cluster::up(
        "p2p-db8",
        &["-n", "4", "--loss", "0.05", "--reorder", "0.1", "--nicd-args", "--rx-double-buffering"],
    );
    assert_tap(&c.run(8, &[env!("CARGO_BIN_EXE_tap-p2p")]), 10);
    // Both NIC CPUs on threads queue to the one DMA thread: a completion
    // one CPU writes never lands before the payload the other queued (DSR).
    // SR: CPU B's transmissions (named in place: Immediate Sending) and
    // receiving DMAs are jobs it runs without the program, its writes
    // through the same DMA thread.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (name, plan, nicd) in [
        ("p2p-db-cpus", "dsr", "--rx-double-buffering"),
        ("p2p-db-jobs", "sr", "--rx-double-buffering --immediate-sending"),
    ] {
        let args = ["-n", "2", "--cpu-plan", plan, "--nic-cpus", "2", "--loss", "0.05", "--reorder", "0.05"];
        let c = Cluster::up(name, &[&args[..], &["--nicd-args", nicd]].concat());
        let threads = nicd_threads(&c.dir);
        assert!(threads.iter().any(|t| t == "emp-dma0"), "{plan}: no DMA thread in {threads:?}");
        if cores >= 2 {
            assert!(threads.iter().any(|t| t == "nic-cpu1-n0"), "{plan}: no CPU B thread in {threads:?}");
        }
        assert_tap(&tap_stress(&c.dir, "200", "50", "300"), 2);
        if plan == "sr" && cores >= 2 {
            let unlocked: u64 = dumped(&table_dump(&c.dir), "jobs without the program ").iter().sum();
            assert!(unlocked > 0, "{plan}: CPU B ran no job without the program");
        }
    }
}

/// Immediate Sending (`emp-nicd --immediate-sending`): one-frame sends go
/// to the MAC named in host memory and are built from it there; every
/// message still arrives once, in order, whole (tap-p2p's checks), on the
/// mem wire, and on the UDP wire with loss (retransmissions read the
/// sender's buffer again), duplication and reordering.
#[test]
fn tap_p2p_with_immediate_sending() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("p2p-is2", &["-n", "2", "--nicd-args", "--immediate-sending"]);
    assert_tap(&c.run(2, &[env!("CARGO_BIN_EXE_tap-p2p")]), 10);
    let c = Cluster::up(
        "p2p-is4",
        &[
            "-n",
            "4",
            "--wire",
            "udp",
            "--loss",
            "0.05",
            "--dup",
            "0.02",
            "--reorder",
            "0.1",
            "--nicd-args",
            "--immediate-sending",
        ],
    );
    assert_tap(&c.run(8, &[env!("CARGO_BIN_EXE_tap-p2p")]), 10);
    assert!(stats_row(&c.dir, "retransmits") > 0, "loss was injected: frames were sent again from host memory");
    // The payloads of arena buffers went to the sockets in place.
    let from_host: u64 = (0..4).map(|n| emp::nic_wire_info(&c.sock(n)).expect("wire info").from_host).max().unwrap();
    assert!(from_host > 0, "one-frame sends left straight from host memory");
}

/// The `emp stats` row `name`, summed over the NICs.
fn stats_row(dir: &Path, name: &str) -> u64 {
    let stats = emp().args(["stats", "--dir"]).arg(dir).output().expect("stats");
    let text = String::from_utf8_lossy(&stats.stdout);
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} row in:\n{text}"))
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum()
}

#[test]
fn tap_match_out_of_order_tags_two_ranks() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("match2", &["-n", "2"]);
    assert_tap(&c.run(2, &[env!("CARGO_BIN_EXE_tap-match")]), 8);
    assert!(stats_row(&c.dir, "unexp_eager") >= 2, "small unexpected messages counted");
    assert!(stats_row(&c.dir, "unexp_rdv") >= 4, "retained headers counted");
    assert!(stats_row(&c.dir, "rdv_pulls") >= 4, "rendezvous pulls counted");
}

#[test]
fn tap_match_with_loss_on_the_udp_wire() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c =
        Cluster::up("matchl", &["-n", "3", "--wire", "udp", "--loss", "0.03", "--dup", "0.02", "--reorder", "0.05"]);
    assert_tap(&c.run(3, &[env!("CARGO_BIN_EXE_tap-match")]), 8);
    assert!(stats_row(&c.dir, "rdv_pulls") >= 4);
}

#[test]
fn tap_coll_two_ranks() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("coll2", &["-n", "2"]);
    assert_tap(&c.run(2, &[env!("CARGO_BIN_EXE_tap-coll")]), 12);
}

/// Reliable broadcast over the mem wire's multicast (seed 002): three
/// ranks on three NICs, then six on three (two ports per NIC: a member on
/// the root's own NIC takes its copy locally), with loss.
#[test]
fn tap_rbcast_over_mem_wire_multicast() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("rbcast3", &["-n", "3"]);
    assert_tap(&c.run(3, &[env!("CARGO_BIN_EXE_tap-rbcast")]), 3);
    drop(c);
    let c = Cluster::up("rbcast6", &["-n", "3", "--loss", "0.05", "--dup", "0.02", "--reorder", "0.05"]);
    assert_tap(&c.run(6, &[env!("CARGO_BIN_EXE_tap-rbcast")]), 3);
}

#[test]
fn tap_coll_eight_ranks_on_four_nics_with_loss() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("coll8", &["-n", "4", "--loss", "0.02", "--dup", "0.02", "--reorder", "0.05"]);
    assert_tap(&c.run(8, &[env!("CARGO_BIN_EXE_tap-coll")]), 12);
    let stats = emp().args(["stats", "--dir"]).arg(&c.dir).output().expect("stats");
    let text = String::from_utf8_lossy(&stats.stdout);
    let ops: u64 = text
        .lines()
        .find(|l| l.starts_with("coll_ops"))
        .expect("row")
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>().unwrap())
        .sum();
    assert!(ops >= 8 * 600, "the NICs ran the collectives:\n{text}");
}

#[test]
fn tap_p2p_three_ranks_udp_wire() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let base = 40000 + (std::process::id() % 20000) as u16;
    let c = Cluster::up("udp", &["-n", "3", "--wire", "udp", "--udp-base", &base.to_string()]);
    assert_tap(&c.run(3, &[env!("CARGO_BIN_EXE_tap-p2p")]), 10);
}

/// Host-based collectives (`emp::coll::Comm`): `ranks` rank processes on
/// `nics` NICs; sizes that are not powers of two take PE's fix-up steps and
/// uneven binomial trees.
fn tap_coll_host(name: &str, ranks: usize, nics: usize, extra: &[&str]) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = nics.to_string();
    let args: Vec<&str> = ["-n", n.as_str()].into_iter().chain(extra.iter().copied()).collect();
    let c = Cluster::up(name, &args);
    assert_tap(&c.run(ranks, &[env!("CARGO_BIN_EXE_tap-coll-host")]), 11);
}

#[test]
fn tap_coll_host_two_ranks() {
    tap_coll_host("coll2", 2, 2, &[]);
}

#[test]
fn tap_coll_host_three_ranks() {
    tap_coll_host("coll3", 3, 3, &[]);
}

#[test]
fn tap_coll_host_five_ranks_with_loss() {
    tap_coll_host("coll5", 5, 5, &["--loss", "0.02", "--dup", "0.01", "--reorder", "0.05"]);
}

#[test]
fn tap_coll_host_eight_ranks_on_four_nics() {
    tap_coll_host("coll8", 8, 4, &[]);
}

#[test]
fn garbage_descriptors_do_not_disturb_other_ports() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("garbage", &["-n", "3"]);
    assert_tap(&c.run(3, &[env!("CARGO_BIN_EXE_tap-robust"), "garbage"]), 2);
}

#[test]
fn client_killed_mid_transfer_peer_errors_and_nic_reclaims() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("victim", &["-n", "2"]);
    let rdv = c.dir.join("rdv");
    std::fs::create_dir_all(&rdv).unwrap();
    let spawn = |rank: usize| {
        Command::new(env!("CARGO_BIN_EXE_tap-robust"))
            .arg("victim")
            .env("EMP_DEVICE", c.socket(rank as u16))
            .env("EMP_PEER_DEVICE", c.socket(1))
            .env("EMP_RANK", rank.to_string())
            .env("EMP_SIZE", "2")
            .env("EMP_RDV_DIR", &rdv)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (r0, r1) = (spawn(0), spawn(1));
    let o1 = r1.wait_with_output().unwrap();
    assert!(!o1.status.success(), "the victim must have died");
    assert_tap(&r0.wait_with_output().unwrap(), 3);
}

#[test]
fn client_sees_error_when_the_daemon_goes_away() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("orphan", &["-n", "1"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tap-robust"))
        .arg("orphan")
        .env("EMP_DEVICE", c.socket(0))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "waiting");
    let t = Instant::now();
    let down = emp().args(["cluster", "down", "--dir"]).arg(&c.dir).output().unwrap();
    assert!(down.status.success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let st = child.wait().unwrap();
    println!("{}", rest.join("\n"));
    assert!(st.success(), "orphan: {rest:?}");
    assert!(t.elapsed() < Duration::from_secs(15));
}

fn tampered_copy(dir: &Path, flip_at: impl Fn(usize) -> usize) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut img = std::fs::read(image()).unwrap();
    let at = flip_at(img.len());
    img[at] ^= 0x01;
    let p = dir.join("emp-fw.bin");
    std::fs::write(&p, img).unwrap();
    std::fs::copy(root().join("firmware-blobs/dev.pub"), dir.join("dev.pub")).unwrap();
    p
}

fn up_fails_with(fw: &Path, dir: &Path, reason: &str) {
    let out = emp().args(["cluster", "up", "-n", "1", "--dir"]).arg(dir).arg("--firmware").arg(fw).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad image must not boot");
    assert!(err.contains(reason), "expected {reason:?} in: {err}");
    let log = std::fs::read_to_string(dir.join("nicd.0.log")).unwrap_or_default();
    assert!(log.contains(reason), "the daemon's log must say why: {log}");
    assert!(
        !dir.join("nic0.sock").exists()
            || emp().args(["info", "--dir"]).arg(dir).output().map(|o| !o.status.success()).unwrap_or(true)
    );
}

#[test]
fn tampered_or_unsigned_firmware_is_refused_with_the_reason() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let base = std::env::temp_dir().join(format!("emp-it-{}-fw", std::process::id()));
    let payload_byte = tampered_copy(&base.join("payload"), |len| len - 100);
    up_fails_with(&payload_byte, &base.join("payload"), "digest mismatch");
    // A byte of the signed header (the build id) changed: the signature fails.
    let header_byte = tampered_copy(&base.join("header"), |_| 20);
    up_fails_with(&header_byte, &base.join("header"), "signature");
    let _ = std::fs::remove_dir_all(&base);
}

/// A C program linked with `-lemp` records that it needs libemp.so.1 (the
/// SONAME) and, for each function it calls, version EMP_1.0: the dynamic
/// linker refuses it against a libemp without that version.
#[test]
fn c_example_needs_libemp_so_1_at_emp_1_0() {
    let out_bin = compile_c_example("pingpong");
    let readelf = |flag: &str| {
        let o = Command::new("readelf").args([flag, "-W"]).arg(&out_bin).output().expect("readelf (binutils)");
        assert!(o.status.success(), "readelf {flag} {}", out_bin.display());
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let dynamic = readelf("-d");
    let versions = readelf("-V");
    let symbols = readelf("--dyn-syms");
    let _ = std::fs::remove_file(&out_bin);
    assert!(dynamic.contains("Shared library: [libemp.so.1]"), "NEEDED entries:\n{dynamic}");
    // "  0x0010:   Name: EMP_1.0  Flags: none  Version: 2" under "File: libemp.so.1"
    let needs = versions.split("File: libemp.so.1").nth(1).unwrap_or_else(|| panic!("no libemp.so.1 in:\n{versions}"));
    let needs = needs.split("File: ").next().unwrap_or("");
    assert!(needs.contains("Name: EMP_1.0"), "libemp.so.1's needed versions:\n{versions}");
    for f in ["emp_open_device", "emp_post_send", "emp_wait_cq", "emp_close_device"] {
        assert!(symbols.contains(&format!(" {f}@EMP_1.0")), "{f} is not bound to EMP_1.0:\n{symbols}");
    }
}

#[test]
fn c_example_builds_and_runs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out_bin = compile_c_example("pingpong");
    let c = Cluster::up("c", &["-n", "2"]);
    let out = c.run(2, &[out_bin.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_file(&out_bin);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("rank 1 got \"ping from node 0\"") && text.contains("rank 0 got \"pong from node 1\""),
        "{text}"
    );
}

#[test]
fn c_collectives_example_builds_and_runs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out_bin = compile_c_example("allreduce");
    let c = Cluster::up("c-coll", &["-n", "4"]);
    let out = c.run(4, &[out_bin.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_file(&out_bin);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for r in 0..4 {
        assert!(
            text.contains(&format!("rank {r}: sum 10, \"hello from rank 0 of 4\", \"reply from rank 3\"")),
            "{text}"
        );
    }
}

/// `emp info` on a mem chassis: every NIC, the daemon's one wire with its
/// counters (injected loss shows), no route table (the mem wire has none);
/// the same counters through `emp::nic_wire_info`. On a udp chassis: one
/// wire per daemon, and the route table capped as asked.
#[test]
fn info_shows_wire_counters_and_routes() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("info", &["-n", "3", "--loss", "0.05"]);
    assert_tap(&c.run(3, &[env!("CARGO_BIN_EXE_tap-p2p")]), 10);
    let out = emp().args(["info", "--dir"]).arg(&c.dir).output().expect("info");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for n in 0..3 {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{n} ")) && l.contains("Running") && l.contains(" mem ")),
            "node {n} running on the mem wire:\n{text}"
        );
    }
    let wire: Vec<&str> = text.lines().filter(|l| l.starts_with("wire of emp-nicd")).collect();
    assert_eq!(wire.len(), 1, "one daemon, one wire:\n{text}");
    assert!(wire[0].contains("(node 0,1,2)"), "{text}");
    let count = |name: &str| -> u64 {
        let w = wire[0].split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}="))).expect(name);
        w.parse().expect("a number")
    };
    assert!(count("sent") > 0 && count("received") > 0, "{text}");
    assert!(count("lost") > 0, "5 % loss was injected:\n{text}");
    assert_eq!(count("malformed") + count("unknown_source"), 0, "{text}");
    assert!(text.contains("routes: none (the mem wire"), "{text}");
    assert!(
        text.contains("  multicast: mcast_sent=0 mcast_received=0 mcast_fallback=0"),
        "no multicast yet, counted as such:\n{text}"
    );

    let sock = c.sock(1);
    let w = emp::nic_wire_info(&sock).expect("wire info");
    assert_eq!(emp::nic_wire_mcast(&sock).expect("wire multicast"), emp::WireMcast::default());
    assert_eq!((w.kind, w.nodes, w.local_nics, w.local_index), (emp::WireKind::Mem, 3, 3, 1));
    assert_eq!(w.link, emp::Link::None, "the mem wire has no interface");
    assert!(w.counter("sent").unwrap() >= count("sent"), "counters only grow");
    let (nodes, routes) = emp::nic_routes(&sock, 1, 100).expect("routes");
    assert_eq!((nodes, routes.len(), routes[0].node), (3, 2, 1), "from node 1 to the end");
    match emp::nic_routes(&sock, 4, 1) {
        Err(emp::Error::Nic { errno: 22, .. }) => {}
        r => panic!("a first node beyond the table is EINVAL, got {r:?}"),
    }
    let stats = emp().args(["stats", "--dir"]).arg(&c.dir).output().expect("stats");
    assert!(stats.status.success());
    drop(c);

    let base = 40000 + (std::process::id() % 20000) as u16;
    let c = Cluster::up("info-udp", &["-n", "3", "--wire", "udp", "--udp-base", &base.to_string()]);
    let out = emp().args(["info", "--routes", "2", "--dir"]).arg(&c.dir).output().expect("info");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("wire of emp-nicd")).count(), 3, "a daemon per NIC:\n{text}");
    assert!(text.contains("routes of node 0 (3 nodes):"), "{text}");
    assert!(text.contains(&format!("  node 1     udp 127.0.0.1:{}", base + 1)), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("  node ")).count(), 2, "capped at 2:\n{text}");
    assert!(text.contains("… 1 more (emp info --routes 3)"), "{text}");
    drop(c);

    // Every NIC down: both fail, and say so.
    let dead = std::env::temp_dir().join(format!("emp-it-{}-info-dead", std::process::id()));
    std::fs::create_dir_all(&dead).unwrap();
    std::fs::write(dead.join("cluster"), "nics 2\npids\n").unwrap();
    for cmd in ["info", "stats"] {
        let o = emp().args([cmd, "--dir"]).arg(&dead).output().expect(cmd);
        assert!(!o.status.success(), "{cmd} with every NIC down must fail");
        assert!(String::from_utf8_lossy(&o.stderr).contains("every NIC is down"), "{cmd}");
    }
    let _ = std::fs::remove_dir_all(&dead);
}
