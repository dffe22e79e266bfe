//! Host-based collectives: the host runs the algorithm, each step a tagged
//! send or receive through the NIC (seed 001's "HB" baselines; MPICH over
//! GM did the same). A [`Comm`] is an ordered list of endpoints plus this
//! process's rank in it; every member makes the same calls in the same
//! order (the MPI communicator rule).
//!
//! ```no_run
//! # fn main() -> emp::Result<()> {
//! use emp::coll::{Comm, Dtype, ReduceOp};
//! let mut dev = emp::Device::open()?;
//! let job = emp::rdv::Job::from_env()?;
//! let members = job.endpoints(dev.endpoint())?;
//! let mut comm = Comm::new(&mut dev, &members, job.rank)?;
//! comm.barrier_dissemination(&mut dev)?;
//! let mine = (job.rank as i64).to_le_bytes();
//! let mut sum = [0u8; 8];
//! comm.allreduce(&mut dev, Dtype::I64, ReduceOp::Sum, &mine, &mut sum)?;
//! # Ok(()) }
//! ```
//!
//! **Messages.** Every message of a call carries the call's sequence
//! number in its tag ([`tag`]), so back-to-back calls never mix, and every
//! receive names its source. All receives a call can pre-post are posted
//! when the call starts, so the only unexpected messages are those of a
//! peer already in the next call (the NIC refuses them and the sender
//! resends once the receive is posted).
//!
//! **Completion.** A barrier returns when its last required message has
//! arrived, without waiting for its own last send to be acknowledged
//! (seed 001 §3.5.4); such sends are reaped later. A broadcast returns when
//! every child has the data (the buffer is the caller's again). Outstanding
//! sends of a `Comm` keep work request ids under [`HOST_PREFIX`]: call
//! [`Comm::flush`] before polling the CQ yourself, or skip those ids.
//!
//! **Waiting** is [`Wait::Block`] (spin briefly, then arm and sleep on the
//! port's event; for ranks that outnumber cores) or [`Wait::Poll`] (poll
//! the CQ, yielding the CPU between empty polls; MPICH's way).
//!
//! **Reductions** run on the binomial tree over ranks relative to the root,
//! in the fixed combining order of [`super::reduce::reduce_ref`], so a
//! result is bit-identical to the NIC's and the same on every rank. Vectors
//! longer than [`CommOpts::segment_bytes`] go in segments (elementwise
//! operations, so segmenting does not change a bit).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use emp_uapi::coll::{abs_rank, rel_rank, BarrierAlgo, CollKind, Dtype, ReduceOp, Step};

use super::reduce;
use crate::schedule::barrier_schedule;
use crate::tree::Tree;
use crate::{Buffer, Completion, Device, Endpoint, Error, MemSpan, Result, Sge, Status};

/// Top byte of the tags and work request ids of host collectives: bit 63
/// (library-internal) set, and distinct from [`crate::rdv::BARRIER_TAG`]'s
/// 0xEB and from `Job::barrier`'s work request ids (bit 61 clear).
pub const HOST_PREFIX: u64 = 0xEC << 56;

/// The tag of a host-collective message:
/// `HOST_PREFIX | kind << 48 | round << 40 | context << 32 | seq`.
pub const fn tag(kind: CollKind, round: u8, context: u8, seq: u32) -> u64 {
    HOST_PREFIX | (kind as u64) << 48 | (round as u64) << 40 | (context as u64) << 32 | seq as u64
}

/// How a [`Comm`] waits for its completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Poll the completion queue, yielding the CPU between empty polls.
    Poll,
    /// Spin briefly, then arm the port and sleep on its event descriptor
    /// ([`Device::wait_wr`]).
    Block,
}

/// Options of a [`Comm`].
#[derive(Clone, Debug)]
pub struct CommOpts {
    /// Tells communicators over the same endpoints apart (in every tag and
    /// work request id). Default 0.
    pub context: u8,
    /// How to wait. Default [`Wait::Block`].
    pub wait: Wait,
    /// Longest a call may take before it fails with [`Error::Collective`].
    /// Default 60 s.
    pub timeout: Duration,
    /// Reduction segment (bytes, a multiple of 8): vectors go up and down
    /// the tree in pieces of this size. Registered scratch memory of
    /// `segment_bytes × (max children + 2)` is taken from the device's
    /// arena once, when the `Comm` is made. Default 32 KiB.
    pub segment_bytes: usize,
}

impl Default for CommOpts {
    fn default() -> Self {
        CommOpts { context: 0, wait: Wait::Block, timeout: Duration::from_secs(60), segment_bytes: 32 << 10 }
    }
}

/// A send not yet known to be complete.
#[derive(Clone, Copy, Debug)]
struct Pending {
    wr: u64,
    to: u16,
    /// The NIC reads the scratch area for it.
    scratch: bool,
}

/// A communicator for host-based collectives: the members' endpoints in
/// rank order and this process's rank.
pub struct Comm {
    members: Vec<Endpoint>,
    rank: usize,
    opts: CommOpts,
    /// Sequence number of the next message group (one per call, one per
    /// segment of a reduction).
    seq: u32,
    /// Low bits of the next work request id.
    wr_next: u64,
    sends: VecDeque<Pending>,
    binomial: Arc<Tree>,
    /// `slots × slot` bytes: 0 = accumulator, 1 = result from the parent,
    /// 2.. = partials from the children.
    scratch: Buffer,
    slot: usize,
    /// The running call (for error messages) and when it must be done.
    call: &'static str,
    call_seq: u32,
    deadline: Instant,
}

/// Sends kept outstanding before the oldest is waited for.
const SENDS_OUTSTANDING_MAX: usize = 64;

impl Comm {
    /// A communicator with default options. `members[rank]` must be `dev`'s
    /// endpoint.
    pub fn new(dev: &mut Device, members: &[Endpoint], rank: usize) -> Result<Comm> {
        Comm::with_opts(dev, members, rank, CommOpts::default())
    }

    /// A communicator with options (allocates its scratch from `dev`'s
    /// arena, which is never returned before the device closes).
    pub fn with_opts(dev: &mut Device, members: &[Endpoint], rank: usize, opts: CommOpts) -> Result<Comm> {
        let n = members.len();
        let bad = |s: String| Err(Error::InvalidArgument(s));
        if n == 0 || n > 1 << 16 {
            return bad(format!("a communicator has 1..=65536 members, not {n}"));
        }
        if rank >= n {
            return bad(format!("rank {rank} of {n} members"));
        }
        if members[rank] != dev.endpoint() {
            return bad(format!("member {rank} is {}, but this device is {}", members[rank], dev.endpoint()));
        }
        let mut sorted = members.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return bad(format!("endpoint {} is a member twice", w[0]));
        }
        if opts.segment_bytes == 0 || !opts.segment_bytes.is_multiple_of(8) || opts.segment_bytes > 1 << 30 {
            return bad(format!("segment_bytes {} must be a multiple of 8 in 8..=1 GiB", opts.segment_bytes));
        }
        let binomial = Arc::new(Tree::binomial(n));
        let slots = binomial.max_degree() + 2;
        let scratch = dev.alloc(slots * opts.segment_bytes)?;
        Ok(Comm {
            members: members.to_vec(),
            rank,
            slot: opts.segment_bytes,
            opts,
            seq: 0,
            wr_next: 0,
            sends: VecDeque::new(),
            binomial,
            scratch,
            call: "",
            call_seq: 0,
            deadline: Instant::now(),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The members' endpoints, in rank order.
    pub fn members(&self) -> &[Endpoint] {
        &self.members
    }

    /// The options.
    pub fn opts(&self) -> &CommOpts {
        &self.opts
    }

    /// Changes how calls wait.
    pub fn set_wait(&mut self, wait: Wait) {
        self.opts.wait = wait;
    }

    /// The binomial tree (over ranks relative to a root) that
    /// [`Comm::bcast_binomial`], [`Comm::reduce`] and [`Comm::allreduce`] use.
    pub fn binomial(&self) -> &Tree {
        &self.binomial
    }

    /// Sends still outstanding (posted, completion not yet seen).
    pub fn outstanding(&self) -> usize {
        self.sends.len()
    }

    /// Waits until every send this communicator posted has completed, so no
    /// completion of it is left in the CQ.
    pub fn flush(&mut self, dev: &mut Device) -> Result<()> {
        self.begin_call("flush");
        self.reap(dev, |_| true)
    }

    // ---- Barriers -------------------------------------------------------

    /// Pairwise-exchange barrier (MPICH's; seed 001 §3.3.1), on
    /// [`barrier_schedule`].
    pub fn barrier_pe(&mut self, dev: &mut Device) -> Result<()> {
        self.barrier_scheduled(dev, BarrierAlgo::PairwiseExchange, CollKind::BarrierPe, "barrier_pe")
    }

    /// Dissemination barrier: ⌈log2 N⌉ rounds for any N.
    pub fn barrier_dissemination(&mut self, dev: &mut Device) -> Result<()> {
        self.barrier_scheduled(dev, BarrierAlgo::Dissemination, CollKind::BarrierDiss, "barrier_dissemination")
    }

    fn barrier_scheduled(
        &mut self,
        dev: &mut Device,
        algo: BarrierAlgo,
        kind: CollKind,
        name: &'static str,
    ) -> Result<()> {
        let seq = self.begin(dev, name)?;
        let ctx = self.opts.context;
        let steps = barrier_schedule(algo, self.size(), self.rank);
        let mut recvs = Vec::with_capacity(steps.len());
        for s in &steps {
            if let Step::Recv { from, round } = *s {
                recvs.push(self.post_recv(dev, from as usize, tag(kind, round, ctx, seq), &[])?);
            }
        }
        let mut next = 0;
        for s in &steps {
            match *s {
                Step::Send { to, round } => self.post_send(dev, to as usize, tag(kind, round, ctx, seq), &[], false)?,
                Step::Recv { from, round } => {
                    let wr = recvs[next];
                    next += 1;
                    self.wait_recv(dev, wr, 0, &|| format!("arrival of rank {from} (round {round})"))?;
                }
            }
        }
        debug_assert_eq!(next, recvs.len());
        self.reap_done(dev)
    }

    /// Gather-release barrier over `tree` (ranks relative to rank 0, e.g.
    /// [`Tree::postal`]): each rank waits for its children, tells its
    /// parent; the root then releases down the tree.
    pub fn barrier_gb(&mut self, dev: &mut Device, tree: &Tree) -> Result<()> {
        self.check_tree(tree)?;
        let seq = self.begin(dev, "barrier_gb")?;
        let ctx = self.opts.context;
        let (gather, release) = (tag(CollKind::BarrierGather, 0, ctx, seq), tag(CollKind::BarrierRelease, 0, ctx, seq));
        let me = self.rank;
        let kids = &tree.children[me];
        let parent = tree.parent[me].map(usize::from);
        let mut from_kids = Vec::with_capacity(kids.len());
        for &c in kids {
            from_kids.push(self.post_recv(dev, c as usize, gather, &[])?);
        }
        let released = match parent {
            Some(p) => Some(self.post_recv(dev, p, release, &[])?),
            None => None,
        };
        for (&c, &wr) in kids.iter().zip(&from_kids) {
            self.wait_recv(dev, wr, 0, &|| format!("gather from child {c}"))?;
        }
        if let (Some(p), Some(wr)) = (parent, released) {
            self.post_send(dev, p, gather, &[], false)?;
            self.wait_recv(dev, wr, 0, &|| format!("release from parent {p}"))?;
        }
        for &c in kids {
            self.post_send(dev, c as usize, release, &[], false)?;
        }
        self.reap_done(dev)
    }

    // ---- Broadcast ------------------------------------------------------

    /// Binomial broadcast of `buf` from `root` (MPICH's): a non-root rank
    /// receives the whole message from its parent, then sends it to its
    /// children, largest subtree first, all inside the call.
    pub fn bcast_binomial(&mut self, dev: &mut Device, root: usize, buf: impl Into<MemSpan>) -> Result<()> {
        let tree = Arc::clone(&self.binomial);
        self.bcast_tree(dev, root, &tree, buf)
    }

    /// Broadcast of `buf` from `root` down `tree` (ranks relative to the
    /// root, e.g. [`Tree::postal`]), each rank forwarding the whole message
    /// to its children in the tree's send order. Returns when this rank has
    /// the data and all its children have acknowledged it.
    pub fn bcast_tree(&mut self, dev: &mut Device, root: usize, tree: &Tree, buf: impl Into<MemSpan>) -> Result<()> {
        let buf = buf.into();
        self.check_tree(tree)?;
        let n = self.size();
        if root >= n {
            return Err(Error::InvalidArgument(format!("bcast root {root} of {n} ranks")));
        }
        let seq = self.begin(dev, "bcast")?;
        let t = tag(CollKind::Bcast, 0, self.opts.context, seq);
        let me = rel_rank(self.rank as u16, root as u16, n as u16) as usize;
        let abs = |rel: u16| abs_rank(rel, root as u16, n as u16) as usize;
        let sges: &[Sge] = &if buf.is_empty() { vec![] } else { vec![buf.sge(0, buf.len())] };
        if let Some(p) = tree.parent[me] {
            let from = abs(p);
            let wr = self.post_recv(dev, from, t, sges)?;
            self.wait_recv(dev, wr, buf.len(), &|| format!("data from parent {from}"))?;
        }
        for &c in &tree.children[me] {
            self.post_send(dev, abs(c), t, sges, false)?;
        }
        // The caller may reuse the buffer once every child holds it.
        self.reap(dev, |_| true)
    }

    // ---- Reductions -----------------------------------------------------

    /// Reduces every rank's `send` to `root` with `op` on elements of `t`
    /// (binomial tree, fixed combining order). `recv` must be given at the
    /// root, as long as `send`; other ranks may pass `None`.
    pub fn reduce(
        &mut self,
        dev: &mut Device,
        root: usize,
        t: Dtype,
        op: ReduceOp,
        send: &[u8],
        recv: Option<&mut [u8]>,
    ) -> Result<()> {
        let n = self.size();
        if root >= n {
            return Err(Error::InvalidArgument(format!("reduce root {root} of {n} ranks")));
        }
        reduce::check(t, op, send.len())?;
        let recv = match recv {
            Some(r) if r.len() == send.len() => Some(r),
            Some(r) if self.rank == root => {
                return Err(Error::InvalidArgument(format!(
                    "reduce: result buffer of {} bytes for {} bytes",
                    r.len(),
                    send.len()
                )))
            }
            None if self.rank == root => {
                return Err(Error::InvalidArgument("reduce: the root needs a result buffer".into()))
            }
            _ => None,
        };
        self.begin(dev, "reduce")?;
        self.reduce_segments(dev, root, t, op, send, recv, false)
    }

    /// Every rank gets the reduction of all ranks' `send` in `recv`:
    /// binomial reduce to rank 0 (fixed combining order), then a binomial
    /// broadcast of the result. Bit-identical on every rank.
    pub fn allreduce(&mut self, dev: &mut Device, t: Dtype, op: ReduceOp, send: &[u8], recv: &mut [u8]) -> Result<()> {
        reduce::check(t, op, send.len())?;
        if recv.len() != send.len() {
            return Err(Error::InvalidArgument(format!(
                "allreduce: result buffer of {} bytes for {} bytes",
                recv.len(),
                send.len()
            )));
        }
        self.begin(dev, "allreduce")?;
        self.reduce_segments(dev, 0, t, op, send, Some(recv), true)
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce_segments(
        &mut self,
        dev: &mut Device,
        root: usize,
        t: Dtype,
        op: ReduceOp,
        send: &[u8],
        mut recv: Option<&mut [u8]>,
        down: bool,
    ) -> Result<()> {
        let seg = self.slot - self.slot % t.size();
        let mut off = 0;
        while off < send.len() {
            let len = seg.min(send.len() - off);
            let out = recv.as_deref_mut().map(|r| &mut r[off..off + len]);
            self.reduce_segment(dev, root, t, op, &send[off..off + len], out, down)?;
            off += len;
        }
        self.reap_done(dev)
    }

    /// One segment: partials up the binomial tree in ascending child order,
    /// and with `down` the result back down it.
    #[allow(clippy::too_many_arguments)]
    fn reduce_segment(
        &mut self,
        dev: &mut Device,
        root: usize,
        t: Dtype,
        op: ReduceOp,
        mine: &[u8],
        out: Option<&mut [u8]>,
        down: bool,
    ) -> Result<()> {
        let n = self.size() as u16;
        let seq = self.next_seq();
        let ctx = self.opts.context;
        let (up, result) = (tag(CollKind::ReduceUp, 0, ctx, seq), tag(CollKind::AllreduceDown, 0, ctx, seq));
        let len = mine.len();
        let me = rel_rank(self.rank as u16, root as u16, n) as usize;
        let abs = |rel: u16| abs_rank(rel, root as u16, n) as usize;
        let tree = Arc::clone(&self.binomial);
        let (kids, parent) = (&tree.children[me], tree.parent[me].map(abs));
        // Nothing may still be reading the scratch area we are about to reuse.
        self.reap(dev, |p| p.scratch)?;
        let mut partials = Vec::with_capacity(kids.len());
        for (i, &c) in kids.iter().enumerate() {
            let sge = self.scratch.sge((2 + i) * self.slot, len);
            partials.push(self.post_recv(dev, abs(c), up, &[sge])?);
        }
        let from_parent = match (down, parent) {
            (true, Some(p)) => Some(self.post_recv(dev, p, result, &[self.scratch.sge(self.slot, len)])?),
            _ => None,
        };
        let slot = self.slot;
        // Only slices of slots the NIC is done with are ever formed.
        self.scratch.as_mut_slice()[..len].copy_from_slice(mine);
        for (i, (&c, &wr)) in kids.iter().zip(&partials).enumerate() {
            self.wait_recv(dev, wr, len, &|| format!("partial result from rank {}", abs(c)))?;
            // Accumulator (slot 0) and partial (slot 2 + i) never overlap.
            let (acc, partials) = self.scratch.as_mut_slice().split_at_mut(2 * slot);
            reduce::combine(t, op, &mut acc[..len], &partials[i * slot..i * slot + len])?;
        }
        let acc_sge = self.scratch.sge(0, len);
        if let Some(p) = parent {
            self.post_send(dev, p, up, &[acc_sge], true)?;
        }
        // Where this rank's copy of the result is: the accumulator at the
        // root, the parent's message elsewhere (allreduce only).
        let at = match (down, parent, from_parent) {
            (true, Some(p), Some(wr)) => {
                self.wait_recv(dev, wr, len, &|| format!("result from parent {p}"))?;
                slot
            }
            (true, _, _) => 0,
            (false, None, _) => 0,
            (false, Some(_), _) => return Ok(()),
        };
        if down {
            let sge = self.scratch.sge(at, len);
            for &c in kids {
                self.post_send(dev, abs(c), result, &[sge], true)?;
            }
        }
        if let Some(out) = out {
            out.copy_from_slice(&self.scratch.as_slice()[at..at + len]);
        }
        Ok(())
    }

    // ---- Plumbing -------------------------------------------------------

    fn check_tree(&self, tree: &Tree) -> Result<()> {
        if tree.len() != self.size() {
            return Err(Error::InvalidArgument(format!("a tree of {} ranks for {} members", tree.len(), self.size())));
        }
        Ok(())
    }

    fn begin_call(&mut self, name: &'static str) {
        self.call = name;
        self.call_seq = self.seq;
        self.deadline = Instant::now() + self.opts.timeout;
    }

    /// Starts a call: names it, sets its deadline, reaps finished sends,
    /// and takes its sequence number.
    fn begin(&mut self, dev: &mut Device, name: &'static str) -> Result<u32> {
        self.begin_call(name);
        self.reap_done(dev)?;
        if self.sends.len() >= SENDS_OUTSTANDING_MAX {
            self.reap_oldest(dev)?;
        }
        Ok(self.next_seq())
    }

    fn next_seq(&mut self) -> u32 {
        let s = self.seq;
        self.seq = self.seq.wrapping_add(1);
        s
    }

    fn next_wr(&mut self) -> u64 {
        let w = HOST_PREFIX | (self.opts.context as u64) << 48 | (self.wr_next & 0xFFFF_FFFF_FFFF);
        self.wr_next = self.wr_next.wrapping_add(1);
        w
    }

    fn fail(&self, what: String, cause: Error) -> Error {
        let what = format!("{} #{} (rank {} of {}): {what}", self.call, self.call_seq, self.rank, self.size());
        Error::Collective { what, cause: Box::new(cause) }
    }

    fn post_send(&mut self, dev: &mut Device, to: usize, tag: u64, sges: &[Sge], scratch: bool) -> Result<()> {
        let wr = self.next_wr();
        loop {
            match dev.post_send(wr, self.members[to], tag, sges) {
                Ok(()) => break,
                Err(Error::RingFull) if !self.sends.is_empty() => self.reap_oldest(dev)?,
                Err(Error::RingFull) => self.pause(&|| format!("send ring full (to rank {to})"))?,
                Err(e) => return Err(e),
            }
        }
        self.sends.push_back(Pending { wr, to: to as u16, scratch });
        Ok(())
    }

    fn post_recv(&mut self, dev: &mut Device, from: usize, tag: u64, sges: &[Sge]) -> Result<u64> {
        let wr = self.next_wr();
        loop {
            match dev.post_recv(wr, self.members[from], tag, 0, sges) {
                Ok(()) => return Ok(wr),
                Err(Error::RingFull) => self.pause(&|| format!("receive ring full (from rank {from})"))?,
                Err(e) => return Err(e),
            }
        }
    }

    /// Lets the NIC catch up, or fails once the call's time is up.
    fn pause(&self, what: &dyn Fn() -> String) -> Result<()> {
        if Instant::now() >= self.deadline {
            return Err(self.fail(format!("{} for {:?}", what(), self.opts.timeout), Error::Timeout));
        }
        std::thread::yield_now();
        Ok(())
    }

    /// Waits for a completion; error statuses become [`Error::Collective`].
    fn wait_wr(&mut self, dev: &mut Device, wr: u64, what: &dyn Fn() -> String) -> Result<Completion> {
        let c = match self.opts.wait {
            Wait::Block => {
                let left = self.deadline.saturating_duration_since(Instant::now());
                match dev.wait_wr(wr, Some(left)) {
                    Ok(c) => c,
                    Err(Error::Timeout) => {
                        return Err(
                            self.fail(format!("{}: nothing within {:?}", what(), self.opts.timeout), Error::Timeout)
                        )
                    }
                    Err(e) => return Err(e),
                }
            }
            Wait::Poll => loop {
                if let Some(c) = dev.poll_wr(wr) {
                    break c;
                }
                if Instant::now() >= self.deadline {
                    return Err(
                        self.fail(format!("{}: nothing within {:?}", what(), self.opts.timeout), Error::Timeout)
                    );
                }
                std::thread::yield_now();
            },
        };
        if c.status != Status::Success {
            return Err(self.fail(what(), Error::Failed(c.status)));
        }
        Ok(c)
    }

    /// Waits for a receive of exactly `len` bytes.
    fn wait_recv(&mut self, dev: &mut Device, wr: u64, len: usize, what: &dyn Fn() -> String) -> Result<()> {
        let c = self.wait_wr(dev, wr, what)?;
        if c.byte_len as usize != len || c.msg_len as usize != len {
            let why = format!("{}: {} bytes arrived, {len} expected", what(), c.msg_len);
            return Err(self.fail(why, Error::Failed(Status::CollMismatch)));
        }
        Ok(())
    }

    fn reap_oldest(&mut self, dev: &mut Device) -> Result<()> {
        if let Some(p) = self.sends.pop_front() {
            self.wait_wr(dev, p.wr, &|| format!("send to rank {}", p.to))?;
        }
        Ok(())
    }

    /// Waits for every outstanding send that `which` selects.
    fn reap(&mut self, dev: &mut Device, which: impl Fn(&Pending) -> bool) -> Result<()> {
        let mut keep = VecDeque::with_capacity(self.sends.len());
        while let Some(p) = self.sends.pop_front() {
            if which(&p) {
                self.wait_wr(dev, p.wr, &|| format!("send to rank {}", p.to))?;
            } else {
                keep.push_back(p);
            }
        }
        self.sends = keep;
        Ok(())
    }

    /// Forgets outstanding sends that have completed, without waiting.
    fn reap_done(&mut self, dev: &mut Device) -> Result<()> {
        let mut i = 0;
        while i < self.sends.len() {
            let p = self.sends[i];
            match dev.poll_wr(p.wr) {
                Some(c) if c.status != Status::Success => {
                    self.sends.remove(i);
                    return Err(self.fail(format!("send to rank {}", p.to), Error::Failed(c.status)));
                }
                Some(_) => {
                    self.sends.remove(i);
                }
                None => i += 1,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_library_internal_and_distinct() {
        assert_ne!(HOST_PREFIX >> 56, crate::rdv::BARRIER_TAG >> 56);
        assert_eq!(tag(CollKind::Bcast, 0, 0, 0) >> 63, 1);
        let mut seen = std::collections::HashSet::new();
        for kind in [
            CollKind::BarrierPe,
            CollKind::BarrierDiss,
            CollKind::BarrierGather,
            CollKind::BarrierRelease,
            CollKind::Bcast,
            CollKind::ReduceUp,
            CollKind::AllreduceDown,
        ] {
            for round in [0u8, 1, 15, 0xF0, 0xF1] {
                for ctx in [0u8, 1, 255] {
                    for seq in [0u32, 1, u32::MAX] {
                        assert!(seen.insert(tag(kind, round, ctx, seq)), "{kind:?} {round} {ctx} {seq}");
                    }
                }
            }
        }
        // Job::barrier's send ids (bit 63 | bit 62 | rank) never collide with ours.
        let job_wr = 1u64 << 63 | 1 << 62 | 0xFFFF;
        assert_ne!(job_wr >> 56, HOST_PREFIX >> 56);
    }
}
