//! Firmware images at volume: a genuine signed image mutated (bit flips,
//! edge values, truncation, extension, splices of another signed image)
//! and random bytes, through `verify`. Nothing may panic, and whatever is
//! accepted must be byte for byte a genuinely signed image. A few seconds
//! in `make test`; `EMP_FUZZ_SECONDS=600 cargo test --release -p emp-nic
//! --test fuzz_image -- --nocapture` for a long run.

use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use emp_nic::image::{pack_unsigned, sign_in_place, verify, TrustedKeys, ELF_MAGIC};

/// xorshift64*: the run is reproducible from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn budget() -> Duration {
    Duration::from_secs_f64(std::env::var("EMP_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0))
}

fn image(payload_len: usize, key: &SigningKey, abi_build: (u32, &[u8])) -> Vec<u8> {
    let mut p = ELF_MAGIC.to_vec();
    p.extend((0..payload_len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let mut img = pack_unsigned(&p, abi_build.0, abi_build.1, 1).expect("pack");
    assert!(sign_in_place(&mut img, key));
    img
}

fn mutate(rng: &mut Rng, img: &mut Vec<u8>, other: &[u8]) {
    for _ in 0..1 + rng.below(3) {
        match rng.below(6) {
            0 if !img.is_empty() => {
                let i = rng.below(img.len());
                img[i] ^= 1 << rng.below(8);
            }
            1 if !img.is_empty() => {
                // A header word (the first 256 bytes) to an edge value.
                let i = rng.below(img.len().min(256) / 4) * 4;
                let v = [0u32, 1, u32::MAX, 0x7fff_ffff, img.len() as u32][rng.below(5)];
                if i + 4 <= img.len() {
                    img[i..i + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
            2 => img.truncate(rng.below(img.len() + 1)),
            3 => img.extend((0..rng.below(64)).map(|_| rng.next() as u8)),
            4 => {
                // Splice: a slice of another genuinely signed image.
                let (a, b) = (rng.below(other.len()), rng.below(other.len()));
                let (a, b) = (a.min(b), a.max(b));
                let at = rng.below(img.len() + 1);
                let end = (at + b - a).min(img.len());
                img[at..end].copy_from_slice(&other[a..a + (end - at)]);
            }
            _ => {}
        }
    }
}

#[test]
fn fuzz_firmware_images() {
    let key = SigningKey::from_bytes(&[0x42; 32]);
    let trusted = TrustedKeys::from_keys([key.verifying_key()]);
    let stranger = SigningKey::from_bytes(&[0x24; 32]);
    let genuine = image(3000, &key, (emp_uapi::image::FIRMWARE_ABI, b"fuzz-a"));
    let other = image(500, &key, (emp_uapi::image::FIRMWARE_ABI, b"fuzz-b"));
    let foreign = image(3000, &stranger, (emp_uapi::image::FIRMWARE_ABI, b"fuzz-a"));
    assert!(verify(&genuine, &trusted).is_ok() && verify(&other, &trusted).is_ok());
    assert!(verify(&foreign, &trusted).is_err(), "an image signed by an untrusted key is refused");
    let seed = 0x1a6e_u64;
    let mut rng = Rng(seed);
    let (start, mut executions, mut accepted_mutants) = (Instant::now(), 0u64, 0u64);
    while start.elapsed() < budget() {
        let mut img = match rng.below(8) {
            0 => (0..rng.below(4096)).map(|_| rng.next() as u8).collect(),
            1 => foreign.clone(),
            2 => other.clone(),
            _ => genuine.clone(),
        };
        mutate(&mut rng, &mut img, &other);
        if let Ok((_, payload)) = verify(&img, &trusted) {
            // Only a byte-identical signed image (a mutation that undid
            // itself, or a splice that rebuilt one) may pass.
            assert!(
                img == genuine || img == other,
                "execution {executions}: a tampered image was accepted ({} bytes, payload {} bytes)",
                img.len(),
                payload.len()
            );
            accepted_mutants += 1;
        }
        executions += 1;
    }
    eprintln!(
        "fuzz images seed {seed:#x}: {executions} executions, 0 crashes ({accepted_mutants} unchanged images accepted)"
    );
    assert!(executions > 0);
}
