//! Firmware image: `ImageHeader` (256 bytes) followed by the payload (an
//! ELF shared object exporting the control program's entry points).
//!
//! The signature is ed25519 over the first `SIGNED_LEN` bytes of the header
//! (which include the payload's SHA-256), so tampering with either the
//! header or the payload is detected. Verification itself lives in the NIC
//! (it needs crypto crates); this module only parses.

use crate::{le_struct, DecodeError, Le};

/// Image magic: "EMPFWIMG".
pub const IMAGE_MAGIC: u64 = u64::from_le_bytes(*b"EMPFWIMG");
/// Version of this header format.
pub const IMAGE_HEADER_VERSION: u32 = 1;
/// ABI between the NIC hardware model and the control program.
/// 2: `FwHal::dma_fence`. 4: `FwHal::mac_transmit_host`. 5: `FwHal::sram_base`. 6: `FwHal::dma_windows`.
pub const FIRMWARE_ABI: u32 = 6;
/// Bytes covered by the signature (everything before `signature`).
pub const SIGNED_LEN: usize = core::mem::offset_of!(ImageHeader, signature);
/// Largest payload accepted.
pub const PAYLOAD_MAX: u64 = 64 << 20;

/// CPU plans (EMP thesis ch. 3): how the firmware's steps are split over
/// the NIC CPUs.
pub mod cpu_plan {
    /// Everything on one CPU.
    pub const BASE: u32 = 0;
    /// Send path split (SO).
    pub const SO: u32 = 1;
    /// Receive path split (RO).
    pub const RO: u32 = 2;
    /// SO + RO.
    pub const SR: u32 = 3;
    /// Dedicated send / receive CPUs.
    pub const DSR: u32 = 4;
}

le_struct! {
    /// Firmware image header (256 bytes).
    pub struct ImageHeader {
        /// [`IMAGE_MAGIC`].
        pub magic: u64,
        /// [`IMAGE_HEADER_VERSION`].
        pub header_version: u32,
        /// [`FIRMWARE_ABI`] the payload was built for.
        pub abi: u32,
        /// Build id (e.g. a git hash), informational.
        pub build_id: [u8; 20],
        /// Default [`cpu_plan`].
        pub cpu_plan: u32,
        /// Payload bytes after the header.
        pub payload_len: u64,
        /// SHA-256 of the payload.
        pub sha256: [u8; 32],
        /// First 8 bytes of SHA-256 of the signing public key.
        pub key_id: [u8; 8],
        /// Reserved, zero.
        pub reserved: [u64; 8],
        /// ed25519 signature over bytes `0..SIGNED_LEN`; all zero = unsigned.
        pub signature: [u8; 64],
        /// Reserved, zero (not signed).
        pub reserved_tail: [u64; 5],
    }
    size = 256;
}

impl ImageHeader {
    /// Parses and checks the header of `image` (header + payload): magic,
    /// versions, reserved fields and the payload length. Does not check the
    /// digest or the signature.
    pub fn parse(image: &[u8]) -> Result<ImageHeader, DecodeError> {
        let h = ImageHeader::decode(image)?;
        if h.magic != IMAGE_MAGIC {
            return Err(DecodeError::BadMagic);
        }
        if h.header_version != IMAGE_HEADER_VERSION {
            return Err(DecodeError::BadVersion);
        }
        if h.reserved != [0; 8] || h.reserved_tail != [0; 5] {
            return Err(DecodeError::ReservedNotZero);
        }
        if h.payload_len == 0
            || h.payload_len > PAYLOAD_MAX
            || (image.len() - ImageHeader::SIZE) as u64 != h.payload_len
        {
            return Err(DecodeError::BadLength);
        }
        Ok(h)
    }

    /// True when the signature field is all zero.
    pub fn is_unsigned(&self) -> bool {
        self.signature == [0; 64]
    }
}

// The signature cannot sign itself.
const _: () = assert!(SIGNED_LEN < ImageHeader::SIZE);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_checks_length_and_magic() {
        let h = ImageHeader {
            magic: IMAGE_MAGIC,
            header_version: 1,
            abi: FIRMWARE_ABI,
            payload_len: 4,
            ..Default::default()
        };
        let mut img = [0u8; 260];
        h.encode(&mut img).unwrap();
        assert_eq!(ImageHeader::parse(&img), Ok(h));
        assert_eq!(ImageHeader::parse(&img[..259]), Err(DecodeError::BadLength));
        img[0] ^= 1;
        assert_eq!(ImageHeader::parse(&img), Err(DecodeError::BadMagic));
    }
}
