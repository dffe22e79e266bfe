//! `emp-sim pm`: PM (seed 003: Tezuka, Hori, Ishikawa, Myrinet on
//! SPARCstation 20) reproduced on the [`CostModel`]: two NICs run the real
//! control program with PM's parameters ([`Machine::pm`]) and
//!
//! - **Table 2**: the real context switch of `firmware/src/ctxsw.rs`
//!   (`PortSave`, `PortRestore`) at PM's four buffer occupancies, each
//!   costing the NIC time the model charges for the image's DMA
//!   ([`table2`]);
//! - **Fig. 6**: one-way latency, 8 – 4096 B, with and without Immediate
//!   Sending ([`latency`]);
//! - **Fig. 7**: throughput, 8 – 4096 B, with Immediate Sending and
//!   receive double buffering, with Immediate Sending only, and with
//!   neither ([`bandwidth`]).
//!
//! The benchmarks are `emp-sim thesis`' ([`thesis::latency_on`],
//! [`thesis::bandwidth_on`]). `docs/context-switch.md` ("Table 2") and
//! `docs/immediate-sending.md` discuss the results.

use emp_firmware::{Config, MatchMode};
use emp_uapi::sram::admin_result as ar;
use emp_uapi::sram::FEATURE_IMMEDIATE_SENDING;
use emp_uapi::wire::data_header_len;

use crate::cluster::Cluster;
use crate::cost::{CostModel, Overlap};
use crate::thesis;
use crate::world::WireConfig;

/// One message of up to a page is one frame, as PM sends it (§2).
pub const MTU: u32 = 4096 + data_header_len(0) as u32;
/// Myrinet's link: 80 MB/s (§1.1).
pub const LINK_BPS: u64 = 640_000_000;
/// SBus DMA between host memory and the LANai's SRAM: 28.8 ns per byte
/// (34.7 MB/s). The paper gives no DMA rate; this one and
/// [`NIC_FRAME_NS`] are fitted to its two throughput figures (about
/// 32 MB/s at 4096 B, N½ about 300 B; see `docs/immediate-sending.md`).
pub const DMA_PS_PER_BYTE: u64 = 28_800;
/// The 5-MIPS LANai's work per frame sent or received.
pub const NIC_FRAME_NS: u64 = 6_000;
/// Host work to post a send or receive, and to take a completion
/// (SPARCstation 20/71 stores and loads over SBus).
pub const HOST_NS: u64 = 3_000;
/// One cut-through Myrinet switch.
pub const SWITCH_NS: u64 = 500;
/// Messages in PM's full send buffer (Table 2: 511, 12 KB).
pub const SEND_FULL: u32 = 511;
/// Messages in PM's full receive buffer (Table 2: 2730, 32 KB).
pub const RECV_FULL: u32 = 2730;
/// Payload of each message in the buffers (PM's 8-byte minimum).
pub const SMALL: usize = 8;
/// Ring slots of the Table 2 ports: room for [`SEND_FULL`] descriptors.
const RING_ENTRIES: u32 = 512;
/// Virtual time a context switch's setup may take.
const SETUP_LIMIT_NS: u64 = 60_000_000_000;

/// PM's machine: costs, wire and overlaps.
#[derive(Clone, Debug)]
pub struct Machine {
    /// NIC and host costs.
    pub cost: CostModel,
    /// Myrinet.
    pub wire: WireConfig,
    /// Immediate Sending and receive double buffering on or off; the
    /// LANai waits for its MAC ([`Overlap::nic_waits_for_mac`]).
    pub overlap: Overlap,
}

impl Machine {
    /// PM's parameters (see the constants), with `immediate_sending` and
    /// `rx_double_buffering` as given.
    pub fn pm(immediate_sending: bool, rx_double_buffering: bool) -> Machine {
        let cost = CostModel {
            nic_rx_frame_ns: NIC_FRAME_NS,
            nic_tx_frame_ns: NIC_FRAME_NS,
            nic_dma_ps_per_byte: DMA_PS_PER_BYTE,
            host_post_ns: HOST_NS,
            host_cqe_ns: HOST_NS,
            host_copy_ps_per_byte: 0,
        };
        let wire =
            WireConfig { latency_ns: SWITCH_NS, bandwidth_bps: LINK_BPS, min_frame_bytes: 0, ..WireConfig::default() };
        let overlap = Overlap { immediate_sending, rx_double_buffering, nic_waits_for_mac: true, ..Overlap::OFF };
        Machine { cost, wire, overlap }
    }

    fn config() -> Config {
        Config {
            // Nothing is lost: no retransmission of a frame that only waits.
            rto_ns: 50_000_000,
            matching: MatchMode::Unexpected,
            // Room for PM's full receive buffer as eager messages.
            unexp_slots: RECV_FULL,
            unexp_headers: RECV_FULL,
            ..Config::default()
        }
    }

    /// Two NICs of this machine (`ring_entries` slots per ring).
    fn cluster(&self, ring_entries: u32) -> Cluster {
        // Immediate Sending is the NICs' feature (the control program then
        // sends from host memory) and the overlap the cost model charges.
        let features = if self.overlap.immediate_sending { FEATURE_IMMEDIATE_SENDING } else { 0 };
        let mut c = Cluster::with_rings(2, Machine::config(), features, MTU, self.wire.clone(), ring_entries);
        c.world.cost = self.cost;
        c.world.overlap = self.overlap;
        c
    }
}

/// One-way latency (µs) of `size`-byte messages: half the mean ping-pong.
pub fn latency(m: &Machine, size: u64, iters: u32) -> Result<f64, String> {
    thesis::latency_on(m.cluster(64), size, iters)
}

/// Sends a throughput sender keeps posted: PM's sender streams from a
/// send buffer of hundreds of messages, so the stream is never waiting for
/// an ACK to post the next.
pub const SENDS_OUTSTANDING: u64 = 16;

/// Throughput (MB/s, 10⁶ bytes) of `count` `size`-byte messages one way.
pub fn bandwidth(m: &Machine, size: u64, count: u64) -> Result<f64, String> {
    Ok(thesis::bandwidth_on(m.cluster(64), size, count, false, SENDS_OUTSTANDING)? / 8.0)
}

/// A buffer occupancy of Table 2.
#[derive(Clone, Copy, Debug)]
pub struct Condition {
    /// The paper's name for it.
    pub what: &'static str,
    /// Sends waiting in the port's send ring.
    pub sends: u32,
    /// Eager messages held for the port, no receive posted.
    pub recvs: u32,
    /// PM's save and restore times (ms).
    pub paper_save_ms: f64,
    /// Restore.
    pub paper_restore_ms: f64,
}

/// PM's Table 2.
pub const TABLE2: [Condition; 4] = [
    Condition { what: "no message", sends: 0, recvs: 0, paper_save_ms: 0.13, paper_restore_ms: 0.11 },
    Condition { what: "send buffer full", sends: SEND_FULL, recvs: 0, paper_save_ms: 1.88, paper_restore_ms: 1.40 },
    Condition { what: "receive buffer full", sends: 0, recvs: RECV_FULL, paper_save_ms: 3.39, paper_restore_ms: 1.95 },
    Condition {
        what: "send and receive full",
        sends: SEND_FULL,
        recvs: RECV_FULL,
        paper_save_ms: 5.15,
        paper_restore_ms: 3.22,
    },
];

/// One context switch measured.
#[derive(Clone, Copy, Debug)]
pub struct Switch {
    /// Bytes of the context image.
    pub image_bytes: u64,
    /// NIC time of `PortSave` (ms).
    pub save_ms: f64,
    /// NIC time of `PortRestore` (ms).
    pub restore_ms: f64,
}

/// Saves node 0's port with `sends` sends in its ring and `recvs` eager
/// messages held for it, restores it into another slot and resumes it;
/// the NIC time each takes under `m`'s costs. The setup runs at no cost;
/// after the resume every held message must still be there and every send
/// must complete.
pub fn context_switch(m: &Machine, sends: u32, recvs: u32) -> Result<Switch, String> {
    let mut c = m.cluster(RING_ENTRIES);
    if sends >= RING_ENTRIES {
        return Err(format!("{sends} sends: the ring holds {}", RING_ENTRIES - 1));
    }
    c.world.cost = CostModel::ZERO;
    let end = c.world.now + SETUP_LIMIT_NS;
    // The receive buffer: node 1 sends, node 0 has posted nothing.
    let mut pending: std::collections::HashSet<u64> =
        (0..recvs).map(|i| c.send(1, 0, i as u64, &[i as u8; SMALL])).collect();
    while !pending.is_empty() {
        c.step().ok_or("went idle while filling the receive buffer")?;
        for (cqe, _) in c.take_ready(1) {
            pending.remove(&cqe.wr_id);
        }
        if c.world.now > end {
            return Err("the receive buffer did not fill in time".into());
        }
    }
    let held = c.world.nodes[0].nic.occupancy().unexp_entries;
    if held != recvs {
        return Err(format!("{held} messages held, {recvs} sent"));
    }
    // C1–C4, then the send buffer: sends posted to a suspended port stay in its ring.
    if c.suspend(0) != ar::OK {
        return Err("suspend refused".into());
    }
    while !c.is_stable(0) {
        c.run_for(100_000);
        if c.world.now > end {
            return Err("the port never became stable".into());
        }
    }
    let send_wrs: Vec<u64> = (0..sends).map(|i| c.send(0, 1, i as u64, &[i as u8; SMALL])).collect();
    c.world.cost = m.cost;
    let busy = |c: &Cluster| c.world.nodes[0].nic_busy_ns;
    let from = c.port_slot(0);
    let before = busy(&c);
    let ctx = c.save(0).map_err(|r| format!("save refused: {r}"))?;
    let saved = busy(&c) - before;
    // Into another slot, as a gang scheduler may.
    let slot = (0..4).find(|&s| s != from && !c.world.nodes[0].nic.port_is_open(s)).unwrap_or(from);
    let before = busy(&c);
    let r = c.restore(0, &ctx, slot);
    if r != ar::OK {
        return Err(format!("restore refused: {r}"));
    }
    let restored = busy(&c) - before;
    c.world.cost = CostModel::ZERO;
    // What was saved came back: the held messages and the queued sends.
    let held = c.world.nodes[0].nic.occupancy().unexp_entries;
    if held != recvs {
        return Err(format!("{held} messages held after the restore, {recvs} before"));
    }
    if c.resume(0) != ar::OK {
        return Err("resume refused".into());
    }
    let mut open: std::collections::HashSet<u64> = send_wrs.into_iter().collect();
    (0..sends).for_each(|i| {
        c.recv(1, (0, 0), i as u64, 0, SMALL as u64);
    });
    while !open.is_empty() {
        c.step().ok_or("went idle before the restored sends completed")?;
        for (cqe, _) in c.take_ready(0) {
            open.remove(&cqe.wr_id);
        }
        if c.world.now > end {
            return Err("the restored sends did not complete in time".into());
        }
    }
    let ms = |ns: u64| ns as f64 / 1e6;
    Ok(Switch { image_bytes: ctx.len, save_ms: ms(saved), restore_ms: ms(restored) })
}

/// Table 2: every [`TABLE2`] condition switched once. Receive double
/// buffering, if `m` has it, is off for these: the NIC's clock then
/// counts every byte the switch moves, as PM's host did.
pub fn table2(m: &Machine) -> Result<Vec<(Condition, Switch)>, String> {
    let mut m = m.clone();
    m.overlap.rx_double_buffering = false;
    let m = &m;
    TABLE2.iter().map(|&t| context_switch(m, t.sends, t.recvs).map(|s| (t, s))).collect()
}

/// A figure the paper states in its text (its plots give no numbers).
#[derive(Clone, Copy, Debug)]
pub struct Stated {
    /// What.
    pub what: &'static str,
    /// The paper's value.
    pub paper: f64,
    /// Unit.
    pub unit: &'static str,
    /// Where.
    pub source: &'static str,
}

/// The paper's latency and throughput figures, in [`Figures::stated`]'s order.
pub const STATED: [Stated; 3] = [
    Stated { what: "latency, 8 B (IS)", paper: 24.0, unit: "µs", source: "§4.1, Fig. 6" },
    Stated { what: "throughput, 4096 B (IS+DB)", paper: 32.0, unit: "MB/s", source: "§4.2, Fig. 7" },
    Stated { what: "N½ (IS+DB)", paper: 300.0, unit: "B", source: "§5" },
];

/// Sizes of the curves: PM's, 8 to 4096 B.
pub fn sizes() -> Vec<u64> {
    let mut s: Vec<u64> = (3..=12).map(|p| 1u64 << p).collect();
    s.extend([48, 96, 192, 300, 384, 768, 1536, 3072]);
    s.sort_unstable();
    s
}

/// The message size at which `curve` first reaches half its largest
/// value (linear between points): N½.
pub fn n_half(curve: &[(u64, f64)]) -> Option<f64> {
    let max = curve.iter().map(|p| p.1).fold(0.0, f64::max);
    let half = max / 2.0;
    let mut prev: Option<(u64, f64)> = None;
    for &(s, v) in curve {
        if v >= half {
            return Some(match prev {
                Some((s0, v0)) if v > v0 => s0 as f64 + (half - v0) / (v - v0) * (s - s0) as f64,
                _ => s as f64,
            });
        }
        prev = Some((s, v));
    }
    None
}

/// Fig. 6's and Fig. 7's curves, and [`STATED`] with ours.
#[derive(Clone, Debug)]
pub struct Figures {
    /// Latency (µs) with and without Immediate Sending.
    pub latency: Vec<thesis::Curve>,
    /// Throughput (MB/s): IS + DB, IS only, neither.
    pub throughput: Vec<thesis::Curve>,
    /// Ours for each [`STATED`] figure.
    pub stated: [f64; 3],
}

/// Runs Figs. 6 and 7 over [`sizes`]: `iters` ping-pongs per latency,
/// `msgs` messages per throughput.
pub fn figures(iters: u32, msgs: u64) -> Result<Figures, String> {
    let sizes = sizes();
    let curve = |name, f: &dyn Fn(u64) -> Result<f64, String>| -> Result<thesis::Curve, String> {
        Ok((name, sizes.iter().map(|&s| f(s).map(|v| (s, v))).collect::<Result<Vec<_>, _>>()?))
    };
    let (on, only, off) = (Machine::pm(true, true), Machine::pm(true, false), Machine::pm(false, false));
    let latency = vec![
        curve("with Immediate Sending", &|s| self::latency(&on, s, iters))?,
        curve("without Immediate Sending", &|s| self::latency(&off, s, iters))?,
    ];
    let throughput = vec![
        curve("Immediate Sending + receive double buffering", &|s| bandwidth(&on, s, msgs))?,
        curve("Immediate Sending only", &|s| bandwidth(&only, s, msgs))?,
        curve("neither", &|s| bandwidth(&off, s, msgs))?,
    ];
    let at = |c: &thesis::Curve, size| c.1.iter().find(|p| p.0 == size).map_or(f64::NAN, |p| p.1);
    let stated = [at(&latency[0], 8), at(&throughput[0], 4096), n_half(&throughput[0].1).unwrap_or(f64::NAN)];
    Ok(Figures { latency, throughput, stated })
}

/// Draws Table 2 into `path`: save and restore time (ms, log scale) per
/// condition, PM's and ours.
pub fn plot_table2(path: &std::path::Path, rows: &[(Condition, Switch)]) -> Result<(), String> {
    use plotters::prelude::*;
    let e = |e: DrawingAreaErrorKind<_>| format!("{}: {e}", path.display());
    type Value = fn(&(Condition, Switch)) -> f64;
    let series: [(&str, RGBColor, Value); 4] = [
        ("PM save", RGBColor(200, 30, 30), |r| r.0.paper_save_ms),
        ("PM restore", RGBColor(230, 140, 0), |r| r.0.paper_restore_ms),
        ("ours save", RGBColor(30, 60, 200), |r| r.1.save_ms),
        ("ours restore", RGBColor(30, 150, 60), |r| r.1.restore_ms),
    ];
    let all = rows.iter().flat_map(|r| series.iter().map(move |s| (s.2)(r)));
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if rows.is_empty() || lo <= 0.0 {
        return Err(format!("{}: nothing to draw", path.display()));
    }
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(e)?;
    let names: Vec<&str> = rows.iter().map(|r| r.0.what).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption("PM Table 2: context switch time against buffer occupancy", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..rows.len() as f64 - 0.5, (lo / 2.0..hi * 2.0).log_scale())
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_labels(rows.len())
        .x_label_formatter(&|x| names.get(x.round() as usize).map_or(String::new(), |n| n.to_string()))
        .y_desc("ms")
        .draw()
        .map_err(e)?;
    for (name, color, value) in series {
        let pts: Vec<(f64, f64)> = rows.iter().enumerate().map(|(i, r)| (i as f64, value(r))).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled()))).map_err(e)?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_half_interpolates() {
        let c = [(8, 1.0), (100, 4.0), (200, 6.0), (400, 8.0)];
        let n = n_half(&c).unwrap();
        assert!((n - 100.0).abs() < 1e-9, "{n}");
        assert_eq!(n_half(&[]), None);
    }
}
