//! The hardware a control program reaches (`emp_uapi::fwabi::FwHal`): the
//! trampolines below give it SRAM, DMA, the MAC and the interrupt eventfds
//! through one [`HwCtx`] per NIC CPU.

use core::ffi::c_void;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use emp_uapi::fwabi::FwHal;

use crate::nic::NicShared;
use crate::sys::signal;

/// What the control program's hardware calls reach: one per NIC CPU (the
/// part of the hardware a CPU owns alone, `cpus.rs`).
pub(crate) struct HwCtx {
    shared: Arc<NicShared>,
    pub(crate) outbox: Vec<(u16, Vec<u8>)>,
    /// Frame buffers for reuse (bounded): no allocation per frame.
    pub(crate) pool: Vec<Vec<u8>>,
    /// Multicast filter changes the control program asked for, for the
    /// engine to apply to the wire (bounded: [`MEMBERSHIP_QUEUE_MAX`]).
    pub(crate) memberships: Vec<(u16, bool)>,
}

impl HwCtx {
    pub(crate) fn new(shared: Arc<NicShared>) -> HwCtx {
        HwCtx { shared, outbox: Vec::new(), pool: Vec::new(), memberships: Vec::new() }
    }
}

/// Most filter changes queued between two engine passes; beyond, the
/// change is refused (logged) and the control program filters alone.
const MEMBERSHIP_QUEUE_MAX: usize = 1024;

extern "C" fn hw_mcast_membership(ctx: *mut c_void, addr: u16, join: u8) {
    // SAFETY: `ctx` is the engine's HwCtx, exclusively lent for this call.
    let hw = unsafe { &mut *ctx.cast::<HwCtx>() };
    if hw.memberships.len() >= MEMBERSHIP_QUEUE_MAX {
        tracing::warn!(node = hw.shared.node, addr, "multicast filter queue full: change dropped");
        return;
    }
    hw.memberships.push((addr, join != 0));
}

extern "C" fn hw_sram_read(ctx: *mut c_void, off: usize, buf: *mut u8, len: usize) {
    // SAFETY: `ctx` is the HwCtx the engine passed for this call and `buf`
    // is the control program's live buffer of `len` bytes.
    let (hw, buf) = unsafe { (&*ctx.cast::<HwCtx>(), core::slice::from_raw_parts_mut(buf, len)) };
    hw.shared.sram.read(off, buf);
}

extern "C" fn hw_sram_write(ctx: *mut c_void, off: usize, data: *const u8, len: usize) {
    // SAFETY: as in `hw_sram_read`.
    let (hw, data) = unsafe { (&*ctx.cast::<HwCtx>(), core::slice::from_raw_parts(data, len)) };
    hw.shared.sram.write(off, data);
}

extern "C" fn hw_dma_read(ctx: *mut c_void, addr: u64, buf: *mut u8, len: usize) -> i32 {
    // SAFETY: as in `hw_sram_read`.
    let (hw, buf) = unsafe { (&*ctx.cast::<HwCtx>(), core::slice::from_raw_parts_mut(buf, len)) };
    match hw.shared.dma.lock().expect("dma").read(addr, buf) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}

extern "C" fn hw_dma_write(ctx: *mut c_void, addr: u64, data: *const u8, len: usize) -> i32 {
    // SAFETY: as in `hw_sram_read`.
    let (hw, data) = unsafe { (&*ctx.cast::<HwCtx>(), core::slice::from_raw_parts(data, len)) };
    match hw.shared.dma.lock().expect("dma").write(addr, data) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}

extern "C" fn hw_mac_transmit(ctx: *mut c_void, dst: u16, frame: *const u8, len: usize) {
    // SAFETY: `ctx` is the engine's HwCtx, exclusively lent for this call;
    // `frame` is valid for `len` bytes.
    let (hw, frame) = unsafe { (&mut *ctx.cast::<HwCtx>(), core::slice::from_raw_parts(frame, len)) };
    let mut b = hw.pool.pop().unwrap_or_default();
    b.clear();
    b.extend_from_slice(frame);
    hw.outbox.push((dst, b));
}

extern "C" fn hw_raise_interrupt(ctx: *mut c_void, vector: u16) {
    // SAFETY: as in `hw_sram_read`.
    let hw = unsafe { &*ctx.cast::<HwCtx>() };
    if vector == 0 {
        return; // Admin: control threads poll the mailbox.
    }
    {
        let ports = hw.shared.ports.lock().expect("ports");
        if let Some(Some(p)) = ports.get(vector as usize - 1) {
            // Under the lock: `release_port` cannot close the eventfd meanwhile.
            signal(p.event.as_raw_fd());
            return;
        }
    } // `ports` released: it is never held while taking `guest_irq` (see `NicShared`).
    if let Some(irq) = &*hw.shared.guest_irq.lock().expect("guest_irq") {
        // A guest's port: one MSI-X vector; the guest's driver finds the
        // port(s) whose armed event the control program consumed.
        signal(irq.as_raw_fd());
    }
}

extern "C" fn hw_dma_fence(_ctx: *mut c_void) {
    // DMA writes are stores into memory the host maps: a release fence
    // keeps every earlier one ahead of every later one (the CQE phase byte).
    core::sync::atomic::fence(core::sync::atomic::Ordering::Release);
}

pub(crate) fn hal_for(hw: &mut HwCtx) -> FwHal {
    FwHal {
        ctx: (hw as *mut HwCtx).cast(),
        sram_read: hw_sram_read,
        sram_write: hw_sram_write,
        dma_read: hw_dma_read,
        dma_write: hw_dma_write,
        mac_transmit: hw_mac_transmit,
        raise_interrupt: hw_raise_interrupt,
        dma_fence: hw_dma_fence,
        mcast_membership: hw_mcast_membership,
    }
}
