//! Persistent descriptors (EMP thesis §2.3.3; MPI persistent requests): a
//! send or receive stored once in a slot of its ring's table
//! ([`WD_PERSIST`]) and run again and again by a 24-byte
//! [`Opcode::Start`]. A start is decoded from its ring slot's first
//! [`emp_uapi::desc::START_BYTES`] and the stored descriptor, validated
//! when stored, is not read from host-written memory again; its memory is
//! still checked at every start (a region may have gone since).
//!
//! One table per ring (send, receive) and port, so a store and the starts
//! that name it are ordered by the ring they share. Tables leave with a
//! saved context (`ctxsw.rs`) and are emptied when the port closes.
//! The host interface (`host.rs`) stores and starts through them.

use emp_uapi::desc::{WorkDesc, PERSIST_SLOTS, WD_PERSIST};

/// One ring's stored descriptors, by slot.
#[derive(Debug, Default)]
pub(crate) struct PersistTable {
    /// Empty until the first store (a store is not on the hot path; a
    /// start never allocates).
    slots: Vec<Option<WorkDesc>>,
}

impl PersistTable {
    /// Keeps `d` in `slot` (below [`PERSIST_SLOTS`]), as it will run: the
    /// store's own flag and slot number are not part of it.
    pub(crate) fn store(&mut self, slot: u8, d: &WorkDesc) {
        if self.slots.is_empty() {
            self.slots = vec![None; PERSIST_SLOTS];
        }
        let mut kept = *d;
        kept.flags &= !WD_PERSIST;
        kept.slot = 0;
        self.slots[slot as usize] = Some(kept);
    }

    /// The descriptor stored in `slot`, if any.
    pub(crate) fn get(&self, slot: u64) -> Option<&WorkDesc> {
        self.slots.get(slot as usize)?.as_ref()
    }

    /// Stored descriptors with their slots, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u8, &WorkDesc)> {
        self.slots.iter().enumerate().filter_map(|(i, d)| Some((i as u8, d.as_ref()?)))
    }

    pub(crate) fn len(&self) -> usize {
        self.iter().count()
    }

    pub(crate) fn clear(&mut self) {
        self.slots.iter_mut().for_each(|d| *d = None);
    }
}
