//! The host-based baseline NIC atomics are measured against (seed 001
//! §5.1, ARMCI's server thread): fetch-and-add, compare-and-swap and swap
//! requests travel as ordinary tagged EMP messages to a server loop on the
//! target's CPU, which performs them with CPU atomics on its memory and
//! answers with another message. Seven steps where the NIC needs none on
//! the target host (request in, receive, compute, reply out, and an ACK
//! each way on the wire).
//!
//! Reserved: tags whose top byte is `0xEA` ([`REQ_TAG`], [`RESP_TAG`]) on
//! the endpoints involved, and work request ids with bit 63 set. The
//! server's receives stay posted until the port closes; they match only
//! the reserved request tag.

use std::time::{Duration, Instant};

use crate::atomic::Width;
use crate::{Buffer, Device, Endpoint, Error, Result, Status, ANY};

/// Tag of a request message.
pub const REQ_TAG: u64 = 0xEA00_0000_0000_0000;
/// Tag of a reply, plus the request's sequence number in the low 32 bits.
pub const RESP_TAG: u64 = 0xEA01_0000_0000_0000;
/// Work request ids of the server (bit 63 = library).
const SERVER_WR: u64 = 1 << 63 | 0xEA << 48;
/// Server reply sends: SERVER_WR | REPLY_BIT | request number.
const REPLY_BIT: u64 = 1 << 47;
/// Work request ids of a client.
const CLIENT_WR: u64 = 1 << 63 | 0xEB << 48;

/// Bytes of a request: op, width, 2 reserved, seq u32, offset, operand, compare.
const REQ_LEN: usize = 32;
/// Bytes of a reply: status, 7 reserved, old.
const RESP_LEN: usize = 16;

/// The operations (same numbers as `emp_uapi::wire::atomic_op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum HostOp {
    /// word += operand.
    FetchAdd = 1,
    /// word = operand if word == compare.
    CmpSwap = 2,
    /// word = operand.
    Swap = 3,
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Serves atomics on `words` (offsets are into it) from its own CPU.
pub struct HostAtomicServer {
    words: Buffer,
    reqs: Buffer,
    reps: Buffer,
    slots: u64,
    /// Requests taken so far (= the receive to complete next).
    next: u64,
}

impl HostAtomicServer {
    /// Posts `slots` receives for requests (at least 1; each holds one
    /// request until the server takes it).
    pub fn new(dev: &mut Device, words: Buffer, slots: usize) -> Result<HostAtomicServer> {
        if slots == 0 {
            return Err(Error::invalid("host atomic server: slots must be > 0"));
        }
        let reqs = dev.alloc(slots * REQ_LEN)?;
        let reps = dev.alloc(slots * RESP_LEN)?;
        let s = HostAtomicServer { words, reqs, reps, slots: slots as u64, next: 0 };
        for k in 0..s.slots {
            s.post_slot(dev, k)?;
        }
        Ok(s)
    }

    /// Requests served so far.
    pub fn served(&self) -> u64 {
        self.next
    }

    /// The words served, for the owner's own (atomic) loads and stores.
    pub fn words(&self) -> &Buffer {
        &self.words
    }

    fn post_slot(&self, dev: &mut Device, k: u64) -> Result<()> {
        let i = (k % self.slots) as usize;
        // Receives match in posting order: request k lands in receive k.
        dev.post_recv(SERVER_WR | k, ANY, REQ_TAG, 0, &[self.reqs.sge(i * REQ_LEN, REQ_LEN)])
    }

    /// Waits up to `timeout` (`None` = forever) for one request, performs
    /// it and replies. Returns false when none came in time.
    pub fn serve_one(&mut self, dev: &mut Device, timeout: Option<Duration>) -> Result<bool> {
        match dev.wait_wr(SERVER_WR | self.next, timeout) {
            Ok(c) => self.handle(dev, c).map(|()| true),
            Err(Error::Timeout) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Serves one request if one has arrived (a polling server loop);
    /// returns false when none was there.
    pub fn try_serve_one(&mut self, dev: &mut Device) -> Result<bool> {
        match dev.poll_wr(SERVER_WR | self.next) {
            Some(c) => self.handle(dev, c).map(|()| true),
            None => Ok(false),
        }
    }

    /// Performs the request that completed receive `c` and replies.
    fn handle(&mut self, dev: &mut Device, c: crate::Completion) -> Result<()> {
        let k = self.next;
        debug_assert_eq!(c.wr_id, SERVER_WR | k);
        let i = (k % self.slots) as usize;
        let mut req = [0u8; REQ_LEN];
        req.copy_from_slice(&self.reqs.as_slice()[i * REQ_LEN..(i + 1) * REQ_LEN]);
        self.next += 1;
        self.post_slot(dev, k + self.slots)?;
        if c.status != Status::Success {
            return Err(Error::Failed(c.status));
        }
        let (status, old) =
            if c.byte_len as usize == REQ_LEN { self.execute(&req) } else { (Status::BadDescriptor, 0) };
        // The reply buffer of slot i was last used by request k - slots.
        if k >= self.slots {
            let prev = dev.wait_wr(SERVER_WR | REPLY_BIT | (k - self.slots), None)?;
            if prev.status != Status::Success && prev.status != Status::RemotePortClosed {
                return Err(Error::Failed(prev.status));
            }
        }
        let rep = &mut self.reps.as_mut_slice()[i * RESP_LEN..(i + 1) * RESP_LEN];
        rep.fill(0);
        rep[0] = status as u8;
        put_u64(rep, 8, old);
        let seq = u32::from_le_bytes(req[4..8].try_into().expect("4 bytes")) as u64;
        dev.post_send(SERVER_WR | REPLY_BIT | k, c.src, RESP_TAG | seq, &[self.reps.sge(i * RESP_LEN, RESP_LEN)])
    }

    /// The operation, with the CPU's atomics (atomic with respect to other
    /// threads of this host, not to NIC atomics on the same word).
    fn execute(&self, req: &[u8; REQ_LEN]) -> (Status, u64) {
        let (op, width, off) = (req[0], Width::from_bytes(req[1] as u32), get_u64(req, 8));
        let (operand, compare) = (get_u64(req, 16), get_u64(req, 24));
        let Some(width) = width else { return (Status::RemoteAccessError, 0) };
        let w = width.bytes() as u64;
        let fits = off.is_multiple_of(w) && off.checked_add(w).is_some_and(|e| e <= self.words.len() as u64);
        if !fits || req[2..4] != [0, 0] {
            return (Status::RemoteAccessError, 0);
        }
        use std::sync::atomic::Ordering::SeqCst;
        let off = off as usize;
        let old = match (op, width) {
            (1, Width::W64) => self.words.atomic_u64(off).fetch_add(operand, SeqCst),
            (2, Width::W64) => {
                self.words.atomic_u64(off).compare_exchange(compare, operand, SeqCst, SeqCst).unwrap_or_else(|v| v)
            }
            (3, Width::W64) => self.words.atomic_u64(off).swap(operand, SeqCst),
            (1, Width::W32) => self.words.atomic_u32(off).fetch_add(operand as u32, SeqCst) as u64,
            (2, Width::W32) => {
                let a = self.words.atomic_u32(off);
                a.compare_exchange(compare as u32, operand as u32, SeqCst, SeqCst).unwrap_or_else(|v| v) as u64
            }
            (3, Width::W32) => self.words.atomic_u32(off).swap(operand as u32, SeqCst) as u64,
            _ => return (Status::BadDescriptor, 0),
        };
        (Status::Success, old)
    }
}

/// Sends requests to a [`HostAtomicServer`] and waits for the answers.
pub struct HostAtomicClient {
    req: Buffer,
    rep: Buffer,
    seq: u32,
    poll: bool,
}

/// How long a polling client waits for an answer.
const POLL_LIMIT: Duration = Duration::from_secs(60);

impl HostAtomicClient {
    /// A client with its own request and reply buffers; it waits for
    /// answers like [`Device::wait_wr`] (spin, then sleep on the event).
    pub fn new(dev: &mut Device) -> Result<HostAtomicClient> {
        Ok(HostAtomicClient { req: dev.alloc(REQ_LEN)?, rep: dev.alloc(RESP_LEN)?, seq: 0, poll: false })
    }

    /// Waits by polling (yielding the CPU between polls) instead.
    pub fn polling(mut self, poll: bool) -> HostAtomicClient {
        self.poll = poll;
        self
    }

    fn wait(&self, dev: &mut Device, wr: u64) -> Result<crate::Completion> {
        if !self.poll {
            return dev.wait_wr(wr, None);
        }
        let end = Instant::now() + POLL_LIMIT;
        loop {
            if let Some(c) = dev.poll_wr(wr) {
                return Ok(c);
            }
            if Instant::now() > end {
                return Err(Error::Timeout);
            }
            std::thread::yield_now();
        }
    }

    /// word += add at `offset` of the server's words; returns the old value.
    pub fn fetch_add(
        &mut self,
        dev: &mut Device,
        server: Endpoint,
        offset: u64,
        width: Width,
        add: u64,
    ) -> Result<u64> {
        self.call(dev, server, HostOp::FetchAdd, offset, width, add, 0)
    }

    /// word = swap if word == compare; returns the old value.
    pub fn cmp_swap(
        &mut self,
        dev: &mut Device,
        server: Endpoint,
        offset: u64,
        width: Width,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        self.call(dev, server, HostOp::CmpSwap, offset, width, swap, compare)
    }

    /// word = value; returns the old value.
    pub fn swap(&mut self, dev: &mut Device, server: Endpoint, offset: u64, width: Width, value: u64) -> Result<u64> {
        self.call(dev, server, HostOp::Swap, offset, width, value, 0)
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        dev: &mut Device,
        server: Endpoint,
        op: HostOp,
        offset: u64,
        width: Width,
        operand: u64,
        compare: u64,
    ) -> Result<u64> {
        self.seq = self.seq.wrapping_add(1);
        let (recv_wr, send_wr) = (CLIENT_WR | 1, CLIENT_WR | 2);
        dev.post_recv(recv_wr, server, RESP_TAG | self.seq as u64, 0, &[self.rep.sge(0, RESP_LEN)])?;
        let b = self.req.as_mut_slice();
        b.fill(0);
        b[0] = op as u8;
        b[1] = width.bytes() as u8;
        b[4..8].copy_from_slice(&self.seq.to_le_bytes());
        put_u64(b, 8, offset);
        put_u64(b, 16, operand);
        put_u64(b, 24, compare);
        dev.post_send(send_wr, server, REQ_TAG, &[self.req.sge(0, REQ_LEN)])?;
        let sent = self.wait(dev, send_wr)?;
        if sent.status != Status::Success {
            // The reply can never come: the receive stays posted under a
            // tag no one will use again.
            return Err(Error::Failed(sent.status));
        }
        let got = self.wait(dev, recv_wr)?;
        if got.status != Status::Success {
            return Err(Error::Failed(got.status));
        }
        let r = self.rep.as_slice();
        match Status::from_u8(r[0]) {
            Some(Status::Success) => Ok(get_u64(r, 8)),
            Some(s) => Err(Error::Failed(s)),
            None => Err(Error::Protocol(format!("host atomic reply with status byte {}", r[0]))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server over plain memory (no device: `execute` only).
    fn server(words: &mut [u64]) -> HostAtomicServer {
        let b = |ptr: *mut u64, len| Buffer { ptr: ptr.cast(), len, key: 1, secret: 0, offset: 0 };
        let at = words.as_mut_ptr();
        // `execute` touches only the words: the request and reply slots are empty.
        HostAtomicServer { words: b(at, words.len() * 8), reqs: b(at, 0), reps: b(at, 0), slots: 1, next: 0 }
    }

    fn req(op: u8, width: u8, off: u64, operand: u64, compare: u64) -> [u8; REQ_LEN] {
        let mut r = [0u8; REQ_LEN];
        (r[0], r[1]) = (op, width);
        put_u64(&mut r, 8, off);
        put_u64(&mut r, 16, operand);
        put_u64(&mut r, 24, compare);
        r
    }

    #[test]
    fn the_server_performs_each_operation() {
        let mut mem = [0u64; 4];
        let s = server(&mut mem);
        assert_eq!(s.execute(&req(1, 8, 8, 5, 0)), (Status::Success, 0));
        assert_eq!(s.execute(&req(1, 8, 8, 5, 0)), (Status::Success, 5));
        assert_eq!(s.execute(&req(2, 8, 8, 99, 7)), (Status::Success, 10), "CAS miss");
        assert_eq!(s.execute(&req(2, 8, 8, 99, 10)), (Status::Success, 10), "CAS hit");
        assert_eq!(s.execute(&req(3, 8, 8, 1, 0)), (Status::Success, 99));
        assert_eq!(s.execute(&req(1, 4, 20, 2, 0)), (Status::Success, 0));
        assert_eq!(s.execute(&req(1, 4, 20, u32::MAX as u64, 0)), (Status::Success, 2));
        assert_eq!(s.execute(&req(3, 4, 16, 7, 0)), (Status::Success, 0));
        assert_eq!(mem[1], 1);
        assert_eq!(mem[2], 1 << 32 | 7, "32-bit words wrap and stay in their half");
    }

    #[test]
    fn the_server_refuses_bad_requests() {
        let mut mem = [0u64; 4];
        let s = server(&mut mem);
        for (r, want) in [
            (req(1, 8, 4, 1, 0), Status::RemoteAccessError),
            (req(1, 8, 32, 1, 0), Status::RemoteAccessError),
            (req(1, 8, u64::MAX - 7, 1, 0), Status::RemoteAccessError),
            (req(1, 3, 0, 1, 0), Status::RemoteAccessError),
            (req(9, 8, 0, 1, 0), Status::BadDescriptor),
        ] {
            assert_eq!(s.execute(&r).0, want, "{r:?}");
        }
        assert_eq!(mem, [0; 4], "nothing written");
    }
}
