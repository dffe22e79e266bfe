//! Bounds-checked reads from an untrusted port context image (PM's C7:
//! `ctxsw.rs` restores it; each collective's state reads its own part).
//! Its own file so the collectives and `ctxsw.rs` share it without
//! depending on each other.

use emp_uapi::desc::WorkDesc;
use emp_uapi::Le;

/// Bounds-checked reads from an untrusted image.
pub(crate) struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Reader { b, at: 0 }
    }
    /// True when every byte was read.
    pub(crate) fn at_end(&self) -> bool {
        self.at == self.b.len()
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or("image truncated")?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, &'static str> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    pub(crate) fn desc(&mut self) -> Result<WorkDesc, &'static str> {
        Ok(WorkDesc::get(self.take(WorkDesc::SIZE)?))
    }
}
