//! Seeded random fuzzing of the control program's untrusted inputs through
//! the simulator: wire frames (forged and mutated from valid ones) and work
//! descriptors (mutated from valid ones, or random bytes). No coverage
//! guidance (`cargo fuzz` needs a nightly toolchain): volume instead, every
//! execution reproducible from its seed.
//!
//! One execution boots a 3-node cluster, throws a batch of inputs at node 1
//! (frames) or into node 0's rings (descriptors), and then checks: no
//! panic, every NIC's invariants hold after each batch step, and the NICs
//! still serve a legitimate exchange between ports nobody forged.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use emp_firmware::Config;
use emp_uapi::desc::{Cqe, Opcode, Sge, Status, WorkDesc, SGE_MAX, WD_FLAGS_ALL};
use emp_uapi::wire::{self, AckBody, AtomicBody, FrameHeader, FrameKind, MsgHeader};
use emp_uapi::{Le, ANY_NODE, ANY_PORT};

use crate::cluster::Cluster;
use crate::rng::Rng;
use crate::world::WireConfig;

/// What a run throws inputs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Wire frames delivered to a live control program.
    Frames,
    /// Work descriptors posted into a port's send and receive rings.
    Descriptors,
}

/// Inputs per execution.
const BATCH: usize = 64;
/// Nodes: 0 and 1 take the inputs (as forged source and target, or as the
/// port whose rings get them); 2 and 1 / 2 and 0 make the legitimate check.
const NODES: u16 = 3;
const MS: u64 = 1_000_000;

/// A run's result.
#[derive(Debug, Default)]
pub struct Report {
    /// Executions done.
    pub executions: u64,
    /// Inputs thrown (frames or descriptors).
    pub inputs: u64,
    /// Failures: (execution seed, what went wrong). Replay one with [`execute`].
    pub crashes: Vec<(u64, String)>,
}

/// The seed of execution `i` of a run seeded `seed`.
pub fn execution_seed(seed: u64, i: u64) -> u64 {
    Rng::new(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64()
}

/// Runs executions of `target` until `budget` elapsed or `max_executions`
/// were done, whichever first; stops collecting after 16 crashes.
pub fn run(target: Target, seed: u64, budget: Duration, max_executions: u64) -> Report {
    let start = Instant::now();
    let mut r = Report::default();
    while r.executions < max_executions && start.elapsed() < budget && r.crashes.len() < 16 {
        let s = execution_seed(seed, r.executions);
        match execute(target, s) {
            Ok(n) => r.inputs += n,
            Err(e) => r.crashes.push((s, e)),
        }
        r.executions += 1;
    }
    r
}

/// One execution; `Ok(inputs thrown)`, or what failed (a panic included).
pub fn execute(target: Target, seed: u64) -> Result<u64, String> {
    let out = catch_unwind(AssertUnwindSafe(|| {
        let mut rng = Rng::new(seed);
        let mut c = Cluster::new(NODES, Config::default(), 0, 1500, WireConfig::default());
        // Some legitimate traffic first, so sessions and peers exist.
        legitimate_exchange(&mut c, 0, 1, 1)?;
        let n = match target {
            Target::Frames => throw_frames(&mut c, &mut rng)?,
            Target::Descriptors => throw_descriptors(&mut c, &mut rng)?,
        };
        // Node 2 was never forged nor fed bad descriptors: its exchanges
        // with both victims must still work. (Not 2 -> 0: node 0's receive
        // ring may hold fuzzed any-source receives that rightly take it.)
        legitimate_exchange(&mut c, 2, 1, 2)?;
        legitimate_exchange(&mut c, 1, 2, 3)?;
        legitimate_exchange(&mut c, 0, 2, 4)?;
        invariants(&c)?;
        Ok(n)
    }));
    match out {
        Ok(r) => r,
        Err(p) => Err(format!(
            "panic: {}",
            p.downcast_ref::<String>().map(String::as_str).or(p.downcast_ref::<&str>().copied()).unwrap_or("?")
        )),
    }
}

fn invariants(c: &Cluster) -> Result<(), String> {
    for (i, n) in c.world.nodes.iter().enumerate() {
        n.nic.invariants().map_err(|e| format!("node {i}: invariant broken: {e}"))?;
    }
    Ok(())
}

/// A send from `src` to `dst` with a tag nobody else uses, and its receive,
/// both complete with the bytes.
fn legitimate_exchange(c: &mut Cluster, src: u16, dst: u16, round: u64) -> Result<(), String> {
    let tag = 0x600D_0000_0000 + round;
    let payload: Vec<u8> = (0..200u32).map(|i| (i as u64 * 7 + round) as u8).collect();
    let r = c.recv(dst, (src, 0), tag, 0, payload.len() as u64);
    let s = c.send(src, dst, tag, &payload);
    let ok = |x: Option<Cqe>, what: &str| match x {
        Some(q) if Status::from_u8(q.status) == Some(Status::Success) => Ok(q),
        Some(q) => Err(format!("legitimate {what} {src}->{dst} failed: status {:?}", Status::from_u8(q.status))),
        None => Err(format!("legitimate {what} {src}->{dst} never completed")),
    };
    let state = |c: &Cluster| {
        let o = |n: u16| c.world.nodes[n as usize].nic.occupancy();
        format!("node {src}: {:?}; node {dst}: {:?}", o(src), o(dst))
    };
    let sent = c.wait(src, s, 4_000 * MS);
    ok(sent, "send").map_err(|e| format!("{e}; {}", state(c)))?;
    let got = c.wait(dst, r, 4_000 * MS);
    ok(got, "receive").map_err(|e| format!("{e}; {}", state(c)))?;
    if c.received(r, payload.len()) != payload {
        return Err(format!("legitimate message {src}->{dst} arrived corrupted"));
    }
    Ok(())
}

/// A plausible source: a real node (0 or the target itself) or a stranger.
fn source(rng: &mut Rng) -> (u16, u16) {
    let node = match rng.below(8) {
        0..=4 => 0,
        5 => 1,
        6 => NODES + rng.below(100) as u16,
        _ => rng.next_u64() as u16,
    };
    let port = if rng.chance(0.8) { 0 } else { rng.below(5) as u16 };
    (node, port)
}

fn small(rng: &mut Rng, typical: u64) -> u64 {
    match rng.below(10) {
        0 => rng.next_u64(),
        1 => u64::MAX - rng.below(3),
        _ => rng.below(typical + 1),
    }
}

/// A well-formed frame of a random kind from a plausible source to node 1.
fn valid_frame(rng: &mut Rng, out: &mut [u8]) -> usize {
    let kind = [FrameKind::Data, FrameKind::Ack, FrameKind::Nack, FrameKind::CollData, FrameKind::AtomicReq]
        [rng.below(5) as usize];
    let src = source(rng);
    let frame_count = 1 + small(rng, 4) as u32 % 64;
    let hdr = FrameHeader {
        version: wire::WIRE_VERSION,
        kind: kind as u8,
        src_node: src.0,
        src_port: src.1,
        dst_node: 1,
        dst_port: if rng.chance(0.9) { 0 } else { rng.below(6) as u16 },
        src_gen: small(rng, 8) as u16,
        dst_gen: small(rng, 8) as u16,
        msg_seq: small(rng, 8) as u32,
        tx_floor: small(rng, 8) as u32,
        frame_index: (small(rng, 4) as u32) % frame_count.max(1),
        frame_count,
        ..Default::default()
    };
    match kind {
        FrameKind::Data | FrameKind::CollData => {
            let len = rng.below(1200) as usize;
            let hdr = FrameHeader { payload_len: len as u16, ..hdr };
            let msg = MsgHeader::new(small(rng, 16), small(rng, 4096), None);
            let first = hdr.frame_index == 0;
            let head = wire::emit_data_headers(&hdr, first.then_some(&msg), out).unwrap_or(0);
            let end = (head + len).min(out.len());
            for b in &mut out[head..end] {
                *b = rng.next_u64() as u8;
            }
            end
        }
        FrameKind::Ack | FrameKind::Nack => {
            let body = AckBody {
                group: small(rng, 8) as u32,
                missing_mask: rng.next_u64() as u32,
                rx_credits: small(rng, 64) as u16,
                reason: if kind == FrameKind::Nack { rng.below(9) as u8 } else { 0 },
                fc_level: rng.below(4) as u8,
                rx_expected: small(rng, 8) as u32,
            };
            wire::emit_ack(&hdr, &body, out).unwrap_or(0)
        }
        _ => {
            let body = AtomicBody {
                op: rng.below(5) as u8,
                width: [4, 8, 8, 3, 0][rng.below(5) as usize],
                rkey: small(rng, 0x0011_0010) as u32,
                offset: small(rng, 4096) & !3,
                operand: rng.next_u64(),
                ..Default::default()
            };
            wire::emit_atomic_req(&hdr, &body, out).unwrap_or(0)
        }
    }
}

/// Flips, overwrites, truncates or extends a valid frame.
fn mutate(rng: &mut Rng, buf: &mut [u8], mut len: usize) -> usize {
    for _ in 0..1 + rng.below(4) {
        match rng.below(5) {
            0 if len > 0 => {
                let i = rng.below(len as u64) as usize;
                buf[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len as u64) as usize;
                buf[i] = [0, 0xff, 0x7f, 0x80, 1][rng.below(5) as usize];
            }
            2 => len = rng.below(len as u64 + 1) as usize,
            3 => {
                let extra = rng.below(64) as usize;
                let end = (len + extra).min(buf.len());
                for b in &mut buf[len..end] {
                    *b = rng.next_u64() as u8;
                }
                len = end;
            }
            _ if len >= 32 => {
                // A header field to an edge value (the header is 32 bytes).
                let i = rng.below(16) as usize * 2;
                let v = [0u16, 1, 0xffff, 0x7fff][rng.below(4) as usize].to_le_bytes();
                buf[i..i + 2].copy_from_slice(&v);
            }
            _ => {}
        }
    }
    len
}

fn throw_frames(c: &mut Cluster, rng: &mut Rng) -> Result<u64, String> {
    // Receives the forged messages may land in (as real ones would).
    // Any source, but tags below 2^16 only: not the legitimate check's.
    c.recv(1, (ANY_NODE, ANY_PORT), 0, 0xffff, 4096);
    c.recv(1, (0, 0), 3, 0, 64);
    let mut buf = [0u8; 1600];
    for _ in 0..BATCH {
        let len = match rng.below(10) {
            0 => {
                let len = rng.below(buf.len() as u64) as usize;
                for b in &mut buf[..len] {
                    *b = rng.next_u64() as u8;
                }
                len
            }
            1..=3 => valid_frame(rng, &mut buf),
            _ => {
                let len = valid_frame(rng, &mut buf);
                mutate(rng, &mut buf, len)
            }
        };
        c.world.inject_frame(1, &buf[..len]);
        c.run_for(rng.below(50_000));
        invariants(c)?;
    }
    c.run_for(10 * MS);
    c.completions(1);
    c.completions(0);
    Ok(BATCH as u64)
}

/// A valid descriptor of a random opcode over node 0's data region.
fn valid_desc(c: &Cluster, rng: &mut Rng) -> WorkDesc {
    let key = c.data_key(0);
    let ops = [
        Opcode::Send,
        Opcode::Recv,
        Opcode::AtomicFetchAdd,
        Opcode::AtomicCmpSwap,
        Opcode::AtomicSwap,
        // Collectives on group slots nobody set up.
        Opcode::MultiSend,
        Opcode::Bcast,
        Opcode::Barrier,
        Opcode::Reduce,
        Opcode::Allreduce,
    ];
    let op = ops[rng.below(ops.len() as u64) as usize];
    let num_sge = rng.below(SGE_MAX as u64 + 1) as u8;
    let mut d = WorkDesc {
        opcode: op as u8,
        flags: (rng.next_u64() as u8) & WD_FLAGS_ALL,
        num_sge,
        node: if rng.chance(0.7) { 1 } else { small(rng, 4) as u16 },
        port: if rng.chance(0.8) { 0 } else { small(rng, 4) as u16 },
        tag: small(rng, 16),
        ignore: if op == Opcode::Recv { small(rng, 0) } else { 0 },
        ..Default::default()
    };
    for s in &mut d.sge[..num_sge as usize] {
        *s = Sge {
            key: if rng.chance(0.8) { key } else { small(rng, 0x0011_0010) as u32 },
            len: small(rng, 2048) as u32,
            offset: small(rng, 1 << 16),
        };
    }
    if op.is_atomic() {
        d.node = 1;
        d.tag = rng.next_u64(); // operand
        d.ignore = rng.next_u64(); // compare
        d.sge[0] = Sge { key, len: [4, 8, 8, 3][rng.below(4) as usize], offset: small(rng, 4096) & !7 };
        d.num_sge = if rng.chance(0.9) { 1 } else { rng.below(SGE_MAX as u64 + 2) as u8 };
    }
    d
}

fn throw_descriptors(c: &mut Cluster, rng: &mut Rng) -> Result<u64, String> {
    for _ in 0..BATCH {
        let mut d = valid_desc(c, rng);
        match rng.below(4) {
            0 => {
                // Random bytes in a descriptor slot.
                let mut b = [0u8; WorkDesc::SIZE];
                for x in &mut b {
                    *x = rng.next_u64() as u8;
                }
                d = WorkDesc::decode(&b).unwrap_or_default();
            }
            1 => {
                let mut b = [0u8; WorkDesc::SIZE];
                d.put(&mut b);
                let len = mutate(rng, &mut b, WorkDesc::SIZE);
                b[len.min(WorkDesc::SIZE)..].fill(0);
                d = WorkDesc::decode(&b).unwrap_or_default();
            }
            _ => {}
        }
        // Node 2 is the witness: fuzzed work never names it, as a message
        // it has no receive for would rightly hold back node 0's later
        // messages to it (matching is in order per sender).
        if d.node == 2 {
            d.node = 1;
        }
        let send = d.opcode != Opcode::Recv as u8 || rng.chance(0.1);
        c.post_raw(0, d, send);
        c.run_for(rng.below(100_000));
        invariants(c)?;
    }
    // Let what was posted finish or give up (the retry budget is ~2.9 s).
    c.run_for(3_500 * MS);
    c.completions(0);
    c.completions(1);
    Ok(BATCH as u64)
}
