//! Driver TAP tests, run inside a guest with `emp.ko` loaded: `/dev/emp-nic`
//! hands out one port per open file; QUERY, mmap, memory registration,
//! events and groups refuse bad arguments with clean errnos, argument
//! structs of older and newer sizes are served as `copy_struct_from_user`
//! does, and a dying process leaves nothing behind.

use std::ffi::CString;

use emp_tests::Tap;
use emp_uapi::coll::{TREE_ROOT, TREE_ROOT_WIDE};
use emp_uapi::ioctl::{
    ioc, EmpArm, EmpDeregMr, EmpGroupClear, EmpGroupSet, EmpQuery, EmpRegMr, EmpSetEventfd, EmpStart, IoctlArg,
    IoctlCmd, EMP_IOC_ARM, EMP_IOC_DEREG_MR, EMP_IOC_GROUP_CLEAR, EMP_IOC_GROUP_SET, EMP_IOC_MAGIC, EMP_IOC_QUERY,
    EMP_IOC_REG_MR, EMP_IOC_SET_EVENTFD, EMP_IOC_START,
};
use emp_uapi::sram::GroupEntry;
use emp_uapi::Le;

fn open_dev() -> Result<i32, String> {
    let path = CString::new("/dev/emp-nic").expect("no NUL");
    // SAFETY: opening a path with a valid C string.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        Err(format!("open: {}", std::io::Error::last_os_error()))
    } else {
        Ok(fd)
    }
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
    if r == -1 && e == want {
        Ok(())
    } else {
        Err(format!("{what}: returned {r}, errno {e}, wanted {want}"))
    }
}

fn main() {
    let mut t = Tap::new(26, false);
    let fd = open_dev();
    t.check("open /dev/emp-nic", fd.as_ref().map(|_| ()).map_err(|e| e.clone()));
    let Ok(fd) = fd else { std::process::exit(t.finish()) };
    let q = query(fd);
    t.check(
        "QUERY reports the port and its window",
        match &q {
            Ok(q)
                if q.window_size > 0
                    && q.window_size % 4096 == 0
                    && q.send_entries.is_power_of_two()
                    && q.mtu >= 256 =>
            {
                Ok(())
            }
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
    t.check("unknown ioctl number, type or direction: ENOTTY", unknown_commands(fd));
    t.check("older, shorter argument structs are zero-extended and work", older_structs(fd));
    t.check("newer, longer argument structs with a zero tail work", newer_structs(fd));
    t.check("newer argument structs with a non-zero tail: E2BIG", unknown_tails(fd));
    t.check(
        "argument structs below their first version, or whose size field is not the command's: EINVAL",
        bad_sizes(fd),
    );
    let map = |len: usize, prot: i32, off: i64| {
        // SAFETY: asking the kernel for a new mapping; no existing memory is touched.
        unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, off) }
    };
    let p = map(win, libc::PROT_READ | libc::PROT_WRITE, 0);
    t.check(
        "mmap of the whole window at offset 0 works",
        if p == libc::MAP_FAILED { Err(format!("mmap: {}", std::io::Error::last_os_error())) } else { Ok(()) },
    );
    // SAFETY: asking the kernel for a new mapping; no existing memory is touched.
    let private = unsafe { libc::mmap(std::ptr::null_mut(), win, libc::PROT_READ, libc::MAP_PRIVATE, fd, 0) };
    let refused = [
        ("wrong size", map(win + 4096, libc::PROT_READ, 0), libc::EINVAL),
        ("nonzero offset", map(win, libc::PROT_READ, 4096), libc::EINVAL),
        ("executable", map(win, libc::PROT_READ | libc::PROT_EXEC, 0), libc::EPERM),
        ("private", private, libc::EINVAL),
    ];
    let bad: Vec<String> =
        refused.iter().filter(|(_, p, _)| *p != libc::MAP_FAILED).map(|(w, _, _)| w.to_string()).collect();
    t.check(
        "mmap out of range, wrong size, executable or private: refused",
        if bad.is_empty() { Ok(()) } else { Err(format!("accepted: {bad:?}")) },
    );
    registration_tests(&mut t, fd);
    t.check("SET_EVENTFD and ARM refuse bad arguments with clean errnos", event_arg_tests(fd));
    group_tests(&mut t);
    t.check(
        "signal-on-packet: an armed port's eventfd wakes an epoll waiter when a message arrives",
        signal_on_packet(),
    );
    t.check(
        "unbind with a port open and mapped: the mapping is torn down, the port answers ENODEV",
        unbind_with_port_open(fd, win),
    );
    // SAFETY: closing our descriptor.
    unsafe { libc::close(fd) };
    std::process::exit(t.finish());
}

// ---------------------------------------------------------------------------
// Argument struct sizes (`copy_struct_from_user` semantics)
// ---------------------------------------------------------------------------

/// What the caller's buffer holds past its struct: the driver must neither
/// read it (a shorter struct is zero-extended) nor write it.
const GUARD: u8 = 0xA5;

/// The buffer of a caller whose struct `T` is `size` bytes: `v` encoded
/// with its `size` field set, cut at `size` or followed by zeros up to it
/// (a newer caller's fields this driver does not know), then guard bytes.
fn sized_arg<T: IoctlArg>(v: &T, size: usize) -> Vec<u8> {
    let mut b = vec![GUARD; size.max(T::SIZE) + 16];
    v.put(&mut b[..T::SIZE]);
    b[T::SIZE..size.max(T::SIZE)].fill(0);
    b[..4].copy_from_slice(&(size as u32).to_le_bytes());
    b[size..].fill(GUARD);
    b
}

/// `cmd` with an argument struct of `size` bytes (the command number is
/// built with that size, as a caller compiled against it would).
fn ioctl_sized(fd: i32, cmd: IoctlCmd, b: &mut [u8], size: usize) -> Result<(), i32> {
    assert!(b.len() >= size);
    // SAFETY: the buffer holds at least the `size` bytes the command says.
    let r = unsafe { libc::ioctl(fd, cmd.with_size(size) as _, b.as_mut_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// The guard past the caller's `size` bytes is intact.
fn guard_intact(b: &[u8], size: usize, what: &str) -> Result<(), String> {
    match b[size..].iter().position(|&x| x != GUARD) {
        None => Ok(()),
        Some(i) => Err(format!("{what}: the driver wrote byte {} past the caller's {size}", size + i)),
    }
}

fn unknown_commands(fd: i32) -> Result<(), String> {
    let cases = [
        ("number 0x7f", ioc(0, EMP_IOC_MAGIC, 0x7f, 0)),
        ("number 11 (after GANG)", ioc(3, EMP_IOC_MAGIC, 11, EmpQuery::SIZE)),
        ("QUERY's number, another type", ioc(3, b'F' as u32, 1, EmpQuery::SIZE)),
        ("QUERY's number, write-only", ioc(1, EMP_IOC_MAGIC, 1, EmpQuery::SIZE)),
        ("ARM's number, read-write", ioc(3, EMP_IOC_MAGIC, 4, EmpArm::SIZE)),
    ];
    let mut wrong = Vec::new();
    for (what, cmd) in cases {
        let mut b = [0u8; 128];
        b[..4].copy_from_slice(&(EmpQuery::SIZE as u32).to_le_bytes());
        // SAFETY: a valid buffer larger than any size these commands carry.
        let r = unsafe { libc::ioctl(fd, cmd as _, b.as_mut_ptr()) };
        if let Err(e) = expect_errno(what, r as i64, libc::ENOTTY) {
            wrong.push(e);
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// QUERY at its first version (48 bytes), REG_MR at 32 and GROUP_SET at 16
/// bytes. The guard past GROUP_SET's 16 bytes would be non-zero reserved
/// fields (`EINVAL`) if the driver read them instead of zero-extending.
fn older_structs(fd: i32) -> Result<(), String> {
    let full = query(fd)?;
    let mut b = sized_arg(&EmpQuery::default(), 48);
    ioctl_sized(fd, IoctlCmd::Query, &mut b, 48).map_err(|e| format!("QUERY at 48 bytes: errno {e}"))?;
    let q = EmpQuery::get(&b[..EmpQuery::SIZE]);
    if (q.size, q.port, q.node_id, q.mtu, q.window_size, q.port_count)
        != (48, full.port, full.node_id, full.mtu, full.window_size, full.port_count)
    {
        return Err(format!("QUERY at 48 bytes returned {q:?}, the full QUERY {full:?}"));
    }
    guard_intact(&b, 48, "QUERY at 48 bytes")?;

    let buf = anon(65536);
    let base = pinned(fd);
    let mut b = sized_arg(&EmpRegMr { access: 3, addr: buf, length: 8192, ..Default::default() }, 32);
    ioctl_sized(fd, IoctlCmd::RegMr, &mut b, 32).map_err(|e| format!("REG_MR at 32 bytes: errno {e}"))?;
    // The key lies inside the caller's 32 bytes.
    let key = EmpRegMr::get(&b[..EmpRegMr::SIZE]).key;
    let held = pinned(fd) - base;
    guard_intact(&b, 32, "REG_MR at 32 bytes")?;
    dereg_mr(fd, key).map_err(|e| format!("DEREG_MR of the key REG_MR at 32 bytes returned: errno {e}"))?;
    if held != 2 {
        return Err(format!("REG_MR at 32 bytes of 8 KiB pinned {held} pages"));
    }

    let (gfd, gq) = started_port()?;
    let r = (|| {
        let mut eb = vec![0u8; GroupEntry::SIZE];
        group_entry(&gq, 11, 1).put(&mut eb);
        let mut b = sized_arg(&EmpGroupSet { entry: eb.as_ptr() as u64, ..Default::default() }, 16);
        ioctl_sized(gfd, IoctlCmd::GroupSet, &mut b, 16).map_err(|e| format!("GROUP_SET at 16 bytes: errno {e}"))?;
        let slot = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        guard_intact(&b, 16, "GROUP_SET at 16 bytes")?;
        group_clear(gfd, slot).map_err(|e| format!("GROUP_CLEAR of slot {slot}: errno {e}"))
    })();
    close(gfd);
    r
}

/// QUERY and REG_MR with 16 and 4000 bytes more than the driver knows, all
/// zero: served, and the caller's tail is left as it was.
fn newer_structs(fd: i32) -> Result<(), String> {
    let full = query(fd)?;
    for size in [EmpQuery::SIZE + 16, 4000] {
        let mut b = sized_arg(&EmpQuery::default(), size);
        ioctl_sized(fd, IoctlCmd::Query, &mut b, size).map_err(|e| format!("QUERY at {size} bytes: errno {e}"))?;
        let q = EmpQuery::get(&b[..EmpQuery::SIZE]);
        if (q.size as usize, q.port, q.window_size, q.group_entries)
            != (size, full.port, full.window_size, full.group_entries)
        {
            return Err(format!("QUERY at {size} bytes returned {q:?}, the full QUERY {full:?}"));
        }
        if b[EmpQuery::SIZE..size].iter().any(|&x| x != 0) {
            return Err(format!("QUERY at {size} bytes: the driver wrote past its own struct"));
        }
        guard_intact(&b, size, "QUERY")?;
    }
    let buf = anon(65536);
    let size = EmpRegMr::SIZE + 16;
    let mut b = sized_arg(&EmpRegMr { access: 3, addr: buf, length: 4096, ..Default::default() }, size);
    ioctl_sized(fd, IoctlCmd::RegMr, &mut b, size).map_err(|e| format!("REG_MR at {size} bytes: errno {e}"))?;
    guard_intact(&b, size, "REG_MR")?;
    dereg_mr(fd, EmpRegMr::get(&b[..EmpRegMr::SIZE]).key).map_err(|e| format!("DEREG_MR: errno {e}"))
}

/// A non-zero byte anywhere past the driver's struct: `E2BIG`, nothing done.
fn unknown_tails(fd: i32) -> Result<(), String> {
    let base = pinned(fd);
    let buf = anon(65536);
    let mut wrong = Vec::new();
    let mut expect = |what: String, got: Result<(), i32>| {
        if got != Err(libc::E2BIG) {
            wrong.push(format!("{what}: {got:?}, want errno {}", libc::E2BIG));
        }
    };
    for (size, at) in [(EmpQuery::SIZE + 16, EmpQuery::SIZE), (EmpQuery::SIZE + 16, EmpQuery::SIZE + 15), (4000, 3999)]
    {
        let mut b = sized_arg(&EmpQuery::default(), size);
        b[at] = 1;
        expect(format!("QUERY at {size} bytes, byte {at} set"), ioctl_sized(fd, IoctlCmd::Query, &mut b, size));
    }
    let size = EmpRegMr::SIZE + 8;
    let mut b = sized_arg(&EmpRegMr { access: 3, addr: buf, length: 4096, ..Default::default() }, size);
    b[size - 1] = 0x80;
    expect(format!("REG_MR at {size} bytes, last byte set"), ioctl_sized(fd, IoctlCmd::RegMr, &mut b, size));
    let size = EmpArm::SIZE + 4;
    let mut b = sized_arg(&EmpArm { events: 1, ..Default::default() }, size);
    b[EmpArm::SIZE] = 1;
    expect(format!("ARM at {size} bytes, byte 8 set"), ioctl_sized(fd, IoctlCmd::Arm, &mut b, size));
    if pinned(fd) != base {
        wrong.push(format!("a refused REG_MR pinned {} pages", pinned(fd) - base));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

fn bad_sizes(fd: i32) -> Result<(), String> {
    let mut wrong = Vec::new();
    let mut expect = |what: &str, got: Result<(), i32>| {
        if got != Err(libc::EINVAL) {
            wrong.push(format!("{what}: {got:?}, want errno {}", libc::EINVAL));
        }
    };
    let mut b = sized_arg(&EmpQuery::default(), 40);
    expect("QUERY at 40 bytes (first version 48)", ioctl_sized(fd, IoctlCmd::Query, &mut b, 40));
    let mut b = sized_arg(&EmpRegMr::default(), 24);
    expect("REG_MR at 24 bytes (first version 32)", ioctl_sized(fd, IoctlCmd::RegMr, &mut b, 24));
    let mut b = sized_arg(&EmpDeregMr::default(), 4);
    expect("DEREG_MR at 4 bytes (first version 8)", ioctl_sized(fd, IoctlCmd::DeregMr, &mut b, 4));
    let mut b = sized_arg(&EmpQuery::default(), 0);
    expect("QUERY at 0 bytes", ioctl_sized(fd, IoctlCmd::Query, &mut b, 0));
    let mut b = sized_arg(&EmpQuery::default(), 96);
    b[..4].copy_from_slice(&(EmpQuery::SIZE as u32).to_le_bytes());
    expect("QUERY at 96 bytes whose size field says 80", ioctl_sized(fd, IoctlCmd::Query, &mut b, 96));
    let mut b = sized_arg(&EmpQuery::default(), 48);
    b[..4].copy_from_slice(&(EmpQuery::SIZE as u32).to_le_bytes());
    expect("QUERY at 48 bytes whose size field says 80", ioctl_sized(fd, IoctlCmd::Query, &mut b, 48));
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

fn reg_mr(fd: i32, addr: u64, length: u64, access: u32) -> Result<u32, i32> {
    let mut b = [0u8; EmpRegMr::SIZE];
    EmpRegMr { size: EmpRegMr::SIZE as u32, access, addr, length, ..Default::default() }.put(&mut b);
    // SAFETY: the buffer is as large as the command says.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_REG_MR as _, b.as_mut_ptr()) };
    if r != 0 {
        Err(errno())
    } else {
        Ok(EmpRegMr::get(&b).key)
    }
}

fn dereg_mr(fd: i32, key: u32) -> Result<(), i32> {
    let mut b = [0u8; EmpDeregMr::SIZE];
    EmpDeregMr { size: EmpDeregMr::SIZE as u32, key }.put(&mut b);
    // SAFETY: the buffer is as large as the command says.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_DEREG_MR as _, b.as_mut_ptr()) };
    if r != 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

fn pinned(fd: i32) -> u64 {
    query(fd).map(|q| q.pinned_pages).unwrap_or(u64::MAX)
}

fn anon(len: usize) -> u64 {
    // SAFETY: a fresh private anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    p as u64
}

fn registration_tests(t: &mut Tap, fd: i32) {
    const RW: u32 = 3;
    let buf = anon(1 << 20);
    let base = pinned(fd);
    t.check(
        "REG_MR pins, DEREG_MR unpins (driver counter)",
        (|| {
            let k = reg_mr(fd, buf + 100, 300_000, RW).map_err(|e| format!("reg: errno {e}"))?;
            let held = pinned(fd) - base;
            dereg_mr(fd, k).map_err(|e| format!("dereg: errno {e}"))?;
            if held != 74 || pinned(fd) != base {
                return Err(format!("pinned {held} pages (want 74), after dereg {}", pinned(fd) - base));
            }
            Ok(())
        })(),
    );
    let bad: [(&str, Result<u32, i32>, i32); 5] = [
        ("unmapped address", reg_mr(fd, 16, 4096, RW), libc::EFAULT),
        ("zero length", reg_mr(fd, buf, 0, RW), libc::EINVAL),
        ("huge length", reg_mr(fd, buf, 1 << 40, RW), libc::EINVAL),
        ("no access bits", reg_mr(fd, buf, 4096, 0), libc::EINVAL),
        ("unknown access bits", reg_mr(fd, buf, 4096, 0x100), libc::EINVAL),
    ];
    let wrong: Vec<String> = bad
        .iter()
        .filter(|(_, r, want)| *r != Err(*want))
        .map(|(w, r, want)| format!("{w}: {r:?}, want errno {want}"))
        .collect();
    t.check(
        "REG_MR refuses bad arguments with clean errnos",
        if wrong.is_empty() { Ok(()) } else { Err(wrong.join("; ")) },
    );
    t.check(
        "overlapping registrations, double DEREG_MR: ENOENT",
        (|| {
            let a = reg_mr(fd, buf, 65536, RW).map_err(|e| format!("a: {e}"))?;
            let b = reg_mr(fd, buf + 4096, 65536, RW).map_err(|e| format!("b: {e}"))?;
            dereg_mr(fd, a).map_err(|e| format!("dereg a: {e}"))?;
            let again = dereg_mr(fd, a);
            dereg_mr(fd, b).map_err(|e| format!("dereg b: {e}"))?;
            if again != Err(libc::ENOENT) {
                Err(format!("second dereg: {again:?}"))
            } else {
                Ok(())
            }
        })(),
    );
    t.check(
        "another port's key: ENOENT",
        (|| {
            let other = open_dev()?;
            let k = reg_mr(other, buf, 4096, RW).map_err(|e| format!("reg: {e}"))?;
            let r = dereg_mr(fd, k);
            // SAFETY: closing our descriptor (releases its registration).
            unsafe { libc::close(other) };
            if r != Err(libc::ENOENT) {
                Err(format!("{r:?}"))
            } else {
                Ok(())
            }
        })(),
    );
    t.check("RLIMIT_MEMLOCK is enforced for an unprivileged process", rlimit_test());
    t.check("a process killed with registered memory leaves no pinned pages", killed_test(fd, base));
}

/// In a child: open, drop root (and CAP_IPC_LOCK), cap RLIMIT_MEMLOCK at
/// 64 KiB; 32 KiB may be pinned, 1 MiB may not.
fn rlimit_test() -> Result<(), String> {
    // SAFETY: fork in a single-threaded program.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = (|| {
            let fd = open_dev().map_err(|_| 10)?;
            let lim = libc::rlimit { rlim_cur: 65536, rlim_max: 65536 };
            // SAFETY: plain syscalls on our own process.
            unsafe {
                if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0
                    || libc::setgid(65534) != 0
                    || libc::setuid(65534) != 0
                {
                    return Err(11);
                }
            }
            let buf = anon(1 << 20);
            let small = reg_mr(fd, buf, 32768, 3).map_err(|_| 12)?;
            let big = reg_mr(fd, buf, 1 << 20, 3);
            dereg_mr(fd, small).map_err(|_| 13)?;
            if big != Err(libc::ENOMEM) {
                return Err(14);
            }
            Ok(())
        })();
        // SAFETY: exiting the child with its verdict.
        unsafe { libc::_exit(code.err().unwrap_or(0)) };
    }
    let mut status = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(format!("child status {status:#x}"))
    }
}

/// A child registers 2 MiB and is killed; every page comes back.
fn killed_test(fd: i32, base: u64) -> Result<(), String> {
    let meminfo = || {
        std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("Mlocked:"))
            .unwrap_or("")
            .to_string()
    };
    let before = meminfo();
    let mut ready = [0i32; 2];
    // SAFETY: a pipe into a live array.
    unsafe { libc::pipe(ready.as_mut_ptr()) };
    // SAFETY: fork in a single-threaded program.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let cfd = open_dev().unwrap_or(-1);
        let buf = anon(2 << 20);
        let ok = reg_mr(cfd, buf, 2 << 20, 3).is_ok();
        let b = [ok as u8];
        // SAFETY: tell the parent, then wait to be killed.
        unsafe {
            libc::write(ready[1], b.as_ptr().cast(), 1);
            libc::pause();
            libc::_exit(0);
        }
    }
    let mut b = [0u8; 1];
    // SAFETY: pipe read into a live buffer.
    unsafe { libc::read(ready[0], b.as_mut_ptr().cast(), 1) };
    let during = pinned(fd) - base;
    // SAFETY: killing and reaping our child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    let after = pinned(fd) - base;
    if b[0] != 1 || during != 512 || after != 0 {
        return Err(format!("registered {} pinned during {during}, after {after}", b[0]));
    }
    let now = meminfo();
    println!("# /proc/meminfo {before} -> (child pinned 2 MiB) -> {now}");
    Ok(())
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
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), win, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, cfd, 0)
        };
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

fn set_eventfd(fd: i32, efd: i32, signal: u32) -> Result<(), i32> {
    let mut b = [0u8; EmpSetEventfd::SIZE];
    EmpSetEventfd { size: EmpSetEventfd::SIZE as u32, fd: efd, signal, reserved: 0 }.put(&mut b);
    // SAFETY: the buffer is as large as the command says.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_SET_EVENTFD as _, b.as_mut_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

fn arm(fd: i32, events: u32) -> Result<(), i32> {
    let mut b = [0u8; EmpArm::SIZE];
    EmpArm { size: EmpArm::SIZE as u32, events }.put(&mut b);
    // SAFETY: the buffer is as large as the command says.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_ARM as _, b.as_mut_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(errno())
    }
}

/// Event ioctls with bad arguments: each gets its errno, nothing changes.
fn event_arg_tests(fd: i32) -> Result<(), String> {
    let null = CString::new("/dev/null").expect("no NUL");
    // SAFETY: opening a path with a valid C string; creating an eventfd.
    let (notev, efd) = unsafe { (libc::open(null.as_ptr(), libc::O_RDONLY), libc::eventfd(0, libc::EFD_NONBLOCK)) };
    let got = [
        ("ARM before SET_EVENTFD", arm(fd, 1), Err(libc::EINVAL)),
        ("SET_EVENTFD of a non-eventfd", set_eventfd(fd, notev, 0), Err(libc::EINVAL)),
        ("SET_EVENTFD of a closed descriptor", set_eventfd(fd, 999, 0), Err(libc::EBADF)),
        ("SET_EVENTFD asking for a signal", set_eventfd(fd, efd, 10), Err(libc::EINVAL)),
        ("SET_EVENTFD of an eventfd", set_eventfd(fd, efd, 0), Ok(())),
        ("ARM of unknown events", arm(fd, 2), Err(libc::EINVAL)),
        ("ARM", arm(fd, 1), Ok(())),
        ("SET_EVENTFD -1 (detach)", set_eventfd(fd, -1, 0), Ok(())),
        ("ARM after detaching", arm(fd, 1), Err(libc::EINVAL)),
    ];
    // SAFETY: closing our descriptors.
    unsafe {
        libc::close(notev);
        libc::close(efd);
    }
    let wrong: Vec<String> =
        got.iter().filter(|(_, g, w)| g != w).map(|(what, g, w)| format!("{what}: got {g:?}, wanted {w:?}")).collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Two ports through libemp's kernel backend: the receiver arms and its
/// eventfd (in an epoll set) stays quiet until the sender's message lands;
/// then epoll wakes (NIC completion → MSI-X → driver → eventfd).
fn signal_on_packet() -> Result<(), String> {
    use emp::{Completion, EventSource, ANY};
    let mut a = emp::Device::open_path("/dev/emp-nic").map_err(|e| format!("open: {e}"))?;
    let mut b = emp::Device::open_path("/dev/emp-nic").map_err(|e| format!("open: {e}"))?;
    if b.event_fd() < 0 {
        return Err("the port has no event descriptor (no MSI-X?)".into());
    }
    let sa = a.alloc(64).map_err(|e| e.to_string())?;
    let rb = b.alloc(64).map_err(|e| e.to_string())?;
    let mut wc = [Completion::default(); 4];
    b.post_recv(1, ANY, 77, 0, &[rb.sge(0, 64)]).map_err(|e| e.to_string())?;
    b.arm();
    if b.poll_cq(&mut wc) != 0 {
        return Err("a completion before anything was sent".into());
    }
    // SAFETY: plain epoll calls on descriptors we own, into live structs.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 1 };
    // SAFETY: as above.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, b.event_fd(), &mut ev) } != 0 {
        return Err(format!("epoll_ctl: {}", std::io::Error::last_os_error()));
    }
    let mut out = [libc::epoll_event { events: 0, u64: 0 }; 1];
    // SAFETY: waiting on our epoll fd into a live array.
    let early = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 1, 100) };
    a.post_send(2, b.endpoint(), 77, &[sa.sge(0, 64)]).map_err(|e| e.to_string())?;
    let t = std::time::Instant::now();
    // SAFETY: as above.
    let woke = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 1, 10_000) };
    let took = t.elapsed();
    // SAFETY: closing our epoll fd.
    unsafe { libc::close(ep) };
    let n = b.wait_cq(&mut wc, Some(std::time::Duration::from_secs(5))).map_err(|e| e.to_string())?;
    println!("# epoll woke {took:?} after the send");
    match (early, woke, n, wc[0].tag) {
        (0, 1, 1, 77) => Ok(()),
        _ => Err(format!("epoll before the send {early}, after {woke}; completions {n}, tag {}", wc[0].tag)),
    }
}

// ---------------------------------------------------------------------------
// Groups: GROUP_SET / GROUP_CLEAR
// ---------------------------------------------------------------------------

/// A started port: open, register 64 KiB, START with a 64-entry CQ there.
/// Returns the descriptor and its QUERY.
fn started_port() -> Result<(i32, EmpQuery), String> {
    let fd = open_dev()?;
    let buf = anon(65536);
    let key = reg_mr(fd, buf, 65536, 3).map_err(|e| format!("reg CQ memory: errno {e}"))?;
    let mut b = [0u8; EmpStart::SIZE];
    EmpStart { size: EmpStart::SIZE as u32, cq_entries: 64, cq_key: key, ..Default::default() }.put(&mut b);
    // SAFETY: the buffer is as large as the command says.
    if unsafe { libc::ioctl(fd, EMP_IOC_START as _, b.as_mut_ptr()) } != 0 {
        return Err(format!("START: {}", std::io::Error::last_os_error()));
    }
    Ok((fd, query(fd)?))
}

/// A one-member group of the port `q` describes (valid).
fn group_entry(q: &EmpQuery, id: u32, epoch: u32) -> GroupEntry {
    let mut e = GroupEntry { group_id: id, epoch, member_count: 1, port: q.port, tree_count: 1, ..Default::default() };
    e.members[0] = (q.node_id as u32) << 16 | q.port as u32;
    e.parents[0] = TREE_ROOT;
    e
}

/// GROUP_SET with a raw argument struct and entry bytes.
fn group_set_raw(fd: i32, arg: &mut EmpGroupSet, entry: Option<&GroupEntry>) -> Result<u32, i32> {
    let mut eb = vec![0u8; GroupEntry::SIZE];
    if let Some(e) = entry {
        e.put(&mut eb);
        arg.entry = eb.as_ptr() as u64;
    }
    let mut b = [0u8; EmpGroupSet::SIZE];
    arg.put(&mut b);
    // SAFETY: the buffer is as large as the command says; `entry` points at
    // a live 1 KiB buffer, or is whatever the caller chose to test.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_GROUP_SET as _, b.as_mut_ptr()) };
    if r != 0 {
        Err(errno())
    } else {
        Ok(EmpGroupSet::get(&b).slot)
    }
}

fn group_set(fd: i32, e: &GroupEntry) -> Result<u32, i32> {
    group_set_raw(fd, &mut EmpGroupSet { size: EmpGroupSet::SIZE as u32, ..Default::default() }, Some(e))
}

fn group_clear_sized(fd: i32, size: u32, slot: u32) -> Result<(), i32> {
    let mut b = [0u8; EmpGroupClear::SIZE];
    EmpGroupClear { size, slot }.put(&mut b);
    // SAFETY: the buffer is as large as the command says.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_GROUP_CLEAR as _, b.as_mut_ptr()) };
    if r != 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

fn group_clear(fd: i32, slot: u32) -> Result<(), i32> {
    group_clear_sized(fd, EmpGroupClear::SIZE as u32, slot)
}

/// (group table slots, slots in use) from QUERY.
fn group_slots(fd: i32) -> (u32, u32) {
    query(fd).map(|q| (q.group_entries, q.groups_in_use)).unwrap_or((0, u32::MAX))
}

fn close(fd: i32) {
    // SAFETY: closing a descriptor we own.
    unsafe { libc::close(fd) };
}

fn group_tests(t: &mut Tap) {
    t.check("GROUP_SET loads a group, GROUP_CLEAR retires it; re-creating keeps the slot", group_lifecycle());
    t.check("GROUP_SET / GROUP_CLEAR refuse bad input with clean errnos, leaving no slot held", group_bad_input());
    t.check("a full group table: ENOSPC; every slot comes back", group_table_full());
    t.check("a process killed holding groups leaves no slot behind; another reuses them", group_killed());
    t.check("a group of 1024 takes its span of slots with its body; bad bodies are refused", group_wide());
}

/// A group of `n` (> 64) with the caller at rank 0 and the rest on other
/// nodes, one binomial tree: its entry followed by its body.
fn wide_group_bytes(q: &EmpQuery, id: u32, epoch: u32, n: usize) -> Vec<u8> {
    let e =
        GroupEntry { group_id: id, epoch, member_count: n as u16, port: q.port, tree_count: 1, ..Default::default() };
    let mut b = vec![0u8; GroupEntry::SIZE + e.body_len()];
    e.put(&mut b);
    let body = &mut b[GroupEntry::SIZE..];
    for r in 0..n {
        let node = if r == 0 { q.node_id as u32 } else { (q.node_id as u32 + r as u32) & 0xFFFF };
        body[4 * r..4 * r + 4].copy_from_slice(&(node << 16 | q.port as u32).to_le_bytes());
        let p = if r == 0 { TREE_ROOT_WIDE } else { (r - (1 << r.ilog2())) as u16 };
        body[4 * n + 2 * r..4 * n + 2 * r + 2].copy_from_slice(&p.to_le_bytes());
    }
    b
}

/// GROUP_SET of raw encoded bytes (entry and body).
fn group_set_bytes(fd: i32, bytes: &[u8]) -> Result<u32, i32> {
    let mut b = [0u8; EmpGroupSet::SIZE];
    EmpGroupSet { size: EmpGroupSet::SIZE as u32, entry: bytes.as_ptr() as u64, ..Default::default() }.put(&mut b);
    // SAFETY: the buffer is as large as the command says; `entry` points at
    // the live encoded group, entry and body.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_GROUP_SET as _, b.as_mut_ptr()) };
    if r != 0 {
        Err(errno())
    } else {
        Ok(EmpGroupSet::get(&b).slot)
    }
}

fn group_wide() -> Result<(), String> {
    let (fd, q) = started_port()?;
    let r = (|| {
        let (entries, base) = group_slots(fd);
        let wide = wide_group_bytes(&q, 21, 1, 1024);
        let span = GroupEntry::get(&wide).span() as u32;
        if span > entries {
            return Err(format!("a table of {entries} slots cannot hold a group of 1024 ({span} slots)"));
        }
        let slot = group_set_bytes(fd, &wide).map_err(|e| format!("set 1024: errno {e}"))?;
        let held = group_slots(fd).1;
        // A slot inside the span is not a group's first: ENOENT.
        let inner = group_clear(fd, slot + 1);
        // A duplicate member far into the body.
        let mut dup = wide_group_bytes(&q, 22, 1, 1024);
        dup.copy_within(GroupEntry::SIZE + 4..GroupEntry::SIZE + 8, GroupEntry::SIZE + 4 * 900);
        let dup = group_set_bytes(fd, &dup);
        group_clear(fd, slot).map_err(|e| format!("clear: errno {e}"))?;
        let after = group_slots(fd).1;
        if held != base + span || after != base {
            return Err(format!("slots in use {base} -> {held} (span {span}) -> {after}"));
        }
        if inner != Err(libc::ENOENT) || dup != Err(libc::EINVAL) {
            return Err(format!(
                "clear inside the span: {inner:?} (want ENOENT); duplicate member: {dup:?} (want EINVAL)"
            ));
        }
        Ok(())
    })();
    close(fd);
    r
}

fn group_lifecycle() -> Result<(), String> {
    let (fd, q) = started_port()?;
    let r = (|| {
        let (entries, base) = group_slots(fd);
        if entries == 0 {
            return Err("QUERY reports no group table".into());
        }
        let slot = group_set(fd, &group_entry(&q, 7, 1)).map_err(|e| format!("set: errno {e}"))?;
        let held = group_slots(fd).1;
        let again = group_set(fd, &group_entry(&q, 7, 2)).map_err(|e| format!("re-create: errno {e}"))?;
        let stale = group_set(fd, &group_entry(&q, 7, 2));
        let held_after = group_slots(fd).1;
        group_clear(fd, slot).map_err(|e| format!("clear: errno {e}"))?;
        let twice = group_clear(fd, slot);
        let after = group_slots(fd).1;
        if held != base + 1 || again != slot || held_after != base + 1 || after != base {
            return Err(format!(
                "slots in use {base} -> {held} -> {held_after} -> {after}; slot {slot}, re-created in {again}"
            ));
        }
        if stale != Err(libc::EINVAL) {
            return Err(format!("re-creation without a newer epoch: {stale:?}, want EINVAL"));
        }
        if twice != Err(libc::ENOENT) {
            return Err(format!("second clear: {twice:?}, want ENOENT"));
        }
        Ok(())
    })();
    close(fd);
    r
}

fn group_bad_input() -> Result<(), String> {
    let (fd, q) = started_port()?;
    let (other, oq) = started_port()?;
    let unstarted = open_dev()?;
    let (_, base) = group_slots(fd);
    let uq = query(unstarted)?;
    let sized = |size: u32| EmpGroupSet { size, ..Default::default() };
    let good = group_entry(&q, 3, 1);
    let with = |f: &dyn Fn(&mut GroupEntry)| {
        let mut e = good;
        f(&mut e);
        group_set(fd, &e)
    };
    let mut wrong = Vec::new();
    let mut expect = |what: &str, got: Result<u32, i32>, want: i32| {
        if got != Err(want) {
            wrong.push(format!("{what}: {got:?}, want errno {want}"));
        }
    };
    expect("port not started", group_set(unstarted, &group_entry(&uq, 3, 1)), libc::ENOTCONN);
    expect("wrong size", group_set_raw(fd, &mut sized(8), Some(&good)), libc::EINVAL);
    expect(
        "reserved set",
        group_set_raw(fd, &mut EmpGroupSet { reserved: [0, 1], ..sized(EmpGroupSet::SIZE as u32) }, Some(&good)),
        libc::EINVAL,
    );
    expect(
        "entry at an unmapped address",
        group_set_raw(fd, &mut EmpGroupSet { entry: 16, ..sized(EmpGroupSet::SIZE as u32) }, None),
        libc::EFAULT,
    );
    // SAFETY: an invalid argument pointer: the kernel must refuse, not fault.
    let r = unsafe { libc::ioctl(fd, EMP_IOC_GROUP_SET as _, 16usize as *mut u8) };
    expect("argument at an unmapped address", if r == 0 { Ok(0) } else { Err(errno()) }, libc::EFAULT);
    expect("group id 0", with(&|e| e.group_id = 0), libc::EINVAL);
    expect("no members", with(&|e| e.member_count = 0), libc::EINVAL);
    expect("65 members", with(&|e| e.member_count = 65), libc::EINVAL);
    expect("rank out of range", with(&|e| e.my_rank = 1), libc::EINVAL);
    expect(
        "not a member (another port at its rank)",
        with(&|e| e.members[0] = (oq.node_id as u32) << 16 | oq.port as u32),
        libc::EINVAL,
    );
    expect(
        "duplicate member",
        with(&|e| {
            e.member_count = 2;
            e.members[1] = e.members[0];
            e.parents[1] = 0;
        }),
        libc::EINVAL,
    );
    expect("no tree", with(&|e| e.tree_count = 0), libc::EINVAL);
    expect("9 trees", with(&|e| e.tree_count = 9), libc::EINVAL);
    expect("a parent array that is not a tree", with(&|e| e.parents[0] = 0), libc::EINVAL);
    expect("reserved entry field", with(&|e| e.reserved2[25] = 1), libc::EINVAL);
    expect("member beyond the count", with(&|e| e.members[5] = 9), libc::EINVAL);
    expect(
        "bounce slots in memory the port did not register",
        with(&|e| {
            e.bounce_key = 0x7777_0001;
            e.bounce_slots = 4;
            e.bounce_slot_size = 64;
        }),
        libc::ENOENT,
    );
    let mut wrong_clear = Vec::new();
    let theirs = group_set(other, &group_entry(&oq, 3, 1)).map_err(|e| format!("other port's group: errno {e}"))?;
    for (what, got, want) in [
        ("clear another port's slot", group_clear(fd, theirs), libc::ENOENT),
        ("clear a slot out of range", group_clear(fd, 1_000_000), libc::ENOENT),
        ("clear a free slot", group_clear(fd, theirs + 1), libc::ENOENT),
        ("clear with a wrong size", group_clear_sized(other, 4, theirs), libc::EINVAL),
    ] {
        if got != Err(want) {
            wrong_clear.push(format!("{what}: {got:?}, want errno {want}"));
        }
    }
    let still = group_clear(other, theirs);
    let after = group_slots(fd).1;
    for f in [fd, other, unstarted] {
        close(f);
    }
    wrong.extend(wrong_clear);
    if still.is_err() {
        wrong.push(format!("the other port's slot did not survive the refused clears: {still:?}"));
    }
    if after != base {
        wrong.push(format!("slots in use {base} before, {after} after"));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Sets groups 1, 2, … on `fd` until GROUP_SET fails: (how many, the errno).
fn fill_groups(fd: i32, q: &EmpQuery) -> (u32, i32) {
    let mut n = 0;
    loop {
        match group_set(fd, &group_entry(q, 1000 + n, 1)) {
            Ok(_) if n < 0x1_0000 => n += 1,
            Ok(_) => return (n, 0),
            Err(e) => return (n, e),
        }
    }
}

fn group_table_full() -> Result<(), String> {
    let (fd, q) = started_port()?;
    let (entries, base) = group_slots(fd);
    let (n, err) = fill_groups(fd, &q);
    let full = group_slots(fd).1;
    // A re-creation needs no new slot.
    let again = group_set(fd, &group_entry(&q, 1000, 2));
    let cleared = (0..entries).filter(|&s| group_clear(fd, s).is_ok()).count() as u32;
    let after = group_slots(fd).1;
    close(fd);
    if err != libc::ENOSPC || n != entries - base || full != entries {
        return Err(format!(
            "{n} groups set (table {entries}, {base} held before, {full} after), then errno {err}, want ENOSPC"
        ));
    }
    if again.is_err() {
        return Err(format!("re-creating a group in a full table: {again:?}"));
    }
    if cleared != n || after != base {
        return Err(format!("cleared {cleared} of {n}; slots in use after {after}, before {base}"));
    }
    Ok(())
}

fn group_killed() -> Result<(), String> {
    let probe = open_dev()?;
    let (entries, base) = group_slots(probe);
    let mut ready = [0i32; 2];
    // SAFETY: a pipe into a live array.
    unsafe { libc::pipe(ready.as_mut_ptr()) };
    // SAFETY: fork in a single-threaded program.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let n = match started_port() {
            Ok((cfd, cq)) => fill_groups(cfd, &cq).0,
            Err(_) => 0,
        };
        let b = n.to_le_bytes();
        // SAFETY: tell the parent, then wait to be killed.
        unsafe {
            libc::write(ready[1], b.as_ptr().cast(), 4);
            libc::pause();
            libc::_exit(0);
        }
    }
    let mut b = [0u8; 4];
    // SAFETY: pipe read into a live buffer.
    unsafe { libc::read(ready[0], b.as_mut_ptr().cast(), 4) };
    let child = u32::from_le_bytes(b);
    let during = group_slots(probe).1;
    // SAFETY: killing and reaping our child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    let after = group_slots(probe).1;
    close(probe);
    if child != entries - base || during != entries || after != base {
        return Err(format!("child set {child} groups (table {entries}, {base} held before); in use while alive {during}, after its death {after}"));
    }
    // The NIC dropped the child's groups too: a new port gets every slot.
    let (fd, q) = started_port()?;
    let (n, err) = fill_groups(fd, &q);
    close(fd);
    if n != child || err != libc::ENOSPC {
        return Err(format!("after the child's death a new port set {n} groups (child {child}), then errno {err}"));
    }
    Ok(())
}
