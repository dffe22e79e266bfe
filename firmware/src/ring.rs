//! A bounded single-producer, single-consumer ring for the hand-offs
//! between NIC CPUs (`cpu.rs`): a push or a pop is a few loads and one
//! release store, with no lock and no read-modify-write, so a hand-off
//! costs the CPUs little whether they run on one thread or on two.
//!
//! One side pushes at a time and one side pops at a time. The ring makes
//! exactly one [`Producer`] and one [`Consumer`] token, and every push or
//! pop takes its token by `&mut`: whoever holds a token exclusively (the
//! program's state, which a CPU holds under the program's lock; a CPU's
//! runner, under its own mutex) is the one side. A token used on another
//! ring is refused (panic), so the rule cannot be broken by mistake.

use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Source of ring identities (a token names its ring).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The right to push into one ring.
#[derive(Debug)]
pub(crate) struct Producer {
    ring: u64,
}

/// The right to pop from one ring.
#[derive(Debug)]
pub(crate) struct Consumer {
    ring: u64,
}

/// A bounded FIFO of `T` between one producer and one consumer.
pub(crate) struct Ring<T> {
    id: u64,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    /// Slots popped so far; written only by the consumer.
    head: AtomicUsize,
    /// Slots pushed so far; written only by the producer.
    tail: AtomicUsize,
}

// SAFETY: a slot is written only by the producer before `tail` is published
// (release) and read only by the consumer after it saw that `tail`
// (acquire), then released to the producer again through `head`; the
// tokens, each held by one side at a time (`&mut`), make that one producer
// and one consumer. `T: Send` because values move between threads.
unsafe impl<T: Send> Sync for Ring<T> {}
// SAFETY: as above; the ring owns the values in its live slots.
unsafe impl<T: Send> Send for Ring<T> {}

impl<T> core::fmt::Debug for Ring<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Ring").field("len", &self.len()).field("capacity", &self.slots.len()).finish()
    }
}

impl<T> Ring<T> {
    /// A ring of `capacity` slots (allocated now), with its two tokens.
    pub(crate) fn new(capacity: usize) -> (Ring<T>, Producer, Consumer) {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let slots = (0..capacity).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect();
        let ring = Ring { id, slots, head: AtomicUsize::new(0), tail: AtomicUsize::new(0) };
        (ring, Producer { ring: id }, Consumer { ring: id })
    }

    /// Values waiting (a snapshot when read by neither side).
    pub(crate) fn len(&self) -> usize {
        let head = self.head.load(Ordering::Acquire);
        self.tail.load(Ordering::Acquire).wrapping_sub(head)
    }

    /// Appends `v`, or gives it back when the ring is full.
    pub(crate) fn push(&self, p: &mut Producer, v: T) -> Result<(), T> {
        assert_eq!(p.ring, self.id, "a producer token of another ring");
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        if tail.wrapping_sub(head) == self.slots.len() {
            return Err(v);
        }
        let slot = &self.slots[tail % self.slots.len()];
        // SAFETY: this is the one producer (its token, held by `&mut`); the
        // slot is outside the consumer's live range `[head, tail)` (the ring
        // is not full), so nobody reads or writes it now.
        unsafe { (*slot.get()).write(v) };
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
        Ok(())
    }

    /// Takes the oldest value.
    pub(crate) fn pop(&self, c: &mut Consumer) -> Option<T> {
        assert_eq!(c.ring, self.id, "a consumer token of another ring");
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let slot = &self.slots[head % self.slots.len()];
        // SAFETY: this is the one consumer; `head < tail` and the acquire
        // load of `tail` saw the producer's write of this slot, which it
        // does not touch again until `head` moves past it.
        let v = unsafe { (*slot.get()).assume_init_read() };
        self.head.store(head.wrapping_add(1), Ordering::Release);
        Some(v)
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        let (head, tail) = (*self.head.get_mut(), *self.tail.get_mut());
        let mut i = head;
        while i != tail {
            // SAFETY: `&mut self`: no other side; `[head, tail)` holds
            // initialized values, each dropped once here.
            unsafe { self.slots[i % self.slots.len()].get_mut().assume_init_drop() };
            i = i.wrapping_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn keeps_order_refuses_when_full_and_drops_what_is_left() {
        let (r, mut p, mut c) = Ring::new(3);
        let live = Arc::new(());
        for i in 0..3 {
            r.push(&mut p, (i, live.clone())).unwrap();
        }
        assert!(r.push(&mut p, (9, live.clone())).is_err(), "full");
        assert_eq!(r.pop(&mut c).map(|v| v.0), Some(0));
        r.push(&mut p, (3, live.clone())).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r.pop(&mut c).map(|v| v.0), Some(1));
        drop(r);
        assert_eq!(Arc::strong_count(&live), 1, "values left in the ring are dropped");
    }

    #[test]
    #[should_panic(expected = "another ring")]
    fn a_token_of_another_ring_is_refused() {
        let (a, _pa, _ca) = Ring::<u32>::new(2);
        let (_b, mut pb, _cb) = Ring::<u32>::new(2);
        let _ = a.push(&mut pb, 1);
    }

    #[test]
    fn one_thread_pushes_another_pops_every_value_once_in_order() {
        let (r, mut p, mut c) = Ring::new(16);
        let r = Arc::new(r);
        const N: u64 = 200_000;
        let popper = {
            let r = r.clone();
            std::thread::spawn(move || {
                let mut next = 0u64;
                while next < N {
                    match r.pop(&mut c) {
                        Some(v) => {
                            assert_eq!(v, vec![next; 3], "in order, whole");
                            next += 1;
                        }
                        None => std::thread::yield_now(),
                    }
                }
            })
        };
        let mut i = 0u64;
        while i < N {
            match r.push(&mut p, vec![i; 3]) {
                Ok(()) => i += 1,
                Err(_) => std::thread::yield_now(),
            }
        }
        popper.join().unwrap();
        assert_eq!(r.len(), 0);
    }
}
