//! The EMP control program: the protocol a NIC runs, as a sans-IO state
//! machine. It owns no threads, sockets or clocks. Effects go out through a
//! [`Hal`] (SRAM, DMA, MAC, interrupts); inputs come in through the
//! `handle_*` methods, each given the current time; the caller asks
//! [`Nic::poll_timeout`] when to call [`Nic::handle_timeout`] next.
//!
//! Calling order for a driver (the simulator, the NIC daemon):
//! 1. [`Nic::boot`] once, after the firmware image was accepted;
//! 2. [`Nic::handle_doorbell`] when the host may have written the admin
//!    mailbox or a ring (or periodically, when polling);
//! 3. [`Nic::handle_frame`] for every frame the MAC received;
//! 4. [`Nic::handle_timeout`] when `poll_timeout()` has passed.
//!
//! A driver that runs the NIC's CPUs on threads may call the sides' entry
//! points instead, each holding one side of the program (`sides.rs`:
//! [`Nic::recv_side_frames`], [`Nic::recv_side_doorbell`],
//! [`Nic::send_side_doorbell`], [`Nic::send_side_cpu`]), and the whole
//! program's for what they leave.
//!
//! The protocol is the EMP thesis' (seed 004 ch. 2): tagged messages to
//! (node, port) endpoints, pre-posted receives matched on (source, tag) with
//! wildcards and an ignore mask in posting order, fragmentation into MTU
//! frames pulled from host memory one frame at a time, groups of frames
//! acknowledged together with a timer per group, NACKs for fast recovery,
//! and flow control either by receiver state piggybacked
//! on ACKs (EMP) or by PM's Modified ACK/NACK (seed 003 §3.3).
//!
//! A message no posted receive matches is handled by its port's
//! [`MatchMode`]: by default it is accepted as an unexpected entry (small
//! ones with their payload in a bounded eager pool, others as a retained
//! header whose data the NIC pulls from the sender with a rendezvous read
//! once a receive matches), so it blocks nothing behind it; or, as in the
//! thesis and PM, it is refused and the sender retransmits it, every later
//! message from that sender waiting behind it (plus an optional bounded
//! overflow buffer).
//!
//! Layout rule: `Nic` is one state machine split by concern; files call
//! each other through `Nic`; leaf state owns its own logic. Each file adds
//! an `impl Nic` block for its concern (`host`: rings and completions,
//! `tx`: sending, `rx`: receiving, `control`: ACK/NACK emission, `coll`:
//! collectives, `atomic`: remote atomics, `cpu`: the NIC CPU plan). The
//! records are split the way the NIC's CPUs split them (docs/nic-cpus.md):
//! the send side's (`SendSide`), the receive side's (`RecvSide`), the
//! CQs both write (`cq::Cqs`), and what the admin commands set, which both
//! only read; the receive path runs on `recv_cpu::RecvCpu`, a view that
//! reaches no send-side state, and goes to the whole `Nic` only for what
//! needs it (`RecvCpu::try_data` says when); the send path runs on
//! `send_cpu::SendCpu`, which reaches no receive-side state and stops for
//! what needs more (`send_cpu::SendStop`, `SendSide::done`). Leaf
//! records (`rx::RxMsg`, `tx::TxMsg`, `coll::CollState`) own their
//! bookkeeping and return outcomes (`RxMsg::record -> FrameOutcome`, a
//! barrier's or reduction's `next() -> Send/Deliver/Wait/Done`) rather than
//! call back. This file holds the entry points and the frame dispatcher, which
//! routes between concerns: a receive record says who owns it
//! (`rx::RxOwner`), so the receive path never calls the collective layer.
//!
//! # Files
//!
//! - `lib.rs`: [`Hal`], [`Config`], [`Nic`] and its entry points, the send
//!   and receive sides' records (`SendSide`, `RecvSide`), the frame
//!   dispatcher (`receive_frame`, `on_data`, `deliver`, `finish_rx`),
//!   [`Nic::invariants`].
//! - `peer.rs`: peer entries in three parts (the table's, the send half,
//!   the receive half) and the table that gives them out.
//! - `recv_cpu.rs`: `RecvCpu`, the receive side at work, and its
//!   hand-offs to other CPUs (a payload's DMA, a completion by a job).
//! - `send_cpu.rs`: `SendCpu`, the send side at work, and what it stops
//!   for (`SendStop`).
//! - `sides.rs`: the sides' entry points, which run each holding only its
//!   side, beside the other's, and what they leave the whole program.
//! - `sem.rs`: the semaphore, through which a side running alone reaches
//!   what both sides write (the CQs, the MR cache, the hand-offs).
//! - `cq.rs`: completions and the CQs' producer side, written by both sides.
//! - `counters.rs`: event counters, one set per side, published summed.
//! - `ffi.rs`: the C entry points a NIC loads (`emp_fw_*`, see
//!   `emp_uapi::fwabi`) and the adapter from their hardware table to `Hal`.
//! - `host.rs`: the admin mailbox, port open and close, the descriptor
//!   rings, completions.
//! - `mr.rs`: memory-region translation and DMA through it.
//! - `tx.rs`: the send side: transmission records, windows, flow control,
//!   retransmission, handling ACKs and NACKs (the send path on `SendCpu`,
//!   retransmission and NACKs on the whole program).
//! - `rx.rs`: the receive side: admitting and classifying DATA frames,
//!   matching, receive records and their frame accounting, the overflow
//!   buffer.
//! - `control.rs`: building and sending ACKs and NACKs (on `RecvCpu`).
//! - `cpu.rs`: NIC CPU plans, the jobs and work one CPU queues for another;
//!   `ring.rs`: the lock-free ring those hand-offs go through.
//! - `timer.rs`: the timer heaps: the send side's (retransmissions,
//!   probes) and the whole program's (the receive side's two timers are
//!   plain deadlines of its own). `slots.rs`: bounded tables addressed by slot.
//! - `group.rs`: the group table.
//! - `coll/mod.rs`: collective operation records (`CollOp`, `CollState`),
//!   posting, accepting collective messages, progress, completion, flush.
//!   `coll/barrier.rs`, `coll/reduce.rs`: the barrier and reduction state
//!   machines and the steps that perform them; `coll/bcast.rs`: broadcast
//!   forwarding and bounce slots; `coll/multisend.rs`: multisend;
//!   `coll/cache.rs`: the per-operation frame cache.
//! - `rbcast/`: reliable broadcast over wire multicast (seed 002): the
//!   window, per-root order, skewed lazy ACKs into ACK words, co-roots and
//!   credits (`state.rs` the per-group tables, `mod.rs` frames and steps).
//! - `combine.rs`: the reduction arithmetic.
//! - `atomic.rs`: remote atomics, requester and responder.
//! - `rma.rs`: remote write and read, initiator and target.
//! - `guard.rs`: remote-access checks (key, secret, rights, bounds), their
//!   refusal counters, and throttling a source that keeps guessing keys.
//! - `ctxsw.rs`: port context switch (PM §3.4, C1–C8): suspend, stability,
//!   saving a port into a context image, restoring it into any free slot,
//!   resume; wire addresses and parked contexts.
//!
//! The path of one message through these files, from the host's post to the
//! peer's completion, is in `docs/architecture.md`.

mod atomic;
mod coll;
mod combine;
mod control;
mod counters;
mod cpu;
mod cq;
mod ctxsw;
mod ffi;
mod group;
mod guard;
mod host;
mod image;
mod keymap;
mod linger;
pub mod mcast;
mod mr;
mod peer;
mod persist;
pub mod rbcast;
mod recv_cpu;
mod ring;
mod rma;
mod rx;
mod sem;
mod send_cpu;
mod sides;
mod slots;
mod timer;
mod tx;

use std::collections::VecDeque;

use emp_uapi::desc::{Opcode, Sge, Status, WorkDesc, SGE_MAX, WD_SIGNALED};
use emp_uapi::sram::{
    counter, ctl, FailReason, Layout, NicStatus, SramHeader, FEATURE_IMMEDIATE_SENDING, FEATURE_MODIFIED_ACK_NACK,
    FEATURE_ORDERED_REFUSAL, FEATURE_OVERFLOW,
};
use emp_uapi::wire::{self, Frame, FrameHeader, MsgHeader, NackReason, MTU_MAX};
use emp_uapi::Le;

pub use cpu::{Area, CpuStep};
pub(crate) use cq::Cqs;
pub use ctxsw::{image_checksum, IMAGE_MAGIC, IMAGE_VERSION, UNPUBLISHED_IMAGE};
pub use emp_uapi::fwabi::HostSeg;
pub(crate) use peer::{Peer, PeerRecv, PeerSend};
pub use sides::SideRun;
use timer::SendTimer;
pub use timer::TimerHeap;

use rx::{DataVerdict, RxMsg, RxOwner};

/// A failed DMA (address outside host memory, process gone, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaError;

/// What the control program needs from the hardware. The NIC daemon
/// implements it over shared memory and sockets; the simulator over byte
/// vectors and a virtual wire.
pub trait Hal {
    /// Reads SRAM bytes at `off` (the caller keeps `off + buf.len()` inside SRAM).
    fn sram_read(&mut self, off: usize, buf: &mut [u8]);
    /// Writes SRAM bytes at `off`.
    fn sram_write(&mut self, off: usize, data: &[u8]);
    /// DMA from host memory at bus address `addr` into `buf`.
    fn dma_read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    /// DMA `data` into host memory at bus address `addr`. The bytes of one
    /// write, and writes not separated by [`Hal::dma_fence`], may become
    /// visible to the host in any order.
    fn dma_write(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError>;
    /// Write barrier: every `dma_write` issued before becomes visible to the
    /// host before any issued after.
    fn dma_fence(&mut self);
    /// Puts a frame on the wire towards `dst_node` (the MAC adds its own
    /// framing from the route table).
    fn mac_transmit(&mut self, dst_node: u16, frame: &[u8]);
    /// Immediate Sending: puts a frame on the wire towards `dst_node` made
    /// of `header` followed by the host memory `payload` names, read by the
    /// NIC as it sends (never staged in NIC memory). Each segment is checked
    /// like a [`Hal::dma_read`]: if one does not resolve, nothing is sent.
    fn mac_transmit_host(&mut self, dst_node: u16, header: &[u8], payload: &[HostSeg]) -> Result<(), DmaError>;
    /// Raises MSI-X `vector` (0 = admin, 1 + port = port events).
    fn raise_interrupt(&mut self, vector: u16);
    /// The MAC starts (`join`) or stops receiving frames sent to multicast
    /// address `addr` (`mcast.rs`); hardware without a multicast filter
    /// ignores it, and the control program filters alone.
    fn mcast_membership(&mut self, _addr: u16, _join: bool) {}
    /// Signals a NIC CPU that a step was queued for it (it runs when the
    /// driver calls `handle_cpu`).
    fn cpu_event(&mut self, _cpu: u8, _event: u32) {}
    /// The control program starts `step` on NIC CPU `cpu` (`queued`: a step
    /// queued by a `cpu_event`, taken in queue order). Hardware ignores it;
    /// the simulator's per-CPU cost model charges the step there.
    fn cpu_step(&mut self, _cpu: u8, _step: CpuStep, _queued: bool) {}
}

/// Flow-control scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowControl {
    /// None: the sender relies on retransmission (the thesis' final choice).
    Off,
    /// EMP: the receiver's buffer state rides on every ACK; the sender keeps
    /// at most that many messages in flight to that receiver (at least one).
    Piggyback,
    /// PM's Modified ACK/NACK: a receiver short of buffers NACKs the message
    /// and refuses everything after it; the sender stops, then resends from
    /// the refused message, so order is kept without per-sender buffers.
    ModifiedAckNack,
}

/// What a port does with a message that matches no posted receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchMode {
    /// Accept it as an unexpected entry: a message of at most
    /// `overflow_slot_size` bytes (one frame) with its payload in the eager
    /// pool, any other (or any when the pool is full) as its header alone,
    /// the data pulled from the sender's buffer once a receive matches.
    /// Later messages from the sender go on; only when the header table is
    /// full too is it refused (flow control, counted). Posted receives
    /// search the entries in arrival order first, so messages that match
    /// the same receive keep their order (MPI's non-overtaking rule).
    Unexpected,
    /// The EMP thesis' and PM's rule: refuse it (the sender retransmits it)
    /// and hold every later message from the sender behind it; with
    /// `FEATURE_OVERFLOW`, small ones go to the overflow buffer.
    OrderedRefusal,
}

impl MatchMode {
    /// The mode `PortOpen` names (`emp_uapi::sram::match_mode`), `default`
    /// for 0; `None` for an unknown value.
    pub fn from_arg(v: u64, default: MatchMode) -> Option<MatchMode> {
        use emp_uapi::sram::match_mode as m;
        match v {
            m::DEFAULT => Some(default),
            m::UNEXPECTED => Some(MatchMode::Unexpected),
            m::ORDERED_REFUSAL => Some(MatchMode::OrderedRefusal),
            _ => None,
        }
    }

    /// The name users give it (`emp-nicd --matching`).
    pub fn name(self) -> &'static str {
        match self {
            MatchMode::Unexpected => "unexpected",
            MatchMode::OrderedRefusal => "ordered-refusal",
        }
    }
}

/// Tunables and table bounds. Every table is sized here, once.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Frames acknowledged together (EMP used 3). 1..=32. Peers must agree.
    pub group_size: u32,
    /// Unacknowledged frames in flight per peer, and how far a message's
    /// frames may run ahead of its oldest unacknowledged group (a sliding
    /// window: per-message state covers only that many frames' groups,
    /// whatever the message's length). The receiver keeps state for the
    /// same window and drops frames beyond it, so peers must agree on it,
    /// as on `group_size`.
    pub window_frames: u32,
    /// Initial retransmission timeout.
    pub rto_ns: u64,
    /// Backoff cap.
    pub rto_ns_max: u64,
    /// Retransmissions of one group before the message fails.
    pub retry_limit: u32,
    /// Delay before resending a message the receiver was not ready for;
    /// doubles with every refusal of the same message.
    pub rnr_delay_ns: u64,
    /// Cap of that delay.
    pub rnr_delay_ns_max: u64,
    /// Receiver-not-ready retries before failing (0 = forever, EMP's rule).
    pub rnr_retry_limit: u32,
    /// A partially received message with no frame for this long is aborted.
    /// Must exceed the sender's whole retry budget.
    pub rx_idle_timeout_ns: u64,
    /// Flow-control scheme.
    pub flow_control: FlowControl,
    /// Peers (local port × remote endpoint) tracked.
    pub peers_max: u32,
    /// Outstanding send messages.
    pub tx_max: u32,
    /// Messages being received.
    pub rx_max: u32,
    /// Posted receives not yet matched.
    pub recv_posted_max: u32,
    /// Overflow slots for small unexpected messages in the ordered-refusal
    /// mode (0 = EMP's pure drop; only with `FEATURE_OVERFLOW`). With it,
    /// also the eager pool's size.
    pub overflow_slots: u32,
    /// Largest message the overflow buffer or eager pool takes (the eager
    /// threshold; at most one frame's payload).
    pub overflow_slot_size: u32,
    /// Eager pool slots for small unexpected messages when the NIC has no
    /// `FEATURE_OVERFLOW` (then `overflow_slots` sizes it).
    pub unexp_slots: u32,
    /// Unexpected messages retained as a header alone (rendezvous), all ports.
    pub unexp_headers: u32,
    /// The matching mode ports open in unless their open names one.
    pub matching: MatchMode,
    /// Largest message.
    pub msg_max: u64,
    /// First port generation (vary per boot so peers can tell incarnations).
    pub gen_seed: u16,
    /// How the steps are split over the NIC CPUs (`emp_uapi::image::cpu_plan`).
    pub cpu_plan: u32,
    /// Data movement handed to another CPU goes as jobs, which that CPU can
    /// run without the program ([`Area::run_jobs`]), rather than as work.
    /// A driver running the CPUs on threads turns it on by taking the area
    /// ([`Nic::cpu_area`]); on one thread a job only costs a copy more.
    pub cpu_jobs: bool,
    /// Collective operations (posted, or known from early messages).
    pub coll_ops_max: u32,
    /// Instances of a group ahead of the host's posts whose messages are
    /// recorded; further ones are refused (the sender retries).
    pub coll_window: u32,
    /// Buffers for reduction partials that arrive before their operation is posted.
    pub coll_bufs: u32,
    /// Largest reduction vector in bytes (larger: `TooLarge`; libemp falls back to the host).
    pub coll_buf_size: u32,
    /// Outstanding remote atomic requests (all peers).
    pub atomic_max: u32,
    /// Frames of broadcast and multisend data held on the NIC until every
    /// destination has sent them (all ops; at most `window_frames` per op;
    /// 0 = none, every send reads the host).
    pub coll_cache_frames: u32,
    /// Refused remote accesses from one source node within
    /// `remote_refusal_window_ns` that throttle it (a key guesser).
    pub remote_refusals_max: u32,
    /// The window refusals are counted in.
    pub remote_refusal_window_ns: u64,
    /// How long a throttled source's remote accesses are all refused.
    pub remote_throttle_ns: u64,
    /// Outstanding remote reads (all peers).
    pub rma_reads_max: u32,
    /// How long a receiver may hold back the ACK of a wholly received
    /// message to coalesce it with the next ones' (PM's Ack(r, k) for a run
    /// i..k, seed 003 §3.3). 0: until the frames that arrived together are
    /// handled (the daemon's engine runs timers after draining its receive
    /// queue), which costs a lone message no latency.
    pub ack_delay_ns: u64,
    /// Messages whose ACK one peer may owe before it is sent at once (1 =
    /// every message is ACKed on its own). Capped at half the window, so a
    /// sender never waits for an ACK it is owed.
    pub ack_coalesce_max: u32,
    /// Fault injection, for tests that prove an order check can fail: the
    /// sender swaps the sequence numbers of a send and the one queued
    /// before it when that one has not started, so they arrive swapped.
    /// Never set outside such tests.
    pub fault_swap_sends: bool,
    /// Reliable broadcast (seed 002): window entries per group (NIC
    /// buffers of one MTU each, made when the group is loaded; 0 = no
    /// reliable broadcast).
    pub rbcast_window: u32,
    /// Reliable broadcast: receive slots per group (the pre-posted
    /// buffers of §5.4: every member's credit per member, and the
    /// out-of-order queue).
    pub rbcast_rx_slots: u32,
    /// Reliable broadcast: receives the host may have posted per group.
    pub rbcast_posted_max: u32,
    /// Reliable broadcast: a collector repairs a member still missing a
    /// message this long after it was sent or arrived (§5.3).
    pub rbcast_rto_ns: u64,
    /// Reliable broadcast: an owed ACK or credit update goes on its own
    /// after this long (§4.4).
    pub rbcast_ack_delay_ns: u64,
    /// Reliable broadcast with NAKs (`RbcastAlgo::nak`): a member NAKs a
    /// gap still open this long after its last NAK of it, and a root whose
    /// own messages wait for ACKs announces its sequence after this long
    /// without a multicast (so a member that lost the last ones NAKs).
    pub rbcast_nak_retry_ns: u64,
    /// Reliable broadcast: co-roots repair their sub-groups. Fault
    /// injection only: false makes a member a co-root collects for miss
    /// what it lost (the tests check that they then fail).
    pub rbcast_coroot_repair: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            group_size: 3,
            window_frames: 48,
            rto_ns: 500_000,
            rto_ns_max: 50_000_000,
            retry_limit: 64,
            rnr_delay_ns: 100_000,
            rnr_delay_ns_max: 5_000_000,
            rnr_retry_limit: 0,
            rx_idle_timeout_ns: 30_000_000_000,
            flow_control: FlowControl::Off,
            peers_max: 1024,
            tx_max: 1024,
            rx_max: 1024,
            recv_posted_max: 4096,
            overflow_slots: 0,
            overflow_slot_size: 1024,
            unexp_slots: 64,
            unexp_headers: 256,
            matching: MatchMode::Unexpected,
            msg_max: 1 << 30,
            gen_seed: 1,
            cpu_plan: emp_uapi::image::cpu_plan::BASE,
            cpu_jobs: false,
            coll_ops_max: 256,
            coll_window: 8,
            coll_bufs: 64,
            coll_buf_size: 8192,
            atomic_max: 256,
            coll_cache_frames: 256,
            remote_refusals_max: 16,
            remote_refusal_window_ns: 1_000_000_000,
            remote_throttle_ns: 2_000_000_000,
            rma_reads_max: 256,
            ack_delay_ns: 0,
            ack_coalesce_max: 16,
            fault_swap_sends: false,
            rbcast_window: 16,
            rbcast_rx_slots: 16,
            rbcast_posted_max: 64,
            rbcast_rto_ns: 1_000_000,
            rbcast_ack_delay_ns: 200_000,
            rbcast_nak_retry_ns: 250_000,
            rbcast_coroot_repair: true,
        }
    }
}

/// Largest window in groups ([`Config::window_groups`]): every send and
/// receive record holds per-group state for that many groups, preallocated.
pub const WINDOW_GROUPS_MAX: u32 = 256;

impl Config {
    /// Groups a message may have in flight: `window_frames / group_size`,
    /// rounded up (the window's frames from a group's first frame end in
    /// at most that many groups).
    pub fn window_groups(&self) -> u32 {
        self.window_frames.div_ceil(self.group_size)
    }

    /// Is a frame of port generation `gen` from a new incarnation of the
    /// sender, where `known` is the generation heard last, `known_ns` ago
    /// (at `now`)? A newer generation is (the port was reopened). An older
    /// looking one is a stale frame of an earlier incarnation, unless the
    /// known one has been silent longer than any sender retransmits: then no
    /// frame of it can still come, and this is a new incarnation whose
    /// generation only looks older — a restarted NIC numbers its ports
    /// afresh, so its generations are unrelated to its predecessor's.
    pub(crate) fn new_incarnation(&self, known: u16, known_ns: u64, gen: u16, now: u64) -> bool {
        (gen.wrapping_sub(known) as i16) > 0 || now.saturating_sub(known_ns) > self.retry_budget_ns()
    }

    /// How long a sender keeps retransmitting one unacknowledged group before
    /// the message fails with `RetryLimitExceeded`: the first timeout and
    /// `retry_limit` more, each doubling up to `rto_ns_max`.
    pub fn retry_budget_ns(&self) -> u64 {
        (0..=self.retry_limit).map(|i| self.rto_ns.saturating_mul(1u64 << i.min(63)).min(self.rto_ns_max)).sum()
    }

    /// Checks the configuration; returns the first rule broken.
    pub fn invalid(&self) -> Option<&'static str> {
        if self.group_size == 0 || self.group_size > 32 {
            return Some("group_size must be 1..=32");
        }
        if self.window_frames < self.group_size {
            return Some("window_frames < group_size");
        }
        if self.window_groups() > WINDOW_GROUPS_MAX {
            return Some("window_frames / group_size must be <= WINDOW_GROUPS_MAX");
        }
        if self.rto_ns == 0 || self.rto_ns_max < self.rto_ns {
            return Some("rto_ns must be > 0 and <= rto_ns_max");
        }
        if self.rnr_delay_ns == 0 || self.rnr_delay_ns_max < self.rnr_delay_ns {
            return Some("rnr_delay_ns must be > 0 and <= rnr_delay_ns_max");
        }
        if self.retry_limit == 0 || self.retry_limit > 255 {
            return Some("retry_limit must be 1..=255");
        }
        if self.rx_idle_timeout_ns <= self.rto_ns_max * self.retry_limit as u64 {
            return Some("rx_idle_timeout_ns must exceed the sender's retry budget");
        }
        if self.peers_max == 0 || self.tx_max == 0 || self.rx_max == 0 || self.recv_posted_max == 0 {
            return Some("table bounds must be > 0");
        }
        if self.cpu_plan > emp_uapi::image::cpu_plan::DSR {
            return Some("cpu_plan must be base, SO, RO, SR or DSR");
        }
        if self.overflow_slots > 0 && self.overflow_slot_size == 0 {
            return Some("overflow_slot_size must be > 0");
        }
        if self.coll_ops_max < 2 || self.coll_window == 0 || self.coll_window >= self.coll_ops_max {
            return Some("coll_ops_max must be >= 2 and coll_window in 1..coll_ops_max");
        }
        if self.coll_buf_size == 0 || self.coll_buf_size > emp_uapi::wire::MTU_MAX {
            return Some("coll_buf_size must be 1..=MTU_MAX");
        }
        if self.atomic_max == 0 {
            return Some("atomic_max must be > 0");
        }
        if self.rbcast_window > 64 || self.rbcast_rx_slots > 1024 || self.rbcast_posted_max == 0 {
            return Some("rbcast_window must be <= 64, rbcast_rx_slots <= 1024, rbcast_posted_max > 0");
        }
        if self.rbcast_rto_ns == 0 || self.rbcast_ack_delay_ns == 0 || self.rbcast_nak_retry_ns == 0 {
            return Some("rbcast_rto_ns, rbcast_ack_delay_ns and rbcast_nak_retry_ns must be > 0");
        }
        if self.rma_reads_max == 0 {
            return Some("rma_reads_max must be > 0");
        }
        if self.ack_coalesce_max == 0 {
            return Some("ack_coalesce_max must be >= 1");
        }
        if self.ack_delay_ns > self.rto_ns / 2 {
            return Some("ack_delay_ns must be at most rto_ns / 2");
        }
        if self.remote_refusals_max == 0 || self.remote_refusal_window_ns == 0 {
            return Some("remote_refusals_max and remote_refusal_window_ns must be > 0");
        }
        None
    }
}

/// NIC table occupancy, for leak checks at quiesce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    /// Send messages outstanding.
    pub tx_msgs: u32,
    /// Messages being received.
    pub rx_msgs: u32,
    /// Posted receives not yet matched.
    pub posted_recvs: u32,
    /// Overflow (eager pool) slots holding a message.
    pub overflow_used: u32,
    /// Unexpected entries (eager or retained headers).
    pub unexp_entries: u32,
    /// Peer entries.
    pub peers: u32,
    /// Ports open.
    pub ports_open: u32,
    /// Collective operations (posted or early).
    pub coll_ops: u32,
    /// Early reduction partials held in the shared pool.
    pub coll_bufs_used: u32,
    /// Groups loaded.
    pub groups: u32,
    /// Remote atomic requests outstanding.
    pub atomics: u32,
    /// Broadcast/multisend frames held in the collective frame cache.
    pub coll_cache_frames: u32,
    /// Remote reads outstanding.
    pub rma_reads: u32,
}

/// A send or receive descriptor as the NIC keeps it: the validated
/// descriptor plus what is derived from it once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalDesc {
    pub wd: WorkDesc,
    pub signaled: bool,
    pub len: u64,
}

impl LocalDesc {
    pub(crate) fn new(wd: &WorkDesc) -> LocalDesc {
        let mut wd = *wd;
        wd.num_sge = wd.num_sge.min(SGE_MAX as u8);
        // Receives, probes and cancels always report: their completion is
        // their result.
        let reports = [Opcode::Recv, Opcode::Probe, Opcode::Cancel].iter().any(|&op| wd.opcode == op as u8);
        LocalDesc { signaled: wd.flags & WD_SIGNALED != 0 || reports, len: wd.total_len(), wd }
    }

    /// The SGEs naming this port's memory (a remote access's last SGE
    /// names the target's and is not among them).
    pub(crate) fn sges(&self) -> &[Sge] {
        self.wd.local_sges()
    }

    /// Does this receive accept a message from (node, port) with `tag`?
    pub(crate) fn matches(&self, node: u16, port: u16, tag: u64) -> bool {
        self.wd.matches(node, port, tag)
    }
}

/// Per-port state both sides read: set when the port opens, suspends,
/// resumes or closes (admin commands), read-only between them. What each
/// side changes as it runs is in its own part ([`PortSend`], [`PortRecv`],
/// [`crate::cq::PortCq`]).
#[derive(Debug)]
pub(crate) struct Port {
    pub open: bool,
    pub gen: u16,
    /// The CQ: its memory region, offset in it, and size.
    pub cq_key: u32,
    pub cq_offset: u64,
    pub cq_entries: u32,
    /// What a message no posted receive matches gets.
    pub mode: MatchMode,
    /// The port number peers address it by (`FrameHeader::{src,dst}_port`):
    /// the slot unless opened with an explicit address or restored into
    /// another slot (`ctxsw.rs`).
    pub addr: u16,
    /// Suspended for a context switch (C1): consumes no descriptor, starts
    /// no message, refuses new messages.
    pub suspended: bool,
}

impl Port {
    /// Its rings are taken: open, and not suspended (C1: a suspended
    /// port's rings wait for its resume).
    pub(crate) fn takes_rings(&self) -> bool {
        self.open && !self.suspended
    }
}

/// The send side's part of a port: its send ring.
#[derive(Debug, Default)]
pub(crate) struct PortSend {
    /// The send ring's consumer index.
    pub cons: u32,
    /// The send ring's persistent descriptors (`persist.rs`).
    pub stored: persist::PersistTable,
}

/// The receive side's part of a port: its receive ring, and the receives
/// and unexpected messages waiting to meet.
#[derive(Debug, Default)]
pub(crate) struct PortRecv {
    /// The receive ring's consumer index.
    pub cons: u32,
    /// Posted receives, in posting order.
    pub posted: VecDeque<LocalDesc>,
    /// Unexpected entries (`RecvSide::unexp` slots), in arrival order.
    pub unexpected: VecDeque<u32>,
    /// The receive ring's persistent descriptors (`persist.rs`).
    pub stored: persist::PersistTable,
}

/// What the send side of the program owns: CPU A's under DSR
/// (docs/nic-cpus.md, "The records split between the CPUs").
#[derive(Debug)]
pub(crate) struct SendSide {
    /// Send halves of the peer entries, by peer slot.
    pub(crate) peers: Vec<PeerSend>,
    /// Peers with a message or frame ready to go, each once (`PeerSend::ready`).
    pub(crate) ready: VecDeque<u32>,
    /// Send halves of the ports, by port slot.
    pub(crate) ports: Vec<PortSend>,
    /// The send records.
    pub(crate) tx: tx::TxTable,
    /// Group windows of the send records (one per `tx` slot).
    pub(crate) tx_rings: slots::Rings<tx::Group>,
    /// The send side's timers: groups' retransmissions and flow-control
    /// probes (the whole program's are `Nic::timers`).
    pub(crate) timers: TimerHeap<timer::SendTimer>,
    /// Source of the groups' timer stamps (unique across slot reuse).
    pub(crate) stamp: timer::Stamps,
    /// Collective and remote-access records the send side finished, whose
    /// reports the whole program makes (`Nic::after_send`), in order:
    /// (what, status, port). Each record finishes once: bounded by `tx`.
    pub(crate) done: VecDeque<(tx::TxDone, Status, u16)>,
    /// A record was freed since the whole program last looked: operations
    /// waiting for one may go on.
    pub(crate) freed: bool,
    /// First transmissions of frames by the send side's loop alone, and of
    /// those it stopped for and the whole program built (`Nic::send_frames`).
    pub(crate) frames: [u64; 2],
    /// Times it stopped for an ACK the receive side held.
    pub(crate) acks_first: u64,
    /// Send-ring descriptors it took alone, and those that needed the
    /// whole program (`Nic::send_descs`).
    pub(crate) descs: [u64; 2],
    /// A send the send side took alone from a ring (port, descriptor), to
    /// a peer without an entry: the whole program makes one and queues it
    /// first thing (`Nic::after_sides`).
    pub(crate) new_peer: Option<(u16, LocalDesc)>,
    /// Doorbells whose send-side part ran alone without stopping
    /// (`Nic::side_entries`).
    pub(crate) doorbells_alone: u64,
    /// An ACK the send side took alone let refused messages go again
    /// (peer, after which): the whole program resends them first thing
    /// (`Nic::after_sides`).
    pub(crate) resume: Option<(u32, u32)>,
    /// CPU queue runs (`Nic::send_side_cpu`) that took no whole program.
    pub(crate) queue_runs_alone: u64,
    /// A NACK the send side took alone whose step after what it
    /// acknowledges waits for the refused messages it let go
    /// (`Nic::nack_rest`, after `resume`).
    pub(crate) nack_rest: Option<(FrameHeader, wire::AckBody)>,
    /// A resend the send side stopped at a frame it cannot send alone
    /// (`Nic::finish_resend`).
    pub(crate) resend: Option<tx::Resend>,
}

impl SendSide {
    fn new(cfg: &Config, ports: u16) -> SendSide {
        SendSide {
            peers: (0..cfg.peers_max).map(|_| PeerSend::new()).collect(),
            ports: (0..ports).map(|_| PortSend::default()).collect(),
            ready: VecDeque::new(),
            tx: slots::Slots::new(cfg.tx_max),
            tx_rings: slots::Rings::new(cfg.tx_max, cfg.window_groups()),
            // Live timers: one per live group of every send record, one
            // flow-control probe per peer.
            timers: TimerHeap::with_capacity(
                cfg.tx_max as usize * cfg.window_groups() as usize + cfg.peers_max as usize,
            ),
            stamp: timer::Stamps::default(),
            done: VecDeque::with_capacity(cfg.tx_max as usize),
            freed: false,
            frames: [0; 2],
            acks_first: 0,
            descs: [0; 2],
            new_peer: None,
            doorbells_alone: 0,
            resume: None,
            queue_runs_alone: 0,
            nack_rest: None,
            resend: None,
        }
    }

    /// Arms timer `t` at `deadline`; when the store is full, the stale
    /// entries go first (as [`Nic::arm_timer`]). `peers` is the peer table.
    pub(crate) fn arm_timer(&mut self, peers: &[Option<Peer>], deadline: u64, t: timer::SendTimer) {
        if self.timers.is_full() {
            let mut timers = core::mem::take(&mut self.timers);
            timers.retain(|t| self.timer_live(peers, t));
            self.timers = timers;
        }
        self.timers.arm(deadline, t);
    }

    /// Would the handler of `t` act on it (its stamp still current)?
    fn timer_live(&self, peers: &[Option<Peer>], t: &timer::SendTimer) -> bool {
        match *t {
            timer::SendTimer::Group { slot, group, stamp } => {
                self.tx.get(slot).and_then(|m| m.groups.get(group)).is_some_and(|g| g.stamp == stamp)
            }
            timer::SendTimer::FcProbe { peer } => {
                peers.get(peer as usize).is_some_and(Option::is_some) && self.peer(peer).fc_level == wire::FC_STOP
            }
        }
    }

    pub(crate) fn peer(&self, i: u32) -> &PeerSend {
        &self.peers[i as usize]
    }

    pub(crate) fn peer_mut(&mut self, i: u32) -> &mut PeerSend {
        &mut self.peers[i as usize]
    }
}

/// What the receive side of the program owns: CPU B's under DSR.
#[derive(Debug)]
pub(crate) struct RecvSide {
    /// Receive halves of the peer entries, by peer slot.
    pub(crate) peers: Vec<PeerRecv>,
    /// Receive halves of the ports, by port slot.
    pub(crate) ports: Vec<PortRecv>,
    /// The receive side's counts.
    pub(crate) counters: counters::Counters,
    /// Scratch for the host segments a job names (allocated once).
    pub(crate) host_segs: mr::HostSegs,
    /// Source of the receive records' stamps (unique across slot reuse).
    pub(crate) stamp: timer::Stamps,
    /// The receive records.
    pub(crate) rx: rx::RxTable,
    /// Group windows of the receive records (one per `rx` slot).
    pub(crate) rx_rings: slots::Rings<u32>,
    /// The eager pool (or PM's overflow buffer) unexpected payloads wait in.
    pub(crate) overflow: rx::Overflow,
    /// Unexpected entries of every port (eager and retained headers).
    pub(crate) unexp: rx::UnexpTable,
    /// Entries of `unexp` that are retained headers.
    pub(crate) rdv_held: u32,
    /// Peers owing a coalesced ACK, with when it is due, oldest first
    /// (each peer at most once: `PeerRecv::ack_queued`; bounded by the table).
    pub(crate) ack_due: VecDeque<(u64, u32)>,
    /// When the coalesced ACKs' timer fires (`RecvCpu::on_ack_flush`), if armed.
    pub(crate) ack_flush_at: Option<u64>,
    /// Some sender was told `FC_STOP` and waits for an update.
    pub(crate) fc_updates_owed: bool,
    /// When the sweep for idle partial receives runs (`Nic::on_rx_sweep`),
    /// if armed: while any receive record is live.
    pub(crate) sweep_at: Option<u64>,
    /// Last DATA-frame decisions (seq, frame index, rx_expected, outcome),
    /// for diagnosis (`describe_peers`).
    pub(crate) trace: VecDeque<(u32, u32, u32, rx::RxTrace)>,
    /// DATA frames the receive side took alone, and those that needed the
    /// whole program (`Nic::data_frames`).
    pub(crate) data_frames: [u64; 2],
    /// Remote-access records it retired, with their errors, whose reports
    /// the whole program makes (`Nic::after_recv`), in order. Each record
    /// retires once: bounded by `rx`.
    pub(crate) done: VecDeque<(rx::RxMsg, Option<Status>)>,
    /// Receive-ring descriptors it took alone, and those the whole program
    /// took (`Nic::recv_descs`).
    pub(crate) descs: [u64; 2],
    /// It stopped, alone, at a DATA frame whose bookkeeping step it had
    /// begun: the whole program takes that frame without beginning it
    /// again (one step per frame in the CPUs' cost model).
    pub(crate) charged: bool,
    /// Its rings and timers (on a doorbell or a timer) and frame batches,
    /// run alone without stopping (`Nic::side_entries`).
    pub(crate) alone: [u64; 2],
}

impl RecvSide {
    /// `pool_slots`: the eager pool's (or overflow buffer's) slots.
    fn new(cfg: &Config, ports: u16, pool_slots: u32) -> RecvSide {
        let unexpected = (pool_slots + cfg.unexp_headers) as usize;
        RecvSide {
            peers: (0..cfg.peers_max).map(|_| PeerRecv::new(0, 0)).collect(),
            ports: (0..ports)
                .map(|_| PortRecv { unexpected: VecDeque::with_capacity(unexpected), ..Default::default() })
                .collect(),
            counters: counters::Counters::new(),
            host_segs: mr::HostSegs::new(),
            stamp: timer::Stamps::default(),
            rx: slots::Slots::new(cfg.rx_max),
            rx_rings: slots::Rings::new(cfg.rx_max, cfg.window_groups()),
            overflow: rx::Overflow::new(pool_slots, cfg.overflow_slot_size),
            unexp: slots::Slots::new(pool_slots + cfg.unexp_headers),
            rdv_held: 0,
            ack_due: VecDeque::with_capacity(cfg.peers_max as usize),
            ack_flush_at: None,
            fc_updates_owed: false,
            sweep_at: None,
            trace: VecDeque::with_capacity(32),
            data_frames: [0; 2],
            descs: [0; 2],
            done: VecDeque::with_capacity(cfg.rx_max as usize),
            charged: false,
            alone: [0; 2],
        }
    }

    /// The receive side's next timer: the ACK flush or the sweep.
    fn next_deadline(&self) -> Option<u64> {
        earliest(self.ack_flush_at, self.sweep_at)
    }

    /// The receive side's timer due first by `now`, left armed.
    pub(crate) fn peek_expired(&self, now: u64) -> Option<RecvTimer> {
        let at = self.next_deadline().filter(|&at| at <= now)?;
        Some(if self.ack_flush_at == Some(at) { RecvTimer::AckFlush } else { RecvTimer::Sweep })
    }

    /// Disarms and returns the receive side's timer due first if it is due
    /// by `now` and before `before` (the other timers' next deadline).
    fn take_expired(&mut self, now: u64, before: Option<u64>) -> Option<RecvTimer> {
        let at = self.next_deadline().filter(|&at| at <= now && before.is_none_or(|b| at < b))?;
        if self.ack_flush_at == Some(at) {
            self.ack_flush_at = None;
            Some(RecvTimer::AckFlush)
        } else {
            self.sweep_at = None;
            Some(RecvTimer::Sweep)
        }
    }

    /// Receives posted on every port.
    pub(crate) fn posted_total(&self) -> u32 {
        self.ports.iter().map(|p| p.posted.len() as u32).sum()
    }

    pub(crate) fn peer(&self, i: u32) -> &PeerRecv {
        &self.peers[i as usize]
    }

    pub(crate) fn peer_mut(&mut self, i: u32) -> &mut PeerRecv {
        &mut self.peers[i as usize]
    }
}

/// The receive side's two timers: one deadline each, not a heap entry.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RecvTimer {
    AckFlush,
    Sweep,
}

/// Everything the control program holds.
pub struct Nic {
    pub(crate) cfg: Config,
    pub(crate) layout: Layout,
    pub(crate) node: u16,
    pub(crate) mtu: u32,
    pub(crate) ports: Vec<Port>,
    pub(crate) peers: Vec<Option<Peer>>,
    pub(crate) peer_index: keymap::KeyMap<(u16, u16, u16), u32>,
    pub(crate) peer_free: Vec<u32>,
    /// The send side's records.
    pub(crate) send: SendSide,
    /// The receive side's records.
    pub(crate) recv: RecvSide,
    pub(crate) atomics: atomic::AtomicTable,
    /// Remote reads being performed.
    pub(crate) rma_reads: rma::ReadTable,
    pub(crate) timers: TimerHeap,
    /// What the program learned about the MR table (`mr.rs`).
    pub(crate) mr: mr::MrCache,
    /// Closed ports' delivered floors, per peer, for a while (TIME-WAIT).
    pub(crate) linger: linger::LingerTable,
    /// CPU A's counts, and the whole program's (the receive side has its own).
    pub(crate) counters: counters::Counters,
    pub(crate) heartbeat: u32,
    /// Source of timer stamps (unique across slot reuse).
    pub(crate) stamp: timer::Stamps,
    /// The NIC CPU running now, and the other CPU's queued steps.
    pub(crate) cpu: u8,
    pub(crate) queues: cpu::Queues,
    /// One frame of scratch: payloads pass through here between DMA and MAC;
    /// whole messages are never staged on the NIC.
    pub(crate) frame_buf: Vec<u8>,
    /// Immediate Sending (`FEATURE_IMMEDIATE_SENDING`): one-frame data
    /// messages go to the MAC with their payload still in host memory.
    pub(crate) immediate_sending: bool,
    /// Scratch for the host segments of one such frame (at most
    /// `HOST_SEGS_MAX`; allocated once).
    pub(crate) host_segs: mr::HostSegs,
    /// The group table.
    pub(crate) groups: group::Groups,
    /// Collective operations.
    pub(crate) coll_ops: slots::Slots<coll::CollOp>,
    /// Shared-pool buffers holding early reduction partials.
    pub(crate) coll_pool_used: u32,
    /// Some operation waits for a free transmission record.
    pub(crate) coll_stalled: bool,
    /// Frames in the collective frame cache (all ops).
    pub(crate) coll_cache_used: u32,
    /// Refused remote accesses per source, and throttling.
    pub(crate) guard: guard::Guard,
    /// Multicast memberships and counts.
    pub(crate) mcast: mcast::Mcast,
    /// Saved contexts whose address is reserved: (address, generation).
    pub(crate) parked: Vec<ctxsw::Parked>,
    /// Why the last restore refused its image (diagnosis).
    pub(crate) restore_refusal: Option<&'static str>,
    /// The CQs' producer state.
    pub(crate) cqs: Cqs,
    /// The ACKs the receive side holds back, per peer (the common area's).
    pub(crate) ack_held: peer::AckHeld,
    /// The semaphore: what both sides write (`cqs`, `mr`, `queues`) is
    /// taken through it by a side running alone (`sem.rs`).
    pub(crate) sem: sem::Semaphore,
    /// The timers' next deadlines as each store published them, for a
    /// driver to read while sides run (`sides.rs`).
    pub(crate) deadlines: sides::Deadlines,
    /// Collectives or reliable broadcasts wait for a free send record
    /// (`coll_stalled || rbcast_stalled`), as the whole program last
    /// published it: a side that frees one leaves the wake-up to it.
    pub(crate) stalled: core::sync::atomic::AtomicBool,
    /// This call needed more than the two sides' views (`Nic::entries`).
    pub(crate) whole: bool,
    /// Doorbells and frame batches: handled by the sides' views alone, and
    /// needing the whole program.
    pub(crate) entries: [[u64; 2]; 2],
    /// Reliable-broadcast state per group slot.
    pub(crate) rbcast: Vec<Option<rbcast::RbGroupState>>,
    /// Groups whose port could not join their multicast address.
    pub(crate) rbcast_join_failed: u64,
    /// One frame of scratch for the reliable broadcast's multicasts (also
    /// read by the local ports' copies while `frame_buf` may be in use).
    pub(crate) rbcast_frame: Vec<u8>,
    /// A co-root copy waits for a transmission record or peer entry.
    pub(crate) rbcast_stalled: bool,
}

impl Nic {
    /// Starts the control program on a NIC whose SRAM header was set up by
    /// the hardware. Validates the layout, marks the NIC RUNNING.
    pub fn boot<H: Hal>(hal: &mut H, mut cfg: Config) -> Result<Nic, FailReason> {
        let mut hb = [0u8; SramHeader::SIZE];
        hal.sram_read(0, &mut hb);
        let header = SramHeader::get(&hb);
        let layout = match Layout::from_header(&header) {
            Ok(l) => l,
            Err(_) => {
                fail(hal, FailReason::BadLayout);
                return Err(FailReason::BadLayout);
            }
        };
        if cfg.invalid().is_some() {
            fail(hal, FailReason::BadLayout);
            return Err(FailReason::BadLayout);
        }
        if header.features & FEATURE_MODIFIED_ACK_NACK != 0 {
            cfg.flow_control = FlowControl::ModifiedAckNack;
        }
        // PM's flow control refuses in order: its ports keep that rule.
        if header.features & FEATURE_ORDERED_REFUSAL != 0 || cfg.flow_control == FlowControl::ModifiedAckNack {
            cfg.matching = MatchMode::OrderedRefusal;
        }
        if header.features & FEATURE_OVERFLOW == 0 {
            cfg.overflow_slots = 0;
        }
        cfg.overflow_slot_size = cfg.overflow_slot_size.min(emp_uapi::wire::payload_capacity(header.mtu, 0) as u32);
        let pool_slots = if cfg.overflow_slots > 0 { cfg.overflow_slots } else { cfg.unexp_slots };
        let ports = (0..layout.params.ports)
            .map(|i| Port {
                open: false,
                gen: cfg.gen_seed.wrapping_add(i.wrapping_mul(257)),
                cq_key: 0,
                cq_offset: 0,
                cq_entries: 0,
                mode: cfg.matching,
                addr: i,
                suspended: false,
            })
            .collect();
        let nic = Nic {
            layout,
            node: header.node_id,
            mtu: header.mtu,
            ports,
            peers: (0..cfg.peers_max).map(|_| None).collect(),
            peer_index: keymap::KeyMap::with_capacity_and_hasher(cfg.peers_max as usize, Default::default()),
            peer_free: (0..cfg.peers_max).rev().collect(),
            send: SendSide::new(&cfg, layout.params.ports),
            recv: RecvSide::new(&cfg, layout.params.ports, pool_slots),
            atomics: slots::Slots::new(cfg.atomic_max),
            rma_reads: slots::Slots::new(cfg.rma_reads_max),
            // Live timers: one per atomic request, one per read, one per
            // reliable-broadcast group (the send side's are its own,
            // `SendSide::timers`, and so are the receive side's two,
            // `RecvSide::next_deadline`).
            timers: TimerHeap::with_capacity(
                cfg.atomic_max as usize + cfg.rma_reads_max as usize + layout.params.group_entries as usize,
            ),
            mr: mr::MrCache::new(layout.params.mr_entries),
            linger: linger::LingerTable::new(),
            counters: counters::Counters::new(),
            heartbeat: 0,
            stamp: timer::Stamps::default(),
            cpu: 0,
            queues: cpu::Queues::new(cfg.cpu_plan, cfg.rx_max),
            frame_buf: vec![0; MTU_MAX as usize],
            immediate_sending: header.features & FEATURE_IMMEDIATE_SENDING != 0,
            host_segs: mr::HostSegs::new(),
            groups: group::Groups::new(layout.params.group_entries),
            coll_ops: slots::Slots::new(cfg.coll_ops_max),
            coll_pool_used: 0,
            coll_stalled: false,
            coll_cache_used: 0,
            guard: guard::Guard::new(),
            mcast: mcast::Mcast::default(),
            parked: Vec::with_capacity(ctxsw::PARKED_MAX),
            restore_refusal: None,
            cqs: Cqs::new(layout.params.ports),
            ack_held: peer::AckHeld::new(cfg.peers_max),
            sem: sem::Semaphore::default(),
            deadlines: sides::Deadlines::new(),
            stalled: core::sync::atomic::AtomicBool::new(false),
            whole: false,
            entries: [[0; 2]; 2],
            rbcast: (0..layout.params.group_entries).map(|_| None).collect(),
            rbcast_join_failed: 0,
            rbcast_frame: vec![0; MTU_MAX as usize],
            rbcast_stalled: false,
            cfg,
        };
        nic.publish_deadlines();
        set_status(hal, NicStatus::Running, FailReason::None);
        Ok(nic)
    }

    /// This NIC's node id.
    pub fn node(&self) -> u16 {
        self.node
    }

    /// The configuration in effect.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The host may have posted work: run admin commands, consume rings.
    pub fn handle_doorbell<H: Hal>(&mut self, hal: &mut H, now: u64) {
        self.cpu = 0;
        self.whole = false;
        self.after_sides(hal, now);
        self.service_admin(hal, now);
        self.poll_rings(hal, now);
        self.send_ready_peers(hal, now);
        self.recv_cpu().send_fc_updates(hal);
        self.publish(hal);
        self.entries[0][self.whole as usize] += 1;
    }

    /// A frame arrived from the MAC.
    pub fn handle_frame<H: Hal>(&mut self, hal: &mut H, now: u64, bytes: &[u8]) {
        self.handle_frames(hal, now, core::iter::once(bytes));
    }

    /// Frames arrived from the MAC, handled in order; what their handling
    /// leaves to do is done once, after the last.
    pub fn handle_frames<'a, H: Hal>(&mut self, hal: &mut H, now: u64, frames: impl IntoIterator<Item = &'a [u8]>) {
        self.whole = false;
        self.after_sides(hal, now);
        for bytes in frames {
            self.cpu = cpu::cpu_of(self.cfg.cpu_plan, cpu::Step::Classify);
            self.receive_frame(hal, now, bytes);
        }
        // Completions may have freed table or CQ room that descriptors
        // still in the rings were waiting for: the NIC polls producer
        // indices, it does not rely on a doorbell for them.
        self.poll_rings(hal, now);
        self.send_ready_peers(hal, now);
        self.recv_cpu().send_fc_updates(hal);
        self.publish(hal);
        self.entries[1][self.whole as usize] += 1;
    }

    /// Dispatches a received frame by kind.
    fn receive_frame<H: Hal>(&mut self, hal: &mut H, now: u64, bytes: &[u8]) {
        let mut frame = match Frame::parse(bytes) {
            Ok(f)
                if emp_uapi::wire::is_mcast(f.header().dst_node)
                    && (f.header().dst_port as usize) < self.ports.len()
                    && self.route_valid(hal, f.header().src_node) =>
            {
                let hdr = *f.header();
                self.whole = true;
                if let Frame::Rbcast { body, data, .. } = f {
                    // For every local port whose group it is, whatever port it names.
                    return self.rbcast_on_mcast(hal, now, &hdr, &body, data);
                }
                self.receive_mcast(&hdr);
                return;
            }
            // A source outside the route table is no node of this cluster:
            // refused before it can take a peer entry or reach a receive.
            Ok(f) if f.header().dst_node == self.node && self.route_valid(hal, f.header().src_node) => f,
            _ => return self.count(counter::DROPPED_MALFORMED, 1),
        };
        // Peers address a port by its wire address; from here on the
        // header names the slot that holds it.
        match self.slot_for_frame(frame.header().dst_port) {
            Some(slot) => frame.header_mut().dst_port = slot,
            None => {
                self.whole = true;
                return self.refuse_unaddressed(hal, &frame);
            }
        }
        // Beside DATA, ACK and NACK frames, the sides' views take none.
        self.whole |= !matches!(frame, Frame::Data { .. } | Frame::Ack { .. } | Frame::Nack { .. });
        match frame {
            Frame::Data { hdr, msg, payload } => {
                if !core::mem::take(&mut self.recv.charged) {
                    hal.cpu_step(self.cpu, CpuStep::RecvBookkeep, false);
                }
                self.on_data(hal, now, &hdr, msg.as_ref(), payload)
            }
            Frame::Ack { hdr, body } => {
                self.count(counter::ACKS_RX, 1);
                if self.ports[hdr.dst_port as usize].open {
                    self.recv_ack(hal, now, &hdr, &body);
                }
            }
            Frame::Nack { hdr, body, reason } => {
                self.count(counter::ACKS_RX, 1);
                if self.ports[hdr.dst_port as usize].open {
                    self.recv_nack(hal, now, &hdr, &body, reason);
                }
            }
            Frame::AtomicReq { hdr, body } => self.on_atomic_req(hal, now, &hdr, &body),
            Frame::AtomicResp { hdr, result } => self.on_atomic_resp(hal, now, &hdr, &result),
            Frame::Rbcast { hdr, body, data } => {
                if self.ports[hdr.dst_port as usize].open {
                    self.rbcast_on_frame(hal, now, &hdr, &body, data);
                }
            }
        }
    }

    /// A DATA (or collective DATA) frame: the receive side takes it alone
    /// when it can (`RecvCpu::try_data`); else admitted here, and the
    /// header frame of a collective or remote-access message, or a frame of
    /// a record another layer owns, goes to that layer.
    fn on_data<H: Hal>(&mut self, hal: &mut H, now: u64, hdr: &FrameHeader, msg: Option<&MsgHeader>, payload: &[u8]) {
        if self.recv_cpu().try_data(hal, now, hdr, msg, payload) {
            self.recv.data_frames[0] += 1;
            return self.after_recv(hal, now);
        }
        self.recv.data_frames[1] += 1;
        self.whole = true;
        let Some(peer) = self.admit_data(hal, now, hdr) else { return };
        let verdict = self.recv_cpu().classify_data(peer, hdr);
        if self.recv_cpu().on_verdict(hal, now, peer, verdict, hdr, msg, payload) {
            return self.after_recv(hal, now);
        }
        match verdict {
            DataVerdict::Active(r) => self.deliver(hal, now, r, hdr, msg, payload),
            DataVerdict::CollFirst => {
                let msg = msg.expect("frame 0 carries the message header");
                self.on_coll_first(hal, now, peer, hdr, msg, payload);
            }
            DataVerdict::RmaFirst => {
                let msg = msg.expect("frame 0 carries the message header");
                self.on_rma_first(hal, now, peer, hdr, msg, payload);
            }
            _ => unreachable!("the receive side acts on every other verdict"),
        }
    }

    /// The header frame of the next message from `peer` is a collective one.
    fn on_coll_first<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        peer: u32,
        hdr: &FrameHeader,
        msg: &MsgHeader,
        payload: &[u8],
    ) {
        let seq = hdr.msg_seq;
        match self.coll_accept(hal, now, hdr, msg, payload) {
            coll::CollAccept::Consumed => {
                self.recv_cpu().rx_took_next(peer, seq);
                self.recv_cpu().send_ack(hal, peer, seq, 0);
                self.recv_cpu().nack_gap(hal, peer);
            }
            coll::CollAccept::Receive(r) => {
                self.recv_cpu().rx_took_next(peer, seq);
                self.deliver(hal, now, r, hdr, Some(msg), payload);
                self.recv_cpu().nack_gap(hal, peer);
            }
            coll::CollAccept::Refuse(NackReason::NoMatch) => self.recv_cpu().refuse_next(hal, peer, hdr, None),
            coll::CollAccept::Refuse(reason) => {
                self.count(counter::DROPPED_UNEXPECTED, 1);
                self.recv_cpu().send_nack(hal, peer, seq, 0, 0, reason);
            }
        }
    }

    /// A frame of a message with receive record `r`: stored by the receive
    /// path; a broadcast's forwarding learns what arrived.
    fn deliver<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        r: u32,
        hdr: &FrameHeader,
        msg: Option<&MsgHeader>,
        payload: &[u8],
    ) {
        let Some(a) = self.recv_cpu().accept_frame(hal, now, r, hdr, msg, payload) else { return };
        if let RxOwner::Bcast { op, stamp } = a.owner {
            if let Some(at) = a.stored_from {
                // Forwarding sends what it just received, not a host read-back.
                self.bcast_frame_received(op, stamp, hdr.frame_index, &payload[at..]);
            }
            self.bcast_frames_here(op, stamp, a.contig);
        }
        if a.finish {
            self.finish_rx(hal, now, r, None);
        }
    }

    /// Retires receive record `r` and reports it to its owner (`error`
    /// overrides the record's own).
    pub(crate) fn finish_rx<H: Hal>(&mut self, hal: &mut H, now: u64, r: u32, error: Option<Status>) {
        if self.recv.rx.get(r).expect("live").owner == RxOwner::Recv {
            return self.recv_cpu().finish_recv(hal, r, error);
        }
        let (m, error) = self.recv_cpu().retire_rx(r, error);
        self.report_rx(hal, now, &m, error);
    }

    /// Reports retired receive record `m` to the layer that owns it (not
    /// a posted receive: that one completes on the receive side).
    fn report_rx<H: Hal>(&mut self, hal: &mut H, now: u64, m: &RxMsg, error: Option<Status>) {
        match m.owner {
            RxOwner::Recv => unreachable!("a posted receive completes on the receive side"),
            RxOwner::Bcast { op, stamp } => self.bcast_rx_done(hal, now, op, stamp, error),
            RxOwner::RmaWrite { imm } => self.rma_write_done(hal, m, imm, error),
            RxOwner::ReadResp { slot, stamp } => self.read_resp_done(hal, slot, stamp, error),
        }
    }

    /// What the receive side left to the whole program: the reports of
    /// the remote-access records it retired (`RecvSide::done`).
    pub(crate) fn after_recv<H: Hal>(&mut self, hal: &mut H, now: u64) {
        while let Some((m, error)) = self.recv.done.pop_front() {
            self.whole = true;
            self.report_rx(hal, now, &m, error);
        }
    }

    /// What the sides, running alone, left to the whole program: a send
    /// to a peer without an entry, taken from its ring (it goes before
    /// anything taken after it), and the reports of records they retired.
    /// Every whole-program entry point begins here.
    pub(crate) fn after_sides<H: Hal>(&mut self, hal: &mut H, now: u64) {
        if let Some((port, ld)) = self.send.new_peer.take() {
            self.whole = true;
            self.send_to_new_peer(hal, now, port, ld);
        }
        if let Some((peer, after)) = self.send.resume.take() {
            self.whole = true;
            self.resume_refused(hal, now, peer, after);
        }
        if let Some((hdr, body)) = self.send.nack_rest.take() {
            self.whole = true;
            self.after_send(hal, now);
            if let Some(peer) = self.find_peer(hdr.dst_port, hdr.src_node, hdr.src_port) {
                self.nack_rest(hal, now, peer, &hdr, &body, NackReason::Loss);
            }
        }
        if let Some(r) = self.send.resend.take() {
            self.whole = true;
            self.finish_resend(hal, now, r);
        }
        self.after_recv(hal, now);
        self.after_send(hal, now);
    }

    fn poll_rings<H: Hal>(&mut self, hal: &mut H, now: u64) {
        for p in 0..self.ports.len() as u16 {
            // A suspended port's rings wait for its resume (C1).
            if self.ports[p as usize].takes_rings() {
                self.consume_rings(hal, now, p);
            }
        }
    }

    /// Time passed: fire expired timers (no-op when nothing expired).
    pub fn handle_timeout<H: Hal>(&mut self, hal: &mut H, now: u64) {
        self.cpu = 0;
        self.after_sides(hal, now);
        loop {
            // In deadline order across the three stores (ties: the send
            // side's first, then the whole program's, then the receive
            // side's).
            let (send_at, prog_at) = (self.send.timers.next_deadline(), self.timers.next_deadline());
            let heaps_at = earliest(send_at, prog_at);
            if let Some(t) = self.recv.take_expired(now, heaps_at) {
                match t {
                    RecvTimer::AckFlush => self.recv_cpu().on_ack_flush(hal, now),
                    RecvTimer::Sweep => self.on_rx_sweep(hal, now),
                }
                continue;
            }
            if send_at.is_some() && send_at == heaps_at {
                let Some(t) = self.send.timers.pop_expired(now) else { break };
                match t {
                    SendTimer::Group { slot, group, stamp } => self.on_group_timeout(hal, now, slot, group, stamp),
                    SendTimer::FcProbe { peer } => self.on_fc_probe(peer),
                }
                continue;
            }
            let Some(t) = self.timers.pop_expired(now) else { break };
            match t {
                timer::Timer::Atomic { slot, stamp } => self.on_atomic_timeout(hal, now, slot, stamp),
                timer::Timer::RmaRead { slot, stamp } => self.on_read_timeout(hal, now, slot, stamp),
                timer::Timer::Rbcast { group, stamp } => self.rbcast_tick(hal, now, group, stamp),
            }
        }
        self.poll_rings(hal, now);
        self.send_ready_peers(hal, now);
        self.recv_cpu().send_fc_updates(hal);
        self.publish(hal);
    }

    /// Arms timer `t` at `deadline`. When the heap (sized at boot for every
    /// timer that can be live at once) is full, the stale entries go first
    /// (re-armed or answered: lazily cancelled), so arming never allocates.
    pub(crate) fn arm_timer(&mut self, deadline: u64, t: timer::Timer) {
        if self.timers.is_full() {
            let mut timers = core::mem::take(&mut self.timers);
            timers.retain(|t| self.timer_live(t));
            self.timers = timers;
        }
        self.timers.arm(deadline, t);
    }

    /// Would the handler of `t` act on it (its stamp still current)?
    fn timer_live(&self, t: &timer::Timer) -> bool {
        match *t {
            timer::Timer::Atomic { slot, stamp } => self.atomics.get(slot).is_some_and(|a| a.stamp == stamp),
            timer::Timer::RmaRead { slot, stamp } => self.rma_reads.get(slot).is_some_and(|r| r.timer == stamp),
            timer::Timer::Rbcast { group, stamp } => self.rbcast_timer_live(group, stamp),
        }
    }

    /// Earliest time `handle_timeout` has work (may be early: a spurious
    /// call is a no-op).
    pub fn poll_timeout(&self) -> Option<u64> {
        let heaps = earliest(self.send.timers.next_deadline(), self.timers.next_deadline());
        earliest(heaps, self.recv.next_deadline())
    }

    /// Doorbells and frame batches so far, each as (handled by the two
    /// sides' views alone, needing the whole program): how much of the
    /// program's work the NIC CPUs could do beside each other, each with
    /// its own side (docs/nic-cpus.md).
    pub fn entries(&self) -> [(u64, u64); 2] {
        self.entries.map(|[a, w]| (a, w))
    }

    /// DATA frames received so far: those the receive side took alone
    /// (`RecvCpu`: it reached nothing of the send side), and those that
    /// needed the whole program (a new sender or incarnation, a closed
    /// port, a collective or remote-access message).
    pub fn data_frames(&self) -> (u64, u64) {
        (self.recv.data_frames[0], self.recv.data_frames[1])
    }

    /// Frames the send side's loop sent (first transmissions): alone
    /// (`SendCpu`: it reached nothing of the receive side), and built by
    /// the whole program (a collective's or remote access's); and how
    /// often a frame waited for an ACK the receive side held
    /// (`SendStop`).
    pub fn send_frames(&self) -> (u64, u64, u64) {
        (self.send.frames[0], self.send.frames[1], self.send.acks_first)
    }

    /// Receive-ring descriptors taken: by the receive side alone, and by
    /// the whole program (while retained headers wait: a receive may
    /// start a pull).
    pub fn recv_descs(&self) -> (u64, u64) {
        (self.recv.descs[0], self.recv.descs[1])
    }

    /// Send-ring descriptors taken: by the send side alone (plain sends to
    /// a known peer, stores, starts, refusals), and with the whole program
    /// (a new peer, a collective, an atomic, a remote access).
    pub fn send_descs(&self) -> (u64, u64) {
        (self.send.descs[0], self.send.descs[1])
    }

    /// Counters (also published in the SRAM header).
    pub fn counters(&self) -> [u64; counter::COUNT] {
        core::array::from_fn(|c| self.counters.sum(&self.recv.counters, c))
    }

    /// Bytes of per-message state the live send and receive records hold
    /// (each record and its group window): bounded by the window, whatever
    /// the messages' lengths.
    pub fn message_state_bytes(&self) -> usize {
        let tx: usize = self.send.tx.iter().map(|(_, m)| m.state_bytes()).sum();
        tx + self.recv.rx.iter().map(|(_, m)| m.state_bytes()).sum::<usize>()
    }

    /// Table occupancy.
    pub fn occupancy(&self) -> Occupancy {
        Occupancy {
            tx_msgs: self.send.tx.used(),
            rx_msgs: self.recv.rx.used(),
            posted_recvs: self.recv.posted_total(),
            overflow_used: self.recv.overflow.used(),
            unexp_entries: self.recv.unexp.used(),
            peers: self.peer_index.len() as u32,
            ports_open: self.ports.iter().filter(|p| p.open).count() as u32,
            coll_ops: self.coll_ops.used(),
            coll_bufs_used: self.coll_pool_used,
            groups: self.groups.used(),
            atomics: self.atomics.used(),
            coll_cache_frames: self.coll_cache_used,
            rma_reads: self.rma_reads.used(),
        }
    }

    /// A one-line-per-peer description of protocol state, for diagnosing a
    /// stuck simulation.
    pub fn describe_peers(&self) -> String {
        let mut s = String::new();
        for (i, p) in self.ports.iter().enumerate().filter(|(_, p)| p.open) {
            let (send, recv, cq) = (&self.send.ports[i], &self.recv.ports[i], &self.cqs.ports[i]);
            s += &format!(
                "  port {i}: send_cons {} recv_cons {} cq_prod {}/{} outstanding {} posted {} unexpected {} ({})\n",
                send.cons,
                recv.cons,
                cq.prod,
                p.cq_entries,
                cq.outstanding,
                recv.posted.len(),
                recv.unexpected.len(),
                p.mode.name()
            );
        }
        s += &format!("  recent rx decisions (seq, frame, expected, outcome): {:?}\n", self.recv.trace);
        for i in (0..self.peers.len() as u32).filter(|&i| self.peer_live(i)) {
            let (p, send, recv) = (self.peer(i), self.send.peer(i), self.recv.peer(i));
            let head = send.tx_queue.front().and_then(|&t| self.send.tx.get(t)).map(|m| {
                let armed = m.groups.live().filter(|&g| m.groups.get(g).is_some_and(|x| x.stamp != 0)).count();
                format!(
                    "head seq {} queued at {} ns next {}/{} acked below {}/{} armed {} rnr {}",
                    m.seq,
                    m.queued_ns,
                    m.next_frame,
                    m.frame_count,
                    m.groups.una(),
                    m.groups.count(),
                    armed,
                    m.rnr_retries
                )
            });
            s += &format!(
                "  port {} -> ({},{}): tx_next {} queued {} inflight {} credits {} fc {} nts {:?} {:?} | rx_expected {} rnr {:?} active {} ack owed {:?}×{}\n",
                p.port, p.node, p.rport, send.tx_seq_next, send.tx_queue.len(), send.inflight_frames, send.credits, send.fc_level,
                send.not_to_send, head, recv.rx_expected, recv.rnr_seq, recv.rx_active.len(), recv.ack_owed, recv.acks_owed
            );
        }
        s
    }

    /// Checks internal invariants; returns the first one broken.
    pub fn invariants(&self) -> Result<(), String> {
        self.groups.check()?;
        if self.linger.len() > linger::LINGER_MAX {
            return Err(format!("{} lingering peers, over {}", self.linger.len(), linger::LINGER_MAX));
        }
        let mut tx_seen = 0;
        if self.peer_index.len() + self.peer_free.len() != self.peers.len() {
            return Err(format!(
                "{} peers indexed, {} free of {}",
                self.peer_index.len(),
                self.peer_free.len(),
                self.peers.len()
            ));
        }
        for (i, p) in self.live_peers() {
            if self.peer_index.get(&(p.port, p.node, p.rport)) != Some(&i) {
                return Err(format!("peer {i} not indexed"));
            }
            let (send, recv) = (self.send.peer(i), self.recv.peer(i));
            let mut inflight = 0;
            for &s in &send.tx_queue {
                let m = self.send.tx.get(s).ok_or_else(|| format!("peer {i} queues free tx slot {s}"))?;
                if m.peer != i {
                    return Err(format!("tx slot {s} belongs to peer {} not {i}", m.peer));
                }
                if !m.in_window(m.next_frame.saturating_sub(1), self.cfg.group_size, self.cfg.window_frames) {
                    return Err(format!("tx slot {s} sent frame {} beyond its window", m.next_frame - 1));
                }
                inflight += m.inflight_frames;
                tx_seen += 1;
            }
            if inflight != send.inflight_frames {
                return Err(format!("peer {i} inflight {} != sum {inflight}", send.inflight_frames));
            }
            if recv.ack_owed.is_some() != self.ack_held.get(i) {
                return Err(format!(
                    "peer {i}: an ACK owed is {:?}, the common area says {}",
                    recv.ack_owed,
                    self.ack_held.get(i)
                ));
            }
            if recv.ack_owed.is_some() && !recv.ack_queued {
                return Err(format!("peer {i} owes an ACK no timer will send"));
            }
            if recv.ack_queued && !self.recv.ack_due.iter().any(|&(_, x)| x == i) {
                return Err(format!("peer {i} is marked queued but not in ack_due"));
            }
            for &r in &recv.rx_active {
                let m = self.recv.rx.get(r).ok_or_else(|| format!("peer {i} lists free rx slot {r}"))?;
                if m.peer != i {
                    return Err(format!("rx slot {r} belongs to peer {} not {i}", m.peer));
                }
            }
        }
        if self.recv.rx.used() > 0 && self.recv.sweep_at.is_none() {
            return Err(format!("{} receive records and no sweep for idle ones", self.recv.rx.used()));
        }
        if !self.recv.ack_due.is_empty() && self.recv.ack_flush_at.is_none() {
            return Err(format!("{} coalesced ACKs due and no AckFlush timer", self.recv.ack_due.len()));
        }
        if !self.recv.done.is_empty() {
            return Err(format!(
                "the receive side left {} reports the whole program did not take",
                self.recv.done.len()
            ));
        }
        if !self.send.done.is_empty() || self.send.freed {
            return Err(format!(
                "the send side left {} reports and a freed record ({}) the whole program did not take",
                self.send.done.len(),
                self.send.freed
            ));
        }
        if let Some((port, _)) = self.send.new_peer {
            return Err(format!("a send of port {port} the send side took for a new peer was left"));
        }
        if self.send.resume.is_some() || self.send.nack_rest.is_some() || self.send.resend.is_some() {
            return Err(format!(
                "the send side left work the whole program did not take: refused messages to resend {:?}, \
                 a NACK's rest {}, a resend {:?}",
                self.send.resume,
                self.send.nack_rest.is_some(),
                self.send.resend
            ));
        }
        if self.recv.charged {
            return Err("the receive side stopped at a frame the whole program did not take".into());
        }
        if tx_seen != self.send.tx.used() {
            return Err(format!("{} tx records, {tx_seen} queued", self.send.tx.used()));
        }
        for (table, used, rings) in [
            ("tx", self.send.tx.used(), self.send.tx_rings.available()),
            ("rx", self.recv.rx.used(), self.recv.rx_rings.available()),
        ] {
            let max = if table == "tx" { self.cfg.tx_max } else { self.cfg.rx_max };
            if used + rings != max {
                return Err(format!("{used} {table} records and {rings} free group windows of {max}"));
            }
        }
        let rx_listed: usize = self.live_peers().map(|(i, _)| self.recv.peer(i).rx_active.len()).sum();
        if rx_listed as u32 != self.recv.rx.used() {
            return Err(format!("{} rx records, {rx_listed} listed", self.recv.rx.used()));
        }
        self.unexp_invariants()?;
        self.coll_invariants()?;
        self.rbcast_invariants()?;
        self.rma_invariants()?;
        self.atomic_invariants()
    }

    pub(crate) fn count(&mut self, c: usize, n: u64) {
        self.counters.add(c, n);
    }

    /// Takes back `n` of counter `c` (an event counted too early).
    pub(crate) fn uncount(&mut self, c: usize, n: u64) {
        self.counters.sub(c, n);
    }

    /// Ends a call: raises the interrupt of every port that got a
    /// completion and whose host armed it, then publishes counters and the
    /// heartbeat in the SRAM header.
    pub(crate) fn publish<H: Hal>(&mut self, hal: &mut H) {
        // The ARM word shares its cache line with the words the host writes
        // as it posts and consumes: read per port per call, not per entry.
        let mut written = core::mem::take(&mut self.cqs.written);
        for &port in &written {
            self.cqs.ports[port as usize].written = false;
            // A port closed meanwhile has no host waiting on it.
            if self.ports[port as usize].open {
                crate::cpu::raise_if_armed(hal, self.layout.port(port).ctl(ctl::ARM), port);
            }
        }
        written.clear();
        self.cqs.written = written;
        self.publish_deadlines();
        let stalled = self.coll_stalled || self.rbcast_stalled;
        self.stalled.store(stalled, core::sync::atomic::Ordering::Release);
        let dirty = self.counters.take_dirty() | self.recv.counters.take_dirty();
        if dirty == 0 {
            return;
        }
        self.heartbeat = self.heartbeat.wrapping_add(1);
        sides::publish_counters(hal, dirty, &self.counters, &self.recv.counters);
        hal.sram_write(core::mem::offset_of!(SramHeader, heartbeat), &self.heartbeat.to_le_bytes());
    }
}

/// The earlier of two optional deadlines.
fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn set_status<H: Hal>(hal: &mut H, status: NicStatus, reason: FailReason) {
    hal.sram_write(core::mem::offset_of!(SramHeader, fail_reason), &(reason as u32).to_le_bytes());
    hal.sram_write(core::mem::offset_of!(SramHeader, status), &(status as u32).to_le_bytes());
}

/// Marks the NIC FAILED with `reason` (used by boot and by loaders).
pub fn fail<H: Hal>(hal: &mut H, reason: FailReason) {
    set_status(hal, NicStatus::Failed, reason);
}

/// Reads a little-endian u32 from SRAM.
pub(crate) fn sram_u32<H: Hal>(hal: &mut H, off: usize) -> u32 {
    let mut b = [0u8; 4];
    hal.sram_read(off, &mut b);
    u32::from_le_bytes(b)
}

/// Writes a little-endian u32 to SRAM.
pub(crate) fn sram_put_u32<H: Hal>(hal: &mut H, off: usize, v: u32) {
    hal.sram_write(off, &v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert_eq!(Config::default().invalid(), None);
    }

    #[test]
    fn config_rules_are_enforced() {
        let bad = [
            Config { group_size: 0, ..Config::default() },
            Config { group_size: 33, ..Config::default() },
            Config { window_frames: 2, ..Config::default() },
            Config { rto_ns_max: 1, ..Config::default() },
            Config { retry_limit: 0, ..Config::default() },
            Config { rx_idle_timeout_ns: 1, ..Config::default() },
            Config { tx_max: 0, ..Config::default() },
            Config { rnr_delay_ns_max: 1, ..Config::default() },
            Config { atomic_max: 0, ..Config::default() },
            Config { group_size: 1, window_frames: WINDOW_GROUPS_MAX + 1, ..Config::default() },
        ];
        for c in bad {
            assert!(c.invalid().is_some(), "{c:?} accepted");
        }
    }

    #[test]
    fn a_ports_matching_mode_comes_from_its_open() {
        use emp_uapi::sram::match_mode as m;
        for default in [MatchMode::Unexpected, MatchMode::OrderedRefusal] {
            assert_eq!(MatchMode::from_arg(m::DEFAULT, default), Some(default));
            assert_eq!(MatchMode::from_arg(m::UNEXPECTED, default), Some(MatchMode::Unexpected));
            assert_eq!(MatchMode::from_arg(m::ORDERED_REFUSAL, default), Some(MatchMode::OrderedRefusal));
            assert_eq!(MatchMode::from_arg(3, default), None, "an unknown mode is refused");
        }
        assert_eq!(Config::default().matching, MatchMode::Unexpected);
    }

    fn booted(features: u32) -> (NullHal, Nic) {
        let l = Layout::new(emp_uapi::sram::LayoutParams { staging_size: 4096, ..Default::default() }).unwrap();
        let mut hal = NullHal(vec![0; l.sram_size as usize]);
        let mut h = l.header(0, 1500, 0);
        h.features = features;
        h.put(&mut hal.0);
        let nic = Nic::boot(&mut hal, Config::default()).unwrap();
        (hal, nic)
    }

    #[test]
    fn boot_sizes_the_unexpected_tables_and_picks_the_default_mode() {
        let (_, nic) = booted(0);
        let cfg = Config::default();
        assert_eq!(nic.config().matching, MatchMode::Unexpected);
        assert_eq!(nic.recv.overflow.available(), cfg.unexp_slots, "the eager pool");
        assert_eq!(nic.recv.unexp.capacity(), cfg.unexp_slots + cfg.unexp_headers);
        assert!(nic.ports.iter().all(|p| p.mode == MatchMode::Unexpected));
        for f in [FEATURE_ORDERED_REFUSAL, FEATURE_MODIFIED_ACK_NACK] {
            let (_, nic) = booted(f);
            assert_eq!(nic.config().matching, MatchMode::OrderedRefusal, "features {f:#x}");
            assert_eq!(nic.config().overflow_slots, 0, "no overflow buffer without FEATURE_OVERFLOW");
        }
        assert_eq!(nic.unexp_invariants(), Ok(()));
    }

    #[test]
    fn a_cached_mr_entry_stops_working_when_the_trusted_side_changes_it_unfenced() {
        use emp_uapi::desc::{MrEntry, MrFormat, PhysSeg, MR_LOCAL_READ, MR_LOCAL_WRITE};
        let (mut hal, nic) = booted(0);
        let at = nic.layout.mr_entry(5);
        let entry = |key: u32, port: u16, access: u8| {
            let mut e =
                MrEntry { key, port, access, format: MrFormat::Chained as u8, length: 4096, ..Default::default() };
            e.segs[0] = PhysSeg { addr: 0x1000, len: 4096, flags: 0 };
            e
        };
        let rw = MR_LOCAL_READ | MR_LOCAL_WRITE;
        let k1 = 0x0001_0005;
        entry(k1, 2, rw).put(&mut hal.0[at..at + MrEntry::SIZE]);
        for _ in 0..2 {
            assert_eq!(nic.mr_lookup(&mut hal, 2, k1, 0, 4096, rw).map(|e| e.key), Ok(k1), "read, then cached");
        }
        assert_eq!(nic.mr_lookup(&mut hal, 2, k1, 1, 4096, rw).err(), Some(Status::AccessDenied), "past the end");
        assert_eq!(nic.mr_lookup(&mut hal, 3, k1, 0, 8, rw).err(), Some(Status::BadKey), "another port's");
        // Moved to port 3 (no fence): the old owner's use is refused at once.
        entry(k1, 3, rw).put(&mut hal.0[at..at + MrEntry::SIZE]);
        assert_eq!(nic.mr_lookup(&mut hal, 2, k1, 0, 8, rw).err(), Some(Status::BadKey));
        assert!(nic.mr_lookup(&mut hal, 3, k1, 0, 8, rw).is_ok());
        // Rights taken away.
        entry(k1, 3, MR_LOCAL_READ).put(&mut hal.0[at..at + MrEntry::SIZE]);
        assert_eq!(nic.mr_lookup(&mut hal, 3, k1, 0, 8, rw).err(), Some(Status::AccessDenied));
        // Invalidated (zeroed, no fence), then the slot registered again
        // under a new key: the old key is refused, the new one works.
        MrEntry::default().put(&mut hal.0[at..at + MrEntry::SIZE]);
        assert_eq!(nic.mr_lookup(&mut hal, 3, k1, 0, 8, MR_LOCAL_READ).err(), Some(Status::BadKey));
        let k2 = 0x0002_0005;
        let mut e2 = entry(k2, 3, rw);
        e2.length = 64;
        e2.segs[0].len = 64;
        e2.put(&mut hal.0[at..at + MrEntry::SIZE]);
        assert_eq!(nic.mr_lookup(&mut hal, 3, k1, 0, 8, rw).err(), Some(Status::BadKey));
        assert_eq!(nic.mr_lookup(&mut hal, 3, k2, 0, 64, rw).map(|e| e.length), Ok(64), "the new entry, not the old");
        assert_eq!(nic.mr_lookup(&mut hal, 3, k2, 0, 65, rw).err(), Some(Status::AccessDenied));
        // Registered again under the same key (a key generator that
        // repeated) with a new secret and length: the new entry is used.
        let mut e3 = entry(k2, 3, rw);
        e3.secret = 0x5EC2;
        e3.put(&mut hal.0[at..at + MrEntry::SIZE]);
        assert_eq!(nic.mr_lookup(&mut hal, 3, k2, 0, 4096, rw).map(|e| e.length), Ok(4096), "not the cached 64 B one");
        // A slot sharing the line (5 + 64) evicts it and is evicted in turn.
        let at2 = nic.layout.mr_entry(69);
        if 69 < nic.layout.params.mr_entries as usize {
            entry(0x0001_0045, 3, rw).put(&mut hal.0[at2..at2 + MrEntry::SIZE]);
            assert!(nic.mr_lookup(&mut hal, 3, 0x0001_0045, 0, 8, rw).is_ok());
            assert!(nic.mr_lookup(&mut hal, 3, k2, 0, 64, rw).is_ok());
        }
    }

    #[test]
    fn timers_pop_in_deadline_order() {
        let mut t = TimerHeap::default();
        let g = |slot| timer::Timer::Atomic { slot, stamp: 1 };
        t.arm(30, g(3));
        t.arm(10, g(1));
        t.arm(20, g(2));
        assert_eq!(t.next_deadline(), Some(10));
        assert_eq!(t.pop_expired(5), None);
        assert_eq!(t.pop_expired(25), Some(g(1)));
        assert_eq!(t.pop_expired(25), Some(g(2)));
        assert_eq!(t.pop_expired(25), None);
        assert_eq!(t.len(), 1);
    }

    struct NullHal(Vec<u8>);
    impl Hal for NullHal {
        fn sram_read(&mut self, off: usize, buf: &mut [u8]) {
            buf.copy_from_slice(&self.0[off..off + buf.len()]);
        }
        fn sram_write(&mut self, off: usize, data: &[u8]) {
            self.0[off..off + data.len()].copy_from_slice(data);
        }
        fn dma_read(&mut self, _: u64, _: &mut [u8]) -> Result<(), DmaError> {
            Err(DmaError)
        }
        fn dma_write(&mut self, _: u64, _: &[u8]) -> Result<(), DmaError> {
            Err(DmaError)
        }
        fn dma_fence(&mut self) {}
        fn mac_transmit(&mut self, _: u16, _: &[u8]) {}
        fn mac_transmit_host(&mut self, _: u16, _: &[u8], _: &[HostSeg]) -> Result<(), DmaError> {
            Ok(())
        }
        fn raise_interrupt(&mut self, _: u16) {}
    }

    #[test]
    fn boot_refuses_a_bad_layout_and_says_why() {
        let mut hal = NullHal(vec![0; 4096]);
        assert_eq!(Nic::boot(&mut hal, Config::default()).err(), Some(FailReason::BadLayout));
        let h = SramHeader::get(&hal.0);
        assert_eq!((h.status, h.fail_reason), (NicStatus::Failed as u32, FailReason::BadLayout as u32));
    }

    #[test]
    fn boot_marks_running_and_garbage_frames_are_counted() {
        let l = Layout::new(emp_uapi::sram::LayoutParams { staging_size: 4096, ..Default::default() }).unwrap();
        let mut hal = NullHal(vec![0; l.sram_size as usize]);
        l.header(0, 1500, 0).put(&mut hal.0);
        let mut nic = Nic::boot(&mut hal, Config::default()).unwrap();
        assert_eq!(SramHeader::get(&hal.0).status, NicStatus::Running as u32);
        for junk in [&[][..], &[1, 2, 3], &[0xFF; 100]] {
            nic.handle_frame(&mut hal, 0, junk);
        }
        assert_eq!(nic.counters()[counter::DROPPED_MALFORMED], 3);
        assert_eq!(SramHeader::get(&hal.0).counters[counter::DROPPED_MALFORMED], 3, "published in SRAM");
    }
}
