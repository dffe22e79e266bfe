//! Reliable broadcast over wire multicast (seed 002, "Fast and Scalable
//! MPI-Level Broadcast using InfiniBand's Hardware Multicast Support"),
//! run by the control program instead of the MPI library, so the root's
//! host returns at once and no ACK waits for a host to make progress.
//!
//! - Root (§4.2, §5.1): the message is copied from the host into a free
//!   entry of the group's window (NIC buffers sized at group load),
//!   multicast once, and the host's operation completes at once. An entry
//!   is freed when every member of the root's own sub-group has
//!   acknowledged it (or was sent a reliable repair) and the co-roots have
//!   been sent it reliably. A post that finds the window full is treated as
//!   a timeout (every missing member is repaired now) and, still full,
//!   stays in the ring: the root stalls, it never drops.
//! - Receivers (§5.2): per-root sequence numbers; messages are held in the
//!   group's receive slots (the pre-posted buffers) in or out of order,
//!   duplicates are discarded, and the host's receives take them in root
//!   order, each exactly once.
//! - ACKs (§4.4, §5.5): cumulative. Member i ACKs at once when a message B
//!   with `B mod M = i mod M` arrives (skewed ACK every M); otherwise the
//!   ACK is owed: piggybacked on the node's next multicast, or sent after
//!   `rbcast_ack_delay_ns`. An arriving ACK only writes a word of the
//!   collector's ACK array; the collector's timer path (and a post that
//!   needs room) scans it.
//! - Co-roots (§4.3): with C co-roots the relative ranks split into
//!   sub-groups of `s = ceil(n / (C + 1))`, collected by relative ranks
//!   0, s, 2s, … The root sends each message reliably (EMP's point-to-point
//!   path, `CollKind::Rbcast`) to the co-roots along a binomial tree; each
//!   collector collects its own sub-group's ACKs and, after
//!   `rbcast_rto_ns`, sends the message reliably to each missing member
//!   only. A co-root takes the first copy to arrive.
//! - Credits (§5.4): every broadcast consumes a receive slot at every
//!   member, so each one known to a node decrements its credit for every
//!   member; members piggyback their cumulative re-post count on ACKs and
//!   multicasts. A root stalls at zero credit for a member of its
//!   sub-group; a co-root refuses new messages at zero credit for its
//!   sub-group, which holds the root's window and so stalls the root too.

mod image;
mod state;

use emp_uapi::coll::{rbcast_algo, CollHeader, CollKind, RBCAST_MEMBERS_MAX};
use emp_uapi::desc::{Opcode, Status, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_uapi::wire::{
    self, emit_rbcast, rbcast_flag, rbcast_kind, FrameHeader, FrameKind, MsgHeader, NackReason, RbcastHeader,
    MCAST_BASE, MCAST_GROUPS, WIRE_VERSION,
};
use emp_uapi::{seq_lt, Le};

use crate::coll::{CollAccept, CollData, CollTx, RBCAST_OP};
use crate::cq::Completion;
use crate::mr::Buf;
use crate::{timer, Hal, LocalDesc, Nic};

pub(crate) use image::RbImage;
pub(crate) use state::RbGroup as RbGroupState;
pub use state::RbcastStats;
use state::{sub_size, tree_child, tree_children, Arrival, Frag, RbGroup, RootAlgo};

/// Co-roots' announcements one round sends at most.
const RBCAST_ANNOUNCE_BURST: usize = 64;
/// How soon a scan cut short for want of repair tokens looks again
/// (ACKs return tokens meanwhile).
const RBCAST_REPAIR_PACE_NS: u64 = 20_000;

/// Members per sub-group (the collector included) of a broadcast over
/// `n` members with `coroots` co-roots (§4.3, §7.2's `s`).
pub fn sub_group_size(n: u16, coroots: u16) -> u16 {
    sub_size(n, coroots)
}

/// The multicast address a group's reliable broadcasts use (every member
/// derives the same one from the group id).
pub fn rbcast_addr(group_id: u32) -> u16 {
    MCAST_BASE + (group_id % MCAST_GROUPS as u32) as u16
}

/// What a received copy came to.
enum Taken {
    /// New, kept; or a duplicate, discarded (an ACK is owed again).
    Yes,
    /// No slot or window entry for it now: dropped (a multicast copy) or
    /// refused (a reliable copy; its sender retries).
    NoRoom,
    /// Not for any group here, or inconsistent with it.
    Invalid,
}

impl Nic {
    /// The reliable-broadcast state of group slot `slot`.
    fn rb(&mut self, slot: u32) -> &mut RbGroup {
        self.rbcast[slot as usize].as_mut().expect("live rbcast group")
    }

    /// A group was loaded into `slot`: its receive slots and window are
    /// made now, and its port joins the group's multicast address.
    pub(crate) fn rbcast_group_loaded<H: Hal>(&mut self, hal: &mut H, slot: u32) {
        if self.cfg.rbcast_window == 0 || self.cfg.rbcast_rx_slots == 0 {
            return;
        }
        let g = self.groups.get(slot).expect("just loaded");
        let (port, id, n, rank) = (g.port, g.id, g.n, g.rank);
        if n as usize > RBCAST_MEMBERS_MAX {
            // Wider than any wire rank (`rbcast_post` says TooLarge).
            return;
        }
        let addr = rbcast_addr(id);
        let stamp = self.next_stamp();
        let buf = wire::rbcast_payload_max(self.mtu);
        let c = &self.cfg;
        self.rbcast[slot as usize] =
            Some(RbGroup::new(addr, stamp, n, rank, c.rbcast_window, c.rbcast_rx_slots, c.rbcast_posted_max, buf));
        // Without the membership (table full) repairs still reach every
        // member, only slower: not an error.
        if self.mcast_join(hal, port, addr).is_err() {
            self.rbcast_join_failed += 1;
        }
    }

    /// Group `slot`'s reliable-broadcast state, if it has one: its
    /// multicast address and whether it is still pristine
    /// ([`RbGroup::pristine`]; `ctxsw.rs` keeps it out of a context image).
    pub(crate) fn rbcast_state_of(&self, slot: u32) -> Option<(u16, bool)> {
        self.rbcast.get(slot as usize)?.as_ref().map(|rb| (rb.addr, rb.pristine()))
    }

    /// Why group `slot`'s reliable-broadcast state cannot go into a port
    /// context image now, if it cannot (`ctxsw.rs`: the port is not
    /// stable yet).
    pub(crate) fn rbcast_unsaveable(&self, slot: u32) -> Option<&'static str> {
        let rb = self.rbcast.get(slot as usize)?.as_ref()?;
        if let Some(why) = rb.unsaveable() {
            return Some(why);
        }
        let ours = |c: &CollTx| c.op == RBCAST_OP && c.op_stamp == rb.stamp;
        self.send
            .tx
            .iter()
            .any(|(_, m)| m.coll.as_ref().is_some_and(|c| ours(c)))
            .then_some("a reliable copy is queued")
    }

    /// Receives the host posted for group `slot`'s broadcasts (descriptors
    /// outstanding).
    pub(crate) fn rbcast_posted(&self, slot: u32) -> usize {
        self.rbcast.get(slot as usize).and_then(|r| r.as_ref()).map_or(0, |rb| rb.posted.len())
    }

    /// Writes group `slot`'s record into a context image, as the image's
    /// group `index`, when it has a state that is not pristine (a pristine
    /// one is built again on restore); true when it wrote one.
    pub(crate) fn rbcast_put_image(&self, slot: u32, index: u16, out: &mut Vec<u8>) -> bool {
        match self.rbcast.get(slot as usize).and_then(|r| r.as_ref()) {
            Some(rb) if !rb.pristine() => {
                image::put(rb, index, out);
                true
            }
            _ => false,
        }
    }

    /// The largest record a group of `n` members can have here.
    pub(crate) fn rbcast_image_max(&self, n: u16) -> usize {
        let buf = wire::rbcast_payload_max(self.mtu);
        let c = &self.cfg;
        image::size(n as usize, c.rbcast_posted_max as usize, c.rbcast_rx_slots as usize, buf)
    }

    /// Reads and checks a record (after its group index) for group `g`,
    /// which restores into table slot `table_slot` for port `port`: the
    /// NIC must keep such state, and the posted receives' memory must be
    /// the port's.
    pub(crate) fn rbcast_get_image<H: Hal>(
        &self,
        hal: &mut H,
        port: u16,
        r: &mut crate::image::Reader,
        table_slot: u32,
        g: &crate::group::GroupState,
    ) -> Result<RbImage, &'static str> {
        let c = &self.cfg;
        if c.rbcast_window == 0 || c.rbcast_rx_slots == 0 || g.n as usize > RBCAST_MEMBERS_MAX {
            return Err("reliable-broadcast state for a NIC or group without it");
        }
        let limits = image::Limits {
            n: g.n,
            rank: g.rank,
            table_slot,
            posted_max: c.rbcast_posted_max as usize,
            slots: c.rbcast_rx_slots as usize,
            buf: wire::rbcast_payload_max(self.mtu),
        };
        let img = image::get(r, &limits)?;
        for (ld, _) in &img.posted {
            if self.check_sges(hal, port, ld.sges(), MR_LOCAL_WRITE).is_err() {
                return Err("reliable-broadcast receive's memory");
            }
        }
        Ok(img)
    }

    /// Installs a checked record into group `slot`'s state, fresh from
    /// [`Nic::rbcast_group_loaded`].
    pub(crate) fn rbcast_install(&mut self, slot: u32, img: RbImage) {
        let rb = self.rbcast[slot as usize].as_mut().expect("checked: the NIC keeps the state");
        rb.install(img);
        debug_assert!(rb.check().is_ok(), "{:?}", rb.check());
    }

    /// Group `slot` leaves with its port's saved context: its posted
    /// receives and held messages are in the image, so nothing completes.
    pub(crate) fn rbcast_group_saved<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32) {
        if let Some(rb) = self.rbcast.get_mut(slot as usize).and_then(|r| r.as_mut()) {
            rb.posted.clear();
        }
        self.rbcast_group_removed(hal, now, slot, Status::Flushed);
    }

    /// Group `slot` goes: its posted receives end with `status`, reliable
    /// copies still queued are abandoned, the port leaves the address
    /// unless another of its groups uses it.
    pub(crate) fn rbcast_group_removed<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32, status: Status) {
        let Some(mut rb) = self.rbcast[slot as usize].take() else { return };
        let port = self.groups.get(slot).expect("removed after this").port;
        while let Some((ld, _)) = rb.posted.pop_front() {
            self.complete(hal, port, Completion::of(&ld, Opcode::Rbcast, status));
        }
        let ours: Vec<u32> = self
            .send
            .tx
            .iter()
            .filter(|(_, m)| m.coll.as_ref().is_some_and(|c| c.op == RBCAST_OP && c.op_stamp == rb.stamp))
            .map(|(s, _)| s)
            .collect();
        for t in ours {
            self.finish_tx(hal, now, t, Status::Flushed);
        }
        let shared = (0..self.rbcast.len()).any(|s| {
            self.rbcast[s].as_ref().is_some_and(|o| o.addr == rb.addr)
                && self.groups.get(s as u32).is_some_and(|g| g.port == port)
        });
        if !shared {
            let _ = self.mcast_leave(hal, port, rb.addr);
        }
    }

    /// Can the next send-ring descriptor, an `Rbcast` at `off`, be taken
    /// now? A root's post needs a window entry and credit for its
    /// sub-group (a full window is treated as a timeout first); a
    /// receive, room in the posted queue. Invalid ones are taken (and
    /// refused). False: it stays in the ring — the root stalls.
    pub(crate) fn rbcast_admit<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, wd: &WorkDesc) -> bool {
        let slot = wd.node as u32;
        let valid = self.groups.get(slot).is_some_and(|g| g.port == port && wd.port < g.n);
        let Some(algo) = rbcast_algo(wd.tag) else { return true };
        if !valid || self.rbcast.get(slot as usize).is_none_or(|r| r.is_none()) {
            return true;
        }
        let rb = self.rb(slot);
        if wd.port != rb.rank {
            return rb.posted.len() < rb.posted_max;
        }
        if !rb.posted.is_empty() {
            // As a blocking MPI_Bcast would: a root sends only once the
            // group's earlier broadcasts reached it. Otherwise later
            // broadcasts could fill every member's slots (their credits)
            // while an earlier one, which all of them wait for, cannot go.
            return false;
        }
        self.rbcast_scan(hal, now, slot, false);
        let limit = self.rbcast_limit(algo.window);
        let Some(frags) = self.rbcast_frags(slot, wd.total_len(), limit) else {
            return true; // Too large for the window: refused by the post.
        };
        let rb = self.rb(slot);
        let (used, own) = rb.window_used();
        if own + frags > limit || used + frags > rb.window.len() {
            // Out of buffers: as a timeout (§5.1), then look again.
            rb.stats.window_full += 1;
            self.rbcast_scan(hal, now, slot, true);
            let rb = self.rb(slot);
            let (used, own) = rb.window_used();
            if own + frags > limit || used + frags > rb.window.len() {
                return false;
            }
        }
        let rb = self.rb(slot);
        let me = rb.rank;
        // Each fragment takes a buffer at every member: credit for all.
        if rb.mark_starved(me, algo.coroots, frags as i64) {
            rb.stats.credit_stalls += 1;
            // Their updates may be lost, or never sent (a member tells
            // only the roots it heard from): ask them after a while.
            let at = rb.polled_ns.max(now) + self.cfg.rbcast_rto_ns;
            self.rbcast_arm(at, slot);
            return false;
        }
        true
    }

    /// Window entries a root may use for a call asking for `window` (0: all).
    fn rbcast_limit(&self, window: u8) -> usize {
        match window {
            0 => self.cfg.rbcast_window as usize,
            w => (w as u32).min(self.cfg.rbcast_window) as usize,
        }
    }

    /// Fragments of a `len`-byte broadcast in group `slot` (§4.5), if it
    /// fits: every fragment needs a window entry at once (at most `limit`)
    /// and a receive buffer at each member (the root's own count of them:
    /// every NIC of a cluster has the same).
    fn rbcast_frags(&mut self, slot: u32, len: u64, limit: usize) -> Option<usize> {
        let payload = wire::rbcast_payload_max(self.mtu) as u64;
        let frags = len.div_ceil(payload).max(1);
        let rb = self.rb(slot);
        let fits = frags <= limit.min(rb.window.len()).min(rb.slots.len()) as u64 && frags <= u16::MAX as u64;
        fits.then_some(frags as usize)
    }

    /// An `Rbcast` descriptor (validated by `WorkDesc::validate`).
    pub(crate) fn rbcast_post<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, ld: LocalDesc) {
        let slot = ld.wd.node as u32;
        let fail = |nic: &mut Self, hal: &mut H, st| nic.complete(hal, port, Completion::of(&ld, Opcode::Rbcast, st));
        let Some(g) = self.groups.get(slot).filter(|g| g.port == port) else {
            return fail(self, hal, Status::GroupInvalid);
        };
        let (root, n) = (ld.wd.port, g.n);
        let algo = rbcast_algo(ld.wd.tag).expect("validated");
        if root >= n || algo.coroots >= n.max(1) {
            return fail(self, hal, Status::BadDescriptor);
        }
        if n as usize > RBCAST_MEMBERS_MAX {
            return fail(self, hal, Status::TooLarge);
        }
        if self.rbcast.get(slot as usize).is_none_or(|r| r.is_none()) {
            // This NIC was configured without reliable-broadcast buffers.
            return fail(self, hal, Status::TableFull);
        }
        let limit = self.rbcast_limit(algo.window);
        let Some(frags) = self.rbcast_frags(slot, ld.len, limit) else {
            // Larger than the window carries: the NIC tree broadcast does.
            return fail(self, hal, Status::TooLarge);
        };
        let is_root = self.rb(slot).rank == root;
        let access = if is_root { MR_LOCAL_READ } else { MR_LOCAL_WRITE };
        if let Err(st) = self.check_sges(hal, port, ld.sges(), access) {
            return fail(self, hal, st);
        }
        if !is_root {
            let rb = self.rb(slot);
            debug_assert!(rb.posted.len() < rb.posted_max, "admitted");
            rb.posted.push_back((ld, root));
            return self.rbcast_deliver(hal, now, port, slot);
        }
        // Every fragment is copied into its entry before any goes out, so
        // a failed copy sends nothing (admitted: the entries are free).
        let payload = wire::rbcast_payload_max(self.mtu);
        let len = ld.len as usize;
        let mut picked = [0u8; 64];
        let first_seq = self.rb(slot).next_seq;
        let mut copied = 0;
        let mut err = None;
        while copied < frags {
            let Some(e) = self.rb(slot).free_entry() else {
                err = Some(Status::TableFull);
                break;
            };
            let (off, flen) = (copied * payload, payload.min(len - copied * payload));
            let seq = first_seq.wrapping_add(copied as u32);
            let rb = self.rb(slot);
            let occupied = rb.occupy(e, root, seq, algo.coroots);
            debug_assert!(occupied, "an ACK row per window entry");
            let mut data = core::mem::take(&mut rb.window[e].data);
            let r = self.sge_io(hal, port, ld.sges(), off as u64, Buf::FromHost(&mut data[..flen]), MR_LOCAL_READ);
            self.rb(slot).window[e].data = data;
            picked[copied] = e as u8;
            copied += 1;
            let w = &mut self.rb(slot).window[e];
            w.len = flen as u16;
            w.frag = Frag { frag: (copied - 1) as u16, frags: frags as u16, msg_len: len as u32 };
            if let Err(st) = r {
                err = Some(st);
                break;
            }
        }
        if let Some(st) = err {
            let rb = self.rb(slot);
            for &e in &picked[..copied] {
                rb.window[e as usize].live = false;
            }
            if !rb.window.iter().any(|w| w.live && w.root == root) {
                rb.acks.release(root);
            }
            return fail(self, hal, st);
        }
        let rb = self.rb(slot);
        rb.next_seq = first_seq.wrapping_add(frags as u32);
        rb.consumed = rb.consumed.wrapping_add(frags as u32);
        // Its own broadcast takes no slot here: counted as re-posted at
        // once, so the others' credit for this node stays exact.
        rb.reposted = rb.reposted.wrapping_add(frags as u32);
        rb.stats.sent += frags as u64;
        rb.stats.fragmented += (frags > 1) as u64;
        let collectors = n.div_ceil(sub_size(n, algo.coroots));
        // NAK-based (§9): ACKs only as the window needs them, every half of it.
        let ack_every = match (algo.nak, algo.ack_every) {
            (true, 0) => (limit / 2).max(1) as u8,
            (_, m) => m.max(1),
        };
        for &e in &picked[..frags] {
            let w = &mut self.rb(slot).window[e as usize];
            w.ack_every = ack_every;
            w.nak = algo.nak;
            w.sent_ns = now;
            w.repair_ns = 0;
            w.p2p_todo = tree_children(0, collectors);
            w.p2p_unacked = 0;
            self.rbcast_multicast(hal, now, port, slot, e as usize);
            self.rbcast_copies(now, slot, e as usize);
        }
        // NAK schemes announce the sequence after a quiet while.
        let wait = if algo.nak { self.cfg.rbcast_nak_retry_ns } else { self.cfg.rbcast_rto_ns };
        self.rbcast_arm(now + wait, slot);
        let mut c = Completion::of(&ld, Opcode::Rbcast, Status::Success);
        c.byte_len = len as u32;
        self.complete(hal, port, c);
    }

    /// Multicasts window entry `e`, with an owed ACK piggybacked.
    fn rbcast_multicast<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, slot: u32, e: usize) {
        let g = self.groups.get(slot).expect("live group");
        let (id, epoch) = (g.id, g.epoch);
        let (node, gen, src) = (self.node, self.ports[port as usize].gen, self.ports[port as usize].addr);
        let rb = self.rb(slot);
        let w = &rb.window[e];
        let mut body = rb.data_header(e, id, epoch, 0);
        // Piggybacking (§4.4): the oldest owed ACK rides along.
        let owed = (0..rb.n as usize).filter(|&r| rb.ack_owed_since[r] != 0).min_by_key(|&r| rb.ack_owed_since[r]);
        if let Some(r) = owed {
            body.flags |= rbcast_flag::PIGGY_ACK;
            body.ack_root = r as u16;
            body.ack_next = rb.expected[r];
            rb.ack_sent[r] = rb.expected[r];
            rb.ack_owed_since[r] = 0;
            rb.stats.acks_piggybacked += 1;
        }
        rb.credit_owed_since = 0;
        rb.multicast_ns = now;
        // To every member's port: receivers look the group up by id.
        let hdr = rbcast_frame_header(node, src, gen, rb.addr, 0, w.len);
        let mut buf = core::mem::take(&mut self.rbcast_frame);
        let rb = self.rbcast[slot as usize].as_ref().expect("live");
        let w = &rb.window[e];
        let n = emit_rbcast(&hdr, &body, &w.data[..w.len as usize], &mut buf).expect("fits the MTU");
        let r = self.mcast_transmit(hal, &buf[..n]);
        debug_assert!(r.is_ok(), "our own frame to a multicast address: {r:?}");
        // The wire does not bring it back to this NIC: its other ports
        // in the group get their copies here.
        let data = &buf[FrameHeader::SIZE + RbcastHeader::SIZE..n];
        self.rbcast_on_mcast(hal, now, &hdr, &body, data);
        self.rbcast_frame = buf;
    }

    /// Sends window entries reliably to the co-roots still owed them, each
    /// root's in sequence order, and a co-root only what it holds in order
    /// (everything before it arrived): a child co-root then never has to
    /// refuse a copy for running ahead, which would hold the reliable
    /// stream — and the earlier copy queued behind it — from its parent.
    fn rbcast_forward(&mut self, now: u64, slot: u32) {
        loop {
            let rb = self.rb(slot);
            let mut pick: Option<usize> = None;
            for (e, w) in rb.window.iter().enumerate() {
                let ready =
                    w.live && w.p2p_todo != 0 && (w.root == rb.rank || seq_lt(w.seq, rb.expected[w.root as usize]));
                if ready && pick.is_none_or(|p| pick_better(&rb.window[p], w)) {
                    pick = Some(e);
                }
            }
            let Some(e) = pick else { return };
            let before = self.rb(slot).window[e].p2p_todo;
            self.rbcast_copies(now, slot, e);
            if self.rb(slot).window[e].p2p_todo == before {
                return; // The transmission table is full: at the next tick.
            }
        }
    }

    /// Sends entry `e` reliably to the co-roots still owed it (as far as
    /// the transmission table allows; the rest at the next tick).
    fn rbcast_copies(&mut self, now: u64, slot: u32, e: usize) {
        let rb = self.rb(slot);
        let w = &rb.window[e];
        let s = sub_size(rb.n, w.coroots);
        let (root, n) = (w.root, rb.n);
        let me = rb.rel(root) / s;
        let mut todo = w.p2p_todo;
        while todo != 0 {
            let i = todo.trailing_zeros();
            let to = emp_uapi::coll::abs_rank(tree_child(me, i) * s, root, n);
            if !self.rbcast_send_p2p(now, slot, e, to, i as u16) {
                break;
            }
            todo &= todo - 1;
            let rb = self.rb(slot);
            rb.window[e].p2p_todo = todo;
            rb.window[e].p2p_unacked |= 1 << i;
            rb.stats.coroot_copies += 1;
        }
    }

    /// Queues entry `e` as a reliable point-to-point message to rank `to`,
    /// the copy for the co-root tree child with exponent `coroot`, which
    /// the entry waits for ([`Nic::rbcast_p2p_done`]). False: no
    /// transmission record or peer (retried when a record frees:
    /// [`Nic::rbcast_unstall`]).
    fn rbcast_send_p2p(&mut self, now: u64, slot: u32, e: usize, to: u16, coroot: u16) -> bool {
        if self.send.tx.is_full() {
            self.rbcast_stalled = true;
            return false;
        }
        let g = self.groups.get(slot).expect("live group");
        let (port, id, epoch) = (g.port, g.id, g.epoch);
        let (node, rport) = g.endpoint(to);
        let Some(peer) = self.peer_for(now, port, node, rport, 0) else {
            self.rbcast_stalled = true;
            return false;
        };
        let rb = self.rb(slot);
        let w = &rb.window[e];
        let body = rb.data_header(e, id, epoch, rbcast_flag::P2P);
        // The reliable path keeps its own copy: the window entry may be
        // reused before the member's NIC acknowledges it (§5.3).
        let mut payload = vec![0u8; RbcastHeader::SIZE + w.len as usize];
        body.put(&mut payload);
        payload[RbcastHeader::SIZE..].copy_from_slice(&w.data[..w.len as usize]);
        // The receiver ignores `instance`; here it names the entry and the
        // co-root the copy's completion is for.
        let instance = (coroot as u32) << 16 | e as u32;
        let ch = CollHeader {
            group_id: id,
            epoch,
            instance,
            kind: CollKind::Rbcast as u8,
            root: w.root,
            sender: rb.rank,
            ..Default::default()
        };
        let stamp = rb.stamp;
        let wd = WorkDesc { opcode: Opcode::Send as u8, node, port: rport, ..Default::default() };
        let mut desc = LocalDesc::new(&wd);
        desc.len = (CollHeader::SIZE + payload.len()) as u64;
        let ctx =
            CollTx { hdr: Some(ch), data: CollData::Nic(payload), op: RBCAST_OP, op_stamp: stamp, limit: u32::MAX };
        self.enqueue_tx_coll(now, port, peer, desc, ctx);
        true
    }

    /// A reliable copy finished (acknowledged by its NIC, or failed): a
    /// co-root copy releases its hold on the window entry.
    pub(crate) fn rbcast_p2p_done(&mut self, c: &CollTx) {
        let Some(h) = c.hdr else { return };
        let (i, e) = (h.instance >> 16, (h.instance & 0xFFFF) as usize);
        let Some(slot) = self.rbcast.iter().position(|r| r.as_ref().is_some_and(|r| r.stamp == c.op_stamp)) else {
            return; // The group went.
        };
        let rb = self.rb(slot as u32);
        if let Some(w) = rb.window.get_mut(e).filter(|w| w.live) {
            w.p2p_unacked &= !(1u64 << (i & 63));
        }
    }

    /// Sends window entry `e` to group rank `to` as a repair: a unicast
    /// `RBCAST` frame (`REPAIR`), off the reliable point-to-point stream,
    /// which is ordered per pair of endpoints: a repair queued there could
    /// wait behind the root's next collective message, which the member
    /// refuses while it still waits for this one (a deadlock). Unreliable:
    /// the collector repeats it until the member's ACK (the scan), or at
    /// once on the member's NAK.
    fn rbcast_send_repair<H: Hal>(&mut self, hal: &mut H, slot: u32, e: usize, to: u16) {
        let g = self.groups.get(slot).expect("live group");
        let (id, epoch, port) = (g.id, g.epoch, g.port);
        let (node, rport) = g.endpoint(to);
        let hdr = {
            let w = &self.rbcast[slot as usize].as_ref().expect("live").window[e];
            let st = &self.ports[port as usize];
            rbcast_frame_header(self.node, st.addr, st.gen, node, rport, w.len)
        };
        let mut buf = core::mem::take(&mut self.rbcast_frame);
        let rb = self.rbcast[slot as usize].as_ref().expect("live");
        let w = &rb.window[e];
        let body = rb.data_header(e, id, epoch, rbcast_flag::REPAIR);
        let n = emit_rbcast(&hdr, &body, &w.data[..w.len as usize], &mut buf).expect("fits the MTU");
        hal.mac_transmit(node, &buf[..n]);
        self.rbcast_frame = buf;
    }

    /// A transmission record freed: co-root copies that waited for one go
    /// first, before anything the host posts next, so a co-root's copy is
    /// never queued behind the root's next collective message to it
    /// (which the co-root would refuse while it waits for the copy).
    pub(crate) fn rbcast_unstall(&mut self, now: u64) {
        if !core::mem::take(&mut self.rbcast_stalled) {
            return;
        }
        for slot in 0..self.rbcast.len() as u32 {
            if self.rbcast[slot as usize].as_ref().is_some_and(|rb| rb.window.iter().any(|w| w.live && w.p2p_todo != 0))
            {
                self.rbcast_forward(now, slot);
            }
        }
    }

    /// The collector's scan (§5.5, §5.3): ACK words clear sub-group bits,
    /// entries nothing keeps are freed, and members still missing an
    /// entry older than the timeout (all of them with `force`: the window
    /// ran out) are sent a repair, one by one, as far as the repair tokens
    /// allow ([`state::RbGroup::repair_token`]; the rest at a tick soon
    /// after).
    fn rbcast_scan<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32, force: bool) {
        let rto = self.cfg.rbcast_rto_ns;
        let repair_as_coroot = self.cfg.rbcast_coroot_repair;
        let entries = self.rb(slot).window.len();
        let overdue = self.rb(slot).ack_clock.deadline(rto);
        self.rbcast_forward(now, slot);
        for e in 0..entries {
            if !self.rb(slot).window[e].live {
                continue;
            }
            if self.rb(slot).settle(e) {
                continue;
            }
            let rb = self.rb(slot);
            let w = &rb.window[e];
            // A full window repairs before the timeout (§5.1), but only
            // entries whose ACKs are overdue by what they took so far
            // ([`state::AckClock`]), and each at most once per timeout:
            // repairs already queued are not queued again.
            let early = force && w.repair_ns == 0 && now.saturating_sub(w.sent_ns) >= overdue;
            let resumed = w.repair_next != 0;
            let due = resumed || early || now >= w.sent_ns.max(w.repair_ns).saturating_add(rto);
            // Fault injection: a co-root that never repairs its sub-group.
            let allowed = w.root == rb.rank || repair_as_coroot;
            if !due || !allowed || w.pending.is_empty() {
                continue;
            }
            let root = w.root;
            let c = rb.rel(root);
            let mut next = w.pending.next_from(w.repair_next);
            while let Some(b) = next {
                if !self.rb(slot).repair_token(now, rto) {
                    break;
                }
                let member = emp_uapi::coll::abs_rank(c + 1 + b as u16, root, self.rb(slot).n);
                self.rbcast_send_repair(hal, slot, e, member);
                let rb = self.rb(slot);
                rb.stats.repairs += 1;
                next = rb.window[e].pending.next_from(b + 1);
            }
            let w = &mut self.rb(slot).window[e];
            match next {
                Some(b) => {
                    // Out of tokens: the rest when ACKs return some.
                    w.repair_next = b;
                    self.rbcast_arm(now + RBCAST_REPAIR_PACE_NS, slot);
                    return;
                }
                None => {
                    // Held until the members' ACKs say it arrived.
                    w.repair_next = 0;
                    w.repair_ns = now;
                }
            }
        }
    }

    /// Arms group `slot`'s timer for `at` unless it fires earlier already.
    fn rbcast_arm(&mut self, at: u64, slot: u32) {
        let rb = self.rb(slot);
        if rb.timer_at != 0 && rb.timer_at <= at {
            return;
        }
        rb.timer_stamp = rb.timer_stamp.wrapping_add(1);
        rb.timer_at = at;
        let stamp = rb.timer_stamp;
        self.arm_timer(at, timer::Timer::Rbcast { group: slot, stamp });
    }

    /// Is the timer entry still wanted?
    pub(crate) fn rbcast_timer_live(&self, group: u32, stamp: u32) -> bool {
        self.rbcast
            .get(group as usize)
            .and_then(|r| r.as_ref())
            .is_some_and(|r| r.timer_stamp == stamp && r.timer_at != 0)
    }

    /// The group timer: the collector's scan, owed ACKs and credits, re-armed
    /// while anything is outstanding.
    pub(crate) fn rbcast_tick<H: Hal>(&mut self, hal: &mut H, now: u64, group: u32, stamp: u32) {
        if !self.rbcast_timer_live(group, stamp) {
            return;
        }
        self.rb(group).timer_at = 0;
        self.rbcast_scan(hal, now, group, false);
        let delay = self.cfg.rbcast_ack_delay_ns;
        let n = self.rb(group).n;
        let mut next = u64::MAX;
        for r in 0..n {
            let since = self.rb(group).ack_owed_since[r as usize];
            if since == 0 {
                continue;
            }
            if now >= since.saturating_add(delay) {
                self.rbcast_send_ack(hal, group, r);
            } else {
                next = next.min(since + delay);
            }
        }
        let since = self.rb(group).credit_owed_since;
        if since != 0 {
            if now >= since.saturating_add(delay) {
                // Re-posted buffers the collectors have not heard of: an
                // ACK carries the count to each root's collector.
                let rb = self.rb(group);
                let roots: Vec<u16> = (0..n).filter(|&r| r != rb.rank && rb.expected[r as usize] != 0).collect();
                for r in roots {
                    self.rbcast_send_ack(hal, group, r);
                }
                self.rb(group).credit_owed_since = 0;
            } else {
                next = next.min(since + delay);
            }
        }
        let rto = self.cfg.rbcast_rto_ns;
        let rb = self.rb(group);
        if !rb.starved.is_empty() {
            if now >= rb.polled_ns.saturating_add(rto) {
                rb.polled_ns = now;
                while let Some(m) = self.rb(group).starved.next_from(0) {
                    self.rb(group).starved.clear(m);
                    self.rbcast_send_control(hal, group, m as u16, rbcast_kind::POLL, 0, 0);
                    self.rb(group).stats.polls += 1;
                }
            } else {
                next = next.min(rb.polled_ns + rto);
            }
        }
        next = next.min(self.rbcast_announce(hal, now, group));
        next = next.min(self.rbcast_coroot_announce(hal, now, group));
        // Gaps still open are NAKed again (rate-limited per root).
        for r in 0..n {
            let rb = self.rb(group);
            if rb.algo[r as usize].nak && seq_lt(rb.expected[r as usize], rb.heard[r as usize]) {
                self.rbcast_nak_gap(hal, now, group, r);
            }
        }
        let rb = self.rb(group);
        if rb.window.iter().any(|w| w.live) {
            next = next.min(now + rto);
        }
        if next != u64::MAX {
            self.rbcast_arm(next, group);
        }
    }

    /// An explicit cumulative ACK for `root`'s messages to this node's collector.
    fn rbcast_send_ack<H: Hal>(&mut self, hal: &mut H, slot: u32, root: u16) {
        let rb = self.rb(slot);
        let collector = rb.collector(root);
        if collector == rb.rank {
            // Co-roots are reached reliably: they owe nobody an ACK.
            rb.ack_owed_since[root as usize] = 0;
            return;
        }
        let seq = rb.expected[root as usize];
        self.rbcast_send_control(hal, slot, collector, rbcast_kind::ACK, root, 0);
        let rb = self.rb(slot);
        rb.ack_sent[root as usize] = seq;
        rb.ack_owed_since[root as usize] = 0;
        rb.stats.acks_sent += 1;
    }

    /// An ACK (for `root`'s messages, with this node's re-post count), a
    /// NAK of the `span` messages of `root` from the first missing one, or
    /// a POLL, to group rank `to`.
    fn rbcast_send_control<H: Hal>(&mut self, hal: &mut H, slot: u32, to: u16, kind: u8, root: u16, span: u16) {
        let g = self.groups.get(slot).expect("live group");
        let (id, epoch, port) = (g.id, g.epoch, g.port);
        let (node, rport) = g.endpoint(to);
        let rb = self.rbcast[slot as usize].as_ref().expect("live");
        let body = RbcastHeader {
            group_id: id,
            epoch,
            seq: if kind == rbcast_kind::POLL { 0 } else { rb.expected[root as usize] },
            reposted: rb.reposted,
            span,
            kind,
            root,
            sender: rb.rank,
            ..Default::default()
        };
        let st = &self.ports[port as usize];
        let hdr = rbcast_frame_header(self.node, st.addr, st.gen, node, rport, 0);
        let mut b = [0u8; FrameHeader::SIZE + RbcastHeader::SIZE];
        emit_rbcast(&hdr, &body, &[], &mut b).expect("fits");
        hal.mac_transmit(node, &b);
    }

    /// An RBCAST frame to this node: an ACK, NAK or POLL, or a repair
    /// (DATA comes multicast, or as a co-root copy over the reliable path).
    pub(crate) fn rbcast_on_frame<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        hdr: &FrameHeader,
        body: &RbcastHeader,
        data: &[u8],
    ) {
        let Some(slot) = self.rbcast_group_of(hdr.dst_port, hdr, body) else { return };
        match body.kind {
            // C1: a suspended port takes nothing new; repaired again later.
            rbcast_kind::DATA
                if body.flags & rbcast_flag::REPAIR != 0 && !self.ports[hdr.dst_port as usize].suspended =>
            {
                let _ = self.rbcast_take(hal, now, hdr.dst_port, hdr, body, data);
            }
            // A NAK's `seq` is its first missing message: also an ACK.
            rbcast_kind::ACK | rbcast_kind::NAK => {
                let rb = self.rb(slot);
                rb.repair_returned();
                rb.ack_word(body.root, body.sender, body.seq, now);
                rb.reposted_word(body.sender, body.reposted);
                if body.kind == rbcast_kind::NAK {
                    self.rbcast_nak_repair(hal, now, slot, body.root, body.sender, body.seq, body.span);
                }
            }
            rbcast_kind::ANNOUNCE => self.rbcast_on_announce(hal, now, hdr.dst_port, hdr, body),
            // A root at zero credit: our count, to it directly.
            rbcast_kind::POLL => {
                let poller = body.sender;
                self.rbcast_send_control(hal, slot, poller, rbcast_kind::ACK, poller, 0);
            }
            _ => {}
        }
    }

    /// An RBCAST frame to a multicast address, from the wire or from one of
    /// this NIC's own ports: a copy for each local port that joined the
    /// address and has the group (the frame names no port).
    pub(crate) fn rbcast_on_mcast<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        hdr: &FrameHeader,
        body: &RbcastHeader,
        data: &[u8],
    ) {
        if (body.kind != rbcast_kind::DATA && body.kind != rbcast_kind::ANNOUNCE)
            || body.flags & rbcast_flag::REPAIR != 0
        {
            return self.mcast_kept(false);
        }
        let mut kept = false;
        for p in 0..self.ports.len() as u16 {
            let ours = self.ports[p as usize].open
                && self.mcast_joined(p, hdr.dst_node)
                && self.groups.by_id.contains_key(&(p, body.group_id));
            if !ours {
                continue;
            }
            kept = true;
            if body.kind == rbcast_kind::DATA {
                let _ = self.rbcast_take(hal, now, p, hdr, body, data);
            } else {
                self.rbcast_on_announce(hal, now, p, hdr, body);
            }
        }
        if hdr.src_node != self.node {
            self.mcast_kept(kept);
        }
    }

    /// A reliable copy (`COLL_DATA` of kind `Rbcast`) whose first and only
    /// frame is `payload` (after the `CollHeader`).
    pub(crate) fn rbcast_accept_p2p<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        payload: &[u8],
    ) -> CollAccept {
        let rest = &payload[CollHeader::SIZE..];
        let body = match RbcastHeader::parse(rest) {
            Ok(b) if b.kind == rbcast_kind::DATA && b.flags & rbcast_flag::P2P != 0 => b,
            _ => return CollAccept::Refuse(NackReason::CollMismatch),
        };
        if hdr.frame_count != 1 || msg.total_len != payload.len() as u64 {
            return CollAccept::Refuse(NackReason::TooLarge);
        }
        match self.rbcast_take(hal, now, hdr.dst_port, hdr, &body, &rest[RbcastHeader::SIZE..]) {
            Taken::Yes => CollAccept::Consumed,
            // Retried after the sender's backoff, or at once (`coll_kick`)
            // when a slot frees.
            Taken::NoRoom => {
                self.count(emp_uapi::sram::counter::COLL_REFUSED, 1);
                CollAccept::Refuse(NackReason::NoMatch)
            }
            Taken::Invalid => CollAccept::Refuse(NackReason::CollMismatch),
        }
    }

    /// The group slot of `port` a frame names, if it agrees with it.
    fn rbcast_group_of(&self, port: u16, hdr: &FrameHeader, body: &RbcastHeader) -> Option<u32> {
        let &slot = self.groups.by_id.get(&(port, body.group_id))?;
        let g = self.groups.get(slot)?;
        let rb = self.rbcast.get(slot as usize)?.as_ref()?;
        let agree = g.epoch == body.epoch
            && body.root < g.n
            && body.ack_root < g.n
            && g.rank_of(hdr.src_node, hdr.src_port) == Some(body.sender);
        (agree && body.sender != rb.rank).then_some(slot)
    }

    /// A copy of a broadcast message (multicast or reliable).
    fn rbcast_take<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        port: u16,
        hdr: &FrameHeader,
        body: &RbcastHeader,
        data: &[u8],
    ) -> Taken {
        let Some(slot) = self.rbcast_group_of(port, hdr, body) else { return Taken::Invalid };
        let (root, seq) = (body.root, body.seq);
        let rb = self.rb(slot);
        if body.flags & rbcast_flag::PIGGY_ACK != 0 {
            rb.ack_word(body.ack_root, body.sender, body.ack_next, now);
        }
        rb.reposted_word(body.sender, body.reposted);
        if root == rb.rank || body.coroots >= rb.n || data.len() > rb.slots[0].data.len() {
            return Taken::Invalid;
        }
        match rb.classify(root, seq) {
            Arrival::Implausible => return Taken::Invalid,
            Arrival::Duplicate => {
                rb.stats.duplicates += 1;
                // Our ACK may have been lost: owe it again.
                if rb.ack_owed_since[root as usize] == 0 {
                    rb.ack_owed_since[root as usize] = now.max(1);
                }
                let at = rb.ack_owed_since[root as usize] + self.cfg.rbcast_ack_delay_ns;
                self.rbcast_arm(at, slot);
                return Taken::Yes;
            }
            Arrival::New => {}
        }
        rb.algo[root as usize] = RootAlgo::of(body);
        // A co-root takes the message into its window for its sub-group
        // (§4.3), if it has an entry and credit for its sub-group.
        let coroot = rb.is_collector(root, body.coroots);
        let mut entry = None;
        if coroot {
            if rb.free_entry().is_none() {
                rb.stats.window_full += 1;
                self.rbcast_scan(hal, now, slot, true);
            }
            let rb = self.rb(slot);
            // Credits throttle only what runs ahead: the next message in
            // order is what a stuck member needs from its co-root.
            let in_order = seq == rb.expected[root as usize];
            let starved = !in_order && rb.sub_group(root, body.coroots).any(|m| rb.credit(m) <= 0);
            // The last free entry is kept for the next message in order: a
            // window full of later messages would wait for sub-group ACKs
            // that wait for the missing earlier one, which the root holds
            // until this co-root takes it (a 3-way deadlock).
            let free = rb.window.iter().filter(|w| !w.live).count();
            let room = free > usize::from(!in_order);
            match rb.free_entry() {
                Some(e) if !starved && room => entry = Some(e),
                _ => {
                    rb.stats.no_room += 1;
                    return Taken::NoRoom;
                }
            }
        }
        let rb = self.rb(slot);
        let direct = rb.wanted() == Some((root, seq));
        let free_slot = match rb.slots.iter().position(|s| !s.live) {
            None if !direct => rb.evict_for(root, seq),
            free => free,
        };
        if !direct && free_slot.is_none() {
            rb.stats.no_room += 1;
            // A multicast copy or a repair is dropped (not acknowledged,
            // so the collector repairs it again); a co-root copy refused.
            return Taken::NoRoom;
        }
        // Taken: it consumed a buffer at every member (§5.4).
        rb.consumed = rb.consumed.wrapping_add(1);
        if let Some(e) = entry {
            let n = rb.n;
            let me = rb.rel(root) / sub_size(n, body.coroots);
            let collectors = n.div_ceil(sub_size(n, body.coroots));
            let occupied = rb.occupy(e, root, seq, body.coroots);
            debug_assert!(occupied, "an ACK row per window entry");
            let w = &mut rb.window[e];
            w.len = data.len() as u16;
            w.frag = Frag::of(body);
            w.ack_every = body.ack_every.max(1);
            w.nak = body.flags & rbcast_flag::NAK != 0;
            w.sent_ns = now;
            w.repair_ns = 0;
            w.p2p_todo = tree_children(me, collectors);
            w.p2p_unacked = 0;
            w.data[..data.len()].copy_from_slice(data);
            self.rbcast_arm(now + self.cfg.rbcast_rto_ns, slot);
        }
        let rb = self.rb(slot);
        if direct {
            rb.delivered[root as usize] = seq.wrapping_add(1);
            self.rbcast_hand_over(hal, now, port, slot, Frag::of(body), data);
        } else {
            let rb = self.rb(slot);
            if seq != rb.expected[root as usize] {
                rb.stats.queued_out_of_order += 1;
            }
            let s = &mut rb.slots[free_slot.expect("checked")];
            s.live = true;
            s.root = root;
            s.seq = seq;
            s.len = data.len() as u16;
            s.frag = Frag::of(body);
            s.data[..data.len()].copy_from_slice(data);
        }
        let rb = self.rb(slot);
        let old = rb.advance_expected(root);
        let new = rb.expected[root as usize];
        rb.hear(root, seq.wrapping_add(1));
        if coroot {
            // Taken in order, it (and what waited for it) goes on down the tree.
            self.rbcast_forward(now, slot);
        }
        let rb = self.rb(slot);
        if rb.ack_turn(root, old, new, now) {
            self.rbcast_send_ack(hal, slot, root);
        } else if self.rb(slot).ack_owed_since[root as usize] != 0 {
            let at = self.rb(slot).ack_owed_since[root as usize] + self.cfg.rbcast_ack_delay_ns;
            self.rbcast_arm(at, slot);
        }
        self.rbcast_nak_gap(hal, now, slot, root);
        self.rbcast_deliver(hal, now, port, slot);
        Taken::Yes
    }

    /// A root's announcement (NAK schemes): its messages below `seq` were
    /// sent; any of them this node lacks is a gap to NAK.
    fn rbcast_on_announce<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, hdr: &FrameHeader, body: &RbcastHeader) {
        let Some(slot) = self.rbcast_group_of(port, hdr, body) else { return };
        let rb = self.rb(slot);
        // A root announces its own sequence (multicast); a co-root, how
        // far it holds its root's, to the members it collects for.
        let s = sub_size(rb.n, body.coroots);
        let collector = emp_uapi::coll::abs_rank(state::collector_of(rb.rel(body.root), s), body.root, rb.n);
        if (body.root != body.sender && collector != body.sender) || body.root == rb.rank || collector == rb.rank {
            return;
        }
        if rb.classify(body.root, body.seq.wrapping_sub(1)) == Arrival::Implausible {
            return;
        }
        rb.algo[body.root as usize] = RootAlgo::of(body);
        rb.hear(body.root, body.seq);
        rb.reposted_word(body.sender, body.reposted);
        self.rbcast_nak_gap(hal, now, slot, body.root);
    }

    /// NAK schemes: NAKs the first gap in `root`'s sequence to its
    /// collector — at once when the gap is new, again after
    /// `rbcast_nak_retry_ns` while it stays open (the timer comes back).
    fn rbcast_nak_gap<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32, root: u16) {
        let retry = self.cfg.rbcast_nak_retry_ns;
        let rb = self.rb(slot);
        let r = root as usize;
        if !rb.algo[r].nak || rb.collector(root) == rb.rank {
            // Co-roots are sent every message reliably: no NAKs.
            return;
        }
        let Some((from, to)) = rb.first_gap(root) else { return };
        let fresh = seq_lt(rb.nak_to[r], to);
        if !fresh && now < rb.nak_ns[r].saturating_add(retry) {
            let at = rb.nak_ns[r] + retry;
            return self.rbcast_arm(at, slot);
        }
        let span = to.wrapping_sub(from).min(u16::MAX as u32) as u16;
        rb.nak_to[r] = to;
        rb.nak_ns[r] = now.max(1);
        rb.stats.naks_sent += 1;
        let collector = rb.collector(root);
        self.rbcast_send_control(hal, slot, collector, rbcast_kind::NAK, root, span);
        self.rbcast_arm(now + retry, slot);
    }

    /// A NAK from `member` for `root`'s messages `[from, from + span)`:
    /// each one this node collects for and the member has not
    /// acknowledged is repaired now, without waiting for the timeout. The
    /// member NAKs again if a repair is lost or dropped.
    #[allow(clippy::too_many_arguments)]
    fn rbcast_nak_repair<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        slot: u32,
        root: u16,
        member: u16,
        from: u32,
        span: u16,
    ) {
        let repair_as_coroot = self.cfg.rbcast_coroot_repair;
        let rto = self.cfg.rbcast_rto_ns;
        let to = from.wrapping_add(span as u32);
        for e in 0..self.rb(slot).window.len() {
            let rb = self.rb(slot);
            let w = &rb.window[e];
            if !w.live || w.root != root || seq_lt(w.seq, from) || !seq_lt(w.seq, to) {
                continue;
            }
            if !(w.root == rb.rank || repair_as_coroot) {
                continue;
            }
            // The member's bit in this node's sub-group, if it is in it.
            let c = rb.rel(root);
            let m = emp_uapi::coll::rel_rank(member, root, rb.n);
            let s = sub_size(rb.n, w.coroots);
            if m <= c || m >= c + s {
                continue;
            }
            let b = (m - c - 1) as usize;
            if rb.settle(e) || !rb.window[e].pending.contains(b) {
                continue;
            }
            if !rb.repair_token(now, rto) {
                return; // The member NAKs again.
            }
            self.rbcast_send_repair(hal, slot, e, member);
            let rb = self.rb(slot);
            rb.stats.repairs += 1;
            rb.stats.nak_repairs += 1;
        }
    }

    /// NAK schemes: a root whose own messages still wait for ACKs, and
    /// that multicast nothing for `rbcast_nak_retry_ns`, announces its
    /// sequence, so that a member that lost the last of them NAKs. Returns
    /// when to look again (`u64::MAX`: nothing waits).
    fn rbcast_announce<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32) -> u64 {
        let retry = self.cfg.rbcast_nak_retry_ns;
        let rb = self.rb(slot);
        let me = rb.rank;
        let Some(e) = rb.window.iter().position(|w| w.live && w.root == me && w.nak && !w.pending.is_empty()) else {
            return u64::MAX;
        };
        if now < rb.multicast_ns.saturating_add(retry) {
            return rb.multicast_ns + retry;
        }
        let g = self.groups.get(slot).expect("live group");
        let (id, epoch, port) = (g.id, g.epoch, g.port);
        let rb = self.rb(slot);
        let body = rb.announce_header(e, id, epoch, rb.next_seq);
        rb.multicast_ns = now;
        rb.stats.announces += 1;
        let addr = rb.addr;
        let st = &self.ports[port as usize];
        let hdr = rbcast_frame_header(self.node, st.addr, st.gen, addr, 0, 0);
        let mut b = [0u8; FrameHeader::SIZE + RbcastHeader::SIZE];
        emit_rbcast(&hdr, &body, &[], &mut b).expect("fits");
        let r = self.mcast_transmit(hal, &b);
        debug_assert!(r.is_ok(), "our own frame to a multicast address: {r:?}");
        // This NIC's other ports in the group hear it here.
        self.rbcast_on_mcast(hal, now, &hdr, &body, &[]);
        now + retry
    }

    /// NAK schemes, at a co-root: the root stops announcing once its own
    /// sub-group and the co-roots have its messages, so a member of a
    /// co-root's sub-group that lost the last of them would see no gap
    /// and wait for the timeout. A co-root collecting entries of a root
    /// some member still lacks, that took none of that root's messages
    /// for `rbcast_nak_retry_ns`, tells each such member (unicast, at most
    /// [`RBCAST_ANNOUNCE_BURST`] a round, a round per retry interval) how
    /// far it holds the root's sequence. Returns when to look again.
    fn rbcast_coroot_announce<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u32) -> u64 {
        let retry = self.cfg.rbcast_nak_retry_ns;
        let rb = self.rb(slot);
        let me = rb.rank;
        let waiting = |w: &state::Entry| w.live && w.root != me && w.nak && !w.pending.is_empty();
        if !rb.window.iter().any(waiting) {
            return u64::MAX;
        }
        if now < rb.coroot_announced_ns.saturating_add(retry) {
            return rb.coroot_announced_ns + retry;
        }
        let g = self.groups.get(slot).expect("live group");
        let (id, epoch, port) = (g.id, g.epoch, g.port);
        let (gen, src) = (self.ports[port as usize].gen, self.ports[port as usize].addr);
        let mut next = u64::MAX;
        let mut budget = RBCAST_ANNOUNCE_BURST;
        for e in 0..self.rb(slot).window.len() {
            let rb = self.rb(slot);
            let w = &rb.window[e];
            // Each root once, at its first waiting entry.
            if !waiting(w) || rb.window[..e].iter().any(|o| waiting(o) && o.root == w.root) {
                continue;
            }
            let root = w.root;
            let newest = rb.window.iter().filter(|o| o.live && o.root == root).map(|o| o.sent_ns).max().unwrap_or(0);
            if now < newest.saturating_add(retry) {
                next = next.min(newest + retry);
                continue;
            }
            let body = rb.announce_header(e, id, epoch, rb.expected[root as usize]);
            let (c, n) = (rb.rel(root), rb.n);
            let mut b = [0u8; FrameHeader::SIZE + RbcastHeader::SIZE];
            let mut member = rb.lacking(root, 0);
            while let Some(m) = member.filter(|_| budget > 0) {
                let to = emp_uapi::coll::abs_rank(c + 1 + m as u16, root, n);
                let (node, rport) = self.groups.get(slot).expect("live group").endpoint(to);
                let hdr = rbcast_frame_header(self.node, src, gen, node, rport, 0);
                emit_rbcast(&hdr, &body, &[], &mut b).expect("fits");
                hal.mac_transmit(node, &b);
                budget -= 1;
                let rb = self.rb(slot);
                rb.stats.announces += 1;
                member = rb.lacking(root, m + 1);
            }
            self.rb(slot).coroot_announced_ns = now;
            next = next.min(now + retry);
        }
        next
    }

    /// Hands held messages to the host's receives, in root order.
    fn rbcast_deliver<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, slot: u32) {
        let mut freed = false;
        loop {
            let rb = self.rb(slot);
            let Some((root, seq)) = rb.wanted() else { break };
            let Some(s) = rb.slots.iter().position(|x| x.live && x.root == root && x.seq == seq) else { break };
            rb.delivered[root as usize] = seq.wrapping_add(1);
            rb.slots[s].live = false;
            let data = core::mem::take(&mut rb.slots[s].data);
            let (len, frag) = (rb.slots[s].len as usize, rb.slots[s].frag);
            self.rbcast_hand_over(hal, now, port, slot, frag, &data[..len]);
            self.rb(slot).slots[s].data = data;
            freed = true;
        }
        if freed {
            // Reliable copies refused for want of a slot may come now.
            self.coll_kick(hal, port);
        }
    }

    /// Writes the message (or fragment `frag` of it) the oldest posted
    /// receive wants into its buffer, after the fragments before it; the
    /// last fragment completes the receive. The buffer it held is
    /// re-posted (credits owed to the collectors).
    fn rbcast_hand_over<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, slot: u32, frag: Frag, data: &[u8]) {
        let rb = self.rb(slot);
        let Some(&(ld, _)) = rb.posted.front() else { return };
        if frag.frag == 0 {
            rb.front_off = 0;
            rb.front_err = None;
        }
        let off = rb.front_off;
        let room = (ld.len as usize).saturating_sub(off);
        let part = data.len().min(room);
        if part > 0 && rb.front_err.is_none() {
            let r = self.sge_io(hal, port, ld.sges(), off as u64, Buf::ToHost(&data[..part]), MR_LOCAL_WRITE);
            if let Err(st) = r {
                self.rb(slot).front_err = Some(st);
            }
        }
        let delay = self.cfg.rbcast_ack_delay_ns;
        let rb = self.rb(slot);
        rb.front_off = off + data.len();
        rb.reposted = rb.reposted.wrapping_add(1);
        if rb.credit_owed_since == 0 {
            rb.credit_owed_since = now.max(1);
        }
        let at = rb.credit_owed_since + delay;
        self.rbcast_arm(at, slot);
        if !frag.last() {
            return;
        }
        let rb = self.rb(slot);
        rb.posted.pop_front();
        rb.stats.delivered += 1;
        let total = rb.front_off;
        let status = match rb.front_err.take() {
            Some(st) => st,
            None if total > ld.len as usize => Status::Truncated,
            None => Status::Success,
        };
        rb.front_off = 0;
        let mut c = Completion::of(&ld, Opcode::Rbcast, status);
        c.byte_len = total.min(ld.len as usize) as u32;
        c.msg_len = total as u32;
        self.complete(hal, port, c);
    }

    /// Reliable-broadcast counts, summed over the groups.
    pub fn rbcast_stats(&self) -> RbcastStats {
        let mut t = RbcastStats::default();
        for rb in self.rbcast.iter().flatten() {
            let s = rb.stats;
            t.sent += s.sent;
            t.fragmented += s.fragmented;
            t.delivered += s.delivered;
            t.duplicates += s.duplicates;
            t.queued_out_of_order += s.queued_out_of_order;
            t.no_room += s.no_room;
            t.acks_sent += s.acks_sent;
            t.acks_piggybacked += s.acks_piggybacked;
            t.repairs += s.repairs;
            t.coroot_copies += s.coroot_copies;
            t.window_full += s.window_full;
            t.credit_stalls += s.credit_stalls;
            t.polls += s.polls;
            t.evicted += s.evicted;
            t.naks_sent += s.naks_sent;
            t.nak_repairs += s.nak_repairs;
            t.announces += s.announces;
        }
        t
    }

    /// (window entries, receive slots, posted receives) in use, all groups:
    /// all zero once every broadcast is delivered and acknowledged.
    pub fn rbcast_occupancy(&self) -> (usize, usize, usize) {
        let mut o = (0, 0, 0);
        for rb in self.rbcast.iter().flatten() {
            o.0 += rb.window_used().0;
            o.1 += rb.slots_used();
            o.2 += rb.posted.len();
        }
        o
    }

    /// For the tests' bound check (§5.4): this node's credit for group
    /// rank `member` in group slot `slot`, and the buffers each member has.
    pub fn rbcast_credit(&self, slot: u32, member: u16) -> Option<(i64, usize)> {
        let rb = self.rbcast.get(slot as usize)?.as_ref()?;
        (member < rb.n).then(|| (rb.credit(member), rb.slots.len()))
    }

    /// Messages delivered to the host per root (group slot `slot`).
    pub fn rbcast_delivered(&self, slot: u32) -> Option<Vec<u32>> {
        Some(self.rbcast.get(slot as usize)?.as_ref()?.delivered.clone())
    }

    /// Bounds hold (`Nic::invariants`).
    pub(crate) fn rbcast_invariants(&self) -> Result<(), String> {
        for (s, rb) in self.rbcast.iter().enumerate() {
            let Some(rb) = rb else { continue };
            if self.groups.get(s as u32).is_none() {
                return Err(format!("rbcast state for free group slot {s}"));
            }
            rb.check().map_err(|e| format!("rbcast group {s}: {e}"))?;
        }
        Ok(())
    }
}

/// The header of a one-frame RBCAST frame from (`node`, the port at wire
/// address `port` of generation `gen`: never its slot, which a port
/// restored elsewhere does not share with its address) to `dst_node` (a node, or the group's multicast
/// address) and `dst_port`, with `payload_len` data bytes.
fn rbcast_frame_header(node: u16, port: u16, gen: u16, dst_node: u16, dst_port: u16, payload_len: u16) -> FrameHeader {
    FrameHeader {
        version: WIRE_VERSION,
        kind: FrameKind::Rbcast as u8,
        src_node: node,
        dst_node,
        src_port: port,
        dst_port,
        src_gen: gen,
        payload_len,
        frame_count: 1,
        ..Default::default()
    }
}

/// Of two window entries ready to go to co-roots, is `w` to go before
/// `p`? The earlier of one root's messages first; any order across roots.
fn pick_better(p: &state::Entry, w: &state::Entry) -> bool {
    p.root == w.root && seq_lt(w.seq, p.seq)
}
