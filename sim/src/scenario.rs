//! Scenarios: a seeded workload of tagged messages between endpoints, run
//! on a [`World`], with the checker that every run must pass:
//! - every posted message is delivered exactly once and byte-identical, or
//!   completes with the error the scenario expects;
//! - messages from one endpoint to another are matched in the order sent;
//! - every message completes (liveness) despite loss, duplication,
//!   reordering and a partition that heals;
//! - remote fetch-adds on one shared counter word run exactly once: the
//!   returned old values are a permutation of `0..k` and the word ends at `k`;
//! - collectives on one group (barriers, reductions, broadcasts, posted at
//!   skewed times) complete on every member only once the members they
//!   depend on have posted, with the right result ([`crate::collplan`]);
//! - at quiesce no NIC table entry is held, and after the ports close no
//!   peer entry remains.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;

use emp_firmware::{Config, FlowControl};
use emp_uapi::desc::{
    Cqe, Opcode, Sge, Status, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE, MR_REMOTE_ATOMIC, WD_SIGNALED,
};
use emp_uapi::sram::{admin_result as ar, ctl, AdminOp, LayoutParams, FEATURE_MODIFIED_ACK_NACK, FEATURE_OVERFLOW};
use emp_uapi::{sram::counter, ANY_NODE, ANY_PORT, PAGE_SIZE};

use crate::collplan::CollPlan;
use crate::host::{
    admin_post, admin_result, alloc_region, mr_entry, reset_port_ctl, work_desc, HostMem, HostPort, Sram,
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
    /// Sends and receives are posted at random times in `[0, spread_ns]`.
    pub spread_ns: u64,
    /// Probability an exact receive gets a shorter buffer.
    pub truncate_prob: f64,
    /// Add sends that must fail (closed port, bad key, bad descriptor).
    pub errors: bool,
    /// NIC CPU plan (`emp_uapi::image::cpu_plan`).
    pub cpu_plan: u32,
    /// Wire behaviour.
    pub wire: WireConfig,
    /// Drawn by [`Spec::swarm`] (replayed by seed) or set from flags.
    pub swarm: bool,
    /// Remote fetch-add(1)s on one shared counter word.
    pub atomics: u32,
    /// Collective operations on one group over random endpoints.
    pub collectives: u32,
    /// The NICs' writes to host memory appear late and in random byte
    /// order, ordered only by DMA fences (`emp_sim::weak_dma`); hosts check
    /// every completion they accept against what the NIC wrote.
    pub weak_dma: bool,
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
            spread_ns: messages as u64 * 2_000,
            truncate_prob: 0.0,
            errors: false,
            cpu_plan: 0,
            wire: WireConfig::default(),
            swarm: false,
            atomics: 0,
            collectives: 0,
            weak_dma: false,
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
            wire: WireConfig {
                latency_ns: r.range(1_000, 50_000),
                bandwidth_bps: [1_000_000_000, 10_000_000_000, 25_000_000_000][r.below(3) as usize],
                loss,
                dup: if r.chance(0.3) { r.unit() * 0.05 } else { 0.0 },
                reorder: if r.chance(0.3) { r.unit() * 0.3 } else { 0.0 },
                reorder_jitter_ns: r.range(1_000, 100_000),
                partition,
                corrupt: 0.0,
            },
            swarm: true,
            // Drawn last: the other knobs of a seed stay what they were.
            atomics: if r.chance(0.5) { r.range(1, 48) as u32 } else { 0 },
            collectives: if r.chance(0.4) { r.range(1, 24) as u32 } else { 0 },
            weak_dma: r.chance(0.5),
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
             --max-size {} --mtu {} --group {} --flow {flow} --overflow {} --ports {} --cpu-plan {}",
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
            self.cpu_plan
        );
        if self.atomics > 0 {
            cmd += &format!(" --atomics {}", self.atomics);
        }
        if self.collectives > 0 {
            cmd += &format!(" --collectives {}", self.collectives);
        }
        if self.weak_dma {
            cmd += " --weak-dma";
        }
        if let Some(p) = &self.wire.partition {
            cmd += &format!(" --partition-ms {}", p.end_ns / 1_000_000);
        }
        cmd
    }

    fn firmware_config(&self) -> Config {
        Config {
            group_size: self.group_size,
            window_frames: (16 * self.group_size).max(48),
            overflow_slots: self.overflow_slots,
            flow_control: self.flow,
            // The workload posts every receive and send up front, as a
            // bulk-synchronous program would: size the tables for it (a
            // smaller bound is a resource deadlock the application owns,
            // as with a verbs queue depth).
            cpu_plan: self.cpu_plan,
            tx_max: self.messages.max(1024),
            recv_posted_max: self.messages.max(4096),
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
    /// NIC counters summed over all NICs.
    pub counters: [u64; counter::COUNT],
    /// Wire counters.
    pub wire: crate::world::WireStats,
    /// Virtual time at quiesce (ns).
    pub sim_ns: u64,
    /// Events processed.
    pub events: u64,
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
        let _ = writeln!(s, "frames on wire   {}", self.wire.frames);
        let _ = writeln!(s, "data frames      {}", c[counter::TX_FRAMES]);
        let _ = writeln!(s, "retransmitted    {}", c[counter::RETRANSMITS]);
        let _ = writeln!(s, "duplicates       {}", c[counter::DUPLICATES]);
        let _ = writeln!(s, "out of order     {}", c[counter::OUT_OF_ORDER]);
        let _ = writeln!(s, "dropped (unexp.) {}", c[counter::DROPPED_UNEXPECTED]);
        let _ = writeln!(s, "overflowed       {}", c[counter::OVERFLOW_MSGS]);
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Deliver,
    Fail(Status),
}

#[derive(Clone, Debug)]
struct MsgPlan {
    src: (u16, u16),
    dst: (u16, u16),
    len: u64,
    tag: u64,
    send_at: u64,
    buf_off: u64,
    expect: Expect,
    sge_pieces: usize,
    corrupt: u8,
}

#[derive(Clone, Debug)]
struct RecvPlan {
    dst: (u16, u16),
    post_at: u64,
    node: u16,
    port: u16,
    tag: u64,
    ignore: u64,
    buf_len: u64,
    buf_off: u64,
    /// Could match several messages: order is checked.
    ambiguous: bool,
    sge_pieces: usize,
}

/// A remote fetch-add(1) on the counter (or a misuse of one).
#[derive(Clone, Debug)]
struct AtomicPlan {
    src: (u16, u16),
    dst: (u16, u16),
    post_at: u64,
    /// Offset of the local result word in the source's data region.
    result_off: u64,
    /// What the remote key is: the counter's, or a wrong one.
    bad_key: bool,
    expect: Expect,
}

#[derive(Clone, Copy, Debug)]
enum Post {
    Send(u32),
    Recv(u32),
    Atomic(u32),
    /// Operation `.0` of the collective plan, by member `.1`.
    Coll(u32, u16),
}

/// How a (destination endpoint, tag class) is served.
#[derive(Clone, Copy)]
enum Mode {
    Exact,
    AnySourceExactTag,
    MaskedPerSource,
    MaskedAnySource,
}

struct Plan {
    msgs: Vec<MsgPlan>,
    recvs: Vec<RecvPlan>,
    atomics: Vec<AtomicPlan>,
    /// The endpoint whose counter word the atomics hit.
    counter_at: (u16, u16),
    /// Collectives, if the scenario has any.
    coll: Option<CollPlan>,
    /// Per (node, port): bytes of the data region.
    region_len: HashMap<(u16, u16), u64>,
}

const RECV_BIT: u64 = 1 << 63;
const ATOMIC_BIT: u64 = 1 << 62;
/// Collective wr_ids: `COLL_BIT | op << 8 | rank`.
const COLL_BIT: u64 = 1 << 61;
/// MR slot of each port's atomic counter region (`ATOMIC_SLOT + port`).
const ATOMIC_SLOT: u32 = 32;
/// Bytes of that region; the counter is the 64-bit word at offset 8.
const ATOMIC_REGION: u64 = 64;
const COUNTER_OFF: u64 = 8;

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
        };
        msgs.push(base.clone());
        msgs.push(MsgPlan { dst: eps[0], expect: Expect::Fail(Status::BadKey), corrupt: 1, ..base.clone() });
        msgs.push(MsgPlan { dst: eps[0], expect: Expect::Fail(Status::BadDescriptor), corrupt: 2, ..base });
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
        if m.expect == Expect::Deliver {
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
            recvs.push(RecvPlan { dst, post_at, node, port, tag, ignore, buf_len, buf_off, ambiguous, sge_pieces });
        }
    }
    let (atomics, counter_at) = plan_atomics(spec, &eps, r, &mut bump);
    // Drawn last and only when asked for: other runs stay as they were.
    let coll = (spec.collectives > 0)
        .then(|| CollPlan::draw(spec.seed, spec.collectives, &eps, spec.spread_ns, spec.mtu, r, &mut bump));
    Plan { msgs, recvs, atomics, counter_at, coll, region_len }
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
    send_done: Vec<Option<Status>>,
    recv_done: Vec<Option<Cqe>>,
    delivered_to: Vec<Option<u32>>,
    /// Per atomic: its completion (status, old value).
    atomic_done: Vec<Option<(Status, u64)>>,
    /// `[op][rank]`: in the ring yet.
    coll_posted: Vec<Vec<bool>>,
    /// `[op][rank]`: completed yet.
    coll_done: Vec<Vec<bool>>,
    /// Per allreduce: the first member's result bits (all must match).
    coll_bits: Vec<Option<Vec<u8>>>,
    /// Per node, per port: the key of the port's atomic counter region.
    atomic_keys: Vec<Vec<(u32, crate::host::Region)>>,
    outstanding: u64,
}

impl Plan {
    /// Descriptors `ep` posts (its CQ must hold all their completions).
    fn posts_of(&self, ep: (u16, u16)) -> usize {
        self.msgs.iter().filter(|m| m.src == ep).count()
            + self.recvs.iter().filter(|r| r.dst == ep).count()
            + self.atomics.iter().filter(|a| a.src == ep).count()
            + self.coll.as_ref().map_or(0, |c| c.posts_of(ep))
    }
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
                    let cq = ((posts + 1) as u64).next_power_of_two().max(64) * 32;
                    HostMem::pages_for_region(data)
                        + HostMem::pages_for_region(cq)
                        + HostMem::pages_for_region(ATOMIC_REGION)
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
    let mut d = Driver {
        world,
        ports: Vec::new(),
        backlog: HashMap::new(),
        schedule: vec![VecDeque::new(); spec.nodes as usize],
        send_done: vec![None; plan.msgs.len()],
        recv_done: vec![None; plan.recvs.len()],
        delivered_to: vec![None; plan.msgs.len()],
        atomic_done: vec![None; plan.atomics.len()],
        atomic_keys: Vec::new(),
        coll_posted: plan.coll.as_ref().map_or(Vec::new(), |c| vec![vec![false; c.members.len()]; c.ops.len()]),
        coll_done: plan.coll.as_ref().map_or(Vec::new(), |c| vec![vec![false; c.members.len()]; c.ops.len()]),
        coll_bits: plan.coll.as_ref().map_or(Vec::new(), |c| vec![None; c.ops.len()]),
        outstanding: (plan.msgs.len() + plan.recvs.len() + plan.atomics.len()) as u64
            + plan.coll.as_ref().map_or(0, |c| (c.ops.len() * c.members.len()) as u64),
        plan,
    };
    d.setup(spec, &mut r).map_err(|e| fail(spec, e))?;
    d.schedule_posts();
    let limit_ns = 60_000_000_000;
    while d.outstanding > 0 {
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
        let sends: Vec<usize> = (0..self.send_done.len()).filter(|&i| self.send_done[i].is_none()).take(8).collect();
        for i in sends {
            let m = &self.plan.msgs[i];
            let _ = write!(s, "\n  send {i} {:?}->{:?} len {} tag {:#x} at {}", m.src, m.dst, m.len, m.tag, m.send_at);
            for (ri, r) in self.plan.recvs.iter().enumerate() {
                let matches = r.dst == m.dst
                    && (r.node == ANY_NODE || r.node == m.src.0)
                    && (r.port == ANY_PORT || r.port == m.src.1)
                    && (r.tag ^ m.tag) & !r.ignore == 0;
                if matches {
                    let got = self.recv_done[ri].map(|c| c.tag);
                    let _ = write!(s, "\n    could match recv {ri} posted at {} done with {:x?}", r.post_at, got);
                }
            }
        }
        let recvs: Vec<usize> = (0..self.recv_done.len()).filter(|&i| self.recv_done[i].is_none()).take(8).collect();
        for i in recvs {
            let r = &self.plan.recvs[i];
            let _ = write!(
                s,
                "\n  recv {i} at {:?} from {:?} tag {:#x}/{:#x} at {}",
                r.dst,
                (r.node, r.port),
                r.tag,
                r.ignore,
                r.post_at
            );
        }
        s
    }

    /// No NIC holds a message, a collective or an atomic.
    fn settled(&self) -> bool {
        self.world.nodes.iter().all(|node| {
            let o = node.nic.occupancy();
            o.tx_msgs + o.rx_msgs + o.coll_ops + o.coll_bufs_used + o.coll_cache_frames + o.atomics == 0
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
                let cq = alloc_region(&mut node.mem, cq_entries as u64 * 32, key_gen | (2 * p as u32 + 1), r);
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
                ports.push(HostPort { port: p, data, cq, cq_entries, cq_head: 0, send_prod: 0, recv_prod: 0 });
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
            let send = !matches!(post, Post::Recv(_));
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
                        match m.corrupt {
                            1 => d.sge[0].key ^= 0x0100_0000,
                            2 => d.num_sge = 7,
                            _ => {}
                        }
                        hp.post(sram, &layout, &d, true)
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
                        hp.post(sram, &layout, &d, false)
                    }
                    Post::Atomic(i) => {
                        let a = &self.plan.atomics[i as usize];
                        let (c_node, c_port) = self.plan.counter_at;
                        let key = self.atomic_keys[c_node as usize][c_port as usize].0
                            ^ if a.bad_key { 0x0100_0000 } else { 0 };
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
                        d.sge[1] = Sge { key, len: 8, offset: COUNTER_OFF };
                        hp.post(sram, &layout, &d, true)
                    }
                    Post::Coll(k, rank) => {
                        let coll = self.plan.coll.as_ref().expect("a collective post has a plan");
                        let d =
                            coll.desc(k as usize, rank as usize, hp.data.key, COLL_BIT | (k as u64) << 8 | rank as u64);
                        let ok = hp.post(sram, &layout, &d, true);
                        if ok {
                            self.coll_posted[k as usize][rank as usize] = true;
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

    fn on_completion(&mut self, n: u16, p: u16, c: Cqe) -> Result<(), String> {
        let status = Status::from_u8(c.status).ok_or_else(|| format!("bad status byte {}", c.status))?;
        if c.wr_id & (RECV_BIT | ATOMIC_BIT | COLL_BIT) == COLL_BIT {
            self.on_coll_completion(n, p, status, c)?;
        } else if c.wr_id & (RECV_BIT | ATOMIC_BIT) == ATOMIC_BIT {
            self.on_atomic_completion(n, p, status, c)?;
        } else if c.wr_id & RECV_BIT == 0 {
            let i = c.wr_id as usize;
            let m = self.plan.msgs.get(i).ok_or_else(|| format!("unknown send wr_id {i}"))?;
            if m.src != (n, p) || c.opcode != Opcode::Send as u8 {
                return Err(format!("send {i} completed on ({n},{p}) opcode {}", c.opcode));
            }
            if self.send_done[i].replace(status).is_some() {
                return Err(format!("send {i} completed twice"));
            }
            let want = match m.expect {
                Expect::Deliver => Status::Success,
                Expect::Fail(s) => s,
            };
            if status != want {
                return Err(format!(
                    "send {i} {:?}->{:?} len {}: {:?}, expected {:?}",
                    m.src, m.dst, m.len, status, want
                ));
            }
        } else {
            let ri = (c.wr_id & !RECV_BIT) as usize;
            let rv = self.plan.recvs.get(ri).ok_or_else(|| format!("unknown recv wr_id {ri}"))?.clone();
            if rv.dst != (n, p) || c.opcode != Opcode::Recv as u8 {
                return Err(format!("recv {ri} completed on ({n},{p})"));
            }
            if self.recv_done[ri].replace(c).is_some() {
                return Err(format!("recv {ri} completed twice"));
            }
            let id = (c.tag & 0xFFFF_FFFF) as usize;
            let m = self.plan.msgs.get(id).ok_or_else(|| format!("recv {ri} got unknown tag {:#x}", c.tag))?;
            if m.tag != c.tag || m.dst != (n, p) || (c.src_node, c.src_port) != m.src {
                return Err(format!(
                    "recv {ri} got message {id} with tag/src {:#x}/{:?} meant for {:?}",
                    c.tag,
                    (c.src_node, c.src_port),
                    m.dst
                ));
            }
            if let Some(prev) = self.delivered_to[id].replace(ri as u32) {
                return Err(format!("message {id} delivered twice (recvs {prev} and {ri})"));
            }
            let want = if m.len > rv.buf_len { Status::Truncated } else { Status::Success };
            let want_len = m.len.min(rv.buf_len);
            if status != want || c.byte_len as u64 != want_len || c.msg_len as u64 != m.len {
                return Err(format!(
                    "recv {ri} of message {id} (len {}, buf {}): {:?} byte_len {} msg_len {}",
                    m.len, rv.buf_len, status, c.byte_len, c.msg_len
                ));
            }
            let mut got = vec![0u8; want_len as usize];
            let mut exp = vec![0u8; want_len as usize];
            let node = &self.world.nodes[n as usize];
            self.ports[n as usize][p as usize].data.read(&node.mem, rv.buf_off, &mut got);
            fill_pattern(id as u64, 0, &mut exp);
            if got != exp {
                let at = got.iter().zip(&exp).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!("message {id} corrupted at byte {at} of {want_len}"));
            }
        }
        self.outstanding -= 1;
        Ok(())
    }

    fn on_atomic_completion(&mut self, n: u16, p: u16, status: Status, c: Cqe) -> Result<(), String> {
        let i = (c.wr_id & !ATOMIC_BIT) as usize;
        let a = self.plan.atomics.get(i).ok_or_else(|| format!("unknown atomic wr_id {i}"))?;
        if a.src != (n, p) || c.opcode != Opcode::AtomicFetchAdd as u8 {
            return Err(format!("atomic {i} completed on ({n},{p}) opcode {}", c.opcode));
        }
        let want = match a.expect {
            Expect::Deliver => Status::Success,
            Expect::Fail(s) => s,
        };
        if status != want {
            return Err(format!("atomic {i} {:?}->{:?}: {status:?}, expected {want:?}", a.src, a.dst));
        }
        if status == Status::Success {
            let mut b = [0u8; 8];
            let node = &self.world.nodes[n as usize];
            self.ports[n as usize][p as usize].data.read(&node.mem, a.result_off, &mut b);
            if u64::from_le_bytes(b) != c.tag {
                return Err(format!("atomic {i}: result word {} but CQE old value {}", u64::from_le_bytes(b), c.tag));
            }
        }
        if self.atomic_done[i].replace((status, c.tag)).is_some() {
            return Err(format!("atomic {i} completed twice"));
        }
        Ok(())
    }

    fn on_coll_completion(&mut self, n: u16, p: u16, status: Status, c: Cqe) -> Result<(), String> {
        let coll = self.plan.coll.as_ref().ok_or("collective completion without a plan")?;
        let (k, rank) = (((c.wr_id & !COLL_BIT) >> 8) as usize, (c.wr_id & 0xFF) as usize);
        let op = *coll.ops.get(k).ok_or_else(|| format!("unknown collective {k}"))?;
        if coll.members.get(rank) != Some(&(n, p)) || c.opcode != op.opcode() as u8 {
            return Err(format!("collective {k} rank {rank} completed on ({n},{p}) opcode {}", c.opcode));
        }
        if std::mem::replace(&mut self.coll_done[k][rank], true) {
            return Err(format!("collective {k} ({op:?}) completed twice at rank {rank}"));
        }
        if status != Status::Success {
            return Err(format!("collective {k} ({op:?}) rank {rank}: {status:?}"));
        }
        if let Some(other) =
            (0..coll.members.len()).find(|&o| coll.needs_post_of(k, rank, o) && !self.coll_posted[k][o])
        {
            return Err(format!("collective {k} ({op:?}) completed at rank {rank} before rank {other} posted it"));
        }
        let (off, len) = coll.result_at(k, rank);
        let mut got = vec![0u8; len as usize];
        let node = &self.world.nodes[n as usize];
        self.ports[n as usize][p as usize].data.read(&node.mem, off, &mut got);
        coll.check_result(k, rank, &got)?;
        if op.opcode() == Opcode::Allreduce {
            match &self.coll_bits[k] {
                Some(first) if *first != got => {
                    return Err(format!("allreduce {k}: rank {rank} holds other bits than the first member"))
                }
                Some(_) => {}
                None => self.coll_bits[k] = Some(got),
            }
        }
        Ok(())
    }

    /// Every fetch-add ran exactly once: the olds are `0..k`, the word is `k`.
    fn check_atomics(&self) -> Result<u64, String> {
        if self.plan.atomics.is_empty() {
            return Ok(0);
        }
        let mut olds: Vec<u64> = self
            .plan
            .atomics
            .iter()
            .zip(&self.atomic_done)
            .filter(|(a, _)| a.expect == Expect::Deliver)
            .map(|(_, d)| d.map(|(_, old)| old))
            .collect::<Option<_>>()
            .ok_or("an atomic never completed")?;
        olds.sort_unstable();
        let k = olds.len() as u64;
        if let Some(i) = olds.iter().enumerate().position(|(i, &o)| o != i as u64) {
            return Err(format!("atomic olds are not a permutation of 0..{k}: position {i} holds {}", olds[i]));
        }
        let (cn, cp) = self.plan.counter_at;
        let mut b = [0u8; 8];
        self.atomic_keys[cn as usize][cp as usize].1.read(&self.world.nodes[cn as usize].mem, COUNTER_OFF, &mut b);
        let word = u64::from_le_bytes(b);
        if word != k {
            return Err(format!("counter ends at {word} after {k} fetch-adds"));
        }
        Ok(k)
    }

    fn check(&mut self, spec: &Spec) -> Result<Report, String> {
        // Non-overtaking: ambiguous receives of one tag class at one
        // endpoint, in posting order, got each source's messages in
        // increasing id order.
        #[allow(clippy::type_complexity)] // ((dst, port), posting seq) -> [(src msg id, recv, len)]
        let mut by_dst: BTreeMap<((u16, u16), u64), Vec<(u64, usize, u32)>> = BTreeMap::new();
        let mut posted_seq: HashMap<(u16, u16), u64> = HashMap::new();
        let mut order: Vec<usize> = (0..self.plan.recvs.len()).collect();
        order.sort_by_key(|&i| self.plan.recvs[i].post_at); // Stable: posting order.
        for i in order {
            let rv = &self.plan.recvs[i];
            let k = posted_seq.entry(rv.dst).or_insert(0);
            *k += 1;
            if rv.ambiguous {
                let c = self.recv_done[i].expect("all done");
                by_dst.entry((rv.dst, rv.tag >> 32)).or_default().push((*k, i, (c.tag & 0xFFFF_FFFF) as u32));
            }
        }
        for (dst, list) in by_dst {
            let mut last: HashMap<(u16, u16), u32> = HashMap::new();
            for (_, ri, id) in list {
                let src = self.plan.msgs[id as usize].src;
                if let Some(&prev) = last.get(&src) {
                    if prev > id {
                        return Err(format!(
                            "order: at {dst:?} recv {ri} got message {id} from {src:?} after message {prev}"
                        ));
                    }
                }
                last.insert(src, id);
            }
        }
        let mut report =
            Report { sim_ns: self.world.now, events: self.world.events, wire: self.world.stats, ..Default::default() };
        for (i, m) in self.plan.msgs.iter().enumerate() {
            match m.expect {
                Expect::Deliver if self.delivered_to[i].is_none() => {
                    return Err(format!("message {i} never delivered"))
                }
                Expect::Deliver => report.delivered += 1,
                Expect::Fail(_) => {
                    if self.delivered_to[i].is_some() {
                        return Err(format!("failed message {i} was delivered"));
                    }
                    report.expected_errors += 1;
                }
            }
        }
        report.truncated =
            self.recv_done.iter().flatten().filter(|c| c.status == Status::Truncated as u8).count() as u64;
        report.atomics = self.check_atomics()?;
        report.collectives = self.coll_done.iter().flatten().filter(|&&d| d).count() as u64;
        report.expected_errors += self.plan.atomics.iter().filter(|a| a.expect != Expect::Deliver).count() as u64;
        // Quiesce: no record may be held.
        let layout = self.world.layout;
        for (n, node) in self.world.nodes.iter().enumerate() {
            let o = node.nic.occupancy();
            if o.tx_msgs
                + o.rx_msgs
                + o.posted_recvs
                + o.overflow_used
                + o.atomics
                + o.coll_ops
                + o.coll_bufs_used
                + o.coll_cache_frames
                != 0
            {
                return Err(format!("leak at quiesce on node {n}: {o:?}"));
            }
            node.nic.invariants().map_err(|e| format!("node {n}: {e}"))?;
            for p in 0..spec.ports {
                let at = layout.port(p).ctl(ctl::CQ_OVERRUNS);
                let ov = u32::from_le_bytes(node.sram[at..at + 4].try_into().expect("4 bytes"));
                if ov != 0 {
                    return Err(format!("node {n} port {p}: {ov} CQ overruns"));
                }
            }
            for (k, v) in node.nic.counters().iter().enumerate() {
                report.counters[k] += v;
            }
        }
        // Close every port: all peer entries must go.
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
            let o = self.world.nodes[n as usize].nic.occupancy();
            if o != emp_firmware::Occupancy::default() {
                return Err(format!("leak after close on node {n}: {o:?}"));
            }
        }
        Ok(report)
    }
}

/// Counters from a report, as `name value` lines (for `emp-sim --stats`).
pub fn counter_lines(r: &Report) -> String {
    counter::NAMES.iter().zip(r.counters.iter()).map(|(n, v)| format!("{n} {v}\n")).collect()
}
