//! The libfabric provider `emp` (fabric/, `libemp-fi.so`, loaded through
//! `FI_PROVIDER_PATH`) under clients nobody here wrote, on a `mem`
//! chassis: `fi_info -p emp`, the distribution's `fi_pingpong` in msg and
//! tagged modes with data checks at every size, the provider's own unit
//! test program (fabric/test/fi_emp_unit.c, TAP), and Open MPI's `mtl ofi`
//! running fabric/test/mpi_emp.c over it on 4 and 8 ranks and the
//! out-of-order tags program fabric/test/mpi_ooo.c, MPI one-sided through `osc rdma`
//! on `btl ofi`, RMA/atomics/collectives across two NICs
//! (fabric/test/fi_emp_peer.c), and the provider fuzzer (fabric/test/fi_emp_fuzz.c: short
//! here, long with `EMP_FUZZ_SECONDS=600 cargo test -p emp-tests --test
//! fabric provider_fuzz -- --nocapture`). See docs/libfabric.md. Without
//! libfabric-bin or Open MPI (scripts/setup.sh installs them) the tests that
//! need them say SKIP and pass.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use emp_tests::harness::{assert_tap, bin_dir, root, Cluster};

/// The machine has 2 cores, and fi_pingpong's control port is fixed: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The directory `make build` puts libemp-fi.so in (`FI_PROVIDER_PATH`).
fn provider_dir() -> PathBuf {
    let lib = bin_dir().join("lib");
    assert!(lib.join("libemp-fi.so").exists(), "{}/libemp-fi.so missing: run `make build`", lib.display());
    lib
}

/// `tool` on `PATH`, or `None` after saying the test is skipped.
fn tool(test: &str, tool: &str, package: &str) -> Option<PathBuf> {
    let found =
        std::env::var_os("PATH").iter().flat_map(std::env::split_paths).map(|d| d.join(tool)).find(|p| p.is_file());
    if found.is_none() {
        println!("SKIP {test}: {tool} is not installed (scripts/setup.sh installs {package})");
    }
    found
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A command with the provider's path and NIC `nic` of `c`, nothing else of EMP's.
fn fabric_cmd(program: &Path, c: &Cluster, nic: u16) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("FI_PROVIDER_PATH", provider_dir())
        .env("EMP_DEVICE", c.socket(nic))
        .env_remove("EMP_CLUSTER")
        .env_remove("EMP_RANK")
        .env_remove("FI_PROVIDER");
    cmd
}

/// Waits for `child` (killed after `limit`), its output read meanwhile: a
/// child whose output fills the pipe would otherwise block for ever.
fn wait_timeout(mut child: Child, limit: Duration) -> Output {
    fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    }
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = child.wait().expect("wait");
    Output { status, stdout: out.join().expect("stdout reader"), stderr: err.join().expect("stderr reader") }
}

#[test]
fn fi_info_lists_emp() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(fi_info) = tool("fi_info_lists_emp", "fi_info", "libfabric-bin") else { return };
    let c = Cluster::up("fabric-info", &["-n", "1"]);
    let out = fabric_cmd(&fi_info, &c, 0).args(["-p", "emp"]).output().expect("fi_info");
    let all = text(&out);
    assert!(out.status.success(), "fi_info -p emp failed:\n{all}");
    assert!(all.contains("provider: emp") && all.contains("FI_EP_RDM"), "no emp entry:\n{all}");
    // Tagged only: every tag bit is the caller's; refused hints give nothing.
    let out = fabric_cmd(&fi_info, &c, 0).args(["-p", "emp", "-c", "FI_TAGGED", "-v"]).output().expect("fi_info");
    assert!(text(&out).contains("mem_tag_format: 0xffffffffffffffff"), "tag format:\n{}", text(&out));
    // RMA when asked: 64-bit keys (the NIC's key and secret), offsets.
    let out = fabric_cmd(&fi_info, &c, 0).args(["-p", "emp", "-c", "FI_MSG|FI_RMA", "-v"]).output().expect("fi_info");
    let rma = text(&out);
    assert!(out.status.success() && rma.contains("FI_RMA"), "FI_RMA not offered:\n{rma}");
    assert!(rma.contains("mr_key_size: 8") && rma.contains("cq_data_size: 4"), "RMA attributes:\n{rma}");
    for caps in ["FI_ATOMIC", "FI_COLLECTIVE", "FI_TAGGED|FI_RMA|FI_ATOMIC"] {
        let out = fabric_cmd(&fi_info, &c, 0).args(["-p", "emp", "-c", caps]).output().expect("fi_info");
        assert!(out.status.success(), "fi_info -c {caps}:\n{}", text(&out));
    }
    let out = fabric_cmd(&fi_info, &c, 0).args(["-p", "emp", "-c", "FI_RMA_EVENT"]).output().expect("fi_info");
    assert!(!out.status.success(), "FI_RMA_EVENT is not offered, fi_info said:\n{}", text(&out));
    // No NIC for the process: no entry, no crash.
    let out = Command::new(&fi_info)
        .env("FI_PROVIDER_PATH", provider_dir())
        .env_remove("EMP_DEVICE")
        .env_remove("EMP_CLUSTER")
        .args(["-p", "emp"])
        .output()
        .expect("fi_info");
    assert!(!out.status.success(), "fi_info without a NIC:\n{}", text(&out));
}

/// `fi_pingpong -p emp -e rdm -m <mode> -c -S all`: server on NIC 0, client on NIC 1.
fn pingpong(mode: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let test = format!("fi_pingpong_{mode}");
    let Some(pp) = tool(&test, "fi_pingpong", "libfabric-bin") else { return };
    let c = Cluster::up(&format!("fabric-pp-{mode}"), &["-n", "2"]);
    // A control port of our own: other runs on this machine use the default.
    let port = (20000 + std::process::id() % 20000).to_string();
    let args = ["-p", "emp", "-e", "rdm", "-m", mode, "-c", "-S", "all", "-I", "10"];
    let server = fabric_cmd(&pp, &c, 0)
        .args(args)
        .args(["-B", &port])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    // The client needs the server listening: retry while it is not yet.
    let mut client = None;
    for _ in 0..100 {
        let out = fabric_cmd(&pp, &c, 1).args(args).args(["-P", &port, "127.0.0.1"]).output().expect("client");
        if !text(&out).contains("Connection refused") {
            client = Some(out);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let server = wait_timeout(server, Duration::from_secs(120));
    let client = client.expect("the fi_pingpong server never listened");
    let (s, cl) = (text(&server), text(&client));
    assert!(server.status.success() && client.status.success(), "server:\n{s}\nclient:\n{cl}");
    // One line per size, 1 B to 6 MiB, each with all transfers acknowledged.
    for size in ["1 ", "64 ", "1k ", "64k ", "1m ", "6m "] {
        assert!(
            cl.lines().any(|l| l.starts_with(size) && l.contains("=10")),
            "no completed {size}line in the client's output:\n{cl}"
        );
    }
    print!("{cl}");
}

#[test]
fn fi_pingpong_msg() {
    pingpong("msg");
}

#[test]
fn fi_pingpong_tagged() {
    pingpong("tagged");
}

#[test]
fn provider_unit_tests() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let unit = provider_dir().join("fi_emp_unit");
    assert!(unit.exists(), "{} missing: run `make build` (fabric/build.sh)", unit.display());
    let c = Cluster::up("fabric-unit", &["-n", "1"]);
    let child = fabric_cmd(&unit, &c, 0).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("unit");
    let out = wait_timeout(child, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let planned: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("1.."))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no TAP plan:\n{}", text(&out)));
    assert!(planned > 300, "the unit program ran only {planned} checks");
    assert_tap(&out, planned);
}

/// A cluster file naming the chassis's NICs on one host, `chassis`.
fn cluster_file(c: &Cluster, nics: u16) -> PathBuf {
    let mut text = format!("[cluster]\nwire = \"mem\"\n\n[[host]]\nname = \"chassis\"\ndir = {:?}\n", c.dir);
    for id in 0..nics {
        text.push_str(&format!("\n[[node]]\nid = {id}\nhost = \"chassis\"\n"));
    }
    let path = c.dir.join("cluster.toml");
    std::fs::write(&path, text).expect("write the cluster file");
    path
}

/// Open MPI 4.1's `mtl ofi`, on a provider without remote CQ data for
/// tagged messages (emp: EMP sends carry no immediate data), uses its
/// `ofi_tag_1` layout (source rank in the tag) yet posts the receive for an
/// MPI_Ssend's acknowledgement with `src_addr` 0 while it asked for
/// `FI_DIRECTED_RECV`: the provider honours the address, the ack comes from
/// another rank, and the sender waits for ever. The tuned barrier's double
/// ring and recursive doubling (its choice for 3 ranks or more) use such
/// sends; Bruck's algorithm does not. See docs/libfabric.md.
const BARRIER_WITHOUT_SSEND: [(&str, &str); 2] =
    [("coll_tuned_use_dynamic_rules", "1"), ("coll_tuned_barrier_algorithm", "4")];

/// Builds `fabric/test/<source>` with mpicc and runs it on `ranks` ranks
/// under the distribution's Open MPI over emp (`pml cm`, `mtl ofi`, plus
/// `extra_mca` pairs), each rank on its own NIC of a chassis; None when
/// Open MPI is not installed.
fn mpirun_over_emp(test: &str, source: &str, ranks: u16, extra_mca: &[(&str, &str)]) -> Option<Output> {
    let mpirun = tool(test, "mpirun", "openmpi-bin")?;
    let mpicc = tool(test, "mpicc", "libopenmpi-dev")?;
    let prog = std::env::temp_dir().join(format!("emp-{test}-{}", std::process::id()));
    let st = Command::new(mpicc)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&prog)
        .arg(root().join("fabric/test").join(source))
        .status()
        .expect("mpicc");
    assert!(st.success(), "fabric/test/{source} must compile");
    let c = Cluster::up(test, &["-n", &ranks.to_string()]);
    let cluster = cluster_file(&c, ranks);
    let mut cmd = Command::new(mpirun);
    cmd.args(["-n", &ranks.to_string(), "--bind-to", "none", "--oversubscribe", "--timeout", "300"]);
    cmd.args(["--mca", "pml", "cm", "--mca", "mtl", "ofi", "--mca", "mtl_ofi_provider_include", "emp"]);
    for (k, v) in extra_mca {
        cmd.args(["--mca", k, v]);
    }
    // Each rank's NIC: the cluster file's nodes of this host, by local rank.
    let out = cmd
        .arg("-x")
        .arg(format!("FI_PROVIDER_PATH={}", provider_dir().display()))
        .arg("-x")
        .arg(format!("EMP_CLUSTER={}", cluster.display()))
        .args(["-x", "EMP_HOST=chassis"])
        .arg(&prog)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("EMP_DEVICE")
        .env_remove("EMP_RANK")
        .env_remove("EMP_SIZE")
        .env_remove("EMP_RDV_DIR")
        .output()
        .expect("mpirun");
    let _ = std::fs::remove_file(&prog);
    Some(out)
}

/// fabric/test/mpi_emp.c (point-to-point, wildcard receives, every
/// collective) on `ranks` ranks, one NIC each.
fn open_mpi_ranks(ranks: u16) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let test = format!("open_mpi_over_emp_{ranks}");
    let Some(out) = mpirun_over_emp(&test, "mpi_emp.c", ranks, &BARRIER_WITHOUT_SSEND) else { return };
    let all = text(&out);
    print!("{all}");
    assert!(out.status.success(), "mpirun -n {ranks} over emp failed:\n{all}");
    assert!(all.contains("# 20 passed, 0 failed"), "MPI checks on {ranks} ranks:\n{all}");
}

#[test]
fn open_mpi_over_emp_4_ranks() {
    open_mpi_ranks(4);
}

#[test]
fn open_mpi_over_emp_8_ranks() {
    open_mpi_ranks(8);
}

/// The out-of-order tags program under Open MPI (fabric/test/mpi_ooo.c):
/// tag 2 received before tag 1, 64 B and 4 MiB, after MPI_Iprobe and
/// MPI_Probe with MPI_ANY_SOURCE (the provider's FI_PEEK) saw them.
#[test]
fn open_mpi_out_of_order_tags() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(out) = mpirun_over_emp("open_mpi_out_of_order_tags", "mpi_ooo.c", 2, &[]) else { return };
    let all = text(&out);
    print!("{all}");
    assert!(out.status.success(), "mpirun (out-of-order tags) over emp failed:\n{all}");
    assert!(all.contains("# 8 passed, 0 failed"), "out-of-order checks:\n{all}");
}

/// MPI one-sided through Open MPI's `osc rdma` on `btl ofi` over emp's
/// FI_RMA and FI_ATOMIC: puts, gets, accumulate, fetch-and-op, locks.
#[test]
fn open_mpi_one_sided_over_emp() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mca = [("osc", "rdma"), ("btl", "ofi,self"), ("btl_ofi_provider_include", "emp")];
    let Some(out) = mpirun_over_emp("open_mpi_one_sided_over_emp", "mpi_emp_osc.c", 2, &mca) else { return };
    let all = text(&out);
    print!("{all}");
    assert!(out.status.success(), "mpirun (osc rdma, btl ofi) over emp failed:\n{all}");
    assert!(all.contains("# 8 passed, 0 failed"), "MPI one-sided checks:\n{all}");
}

/// Runs `fi_emp_fuzz` (random calls, arguments and object lifecycles on
/// one NIC) with fresh seeds for `EMP_FUZZ_SECONDS` (default 4): every
/// run must end with no crash, no hang and only proper `-FI_E*` returns,
/// and the NIC must still serve the unit program's traffic afterwards.
#[test]
fn provider_fuzz() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let fuzz = provider_dir().join("fi_emp_fuzz");
    assert!(fuzz.exists(), "{} missing: run `make build` (fabric/build.sh)", fuzz.display());
    let budget =
        Duration::from_secs_f64(std::env::var("EMP_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4.0));
    let c = Cluster::up("fabric-fuzz", &["-n", "1"]);
    let start = Instant::now();
    let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let (mut runs, mut calls) = (0u64, 0u64);
    while runs == 0 || start.elapsed() < budget {
        let seed = base.wrapping_add(runs.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let child = fabric_cmd(&fuzz, &c, 0)
            .args(["--seed", &seed.to_string(), "--calls", "3000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("fi_emp_fuzz");
        let out = wait_timeout(child, Duration::from_secs(300));
        let all = text(&out);
        assert!(
            out.status.success(),
            "fi_emp_fuzz failed (exit {:?}); reproduce with FI_PROVIDER_PATH={} EMP_DEVICE=<nic socket> \
             {} --seed {seed} --calls 3000:\n{all}",
            out.status,
            provider_dir().display(),
            fuzz.display()
        );
        calls += all
            .lines()
            .find_map(|l| l.strip_prefix("# fuzz: seed ").and_then(|r| r.split(", ").nth(1)))
            .and_then(|n| n.trim_end_matches(" calls").parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no summary line:\n{all}"));
        runs += 1;
    }
    println!("fi_emp_fuzz: {runs} runs, {calls} calls, no crash, every return a proper -FI_E*");
    // The NIC still works for a well-behaved client.
    let unit = provider_dir().join("fi_emp_unit");
    let child = fabric_cmd(&unit, &c, 0).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("unit");
    let out = wait_timeout(child, Duration::from_secs(180));
    assert!(out.status.success(), "the unit program after fuzzing:\n{}", text(&out));
}

/// RMA, atomics and collectives across two NICs: fabric/test/fi_emp_peer.c
/// as rank 0 on NIC 0 and rank 1 on NIC 1, exchanging names and keys
/// through files.
#[test]
fn provider_two_nics() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let peer = provider_dir().join("fi_emp_peer");
    assert!(peer.exists(), "{} missing: run `make build` (fabric/build.sh)", peer.display());
    let c = Cluster::up("fabric-peer", &["-n", "2"]);
    let xdir = c.dir.join("exchange");
    std::fs::create_dir_all(&xdir).expect("exchange dir");
    let spawn = |rank: u16| {
        fabric_cmd(&peer, &c, rank)
            .arg(rank.to_string())
            .arg(&xdir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("fi_emp_peer")
    };
    let (r0, r1) = (spawn(0), spawn(1));
    let (o0, o1) = (wait_timeout(r0, Duration::from_secs(180)), wait_timeout(r1, Duration::from_secs(180)));
    for (rank, out) in [(0, &o0), (1, &o1)] {
        let all = text(out);
        print!("{all}");
        assert!(out.status.success(), "fi_emp_peer rank {rank} failed:\n{all}");
        assert!(all.contains(" passed, 0 failed"), "rank {rank}: no TAP summary:\n{all}");
    }
}
