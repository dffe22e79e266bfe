//! Firmware image verification: the NIC's gatekeeper between the staging
//! area and the loader.
//!
//! An image is an [`ImageHeader`] followed by an ELF payload. [`verify`]
//! checks, in this order, and stops at the first rule broken:
//!
//! 1. the header parses (magic, header version, reserved fields, payload
//!    length) — else [`FailReason::BadImageHeader`];
//! 2. it was built for [`FIRMWARE_ABI`] — else [`FailReason::WrongAbi`];
//! 3. SHA-256 of the payload equals `header.sha256` — else
//!    [`FailReason::DigestMismatch`];
//! 4. it carries an ed25519 signature over header bytes `0..SIGNED_LEN`
//!    (which include the digest) that verifies strictly under a trusted key
//!    whose key id (first 8 bytes of SHA-256 of the public key) equals
//!    `header.key_id` — else [`FailReason::BadSignature`];
//! 5. the payload starts with the ELF magic — else [`FailReason::LoadFailed`].
//!
//! Nothing here panics on any input.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use emp_uapi::image::{ImageHeader, FIRMWARE_ABI, IMAGE_HEADER_VERSION, IMAGE_MAGIC, SIGNED_LEN};
use emp_uapi::sram::FailReason;
use emp_uapi::Le;
use sha2::{Digest, Sha256};

/// First bytes of every ELF file.
pub const ELF_MAGIC: [u8; 4] = *b"\x7fELF";

/// Key id of a public key: the first 8 bytes of SHA-256 of its 32 bytes.
pub fn key_id(key: &VerifyingKey) -> [u8; 8] {
    let d = Sha256::digest(key.as_bytes());
    let mut id = [0u8; 8];
    id.copy_from_slice(&d[..8]);
    id
}

/// The public keys whose signatures the NIC accepts.
#[derive(Clone, Default)]
pub struct TrustedKeys(Vec<VerifyingKey>);

impl fmt::Debug for TrustedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter().map(|k| hex(&key_id(k)))).finish()
    }
}

impl TrustedKeys {
    /// A set holding exactly `keys`.
    pub fn from_keys(keys: impl IntoIterator<Item = VerifyingKey>) -> Self {
        TrustedKeys(keys.into_iter().collect())
    }

    /// Loads every `*.pub` file in `dir` (sorted by name). A file holds
    /// either the 32 raw key bytes or 64 hex digits with an optional
    /// trailing newline. Other files are ignored. An unreadable directory,
    /// or any `*.pub` file that is malformed or not a valid ed25519 point,
    /// is an error whose message names the path. An empty result is not an
    /// error (see [`TrustedKeys::is_empty`]).
    pub fn load_dir(dir: impl AsRef<Path>) -> io::Result<Self> {
        let dir = dir.as_ref();
        let named = |path: &Path, e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let mut files: Vec<PathBuf> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| named(dir, e))? {
            let path = entry.map_err(|e| named(dir, e))?.path();
            if path.extension().is_some_and(|x| x == "pub") && !path.is_dir() {
                files.push(path);
            }
        }
        files.sort();
        let mut keys = Vec::with_capacity(files.len());
        for path in files {
            let bytes = std::fs::read(&path).map_err(|e| named(&path, e))?;
            let key = parse_public_key(&bytes)
                .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {why}", path.display())))?;
            keys.push(key);
        }
        Ok(TrustedKeys(keys))
    }

    /// True when no key is trusted (then no image verifies).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of trusted keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The trusted keys.
    pub fn keys(&self) -> &[VerifyingKey] {
        &self.0
    }
}

/// Parses a public key file's contents: 32 raw bytes, or 64 hex digits
/// optionally followed by `\n` (or `\r\n`).
pub fn parse_public_key(bytes: &[u8]) -> Result<VerifyingKey, String> {
    let raw: [u8; 32] = if bytes.len() == 32 {
        let mut k = [0u8; 32];
        k.copy_from_slice(bytes);
        k
    } else {
        let text = bytes.strip_suffix(b"\n").map(|t| t.strip_suffix(b"\r").unwrap_or(t)).unwrap_or(bytes);
        if text.len() != 64 {
            return Err(format!(
                "not a public key: expected 32 raw bytes or 64 hex digits, found {} bytes",
                bytes.len()
            ));
        }
        let mut k = [0u8; 32];
        for (i, pair) in text.chunks_exact(2).enumerate() {
            match (hex_val(pair[0]), hex_val(pair[1])) {
                (Some(h), Some(l)) => k[i] = h << 4 | l,
                _ => return Err("not a public key: invalid hex digit".into()),
            }
        }
        k
    };
    VerifyingKey::from_bytes(&raw).map_err(|_| "not a valid ed25519 public key".into())
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Verifies a firmware image (see the module docs for the rules and their
/// order). On success returns the header and the payload (an ELF image).
pub fn verify<'a>(image: &'a [u8], trusted: &TrustedKeys) -> Result<(ImageHeader, &'a [u8]), FailReason> {
    let header = ImageHeader::parse(image).map_err(|_| FailReason::BadImageHeader)?;
    // `parse` checked that exactly `payload_len` bytes follow the header.
    let payload = image.get(ImageHeader::SIZE..).ok_or(FailReason::BadImageHeader)?;
    if header.abi != FIRMWARE_ABI {
        return Err(FailReason::WrongAbi);
    }
    if Sha256::digest(payload).as_slice() != header.sha256.as_slice() {
        return Err(FailReason::DigestMismatch);
    }
    if header.is_unsigned() {
        return Err(FailReason::BadSignature);
    }
    let signed = image.get(..SIGNED_LEN).ok_or(FailReason::BadImageHeader)?;
    let signature = Signature::from_bytes(&header.signature);
    let ok =
        trusted.0.iter().filter(|k| key_id(k) == header.key_id).any(|k| k.verify_strict(signed, &signature).is_ok());
    if !ok {
        return Err(FailReason::BadSignature);
    }
    if !payload.starts_with(&ELF_MAGIC) {
        return Err(FailReason::LoadFailed);
    }
    Ok((header, payload))
}

/// Builds an unsigned image around `payload` (for tests and tools that
/// link the NIC; the `emp fw pack` command is the real packer). Returns
/// `None` when the payload is empty or too large for the header.
pub fn pack_unsigned(payload: &[u8], abi: u32, build_id: &[u8], cpu_plan: u32) -> Option<Vec<u8>> {
    if payload.is_empty() || payload.len() as u64 > emp_uapi::image::PAYLOAD_MAX || build_id.len() > 20 {
        return None;
    }
    let mut id = [0u8; 20];
    id[..build_id.len()].copy_from_slice(build_id);
    let header = ImageHeader {
        magic: IMAGE_MAGIC,
        header_version: IMAGE_HEADER_VERSION,
        abi,
        build_id: id,
        cpu_plan,
        payload_len: payload.len() as u64,
        sha256: Sha256::digest(payload).into(),
        ..Default::default()
    };
    let mut image = vec![0u8; ImageHeader::SIZE + payload.len()];
    header.encode(&mut image).ok()?;
    image[ImageHeader::SIZE..].copy_from_slice(payload);
    Some(image)
}

/// Signs `image` in place with `key` (fills `key_id` and `signature`,
/// replacing any previous signature). Returns `false`, leaving the image
/// untouched, when it is shorter than a header.
pub fn sign_in_place(image: &mut [u8], key: &SigningKey) -> bool {
    let Ok(mut header) = ImageHeader::decode(image) else {
        return false;
    };
    header.key_id = key_id(&key.verifying_key());
    header.signature = [0; 64];
    if header.encode(image).is_err() {
        return false;
    }
    header.signature = key.sign(&image[..SIGNED_LEN]).to_bytes();
    header.encode(image).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload() -> Vec<u8> {
        let mut p = ELF_MAGIC.to_vec();
        p.extend((0..300u32).map(|i| (i * 7 + 3) as u8));
        p
    }

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn good(abi: u32) -> (Vec<u8>, TrustedKeys) {
        let k = key(1);
        let mut img = pack_unsigned(&payload(), abi, b"test", 0).unwrap();
        assert!(sign_in_place(&mut img, &k));
        (img, TrustedKeys::from_keys([key(9).verifying_key(), k.verifying_key()]))
    }

    #[test]
    fn good_image_verifies() {
        let (img, trusted) = good(FIRMWARE_ABI);
        let (h, p) = verify(&img, &trusted).unwrap();
        assert_eq!(p, payload().as_slice());
        assert_eq!(h.key_id, key_id(&key(1).verifying_key()));
        assert_eq!(&h.build_id[..4], b"test");
    }

    #[test]
    fn each_rule_has_its_reason() {
        let (img, trusted) = good(FIRMWARE_ABI);
        assert_eq!(verify(&img[..100], &trusted), Err(FailReason::BadImageHeader));
        assert_eq!(verify(&img[..img.len() - 1], &trusted), Err(FailReason::BadImageHeader));
        let (wrong, t2) = good(FIRMWARE_ABI + 1);
        assert_eq!(verify(&wrong, &t2), Err(FailReason::WrongAbi));
        let mut tampered = img.clone();
        *tampered.last_mut().unwrap() ^= 0x40;
        assert_eq!(verify(&tampered, &trusted), Err(FailReason::DigestMismatch));
        let unsigned = pack_unsigned(&payload(), FIRMWARE_ABI, b"", 0).unwrap();
        assert_eq!(verify(&unsigned, &trusted), Err(FailReason::BadSignature));
        assert_eq!(verify(&img, &TrustedKeys::from_keys([key(2).verifying_key()])), Err(FailReason::BadSignature));
        assert_eq!(verify(&img, &TrustedKeys::default()), Err(FailReason::BadSignature));
        let mut not_elf = pack_unsigned(b"MZ not an elf", FIRMWARE_ABI, b"", 0).unwrap();
        sign_in_place(&mut not_elf, &key(1));
        assert_eq!(verify(&not_elf, &trusted), Err(FailReason::LoadFailed));
    }

    #[test]
    fn resigning_replaces_signature() {
        let (mut img, _) = good(FIRMWARE_ABI);
        assert!(sign_in_place(&mut img, &key(2)));
        let t2 = TrustedKeys::from_keys([key(2).verifying_key()]);
        assert!(verify(&img, &t2).is_ok());
        let t1 = TrustedKeys::from_keys([key(1).verifying_key()]);
        assert_eq!(verify(&img, &t1), Err(FailReason::BadSignature));
    }

    #[test]
    fn key_file_formats() {
        let vk = key(3).verifying_key();
        let hexed = hex(vk.as_bytes());
        assert_eq!(parse_public_key(vk.as_bytes()).unwrap(), vk);
        assert_eq!(parse_public_key(hexed.as_bytes()).unwrap(), vk);
        assert_eq!(parse_public_key(format!("{hexed}\n").as_bytes()).unwrap(), vk);
        assert_eq!(parse_public_key(hexed.to_uppercase().as_bytes()).unwrap(), vk);
        assert!(parse_public_key(format!("{hexed}\n\n").as_bytes()).is_err());
        assert!(parse_public_key(&hexed.as_bytes()[..63]).is_err());
        assert!(parse_public_key(format!("z{}", &hexed[1..]).as_bytes()).is_err());
        assert!(parse_public_key(b"").is_err());
    }
}
