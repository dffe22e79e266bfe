//! Timers: deadlines with lazy cancellation. Every record that owns a
//! timer keeps a stamp; re-arming or cancelling bumps the stamp, and a
//! popped entry whose stamp no longer matches is ignored by its handler.
//! The store is sized at boot for every timer that can be live at once;
//! when it is full, the stale entries are dropped (`Nic::arm_timer`,
//! `SendSide::arm_timer`), so arming never allocates. The send side has a
//! store of its own ([`SendTimer`]: what CPU A owns under DSR), the whole
//! program another ([`Timer`]).
//!
//! Most timers are armed in deadline order: every first transmission arms
//! its group's retransmission timer at now + the same `rto_ns`, and nearly
//! all of them are answered and left stale. Those go to FIFO lanes (O(1)
//! each way) instead of the min-heap, which keeps the rest (backed-off
//! retransmissions, probes). An entry joins the lane whose
//! last deadline is the latest not after its own (patience sorting), so a
//! timer armed further out now and then (a remote read's response, a keepalive)
//! takes a lane of its own instead of sending every retransmission timer
//! after it to the heap. Popping takes the least of the fronts. Timers due
//! at the same time fire in the order they were armed (each entry carries
//! its arming sequence number).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// What one of the whole program's timers is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Timer {
    /// Retransmission timer of remote atomic request `slot`.
    Atomic { slot: u32, stamp: u32 },
    /// Response timer of remote read `slot`.
    RmaRead { slot: u32, stamp: u32 },
    /// Reliable-broadcast timer of group slot `group` (`rbcast/`).
    Rbcast { group: u32, stamp: u32 },
}

/// What one of the send side's timers is for (`SendSide::timers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SendTimer {
    /// Retransmission timer of group `group` of tx record `slot`.
    Group { slot: u32, group: u32, stamp: u32 },
    /// Peer `peer` was told to stop sending: it may probe now.
    FcProbe { peer: u32 },
}

/// A source of stamps: nonzero, and unique across a record slot's reuse
/// for as long as a stale timer or handle can outlive it (0 means none).
#[derive(Debug, Default)]
pub(crate) struct Stamps(u32);

impl Stamps {
    pub(crate) fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_add(1).max(1);
        self.0
    }
}

/// One armed timer: ordered by deadline, then by when it was armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry<T> {
    deadline: u64,
    seq: u64,
    timer: T,
}

/// FIFO lanes: the first takes every timer, the others a quarter each.
const LANES: usize = 3;

/// Deadline-ordered timers of kind `T`: FIFO lanes of entries armed in
/// order, and a heap.
#[derive(Debug)]
pub struct TimerHeap<T = Timer> {
    heap: BinaryHeap<Reverse<Entry<T>>>,
    /// Entries in ascending order, each at most `lane_max[i]`.
    lanes: [VecDeque<Entry<T>>; LANES],
    lane_max: [usize; LANES],
    /// Arming sequence number of the next timer.
    seq: u64,
}

impl<T: Copy + Ord> Default for TimerHeap<T> {
    fn default() -> Self {
        TimerHeap::with_capacity(0)
    }
}

impl<T: Copy + Ord> TimerHeap<T> {
    /// Room for `cap` timers in the heap and in the lanes (allocated now).
    pub fn with_capacity(cap: usize) -> TimerHeap<T> {
        let lane_max = [cap, cap / 4, cap / 4];
        TimerHeap {
            heap: BinaryHeap::with_capacity(cap),
            lanes: lane_max.map(VecDeque::with_capacity),
            lane_max,
            seq: 0,
        }
    }

    /// Arming one more could grow the store.
    pub fn is_full(&self) -> bool {
        self.heap.len() >= self.heap.capacity()
    }

    /// Keeps only the timers `live` says are still wanted (in place).
    pub(crate) fn retain(&mut self, mut live: impl FnMut(&T) -> bool) {
        self.heap.retain(|Reverse(e)| live(&e.timer));
        for l in &mut self.lanes {
            l.retain(|e| live(&e.timer));
        }
    }

    /// Arms `t` at `deadline`.
    pub fn arm(&mut self, deadline: u64, t: T) {
        let e = Entry { deadline, seq: self.seq, timer: t };
        self.seq += 1;
        // The lane with room whose last deadline is the latest not after
        // this one (an empty lane last).
        let mut best: Option<(usize, Option<u64>)> = None;
        for (i, l) in self.lanes.iter().enumerate() {
            if l.len() >= self.lane_max[i] {
                continue;
            }
            let last = l.back().map(|b| b.deadline);
            if last.is_some_and(|d| d > deadline) {
                continue;
            }
            if best.is_none_or(|(_, b)| last > b) {
                best = Some((i, last));
            }
        }
        match best {
            Some((i, _)) => self.lanes[i].push_back(e),
            None => self.heap.push(Reverse(e)),
        }
    }

    /// Where the first entry is: `Some(lane)`, or `None` for the heap.
    fn first(&self) -> Option<Option<usize>> {
        let mut min: Option<(&Entry<T>, Option<usize>)> = self.heap.peek().map(|Reverse(e)| (e, None));
        for (i, l) in self.lanes.iter().enumerate() {
            if let Some(e) = l.front() {
                if min.is_none_or(|(m, _)| e < m) {
                    min = Some((e, Some(i)));
                }
            }
        }
        min.map(|(_, at)| at)
    }

    /// Pops one timer due at `now`.
    pub fn pop_expired(&mut self, now: u64) -> Option<T> {
        if self.next_deadline()? > now {
            return None;
        }
        match self.first()? {
            Some(i) => self.lanes[i].pop_front().map(|e| e.timer),
            None => self.heap.pop().map(|Reverse(e)| e.timer),
        }
    }

    /// The timer [`TimerHeap::pop_expired`] would return, left in place.
    pub fn peek_expired(&self, now: u64) -> Option<&T> {
        if self.next_deadline()? > now {
            return None;
        }
        match self.first()? {
            Some(i) => self.lanes[i].front().map(|e| &e.timer),
            None => self.heap.peek().map(|Reverse(e)| &e.timer),
        }
    }

    /// Earliest deadline (possibly of a cancelled timer).
    pub fn next_deadline(&self) -> Option<u64> {
        match self.first()? {
            Some(i) => self.lanes[i].front().map(|e| e.deadline),
            None => self.heap.peek().map(|Reverse(e)| e.deadline),
        }
    }

    /// Entries held, live or stale.
    pub fn len(&self) -> usize {
        self.heap.len() + self.lanes.iter().map(VecDeque::len).sum::<usize>()
    }

    /// True when no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timers of a test: the kinds only matter for their order.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    enum Timer {
        Group { slot: u32, group: u32, stamp: u32 },
        Atomic { slot: u32, stamp: u32 },
        RmaRead { slot: u32, stamp: u32 },
        FcProbe { peer: u32 },
    }

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
            let mut arm = |ours: &mut TimerHeap<Timer>, plain: &mut BinaryHeap<_>, d: u64, t: Timer| {
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
                        let t = if next() % 2 == 0 {
                            Timer::Atomic { slot: i % 5, stamp: i }
                        } else {
                            Timer::FcProbe { peer: i % 3 }
                        };
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
                for (l, max) in ours.lanes.iter().zip(ours.lane_max) {
                    assert!(l.len() <= max && l.capacity() >= max, "bounded, allocated at boot");
                }
            }
        }
    }

    /// Retransmission timers armed at now + RTO, with a timer further out
    /// now and then (a remote read's response timer): none goes to the heap.
    #[test]
    fn a_timer_further_out_does_not_send_the_rest_to_the_heap() {
        let mut t = TimerHeap::with_capacity(4096);
        let (mut now, mut popped) = (0u64, 0);
        for i in 0..100_000u32 {
            now += 10;
            t.arm(now + 1_000, Timer::Group { slot: i % 64, group: 0, stamp: i });
            if i % 1_000 == 0 {
                t.arm(now + 50_000, Timer::RmaRead { slot: 0, stamp: i });
            }
            while t.pop_expired(now).is_some() {
                popped += 1;
            }
            assert!(t.heap.is_empty(), "armed {i}: {} in the heap", t.heap.len());
        }
        assert!(popped > 90_000);
    }
}
