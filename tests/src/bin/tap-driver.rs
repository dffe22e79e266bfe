//! Driver TAP tests, run inside a guest with `emp.ko` loaded: `/dev/emp-nic`
//! hands out one port per open file; QUERY and mmap refuse bad arguments
//! with clean errnos.

use std::ffi::CString;

use emp_tests::Tap;
use emp_uapi::ioctl::{ioc, EmpQuery, EMP_IOC_MAGIC, EMP_IOC_QUERY};
use emp_uapi::Le;

fn open_dev() -> Result<i32, String> {
    let path = CString::new("/dev/emp-nic").expect("no NUL");
    // SAFETY: opening a path with a valid C string.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 { Err(format!("open: {}", std::io::Error::last_os_error())) } else { Ok(fd) }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn query(fd: i32) -> Result<EmpQuery, String> {
    let mut b = [0u8; EmpQuery::SIZE];
    EmpQuery { size: EmpQuery::SIZE as u32, ..Default::default() }.put(&mut b);
    // SAFETY: the buffer is as large as the command says.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_QUERY as _, b.as_mut_ptr()) };
    if r != 0 {
        return Err(format!("QUERY: {}", std::io::Error::last_os_error()));
    }
    Ok(EmpQuery::get(&b))
}

fn expect_errno(what: &str, r: i64, want: i32) -> Result<(), String> {
    let e = errno();
    if r == -1 && e == want { Ok(()) } else { Err(format!("{what}: returned {r}, errno {e}, wanted {want}")) }
}

fn main() {
    let mut t = Tap::new(8, false);
    let fd = open_dev();
    t.check("open /dev/emp-nic", fd.as_ref().map(|_| ()).map_err(|e| e.clone()));
    let Ok(fd) = fd else { std::process::exit(t.finish()) };
    let q = query(fd);
    t.check(
        "QUERY reports the port and its window",
        match &q {
            Ok(q) if q.window_size > 0 && q.window_size % 4096 == 0 && q.send_entries.is_power_of_two() && q.mtu >= 256 => Ok(()),
            Ok(q) => Err(format!("implausible: {q:?}")),
            Err(e) => Err(e.clone()),
        },
    );
    let win = q.map(|q| q.window_size as usize).unwrap_or(4096);
    let fd2 = open_dev().unwrap_or(-1);
    t.check(
        "a second open gets another port",
        match (query(fd), query(fd2)) {
            (Ok(a), Ok(b)) if a.port != b.port => Ok(()),
            (a, b) => Err(format!("{a:?} / {b:?}")),
        },
    );
    // SAFETY: closing a descriptor we own.
    unsafe { libc::close(fd2) };
    let mut bad = [0u8; EmpQuery::SIZE];
    EmpQuery { size: 7, ..Default::default() }.put(&mut bad);
    // SAFETY: valid buffer; the size field is wrong on purpose.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_QUERY as _, bad.as_mut_ptr()) };
    t.check("QUERY with a wrong size: EINVAL", expect_errno("QUERY", r as i64, libc::EINVAL));
    // SAFETY: an invalid user pointer: the kernel must refuse, not fault.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_QUERY as _, 16usize as *mut u8) };
    t.check("QUERY with a bad pointer: EFAULT", expect_errno("QUERY", r as i64, libc::EFAULT));
    // SAFETY: an unknown command.
    let r = unsafe { libc::ioctl(fd, ioc(0, EMP_IOC_MAGIC, 0x7f, 0) as _, 0) };
    t.check("unknown ioctl: ENOTTY", expect_errno("ioctl", r as i64, libc::ENOTTY));
    let map = |len: usize, prot: i32, off: i64| {
        // SAFETY: asking the kernel for a new mapping; no existing memory is touched.
        unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, off) }
    };
    let p = map(win, libc::PROT_READ | libc::PROT_WRITE, 0);
    t.check(
        "mmap of the whole window at offset 0 works",
        if p == libc::MAP_FAILED { Err(format!("mmap: {}", std::io::Error::last_os_error())) } else { Ok(()) },
    );
    let refused = [
        ("wrong size", map(win + 4096, libc::PROT_READ, 0), libc::EINVAL),
        ("nonzero offset", map(win, libc::PROT_READ, 4096), libc::EINVAL),
        ("executable", map(win, libc::PROT_READ | libc::PROT_EXEC, 0), libc::EPERM),
    ];
    let bad: Vec<String> = refused
        .iter()
        .filter(|(_, p, _)| *p != libc::MAP_FAILED)
        .map(|(w, _, _)| w.to_string())
        .collect();
    t.check("mmap out of range, wrong size or executable: refused", if bad.is_empty() { Ok(()) } else { Err(format!("accepted: {bad:?}")) });
    // SAFETY: closing our descriptor; the mapping stays valid until unmapped.
    unsafe { libc::close(fd) };
    std::process::exit(t.finish());
}
