//! The Ring protocol's datagrams (Totem-style single ring inside a site,
//! P-Spread §3; Totem's token fields): the token, unicast to the next
//! member, and data messages, multicast to the site. The layout is ours.
//!
//! ```text
//!  preamble: magic u16 = "RG" (0x5247) | version u8 = 1 | type u8
//!  type 1 TOKEN: ring_id u64 | token_seq u64 | seq u64 | aru u64 |
//!                aru_id u32 (u32::MAX: none) | fcc u32 |
//!                rtr_count u16 | rtr_count × seq u64
//!  type 2 DATA:  ring_id u64 | seq u64 | sender u32 | len u32 | len bytes
//! ```
//!
//! Decoding never panics, checks counts against the bytes present before
//! allocating, and refuses trailing bytes.

use thiserror::Error;

pub const RING_MAGIC: u16 = 0x5247;
pub const RING_VERSION: u8 = 1;
const TOKEN: u8 = 1;
const DATA: u8 = 2;
/// `aru_id` when no member holds the aru down.
pub const NO_MEMBER: u32 = u32::MAX;

/// The token: whoever holds it may multicast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub ring_id: u64,
    /// Incremented at every pass; a copy with a lower one is stale.
    pub token_seq: u64,
    /// The highest message sequence number assigned on the ring.
    pub seq: u64,
    /// All-received-up-to: every member holds every message up to it.
    pub aru: u64,
    /// The member that last lowered `aru` ([`NO_MEMBER`] for none).
    pub aru_id: u32,
    /// Flow control: messages multicast during the last rotation.
    pub fcc: u32,
    /// Retransmission requests: sequence numbers some member lacks.
    pub rtr: Vec<u64>,
}

/// A datagram of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingPacket<'a> {
    Token(Token),
    Data {
        ring_id: u64,
        seq: u64,
        sender: u32,
        payload: &'a [u8],
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RingDecodeError {
    #[error("truncated")]
    Truncated,
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    #[error("unknown type {0}")]
    UnknownType(u8),
    #[error("rtr count {0} does not fit in the bytes left")]
    CountTooLarge(usize),
    #[error("{0} trailing bytes")]
    TrailingBytes(usize),
}

impl RingPacket<'_> {
    /// The datagram's bytes. The rtr list is cut to 8191 entries (the
    /// rest stay requested next rotation).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = RING_MAGIC.to_be_bytes().to_vec();
        out.push(RING_VERSION);
        match self {
            RingPacket::Token(t) => {
                out.push(TOKEN);
                for v in [t.ring_id, t.token_seq, t.seq, t.aru] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                out.extend_from_slice(&t.aru_id.to_be_bytes());
                out.extend_from_slice(&t.fcc.to_be_bytes());
                let rtr = &t.rtr[..t.rtr.len().min(8191)];
                out.extend_from_slice(&(rtr.len() as u16).to_be_bytes());
                for s in rtr {
                    out.extend_from_slice(&s.to_be_bytes());
                }
            }
            RingPacket::Data {
                ring_id,
                seq,
                sender,
                payload,
            } => {
                out.push(DATA);
                out.extend_from_slice(&ring_id.to_be_bytes());
                out.extend_from_slice(&seq.to_be_bytes());
                out.extend_from_slice(&sender.to_be_bytes());
                out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                out.extend_from_slice(payload);
            }
        }
        out
    }
}

/// Decodes one ring datagram.
pub fn decode(bytes: &[u8]) -> Result<RingPacket<'_>, RingDecodeError> {
    let mut r = Reader(bytes);
    let magic = u16::from_be_bytes(r.take()?);
    if magic != RING_MAGIC {
        return Err(RingDecodeError::BadMagic(magic));
    }
    let [version, kind] = r.take()?;
    if version != RING_VERSION {
        return Err(RingDecodeError::UnsupportedVersion(version));
    }
    let packet = match kind {
        TOKEN => {
            let ring_id = r.u64()?;
            let token_seq = r.u64()?;
            let seq = r.u64()?;
            let aru = r.u64()?;
            let aru_id = u32::from_be_bytes(r.take()?);
            let fcc = u32::from_be_bytes(r.take()?);
            let count = usize::from(u16::from_be_bytes(r.take()?));
            if count.saturating_mul(8) > r.0.len() {
                return Err(RingDecodeError::CountTooLarge(count));
            }
            let mut rtr = Vec::with_capacity(count);
            for _ in 0..count {
                rtr.push(r.u64()?);
            }
            RingPacket::Token(Token {
                ring_id,
                token_seq,
                seq,
                aru,
                aru_id,
                fcc,
                rtr,
            })
        }
        DATA => {
            let ring_id = r.u64()?;
            let seq = r.u64()?;
            let sender = u32::from_be_bytes(r.take()?);
            let len = u32::from_be_bytes(r.take()?) as usize;
            if len > r.0.len() {
                return Err(RingDecodeError::Truncated);
            }
            let (payload, rest) = r.0.split_at(len);
            r.0 = rest;
            RingPacket::Data {
                ring_id,
                seq,
                sender,
                payload,
            }
        }
        other => return Err(RingDecodeError::UnknownType(other)),
    };
    match r.0.len() {
        0 => Ok(packet),
        n => Err(RingDecodeError::TrailingBytes(n)),
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], RingDecodeError> {
        let (head, tail) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(RingDecodeError::Truncated)?;
        self.0 = tail;
        Ok(*head)
    }

    fn u64(&mut self) -> Result<u64, RingDecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn tokens_round_trip(ring_id in any::<u64>(), token_seq in any::<u64>(), seq in any::<u64>(), aru in any::<u64>(), aru_id in any::<u32>(), fcc in any::<u32>(), rtr in prop::collection::vec(any::<u64>(), 0..50)) {
            let p = RingPacket::Token(Token { ring_id, token_seq, seq, aru, aru_id, fcc, rtr });
            let bytes = p.encode();
            prop_assert_eq!(decode(&bytes).unwrap(), p);
        }

        #[test]
        fn data_round_trips(ring_id in any::<u64>(), seq in any::<u64>(), sender in any::<u32>(), payload in prop::collection::vec(any::<u8>(), 0..300)) {
            let p = RingPacket::Data { ring_id, seq, sender, payload: &payload };
            let bytes = p.encode();
            prop_assert_eq!(decode(&bytes).unwrap(), p);
        }

        #[test]
        fn arbitrary_bytes_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 0..120), kind in 0u8..4) {
            if bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&[0x52, 0x47, 1, kind]);
            }
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn bad_headers_are_refused() {
        let good = RingPacket::Data {
            ring_id: 1,
            seq: 2,
            sender: 3,
            payload: b"x",
        }
        .encode();
        let mut bad = good.clone();
        bad[0] = 0;
        assert!(matches!(decode(&bad), Err(RingDecodeError::BadMagic(_))));
        let mut bad = good.clone();
        bad.push(0);
        assert_eq!(decode(&bad), Err(RingDecodeError::TrailingBytes(1)));
        assert_eq!(decode(&good[..10]), Err(RingDecodeError::Truncated));
    }
}
