//! The kernel under fire: an unprivileged ioctl/mmap fuzzer for `emp.ko`'s
//! `/dev/emp-nic`, run inside a guest (`scripts/vm/kfuzz.sh`, and a short
//! run in `scripts/vm/suite.sh`). See docs/fuzzing.md.
//!
//!   tap-kfuzz [--seed S] [--calls N] [--threads T] [--round R] [--device PATH]
//!             [--regressions-only | --skip-regressions] [--trace]
//!
//! First the regression list (deterministic cases, each a TAP line), then
//! the random phase in rounds: each round is a fresh process (forked from
//! this single-threaded supervisor) with T threads sharing a few port
//! descriptors, eventfds and a reserved address range (the playground,
//! where every mapping the fuzzer makes lives). Threads issue valid
//! commands with random and edge arguments, invalid command numbers,
//! argument pointers that are NULL, unmapped, kernel, non-canonical,
//! misaligned, straddling a guard page or inside a mapped port window;
//! map windows with random offsets, lengths, protections and flags;
//! unmap, remap, mprotect and madvise parts of the playground; close,
//! reopen and dup ports racing the others; and fork children that fuzz the
//! inherited descriptors and are killed mid-call. Every third round is
//! killed by the supervisor itself after a random share of its calls.
//!
//! Every call's arguments come from a per-thread generator seeded by
//! (seed, round, thread), so `--threads 1` replays a round's calls exactly
//! (the kills and forked children depend on timing). The oracle: no round
//! dies of anything but our own SIGKILL, and afterwards no page is pinned
//! and no group slot held (QUERY); the guest script checks the kernel log,
//! kmemleak and the driver's debugfs counters.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use emp_tests::Tap;
use emp_uapi::coll::TREE_ROOT;
use emp_uapi::ioctl::{
    ioc, port_ctx, EmpArm, EmpDeregMr, EmpGang, EmpGroupClear, EmpGroupSet, EmpPortCtx, EmpQuery, EmpRegMr,
    EmpSetEventfd, EmpStart, IoctlArg, IoctlCmd, EMP_IOC_MAGIC,
};
use emp_uapi::sram::{GroupEntry, CTX_IMAGE_MAX};
use emp_uapi::Le;

const PAGE: usize = 4096;
/// Port descriptors a round's threads share.
const FD_SLOTS: usize = 4;
/// Eventfds they share.
const EVENT_SLOTS: usize = 2;
/// Playground chunks (each holds one window or one buffer).
const CHUNKS: usize = 48;
/// Per-thread scratch: 5 pages for argument structs (the largest
/// `_IOC_SIZE` is 16 KiB - 1), 1 page for a group entry, then a guard page.
const SCRATCH_ARG: usize = 5 * PAGE;
const SCRATCH_RW: usize = SCRATCH_ARG + PAGE;
/// Calls a round runs (the last may run fewer).
const ROUND_CALLS: u64 = 10_000;

// ---------------------------------------------------------------------------
// The generator
// ---------------------------------------------------------------------------

/// SplitMix64: small, fast, and the same sequence everywhere.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }

    /// An edge value of 32 bits, or a random one.
    fn edge32(&mut self) -> u32 {
        match self.below(10) {
            0 => 0,
            1 => 1,
            2 => u32::MAX,
            3 => 0x8000_0000,
            4 => 0x7FFF_FFFF,
            5 => 64,
            6 => 4096,
            7 => 0xFFFF,
            _ => self.next() as u32,
        }
    }
}

/// Derives independent seeds (round, thread) from the run's seed.
fn mix(seed: u64, a: u64, b: u64) -> u64 {
    Rng::new(seed ^ a.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ b.wrapping_mul(0xABC9_8388_FB8B_7A2D)).next()
}

// ---------------------------------------------------------------------------
// System calls (thin wrappers: the fuzzer calls them with garbage on purpose)
// ---------------------------------------------------------------------------

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// An ioctl with any argument: a return value >= 0, or -errno.
fn sys_ioctl(fd: i32, cmd: u32, arg: usize) -> i64 {
    // SAFETY: the kernel checks every argument; memory it may write is only
    // where `arg` points, which the fuzzer takes from its scratch, its
    // playground or addresses no mapping of this process holds (NULL,
    // kernel, non-canonical, unmapped), none of which Rust code relies on.
    let r = unsafe { libc::ioctl(fd, cmd as _, arg) };
    if r < 0 {
        -(errno() as i64)
    } else {
        r as i64
    }
}

/// mmap: the address, or -errno. Callers pass MAP_FIXED only inside the
/// playground (or scratch they own).
fn sys_mmap(addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> Result<usize, i32> {
    // SAFETY: a fixed mapping replaces only playground memory, which no
    // Rust object lives in (the callers' rule); a non-fixed one touches
    // nothing existing.
    let p = unsafe { libc::mmap(addr as *mut libc::c_void, len, prot, flags, fd, off) };
    if p == libc::MAP_FAILED {
        Err(errno())
    } else {
        Ok(p as usize)
    }
}

fn sys_munmap(addr: usize, len: usize) -> i32 {
    // SAFETY: callers unmap only playground memory or mappings they made.
    if unsafe { libc::munmap(addr as *mut libc::c_void, len) } == 0 {
        0
    } else {
        errno()
    }
}

fn close(fd: i32) {
    if fd >= 0 {
        // SAFETY: closing a descriptor whose number we took out of a slot
        // (only the thread that took it closes it).
        unsafe { libc::close(fd) };
    }
}

fn open_dev(path: &std::ffi::CStr) -> i32 {
    // SAFETY: a valid C string.
    unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) }
}

// ---------------------------------------------------------------------------
// Shared state of one round
// ---------------------------------------------------------------------------

/// What a round's threads share. Plain atomics only: forked children use
/// it too, so no lock may be held across a fork.
struct Shared {
    device: std::ffi::CString,
    fds: [AtomicI32; FD_SLOTS],
    events: [AtomicI32; EVENT_SLOTS],
    /// Keys and group slots the driver returned (any thread may use them).
    keys: [AtomicU32; 16],
    slots: [AtomicU32; 8],
    /// The reserved address range and its chunk size.
    playground: usize,
    chunk: usize,
    /// The port window's size (QUERY).
    window: usize,
    /// Calls executed (in this round; a MAP_SHARED page counted by the
    /// supervisor and the round's forked children too).
    calls: &'static AtomicU64,
    /// Results by errno (index 0 = success).
    results: &'static [AtomicU64; 256],
    trace: bool,
}

impl Shared {
    fn count(&self, r: i64) {
        self.calls.fetch_add(1, Relaxed);
        let i = if r >= 0 { 0 } else { (-r).min(255) as usize };
        self.results[i].fetch_add(1, Relaxed);
    }

    /// A port descriptor: mostly an open one (if any), sometimes whatever
    /// a slot holds (-1, or a number closed meanwhile: EBADF).
    fn fd(&self, rng: &mut Rng) -> i32 {
        let start = rng.below(FD_SLOTS as u64) as usize;
        if rng.one_in(10) {
            return self.fds[start].load(Relaxed);
        }
        (0..FD_SLOTS).map(|i| self.fds[(start + i) % FD_SLOTS].load(Relaxed)).find(|&fd| fd >= 0).unwrap_or(-1)
    }

    fn key(&self, rng: &mut Rng) -> u32 {
        if rng.one_in(8) {
            rng.edge32()
        } else {
            self.keys[rng.below(16) as usize].load(Relaxed)
        }
    }

    fn remember_key(&self, rng: &mut Rng, key: u32) {
        self.keys[rng.below(16) as usize].store(key, Relaxed);
    }

    fn chunk_addr(&self, i: usize) -> usize {
        self.playground + i * self.chunk
    }

    fn playground_len(&self) -> usize {
        CHUNKS * self.chunk
    }

    /// Any address in the playground (mapped RW, a window, PROT_NONE or
    /// unmapped, depending on the history).
    fn playground_addr(&self, rng: &mut Rng) -> usize {
        let base = self.chunk_addr(rng.below(CHUNKS as u64) as usize);
        match rng.below(4) {
            0 => base,
            1 => base + rng.below(self.chunk as u64) as usize,
            2 => base + rng.below((self.chunk / PAGE) as u64) as usize * PAGE,
            _ => base + self.chunk - 1 - rng.below(64) as usize,
        }
    }
}

/// One thread's private memory: argument structs are written here (and the
/// kernel writes results back here); a guard page follows it.
struct Scratch {
    base: usize,
}

impl Scratch {
    fn new() -> Scratch {
        let total = SCRATCH_RW + PAGE;
        let base =
            sys_mmap(0, total, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
                .expect("scratch mmap");
        // SAFETY: the last page of the mapping we just made becomes the guard.
        let r = unsafe { libc::mprotect((base + SCRATCH_RW) as *mut libc::c_void, PAGE, libc::PROT_NONE) };
        assert_eq!(r, 0, "guard page");
        Scratch { base }
    }

    fn guard(&self) -> usize {
        self.base + SCRATCH_RW
    }

    fn entry_area(&self) -> usize {
        self.base + SCRATCH_ARG
    }

    /// Copies `b` to `at`, which lies in this scratch's writable pages.
    fn write(&self, at: usize, b: &[u8]) {
        let n = b.len().min(self.guard().saturating_sub(at));
        if at < self.base || n == 0 {
            return;
        }
        // SAFETY: [at, at + n) lies in our scratch's read-write pages, which
        // only this thread (and the kernel, on its behalf) touches.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), at as *mut u8, n) };
    }

    fn read<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if at >= self.base && at + N <= self.guard() {
            // SAFETY: as in `write`.
            unsafe { std::ptr::copy_nonoverlapping(at as *const u8, out.as_mut_ptr(), N) };
        }
        out
    }
}

// ---------------------------------------------------------------------------
// Argument generation
// ---------------------------------------------------------------------------

/// Kernel and non-canonical addresses no user pointer may reach.
const HOSTILE: [u64; 9] = [
    0xFFFF_8880_0000_0000,
    0xFFFF_FFFF_8100_0000,
    0xFFFF_C900_0000_0000,
    0xFFFF_FFFF_FFFF_F000,
    u64::MAX - 7,
    u64::MAX,
    0x0000_8000_0000_0000,
    0x8000_0000_0000_0000,
    0x0000_7FFF_FFFF_F000,
];

/// A pointer for an argument of `len` bytes: where the struct goes.
/// Returns (pointer, whether it is in our scratch, so we fill it).
fn arg_pointer(rng: &mut Rng, sh: &Shared, sc: &Scratch, len: usize) -> (usize, bool) {
    match rng.below(20) {
        0 => (0, false),
        1 => (rng.pick(&HOSTILE) as usize, false),
        2 => (sc.guard().saturating_sub(1 + rng.below(len.max(1) as u64) as usize), true),
        3 => (sh.playground_addr(rng), false),
        4 => (rng.pick(&[1usize, 8, 4096, 0x10000]), false),
        5 => (rng.next() as usize, false),
        // Misaligned, inside the scratch.
        6 | 7 => (sc.base + 1 + rng.below(63) as usize, true),
        _ => (sc.base + 8 * rng.below(8) as usize, true),
    }
}

/// A user address for a registration or a group entry.
fn user_addr(rng: &mut Rng, sh: &Shared, sc: &Scratch) -> u64 {
    match rng.below(10) {
        0 => 0,
        1 => rng.pick(&HOSTILE),
        2 => sc.base as u64 + rng.below(SCRATCH_RW as u64),
        3 => rng.next(),
        _ => sh.playground_addr(rng) as u64,
    }
}

/// A length for a registration: small, page edges, the limit and beyond,
/// and ones that wrap the address space.
fn mr_length(rng: &mut Rng, addr: u64, chunk: usize) -> u64 {
    match rng.below(14) {
        0 => 0,
        1 => 1,
        2 => 4095,
        3 => 4096,
        4 => 4097,
        5 => 1 << 30,
        6 => (1 << 30) + 1,
        7 => u64::MAX,
        8 => u64::MAX - addr,
        9 => 0u64.wrapping_sub(addr).wrapping_add(1),
        10 => 64 << 20,
        _ => 1 + rng.below(chunk as u64),
    }
}

/// An `_IOC_SIZE` for a struct of `T`: its own, its first version, just
/// below, zero, a newer one, and the largest.
fn arg_size<T: IoctlArg>(rng: &mut Rng) -> usize {
    match rng.below(12) {
        0 => T::SIZE_VER0,
        1 => T::SIZE_VER0 - 1,
        2 => 0,
        3 => 4,
        4 => T::SIZE + 8,
        5 => 200,
        6 => (1 << 14) - 1,
        7 => rng.below(1 << 14) as usize,
        _ => T::SIZE,
    }
}

/// Fills `buf[..size]` with the argument struct `v` of `size` bytes: the
/// size field usually right, the tail past the struct usually zero.
fn encode<T: IoctlArg>(rng: &mut Rng, v: &T, size: usize, buf: &mut [u8]) -> usize {
    let size = size.min(buf.len());
    buf[..size].fill(0);
    let mut b = [0u8; 128];
    v.put(&mut b[..T::SIZE]);
    let n = size.min(T::SIZE);
    buf[..n].copy_from_slice(&b[..n]);
    if size >= 4 {
        let field = if rng.one_in(10) { rng.edge32() } else { size as u32 };
        buf[..4].copy_from_slice(&field.to_le_bytes());
    }
    if size > T::SIZE && rng.one_in(4) {
        let at = T::SIZE + rng.below((size - T::SIZE) as u64) as usize;
        buf[at] = 1 + rng.below(255) as u8;
    }
    size
}

/// A group entry for the port `q` describes: valid, or mutated.
fn group_entry(rng: &mut Rng, q: &EmpQuery) -> GroupEntry {
    let mut e = GroupEntry {
        group_id: 1 + rng.below(4) as u32,
        epoch: rng.below(8) as u32,
        member_count: 1,
        port: q.port,
        tree_count: 1,
        ..Default::default()
    };
    e.members[0] = (q.node_id as u32) << 16 | q.port as u32;
    e.parents[0] = TREE_ROOT;
    if rng.one_in(3) {
        match rng.below(8) {
            0 => e.member_count = rng.below(70) as u16,
            1 => e.my_rank = rng.next() as u16,
            2 => e.tree_count = rng.next() as u8,
            3 => e.members[rng.below(64) as usize] = rng.next() as u32,
            4 => e.parents[rng.below(512) as usize] = rng.next() as u8,
            5 => e.reserved2[rng.below(26) as usize] = rng.next(),
            6 => {
                e.bounce_key = rng.edge32();
                e.bounce_slots = rng.next() as u16;
                e.bounce_slot_size = rng.edge32();
                e.bounce_offset = rng.next();
            }
            _ => e.group_id = 0,
        }
    }
    e
}

/// The port `fd` owns (QUERY), or a made-up one.
fn query(fd: i32, sc: &Scratch) -> EmpQuery {
    let mut b = [0u8; EmpQuery::SIZE];
    EmpQuery { size: EmpQuery::SIZE as u32, ..Default::default() }.put(&mut b);
    sc.write(sc.base, &b);
    if sys_ioctl(fd, IoctlCmd::Query.with_size(EmpQuery::SIZE), sc.base) == 0 {
        EmpQuery::get(&sc.read::<{ EmpQuery::SIZE }>(sc.base))
    } else {
        EmpQuery::default()
    }
}

// ---------------------------------------------------------------------------
// The operations
// ---------------------------------------------------------------------------

/// One ioctl of a valid command with a generated struct, size and pointer.
fn op_ioctl(rng: &mut Rng, sh: &Shared, sc: &Scratch) -> i64 {
    let fd = sh.fd(rng);
    let cmd = IoctlCmd::ALL[rng.below(IoctlCmd::ALL.len() as u64) as usize];
    let mut buf = [0u8; 1 << 14];
    let (size, len) = match cmd {
        IoctlCmd::Query => {
            let s = arg_size::<EmpQuery>(rng);
            (s, encode(rng, &EmpQuery::default(), s, &mut buf))
        }
        IoctlCmd::RegMr => {
            let addr = user_addr(rng, sh, sc);
            let v = EmpRegMr {
                access: if rng.one_in(6) { rng.edge32() } else { 1 + rng.below(0x1F) as u32 },
                addr,
                length: mr_length(rng, addr, sh.chunk),
                key: if rng.one_in(8) { rng.edge32() } else { 0 },
                ..Default::default()
            };
            let s = arg_size::<EmpRegMr>(rng);
            (s, encode(rng, &v, s, &mut buf))
        }
        IoctlCmd::DeregMr => {
            let v = EmpDeregMr { key: sh.key(rng), ..Default::default() };
            let s = arg_size::<EmpDeregMr>(rng);
            (s, encode(rng, &v, s, &mut buf))
        }
        IoctlCmd::Arm => {
            let v = EmpArm { events: if rng.one_in(4) { rng.edge32() } else { 1 }, ..Default::default() };
            let s = arg_size::<EmpArm>(rng);
            (s, encode(rng, &v, s, &mut buf))
        }
        IoctlCmd::SetEventfd => {
            let fd = match rng.below(6) {
                0 => -1,
                1 => rng.edge32() as i32,
                2 => sh.fd(rng),
                _ => sh.events[rng.below(EVENT_SLOTS as u64) as usize].load(Relaxed),
            };
            let v = EmpSetEventfd {
                fd,
                signal: if rng.one_in(8) { rng.edge32() } else { 0 },
                reserved: if rng.one_in(10) { rng.edge32() } else { 0 },
                ..Default::default()
            };
            let s = arg_size::<EmpSetEventfd>(rng);
            (s, encode(rng, &v, s, &mut buf))
        }
        IoctlCmd::Start => {
            let v = EmpStart {
                cq_entries: if rng.one_in(4) { rng.edge32() } else { 1 << rng.below(12) },
                cq_key: sh.key(rng),
                cq_offset: if rng.one_in(4) { rng.next() } else { rng.below(4) * 4096 },
                reserved: if rng.one_in(10) { rng.edge32() } else { 0 },
                ..Default::default()
            };
            let s = arg_size::<EmpStart>(rng);
            (s, encode(rng, &v, s, &mut buf))
        }
        IoctlCmd::GroupSet => {
            let entry = if rng.one_in(2) {
                let q = query(fd, sc);
                let e = group_entry(rng, &q);
                let mut eb = [0u8; GroupEntry::SIZE];
                e.put(&mut eb);
                let at = if rng.one_in(8) {
                    sc.guard() - 1 - rng.below(GroupEntry::SIZE as u64) as usize
                } else {
                    sc.entry_area()
                };
                sc.write(at, &eb);
                at as u64
            } else {
                user_addr(rng, sh, sc)
            };
            let v = EmpGroupSet {
                entry,
                slot: if rng.one_in(8) { rng.edge32() } else { 0 },
                reserved: if rng.one_in(10) { [rng.next(), 0] } else { [0; 2] },
                ..Default::default()
            };
            let s = arg_size::<EmpGroupSet>(rng);
            (s, encode(rng, &v, s, &mut buf))
        }
        IoctlCmd::GroupClear => {
            let slot = if rng.one_in(3) { rng.edge32() } else { sh.slots[rng.below(8) as usize].load(Relaxed) };
            let v = EmpGroupClear { slot, ..Default::default() };
            let s = arg_size::<EmpGroupClear>(rng);
            (s, encode(rng, &v, s, &mut buf))
        }
        IoctlCmd::PortCtx => {
            // Mostly real steps on places near the start of a region (a
            // bring-up's port may really be saved and restored), else edges.
            let v = EmpPortCtx {
                op: if rng.one_in(5) { rng.edge32() } else { 1 + rng.below(5) as u32 },
                key: sh.key(rng),
                offset: if rng.one_in(4) { rng.next() } else { rng.below(16) * 4096 },
                len: match rng.below(5) {
                    0 => rng.next(),
                    1 => CTX_IMAGE_MAX as u64 + rng.below(2),
                    _ => rng.below(16) * 4096 + rng.below(2),
                },
                reserved: if rng.one_in(10) { rng.edge32() } else { 0 },
                result: if rng.one_in(10) { rng.next() } else { 0 },
                ..Default::default()
            };
            let s = arg_size::<EmpPortCtx>(rng);
            (s, encode(rng, &v, s, &mut buf))
        }
        IoctlCmd::Gang => {
            // As an ordinary user every GANG is EPERM; the argument checks
            // still run first.
            // SAFETY: getpid has no preconditions.
            let me = unsafe { libc::getpid() };
            let any = rng.next() as i32;
            let v = EmpGang {
                action: if rng.one_in(4) { rng.edge32() } else { rng.below(8) as u32 },
                pid: rng.pick(&[me, 1, 0, -1, i32::MAX, any]),
                reserved: if rng.one_in(10) { rng.edge32() } else { 0 },
                ..Default::default()
            };
            let s = arg_size::<EmpGang>(rng);
            (s, encode(rng, &v, s, &mut buf))
        }
    };
    let (ptr, ours) = arg_pointer(rng, sh, sc, len);
    if ours {
        sc.write(ptr, &buf[..len]);
    }
    let r = sys_ioctl(fd, cmd.with_size(size), ptr);
    if r == 0 && ours && ptr + 16 <= sc.guard() {
        match cmd {
            IoctlCmd::RegMr if size >= 36 && ptr + 36 <= sc.guard() => {
                let b = sc.read::<36>(ptr);
                sh.remember_key(rng, u32::from_le_bytes([b[32], b[33], b[34], b[35]]));
            }
            IoctlCmd::GroupSet => {
                let b = sc.read::<8>(ptr);
                sh.slots[rng.below(8) as usize].store(u32::from_le_bytes([b[4], b[5], b[6], b[7]]), Relaxed);
            }
            _ => {}
        }
    }
    r
}

/// A command number that is not one of ours: another type, an unknown
/// number, a wrong direction.
fn op_bad_cmd(rng: &mut Rng, sh: &Shared, sc: &Scratch) -> i64 {
    let cmd = match rng.below(4) {
        0 => rng.next() as u32,
        1 => ioc(rng.below(4) as u32, EMP_IOC_MAGIC, rng.pick(&[0, 11, 12, 0x7F, 0xFF]), rng.below(1 << 14) as usize),
        2 => {
            let c = IoctlCmd::ALL[rng.below(IoctlCmd::ALL.len() as u64) as usize];
            let dir = (c.dir() + 1 + rng.below(3) as u32) % 4;
            ioc(dir, EMP_IOC_MAGIC, c as u32, rng.below(128) as usize)
        }
        _ => ioc(rng.below(4) as u32, rng.below(256) as u32, rng.below(256) as u32, rng.below(1 << 14) as usize),
    };
    let (ptr, _) = arg_pointer(rng, sh, sc, 64);
    sys_ioctl(sh.fd(rng), cmd, ptr)
}

/// The well-formed path, deep: register a buffer, START with the CQ in it,
/// load a valid group. Each step may fail (port taken, already started,
/// RLIMIT_MEMLOCK): that is fine, it is the driver's state that matters.
fn op_bring_up(rng: &mut Rng, sh: &Shared, sc: &Scratch) -> i64 {
    let fd = sh.fd(rng);
    let chunk = sh.chunk_addr(rng.below(CHUNKS as u64) as usize);
    let len = sh.chunk.min(64 * 1024);
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
    if sys_mmap(chunk, len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0).is_err() {
        sh.count(-1);
        return -1;
    }
    sh.count(0);
    let mut b = [0u8; EmpRegMr::SIZE];
    EmpRegMr {
        size: EmpRegMr::SIZE as u32,
        access: 0x1F,
        addr: chunk as u64,
        length: len as u64,
        ..Default::default()
    }
    .put(&mut b);
    sc.write(sc.base, &b);
    let r = sys_ioctl(fd, IoctlCmd::RegMr.with_size(EmpRegMr::SIZE), sc.base);
    sh.count(r);
    if r != 0 {
        return r;
    }
    let key = EmpRegMr::get(&sc.read::<{ EmpRegMr::SIZE }>(sc.base)).key;
    sh.remember_key(rng, key);
    let mut b = [0u8; EmpStart::SIZE];
    EmpStart { size: EmpStart::SIZE as u32, cq_entries: 64, cq_key: key, ..Default::default() }.put(&mut b);
    sc.write(sc.base, &b);
    let r = sys_ioctl(fd, IoctlCmd::Start.with_size(EmpStart::SIZE), sc.base);
    sh.count(r);
    let q = query(fd, sc);
    sh.count(0);
    let mut e = group_entry(rng, &q);
    e.bounce_key = 0;
    e.bounce_slots = 0;
    e.bounce_slot_size = 0;
    e.bounce_offset = 0;
    let mut eb = [0u8; GroupEntry::SIZE];
    e.put(&mut eb);
    sc.write(sc.entry_area(), &eb);
    let mut b = [0u8; EmpGroupSet::SIZE];
    EmpGroupSet { size: EmpGroupSet::SIZE as u32, entry: sc.entry_area() as u64, ..Default::default() }.put(&mut b);
    sc.write(sc.base, &b);
    let r = sys_ioctl(fd, IoctlCmd::GroupSet.with_size(EmpGroupSet::SIZE), sc.base);
    if r == 0 {
        let slot = EmpGroupSet::get(&sc.read::<{ EmpGroupSet::SIZE }>(sc.base)).slot;
        sh.slots[rng.below(8) as usize].store(slot, Relaxed);
    }
    r
}

/// mmap of a port descriptor (or not) into a playground chunk with random
/// length, offset, protection and flags.
fn op_mmap(rng: &mut Rng, sh: &Shared) -> i64 {
    let i = rng.below(CHUNKS as u64) as usize;
    let addr = sh.chunk_addr(i);
    let room = sh.playground_len() - i * sh.chunk;
    let len = match rng.below(8) {
        0 => sh.window.saturating_sub(PAGE),
        1 => sh.window + PAGE,
        2 => PAGE,
        3 => 0,
        4 => rng.below(room as u64) as usize,
        _ => sh.window,
    }
    .min(room);
    let off = match rng.below(8) {
        0 => PAGE as i64,
        1 => sh.window as i64,
        2 => (rng.next() & !(PAGE as u64 - 1) & (i64::MAX as u64)) as i64,
        3 => rng.below(PAGE as u64) as i64,
        _ => 0,
    };
    let prot = rng.below(8) as i32; // PROT_READ | PROT_WRITE | PROT_EXEC subsets
    let mut flags = rng.pick(&[libc::MAP_SHARED, libc::MAP_SHARED, libc::MAP_PRIVATE, libc::MAP_SHARED_VALIDATE]);
    for f in [libc::MAP_POPULATE, libc::MAP_LOCKED, libc::MAP_NORESERVE] {
        if rng.one_in(6) {
            flags |= f;
        }
    }
    let fd = if rng.one_in(16) { sh.events[0].load(Relaxed) } else { sh.fd(rng) };
    if rng.one_in(8) {
        // Not fixed, any length (huge ones too): unmapped again at once.
        let any = rng.below(1 << 24) as usize;
        let len = rng.pick(&[sh.window, 1 << 40, usize::MAX & !(PAGE - 1), any]);
        // Shared: a private writable mapping of 1 TiB would only meet the
        // kernel's overcommit check (and its console warning), not the driver.
        let flags = (flags & !(libc::MAP_PRIVATE | libc::MAP_SHARED_VALIDATE)) | libc::MAP_SHARED;
        return match sys_mmap(0, len, prot, flags, fd, off) {
            Ok(p) => {
                sys_munmap(p, len);
                0
            }
            Err(e) => -(e as i64),
        };
    }
    match sys_mmap(addr, len, prot, flags | libc::MAP_FIXED, fd, off) {
        Ok(_) => 0,
        Err(e) => -(e as i64),
    }
}

/// Unmaps, remaps, protects or advises a part of the playground (windows
/// and registered buffers included).
fn op_vm(rng: &mut Rng, sh: &Shared) -> i64 {
    let i = rng.below(CHUNKS as u64) as usize;
    let start = sh.chunk_addr(i) + rng.below((sh.chunk / PAGE) as u64) as usize * PAGE;
    let room = sh.playground + sh.playground_len() - start;
    let pages = if rng.one_in(8) { (room / PAGE) as u64 } else { 4 };
    let len = (PAGE * (1 + rng.below(pages) as usize)).min(room);
    let r = match rng.below(6) {
        0 => {
            // munmap, then take the hole back for the playground.
            let e = sys_munmap(start, len);
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE | libc::MAP_NORESERVE;
            let _ = sys_mmap(start, len, libc::PROT_NONE, flags, -1, 0);
            e
        }
        1 => {
            // An anonymous mapping over it (unmaps whatever was there).
            let prot = rng.pick(&[libc::PROT_NONE, libc::PROT_READ, libc::PROT_READ | libc::PROT_WRITE]);
            sys_mmap(start, len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, -1, 0)
                .err()
                .unwrap_or(0)
        }
        2 => {
            let prot = rng.below(8) as i32;
            // SAFETY: changes protection of playground memory only.
            if unsafe { libc::mprotect(start as *mut libc::c_void, len, prot) } == 0 {
                0
            } else {
                errno()
            }
        }
        3 => {
            let advice = rng.pick(&[
                libc::MADV_DONTNEED,
                libc::MADV_DONTFORK,
                libc::MADV_DOFORK,
                libc::MADV_WIPEONFORK,
                libc::MADV_FREE,
                libc::MADV_REMOVE,
                libc::MADV_COLD,
                libc::MADV_PAGEOUT,
            ]);
            // SAFETY: advice on playground memory only (its contents are
            // the kernel's business; no Rust object lives there).
            if unsafe { libc::madvise(start as *mut libc::c_void, len, advice) } == 0 {
                0
            } else {
                errno()
            }
        }
        _ => {
            // mremap a window or buffer to another chunk, shrinking,
            // growing or keeping its size.
            let j = rng.below(CHUNKS as u64) as usize;
            let to = sh.chunk_addr(j);
            let new_len = rng.pick(&[len, sh.window, PAGE, sh.chunk]).min(sh.playground + sh.playground_len() - to);
            let old_len = rng.pick(&[len, sh.window, PAGE]).min(room);
            let mut flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
            if rng.one_in(4) {
                flags |= libc::MREMAP_DONTUNMAP;
            }
            let overlap = to < start + old_len.max(new_len) && start < to + old_len.max(new_len);
            if overlap || new_len == 0 {
                return -(libc::EINVAL as i64);
            }
            // SAFETY: both ranges lie in the playground.
            let p =
                unsafe { libc::mremap(start as *mut libc::c_void, old_len, new_len, flags, to as *mut libc::c_void) };
            if p == libc::MAP_FAILED {
                errno()
            } else {
                0
            }
        }
    };
    -(r as i64)
}

/// Closes, reopens or dups a port descriptor, or an eventfd.
fn op_fds(rng: &mut Rng, sh: &Shared) -> i64 {
    let slot = &sh.fds[rng.below(FD_SLOTS as u64) as usize];
    match rng.below(6) {
        0 => {
            close(slot.swap(-1, Relaxed));
            0
        }
        1 | 2 => {
            let fd = open_dev(&sh.device);
            if fd < 0 {
                return -(errno() as i64);
            }
            if slot.compare_exchange(-1, fd, Relaxed, Relaxed).is_err() {
                close(fd);
            }
            0
        }
        3 => {
            // A dup: the port lives until its last descriptor closes.
            let src = sh.fd(rng);
            // SAFETY: dup of a descriptor number (a stale one gives EBADF).
            let fd = unsafe { libc::fcntl(src, libc::F_DUPFD_CLOEXEC, 0) };
            if fd < 0 {
                return -(errno() as i64);
            }
            if slot.compare_exchange(-1, fd, Relaxed, Relaxed).is_err() {
                close(fd);
            }
            0
        }
        _ => {
            let e = &sh.events[rng.below(EVENT_SLOTS as u64) as usize];
            close(e.swap(-1, Relaxed));
            // SAFETY: creating an eventfd.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd >= 0 && e.compare_exchange(-1, fd, Relaxed, Relaxed).is_err() {
                close(fd);
            }
            0
        }
    }
}

/// Forks a child that fuzzes the inherited descriptors (and opens its
/// own); the child exits or is killed mid-call.
fn op_fork(rng: &mut Rng, sh: &Shared, sc: &Scratch) -> i64 {
    let calls = 1 + rng.below(200);
    let kill_after_us = if rng.one_in(2) { Some(rng.below(3000)) } else { None };
    let mut child_rng = Rng::new(rng.next());
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the child only makes system calls through these wrappers and
    // touches atomics and its copy of our scratch (no allocation, no lock),
    // then _exits: what is safe after fork in a threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return -(errno() as i64);
    }
    if pid == 0 {
        // Dies with the thread that forked it (a killed round takes its
        // children along); if that thread is gone already, so are we.
        // SAFETY: prctl and getppid are async-signal-safe system calls.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != parent {
                libc::_exit(0);
            }
        }
        for _ in 0..calls {
            child_step(&mut child_rng, sh, sc);
        }
        // SAFETY: leaving the child without running the parent's handlers.
        unsafe { libc::_exit(0) };
    }
    if let Some(us) = kill_after_us {
        std::thread::sleep(std::time::Duration::from_micros(us));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut status = 0;
    // SAFETY: reaping our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFSIGNALED(status) && libc::WTERMSIG(status) != libc::SIGKILL {
        // The child died of its own fault (not ours): report it.
        eprintln!("# kfuzz: a forked child died of signal {}", libc::WTERMSIG(status));
        std::process::exit(3);
    }
    0
}

/// What a forked child does: no allocation, no output.
fn child_step(rng: &mut Rng, sh: &Shared, sc: &Scratch) {
    let r = match rng.below(10) {
        0 => op_mmap(rng, sh),
        1 => op_vm(rng, sh),
        2 => op_fds(rng, sh),
        3 => op_bring_up(rng, sh, sc),
        _ => op_ioctl(rng, sh, sc),
    };
    sh.count(r);
}

/// One step of a round's thread.
fn step(rng: &mut Rng, sh: &Shared, sc: &Scratch) {
    let which = rng.below(1000);
    let (name, r) = match which {
        0..=549 => ("ioctl", op_ioctl(rng, sh, sc)),
        550..=619 => ("bad-cmd", op_bad_cmd(rng, sh, sc)),
        620..=679 => ("bring-up", op_bring_up(rng, sh, sc)),
        680..=799 => ("mmap", op_mmap(rng, sh)),
        800..=899 => ("vm", op_vm(rng, sh)),
        900..=994 => ("fds", op_fds(rng, sh)),
        _ => ("fork", op_fork(rng, sh, sc)),
    };
    sh.count(r);
    if sh.trace {
        eprintln!("# {name} -> {r}");
    }
}

// ---------------------------------------------------------------------------
// Rounds
// ---------------------------------------------------------------------------

/// Counters the supervisor shares with its rounds (a MAP_SHARED page).
struct Counters {
    calls: AtomicU64,
    results: [AtomicU64; 256],
}

fn shared_counters() -> &'static Counters {
    let p = sys_mmap(
        0,
        std::mem::size_of::<Counters>().next_multiple_of(PAGE),
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_ANONYMOUS,
        -1,
        0,
    )
    .expect("counters mmap");
    // SAFETY: a fresh zeroed shared mapping, large and aligned enough for
    // `Counters` (atomics, all-zero is valid), never unmapped.
    unsafe { &*(p as *const Counters) }
}

/// One round, in its own process: set up, run the threads, exit 0.
fn round(args: &Args, seed: u64, calls: u64, counters: &'static Counters) -> ! {
    let window = {
        let fd = open_dev(&args.device);
        let sc = Scratch::new();
        let q = query(fd, &sc);
        close(fd);
        (q.window_size as usize).max(PAGE)
    };
    let chunk = window.max(64 * 1024).next_multiple_of(PAGE);
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let playground = sys_mmap(0, CHUNKS * chunk, libc::PROT_NONE, flags, -1, 0).expect("playground");
    let sh: &'static Shared = Box::leak(Box::new(Shared {
        device: args.device.clone(),
        fds: std::array::from_fn(|_| AtomicI32::new(open_dev(&args.device))),
        events: std::array::from_fn(|_| {
            // SAFETY: creating an eventfd.
            AtomicI32::new(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })
        }),
        keys: std::array::from_fn(|_| AtomicU32::new(0)),
        slots: std::array::from_fn(|_| AtomicU32::new(0)),
        playground,
        chunk,
        window,
        calls: &counters.calls,
        results: &counters.results,
        trace: args.trace,
    }));
    let threads = args.threads.max(1);
    let started = AtomicUsize::new(0);
    let target = sh.calls.load(Relaxed) + calls;
    std::thread::scope(|s| {
        for t in 0..threads {
            let quota = calls / threads as u64 + u64::from((t as u64) < calls % threads as u64);
            let started = &started;
            s.spawn(move || {
                let sc = Scratch::new();
                let mut rng = Rng::new(mix(seed, 0, t as u64));
                // All threads exist before any unmapping: a new thread's
                // stack must not land in a hole of the playground.
                started.fetch_add(1, Relaxed);
                while started.load(Relaxed) < threads {
                    std::thread::yield_now();
                }
                // Calls, not steps, are what a round is given: a step
                // (a bring-up, a forked child) may make many.
                let mut steps = 0u64;
                while sh.calls.load(Relaxed) < target && steps < 4 * quota {
                    step(&mut rng, sh, &sc);
                    steps += 1;
                }
            });
        }
    });
    std::process::exit(0)
}

struct Args {
    seed: u64,
    calls: u64,
    threads: usize,
    first_round: u64,
    device: std::ffi::CString,
    regressions_only: bool,
    skip_regressions: bool,
    trace: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        calls: 100_000,
        threads: 4,
        first_round: 0,
        device: c"/dev/emp-nic".into(),
        regressions_only: false,
        skip_regressions: false,
        trace: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |s: String| -> Result<u64, String> {
            let r = if let Some(h) = s.strip_prefix("0x") { u64::from_str_radix(h, 16) } else { s.parse() };
            r.map_err(|_| format!("not a number: {s}"))
        };
        match arg.as_str() {
            "--seed" => a.seed = num(value("--seed")?)?,
            "--calls" => a.calls = num(value("--calls")?)?,
            "--threads" => a.threads = num(value("--threads")?)?.clamp(1, 64) as usize,
            "--round" => a.first_round = num(value("--round")?)?,
            "--device" => {
                a.device =
                    std::ffi::CString::new(value("--device")?).map_err(|_| "device path has a NUL".to_string())?
            }
            "--regressions-only" => a.regressions_only = true,
            "--skip-regressions" => a.skip_regressions = true,
            "--trace" => a.trace = true,
            "-h" | "--help" => {
                println!(
                    "usage: tap-kfuzz [--seed S] [--calls N] [--threads T] [--round R] [--device PATH] \
                     [--regressions-only | --skip-regressions] [--trace]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other} (try --help)")),
        }
    }
    Ok(a)
}

/// Waits for every remaining child (the orphans a killed round left).
fn reap_all() {
    let mut status = 0;
    // SAFETY: reaping our children; -1 = any, until none is left (ECHILD).
    while unsafe { libc::waitpid(-1, &mut status, 0) } > 0 {}
}

/// Runs the random phase: rounds of `ROUND_CALLS` in fresh processes.
fn random_phase(args: &Args) -> Result<String, String> {
    // Orphaned descendants of a round (its forked children, when the
    // round is killed) become ours, so the supervisor can wait for them
    // before it checks that nothing is left pinned.
    // SAFETY: prctl on ourselves.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) } != 0 {
        return Err(format!("PR_SET_CHILD_SUBREAPER: {}", std::io::Error::last_os_error()));
    }
    let counters = shared_counters();
    let t0 = Instant::now();
    // Rounds run until the calls executed reach --calls: a killed round
    // stops short of its share, the next ones make up for it.
    let mut rounds = 0u64;
    let mut killed = 0u64;
    let mut last_report = Instant::now();
    for r in args.first_round.. {
        let done = counters.calls.load(Relaxed);
        if done >= args.calls {
            break;
        }
        rounds += 1;
        let seed = mix(args.seed, r + 1, 0);
        let calls = ROUND_CALLS.min(args.calls - done);
        // Every third round is killed after a random share of its calls.
        let kill_at = (r % 3 == 1).then(|| Rng::new(seed).below(calls.max(1)));
        let before = counters.calls.load(Relaxed);
        // SAFETY: the supervisor is single-threaded; the child runs the round.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(format!("fork: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            round(args, seed, calls, counters);
        }
        let mut status = 0;
        let mut signalled = false;
        loop {
            // SAFETY: polling our child.
            let w = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if w == pid {
                break;
            }
            if let Some(k) = kill_at {
                if !signalled && counters.calls.load(Relaxed) - before >= k {
                    // SAFETY: signalling our child.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    signalled = true;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        if libc::WIFSIGNALED(status) {
            if !(signalled && libc::WTERMSIG(status) == libc::SIGKILL) {
                return Err(format!(
                    "round {r} (seed {seed:#x}) died of signal {}: replay with --seed {:#x} --round {r} --calls {calls}",
                    libc::WTERMSIG(status),
                    args.seed
                ));
            }
            killed += 1;
        } else if libc::WEXITSTATUS(status) != 0 {
            return Err(format!(
                "round {r} (seed {seed:#x}) exited with {}: replay with --seed {:#x} --round {r} --calls {calls}",
                libc::WEXITSTATUS(status),
                args.seed
            ));
        }
        // A killed round's forked children were reparented to us (the
        // subreaper): the round is over only when they are gone too.
        reap_all();
        if last_report.elapsed().as_secs() >= 30 {
            last_report = Instant::now();
            let n = counters.calls.load(Relaxed);
            println!("# kfuzz: {n} calls, {:.0}/s", n as f64 / t0.elapsed().as_secs_f64());
        }
    }
    let n = counters.calls.load(Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    let mut hist = String::new();
    for (e, c) in counters.results.iter().enumerate() {
        let c = c.load(Relaxed);
        if c > 0 {
            let name = if e == 0 { "ok".to_string() } else { errno_name(e as i32) };
            hist.push_str(&format!(" {name}={c}"));
        }
    }
    println!("# kfuzz: results:{hist}");
    Ok(format!("{n} calls in {rounds} rounds ({killed} killed mid-run) in {secs:.1} s, {:.0} calls/s", n as f64 / secs))
}

fn errno_name(e: i32) -> String {
    let names = [
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::EBADF, "EBADF"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::ENOMEM, "ENOMEM"),
        (libc::EACCES, "EACCES"),
        (libc::EFAULT, "EFAULT"),
        (libc::EBUSY, "EBUSY"),
        (libc::EEXIST, "EEXIST"),
        (libc::ENODEV, "ENODEV"),
        (libc::EINVAL, "EINVAL"),
        (libc::ENOTTY, "ENOTTY"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::E2BIG, "E2BIG"),
        (libc::EOVERFLOW, "EOVERFLOW"),
        (libc::EALREADY, "EALREADY"),
        (libc::ENOTCONN, "ENOTCONN"),
        (libc::EOPNOTSUPP, "EOPNOTSUPP"),
        (libc::ETIMEDOUT, "ETIMEDOUT"),
        (libc::ENOSYS, "ENOSYS"),
    ];
    names.iter().find(|(n, _)| *n == e).map(|(_, s)| s.to_string()).unwrap_or_else(|| format!("errno{e}"))
}

// ---------------------------------------------------------------------------
// Regressions: deterministic cases (every finding of the fuzzer lands here)
// ---------------------------------------------------------------------------

/// REG_MR of `length` bytes at `addr` through a struct in our memory.
fn reg_mr_raw(fd: i32, addr: u64, length: u64) -> i64 {
    let mut b = [0u8; EmpRegMr::SIZE];
    EmpRegMr { size: EmpRegMr::SIZE as u32, access: 3, addr, length, ..Default::default() }.put(&mut b);
    sys_ioctl(fd, IoctlCmd::RegMr.with_size(EmpRegMr::SIZE), b.as_mut_ptr() as usize)
}

type Case = fn(i32) -> Result<(), String>;

fn expect(what: &str, r: i64, ok: &[i32]) -> Result<(), String> {
    if r < 0 && ok.contains(&(-r as i32)) {
        Ok(())
    } else {
        Err(format!("{what}: returned {r}, wanted one of {ok:?} (negated errnos)"))
    }
}

/// PORT_CTX through a struct in our memory; the result field, or -errno.
fn port_ctx_raw(fd: i32, op: u32, key: u32, offset: u64, len: u64) -> Result<u64, i64> {
    let mut b = [0u8; EmpPortCtx::SIZE];
    EmpPortCtx { size: EmpPortCtx::SIZE as u32, op, key, offset, len, ..Default::default() }.put(&mut b);
    let r = sys_ioctl(fd, IoctlCmd::PortCtx.with_size(EmpPortCtx::SIZE), b.as_mut_ptr() as usize);
    if r == 0 {
        Ok(EmpPortCtx::get(&b).result)
    } else {
        Err(r)
    }
}

/// A started port: `len` bytes of fresh memory registered (key returned),
/// the CQ (64 entries) at its start.
fn started_port(fd: i32, len: usize) -> Result<(usize, u32), String> {
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let buf =
        sys_mmap(0, len, rw, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0).map_err(|e| format!("mmap: errno {e}"))?;
    let mut b = [0u8; EmpRegMr::SIZE];
    EmpRegMr { size: EmpRegMr::SIZE as u32, access: 3, addr: buf as u64, length: len as u64, ..Default::default() }
        .put(&mut b);
    let r = sys_ioctl(fd, IoctlCmd::RegMr.with_size(EmpRegMr::SIZE), b.as_mut_ptr() as usize);
    if r != 0 {
        sys_munmap(buf, len);
        return Err(format!("REG_MR: {r}"));
    }
    let key = EmpRegMr::get(&b).key;
    let mut s = [0u8; EmpStart::SIZE];
    EmpStart { size: EmpStart::SIZE as u32, cq_entries: 64, cq_key: key, ..Default::default() }.put(&mut s);
    let r = sys_ioctl(fd, IoctlCmd::Start.with_size(EmpStart::SIZE), s.as_mut_ptr() as usize);
    if r != 0 {
        sys_munmap(buf, len);
        return Err(format!("START: {r}"));
    }
    Ok((buf, key))
}

/// Forks a child that opens a port of `fd`'s device, maps its window,
/// saves the port (PORT_CTX) and touches the mapping — after restoring
/// and resuming it when `restore`. Returns the child's wait status: a
/// window mapping is not inherited (VM_DONTCOPY), so the child makes its
/// own, and may die of the touch.
fn in_child(fd: i32, restore: bool) -> Result<i32, String> {
    let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
    // SAFETY: fork in the single-threaded regression phase; the child only
    // makes system calls and exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: errno {}", errno()));
    }
    if pid == 0 {
        let code = window_after_save(&path, restore);
        // SAFETY: leaving the child without running the parent's exit code.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Ok(status)
}

/// [`in_child`]'s work; returns the exit code (0, or the step that failed),
/// or dies touching the window of a saved port.
fn window_after_save(path: &std::ffi::CStr, restore: bool) -> i32 {
    use emp_uapi::sram::{ctl, port_state};
    let fd = open_dev(path);
    if fd < 0 {
        return 10;
    }
    let sc = Scratch::new();
    let Ok((_, key)) = started_port(fd, 256 * 1024) else { return 11 };
    let win = query(fd, &sc).window_size as usize;
    let Ok(p) = sys_mmap(0, win, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) else { return 12 };
    // SAFETY: the port's window, mapped above (a saved port's faults).
    let state = || unsafe { std::ptr::read_volatile((p + ctl::STATE) as *const u32) };
    if state() != port_state::OPEN {
        return 13;
    }
    if port_ctx_raw(fd, port_ctx::SUSPEND, 0, 0, 0).is_err() {
        return 14;
    }
    let t0 = Instant::now();
    while port_ctx_raw(fd, port_ctx::STABLE, 0, 0, 0) != Ok(1) {
        if t0.elapsed().as_secs() > 5 {
            return 15;
        }
    }
    let Ok(image) = port_ctx_raw(fd, port_ctx::SAVE, key, 64 * 1024, 128 * 1024) else { return 16 };
    if restore {
        if port_ctx_raw(fd, port_ctx::RESTORE, key, 64 * 1024, image).is_err() {
            return 17;
        }
        if port_ctx_raw(fd, port_ctx::RESUME, 0, 0, 0).is_err() {
            return 18;
        }
    }
    // Saved, this touch must fault; restored and resumed, it reads the port
    // open through the same mapping.
    if state() != port_state::OPEN {
        return 19;
    }
    0
}

fn want_err(what: &str, r: Result<u64, i64>, ok: &[i32]) -> Result<(), String> {
    match r {
        Ok(v) => Err(format!("{what}: succeeded ({v}), wanted one of {ok:?}")),
        Err(e) => expect(what, e, ok),
    }
}

const REGRESSIONS: &[(&str, Case)] = &[
    ("PORT_CTX before START: ENOTCONN; unknown step, reserved bits, RESTORE of a port not saved: EINVAL", |fd| {
        want_err("SUSPEND unstarted", port_ctx_raw(fd, port_ctx::SUSPEND, 0, 0, 0), &[libc::ENOTCONN])?;
        want_err("SAVE unstarted", port_ctx_raw(fd, port_ctx::SAVE, 0, 0, 4096), &[libc::ENOTCONN, libc::ENOENT])?;
        want_err("step 0", port_ctx_raw(fd, 0, 0, 0, 0), &[libc::EINVAL])?;
        want_err("step 6", port_ctx_raw(fd, 6, 0, 0, 0), &[libc::EINVAL])?;
        want_err("RESTORE unsaved", port_ctx_raw(fd, port_ctx::RESTORE, 0, 0, 4096), &[libc::EINVAL])?;
        let mut b = [0u8; EmpPortCtx::SIZE];
        EmpPortCtx { size: EmpPortCtx::SIZE as u32, op: port_ctx::SUSPEND, reserved: 1, ..Default::default() }
            .put(&mut b);
        let r = sys_ioctl(fd, IoctlCmd::PortCtx.with_size(EmpPortCtx::SIZE), b.as_mut_ptr() as usize);
        expect("SUSPEND with reserved bits", r, &[libc::EINVAL])
    }),
    ("PORT_CTX SAVE naming another key or a place outside the region: ENOENT / EINVAL, the port unchanged", |fd| {
        let len = 64 * 1024;
        let (buf, key) = started_port(fd, len)?;
        let r = (|| {
            port_ctx_raw(fd, port_ctx::SUSPEND, 0, 0, 0).map_err(|e| format!("SUSPEND: {e}"))?;
            want_err("SAVE, another key", port_ctx_raw(fd, port_ctx::SAVE, key ^ 0x10000, 0, 4096), &[libc::ENOENT])?;
            let l = len as u64;
            for (off, room) in [(l, 1), (l - 4096, 8192), (0, 0), (u64::MAX, 2), (4096, u64::MAX)] {
                want_err(
                    &format!("SAVE at {off} room {room}"),
                    port_ctx_raw(fd, port_ctx::SAVE, key, off, room),
                    &[libc::EINVAL],
                )?;
            }
            // Still open and suspended: it resumes.
            port_ctx_raw(fd, port_ctx::RESUME, 0, 0, 0).map_err(|e| format!("RESUME: {e}")).map(|_| ())
        })();
        sys_munmap(buf, len);
        r
    }),
    (
        "PORT_CTX round trip: a corrupted image is refused (EBADMSG), the intact one restores, nothing pinned after",
        |fd| {
            let sc = Scratch::new();
            let len = 256 * 1024;
            let (buf, key) = started_port(fd, len)?;
            let r = (|| {
                port_ctx_raw(fd, port_ctx::SUSPEND, 0, 0, 0).map_err(|e| format!("SUSPEND: {e}"))?;
                want_err("SUSPEND twice", port_ctx_raw(fd, port_ctx::SUSPEND, 0, 0, 0), &[libc::EALREADY])?;
                let t0 = Instant::now();
                while port_ctx_raw(fd, port_ctx::STABLE, 0, 0, 0).map_err(|e| format!("STABLE: {e}"))? != 1 {
                    if t0.elapsed().as_secs() > 5 {
                        return Err("an idle suspended port never became stable".into());
                    }
                }
                let at = 64 * 1024u64;
                let image = port_ctx_raw(fd, port_ctx::SAVE, key, at, 128 * 1024).map_err(|e| format!("SAVE: {e}"))?;
                if !(72..=128 * 1024).contains(&image) {
                    return Err(format!("SAVE returned an image of {image} bytes"));
                }
                want_err("SAVE twice", port_ctx_raw(fd, port_ctx::SAVE, key, at, 128 * 1024), &[libc::EALREADY])?;
                want_err("SUSPEND saved", port_ctx_raw(fd, port_ctx::SUSPEND, 0, 0, 0), &[libc::EAGAIN])?;
                let win = query(fd, &sc).window_size as usize;
                let m = sys_mmap(0, win, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
                if let Ok(p) = m {
                    sys_munmap(p, win);
                    return Err("a saved port's window could be mapped".into());
                }
                want_err(
                    "RESTORE too long",
                    port_ctx_raw(fd, port_ctx::RESTORE, key, 0, CTX_IMAGE_MAX as u64 + 1),
                    &[libc::EINVAL],
                )?;
                // One flipped byte in the checksummed body.
                let byte = (buf + at as usize + 20) as *mut u8;
                // SAFETY: inside our own registered buffer.
                unsafe { *byte ^= 0x40 };
                want_err("RESTORE corrupted", port_ctx_raw(fd, port_ctx::RESTORE, key, at, image), &[libc::EBADMSG])?;
                // SAFETY: as above, flipped back.
                unsafe { *byte ^= 0x40 };
                port_ctx_raw(fd, port_ctx::RESTORE, key, at, image).map_err(|e| format!("RESTORE: {e}"))?;
                port_ctx_raw(fd, port_ctx::RESUME, 0, 0, 0).map_err(|e| format!("RESUME: {e}"))?;
                let p = sys_mmap(0, win, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
                    .map_err(|e| format!("mmap after RESTORE: errno {e}"))?;
                sys_munmap(p, win);
                Ok(())
            })();
            sys_munmap(buf, len);
            r
        },
    ),
    ("a saved port's mapping faults (SIGBUS) until RESTORE, then reaches its window again (each in a child)", |fd| {
        let saved = in_child(fd, false)?;
        if !(libc::WIFSIGNALED(saved) && libc::WTERMSIG(saved) == libc::SIGBUS) {
            return Err(format!("a touch of a saved port's window did not fault (status {saved:#x})"));
        }
        match in_child(fd, true)? {
            0 => Ok(()),
            st => Err(format!("the restored port's mapping: status {st:#x} (exit code = the step that failed)")),
        }
    }),
    ("a port saved and then closed: its context is discarded, nothing stays pinned (QUERY on another port)", |fd| {
        let len = 128 * 1024;
        let (buf, key) = started_port(fd, len)?;
        let r = (|| {
            port_ctx_raw(fd, port_ctx::SUSPEND, 0, 0, 0).map_err(|e| format!("SUSPEND: {e}"))?;
            let t0 = Instant::now();
            while port_ctx_raw(fd, port_ctx::STABLE, 0, 0, 0).map_err(|e| format!("STABLE: {e}"))? != 1 {
                if t0.elapsed().as_secs() > 5 {
                    return Err("an idle suspended port never became stable".into());
                }
            }
            port_ctx_raw(fd, port_ctx::SAVE, key, 0, len as u64).map_err(|e| format!("SAVE: {e}"))?;
            // Its slot is free: another port opens (and holds what it pins).
            let other = open_dev(c"/dev/emp-nic");
            if other < 0 {
                return Err(format!("open while saved: {}", std::io::Error::last_os_error()));
            }
            let sc = Scratch::new();
            let pinned = query(other, &sc).pinned_pages;
            // SAFETY: closing our saved port's descriptor: the driver
            // discards the context and unpins its region.
            unsafe { libc::dup2(other, fd) };
            let after = query(other, &sc).pinned_pages;
            close(other);
            if after + (len / PAGE) as u64 != pinned {
                return Err(format!("{pinned} pages pinned while saved, {after} after its close"));
            }
            Ok(())
        })();
        sys_munmap(buf, len);
        r
    }),
    (
        "GANG: reserved bits or pid <= 0 EINVAL, otherwise EPERM without CAP_SYS_ADMIN; a read-only file holds no port",
        |fd| {
            let gang = |fd: i32, action: u32, pid: i32, reserved: u32| {
                let mut b = [0u8; EmpGang::SIZE];
                EmpGang { size: EmpGang::SIZE as u32, action, pid, reserved, ..Default::default() }.put(&mut b);
                sys_ioctl(fd, IoctlCmd::Gang.with_size(EmpGang::SIZE), b.as_mut_ptr() as usize)
            };
            expect("GANG pid 0", gang(fd, 6, 0, 0), &[libc::EINVAL])?;
            expect("GANG reserved", gang(fd, 6, 1, 1), &[libc::EINVAL])?;
            // SAFETY: geteuid and getpid have no preconditions.
            let (root, me) = unsafe { (libc::geteuid() == 0, libc::getpid()) };
            if !root {
                expect("GANG as a user", gang(fd, 6, me, 0), &[libc::EPERM])?;
            }
            // SAFETY: a valid C path.
            let ro = unsafe { libc::open(c"/dev/emp-nic".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
            if ro < 0 {
                return Err(format!("open read-only: {}", std::io::Error::last_os_error()));
            }
            let sc = Scratch::new();
            let r = sys_ioctl(ro, IoctlCmd::Query.with_size(EmpQuery::SIZE), sc.base);
            let m = sys_mmap(0, PAGE, libc::PROT_READ, libc::MAP_SHARED, ro, 0);
            let unknown = if root { gang(ro, 99, me, 0) } else { -(libc::EINVAL as i64) };
            close(ro);
            if let Ok(p) = m {
                sys_munmap(p, PAGE);
                return Err("a read-only file's window could be mapped".into());
            }
            expect("QUERY on a read-only file", r, &[libc::EBADF])?;
            expect("GANG unknown action (root)", unknown, &[libc::EINVAL])
        },
    ),
    ("REG_MR ending in the last page of the address space (page round-up would overflow): EFAULT", |fd| {
        expect("REG_MR", reg_mr_raw(fd, 0xFFFF_FFFF_FFFF_F000, 0xFFF), &[libc::EFAULT])?;
        expect("REG_MR", reg_mr_raw(fd, u64::MAX - 1, 1), &[libc::EFAULT])?;
        expect("REG_MR", reg_mr_raw(fd, 0xFFFF_FFFF_FFFF_F001, 0xFFE), &[libc::EFAULT])
    }),
    ("REG_MR wrapping the address space: EINVAL", |fd| {
        expect("REG_MR", reg_mr_raw(fd, u64::MAX, 2), &[libc::EINVAL])?;
        expect("REG_MR", reg_mr_raw(fd, 0x1000, u64::MAX), &[libc::EINVAL])
    }),
    ("REG_MR of kernel memory: EFAULT", |fd| {
        expect("REG_MR", reg_mr_raw(fd, 0xFFFF_8880_0000_0000, 4096), &[libc::EFAULT])?;
        expect("REG_MR", reg_mr_raw(fd, 0xFFFF_FFFF_8100_0000, 1 << 20), &[libc::EFAULT, libc::ENOMEM])
    }),
    ("REG_MR of the port's own mapped window: EFAULT", |fd| {
        let sc = Scratch::new();
        let win = query(fd, &sc).window_size as usize;
        let p = sys_mmap(0, win, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
            .map_err(|e| format!("mmap: errno {e}"))?;
        let r = reg_mr_raw(fd, p as u64, win as u64);
        sys_munmap(p, win);
        expect("REG_MR", r, &[libc::EFAULT])
    }),
    ("GROUP_SET with the entry at a kernel address, NULL, or straddling a guard page: EFAULT or ENOTCONN", |fd| {
        let sc = Scratch::new();
        for entry in [0xFFFF_8880_0000_0000u64, 0, (sc.guard() - 512) as u64] {
            let mut b = [0u8; EmpGroupSet::SIZE];
            EmpGroupSet { size: EmpGroupSet::SIZE as u32, entry, ..Default::default() }.put(&mut b);
            let r = sys_ioctl(fd, IoctlCmd::GroupSet.with_size(EmpGroupSet::SIZE), b.as_mut_ptr() as usize);
            expect("GROUP_SET", r, &[libc::EFAULT, libc::ENOTCONN])?;
        }
        Ok(())
    }),
    ("REG_MR whose struct is read-only (no key can be returned): EFAULT and nothing stays pinned", |fd| {
        let sc = Scratch::new();
        let before = query(fd, &sc).pinned_pages;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        let buf = sys_mmap(0, 4 * PAGE, rw, anon, -1, 0).map_err(|e| format!("mmap: errno {e}"))?;
        let arg = sys_mmap(0, PAGE, rw, anon, -1, 0).map_err(|e| format!("mmap: errno {e}"))?;
        let mut b = [0u8; EmpRegMr::SIZE];
        EmpRegMr {
            size: EmpRegMr::SIZE as u32,
            access: 3,
            addr: buf as u64,
            length: 4 * PAGE as u64,
            ..Default::default()
        }
        .put(&mut b);
        // SAFETY: `arg` is a fresh page of ours, then made read-only.
        unsafe {
            std::ptr::copy_nonoverlapping(b.as_ptr(), arg as *mut u8, b.len());
            libc::mprotect(arg as *mut libc::c_void, PAGE, libc::PROT_READ);
        }
        let r = sys_ioctl(fd, IoctlCmd::RegMr.with_size(EmpRegMr::SIZE), arg);
        let after = query(fd, &sc).pinned_pages;
        sys_munmap(arg, PAGE);
        sys_munmap(buf, 4 * PAGE);
        expect("REG_MR", r, &[libc::EFAULT])?;
        if after != before {
            return Err(format!("pinned pages {before} before, {after} after a REG_MR that failed"));
        }
        Ok(())
    }),
    ("the largest _IOC_SIZE with its struct straddling a guard page: EFAULT, no over-read", |fd| {
        let sc = Scratch::new();
        let size = (1 << 14) - 1;
        for c in IoctlCmd::ALL {
            let r = sys_ioctl(fd, c.with_size(size), sc.guard() - 64);
            expect(&format!("{c:?}"), r, &[libc::EFAULT])?;
        }
        Ok(())
    }),
];

fn counters_clear(device: &std::ffi::CStr) -> Result<(), String> {
    let fd = open_dev(device);
    if fd < 0 {
        return Err(format!("open: {}", std::io::Error::last_os_error()));
    }
    let sc = Scratch::new();
    let q = query(fd, &sc);
    close(fd);
    if q.size == 0 {
        return Err("QUERY failed".into());
    }
    if q.pinned_pages != 0 || q.groups_in_use != 0 {
        return Err(format!("{} pages still pinned, {} group slots held", q.pinned_pages, q.groups_in_use));
    }
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tap-kfuzz: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "# kfuzz: seed {:#x}, calls {}, threads {}, device {}",
        args.seed,
        args.calls,
        args.threads,
        args.device.to_string_lossy()
    );
    let regressions = if args.skip_regressions { &[][..] } else { REGRESSIONS };
    let planned = regressions.len() + if args.regressions_only { 0 } else { 2 };
    let mut t = Tap::new(planned, false);
    for (name, case) in regressions {
        let fd = open_dev(&args.device);
        let r = if fd < 0 { Err(format!("open: {}", std::io::Error::last_os_error())) } else { case(fd) };
        close(fd);
        t.check(&format!("regression: {name}"), r);
    }
    if !args.regressions_only {
        let r = random_phase(&args);
        if let Ok(summary) = &r {
            println!("# kfuzz: {summary}");
        }
        t.check(
            &format!("random phase (seed {:#x}): every round ended by its own exit or our SIGKILL", args.seed),
            r.map(|_| ()),
        );
        t.check("after the fuzzer: no page pinned, no group slot held (QUERY)", counters_clear(&args.device));
    }
    std::process::exit(t.finish());
}
