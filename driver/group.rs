// SPDX-License-Identifier: GPL-2.0

//! Groups for NIC-offloaded collectives: GROUP_SET and GROUP_CLEAR.
//!
//! GROUP_SET copies a 1 KiB group table entry from the caller — and, for a
//! group of more than 64 members (up to 1024), the body that follows it
//! in the caller's memory (`GroupEntry::body_len` bytes) — stamps it with
//! the caller's port, checks it (`GroupView::check`: the caller is the
//! member at its rank, no duplicate members, the trees are trees, reserved
//! fields and padding are zero), gives it `GroupEntry::span` consecutive
//! slots — one run per (port, group id), as emp-nicd does: re-creating a
//! group reuses its run where the new span fits — writes it into the SRAM
//! group table and has the NIC load it (admin `GroupSet` on the first
//! slot; the control program checks it again). GROUP_CLEAR retires a
//! group of the caller's port by its first slot (admin `GroupClear`).
//!
//! Slot bookkeeping lives in the NIC state (`State::groups`), under its
//! lock, keyed by the file that created the group (not its slot: a port
//! context saved and restored into another slot keeps its groups, as
//! emp-nicd keys them by the port's identity). A slot changes hands only
//! with the admin mailbox held too (`NicInfo::admin`), so it cannot change
//! while the command that loads or drops its group runs (that command runs
//! without the state lock). A saved context's groups keep their slots and
//! SRAM entries (the NIC dropped them from its own tables at the save and
//! loads them again at the restore, from entries `move_file` pointed at
//! the new slot). When a file goes, the NIC has dropped its groups (its
//! port closed, or its saved context discarded) and `release_file` frees
//! their slots here.
//!
//! A child module of `port` (it reads the port's and the NIC state's
//! private fields).

use core::ops::Range;

use kernel::{
    prelude::*,
    uaccess::{UserPtr, UserSlice},
};

use super::{NicInfo, Port, State, UserArg};
use crate::ioctl::{EmpGroupClear, EmpGroupSet};
use crate::sram::{admin_result, AdminOp, GroupEntry, GroupView};
use crate::{Le, ZEROS};

/// Who holds each group table slot: `(file, group id)`, or nobody.
pub(super) struct GroupSlots(KVec<Option<(u64, u32)>>);

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

    /// The slots (`file`, `id`) holds (a group's slots are consecutive).
    fn run_of(&self, file: u64, id: u32) -> Option<Range<usize>> {
        let me = Some((file, id));
        let first = self.0.iter().position(|g| *g == me)?;
        let len = self.0[first..].iter().take_while(|g| **g == me).count();
        Some(first..first + len)
    }

    /// `span` consecutive slots for (`file`, `id`), now held: its own run
    /// if the new span fits there, else the first free run. Returns the
    /// first slot and the run the group held before (`None`: a new group).
    ///
    /// # Errors
    /// `ENOSPC` when no run of `span` slots is free.
    fn claim(&mut self, file: u64, id: u32, span: usize) -> Result<(usize, Option<Range<usize>>)> {
        let me = Some((file, id));
        let before = self.run_of(file, id);
        let table = &self.0;
        let fits = |s: usize| s + span <= table.len() && table[s..s + span].iter().all(|g| g.is_none() || *g == me);
        let slot = before.clone().map(|r| r.start).filter(|&s| fits(s)).or_else(|| (0..table.len()).find(|&s| fits(s)));
        let slot = slot.ok_or(ENOSPC)?;
        for g in &mut self.0[slot..slot + span] {
            *g = me;
        }
        Ok((slot, before))
    }

    /// After the NIC answered a GROUP_SET for `run`: on success the
    /// group's old slots outside the new run are free; on failure the NIC
    /// kept what the slots held (nothing, or the older epoch of the same
    /// group, which stays usable), so the slots newly taken are free again.
    fn settle(&mut self, run: Range<usize>, before: Option<Range<usize>>, loaded: bool) {
        for s in 0..self.0.len() {
            let (new, old) = (run.contains(&s), before.as_ref().is_some_and(|r| r.contains(&s)));
            if (loaded && old && !new) || (!loaded && new && !old) {
                self.0[s] = None;
            }
        }
    }

    /// Whether `slot` is the first slot of a group `file` holds.
    fn first_of_file(&self, slot: u32, file: u64) -> bool {
        match self.0.get(slot as usize).copied().flatten() {
            Some((f, id)) if f == file => self.run_of(f, id).is_some_and(|r| r.start == slot as usize),
            _ => false,
        }
    }

    /// Whether `file` holds `slot`.
    fn held_by(&self, slot: u32, file: u64) -> bool {
        self.0.get(slot as usize).copied().flatten().is_some_and(|(f, _)| f == file)
    }

    /// Whether (`file`, `id`) holds `slot`.
    fn held_by_group(&self, slot: usize, file: u64, id: u32) -> bool {
        self.0.get(slot).is_some_and(|g| *g == Some((file, id)))
    }

    /// The first slot of each group `file` holds.
    fn heads_of(&self, file: u64) -> impl Iterator<Item = usize> + '_ {
        (0..self.0.len())
            .filter(move |&s| matches!(self.0[s], Some((f, _)) if f == file) && (s == 0 || self.0[s - 1] != self.0[s]))
    }

    fn free(&mut self, slot: usize) {
        if let Some(s) = self.0.get_mut(slot) {
            *s = None;
        }
    }
}

/// Points the group entries `file` holds at `slot`, where its saved
/// context is being restored (the NIC loads them again from the table
/// and checks they are that slot's). The caller holds the admin mailbox
/// and the NIC state lock.
pub(super) fn move_file(info: &NicInfo, st: &State, file: u64, slot: u16) -> Result {
    let mut b = KBox::new([0u8; GroupEntry::SIZE], GFP_KERNEL)?;
    let heads: KVec<usize> = {
        let mut v = KVec::new();
        for s in st.groups.heads_of(file) {
            v.push(s, GFP_KERNEL)?;
        }
        v
    };
    for s in heads {
        let off = info.layout.group_entry(s);
        for (i, w) in b.chunks_mut(4).enumerate() {
            w.copy_from_slice(&st.read32(off + 4 * i)?.to_le_bytes());
        }
        let mut e = GroupEntry::get(&b[..]);
        e.port = slot;
        e.put(&mut b[..]);
        st.write_bytes(off, &b[..])?;
    }
    Ok(())
}

/// Frees every slot `file` holds and wipes their SRAM entries (the caller
/// holds the admin mailbox and the NIC state lock, and the NIC has dropped
/// the file's groups: its port closed, or its saved context discarded).
pub(super) fn release_file(info: &NicInfo, st: &mut State, file: u64) {
    for slot in 0..st.groups.0.len() {
        if st.groups.held_by(slot as u32, file) {
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
        if !matches!(*self.ctx.lock(), super::Ctx::Open) {
            return Err(ENOTCONN);
        }
        let entry = usize::try_from(q.entry).map_err(|_| EFAULT)?;
        let mut head = KBox::new([0u8; GroupEntry::SIZE], GFP_KERNEL)?;
        UserSlice::new(UserPtr::from_addr(entry), GroupEntry::SIZE).reader().read_slice(&mut head[..])?;
        let mut e = KBox::new(GroupEntry::get(&head[..]), GFP_KERNEL)?;
        e.port = self.slot();
        // A wide group's body follows its entry; the span is bounded by the
        // table before anything is allocated for it.
        let span = e.span();
        if span > self.info.layout.params.group_entries as usize {
            return Err(if e.member_count as usize > crate::coll::GROUP_MEMBERS_MAX { EINVAL } else { ENOSPC });
        }
        let mut encoded = KVec::new();
        encoded.resize(span * GroupEntry::SIZE, 0u8, GFP_KERNEL)?;
        let body_len = e.body_len();
        if body_len > 0 {
            let at = entry.checked_add(GroupEntry::SIZE).ok_or(EFAULT)?;
            UserSlice::new(UserPtr::from_addr(at), body_len)
                .reader()
                .read_slice(&mut encoded[GroupEntry::SIZE..GroupEntry::SIZE + body_len])?;
        }
        // Members are named by wire address (what QUERY gives peers), which
        // is not the slot for a file opened while a saved context holds it:
        // checked under the address, as the control program checks it; the
        // entry itself names the slot.
        let caller = (self.info.node as u32) << 16 | self.addr as u32;
        e.port = self.addr;
        let checked = (GroupView { entry: &e, body: &encoded[GroupEntry::SIZE..] }).check(caller);
        e.port = self.slot();
        if let Err(why) = checked {
            pr_debug!("emp: port {}: group entry refused: {}\n", self.slot(), why.as_str());
            return Err(EINVAL);
        }
        e.put(&mut encoded[..GroupEntry::SIZE]);
        let layout = &self.info.layout;
        let admin = self.info.admin();
        let (slot, before, written) = {
            let mut st = self.info.state.lock();
            if st.gone {
                return Err(ENODEV);
            }
            self.holds(&st)?;
            let (slot, before) = st.groups.claim(self.id, e.group_id, span)?;
            (slot, before, st.write_bytes(layout.group_entry(slot), &encoded[..]))
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
        let fresh = before.is_none();
        self.info.state.lock().groups.settle(slot..slot + span, before, err.is_none());
        if let Some(err) = err {
            return Err(err);
        }
        // Writing to user memory may fault (mmap_lock): not under our locks.
        drop(admin);
        q.slot = slot as u32;
        if let Err(err) = arg.write(&q) {
            // The caller cannot learn the slot: undo a new group (a
            // replaced one stays loaded under its id, as on success).
            let admin = self.info.admin();
            let ours = self.info.state.lock().groups.held_by_group(slot, self.id, e.group_id);
            if fresh && ours {
                let _ = admin.run(AdminOp::GroupClear, [slot as u64, 0, 0, 0]);
                let mut st = self.info.state.lock();
                for s in slot..slot + span {
                    st.groups.free(s);
                    let _ = st.write_bytes(layout.group_entry(s), &ZEROS[..GroupEntry::SIZE]);
                }
            }
            return Err(err);
        }
        Ok(0)
    }

    /// GROUP_CLEAR: retire the group whose first slot is `slot` (of this
    /// port) and free every slot it spans; its unfinished operations
    /// complete `Flushed`.
    ///
    /// # Errors
    /// `ENOENT` a slot that is not the first of a group this port holds
    /// (another port's, out of range, inside a wide group, or already
    /// cleared), `EINVAL`/`E2BIG` bad size, `EFAULT` bad pointer,
    /// `ETIMEDOUT` the NIC did not answer (the slots are freed anyway),
    /// `ENODEV` device gone.
    pub(super) fn group_clear(&self, arg: UserArg) -> Result<isize> {
        let q: EmpGroupClear = arg.read()?;
        let admin = self.info.admin();
        let run = {
            let st = self.info.state.lock();
            if st.gone {
                return Err(ENODEV);
            }
            self.holds(&st)?;
            if !st.groups.first_of_file(q.slot, self.id) {
                return Err(ENOENT);
            }
            let (file, id) = st.groups.0[q.slot as usize].ok_or(ENOENT)?;
            st.groups.run_of(file, id).ok_or(ENOENT)?
        };
        let r = admin.run(AdminOp::GroupClear, [q.slot as u64, 0, 0, 0]);
        let mut st = self.info.state.lock();
        for s in run {
            st.groups.free(s);
            let _ = st.write_bytes(self.info.layout.group_entry(s), &ZEROS[..GroupEntry::SIZE]);
        }
        match r? {
            admin_result::OK => Ok(0),
            _ => Err(ENOENT),
        }
    }
}
