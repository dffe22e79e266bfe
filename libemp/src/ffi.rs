//! The C ABI (`libemp.so`, `include/emp.h`): the same verbs, errors as
//! negative errno values.

use core::ffi::{c_char, c_int, c_void};
use std::ffi::CStr;
use std::time::Duration;

use crate::{Completion, Device, Endpoint, Error, EventSource, Sge};

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
    /// Reserved.
    pub reserved: u32,
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
        Error::RingFull => -libc::EAGAIN,
        Error::TooManySges => -libc::EINVAL,
        Error::ArenaFull => -libc::ENOMEM,
        Error::Timeout => -libc::ETIMEDOUT,
        Error::InvalidOp { .. } | Error::InvalidArgument(_) => -libc::EINVAL,
        Error::Coll(_) => -libc::EIO,
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
        Ok(b) => {
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

/// Deregisters a key.
///
/// # Safety
/// `dev` is open.
#[no_mangle]
pub unsafe extern "C" fn emp_dereg_mr(dev: *mut EmpDevice, key: u32) -> c_int {
    // SAFETY: caller guarantees `dev`.
    let d = unsafe { &mut (*dev).0 };
    match d.dereg_mr(crate::MemoryRegion { key, addr: 0, len: 0 }) {
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
pub unsafe extern "C" fn emp_post_send(dev: *mut EmpDevice, wr_id: u64, node: u16, port: u16, tag: u64, sge: *const Sge, n: usize) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, s) = unsafe { (&mut (*dev).0, sges(sge, n)) };
    match d.post_send(wr_id, Endpoint { node, port }, tag, s) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
}

/// Posts a receive (node/port may be EMP_ANY_NODE/EMP_ANY_PORT).
///
/// # Safety
/// `dev` is open; `sge` points to `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_post_recv(dev: *mut EmpDevice, wr_id: u64, node: u16, port: u16, tag: u64, ignore: u64, sge: *const Sge, n: usize) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, s) = unsafe { (&mut (*dev).0, sges(sge, n)) };
    match d.post_recv(wr_id, Endpoint { node, port }, tag, ignore, s) {
        Ok(()) => 0,
        Err(e) => errno(&e),
    }
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
        reserved: 0,
    }
}

/// Polls up to `n` completions into `wc`; returns how many.
///
/// # Safety
/// `dev` is open; `wc` is writable for `n` entries.
#[no_mangle]
pub unsafe extern "C" fn emp_poll_cq(dev: *mut EmpDevice, wc: *mut EmpWc, n: usize) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, out) = unsafe { (&mut (*dev).0, core::slice::from_raw_parts_mut(wc, n)) };
    let mut tmp = vec![Completion::default(); n.min(256)];
    let got = d.poll_cq(&mut tmp);
    for (o, c) in out.iter_mut().zip(&tmp[..got]) {
        *o = to_wc(c);
    }
    got as c_int
}

/// Waits up to `timeout_ms` (-1 = forever) for completions.
///
/// # Safety
/// As `emp_poll_cq`.
#[no_mangle]
pub unsafe extern "C" fn emp_wait_cq(dev: *mut EmpDevice, wc: *mut EmpWc, n: usize, timeout_ms: c_int) -> c_int {
    // SAFETY: caller guarantees the pointers.
    let (d, out) = unsafe { (&mut (*dev).0, core::slice::from_raw_parts_mut(wc, n)) };
    let mut tmp = vec![Completion::default(); n.min(256)];
    let t = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
    match d.wait_cq(&mut tmp, t) {
        Ok(got) => {
            for (o, c) in out.iter_mut().zip(&tmp[..got]) {
                *o = to_wc(c);
            }
            got as c_int
        }
        Err(e) => errno(&e),
    }
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
