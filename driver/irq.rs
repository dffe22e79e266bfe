// SPDX-License-Identifier: GPL-2.0

//! Signal-on-packet: the NIC raises its MSI-X vector when the control
//! program consumes a port's armed event (it clears the port's ARM word
//! and interrupts); the threaded handler signals the eventfd of every
//! port the driver armed whose ARM word the NIC cleared.
//!
//! The vector is set up by the C shim: the 7.3 PCI IRQ abstraction ties a
//! handler to a borrowed vector registration, which driver data that also
//! owns the registration cannot hold without self-reference.

use core::ffi::c_void;

use kernel::{bindings, prelude::*, sync::Arc};

use crate::port::NicInfo;

extern "C" {
    fn emp_irq_setup(
        dev: *mut c_void,
        cookie: *mut c_void,
        thread: unsafe extern "C" fn(i32, *mut c_void) -> bindings::irqreturn_t,
    ) -> i32;
    fn emp_irq_teardown(dev: *mut c_void, irq: i32, cookie: *mut c_void);
}

/// The NIC's interrupt, requested for the device's lifetime; freed
/// (waiting for a running handler) on drop.
pub(crate) struct Irq {
    /// The bound function's `struct device` (opaque to us).
    dev: *mut c_void,
    irq: i32,
    info: Arc<NicInfo>,
}

// SAFETY: `dev` is only passed back to the kernel in `drop`, which may run
// on any thread; the device outlives its binding and so this value.
unsafe impl Send for Irq {}
// SAFETY: no method takes `&self`.
unsafe impl Sync for Irq {}

impl Irq {
    /// Requests the NIC's vector; `Err` when the function has no MSI-X
    /// (e.g. `ivshmem-plain`): the driver then runs without events.
    pub(crate) fn request(dev: &kernel::device::Device, info: Arc<NicInfo>) -> Result<Irq> {
        // `device::Device` is a transparent wrapper of `struct device`.
        let raw = core::ptr::from_ref(dev).cast_mut().cast::<c_void>();
        let cookie = Arc::as_ptr(&info).cast_mut().cast::<c_void>();
        // SAFETY: `raw` is the bound PCI function's device; `cookie` points
        // to the `NicInfo` this value keeps alive until `free_irq` in drop.
        let irq = unsafe { emp_irq_setup(raw, cookie, handler) };
        if irq < 0 {
            return Err(Error::from_errno(irq));
        }
        info.set_events_available(true);
        Ok(Irq { dev: raw, irq, info })
    }
}

impl Drop for Irq {
    fn drop(&mut self) {
        self.info.set_events_available(false);
        let cookie = Arc::as_ptr(&self.info).cast_mut().cast::<c_void>();
        // SAFETY: the vector and handler requested in `request` with this
        // cookie; after this no handler runs.
        unsafe { emp_irq_teardown(self.dev, self.irq, cookie) };
    }
}

/// Threaded handler (process context: it takes the NIC state mutex).
unsafe extern "C" fn handler(_irq: i32, cookie: *mut c_void) -> bindings::irqreturn_t {
    // SAFETY: `cookie` is the `NicInfo` kept alive by the `Irq` that
    // requested this handler, until after `free_irq`.
    let info = unsafe { &*cookie.cast::<NicInfo>() };
    info.deliver_events();
    bindings::irqreturn_t(bindings::irqreturn::IRQ_HANDLED.0)
}
