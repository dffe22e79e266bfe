//! What the soak checks every byte against: payloads are a keyed pseudo-random
//! stream, so a receiver regenerates what the sender wrote from the facts
//! the message itself names (sender, its incarnation, sequence) and the
//! receiver's own identity (so a message meant for an earlier incarnation of
//! the receiver does not verify at the new one), and the tag carries those
//! facts for messages of any length, 0 bytes included.

/// A small, fast, seeded generator (splitmix64): the soak's schedules and
/// payloads. Not for anything secret.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose stream is a function of `seed` alone.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]` (inclusive).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        match (hi - lo).checked_add(1) {
            Some(span) => lo + self.next_u64() % span,
            None => self.next_u64(),
        }
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// Mixes words into one seed (each through a splitmix step, so nearby inputs
/// give unrelated streams).
pub fn mix(words: &[u64]) -> u64 {
    let mut h = 0x243F_6A88_85A3_08D3u64;
    for &w in words {
        h = Rng::new(h ^ w).next_u64();
    }
    h
}

/// Fills `buf` with the stream of `seed`.
pub fn fill(seed: u64, buf: &mut [u8]) {
    let mut r = Rng::new(seed);
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&r.next_u64().to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = r.next_u64().to_le_bytes();
    rest.copy_from_slice(&last[..rest.len()]);
}

/// The first byte of `buf` that differs from the stream of `seed`, if any.
pub fn first_mismatch(seed: u64, buf: &[u8]) -> Option<usize> {
    let mut r = Rng::new(seed);
    let mut chunks = buf.chunks_exact(8);
    for (i, c) in (&mut chunks).enumerate() {
        let want = r.next_u64().to_le_bytes();
        if c != want {
            return Some(i * 8 + c.iter().zip(want).position(|(a, b)| *a != b).expect("differs"));
        }
    }
    let rest = chunks.remainder();
    let want = r.next_u64().to_le_bytes();
    rest.iter().zip(want).position(|(a, b)| *a != b).map(|p| buf.len() - rest.len() + p)
}

/// Marks the soak's point-to-point tags (top byte).
const TAG_MAGIC: u64 = 0x5A;
/// Tag classes receives are posted for.
pub const CLASSES: u64 = 4;
/// Bits of the receiver's incarnation a tag carries.
const DST_INC_BITS: u32 = 4;
/// Bits of the sequence number in a tag.
const SEQ_BITS: u32 = 24;
/// Largest sequence number a tag carries (a sender starts again at a new
/// incarnation of the receiver; far more than a soak sends to one).
pub const SEQ_MAX: u64 = (1 << SEQ_BITS) - 1;

/// What a point-to-point message says about itself: its class (which
/// receives it matches), sender rank and incarnation, its sequence
/// number among the sender's messages to this receiver's incarnation, and
/// that incarnation (modulo 16; the payload's stream names it whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsgId {
    /// Tag class, `< CLASSES`.
    pub class: u64,
    /// Sender's rank (< 256).
    pub src: u64,
    /// Sender's incarnation (< 65536).
    pub src_inc: u64,
    /// Sequence (≤ `SEQ_MAX`).
    pub seq: u64,
    /// The receiver's incarnation it was sent to, modulo 16.
    pub dst_inc: u64,
}

impl MsgId {
    /// The tag that carries it.
    pub fn tag(self) -> u64 {
        let dst_inc = self.dst_inc & ((1 << DST_INC_BITS) - 1);
        TAG_MAGIC << 56
            | self.class << 52
            | dst_inc << 48
            | (self.src & 0xFF) << 40
            | (self.src_inc & 0xFFFF) << SEQ_BITS
            | self.seq
    }

    /// Decodes a received tag; `None` for one the soak never sends.
    pub fn from_tag(tag: u64) -> Option<MsgId> {
        if tag >> 56 != TAG_MAGIC || (tag >> 52 & 0xF) >= CLASSES {
            return None;
        }
        Some(MsgId {
            class: tag >> 52 & 0xF,
            dst_inc: tag >> 48 & 0xF,
            src: tag >> 40 & 0xFF,
            src_inc: tag >> SEQ_BITS & 0xFFFF,
            seq: tag & SEQ_MAX,
        })
    }

    /// The tag and ignore mask of a receive for every message of `class`.
    pub fn class_match(class: u64) -> (u64, u64) {
        (TAG_MAGIC << 56 | class << 52, (1 << 52) - 1)
    }

    /// The incarnation, at most `mine`, this message was sent to (`None`:
    /// none that has existed).
    pub fn dst_incarnation(self, mine: u64) -> Option<u64> {
        let m = (1 << DST_INC_BITS) - 1;
        mine.checked_sub(mine.wrapping_sub(self.dst_inc) & m)
    }

    /// The payload's stream: a function of the message and of the receiver
    /// it was meant for (rank and incarnation) and its length.
    pub fn payload_seed(self, dst: u64, dst_inc: u64, len: u64) -> u64 {
        mix(&[1, self.src, self.src_inc, self.seq, dst, dst_inc, len])
    }
}

/// A received message checked: `Ok` when every byte is what the sender
/// wrote for this receiver, else why not.
pub fn check_message(id: MsgId, dst: u64, dst_inc: u64, msg_len: u64, bytes: &[u8]) -> Result<(), String> {
    if bytes.len() as u64 != msg_len {
        return Err(format!("{} of {msg_len} bytes delivered", bytes.len()));
    }
    match first_mismatch(id.payload_seed(dst, dst_inc, msg_len), bytes) {
        None => Ok(()),
        Some(at) => Err(format!("byte {at} of {msg_len} differs from what rank {}/{} sent", id.src, id.src_inc)),
    }
}

/// Recent messages an order check compares a new one with.
const ORDER_WINDOW: usize = 16;

/// The order check of one sender incarnation's messages of one tag class
/// at one receiver (MPI's non-overtaking rule): of two such messages, the
/// one sent first (lower sequence) must have matched the receive posted
/// first. Completions may come in any order; matches may not. Also finds
/// a message delivered twice.
#[derive(Clone, Debug, Default)]
pub struct OrderCheck {
    /// (receive's posting number, message's sequence) of recent matches.
    recent: std::collections::VecDeque<(u64, u64)>,
}

impl OrderCheck {
    /// Takes a message of sequence `seq` that matched the receive posted
    /// `posted`-th in its class; an error when it overtook, or was
    /// overtaken by, one of the recent ones.
    pub fn take(&mut self, posted: u64, seq: u64) -> Result<(), String> {
        let mut bad = None;
        for &(p, s) in &self.recent {
            if s == seq {
                bad = Some(format!("sequence {seq} delivered twice"));
            } else if (posted > p) != (seq > s) {
                bad = Some(format!("sequence {seq} matched receive #{posted}, sequence {s} receive #{p}: overtaken"));
            }
        }
        if self.recent.len() == ORDER_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back((posted, seq));
        bad.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_verifies_and_any_flipped_byte_is_found() {
        let id = MsgId { class: 2, src: 3, src_inc: 7, seq: 99, dst_inc: 1 };
        for len in [0usize, 1, 7, 8, 9, 4095, 65536 + 3] {
            let mut buf = vec![0u8; len];
            fill(id.payload_seed(5, 1, len as u64), &mut buf);
            assert_eq!(check_message(id, 5, 1, len as u64, &buf), Ok(()));
            for at in [0, len / 2, len.saturating_sub(1)] {
                if len == 0 {
                    continue;
                }
                let mut bad = buf.clone();
                bad[at] ^= 0x10;
                let e = check_message(id, 5, 1, len as u64, &bad).unwrap_err();
                assert!(e.starts_with(&format!("byte {at} ")), "{e}");
            }
        }
    }

    #[test]
    fn a_message_for_another_incarnation_or_length_does_not_verify() {
        let id = MsgId { class: 0, src: 1, src_inc: 0, seq: 4, dst_inc: 3 };
        let mut buf = vec![0u8; 100];
        fill(id.payload_seed(2, 3, 100), &mut buf);
        assert!(check_message(id, 2, 4, 100, &buf).is_err(), "the receiver's next incarnation");
        assert!(check_message(id, 3, 3, 100, &buf).is_err(), "another receiver");
        assert!(check_message(MsgId { seq: 5, ..id }, 2, 3, 100, &buf).is_err(), "another sequence");
        assert!(check_message(id, 2, 3, 101, &buf).is_err(), "truncated");
        assert!(check_message(id, 2, 3, 100, &buf[..99]).is_err(), "short");
    }

    #[test]
    fn tags_round_trip_and_match_only_their_class() {
        let id = MsgId { class: 3, src: 7, src_inc: 65535, seq: SEQ_MAX, dst_inc: 15 };
        assert_eq!(MsgId::from_tag(id.tag()), Some(id));
        assert_eq!(MsgId { dst_inc: 5, ..id }.dst_incarnation(21), Some(21));
        assert_eq!(MsgId { dst_inc: 4, ..id }.dst_incarnation(21), Some(20));
        assert_eq!(MsgId { dst_inc: 6, ..id }.dst_incarnation(21), Some(6));
        assert_eq!(MsgId { dst_inc: 0, ..id }.dst_incarnation(3), Some(0));
        assert_eq!(MsgId { dst_inc: 5, ..id }.dst_incarnation(3), None);
        let (tag, ignore) = MsgId::class_match(3);
        assert_eq!(id.tag() & !ignore, tag);
        let (other, _) = MsgId::class_match(2);
        assert_ne!(id.tag() & !ignore, other);
        assert_eq!(MsgId::from_tag(0xEB00_0000_0000_0000), None);
        assert_eq!(MsgId::from_tag(0x5A4 << 52), None, "class out of range");
    }

    #[test]
    fn matches_must_follow_sending_order_whatever_the_completion_order() {
        let mut o = OrderCheck::default();
        o.take(1, 0).unwrap();
        o.take(3, 5).unwrap(); // completed before receive #2's: fine
        o.take(2, 2).unwrap();
        assert!(o.take(4, 1).is_err(), "sequence 1 matched after 2 and 5");
        assert!(o.take(9, 5).is_err(), "delivered twice");
        o.take(10, 6).unwrap();
    }

    #[test]
    fn the_generator_is_deterministic_and_ranges_hold() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        for _ in 0..1000 {
            let x = a.range(3, 9);
            assert_eq!(x, b.range(3, 9));
            assert!((3..=9).contains(&x));
        }
        assert_eq!(Rng::new(1).range(0, u64::MAX), Rng::new(1).next_u64());
    }
}
