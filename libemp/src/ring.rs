//! The shared-memory rings of a port, as the host sees them: the work
//! rings it produces into (send, receive) and the completion queue it
//! consumes. Both backends map the same layout (`emp_uapi::sram`), so this
//! code has no backend in it. Index arithmetic is the NIC's own
//! (`emp_uapi::desc`, `emp_uapi::sram`); memory ordering is ours and
//! stated at each access.

use std::sync::atomic::{fence, AtomicU32, Ordering};

use emp_uapi::desc::{Cqe, Opcode, Status, WorkDesc, CQE_FLAGS_OFFSET, CQE_PHASE};
use emp_uapi::sram::ctl;
use emp_uapi::{Le, PAGE_SIZE};

use crate::map::Mapping;
use crate::{Completion, Endpoint, Error, PortInfo, Result};

/// The mapped port window: the control page, then the send ring, then the
/// receive ring (geometry checked when the port was opened).
pub(crate) struct Window(Mapping);

impl Window {
    pub(crate) fn new(map: Mapping) -> Window {
        Window(map)
    }

    /// The 32-bit control word at `off` (`emp_uapi::sram::ctl`).
    pub(crate) fn word(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.0.len(), "control word outside the window");
        // SAFETY: in-window and aligned (checked above); the NIC shares
        // these words, so they are only accessed atomically.
        unsafe { &*self.0.ptr().add(off).cast::<AtomicU32>() }
    }
}

/// A ring of work descriptors the host produces into and the NIC consumes.
pub(crate) struct WorkRing {
    /// Offset of slot 0 in the window.
    base: usize,
    /// Slots (a power of two).
    entries: u32,
    /// Our producer index (free-running); the window's copy is what the
    /// NIC trusts.
    prod: u32,
    prod_word: usize,
    cons_word: usize,
}

impl WorkRing {
    /// The send ring, right after the control page.
    pub(crate) fn send(info: &PortInfo) -> WorkRing {
        WorkRing {
            base: PAGE_SIZE,
            entries: info.send_entries,
            prod: 0,
            prod_word: ctl::SEND_PROD,
            cons_word: ctl::SEND_CONS,
        }
    }

    /// The receive ring, right after the send ring.
    pub(crate) fn recv(info: &PortInfo) -> WorkRing {
        WorkRing {
            base: PAGE_SIZE + info.send_entries as usize * WorkDesc::SIZE,
            entries: info.recv_entries,
            prod: 0,
            prod_word: ctl::RECV_PROD,
            cons_word: ctl::RECV_CONS,
        }
    }

    /// Writes `d` into the next free slot and publishes it to the NIC.
    /// [`Error::RingFull`] when the NIC has not consumed enough yet.
    pub(crate) fn push(&mut self, window: &Window, d: &WorkDesc) -> Result<()> {
        // Acquire: the NIC is done reading every slot before `cons`.
        let cons = window.word(self.cons_word).load(Ordering::Acquire);
        if self.prod.wrapping_sub(cons) >= self.entries {
            return Err(Error::RingFull);
        }
        let slot = self.base + (self.prod & (self.entries - 1)) as usize * WorkDesc::SIZE;
        let mut b = [0u8; WorkDesc::SIZE];
        d.put(&mut b);
        assert!(slot + WorkDesc::SIZE <= window.0.len(), "ring slot outside the window");
        // SAFETY: the slot lies inside the window (checked above), and the
        // NIC does not read it until the index below publishes it.
        unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), window.0.ptr().add(slot), WorkDesc::SIZE) };
        self.prod = self.prod.wrapping_add(1);
        // Release: the descriptor is visible before the index that
        // publishes it.
        window.word(self.prod_word).store(self.prod, Ordering::Release);
        Ok(())
    }
}

/// The completion queue: `ENTRIES` CQEs at the start of the arena, written
/// by the NIC, each published by its phase bit.
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
            let idx = self.head & (Self::ENTRIES - 1);
            let phase = if (self.head / Self::ENTRIES) & 1 == 0 { CQE_PHASE } else { 0 };
            // SAFETY: idx < ENTRIES, and the CQ occupies the first BYTES of
            // the arena (checked at construction).
            let entry = unsafe { self.base.add(idx as usize * Cqe::SIZE) };
            // SAFETY: reading the flags byte of a live entry; the NIC writes
            // it last, so observing the phase means the body is complete.
            let flags = unsafe { core::ptr::read_volatile(entry.add(CQE_FLAGS_OFFSET)) };
            if flags & CQE_PHASE != phase {
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

/// The library's view of a CQE.
fn completion(c: &Cqe) -> Completion {
    let opcode = Opcode::from_u8(c.opcode).unwrap_or(Opcode::Send);
    Completion {
        wr_id: c.wr_id,
        status: Status::from_u8(c.status).unwrap_or(Status::BadDescriptor),
        is_recv: opcode == Opcode::Recv,
        byte_len: c.byte_len,
        tag: c.tag,
        src: Endpoint { node: c.src_node, port: c.src_port },
        msg_len: c.msg_len,
        opcode,
        old: if opcode.is_atomic() { c.tag } else { 0 },
    }
}
