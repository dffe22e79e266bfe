// SPDX-License-Identifier: GPL-2.0

//! Read-only debugfs counters of what the driver holds for one NIC, one
//! file per concern, under `/sys/kernel/debug/<node name>/` (e.g.
//! `/sys/kernel/debug/emp-nic/pinned_pages`): `open_ports`,
//! `pinned_pages`, `regions` (MR table slots in use), `groups_in_use`,
//! `armed_ports` and `eventfds` (SET_EVENTFD references held). Once every
//! process using the NIC has exited, each reads 0: the guest fuzzer
//! (`scripts/vm/kfuzz.sh`) checks exactly that. Debugfs is root's; an
//! ordinary user asks QUERY (pinned pages and group slots) instead.

use kernel::{
    debugfs::{Dir, File},
    fmt,
    prelude::*,
    sync::Arc,
};

use crate::port::{Counters, NicInfo};

/// The directory and its files; dropping it removes them.
#[pin_data]
pub(crate) struct DebugCounters {
    #[pin]
    open_ports: File<Arc<NicInfo>>,
    #[pin]
    pinned_pages: File<Arc<NicInfo>>,
    #[pin]
    regions: File<Arc<NicInfo>>,
    #[pin]
    groups_in_use: File<Arc<NicInfo>>,
    #[pin]
    armed_ports: File<Arc<NicInfo>>,
    #[pin]
    eventfds: File<Arc<NicInfo>>,
    _dir: Dir,
}

/// One counter of the snapshot, as a line of text.
fn show(info: &Arc<NicInfo>, f: &mut fmt::Formatter<'_>, pick: fn(&Counters) -> u64) -> fmt::Result {
    writeln!(f, "{}", pick(&info.counters()))
}

impl DebugCounters {
    /// Creates `/sys/kernel/debug/<name>/` and its files. Debugfs being
    /// unavailable is not an error (the files are then simply absent).
    pub(crate) fn new(name: &'static CStr, info: Arc<NicInfo>) -> impl PinInit<Self> {
        let dir = Dir::new(name);
        pin_init!(Self {
            open_ports <- dir.read_callback_file(c"open_ports", info.clone(), &|i, f| {
                show(i, f, |c| c.open_ports.into())
            }),
            pinned_pages <- dir.read_callback_file(c"pinned_pages", info.clone(), &|i, f| {
                show(i, f, |c| c.pinned_pages)
            }),
            regions <- dir.read_callback_file(c"regions", info.clone(), &|i, f| {
                show(i, f, |c| c.regions.into())
            }),
            groups_in_use <- dir.read_callback_file(c"groups_in_use", info.clone(), &|i, f| {
                show(i, f, |c| c.groups_in_use.into())
            }),
            armed_ports <- dir.read_callback_file(c"armed_ports", info.clone(), &|i, f| {
                show(i, f, |c| c.armed_ports.into())
            }),
            eventfds <- dir.read_callback_file(c"eventfds", info, &|i, f| show(i, f, |c| c.eventfds.into())),
            _dir: dir,
        })
    }
}
