//! The simulated machine room: N NICs running the real control program, a
//! wire with latency, bandwidth, loss, duplication, reordering and
//! partitions, all in virtual time driven by one seeded event queue.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use emp_firmware::mcast::McastError;
use emp_firmware::{Config, CpuStep, DmaError, Hal, HostSeg, Nic};
use emp_uapi::sram::{Layout, LayoutParams, NicStatus, SramHeader};
use emp_uapi::wire::MTU_MAX;
use emp_uapi::Le;

use crate::cost::{CostModel, Overlap, StepCosts};
use crate::host::{write_routes, HostMem};
use crate::rng::Rng;

/// A partition: frames between `side[a] != side[b]` nodes are lost between
/// `start_ns` and `end_ns`, then the network heals.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    /// Start (virtual ns).
    pub start_ns: u64,
    /// End (virtual ns).
    pub end_ns: u64,
    /// Which side each node is on.
    pub side: Vec<bool>,
}

/// Wire behaviour.
#[derive(Clone, Debug, PartialEq)]
pub struct WireConfig {
    /// One-way propagation + switching latency.
    pub latency_ns: u64,
    /// Link rate of every NIC's egress (bits per second).
    pub bandwidth_bps: u64,
    /// Probability a frame is lost.
    pub loss: f64,
    /// Probability a frame is delivered twice.
    pub dup: f64,
    /// Probability a frame is delayed by a random extra amount (reordering).
    pub reorder: f64,
    /// Largest extra delay of a reordered frame.
    pub reorder_jitter_ns: u64,
    /// Optional healing partition.
    pub partition: Option<Partition>,
    /// Probability a DATA frame's payload gets one byte flipped without the
    /// headers noticing (an undetected corruption: only used to prove the
    /// checker catches corrupted deliveries).
    pub corrupt: f64,
    /// Ethernet's shortest frame (header and FCS included; 64): a shorter
    /// frame is padded on the wire. 0: no padding.
    pub min_frame_bytes: u64,
}

impl Default for WireConfig {
    fn default() -> Self {
        WireConfig {
            latency_ns: 5_000,
            bandwidth_bps: 10_000_000_000,
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            reorder_jitter_ns: 20_000,
            partition: None,
            corrupt: 0.0,
            min_frame_bytes: 0,
        }
    }
}

/// What the wire did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Frames put on the wire by NICs.
    pub frames: u64,
    /// Frames lost (random loss).
    pub lost: u64,
    /// Frames lost to the partition.
    pub partitioned: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Frames delayed out of order.
    pub reordered: u64,
    /// Bytes put on the wire.
    pub bytes: u64,
    /// Multicast transmissions (one per transmission, also in `frames`).
    pub mcast_sent: u64,
    /// Multicast copies delivered to members (each link faulted on its own).
    pub mcast_copies: u64,
}

/// One NIC and its host's memory.
pub struct Node {
    /// The control program.
    pub nic: Nic,
    /// SRAM.
    pub sram: Vec<u8>,
    /// Host physical memory.
    pub mem: HostMem,
    /// Interrupts raised (count per vector is not needed by the checks).
    pub interrupts: u64,
    timer_at: Option<u64>,
    egress_free_at: u64,
    doorbell_at: Option<u64>,
    /// The NIC is busy until then (cost model): events wait.
    nic_free_at: u64,
    /// NIC time spent in handlers (ns, cost model).
    pub nic_busy_ns: u64,
    /// The NIC's writes to host memory (data, completions) are done by
    /// then (cost model): the host must not see them earlier.
    pub host_visible_at: u64,
    /// A `Reveal` event is queued (weakly ordered DMA).
    reveal_queued: bool,
    /// Receive double buffering: when the NIC-to-host DMA engine is next
    /// free (ps).
    rx_dma_free_ps: u64,
    /// Per-CPU cost model: each CPU's and DMA engine's timelines.
    pub cpus: CpuTimelines,
}

/// Per-CPU state of [`World::cpu_costs`]: every time in ps.
#[derive(Debug, Default)]
pub struct CpuTimelines {
    /// When each NIC CPU is next free.
    free_ps: [u64; 2],
    /// When each DMA engine is next free (0: host to NIC, 1: NIC to host).
    dma_free_ps: [u64; 2],
    /// Time each CPU spent in steps (ps).
    pub busy_ps: [u64; 2],
    /// Steps each CPU ran.
    pub steps: [u64; 2],
    /// Hand-offs made to each CPU.
    pub handoffs: [u64; 2],
    /// When each step queued for a CPU is ready there, in queue order.
    ready_ps: [VecDeque<u64>; 2],
    /// When each completion written and not yet reaped is whole in host
    /// memory, in CQ order (the host takes only those: a completion the
    /// NIC's DMA is still writing is not there yet).
    pub(crate) cqe_done_ps: VecDeque<u64>,
}

/// One handler run's view of [`CpuTimelines`].
struct CpuRun<'a> {
    costs: StepCosts,
    t: &'a mut CpuTimelines,
    /// The CPU running the current step.
    cur: usize,
    /// The current step, and the DMAs it issued.
    step: CpuStep,
    dmas: u32,
    /// The current step (a completion) has written its first byte.
    cqe_open: bool,
    /// When the current step's last host-to-NIC DMA is done.
    read_done_ps: u64,
    /// When the run's last NIC-to-host DMA is done.
    written_ps: u64,
}

impl CpuRun<'_> {
    fn step(&mut self, cpu: u8, step: CpuStep, queued: bool) {
        let c = (cpu as usize).min(1);
        let mut start = self.t.free_ps[c];
        if queued {
            start = start.max(self.t.ready_ps[c].pop_front().unwrap_or(0));
        }
        let cost = self.costs.of(step) * 1000;
        self.t.free_ps[c] = start + cost;
        self.t.busy_ps[c] += cost;
        self.t.steps[c] += 1;
        self.cur = c;
        self.step = step;
        self.dmas = 0;
        self.cqe_open = false;
        self.read_done_ps = 0;
    }

    /// A step was queued for `cpu`: the current CPU pays the hand-off when
    /// it is another CPU; the step is ready there once that is done.
    fn event(&mut self, cpu: u8) {
        let c = (cpu as usize).min(1);
        if c != self.cur {
            self.t.free_ps[self.cur] += self.costs.handoff_ns * 1000;
            self.t.busy_ps[self.cur] += self.costs.handoff_ns * 1000;
            self.t.handoffs[c] += 1;
        }
        let at = self.t.free_ps[self.cur];
        self.t.ready_ps[c].push_back(at);
    }

    /// A DMA of `bytes` on `engine`, issued by the current step; returns when it is done.
    fn dma(&mut self, engine: usize, bytes: usize) -> u64 {
        // A completion's status word is no DMA of the thesis' NIC's.
        let extra = if self.dmas > 0 && self.step != CpuStep::Complete { self.costs.dma_extra_ns * 1000 } else { 0 };
        self.dmas += 1;
        let start = self.t.dma_free_ps[engine].max(self.t.free_ps[self.cur]);
        let done = start + extra + bytes as u64 * self.costs.dma_ps_per_byte;
        self.t.dma_free_ps[engine] = done;
        if engine == 1 && self.step == CpuStep::Complete {
            // A completion's writes (entry, then phase byte): whole at the last.
            match self.cqe_open {
                false => self.t.cqe_done_ps.push_back(done),
                true => {
                    if let Some(last) = self.t.cqe_done_ps.back_mut() {
                        *last = done;
                    }
                }
            }
            self.cqe_open = true;
        }
        done
    }
}

thread_local! {
    static IN_FIRMWARE: Cell<bool> = const { Cell::new(false) };
}

/// True while this thread runs the control program's own code: inside a
/// `Nic` handler the world called, and not in the simulated hardware it
/// calls back (`SimHal`). A counting allocator (`sim/tests/alloc.rs`) uses
/// it to tell the firmware's allocations from the harness's. Safe to call
/// from a global allocator (a const-initialised `Cell`, no destructor).
pub fn inside_firmware() -> bool {
    IN_FIRMWARE.try_with(Cell::get).unwrap_or(false)
}

/// Marks what runs until it is dropped as firmware (`true`) or hardware
/// (`false`) for [`inside_firmware`], then restores the previous mark.
struct Running(bool);

impl Running {
    fn firmware(inside: bool) -> Running {
        Running(IN_FIRMWARE.replace(inside))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        IN_FIRMWARE.set(self.0);
    }
}

/// Frames a handler run emitted: (destination, bytes, ps into the run at
/// which the work that produced it was done, ps earlier it may start on
/// the wire under Immediate Sending).
type Out = Vec<(u16, Vec<u8>, u64, u64)>;

struct SimHal<'a> {
    sram: &'a mut [u8],
    mem: &'a mut HostMem,
    out: &'a mut Out,
    pool: &'a mut Vec<Vec<u8>>,
    interrupts: &'a mut u64,
    /// Multicast filter changes the control program asked for.
    mcast: &'a mut Vec<(u16, bool)>,
    /// Cost of the run so far (ps), and what DMA and transmits add.
    work_ps: u64,
    /// `work_ps` when the last write to host memory was done.
    written_ps: u64,
    dma_ps_per_byte: u64,
    tx_ps: u64,
    /// Immediate Sending and receive double buffering.
    overlap: Overlap,
    /// Receive double buffering: when (ps into the run) the NIC-to-host
    /// DMA engine is free.
    wdma_free_ps: u64,
    /// The per-CPU cost model, when the world has one (then the fields
    /// above are unused).
    cpus: Option<CpuRun<'a>>,
    /// The run's start (ps).
    now_ps: u64,
}

impl SimHal<'_> {
    fn dma(&mut self, bytes: usize) {
        self.work_ps += bytes as u64 * self.dma_ps_per_byte;
    }
}

impl SimHal<'_> {
    /// Queues frame `b` for the wire: it leaves when the work before it is
    /// done, `early_ps` sooner under Immediate Sending.
    fn queue_frame(&mut self, dst_node: u16, b: Vec<u8>, early_ps: u64) {
        let (done_ps, early_ps) = match &self.cpus {
            // The frame leaves when its step and its payload's DMA are done.
            Some(c) => (c.t.free_ps[c.cur].max(c.read_done_ps) - self.now_ps, 0),
            None => {
                self.work_ps += self.tx_ps;
                (self.work_ps, early_ps)
            }
        };
        self.out.push((dst_node, b, done_ps, early_ps));
    }
}

impl Hal for SimHal<'_> {
    fn sram_read(&mut self, off: usize, buf: &mut [u8]) {
        let _hw = Running::firmware(false);
        buf.copy_from_slice(&self.sram[off..off + buf.len()]);
    }
    fn sram_write(&mut self, off: usize, data: &[u8]) {
        let _hw = Running::firmware(false);
        self.sram[off..off + data.len()].copy_from_slice(data);
    }
    fn dma_read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        let _hw = Running::firmware(false);
        self.mem.nic_read(addr, buf).ok_or(DmaError)?;
        match &mut self.cpus {
            Some(c) => c.read_done_ps = c.dma(0, buf.len()),
            None => self.dma(buf.len()),
        }
        Ok(())
    }
    fn dma_write(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaError> {
        let _hw = Running::firmware(false);
        self.mem.nic_write(addr, data).ok_or(DmaError)?;
        match &mut self.cpus {
            Some(c) => {
                let done = c.dma(1, data.len());
                c.written_ps = c.written_ps.max(done);
            }
            None if self.overlap.rx_double_buffering => {
                // On the DMA engine, beside the NIC: it takes the next frame meanwhile.
                let start = self.wdma_free_ps.max(self.work_ps);
                self.wdma_free_ps = start + data.len() as u64 * self.dma_ps_per_byte;
                self.written_ps = self.written_ps.max(self.wdma_free_ps);
            }
            None => {
                self.dma(data.len());
                self.written_ps = self.work_ps;
            }
        }
        Ok(())
    }
    fn dma_fence(&mut self) {
        let _hw = Running::firmware(false);
        self.mem.nic_fence();
    }
    fn mac_transmit(&mut self, dst_node: u16, frame: &[u8]) {
        let _hw = Running::firmware(false);
        let mut b = self.pool.pop().unwrap_or_default();
        b.clear();
        b.extend_from_slice(frame);
        // Store and forward: the payload was all in before the frame starts.
        self.queue_frame(dst_node, b, 0);
    }
    fn mac_transmit_host(&mut self, dst_node: u16, header: &[u8], payload: &[HostSeg]) -> Result<(), DmaError> {
        let _hw = Running::firmware(false);
        let mut total = header.len();
        for s in payload {
            let len = usize::try_from(s.len).map_err(|_| DmaError)?;
            self.mem.nic_check(s.addr, len).ok_or(DmaError)?;
            total += len;
        }
        if total > MTU_MAX as usize {
            return Err(DmaError);
        }
        let mut b = self.pool.pop().unwrap_or_default();
        b.clear();
        b.extend_from_slice(header);
        b.resize(total, 0);
        let mut at = header.len();
        for s in payload {
            let end = at + s.len as usize;
            self.mem.nic_read(s.addr, &mut b[at..end]).expect("checked above");
            at = end;
        }
        let dma_bytes = (total - header.len()) as u64;
        let early_ps = match &mut self.cpus {
            Some(c) => {
                c.read_done_ps = c.dma(0, dma_bytes as usize);
                0
            }
            None => {
                // Immediate Sending: the frame starts once its first chunk is in.
                self.dma(dma_bytes as usize);
                self.overlap.early_start_ps(dma_bytes, self.dma_ps_per_byte)
            }
        };
        self.mem.frames_sent_from_host += 1;
        self.queue_frame(dst_node, b, early_ps);
        Ok(())
    }
    fn raise_interrupt(&mut self, _vector: u16) {
        let _hw = Running::firmware(false);
        *self.interrupts += 1;
    }
    fn mcast_membership(&mut self, addr: u16, join: bool) {
        let _hw = Running::firmware(false);
        self.mcast.push((addr, join));
    }
    fn cpu_event(&mut self, cpu: u8, _event: u32) {
        let _hw = Running::firmware(false);
        if let Some(c) = &mut self.cpus {
            c.event(cpu);
        }
    }
    fn cpu_step(&mut self, cpu: u8, step: CpuStep, queued: bool) {
        let _hw = Running::firmware(false);
        if let Some(c) = &mut self.cpus {
            c.step(cpu, step, queued);
        }
    }
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Frame,
    Timer,
    Doorbell,
    Host,
    /// More of the NIC's pending host-memory writes become visible.
    Reveal,
}

/// An event's payload, kept in a slab: the heap only orders small
/// `(time, sequence, slab index)` keys.
#[derive(Debug)]
struct Event {
    node: u16,
    kind: Kind,
    data: Vec<u8>,
    /// When it was due (a NIC event waits while its NIC is busy).
    due: u64,
}

/// The order of a NIC's events due at the same instant (the EMP thesis'
/// event priority, §2.2.1). With a cost model, every event that waited for
/// a busy CPU is due when it frees, so this is which one the CPU takes next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventOrder {
    /// In the order they were queued (the simulator's default).
    #[default]
    Arrival,
    /// The Tigon2's: the host's doorbell (MAILBOX) before received frames
    /// (MAC_RX), then timers.
    MailboxFirst,
    /// The thesis' remedy: received frames (an ACK, a NACK) before the
    /// host's doorbell, so the sender hears the receiver before it sends on.
    MacRxFirst,
}

impl EventOrder {
    fn rank(self, kind: &Kind) -> u8 {
        match (self, kind) {
            (EventOrder::Arrival, _) => 0,
            (EventOrder::MailboxFirst, Kind::Doorbell) | (EventOrder::MacRxFirst, Kind::Frame) => 0,
            (_, Kind::Frame | Kind::Doorbell) => 1,
            _ => 2,
        }
    }
}

/// What an event was, as seen by the workload driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A NIC ran (frame, timer or doorbell), or more of its writes to host
    /// memory became visible: its host should poll.
    Nic(u16),
    /// A host wake-up the driver scheduled.
    Host(u16),
}

/// Test hook deciding whether the switch loses a frame (src, dst, bytes).
pub type DropFilter = Box<dyn FnMut(u16, u16, &[u8]) -> bool>;

/// The world.
pub struct World {
    /// Virtual time (ns).
    pub now: u64,
    /// Nodes, by node id.
    pub nodes: Vec<Node>,
    /// SRAM layout (same on every NIC).
    pub layout: Layout,
    /// Wire behaviour.
    pub wire: WireConfig,
    /// Wire counters.
    pub stats: WireStats,
    /// Events processed.
    pub events: u64,
    /// Delay between a host's doorbell write and the NIC noticing it.
    pub doorbell_ns: u64,
    /// What NIC (and, in the host driver, host) work costs; zero by default.
    pub cost: CostModel,
    /// Per-step costs on per-CPU timelines (replaces `cost`'s NIC part); none by default.
    pub cpu_costs: Option<StepCosts>,
    /// Immediate Sending and receive double buffering under `cost` (PM,
    /// seed 003 §3.2); off by default.
    pub overlap: Overlap,
    /// Which of a NIC's events due at the same time runs first.
    pub event_order: EventOrder,
    /// (due, rank by `event_order`, sequence, slab index).
    queue: BinaryHeap<Reverse<(u64, u8, u64, u32)>>,
    slab: Vec<Option<Event>>,
    slab_free: Vec<u32>,
    seq: u64,
    rng: Rng,
    out: Out,
    /// Frame buffers for reuse (bounded).
    pool: Vec<Vec<u8>>,
    /// Test hook: return true to lose a frame (src, dst, bytes).
    pub drop_filter: Option<DropFilter>,
    /// Doorbells and frames go to the sides' entry points first, the whole
    /// program only for what they leave (`Nic::doorbell_by_sides`,
    /// `Nic::frames_by_sides`), as a daemon running the NIC's CPUs on
    /// threads calls them; off by default.
    pub sides: bool,
    /// The switch's multicast table: the member nodes of each address
    /// (sorted), as their MACs asked (`Hal::mcast_membership`).
    mcast_members: std::collections::BTreeMap<u16, Vec<u16>>,
    /// Filter changes of the handler running now.
    mcast_changes: Vec<(u16, bool)>,
}

impl World {
    /// Boots `n` NICs with the same configuration; host `i` gets
    /// `mem_bytes[i]` bytes of memory.
    pub fn new(
        n: u16,
        params: LayoutParams,
        mtu: u32,
        features: u32,
        cfg: Config,
        wire: WireConfig,
        rng: Rng,
        mem_bytes: &[usize],
    ) -> World {
        let layout = Layout::new(params).expect("valid layout");
        let nodes = (0..n)
            .map(|id| {
                let mut sram = vec![0u8; layout.sram_size as usize];
                layout.header(id, mtu, features).put(&mut sram[..SramHeader::SIZE]);
                write_routes(&mut sram, &layout, n);
                let mut mem = HostMem::new(mem_bytes[id as usize]);
                let mut out = Vec::new();
                let mut pool = Vec::new();
                let mut interrupts = 0;
                let mut hal = SimHal {
                    sram: &mut sram,
                    mem: &mut mem,
                    out: &mut out,
                    pool: &mut pool,
                    interrupts: &mut interrupts,
                    mcast: &mut Vec::new(),
                    work_ps: 0,
                    written_ps: 0,
                    dma_ps_per_byte: 0,
                    tx_ps: 0,
                    overlap: Overlap::OFF,
                    wdma_free_ps: 0,
                    cpus: None,
                    now_ps: 0,
                };
                let mut c = cfg;
                c.gen_seed = 1 + id.wrapping_mul(31);
                let nic = Nic::boot(&mut hal, c).expect("boot");
                debug_assert_eq!(SramHeader::get(&sram).status, NicStatus::Running as u32);
                Node {
                    nic,
                    sram,
                    mem,
                    interrupts,
                    timer_at: None,
                    egress_free_at: 0,
                    doorbell_at: None,
                    nic_free_at: 0,
                    nic_busy_ns: 0,
                    host_visible_at: 0,
                    reveal_queued: false,
                    rx_dma_free_ps: 0,
                    cpus: CpuTimelines::default(),
                }
            })
            .collect();
        World {
            now: 0,
            nodes,
            layout,
            wire,
            stats: WireStats::default(),
            events: 0,
            doorbell_ns: 1_000,
            cost: CostModel::ZERO,
            cpu_costs: None,
            overlap: Overlap::OFF,
            event_order: EventOrder::Arrival,
            queue: BinaryHeap::new(),
            slab: Vec::new(),
            slab_free: Vec::new(),
            seq: 0,
            rng,
            out: Vec::new(),
            pool: Vec::new(),
            drop_filter: None,
            sides: false,
            mcast_members: std::collections::BTreeMap::new(),
            mcast_changes: Vec::new(),
        }
    }

    fn push(&mut self, at: u64, node: u16, kind: Kind, data: Vec<u8>) {
        self.queue_event(at, Event { node, kind, data, due: at });
    }

    fn queue_event(&mut self, at: u64, ev: Event) {
        self.seq += 1;
        let ev = Some(ev);
        let i = match self.slab_free.pop() {
            Some(i) => {
                self.slab[i as usize] = ev;
                i
            }
            None => {
                self.slab.push(ev);
                (self.slab.len() - 1) as u32
            }
        };
        let rank = self.event_order.rank(&self.slab[i as usize].as_ref().expect("just stored").kind);
        self.queue.push(Reverse((at, rank, self.seq, i)));
    }

    /// From now on every NIC's writes to host memory appear late and in
    /// random byte order, ordered only by DMA fences (`crate::weak_dma`).
    pub fn weak_dma(&mut self, seed: u64) {
        for (i, n) in self.nodes.iter_mut().enumerate() {
            n.mem.weak_dma(seed ^ 0x00D3_A000_0000_0000 ^ i as u64);
        }
    }

    /// The host of `node` wrote a doorbell.
    pub fn ring(&mut self, node: u16) {
        self.ring_at(node, self.now);
    }

    /// The host of `node` writes a doorbell at `at` (≥ now: it is busy until then).
    pub fn ring_at(&mut self, node: u16, at: u64) {
        let at = at.max(self.now) + self.doorbell_ns;
        let n = &mut self.nodes[node as usize];
        if n.doorbell_at.is_none() {
            n.doorbell_at = Some(at);
            self.push(at, node, Kind::Doorbell, Vec::new());
        }
    }

    /// Wakes the driver for `node` at `at`.
    pub fn wake_host(&mut self, node: u16, at: u64) {
        self.push(at.max(self.now), node, Kind::Host, Vec::new());
    }

    /// Delivers a hand-made frame to `node` now (tests of untrusted input).
    pub fn inject_frame(&mut self, node: u16, frame: &[u8]) {
        self.push(self.now, node, Kind::Frame, frame.to_vec());
    }

    /// Runs the NIC of `node` synchronously on its doorbell (setup phase).
    pub fn doorbell_now(&mut self, node: u16) {
        self.run_nic(node, 0, 0, |nic, hal, now| nic.handle_doorbell(hal, now));
    }

    /// When the CPU `kind` arrives on at `node` is next free.
    fn free_for(&self, node: u16, kind: &Kind) -> u64 {
        let n = &self.nodes[node as usize];
        if self.cpu_costs.is_none() {
            return n.nic_free_at;
        }
        n.cpus.free_ps[Self::entry_cpu(n, kind)].div_ceil(1000)
    }

    /// The NIC CPU an event of `kind` runs on.
    fn entry_cpu(n: &Node, kind: &Kind) -> usize {
        match kind {
            Kind::Frame => n.nic.frame_cpu().min(1),
            _ => 0,
        }
    }

    /// Processes the next event; `None` when nothing is left.
    pub fn step(&mut self) -> Option<Step> {
        let Reverse((at, _, _, i)) = self.queue.pop()?;
        let ev = self.slab[i as usize].take().expect("queued event");
        self.slab_free.push(i);
        debug_assert!(at >= self.now, "time went backwards");
        self.now = at;
        self.events += 1;
        let node = ev.node;
        if ev.kind == Kind::Timer && self.nodes[node as usize].timer_at != Some(ev.due) {
            return Some(Step::Nic(node)); // Superseded.
        }
        if ev.kind == Kind::Reveal {
            // The memory system, not the NIC: it does not wait for the NIC.
            let n = &mut self.nodes[node as usize];
            n.reveal_queued = false;
            self.queue_reveal(node);
            return Some(Step::Nic(node));
        }
        let free = self.free_for(node, &ev.kind);
        if ev.kind != Kind::Host && free > at {
            // The NIC is still busy with earlier work: the event waits.
            self.queue_event(free, ev);
            return Some(Step::Nic(node));
        }
        match ev.kind {
            Kind::Host => return Some(Step::Host(node)),
            Kind::Frame => {
                let data = ev.data;
                let cpu = Self::entry_cpu(&self.nodes[node as usize], &Kind::Frame);
                if self.sides {
                    self.run_nic(node, 1, cpu, |nic, hal, now| nic.frames_by_sides(hal, now, &[&data]));
                } else {
                    self.run_nic(node, 1, cpu, |nic, hal, now| nic.handle_frame(hal, now, &data));
                }
                if self.pool.len() < 4096 {
                    self.pool.push(data);
                }
            }
            Kind::Timer => {
                self.nodes[node as usize].timer_at = None;
                if self.sides {
                    self.run_nic(node, 0, 0, |nic, hal, now| nic.timeout_by_sides(hal, now));
                } else {
                    self.run_nic(node, 0, 0, |nic, hal, now| nic.handle_timeout(hal, now));
                }
            }
            Kind::Doorbell => {
                self.nodes[node as usize].doorbell_at = None;
                if self.sides {
                    self.run_nic(node, 0, 0, |nic, hal, now| nic.doorbell_by_sides(hal, now));
                } else {
                    self.run_nic(node, 0, 0, |nic, hal, now| nic.handle_doorbell(hal, now));
                }
            }
            Kind::Reveal => unreachable!("handled above"),
        }
        Some(Step::Nic(node))
    }

    /// Runs a handler of `node`'s NIC (which took in `rx_frames` frames)
    /// now on NIC CPU `cpu`; under a cost model the NIC (per-CPU model: its
    /// CPUs and DMA engines) is then busy for the run's work and each frame
    /// leaves when the work before it is done.
    fn run_nic(&mut self, node: u16, rx_frames: u64, cpu: usize, f: impl FnOnce(&mut Nic, &mut SimHal<'_>, u64)) {
        let now = self.now;
        let now_ps = now * 1000;
        let mut out = core::mem::take(&mut self.out);
        let mut mcast = core::mem::take(&mut self.mcast_changes);
        let cost = self.cost;
        let cpu_costs = self.cpu_costs;
        let overlap = self.overlap;
        let rx_dma_free_before = self.nodes[node as usize].rx_dma_free_ps;
        let work_ps = {
            let n = &mut self.nodes[node as usize];
            let cpus = cpu_costs.map(|costs| {
                for f in n.cpus.free_ps.iter_mut() {
                    *f = (*f).max(now_ps);
                }
                CpuRun {
                    costs,
                    t: &mut n.cpus,
                    cur: cpu,
                    step: CpuStep::Complete,
                    dmas: 0,
                    cqe_open: false,
                    read_done_ps: 0,
                    written_ps: 0,
                }
            });
            let mut hal = SimHal {
                sram: &mut n.sram,
                mem: &mut n.mem,
                out: &mut out,
                pool: &mut self.pool,
                interrupts: &mut n.interrupts,
                mcast: &mut mcast,
                work_ps: rx_frames * cost.nic_rx_frame_ns * 1000,
                written_ps: 0,
                dma_ps_per_byte: cost.nic_dma_ps_per_byte,
                tx_ps: cost.nic_tx_frame_ns * 1000,
                overlap,
                wdma_free_ps: rx_dma_free_before.saturating_sub(now_ps),
                cpus,
                now_ps,
            };
            let fw = Running::firmware(true);
            f(&mut n.nic, &mut hal, now);
            // The NIC's other CPUs run the steps queued for them (in time,
            // the NIC is one processor).
            while (0..n.nic.cpus()).any(|c| n.nic.cpu_pending(c) > 0) {
                for c in 0..n.nic.cpus() {
                    if self.sides {
                        n.nic.cpu_by_sides(&mut hal, now, c);
                    } else {
                        n.nic.handle_cpu(&mut hal, now, c);
                    }
                }
            }
            drop(fw);
            // Debug runs (the test profile: every swarm seed) check the NIC's
            // tables after every handler, not only at quiesce.
            #[cfg(debug_assertions)]
            if let Err(e) = n.nic.invariants() {
                panic!("node {node} at {now} ns: invariant broken after a handler: {e}");
            }
            if overlap.rx_double_buffering {
                n.rx_dma_free_ps = n.rx_dma_free_ps.max(now_ps + hal.wdma_free_ps);
            }
            match hal.cpus {
                // Per-CPU: the CPUs' busy time was kept on their timelines.
                Some(c) => (None, c.written_ps.saturating_sub(now_ps)),
                None => (Some(hal.work_ps), hal.written_ps),
            }
        };
        let (work_ps, written_ps) = work_ps;
        let n = &mut self.nodes[node as usize];
        n.host_visible_at = n.host_visible_at.max(now + written_ps.div_ceil(1000));
        if let Some(work_ps) = work_ps {
            let work_ns = work_ps.div_ceil(1000);
            n.nic_free_at = n.nic_free_at.max(now + work_ns);
            n.nic_busy_ns += work_ns;
            if overlap.rx_double_buffering && rx_frames > 0 {
                // Two receive buffers: the frame after this one goes into
                // the buffer whose DMA was running when this one came in.
                n.nic_free_at = n.nic_free_at.max(rx_dma_free_before.div_ceil(1000));
            }
        }
        for (addr, join) in mcast.drain(..) {
            let members = self.mcast_members.entry(addr).or_default();
            match (members.binary_search(&node), join) {
                (Err(at), true) => members.insert(at, node),
                (Ok(at), false) => {
                    members.remove(at);
                }
                _ => {}
            }
        }
        self.mcast_changes = mcast;
        for (dst, frame, done_ps, early_ps) in out.drain(..) {
            self.transmit(node, dst, frame, now + done_ps.div_ceil(1000), early_ps / 1000);
        }
        if overlap.nic_waits_for_mac && work_ps.is_some() {
            let n = &mut self.nodes[node as usize];
            n.nic_free_at = n.nic_free_at.max(n.egress_free_at);
        }
        self.out = out;
        let n = &mut self.nodes[node as usize];
        if !n.reveal_queued && n.mem.has_pending() {
            // Weakly ordered DMA: the writes start to appear once done.
            n.reveal_queued = true;
            let at = n.host_visible_at.max(now) + 1;
            self.push(at, node, Kind::Reveal, Vec::new());
        }
        let next = self.nodes[node as usize].nic.poll_timeout();
        if let Some(t) = next {
            let t = t.max(now);
            let n = &mut self.nodes[node as usize];
            if n.timer_at.is_none_or(|cur| t < cur) {
                n.timer_at = Some(t);
                self.push(t, node, Kind::Timer, Vec::new());
            }
        }
    }

    /// Draws the wire's faults from `seed` from now on (scenarios that
    /// vary only the seed of one cluster shape).
    pub fn reseed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }

    /// Reveals part of `node`'s pending host-memory writes and queues the
    /// next reveal while some remain.
    fn queue_reveal(&mut self, node: u16) {
        let n = &mut self.nodes[node as usize];
        if let Some(delay) = n.mem.reveal_some() {
            n.reveal_queued = true;
            let at = self.now + delay;
            self.push(at, node, Kind::Reveal, Vec::new());
        }
    }

    /// Puts a frame the NIC of `src` finished at `ready` on its link; under
    /// Immediate Sending it may start up to `early_ns` sooner, its DMA
    /// running while it goes out ([`Overlap`]).
    fn transmit(&mut self, src: u16, dst: u16, frame: Vec<u8>, ready: u64, early_ns: u64) {
        self.stats.frames += 1;
        self.stats.bytes += frame.len() as u64;
        // Serialization on the sender's link (Ethernet overhead: 38 bytes,
        // of which 18 header and FCS, padded to the shortest frame).
        let bits = ((frame.len() as u64 + 18).max(self.wire.min_frame_bytes) + 20) * 8;
        let tx_ns = bits * 1_000_000_000 / self.wire.bandwidth_bps;
        let n = &mut self.nodes[src as usize];
        let start = n.egress_free_at.max(ready - early_ns.min(ready));
        let mut end = start + tx_ns;
        if early_ns > 0 {
            // The last chunk goes out after its DMA: the link cannot outrun it.
            let chunk = self.overlap.chunk_bytes.min(frame.len() as u64);
            end = end.max(ready + chunk * 8 * 1_000_000_000 / self.wire.bandwidth_bps);
        }
        n.egress_free_at = end;
        let at = end + self.wire.latency_ns;
        if emp_uapi::wire::is_mcast(dst) {
            // One transmission; the switch copies it to every member but
            // the sender, each link losing, delaying, reordering on its own.
            self.stats.mcast_sent += 1;
            let members = self.mcast_members.get(&dst).cloned().unwrap_or_default();
            for m in members.into_iter().filter(|&m| m != src) {
                self.stats.mcast_copies += 1;
                self.deliver(src, m, frame.clone(), at);
            }
            self.pool.push(frame);
            return;
        }
        self.deliver(src, dst, frame, at);
    }

    /// The switch's link from `src` to `dst`: partition, loss, corruption,
    /// reordering and duplication, then the frame arrives at `at` or later.
    fn deliver(&mut self, src: u16, dst: u16, frame: Vec<u8>, mut at: u64) {
        if dst as usize >= self.nodes.len() {
            self.stats.lost += 1;
            return;
        }
        if let Some(p) = &self.wire.partition {
            if self.now >= p.start_ns && self.now < p.end_ns && p.side[src as usize] != p.side[dst as usize] {
                self.stats.partitioned += 1;
                return;
            }
        }
        let filtered = self.drop_filter.as_mut().is_some_and(|f| f(src, dst, &frame));
        if filtered || self.rng.chance(self.wire.loss) {
            self.stats.lost += 1;
            self.pool.push(frame);
            return;
        }
        let mut frame = frame;
        if self.rng.chance(self.wire.corrupt) {
            if let Ok(emp_uapi::wire::Frame::Data { hdr, .. }) = emp_uapi::wire::Frame::parse(&frame) {
                let head = emp_uapi::wire::data_header_len(hdr.frame_index);
                if hdr.payload_len > 0 {
                    let at = head + self.rng.below(hdr.payload_len as u64) as usize;
                    frame[at] ^= 0x5A;
                }
            }
        }
        if self.rng.chance(self.wire.reorder) {
            self.stats.reordered += 1;
            at += 1 + self.rng.below(self.wire.reorder_jitter_ns.max(1));
        }
        if self.rng.chance(self.wire.dup) {
            self.stats.duplicated += 1;
            let extra = self.rng.below(self.wire.reorder_jitter_ns.max(1));
            self.push(at + extra, dst, Kind::Frame, frame.clone());
        }
        self.push(at, dst, Kind::Frame, frame);
    }

    /// `node`'s port `port` joins (or leaves) multicast address `addr`,
    /// as the control program's multicast interface is asked to (no host
    /// request reaches it yet: the reliable-broadcast protocol will).
    pub fn mcast_membership(&mut self, node: u16, port: u16, addr: u16, join: bool) -> Result<(), McastError> {
        let mut r = Ok(());
        self.run_nic(node, 0, 0, |nic, hal, _| {
            r = if join { nic.mcast_join(hal, port, addr) } else { nic.mcast_leave(hal, port, addr) };
        });
        r
    }

    /// `node`'s control program transmits `frame` to the multicast address its header names.
    pub fn mcast_transmit(&mut self, node: u16, frame: &[u8]) -> Result<(), McastError> {
        let mut r = Ok(());
        self.run_nic(node, 0, 0, |nic, hal, _| r = nic.mcast_transmit(hal, frame));
        r
    }

    /// True when no event is pending.
    pub fn idle(&self) -> bool {
        self.queue.is_empty()
    }

    /// Time of the next event.
    pub fn next_at(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse((at, _, _, _))| *at)
    }
}
