//! ioctl ABI of `/dev/emp-nic`. Argument structs lead with their own size
//! (so they can grow without new command numbers) and end in reserved space.

use crate::le_struct;

/// ioctl type byte.
pub const EMP_IOC_MAGIC: u32 = b'E' as u32;

const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// Linux `_IOC(dir, type, nr, size)`.
pub const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    assert!(size < (1 << IOC_SIZEBITS));
    (dir << IOC_DIRSHIFT) | (ty << IOC_TYPESHIFT) | (nr << IOC_NRSHIFT) | ((size as u32) << IOC_SIZESHIFT)
}

/// Size field of an ioctl command.
pub const fn ioc_size(cmd: u32) -> usize {
    ((cmd >> IOC_SIZESHIFT) & ((1 << IOC_SIZEBITS) - 1)) as usize
}

le_struct! {
    /// `EMP_IOC_QUERY` result.
    pub struct EmpQuery {
        /// Caller sets `size_of::<EmpQuery>()`.
        pub size: u32,
        /// Port this file owns.
        pub port: u16,
        /// This NIC's node id.
        pub node_id: u16,
        /// MTU.
        pub mtu: u32,
        /// Feature bits.
        pub features: u32,
        /// Bytes of the port window (mmap length).
        pub window_size: u64,
        /// Send ring entries.
        pub send_entries: u32,
        /// Receive ring entries.
        pub recv_entries: u32,
        /// Largest message.
        pub msg_max: u64,
        /// Generation of this port opening.
        pub port_gen: u32,
        /// Port count.
        pub port_count: u16,
        /// Reserved.
        pub reserved0: u16,
        /// Pages the driver holds pinned for this NIC (all ports).
        pub pinned_pages: u64,
        /// Group table slots of the NIC.
        pub group_entries: u32,
        /// Group table slots in use (all ports).
        pub groups_in_use: u32,
        /// Reserved.
        pub reserved: [u64; 2],
    }
    size = 80;
}

le_struct! {
    /// `EMP_IOC_REG_MR` argument: pin `length` bytes at `addr`.
    pub struct EmpRegMr {
        /// Caller sets `size_of::<EmpRegMr>()`.
        pub size: u32,
        /// `MR_*` access bits.
        pub access: u32,
        /// Virtual address of the region.
        pub addr: u64,
        /// Length in bytes.
        pub length: u64,
        /// Out: the key.
        pub key: u32,
        /// Reserved.
        pub reserved0: u32,
        /// Reserved.
        pub reserved: [u64; 2],
    }
    size = 48;
}

le_struct! {
    /// `EMP_IOC_DEREG_MR` argument.
    pub struct EmpDeregMr {
        /// Caller sets `size_of::<EmpDeregMr>()`.
        pub size: u32,
        /// Key to deregister.
        pub key: u32,
    }
    size = 8;
}

le_struct! {
    /// `EMP_IOC_SET_EVENTFD` argument: where port events go.
    pub struct EmpSetEventfd {
        /// Caller sets `size_of::<EmpSetEventfd>()`.
        pub size: u32,
        /// An eventfd, or -1 to detach.
        pub fd: i32,
        /// Signal number to send instead (0 = none).
        pub signal: u32,
        /// Reserved.
        pub reserved: u32,
    }
    size = 16;
}

le_struct! {
    /// `EMP_IOC_ARM` argument.
    pub struct EmpArm {
        /// Caller sets `size_of::<EmpArm>()`.
        pub size: u32,
        /// Events to arm (bit 0 = next completion).
        pub events: u32,
    }
    size = 8;
}

le_struct! {
    /// `EMP_IOC_START` argument: open the port with its completion queue,
    /// which lives in memory the port registered (`cq_key`).
    pub struct EmpStart {
        /// Caller sets `size_of::<EmpStart>()`.
        pub size: u32,
        /// CQ entries (power of two).
        pub cq_entries: u32,
        /// Key of the region holding the CQ.
        pub cq_key: u32,
        /// Reserved.
        pub reserved: u32,
        /// Offset of the CQ in that region.
        pub cq_offset: u64,
    }
    size = 24;
}

le_struct! {
    /// `EMP_IOC_GROUP_SET` argument: load the group table entry (a
    /// [`crate::sram::GroupEntry`], 1024 bytes) at `entry` in the caller's
    /// memory for this port. The driver copies and checks it
    /// ([`crate::sram::GroupEntry::check`], with `port` set to the
    /// caller's port), keeps one slot per (port, group id) and has the NIC
    /// load it. The port must be started. Out: the slot, which collective
    /// work descriptors name.
    pub struct EmpGroupSet {
        /// Caller sets `size_of::<EmpGroupSet>()`.
        pub size: u32,
        /// Out: the group table slot.
        pub slot: u32,
        /// Address of the entry.
        pub entry: u64,
        /// Reserved, zero.
        pub reserved: [u64; 2],
    }
    size = 32;
}

le_struct! {
    /// `EMP_IOC_GROUP_CLEAR` argument: retire a group slot of this port;
    /// its unfinished operations complete `Flushed`.
    pub struct EmpGroupClear {
        /// Caller sets `size_of::<EmpGroupClear>()`.
        pub size: u32,
        /// Slot `EMP_IOC_GROUP_SET` returned.
        pub slot: u32,
    }
    size = 8;
}

/// Query the port and NIC.
pub const EMP_IOC_QUERY: u32 = ioc(IOC_READ | IOC_WRITE, EMP_IOC_MAGIC, 1, core::mem::size_of::<EmpQuery>());
/// Register (pin) memory.
pub const EMP_IOC_REG_MR: u32 = ioc(IOC_READ | IOC_WRITE, EMP_IOC_MAGIC, 2, core::mem::size_of::<EmpRegMr>());
/// Deregister memory.
pub const EMP_IOC_DEREG_MR: u32 = ioc(IOC_WRITE, EMP_IOC_MAGIC, 3, core::mem::size_of::<EmpDeregMr>());
/// Arm an event.
pub const EMP_IOC_ARM: u32 = ioc(IOC_WRITE, EMP_IOC_MAGIC, 4, core::mem::size_of::<EmpArm>());
/// Open the port with its completion queue.
pub const EMP_IOC_START: u32 = ioc(IOC_WRITE, EMP_IOC_MAGIC, 6, core::mem::size_of::<EmpStart>());
/// Set the event eventfd / signal.
pub const EMP_IOC_SET_EVENTFD: u32 = ioc(IOC_WRITE, EMP_IOC_MAGIC, 5, core::mem::size_of::<EmpSetEventfd>());
/// Load a group into the NIC's group table.
pub const EMP_IOC_GROUP_SET: u32 = ioc(IOC_READ | IOC_WRITE, EMP_IOC_MAGIC, 7, core::mem::size_of::<EmpGroupSet>());
/// Retire a group slot.
pub const EMP_IOC_GROUP_CLEAR: u32 = ioc(IOC_WRITE, EMP_IOC_MAGIC, 8, core::mem::size_of::<EmpGroupClear>());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_encode_sizes() {
        assert_eq!(ioc_size(EMP_IOC_REG_MR), 48);
        assert_eq!(EMP_IOC_DEREG_MR, 0x4008_4503);
        assert_ne!(EMP_IOC_QUERY, EMP_IOC_REG_MR);
        assert_eq!(ioc_size(EMP_IOC_GROUP_SET), 32);
        assert_eq!(EMP_IOC_GROUP_SET, 0xC020_4507);
        assert_eq!(EMP_IOC_GROUP_CLEAR, 0x4008_4508);
    }
}
