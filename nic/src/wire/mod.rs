//! Wire backends. `mem`: an in-process switch between the NICs of one
//! chassis, with seeded fault injection (loss, duplication, reordering,
//! delay). `udp` (`udp.rs`): one socket per NIC at its address from the
//! route table; works across hosts without privileges. `packet`
//! (`packet.rs`): raw Ethernet frames on a named interface (CAP_NET_RAW).
//! The network wires accept a frame only from the address the route table
//! gives the node its header claims; the rest is counted and dropped.
//! With `[cluster] auth` on (`auth.rs`), they also seal every frame they
//! send and open every frame they receive before a control program sees it.

use std::collections::{BinaryHeap, VecDeque};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use emp_uapi::wire::{Frame, FrameHeader, WIRE_VERSION};

use crate::dma::HostPayload;
use emp_uapi::Le;

pub mod auth;
mod batch;
pub mod info;
pub mod packet;
pub mod udp;

pub use info::WireView;
pub use packet::{PacketOptions, PacketWire};
pub use udp::{UdpMcastMode, UdpWire};

/// Fault injection applied by every backend on transmit.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Probability a frame is lost.
    pub loss: f64,
    /// Probability a frame is duplicated.
    pub dup: f64,
    /// Probability a frame is delayed (reordered).
    pub reorder: f64,
    /// Largest extra delay of a reordered frame (ns).
    pub jitter_ns: u64,
    /// Every frame leaves this long (ns) after it was sent, order kept: a
    /// link's propagation delay, where the kernel has no `tc netem` to add it.
    pub link_delay_ns: u64,
    /// Seed.
    pub seed: u64,
}

/// xorshift64*: small, seeded, good enough for fault injection.
#[derive(Clone, Debug)]
struct Prng(u64);

impl Prng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// Wire counters, a snapshot of [`WireCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireStats {
    /// Frames sent.
    pub frames: u64,
    /// Frames received and handed to a NIC.
    pub received: u64,
    /// Lost on transmit (injected, no route, or refused by the socket).
    pub lost: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Delayed out of order.
    pub reordered: u64,
    /// Dropped: the sender's address, or the node its header claims, is not in the route table.
    pub unknown_source: u64,
    /// Dropped: sent from another node's address than the one its header claims.
    pub source_mismatch: u64,
    /// Dropped: an Ethernet frame of another ethertype.
    pub foreign_ethertype: u64,
    /// Dropped: too short, truncated, or not a valid EMP frame.
    pub malformed: u64,
    /// Dropped (auth): the tag does not match: forged, altered, or another key.
    pub bad_tag: u64,
    /// Dropped (auth): sealed with a key id this daemon does not hold.
    pub unknown_key: u64,
    /// Dropped (auth): a counter seen before, or too far behind the newest.
    pub replayed: u64,
    /// Multicast transmissions (one per transmission at the sender, however
    /// many members; also counted in `frames`).
    pub mcast_sent: u64,
    /// Multicast frames handed to a local NIC that joined the address (also
    /// counted in `received`).
    pub mcast_received: u64,
    /// Multicast transmissions sent as one unicast copy per node because
    /// the network refused multicast (UDP without multicast routing).
    pub mcast_fallback: u64,
    /// Datagrams handed to the network with their payload read in place
    /// from host memory (Immediate Sending: no copy before the socket's).
    pub from_host: u64,
}

/// Live wire counters, shared with the threads that report them (`emp info`).
#[derive(Debug, Default)]
pub struct WireCounters {
    frames: AtomicU64,
    received: AtomicU64,
    lost: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    unknown_source: AtomicU64,
    source_mismatch: AtomicU64,
    foreign_ethertype: AtomicU64,
    malformed: AtomicU64,
    bad_tag: AtomicU64,
    unknown_key: AtomicU64,
    replayed: AtomicU64,
    mcast_sent: AtomicU64,
    mcast_received: AtomicU64,
    mcast_fallback: AtomicU64,
    from_host: AtomicU64,
}

impl WireCounters {
    fn add(c: &AtomicU64, n: u64) {
        if n > 0 {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts a refused frame.
    pub fn refused(&self, why: Refused) {
        Self::add(
            match why {
                Refused::Malformed => &self.malformed,
                Refused::UnknownSource => &self.unknown_source,
                Refused::SourceMismatch => &self.source_mismatch,
                Refused::ForeignEthertype => &self.foreign_ethertype,
                Refused::BadTag => &self.bad_tag,
                Refused::UnknownKey => &self.unknown_key,
                Refused::Replayed => &self.replayed,
            },
            1,
        );
    }

    /// The counters now.
    pub fn snapshot(&self) -> WireStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WireStats {
            frames: g(&self.frames),
            received: g(&self.received),
            lost: g(&self.lost),
            duplicated: g(&self.duplicated),
            reordered: g(&self.reordered),
            unknown_source: g(&self.unknown_source),
            source_mismatch: g(&self.source_mismatch),
            foreign_ethertype: g(&self.foreign_ethertype),
            malformed: g(&self.malformed),
            bad_tag: g(&self.bad_tag),
            unknown_key: g(&self.unknown_key),
            replayed: g(&self.replayed),
            mcast_sent: g(&self.mcast_sent),
            mcast_received: g(&self.mcast_received),
            mcast_fallback: g(&self.mcast_fallback),
            from_host: g(&self.from_host),
        }
    }
}

/// Why a network wire refused a received frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Too short, truncated or undecodable.
    Malformed,
    /// From an address not in the route table, or claiming a node not in it.
    UnknownSource,
    /// From node A's address, claiming to be node B.
    SourceMismatch,
    /// Another protocol's Ethernet frame.
    ForeignEthertype,
    /// Authentication: the tag does not match.
    BadTag,
    /// Authentication: sealed under a key id not held.
    UnknownKey,
    /// Authentication: a replayed (or too old) counter.
    Replayed,
}

/// The source node a received frame claims: it must be a valid EMP frame.
pub fn claimed_source(frame: &[u8]) -> Result<u16, Refused> {
    Frame::parse(frame).map(|f| f.header().src_node).map_err(|_| Refused::Malformed)
}

/// The source node a sealed frame claims (`sealed`: the wire
/// authenticates, and only the header is readable before the trailer is
/// checked), else as [`claimed_source`].
pub fn claimed_source_of(frame: &[u8], sealed: bool) -> Result<u16, Refused> {
    if !sealed {
        return claimed_source(frame);
    }
    if frame.len() < FrameHeader::SIZE + auth::TRAILER {
        return Err(Refused::Malformed);
    }
    match FrameHeader::decode(frame) {
        Ok(h) if h.version == WIRE_VERSION => Ok(h.src_node),
        _ => Err(Refused::Malformed),
    }
}

/// Opens a sealed frame received by local NIC `local` from node `from`
/// (when the wire authenticates) and checks what is left is an EMP frame.
pub fn open_frame(auth: Option<&mut auth::Auth>, local: usize, from: u16, frame: &mut Vec<u8>) -> Result<(), Refused> {
    let Some(a) = auth else { return Ok(()) };
    a.open(local, from, frame)?;
    Frame::parse(frame).map(|_| ()).map_err(|_| Refused::Malformed)
}

/// Accepts a frame claiming node `claimed` from the node the sender's
/// address belongs to (`from`, `None` when the address is in no route).
pub fn check_source(claimed: u16, from: Option<u16>, nodes: usize) -> Result<u16, Refused> {
    match from {
        _ if claimed as usize >= nodes => Err(Refused::UnknownSource),
        None => Err(Refused::UnknownSource),
        Some(n) if n != claimed => Err(Refused::SourceMismatch),
        Some(n) => Ok(n),
    }
}

/// Is `frame` sent to a multicast address (its header's destination)?
pub fn is_mcast_frame(frame: &[u8]) -> bool {
    frame_dst(frame).is_some_and(emp_uapi::wire::is_mcast)
}

/// The destination a frame's header names (readable whether or not the
/// frame is sealed): two bytes, no decoding on the per-frame path.
pub fn frame_dst(frame: &[u8]) -> Option<u16> {
    const AT: usize = std::mem::offset_of!(FrameHeader, dst_node);
    frame.get(AT..AT + 2).map(|b| u16::from_le_bytes([b[0], b[1]]))
}

/// What a wire is, for `emp info`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireKindInfo {
    /// In-process switch.
    Mem,
    /// UDP sockets.
    Udp,
    /// Raw Ethernet on these interfaces (one per local NIC).
    Packet {
        /// Interface names, by local NIC.
        interfaces: Vec<String>,
    },
}

/// A wire: frames out of local NICs, frames into local NICs' queues.
pub trait Wire: Send {
    /// NIC `src` (local index) transmits to node `dst`.
    fn send(&mut self, now: u64, src: usize, dst: u16, frame: Vec<u8>);
    /// As [`Wire::send`], for a frame whose payload is still in host memory
    /// (Immediate Sending): `frame` holds its headers, `host` the rest. A
    /// wire that can send from host memory in place does; by default the
    /// payload is copied after the headers, one copy, as a MAC's buffer.
    fn send_host(&mut self, now: u64, src: usize, dst: u16, mut frame: Vec<u8>, host: HostPayload) {
        host.append_to(&mut frame);
        self.send(now, src, dst, frame);
    }
    /// Sends what [`Wire::send`] queued and what a link delay held until
    /// `now` (the engine calls it once per pass, so a wire can batch its
    /// system calls).
    fn flush(&mut self, _now: u64) {}
    /// Moves arrived frames into `rx[local index]`; returns how many.
    fn poll(&mut self, now: u64, rx: &mut [VecDeque<Vec<u8>>]) -> usize;
    /// Earliest time a delayed frame is due.
    fn next_due(&self) -> Option<u64>;
    /// Descriptors to sleep on.
    fn fds(&self) -> Vec<RawFd>;
    /// Counters, shared.
    fn counters(&self) -> Arc<WireCounters>;
    /// Local NIC `local` starts (`join`) or stops receiving frames sent to
    /// multicast address `addr` (see [`emp_uapi::wire::MCAST_BASE`]). A wire
    /// without multicast refuses.
    fn set_membership(&mut self, local: usize, addr: u16, join: bool) -> Result<(), String> {
        let _ = (local, join);
        Err(format!("multicast address {addr:#x}: this wire has no multicast"))
    }
    /// Counters now.
    fn stats(&self) -> WireStats {
        self.counters().snapshot()
    }
}

/// Most frames a [`DelayLine`] holds: 100 µs at 10 Gbit/s of jumbo frames
/// is ~14; beyond this a sender outruns any link and the frame is lost.
pub const DELAY_LINE_MAX: usize = 4096;

/// Frames waiting out a fixed link delay. One delay for all, so they leave
/// in the order sent: a FIFO, not a heap. Bounded by [`DELAY_LINE_MAX`].
pub struct DelayLine<T> {
    delay_ns: u64,
    queue: VecDeque<(u64, T)>,
}

impl<T> DelayLine<T> {
    /// A line delaying every frame by `delay_ns`.
    pub fn new(delay_ns: u64) -> DelayLine<T> {
        DelayLine { delay_ns, queue: VecDeque::new() }
    }

    /// Does it delay anything?
    pub fn active(&self) -> bool {
        self.delay_ns > 0
    }

    /// Holds `item`, sent at `now`, until `now + delay`; gives it back when full.
    pub fn push(&mut self, now: u64, item: T) -> Result<(), T> {
        if self.queue.len() >= DELAY_LINE_MAX {
            return Err(item);
        }
        // `now` never goes back, so the queue stays sorted by due time.
        self.queue.push_back((now + self.delay_ns, item));
        Ok(())
    }

    /// Holds `copies` copies of `frame` (fault injection's duplicates), each
    /// wrapped by `item`; returns how many did not fit. The last copy takes
    /// the buffer itself.
    pub fn push_copies(&mut self, now: u64, copies: usize, frame: Vec<u8>, item: impl Fn(Vec<u8>) -> T) -> u64 {
        let mut frame = Some(frame);
        let mut lost = 0;
        for i in 0..copies {
            let f = if i + 1 == copies { frame.take().expect("once") } else { frame.clone().expect("kept") };
            if self.push(now, item(f)).is_err() {
                lost += 1;
            }
        }
        lost
    }

    /// The oldest frame, if it is due at `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<T> {
        if self.queue.front().is_some_and(|(due, _)| *due <= now) {
            return self.queue.pop_front().map(|(_, item)| item);
        }
        None
    }

    /// When the oldest frame is due.
    pub fn next_due(&self) -> Option<u64> {
        self.queue.front().map(|(due, _)| *due)
    }

    /// Frames held.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Nothing held?
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// A frame held back by fault injection, ordered by when it is due.
struct Delayed {
    /// Wire time (ns) at which it arrives.
    due: u64,
    /// Send order: frames due at the same time arrive in the order sent.
    seq: u64,
    /// Local index of the receiving NIC.
    dst: usize,
    frame: Vec<u8>,
}

impl Delayed {
    fn key(&self) -> (u64, u64) {
        (self.due, self.seq)
    }
}

impl PartialEq for Delayed {
    fn eq(&self, o: &Self) -> bool {
        self.key() == o.key()
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Delayed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.key().cmp(&self.key()) // Reversed: `BinaryHeap` is a max-heap.
    }
}

/// Applies faults: the extra delays of the copies to deliver (none: lost;
/// at most two, no allocation).
fn inject(f: &Faults, rng: &mut Prng, stats: &WireCounters) -> ([u64; 2], usize) {
    WireCounters::add(&stats.frames, 1);
    inject_copy(f, rng, stats)
}

/// As [`inject`], for one receiver's copy of a transmission already
/// counted (multicast: each member loses, duplicates, delays on its own).
fn inject_copy(f: &Faults, rng: &mut Prng, stats: &WireCounters) -> ([u64; 2], usize) {
    if rng.chance(f.loss) {
        WireCounters::add(&stats.lost, 1);
        return ([0; 2], 0);
    }
    let mut out = [0; 2];
    if rng.chance(f.reorder) {
        WireCounters::add(&stats.reordered, 1);
        out[0] = 1 + rng.next() % f.jitter_ns.max(1);
    }
    if rng.chance(f.dup) {
        WireCounters::add(&stats.duplicated, 1);
        out[1] = rng.next() % f.jitter_ns.max(1);
        return (out, 2);
    }
    (out, 1)
}

/// Most multicast addresses one local NIC joins at a time.
pub const MCAST_JOINED_MAX: usize = 256;

/// Which multicast addresses each local NIC joined (what a real NIC's
/// multicast filter holds). Bounded by [`MCAST_JOINED_MAX`] per NIC.
#[derive(Clone, Debug, Default)]
pub struct Memberships {
    joined: Vec<Vec<u16>>,
}

impl Memberships {
    /// No NIC in any group, `locals` NICs.
    pub fn new(locals: usize) -> Memberships {
        Memberships { joined: vec![Vec::new(); locals] }
    }

    /// Local NIC `local` joins or leaves `addr`; true when that changed
    /// anything (a second join or a leave of a group not joined does not).
    pub fn set(&mut self, local: usize, addr: u16, join: bool) -> Result<bool, String> {
        if !emp_uapi::wire::is_mcast(addr) {
            return Err(format!("{addr:#x} is not a multicast address"));
        }
        let set = self.joined.get_mut(local).ok_or_else(|| format!("no local NIC {local}"))?;
        match (set.binary_search(&addr), join) {
            (Ok(_), true) | (Err(_), false) => Ok(false),
            (Err(_), true) if set.len() >= MCAST_JOINED_MAX => {
                Err(format!("local NIC {local} already joined {MCAST_JOINED_MAX} multicast addresses"))
            }
            (Err(at), true) => {
                set.insert(at, addr);
                Ok(true)
            }
            (Ok(at), false) => {
                set.remove(at);
                Ok(true)
            }
        }
    }

    /// Did local NIC `local` join `addr`?
    pub fn joined(&self, local: usize, addr: u16) -> bool {
        self.joined.get(local).is_some_and(|s| s.binary_search(&addr).is_ok())
    }

    /// Addresses local NIC `local` joined.
    pub fn of(&self, local: usize) -> &[u16] {
        self.joined.get(local).map_or(&[], |s| s.as_slice())
    }
}

/// The in-process switch.
pub struct MemWire {
    /// Local index by node id (indexed, not hashed: one lookup per frame).
    local: Vec<Option<usize>>,
    faults: Faults,
    rng: Prng,
    now_queue: VecDeque<(usize, Vec<u8>)>,
    delayed: BinaryHeap<Delayed>,
    seq: u64,
    stats: Arc<WireCounters>,
    groups: Memberships,
}

impl MemWire {
    /// A switch between the given node ids (local index = position).
    pub fn new(nodes: &[u16], faults: Faults) -> MemWire {
        MemWire {
            local: {
                let mut by_node = vec![None; nodes.iter().map(|&n| n as usize + 1).max().unwrap_or(0)];
                for (i, &n) in nodes.iter().enumerate() {
                    by_node[n as usize] = Some(i);
                }
                by_node
            },
            rng: Prng(faults.seed | 1),
            faults,
            now_queue: VecDeque::new(),
            delayed: BinaryHeap::new(),
            seq: 0,
            stats: Arc::default(),
            groups: Memberships::new(nodes.len()),
        }
    }

    /// Queues `frame` for local NIC `d` after `delay` ns.
    fn deliver(&mut self, now: u64, d: usize, delay: u64, frame: Vec<u8>) {
        let delay = delay + self.faults.link_delay_ns;
        if delay == 0 {
            self.now_queue.push_back((d, frame));
        } else {
            self.seq += 1;
            self.delayed.push(Delayed { due: now + delay, seq: self.seq, dst: d, frame });
        }
    }

    /// One multicast transmission from local NIC `src`: a copy to every
    /// other local NIC that joined `addr`, each faulted on its own.
    fn send_mcast(&mut self, now: u64, src: usize, addr: u16, frame: Vec<u8>) {
        WireCounters::add(&self.stats.frames, 1);
        WireCounters::add(&self.stats.mcast_sent, 1);
        for d in 0..self.groups.joined.len() {
            if d == src || !self.groups.joined(d, addr) {
                continue;
            }
            let (delays, n) = inject_copy(&self.faults, &mut self.rng, &self.stats);
            for delay in &delays[..n] {
                self.deliver(now, d, *delay, frame.clone());
            }
        }
    }
}

impl Wire for MemWire {
    fn send(&mut self, now: u64, src: usize, dst: u16, frame: Vec<u8>) {
        if emp_uapi::wire::is_mcast(dst) {
            return self.send_mcast(now, src, dst, frame);
        }
        let Some(d) = self.local.get(dst as usize).copied().flatten() else {
            WireCounters::add(&self.stats.frames, 1);
            WireCounters::add(&self.stats.lost, 1);
            return;
        };
        let (delays, n) = inject(&self.faults, &mut self.rng, &self.stats);
        let mut frame = Some(frame);
        for (i, delay) in delays[..n].iter().enumerate() {
            // The last copy takes the buffer itself: no copy without faults.
            let f = if i + 1 == n { frame.take().expect("once") } else { frame.as_ref().expect("kept").clone() };
            let delay = delay + self.faults.link_delay_ns;
            if delay == 0 {
                self.now_queue.push_back((d, f));
            } else {
                self.seq += 1;
                self.delayed.push(Delayed { due: now + delay, seq: self.seq, dst: d, frame: f });
            }
        }
    }

    fn poll(&mut self, now: u64, rx: &mut [VecDeque<Vec<u8>>]) -> usize {
        let mut n = 0;
        let mut mcast = 0;
        while let Some((d, f)) = self.now_queue.pop_front() {
            mcast += is_mcast_frame(&f) as u64;
            rx[d].push_back(f);
            n += 1;
        }
        while self.delayed.peek().is_some_and(|x| x.due <= now) {
            let Delayed { dst, frame, .. } = self.delayed.pop().expect("peeked");
            mcast += is_mcast_frame(&frame) as u64;
            rx[dst].push_back(frame);
            n += 1;
        }
        WireCounters::add(&self.stats.received, n as u64);
        WireCounters::add(&self.stats.mcast_received, mcast);
        n
    }

    fn set_membership(&mut self, local: usize, addr: u16, join: bool) -> Result<(), String> {
        self.groups.set(local, addr, join).map(|_| ())
    }

    fn next_due(&self) -> Option<u64> {
        if !self.now_queue.is_empty() {
            return Some(0);
        }
        self.delayed.peek().map(|d| d.due)
    }

    fn fds(&self) -> Vec<RawFd> {
        Vec::new()
    }

    fn counters(&self) -> Arc<WireCounters> {
        self.stats.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_checks() {
        assert_eq!(check_source(1, Some(1), 2), Ok(1));
        assert_eq!(check_source(1, Some(0), 2), Err(Refused::SourceMismatch));
        assert_eq!(check_source(1, None, 2), Err(Refused::UnknownSource));
        assert_eq!(check_source(2, Some(2), 2), Err(Refused::UnknownSource), "node 2 is outside a 2-node table");
    }

    /// The header of a one-frame `kind` frame from `src` to `dst`.
    fn one_frame_header(kind: emp_uapi::wire::FrameKind, src: u16, dst: u16, payload_len: usize) -> FrameHeader {
        FrameHeader {
            version: WIRE_VERSION,
            kind: kind as u8,
            src_node: src,
            dst_node: dst,
            frame_count: 1,
            payload_len: payload_len as u16,
            ..Default::default()
        }
    }

    /// The headers of a one-frame data message of `payload_len` bytes
    /// (the payload to be appended).
    pub(crate) fn data_headers(src: u16, dst: u16, payload_len: usize) -> Vec<u8> {
        use emp_uapi::wire::{emit_data_headers, FrameKind, MsgHeader};
        let hdr = one_frame_header(FrameKind::Data, src, dst, payload_len);
        let msg = MsgHeader::new(0, payload_len as u64, None);
        let mut out = vec![0u8; 256 + payload_len];
        let n = emit_data_headers(&hdr, Some(&msg), &mut out).unwrap();
        out.truncate(n);
        out
    }

    /// A valid ACK frame from `src` to `dst` (tests of the wires).
    pub(crate) fn ack_frame(src: u16, dst: u16) -> Vec<u8> {
        use emp_uapi::wire::{emit_ack, AckBody, FrameKind};
        let hdr = one_frame_header(FrameKind::Ack, src, dst, 0);
        let mut out = vec![0u8; 256];
        let n = emit_ack(&hdr, &AckBody::default(), &mut out).unwrap();
        out.truncate(n);
        out
    }

    #[test]
    fn claimed_source_needs_a_valid_frame() {
        let f = ack_frame(3, 1);
        assert_eq!(claimed_source(&f), Ok(3));
        assert_eq!(claimed_source(&f[..20]), Err(Refused::Malformed), "truncated header");
        let mut bad = f.clone();
        bad[0] = 99;
        assert_eq!(claimed_source(&bad), Err(Refused::Malformed), "wrong version");
        bad = f.clone();
        bad[1] = 77;
        assert_eq!(claimed_source(&bad), Err(Refused::Malformed), "unknown kind");
        assert_eq!(claimed_source(&[]), Err(Refused::Malformed));
    }

    #[test]
    fn delay_line_keeps_order_and_its_bound() {
        let mut d = DelayLine::new(100);
        assert!(d.active());
        assert_eq!(d.next_due(), None);
        d.push(10, 'a').unwrap();
        d.push(10, 'b').unwrap();
        d.push(50, 'c').unwrap();
        assert_eq!(d.next_due(), Some(110));
        assert_eq!(d.pop_due(109), None, "not before it is due");
        assert_eq!((d.pop_due(110), d.pop_due(110), d.pop_due(110)), (Some('a'), Some('b'), None));
        assert_eq!(d.pop_due(1000), Some('c'));
        assert!(d.is_empty());
        for i in 0..DELAY_LINE_MAX {
            d.push(0, 'x').unwrap_or_else(|_| panic!("frame {i} refused below the bound"));
        }
        assert_eq!(d.push(0, 'y'), Err('y'), "full: refused, given back");
        assert_eq!(d.len(), DELAY_LINE_MAX);
        assert!(!DelayLine::<u8>::new(0).active());
    }

    #[test]
    fn mem_wire_link_delay_holds_every_frame() {
        let mut w = MemWire::new(&[0, 1], Faults { link_delay_ns: 1_000, ..Faults::default() });
        let mut rx = vec![VecDeque::new(), VecDeque::new()];
        w.send(0, 0, 1, ack_frame(0, 1));
        assert_eq!(w.next_due(), Some(1_000));
        assert_eq!(w.poll(999, &mut rx), 0);
        assert_eq!(w.poll(1_000, &mut rx), 1);
    }

    const GROUP: u16 = emp_uapi::wire::MCAST_BASE + 5;

    #[test]
    fn frame_dst_reads_the_header() {
        assert_eq!(frame_dst(&ack_frame(3, GROUP)), Some(GROUP));
        assert!(is_mcast_frame(&ack_frame(3, GROUP)));
        assert!(!is_mcast_frame(&ack_frame(3, 1)));
        assert_eq!(frame_dst(&[1, 2, 3]), None);
    }

    #[test]
    fn memberships_are_bounded_and_idempotent() {
        let mut m = Memberships::new(2);
        assert_eq!(m.set(0, GROUP, true), Ok(true));
        assert_eq!(m.set(0, GROUP, true), Ok(false), "a second join changes nothing");
        assert!(m.joined(0, GROUP) && !m.joined(1, GROUP));
        assert!(m.set(0, 7, true).unwrap_err().contains("not a multicast address"));
        assert!(m.set(2, GROUP, true).unwrap_err().contains("no local NIC 2"));
        assert_eq!(m.set(0, GROUP, false), Ok(true));
        assert_eq!(m.set(0, GROUP, false), Ok(false));
        for i in 0..MCAST_JOINED_MAX as u16 {
            m.set(1, emp_uapi::wire::MCAST_BASE + i, true).unwrap();
        }
        assert!(m.set(1, GROUP + 1000, true).unwrap_err().contains("already joined"));
        assert_eq!(m.of(1).len(), MCAST_JOINED_MAX);
    }

    #[test]
    fn mem_wire_multicast_reaches_members_only() {
        let mut w = MemWire::new(&[0, 1, 2, 3, 4], Faults::default());
        let mut rx = vec![VecDeque::new(); 5];
        for d in [0, 1, 2, 4] {
            w.set_membership(d, GROUP, true).unwrap();
        }
        w.send(0, 0, GROUP, ack_frame(0, GROUP));
        assert_eq!(w.poll(0, &mut rx), 3);
        let got: Vec<usize> = rx.iter().map(VecDeque::len).collect();
        assert_eq!(got, [0, 1, 1, 0, 1], "every member but the sender, no non-member");
        let s = w.stats();
        assert_eq!((s.frames, s.mcast_sent, s.received, s.mcast_received), (1, 1, 3, 3), "one transmission");
        w.set_membership(2, GROUP, false).unwrap();
        w.send(0, 1, GROUP, ack_frame(1, GROUP));
        w.poll(0, &mut rx);
        let got: Vec<usize> = rx.iter().map(VecDeque::len).collect();
        assert_eq!(got, [1, 1, 1, 0, 2], "a member that left gets nothing");
        assert!(w.set_membership(0, 3, true).is_err(), "a node id is not a group");
    }

    #[test]
    fn mem_wire_multicast_loss_is_per_receiver() {
        let members = 8;
        let mut w =
            MemWire::new(&(0..=members as u16).collect::<Vec<_>>(), Faults { loss: 0.5, seed: 7, ..Faults::default() });
        let mut rx = vec![VecDeque::new(); members + 1];
        for d in 1..=members {
            w.set_membership(d, GROUP, true).unwrap();
        }
        let sends = 400;
        let mut partial = 0;
        for _ in 0..sends {
            w.send(0, 0, GROUP, ack_frame(0, GROUP));
            let n = w.poll(0, &mut rx);
            partial += (n > 0 && n < members) as u32;
        }
        let s = w.stats();
        assert_eq!((s.frames, s.mcast_sent), (sends, sends));
        assert_eq!(s.received + s.lost, sends * members as u64, "each copy delivered or lost");
        // Independent 50 % losses: all-or-nothing per transmission would make `partial` 0.
        assert!(partial > sends as u32 / 2, "losses independent per receiver: {partial} partial of {sends}");
        for (d, q) in rx.iter().enumerate().skip(1) {
            assert!(q.len() > 100 && q.len() < 300, "member {d} got {} of {sends}", q.len());
        }
    }

    #[test]
    fn mem_wire_counts_what_it_moves() {
        let mut w = MemWire::new(&[0, 1], Faults::default());
        let mut rx = vec![VecDeque::new(), VecDeque::new()];
        w.send(0, 0, 1, ack_frame(0, 1));
        w.send(0, 0, 7, ack_frame(0, 7));
        assert_eq!(w.poll(0, &mut rx), 1);
        let s = w.stats();
        assert_eq!((s.frames, s.received, s.lost), (2, 1, 1));
        assert_eq!(rx[1].len(), 1);
    }
}
