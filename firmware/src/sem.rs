//! The semaphore (EMP thesis §3.1: the Tigon2's CPUs shared one hardware
//! semaphore for what both write). What both sides of the program write —
//! the CQs' producer side, the MR cache, the hand-offs to other CPUs —
//! is taken through it, per access, by a side running alone beside the
//! other (the sides' entry points, `sides.rs`); the whole
//! program holds every side, so its views reach the same structures
//! directly ([`Shared::Held`]) and pay nothing.
//!
//! Rule: a [`Guard`] lives for one access (a statement, or one ring
//! descriptor's room check and take); nothing holding one takes it again
//! (it does not nest), nor waits for anything else.

use core::hint::spin_loop;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::cpu::Queues;
use crate::mr::MrCache;
use crate::Cqs;

/// The lock itself: a word in the common area both CPUs spin on.
#[derive(Debug, Default)]
pub(crate) struct Semaphore(AtomicBool);

/// Spins past this many looks at a held semaphore are a bug (a guard held
/// across a call that takes it again), not contention: a holder keeps it
/// for one access.
const SPIN_LIMIT: u64 = 1 << 32;
/// A holder keeps it for one access (well under a microsecond): spinning
/// longer means it lost its core.
const SPINS_BEFORE_YIELD: u64 = 256;

impl Semaphore {
    fn acquire(&self) {
        let mut spins = 0u64;
        while self.0.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            while self.0.load(Ordering::Relaxed) {
                spins += 1;
                assert!(spins < SPIN_LIMIT, "the semaphore is never let go: taken again by its holder?");
                if spins % SPINS_BEFORE_YIELD == 0 {
                    // The holder may be off its core (the emulated NIC's
                    // CPUs share the host's): let it run.
                    std::thread::yield_now();
                } else {
                    spin_loop();
                }
            }
        }
    }

    fn release(&self) {
        self.0.store(false, Ordering::Release);
    }
}

/// How a side's view reaches what both sides write.
pub(crate) enum Shared<'a> {
    /// The whole program runs: nothing runs beside it.
    Held { cqs: &'a mut Cqs, mr: &'a mut MrCache, queues: &'a mut Queues },
    /// A side runs alone, beside the other: each access takes `sem`. The
    /// pointers are the program's own fields, which no one else reaches
    /// without holding `sem` while this side runs (`Nic::side_view`'s
    /// contract).
    Taken { sem: &'a Semaphore, cqs: *mut Cqs, mr: *mut MrCache, queues: *mut Queues },
    /// Lent out of the view ([`Shared::lend`]) for one access that also
    /// calls the view's own methods.
    Lent,
}

/// One access to what both sides write: the semaphore is held (when a
/// side runs alone) until it drops.
pub(crate) struct Guard<'g> {
    pub(crate) cqs: &'g mut Cqs,
    pub(crate) mr: &'g mut MrCache,
    pub(crate) queues: &'g mut Queues,
    sem: Option<&'g Semaphore>,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.sem {
            s.release();
        }
    }
}

impl<'a> Shared<'a> {
    /// The semaphore's structures of program `this`, for a side running
    /// alone.
    ///
    /// # Safety
    /// `this` is live for `'a`, and while the result lives nothing
    /// reaches `cqs`, `mr` or `queues` but through the semaphore (the
    /// whole program does not run).
    pub(crate) unsafe fn taken(this: *mut crate::Nic) -> Shared<'a> {
        use core::ptr::{addr_of, addr_of_mut};
        // SAFETY: per the contract above; only field addresses are taken.
        unsafe {
            Shared::Taken {
                sem: &*addr_of!((*this).sem),
                cqs: addr_of_mut!((*this).cqs),
                mr: addr_of_mut!((*this).mr),
                queues: addr_of_mut!((*this).queues),
            }
        }
    }
}

impl Shared<'_> {
    /// Takes the semaphore (when another side may run) for one access.
    pub(crate) fn lock(&mut self) -> Guard<'_> {
        match self {
            Shared::Held { cqs, mr, queues } => Guard { cqs, mr, queues, sem: None },
            Shared::Lent => unreachable!("the semaphore's structures are lent out of this view"),
            Shared::Taken { sem, cqs, mr, queues } => {
                sem.acquire();
                // SAFETY: the semaphore is held, and every other path to
                // these fields while this side runs alone goes through it
                // (the variant's contract); the guard's borrow of `self`
                // keeps a second guard of this view from existing at once.
                unsafe { Guard { cqs: &mut **cqs, mr: &mut **mr, queues: &mut **queues, sem: Some(sem) } }
            }
        }
    }

    /// Takes this access out of its view, leaving [`Shared::Lent`]: for
    /// one access that holds the semaphore while it calls the view's
    /// methods that need none of it. The caller puts it back.
    pub(crate) fn lend(&mut self) -> Self {
        core::mem::replace(self, Shared::Lent)
    }

    /// Is the semaphore taken per access (a side running alone)?
    pub(crate) fn per_access(&self) -> bool {
        matches!(self, Shared::Taken { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_semaphore_admits_one_holder_at_a_time() {
        struct Both(Semaphore, core::cell::UnsafeCell<u64>);
        // SAFETY: the counter is touched only with the semaphore held.
        unsafe impl Sync for Both {}
        let both = Arc::new(Both(Semaphore::default(), core::cell::UnsafeCell::new(0)));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let b = both.clone();
                std::thread::spawn(move || {
                    for _ in 0..100_000 {
                        b.0.acquire();
                        // SAFETY: held.
                        unsafe { *b.1.get() += 1 };
                        b.0.release();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // SAFETY: the threads are gone.
        assert_eq!(unsafe { *both.1.get() }, 200_000, "an increment was lost: two holders at once");
    }
}
