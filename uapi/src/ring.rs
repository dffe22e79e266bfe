//! The shared-memory ring protocol: index arithmetic, room checks and the
//! completion queue's phase, written once for every party (libemp, the
//! driver, the control program, the simulator's host).
//!
//! Indices are free-running `u32`s that wrap; a ring has a power-of-two
//! number of entries, so the slot of index `i` is `i mod entries` and
//! `prod - cons` (wrapping) is the number of entries in use. Memory
//! ordering is the caller's business, as in rdma-core's `rxe_queue.h`: a
//! producer writes the entry, then publishes the index with a release
//! store; a consumer loads the index with acquire before reading the entry.
//!
//! Completion entries carry no index: the consumer knows an entry is new
//! when its phase bit equals [`cqe_phase`] of its own head index, which
//! flips each time the queue wraps. The NIC therefore makes the phase byte
//! ([`crate::desc::CQE_FLAGS_OFFSET`], the entry's last byte) visible only
//! after the rest of the entry (see [`crate::desc::Cqe`]).

use crate::desc::CQE_PHASE;

/// True when `entries` is a usable ring size (a power of two, at least 1).
pub const fn valid_entries(entries: u32) -> bool {
    entries.is_power_of_two()
}

/// Slot of free-running index `idx` in a ring of `entries` (a power of two).
pub const fn slot(idx: u32, entries: u32) -> u32 {
    debug_assert!(valid_entries(entries));
    idx & (entries - 1)
}

/// Entries in use between consumer `cons` and producer `prod`.
pub const fn used(prod: u32, cons: u32) -> u32 {
    prod.wrapping_sub(cons)
}

/// True when a producer at `prod` may write one more entry.
pub const fn has_room(prod: u32, cons: u32, entries: u32) -> bool {
    used(prod, cons) < entries
}

/// True when a consumer at `cons` has an entry to read.
pub const fn has_entry(prod: u32, cons: u32) -> bool {
    prod != cons
}

/// True when a producer index the other side published is believable: at
/// most `entries` ahead of the consumer (anything else is a corrupt or
/// hostile index, refused rather than consumed).
pub const fn plausible(prod: u32, cons: u32, entries: u32) -> bool {
    used(prod, cons) <= entries
}

/// The phase value ([`CQE_PHASE`] or 0) an entry written at free-running
/// index `idx` of a CQ of `entries` carries: [`CQE_PHASE`] on the first
/// pass, then alternating on each wrap. The memory starts zeroed, so an
/// unwritten entry never looks new.
pub const fn cqe_phase(idx: u32, entries: u32) -> u8 {
    debug_assert!(valid_entries(entries));
    if (idx / entries) & 1 == 0 {
        CQE_PHASE
    } else {
        0
    }
}

/// True when a CQE whose flags byte is `flags` is the new entry at the
/// consumer's free-running index `head`.
pub const fn cqe_is_new(flags: u8, head: u32, entries: u32) -> bool {
    flags & CQE_PHASE == cqe_phase(head, entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_wraps_and_room_counts_across_u32_wrap() {
        assert_eq!(slot(5, 4), 1);
        assert_eq!(slot(u32::MAX, 8), 7);
        let (cons, entries) = (u32::MAX - 1, 4);
        let mut prod = cons;
        for _ in 0..entries {
            assert!(has_room(prod, cons, entries));
            prod = prod.wrapping_add(1);
        }
        assert!(!has_room(prod, cons, entries), "full after `entries` posts across the wrap");
        assert_eq!(used(prod, cons), entries);
        assert!(plausible(prod, cons, entries));
        assert!(!plausible(prod.wrapping_add(1), cons, entries));
        assert!(has_entry(prod, cons) && !has_entry(cons, cons));
    }

    #[test]
    fn cqe_phase_flips_on_every_wrap_and_zeroed_memory_is_never_new() {
        let entries = 4;
        for idx in 0..4 * entries {
            let want = if (idx / entries) % 2 == 0 { CQE_PHASE } else { 0 };
            assert_eq!(cqe_phase(idx, entries), want);
            assert!(cqe_is_new(want, idx, entries));
            assert!(!cqe_is_new(want ^ CQE_PHASE, idx, entries));
        }
        assert!(!cqe_is_new(0, 0, entries), "a zeroed CQ has no entries");
    }
}
