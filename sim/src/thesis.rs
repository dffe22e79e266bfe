//! `emp-sim thesis`: the EMP thesis' chapter 3 (seed 004) reproduced. Two
//! NICs run the real control program under each CPU plan (base, SO, RO,
//! DSR, SR) with the per-step costs of its Table 3.1 charged on per-CPU
//! timelines ([`StepCosts::THESIS`]), the Tigon2's DMA engines and a
//! Gigabit Ethernet wire at 1500 B frames, back to back; the thesis'
//! benchmarks (§3.5.2) run on them:
//!
//! - **latency**: ping-pong, half the mean round trip;
//! - **bandwidth**: the sender keeps two sends outstanding, the receiver
//!   keeps receives posted; bytes over the time between the receiver's
//!   completions (after a warm-up);
//! - **bidirectional bandwidth**: both at once, both directions summed.
//!
//! Hosts pay one PCI transaction (380 ns, §2.3.3) to post a descriptor and
//! one to see a completion. [`reproduce`] compares the results with the
//! figures the thesis states ([`PAPER`]); `docs/thesis-cpus.md` discusses them.

use emp_firmware::{Config, MatchMode};
use emp_uapi::desc::{Cqe, Status};
use emp_uapi::image::cpu_plan;
use emp_uapi::wire::data_header_len;
use emp_uapi::PAGE_SIZE;

use crate::cluster::Cluster;
use crate::cost::{CostModel, StepCosts};
use crate::world::{EventOrder, Step, WireConfig};

/// The plans, in the thesis' order, with their names.
pub const PLANS: [(u32, &str); 5] = [
    (cpu_plan::BASE, "base"),
    (cpu_plan::SO, "SO"),
    (cpu_plan::RO, "RO"),
    (cpu_plan::DSR, "DSR"),
    (cpu_plan::SR, "SR"),
];

/// Ethernet MTU of every run (§3.5.1).
pub const MTU: u32 = 1500;
/// One PCI transaction of the host (a status poll, §2.3.3).
pub const HOST_PCI_NS: u64 = 380;
/// Tolerance of every reproduced figure.
pub const TOLERANCE: f64 = 0.15;

/// Where the sender's buffer starts in its data region (page-aligned).
const SEND_OFF: u64 = 0;
/// Where the receive buffers start (page-aligned).
const RECV_OFF: u64 = 1 << 20;
/// Receives kept posted by a bandwidth receiver.
pub const RECVS_POSTED: u64 = 32;
/// Sends kept outstanding by a bandwidth sender (§3.5.2: two).
const SENDS_OUTSTANDING: u64 = 2;
/// Virtual time any one experiment may take.
const LIMIT_NS: u64 = 5_000_000_000;

/// The machine of the thesis' setup 1 under the per-CPU cost model.
#[derive(Clone, Debug)]
pub struct Machine {
    /// Step, hand-off and DMA costs.
    pub steps: StepCosts,
    /// Host costs (posting and seeing a completion).
    pub host: CostModel,
    /// The wire.
    pub wire: WireConfig,
    /// Event priority (§2.2.1): the Tigon2's is MAILBOX before MAC_RX.
    pub order: EventOrder,
}

impl Machine {
    /// Setup 1: two hosts back to back on Gigabit Ethernet.
    pub fn thesis() -> Machine {
        let host = CostModel { host_post_ns: HOST_PCI_NS, host_cqe_ns: HOST_PCI_NS, ..CostModel::ZERO };
        let wire =
            WireConfig { latency_ns: 0, bandwidth_bps: 1_000_000_000, min_frame_bytes: 64, ..WireConfig::default() };
        Machine { steps: StepCosts::THESIS, host, wire, order: EventOrder::MailboxFirst }
    }

    /// Two NICs running `plan`.
    fn cluster(&self, plan: u32) -> Cluster {
        let cfg = Config {
            cpu_plan: plan,
            group_size: 3,
            // No retransmission of a frame that only waits behind a busy CPU.
            rto_ns: 50_000_000,
            matching: MatchMode::Unexpected,
            ..Config::default()
        };
        let mut c = Cluster::new(2, cfg, 0, MTU, self.wire.clone());
        c.world.cost = self.host;
        c.world.cpu_costs = Some(self.steps);
        c.world.doorbell_ns = 0;
        c.world.event_order = self.order;
        c
    }
}

/// Payload bytes of the first frame of a message (the next ones carry more).
pub fn first_frame_payload() -> u64 {
    MTU as u64 - data_header_len(0) as u64
}

/// Payload bytes of every frame after the first.
pub fn next_frame_payload() -> u64 {
    MTU as u64 - data_header_len(1) as u64
}

fn page_round(n: u64) -> u64 {
    n.div_ceil(PAGE_SIZE as u64).max(1) * PAGE_SIZE as u64
}

/// Steps `c` once; fails when nothing is left or time ran out.
fn step(c: &mut Cluster, end: u64) -> Result<Step, String> {
    let s = c.step().ok_or("the simulation went idle before the benchmark finished")?;
    if c.world.now > end {
        return Err(format!("not finished after {} ms of virtual time", LIMIT_NS / 1_000_000));
    }
    Ok(s)
}

fn check(cqe: &Cqe) -> Result<(), String> {
    if cqe.status == Status::Success as u8 {
        Ok(())
    } else {
        Err(format!("wr {} failed: {:?}", cqe.wr_id, Status::from_u8(cqe.status)))
    }
}

/// Ping-pong latency of `size`-byte messages under `plan` (µs): half the
/// mean round trip over `iters` after a warm-up one.
pub fn latency(m: &Machine, plan: u32, size: u64, iters: u32) -> Result<f64, String> {
    latency_on(m.cluster(plan), size, iters)
}

/// The ping-pong of [`latency`] between nodes 0 and 1 of `c`, which may
/// model any machine (`emp-sim pm` runs it under PM's).
pub fn latency_on(mut c: Cluster, size: u64, iters: u32) -> Result<f64, String> {
    let end = c.world.now + LIMIT_NS;
    let rbuf = page_round(size);
    // Pong keeps two receives posted (the thesis' pong posts the next
    // before it answers), ping posts its receive then its send.
    let mut pong_recvs: Vec<u64> = (0..2).map(|i| c.recv_into(1, (0, 0), 1, RECV_OFF + i * rbuf, size)).collect();
    let mut t0 = 0;
    let mut pong_slot = 0u64;
    for it in 0..=iters {
        if it == 1 {
            t0 = c.world.now;
        }
        let r = c.recv_into(0, (1, 0), 2, RECV_OFF, size);
        let s = c.send_contiguous(0, 1, 1, SEND_OFF, size);
        let (mut got_r, mut got_s) = (false, false);
        while !(got_r && got_s) {
            let (Step::Nic(n) | Step::Host(n)) = step(&mut c, end)?;
            for (cqe, _) in c.take_ready(n) {
                check(&cqe)?;
                match n {
                    0 if cqe.wr_id == r => got_r = true,
                    0 if cqe.wr_id == s => got_s = true,
                    1 if pong_recvs.contains(&cqe.wr_id) => {
                        // A receive at pong: repost it, answer.
                        pong_recvs.retain(|&w| w != cqe.wr_id);
                        pong_recvs.push(c.recv_into(1, (0, 0), 1, RECV_OFF + (pong_slot % 2) * rbuf, size));
                        pong_slot += 1;
                        c.send_contiguous(1, 0, 2, SEND_OFF, size);
                    }
                    _ => {}
                }
            }
        }
    }
    Ok((c.world.now - t0) as f64 / (2.0 * iters as f64) / 1000.0)
}

/// One direction of a bandwidth run at a node.
struct Stream {
    /// Receives posted at this node, by wr: their slot.
    recvs: std::collections::HashMap<u64, u64>,
    /// Sends outstanding from this node.
    sends: u64,
    /// Sends posted so far.
    posted: u64,
    /// Messages received, and when the warm-up ended and the last arrived.
    received: u64,
    t_warm: u64,
    t_last: u64,
}

/// Bandwidth (Mb/s) of `count` `size`-byte messages under `plan`, node 0
/// to node 1, or both ways at once (`both`, the two directions summed).
pub fn bandwidth(m: &Machine, plan: u32, size: u64, count: u64, both: bool) -> Result<f64, String> {
    bandwidth_on(m.cluster(plan), size, count, both, SENDS_OUTSTANDING)
}

/// The stream of [`bandwidth`] between nodes 0 and 1 of `c`, which may
/// model any machine (`emp-sim pm` runs it under PM's), each sender
/// keeping `outstanding` sends posted (at most [`RECVS_POSTED`]).
pub fn bandwidth_on(mut c: Cluster, size: u64, count: u64, both: bool, outstanding: u64) -> Result<f64, String> {
    if outstanding == 0 || outstanding > RECVS_POSTED {
        return Err(format!("{outstanding} sends outstanding: 1 to {RECVS_POSTED}"));
    }
    const WARM: u64 = 4;
    if count <= WARM {
        return Err(format!("{count} messages: at least {} needed", WARM + 1));
    }
    let end = c.world.now + LIMIT_NS;
    let rbuf = page_round(size);
    let dirs: &[(u16, u16)] = if both { &[(0, 1), (1, 0)] } else { &[(0, 1)] };
    let mut st: Vec<Stream> = (0..2)
        .map(|_| Stream { recvs: Default::default(), sends: 0, posted: 0, received: 0, t_warm: 0, t_last: 0 })
        .collect();
    for &(src, dst) in dirs {
        for slot in 0..RECVS_POSTED {
            let wr = c.recv_into(dst, (src, 0), 1, RECV_OFF + slot * rbuf, size);
            st[dst as usize].recvs.insert(wr, slot);
        }
    }
    for &(src, dst) in dirs {
        for _ in 0..outstanding {
            c.send_contiguous(src, dst, 1, SEND_OFF, size);
            st[src as usize].sends += 1;
            st[src as usize].posted += 1;
        }
    }
    let done = |st: &[Stream]| dirs.iter().all(|&(_, dst)| st[dst as usize].received >= count);
    while !done(&st) {
        let (Step::Nic(n) | Step::Host(n)) = step(&mut c, end)?;
        let peer = 1 - n;
        for (cqe, seen) in c.take_ready(n) {
            check(&cqe)?;
            let s = &mut st[n as usize];
            if let Some(slot) = s.recvs.remove(&cqe.wr_id) {
                s.received += 1;
                if s.received == WARM {
                    s.t_warm = seen;
                }
                s.t_last = seen;
                if s.received + (s.recvs.len() as u64) < count {
                    let wr = c.recv_into(n, (peer, 0), 1, RECV_OFF + slot * rbuf, size);
                    st[n as usize].recvs.insert(wr, slot);
                }
            } else {
                s.sends -= 1;
                if s.posted < count {
                    c.send_contiguous(n, peer, 1, SEND_OFF, size);
                    let s = &mut st[n as usize];
                    s.sends += 1;
                    s.posted += 1;
                }
            }
        }
    }
    let mbps = dirs
        .iter()
        .map(|&(_, dst)| {
            let s = &st[dst as usize];
            let ns = (s.t_last - s.t_warm).max(1) as f64;
            ((count - WARM) * size * 8) as f64 / ns * 1000.0
        })
        .sum();
    Ok(mbps)
}

/// A figure the thesis states.
#[derive(Clone, Copy, Debug)]
pub struct Stated {
    /// What it is.
    pub what: &'static str,
    /// Its value, or its range (low, high).
    pub low: f64,
    /// High end (= `low` for a single value).
    pub high: f64,
    /// Unit.
    pub unit: &'static str,
    /// Where the thesis states it.
    pub source: &'static str,
}

/// The stated figures the reproduction checks, in [`reproduce`]'s order.
pub const PAPER: [Stated; 8] = [
    Stated { what: "base latency, 10 B", low: 24.31, high: 24.31, unit: "µs", source: "§1.2, §3.5.2" },
    Stated { what: "SO latency, 10 B", low: 24.52, high: 24.52, unit: "µs", source: "§3.5.2" },
    Stated { what: "RO latency, 10 B", low: 22.62, high: 22.62, unit: "µs", source: "§3.5.2" },
    Stated { what: "DSR latency, 10 B", low: 22.76, high: 22.76, unit: "µs", source: "§3.5.2" },
    Stated {
        what: "base bandwidth",
        low: 840.0,
        high: 880.0,
        unit: "Mb/s",
        source: "§1.2 (840), abstract, §4.1 (880)",
    },
    Stated { what: "RO bandwidth", low: 964.0, high: 964.0, unit: "Mb/s", source: "abstract, §1.2, §3.5.2" },
    Stated { what: "base bidirectional", low: 940.0, high: 940.0, unit: "Mb/s", source: "§1.2" },
    Stated { what: "SO bidirectional", low: 1100.0, high: 1100.0, unit: "Mb/s", source: "§1.2" },
];

/// One reproduced figure.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// The thesis' figure.
    pub paper: Stated,
    /// Ours.
    pub ours: f64,
}

impl Row {
    /// Relative distance to the stated value or range (0 inside a range).
    pub fn deviation(&self) -> f64 {
        let p = &self.paper;
        if self.ours < p.low {
            (self.ours - p.low) / p.low
        } else if self.ours > p.high {
            (self.ours - p.high) / p.high
        } else {
            0.0
        }
    }

    /// Within [`TOLERANCE`].
    pub fn holds(&self) -> bool {
        self.deviation().abs() <= TOLERANCE
    }
}

/// A latency jump the thesis' curves show.
#[derive(Clone, Copy, Debug)]
pub struct Jump {
    /// What causes it.
    pub what: &'static str,
    /// Last size before it and first after it.
    pub below: u64,
    /// First size after it.
    pub above: u64,
    /// Latencies there (µs).
    pub lat_below: f64,
    /// Latency after it (µs).
    pub lat_above: f64,
    /// The rise over the same number of bytes just before (µs): what the
    /// bytes alone cost.
    pub baseline: f64,
}

impl Jump {
    /// The step up beyond what the bytes cost.
    pub fn excess(&self) -> f64 {
        (self.lat_above - self.lat_below) - self.baseline
    }
}

/// Every stated figure reproduced, and the two latency jumps (base plan).
#[derive(Clone, Debug)]
pub struct Reproduction {
    /// [`PAPER`]'s figures with ours.
    pub rows: Vec<Row>,
    /// The jumps at one frame (1500 B) and one page (4096 B).
    pub jumps: Vec<Jump>,
}

/// Size of the bandwidth figures (the thesis' curves are flat from here).
pub const BW_SIZE: u64 = 64 * 1024;

/// Runs every experiment behind [`PAPER`] and the jumps; `iters`
/// ping-pongs per latency, `msgs` messages per bandwidth.
pub fn reproduce(m: &Machine, iters: u32, msgs: u64) -> Result<Reproduction, String> {
    let lat = |plan| latency(m, plan, 10, iters);
    let ours = [
        lat(cpu_plan::BASE)?,
        lat(cpu_plan::SO)?,
        lat(cpu_plan::RO)?,
        lat(cpu_plan::DSR)?,
        bandwidth(m, cpu_plan::BASE, BW_SIZE, msgs, false)?,
        bandwidth(m, cpu_plan::RO, BW_SIZE, msgs, false)?,
        bandwidth(m, cpu_plan::BASE, BW_SIZE, msgs, true)?,
        bandwidth(m, cpu_plan::SO, BW_SIZE, msgs, true)?,
    ];
    let rows = PAPER.iter().zip(ours).map(|(&paper, ours)| Row { paper, ours }).collect();
    let frame = first_frame_payload();
    let mut jumps = Vec::new();
    for (what, edge) in [("one more frame (1500 B)", frame), ("a page boundary inside a frame (4096 B)", 4096)] {
        let l = |s| latency(m, cpu_plan::BASE, s, iters);
        let (before, below, above) = (l(edge - 1)?, l(edge)?, l(edge + 1)?);
        jumps.push(Jump {
            what,
            below: edge,
            above: edge + 1,
            lat_below: below,
            lat_above: above,
            baseline: below - before,
        });
    }
    Ok(Reproduction { rows, jumps })
}

/// Sizes of the curves: powers of two and the frame and page edges.
pub fn curve_sizes(up_to: u64) -> Vec<u64> {
    let f = first_frame_payload();
    let mut s: Vec<u64> = (2..=20).map(|p| 1u64 << p).filter(|&x| x <= up_to).collect();
    s.extend([10, f, f + 1, f + next_frame_payload(), f + next_frame_payload() + 1, 4097, 6000, 12_000]);
    s.retain(|&x| x <= up_to);
    s.sort_unstable();
    s.dedup();
    s
}

/// A plan's curve: its name and (size, value) points.
pub type Curve = (&'static str, Vec<(u64, f64)>);

/// Per plan, a curve of `f(plan, size)` over `sizes`.
pub fn curves(sizes: &[u64], mut f: impl FnMut(u32, u64) -> Result<f64, String>) -> Result<Vec<Curve>, String> {
    let mut out = Vec::new();
    for (plan, name) in PLANS {
        let pts = sizes.iter().map(|&s| f(plan, s).map(|v| (s, v))).collect::<Result<Vec<_>, _>>()?;
        out.push((name, pts));
    }
    Ok(out)
}

/// The thesis' figures drawn again: per plan, latency and bandwidth
/// against message size (SVG).
pub mod plot {
    use std::path::Path;

    use plotters::prelude::*;

    /// One curve per plan.
    pub type Curves = [super::Curve];

    /// The `i`-th curve's colour (shared by every figure the simulator draws).
    pub(crate) fn color(i: usize) -> RGBColor {
        [
            RGBColor(40, 40, 40),
            RGBColor(30, 60, 200),
            RGBColor(200, 30, 30),
            RGBColor(30, 150, 60),
            RGBColor(230, 140, 0),
            RGBColor(140, 40, 160),
            RGBColor(0, 150, 160),
        ][i % 7]
    }

    /// Draws `curves` into `path`: x message size (bytes, log), y linear;
    /// `marks` are the thesis' stated points, drawn as crosses.
    pub fn draw(path: &Path, title: &str, ylabel: &str, curves: &Curves, marks: &[(u64, f64)]) -> Result<(), String> {
        let pts = curves.iter().flat_map(|c| c.1.iter()).map(|&(x, y)| (x as f64, y));
        let pts = pts.chain(marks.iter().map(|&(x, y)| (x as f64, y)));
        let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0.0f64);
        for (x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            return Err(format!("{}: nothing to draw", path.display()));
        }
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        let e = |e: DrawingAreaErrorKind<_>| format!("{}: {e}", path.display());
        root.fill(&WHITE).map_err(e)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((x0 / 1.3..x1 * 1.3).log_scale(), 0.0..y1 * 1.1)
            .map_err(e)?;
        chart.configure_mesh().x_desc("message size, bytes").y_desc(ylabel).draw().map_err(e)?;
        for (i, (name, s)) in curves.iter().enumerate() {
            let c = color(i);
            let line = s.iter().map(|&(x, y)| (x as f64, y));
            chart
                .draw_series(LineSeries::new(line, c.stroke_width(2)))
                .map_err(e)?
                .label(*name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        }
        if !marks.is_empty() {
            chart
                .draw_series(marks.iter().map(|&(x, y)| Cross::new((x as f64, y), 6, BLACK.stroke_width(2))))
                .map_err(e)?
                .label("thesis (stated)")
                .legend(|(x, y)| Cross::new((x + 10, y), 5, BLACK.stroke_width(2)));
        }
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(e)?;
        root.present().map_err(e)?;
        Ok(())
    }
}
