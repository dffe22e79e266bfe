//! The data path makes no system call while the NIC is awake: post/poll
//! ping-pong and remote atomics between two ports (one through the Rust
//! API, one through the C ABI), on a thread under a seccomp filter that
//! traps every system call. Needs the release binaries and the signed image
//! (`make build`).
//!
//! The filter allows exactly two system calls, neither on the data path:
//! `rt_sigreturn`, which only the trap handler's return makes (so a trapped
//! call is recorded rather than killing the process), and `exit`, with
//! which the filtered thread ends (a filter cannot be removed). Every other
//! call, `clock_gettime` included (libemp reads the clock for its liveness
//! check; the vDSO must serve it), raises SIGSYS; the handler records the
//! call's number and makes it fail with ENOSYS.
//!
//! "Awake": the NICs are started with a spin time longer than the test, so
//! a post never needs the doorbell (the one system call a post may make, to
//! wake a sleeping NIC).

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use emp::ffi::{emp_alloc, emp_alloc_mr, emp_open_device, emp_poll_cq, emp_post_recv, emp_post_send, EmpWc};
use emp::ffi::{emp_query_port, EmpPortInfo};
use emp::{Completion, Device, Endpoint, Sge, Status, Width, MR_REMOTE_ATOMIC};
use emp_tests::harness::Cluster;

/// Round trips (send and receive each way) under the filter.
const ROUND_TRIPS: u64 = 20_000;
/// Remote fetch-and-adds under the filter.
const ATOMICS: u64 = 2_000;
/// Message size of the ping-pong.
const MSG: usize = 64;

/// Trapped system calls while armed, and the first few numbers.
static TRAPPED: AtomicU64 = AtomicU64::new(0);
static TRAPPED_NRS: [AtomicI64; 8] = [const { AtomicI64::new(-1) }; 8];
static ARMED: AtomicBool = AtomicBool::new(false);

/// The SIGSYS handler: records the system call (a SIGSYS siginfo holds its
/// number at byte 24: signo, errno, code, padding, call address) and makes
/// it return -ENOSYS. Async-signal-safe: atomics only.
extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a SIGSYS siginfo; `_syscall` is the int at
    // offset 24 of its union (include/uapi/asm-generic/siginfo.h, 64-bit).
    let nr = unsafe { *info.cast::<u8>().add(24).cast::<i32>() };
    if ARMED.load(Ordering::Relaxed) {
        let i = TRAPPED.fetch_add(1, Ordering::Relaxed) as usize;
        if let Some(slot) = TRAPPED_NRS.get(i) {
            slot.store(i64::from(nr), Ordering::Relaxed);
        }
    }
    // SAFETY: `ctx` is the interrupted context the kernel passes to an
    // SA_SIGINFO handler; RAX carries the skipped call's return value.
    unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_RAX as usize] = -i64::from(libc::ENOSYS) };
}

/// Installs the trap-everything filter on the calling thread.
fn install_filter() -> Result<(), String> {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const RET_KILL_PROCESS: u32 = 0x8000_0000;
    const RET_TRAP: u32 = 0x0003_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let prog = [
        op(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        op(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        op(RET_K, 0, 0, RET_KILL_PROCESS),
        op(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        op(JEQ_K, 2, 0, libc::SYS_rt_sigreturn as u32),
        op(JEQ_K, 1, 0, libc::SYS_exit as u32),
        op(RET_K, 0, 0, RET_TRAP),
        op(RET_K, 0, 0, RET_ALLOW),
    ];
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr().cast_mut() };
    // SAFETY: plain prctl calls; `fprog` points to a live program.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(format!("PR_SET_NO_NEW_PRIVS: {}", std::io::Error::last_os_error()));
        }
        if libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &fprog as *const libc::sock_fprog) != 0 {
            return Err(format!("PR_SET_SECCOMP: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

fn install_handler() {
    // SAFETY: a zeroed sigaction plus the fields we set is valid; the
    // handler only touches atomics and the context it is given.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigsys as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()), 0, "sigaction");
    }
}

/// Port B, driven through the C ABI as a C program would.
struct CPort {
    dev: *mut emp::ffi::EmpDevice,
    ep: Endpoint,
    buf: Sge,
    word: Sge,
    /// The word's region, as peers name it (key and secret).
    word_rkey: emp::RemoteKey,
}

// SAFETY: the device is used by one thread at a time (moved to the loop thread).
unsafe impl Send for CPort {}

/// What the filtered loop saw, for the test thread to judge.
#[derive(Debug, Default)]
struct Outcome {
    round_trips: u64,
    atomics: u64,
    last_old: u64,
    error: Option<&'static str>,
    elapsed: Duration,
}

/// Waits (busy-polling, through the Rust API) for one completion on `a`.
fn poll_a(a: &mut Device, deadline: Instant) -> Result<Completion, &'static str> {
    let mut wc = [Completion::default(); 4];
    loop {
        match a.try_poll_cq(&mut wc[..1]) {
            Ok(1) if wc[0].status == Status::Success => return Ok(wc[0]),
            Ok(1) => return Err("port A: error completion"),
            Ok(_) => {}
            Err(_) => return Err("port A: poll failed"),
        }
        if Instant::now() > deadline {
            return Err("port A: timeout");
        }
    }
}

/// Waits for one completion on `b` through `emp_poll_cq`.
fn poll_b(b: &CPort, deadline: Instant) -> Result<EmpWc, &'static str> {
    // SAFETY: EmpWc is plain data.
    let mut wc: [EmpWc; 4] = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `b.dev` is open, `wc` holds 4 entries.
        match unsafe { emp_poll_cq(b.dev, wc.as_mut_ptr(), 1) } {
            1 if wc[0].status == Status::Success as u32 => {
                let [first, ..] = wc;
                return Ok(first);
            }
            1 => return Err("port B: error completion"),
            0 => {}
            _ => return Err("port B: poll failed"),
        }
        if Instant::now() > deadline {
            return Err("port B: timeout");
        }
    }
}

/// The measured loop: no allocation, no printing, no panics on the way.
fn data_path(
    a: &mut Device,
    (abuf, ares): (Sge, Sge),
    b: &CPort,
    deadline: Instant,
    round_trips: u64,
    atomics: u64,
) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome::default();
    let r: Result<(), &'static str> = (|| {
        let bep = b.ep;
        let aep = a.endpoint();
        for i in 0..round_trips {
            // SAFETY: `b.dev` is open; one SGE.
            if unsafe { emp_post_recv(b.dev, 2 * i, aep.node, aep.port, i, 0, &b.buf, 1) } != 0 {
                return Err("port B: post_recv");
            }
            a.post_recv(2 * i + 1, bep, i, 0, &[abuf]).map_err(|_| "port A: post_recv")?;
            a.post_send(2 * i, bep, i, &[abuf]).map_err(|_| "port A: post_send")?;
            // B: its receive, then the reply.
            let got = poll_b(b, deadline)?;
            if got.is_recv == 0 || got.tag != i || got.byte_len as usize != MSG {
                return Err("port B: wrong receive");
            }
            // SAFETY: as above.
            if unsafe { emp_post_send(b.dev, 2 * i + 1, aep.node, aep.port, i, &b.buf, 1) } != 0 {
                return Err("port B: post_send");
            }
            // A: its send's completion and the reply, in either order.
            let (mut sent, mut replied) = (false, false);
            while !(sent && replied) {
                let c = poll_a(a, deadline)?;
                if c.is_recv {
                    replied = true;
                } else {
                    sent = true;
                }
            }
            poll_b(b, deadline)?; // B's send completion
            out.round_trips += 1;
        }
        let word = emp::RemoteWord { key: b.word_rkey, offset: b.word.offset, width: Width::W64 };
        for i in 0..atomics {
            a.post_fetch_add(1_000_000 + i, bep, word, 1, ares).map_err(|_| "port A: post_fetch_add")?;
            let c = poll_a(a, deadline)?;
            if i > 0 && c.old != out.last_old + 1 {
                return Err("fetch_add: wrong old value");
            }
            out.last_old = c.old;
            out.atomics += 1;
        }
        Ok(())
    })();
    out.error = r.err();
    out.elapsed = start.elapsed();
    out
}

#[test]
fn the_data_path_makes_no_system_call() {
    let c = Cluster::up("nosyscall", &["-n", "2", "--nicd-args", "--spin-us 600000000"]);
    let mut a = Device::open_path(&c.sock(0)).expect("open port A");
    let abuf = a.alloc(MSG).expect("alloc").sge(0, MSG);
    let ares = a.alloc(8).expect("alloc").sge(0, 8);
    let path = CString::new(c.sock(1)).expect("path");
    let mut err = 0;
    // SAFETY: a valid C string and a writable int.
    let bdev = unsafe { emp_open_device(path.as_ptr(), &mut err) };
    assert!(!bdev.is_null(), "open port B: {err}");
    // SAFETY: EmpPortInfo is plain data; `bdev` is open.
    let mut info: EmpPortInfo = unsafe { std::mem::zeroed() };
    // SAFETY: `bdev` is open, `info` writable.
    assert_eq!(unsafe { emp_query_port(bdev, &mut info) }, 0);
    let (mut key, mut off, mut wkey, mut woff) = (0u32, 0u64, 0u32, 0u64);
    // SAFETY: `bdev` is open; the out-pointers are writable.
    let (p, w) = unsafe {
        (
            emp_alloc(bdev, MSG, &mut key, &mut off),
            emp_alloc_mr(bdev, 64, MR_REMOTE_ATOMIC as u32, &mut wkey, &mut woff),
        )
    };
    assert!(!p.is_null() && !w.is_null(), "port B alloc");
    let mut rkey = 0u64;
    // SAFETY: `bdev` is open; `rkey` is writable.
    assert_eq!(unsafe { emp::ffi::emp_remote_key(bdev, wkey, &mut rkey) }, 0, "port B remote key");
    let b = CPort {
        dev: bdev,
        ep: Endpoint { node: info.node, port: info.port },
        buf: Sge { key, offset: off, len: MSG as u32 },
        word: Sge { key: wkey, offset: woff, len: 8 },
        word_rkey: emp::RemoteKey::from_u64(rkey),
    };
    install_handler();

    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Outcome, String>>(1);
    // The filtered thread never returns (it ends with a raw `exit`), so
    // it is not joined; it owns the devices, which it cannot close.
    let _ = std::thread::spawn(move || {
        let warm_deadline = Instant::now() + Duration::from_secs(30);
        // Warm-up outside the filter: first-touch faults, lazily bound
        // symbols, and a NIC that is awake.
        let warm = data_path(&mut a, (abuf, ares), &b, warm_deadline, 100, 10);
        if let Some(e) = warm.error {
            let _ = tx.send(Err(format!("warm-up: {e}")));
            return;
        }
        if let Err(e) = install_filter() {
            let _ = tx.send(Err(e));
            return;
        }
        ARMED.store(true, Ordering::SeqCst);
        let outcome =
            data_path(&mut a, (abuf, ares), &b, Instant::now() + Duration::from_secs(120), ROUND_TRIPS, ATOMICS);
        ARMED.store(false, Ordering::SeqCst);
        // Disarmed: whatever the hand-over costs is not the data path (a
        // call it would make fails with ENOSYS; the receiver never blocks).
        let _ = tx.try_send(Ok(outcome));
        std::mem::forget((a, b));
        // SAFETY: ends this thread only; `exit` is allowed by the filter.
        unsafe { libc::syscall(libc::SYS_exit, 0) };
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    let outcome = loop {
        match rx.try_recv() {
            Ok(r) => break r,
            Err(std::sync::mpsc::TryRecvError::Empty) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("the filtered thread did not report: {e}"),
        }
    };
    let o = outcome.unwrap_or_else(|e| panic!("{e}"));
    let trapped = TRAPPED.load(Ordering::SeqCst);
    let nrs: Vec<i64> = TRAPPED_NRS.iter().map(|n| n.load(Ordering::SeqCst)).filter(|&n| n >= 0).collect();
    eprintln!(
        "{} round trips and {} fetch-adds in {:?} under seccomp; {trapped} system calls trapped {nrs:?}",
        o.round_trips, o.atomics, o.elapsed
    );
    assert_eq!(trapped, 0, "system calls on the data path (numbers {nrs:?}); outcome {o:?}");
    assert_eq!(o.error, None, "the loop failed: {o:?}");
    assert_eq!((o.round_trips, o.atomics), (ROUND_TRIPS, ATOMICS));
    assert_eq!(o.last_old, 10 + ATOMICS - 1, "warm-up and loop fetch-adds, once each");
}
