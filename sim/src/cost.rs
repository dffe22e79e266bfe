//! What work costs in virtual time (design step 11,
//! `docs/design/collectives.md`).
//!
//! Without a cost model the NICs and hosts of the simulator are infinitely
//! fast: a handler runs in zero time and a host posts and reaps for free, so
//! the only costs are the wire's latency and bandwidth. A [`CostModel`] adds
//! the two things the papers' speedups come from:
//!
//! - **The NIC is a slow processor.** Each NIC has a busy-until time. A
//!   frame, doorbell or timer that arrives while it is busy waits (in
//!   arrival order). A handler run costs `nic_rx_frame_ns` for the frame it
//!   was given, `nic_tx_frame_ns` per frame it transmits and
//!   `nic_dma_ps_per_byte` per byte it moves to or from host memory, in the
//!   order the control program does them; each frame leaves when the work
//!   before it (its own DMA and transmit cost included) is done, and the
//!   host sees what the run wrote to its memory (data, completions) when
//!   the run's last write is done.
//! - **Host work costs host time** (the scripted host driver,
//!   [`crate::cluster::Cluster`]): `host_post_ns` per descriptor posted,
//!   `host_copy_ps_per_byte` per byte of a send it posts (see below),
//!   `host_cqe_ns` per completion reaped. A host does one thing at a time;
//!   a descriptor reaches the NIC when the host finished writing it, and a
//!   completion is acted on when the host finished reaping it.
//!
//! [`CostModel::ZERO`] is the simulator's behaviour without a model (the
//! default): every existing test and swarm seed runs bit for bit as before.
//!
//! # The `paper` parameter set
//!
//! [`CostModel::PAPER`] maps the fits of seed 000 §2 (FM 2.1 on a 300 MHz
//! Pentium II with a 33 MHz LANai 4.3; m = packet bytes) onto host, NIC and
//! wire. Together with [`PAPER_WIRE_LATENCY_NS`], [`PAPER_WIRE_BPS`] and
//! [`PAPER_MTU`]:
//!
//! | fit | part | goes to |
//! |---|---|---|
//! | `t_Send` = 2.7863 µs + 0.0301 µs·m | 2.7863 µs | `host_post_ns` 1.786 µs + the world's 1 µs doorbell delay (host writes the descriptor, the NIC notices) |
//! | | 0.0301 µs/B | `host_copy_ps_per_byte` 30,100: FM's host moves every byte it sends to the NIC itself (31.7 MB/s programmed I/O), so a host pays it for each send it posts, once per destination; a NIC that forwards does not |
//! | `t_Xmit` = 1.3958 µs + 0.0075 µs·m | 1.3958 µs | `nic_tx_frame_ns` 1,396 |
//! | | 0.0075 µs/B | the wire: 133 MB/s ([`PAPER_WIRE_BPS`]) |
//! | `t_Recv` = 4.2820 µs + 0.0230 µs·m | 4.2820 µs | wire latency 0.5 µs (one Myrinet switch, assumed) + `nic_rx_frame_ns` 1,396 (assumed equal to the transmit cost) + the completion's 32 B DMA 0.5 µs + `host_cqe_ns` 1,890 |
//! | | 0.0230 µs/B | the last copy's wire time 0.0075 + `nic_dma_ps_per_byte` 15,500 (64.5 MB/s NIC↔host DMA) |
//!
//! FM packets are 1,536 B: [`PAPER_MTU`] = 1,536 + the 32 B frame header.
//!
//! One deliberate difference: EMP's NIC reads a send's payload from host
//! memory by DMA, where FM's host had already written it into NIC memory,
//! so a send pays `t_Send`'s bytes twice (host copy and NIC DMA). That is
//! the firmware's real work, and it costs the NIC-offloaded variants more
//! than the host ones (a broadcasting root or multisending NIC reads each
//! frame once for all destinations; a forwarding NIC sends frames as they
//! arrived, without reading them back). With these numbers the simulator gives seed 000's worked example
//! (one 1,536 B packet to 6 destinations; model 153.2 µs multisend, 333.7 µs
//! unicast) as about 175 and 355 µs.

use emp_firmware::CpuStep;

/// Per-node NIC and host costs (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CostModel {
    /// NIC time to take in one received frame (before the handler's work).
    pub nic_rx_frame_ns: u64,
    /// NIC time per frame it transmits.
    pub nic_tx_frame_ns: u64,
    /// NIC time per byte of DMA between host memory and the NIC (either way).
    pub nic_dma_ps_per_byte: u64,
    /// Host time to write one descriptor into a ring.
    pub host_post_ns: u64,
    /// Host time to reap and act on one completion.
    pub host_cqe_ns: u64,
    /// Host time per byte of a send it posts.
    pub host_copy_ps_per_byte: u64,
}

/// Wire latency of the `paper` parameter set (one switch).
pub const PAPER_WIRE_LATENCY_NS: u64 = 500;
/// Link rate of the `paper` parameter set: 0.0075 µs per byte.
pub const PAPER_WIRE_BPS: u64 = 1_066_666_666;
/// MTU of the `paper` parameter set: a 1,536 B FM packet plus the frame header.
pub const PAPER_MTU: u32 = 1536 + emp_uapi::wire::data_header_len(1) as u32;

/// Largest fixed cost accepted (1 s).
const NS_MAX: u64 = 1_000_000_000;
/// Largest per-byte cost accepted (1 µs per byte).
const PS_PER_BYTE_MAX: u64 = 1_000_000;

impl CostModel {
    /// Work is free (the simulator without a cost model).
    pub const ZERO: CostModel = CostModel {
        nic_rx_frame_ns: 0,
        nic_tx_frame_ns: 0,
        nic_dma_ps_per_byte: 0,
        host_post_ns: 0,
        host_cqe_ns: 0,
        host_copy_ps_per_byte: 0,
    };

    /// Seed 000 §2's FM/LANai 4.3 fits (see the module documentation).
    pub const PAPER: CostModel = CostModel {
        nic_rx_frame_ns: 1_396,
        nic_tx_frame_ns: 1_396,
        nic_dma_ps_per_byte: 15_500,
        host_post_ns: 1_786,
        host_cqe_ns: 1_890,
        host_copy_ps_per_byte: 30_100,
    };

    /// True when nothing costs time.
    pub fn is_zero(&self) -> bool {
        *self == CostModel::ZERO
    }

    /// Why the model is out of bounds, if it is.
    pub fn invalid(&self) -> Option<&'static str> {
        let fixed = [self.nic_rx_frame_ns, self.nic_tx_frame_ns, self.host_post_ns, self.host_cqe_ns];
        if fixed.iter().any(|&v| v > NS_MAX) {
            return Some("fixed costs must be at most 1 s");
        }
        if self.nic_dma_ps_per_byte > PS_PER_BYTE_MAX || self.host_copy_ps_per_byte > PS_PER_BYTE_MAX {
            return Some("per-byte costs must be at most 1 µs per byte");
        }
        None
    }

    /// Sets one field by name (`nic_rx_frame_ns=1400`); for the command line.
    pub fn set(&mut self, assignment: &str) -> Result<(), String> {
        let (key, value) = assignment.split_once('=').ok_or_else(|| format!("{assignment}: expected key=value"))?;
        let v: u64 = value.trim().parse().map_err(|e| format!("{assignment}: {e}"))?;
        let field = match key.trim() {
            "nic_rx_frame_ns" => &mut self.nic_rx_frame_ns,
            "nic_tx_frame_ns" => &mut self.nic_tx_frame_ns,
            "nic_dma_ps_per_byte" => &mut self.nic_dma_ps_per_byte,
            "host_post_ns" => &mut self.host_post_ns,
            "host_cqe_ns" => &mut self.host_cqe_ns,
            "host_copy_ps_per_byte" => &mut self.host_copy_ps_per_byte,
            k => return Err(format!("unknown cost {k:?}")),
        };
        *field = v;
        match self.invalid() {
            Some(why) => Err(why.into()),
            None => Ok(()),
        }
    }

    /// Host time (ns) to post a descriptor whose send carries `bytes`.
    pub fn post_ns(&self, bytes: u64) -> u64 {
        self.host_post_ns + (bytes * self.host_copy_ps_per_byte).div_ceil(1000)
    }
}

/// PM's two overlaps of NIC work (seed 003 §3.2), for the [`CostModel`]
/// (not the per-CPU [`StepCosts`] model, whose DMA engines already run
/// beside the CPUs). Both off ([`Overlap::OFF`], the default): a frame's
/// payload DMA, its transmit cost and its time on the wire follow one
/// another, and a receiving NIC is busy while it DMAs a frame into host
/// memory, as before.
///
/// - **Immediate Sending**: the MAC starts a frame once the DMA has brought
///   in its first [`Overlap::chunk_bytes`], and the rest of the DMA runs
///   while the frame goes out (cut-through inside the NIC). The frame may
///   start up to the DMA time of its later chunks earlier, but its last
///   byte leaves no sooner than the wire time of one chunk after the DMA
///   is done: the link waits for a DMA slower than itself. A frame of one
///   chunk or less gains nothing.
/// - **Receive double buffering**: a received frame's DMA into host memory
///   runs on the NIC-to-host DMA engine while the NIC takes in the next
///   frame into its other buffer; a third frame waits until the first one's
///   DMA is done (two buffers). The host sees the data when the DMA is done.
///
/// [`Overlap::nic_waits_for_mac`] is not an overlap but the lack of one in
/// PM's LANai, which drives the MAC itself: with it, the NIC is busy until
/// every frame it sent has left, so without Immediate Sending a message's
/// DMA and its transmission follow one another and the next message waits
/// for both. EMP's NIC (off, the default) has a MAC of its own that sends
/// one frame while the NIC prepares the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// Immediate Sending (cut-through: DMA feeding the MAC in chunks).
    pub immediate_sending: bool,
    /// Receive double buffering.
    pub rx_double_buffering: bool,
    /// Bytes of one DMA chunk feeding the MAC.
    pub chunk_bytes: u64,
    /// The NIC is busy until every frame it sent has left (PM's LANai).
    pub nic_waits_for_mac: bool,
}

impl Default for Overlap {
    fn default() -> Self {
        Overlap::OFF
    }
}

impl Overlap {
    /// Neither overlap: everything serialized (the simulator's default).
    pub const OFF: Overlap =
        Overlap { immediate_sending: false, rx_double_buffering: false, chunk_bytes: 256, nic_waits_for_mac: false };
    /// Both overlaps, 256-byte chunks.
    pub const ON: Overlap =
        Overlap { immediate_sending: true, rx_double_buffering: true, chunk_bytes: 256, nic_waits_for_mac: false };

    /// How much earlier (ps) a frame whose payload DMA moved `dma_bytes`
    /// at `ps_per_byte` may start on the wire: the DMA of every chunk after
    /// the first (0 without Immediate Sending).
    pub fn early_start_ps(&self, dma_bytes: u64, ps_per_byte: u64) -> u64 {
        if !self.immediate_sending {
            return 0;
        }
        dma_bytes.saturating_sub(self.chunk_bytes.max(1)) * ps_per_byte
    }
}

/// Per-step NIC CPU costs charged on per-CPU timelines (the EMP thesis,
/// seed 004 ch. 3), with the NIC's DMA engines. When a world has one
/// ([`crate::world::World::cpu_costs`]), every NIC CPU has its own
/// busy-until time: each step the control program reports
/// ([`emp_firmware::Hal::cpu_step`]) costs its Table 3.1 time on the CPU it
/// runs on; a step queued for another CPU starts when that CPU is free and
/// the hand-off is done; an event waits for the CPU it arrives on (frames:
/// the classifying CPU; doorbells and timers: CPU A). DMA runs on the
/// engines (one host-to-NIC, one NIC-to-host), beside the CPUs: a frame
/// leaves when its step and its payload's DMA are done, and the host sees
/// data when its DMA is done. [`StepCosts::THESIS`] documents where each
/// number comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepCosts {
    /// Send bookkeeping, per frame.
    pub send_bookkeep_ns: u64,
    /// Transmission, per frame.
    pub transmission_ns: u64,
    /// Receive ack handled whole on one CPU.
    pub recv_ack_ns: u64,
    /// DSR: the receive CPU's part of receive ack.
    pub recv_ack_classify_ns: u64,
    /// DSR: the send CPU's part of receive ack.
    pub recv_ack_update_ns: u64,
    /// Receive bookkeeping (classify), per data frame.
    pub recv_bookkeep_ns: u64,
    /// Recv frame (record it, start its DMA), per data frame.
    pub recv_frame_ns: u64,
    /// Receiving, per data frame.
    pub receiving_ns: u64,
    /// Send ack, per ACK or NACK.
    pub send_ack_ns: u64,
    /// A hand-off to the other CPU through the common area, paid by the
    /// CPU that hands off (lock, write, event bit, unlock).
    pub handoff_ns: u64,
    /// DMA engine time per byte.
    pub dma_ps_per_byte: u64,
    /// Each DMA of a step beyond its first (a page boundary inside a
    /// frame): one more DMA descriptor.
    pub dma_extra_ns: u64,
}

impl StepCosts {
    /// The thesis' numbers (seed 004):
    ///
    /// | parameter | value | source |
    /// |---|---|---|
    /// | send bookkeep, transmission, recv ack | 5.25, 5.50, 5.75 µs | Table 3.1 |
    /// | recv bookkeep + recv frame | 6.25 + 4.25 µs | Table 3.2's split of Table 3.1's 10.50 |
    /// | receiving, send ack | 2.75, 2.50 µs | Table 3.1 |
    /// | DSR's recv ack split | 3.25 (receive CPU) + 2.50 (send CPU) µs | Table 3.2 |
    /// | DMA | 1.894 ns/B (64-bit 66 MHz PCI, 528 MB/s) | §2.1, §3.5.1 |
    /// | extra DMA | 1 µs | §2.2.3 "1–3 µs per DMA", the low end |
    /// | hand-off | 0.105 µs | derived, see below |
    ///
    /// The thesis gives no hand-off cost. The one figure that isolates it
    /// is SO's latency minus base's (24.52 − 24.31 µs): SO's one-way path
    /// differs from base's by exactly two hand-offs (the sender's frame to
    /// CPU B, the receiver's send ack to CPU B before its completion), so
    /// one is 0.105 µs — about 9 cycles of the 88 MHz CPU, what a lock,
    /// two common-area writes and an event bit take. Every other figure is
    /// then a prediction.
    pub const THESIS: StepCosts = StepCosts {
        send_bookkeep_ns: 5_250,
        transmission_ns: 5_500,
        recv_ack_ns: 5_750,
        recv_ack_classify_ns: 3_250,
        recv_ack_update_ns: 2_500,
        recv_bookkeep_ns: 6_250,
        recv_frame_ns: 4_250,
        receiving_ns: 2_750,
        send_ack_ns: 2_500,
        handoff_ns: 105,
        dma_ps_per_byte: 1_894,
        dma_extra_ns: 1_000,
    };

    /// CPU time of `step`.
    pub fn of(&self, step: CpuStep) -> u64 {
        match step {
            CpuStep::SendBookkeep => self.send_bookkeep_ns,
            CpuStep::Transmission => self.transmission_ns,
            CpuStep::RecvAck => self.recv_ack_ns,
            CpuStep::RecvAckClassify => self.recv_ack_classify_ns,
            CpuStep::RecvAckUpdate => self.recv_ack_update_ns,
            CpuStep::RecvBookkeep => self.recv_bookkeep_ns,
            CpuStep::RecvFrame => self.recv_frame_ns,
            CpuStep::Receiving => self.receiving_ns,
            CpuStep::SendAck => self.send_ack_ns,
            CpuStep::Complete => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_set_reproduces_the_fits_it_came_from() {
        let p = CostModel::PAPER;
        assert!(p.invalid().is_none());
        // t_Send at 1,536 B (seed 000 §2: 49.0199 µs) = post + copy + 1 µs doorbell.
        let t_send = p.post_ns(1536) + 1_000;
        assert!(t_send.abs_diff(49_020) <= 2, "{t_send}");
        // t_Recv's intercept: latency + NIC receive + CQE DMA + host reap.
        let intercept =
            PAPER_WIRE_LATENCY_NS + p.nic_rx_frame_ns + (32 * p.nic_dma_ps_per_byte).div_ceil(1000) + p.host_cqe_ns;
        assert!(intercept.abs_diff(4_282) <= 2, "{intercept}");
        // t_Recv's slope: wire + DMA (ps per byte).
        let wire_ps = 8_000_000_000_000 / PAPER_WIRE_BPS;
        assert_eq!(wire_ps + p.nic_dma_ps_per_byte, 23_000);
    }

    #[test]
    fn immediate_sending_overlaps_all_but_the_first_chunk() {
        let on = Overlap { chunk_bytes: 256, ..Overlap::ON };
        assert_eq!(on.early_start_ps(100, 10), 0, "one chunk: nothing to overlap");
        assert_eq!(on.early_start_ps(256, 10), 0);
        assert_eq!(on.early_start_ps(4096, 10), (4096 - 256) * 10);
        assert_eq!(Overlap::OFF.early_start_ps(4096, 10), 0);
    }

    #[test]
    fn set_by_name_and_bounds() {
        let mut c = CostModel::ZERO;
        assert!(c.is_zero());
        c.set("host_cqe_ns=5").unwrap();
        assert_eq!(c.host_cqe_ns, 5);
        assert!(c.set("nope=1").is_err());
        assert!(c.set("host_cqe_ns").is_err());
        assert!(c.set("nic_dma_ps_per_byte=2000000").is_err());
    }
}
