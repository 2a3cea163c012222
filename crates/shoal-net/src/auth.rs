//! Cluster-key authentication of datagrams between daemons
//! (`docs/wire-format.md`, "Authentication").
//!
//! Every datagram a daemon sends is wrapped in an *envelope* sealed with
//! ChaCha20-Poly1305 under the cluster's 32-byte key ([`ClusterKey`]). A
//! receiver opens it with an [`Opener`], which checks the tag and then a
//! per-sender replay window; a datagram from a host without the key, a
//! tampered one or a replayed one is refused with an [`AuthError`] and counted
//! in [`AuthStats`]. Only the datagram inside an accepted envelope reaches the
//! engines.
//!
//! ```text
//! offset  size  field
//! 0       1     magic and version, 0xA1
//! 1       1     mode: 1 authenticate (payload in clear), 2 encrypt
//! 2       4     sender id, u32 big-endian
//! 6       8     counter, u64 big-endian
//! 14      n     payload (the shoal datagram, ciphertext in mode 2)
//! 14+n    16    Poly1305 tag
//! ```
//!
//! [`OVERHEAD`] = 30 bytes per datagram. The nonce is the sender id followed by
//! the counter (12 bytes). In [`Mode::Authenticate`] the header and payload
//! are the associated data and the plaintext is empty; in [`Mode::Encrypt`]
//! the header is the associated data and the payload is encrypted.
//!
//! # Why a nonce never repeats
//!
//! ChaCha20-Poly1305 is broken by one nonce used twice under a key, so the
//! construction must exclude it, not merely make it unlikely:
//!
//! * the nonce contains the sender id, so two senders never share one;
//! * one [`Sealer`] counts up from `epoch << EPOCH_SHIFT` and never wraps
//!   ([`SealError::Exhausted`]), so it never repeats its own;
//! * a restarted sender takes a larger epoch. With `epoch` = Unix time in
//!   milliseconds at start-up, an incarnation that started at `e0` and one
//!   that started later at `e1` could only meet if the first had sent
//!   `(e1 - e0) << 22` datagrams in its `e1 - e0` milliseconds of life, i.e.
//!   more than 4 billion datagrams a second. 42 bits of milliseconds last
//!   until the year 2109 ([`MAX_EPOCH`]).
//!
//! What the caller must supply: **exactly one live `Sealer` per (key, sender
//! id)** — a daemon with several sending sockets shares one `Sealer` among
//! them (two Sealers with one sender id would reuse nonces), and sender ids
//! are distinct across the cluster; and an `epoch` larger than any earlier
//! incarnation's with this key and sender id by more than that incarnation's
//! datagram count `>> 22` — Unix milliseconds at start-up do it unless the
//! wall clock steps back across a restart.
//!
//! # Replay window
//!
//! The [`Opener`] keeps, per sender, the highest counter accepted and a bitmap
//! of the `window` counters below it (RFC 6479's ring of 64-bit words, as in
//! IPsec and WireGuard). A counter above the highest slides the window; an
//! unseen counter inside the window is accepted; a seen one is
//! [`AuthError::Replay`], one at or below `highest - window` is
//! [`AuthError::TooOld`]. The window is updated only after the tag checked, so
//! forged packets cannot move it. A restarted sender's counters start above its
//! old ones (larger epoch) and simply slide the window. At most
//! `max_senders` windows are kept; a new sender beyond that evicts the least
//! recently accepted one (counted in [`AuthStats::evicted`]).
//!
//! Limits, stated rather than hidden: the cluster key proves membership of the
//! cluster, not identity (any key holder can claim any sender id); a receiver
//! that has no window for a sender (it restarted, or evicted the sender) can
//! be fed a replay of that sender's older datagrams once each — the engines'
//! own sequence numbers must tolerate duplicates, as they do for the network's.

use std::collections::HashMap;
use std::fmt;

use chacha20poly1305::aead::generic_array::GenericArray;
use chacha20poly1305::{AeadInPlace, ChaCha20Poly1305, KeyInit, Nonce, Tag};
use thiserror::Error;

/// First byte of every envelope: magic and version in one (version 1).
pub const MAGIC: u8 = 0xA1;
/// Envelope header bytes: magic, mode, sender `u32`, counter `u64`.
pub const HEADER_LEN: usize = 14;
/// Poly1305 tag bytes at the end of every envelope.
pub const TAG_LEN: usize = 16;
/// Bytes an envelope adds to a datagram.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// A [`Sealer`]'s first counter is `epoch << EPOCH_SHIFT`.
pub const EPOCH_SHIFT: u32 = 22;
/// The largest epoch a [`Sealer`] takes (2^42 - 1: Unix milliseconds until 2109).
pub const MAX_EPOCH: u64 = (1 << (64 - EPOCH_SHIFT)) - 1;

const MODE_AUTHENTICATE: u8 = 1;
const MODE_ENCRYPT: u8 = 2;

/// The cluster's shared 32-byte key. Its `Debug` does not show the key.
#[derive(Clone)]
pub struct ClusterKey([u8; 32]);

/// Why a key could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    #[error("cluster key must be 64 hex digits (32 bytes), found {found} characters")]
    WrongLength { found: usize },
    #[error("cluster key has a non-hex character at position {position}")]
    NotHex { position: usize },
}

impl ClusterKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        ClusterKey(bytes)
    }

    /// Reads 64 hex digits (either case); surrounding whitespace (a trailing
    /// newline from a key file) is ignored.
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        // Character positions, so an error never slices inside a UTF-8 char.
        let digits: Vec<char> = text.chars().collect();
        if digits.len() != 64 {
            return Err(KeyError::WrongLength {
                found: digits.len(),
            });
        }
        let mut key = [0u8; 32];
        for (i, pair) in digits.chunks_exact(2).enumerate() {
            let mut byte = 0u8;
            for (j, c) in pair.iter().enumerate() {
                let nibble = c.to_digit(16).ok_or(KeyError::NotHex {
                    position: 2 * i + j,
                })?;
                byte = byte << 4 | nibble as u8;
            }
            key[i] = byte;
        }
        Ok(ClusterKey(key))
    }

    fn cipher(&self) -> ChaCha20Poly1305 {
        ChaCha20Poly1305::new(GenericArray::from_slice(&self.0))
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(<redacted>)")
    }
}

/// What a [`Sealer`] does with the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The payload travels in clear; the tag covers header and payload.
    Authenticate,
    /// The payload is encrypted; the tag covers header and ciphertext.
    Encrypt,
}

impl Mode {
    fn byte(self) -> u8 {
        match self {
            Mode::Authenticate => MODE_AUTHENTICATE,
            Mode::Encrypt => MODE_ENCRYPT,
        }
    }
}

/// Why a [`Sealer`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SealError {
    #[error("epoch {0} is above the largest allowed ({MAX_EPOCH})")]
    EpochTooLarge(u64),
    #[error("the sender's counter is exhausted; restart with a larger epoch")]
    Exhausted,
}

/// Seals datagrams for one sender incarnation. Exactly one live `Sealer` per
/// (key, sender id): see the module documentation.
pub struct Sealer {
    cipher: ChaCha20Poly1305,
    mode: Mode,
    sender: u32,
    next: u64,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealer")
            .field("mode", &self.mode)
            .field("sender", &self.sender)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// `epoch`: larger than any earlier incarnation's for this key and sender
    /// id, at most [`MAX_EPOCH`]; Unix time in milliseconds at start-up.
    pub fn new(key: &ClusterKey, mode: Mode, sender: u32, epoch: u64) -> Result<Self, SealError> {
        if epoch > MAX_EPOCH {
            return Err(SealError::EpochTooLarge(epoch));
        }
        Ok(Sealer {
            cipher: key.cipher(),
            mode,
            sender,
            next: epoch << EPOCH_SHIFT,
        })
    }

    /// The counter the next envelope will carry.
    pub fn next_counter(&self) -> u64 {
        self.next
    }

    pub fn sender(&self) -> u32 {
        self.sender
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Clears `out` and writes the envelope of `datagram` into it
    /// (`datagram.len() + OVERHEAD` bytes). Each call uses a fresh counter.
    pub fn seal(&mut self, datagram: &[u8], out: &mut Vec<u8>) -> Result<(), SealError> {
        // u64::MAX is never used, so the increment below cannot wrap.
        if self.next == u64::MAX {
            return Err(SealError::Exhausted);
        }
        let counter = self.next;
        self.next += 1;

        out.clear();
        out.reserve(datagram.len() + OVERHEAD);
        out.push(MAGIC);
        out.push(self.mode.byte());
        out.extend_from_slice(&self.sender.to_be_bytes());
        out.extend_from_slice(&counter.to_be_bytes());
        out.extend_from_slice(datagram);
        let nonce = nonce(self.sender, counter);
        let tag = match self.mode {
            Mode::Authenticate => self
                .cipher
                .encrypt_in_place_detached(&nonce, &out[..], &mut []),
            Mode::Encrypt => {
                let (header, body) = out.split_at_mut(HEADER_LEN);
                self.cipher.encrypt_in_place_detached(&nonce, header, body)
            }
        }
        // Only fails for a payload above 256 GiB.
        .expect("ChaCha20-Poly1305 seals any datagram");
        out.extend_from_slice(&tag);
        Ok(())
    }
}

fn nonce(sender: u32, counter: u64) -> Nonce {
    let mut nonce = Nonce::default();
    nonce[..4].copy_from_slice(&sender.to_be_bytes());
    nonce[4..].copy_from_slice(&counter.to_be_bytes());
    nonce
}

/// Why an envelope was refused. Each is counted in [`AuthStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum AuthError {
    #[error("envelope shorter than {OVERHEAD} bytes")]
    TooShort,
    #[error("unknown envelope magic, version or mode")]
    BadMagic,
    #[error("bad authentication tag (wrong cluster key or tampered)")]
    BadTag,
    #[error("replayed envelope (counter already accepted)")]
    Replay,
    #[error("envelope older than the replay window")]
    TooOld,
}

/// An [`Opener`]'s counts. Every envelope offered lands in exactly one of
/// `accepted`, `bad_format`, `bad_tag`, `replayed`, `too_old`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuthStats {
    pub accepted: u64,
    /// [`AuthError::TooShort`] and [`AuthError::BadMagic`].
    pub bad_format: u64,
    pub bad_tag: u64,
    pub replayed: u64,
    pub too_old: u64,
    /// Sender windows dropped to make room for a new sender (not a refusal).
    pub evicted: u64,
}

/// [`Opener`] settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenerConfig {
    /// Replay window, in counters: a counter at or below `highest - window`
    /// is too old. At least 1 (a smaller value is taken as 1). Each tracked
    /// sender costs about `window / 8 + 64` bytes.
    pub window: u32,
    /// Senders tracked at once; at least 1.
    pub max_senders: usize,
}

impl Default for OpenerConfig {
    /// A 1,024-counter window (a sender's unicast and multicast datagrams may
    /// overtake each other by hundreds), 4,096 senders: under 1 MiB at most.
    fn default() -> Self {
        OpenerConfig {
            window: 1024,
            max_senders: 4096,
        }
    }
}

/// An accepted envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened<'a> {
    pub sender: u32,
    pub counter: u64,
    /// The datagram inside: borrowed from the envelope in
    /// [`Mode::Authenticate`], from `out` in [`Mode::Encrypt`].
    pub datagram: &'a [u8],
}

/// Opens envelopes: checks the tag, then the sender's replay window. Share
/// one `Opener` among a daemon's receiving sockets, so that a datagram
/// replayed to another socket is still caught. Accepts either [`Mode`] (the
/// mode byte is authenticated).
pub struct Opener {
    cipher: ChaCha20Poly1305,
    window: u64,
    words: usize,
    max_senders: usize,
    senders: HashMap<u32, Tracked>,
    tick: u64,
    stats: AuthStats,
}

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opener")
            .field("window", &self.window)
            .field("max_senders", &self.max_senders)
            .field("senders", &self.senders.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

struct Tracked {
    window: Window,
    last_accepted: u64,
}

impl Opener {
    pub fn new(key: &ClusterKey, config: OpenerConfig) -> Self {
        let window = u64::from(config.window.max(1));
        Opener {
            cipher: key.cipher(),
            window,
            // Enough 64-bit words that the ring still holds the block of
            // `highest - window + 1` after the block of `highest` reused one.
            words: window.div_ceil(64) as usize + 1,
            max_senders: config.max_senders.max(1),
            senders: HashMap::new(),
            tick: 0,
            stats: AuthStats::default(),
        }
    }

    pub fn stats(&self) -> AuthStats {
        self.stats
    }

    /// Senders whose window is kept (at most `max_senders`).
    pub fn tracked_senders(&self) -> usize {
        self.senders.len()
    }

    /// Opens `envelope`. In [`Mode::Encrypt`] the plaintext is written to
    /// `out` (cleared first; left empty on refusal); in
    /// [`Mode::Authenticate`] `out` is not touched and the datagram is a
    /// slice of `envelope`. Nothing of a refused envelope is returned.
    pub fn open<'a>(
        &mut self,
        envelope: &'a [u8],
        out: &'a mut Vec<u8>,
    ) -> Result<Opened<'a>, AuthError> {
        let result = self.open_inner(envelope, out);
        let stats = &mut self.stats;
        match result {
            Ok(_) => stats.accepted += 1,
            Err(AuthError::TooShort | AuthError::BadMagic) => stats.bad_format += 1,
            Err(AuthError::BadTag) => stats.bad_tag += 1,
            Err(AuthError::Replay) => stats.replayed += 1,
            Err(AuthError::TooOld) => stats.too_old += 1,
        }
        result
    }

    fn open_inner<'a>(
        &mut self,
        envelope: &'a [u8],
        out: &'a mut Vec<u8>,
    ) -> Result<Opened<'a>, AuthError> {
        if envelope.len() < OVERHEAD {
            return Err(AuthError::TooShort);
        }
        let mode = envelope[1];
        if envelope[0] != MAGIC || !(mode == MODE_AUTHENTICATE || mode == MODE_ENCRYPT) {
            return Err(AuthError::BadMagic);
        }
        let sender = u32::from_be_bytes(envelope[2..6].try_into().expect("4 bytes"));
        let counter = u64::from_be_bytes(envelope[6..14].try_into().expect("8 bytes"));
        let (sealed, tag) = envelope.split_at(envelope.len() - TAG_LEN);
        let tag = Tag::from_slice(tag);
        let nonce = nonce(sender, counter);

        let datagram: &'a [u8] = if mode == MODE_AUTHENTICATE {
            self.cipher
                .decrypt_in_place_detached(&nonce, sealed, &mut [], tag)
                .map_err(|_| AuthError::BadTag)?;
            &sealed[HEADER_LEN..]
        } else {
            out.clear();
            out.extend_from_slice(&sealed[HEADER_LEN..]);
            // Verifies the tag before decrypting anything.
            if self
                .cipher
                .decrypt_in_place_detached(&nonce, &sealed[..HEADER_LEN], out, tag)
                .is_err()
            {
                out.clear();
                return Err(AuthError::BadTag);
            }
            out
        };

        self.accept(sender, counter)?;
        Ok(Opened {
            sender,
            counter,
            datagram,
        })
    }

    /// Checks and records `counter` in `sender`'s window (authentic packets only).
    fn accept(&mut self, sender: u32, counter: u64) -> Result<(), AuthError> {
        self.tick += 1;
        if let Some(tracked) = self.senders.get_mut(&sender) {
            tracked.window.check_and_set(counter, self.window)?;
            tracked.last_accepted = self.tick;
            return Ok(());
        }
        if self.senders.len() >= self.max_senders {
            // O(max_senders), only when a new key-holding sender appears
            // while the table is full.
            let oldest = self
                .senders
                .iter()
                .min_by_key(|(_, t)| t.last_accepted)
                .map(|(&id, _)| id)
                .expect("the table is full, so not empty");
            self.senders.remove(&oldest);
            self.stats.evicted += 1;
        }
        let mut window = Window::new(self.words);
        window
            .check_and_set(counter, self.window)
            .expect("a fresh window accepts any counter");
        self.senders.insert(
            sender,
            Tracked {
                window,
                last_accepted: self.tick,
            },
        );
        Ok(())
    }
}

/// A sliding replay window: the highest counter accepted and a ring of 64-bit
/// words, bit `c % 64` of word `(c / 64) % words` standing for counter `c`
/// (RFC 6479). Words are cleared as the highest counter moves into them.
struct Window {
    highest: u64,
    /// No counter accepted yet (`highest` means nothing).
    empty: bool,
    bits: Box<[u64]>,
}

impl Window {
    fn new(words: usize) -> Self {
        Window {
            highest: 0,
            empty: true,
            bits: vec![0; words].into_boxed_slice(),
        }
    }

    /// `window` must be at most `(words - 1) * 64`.
    fn check_and_set(&mut self, counter: u64, window: u64) -> Result<(), AuthError> {
        let words = self.bits.len() as u64;
        if self.empty || counter > self.highest {
            let new_block = counter / 64;
            if !self.empty {
                let old_block = self.highest / 64;
                // Clear every word the ring reuses between the two blocks.
                let moved = (new_block - old_block).min(words);
                for i in 1..=moved {
                    self.bits[((old_block + i) % words) as usize] = 0;
                }
            }
            self.highest = counter;
            self.empty = false;
        } else if self.highest - counter >= window {
            return Err(AuthError::TooOld);
        }
        let word = &mut self.bits[((counter / 64) % words) as usize];
        let bit = 1u64 << (counter % 64);
        if *word & bit != 0 {
            return Err(AuthError::Replay);
        }
        *word |= bit;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(byte: u8) -> ClusterKey {
        ClusterKey::from_bytes([byte; 32])
    }

    fn sealer(mode: Mode, sender: u32, epoch: u64) -> Sealer {
        Sealer::new(&key(7), mode, sender, epoch).unwrap()
    }

    fn opener(window: u32, max_senders: usize) -> Opener {
        Opener::new(
            &key(7),
            OpenerConfig {
                window,
                max_senders,
            },
        )
    }

    fn seal(s: &mut Sealer, datagram: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        s.seal(datagram, &mut out).unwrap();
        out
    }

    /// Opens and returns the sender, or the error.
    fn open(o: &mut Opener, envelope: &[u8]) -> Result<u32, AuthError> {
        let mut out = Vec::new();
        o.open(envelope, &mut out).map(|opened| opened.sender)
    }

    #[test]
    fn auth_round_trip_both_modes() {
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            let mut s = sealer(mode, 42, 1_700_000_000_000);
            let mut o = opener(64, 16);
            for datagram in [&b""[..], b"x", b"hello, shoal", &[0xFF; 1500]] {
                let envelope = seal(&mut s, datagram);
                assert_eq!(envelope.len(), datagram.len() + OVERHEAD);
                assert_eq!(envelope[0], MAGIC);
                let payload = &envelope[HEADER_LEN..envelope.len() - TAG_LEN];
                match mode {
                    Mode::Authenticate => assert_eq!(payload, datagram),
                    Mode::Encrypt if datagram.len() > 4 => assert_ne!(payload, datagram),
                    Mode::Encrypt => {}
                }
                let mut out = Vec::new();
                let opened = o.open(&envelope, &mut out).unwrap();
                assert_eq!(opened.sender, 42);
                assert_eq!(opened.datagram, datagram);
                assert_eq!(opened.counter + 1, s.next_counter());
            }
            assert_eq!(o.stats().accepted, 4);
        }
    }

    #[test]
    fn auth_counters_start_at_epoch_and_never_repeat() {
        let mut s = sealer(Mode::Authenticate, 1, 5);
        let first = seal(&mut s, b"a");
        let second = seal(&mut s, b"a");
        assert_eq!(&first[6..14], &(5u64 << EPOCH_SHIFT).to_be_bytes());
        assert_eq!(&second[6..14], &((5u64 << EPOCH_SHIFT) + 1).to_be_bytes());
        assert_ne!(first, second);
        assert_eq!(
            Sealer::new(&key(7), Mode::Encrypt, 1, MAX_EPOCH + 1).unwrap_err(),
            SealError::EpochTooLarge(MAX_EPOCH + 1)
        );
        let mut last = sealer(Mode::Encrypt, 1, MAX_EPOCH);
        last.next = u64::MAX - 1;
        let mut out = Vec::new();
        assert_eq!(last.seal(b"a", &mut out), Ok(()));
        assert_eq!(last.seal(b"a", &mut out), Err(SealError::Exhausted));
    }

    #[test]
    fn auth_other_key_is_refused_and_counted() {
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            let mut stranger = Sealer::new(&key(8), mode, 3, 1).unwrap();
            let mut o = opener(64, 16);
            let envelope = seal(&mut stranger, b"join me");
            let mut out = Vec::new();
            assert_eq!(o.open(&envelope, &mut out), Err(AuthError::BadTag));
            assert!(out.is_empty(), "no plaintext of a refused envelope");
            assert_eq!(
                o.stats(),
                AuthStats {
                    bad_tag: 1,
                    ..AuthStats::default()
                }
            );
            assert_eq!(o.tracked_senders(), 0, "a forged packet creates no window");
        }
    }

    #[test]
    fn auth_flipped_bit_anywhere_is_refused() {
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            let mut s = sealer(mode, 9, 77);
            let envelope = seal(&mut s, b"some payload bytes");
            let mut o = opener(64, 16);
            for i in 0..envelope.len() * 8 {
                let mut bad = envelope.clone();
                bad[i / 8] ^= 1 << (i % 8);
                let expected = match i / 8 {
                    0 => AuthError::BadMagic,
                    // mode 1 <-> 2 needs two bits; one flip gives 0, 3, 5...
                    1 => AuthError::BadMagic,
                    _ => AuthError::BadTag,
                };
                assert_eq!(open(&mut o, &bad), Err(expected), "bit {i}");
            }
            // The mode byte is authenticated: swapping the mode fails the tag.
            let mut swapped = envelope.clone();
            swapped[1] = if mode == Mode::Encrypt {
                MODE_AUTHENTICATE
            } else {
                MODE_ENCRYPT
            };
            assert_eq!(open(&mut o, &swapped), Err(AuthError::BadTag));
            assert_eq!(open(&mut o, &envelope), Ok(9), "the intact one still opens");
            let stats = o.stats();
            assert_eq!(stats.bad_format, 16);
            assert_eq!(stats.bad_tag, (envelope.len() as u64 - 2) * 8 + 1);
        }
    }

    #[test]
    fn auth_too_short_and_bad_magic() {
        let mut o = opener(64, 16);
        assert_eq!(open(&mut o, &[]), Err(AuthError::TooShort));
        assert_eq!(
            open(&mut o, &[MAGIC; OVERHEAD - 1]),
            Err(AuthError::TooShort)
        );
        // A plain shoal-wire datagram ("SH", version 1) is not an envelope.
        let mut plain = vec![0x53, 0x48, 1, 1];
        plain.resize(64, 0);
        assert_eq!(open(&mut o, &plain), Err(AuthError::BadMagic));
        assert_eq!(o.stats().bad_format, 3);
    }

    #[test]
    fn auth_replay_is_refused() {
        for mode in [Mode::Authenticate, Mode::Encrypt] {
            let mut s = sealer(mode, 4, 10);
            let mut o = opener(64, 16);
            let envelope = seal(&mut s, b"once");
            assert_eq!(open(&mut o, &envelope), Ok(4));
            assert_eq!(open(&mut o, &envelope), Err(AuthError::Replay));
            assert_eq!(open(&mut o, &envelope), Err(AuthError::Replay));
            let stats = o.stats();
            assert_eq!((stats.accepted, stats.replayed), (1, 2));
        }
    }

    #[test]
    fn auth_reordering_within_window_accepted_beyond_refused() {
        let mut s = sealer(Mode::Authenticate, 5, 1);
        let envelopes: Vec<Vec<u8>> = (0..200).map(|i| seal(&mut s, &[i as u8])).collect();
        let mut o = opener(64, 16);
        // Newest first: 199, then 198 ... 136 are inside the 64-counter window.
        assert_eq!(open(&mut o, &envelopes[199]), Ok(5));
        for i in (136..199).rev() {
            assert_eq!(open(&mut o, &envelopes[i]), Ok(5), "envelope {i}");
        }
        for i in [135, 100, 0] {
            assert_eq!(
                open(&mut o, &envelopes[i]),
                Err(AuthError::TooOld),
                "envelope {i}"
            );
        }
        for i in [199, 150, 136] {
            assert_eq!(
                open(&mut o, &envelopes[i]),
                Err(AuthError::Replay),
                "envelope {i}"
            );
        }
        let stats = o.stats();
        assert_eq!((stats.accepted, stats.too_old, stats.replayed), (64, 3, 3));

        // Interleaved arrival with gaps, across several ring words.
        let mut o = opener(100, 16);
        let order = [0, 2, 1, 70, 3, 65, 64, 130, 40, 31, 169, 150];
        for i in order {
            assert_eq!(open(&mut o, &envelopes[i]), Ok(5), "envelope {i}");
        }
        // 169 is the highest: 70 is the oldest inside a 100-counter window.
        assert_eq!(open(&mut o, &envelopes[68]), Err(AuthError::TooOld));
        assert_eq!(open(&mut o, &envelopes[69]), Err(AuthError::TooOld));
        assert_eq!(open(&mut o, &envelopes[70]), Err(AuthError::Replay));
        assert_eq!(open(&mut o, &envelopes[71]), Ok(5));
        assert_eq!(open(&mut o, &envelopes[168]), Ok(5));
        assert_eq!(open(&mut o, &envelopes[199]), Ok(5));
        assert_eq!(open(&mut o, &envelopes[99]), Err(AuthError::TooOld));
        assert_eq!(open(&mut o, &envelopes[100]), Ok(5));
    }

    #[test]
    fn auth_window_matches_a_reference_model() {
        // Every arrival order of a pseudo-random permutation with duplicates,
        // against a set-based model of the window.
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        for window in [1u32, 63, 64, 65, 200] {
            let mut w = Window::new(u64::from(window).div_ceil(64) as usize + 1);
            let mut seen = std::collections::BTreeSet::new();
            let mut highest = None::<u64>;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            for _ in 0..5000 {
                let base = highest.unwrap_or(1000);
                // Mostly a little behind the highest, sometimes ahead of it.
                let counter = (base + next() % 40).saturating_sub(next() % 300);
                let expected = match highest {
                    Some(h) if counter <= h && h - counter >= u64::from(window) => {
                        Err(AuthError::TooOld)
                    }
                    _ if seen.contains(&counter) => Err(AuthError::Replay),
                    _ => Ok(()),
                };
                assert_eq!(w.check_and_set(counter, u64::from(window)), expected);
                if expected.is_ok() {
                    seen.insert(counter);
                    highest = Some(highest.map_or(counter, |h| h.max(counter)));
                }
            }
        }
    }

    #[test]
    fn auth_restarted_sender_with_higher_epoch_is_accepted() {
        let mut o = opener(64, 16);
        let mut before = sealer(Mode::Encrypt, 6, 1_700_000_000_000);
        let old: Vec<Vec<u8>> = (0..10).map(|_| seal(&mut before, b"old")).collect();
        for e in &old {
            assert_eq!(open(&mut o, e), Ok(6));
        }
        // Restarted one millisecond later: all its counters are higher.
        let mut after = sealer(Mode::Encrypt, 6, 1_700_000_000_001);
        for _ in 0..10 {
            assert_eq!(open(&mut o, &seal(&mut after, b"new")), Ok(6));
        }
        // The old incarnation's datagrams are now far outside the window.
        assert_eq!(open(&mut o, &old[9]), Err(AuthError::TooOld));
        assert_eq!(o.stats().accepted, 20);
    }

    #[test]
    fn auth_sender_table_is_bounded_and_evicts_least_recent() {
        let mut o = opener(64, 3);
        let mut sealers: Vec<Sealer> = (0..5).map(|id| sealer(Mode::Authenticate, id, 1)).collect();
        for s in &mut sealers[..3] {
            let id = s.sender();
            assert_eq!(open(&mut o, &seal(s, b"hi")), Ok(id));
        }
        // 1, then 0 and 2 are seen again: sender 1 is the least recent.
        let replay_of_1 = seal(&mut sealers[1], b"kept");
        assert_eq!(open(&mut o, &replay_of_1), Ok(1));
        assert_eq!(open(&mut o, &seal(&mut sealers[0], b"hi")), Ok(0));
        assert_eq!(open(&mut o, &seal(&mut sealers[2], b"hi")), Ok(2));
        assert_eq!(open(&mut o, &seal(&mut sealers[3], b"hi")), Ok(3));
        assert_eq!(o.tracked_senders(), 3);
        assert_eq!(o.stats().evicted, 1);
        assert!(!o.senders.contains_key(&1));
        // Sender 1's window is gone, so its old datagram opens again (the
        // documented limit) and evicts sender 0.
        assert_eq!(open(&mut o, &replay_of_1), Ok(1));
        assert_eq!(o.stats().evicted, 2);
        // Sender 4 evicts sender 2: 3, 1, 4 are kept.
        assert_eq!(open(&mut o, &seal(&mut sealers[4], b"hi")), Ok(4));
        assert_eq!(o.tracked_senders(), 3);
        assert!(!o.senders.contains_key(&0));
        assert!(!o.senders.contains_key(&2));
        for _ in 0..1000 {
            for s in sealers.iter_mut() {
                let _ = open(&mut o, &seal(s, b"x"));
                assert!(o.tracked_senders() <= 3);
            }
        }
    }

    #[test]
    fn auth_key_from_hex() {
        let hex = "000102030405060708090a0b0c0d0e0f101112131415161718191A1B1C1D1E1F";
        let k = ClusterKey::from_hex(&format!("  {hex}\n")).unwrap();
        let expected: Vec<u8> = (0..32).collect();
        assert_eq!(&k.0[..], &expected[..]);
        assert_eq!(format!("{k:?}"), "ClusterKey(<redacted>)");
        assert_eq!(
            ClusterKey::from_hex(&hex[..62]).unwrap_err(),
            KeyError::WrongLength { found: 62 }
        );
        let mut bad = hex.to_string();
        bad.replace_range(10..11, "g");
        assert_eq!(
            ClusterKey::from_hex(&bad).unwrap_err(),
            KeyError::NotHex { position: 10 }
        );
        assert_eq!(
            ClusterKey::from_hex(&"é".repeat(64)).unwrap_err(),
            KeyError::NotHex { position: 0 }
        );
        assert!(ClusterKey::from_hex("").is_err());
    }

    proptest! {
        #[test]
        fn auth_open_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200),
                                  magic in any::<bool>()) {
            let mut o = opener(64, 4);
            let mut bytes = bytes;
            if magic && bytes.len() >= 2 {
                bytes[0] = MAGIC;
                bytes[1] = if bytes[1] % 2 == 0 { MODE_ENCRYPT } else { MODE_AUTHENTICATE };
            }
            let mut out = Vec::new();
            let result = o.open(&bytes, &mut out).map(|_| ());
            prop_assert!(result.is_err(), "random bytes never carry a valid tag");
            let stats = o.stats();
            prop_assert_eq!(stats.bad_format + stats.bad_tag, 1);
        }

        #[test]
        fn auth_round_trip_arbitrary(datagram in proptest::collection::vec(any::<u8>(), 0..300),
                                     encrypt in any::<bool>(), sender in any::<u32>(),
                                     epoch in 0..=MAX_EPOCH) {
            let mode = if encrypt { Mode::Encrypt } else { Mode::Authenticate };
            let mut s = Sealer::new(&key(7), mode, sender, epoch).unwrap();
            let mut o = opener(64, 4);
            let envelope = seal(&mut s, &datagram);
            let mut out = Vec::new();
            let opened = o.open(&envelope, &mut out).unwrap();
            prop_assert_eq!(opened.sender, sender);
            prop_assert_eq!(opened.datagram, &datagram[..]);
        }
    }
}
