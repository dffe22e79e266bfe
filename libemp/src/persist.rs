//! Persistent descriptors (EMP thesis §2.3.3; MPI_Send_init/Recv_init and
//! MPI_Start): a send or receive is stored once on the NIC, in one of
//! [`PERSIST_SLOTS`] slots per ring of the port, and each start after that
//! writes 24 bytes into the ring; the NIC runs the stored descriptor with
//! the start's `wr_id`, reading the buffer's bytes of that moment. The
//! buffer's memory is checked at every start, as a posted one's is.
//!
//! Send and receive slots are separate tables, each ordered with the
//! other descriptors of its ring: a store takes effect for the starts
//! posted after it. Storing into a used slot replaces it; the tables go
//! with a saved context and are emptied when the port closes.

use emp_uapi::desc::{Opcode, Sge, WorkDesc, PERSIST_SLOTS, START_BYTES, WD_PERSIST};

use crate::{Device, Endpoint, Error, Result};

/// A slot the NIC's tables have, or the error that says how many there are.
fn check_slot(slot: u8) -> Result<()> {
    if slot as usize >= PERSIST_SLOTS {
        return Err(Error::invalid(format!("persistent slot {slot}: the NIC has {PERSIST_SLOTS} per ring")));
    }
    Ok(())
}

impl Device {
    fn store(&mut self, send: bool, slot: u8, mut d: WorkDesc) -> Result<()> {
        check_slot(slot)?;
        d.flags |= WD_PERSIST;
        d.slot = slot;
        self.post(send, &d)
    }

    /// Stores a tagged send of the bytes `sges` name to `dst` in send
    /// slot `slot` (below [`PERSIST_SLOTS`]), replacing what it held;
    /// nothing is sent until [`Device::start_send`]. Only a failed store
    /// completes (with wr_id 0); a start of a slot that holds nothing
    /// completes `BadDescriptor`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (slot), [`Error::TooManySges`],
    /// [`Error::RingFull`].
    ///
    /// # Examples
    /// ```no_run
    /// # let mut dev = emp::Device::open()?;
    /// let mut buf = dev.alloc(64)?;
    /// let peer = emp::Endpoint { node: 1, port: 0 };
    /// dev.send_init(0, peer, 7, &[buf.sge(0, 64)])?;
    /// for i in 0..100u64 {
    ///     buf.as_mut_slice()[0] = i as u8;
    ///     dev.start_send(i, 0)?;
    ///     dev.wait_wr(i, None)?;
    /// }
    /// # Ok::<(), emp::Error>(())
    /// ```
    pub fn send_init(&mut self, slot: u8, dst: Endpoint, tag: u64, sges: &[Sge]) -> Result<()> {
        let d = Self::desc(Opcode::Send, 0, dst, tag, 0, sges)?;
        self.store(true, slot, d)
    }

    /// Stores a receive (as [`Device::post_recv`]'s) in receive slot
    /// `slot`; [`Device::start_recv`] posts it.
    ///
    /// # Errors
    /// As [`Device::send_init`].
    pub fn recv_init(&mut self, slot: u8, src: Endpoint, tag: u64, ignore: u64, sges: &[Sge]) -> Result<()> {
        let d = Self::desc(Opcode::Recv, 0, src, tag, ignore, sges)?;
        self.store(false, slot, d)
    }

    fn start(&mut self, send: bool, wr_id: u64, slot: u8) -> Result<()> {
        check_slot(slot)?;
        let d = WorkDesc { wr_id, opcode: Opcode::Start as u8, tag: slot as u64, ..Default::default() };
        self.post_bytes(send, &d, START_BYTES)
    }

    /// Sends what send slot `slot` stores; its completion (opcode
    /// `Send`) carries `wr_id`. Leave the bytes alone until then.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (slot), [`Error::RingFull`].
    pub fn start_send(&mut self, wr_id: u64, slot: u8) -> Result<()> {
        self.start(true, wr_id, slot)
    }

    /// Posts the receive receive slot `slot` stores; its completion
    /// (opcode `Recv`) carries `wr_id`.
    ///
    /// # Errors
    /// As [`Device::start_send`].
    pub fn start_recv(&mut self, wr_id: u64, slot: u8) -> Result<()> {
        self.start(false, wr_id, slot)
    }
}
