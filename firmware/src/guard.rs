//! Remote-access checks and the key-guessing guard.
//!
//! Every remote access (atomic, remote write, remote read) names a region
//! by (key, secret, offset): the target NIC checks the key (its slot and
//! 15 generated bits), the 32-bit secret registered with it, the owning
//! port, the rights and the bounds. A refusal is counted (`REMOTE_REFUSED`
//! in the NIC's counters and in the target port's control page) and
//! charged to the source node: a source refused `Config::remote_refusals_max`
//! times within `Config::remote_refusal_window_ns` is throttled — all its
//! remote accesses refused, counted as `REMOTE_THROTTLED` too — for
//! `Config::remote_throttle_ns`. A guesser thus gets a bounded number of
//! tries per window, against at least 2^32 secrets per key. Time is the
//! handler's `now`, as everywhere in the control program.
//!
//! The table of sources is bounded ([`GUARD_SOURCES`]); when full, the
//! entry least recently refused and not throttled is reused (throttled
//! entries are kept: a guesser cannot flush itself out by spoofing
//! nothing — sources are route-table nodes only).

use emp_uapi::desc::{MrEntry, Status};
use emp_uapi::sram::{counter, ctl};

use emp_uapi::sram::Layout;

use crate::mr::{Buf, MrCache};
use crate::{sram_put_u32, sram_u32, Hal, Nic};

/// Source nodes the guard tracks at once.
pub const GUARD_SOURCES: usize = 64;

/// One source's refusals.
#[derive(Clone, Copy, Debug, Default)]
struct Source {
    node: u16,
    /// Start of the current counting window.
    window_start: u64,
    /// Refusals in that window.
    refusals: u32,
    /// Throttled until then (0 = not throttled).
    blocked_until: u64,
    /// Last refusal (for reuse of the entry).
    last: u64,
}

/// The guard's state: a bounded table of sources.
#[derive(Debug, Default)]
pub(crate) struct Guard {
    sources: Vec<Source>,
    /// No source is throttled at or after this time (fast path).
    blocked_max: u64,
}

impl Guard {
    pub(crate) fn new() -> Guard {
        Guard { sources: Vec::with_capacity(GUARD_SOURCES), blocked_max: 0 }
    }

    /// Is `node` throttled at `now`?
    fn throttled(&self, node: u16, now: u64) -> bool {
        now < self.blocked_max && self.sources.iter().any(|s| s.node == node && now < s.blocked_until)
    }

    /// Charges a refusal to `node`; true when it starts a throttle.
    fn refuse(&mut self, node: u16, now: u64, max: u32, window: u64, throttle: u64) -> bool {
        let i = match self.sources.iter().position(|s| s.node == node) {
            Some(i) => i,
            None if self.sources.len() < GUARD_SOURCES => {
                self.sources.push(Source { node, window_start: now, ..Default::default() });
                self.sources.len() - 1
            }
            None => {
                let victim = self
                    .sources
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| now >= s.blocked_until)
                    .min_by_key(|(_, s)| s.last)
                    .map(|(i, _)| i);
                let Some(i) = victim else { return false }; // Every entry throttled: keep them.
                self.sources[i] = Source { node, window_start: now, ..Default::default() };
                i
            }
        };
        let s = &mut self.sources[i];
        if now.saturating_sub(s.window_start) >= window {
            s.window_start = now;
            s.refusals = 0;
        }
        s.refusals += 1;
        s.last = now;
        if s.refusals >= max && now >= s.blocked_until {
            s.blocked_until = now.saturating_add(throttle);
            s.refusals = 0;
            s.window_start = now;
            self.blocked_max = self.blocked_max.max(s.blocked_until);
            return true;
        }
        false
    }
}

/// A remote access's target: region `key` presented with `secret`, at
/// `offset` for `len` bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RemoteTarget {
    pub key: u32,
    pub secret: u32,
    pub offset: u64,
    pub len: u64,
}

impl Nic {
    /// Admits a remote access from `src_node` to `port`: the source is not
    /// throttled and the target names a region of `port` with `access`,
    /// the right secret and room for `len` bytes. A refusal is counted and
    /// charged to the source; every refusal is `RemoteAccessError` to the
    /// initiator (it learns nothing about which check failed).
    pub(crate) fn remote_admit<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        src_node: u16,
        port: u16,
        t: &RemoteTarget,
        access: u8,
    ) -> Result<(), Status> {
        if self.guard.throttled(src_node, now) {
            self.remote_refused(hal, port, true);
            return Err(Status::RemoteAccessError);
        }
        if self.mr.remote_lookup(hal, &self.layout, port, t.key, t.secret, t.offset, t.len, access).is_ok() {
            return Ok(());
        }
        let (max, window, throttle) =
            (self.cfg.remote_refusals_max, self.cfg.remote_refusal_window_ns, self.cfg.remote_throttle_ns);
        self.guard.refuse(src_node, now, max, window, throttle);
        self.remote_refused(hal, port, false);
        Err(Status::RemoteAccessError)
    }

    /// [`Nic::mr_lookup`] plus the region's secret.
    /// [`MrCache::remote_io`] through the program's MR cache.
    pub(crate) fn remote_io<H: Hal>(
        &mut self,
        hal: &mut H,
        port: u16,
        t: &RemoteTarget,
        off_in: u64,
        buf: Buf<'_>,
        access: u8,
    ) -> Result<(), Status> {
        self.mr.remote_io(hal, &self.layout, port, t, off_in, buf, access)
    }

    /// Counts a refused remote access to `port`, globally and in the
    /// port's control page.
    fn remote_refused<H: Hal>(&mut self, hal: &mut H, port: u16, throttled: bool) {
        self.count(counter::REMOTE_REFUSED, 1);
        if throttled {
            self.count(counter::REMOTE_THROTTLED, 1);
        }
        let w = self.layout.port(port);
        let bump = |hal: &mut H, off: usize| {
            let v = sram_u32(hal, w.ctl(off));
            sram_put_u32(hal, w.ctl(off), v.wrapping_add(1));
        };
        bump(hal, ctl::REMOTE_REFUSED);
        if throttled {
            bump(hal, ctl::REMOTE_THROTTLED);
        }
    }
}

impl MrCache {
    /// [`MrCache::lookup`], and the remote access's secret too.
    #[allow(clippy::too_many_arguments)]
    fn remote_lookup<H: Hal>(
        &self,
        hal: &mut H,
        layout: &Layout,
        port: u16,
        key: u32,
        secret: u32,
        off: u64,
        len: u64,
        access: u8,
    ) -> Result<MrEntry, Status> {
        let e = self.lookup(hal, layout, port, key, off, len, access)?;
        // A secret of 0 is never handed out (`MrEntry::make_key`).
        if e.secret != secret || secret == 0 {
            return Err(Status::BadKey);
        }
        Ok(e)
    }

    /// Moves bytes between `buf` and a remote access's region, re-checking
    /// the key and secret (the region may have been deregistered since the
    /// access was admitted).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn remote_io<H: Hal>(
        &mut self,
        hal: &mut H,
        layout: &Layout,
        port: u16,
        t: &RemoteTarget,
        off_in: u64,
        buf: Buf<'_>,
        access: u8,
    ) -> Result<(), Status> {
        if buf.len() == 0 {
            return Ok(());
        }
        let off = t.offset + off_in;
        self.remote_lookup(hal, layout, port, t.key, t.secret, off, buf.len() as u64, access)?;
        self.region_io(hal, layout, port, t.key, off, buf, access)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_source_is_throttled_after_k_refusals_in_a_window() {
        let mut g = Guard::new();
        for i in 0..3 {
            assert!(!g.refuse(7, i * MS, 4, 100 * MS, 500 * MS));
            assert!(!g.throttled(7, i * MS));
        }
        assert!(g.refuse(7, 3 * MS, 4, 100 * MS, 500 * MS), "the 4th refusal starts the throttle");
        assert!(g.throttled(7, 4 * MS));
        assert!(!g.throttled(8, 4 * MS), "other sources are not affected");
        assert!(g.throttled(7, 502 * MS));
        assert!(!g.throttled(7, 503 * MS), "the throttle ends");
    }

    #[test]
    fn refusals_spread_over_windows_never_throttle() {
        let mut g = Guard::new();
        for i in 0..20 {
            assert!(!g.refuse(1, i * 40 * MS, 4, 100 * MS, 500 * MS));
        }
    }

    #[test]
    fn the_table_is_bounded_and_keeps_throttled_sources() {
        let mut g = Guard::new();
        for _ in 0..2 {
            g.refuse(0, 0, 2, 100 * MS, 500 * MS);
        }
        assert!(g.throttled(0, MS));
        for n in 1..1000u16 {
            g.refuse(n, n as u64, 2, 100 * MS, 500 * MS);
        }
        assert!(g.sources.len() <= GUARD_SOURCES);
        assert!(g.throttled(0, 2 * MS), "a throttled source is not evicted");
    }
}
