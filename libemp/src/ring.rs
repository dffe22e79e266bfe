//! The shared-memory rings of a port, as the host sees them: the work
//! rings it produces into (send, receive) and the completion queue it
//! consumes. Both backends map the same layout (`emp_uapi::sram`), so this
//! code has no backend in it. Slots, room and the CQE phase come from
//! `emp_uapi::ring`, the one implementation every party shares; memory
//! ordering is this module's, stated at each access.

use std::sync::atomic::{fence, AtomicU32, Ordering};

use emp_uapi::desc::{Cqe, Opcode, Status, WorkDesc, CQE_FLAGS_OFFSET, CQE_IMM};
use emp_uapi::ring;
use emp_uapi::sram::{ctl, PortWindow};
use emp_uapi::Le;

use crate::map::Mapping;
use crate::{Completion, Endpoint, Error, PortInfo, Result};

/// The mapped port window: the control page, then the send ring, then the
/// receive ring (geometry checked when the port was opened).
pub(crate) struct Window(Mapping);

impl Window {
    pub(crate) fn new(map: Mapping) -> Window {
        Window(map)
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The 32-bit control word at `off` (`emp_uapi::sram::ctl`).
    pub(crate) fn word(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.0.len(), "control word outside the window");
        // SAFETY: in-window and aligned (checked above); the NIC shares
        // these words, so they are only accessed atomically.
        unsafe { &*self.0.ptr().add(off).cast::<AtomicU32>() }
    }
}

/// Which work ring.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum RingKind {
    Send,
    Recv,
}

/// A ring of work descriptors the host produces into and the NIC consumes.
pub(crate) struct WorkRing {
    kind: RingKind,
    /// The port's layout; the mapping starts at its window (base 0).
    layout: PortWindow,
    /// Our producer index (free-running); the window's copy is what the
    /// NIC trusts.
    prod: u32,
}

impl WorkRing {
    /// The port's `kind` ring, empty.
    pub(crate) fn new(kind: RingKind, info: &PortInfo) -> WorkRing {
        let layout = PortWindow { base: 0, send_entries: info.send_entries, recv_entries: info.recv_entries };
        WorkRing { kind, layout, prod: 0 }
    }

    /// Writes `d` into the next free slot and publishes it to the NIC.
    /// [`Error::RingFull`] when the NIC has not consumed enough yet.
    /// Only the descriptor's first `len` bytes are written (a start's
    /// [`emp_uapi::desc::START_BYTES`]: the NIC reads no more of it).
    pub(crate) fn push_bytes(&mut self, window: &Window, d: &WorkDesc, len: usize) -> Result<()> {
        debug_assert!(len <= WorkDesc::SIZE);
        let (entries, cons_word, prod_word, slot) = match self.kind {
            RingKind::Send => {
                (self.layout.send_entries, ctl::SEND_CONS, ctl::SEND_PROD, self.layout.send_slot(self.prod))
            }
            RingKind::Recv => {
                (self.layout.recv_entries, ctl::RECV_CONS, ctl::RECV_PROD, self.layout.recv_slot(self.prod))
            }
        };
        // Acquire: the NIC is done reading every slot before `cons`.
        let cons = window.word(self.layout.ctl(cons_word)).load(Ordering::Acquire);
        if !ring::has_room(self.prod, cons, entries) {
            return Err(Error::RingFull);
        }
        let mut b = [0u8; WorkDesc::SIZE];
        d.put(&mut b);
        assert!(slot + WorkDesc::SIZE <= window.0.len(), "ring slot outside the window");
        // SAFETY: the slot lies inside the window (checked above), and the
        // NIC does not read it until the index below publishes it.
        unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), window.0.ptr().add(slot), len.min(WorkDesc::SIZE)) };
        self.prod = self.prod.wrapping_add(1);
        // Release: the descriptor is visible before the index that
        // publishes it.
        window.word(self.layout.ctl(prod_word)).store(self.prod, Ordering::Release);
        Ok(())
    }
}

/// The completion queue: `ENTRIES` CQEs at the start of the arena, written
/// by the NIC, each published by its phase byte (`emp_uapi::ring`).
pub(crate) struct CompletionQueue {
    base: *mut u8,
    /// Our consumer index (free-running).
    head: u32,
}

impl CompletionQueue {
    /// Entries (a power of two), as the port is started with.
    pub(crate) const ENTRIES: u32 = 4096;
    /// Bytes the queue occupies at the start of the arena.
    pub(crate) const BYTES: usize = Self::ENTRIES as usize * Cqe::SIZE;

    /// The queue at the start of `arena`, which must outlive it.
    pub(crate) fn new(arena: &Mapping) -> CompletionQueue {
        assert!(arena.len() >= Self::BYTES, "arena smaller than the CQ");
        CompletionQueue { base: arena.ptr(), head: 0 }
    }

    /// Takes up to `out.len()` completions; returns how many.
    pub(crate) fn poll(&mut self, window: &Window, out: &mut [Completion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let idx = ring::slot(self.head, Self::ENTRIES);
            // SAFETY: idx < ENTRIES, and the CQ occupies the first BYTES of
            // the arena (checked at construction).
            let entry = unsafe { self.base.add(idx as usize * Cqe::SIZE) };
            // SAFETY: reading the flags byte (the entry's last) of a live
            // entry; the NIC makes it visible after the rest of the entry (a
            // DMA fence between), so observing the phase means the body is
            // complete once the acquire fence below orders our reads.
            let flags = unsafe { core::ptr::read_volatile(entry.add(CQE_FLAGS_OFFSET)) };
            if !ring::cqe_is_new(flags, self.head, Self::ENTRIES) {
                break;
            }
            // Acquire: the body is read after the phase that publishes it.
            fence(Ordering::Acquire);
            let mut b = [0u8; Cqe::SIZE];
            // SAFETY: the entry is complete (phase observed above) and the
            // NIC does not rewrite it until CQ_CONS passes it.
            unsafe { core::ptr::copy_nonoverlapping(entry, b.as_mut_ptr(), Cqe::SIZE) };
            out[n] = completion(&Cqe::get(&b));
            n += 1;
            self.head = self.head.wrapping_add(1);
        }
        if n > 0 {
            // Release: our reads of the entries are done before the NIC may
            // reuse them.
            window.word(ctl::CQ_CONS).store(self.head, Ordering::Release);
        }
        n
    }
}

const _: () = assert!(ring::valid_entries(CompletionQueue::ENTRIES), "CQ entries must be a power of two");

/// The library's view of a CQE.
fn completion(c: &Cqe) -> Completion {
    let opcode = Opcode::from_u8(c.opcode).unwrap_or(Opcode::Send);
    Completion {
        wr_id: c.wr_id,
        status: Status::from_u8(c.status).unwrap_or(Status::BadDescriptor),
        is_recv: matches!(opcode, Opcode::Recv | Opcode::RecvRdmaImm),
        byte_len: c.byte_len,
        tag: c.tag,
        src: Endpoint { node: c.src_node, port: c.src_port },
        msg_len: c.msg_len,
        opcode,
        old: if opcode.is_atomic() { c.tag } else { 0 },
        imm: (c.flags & CQE_IMM != 0).then_some(c.imm),
    }
}
