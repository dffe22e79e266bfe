// SPDX-License-Identifier: GPL-2.0

//! `/dev/emp-nic`: every file opened for writing is a port of the NIC.
//! `mmap` maps that port's window of SRAM (BAR2) and nothing else; `ioctl`
//! serves QUERY, memory registration, START, events, groups (`group.rs`)
//! and the context switch (`ctxsw.rs`: PORT_CTX on the caller's port, GANG
//! for the gang scheduler). A file opened read-only holds no port: it
//! serves GANG only.
//!
//! Lock order: mmap_lock (held by the kernel around `mmap`), then a port's
//! `ctx`, then its `regions`, then `NicInfo::mailbox` (the admin
//! mailbox), then `NicInfo::state`. Pinning and unpinning take mmap_lock,
//! so they run with none of our locks held. An admin command holds the
//! mailbox while the NIC works and takes `state` only around each SRAM
//! access, so events, QUERY and the other ports do not wait for the NIC.
//! A context switch holds the mailbox for all of its steps (the NIC's
//! command, moving the context's MR entries and their fences), so no other
//! admin command — another port's, or GANG's — sees it half done; GANG
//! never takes a port's `ctx` or `regions` (it cannot reach them): it
//! finds a process's ports through `State::holders`, and a port's own
//! ioctls check there, under `state`, that they still hold their slot.
//! A window is filled on fault (`emp_window_fault`: mmap_lock, then
//! `state`, then the page table lock); a save zaps the windows with
//! `state` held (then the kernel's i_mmap lock and page table locks), so
//! a page is never left mapped for a slot its file no longer holds.
//!
//! Unbind with files open is safe: the device is marked gone (later
//! opens, ioctls and mmaps fail with `ENODEV`) and every user mapping of a
//! port window is torn down, before BAR2 is released.

use kernel::{
    bindings,
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex, MutexGuard},
    time::{delay::fsleep, Delta, Instant, Monotonic},
    uaccess::{UserPtr, UserSlice},
};

use crate::desc::{MrEntry, MR_ACCESS_ALL};
use crate::ioctl::{ArgError, EmpArm, EmpDeregMr, EmpQuery, EmpRegMr, EmpSetEventfd, EmpStart, IoctlArg, IoctlCmd};
use crate::mr::Pinned;
use crate::sram::{admin_result, ctl, AdminMailbox, AdminOp, Layout, PortCtl};
use crate::{Le, PAGE_SIZE};

// GROUP_SET / GROUP_CLEAR: a child module, it uses the private state here.
#[path = "group.rs"]
mod group;

// PORT_CTX / GANG: a child module, it uses the private state here.
#[path = "ctxsw.rs"]
mod ctxsw;

extern "C" {
    fn emp_ioremap(start: u64, len: usize) -> *mut core::ffi::c_void;
    fn emp_iounmap(base: *mut core::ffi::c_void);
    fn emp_vma_window(vma: *mut core::ffi::c_void);
    fn emp_readl(base: *mut core::ffi::c_void, off: usize) -> u32;
    fn emp_writel(base: *mut core::ffi::c_void, off: usize, v: u32);
    fn emp_eventfd_signal(ctx: *mut bindings::eventfd_ctx);
    fn emp_current_tgid() -> i32;
}

/// How long the NIC may take to run an admin command.
// TIMEOUT: the NIC answers admin commands within microseconds while running.
const ADMIN_TIMEOUT: Delta = Delta::from_millis(2000);

/// Between two looks at the admin mailbox (the NIC usually answers within
/// a few).
const ADMIN_POLL: Delta = Delta::from_micros(20);

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
    /// Held for each admin command (the mailbox takes one at a time), and
    /// while a group slot changes hands with the command that loads or
    /// drops its group.
    #[pin]
    mailbox: Mutex<()>,
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
    /// BAR2 mapped for the driver's own SRAM accesses (MR table, admin
    /// mailbox); unmapped when the device goes.
    mmio: SramMmio,
    /// Free MR table slots.
    mr_free: KVec<u16>,
    /// Changes every registration so keys are not reused.
    key_salt: u32,
    /// Pages pinned by all ports.
    pinned: u64,
    /// The NIC's MSI-X vector is set up (events can be delivered).
    events_available: bool,
    /// Ports armed through ARM whose event is not delivered yet.
    armed: u64,
    /// Each port's eventfd (SET_EVENTFD), or null.
    events: [EventCtx; 64],
    /// Group table slots and the (port, group id) holding each.
    groups: group::GroupSlots,
    /// Which open file holds each port slot (`ctxsw.rs` switches them).
    holders: [Holder; 64],
    /// Wire addresses held by open files (a file keeps its address for
    /// its whole life, through saves and restores), each once.
    addrs: KVec<u16>,
    /// The file (`Port::id`) each MR table slot belongs to, 0 = free: a
    /// context switch moves a file's entries together.
    mr_file: KVec<u64>,
    /// Contexts the gang scheduler saved into driver memory (bounded by
    /// `ctxsw::GANG_SAVED_MAX`).
    gang: KVec<ctxsw::GangSaved>,
    /// The next `Port::id` (never 0, never reused).
    next_file: u64,
}

/// The open file holding a port slot, or none (`file` 0).
#[derive(Clone, Copy)]
struct Holder {
    /// `Port::id`.
    file: u64,
    /// The process that opened it, its pid in the initial pid namespace
    /// (what GANG names).
    tgid: i32,
    /// Its wire address.
    addr: u16,
    /// The NIC opened the port (START).
    started: bool,
}

impl Holder {
    const NONE: Holder = Holder { file: 0, tgid: 0, addr: 0, started: false };
}

/// A snapshot of what the driver holds for one NIC ([`NicInfo::counters`]).
#[derive(Clone, Copy, Default)]
pub(crate) struct Counters {
    /// Ports taken by open files.
    pub(crate) open_ports: u32,
    /// Pages pinned for memory registrations (all ports).
    pub(crate) pinned_pages: u64,
    /// MR table slots holding a registration.
    pub(crate) regions: u32,
    /// Group table slots held.
    pub(crate) groups_in_use: u32,
    /// Ports armed for an event not delivered yet.
    pub(crate) armed_ports: u32,
    /// eventfd references held (SET_EVENTFD).
    pub(crate) eventfds: u32,
}

/// A reference on an eventfd context (`eventfd_ctx_fdget`), or null.
#[derive(Clone, Copy)]
struct EventCtx(*mut bindings::eventfd_ctx);

// SAFETY: an eventfd context may be signalled and put from any thread; we
// hold one reference per non-null value stored in `State::events`.
unsafe impl Send for EventCtx {}

impl EventCtx {
    const NONE: EventCtx = EventCtx(core::ptr::null_mut());

    /// Drops our reference (call with none of our locks held: cheap, but
    /// the last put frees).
    fn put(self) {
        if !self.0.is_null() {
            // SAFETY: a reference taken by `eventfd_ctx_fdget`, put once.
            unsafe { bindings::eventfd_ctx_put(self.0) };
        }
    }
}

/// BAR2 as the driver maps it (`emp_ioremap`), or null once the device
/// is gone.
struct SramMmio(*mut core::ffi::c_void);

// SAFETY: an iomem cookie, used only under `state`'s lock and unmapped
// once when the device goes.
unsafe impl Send for SramMmio {}

impl State {
    /// Zaps every user mapping of every port window of the device: a page
    /// touched again faults back in (`emp_window_fault`) if its file still
    /// holds a slot, and raises SIGBUS if not. Called with `state` held
    /// after a save freed a slot, so a process that runs while switched
    /// out (continued by anyone) cannot reach the next job's window.
    fn zap_windows(&self) {
        if self.open > 0 && !self.mapping.0.is_null() {
            // SAFETY: files are open, so the inode and its address space are
            // alive (see `Mapping`); unmap_mapping_range only drops PTEs.
            unsafe { bindings::unmap_mapping_range(self.mapping.0, 0, 0, 1) };
        }
    }

    fn write32(&self, off: usize, v: u32) -> Result {
        if self.gone || self.mmio.0.is_null() {
            return Err(ENODEV);
        }
        // SAFETY: `mmio` maps the whole SRAM; callers pass offsets of the
        // layout's tables (inside it), 4-byte aligned.
        unsafe { emp_writel(self.mmio.0, off, v) };
        Ok(())
    }

    fn read32(&self, off: usize) -> Result<u32> {
        if self.gone || self.mmio.0.is_null() {
            return Err(ENODEV);
        }
        // SAFETY: as in `write32`.
        Ok(unsafe { emp_readl(self.mmio.0, off) })
    }

    fn write_bytes(&self, off: usize, b: &[u8]) -> Result {
        for (i, c) in b.chunks(4).enumerate() {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            self.write32(off + 4 * i, u32::from_le_bytes(w))?;
        }
        Ok(())
    }
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
            mailbox <- new_mutex!(()),
            state <- new_mutex!(State {
                used: 0,
                open: 0,
                mapping: Mapping(core::ptr::null_mut()),
                gone: false,
                mmio: SramMmio(core::ptr::null_mut()),
                mr_free: KVec::new(),
                key_salt: 0x5eed,
                pinned: 0,
                events_available: false,
                armed: 0,
                events: [EventCtx::NONE; 64],
                groups: group::GroupSlots::new(),
                holders: [Holder::NONE; 64],
                addrs: KVec::new(),
                mr_file: KVec::new(),
                gang: KVec::new(),
                next_file: 1,
            }),
        })
    }

    fn ports(&self) -> u16 {
        self.layout.params.ports.min(64)
    }

    /// Maps BAR2 for the driver and fills the MR and group slot pools.
    pub(crate) fn attach_mmio(&self) -> Result {
        let mut st = self.state.lock();
        // SAFETY: mapping the device's own BAR2 range (start/len from the PCI core).
        let base = unsafe { emp_ioremap(self.bar_start, self.layout.sram_size as usize) };
        if base.is_null() {
            return Err(ENOMEM);
        }
        st.mmio = SramMmio(base);
        for slot in (0..self.layout.params.mr_entries.min(0x1_0000) as u16).rev() {
            st.mr_free.push(slot, GFP_KERNEL)?;
            st.mr_file.push(0, GFP_KERNEL)?;
        }
        st.groups.init(self.layout.params.group_entries)?;
        Ok(())
    }

    /// What the driver holds for this NIC right now (`counters.rs` shows
    /// it in debugfs): after every process using the NIC has exited, all
    /// of it is zero.
    pub(crate) fn counters(&self) -> Counters {
        let st = self.state.lock();
        let mr_slots = self.layout.params.mr_entries.min(0x1_0000) as usize;
        Counters {
            open_ports: st.used.count_ones(),
            pinned_pages: st.pinned,
            regions: mr_slots.saturating_sub(st.mr_free.len()) as u32,
            groups_in_use: st.groups.in_use(),
            armed_ports: st.armed.count_ones(),
            eventfds: st.events.iter().filter(|e| !e.0.is_null()).count() as u32,
        }
    }

    /// Whether ARM / SET_EVENTFD can work (the NIC's vector is set up).
    pub(crate) fn set_events_available(&self, on: bool) {
        self.state.lock().events_available = on;
    }

    /// From the interrupt thread: signals every armed port whose ARM word
    /// the control program cleared (it clears it, then interrupts).
    pub(crate) fn deliver_events(&self) {
        let mut st = self.state.lock();
        let mut pending = st.armed;
        while pending != 0 {
            let p = pending.trailing_zeros() as usize;
            pending &= pending - 1;
            match st.read32(self.layout.port(p as u16).ctl(ctl::ARM)) {
                Ok(0) => {
                    st.armed &= !(1u64 << p);
                    let e = st.events[p];
                    if !e.0.is_null() {
                        // SAFETY: we hold a reference on the context (`State::events`).
                        unsafe { emp_eventfd_signal(e.0) };
                    }
                }
                Ok(_) => {}
                Err(_) => return, // Device gone.
            }
        }
    }

    /// Takes the admin mailbox (one command at a time).
    fn admin(&self) -> Admin<'_> {
        Admin { info: self, _held: self.mailbox.lock() }
    }

    /// Clears MR slot `slot` and fences the NIC so no DMA uses it again;
    /// the slot is free for reuse only after the fence.
    fn clear_mr(&self, slot: u16, pages: usize) {
        let admin = self.admin();
        admin.clear_mr(slot, pages);
    }
}

/// The admin mailbox, held (`NicInfo::admin`).
struct Admin<'a> {
    info: &'a NicInfo,
    _held: MutexGuard<'a, ()>,
}

impl Admin<'_> {
    /// [`Admin::clear_mr`]'s work, with the mailbox held.
    fn clear_mr(&self, slot: u16, pages: usize) {
        let off = self.info.layout.mr_entry(slot as usize);
        let mut zero = [0u8; MrEntry::SIZE];
        MrEntry::default().put(&mut zero);
        let wiped = self.info.state.lock().write_bytes(off, &zero).is_ok();
        // A device that is gone does no DMA: nothing to fence.
        if wiped {
            let _ = self.run(AdminOp::MrFence, [slot as u64, 0, 0, 0]);
        }
        let mut st = self.info.state.lock();
        let _ = st.mr_free.push(slot, GFP_KERNEL);
        if let Some(f) = st.mr_file.get_mut(slot as usize) {
            *f = 0;
        }
        st.pinned -= pages as u64;
    }

    /// Runs an admin command with its first four arguments (the rest 0).
    ///
    /// # Errors
    /// As [`Admin::run6`].
    fn run(&self, op: AdminOp, args: [u64; 4]) -> Result<u32> {
        self.run6(op, [args[0], args[1], args[2], args[3], 0, 0])
    }

    /// Runs an admin command on the NIC and returns its result code.
    ///
    /// # Errors
    /// `ENODEV` device gone, `ETIMEDOUT` no answer within `ADMIN_TIMEOUT`.
    fn run6(&self, op: AdminOp, args: [u64; 6]) -> Result<u32> {
        let base = self.info.layout.admin_off as usize;
        let seq_off = base + core::mem::offset_of!(AdminMailbox, request_seq);
        let seq = {
            let st = self.info.state.lock();
            let seq = st.read32(seq_off)?.wrapping_add(1);
            let a = base + core::mem::offset_of!(AdminMailbox, args);
            for (i, v) in args.iter().enumerate() {
                st.write32(a + 8 * i, *v as u32)?;
                st.write32(a + 8 * i + 4, (*v >> 32) as u32)?;
            }
            st.write32(base + core::mem::offset_of!(AdminMailbox, op), op as u32)?;
            // The sequence number last: it is what the NIC watches.
            st.write32(seq_off, seq)?;
            seq
        };
        let done_off = base + core::mem::offset_of!(AdminMailbox, done_seq);
        let start = Instant::<Monotonic>::now();
        while self.info.state.lock().read32(done_off)? != seq {
            if start.elapsed() > ADMIN_TIMEOUT {
                return Err(ETIMEDOUT);
            }
            fsleep(ADMIN_POLL);
        }
        self.info.state.lock().read32(base + core::mem::offset_of!(AdminMailbox, result))
    }
}

/// Device node names: the first NIC is `/dev/emp-nic`, further ones
/// `/dev/emp-nicN`.
const NODE_NAMES: [&core::ffi::CStr; 8] =
    [c"emp-nic", c"emp-nic1", c"emp-nic2", c"emp-nic3", c"emp-nic4", c"emp-nic5", c"emp-nic6", c"emp-nic7"];

/// Which node names are taken (bit `i` = `NODE_NAMES[i]`).
static NODE_NAMES_USED: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// A claimed node name, released on drop.
struct NodeName(usize);

impl NodeName {
    /// The lowest free name; `ENOSPC` when every name is taken.
    fn claim() -> Result<NodeName> {
        use core::sync::atomic::Ordering;
        let all = (1u32 << NODE_NAMES.len()) - 1;
        NODE_NAMES_USED
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used != all).then(|| used | 1 << (!used & all).trailing_zeros())
            })
            .map(|used| NodeName((!used & all).trailing_zeros() as usize))
            .map_err(|_| ENOSPC)
    }
}

impl Drop for NodeName {
    fn drop(&mut self) {
        NODE_NAMES_USED.fetch_and(!(1u32 << self.0), core::sync::atomic::Ordering::AcqRel);
    }
}

/// The misc device and what its files share. Fields drop in order: the
/// device node goes before its name is released.
#[pin_data(PinnedDrop)]
pub(crate) struct NicDev {
    #[pin]
    misc: MiscDeviceRegistration<Port>,
    /// debugfs counters (`counters.rs`), removed after the node.
    #[pin]
    counters: crate::counters::DebugCounters,
    info: Arc<NicInfo>,
    name: NodeName,
}

impl NicDev {
    /// Claims a node name now; the initializer registers the node. A
    /// failed registration drops the initializer and so the name.
    pub(crate) fn new(info: Arc<NicInfo>) -> Result<impl PinInit<Self, Error>> {
        let name = NodeName::claim()?;
        let node = NODE_NAMES[name.0];
        Ok(try_pin_init!(Self {
            misc <- MiscDeviceRegistration::register(MiscDeviceOptions { name: node }),
            counters <- crate::counters::DebugCounters::new(node, info.clone()),
            info,
            name,
        }))
    }

    /// The device node's name (`emp-nic`, `emp-nic1`, …).
    pub(crate) fn node_name(&self) -> &'static core::ffi::CStr {
        NODE_NAMES[self.name.0]
    }
}

#[pinned_drop]
impl PinnedDrop for NicDev {
    fn drop(self: Pin<&mut Self>) {
        let mut st = self.info.state.lock();
        st.gone = true;
        // Every user mapping of the port windows goes before BAR2 is
        // released; `gone` makes any later fault SIGBUS.
        st.zap_windows();
        if !st.mmio.0.is_null() {
            // SAFETY: mapped in `attach_mmio`, unmapped once; `gone` keeps
            // every later access away (checked under this lock).
            unsafe { emp_iounmap(st.mmio.0) };
            st.mmio = SramMmio(core::ptr::null_mut());
        }
    }
}

/// A registration held by a port.
struct Region {
    key: u32,
    slot: u16,
    /// The caller's address and length (what PORT_CTX bounds-checks an
    /// image's place against).
    addr: u64,
    len: u64,
    pinned: Pinned,
}

/// Where a port is in its life (`Port::ctx`).
enum Ctx {
    /// Not started (no port on the NIC yet), or a read-only control file.
    Idle,
    /// Open on the NIC in slot `Port::port` — or saved by the gang
    /// scheduler meanwhile (`State::gang` then has it, `State::holders`
    /// not).
    Open,
    /// Saved by its owner (PORT_CTX SAVE): no slot until RESTORE.
    Saved(ctxsw::Parked),
}

/// `Port::port` of a read-only file, which holds no slot.
const NO_SLOT: u16 = u16::MAX;

/// One open file = one port (a read-only file: none).
#[pin_data(PinnedDrop)]
pub(crate) struct Port {
    info: Arc<NicInfo>,
    /// The slot it lives in (changes only on RESTORE, under `ctx`).
    port: core::sync::atomic::AtomicU16,
    /// This file, for `State::holders`, `State::mr_file` and `State::gang`.
    id: u64,
    /// Its wire address: what peers and QUERY know it by.
    addr: u16,
    /// Regions.
    #[pin]
    regions: Mutex<KVec<Region>>,
    #[pin]
    ctx: Mutex<Ctx>,
}

#[pinned_drop]
impl PinnedDrop for Port {
    fn drop(self: Pin<&mut Self>) {
        if self.slot() == NO_SLOT {
            self.info.state.lock().open -= 1;
            return;
        }
        // Lock order (module documentation). Unpinning takes mmap_lock, so
        // regions are dropped only after all of our locks are released.
        let gone = {
            let ctx = core::mem::replace(&mut *self.ctx.lock(), Ctx::Idle);
            let mut regions = self.regions.lock();
            let slot = self.slot();
            // A saved context (its owner's or the gang scheduler's) is
            // forgotten on the NIC, its image memory freed.
            let (held, parked) = {
                let admin = self.info.admin();
                let parked = ctxsw::discard(&admin, &self, ctx);
                let held = self.info.state.lock().holders[slot as usize].file == self.id;
                if held {
                    if parked.is_none() && self.info.state.lock().holders[slot as usize].started {
                        // The NIC flushes the port's work before any memory goes.
                        let _ = admin.run(AdminOp::PortClose, [slot as u64, 0, 0, 0]);
                    }
                    self.info.state.lock().holders[slot as usize] = Holder::NONE;
                }
                // PortClose dropped the port's groups on the NIC, or the
                // discard its saved context's: free their slots.
                group::release_file(&self.info, &mut self.info.state.lock(), self.id);
                (held, parked)
            };
            for r in regions.iter() {
                self.info.clear_mr(r.slot, r.pinned.page_count());
            }
            let mut st = self.info.state.lock();
            // The port number is free for another open only now.
            let event = if held {
                st.used &= !(1u64 << slot);
                st.armed &= !(1u64 << slot);
                core::mem::replace(&mut st.events[slot as usize], EventCtx::NONE)
            } else {
                EventCtx::NONE
            };
            st.open -= 1;
            if let Some(i) = st.addrs.iter().position(|&a| a == self.addr) {
                let _ = st.addrs.remove(i);
            }
            (core::mem::take(&mut *regions), event, parked)
        };
        gone.1.put();
        if let Some(p) = &gone.2 {
            p.event.put();
        }
        drop(gone);
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
        let control = file.flags() & kernel::fs::file::flags::O_ACCMODE == kernel::fs::file::flags::O_RDONLY;
        // SAFETY: reads the calling task's pid; no preconditions.
        let tgid = unsafe { emp_current_tgid() };
        let (port, id, addr) = {
            let mut st = info.state.lock();
            if st.gone {
                return Err(ENODEV);
            }
            let id = st.next_file;
            if control {
                st.next_file += 1;
                st.open += 1;
                (NO_SLOT, id, NO_SLOT)
            } else {
                let free = (0..info.ports()).find(|&p| st.used & (1u64 << p) == 0).ok_or(EBUSY)?;
                // The slot's own number, unless a saved context holds it:
                // then slot + k × ports, as emp-nicd picks (never another
                // slot's own number).
                let ports = info.ports() as u32;
                let addr = (0..)
                    .map(|k| free as u32 + k * ports)
                    .take_while(|&a| a < NO_SLOT as u32)
                    .find(|&a| !st.addrs.contains(&(a as u16)))
                    .ok_or(ENOSPC)? as u16;
                st.addrs.push(addr, GFP_KERNEL)?;
                st.next_file += 1;
                st.used |= 1u64 << free;
                st.holders[free as usize] = Holder { file: id, tgid, addr, started: false };
                st.open += 1;
                // SAFETY: `file` is a valid file being opened; f_mapping is set by then.
                st.mapping = Mapping(unsafe { (*file.as_ptr()).f_mapping });
                (free, id, addr)
            }
        };
        KBox::pin_init(
            try_pin_init!(Port {
                info,
                port: core::sync::atomic::AtomicU16::new(port),
                id,
                addr,
                regions <- new_mutex!(KVec::new()),
                ctx <- new_mutex!(Ctx::Idle),
            }),
            GFP_KERNEL,
        )
    }

    fn mmap(me: Pin<&Port>, _file: &File, vma: &VmaNew) -> Result {
        if me.slot() == NO_SLOT {
            return Err(EBADF);
        }
        // A saved port has no window until it is restored (RESTORE may
        // move it: the mapping is of the slot it lives in then).
        let _ctx = me.ctx.lock();
        // Holding the lock keeps an unbind from zapping before this mapping exists.
        let st = me.info.state.lock();
        if st.gone {
            return Err(ENODEV);
        }
        me.holds(&st)?;
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
        // A private (copy-on-write) mapping of device pages is meaningless,
        // and vmf_insert_pfn must never see one.
        if vma.flags() & kernel::mm::virt::flags::SHARED == 0 {
            return Err(EINVAL);
        }
        vma.try_clear_mayexec()?;
        vma.set_io();
        vma.set_dontcopy();
        vma.set_dontexpand();
        // Filled page by page on fault (`emp_window_fault`), from the slot
        // the port holds at that moment: a context switch can then take the
        // window away (`State::zap_windows`) and a restore give it back.
        // SAFETY: the vma is being set up under mmap_lock (VmaNew), shared
        // (checked above); the shim sets its vm_ops and VM_PFNMAP.
        unsafe { emp_vma_window(vma.as_ptr().cast()) };
        drop(st);
        Ok(())
    }

    /// Dispatches on the command's type, number and direction; its size
    /// field is the caller's struct size (`uapi/src/ioctl.rs`).
    fn ioctl(me: Pin<&Port>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        if me.info.state.lock().gone {
            return Err(ENODEV);
        }
        let (cmd, size) = IoctlCmd::decode(cmd).ok_or(ENOTTY)?;
        let arg = UserArg { addr: arg, size };
        // A read-only file holds no port: the gang scheduler's handle.
        if me.slot() == NO_SLOT && cmd != IoctlCmd::Gang {
            return Err(EBADF);
        }
        match cmd {
            IoctlCmd::Query => me.query(arg),
            IoctlCmd::RegMr => me.reg_mr(arg),
            IoctlCmd::DeregMr => me.dereg_mr(arg),
            IoctlCmd::Start => me.start(arg),
            IoctlCmd::SetEventfd => me.set_eventfd(arg),
            IoctlCmd::Arm => me.arm(arg),
            IoctlCmd::GroupSet => me.group_set(arg),
            IoctlCmd::GroupClear => me.group_clear(arg),
            IoctlCmd::PortCtx => me.port_ctx(arg),
            IoctlCmd::Gang => ctxsw::gang(&me.info, arg),
        }
    }
}

impl From<ArgError> for Error {
    fn from(e: ArgError) -> Error {
        match e {
            ArgError::TooShort | ArgError::SizeMismatch => EINVAL,
            ArgError::UnknownTail => E2BIG,
        }
    }
}

/// An ioctl argument in user memory: its address and the caller's size of
/// its struct (`_IOC_SIZE` of the command).
#[derive(Clone, Copy)]
struct UserArg {
    addr: usize,
    size: usize,
}

impl UserArg {
    /// Reads the argument struct (`copy_struct_from_user` semantics, decided
    /// by `ioctl::read_arg`: older sizes are zero-extended, newer ones need a
    /// zero tail).
    ///
    /// # Errors
    /// `EFAULT` bad pointer, `EINVAL` below the first version or a `size`
    /// field other than the command's size, `E2BIG` non-zero bytes past the
    /// struct this driver knows.
    fn read<T: IoctlArg>(self) -> Result<T> {
        let mut user = UserSlice::new(UserPtr::from_addr(self.addr), self.size).reader();
        crate::ioctl::read_arg(self.size, |buf| user.read_slice(buf))
    }

    /// Writes a result struct back, never past the caller's size (only the
    /// read-write commands return results).
    fn write<T: IoctlArg>(self, v: &T) -> Result {
        debug_assert!(T::CMD.returns_results());
        crate::ioctl::write_arg(v, self.size, |b| {
            UserSlice::new(UserPtr::from_addr(self.addr), b.len()).writer().write_slice(b)
        })
    }
}

impl Port {
    /// The slot this port lives in ([`NO_SLOT`] for a read-only file).
    fn slot(&self) -> u16 {
        self.port.load(core::sync::atomic::Ordering::Relaxed)
    }

    /// `EAGAIN` unless this file holds its slot now (it does not while its
    /// context is saved, by itself or by the gang scheduler).
    fn holds(&self, st: &State) -> Result {
        match st.holders.get(self.slot() as usize) {
            Some(h) if h.file == self.id => Ok(()),
            _ => Err(EAGAIN),
        }
    }

    /// QUERY: the caller sets `size`; the driver fills the rest (as much
    /// of it as the caller's struct holds).
    ///
    /// # Errors
    /// `EFAULT` bad pointer, `EINVAL`/`E2BIG` bad size (`UserArg::read`).
    fn query(&self, arg: UserArg) -> Result<isize> {
        let q: EmpQuery = arg.read()?;
        let i = &self.info;
        let (pinned_pages, group_entries, groups_in_use) = {
            let st = i.state.lock();
            (st.pinned, st.groups.entries(), st.groups.in_use())
        };
        let out = EmpQuery {
            size: q.size,
            // The wire address: what peers reach this port by (its slot
            // number unless that is parked by a saved context).
            port: self.addr,
            node_id: i.node,
            mtu: i.mtu,
            features: i.features,
            window_size: i.layout.port_stride as u64,
            send_entries: i.layout.params.send_entries,
            recv_entries: i.layout.params.recv_entries,
            msg_max: 1 << 30,
            port_gen: 0,
            port_count: i.layout.params.ports,
            pinned_pages,
            group_entries,
            groups_in_use,
            ..Default::default()
        };
        arg.write(&out)?;
        Ok(0)
    }

    /// REG_MR: pin, charge, describe to the NIC, return the key. A key
    /// that cannot be written back is deregistered again.
    ///
    /// # Errors
    /// `EFAULT` bad pointers or unmapped memory, or an argument struct that
    /// cannot be written back (nothing stays registered), `EINVAL`/`E2BIG` bad size, access
    /// or length, `ENOMEM` over RLIMIT_MEMLOCK, `ENOSPC` MR table full,
    /// `ENODEV` device gone.
    fn reg_mr(&self, arg: UserArg) -> Result<isize> {
        let mut q: EmpRegMr = arg.read()?;
        if q.access == 0 || q.access & !(MR_ACCESS_ALL as u32) != 0 {
            return Err(EINVAL);
        }
        let mut pinned = Pinned::pin(q.addr, q.length)?;
        let mut regions = self.regions.lock();
        // Room for the region before the NIC learns of it: once the MR entry
        // is written, nothing may fail and leave it pointing at pages we unpin.
        regions.reserve(1, GFP_KERNEL)?;
        let mut st = self.info.state.lock();
        if st.gone {
            return Err(ENODEV);
        }
        self.holds(&st)?;
        let slot = st.mr_free.pop().ok_or(ENOSPC)?;
        // SAFETY: get_random_u32 has no preconditions (the kernel's CRNG).
        let random = unsafe { bindings::get_random_u32() };
        let (key, secret) = MrEntry::make_key(&mut st.key_salt, slot, random);
        let entry = match pinned.entry(q.addr, q.length, key, self.slot(), q.access as u8) {
            Ok(e) => MrEntry { secret, ..e },
            Err(e) => {
                let _ = st.mr_free.push(slot, GFP_KERNEL);
                return Err(e);
            }
        };
        let mut eb = [0u8; MrEntry::SIZE];
        entry.put(&mut eb);
        if let Err(e) = st.write_bytes(self.info.layout.mr_entry(slot as usize), &eb) {
            let _ = st.mr_free.push(slot, GFP_KERNEL);
            return Err(e);
        }
        st.pinned += pinned.page_count() as u64;
        st.mr_file[slot as usize] = self.id;
        drop(st);
        // Cannot fail: the room was reserved above.
        regions.push_within_capacity(Region { key, slot, addr: q.addr, len: q.length, pinned }).map_err(|_| ENOMEM)?;
        // Writing to user memory may fault (mmap_lock): not under our locks.
        drop(regions);
        q.key = key;
        q.secret = secret;
        if let Err(e) = arg.write(&q) {
            // The caller cannot learn the key: undo the registration (as
            // GROUP_SET undoes a group), so a failed call holds nothing.
            let undone = {
                let mut regions = self.regions.lock();
                // Gone already if another thread deregistered the key.
                let region = regions.iter().position(|x| x.key == key).and_then(|i| regions.remove(i).ok());
                if let Some(r) = &region {
                    self.info.clear_mr(r.slot, r.pinned.page_count());
                }
                region
            };
            // Unpinned with none of our locks held.
            drop(undone);
            return Err(e);
        }
        Ok(0)
    }

    /// START: the NIC opens the port with its CQ in a region of this port.
    ///
    /// # Errors
    /// `EALREADY` when started, `ENOENT` when the CQ key is not a writable
    /// region of this port, `EINVAL`/`E2BIG` bad size or entries, `ENODEV` gone.
    fn start(&self, arg: UserArg) -> Result<isize> {
        let q: EmpStart = arg.read()?;
        if q.reserved != 0 {
            return Err(EINVAL);
        }
        let mut ctx = self.ctx.lock();
        if !matches!(*ctx, Ctx::Idle) {
            return Err(EALREADY);
        }
        let slot = self.slot();
        let w = self.info.layout.port(slot);
        let mut z = [0u8; PortCtl::SIZE];
        PortCtl::default().put(&mut z);
        let admin = self.info.admin();
        {
            let st = self.info.state.lock();
            self.holds(&st)?;
            st.write_bytes(w.base, &z)?;
        }
        // Under its own slot number, or the address it was given at open.
        let addr = if self.addr == slot { 0 } else { crate::sram::PORT_ADDR_EXPLICIT | self.addr as u64 };
        let args = [slot as u64, q.cq_key as u64, q.cq_offset, q.cq_entries as u64, 0, addr];
        match admin.run6(AdminOp::PortOpen, args)? {
            admin_result::OK => {
                *ctx = Ctx::Open;
                self.info.state.lock().holders[slot as usize].started = true;
                Ok(0)
            }
            admin_result::BAD_KEY => Err(ENOENT),
            admin_result::BAD_STATE => Err(EALREADY),
            _ => Err(EINVAL),
        }
    }

    /// SET_EVENTFD: the eventfd signalled when an armed event fires
    /// (`fd` = -1 detaches). Signal delivery (`signal` != 0) is not
    /// offered: use the eventfd (pollable, epoll- and io_uring-usable).
    ///
    /// # Errors
    /// `EOPNOTSUPP` the NIC has no interrupt (no MSI-X), `EBADF`/`EINVAL`
    /// `fd` is not an eventfd, `EINVAL`/`E2BIG` bad size, reserved bits or a signal.
    fn set_eventfd(&self, arg: UserArg) -> Result<isize> {
        let q: EmpSetEventfd = arg.read()?;
        if q.reserved != 0 || q.signal != 0 || q.fd < -1 {
            return Err(EINVAL);
        }
        if !self.info.state.lock().events_available {
            return Err(EOPNOTSUPP);
        }
        let new = if q.fd == -1 {
            EventCtx::NONE
        } else {
            // SAFETY: looks up a descriptor of the calling task; returns a
            // referenced context or an error pointer.
            EventCtx(kernel::error::from_err_ptr(unsafe { bindings::eventfd_ctx_fdget(q.fd) })?)
        };
        let old = {
            let mut st = self.info.state.lock();
            if let Err(e) = self.holds(&st) {
                drop(st);
                new.put();
                return Err(e);
            }
            st.armed &= !(1u64 << self.slot());
            core::mem::replace(&mut st.events[self.slot() as usize], new)
        };
        old.put();
        Ok(0)
    }

    /// ARM: the next completion of this port signals its eventfd (like
    /// `ibv_req_notify_cq`). Check the CQ after arming: a completion that
    /// landed before the ARM word was set raises nothing.
    ///
    /// # Errors
    /// `EOPNOTSUPP` no interrupt, `EINVAL`/`E2BIG` bad size, unknown event bits or
    /// no eventfd set, `ENODEV` gone.
    fn arm(&self, arg: UserArg) -> Result<isize> {
        let q: EmpArm = arg.read()?;
        if q.events != 1 {
            return Err(EINVAL);
        }
        let mut st = self.info.state.lock();
        if !st.events_available {
            return Err(EOPNOTSUPP);
        }
        self.holds(&st)?;
        let slot = self.slot();
        if st.events[slot as usize].0.is_null() {
            return Err(EINVAL);
        }
        // Armed in the driver first, then for the NIC: an interrupt in
        // between at worst signals early (spurious wake-ups are allowed).
        st.armed |= 1u64 << slot;
        st.write32(self.info.layout.port(slot).ctl(ctl::ARM), 1)?;
        Ok(0)
    }

    /// DEREG_MR: only this port's keys; the NIC is fenced before unpinning.
    ///
    /// # Errors
    /// `ENOENT` for a key this port does not hold (another port's, or
    /// already deregistered), `EINVAL`/`E2BIG` bad size, `EFAULT` bad pointer.
    fn dereg_mr(&self, arg: UserArg) -> Result<isize> {
        let q: EmpDeregMr = arg.read()?;
        let region = {
            let mut regions = self.regions.lock();
            let i = regions.iter().position(|x| x.key == q.key).ok_or(ENOENT)?;
            let region = regions.remove(i)?;
            self.info.clear_mr(region.slot, region.pinned.page_count());
            region
        };
        // Unpinned with none of our locks held (unpinning takes mmap_lock).
        drop(region);
        Ok(0)
    }
}

/// A fault in a port window (shim.c's vm_ops): maps the page of the window
/// of the slot the file's port holds now. SIGBUS while it holds none (its
/// context saved, by itself or by GANG; the device gone) or past the
/// window. Under `state`, so a save, which frees the slot and then zaps
/// (`State::zap_windows`), never leaves a page of it mapped.
///
/// # Safety
/// `private` is the `private_data` of the vma's file, a file of this
/// driver's misc device, and `vma` the faulting vma (mmap_lock held).
#[no_mangle]
unsafe extern "C" fn emp_window_fault(
    private: *mut core::ffi::c_void,
    vma: *mut bindings::vm_area_struct,
    address: usize,
    pgoff: usize,
) -> bindings::vm_fault_t {
    // SAFETY: `open` stored the file's `Pin<KBox<Port>>` there (MiscDevice);
    // the vma holds a reference to the file, so `release` has not run and
    // the port is alive.
    let me = unsafe { <Pin<KBox<Port>> as kernel::types::ForeignOwnable>::borrow(private) };
    let st = me.info.state.lock();
    let pages = me.info.layout.port_stride as usize / PAGE_SIZE;
    if st.gone || me.holds(&st).is_err() || pgoff >= pages {
        return bindings::vm_fault_reason_VM_FAULT_SIGBUS as bindings::vm_fault_t;
    }
    let w = me.info.layout.port(me.slot());
    let pfn = (me.info.bar_start + w.base as u64) / PAGE_SIZE as u64 + pgoff as u64;
    // SAFETY: a shared VM_PFNMAP vma (`mmap`) with the faulting address in
    // it; the page is one of this port's own window in BAR2, so the process
    // reaches nothing of the NIC but its port.
    unsafe { bindings::vmf_insert_pfn(vma, address as _, pfn as _) }
}
