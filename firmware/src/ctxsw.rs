//! Port context switch (PM, seed 003 §3.4; `docs/context-switch.md`): a
//! port's whole NIC state leaves the NIC as a context image in host memory
//! and comes back, possibly into another slot, without losing, duplicating
//! or mixing a message.
//!
//! - C1 `PortSuspend`: the port consumes no descriptor and starts no
//!   message; a message the receiver has started taking runs to its end,
//!   ACKs and NACKs go on; new messages for the port are refused (NACK
//!   `NoMatch`: the sender retries, nothing is lost).
//! - C2–C4 `PortStable`: nothing of the port's own is in flight or being
//!   received ([`Nic::port_unstable`] says what is left).
//! - C6 `PortSave`: the image is written into a region of the port and the
//!   slot is freed; its wire address stays *parked*: frames for it are
//!   refused as not ready, so peers retry rather than fail.
//! - C7 `PortRestore`: into any free slot; the context keeps its wire
//!   address and generation, so peers reach it unchanged.
//! - C8 `PortResume`.
//!
//! Identity: peers address a port by (node, wire address, generation).
//! The address is the slot number unless the port was opened with an
//! explicit one or restored elsewhere; `receive_frame` resolves it to the
//! slot ([`Nic::slot_for_frame`]), every frame sent carries it.
//!
//! The image is untrusted on restore (it sat in the job's memory): every
//! field is checked before anything changes, and the trusted side names the
//! parked identity it expects. Layout (little endian): a [`HEADER`]-byte
//! header, then the send and receive rings' unconsumed descriptors, each
//! ring's slots past its producer index that hold anything (raw: a stopped
//! host may have written a descriptor there, or part of one, and not yet
//! published it; [`UNPUBLISHED_IMAGE`] bytes each), the posted receives, the peers ([`PEER_IMAGE`] bytes each, written and read
//! by `put_peer`/`get_peer` alone), the groups and collective operations
//! (barriers, reductions) in progress, the queued messages (sends, and the
//! collectives' own messages), the eager unexpected messages with their
//! payload, the persistent descriptors ([`STORED_IMAGE`] bytes each), the
//! groups' reliable-broadcast states (`rbcast/image.rs`).

use std::collections::VecDeque;

use emp_uapi::coll::{CollHeader, CollKind};
use emp_uapi::desc::{Opcode, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_uapi::ring;
use emp_uapi::sram::{admin_result, ctl, port_state, CTX_IMAGE_MAX, PORT_ADDR_EXPLICIT};
use emp_uapi::wire::{self, Frame, FrameHeader, NackReason};
use emp_uapi::{seq_lt, Le};

use crate::atomic::{AtomicRx, ATOMIC_RX_IMAGE};
use crate::coll::{CollData, CollOp, CollState, CollTx, Params};
use crate::group::GroupState;
use crate::image::Reader;
use crate::mr::Buf;
use crate::timer::SendTimer;
use crate::{sram_put_u32, sram_u32, FlowControl, Hal, LocalDesc, MatchMode, Nic, Peer, PeerRecv, PeerSend};

/// A saved context as the NIC remembers it: its identity, and per sender
/// the next message it expected, so that a sender whose last ACK was lost
/// before the save is answered (ACK) instead of refused forever.
#[derive(Debug)]
pub(crate) struct Parked {
    pub addr: u16,
    pub gen: u16,
    /// (node, port, next expected message) per peer. A message whose
    /// header the context retained (rendezvous) is below it too: its
    /// sender's keepalive is ACKed like a finished message's, and that is
    /// safe, as a held send completes only by its pull (`tx.rs`).
    pub expected: Vec<(u16, u16, u32)>,
}

/// Saved contexts whose addresses a NIC keeps parked at once.
pub(crate) const PARKED_MAX: usize = 64;
/// "ECTX".
pub const IMAGE_MAGIC: u32 = 0x5854_4345;
/// Image format version; a restore refuses any other.
/// 4: the persistent descriptors; 5: reliable-broadcast state; 6: the
/// rings' unpublished slots.
pub const IMAGE_VERSION: u16 = 6;
/// Bytes of the image header.
pub const HEADER: usize = 80;
/// Byte offset of the checksum in the header.
const CHECKSUM_AT: usize = 12;
/// Bytes of one peer record.
pub const PEER_IMAGE: usize = 52 + ATOMIC_RX_IMAGE;
/// Bytes of one unpublished ring slot: its distance from the producer
/// index, two zero bytes, the slot's bytes as the host left them.
pub const UNPUBLISHED_IMAGE: usize = 4 + WorkDesc::SIZE;
/// Bytes of one queued send besides its descriptor: peer index, kind, sequence.
const TX_IMAGE: usize = 8 + WorkDesc::SIZE;
/// Bytes of a queued collective message besides its data: peer index, kind,
/// sequence, op index, data length, its collective header.
const COLL_TX_IMAGE: usize = 12 + CollHeader::SIZE;
/// Bytes of one persistent descriptor: ring (0 receive, 1 send), slot,
/// two zero bytes, the descriptor.
pub const STORED_IMAGE: usize = 4 + WorkDesc::SIZE;
/// Queued message kinds.
const TX_SEND: u16 = 0;
const TX_COLL: u16 = 1;
/// A send whose header its receiver retained (rendezvous): it waits for
/// the receiver's pull.
const TX_HELD: u16 = 2;
/// A queued collective message whose op already completed (a barrier's last).
const NO_OP: u16 = u16::MAX;
/// Bytes of one group record: table slot, id, epoch, rank, members, span,
/// next instance, checksum of the member list.
const GROUP_IMAGE: usize = 28;
/// Bytes of an op record besides its descriptor and state.
const OP_IMAGE: usize = 12;
/// Op record kinds and flags.
const OP_BARRIER: u8 = 1;
const OP_REDUCE: u8 = 2;
const OPF_POSTED: u8 = 1;
const OPF_LOCAL_DONE: u8 = 2;
const OPF_ERROR: u8 = 4;
/// Bytes of one eager unexpected entry besides its payload: source, length,
/// flags, tag, immediate data, reserved.
const UNEXP_IMAGE: usize = 24;
/// An eager entry's flag: the sender's immediate data is carried.
const UNEXP_HAS_IMM: u16 = 1;
/// A retained header (rendezvous): no payload; its message's length and
/// sequence number follow ([`RETAINED_IMAGE`] bytes), its data is pulled
/// from the sender when a receive matches.
const UNEXP_RETAINED: u16 = 2;
/// Bytes after a retained entry's fixed part: total length, sequence, zero.
const RETAINED_IMAGE: usize = 16;

/// FNV-1a over `b`, the checksum field counted as zero.
pub fn image_checksum(b: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for (i, &x) in b.iter().enumerate() {
        let x = if (CHECKSUM_AT..CHECKSUM_AT + 4).contains(&i) { 0 } else { x };
        h = (h ^ x as u32).wrapping_mul(0x0100_0193);
    }
    h
}

/// FNV-1a over a group's member list: a restore finds the very group the
/// context was saved with in the trusted side's table.
fn members_checksum(g: &GroupState) -> u32 {
    g.members.iter().flat_map(|m| m.to_le_bytes()).fold(0x811c_9dc5u32, |h, x| (h ^ x as u32).wrapping_mul(0x0100_0193))
}

/// A ring's unpublished slots in an image: at most `free` (the ring's
/// slots past its producer index), each at a distinct distance below
/// `free`, in increasing order.
fn read_unpublished(r: &mut Reader<'_>, free: u32) -> Result<Vec<(u32, [u8; WorkDesc::SIZE])>, &'static str> {
    let n = r.u16()? as u32;
    if n > free {
        return Err("unpublished ring slots");
    }
    let mut out: Vec<(u32, [u8; WorkDesc::SIZE])> = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let (at, pad) = (r.u16()? as u32, r.u16()?);
        if pad != 0 || at >= free || out.last().is_some_and(|&(last, _)| at <= last) {
            return Err("unpublished ring slot");
        }
        out.push((at, r.take(WorkDesc::SIZE)?.try_into().expect("a descriptor's bytes")));
    }
    Ok(out)
}

/// Peer record flags.
mod pf {
    pub const RX_GEN: u16 = 1;
    pub const RNR: u16 = 2;
    pub const RNR_COLL: u16 = 4;
    pub const RX_TAKEN: u16 = 8;
    pub const NOT_TO_SEND: u16 = 16;
    pub const ATOMIC_RX: u16 = 32;
    /// The receiver told this sender to stop and owes it an update.
    pub const FC_STOP_SENT: u16 = 64;
    pub const ALL: u16 = 127;
}

/// An image's persistent descriptors: each a valid send (send ring) or
/// receive (receive ring) as stored, in a slot of its own. Their memory is
/// checked when they start, as a stored descriptor's always is.
fn check_stored(r: &mut Reader, n: usize) -> Result<Vec<(bool, u8, WorkDesc)>, Refusal> {
    use emp_uapi::desc::{PERSIST_SLOTS, WD_CLAIM, WD_PERSIST};
    if n > 2 * PERSIST_SLOTS {
        return Err("persistent descriptors".into());
    }
    let mut out: Vec<(bool, u8, WorkDesc)> = Vec::with_capacity(n);
    for _ in 0..n {
        let (ring, slot, pad) = (r.u8()?, r.u8()?, r.u16()?);
        let d = r.desc()?;
        let send = match ring {
            0 => false,
            1 => true,
            _ => return Err("persistent descriptor's ring".into()),
        };
        let own = if send { Opcode::Send } else { Opcode::Recv };
        if pad != 0
            || slot as usize >= PERSIST_SLOTS
            || out.iter().any(|&(s, k, _)| (s, k) == (send, slot))
            || d.validate() != Ok(own)
            || d.flags & (WD_PERSIST | WD_CLAIM) != 0
        {
            return Err("persistent descriptor".into());
        }
        out.push((send, slot, d));
    }
    Ok(out)
}

fn put_desc(out: &mut Vec<u8>, d: &WorkDesc) {
    let mut b = [0u8; WorkDesc::SIZE];
    d.put(&mut b);
    out.extend_from_slice(&b);
}

/// A peer as a context image holds it: everything of a stable peer entry
/// that outlives the switch (sequence and flow-control state, the refused-
/// message record, atomic responder state). New per-peer fields go here,
/// in `put_peer` and `get_peer`, and nowhere else.
struct PeerImage {
    node: u16,
    rport: u16,
    remote_gen: u16,
    rx_gen: Option<u16>,
    tx_seq_next: u32,
    credits: u32,
    not_to_send: Option<u32>,
    rx_expected: u32,
    max_seen: u32,
    rnr_seq: Option<u32>,
    rnr_coll: bool,
    rnr_tag: u64,
    rx_taken: bool,
    atomic_seq_next: u32,
    atomic_rx: Option<Box<AtomicRx>>,
    /// Flow-control level the receiver last gave (`wire::FC_*`).
    fc_level: u8,
    fc_stop_sent: bool,
}

fn put_peer(out: &mut Vec<u8>, p: &Peer, send: &PeerSend, recv: &PeerRecv) {
    let start = out.len();
    let mut flags = 0;
    for (on, f) in [
        (recv.rx_gen.is_some(), pf::RX_GEN),
        (recv.rnr_seq.is_some(), pf::RNR),
        (recv.rnr_coll, pf::RNR_COLL),
        (recv.rx_taken, pf::RX_TAKEN),
        (send.not_to_send.is_some(), pf::NOT_TO_SEND),
        (p.atomic.rx.is_some(), pf::ATOMIC_RX),
        (recv.fc_stop_sent, pf::FC_STOP_SENT),
    ] {
        if on {
            flags |= f;
        }
    }
    for v in [p.node, p.rport, send.remote_gen, flags, recv.rx_gen.unwrap_or(0), send.fc_level as u16] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [
        send.tx_seq_next,
        send.credits,
        send.not_to_send.unwrap_or(0),
        recv.rx_expected,
        recv.max_seen,
        recv.rnr_seq.unwrap_or(0),
        p.atomic.seq_next,
        0,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&recv.rnr_tag.to_le_bytes());
    match &p.atomic.rx {
        Some(rx) => rx.save(out),
        None => out.resize(out.len() + ATOMIC_RX_IMAGE, 0),
    }
    debug_assert_eq!(out.len() - start, PEER_IMAGE);
}

fn get_peer(r: &mut Reader, now: u64) -> Result<PeerImage, &'static str> {
    let (node, rport, remote_gen, flags, rx_gen, fc_level) =
        (r.u16()?, r.u16()?, r.u16()?, r.u16()?, r.u16()?, r.u16()?);
    if flags & !pf::ALL != 0 {
        return Err("peer record: unknown flags");
    }
    if fc_level > wire::FC_STOP as u16 {
        return Err("peer record: flow-control level");
    }
    let (tx_seq_next, credits, nts, rx_expected, max_seen, rnr_seq, atomic_seq_next, pad) =
        (r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    if pad != 0 {
        return Err("peer record: reserved bytes not zero");
    }
    let rnr_tag = r.u64()?;
    let atomic = r.take(ATOMIC_RX_IMAGE)?;
    let atomic_rx = if flags & pf::ATOMIC_RX != 0 {
        Some(AtomicRx::load(atomic, now)?)
    } else if atomic.iter().any(|&x| x != 0) {
        return Err("peer record: atomic state without its flag");
    } else {
        None
    };
    let on = |f: u16| flags & f != 0;
    Ok(PeerImage {
        node,
        rport,
        remote_gen,
        rx_gen: on(pf::RX_GEN).then_some(rx_gen),
        tx_seq_next,
        credits,
        not_to_send: on(pf::NOT_TO_SEND).then_some(nts),
        rx_expected,
        max_seen,
        rnr_seq: on(pf::RNR).then_some(rnr_seq),
        rnr_coll: on(pf::RNR_COLL),
        rnr_tag,
        rx_taken: on(pf::RX_TAKEN),
        atomic_seq_next,
        atomic_rx,
        fc_level: fc_level as u8,
        fc_stop_sent: on(pf::FC_STOP_SENT),
    })
}

/// A checked image, ready to apply.
struct Image {
    addr: u16,
    gen: u16,
    mode: MatchMode,
    cq_key: u32,
    cq_entries: u32,
    cq_offset: u64,
    cq_prod: u32,
    cq_cons: u32,
    send: (u32, u32),
    recv: (u32, u32),
    send_ring: Vec<WorkDesc>,
    recv_ring: Vec<WorkDesc>,
    /// Per ring (send, receive): the slots past the producer index the
    /// host had written, (distance from the producer index, bytes).
    unpublished: [Vec<(u32, [u8; WorkDesc::SIZE])>; 2],
    posted: Vec<LocalDesc>,
    peers: Vec<PeerImage>,
    /// (peer index, sequence, descriptor, collective side).
    /// (peer index, sequence, descriptor, a collective's message, held
    /// for its receiver's pull).
    tx: Vec<(usize, u32, LocalDesc, Option<CollImage>, bool)>,
    unexp: Vec<UnexpImage>,
    /// (table slot, group as loaded from the trusted side's table).
    groups: Vec<(u32, GroupState)>,
    /// (group index, op record: its state, instance, descriptor, outcome).
    ops: Vec<(usize, CollOp)>,
    /// Persistent descriptors: (send ring?, slot, descriptor).
    stored: Vec<(bool, u8, WorkDesc)>,
    /// (index into `groups`, its reliable-broadcast state).
    rbcast: Vec<(usize, crate::rbcast::RbImage)>,
}

/// A queued collective message of an image: its op (an index into the
/// image's ops, or [`NO_OP`]), header and NIC-held data.
type CollImage = (u16, CollHeader, Vec<u8>);

/// An unexpected message of an image: eager (its payload), or a retained
/// header (rendezvous: its length and sequence number; no payload).
struct UnexpImage {
    src: (u16, u16),
    tag: u64,
    imm: Option<u32>,
    data: Vec<u8>,
    retained: Option<(u64, u32)>,
}

/// Why a restore was refused.
enum Refusal {
    Bad(&'static str),
    NoRoom,
}

impl From<&'static str> for Refusal {
    fn from(s: &'static str) -> Self {
        Refusal::Bad(s)
    }
}

impl Nic {
    /// The slot holding wire address `addr`, for a received frame: the
    /// open port with that address; or a closed slot of that number no
    /// other port claims (its frames get the closed port's answers).
    pub(crate) fn slot_for_frame(&self, addr: u16) -> Option<u16> {
        let a = addr as usize;
        // The common case: the port under its own slot number.
        if a < self.ports.len() && self.ports[a].open && self.ports[a].addr == addr {
            return Some(addr);
        }
        if let Some(s) = self.ports.iter().position(|p| p.open && p.addr == addr) {
            return Some(s as u16);
        }
        (a < self.ports.len() && !self.addr_parked(addr)).then_some(addr)
    }

    fn addr_parked(&self, addr: u16) -> bool {
        self.parked.iter().any(|k| k.addr == addr)
    }

    /// Is `addr` held by an open port other than `slot`, or parked?
    pub(crate) fn addr_taken(&self, addr: u16, slot: u16) -> bool {
        self.addr_parked(addr)
            || self.ports.iter().enumerate().any(|(s, p)| p.open && p.addr == addr && s != slot as usize)
    }

    /// The address a port opens with (`PortOpen`'s `args[5]`), or `None`
    /// when it is malformed or taken.
    pub(crate) fn open_addr(&self, slot: u16, arg: u64) -> Option<u16> {
        let addr = match arg {
            0 => slot,
            a if a & !(PORT_ADDR_EXPLICIT | 0xFFFF) == 0 && a & PORT_ADDR_EXPLICIT != 0 => a as u16,
            _ => return None,
        };
        (!self.addr_taken(addr, slot)).then_some(addr)
    }

    /// A frame for an address no slot holds: a parked context's frames are
    /// refused as not ready (the sender retries until it is restored),
    /// except those of messages it had finished (their ACK was lost: ACKed
    /// again, as `on_old_data` does); any other address's as for a closed
    /// port.
    pub(crate) fn refuse_unaddressed<H: Hal>(&mut self, hal: &mut H, frame: &Frame) {
        let hdr = *frame.header();
        let parked = self.parked.iter().find(|k| k.addr == hdr.dst_port);
        let finished = parked.is_some_and(|k| {
            k.expected.iter().any(|&(n, p, e)| (n, p) == (hdr.src_node, hdr.src_port) && seq_lt(hdr.msg_seq, e))
        });
        let gen = parked.map_or(0, |k| k.gen);
        match frame {
            Frame::Data { .. } if finished => {
                self.count(emp_uapi::sram::counter::DUPLICATES, 1);
                self.send_unaddressed_reply(hal, &hdr, None, gen);
            }
            Frame::Data { .. } => {
                let reason = if gen != 0 { NackReason::NoMatch } else { NackReason::PortClosed };
                self.count(emp_uapi::sram::counter::DROPPED_UNEXPECTED, 1);
                self.send_unaddressed_reply(hal, &hdr, Some(reason), gen);
            }
            // An atomic request waits for its requester's timer; control
            // frames for a saved context have nobody to act on them.
            _ => self.count(emp_uapi::sram::counter::DROPPED_UNEXPECTED, 1),
        }
    }

    /// An ACK (`reason` `None`) or NACK for `data`, from a parked or unknown
    /// address (generation `gen`; 0 = unknown).
    pub(crate) fn send_unaddressed_reply<H: Hal>(
        &mut self,
        hal: &mut H,
        data: &FrameHeader,
        reason: Option<NackReason>,
        gen: u16,
    ) {
        use emp_uapi::wire::FrameKind;
        let gs = self.cfg.group_size;
        let hdr = FrameHeader {
            version: emp_uapi::wire::WIRE_VERSION,
            kind: if reason.is_some() { FrameKind::Nack } else { FrameKind::Ack } as u8,
            dst_gen: data.src_gen,
            src_node: self.node,
            dst_node: data.src_node,
            src_port: data.dst_port,
            dst_port: data.src_port,
            src_gen: gen,
            payload_len: 0,
            msg_seq: data.msg_seq,
            tx_floor: 0,
            frame_index: data.frame_index - data.frame_index % gs,
            frame_count: 0,
        };
        let body = emp_uapi::wire::AckBody {
            group: data.frame_index / gs,
            reason: reason.map_or(0, |r| r as u8),
            fc_level: 2,
            ..Default::default()
        };
        crate::cpu::put_control(hal, &hdr, &body);
        let c = if reason.is_some() { emp_uapi::sram::counter::NACKS_TX } else { emp_uapi::sram::counter::ACKS_TX };
        self.count(c, 1);
    }

    /// C1.
    pub(crate) fn admin_port_suspend<H: Hal>(&mut self, hal: &mut H, port: u64) -> u32 {
        let Some(p) = self.open_port_arg(port) else { return admin_result::BAD_ARG };
        if self.ports[p as usize].suspended {
            return admin_result::BAD_STATE;
        }
        self.ports[p as usize].suspended = true;
        sram_put_u32(hal, self.layout.port(p).ctl(ctl::STATE), port_state::SUSPENDED);
        // Messages refused before are not rewound here: they may have been
        // sent again and taken since; a refusal from now on rewinds them.
        for i in self.peers_of(p) {
            self.rewind_blocked(i);
        }
        admin_result::OK
    }

    /// C8.
    pub(crate) fn admin_port_resume<H: Hal>(&mut self, hal: &mut H, port: u64) -> u32 {
        let Some(p) = self.open_port_arg(port) else { return admin_result::BAD_ARG };
        if !self.ports[p as usize].suspended {
            return admin_result::BAD_STATE;
        }
        self.ports[p as usize].suspended = false;
        sram_put_u32(hal, self.layout.port(p).ctl(ctl::STATE), port_state::OPEN);
        let mine: Vec<u32> = (0..self.peers.len() as u32)
            .filter(|&i| self.peers[i as usize].as_ref().is_some_and(|x| x.port == p))
            .collect();
        for i in mine {
            if !self.send.peer(i).tx_queue.is_empty() {
                self.send.mark_ready(i);
            }
            // A sender refused while suspended: ask for the message now
            // rather than after its backoff.
            let (expected, refused) = (self.recv.peer(i).rx_expected, self.recv.peer(i).rnr_seq);
            if refused == Some(expected) && !self.recv.peer(i).rnr_coll {
                self.recv_cpu().send_nack(hal, i, expected, 0, 1, NackReason::Loss);
            }
        }
        // Collective messages it refused, likewise.
        self.coll_kick(hal, p);
        admin_result::OK
    }

    /// C2–C4.
    pub(crate) fn admin_port_stable(&mut self, port: u64) -> u32 {
        let Some(p) = self.open_port_arg(port) else { return admin_result::BAD_ARG };
        match self.port_unstable(p) {
            Some(_) => admin_result::NOT_STABLE,
            None => admin_result::OK,
        }
    }

    fn open_port_arg(&self, port: u64) -> Option<u16> {
        (port < self.ports.len() as u64 && self.ports[port as usize].open).then_some(port as u16)
    }

    fn peers_of(&self, port: u16) -> Vec<u32> {
        (0..self.peers.len() as u32)
            .filter(|&i| self.peers[i as usize].as_ref().is_some_and(|p| p.port == port))
            .collect()
    }

    /// What keeps suspended port `port` from being stable, if anything.
    /// Besides PM's C2–C4 (nothing unsent, unanswered or owed), state a
    /// context image does not carry must be gone: collectives, remote
    /// reads, atomics of its own in flight, retained (rendezvous) or
    /// claimed unexpected messages, group and multicast membership.
    pub fn port_unstable(&self, port: u16) -> Option<&'static str> {
        let st = &self.ports[port as usize];
        if !st.open || !st.suspended {
            return Some("not suspended");
        }
        if (0..self.cpus()).any(|c| self.cpu_pending(c) > 0) {
            return Some("work queued for another NIC CPU");
        }
        let mut tx = 0u32;
        for i in self.peers_of(port) {
            let recv = self.recv.peer(i);
            if !recv.rx_active.is_empty() {
                return Some("a message is being received");
            }
            if recv.ack_owed.is_some() || recv.ack_queued {
                return Some("an ACK is owed (coalescing)");
            }
            if !self.peer(i).atomic.queue.is_empty() {
                return Some("an atomic is outstanding");
            }
            for &s in &self.send.peer(i).tx_queue {
                let m = self.send.tx.get(s).expect("queued");
                if !m.restartable() && !m.held_for_pull() {
                    return Some("a message is being sent");
                }
                tx += m.coll.is_none() as u32;
            }
        }
        // Eager, or a retained header not being pulled; none claimed.
        let unexp_ok = |&e: &u32| {
            self.recv.unexp.get(e).is_some_and(|u| u.claimed.is_none() && (u.data.is_some() || u.pull.is_none()))
        };
        let recv = &self.recv.ports[port as usize];
        if !recv.unexpected.iter().all(unexp_ok) {
            return Some("an unexpected message is being pulled or is claimed");
        }
        if let Some(why) = self.coll_unstable(port) {
            return Some(why);
        }
        let posted_ops = self.coll_ops.iter().filter(|(_, c)| c.port == port && c.desc.is_some()).count() as u32;
        if self.rma_reads.iter().any(|(_, r)| r.port == port) || self.atomics.iter().any(|(_, a)| a.port == port) {
            return Some("a remote read or atomic is outstanding");
        }
        let rb_posted: usize = self.groups_of(port).into_iter().map(|s| self.rbcast_posted(s)).sum();
        if self.cqs.ports[port as usize].outstanding != recv.posted.len() as u32 + tx + posted_ops + rb_posted as u32 {
            return Some("a descriptor is outstanding");
        }
        None
    }

    /// What of `port`'s collective state an image cannot carry, if any.
    /// It carries its groups and its barriers and reductions (posted, or
    /// recorded from early messages) with their messages not yet started,
    /// and its groups' reliable-broadcast states once nothing of them is in
    /// flight (`rbcast/image.rs`); not broadcasts or multisends (their data
    /// is in host memory and in flight to several members at once).
    fn coll_unstable(&self, port: u16) -> Option<&'static str> {
        for (_, o) in self.coll_ops.iter().filter(|(_, o)| o.port == port) {
            if !matches!(o.state, CollState::Barrier(_) | CollState::Reduce(_)) {
                return Some("a broadcast or multisend is in progress");
            }
            if o.stalled {
                return Some("a collective waits for a transmission record");
            }
        }
        let mut rb_addrs = Vec::new();
        for s in self.groups_of(port) {
            if let Some(why) = self.rbcast_unsaveable(s) {
                return Some(why);
            }
            if let Some((addr, _)) = self.rbcast_state_of(s) {
                rb_addrs.push(addr);
            }
        }
        if self.mcast_addrs_of(port).any(|a| !rb_addrs.contains(&a)) {
            return Some("multicast membership");
        }
        None
    }

    /// Table slots of `port`'s groups, ascending.
    fn groups_of(&self, port: u16) -> Vec<u32> {
        let mut v: Vec<u32> = self.groups.by_id.iter().filter(|((p, _), _)| *p == port).map(|(_, &s)| s).collect();
        v.sort_unstable();
        v
    }

    /// `port`'s collective ops, in slot order.
    fn ops_of(&self, port: u16) -> Vec<u32> {
        self.coll_ops.iter().filter(|(_, o)| o.port == port).map(|(s, _)| s).collect()
    }

    /// Largest image this NIC writes or reads.
    fn image_max(&self) -> usize {
        let w = self.layout.port(0);
        let descs = (w.send_entries + w.recv_entries + self.cfg.recv_posted_max) as usize * WorkDesc::SIZE;
        let unexp =
            self.recv.unexp.capacity() as usize * (UNEXP_IMAGE + RETAINED_IMAGE + self.eager_slot_size() as usize);
        let groups = self.groups.slots.len() * GROUP_IMAGE;
        // An op: its record, descriptor and state, a reduction's buffers
        // (own, result, one per child: at most every member).
        let buf = 1 + self.cfg.coll_buf_size as usize;
        let op = OP_IMAGE + WorkDesc::SIZE + 64 + (2 + emp_uapi::coll::GROUP_MEMBERS_MAX) * buf;
        let ops = self.cfg.coll_ops_max as usize * op;
        let tx = self.cfg.tx_max as usize * TX_IMAGE.max(COLL_TX_IMAGE + self.cfg.coll_buf_size as usize);
        let stored = 2 * emp_uapi::desc::PERSIST_SLOTS * STORED_IMAGE;
        let rbcast = self.groups.slots.len() * self.rbcast_image_max(emp_uapi::coll::RBCAST_MEMBERS_MAX as u16);
        let all =
            HEADER + descs + self.cfg.peers_max as usize * PEER_IMAGE + tx + unexp + groups + ops + stored + rbcast;
        all.min(CTX_IMAGE_MAX)
    }

    /// C6: `args` = [port, region key, offset, room].
    pub(crate) fn admin_port_save<H: Hal>(&mut self, hal: &mut H, now: u64, args: &[u64; 6]) -> u32 {
        let Some(p) = self.open_port_arg(args[0]) else { return admin_result::BAD_ARG };
        if args[1] > u32::MAX as u64 {
            return admin_result::BAD_ARG;
        }
        // A job another CPU is running (a completion being written) ends
        // before the image is taken.
        self.drain_jobs(hal);
        if self.port_unstable(p).is_some() {
            return admin_result::NOT_STABLE;
        }
        if self.parked.len() >= PARKED_MAX {
            return admin_result::NO_ROOM;
        }
        let image = self.encode_image(hal, p);
        if image.len() as u64 > args[3] || image.len() > CTX_IMAGE_MAX {
            return admin_result::NO_ROOM;
        }
        if self.mr_lookup(hal, p, args[1] as u32, args[2], image.len() as u64, MR_LOCAL_WRITE).is_err() {
            return admin_result::BAD_KEY;
        }
        if self.region_io(hal, p, args[1] as u32, args[2], Buf::ToHost(&image), MR_LOCAL_WRITE).is_err() {
            return admin_result::BAD_KEY;
        }
        self.release_saved(hal, now, p);
        admin_result::OK
    }

    fn encode_image<H: Hal>(&self, hal: &mut H, port: u16) -> Vec<u8> {
        let st = &self.ports[port as usize];
        let (ss, rs) = (&self.send.ports[port as usize], &self.recv.ports[port as usize]);
        let w = self.layout.port(port);
        let (send_prod, recv_prod) = (sram_u32(hal, w.ctl(ctl::SEND_PROD)), sram_u32(hal, w.ctl(ctl::RECV_PROD)));
        // A host that wrote an implausible producer index loses nothing of
        // the NIC's: its ring is saved as far as it can be valid.
        let clamp = |prod: u32, cons: u32, n: u32| if ring::used(prod, cons) <= n { prod } else { cons };
        let send_prod = clamp(send_prod, ss.cons, w.send_entries);
        let recv_prod = clamp(recv_prod, rs.cons, w.recv_entries);
        let cq_cons = sram_u32(hal, w.ctl(ctl::CQ_CONS));
        let peers = self.peers_of(port);
        let txs: Vec<(usize, u32)> = peers
            .iter()
            .enumerate()
            .flat_map(|(i, &p)| self.send.peer(p).tx_queue.iter().map(move |&s| (i, s)))
            .collect();
        let groups = self.groups_of(port);
        let ops = self.ops_of(port);
        let mut out = Vec::with_capacity(HEADER);
        out.extend_from_slice(&IMAGE_MAGIC.to_le_bytes());
        out.extend_from_slice(&IMAGE_VERSION.to_le_bytes());
        out.extend_from_slice(&(HEADER as u16).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes()); // total length, below
        out.extend_from_slice(&0u32.to_le_bytes()); // checksum, below
        for v in [self.node, st.addr, st.gen] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let mode = match st.mode {
            MatchMode::Unexpected => emp_uapi::sram::match_mode::UNEXPECTED,
            MatchMode::OrderedRefusal => emp_uapi::sram::match_mode::ORDERED_REFUSAL,
        };
        out.extend_from_slice(&[mode as u8, 0]);
        out.extend_from_slice(&st.cq_key.to_le_bytes());
        out.extend_from_slice(&st.cq_entries.to_le_bytes());
        out.extend_from_slice(&st.cq_offset.to_le_bytes());
        for v in [self.cqs.ports[port as usize].prod, cq_cons, ss.cons, send_prod, rs.cons, recv_prod] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let n_stored = ss.stored.len() + rs.stored.len();
        let (mut rb_records, mut n_rb) = (Vec::new(), 0);
        for (i, &s) in groups.iter().enumerate() {
            n_rb += self.rbcast_put_image(s, i as u16, &mut rb_records) as usize;
        }
        let counts =
            [rs.posted.len(), peers.len(), txs.len(), rs.unexpected.len(), groups.len(), ops.len(), n_stored, n_rb];
        for n in counts {
            out.extend_from_slice(&(n as u16).to_le_bytes());
        }
        debug_assert_eq!(out.len(), HEADER);
        // The published, not yet consumed descriptors: send ring, then receive.
        for (send, cons, prod) in [(true, ss.cons, send_prod), (false, rs.cons, recv_prod)] {
            for k in 0..ring::used(prod, cons) {
                let mut b = [0u8; WorkDesc::SIZE];
                hal.sram_read(w.ring_slot(send, cons.wrapping_add(k)), &mut b);
                out.extend_from_slice(&b);
            }
        }
        // The host is stopped at any instruction, maybe half way through
        // writing a descriptor it has not published yet, and the next job in
        // this slot writes the same window: what it left past the producer
        // index travels too, as raw bytes (the NIC checks a descriptor when it
        // consumes it, as always). All-zero slots are left out.
        for (send, cons, prod, entries) in
            [(true, ss.cons, send_prod, w.send_entries), (false, rs.cons, recv_prod, w.recv_entries)]
        {
            let count_at = out.len();
            out.extend_from_slice(&0u16.to_le_bytes());
            let mut count = 0u16;
            for k in 0..entries - ring::used(prod, cons) {
                let mut b = [0u8; WorkDesc::SIZE];
                let idx = prod.wrapping_add(k);
                hal.sram_read(w.ring_slot(send, idx), &mut b);
                if b.iter().any(|&x| x != 0) {
                    out.extend_from_slice(&(k as u16).to_le_bytes());
                    out.extend_from_slice(&0u16.to_le_bytes());
                    out.extend_from_slice(&b);
                    count += 1;
                }
            }
            out[count_at..count_at + 2].copy_from_slice(&count.to_le_bytes());
        }
        for d in &rs.posted {
            put_desc(&mut out, &d.wd);
        }
        for &p in &peers {
            put_peer(&mut out, self.peer(p), self.send.peer(p), self.recv.peer(p));
        }
        for &s in &groups {
            self.put_group(&mut out, s);
        }
        for &o in &ops {
            self.put_op(&mut out, o, &groups);
        }
        for &(i, s) in &txs {
            let m = self.send.tx.get(s).expect("queued");
            out.extend_from_slice(&(i as u16).to_le_bytes());
            let kind = match (&m.coll, m.held) {
                (Some(_), _) => TX_COLL,
                (None, true) => TX_HELD,
                (None, false) => TX_SEND,
            };
            out.extend_from_slice(&kind.to_le_bytes());
            out.extend_from_slice(&m.seq.to_le_bytes());
            match &m.coll {
                None => put_desc(&mut out, &m.desc.wd),
                Some(c) => self.put_coll_tx(&mut out, c, &ops),
            }
        }
        for &e in &rs.unexpected {
            let u = self.recv.unexp.get(e).expect("queued");
            // Stable: eager, or retained and not being pulled.
            let data = self.eager_payload(e).unwrap_or(&[]);
            let retained = if u.data.is_none() { UNEXP_RETAINED } else { 0 };
            let flags = if u.imm.is_some() { UNEXP_HAS_IMM } else { 0 } | retained;
            for v in [u.src_node, u.src_port, data.len() as u16, flags] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            out.extend_from_slice(&u.tag.to_le_bytes());
            out.extend_from_slice(&u.imm.unwrap_or(0).to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            if retained != 0 {
                out.extend_from_slice(&u.total_len.to_le_bytes());
                out.extend_from_slice(&u.seq.to_le_bytes());
                out.extend_from_slice(&0u32.to_le_bytes());
            }
            out.extend_from_slice(data);
        }
        for (ring, table) in [(0u8, &rs.stored), (1, &ss.stored)] {
            for (slot, d) in table.iter() {
                out.extend_from_slice(&[ring, slot, 0, 0]);
                put_desc(&mut out, d);
            }
        }
        out.extend_from_slice(&rb_records);
        let len = out.len() as u32;
        out[8..12].copy_from_slice(&len.to_le_bytes());
        let sum = image_checksum(&out);
        out[CHECKSUM_AT..CHECKSUM_AT + 4].copy_from_slice(&sum.to_le_bytes());
        out
    }

    /// After a save: the port's records leave the NIC (carried by the
    /// image, not completed), the slot is freed, its address parked.
    fn release_saved<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16) {
        let expected = self
            .peers_of(port)
            .iter()
            .map(|&i| (self.peer(i), self.recv.peer(i)))
            .map(|(p, r)| (p.node, p.rport, r.rx_expected))
            .collect();
        for i in self.peers_of(port) {
            while let Some(&s) = self.send.peer(i).tx_queue.front() {
                self.unqueue_tx(s);
            }
        }
        while let Some(&e) = self.recv.ports[port as usize].unexpected.front() {
            self.unexp_remove(e);
        }
        // Its collectives leave with it, not completed (their messages
        // were taken out with the queues above).
        for o in self.ops_of(port) {
            let o = self.coll_ops.remove(o);
            if o.desc.is_none() {
                self.coll_pool_used -= o.state.partials_held().min(self.coll_pool_used);
            }
        }
        for s in self.groups_of(port) {
            // Saveable (`coll_unstable`): nothing in flight; what it holds
            // is in the image, and it is built again from it on restore.
            self.rbcast_group_saved(hal, now, s);
            let g = self.groups.slots[s as usize].take().expect("indexed");
            self.groups.by_id.remove(&(g.port, g.id));
        }
        self.free_peers_of(port);
        self.recv.ports[port as usize].posted.clear();
        self.forget_stored(port);
        self.cqs.ports[port as usize].outstanding = 0;
        let st = &mut self.ports[port as usize];
        st.open = false;
        st.suspended = false;
        self.parked.push(Parked { addr: st.addr, gen: st.gen, expected });
        st.addr = port;
        sram_put_u32(hal, self.layout.port(port).ctl(ctl::STATE), port_state::CLOSED);
    }

    /// C7: `args` = [slot, region key, offset, length, address | generation << 16].
    pub(crate) fn admin_port_restore<H: Hal>(&mut self, hal: &mut H, now: u64, args: &[u64; 6]) -> u32 {
        let slot = args[0];
        if slot >= self.ports.len() as u64 || args[1] > u32::MAX as u64 || args[4] > u32::MAX as u64 {
            return admin_result::BAD_ARG;
        }
        let slot = slot as u16;
        if self.ports[slot as usize].open {
            return admin_result::BAD_STATE;
        }
        let (addr, gen) = (args[4] as u16, (args[4] >> 16) as u16);
        if !self.parked.iter().any(|k| (k.addr, k.gen) == (addr, gen)) {
            return admin_result::BAD_STATE;
        }
        if args[3] < HEADER as u64 || args[3] > self.image_max() as u64 {
            return admin_result::BAD_IMAGE;
        }
        let key = args[1] as u32;
        if self.mr_lookup(hal, slot, key, args[2], args[3], MR_LOCAL_READ).is_err() {
            return admin_result::BAD_KEY;
        }
        let mut bytes = vec![0u8; args[3] as usize];
        if self.region_io(hal, slot, key, args[2], Buf::FromHost(&mut bytes), MR_LOCAL_READ).is_err() {
            return admin_result::BAD_KEY;
        }
        match self.check_image(hal, slot, (addr, gen), &bytes, now) {
            Ok(img) => {
                self.restore_refusal = None;
                self.apply_image(hal, now, slot, img);
                admin_result::OK
            }
            Err(Refusal::NoRoom) => {
                self.restore_refusal = Some("no table room");
                admin_result::NO_ROOM
            }
            Err(Refusal::Bad(why)) => {
                self.restore_refusal = Some(why);
                admin_result::BAD_IMAGE
            }
        }
    }

    /// Checks a whole image (untrusted) against the identity the trusted
    /// side expects and this NIC's tables, before anything changes.
    fn check_image<H: Hal>(
        &self,
        hal: &mut H,
        slot: u16,
        id: (u16, u16),
        b: &[u8],
        now: u64,
    ) -> Result<Image, Refusal> {
        let mut r = Reader::new(b);
        if r.u32()? != IMAGE_MAGIC {
            return Err("not a context image".into());
        }
        if r.u16()? != IMAGE_VERSION || r.u16()? != HEADER as u16 {
            return Err("image version".into());
        }
        let total = r.u32()? as usize;
        let sum = r.u32()?;
        if total != b.len() {
            return Err("image length".into());
        }
        if image_checksum(b) != sum {
            return Err("image checksum".into());
        }
        let (node, addr, gen) = (r.u16()?, r.u16()?, r.u16()?);
        if node != self.node || (addr, gen) != id {
            return Err("image of another context".into());
        }
        let mode = match (r.u8()? as u64, r.u8()?) {
            (m, 0) => MatchMode::from_arg(m, self.cfg.matching).ok_or("match mode")?,
            _ => return Err("reserved byte".into()),
        };
        let (cq_key, cq_entries, cq_offset) = (r.u32()?, r.u32()?, r.u64()?);
        let (cq_prod, cq_cons) = (r.u32()?, r.u32()?);
        let send = (r.u32()?, r.u32()?);
        let recv = (r.u32()?, r.u32()?);
        let (n_posted, n_peers, n_tx, n_unexp) =
            (r.u16()? as usize, r.u16()? as usize, r.u16()? as usize, r.u16()? as usize);
        let (n_groups, n_ops, n_stored) = (r.u16()? as usize, r.u16()? as usize, r.u16()? as usize);
        let n_rb = r.u16()? as usize;
        if n_rb > n_groups {
            return Err("reliable-broadcast states".into());
        }
        if cq_entries > 1 << 20 || !ring::valid_entries(cq_entries) || !ring::plausible(cq_prod, cq_cons, cq_entries) {
            return Err("completion queue".into());
        }
        let cq_bytes = cq_entries as u64 * emp_uapi::desc::Cqe::SIZE as u64;
        if self.mr_lookup(hal, slot, cq_key, cq_offset, cq_bytes, MR_LOCAL_WRITE).is_err() {
            return Err("completion queue region".into());
        }
        let w = self.layout.port(slot);
        if ring::used(send.1, send.0) > w.send_entries || ring::used(recv.1, recv.0) > w.recv_entries {
            return Err("ring indices".into());
        }
        let send_ring = (0..ring::used(send.1, send.0)).map(|_| r.desc()).collect::<Result<Vec<_>, _>>()?;
        let recv_ring = (0..ring::used(recv.1, recv.0)).map(|_| r.desc()).collect::<Result<Vec<_>, _>>()?;
        let unpublished = [
            read_unpublished(&mut r, w.send_entries - ring::used(send.1, send.0))?,
            read_unpublished(&mut r, w.recv_entries - ring::used(recv.1, recv.0))?,
        ];
        let posted_now = self.recv.posted_total() as usize;
        if posted_now + n_posted > self.cfg.recv_posted_max as usize {
            return Err(Refusal::NoRoom);
        }
        let mut posted = Vec::with_capacity(n_posted);
        for _ in 0..n_posted {
            let d = r.desc()?;
            let ld = LocalDesc::new(&d);
            if d.validate() != Ok(Opcode::Recv) || d.flags & emp_uapi::desc::WD_CLAIM != 0 {
                return Err("posted receive".into());
            }
            if self.check_sges(hal, slot, ld.sges(), MR_LOCAL_WRITE).is_err() {
                return Err("posted receive's memory".into());
            }
            posted.push(ld);
        }
        if n_peers > self.peer_free.len() {
            return Err(Refusal::NoRoom);
        }
        let mut peers: Vec<PeerImage> = Vec::with_capacity(n_peers);
        for _ in 0..n_peers {
            let p = get_peer(&mut r, now)?;
            if peers.iter().any(|q| (q.node, q.rport) == (p.node, p.rport)) {
                return Err("peer listed twice".into());
            }
            peers.push(p);
        }
        let groups = self.check_groups(hal, (slot, addr), &mut r, n_groups)?;
        let ops = self.check_ops(hal, slot, &mut r, n_ops, &groups)?;
        if n_tx as u32 > self.send.tx.capacity() - self.send.tx.used() || n_tx as u32 > self.send.tx_rings.available() {
            return Err(Refusal::NoRoom);
        }
        let mut tx = Vec::with_capacity(n_tx);
        let mut last: Vec<Option<u32>> = vec![None; peers.len()];
        for _ in 0..n_tx {
            let (i, kind, seq) = (r.u16()? as usize, r.u16()?, r.u32()?);
            let p = peers.get(i).ok_or("send of an unknown peer")?;
            // Sequence order, and below the peer's next number.
            if !seq_lt(seq, p.tx_seq_next) || last[i].is_some_and(|l| !seq_lt(l, seq)) {
                return Err("queued send's sequence".into());
            }
            last[i] = Some(seq);
            if !self.route_valid(hal, p.node) {
                return Err("queued send's route".into());
            }
            if kind == TX_COLL {
                let (ld, coll) = self.check_coll_tx(&mut r, p, &groups, &ops)?;
                tx.push((i, seq, ld, Some(coll), false));
                continue;
            }
            let d = r.desc()?;
            let ld = LocalDesc::new(&d);
            let plain = matches!(kind, TX_SEND | TX_HELD);
            if !plain || d.validate() != Ok(Opcode::Send) || (d.node, d.port) != (p.node, p.rport) {
                return Err("queued send".into());
            }
            if ld.len > self.cfg.msg_max || self.check_sges(hal, slot, ld.sges(), MR_LOCAL_READ).is_err() {
                return Err("queued send's memory".into());
            }
            tx.push((i, seq, ld, None, kind == TX_HELD));
        }
        // Eager entries need an overflow slot each; retained headers count
        // against the NIC's headers; all against its unexpected table.
        if n_unexp as u32 > self.recv.unexp.capacity() - self.recv.unexp.used() {
            return Err(Refusal::NoRoom);
        }
        let mut unexp: Vec<UnexpImage> = Vec::with_capacity(n_unexp);
        for _ in 0..n_unexp {
            let (src_node, src_port, len, flags) = (r.u16()?, r.u16()?, r.u16()?, r.u16()?);
            let tag = r.u64()?;
            let (imm, reserved) = (r.u32()?, r.u32()?);
            if flags & !(UNEXP_HAS_IMM | UNEXP_RETAINED) != 0
                || (flags & UNEXP_HAS_IMM == 0 && imm != 0)
                || reserved != 0
                || len as u32 > self.eager_slot_size()
            {
                return Err("unexpected message".into());
            }
            let imm = (flags & UNEXP_HAS_IMM != 0).then_some(imm);
            let retained = if flags & UNEXP_RETAINED != 0 {
                let (total_len, seq, zero) = (r.u64()?, r.u32()?, r.u32()?);
                // Taken from a peer of the image before the save: below its
                // next expected message and within a window of it.
                let p = peers.iter().find(|p| (p.node, p.rport) == (src_node, src_port));
                let taken = p.is_some_and(|p| seq_lt(seq, p.rx_expected) && p.rx_expected.wrapping_sub(seq) < 1 << 20);
                let twice =
                    unexp.iter().any(|u| u.retained.is_some_and(|(_, s)| s == seq) && u.src == (src_node, src_port));
                if len != 0 || zero != 0 || total_len > self.cfg.msg_max || !taken || twice {
                    return Err("retained message".into());
                }
                Some((total_len, seq))
            } else {
                None
            };
            let data = r.take(len as usize)?.to_vec();
            unexp.push(UnexpImage { src: (src_node, src_port), tag, imm, data, retained });
        }
        let n_retained = unexp.iter().filter(|u| u.retained.is_some()).count() as u32;
        if n_unexp as u32 - n_retained > self.eager_room() || self.recv.rdv_held + n_retained > self.cfg.unexp_headers {
            return Err(Refusal::NoRoom);
        }
        let stored = check_stored(&mut r, n_stored)?;
        // Each group's state at most once, in group order.
        let mut rbcast: Vec<(usize, crate::rbcast::RbImage)> = Vec::with_capacity(n_rb);
        for _ in 0..n_rb {
            let gi = r.u16()? as usize;
            let (s, g) = groups.get(gi).ok_or("reliable-broadcast state of an unknown group")?;
            if rbcast.last().is_some_and(|&(last, _)| last >= gi) {
                return Err("reliable-broadcast states' order".into());
            }
            rbcast.push((gi, self.rbcast_get_image(hal, slot, &mut r, *s, g)?));
        }
        if !r.at_end() {
            return Err("trailing bytes".into());
        }
        Ok(Image {
            addr,
            gen,
            mode,
            cq_key,
            cq_entries,
            cq_offset,
            cq_prod,
            cq_cons,
            send,
            recv,
            send_ring,
            recv_ring,
            unpublished,
            posted,
            peers,
            tx,
            unexp,
            groups,
            ops,
            stored,
            rbcast,
        })
    }

    /// Installs a checked image into free slot `slot` (nothing can fail
    /// here: every bound was checked).
    fn apply_image<H: Hal>(&mut self, hal: &mut H, now: u64, slot: u16, img: Image) {
        self.parked.retain(|k| (k.addr, k.gen) != (img.addr, img.gen));
        let w = self.layout.port(slot);
        for (i, d) in img.send_ring.iter().enumerate() {
            let mut b = [0u8; WorkDesc::SIZE];
            d.put(&mut b);
            hal.sram_write(w.send_slot(img.send.0.wrapping_add(i as u32)), &b);
        }
        for (i, d) in img.recv_ring.iter().enumerate() {
            let mut b = [0u8; WorkDesc::SIZE];
            d.put(&mut b);
            hal.sram_write(w.recv_slot(img.recv.0.wrapping_add(i as u32)), &b);
        }
        // Past the producer indices: what the host had left there, and
        // zeros over whatever the slot's last job wrote.
        for (send, (cons, prod), entries, saved) in [
            (true, img.send, w.send_entries, &img.unpublished[0]),
            (false, img.recv, w.recv_entries, &img.unpublished[1]),
        ] {
            let mut saved = saved.iter().peekable();
            for k in 0..entries - ring::used(prod, cons) {
                let b = saved.next_if(|(at, _)| *at == k).map_or([0u8; WorkDesc::SIZE], |(_, b)| *b);
                let idx = prod.wrapping_add(k);
                hal.sram_write(w.ring_slot(send, idx), &b);
            }
        }
        let plain_tx = img.tx.iter().filter(|t| t.3.is_none()).count();
        let posted_ops = img.ops.iter().filter(|(_, o)| o.desc.is_some()).count();
        let rb_posted: usize = img.rbcast.iter().map(|(_, rb)| rb.posted.len()).sum();
        let outstanding = (img.posted.len() + plain_tx + posted_ops + rb_posted) as u32;
        {
            let st = &mut self.ports[slot as usize];
            st.open = true;
            st.suspended = true;
            st.gen = img.gen;
            st.addr = img.addr;
            st.cq_key = img.cq_key;
            st.cq_offset = img.cq_offset;
            st.cq_entries = img.cq_entries;
            st.mode = img.mode;
        }
        let cq = &mut self.cqs.ports[slot as usize];
        (cq.prod, cq.outstanding) = (img.cq_prod, outstanding);
        self.send.ports[slot as usize].cons = img.send.0;
        self.recv.ports[slot as usize].cons = img.recv.0;
        self.recv.ports[slot as usize].posted = VecDeque::from(img.posted);
        for &(send, at, ref d) in &img.stored {
            self.stored_mut(slot, send).store(at, d);
        }
        // The host's words too: it goes on from where it was.
        for (at, v) in [
            (ctl::SEND_PROD, img.send.1),
            (ctl::RECV_PROD, img.recv.1),
            (ctl::CQ_CONS, img.cq_cons),
            (ctl::ARM, 0),
            (ctl::SEND_CONS, img.send.0),
            (ctl::RECV_CONS, img.recv.0),
            (ctl::CQ_PROD, img.cq_prod),
            (ctl::CQ_OVERRUNS, 0),
            (ctl::GEN, img.gen as u32),
            (ctl::STATE, port_state::SUSPENDED),
        ] {
            sram_put_u32(hal, w.ctl(at), v);
        }
        let mut ids = Vec::with_capacity(img.peers.len());
        for p in img.peers {
            let i = self.peer_free.pop().expect("room checked");
            let key = Peer {
                port: slot,
                node: p.node,
                rport: p.rport,
                atomic: crate::atomic::PeerAtomics {
                    seq_next: p.atomic_seq_next,
                    queue: VecDeque::new(),
                    rx: p.atomic_rx,
                },
                last_ns: now,
            };
            let send = PeerSend {
                tx_seq_next: p.tx_seq_next,
                credits: p.credits,
                not_to_send: p.not_to_send,
                remote_gen: p.remote_gen,
                fc_level: p.fc_level,
                fc_stop_ns: now,
                ..PeerSend::new()
            };
            // Stable when saved: nothing was being received, no ACK was owed.
            let recv = PeerRecv {
                rx_gen: p.rx_gen,
                rx_expected: p.rx_expected,
                rnr_seq: p.rnr_seq,
                rnr_tag: p.rnr_tag,
                rnr_coll: p.rnr_coll,
                max_seen: p.max_seen,
                rx_taken: p.rx_taken,
                fc_stop_sent: p.fc_stop_sent,
                ..PeerRecv::new(now, p.rx_expected)
            };
            self.install_peer(i, key, send, recv);
            // A sender told to stop probes if the update never comes; a
            // receiver that told one to stop sends the update when it has room.
            if p.fc_level == wire::FC_STOP && self.cfg.flow_control == FlowControl::Piggyback {
                let at = now.saturating_add(self.cfg.rnr_delay_ns_max);
                self.send.arm_timer(&self.peers, at, SendTimer::FcProbe { peer: i });
            }
            self.recv.fc_updates_owed |= p.fc_stop_sent;
            ids.push(i);
        }
        let group_slots: Vec<u32> = img.groups.iter().map(|&(s, _)| s).collect();
        for (s, g) in img.groups {
            self.groups.by_id.insert((g.port, g.id), s);
            self.groups.slots[s as usize] = Some(g);
            self.rbcast_group_loaded(hal, s);
        }
        for (gi, rb) in img.rbcast {
            self.rbcast_install(group_slots[gi], rb);
        }
        let mut op_slots = Vec::with_capacity(img.ops.len());
        for (gi, mut o) in img.ops {
            o.group = group_slots[gi];
            o.stamp = self.next_stamp();
            if o.desc.is_none() {
                self.coll_pool_used += o.state.partials_held();
            }
            op_slots.push(self.coll_ops.insert_checked(o));
        }
        for (i, seq, d, coll, held) in img.tx {
            let coll = coll.map(|(op, hdr, data)| {
                // A message of a completed op names no live record.
                let (op, op_stamp) = match op_slots.get(op as usize) {
                    Some(&s) => {
                        let o = self.coll_ops.get_mut(s);
                        o.pending_tx += 1;
                        (s, o.stamp)
                    }
                    None => (0, self.next_stamp()),
                };
                let data = if data.is_empty() { CollData::None } else { CollData::Nic(data) };
                CollTx { hdr: Some(hdr), data, op, op_stamp, limit: u32::MAX }
            });
            let t = self.restore_tx(now, slot, ids[i], d, seq, coll);
            if held {
                // Waits for its pull again, kept alive meanwhile.
                self.hold_tx(now, t);
            }
        }
        for u in img.unexp {
            let peer = self.find_peer(slot, u.src.0, u.src.1).unwrap_or(u32::MAX);
            self.restore_unexpected(slot, peer, u.src, u.tag, u.imm, &u.data, u.retained);
        }
    }

    /// Forgets parked context `args[0]` = address | generation << 16.
    pub(crate) fn admin_port_discard(&mut self, arg: u64) -> u32 {
        let id = (arg as u16, (arg >> 16) as u16);
        if arg > u32::MAX as u64 {
            return admin_result::BAD_ARG;
        }
        let before = self.parked.len();
        self.parked.retain(|k| (k.addr, k.gen) != id);
        if self.parked.len() == before {
            admin_result::BAD_STATE
        } else {
            admin_result::OK
        }
    }

    /// Why the last restore refused its image, if it did.
    pub fn restore_refusal(&self) -> Option<&'static str> {
        self.restore_refusal
    }

    /// The parked contexts (address, generation).
    pub fn parked(&self) -> Vec<(u16, u16)> {
        self.parked.iter().map(|k| (k.addr, k.gen)).collect()
    }

    /// Wire address of port `slot`.
    pub fn port_addr(&self, slot: u16) -> u16 {
        self.ports[slot as usize].addr
    }

    /// Is slot `slot` holding an open port?
    pub fn port_is_open(&self, slot: u16) -> bool {
        self.ports[slot as usize].open
    }

    /// Generation of port `slot`.
    pub fn port_gen(&self, slot: u16) -> u16 {
        self.ports[slot as usize].gen
    }
}

/// Groups and collective operations in an image: written by `put_*`, read
/// and checked by `check_*` (the image is untrusted; group membership is
/// not in it but in the trusted side's group table, which keeps a parked
/// context's entries as it keeps its MR entries).
impl Nic {
    fn put_group(&self, out: &mut Vec<u8>, slot: u32) {
        let g = self.groups.get(slot).expect("indexed");
        for v in [slot, g.id, g.epoch] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&g.rank.to_le_bytes());
        out.extend_from_slice(&g.n.to_le_bytes());
        out.extend_from_slice(&g.span.to_le_bytes());
        out.extend_from_slice(&g.next_instance.to_le_bytes());
        out.extend_from_slice(&members_checksum(g).to_le_bytes());
    }

    /// `groups`: the table slots written before, in image order.
    fn put_op(&self, out: &mut Vec<u8>, op: u32, groups: &[u32]) {
        let o = self.coll_ops.get(op).expect("live");
        let gi = groups.iter().position(|&s| s == o.group).expect("a group of the port");
        let kind = match o.state {
            CollState::Barrier(_) => OP_BARRIER,
            CollState::Reduce(_) => OP_REDUCE,
            _ => unreachable!("stable: barriers and reductions only"),
        };
        let mut flags = 0;
        for (on, f) in [(o.desc.is_some(), OPF_POSTED), (o.local_done, OPF_LOCAL_DONE), (o.error.is_some(), OPF_ERROR)]
        {
            if on {
                flags |= f;
            }
        }
        out.extend_from_slice(&(gi as u16).to_le_bytes());
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&o.instance.to_le_bytes());
        let opcode = o.desc.map_or(0, |(_, oc)| oc as u8);
        out.extend_from_slice(&[opcode, o.error.map_or(0, |e| e as u8), 0, 0]);
        if let Some((ld, _)) = &o.desc {
            put_desc(out, &ld.wd);
        }
        match &o.state {
            CollState::Barrier(b) => b.save(out),
            CollState::Reduce(r) => r.save(out),
            _ => unreachable!("checked above"),
        }
    }

    /// A queued collective message: its op (an index into `ops`, or
    /// [`NO_OP`] when the op completed), its header and NIC-held data.
    fn put_coll_tx(&self, out: &mut Vec<u8>, c: &CollTx, ops: &[u32]) {
        let live = self.coll_ops.get(c.op).is_some_and(|o| o.stamp == c.op_stamp);
        let op = ops.iter().position(|&o| live && o == c.op).map_or(NO_OP, |i| i as u16);
        let data: &[u8] = match &c.data {
            CollData::Nic(v) => v,
            _ => &[],
        };
        out.extend_from_slice(&op.to_le_bytes());
        out.extend_from_slice(&(data.len() as u16).to_le_bytes());
        let mut h = [0u8; CollHeader::SIZE];
        c.hdr.expect("restartable: a header").put(&mut h);
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
    }

    /// The image's groups, each loaded again from the trusted side's table
    /// slot it names, which must still hold that group for `slot`.
    fn check_groups<H: Hal>(
        &self,
        hal: &mut H,
        (slot, addr): (u16, u16),
        r: &mut Reader,
        n: usize,
    ) -> Result<Vec<(u32, GroupState)>, Refusal> {
        let mut out: Vec<(u32, GroupState)> = Vec::with_capacity(n.min(self.groups.slots.len()));
        for _ in 0..n {
            let (s, id, epoch, rank, members, span, next, sum) =
                (r.u32()?, r.u32()?, r.u32()?, r.u16()?, r.u16()?, r.u32()?, r.u32()?, r.u32()?);
            let end = s.checked_add(span).ok_or("group slot")?;
            if span == 0 || end as usize > self.groups.slots.len() {
                return Err("group slot".into());
            }
            // Free on this NIC, and not twice in the image.
            if !self.groups.overlapping(s, span).is_empty() || out.iter().any(|(t, g)| s < t + g.span && *t < end) {
                return Err(Refusal::NoRoom);
            }
            let g = self.group_from_table(hal, s, Some((slot, addr))).map_err(|r| match r {
                admin_result::BAD_STATE => "group table entry of another slot",
                admin_result::BAD_KEY => "group table entry's bounce memory",
                _ => "group table entry",
            })?;
            // The same group, not another job's of the same id and epoch.
            if (g.id, g.epoch, g.rank, g.n, g.span, members_checksum(&g)) != (id, epoch, rank, members, span, sum) {
                return Err("group of another table entry".into());
            }
            if out.iter().any(|(_, h)| h.id == id) {
                return Err("group listed twice".into());
            }
            let mut g = g;
            g.next_instance = next;
            out.push((s, g));
        }
        Ok(out)
    }

    /// The image's collective ops: each of one of its groups, its
    /// descriptor valid on that group and agreeing with its state.
    fn check_ops<H: Hal>(
        &self,
        hal: &mut H,
        slot: u16,
        r: &mut Reader,
        n: usize,
        groups: &[(u32, GroupState)],
    ) -> Result<Vec<(usize, CollOp)>, Refusal> {
        if self.coll_ops.used() as usize + n > self.coll_ops.capacity() as usize {
            return Err(Refusal::NoRoom);
        }
        let mut out: Vec<(usize, CollOp)> = Vec::with_capacity(n);
        let mut early_partials = 0u32;
        for _ in 0..n {
            let (gi, kind, flags, instance) = (r.u16()? as usize, r.u8()?, r.u8()?, r.u32()?);
            let (opcode, error, pad) = (r.u8()?, r.u8()?, r.u16()?);
            let (table_slot, g) = groups.get(gi).map(|(s, g)| (*s, g)).ok_or("op of an unknown group")?;
            let posted = flags & OPF_POSTED != 0;
            if pad != 0 || flags & !(OPF_POSTED | OPF_LOCAL_DONE | OPF_ERROR) != 0 {
                return Err("op record".into());
            }
            let error = match (flags & OPF_ERROR != 0, emp_uapi::desc::Status::from_u8(error)) {
                (true, Some(e)) if e != emp_uapi::desc::Status::Success => Some(e),
                (false, _) if error == 0 => None,
                _ => return Err("op outcome".into()),
            };
            if out.iter().any(|(h, o)| *h == gi && o.instance == instance) {
                return Err("op listed twice".into());
            }
            // A posted op is behind the group's next instance; an early one
            // within the window ahead of it, with nothing of its own yet.
            let ahead = instance.wrapping_sub(g.next_instance);
            let in_order = if posted { seq_lt(instance, g.next_instance) } else { ahead < self.cfg.coll_window };
            if !in_order || (!posted && (flags != 0 || opcode != 0)) {
                return Err("op instance".into());
            }
            let desc = if posted {
                let d = r.desc()?;
                let ld = LocalDesc::new(&d);
                let oc = Opcode::from_u8(opcode).filter(|&oc| d.validate() == Ok(oc)).ok_or("op descriptor")?;
                let params = match (kind, oc) {
                    (OP_BARRIER, Opcode::Barrier) => self.validate_barrier(g, &ld),
                    (OP_REDUCE, Opcode::Reduce | Opcode::Allreduce) => self.validate_reduce(hal, slot, g, &ld, oc),
                    _ => return Err("op descriptor".into()),
                };
                let params = params.map_err(|_| "op descriptor")?;
                if d.node as u32 != table_slot {
                    return Err("op descriptor's group".into());
                }
                Some((ld, oc, params))
            } else {
                None
            };
            let state = match kind {
                OP_BARRIER => CollState::Barrier(crate::coll::Barrier::load(r, g)?),
                OP_REDUCE => {
                    let buf = self.cfg.coll_buf_size as usize;
                    CollState::Reduce(crate::coll::Reduce::load(r, g, buf, posted)?)
                }
                _ => return Err("op kind".into()),
            };
            if let Some((_, oc, params)) = &desc {
                let all = matches!(state.params(), Params::Reduce(p) if p.all);
                if state.params() != *params || (*oc == Opcode::Allreduce) != all {
                    return Err("op state of another operation".into());
                }
            } else {
                early_partials += state.partials_held();
            }
            let mut o = CollOp::new(slot, table_slot, instance, 0, state);
            o.desc = desc.map(|(ld, oc, _)| (ld, oc));
            o.error = error;
            o.local_done = flags & OPF_LOCAL_DONE != 0;
            out.push((gi, o));
        }
        if self.coll_pool_used + early_partials > self.cfg.coll_bufs {
            return Err(Refusal::NoRoom);
        }
        Ok(out)
    }

    /// A queued collective message to peer `p`: a barrier's or reduction's
    /// message of one of the image's groups, from this member to a member.
    fn check_coll_tx(
        &self,
        r: &mut Reader,
        p: &PeerImage,
        groups: &[(u32, GroupState)],
        ops: &[(usize, CollOp)],
    ) -> Result<(LocalDesc, CollImage), Refusal> {
        let (op, len) = (r.u16()?, r.u16()? as usize);
        let ch = CollHeader::parse(r.take(CollHeader::SIZE)?).map_err(|_| "collective header")?;
        let data = r.take(len)?.to_vec();
        let kind = CollKind::from_u8(ch.kind).ok_or("collective kind")?;
        let barrier = matches!(
            kind,
            CollKind::BarrierPe | CollKind::BarrierDiss | CollKind::BarrierGather | CollKind::BarrierRelease
        );
        let reduce = matches!(kind, CollKind::ReduceUp | CollKind::AllreduceDown);
        let g = match ops.get(op as usize) {
            Some((gi, o)) if o.instance == ch.instance => &groups[*gi].1,
            Some(_) => return Err("collective message of another op".into()),
            // Only a barrier completes before its messages are acknowledged.
            None if op == NO_OP && barrier => {
                let g = groups.iter().map(|(_, g)| g).find(|g| g.id == ch.group_id).ok_or("message's group")?;
                if !seq_lt(ch.instance, g.next_instance) {
                    return Err("collective message of no op".into());
                }
                g
            }
            None => return Err("collective message of no op".into()),
        };
        let want = if reduce { crate::coll::ReduceParams::of_header(&ch).map_or(usize::MAX, |x| x.bytes()) } else { 0 };
        if !(barrier || reduce) || (ch.group_id, ch.epoch, ch.sender) != (g.id, g.epoch, g.rank) {
            return Err("collective message".into());
        }
        if g.rank_of(p.node, p.rport).is_none() {
            return Err("collective message to a non-member".into());
        }
        let cap = wire::payload_capacity(self.mtu, 0);
        if len != want || len > self.cfg.coll_buf_size as usize || CollHeader::SIZE + len > cap {
            return Err("collective message's data".into());
        }
        let wd = WorkDesc { opcode: Opcode::Send as u8, node: p.node, port: p.rport, ..Default::default() };
        let mut ld = LocalDesc::new(&wd);
        ld.len = (CollHeader::SIZE + len) as u64;
        Ok((ld, (op, ch, data)))
    }
}
