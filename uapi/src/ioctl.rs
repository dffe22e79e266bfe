//! ioctl ABI of `/dev/emp-nic`.
//!
//! Argument structs are extensible the way Linux's `openat2` and `clone3`
//! arguments are (`copy_struct_from_user`): a struct may grow at its end
//! while its command keeps its `_IOC_NR`. The command number still carries
//! the caller's `sizeof` (`_IOC_SIZE`, as `_IOWR` builds it), so a caller
//! built against an older or newer struct sends a different number; the
//! driver therefore dispatches on type, number and direction only
//! ([`IoctlCmd::decode`]) and takes the argument's size from `_IOC_SIZE`:
//!
//! - shorter than the struct's first version (`EMP_*_SIZE_VER0`): `EINVAL`;
//! - shorter than the driver's struct: the missing tail reads as zero, which
//!   every field added later must mean "absent / as before";
//! - longer: accepted when the bytes the driver does not know are all zero,
//!   otherwise `E2BIG` (the caller asked for something this driver lacks);
//! - the struct's leading `size` field must equal `_IOC_SIZE` (`EINVAL`).
//!
//! Results are written back only for `_IOC_READ` commands, and never past
//! the caller's size. The `EMP_IOC_*` constants are the commands at the
//! current sizes. The decisions live here ([`read_arg`], [`write_arg`]) so
//! the host tests them; the driver only copies from and to user memory.

use crate::{le_struct, Le};

/// ioctl type byte.
pub const EMP_IOC_MAGIC: u32 = b'E' as u32;

const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
/// `_IOC_WRITE`: the caller passes the argument to the driver.
const IOC_WRITE: u32 = 1;
/// `_IOC_READ`: the driver writes results back into the argument.
const IOC_READ: u32 = 2;

/// Linux `_IOC(dir, type, nr, size)`.
pub const fn ioc(dir: u32, ty: u32, nr: u32, size: usize) -> u32 {
    assert!(size < (1 << IOC_SIZEBITS));
    (dir << IOC_DIRSHIFT) | (ty << IOC_TYPESHIFT) | (nr << IOC_NRSHIFT) | ((size as u32) << IOC_SIZESHIFT)
}

/// Size field of an ioctl command (`_IOC_SIZE`).
pub const fn ioc_size(cmd: u32) -> usize {
    ((cmd >> IOC_SIZESHIFT) & ((1 << IOC_SIZEBITS) - 1)) as usize
}

/// Number field of an ioctl command (`_IOC_NR`).
pub const fn ioc_nr(cmd: u32) -> u32 {
    (cmd >> IOC_NRSHIFT) & ((1 << IOC_NRBITS) - 1)
}

/// Type field of an ioctl command (`_IOC_TYPE`).
pub const fn ioc_type(cmd: u32) -> u32 {
    (cmd >> IOC_TYPESHIFT) & ((1 << IOC_TYPEBITS) - 1)
}

/// Direction field of an ioctl command (`_IOC_DIR`).
pub const fn ioc_dir(cmd: u32) -> u32 {
    cmd >> IOC_DIRSHIFT
}

le_struct! {
    /// `EMP_IOC_QUERY` result.
    pub struct EmpQuery {
        /// Caller sets the size its command carries (`_IOC_SIZE`).
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
        /// Caller sets the size its command carries (`_IOC_SIZE`).
        pub size: u32,
        /// `MR_*` access bits.
        pub access: u32,
        /// Virtual address of the region.
        pub addr: u64,
        /// Length in bytes.
        pub length: u64,
        /// Out: the key.
        pub key: u32,
        /// Out: the region's remote-access secret (what a peer presents
        /// with the key; see `desc::MrEntry::make_key`).
        pub secret: u32,
        /// Reserved.
        pub reserved: [u64; 2],
    }
    size = 48;
}

le_struct! {
    /// `EMP_IOC_DEREG_MR` argument.
    pub struct EmpDeregMr {
        /// Caller sets the size its command carries (`_IOC_SIZE`).
        pub size: u32,
        /// Key to deregister.
        pub key: u32,
    }
    size = 8;
}

le_struct! {
    /// `EMP_IOC_SET_EVENTFD` argument: where port events go.
    pub struct EmpSetEventfd {
        /// Caller sets the size its command carries (`_IOC_SIZE`).
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
        /// Caller sets the size its command carries (`_IOC_SIZE`).
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
        /// Caller sets the size its command carries (`_IOC_SIZE`).
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
    /// memory for this port — followed there, for a group of more than 64
    /// members, by its body ([`crate::sram::GroupEntry::body_len`] bytes;
    /// the argument's layout is unchanged, the entry says how much follows).
    /// The driver copies and checks it ([`crate::sram::GroupView::check`],
    /// with `port` set to the caller's port), keeps one run of
    /// [`crate::sram::GroupEntry::span`] slots per (port, group id) and has
    /// the NIC load it. The port must be started. Out: the first slot,
    /// which collective work descriptors name.
    pub struct EmpGroupSet {
        /// Caller sets the size its command carries (`_IOC_SIZE`).
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
        /// Caller sets the size its command carries (`_IOC_SIZE`).
        pub size: u32,
        /// Slot `EMP_IOC_GROUP_SET` returned.
        pub slot: u32,
    }
    size = 8;
}

le_struct! {
    /// `EMP_IOC_PORT_CTX` argument: a context-switch step on this file's
    /// port (docs/context-switch.md): `op` is one of [`port_ctx`]. SAVE and
    /// RESTORE name the image's place in a region this port registered
    /// (`key`, `offset`, `len`; the driver checks it lies inside the
    /// region, the control program checks the image as untrusted input).
    pub struct EmpPortCtx {
        /// Caller sets the size its command carries (`_IOC_SIZE`).
        pub size: u32,
        /// [`port_ctx`] step.
        pub op: u32,
        /// SAVE / RESTORE: key of the region holding the image.
        pub key: u32,
        /// Reserved, zero.
        pub reserved: u32,
        /// SAVE / RESTORE: offset of the image in that region.
        pub offset: u64,
        /// SAVE: room for the image; RESTORE: the image's length (at most
        /// [`crate::sram::CTX_IMAGE_MAX`], the control program's own bound).
        pub len: u64,
        /// Out. STABLE: 1 when stable, 0 when not yet; SAVE: the image's
        /// length; RESTORE: the slot the port now lives in.
        pub result: u64,
    }
    size = 40;
}

/// [`EmpPortCtx::op`] steps (PM's C1–C8 for the caller's own port).
pub mod port_ctx {
    /// C1: stop consuming the rings and starting messages.
    pub const SUSPEND: u32 = 1;
    /// C2–C4: is the suspended port stable? (`result` 1 or 0).
    pub const STABLE: u32 = 2;
    /// C6: save the stable suspended port into its own memory; the slot is
    /// freed, and a touch of the port's window mapping raises SIGBUS until
    /// RESTORE (the mapping then reaches the slot the port lives in).
    pub const SAVE: u32 = 3;
    /// C7: restore the saved port into any free slot, suspended.
    pub const RESTORE: u32 = 4;
    /// C8: the suspended port goes on.
    pub const RESUME: u32 = 5;
}

/// Room the driver gives an image the gang scheduler saves into driver
/// memory ([`EmpGang`]); kernel memory, so smaller than
/// [`crate::sram::CTX_IMAGE_MAX`]. The control program refuses (`NO_ROOM`,
/// `ENOSPC`) an image that does not fit, and the scheduler puts that
/// switch off.
pub const EMP_GANG_IMAGE_ROOM: u64 = 1 << 20;

le_struct! {
    /// `EMP_IOC_GANG` argument: the gang scheduler's step on every started
    /// port process `pid` holds on this NIC (`crate::attach::gang` actions,
    /// as emp-nicd's `GANG` request). Needs `CAP_SYS_ADMIN`; may be issued
    /// on a file opened read-only, which holds no port. SAVE keeps each
    /// image in driver memory; RESTORE puts each back into the slot it had
    /// (`EBUSY` if taken), so the process's window is its own again.
    pub struct EmpGang {
        /// Caller sets the size its command carries (`_IOC_SIZE`).
        pub size: u32,
        /// `crate::attach::gang` action.
        pub action: u32,
        /// The process: its pid in the initial pid namespace.
        pub pid: i32,
        /// Reserved, zero.
        pub reserved: u32,
        /// Out: ports acted on (PORTS: ports held).
        pub ports: u64,
        /// Out: STABLE: how many of them are stable.
        pub stable: u64,
    }
    size = 32;
}

/// The commands of `/dev/emp-nic`, by `_IOC_NR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoctlCmd {
    /// [`EmpQuery`]: query the port and NIC.
    Query = 1,
    /// [`EmpRegMr`]: register (pin) memory.
    RegMr = 2,
    /// [`EmpDeregMr`]: deregister memory.
    DeregMr = 3,
    /// [`EmpArm`]: arm an event.
    Arm = 4,
    /// [`EmpSetEventfd`]: set the event eventfd / signal.
    SetEventfd = 5,
    /// [`EmpStart`]: open the port with its completion queue.
    Start = 6,
    /// [`EmpGroupSet`]: load a group into the NIC's group table.
    GroupSet = 7,
    /// [`EmpGroupClear`]: retire a group slot.
    GroupClear = 8,
    /// [`EmpPortCtx`]: a context-switch step on this port.
    PortCtx = 9,
    /// [`EmpGang`]: the gang scheduler's step on another process's ports.
    Gang = 10,
}

impl IoctlCmd {
    /// Every command.
    pub const ALL: [IoctlCmd; 10] = [
        IoctlCmd::Query,
        IoctlCmd::RegMr,
        IoctlCmd::DeregMr,
        IoctlCmd::Arm,
        IoctlCmd::SetEventfd,
        IoctlCmd::Start,
        IoctlCmd::GroupSet,
        IoctlCmd::GroupClear,
        IoctlCmd::PortCtx,
        IoctlCmd::Gang,
    ];

    /// `_IOC_DIR`: read-write for the commands that return results.
    pub const fn dir(self) -> u32 {
        match self {
            IoctlCmd::Query | IoctlCmd::RegMr | IoctlCmd::GroupSet | IoctlCmd::PortCtx | IoctlCmd::Gang => {
                IOC_READ | IOC_WRITE
            }
            IoctlCmd::DeregMr | IoctlCmd::Arm | IoctlCmd::SetEventfd | IoctlCmd::Start | IoctlCmd::GroupClear => {
                IOC_WRITE
            }
        }
    }

    /// Whether the driver writes results back (`_IOC_READ`).
    pub const fn returns_results(self) -> bool {
        self.dir() & IOC_READ != 0
    }

    /// The command number for an argument struct of `size` bytes (an
    /// older or newer caller's `sizeof`).
    pub const fn with_size(self, size: usize) -> u32 {
        ioc(self.dir(), EMP_IOC_MAGIC, self as u32, size)
    }

    /// The command a caller sent and its argument's size (`_IOC_SIZE`):
    /// type, number and direction must be one of ours, the size may be any.
    /// `None` is `ENOTTY`.
    pub const fn decode(cmd: u32) -> Option<(IoctlCmd, usize)> {
        if ioc_type(cmd) != EMP_IOC_MAGIC {
            return None;
        }
        let c = match ioc_nr(cmd) {
            1 => IoctlCmd::Query,
            2 => IoctlCmd::RegMr,
            3 => IoctlCmd::DeregMr,
            4 => IoctlCmd::Arm,
            5 => IoctlCmd::SetEventfd,
            6 => IoctlCmd::Start,
            7 => IoctlCmd::GroupSet,
            8 => IoctlCmd::GroupClear,
            9 => IoctlCmd::PortCtx,
            10 => IoctlCmd::Gang,
            _ => return None,
        };
        if ioc_dir(cmd) != c.dir() {
            return None;
        }
        Some((c, ioc_size(cmd)))
    }
}

/// [`EmpQuery`]'s first version: the fields through `reserved0`
/// (`pinned_pages` and the group counts came later, in reserved space).
pub const EMP_QUERY_SIZE_VER0: usize = 48;
/// [`EmpRegMr`]'s first version: through `reserved0` (the rest is reserved).
pub const EMP_REG_MR_SIZE_VER0: usize = 32;
/// [`EmpDeregMr`]'s first version.
pub const EMP_DEREG_MR_SIZE_VER0: usize = 8;
/// [`EmpSetEventfd`]'s first version.
pub const EMP_SET_EVENTFD_SIZE_VER0: usize = 16;
/// [`EmpArm`]'s first version.
pub const EMP_ARM_SIZE_VER0: usize = 8;
/// [`EmpStart`]'s first version.
pub const EMP_START_SIZE_VER0: usize = 24;
/// [`EmpGroupSet`]'s first version: through `entry` (the rest is reserved).
pub const EMP_GROUP_SET_SIZE_VER0: usize = 16;
/// [`EmpGroupClear`]'s first version.
pub const EMP_GROUP_CLEAR_SIZE_VER0: usize = 8;

/// [`EmpPortCtx`]'s first version.
pub const EMP_PORT_CTX_SIZE_VER0: usize = 40;
/// [`EmpGang`]'s first version.
pub const EMP_GANG_SIZE_VER0: usize = 32;

/// Largest argument struct the driver knows ([`read_arg`]'s buffer).
const ARG_MAX: usize = 128;

/// An ioctl argument struct: its command and the smallest size accepted.
pub trait IoctlArg: Le + Default + core::fmt::Debug + PartialEq {
    /// The command taking this struct.
    const CMD: IoctlCmd;
    /// Size of the struct's first version: callers may send any size from
    /// this up (see the module documentation).
    const SIZE_VER0: usize;
}

macro_rules! ioctl_arg {
    ($($t:ty => $cmd:ident, $ver0:ident;)*) => {$(
        impl IoctlArg for $t {
            const CMD: IoctlCmd = IoctlCmd::$cmd;
            const SIZE_VER0: usize = $ver0;
        }
        // Room for the leading `size`, and the driver's buffer holds the struct.
        const _: () = assert!($ver0 >= 4 && $ver0 <= <$t as Le>::SIZE && <$t as Le>::SIZE <= ARG_MAX);
    )*};
}

ioctl_arg! {
    EmpQuery => Query, EMP_QUERY_SIZE_VER0;
    EmpRegMr => RegMr, EMP_REG_MR_SIZE_VER0;
    EmpDeregMr => DeregMr, EMP_DEREG_MR_SIZE_VER0;
    EmpSetEventfd => SetEventfd, EMP_SET_EVENTFD_SIZE_VER0;
    EmpArm => Arm, EMP_ARM_SIZE_VER0;
    EmpStart => Start, EMP_START_SIZE_VER0;
    EmpGroupSet => GroupSet, EMP_GROUP_SET_SIZE_VER0;
    EmpGroupClear => GroupClear, EMP_GROUP_CLEAR_SIZE_VER0;
    EmpPortCtx => PortCtx, EMP_PORT_CTX_SIZE_VER0;
    EmpGang => Gang, EMP_GANG_SIZE_VER0;
}

/// Why an argument struct was refused. Each variant names the rule broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// Shorter than the struct's first version (`EINVAL`).
    TooShort,
    /// The leading `size` field is not the command's size (`EINVAL`).
    SizeMismatch,
    /// Longer than the driver's struct, with a non-zero byte past it
    /// (`E2BIG`).
    UnknownTail,
}

impl ArgError {
    /// A short human-readable reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            ArgError::TooShort => "shorter than the first version",
            ArgError::SizeMismatch => "size field differs from the command's size",
            ArgError::UnknownTail => "non-zero bytes past the known struct",
        }
    }
}

/// Reads an argument struct of `user` bytes (the command's `_IOC_SIZE`)
/// with the semantics of Linux's `copy_struct_from_user`: a shorter struct
/// is zero-extended, a longer one is accepted when its unknown tail is all
/// zero. `read` copies the caller's next bytes into its buffer; it is
/// called with consecutive pieces, in order, `user` bytes in all at most.
///
/// # Errors
/// [`ArgError`] (converted into `E`) for the size rules, or what `read`
/// returns.
pub fn read_arg<T: IoctlArg, E: From<ArgError>>(
    user: usize,
    mut read: impl FnMut(&mut [u8]) -> Result<(), E>,
) -> Result<T, E> {
    if user < T::SIZE_VER0 {
        return Err(ArgError::TooShort.into());
    }
    let mut b = [0u8; ARG_MAX];
    let known = user.min(T::SIZE);
    read(&mut b[..known])?;
    let mut tail = user - known;
    while tail > 0 {
        let mut chunk = [0u8; 64];
        let n = tail.min(chunk.len());
        read(&mut chunk[..n])?;
        if chunk[..n].iter().any(|&x| x != 0) {
            return Err(ArgError::UnknownTail.into());
        }
        tail -= n;
    }
    if u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize != user {
        return Err(ArgError::SizeMismatch.into());
    }
    Ok(T::get(&b[..T::SIZE]))
}

/// Writes a result struct back to a caller whose struct is `user` bytes:
/// never past the caller's struct, never past ours (a newer caller's tail
/// stays as it sent it: zero, i.e. "not provided"). `write` copies its
/// bytes to the start of the caller's struct.
///
/// # Errors
/// What `write` returns.
pub fn write_arg<T: IoctlArg, E>(v: &T, user: usize, write: impl FnOnce(&[u8]) -> Result<(), E>) -> Result<(), E> {
    let mut b = [0u8; ARG_MAX];
    v.put(&mut b[..T::SIZE]);
    write(&b[..user.min(T::SIZE)])
}

/// Query the port and NIC.
pub const EMP_IOC_QUERY: u32 = IoctlCmd::Query.with_size(EmpQuery::SIZE);
/// Register (pin) memory.
pub const EMP_IOC_REG_MR: u32 = IoctlCmd::RegMr.with_size(EmpRegMr::SIZE);
/// Deregister memory.
pub const EMP_IOC_DEREG_MR: u32 = IoctlCmd::DeregMr.with_size(EmpDeregMr::SIZE);
/// Arm an event.
pub const EMP_IOC_ARM: u32 = IoctlCmd::Arm.with_size(EmpArm::SIZE);
/// Open the port with its completion queue.
pub const EMP_IOC_START: u32 = IoctlCmd::Start.with_size(EmpStart::SIZE);
/// Set the event eventfd / signal.
pub const EMP_IOC_SET_EVENTFD: u32 = IoctlCmd::SetEventfd.with_size(EmpSetEventfd::SIZE);
/// Load a group into the NIC's group table.
pub const EMP_IOC_GROUP_SET: u32 = IoctlCmd::GroupSet.with_size(EmpGroupSet::SIZE);
/// Retire a group slot.
pub const EMP_IOC_GROUP_CLEAR: u32 = IoctlCmd::GroupClear.with_size(EmpGroupClear::SIZE);
/// A context-switch step on this port.
pub const EMP_IOC_PORT_CTX: u32 = IoctlCmd::PortCtx.with_size(EmpPortCtx::SIZE);
/// The gang scheduler's step on another process's ports.
pub const EMP_IOC_GANG: u32 = IoctlCmd::Gang.with_size(EmpGang::SIZE);

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::*;

    #[test]
    fn ioctl_numbers_encode_sizes() {
        assert_eq!(ioc_size(EMP_IOC_REG_MR), 48);
        assert_eq!(EMP_IOC_DEREG_MR, 0x4008_4503);
        assert_ne!(EMP_IOC_QUERY, EMP_IOC_REG_MR);
        assert_eq!(ioc_size(EMP_IOC_GROUP_SET), 32);
        assert_eq!(EMP_IOC_GROUP_SET, 0xC020_4507);
        assert_eq!(EMP_IOC_GROUP_CLEAR, 0x4008_4508);
        assert_eq!(EMP_IOC_PORT_CTX, 0xC028_4509);
        assert_eq!(EMP_IOC_GANG, 0xC020_450A);
    }

    /// The numbers of the first ABI (`_IOWR`/`_IOW` with today's sizes).
    #[test]
    fn existing_command_numbers_are_unchanged() {
        assert_eq!(EMP_IOC_QUERY, 0xC050_4501);
        assert_eq!(EMP_IOC_REG_MR, 0xC030_4502);
        assert_eq!(EMP_IOC_ARM, 0x4008_4504);
        assert_eq!(EMP_IOC_SET_EVENTFD, 0x4010_4505);
        assert_eq!(EMP_IOC_START, 0x4018_4506);
    }

    #[test]
    fn decode_takes_type_number_and_direction_and_returns_the_size() {
        for c in IoctlCmd::ALL {
            for size in [0, 4, 8, 48, 80, 200, (1 << 14) - 1] {
                assert_eq!(IoctlCmd::decode(c.with_size(size)), Some((c, size)), "{c:?} {size}");
            }
        }
        assert_eq!(IoctlCmd::decode(EMP_IOC_QUERY), Some((IoctlCmd::Query, 80)));
        // Unknown number, another type, another direction: ENOTTY.
        assert_eq!(IoctlCmd::decode(ioc(IOC_READ | IOC_WRITE, EMP_IOC_MAGIC, 0x7f, 80)), None);
        assert_eq!(IoctlCmd::decode(ioc(IOC_READ | IOC_WRITE, EMP_IOC_MAGIC, 0, 80)), None);
        assert_eq!(IoctlCmd::decode(ioc(IOC_READ | IOC_WRITE, b'F' as u32, 1, 80)), None);
        assert_eq!(IoctlCmd::decode(ioc(IOC_WRITE, EMP_IOC_MAGIC, 1, 80)), None);
        assert_eq!(IoctlCmd::decode(ioc(IOC_READ | IOC_WRITE, EMP_IOC_MAGIC, 3, 8)), None);
        assert_eq!(IoctlCmd::decode(ioc(0, EMP_IOC_MAGIC, 4, 8)), None);
    }

    #[test]
    fn every_command_has_its_struct() {
        fn check<T: IoctlArg>(current: u32) {
            assert_eq!(IoctlCmd::decode(current), Some((T::CMD, T::SIZE)));
        }
        check::<EmpQuery>(EMP_IOC_QUERY);
        check::<EmpRegMr>(EMP_IOC_REG_MR);
        check::<EmpDeregMr>(EMP_IOC_DEREG_MR);
        check::<EmpArm>(EMP_IOC_ARM);
        check::<EmpSetEventfd>(EMP_IOC_SET_EVENTFD);
        check::<EmpStart>(EMP_IOC_START);
        check::<EmpGroupSet>(EMP_IOC_GROUP_SET);
        check::<EmpGroupClear>(EMP_IOC_GROUP_CLEAR);
        check::<EmpPortCtx>(EMP_IOC_PORT_CTX);
        check::<EmpGang>(EMP_IOC_GANG);
    }

    /// What the driver's reader would fail with.
    #[derive(Debug, PartialEq)]
    enum Fail {
        Arg(ArgError),
        /// The reader was asked for more than the caller's bytes.
        Overread,
    }

    impl From<ArgError> for Fail {
        fn from(e: ArgError) -> Self {
            Fail::Arg(e)
        }
    }

    /// `read_arg` over `user` bytes of caller memory; also returns how
    /// many bytes it read.
    fn read_from<T: IoctlArg>(user: &[u8]) -> (Result<T, Fail>, usize) {
        let mut at = 0;
        let r = read_arg::<T, Fail>(user.len(), |buf| {
            let src = user.get(at..at + buf.len()).ok_or(Fail::Overread)?;
            buf.copy_from_slice(src);
            at += buf.len();
            Ok(())
        });
        (r, at)
    }

    fn reg_mr_bytes(size: usize, total: usize) -> Vec<u8> {
        let mut b = vec![0u8; total.max(EmpRegMr::SIZE)];
        EmpRegMr { size: size as u32, access: 3, addr: 0x1000, length: 0x2000, ..Default::default() }.put(&mut b);
        b.truncate(total);
        b
    }

    #[test]
    fn the_current_size_reads_exactly() {
        let (r, read) = read_from::<EmpRegMr>(&reg_mr_bytes(48, 48));
        let q = r.unwrap();
        assert_eq!((q.size, q.access, q.addr, q.length), (48, 3, 0x1000, 0x2000));
        assert_eq!(read, 48);
    }

    #[test]
    fn a_shorter_struct_is_zero_extended() {
        let mut b = reg_mr_bytes(32, 32);
        b[28] = 0x55; // secret, inside the caller's struct: passed on.
        let (r, read) = read_from::<EmpRegMr>(&b);
        let q = r.unwrap();
        assert_eq!((q.size, q.access, q.addr, q.length, q.secret, q.reserved), (32, 3, 0x1000, 0x2000, 0x55, [0; 2]));
        assert_eq!(read, 32, "never reads past the caller's struct");
    }

    #[test]
    fn a_size_below_the_first_version_is_refused_unread() {
        for size in [0, 4, 31] {
            let (r, read) = read_from::<EmpRegMr>(&reg_mr_bytes(size, size));
            assert_eq!(r, Err(Fail::Arg(ArgError::TooShort)), "size {size}");
            assert_eq!(read, 0);
        }
        let (r, _) = read_from::<EmpQuery>(&[47, 0, 0, 0].repeat(12)[..47]);
        assert_eq!(r, Err(Fail::Arg(ArgError::TooShort)));
    }

    #[test]
    fn a_longer_struct_with_a_zero_tail_is_accepted() {
        for total in [49, 64, 48 + 64, 48 + 65, 4096] {
            let (r, read) = read_from::<EmpRegMr>(&reg_mr_bytes(total, total));
            let q = r.unwrap_or_else(|e| panic!("size {total}: {e:?}"));
            assert_eq!((q.size as usize, q.addr), (total, 0x1000));
            assert_eq!(read, total, "the whole tail is checked");
        }
    }

    #[test]
    fn a_longer_struct_with_a_non_zero_tail_is_too_big() {
        for (total, at) in [(49, 48), (200, 199), (200, 48 + 64), (4096, 3000)] {
            let mut b = reg_mr_bytes(total, total);
            b[at] = 1;
            let (r, _) = read_from::<EmpRegMr>(&b);
            assert_eq!(r, Err(Fail::Arg(ArgError::UnknownTail)), "size {total}, byte {at}");
        }
    }

    #[test]
    fn the_size_field_must_be_the_commands_size() {
        for (field, total) in [(7, 48), (48, 32), (32, 48), (48, 56), (0, 8)] {
            let (r, _) = read_from::<EmpRegMr>(&reg_mr_bytes(field, total.max(32)));
            assert_eq!(r, Err(Fail::Arg(ArgError::SizeMismatch)), "field {field}, size {total}");
        }
    }

    #[test]
    fn reader_faults_pass_through() {
        let r = read_arg::<EmpArm, Fail>(8, |_| Err(Fail::Overread));
        assert_eq!(r, Err(Fail::Overread));
    }

    #[test]
    fn every_struct_accepts_every_size_from_its_first_version() {
        fn check<T: IoctlArg>() {
            for user in T::SIZE_VER0..=T::SIZE + 16 {
                let mut b = vec![0u8; user];
                b[..4].copy_from_slice(&(user as u32).to_le_bytes());
                let (r, read) = read_from::<T>(&b);
                let v = r.unwrap_or_else(|e| panic!("{:?} size {user}: {e:?}", T::CMD));
                let mut want = [0u8; ARG_MAX];
                want[..4].copy_from_slice(&(user as u32).to_le_bytes());
                assert_eq!(v, T::get(&want[..T::SIZE]));
                assert_eq!(read, user);
            }
            assert_eq!(read_from::<T>(&vec![0; T::SIZE_VER0 - 1]).0, Err(Fail::Arg(ArgError::TooShort)));
        }
        check::<EmpQuery>();
        check::<EmpRegMr>();
        check::<EmpDeregMr>();
        check::<EmpArm>();
        check::<EmpSetEventfd>();
        check::<EmpStart>();
        check::<EmpGroupSet>();
        check::<EmpGroupClear>();
        check::<EmpPortCtx>();
        check::<EmpGang>();
    }

    #[test]
    fn results_never_go_past_either_struct() {
        let q = EmpQuery { size: 48, port: 3, pinned_pages: 9, reserved: [0, 7], ..Default::default() };
        for (user, want) in [(48, 48), (56, 56), (80, 80), (96, 80), (16383, 80)] {
            let mut out = Vec::new();
            write_arg::<EmpQuery, ()>(&q, user, |b| {
                out.extend_from_slice(b);
                Ok(())
            })
            .unwrap();
            assert_eq!(out.len(), want, "caller size {user}");
            let mut full = [0u8; 80];
            q.put(&mut full);
            assert_eq!(out[..], full[..want]);
        }
        assert_eq!(write_arg::<EmpArm, u8>(&EmpArm::default(), 8, |_| Err(5)), Err(5));
    }
}
