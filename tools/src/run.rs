//! `emp run -n N -- prog args…`: starts N ranks on the cluster's NICs
//! (round robin) with EMP_DEVICE, EMP_RANK, EMP_SIZE and a rendezvous
//! directory; waits for all; one failing rank stops the job.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::cluster::{read_state, socket};

/// Runs `argv` as `n` ranks; returns the job's exit status.
pub fn run(dir: &Path, n: usize, argv: &[String], timeout: Option<Duration>) -> Result<i32, String> {
    if n == 0 || argv.is_empty() {
        return Err("usage: emp run -n N -- program [args…]".into());
    }
    let s = read_state(dir)?;
    let rdv = dir.join(format!("job-{}", std::process::id()));
    std::fs::create_dir_all(&rdv).map_err(|e| format!("{}: {e}", rdv.display()))?;
    let result = run_ranks(dir, s.nics, n, argv, &rdv, timeout);
    let _ = std::fs::remove_dir_all(&rdv);
    result
}

fn spawn(dir: &Path, nics: u16, rank: usize, n: usize, argv: &[String], rdv: &PathBuf) -> Result<Child, String> {
    Command::new(&argv[0])
        .args(&argv[1..])
        .env("EMP_DEVICE", socket(dir, (rank % nics as usize) as u16))
        .env("EMP_RANK", rank.to_string())
        .env("EMP_SIZE", n.to_string())
        .env("EMP_RDV_DIR", rdv)
        .spawn()
        .map_err(|e| format!("{}: {e}", argv[0]))
}

fn run_ranks(
    dir: &Path,
    nics: u16,
    n: usize,
    argv: &[String],
    rdv: &PathBuf,
    timeout: Option<Duration>,
) -> Result<i32, String> {
    let mut kids: Vec<Option<Child>> = Vec::new();
    for r in 0..n {
        match spawn(dir, nics, r, n, argv, rdv) {
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
