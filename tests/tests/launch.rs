//! Ranks started by an existing launcher instead of `emp run`: Open MPI's
//! `mpirun` (a PMIx launcher) on one machine, against a `mem` chassis. Each
//! rank learns its rank, the job's size and its peers' endpoints through
//! PMIx, and its NIC from a cluster file (`EMP_CLUSTER`, by local rank) or
//! from `EMP_DEVICE`; the C job API (`emp_job_*`) does the same for C. See
//! docs/launch.md. Without `mpirun` installed (scripts/setup.sh installs
//! openmpi-bin) the mpirun tests say SKIP and pass; the `emp run` test runs
//! regardless.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use emp_tests::harness::{assert_tap, compile_c_example, Cluster};

/// The machine has 2 cores: one chassis at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The host name the cluster files below give the chassis (`EMP_HOST`).
const HOST: &str = "chassis";

/// `mpirun` on `PATH`, or `None` after saying the test is skipped.
fn mpirun(test: &str) -> Option<PathBuf> {
    let found =
        std::env::var_os("PATH").iter().flat_map(std::env::split_paths).map(|d| d.join("mpirun")).find(|p| p.is_file());
    if found.is_none() {
        println!("SKIP {test}: mpirun is not installed (scripts/setup.sh installs openmpi-bin)");
    }
    found
}

/// A cluster file naming the chassis's `nics` NICs, all on host [`HOST`].
fn cluster_file(c: &Cluster, nics: u16) -> PathBuf {
    let mut text = format!("[cluster]\nwire = \"mem\"\n\n[[host]]\nname = \"{HOST}\"\ndir = {:?}\n", c.dir);
    for id in 0..nics {
        text.push_str(&format!("\n[[node]]\nid = {id}\nhost = \"{HOST}\"\n"));
    }
    let path = c.dir.join("cluster.toml");
    std::fs::write(&path, text).expect("write the cluster file");
    path
}

/// `mpirun -n <n> <env…> <argv…>` on this machine, as root if need be,
/// every rank unbound (two cores for many ranks), at most 300 s.
fn run_mpirun(mpirun: &Path, n: usize, env: &[(&str, &str)], argv: &[&str]) -> Output {
    let mut cmd = Command::new(mpirun);
    cmd.args(["-n", &n.to_string(), "--bind-to", "none", "--oversubscribe", "--timeout", "300"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Not `emp run`'s job: nothing of it may leak in from the caller.
        .env_remove("EMP_RANK")
        .env_remove("EMP_SIZE")
        .env_remove("EMP_RDV_DIR")
        .env_remove("EMP_DEVICE")
        .env_remove("EMP_CLUSTER")
        .env_remove("EMP_HOST");
    for (k, v) in env {
        cmd.arg("-x").arg(format!("{k}={v}"));
    }
    cmd.args(argv).output().expect("run mpirun")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Checks job_ring's run: exit 0, and for every rank its line with the
/// token it got: ranks 0..rank in order (rank 0: every rank).
fn assert_ring(out: &Output, size: usize) {
    let all = text(out);
    assert!(out.status.success(), "job_ring failed:\n{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for r in 0..size {
        let upto = if r == 0 { size } else { r };
        let token: Vec<String> = (0..upto).map(|r| r.to_string()).collect();
        let (head, tail) = (format!("rank {r} of {size} on node "), format!(": got \"{}\" from", token.join(",")));
        assert!(
            stdout.lines().any(|l| l.starts_with(&head) && l.contains(&tail)),
            "no line `{head}…{tail}` in:\n{all}"
        );
    }
}

#[test]
fn tap_p2p_under_mpirun_ranks_find_their_nics_through_the_cluster_file() {
    let Some(mpirun) = mpirun("tap_p2p_under_mpirun") else { return };
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("mpi-p2p", &["-n", "4"]);
    let file = cluster_file(&c, 4);
    let file = file.to_str().expect("UTF-8 path");
    let out = run_mpirun(&mpirun, 4, &[("EMP_CLUSTER", file), ("EMP_HOST", HOST)], &[env!("CARGO_BIN_EXE_tap-p2p")]);
    assert_tap(&out, 10);
}

/// Eight C ranks on four NICs: two per NIC, on different ports, so rank r
/// is not NIC r, port 0; the token goes round the ring by the endpoints
/// the ranks learnt.
#[test]
fn c_job_ring_under_mpirun_two_ranks_per_nic_through_the_cluster_file() {
    let Some(mpirun) = mpirun("c_job_ring_under_mpirun") else { return };
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = compile_c_example("job_ring");
    let c = Cluster::up("mpi-ring", &["-n", "4"]);
    let file = cluster_file(&c, 4);
    let out = run_mpirun(
        &mpirun,
        8,
        &[("EMP_CLUSTER", file.to_str().expect("UTF-8")), ("EMP_HOST", HOST)],
        &[exe.to_str().expect("UTF-8")],
    );
    let _ = std::fs::remove_file(&exe);
    assert_ring(&out, 8);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("on node 1 port 1:"), "ranks 4..7 use port 1 of the NICs:\n{stdout}");
}

/// `EMP_DEVICE` wins over the cluster file: a wrapper gives each rank the
/// NIC of its local rank (reversed, so the cluster file's choice would
/// differ and is wrong on purpose: it names no such host).
#[test]
fn c_job_ring_under_mpirun_with_emp_device_per_local_rank() {
    let Some(mpirun) = mpirun("c_job_ring_emp_device") else { return };
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = compile_c_example("job_ring");
    let c = Cluster::up("mpi-dev", &["-n", "4"]);
    let file = cluster_file(&c, 4);
    let script =
        format!("EMP_DEVICE={}/nic$((3 - OMPI_COMM_WORLD_LOCAL_RANK)).sock exec {}", c.dir.display(), exe.display());
    let out = run_mpirun(
        &mpirun,
        4,
        &[("EMP_CLUSTER", file.to_str().expect("UTF-8")), ("EMP_HOST", "no-such-host")],
        &["sh", "-c", &script],
    );
    let _ = std::fs::remove_file(&exe);
    assert_ring(&out, 4);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("rank 0 of 4 on node 3 port 0:"), "local rank 0 is on NIC 3:\n{stdout}");
}

/// A cluster file that does not name this host: every rank stops with an
/// error that says so and lists the hosts it does name.
#[test]
fn a_rank_whose_host_is_not_in_the_cluster_file_says_so() {
    let Some(mpirun) = mpirun("a_rank_whose_host_is_not_in_the_cluster_file") else { return };
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = compile_c_example("job_ring");
    let c = Cluster::up("mpi-nohost", &["-n", "2"]);
    let file = cluster_file(&c, 2);
    let out = run_mpirun(
        &mpirun,
        2,
        &[("EMP_CLUSTER", file.to_str().expect("UTF-8")), ("EMP_HOST", "elsewhere")],
        &[exe.to_str().expect("UTF-8")],
    );
    let _ = std::fs::remove_file(&exe);
    let all = text(&out);
    assert!(!out.status.success(), "no rank may run without its NIC:\n{all}");
    assert!(all.contains("no host \"elsewhere\" (EMP_HOST") && all.contains(&format!("hosts are {HOST}")), "{all}");
}

/// The same C program under `emp run`: six ranks on three NICs.
#[test]
fn c_job_ring_under_emp_run_learns_its_peers() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = compile_c_example("job_ring");
    let c = Cluster::up("run-ring", &["-n", "3"]);
    let out = c.run(6, &[exe.to_str().expect("UTF-8")]);
    let _ = std::fs::remove_file(&exe);
    assert_ring(&out, 6);
}
