//! The hardware a control program reaches (`emp_uapi::fwabi::FwHal`): the
//! trampolines below give it SRAM, DMA, the MAC and the interrupt eventfds
//! through one [`HwCtx`] per NIC CPU.

use core::ffi::c_void;
use std::sync::{Arc, Mutex};

use emp_uapi::fwabi::{DmaWindow, FwHal, HostSeg};
use emp_uapi::sram::AdminMailbox;

use crate::dma::{DmaFault, DmaMap, HostPayload, HOST_PIECES_MAX};
use crate::dmaq::WriteBehind;
use crate::nic::NicShared;

/// A frame the control program transmitted, for the engine's wire: built
/// whole in `frame`, or (Immediate Sending) its headers in `frame` and its
/// payload still in host memory, in `host`, for the wire to send in place.
pub(crate) struct Outgoing {
    pub(crate) dst: u16,
    pub(crate) frame: Vec<u8>,
    pub(crate) host: HostPayload,
}

/// What the control program's hardware calls reach: one per NIC CPU (the
/// part of the hardware a CPU owns alone, `cpus.rs`).
pub(crate) struct HwCtx {
    shared: Arc<NicShared>,
    pub(crate) outbox: Vec<Outgoing>,
    /// Frame buffers for reuse (bounded): no allocation per frame.
    pub(crate) pool: Vec<Vec<u8>>,
    /// Multicast filter changes the control program asked for, for the
    /// engine to apply to the wire (bounded: [`MEMBERSHIP_QUEUE_MAX`]).
    pub(crate) memberships: Vec<(u16, bool)>,
    /// Receive double buffering: DMA writes run on the NIC's DMA thread,
    /// one queue for all its CPUs: each CPU's writes land in the order it
    /// issued them, and a receive's completion is written by the CPU that
    /// wrote its payload (`firmware/src/cpu.rs`), so never before it.
    write_behind: Option<Arc<Mutex<WriteBehind>>>,
    /// The NIC's DMA map while [`HwCtx::hold_dma`]'s caller holds its
    /// lock for a whole call into the program; null otherwise.
    dma_held: *const DmaMap,
}

// SAFETY: `dma_held` is non-null only inside one call into the program,
// on the thread making it, while that thread holds the map's lock; the
// rest of HwCtx is Send.
unsafe impl Send for HwCtx {}

impl HwCtx {
    pub(crate) fn new(shared: Arc<NicShared>) -> HwCtx {
        HwCtx {
            shared,
            outbox: Vec::new(),
            pool: Vec::new(),
            memberships: Vec::new(),
            write_behind: None,
            dma_held: core::ptr::null(),
        }
    }

    /// The NIC this hardware belongs to.
    pub(crate) fn shared(&self) -> &Arc<NicShared> {
        &self.shared
    }

    /// Lets the program's DMAs use `map` (this NIC's, locked by the
    /// caller) until [`HwCtx::release_dma`], instead of taking the lock
    /// once per DMA. Not with receive double buffering
    /// ([`HwCtx::writes_behind`]): its DMA thread takes the lock while the
    /// program waits for it.
    pub(crate) fn hold_dma(&mut self, map: &DmaMap) {
        debug_assert!(self.write_behind.is_none(), "the DMA thread needs the lock");
        self.dma_held = map;
    }

    /// Ends [`HwCtx::hold_dma`], before the caller drops the lock.
    pub(crate) fn release_dma(&mut self) {
        self.dma_held = core::ptr::null();
    }

    /// The held DMA map's windows for the control program, if it has any.
    fn held_windows(&self) -> Option<&[DmaWindow]> {
        if self.dma_held.is_null() {
            return None;
        }
        // SAFETY: as in `with_dma`.
        unsafe { &*self.dma_held }.windows()
    }

    /// Whether this program's DMAs need the map locked per access.
    pub(crate) fn writes_behind(&self) -> bool {
        self.write_behind.is_some()
    }

    /// `f` on the DMA map: the held one, else locked for `f`.
    fn with_dma<R>(&self, f: impl FnOnce(&DmaMap) -> R) -> R {
        if self.dma_held.is_null() {
            return f(&self.shared.dma.read().expect("dma"));
        }
        // SAFETY: non-null only between `hold_dma` and `release_dma`, while
        // the caller holds the lock whose guard derefs to this map.
        f(unsafe { &*self.dma_held })
    }

    /// Receive double buffering on: this CPU's DMA writes go through `w`.
    pub(crate) fn set_write_behind(&mut self, w: Arc<Mutex<WriteBehind>>) {
        self.write_behind = Some(w);
    }

    /// Every DMA write queued so far is done (DMA reads, frames sent from
    /// host memory and admin completions see them; fences and interrupts
    /// are ordered behind them by the DMA thread itself).
    fn drain_writes(&mut self) {
        if let Some(w) = &self.write_behind {
            w.lock().expect("write-behind").drain();
        }
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
    let (hw, data) = unsafe { (&mut *ctx.cast::<HwCtx>(), core::slice::from_raw_parts(data, len)) };
    if hw.write_behind.is_some() {
        // An admin completion: the host reads what the operation DMAed (a
        // saved context image) as soon as it sees it.
        let admin = hw.shared.layout.admin_off as usize;
        if off < admin + core::mem::size_of::<AdminMailbox>() && admin < off + len {
            hw.drain_writes();
        }
    }
    hw.shared.sram.write(off, data);
}

extern "C" fn hw_dma_read(ctx: *mut c_void, addr: u64, buf: *mut u8, len: usize) -> i32 {
    // SAFETY: `ctx` is the engine's HwCtx, exclusively lent for this call;
    // `buf` is the control program's live buffer of `len` bytes.
    let (hw, buf) = unsafe { (&mut *ctx.cast::<HwCtx>(), core::slice::from_raw_parts_mut(buf, len)) };
    // A read sees every earlier write.
    hw.drain_writes();
    match hw.with_dma(|d| d.read(addr, buf)) {
        Ok(()) => 0,
        Err(_) => -1,
    }
}

extern "C" fn hw_dma_write(ctx: *mut c_void, addr: u64, data: *const u8, len: usize) -> i32 {
    // SAFETY: as in `hw_dma_read`.
    let (hw, data) = unsafe { (&mut *ctx.cast::<HwCtx>(), core::slice::from_raw_parts(data, len)) };
    let done = match &hw.write_behind {
        Some(w) => w.lock().expect("write-behind").write(addr, data),
        None => hw.with_dma(|d| d.write(addr, data)),
    };
    match done {
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
    hw.outbox.push(Outgoing { dst, frame: b, host: HostPayload::default() });
}

/// Immediate Sending: the frame leaves straight from host memory. Every
/// segment is checked like a DMA read first, so a bad one sends nothing.
/// Where the payload is mapped in this process (an arena, a guest's RAM)
/// the wire sends it in place ([`HostPayload`]: the only copy is the
/// wire's own, as a NIC's MAC reads host memory through its DMA engine);
/// otherwise it is built in the MAC's buffer, one copy.
extern "C" fn hw_mac_transmit_host(
    ctx: *mut c_void,
    dst: u16,
    header: *const u8,
    header_len: usize,
    segs: *const HostSeg,
    nsegs: usize,
) -> i32 {
    // SAFETY: `ctx` is the engine's HwCtx, exclusively lent for this call;
    // `header` is valid for `header_len` bytes and `segs` for `nsegs` entries.
    let (hw, header, segs) = unsafe {
        (
            &mut *ctx.cast::<HwCtx>(),
            core::slice::from_raw_parts(header, header_len),
            core::slice::from_raw_parts(segs, nsegs),
        )
    };
    // A read sees every earlier write.
    hw.drain_writes();
    let mut b = hw.pool.pop().unwrap_or_default();
    let built = hw.with_dma(|dma| match hold_from_host(dma, header, segs)? {
        Some(host) => {
            b.clear();
            b.extend_from_slice(header);
            Ok(host)
        }
        None => build_from_host(dma, header, segs, &mut b).map(|()| HostPayload::default()),
    });
    match built {
        Ok(host) => {
            hw.outbox.push(Outgoing { dst, frame: b, host });
            0
        }
        Err(_) => {
            hw.pool.push(b);
            -1
        }
    }
}

/// Checks every segment (and the frame's size) as a DMA read would; the
/// frame's length.
fn check_host_frame(dma: &DmaMap, header: &[u8], segs: &[HostSeg]) -> Result<usize, DmaFault> {
    let mut total = header.len() as u64;
    for s in segs {
        let len = usize::try_from(s.len).map_err(|_| DmaFault)?;
        dma.check(s.addr, len)?;
        total += s.len;
    }
    if total > emp_uapi::wire::MTU_MAX as u64 {
        return Err(DmaFault);
    }
    Ok(total as usize)
}

/// The payload `segs` names, held in host memory for the wire, when every
/// segment is mapped here and there are at most [`HOST_PIECES_MAX`];
/// `Ok(None)` when it must be copied instead.
pub(crate) fn hold_from_host(dma: &DmaMap, header: &[u8], segs: &[HostSeg]) -> Result<Option<HostPayload>, DmaFault> {
    check_host_frame(dma, header, segs)?;
    if segs.len() > HOST_PIECES_MAX {
        return Ok(None);
    }
    let mut host = HostPayload::default();
    for s in segs.iter().filter(|s| s.len > 0) {
        match dma.hold(s.addr, s.len as usize) {
            Some(piece) => assert!(host.push(piece), "at most HOST_PIECES_MAX segments"),
            None => return Ok(None),
        }
    }
    Ok(Some(host))
}

/// Fills `frame` with `header` then the host memory `segs` names; checks
/// every segment (and the frame's size) before moving a byte.
pub(crate) fn build_from_host(
    dma: &DmaMap,
    header: &[u8],
    segs: &[HostSeg],
    frame: &mut Vec<u8>,
) -> Result<(), DmaFault> {
    let total = check_host_frame(dma, header, segs)?;
    frame.clear();
    frame.extend_from_slice(header);
    frame.resize(total, 0);
    let mut at = header.len();
    for s in segs {
        let end = at + s.len as usize;
        dma.read(s.addr, &mut frame[at..end])?;
        at = end;
    }
    Ok(())
}

extern "C" fn hw_raise_interrupt(ctx: *mut c_void, vector: u16) {
    // SAFETY: `ctx` is the engine's HwCtx, exclusively lent for this call.
    let hw = unsafe { &mut *ctx.cast::<HwCtx>() };
    if vector == 0 {
        return; // Admin: control threads poll the mailbox.
    }
    match &hw.write_behind {
        // The woken host must find the completion (its phase byte)
        // written: the DMA thread raises it after the writes before it.
        Some(w) => w.lock().expect("write-behind").interrupt(vector),
        None => hw.shared.raise_interrupt(vector),
    }
}

extern "C" fn hw_dma_fence(_ctx: *mut c_void) {
    // With receive double buffering the DMA thread applies writes in the
    // order issued, each after a release fence: nothing to wait for.
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
        mac_transmit_host: hw_mac_transmit_host,
        raise_interrupt: hw_raise_interrupt,
        dma_fence: hw_dma_fence,
        mcast_membership: hw_mcast_membership,
        // With receive double buffering an admin completion's SRAM write
        // waits for the DMA thread (`hw_sram_write`): every access calls.
        sram_base: if hw.writes_behind() { core::ptr::null_mut() } else { hw.shared.sram.as_mut_ptr() },
        sram_len: hw.shared.sram.len(),
        // Host memory in place only while the call holds the DMA map
        // (`hold_dma`, never with receive double buffering, whose DMA
        // thread orders the writes): the windows stay put until
        // `release_dma`.
        dma_windows: hw.held_windows().map_or(core::ptr::null(), <[_]>::as_ptr),
        dma_windows_len: hw.held_windows().map_or(0, <[_]>::len),
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::{bus_addr, DmaMap, Region, SPACE_ARENA, SPACE_VM};
    use emp_uapi::fwabi::DMA_WINDOW_SHIFT;

    /// A DMA map whose region 3 is `host` in this process (read the way a
    /// registered process' memory is).
    fn map_of(host: &[u8]) -> DmaMap {
        let mut map = DmaMap::new(8);
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        map.insert(3, Region::Vm { pid, addr: host.as_ptr() as u64, len: host.len() as u64 });
        map
    }

    #[test]
    fn arenas_are_the_programs_dma_windows_and_nothing_else_is() {
        let host: Vec<u8> = (0..4096u32).map(|i| (i * 3 + 1) as u8).collect();
        let mut map = map_of(&host); // region 3: process memory
        map.insert(5, crate::dma::test_arena(&host));
        let w = map.windows().expect("no guest");
        assert_eq!(w.len(), 8);
        let addr = bus_addr(SPACE_ARENA, 5, 100);
        assert_eq!((w[5].tag, w[5].len), (addr >> DMA_WINDOW_SHIFT, 4096));
        // The window is the mapping a DMA through the map reaches.
        // SAFETY: 100 + 8 bytes within the window's 4096 mapped bytes.
        let in_place = unsafe { core::slice::from_raw_parts(w[5].base.add(100), 8) };
        let mut b = [0u8; 8];
        map.read(addr, &mut b).expect("mapped");
        assert_eq!((in_place, &b[..]), (&host[100..108], &host[100..108]));
        // Process memory, an empty slot, a removed arena: no window.
        for i in [0, 3] {
            assert!(w[i].base.is_null() && w[i].tag == u64::MAX, "window {i}");
        }
        map.remove(5);
        assert!(map.windows().expect("no guest")[5].base.is_null());
        // A guest's RAM is addressed physically: no windows at all.
        map.set_guest(crate::dma::test_arena(&host));
        assert!(map.windows().is_none());
    }

    #[test]
    fn immediate_sending_builds_the_frame_from_host_memory() {
        let host: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 1) as u8).collect();
        let map = map_of(&host);
        let header = [0xAAu8; 40];
        let segs = [
            HostSeg { addr: bus_addr(SPACE_VM, 3, 100), len: 300 },
            HostSeg { addr: bus_addr(SPACE_VM, 3, 2000), len: 5 },
        ];
        let mut frame = Vec::new();
        build_from_host(&map, &header, &segs, &mut frame).expect("segments resolve");
        let mut want = header.to_vec();
        want.extend_from_slice(&host[100..400]);
        want.extend_from_slice(&host[2000..2005]);
        assert_eq!(frame, want);
    }

    #[test]
    fn mapped_host_memory_is_held_for_the_wire_not_copied() {
        let host: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 5) as u8).collect();
        let mut map = DmaMap::new(8);
        map.insert(2, crate::dma::test_arena(&host));
        let header = [0x55u8; 48];
        let segs = [
            HostSeg { addr: bus_addr(SPACE_ARENA, 2, 10), len: 1000 },
            HostSeg { addr: bus_addr(SPACE_ARENA, 2, 5000), len: 0 },
            HostSeg { addr: bus_addr(SPACE_ARENA, 2, 4096), len: 3000 },
        ];
        let held = hold_from_host(&map, &header, &segs).expect("segments resolve").expect("an arena is mapped here");
        assert_eq!(held.pieces().count(), 2, "an empty segment is no piece");
        let mut built = Vec::new();
        build_from_host(&map, &header, &segs, &mut built).unwrap();
        let mut sent = header.to_vec();
        held.append_to(&mut sent);
        assert_eq!(sent, built, "the held pieces are the bytes a copy would have taken");
        // The host deregisters the region while the frame is on its way:
        // what the frame holds stays mapped and unchanged.
        map.remove(2);
        assert!(map.check(segs[0].addr, 1).is_err(), "the NIC no longer reaches it");
        let mut again = header.to_vec();
        held.append_to(&mut again);
        assert_eq!(again, built);
        // Process memory is reached by system calls, and more pieces than
        // a frame holds are copied: both are built instead.
        let vm = map_of(&host);
        let vm_seg = [HostSeg { addr: bus_addr(SPACE_VM, 3, 0), len: 64 }];
        assert!(hold_from_host(&vm, &header, &vm_seg).unwrap().is_none());
        map.insert(2, crate::dma::test_arena(&host));
        let many: Vec<HostSeg> = (0..HOST_PIECES_MAX as u64 + 1)
            .map(|i| HostSeg { addr: bus_addr(SPACE_ARENA, 2, i * 100), len: 10 })
            .collect();
        assert!(hold_from_host(&map, &header, &many).unwrap().is_none());
        // A bad segment is refused before anything is held.
        let bad = [segs[0], HostSeg { addr: bus_addr(SPACE_ARENA, 2, 8100), len: 200 }];
        assert!(hold_from_host(&map, &header, &bad).is_err());
    }

    #[test]
    fn immediate_sending_refuses_bad_host_addresses_like_a_dma_read() {
        let host = vec![5u8; 4096];
        let map = map_of(&host);
        let good = HostSeg { addr: bus_addr(SPACE_VM, 3, 0), len: 64 };
        let bad = [
            HostSeg { addr: bus_addr(SPACE_VM, 3, 4000), len: 200 }, // runs past the region
            HostSeg { addr: bus_addr(SPACE_VM, 4, 0), len: 1 },      // no such region
            HostSeg { addr: 0x1234, len: 8 },                        // no such space
            HostSeg { addr: bus_addr(SPACE_VM, 3, 0), len: u64::MAX }, // absurd length
        ];
        for b in bad {
            assert!(map.check(b.addr, b.len as usize).is_err(), "a DMA read of {b:?} is refused too");
            let mut frame = vec![9u8; 3];
            // The bad segment after a good one: nothing is built at all.
            assert!(build_from_host(&map, b"hdr", &[good, b], &mut frame).is_err(), "{b:?}");
            assert_eq!(frame, [9, 9, 9], "{b:?}: a refused frame leaves the buffer alone");
        }
        // A frame over the largest MTU is refused too.
        let big = vec![0u8; emp_uapi::wire::MTU_MAX as usize + 1];
        let map = map_of(&big);
        let all = HostSeg { addr: bus_addr(SPACE_VM, 3, 0), len: big.len() as u64 };
        assert!(build_from_host(&map, b"", &[all], &mut Vec::new()).is_err());
    }
}
