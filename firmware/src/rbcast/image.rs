//! A group's reliable-broadcast state in a port context image (PM's C6/C7,
//! `ctxsw.rs`). A state goes into an image only when nothing of it is in
//! flight ([`RbGroup::unsaveable`]); what it then carries is what outlives
//! the switch: its own next sequence number and its credit counts, per
//! root how far it has received and delivered, the ACK it last sent and
//! the scheme the root last asked for, the learned ACK wait, the receives
//! the host posted for broadcasts and the messages held for them. Times,
//! repair tokens, NAK bookkeeping and counters start afresh. The record is
//! untrusted on restore: [`get`] checks every field against the group it
//! names and the NIC's bounds, and the restored state must pass
//! [`RbGroup::check`].

use emp_uapi::coll::rbcast_algo;
use emp_uapi::desc::{Opcode, WorkDesc};
use emp_uapi::{seq_lt, Le};

use super::state::{AckClock, Frag, RbGroup, RootAlgo};
use crate::image::Reader;
use crate::LocalDesc;

/// Bytes of a record's fixed part: the group's index in the image,
/// members, two zero bytes, next sequence, buffers consumed and re-posted,
/// the learned ACK wait (3 × u64), posted and held counts.
pub(crate) const RB_IMAGE: usize = 2 + 2 + 2 + 3 * 4 + 3 * 8 + 2 + 2;
/// Bytes per member: re-posted count it reported, expected, delivered,
/// ACK sent (u32 each), and its scheme as root (co-roots u16, ACK every
/// u8, NAKs u8).
pub(crate) const RB_MEMBER_IMAGE: usize = 4 * 4 + 4;
/// Bytes of a posted receive besides its descriptor: its root, two zero bytes.
pub(crate) const RB_POSTED_IMAGE: usize = 4;
/// Bytes of a held message besides its data: root, length, sequence,
/// fragment, fragments, message length.
pub(crate) const RB_HELD_IMAGE: usize = 2 + 2 + 4 + 2 + 2 + 4;

/// A checked record, ready for [`RbGroup::install`].
pub(crate) struct RbImage {
    next_seq: u32,
    consumed: u32,
    reposted: u32,
    ack_clock: AckClock,
    /// Per member: re-posted seen, expected, delivered, ACK sent, scheme.
    members: Vec<(u32, u32, u32, u32, RootAlgo)>,
    pub(crate) posted: Vec<(LocalDesc, u16)>,
    held: Vec<(u16, u32, Frag, Vec<u8>)>,
}

/// Bytes `put` writes for a state of `n` members, `posted` receives and
/// `held` messages of `buf` bytes at most.
pub(crate) const fn size(n: usize, posted: usize, held: usize, buf: usize) -> usize {
    RB_IMAGE + n * RB_MEMBER_IMAGE + posted * (RB_POSTED_IMAGE + WorkDesc::SIZE) + held * (RB_HELD_IMAGE + buf)
}

/// Writes `rb`'s record (it must be saveable), for the image's group `index`.
pub(crate) fn put(rb: &RbGroup, index: u16, out: &mut Vec<u8>) {
    debug_assert!(rb.unsaveable().is_none());
    let held: Vec<_> = rb.slots.iter().filter(|s| s.live).collect();
    for v in [index, rb.n, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [rb.next_seq, rb.consumed, rb.reposted] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in rb.ack_clock.words() {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [rb.posted.len() as u16, held.len() as u16] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for m in 0..rb.n as usize {
        for v in [rb.reposted_seen[m], rb.expected[m], rb.delivered[m], rb.ack_sent[m]] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let a = rb.algo[m];
        out.extend_from_slice(&a.coroots.to_le_bytes());
        out.extend_from_slice(&[a.ack_every, a.nak as u8]);
    }
    for (ld, root) in &rb.posted {
        let mut b = [0u8; WorkDesc::SIZE];
        ld.wd.put(&mut b);
        out.extend_from_slice(&b);
        out.extend_from_slice(&root.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
    }
    for s in held {
        out.extend_from_slice(&s.root.to_le_bytes());
        out.extend_from_slice(&s.len.to_le_bytes());
        out.extend_from_slice(&s.seq.to_le_bytes());
        out.extend_from_slice(&s.frag.frag.to_le_bytes());
        out.extend_from_slice(&s.frag.frags.to_le_bytes());
        out.extend_from_slice(&s.frag.msg_len.to_le_bytes());
        out.extend_from_slice(&s.data[..s.len as usize]);
    }
}

/// The bounds a record must keep: the group's members and this node's
/// rank in it, its table slot (posted receives name it), and the NIC's
/// posted-receive queue, held slots and their size.
pub(crate) struct Limits {
    pub n: u16,
    pub rank: u16,
    pub table_slot: u32,
    pub posted_max: usize,
    pub slots: usize,
    pub buf: usize,
}

/// Reads one record's body (after its group index) and checks it. The
/// posted receives' memory is the caller's to check (the NIC's MR table).
pub(crate) fn get(r: &mut Reader, l: &Limits) -> Result<RbImage, &'static str> {
    let (n, reserved) = (r.u16()?, r.u16()?);
    if n != l.n || reserved != 0 {
        return Err("reliable-broadcast state of another group");
    }
    let (next_seq, consumed, reposted) = (r.u32()?, r.u32()?, r.u32()?);
    let ack_clock = AckClock::from_words([r.u64()?, r.u64()?, r.u64()?]).ok_or("reliable-broadcast ACK wait")?;
    let (n_posted, n_held) = (r.u16()? as usize, r.u16()? as usize);
    if n_posted > l.posted_max || n_held > l.slots {
        return Err("reliable-broadcast receives or held messages");
    }
    let mut members = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let (seen, expected, delivered, ack_sent) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let (coroots, ack_every, nak) = (r.u16()?, r.u8()?, r.u8()?);
        // Delivered ≤ expected, within what `classify` finds plausible.
        let span = expected.wrapping_sub(delivered);
        if span >= 1 << 20 {
            return Err("reliable-broadcast sequences");
        }
        if coroots >= n.max(1) || ack_every == 0 || nak > 1 {
            return Err("reliable-broadcast scheme");
        }
        members.push((seen, expected, delivered, ack_sent, RootAlgo { coroots, ack_every, nak: nak == 1 }));
    }
    let mut posted = Vec::with_capacity(n_posted);
    for _ in 0..n_posted {
        let d = r.desc()?;
        let (root, zero) = (r.u16()?, r.u16()?);
        let ok = d.validate() == Ok(Opcode::Rbcast)
            && d.node as u32 == l.table_slot
            && d.port == root
            && root < n
            && root != l.rank
            && rbcast_algo(d.tag).is_some()
            && zero == 0;
        if !ok {
            return Err("reliable-broadcast receive");
        }
        posted.push((LocalDesc::new(&d), root));
    }
    // Held messages: each root's run [delivered, expected), each once.
    let mut held: Vec<(u16, u32, Frag, Vec<u8>)> = Vec::with_capacity(n_held);
    for _ in 0..n_held {
        let (root, len, seq) = (r.u16()?, r.u16()? as usize, r.u32()?);
        let frag = Frag { frag: r.u16()?, frags: r.u16()?, msg_len: r.u32()? };
        if root >= n || len > l.buf || frag.frags == 0 || frag.frag >= frag.frags {
            return Err("reliable-broadcast held message");
        }
        let (_, expected, delivered, _, _) = members[root as usize];
        if seq_lt(seq, delivered) || !seq_lt(seq, expected) || held.iter().any(|h| (h.0, h.1) == (root, seq)) {
            return Err("reliable-broadcast held message's sequence");
        }
        held.push((root, seq, frag, r.take(len)?.to_vec()));
    }
    for (root, &(_, expected, delivered, _, _)) in members.iter().enumerate() {
        if held.iter().filter(|h| h.0 as usize == root).count() as u32 != expected.wrapping_sub(delivered) {
            return Err("reliable-broadcast messages held");
        }
    }
    Ok(RbImage { next_seq, consumed, reposted, ack_clock, members, posted, held })
}

impl RbGroup {
    /// Takes a checked record into this fresh state (same group, so the
    /// vectors have the record's length and the slots the NIC's room).
    pub(crate) fn install(&mut self, img: RbImage) {
        debug_assert!(self.pristine());
        self.next_seq = img.next_seq;
        self.consumed = img.consumed;
        self.reposted = img.reposted;
        self.ack_clock = img.ack_clock;
        for (m, (seen, expected, delivered, ack_sent, algo)) in img.members.into_iter().enumerate() {
            self.reposted_seen[m] = seen;
            self.expected[m] = expected;
            self.delivered[m] = delivered;
            // Nothing was missing when it was saved.
            self.heard[m] = expected;
            self.ack_sent[m] = ack_sent;
            self.algo[m] = algo;
        }
        self.posted.extend(img.posted);
        for ((root, seq, frag, data), s) in img.held.into_iter().zip(self.slots.iter_mut()) {
            s.live = true;
            s.root = root;
            s.seq = seq;
            s.len = data.len() as u16;
            s.frag = frag;
            s.data[..data.len()].copy_from_slice(&data);
        }
    }
}
