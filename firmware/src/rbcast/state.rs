//! The reliable broadcast's per-group state (seed 002), with no I/O: the
//! collector window (§4.2, §5.1), the ACK words (§5.5), the receiver's
//! sequence numbers and queue (§5.2), lazy ACKs (§4.4) and credits (§5.4).
//! Every table is sized when the group is loaded; nothing here allocates
//! afterwards. `mod.rs` drives it and does the I/O.

use emp_uapi::seq_lt;
use emp_uapi::wire::{rbcast_flag, rbcast_kind, RbcastHeader};

/// Size of the sub-groups of a broadcast over `n` members with `coroots`
/// co-roots: relative ranks `c, c + 1, .. c + s - 1` for each collector
/// `c` (a multiple of `s`; 0 is the root), so there are `ceil(n / s)`
/// collectors, at most `coroots + 1`.
pub(crate) fn sub_size(n: u16, coroots: u16) -> u16 {
    n.div_ceil(coroots.saturating_add(1)).max(1)
}

/// Repairs a collector may have out before ACKs or NAKs come back
/// ([`RbGroup::repair_token`]).
pub(crate) const REPAIR_TOKENS: u16 = 64;

/// The collector (relative rank) of relative rank `rel`.
pub(crate) fn collector_of(rel: u16, s: u16) -> u16 {
    rel / s * s
}

/// Children of collector index `j` (collector `j * s`) in the binomial
/// tree over the `count` collectors along which the root reliably sends
/// to the co-roots (§4.3 step 2): `j + 2^i` for every `2^i > j`, as a
/// mask of the exponents `i` (so 16 bits cover any group).
pub(crate) fn tree_children(j: u16, count: u16) -> u64 {
    let mut mask = 0u64;
    let mut i = 0u32;
    while i < 16 && (j as u32 + (1 << i)) < count as u32 {
        if 1 << i > j as u32 {
            mask |= 1 << i;
        }
        i += 1;
    }
    mask
}

/// The child of collector index `j` that exponent `i` of
/// [`tree_children`] names.
pub(crate) fn tree_child(j: u16, i: u32) -> u16 {
    j + (1 << i)
}

/// A set of small numbers (members of a sub-group, ranks), sized once for
/// the group so that no per-message work allocates.
#[derive(Debug, Clone)]
pub(crate) struct Bits(Box<[u64]>);

impl Bits {
    /// Room for `0..len`.
    pub(crate) fn new(len: usize) -> Bits {
        Bits(vec![0; len.div_ceil(64).max(1)].into_boxed_slice())
    }

    pub(crate) fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }

    pub(crate) fn clear(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }

    pub(crate) fn clear_all(&mut self) {
        self.0.fill(0);
    }

    /// Exactly `0..k` (`k` within the size).
    pub(crate) fn set_first(&mut self, k: usize) {
        for (w, word) in self.0.iter_mut().enumerate() {
            let below = k.saturating_sub(w * 64);
            *word = if below >= 64 { u64::MAX } else { (1u64 << below) - 1 };
        }
    }

    pub(crate) fn contains(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The first member at or after `from`.
    pub(crate) fn next_from(&self, from: usize) -> Option<usize> {
        let mut w = from / 64;
        let mut word = *self.0.get(w)? & (u64::MAX << (from % 64));
        loop {
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
            w += 1;
            word = *self.0.get(w)?;
        }
    }
}

/// What a member's ACK word holds before its first ACK: far enough below
/// any message a new row is made for that no window entry counts as
/// acknowledged (the receivers' plausibility bound is the same distance).
const NEVER_ACKED: u32 = 1 << 20;

/// The collector's ACK words (§5.5), one row of `n` words per root that
/// has a message in this node's window: at most one row per window
/// entry, so a group's words are bounded by window × members, not
/// members². A row goes when the root's last entry is freed; an ACK for
/// a root without a row covers nothing held here and is dropped.
#[derive(Debug)]
pub(crate) struct AckRows {
    width: usize,
    /// The root each row is for (`u16::MAX`: free).
    roots: Box<[u16]>,
    words: Box<[u32]>,
    /// When each row's newest ACK arrived ([`AckClock`]'s samples).
    raised_ns: Box<[u64]>,
}

impl AckRows {
    const FREE: u16 = u16::MAX;

    pub(crate) fn new(rows: usize, width: usize) -> AckRows {
        AckRows {
            width,
            roots: vec![Self::FREE; rows].into_boxed_slice(),
            words: vec![0; rows * width].into_boxed_slice(),
            raised_ns: vec![0; rows].into_boxed_slice(),
        }
    }

    fn row(&self, root: u16) -> Option<usize> {
        self.roots.iter().position(|&r| r == root)
    }

    /// `member`'s cumulative ACK for `root`'s messages, if a row is kept.
    pub(crate) fn word(&self, root: u16, member: u16) -> Option<u32> {
        self.row(root).map(|r| self.words[r * self.width + member as usize])
    }

    /// Makes sure `root` has a row; a new one starts below `seq` (nothing
    /// acknowledged). False: every row is taken (never, while rows ≥
    /// window entries).
    pub(crate) fn ensure(&mut self, root: u16, seq: u32) -> bool {
        if self.row(root).is_some() {
            return true;
        }
        let Some(r) = self.row(Self::FREE) else { return false };
        self.roots[r] = root;
        self.words[r * self.width..(r + 1) * self.width].fill(seq.wrapping_sub(NEVER_ACKED));
        self.raised_ns[r] = 0;
        true
    }

    /// Raises `member`'s word for `root` to `next` (cumulative: never
    /// back), an ACK that arrived at `now`.
    pub(crate) fn raise(&mut self, root: u16, member: u16, next: u32, now: u64) {
        if let Some(r) = self.row(root) {
            let w = &mut self.words[r * self.width + member as usize];
            if seq_lt(*w, next) {
                *w = next;
                self.raised_ns[r] = now;
            }
        }
    }

    /// When `root`'s newest ACK arrived (0: none yet, or no row).
    pub(crate) fn raised_ns(&self, root: u16) -> u64 {
        self.row(root).map_or(0, |r| self.raised_ns[r])
    }

    pub(crate) fn release(&mut self, root: u16) {
        if let Some(r) = self.row(root) {
            self.roots[r] = Self::FREE;
        }
    }

    /// The roots that have a row.
    pub(crate) fn roots(&self) -> impl Iterator<Item = u16> + '_ {
        self.roots.iter().copied().filter(|&r| r != Self::FREE)
    }
}

/// What a root's latest message asked of its members: co-roots, M, NAKs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RootAlgo {
    pub coroots: u16,
    pub ack_every: u8,
    pub nak: bool,
}

impl RootAlgo {
    /// What a DATA or ANNOUNCE header says of its root's scheme.
    pub(crate) fn of(h: &RbcastHeader) -> RootAlgo {
        RootAlgo { coroots: h.coroots, ack_every: h.ack_every.max(1), nak: h.flags & rbcast_flag::NAK != 0 }
    }
}

impl Default for RootAlgo {
    fn default() -> RootAlgo {
        RootAlgo { coroots: 0, ack_every: 1, nak: false }
    }
}

/// How long a collector's window entries wait for their sub-group's ACKs,
/// learned from the entries it freed (Jacobson's smoothed mean and mean
/// deviation, from first transmission to the last ACK; an entry that was
/// repaired gives no sample, as in Karn's rule). A full window repairs
/// only entries older than [`AckClock::deadline`]: younger ones' ACKs may
/// still be on their way or queued behind each other at this NIC, and
/// repairing those is what made the every-ACK window snowball.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AckClock {
    srtt_ns: u64,
    rttvar_ns: u64,
    samples: u64,
}

impl AckClock {
    /// An entry sent at `sent` was acknowledged by its whole sub-group at `now`.
    pub(crate) fn sample(&mut self, sent: u64, now: u64) {
        let r = now.saturating_sub(sent);
        if self.samples == 0 {
            self.srtt_ns = r;
            self.rttvar_ns = r / 2;
        } else {
            let err = self.srtt_ns.abs_diff(r);
            self.rttvar_ns = (3 * self.rttvar_ns + err) / 4;
            self.srtt_ns = (7 * self.srtt_ns + r) / 8;
        }
        self.samples += 1;
    }

    /// What a context image carries of it (`image.rs`).
    pub(crate) fn words(&self) -> [u64; 3] {
        [self.srtt_ns, self.rttvar_ns, self.samples]
    }

    /// From an image's words; `None` for a wait no network has (over
    /// 2^40 ns, 18 minutes), which [`AckClock::deadline`]'s sum could not
    /// hold.
    pub(crate) fn from_words(w: [u64; 3]) -> Option<AckClock> {
        let [srtt_ns, rttvar_ns, samples] = w;
        (srtt_ns < 1 << 40 && rttvar_ns < 1 << 40).then_some(AckClock { srtt_ns, rttvar_ns, samples })
    }

    /// Age past which an entry's missing ACKs count as lost, at most `rto`;
    /// `rto` itself before the first sample.
    pub(crate) fn deadline(&self, rto: u64) -> u64 {
        if self.samples == 0 {
            return rto;
        }
        (self.srtt_ns + 4 * self.rttvar_ns).min(rto)
    }
}

/// Where a window message (one frame) sits in the broadcast it is part of:
/// fragment `frag` of `frags`, `msg_len` bytes in all (§4.5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Frag {
    pub frag: u16,
    pub frags: u16,
    pub msg_len: u32,
}

impl Frag {
    /// A whole broadcast in one frame.
    #[cfg(test)]
    pub(crate) fn whole(len: usize) -> Frag {
        Frag { frag: 0, frags: 1, msg_len: len as u32 }
    }

    pub(crate) fn of(h: &RbcastHeader) -> Frag {
        Frag { frag: h.frag, frags: h.frags, msg_len: h.msg_len }
    }

    pub(crate) fn last(&self) -> bool {
        self.frag + 1 >= self.frags
    }
}

/// The message of one window entry (a pre-registered NIC buffer).
#[derive(Debug)]
pub(crate) struct Entry {
    pub live: bool,
    pub root: u16,
    pub seq: u32,
    pub len: u16,
    pub frag: Frag,
    pub coroots: u16,
    pub ack_every: u8,
    /// Members NAK gaps (the root's scheme, `RbcastAlgo::nak`).
    pub nak: bool,
    /// When it was multicast (root) or first arrived (co-root): the
    /// retransmission timeout runs from here (§5.3).
    pub sent_ns: u64,
    /// Members of this node's sub-group, bit `rel - collector - 1`, that
    /// have not acknowledged it yet (a repair does not clear it: a member
    /// with no room drops a repair, and is repaired again).
    pub pending: Bits,
    /// When the missing members were last sent a repair (0: never).
    pub repair_ns: u64,
    /// A pass of repairs cut short for want of repair tokens goes on from
    /// this member bit (0: no pass under way).
    pub repair_next: usize,
    /// Collectors this node still has to send it to reliably (its
    /// children in the co-root tree, by exponent: [`tree_child`]).
    pub p2p_todo: u64,
    /// Of those, the ones sent whose NIC has not acknowledged it yet: the
    /// entry stays until they have, so co-roots that cannot take more hold
    /// the root's window and the root stalls.
    pub p2p_unacked: u64,
    pub data: Box<[u8]>,
}

/// A received message held on the NIC until the host's receive takes it:
/// one of the pre-posted buffers a multicast consumes (§5.4), also the
/// out-of-order queue (§5.2).
#[derive(Debug)]
pub(crate) struct Slot {
    pub live: bool,
    pub root: u16,
    pub seq: u32,
    pub len: u16,
    pub frag: Frag,
    pub data: Box<[u8]>,
}

/// What became of an arriving message at the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Already held or delivered: discarded (§5.2).
    Duplicate,
    /// Too far ahead of what was delivered to be a message of this group.
    Implausible,
    /// New.
    New,
}

/// Counts, for `emp stats` and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RbcastStats {
    /// Window messages (frames: a broadcast's fragments count one each)
    /// this node multicast as root.
    pub sent: u64,
    /// Of its broadcasts, those larger than one frame (sent in fragments).
    pub fragmented: u64,
    /// Messages delivered to the host.
    pub delivered: u64,
    /// Copies discarded as duplicates.
    pub duplicates: u64,
    /// Messages that arrived out of order and were queued.
    pub queued_out_of_order: u64,
    /// Copies dropped for want of a receive slot or window entry.
    pub no_room: u64,
    /// Explicit ACK frames sent.
    pub acks_sent: u64,
    /// ACKs piggybacked on a multicast.
    pub acks_piggybacked: u64,
    /// Reliable repairs sent to one missing member (§5.3).
    pub repairs: u64,
    /// Reliable copies to co-roots (§4.3).
    pub coroot_copies: u64,
    /// Posts that found the window full and were treated as a timeout.
    pub window_full: u64,
    /// Times the root stalled at zero credit.
    pub credit_stalls: u64,
    /// Re-post counts asked of members at zero credit.
    pub polls: u64,
    /// NAKs sent for gaps in a root's sequence.
    pub naks_sent: u64,
    /// Repairs sent at once for a NAK (also counted in `repairs`).
    pub nak_repairs: u64,
    /// Sequence announcements multicast by a root (NAK schemes).
    pub announces: u64,
    /// Out-of-order messages dropped to make room for an earlier one.
    pub evicted: u64,
}

/// One group's reliable-broadcast state on this NIC.
#[derive(Debug)]
pub(crate) struct RbGroup {
    /// Multicast address the group's port joined.
    pub addr: u16,
    /// Distinguishes this state from a later one of the same group slot
    /// (its reliable copies carry it).
    pub stamp: u32,
    pub n: u16,
    pub rank: u16,
    /// Window entries (the root's own messages and those it is co-root for).
    pub window: Vec<Entry>,
    /// Per root with a window entry here, per member: the member holds
    /// every message of `root` below this (its cumulative ACK, written as
    /// it arrives, §5.5).
    pub acks: AckRows,
    /// Re-posted buffers each member reported (cumulative, §5.4).
    pub reposted_seen: Vec<u32>,
    /// Broadcasts of the group this node knows of (its own, and the first
    /// copy of everyone else's): each consumed a buffer at every member.
    pub consumed: u32,
    /// This node's next sequence number as root.
    pub next_seq: u32,
    /// Per root: every message below it arrived (delivered or in a slot).
    pub expected: Vec<u32>,
    /// Per root: every message below it was delivered to the host.
    pub delivered: Vec<u32>,
    /// Per root: what its latest message asked (co-roots, M, NAKs).
    pub algo: Vec<RootAlgo>,
    /// Per root: one past the newest message heard of (a copy or an
    /// announcement): `expected` below it is a gap (NAK schemes).
    pub heard: Vec<u32>,
    /// Per root: the gap last NAKed ends here, and when it was NAKed.
    pub nak_to: Vec<u32>,
    pub nak_ns: Vec<u64>,
    /// When this node last multicast as root (NAK schemes announce after
    /// a quiet `rbcast_nak_retry_ns`).
    pub multicast_ns: u64,
    /// NAK schemes: when this co-root last announced to its sub-group.
    pub coroot_announced_ns: u64,
    /// Repairs this collector may still send ([`RbGroup::repair_token`]).
    pub repair_tokens: u16,
    /// When the tokens were last filled by time.
    pub repair_filled_ns: u64,
    /// The collector's ACK wait, learned ([`AckClock`]).
    pub ack_clock: AckClock,
    /// Per root: the cumulative ACK last sent, and since when a newer one
    /// is owed (0: none).
    pub ack_sent: Vec<u32>,
    pub ack_owed_since: Vec<u64>,
    pub slots: Vec<Slot>,
    /// Buffers re-posted so far (cumulative), and whether the collectors
    /// have not heard the latest count yet (since when).
    pub reposted: u32,
    pub credit_owed_since: u64,
    /// Receives posted by the host, in posting order: (descriptor, root).
    pub posted: std::collections::VecDeque<(crate::LocalDesc, u16)>,
    /// Bytes of the oldest posted receive's message written so far (its
    /// earlier fragments), and the first error writing them.
    pub front_off: usize,
    pub front_err: Option<emp_uapi::desc::Status>,
    pub posted_max: usize,
    /// Members this node, as root, found short of credit (by rank), and
    /// when it last asked them for their re-post count.
    pub starved: Bits,
    pub polled_ns: u64,
    /// The group timer's deadline (0: not armed) and stamp.
    pub timer_at: u64,
    pub timer_stamp: u32,
    pub stats: RbcastStats,
}

impl RbGroup {
    /// Nothing has happened on it yet: no broadcast sent, received or
    /// posted for. A context switch may drop such a state and build it
    /// again on restore (`ctxsw.rs`), since a new one is equal to it.
    pub(crate) fn pristine(&self) -> bool {
        self.next_seq == 0
            && self.consumed == 0
            && self.reposted == 0
            && self.window.iter().all(|e| !e.live)
            && self.slots.iter().all(|s| !s.live)
            && self.posted.is_empty()
            && self.expected.iter().chain(&self.delivered).chain(&self.ack_sent).all(|&x| x == 0)
    }

    /// Why this state cannot go into a context image now, if it cannot: a
    /// saved state carries sequences, credits, posted receives and the
    /// messages held for them, never anything in flight. Each of these
    /// settles by itself (ACKs arrive or are repaired for, owed ACKs and
    /// credit updates leave on the group timer, gaps are repaired).
    pub(crate) fn unsaveable(&self) -> Option<&'static str> {
        if self.window.iter().any(|e| e.live) {
            return Some("a reliable broadcast awaits its acknowledgements");
        }
        if self.ack_owed_since.iter().any(|&t| t != 0) {
            return Some("a reliable-broadcast ACK is owed");
        }
        if self.credit_owed_since != 0 {
            return Some("a reliable-broadcast credit update is owed");
        }
        if !self.starved.is_empty() {
            return Some("a reliable-broadcast root waits for credit");
        }
        if self.front_off != 0 || self.front_err.is_some() {
            return Some("a reliable broadcast is half handed over");
        }
        let gap = (0..self.n as usize).any(|r| r != self.rank as usize && seq_lt(self.expected[r], self.heard[r]));
        let ahead = self.slots.iter().any(|s| s.live && !seq_lt(s.seq, self.expected[s.root as usize]));
        if gap || ahead {
            return Some("a reliable broadcast is missing");
        }
        None
    }

    /// The header of a DATA frame carrying window entry `e` of group
    /// (`id`, `epoch`), multicast (`flags` 0) or point to point (`P2P`).
    pub(crate) fn data_header(&self, e: usize, id: u32, epoch: u32, flags: u8) -> RbcastHeader {
        let w = &self.window[e];
        RbcastHeader {
            group_id: id,
            epoch,
            seq: w.seq,
            reposted: self.reposted,
            len: w.len,
            frag: w.frag.frag,
            frags: w.frag.frags,
            msg_len: w.frag.msg_len,
            kind: rbcast_kind::DATA,
            root: w.root,
            sender: self.rank,
            coroots: w.coroots,
            ack_every: w.ack_every,
            flags: flags | if w.nak { rbcast_flag::NAK } else { 0 },
            ..Default::default()
        }
    }

    /// An `ANNOUNCE` (NAK schemes) that this node holds, or sent, window
    /// entry `e`'s root's messages below `seq`, with that root's scheme.
    pub(crate) fn announce_header(&self, e: usize, id: u32, epoch: u32, seq: u32) -> RbcastHeader {
        let w = &self.window[e];
        RbcastHeader {
            group_id: id,
            epoch,
            seq,
            reposted: self.reposted,
            kind: rbcast_kind::ANNOUNCE,
            root: w.root,
            sender: self.rank,
            coroots: w.coroots,
            ack_every: w.ack_every,
            flags: rbcast_flag::NAK,
            ..Default::default()
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        addr: u16,
        stamp: u32,
        n: u16,
        rank: u16,
        window: u32,
        slots: u32,
        posted_max: u32,
        buf: usize,
    ) -> RbGroup {
        let n_us = n as usize;
        let entry = || Entry {
            live: false,
            root: 0,
            seq: 0,
            len: 0,
            frag: Frag::default(),
            coroots: 0,
            ack_every: 1,
            nak: false,
            sent_ns: 0,
            pending: Bits::new(n_us),
            repair_ns: 0,
            repair_next: 0,
            p2p_todo: 0,
            p2p_unacked: 0,
            data: vec![0; buf].into_boxed_slice(),
        };
        let slot = || Slot {
            live: false,
            root: 0,
            seq: 0,
            len: 0,
            frag: Frag::default(),
            data: vec![0; buf].into_boxed_slice(),
        };
        RbGroup {
            addr,
            stamp,
            n,
            rank,
            window: (0..window).map(|_| entry()).collect(),
            // Each live entry needs its root's row: no more than entries.
            acks: AckRows::new(window as usize, n_us),
            reposted_seen: vec![0; n_us],
            consumed: 0,
            next_seq: 0,
            expected: vec![0; n_us],
            delivered: vec![0; n_us],
            algo: vec![RootAlgo::default(); n_us],
            heard: vec![0; n_us],
            nak_to: vec![0; n_us],
            nak_ns: vec![0; n_us],
            multicast_ns: 0,
            coroot_announced_ns: 0,
            repair_tokens: REPAIR_TOKENS,
            repair_filled_ns: 0,
            ack_clock: AckClock::default(),
            ack_sent: vec![0; n_us],
            ack_owed_since: vec![0; n_us],
            slots: (0..slots).map(|_| slot()).collect(),
            reposted: 0,
            credit_owed_since: 0,
            posted: std::collections::VecDeque::with_capacity(posted_max as usize),
            posted_max: posted_max as usize,
            front_off: 0,
            front_err: None,
            starved: Bits::new(n_us),
            polled_ns: 0,
            timer_at: 0,
            timer_stamp: 0,
            stats: RbcastStats::default(),
        }
    }

    pub(crate) fn rel(&self, root: u16) -> u16 {
        emp_uapi::coll::rel_rank(self.rank, root, self.n)
    }

    /// Window entries in use, and those holding this node's own messages.
    pub(crate) fn window_used(&self) -> (usize, usize) {
        let live = self.window.iter().filter(|e| e.live);
        let own = live.clone().filter(|e| e.root == self.rank).count();
        (live.count(), own)
    }

    pub(crate) fn free_entry(&self) -> Option<usize> {
        self.window.iter().position(|e| !e.live)
    }

    pub(crate) fn slots_used(&self) -> usize {
        self.slots.iter().filter(|s| s.live).count()
    }

    /// Credits this node has for `member` (§5.4): buffers it pre-posted
    /// minus the broadcasts known to consume one there and not re-posted.
    pub(crate) fn credit(&self, member: u16) -> i64 {
        let held = self.consumed.wrapping_sub(self.reposted_seen[member as usize]) as i32 as i64;
        self.slots.len() as i64 - held
    }

    /// Members of this node's sub-group for a message of `root` with
    /// `coroots` co-roots, when this node is a collector (absolute ranks).
    pub(crate) fn sub_group(&self, root: u16, coroots: u16) -> impl Iterator<Item = u16> + '_ {
        let s = sub_size(self.n, coroots);
        let rel = self.rel(root);
        let (n, c) = (self.n, rel);
        (c + 1..(c + s).min(n)).map(move |r| emp_uapi::coll::abs_rank(r, root, n))
    }

    /// The first sub-group member bit from `from` on that still lacks one
    /// of `root`'s messages this node collects for.
    pub(crate) fn lacking(&self, root: u16, from: usize) -> Option<usize> {
        self.window.iter().filter(|w| w.live && w.root == root).filter_map(|w| w.pending.next_from(from)).min()
    }

    /// Takes a token for one repair, if any is left. Repairs are unicast
    /// frames with no transmission record to bound them, and every one
    /// draws an ACK: a collector whose ACKs queue up past the timeout
    /// (the root of a wide group, its NIC busy with ACKs) would repair
    /// everyone, take more ACKs, fall further behind, and repair again. So
    /// repairs are clocked by what comes back: each ACK or NAK frame from
    /// a member returns a token ([`RbGroup::repair_returned`]), and the
    /// tokens fill up again once per timeout, so losing every ACK cannot
    /// stop repairs.
    pub(crate) fn repair_token(&mut self, now: u64, rto: u64) -> bool {
        if now >= self.repair_filled_ns.saturating_add(rto) {
            self.repair_tokens = REPAIR_TOKENS;
            self.repair_filled_ns = now;
        }
        let got = self.repair_tokens > 0;
        self.repair_tokens -= u16::from(got);
        got
    }

    /// An ACK or NAK frame arrived: one more repair may go.
    pub(crate) fn repair_returned(&mut self) {
        self.repair_tokens = (self.repair_tokens + 1).min(REPAIR_TOKENS);
    }

    /// Is this node a collector (root or co-root) of `root`'s messages?
    pub(crate) fn is_collector(&self, root: u16, coroots: u16) -> bool {
        self.rel(root).is_multiple_of(sub_size(self.n, coroots))
    }

    /// The collector (absolute rank) this node acknowledges `root`'s messages to.
    pub(crate) fn collector(&self, root: u16) -> u16 {
        let s = sub_size(self.n, self.algo[root as usize].coroots);
        emp_uapi::coll::abs_rank(collector_of(self.rel(root), s), root, self.n)
    }

    /// Records a cumulative ACK that arrived at `now` (§5.5: a word
    /// written, nothing else done).
    pub(crate) fn ack_word(&mut self, root: u16, member: u16, next: u32, now: u64) {
        if member < self.n {
            self.acks.raise(root, member, next, now);
        }
    }

    /// Marks the members of this node's sub-group of `root`'s messages
    /// (with `coroots` co-roots) at zero credit; true if any is.
    pub(crate) fn mark_starved(&mut self, root: u16, coroots: u16, need: i64) -> bool {
        self.starved.clear_all();
        let s = sub_size(self.n, coroots);
        let c = self.rel(root);
        for r in c + 1..(c + s).min(self.n) {
            let m = emp_uapi::coll::abs_rank(r, root, self.n);
            if self.credit(m) < need {
                self.starved.set(m as usize);
            }
        }
        !self.starved.is_empty()
    }

    /// Window entry `e` goes live for `root`'s message `seq`: its root's
    /// ACK row is kept, its pending set is this node's sub-group. False:
    /// no row (cannot happen: rows ≥ entries).
    pub(crate) fn occupy(&mut self, e: usize, root: u16, seq: u32, coroots: u16) -> bool {
        if !self.acks.ensure(root, seq) {
            return false;
        }
        let k = self.sub_group(root, coroots).count();
        let w = &mut self.window[e];
        w.live = true;
        w.root = root;
        w.seq = seq;
        w.coroots = coroots;
        w.pending.set_first(k);
        w.repair_next = 0;
        true
    }

    /// Records a member's re-post count (piggybacked credits).
    pub(crate) fn reposted_word(&mut self, member: u16, reposted: u32) {
        let w = &mut self.reposted_seen[member as usize];
        if seq_lt(*w, reposted) {
            *w = reposted;
        }
    }

    /// Clears the sub-group bits of entry `e` whose members acknowledged
    /// it; true when nothing keeps it any more (it is then freed, and an
    /// entry never repaired teaches the [`AckClock`] how long it waited).
    pub(crate) fn settle(&mut self, e: usize) -> bool {
        let (root, seq, coroots) = (self.window[e].root, self.window[e].seq, self.window[e].coroots);
        let acked_ns = self.acks.raised_ns(root);
        let s = sub_size(self.n, coroots);
        let c = self.rel(root);
        let mut next = self.window[e].pending.next_from(0);
        while let Some(b) = next {
            let member = emp_uapi::coll::abs_rank(c + 1 + b as u16, root, self.n);
            debug_assert!(c + 1 + (b as u16) < (c + s).min(self.n));
            if self.acks.word(root, member).is_some_and(|w| seq_lt(seq, w)) {
                self.window[e].pending.clear(b);
            }
            next = self.window[e].pending.next_from(b + 1);
        }
        let w = &mut self.window[e];
        if w.pending.is_empty() && w.p2p_todo == 0 && w.p2p_unacked == 0 {
            w.live = false;
            if w.repair_ns == 0 && acked_ns >= w.sent_ns && acked_ns != 0 {
                self.ack_clock.sample(w.sent_ns, acked_ns);
            }
            if !self.window.iter().any(|o| o.live && o.root == root) {
                self.acks.release(root);
            }
            return true;
        }
        false
    }

    /// Where `root`'s message `seq` stands at this receiver.
    pub(crate) fn classify(&self, root: u16, seq: u32) -> Arrival {
        let r = root as usize;
        if seq_lt(seq, self.expected[r]) || self.slots.iter().any(|s| s.live && s.root == root && s.seq == seq) {
            return Arrival::Duplicate;
        }
        // No root gets further ahead of a member than its window and the
        // member's credits allow; far beyond is not a message of ours.
        if seq.wrapping_sub(self.delivered[r]) >= 1 << 20 {
            return Arrival::Implausible;
        }
        Arrival::New
    }

    /// No slot is free for `root`'s message `seq`: frees the slot of a
    /// later message of the same root held out of order (never
    /// acknowledged, so its collector repairs it again) — a message
    /// earlier in root order is worth more, and repairs arriving out of
    /// order cannot then block the one every receive waits for. Returns
    /// the freed slot.
    pub(crate) fn evict_for(&mut self, root: u16, seq: u32) -> Option<usize> {
        let expected = self.expected[root as usize];
        let victim = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live && s.root == root && seq_lt(seq, s.seq) && !seq_lt(s.seq, expected))
            .max_by_key(|(_, s)| s.seq.wrapping_sub(expected))
            .map(|(i, _)| i)?;
        self.slots[victim].live = false;
        // As if it never came: it consumes a buffer again when it does.
        self.consumed = self.consumed.wrapping_sub(1);
        self.stats.evicted += 1;
        Some(victim)
    }

    /// The message the oldest posted receive wants: (root, seq).
    pub(crate) fn wanted(&self) -> Option<(u16, u32)> {
        self.posted.front().map(|&(_, root)| (root, self.delivered[root as usize]))
    }

    /// Moves `expected[root]` past the messages now held; returns the old value.
    pub(crate) fn advance_expected(&mut self, root: u16) -> u32 {
        let r = root as usize;
        let old = self.expected[r];
        loop {
            let e = self.expected[r];
            let held =
                seq_lt(e, self.delivered[r]) || self.slots.iter().any(|s| s.live && s.root == root && s.seq == e);
            if !held {
                break;
            }
            self.expected[r] = e.wrapping_add(1);
        }
        old
    }

    /// `root`'s messages below `next` exist (a copy of `next - 1`, or the
    /// root's announcement).
    pub(crate) fn hear(&mut self, root: u16, next: u32) {
        let h = &mut self.heard[root as usize];
        if seq_lt(*h, next) {
            *h = next;
        }
    }

    /// The first run of `root`'s messages this node lacks while it has
    /// heard of later ones: `[expected, first held or heard)`, if any.
    pub(crate) fn first_gap(&self, root: u16) -> Option<(u32, u32)> {
        let from = self.expected[root as usize];
        let mut to = self.heard[root as usize];
        if !seq_lt(from, to) {
            return None;
        }
        for s in self.slots.iter().filter(|s| s.live && s.root == root) {
            if seq_lt(from, s.seq) && seq_lt(s.seq, to) {
                to = s.seq;
            }
        }
        Some((from, to))
    }

    /// Lazy ACKs (§4.4): messages `[from, to)` of `root` arrived in order.
    /// True when one of them is this node's turn to ACK at once — message
    /// B with `B mod M = i mod M` (skewed), M = the root's ACK interval —
    /// else the ACK is owed and goes piggybacked or after a delay.
    pub(crate) fn ack_turn(&mut self, root: u16, from: u32, to: u32, now: u64) -> bool {
        let m = self.algo[root as usize].ack_every.max(1) as u32;
        let mine = self.rank as u32 % m;
        let mut b = from;
        let mut turn = false;
        while b != to {
            turn |= b % m == mine;
            b = b.wrapping_add(1);
        }
        if !turn && from != to && self.ack_owed_since[root as usize] == 0 {
            self.ack_owed_since[root as usize] = now.max(1);
        }
        turn
    }

    /// A consistency check of the bounds (`Nic::invariants`).
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.repair_tokens > REPAIR_TOKENS {
            return Err(format!("{} repair tokens, bound {REPAIR_TOKENS}", self.repair_tokens));
        }
        for (i, e) in self.window.iter().enumerate().filter(|(_, e)| e.live) {
            let s = sub_size(self.n, e.coroots);
            if let Some(b) = e.pending.next_from(s as usize - 1) {
                return Err(format!("window entry {i}: pending member {b} beyond a sub-group of {s}"));
            }
            if self.acks.word(e.root, 0).is_none() {
                return Err(format!("window entry {i}: no ACK row for root {}", e.root));
            }
            if e.len as usize > e.data.len() || e.root >= self.n {
                return Err(format!("window entry {i}: len {} root {}", e.len, e.root));
            }
            if e.repair_next >= s as usize {
                return Err(format!("window entry {i}: repair pass at member {} of a sub-group of {s}", e.repair_next));
            }
        }
        for (i, s) in self.slots.iter().enumerate().filter(|(_, s)| s.live) {
            if seq_lt(s.seq, self.delivered[s.root as usize]) {
                return Err(format!("slot {i} holds delivered message {} of root {}", s.seq, s.root));
            }
        }
        if let Some(r) = self.acks.roots().find(|&r| !self.window.iter().any(|e| e.live && e.root == r)) {
            return Err(format!("ACK row kept for root {r}, which has no window entry"));
        }
        if self.posted.len() > self.posted_max {
            return Err(format!("{} receives posted, bound {}", self.posted.len(), self.posted_max));
        }
        for r in 0..self.n as usize {
            if seq_lt(self.expected[r], self.delivered[r]) {
                return Err(format!("root {r}: expected {} below delivered {}", self.expected[r], self.delivered[r]));
            }
            // Everything held was heard of (the NAK schemes' gap is
            // `expected .. heard`).
            if r != self.rank as usize && seq_lt(self.heard[r], self.expected[r]) {
                return Err(format!("root {r}: expected {} beyond heard {}", self.expected[r], self.heard[r]));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_groups_cover_every_member_once() {
        for n in (1..=64u16).chain([255, 256, 1000, 1024]) {
            for coroots in (0..8u16).chain([255, 256, 511, 1023]) {
                let s = sub_size(n, coroots);
                let collectors = n.div_ceil(s);
                assert!(collectors <= coroots + 1, "n {n} coroots {coroots}");
                for rel in 0..n {
                    let c = collector_of(rel, s);
                    assert!(c <= rel && rel < c + s && c.is_multiple_of(s));
                }
            }
        }
    }

    #[test]
    fn co_root_tree_reaches_every_collector_once() {
        for count in 1..=1024u16 {
            let mut seen = vec![false; count as usize];
            seen[0] = true;
            let mut frontier = vec![0u16];
            while let Some(j) = frontier.pop() {
                let kids = tree_children(j, count);
                for i in (0..16).filter(|i| kids >> i & 1 == 1) {
                    let k = tree_child(j, i);
                    assert!(!seen[k as usize], "count {count}: {k} reached twice");
                    seen[k as usize] = true;
                    frontier.push(k);
                }
            }
            assert!(seen.iter().all(|&s| s), "count {count}");
        }
    }

    #[test]
    fn ack_clock_learns_the_ack_wait_and_never_exceeds_the_timeout() {
        let mut c = AckClock::default();
        assert_eq!(c.deadline(1_000), 1_000, "no sample yet: the timeout");
        for _ in 0..50 {
            c.sample(100, 300);
        }
        let d = c.deadline(1_000_000);
        assert!((200..260).contains(&d), "steady 200 ns waits: {d}");
        c.sample(0, 10_000);
        assert!(c.deadline(1_000_000) > d, "a slow one widens it");
        assert_eq!(c.deadline(500), 500, "capped at the timeout");
    }

    #[test]
    fn bit_sets_find_every_member() {
        let mut b = Bits::new(1024);
        b.set_first(130);
        assert_eq!(b.count(), 130);
        assert_eq!(b.next_from(0), Some(0));
        assert_eq!(b.next_from(129), Some(129));
        assert_eq!(b.next_from(130), None);
        b.clear(64);
        assert_eq!(b.next_from(64), Some(65));
        b.set_first(0);
        assert!(b.is_empty());
        b.set(1023);
        assert_eq!(b.next_from(5), Some(1023));
        assert_eq!(b.next_from(1024), None);
    }

    #[test]
    fn ack_rows_are_bounded_and_released_with_the_last_entry() {
        // 1024 members, 2 entries: 2 rows of 1024 words, not 1024².
        let mut g = RbGroup::new(0xF001, 1, 1024, 0, 2, 2, 2, 64);
        assert!(g.occupy(0, 0, 7, 0));
        assert_eq!(g.window[0].pending.count(), 1023);
        assert!(g.occupy(1, 5, 3, 0), "a second root");
        assert!(!g.acks.ensure(9, 0), "no third row: every row is taken");
        for m in 1..1024 {
            g.ack_word(0, m, 8, 1);
        }
        assert!(g.settle(0));
        assert_eq!(g.acks.roots().collect::<Vec<_>>(), [5], "root 0's row went with its entry");
        g.ack_word(0, 3, 9, 1);
        assert_eq!(g.acks.word(0, 3), None, "an ACK for a root without a row is dropped");
        assert!(g.check().is_ok());
    }

    #[test]
    fn skewed_ack_turn_is_b_mod_m_equals_i_mod_m() {
        let mut g = RbGroup::new(0xF001, 1, 8, 3, 4, 4, 4, 64);
        g.algo[0] = RootAlgo { ack_every: 4, ..RootAlgo::default() };
        let turns: Vec<u32> = (0..12).filter(|&b| g.ack_turn(0, b, b + 1, 10)).collect();
        assert_eq!(turns, [3, 7, 11]);
        assert!(g.ack_turn(0, 0, 4, 10), "a run containing its turn");
        g.algo[0] = RootAlgo::default();
        assert!((0..5).all(|b| g.ack_turn(0, b, b + 1, 10)), "M = 1: every message");
    }

    #[test]
    fn settle_frees_an_entry_once_its_sub_group_acknowledged() {
        // Root 0 of 6 with one co-root: sub-groups {0,1,2} and {3,4,5}.
        let mut g = RbGroup::new(0xF001, 1, 6, 0, 2, 2, 2, 64);
        assert!(g.occupy(0, 0, 5, 1));
        assert_eq!(g.window[0].pending.count(), 2);
        assert_eq!(g.sub_group(0, 1).collect::<Vec<_>>(), [1, 2]);
        assert!(!g.settle(0), "nobody acknowledged yet");
        g.ack_word(0, 1, 6, 1);
        assert!(!g.settle(0));
        assert_eq!(g.window[0].pending.next_from(0), Some(1));
        g.ack_word(0, 2, 5, 1);
        assert!(!g.settle(0), "ACK 5 does not cover message 5");
        g.ack_word(0, 2, 9, 1);
        g.ack_word(0, 2, 7, 1);
        assert_eq!(g.acks.word(0, 2), Some(9), "cumulative: never goes back");
        assert!(g.settle(0));
        assert!(!g.window[0].live);
    }

    #[test]
    fn the_first_gap_ends_at_the_first_message_held_after_it() {
        let mut g = RbGroup::new(0xF001, 1, 4, 1, 2, 4, 2, 64);
        assert_eq!(g.first_gap(0), None, "nothing heard of");
        g.hear(0, 3);
        assert_eq!(g.first_gap(0), Some((0, 3)), "an announcement of 3 messages, none held");
        g.slots[0] = Slot { live: true, root: 0, seq: 1, len: 0, frag: Frag::whole(0), data: Box::new([]) };
        g.hear(0, 2);
        assert_eq!(g.heard[0], 3, "heard only grows");
        assert_eq!(g.first_gap(0), Some((0, 1)), "message 1 is held");
        g.expected[0] = 3;
        assert_eq!(g.first_gap(0), None);
    }

    #[test]
    fn duplicates_and_implausible_sequences_are_recognised() {
        let mut g = RbGroup::new(0xF001, 1, 4, 1, 2, 2, 2, 64);
        assert_eq!(g.classify(0, 0), Arrival::New);
        g.slots[0] = Slot { live: true, root: 0, seq: 2, len: 0, frag: Frag::whole(0), data: Box::new([]) };
        assert_eq!(g.classify(0, 2), Arrival::Duplicate);
        assert_eq!(g.advance_expected(0), 0);
        assert_eq!(g.expected[0], 0, "message 0 is missing");
        g.delivered[0] = 2;
        g.expected[0] = 2;
        g.advance_expected(0);
        assert_eq!(g.expected[0], 3);
        assert_eq!(g.classify(0, 1), Arrival::Duplicate);
        assert_eq!(g.classify(0, 2 + (1 << 20)), Arrival::Implausible);
    }
}
