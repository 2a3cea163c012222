//! The Hop link protocol's datagrams (P-Spread §3.2): what two neighbouring
//! gateways send each other over UDP. The paper gives the messages (PACKET,
//! NACK, and two both called ACK) but no layout; this is ours.
//!
//! A datagram is a 4-byte preamble, then one or more items back to back, so
//! control rides with data when both are due ("piggybacked on data when
//! possible", §3.1). All integers are big-endian.
//!
//! ```text
//!  preamble: magic u16 = "HP" (0x4850) | version u8 = 1 | link u8
//!  item:     tag u8, then
//!    1 DATA   seq u64 | len u16 | len bytes        a link packet
//!    2 ACK_S  seq u64                             sender: highest seq sent
//!    3 ACK_R  seq u64                             receiver: every seq <= this arrived
//!    4 NACK   count u16 | count × (first u64, last u64)   missing ranges
//! ```
//!
//! `link` tells apart several Hop links between the same pair of hosts (a
//! daemon may demultiplex by it); the magic differs from Shoal's packet
//! header ("SH"), so a socket carrying both tells them apart by the first
//! two bytes. Decoding never panics, checks every count against the bytes
//! present before allocating, and refuses the whole datagram at the first
//! irregularity.

use thiserror::Error;

/// First two bytes of a Hop datagram: ASCII "HP".
pub const HOP_MAGIC: u16 = 0x4850;
/// The Hop wire version this crate speaks.
pub const HOP_VERSION: u8 = 1;
/// Bytes before the first item.
pub const PREAMBLE_LEN: usize = 4;
/// Bytes a DATA item adds to its payload.
pub const DATA_OVERHEAD: usize = 11;
/// Bytes of an ACK_S or ACK_R item.
pub const ACK_LEN: usize = 9;
/// Bytes of a NACK item before its ranges, and per range.
pub const NACK_HEADER_LEN: usize = 3;
pub const NACK_RANGE_LEN: usize = 16;
/// Largest DATA payload (the length field is a u16).
pub const MAX_DATA_LEN: usize = u16::MAX as usize;

const DATA: u8 = 1;
const ACK_S: u8 = 2;
const ACK_R: u8 = 3;
const NACK: u8 = 4;

/// One item of a Hop datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item<'a> {
    /// A link packet: `seq` is the link sequence number, assigned by the
    /// sending end in the order packets reached it.
    Data { seq: u64, payload: &'a [u8] },
    /// The sender's highest sequence number sent (the paper's sender ACK,
    /// Fig. 3): the receiver learns of losses at the tail.
    AckSent { highest: u64 },
    /// The receiver's cumulative acknowledgement: every seq up to `upto`
    /// arrived, the sender may forget them.
    AckReceived { upto: u64 },
    /// Missing sequence numbers, as inclusive ranges (first <= last).
    Nack { ranges: Vec<(u64, u64)> },
}

impl Item<'_> {
    /// Bytes this item takes on the wire.
    pub fn encoded_len(&self) -> usize {
        match self {
            Item::Data { payload, .. } => DATA_OVERHEAD + payload.len(),
            Item::AckSent { .. } | Item::AckReceived { .. } => ACK_LEN,
            Item::Nack { ranges } => NACK_HEADER_LEN + NACK_RANGE_LEN * ranges.len(),
        }
    }
}

/// Why a Hop datagram was refused. Nothing of it is used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HopDecodeError {
    #[error("truncated: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    #[error("unsupported Hop version {0}")]
    UnsupportedVersion(u8),
    #[error("unknown item tag {0}")]
    UnknownTag(u8),
    #[error("NACK range {first}..={last} is reversed")]
    ReversedRange { first: u64, last: u64 },
    #[error("NACK count {count} does not fit in the {available} bytes left")]
    CountTooLarge { count: usize, available: usize },
    #[error("datagram has no items")]
    Empty,
}

/// Why items could not be encoded. Nothing was appended.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HopEncodeError {
    #[error("DATA payload of {len} bytes exceeds {MAX_DATA_LEN}")]
    PayloadTooLarge { len: usize },
    #[error("NACK of {count} ranges exceeds {max}", max = u16::MAX)]
    TooManyRanges { count: usize },
    #[error("NACK range {first}..={last} is reversed")]
    ReversedRange { first: u64, last: u64 },
}

/// Appends the preamble for `link` to `out`.
pub fn encode_preamble(link: u8, out: &mut Vec<u8>) {
    out.extend_from_slice(&HOP_MAGIC.to_be_bytes());
    out.push(HOP_VERSION);
    out.push(link);
}

/// Appends `item` to `out`; on error `out` is unchanged.
pub fn encode_item(item: &Item<'_>, out: &mut Vec<u8>) -> Result<(), HopEncodeError> {
    match item {
        Item::Data { seq, payload } => {
            let len = u16::try_from(payload.len())
                .map_err(|_| HopEncodeError::PayloadTooLarge { len: payload.len() })?;
            out.push(DATA);
            out.extend_from_slice(&seq.to_be_bytes());
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(payload);
        }
        Item::AckSent { highest } => {
            out.push(ACK_S);
            out.extend_from_slice(&highest.to_be_bytes());
        }
        Item::AckReceived { upto } => {
            out.push(ACK_R);
            out.extend_from_slice(&upto.to_be_bytes());
        }
        Item::Nack { ranges } => {
            let count = u16::try_from(ranges.len()).map_err(|_| HopEncodeError::TooManyRanges {
                count: ranges.len(),
            })?;
            if let Some(&(first, last)) = ranges.iter().find(|(f, l)| f > l) {
                return Err(HopEncodeError::ReversedRange { first, last });
            }
            out.push(NACK);
            out.extend_from_slice(&count.to_be_bytes());
            for (first, last) in ranges {
                out.extend_from_slice(&first.to_be_bytes());
                out.extend_from_slice(&last.to_be_bytes());
            }
        }
    }
    Ok(())
}

/// A whole datagram: `(link, items)`.
pub fn encode(link: u8, items: &[Item<'_>]) -> Result<Vec<u8>, HopEncodeError> {
    let mut out =
        Vec::with_capacity(PREAMBLE_LEN + items.iter().map(Item::encoded_len).sum::<usize>());
    encode_preamble(link, &mut out);
    for item in items {
        encode_item(item, &mut out)?;
    }
    Ok(out)
}

/// Decodes a whole datagram: its link byte and items (payloads borrow from
/// `datagram`).
pub fn decode(datagram: &[u8]) -> Result<(u8, Vec<Item<'_>>), HopDecodeError> {
    let mut r = Reader { bytes: datagram };
    let magic = u16::from_be_bytes(r.take()?);
    if magic != HOP_MAGIC {
        return Err(HopDecodeError::BadMagic(magic));
    }
    let [version, link] = r.take()?;
    if version != HOP_VERSION {
        return Err(HopDecodeError::UnsupportedVersion(version));
    }
    if r.bytes.is_empty() {
        return Err(HopDecodeError::Empty);
    }
    let mut items = Vec::new();
    while !r.bytes.is_empty() {
        items.push(r.item()?);
    }
    Ok((link, items))
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], HopDecodeError> {
        let (head, tail) =
            self.bytes
                .split_first_chunk::<N>()
                .ok_or(HopDecodeError::Truncated {
                    needed: N,
                    available: self.bytes.len(),
                })?;
        self.bytes = tail;
        Ok(*head)
    }

    fn u64(&mut self) -> Result<u64, HopDecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    fn u16(&mut self) -> Result<u16, HopDecodeError> {
        Ok(u16::from_be_bytes(self.take()?))
    }

    fn slice(&mut self, len: usize) -> Result<&'a [u8], HopDecodeError> {
        if len > self.bytes.len() {
            return Err(HopDecodeError::Truncated {
                needed: len,
                available: self.bytes.len(),
            });
        }
        let (head, tail) = self.bytes.split_at(len);
        self.bytes = tail;
        Ok(head)
    }

    fn item(&mut self) -> Result<Item<'a>, HopDecodeError> {
        let [tag] = self.take()?;
        match tag {
            DATA => {
                let seq = self.u64()?;
                let len = usize::from(self.u16()?);
                Ok(Item::Data {
                    seq,
                    payload: self.slice(len)?,
                })
            }
            ACK_S => Ok(Item::AckSent {
                highest: self.u64()?,
            }),
            ACK_R => Ok(Item::AckReceived { upto: self.u64()? }),
            NACK => {
                let count = usize::from(self.u16()?);
                if count.saturating_mul(NACK_RANGE_LEN) > self.bytes.len() {
                    return Err(HopDecodeError::CountTooLarge {
                        count,
                        available: self.bytes.len(),
                    });
                }
                let mut ranges = Vec::with_capacity(count);
                for _ in 0..count {
                    let (first, last) = (self.u64()?, self.u64()?);
                    if first > last {
                        return Err(HopDecodeError::ReversedRange { first, last });
                    }
                    ranges.push((first, last));
                }
                Ok(Item::Nack { ranges })
            }
            other => Err(HopDecodeError::UnknownTag(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Owned {
        Data(u64, Vec<u8>),
        AckSent(u64),
        AckReceived(u64),
        Nack(Vec<(u64, u64)>),
    }

    impl Owned {
        fn item(&self) -> Item<'_> {
            match self {
                Owned::Data(seq, p) => Item::Data {
                    seq: *seq,
                    payload: p,
                },
                Owned::AckSent(h) => Item::AckSent { highest: *h },
                Owned::AckReceived(u) => Item::AckReceived { upto: *u },
                Owned::Nack(r) => Item::Nack { ranges: r.clone() },
            }
        }
    }

    fn arb_item() -> impl Strategy<Value = Owned> {
        prop_oneof![
            (any::<u64>(), prop::collection::vec(any::<u8>(), 0..300))
                .prop_map(|(s, p)| Owned::Data(s, p)),
            any::<u64>().prop_map(Owned::AckSent),
            any::<u64>().prop_map(Owned::AckReceived),
            prop::collection::vec((any::<u64>(), 0u64..1000), 0..8).prop_map(|v| Owned::Nack(
                v.into_iter()
                    .map(|(f, n)| (f, f.saturating_add(n)))
                    .collect()
            )),
        ]
    }

    #[test]
    fn malformed_datagrams_are_refused() {
        let good = encode(3, &[Item::AckSent { highest: 9 }]).unwrap();
        assert_eq!(
            decode(&good).unwrap(),
            (3, vec![Item::AckSent { highest: 9 }])
        );
        let mut bad = good.clone();
        bad[0] = 0;
        assert!(matches!(decode(&bad), Err(HopDecodeError::BadMagic(_))));
        let mut bad = good.clone();
        bad[2] = 7;
        assert_eq!(decode(&bad), Err(HopDecodeError::UnsupportedVersion(7)));
        assert_eq!(decode(&good[..4]), Err(HopDecodeError::Empty));
        assert!(matches!(
            decode(&good[..8]),
            Err(HopDecodeError::Truncated { .. })
        ));
        let mut bad = good.clone();
        bad[4] = 99;
        assert_eq!(decode(&bad), Err(HopDecodeError::UnknownTag(99)));
        // A NACK claiming 1000 ranges in 16 bytes is refused before allocating.
        let mut nack = vec![0x48, 0x50, 1, 0, NACK];
        nack.extend_from_slice(&1000u16.to_be_bytes());
        nack.extend_from_slice(&[0; 16]);
        assert!(matches!(
            decode(&nack),
            Err(HopDecodeError::CountTooLarge { count: 1000, .. })
        ));
        let reversed = Item::Nack {
            ranges: vec![(5, 4)],
        };
        assert!(encode(0, &[reversed]).is_err());
        let mut raw = vec![0x48, 0x50, 1, 0, NACK, 0, 1];
        raw.extend_from_slice(&5u64.to_be_bytes());
        raw.extend_from_slice(&4u64.to_be_bytes());
        assert_eq!(
            decode(&raw),
            Err(HopDecodeError::ReversedRange { first: 5, last: 4 })
        );
    }

    proptest! {
        #[test]
        fn decode_inverts_encode(link in any::<u8>(), owned in prop::collection::vec(arb_item(), 1..6)) {
            let items: Vec<Item<'_>> = owned.iter().map(Owned::item).collect();
            let bytes = encode(link, &items).unwrap();
            prop_assert_eq!(bytes.len(), PREAMBLE_LEN + items.iter().map(Item::encoded_len).sum::<usize>());
            let (l, decoded) = decode(&bytes).unwrap();
            prop_assert_eq!(l, link);
            prop_assert_eq!(decoded, items);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(mut bytes in prop::collection::vec(any::<u8>(), 0..200), preamble in any::<bool>()) {
            if preamble && bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&[0x48, 0x50, 1, 0]);
            }
            let _ = decode(&bytes);
        }
    }
}
