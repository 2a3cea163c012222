//! The Ring protocol's datagrams (Totem-style single ring inside a site,
//! P-Spread §3; Totem's token, join and commit token): the token, unicast
//! to the next member; data messages, multicast to the site; join and
//! merge-detect messages, multicast while the ring's membership changes;
//! the commit token, unicast around the ring being formed. The layout is
//! ours.
//!
//! ```text
//!  preamble: magic u16 = "RG" (0x5247) | version u8 = 2 | type u8
//!  ring id:  seq u64 | rep u32                          (12 bytes)
//!  type 1 TOKEN:  ring_id | token_seq u64 | seq u64 | aru u64 |
//!                 aru_id u32 (u32::MAX: none) | fcc u32 |
//!                 retrans_id u32 (u32::MAX: none) | flags u8 (bit 0: installed) |
//!                 rtr_count u16 | rtr_count × seq u64
//!  type 2 DATA:   ring_id | seq u64 | sender u32 | flags u8 (bit 0: safe,
//!                 bit 1: recovered) | [recovered: old ring_id | old seq u64 |
//!                 old sender u32 | old flags u8] | len u32 | len bytes
//!  type 3 JOIN:   sender u32 | ring_seq u64 | procs u16 | procs × u32 |
//!                 fails u16 | fails × u32
//!  type 4 MERGE:  sender u32 | ring_id
//!  type 5 COMMIT: ring_id | count u16 | count × (member u32 | filled u8 |
//!                 old ring_id | old aru u64 | old high u64)
//!  type 6 HOLD_CANCEL: sender u32 | ring_id
//! ```
//!
//! Decoding never panics, checks counts against the bytes present before
//! allocating, refuses unknown flag bits and trailing bytes.

use thiserror::Error;

pub const RING_MAGIC: u16 = 0x5247;
pub const RING_VERSION: u8 = 2;
const TOKEN: u8 = 1;
const DATA: u8 = 2;
const JOIN: u8 = 3;
const MERGE: u8 = 4;
const COMMIT: u8 = 5;
const HOLD_CANCEL: u8 = 6;
/// `aru_id` or `retrans_id` when no member is named.
pub const NO_MEMBER: u32 = u32::MAX;
/// Token flag: the ring's recovery is over and it is installed.
pub const TOKEN_INSTALLED: u8 = 1;
const DATA_SAFE: u8 = 1;
const DATA_RECOVERED: u8 = 2;

/// A ring's identity: a sequence number above every ring any of its
/// members knew, and the representative (lowest member) that formed it,
/// so two rings formed at once in two partitions differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct RingId {
    pub seq: u64,
    pub rep: u32,
}

/// The token: whoever holds it may multicast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub ring_id: RingId,
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
    /// During recovery: a member that still has old-ring messages to
    /// resend ([`NO_MEMBER`] for none); only it clears the field.
    pub retrans_id: u32,
    /// [`TOKEN_INSTALLED`] once the ring's recovery is complete.
    pub flags: u8,
    /// Retransmission requests: sequence numbers some member lacks.
    pub rtr: Vec<u64>,
}

impl Token {
    pub fn installed(&self) -> bool {
        self.flags & TOKEN_INSTALLED != 0
    }
}

/// A message of an old ring carried again on a new ring during recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    pub ring_id: RingId,
    pub seq: u64,
    pub sender: u32,
    pub safe: bool,
}

/// A data message of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data<'a> {
    pub ring_id: RingId,
    pub seq: u64,
    pub sender: u32,
    /// Safe delivery: delivered once every member is known to hold it.
    pub safe: bool,
    /// Set on a recovery message: the old ring's message it carries.
    pub recovered: Option<Recovered>,
    pub payload: &'a [u8],
}

/// Totem's join message: the sender's view of who takes part in forming
/// the next ring (`procs`) and who it gave up on (`fails`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Join {
    pub sender: u32,
    /// The highest ring sequence number the sender has seen.
    pub ring_seq: u64,
    pub procs: Vec<u32>,
    pub fails: Vec<u32>,
}

/// One member's line in the commit token: where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitEntry {
    pub member: u32,
    pub filled: bool,
    /// The last ring this member installed.
    pub old_ring_id: RingId,
    /// Its aru on that ring.
    pub old_aru: u64,
    /// The highest sequence number it holds of that ring.
    pub old_high: u64,
}

/// Totem's commit token: circulated twice around the ring being formed,
/// first to collect each member's old-ring state, then to hand all of it
/// to every member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub ring_id: RingId,
    pub entries: Vec<CommitEntry>,
}

/// A datagram of the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingPacket<'a> {
    Token(Token),
    Data(Data<'a>),
    Join(Join),
    /// The ring's representative announcing its ring, so rings that can
    /// hear each other again merge.
    MergeDetect {
        sender: u32,
        ring_id: RingId,
    },
    Commit(Commit),
    /// A member of an idle ring has something to send: the representative,
    /// if it holds the token, passes it on now.
    HoldCancel {
        sender: u32,
        ring_id: RingId,
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
    #[error("unknown flags {0:#04x}")]
    UnknownFlags(u8),
    #[error("count {0} does not fit in the bytes left")]
    CountTooLarge(usize),
    #[error("{0} trailing bytes")]
    TrailingBytes(usize),
}

/// Lists longer than this are cut when encoded (rtr) or refused.
pub const MAX_LIST: usize = 8191;

/// Bytes a data datagram adds to its payload at most: the header, and
/// the old ring's message a recovery carries (58).
pub const DATA_OVERHEAD_MAX: usize = 2 + 1 + 1 + 12 + 8 + 4 + 1 + (12 + 8 + 4 + 1) + 4;

impl RingPacket<'_> {
    /// The datagram's bytes. The rtr list is cut to [`MAX_LIST`] entries
    /// (the rest stay requested next rotation); join lists and commit
    /// entries are cut too, which a ring of that size never reaches.
    pub fn encode(&self) -> Vec<u8> {
        // Sized once: a data message is the payload and its header.
        let capacity = match self {
            RingPacket::Data(d) => DATA_OVERHEAD_MAX + d.payload.len(),
            RingPacket::Token(t) => 64 + 8 * t.rtr.len().min(MAX_LIST),
            _ => 64,
        };
        let mut out = Vec::with_capacity(capacity);
        out.extend_from_slice(&RING_MAGIC.to_be_bytes());
        out.push(RING_VERSION);
        match self {
            RingPacket::Token(t) => {
                out.push(TOKEN);
                put_ring_id(&mut out, t.ring_id);
                for v in [t.token_seq, t.seq, t.aru] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                for v in [t.aru_id, t.fcc, t.retrans_id] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                out.push(t.flags & TOKEN_INSTALLED);
                let rtr = &t.rtr[..t.rtr.len().min(MAX_LIST)];
                out.extend_from_slice(&(rtr.len() as u16).to_be_bytes());
                for s in rtr {
                    out.extend_from_slice(&s.to_be_bytes());
                }
            }
            RingPacket::Data(d) => {
                out.push(DATA);
                put_ring_id(&mut out, d.ring_id);
                out.extend_from_slice(&d.seq.to_be_bytes());
                out.extend_from_slice(&d.sender.to_be_bytes());
                let mut flags = if d.safe { DATA_SAFE } else { 0 };
                if d.recovered.is_some() {
                    flags |= DATA_RECOVERED;
                }
                out.push(flags);
                if let Some(r) = d.recovered {
                    put_ring_id(&mut out, r.ring_id);
                    out.extend_from_slice(&r.seq.to_be_bytes());
                    out.extend_from_slice(&r.sender.to_be_bytes());
                    out.push(if r.safe { DATA_SAFE } else { 0 });
                }
                out.extend_from_slice(&(d.payload.len() as u32).to_be_bytes());
                out.extend_from_slice(d.payload);
            }
            RingPacket::Join(j) => {
                out.push(JOIN);
                out.extend_from_slice(&j.sender.to_be_bytes());
                out.extend_from_slice(&j.ring_seq.to_be_bytes());
                for list in [&j.procs, &j.fails] {
                    let list = &list[..list.len().min(MAX_LIST)];
                    out.extend_from_slice(&(list.len() as u16).to_be_bytes());
                    for m in list {
                        out.extend_from_slice(&m.to_be_bytes());
                    }
                }
            }
            RingPacket::MergeDetect { sender, ring_id } => {
                out.push(MERGE);
                out.extend_from_slice(&sender.to_be_bytes());
                put_ring_id(&mut out, *ring_id);
            }
            RingPacket::HoldCancel { sender, ring_id } => {
                out.push(HOLD_CANCEL);
                out.extend_from_slice(&sender.to_be_bytes());
                put_ring_id(&mut out, *ring_id);
            }
            RingPacket::Commit(c) => {
                out.push(COMMIT);
                put_ring_id(&mut out, c.ring_id);
                let entries = &c.entries[..c.entries.len().min(MAX_LIST)];
                out.extend_from_slice(&(entries.len() as u16).to_be_bytes());
                for e in entries {
                    out.extend_from_slice(&e.member.to_be_bytes());
                    out.push(u8::from(e.filled));
                    put_ring_id(&mut out, e.old_ring_id);
                    out.extend_from_slice(&e.old_aru.to_be_bytes());
                    out.extend_from_slice(&e.old_high.to_be_bytes());
                }
            }
        }
        out
    }
}

fn put_ring_id(out: &mut Vec<u8>, id: RingId) {
    out.extend_from_slice(&id.seq.to_be_bytes());
    out.extend_from_slice(&id.rep.to_be_bytes());
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
        TOKEN => RingPacket::Token(decode_token(&mut r)?),
        DATA => RingPacket::Data(decode_data(&mut r)?),
        JOIN => {
            let sender = r.u32()?;
            let ring_seq = r.u64()?;
            let procs = r.u32_list()?;
            let fails = r.u32_list()?;
            RingPacket::Join(Join {
                sender,
                ring_seq,
                procs,
                fails,
            })
        }
        MERGE => RingPacket::MergeDetect {
            sender: r.u32()?,
            ring_id: r.ring_id()?,
        },
        COMMIT => RingPacket::Commit(decode_commit(&mut r)?),
        HOLD_CANCEL => RingPacket::HoldCancel {
            sender: r.u32()?,
            ring_id: r.ring_id()?,
        },
        other => return Err(RingDecodeError::UnknownType(other)),
    };
    match r.0.len() {
        0 => Ok(packet),
        n => Err(RingDecodeError::TrailingBytes(n)),
    }
}

fn decode_token(r: &mut Reader<'_>) -> Result<Token, RingDecodeError> {
    let ring_id = r.ring_id()?;
    let token_seq = r.u64()?;
    let seq = r.u64()?;
    let aru = r.u64()?;
    let aru_id = r.u32()?;
    let fcc = r.u32()?;
    let retrans_id = r.u32()?;
    let [flags] = r.take()?;
    if flags & !TOKEN_INSTALLED != 0 {
        return Err(RingDecodeError::UnknownFlags(flags));
    }
    let count = usize::from(u16::from_be_bytes(r.take()?));
    if count > MAX_LIST || count.saturating_mul(8) > r.0.len() {
        return Err(RingDecodeError::CountTooLarge(count));
    }
    let mut rtr = Vec::with_capacity(count);
    for _ in 0..count {
        rtr.push(r.u64()?);
    }
    Ok(Token {
        ring_id,
        token_seq,
        seq,
        aru,
        aru_id,
        fcc,
        retrans_id,
        flags,
        rtr,
    })
}

fn decode_data<'a>(r: &mut Reader<'a>) -> Result<Data<'a>, RingDecodeError> {
    let ring_id = r.ring_id()?;
    let seq = r.u64()?;
    let sender = r.u32()?;
    let [flags] = r.take()?;
    if flags & !(DATA_SAFE | DATA_RECOVERED) != 0 {
        return Err(RingDecodeError::UnknownFlags(flags));
    }
    let recovered = if flags & DATA_RECOVERED != 0 {
        let ring_id = r.ring_id()?;
        let seq = r.u64()?;
        let sender = r.u32()?;
        let [old_flags] = r.take()?;
        if old_flags & !DATA_SAFE != 0 {
            return Err(RingDecodeError::UnknownFlags(old_flags));
        }
        Some(Recovered {
            ring_id,
            seq,
            sender,
            safe: old_flags & DATA_SAFE != 0,
        })
    } else {
        None
    };
    let len = r.u32()? as usize;
    if len > r.0.len() {
        return Err(RingDecodeError::Truncated);
    }
    let (payload, rest) = r.0.split_at(len);
    r.0 = rest;
    Ok(Data {
        ring_id,
        seq,
        sender,
        safe: flags & DATA_SAFE != 0,
        recovered,
        payload,
    })
}

fn decode_commit(r: &mut Reader<'_>) -> Result<Commit, RingDecodeError> {
    const ENTRY: usize = 4 + 1 + 12 + 8 + 8;
    let ring_id = r.ring_id()?;
    let count = usize::from(u16::from_be_bytes(r.take()?));
    if count > MAX_LIST || count.saturating_mul(ENTRY) > r.0.len() {
        return Err(RingDecodeError::CountTooLarge(count));
    }
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        let member = r.u32()?;
        let [filled] = r.take()?;
        if filled > 1 {
            return Err(RingDecodeError::UnknownFlags(filled));
        }
        entries.push(CommitEntry {
            member,
            filled: filled == 1,
            old_ring_id: r.ring_id()?,
            old_aru: r.u64()?,
            old_high: r.u64()?,
        });
    }
    Ok(Commit { ring_id, entries })
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

    fn u32(&mut self) -> Result<u32, RingDecodeError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    fn ring_id(&mut self) -> Result<RingId, RingDecodeError> {
        Ok(RingId {
            seq: self.u64()?,
            rep: self.u32()?,
        })
    }

    fn u32_list(&mut self) -> Result<Vec<u32>, RingDecodeError> {
        let count = usize::from(u16::from_be_bytes(self.take()?));
        if count > MAX_LIST || count.saturating_mul(4) > self.0.len() {
            return Err(RingDecodeError::CountTooLarge(count));
        }
        (0..count).map(|_| self.u32()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ring_id() -> impl Strategy<Value = RingId> {
        (any::<u64>(), any::<u32>()).prop_map(|(seq, rep)| RingId { seq, rep })
    }

    fn recovered() -> impl Strategy<Value = Option<Recovered>> {
        prop::option::of(
            (ring_id(), any::<u64>(), any::<u32>(), any::<bool>()).prop_map(
                |(ring_id, seq, sender, safe)| Recovered {
                    ring_id,
                    seq,
                    sender,
                    safe,
                },
            ),
        )
    }

    #[test]
    fn a_recovered_data_datagram_adds_data_overhead_max() {
        let payload = [7u8; 1000];
        let data = |recovered| {
            RingPacket::Data(Data {
                ring_id: RingId { seq: 1, rep: 2 },
                seq: 3,
                sender: 4,
                safe: true,
                recovered,
                payload: &payload,
            })
            .encode()
            .len()
        };
        let r = Recovered {
            ring_id: RingId { seq: 5, rep: 6 },
            seq: 7,
            sender: 8,
            safe: true,
        };
        assert_eq!(data(Some(r)), payload.len() + DATA_OVERHEAD_MAX);
        assert!(data(None) < payload.len() + DATA_OVERHEAD_MAX);
    }

    proptest! {
        #[test]
        fn tokens_round_trip(ring_id in ring_id(), token_seq in any::<u64>(), seq in any::<u64>(), aru in any::<u64>(), aru_id in any::<u32>(), fcc in any::<u32>(), retrans_id in any::<u32>(), installed in any::<bool>(), rtr in prop::collection::vec(any::<u64>(), 0..50)) {
            let flags = if installed { TOKEN_INSTALLED } else { 0 };
            let p = RingPacket::Token(Token { ring_id, token_seq, seq, aru, aru_id, fcc, retrans_id, flags, rtr });
            let bytes = p.encode();
            prop_assert_eq!(decode(&bytes).unwrap(), p);
        }

        #[test]
        fn data_round_trips(ring_id in ring_id(), seq in any::<u64>(), sender in any::<u32>(), safe in any::<bool>(), recovered in recovered(), payload in prop::collection::vec(any::<u8>(), 0..300)) {
            let p = RingPacket::Data(Data { ring_id, seq, sender, safe, recovered, payload: &payload });
            let bytes = p.encode();
            prop_assert_eq!(decode(&bytes).unwrap(), p);
        }

        #[test]
        fn joins_and_merges_round_trip(sender in any::<u32>(), ring_seq in any::<u64>(), procs in prop::collection::vec(any::<u32>(), 0..40), fails in prop::collection::vec(any::<u32>(), 0..40), id in ring_id()) {
            let p = RingPacket::Join(Join { sender, ring_seq, procs, fails });
            let bytes = p.encode();
            prop_assert_eq!(decode(&bytes).unwrap(), p);
            let p = RingPacket::MergeDetect { sender, ring_id: id };
            let bytes = p.encode();
            prop_assert_eq!(decode(&bytes).unwrap(), p);
            let p = RingPacket::HoldCancel { sender, ring_id: id };
            let bytes = p.encode();
            prop_assert_eq!(decode(&bytes).unwrap(), p);
        }

        #[test]
        fn commits_round_trip(id in ring_id(), entries in prop::collection::vec((any::<u32>(), any::<bool>(), ring_id(), any::<u64>(), any::<u64>()), 0..20)) {
            let entries = entries.into_iter().map(|(member, filled, old_ring_id, old_aru, old_high)| CommitEntry { member, filled, old_ring_id, old_aru, old_high }).collect();
            let p = RingPacket::Commit(Commit { ring_id: id, entries });
            let bytes = p.encode();
            prop_assert_eq!(decode(&bytes).unwrap(), p);
        }

        #[test]
        fn arbitrary_bytes_never_panic(mut bytes in prop::collection::vec(any::<u8>(), 0..160), kind in 0u8..8) {
            if bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&[0x52, 0x47, RING_VERSION, kind]);
            }
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn bad_headers_and_flags_are_refused() {
        let good = RingPacket::Data(Data {
            ring_id: RingId { seq: 1, rep: 0 },
            seq: 2,
            sender: 3,
            safe: false,
            recovered: None,
            payload: b"x",
        })
        .encode();
        let mut bad = good.clone();
        bad[0] = 0;
        assert!(matches!(decode(&bad), Err(RingDecodeError::BadMagic(_))));
        let mut bad = good.clone();
        bad.push(0);
        assert_eq!(decode(&bad), Err(RingDecodeError::TrailingBytes(1)));
        assert_eq!(decode(&good[..10]), Err(RingDecodeError::Truncated));
        let mut bad = good.clone();
        bad[4 + 12 + 8 + 4] = 0x80;
        assert_eq!(decode(&bad), Err(RingDecodeError::UnknownFlags(0x80)));
    }
}
