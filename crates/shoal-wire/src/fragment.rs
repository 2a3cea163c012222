//! Datagram fragments: an engine datagram larger than the path's datagram
//! size travels as several UDP datagrams, each one fragment, and is put
//! together again before any engine sees it (`shoal_core::fragments`).
//!
//! A fragment is not a [`crate::Packet`]: it has its own magic, so that no
//! engine's decoder takes one for a packet, and it carries the engine
//! datagram's bytes without looking into them. Its layout keeps the sender
//! at bytes 4..8, where the runtime reads a packet's claimed sender:
//!
//! ```text
//!  0      2    3      4        8        12       16       20
//!  | magic| ver| 0    | sender | id     | offset | total  | chunk ...
//! ```
//!
//! `id` numbers the sender's fragmented datagrams (it wraps), `offset` is
//! where `chunk` starts in the datagram and `total` the datagram's length.
//! Every field is big-endian.

use crate::DecodeError;

/// The first two bytes of a fragment ("SF"; a packet starts with "SH").
pub const FRAGMENT_MAGIC: u16 = 0x5346;
/// Layout version of fragments.
pub const FRAGMENT_VERSION: u8 = 1;
/// Bytes of a fragment's header.
pub const FRAGMENT_HEADER_LEN: usize = 20;
/// Largest datagram fragments may carry: the largest UDP payload over IPv4.
pub const FRAGMENTED_MAX: usize = 65_507;

/// One decoded fragment, borrowing its chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment<'a> {
    pub sender: u32,
    pub id: u32,
    pub offset: u32,
    pub total: u32,
    pub chunk: &'a [u8],
}

impl Fragment<'_> {
    /// Appends the encoded fragment to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(FRAGMENT_HEADER_LEN + self.chunk.len());
        out.extend_from_slice(&FRAGMENT_MAGIC.to_be_bytes());
        out.push(FRAGMENT_VERSION);
        out.push(0);
        out.extend_from_slice(&self.sender.to_be_bytes());
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.total.to_be_bytes());
        out.extend_from_slice(self.chunk);
    }
}

/// Whether `datagram` is a fragment (by its magic; [`decode_fragment`]
/// checks the rest).
pub fn is_fragment(datagram: &[u8]) -> bool {
    datagram.len() >= 2 && u16::from_be_bytes([datagram[0], datagram[1]]) == FRAGMENT_MAGIC
}

/// Decodes a fragment. Refuses a wrong magic or version, a non-zero
/// reserved byte, an empty chunk, a datagram larger than
/// [`FRAGMENTED_MAX`], and a chunk that does not lie inside it.
pub fn decode_fragment(datagram: &[u8]) -> Result<Fragment<'_>, DecodeError> {
    let header = datagram
        .get(..FRAGMENT_HEADER_LEN)
        .ok_or(DecodeError::Truncated {
            needed: FRAGMENT_HEADER_LEN,
            available: datagram.len(),
        })?;
    let u32_at =
        |i: usize| u32::from_be_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
    let magic = u16::from_be_bytes([header[0], header[1]]);
    if magic != FRAGMENT_MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    if header[2] != FRAGMENT_VERSION {
        return Err(DecodeError::UnsupportedVersion(header[2]));
    }
    if header[3] != 0 {
        return Err(DecodeError::BadFlag(header[3]));
    }
    let (sender, id, offset, total) = (u32_at(4), u32_at(8), u32_at(12), u32_at(16));
    let chunk = &datagram[FRAGMENT_HEADER_LEN..];
    let end = u64::from(offset) + chunk.len() as u64;
    if chunk.is_empty() {
        return Err(DecodeError::Empty);
    }
    if total as usize > FRAGMENTED_MAX || end > u64::from(total) {
        return Err(DecodeError::Oversized {
            declared: end.max(u64::from(total)) as usize,
            max: (total as usize).min(FRAGMENTED_MAX),
        });
    }
    Ok(Fragment {
        sender,
        id,
        offset,
        total,
        chunk,
    })
}

/// Splits `datagram` into fragments of at most `max` bytes each (header
/// included), appended to `out` back to back. Every fragment but the last
/// is exactly `max` bytes long (so `out.chunks(max)` gives them back, and a
/// runtime may hand them to the kernel as one segmented send). Returns how
/// many fragments were appended: none when `max` does not exceed
/// [`FRAGMENT_HEADER_LEN`], or `datagram` is empty or larger than
/// [`FRAGMENTED_MAX`].
pub fn split(sender: u32, id: u32, datagram: &[u8], max: usize, out: &mut Vec<u8>) -> usize {
    if max <= FRAGMENT_HEADER_LEN || datagram.is_empty() || datagram.len() > FRAGMENTED_MAX {
        return 0;
    }
    let chunk_max = max - FRAGMENT_HEADER_LEN;
    let total = datagram.len() as u32;
    let count = datagram.len().div_ceil(chunk_max);
    out.reserve(count * FRAGMENT_HEADER_LEN + datagram.len());
    for (i, chunk) in datagram.chunks(chunk_max).enumerate() {
        Fragment {
            sender,
            id,
            offset: (i * chunk_max) as u32,
            total,
            chunk,
        }
        .encode(out);
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn split_then_decode_gives_back_every_byte_in_place() {
        let datagram: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        let count = split(7, 42, &datagram, 1_472, &mut out);
        assert_eq!(count, 10_000usize.div_ceil(1_452));
        let out: Vec<&[u8]> = out.chunks(1_472).collect();
        assert_eq!(out.len(), count);
        let mut joined = vec![0u8; datagram.len()];
        for (i, bytes) in out.iter().enumerate() {
            if i + 1 < out.len() {
                assert_eq!(bytes.len(), 1_472, "all but the last are full");
            }
            let f = decode_fragment(bytes).unwrap();
            assert_eq!((f.sender, f.id, f.total), (7, 42, 10_000));
            let at = f.offset as usize;
            joined[at..at + f.chunk.len()].copy_from_slice(f.chunk);
        }
        assert_eq!(joined, datagram);
    }

    #[test]
    fn the_sender_sits_where_a_packet_has_it() {
        let mut out = Vec::new();
        assert_eq!(split(0x0102_0304, 1, b"hello", 100, &mut out), 1);
        assert_eq!(&out[4..8], &[1, 2, 3, 4]);
        assert!(is_fragment(&out));
        assert!(!is_fragment(&crate::MAGIC.to_be_bytes()));
    }

    #[test]
    fn split_refuses_what_it_cannot_carry() {
        let mut out = Vec::new();
        assert_eq!(split(1, 1, b"", 100, &mut out), 0);
        assert_eq!(split(1, 1, b"x", FRAGMENT_HEADER_LEN, &mut out), 0);
        assert_eq!(
            split(1, 1, &vec![0; FRAGMENTED_MAX + 1], 1_472, &mut out),
            0
        );
        assert!(out.is_empty());
    }

    #[test]
    fn decode_refuses_a_chunk_beyond_its_total_and_bad_headers() {
        let mut ok = Vec::new();
        Fragment {
            sender: 1,
            id: 2,
            offset: 10,
            total: 20,
            chunk: &[9; 10],
        }
        .encode(&mut ok);
        assert!(decode_fragment(&ok).is_ok());
        let mut beyond = Vec::new();
        Fragment {
            sender: 1,
            id: 2,
            offset: 11,
            total: 20,
            chunk: &[9; 10],
        }
        .encode(&mut beyond);
        assert!(decode_fragment(&beyond).is_err());
        for (at, value) in [(0, 0u8), (2, 9), (3, 1)] {
            let mut bad = ok.clone();
            bad[at] = value;
            assert!(decode_fragment(&bad).is_err(), "byte {at}");
        }
        assert!(
            decode_fragment(&ok[..FRAGMENT_HEADER_LEN]).is_err(),
            "empty chunk"
        );
        assert!(decode_fragment(&ok[..5]).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_fragment(&bytes);
        }

        #[test]
        fn any_split_decodes(len in 1usize..5_000, max in 21usize..2_000) {
            let datagram: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut out = Vec::new();
            let count = split(3, 4, &datagram, max, &mut out);
            prop_assert_eq!(count, out.chunks(max).count());
            let mut covered = 0;
            for bytes in out.chunks(max) {
                prop_assert!(bytes.len() <= max);
                let f = decode_fragment(bytes).unwrap();
                prop_assert_eq!(f.offset as usize, covered);
                covered += f.chunk.len();
            }
            prop_assert_eq!(covered, len);
        }
    }
}
