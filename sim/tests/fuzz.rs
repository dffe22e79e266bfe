//! A short fuzzing run of each simulator target (`emp-sim fuzz` runs long
//! ones), and the crashes earlier runs found, replayed by seed.

use std::time::Duration;

use emp_sim::fuzz::{execute, run, Target};

/// A few seconds per target in `make test`; `EMP_FUZZ_SECONDS` overrides.
fn budget() -> Duration {
    Duration::from_secs_f64(std::env::var("EMP_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0))
}

fn short_run(target: Target, seed: u64) {
    let r = run(target, seed, budget(), u64::MAX);
    eprintln!(
        "fuzz {target:?} seed {seed}: {} executions, {} inputs, {} crashes",
        r.executions,
        r.inputs,
        r.crashes.len()
    );
    assert!(r.executions > 0, "no execution ran");
    assert!(r.crashes.is_empty(), "crashes (replay: emp-sim fuzz --target … --replay <seed>): {:#?}", r.crashes);
}

#[test]
fn fuzz_wire_frames_briefly() {
    short_run(Target::Frames, 0x00f2_a3e5);
}

#[test]
fn fuzz_work_descriptors_briefly() {
    short_run(Target::Descriptors, 0x0de5_c001);
}

/// The execution seeds earlier long runs found failing, fixed since.
const REGRESSIONS: &[(Target, u64)] = &[];

#[test]
fn fuzz_regressions_replay_clean() {
    for &(t, s) in REGRESSIONS {
        execute(t, s).unwrap_or_else(|e| panic!("{t:?} seed {s:#x}: {e}"));
    }
}
