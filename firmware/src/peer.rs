//! Peers: (local port, remote node, remote port), the unit of sequencing.
//!
//! An entry is kept in three parts, along the line the NIC CPUs split the
//! records on (docs/nic-cpus.md, "The records split between the CPUs"):
//! - [`Peer`]: the key, when it was last used, and the remote atomics
//!   (both directions, a sequence space of their own), in the peer table;
//! - [`PeerSend`]: the send half (sequencing, the messages outstanding,
//!   credits and flow control as the receiver gave them), in
//!   [`SendSide`](crate::SendSide), CPU A's under DSR;
//! - [`PeerRecv`]: the receive half (what is expected next, the messages
//!   being received, refusals, the ACK owed), in
//!   [`RecvSide`](crate::RecvSide), CPU B's under DSR.
//!
//! All three are addressed by one slot, which only the peer table gives
//! out and takes back ([`Nic::peer_for`], [`Nic::free_peers_of`]); a free
//! slot's halves are reset when it is given out again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use emp_uapi::sram::counter;
use emp_uapi::wire;

use crate::Nic;

/// The peer table's part of an entry: its key and what neither half owns.
#[derive(Debug)]
pub(crate) struct Peer {
    pub port: u16,
    pub node: u16,
    pub rport: u16,
    /// Remote atomics, both directions (own sequence space).
    pub atomic: crate::atomic::PeerAtomics,
    /// Last time this entry was looked up (for reclaiming the least
    /// recently used idle entry when the table is full).
    pub last_ns: u64,
}

/// The send half of a peer entry.
#[derive(Debug)]
pub(crate) struct PeerSend {
    pub tx_seq_next: u32,
    /// Outstanding messages to this peer, in sequence order (tx slots).
    pub tx_queue: VecDeque<u32>,
    pub inflight_frames: u32,
    pub credits: u32,
    /// The receiver's last flow-control level (`wire::FC_*`): how much to
    /// slow down below `credits`.
    pub fc_level: u8,
    /// When the receiver said stop (`FC_STOP`): one probe message may go
    /// `rnr_delay_ns_max` later if no update came.
    pub fc_stop_ns: u64,
    /// Modified ACK/NACK: the sender is in Not-to-send until this message is accepted.
    pub not_to_send: Option<u32>,
    pub ready: bool,
    /// The remote port's generation, learned from its ACKs (0 = unknown).
    pub remote_gen: u16,
    /// Last time the send side queued a message to this peer
    /// (`Peer::last_ns` is the table's own lookups).
    pub last_ns: u64,
}

impl PeerSend {
    /// A new entry's send half: nothing sent yet, and until the receiver
    /// has said how much room it has, room for one message.
    pub(crate) fn new() -> PeerSend {
        PeerSend {
            tx_seq_next: 0,
            tx_queue: VecDeque::new(),
            inflight_frames: 0,
            credits: 1,
            fc_level: wire::FC_GO,
            fc_stop_ns: 0,
            not_to_send: None,
            ready: false,
            remote_gen: 0,
            last_ns: 0,
        }
    }

    /// Nothing outstanding, and never sent: the remote end's receive state
    /// does not follow this entry's sequence numbers.
    fn quiet(&self) -> bool {
        self.tx_queue.is_empty() && !self.ready && self.tx_seq_next == 0
    }
}

/// The receive half of a peer entry.
#[derive(Debug)]
pub(crate) struct PeerRecv {
    pub rx_gen: Option<u16>,
    /// Last time a DATA frame of `rx_gen` was admitted.
    pub rx_gen_ns: u64,
    pub rx_expected: u32,
    /// Message the receiver refused for lack of buffers (RNR), if any, and
    /// its tag (PM's record of the refused ⟨sender, message⟩).
    pub rnr_seq: Option<u32>,
    pub rnr_tag: u64,
    /// The refused message is a collective one (lifted by `coll_kick`).
    pub rnr_coll: bool,
    /// Messages being received from this peer (rx slots).
    pub rx_active: Vec<u32>,
    pub last_loss_nack_ns: u64,
    /// Highest message sequence number seen from this sender.
    pub max_seen: u32,
    /// A message from this sender was consumed (matched, taken into the
    /// overflow buffer or by a collective): `rx_expected` now carries
    /// history the sender's next frame does not repeat.
    pub rx_taken: bool,
    /// Retained unexpected headers from this sender (they name this entry).
    pub rdv_entries: u32,
    /// Coalesced ACK owed to this sender (`control.rs`): the last wholly
    /// received message's (sequence, group) whose ACK waits, and how many
    /// messages' ACKs wait with it.
    pub ack_owed: Option<(u32, u32)>,
    pub acks_owed: u32,
    /// This entry is in `RecvSide::ack_due`.
    pub ack_queued: bool,
    /// This sender was told `FC_STOP`: it is sent an update once the port
    /// has room again (lost if the entry is reclaimed: the sender probes).
    pub fc_stop_sent: bool,
    /// Last time a frame of this sender was admitted by the receive side
    /// (`Peer::last_ns` is the table's own lookups).
    pub last_ns: u64,
}

impl PeerRecv {
    /// A new entry's receive half, expecting `rx_floor` next.
    pub(crate) fn new(now: u64, rx_floor: u32) -> PeerRecv {
        PeerRecv {
            rx_gen: None,
            rx_gen_ns: now,
            rx_expected: rx_floor,
            rnr_seq: None,
            rnr_tag: 0,
            rnr_coll: false,
            rx_active: Vec::new(),
            last_loss_nack_ns: 0,
            max_seen: rx_floor,
            rx_taken: false,
            rdv_entries: 0,
            ack_owed: None,
            acks_owed: 0,
            ack_queued: false,
            fc_stop_sent: false,
            last_ns: now,
        }
    }

    /// Nothing being received, held or owed.
    fn quiet(&self) -> bool {
        self.rx_active.is_empty() && self.rdv_entries == 0 && self.ack_owed.is_none()
    }
}

/// Per peer slot: the receive side holds back a coalesced ACK for it
/// (`PeerRecv::ack_owed` is set). A word of the CPUs' common area: the
/// receive side writes it, the send side reads it and has the ACK sent
/// before a data frame to that peer (an answer must never overtake the
/// ACK of what it answers).
#[derive(Debug)]
pub(crate) struct AckHeld(Vec<AtomicU64>);

impl AckHeld {
    pub(crate) fn new(peers: u32) -> AckHeld {
        AckHeld((0..peers.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    /// Read by the send side while the receive side may write it: the
    /// bit is set before the receive's completion is written (release),
    /// so a send the host posted after seeing that completion sees it.
    pub(crate) fn get(&self, i: u32) -> bool {
        self.0[(i / 64) as usize].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }

    /// Only the receive side writes (or the whole program), so a load
    /// and a store suffice: no read-modify-write.
    pub(crate) fn set(&self, i: u32, held: bool) {
        let (w, b) = (&self.0[(i / 64) as usize], 1u64 << (i % 64));
        let v = w.load(Ordering::Relaxed);
        w.store(if held { v | b } else { v & !b }, Ordering::Release);
    }
}

impl Nic {
    /// May entry `i` be dropped and later rebuilt from the next frame
    /// without breaking exactly-once delivery? Never while anything is
    /// outstanding, nor once it has sent (the remote end's receive state
    /// follows our sequence numbers) or answered atomics (its replay
    /// cache). An entry that consumed messages only after `rx_idle_ns`
    /// without a frame: longer than the sender's whole retry budget, so
    /// every message it had was acknowledged or abandoned and the floor
    /// its next frame carries says where to resume.
    fn reclaimable(&self, i: u32, now: u64, rx_idle_ns: u64) -> bool {
        let p = self.peer(i);
        let recv = self.recv.peer(i);
        let quiet = self.send.peer(i).quiet()
            && recv.quiet()
            && p.atomic.seq_next == 0
            && p.atomic.queue.is_empty()
            && p.atomic.rx.is_none();
        quiet && (!recv.rx_taken || now.saturating_sub(self.last_used(i)) >= rx_idle_ns)
    }

    /// When entry `i` was last used, by the table's lookups or either side.
    fn last_used(&self, i: u32) -> u64 {
        self.peer(i).last_ns.max(self.send.peer(i).last_ns).max(self.recv.peer(i).last_ns)
    }

    /// Looks up a peer entry.
    pub(crate) fn find_peer(&self, port: u16, node: u16, rport: u16) -> Option<u32> {
        self.peer_index.get(&(port, node, rport)).copied()
    }

    /// Finds or creates a peer entry, reclaiming the least recently used
    /// reclaimable one ([`Nic::reclaimable`]) when the table is full;
    /// `None` when none is.
    pub(crate) fn peer_for(&mut self, now: u64, port: u16, node: u16, rport: u16, rx_floor: u32) -> Option<u32> {
        if let Some(i) = self.find_peer(port, node, rport) {
            self.peer_mut(i).last_ns = now;
            return Some(i);
        }
        if self.peer_free.is_empty() {
            self.reclaim_peer(now);
        }
        let i = self.peer_free.pop()?;
        let p = Peer { port, node, rport, atomic: Default::default(), last_ns: now };
        self.install_peer(i, p, PeerSend::new(), PeerRecv::new(now, rx_floor));
        Some(i)
    }

    /// Puts an entry, in its three parts, into free slot `i` (taken from
    /// `peer_free`) and indexes it.
    pub(crate) fn install_peer(&mut self, i: u32, p: Peer, send: PeerSend, recv: PeerRecv) {
        debug_assert!(self.peers[i as usize].is_none(), "peer slot {i} is free");
        self.peer_index.insert((p.port, p.node, p.rport), i);
        self.peers[i as usize] = Some(p);
        self.ack_held.set(i, recv.ack_owed.is_some());
        self.send.peers[i as usize] = send;
        self.recv.peers[i as usize] = recv;
    }

    /// Frees the least recently used reclaimable peer entry, if any. Runs
    /// only when the table is full: one scan of it.
    fn reclaim_peer(&mut self, now: u64) {
        let idle = self.cfg.rx_idle_timeout_ns;
        let victim = self
            .live_peers()
            .filter(|&(i, _)| self.reclaimable(i, now, idle))
            .min_by_key(|&(i, _)| (self.last_used(i), i))
            .map(|(i, _)| i);
        let Some(i) = victim else { return };
        self.remove_peer(i);
        self.recv.ack_due.retain(|&(_, x)| x != i);
        self.count(counter::PEERS_RECLAIMED, 1);
    }

    /// Takes entry `i` out of the table and its index.
    fn remove_peer(&mut self, i: u32) {
        let p = self.peers[i as usize].take().expect("indexed peer is live");
        self.peer_index.remove(&(p.port, p.node, p.rport));
        self.peer_free.push(i);
    }

    /// The peer table's part of live entry `i`.
    pub(crate) fn peer(&self, i: u32) -> &Peer {
        self.peers[i as usize].as_ref().expect("live peer")
    }

    pub(crate) fn peer_mut(&mut self, i: u32) -> &mut Peer {
        self.peers[i as usize].as_mut().expect("live peer")
    }

    /// Is slot `i` a live entry?
    pub(crate) fn peer_live(&self, i: u32) -> bool {
        self.peers.get(i as usize).is_some_and(Option::is_some)
    }

    /// Frees every peer entry of a closed port (their records are gone).
    pub(crate) fn free_peers_of(&mut self, port: u16) {
        for i in 0..self.peers.len() as u32 {
            if self.peers[i as usize].as_ref().is_some_and(|p| p.port == port) {
                debug_assert!(
                    self.send.peer(i).tx_queue.is_empty()
                        && self.recv.peer(i).rx_active.is_empty()
                        && self.peer(i).atomic.queue.is_empty()
                );
                debug_assert_eq!(self.recv.peer(i).rdv_entries, 0);
                self.remove_peer(i);
            }
        }
        let live = |i: u32| self.peers[i as usize].is_some();
        self.send.ready.retain(|&i| live(i));
        self.recv.ack_due.retain(|&(_, i)| live(i));
    }

    /// Live peer entries (by the index: the table itself is mostly empty,
    /// and the invariants walk it after every handler in debug runs).
    pub(crate) fn live_peers(&self) -> impl Iterator<Item = (u32, &Peer)> {
        self.peer_index.values().map(|&i| {
            let p = self.peers[i as usize].as_ref();
            (i, p.expect("indexed peer is live"))
        })
    }
}
