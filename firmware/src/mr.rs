//! Memory-region translation: (key, offset, length) → host bus addresses,
//! through the MR table the trusted side wrote in SRAM (short, chained or
//! indirect page lists, EMP thesis §2.3.2). The entry is re-read and
//! re-checked on every use, so an invalidated key stops working at once.

use emp_uapi::desc::{MrEntry, MrFormat, PhysSeg, Sge, Status, SEGS_PER_PAGE, SEG_LINK};
use emp_uapi::Le;

use crate::{Hal, Nic};

/// Where the last indirect walk of a slot stopped, so that sequential frame
/// transfers walk each page list once instead of once per frame.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    key: u32,
    /// Region offset where segment `seg_idx` starts.
    seg_start: u64,
    seg_idx: u32,
    /// Page of segments holding `seg_idx`, and its index there.
    page_addr: u64,
    idx_in_page: u32,
    /// Pages of segments walked so far (bounds link chains).
    pages: u32,
}

/// One cursor per MR slot.
#[derive(Debug)]
pub(crate) struct CursorCache {
    cur: Vec<Option<Cursor>>,
}

impl CursorCache {
    pub(crate) fn new(entries: u32) -> Self {
        CursorCache { cur: vec![None; entries as usize] }
    }

    /// Forgets the cursor of `slot` (its entry changed).
    pub(crate) fn invalidate(&mut self, slot: usize) {
        if let Some(c) = self.cur.get_mut(slot) {
            *c = None;
        }
    }
}

/// Transfer direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Host memory → NIC buffer.
    FromHost,
    /// NIC buffer → host memory.
    ToHost,
}

impl Nic {
    /// Reads and checks the MR entry `key` names for `port` with `access`,
    /// covering `[off, off + len)`.
    pub(crate) fn mr_lookup<H: Hal>(
        &self,
        hal: &mut H,
        port: u16,
        key: u32,
        off: u64,
        len: u64,
        access: u8,
    ) -> Result<MrEntry, Status> {
        let slot = MrEntry::slot_of(key);
        if slot >= self.layout.params.mr_entries as usize {
            return Err(Status::BadKey);
        }
        let mut b = [0u8; MrEntry::SIZE];
        hal.sram_read(self.layout.mr_entry(slot), &mut b);
        let e = MrEntry::get(&b);
        match e.validate() {
            Ok(MrFormat::Invalid) | Err(_) => return Err(Status::BadKey),
            Ok(_) => {}
        }
        if e.key != key || e.port != port {
            return Err(Status::BadKey);
        }
        if e.access & access != access {
            return Err(Status::AccessDenied);
        }
        match off.checked_add(len) {
            Some(end) if end <= e.length => Ok(e),
            _ => Err(Status::AccessDenied),
        }
    }

    /// Checks every SGE of a descriptor against the MR table.
    pub(crate) fn check_sges<H: Hal>(&self, hal: &mut H, port: u16, sges: &[Sge], access: u8) -> Result<(), Status> {
        for s in sges {
            self.mr_lookup(hal, port, s.key, s.offset, s.len as u64, access)?;
        }
        Ok(())
    }

    /// Moves `buf.len()` bytes between `buf` and the message described by
    /// `sges`, starting at message offset `msg_off`. Bytes beyond the SGEs'
    /// total are an error.
    pub(crate) fn sge_io<H: Hal>(
        &mut self,
        hal: &mut H,
        port: u16,
        sges: &[Sge],
        msg_off: u64,
        buf: &mut [u8],
        dir: Dir,
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
            let chunk = &mut buf[(lo - msg_off) as usize..(hi - msg_off) as usize];
            self.region_io(hal, port, s.key, s.offset + (lo - s_start), chunk, dir, access)?;
        }
        if pos < want_end {
            return Err(Status::AccessDenied);
        }
        Ok(())
    }

    /// Moves bytes between `buf` and region `key` at offset `off`.
    pub(crate) fn region_io<H: Hal>(
        &mut self,
        hal: &mut H,
        port: u16,
        key: u32,
        off: u64,
        buf: &mut [u8],
        dir: Dir,
        access: u8,
    ) -> Result<(), Status> {
        if buf.is_empty() {
            return Ok(());
        }
        let e = self.mr_lookup(hal, port, key, off, buf.len() as u64, access)?;
        match MrFormat::from_u8(e.format) {
            Some(MrFormat::Short) | Some(MrFormat::Chained) => {
                let mut seg_start = 0u64;
                let mut done = 0usize;
                for seg in e.segs.iter().take_while(|s| s.len != 0) {
                    let seg_end = seg_start + seg.len as u64;
                    let cur = off + done as u64;
                    if cur < seg_end {
                        let n = ((seg_end - cur) as usize).min(buf.len() - done);
                        dma(hal, seg.addr + (cur - seg_start), &mut buf[done..done + n], dir)?;
                        done += n;
                        if done == buf.len() {
                            return Ok(());
                        }
                    }
                    seg_start = seg_end;
                }
                Err(Status::AccessDenied)
            }
            Some(MrFormat::Indirect) => self.indirect_io(hal, &e, off, buf, dir),
            _ => Err(Status::BadKey),
        }
    }

    fn indirect_io<H: Hal>(&mut self, hal: &mut H, e: &MrEntry, off: u64, buf: &mut [u8], dir: Dir) -> Result<(), Status> {
        let slot = MrEntry::slot_of(e.key);
        let fresh = Cursor { key: e.key, seg_start: 0, seg_idx: 0, page_addr: e.indirect_addr, idx_in_page: 0, pages: 1 };
        let mut c = match self.mr_cursors.cur[slot] {
            Some(c) if c.key == e.key && c.seg_start <= off => c,
            _ => fresh,
        };
        // A page list may link at most this many pages: bounds hostile chains.
        let pages_max = e.indirect_count / (SEGS_PER_PAGE as u32 - 1) + 2;
        let mut done = 0usize;
        while done < buf.len() {
            if c.seg_idx >= e.indirect_count || c.idx_in_page as usize >= SEGS_PER_PAGE {
                return Err(Status::AccessDenied);
            }
            let mut sb = [0u8; PhysSeg::SIZE];
            dma(hal, c.page_addr + c.idx_in_page as u64 * PhysSeg::SIZE as u64, &mut sb, Dir::FromHost)?;
            let seg = PhysSeg::get(&sb);
            if seg.flags & SEG_LINK != 0 {
                c.pages += 1;
                if c.pages > pages_max {
                    return Err(Status::AccessDenied);
                }
                c.page_addr = seg.addr;
                c.idx_in_page = 0;
                continue;
            }
            if seg.flags != 0 || seg.len == 0 {
                return Err(Status::AccessDenied);
            }
            let seg_end = c.seg_start + seg.len as u64;
            let cur = off + done as u64;
            if cur < seg_end {
                let n = ((seg_end - cur) as usize).min(buf.len() - done);
                dma(hal, seg.addr + (cur - c.seg_start), &mut buf[done..done + n], dir)?;
                done += n;
                if done == buf.len() {
                    break;
                }
            }
            c.seg_start = seg_end;
            c.seg_idx += 1;
            c.idx_in_page += 1;
        }
        self.mr_cursors.cur[slot] = Some(c);
        Ok(())
    }
}

fn dma<H: Hal>(hal: &mut H, addr: u64, buf: &mut [u8], dir: Dir) -> Result<(), Status> {
    match dir {
        Dir::FromHost => hal.dma_read(addr, buf),
        Dir::ToHost => hal.dma_write(addr, buf),
    }
    .map_err(|_| Status::DmaError)
}
