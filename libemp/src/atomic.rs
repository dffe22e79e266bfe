//! Remote atomics executed by the target's NIC (no target CPU involved):
//! fetch-and-add, compare-and-swap and swap on a naturally aligned 32- or
//! 64-bit little-endian word of a region the target registered with
//! [`crate::MR_REMOTE_ATOMIC`] (e.g. [`Device::alloc_mr`]).
//!
//! ```no_run
//! # let mut dev = emp::Device::open()?;
//! # let (peer, key) = (emp::Endpoint { node: 1, port: 0 }, emp::RemoteKey::from_u64(0x1234_5678_0001_0001));
//! let counter = emp::RemoteWord { key, offset: 0, width: emp::Width::W64 };
//! let before = dev.fetch_add(peer, counter, 1)?;   // blocking
//! let result = dev.alloc(8)?;                        // or nonblocking:
//! dev.post_cmp_swap(7, peer, counter, before + 1, 0, result.sge(0, 8))?;
//! let wc = dev.wait_wr(7, None)?;                    // wc.old = the word before
//! # Ok::<(), emp::Error>(())
//! ```
//!
//! Each completion carries the old value in [`crate::Completion::old`] (the
//! CQE's `tag`), and the NIC also writes it to the result word. Operations
//! from one port to one target run in posting order, exactly once, despite
//! loss and duplication on the wire (the target NIC keeps a result cache).
//!
//! NIC atomics are atomic with respect to each other, not with respect to
//! the target host's own loads and stores: the target process should read
//! such words with atomic loads and write them only when no remote atomic
//! can be in flight (as [`crate::mcs::McsLock`] does), or through the NIC.
//! `RetryLimitExceeded` means the outcome is unknown (the target may have
//! executed the operation and the answer been lost).

use std::sync::atomic::{AtomicU32, AtomicU64};

use emp_uapi::desc::{Opcode, RemoteSge, Sge, WorkDesc, WD_SIGNALED};

use crate::{Buffer, Device, Endpoint, Error, RemoteKey, Result, Status};

/// Width of an atomic word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Width {
    /// 32 bits (operands must fit).
    W32,
    /// 64 bits.
    W64,
}

impl Width {
    /// Bytes.
    pub const fn bytes(self) -> u32 {
        match self {
            Width::W32 => 4,
            Width::W64 => 8,
        }
    }

    /// The width of `bytes` (4 or 8).
    pub const fn from_bytes(bytes: u32) -> Option<Width> {
        match bytes {
            4 => Some(Width::W32),
            8 => Some(Width::W64),
            _ => None,
        }
    }
}

/// A word in another port's memory: `width` bytes at `offset` of the
/// region named by `key` (the target's key and secret, handed over out of band).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteWord {
    /// The target's memory key and secret.
    pub key: RemoteKey,
    /// Byte offset within the region (a multiple of the width).
    pub offset: u64,
    /// Word width.
    pub width: Width,
}

impl RemoteWord {
    /// The word `index` words further on (arrays of words).
    pub fn at(self, index: u64) -> RemoteWord {
        RemoteWord { offset: self.offset + index * self.width.bytes() as u64, ..self }
    }
}

/// Work request id of the blocking operations ([`Device::fetch_add`] …):
/// bit 63 marks ids the library reserves.
pub const BLOCKING_ATOMIC_WR: u64 = 1 << 63 | 0xA7 << 48;

/// How long a blocking call waits for room in a full send ring.
const RING_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl Buffer {
    /// This buffer's word at `off` as another port addresses it (the
    /// buffer must come from [`Device::alloc_mr`] with remote-atomic rights).
    pub fn remote_word(&self, off: usize, width: Width) -> RemoteWord {
        let s = self.sge(off, width.bytes() as usize);
        RemoteWord { key: self.remote_key(), offset: s.offset, width }
    }

    /// The 64-bit word at `off`, for local loads (and stores the protocol
    /// allows) of memory the NIC writes.
    ///
    /// # Panics
    /// When `off` is not 8-aligned or the word is beyond the buffer.
    pub fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        assert!(off + 8 <= self.len && (self.ptr as usize + off).is_multiple_of(8), "unaligned or out of bounds");
        // SAFETY: in bounds and aligned (checked above); the arena lives as
        // long as the device and is only accessed atomically through this view.
        unsafe { &*self.ptr.add(off).cast::<AtomicU64>() }
    }

    /// The 32-bit word at `off` (see [`Buffer::atomic_u64`]).
    ///
    /// # Panics
    /// When `off` is not 4-aligned or the word is beyond the buffer.
    pub fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        assert!(off + 4 <= self.len && (self.ptr as usize + off).is_multiple_of(4), "unaligned or out of bounds");
        // SAFETY: as in atomic_u64.
        unsafe { &*self.ptr.add(off).cast::<AtomicU32>() }
    }
}

/// The descriptor of a remote atomic (`WorkDesc` contract in `emp_uapi::desc`).
fn atomic_desc(
    op: Opcode,
    wr_id: u64,
    dst: Endpoint,
    at: RemoteWord,
    operand: u64,
    compare: u64,
    result: Sge,
) -> Result<WorkDesc> {
    let w = at.width.bytes();
    let fits = |v: u64| at.width == Width::W64 || v >> 32 == 0;
    if result.len != w {
        return Err(Error::invalid("atomic: the result SGE must be exactly the word's width"));
    }
    if !at.offset.is_multiple_of(w as u64) {
        return Err(Error::invalid("atomic: the remote word is not naturally aligned"));
    }
    if !fits(operand) || !fits(compare) {
        return Err(Error::invalid("atomic: operand wider than the 32-bit word"));
    }
    let mut d = WorkDesc {
        wr_id,
        opcode: op as u8,
        flags: WD_SIGNALED,
        num_sge: 2,
        node: dst.node,
        port: dst.port,
        tag: operand,
        ignore: compare,
        ..Default::default()
    };
    d.sge[0] = result;
    d.sge[1] = RemoteSge { key: at.key.key, secret: at.key.secret, offset: at.offset }.to_sge();
    Ok(d)
}

impl Device {
    /// Posts `word += add` at `dst`; the completion's `old` (and the
    /// `result` word, `width` bytes of registered local memory) gets the
    /// value before. Wraps at the width.
    ///
    /// # Errors
    /// [`Error::RingFull`]; [`Error::InvalidArgument`] when `result` is not
    /// `width` bytes, the remote word is not naturally aligned, or an
    /// operand does not fit a 32-bit word.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let words = dev.alloc_mr(4096, emp::MR_REMOTE_ATOMIC)?;
    /// let peer = emp::Endpoint { node: 1, port: 0 };
    /// let counter = words.remote_word(0, emp::Width::W64); // as the peer sent it
    /// let result = dev.alloc(8)?;
    /// dev.post_fetch_add(3, peer, counter, 1, result.sge(0, 8))?;
    /// let old = dev.wait_wr(3, None)?.old;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_fetch_add(&mut self, wr_id: u64, dst: Endpoint, at: RemoteWord, add: u64, result: Sge) -> Result<()> {
        let d = atomic_desc(Opcode::AtomicFetchAdd, wr_id, dst, at, add, 0, result)?;
        self.post_raw(true, &d)
    }

    /// Posts `if word == compare { word = swap }` at `dst` (a miss writes
    /// nothing); the old value as in [`Device::post_fetch_add`].
    ///
    /// # Errors
    /// As [`Device::post_fetch_add`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let words = dev.alloc_mr(4096, emp::MR_REMOTE_ATOMIC)?;
    /// let peer = emp::Endpoint { node: 1, port: 0 };
    /// let counter = words.remote_word(0, emp::Width::W64); // as the peer sent it
    /// let result = dev.alloc(8)?;
    /// dev.post_cmp_swap(4, peer, counter, 0, 1, result.sge(0, 8))?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_cmp_swap(
        &mut self,
        wr_id: u64,
        dst: Endpoint,
        at: RemoteWord,
        compare: u64,
        swap: u64,
        result: Sge,
    ) -> Result<()> {
        let d = atomic_desc(Opcode::AtomicCmpSwap, wr_id, dst, at, swap, compare, result)?;
        self.post_raw(true, &d)
    }

    /// Posts `word = value` at `dst`; the old value as in [`Device::post_fetch_add`].
    ///
    /// # Errors
    /// As [`Device::post_fetch_add`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let words = dev.alloc_mr(4096, emp::MR_REMOTE_ATOMIC)?;
    /// let peer = emp::Endpoint { node: 1, port: 0 };
    /// let counter = words.remote_word(0, emp::Width::W64); // as the peer sent it
    /// let result = dev.alloc(8)?;
    /// dev.post_swap(5, peer, counter, 7, result.sge(0, 8))?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_swap(&mut self, wr_id: u64, dst: Endpoint, at: RemoteWord, value: u64, result: Sge) -> Result<()> {
        let d = atomic_desc(Opcode::AtomicSwap, wr_id, dst, at, value, 0, result)?;
        self.post_raw(true, &d)
    }

    /// Blocking fetch-and-add: returns the old value. Other completions
    /// seen meanwhile stay for [`Device::poll_cq`] (see [`Device::wait_wr`]).
    ///
    /// # Errors
    /// [`Error::Failed`] with the completion's status (e.g. a key the peer
    /// does not know, or no remote-atomic right); a broken control path.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let words = dev.alloc_mr(4096, emp::MR_REMOTE_ATOMIC)?;
    /// let peer = emp::Endpoint { node: 1, port: 0 };
    /// let counter = words.remote_word(0, emp::Width::W64); // as the peer sent it
    /// let before = dev.fetch_add(peer, counter, 1)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn fetch_add(&mut self, dst: Endpoint, at: RemoteWord, add: u64) -> Result<u64> {
        self.blocking_atomic(Opcode::AtomicFetchAdd, dst, at, add, 0)
    }

    /// Blocking compare-and-swap: returns the old value (the swap happened
    /// iff it equals `compare`).
    ///
    /// # Errors
    /// As [`Device::fetch_add`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let words = dev.alloc_mr(4096, emp::MR_REMOTE_ATOMIC)?;
    /// let peer = emp::Endpoint { node: 1, port: 0 };
    /// let counter = words.remote_word(0, emp::Width::W64); // as the peer sent it
    /// let took_lock = dev.cmp_swap(peer, counter, 0, 1)? == 0;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn cmp_swap(&mut self, dst: Endpoint, at: RemoteWord, compare: u64, swap: u64) -> Result<u64> {
        self.blocking_atomic(Opcode::AtomicCmpSwap, dst, at, swap, compare)
    }

    /// Blocking swap: returns the old value.
    ///
    /// # Errors
    /// As [`Device::fetch_add`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let words = dev.alloc_mr(4096, emp::MR_REMOTE_ATOMIC)?;
    /// let peer = emp::Endpoint { node: 1, port: 0 };
    /// let counter = words.remote_word(0, emp::Width::W64); // as the peer sent it
    /// let previous = dev.swap(peer, counter, 0)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn swap(&mut self, dst: Endpoint, at: RemoteWord, value: u64) -> Result<u64> {
        self.blocking_atomic(Opcode::AtomicSwap, dst, at, value, 0)
    }

    fn blocking_atomic(
        &mut self,
        op: Opcode,
        dst: Endpoint,
        at: RemoteWord,
        operand: u64,
        compare: u64,
    ) -> Result<u64> {
        let result = self.atomic_result_sge(at.width.bytes() as usize)?;
        let d = atomic_desc(op, BLOCKING_ATOMIC_WR, dst, at, operand, compare, result)?;
        let end = std::time::Instant::now() + RING_WAIT;
        loop {
            match self.post_raw(true, &d) {
                Ok(()) => break,
                // The ring drains as the NIC consumes: wait for room.
                Err(Error::RingFull) if std::time::Instant::now() < end => std::thread::yield_now(),
                Err(e) => return Err(e),
            }
        }
        let c = self.wait_wr(BLOCKING_ATOMIC_WR, None)?;
        match c.status {
            Status::Success => Ok(c.old),
            s => Err(Error::Failed(s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DST: Endpoint = Endpoint { node: 3, port: 1 };

    fn word(width: Width, offset: u64) -> RemoteWord {
        RemoteWord { key: RemoteKey { key: 0x10005, secret: 0xABCD_1234 }, offset, width }
    }

    #[test]
    fn descriptors_meet_the_uapi_contract() {
        let res = Sge { key: 7, len: 8, offset: 40 };
        let d = atomic_desc(Opcode::AtomicCmpSwap, 9, DST, word(Width::W64, 16), 5, 4, res).unwrap();
        assert_eq!(d.validate(), Ok(Opcode::AtomicCmpSwap));
        assert_eq!((d.node, d.port, d.tag, d.ignore, d.num_sge), (3, 1, 5, 4, 2));
        assert_eq!((d.sge[0], d.remote()), (res, RemoteSge { key: 0x10005, secret: 0xABCD_1234, offset: 16 }));
        let r4 = Sge { len: 4, ..res };
        for op in [Opcode::AtomicFetchAdd, Opcode::AtomicSwap] {
            let d = atomic_desc(op, 1, DST, word(Width::W32, 12), u32::MAX as u64, 0, r4).unwrap();
            assert_eq!(d.validate(), Ok(op));
        }
    }

    #[test]
    fn misuse_is_refused_before_posting() {
        let res = Sge { key: 7, len: 8, offset: 0 };
        let bad = [
            atomic_desc(Opcode::AtomicFetchAdd, 1, DST, word(Width::W64, 4), 1, 0, res),
            atomic_desc(Opcode::AtomicFetchAdd, 1, DST, word(Width::W32, 0), 1, 0, res),
            atomic_desc(Opcode::AtomicSwap, 1, DST, word(Width::W32, 0), 1 << 32, 0, Sge { len: 4, ..res }),
            atomic_desc(Opcode::AtomicCmpSwap, 1, DST, word(Width::W32, 0), 1, 1 << 40, Sge { len: 4, ..res }),
        ];
        for r in bad {
            assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
        }
    }

    #[test]
    fn remote_words_step_by_width() {
        assert_eq!(word(Width::W32, 8).at(3).offset, 20);
        assert_eq!(word(Width::W64, 8).at(3).offset, 32);
        assert_eq!(Width::from_bytes(4), Some(Width::W32));
        assert_eq!(Width::from_bytes(3), None);
    }
}
