//! Multisend: one descriptor, several destinations in a group.

use emp_uapi::coll::MULTISEND_WINDOW;
use emp_uapi::desc::{Opcode, Status, MR_LOCAL_READ};

use super::{CollData, CollOp, CollState, FrameCache, Params};
use crate::{Hal, LocalDesc, Nic};

/// A multisend (seed 000 §5): one descriptor, the members in the rank
/// mask (of the descriptor's 64-rank window) as destinations; each gets an ordinary tagged message (matched by
/// its posted receives, with its own sequence, window and flow control),
/// and each payload frame is read from host memory once for all.
#[derive(Debug)]
pub(crate) struct Multi {
    pub mask: u64,
    /// First rank the mask's bit 0 names (`MULTISEND_WINDOW` × window).
    pub base: u16,
    pub len: u64,
    /// The host's data.
    pub data: LocalDesc,
    /// Messages to the destinations (transmission records), `fwd[i]` to
    /// the i-th in ascending rank.
    pub fwd: Vec<u32>,
    pub cache: FrameCache,
    /// Destinations whose message failed.
    pub failed: u32,
}

impl Multi {
    pub(crate) fn new(mask: u64, base: u16, len: u64, data: LocalDesc) -> Multi {
        Multi { mask, base, len, data, fwd: Vec::new(), cache: FrameCache::default(), failed: 0 }
    }

    pub(crate) fn params(&self) -> Params {
        Params::Multi { mask: self.mask, base: self.base, len: self.len }
    }

    /// The next destination to send to (in ascending rank), if any.
    fn next_dest(&self) -> Option<u16> {
        (0..64u16).filter(|&r| self.mask & (1 << r) != 0).nth(self.fwd.len()).map(|r| self.base + r)
    }

    /// Destinations that failed or were never sent to (after a failure).
    pub(crate) fn undelivered(&self) -> u32 {
        self.failed + (self.mask.count_ones() - self.fwd.len() as u32)
    }
}

impl Nic {
    pub(super) fn validate_multisend<H: Hal>(
        &self,
        hal: &mut H,
        port: u16,
        slot: u32,
        ld: &LocalDesc,
    ) -> Result<Params, Status> {
        let g = self.groups.get(slot).expect("checked by the caller");
        let mask = ld.wd.ignore;
        let base = ld.wd.port as u32 * MULTISEND_WINDOW as u32;
        // Ranks of the window past the group's end, or this member itself.
        let past_end = (g.n as u32).saturating_sub(base);
        let own = (g.rank as u32).checked_sub(base).filter(|&r| r < 64);
        if base >= g.n as u32 || (past_end < 64 && mask >> past_end != 0) || own.is_some_and(|r| mask & (1 << r) != 0) {
            return Err(Status::BadDescriptor);
        }
        self.check_sges(hal, port, ld.sges(), MR_LOCAL_READ)?;
        if ld.len > self.cfg.msg_max {
            return Err(Status::TooLarge);
        }
        Ok(Params::Multi { mask, base: base as u16, len: ld.len })
    }

    /// A multisend is not an instance of the group's collective sequence:
    /// it starts at once.
    pub(super) fn post_multisend<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        port: u16,
        ld: LocalDesc,
        mask: u64,
        base: u16,
    ) {
        let slot = ld.wd.node as u32;
        let stamp = self.next_stamp();
        let state = CollState::Multi(Multi::new(mask, base, ld.len, ld));
        let mut o = CollOp::new(port, slot, u32::MAX, stamp, state);
        o.desc = Some((ld, Opcode::MultiSend));
        let op = self.coll_ops.insert_checked(o);
        self.coll_progress(hal, now, op);
    }

    pub(super) fn progress_multi(&mut self, now: u64, op: u32) -> Result<(), Status> {
        loop {
            let CollState::Multi(m) = &self.coll_ops.get(op).expect("live").state else { unreachable!("multisend") };
            let dest = m.fwd.len() as u32;
            let Some(to) = m.next_dest() else { break };
            let Some(t) = self.coll_send_limited(now, op, to, None, CollData::Host { dest }, u32::MAX)? else {
                return Ok(());
            };
            let CollState::Multi(m) = &mut self.coll_ops.get_mut(op).state else { unreachable!() };
            m.fwd.push(t);
        }
        self.coll_ops.get_mut(op).local_done = true;
        Ok(())
    }
}
