//! Event counters as one CPU keeps them. Each side of the program counts
//! its own events (`Nic::counters` for CPU A's and the whole program's,
//! `RecvSide::counters` for the receive side's), so neither writes what
//! the other does; the table published in SRAM is their sum. A side's
//! counts are words the other side reads while it writes them (it sums
//! them when it publishes, running alone beside it): each is written only
//! by its owner, with a plain load and store, and read atomically.

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use emp_uapi::sram::counter;

/// Every counter's bit in [`Counters::dirty`].
const ALL: u64 = (1 << counter::COUNT) - 1;
const _: () = assert!(counter::COUNT <= 64, "one dirty bit per counter");

/// One side's counts, and which changed since they were last published.
#[derive(Debug)]
pub(crate) struct Counters {
    /// Wrapping: one side may take back what the other counted (an event
    /// counted too early), so a side's own value may go "below zero"; the
    /// sum is the count.
    values: [AtomicU64; counter::COUNT],
    /// Counters changed since they were last published, one bit each: only
    /// those are written to SRAM, not the whole table after every event.
    /// Only the owner reads it.
    dirty: AtomicU64,
}

impl Counters {
    /// Zeroes, all to be published.
    pub(crate) fn new() -> Counters {
        Counters { values: core::array::from_fn(|_| AtomicU64::new(0)), dirty: AtomicU64::new(ALL) }
    }

    /// Its owner counts `n` events (a load and a store: no one else writes).
    pub(crate) fn add(&self, c: usize, n: u64) {
        self.values[c].store(self.values[c].load(Relaxed).wrapping_add(n), Relaxed);
        self.dirty.store(self.dirty.load(Relaxed) | 1 << c, Relaxed);
    }

    /// Takes back `n` of counter `c` (an event counted too early, maybe by
    /// the other side).
    pub(crate) fn sub(&self, c: usize, n: u64) {
        self.values[c].store(self.values[c].load(Relaxed).wrapping_sub(n), Relaxed);
        self.dirty.store(self.dirty.load(Relaxed) | 1 << c, Relaxed);
    }

    /// The counters changed since the last call, one bit each (its owner
    /// asks).
    pub(crate) fn take_dirty(&self) -> u64 {
        let d = self.dirty.load(Relaxed);
        self.dirty.store(0, Relaxed);
        d
    }

    /// Counter `c`: this side's part plus `other`'s.
    pub(crate) fn sum(&self, other: &Counters, c: usize) -> u64 {
        self.values[c].load(Relaxed).wrapping_add(other.values[c].load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_taken_back_by_the_other_side_sums_right_and_both_are_published() {
        let (a, b) = (Counters::new(), Counters::new());
        assert_eq!(a.take_dirty(), ALL, "everything is published once at boot");
        b.take_dirty();
        b.add(counter::MSGS_RX, 3);
        a.sub(counter::MSGS_RX, 1);
        assert_eq!(a.sum(&b, counter::MSGS_RX), 2);
        assert_eq!(b.sum(&a, counter::MSGS_RX), 2);
        assert_eq!(a.take_dirty() | b.take_dirty(), 1 << counter::MSGS_RX);
        assert_eq!(a.take_dirty() | b.take_dirty(), 0);
    }
}
