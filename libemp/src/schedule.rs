//! Barrier schedules (seed 001 ch. 3): which rank sends to and waits for
//! whom, step by step. The host computes a schedule once per group; the
//! NIC (or the host baseline) only follows it.
//!
//! - Pairwise exchange (PE, 001 §3.3.1, MPICH's): with S the largest power
//!   of two ≤ N, ranks r ≥ S first hand their arrival to r − S and later
//!   wait for its release; ranks r < S exchange with r XOR 2^i for each
//!   round i; then release r + S. ⌊log2 N⌋ + 2 steps at most.
//! - Dissemination (Hensgen, Finkel and Manber): ⌈log2 N⌉ rounds for any
//!   N; in round k rank r sends to r + 2^k and waits for r − 2^k (mod N).

pub use emp_uapi::coll::{BarrierAlgo, Step, PE_PRE, PE_RELEASE};

/// The steps rank `rank` of `n` runs, in order (empty for gather-release,
/// whose steps follow a tree).
///
/// # Panics
/// If `n` is 0 or above 65 535, or `rank` ≥ `n`.
pub fn barrier_schedule(algo: BarrierAlgo, n: usize, rank: usize) -> Vec<Step> {
    assert!((1..1 << 16).contains(&n) && rank < n, "rank {rank} of {n}");
    (0..).map_while(|i| emp_uapi::coll::barrier_step(algo, n as u16, rank as u16, i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, VecDeque};

    /// Runs every rank's schedule with asynchronous sends and blocking
    /// receives; each message carries the set of ranks its sender knows
    /// have arrived. Returns each rank's final knowledge, or `None` on
    /// deadlock or an unmatched message.
    fn run(algo: BarrierAlgo, n: usize, order: &[usize]) -> Option<Vec<BTreeSet<usize>>> {
        let scheds: Vec<Vec<Step>> = (0..n).map(|r| barrier_schedule(algo, n, r)).collect();
        let mut pc = vec![0usize; n];
        let mut know: Vec<BTreeSet<usize>> = (0..n).map(|r| BTreeSet::from([r])).collect();
        // In flight: (from, to, round, knowledge).
        let mut wire: VecDeque<(usize, usize, u8, BTreeSet<usize>)> = VecDeque::new();
        loop {
            let mut progressed = false;
            for &r in order {
                while let Some(step) = scheds[r].get(pc[r]) {
                    match *step {
                        Step::Send { to, round } => wire.push_back((r, to as usize, round, know[r].clone())),
                        Step::Recv { from, round } => {
                            let Some(i) = wire.iter().position(|m| m.0 == from as usize && m.1 == r && m.2 == round)
                            else {
                                break;
                            };
                            let m = wire.remove(i).expect("found");
                            know[r].extend(m.3);
                        }
                    }
                    pc[r] += 1;
                    progressed = true;
                }
            }
            if (0..n).all(|r| pc[r] == scheds[r].len()) {
                return wire.is_empty().then_some(know);
            }
            if !progressed {
                return None;
            }
        }
    }

    #[test]
    fn every_schedule_completes_and_is_a_barrier() {
        for algo in [BarrierAlgo::PairwiseExchange, BarrierAlgo::Dissemination] {
            for n in 1..=64 {
                let all: BTreeSet<usize> = (0..n).collect();
                // Two interleavings: ranks in order and reversed.
                for order in [(0..n).collect::<Vec<_>>(), (0..n).rev().collect()] {
                    let know =
                        run(algo, n, &order).unwrap_or_else(|| panic!("{algo:?} n={n}: deadlock or stray message"));
                    // No rank leaves before it has heard (transitively) from every rank.
                    for (r, k) in know.iter().enumerate() {
                        assert_eq!(k, &all, "{algo:?} n={n}: rank {r} left knowing only {k:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn step_counts_match_the_papers() {
        // PE: log2 S exchanges, +2 steps of fix-up for N not a power of two.
        let sends = |a, n, r| barrier_schedule(a, n, r).iter().filter(|s| matches!(s, Step::Send { .. })).count();
        assert_eq!(sends(BarrierAlgo::PairwiseExchange, 8, 3), 3);
        assert_eq!(sends(BarrierAlgo::PairwiseExchange, 10, 1), 4); // 3 exchanges + release of rank 9
        assert_eq!(barrier_schedule(BarrierAlgo::PairwiseExchange, 10, 9).len(), 2);
        assert_eq!(sends(BarrierAlgo::Dissemination, 10, 0), 4); // ⌈log2 10⌉
        assert!(barrier_schedule(BarrierAlgo::Dissemination, 1, 0).is_empty());
    }
}
