//! A simulated host: physical memory, registered regions whose pages are
//! scattered over it, and the host side of the NIC interface (admin
//! mailbox, rings, completion queue) written exactly as the driver and the
//! verbs library write them.

use emp_uapi::desc::{
    Cqe, MrEntry, MrFormat, Opcode, PhysSeg, Sge, WorkDesc, MR_INLINE_SEGS, PERSIST_SLOTS, SEGS_PER_PAGE, SEG_LINK,
    WD_PERSIST,
};
use emp_uapi::sram::{ctl, AdminMailbox, AdminOp, Layout, PortCtl, RouteEntry};
use emp_uapi::{ring, Le, PAGE_SIZE};

use crate::rng::Rng;
use crate::weak_dma::PendingWrites;

/// Bus address of physical byte 0 (non-zero so a zero address is a bug).
pub const PHYS_BASE: u64 = 0x1_0000_0000;

/// Host physical memory: sized once (zero pages are mapped lazily by the
/// OS, so untouched memory costs nothing), then handed out page by page.
#[derive(Debug, Default)]
pub struct HostMem {
    /// Bytes; physical address = `PHYS_BASE + index`.
    pub bytes: Vec<u8>,
    used: usize,
    /// Bytes the NIC has read by DMA (multisend reads its payload once).
    pub dma_read_bytes: u64,
    /// Frames the NIC sent with their payload read straight from here as
    /// they went out (Immediate Sending).
    pub frames_sent_from_host: u64,
    /// The NIC's writes not yet visible to the host (weakly ordered DMA);
    /// `None`: every write is visible at once.
    pending: Option<PendingWrites>,
}

impl HostMem {
    /// Memory of `bytes` (rounded up to pages).
    pub fn new(bytes: usize) -> HostMem {
        HostMem {
            bytes: vec![0; bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE],
            used: 0,
            dma_read_bytes: 0,
            frames_sent_from_host: 0,
            pending: None,
        }
    }

    /// From now on the NIC's writes appear late, in random byte order,
    /// ordered only by fences ([`PendingWrites`]); the order comes from `seed`.
    pub fn weak_dma(&mut self, seed: u64) {
        self.pending = Some(PendingWrites::new(seed));
    }

    /// The NIC writes `data` at bus address `addr` (a DMA).
    pub fn nic_write(&mut self, addr: u64, data: &[u8]) -> Option<()> {
        let r = self.range(addr, data.len())?;
        match &mut self.pending {
            Some(p) => p.write(r.start, data),
            None => self.bytes[r].copy_from_slice(data),
        }
        Some(())
    }

    /// The NIC reads `buf.len()` bytes at bus address `addr`: it sees its
    /// own writes, visible to the host or not.
    /// Whether a DMA of `len` bytes at `addr` would land in memory.
    pub fn nic_check(&self, addr: u64, len: usize) -> Option<()> {
        self.range(addr, len).map(|_| ())
    }

    pub fn nic_read(&mut self, addr: u64, buf: &mut [u8]) -> Option<()> {
        let r = self.range(addr, buf.len())?;
        buf.copy_from_slice(&self.bytes[r.clone()]);
        if let Some(p) = &self.pending {
            p.overlay(r.start, buf);
        }
        self.dma_read_bytes += buf.len() as u64;
        Some(())
    }

    /// A DMA fence: the NIC's writes so far appear before any later one.
    pub fn nic_fence(&mut self) {
        if let Some(p) = &mut self.pending {
            p.fence();
        }
    }

    /// True when some NIC write is not yet visible to the host.
    pub fn has_pending(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| !p.is_empty())
    }

    /// Makes a random part of the oldest pending writes visible; returns the
    /// delay (ns) after which to reveal more, or `None` when all are visible.
    pub fn reveal_some(&mut self) -> Option<u64> {
        let p = self.pending.as_mut()?;
        p.reveal_some(&mut self.bytes);
        (!p.is_empty()).then(|| p.next_delay_ns())
    }

    /// True when a NIC write to `[addr, addr + len)` is not yet visible.
    pub fn nic_hides(&self, addr: u64, len: usize) -> bool {
        let (Some(p), Some(r)) = (&self.pending, self.range(addr, len)) else { return false };
        p.hides(r.start, r.len())
    }

    /// Allocates `pages` fresh physical pages (zeroed) and returns their addresses.
    ///
    /// # Panics
    /// When the memory is exhausted (the scenario sized it too small).
    pub fn alloc_pages(&mut self, pages: usize) -> Vec<u64> {
        let first = self.used;
        self.used += pages * PAGE_SIZE;
        assert!(self.used <= self.bytes.len(), "host memory exhausted: size it with HostMem::new");
        (0..pages).map(|i| PHYS_BASE + (first + i * PAGE_SIZE) as u64).collect()
    }

    /// Pages needed to register a region of `len` bytes in any format
    /// (data pages plus the longest possible page list).
    pub fn pages_for_region(len: u64) -> usize {
        let data = (len as usize).div_ceil(PAGE_SIZE).max(1);
        data + data.div_ceil(SEGS_PER_PAGE - 1) + 1
    }

    /// Resolves a bus address range to an index range.
    pub fn range(&self, addr: u64, len: usize) -> Option<core::ops::Range<usize>> {
        let start = addr.checked_sub(PHYS_BASE)? as usize;
        let end = start.checked_add(len)?;
        (end <= self.bytes.len()).then_some(start..end)
    }
}

/// A registered region: virtually contiguous, physically scattered pages.
#[derive(Clone, Debug)]
pub struct Region {
    /// Key the NIC knows it by.
    pub key: u32,
    /// Remote-access secret registered with the key.
    pub secret: u32,
    /// Bytes.
    pub len: u64,
    /// Physical page of each virtual page.
    pub pages: Vec<u64>,
}

impl Region {
    /// Copies `data` into the region at `off` (through the host's page table).
    pub fn write(&self, mem: &mut HostMem, off: u64, data: &[u8]) {
        self.walk(off, data.len(), |pa, at, n| {
            let r = mem.range(pa, n).expect("region page");
            mem.bytes[r].copy_from_slice(&data[at..at + n]);
        });
    }

    /// Reads `out.len()` bytes at `off`.
    pub fn read(&self, mem: &HostMem, off: u64, out: &mut [u8]) {
        let len = out.len();
        self.walk(off, len, |pa, at, n| {
            let r = mem.range(pa, n).expect("region page");
            out[at..at + n].copy_from_slice(&mem.bytes[r]);
        });
    }

    fn walk(&self, off: u64, len: usize, mut f: impl FnMut(u64, usize, usize)) {
        assert!(off + len as u64 <= self.len, "access beyond region");
        let mut done = 0;
        while done < len {
            let v = off as usize + done;
            let (page, in_page) = (v / PAGE_SIZE, v % PAGE_SIZE);
            let n = (PAGE_SIZE - in_page).min(len - done);
            f(self.pages[page] + in_page as u64, done, n);
            done += n;
        }
    }

    /// Physically contiguous runs of the region, as (addr, len).
    fn runs(&self) -> Vec<(u64, u32)> {
        let mut runs: Vec<(u64, u32)> = Vec::new();
        let mut left = self.len;
        for &pa in &self.pages {
            let n = left.min(PAGE_SIZE as u64) as u32;
            left -= n as u64;
            match runs.last_mut() {
                Some((a, l)) if *a + *l as u64 == pa && (*l as u64 + n as u64) < u32::MAX as u64 => *l += n,
                _ => runs.push((pa, n)),
            }
            if left == 0 {
                break;
            }
        }
        runs
    }
}

/// Builds the MR table entry for `region` in the format the region
/// allows, choosing randomly among the valid ones so every format is
/// exercised; indirect page lists are written into host memory.
pub fn mr_entry(region: &Region, port: u16, access: u8, mem: &mut HostMem, rng: &mut Rng) -> MrEntry {
    let runs = region.runs();
    let mut e =
        MrEntry { key: region.key, port, access, length: region.len, secret: region.secret, ..Default::default() };
    let page_segs: Vec<(u64, u32)> = {
        // Page-granular segments (EMP's layout) or merged runs.
        let mut v = Vec::new();
        let mut left = region.len;
        for &pa in &region.pages {
            let n = left.min(PAGE_SIZE as u64) as u32;
            if n == 0 {
                break;
            }
            v.push((pa, n));
            left -= n as u64;
        }
        v
    };
    if region.len <= PAGE_SIZE as u64 && region.len > 0 && rng.chance(0.5) {
        e.format = MrFormat::Short as u8;
        e.segs[0] = PhysSeg { addr: region.pages[0], len: region.len as u32, flags: 0 };
        return e;
    }
    let segs = if rng.chance(0.5) { runs } else { page_segs };
    if segs.len() <= MR_INLINE_SEGS && rng.chance(0.7) {
        e.format = MrFormat::Chained as u8;
        for (i, &(a, l)) in segs.iter().enumerate() {
            e.segs[i] = PhysSeg { addr: a, len: l, flags: 0 };
        }
        return e;
    }
    // Indirect: pages of segments, the last slot of a full page links on.
    let per_page = SEGS_PER_PAGE - 1;
    let pages = segs.len().div_ceil(per_page).max(1);
    let list = mem.alloc_pages(pages);
    for (pi, &page) in list.iter().enumerate() {
        let chunk = &segs[pi * per_page..((pi + 1) * per_page).min(segs.len())];
        let mut b = vec![0u8; PAGE_SIZE];
        for (i, &(a, l)) in chunk.iter().enumerate() {
            PhysSeg { addr: a, len: l, flags: 0 }.put(&mut b[i * PhysSeg::SIZE..]);
        }
        if pi + 1 < pages {
            PhysSeg { addr: list[pi + 1], len: 0, flags: SEG_LINK }.put(&mut b[per_page * PhysSeg::SIZE..]);
        }
        let r = mem.range(page, PAGE_SIZE).expect("list page");
        mem.bytes[r].copy_from_slice(&b);
    }
    e.format = MrFormat::Indirect as u8;
    e.indirect_addr = list[0];
    e.indirect_count = segs.len() as u32;
    e
}

/// Allocates a region of `len` bytes whose pages are shuffled over fresh
/// physical memory (some adjacent pairs kept, so runs vary).
pub fn alloc_region(mem: &mut HostMem, len: u64, key: u32, rng: &mut Rng) -> Region {
    let n = (len as usize).div_ceil(PAGE_SIZE).max(1);
    let mut pages = mem.alloc_pages(n);
    if rng.chance(0.6) {
        for i in (1..n).rev() {
            if rng.chance(0.5) {
                let j = rng.below(i as u64 + 1) as usize;
                pages.swap(i, j);
            }
        }
    }
    let secret = (rng.next_u64() as u32).max(1);
    Region { key, secret, len, pages }
}

/// SRAM accessors used by the host side.
pub struct Sram<'a>(pub &'a mut [u8]);

impl Sram<'_> {
    /// Reads a u32.
    pub fn u32(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.0[off..off + 4].try_into().expect("4 bytes"))
    }
    /// Writes a u32.
    pub fn put_u32(&mut self, off: usize, v: u32) {
        self.0[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    /// Writes an encodable value.
    pub fn put<T: Le>(&mut self, off: usize, v: &T) {
        v.put(&mut self.0[off..off + T::SIZE]);
    }
    /// Reads a decodable value.
    pub fn get<T: Le>(&self, off: usize) -> T {
        T::get(&self.0[off..off + T::SIZE])
    }
}

/// Writes route entries so that every node id below `nodes` is reachable.
pub fn write_routes(sram: &mut [u8], layout: &Layout, nodes: u16) {
    let mut s = Sram(sram);
    for n in 0..nodes {
        s.put(layout.route_entry(n as usize), &RouteEntry { valid: 1, udp_port: 7000 + n, ..Default::default() });
    }
}

/// Posts an admin command (the caller then rings the doorbell and checks
/// [`admin_result`] after the NIC ran).
pub fn admin_post(sram: &mut [u8], layout: &Layout, op: AdminOp, args: [u64; 6]) {
    let mut s = Sram(sram);
    let off = layout.admin_off as usize;
    let mut mb: AdminMailbox = s.get(off);
    mb.op = op as u32;
    mb.args = args;
    mb.request_seq = mb.request_seq.wrapping_add(1);
    s.put(off, &mb);
}

/// Result of the last admin command, once done.
pub fn admin_result(sram: &mut [u8], layout: &Layout) -> Option<u32> {
    let mb: AdminMailbox = Sram(sram).get(layout.admin_off as usize);
    (mb.done_seq == mb.request_seq).then_some(mb.result)
}

/// Zeroes a port's control page before opening it (trusted side).
pub fn reset_port_ctl(sram: &mut [u8], layout: &Layout, port: u16) {
    let base = layout.port(port).base;
    Sram(sram).put(base, &PortCtl::default());
}

/// The host side of one open port: ring producer indices, CQ consumer.
#[derive(Debug)]
pub struct HostPort {
    /// Port number.
    pub port: u16,
    /// Data region (send and receive buffers).
    pub data: Region,
    /// CQ region.
    pub cq: Region,
    /// CQ entries.
    pub cq_entries: u32,
    /// Next CQ index to read.
    pub cq_head: u32,
    /// Send ring producer.
    pub send_prod: u32,
    /// Receive ring producer.
    pub recv_prod: u32,
    /// The next persistent slot of each ring ([`HostPort::post_persistent`]).
    pub persist_send: u8,
    pub persist_recv: u8,
}

impl HostPort {
    /// A port the NIC just opened: rings and CQ empty, nothing stored.
    pub fn new(port: u16, data: Region, cq: Region, cq_entries: u32) -> HostPort {
        HostPort {
            port,
            data,
            cq,
            cq_entries,
            cq_head: 0,
            send_prod: 0,
            recv_prod: 0,
            persist_send: 0,
            persist_recv: 0,
        }
    }

    /// Posts `d` as a persistent descriptor: stored (`WD_PERSIST`) into the
    /// ring's next slot of [`PERSIST_SLOTS`] (round robin: a slot is stored
    /// again only after the start that ran it, which the ring orders), then
    /// started with `d`'s `wr_id`; both or neither (false: no room for two).
    pub fn post_persistent(&mut self, sram: &mut [u8], layout: &Layout, mut d: WorkDesc, send: bool) -> bool {
        let w = layout.port(self.port);
        let (prod, cons_off, entries) = if send {
            (self.send_prod, ctl::SEND_CONS, w.send_entries)
        } else {
            (self.recv_prod, ctl::RECV_CONS, w.recv_entries)
        };
        let cons = Sram(sram).u32(w.ctl(cons_off));
        if !ring::has_room(prod.wrapping_add(1), cons, entries) {
            return false;
        }
        let next = if send { &mut self.persist_send } else { &mut self.persist_recv };
        let slot = *next;
        *next = (slot + 1) % PERSIST_SLOTS as u8;
        let start = WorkDesc { wr_id: d.wr_id, opcode: Opcode::Start as u8, tag: slot as u64, ..Default::default() };
        d.wr_id = 0;
        d.flags |= WD_PERSIST;
        d.slot = slot;
        self.post(sram, layout, &d, send) && self.post(sram, layout, &start, send)
    }

    /// Writes a descriptor into the send (or receive) ring if it has room.
    pub fn post(&mut self, sram: &mut [u8], layout: &Layout, d: &WorkDesc, send: bool) -> bool {
        let w = layout.port(self.port);
        let mut s = Sram(sram);
        let (prod, cons_off, entries) = if send {
            (self.send_prod, ctl::SEND_CONS, w.send_entries)
        } else {
            (self.recv_prod, ctl::RECV_CONS, w.recv_entries)
        };
        let cons = s.u32(w.ctl(cons_off));
        if !ring::has_room(prod, cons, entries) {
            return false;
        }
        let slot = if send { w.send_slot(prod) } else { w.recv_slot(prod) };
        s.put(slot, d);
        if send {
            self.send_prod = prod.wrapping_add(1);
            s.put_u32(w.ctl(ctl::SEND_PROD), self.send_prod);
        } else {
            self.recv_prod = prod.wrapping_add(1);
            s.put_u32(w.ctl(ctl::RECV_PROD), self.recv_prod);
        }
        true
    }

    /// Takes the next completion, if the NIC wrote one.
    pub fn poll_cq(&mut self, sram: &mut [u8], layout: &Layout, mem: &HostMem) -> Option<Cqe> {
        let at = ring::slot(self.cq_head, self.cq_entries) as u64 * Cqe::SIZE as u64;
        let mut b = [0u8; Cqe::SIZE];
        self.cq.read(mem, at, &mut b);
        let cqe = Cqe::get(&b);
        if !ring::cqe_is_new(cqe.flags, self.cq_head, self.cq_entries) {
            return None;
        }
        // The host accepts the entry on its phase byte alone: every other
        // byte it just read must be the NIC's final write, or the NIC
        // published a torn entry.
        let mut torn = false;
        self.cq.walk(at, Cqe::SIZE, |pa, _, n| torn |= mem.nic_hides(pa, n));
        assert!(
            !torn,
            "torn CQE: port {} index {} accepted on its phase byte while the NIC's write of it was not all \
             visible (read {cqe:?})",
            self.port, self.cq_head
        );
        self.cq_head = self.cq_head.wrapping_add(1);
        Sram(sram).put_u32(layout.port(self.port).ctl(ctl::CQ_CONS), self.cq_head);
        Some(cqe)
    }
}

/// A send or receive descriptor for one buffer, split into `pieces` SGEs.
pub fn work_desc(
    opcode: u8,
    wr_id: u64,
    node: u16,
    port: u16,
    tag: u64,
    ignore: u64,
    key: u32,
    off: u64,
    len: u64,
    pieces: usize,
) -> WorkDesc {
    let mut d =
        WorkDesc { wr_id, opcode, flags: emp_uapi::desc::WD_SIGNALED, node, port, tag, ignore, ..Default::default() };
    let pieces = pieces.clamp(1, emp_uapi::desc::SGE_MAX).min(len.max(1) as usize);
    let mut at = 0u64;
    for i in 0..pieces {
        let n = if i + 1 == pieces { len - at } else { len / pieces as u64 };
        d.sge[i] = Sge { key, len: n as u32, offset: off + at };
        at += n;
    }
    d.num_sge = pieces as u8;
    d
}
