//! Broadcast (seed 001 ch. 6): down a tree from the root, each inner
//! member forwarding frames as they arrive, before its own post if need be
//! (application bypass, into a bounce slot).

use emp_uapi::coll::{abs_rank, rel_rank, CollHeader, CollKind};
use emp_uapi::desc::{Opcode, Status, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_uapi::wire::{self, FrameHeader, MsgHeader, NackReason};
use emp_uapi::Le;

use super::{CollData, CollState, FrameCache, FreshOp, Params, Target};
use crate::mr::Buf;
use crate::{Hal, LocalDesc, Nic};

/// A broadcast: the root sends to its children; every other member
/// receives from its parent and forwards to its children frame by frame
/// as the data arrives, posted or not (application bypass).
#[derive(Debug)]
pub(crate) struct Bcast {
    pub root: u16,
    pub tree: u8,
    pub len: u64,
    /// Where the data is: the posted buffer, or the bounce slot a
    /// broadcast received before its post lands in.
    pub data: LocalDesc,
    /// The bounce slot holding the data, when it arrived before the post.
    pub bounce: Option<u16>,
    /// The receive record while the data arrives.
    pub rx: Option<u32>,
    /// The data has been received in full.
    pub rx_done: bool,
    /// Messages to the children (transmission records), `fwd[i]` to the
    /// i-th; raised frame by frame as the data arrives.
    pub fwd: Vec<u32>,
    pub cache: FrameCache,
}

impl Bcast {
    pub(crate) fn new(root: u16, tree: u8, len: u64, data: LocalDesc, bounce: Option<u16>) -> Bcast {
        Bcast { root, tree, len, data, bounce, rx: None, rx_done: false, fwd: Vec::new(), cache: FrameCache::default() }
    }

    pub(crate) fn params(&self) -> Params {
        Params::Bcast { root: self.root, tree: self.tree, len: self.len }
    }
}

impl Nic {
    /// Frame 0 of a broadcast from our parent: receive it into the posted
    /// buffer, or (application bypass) into a bounce slot, and start
    /// forwarding to our children while the rest arrives.
    pub(super) fn accept_bcast<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        target: Target,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        ch: &CollHeader,
    ) -> Result<u32, NackReason> {
        let len = msg.total_len - CollHeader::SIZE as u64;
        self.check_bcast_arrival(target, hdr, msg, ch, len)?;
        let op = match target {
            // Posted: it lands in the posted buffer.
            Target::Existing { op, .. } => op,
            Target::Fresh(key) => self.bcast_bounce(key, ch, len)?,
        };
        let o = self.coll_ops.get(op).expect("live");
        let CollState::Bcast(b) = &o.state else { unreachable!("checked") };
        let (stamp, data) = (o.stamp, b.data);
        let port = hdr.dst_port;
        let peer = self.find_peer(port, hdr.src_node, hdr.src_port).expect("frame's peer exists");
        let owner = crate::rx::RxOwner::Bcast { op, stamp };
        let r = self.recv_cpu().rx_open(now, peer, hdr, msg, data, owner).expect("checked not full");
        self.bcast_mut(op).rx = Some(r);
        // Children are fed from where the data lands, frame by frame.
        self.coll_progress(hal, now, op);
        Ok(r)
    }

    /// A broadcast's first frame agrees with the group and with the op it
    /// is for, and can be received now.
    fn check_bcast_arrival(
        &self,
        target: Target,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        ch: &CollHeader,
        len: u64,
    ) -> Result<(), NackReason> {
        let (root, tree) = (ch.root, ch.tree);
        let g = self.groups.get(target.group()).expect("live group");
        let existing = match target {
            Target::Existing { op, .. } => Some(self.coll_ops.get(op).expect("live")),
            Target::Fresh(_) => None,
        };
        let same = existing.is_none_or(|o| o.state.params() == Params::Bcast { root, tree, len });
        if root >= g.n || tree as usize >= g.trees.len() || !same {
            return Err(NackReason::CollMismatch);
        }
        let rel = rel_rank(g.rank, root, g.n);
        // An early op of this kind is already receiving it.
        let again = existing.is_some_and(|o| o.desc.is_none());
        if rel == 0 || g.parent(tree, rel) != Some(rel_rank(ch.sender, root, g.n)) || again {
            return Err(NackReason::CollMismatch);
        }
        if self.recv.rx.is_full() || wire::frames_for(msg.total_len, self.mtu) != hdr.frame_count as u64 {
            return Err(NackReason::NoMatch);
        }
        Ok(())
    }

    /// Not posted: the broadcast lands in a bounce slot, if it fits one;
    /// records the op.
    fn bcast_bounce(&mut self, key: FreshOp, ch: &CollHeader, len: u64) -> Result<u32, NackReason> {
        let g = self.groups.slots[key.group as usize].as_mut().expect("live group");
        if len > g.bounce_slot_size as u64 {
            return Err(NackReason::NoMatch);
        }
        let Some(b) = g.bounce_free.pop() else { return Err(NackReason::NoMatch) };
        let (rkey, base, size) = (g.bounce_key, g.bounce_offset, g.bounce_slot_size as u64);
        let mut wd = WorkDesc { opcode: Opcode::Recv as u8, num_sge: 1, ..Default::default() };
        wd.sge[0] = emp_uapi::desc::Sge { key: rkey, len: len as u32, offset: base + b as u64 * size };
        let state = Bcast::new(ch.root, ch.tree, len, LocalDesc::new(&wd), Some(b));
        Ok(self.coll_ops.insert_checked(key.op(CollState::Bcast(state))))
    }

    fn bcast_mut(&mut self, op: u32) -> &mut Bcast {
        match &mut self.coll_ops.get_mut(op).state {
            CollState::Bcast(b) => b,
            _ => unreachable!("broadcast op"),
        }
    }

    /// Frame `f` of a broadcast arrived and is in host memory as `data`:
    /// keep it, so forwarding sends it to every child without reading it
    /// back from the host.
    pub(crate) fn bcast_frame_received(&mut self, op: u32, stamp: u32, f: u32, data: &[u8]) {
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return;
        }
        let pending = self.coll_cache_pending(op, f);
        self.coll_cache_insert(op, f, pending, data);
    }

    /// Frames `0..contig` of a broadcast are in host memory: forwarding may
    /// send them.
    pub(crate) fn bcast_frames_here(&mut self, op: u32, stamp: u32, contig: u32) {
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return;
        }
        // Only this op's own forwarding records (a finished one's slot may
        // hold another message by now).
        for t in self.coll_ops.get(op).expect("live").state.fwd().to_vec() {
            let Some(m) = self.send.tx.get(t) else { continue };
            let ours = m.coll.as_ref().is_some_and(|c| c.op == op && c.op_stamp == stamp);
            if ours && m.limit < contig {
                let peer = m.peer;
                self.send.tx.get_mut(t).limit = contig;
                self.send.mark_ready(peer);
            }
        }
    }

    /// A broadcast finished arriving (or failed).
    pub(crate) fn bcast_rx_done<H: Hal>(&mut self, hal: &mut H, now: u64, op: u32, stamp: u32, error: Option<Status>) {
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return;
        }
        let b = self.bcast_mut(op);
        b.rx_done = true;
        b.rx = None;
        if let Some(e) = error {
            self.coll_ops.get_mut(op).error.get_or_insert(e);
        }
        self.coll_progress(hal, now, op);
    }

    /// Root: send to each child. Others: forward to each child (limited to
    /// the frames present); when posted after a bounce, copy to the user's
    /// buffer once everything arrived.
    pub(super) fn progress_bcast<H: Hal>(&mut self, hal: &mut H, now: u64, op: u32) -> Result<(), Status> {
        let o = self.coll_ops.get(op).expect("live");
        let CollState::Bcast(b) = &o.state else { unreachable!("broadcast op") };
        let g = self.groups.get(o.group).expect("live group");
        let (root, tree, n, group) = (b.root, b.tree, g.n, o.group);
        let rel = rel_rank(g.rank, root, n);
        let contig = if rel == 0 {
            u32::MAX
        } else {
            // Frames already here (the receive record, or all of them).
            b.rx.and_then(|r| self.recv.rx.get(r)).map_or(if b.rx_done { u32::MAX } else { 0 }, |m| m.contig)
        };
        loop {
            let dest = self.coll_ops.get(op).expect("live").state.fwd().len() as u32;
            let g = self.groups.get(group).expect("live group");
            let Some(&c) = g.child_ranks(tree, rel).get(dest as usize) else { break };
            let h = self.coll_header(op, CollKind::Bcast, 0, root, tree);
            let data = CollData::Host { dest };
            let Some(t) = self.coll_send_limited(now, op, abs_rank(c, root, n), Some(h), data, contig)? else {
                return Ok(());
            };
            self.bcast_mut(op).fwd.push(t);
        }
        let o = self.coll_ops.get(op).expect("live");
        let CollState::Bcast(b) = &o.state else { unreachable!("broadcast op") };
        if rel != 0 && (!b.rx_done || o.desc.is_none()) {
            return Ok(());
        }
        if let (Some(_), false) = (b.bounce, o.local_done) {
            // Posted after the data arrived in a bounce slot: copy it over.
            let (ld, _) = o.desc.expect("posted");
            let from = b.data;
            let mut tmp = vec![0u8; from.len as usize];
            let port = o.port;
            self.sge_io(hal, port, from.sges(), 0, Buf::FromHost(&mut tmp), MR_LOCAL_READ)?;
            self.sge_io(hal, port, ld.sges(), 0, Buf::ToHost(&tmp), MR_LOCAL_WRITE)?;
        }
        self.coll_ops.get_mut(op).local_done = true;
        Ok(())
    }
}
