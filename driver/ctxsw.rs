// SPDX-License-Identifier: GPL-2.0

//! The port context switch (PM's C1–C8, docs/context-switch.md) through
//! the driver: PORT_CTX on the caller's own port, and GANG, the gang
//! scheduler's step on every port of another process.
//!
//! The driver is the trusted side, as emp-nicd is over direct attach: on a
//! save it takes the port's slot back (free for another open), moves the
//! context's MR entries to no slot (owner [`PARKED_OWNER`], fenced) so a
//! port opened in the slot cannot use them, and keeps the parked identity
//! (wire address, generation) and the port's eventfd; a restore gives the
//! entries to the new slot (fenced) and passes the identity to the NIC, so
//! an image naming another job is refused. The image itself is untrusted:
//! the driver only checks that its place lies inside a region of the port
//! (or is driver memory), the control program checks its content.
//!
//! - PORT_CTX SAVE writes the image into the caller's own registered
//!   memory; RESTORE puts it into any free slot (the caller maps the
//!   window again).
//! - GANG SAVE writes it into driver memory ([`ImagePages`], one MR entry
//!   of the port); GANG RESTORE puts it back into the slot it had, which
//!   the stopped process still maps.
//!
//! Cleanup: a file closed while saved (by itself or by GANG) has its
//! context discarded on the NIC (`PortDiscard`: its peers' sends fail
//! `PortClosed`), its image memory freed and its registrations unpinned
//! (`Port`'s drop); nothing stays pinned or parked.
//!
//! A child module of `port` (it reads the port's and the NIC state's
//! private fields). Locks: as the module documentation of `port` says; a
//! switch holds the mailbox throughout.

use kernel::{
    bindings,
    prelude::*,
    uaccess::{UserPtr, UserSlice},
};

use super::{Admin, Ctx, EventCtx, Holder, NicInfo, Port, UserArg};
use crate::attach::gang as action;
use crate::desc::{MrEntry, MR_LOCAL_READ, MR_LOCAL_WRITE};
use crate::ioctl::{port_ctx, EmpGang, EmpPortCtx, EMP_GANG_IMAGE_ROOM};
use crate::mr::ImagePages;
use crate::sram::{admin_result, ctl, AdminOp, CTX_IMAGE_MAX};
use crate::Le;

/// MR entry owner of a saved context's registrations: no slot, so no port
/// can use them (as emp-nicd's).
const PARKED_OWNER: u16 = u16::MAX;

/// Byte offset of the owner (`port`) field in an MR entry: after the
/// 4-byte key (`MrEntry` has no padding; uapi checks its layout).
const MR_OWNER_OFF: usize = 4;

/// Contexts the gang scheduler may keep saved per NIC (each holds
/// [`EMP_GANG_IMAGE_ROOM`] bytes of driver memory and one MR slot).
pub(super) const GANG_SAVED_MAX: usize = 64;

/// A saved context, as the driver keeps it: whose it was and what the
/// port had in its slot besides the NIC state.
pub(super) struct Parked {
    /// Its holder entry (file, process, wire address) to reinstall.
    holder: Holder,
    /// The generation it was saved with (its identity with `holder.addr`).
    gen: u16,
    /// Its eventfd (SET_EVENTFD), put when the file goes.
    pub(super) event: EventCtx,
    /// It was armed (ARM) when saved: armed again on restore.
    armed: bool,
}

impl Parked {
    /// `PortRestore`'s and `PortDiscard`'s identity argument.
    fn identity(&self) -> u64 {
        self.holder.addr as u64 | (self.gen as u64) << 16
    }
}

/// A context the gang scheduler saved into driver memory.
pub(super) struct GangSaved {
    /// The slot it had (its process still maps that window).
    slot: u16,
    parked: Parked,
    image: ImagePages,
    /// The MR slot and key describing `image` to the NIC.
    image_mr: u16,
    image_key: u32,
    /// The image's length.
    len: u32,
}

/// The control program's context-switch results as errnos (as emp-nicd's
/// `ctx_result`, so both backends report alike).
fn ctx_result(r: u32) -> Result {
    match r {
        admin_result::OK => Ok(()),
        admin_result::NOT_STABLE => Err(EAGAIN),
        admin_result::NO_ROOM => Err(ENOSPC),
        admin_result::BAD_KEY => Err(ENOENT),
        admin_result::BAD_STATE => Err(EALREADY),
        admin_result::BAD_IMAGE => Err(EBADMSG),
        _ => Err(EINVAL),
    }
}

/// Gives every MR entry of `file` to `owner` (a slot or [`PARKED_OWNER`]),
/// fencing each so the NIC no longer uses the old owner's view.
fn move_mrs(admin: &Admin<'_>, file: u64, owner: u16) -> Result {
    let info = admin.info;
    let mut from = 0;
    loop {
        // One entry at a time: the state lock is not held across a fence.
        let next = {
            let st = info.state.lock();
            (from..st.mr_file.len()).find(|&m| st.mr_file[m] == file)
        };
        let Some(m) = next else { return Ok(()) };
        {
            let st = info.state.lock();
            let off = info.layout.mr_entry(m) + MR_OWNER_OFF;
            let w = st.read32(off)?;
            st.write32(off, (w & 0xFFFF_0000) | owner as u32)?;
        }
        admin.run(AdminOp::MrFence, [m as u64, 0, 0, 0])?;
        from = m + 1;
    }
}

/// C6 of `slot`, held by `file`, into region `key` at `offset` (`room`
/// bytes); the slot is free afterwards. Mailbox held.
fn save_slot(admin: &Admin<'_>, file: u64, slot: u16, key: u32, offset: u64, room: u64) -> Result<Parked> {
    let info = admin.info;
    let (holder, gen) = {
        let st = info.state.lock();
        let holder = st.holders[slot as usize];
        if holder.file != file {
            return Err(EAGAIN);
        }
        (holder, st.read32(info.layout.port(slot).ctl(ctl::GEN))? as u16)
    };
    ctx_result(admin.run(AdminOp::PortSave, [slot as u64, key as u64, offset, room])?)?;
    // The NIC freed the slot; nothing may use the context's entries there.
    if let Err(e) = move_mrs(admin, file, PARKED_OWNER) {
        pr_warn!("emp: slot {}: moving a saved context's MR entries failed: {:?}\n", slot, e);
    }
    let mut st = info.state.lock();
    let bit = 1u64 << slot;
    st.used &= !bit;
    st.holders[slot as usize] = Holder::NONE;
    // The process still maps the window, which is the slot's, not the
    // context's: its pages go (and fault SIGBUS until a restore).
    st.zap_windows();
    let armed = st.armed & bit != 0;
    st.armed &= !bit;
    let event = core::mem::replace(&mut st.events[slot as usize], EventCtx::NONE);
    Ok(Parked { holder, gen, event, armed })
}

/// C7 of `parked` from region `key` at `offset` (`len` bytes) into slot
/// `want`, or any free slot; returns the slot, also stored into `port`
/// (under the state lock, with the slot's holder). Refused: the context
/// stays parked as it was. Mailbox held.
fn restore_slot(
    admin: &Admin<'_>,
    parked: &mut Parked,
    want: Option<u16>,
    (key, offset, len): (u32, u64, u64),
    port: Option<&core::sync::atomic::AtomicU16>,
) -> Result<u16> {
    let info = admin.info;
    let file = parked.holder.file;
    let slot = {
        let mut st = info.state.lock();
        if st.gone {
            return Err(ENODEV);
        }
        let slot = match want {
            Some(w) => (st.used & (1u64 << w) == 0).then_some(w),
            None => (0..info.ports()).find(|&p| st.used & (1u64 << p) == 0),
        }
        .ok_or(EBUSY)?;
        st.used |= 1u64 << slot;
        st.holders[slot as usize] = Holder { started: true, ..parked.holder };
        if let Some(p) = port {
            p.store(slot, core::sync::atomic::Ordering::Relaxed);
        }
        slot
    };
    let r = move_mrs(admin, file, slot)
        .and_then(|()| super::group::move_file(info, &info.state.lock(), file, slot))
        .and_then(|()| admin.run6(AdminOp::PortRestore, [slot as u64, key as u64, offset, len, parked.identity(), 0]))
        .and_then(ctx_result);
    let mut st = info.state.lock();
    match r {
        Ok(()) => {
            st.events[slot as usize] = core::mem::replace(&mut parked.event, EventCtx::NONE);
            if parked.armed {
                // Armed as it was: its waiter still waits for the event.
                st.armed |= 1u64 << slot;
                let _ = st.write32(info.layout.port(slot).ctl(ctl::ARM), 1);
            }
            Ok(slot)
        }
        Err(e) => {
            drop(st);
            let _ = move_mrs(admin, file, PARKED_OWNER);
            let mut st = info.state.lock();
            st.used &= !(1u64 << slot);
            st.holders[slot as usize] = Holder::NONE;
            Err(e)
        }
    }
}

/// The file is going: forgets its saved context on the NIC (its peers'
/// sends then fail `PortClosed`) and frees a gang image. Returns what it
/// had parked, whose eventfd the caller puts with no lock held. Mailbox held.
pub(super) fn discard(admin: &Admin<'_>, port: &Port, ctx: Ctx) -> Option<Parked> {
    let parked = match ctx {
        Ctx::Saved(p) => p,
        Ctx::Open | Ctx::Idle => {
            let saved = {
                let mut st = admin.info.state.lock();
                let i = st.gang.iter().position(|g| g.parked.holder.file == port.id)?;
                st.gang.remove(i).ok()?
            };
            admin.clear_mr(saved.image_mr, 0);
            // Freed only after the fence: the NIC no longer reaches it.
            drop(saved.image);
            saved.parked
        }
    };
    let _ = admin.run(AdminOp::PortDiscard, [parked.identity(), 0, 0, 0]);
    Some(parked)
}

impl Port {
    /// PORT_CTX: a context-switch step on this port (`EmpPortCtx::op`).
    ///
    /// # Errors
    /// `EINVAL` unknown step, reserved bits, an image place outside the
    /// region or empty, a RESTORE longer than `CTX_IMAGE_MAX` or of a
    /// port not saved; `ENOTCONN` not started; `EAGAIN` not stable (SAVE)
    /// or switched out by the gang scheduler; `EALREADY` already in that
    /// state; `ENOENT` `key` is not a region of this port; `ENOSPC` no room
    /// (image or NIC tables); `EBADMSG` the image failed the control
    /// program's checks (nothing changed); `EBUSY` no free slot (RESTORE);
    /// `EFAULT`, `ETIMEDOUT`, `ENODEV`. After a successful SAVE or RESTORE
    /// whose result cannot be written back, the step is done and `EFAULT`
    /// returned (the image's length is its header's word at byte 8).
    pub(super) fn port_ctx(&self, arg: UserArg) -> Result<isize> {
        let mut q: EmpPortCtx = arg.read()?;
        if q.reserved != 0 || q.result != 0 {
            return Err(EINVAL);
        }
        q.result = match q.op {
            port_ctx::SUSPEND | port_ctx::STABLE | port_ctx::RESUME => self.step(&q)?,
            port_ctx::SAVE => {
                // The result must be writable before anything changes.
                arg.write(&q)?;
                self.save(&q)?
            }
            port_ctx::RESTORE => {
                arg.write(&q)?;
                self.restore(&q)?
            }
            _ => return Err(EINVAL),
        };
        arg.write(&q)?;
        Ok(0)
    }

    /// SUSPEND, STABLE (1 when stable) and RESUME.
    fn step(&self, q: &EmpPortCtx) -> Result<u64> {
        if q.key != 0 || q.offset != 0 || q.len != 0 {
            return Err(EINVAL);
        }
        let ctx = self.ctx.lock();
        match *ctx {
            Ctx::Open => {}
            Ctx::Idle => return Err(ENOTCONN),
            Ctx::Saved(_) => return Err(EAGAIN),
        }
        let admin = self.info.admin();
        self.holds(&self.info.state.lock())?;
        let op = match q.op {
            port_ctx::SUSPEND => AdminOp::PortSuspend,
            port_ctx::STABLE => AdminOp::PortStable,
            _ => AdminOp::PortResume,
        };
        match admin.run(op, [self.slot() as u64, 0, 0, 0])? {
            admin_result::NOT_STABLE if op == AdminOp::PortStable => Ok(0),
            r => ctx_result(r).map(|()| (op == AdminOp::PortStable) as u64),
        }
    }

    /// The user address of the image's place, checked to lie inside region
    /// `key` of this port.
    fn image_place(&self, q: &EmpPortCtx) -> Result<u64> {
        let regions = self.regions.lock();
        let r = regions.iter().find(|r| r.key == q.key).ok_or(ENOENT)?;
        let end = q.offset.checked_add(q.len).ok_or(EINVAL)?;
        if q.len == 0 || end > r.len {
            return Err(EINVAL);
        }
        Ok(r.addr + q.offset)
    }

    /// C6 into this port's own memory; returns the image's length.
    fn save(&self, q: &EmpPortCtx) -> Result<u64> {
        let at = {
            let mut ctx = self.ctx.lock();
            match *ctx {
                Ctx::Open => {}
                Ctx::Idle => return Err(ENOTCONN),
                Ctx::Saved(_) => return Err(EALREADY),
            }
            let at = self.image_place(q)?;
            let admin = self.info.admin();
            let parked = save_slot(&admin, self.id, self.slot(), q.key, q.offset, q.len)?;
            *ctx = Ctx::Saved(parked);
            at
        };
        // The image's length is its header's word at byte 8; read outside
        // our locks (user memory may fault).
        let mut b = [0u8; 4];
        let len_at = usize::try_from(at).map_err(|_| EFAULT)?.checked_add(8).ok_or(EFAULT)?;
        UserSlice::new(UserPtr::from_addr(len_at), 4).reader().read_slice(&mut b)?;
        Ok(u32::from_le_bytes(b) as u64)
    }

    /// C7 from this port's own memory into any free slot; returns the slot.
    fn restore(&self, q: &EmpPortCtx) -> Result<u64> {
        let mut ctx = self.ctx.lock();
        let Ctx::Saved(parked) = &mut *ctx else {
            return Err(EINVAL);
        };
        if q.len > CTX_IMAGE_MAX as u64 {
            return Err(EINVAL);
        }
        self.image_place(q)?;
        let admin = self.info.admin();
        let slot = restore_slot(&admin, parked, None, (q.key, q.offset, q.len), Some(&self.port))?;
        drop(admin);
        *ctx = Ctx::Open;
        Ok(slot as u64)
    }
}

/// GANG: `EmpGang::action` on every started port process `pid` holds.
///
/// # Errors
/// `EPERM` without `CAP_SYS_ADMIN`, `EINVAL` unknown action, reserved
/// bits or a pid ≤ 0, then what the steps return: `EALREADY` (a port
/// already suspended / not suspended), `EAGAIN` not stable, `EBUSY` a
/// restore whose slot is taken (retry), `ENOSPC` / `ENOMEM` no room for
/// another saved context, `ETIMEDOUT`, `ENODEV`. A step stops at the first
/// port that fails; those done stay done (as emp-nicd's GANG).
pub(super) fn gang(info: &NicInfo, arg: UserArg) -> Result<isize> {
    let mut q: EmpGang = arg.read()?;
    if q.reserved != 0 || q.pid <= 0 || q.ports != 0 || q.stable != 0 {
        return Err(EINVAL);
    }
    // SAFETY: `capable` only reads the calling task's credentials.
    if !unsafe { bindings::capable(bindings::CAP_SYS_ADMIN as _) } {
        return Err(EPERM);
    }
    let admin = info.admin();
    let slots: u64 = {
        let st = info.state.lock();
        (0..info.ports())
            .filter(|&s| {
                let h = st.holders[s as usize];
                h.file != 0 && h.tgid == q.pid && h.started
            })
            .fold(0, |m, s| m | 1u64 << s)
    };
    let each = |op: AdminOp| -> Result<u64> {
        let mut stable = 0;
        for s in (0..64u16).filter(|s| slots & 1u64 << s != 0) {
            match admin.run(op, [s as u64, 0, 0, 0])? {
                admin_result::NOT_STABLE if op == AdminOp::PortStable => {}
                r => {
                    ctx_result(r)?;
                    stable += 1;
                }
            }
        }
        Ok(stable)
    };
    let n = slots.count_ones() as u64;
    (q.ports, q.stable) = match q.action as u64 {
        action::PORTS => (n, 0),
        action::SUSPEND => (each(AdminOp::PortSuspend)?, 0),
        action::RESUME => (each(AdminOp::PortResume)?, 0),
        action::STABLE => (n, each(AdminOp::PortStable)?),
        action::SAVE => (gang_save(&admin, slots)?, 0),
        action::RESTORE => (gang_restore(&admin, q.pid)?, 0),
        _ => return Err(EINVAL),
    };
    drop(admin);
    arg.write(&q)?;
    Ok(0)
}

/// GANG SAVE of each slot in `slots` into driver memory; returns how many.
fn gang_save(admin: &Admin<'_>, slots: u64) -> Result<u64> {
    let info = admin.info;
    let mut saved = 0;
    for slot in (0..64u16).filter(|s| slots & 1u64 << s != 0) {
        {
            let mut st = info.state.lock();
            if st.gang.len() >= GANG_SAVED_MAX {
                return Err(ENOSPC);
            }
            st.gang.reserve(1, GFP_KERNEL)?;
        }
        let mut image = ImagePages::alloc(EMP_GANG_IMAGE_ROOM as usize)?;
        let (file, image_mr, image_key) = {
            let mut st = info.state.lock();
            let file = st.holders[slot as usize].file;
            let mr = st.mr_free.pop().ok_or(ENOSPC)?;
            // SAFETY: get_random_u32 has no preconditions (the kernel's CRNG).
            let random = unsafe { bindings::get_random_u32() };
            let (key, secret) = MrEntry::make_key(&mut st.key_salt, mr, random);
            let mut eb = [0u8; MrEntry::SIZE];
            let written = image.entry(key, slot, MR_LOCAL_READ | MR_LOCAL_WRITE).and_then(|e| {
                MrEntry { secret, ..e }.put(&mut eb);
                st.write_bytes(info.layout.mr_entry(mr as usize), &eb)
            });
            if let Err(e) = written {
                let _ = st.mr_free.push(mr, GFP_KERNEL);
                return Err(e);
            }
            // The image's entry moves with the context's own.
            st.mr_file[mr as usize] = file;
            (file, mr, key)
        };
        let room = image.len() as u64;
        match save_slot(admin, file, slot, image_key, 0, room) {
            Ok(parked) => {
                let len = image.read_u32(8).unwrap_or(0);
                let record = GangSaved { slot, parked, image, image_mr, image_key, len };
                // Cannot fail: room was reserved above, under the mailbox.
                if let Err(e) = info.state.lock().gang.push_within_capacity(record) {
                    let lost = e.0;
                    let _ = admin.run(AdminOp::PortDiscard, [lost.parked.identity(), 0, 0, 0]);
                    admin.clear_mr(lost.image_mr, 0);
                    drop(lost.image);
                    return Err(ENOMEM);
                }
                saved += 1;
            }
            Err(e) => {
                admin.clear_mr(image_mr, 0);
                return Err(e);
            }
        }
    }
    Ok(saved)
}

/// GANG RESTORE of every context of `pid` saved by GANG SAVE, each into
/// the slot it had; returns how many.
fn gang_restore(admin: &Admin<'_>, pid: i32) -> Result<u64> {
    let info = admin.info;
    let mut restored = 0;
    let mut from = 0;
    loop {
        let mut g = {
            let mut st = info.state.lock();
            let Some(i) = (from..st.gang.len()).find(|&i| st.gang[i].parked.holder.tgid == pid) else {
                return Ok(restored);
            };
            from = i;
            st.gang.remove(i).map_err(|_| EINVAL)?
        };
        let place = (g.image_key, 0, g.len as u64);
        match restore_slot(admin, &mut g.parked, Some(g.slot), place, None) {
            Ok(_) => {
                admin.clear_mr(g.image_mr, 0);
                drop(g.image);
                restored += 1;
            }
            Err(e) => {
                // Back where it was (its place was freed just above).
                let _ = info.state.lock().gang.insert_within_capacity(from, g);
                return Err(e);
            }
        }
    }
}
