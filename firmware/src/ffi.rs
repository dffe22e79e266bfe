//! The loadable entry points (see `emp_uapi::fwabi`): the NIC `dlopen`s the
//! image payload and drives the control program through these. Panics never
//! cross the boundary: a panicking call marks the NIC FAILED.

use core::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use emp_uapi::fwabi::{self, FwConfig, FwHal, DMA_WINDOW_SHIFT};
use emp_uapi::image::FIRMWARE_ABI;
use emp_uapi::sram::FailReason;

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;

use crate::{fail, Area, Config, DmaError, Hal, HostSeg, Nic, SideRun};

/// Adapts the C function table to [`Hal`].
struct CHal(FwHal);

impl CHal {
    /// SRAM `[off, off + len)` in place, when the NIC mapped it for the call.
    fn sram_at(&self, off: usize, len: usize) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        if self.0.sram_base.is_null() || end > self.0.sram_len {
            return None;
        }
        // SAFETY: `off` is inside the mapping, which is `sram_len` bytes
        // from `sram_base` for the call (`FwHal::sram_base`).
        Some(unsafe { self.0.sram_base.add(off) })
    }

    /// Host memory at bus address `[addr, addr + len)` in place, when the
    /// NIC mapped its window for the call (`FwHal::dma_windows`).
    fn dma_at(&self, addr: u64, len: usize) -> Option<*mut u8> {
        if self.0.dma_windows.is_null() {
            return None;
        }
        let tag = addr >> DMA_WINDOW_SHIFT;
        let i = (tag & 0xFFFF) as usize;
        if i >= self.0.dma_windows_len {
            return None;
        }
        // SAFETY: `i` is below `dma_windows_len`, the table's length for
        // the call.
        let w = unsafe { &*self.0.dma_windows.add(i) };
        let off = addr & ((1 << DMA_WINDOW_SHIFT) - 1);
        if w.tag != tag || w.base.is_null() || off.checked_add(len as u64)? > w.len {
            return None;
        }
        // SAFETY: `off + len` is within the window's `len` mapped bytes at
        // `base`, valid for the call (`FwHal::dma_windows`).
        Some(unsafe { w.base.add(off as usize) })
    }
}

impl Hal for CHal {
    fn sram_read(&mut self, off: usize, buf: &mut [u8]) {
        let Some(at) = self.sram_at(off, buf.len()) else {
            // Not mapped, or out of range: the NIC's call answers (zeros).
            return (self.0.sram_read)(self.0.ctx, off, buf.as_mut_ptr(), buf.len());
        };
        if buf.len() == 4 && off.is_multiple_of(4) {
            // SAFETY: in the mapping and 4-byte aligned (the mapping is
            // page aligned); SRAM is shared with the host, which atomics
            // are for, and `AtomicU32` has `u32`'s layout.
            let w = unsafe { &*at.cast::<AtomicU32>() };
            buf.copy_from_slice(&w.load(Ordering::Acquire).to_ne_bytes());
            return;
        }
        // SAFETY: `len` bytes in the mapping; the host may change them
        // meanwhile, which a byte copy tolerates (as the NIC's own does).
        unsafe { core::ptr::copy_nonoverlapping(at, buf.as_mut_ptr(), buf.len()) };
        fence(Ordering::Acquire);
    }
    fn sram_write(&mut self, off: usize, data: &[u8]) {
        let Some(at) = self.sram_at(off, data.len()) else {
            return (self.0.sram_write)(self.0.ctx, off, data.as_ptr(), data.len());
        };
        if let (Ok(word), true) = (<[u8; 4]>::try_from(data), off.is_multiple_of(4)) {
            // SAFETY: as in `sram_read`.
            let w = unsafe { &*at.cast::<AtomicU32>() };
            w.store(u32::from_ne_bytes(word), Ordering::Release);
            return;
        }
        fence(Ordering::Release);
        // SAFETY: `len` bytes in the mapping, which nothing of ours aliases.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
    }
    fn dma_read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        if let Some(at) = self.dma_at(addr, buf.len()) {
            // SAFETY: `len` bytes of the window; the host may change them
            // meanwhile, which a byte copy tolerates (as the NIC's own does).
            unsafe { core::ptr::copy_nonoverlapping(at, buf.as_mut_ptr(), buf.len()) };
            return Ok(());
        }
        match (self.0.dma_read)(self.0.ctx, addr, buf.as_mut_ptr(), buf.len()) {
            0 => Ok(()),
            _ => Err(DmaError),
        }
    }
    fn dma_write(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        if let Some(at) = self.dma_at(addr, data.len()) {
            // SAFETY: `len` bytes of the window, which nothing of ours
            // aliases.
            unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
            return Ok(());
        }
        match (self.0.dma_write)(self.0.ctx, addr, data.as_ptr(), data.len()) {
            0 => Ok(()),
            _ => Err(DmaError),
        }
    }
    fn mac_transmit(&mut self, dst_node: u16, frame: &[u8]) {
        (self.0.mac_transmit)(self.0.ctx, dst_node, frame.as_ptr(), frame.len());
    }
    fn mac_transmit_host(&mut self, dst_node: u16, header: &[u8], payload: &[HostSeg]) -> Result<(), DmaError> {
        match (self.0.mac_transmit_host)(
            self.0.ctx,
            dst_node,
            header.as_ptr(),
            header.len(),
            payload.as_ptr(),
            payload.len(),
        ) {
            0 => Ok(()),
            _ => Err(DmaError),
        }
    }
    fn mcast_membership(&mut self, addr: u16, join: bool) {
        (self.0.mcast_membership)(self.0.ctx, addr, join as u8);
    }
    fn raise_interrupt(&mut self, vector: u16) {
        (self.0.raise_interrupt)(self.0.ctx, vector);
    }
    fn dma_fence(&mut self) {
        if self.0.dma_windows.is_null() {
            return (self.0.dma_fence)(self.0.ctx);
        }
        // Writes in place are stores into memory the host maps, as the
        // NIC's own are: a release fence orders them (`FwHal::dma_fence`).
        fence(Ordering::Release);
    }
}

fn config_from(c: &FwConfig) -> Config {
    let d = Config::default();
    let or = |v: u32, dv: u32| if v == 0 { dv } else { v };
    let or64 = |v: u64, dv: u64| if v == 0 { dv } else { v };
    Config {
        group_size: or(c.group_size, d.group_size),
        window_frames: or(c.window_frames, d.window_frames),
        rto_ns: or64(c.rto_ns, d.rto_ns),
        rto_ns_max: or64(c.rto_ns_max, d.rto_ns_max),
        retry_limit: or(c.retry_limit, d.retry_limit),
        overflow_slots: c.overflow_slots,
        tx_max: or(c.tx_max, d.tx_max),
        recv_posted_max: or(c.recv_posted_max, d.recv_posted_max),
        gen_seed: c.gen_seed as u16,
        cpu_plan: c.cpu_plan,
        ..d
    }
}

/// Runs `f`; on panic marks the NIC FAILED (firmware crashed).
fn guarded<R>(hal: &FwHal, dflt: R, f: impl FnOnce(&mut CHal) -> R) -> R {
    let mut h = CHal(*hal);
    match catch_unwind(AssertUnwindSafe(|| f(&mut h))) {
        Ok(r) => r,
        Err(_) => {
            fail(&mut CHal(*hal), FailReason::FirmwareCrashed);
            dflt
        }
    }
}

/// The ABI this control program implements.
#[no_mangle]
pub extern "C" fn emp_fw_abi() -> u32 {
    FIRMWARE_ABI
}

/// Boots the control program.
///
/// # Safety
/// `hal` and `cfg` point to valid values for the duration of the call.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_boot(hal: *const FwHal, cfg: *const FwConfig) -> *mut c_void {
    // SAFETY: the caller guarantees both pointers are valid.
    let (hal, cfg) = unsafe { (&*hal, &*cfg) };
    let nic = guarded(hal, None, |h| Nic::boot(h, config_from(cfg)).ok());
    match nic {
        Some(n) => Box::into_raw(Box::new(n)).cast(),
        None => core::ptr::null_mut(),
    }
}

/// # Safety
/// `nic` came from `emp_fw_boot` and is not used concurrently; `hal` is valid.
unsafe fn with_nic(nic: *mut c_void, hal: *const FwHal, f: impl FnOnce(&mut Nic, &mut CHal)) {
    // SAFETY: guaranteed by the caller (see above).
    let (nic, hal) = unsafe { (&mut *nic.cast::<Nic>(), &*hal) };
    guarded(hal, (), |h| f(nic, h));
}

/// The host rang a doorbell.
///
/// # Safety
/// `nic` came from `emp_fw_boot`; `hal` is valid; calls are not concurrent.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_doorbell(nic: *mut c_void, hal: *const FwHal, now: u64) {
    // SAFETY: forwarded caller guarantees.
    unsafe { with_nic(nic, hal, |n, h| n.handle_doorbell(h, now)) }
}

/// Frames arrived: `n` of them, `frames[i]` of `lens[i]` bytes, in order.
///
/// # Safety
/// As `emp_fw_doorbell`; `frames` and `lens` hold `n` entries each, and
/// `frames[i]` points to `lens[i]` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_frames(
    nic: *mut c_void,
    hal: *const FwHal,
    now: u64,
    frames: *const *const u8,
    lens: *const usize,
    n: usize,
) {
    // With none, what a batch leaves to do still runs: what the receive
    // side, having taken every frame alone, stopped for
    // (`emp_fw_recv_side_frames`).
    // SAFETY: forwarded caller guarantees.
    let bytes = unsafe { frame_slices(frames, lens, n) };
    // SAFETY: forwarded caller guarantees.
    unsafe { with_nic(nic, hal, |nic, h| nic.handle_frames(h, now, bytes)) }
}

/// The `n` frames of a frames call, as byte slices.
///
/// # Safety
/// Unless `n` is 0, `frames` and `lens` hold `n` entries each, and
/// `frames[i]` points to `lens[i]` readable bytes, valid for `'a`.
unsafe fn frame_slices<'a>(frames: *const *const u8, lens: *const usize, n: usize) -> impl Iterator<Item = &'a [u8]> {
    let (frames, lens) = if n == 0 {
        (&[][..], &[][..])
    } else {
        // SAFETY: the caller guarantees `n` entries in each array.
        unsafe { (core::slice::from_raw_parts(frames, n), core::slice::from_raw_parts(lens, n)) }
    };
    // SAFETY: the caller guarantees each frame is valid for its length.
    frames.iter().zip(lens).map(|(&f, &len)| unsafe { core::slice::from_raw_parts(f, len) })
}

/// Timers may be due.
///
/// # Safety
/// As `emp_fw_doorbell`.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_timeout(nic: *mut c_void, hal: *const FwHal, now: u64) {
    // SAFETY: forwarded caller guarantees.
    unsafe { with_nic(nic, hal, |n, h| n.handle_timeout(h, now)) }
}

/// Next deadline, `u64::MAX` when none.
///
/// # Safety
/// `nic` came from `emp_fw_boot`.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_poll_timeout(nic: *mut c_void) -> u64 {
    // SAFETY: the caller guarantees `nic` is live.
    let nic = unsafe { &*nic.cast::<Nic>() };
    nic.poll_timeout().unwrap_or(u64::MAX)
}

/// Describes the NIC's tables into `buf`; returns the bytes written.
///
/// # Safety
/// `nic` came from `emp_fw_boot`; `buf` is writable for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_describe(nic: *mut c_void, buf: *mut u8, cap: usize) -> usize {
    // SAFETY: the caller guarantees `nic` is live and `buf` writable.
    let (nic, out) = unsafe { (&*nic.cast::<Nic>(), core::slice::from_raw_parts_mut(buf, cap)) };
    let (alone, whole) = nic.data_frames();
    let (recvs, recvs_whole) = nic.recv_descs();
    let (sent, built, acks_first) = nic.send_frames();
    let (descs, descs_whole) = nic.send_descs();
    let [(doorbells, doorbells_whole), (batches, batches_whole)] = nic.entries();
    let (recv_doorbells, recv_batches, send_doorbells) = nic.side_entries();
    let queue_runs = nic.side_queue_runs();
    let text = format!(
        "{:?}\n{}{}  receive side: DATA frames alone {alone}, with the whole program {whole}; \
         receives taken alone {recvs}, by the whole program {recvs_whole}\n  \
         send side: frames sent alone {sent}, built by the whole program {built}, after a held ACK {acks_first}; \
         descriptors taken alone {descs}, needing the whole program {descs_whole}\n  \
         entries: doorbells alone {doorbells}, doorbells with the program {doorbells_whole}; \
         frame batches alone {batches}, frame batches with the program {batches_whole}\n  \
         sides alone: receive-side rings and timers {recv_doorbells}, receive-side batches {recv_batches}, \
         send-side doorbells {send_doorbells}, send-side queue runs {queue_runs}\n",
        nic.occupancy(),
        nic.describe_peers(),
        nic.describe_mcast()
    );
    let n = text.len().min(cap);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    n
}

/// NIC CPUs the control program uses.
///
/// # Safety
/// `nic` came from `emp_fw_boot`.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_cpus(nic: *mut c_void) -> u32 {
    // SAFETY: the caller guarantees `nic` is live.
    unsafe { &*nic.cast::<Nic>() }.cpus() as u32
}

/// Runs the steps queued for NIC CPU `cpu`; returns how many ran.
///
/// # Safety
/// As `emp_fw_doorbell`.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_cpu(nic: *mut c_void, hal: *const FwHal, now: u64, cpu: u32) -> u32 {
    let mut ran = 0;
    // SAFETY: forwarded caller guarantees.
    unsafe { with_nic(nic, hal, |n, h| ran = n.handle_cpu(h, now, cpu as usize) as u32) };
    ran
}

/// Steps waiting in NIC CPU `cpu`'s queue (a NIC running its CPUs on
/// threads asks after each call which of them to wake).
///
/// # Safety
/// `nic` came from `emp_fw_boot`; calls are not concurrent.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_cpu_pending(nic: *mut c_void, cpu: u32) -> u32 {
    // SAFETY: the caller guarantees `nic` is live.
    unsafe { &*nic.cast::<Nic>() }.cpu_pending(cpu as usize) as u32
}

/// The NIC CPU whose thread takes received frames (`emp_fw_frames`).
///
/// # Safety
/// `nic` came from `emp_fw_boot`.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_frame_cpu(nic: *mut c_void) -> u32 {
    // SAFETY: the caller guarantees `nic` is live.
    unsafe { &*nic.cast::<Nic>() }.frame_cpu() as u32
}

/// A reference to the common area of the NIC's CPUs, for a CPU that runs
/// its jobs without the program (`emp_fw_cpu_jobs`); released by
/// `emp_fw_cpu_area_free`, and valid until then even after `emp_fw_free`.
///
/// # Safety
/// `nic` came from `emp_fw_boot`; calls on it are not concurrent.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_cpu_area(nic: *mut c_void) -> *const c_void {
    // SAFETY: the caller guarantees `nic` is live and not in use.
    Arc::into_raw(unsafe { &mut *nic.cast::<Nic>() }.cpu_area()).cast()
}

/// Releases a reference from `emp_fw_cpu_area`.
///
/// # Safety
/// `area` came from `emp_fw_cpu_area` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_cpu_area_free(area: *const c_void) {
    if !area.is_null() {
        // SAFETY: `area` was made by `Arc::into_raw` in `emp_fw_cpu_area`.
        drop(unsafe { Arc::from_raw(area.cast::<Area>()) });
    }
}

/// Runs NIC CPU `cpu`'s jobs with `hal`, that CPU's hardware, without the
/// program (concurrent calls into the program are allowed; concurrent
/// calls for the same CPU wait for one another); returns how many ran.
///
/// # Safety
/// `area` came from `emp_fw_cpu_area` and is live; `hal` is valid.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_cpu_jobs(area: *const c_void, hal: *const FwHal, cpu: u32) -> u32 {
    // SAFETY: the caller guarantees both pointers are valid.
    let (area, hal) = unsafe { (&*area.cast::<Area>(), &*hal) };
    guarded(hal, 0, |h| area.run_jobs(h, cpu as usize) as u32)
}

/// Nonzero when NIC CPU `cpu` has steps that need the program.
///
/// # Safety
/// `area` came from `emp_fw_cpu_area` and is live.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_cpu_wants_program(area: *const c_void, cpu: u32) -> u32 {
    // SAFETY: the caller guarantees `area` is live.
    u32::from(unsafe { &*area.cast::<Area>() }.wants_program(cpu as usize))
}

/// Received frames, on the receive side alone ([`Nic::recv_side_frames`]):
/// `n` of them as for `emp_fw_frames`; writes to `taken` how many it took
/// and returns `SIDE_WHOLE` (the whole program takes the rest) and the CPUs
/// to wake (`emp_uapi::fwabi::SYM_RECV_SIDE_FRAMES`).
///
/// # Safety
/// As `emp_fw_frames`, except that the caller holds only the receive side:
/// no other call reaches it, nor runs a whole-program entry point, until
/// this returns (the send side's entry points may); `taken` is writable.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_recv_side_frames(
    nic: *mut c_void,
    hal: *const FwHal,
    now: u64,
    frames: *const *const u8,
    lens: *const usize,
    n: usize,
    taken: *mut usize,
) -> u32 {
    // SAFETY: the caller's guarantees are `frame_slices`'.
    let bytes = unsafe { frame_slices(frames, lens, n) };
    // SAFETY: the caller guarantees `hal` is valid.
    let hal = unsafe { &*hal };
    // SAFETY: the caller holds the receive side (the contract above).
    let run = guarded(hal, SideRun::default(), |h| unsafe { Nic::recv_side_frames(nic.cast(), h, now, bytes) });
    // SAFETY: the caller guarantees `taken` is writable.
    unsafe { taken.write(run.taken) };
    side_result(run)
}

/// A doorbell's receive-side part, alone ([`Nic::recv_side_doorbell`]).
///
/// # Safety
/// As `emp_fw_recv_side_frames`.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_recv_side_doorbell(nic: *mut c_void, hal: *const FwHal, now: u64) -> u32 {
    // SAFETY: the caller guarantees `hal` is valid.
    let hal = unsafe { &*hal };
    // SAFETY: the caller holds the receive side.
    side_result(guarded(hal, SideRun::default(), |h| unsafe { Nic::recv_side_doorbell(nic.cast(), h, now) }))
}

/// A doorbell's send-side part, alone ([`Nic::send_side_doorbell`]).
///
/// # Safety
/// As `emp_fw_recv_side_frames`, with the send side held instead.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_send_side_doorbell(nic: *mut c_void, hal: *const FwHal, now: u64) -> u32 {
    // SAFETY: the caller guarantees `hal` is valid.
    let hal = unsafe { &*hal };
    // SAFETY: the caller holds the send side.
    side_result(guarded(hal, SideRun::default(), |h| unsafe { Nic::send_side_doorbell(nic.cast(), h, now) }))
}

/// One NIC CPU's queue on the send side alone ([`Nic::send_side_cpu`]).
///
/// # Safety
/// As `emp_fw_send_side_doorbell`.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_send_side_cpu(nic: *mut c_void, hal: *const FwHal, now: u64, cpu: u32) -> u32 {
    // SAFETY: the caller guarantees `hal` is valid.
    let hal = unsafe { &*hal };
    let cpu = cpu.min(1) as u8;
    // SAFETY: the caller holds the send side.
    side_result(guarded(hal, SideRun::default(), |h| unsafe { Nic::send_side_cpu(nic.cast(), h, now, cpu) }))
}

fn side_result(run: SideRun) -> u32 {
    (u32::from(run.whole) * fwabi::SIDE_WHOLE) | (run.wake << fwabi::SIDE_WAKE_SHIFT)
}

/// The next timer deadline as published ([`Nic::published_deadline`]),
/// `u64::MAX` when none; holding no lock.
///
/// # Safety
/// `nic` came from `emp_fw_boot` and is live.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_deadline(nic: *mut c_void) -> u64 {
    // SAFETY: the caller guarantees `nic` is live.
    unsafe { Nic::published_deadline(nic.cast()) }.unwrap_or(u64::MAX)
}

/// Frees the control program.
///
/// # Safety
/// `nic` came from `emp_fw_boot` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn emp_fw_free(nic: *mut c_void) {
    if !nic.is_null() {
        // SAFETY: `nic` was made by `Box::into_raw` in `emp_fw_boot`.
        drop(unsafe { Box::from_raw(nic.cast::<Nic>()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emp_uapi::fwabi::DmaWindow;
    use std::sync::atomic::AtomicUsize;

    /// SRAM accesses that went through the NIC's calls.
    static CALLS: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn sram_read(_: *mut c_void, _: usize, buf: *mut u8, len: usize) {
        CALLS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `buf` is the caller's buffer of `len` bytes.
        unsafe { core::slice::from_raw_parts_mut(buf, len) }.fill(0xEE);
    }
    extern "C" fn sram_write(_: *mut c_void, _: usize, _: *const u8, _: usize) {
        CALLS.fetch_add(1, Ordering::Relaxed);
    }
    static DMA_CALLS: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn dma(_: *mut c_void, _: u64, _: *mut u8, _: usize) -> i32 {
        DMA_CALLS.fetch_add(1, Ordering::Relaxed);
        -1
    }
    extern "C" fn dma_w(_: *mut c_void, _: u64, _: *const u8, _: usize) -> i32 {
        DMA_CALLS.fetch_add(1, Ordering::Relaxed);
        -1
    }
    extern "C" fn mac(_: *mut c_void, _: u16, _: *const u8, _: usize) {}
    extern "C" fn irq(_: *mut c_void, _: u16) {}
    extern "C" fn fence_(_: *mut c_void) {}
    extern "C" fn mcast(_: *mut c_void, _: u16, _: u8) {}
    extern "C" fn mac_host(_: *mut c_void, _: u16, _: *const u8, _: usize, _: *const HostSeg, _: usize) -> i32 {
        -1
    }

    fn hal(sram: &mut [u32]) -> CHal {
        CHal(FwHal {
            ctx: core::ptr::null_mut(),
            sram_read,
            sram_write,
            dma_read: dma,
            dma_write: dma_w,
            mac_transmit: mac,
            raise_interrupt: irq,
            dma_fence: fence_,
            mcast_membership: mcast,
            mac_transmit_host: mac_host,
            sram_base: sram.as_mut_ptr().cast(),
            sram_len: sram.len() * 4,
            dma_windows: core::ptr::null(),
            dma_windows_len: 0,
        })
    }

    #[test]
    fn mapped_sram_is_used_in_place_and_the_rest_goes_through_the_nic() {
        let mut sram = [0u32; 16];
        let mut h = hal(&mut sram);
        CALLS.store(0, Ordering::Relaxed);
        h.sram_write(8, &7u32.to_ne_bytes());
        h.sram_write(13, &[1, 2, 3]);
        let (mut w, mut b) = ([0u8; 4], [0u8; 3]);
        h.sram_read(8, &mut w);
        h.sram_read(13, &mut b);
        assert_eq!((u32::from_ne_bytes(w), b), (7, [1, 2, 3]));
        assert_eq!(CALLS.load(Ordering::Relaxed), 0, "in place");
        // Past the mapping, or across its end: the NIC answers.
        h.sram_read(64, &mut w);
        h.sram_read(62, &mut w);
        assert_eq!(w, [0xEE; 4]);
        h.sram_write(64, &[1]);
        assert_eq!(CALLS.load(Ordering::Relaxed), 3);
        let bytes: Vec<u8> = sram.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!((&bytes[8..12], &bytes[13..16]), (&7u32.to_ne_bytes()[..], &[1, 2, 3][..]));
        // Not mapped: every access calls.
        let mut h = hal(&mut []);
        h.0.sram_base = core::ptr::null_mut();
        h.sram_read(0, &mut w);
        assert_eq!(CALLS.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn mapped_host_memory_is_used_in_place_and_the_rest_goes_through_the_nic() {
        let mut host = [0u8; 64];
        let tag = (1u64 << 16) | 2; // space 1, window 2
        let windows = [
            DmaWindow { tag: u64::MAX, base: core::ptr::null_mut(), len: 0 },
            DmaWindow { tag: u64::MAX, base: core::ptr::null_mut(), len: 0 },
            DmaWindow { tag, base: host.as_mut_ptr(), len: 48 },
        ];
        let mut h = hal(&mut []);
        h.0.dma_windows = windows.as_ptr();
        h.0.dma_windows_len = windows.len();
        let at = |off: u64| (tag << DMA_WINDOW_SHIFT) | off;
        DMA_CALLS.store(0, Ordering::Relaxed);
        assert_eq!(h.dma_write(at(40), &[9; 8]), Ok(()));
        let mut b = [0u8; 8];
        assert_eq!(h.dma_read(at(40), &mut b), Ok(()));
        assert_eq!(b, [9; 8]);
        h.dma_fence();
        assert_eq!(DMA_CALLS.load(Ordering::Relaxed), 0, "in place");
        // Past the window's end, another space's tag, an unused or a
        // missing window: the NIC answers (here, a fault).
        assert_eq!(h.dma_write(at(41), &[1; 8]), Err(DmaError));
        assert_eq!(h.dma_read((((2 << 16) | 2) << DMA_WINDOW_SHIFT) | 40, &mut b), Err(DmaError));
        assert_eq!(h.dma_read(((1 << 16) << DMA_WINDOW_SHIFT) | 40, &mut b), Err(DmaError));
        assert_eq!(h.dma_read(((1 << 16 | 7) << DMA_WINDOW_SHIFT) | 40, &mut b), Err(DmaError));
        assert_eq!(DMA_CALLS.load(Ordering::Relaxed), 4);
        assert_eq!((&host[40..48], host[48]), (&[9u8; 8][..], 0), "nothing past the window");
        // Not mapped: every DMA calls.
        h.0.dma_windows = core::ptr::null();
        assert_eq!(h.dma_read(at(40), &mut b), Err(DmaError));
        assert_eq!(DMA_CALLS.load(Ordering::Relaxed), 5);
    }
}
