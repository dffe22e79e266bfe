//! Memory-region translation: (key, offset, length) → host bus addresses,
//! through the MR table the trusted side wrote in SRAM (short, chained or
//! indirect page lists, EMP thesis §2.3.2). Validated entries are kept in
//! a small cache, and each use re-reads the entry's key, owner, rights,
//! format and secret: an invalidated key stops working at once, and
//! a changed owner is seen, without the whole entry read and decoded again.

use emp_uapi::desc::{MrEntry, MrFormat, PhysSeg, Sge, Status, SEGS_PER_PAGE, SEG_LINK};
use emp_uapi::fwabi::{HostSeg, HOST_SEGS_MAX};
use emp_uapi::Le;

use emp_uapi::sram::Layout;

use crate::{Hal, Nic};

/// What the NIC learned about one indirect page list: where each page of
/// segments lives and at which region offset its first segment starts
/// (binary-searchable), plus the last page read, decoded. Built by one
/// walk of the list; dropped when the key changes or on `MrFence`.
#[derive(Clone, Debug, Default)]
struct Directory {
    key: u32,
    /// (region offset of the page's first segment, page address).
    pages: Vec<(u64, u64)>,
    /// Region length the directory covers.
    covered: u64,
    /// Recently read list pages, decoded (direct-mapped by page index).
    cache: Vec<CachedPage>,
}

/// A list page held decoded: its segments and their region offsets.
#[derive(Clone, Debug, Default)]
struct CachedPage {
    addr: u64,
    segs: Vec<PhysSeg>,
    starts: Vec<u64>,
}

/// Decoded list pages kept per directory.
const PAGE_CACHE: usize = 16;

/// One translation directory per MR slot.
#[derive(Debug)]
struct CursorCache {
    dirs: Vec<Option<Directory>>,
}

impl CursorCache {
    fn new(entries: u32) -> Self {
        CursorCache { dirs: vec![None; entries as usize] }
    }

    /// Forgets what was learned about `slot` (its entry changed).
    fn invalidate(&mut self, slot: usize) {
        if let Some(c) = self.dirs.get_mut(slot) {
            *c = None;
        }
    }
}

/// Lines of [`EntryCache`]: entries of the regions in use at once (a
/// port's send and receive buffers, its CQ) by a few ports.
const ENTRY_LINES: usize = 64;

/// Validated MR entries, direct-mapped by slot. A hit still re-reads the
/// entry's header words (key; owner, rights, format; secret) from SRAM and must
/// find them unchanged: the trusted side zeroes an entry to invalidate it
/// and rewrites its owner to move it, so either is seen on the next use,
/// fenced or not. The rest of an entry (length, segments) changes only
/// with a new registration, under a new key. `MrFence` drops the slot's
/// line as well.
#[derive(Debug)]
struct EntryCache {
    lines: core::cell::RefCell<[Option<MrEntry>; ENTRY_LINES]>,
}

impl EntryCache {
    fn new() -> Self {
        EntryCache { lines: core::cell::RefCell::new([None; ENTRY_LINES]) }
    }

    /// Forgets `slot`'s entry.
    fn invalidate(&self, slot: usize) {
        let mut lines = self.lines.borrow_mut();
        let line = &mut lines[slot % ENTRY_LINES];
        if line.is_some_and(|e| MrEntry::slot_of(e.key) == slot) {
            *line = None;
        }
    }
}

/// A range of a region checked by [`MrCache::checked`]: valid for moves
/// inside it until the event ends (the cache line may be reused after).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrChecked {
    line: usize,
    off: u64,
    end: u64,
}

/// Offset of `MrEntry::secret` in the entry.
const SECRET_OFF: usize = core::mem::offset_of!(MrEntry, secret);

/// The words of an entry a cache hit re-reads, as SRAM holds them: the
/// key; owner port, access and format; and the secret, drawn afresh for
/// every registration, so a slot registered again under a key that
/// happens to repeat is still told apart.
fn header_words(e: &MrEntry) -> [u32; 3] {
    [e.key, e.port as u32 | (e.access as u32) << 16 | (e.format as u32) << 24, e.secret]
}

/// A transfer's NIC-side buffer, which also says the direction.
#[derive(Debug)]
pub(crate) enum Buf<'a> {
    /// Host memory → this buffer.
    FromHost(&'a mut [u8]),
    /// This data → host memory.
    ToHost(&'a [u8]),
    /// `len` bytes of host memory, named rather than moved: each DMA this
    /// buffer would take becomes a segment (Immediate Sending).
    Gather(usize, &'a mut HostSegs),
}

/// The host segments of one frame's payload, in order (bounded).
#[derive(Debug, Default)]
pub(crate) struct HostSegs {
    pub(crate) segs: Vec<HostSeg>,
    /// More than `HOST_SEGS_MAX` were needed: the list is incomplete.
    pub(crate) overflowed: bool,
}

impl HostSegs {
    pub(crate) fn new() -> HostSegs {
        HostSegs { segs: Vec::with_capacity(HOST_SEGS_MAX), overflowed: false }
    }

    pub(crate) fn clear(&mut self) {
        self.segs.clear();
        self.overflowed = false;
    }

    /// Appends a run, merged with the previous one when contiguous.
    fn push(&mut self, addr: u64, len: usize) {
        if len == 0 {
            return;
        }
        if let Some(last) = self.segs.last_mut() {
            if last.addr.checked_add(last.len) == Some(addr) {
                last.len += len as u64;
                return;
            }
        }
        if self.segs.len() == HOST_SEGS_MAX {
            self.overflowed = true;
            return;
        }
        self.segs.push(HostSeg { addr, len: len as u64 });
    }
}

impl Buf<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Buf::FromHost(b) => b.len(),
            Buf::ToHost(b) => b.len(),
            Buf::Gather(n, _) => *n,
        }
    }

    /// The sub-buffer `[from, to)`.
    fn slice(&mut self, from: usize, to: usize) -> Buf<'_> {
        match self {
            Buf::FromHost(b) => Buf::FromHost(&mut b[from..to]),
            Buf::ToHost(b) => Buf::ToHost(&b[from..to]),
            Buf::Gather(_, segs) => Buf::Gather(to - from, segs),
        }
    }
}

/// What the program learned about the MR table: translation directories
/// and validated entries (`MrFence` clears a slot's).
#[derive(Debug)]
pub(crate) struct MrCache {
    cursors: CursorCache,
    entries: EntryCache,
}

impl MrCache {
    pub(crate) fn new(mr_entries: u32) -> MrCache {
        MrCache { cursors: CursorCache::new(mr_entries), entries: EntryCache::new() }
    }

    /// Forgets what was learned about `slot` (its entry changed).
    pub(crate) fn invalidate(&mut self, slot: usize) {
        self.cursors.invalidate(slot);
        self.entries.invalidate(slot);
    }
}

impl MrCache {
    /// Reads and checks the MR entry `key` names for `port` with `access`,
    /// covering `[off, off + len)`.
    pub(crate) fn lookup<H: Hal>(
        &self,
        hal: &mut H,
        layout: &Layout,
        port: u16,
        key: u32,
        off: u64,
        len: u64,
        access: u8,
    ) -> Result<MrEntry, Status> {
        let r = self.checked(hal, layout, port, key, off, len, access)?;
        Ok(self.entries.lines.borrow()[r.line].expect("checked entries are cached"))
    }

    /// [`MrCache::lookup`]'s checks, leaving the entry in the cache: the
    /// range checked, for [`MrCache::checked_io`] within the same event.
    pub(crate) fn checked<H: Hal>(
        &self,
        hal: &mut H,
        layout: &Layout,
        port: u16,
        key: u32,
        off: u64,
        len: u64,
        access: u8,
    ) -> Result<MrChecked, Status> {
        let slot = MrEntry::slot_of(key);
        if slot >= layout.params.mr_entries as usize {
            return Err(Status::BadKey);
        }
        let at = layout.mr_entry(slot);
        let words = [crate::sram_u32(hal, at), crate::sram_u32(hal, at + 4), crate::sram_u32(hal, at + SECRET_OFF)];
        let line = slot % ENTRY_LINES;
        let cached = |lines: &[Option<MrEntry>; ENTRY_LINES]| {
            lines[line].as_ref().is_some_and(|e| MrEntry::slot_of(e.key) == slot && header_words(e) == words)
        };
        if !cached(&self.entries.lines.borrow()) {
            let mut b = [0u8; MrEntry::SIZE];
            hal.sram_read(at, &mut b);
            let e = MrEntry::get(&b);
            match e.validate() {
                Ok(MrFormat::Invalid) | Err(_) => return Err(Status::BadKey),
                Ok(_) => {}
            }
            if header_words(&e) != words {
                // The trusted side is rewriting the entry: it is not in use.
                return Err(Status::BadKey);
            }
            self.entries.lines.borrow_mut()[line] = Some(e);
        }
        let lines = self.entries.lines.borrow();
        let e = lines[line].as_ref().expect("cached above");
        if e.key != key || e.port != port {
            return Err(Status::BadKey);
        }
        if e.access & access != access {
            return Err(Status::AccessDenied);
        }
        match off.checked_add(len) {
            Some(end) if end <= e.length => Ok(MrChecked { line, off, end }),
            _ => Err(Status::AccessDenied),
        }
    }

    /// Checks every SGE of a descriptor against the MR table.
    pub(crate) fn check_sges<H: Hal>(
        &self,
        hal: &mut H,
        layout: &Layout,
        port: u16,
        sges: &[Sge],
        access: u8,
    ) -> Result<(), Status> {
        for s in sges {
            self.checked(hal, layout, port, s.key, s.offset, s.len as u64, access)?;
        }
        Ok(())
    }

    /// Moves `buf.len()` bytes between `buf` and the message described by
    /// `sges`, starting at message offset `msg_off`. Bytes beyond the SGEs'
    /// total are an error.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sge_io<H: Hal>(
        &mut self,
        hal: &mut H,
        layout: &Layout,
        port: u16,
        sges: &[Sge],
        msg_off: u64,
        mut buf: Buf<'_>,
        access: u8,
    ) -> Result<(), Status> {
        let want_end = msg_off + buf.len() as u64;
        let mut pos = 0u64;
        for s in sges {
            let (s_start, s_end) = (pos, pos + s.len as u64);
            pos = s_end;
            let lo = s_start.max(msg_off);
            let hi = s_end.min(want_end);
            if lo >= hi {
                continue;
            }
            let chunk = buf.slice((lo - msg_off) as usize, (hi - msg_off) as usize);
            self.region_io(hal, layout, port, s.key, s.offset + (lo - s_start), chunk, access)?;
        }
        if pos < want_end {
            return Err(Status::AccessDenied);
        }
        Ok(())
    }

    /// Moves bytes between `buf` and region `key` at offset `off`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn region_io<H: Hal>(
        &mut self,
        hal: &mut H,
        layout: &Layout,
        port: u16,
        key: u32,
        off: u64,
        buf: Buf<'_>,
        access: u8,
    ) -> Result<(), Status> {
        if buf.len() == 0 {
            return Ok(());
        }
        let r = self.checked(hal, layout, port, key, off, buf.len() as u64, access)?;
        self.line_io(hal, r.line, off, buf)
    }

    /// [`MrCache::region_io`] in a region already checked for
    /// `[off, off + buf.len())` by [`MrCache::checked`], with no check again:
    /// what one event moves in pieces (a completion's body, then its
    /// phase byte) is checked once.
    pub(crate) fn checked_io<H: Hal>(
        &mut self,
        hal: &mut H,
        r: MrChecked,
        off: u64,
        buf: Buf<'_>,
    ) -> Result<(), Status> {
        debug_assert!(off >= r.off && off + buf.len() as u64 <= r.end, "inside the checked range");
        self.line_io(hal, r.line, off, buf)
    }

    /// Moves bytes between `buf` and the cached entry in `line` at `off`.
    fn line_io<H: Hal>(&mut self, hal: &mut H, line: usize, off: u64, mut buf: Buf<'_>) -> Result<(), Status> {
        // The entry is used in place: no copy of it per transfer.
        let lines = self.entries.lines.borrow();
        let e = lines[line].as_ref().expect("checked entries are cached");
        match MrFormat::from_u8(e.format) {
            Some(MrFormat::Short) | Some(MrFormat::Chained) => {
                let mut seg_start = 0u64;
                let mut done = 0usize;
                for seg in e.segs.iter().take_while(|s| s.len != 0) {
                    let seg_end = seg_start + seg.len as u64;
                    let cur = off + done as u64;
                    if cur < seg_end {
                        let n = ((seg_end - cur) as usize).min(buf.len() - done);
                        dma(hal, seg.addr + (cur - seg_start), buf.slice(done, done + n))?;
                        done += n;
                        if done == buf.len() {
                            return Ok(());
                        }
                    }
                    seg_start = seg_end;
                }
                Err(Status::AccessDenied)
            }
            Some(MrFormat::Indirect) => {
                let e = *e;
                drop(lines);
                self.indirect_io(hal, &e, off, buf)
            }
            _ => Err(Status::BadKey),
        }
    }

    fn indirect_io<H: Hal>(&mut self, hal: &mut H, e: &MrEntry, off: u64, buf: Buf<'_>) -> Result<(), Status> {
        let slot = MrEntry::slot_of(e.key);
        let mut d = match self.cursors.dirs[slot].take() {
            Some(d) if d.key == e.key => d,
            _ => build_directory(hal, e)?,
        };
        let r = directory_io(hal, &mut d, off, buf);
        self.cursors.dirs[slot] = Some(d);
        r
    }
}

impl Nic {
    /// [`MrCache::lookup`] through the program's MR cache.
    pub(crate) fn mr_lookup<H: Hal>(
        &self,
        hal: &mut H,
        port: u16,
        key: u32,
        off: u64,
        len: u64,
        access: u8,
    ) -> Result<MrEntry, Status> {
        self.mr.lookup(hal, &self.layout, port, key, off, len, access)
    }

    /// [`MrCache::check_sges`] through the program's MR cache.
    pub(crate) fn check_sges<H: Hal>(&self, hal: &mut H, port: u16, sges: &[Sge], access: u8) -> Result<(), Status> {
        self.mr.check_sges(hal, &self.layout, port, sges, access)
    }

    /// [`MrCache::sge_io`] through the program's MR cache.
    pub(crate) fn sge_io<H: Hal>(
        &mut self,
        hal: &mut H,
        port: u16,
        sges: &[Sge],
        msg_off: u64,
        buf: Buf<'_>,
        access: u8,
    ) -> Result<(), Status> {
        self.mr.sge_io(hal, &self.layout, port, sges, msg_off, buf, access)
    }

    /// [`MrCache::region_io`] through the program's MR cache.
    pub(crate) fn region_io<H: Hal>(
        &mut self,
        hal: &mut H,
        port: u16,
        key: u32,
        off: u64,
        buf: Buf<'_>,
        access: u8,
    ) -> Result<(), Status> {
        self.mr.region_io(hal, &self.layout, port, key, off, buf, access)
    }
}

/// Reads one page of segments: its data segments and its link, if any.
fn read_list_page<H: Hal>(hal: &mut H, addr: u64, out: &mut Vec<PhysSeg>) -> Result<Option<u64>, Status> {
    let mut page = [0u8; emp_uapi::PAGE_SIZE];
    dma(hal, addr, Buf::FromHost(&mut page))?;
    out.clear();
    for i in 0..SEGS_PER_PAGE {
        let seg = PhysSeg::get(&page[i * PhysSeg::SIZE..]);
        if seg.flags & SEG_LINK != 0 {
            return Ok(Some(seg.addr));
        }
        if seg.flags != 0 {
            return Err(Status::AccessDenied);
        }
        if seg.len == 0 {
            break; // End of the list.
        }
        out.push(seg);
    }
    Ok(None)
}

/// Walks a page list once; refuses lists that are longer than the entry
/// says, loop, or do not cover the region.
fn build_directory<H: Hal>(hal: &mut H, e: &MrEntry) -> Result<Directory, Status> {
    let mut d = Directory { key: e.key, ..Default::default() };
    let pages_max = e.indirect_count as usize / (SEGS_PER_PAGE - 1) + 2;
    let mut addr = Some(e.indirect_addr);
    let (mut segs, mut offset, mut count) = (Vec::new(), 0u64, 0u64);
    while let Some(a) = addr {
        if d.pages.len() >= pages_max {
            return Err(Status::AccessDenied);
        }
        let next = read_list_page(hal, a, &mut segs)?;
        d.pages.push((offset, a));
        count += segs.len() as u64;
        offset += segs.iter().map(|s| s.len as u64).sum::<u64>();
        if count > e.indirect_count as u64 {
            return Err(Status::AccessDenied);
        }
        addr = next;
        if count == e.indirect_count as u64 {
            break;
        }
    }
    if count != e.indirect_count as u64 || offset < e.length {
        return Err(Status::AccessDenied);
    }
    d.covered = offset;
    Ok(d)
}

/// Moves bytes at region offset `off` through a directory.
fn directory_io<H: Hal>(hal: &mut H, d: &mut Directory, off: u64, mut buf: Buf<'_>) -> Result<(), Status> {
    if off + buf.len() as u64 > d.covered {
        return Err(Status::AccessDenied);
    }
    let mut page = d.pages.partition_point(|&(start, _)| start <= off) - 1;
    if d.cache.is_empty() {
        d.cache = vec![CachedPage::default(); PAGE_CACHE];
    }
    let mut done = 0usize;
    while done < buf.len() {
        let (page_start, addr) = *d.pages.get(page).ok_or(Status::AccessDenied)?;
        let c = &mut d.cache[page % PAGE_CACHE];
        if c.addr != addr || c.segs.is_empty() {
            read_list_page(hal, addr, &mut c.segs)?;
            c.addr = addr;
            c.starts.clear();
            let mut at = page_start;
            for seg in &c.segs {
                c.starts.push(at);
                at += seg.len as u64;
            }
        }
        let cur = off + done as u64;
        let mut i = c.starts.partition_point(|&st| st <= cur).saturating_sub(1);
        while i < c.segs.len() && done < buf.len() {
            let (seg, seg_start) = (c.segs[i], c.starts[i]);
            let cur = off + done as u64;
            let seg_end = seg_start + seg.len as u64;
            if cur >= seg_start && cur < seg_end {
                let n = ((seg_end - cur) as usize).min(buf.len() - done);
                dma(hal, seg.addr + (cur - seg_start), buf.slice(done, done + n))?;
                done += n;
            }
            i += 1;
        }
        page += 1;
    }
    Ok(())
}

fn dma<H: Hal>(hal: &mut H, addr: u64, buf: Buf<'_>) -> Result<(), Status> {
    match buf {
        Buf::FromHost(b) => hal.dma_read(addr, b),
        Buf::ToHost(b) => hal.dma_write(addr, b),
        Buf::Gather(n, segs) => {
            segs.push(addr, n);
            Ok(())
        }
    }
    .map_err(|_| Status::DmaError)
}
