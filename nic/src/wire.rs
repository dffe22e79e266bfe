//! Wire backends. `mem`: an in-process switch between the NICs of one
//! chassis, with seeded fault injection (loss, duplication, reordering,
//! delay). `udp`: one socket per NIC, peers from the route table; works
//! across hosts without root.

use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

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

/// Wire counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct WireStats {
    /// Frames sent.
    pub frames: u64,
    /// Lost (injected or undeliverable).
    pub lost: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Delayed out of order.
    pub reordered: u64,
}

/// A wire: frames out of local NICs, frames into local NICs' queues.
pub trait Wire: Send {
    /// NIC `src` (local index) transmits to node `dst`.
    fn send(&mut self, now: u64, src: usize, dst: u16, frame: Vec<u8>);
    /// Moves arrived frames into `rx[local index]`; returns how many.
    fn poll(&mut self, now: u64, rx: &mut [VecDeque<Vec<u8>>]) -> usize;
    /// Earliest time a delayed frame is due.
    fn next_due(&self) -> Option<u64>;
    /// Descriptors to sleep on.
    fn fds(&self) -> Vec<RawFd>;
    /// Counters.
    fn stats(&self) -> WireStats;
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

/// Applies faults; returns the copies to deliver with their extra delay.
fn inject(f: &Faults, rng: &mut Prng, stats: &mut WireStats) -> Vec<u64> {
    stats.frames += 1;
    if rng.chance(f.loss) {
        stats.lost += 1;
        return Vec::new();
    }
    let mut out = vec![0];
    if rng.chance(f.reorder) {
        stats.reordered += 1;
        out[0] = 1 + rng.next() % f.jitter_ns.max(1);
    }
    if rng.chance(f.dup) {
        stats.duplicated += 1;
        out.push(rng.next() % f.jitter_ns.max(1));
    }
    out
}

/// The in-process switch.
pub struct MemWire {
    local: HashMap<u16, usize>,
    faults: Faults,
    rng: Prng,
    now_queue: VecDeque<(usize, Vec<u8>)>,
    delayed: BinaryHeap<Delayed>,
    seq: u64,
    stats: WireStats,
}

impl MemWire {
    /// A switch between the given node ids (local index = position).
    pub fn new(nodes: &[u16], faults: Faults) -> MemWire {
        MemWire {
            local: nodes.iter().enumerate().map(|(i, &n)| (n, i)).collect(),
            rng: Prng(faults.seed | 1),
            faults,
            now_queue: VecDeque::new(),
            delayed: BinaryHeap::new(),
            seq: 0,
            stats: WireStats::default(),
        }
    }
}

impl Wire for MemWire {
    fn send(&mut self, now: u64, _src: usize, dst: u16, frame: Vec<u8>) {
        let Some(&d) = self.local.get(&dst) else {
            self.stats.frames += 1;
            self.stats.lost += 1;
            return;
        };
        let copies = inject(&self.faults, &mut self.rng, &mut self.stats);
        let mut frame = Some(frame);
        for (i, delay) in copies.iter().enumerate() {
            // The last copy takes the buffer itself: no copy without faults.
            let f =
                if i + 1 == copies.len() { frame.take().expect("once") } else { frame.as_ref().expect("kept").clone() };
            if *delay == 0 {
                self.now_queue.push_back((d, f));
            } else {
                self.seq += 1;
                self.delayed.push(Delayed { due: now + delay, seq: self.seq, dst: d, frame: f });
            }
        }
    }

    fn poll(&mut self, now: u64, rx: &mut [VecDeque<Vec<u8>>]) -> usize {
        let mut n = 0;
        while let Some((d, f)) = self.now_queue.pop_front() {
            rx[d].push_back(f);
            n += 1;
        }
        while self.delayed.peek().is_some_and(|x| x.due <= now) {
            let Delayed { dst, frame, .. } = self.delayed.pop().expect("peeked");
            rx[dst].push_back(frame);
            n += 1;
        }
        n
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

    fn stats(&self) -> WireStats {
        self.stats
    }
}

/// One UDP socket per local NIC.
pub struct UdpWire {
    socks: Vec<UdpSocket>,
    routes: HashMap<u16, SocketAddr>,
    faults: Faults,
    rng: Prng,
    stats: WireStats,
    buf: Vec<u8>,
}

impl UdpWire {
    /// Binds `binds[i]` for local NIC i; `routes` maps every node to its address.
    pub fn new(binds: &[SocketAddr], routes: HashMap<u16, SocketAddr>, faults: Faults) -> std::io::Result<UdpWire> {
        let socks = binds
            .iter()
            .map(|a| {
                let s = UdpSocket::bind(a)?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(UdpWire {
            socks,
            routes,
            rng: Prng(faults.seed | 1),
            faults,
            stats: WireStats::default(),
            buf: vec![0; 65536],
        })
    }
}

impl Wire for UdpWire {
    fn send(&mut self, _now: u64, src: usize, dst: u16, frame: Vec<u8>) {
        let Some(addr) = self.routes.get(&dst).copied() else {
            self.stats.frames += 1;
            self.stats.lost += 1;
            return;
        };
        // Delays are not modelled on UDP: a delayed copy is sent at once
        // after the others, which still reorders it.
        let copies = inject(&self.faults, &mut self.rng, &mut self.stats);
        for _ in copies {
            // A full socket buffer is a lost frame: reliability recovers it.
            let _ = self.socks[src].send_to(&frame, addr);
        }
    }

    fn poll(&mut self, _now: u64, rx: &mut [VecDeque<Vec<u8>>]) -> usize {
        let mut n = 0;
        for (i, s) in self.socks.iter().enumerate() {
            for _ in 0..64 {
                match s.recv_from(&mut self.buf) {
                    Ok((len, _)) => {
                        rx[i].push_back(self.buf[..len].to_vec());
                        n += 1;
                    }
                    Err(_) => break,
                }
            }
        }
        n
    }

    fn next_due(&self) -> Option<u64> {
        None
    }

    fn fds(&self) -> Vec<RawFd> {
        self.socks.iter().map(|s| s.as_raw_fd()).collect()
    }

    fn stats(&self) -> WireStats {
        self.stats
    }
}
