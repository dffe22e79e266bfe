//! Scenarios: a seeded workload of tagged messages, remote atomics and
//! collectives between endpoints (a [`Spec`] draws it into a plan,
//! `plan.rs`), driven on a [`World`]: the driver posts each operation
//! through the real SRAM rings when due, keeps going through loss,
//! duplication, reordering and a partition that heals until every
//! operation completed (liveness), and hands every completion and the
//! state at quiesce to the checkers (`checker/`: delivery, atomics,
//! collectives, leaks).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;

use emp_firmware::{Config, FlowControl, MatchMode};
use emp_uapi::desc::{
    Cqe, Opcode, RemoteSge, Sge, Status, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE, MR_REMOTE_ATOMIC, MR_REMOTE_READ,
    MR_REMOTE_WRITE, WD_IMM, WD_SIGNALED,
};
use emp_uapi::sram::{
    admin_result as ar, AdminOp, LayoutParams, FEATURE_IMMEDIATE_SENDING, FEATURE_MODIFIED_ACK_NACK, FEATURE_OVERFLOW,
};
use emp_uapi::{sram::counter, Le, ANY_NODE, ANY_PORT, PAGE_SIZE};

use crate::checker::{leak, Atomics, Collectives, Delivery, Rma};
use crate::collplan::CollPlan;
use crate::host::{
    admin_post, admin_result, alloc_region, mr_entry, reset_port_ctl, work_desc, HostMem, HostPort, Sram,
};
use crate::plan::{
    AtomicPlan, Expect, MsgPlan, Plan, RecvPlan, RmaBad, RmaKind, RmaPlan, ATOMIC_BIT, COLL_BIT, RECV_BIT, RMA_BIT,
    RMA_RECV_BIT,
};
use crate::rng::{fill_pattern, Rng};
use crate::world::{Partition, Step, WireConfig, World};

/// Everything that defines a run. Printed in full on failure.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// Seed of every random choice.
    pub seed: u64,
    /// NICs.
    pub nodes: u16,
    /// Open ports per NIC.
    pub ports: u16,
    /// Messages.
    pub messages: u32,
    /// Largest message.
    pub size_max: u64,
    /// Probability a message is "large" (up to `size_max`); others are ≤ 4 KiB.
    pub large_prob: f64,
    /// MTU.
    pub mtu: u32,
    /// ACK group size.
    pub group_size: u32,
    /// Flow control.
    pub flow: FlowControl,
    /// Overflow buffer slots (0 = off).
    pub overflow_slots: u32,
    /// What a message no posted receive matches gets (Modified ACK/NACK
    /// keeps ordered refusal whatever this says).
    pub matching: MatchMode,
    /// Eager pool slots and retained-header entries of the unexpected
    /// mode (small ones exercise refusal when full).
    pub unexp_slots: u32,
    pub unexp_headers: u32,
    /// Sends and receives are posted at random times in `[0, spread_ns]`.
    pub spread_ns: u64,
    /// Probability an exact receive gets a shorter buffer.
    pub truncate_prob: f64,
    /// Add sends that must fail (closed port, bad key, bad descriptor).
    pub errors: bool,
    /// NIC CPU plan (`emp_uapi::image::cpu_plan`).
    pub cpu_plan: u32,
    /// Data movement goes between the NIC's CPUs as jobs (as with CPUs on
    /// threads, `firmware::Config::cpu_jobs`) rather than as work. Swarm:
    /// odd seeds.
    pub cpu_jobs: bool,
    /// Doorbells and frames go to the sides' entry points first
    /// ([`crate::world::World::sides`]). Swarm: seeds 2 and 3 mod 4.
    pub sides: bool,
    /// Wire behaviour.
    pub wire: WireConfig,
    /// Drawn by [`Spec::swarm`] (replayed by seed) or set from flags.
    pub swarm: bool,
    /// Remote fetch-add(1)s on one shared counter word.
    pub atomics: u32,
    /// Collective operations on one group over random endpoints.
    pub collectives: u32,
    /// Remote writes and reads between random endpoints' RMA windows.
    pub rma: u32,
    /// The NICs' writes to host memory appear late and in random byte
    /// order, ordered only by DMA fences (`emp_sim::weak_dma`); hosts check
    /// every completion they accept against what the NIC wrote.
    pub weak_dma: bool,
    /// How long a receiver may hold a coalesced ACK (`Config::ack_delay_ns`).
    pub ack_delay_ns: u64,
    /// Messages one coalesced ACK may cover (`Config::ack_coalesce_max`).
    pub ack_coalesce_max: u32,
    /// The NICs have Immediate Sending (`FEATURE_IMMEDIATE_SENDING`):
    /// one-frame sends go out with their payload read from host memory.
    pub immediate_sending: bool,
    /// Probability a send or receive is posted as a persistent descriptor
    /// (`WD_PERSIST` into one of the ring's slots, then a 24-byte start:
    /// thesis §2.3.3) instead of a plain one.
    pub persistent: f64,
}

impl Spec {
    /// Fixed knobs for a command-line run.
    pub fn basic(seed: u64, nodes: u16, messages: u32) -> Spec {
        Spec {
            seed,
            nodes,
            ports: 1,
            messages,
            size_max: 64 << 10,
            large_prob: 0.05,
            mtu: 1500,
            group_size: 3,
            flow: FlowControl::Off,
            overflow_slots: 0,
            matching: MatchMode::Unexpected,
            unexp_slots: Config::default().unexp_slots,
            unexp_headers: Config::default().unexp_headers,
            spread_ns: messages as u64 * 2_000,
            truncate_prob: 0.0,
            errors: false,
            cpu_plan: 0,
            cpu_jobs: false,
            sides: false,
            wire: WireConfig::default(),
            swarm: false,
            atomics: 0,
            collectives: 0,
            weak_dma: false,
            rma: 0,
            ack_delay_ns: Config::default().ack_delay_ns,
            ack_coalesce_max: Config::default().ack_coalesce_max,
            immediate_sending: false,
            persistent: 0.0,
        }
    }

    /// Random knobs for the swarm (TigerBeetle VOPR style): every fault
    /// dimension drawn from the seed.
    pub fn swarm(seed: u64) -> Spec {
        let mut r = Rng::new(seed ^ 0x5157_4152_4D00_0000);
        let nodes = r.range(2, 16) as u16;
        let large = r.chance(0.04);
        let messages = r.range(1, if nodes > 8 { 40 } else { 24 }) as u32;
        let loss = if r.chance(0.25) { 0.0 } else { r.unit() * 0.2 };
        let partition = r.chance(0.15).then(|| {
            let start_ns = r.range(0, 200_000);
            Partition {
                start_ns,
                end_ns: start_ns + r.range(1_000_000, 200_000_000),
                side: (0..nodes).map(|_| r.chance(0.5)).collect(),
            }
        });
        Spec {
            seed,
            nodes,
            ports: r.range(1, 3) as u16,
            messages,
            size_max: if large { 4 << 20 } else { r.range(0, 3) * 8192 + 4096 },
            large_prob: if large { 0.1 } else { 0.2 },
            mtu: if r.chance(0.2) { 9000 } else { 1500 },
            group_size: [1, 2, 3, 3, 4, 8][r.below(6) as usize],
            flow: [FlowControl::Off, FlowControl::Piggyback, FlowControl::ModifiedAckNack][r.below(3) as usize],
            overflow_slots: if r.chance(0.4) { r.range(1, 16) as u32 } else { 0 },
            spread_ns: r.range(0, 2_000_000),
            truncate_prob: if r.chance(0.3) { 0.1 } else { 0.0 },
            errors: r.chance(0.15),
            cpu_plan: r.below(5) as u32,
            cpu_jobs: seed % 2 == 1,
            sides: seed % 4 >= 2,
            wire: WireConfig {
                latency_ns: r.range(1_000, 50_000),
                bandwidth_bps: [1_000_000_000, 10_000_000_000, 25_000_000_000][r.below(3) as usize],
                loss,
                dup: if r.chance(0.3) { r.unit() * 0.05 } else { 0.0 },
                reorder: if r.chance(0.3) { r.unit() * 0.3 } else { 0.0 },
                reorder_jitter_ns: r.range(1_000, 100_000),
                partition,
                corrupt: 0.0,
                min_frame_bytes: 0,
            },
            swarm: true,
            // Drawn last: the other knobs of a seed stay what they were.
            atomics: if r.chance(0.5) { r.range(1, 48) as u32 } else { 0 },
            collectives: if r.chance(0.4) { r.range(1, 24) as u32 } else { 0 },
            weak_dma: r.chance(0.5),
            // Drawn after everything else, for the same reason.
            rma: if r.chance(0.4) { r.range(1, 24) as u32 } else { 0 },
            // Drawn after everything else, for the same reason.
            matching: if r.chance(0.25) { MatchMode::OrderedRefusal } else { MatchMode::Unexpected },
            unexp_slots: [0, 1, 4, 64][r.below(4) as usize],
            unexp_headers: [1, 2, 8, 256][r.below(4) as usize],
            // Drawn after everything else, for the same reason.
            immediate_sending: r.chance(0.5),
            // Drawn after everything else, for the same reason: coalesced
            // ACKs under every fault (a lost one made good by the next).
            ack_delay_ns: [0, 0, 2_000, 20_000, 200_000][r.below(5) as usize],
            ack_coalesce_max: [1, 4, 16, 64][r.below(4) as usize],
            // Drawn after everything else, for the same reason.
            persistent: if r.chance(0.3) { 0.5 } else { 0.0 },
        }
    }

    /// Command that replays this scenario exactly.
    pub fn replay_command(&self) -> String {
        if self.swarm {
            return format!("cargo run --release -p emp-sim -- swarm --seed {} --count 1 --verbose", self.seed);
        }
        let flow = match self.flow {
            FlowControl::Off => "off",
            FlowControl::Piggyback => "piggyback",
            FlowControl::ModifiedAckNack => "mack",
        };
        let mut cmd = format!(
            "cargo run --release -p emp-sim -- --nodes {} --messages {} --seed {} --loss {} --dup {} --reorder {} \
             --max-size {} --mtu {} --group {} --flow {flow} --overflow {} --ports {} --cpu-plan {} --matching {} \
             --unexp-slots {} --unexp-headers {}",
            self.nodes,
            self.messages,
            self.seed,
            self.wire.loss,
            self.wire.dup,
            self.wire.reorder,
            self.size_max,
            self.mtu,
            self.group_size,
            self.overflow_slots,
            self.ports,
            self.cpu_plan,
            self.matching.name(),
            self.unexp_slots,
            self.unexp_headers
        );
        if self.atomics > 0 {
            cmd += &format!(" --atomics {}", self.atomics);
        }
        if self.collectives > 0 {
            cmd += &format!(" --collectives {}", self.collectives);
        }
        if self.rma > 0 {
            cmd += &format!(" --rma {}", self.rma);
        }
        if self.weak_dma {
            cmd += " --weak-dma";
        }
        if self.immediate_sending {
            cmd += " --immediate-sending";
        }
        if self.persistent > 0.0 {
            cmd += &format!(" --persistent {}", self.persistent);
        }
        if let Some(p) = &self.wire.partition {
            cmd += &format!(" --partition-ms {}", p.end_ns / 1_000_000);
        }
        cmd
    }

    /// The retry budget of the control program this scenario runs.
    pub fn retry_budget_ns(&self) -> u64 {
        self.firmware_config().retry_budget_ns()
    }

    /// Does the partition outlast the retry budget? Then sends across it
    /// may fail with `RetryLimitExceeded`, which the checker expects.
    pub fn partition_outlasts_budget(&self) -> bool {
        self.wire.partition.as_ref().is_some_and(|p| p.end_ns - p.start_ns > self.retry_budget_ns())
    }

    fn firmware_config(&self) -> Config {
        Config {
            group_size: self.group_size,
            window_frames: (16 * self.group_size).max(48),
            overflow_slots: self.overflow_slots,
            matching: self.matching,
            unexp_slots: self.unexp_slots,
            unexp_headers: self.unexp_headers,
            flow_control: self.flow,
            // The workload posts every receive and send up front, as a
            // bulk-synchronous program would: size the tables for it (a
            // smaller bound is a resource deadlock the application owns,
            // as with a verbs queue depth).
            cpu_plan: self.cpu_plan,
            cpu_jobs: self.cpu_jobs,
            tx_max: self.messages.max(1024),
            recv_posted_max: self.messages.max(4096),
            ack_delay_ns: self.ack_delay_ns,
            ack_coalesce_max: self.ack_coalesce_max,
            ..Config::default()
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Messages delivered.
    pub delivered: u64,
    /// Messages completed with the error the scenario expected.
    pub expected_errors: u64,
    /// Receives truncated as expected.
    pub truncated: u64,
    /// Remote atomics executed (the counter's final value).
    pub atomics: u64,
    /// Collective operations completed (one per member per operation).
    pub collectives: u64,
    /// Remote writes and reads completed successfully.
    pub rma: u64,
    /// NIC counters summed over all NICs.
    pub counters: [u64; counter::COUNT],
    /// Wire counters.
    pub wire: crate::world::WireStats,
    /// Virtual time at quiesce (ns).
    pub sim_ns: u64,
    /// Events processed.
    pub events: u64,
    /// Frames sent with their payload straight from host memory
    /// (Immediate Sending), all NICs.
    pub frames_sent_from_host: u64,
    /// Jobs the NICs' CPUs ran (data movement handed between them).
    pub cpu_jobs_run: u64,
    /// Doorbells and frame batches the NICs' sides ran alone, without the
    /// whole program (`Nic::side_entries`).
    pub side_entries: u64,
    /// Sends and receives posted as persistent descriptors (store, start).
    pub persistent_posts: u64,
}

impl Report {
    /// Human-readable summary.
    pub fn render(&self) -> String {
        let c = &self.counters;
        let mut s = String::new();
        let _ = writeln!(s, "delivered        {}", self.delivered);
        let _ = writeln!(s, "truncated        {}", self.truncated);
        let _ = writeln!(s, "expected errors  {}", self.expected_errors);
        let _ = writeln!(s, "atomics          {} ({} replayed)", self.atomics, c[counter::ATOMIC_REPLAYS]);
        let _ = writeln!(
            s,
            "collectives      {} ({} early, {} refused)",
            self.collectives,
            c[counter::COLL_EARLY],
            c[counter::COLL_REFUSED]
        );
        let _ = writeln!(s, "rma              {}", self.rma);
        let _ = writeln!(s, "frames on wire   {}", self.wire.frames);
        let _ = writeln!(s, "data frames      {}", c[counter::TX_FRAMES]);
        let _ = writeln!(s, "retransmitted    {}", c[counter::RETRANSMITS]);
        let _ = writeln!(s, "duplicates       {}", c[counter::DUPLICATES]);
        let _ = writeln!(s, "out of order     {}", c[counter::OUT_OF_ORDER]);
        let _ = writeln!(s, "dropped (unexp.) {}", c[counter::DROPPED_UNEXPECTED]);
        let _ = writeln!(s, "overflowed       {}", c[counter::OVERFLOW_MSGS]);
        let _ = writeln!(
            s,
            "unexpected       eager {} ({} B) retained {} pulled {} refused full {}",
            c[counter::UNEXP_EAGER],
            c[counter::UNEXP_BYTES],
            c[counter::UNEXP_RDV],
            c[counter::RDV_PULLS],
            c[counter::UNEXP_REFUSED_FULL]
        );
        let _ = writeln!(s, "timeouts         {}", c[counter::TIMEOUTS]);
        let _ = writeln!(s, "acks / nacks     {} / {}", c[counter::ACKS_TX], c[counter::NACKS_TX]);
        let _ = writeln!(
            s,
            "wire faults      lost {} partitioned {} duplicated {} reordered {}",
            self.wire.lost, self.wire.partitioned, self.wire.duplicated, self.wire.reordered
        );
        let _ = writeln!(s, "simulated time   {:.6} s", self.sim_ns as f64 / 1e9);
        let _ = write!(s, "events           {}", self.events);
        s
    }
}

/// What a send is expected to end with.
#[derive(Clone, Copy, Debug)]
enum Post {
    Send(u32),
    Recv(u32),
    Atomic(u32),
    /// Operation `.0` of the collective plan, by member `.1`.
    Coll(u32, u16),
    /// RMA operation `.0`.
    Rma(u32),
    /// The receive RMA write `.0` with immediate data completes.
    RmaRecv(u32),
}

/// How a (destination endpoint, tag class) is served.
#[derive(Clone, Copy)]
enum Mode {
    Exact,
    AnySourceExactTag,
    MaskedPerSource,
    MaskedAnySource,
}

/// MR slot of each port's atomic counter region (`ATOMIC_SLOT + port`).
const ATOMIC_SLOT: u32 = 32;
/// Bytes of that region; the counter is the 64-bit word at offset 8.
const ATOMIC_REGION: u64 = 64;
const COUNTER_OFF: u64 = 8;
/// MR slot of each port's RMA window (`RMA_SLOT + port`), its bytes, and
/// the part of it reads read (writes write the rest, each its own slice).
const RMA_SLOT: u32 = 48;
const RMA_WINDOW: u64 = 64 << 10;
const RMA_READ_AREA: u64 = 16 << 10;

fn make_plan(spec: &Spec, r: &mut Rng) -> Plan {
    let mut msgs = Vec::new();
    let eps: Vec<(u16, u16)> = (0..spec.nodes).flat_map(|n| (0..spec.ports).map(move |p| (n, p))).collect();
    for _ in 0..spec.messages {
        let src = eps[r.below(eps.len() as u64) as usize];
        let dst = eps[r.below(eps.len() as u64) as usize];
        let len = if r.chance(spec.large_prob) {
            r.range(0, spec.size_max)
        } else {
            match r.below(4) {
                0 => r.range(0, 64),
                1 => r.range(0, 1500),
                _ => r.range(0, (4096u64).min(spec.size_max)),
            }
        };
        let class = r.below(3);
        let sge_pieces = r.range(1, 4) as usize;
        msgs.push(MsgPlan {
            src,
            dst,
            len,
            tag: class << 32,
            send_at: r.below(spec.spread_ns + 1),
            buf_off: 0,
            expect: Expect::Deliver,
            sge_pieces,
            corrupt: 0,
            persistent: false,
        });
    }
    if spec.errors {
        let src = eps[r.below(eps.len() as u64) as usize];
        let closed = (r.below(spec.nodes as u64) as u16, spec.ports);
        let base = MsgPlan {
            src,
            dst: closed,
            len: r.range(0, 3000),
            tag: 7 << 32,
            send_at: r.below(spec.spread_ns + 1),
            buf_off: 0,
            expect: Expect::Fail(Status::RemotePortClosed),
            sge_pieces: 1,
            corrupt: 0,
            persistent: false,
        };
        msgs.push(base.clone());
        msgs.push(MsgPlan { dst: eps[0], expect: Expect::Fail(Status::BadKey), corrupt: 1, ..base.clone() });
        msgs.push(MsgPlan { dst: eps[0], expect: Expect::Fail(Status::BadDescriptor), corrupt: 2, ..base });
    }
    if let Some(p) = spec.wire.partition.as_ref().filter(|p| p.end_ns - p.start_ns > spec.retry_budget_ns()) {
        for m in msgs.iter_mut().filter(|m| m.expect == Expect::Deliver) {
            if p.side[m.src.0 as usize] != p.side[m.dst.0 as usize] {
                m.expect = Expect::DeliverOrFail(Status::RetryLimitExceeded);
            }
        }
    }
    // Message ids follow posting order, so per-pair order is id order.
    msgs.sort_by_key(|m| m.send_at);
    for (id, m) in msgs.iter_mut().enumerate() {
        m.tag |= id as u64;
    }
    let mut region_len: HashMap<(u16, u16), u64> = HashMap::new();
    let mut bump = |ep: (u16, u16), len: u64, r: &mut Rng| {
        let e = region_len.entry(ep).or_insert(0);
        *e += r.below(64); // Unaligned buffers.
        let off = *e;
        *e += len;
        off
    };
    for m in msgs.iter_mut() {
        m.buf_off = bump(m.src, m.len, r);
    }
    // Receives: per (destination, class) one matching mode, so that every
    // message always has a receive whatever order frames arrive in.
    let mut groups: BTreeMap<((u16, u16), u64), Vec<u32>> = BTreeMap::new();
    for (id, m) in msgs.iter().enumerate() {
        if matches!(m.expect, Expect::Deliver | Expect::DeliverOrFail(_)) {
            groups.entry((m.dst, m.tag >> 32)).or_default().push(id as u32);
        }
    }
    let mut recvs = Vec::new();
    for ((dst, class), ids) in groups {
        let mode =
            [Mode::Exact, Mode::AnySourceExactTag, Mode::MaskedPerSource, Mode::MaskedAnySource][r.below(4) as usize];
        let max_len = ids.iter().map(|&i| msgs[i as usize].len).max().unwrap_or(0);
        for &id in &ids {
            let m = &msgs[id as usize];
            let post_at = r.below(spec.spread_ns + 1);
            let sge_pieces = r.range(1, 6) as usize;
            let (node, port, tag, ignore, buf_len, ambiguous) = match mode {
                Mode::Exact => {
                    let short = r.chance(spec.truncate_prob) && m.len > 0;
                    let buf = if short { r.below(m.len) } else { m.len + r.below(2) * r.below(100) };
                    (m.src.0, m.src.1, m.tag, 0, buf, false)
                }
                Mode::AnySourceExactTag => (ANY_NODE, ANY_PORT, m.tag, 0, m.len, false),
                Mode::MaskedPerSource => (m.src.0, m.src.1, class << 32, 0xFFFF_FFFF, max_len, true),
                Mode::MaskedAnySource => (ANY_NODE, ANY_PORT, class << 32, 0xFFFF_FFFF, max_len, true),
            };
            let buf_off = bump(dst, buf_len, r);
            recvs.push(RecvPlan {
                dst,
                post_at,
                node,
                port,
                tag,
                ignore,
                buf_len,
                buf_off,
                ambiguous,
                sge_pieces,
                persistent: false,
            });
        }
    }
    let (atomics, counter_at) = plan_atomics(spec, &eps, r, &mut bump);
    // Drawn last and only when asked for: other runs stay as they were.
    let coll = (spec.collectives > 0)
        .then(|| CollPlan::draw(spec.seed, spec.collectives, &eps, spec.spread_ns, spec.mtu, r, &mut bump));
    let rma = plan_rma(spec, &eps, r, &mut bump);
    // Drawn last and only when asked for, as the collectives. Not the
    // sends that must fail: their failure is the plain post's.
    if spec.persistent > 0.0 {
        for m in msgs.iter_mut().filter(|m| m.corrupt == 0) {
            m.persistent = r.chance(spec.persistent);
        }
        for rv in recvs.iter_mut() {
            rv.persistent = r.chance(spec.persistent);
        }
    }
    Plan { msgs, recvs, atomics, counter_at, coll, rma, region_len }
}

/// Remote writes (some with immediate data) and reads between random
/// endpoints: writes into disjoint slices of the target's window beyond
/// its read area, reads from the read area; with `errors`, a write with a
/// wrong secret and a read beyond the window.
fn plan_rma(
    spec: &Spec,
    eps: &[(u16, u16)],
    r: &mut Rng,
    bump: &mut impl FnMut((u16, u16), u64, &mut Rng) -> u64,
) -> Vec<RmaPlan> {
    if spec.rma == 0 {
        return Vec::new(); // No draw: runs without RMA are unchanged.
    }
    let long_partition = spec.wire.partition.as_ref().filter(|p| p.end_ns - p.start_ns > spec.retry_budget_ns());
    let mut next_slice: HashMap<(u16, u16), u64> = HashMap::new();
    let mut out = Vec::new();
    let n_bad = if spec.errors { 2 } else { 0 };
    for i in 0..spec.rma + n_bad {
        let src = eps[r.below(eps.len() as u64) as usize];
        let dst = eps[r.below(eps.len() as u64) as usize];
        let len = match r.below(4) {
            0 => r.range(0, 64),
            1 => r.range(0, 1500),
            2 => r.range(0, 4096),
            _ => r.range(0, 12 << 10),
        };
        let mut kind = [RmaKind::Write, RmaKind::WriteImm, RmaKind::Read][r.below(3) as usize];
        let post_at = r.below(spec.spread_ns + 1);
        let recv_post_at = r.below(spec.spread_ns + 1);
        let crosses = long_partition.is_some_and(|p| p.side[src.0 as usize] != p.side[dst.0 as usize]);
        if crosses && kind == RmaKind::WriteImm {
            kind = RmaKind::Write; // A receive for a write that may be given up would stay posted.
        }
        let mut op = RmaPlan {
            src,
            dst,
            kind,
            post_at,
            recv_post_at,
            len,
            remote_off: 0,
            local_off: 0,
            bad: RmaBad::No,
            expect: if crosses { Expect::DeliverOrFail(Status::RetryLimitExceeded) } else { Expect::Deliver },
        };
        if i >= spec.rma {
            // The misuses: refused by the target, its memory unchanged.
            op.expect = Expect::Fail(Status::RemoteAccessError);
            if i == spec.rma {
                (op.kind, op.bad) = (RmaKind::Write, RmaBad::Secret);
            } else {
                op.kind = RmaKind::Read;
                op.len = op.len.max(4);
                op.remote_off = RMA_WINDOW - op.len / 2 - 1; // Past the window's end.
            }
        }
        if op.kind == RmaKind::Read {
            if op.expect != Expect::Fail(Status::RemoteAccessError) {
                op.len = op.len.min(RMA_READ_AREA);
                op.remote_off = r.below(RMA_READ_AREA - op.len + 1);
            }
        } else {
            let at = next_slice.entry(dst).or_insert(RMA_READ_AREA);
            if *at + op.len > RMA_WINDOW {
                op.len = 0; // The window is spoken for: an empty write.
            }
            op.remote_off = *at;
            *at += op.len;
        }
        op.local_off = bump(src, op.len, r);
        out.push(op);
    }
    out
}

/// Fetch-adds from random endpoints at random times on one endpoint's
/// counter; with `errors`, one to the closed port and one with a wrong key.
fn plan_atomics(
    spec: &Spec,
    eps: &[(u16, u16)],
    r: &mut Rng,
    bump: &mut impl FnMut((u16, u16), u64, &mut Rng) -> u64,
) -> (Vec<AtomicPlan>, (u16, u16)) {
    if spec.atomics == 0 {
        return (Vec::new(), eps[0]); // No draw: runs without atomics are unchanged.
    }
    let counter_at = eps[r.below(eps.len() as u64) as usize];
    let mut out = Vec::new();
    for _ in 0..spec.atomics {
        let src = eps[r.below(eps.len() as u64) as usize];
        let post_at = r.below(spec.spread_ns + 1);
        out.push(AtomicPlan { src, dst: counter_at, post_at, result_off: 0, bad_key: false, expect: Expect::Deliver });
    }
    if spec.errors {
        let src = eps[r.below(eps.len() as u64) as usize];
        let post_at = r.below(spec.spread_ns + 1);
        let closed = (counter_at.0, spec.ports);
        out.push(AtomicPlan {
            src,
            dst: closed,
            post_at,
            result_off: 0,
            bad_key: false,
            expect: Expect::Fail(Status::RemotePortClosed),
        });
        out.push(AtomicPlan {
            src,
            dst: counter_at,
            post_at,
            result_off: 0,
            bad_key: true,
            expect: Expect::Fail(Status::RemoteAccessError),
        });
    }
    for a in out.iter_mut() {
        a.result_off = bump(a.src, 8, r);
    }
    (out, counter_at)
}

/// A failed run: what broke, the knobs, and how to replay it.
#[derive(Debug)]
pub struct Failure {
    /// The broken invariant.
    pub what: String,
    /// The scenario.
    pub spec: Spec,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} failed: {}\n  spec: {:?}\n  replay: {}",
            self.spec.seed,
            self.what,
            self.spec,
            self.spec.replay_command()
        )
    }
}

struct Driver {
    world: World,
    plan: Plan,
    ports: Vec<Vec<HostPort>>,
    /// Per (node, port, is_send): posts waiting for ring room, in order.
    /// Sends and receives wait apart: a full send ring must not hold back
    /// the receives that would let those sends complete.
    backlog: HashMap<(u16, u16, bool), VecDeque<Post>>,
    /// Per node: posts not yet due, sorted by time.
    schedule: Vec<VecDeque<(u64, u16, Post)>>,
    delivery: Delivery,
    atomics: Atomics,
    colls: Collectives,
    /// Per node, per port: the key of the port's atomic counter region.
    atomic_keys: Vec<Vec<(u32, crate::host::Region)>>,
    rma: Rma,
    /// Per node, per port: the port's RMA window.
    rma_windows: Vec<Vec<crate::host::Region>>,
    outstanding: u64,
    /// Sends and receives posted as a stored descriptor and a start.
    persistent_posts: u64,
}

fn fail(spec: &Spec, what: String) -> Failure {
    Failure { what, spec: spec.clone() }
}

/// Runs one scenario and checks every invariant.
#[allow(clippy::result_large_err)] // a failure ends the run; it carries the whole trace
pub fn run(spec: &Spec) -> Result<Report, Failure> {
    let mut r = Rng::new(spec.seed);
    let plan = make_plan(spec, &mut r);
    let mut features = 0;
    if spec.overflow_slots > 0 {
        features |= FEATURE_OVERFLOW;
    }
    if spec.flow == FlowControl::ModifiedAckNack {
        features |= FEATURE_MODIFIED_ACK_NACK;
    }
    if spec.immediate_sending {
        features |= FEATURE_IMMEDIATE_SENDING;
    }
    let params = LayoutParams {
        ports: spec.ports + 1,
        mr_entries: 64,
        route_entries: spec.nodes as u32 + 1,
        group_entries: spec.ports as u32,
        staging_size: PAGE_SIZE as u32,
        send_entries: 64,
        recv_entries: 64,
    };
    let mem: Vec<usize> = (0..spec.nodes)
        .map(|n| {
            (0..spec.ports)
                .map(|p| {
                    let posts = plan.posts_of((n, p));
                    let data = plan.region_len.get(&(n, p)).copied().unwrap_or(0).max(1);
                    let cq = ((posts + 1) as u64).next_power_of_two().max(64) * Cqe::SIZE as u64;
                    HostMem::pages_for_region(data)
                        + HostMem::pages_for_region(cq)
                        + HostMem::pages_for_region(ATOMIC_REGION)
                        + HostMem::pages_for_region(RMA_WINDOW)
                })
                .sum::<usize>()
                * PAGE_SIZE
        })
        .collect();
    let mut world =
        World::new(spec.nodes, params, spec.mtu, features, spec.firmware_config(), spec.wire.clone(), r.fork(), &mem);
    if spec.weak_dma {
        world.weak_dma(spec.seed);
    }
    world.sides = spec.sides;
    let mut d = Driver {
        world,
        ports: Vec::new(),
        backlog: HashMap::new(),
        schedule: vec![VecDeque::new(); spec.nodes as usize],
        delivery: Delivery::new(&plan),
        atomics: Atomics::new(&plan),
        colls: Collectives::new(plan.coll.as_ref()),
        atomic_keys: Vec::new(),
        rma: Rma::new(&plan),
        rma_windows: Vec::new(),
        outstanding: (plan.msgs.len() + plan.recvs.len() + plan.atomics.len()) as u64
            + plan.coll.as_ref().map_or(0, |c| (c.ops.len() * c.members.len()) as u64)
            + plan.rma.iter().map(|o| 1 + (o.kind == RmaKind::WriteImm) as u64).sum::<u64>(),
        persistent_posts: 0,
        plan,
    };
    d.setup(spec, &mut r).map_err(|e| fail(spec, e))?;
    d.schedule_posts();
    let limit_ns = 60_000_000_000;
    while d.outstanding > d.delivery.receives_never_due(&d.plan) {
        let Some(step) = d.world.step() else {
            return Err(fail(
                spec,
                format!("deadlock: event queue empty with {} operations outstanding", d.outstanding),
            ));
        };
        if d.world.now > limit_ns || d.world.events > 200_000_000 {
            return Err(fail(
                spec,
                format!("liveness: {} operations outstanding at {} ns; {}", d.outstanding, d.world.now, d.stuck()),
            ));
        }
        match step {
            Step::Host(n) => d.post_due(n),
            Step::Nic(n) => {
                d.drain_cqs(n).map_err(|e| fail(spec, e))?;
                d.flush_backlog(n);
            }
        }
    }
    // A collective completes on its last arrival, before its own last
    // messages are acknowledged (001 §3.5.4): let those finish. Bounded;
    // whatever is still held afterwards is reported as a leak.
    let settle_until = d.world.now + 10_000_000_000;
    while !d.settled() && d.world.now <= settle_until {
        match d.world.step() {
            None => break,
            Some(Step::Host(n)) => d.post_due(n),
            Some(Step::Nic(n)) => {
                d.drain_cqs(n).map_err(|e| fail(spec, format!("after every operation completed: {e}")))?
            }
        }
    }
    d.check(spec).map_err(|e| fail(spec, e))
}

impl Driver {
    /// What is outstanding, for a liveness failure.
    fn stuck(&self) -> String {
        let mut s = String::new();
        for (n, node) in self.world.nodes.iter().enumerate() {
            let _ = write!(s, "\n  node {n}: {:?}\n{}", node.nic.occupancy(), node.nic.describe_peers());
        }
        s + &self.delivery.describe_pending(&self.plan)
    }

    /// No NIC holds a message, a collective or an atomic.
    fn settled(&self) -> bool {
        self.world.nodes.iter().all(|node| {
            let o = node.nic.occupancy();
            o.tx_msgs + o.rx_msgs + o.coll_ops + o.coll_bufs_used + o.coll_cache_frames + o.atomics + o.rma_reads == 0
        })
    }

    fn setup(&mut self, spec: &Spec, r: &mut Rng) -> Result<(), String> {
        let layout = self.world.layout;
        for n in 0..spec.nodes {
            let mut ports = Vec::new();
            for p in 0..spec.ports {
                let node = &mut self.world.nodes[n as usize];
                let len = self.plan.region_len.get(&(n, p)).copied().unwrap_or(0).max(1);
                let key_gen = (r.range(1, 0x7FFF) as u32) << 16;
                let data = alloc_region(&mut node.mem, len, key_gen | (2 * p as u32), r);
                // Like verbs, the CQ must hold every completion that can be
                // outstanding: otherwise the NIC stops taking descriptors.
                let posts = self.plan.posts_of((n, p));
                let cq_entries = ((posts + 1) as u32).next_power_of_two().max(64);
                let cq =
                    alloc_region(&mut node.mem, cq_entries as u64 * Cqe::SIZE as u64, key_gen | (2 * p as u32 + 1), r);
                for (reg, acc) in [(&data, MR_LOCAL_READ | MR_LOCAL_WRITE), (&cq, MR_LOCAL_WRITE)] {
                    let e = mr_entry(reg, p, acc, &mut node.mem, r);
                    Sram(&mut node.sram).put(layout.mr_entry(emp_uapi::desc::MrEntry::slot_of(reg.key)), &e);
                }
                if spec.atomics > 0 {
                    // The counter word's region: remote atomics allowed.
                    let atomic = alloc_region(&mut node.mem, ATOMIC_REGION, key_gen | (ATOMIC_SLOT + p as u32), r);
                    let e = mr_entry(&atomic, p, MR_LOCAL_READ | MR_LOCAL_WRITE | MR_REMOTE_ATOMIC, &mut node.mem, r);
                    Sram(&mut node.sram).put(layout.mr_entry(emp_uapi::desc::MrEntry::slot_of(atomic.key)), &e);
                    self.atomic_keys.resize_with(n as usize + 1, Vec::new);
                    self.atomic_keys[n as usize].push((atomic.key, atomic));
                }
                if spec.rma > 0 {
                    // The RMA window: remote writes and reads allowed, known bytes.
                    let w = alloc_region(&mut node.mem, RMA_WINDOW, key_gen | (RMA_SLOT + p as u32), r);
                    let rights = MR_LOCAL_READ | MR_LOCAL_WRITE | MR_REMOTE_READ | MR_REMOTE_WRITE;
                    let e = mr_entry(&w, p, rights, &mut node.mem, r);
                    Sram(&mut node.sram).put(layout.mr_entry(emp_uapi::desc::MrEntry::slot_of(w.key)), &e);
                    let bytes: Vec<u8> = (0..RMA_WINDOW).map(crate::checker::rma::initial_byte).collect();
                    w.write(&mut node.mem, 0, &bytes);
                    self.rma_windows.resize_with(n as usize + 1, Vec::new);
                    self.rma_windows[n as usize].push(w);
                }
                reset_port_ctl(&mut node.sram, &layout, p);
                admin_post(
                    &mut node.sram,
                    &layout,
                    AdminOp::PortOpen,
                    [p as u64, cq.key as u64, 0, cq_entries as u64, 0, 0],
                );
                self.world.doorbell_now(n);
                let res = admin_result(&mut self.world.nodes[n as usize].sram, &layout);
                if res != Some(ar::OK) {
                    return Err(format!("node {n} port {p}: open failed: {res:?}"));
                }
                ports.push(HostPort::new(p, data, cq, cq_entries));
            }
            self.ports.push(ports);
        }
        // Message payloads, written through the host's page tables.
        for m in &self.plan.msgs {
            let mut buf = vec![0u8; m.len as usize];
            fill_pattern(m.tag & 0xFFFF_FFFF, 0, &mut buf);
            let node = &mut self.world.nodes[m.src.0 as usize];
            self.ports[m.src.0 as usize][m.src.1 as usize].data.write(&mut node.mem, m.buf_off, &buf);
        }
        // What RMA writes carry.
        for (i, op) in self.plan.rma.iter().enumerate().filter(|(_, o)| o.kind != RmaKind::Read) {
            let buf: Vec<u8> = (0..op.len).map(|k| crate::checker::rma::write_byte(i, k)).collect();
            let node = &mut self.world.nodes[op.src.0 as usize];
            self.ports[op.src.0 as usize][op.src.1 as usize].data.write(&mut node.mem, op.local_off, &buf);
        }
        if let Some(coll) = &self.plan.coll {
            for (rank, &(n, p)) in coll.members.iter().enumerate() {
                let port = &self.ports[n as usize][p as usize];
                let node = &mut self.world.nodes[n as usize];
                for (off, bytes) in coll.inputs(rank) {
                    port.data.write(&mut node.mem, off, &bytes);
                }
                // Group slot = the member's port.
                Sram(&mut node.sram).put(layout.group_entry(p as usize), &coll.entry(rank, port.data.key));
                admin_post(&mut node.sram, &layout, AdminOp::GroupSet, [p as u64, 0, 0, 0, 0, 0]);
                self.world.doorbell_now(n);
                let res = admin_result(&mut self.world.nodes[n as usize].sram, &layout);
                if res != Some(ar::OK) {
                    return Err(format!("node {n} port {p}: group set failed: {res:?}"));
                }
            }
        }
        Ok(())
    }

    fn schedule_posts(&mut self) {
        let mut items: Vec<(u64, u16, u16, Post)> = Vec::new();
        for (i, m) in self.plan.msgs.iter().enumerate() {
            items.push((m.send_at, m.src.0, m.src.1, Post::Send(i as u32)));
        }
        for (i, rv) in self.plan.recvs.iter().enumerate() {
            items.push((rv.post_at, rv.dst.0, rv.dst.1, Post::Recv(i as u32)));
        }
        for (i, a) in self.plan.atomics.iter().enumerate() {
            items.push((a.post_at, a.src.0, a.src.1, Post::Atomic(i as u32)));
        }
        for (i, op) in self.plan.rma.iter().enumerate() {
            items.push((op.post_at, op.src.0, op.src.1, Post::Rma(i as u32)));
            if op.kind == RmaKind::WriteImm {
                items.push((op.recv_post_at, op.dst.0, op.dst.1, Post::RmaRecv(i as u32)));
            }
        }
        if let Some(coll) = &self.plan.coll {
            for (k, at) in coll.post_at.iter().enumerate() {
                for (rank, &(n, p)) in coll.members.iter().enumerate() {
                    items.push((at[rank], n, p, Post::Coll(k as u32, rank as u16)));
                }
            }
        }
        items.sort_by_key(|x| x.0); // Stable: sends keep id order.
        for (at, n, p, post) in items {
            self.schedule[n as usize].push_back((at, p, post));
        }
        for n in 0..self.schedule.len() {
            if let Some(&(at, _, _)) = self.schedule[n].front() {
                self.world.wake_host(n as u16, at);
            }
        }
    }

    fn post_due(&mut self, n: u16) {
        let now = self.world.now;
        while let Some(&(at, _, _)) = self.schedule[n as usize].front() {
            if at > now {
                self.world.wake_host(n, at);
                break;
            }
            let (_, p, post) = self.schedule[n as usize].pop_front().expect("front");
            let send = !matches!(post, Post::Recv(_) | Post::RmaRecv(_));
            self.backlog.entry((n, p, send)).or_default().push_back(post);
        }
        self.flush_backlog(n);
    }

    fn flush_backlog(&mut self, n: u16) {
        let layout = self.world.layout;
        let mut rang = false;
        for (p, send) in (0..self.ports[n as usize].len() as u16).flat_map(|p| [(p, false), (p, true)]) {
            let Some(q) = self.backlog.get_mut(&(n, p, send)) else { continue };
            while let Some(post) = q.front() {
                let hp = &mut self.ports[n as usize][p as usize];
                let sram = &mut self.world.nodes[n as usize].sram;
                let ok = match *post {
                    Post::Send(i) => {
                        let m = &self.plan.msgs[i as usize];
                        let mut d = work_desc(
                            Opcode::Send as u8,
                            i as u64,
                            m.dst.0,
                            m.dst.1,
                            m.tag,
                            0,
                            hp.data.key,
                            m.buf_off,
                            m.len,
                            m.sge_pieces,
                        );
                        if let Some(imm) = crate::plan::msg_imm(i as usize) {
                            d.flags |= WD_IMM;
                            d.ignore = imm as u64;
                        }
                        match m.corrupt {
                            1 => d.sge[0].key ^= 0x0100_0000,
                            2 => d.num_sge = 7,
                            _ => {}
                        }
                        if m.persistent {
                            let ok = hp.post_persistent(sram, &layout, d, true);
                            self.persistent_posts += ok as u64;
                            ok
                        } else {
                            hp.post(sram, &layout, &d, true)
                        }
                    }
                    Post::Recv(i) => {
                        let rv = &self.plan.recvs[i as usize];
                        let d = work_desc(
                            Opcode::Recv as u8,
                            RECV_BIT | i as u64,
                            rv.node,
                            rv.port,
                            rv.tag,
                            rv.ignore,
                            hp.data.key,
                            rv.buf_off,
                            rv.buf_len,
                            rv.sge_pieces,
                        );
                        if rv.persistent {
                            let ok = hp.post_persistent(sram, &layout, d, false);
                            self.persistent_posts += ok as u64;
                            ok
                        } else {
                            hp.post(sram, &layout, &d, false)
                        }
                    }
                    Post::Atomic(i) => {
                        let a = &self.plan.atomics[i as usize];
                        let (c_node, c_port) = self.plan.counter_at;
                        let (key, ref region) = self.atomic_keys[c_node as usize][c_port as usize];
                        let (key, secret) = (key ^ if a.bad_key { 0x0100_0000 } else { 0 }, region.secret);
                        let mut d = WorkDesc {
                            wr_id: ATOMIC_BIT | i as u64,
                            opcode: Opcode::AtomicFetchAdd as u8,
                            flags: WD_SIGNALED,
                            num_sge: 2,
                            node: a.dst.0,
                            port: a.dst.1,
                            tag: 1,
                            ..Default::default()
                        };
                        d.sge[0] = Sge { key: hp.data.key, len: 8, offset: a.result_off };
                        d.sge[1] = RemoteSge { key, secret, offset: COUNTER_OFF }.to_sge();
                        hp.post(sram, &layout, &d, true)
                    }
                    Post::Rma(i) => {
                        let op = &self.plan.rma[i as usize];
                        let w = &self.rma_windows[op.dst.0 as usize][op.dst.1 as usize];
                        let secret = if op.bad == RmaBad::Secret { w.secret ^ 0x10 } else { w.secret };
                        let (opcode, imm) = match op.kind {
                            RmaKind::Write => (Opcode::RdmaWrite, 0),
                            RmaKind::WriteImm => (Opcode::RdmaWrite, WD_IMM),
                            RmaKind::Read => (Opcode::RdmaRead, 0),
                        };
                        let mut d = WorkDesc {
                            wr_id: RMA_BIT | i as u64,
                            opcode: opcode as u8,
                            flags: WD_SIGNALED | imm,
                            num_sge: 2,
                            node: op.dst.0,
                            port: op.dst.1,
                            tag: if imm != 0 { op.imm_tag(i as usize) } else { 0 },
                            ..Default::default()
                        };
                        d.sge[0] = Sge { key: hp.data.key, len: op.len as u32, offset: op.local_off };
                        d.sge[1] = RemoteSge { key: w.key, secret, offset: op.remote_off }.to_sge();
                        hp.post(sram, &layout, &d, true)
                    }
                    Post::RmaRecv(i) => {
                        let op = &self.plan.rma[i as usize];
                        let d = WorkDesc {
                            wr_id: RMA_RECV_BIT | i as u64,
                            opcode: Opcode::Recv as u8,
                            node: op.src.0,
                            port: op.src.1,
                            tag: op.imm_tag(i as usize),
                            ..Default::default()
                        };
                        hp.post(sram, &layout, &d, false)
                    }
                    Post::Coll(k, rank) => {
                        let coll = self.plan.coll.as_ref().expect("a collective post has a plan");
                        let d =
                            coll.desc(k as usize, rank as usize, hp.data.key, COLL_BIT | (k as u64) << 8 | rank as u64);
                        let ok = hp.post(sram, &layout, &d, true);
                        if ok {
                            self.colls.on_post(k as usize, rank as usize);
                        }
                        ok
                    }
                };
                if !ok {
                    break;
                }
                q.pop_front();
                rang = true;
            }
        }
        if rang {
            self.world.ring(n);
        }
    }

    fn drain_cqs(&mut self, n: u16) -> Result<(), String> {
        let layout = self.world.layout;
        for p in 0..self.ports[n as usize].len() {
            loop {
                let node = &mut self.world.nodes[n as usize];
                let Some(cqe) = self.ports[n as usize][p].poll_cq(&mut node.sram, &layout, &node.mem) else { break };
                self.on_completion(n, p as u16, cqe)?;
            }
        }
        Ok(())
    }

    /// Hands completion `c` of endpoint `(n, p)` to its checker.
    fn on_completion(&mut self, n: u16, p: u16, c: Cqe) -> Result<(), String> {
        let status = Status::from_u8(c.status).ok_or_else(|| format!("bad status byte {}", c.status))?;
        let (ports, world, plan) = (&self.ports, &self.world, &self.plan);
        let read =
            |off: u64, buf: &mut [u8]| ports[n as usize][p as usize].data.read(&world.nodes[n as usize].mem, off, buf);
        if c.wr_id & RMA_RECV_BIT == RMA_RECV_BIT {
            self.rma.on_imm_recv(plan, (n, p), status, &c)?;
        } else if c.wr_id & (RECV_BIT | RMA_BIT) == RMA_BIT {
            self.rma.on_completion(plan, (n, p), status, &c, read)?;
        } else if c.wr_id & (RECV_BIT | ATOMIC_BIT | COLL_BIT) == COLL_BIT {
            self.colls.on_completion(plan.coll.as_ref(), (n, p), status, &c, read)?;
        } else if c.wr_id & (RECV_BIT | ATOMIC_BIT) == ATOMIC_BIT {
            self.atomics.on_completion(plan, (n, p), status, &c, read)?;
        } else if c.wr_id & RECV_BIT == 0 {
            self.delivery.on_send(plan, (n, p), status, &c)?;
        } else {
            self.delivery.on_recv(plan, (n, p), status, c, read)?;
        }
        self.outstanding -= 1;
        Ok(())
    }

    /// The verdicts at quiesce, in order: delivery (order, then every
    /// message), atomics, leaks; then every port closes and must leave
    /// nothing behind.
    fn check(&mut self, spec: &Spec) -> Result<Report, String> {
        self.delivery.check_order(&self.plan)?;
        let tally = self.delivery.tally(&self.plan)?;
        let (cn, cp) = self.plan.counter_at;
        let counter = || {
            let mut b = [0u8; 8];
            self.atomic_keys[cn as usize][cp as usize].1.read(&self.world.nodes[cn as usize].mem, COUNTER_OFF, &mut b);
            u64::from_le_bytes(b)
        };
        let mut report = Report {
            sim_ns: self.world.now,
            events: self.world.events,
            frames_sent_from_host: self.world.nodes.iter().map(|n| n.mem.frames_sent_from_host).sum(),
            cpu_jobs_run: self.world.nodes.iter().map(|n| n.nic.cpu_jobs_run()).sum(),
            side_entries: self.world.nodes.iter().map(|n| n.nic.side_entries()).map(|(a, b, c)| a + b + c).sum(),
            persistent_posts: self.persistent_posts,
            wire: self.world.stats,
            delivered: tally.delivered,
            expected_errors: tally.expected_errors
                + Atomics::expected_errors(&self.plan)
                + Rma::expected_errors(&self.plan),
            truncated: tally.truncated,
            atomics: self.atomics.check_counter(&self.plan, counter)?,
            collectives: self.colls.completed(),
            rma: {
                let (windows, world) = (&self.rma_windows, &self.world);
                let window = |(n, p): (u16, u16), off: u64, buf: &mut [u8]| {
                    windows[n as usize][p as usize].read(&world.nodes[n as usize].mem, off, buf)
                };
                self.rma.check(&self.plan, window)?
            },
            ..Default::default()
        };
        let open = self.delivery.receives_left_open(&self.plan, spec.nodes);
        leak::at_quiesce(&self.world, spec.ports, &open)?;
        for node in &self.world.nodes {
            for (k, v) in node.nic.counters().iter().enumerate() {
                report.counters[k] += v;
            }
        }
        self.close_ports(spec)?;
        Ok(report)
    }

    /// Closes every port through the admin mailbox: all peer entries must go.
    fn close_ports(&mut self, spec: &Spec) -> Result<(), String> {
        let layout = self.world.layout;
        for n in 0..spec.nodes {
            for p in 0..spec.ports {
                admin_post(
                    &mut self.world.nodes[n as usize].sram,
                    &layout,
                    AdminOp::PortClose,
                    [p as u64, 0, 0, 0, 0, 0],
                );
                self.world.doorbell_now(n);
                let res = admin_result(&mut self.world.nodes[n as usize].sram, &layout);
                if res != Some(ar::OK) {
                    return Err(format!("node {n} port {p}: close failed: {res:?}"));
                }
            }
            leak::after_close(n, self.world.nodes[n as usize].nic.occupancy())?;
        }
        Ok(())
    }
}

/// Counters from a report, as `name value` lines (for `emp-sim --stats`).
pub fn counter_lines(r: &Report) -> String {
    counter::NAMES.iter().zip(r.counters.iter()).map(|(n, v)| format!("{n} {v}\n")).collect()
}
