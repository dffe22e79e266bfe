//! `emp fw`: firmware signing keys, image packing, signing and inspection.
//!
//! Image format: `emp_uapi::image`. The verification rules in
//! [`check`] are the NIC's (`emp_nic::image::verify`), restated here because
//! the tools do not link the NIC: header, ABI, digest, signature (strict
//! ed25519 under a trusted key whose id matches `key_id`), ELF payload.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clap::{Subcommand, ValueEnum};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use emp_uapi::image::{
    cpu_plan, ImageHeader, FIRMWARE_ABI, IMAGE_HEADER_VERSION, IMAGE_MAGIC, PAYLOAD_MAX, SIGNED_LEN,
};
use emp_uapi::sram::FailReason;
use emp_uapi::Le;
use rand_core::OsRng;
use sha2::{Digest, Sha256};

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const BUILD_ID_MAX: usize = 20;

/// `emp fw …` subcommands.
#[derive(Subcommand, Debug)]
pub enum FwCmd {
    /// Generate an ed25519 signing key: NAME.key (32-byte secret seed,
    /// mode 0600) and NAME.pub (64 hex digits).
    Keygen {
        /// Directory to write the key files into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Base name of the key files.
        #[arg(long, default_value = "dev")]
        name: String,
        /// Overwrite existing key files.
        #[arg(long)]
        force: bool,
        /// Do nothing when both key files already exist.
        #[arg(long, conflicts_with = "force")]
        if_missing: bool,
    },
    /// Wrap an ELF payload in an (unsigned) firmware image.
    Pack {
        /// The control program: an ELF shared object.
        #[arg(long)]
        payload: PathBuf,
        /// Image file to write.
        #[arg(long)]
        out: PathBuf,
        /// Informational build id (at most 20 bytes, e.g. a short git hash).
        #[arg(long, default_value = "")]
        build_id: String,
        /// Default split of the firmware's steps over the NIC CPUs.
        #[arg(long, value_enum, default_value_t = CpuPlan::Base)]
        cpu_plan: CpuPlan,
        /// Firmware ABI to record (tests only; the default is this build's).
        #[arg(long, default_value_t = FIRMWARE_ABI)]
        abi: u32,
    },
    /// Sign an image (replaces any previous signature).
    Sign {
        /// Secret key file written by `emp fw keygen`.
        #[arg(long)]
        key: PathBuf,
        /// Image to sign (in place unless --out is given).
        image: PathBuf,
        /// Write the signed image here instead.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Show an image's header and check it; exit status 0 only if well
    /// formed (and, with --trusted, signed by a trusted key).
    Inspect {
        /// Image file.
        image: PathBuf,
        /// Directory of trusted public keys (*.pub) to verify against.
        #[arg(long)]
        trusted: Option<PathBuf>,
    },
}

/// CPU plans (see `emp_uapi::image::cpu_plan`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CpuPlan {
    /// Everything on one CPU.
    Base,
    /// Send path split.
    So,
    /// Receive path split.
    Ro,
    /// Send and receive paths split.
    Sr,
    /// Dedicated send / receive CPUs.
    Dsr,
}

impl CpuPlan {
    fn code(self) -> u32 {
        match self {
            CpuPlan::Base => cpu_plan::BASE,
            CpuPlan::So => cpu_plan::SO,
            CpuPlan::Ro => cpu_plan::RO,
            CpuPlan::Sr => cpu_plan::SR,
            CpuPlan::Dsr => cpu_plan::DSR,
        }
    }

    fn name(code: u32) -> &'static str {
        match code {
            cpu_plan::BASE => "base",
            cpu_plan::SO => "so",
            cpu_plan::RO => "ro",
            cpu_plan::SR => "sr",
            cpu_plan::DSR => "dsr",
            _ => "unknown",
        }
    }
}

/// Runs one `emp fw` subcommand. The error is a complete message (naming
/// the file concerned) for `emp: <message>`.
pub fn run(cmd: FwCmd) -> Result<(), String> {
    match cmd {
        FwCmd::Keygen { out, name, force, if_missing } => keygen(&out, &name, force, if_missing),
        FwCmd::Pack { payload, out, build_id, cpu_plan, abi } => pack(&payload, &out, &build_id, cpu_plan, abi),
        FwCmd::Sign { key, image, out } => sign(&key, &image, out.as_deref()),
        FwCmd::Inspect { image, trusted } => inspect(&image, trusted.as_deref()),
    }
}

fn keygen(dir: &Path, name: &str, force: bool, if_missing: bool) -> Result<(), String> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        return Err(format!("bad key name {name:?}: must be a plain file name"));
    }
    let key_path = dir.join(format!("{name}.key"));
    let pub_path = dir.join(format!("{name}.pub"));
    let (key_exists, pub_exists) = (exists(&key_path)?, exists(&pub_path)?);
    if if_missing && key_exists && pub_exists {
        println!("keys exist: {} {}", key_path.display(), pub_path.display());
        return Ok(());
    }
    if !force {
        for (path, there) in [(&key_path, key_exists), (&pub_path, pub_exists)] {
            if there {
                return Err(format!("{}: already exists; refusing to overwrite (use --force)", path.display()));
            }
        }
    }
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let key = SigningKey::generate(&mut OsRng);
    let public = hex(key.verifying_key().as_bytes()) + "\n";
    write_atomic(&key_path, key.as_bytes(), 0o600)?;
    write_atomic(&pub_path, public.as_bytes(), 0o644)?;
    println!("wrote {} and {} (key id {})", key_path.display(), pub_path.display(), hex(&key_id(&key.verifying_key())));
    Ok(())
}

fn pack(payload_path: &Path, out: &Path, build_id: &str, plan: CpuPlan, abi: u32) -> Result<(), String> {
    let p = payload_path.display();
    let size = fs::metadata(payload_path).map_err(|e| format!("{p}: {e}"))?.len();
    if size > PAYLOAD_MAX {
        return Err(format!("{p}: payload is {size} bytes, larger than the limit of {PAYLOAD_MAX}"));
    }
    let payload = read(payload_path)?;
    if payload.is_empty() {
        return Err(format!("{p}: payload is empty"));
    }
    if payload.len() as u64 > PAYLOAD_MAX {
        return Err(format!("{p}: payload is larger than the limit of {PAYLOAD_MAX} bytes"));
    }
    if !payload.starts_with(ELF_MAGIC) {
        return Err(format!("{p}: payload is not an ELF file"));
    }
    if build_id.len() > BUILD_ID_MAX {
        return Err(format!("build id {build_id:?} is longer than {BUILD_ID_MAX} bytes"));
    }
    let mut id = [0u8; BUILD_ID_MAX];
    id[..build_id.len()].copy_from_slice(build_id.as_bytes());
    let digest: [u8; 32] = Sha256::digest(&payload).into();
    let header = ImageHeader {
        magic: IMAGE_MAGIC,
        header_version: IMAGE_HEADER_VERSION,
        abi,
        build_id: id,
        cpu_plan: plan.code(),
        payload_len: payload.len() as u64,
        sha256: digest,
        ..Default::default()
    };
    let mut image = vec![0u8; ImageHeader::SIZE + payload.len()];
    header.encode(&mut image).map_err(|e| format!("encoding header: {e}"))?;
    image[ImageHeader::SIZE..].copy_from_slice(&payload);
    write_atomic(out, &image, 0o644)?;
    println!("packed {} -> {}: {} payload bytes, sha256 {}, unsigned", p, out.display(), payload.len(), hex(&digest));
    Ok(())
}

fn sign(key_path: &Path, image_path: &Path, out: Option<&Path>) -> Result<(), String> {
    let key = read_secret_key(key_path)?;
    let mut image = read(image_path)?;
    let i = image_path.display();
    let mut header =
        ImageHeader::parse(&image).map_err(|e| format!("{i}: {} ({e})", FailReason::BadImageHeader.as_str()))?;
    if Sha256::digest(&image[ImageHeader::SIZE..]).as_slice() != header.sha256.as_slice() {
        return Err(format!("{i}: {}; refusing to sign", FailReason::DigestMismatch.as_str()));
    }
    header.key_id = key_id(&key.verifying_key());
    header.signature = [0; 64];
    header.encode(&mut image).map_err(|e| format!("{i}: {e}"))?;
    header.signature = key.sign(&image[..SIGNED_LEN]).to_bytes();
    header.encode(&mut image).map_err(|e| format!("{i}: {e}"))?;
    let dest = out.unwrap_or(image_path);
    write_atomic(dest, &image, 0o644)?;
    println!("signed {} with key id {}", dest.display(), hex(&header.key_id));
    Ok(())
}

/// The NIC's verification rules; `trusted = None` skips the signature.
fn check(image: &[u8], trusted: Option<&[VerifyingKey]>) -> Result<ImageHeader, (FailReason, String)> {
    let header = ImageHeader::parse(image).map_err(|e| (FailReason::BadImageHeader, e.to_string()))?;
    let payload = &image[ImageHeader::SIZE..];
    if header.abi != FIRMWARE_ABI {
        let why = format!("image ABI {}, this build's is {FIRMWARE_ABI}", header.abi);
        return Err((FailReason::WrongAbi, why));
    }
    if Sha256::digest(payload).as_slice() != header.sha256.as_slice() {
        return Err((FailReason::DigestMismatch, "payload SHA-256 differs from the header's".into()));
    }
    if let Some(keys) = trusted {
        if header.is_unsigned() {
            return Err((FailReason::BadSignature, "image is unsigned".into()));
        }
        let sig = Signature::from_bytes(&header.signature);
        let mut candidates = keys.iter().filter(|k| key_id(k) == header.key_id).peekable();
        if candidates.peek().is_none() {
            return Err((FailReason::BadSignature, format!("no trusted key has id {}", hex(&header.key_id))));
        }
        if !candidates.any(|k| k.verify_strict(&image[..SIGNED_LEN], &sig).is_ok()) {
            return Err((FailReason::BadSignature, "signature does not verify".into()));
        }
    }
    if !payload.starts_with(ELF_MAGIC) {
        return Err((FailReason::LoadFailed, "payload is not an ELF file".into()));
    }
    Ok(header)
}

fn inspect(image_path: &Path, trusted_dir: Option<&Path>) -> Result<(), String> {
    let i = image_path.display();
    let image = read(image_path)?;
    let trusted = trusted_dir.map(load_trusted).transpose()?;
    let mut s = String::new();
    let _ = writeln!(s, "image:          {i} ({} bytes)", image.len());
    if let Ok(h) = ImageHeader::decode(&image) {
        let payload = &image[ImageHeader::SIZE..];
        let magic = if h.magic == IMAGE_MAGIC { "ok".to_string() } else { format!("BAD ({:#018x})", h.magic) };
        let _ = writeln!(s, "magic:          {magic}");
        let _ = writeln!(
            s,
            "header version: {}{}",
            h.header_version,
            mark(h.header_version == IMAGE_HEADER_VERSION, IMAGE_HEADER_VERSION)
        );
        let _ = writeln!(s, "abi:            {}{}", h.abi, mark(h.abi == FIRMWARE_ABI, FIRMWARE_ABI));
        let _ = writeln!(s, "build id:       {}", show_build_id(&h.build_id));
        let _ = writeln!(s, "cpu plan:       {} ({})", CpuPlan::name(h.cpu_plan), h.cpu_plan);
        let len_note = if h.payload_len == payload.len() as u64 {
            String::new()
        } else {
            format!(" (file has {} payload bytes)", payload.len())
        };
        let _ = writeln!(s, "payload length: {}{len_note}", h.payload_len);
        let actual = Sha256::digest(payload);
        let digest_note = if actual.as_slice() == h.sha256.as_slice() {
            "matches payload".to_string()
        } else {
            format!("MISMATCH: payload is {}", hex(&actual))
        };
        let _ = writeln!(s, "sha256:         {} ({digest_note})", hex(&h.sha256));
        let _ = writeln!(s, "key id:         {}", hex(&h.key_id));
        let _ = writeln!(s, "signed:         {}", if h.is_unsigned() { "no" } else { "yes" });
        let elf = if payload.starts_with(ELF_MAGIC) { "ELF" } else { "NOT ELF" };
        let _ = writeln!(s, "payload:        {elf}");
    }
    let result = check(&image, trusted.as_ref().map(|(_, k)| k.as_slice()));
    match (&result, &trusted) {
        (Ok(_), Some((dir, _))) => {
            let _ = writeln!(s, "verify:         ok (trusted keys in {})", dir.display());
        }
        (Ok(_), None) => {
            let _ = writeln!(s, "well formed:    yes (signature not checked; use --trusted <dir>)");
        }
        (Err((reason, why)), _) => {
            let _ = writeln!(s, "verify:         FAILED: {} ({why})", reason.as_str());
        }
    }
    print!("{s}");
    let _ = std::io::stdout().flush();
    result.map(|_| ()).map_err(|(reason, why)| format!("{i}: {} ({why})", reason.as_str()))
}

fn mark(ok: bool, want: u32) -> String {
    if ok {
        " (ok)".into()
    } else {
        format!(" (UNSUPPORTED: expected {want})")
    }
}

fn show_build_id(id: &[u8; BUILD_ID_MAX]) -> String {
    let end = id.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    match std::str::from_utf8(&id[..end]) {
        Ok("") => "(none)".into(),
        Ok(t) if t.chars().all(|c| !c.is_control()) => t.into(),
        _ => format!("0x{}", hex(&id[..end])),
    }
}

/// Loads `*.pub` files from `dir` with the NIC's rules (32 raw bytes or 64
/// hex digits and an optional newline).
fn load_trusted(dir: &Path) -> Result<(PathBuf, Vec<VerifyingKey>), String> {
    let d = dir.display();
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| format!("{d}: {e}"))? {
        let path = entry.map_err(|e| format!("{d}: {e}"))?.path();
        if path.extension().is_some_and(|x| x == "pub") && !path.is_dir() {
            files.push(path);
        }
    }
    files.sort();
    let mut keys = Vec::new();
    for path in files {
        let bytes = read(&path)?;
        let raw = if bytes.len() == 32 {
            bytes.clone()
        } else {
            let text = bytes.strip_suffix(b"\n").map(|t| t.strip_suffix(b"\r").unwrap_or(t)).unwrap_or(&bytes);
            unhex(text).filter(|k| k.len() == 32).ok_or_else(|| {
                format!("{}: not a public key (expected 32 raw bytes or 64 hex digits)", path.display())
            })?
        };
        let mut k = [0u8; 32];
        k.copy_from_slice(&raw);
        let key =
            VerifyingKey::from_bytes(&k).map_err(|_| format!("{}: not a valid ed25519 public key", path.display()))?;
        keys.push(key);
    }
    if keys.is_empty() {
        return Err(format!("{d}: no trusted keys (*.pub) found"));
    }
    Ok((dir.to_path_buf(), keys))
}

fn read_secret_key(path: &Path) -> Result<SigningKey, String> {
    let bytes = read(path)?;
    let seed: [u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| format!("{}: not a secret key (expected 32 bytes, found {})", path.display(), bytes.len()))?;
    Ok(SigningKey::from_bytes(&seed))
}

fn key_id(key: &VerifyingKey) -> [u8; 8] {
    let d = Sha256::digest(key.as_bytes());
    let mut id = [0u8; 8];
    id.copy_from_slice(&d[..8]);
    id
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn exists(path: &Path) -> Result<bool, String> {
    path.try_exists().map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `data` to a temporary file beside `path` (created with `mode`),
/// then renames it over `path`, so readers never see a partial file.
fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), String> {
    let name = path.file_name().ok_or_else(|| format!("{}: not a file path", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        format!("{}: {e}", path.display())
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(t: &[u8]) -> Option<Vec<u8>> {
    let pairs = t.chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return None;
    }
    let v = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    pairs.map(|p| Some(v(p[0])? << 4 | v(p[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(abi: u32, payload: &[u8], key: Option<&SigningKey>) -> Vec<u8> {
        let mut h = ImageHeader {
            magic: IMAGE_MAGIC,
            header_version: IMAGE_HEADER_VERSION,
            abi,
            payload_len: payload.len() as u64,
            sha256: Sha256::digest(payload).into(),
            ..Default::default()
        };
        let mut img = vec![0u8; ImageHeader::SIZE + payload.len()];
        img[ImageHeader::SIZE..].copy_from_slice(payload);
        if let Some(k) = key {
            h.key_id = key_id(&k.verifying_key());
            h.encode(&mut img).unwrap();
            h.signature = k.sign(&img[..SIGNED_LEN]).to_bytes();
        }
        h.encode(&mut img).unwrap();
        img
    }

    #[test]
    fn check_follows_nic_order() {
        let k = SigningKey::from_bytes(&[7; 32]);
        let keys = [k.verifying_key()];
        let p = b"\x7fELF rest";
        assert!(check(&image(FIRMWARE_ABI, p, Some(&k)), Some(&keys)).is_ok());
        assert!(check(&image(FIRMWARE_ABI, p, None), None).is_ok());
        let r = |img: &[u8], t: Option<&[VerifyingKey]>| check(img, t).map(|_| ()).map_err(|e| e.0);
        assert_eq!(r(&image(FIRMWARE_ABI, p, None), Some(&keys)), Err(FailReason::BadSignature));
        assert_eq!(r(&image(9, p, Some(&k)), Some(&keys)), Err(FailReason::WrongAbi));
        assert_eq!(r(&image(FIRMWARE_ABI, b"MZ", Some(&k)), Some(&keys)), Err(FailReason::LoadFailed));
        let mut bad = image(FIRMWARE_ABI, p, Some(&k));
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(r(&bad, Some(&keys)), Err(FailReason::DigestMismatch));
        assert_eq!(r(&bad[..10], None), Err(FailReason::BadImageHeader));
        let other = [SigningKey::from_bytes(&[8; 32]).verifying_key()];
        assert_eq!(r(&image(FIRMWARE_ABI, p, Some(&k)), Some(&other)), Err(FailReason::BadSignature));
    }

    #[test]
    fn helpers() {
        assert_eq!(unhex(b"00ff7F"), Some(vec![0, 255, 127]));
        assert_eq!(unhex(b"0g"), None);
        assert_eq!(unhex(b"abc"), None);
        assert_eq!(show_build_id(&[0; 20]), "(none)");
        let mut id = [0u8; 20];
        id[..7].copy_from_slice(b"abc1234");
        assert_eq!(show_build_id(&id), "abc1234");
        id[0] = 1;
        assert!(show_build_id(&id).starts_with("0x01"));
    }
}
