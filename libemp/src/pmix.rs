//! PMIx, the process-management interface of `mpirun` (Open MPI, PRRTE's
//! `prterun`) and `srun --mpi=pmix`: this process's rank and the job's size,
//! and a key-value exchange with a fence.
//!
//! libpmix is loaded at run time (`dlopen("libpmix.so.2")`), only when the
//! environment says a PMIx launcher started this process: programs started
//! by `emp run`, and libemp.so.1 itself, need no libpmix. Only the handful
//! of types and functions used here are declared; their layout is that of
//! PMIx 4.x's `pmix_common.h` (ABI of `libpmix.so.2`), which the unit test
//! below checks against the installed header with the C compiler.

use core::ffi::{c_char, c_int, c_void, CStr};
use std::ffi::CString;
use std::sync::OnceLock;
use std::time::Duration;

use crate::{Error, Result};

/// The shared object, by its SONAME (Debian: package `libpmix2`).
const LIBRARY: &CStr = c"libpmix.so.2";

/// `PMIX_MAX_NSLEN + 1`.
const NSPACE_LEN: usize = 256;
/// `PMIX_MAX_KEYLEN + 1`.
const KEY_LEN: usize = 512;
/// `PMIX_RANK_WILDCARD`: the job as a whole (where job-level keys live).
const RANK_WILDCARD: u32 = u32::MAX - 1;
/// `PMIX_SUCCESS`.
const SUCCESS: c_int = 0;
/// `PMIX_GLOBAL`: share with every process of the job, local and remote.
const SCOPE_GLOBAL: u8 = 3;

/// `pmix_data_type_t` values.
const TYPE_BOOL: u16 = 1;
const TYPE_STRING: u16 = 3;
const TYPE_INT: u16 = 6;
const TYPE_UINT16: u16 = 13;
const TYPE_UINT32: u16 = 14;

/// Attribute keys.
const KEY_COLLECT_DATA: &CStr = c"pmix.collect";
const KEY_TIMEOUT: &CStr = c"pmix.timeout";
const KEY_JOB_SIZE: &CStr = c"pmix.job.size";
const KEY_LOCAL_RANK: &CStr = c"pmix.lrank";

/// `pmix_proc_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PmixProc {
    pub(crate) nspace: [c_char; NSPACE_LEN],
    pub(crate) rank: u32,
}

/// The union of `pmix_value_t`, reduced to the members used here; `_space`
/// gives it the header's size (its largest member, `pmix_envar_t`, is two
/// pointers and a char) and alignment.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union PmixValueData {
    pub(crate) flag: bool,
    pub(crate) string: *mut c_char,
    pub(crate) integer: c_int,
    pub(crate) uint16: u16,
    pub(crate) uint32: u32,
    pub(crate) _space: [u64; 3],
}

/// `pmix_value_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PmixValue {
    pub(crate) kind: u16,
    pub(crate) data: PmixValueData,
}

/// `pmix_info_t`.
#[repr(C)]
pub(crate) struct PmixInfo {
    pub(crate) key: [c_char; KEY_LEN],
    pub(crate) flags: u32,
    pub(crate) value: PmixValue,
}

type InitFn = unsafe extern "C" fn(*mut PmixProc, *mut PmixInfo, usize) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const PmixInfo, usize) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut PmixValue) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type FenceFn = unsafe extern "C" fn(*const PmixProc, usize, *const PmixInfo, usize) -> c_int;
type GetFn = unsafe extern "C" fn(*const PmixProc, *const c_char, *const PmixInfo, usize, *mut *mut PmixValue) -> c_int;
type ValueDestructFn = unsafe extern "C" fn(*mut PmixValue);
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// The functions of libpmix used here.
struct Api {
    init: InitFn,
    finalize: FinalizeFn,
    put: PutFn,
    commit: CommitFn,
    fence: FenceFn,
    get: GetFn,
    value_destruct: ValueDestructFn,
    error_string: ErrorStringFn,
}

/// This process's PMIx session: opened once, finalized at exit (a process
/// that initialized PMIx and exits without finalizing is reported by
/// `mpirun` as having exited improperly).
pub(crate) struct Pmix {
    api: Api,
    me: PmixProc,
    size: usize,
}

impl std::fmt::Debug for Pmix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmix").field("namespace", &self.namespace()).field("rank", &self.me.rank).finish()
    }
}

/// True when a PMIx launcher started this process: it sets
/// `PMIX_NAMESPACE` and `PMIX_RANK` for every process it starts.
pub(crate) fn in_environment() -> bool {
    std::env::var_os("PMIX_NAMESPACE").is_some() && std::env::var_os("PMIX_RANK").is_some()
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Job(format!("PMIx: {what}: {e}"))
}

/// dlerror's message.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by the
    // C library, valid until the next dl* call on this thread; it is copied
    // at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Api {
    fn load() -> Result<Api> {
        // SAFETY: a valid C string; loading libpmix runs its initializers,
        // which only set up the library's own state.
        let lib = unsafe { libc::dlopen(LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if lib.is_null() {
            return Err(err(
                "the launcher uses PMIx but libpmix.so.2 cannot be loaded (Debian: apt-get install libpmix2)",
                dl_error(),
            ));
        }
        let sym = |name: &CStr| -> Result<*mut c_void> {
            // SAFETY: `lib` is a live handle (never closed: the session lives
            // until exit) and `name` a valid C string.
            let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
            if p.is_null() {
                Err(err(&format!("libpmix.so.2 has no {}", name.to_string_lossy()), dl_error()))
            } else {
                Ok(p)
            }
        };
        // SAFETY: (every transmute below) each symbol is the function of that
        // name in libpmix.so.2, whose C prototype (pmix.h, PMIx 4.x) is the
        // function pointer type it becomes; the library stays loaded.
        unsafe {
            Ok(Api {
                init: core::mem::transmute::<*mut c_void, InitFn>(sym(c"PMIx_Init")?),
                finalize: core::mem::transmute::<*mut c_void, FinalizeFn>(sym(c"PMIx_Finalize")?),
                put: core::mem::transmute::<*mut c_void, PutFn>(sym(c"PMIx_Put")?),
                commit: core::mem::transmute::<*mut c_void, CommitFn>(sym(c"PMIx_Commit")?),
                fence: core::mem::transmute::<*mut c_void, FenceFn>(sym(c"PMIx_Fence")?),
                get: core::mem::transmute::<*mut c_void, GetFn>(sym(c"PMIx_Get")?),
                value_destruct: core::mem::transmute::<*mut c_void, ValueDestructFn>(sym(c"PMIx_Value_destruct")?),
                error_string: core::mem::transmute::<*mut c_void, ErrorStringFn>(sym(c"PMIx_Error_string")?),
            })
        }
    }
}

/// A key or attribute name as PMIx stores it (at most `PMIX_MAX_KEYLEN`).
fn key_bytes(key: &CStr) -> [c_char; KEY_LEN] {
    let mut k = [0 as c_char; KEY_LEN];
    for (d, s) in k.iter_mut().zip(key.to_bytes().iter().take(KEY_LEN - 1)) {
        *d = *s as c_char;
    }
    k
}

fn info(key: &CStr, kind: u16, data: PmixValueData) -> PmixInfo {
    PmixInfo { key: key_bytes(key), flags: 0, value: PmixValue { kind, data } }
}

static SESSION: OnceLock<std::result::Result<Pmix, String>> = OnceLock::new();

extern "C" fn finalize_at_exit() {
    if let Some(Ok(p)) = SESSION.get() {
        // SAFETY: PMIx_Init succeeded for this session; no info array.
        unsafe { (p.api.finalize)(core::ptr::null(), 0) };
    }
}

impl Pmix {
    /// The process's session, opened on first use. A failure is remembered:
    /// PMIx is not initialized twice.
    pub(crate) fn session() -> Result<&'static Pmix> {
        SESSION.get_or_init(|| Pmix::open().map_err(|e| e.to_string())).as_ref().map_err(|e| Error::Job(e.clone()))
    }

    fn open() -> Result<Pmix> {
        let api = Api::load()?;
        let mut me = PmixProc { nspace: [0; NSPACE_LEN], rank: 0 };
        // SAFETY: `me` is a writable pmix_proc_t; no info array.
        let rc = unsafe { (api.init)(&mut me, core::ptr::null_mut(), 0) };
        let mut p = Pmix { api, me, size: 0 };
        if rc != SUCCESS {
            return Err(err("PMIx_Init", p.describe(rc)));
        }
        // SAFETY: registers a function of this library, which stays loaded
        // (libemp is linked, never dlclose'd), to run at exit.
        if unsafe { libc::atexit(finalize_at_exit) } != 0 {
            // SAFETY: initialized above; undone because nothing would finalize it.
            unsafe { (p.api.finalize)(core::ptr::null(), 0) };
            return Err(err("atexit", "cannot register PMIx_Finalize"));
        }
        let job = PmixProc { rank: RANK_WILDCARD, ..p.me };
        p.size = match p.get(&job, KEY_JOB_SIZE)? {
            Got::Uint(n) if n > 0 => n as usize,
            other => return Err(err("PMIX_JOB_SIZE", format!("unexpected {other}"))),
        };
        if p.me.rank as usize >= p.size {
            return Err(err("PMIx_Init", format!("rank {} of a job of {}", p.me.rank, p.size)));
        }
        Ok(p)
    }

    fn describe(&self, rc: c_int) -> String {
        // SAFETY: PMIx_Error_string returns a static NUL-terminated string
        // for any status.
        let s = unsafe { (self.api.error_string)(rc) };
        if s.is_null() {
            format!("status {rc}")
        } else {
            // SAFETY: non-NULL, static, NUL-terminated (above).
            format!("{} ({rc})", unsafe { CStr::from_ptr(s) }.to_string_lossy())
        }
    }

    fn check(&self, what: &str, rc: c_int) -> Result<()> {
        if rc == SUCCESS {
            Ok(())
        } else {
            Err(err(what, self.describe(rc)))
        }
    }

    /// This process's rank in the job.
    pub(crate) fn rank(&self) -> usize {
        self.me.rank as usize
    }

    /// Processes in the job.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    fn namespace(&self) -> String {
        let bytes: Vec<u8> = self.me.nspace.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// This process's rank among the job's processes on its node
    /// (`PMIX_LOCAL_RANK`).
    pub(crate) fn local_rank(&self) -> Result<usize> {
        match self.get(&self.me, KEY_LOCAL_RANK)? {
            Got::Uint(n) => Ok(n as usize),
            other => Err(err("PMIX_LOCAL_RANK", format!("unexpected {other}"))),
        }
    }

    /// `PMIx_Get(proc, key)`, copied out and released.
    fn get(&self, proc: &PmixProc, key: &CStr) -> Result<Got> {
        let mut v: *mut PmixValue = core::ptr::null_mut();
        // SAFETY: valid proc and key; `v` receives a value PMIx allocated.
        let rc = unsafe { (self.api.get)(proc, key.as_ptr(), core::ptr::null(), 0, &mut v) };
        self.check(&format!("PMIx_Get({}, rank {})", key.to_string_lossy(), proc.rank), rc)?;
        if v.is_null() {
            return Err(err("PMIx_Get", "success without a value"));
        }
        // SAFETY: PMIx_Get succeeded, so `v` points at a value it allocated;
        // the union member read is the one `kind` names.
        let got = unsafe {
            match (*v).kind {
                TYPE_STRING if (*v).data.string.is_null() => Got::Other(TYPE_STRING),
                TYPE_STRING => Got::Str(CStr::from_ptr((*v).data.string).to_string_lossy().into_owned()),
                TYPE_UINT32 => Got::Uint((*v).data.uint32 as u64),
                TYPE_UINT16 => Got::Uint((*v).data.uint16 as u64),
                t => Got::Other(t),
            }
        };
        // SAFETY: PMIX_VALUE_RELEASE: destruct, then free with the C
        // library's allocator (pmix_free is free); `v` is not used again.
        unsafe {
            (self.api.value_destruct)(v);
            libc::free(v.cast());
        }
        Ok(got)
    }

    /// Waits for every process of the job; with `collect`, data put and
    /// committed before it is then available from every process.
    fn fence(&self, what: &str, collect: bool, timeout: Duration) -> Result<()> {
        let secs = timeout.as_secs().clamp(1, i32::MAX as u64) as c_int;
        let infos = [
            info(KEY_COLLECT_DATA, TYPE_BOOL, PmixValueData { flag: collect }),
            info(KEY_TIMEOUT, TYPE_INT, PmixValueData { integer: secs }),
        ];
        let job = PmixProc { rank: RANK_WILDCARD, ..self.me };
        // SAFETY: one proc (the whole job) and two valid info entries.
        let rc = unsafe { (self.api.fence)(&job, 1, infos.as_ptr(), infos.len()) };
        self.check(&format!("PMIx_Fence({what})"), rc)
    }

    /// Publishes `value` under `key` and returns every rank's (element r is
    /// rank r's). Collective: every rank calls it with the same key.
    pub(crate) fn exchange(&self, key: &str, value: &str, timeout: Duration) -> Result<Vec<String>> {
        let ckey = CString::new(format!("emp.{key}")).map_err(|_| Error::invalid("PMIx key with a NUL byte"))?;
        if ckey.as_bytes().len() >= KEY_LEN {
            return Err(Error::invalid(format!("PMIx key {key:?} is too long")));
        }
        let cval = CString::new(value).map_err(|_| Error::invalid("PMIx value with a NUL byte"))?;
        let mut v = PmixValue { kind: TYPE_STRING, data: PmixValueData { string: cval.as_ptr() as *mut c_char } };
        // SAFETY: key and value are valid C strings; PMIx_Put copies the value.
        let rc = unsafe { (self.api.put)(SCOPE_GLOBAL, ckey.as_ptr(), &mut v) };
        self.check(&format!("PMIx_Put({key})"), rc)?;
        // SAFETY: no arguments.
        let rc = unsafe { (self.api.commit)() };
        self.check("PMIx_Commit", rc)?;
        self.fence(key, true, timeout)?;
        (0..self.size)
            .map(|r| {
                let peer = PmixProc { rank: r as u32, ..self.me };
                match self.get(&peer, &ckey)? {
                    Got::Str(s) => Ok(s),
                    other => Err(err(&format!("{key} of rank {r}"), format!("not a string but {other}"))),
                }
            })
            .collect()
    }

    /// A barrier of the job's processes, out of band.
    pub(crate) fn barrier(&self, name: &str, timeout: Duration) -> Result<()> {
        self.fence(name, false, timeout)
    }
}

/// A value read with `PMIx_Get`.
enum Got {
    Str(String),
    Uint(u64),
    /// Another type (its `pmix_data_type_t`).
    Other(u16),
}

impl std::fmt::Display for Got {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Got::Str(s) => write!(f, "string {s:?}"),
            Got::Uint(n) => write!(f, "integer {n}"),
            Got::Other(t) => write!(f, "a value of PMIx type {t}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use core::mem::{align_of, offset_of, size_of};
    use std::process::Command;

    use super::*;

    /// The declarations above match the installed `pmix_common.h` (Debian:
    /// libpmix-dev, found with `pkg-config pmix`): sizes, offsets and the
    /// constants, as the C compiler sees them.
    #[test]
    fn layout_matches_the_installed_pmix_header() {
        let cflags = Command::new("pkg-config").args(["--cflags", "pmix"]).output();
        let cflags = match cflags {
            Ok(o) if o.status.success() => String::from_utf8(o.stdout).expect("UTF-8"),
            _ => panic!("`pkg-config --cflags pmix` fails: install libpmix-dev (scripts/setup.sh does)"),
        };
        let dir = std::env::temp_dir().join(format!("emp-pmix-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(
            &src,
            r#"#include <stdio.h>
#include <stddef.h>
#include <pmix.h>
int main(void)
{
	printf("proc %zu %zu %zu %zu\n", sizeof(pmix_proc_t), _Alignof(pmix_proc_t), offsetof(pmix_proc_t, nspace), offsetof(pmix_proc_t, rank));
	printf("value %zu %zu %zu %zu %zu\n", sizeof(pmix_value_t), _Alignof(pmix_value_t), offsetof(pmix_value_t, type), offsetof(pmix_value_t, data), sizeof(((pmix_value_t *)0)->data));
	printf("info %zu %zu %zu %zu\n", sizeof(pmix_info_t), offsetof(pmix_info_t, key), offsetof(pmix_info_t, flags), offsetof(pmix_info_t, value));
	printf("sizes %zu %zu %zu %zu\n", sizeof(pmix_data_type_t), sizeof(pmix_scope_t), sizeof(pmix_rank_t), sizeof(pmix_status_t));
	printf("consts %d %d %d %d %d %d %d %u %d\n", PMIX_MAX_NSLEN + 1, PMIX_MAX_KEYLEN + 1, PMIX_BOOL, PMIX_STRING, PMIX_INT, PMIX_UINT16, PMIX_UINT32, (unsigned)PMIX_RANK_WILDCARD, PMIX_GLOBAL);
	printf("keys %s %s %s %s\n", PMIX_COLLECT_DATA, PMIX_TIMEOUT, PMIX_JOB_SIZE, PMIX_LOCAL_RANK);
	printf("success %d\n", PMIX_SUCCESS);
	return 0;
}
"#,
        )
        .expect("write layout.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(cflags.split_whitespace())
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("a C compiler");
        assert!(out.status.success(), "compiling the PMIx layout check: {}", String::from_utf8_lossy(&out.stderr));
        let out = Command::new(&exe).output().expect("run the layout check");
        let _ = std::fs::remove_dir_all(&dir);
        let got = String::from_utf8(out.stdout).expect("UTF-8");
        let want = format!(
            "proc {} {} {} {}\nvalue {} {} {} {} {}\ninfo {} {} {} {}\nsizes {} {} {} {}\n\
             consts {NSPACE_LEN} {KEY_LEN} {TYPE_BOOL} {TYPE_STRING} {TYPE_INT} {TYPE_UINT16} {TYPE_UINT32} \
             {RANK_WILDCARD} {SCOPE_GLOBAL}\nkeys {} {} {} {}\nsuccess {SUCCESS}\n",
            size_of::<PmixProc>(),
            align_of::<PmixProc>(),
            offset_of!(PmixProc, nspace),
            offset_of!(PmixProc, rank),
            size_of::<PmixValue>(),
            align_of::<PmixValue>(),
            offset_of!(PmixValue, kind),
            offset_of!(PmixValue, data),
            size_of::<PmixValueData>(),
            size_of::<PmixInfo>(),
            offset_of!(PmixInfo, key),
            offset_of!(PmixInfo, flags),
            offset_of!(PmixInfo, value),
            size_of::<u16>(),
            size_of::<u8>(),
            size_of::<u32>(),
            size_of::<c_int>(),
            KEY_COLLECT_DATA.to_str().expect("ASCII"),
            KEY_TIMEOUT.to_str().expect("ASCII"),
            KEY_JOB_SIZE.to_str().expect("ASCII"),
            KEY_LOCAL_RANK.to_str().expect("ASCII"),
        );
        assert_eq!(got, want, "libemp's PMIx declarations (left: C header, right: Rust)");
    }

    #[test]
    fn keys_are_truncated_to_pmix_length() {
        let long = CString::new(vec![b'k'; 600]).expect("no NUL");
        let k = key_bytes(&long);
        assert_eq!(k[KEY_LEN - 1], 0);
        assert_eq!(k[KEY_LEN - 2], b'k' as c_char);
    }
}
