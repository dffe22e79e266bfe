//! The group table: ordered endpoint lists the trusted side wrote into SRAM
//! (checked there, and again here), loaded on `GroupSet`. Every collective
//! names a group slot; every collective message names the group's id and
//! epoch, so instances of a re-created group never mix with the old one.
//!
//! Memory: a group of up to 64 members takes its one table slot; a wider
//! one (up to `GROUP_MEMBERS_MAX` = 1024) takes `GroupEntry::span`
//! consecutive slots, its body in the slots after its entry, so the table
//! (`group_entries` slots of 1 KiB) is the NIC's member pool. Loaded, a
//! group of n members and t trees holds about n · (12 + 6 t) bytes here
//! (members, an index by endpoint, parents and child lists per tree).

use emp_uapi::coll::TREE_ROOT_WIDE;
use emp_uapi::desc::Status;
use emp_uapi::sram::{admin_result, GroupEntry, GroupView};
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
    /// Parent arrays over relative ranks (relative to the operation's
    /// root), [`TREE_ROOT_WIDE`] at the root.
    pub trees: Vec<Vec<u16>>,
    /// Children of every relative rank per tree, ascending.
    kids: Vec<ChildLists>,
    /// `(member, rank)` sorted by member: [`GroupState::rank_of`] without a scan.
    by_endpoint: Vec<(u32, u16)>,
    /// Table slots the group takes from its own (`GroupEntry::span`).
    pub span: u32,
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

/// The children of every relative rank of one tree, built once when the
/// group loads: rank r's are `list[start[r] .. start[r + 1]]`, ascending.
#[derive(Debug, Default)]
struct ChildLists {
    start: Vec<u16>,
    list: Vec<u16>,
}

impl ChildLists {
    fn new(parents: &[u16]) -> ChildLists {
        let n = parents.len();
        let mut start = vec![0u16; n + 1];
        for &p in &parents[1..] {
            start[p as usize + 1] += 1;
        }
        for r in 0..n {
            start[r + 1] += start[r];
        }
        let mut fill = start.clone();
        let mut list = vec![0u16; n.saturating_sub(1)];
        // Ascending children: visit them in rank order.
        for (c, &p) in parents.iter().enumerate().skip(1) {
            list[fill[p as usize] as usize] = c as u16;
            fill[p as usize] += 1;
        }
        ChildLists { start, list }
    }

    fn of(&self, rel: u16) -> &[u16] {
        let r = rel as usize;
        match (self.start.get(r), self.start.get(r + 1)) {
            (Some(&a), Some(&b)) => &self.list[a as usize..b as usize],
            _ => &[],
        }
    }
}

impl GroupState {
    /// The loaded form of a checked entry and its body.
    pub(crate) fn load(v: &GroupView<'_>, slot_span: u32) -> GroupState {
        let e = v.entry;
        let n = e.member_count as usize;
        let members: Vec<u32> = (0..n).map(|r| v.member(r)).collect();
        let trees: Vec<Vec<u16>> =
            (0..e.tree_count as usize).map(|t| (0..n).map(|r| v.parent(t, r)).collect()).collect();
        let kids = trees.iter().map(|p| ChildLists::new(p)).collect();
        let mut by_endpoint: Vec<(u32, u16)> = members.iter().enumerate().map(|(r, &m)| (m, r as u16)).collect();
        by_endpoint.sort_unstable();
        GroupState {
            port: e.port,
            id: e.group_id,
            epoch: e.epoch,
            rank: e.my_rank,
            n: e.member_count,
            members,
            trees,
            kids,
            by_endpoint,
            span: slot_span,
            next_instance: 0,
            bounce_key: e.bounce_key,
            bounce_offset: e.bounce_offset,
            bounce_slot_size: e.bounce_slot_size,
            bounce_free: (0..e.bounce_slots).rev().collect(),
        }
    }

    /// Rank of the member at (node, port), if any.
    pub fn rank_of(&self, node: u16, port: u16) -> Option<u16> {
        let e = (node as u32) << 16 | port as u32;
        let at = self.by_endpoint.binary_search_by_key(&e, |&(m, _)| m).ok()?;
        Some(self.by_endpoint[at].1)
    }

    /// (node, port) of `rank`.
    pub fn endpoint(&self, rank: u16) -> (u16, u16) {
        let m = self.members[rank as usize];
        ((m >> 16) as u16, m as u16)
    }

    /// Parent (relative rank) of relative rank `rel` in tree `t`, `None` at the root.
    pub fn parent(&self, t: u8, rel: u16) -> Option<u16> {
        let p = self.trees[t as usize][rel as usize];
        (p != TREE_ROOT_WIDE).then_some(p)
    }

    /// How many children relative rank `rel` has in tree `t`.
    pub fn child_count(&self, t: u8, rel: u16) -> u32 {
        self.child_ranks(t, rel).len() as u32
    }

    /// Children of relative rank `rel` in tree `t`, ascending (a copy of
    /// [`GroupState::child_ranks`]). Kept for callers that want an owned list.
    #[allow(dead_code)]
    pub fn children(&self, t: u8, rel: u16) -> Vec<u16> {
        self.child_ranks(t, rel).to_vec()
    }

    /// Children of relative rank `rel` in tree `t`, ascending, without
    /// allocating (the per-frame paths use this).
    pub fn child_ranks(&self, t: u8, rel: u16) -> &[u16] {
        self.kids.get(t as usize).map_or(&[], |k| k.of(rel))
    }
}

/// The group table and its index by (port, id).
#[derive(Debug, Default)]
pub(crate) struct Groups {
    pub slots: Vec<Option<GroupState>>,
    pub by_id: crate::keymap::KeyMap<(u16, u32), u32>,
}

impl Groups {
    pub(crate) fn new(entries: u32) -> Self {
        Groups {
            slots: (0..entries).map(|_| None).collect(),
            by_id: crate::keymap::KeyMap::with_capacity_and_hasher(entries as usize, Default::default()),
        }
    }

    pub(crate) fn get(&self, slot: u32) -> Option<&GroupState> {
        self.slots.get(slot as usize)?.as_ref()
    }

    pub(crate) fn used(&self) -> u32 {
        self.slots.iter().filter(|g| g.is_some()).count() as u32
    }

    /// Every live group fits the table, no two share a slot, and the index
    /// by (port, id) names exactly the live groups.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut end_of_last = 0u32;
        for s in 0..self.slots.len() as u32 {
            let Some(g) = self.get(s) else { continue };
            if s < end_of_last || s + g.span > self.slots.len() as u32 || g.span == 0 {
                return Err(format!("group slot {s} (span {}) overlaps another or leaves the table", g.span));
            }
            end_of_last = s + g.span;
            if self.by_id.get(&(g.port, g.id)) != Some(&s) {
                return Err(format!("group slot {s} (port {}, id {}) not indexed", g.port, g.id));
            }
            if g.members.len() != g.n as usize || g.trees.iter().any(|t| t.len() != g.n as usize) {
                return Err(format!("group slot {s}: member or tree arrays not of {} ranks", g.n));
            }
        }
        if self.by_id.len() as u32 != self.used() {
            return Err(format!("{} groups indexed, {} live", self.by_id.len(), self.used()));
        }
        Ok(())
    }

    /// Live groups whose slots overlap `slot .. slot + span`.
    pub(crate) fn overlapping(&self, slot: u32, span: u32) -> Vec<u32> {
        let end = slot + span;
        (0..self.slots.len() as u32).filter(|&s| self.get(s).is_some_and(|g| s < end && slot < s + g.span)).collect()
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
        let g = match self.group_from_table(hal, slot, None) {
            Ok(g) => g,
            Err(r) => return r,
        };
        let span = g.span;
        if let Some(&old) = self.groups.by_id.get(&(g.port, g.id)) {
            let prev = self.groups.get(old).expect("indexed");
            if prev.epoch >= g.epoch {
                return admin_result::BAD_ARG;
            }
            self.group_remove(hal, now, old, Status::StaleGroup);
        }
        // Whatever held these slots is replaced.
        for s in self.groups.overlapping(slot, span) {
            self.group_remove(hal, now, s, Status::StaleGroup);
        }
        self.groups.by_id.insert((g.port, g.id), slot);
        let port = g.port;
        self.groups.slots[slot as usize] = Some(g);
        self.rbcast_group_loaded(hal, slot);
        // Messages refused because the group did not exist may go now.
        self.coll_kick(hal, port);
        admin_result::OK
    }

    /// Reads group table slot `slot` (written by the trusted side) and
    /// checks it as the trusted side did: the entry and any body, this
    /// node's membership, its port (open, or `restore`'s slot), the bounce
    /// memory of that port. The member at the entry's rank is this node's
    /// port under its *wire address* (the slot number unless opened or
    /// restored under another; `ctxsw.rs`), which peers' frames carry.
    /// `GroupSet` loads groups through it, and so does a context restore
    /// (`restore` = (slot, wire address); membership never comes from the
    /// untrusted image). The loaded group, or the admin result refusing it.
    pub(crate) fn group_from_table<H: Hal>(
        &self,
        hal: &mut H,
        slot: u32,
        restore: Option<(u16, u16)>,
    ) -> Result<GroupState, u32> {
        let mut b = [0u8; GroupEntry::SIZE];
        hal.sram_read(self.layout.group_entry(slot as usize), &mut b);
        let e = GroupEntry::get(&b);
        // A wide group's body is in the slots after its entry.
        let span = e.span() as u64;
        if slot as u64 + span > self.groups.slots.len() as u64 {
            return Err(admin_result::BAD_ARG);
        }
        let mut body = vec![0u8; (span as usize - 1) * GroupEntry::SIZE];
        if !body.is_empty() {
            hal.sram_read(self.layout.group_entry(slot as usize + 1), &mut body);
        }
        let addr = match restore {
            None if (e.port as usize) < self.ports.len() && self.ports[e.port as usize].open => {
                self.ports[e.port as usize].addr
            }
            Some((s, addr)) if e.port == s => addr,
            _ => return Err(admin_result::BAD_STATE),
        };
        // The entry names the slot; its member list, the wire address.
        let mut by_addr = e;
        by_addr.port = addr;
        let caller = (self.node as u32) << 16 | addr as u32;
        if (GroupView { entry: &by_addr, body: &body }).check(caller).is_err() {
            return Err(admin_result::BAD_ARG);
        }
        let view = GroupView { entry: &e, body: &body };
        if e.bounce_slots > 0 {
            let bytes = e.bounce_slots as u64 * e.bounce_slot_size as u64;
            let rw = emp_uapi::desc::MR_LOCAL_READ | emp_uapi::desc::MR_LOCAL_WRITE;
            if e.bounce_slot_size == 0 || self.mr_lookup(hal, e.port, e.bounce_key, e.bounce_offset, bytes, rw).is_err()
            {
                return Err(admin_result::BAD_KEY);
            }
        }
        Ok(GroupState::load(&view, span as u32))
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

#[cfg(test)]
mod tests {
    use super::*;
    use emp_uapi::coll::{GROUP_MEMBERS_MAX, TREE_ROOT};

    /// A group of 1024 on one binomial tree, loaded from its entry and body:
    /// ranks by endpoint, parents and child lists agree with the tree.
    #[test]
    fn wide_group_loads_with_child_lists_and_endpoint_index() {
        let n = GROUP_MEMBERS_MAX;
        let e = GroupEntry {
            group_id: 9,
            epoch: 1,
            member_count: n as u16,
            my_rank: 5,
            port: 2,
            tree_count: 1,
            ..Default::default()
        };
        let mut body = vec![0u8; (e.span() - 1) * GroupEntry::SIZE];
        let parent = |r: usize| if r == 0 { TREE_ROOT_WIDE } else { (r - (1 << r.ilog2())) as u16 };
        for r in 0..n {
            // Endpoints out of rank order, so the index is exercised.
            let m = (((n - r) as u32) << 16) | 2;
            body[4 * r..4 * r + 4].copy_from_slice(&m.to_le_bytes());
            body[4 * n + 2 * r..4 * n + 2 * r + 2].copy_from_slice(&parent(r).to_le_bytes());
        }
        let v = GroupView { entry: &e, body: &body };
        assert_eq!(v.check(v.member(5)), Ok(()));
        let g = GroupState::load(&v, e.span() as u32);
        assert_eq!((g.n, g.span), (1024, 7));
        for r in 0..n {
            assert_eq!(g.rank_of((n - r) as u16, 2), Some(r as u16));
            assert_eq!(g.parent(0, r as u16), (r != 0).then(|| parent(r)));
            let kids: Vec<u16> = (1..n).filter(|&c| parent(c) as usize == r).map(|c| c as u16).collect();
            assert_eq!(g.child_ranks(0, r as u16), &kids[..]);
            assert_eq!(g.children(0, r as u16), kids);
        }
        assert_eq!(g.child_ranks(0, 0).len(), 10);
        assert_eq!((g.rank_of(2000, 2), g.rank_of(1, 3)), (None, None));
        assert!(g.child_ranks(1, 0).is_empty(), "no such tree");
        // An inline group reads its u8 parents the same way.
        let g = crate::coll::test_group(1, &[TREE_ROOT, 0, 0, 1]);
        assert_eq!((g.parent(0, 0), g.parent(0, 3), g.child_ranks(0, 0)), (None, Some(1), &[1u16, 2][..]));
    }
}
