//! `emp run -n N -- prog args…`: starts N ranks on the cluster's NICs
//! (round robin) with EMP_DEVICE, EMP_RANK, EMP_SIZE and a rendezvous
//! directory; waits for all; one failing rank stops the job.
//!
//! With `--config F`, the NICs are the cluster file's nodes: rank r runs on
//! node r mod nodes, started through its host's `launch` prefix. The
//! rendezvous is a directory every host must see (a temporary one on one
//! machine: namespaces share the file system); across real hosts a job is
//! launched by mpirun instead, which exchanges endpoints through PMIx.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use emp_config::ClusterConfig;

use crate::cluster::{read_state, socket};

/// Runs `argv` as `n` ranks; returns the job's exit status.
pub fn run(dir: &Path, n: usize, argv: &[String], timeout: Option<Duration>) -> Result<i32, String> {
    if n == 0 || argv.is_empty() {
        return Err("usage: emp run -n N -- program [args…]".into());
    }
    let s = read_state(dir)?;
    let rdv = dir.join(format!("job-{}", std::process::id()));
    std::fs::create_dir_all(&rdv).map_err(|e| format!("{}: {e}", rdv.display()))?;
    let result = run_ranks(n, timeout, |rank| {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env("EMP_DEVICE", socket(dir, (rank % s.nics as usize) as u16))
            .env("EMP_RANK", rank.to_string())
            .env("EMP_SIZE", n.to_string())
            .env("EMP_RDV_DIR", &rdv);
        cmd
    });
    let _ = std::fs::remove_dir_all(&rdv);
    result
}

/// `emp run --config F -n N -- prog args…`: runs `argv` as `n` ranks on
/// the file's nodes; returns the job's exit status.
pub fn run_on_hosts(
    config: &Path,
    rdv_dir: Option<PathBuf>,
    n: usize,
    argv: &[String],
    timeout: Option<Duration>,
) -> Result<i32, String> {
    if n == 0 || argv.is_empty() {
        return Err("usage: emp run --config FILE -n N -- program [args…]".into());
    }
    let cfg = ClusterConfig::load(config).map_err(|e| e.to_string())?;
    let rdv = match rdv_dir {
        Some(d) => d.join(format!("job-{}", std::process::id())),
        None => std::env::temp_dir().join(format!("emp-job-{}", std::process::id())),
    };
    std::fs::create_dir_all(&rdv).map_err(|e| format!("{}: {e}", rdv.display()))?;
    let result = run_ranks(n, timeout, |r| {
        let node = &cfg.nodes[r % cfg.nodes.len()];
        let host = cfg.host(&node.host).expect("checked on load");
        let device = cfg.socket(node.id).expect("node of this file");
        let env = [
            ("EMP_DEVICE", device.to_string_lossy().into_owned()),
            ("EMP_RANK", r.to_string()),
            ("EMP_SIZE", n.to_string()),
            ("EMP_RDV_DIR", rdv.to_string_lossy().into_owned()),
        ];
        let mut cmd;
        if host.launch.is_empty() {
            cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..]).envs(env);
        } else {
            // Through `env`: a launcher (ssh) need not pass our environment on.
            cmd = Command::new(&host.launch[0]);
            cmd.args(&host.launch[1..]).arg("env").args(env.iter().map(|(k, v)| format!("{k}={v}"))).args(argv);
        }
        cmd
    });
    let _ = std::fs::remove_dir_all(&rdv);
    result
}

fn run_ranks(n: usize, timeout: Option<Duration>, command: impl Fn(usize) -> Command) -> Result<i32, String> {
    let mut kids: Vec<Option<Child>> = Vec::new();
    for r in 0..n {
        let mut cmd = command(r);
        match cmd.spawn().map_err(|e| format!("{}: {e}", cmd.get_program().to_string_lossy())) {
            Ok(c) => kids.push(Some(c)),
            Err(e) => {
                kill_all(&mut kids);
                return Err(e);
            }
        }
    }
    let start = Instant::now();
    let mut status = 0;
    while kids.iter().any(|k| k.is_some()) {
        for (r, k) in kids.iter_mut().enumerate() {
            let Some(c) = k else { continue };
            if let Ok(Some(st)) = c.try_wait() {
                *k = None;
                let code = st.code().unwrap_or(128 + std::os::unix::process::ExitStatusExt::signal(&st).unwrap_or(0));
                if code != 0 && status == 0 {
                    eprintln!("emp run: rank {r} exited with status {code}; stopping the job");
                    status = code;
                }
            }
        }
        if status != 0 {
            kill_all(&mut kids);
            break;
        }
        if timeout.is_some_and(|t| start.elapsed() > t) {
            eprintln!("emp run: timed out after {:?}", timeout.expect("some"));
            kill_all(&mut kids);
            return Ok(124);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(status)
}

fn kill_all(kids: &mut [Option<Child>]) {
    for c in kids.iter_mut().flatten() {
        let _ = c.kill();
        let _ = c.wait();
    }
}
