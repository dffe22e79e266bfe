//! Probing unexpected messages (MPI_Probe/Iprobe/Mprobe, libfabric's
//! `FI_PEEK`/`FI_CLAIM`): the NIC reports the oldest message that no
//! posted receive took and that a receive for (source, tag, ignore) would
//! match, without receiving it. A claiming probe also reserves it: later
//! receives and probes pass it by, and only [`Device::post_recv_claimed`]
//! with its [`Claim`] takes it (a zero-length claimed receive discards it,
//! as `FI_DISCARD`). Probes go through the receive ring, in order with the
//! receives posted before them, so a probe never reports a message an
//! earlier receive takes.
//!
//! Cancels go the same way: [`Device::cancel_recv`] takes back a posted
//! receive the NIC still holds unmatched (MPI_Cancel, `fi_cancel`).

use std::time::Duration;

use emp_uapi::desc::{Opcode, Sge, Status, WorkDesc, SGE_MAX, WD_CLAIM, WD_SIGNALED};

use crate::{Completion, Device, Endpoint, Error, Result};

/// What a probe found: a message waiting on this port as an unexpected one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probed {
    /// Its sender.
    pub src: Endpoint,
    /// Its tag.
    pub tag: u64,
    /// Its length in bytes.
    pub len: u32,
    /// Its immediate data, if the sender attached any.
    pub imm: Option<u32>,
}

/// A message a claiming probe reserved for one receive
/// ([`Device::post_recv_claimed`]). Dropping it does not release the
/// message: receive it (zero bytes discards it) or close the port.
#[derive(Debug, PartialEq, Eq)]
pub struct Claim {
    /// The message.
    pub msg: Probed,
    handle: u32,
}

impl Claim {
    /// The NIC's handle of the claimed message (for the C ABI).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// A claim from its parts (for the C ABI, which hands the handle out).
    pub fn from_parts(msg: Probed, handle: u32) -> Claim {
        Claim { msg, handle }
    }
}

impl Device {
    /// Posts a probe for a message from `src` (or [`crate::ANY`]) whose tag
    /// equals `tag` in every bit not set in `ignore`; with `claim`, the
    /// message found is claimed. Its completion (opcode [`Opcode::Probe`])
    /// is `Success` with the message's source, tag and `msg_len` (and the
    /// claim handle in `byte_len`), or `NoMessage`. See [`Device::probe`]
    /// for the blocking form.
    ///
    /// # Errors
    /// [`Error::RingFull`].
    pub fn post_probe(&mut self, wr_id: u64, src: Endpoint, tag: u64, ignore: u64, claim: bool) -> Result<()> {
        let d = WorkDesc {
            wr_id,
            opcode: Opcode::Probe as u8,
            flags: WD_SIGNALED | if claim { WD_CLAIM } else { 0 },
            node: src.node,
            port: src.port,
            tag,
            ignore,
            ..Default::default()
        };
        self.post_raw(false, &d)
    }

    /// Is a message from `src` with `tag` (under `ignore`) waiting,
    /// unreceived? Peeks without receiving it (MPI_Iprobe); `None` when
    /// none is. Waits only for the NIC's answer, not for a message.
    ///
    /// # Errors
    /// A failed post or wait, or the probe completing with an error.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// if let Some(m) = dev.probe(emp::ANY, 7, 0)? {
    ///     let buf = dev.alloc(m.len.max(1) as usize)?;
    ///     dev.post_recv(1, m.src, m.tag, 0, &[buf.sge(0, m.len as usize)])?;
    /// }
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn probe(&mut self, src: Endpoint, tag: u64, ignore: u64) -> Result<Option<Probed>> {
        Ok(self.probe_as(src, tag, ignore, false)?.map(|(m, _)| m))
    }

    /// As [`Device::probe`], and claims the message found (MPI_Improbe):
    /// only [`Device::post_recv_claimed`] with the claim takes it.
    ///
    /// # Errors
    /// As [`Device::probe`].
    pub fn probe_claim(&mut self, src: Endpoint, tag: u64, ignore: u64) -> Result<Option<Claim>> {
        Ok(self.probe_as(src, tag, ignore, true)?.map(|(msg, handle)| Claim { msg, handle }))
    }

    /// Posts a receive into `sges` of exactly the message `claim` names
    /// (MPI_Mrecv); shorter buffers truncate, none discards it. Completes
    /// like [`Device::post_recv`]'s receive; `NoMessage` if the claim was
    /// already received or its port reopened.
    ///
    /// # Errors
    /// [`Error::TooManySges`], [`Error::RingFull`].
    pub fn post_recv_claimed(&mut self, wr_id: u64, claim: &Claim, sges: &[Sge]) -> Result<()> {
        if sges.len() > SGE_MAX {
            return Err(Error::TooManySges);
        }
        let mut d = WorkDesc {
            wr_id,
            opcode: Opcode::Recv as u8,
            flags: WD_SIGNALED | WD_CLAIM,
            num_sge: sges.len() as u8,
            tag: claim.handle as u64,
            ..Default::default()
        };
        d.sge[..sges.len()].copy_from_slice(sges);
        self.post_raw(false, &d)
    }

    /// Posts a cancel of the oldest receive posted on this port with
    /// `target` as its `wr_id`. Its completion (`wr_id`, opcode
    /// [`Opcode::Cancel`]) is `Success` when the NIC took the receive back
    /// — that receive then completes [`Status::Canceled`] — or `NoMessage`
    /// when it holds no such unmatched receive (one already matched
    /// completes as it would have). See [`Device::cancel_recv`] for the
    /// blocking form.
    ///
    /// # Errors
    /// [`Error::RingFull`].
    pub fn post_cancel(&mut self, wr_id: u64, target: u64) -> Result<()> {
        let d = WorkDesc { wr_id, opcode: Opcode::Cancel as u8, flags: WD_SIGNALED, tag: target, ..Default::default() };
        self.post_raw(false, &d)
    }

    /// Takes back the posted receive `target` (its `wr_id`) if no message
    /// matched it yet: true when canceled (the receive's own completion,
    /// status [`Status::Canceled`], follows on the CQ), false when the NIC
    /// holds no such unmatched receive (it completes as it would have).
    /// Waits only for the NIC's answer.
    ///
    /// # Errors
    /// A failed post or wait, or the cancel completing with an error.
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// # let buf = dev.alloc(64)?;
    /// dev.post_recv(7, emp::ANY, 1, 0, &[buf.sge(0, 64)])?;
    /// if dev.cancel_recv(7)? {
    ///     let c = dev.wait_wr(7, None)?;
    ///     assert_eq!(c.status, emp::Status::Canceled);
    /// }
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn cancel_recv(&mut self, target: u64) -> Result<bool> {
        let wr = self.internal_wr();
        self.post_cancel(wr, target)?;
        let c: Completion = self.wait_wr(wr, Some(Duration::from_secs(60)))?;
        match c.status {
            Status::Success => Ok(true),
            Status::NoMessage => Ok(false),
            st => Err(Error::Failed(st)),
        }
    }

    fn probe_as(&mut self, src: Endpoint, tag: u64, ignore: u64, claim: bool) -> Result<Option<(Probed, u32)>> {
        let wr = self.internal_wr();
        self.post_probe(wr, src, tag, ignore, claim)?;
        // The NIC answers from its own tables: no message needs to arrive.
        let c: Completion = self.wait_wr(wr, Some(Duration::from_secs(60)))?;
        match c.status {
            Status::Success => Ok(Some((Probed { src: c.src, tag: c.tag, len: c.msg_len, imm: c.imm }, c.byte_len))),
            Status::NoMessage => Ok(None),
            st => Err(Error::Failed(st)),
        }
    }
}
