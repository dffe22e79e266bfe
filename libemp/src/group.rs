//! Groups and NIC-offloaded collectives.
//!
//! A group is an ordered list of endpoints the NIC holds in its group
//! table, with trees the host builds once (binomial, and postal-model trees
//! for several λ, `crate::tree`). Collectives name the group; the NIC runs
//! them without the host between the post and the completion.
//!
//! Every member must create its groups, and post collectives on a group,
//! in the same order (the MPI communicator rule): the n-th collective on a
//! group is the same operation everywhere. Misuse is reported as an error
//! completion, never a hang: an unknown group, a non-member, an operator
//! undefined for the type, members disagreeing on the operation.

use std::collections::HashMap;
use std::time::Duration;

use emp_uapi::coll::{
    rbcast_tag, reduce_tag, BarrierAlgo, Dtype, RbcastAlgo, ReduceOp, GROUP_INLINE_MAX, GROUP_MEMBERS_MAX,
    MULTISEND_WINDOW, TREES_MAX, TREE_ROOT, TREE_ROOT_WIDE,
};
use emp_uapi::desc::{Opcode, Sge, WorkDesc, WD_SIGNALED};
use emp_uapi::sram::GroupEntry;
use emp_uapi::Le;

use crate::tree::Tree;
use crate::{Buffer, Completion, Device, Endpoint, Error, Result};

/// How a group is built.
#[derive(Clone, Debug)]
pub struct GroupOpts {
    /// λ of the postal-model trees stored after the binomial tree 0
    /// (at most 7; λ = 1 is the binomial tree itself).
    pub lambdas: Vec<u32>,
    /// Bounce slots for broadcasts that arrive before this member calls
    /// broadcast (application bypass; seed 001 ch. 6). 0 = none: an early
    /// broadcast then waits at the sender until the call.
    pub bounce_slots: u16,
    /// Bytes per bounce slot: broadcasts up to this size bypass the host.
    pub bounce_slot_size: u32,
}

impl Default for GroupOpts {
    fn default() -> Self {
        GroupOpts { lambdas: vec![2, 3, 4, 6, 8], bounce_slots: 4, bounce_slot_size: 16 << 10 }
    }
}

/// The cost model that picks a broadcast tree per message size: per-frame
/// NIC overhead, wire latency, link rate. `EMP_COLL_MODEL=o_ns,lat_ns,bps`
/// overrides the defaults (1 µs, 5 µs, 10 Gb/s).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// NIC overhead per frame sent or received, ns.
    pub overhead_ns: f64,
    /// One-way wire latency, ns.
    pub latency_ns: f64,
    /// Link rate, bits per second.
    pub bps: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        let env = std::env::var("EMP_COLL_MODEL").ok();
        let parsed = env.as_deref().and_then(|v| {
            let f: Vec<f64> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            (f.len() == 3 && f.iter().all(|&x| x > 0.0)).then(|| CostModel {
                overhead_ns: f[0],
                latency_ns: f[1],
                bps: f[2],
            })
        });
        parsed.unwrap_or(CostModel { overhead_ns: 1_000.0, latency_ns: 5_000.0, bps: 10e9 })
    }
}

impl CostModel {
    /// Predicted time (ns) to broadcast `len` bytes at `mtu` down `tree`,
    /// pipelined frame by frame: in the postal model one unit is a frame's
    /// send time g, and λ = (g + latency + receive overhead) / g.
    pub fn bcast_ns(&self, tree: &Tree, len: u64, mtu: u32) -> f64 {
        let frames = emp_uapi::wire::frames_for(len + emp_uapi::coll::CollHeader::SIZE as u64, mtu);
        let frame_bytes = (len as f64 / frames as f64).min(mtu as f64) + 32.0;
        let g = self.overhead_ns + frame_bytes * 8e9 / self.bps;
        let lambda = ((g + self.latency_ns + self.overhead_ns) / g).round().max(1.0) as u32;
        g * tree.pipelined_completion(lambda, frames) as f64
    }
}

/// A group as this member sees it.
#[derive(Clone, Debug)]
pub struct Group {
    slot: u32,
    id: u32,
    epoch: u32,
    rank: usize,
    members: Vec<Endpoint>,
    /// (λ, tree) per stored tree; tree 0 is binomial.
    trees: Vec<(u32, Tree)>,
    /// Reliable broadcasts larger than this go by the NIC tree broadcast.
    rbcast_threshold: usize,
}

/// Default [`Group::set_rbcast_threshold`]: the paper's window path beat
/// the binomial tree up to 32 KiB (§6.2.1); the NIC's default window
/// carries up to 16 fragments (22,208 bytes at MTU 1,500), so 16 KiB
/// stays inside it on every MTU EMP runs.
pub const RBCAST_THRESHOLD_DEFAULT: usize = 16 * 1024;

impl Group {
    /// Sets the size above which [`Device::post_rbcast`] on this group
    /// broadcasts by the NIC tree (point to point, zero copy) instead of
    /// multicast fragments through the window (§4.5). 0: always the tree.
    pub fn set_rbcast_threshold(&mut self, bytes: usize) {
        self.rbcast_threshold = bytes;
    }

    /// The size above which a reliable broadcast goes by the tree.
    pub fn rbcast_threshold(&self) -> usize {
        self.rbcast_threshold
    }

    /// This member's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Members.
    pub fn size(&self) -> usize {
        self.members.len()
    }
    /// The members, by rank.
    pub fn members(&self) -> &[Endpoint] {
        &self.members
    }
    /// Group id.
    pub fn id(&self) -> u32 {
        self.id
    }
    /// Epoch (bumped on every re-creation of the id by this process).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }
    /// The stored trees: (λ, tree); index = tree index in descriptors.
    pub fn trees(&self) -> &[(u32, Tree)] {
        &self.trees
    }

    /// The stored tree the cost model predicts fastest for `len` bytes (ties
    /// go to the lower index, the binomial tree first).
    pub fn tree_for(&self, len: u64, mtu: u32, model: &CostModel) -> u8 {
        let mut best = (0u8, f64::INFINITY);
        for (i, (_, t)) in self.trees.iter().enumerate() {
            let ns = model.bcast_ns(t, len, mtu);
            if ns < best.1 {
                best = (i as u8, ns);
            }
        }
        best.0
    }
}

/// Epochs this process used, per group id, and the bounce-slot memory of
/// its groups: the arena has no free, so memory of destroyed groups is
/// kept here and reused by the next group that fits.
#[derive(Default)]
pub(crate) struct GroupBook {
    epochs: HashMap<u32, u32>,
    /// Bounce memory of live groups, by NIC group slot.
    bounce_live: HashMap<u32, Buffer>,
    /// Bounce memory of destroyed groups.
    bounce_free: Vec<Buffer>,
}

impl std::fmt::Debug for GroupBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupBook")
            .field("epochs", &self.epochs)
            .field("bounce_live", &self.bounce_live.len())
            .field("bounce_free", &self.bounce_free.len())
            .finish()
    }
}

impl GroupBook {
    /// The smallest free bounce buffer of at least `len` bytes.
    fn take_free(&mut self, len: usize) -> Option<Buffer> {
        let i = (0..self.bounce_free.len())
            .filter(|&i| self.bounce_free[i].len() >= len)
            .min_by_key(|&i| self.bounce_free[i].len())?;
        Some(self.bounce_free.swap_remove(i))
    }
}

/// The bytes the trusted side takes for a group: `entry` with the members
/// and trees filled in, alone for up to 64 members, else followed by its
/// body (members, then the wide parent arrays; `GroupEntry::body_len`).
fn encode_group(entry: &GroupEntry, members: &[Endpoint], trees: &[(u32, Tree)]) -> Vec<u8> {
    let mut e = *entry;
    let n = members.len();
    let endpoint = |m: &Endpoint| (m.node as u32) << 16 | m.port as u32;
    let mut out = vec![0u8; GroupEntry::SIZE + e.body_len()];
    if n <= GROUP_INLINE_MAX {
        for (i, m) in members.iter().enumerate() {
            e.members[i] = endpoint(m);
        }
        for (t, (_, tree)) in trees.iter().enumerate() {
            for (r, p) in tree.parent.iter().enumerate() {
                e.parents[64 * t + r] = p.map_or(TREE_ROOT, |p| p as u8);
            }
        }
    } else {
        let body = &mut out[GroupEntry::SIZE..];
        for (i, m) in members.iter().enumerate() {
            body[4 * i..4 * i + 4].copy_from_slice(&endpoint(m).to_le_bytes());
        }
        for (t, (_, tree)) in trees.iter().enumerate() {
            for (r, p) in tree.parent.iter().enumerate() {
                let at = 4 * n + 2 * (t * n + r);
                body[at..at + 2].copy_from_slice(&p.unwrap_or(TREE_ROOT_WIDE).to_le_bytes());
            }
        }
    }
    e.put(&mut out[..GroupEntry::SIZE]);
    out
}

impl Device {
    /// Creates group `id` over `members` (this port must be one of them) on
    /// the NIC. Every member calls it with the same id and list, and then
    /// posts collectives on it in the same order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an id of 0, an empty or too long
    /// member list, or one without this port; [`Error::Nic`] when the NIC
    /// has no free group slot.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// let members: Vec<emp::Endpoint> = (0..4).map(|node| emp::Endpoint { node, port: 0 }).collect();
    /// let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// println!("rank {} of {}", g.rank(), g.size());
    /// dev.destroy_group(g)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn create_group(&mut self, id: u32, members: &[Endpoint], opts: &GroupOpts) -> Result<Group> {
        let n = members.len();
        if id == 0 || n == 0 || n > GROUP_MEMBERS_MAX {
            return Err(Error::invalid("group id must be > 0 and have 1..=1024 members"));
        }
        if opts.lambdas.len() >= TREES_MAX || opts.lambdas.contains(&0) {
            return Err(Error::invalid("at most 7 extra trees, each with λ >= 1"));
        }
        let me = self.endpoint();
        let rank = members.iter().position(|&m| m == me).ok_or_else(|| Error::invalid("this port is not a member"))?;
        let mut trees = vec![(1, Tree::postal(n, 1))];
        trees.extend(opts.lambdas.iter().map(|&l| (l, Tree::postal(n, l))));
        let epoch = {
            let e = self.groups.epochs.entry(id).or_insert(0);
            *e += 1;
            *e
        };
        let mut entry = GroupEntry {
            group_id: id,
            epoch,
            member_count: n as u16,
            my_rank: rank as u16,
            port: me.port,
            tree_count: trees.len() as u8,
            ..Default::default()
        };
        for (t, (lambda, _)) in trees.iter().enumerate() {
            entry.tree_lambda[t] = (*lambda).min(255) as u8;
        }
        let mut bounce = None;
        if opts.bounce_slots > 0 {
            let bytes = opts.bounce_slots as usize * opts.bounce_slot_size as usize;
            if opts.bounce_slot_size == 0 {
                return Err(Error::invalid("bounce slots of 0 bytes"));
            }
            let b = match self.groups.take_free(bytes) {
                Some(b) => b,
                None => self.alloc(bytes)?,
            };
            let sge = b.sge(0, bytes.min(u32::MAX as usize));
            entry.bounce_key = sge.key;
            entry.bounce_offset = sge.offset;
            entry.bounce_slots = opts.bounce_slots;
            entry.bounce_slot_size = opts.bounce_slot_size;
            bounce = Some(b);
        }
        let encoded = encode_group(&entry, members, &trees);
        let slot = match self.set_group_encoded(&encoded) {
            Ok(slot) => slot,
            Err(e) => {
                self.groups.bounce_free.extend(bounce);
                return Err(e);
            }
        };
        // Re-creating an id reuses its slot and flushes the old epoch's
        // operations, so the old bounce memory is free again.
        let old = match bounce {
            Some(b) => self.groups.bounce_live.insert(slot, b),
            None => self.groups.bounce_live.remove(&slot),
        };
        self.groups.bounce_free.extend(old);
        Ok(Group {
            slot,
            id,
            epoch,
            rank,
            members: members.to_vec(),
            trees,
            rbcast_threshold: RBCAST_THRESHOLD_DEFAULT,
        })
    }

    /// Removes a group from the NIC; its unfinished operations complete `Flushed`.
    ///
    /// # Errors
    /// [`Error::Nic`] when the NIC no longer knows the group.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// dev.destroy_group(g)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn destroy_group(&mut self, g: Group) -> Result<()> {
        self.clear_group_slot(g.slot)?;
        if let Some(b) = self.groups.bounce_live.remove(&g.slot) {
            self.groups.bounce_free.push(b);
        }
        Ok(())
    }

    fn coll_desc(wr_id: u64, opcode: Opcode, g: &Group, port: u16, tag: u64, ignore: u64, sges: &[Sge]) -> WorkDesc {
        let mut d = WorkDesc {
            wr_id,
            opcode: opcode as u8,
            flags: WD_SIGNALED,
            node: g.slot as u16,
            port,
            tag,
            ignore,
            num_sge: sges.len() as u8,
            ..Default::default()
        };
        d.sge[..sges.len()].copy_from_slice(sges);
        d
    }

    /// Posts a barrier run by the NIC (completes in the CQ).
    ///
    /// # Errors
    /// [`Error::RingFull`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// dev.post_barrier(5, &g, emp::BarrierAlgo::Dissemination)?;
    /// let c = dev.wait_wr(5, None)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_barrier(&mut self, wr_id: u64, g: &Group, algo: BarrierAlgo) -> Result<()> {
        let d = Self::coll_desc(wr_id, Opcode::Barrier, g, algo as u16, 0, 0, &[]);
        self.post(true, &d)
    }

    /// Posts a gather-release barrier over stored tree `tree`.
    pub fn post_barrier_tree(&mut self, wr_id: u64, g: &Group, tree: u8) -> Result<()> {
        let d = Self::coll_desc(wr_id, Opcode::Barrier, g, BarrierAlgo::GatherRelease as u16, tree as u64, 0, &[]);
        self.post(true, &d)
    }

    /// Posts a reduction of `send` (`count` elements of `t`) to `root`,
    /// combined by the NIC over the binomial tree; `recv` (root only) gets the result.
    ///
    /// # Errors
    /// [`Error::InvalidOp`] for a bitwise operator on floats,
    /// [`Error::InvalidArgument`] for a length that is not whole elements,
    /// [`Error::RingFull`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// let buf = dev.alloc(64)?;
    /// let recv = (g.rank() == 0).then(|| buf.sge(32, 32));
    /// dev.post_reduce(6, &g, 0, emp::Dtype::F64, emp::ReduceOp::Sum, buf.sge(0, 32), recv)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_reduce(
        &mut self,
        wr_id: u64,
        g: &Group,
        root: usize,
        t: Dtype,
        op: ReduceOp,
        send: Sge,
        recv: Option<Sge>,
    ) -> Result<()> {
        let count = elements(t, send)?;
        let sges: Vec<Sge> = std::iter::once(send).chain(recv).collect();
        let d = Self::coll_desc(wr_id, Opcode::Reduce, g, root as u16, reduce_tag(t, op, 0), count, &sges);
        self.post(true, &d)
    }

    /// Posts an allreduce: every member's `recv` gets the combination of all
    /// `send`s, bit-identical everywhere (fixed combining order).
    ///
    /// # Errors
    /// As [`Device::post_reduce`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// let buf = dev.alloc(16)?;
    /// dev.post_allreduce(7, &g, emp::Dtype::U64, emp::ReduceOp::Max, buf.sge(0, 8), buf.sge(8, 8))?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_allreduce(
        &mut self,
        wr_id: u64,
        g: &Group,
        t: Dtype,
        op: ReduceOp,
        send: Sge,
        recv: Sge,
    ) -> Result<()> {
        let count = elements(t, send)?;
        let d = Self::coll_desc(wr_id, Opcode::Allreduce, g, 0, reduce_tag(t, op, 0), count, &[send, recv]);
        self.post(true, &d)
    }

    /// Posts a broadcast of `sges` from `root` down stored tree `tree`,
    /// forwarded NIC to NIC (the root's `sges` are the source, everyone
    /// else's the destination; lengths must agree).
    pub fn post_bcast_tree(&mut self, wr_id: u64, g: &Group, root: usize, tree: u8, sges: &[Sge]) -> Result<()> {
        if sges.len() > emp_uapi::desc::SGE_MAX {
            return Err(Error::TooManySges);
        }
        let d = Self::coll_desc(wr_id, Opcode::Bcast, g, root as u16, tree as u64, 0, sges);
        self.post(true, &d)
    }

    /// Posts a broadcast over the tree the cost model picks for its size.
    ///
    /// # Errors
    /// [`Error::RingFull`], [`Error::TooManySges`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// let buf = dev.alloc(1 << 20)?;
    /// dev.post_bcast(8, &g, 0, &[buf.sge(0, 1 << 20)])?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_bcast(&mut self, wr_id: u64, g: &Group, root: usize, sges: &[Sge]) -> Result<()> {
        let len: u64 = sges.iter().map(|s| s.len as u64).sum();
        let tree = g.tree_for(len, self.info().mtu, &CostModel::default());
        self.post_bcast_tree(wr_id, g, root, tree, sges)
    }

    /// Posts a reliable broadcast of `sges` from `root` over wire
    /// multicast (seed 002), with algorithm `algo` (co-roots, ACK every M,
    /// window, NAKs: [`RbcastAlgo`]): the root's NIC copies the data into its window, multicasts
    /// it once and completes the root's post at once; the others' posts
    /// complete with the data, in the root's order, exactly once. A message
    /// larger than one frame ([`emp_uapi::wire::rbcast_payload_max`]) goes
    /// in MTU fragments through the window, up to the group's
    /// [`Group::rbcast_threshold`]; above it, by the NIC tree broadcast
    /// ([`Device::post_bcast`], `algo` unused). Fragments beyond the NIC's
    /// window or receive slots: `Status::TooLarge`. Groups of up to
    /// [`emp_uapi::coll::RBCAST_MEMBERS_MAX`] (1024) members. Every member's
    /// `sges` have the same total length (so all take the same path).
    ///
    /// # Errors
    /// [`Error::RingFull`], [`Error::TooManySges`], [`Error::InvalidArgument`]
    /// when `root` is not a rank or `algo` has more co-roots than members.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// let buf = dev.alloc(256)?;
    /// let algo = emp::RbcastAlgo { coroots: 0, ack_every: 4, window: 0, nak: false };
    /// dev.post_rbcast(8, &g, 0, algo, &[buf.sge(0, 256)])?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_rbcast(&mut self, wr_id: u64, g: &Group, root: usize, algo: RbcastAlgo, sges: &[Sge]) -> Result<()> {
        if sges.len() > emp_uapi::desc::SGE_MAX {
            return Err(Error::TooManySges);
        }
        if root >= g.size() || algo.coroots as usize >= g.size() {
            return Err(Error::invalid("reliable broadcast: root or co-roots beyond the group"));
        }
        let len: u64 = sges.iter().map(|s| s.len as u64).sum();
        if len > g.rbcast_threshold as u64 {
            return self.post_bcast(wr_id, g, root, sges);
        }
        let d = Self::coll_desc(wr_id, Opcode::Rbcast, g, root as u16, rbcast_tag(algo), 0, sges);
        self.post(true, &d)
    }

    /// Blocking reliable broadcast (see [`Device::post_rbcast`]): the root
    /// returns once its NIC holds the data, the others once it arrived.
    ///
    /// # Errors
    /// As [`Device::post_rbcast`], and [`Error::Failed`] with the
    /// completion's status.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// let buf = dev.alloc(64)?;
    /// dev.rbcast(&g, 0, emp::RbcastAlgo::default(), &[buf.sge(0, 64)])?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn rbcast(&mut self, g: &Group, root: usize, algo: RbcastAlgo, sges: &[Sge]) -> Result<()> {
        let wr = self.internal_wr();
        self.post_rbcast(wr, g, root, algo, sges)?;
        self.wait_ok(wr, None).map(|_| ())
    }

    /// Posts one message with `tag` to the members whose ranks are set in
    /// `ranks` (not this member), matched by their ordinary receives; the
    /// payload is read once. Completes once: first failure, and in
    /// `msg_len` the number of destinations that failed.
    ///
    /// # Errors
    /// [`Error::RingFull`], [`Error::TooManySges`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// let buf = dev.alloc(64)?;
    /// dev.post_multisend(9, &g, 0b10, 42, &[buf.sge(0, 64)])?; // to rank 1
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_multisend(&mut self, wr_id: u64, g: &Group, ranks: u64, tag: u64, sges: &[Sge]) -> Result<()> {
        self.post_multisend_window(wr_id, g, 0, ranks, tag, sges)
    }

    /// As [`Device::post_multisend`] to ranks past the first 64: bit i of
    /// `ranks` is rank 64 · `window` + i (a group of up to 1024 members has
    /// windows 0..16; one descriptor reaches one window).
    ///
    /// # Errors
    /// [`Error::RingFull`], [`Error::TooManySges`], [`Error::InvalidArgument`]
    /// for a window past the group's end.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members: Vec<emp::Endpoint> = (0..100).map(|node| emp::Endpoint { node, port: 0 }).collect();
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// let buf = dev.alloc(64)?;
    /// dev.post_multisend_window(9, &g, 1, 0b1, 42, &[buf.sge(0, 64)])?; // to rank 64
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_multisend_window(
        &mut self,
        wr_id: u64,
        g: &Group,
        window: u16,
        ranks: u64,
        tag: u64,
        sges: &[Sge],
    ) -> Result<()> {
        if sges.len() > emp_uapi::desc::SGE_MAX {
            return Err(Error::TooManySges);
        }
        if ranks == 0 {
            return Err(Error::invalid("multisend without destinations"));
        }
        if window as usize * MULTISEND_WINDOW >= g.size() {
            return Err(Error::invalid(format!("multisend window {window} is past the group's {} members", g.size())));
        }
        let d = Self::coll_desc(wr_id, Opcode::MultiSend, g, window, tag, ranks, sges);
        self.post(true, &d)
    }

    /// Blocking broadcast (see [`Device::post_bcast`]).
    ///
    /// # Errors
    /// As [`Device::post_bcast`], and [`Error::Failed`] with the
    /// completion's status.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// let buf = dev.alloc(4096)?;
    /// dev.bcast(&g, 0, &[buf.sge(0, 4096)])?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn bcast(&mut self, g: &Group, root: usize, sges: &[Sge]) -> Result<()> {
        let wr = self.internal_wr();
        self.post_bcast(wr, g, root, sges)?;
        self.wait_ok(wr, None).map(|_| ())
    }

    /// Waits for `wr_id` and turns an error status into an error.
    fn wait_ok(&mut self, wr_id: u64, timeout: Option<Duration>) -> Result<Completion> {
        let c = self.wait_wr(wr_id, timeout)?;
        match c.status {
            emp_uapi::desc::Status::Success => Ok(c),
            st => Err(Error::Failed(st)),
        }
    }

    /// Blocking barrier (waits on the port's event when armed, no spinning).
    ///
    /// # Errors
    /// [`Error::RingFull`], and [`Error::Failed`] with the completion's
    /// status.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// dev.barrier(&g, emp::BarrierAlgo::PairwiseExchange)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn barrier(&mut self, g: &Group, algo: BarrierAlgo) -> Result<()> {
        let wr = self.internal_wr();
        self.post_barrier(wr, g, algo)?;
        self.wait_ok(wr, None).map(|_| ())
    }

    /// Blocking reduce to `root`, of any length: vectors longer than one
    /// NIC reduction carries ([`Device::reduce_chunk_bytes`]) run as
    /// consecutive NIC reductions of that size, several in flight.
    ///
    /// # Errors
    /// As [`Device::post_reduce`], and [`Error::Failed`] with the
    /// completion's status.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// let buf = dev.alloc(1 << 16)?;
    /// let recv = (g.rank() == 0).then(|| buf.sge(1 << 15, 1 << 15));
    /// dev.reduce(&g, 0, emp::Dtype::I32, emp::ReduceOp::Sum, buf.sge(0, 1 << 15), recv)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn reduce(
        &mut self,
        g: &Group,
        root: usize,
        t: Dtype,
        op: ReduceOp,
        send: Sge,
        recv: Option<Sge>,
    ) -> Result<()> {
        self.reduce_chunked(g, Some(root), t, op, send, recv)
    }

    /// Blocking allreduce, of any length (chunked as [`Device::reduce`]).
    ///
    /// # Errors
    /// As [`Device::reduce`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let members = [emp::Endpoint { node: 0, port: 0 }, emp::Endpoint { node: 1, port: 0 }];
    /// # let g = dev.create_group(1, &members, &emp::GroupOpts::default())?;
    /// let mut buf = dev.alloc(16)?;
    /// buf.as_mut_slice()[..8].copy_from_slice(&1.5f64.to_le_bytes());
    /// dev.allreduce(&g, emp::Dtype::F64, emp::ReduceOp::Sum, buf.sge(0, 8), buf.sge(8, 8))?;
    /// let sum = f64::from_le_bytes(buf.as_slice()[8..16].try_into().unwrap());
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn allreduce(&mut self, g: &Group, t: Dtype, op: ReduceOp, send: Sge, recv: Sge) -> Result<()> {
        self.reduce_chunked(g, None, t, op, send, Some(recv))
    }

    /// Largest vector, in bytes of `t`, that one posted reduction carries:
    /// it travels in one frame and is combined in one NIC partial buffer
    /// ([`REDUCE_BUF_BYTES`]). Longer ones fail `TooLarge` when posted;
    /// the blocking calls split them.
    pub fn reduce_chunk_bytes(&self, t: Dtype) -> usize {
        let frame = emp_uapi::wire::payload_capacity(self.info().mtu, 0) - emp_uapi::coll::CollHeader::SIZE;
        let bytes = frame.min(REDUCE_BUF_BYTES);
        bytes - bytes % t.size()
    }

    /// Reduce (`root` given) or allreduce (`None`) as consecutive NIC
    /// reductions of at most [`Device::reduce_chunk_bytes`]. Every member
    /// splits the same length the same way (the split depends only on the
    /// length and the MTU), so the n-th chunk is the same instance
    /// everywhere. Up to [`REDUCE_CHUNKS_IN_FLIGHT`] are posted ahead so
    /// the NICs pipeline them; every posted chunk is waited for, even
    /// after a failure, so no completion is left behind.
    fn reduce_chunked(
        &mut self,
        g: &Group,
        root: Option<usize>,
        t: Dtype,
        op: ReduceOp,
        send: Sge,
        recv: Option<Sge>,
    ) -> Result<()> {
        elements(t, send)?;
        if recv.is_some_and(|r| r.len != send.len) {
            return Err(Error::invalid("the result buffer must be as long as the operand"));
        }
        let chunk = self.reduce_chunk_bytes(t) as u32;
        let mut in_flight = std::collections::VecDeque::with_capacity(REDUCE_CHUNKS_IN_FLIGHT);
        let mut first_error = None;
        let mut done = 0u32;
        while done < send.len && first_error.is_none() {
            if in_flight.len() == REDUCE_CHUNKS_IN_FLIGHT {
                let wr = in_flight.pop_front().expect("full");
                if let Err(e) = self.wait_ok(wr, None) {
                    first_error = Some(e);
                    break;
                }
            }
            let len = chunk.min(send.len - done);
            let part = |s: Sge| Sge { offset: s.offset + done as u64, len, ..s };
            let wr = self.internal_wr();
            let posted = match root {
                Some(root) => self.post_reduce(wr, g, root, t, op, part(send), recv.map(part)),
                None => {
                    self.post_allreduce(wr, g, t, op, part(send), part(recv.expect("allreduce has a result buffer")))
                }
            };
            match posted {
                Ok(()) => in_flight.push_back(wr),
                Err(Error::RingFull) if !in_flight.is_empty() => {
                    // Retry this chunk once the oldest one is done.
                    let wr = in_flight.pop_front().expect("not empty");
                    if let Err(e) = self.wait_ok(wr, None) {
                        first_error = Some(e);
                    }
                    continue;
                }
                Err(e) => {
                    first_error = Some(e);
                    break;
                }
            }
            done += len;
        }
        for wr in in_flight {
            let r = self.wait_ok(wr, None);
            if let (Err(e), None) = (r, &first_error) {
                first_error = Some(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Bytes of one NIC partial-result buffer (the control program's default
/// `coll_buf_size`): the most one posted reduction combines.
pub const REDUCE_BUF_BYTES: usize = 8192;

/// Chunks of a long blocking reduction posted ahead (the NIC's default
/// per-group window of collectives in flight).
pub const REDUCE_CHUNKS_IN_FLIGHT: usize = 8;

/// Elements of `t` in `s`.
fn elements(t: Dtype, s: Sge) -> Result<u64> {
    if s.len == 0 || s.len as usize % t.size() != 0 {
        return Err(Error::invalid("buffer length is not a positive multiple of the element size"));
    }
    Ok((s.len as usize / t.size()) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use emp_uapi::sram::GroupView;

    /// What `create_group` hands the trusted side passes its checks, inline
    /// up to 64 members and with a body beyond, and names the same members
    /// and trees either way.
    #[test]
    fn encoded_groups_pass_the_trusted_sides_checks_at_every_size() {
        for n in [1usize, 2, 64, 65, 300, GROUP_MEMBERS_MAX] {
            let members: Vec<Endpoint> = (0..n).map(|i| Endpoint { node: (i * 3) as u16, port: 1 }).collect();
            let trees = vec![(1, Tree::postal(n, 1)), (4, Tree::postal(n, 4))];
            let rank = n / 2;
            let entry = GroupEntry {
                group_id: 3,
                epoch: 1,
                member_count: n as u16,
                my_rank: rank as u16,
                port: 1,
                tree_count: 2,
                ..Default::default()
            };
            let bytes = encode_group(&entry, &members, &trees);
            assert_eq!(bytes.len(), GroupEntry::SIZE + entry.body_len(), "n={n}");
            let e = GroupEntry::get(&bytes);
            let v = GroupView { entry: &e, body: &bytes[GroupEntry::SIZE..] };
            let caller = ((rank * 3) as u32) << 16 | 1;
            assert_eq!(v.check(caller), Ok(()), "n={n}");
            for (r, m) in members.iter().enumerate() {
                assert_eq!(v.member(r), (m.node as u32) << 16 | 1, "n={n} member {r}");
                for (t, (_, tree)) in trees.iter().enumerate() {
                    assert_eq!(v.parent(t, r), tree.parent[r].unwrap_or(TREE_ROOT_WIDE), "n={n} tree {t}");
                }
            }
        }
    }
}
