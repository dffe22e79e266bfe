//! Per-frame authentication of the network wires (`[cluster] auth`): every
//! frame a NIC puts on the udp or packet wire carries a trailer, and a
//! received frame reaches the control program only once its trailer checks
//! out. The control programs never see it: they run at an MTU smaller by
//! [`TRAILER`] bytes.
//!
//! The trailer: key id (u32 LE), counter (u64 LE), tag (16 bytes). The tag
//! is AES-256-GCM's (hardware AES and carry-less multiply on x86): in
//! `mac` mode with the whole frame as associated data and nothing
//! encrypted (GMAC), in `aead` mode with the frame header as associated
//! data and the rest encrypted in place. The 96-bit nonce is the sending
//! node, the destination node and the counter (big-endian), so it never
//! repeats under one key: the counter counts the frames from one node to
//! another, starting at the wall clock's nanoseconds when the daemon
//! started (a restarted daemon starts above anything it sent before, as
//! long as the clock does not step back). The receiver keeps, per local NIC
//! and source node, an IPsec-style window over the counter (the highest seen
//! and a 64-bit map below it): a frame seen before, or more than 64 behind
//! the newest, is a replay.
//!
//! Keys: the control path ([`AuthShared`], shared with the attach servers)
//! holds the key set; the engine's [`Auth`] copies it when its version
//! changes (one relaxed load per pass). A rotation installs the next key
//! (accepted, not sent with), then switches to sending with it; the old key
//! stays accepted for [`GRACE`], then is retired.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce, Tag};

/// A 96-bit nonce.
type Nonce96 = Nonce<aes_gcm::aead::consts::U12>;
pub use emp_config::AuthMode;
use emp_config::WireKey;
use emp_uapi::wire::FrameHeader;
use emp_uapi::Le;

use super::Refused;

/// Bytes of trailer: key id, counter, tag.
pub const TRAILER: usize = 4 + 8 + TAG;
/// Bytes of tag.
const TAG: usize = 16;
/// Frames a counter may fall behind the newest and still be accepted once.
pub const WINDOW: u64 = 64;
/// How long the previous key stays accepted after a switch: longer than a
/// frame lingers in any queue, so nothing sent before the switch is lost.
pub const GRACE: Duration = Duration::from_secs(10);

/// The keys a daemon holds, as its control path sets them.
#[derive(Clone, Debug, Default)]
struct KeySet {
    /// Sent with, and accepted.
    current: Option<WireKey>,
    /// Installed by a rotation: accepted, not yet sent with.
    next: Option<WireKey>,
    /// The key before the last switch: accepted until `previous_until`.
    previous: Option<WireKey>,
    previous_until: Option<Instant>,
}

/// Key ids in use (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyIds {
    /// Sent with.
    pub current: u32,
    /// Installed, accepted, not sent with yet.
    pub next: u32,
    /// Still accepted after a switch.
    pub previous: u32,
}

/// A daemon's authentication settings and keys, shared by the engine and the
/// attach servers (which report them and rotate the key).
#[derive(Debug)]
pub struct AuthShared {
    /// The mode (never `Off`: without authentication there is none).
    pub mode: AuthMode,
    path: PathBuf,
    keys: Mutex<KeySet>,
    /// Bumped on every change of `keys`.
    version: AtomicU64,
}

impl AuthShared {
    /// Authentication in `mode` with the key file at `path`, read now.
    pub fn load(mode: AuthMode, path: &Path) -> Result<Arc<AuthShared>, String> {
        let key = WireKey::load(path).map_err(|e| e.to_string())?;
        Ok(Arc::new(AuthShared {
            mode,
            path: path.to_path_buf(),
            keys: Mutex::new(KeySet { current: Some(key), ..Default::default() }),
            version: AtomicU64::new(1),
        }))
    }

    /// The key file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, KeySet> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.version.fetch_add(1, Ordering::Release);
    }

    /// Key ids now.
    pub fn ids(&self) -> KeyIds {
        let k = self.keys();
        let id = |k: &Option<WireKey>| k.as_ref().map_or(0, |k| k.id);
        KeyIds { current: id(&k.current), next: id(&k.next), previous: id(&k.previous) }
    }

    /// Rotation, step 1: rereads the key file; a key with a new id is
    /// installed as the next one (accepted from now on, not yet sent with).
    /// The same key again changes nothing; the same id with another key is
    /// refused (peers could not tell the two apart).
    pub fn install(&self) -> Result<KeyIds, String> {
        let key = WireKey::load(&self.path).map_err(|e| e.to_string())?;
        let mut k = self.keys();
        let known = [&k.current, &k.next, &k.previous].into_iter().flatten().find(|x| x.id == key.id);
        match known {
            Some(x) if *x == key => {}
            Some(_) => {
                return Err(format!(
                    "{}: key id {} is already in use with another key; a new key needs a new id \
                     (`emp wire keygen --next`)",
                    self.path.display(),
                    key.id
                ))
            }
            None => {
                tracing::info!(id = key.id, "wire key installed: accepted, not sent with yet");
                k.next = Some(key);
                self.changed();
            }
        }
        drop(k);
        Ok(self.ids())
    }

    /// Rotation, step 2: sends with the installed key; the one it replaces
    /// stays accepted for [`GRACE`]. Without an installed key, nothing
    /// changes.
    pub fn switch(&self) -> KeyIds {
        let mut k = self.keys();
        if let Some(next) = k.next.take() {
            tracing::info!(id = next.id, "wire key switched: sending with it");
            k.previous = k.current.replace(next);
            k.previous_until = Some(Instant::now() + GRACE);
            self.changed();
        }
        drop(k);
        self.ids()
    }

    /// Forgets the previous key once its grace period is over.
    fn retire_expired(&self, now: Instant) {
        let mut k = self.keys();
        if k.previous_until.is_some_and(|t| now >= t) {
            k.previous = None;
            k.previous_until = None;
            self.changed();
        }
    }
}

/// One key, ready to use.
struct Cipher {
    id: u32,
    aes: Aes256Gcm,
}

impl Cipher {
    fn new(k: &WireKey) -> Cipher {
        Cipher { id: k.id, aes: Aes256Gcm::new(&k.key.into()) }
    }
}

/// An IPsec-style anti-replay window: the highest counter accepted and a
/// map of the [`WINDOW`] below it.
#[derive(Clone, Copy, Debug, Default)]
struct ReplayWindow {
    top: u64,
    seen: u64,
}

impl ReplayWindow {
    /// Could `c` be new?
    fn fresh(&self, c: u64) -> bool {
        if c > self.top {
            return true;
        }
        let back = self.top - c;
        back < WINDOW && self.seen & (1 << back) == 0
    }

    /// Records `c` (authenticated) as seen.
    fn accept(&mut self, c: u64) {
        if c > self.top {
            let shift = c - self.top;
            self.seen = if shift >= WINDOW { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.top = c;
        } else {
            self.seen |= 1 << (self.top - c);
        }
    }
}

/// The engine's side: seals frames going out, opens frames coming in.
pub struct Auth {
    shared: Arc<AuthShared>,
    seen_version: u64,
    aead: bool,
    send: Option<Cipher>,
    /// Every key accepted (current, next, previous).
    accept: Vec<Cipher>,
    retire_at: Option<Instant>,
    /// Per local NIC, per destination node: the last counter sent.
    tx: Vec<Vec<u64>>,
    /// Per local NIC, per source node.
    rx: Vec<Vec<ReplayWindow>>,
}

/// The wall clock in ns: where counters start, above anything an earlier
/// run of this daemon sent.
fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// The frame header's source and destination nodes (the frame is at least
/// a header long).
fn nodes_of(frame: &[u8]) -> (u16, u16) {
    (u16::from_le_bytes([frame[4], frame[5]]), u16::from_le_bytes([frame[6], frame[7]]))
}

fn nonce(src: u16, dst: u16, counter: u64) -> Nonce96 {
    let mut n = [0u8; 12];
    n[..2].copy_from_slice(&src.to_be_bytes());
    n[2..4].copy_from_slice(&dst.to_be_bytes());
    n[4..].copy_from_slice(&counter.to_be_bytes());
    n.into()
}

impl Auth {
    /// The engine's side for `locals` local NICs in a cluster of `nodes`.
    pub fn new(shared: Arc<AuthShared>, locals: usize, nodes: usize) -> Auth {
        let start = wall_clock_ns();
        let mut a = Auth {
            aead: shared.mode == AuthMode::Aead,
            shared,
            seen_version: 0,
            send: None,
            accept: Vec::new(),
            retire_at: None,
            tx: vec![vec![start; nodes]; locals],
            rx: vec![vec![ReplayWindow::default(); nodes]; locals],
        };
        a.refresh();
        a
    }

    /// Adopts a changed key set, and retires the previous key when its
    /// grace is over. Cheap when nothing changed: call it once per pass.
    pub fn refresh(&mut self) {
        if let Some(t) = self.retire_at {
            let now = Instant::now();
            if now >= t {
                self.shared.retire_expired(now);
            }
        }
        let v = self.shared.version.load(Ordering::Acquire);
        if v == self.seen_version {
            return;
        }
        let k = {
            // Writers bump the version under the lock: read both together.
            let k = self.shared.keys();
            self.seen_version = self.shared.version.load(Ordering::Acquire);
            k.clone()
        };
        self.send = k.current.as_ref().map(Cipher::new);
        self.accept = [&k.current, &k.next, &k.previous].into_iter().flatten().map(Cipher::new).collect();
        self.retire_at = k.previous_until;
    }

    /// Can local NIC `local` seal `frame` (a header long, to a node of the
    /// cluster, with a key to send with)? If so, [`Auth::seal`] of it
    /// succeeds given room for the trailer.
    pub fn sealable(&self, local: usize, frame: &[u8]) -> bool {
        frame.len() >= FrameHeader::SIZE
            && self.send.is_some()
            && self.tx.get(local).is_some_and(|t| (nodes_of(frame).1 as usize) < t.len())
    }

    /// Seals the frame in `buf[..len]` sent by local NIC `local`: appends the
    /// trailer (and in `aead` mode encrypts the payload in place); returns
    /// the sealed length, or `None` when it cannot be sent (no room, a
    /// destination outside the cluster, no key).
    pub fn seal(&mut self, local: usize, buf: &mut [u8], len: usize) -> Option<usize> {
        if len < FrameHeader::SIZE || buf.len() < len + TRAILER {
            return None;
        }
        let cipher = self.send.as_ref()?;
        let (src, dst) = nodes_of(buf);
        let counter = self.tx.get_mut(local)?.get_mut(dst as usize)?;
        *counter += 1;
        let c = *counter;
        let nonce = nonce(src, dst, c);
        let (frame, trailer) = buf.split_at_mut(len);
        let tag = if self.aead {
            let (hdr, payload) = frame.split_at_mut(FrameHeader::SIZE);
            cipher.aes.encrypt_in_place_detached(&nonce, hdr, payload)
        } else {
            cipher.aes.encrypt_in_place_detached(&nonce, frame, &mut [])
        }
        .ok()?;
        trailer[..4].copy_from_slice(&cipher.id.to_le_bytes());
        trailer[4..12].copy_from_slice(&c.to_le_bytes());
        trailer[12..TRAILER].copy_from_slice(&tag);
        Some(len + TRAILER)
    }

    /// Opens a frame received by local NIC `local` from node `from` (whose
    /// address the wire has checked): verifies its trailer (and in `aead`
    /// mode decrypts it in place) and cuts the trailer off.
    pub fn open(&mut self, local: usize, from: u16, frame: &mut Vec<u8>) -> Result<(), Refused> {
        let Some(len) = frame.len().checked_sub(TRAILER).filter(|&l| l >= FrameHeader::SIZE) else {
            return Err(Refused::Malformed);
        };
        let (body, trailer) = frame.split_at_mut(len);
        let id = u32::from_le_bytes(trailer[..4].try_into().expect("4 bytes"));
        let c = u64::from_le_bytes(trailer[4..12].try_into().expect("8 bytes"));
        let tag = Tag::clone_from_slice(&trailer[12..TRAILER]);
        let cipher = self.accept.iter().find(|k| k.id == id).ok_or(Refused::UnknownKey)?;
        let (src, dst) = nodes_of(body);
        if src != from {
            return Err(Refused::SourceMismatch);
        }
        let window = self.rx.get_mut(local).and_then(|w| w.get_mut(src as usize)).ok_or(Refused::UnknownSource)?;
        if !window.fresh(c) {
            return Err(Refused::Replayed);
        }
        let nonce = nonce(src, dst, c);
        let ok = if self.aead {
            let (hdr, payload) = body.split_at_mut(FrameHeader::SIZE);
            cipher.aes.decrypt_in_place_detached(&nonce, hdr, payload, &tag)
        } else {
            cipher.aes.decrypt_in_place_detached(&nonce, body, &mut [], &tag)
        };
        ok.map_err(|_| Refused::BadTag)?;
        window.accept(c);
        frame.truncate(len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::ack_frame;
    use super::*;

    fn key_file(name: &str, key: &WireKey) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = std::env::temp_dir().join(format!("emp-auth-{}-{name}.key", std::process::id()));
        std::fs::write(&p, key.to_text()).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    }

    fn pair(mode: AuthMode, name: &str) -> (Auth, Auth, Arc<AuthShared>, PathBuf) {
        let p = key_file(name, &WireKey { id: 1, key: [7; 32] });
        let a = AuthShared::load(mode, &p).unwrap();
        let b = AuthShared::load(mode, &p).unwrap();
        (Auth::new(a, 1, 2), Auth::new(b.clone(), 1, 2), b, p)
    }

    fn sealed(a: &mut Auth, frame: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; frame.len() + TRAILER];
        buf[..frame.len()].copy_from_slice(frame);
        assert_eq!(a.seal(0, &mut buf, frame.len()), Some(frame.len() + TRAILER));
        buf
    }

    fn data_frame() -> Vec<u8> {
        use emp_uapi::wire::{emit_data_headers, FrameHeader, FrameKind, MsgHeader, WIRE_VERSION};
        let payload = b"sixteen bytes!!!";
        let hdr = FrameHeader {
            version: WIRE_VERSION,
            kind: FrameKind::Data as u8,
            src_node: 0,
            dst_node: 1,
            frame_count: 1,
            payload_len: payload.len() as u16,
            ..Default::default()
        };
        let msg = MsgHeader::new(0, payload.len() as u64, None);
        let mut out = vec![0u8; 256];
        let n = emit_data_headers(&hdr, Some(&msg), &mut out).unwrap();
        out.truncate(n);
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn mac_round_trip_and_every_refusal() {
        let (mut tx, mut rx, _, p) = pair(AuthMode::Mac, "mac");
        let f = ack_frame(0, 1);
        let s = sealed(&mut tx, &f);
        assert_eq!(&s[..f.len()], &f[..], "mac mode leaves the frame in clear");
        let mut got = s.clone();
        rx.open(0, 0, &mut got).unwrap();
        assert_eq!(got, f);
        let mut again = s.clone();
        assert_eq!(rx.open(0, 0, &mut again), Err(Refused::Replayed), "the same frame twice");
        let mut s2 = sealed(&mut tx, &f);
        s2[9] ^= 1; // a header byte
        assert_eq!(rx.open(0, 0, &mut s2.clone()), Err(Refused::BadTag));
        let last = s2.len() - 1;
        s2[9] ^= 1;
        s2[last] ^= 0x80; // the tag
        assert_eq!(rx.open(0, 0, &mut s2.clone()), Err(Refused::BadTag));
        s2[last] ^= 0x80;
        let mut wrong_id = s2.clone();
        wrong_id[f.len()] = 9;
        assert_eq!(rx.open(0, 0, &mut wrong_id), Err(Refused::UnknownKey));
        let mut counter_moved = s2.clone();
        let at = f.len() + 4..f.len() + 12;
        let ahead = u64::from_le_bytes(counter_moved[at.clone()].try_into().unwrap()) + 1000;
        counter_moved[at].copy_from_slice(&ahead.to_le_bytes()); // fresh: the tag decides
        assert_eq!(rx.open(0, 0, &mut counter_moved), Err(Refused::BadTag), "the counter is in the nonce");
        assert_eq!(rx.open(0, 1, &mut s2.clone()), Err(Refused::SourceMismatch), "another node's address");
        assert_eq!(rx.open(0, 0, &mut s2[..40].to_vec()), Err(Refused::Malformed));
        rx.open(0, 0, &mut s2).unwrap();
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn a_wrong_key_opens_nothing() {
        let (mut tx, _, _, p) = pair(AuthMode::Mac, "wrong");
        let q = key_file("wrong2", &WireKey { id: 1, key: [8; 32] });
        let mut rx = Auth::new(AuthShared::load(AuthMode::Mac, &q).unwrap(), 1, 2);
        let mut s = sealed(&mut tx, &ack_frame(0, 1));
        assert_eq!(rx.open(0, 0, &mut s), Err(Refused::BadTag));
        let _ = (std::fs::remove_file(p), std::fs::remove_file(q));
    }

    #[test]
    fn aead_hides_the_payload_and_restores_it() {
        let (mut tx, mut rx, _, p) = pair(AuthMode::Aead, "aead");
        let f = data_frame();
        let s = sealed(&mut tx, &f);
        assert_eq!(&s[..FrameHeader::SIZE], &f[..FrameHeader::SIZE], "the header stays in clear");
        assert!(!s.windows(16).any(|w| w == b"sixteen bytes!!!"), "the payload does not");
        let mut got = s.clone();
        rx.open(0, 0, &mut got).unwrap();
        assert_eq!(got, f);
        let mut bad = sealed(&mut tx, &f);
        bad[FrameHeader::SIZE + 3] ^= 1;
        assert_eq!(rx.open(0, 0, &mut bad), Err(Refused::BadTag));
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn window_takes_reordering_and_refuses_replays_and_stale_frames() {
        let (mut tx, mut rx, _, p) = pair(AuthMode::Mac, "win");
        let frames: Vec<Vec<u8>> = (0..100).map(|_| sealed(&mut tx, &ack_frame(0, 1))).collect();
        // 70 first, then 10..69 out of order: within 64 of the newest.
        rx.open(0, 0, &mut frames[70].clone()).unwrap();
        for i in (10..70).rev() {
            rx.open(0, 0, &mut frames[i].clone()).unwrap_or_else(|e| panic!("frame {i}: {e:?}"));
        }
        assert_eq!(rx.open(0, 0, &mut frames[5].clone()), Err(Refused::Replayed), "65 behind the newest");
        assert_eq!(rx.open(0, 0, &mut frames[30].clone()), Err(Refused::Replayed));
        for f in &frames[71..] {
            rx.open(0, 0, &mut f.clone()).unwrap();
        }
        // A forged frame with a fresh counter does not move the window.
        let mut forged = frames[99].clone();
        forged[ack_frame(0, 1).len() + 4..][..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(rx.open(0, 0, &mut forged), Err(Refused::BadTag));
        rx.open(0, 0, &mut sealed(&mut tx, &ack_frame(0, 1))).unwrap();
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn counters_start_above_an_earlier_run() {
        let (mut first, _, _, p) = pair(AuthMode::Mac, "restart");
        let s1 = sealed(&mut first, &ack_frame(0, 1));
        std::thread::sleep(Duration::from_millis(2));
        let (mut second, _, _, q) = pair(AuthMode::Mac, "restart2");
        let s2 = sealed(&mut second, &ack_frame(0, 1));
        let at = ack_frame(0, 1).len() + 4;
        let c = |s: &[u8]| u64::from_le_bytes(s[at..at + 8].try_into().unwrap());
        assert!(c(&s2) > c(&s1), "a restarted sender's counters start higher");
        let _ = (std::fs::remove_file(p), std::fs::remove_file(q));
    }

    #[test]
    fn rotation_accepts_both_keys_then_retires_the_old() {
        let (mut tx, mut rx, rx_shared, p) = pair(AuthMode::Mac, "rot");
        let tx_shared = tx.shared.clone();
        let f = ack_frame(0, 1);
        let old = sealed(&mut tx, &f);
        std::fs::write(&p, WireKey { id: 2, key: [9; 32] }.to_text()).unwrap();
        assert_eq!(rx_shared.install().unwrap(), KeyIds { current: 1, next: 2, previous: 0 });
        assert_eq!(tx_shared.install().unwrap(), KeyIds { current: 1, next: 2, previous: 0 });
        assert_eq!(rx_shared.install().unwrap().next, 2, "installing again is harmless");
        tx.refresh();
        rx.refresh();
        let still_old = sealed(&mut tx, &f);
        assert_eq!(u32::from_le_bytes(still_old[f.len()..f.len() + 4].try_into().unwrap()), 1, "not sent with yet");
        assert_eq!(tx_shared.switch(), KeyIds { current: 2, next: 0, previous: 1 });
        tx.refresh();
        let new = sealed(&mut tx, &f);
        assert_eq!(u32::from_le_bytes(new[f.len()..f.len() + 4].try_into().unwrap()), 2);
        // The receiver has not switched: it takes the new key (installed) and the old.
        for mut s in [new, old, still_old.clone()] {
            rx.open(0, 0, &mut s).unwrap();
        }
        rx_shared.switch();
        rx.refresh();
        let old_file = key_file("rot-old", &WireKey { id: 1, key: [7; 32] });
        let late_old = sealed(&mut Auth::new(AuthShared::load(AuthMode::Mac, &old_file).unwrap(), 1, 2), &f);
        rx.open(0, 0, &mut late_old.clone()).unwrap();
        // Grace over: the old key is gone.
        rx_shared.keys().previous_until = Some(Instant::now());
        rx.retire_at = Some(Instant::now());
        rx.refresh();
        assert_eq!(rx_shared.ids(), KeyIds { current: 2, next: 0, previous: 0 });
        let mut again_old = late_old.clone();
        again_old[f.len() + 4] = again_old[f.len() + 4].wrapping_add(1);
        assert_eq!(rx.open(0, 0, &mut again_old), Err(Refused::UnknownKey));
        // Same id, another key: refused.
        std::fs::write(&p, WireKey { id: 2, key: [1; 32] }.to_text()).unwrap();
        let e = rx_shared.install().unwrap_err();
        assert!(e.contains("already in use"), "{e}");
        let _ = (std::fs::remove_file(p), std::fs::remove_file(old_file));
    }
}
