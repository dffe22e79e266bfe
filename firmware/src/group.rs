//! The group table: ordered endpoint lists the trusted side wrote into SRAM
//! (checked there, and again here), loaded on `GroupSet`. Every collective
//! names a group slot; every collective message names the group's id and
//! epoch, so instances of a re-created group never mix with the old one.

use std::collections::HashMap;

use emp_uapi::coll::TREE_ROOT;
use emp_uapi::desc::Status;
use emp_uapi::sram::{admin_result, GroupEntry};
use emp_uapi::Le;

use crate::{Hal, Nic};

/// A loaded group.
#[derive(Debug)]
pub(crate) struct GroupState {
    pub port: u16,
    pub id: u32,
    pub epoch: u32,
    pub rank: u16,
    pub n: u16,
    /// `(node << 16) | port` per rank.
    pub members: Vec<u32>,
    /// Parent arrays over relative ranks (relative to the operation's root).
    pub trees: Vec<Vec<u8>>,
    /// Instance number the next collective posted here gets.
    pub next_instance: u32,
    /// Bounce slots for broadcasts that arrive before they are posted
    /// (application bypass): region key, offset of slot 0, slot size.
    pub bounce_key: u32,
    pub bounce_offset: u64,
    pub bounce_slot_size: u32,
    /// Free bounce slots.
    pub bounce_free: Vec<u16>,
}

impl GroupState {
    /// Rank of the member at (node, port), if any.
    pub fn rank_of(&self, node: u16, port: u16) -> Option<u16> {
        let e = (node as u32) << 16 | port as u32;
        self.members.iter().position(|&m| m == e).map(|r| r as u16)
    }

    /// (node, port) of `rank`.
    pub fn endpoint(&self, rank: u16) -> (u16, u16) {
        let m = self.members[rank as usize];
        ((m >> 16) as u16, m as u16)
    }

    /// Parent (relative rank) of relative rank `rel` in tree `t`, `None` at the root.
    pub fn parent(&self, t: u8, rel: u16) -> Option<u16> {
        let p = self.trees[t as usize][rel as usize];
        (p != TREE_ROOT).then_some(p as u16)
    }

    /// How many children relative rank `rel` has in tree `t`.
    pub fn child_count(&self, t: u8, rel: u16) -> u32 {
        let tree = &self.trees[t as usize];
        (1..self.n).filter(|&c| tree[c as usize] as u16 == rel).count() as u32
    }

    /// Children of relative rank `rel` in tree `t`, ascending.
    pub fn children(&self, t: u8, rel: u16) -> Vec<u16> {
        let tree = &self.trees[t as usize];
        (0..self.n).filter(|&c| c != 0 && tree[c as usize] as u16 == rel).collect()
    }
}

/// The group table and its index by (port, id).
#[derive(Debug, Default)]
pub(crate) struct Groups {
    pub slots: Vec<Option<GroupState>>,
    pub by_id: HashMap<(u16, u32), u32>,
}

impl Groups {
    pub(crate) fn new(entries: u32) -> Self {
        Groups { slots: (0..entries).map(|_| None).collect(), by_id: HashMap::new() }
    }

    pub(crate) fn get(&self, slot: u32) -> Option<&GroupState> {
        self.slots.get(slot as usize)?.as_ref()
    }

    pub(crate) fn used(&self) -> u32 {
        self.slots.iter().filter(|g| g.is_some()).count() as u32
    }
}

impl Nic {
    /// `GroupSet`: loads slot `slot` from SRAM. The entry must pass the
    /// same checks the trusted side made, belong to an open port, and
    /// carry a newer epoch than the group it replaces.
    pub(crate) fn admin_group_set<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u64) -> u32 {
        if slot >= self.groups.slots.len() as u64 {
            return admin_result::BAD_ARG;
        }
        let slot = slot as u32;
        let mut b = [0u8; GroupEntry::SIZE];
        hal.sram_read(self.layout.group_entry(slot as usize), &mut b);
        let e = GroupEntry::get(&b);
        let caller = e.members.get(e.my_rank as usize).copied().unwrap_or(0);
        if e.check(caller).is_err() || caller >> 16 != self.node as u32 {
            return admin_result::BAD_ARG;
        }
        if e.port as usize >= self.ports.len() || !self.ports[e.port as usize].open {
            return admin_result::BAD_STATE;
        }
        if e.bounce_slots > 0 {
            let bytes = e.bounce_slots as u64 * e.bounce_slot_size as u64;
            let rw = emp_uapi::desc::MR_LOCAL_READ | emp_uapi::desc::MR_LOCAL_WRITE;
            if e.bounce_slot_size == 0 || self.mr_lookup(hal, e.port, e.bounce_key, e.bounce_offset, bytes, rw).is_err()
            {
                return admin_result::BAD_KEY;
            }
        }
        if let Some(&old) = self.groups.by_id.get(&(e.port, e.group_id)) {
            let prev = self.groups.get(old).expect("indexed");
            if prev.epoch >= e.epoch {
                return admin_result::BAD_ARG;
            }
            self.group_remove(hal, now, old, Status::StaleGroup);
        }
        if self.groups.get(slot).is_some() {
            self.group_remove(hal, now, slot, Status::StaleGroup);
        }
        let n = e.member_count as usize;
        let g = GroupState {
            port: e.port,
            id: e.group_id,
            epoch: e.epoch,
            rank: e.my_rank,
            n: e.member_count,
            members: e.members[..n].to_vec(),
            trees: (0..e.tree_count as usize).map(|t| e.tree(t).to_vec()).collect(),
            next_instance: 0,
            bounce_key: e.bounce_key,
            bounce_offset: e.bounce_offset,
            bounce_slot_size: e.bounce_slot_size,
            bounce_free: (0..e.bounce_slots).rev().collect(),
        };
        self.groups.by_id.insert((g.port, g.id), slot);
        let port = g.port;
        self.groups.slots[slot as usize] = Some(g);
        self.rbcast_group_loaded(hal, slot);
        // Messages refused because the group did not exist may go now.
        self.coll_kick(hal, port);
        admin_result::OK
    }

    /// `GroupClear`: retires slot `slot`; its operations finish `Flushed`.
    pub(crate) fn admin_group_clear<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u64) -> u32 {
        if slot >= self.groups.slots.len() as u64 {
            return admin_result::BAD_ARG;
        }
        if self.groups.get(slot as u32).is_none() {
            return admin_result::BAD_STATE;
        }
        self.group_remove(hal, now, slot as u32, Status::Flushed);
        admin_result::OK
    }

    /// Removes a group; its operations (posted or only recorded) end with `status`.
    pub(crate) fn group_remove<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32, status: Status) {
        self.coll_flush_group(hal, now, slot, status);
        self.rbcast_group_removed(hal, now, slot, status);
        if let Some(g) = self.groups.slots[slot as usize].take() {
            self.groups.by_id.remove(&(g.port, g.id));
        }
    }

    /// Port close: every group of the port goes.
    pub(crate) fn groups_of_port_remove<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16) {
        for s in 0..self.groups.slots.len() as u32 {
            if self.groups.get(s).is_some_and(|g| g.port == port) {
                self.group_remove(hal, now, s, Status::Flushed);
            }
        }
    }
}
