//! Multicast on the NIC, unreliable by design (as InfiniBand UD
//! multicast): ports join and leave multicast addresses (destinations from
//! `emp_uapi::wire::MCAST_BASE` up); the NIC tells its MAC to filter for an
//! address while any port holds it ([`Hal::mcast_membership`]), transmits a
//! frame to an address once, and drops received multicast frames for
//! addresses the destination port has not joined. A joined frame goes to
//! the reliable broadcast (`rbcast/`) when it is one of its frames.

use emp_uapi::wire::{is_mcast, FrameHeader};
use emp_uapi::Le;

use crate::{Hal, Nic};

/// Most (port, address) memberships one NIC holds.
pub const JOINED_MAX: usize = 256;

/// Why a multicast request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McastError {
    /// The address is a node id, not a multicast address.
    NotMulticast,
    /// No such port, or it is not open.
    BadPort,
    /// [`JOINED_MAX`] memberships held already.
    TableFull,
    /// The frame is not a valid EMP frame from this node to a multicast
    /// address, or is longer than the MTU.
    BadFrame,
}

/// The NIC's memberships and counts.
#[derive(Debug, Default)]
pub(crate) struct Mcast {
    /// (address, port), sorted.
    joined: Vec<(u16, u16)>,
    /// Multicast transmissions.
    pub(crate) sent: u64,
    /// Received multicast frames for a joined (address, port).
    pub(crate) received: u64,
    /// Received multicast frames dropped: not joined.
    pub(crate) not_joined: u64,
}

impl Mcast {
    fn joined(&self, addr: u16, port: u16) -> bool {
        self.joined.binary_search(&(addr, port)).is_ok()
    }

    fn any_port(&self, addr: u16) -> bool {
        let at = self.joined.partition_point(|&(a, _)| a < addr);
        self.joined.get(at).is_some_and(|&(a, _)| a == addr)
    }
}

impl Nic {
    fn mcast_check(&self, port: u16, addr: u16) -> Result<(), McastError> {
        if !is_mcast(addr) {
            return Err(McastError::NotMulticast);
        }
        if !self.ports.get(port as usize).is_some_and(|p| p.open) {
            return Err(McastError::BadPort);
        }
        Ok(())
    }

    /// Port `port` receives frames sent to multicast address `addr` (again: no-op).
    pub fn mcast_join<H: Hal>(&mut self, hal: &mut H, port: u16, addr: u16) -> Result<(), McastError> {
        self.mcast_check(port, addr)?;
        let Err(at) = self.mcast.joined.binary_search(&(addr, port)) else { return Ok(()) };
        if self.mcast.joined.len() >= JOINED_MAX {
            return Err(McastError::TableFull);
        }
        let first = !self.mcast.any_port(addr);
        self.mcast.joined.insert(at, (addr, port));
        if first {
            hal.mcast_membership(addr, true);
        }
        Ok(())
    }

    /// Port `port` stops receiving `addr` (not joined: no-op).
    pub fn mcast_leave<H: Hal>(&mut self, hal: &mut H, port: u16, addr: u16) -> Result<(), McastError> {
        if !is_mcast(addr) {
            return Err(McastError::NotMulticast);
        }
        let Ok(at) = self.mcast.joined.binary_search(&(addr, port)) else { return Ok(()) };
        self.mcast.joined.remove(at);
        if !self.mcast.any_port(addr) {
            hal.mcast_membership(addr, false);
        }
        Ok(())
    }

    /// Drops every membership of `port` (it closed).
    pub(crate) fn mcast_leave_all<H: Hal>(&mut self, hal: &mut H, port: u16) {
        let addrs: Vec<u16> = self.mcast.joined.iter().filter(|&&(_, p)| p == port).map(|&(a, _)| a).collect();
        for a in addrs {
            let _ = self.mcast_leave(hal, port, a);
        }
    }

    /// The multicast addresses `port` has joined.
    pub(crate) fn mcast_addrs_of(&self, port: u16) -> impl Iterator<Item = u16> + '_ {
        self.mcast.joined.iter().filter(move |&&(_, p)| p == port).map(|&(a, _)| a)
    }

    /// A multicast frame was kept for a port (counted as received).
    pub(crate) fn mcast_kept(&mut self, kept: bool) {
        if kept {
            self.mcast.received += 1;
        } else {
            self.mcast.not_joined += 1;
            self.count(emp_uapi::sram::counter::DROPPED_UNEXPECTED, 1);
        }
    }

    /// Does `port` receive `addr`?
    pub fn mcast_joined(&self, port: u16, addr: u16) -> bool {
        self.mcast.joined(addr, port)
    }

    /// Transmits `frame` once to the multicast address its header names.
    pub fn mcast_transmit<H: Hal>(&mut self, hal: &mut H, frame: &[u8]) -> Result<(), McastError> {
        let hdr = FrameHeader::decode(frame).map_err(|_| McastError::BadFrame)?;
        if !is_mcast(hdr.dst_node) || hdr.src_node != self.node || frame.len() > self.mtu as usize {
            return Err(McastError::BadFrame);
        }
        self.mcast.sent += 1;
        hal.mac_transmit(hdr.dst_node, frame);
        Ok(())
    }

    /// A received frame to a multicast address: kept (true) only for a
    /// port that joined it.
    pub(crate) fn receive_mcast(&mut self, hdr: &FrameHeader) -> bool {
        let kept = self.mcast.joined(hdr.dst_node, hdr.dst_port);
        self.mcast_kept(kept);
        kept
    }

    /// Multicast transmissions, received frames kept, and dropped (not joined).
    pub fn mcast_counts(&self) -> (u64, u64, u64) {
        (self.mcast.sent, self.mcast.received, self.mcast.not_joined)
    }

    /// One line for `describe`.
    pub(crate) fn describe_mcast(&self) -> String {
        format!(
            "  multicast: {} memberships, sent {}, received {}, dropped (not joined) {}\n",
            self.mcast.joined.len(),
            self.mcast.sent,
            self.mcast.received,
            self.mcast.not_joined
        )
    }
}
