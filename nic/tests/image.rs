//! Firmware image verification: every rule, every tampered byte, trusted
//! key directories, and arbitrary input never panicking.

use std::path::PathBuf;

use ed25519_dalek::SigningKey;
use emp_nic::image::{key_id, pack_unsigned, sign_in_place, verify, TrustedKeys, ELF_MAGIC};
use emp_uapi::image::{ImageHeader, FIRMWARE_ABI, SIGNED_LEN};
use emp_uapi::sram::FailReason;
use emp_uapi::Le;
use proptest::prelude::*;

fn payload() -> Vec<u8> {
    let mut p = ELF_MAGIC.to_vec();
    p.extend((0..1000u32).map(|i| (i.wrapping_mul(31) ^ 0x5a) as u8));
    p
}

fn signer() -> SigningKey {
    SigningKey::from_bytes(&[0x11; 32])
}

fn trusted() -> TrustedKeys {
    TrustedKeys::from_keys([signer().verifying_key()])
}

fn signed_image(abi: u32) -> Vec<u8> {
    let mut img = pack_unsigned(&payload(), abi, b"abc1234", 3).expect("pack");
    assert!(sign_in_place(&mut img, &signer()));
    img
}

fn tmpdir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("nic-image-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn good_image_verifies() {
    let img = signed_image(FIRMWARE_ABI);
    let (h, p) = verify(&img, &trusted()).expect("verifies");
    assert_eq!(p, &payload()[..]);
    assert_eq!(h.abi, FIRMWARE_ABI);
    assert_eq!(h.cpu_plan, 3);
    assert_eq!(h.payload_len, payload().len() as u64);
}

#[test]
fn any_payload_byte_flip_is_digest_mismatch() {
    let img = signed_image(FIRMWARE_ABI);
    let t = trusted();
    for i in ImageHeader::SIZE..img.len() {
        let mut bad = img.clone();
        bad[i] ^= 0x01;
        assert_eq!(verify(&bad, &t), Err(FailReason::DigestMismatch), "payload byte {i}");
    }
}

#[test]
fn any_header_byte_flip_is_refused() {
    let img = signed_image(FIRMWARE_ABI);
    let t = trusted();
    // Header fields whose corruption must surface as a bad signature:
    // everything signed that the header parser and the ABI / digest checks
    // don't look at (build id, cpu plan, key id).
    use core::mem::offset_of;
    let build_id = offset_of!(ImageHeader, build_id);
    let key_id_at = offset_of!(ImageHeader, key_id);
    let free = |i: usize| (build_id..build_id + 24).contains(&i) || (key_id_at..key_id_at + 8).contains(&i);
    assert_eq!(offset_of!(ImageHeader, cpu_plan), build_id + 20);
    for i in 0..ImageHeader::SIZE {
        for bit in [0x01u8, 0x80] {
            let mut bad = img.clone();
            bad[i] ^= bit;
            let r = verify(&bad, &t);
            if i < SIGNED_LEN && free(i) {
                assert_eq!(r, Err(FailReason::BadSignature), "header byte {i}");
            } else if (SIGNED_LEN..SIGNED_LEN + 64).contains(&i) {
                assert_eq!(r, Err(FailReason::BadSignature), "signature byte {i}");
            } else {
                assert!(
                    matches!(
                        r,
                        Err(FailReason::BadImageHeader
                            | FailReason::WrongAbi
                            | FailReason::DigestMismatch
                            | FailReason::BadSignature)
                    ),
                    "header byte {i}: {r:?}"
                );
            }
        }
    }
}

#[test]
fn wrong_abi_resigned() {
    let img = signed_image(FIRMWARE_ABI + 1);
    assert_eq!(verify(&img, &trusted()), Err(FailReason::WrongAbi));
    // Everything else about it is fine: only the ABI differs.
    let mut h = ImageHeader::decode(&img).unwrap();
    assert_eq!(h.key_id, key_id(&signer().verifying_key()));
    h.abi = FIRMWARE_ABI;
    let mut fixed = img.clone();
    h.encode(&mut fixed).unwrap();
    assert!(sign_in_place(&mut fixed, &signer()));
    assert!(verify(&fixed, &trusted()).is_ok());
}

#[test]
fn unsigned_is_bad_signature() {
    let img = pack_unsigned(&payload(), FIRMWARE_ABI, b"", 0).unwrap();
    assert!(ImageHeader::parse(&img).unwrap().is_unsigned());
    assert_eq!(verify(&img, &trusted()), Err(FailReason::BadSignature));
}

#[test]
fn untrusted_key_is_bad_signature() {
    let img = signed_image(FIRMWARE_ABI);
    let other = TrustedKeys::from_keys([SigningKey::from_bytes(&[0x22; 32]).verifying_key()]);
    assert_eq!(verify(&img, &other), Err(FailReason::BadSignature));
    assert_eq!(verify(&img, &TrustedKeys::default()), Err(FailReason::BadSignature));
    // A valid signature by another key, with the trusted key's id pasted in.
    let mut forged = pack_unsigned(&payload(), FIRMWARE_ABI, b"abc1234", 3).unwrap();
    sign_in_place(&mut forged, &SigningKey::from_bytes(&[0x22; 32]));
    let mut h = ImageHeader::decode(&forged).unwrap();
    h.key_id = key_id(&signer().verifying_key());
    h.encode(&mut forged).unwrap();
    assert_eq!(verify(&forged, &trusted()), Err(FailReason::BadSignature));
}

#[test]
fn truncated_is_bad_header() {
    let img = signed_image(FIRMWARE_ABI);
    let t = trusted();
    for len in [0, 1, 8, 100, ImageHeader::SIZE - 1, ImageHeader::SIZE, ImageHeader::SIZE + 1, img.len() - 1] {
        assert_eq!(verify(&img[..len], &t), Err(FailReason::BadImageHeader), "len {len}");
    }
    let mut longer = img.clone();
    longer.push(0);
    assert_eq!(verify(&longer, &t), Err(FailReason::BadImageHeader));
}

#[test]
fn not_elf_is_load_failed() {
    let mut img = pack_unsigned(b"#!/bin/sh\nexit 0\n", FIRMWARE_ABI, b"", 0).unwrap();
    sign_in_place(&mut img, &signer());
    assert_eq!(verify(&img, &trusted()), Err(FailReason::LoadFailed));
}

#[test]
fn load_dir_reads_raw_and_hex_keys() {
    let d = tmpdir("load");
    let a = SigningKey::from_bytes(&[0x11; 32]).verifying_key();
    let b = SigningKey::from_bytes(&[0x33; 32]).verifying_key();
    std::fs::write(d.join("a.pub"), a.as_bytes()).unwrap();
    let hexed: String = b.as_bytes().iter().map(|x| format!("{x:02x}")).collect();
    std::fs::write(d.join("b.pub"), format!("{hexed}\n")).unwrap();
    std::fs::write(d.join("a.key"), [0u8; 32]).unwrap();
    std::fs::write(d.join("README"), "ignored").unwrap();
    let t = TrustedKeys::load_dir(&d).expect("loads");
    assert_eq!(t.keys(), &[a, b]);
    assert!(verify(&signed_image(FIRMWARE_ABI), &t).is_ok());

    std::fs::write(d.join("c.pub"), "not a key\n").unwrap();
    let e = TrustedKeys::load_dir(&d).unwrap_err().to_string();
    assert!(e.contains("c.pub"), "{e}");

    let empty = tmpdir("empty");
    assert!(TrustedKeys::load_dir(&empty).unwrap().is_empty());
    let e = TrustedKeys::load_dir(empty.join("missing")).unwrap_err().to_string();
    assert!(e.contains("missing"), "{e}");
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = verify(&bytes, &trusted());
    }

    #[test]
    fn mutated_images_never_panic_or_pass(
        edits in proptest::collection::vec((0usize..1300, any::<u8>()), 1..8),
        cut in 0usize..1300,
    ) {
        let img = signed_image(FIRMWARE_ABI);
        let mut bad = img.clone();
        for (i, v) in edits {
            if let Some(b) = bad.get_mut(i % img.len()) {
                *b ^= v | 1;
            }
        }
        bad.truncate(cut.max(1));
        let r = verify(&bad, &trusted());
        prop_assert!(r.is_err() || bad == img);
    }
}
