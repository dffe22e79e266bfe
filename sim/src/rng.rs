//! Deterministic PRNG (xoshiro256**, seeded through splitmix64): a seed
//! reproduces a run bit for bit on every platform.

/// The simulator's random source.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        Rng { s: [splitmix(&mut x), splitmix(&mut x), splitmix(&mut x), splitmix(&mut x)] }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let r = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        r
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// A fresh generator derived from this one (for independent streams).
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

/// Deterministic message content: byte `i` of message `id` is byte `i % 8`
/// of a 64-bit word derived from (`id`, `i / 8`).
pub fn fill_pattern(id: u64, start: u64, out: &mut [u8]) {
    let word =
        |w: u64| (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ w.wrapping_mul(0xD6E8_FEB8_6659_FD93)).rotate_left(29);
    let mut i = start;
    let mut k = 0;
    while k < out.len() {
        let bytes = word(i >> 3).to_le_bytes();
        let in_word = (i & 7) as usize;
        let n = (8 - in_word).min(out.len() - k);
        out[k..k + n].copy_from_slice(&bytes[in_word..in_word + n]);
        k += n;
        i += n as u64;
    }
}
