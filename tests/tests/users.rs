//! emp-nicd and its clients need no privilege on the `mem` and `udp` wires:
//! a cluster started by uid 65534 (nobody) serves tap-p2p run by the same
//! user, and another user cannot reach its NICs. Run as root, the test drops
//! to those uids with setpriv; run as anyone else, it already is an ordinary
//! user and runs the cluster as itself. It needs `make build` first.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use emp_tests::harness::{assert_tap, bin_dir, image};

/// The machine has 2 cores: one chassis at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const NOBODY: u32 = 65534;
/// Another unprivileged uid, in no group of nobody's.
const STRANGER: u32 = 65533;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `program args…` as `uid` (when we are root), else as ourselves.
fn as_user(uid: u32, program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={uid}")).arg(format!("--regid={uid}")).arg("--clear-groups").arg("--").arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// A cluster owned by an ordinary user, brought down (by that user) and its
/// directory removed when the test ends.
struct UserCluster {
    dir: PathBuf,
    emp: PathBuf,
}

impl UserCluster {
    fn up(name: &str, wire: &str) -> UserCluster {
        let emp = bin_dir().join("emp");
        assert!(emp.exists(), "{} missing: run `make build`", emp.display());
        let dir = std::env::temp_dir().join(format!("emp-user-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = UserCluster { dir, emp };
        let out = c.emp(NOBODY, &["cluster", "up", "-n", "2", "--wire", wire, "--firmware"], &[image().as_path()]);
        assert!(
            out.status.success(),
            "cluster up as uid {NOBODY} failed (the binaries, the image and its keys must be readable by it): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    /// `emp <args> <paths> --dir <dir>` as `uid`.
    fn emp(&self, uid: u32, args: &[&str], paths: &[&Path]) -> Output {
        as_user(uid, &self.emp).args(args).args(paths).arg("--dir").arg(&self.dir).output().expect("emp")
    }

    fn run(&self, uid: u32, program: &str) -> Output {
        as_user(uid, &self.emp)
            .args(["run", "--timeout", "300", "-n", "2", "--dir"])
            .arg(&self.dir)
            .arg("--")
            .arg(program)
            .output()
            .expect("emp run")
    }

    /// The uid owning the cluster's sockets.
    fn socket_owner(&self) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.dir.join("nic0.sock")).expect("nic0.sock").uid()
    }
}

impl Drop for UserCluster {
    fn drop(&mut self) {
        let _ = self.emp(NOBODY, &["cluster", "down"], &[]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unprivileged_cluster(wire: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = UserCluster::up(wire, wire);
    if is_root() {
        assert_eq!(c.socket_owner(), NOBODY, "the NIC sockets are not the unprivileged user's");
    }
    assert_tap(&c.run(NOBODY, env!("CARGO_BIN_EXE_tap-p2p")), 10);
    if is_root() {
        // Connecting to a Unix socket needs write permission on it: the
        // sockets are the owner's alone.
        let out = c.run(STRANGER, env!("CARGO_BIN_EXE_tap-p2p"));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success(), "uid {STRANGER} used uid {NOBODY}'s NICs:\n{text}");
        assert!(text.contains("Permission denied"), "uid {STRANGER} was refused, but not for permission:\n{text}");
    }
}

#[test]
fn unprivileged_cluster_runs_tap_p2p_mem_wire() {
    unprivileged_cluster("mem");
}

#[test]
fn unprivileged_cluster_runs_tap_p2p_udp_wire() {
    unprivileged_cluster("udp");
}
