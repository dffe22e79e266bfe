//! The ABI between the NIC hardware model and a loaded control program.
//!
//! A firmware image's payload is an ELF shared object exporting the symbols
//! below. The NIC passes its hardware services as an [`FwHal`] table of
//! C function pointers, so the control program never links against the NIC
//! (or vice versa): the image is loaded, not linked.
//!
//! Calling order: `emp_fw_abi` (must equal [`crate::image::FIRMWARE_ABI`]),
//! `emp_fw_boot` once, then `emp_fw_doorbell` / `emp_fw_frames` /
//! `emp_fw_timeout` as events happen, `emp_fw_poll_timeout` after each,
//! `emp_fw_free` at shutdown. Calls for one NIC never overlap: a NIC whose
//! CPUs run on several threads serializes them with one lock (the thesis'
//! semaphore), and the thread that makes a call is the CPU it runs as.

use core::ffi::c_void;

/// `extern "C" fn() -> u32`: the ABI the payload was built for.
pub const SYM_ABI: &str = "emp_fw_abi";
/// `extern "C" fn(*const FwHal, *const FwConfig) -> *mut c_void`: boots;
/// null when boot failed (the reason is in SRAM status).
pub const SYM_BOOT: &str = "emp_fw_boot";
/// `extern "C" fn(*mut c_void, *const FwHal, u64)`: host doorbell.
pub const SYM_DOORBELL: &str = "emp_fw_doorbell";
/// `extern "C" fn(*mut c_void, *const FwHal, u64, *const *const u8, *const usize, usize)`:
/// frames received, `n` of them (`frames[i]`, `lens[i]` bytes), handled in
/// order in one call: what each frame's handling leaves to do (rings freed
/// for, peers made ready, counters, interrupts) is done once, after the last.
pub const SYM_FRAMES: &str = "emp_fw_frames";
/// `extern "C" fn(*mut c_void, *const FwHal, u64)`: timers due.
pub const SYM_TIMEOUT: &str = "emp_fw_timeout";
/// `extern "C" fn(*mut c_void) -> u64`: next deadline, `u64::MAX` = none.
pub const SYM_POLL_TIMEOUT: &str = "emp_fw_poll_timeout";
/// `extern "C" fn(*mut c_void, *mut u8, usize) -> usize`: writes a
/// description of the NIC's tables (UTF-8) and returns its length.
pub const SYM_DESCRIBE: &str = "emp_fw_describe";
/// `extern "C" fn(*mut c_void)`: frees the control program's state.
pub const SYM_FREE: &str = "emp_fw_free";
/// `extern "C" fn(*mut c_void) -> u32`: NIC CPUs the control program uses.
pub const SYM_CPUS: &str = "emp_fw_cpus";
/// `extern "C" fn(*mut c_void, *const FwHal, u64, u32) -> u32`: runs the
/// steps queued for one NIC CPU; returns how many ran.
pub const SYM_CPU: &str = "emp_fw_cpu";
/// `extern "C" fn(*mut c_void, u32) -> u32`: steps waiting in one NIC
/// CPU's queue (optional: a NIC that finds it missing runs every CPU on one
/// thread).
pub const SYM_CPU_PENDING: &str = "emp_fw_cpu_pending";
/// `extern "C" fn(*mut c_void) -> u32`: the NIC CPU received frames are
/// handed to (optional, as [`SYM_CPU_PENDING`]).
pub const SYM_FRAME_CPU: &str = "emp_fw_frame_cpu";
/// `extern "C" fn(*mut c_void) -> *const c_void`: a reference to the
/// common area of the NIC's CPUs, valid until [`SYM_CPU_AREA_FREE`] even
/// after the program is freed (optional: without it, every CPU runs only
/// holding the program).
pub const SYM_CPU_AREA: &str = "emp_fw_cpu_area";
/// `extern "C" fn(*const c_void)`: releases a [`SYM_CPU_AREA`] reference.
pub const SYM_CPU_AREA_FREE: &str = "emp_fw_cpu_area_free";
/// `extern "C" fn(*const c_void, *const FwHal, u32) -> u32`: runs one NIC
/// CPU's jobs (data movement another CPU queued) through the area, with
/// that CPU's hardware, **without** the program: it may run while another
/// CPU is inside the program. Returns how many ran.
pub const SYM_CPU_JOBS: &str = "emp_fw_cpu_jobs";
/// `extern "C" fn(*const c_void, u32) -> u32`: nonzero when one NIC CPU
/// has steps that need the program (work queued for it, failed jobs to
/// report); read without the program.
pub const SYM_CPU_WANTS_PROGRAM: &str = "emp_fw_cpu_wants_program";
/// The sides' entry points (optional, all five or none: without them
/// every call takes the whole program). A side's entry point runs while
/// the other side's may run on another thread; the caller holds a lock per
/// side, and the whole program's entry points need both (docs/nic-cpus.md).
/// Each returns [`SIDE_WHOLE`] when the whole program must run next, and
/// in the bits from [`SIDE_WAKE_SHIFT`] the CPUs it queued steps for.
///
/// `extern "C" fn(*mut c_void, *const FwHal, u64, *const *const u8,
/// *const usize, usize, *mut usize) -> u32`: received frames, on the
/// receive side alone; writes how many it took (the whole program's
/// [`SYM_FRAMES`] takes the rest).
pub const SYM_RECV_SIDE_FRAMES: &str = "emp_fw_recv_side_frames";
/// `extern "C" fn(*mut c_void, *const FwHal, u64) -> u32`: a doorbell's
/// receive-side part, alone (the receive rings, and the coalesced ACKs due
/// by then).
pub const SYM_RECV_SIDE_DOORBELL: &str = "emp_fw_recv_side_doorbell";
/// `extern "C" fn(*mut c_void, *const FwHal, u64) -> u32`: a doorbell's
/// send-side part, alone (the send rings, then sending).
pub const SYM_SEND_SIDE_DOORBELL: &str = "emp_fw_send_side_doorbell";
/// `extern "C" fn(*mut c_void, *const FwHal, u64, u32) -> u32`: one NIC
/// CPU's queue on the send side alone (its jobs, the ACKs and loss NACKs
/// handed to it for the send records' update, the send side's timers due
/// by then); the whole program's [`SYM_CPU`] and [`SYM_TIMEOUT`] run what
/// it leaves.
pub const SYM_SEND_SIDE_CPU: &str = "emp_fw_send_side_cpu";
/// `extern "C" fn(*mut c_void) -> u64`: the next timer deadline, as the
/// sides and the whole program last published it; read holding no lock.
pub const SYM_DEADLINE: &str = "emp_fw_deadline";
/// A side's entry point stopped: the whole program must run next.
pub const SIDE_WHOLE: u32 = 1;
/// Bit `SIDE_WAKE_SHIFT + c` of a side's result: steps wait for CPU `c`.
pub const SIDE_WAKE_SHIFT: u32 = 8;

/// Hardware services, as C function pointers over an opaque context.
/// Return codes: 0 = done, nonzero = the DMA failed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FwHal {
    /// Passed back as the first argument of every call.
    pub ctx: *mut c_void,
    /// Read SRAM `[off, off + len)` into `buf`.
    pub sram_read: extern "C" fn(ctx: *mut c_void, off: usize, buf: *mut u8, len: usize),
    /// Write `data` to SRAM at `off`.
    pub sram_write: extern "C" fn(ctx: *mut c_void, off: usize, data: *const u8, len: usize),
    /// DMA host memory at bus address `addr` into `buf`.
    pub dma_read: extern "C" fn(ctx: *mut c_void, addr: u64, buf: *mut u8, len: usize) -> i32,
    /// DMA `data` into host memory at bus address `addr`.
    pub dma_write: extern "C" fn(ctx: *mut c_void, addr: u64, data: *const u8, len: usize) -> i32,
    /// Transmit a frame to `dst_node`.
    pub mac_transmit: extern "C" fn(ctx: *mut c_void, dst_node: u16, frame: *const u8, len: usize),
    /// Raise MSI-X vector `vector`.
    pub raise_interrupt: extern "C" fn(ctx: *mut c_void, vector: u16),
    /// Write barrier: every `dma_write` issued before is visible to the host
    /// before any issued after (a CQE's phase byte follows one).
    pub dma_fence: extern "C" fn(ctx: *mut c_void),
    /// The MAC starts (`join` 1) or stops (0) receiving frames sent to
    /// multicast address `addr` (`crate::wire::MCAST_BASE` and up).
    pub mcast_membership: extern "C" fn(ctx: *mut c_void, addr: u16, join: u8),
    /// Transmit a frame to `dst_node` made of `header` (`header_len` bytes
    /// from the control program) followed by the host memory `segs[..nsegs]`
    /// names (Immediate Sending): every segment is checked like a DMA read
    /// first; nonzero (nothing sent) when one does not resolve.
    pub mac_transmit_host: extern "C" fn(
        ctx: *mut c_void,
        dst_node: u16,
        header: *const u8,
        header_len: usize,
        segs: *const HostSeg,
        nsegs: usize,
    ) -> i32,
    /// SRAM, mapped for the duration of the call: `sram_len` bytes the
    /// control program reads and writes in place, without a call per access
    /// (an aligned 4-byte word as an acquire load or a release store, other
    /// ranges as a copy after a release fence or before an acquire fence,
    /// as `sram_read` and `sram_write` do). Null: SRAM only through those
    /// two (a NIC that must see the writes, e.g. to order them after its
    /// own DMA).
    pub sram_base: *mut u8,
    /// Bytes at `sram_base`.
    pub sram_len: usize,
    /// Host memory mapped for the duration of the call, as windows the
    /// control program reads and writes in place instead of calling
    /// `dma_read` / `dma_write` (a byte copy, as those do; `dma_fence` is
    /// then a release fence in place). A bus address `addr` is in window
    /// `(addr >> DMA_WINDOW_SHIFT) & 0xFFFF` when that window's `tag`
    /// equals `addr >> DMA_WINDOW_SHIFT` and its offset
    /// (`addr` below bit `DMA_WINDOW_SHIFT`) plus the length is at most `len`;
    /// any other address goes through the calls, which also fault it. Null:
    /// every DMA through the calls (a NIC that must order them itself, or
    /// whose host memory is not mapped in its process).
    pub dma_windows: *const DmaWindow,
    /// Windows at `dma_windows`.
    pub dma_windows_len: usize,
}

/// Bus address bits above the offset in a [`DmaWindow`].
pub const DMA_WINDOW_SHIFT: u32 = 40;
/// One window of host memory mapped in the NIC's process (see
/// [`FwHal::dma_windows`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaWindow {
    /// `addr >> DMA_WINDOW_SHIFT` of the addresses it holds; `u64::MAX`
    /// for an unused window.
    pub tag: u64,
    /// The window's first byte in the NIC's process; null when unused.
    pub base: *mut u8,
    /// Bytes at `base`.
    pub len: u64,
}

/// A run of host memory by bus address, as a DMA read would name it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostSeg {
    /// Bus address of the first byte.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

/// Most segments one `mac_transmit_host` names: a frame whose payload is
/// more scattered than this is sent store-and-forward.
pub const HOST_SEGS_MAX: usize = 16;

/// Control-program tunables passed at boot (mirrors the firmware's config;
/// zero means "use the default").
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FwConfig {
    /// Frames per ACK group.
    pub group_size: u32,
    /// Frames in flight per peer.
    pub window_frames: u32,
    /// Initial retransmission timeout (ns).
    pub rto_ns: u64,
    /// Retransmission timeout cap (ns).
    pub rto_ns_max: u64,
    /// Retries per group.
    pub retry_limit: u32,
    /// Overflow buffer slots.
    pub overflow_slots: u32,
    /// Outstanding sends per NIC.
    pub tx_max: u32,
    /// Posted receives per NIC.
    pub recv_posted_max: u32,
    /// Seed of port generations (vary per boot).
    pub gen_seed: u32,
    /// NIC CPU plan (`crate::image::cpu_plan`).
    pub cpu_plan: u32,
}
