//! Remote atomics, writes and reads over real `emp-nicd` daemons: the
//! atomics TAP suite (a fetch-add hammer on one word, semantics, refusals,
//! the MCS lock, the host-served baseline) on 2 to 8 ranks, with loss; the
//! RMA TAP suite (writes, reads, immediate data, refusals) on 2 and 4
//! ranks; the MCS example; the C example. They need the release binaries, examples and the signed
//! image (`make test` builds them; `EMP_BIN_DIR` overrides where they are).

use std::process::Command;
use std::sync::Mutex;

use emp_tests::harness::{assert_tap, bin_dir, root, Cluster};

/// The machine has 2 cores: one chassis at a time.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn tap_atomics_two_ranks() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("atomics2", &["-n", "2"]);
    assert_tap(&c.run(2, &[env!("CARGO_BIN_EXE_tap-atomics")]), 5);
}

#[test]
fn tap_atomics_eight_ranks_on_four_nics_with_loss() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("atomics8", &["-n", "4", "--loss", "0.05", "--dup", "0.05", "--reorder", "0.1"]);
    assert_tap(&c.run(8, &[env!("CARGO_BIN_EXE_tap-atomics")]), 5);
    let stats = emp_tests::harness::emp().args(["stats", "--dir"]).arg(&c.dir).output().expect("stats");
    let text = String::from_utf8_lossy(&stats.stdout);
    let replays: u64 = text
        .lines()
        .find(|l| l.starts_with("atomic_replays"))
        .unwrap_or_else(|| panic!("no atomic_replays row in:\n{text}"))
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>().unwrap())
        .sum();
    assert!(replays > 0, "duplicated requests must have been answered from the result cache:\n{text}");
}

#[test]
fn mcs_lock_example_loses_no_update() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = bin_dir().join("examples/mcs_lock");
    assert!(exe.exists(), "{} missing: `make build` builds the examples", exe.display());
    let c = Cluster::up("mcs", &["-n", "2"]);
    let out = c.run(4, &[exe.to_str().unwrap(), "40"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("counter = 160 (expected 160)"), "{text}");
}

#[test]
fn c_atomic_example_builds_and_runs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out_bin = std::env::temp_dir().join(format!("emp-c-atomic-{}", std::process::id()));
    // The C library `make build` links (scripts/libemp-link.sh).
    let lib = bin_dir().join("lib");
    assert!(
        lib.join("libemp.so.1").exists() && lib.join("libemp.so").exists(),
        "{}/libemp.so.1 or libemp.so missing: run `make build` (it links the C library from libemp's staticlib)",
        lib.display()
    );
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-Wall", "-Wextra", "-Werror", "-O2", "-I"])
        .arg(root().join("libemp/include"))
        .arg(root().join("libemp/examples/c/atomic_counter.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-lemp")
        // RPATH, not RUNPATH: cargo's LD_LIBRARY_PATH must not win over
        // the release library.
        .arg("-Wl,--disable-new-dtags")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&out_bin)
        .status()
        .expect("a C compiler (cc) is required");
    assert!(st.success(), "the C example must compile");
    let c = Cluster::up("catomic", &["-n", "3"]);
    let out = c.run(3, &[out_bin.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_file(&out_bin);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("counter = 102 (expected 102)"), "{text}");
}

#[test]
fn tap_rma_two_ranks() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("rma2", &["-n", "2"]);
    let out = c.run(2, &[env!("CARGO_BIN_EXE_tap-rma")]);
    // The guesser's figures, for the record.
    for l in String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("# ") && l.contains("guess")) {
        eprintln!("{l}");
    }
    assert_tap(&out, 5);
}

#[test]
fn tap_rma_four_ranks_with_loss_counts_refusals() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("rma4", &["-n", "2", "--loss", "0.05", "--dup", "0.05", "--reorder", "0.1"]);
    assert_tap(&c.run(4, &[env!("CARGO_BIN_EXE_tap-rma")]), 5);
    let stats = emp_tests::harness::emp().args(["stats", "--dir"]).arg(&c.dir).output().expect("stats");
    let text = String::from_utf8_lossy(&stats.stdout);
    let refused: u64 = text
        .lines()
        .find(|l| l.starts_with("remote_refused"))
        .unwrap_or_else(|| panic!("no remote_refused row in:\n{text}"))
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>().unwrap())
        .sum();
    assert!(refused >= 1007, "the refusals must show in `emp stats`:\n{text}");
    let throttled: u64 = text
        .lines()
        .find(|l| l.starts_with("remote_throttled"))
        .unwrap_or_else(|| panic!("no remote_throttled row in:\n{text}"))
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse::<u64>().unwrap())
        .sum();
    assert!(throttled > 0, "the guesser must show as throttled in `emp stats`:\n{text}");
}

#[test]
fn c_rma_example_builds_and_runs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out_bin = std::env::temp_dir().join(format!("emp-c-rma-{}", std::process::id()));
    let lib = bin_dir().join("lib");
    assert!(lib.join("libemp.so.1").exists(), "{}/libemp.so.1 missing: run `make build`", lib.display());
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-Wall", "-Wextra", "-Werror", "-O2", "-I"])
        .arg(root().join("libemp/include"))
        .arg(root().join("libemp/examples/c/rma_pair.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-lemp")
        .arg("-Wl,--disable-new-dtags")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&out_bin)
        .status()
        .expect("a C compiler (cc) is required");
    assert!(st.success(), "the C example must compile");
    let c = Cluster::up("crma", &["-n", "2"]);
    let out = c.run(2, &[out_bin.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_file(&out_bin);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("rma ok") && text.contains("window: hello from rank 0"), "{text}");
}
