// SPDX-License-Identifier: GPL-2.0

//! Groups for NIC-offloaded collectives: GROUP_SET and GROUP_CLEAR.
//!
//! GROUP_SET copies a 1 KiB group table entry from the caller, stamps it
//! with the caller's port, checks it (`GroupEntry::check`: the caller is
//! the member at its rank, no duplicate members, the trees are trees,
//! reserved fields are zero), gives it a slot — one slot per (port, group
//! id), as emp-nicd does: re-creating a group reuses its slot — writes it
//! into the SRAM group table and has the NIC load it (admin `GroupSet`;
//! the control program checks it again). GROUP_CLEAR retires a slot of the
//! caller's port (admin `GroupClear`).
//!
//! Slot bookkeeping lives in the NIC state (`State::groups`), under its
//! lock. A slot changes hands only with the admin mailbox held too
//! (`NicInfo::admin`), so it cannot change while the command that loads or
//! drops its group runs (that command runs without the state lock). When a
//! port is released
//! the NIC drops the port's groups as part of `PortClose` (a group can
//! only be loaded for an open port) and `release_port` frees the port's
//! slots here.
//!
//! A child module of `port` (it reads the port's and the NIC state's
//! private fields).

use kernel::{
    prelude::*,
    uaccess::{UserPtr, UserSlice},
};

use super::{NicInfo, Port, State, UserArg};
use crate::ioctl::{EmpGroupClear, EmpGroupSet};
use crate::sram::{admin_result, AdminOp, GroupEntry};
use crate::{Le, ZEROS};

/// Who holds each group table slot: `(port, group id)`, or nobody.
pub(super) struct GroupSlots(KVec<Option<(u16, u32)>>);

impl GroupSlots {
    /// No slots (until `init`).
    pub(super) const fn new() -> Self {
        GroupSlots(KVec::new())
    }

    /// `entries` free slots (the NIC's group table size; slot numbers must
    /// fit the 16-bit field of a collective work descriptor).
    pub(super) fn init(&mut self, entries: u32) -> Result {
        let n = entries.min(0x1_0000) as usize;
        self.0.truncate(0);
        self.0.reserve(n, GFP_KERNEL)?;
        for _ in 0..n {
            self.0.push(None, GFP_KERNEL)?;
        }
        Ok(())
    }

    /// Slots in the table.
    pub(super) fn entries(&self) -> u32 {
        self.0.len() as u32
    }

    /// Slots held by some port.
    pub(super) fn in_use(&self) -> u32 {
        self.0.iter().filter(|s| s.is_some()).count() as u32
    }

    /// The slot of (`port`, `id`): its own if it has one (`false`),
    /// otherwise a free one, now held (`true`).
    ///
    /// # Errors
    /// `ENOSPC` when every slot is held.
    fn claim(&mut self, port: u16, id: u32) -> Result<(usize, bool)> {
        if let Some(s) = self.0.iter().position(|g| *g == Some((port, id))) {
            return Ok((s, false));
        }
        let s = self.0.iter().position(|g| g.is_none()).ok_or(ENOSPC)?;
        self.0[s] = Some((port, id));
        Ok((s, true))
    }

    /// Whether `port` holds `slot`.
    fn held_by(&self, slot: u32, port: u16) -> bool {
        self.0.get(slot as usize).copied().flatten().is_some_and(|(p, _)| p == port)
    }

    /// Whether (`port`, `id`) holds `slot`.
    fn held_by_group(&self, slot: usize, port: u16, id: u32) -> bool {
        self.0.get(slot).is_some_and(|g| *g == Some((port, id)))
    }

    fn free(&mut self, slot: usize) {
        if let Some(s) = self.0.get_mut(slot) {
            *s = None;
        }
    }
}

/// Frees every slot `port` holds and wipes their SRAM entries (the caller
/// holds the admin mailbox and the NIC state lock, and has closed the port
/// on the NIC, which dropped the port's groups there).
pub(super) fn release_port(info: &NicInfo, st: &mut State, port: u16) {
    for slot in 0..st.groups.0.len() {
        if st.groups.held_by(slot as u32, port) {
            st.groups.free(slot);
            // Best effort: a device that is gone has no table to wipe.
            let _ = st.write_bytes(info.layout.group_entry(slot), &ZEROS[..GroupEntry::SIZE]);
        }
    }
}

impl Port {
    /// GROUP_SET: load the caller's group entry; returns its slot in `slot`.
    ///
    /// # Errors
    /// `EFAULT` bad argument or entry pointer, `EINVAL`/`E2BIG` bad size, reserved
    /// bits, or an entry that fails the checks (or that the NIC refuses,
    /// e.g. a re-creation without a newer epoch), `ENOTCONN` the port is not
    /// started, `ENOENT` the bounce region is not one of this port's,
    /// `ENOSPC` the group table is full, `ETIMEDOUT` the NIC did not answer,
    /// `ENODEV` device gone.
    pub(super) fn group_set(&self, arg: UserArg) -> Result<isize> {
        let mut q: EmpGroupSet = arg.read()?;
        if q.slot != 0 || q.reserved != [0; 2] {
            return Err(EINVAL);
        }
        // The NIC loads groups of open ports only.
        if !*self.started.lock() {
            return Err(ENOTCONN);
        }
        let mut b = KBox::new([0u8; GroupEntry::SIZE], GFP_KERNEL)?;
        let entry = usize::try_from(q.entry).map_err(|_| EFAULT)?;
        UserSlice::new(UserPtr::from_addr(entry), GroupEntry::SIZE).reader().read_slice(&mut b[..])?;
        let mut e = KBox::new(GroupEntry::get(&b[..]), GFP_KERNEL)?;
        e.port = self.port;
        let caller = (self.info.node as u32) << 16 | self.port as u32;
        if let Err(why) = e.check(caller) {
            pr_debug!("emp: port {}: group entry refused: {}\n", self.port, why.as_str());
            return Err(EINVAL);
        }
        e.put(&mut b[..]);
        let layout = &self.info.layout;
        let admin = self.info.admin();
        let (slot, fresh, written) = {
            let mut st = self.info.state.lock();
            if st.gone {
                return Err(ENODEV);
            }
            let (slot, fresh) = st.groups.claim(self.port, e.group_id)?;
            (slot, fresh, st.write_bytes(layout.group_entry(slot), &b[..]))
        };
        let r = written.and_then(|()| admin.run(AdminOp::GroupSet, [slot as u64, 0, 0, 0]));
        let err = match r {
            Ok(admin_result::OK) => None,
            // The port is not open on the NIC.
            Ok(admin_result::BAD_STATE) => Some(ENOTCONN),
            // The bounce region is not a readable and writable region of the port.
            Ok(admin_result::BAD_KEY) => Some(ENOENT),
            // The NIC's own checks failed (e.g. an epoch not newer than the loaded one).
            Ok(_) => Some(EINVAL),
            Err(e) => Some(e),
        };
        if let Some(err) = err {
            // The NIC kept what the slot held: nothing, or the older epoch
            // of the same group, which stays usable under its slot.
            if fresh {
                self.info.state.lock().groups.free(slot);
            }
            return Err(err);
        }
        // Writing to user memory may fault (mmap_lock): not under our locks.
        drop(admin);
        q.slot = slot as u32;
        if let Err(err) = arg.write(&q) {
            // The caller cannot learn the slot: undo a new group (a
            // replaced one stays loaded under its id, as on success).
            let admin = self.info.admin();
            let ours = self.info.state.lock().groups.held_by_group(slot, self.port, e.group_id);
            if fresh && ours {
                let _ = admin.run(AdminOp::GroupClear, [slot as u64, 0, 0, 0]);
                let mut st = self.info.state.lock();
                st.groups.free(slot);
                let _ = st.write_bytes(layout.group_entry(slot), &ZEROS[..GroupEntry::SIZE]);
            }
            return Err(err);
        }
        Ok(0)
    }

    /// GROUP_CLEAR: retire a slot of this port; its unfinished operations
    /// complete `Flushed`.
    ///
    /// # Errors
    /// `ENOENT` a slot this port does not hold (another port's, out of
    /// range, or already cleared), `EINVAL`/`E2BIG` bad size, `EFAULT` bad pointer,
    /// `ETIMEDOUT` the NIC did not answer (the slot is freed anyway),
    /// `ENODEV` device gone.
    pub(super) fn group_clear(&self, arg: UserArg) -> Result<isize> {
        let q: EmpGroupClear = arg.read()?;
        let admin = self.info.admin();
        {
            let st = self.info.state.lock();
            if st.gone {
                return Err(ENODEV);
            }
            if !st.groups.held_by(q.slot, self.port) {
                return Err(ENOENT);
            }
        }
        let r = admin.run(AdminOp::GroupClear, [q.slot as u64, 0, 0, 0]);
        let mut st = self.info.state.lock();
        st.groups.free(q.slot as usize);
        let _ = st.write_bytes(self.info.layout.group_entry(q.slot as usize), &ZEROS[..GroupEntry::SIZE]);
        match r? {
            admin_result::OK => Ok(0),
            _ => Err(ENOENT),
        }
    }
}
