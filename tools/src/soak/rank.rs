//! One rank of `emp soak` (`emp soak-rank`, started by the soak): opens its
//! port as a rank of the job (`Job::from_env`, `Device::open_for_job`),
//! tells the soak its endpoint and remote key, learns its peers' (and their
//! replacements') from the soak, and runs a random, bounded mix of
//! point-to-point messages, remote writes, reads and atomics and, when the
//! soak says so, rounds of NIC collectives, checking every byte it gets.
//!
//! It reports facts, not verdicts: every error completion with the peer it
//! involved, every verification failure, every operation outstanding too
//! long; the soak, which knows which incarnations it killed, decides which
//! errors were expected. Lines to the soak go to stdout, lines from it come
//! on stdin (`super` describes both).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use emp::rdv::Job;
use emp::{
    BarrierAlgo, Buffer, Completion, Device, Dtype, Endpoint, Group, GroupOpts, ReduceOp, RemoteAddr, RemoteKey,
    RemoteWord, Status, Width, ANY, MR_REMOTE_ATOMIC, MR_REMOTE_READ, MR_REMOTE_WRITE,
};

use super::verify::{check_message, fill, first_mismatch, mix, MsgId, OrderCheck, Rng, CLASSES, SEQ_MAX};
use super::{Inject, RankArgs, MAX_RANKS};

/// Receives kept posted per tag class.
const RECVS_PER_CLASS: usize = 3;
/// Sends outstanding at most (each has its own buffer).
const SEND_SLOTS: usize = 4;
/// Remote writes and reads outstanding at most.
const RMA_SLOTS: usize = 2;
/// Remote atomics outstanding at most.
const ATOMIC_SLOTS: usize = 2;
/// Bytes of each source's part of a rank's remote window.
const WINDOW_SLOT: usize = 64 << 10;
/// Where the atomic words start in the window (one 8-byte word per source).
const ATOMIC_BASE: usize = MAX_RANKS * WINDOW_SLOT;
/// Collective operations per round.
const COLL_OPS: usize = 6;
/// Largest broadcast of a round.
const BCAST_MAX: usize = 64 << 10;
/// Largest reduction, in u64 elements.
const REDUCE_MAX: usize = 512;
/// How long the final check waits for messages senders saw complete (a
/// send completes once the receiving NIC has the message, so they are there
/// within moments).
const PHASE_DEADLINE: Duration = Duration::from_secs(10);
/// How long a message from an incarnation not announced yet waits for
/// the soak's announcement.
const PEER_WAIT: Duration = Duration::from_secs(10);
/// Between two STAT lines.
const STAT_EVERY: Duration = Duration::from_millis(500);
/// After a remote access is refused, how long this rank leaves that peer's
/// window alone: a refused key is usually a dead incarnation's, and the
/// target NIC throttles a source refused 16 times in a second for 2 s
/// (its key-guessing guard), which would refuse the replacement's key too.
const REFUSAL_PAUSE: Duration = Duration::from_secs(3);
/// Which message an injected fault hits (the N-th of its kind).
const INJECT_AT: u64 = 50;

/// A peer's current incarnation.
#[derive(Clone, Copy, Debug)]
struct Peer {
    inc: u64,
    ep: Endpoint,
    key: RemoteKey,
}

/// What this rank wrote into its own part of a peer incarnation's window,
/// and the value of its atomic word there: what reads and atomics must find.
struct Shadow {
    inc: u64,
    bytes: Vec<u8>,
    /// False after a write failed (its bytes may or may not have landed).
    valid: bool,
    /// `None` after an atomic failed: the next one resynchronizes.
    counter: Option<u64>,
    /// An operation on this window is outstanding (one at a time keeps the
    /// shadow exact).
    busy: bool,
}

#[derive(Clone, Copy, Debug)]
enum AtomicKind {
    FetchAdd(u64),
    CmpSwap {
        compare: u64,
        swap: u64,
    },
    /// `fetch_add(0)` after a failure: takes the value, checks nothing.
    Resync,
}

#[derive(Clone, Copy, Debug)]
enum CollKind {
    Barrier,
    Bcast { root: usize, len: usize },
    Allreduce { count: usize },
    Reduce { root: usize, count: usize },
}

#[derive(Debug)]
enum Op {
    Send {
        slot: usize,
        dst: usize,
        dinc: u64,
        len: usize,
    },
    /// `posted`: this receive's number among its class's, in posting order.
    Recv {
        slot: usize,
        class: u64,
        posted: u64,
    },
    Write {
        t: usize,
        tinc: u64,
        off: usize,
        len: usize,
        seed: u64,
        local: usize,
    },
    Read {
        t: usize,
        tinc: u64,
        off: usize,
        len: usize,
        local: usize,
    },
    Atomic {
        t: usize,
        tinc: u64,
        kind: AtomicKind,
        local: usize,
    },
    Coll {
        round: u64,
        kind: CollKind,
        index: usize,
    },
}

impl Op {
    /// The peer incarnation an operation targets (not receives or collectives).
    fn peer(&self) -> Option<(usize, u64)> {
        match *self {
            Op::Send { dst, dinc, .. } => Some((dst, dinc)),
            Op::Write { t, tinc, .. } | Op::Read { t, tinc, .. } | Op::Atomic { t, tinc, .. } => Some((t, tinc)),
            Op::Recv { .. } | Op::Coll { .. } => None,
        }
    }
}

struct Pending {
    op: Op,
    posted: Instant,
    hang_reported: bool,
}

/// A round of collectives in progress.
struct Round {
    round: u64,
    group: Group,
    plan: Rng,
    next: usize,
    /// The operation outstanding (at most one: members post in the same order).
    pending: Option<u64>,
}

#[derive(Default)]
struct Counts {
    sends: u64,
    send_bytes: u64,
    recvs: u64,
    recv_bytes: u64,
    writes: u64,
    write_bytes: u64,
    reads: u64,
    read_bytes: u64,
    atomics: u64,
    resyncs: u64,
    stale: u64,
    colls: u64,
    coll_bytes: u64,
    rounds: u64,
}

/// End phases the soak leads the ranks through.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// Waiting for the peer table.
    Init,
    Traffic,
    /// No new operations; report what was sent once the rest completed.
    Stopping(Instant),
    Stopped,
    /// Wait until every expected message arrived.
    Checking(Instant),
    Done,
}

struct Rank {
    me: usize,
    inc: u64,
    size: usize,
    seed: u64,
    max_msg: usize,
    inject: Option<Inject>,
    /// An operation outstanding longer than this is reported as hung (the
    /// NIC's retry budget is ~3 s: it ends one to a live or dead peer long before).
    op_deadline: Duration,
    dev: Device,
    rng: Rng,
    control: Receiver<String>,
    out: std::io::Stdout,
    peers: Vec<Option<Peer>>,
    /// Every incarnation's endpoint ever announced (messages of dead ones
    /// can still arrive).
    history: HashMap<(usize, u64), Endpoint>,
    shadows: Vec<Option<Shadow>>,
    /// Per peer: no remote access before then (see `REFUSAL_PAUSE`).
    rma_paused: Vec<Option<Instant>>,
    next_seq: Vec<u64>,
    /// Sends completed successfully, per (receiver, its incarnation).
    sent_ok: HashMap<(usize, u64), u64>,
    /// Order checks per (sender, its incarnation, tag class): messages that
    /// can match the same receives must not overtake one another (MPI's
    /// rule); those of different classes may.
    order: HashMap<(usize, u64, u64), OrderCheck>,
    /// Receives posted so far, per class.
    recv_posted: [u64; CLASSES as usize],
    /// Peer incarnations an operation of this rank has succeeded on.
    reached: std::collections::HashSet<(usize, u64)>,
    /// Messages verified per (sender, its incarnation).
    received: HashMap<(usize, u64), u64>,
    expected: Vec<((usize, u64), u64)>,
    recv_bufs: Vec<Buffer>,
    send_bufs: Vec<Buffer>,
    send_free: Vec<usize>,
    rma_bufs: Vec<Buffer>,
    rma_free: Vec<usize>,
    atomic_buf: Buffer,
    atomic_free: Vec<usize>,
    window: Buffer,
    bcast_buf: Buffer,
    reduce_send: Buffer,
    reduce_recv: Buffer,
    pending: HashMap<u64, Pending>,
    next_wr: u64,
    round: Option<Round>,
    counts: Counts,
    phase: Phase,
    last_stat: Instant,
    nonempty_sent: u64,
    received_total: u64,
    send_completions: u64,
}

/// `emp soak-rank`: runs until the soak says EXIT (or goes away).
pub fn rank(a: &RankArgs) -> Result<(), String> {
    let job = Job::from_env().map_err(|e| e.to_string())?;
    if job.size > MAX_RANKS {
        return Err(format!("at most {MAX_RANKS} ranks"));
    }
    let mut dev = Device::open_for_job(&job).map_err(|e| e.to_string())?;
    dev.set_spin(Duration::from_micros(5));
    let max_msg = a.max_msg.min(dev.info().msg_max as usize);
    let e = |e: emp::Error| e.to_string();
    let recv_bufs = (0..CLASSES as usize * RECVS_PER_CLASS).map(|_| dev.alloc(max_msg)).collect::<Result<_, _>>();
    let send_bufs = (0..SEND_SLOTS).map(|_| dev.alloc(max_msg)).collect::<Result<_, _>>();
    let rma_bufs = (0..RMA_SLOTS).map(|_| dev.alloc(WINDOW_SLOT)).collect::<Result<_, _>>();
    let window = dev.alloc_mr(ATOMIC_BASE + MAX_RANKS * 8, MR_REMOTE_WRITE | MR_REMOTE_READ | MR_REMOTE_ATOMIC);
    let (tx, control) = mpsc::sync_channel(256);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut r = Rank {
        me: job.rank,
        inc: a.incarnation,
        size: job.size,
        seed: a.seed,
        max_msg,
        inject: a.inject,
        op_deadline: Duration::from_secs(a.op_deadline),
        rng: Rng::new(mix(&[a.seed, job.rank as u64, a.incarnation])),
        control,
        out: std::io::stdout(),
        peers: vec![None; job.size],
        history: HashMap::new(),
        shadows: (0..job.size).map(|_| None).collect(),
        rma_paused: vec![None; job.size],
        next_seq: vec![0; job.size],
        sent_ok: HashMap::new(),
        order: HashMap::new(),
        reached: Default::default(),
        recv_posted: [0; CLASSES as usize],
        received: HashMap::new(),
        expected: Vec::new(),
        recv_bufs: recv_bufs.map_err(e)?,
        send_bufs: send_bufs.map_err(e)?,
        send_free: (0..SEND_SLOTS).collect(),
        rma_bufs: rma_bufs.map_err(e)?,
        rma_free: (0..RMA_SLOTS).collect(),
        atomic_buf: dev.alloc(8 * ATOMIC_SLOTS).map_err(e)?,
        atomic_free: (0..ATOMIC_SLOTS).collect(),
        window: window.map_err(e)?,
        bcast_buf: dev.alloc(BCAST_MAX).map_err(e)?,
        reduce_send: dev.alloc(REDUCE_MAX * 8).map_err(e)?,
        reduce_recv: dev.alloc(REDUCE_MAX * 8).map_err(e)?,
        dev,
        pending: HashMap::new(),
        next_wr: 1,
        round: None,
        counts: Counts::default(),
        phase: Phase::Init,
        last_stat: Instant::now(),
        nonempty_sent: 0,
        received_total: 0,
        send_completions: 0,
    };
    for slot in 0..r.recv_bufs.len() {
        r.post_recv(slot).map_err(e)?;
    }
    let ep = r.dev.endpoint();
    r.say(format_args!("HELLO {} {} {}", ep.node, ep.port, r.window.remote_key().as_u64()));
    r.run()
}

impl Rank {
    fn say(&mut self, line: std::fmt::Arguments) {
        let mut o = self.out.lock();
        // The soak reads these; if it is gone, stdin's end stops us.
        let _ = writeln!(o, "{line}");
        let _ = o.flush();
    }

    fn run(&mut self) -> Result<(), String> {
        let mut wc = [Completion::default(); 32];
        loop {
            loop {
                match self.control.try_recv() {
                    Ok(line) => {
                        if !self.control_line(&line)? {
                            return Ok(());
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return Err("the soak went away".into()),
                }
            }
            if self.phase == Phase::Traffic {
                for _ in 0..2 {
                    self.post_some();
                }
            }
            let mut n = self.dev.poll_cq(&mut wc);
            if n == 0 {
                n = match self.dev.wait_cq(&mut wc, Some(Duration::from_millis(2))) {
                    Ok(n) => n,
                    Err(emp::Error::Timeout) => 0,
                    Err(e) => return Err(format!("waiting for completions: {e}")),
                };
            }
            for c in &wc[..n] {
                self.completion(c)?;
            }
            self.check_deadlines();
            self.advance_phase();
            if self.last_stat.elapsed() >= STAT_EVERY {
                self.stat();
            }
        }
    }

    fn stat(&mut self) {
        self.last_stat = Instant::now();
        let c = &self.counts;
        let line = format!(
            "STAT sends={} send_bytes={} recvs={} recv_bytes={} writes={} write_bytes={} reads={} read_bytes={} \
             atomics={} resyncs={} stale={} colls={} coll_bytes={} rounds={}",
            c.sends,
            c.send_bytes,
            c.recvs,
            c.recv_bytes,
            c.writes,
            c.write_bytes,
            c.reads,
            c.read_bytes,
            c.atomics,
            c.resyncs,
            c.stale,
            c.colls,
            c.coll_bytes,
            c.rounds
        );
        self.say(format_args!("{line}"));
    }

    /// Handles one line from the soak; false on EXIT.
    fn control_line(&mut self, line: &str) -> Result<bool, String> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> Result<u64, String> {
            w.get(i).and_then(|v| v.parse().ok()).ok_or_else(|| format!("bad control line {line:?}"))
        };
        match w.first().copied() {
            Some("PEER") => {
                let (rank, inc) = (num(1)? as usize, num(2)?);
                let ep = Endpoint { node: num(3)? as u16, port: num(4)? as u16 };
                let key = RemoteKey::from_u64(num(5)?);
                if rank >= self.size {
                    return Err(format!("peer rank {rank} out of range"));
                }
                self.history.insert((rank, inc), ep);
                if self.peers[rank].is_none_or(|p| p.inc < inc) {
                    self.peers[rank] = Some(Peer { inc, ep, key });
                    self.next_seq[rank] = 0;
                    self.rma_paused[rank] = None;
                    // A window this rank's predecessor may have written to
                    // (one announced before GO, when this is a replacement)
                    // is unknown until written whole; a new one is zeros.
                    let known = self.phase != Phase::Init || self.inc == 0;
                    self.shadows[rank] = Some(Shadow {
                        inc,
                        bytes: vec![0; WINDOW_SLOT],
                        valid: known,
                        counter: known.then_some(0),
                        busy: false,
                    });
                }
            }
            Some("GO") => self.phase = Phase::Traffic,
            Some("COLL") => {
                let round = num(1)?;
                let members: Option<Vec<Endpoint>> = w.get(2).map(|l| {
                    l.split(',')
                        .filter_map(|m| {
                            let (n, p) = m.split_once(':')?;
                            Some(Endpoint { node: n.parse().ok()?, port: p.parse().ok()? })
                        })
                        .collect()
                });
                let members = members.filter(|m| m.len() == self.size).ok_or(format!("bad COLL line {line:?}"))?;
                self.start_round(round, &members);
            }
            Some("ABORT") => {
                let round = num(1)?;
                if self.round.as_ref().is_some_and(|r| r.round == round) {
                    self.end_round(false, "aborted");
                }
            }
            Some("STOP") => self.phase = Phase::Stopping(Instant::now()),
            Some("EXPECT") => self.expected.push(((num(1)? as usize, num(2)?), num(3)?)),
            Some("CHECK") => self.phase = Phase::Checking(Instant::now()),
            Some("EXIT") => return Ok(false),
            _ => return Err(format!("unknown control line {line:?}")),
        }
        Ok(true)
    }

    fn wr(&mut self, op: Op) -> u64 {
        let wr = self.next_wr;
        self.next_wr += 1;
        self.pending.insert(wr, Pending { op, posted: Instant::now(), hang_reported: false });
        wr
    }

    fn post_recv(&mut self, slot: usize) -> emp::Result<()> {
        let class = (slot / RECVS_PER_CLASS) as u64;
        let (tag, ignore) = MsgId::class_match(class);
        let sge = self.recv_bufs[slot].sge(0, self.max_msg);
        let posted = self.recv_posted[class as usize];
        self.recv_posted[class as usize] += 1;
        let wr = self.wr(Op::Recv { slot, class, posted });
        self.dev.post_recv(wr, ANY, tag, ignore, &[sge]).inspect_err(|_| {
            self.pending.remove(&wr);
        })
    }

    /// A random live peer other than this rank.
    fn pick_peer(&mut self) -> Option<(usize, Peer)> {
        let live: Vec<usize> = (0..self.size).filter(|&t| t != self.me && self.peers[t].is_some()).collect();
        if live.is_empty() {
            return None;
        }
        let t = live[self.rng.range(0, live.len() as u64 - 1) as usize];
        Some((t, self.peers[t].expect("live")))
    }

    /// Message sizes: 0 B to `max_msg`, mostly small (log-uniform in bands).
    fn message_len(&mut self) -> usize {
        let band = self.rng.range(0, 99);
        let (lo, hi) = match band {
            0..=9 => (0, 0),
            10..=49 => (1, 256),
            50..=79 => (257, 64 << 10),
            80..=94 => (64 << 10, 512 << 10),
            _ => (512 << 10, self.max_msg),
        };
        let hi = hi.min(self.max_msg);
        self.rng.range(lo.min(hi) as u64, hi as u64) as usize
    }

    /// Posts one random operation if its bound allows.
    fn post_some(&mut self) {
        let Some((t, peer)) = self.pick_peer() else { return };
        let r = self.post_one(t, peer);
        if let Err(e) = r {
            if !matches!(e, emp::Error::RingFull) {
                self.say(format_args!("ERR post any peer={t}/{} {e}", peer.inc));
            }
        }
    }

    fn post_one(&mut self, t: usize, peer: Peer) -> emp::Result<()> {
        let what = self.rng.range(0, 99);
        if what < 50 {
            let Some(slot) = self.send_free.pop() else { return Ok(()) };
            let len = self.message_len();
            let seq = self.next_seq[t];
            if seq > SEQ_MAX {
                self.send_free.push(slot);
                return Ok(());
            }
            let class = self.rng.range(0, CLASSES - 1);
            let id = MsgId { class, src: self.me as u64, src_inc: self.inc, seq, dst_inc: peer.inc };
            let buf = &mut self.send_bufs[slot];
            fill(id.payload_seed(t as u64, peer.inc, len as u64), &mut buf.as_mut_slice()[..len]);
            if len > 0 {
                self.nonempty_sent += 1;
                if self.inject == Some(Inject::Corrupt) && self.me == 1 && self.nonempty_sent == INJECT_AT {
                    buf.as_mut_slice()[len / 2] ^= 0x40;
                }
            }
            let sges = if len == 0 { vec![] } else { vec![buf.sge(0, len)] };
            let wr = self.wr(Op::Send { slot, dst: t, dinc: peer.inc, len });
            return match self.dev.post_send(wr, peer.ep, id.tag(), &sges) {
                Ok(()) => {
                    self.next_seq[t] += 1;
                    Ok(())
                }
                Err(e) => {
                    self.pending.remove(&wr);
                    self.send_free.push(slot);
                    Err(e)
                }
            };
        }
        if self.rma_paused[t].is_some_and(|until| Instant::now() < until) {
            return Ok(());
        }
        let Some(sh) = self.shadows[t].as_mut().filter(|s| !s.busy && s.inc == peer.inc) else { return Ok(()) };
        let base = self.me * WINDOW_SLOT;
        if what < 80 {
            let Some(local) = self.rma_free.pop() else { return Ok(()) };
            let (off, len) = if sh.valid {
                let len = self.rng.range(1, WINDOW_SLOT as u64) as usize;
                (self.rng.range(0, (WINDOW_SLOT - len) as u64) as usize, len)
            } else {
                (0, WINDOW_SLOT) // Whole, to know it again.
            };
            let at = RemoteAddr { key: peer.key, offset: (base + off) as u64 };
            let sge = self.rma_bufs[local].sge(0, len);
            let write = what < 65 || !sh.valid;
            sh.busy = true;
            let r = if write {
                let seed = mix(&[2, self.me as u64, self.inc, self.next_wr]);
                fill(seed, &mut self.rma_bufs[local].as_mut_slice()[..len]);
                let wr = self.wr(Op::Write { t, tinc: peer.inc, off, len, seed, local });
                self.dev.post_write(wr, peer.ep, &[sge], at).map_err(|e| (wr, e))
            } else {
                let wr = self.wr(Op::Read { t, tinc: peer.inc, off, len, local });
                self.dev.post_read(wr, peer.ep, &[sge], at).map_err(|e| (wr, e))
            };
            if let Err((wr, e)) = r {
                self.pending.remove(&wr);
                self.rma_free.push(local);
                self.shadows[t].as_mut().expect("some").busy = false;
                return Err(e);
            }
            return Ok(());
        }
        let Some(local) = self.atomic_free.pop() else { return Ok(()) };
        let word = RemoteWord { key: peer.key, offset: (ATOMIC_BASE + self.me * 8) as u64, width: Width::W64 };
        let result = self.atomic_buf.sge(local * 8, 8);
        let kind = match sh.counter {
            None => AtomicKind::Resync,
            Some(v) if self.rng.chance(0.5) => {
                let compare = if self.rng.chance(0.5) { v } else { v ^ 1 };
                AtomicKind::CmpSwap { compare, swap: self.rng.next_u64() }
            }
            Some(_) => AtomicKind::FetchAdd(self.rng.range(1, 1 << 40)),
        };
        sh.busy = true;
        let wr = self.wr(Op::Atomic { t, tinc: peer.inc, kind, local });
        let r = match kind {
            AtomicKind::FetchAdd(add) => self.dev.post_fetch_add(wr, peer.ep, word, add, result),
            AtomicKind::Resync => self.dev.post_fetch_add(wr, peer.ep, word, 0, result),
            AtomicKind::CmpSwap { compare, swap } => self.dev.post_cmp_swap(wr, peer.ep, word, compare, swap, result),
        };
        if let Err(e) = r {
            self.pending.remove(&wr);
            self.atomic_free.push(local);
            self.shadows[t].as_mut().expect("some").busy = false;
            return Err(e);
        }
        Ok(())
    }

    /// What an error line adds when no operation on this peer incarnation
    /// has succeeded yet (the soak judges RemotePortClosed by it).
    fn first_word(&self, t: usize, tinc: u64) -> &'static str {
        if self.reached.contains(&(t, tinc)) {
            ""
        } else {
            " first-to-incarnation"
        }
    }

    /// The shadow of peer `t`'s window if it still is incarnation `tinc`'s.
    fn shadow(&mut self, t: usize, tinc: u64) -> Option<&mut Shadow> {
        self.shadows[t].as_mut().filter(|s| s.inc == tinc)
    }

    fn completion(&mut self, c: &Completion) -> Result<(), String> {
        let Some(p) = self.pending.remove(&c.wr_id) else {
            self.say(format_args!("ERR unknown any - completion of a work request never posted: {c:?}"));
            return Ok(());
        };
        let ok = c.status == Status::Success;
        let st = format!("{:?}", c.status);
        if let Some(peer) = p.op.peer() {
            if ok {
                self.reached.insert(peer);
            } else if c.status == Status::RemoteAccessError {
                self.rma_paused[peer.0] = Some(Instant::now() + REFUSAL_PAUSE);
            }
        }
        match p.op {
            Op::Send { slot, dst, dinc, len } => {
                self.send_completions += 1;
                if ok && self.inject == Some(Inject::LoseSend) && self.me == 1 && self.send_completions == INJECT_AT {
                    // Never taken: the send looks outstanding forever.
                    self.pending.insert(c.wr_id, Pending { op: Op::Send { slot, dst, dinc, len }, ..p });
                    return Ok(());
                }
                self.send_free.push(slot);
                if ok {
                    *self.sent_ok.entry((dst, dinc)).or_default() += 1;
                    self.counts.sends += 1;
                    self.counts.send_bytes += len as u64;
                } else {
                    let first = self.first_word(dst, dinc);
                    self.say(format_args!("ERR status:{st} send peer={dst}/{dinc} {len} bytes{first}"));
                }
            }
            Op::Recv { slot, class, posted } => {
                if ok {
                    self.received_total += 1;
                    let lose =
                        self.inject == Some(Inject::LoseRecv) && self.me == 2 && self.received_total == INJECT_AT;
                    if !lose {
                        self.check_recv(c, slot, class, posted)?;
                    }
                } else {
                    // A message meant for this port's previous process (its
                    // tag says which) is that process's business, even here.
                    let meant = MsgId::from_tag(c.tag).and_then(|id| id.dst_incarnation(self.inc));
                    match meant {
                        Some(m) if m != self.inc => {
                            let me = self.me;
                            self.say(format_args!("ERR status:{st} recv peer={me}/{m} tag {:#x} from {}", c.tag, c.src))
                        }
                        _ => self.say(format_args!(
                            "ERR status:{st} recv src={}:{} tag {:#x}",
                            c.src.node, c.src.port, c.tag
                        )),
                    }
                }
                if self.phase != Phase::Done {
                    self.post_recv(slot).map_err(|e| format!("reposting a receive: {e}"))?;
                }
            }
            Op::Write { t, tinc, off, len, seed, local } => {
                self.rma_free.push(local);
                if let Some(sh) = self.shadow(t, tinc) {
                    sh.busy = false;
                    if ok {
                        fill(seed, &mut sh.bytes[off..off + len]);
                        sh.valid |= off == 0 && len == WINDOW_SLOT;
                    } else {
                        sh.valid = false;
                    }
                }
                if ok {
                    self.counts.writes += 1;
                    self.counts.write_bytes += len as u64;
                } else {
                    let first = self.first_word(t, tinc);
                    self.say(format_args!("ERR status:{st} write peer={t}/{tinc} {len} bytes{first}"));
                }
            }
            Op::Read { t, tinc, off, len, local } => {
                self.rma_free.push(local);
                let got = &self.rma_bufs[local].as_slice()[..len];
                let mut bad = None;
                if let Some(sh) = self.shadows[t].as_mut().filter(|s| s.inc == tinc) {
                    sh.busy = false;
                    if ok && sh.valid {
                        bad = got.iter().zip(&sh.bytes[off..off + len]).position(|(a, b)| a != b);
                    }
                }
                if ok {
                    self.counts.reads += 1;
                    self.counts.read_bytes += len as u64;
                } else {
                    let first = self.first_word(t, tinc);
                    self.say(format_args!("ERR status:{st} read peer={t}/{tinc} {len} bytes{first}"));
                }
                if let Some(at) = bad {
                    self.say(format_args!(
                        "ERR verify read peer={t}/{tinc} byte {} of {len} read at offset {off} is not what was written",
                        at
                    ));
                }
            }
            Op::Atomic { t, tinc, kind, local } => {
                self.atomic_free.push(local);
                let word =
                    u64::from_le_bytes(self.atomic_buf.as_slice()[local * 8..local * 8 + 8].try_into().expect("8"));
                let mut bad = None;
                if let Some(sh) = self.shadows[t].as_mut().filter(|s| s.inc == tinc) {
                    sh.busy = false;
                    match (ok, sh.counter, kind) {
                        (false, _, _) => sh.counter = None,
                        (true, _, AtomicKind::Resync) => sh.counter = Some(c.old),
                        (true, Some(v), _) if c.old != v || word != v => {
                            bad = Some(format!("old value {:#x} (result word {word:#x}), expected {v:#x}", c.old));
                            sh.counter = Some(c.old);
                        }
                        (true, Some(v), AtomicKind::FetchAdd(add)) => sh.counter = Some(v.wrapping_add(add)),
                        (true, Some(v), AtomicKind::CmpSwap { compare, swap }) => {
                            sh.counter = Some(if v == compare { swap } else { v })
                        }
                        (true, None, _) => {}
                    }
                }
                if ok {
                    if matches!(kind, AtomicKind::Resync) {
                        self.counts.resyncs += 1;
                    } else {
                        self.counts.atomics += 1;
                    }
                } else {
                    let first = self.first_word(t, tinc);
                    self.say(format_args!("ERR status:{st} atomic peer={t}/{tinc} {kind:?}{first}"));
                }
                if let Some(why) = bad {
                    self.say(format_args!("ERR verify atomic peer={t}/{tinc} {kind:?}: {why}"));
                }
            }
            Op::Coll { round, kind, index } => self.coll_completion(c, round, kind, index),
        }
        Ok(())
    }

    fn check_recv(&mut self, c: &Completion, slot: usize, class: u64, posted: u64) -> Result<(), String> {
        let Some(id) = MsgId::from_tag(c.tag) else {
            self.say(format_args!("ERR verify recv src={}:{} foreign tag {:#x}", c.src.node, c.src.port, c.tag));
            return Ok(());
        };
        let (src, sinc) = (id.src as usize, id.src_inc);
        if id.class != class {
            self.say(format_args!(
                "ERR verify recv peer={src}/{sinc} class {} matched a class {class} receive",
                id.class
            ));
        }
        // Its sender may be a replacement the soak has not announced here yet.
        let until = Instant::now() + PEER_WAIT;
        while !self.history.contains_key(&(src, sinc)) {
            let left = until.saturating_duration_since(Instant::now());
            match self.control.recv_timeout(left) {
                Ok(line) => {
                    if !self.control_line(&line)? {
                        return Err("EXIT while a message was being checked".into());
                    }
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => return Err("the soak went away".into()),
            }
        }
        let Some(&ep) = self.history.get(&(src, sinc)) else {
            self.say(format_args!("ERR verify recv peer={src}/{sinc} from an incarnation never announced ({})", c.src));
            return Ok(());
        };
        if c.src != ep {
            self.say(format_args!("ERR verify recv peer={src}/{sinc} came from {}, not its endpoint {ep}", c.src));
        }
        let bytes = &self.recv_bufs[slot].as_slice()[..(c.byte_len as usize).min(self.max_msg)];
        let Some(meant) = id.dst_incarnation(self.inc) else {
            self.say(format_args!("ERR verify recv peer={src}/{sinc} sent to incarnation {} mod 16", id.dst_inc));
            return Ok(());
        };
        if let Err(why) = check_message(id, self.me as u64, meant, c.msg_len as u64, bytes) {
            self.say(format_args!("ERR verify recv peer={src}/{sinc} seq {}: {why}", id.seq));
            return Ok(());
        }
        if meant != self.inc {
            // Sent to this port's previous process, after the sender's NIC
            // had failed what was queued to it (docs/soak.md).
            let me = self.me;
            self.counts.stale += 1;
            self.say(format_args!(
                "ERR stale recv peer={me}/{meant} seq {} of {src}/{sinc}, {} bytes, reached the next incarnation",
                id.seq, c.byte_len
            ));
            return Ok(());
        }
        if let Err(why) = self.order.entry((src, sinc, id.class)).or_default().take(posted, id.seq) {
            self.say(format_args!("ERR verify order peer={src}/{sinc} class {}: {why}", id.class));
        }
        *self.received.entry((src, sinc)).or_default() += 1;
        self.counts.recvs += 1;
        self.counts.recv_bytes += c.byte_len as u64;
        Ok(())
    }

    fn start_round(&mut self, round: u64, members: &[Endpoint]) {
        if self.round.is_some() {
            self.say(format_args!("ERR unexpected coll round={round} began while another ran"));
            return;
        }
        let opts = GroupOpts::default();
        let id = (round % (u32::MAX as u64 - 1)) as u32 + 1;
        match self.dev.create_group(id, members, &opts) {
            Ok(group) => {
                self.round =
                    Some(Round { round, group, plan: Rng::new(mix(&[3, self.seed, round])), next: 0, pending: None });
                self.next_coll();
            }
            Err(e) => {
                self.say(format_args!("ERR create coll round={round} {e}"));
                self.say(format_args!("COLLFAIL {round}"));
            }
        }
    }

    /// A value every member computes for element `k` of rank `r`'s input.
    fn reduce_input(round: u64, index: usize, r: usize, k: usize) -> u64 {
        mix(&[5, round, index as u64, r as u64, k as u64]) >> 8
    }

    fn next_coll(&mut self) {
        let me = self.me;
        let Some(rd) = self.round.as_mut() else { return };
        if rd.next == COLL_OPS {
            self.counts.rounds += 1;
            self.end_round(true, "done");
            return;
        }
        let n = rd.group.size() as u64;
        let kind = match rd.plan.range(0, 3) {
            0 => CollKind::Barrier,
            1 => CollKind::Bcast {
                root: rd.plan.range(0, n - 1) as usize,
                len: rd.plan.range(1, BCAST_MAX as u64) as usize,
            },
            2 => CollKind::Allreduce { count: rd.plan.range(1, REDUCE_MAX as u64) as usize },
            _ => CollKind::Reduce {
                root: rd.plan.range(0, n - 1) as usize,
                count: rd.plan.range(1, REDUCE_MAX as u64) as usize,
            },
        };
        let (round, index) = (rd.round, rd.next);
        rd.next += 1;
        match kind {
            CollKind::Bcast { root, len } => {
                let b = &mut self.bcast_buf.as_mut_slice()[..len];
                if root == me {
                    fill(mix(&[4, round, index as u64]), b);
                } else {
                    b.fill(0);
                }
            }
            CollKind::Allreduce { count } | CollKind::Reduce { count, .. } => {
                let s = self.reduce_send.as_mut_slice();
                for k in 0..count {
                    s[k * 8..k * 8 + 8].copy_from_slice(&Self::reduce_input(round, index, me, k).to_le_bytes());
                }
                self.reduce_recv.as_mut_slice()[..count * 8].fill(0);
            }
            CollKind::Barrier => {}
        }
        let wr = self.wr(Op::Coll { round, kind, index });
        let rd = self.round.as_mut().expect("some");
        rd.pending = Some(wr);
        let g = &rd.group;
        let r = match kind {
            CollKind::Barrier => self.dev.post_barrier(wr, g, BarrierAlgo::Dissemination),
            CollKind::Bcast { root, len } => self.dev.post_bcast(wr, g, root, &[self.bcast_buf.sge(0, len)]),
            CollKind::Allreduce { count } => self.dev.post_allreduce(
                wr,
                g,
                Dtype::U64,
                ReduceOp::Sum,
                self.reduce_send.sge(0, count * 8),
                self.reduce_recv.sge(0, count * 8),
            ),
            CollKind::Reduce { root, count } => self.dev.post_reduce(
                wr,
                g,
                root,
                Dtype::U64,
                ReduceOp::Sum,
                self.reduce_send.sge(0, count * 8),
                (root == me).then(|| self.reduce_recv.sge(0, count * 8)),
            ),
        };
        if let Err(e) = r {
            self.pending.remove(&wr);
            self.say(format_args!("ERR post coll round={round} {kind:?}: {e}"));
            self.end_round(false, "post failed");
        }
    }

    fn coll_completion(&mut self, c: &Completion, round: u64, kind: CollKind, index: usize) {
        let current = self.round.as_ref().is_some_and(|r| r.round == round && r.pending == Some(c.wr_id));
        if c.status != Status::Success {
            self.say(format_args!("ERR status:{:?} coll round={round} {kind:?}", c.status));
            if current {
                self.end_round(false, "error completion");
            }
            return;
        }
        if !current {
            return; // A round given up already: its late success says nothing.
        }
        let n = self.size;
        let bad = match kind {
            CollKind::Barrier => None,
            CollKind::Bcast { root, len } => {
                self.counts.coll_bytes += len as u64;
                let got = &self.bcast_buf.as_slice()[..len];
                let bad = if root == self.me { None } else { first_mismatch(mix(&[4, round, index as u64]), got) };
                bad.map(|at| format!("byte {at} of {len} differs from the root's"))
            }
            CollKind::Allreduce { count } | CollKind::Reduce { count, .. } => {
                let check = !matches!(kind, CollKind::Reduce { root, .. } if root != self.me);
                let got = self.reduce_recv.as_slice();
                let bad = (0..count).filter(|_| check).find_map(|k| {
                    let want = (0..n).fold(0u64, |a, r| a.wrapping_add(Self::reduce_input(round, index, r, k)));
                    let have = u64::from_le_bytes(got[k * 8..k * 8 + 8].try_into().expect("8"));
                    (have != want).then(|| format!("element {k} of {count} is {have:#x}, the sum is {want:#x}"))
                });
                self.counts.coll_bytes += count as u64 * 8;
                bad
            }
        };
        self.counts.colls += 1;
        if let Some(why) = bad {
            self.say(format_args!("ERR verify coll round={round} {kind:?}: {why}"));
        }
        if let Some(rd) = self.round.as_mut() {
            rd.pending = None;
        }
        self.next_coll();
    }

    /// Ends the current round: removes the group (its unfinished operation
    /// completes `Flushed`) and tells the soak.
    fn end_round(&mut self, ok: bool, why: &str) {
        let Some(rd) = self.round.take() else { return };
        if let Err(e) = self.dev.destroy_group(rd.group) {
            self.say(format_args!("ERR destroy coll round={} {e}", rd.round));
        }
        let word = if ok { "COLLDONE" } else { "COLLFAIL" };
        self.say(format_args!("{word} {} {why}", rd.round));
    }

    fn check_deadlines(&mut self) {
        let now = Instant::now();
        let mut hung = Vec::new();
        for (wr, p) in self.pending.iter_mut() {
            if !matches!(p.op, Op::Recv { .. }) && !p.hang_reported && now.duration_since(p.posted) > self.op_deadline {
                p.hang_reported = true;
                hung.push((*wr, format!("{:?}", p.op)));
            }
        }
        let deadline = self.op_deadline;
        for (wr, op) in hung {
            self.say(format_args!("ERR hang any - work request {wr} outstanding over {deadline:?}: {op}"));
            let stuck_round = self.round.as_ref().filter(|r| r.pending == Some(wr)).map(|r| r.round);
            if stuck_round.is_some() {
                self.end_round(false, "hung");
            }
        }
    }

    fn advance_phase(&mut self) {
        match self.phase {
            Phase::Stopping(since) => {
                let busy = self.pending.values().any(|p| !matches!(p.op, Op::Recv { .. }) && !p.hang_reported);
                let deadline = self.op_deadline;
                if busy && since.elapsed() < deadline {
                    return;
                }
                if busy {
                    self.say(format_args!("ERR hang any - operations still outstanding {deadline:?} after STOP"));
                }
                let mut sent: Vec<_> = self.sent_ok.iter().map(|(&k, &v)| (k, v)).collect();
                sent.sort();
                for ((dst, dinc), n) in sent {
                    self.say(format_args!("SENT {dst} {dinc} {n}"));
                }
                self.stat();
                self.say(format_args!("STOPPED"));
                self.phase = Phase::Stopped;
            }
            Phase::Checking(since) => {
                let count = |k| self.received.get(&k).copied().unwrap_or(0);
                let short = self.expected.iter().any(|&(k, n)| count(k) < n);
                if short && since.elapsed() < PHASE_DEADLINE {
                    return;
                }
                let mut mismatches = Vec::new();
                for &((src, sinc), n) in &self.expected {
                    let got = count((src, sinc));
                    if got != n {
                        mismatches.push(format!(
                            "ERR verify count peer={src}/{sinc} received {got} of the {n} messages it sent successfully"
                        ));
                    }
                }
                for m in mismatches {
                    self.say(format_args!("{m}"));
                }
                self.stat();
                self.say(format_args!("FINAL"));
                self.phase = Phase::Done;
            }
            _ => {}
        }
    }
}
