//! The per-op frame cache of broadcasts and multisends.

use emp_uapi::desc::{Status, MR_LOCAL_READ};

use super::CollData;
use crate::mr::Buf;
use crate::{Hal, Nic};

/// A frame's payload kept on the NIC so that the op's destinations send it
/// without reading host memory again: filled when a broadcast frame arrives
/// (an inner rank forwards what it just received) or on the first host read
/// (root, multisend: the payload is DMA'd once, design §1.1). An entry lives
/// until every destination has sent the frame once; beyond the bound the
/// oldest frame goes and whoever still needs it reads the host. Only the
/// first 64 destinations hold an entry (a bit of `pending`); later ones (a
/// broadcast tree node with more children) use an entry while it is there
/// and otherwise read the host.
#[derive(Debug)]
pub(crate) struct CachedFrame {
    pub frame: u32,
    /// Bit `i`: destination `i` (`CollData::Host { dest }`) has not sent it yet.
    pub pending: u64,
    /// The frame's data bytes (after any `CollHeader`).
    pub data: Vec<u8>,
}

/// One op's cached frames. Every method keeps the NIC-wide count of
/// cached frames (`used`) in step.
/// The `pending` bit of destination `dest` (none past the 64th).
pub(crate) fn dest_bit(dest: u32) -> u64 {
    1u64.checked_shl(dest).unwrap_or(0)
}

#[derive(Debug, Default)]
pub(crate) struct FrameCache {
    frames: Vec<CachedFrame>,
}

impl FrameCache {
    pub(crate) fn len(&self) -> u32 {
        self.frames.len() as u32
    }

    /// Copies frame `f` into `out` for destination `dest`, if cached; the
    /// entry goes once every destination has had it.
    pub(crate) fn take(&mut self, f: u32, dest: u32, out: &mut [u8], used: &mut u32) -> bool {
        let Some(i) = self.frames.iter().position(|e| e.frame == f) else { return false };
        let e = &mut self.frames[i];
        assert_eq!(e.data.len(), out.len(), "frame {f} cached with another length");
        out.copy_from_slice(&e.data);
        e.pending &= !dest_bit(dest);
        if e.pending == 0 {
            self.frames.swap_remove(i);
            *used -= 1;
        }
        true
    }

    /// Keeps frame `f`'s data for the destinations in `pending`. At the
    /// bound (`per_op` frames here, `nic_max` on the NIC) the oldest frame
    /// goes: it waits only for destinations far behind, which then read
    /// the host.
    pub(crate) fn insert(&mut self, f: u32, pending: u64, data: &[u8], per_op: usize, used: &mut u32, nic_max: u32) {
        if pending == 0 || data.is_empty() || per_op == 0 || self.frames.iter().any(|e| e.frame == f) {
            return;
        }
        if self.frames.len() >= per_op || *used >= nic_max {
            let Some(oldest) = self.frames.iter().enumerate().min_by_key(|(_, e)| e.frame).map(|(i, _)| i) else {
                return; // Other ops hold the whole cache.
            };
            self.frames.swap_remove(oldest);
            *used -= 1;
        }
        self.frames.push(CachedFrame { frame: f, pending, data: data.to_vec() });
        *used += 1;
        assert!(*used <= nic_max);
    }

    /// Destination `dest` needs no cached frame any more.
    pub(crate) fn release(&mut self, dest: u32, used: &mut u32) {
        let before = self.frames.len();
        for e in self.frames.iter_mut() {
            e.pending &= !dest_bit(dest);
        }
        self.frames.retain(|e| e.pending != 0);
        *used -= (before - self.frames.len()) as u32;
    }

    /// Every entry waits for some of the op's `dests` destinations, holds
    /// one frame of at most `mtu` bytes, and no frame is cached twice.
    pub(crate) fn check(&self, dests: u32, mtu: u32) -> Result<(), String> {
        let all = if dests >= 64 { u64::MAX } else { (1u64 << dests) - 1 };
        for (i, e) in self.frames.iter().enumerate() {
            if e.pending == 0 || e.pending & !all != 0 || e.data.is_empty() || e.data.len() > mtu as usize {
                return Err(format!(
                    "cached frame {} pending {:#x} of {dests}, {} B",
                    e.frame,
                    e.pending,
                    e.data.len()
                ));
            }
            if self.frames[..i].iter().any(|x| x.frame == e.frame) {
                return Err(format!("frame {} cached twice", e.frame));
            }
        }
        Ok(())
    }
}

impl Nic {
    /// Data of frame `f` (from data offset `data_off`) of internal message
    /// `tx`, whose data is in host memory: from the op's frame cache, or
    /// read from the host and kept for the destinations that still need it.
    pub(crate) fn coll_frame_data<H: Hal>(
        &mut self,
        hal: &mut H,
        tx: u32,
        f: u32,
        data_off: u64,
        out: &mut [u8],
    ) -> Result<(), Status> {
        let m = self.send.tx.get(tx).expect("live");
        let c = m.coll.as_ref().expect("collective message");
        let CollData::Host { dest } = c.data else { unreachable!("host data only") };
        let (op, stamp, port, desc) = (c.op, c.op_stamp, m.port, m.desc);
        let live = self.coll_ops.get(op).is_some_and(|o| o.stamp == stamp);
        if live {
            let cache = self.coll_ops.get_mut(op).state.cache_mut().expect("host data has a cache");
            if cache.take(f, dest, out, &mut self.coll_cache_used) {
                return Ok(());
            }
        }
        self.sge_io(hal, port, desc.sges(), data_off, Buf::FromHost(out), MR_LOCAL_READ)?;
        if live {
            let pending = self.coll_cache_pending(op, f) & !dest_bit(dest);
            self.coll_cache_insert(op, f, pending, out);
        }
        Ok(())
    }

    /// The op's destinations that have not sent frame `f` yet: their
    /// message is not queued yet, or has not reached `f` (finished ones
    /// need nothing).
    pub(super) fn coll_cache_pending(&self, op: u32, f: u32) -> u64 {
        let o = self.coll_ops.get(op).expect("live");
        let dests = self.coll_dests(o);
        let fwd = o.state.fwd();
        assert!(fwd.len() as u32 <= dests);
        let mut pending = 0u64;
        for d in 0..dests.min(64) {
            let needs = match fwd.get(d as usize) {
                None => true,
                // The slot may hold another message by now.
                Some(&t) => self.send.tx.get(t).is_some_and(|m| {
                    m.coll.as_ref().is_some_and(|c| {
                        c.op == op && c.op_stamp == o.stamp && matches!(c.data, CollData::Host { dest } if dest == d)
                    }) && m.next_frame <= f
                }),
            };
            pending |= (needs as u64) << d;
        }
        pending
    }

    /// Keeps frame `f`'s data in the op's cache for the destinations in `pending`.
    pub(super) fn coll_cache_insert(&mut self, op: u32, f: u32, pending: u64, data: &[u8]) {
        let per_op = self.cfg.window_frames.min(self.cfg.coll_cache_frames) as usize;
        let nic_max = self.cfg.coll_cache_frames;
        let cache = self.coll_ops.get_mut(op).state.cache_mut().expect("host data has a cache");
        cache.insert(f, pending, data, per_op, &mut self.coll_cache_used, nic_max);
    }

    /// Destination `dest`'s message finished (sent, or failed): it needs
    /// no cached frame any more.
    pub(super) fn coll_cache_release(&mut self, op: u32, stamp: u32, dest: u32) {
        if self.coll_ops.get(op).is_none_or(|o| o.stamp != stamp) {
            return;
        }
        if let Some(cache) = self.coll_ops.get_mut(op).state.cache_mut() {
            cache.release(dest, &mut self.coll_cache_used);
        }
    }
}
