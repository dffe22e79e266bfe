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
    let mut t = Tap::new(9, false);
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
    t.check("unbind with a port open and mapped: the mapping is torn down, the port answers ENODEV", unbind_with_port_open(fd, win));
    // SAFETY: closing our descriptor.
    unsafe { libc::close(fd) };
    std::process::exit(t.finish());
}

/// A child maps its port window and waits; the device is unbound; the
/// child's next touch of the window must fault (SIGBUS), and the parent's
/// still-open port must refuse requests.
fn unbind_with_port_open(fd: i32, win: usize) -> Result<(), String> {
    let dev = std::fs::read_dir("/sys/bus/pci/drivers/emp")
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("0000:"))
        .ok_or("no device bound to emp")?;
    let mut ready = [0i32; 2];
    let mut go = [0i32; 2];
    // SAFETY: creating pipes into live arrays.
    unsafe {
        libc::pipe(ready.as_mut_ptr());
        libc::pipe(go.as_mut_ptr());
    }
    // SAFETY: fork in a single-threaded test program.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // Child: its own port, mapped.
        let cfd = open_dev().unwrap_or(-1);
        // SAFETY: a new shared mapping of our port window.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), win, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, cfd, 0) };
        if p == libc::MAP_FAILED {
            // SAFETY: exiting the child.
            unsafe { libc::_exit(3) };
        }
        // SAFETY: the mapping is live; touching it proves it works.
        unsafe { std::ptr::write_volatile(p.cast::<u8>().add(16), 1) };
        let mut b = [0u8; 1];
        // SAFETY: pipe I/O on live buffers.
        unsafe {
            libc::write(ready[1], b.as_ptr().cast(), 1);
            libc::read(go[0], b.as_mut_ptr().cast(), 1);
            // After the unbind this must fault.
            std::ptr::read_volatile(p.cast::<u8>().add(16));
            libc::_exit(0);
        }
    }
    let mut b = [0u8; 1];
    // SAFETY: pipe I/O on live buffers.
    unsafe { libc::read(ready[0], b.as_mut_ptr().cast(), 1) };
    std::fs::write("/sys/bus/pci/drivers/emp/unbind", &dev).map_err(|e| format!("unbind: {e}"))?;
    // SAFETY: as above.
    unsafe { libc::write(go[1], b.as_ptr().cast(), 1) };
    let mut status = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let killed_by_bus = libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS;
    if !killed_by_bus {
        return Err(format!("the child's mapping survived the unbind (status {status:#x})"));
    }
    let mut q = [0u8; EmpQuery::SIZE];
    EmpQuery { size: EmpQuery::SIZE as u32, ..Default::default() }.put(&mut q);
    // SAFETY: valid buffer.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_QUERY as _, q.as_mut_ptr()) };
    expect_errno("QUERY after unbind", r as i64, libc::ENODEV)
}
