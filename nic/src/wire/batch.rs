//! Batched datagram I/O for the network wires: one `recvmmsg` fills up to
//! [`BATCH`] preallocated slots; one `sendmmsg` sends up to [`BATCH`]
//! queued frames. No allocation per frame.

use std::os::fd::RawFd;

use crate::dma::{HostPayload, HOST_PIECES_MAX};

/// Datagrams per system call.
pub(crate) const BATCH: usize = 32;
/// Bytes per slot: a jumbo EMP frame (`MTU_MAX`) plus an Ethernet header,
/// rounded up; anything longer arrives truncated and is refused.
pub(crate) const SLOT: usize = 9216;

/// Receive slots and the senders' addresses of one `recvmmsg`.
pub(crate) struct RecvBatch {
    buf: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    lens: [usize; BATCH],
    truncated: [bool; BATCH],
}

impl RecvBatch {
    pub(crate) fn new() -> RecvBatch {
        RecvBatch {
            buf: vec![0; BATCH * SLOT],
            // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
            names: vec![unsafe { std::mem::zeroed() }; BATCH],
            lens: [0; BATCH],
            truncated: [false; BATCH],
        }
    }

    /// Receives what is queued on `fd` without blocking; returns how many
    /// slots were filled (0 when nothing is waiting).
    pub(crate) fn recv(&mut self, fd: RawFd) -> usize {
        let base = self.buf.as_mut_ptr();
        let mut iov: [libc::iovec; BATCH] = std::array::from_fn(|i| libc::iovec {
            // SAFETY: slot i lies inside `buf` (BATCH * SLOT bytes).
            iov_base: unsafe { base.add(i * SLOT) }.cast(),
            iov_len: SLOT,
        });
        let names = self.names.as_mut_ptr();
        let mut msgs: [libc::mmsghdr; BATCH] = std::array::from_fn(|i| {
            // SAFETY: msghdr is plain old data; the fields that matter are set below.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            // SAFETY: slot i of `names` (BATCH entries).
            h.msg_name = unsafe { names.add(i) }.cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_iov = &mut iov[i];
            h.msg_iovlen = 1;
            libc::mmsghdr { msg_hdr: h, msg_len: 0 }
        });
        // SAFETY: `msgs` points at BATCH headers whose buffers and names are
        // live and writable for the duration of the call.
        let n =
            unsafe { libc::recvmmsg(fd, msgs.as_mut_ptr(), BATCH as u32, libc::MSG_DONTWAIT, std::ptr::null_mut()) };
        let n = n.max(0) as usize;
        for (i, m) in msgs.iter().take(n).enumerate() {
            self.lens[i] = (m.msg_len as usize).min(SLOT);
            self.truncated[i] = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        }
        n
    }

    /// Datagram `i` of the last [`RecvBatch::recv`].
    pub(crate) fn data(&self, i: usize) -> &[u8] {
        &self.buf[i * SLOT..i * SLOT + self.lens[i]]
    }

    /// Was datagram `i` longer than its slot?
    pub(crate) fn truncated(&self, i: usize) -> bool {
        self.truncated[i]
    }

    /// The sender's address of datagram `i`.
    pub(crate) fn name(&self, i: usize) -> &libc::sockaddr_storage {
        &self.names[i]
    }
}

/// Frames queued for one `sendmmsg`: on a bound packet socket (no
/// destination address), or each to its own address (UDP).
pub(crate) struct SendBatch {
    buf: Vec<u8>,
    lens: [usize; BATCH],
    /// Destination of each frame (`namelens[i] == 0`: none).
    names: Vec<libc::sockaddr_storage>,
    namelens: [libc::socklen_t; BATCH],
    /// Each frame's payload still in host memory, sent after its slot's
    /// bytes by the same system call (gather); held until then.
    host: Vec<HostPayload>,
    n: usize,
}

impl SendBatch {
    pub(crate) fn new() -> SendBatch {
        SendBatch {
            buf: vec![0; BATCH * SLOT],
            lens: [0; BATCH],
            // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
            names: vec![unsafe { std::mem::zeroed() }; BATCH],
            namelens: [0; BATCH],
            host: vec![HostPayload::default(); BATCH],
            n: 0,
        }
    }

    /// Queues a datagram to socket address `to`, written in place by
    /// `fill` into a [`SLOT`]-byte slot (it returns the length, or `None`
    /// to queue nothing); true when queued.
    pub(crate) fn push_to_with(
        &mut self,
        to: &std::net::SocketAddr,
        fill: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> bool {
        debug_assert!(!self.full());
        let i = self.n;
        let Some(len) = fill(&mut self.buf[i * SLOT..(i + 1) * SLOT]) else { return false };
        self.namelens[i] = sockaddr_from_std(to, &mut self.names[i]);
        self.lens[i] = len.min(SLOT);
        self.n += 1;
        true
    }

    /// Queues a datagram to `to`: `head` copied into a slot, then `host`,
    /// which the socket reads where it is. The caller keeps the whole
    /// within [`SLOT`].
    pub(crate) fn push_host_to(&mut self, to: &std::net::SocketAddr, head: &[u8], host: HostPayload) {
        debug_assert!(!self.full() && head.len() + host.len() <= SLOT);
        let i = self.n;
        self.buf[i * SLOT..i * SLOT + head.len()].copy_from_slice(head);
        self.namelens[i] = sockaddr_from_std(to, &mut self.names[i]);
        self.lens[i] = head.len();
        self.host[i] = host;
        self.n += 1;
    }

    /// Room for one more frame?
    pub(crate) fn full(&self) -> bool {
        self.n == BATCH
    }

    /// Queues a frame built in place by `fill` (which returns its length,
    /// at most [`SLOT`]).
    pub(crate) fn push(&mut self, fill: impl FnOnce(&mut [u8]) -> usize) {
        debug_assert!(!self.full());
        let slot = &mut self.buf[self.n * SLOT..(self.n + 1) * SLOT];
        self.lens[self.n] = fill(slot).min(SLOT);
        self.namelens[self.n] = 0;
        self.n += 1;
    }

    /// Sends everything queued on `fd`; returns how many frames the socket
    /// refused (buffer full, link down): those are lost, and the
    /// protocol's retransmission recovers them.
    pub(crate) fn flush(&mut self, fd: RawFd) -> usize {
        if self.n == 0 {
            return 0;
        }
        let (mut sent, mut lost, mut stalls) = (0, 0, 0);
        // Per frame: its slot, then its host pieces.
        const IOVS: usize = 1 + HOST_PIECES_MAX;
        let base = self.buf.as_mut_ptr();
        let mut iov: [[libc::iovec; IOVS]; BATCH] =
            [[libc::iovec { iov_base: core::ptr::null_mut(), iov_len: 0 }; IOVS]; BATCH];
        let mut iovlen = [1usize; BATCH];
        for (i, v) in iov.iter_mut().enumerate().take(self.n) {
            // SAFETY: slot i lies inside `buf` (BATCH * SLOT bytes).
            v[0] = libc::iovec { iov_base: unsafe { base.add(i * SLOT) }.cast(), iov_len: self.lens[i] };
            for (k, piece) in self.host[i].pieces().enumerate() {
                // The socket only reads it; `self.host[i]` keeps it mapped until after the call.
                v[1 + k] = libc::iovec { iov_base: piece.as_ptr().cast_mut().cast(), iov_len: piece.len() };
                iovlen[i] = 2 + k;
            }
        }
        while sent < self.n {
            let names = self.names.as_mut_ptr();
            let mut msgs: [libc::mmsghdr; BATCH] = std::array::from_fn(|i| {
                // SAFETY: msghdr is plain old data; the fields that matter are set below.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_iov = iov[i].as_mut_ptr();
                h.msg_iovlen = iovlen[i];
                if self.namelens[i] > 0 {
                    // SAFETY: slot i of `names` (BATCH entries).
                    h.msg_name = unsafe { names.add(i) }.cast();
                    h.msg_namelen = self.namelens[i];
                }
                libc::mmsghdr { msg_hdr: h, msg_len: 0 }
            });
            let rest = (self.n - sent) as u32;
            // SAFETY: headers `sent..n` point at live, initialised slots and
            // at host memory their `HostPayload`s keep mapped.
            let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr().add(sent), rest, libc::MSG_DONTWAIT) };
            if r > 0 {
                sent += r as usize;
                continue;
            }
            let e = std::io::Error::last_os_error().raw_os_error();
            if r < 0 && matches!(e, Some(libc::EAGAIN) | Some(libc::ENOBUFS)) && stalls < 64 {
                // The queue towards the link is full: give it a moment to
                // drain rather than lose a whole batch.
                stalls += 1;
                std::thread::yield_now();
                continue;
            }
            // This frame cannot go (or the link stays full): drop it, go on.
            sent += 1;
            lost += 1;
        }
        // The socket copied them: let the host memory go.
        self.host[..self.n].iter_mut().for_each(|h| *h = HostPayload::default());
        self.n = 0;
        lost
    }
}

/// Writes `a` into `out` as the kernel takes it; returns its length.
fn sockaddr_from_std(a: &std::net::SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match a {
        std::net::SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large enough and aligned for a sockaddr_in.
            let sin = unsafe { &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() };
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        std::net::SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large enough and aligned for a sockaddr_in6.
            let sin6 = unsafe { &mut *(out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_flowinfo = v6.flowinfo();
            sin6.sin6_addr = libc::in6_addr { s6_addr: v6.ip().octets() };
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}
