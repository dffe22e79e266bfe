//! Maps keyed by small integers (peers, groups) with a cheap hash. The
//! standard library's SipHash, keyed per process against hash flooding,
//! costs more than the lookup it serves on the per-frame path; here the
//! tables are bounded (`peers_max`, `group_entries`) and their keys are
//! node and port numbers the route table and the ports bound, so a crafted
//! collision can cost at most a probe over a bounded table. The multiply
//! and rotate are FxHash's (rustc's hasher).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash over the key's integers.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KeyHasher(u64);

const SEED: u64 = 0xf135_7aea_2e62_a9c5;

impl KeyHasher {
    fn add(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(SEED);
    }
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&b| self.add(u64::from(b)));
    }
    fn write_u16(&mut self, v: u16) {
        self.add(u64::from(v));
    }
    fn write_u32(&mut self, v: u32) {
        self.add(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    fn finish(&self) -> u64 {
        // The product's entropy is in its high bits; the table indexes by
        // the low ones.
        self.0.rotate_left(26)
    }
}

/// A `HashMap` with [`KeyHasher`].
pub(crate) type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn nearby_keys_spread_over_the_low_bits() {
        let b = BuildHasherDefault::<KeyHasher>::default();
        let mut buckets = [0u32; 64];
        for port in 0..8u16 {
            for node in 0..64u16 {
                for rport in 0..8u16 {
                    buckets[(b.hash_one((port, node, rport)) & 63) as usize] += 1;
                }
            }
        }
        // 4096 keys over 64 buckets: 64 each on average.
        assert!(buckets.iter().all(|&n| (32..=96).contains(&n)), "{buckets:?}");
    }
}
