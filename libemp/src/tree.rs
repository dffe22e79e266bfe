//! Latency-optimal broadcast trees in the postal model (seed 000 §4,
//! seed 001 §2.3; Bar-Noy and Kipnis; Bruck et al.'s greedy
//! construction). The host builds trees; the NIC only stores and follows
//! them (see `docs/design/collectives.md`).
//!
//! Model: sending one packet occupies the sender for 1 unit; the receiver
//! holds it λ units after the send started (λ ≥ 1), and may forward from
//! then on. The number of nodes reachable by time t is
//!
//! ```text
//! F_λ(t) = 1                     for 0 ≤ t < λ
//! F_λ(t) = F_λ(t−1) + F_λ(t−λ)   for t ≥ λ
//! ```
//!
//! and the greedy construction below reaches n nodes by the least t with
//! F_λ(t) ≥ n. λ = 1 gives the binomial tree.

use std::collections::VecDeque;

/// Nodes reachable by time `t` when a send takes 1 unit and delivery `lambda`
/// units (saturates at `u64::MAX`).
///
/// # Panics
/// If `lambda` is 0 (a packet cannot arrive before it is sent).
pub fn postal_reach(lambda: u32, t: u32) -> u64 {
    assert!(lambda >= 1, "postal model needs lambda >= 1");
    let l = lambda as usize;
    // f[i] = F(i); only the last `lambda` values are needed, but t is small.
    let mut f: Vec<u64> = Vec::with_capacity(t as usize + 1);
    for i in 0..=t as usize {
        let v = if i < l { 1 } else { f[i - 1].saturating_add(f[i - l]) };
        f.push(v);
    }
    f[t as usize]
}

/// The least time by which a broadcast can reach `n` nodes (`n` ≥ 1).
pub fn postal_completion(n: usize, lambda: u32) -> u32 {
    let mut t = 0;
    while postal_reach(lambda, t) < n as u64 {
        t += 1;
    }
    t
}

/// A broadcast tree over relative ranks `0..n` (0 = the root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    /// `parent[r]` for `r` ≥ 1; `parent[0]` is `None`.
    pub parent: Vec<Option<u16>>,
    /// Children of each rank, in the order it sends to them.
    pub children: Vec<Vec<u16>>,
}

impl Tree {
    /// The greedy postal-model tree for `n` ranks (1 ≤ n ≤ 65 536).
    /// Optimal: its [`Tree::completion`] under `lambda` equals
    /// [`postal_completion`]. Ties between a rank that just sent and one
    /// that just received go to the one that sent (so n = 4, λ = 2 is the
    /// flat tree of seed 000 §4).
    ///
    /// # Panics
    /// If `n` is 0 or above 65 536, or `lambda` is 0.
    pub fn postal(n: usize, lambda: u32) -> Tree {
        assert!((1..=1 << 16).contains(&n), "tree of {n} ranks");
        assert!(lambda >= 1, "postal model needs lambda >= 1");
        let mut parent = vec![None; n];
        let mut children = vec![Vec::new(); n];
        // (rank, time it can next send). Pop times never decrease, so
        // both queues stay sorted when pushed at the back.
        let mut fresh: VecDeque<(u16, u64)> = VecDeque::from([(0, 0)]);
        let mut sent: VecDeque<(u16, u64)> = VecDeque::new();
        #[allow(clippy::needless_range_loop)] // p is the node being placed, not just an index
        for p in 1..n {
            let take_sent = match (sent.front(), fresh.front()) {
                (Some(s), Some(f)) => s.1 <= f.1,
                (Some(_), None) => true,
                _ => false,
            };
            let (q, t) = if take_sent { sent.pop_front() } else { fresh.pop_front() }.expect("a sender exists");
            children[q as usize].push(p as u16);
            parent[p] = Some(q);
            fresh.push_back((p as u16, t + lambda as u64));
            sent.push_back((q, t + 1));
        }
        Tree { parent, children }
    }

    /// The binomial tree (the postal tree for λ = 1).
    pub fn binomial(n: usize) -> Tree {
        Tree::postal(n, 1)
    }

    /// Ranks in the tree.
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// Whether the tree is empty (never: it has a root).
    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }

    /// The most children any rank has (with pipelining, the bottleneck).
    pub fn max_degree(&self) -> usize {
        self.children.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// When the last rank holds the packet, each rank sending to its
    /// children in order from the moment it holds the packet.
    pub fn completion(&self, lambda: u32) -> u64 {
        let mut at = vec![0u64; self.len()];
        // Parents precede children in rank order (the construction numbers
        // ranks in the order they are reached).
        for q in 0..self.len() {
            for (i, &c) in self.children[q].iter().enumerate() {
                at[c as usize] = at[q] + i as u64 + lambda as u64;
            }
        }
        at.into_iter().max().unwrap_or(0)
    }

    /// Predicted time for a message of `frames` frames, pipelined frame by
    /// frame down the tree (seed 000 §4 and §6): the first frame arrives at
    /// [`Tree::completion`]; the rank with the most children forwards each
    /// further frame that many times.
    pub fn pipelined_completion(&self, lambda: u32, frames: u64) -> u64 {
        self.completion(lambda) + frames.saturating_sub(1) * self.max_degree().max(1) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kids(t: &Tree, r: usize) -> Vec<u16> {
        t.children[r].clone()
    }

    #[test]
    fn reach_follows_the_recurrence() {
        // λ = 1: doubling; λ = 2: Fibonacci.
        assert_eq!((0..6).map(|t| postal_reach(1, t)).collect::<Vec<_>>(), [1, 2, 4, 8, 16, 32]);
        assert_eq!((0..9).map(|t| postal_reach(2, t)).collect::<Vec<_>>(), [1, 1, 2, 3, 5, 8, 13, 21, 34]);
        assert_eq!(postal_completion(16, 1), 4);
        assert_eq!(postal_completion(16, 2), 7);
        assert_eq!(postal_completion(1, 5), 0);
    }

    #[test]
    fn paper_and_binomial_shapes() {
        // Seed 000 §4: 4 nodes with λ = 2 is a flat tree.
        let flat = Tree::postal(4, 2);
        assert_eq!(kids(&flat, 0), [1, 2, 3]);
        // λ = 1 is the binomial tree.
        let b = Tree::binomial(16);
        assert_eq!(kids(&b, 0), [1, 2, 4, 8]);
        assert_eq!(kids(&b, 1), [3, 5, 9]);
        assert_eq!(kids(&b, 2), [6, 10]);
        assert_eq!(kids(&b, 7), [15]);
        assert_eq!(b.completion(1), 4);
        // λ = 2 over 16 ranks: the root sends at t = 0..5, its first child
        // starts at t = 2 (Fibonacci growth), completion 7.
        let f = Tree::postal(16, 2);
        assert_eq!(kids(&f, 0), [1, 2, 3, 5, 8, 13]);
        assert_eq!(kids(&f, 1), [4, 6, 9, 14]);
        assert_eq!(f.completion(2), 7);
        // Larger λ: a flatter tree beats the binomial one.
        let t = Tree::postal(16, 8);
        assert!(t.completion(8) < b.completion(8), "{} vs {}", t.completion(8), b.completion(8));
    }

    #[test]
    fn pipelining_charges_the_widest_rank() {
        let flat = Tree::postal(4, 2);
        assert_eq!(flat.pipelined_completion(2, 1), flat.completion(2));
        assert_eq!(flat.pipelined_completion(2, 5), flat.completion(2) + 4 * 3);
    }

    proptest! {
        #[test]
        fn greedy_tree_is_valid_and_optimal(n in 1usize..200, lambda in 1u32..12) {
            let t = Tree::postal(n, lambda);
            prop_assert_eq!(t.len(), n);
            prop_assert_eq!(t.parent[0], None);
            // Every rank but the root has one parent, reached before it.
            for r in 1..n {
                let p = t.parent[r].expect("a parent") as usize;
                prop_assert!(p < r);
                prop_assert!(t.children[p].contains(&(r as u16)));
            }
            prop_assert_eq!(t.children.iter().map(Vec::len).sum::<usize>(), n - 1);
            // No tree can beat F_λ; the greedy one meets it.
            prop_assert_eq!(t.completion(lambda), postal_completion(n, lambda) as u64);
        }
    }
}
