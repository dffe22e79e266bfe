//! EMP contracts shared by every piece: the NIC memory map (SRAM header,
//! admin mailbox, MR/route/group tables, port windows), work descriptors and
//! completions, physically addressed translation formats, wire frames, the
//! firmware image header, the ioctl ABI and the ring protocol ([`ring`]).
//!
//! `#![no_std]` and dependency-free: the kernel module compiles these files.
//!
//! Every shared structure is `#[repr(C)]`, has no implicit padding (checked at
//! compile time) and is encoded little-endian field by field through [`Le`],
//! so the byte image is identical to the in-memory layout on x86-64 and no
//! `unsafe` transmute is needed. Decoders of bytes that come from outside
//! (frames, descriptors, images, tables written by a less trusted party)
//! validate and return [`DecodeError`]; none panics on any input.
// The kernel module includes this file as a module of its own crate (built
// with `--cfg CONFIG_RUST`), where `no_std` is the crate's business.
#![cfg_attr(not(CONFIG_RUST), no_std)]
#![forbid(unsafe_code)]

pub mod attach;
pub mod coll;
pub mod desc;
pub mod fwabi;
pub mod image;
pub mod ioctl;
pub mod ring;
pub mod sram;
pub mod wire;

/// Node id and port number meaning "any" in a receive's source filter.
pub const ANY_NODE: u16 = 0xFFFF;
/// See [`ANY_NODE`].
pub const ANY_PORT: u16 = 0xFFFF;
/// Ethertype of EMP frames on raw Ethernet.
pub const ETHERTYPE_EMP: u16 = 0x88B5;
/// Host page size assumed by the physically addressed formats.
pub const PAGE_SIZE: usize = 4096;

/// Why bytes from outside were refused. Each variant names the rule broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the structure needs.
    Truncated,
    /// Unknown protocol, layout or ABI version.
    BadVersion,
    /// Unknown frame kind, opcode, format or status.
    BadKind,
    /// A reserved field is not zero.
    ReservedNotZero,
    /// A length field disagrees with the bytes present or with a limit.
    BadLength,
    /// An index or count is out of range (frame index >= frame count, …).
    BadIndex,
    /// Bad magic number / board signature.
    BadMagic,
}

impl DecodeError {
    /// A short human-readable reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            DecodeError::Truncated => "truncated",
            DecodeError::BadVersion => "unsupported version",
            DecodeError::BadKind => "unknown kind",
            DecodeError::ReservedNotZero => "reserved field not zero",
            DecodeError::BadLength => "inconsistent length",
            DecodeError::BadIndex => "index out of range",
            DecodeError::BadMagic => "bad magic",
        }
    }
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// All-zero bytes: the default value of every `le_struct!` type is its
/// all-zero encoding (structures are at most this large).
pub static ZEROS: [u8; 4096] = [0; 4096];

/// Little-endian field-by-field encoding of a fixed-size value.
///
/// `put` and `get` require a slice of at least `SIZE` bytes (callers use
/// [`Le::encode`] / [`Le::decode`], which check).
pub trait Le: Sized + Copy {
    /// Encoded size in bytes (equals `size_of::<Self>()` for `le_struct!` types).
    const SIZE: usize;
    /// Writes `self` into `out[..SIZE]`.
    fn put(&self, out: &mut [u8]);
    /// Reads a value from `b[..SIZE]`.
    fn get(b: &[u8]) -> Self;

    /// Reads a value, refusing a short slice.
    fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        if b.len() < Self::SIZE {
            return Err(DecodeError::Truncated);
        }
        Ok(Self::get(&b[..Self::SIZE]))
    }

    /// Writes a value, refusing a short slice.
    fn encode(&self, out: &mut [u8]) -> Result<(), DecodeError> {
        if out.len() < Self::SIZE {
            return Err(DecodeError::Truncated);
        }
        self.put(&mut out[..Self::SIZE]);
        Ok(())
    }
}

macro_rules! le_int {
    ($($t:ty),*) => {$(
        impl Le for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            #[inline]
            fn put(&self, out: &mut [u8]) {
                out[..Self::SIZE].copy_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn get(b: &[u8]) -> Self {
                let mut a = [0u8; core::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..Self::SIZE]);
                <$t>::from_le_bytes(a)
            }
        }
    )*};
}
le_int!(u8, u16, u32, u64, i32, i64);

impl<T: Le, const N: usize> Le for [T; N] {
    const SIZE: usize = T::SIZE * N;
    fn put(&self, out: &mut [u8]) {
        for (i, v) in self.iter().enumerate() {
            v.put(&mut out[i * T::SIZE..(i + 1) * T::SIZE]);
        }
    }
    fn get(b: &[u8]) -> Self {
        core::array::from_fn(|i| T::get(&b[i * T::SIZE..(i + 1) * T::SIZE]))
    }
}

/// Declares a `#[repr(C)]` struct with an [`Le`] encoding that mirrors its
/// memory layout, and asserts at compile time that its size is `$size` and
/// that it has no implicit padding.
#[macro_export]
macro_rules! le_struct {
    (
        $(#[$m:meta])*
        pub struct $name:ident { $( $(#[$fm:meta])* pub $f:ident : $t:ty ),* $(,)? }
        size = $size:expr;
    ) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name { $( $(#[$fm])* pub $f: $t ),* }

        const _: () = assert!(core::mem::size_of::<$name>() == $size);
        const _: () = assert!(0 $(+ <$t as $crate::Le>::SIZE)* == $size, "implicit padding");

        impl Default for $name {
            fn default() -> Self {
                <Self as $crate::Le>::get(&$crate::ZEROS[..$size])
            }
        }

        impl $crate::Le for $name {
            const SIZE: usize = $size;
            #[inline]
            fn put(&self, out: &mut [u8]) {
                $( $crate::Le::put(
                    &self.$f,
                    &mut out[core::mem::offset_of!($name, $f)..][..<$t as $crate::Le>::SIZE],
                ); )*
            }
            #[inline]
            fn get(b: &[u8]) -> Self {
                Self { $( $f: <$t as $crate::Le>::get(
                    &b[core::mem::offset_of!($name, $f)..][..<$t as $crate::Le>::SIZE],
                ) ),* }
            }
        }
    };
}

/// Wrapping comparison of 32-bit sequence numbers (RFC 1982 style):
/// true when `a` comes before `b`.
#[inline]
pub const fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// Wrapping `a <= b` for sequence numbers.
#[inline]
pub const fn seq_le(a: u32, b: u32) -> bool {
    a == b || seq_lt(a, b)
}
