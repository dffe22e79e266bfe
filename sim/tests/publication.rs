//! The completion publication contract (`emp_uapi::desc::Cqe`) under a
//! weakly ordered DMA engine (`emp_sim::weak_dma`): the NIC's writes appear
//! late and in random byte order unless a fence separates them, and every
//! host checks each completion it accepts on its phase byte against what
//! the NIC wrote. A control program that published the phase byte in the
//! same DMA as the rest of the entry, or without a fence, fails here with
//! "torn CQE" (checked against the layout and publication before version 3).

use emp_sim::{run, Spec};

fn run_weak(mut spec: Spec) {
    spec.weak_dma = true;
    let seed = spec.seed;
    #[allow(clippy::result_large_err)] // a failure carries the whole trace
    let result = std::panic::catch_unwind(|| run(&spec));
    match result {
        Ok(Ok(_)) => {}
        Ok(Err(f)) => panic!("{f}"),
        Err(e) => {
            let why = e.downcast_ref::<String>().cloned().unwrap_or_default();
            panic!("seed {seed}: {why}\n  replay: {}", spec.replay_command());
        }
    }
}

#[test]
fn test_weak_dma_streaming_every_accepted_completion_is_whole() {
    for seed in 0..8 {
        let mut spec = Spec::basic(seed, 4, 400);
        spec.spread_ns = 50_000; // Dense: completions land while the host polls.
        run_weak(spec);
    }
}

#[test]
fn test_weak_dma_swarm_seeds_pass_every_invariant() {
    let mut passed = 0;
    for seed in 0..200 {
        run_weak(Spec::swarm(seed));
        passed += 1;
    }
    println!("weak-dma swarm: {passed} passed, 0 failed");
}
