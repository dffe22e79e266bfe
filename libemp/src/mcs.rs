//! A distributed queue lock (Mellor-Crummey & Scott; seed 001 §5.3,
//! Fig. 5.5) on NIC remote atomics: waiters queue in arrival order, each
//! spins only on a word in its own memory, and the lock's home host takes
//! no part (its NIC does the work).
//!
//! Words (64-bit; ranks stored as `rank + 1`, 0 = none), each in memory
//! registered with remote-atomic rights:
//! - `tail` at the home rank: the last rank in the queue;
//! - per rank `next`: its successor, written by that successor;
//! - per rank `locked`: 1 while it must wait, cleared by its predecessor.
//!
//! Acquire: `next = 0; locked = 1` (local stores: no one else can touch
//! them now), `pred = swap(tail, me)`; if there was a predecessor, link in
//! with a remote `swap(pred.next, me)` and wait until `locked` is 0.
//! Release: with no successor known, `cmp_swap(tail, me → 0)`; if that
//! fails a successor is linking in, so wait for `next`; then hand over
//! with a remote `swap(succ.locked, 0)`. The "remote write" the paper
//! leaves unnamed is a swap whose old value is ignored.
//!
//! Waiting polls the local word with backoff (spin, yield, then short
//! sleeps), so ranks that outnumber cores do not starve the lock holder.
//! A rank that dies holding or queued for the lock blocks the others.

use std::time::Duration;

use crate::atomic::{RemoteWord, Width};
use crate::rdv::Job;
use crate::{Buffer, Device, Endpoint, Error, RemoteKey, Result, MR_REMOTE_ATOMIC};

/// Offsets within each rank's lock region.
const NEXT: usize = 0;
const LOCKED: usize = 8;
const TAIL: usize = 16;
/// Bytes of the region (room for a user word after the lock's).
pub const REGION: usize = 64;

/// One rank's handle on a distributed MCS lock.
pub struct McsLock {
    me: usize,
    home: usize,
    eps: Vec<Endpoint>,
    /// Each rank's region key.
    keys: Vec<RemoteKey>,
    local: Buffer,
    held: bool,
}

impl McsLock {
    /// A lock over `eps` (rank → endpoint) whose tail lives at `home`.
    /// `local` is this rank's region ([`McsLock::alloc_region`], zeroed,
    /// [`REGION`] bytes with remote-atomic rights); `keys[r]` is rank `r`'s
    /// region key. Every rank must have its region zeroed before any rank
    /// first acquires.
    pub fn new(me: usize, home: usize, eps: Vec<Endpoint>, keys: Vec<RemoteKey>, local: Buffer) -> Result<McsLock> {
        if me >= eps.len() || home >= eps.len() || keys.len() != eps.len() || local.len() < REGION {
            return Err(Error::invalid("mcs: rank, home, keys and region must match the job"));
        }
        Ok(McsLock { me, home, eps, keys, local, held: false })
    }

    /// A zeroed lock region of this device with remote-atomic rights.
    pub fn alloc_region(dev: &mut Device) -> Result<Buffer> {
        dev.alloc_mr(REGION, MR_REMOTE_ATOMIC)
    }

    /// Sets up lock `name` for every rank of `job` (a collective call:
    /// regions are allocated and keys exchanged through the rendezvous).
    pub fn create(dev: &mut Device, job: &Job, name: &str, home: usize) -> Result<McsLock> {
        let local = Self::alloc_region(dev)?;
        let eps = job.endpoints(dev.endpoint())?;
        let mine = local.remote_key().as_u64();
        let all = job.exchange(&format!("mcs-{name}"), &mine.to_string(), Duration::from_secs(60))?;
        let keys = all
            .iter()
            .map(|k| {
                let k =
                    k.trim().parse::<u64>().map_err(|_| Error::Protocol(format!("mcs {name}: bad key record {k:?}")));
                k.map(RemoteKey::from_u64)
            })
            .collect::<Result<Vec<RemoteKey>>>()?;
        Self::new(job.rank, home, eps, keys, local)
    }

    fn word(&self, rank: usize, off: usize) -> RemoteWord {
        RemoteWord { key: self.keys[rank], offset: off as u64, width: Width::W64 }
    }

    /// A spare word of `rank`'s region (offset 24..64 in 8-byte steps),
    /// e.g. for data the lock protects.
    pub fn user_word(&self, rank: usize, index: usize) -> (Endpoint, RemoteWord) {
        assert!(TAIL + 8 + 8 * (index + 1) <= REGION, "user word {index} beyond the region");
        (self.eps[rank], self.word(rank, TAIL + 8 + 8 * index))
    }

    /// True while this rank holds the lock.
    pub fn held(&self) -> bool {
        self.held
    }

    /// Takes the lock, waiting in line behind earlier arrivals.
    pub fn acquire(&mut self, dev: &mut Device) -> Result<()> {
        if self.held {
            return Err(Error::invalid("mcs: acquire while holding the lock"));
        }
        use std::sync::atomic::Ordering::SeqCst;
        let me = self.me as u64 + 1;
        self.local.atomic_u64(NEXT).store(0, SeqCst);
        self.local.atomic_u64(LOCKED).store(1, SeqCst);
        let pred = dev.swap(self.eps[self.home], self.word(self.home, TAIL), me)?;
        if pred != 0 {
            let p = self.rank_of(pred)?;
            dev.swap(self.eps[p], self.word(p, NEXT), me)?;
            wait_until(|| self.local.atomic_u64(LOCKED).load(SeqCst) == 0);
        }
        self.held = true;
        Ok(())
    }

    /// Hands the lock to the next rank in line, or frees it.
    pub fn release(&mut self, dev: &mut Device) -> Result<()> {
        if !self.held {
            return Err(Error::invalid("mcs: release without holding the lock"));
        }
        use std::sync::atomic::Ordering::SeqCst;
        let me = self.me as u64 + 1;
        if self.local.atomic_u64(NEXT).load(SeqCst) == 0 {
            let tail = dev.cmp_swap(self.eps[self.home], self.word(self.home, TAIL), me, 0)?;
            if tail == me {
                self.held = false;
                return Ok(());
            }
            // A successor swapped itself in and is about to link.
            wait_until(|| self.local.atomic_u64(NEXT).load(SeqCst) != 0);
        }
        let succ = self.rank_of(self.local.atomic_u64(NEXT).load(SeqCst))?;
        dev.swap(self.eps[succ], self.word(succ, LOCKED), 0)?;
        self.held = false;
        Ok(())
    }

    fn rank_of(&self, v: u64) -> Result<usize> {
        match (v as usize).checked_sub(1) {
            Some(r) if r < self.eps.len() => Ok(r),
            _ => Err(Error::Protocol(format!("mcs: lock word holds {v}, not a rank"))),
        }
    }
}

/// Polls `done` with backoff: spin, then yield, then sleep up to 50 µs.
fn wait_until(mut done: impl FnMut() -> bool) {
    let mut i = 0u32;
    while !done() {
        i = i.saturating_add(1);
        if i < 200 {
            std::hint::spin_loop();
        } else if i < 400 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(((i - 400) as u64).min(50)));
        }
    }
}
