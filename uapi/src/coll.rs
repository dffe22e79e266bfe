//! Collective contracts shared by the host library, the control program and
//! the simulator: datatypes and reduction operators, barrier algorithms and
//! their schedules, and the header every collective message carries.
//!
//! Integer-only and allocation-free (the kernel compiles this crate): the
//! floating-point combine functions live in the firmware and in libemp.

use crate::{le_struct, DecodeError, Le};

/// Most members a group holds. A group of at most [`GROUP_INLINE_MAX`]
/// members fits in one group table entry; a larger one carries its member
/// list and parent arrays in a body after its entry
/// (`crate::sram::GroupEntry::span`).
pub const GROUP_MEMBERS_MAX: usize = 1024;
/// Members a group using the reliable broadcast may have: every group (the
/// NIC sizes its per-member ACK words, pending sets and credits by the
/// group, from a bounded pool).
pub const RBCAST_MEMBERS_MAX: usize = GROUP_MEMBERS_MAX;
/// Most members a group table entry holds inline (the first layout's limit).
pub const GROUP_INLINE_MAX: usize = 64;
/// Ranks one multisend descriptor's mask covers: window w is ranks
/// `MULTISEND_WINDOW · w ..` (descriptor `port` = w, `ignore` = the mask).
pub const MULTISEND_WINDOW: usize = 64;

/// Trees a group table entry holds (parent arrays).
pub const TREES_MAX: usize = 8;
/// Parent value of a tree's root in a parent array.
pub const TREE_ROOT: u8 = 0xFF;
/// Parent value of a tree's root in a wide (16-bit) parent array, the
/// form a group of more than [`GROUP_INLINE_MAX`] members uses.
pub const TREE_ROOT_WIDE: u16 = 0xFFFF;

/// Reduction element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dtype {
    /// Signed 32-bit integers.
    I32 = 1,
    /// Signed 64-bit integers.
    I64 = 2,
    /// Unsigned 32-bit integers.
    U32 = 3,
    /// Unsigned 64-bit integers.
    U64 = 4,
    /// IEEE-754 binary32.
    F32 = 5,
    /// IEEE-754 binary64.
    F64 = 6,
}

impl Dtype {
    /// Every type, for tests and tools.
    pub const ALL: [Dtype; 6] = [Dtype::I32, Dtype::I64, Dtype::U32, Dtype::U64, Dtype::F32, Dtype::F64];

    /// Decodes a type byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Dtype::I32,
            2 => Dtype::I64,
            3 => Dtype::U32,
            4 => Dtype::U64,
            5 => Dtype::F32,
            6 => Dtype::F64,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
        }
    }

    /// Floating point?
    pub const fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F64)
    }

    /// Short name.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
            Dtype::U32 => "u32",
            Dtype::U64 => "u64",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
        }
    }
}

/// Reduction operators. Integer sum and product wrap; `min`/`max` keep the
/// accumulator unless the other value compares strictly less/greater (so a
/// NaN never replaces a number and the result is deterministic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum.
    Sum = 1,
    /// Product.
    Prod = 2,
    /// Minimum.
    Min = 3,
    /// Maximum.
    Max = 4,
    /// Bitwise and (integers only).
    Band = 5,
    /// Bitwise or (integers only).
    Bor = 6,
    /// Bitwise exclusive or (integers only).
    Bxor = 7,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 7] =
        [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Band, ReduceOp::Bor, ReduceOp::Bxor];

    /// Decodes an operator byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => ReduceOp::Sum,
            2 => ReduceOp::Prod,
            3 => ReduceOp::Min,
            4 => ReduceOp::Max,
            5 => ReduceOp::Band,
            6 => ReduceOp::Bor,
            7 => ReduceOp::Bxor,
            _ => return None,
        })
    }

    /// Is the operator defined for `t`? (Bitwise operators are not, on floats.)
    pub const fn defined_for(self, t: Dtype) -> bool {
        !(t.is_float() && matches!(self, ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor))
    }

    /// Short name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Band => "band",
            ReduceOp::Bor => "bor",
            ReduceOp::Bxor => "bxor",
        }
    }
}

/// The reliable broadcast's algorithm, chosen per call (seed 002): the
/// descriptor's `tag` of an `Opcode::Rbcast` ([`rbcast_tag`]).
///
/// Reliability is ACK-based by default (the paper's): members acknowledge,
/// collectors repair what stays unacknowledged past the timeout. With
/// `nak` (the paper's §9 future work) members also report a gap in a
/// root's sequence at once (a NAK) and collectors repair it at once;
/// `ack_every` 0 then means ACKs only as the window needs them (every half
/// window: the NAK-based scheme), and M ≥ 1 keeps ACK every M beside the
/// NAKs (the hybrid scheme).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RbcastAlgo {
    /// Co-roots (§4.3): 0 = the root collects every ACK itself.
    pub coroots: u16,
    /// ACK every M messages, skewed (§4.4); 0 or 1 = every message (with
    /// `nak`, 0 = every half window).
    pub ack_every: u8,
    /// Window slots the root may use (§4.2), 0 = all the NIC has.
    pub window: u8,
    /// Members NAK gaps and collectors repair them at once (§9).
    pub nak: bool,
}

/// [`rbcast_tag`] bit: [`RbcastAlgo::nak`].
pub const RBCAST_TAG_NAK: u64 = 1 << 32;

/// The descriptor `tag` of a reliable broadcast with algorithm `a`: the
/// co-root count's low byte, M, the window, the co-root count's high byte,
/// then the NAK bit (a tag of the three byte fields alone means what it
/// always did).
pub const fn rbcast_tag(a: RbcastAlgo) -> u64 {
    (a.coroots & 0xFF) as u64
        | (a.ack_every as u64) << 8
        | (a.window as u64) << 16
        | ((a.coroots >> 8) as u64) << 24
        | if a.nak { RBCAST_TAG_NAK } else { 0 }
}

/// The algorithm a reliable broadcast's `tag` names (`None`: bits beyond
/// the fields). The co-root count is checked against the group's size by
/// the NIC.
pub const fn rbcast_algo(tag: u64) -> Option<RbcastAlgo> {
    if tag >> 33 != 0 {
        return None;
    }
    Some(RbcastAlgo {
        coroots: (tag & 0xFF) as u16 | ((tag >> 24) as u16 & 0xFF) << 8,
        ack_every: (tag >> 8) as u8,
        window: (tag >> 16) as u8,
        nak: tag & RBCAST_TAG_NAK != 0,
    })
}

/// The `tag` of a reduce/allreduce descriptor: `dtype | op << 8 | tree << 16`.
pub const fn reduce_tag(t: Dtype, op: ReduceOp, tree: u8) -> u64 {
    t as u64 | (op as u64) << 8 | (tree as u64) << 16
}

/// Splits a reduce tag into (dtype byte, op byte, tree index).
pub const fn reduce_tag_parts(tag: u64) -> (u8, u8, u8) {
    (tag as u8, (tag >> 8) as u8, (tag >> 16) as u8)
}

/// Barrier algorithms the NIC runs (descriptor `port` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BarrierAlgo {
    /// Pairwise exchange (MPICH's; seed 001 §3.3.1).
    PairwiseExchange = 0,
    /// Dissemination (Hensgen, Finkel and Manber): ⌈log2 N⌉ rounds.
    Dissemination = 1,
    /// Gather up a group tree, release down it (seed 001 §3.3.1).
    GatherRelease = 2,
}

impl BarrierAlgo {
    /// Decodes the descriptor field.
    pub const fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0 => BarrierAlgo::PairwiseExchange,
            1 => BarrierAlgo::Dissemination,
            2 => BarrierAlgo::GatherRelease,
            _ => return None,
        })
    }
}

/// One step of a rank's barrier schedule. `round` tells messages of
/// different rounds apart (it travels in [`CollHeader::round`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    /// Send this rank's arrival to `to`.
    Send { to: u16, round: u8 },
    /// Wait for `from`'s message of `round`.
    Recv { from: u16, round: u8 },
}

/// Round numbers of pairwise exchange's fix-up messages (exchange rounds are 0..16).
pub const PE_PRE: u8 = 0xF0;
/// See [`PE_PRE`].
pub const PE_RELEASE: u8 = 0xF1;

/// Step `index` of the schedule rank `rank` of `n` runs for a
/// pairwise-exchange or dissemination barrier, or `None` past its end
/// (and for gather-release, whose steps come from a tree).
///
/// Pairwise exchange: with S the largest power of two ≤ N, ranks r ≥ S hand
/// their arrival to r − S and wait for its release; ranks r < S exchange
/// with r XOR 2^i in round i, then release r + S. Dissemination: in round k
/// rank r sends to r + 2^k and waits for r − 2^k (mod N).
pub const fn barrier_step(algo: BarrierAlgo, n: u16, rank: u16, index: usize) -> Option<Step> {
    if n == 0 || rank >= n {
        return None;
    }
    let (n, r) = (n as usize, rank as usize);
    match algo {
        BarrierAlgo::PairwiseExchange => {
            let s = 1usize << (usize::BITS - 1 - n.leading_zeros());
            if r >= s {
                let partner = (r - s) as u16;
                return match index {
                    0 => Some(Step::Send { to: partner, round: PE_PRE }),
                    1 => Some(Step::Recv { from: partner, round: PE_RELEASE }),
                    _ => None,
                };
            }
            let extra = r + s < n;
            let mut i = index;
            if extra {
                if i == 0 {
                    return Some(Step::Recv { from: (r + s) as u16, round: PE_PRE });
                }
                i -= 1;
            }
            let rounds = s.trailing_zeros() as usize;
            if i < 2 * rounds {
                let round = i / 2;
                let partner = (r ^ (1 << round)) as u16;
                return Some(if i % 2 == 0 {
                    Step::Send { to: partner, round: round as u8 }
                } else {
                    Step::Recv { from: partner, round: round as u8 }
                });
            }
            if extra && i == 2 * rounds {
                return Some(Step::Send { to: (r + s) as u16, round: PE_RELEASE });
            }
            None
        }
        BarrierAlgo::Dissemination => {
            let k = index / 2;
            if k >= usize::BITS as usize || (1usize << k) >= n {
                return None;
            }
            let d = 1usize << k;
            Some(if index % 2 == 0 {
                Step::Send { to: ((r + d) % n) as u16, round: k as u8 }
            } else {
                Step::Recv { from: ((r + n - d) % n) as u16, round: k as u8 }
            })
        }
        BarrierAlgo::GatherRelease => None,
    }
}

/// Rank `rank` relative to `root` in a group of `n` (the root is 0; 0 when `n` is 0).
pub const fn rel_rank(rank: u16, root: u16, n: u16) -> u16 {
    if n == 0 {
        return 0;
    }
    ((rank as u32 + n as u32 - root as u32 % n as u32) % n as u32) as u16
}

/// Absolute rank of relative rank `rel` for `root` (0 when `n` is 0).
pub const fn abs_rank(rel: u16, root: u16, n: u16) -> u16 {
    if n == 0 {
        return 0;
    }
    ((rel as u32 + root as u32) % n as u32) as u16
}

/// Checks a parent array over `n` relative ranks: `parent[0]` is
/// [`TREE_ROOT`], every other entry names a rank < n, and following parents
/// from any rank reaches 0 (no cycle).
pub fn tree_valid(parent: &[u8], n: usize) -> bool {
    n <= parent.len() && tree_valid_by(n, |r| if parent[r] == TREE_ROOT { TREE_ROOT_WIDE } else { parent[r] as u16 })
}

/// [`tree_valid`] over any parent representation: `parent(r)` is relative
/// rank r's parent, [`TREE_ROOT_WIDE`] for the root. Allocation-free (the
/// kernel runs it), so it walks every rank to the root: O(n · depth).
pub fn tree_valid_by(n: usize, parent: impl Fn(usize) -> u16) -> bool {
    if n == 0 || n > TREE_ROOT_WIDE as usize || parent(0) != TREE_ROOT_WIDE {
        return false;
    }
    for r in 1..n {
        let (mut x, mut hops) = (r, 0);
        while x != 0 {
            let p = parent(x) as usize;
            if p >= n || hops > n {
                return false;
            }
            x = p;
            hops += 1;
        }
    }
    true
}

/// What a collective message is, in [`CollHeader::kind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CollKind {
    /// Broadcast payload travelling down a tree.
    Bcast = 1,
    /// Pairwise-exchange barrier arrival (`round` = schedule round).
    BarrierPe = 2,
    /// Dissemination barrier arrival (`round` = k).
    BarrierDiss = 3,
    /// Gather-release barrier: a subtree has arrived (child → parent).
    BarrierGather = 4,
    /// Gather-release barrier: release (parent → child).
    BarrierRelease = 5,
    /// Partial reduction result (child → parent).
    ReduceUp = 6,
    /// Allreduce result travelling down the tree.
    AllreduceDown = 7,
    /// Reliable broadcast (seed 002): a repair or co-root copy over the
    /// reliable point-to-point path; the payload after this header is an
    /// `RbcastHeader` and the data.
    Rbcast = 8,
}

impl CollKind {
    /// Decodes a kind byte.
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => CollKind::Bcast,
            2 => CollKind::BarrierPe,
            3 => CollKind::BarrierDiss,
            4 => CollKind::BarrierGather,
            5 => CollKind::BarrierRelease,
            6 => CollKind::ReduceUp,
            7 => CollKind::AllreduceDown,
            8 => CollKind::Rbcast,
            _ => return None,
        })
    }
}

le_struct! {
    /// Header at the start of every collective message's payload (32 bytes;
    /// frame kind `CollData`). Names the group instance so instances never mix
    /// and frames of an older epoch are recognised.
    pub struct CollHeader {
        /// Group id.
        pub group_id: u32,
        /// Group epoch.
        pub epoch: u32,
        /// Collective instance: the n-th collective posted on the group.
        pub instance: u32,
        /// [`CollKind`].
        pub kind: u8,
        /// Barrier round.
        pub round: u8,
        /// Tree index.
        pub tree: u8,
        /// [`Dtype`] (reductions; else 0).
        pub dtype: u8,
        /// [`ReduceOp`] (reductions; else 0).
        pub op: u8,
        /// Reserved, zero.
        pub reserved: u8,
        /// Root rank (broadcast, reduce).
        pub root: u16,
        /// Sender's rank in the group.
        pub sender: u16,
        /// Reserved, zero.
        pub reserved2: u16,
        /// Elements (reductions) or 0.
        pub count: u32,
        /// Reserved, zero (keeps reduction data 8-byte aligned).
        pub reserved3: u32,
    }
    size = 32;
}

impl CollHeader {
    /// Decodes and validates a header from untrusted bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        let h = CollHeader::decode(bytes)?;
        if h.reserved != 0 || h.reserved2 != 0 || h.reserved3 != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        let kind = CollKind::from_u8(h.kind).ok_or(DecodeError::BadKind)?;
        if (h.sender as usize) >= GROUP_MEMBERS_MAX || (h.root as usize) >= GROUP_MEMBERS_MAX {
            return Err(DecodeError::BadIndex);
        }
        if (h.tree as usize) >= TREES_MAX {
            return Err(DecodeError::BadIndex);
        }
        if matches!(kind, CollKind::ReduceUp | CollKind::AllreduceDown) {
            let (Some(t), Some(op)) = (Dtype::from_u8(h.dtype), ReduceOp::from_u8(h.op)) else {
                return Err(DecodeError::BadKind);
            };
            if !op.defined_for(t) || h.count == 0 {
                return Err(DecodeError::BadKind);
            }
        } else if h.dtype != 0 || h.op != 0 || h.count != 0 {
            return Err(DecodeError::ReservedNotZero);
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_tag_round_trips() {
        for t in Dtype::ALL {
            for op in ReduceOp::ALL {
                for tree in [0u8, 7] {
                    let tag = reduce_tag(t, op, tree);
                    assert_eq!(reduce_tag_parts(tag), (t as u8, op as u8, tree));
                }
            }
        }
        assert!(!ReduceOp::Bxor.defined_for(Dtype::F32));
        assert!(ReduceOp::Max.defined_for(Dtype::F64));
    }

    #[test]
    fn coll_header_fixture() {
        let h = CollHeader {
            group_id: 7,
            epoch: 2,
            instance: 9,
            kind: 6,
            dtype: 2,
            op: 1,
            sender: 3,
            count: 5,
            ..Default::default()
        };
        let mut b = [0u8; 32];
        h.put(&mut b);
        assert_eq!(b, [7, 0, 0, 0, 2, 0, 0, 0, 9, 0, 0, 0, 6, 0, 0, 2, 1, 0, 0, 0, 3, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(CollHeader::parse(&b), Ok(h));
        let mut bad = b;
        bad[16] = 5; // band on i64 is fine …
        assert!(CollHeader::parse(&bad).is_ok());
        bad[15] = 6; // … on f64 it is not
        assert_eq!(CollHeader::parse(&bad), Err(DecodeError::BadKind));
        for reserved in [17, 22, 28] {
            bad = b;
            bad[reserved] = 1;
            assert_eq!(CollHeader::parse(&bad), Err(DecodeError::ReservedNotZero));
        }
        // Ranks are 16-bit: sender 1023 is fine, 1024 is not.
        bad = b;
        bad[20..22].copy_from_slice(&1023u16.to_le_bytes());
        assert!(CollHeader::parse(&bad).is_ok());
        bad[20..22].copy_from_slice(&1024u16.to_le_bytes());
        assert_eq!(CollHeader::parse(&bad), Err(DecodeError::BadIndex));
        assert_eq!(CollHeader::parse(&b[..31]), Err(DecodeError::Truncated));
    }

    #[test]
    fn tree_validation() {
        let mut p = [0u8; 8];
        p[0] = TREE_ROOT;
        assert!(tree_valid(&p, 8)); // flat
        p[3] = 5;
        p[5] = 3; // cycle 3 <-> 5
        assert!(!tree_valid(&p, 8));
        p[5] = 9;
        assert!(!tree_valid(&p, 8)); // out of range
        assert!(!tree_valid(&p, 0));
        assert!(!tree_valid(&[0, 0], 2)); // no root
                                          // Wide trees: a chain over 1024 ranks, then a cycle in it.
        let mut wide: [u16; 1024] = core::array::from_fn(|r| if r == 0 { TREE_ROOT_WIDE } else { r as u16 - 1 });
        assert!(tree_valid_by(1024, |r| wide[r]));
        wide[1] = 1000;
        assert!(!tree_valid_by(1024, |r| wide[r]));
    }

    #[test]
    fn relative_ranks() {
        for n in 1..20u16 {
            for root in 0..n {
                for r in 0..n {
                    assert_eq!(abs_rank(rel_rank(r, root, n), root, n), r);
                }
                assert_eq!(rel_rank(root, root, n), 0);
            }
        }
    }
}
