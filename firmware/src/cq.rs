//! Completion queues as their producer keeps them: the one structure both
//! sides of the program write (a send completes on the send side, a
//! receive on the receive side), so under DSR it is what takes the
//! semaphore (docs/nic-cpus.md). A CQE is written in place in host memory
//! through the MR cache the completing side is lent; the host learns of it by its
//! phase byte, and of the producer index by `CQ_PROD`.

use emp_uapi::desc::{Cqe, Opcode, Status, CQE_FLAGS_OFFSET, CQE_IMM, MR_LOCAL_WRITE};
use emp_uapi::ring;
use emp_uapi::sram::{counter, ctl, Layout};
use emp_uapi::Le;

use crate::counters::Counters;
use crate::mr::{Buf, MrCache, MrChecked};
use crate::{sram_put_u32, sram_u32, Hal, LocalDesc, Port};

/// What a completion reports.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Completion {
    pub wr_id: u64,
    pub opcode: Opcode,
    pub status: Status,
    pub byte_len: u32,
    pub signaled: bool,
    pub tag: u64,
    pub src_node: u16,
    pub src_port: u16,
    pub msg_len: u32,
    /// A receive's or probe's immediate data (the sender's `WD_IMM`).
    pub imm: Option<u32>,
}

impl Completion {
    pub(crate) fn of(d: &LocalDesc, opcode: Opcode, status: Status) -> Completion {
        Completion {
            wr_id: d.wd.wr_id,
            opcode,
            status,
            byte_len: 0,
            signaled: d.signaled,
            tag: 0,
            src_node: 0,
            src_port: 0,
            msg_len: 0,
            imm: None,
        }
    }

    /// A refused descriptor, reported as `op` whether or not it asked for
    /// a completion.
    pub(crate) fn bad_descriptor(d: &LocalDesc, op: Opcode) -> Completion {
        Completion { signaled: true, ..Completion::of(d, op, Status::BadDescriptor) }
    }
}

/// A port's CQ as its producer keeps it.
#[derive(Debug, Default)]
pub(crate) struct PortCq {
    pub prod: u32,
    /// Descriptors consumed and not yet completed (CQ space is reserved for them).
    pub outstanding: u32,
    /// A completion was written this call: the ARM word is read once, as
    /// the call ends (`Nic::publish`).
    pub written: bool,
}

/// Every port's CQ producer, and the ports written to this call.
#[derive(Debug)]
pub(crate) struct Cqs {
    pub(crate) ports: Vec<PortCq>,
    /// Ports whose CQ got an entry this call, each once (`PortCq::written`;
    /// bounded by the ports).
    pub(crate) written: Vec<u16>,
}

/// The side completing a descriptor: the CPU it runs on, what it reads of
/// the ports, the MR cache it is lent, and its own counters.
pub(crate) struct Completer<'a> {
    pub layout: &'a Layout,
    pub ports: &'a [Port],
    pub cpu: u8,
    pub mr: &'a mut MrCache,
    pub counters: &'a Counters,
}

impl Cqs {
    pub(crate) fn new(ports: u16) -> Cqs {
        Cqs { ports: (0..ports).map(|_| PortCq::default()).collect(), written: Vec::with_capacity(ports as usize) }
    }

    /// Room in `port`'s CQ for one more consumed descriptor. `seen` is the
    /// host's consumer index as last read in this pass over the rings: the
    /// host only moves it forward, so room it shows is there, and the
    /// index is read again only when it shows none.
    pub(crate) fn has_room<H: Hal>(
        &self,
        hal: &mut H,
        layout: &Layout,
        ports: &[Port],
        port: u16,
        seen: &mut Option<u32>,
    ) -> bool {
        let (cq, entries) = (&self.ports[port as usize], ports[port as usize].cq_entries);
        // A host that wrote a consumer index ahead of the producer gets no room.
        let room =
            |cons| ring::plausible(cq.prod, cons, entries) && ring::used(cq.prod, cons) + cq.outstanding < entries;
        if seen.is_some_and(room) {
            return true;
        }
        let cons = sram_u32(hal, layout.port(port).ctl(ctl::CQ_CONS));
        *seen = Some(cons);
        room(cons)
    }

    /// Reports a finished descriptor: writes a CQE unless it is an
    /// unsignaled success, and releases its CQ reservation.
    pub(crate) fn complete<H: Hal>(&mut self, hal: &mut H, by: Completer<'_>, port: u16, c: Completion) {
        let Some(cqe) = self.next_cqe(hal, by.cpu, by.ports, by.counters, port, c) else { return };
        let Some(cq) = self.next_slot(hal, by.layout, by.ports, by.mr, port) else {
            return cq_overrun(hal, by.layout, port);
        };
        let at = cq.off;
        let ok = publish_cqe(hal, &cqe, |hal, off, bytes| {
            by.mr.checked_io(hal, cq.checked, at + off as u64, Buf::ToHost(bytes)).is_ok()
        });
        if !ok {
            return cq_overrun(hal, by.layout, port);
        }
        self.advance(hal, by.layout, port);
        let pcq = &mut self.ports[port as usize];
        if !pcq.written {
            pcq.written = true;
            self.written.push(port);
        }
    }

    /// `port`'s CQ's next slot, checked for writing through `mr`: `None`
    /// when the host unmapped its CQ.
    pub(crate) fn next_slot<H: Hal>(
        &self,
        hal: &mut H,
        layout: &Layout,
        ports: &[Port],
        mr: &MrCache,
        port: u16,
    ) -> Option<CqSlot> {
        let st = &ports[port as usize];
        let off = st.cq_offset + ring::slot(self.ports[port as usize].prod, st.cq_entries) as u64 * Cqe::SIZE as u64;
        let checked = mr.checked(hal, layout, port, st.cq_key, off, Cqe::SIZE as u64, MR_LOCAL_WRITE).ok()?;
        Some(CqSlot { checked, off })
    }

    /// Releases a finished descriptor's CQ reservation and builds its CQE
    /// for the CQ's next slot, or `None` when none is written (an
    /// unsignaled success).
    pub(crate) fn next_cqe<H: Hal>(
        &mut self,
        hal: &mut H,
        cpu: u8,
        ports: &[Port],
        counters: &Counters,
        port: u16,
        c: Completion,
    ) -> Option<Cqe> {
        hal.cpu_step(cpu, crate::CpuStep::Complete, false);
        let cq = &mut self.ports[port as usize];
        debug_assert!(cq.outstanding > 0, "completion without a consumed descriptor");
        cq.outstanding = cq.outstanding.saturating_sub(1);
        if c.status != Status::Success {
            counters.add(counter::MSGS_FAILED, 1);
        }
        if !c.signaled && c.status == Status::Success {
            return None;
        }
        let (entries, prod) = (ports[port as usize].cq_entries, cq.prod);
        Some(Cqe {
            wr_id: c.wr_id,
            tag: c.tag,
            byte_len: c.byte_len,
            msg_len: c.msg_len,
            imm: c.imm.unwrap_or(0),
            reserved1: 0,
            src_node: c.src_node,
            src_port: c.src_port,
            status: c.status as u8,
            opcode: c.opcode as u8,
            reserved: 0,
            flags: ring::cqe_phase(prod, entries) | if c.imm.is_some() { CQE_IMM } else { 0 },
        })
    }

    /// The CQ's next slot is written: it is the host's.
    pub(crate) fn advance<H: Hal>(&mut self, hal: &mut H, layout: &Layout, port: u16) {
        let cq = &mut self.ports[port as usize];
        cq.prod = cq.prod.wrapping_add(1);
        sram_put_u32(hal, layout.port(port).ctl(ctl::CQ_PROD), cq.prod);
    }
}

/// A CQ's next slot, checked for writing: at offset `off` of the CQ's region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CqSlot {
    pub checked: MrChecked,
    pub off: u64,
}

/// A CQE could not be written (the host unmapped its CQ): counted where
/// the host sees it.
pub(crate) fn cq_overrun<H: Hal>(hal: &mut H, layout: &Layout, port: u16) {
    let at = layout.port(port).ctl(ctl::CQ_OVERRUNS);
    let o = sram_u32(hal, at);
    sram_put_u32(hal, at, o.wrapping_add(1));
}

/// Writes `cqe` through `write(hal, offset in the entry, bytes)`: the body,
/// a fence, then the phase byte (the entry's last) on its own. A host that
/// sees the new phase sees the whole entry, and the fence also puts the
/// payload the completion reports ahead of it. Whether both writes were done.
pub(crate) fn publish_cqe<H: Hal>(hal: &mut H, cqe: &Cqe, mut write: impl FnMut(&mut H, usize, &[u8]) -> bool) -> bool {
    let mut b = [0u8; Cqe::SIZE];
    cqe.put(&mut b);
    let (body, phase) = b.split_at(CQE_FLAGS_OFFSET);
    write(hal, 0, body) && {
        hal.dma_fence();
        write(hal, CQE_FLAGS_OFFSET, phase)
    }
}
