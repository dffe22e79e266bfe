// SPDX-License-Identifier: GPL-2.0

//! Memory registration: pin the user pages (FOLL_LONGTERM | FOLL_WRITE),
//! charge them to RLIMIT_MEMLOCK the way VFIO does (`account_locked_vm`,
//! CAP_IPC_LOCK bypasses), and describe them to the NIC by physical
//! address: up to seven runs inline (EMP's chained format), otherwise pages
//! of (address, length) entries linked together (the indirect format).

use kernel::{bindings, page::Page, prelude::*};

use crate::desc::{MrEntry, MrFormat, PhysSeg, MR_INLINE_SEGS, SEGS_PER_PAGE, SEG_LINK};
use crate::{Le, PAGE_SIZE};

// The shim takes and returns kernel objects as opaque pointers.
extern "C" {
    #[link_name = "emp_page_to_phys"]
    fn page_to_phys_raw(page: *mut core::ffi::c_void) -> u64;
    #[link_name = "emp_current_mm_grab"]
    fn current_mm_grab_raw() -> *mut core::ffi::c_void;
    #[link_name = "emp_mmdrop"]
    fn mmdrop_raw(mm: *mut core::ffi::c_void);
}

/// # Safety
/// `page` is a page the caller holds (pinned or owned).
unsafe fn emp_page_to_phys(page: *mut bindings::page) -> u64 {
    // SAFETY: forwarded; the shim only computes the address.
    unsafe { page_to_phys_raw(page.cast()) }
}

/// # Safety
/// None beyond the call itself; the result carries an mm reference or is null.
unsafe fn emp_current_mm_grab() -> *mut bindings::mm_struct {
    // SAFETY: the shim reads current->mm and takes a reference.
    unsafe { current_mm_grab_raw().cast() }
}

/// # Safety
/// `mm` carries a reference taken by `emp_current_mm_grab`, given up here.
unsafe fn emp_mmdrop(mm: *mut bindings::mm_struct) {
    // SAFETY: forwarded.
    unsafe { mmdrop_raw(mm.cast()) }
}

/// Largest region one registration may pin.
pub(crate) const MR_LEN_MAX: u64 = 1 << 30;

/// Pages pinned for one registration.
///
/// # Invariants
/// `pages` holds `pages.len()` pinned pages charged to `mm`'s locked_vm;
/// `mm` holds a reference (mmgrab) until drop.
pub(crate) struct Pinned {
    pages: KVec<*mut bindings::page>,
    mm: *mut bindings::mm_struct,
    /// Indirect page lists (freed with the registration).
    lists: KVec<Page>,
}

// SAFETY: page and mm pointers are plain kernel objects this value holds a
// pin / reference on; they are not tied to the creating thread.
unsafe impl Send for Pinned {}

impl Pinned {
    /// Pins `[addr, addr + len)` of the calling process.
    ///
    /// # Errors
    /// `EINVAL` for an empty, huge or wrapping range, `ENOMEM` over
    /// RLIMIT_MEMLOCK or out of memory, `EFAULT` when the range is not
    /// fully mapped and writable.
    pub(crate) fn pin(addr: u64, len: u64) -> Result<Self> {
        let end = addr.checked_add(len).ok_or(EINVAL)?;
        if len == 0 || len > MR_LEN_MAX {
            return Err(EINVAL);
        }
        let first = addr & !(PAGE_SIZE as u64 - 1);
        // From the first to the last page touched; rounding `end` up instead
        // would overflow for a range ending in the address space's last page.
        let last = (end - 1) & !(PAGE_SIZE as u64 - 1);
        let n = ((last - first) / PAGE_SIZE as u64) as usize + 1;
        // Allocated before anything is charged: a failure here owes nothing.
        let mut pages: KVec<*mut bindings::page> = KVec::with_capacity(n, GFP_KERNEL)?;
        pages.resize(n, core::ptr::null_mut(), GFP_KERNEL)?;
        // SAFETY: no preconditions; returns current->mm with a reference, or null.
        let mm = unsafe { emp_current_mm_grab() };
        if mm.is_null() {
            return Err(EFAULT);
        }
        // SAFETY: `mm` is referenced; charging n pages may fail with -ENOMEM.
        let r = unsafe { bindings::account_locked_vm(mm, n as _, true) };
        if r != 0 {
            // SAFETY: drop the reference taken above.
            unsafe { emp_mmdrop(mm) };
            return Err(Error::from_errno(r));
        }
        // INVARIANT: from here on, `this` owns the charge and the mm reference;
        // its Drop undoes both for the pages it holds.
        let mut this = Pinned { pages: KVec::new(), mm, lists: KVec::new() };
        let mut done = 0usize;
        while done < n {
            let want = (n - done).min(1 << 16);
            let start = first + (done * PAGE_SIZE) as u64;
            // SAFETY: `pages[done..done+want]` is writable; pin_user_pages_fast
            // fills at most `want` entries and returns how many it pinned.
            let got = unsafe {
                bindings::pin_user_pages_fast(
                    start as _,
                    want as _,
                    (bindings::FOLL_WRITE | bindings::FOLL_LONGTERM) as _,
                    pages.as_mut_ptr().add(done),
                )
            };
            if got <= 0 {
                // Undo what was pinned: `this` only owns the first `done`.
                this.pages = pages;
                this.pages.truncate(done);
                this.uncharge_extra(n - done);
                // EOVERFLOW: the range runs into the end of the address
                // space, which is no user memory either.
                return Err(if got < 0 && got != -(bindings::EOVERFLOW as i32) {
                    Error::from_errno(got)
                } else {
                    EFAULT
                });
            }
            done += got as usize;
        }
        this.pages = pages;
        Ok(this)
    }

    /// Returns the charge for pages that were never pinned.
    fn uncharge_extra(&mut self, pages: usize) {
        if pages > 0 {
            // SAFETY: `mm` is referenced; these pages were charged in `pin`.
            unsafe { bindings::account_locked_vm(self.mm, pages as _, false) };
        }
    }

    /// Pages held.
    pub(crate) fn page_count(&self) -> usize {
        self.pages.len()
    }

    /// Physically contiguous runs covering `[addr, addr + len)`.
    fn runs(&self, addr: u64, len: u64) -> Result<KVec<PhysSeg>> {
        let mut out: KVec<PhysSeg> = KVec::new();
        let mut left = len;
        let mut in_page = (addr % PAGE_SIZE as u64) as u32;
        for &p in self.pages.iter() {
            // SAFETY: `p` is a page we hold pinned.
            let phys = unsafe { emp_page_to_phys(p) } + in_page as u64;
            let n = ((PAGE_SIZE as u32 - in_page) as u64).min(left) as u32;
            in_page = 0;
            left -= n as u64;
            match out.last_mut() {
                Some(s) if s.addr + s.len as u64 == phys && s.len.checked_add(n).is_some() => s.len += n,
                _ => out.push(PhysSeg { addr: phys, len: n, flags: 0 }, GFP_KERNEL)?,
            }
            if left == 0 {
                break;
            }
        }
        Ok(out)
    }

    /// The MR table entry describing this region to the NIC.
    pub(crate) fn entry(&mut self, addr: u64, len: u64, key: u32, port: u16, access: u8) -> Result<MrEntry> {
        let runs = self.runs(addr, len)?;
        describe(&runs, &mut self.lists, MrEntry { key, port, access, length: len, ..Default::default() })
    }
}

/// Fills `e`'s translation from physically contiguous `runs`: inline when
/// they fit, else pages of (address, length) entries allocated into
/// `lists` (freed with their owner), the last slot of a full page linking on.
fn describe(runs: &[PhysSeg], lists: &mut KVec<Page>, mut e: MrEntry) -> Result<MrEntry> {
    if runs.len() <= MR_INLINE_SEGS {
        e.format = MrFormat::Chained as u8;
        for (i, s) in runs.iter().enumerate() {
            e.segs[i] = *s;
        }
        return Ok(e);
    }
    let per_page = SEGS_PER_PAGE - 1;
    let npages = runs.len().div_ceil(per_page);
    let first = lists.len();
    for _ in 0..npages {
        lists.push(Page::alloc_page(GFP_KERNEL | __GFP_ZERO)?, GFP_KERNEL)?;
    }
    let lists = &lists[first..];
    for (pi, chunk) in runs.chunks(per_page).enumerate() {
        let mut b = [0u8; PhysSeg::SIZE];
        for (i, s) in chunk.iter().enumerate() {
            s.put(&mut b);
            // SAFETY: writing 16 bytes inside a 4 KiB page we own.
            unsafe { lists[pi].write_raw(b.as_ptr(), i * PhysSeg::SIZE, PhysSeg::SIZE)? };
        }
        if pi + 1 < npages {
            // SAFETY: the next list page is ours.
            let next = unsafe { emp_page_to_phys(lists[pi + 1].as_ptr()) };
            PhysSeg { addr: next, len: 0, flags: SEG_LINK }.put(&mut b);
            // SAFETY: as above, the last slot of the page.
            unsafe { lists[pi].write_raw(b.as_ptr(), per_page * PhysSeg::SIZE, PhysSeg::SIZE)? };
        }
    }
    e.format = MrFormat::Indirect as u8;
    // SAFETY: the first list page is ours.
    e.indirect_addr = unsafe { emp_page_to_phys(lists[0].as_ptr()) };
    e.indirect_count = runs.len() as u32;
    Ok(e)
}

/// Driver memory a context image is saved into for the gang scheduler
/// (the process is stopped and cannot give any): zeroed pages of its own,
/// never mapped to user space, freed on drop.
pub(crate) struct ImagePages {
    pages: KVec<Page>,
    lists: KVec<Page>,
}

impl ImagePages {
    /// `len` bytes (rounded up to pages).
    ///
    /// # Errors
    /// `ENOMEM`.
    pub(crate) fn alloc(len: usize) -> Result<Self> {
        let n = len.div_ceil(PAGE_SIZE);
        let mut pages = KVec::with_capacity(n, GFP_KERNEL)?;
        for _ in 0..n {
            pages.push(Page::alloc_page(GFP_KERNEL | __GFP_ZERO)?, GFP_KERNEL)?;
        }
        Ok(ImagePages { pages, lists: KVec::new() })
    }

    /// Bytes held.
    pub(crate) fn len(&self) -> usize {
        self.pages.len() * PAGE_SIZE
    }

    /// The MR table entry describing these pages to the NIC.
    pub(crate) fn entry(&mut self, key: u32, port: u16, access: u8) -> Result<MrEntry> {
        let mut runs: KVec<PhysSeg> = KVec::new();
        for p in self.pages.iter() {
            // SAFETY: a page we own.
            let phys = unsafe { emp_page_to_phys(p.as_ptr()) };
            match runs.last_mut() {
                Some(s) if s.addr + s.len as u64 == phys => s.len += PAGE_SIZE as u32,
                _ => runs.push(PhysSeg { addr: phys, len: PAGE_SIZE as u32, flags: 0 }, GFP_KERNEL)?,
            }
        }
        let e = MrEntry { key, port, access, length: self.len() as u64, ..Default::default() };
        describe(&runs, &mut self.lists, e)
    }

    /// The little-endian word at byte `off` (4-byte aligned, inside).
    pub(crate) fn read_u32(&self, off: usize) -> Result<u32> {
        let page = self.pages.get(off / PAGE_SIZE).ok_or(EINVAL)?;
        let mut b = [0u8; 4];
        // SAFETY: 4 bytes inside a page we own into a local buffer; an
        // aligned word never crosses the page.
        unsafe { page.read_raw(b.as_mut_ptr(), off % PAGE_SIZE, 4)? };
        Ok(u32::from_le_bytes(b))
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let n = self.pages.len();
        if n > 0 {
            // SAFETY: these pages were pinned by `pin` and are unpinned once.
            unsafe { bindings::unpin_user_pages_dirty_lock(self.pages.as_mut_ptr(), n as _, true) };
        }
        // SAFETY: `mm` is still referenced; return the charge and the reference.
        unsafe {
            bindings::account_locked_vm(self.mm, n as _, false);
            emp_mmdrop(self.mm);
        }
    }
}
