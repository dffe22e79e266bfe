//! A weakly ordered DMA engine: the NIC's writes to host memory become
//! visible to the host late, in random byte order, except that a fence
//! ([`emp_firmware::Hal::dma_fence`]) keeps every write before it ahead of
//! every write after it, and writes to the same bytes stay in order (the
//! memory is coherent). The NIC itself reads its own writes at once.
//!
//! This is the contract the host side of the ring protocol may rely on and
//! no more: a completion published without a fence between its body and
//! its phase byte shows up torn here, where an x86 `memcpy` would hide it.

use std::collections::VecDeque;

use crate::rng::Rng;

/// Bytes revealed together when a write is large (a payload), so a
/// megabyte message does not cost a million events; small writes (CQEs,
/// atomics' results) are revealed byte by byte.
const BLOCK: usize = 64;
/// Writes up to this size are revealed byte by byte.
const BYTEWISE_MAX: usize = 256;

#[derive(Debug)]
struct Write {
    /// Index into host memory.
    at: usize,
    data: Vec<u8>,
    /// Units (bytes or blocks, by offset) not yet visible, in the random
    /// order they will appear: the last is next.
    hidden: Vec<u32>,
    unit: usize,
}

impl Write {
    fn overlaps(&self, at: usize, len: usize) -> bool {
        self.at < at + len && at < self.at + self.data.len()
    }
}

/// The NIC's writes the host cannot see yet.
#[derive(Debug)]
pub struct PendingWrites {
    rng: Rng,
    /// Writes between fences, oldest first. Only the oldest epoch's bytes
    /// may appear; the newest is open (no fence after it yet).
    epochs: VecDeque<Vec<Write>>,
    open: bool,
}

impl PendingWrites {
    /// An empty engine whose reveal order comes from `seed`.
    pub fn new(seed: u64) -> PendingWrites {
        PendingWrites { rng: Rng::new(seed), epochs: VecDeque::new(), open: false }
    }

    /// True when every write is visible.
    pub fn is_empty(&self) -> bool {
        self.epochs.is_empty()
    }

    /// Queues the NIC's write of `data` at memory index `at`.
    pub fn write(&mut self, at: usize, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        // Coherence: a write over bytes still pending in the open epoch goes
        // after them, as if fenced.
        if self.open && self.epochs.back().is_some_and(|e| e.iter().any(|w| w.overlaps(at, data.len()))) {
            self.open = false;
        }
        if !self.open {
            self.epochs.push_back(Vec::new());
            self.open = true;
        }
        let unit = if data.len() <= BYTEWISE_MAX { 1 } else { BLOCK };
        let mut hidden: Vec<u32> = (0..data.len().div_ceil(unit) as u32).collect();
        for i in (1..hidden.len()).rev() {
            hidden.swap(i, self.rng.below(i as u64 + 1) as usize);
        }
        self.epochs.back_mut().expect("open epoch").push(Write { at, data: data.to_vec(), hidden, unit });
    }

    /// A fence: later writes appear only after every earlier one.
    pub fn fence(&mut self) {
        self.open = false;
    }

    /// Overlays the pending writes on `buf`, which holds the host-visible
    /// bytes at memory index `at`: what the NIC reads back.
    pub fn overlay(&self, at: usize, buf: &mut [u8]) {
        for w in self.epochs.iter().flatten() {
            if !w.overlaps(at, buf.len()) {
                continue;
            }
            let (from, to) = (at.max(w.at), (at + buf.len()).min(w.at + w.data.len()));
            buf[from - at..to - at].copy_from_slice(&w.data[from - w.at..to - w.at]);
        }
    }

    /// True when some write to `[at, at + len)` is not yet visible.
    pub fn hides(&self, at: usize, len: usize) -> bool {
        self.epochs.iter().flatten().any(|w| w.overlaps(at, len))
    }

    /// Makes a random part of the oldest writes visible in `mem`.
    pub fn reveal_some(&mut self, mem: &mut [u8]) {
        loop {
            let Some(epoch) = self.epochs.front_mut() else { return };
            for w in epoch.iter_mut() {
                let n = self.rng.range(1, w.hidden.len() as u64) as usize;
                for _ in 0..n {
                    let u = w.hidden.pop().expect("hidden unit") as usize * w.unit;
                    let end = (u + w.unit).min(w.data.len());
                    mem[w.at + u..w.at + end].copy_from_slice(&w.data[u..end]);
                }
            }
            epoch.retain(|w| !w.hidden.is_empty());
            if !epoch.is_empty() {
                return;
            }
            self.epochs.pop_front();
            if self.epochs.is_empty() {
                self.open = false;
                return;
            }
            if self.rng.chance(0.5) {
                return;
            }
        }
    }

    /// Delay until the next reveal (ns): a host polls soon, not at once.
    pub fn next_delay_ns(&mut self) -> u64 {
        1 + self.rng.below(400)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_fenced_write_never_visible_before_the_write_ahead_of_it() {
        for seed in 0..200 {
            let mut p = PendingWrites::new(seed);
            let mut mem = vec![0u8; 64];
            p.write(0, &[1; 31]);
            p.fence();
            p.write(31, &[9]);
            let mut tries = 0;
            while !p.is_empty() {
                p.reveal_some(&mut mem);
                if mem[31] == 9 {
                    assert!(mem[..31].iter().all(|&b| b == 1), "seed {seed}: phase byte before the body");
                }
                tries += 1;
                assert!(tries < 1000, "never drains");
            }
            assert_eq!(&mem[..32], &[[1u8; 31].as_slice(), &[9]].concat()[..]);
        }
    }

    #[test]
    fn test_one_unfenced_write_can_be_seen_torn() {
        let torn = (0..200).any(|seed| {
            let mut p = PendingWrites::new(seed);
            let mut mem = vec![0u8; 32];
            p.write(0, &[7; 32]);
            p.reveal_some(&mut mem);
            mem[31] == 7 && mem[..31].contains(&0)
        });
        assert!(torn, "the model must expose a torn write, or it tests nothing");
    }

    #[test]
    fn test_nic_reads_its_own_writes_and_same_bytes_stay_in_order() {
        let mut p = PendingWrites::new(3);
        let mut mem = vec![0u8; 8];
        p.write(2, &[5, 5]);
        p.write(3, &[6]);
        let mut view = mem.clone();
        p.overlay(0, &mut view);
        assert_eq!(view, [0, 0, 5, 6, 0, 0, 0, 0]);
        assert!(p.hides(3, 1) && !p.hides(5, 3));
        while !p.is_empty() {
            p.reveal_some(&mut mem);
        }
        assert_eq!(mem, view, "the later write to byte 3 wins");
    }
}
