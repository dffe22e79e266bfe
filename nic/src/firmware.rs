//! The firmware loader and the loaded control program: [`boot_staged`]
//! verifies the image a driver staged in SRAM, `dlopen`s it and boots it;
//! [`Firmware`] wraps the running program's C ABI and gives it its
//! hardware (`hw.rs`'s HAL trampolines reach SRAM, DMA, the MAC and the
//! interrupt eventfds). The engine drives a `Firmware` and moves frames.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use emp_uapi::fwabi::FwConfig;
use emp_uapi::sram::{FailReason, NicStatus, FEATURE_RX_DOUBLE_BUFFERING};

use crate::cpus::{Core, Cpus};
use crate::dmaq::WriteBehind;
use crate::fwlib::FwLib;
use crate::hw::{hal_for, HwCtx, Outgoing};
use crate::image::{verify, TrustedKeys};
use crate::nic::NicShared;

/// Received frames' buffers a NIC keeps for later transmits: 1024 frames
/// (about 1.5 MB at MTU 1500) cover the engine's 256-frame receive batch on
/// a few NICs, and a burst cannot pin memory for good.
const FRAME_POOL_MAX: usize = 1024;

/// A running control program: its state and CPUs (`cpus.rs`), and CPU A's
/// hardware context, which the engine's thread drives.
pub struct Firmware {
    core: Arc<Core>,
    hw: Box<HwCtx>,
    /// Threads of the CPUs past A (none when multiplexed): dropping it
    /// joins them; the state is freed with the last `Arc<Core>`.
    _cpus: Cpus,
}

impl Firmware {
    /// Boots the control program on a NIC; `None` if it refused to boot.
    pub fn boot(lib: Arc<FwLib>, shared: Arc<NicShared>, cfg: FwConfig) -> Option<Firmware> {
        let mut hw = Box::new(HwCtx::new(shared.clone()));
        let hal = hal_for(&mut hw);
        // SAFETY: `hal` and `cfg` are valid for the call; `boot` follows the
        // firmware ABI.
        let state = unsafe { (lib.boot)(&hal, &cfg) };
        if state.is_null() {
            return None;
        }
        let core = Arc::new(Core::new(lib, shared.clone(), state));
        if shared.header().features & FEATURE_RX_DOUBLE_BUFFERING != 0 {
            match WriteBehind::start(shared.clone()) {
                // Every CPU of the NIC queues to this one DMA thread.
                Ok(w) => {
                    let w = Arc::new(Mutex::new(w));
                    hw.set_write_behind(w.clone());
                    core.set_write_behind(w);
                }
                // The NIC still works, writing in place.
                Err(e) => tracing::error!(node = shared.node, "receive double buffering off: no DMA thread: {e}"),
            }
        }
        let cpus = match Cpus::start(&core) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(node = shared.node, "NIC CPU thread: {e}");
                shared.set_status(NicStatus::Failed, FailReason::FirmwareCrashed);
                return None;
            }
        };
        if core.threaded() {
            tracing::info!(node = shared.node, "NIC CPUs on threads of their own");
        }
        Some(Firmware { core, hw, _cpus: cpus })
    }

    pub(crate) fn doorbell(&mut self, now: u64) {
        self.core.doorbell(0, &mut self.hw, now);
        self.core.collect(&mut self.hw);
    }

    /// Hands the control program the first `max` of `rx`'s received frames
    /// (taking them out), in one call: one lock and one look at its timers
    /// for the batch, not for each frame. Where the plan classifies frames
    /// on another CPU, they go to that CPU's thread, also at once.
    pub(crate) fn frames(&mut self, now: u64, rx: &mut VecDeque<Vec<u8>>, max: usize) {
        let mut n = rx.len().min(max);
        if n == 0 {
            return;
        }
        if self.core.frames_elsewhere() {
            // The plan classifies frames on another CPU: hand them over;
            // what its full area drops is only kept as buffers.
            n -= self.core.hand_frames(now, rx, n);
        } else {
            self.core.frames(0, &mut self.hw, now, &rx.make_contiguous()[..n]);
            self.core.collect(&mut self.hw);
        }
        // The buffers are kept for later transmits, up to a bound.
        let keep = FRAME_POOL_MAX.saturating_sub(self.hw.pool.len()).min(n);
        self.hw.pool.extend(rx.drain(..keep));
        rx.drain(..n - keep);
    }

    /// Takes the frames and filter changes another CPU handed the engine
    /// (no call into the program); false when none waited.
    pub(crate) fn take_handed(&mut self) -> bool {
        self.core.take_handed(&mut self.hw)
    }

    /// Another CPU handed the engine frames or filter changes.
    pub(crate) fn handed(&self) -> bool {
        self.core.handed()
    }

    pub(crate) fn timeout(&mut self, now: u64) {
        self.core.timeout(&mut self.hw, now);
        self.core.collect(&mut self.hw);
    }

    /// When the control program next wants [`Firmware::timeout`] called
    /// (0: another CPU handed the engine work).
    pub(crate) fn deadline(&self) -> u64 {
        self.core.deadline()
    }

    /// Multicast filter changes asked for since the last call.
    pub(crate) fn take_memberships(&mut self) -> std::vec::Drain<'_, (u16, bool)> {
        self.hw.memberships.drain(..)
    }

    /// The frames the control program transmitted since the last call.
    pub(crate) fn take_outbox(&mut self) -> std::vec::Drain<'_, Outgoing> {
        self.hw.outbox.drain(..)
    }

    /// Swaps the program's spare frame buffers with `pool`: the engine
    /// shares one pool between the NICs of a chassis.
    pub(crate) fn swap_frame_pool(&mut self, pool: &mut Vec<Vec<u8>>) {
        core::mem::swap(&mut self.hw.pool, pool);
    }

    /// The control program's description of its tables.
    pub fn describe(&self) -> String {
        self.core.describe()
    }
}

/// The NIC's loader: verifies the image in its staging area against the
/// trusted keys and starts it. A refused image leaves the NIC FAILED with
/// the reason in SRAM (and in the log).
pub fn boot_staged(shared: &Arc<NicShared>, trusted: &TrustedKeys, fw_cfg: FwConfig) -> Option<Firmware> {
    let len = shared.header().staged_len as usize;
    if len > shared.layout.params.staging_size as usize {
        shared.set_status(NicStatus::Failed, FailReason::BadImageHeader);
        tracing::error!(node = shared.node, "staged image length {len} exceeds the staging area");
        return None;
    }
    let mut staged = vec![0u8; len];
    shared.sram.read(shared.layout.staging_off as usize, &mut staged);
    let payload = match verify(&staged, trusted) {
        Ok((_, payload)) => payload.to_vec(),
        Err(reason) => {
            shared.set_status(NicStatus::Failed, reason);
            tracing::error!(node = shared.node, "firmware refused: {}", reason.as_str());
            return None;
        }
    };
    let lib = match FwLib::load(&payload) {
        Ok(l) => Arc::new(l),
        Err(e) => {
            shared.set_status(NicStatus::Failed, FailReason::LoadFailed);
            tracing::error!(node = shared.node, "firmware load failed: {e}");
            return None;
        }
    };
    let fw = Firmware::boot(lib, shared.clone(), fw_cfg);
    match shared.status() {
        (NicStatus::Running, _) if fw.is_some() => {
            tracing::info!(node = shared.node, "firmware running");
            fw
        }
        (_, reason) => {
            tracing::error!(node = shared.node, "firmware boot failed: {}", reason.as_str());
            None
        }
    }
}
