//! Remote write and read (one-sided, verbs' RDMA WRITE / READ), executed
//! by the NICs: the target's CPU takes no part (unless the write carries
//! immediate data, which completes one of its receives).
//!
//! ```no_run
//! # let mut dev = emp::Device::open()?;
//! # let peer = emp::Endpoint { node: 1, port: 0 };
//! // The target: a region others may write and read, and its remote key.
//! let window = dev.alloc_mr(1 << 20, emp::MR_REMOTE_WRITE | emp::MR_REMOTE_READ)?;
//! let at = window.remote_addr(0); // hand `at` (key, secret, offset) to peers
//! # let at = emp::RemoteAddr { key: emp::RemoteKey::from_u64(0x1234_5678_0001_0001), offset: 0 };
//! // An initiator: put 4 KiB there, then get it back.
//! let mut buf = dev.alloc(8192)?;
//! buf.as_mut_slice()[..4096].fill(7);
//! dev.post_write(1, peer, &[buf.sge(0, 4096)], at)?;
//! dev.wait_wr(1, None)?;
//! dev.post_read(2, peer, &[buf.sge(4096, 4096)], at)?;
//! let wc = dev.wait_wr(2, None)?; // wc.byte_len = 4096, the data is in buf
//! # Ok::<(), emp::Error>(())
//! ```
//!
//! The target NIC checks the key, its secret, the region's rights
//! ([`crate::MR_REMOTE_WRITE`], [`crate::MR_REMOTE_READ`]) and bounds for
//! the whole transfer before it touches memory; a refusal completes the
//! operation with [`crate::Status::RemoteAccessError`] and leaves the target's
//! memory unchanged. Each operation is executed once, whatever the wire
//! loses or duplicates. Operations from one port to one target start in
//! posting order; writes in flight together to overlapping bytes land in
//! no particular order (a completion says the data is placed).

use emp_uapi::desc::{Opcode, RemoteSge, Sge, WorkDesc, SGE_MAX, WD_IMM, WD_SIGNALED};

use crate::{Device, Endpoint, Error, RemoteAddr, Result};

/// The descriptor of a remote write or read (`WorkDesc` contract in `emp_uapi::desc`).
fn rma_desc(
    op: Opcode,
    wr_id: u64,
    dst: Endpoint,
    local: &[Sge],
    remote: RemoteAddr,
    imm: Option<u64>,
) -> Result<WorkDesc> {
    if local.len() >= SGE_MAX {
        return Err(Error::invalid("rma: at most 5 local SGEs (the sixth slot names the remote region)"));
    }
    let total: u64 = local.iter().map(|s| s.len as u64).sum();
    if remote.offset.checked_add(total).is_none() {
        return Err(Error::invalid("rma: the remote range wraps"));
    }
    let mut d = WorkDesc {
        wr_id,
        opcode: op as u8,
        flags: WD_SIGNALED | if imm.is_some() { WD_IMM } else { 0 },
        num_sge: local.len() as u8 + 1,
        node: dst.node,
        port: dst.port,
        tag: imm.unwrap_or(0),
        ..Default::default()
    };
    d.sge[..local.len()].copy_from_slice(local);
    d.sge[local.len()] = RemoteSge { key: remote.key.key, secret: remote.key.secret, offset: remote.offset }.to_sge();
    Ok(d)
}

impl Device {
    /// Posts a remote write (RDMA WRITE): the bytes of `local` (this port's
    /// registered memory, at most 5 SGEs) go to `remote` in `dst`'s memory.
    /// Completes here ([`Opcode::RdmaWrite`]) once the target NIC has them;
    /// the target's host sees nothing.
    ///
    /// # Errors
    /// [`Error::RingFull`]; [`Error::InvalidArgument`] for more than 5 SGEs
    /// or a remote range that wraps.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let at = emp::RemoteAddr { key: emp::RemoteKey::from_u64(0x1234_5678_0001_0001), offset: 0 };
    /// let buf = dev.alloc(64)?;
    /// dev.post_write(1, emp::Endpoint { node: 1, port: 0 }, &[buf.sge(0, 64)], at)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_write(&mut self, wr_id: u64, dst: Endpoint, local: &[Sge], remote: RemoteAddr) -> Result<()> {
        let d = rma_desc(Opcode::RdmaWrite, wr_id, dst, local, remote, None)?;
        self.post_raw(true, &d)
    }

    /// As [`Device::post_write`], then the target NIC completes one of the
    /// target's posted receives that matches (this endpoint, tag = `imm`)
    /// with [`Opcode::RecvRdmaImm`] (`tag` = `imm`, `msg_len` = bytes
    /// written), as verbs' RDMA WRITE WITH IMM. The write waits (as a send
    /// would) until such a receive is posted.
    ///
    /// # Errors
    /// As [`Device::post_write`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let at = emp::RemoteAddr { key: emp::RemoteKey::from_u64(0x1234_5678_0001_0001), offset: 0 };
    /// let buf = dev.alloc(64)?;
    /// dev.post_write_imm(1, emp::Endpoint { node: 1, port: 0 }, &[buf.sge(0, 64)], at, 42)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_write_imm(
        &mut self,
        wr_id: u64,
        dst: Endpoint,
        local: &[Sge],
        remote: RemoteAddr,
        imm: u64,
    ) -> Result<()> {
        let d = rma_desc(Opcode::RdmaWrite, wr_id, dst, local, remote, Some(imm))?;
        self.post_raw(true, &d)
    }

    /// Posts a remote read (RDMA READ): as many bytes as `local` holds
    /// (at most 5 SGEs of this port's registered memory) come from
    /// `remote` in `dst`'s memory. Completes here ([`Opcode::RdmaRead`])
    /// when they are in `local`.
    ///
    /// # Errors
    /// As [`Device::post_write`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let at = emp::RemoteAddr { key: emp::RemoteKey::from_u64(0x1234_5678_0001_0001), offset: 0 };
    /// let buf = dev.alloc(64)?;
    /// dev.post_read(1, emp::Endpoint { node: 1, port: 0 }, &[buf.sge(0, 64)], at)?;
    /// dev.wait_wr(1, None)?;
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn post_read(&mut self, wr_id: u64, dst: Endpoint, local: &[Sge], remote: RemoteAddr) -> Result<()> {
        let d = rma_desc(Opcode::RdmaRead, wr_id, dst, local, remote, None)?;
        self.post_raw(true, &d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RemoteKey;

    const DST: Endpoint = Endpoint { node: 2, port: 1 };
    const AT: RemoteAddr = RemoteAddr { key: RemoteKey { key: 0x3_0004, secret: 0xC0FF_EE00 }, offset: 96 };

    #[test]
    fn descriptors_meet_the_uapi_contract() {
        let local = [Sge { key: 9, len: 100, offset: 0 }, Sge { key: 9, len: 28, offset: 4096 }];
        let d = rma_desc(Opcode::RdmaWrite, 5, DST, &local, AT, Some(77)).unwrap();
        assert_eq!(d.validate(), Ok(Opcode::RdmaWrite));
        assert_eq!((d.num_sge, d.tag, d.flags & WD_IMM, d.total_len()), (3, 77, WD_IMM, 128));
        assert_eq!(d.remote(), RemoteSge { key: 0x3_0004, secret: 0xC0FF_EE00, offset: 96 });
        let r = rma_desc(Opcode::RdmaRead, 6, DST, &local[..1], AT, None).unwrap();
        assert_eq!(r.validate(), Ok(Opcode::RdmaRead));
        assert_eq!((r.num_sge, r.tag, r.flags & WD_IMM), (2, 0, 0));
        let empty = rma_desc(Opcode::RdmaWrite, 7, DST, &[], AT, Some(1)).unwrap();
        assert_eq!((empty.validate(), empty.total_len()), (Ok(Opcode::RdmaWrite), 0));
    }

    #[test]
    fn misuse_is_refused_before_posting() {
        let six = [Sge { key: 1, len: 1, offset: 0 }; 6];
        assert!(rma_desc(Opcode::RdmaWrite, 1, DST, &six[..5], AT, None).is_ok());
        assert!(matches!(rma_desc(Opcode::RdmaWrite, 1, DST, &six, AT, None), Err(Error::InvalidArgument(_))));
        let wraps = RemoteAddr { offset: u64::MAX, ..AT };
        let one = [Sge { key: 1, len: 2, offset: 0 }];
        assert!(matches!(rma_desc(Opcode::RdmaRead, 1, DST, &one, wraps, None), Err(Error::InvalidArgument(_))));
    }
}
