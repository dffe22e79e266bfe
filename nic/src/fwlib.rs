//! Runs a verified control-program payload: the ELF shared object is
//! written to a memfd and `dlopen`ed from there; its entry points are looked
//! up by the names in `emp_uapi::fwabi`.

use core::ffi::c_void;
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};

use emp_uapi::fwabi::{self, FwConfig, FwHal};
use emp_uapi::image::FIRMWARE_ABI;

type BootFn = unsafe extern "C" fn(*const FwHal, *const FwConfig) -> *mut c_void;
type EventFn = unsafe extern "C" fn(*mut c_void, *const FwHal, u64);
type FramesFn = unsafe extern "C" fn(*mut c_void, *const FwHal, u64, *const *const u8, *const usize, usize);
type PollFn = unsafe extern "C" fn(*mut c_void) -> u64;
type DescribeFn = unsafe extern "C" fn(*mut c_void, *mut u8, usize) -> usize;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type CpusFn = unsafe extern "C" fn(*mut c_void) -> u32;
type CpuFn = unsafe extern "C" fn(*mut c_void, *const FwHal, u64, u32) -> u32;
type CpuPendingFn = unsafe extern "C" fn(*mut c_void, u32) -> u32;
type FrameCpuFn = unsafe extern "C" fn(*mut c_void) -> u32;
type CpuAreaFn = unsafe extern "C" fn(*mut c_void) -> *const c_void;
type CpuAreaFreeFn = unsafe extern "C" fn(*const c_void);
type CpuJobsFn = unsafe extern "C" fn(*const c_void, *const FwHal, u32) -> u32;
type CpuWantsProgramFn = unsafe extern "C" fn(*const c_void, u32) -> u32;
type SideFramesFn =
    unsafe extern "C" fn(*mut c_void, *const FwHal, u64, *const *const u8, *const usize, usize, *mut usize) -> u32;
type SideFn = unsafe extern "C" fn(*mut c_void, *const FwHal, u64) -> u32;
type SideCpuFn = unsafe extern "C" fn(*mut c_void, *const FwHal, u64, u32) -> u32;

/// The sides' entry points (`emp_uapi::fwabi::SYM_RECV_SIDE_FRAMES` and
/// on): each runs holding one side of the program, beside the other's.
#[derive(Clone, Copy)]
pub(crate) struct SideFns {
    recv_frames: SideFramesFn,
    pub(crate) recv_doorbell: SideFn,
    pub(crate) send_doorbell: SideFn,
    pub(crate) send_cpu: SideCpuFn,
    pub(crate) deadline: PollFn,
}

impl SideFns {
    /// Hands the receive side `frames`, in order, in calls of at most
    /// [`FRAMES_PER_CALL`], until one stops; returns how many it took and
    /// its result (`fwabi::SIDE_WHOLE`, the CPUs to wake).
    ///
    /// # Safety
    /// `state` is the program's live state and the caller holds its
    /// receive side; `hal` is valid for the call.
    pub(crate) unsafe fn recv_frames(
        &self,
        state: *mut c_void,
        hal: &FwHal,
        now: u64,
        frames: &[Vec<u8>],
    ) -> (usize, u32) {
        let (mut done, mut result) = (0, 0);
        for chunk in frames.chunks(FRAMES_PER_CALL) {
            let (mut at, mut lens) = ([core::ptr::null::<u8>(); FRAMES_PER_CALL], [0usize; FRAMES_PER_CALL]);
            for (i, f) in chunk.iter().enumerate() {
                (at[i], lens[i]) = (f.as_ptr(), f.len());
            }
            let mut taken = 0;
            // SAFETY: the caller's guarantees; `at[i]` is valid for `lens[i]`
            // bytes (borrowed from `frames` for the call), `chunk.len()`
            // entries each; `taken` is writable.
            let r = unsafe { (self.recv_frames)(state, hal, now, at.as_ptr(), lens.as_ptr(), chunk.len(), &mut taken) };
            done += taken.min(chunk.len());
            result |= r;
            if r & fwabi::SIDE_WHOLE != 0 {
                break;
            }
        }
        (done, result)
    }
}

/// The entry points through which a NIC CPU runs its jobs without the
/// program (`emp_uapi::fwabi::SYM_CPU_AREA` and on).
#[derive(Clone, Copy)]
pub(crate) struct AreaFns {
    pub(crate) area: CpuAreaFn,
    pub(crate) free: CpuAreaFreeFn,
    pub(crate) jobs: CpuJobsFn,
    pub(crate) wants_program: CpuWantsProgramFn,
}

/// A loaded control program.
pub struct FwLib {
    handle: *mut c_void,
    pub(crate) boot: BootFn,
    pub(crate) doorbell: EventFn,
    frames: FramesFn,
    pub(crate) timeout: EventFn,
    pub(crate) poll_timeout: PollFn,
    pub(crate) describe: DescribeFn,
    pub(crate) free: FreeFn,
    pub(crate) cpus: CpusFn,
    pub(crate) cpu: CpuFn,
    /// Absent in older images: their CPUs all run on the engine thread.
    pub(crate) cpu_pending: Option<CpuPendingFn>,
    /// Absent in older images, as `cpu_pending`.
    pub(crate) frame_cpu: Option<FrameCpuFn>,
    /// Absent in older images: their CPUs run only holding the program.
    pub(crate) area: Option<AreaFns>,
    /// Absent in older images: every call takes the whole program.
    pub(crate) sides: Option<SideFns>,
}

impl FwLib {
    /// Hands the control program `frames`, in order, in calls of at most
    /// [`FRAMES_PER_CALL`] (one call when there are none).
    ///
    /// # Safety
    /// `state` is the program's live state and the caller holds it (the
    /// NIC's lock); `hal` is valid for the call.
    pub(crate) unsafe fn frames<'a>(
        &self,
        state: *mut c_void,
        hal: &FwHal,
        now: u64,
        frames: impl IntoIterator<Item = &'a Vec<u8>>,
    ) {
        // At least one call: with no frames, the program still does what a
        // batch leaves (what the receive side stopped for after taking
        // every frame alone).
        let mut frames = frames.into_iter().peekable();
        loop {
            let (mut at, mut lens) = ([core::ptr::null::<u8>(); FRAMES_PER_CALL], [0usize; FRAMES_PER_CALL]);
            let mut n = 0;
            for f in frames.by_ref().take(FRAMES_PER_CALL) {
                (at[n], lens[n]) = (f.as_ptr(), f.len());
                n += 1;
            }
            // SAFETY: the caller's guarantees; `at[i]` is valid for `lens[i]`
            // bytes (borrowed from `frames` for the call), `n` entries each.
            unsafe { (self.frames)(state, hal, now, at.as_ptr(), lens.as_ptr(), n) };
            if frames.peek().is_none() {
                break;
            }
        }
    }
}

/// Most frames one `emp_fw_frames` call carries.
pub(crate) const FRAMES_PER_CALL: usize = 256;

// SAFETY: the library handle and function pointers are plain addresses;
// the control program's state is driven by one thread at a time (the NIC's
// CPUs take its lock, `cpus.rs`).
unsafe impl Send for FwLib {}
// SAFETY: as above.
unsafe impl Sync for FwLib {}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a valid C string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null C string from dlerror.
        unsafe { std::ffi::CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl FwLib {
    /// Loads an ELF payload (already verified) and resolves its entry points.
    pub fn load(payload: &[u8]) -> Result<FwLib, String> {
        let fd = crate::sram::new_memfd("emp-fw", payload.len()).map_err(|e| format!("memfd: {e}"))?;
        // SAFETY: we own `fd`; the File takes it over for writing.
        let mut f = unsafe { std::fs::File::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(fd)) };
        f.write_all(payload).map_err(|e| format!("writing payload: {e}"))?;
        let path = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).expect("no NUL");
        // SAFETY: `path` names a readable ELF object; RTLD_LOCAL keeps its
        // symbols private to this handle.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        drop(f);
        if handle.is_null() {
            return Err(format!("dlopen: {}", dlerror()));
        }
        let sym = |name: &str| -> Result<*mut c_void, String> {
            let c = CString::new(name).expect("no NUL");
            // SAFETY: `handle` is a live dlopen handle, `c` a valid C string.
            let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
            if p.is_null() {
                Err(format!("payload lacks symbol {name}"))
            } else {
                Ok(p)
            }
        };
        let close = |e: String| {
            // SAFETY: `handle` came from dlopen and is not used afterwards.
            unsafe { libc::dlclose(handle) };
            e
        };
        let abi_fn = sym(fwabi::SYM_ABI).map_err(close)?;
        // SAFETY: the symbol is `extern "C" fn() -> u32` per the ABI contract.
        let abi = unsafe { core::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> u32>(abi_fn)() };
        if abi != FIRMWARE_ABI {
            return Err(close(format!("payload implements ABI {abi}, NIC wants {FIRMWARE_ABI}")));
        }
        macro_rules! get {
            ($name:expr, $ty:ty) => {{
                let p = sym($name).map_err(close)?;
                // SAFETY: the symbol has this signature per `emp_uapi::fwabi`.
                unsafe { core::mem::transmute::<*mut c_void, $ty>(p) }
            }};
        }
        Ok(FwLib {
            handle,
            boot: get!(fwabi::SYM_BOOT, BootFn),
            doorbell: get!(fwabi::SYM_DOORBELL, EventFn),
            frames: get!(fwabi::SYM_FRAMES, FramesFn),
            timeout: get!(fwabi::SYM_TIMEOUT, EventFn),
            poll_timeout: get!(fwabi::SYM_POLL_TIMEOUT, PollFn),
            describe: get!(fwabi::SYM_DESCRIBE, DescribeFn),
            free: get!(fwabi::SYM_FREE, FreeFn),
            cpus: get!(fwabi::SYM_CPUS, CpusFn),
            cpu: get!(fwabi::SYM_CPU, CpuFn),
            cpu_pending: sym(fwabi::SYM_CPU_PENDING).ok().map(|p| {
                // SAFETY: the symbol has this signature per `emp_uapi::fwabi`.
                unsafe { core::mem::transmute::<*mut c_void, CpuPendingFn>(p) }
            }),
            frame_cpu: sym(fwabi::SYM_FRAME_CPU).ok().map(|p| {
                // SAFETY: the symbol has this signature per `emp_uapi::fwabi`.
                unsafe { core::mem::transmute::<*mut c_void, FrameCpuFn>(p) }
            }),
            area: (|| {
                let (a, f) = (sym(fwabi::SYM_CPU_AREA).ok()?, sym(fwabi::SYM_CPU_AREA_FREE).ok()?);
                let (j, w) = (sym(fwabi::SYM_CPU_JOBS).ok()?, sym(fwabi::SYM_CPU_WANTS_PROGRAM).ok()?);
                // SAFETY: the symbols have these signatures per `emp_uapi::fwabi`.
                Some(unsafe {
                    AreaFns {
                        area: core::mem::transmute::<*mut c_void, CpuAreaFn>(a),
                        free: core::mem::transmute::<*mut c_void, CpuAreaFreeFn>(f),
                        jobs: core::mem::transmute::<*mut c_void, CpuJobsFn>(j),
                        wants_program: core::mem::transmute::<*mut c_void, CpuWantsProgramFn>(w),
                    }
                })
            })(),
            sides: (|| {
                let (f, r) = (sym(fwabi::SYM_RECV_SIDE_FRAMES).ok()?, sym(fwabi::SYM_RECV_SIDE_DOORBELL).ok()?);
                let (s, d) = (sym(fwabi::SYM_SEND_SIDE_DOORBELL).ok()?, sym(fwabi::SYM_DEADLINE).ok()?);
                let c = sym(fwabi::SYM_SEND_SIDE_CPU).ok()?;
                // SAFETY: the symbols have these signatures per `emp_uapi::fwabi`.
                Some(unsafe {
                    SideFns {
                        recv_frames: core::mem::transmute::<*mut c_void, SideFramesFn>(f),
                        recv_doorbell: core::mem::transmute::<*mut c_void, SideFn>(r),
                        send_doorbell: core::mem::transmute::<*mut c_void, SideFn>(s),
                        send_cpu: core::mem::transmute::<*mut c_void, SideCpuFn>(c),
                        deadline: core::mem::transmute::<*mut c_void, PollFn>(d),
                    }
                })
            })(),
        })
    }
}

impl Drop for FwLib {
    fn drop(&mut self) {
        // SAFETY: every control-program instance was freed by its owner
        // before the library is dropped (FwInstance holds an Arc<FwLib>).
        unsafe { libc::dlclose(self.handle) };
    }
}
