//! The cluster's wire key file: the secret every NIC of a cluster shares to
//! authenticate its frames (`[cluster] auth`), with the id (epoch) that
//! tells one key from the next during a rotation. A small TOML file:
//!
//! ```toml
//! # EMP wire key (emp wire keygen). Keep it private: mode 0600.
//! id = 3
//! key = "<64 hex digits: 32 random bytes>"
//! ```
//!
//! A key file that group or others may read is refused: a key anyone on
//! the host can read proves nothing.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use serde::Deserialize;

use crate::ConfigError;

/// Bytes of key.
pub const KEY_LEN: usize = 32;

/// One cluster key and its id.
#[derive(Clone, PartialEq, Eq)]
pub struct WireKey {
    /// Key id (epoch), at least 1; a rotation installs the next one.
    pub id: u32,
    /// The secret.
    pub key: [u8; KEY_LEN],
}

impl fmt::Debug for WireKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret itself: this lands in logs.
        f.debug_struct("WireKey").field("id", &self.id).finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    id: i64,
    key: String,
}

impl WireKey {
    /// Reads and checks a key file: private to its owner, an id ≥ 1 and
    /// exactly 32 bytes of key. Every error names the file.
    pub fn load(path: &Path) -> Result<WireKey, ConfigError> {
        let at = |msg: String| ConfigError(format!("wire key {}: {msg}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| at(e.to_string()))?;
        if !meta.is_file() {
            return Err(at("not a regular file".into()));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(at(format!(
                "readable or writable by group or others (mode {mode:03o}); run `chmod 600 {}`",
                path.display()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| at(e.to_string()))?;
        WireKey::parse(&text).map_err(|e| at(e.0))
    }

    /// Parses the text of a key file.
    pub fn parse(text: &str) -> Result<WireKey, ConfigError> {
        let raw: RawKey = toml::from_str(text).map_err(|e| ConfigError(e.to_string().trim_end().to_string()))?;
        let id = u32::try_from(raw.id)
            .ok()
            .filter(|&id| id >= 1)
            .ok_or_else(|| ConfigError(format!("id {} is outside 1..={}", raw.id, u32::MAX)))?;
        let hex = raw.key.trim();
        if hex.len() != 2 * KEY_LEN {
            return Err(ConfigError(format!(
                "key must be {} hex digits ({KEY_LEN} bytes); it has {} characters",
                2 * KEY_LEN,
                hex.len()
            )));
        }
        let mut key = [0u8; KEY_LEN];
        for (i, b) in key.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("zz"), 16)
                .map_err(|_| ConfigError("key is not hexadecimal".into()))?;
        }
        Ok(WireKey { id, key })
    }

    /// A new random key with id `id`, from the kernel's random source.
    pub fn generate(id: u32) -> Result<WireKey, ConfigError> {
        if id == 0 {
            return Err(ConfigError("key id 0 is reserved (none); ids start at 1".into()));
        }
        let mut key = [0u8; KEY_LEN];
        let mut f = std::fs::File::open("/dev/urandom").map_err(|e| ConfigError(format!("/dev/urandom: {e}")))?;
        std::io::Read::read_exact(&mut f, &mut key).map_err(|e| ConfigError(format!("/dev/urandom: {e}")))?;
        Ok(WireKey { id, key })
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        let hex: String = self.key.iter().map(|b| format!("{b:02x}")).collect();
        format!("# EMP wire key (emp wire keygen). Keep it private: mode 0600.\nid = {}\nkey = \"{hex}\"\n", self.id)
    }

    /// Writes the key to `path` with mode 0600, atomically (a temporary
    /// file beside it, renamed over it): a daemon reloading it never sees
    /// half a key. `replace`: an existing file may be replaced.
    pub fn save(&self, path: &Path, replace: bool) -> Result<(), ConfigError> {
        let at = |msg: String| ConfigError(format!("wire key {}: {msg}", path.display()));
        if !replace && path.exists() {
            return Err(at("exists (rotate it with `emp wire keygen --next`, or pass --force)".into()));
        }
        let name = path.file_name().ok_or_else(|| at("not a file name".into()))?;
        let tmp = path.with_file_name(format!(".{}.tmp{}", name.to_string_lossy(), std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(self.to_text().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            at(e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("emp-wirekey-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn round_trips_and_never_prints_the_secret() {
        let d = scratch("rt");
        let k = WireKey::generate(7).unwrap();
        assert_ne!(k.key, [0; KEY_LEN]);
        let p = d.join("wire.key");
        k.save(&p, false).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(WireKey::load(&p).unwrap(), k);
        let hex: String = k.key.iter().map(|b| format!("{b:02x}")).collect();
        assert!(!format!("{k:?}").contains(&hex[..16]), "Debug shows no key bytes");
        let e = k.save(&p, false).unwrap_err().0;
        assert!(e.contains("exists"), "{e}");
        WireKey::generate(8).unwrap().save(&p, true).unwrap();
        assert_eq!(WireKey::load(&p).unwrap().id, 8);
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "no temporary file left");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn refuses_bad_key_files_naming_them() {
        let d = scratch("bad");
        let p = d.join("k");
        let e = WireKey::load(&p).unwrap_err().0;
        assert!(e.contains(&p.display().to_string()) && e.contains("No such file"), "{e}");
        let write = |text: &str, mode: u32| {
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let good = WireKey { id: 1, key: [0xab; KEY_LEN] }.to_text();
        write(&good, 0o644);
        let e = WireKey::load(&p).unwrap_err().0;
        assert!(e.contains("mode 644") && e.contains("chmod 600"), "{e}");
        write(&good, 0o640);
        assert!(WireKey::load(&p).unwrap_err().0.contains("group or others"));
        write(&good, 0o400);
        assert_eq!(WireKey::load(&p).unwrap().key, [0xab; KEY_LEN]);
        write(&good.replace(&"ab".repeat(32), &"ab".repeat(16)), 0o600);
        let e = WireKey::load(&p).unwrap_err().0;
        assert!(e.contains("64 hex digits") && e.contains(&p.display().to_string()), "{e}");
        write(&good.replace("id = 1", "id = 0"), 0o600);
        assert!(WireKey::load(&p).unwrap_err().0.contains("outside 1..="));
        write(&good.replace("abab", "abzz"), 0o600);
        assert!(WireKey::load(&p).unwrap_err().0.contains("not hexadecimal"));
        write("", 0o600);
        assert!(WireKey::load(&p).unwrap_err().0.contains("missing field"));
        assert!(WireKey::load(&d).unwrap_err().0.contains("not a regular file"));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
