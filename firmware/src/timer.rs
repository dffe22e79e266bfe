//! Timers: deadlines with lazy cancellation. Every record that owns a
//! timer keeps a stamp; re-arming or cancelling bumps the stamp, and a
//! popped entry whose stamp no longer matches is ignored by its handler.
//! The store is sized at boot for every timer that can be live at once;
//! when it is full, the stale entries are dropped (`Nic::arm_timer`), so
//! arming never allocates.
//!
//! Most timers are armed in deadline order: every first transmission arms
//! its group's retransmission timer at now + the same `rto_ns`, and nearly
//! all of them are answered and left stale. Those go to a FIFO (O(1) each
//! way) instead of the min-heap, which keeps the rest (backed-off
//! retransmissions, ACK flushes, probes); popping takes the lesser of the
//! two fronts. Timers due at the same time fire in the order they were
//! armed (each entry carries its arming sequence number).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

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

/// One armed timer: ordered by deadline, then by when it was armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    deadline: u64,
    seq: u64,
    timer: Timer,
}

/// Deadline-ordered timers: a FIFO of entries armed in order, and a heap.
#[derive(Debug, Default)]
pub struct TimerHeap {
    heap: BinaryHeap<Reverse<Entry>>,
    /// Entries in ascending order, at most `in_order_max`.
    in_order: VecDeque<Entry>,
    in_order_max: usize,
    /// Arming sequence number of the next timer.
    seq: u64,
}

impl TimerHeap {
    /// Room for `cap` timers in each part.
    pub fn with_capacity(cap: usize) -> TimerHeap {
        TimerHeap {
            heap: BinaryHeap::with_capacity(cap),
            in_order: VecDeque::with_capacity(cap),
            in_order_max: cap,
            seq: 0,
        }
    }

    /// Arming one more could grow the store.
    pub fn is_full(&self) -> bool {
        self.heap.len() >= self.heap.capacity()
    }

    /// Keeps only the timers `live` says are still wanted (in place).
    pub(crate) fn retain(&mut self, mut live: impl FnMut(&Timer) -> bool) {
        self.heap.retain(|Reverse(e)| live(&e.timer));
        self.in_order.retain(|e| live(&e.timer));
    }

    /// Arms `t` at `deadline`.
    pub fn arm(&mut self, deadline: u64, t: Timer) {
        let e = Entry { deadline, seq: self.seq, timer: t };
        self.seq += 1;
        let in_order = self.in_order.back().is_none_or(|last| last.deadline <= deadline);
        if in_order && self.in_order.len() < self.in_order_max {
            self.in_order.push_back(e);
        } else {
            self.heap.push(Reverse(e));
        }
    }

    /// The earlier of the two parts' first entries: true for the FIFO's.
    fn first_in_order(&self) -> Option<bool> {
        match (self.in_order.front(), self.heap.peek()) {
            (None, None) => None,
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
            (Some(a), Some(Reverse(b))) => Some(a < b),
        }
    }

    /// Pops one timer due at `now`.
    pub fn pop_expired(&mut self, now: u64) -> Option<Timer> {
        if self.next_deadline()? > now {
            return None;
        }
        match self.first_in_order()? {
            true => self.in_order.pop_front().map(|e| e.timer),
            false => self.heap.pop().map(|Reverse(e)| e.timer),
        }
    }

    /// Earliest deadline (possibly of a cancelled timer).
    pub fn next_deadline(&self) -> Option<u64> {
        match self.first_in_order()? {
            true => self.in_order.front().map(|e| e.deadline),
            false => self.heap.peek().map(|Reverse(e)| e.deadline),
        }
    }

    /// Entries held, live or stale.
    pub fn len(&self) -> usize {
        self.heap.len() + self.in_order.len()
    }

    /// True when no entry is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty() && self.in_order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against one plain heap of (deadline, arming order): the same timers
    /// pop in the same order, whatever order they were armed in, with
    /// stale ones dropped midway.
    #[test]
    fn pops_exactly_as_one_heap_would() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for cap in [0, 1, 8, 64] {
            let mut ours = TimerHeap::with_capacity(cap);
            let mut plain = BinaryHeap::new();
            let mut now = 0u64;
            let mut seq = 0u64;
            let mut arm = |ours: &mut TimerHeap, plain: &mut BinaryHeap<_>, d: u64, t: Timer| {
                ours.arm(d, t);
                plain.push(Reverse((d, seq, t)));
                seq += 1;
            };
            for i in 0..20_000u32 {
                match next() % 10 {
                    // Mostly armed in order, as first transmissions are.
                    0..=5 => {
                        // Slots reused out of order, several per instant.
                        let t = Timer::Group { slot: (i * 5) % 7, group: 0, stamp: i };
                        arm(&mut ours, &mut plain, now + 1_000, t);
                    }
                    6 | 7 => {
                        let t = if next() % 2 == 0 { Timer::AckFlush } else { Timer::FcProbe { peer: i % 3 } };
                        let d = now + next() % 3_000;
                        arm(&mut ours, &mut plain, d, t);
                    }
                    8 => now += next() % 700,
                    _ => {
                        if i % 97 == 0 {
                            let live = |t: &Timer| !matches!(t, Timer::Group { stamp, .. } if stamp % 3 == 0);
                            ours.retain(live);
                            plain.retain(|Reverse((_, _, t))| live(t));
                        }
                        loop {
                            let want = match plain.peek() {
                                Some(Reverse((d, _, _))) if *d <= now => plain.pop().map(|Reverse((_, _, t))| t),
                                _ => None,
                            };
                            assert_eq!(ours.pop_expired(now), want);
                            if want.is_none() {
                                break;
                            }
                        }
                    }
                }
                assert_eq!(ours.len(), plain.len());
                assert_eq!(ours.next_deadline(), plain.peek().map(|Reverse((d, _, _))| *d));
                assert!(ours.in_order.len() <= cap && ours.in_order.capacity() >= ours.in_order.len());
            }
        }
    }
}
