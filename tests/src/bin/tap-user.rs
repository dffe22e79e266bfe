//! Ordinary users, run inside a guest with `emp.ko` loaded, as a user who
//! is not root (the VM suite starts it through `su`):
//!
//!   tap-user           a member of the device's group: the port opens, and
//!                      RLIMIT_MEMLOCK decides what it may pin (ENOMEM
//!                      beyond it); every release path gives the charge back.
//!   tap-user --denied  a user outside the group: open fails with EACCES.
//!
//! The limit is the one the process was started with (`ulimit -l`); it
//! must be finite and at least 64 KiB.

use std::ffi::CString;

use emp_tests::Tap;
use emp_uapi::ioctl::{EmpDeregMr, EmpQuery, EmpRegMr, EMP_IOC_DEREG_MR, EMP_IOC_QUERY, EMP_IOC_REG_MR};
use emp_uapi::Le;

const DEVICE: &str = "/dev/emp-nic";
const PAGE: u64 = 4096;
const RW: u32 = 3;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn open_dev() -> Result<i32, i32> {
    let path = CString::new(DEVICE).expect("no NUL");
    // SAFETY: opening a path with a valid C string.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        Err(errno())
    } else {
        Ok(fd)
    }
}

fn close(fd: i32) {
    // SAFETY: closing a descriptor we own.
    unsafe { libc::close(fd) };
}

fn reg_mr(fd: i32, addr: u64, length: u64) -> Result<u32, i32> {
    let mut b = [0u8; EmpRegMr::SIZE];
    EmpRegMr { size: EmpRegMr::SIZE as u32, access: RW, addr, length, ..Default::default() }.put(&mut b);
    // SAFETY: the buffer is as large as the command says.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_REG_MR as _, b.as_mut_ptr()) };
    if r != 0 {
        Err(errno())
    } else {
        Ok(EmpRegMr::get(&b).key)
    }
}

fn dereg_mr(fd: i32, key: u32) -> Result<(), String> {
    let mut b = [0u8; EmpDeregMr::SIZE];
    EmpDeregMr { size: EmpDeregMr::SIZE as u32, key }.put(&mut b);
    // SAFETY: the buffer is as large as the command says.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_DEREG_MR as _, b.as_mut_ptr()) };
    if r != 0 {
        Err(format!("DEREG_MR: errno {}", errno()))
    } else {
        Ok(())
    }
}

/// Pages the NIC holds pinned for all ports (QUERY).
fn pinned(fd: i32) -> Result<u64, String> {
    let mut b = [0u8; EmpQuery::SIZE];
    EmpQuery { size: EmpQuery::SIZE as u32, ..Default::default() }.put(&mut b);
    // SAFETY: the buffer is as large as the command says.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_QUERY as _, b.as_mut_ptr()) };
    if r != 0 {
        return Err(format!("QUERY: errno {}", errno()));
    }
    Ok(EmpQuery::get(&b).pinned_pages)
}

/// A page-aligned private anonymous mapping of `len` bytes.
fn anon(len: u64) -> Result<u64, String> {
    // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(format!("mmap {len}: {}", std::io::Error::last_os_error()))
    } else {
        Ok(p as u64)
    }
}

fn expect_enomem(what: &str, r: Result<u32, i32>) -> Result<(), String> {
    match r {
        Err(libc::ENOMEM) => Ok(()),
        Err(e) => Err(format!("{what}: errno {e}, wanted ENOMEM")),
        Ok(_) => Err(format!("{what}: registered, wanted ENOMEM")),
    }
}

/// RLIMIT_MEMLOCK in bytes, rounded down to pages.
fn memlock_limit() -> Result<u64, String> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit into a live struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Err(format!("getrlimit: {}", std::io::Error::last_os_error()));
    }
    if lim.rlim_cur == libc::RLIM_INFINITY || lim.rlim_cur < 16 * PAGE {
        return Err(format!("RLIMIT_MEMLOCK {} is not a finite limit of at least 64 KiB", lim.rlim_cur));
    }
    Ok(lim.rlim_cur / PAGE * PAGE)
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--denied") {
        let mut t = Tap::new(1, false);
        t.check(
            &format!("{DEVICE} refuses a user outside its group: EACCES"),
            match open_dev() {
                Err(libc::EACCES) => Ok(()),
                Err(e) => Err(format!("errno {e}, wanted EACCES")),
                Ok(fd) => {
                    close(fd);
                    Err("the open succeeded".into())
                }
            },
        );
        std::process::exit(t.finish());
    }
    let mut t = Tap::new(6, false);
    // SAFETY: plain id queries.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let limit = memlock_limit();
    match &limit {
        Ok(l) => println!("# uid {uid} gid {gid}, RLIMIT_MEMLOCK {l} bytes"),
        Err(e) => println!("# uid {uid} gid {gid}: {e}"),
    }
    t.check("running as a user who is not root", if uid != 0 { Ok(()) } else { Err("uid 0".into()) });
    let fd = open_dev();
    t.check(
        &format!("a member of the device's group opens {DEVICE}"),
        fd.map(|_| ()).map_err(|e| format!("errno {e}")),
    );
    let (Ok(fd), Ok(limit)) = (fd, limit) else {
        std::process::exit(t.finish());
    };
    // Twice the limit plus a page: room for every test's registrations.
    let buf = match anon(2 * limit + PAGE) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("# {e}");
            std::process::exit(t.finish());
        }
    };
    t.check("within RLIMIT_MEMLOCK: pinning the whole limit works", within(fd, buf, limit));
    t.check(
        "beyond RLIMIT_MEMLOCK: ENOMEM, alone or on top of what is held, and nothing stays pinned",
        beyond(fd, buf, limit),
    );
    t.check("DEREG_MR and close give the charge back: the whole limit can be pinned again", released(fd, buf, limit));
    t.check("a process killed holding its whole limit leaves nothing pinned", killed(fd, buf, limit));
    close(fd);
    std::process::exit(t.finish());
}

fn within(fd: i32, buf: u64, limit: u64) -> Result<(), String> {
    let base = pinned(fd)?;
    let k = reg_mr(fd, buf, limit).map_err(|e| format!("REG_MR of {limit} bytes: errno {e}"))?;
    let held = pinned(fd)? - base;
    dereg_mr(fd, k)?;
    if held != limit / PAGE {
        return Err(format!("{held} pages pinned, wanted {}", limit / PAGE));
    }
    Ok(())
}

fn beyond(fd: i32, buf: u64, limit: u64) -> Result<(), String> {
    let base = pinned(fd)?;
    expect_enomem("one page over the limit", reg_mr(fd, buf, limit + PAGE))?;
    expect_enomem("twice the limit", reg_mr(fd, buf, 2 * limit))?;
    // Half the limit held: the other half fits, one page more does not.
    let half = limit / PAGE / 2 * PAGE;
    let a = reg_mr(fd, buf, half).map_err(|e| format!("first half: errno {e}"))?;
    let over = reg_mr(fd, buf + half, limit - half + PAGE);
    let rest = reg_mr(fd, buf + half, limit - half);
    dereg_mr(fd, a)?;
    if let Ok(k) = rest {
        dereg_mr(fd, k)?;
    }
    if let Ok(k) = over {
        let _ = dereg_mr(fd, k);
    }
    expect_enomem("the second half plus a page", over)?;
    rest.map_err(|e| format!("the second half: errno {e}"))?;
    let after = pinned(fd)?;
    if after != base {
        return Err(format!("{} pages still pinned after refusals", after - base));
    }
    Ok(())
}

fn released(fd: i32, buf: u64, limit: u64) -> Result<(), String> {
    for round in 0..3 {
        let k = reg_mr(fd, buf, limit).map_err(|e| format!("round {round}: errno {e}"))?;
        dereg_mr(fd, k)?;
    }
    // A port closed with the limit registered.
    let other = open_dev().map_err(|e| format!("second open: errno {e}"))?;
    let held = reg_mr(other, buf, limit).map(|_| ());
    close(other);
    held.map_err(|e| format!("on a second port: errno {e}"))?;
    let k = reg_mr(fd, buf, limit).map_err(|e| format!("after the close: errno {e}"))?;
    dereg_mr(fd, k)
}

fn killed(fd: i32, buf: u64, limit: u64) -> Result<(), String> {
    let base = pinned(fd)?;
    let mut ready = [0i32; 2];
    // SAFETY: a pipe into a live array.
    if unsafe { libc::pipe(ready.as_mut_ptr()) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fork in a single-threaded program; the child only makes
    // syscalls and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = open_dev().is_ok_and(|cfd| reg_mr(cfd, buf, limit).is_ok());
        let b = [ok as u8];
        // SAFETY: tell the parent, then wait to be killed.
        unsafe {
            libc::write(ready[1], b.as_ptr().cast(), 1);
            libc::pause();
            libc::_exit(0);
        }
    }
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a live buffer, then closing our pipe.
    let got = unsafe {
        let n = libc::read(ready[0], b.as_mut_ptr().cast(), 1);
        libc::close(ready[0]);
        libc::close(ready[1]);
        n
    };
    let during = pinned(fd)? - base;
    // SAFETY: killing and reaping our child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    let after = pinned(fd)? - base;
    if got != 1 || b[0] != 1 || during != limit / PAGE || after != 0 {
        return Err(format!("child registered: {}, pinned during {during}, after {after}", b[0]));
    }
    // The charge was the child's: ours still allows the whole limit.
    within(fd, buf, limit)
}
