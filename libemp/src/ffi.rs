//! The C ABI (`libemp.so`, `include/emp.h`): the same verbs, errors as
//! negative errno values.

use core::ffi::{c_char, c_int, c_void};
use std::ffi::CStr;
use std::time::Duration;

use crate::{Completion, Device, Endpoint, Error, EventSource, RemoteWord, Sge, Width};

/// Opaque device handle.
pub struct EmpDevice(Device);

/// C view of a completion (`struct emp_wc`).
#[repr(C)]
pub struct EmpWc {
    /// Cookie.
    pub wr_id: u64,
    /// `Status` code.
    pub status: u32,
    /// 1 for a receive.
    pub is_recv: u32,
    /// Bytes transferred.
    pub byte_len: u32,
    /// Full message length.
    pub msg_len: u32,
    /// Tag.
    pub tag: u64,
    /// Sender node.
    pub src_node: u16,
    /// Sender port.
    pub src_port: u16,
    /// `Opcode` of the completed descriptor (`enum emp_wc_opcode`).
    pub opcode: u8,
    /// Reserved.
    pub reserved: [u8; 3],
}

/// C view of a completion with its immediate data (`struct emp_wc_ex`,
/// since EMP_1.4).
#[repr(C)]
pub struct EmpWcEx {
    /// The completion.
    pub wc: EmpWc,
    /// With `EMP_WC_WITH_IMM`: the sender's immediate data.
    pub imm: u32,
    /// `EMP_WC_WITH_*` flags.
    pub wc_flags: u32,
}

/// `EmpWcEx::wc_flags` / `EmpProbedEx::flags`: `imm` is valid.
pub const EMP_WC_WITH_IMM: u32 = 1;

/// C view of a probed message with its immediate data (`struct
/// emp_probed_ex`, since EMP_1.4).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct EmpProbedEx {
    /// The message, as `emp_probe` reports it.
    pub msg: EmpProbed,
    /// With `EMP_WC_WITH_IMM`: the sender's immediate data.
    pub imm: u32,
    /// `EMP_WC_WITH_*` flags.
    pub flags: u32,
}

/// C view of a remote word (`struct emp_remote_word`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EmpRemoteWord {
    /// The target's memory key.
    pub key: u32,
    /// Width in bytes: 4 or 8.
    pub width: u32,
    /// Offset within the target's region.
    pub offset: u64,
    /// The region's remote-access secret (since EMP_1.2).
    pub secret: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// C view of a probed message (`struct emp_probed`, since EMP_1.3).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct EmpProbed {
    /// Its tag.
    pub tag: u64,
    /// Its length in bytes.
    pub len: u32,
    /// The claim handle (`emp_probe_claim`), else 0.
    pub handle: u32,
    /// Its sender's node.
    pub src_node: u16,
    /// Its sender's port.
    pub src_port: u16,
    /// Reserved, zero.
    pub reserved: u32,
}

/// C view of a reliable broadcast's algorithm (`struct emp_rbcast_algo`,
/// EMP_1.6): [`crate::RbcastAlgo`].
#[repr(C)]
pub struct EmpRbcastAlgo {
    /// Co-roots (0: the root alone).
    pub coroots: u16,
    /// ACK every M, skewed (0 or 1: every one; with `naks`, 0: every half window).
    pub ack_every: u8,
    /// Window entries the root may use (0: all).
    pub window: u8,
    /// 1: members NAK gaps and collectors repair them at once.
    pub naks: u8,
    /// Reserved, zero.
    pub reserved: [u8; 3],
}

impl EmpRbcastAlgo {
    /// The algorithm, and `root` as a rank.
    fn with_root(&self, root: c_int) -> crate::Result<(crate::RbcastAlgo, usize)> {
        if self.naks > 1 || self.reserved != [0; 3] {
            return Err(Error::invalid("emp_rbcast_algo: naks is 0 or 1, reserved bytes are zero"));
        }
        let root = usize::try_from(root).map_err(|_| Error::invalid("negative root"))?;
        let algo = crate::RbcastAlgo {
            coroots: self.coroots,
            ack_every: self.ack_every,
            window: self.window,
            nak: self.naks == 1,
        };
        Ok((algo, root))
    }
}

/// C view of port information (`struct emp_port_info`).
#[repr(C)]
pub struct EmpPortInfo {
    /// Node id.
    pub node: u16,
    /// Port.
    pub port: u16,
    /// MTU.
    pub mtu: u32,
    /// Nodes reachable.
    pub nodes: u32,
    /// Send ring entries.
    pub send_entries: u32,
    /// Receive ring entries.
    pub recv_entries: u32,
    /// Reserved.
    pub reserved: u32,
    /// Largest message.
    pub msg_max: u64,
}

fn errno(e: &Error) -> c_int {
    match e {
        Error::Os(io) => -io.raw_os_error().unwrap_or(libc::EIO),
        Error::NoDevice => -libc::ENODEV,
        Error::Nic { errno, .. } => -errno,
        Error::Protocol(_) => -libc::EPIPE,
        Error::Job(_) => -libc::EPROTO,
        Error::RingFull => -libc::EAGAIN,
        Error::TooManySges => -libc::EINVAL,
        Error::ArenaFull => -libc::ENOMEM,
        Error::Timeout => -libc::ETIMEDOUT,
        // A failed operation's status is in its completion; as an errno: EIO.
        Error::Failed(_) => -libc::EIO,
        Error::Unsupported(_) => -libc::EOPNOTSUPP,
        Error::InvalidOp { .. } | Error::InvalidArgument(_) => -libc::EINVAL,
        Error::Collective { cause, .. } => errno(cause),
    }
}

/// Opens `path` (NULL = `EMP_DEVICE`). Returns NULL and sets `*err` (if
/// non-NULL) to a negative errno on failure.
///
/// # Safety
/// `path` is NULL or a valid C string; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn emp_open_device(path: *const c_char, err: *mut c_int) -> *mut EmpDevice {
    let r = if path.is_null() {
        Device::open()
    } else {
        // SAFETY: the caller passes a valid C string.
        match unsafe { CStr::from_ptr(path) }.to_str() {
            Ok(p) => Device::open_path(p),
            Err(_) => Err(Error::NoDevice),
        }
    };
    match r {
        Ok(d) => Box::into_raw(Box::new(EmpDevice(d))),
        Err(e) => {
            if !err.is_null() {
                // SAFETY: the caller passes a writable pointer or NULL.
                unsafe { *err = errno(&e) };
            }
            core::ptr::null_mut()
        }
    }
}

/// Closes a device: the NIC releases the port and everything registered.
///
/// # Safety
/// `dev` came from `emp_open_device` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn emp_close_device(dev: *mut EmpDevice) {
    if !dev.is_null() {
        // SAFETY: made by Box::into_raw in emp_open_device.
        drop(unsafe { Box::from_raw(dev) });
    }
}

/// Fills `*info`.
///
/// # Safety
/// `dev` is open; `info` is writable.
#[no_mangle]
pub unsafe extern "C" fn emp_query_port(dev: *mut EmpDevice, info: *mut EmpPortInfo) -> c_int {
    // SAFETY: caller guarantees both pointers.
    let (d, out) = unsafe { (&(*dev).0, &mut *info) };
    let i = d.info();
    *out = EmpPortInfo {
        node: i.node,
        port: i.port,
        mtu: i.mtu,
        nodes: i.nodes,
        send_entries: i.send_entries,
        recv_entries: i.recv_entries,
        reserved: 0,
        msg_max: i.msg_max,
    };
    0
}

/// Allocates `len` bytes of registered memory; returns its address and
/// sets `*key` and `*offset` for SGEs.
///
/// # Safety
/// `dev` is open; `key` and `offset` are writable.
#[no_mangle]
pub unsafe extern "C" fn emp_alloc(dev: *mut EmpDevice, len: usize, key: *mut u32, offset: *mut u64) -> *mut c_void {
    // SAFETY: caller guarantees the pointers.
    let d = unsafe { &mut (*dev).0 };
    match d.alloc(len) {
        Ok(mut b) => {
            let s = b.sge(0, 0);
            // SAFETY: writable per the contract.
            unsafe {
                *key = s.key;
                *offset = s.offset;
            }
            b.as_mut_slice().as_mut_ptr().cast()
        }
        Err(_) => core::ptr::null_mut(),
    }
}

/// Registers `[addr, addr+len)`; returns the key (>= 0) or a negative errno.
///
/// # Safety
/// `dev` is open; the memory stays mapped until deregistered.
#[no_mangle]
pub unsafe extern "C" fn emp_reg_mr(dev: *mut EmpDevice, addr: *const c_void, len: usize, access: u32) -> i64 {
    // SAFETY: caller guarantees `dev`.
    let d = unsafe { &mut (*dev).0 };
    // SAFETY: forwarded caller guarantee about the memory.
    match unsafe { d.reg_mr(addr.cast(), len, access as u8) } {
        Ok(mr) => mr.key as i64,
        Err(e) => errno(&e) as i64,
    }
}

/// 1 when registered memory is reached by virtual address at each access
/// (direct attach: a registration survives the memory being unmapped and
/// mapped again, so it may be cached), 0 when registration pins pages (the
/// kernel driver).
///
/// # Safety
/// `dev` is open.
#[no_mangle]
pub unsafe extern "C" fn emp_mr_by_address(dev: *mut EmpDevice) -> c_int {
    // SAFETY: caller guarantees `dev`.
    let d = unsafe { &(*dev).0 };
    c_int::from(d.mr_by_address())
}

/// Deregisters a key.
///
/// # Safety
/// `dev` is open.
#[no_mangle]
pub unsafe extern "C" fn emp_dereg_mr(dev: *mut EmpDevice, key: u32) -> c_int {
    // SAFETY: caller guarantees `dev`.
    let d = unsafe { &mut (*dev).0 };
    match d.dereg_mr(crate::MemoryRegion { key, secret: 0, addr: 0, len: 0 }) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

unsafe fn sges<'a>(sge: *const Sge, n: usize) -> &'a [Sge] {
    if n == 0 || sge.is_null() {
        &[]
    } else {
        // SAFETY: the caller passes `n` readable SGEs.
        unsafe { core::slice::from_raw_parts(sge, n) }
    }
}

/// Posts a send; 0, -EAGAIN when the ring is full, or a negative errno.
///
/// # Safety
/// `dev` is open; `sge` points to `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_post_send(
    dev: *mut EmpDevice,
    wr_id: u64,
    node: u16,
    port: u16,
    tag: u64,
    sge: *const Sge,
    n: usize,
) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, s) = unsafe { (&mut (*dev).0, sges(sge, n)) };
    match d.post_send(wr_id, Endpoint { node, port }, tag, s) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// Posts a send with 32 bits of immediate data, reported by the
/// receive's completion (`emp_poll_cq_ex`); as `emp_post_send` otherwise.
///
/// # Safety
/// `dev` is open; `sge` points to `n` entries.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn emp_post_send_imm(
    dev: *mut EmpDevice,
    wr_id: u64,
    node: u16,
    port: u16,
    tag: u64,
    sge: *const Sge,
    n: usize,
    imm: u32,
) -> c_int {
    if dev.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees the pointers.
    let (d, s) = unsafe { (&mut (*dev).0, sges(sge, n)) };
    match d.post_send_imm(wr_id, Endpoint { node, port }, tag, s, imm) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// Posts a receive (node/port may be EMP_ANY_NODE/EMP_ANY_PORT).
///
/// # Safety
/// `dev` is open; `sge` points to `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_post_recv(
    dev: *mut EmpDevice,
    wr_id: u64,
    node: u16,
    port: u16,
    tag: u64,
    ignore: u64,
    sge: *const Sge,
    n: usize,
) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, s) = unsafe { (&mut (*dev).0, sges(sge, n)) };
    match d.post_recv(wr_id, Endpoint { node, port }, tag, ignore, s) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// `emp_probe` and `emp_probe_claim`: 1 and `*out` filled when a message
/// was found, 0 when none, else a negative errno.
unsafe fn probe_into(
    dev: *mut EmpDevice,
    src: Endpoint,
    tag: u64,
    ignore: u64,
    claim: bool,
    out: *mut EmpProbed,
) -> c_int {
    if out.is_null() {
        return -libc::EINVAL;
    }
    let mut ex = EmpProbedEx::default();
    // SAFETY: the caller's guarantees, passed on; `ex` is writable.
    let r = unsafe { probe_into_ex(dev, src, tag, ignore, claim, &mut ex) };
    if r == 1 {
        // SAFETY: the caller passes a writable `struct emp_probed`.
        unsafe { out.write(ex.msg) };
    }
    r
}

/// As `probe_into`, with the message's immediate data.
///
/// # Safety
/// `dev` is open (or NULL: -EINVAL); `out` is writable (or NULL).
unsafe fn probe_into_ex(
    dev: *mut EmpDevice,
    src: Endpoint,
    tag: u64,
    ignore: u64,
    claim: bool,
    out: *mut EmpProbedEx,
) -> c_int {
    if dev.is_null() || out.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: the caller passes a live device.
    let d = unsafe { &mut (*dev).0 };
    let found = if claim {
        d.probe_claim(src, tag, ignore).map(|c| c.map(|c| (c.msg, c.handle())))
    } else {
        d.probe(src, tag, ignore).map(|m| m.map(|m| (m, 0)))
    };
    match found {
        Ok(Some((m, handle))) => {
            let msg =
                EmpProbed { tag: m.tag, len: m.len, handle, src_node: m.src.node, src_port: m.src.port, reserved: 0 };
            let p =
                EmpProbedEx { msg, imm: m.imm.unwrap_or(0), flags: if m.imm.is_some() { EMP_WC_WITH_IMM } else { 0 } };
            // SAFETY: the caller passes a writable `struct emp_probed_ex`.
            unsafe { out.write(p) };
            1
        }
        Ok(None) => 0,
        Err(e) => errno(&e),
    }
}

/// Peeks at the oldest unreceived message from (`node`, `port`) (or
/// `EMP_ANY_*`) whose tag matches `tag` under `ignore`.
///
/// # Safety
/// `dev` from `emp_open`; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn emp_probe(
    dev: *mut EmpDevice,
    node: u16,
    port: u16,
    tag: u64,
    ignore: u64,
    out: *mut EmpProbed,
) -> c_int {
    // SAFETY: the caller's guarantees, passed on.
    unsafe { probe_into(dev, Endpoint { node, port }, tag, ignore, false, out) }
}

/// As `emp_probe`, and claims the message for `emp_post_recv_claimed`.
///
/// # Safety
/// As `emp_probe`.
#[no_mangle]
pub unsafe extern "C" fn emp_probe_claim(
    dev: *mut EmpDevice,
    node: u16,
    port: u16,
    tag: u64,
    ignore: u64,
    out: *mut EmpProbed,
) -> c_int {
    // SAFETY: the caller's guarantees, passed on.
    unsafe { probe_into(dev, Endpoint { node, port }, tag, ignore, true, out) }
}

/// Posts a receive of exactly the message `claimed` (from
/// `emp_probe_claim`) names.
///
/// # Safety
/// `dev` from `emp_open`; `claimed` readable; `sge` points to `n` SGEs.
#[no_mangle]
pub unsafe extern "C" fn emp_post_recv_claimed(
    dev: *mut EmpDevice,
    wr_id: u64,
    claimed: *const EmpProbed,
    sge: *const Sge,
    n: usize,
) -> c_int {
    if dev.is_null() || claimed.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees the pointers.
    let (d, p, s) = unsafe { (&mut (*dev).0, *claimed, sges(sge, n)) };
    // The claim handle names the message: its immediate data is not needed.
    let msg = crate::Probed { src: Endpoint { node: p.src_node, port: p.src_port }, tag: p.tag, len: p.len, imm: None };
    match d.post_recv_claimed(wr_id, &crate::Claim::from_parts(msg, p.handle), s) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// Runs a context-switch call on `dev`: 0, or a negative errno.
///
/// # Safety
/// `dev` null or from `emp_open`.
unsafe fn port_call(dev: *mut EmpDevice, f: impl FnOnce(&mut Device) -> crate::Result<()>) -> c_int {
    if dev.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: the caller passes a live device.
    match f(unsafe { &mut (*dev).0 }) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// Context switch C1 (docs/context-switch.md).
///
/// # Safety
/// `dev` from `emp_open`.
#[no_mangle]
pub unsafe extern "C" fn emp_port_suspend(dev: *mut EmpDevice) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { port_call(dev, |d| d.suspend()) }
}

/// C8.
///
/// # Safety
/// `dev` from `emp_open`.
#[no_mangle]
pub unsafe extern "C" fn emp_port_resume(dev: *mut EmpDevice) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { port_call(dev, |d| d.resume()) }
}

/// C2–C4: 1 when the suspended port is stable, 0 when not yet, else a
/// negative errno.
///
/// # Safety
/// `dev` from `emp_open`.
#[no_mangle]
pub unsafe extern "C" fn emp_port_is_stable(dev: *mut EmpDevice) -> c_int {
    let mut stable = false;
    // SAFETY: forwarded from the caller.
    match unsafe { port_call(dev, |d| d.is_stable().map(|s| stable = s)) } {
        0 => stable as c_int,
        e => e,
    }
}

/// C6: saves the port into registered memory (`key`, `offset`, at most
/// `room` bytes); `*len` = the image's length.
///
/// # Safety
/// `dev` from `emp_open`; `len` writable.
#[no_mangle]
pub unsafe extern "C" fn emp_port_save(dev: *mut EmpDevice, key: u32, offset: u64, room: u64, len: *mut u64) -> c_int {
    if len.is_null() {
        return -libc::EINVAL;
    }
    let at = Sge { key, offset, len: room.min(u32::MAX as u64) as u32 };
    // SAFETY: forwarded from the caller; `len` checked non-null above.
    unsafe { port_call(dev, |d| d.save_at(at).map(|n| *len = n)) }
}

/// C7: restores the saved port from registered memory (`key`, `offset`,
/// `len` bytes). It comes back suspended.
///
/// # Safety
/// `dev` from `emp_open`.
#[no_mangle]
pub unsafe extern "C" fn emp_port_restore(dev: *mut EmpDevice, key: u32, offset: u64, len: u64) -> c_int {
    if len > u32::MAX as u64 {
        return -libc::EINVAL;
    }
    let at = Sge { key, offset, len: len as u32 };
    // SAFETY: forwarded from the caller.
    unsafe { port_call(dev, |d| d.restore_at(at)) }
}

fn to_wc(c: &Completion) -> EmpWc {
    EmpWc {
        wr_id: c.wr_id,
        status: c.status as u32,
        is_recv: c.is_recv as u32,
        byte_len: c.byte_len,
        msg_len: c.msg_len,
        tag: c.tag,
        src_node: c.src.node,
        src_port: c.src.port,
        opcode: c.opcode as u8,
        reserved: [0; 3],
    }
}

/// Polls up to `n` completions into `wc`; returns how many.
///
/// # Safety
/// `dev` is open; `wc` is writable for `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_poll_cq(dev: *mut EmpDevice, wc: *mut EmpWc, n: usize) -> c_int {
    // SAFETY: the caller's guarantees, passed on.
    unsafe { take_completions(dev, wc, n, None, to_wc) }
}

/// Takes up to `n` completions into `wc`, converted by `conv`: polls
/// (`wait` None) or waits up to `wait` ms (-1 = forever). The batch is on
/// the stack, not a Vec: polling is the hot path and must not reach the
/// allocator (which may make a system call).
///
/// # Safety
/// `dev` is open (or NULL: -EINVAL); `wc` has room for `n` entries (or is
/// NULL with `n` = 0).
unsafe fn take_completions<T>(
    dev: *mut EmpDevice,
    wc: *mut T,
    n: usize,
    wait: Option<c_int>,
    conv: fn(&Completion) -> T,
) -> c_int {
    if dev.is_null() || (wc.is_null() && n > 0) {
        return -libc::EINVAL;
    }
    // SAFETY: `dev` is open and `wc` has room for `n` (the caller's
    // guarantees); a NULL `wc` is only taken with `n` = 0, as no slice.
    let (d, out) =
        unsafe { (&mut (*dev).0, if wc.is_null() { &mut [][..] } else { core::slice::from_raw_parts_mut(wc, n) }) };
    let mut tmp = [Completion::default(); WC_BATCH];
    let want = n.min(WC_BATCH);
    let got = match wait {
        None => d.try_poll_cq(&mut tmp[..want]),
        Some(ms) => d.wait_cq(&mut tmp[..want], (ms >= 0).then(|| Duration::from_millis(ms as u64))),
    };
    let got = match got {
        Ok(got) => got,
        Err(e) => return errno(&e),
    };
    for (o, c) in out.iter_mut().zip(&tmp[..got]) {
        *o = conv(c);
    }
    got as c_int
}

fn to_wc_ex(c: &Completion) -> EmpWcEx {
    EmpWcEx { wc: to_wc(c), imm: c.imm.unwrap_or(0), wc_flags: if c.imm.is_some() { EMP_WC_WITH_IMM } else { 0 } }
}

/// As `emp_poll_cq`, into `struct emp_wc_ex` (with immediate data).
///
/// # Safety
/// `dev` is open; `wc` is writable for `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_poll_cq_ex(dev: *mut EmpDevice, wc: *mut EmpWcEx, n: usize) -> c_int {
    // SAFETY: the caller's guarantees, passed on.
    unsafe { take_completions(dev, wc, n, None, to_wc_ex) }
}

/// As `emp_wait_cq`, into `struct emp_wc_ex` (with immediate data).
///
/// # Safety
/// As `emp_poll_cq_ex`.
#[no_mangle]
pub unsafe extern "C" fn emp_wait_cq_ex(dev: *mut EmpDevice, wc: *mut EmpWcEx, n: usize, timeout_ms: c_int) -> c_int {
    // SAFETY: the caller's guarantees, passed on.
    unsafe { take_completions(dev, wc, n, Some(timeout_ms), to_wc_ex) }
}

/// As `emp_probe` / `emp_probe_claim` (`claim` nonzero), with the
/// message's immediate data.
///
/// # Safety
/// `dev` is open; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn emp_probe_ex(
    dev: *mut EmpDevice,
    node: u16,
    port: u16,
    tag: u64,
    ignore: u64,
    claim: c_int,
    out: *mut EmpProbedEx,
) -> c_int {
    // SAFETY: the caller's guarantees, passed on.
    unsafe { probe_into_ex(dev, Endpoint { node, port }, tag, ignore, claim != 0, out) }
}

/// Takes back the posted receive `wr_id` if no message matched it yet
/// (since EMP_1.7): 1 when canceled (its completion, status
/// `EMP_WC_CANCELED`, follows on the CQ), 0 when the NIC holds no such
/// unmatched receive (it completes as it would have), else a negative errno.
///
/// # Safety
/// `dev` is open.
#[no_mangle]
pub unsafe extern "C" fn emp_cancel_recv(dev: *mut EmpDevice, wr_id: u64) -> c_int {
    if dev.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: the caller passes a live device.
    let d = unsafe { &mut (*dev).0 };
    match d.cancel_recv(wr_id) {
        Ok(canceled) => canceled as c_int,
        Err(e) => errno(&e),
    }
}

/// How long blocking calls poll before they sleep on the port's event, in
/// µs (since EMP_1.9; [`crate::Device::set_spin`]); 0 or -EINVAL.
///
/// # Safety
/// `dev` is open.
#[no_mangle]
pub unsafe extern "C" fn emp_set_spin_us(dev: *mut EmpDevice, us: u32) -> c_int {
    if dev.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: the caller passes a live device.
    let d = unsafe { &mut (*dev).0 };
    d.set_spin(std::time::Duration::from_micros(us.into()));
    0
}

/// Stores a send in persistent send slot `slot` (since EMP_1.8); 0,
/// -EAGAIN when the ring is full, or a negative errno.
///
/// # Safety
/// `dev` is open; `sge` points to `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_send_init(
    dev: *mut EmpDevice,
    slot: u8,
    node: u16,
    port: u16,
    tag: u64,
    sge: *const Sge,
    n: usize,
) -> c_int {
    if dev.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: the caller passes a live device and `n` readable SGEs.
    let (d, s) = unsafe { (&mut (*dev).0, sges(sge, n)) };
    match d.send_init(slot, Endpoint { node, port }, tag, s) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// Stores a receive in persistent receive slot `slot` (since EMP_1.8);
/// as `emp_send_init`.
///
/// # Safety
/// `dev` is open; `sge` points to `n` entries.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn emp_recv_init(
    dev: *mut EmpDevice,
    slot: u8,
    node: u16,
    port: u16,
    tag: u64,
    ignore: u64,
    sge: *const Sge,
    n: usize,
) -> c_int {
    if dev.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: the caller passes a live device and `n` readable SGEs.
    let (d, s) = unsafe { (&mut (*dev).0, sges(sge, n)) };
    match d.recv_init(slot, Endpoint { node, port }, tag, ignore, s) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// Starts persistent send slot `slot` with `wr_id` (since EMP_1.8).
///
/// # Safety
/// `dev` is open.
#[no_mangle]
pub unsafe extern "C" fn emp_start_send(dev: *mut EmpDevice, wr_id: u64, slot: u8) -> c_int {
    if dev.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: the caller passes a live device.
    match unsafe { &mut (*dev).0 }.start_send(wr_id, slot) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// Starts persistent receive slot `slot` with `wr_id` (since EMP_1.8).
///
/// # Safety
/// `dev` is open.
#[no_mangle]
pub unsafe extern "C" fn emp_start_recv(dev: *mut EmpDevice, wr_id: u64, slot: u8) -> c_int {
    if dev.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: the caller passes a live device.
    match unsafe { &mut (*dev).0 }.start_recv(wr_id, slot) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// Completions taken per `emp_poll_cq` / `emp_wait_cq` call at most.
const WC_BATCH: usize = 64;

/// Waits up to `timeout_ms` (-1 = forever) for completions.
///
/// # Safety
/// As `emp_poll_cq`.
#[no_mangle]
pub unsafe extern "C" fn emp_wait_cq(dev: *mut EmpDevice, wc: *mut EmpWc, n: usize, timeout_ms: c_int) -> c_int {
    // SAFETY: the caller's guarantees, passed on.
    unsafe { take_completions(dev, wc, n, Some(timeout_ms), to_wc) }
}

/// Arms the event descriptor for the next completion.
///
/// # Safety
/// `dev` is open.
#[no_mangle]
pub unsafe extern "C" fn emp_req_notify_cq(dev: *mut EmpDevice) -> c_int {
    // SAFETY: caller guarantees `dev`.
    unsafe { (*dev).0.arm() };
    0
}

/// The event descriptor (pollable, usable from io_uring).
///
/// # Safety
/// `dev` is open.
#[no_mangle]
pub unsafe extern "C" fn emp_get_event_fd(dev: *mut EmpDevice) -> c_int {
    // SAFETY: caller guarantees `dev`.
    unsafe { (*dev).0.event_fd() }
}

/// Text for a completion status.
#[no_mangle]
pub extern "C" fn emp_wc_status_str(status: u32) -> *const c_char {
    let s: &'static CStr = match u8::try_from(status).ok().and_then(emp_uapi::desc::Status::from_u8) {
        Some(st) => st.as_cstr(),
        None => c"unknown status",
    };
    s.as_ptr()
}

/// Allocates `len` bytes of registered memory in a registration of its own
/// with `access` rights (plus local read/write), e.g.
/// `EMP_ACCESS_REMOTE_ATOMIC`; sets `*key` and `*offset` (0) as `emp_alloc`.
///
/// # Safety
/// `dev` is open; `key` and `offset` are writable.
#[no_mangle]
pub unsafe extern "C" fn emp_alloc_mr(
    dev: *mut EmpDevice,
    len: usize,
    access: u32,
    key: *mut u32,
    offset: *mut u64,
) -> *mut c_void {
    // SAFETY: caller guarantees the pointers.
    let d = unsafe { &mut (*dev).0 };
    let Ok(access) = u8::try_from(access) else { return core::ptr::null_mut() };
    match d.alloc_mr(len, access) {
        Ok(mut b) => {
            let s = b.sge(0, 0);
            // SAFETY: writable per the contract.
            unsafe {
                *key = s.key;
                *offset = s.offset;
            }
            b.as_mut_slice().as_mut_ptr().cast()
        }
        Err(_) => core::ptr::null_mut(),
    }
}

/// Reads a C remote word; `None` for a bad width.
///
/// # Safety
/// `at` is NULL or readable.
unsafe fn remote_word(at: *const EmpRemoteWord) -> Option<RemoteWord> {
    if at.is_null() {
        return None;
    }
    // SAFETY: the caller passes a readable struct.
    let w = unsafe { *at };
    if w.reserved != 0 {
        return None;
    }
    let key = crate::RemoteKey { key: w.key, secret: w.secret };
    Some(RemoteWord { key, offset: w.offset, width: Width::from_bytes(w.width)? })
}

/// One nonblocking atomic post: the shared argument checks.
///
/// # Safety
/// `dev` is open; `at` and `result` are NULL or readable.
unsafe fn post_atomic(
    dev: *mut EmpDevice,
    at: *const EmpRemoteWord,
    result: *const Sge,
    post: impl FnOnce(&mut Device, RemoteWord, Sge) -> crate::Result<()>,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    let (Some(w), false) = (unsafe { remote_word(at) }, result.is_null()) else { return -libc::EINVAL };
    // SAFETY: caller guarantees `dev` and a readable `result`.
    let (d, r) = unsafe { (&mut (*dev).0, *result) };
    match post(d, w, r) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

// ---- groups and NIC-offloaded collectives ----

/// Opaque group handle (`struct emp_group`).
pub struct EmpGroup(crate::Group);

/// C view of an endpoint (`struct emp_endpoint`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EmpEndpoint {
    /// Node.
    pub node: u16,
    /// Port.
    pub port: u16,
}

fn dtype_op(t: u32, op: u32) -> Result<(crate::Dtype, crate::ReduceOp), Error> {
    let t = u8::try_from(t).ok().and_then(crate::Dtype::from_u8).ok_or_else(|| Error::invalid("unknown dtype"))?;
    let op =
        u8::try_from(op).ok().and_then(crate::ReduceOp::from_u8).ok_or_else(|| Error::invalid("unknown reduce op"))?;
    Ok((t, op))
}

fn barrier_algo(a: u32) -> Result<crate::BarrierAlgo, Error> {
    u16::try_from(a)
        .ok()
        .and_then(crate::BarrierAlgo::from_u16)
        .ok_or_else(|| Error::invalid("unknown barrier algorithm"))
}

fn rc(r: Result<(), Error>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// A blocking call's result; a failed completion's status goes to `*status`.
///
/// # Safety
/// `status` is NULL or writable.
unsafe fn blocking_status(r: Result<(), Error>, status: *mut u32) -> c_int {
    let st = match &r {
        Ok(()) => 0,
        Err(e) => e.status().map_or(u32::MAX, |s| s as u32),
    };
    if !status.is_null() {
        // SAFETY: the caller passes NULL or a writable u32.
        unsafe { *status = st };
    }
    rc(r)
}

/// Creates group `id` over `members` (this port among them). NULL and
/// `*err` (if non-NULL) = negative errno on failure.
///
/// # Safety
/// `dev` is open; `members` points to `n` entries; `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn emp_group_create(
    dev: *mut EmpDevice,
    id: u32,
    members: *const EmpEndpoint,
    n: usize,
    err: *mut c_int,
) -> *mut EmpGroup {
    let list: Vec<Endpoint> = if members.is_null() || n == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller passes `n` readable entries.
        unsafe { core::slice::from_raw_parts(members, n) }
            .iter()
            .map(|e| Endpoint { node: e.node, port: e.port })
            .collect()
    };
    // SAFETY: caller guarantees `dev`.
    let d = unsafe { &mut (*dev).0 };
    match d.create_group(id, &list, &crate::GroupOpts::default()) {
        Ok(g) => Box::into_raw(Box::new(EmpGroup(g))),
        Err(e) => {
            if !err.is_null() {
                // SAFETY: the caller passes NULL or a writable int.
                unsafe { *err = errno(&e) };
            }
            core::ptr::null_mut()
        }
    }
}

/// Destroys a group (its unfinished operations complete flushed) and frees the handle.
///
/// # Safety
/// `dev` is open; `g` came from `emp_group_create` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn emp_group_destroy(dev: *mut EmpDevice, g: *mut EmpGroup) -> c_int {
    if g.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: `g` was boxed by emp_group_create and is given back once.
    let g = unsafe { Box::from_raw(g) };
    // SAFETY: caller guarantees `dev`.
    rc(unsafe { &mut (*dev).0 }.destroy_group(g.0))
}

/// This member's rank.
///
/// # Safety
/// `g` is a live group.
#[no_mangle]
pub unsafe extern "C" fn emp_group_rank(g: *const EmpGroup) -> c_int {
    // SAFETY: caller guarantees `g`.
    unsafe { (*g).0.rank() as c_int }
}

/// Sets the size above which `emp_post_rbcast` on `g` uses the NIC tree
/// broadcast instead of multicast fragments through the window (0: always
/// the tree). Returns 0, or -EINVAL for a NULL group.
///
/// # Safety
/// `g` is NULL or a live group not used by another thread meanwhile.
#[no_mangle]
pub unsafe extern "C" fn emp_group_set_rbcast_threshold(g: *mut EmpGroup, bytes: usize) -> c_int {
    if g.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: non-NULL, and the caller guarantees it is live and ours alone.
    unsafe { (*g).0.set_rbcast_threshold(bytes) };
    0
}

/// Members in the group.
///
/// # Safety
/// `g` is a live group.
#[no_mangle]
pub unsafe extern "C" fn emp_group_size(g: *const EmpGroup) -> c_int {
    // SAFETY: caller guarantees `g`.
    unsafe { (*g).0.size() as c_int }
}

/// Posts a NIC barrier.
///
/// # Safety
/// `dev` is open; `g` is live.
#[no_mangle]
pub unsafe extern "C" fn emp_post_barrier(dev: *mut EmpDevice, wr_id: u64, g: *const EmpGroup, algo: u32) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, g) = unsafe { (&mut (*dev).0, &(*g).0) };
    rc(barrier_algo(algo).and_then(|a| d.post_barrier(wr_id, g, a)))
}

/// Posts a NIC broadcast from `root`.
///
/// # Safety
/// `dev` is open; `g` is live; `sge` points to `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_post_bcast(
    dev: *mut EmpDevice,
    wr_id: u64,
    g: *const EmpGroup,
    root: c_int,
    sge: *const Sge,
    n: usize,
) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, g, s) = unsafe { (&mut (*dev).0, &(*g).0, sges(sge, n)) };
    match usize::try_from(root) {
        Ok(root) => rc(d.post_bcast(wr_id, g, root, s)),
        Err(_) => -libc::EINVAL,
    }
}

/// Posts a reliable broadcast over wire multicast from `root` with
/// algorithm (`coroots`, `ack_every`, `window`).
///
/// # Safety
/// `dev` is open; `g` is live; `sge` points to `n` entries.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn emp_post_rbcast(
    dev: *mut EmpDevice,
    wr_id: u64,
    g: *const EmpGroup,
    root: c_int,
    coroots: u8,
    ack_every: u8,
    window: u8,
    sge: *const Sge,
    n: usize,
) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, g, s) = unsafe { (&mut (*dev).0, &(*g).0, sges(sge, n)) };
    let algo = crate::RbcastAlgo { coroots: coroots as u16, ack_every, window, nak: false };
    match usize::try_from(root) {
        Ok(root) => rc(d.post_rbcast(wr_id, g, root, algo, s)),
        Err(_) => -libc::EINVAL,
    }
}

/// Posts a reliable broadcast from `root` with the algorithm `*algo`
/// (16-bit co-root counts, NAKs: EMP_1.6).
///
/// # Safety
/// `dev` is open; `g` is live; `algo` is NULL or readable; `sge` points to `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_post_rbcast_with(
    dev: *mut EmpDevice,
    wr_id: u64,
    g: *const EmpGroup,
    root: c_int,
    algo: *const EmpRbcastAlgo,
    sge: *const Sge,
    n: usize,
) -> c_int {
    if algo.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees the pointers; `algo` is not NULL.
    let (d, g, s, a) = unsafe { (&mut (*dev).0, &(*g).0, sges(sge, n), &*algo) };
    rc(a.with_root(root).and_then(|(algo, root)| d.post_rbcast(wr_id, g, root, algo, s)))
}

/// Blocking reliable broadcast over wire multicast.
///
/// # Safety
/// `dev` is open; `g` is live; `sge` points to `n` entries; `status` is NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn emp_rbcast(
    dev: *mut EmpDevice,
    g: *const EmpGroup,
    root: c_int,
    coroots: u8,
    ack_every: u8,
    window: u8,
    sge: *const Sge,
    n: usize,
    status: *mut u32,
) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, g, s) = unsafe { (&mut (*dev).0, &(*g).0, sges(sge, n)) };
    let algo = crate::RbcastAlgo { coroots: coroots as u16, ack_every, window, nak: false };
    let r =
        usize::try_from(root).map_err(|_| Error::invalid("negative root")).and_then(|root| d.rbcast(g, root, algo, s));
    // SAFETY: `status` per the caller.
    unsafe { blocking_status(r, status) }
}

/// Blocking reliable broadcast with the algorithm `*algo` (EMP_1.6).
///
/// # Safety
/// `dev` is open; `g` is live; `algo` is NULL or readable; `sge` points to
/// `n` entries; `status` is NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn emp_rbcast_with(
    dev: *mut EmpDevice,
    g: *const EmpGroup,
    root: c_int,
    algo: *const EmpRbcastAlgo,
    sge: *const Sge,
    n: usize,
    status: *mut u32,
) -> c_int {
    if algo.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees the pointers; `algo` is not NULL.
    let (d, g, s, a) = unsafe { (&mut (*dev).0, &(*g).0, sges(sge, n), &*algo) };
    let r = a.with_root(root).and_then(|(algo, root)| d.rbcast(g, root, algo, s));
    // SAFETY: `status` per the caller.
    unsafe { blocking_status(r, status) }
}

/// Posts a multisend to the members in the rank mask `ranks`.
///
/// # Safety
/// `dev` is open; `g` is live; `sge` points to `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_post_multisend(
    dev: *mut EmpDevice,
    wr_id: u64,
    g: *const EmpGroup,
    ranks: u64,
    tag: u64,
    sge: *const Sge,
    n: usize,
) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, g, s) = unsafe { (&mut (*dev).0, &(*g).0, sges(sge, n)) };
    rc(d.post_multisend(wr_id, g, ranks, tag, s))
}

/// Posts a multisend to the members in the rank mask `ranks` of 64-rank
/// window `window` (bit i = rank 64 · `window` + i).
///
/// # Safety
/// `dev` is open; `g` is live; `sge` points to `n` entries.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn emp_post_multisend_window(
    dev: *mut EmpDevice,
    wr_id: u64,
    g: *const EmpGroup,
    window: u16,
    ranks: u64,
    tag: u64,
    sge: *const Sge,
    n: usize,
) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, g, s) = unsafe { (&mut (*dev).0, &(*g).0, sges(sge, n)) };
    rc(d.post_multisend_window(wr_id, g, window, ranks, tag, s))
}

/// Posts a NIC reduce to `root` (`recv` may be NULL except at the root).
///
/// # Safety
/// `dev` is open; `g` is live; `send` is readable; `recv` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn emp_post_reduce(
    dev: *mut EmpDevice,
    wr_id: u64,
    g: *const EmpGroup,
    root: c_int,
    t: u32,
    op: u32,
    send: *const Sge,
    recv: *const Sge,
) -> c_int {
    if send.is_null() || root < 0 {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees the pointers.
    let (d, g, send, recv) = unsafe { (&mut (*dev).0, &(*g).0, *send, recv.as_ref().copied()) };
    rc(dtype_op(t, op).and_then(|(t, op)| d.post_reduce(wr_id, g, root as usize, t, op, send, recv)))
}

/// Posts a NIC allreduce.
///
/// # Safety
/// `dev` is open; `g` is live; `send` and `recv` are readable.
#[no_mangle]
pub unsafe extern "C" fn emp_post_allreduce(
    dev: *mut EmpDevice,
    wr_id: u64,
    g: *const EmpGroup,
    t: u32,
    op: u32,
    send: *const Sge,
    recv: *const Sge,
) -> c_int {
    if send.is_null() || recv.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees the pointers.
    let (d, g, send, recv) = unsafe { (&mut (*dev).0, &(*g).0, *send, *recv) };
    rc(dtype_op(t, op).and_then(|(t, op)| d.post_allreduce(wr_id, g, t, op, send, recv)))
}

/// Blocking NIC barrier.
///
/// # Safety
/// `dev` is open; `g` is live; `status` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn emp_barrier(dev: *mut EmpDevice, g: *const EmpGroup, algo: u32, status: *mut u32) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, g) = unsafe { (&mut (*dev).0, &(*g).0) };
    // SAFETY: `status` per the caller.
    unsafe { blocking_status(barrier_algo(algo).and_then(|a| d.barrier(g, a)), status) }
}

/// Blocking NIC broadcast.
///
/// # Safety
/// `dev` is open; `g` is live; `sge` points to `n` entries; `status` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn emp_bcast(
    dev: *mut EmpDevice,
    g: *const EmpGroup,
    root: c_int,
    sge: *const Sge,
    n: usize,
    status: *mut u32,
) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, g, s) = unsafe { (&mut (*dev).0, &(*g).0, sges(sge, n)) };
    let r = usize::try_from(root).map_err(|_| Error::invalid("negative root")).and_then(|root| d.bcast(g, root, s));
    // SAFETY: `status` per the caller.
    unsafe { blocking_status(r, status) }
}

/// Blocking NIC allreduce.
///
/// # Safety
/// `dev` is open; `g` is live; `send`/`recv` are readable; `status` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn emp_allreduce(
    dev: *mut EmpDevice,
    g: *const EmpGroup,
    t: u32,
    op: u32,
    send: *const Sge,
    recv: *const Sge,
    status: *mut u32,
) -> c_int {
    if send.is_null() || recv.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees the pointers.
    let (d, g, send, recv) = unsafe { (&mut (*dev).0, &(*g).0, *send, *recv) };
    let r = dtype_op(t, op).and_then(|(t, op)| d.allreduce(g, t, op, send, recv));
    // SAFETY: `status` per the caller.
    unsafe { blocking_status(r, status) }
}

/// The process's job for the C API, recognized once (`emp_job_init`):
/// `Ok` or the negative errno every later call returns.
static C_JOB: std::sync::OnceLock<Result<crate::rdv::Job, c_int>> = std::sync::OnceLock::new();

/// The job, recognized on first use; a failure is said once on stderr
/// (the errno alone would not tell which variable is missing).
fn c_job() -> Result<&'static crate::rdv::Job, c_int> {
    C_JOB
        .get_or_init(|| {
            crate::rdv::Job::from_env().map_err(|e| {
                eprintln!("libemp: {e}");
                errno(&e)
            })
        })
        .as_ref()
        .map_err(|e| *e)
}

/// Recognizes this process's job: `emp run`'s (EMP_RANK, EMP_SIZE,
/// EMP_RDV_DIR) or a PMIx launcher's (mpirun, prterun, srun). 0 or a
/// negative errno; later calls return the first's result.
#[no_mangle]
pub extern "C" fn emp_job_init() -> c_int {
    c_job().map_or_else(|e| e, |_| 0)
}

/// This process's rank, or a negative errno.
#[no_mangle]
pub extern "C" fn emp_job_rank() -> c_int {
    c_job().map_or_else(|e| e, |j| c_int::try_from(j.rank).unwrap_or(-libc::EOVERFLOW))
}

/// Ranks in the job, or a negative errno.
#[no_mangle]
pub extern "C" fn emp_job_size() -> c_int {
    c_job().map_or_else(|e| e, |j| c_int::try_from(j.size).unwrap_or(-libc::EOVERFLOW))
}

/// Opens the NIC this rank uses (`Device::open_for_job`). NULL and `*err`
/// (if non-NULL) on failure.
///
/// # Safety
/// `err` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn emp_job_open_device(err: *mut c_int) -> *mut EmpDevice {
    let r = c_job().and_then(|j| {
        Device::open_for_job(j).map_err(|e| {
            eprintln!("libemp: opening this rank's NIC: {e}");
            errno(&e)
        })
    });
    match r {
        Ok(d) => Box::into_raw(Box::new(EmpDevice(d))),
        Err(e) => {
            if !err.is_null() {
                // SAFETY: the caller passes a writable pointer or NULL.
                unsafe { *err = e };
            }
            core::ptr::null_mut()
        }
    }
}

/// Collective: publishes `dev`'s endpoint and writes every rank's into
/// `eps[0..size)` (`n` at least the job's size). 0 or a negative errno.
///
/// # Safety
/// `dev` is open; `eps` has room for `n` endpoints.
#[no_mangle]
pub unsafe extern "C" fn emp_job_endpoints(dev: *mut EmpDevice, eps: *mut EmpEndpoint, n: usize) -> c_int {
    let job = match c_job() {
        Ok(j) => j,
        Err(e) => return e,
    };
    if eps.is_null() || n < job.size {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees `dev`.
    let d = unsafe { &(*dev).0 };
    match job.endpoints(d.endpoint()) {
        Ok(all) => {
            // SAFETY: the caller gives room for `n` >= size endpoints.
            let out = unsafe { core::slice::from_raw_parts_mut(eps, n) };
            for (o, e) in out.iter_mut().zip(&all) {
                *o = EmpEndpoint { node: e.node, port: e.port };
            }
            0
        }
        Err(e) => {
            eprintln!("libemp: emp_job_endpoints: {e}");
            errno(&e)
        }
    }
}

/// Waits until every rank of the job (`emp run`'s rendezvous directory,
/// PMIx's fence, or in a static job messages over EMP) has called it; a
/// program's first collective may follow it safely. 0 or a negative errno.
///
/// # Safety
/// `dev` is open.
#[no_mangle]
pub unsafe extern "C" fn emp_job_barrier(dev: *mut EmpDevice) -> c_int {
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let k = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let job = match c_job() {
        Ok(j) => j,
        Err(e) => return e,
    };
    // SAFETY: caller guarantees `dev`.
    let d = unsafe { &mut (*dev).0 };
    rc(job.barrier(d, &format!("emp_job_barrier-{k}")))
}

/// Posts a remote fetch-and-add on `*at` at (node, port); the completion's
/// `tag` and the `*result` word receive the old value. 0 or a negative errno.
///
/// # Safety
/// `dev` is open; `at` and `result` are readable.
#[no_mangle]
pub unsafe extern "C" fn emp_post_atomic_fetch_add(
    dev: *mut EmpDevice,
    wr_id: u64,
    node: u16,
    port: u16,
    at: *const EmpRemoteWord,
    add: u64,
    result: *const Sge,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { post_atomic(dev, at, result, |d, w, r| d.post_fetch_add(wr_id, Endpoint { node, port }, w, add, r)) }
}

/// Posts a remote compare-and-swap (`swap` is written iff the word equals `compare`).
///
/// # Safety
/// As `emp_post_atomic_fetch_add`.
#[no_mangle]
pub unsafe extern "C" fn emp_post_atomic_cmp_swap(
    dev: *mut EmpDevice,
    wr_id: u64,
    node: u16,
    port: u16,
    at: *const EmpRemoteWord,
    compare: u64,
    swap: u64,
    result: *const Sge,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe {
        post_atomic(dev, at, result, |d, w, r| d.post_cmp_swap(wr_id, Endpoint { node, port }, w, compare, swap, r))
    }
}

/// Posts a remote swap.
///
/// # Safety
/// As `emp_post_atomic_fetch_add`.
#[no_mangle]
pub unsafe extern "C" fn emp_post_atomic_swap(
    dev: *mut EmpDevice,
    wr_id: u64,
    node: u16,
    port: u16,
    at: *const EmpRemoteWord,
    value: u64,
    result: *const Sge,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { post_atomic(dev, at, result, |d, w, r| d.post_swap(wr_id, Endpoint { node, port }, w, value, r)) }
}

/// One blocking atomic: 0 with `*old` set, a negative errno, or a positive
/// `enum emp_wc_status` when the operation completed with an error.
///
/// # Safety
/// `dev` is open; `at` is readable; `old` is writable.
unsafe fn blocking(
    dev: *mut EmpDevice,
    at: *const EmpRemoteWord,
    old: *mut u64,
    op: impl FnOnce(&mut Device, RemoteWord) -> crate::Result<u64>,
) -> c_int {
    // SAFETY: forwarded caller guarantee.
    let Some(w) = (unsafe { remote_word(at) }) else { return -libc::EINVAL };
    if old.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees `dev`.
    let d = unsafe { &mut (*dev).0 };
    match op(d, w) {
        Ok(v) => {
            // SAFETY: writable per the contract.
            unsafe { *old = v };
            0
        }
        Err(Error::Failed(s)) => s as c_int,
        Err(e) => errno(&e),
    }
}

/// Blocking fetch-and-add: 0 and `*old`, a negative errno, or a positive
/// completion status. Other completions stay for `emp_poll_cq`.
///
/// # Safety
/// `dev` is open; `at` is readable; `old` is writable.
#[no_mangle]
pub unsafe extern "C" fn emp_fetch_add(
    dev: *mut EmpDevice,
    node: u16,
    port: u16,
    at: *const EmpRemoteWord,
    add: u64,
    old: *mut u64,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { blocking(dev, at, old, |d, w| d.fetch_add(Endpoint { node, port }, w, add)) }
}

/// Blocking compare-and-swap, as `emp_fetch_add`.
///
/// # Safety
/// As `emp_fetch_add`.
#[no_mangle]
pub unsafe extern "C" fn emp_cmp_swap(
    dev: *mut EmpDevice,
    node: u16,
    port: u16,
    at: *const EmpRemoteWord,
    compare: u64,
    swap: u64,
    old: *mut u64,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { blocking(dev, at, old, |d, w| d.cmp_swap(Endpoint { node, port }, w, compare, swap)) }
}

/// Blocking swap, as `emp_fetch_add`.
///
/// # Safety
/// As `emp_fetch_add`.
#[no_mangle]
pub unsafe extern "C" fn emp_swap(
    dev: *mut EmpDevice,
    node: u16,
    port: u16,
    at: *const EmpRemoteWord,
    value: u64,
    old: *mut u64,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { blocking(dev, at, old, |d, w| d.swap(Endpoint { node, port }, w, value)) }
}

// ---- remote keys, remote write and read (EMP_1.2) ----

/// The remote key of a region this device registered.
///
/// # Safety
/// `dev` is open; `rkey` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn emp_remote_key(dev: *mut EmpDevice, key: u32, rkey: *mut u64) -> c_int {
    if rkey.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees `dev`.
    let d = unsafe { &(*dev).0 };
    match d.remote_key(key) {
        Some(k) => {
            // SAFETY: writable per the contract.
            unsafe { *rkey = k.as_u64() };
            0
        }
        None => -libc::ENOENT,
    }
}

/// One remote write or read post: the shared argument handling.
///
/// # Safety
/// `dev` is open; `sge` points to `n` entries.
unsafe fn post_rma(
    dev: *mut EmpDevice,
    sge: *const Sge,
    n: usize,
    rkey: u64,
    remote_offset: u64,
    post: impl FnOnce(&mut Device, &[Sge], crate::RemoteAddr) -> crate::Result<()>,
) -> c_int {
    if n > 0 && sge.is_null() {
        return -libc::EINVAL;
    }
    // SAFETY: caller guarantees the pointers.
    let (d, s) = unsafe { (&mut (*dev).0, sges(sge, n)) };
    let at = crate::RemoteAddr { key: crate::RemoteKey::from_u64(rkey), offset: remote_offset };
    match post(d, s, at) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// Posts a remote write of `sge[..n]` to (`rkey`, `remote_offset`) at
/// (`node`, `port`); 0, -EAGAIN when the ring is full, or a negative errno.
///
/// # Safety
/// `dev` is open; `sge` points to `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_post_write(
    dev: *mut EmpDevice,
    wr_id: u64,
    node: u16,
    port: u16,
    sge: *const Sge,
    n: usize,
    rkey: u64,
    remote_offset: u64,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe {
        post_rma(dev, sge, n, rkey, remote_offset, |d, s, at| d.post_write(wr_id, Endpoint { node, port }, s, at))
    }
}

/// As `emp_post_write`, with immediate data `imm` for a receive at the target.
///
/// # Safety
/// As `emp_post_write`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn emp_post_write_imm(
    dev: *mut EmpDevice,
    wr_id: u64,
    node: u16,
    port: u16,
    sge: *const Sge,
    n: usize,
    rkey: u64,
    remote_offset: u64,
    imm: u64,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe {
        post_rma(dev, sge, n, rkey, remote_offset, |d, s, at| {
            d.post_write_imm(wr_id, Endpoint { node, port }, s, at, imm)
        })
    }
}

/// Posts a remote read from (`rkey`, `remote_offset`) at (`node`, `port`)
/// into `sge[..n]`; 0, -EAGAIN when the ring is full, or a negative errno.
///
/// # Safety
/// As `emp_post_write`.
#[no_mangle]
pub unsafe extern "C" fn emp_post_read(
    dev: *mut EmpDevice,
    wr_id: u64,
    node: u16,
    port: u16,
    sge: *const Sge,
    n: usize,
    rkey: u64,
    remote_offset: u64,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { post_rma(dev, sge, n, rkey, remote_offset, |d, s, at| d.post_read(wr_id, Endpoint { node, port }, s, at)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_structs_match_emp_h() {
        assert_eq!(core::mem::size_of::<EmpWc>(), 40);
        assert_eq!(core::mem::offset_of!(EmpWc, opcode), 36);
        assert_eq!(core::mem::size_of::<EmpRemoteWord>(), 24);
        assert_eq!(core::mem::offset_of!(EmpRemoteWord, offset), 8);
        assert_eq!(core::mem::offset_of!(EmpRemoteWord, secret), 16);
    }
}
