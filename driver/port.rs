// SPDX-License-Identifier: GPL-2.0

//! `/dev/emp-nic`: every open file is a port of the NIC. `mmap` maps that
//! port's window of SRAM (BAR2) and nothing else; `ioctl` serves QUERY.
//!
//! Lock order: `NicInfo::state` is the only lock here.
//!
//! Unbind with files open is safe: the device is marked gone (later
//! opens, ioctls and mmaps fail with `ENODEV`) and every user mapping of a
//! port window is torn down, before BAR2 is released.

use core::mem::size_of;

use kernel::{
    bindings,
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
    uaccess::{UserPtr, UserSlice},
};

use crate::ioctl::{EmpQuery, EMP_IOC_QUERY};
use crate::sram::Layout;
use crate::{Le, PAGE_SIZE};

/// What open files need of the NIC. Plain data: no mapping, so it may
/// outlive the device binding.
#[pin_data]
pub(crate) struct NicInfo {
    pub(crate) node: u16,
    pub(crate) mtu: u32,
    pub(crate) features: u32,
    pub(crate) layout: Layout,
    /// Bus address of BAR2 (the SRAM).
    pub(crate) bar_start: u64,
    #[pin]
    state: Mutex<State>,
}

/// What changes as files come and go.
struct State {
    /// Ports in use (bit `p` = port `p`).
    used: u64,
    /// Open files.
    open: usize,
    /// The device node's page mapping (shared by all open files), whose
    /// user mappings are zapped when the device goes away.
    mapping: Mapping,
    /// The device was unbound.
    gone: bool,
}

struct Mapping(*mut bindings::address_space);

// SAFETY: the pointer is only dereferenced by the kernel under `state`'s
// lock while at least one file of the device is open, which keeps the
// inode (and so its address space) alive.
unsafe impl Send for Mapping {}

impl NicInfo {
    pub(crate) fn new(node: u16, mtu: u32, features: u32, layout: Layout, bar_start: u64) -> impl PinInit<Self> {
        pin_init!(Self {
            node, mtu, features, layout, bar_start,
            state <- new_mutex!(State { used: 0, open: 0, mapping: Mapping(core::ptr::null_mut()), gone: false }),
        })
    }

    fn ports(&self) -> u16 {
        self.layout.params.ports.min(64)
    }
}

/// The misc device and what its files share.
#[pin_data(PinnedDrop)]
pub(crate) struct NicDev {
    #[pin]
    misc: MiscDeviceRegistration<Port>,
    info: Arc<NicInfo>,
}

impl NicDev {
    pub(crate) fn new(info: Arc<NicInfo>) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            misc <- MiscDeviceRegistration::register(MiscDeviceOptions { name: c"emp-nic" }),
            info,
        })
    }
}

#[pinned_drop]
impl PinnedDrop for NicDev {
    fn drop(self: Pin<&mut Self>) {
        let mut st = self.info.state.lock();
        st.gone = true;
        if st.open > 0 && !st.mapping.0.is_null() {
            // SAFETY: files are open, so the inode and its address space are
            // alive (see `Mapping`); zapping every user mapping of the port
            // windows before BAR2 is released is what unmap_mapping_range is for.
            unsafe { bindings::unmap_mapping_range(st.mapping.0, 0, 0, 1) };
        }
    }
}

/// One open file = one port.
pub(crate) struct Port {
    info: Arc<NicInfo>,
    port: u16,
}

impl Drop for Port {
    fn drop(&mut self) {
        let mut st = self.info.state.lock();
        st.used &= !(1u64 << self.port);
        st.open -= 1;
    }
}

#[vtable]
impl MiscDevice for Port {
    type Ptr = Pin<KBox<Self>>;

    fn open(file: &File, misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        // SAFETY: every `MiscDeviceRegistration<Port>` is the `misc` field of
        // a `NicDev` (only `NicDev::new` registers one), and `open` only runs
        // while it is registered, i.e. while that `NicDev` is alive.
        let dev = unsafe { &*kernel::container_of!(core::ptr::from_ref(misc), NicDev, misc) };
        let info = dev.info.clone();
        let port = {
            let mut st = info.state.lock();
            if st.gone {
                return Err(ENODEV);
            }
            let free = (0..info.ports()).find(|&p| st.used & (1u64 << p) == 0).ok_or(EBUSY)?;
            st.used |= 1u64 << free;
            st.open += 1;
            // SAFETY: `file` is a valid file being opened; f_mapping is set by then.
            st.mapping = Mapping(unsafe { (*file.as_ptr()).f_mapping });
            free
        };
        let p = KBox::pin(Port { info, port }, GFP_KERNEL);
        Ok(p?)
    }

    fn mmap(me: Pin<&Port>, _file: &File, vma: &VmaNew) -> Result {
        // Holding the lock keeps an unbind from zapping before this mapping exists.
        let st = me.info.state.lock();
        if st.gone {
            return Err(ENODEV);
        }
        let w = me.info.layout.port(me.port);
        let len = vma.end() - vma.start();
        // The whole window at offset 0, nothing else.
        // SAFETY: reading the pgoff of a vma undergoing setup.
        let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff };
        if pgoff != 0 || len != me.info.layout.port_stride as usize {
            return Err(EINVAL);
        }
        if vma.executable() {
            return Err(EPERM);
        }
        vma.try_clear_mayexec()?;
        vma.set_io();
        vma.set_dontcopy();
        vma.set_dontexpand();
        let pfn = (me.info.bar_start + w.base as u64) / PAGE_SIZE as u64;
        // SAFETY: the vma is being set up (VmaNew); the range is exactly the
        // port's window inside BAR2 (page aligned, checked above), so the
        // process can reach nothing of the NIC but its own port.
        let r = unsafe {
            bindings::remap_pfn_range(vma.as_ptr(), vma.start(), pfn as _, len, (*vma.as_ptr()).vm_page_prot)
        };
        drop(st);
        kernel::error::to_result(r)
    }

    fn ioctl(me: Pin<&Port>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        if me.info.state.lock().gone {
            return Err(ENODEV);
        }
        match cmd {
            EMP_IOC_QUERY => me.query(arg),
            _ => Err(ENOTTY),
        }
    }
}

impl Port {
    /// QUERY: the caller sets `size`; the driver fills the rest.
    ///
    /// # Errors
    /// `EFAULT` for a bad pointer, `EINVAL` for a size this driver does not know.
    fn query(&self, arg: usize) -> Result<isize> {
        let (mut r, mut w) = UserSlice::new(UserPtr::from_addr(arg), size_of::<EmpQuery>()).reader_writer();
        let mut b = [0u8; EmpQuery::SIZE];
        r.read_slice(&mut b)?;
        let q = EmpQuery::get(&b);
        if q.size as usize != EmpQuery::SIZE {
            return Err(EINVAL);
        }
        let i = &self.info;
        let out = EmpQuery {
            size: q.size,
            port: self.port,
            node_id: i.node,
            mtu: i.mtu,
            features: i.features,
            window_size: i.layout.port_stride as u64,
            send_entries: i.layout.params.send_entries,
            recv_entries: i.layout.params.recv_entries,
            msg_max: 1 << 30,
            port_gen: 0,
            port_count: i.layout.params.ports,
            ..Default::default()
        };
        out.put(&mut b);
        w.write_slice(&b)?;
        Ok(0)
    }
}
