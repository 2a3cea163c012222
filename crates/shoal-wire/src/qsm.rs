//! Bodies of the QSM packets (kinds 30-35; QuickSilver Scalable Multicast,
//! Ostrowski, Birman et al.): region data, the recovery token, the region
//! leader's ACK, a partition leader's NAK, repairs and pull requests.
//!
//! Every body starts with the `region u32` it belongs to; the fields after
//! it are listed on each [`Message`] variant, big-endian. A range list is
//! `count u16` then `first u64, last u64` per range. Decoding is strict: a
//! short body, a count larger than the bytes present, a reversed range or
//! bytes left over are refused with a [`DecodeError`], and nothing is
//! allocated from a count before it is checked against the bytes present.

use crate::{
    DecodeError, EncodeError, Kind, SeqRange, HEADER_LEN, MAGIC, MAX_BODY_LEN, RANGE_LEN, VERSION,
};

/// Bytes of a token's per-sender record before its lists.
const RECORD_FIXED: usize = 4 + 8 * 6 + 2 + 2;

/// One sender's part of a token: what the token gathered so far this round.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenRecord {
    pub source: u32,
    /// One past the highest sequence number any member visited has seen.
    pub max_seen: u64,
    /// Region ACK so far: min over the partitions closed this round of the
    /// first sequence number that partition does not hold stably.
    pub stable_next: u64,
    /// Min over the members visited of their contiguous prefix (receive
    /// garbage collection for the next round).
    pub min_contig: u64,
    /// From the last round: every member holds everything below it, so
    /// caching members may discard it.
    pub gc_next: u64,
    /// In the partition being visited: min over its members visited of the
    /// first sequence number of the partition's share they lack.
    pub part_stable: u64,
    /// In the partition being visited: sequence numbers every member visited
    /// lacks (the partition leader NAKs those of the partition's share).
    pub nak: Vec<SeqRange>,
    /// In the partition being visited: per member visited, what it lacks, so
    /// later members push it.
    pub wants: Vec<Want>,
}

/// A member's missing ranges carried in a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    pub member: u32,
    pub ranges: Vec<SeqRange>,
}

/// The recovery token of one region's round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub region: u32,
    /// The region view the round runs in; a member in another view drops it.
    pub view: u64,
    pub round: u64,
    /// Position in the round's route (`docs/qsm.md`).
    pub hop: u32,
    pub records: Vec<TokenRecord>,
}

/// A decoded QSM packet. Payloads borrow from the datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message<'a> {
    /// Kind 30: a message multicast to the region (first transmission, or a
    /// sender's retransmission of something the whole region missed).
    /// Body: `region u32, group u32, seq u64`, payload.
    Data {
        region: u32,
        group: u32,
        seq: u64,
        payload: &'a [u8],
    },
    /// Kind 31: the token. Body: `region u32, view u64, round u64, hop u32,
    /// count u16`, then per record `source u32, max_seen u64, stable_next
    /// u64, min_contig u64, gc_next u64, part_stable u64, reserved u64 (0)`,
    /// the `nak` range list, `count u16` wants each `member u32` and a range
    /// list.
    Token(Token),
    /// Kind 32: the region leader's ACK to a sender: every message below
    /// `next` is stable in the region (MaxContiguous + 1), and `seen` is one
    /// past the highest the region saw. Body: `region u32, next u64, seen u64`.
    Ack { region: u32, next: u64, seen: u64 },
    /// Kind 33: a partition leader's NAK to a sender: in `ranges`, the
    /// sequence numbers of partition `partition`'s share that no member of
    /// the partition holds. Body: `region u32, partition u32`, a range list.
    Nak {
        region: u32,
        partition: u32,
        ranges: Vec<SeqRange>,
    },
    /// Kind 34: a message sent by unicast to one member: a push, an answer
    /// to a pull, or a sender's retransmission on NAK. Body: `region u32,
    /// group u32, source u32, seq u64`, payload.
    Repair {
        region: u32,
        group: u32,
        source: u32,
        seq: u64,
        payload: &'a [u8],
    },
    /// Kind 35: asks a caching member for `source`'s messages in `ranges`
    /// it holds, sent at most `rate` per second (the asker's recovery
    /// budget, shared among the members it asks). Body: `region u32, source
    /// u32, rate u32`, a range list.
    Pull {
        region: u32,
        source: u32,
        rate: u32,
        ranges: Vec<SeqRange>,
    },
}

impl Message<'_> {
    pub fn kind(&self) -> Kind {
        match self {
            Message::Data { .. } => Kind::QsmData,
            Message::Token(_) => Kind::QsmToken,
            Message::Ack { .. } => Kind::QsmAck,
            Message::Nak { .. } => Kind::QsmNak,
            Message::Repair { .. } => Kind::QsmRepair,
            Message::Pull { .. } => Kind::QsmPull,
        }
    }

    /// Bytes of the body when encoded.
    pub fn body_len(&self) -> usize {
        let ranges = |r: &[SeqRange]| 2 + RANGE_LEN * r.len();
        match self {
            Message::Data { payload, .. } => 16 + payload.len(),
            Message::Token(t) => {
                26 + t
                    .records
                    .iter()
                    .map(|r| {
                        RECORD_FIXED - 2
                            + ranges(&r.nak)
                            + r.wants.iter().map(|w| 4 + ranges(&w.ranges)).sum::<usize>()
                    })
                    .sum::<usize>()
            }
            Message::Ack { .. } => 20,
            Message::Nak { ranges: r, .. } => 8 + ranges(r),
            Message::Repair { payload, .. } => 20 + payload.len(),
            Message::Pull { ranges: r, .. } => 12 + ranges(r),
        }
    }

    /// Appends the packet (header and body) to `out`.
    pub fn encode(&self, sender: u32, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let body_len = self.body_len();
        if body_len > MAX_BODY_LEN {
            return Err(EncodeError::TooLarge {
                len: body_len,
                max: MAX_BODY_LEN,
            });
        }
        out.reserve(HEADER_LEN + body_len);
        out.extend_from_slice(&MAGIC.to_be_bytes());
        out.push(VERSION);
        out.push(self.kind() as u8);
        out.extend_from_slice(&sender.to_be_bytes());
        out.extend_from_slice(&(body_len as u32).to_be_bytes());
        let start = out.len();
        match self {
            Message::Data {
                region,
                group,
                seq,
                payload,
            } => {
                put32(out, *region);
                put32(out, *group);
                put64(out, *seq);
                out.extend_from_slice(payload);
            }
            Message::Token(t) => encode_token(t, out)?,
            Message::Ack { region, next, seen } => {
                put32(out, *region);
                put64(out, *next);
                put64(out, *seen);
            }
            Message::Nak {
                region,
                partition,
                ranges,
            } => {
                put32(out, *region);
                put32(out, *partition);
                put_ranges(out, ranges)?;
            }
            Message::Repair {
                region,
                group,
                source,
                seq,
                payload,
            } => {
                put32(out, *region);
                put32(out, *group);
                put32(out, *source);
                put64(out, *seq);
                out.extend_from_slice(payload);
            }
            Message::Pull {
                region,
                source,
                rate,
                ranges,
            } => {
                put32(out, *region);
                put32(out, *source);
                put32(out, *rate);
                put_ranges(out, ranges)?;
            }
        }
        debug_assert_eq!(out.len() - start, body_len);
        Ok(())
    }

    /// Encodes into a fresh vector.
    pub fn to_vec(&self, sender: u32) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.body_len());
        self.encode(sender, &mut out)?;
        Ok(out)
    }
}

fn encode_token(t: &Token, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    put32(out, t.region);
    put64(out, t.view);
    put64(out, t.round);
    put32(out, t.hop);
    put16(out, t.records.len(), "token records")?;
    for r in &t.records {
        put32(out, r.source);
        for v in [
            r.max_seen,
            r.stable_next,
            r.min_contig,
            r.gc_next,
            r.part_stable,
            0,
        ] {
            put64(out, v);
        }
        put_ranges(out, &r.nak)?;
        put16(out, r.wants.len(), "wants")?;
        for w in &r.wants {
            put32(out, w.member);
            put_ranges(out, &w.ranges)?;
        }
    }
    Ok(())
}

fn put32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put16(out: &mut Vec<u8>, len: usize, what: &'static str) -> Result<(), EncodeError> {
    let n = u16::try_from(len).map_err(|_| EncodeError::TooMany {
        what,
        max: u16::MAX as usize,
    })?;
    out.extend_from_slice(&n.to_be_bytes());
    Ok(())
}

fn put_ranges(out: &mut Vec<u8>, ranges: &[SeqRange]) -> Result<(), EncodeError> {
    put16(out, ranges.len(), "ranges")?;
    for r in ranges {
        put64(out, r.first);
        put64(out, r.last);
    }
    Ok(())
}

/// Decodes the body of a QSM packet of `kind` (one of the `Qsm*` kinds).
pub fn decode(kind: Kind, body: &[u8]) -> Result<Message<'_>, DecodeError> {
    let mut r = Cursor { bytes: body };
    let message = match kind {
        Kind::QsmData => Message::Data {
            region: r.u32()?,
            group: r.u32()?,
            seq: r.u64()?,
            payload: std::mem::take(&mut r.bytes),
        },
        Kind::QsmToken => Message::Token(r.token()?),
        Kind::QsmAck => Message::Ack {
            region: r.u32()?,
            next: r.u64()?,
            seen: r.u64()?,
        },
        Kind::QsmNak => Message::Nak {
            region: r.u32()?,
            partition: r.u32()?,
            ranges: r.ranges()?,
        },
        Kind::QsmRepair => Message::Repair {
            region: r.u32()?,
            group: r.u32()?,
            source: r.u32()?,
            seq: r.u64()?,
            payload: std::mem::take(&mut r.bytes),
        },
        Kind::QsmPull => Message::Pull {
            region: r.u32()?,
            source: r.u32()?,
            rate: r.u32()?,
            ranges: r.ranges()?,
        },
        other => return Err(DecodeError::UnknownKind(other as u8)),
    };
    match r.bytes.len() {
        0 => Ok(message),
        extra => Err(DecodeError::TrailingBytes { kind, extra }),
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
}

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, tail) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(DecodeError::Truncated {
                needed: N,
                available: self.bytes.len(),
            })?;
        self.bytes = tail;
        Ok(*head)
    }

    fn u16(&mut self) -> Result<usize, DecodeError> {
        Ok(u16::from_be_bytes(self.take()?) as usize)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    fn check(&self, what: &'static str, count: usize, min: usize) -> Result<(), DecodeError> {
        if count.saturating_mul(min) > self.bytes.len() {
            return Err(DecodeError::CountTooLarge {
                what,
                count,
                available: self.bytes.len(),
            });
        }
        Ok(())
    }

    fn ranges(&mut self) -> Result<Vec<SeqRange>, DecodeError> {
        let count = self.u16()?;
        self.check("range", count, RANGE_LEN)?;
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let (first, last) = (self.u64()?, self.u64()?);
            out.push(SeqRange::new(first, last).ok_or(DecodeError::ReversedRange { first, last })?);
        }
        Ok(out)
    }

    fn token(&mut self) -> Result<Token, DecodeError> {
        let (region, view, round, hop) = (self.u32()?, self.u64()?, self.u64()?, self.u32()?);
        let count = self.u16()?;
        self.check("token record", count, RECORD_FIXED)?;
        let mut records = Vec::with_capacity(count);
        for _ in 0..count {
            let source = self.u32()?;
            let mut values = [0u64; 6];
            for v in &mut values {
                *v = self.u64()?;
            }
            let nak = self.ranges()?;
            let wants_count = self.u16()?;
            self.check("want", wants_count, 6)?;
            let mut wants = Vec::with_capacity(wants_count);
            for _ in 0..wants_count {
                wants.push(Want {
                    member: self.u32()?,
                    ranges: self.ranges()?,
                });
            }
            records.push(TokenRecord {
                source,
                max_seen: values[0],
                stable_next: values[1],
                min_contig: values[2],
                gc_next: values[3],
                part_stable: values[4],
                nak,
                wants,
            });
        }
        Ok(Token {
            region,
            view,
            round,
            hop,
            records,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::{packets, Packet};

    fn range() -> impl Strategy<Value = SeqRange> {
        (any::<u64>(), 0u64..1000).prop_map(|(a, len)| SeqRange {
            first: a.min(u64::MAX - len),
            last: a.min(u64::MAX - len) + len,
        })
    }

    fn ranges() -> impl Strategy<Value = Vec<SeqRange>> {
        prop::collection::vec(range(), 0..4)
    }

    fn record() -> impl Strategy<Value = TokenRecord> {
        (
            any::<u32>(),
            prop::array::uniform5(any::<u64>()),
            ranges(),
            prop::collection::vec((any::<u32>(), ranges()), 0..3),
        )
            .prop_map(|(source, v, nak, wants)| TokenRecord {
                source,
                max_seen: v[0],
                stable_next: v[1],
                min_contig: v[2],
                gc_next: v[3],
                part_stable: v[4],
                nak,
                wants: wants
                    .into_iter()
                    .map(|(member, ranges)| Want { member, ranges })
                    .collect(),
            })
    }

    fn owned_message() -> impl Strategy<Value = (u8, Vec<u8>, Token, [u64; 4], Vec<SeqRange>)> {
        (
            0u8..6,
            prop::collection::vec(any::<u8>(), 0..64),
            (
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u32>(),
                prop::collection::vec(record(), 0..3),
            )
                .prop_map(|(region, view, round, hop, records)| Token {
                    region,
                    view,
                    round,
                    hop,
                    records,
                }),
            prop::array::uniform4(any::<u64>()),
            ranges(),
        )
    }

    fn build<'a>(
        which: u8,
        payload: &'a [u8],
        token: &Token,
        v: [u64; 4],
        r: &[SeqRange],
    ) -> Message<'a> {
        let (a, b) = (v[0] as u32, v[1] as u32);
        match which {
            0 => Message::Data {
                region: a,
                group: b,
                seq: v[2],
                payload,
            },
            1 => Message::Token(token.clone()),
            2 => Message::Ack {
                region: a,
                next: v[2],
                seen: v[3],
            },
            3 => Message::Nak {
                region: a,
                partition: b,
                ranges: r.to_vec(),
            },
            4 => Message::Repair {
                region: a,
                group: b,
                source: v[3] as u32,
                seq: v[2],
                payload,
            },
            _ => Message::Pull {
                region: a,
                source: b,
                rate: v[3] as u32,
                ranges: r.to_vec(),
            },
        }
    }

    proptest! {
        #[test]
        fn round_trip((which, payload, token, v, r) in owned_message(), sender in any::<u32>()) {
            let message = build(which, &payload, &token, v, &r);
            let bytes = message.to_vec(sender).unwrap();
            let mut iter = packets(&bytes);
            let (header, packet) = iter.next().unwrap().unwrap();
            prop_assert!(iter.next().is_none());
            prop_assert_eq!(header.sender, sender);
            let Packet::Qsm { kind, body } = packet else { panic!("not qsm") };
            prop_assert_eq!(decode(kind, body).unwrap(), message);
        }

        #[test]
        fn never_panics(kind in 30u8..36, body in prop::collection::vec(any::<u8>(), 0..200)) {
            let kind = Kind::ALL.into_iter().find(|k| *k as u8 == kind).unwrap();
            let _ = decode(kind, &body);
        }

        #[test]
        fn truncation_is_refused((which, payload, token, v, r) in owned_message(), cut in 1usize..40) {
            let message = build(which, &payload, &token, v, &r);
            let bytes = message.to_vec(1).unwrap();
            let body = &bytes[HEADER_LEN..];
            // Payload-carrying messages end in an open payload: cutting it
            // changes the payload, not validity. Every other cut is refused.
            if !matches!(message, Message::Data { .. } | Message::Repair { .. }) && cut <= body.len() {
                prop_assert!(decode(message.kind(), &body[..body.len() - cut]).is_err());
            }
        }
    }

    #[test]
    fn counts_beyond_the_body_are_refused_before_allocating() {
        // A pull claiming 65,535 ranges in a 10-byte body.
        let mut body = vec![0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 9];
        body.extend_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(
            decode(Kind::QsmPull, &body),
            Err(DecodeError::CountTooLarge { .. })
        ));
    }
}
