//! Timers: a min-heap of deadlines with lazy cancellation. Every record that
//! owns a timer keeps a stamp; re-arming or cancelling bumps the stamp, and
//! a popped entry whose stamp no longer matches is ignored by its handler.
//! The heap is sized at boot for every timer that can be live at once; when
//! it is full, the stale entries are dropped (`Nic::arm_timer`), so arming
//! never allocates.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// What a timer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Timer {
    /// Retransmission timer of group `group` of tx record `slot`.
    Group { slot: u32, group: u32, stamp: u32 },
    /// Periodic sweep for partially received messages that went idle.
    RxSweep,
    /// Retransmission timer of remote atomic request `slot`.
    Atomic { slot: u32, stamp: u32 },
    /// Response timer of remote read `slot`.
    RmaRead { slot: u32, stamp: u32 },
    /// Coalesced ACKs fall due (`Nic::ack_due`).
    AckFlush,
    /// Peer `peer` was told to stop sending: it may probe now.
    FcProbe { peer: u32 },
    /// Reliable-broadcast timer of group slot `group` (`rbcast/`).
    Rbcast { group: u32, stamp: u32 },
}

/// Deadline-ordered timers.
#[derive(Debug, Default)]
pub struct TimerHeap {
    heap: BinaryHeap<Reverse<(u64, Timer)>>,
}

impl TimerHeap {
    /// Room for `cap` timers.
    pub fn with_capacity(cap: usize) -> TimerHeap {
        TimerHeap { heap: BinaryHeap::with_capacity(cap) }
    }

    /// Arming one more would grow the heap.
    pub fn is_full(&self) -> bool {
        self.heap.len() >= self.heap.capacity()
    }

    /// Keeps only the timers `live` says are still wanted (in place).
    pub(crate) fn retain(&mut self, mut live: impl FnMut(&Timer) -> bool) {
        self.heap.retain(|Reverse((_, t))| live(t));
    }

    /// Arms `t` at `deadline`.
    pub fn arm(&mut self, deadline: u64, t: Timer) {
        self.heap.push(Reverse((deadline, t)));
    }

    /// Pops one timer due at `now`.
    pub fn pop_expired(&mut self, now: u64) -> Option<Timer> {
        match self.heap.peek() {
            Some(Reverse((d, _))) if *d <= now => self.heap.pop().map(|Reverse((_, t))| t),
            _ => None,
        }
    }

    /// Earliest deadline (possibly of a cancelled timer).
    pub fn next_deadline(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((d, _))| *d)
    }

    /// Entries held, live or stale.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True when no entry is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}
