//! Shoal's wire format: versioned packet headers and the Bimodal Multicast
//! (pbcast) packets, with strict, panic-free decoding.
//!
//! A UDP datagram carries one or more *packets* back to back ("pack and batch",
//! DESIGN.md). Every packet starts with a fixed 12-byte header:
//!
//! ```text
//!  0      2   3   4          8          12
//!  +------+---+---+----------+----------+---------------
//!  |magic |ver|knd|  sender  |  length  |  body (length bytes)
//!  +------+---+---+----------+----------+---------------
//! ```
//!
//! All integers are big-endian. `length` counts the body only. The body layouts
//! are given on each [`Packet`] variant and in `docs/wire-format.md`.
//!
//! Decoding never panics and never allocates from a length field it has not
//! checked against the bytes actually present: a count is multiplied by the
//! size of its smallest element and compared with what remains before any
//! vector is reserved. Malformed, truncated or oversized input yields a
//! [`DecodeError`].

use thiserror::Error;

pub mod client;
pub mod fragment;
pub mod groups;
pub mod hop;
pub mod qsm;
pub mod ring;
pub mod vsync;

/// First two bytes of every packet: ASCII "SH".
pub const MAGIC: u16 = 0x5348;
/// The wire version this crate speaks. A packet with another version is refused.
pub const VERSION: u8 = 1;
/// Bytes in a packet header.
pub const HEADER_LEN: usize = 12;
/// Largest body a packet may declare: the largest UDP payload over IPv4.
pub const MAX_BODY_LEN: usize = 65_507 - HEADER_LEN;
/// Bytes one [`SeqRange`] takes on the wire.
pub const RANGE_LEN: usize = 16;

/// Packet kinds, as carried in the header's `kind` byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Data = 1,
    Gossip = 2,
    Solicit = 3,
    Retransmit = 4,
    Status = 5,
    Session = 6,
    Heartbeat = 7,
    Vsync = 8,
    Presence = 9,
    Relay = 10,
    Push = 11,
    /// QSM's packets ([`qsm`]): region data, token, ACK, NAK, repair, pull.
    QsmData = 30,
    QsmToken = 31,
    QsmAck = 32,
    QsmNak = 33,
    QsmRepair = 34,
    QsmPull = 35,
}

/// Number of packet kinds, for per-kind counter arrays.
pub const KIND_COUNT: usize = 17;

impl Kind {
    pub const ALL: [Kind; KIND_COUNT] = [
        Kind::Data,
        Kind::Gossip,
        Kind::Solicit,
        Kind::Retransmit,
        Kind::Status,
        Kind::Session,
        Kind::Heartbeat,
        Kind::Vsync,
        Kind::Presence,
        Kind::Relay,
        Kind::Push,
        Kind::QsmData,
        Kind::QsmToken,
        Kind::QsmAck,
        Kind::QsmNak,
        Kind::QsmRepair,
        Kind::QsmPull,
    ];

    fn from_byte(byte: u8) -> Result<Kind, DecodeError> {
        Kind::ALL
            .into_iter()
            .find(|kind| *kind as u8 == byte)
            .ok_or(DecodeError::UnknownKind(byte))
    }

    /// A short lower-case name, used in metrics and CSV headers.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Data => "data",
            Kind::Gossip => "gossip",
            Kind::Solicit => "solicit",
            Kind::Retransmit => "retransmit",
            Kind::Status => "status",
            Kind::Session => "session",
            Kind::Heartbeat => "heartbeat",
            Kind::Vsync => "vsync",
            Kind::Presence => "presence",
            Kind::Relay => "relay",
            Kind::Push => "push",
            Kind::QsmData => "qsm_data",
            Kind::QsmToken => "qsm_token",
            Kind::QsmAck => "qsm_ack",
            Kind::QsmNak => "qsm_nak",
            Kind::QsmRepair => "qsm_repair",
            Kind::QsmPull => "qsm_pull",
        }
    }

    /// Position in [`Kind::ALL`], for per-kind counter arrays.
    pub fn index(self) -> usize {
        match self as usize {
            // QSM's kinds follow the first eleven.
            k @ 30..=39 => k - 30 + 11,
            k => k - 1,
        }
    }
}

/// Why a datagram was refused. Decoding stops at the first bad packet; packets
/// before it in the same datagram were valid.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("truncated: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    #[error("unsupported wire version {0}")]
    UnsupportedVersion(u8),
    #[error("unknown packet kind {0}")]
    UnknownKind(u8),
    #[error("declared body length {declared} exceeds the maximum {max}")]
    Oversized { declared: usize, max: usize },
    #[error("sequence range {first}..={last} is reversed")]
    ReversedRange { first: u64, last: u64 },
    #[error("{what} count {count} does not fit in the {available} bytes left")]
    CountTooLarge {
        what: &'static str,
        count: usize,
        available: usize,
    },
    #[error("{extra} unexpected bytes after the {kind:?} body")]
    TrailingBytes { kind: Kind, extra: usize },
    #[error("empty datagram")]
    Empty,
    #[error("flag byte {0} is neither 0 nor 1")]
    BadFlag(u8),
}

/// Why a packet could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EncodeError {
    #[error("body of {len} bytes exceeds the maximum {max}")]
    TooLarge { len: usize, max: usize },
    #[error("more than {max} {what}")]
    TooMany { what: &'static str, max: usize },
}

/// An inclusive range of sequence numbers, `first <= last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqRange {
    pub first: u64,
    pub last: u64,
}

impl SeqRange {
    /// `None` when `first > last`.
    pub fn new(first: u64, last: u64) -> Option<SeqRange> {
        (first <= last).then_some(SeqRange { first, last })
    }

    pub fn single(seq: u64) -> SeqRange {
        SeqRange {
            first: seq,
            last: seq,
        }
    }

    pub fn contains(&self, seq: u64) -> bool {
        self.first <= seq && seq <= self.last
    }

    /// Number of sequence numbers in the range (saturating at `u64::MAX`).
    pub fn len(&self) -> u64 {
        (self.last - self.first).saturating_add(1)
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// One source's part of a digest or a solicitation: ranges of its sequence
/// numbers, ascending and disjoint when built by Shoal (decoding checks each
/// range only, so a receiver must not rely on order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRanges {
    pub source: u32,
    pub ranges: Vec<SeqRange>,
}

/// A decoded packet. Payloads borrow from the datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet<'a> {
    /// A new message, first phase of pbcast. Body: `seq u64`, payload.
    Data { seq: u64, payload: &'a [u8] },
    /// A digest of the sender's message buffer (pbcast's gossip), the
    /// messages it knows were recently retransmitted by unicast (the "repair
    /// bits" of pbcast-grb, P001 §B; empty otherwise), and, per source, the
    /// runs of messages it knows exist and lacks at the ends of its buffer
    /// (a gap between held messages shows in the digest itself; one below
    /// the lowest or above the highest would not, so a member that missed
    /// the start or the end of a burst could only pull). Body: `digest` and
    /// `repaired`, each `count u16`, then per source `source u32, nranges
    /// u16, ranges`; then `lacking` the same way, left out when empty (so a
    /// gossip without it is two lists); then `awaited` the same way, left
    /// out when empty (`lacking` is then written, empty or not): missing
    /// messages whose push the sender invited recently, so a receiver
    /// should not push them again yet (a push may be on its way).
    Gossip {
        digest: Vec<SourceRanges>,
        repaired: Vec<SourceRanges>,
        lacking: Vec<SourceRanges>,
        awaited: Vec<SourceRanges>,
    },
    /// Ranges the sender lacks and asks the receiver to retransmit:
    /// `wanted` asked for the first time, `again` asked for before (the
    /// sender's retry after `solicit_retry`). A retransmitter counts only
    /// `wanted` as evidence that one more member misses a message
    /// (pbcast-IPMC's threshold, pbcast-grb's rule, P001 §B); SRM leaves
    /// `again` empty. Body: `wanted` laid out as a gossip digest, then
    /// `again` the same way, left out when empty (so a solicitation with
    /// no repeats, and every SRM request, is one list).
    Solicit {
        wanted: Vec<SourceRanges>,
        again: Vec<SourceRanges>,
    },
    /// A buffered message sent again by a member other than (or equal to) its
    /// source. Body: `source u32, seq u64`, payload.
    Retransmit {
        source: u32,
        seq: u64,
        payload: &'a [u8],
    },
    /// Flow-control feedback to a source: every message of `source` below
    /// `next` has been received. Body: `source u32, next u64`.
    Status { source: u32, next: u64 },
    /// SRM's periodic session message (Floyd et al.; P001 §B): the highest
    /// sequence number the sender has seen per source, and timestamps for
    /// the distance estimate. Body: `sent_ns u64`, `count u16` then per source
    /// `source u32, highest u64`, `count u16` then per peer
    /// `peer u32, echoed_ns u64, held_ns u64`.
    Session(Session),
    /// Gossip-style failure detection (van Renesse, Minsky, Hayden): heartbeat
    /// counters the sender knows. Body: `count u16`, then per member
    /// `member u32, incarnation u32, heartbeat u64`.
    Heartbeat { entries: Vec<HeartbeatEntry> },
    /// Virtual synchrony and membership control (P000 §5.2): the body is
    /// decoded by [`vsync::decode`], kept opaque here so the layers stay apart.
    Vsync { body: &'a [u8] },
    /// A daemon's presence (`shoal_core::daemon::membership`): a daemon looking for its
    /// cluster announces itself with `member: false`; a member answers with
    /// `member: true` and its view id, so the joiner knows a group exists and
    /// whom to ask. Members also probe daemons outside their view with it,
    /// so that two groups formed apart merge: `size` is the sender's view's
    /// member count and `lowest` the lowest slot in it (both 0 from a
    /// joiner). Body: `member u8` (0 or 1), `view u64`, `size u32`,
    /// `lowest u32`.
    Presence {
        member: bool,
        view: u64,
        size: u32,
        lowest: u32,
    },
    /// A new message passed on by a member of the source's relay tree
    /// (pbcast's first phase without IP multicast; P000 §3 footnote ‖: "a
    /// very lightweight unicast-based tree"). The receiver passes it on to
    /// its own children. Body: `source u32, seq u64`, payload (as
    /// `Retransmit`).
    Relay {
        source: u32,
        seq: u64,
        payload: &'a [u8],
    },
    /// A buffered message sent unasked to a member whose digest showed it
    /// lacks it (pbcast's push, P000 §3), as opposed to a `Retransmit`,
    /// which answers a solicitation (by unicast, or by multicast in
    /// pbcast-IPMC and pbcast-grb). The receiver can then time a push from
    /// the digest that drew it without mistaking another member's
    /// multicast repair for it. Body: as `Retransmit`.
    Push {
        source: u32,
        seq: u64,
        payload: &'a [u8],
    },
    /// A QSM packet (one of the `Qsm*` kinds): the body is decoded by
    /// [`qsm::decode`], kept opaque here so the layers stay apart.
    Qsm { kind: Kind, body: &'a [u8] },
}

/// One member's heartbeat in a [`Packet::Heartbeat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatEntry {
    pub member: u32,
    /// Bumped when the member restarts, so its counter may start over.
    pub incarnation: u32,
    pub heartbeat: u64,
}

/// Bytes one [`HeartbeatEntry`] takes on the wire.
pub const HEARTBEAT_ENTRY_LEN: usize = 16;

/// Body of a [`Packet::Session`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The sender's clock when it built the message.
    pub sent_ns: u64,
    /// Highest sequence number seen, per source.
    pub highest: Vec<(u32, u64)>,
    /// Per peer: the `sent_ns` of the last session heard from it, and how
    /// long ago (on the sender's clock) that was. The peer computes its
    /// round-trip time from these without synchronised clocks.
    pub echoes: Vec<Echo>,
}

/// One timestamp echo in a [`Session`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Echo {
    pub peer: u32,
    pub echoed_ns: u64,
    pub held_ns: u64,
}

impl Packet<'_> {
    pub fn kind(&self) -> Kind {
        match self {
            Packet::Data { .. } => Kind::Data,
            Packet::Gossip { .. } => Kind::Gossip,
            Packet::Solicit { .. } => Kind::Solicit,
            Packet::Retransmit { .. } => Kind::Retransmit,
            Packet::Push { .. } => Kind::Push,
            Packet::Status { .. } => Kind::Status,
            Packet::Session(_) => Kind::Session,
            Packet::Heartbeat { .. } => Kind::Heartbeat,
            Packet::Vsync { .. } => Kind::Vsync,
            Packet::Presence { .. } => Kind::Presence,
            Packet::Relay { .. } => Kind::Relay,
            Packet::Qsm { kind, .. } => *kind,
        }
    }

    /// Bytes of the body when encoded.
    pub fn body_len(&self) -> usize {
        match self {
            Packet::Data { payload, .. } => 8 + payload.len(),
            Packet::Gossip {
                digest,
                repaired,
                lacking,
                awaited,
            } => {
                let tail = match (lacking.is_empty(), awaited.is_empty()) {
                    (true, true) => 0,
                    (_, true) => ranges_list_len(lacking),
                    _ => ranges_list_len(lacking) + ranges_list_len(awaited),
                };
                ranges_list_len(digest) + ranges_list_len(repaired) + tail
            }
            Packet::Solicit { wanted, again } if again.is_empty() => ranges_list_len(wanted),
            Packet::Solicit { wanted, again } => ranges_list_len(wanted) + ranges_list_len(again),
            Packet::Retransmit { payload, .. }
            | Packet::Relay { payload, .. }
            | Packet::Push { payload, .. } => 12 + payload.len(),
            Packet::Status { .. } => 12,
            Packet::Session(s) => 8 + 2 + 12 * s.highest.len() + 2 + 20 * s.echoes.len(),
            Packet::Heartbeat { entries } => 2 + HEARTBEAT_ENTRY_LEN * entries.len(),
            Packet::Vsync { body } => body.len(),
            Packet::Presence { .. } => 17,
            Packet::Qsm { body, .. } => body.len(),
        }
    }

    /// Bytes of header and body when encoded.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.body_len()
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
        match self {
            Packet::Data { seq, payload } => {
                out.extend_from_slice(&seq.to_be_bytes());
                out.extend_from_slice(payload);
            }
            Packet::Gossip {
                digest,
                repaired,
                lacking,
                awaited,
            } => {
                encode_ranges_list(digest, out)?;
                encode_ranges_list(repaired, out)?;
                if !lacking.is_empty() || !awaited.is_empty() {
                    encode_ranges_list(lacking, out)?;
                }
                if !awaited.is_empty() {
                    encode_ranges_list(awaited, out)?;
                }
            }
            Packet::Solicit { wanted, again } => {
                encode_ranges_list(wanted, out)?;
                if !again.is_empty() {
                    encode_ranges_list(again, out)?;
                }
            }
            Packet::Retransmit {
                source,
                seq,
                payload,
            }
            | Packet::Relay {
                source,
                seq,
                payload,
            }
            | Packet::Push {
                source,
                seq,
                payload,
            } => {
                out.extend_from_slice(&source.to_be_bytes());
                out.extend_from_slice(&seq.to_be_bytes());
                out.extend_from_slice(payload);
            }
            Packet::Status { source, next } => {
                out.extend_from_slice(&source.to_be_bytes());
                out.extend_from_slice(&next.to_be_bytes());
            }
            Packet::Session(session) => encode_session(session, out)?,
            Packet::Heartbeat { entries } => {
                out.extend_from_slice(&count_u16(entries.len(), "entries")?);
                for entry in entries {
                    out.extend_from_slice(&entry.member.to_be_bytes());
                    out.extend_from_slice(&entry.incarnation.to_be_bytes());
                    out.extend_from_slice(&entry.heartbeat.to_be_bytes());
                }
            }
            Packet::Vsync { body } | Packet::Qsm { body, .. } => out.extend_from_slice(body),
            Packet::Presence {
                member,
                view,
                size,
                lowest,
            } => {
                out.push(u8::from(*member));
                out.extend_from_slice(&view.to_be_bytes());
                out.extend_from_slice(&size.to_be_bytes());
                out.extend_from_slice(&lowest.to_be_bytes());
            }
        }
        Ok(())
    }

    /// Encodes into a fresh vector.
    pub fn to_vec(&self, sender: u32) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode(sender, &mut out)?;
        Ok(out)
    }
}

fn ranges_list_len(list: &[SourceRanges]) -> usize {
    2 + list
        .iter()
        .map(|s| 6 + RANGE_LEN * s.ranges.len())
        .sum::<usize>()
}

fn encode_ranges_list(list: &[SourceRanges], out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let count = u16::try_from(list.len()).map_err(|_| EncodeError::TooMany {
        what: "sources",
        max: u16::MAX as usize,
    })?;
    out.extend_from_slice(&count.to_be_bytes());
    for entry in list {
        let nranges = u16::try_from(entry.ranges.len()).map_err(|_| EncodeError::TooMany {
            what: "ranges",
            max: u16::MAX as usize,
        })?;
        out.extend_from_slice(&entry.source.to_be_bytes());
        out.extend_from_slice(&nranges.to_be_bytes());
        for range in &entry.ranges {
            out.extend_from_slice(&range.first.to_be_bytes());
            out.extend_from_slice(&range.last.to_be_bytes());
        }
    }
    Ok(())
}

fn count_u16(len: usize, what: &'static str) -> Result<[u8; 2], EncodeError> {
    u16::try_from(len)
        .map(u16::to_be_bytes)
        .map_err(|_| EncodeError::TooMany {
            what,
            max: u16::MAX as usize,
        })
}

fn encode_session(session: &Session, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    out.extend_from_slice(&session.sent_ns.to_be_bytes());
    out.extend_from_slice(&count_u16(session.highest.len(), "sources")?);
    for (source, highest) in &session.highest {
        out.extend_from_slice(&source.to_be_bytes());
        out.extend_from_slice(&highest.to_be_bytes());
    }
    out.extend_from_slice(&count_u16(session.echoes.len(), "echoes")?);
    for echo in &session.echoes {
        out.extend_from_slice(&echo.peer.to_be_bytes());
        out.extend_from_slice(&echo.echoed_ns.to_be_bytes());
        out.extend_from_slice(&echo.held_ns.to_be_bytes());
    }
    Ok(())
}

/// A packet's fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub sender: u32,
    pub body_len: usize,
}

/// Reads one header from the front of `bytes`.
pub fn decode_header(bytes: &[u8]) -> Result<Header, DecodeError> {
    let mut reader = Reader::new(bytes);
    let magic = reader.u16()?;
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = reader.u8()?;
    if version != VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let kind = Kind::from_byte(reader.u8()?)?;
    let sender = reader.u32()?;
    let body_len = reader.u32()? as usize;
    if body_len > MAX_BODY_LEN {
        return Err(DecodeError::Oversized {
            declared: body_len,
            max: MAX_BODY_LEN,
        });
    }
    Ok(Header {
        kind,
        sender,
        body_len,
    })
}

/// Decodes exactly one packet that fills `bytes`.
pub fn decode_packet(bytes: &[u8]) -> Result<(Header, Packet<'_>), DecodeError> {
    let mut packets = packets(bytes);
    let first = packets.next().ok_or(DecodeError::Empty)??;
    match packets.rest.len() {
        0 => Ok(first),
        extra => Err(DecodeError::TrailingBytes {
            kind: first.0.kind,
            extra,
        }),
    }
}

/// Iterates over the packets packed in a datagram. After the first error the
/// iterator ends: a length field that cannot be trusted leaves nothing to
/// resynchronise on. An empty datagram yields one [`DecodeError::Empty`].
pub fn packets(datagram: &[u8]) -> Packets<'_> {
    Packets {
        rest: datagram,
        started: false,
        failed: false,
    }
}

/// Iterator returned by [`packets`].
pub struct Packets<'a> {
    rest: &'a [u8],
    started: bool,
    failed: bool,
}

impl<'a> Iterator for Packets<'a> {
    type Item = Result<(Header, Packet<'a>), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.rest.is_empty() {
            let first = !self.started;
            self.started = true;
            self.failed = first;
            return first.then_some(Err(DecodeError::Empty));
        }
        self.started = true;
        let result = self.decode_next();
        self.failed = result.is_err();
        Some(result)
    }
}

impl<'a> Packets<'a> {
    fn decode_next(&mut self) -> Result<(Header, Packet<'a>), DecodeError> {
        let header = decode_header(self.rest)?;
        let body = self
            .rest
            .get(HEADER_LEN..HEADER_LEN + header.body_len)
            .ok_or(DecodeError::Truncated {
                needed: HEADER_LEN + header.body_len,
                available: self.rest.len(),
            })?;
        let packet = decode_body(header.kind, body)?;
        self.rest = &self.rest[HEADER_LEN + header.body_len..];
        Ok((header, packet))
    }
}

fn decode_body(kind: Kind, body: &[u8]) -> Result<Packet<'_>, DecodeError> {
    let mut reader = Reader::new(body);
    let packet = match kind {
        Kind::Data => Packet::Data {
            seq: reader.u64()?,
            payload: reader.rest(),
        },
        Kind::Gossip => {
            let digest = reader.ranges_list()?;
            let repaired = reader.ranges_list()?;
            let [lacking, awaited] = reader.optional_ranges_lists(Kind::Gossip)?;
            Packet::Gossip {
                digest,
                repaired,
                lacking,
                awaited,
            }
        }
        Kind::Solicit => Packet::Solicit {
            wanted: reader.ranges_list()?,
            again: {
                let [again] = reader.optional_ranges_lists(Kind::Solicit)?;
                again
            },
        },
        Kind::Retransmit => Packet::Retransmit {
            source: reader.u32()?,
            seq: reader.u64()?,
            payload: reader.rest(),
        },
        Kind::Relay => Packet::Relay {
            source: reader.u32()?,
            seq: reader.u64()?,
            payload: reader.rest(),
        },
        Kind::Push => Packet::Push {
            source: reader.u32()?,
            seq: reader.u64()?,
            payload: reader.rest(),
        },
        Kind::Status => Packet::Status {
            source: reader.u32()?,
            next: reader.u64()?,
        },
        Kind::Session => Packet::Session(reader.session()?),
        Kind::Heartbeat => Packet::Heartbeat {
            entries: reader.heartbeats()?,
        },
        Kind::Vsync => Packet::Vsync {
            body: reader.rest(),
        },
        Kind::QsmData
        | Kind::QsmToken
        | Kind::QsmAck
        | Kind::QsmNak
        | Kind::QsmRepair
        | Kind::QsmPull => Packet::Qsm {
            kind,
            body: reader.rest(),
        },
        Kind::Presence => Packet::Presence {
            member: match reader.u8()? {
                0 => false,
                1 => true,
                other => return Err(DecodeError::BadFlag(other)),
            },
            view: reader.u64()?,
            size: reader.u32()?,
            lowest: reader.u32()?,
        },
    };
    match reader.remaining() {
        0 => Ok(packet),
        extra => Err(DecodeError::TrailingBytes { kind, extra }),
    }
}

/// A bounds-checked big-endian cursor.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn remaining(&self) -> usize {
        self.bytes.len()
    }

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

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.take()?))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    /// Checks that `count` elements of at least `min_size` bytes each can fit
    /// in what remains, before anything is allocated for them.
    fn check_count(
        &self,
        what: &'static str,
        count: usize,
        min_size: usize,
    ) -> Result<(), DecodeError> {
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(DecodeError::CountTooLarge {
                what,
                count,
                available: self.remaining(),
            });
        }
        Ok(())
    }

    fn heartbeats(&mut self) -> Result<Vec<HeartbeatEntry>, DecodeError> {
        let count = self.u16()? as usize;
        self.check_count("heartbeat", count, HEARTBEAT_ENTRY_LEN)?;
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            entries.push(HeartbeatEntry {
                member: self.u32()?,
                incarnation: self.u32()?,
                heartbeat: self.u64()?,
            });
        }
        Ok(entries)
    }

    fn session(&mut self) -> Result<Session, DecodeError> {
        let sent_ns = self.u64()?;
        let count = self.u16()? as usize;
        self.check_count("source", count, 12)?;
        let mut highest = Vec::with_capacity(count);
        for _ in 0..count {
            highest.push((self.u32()?, self.u64()?));
        }
        let count = self.u16()? as usize;
        self.check_count("echo", count, 20)?;
        let mut echoes = Vec::with_capacity(count);
        for _ in 0..count {
            echoes.push(Echo {
                peer: self.u32()?,
                echoed_ns: self.u64()?,
                held_ns: self.u64()?,
            });
        }
        Ok(Session {
            sent_ns,
            highest,
            echoes,
        })
    }

    /// A ranges list that is left out when empty: none if the body ends
    /// here; present but empty is not the one encoding, so refused.
    /// Optional lists at the end of a body, each left out when it and every
    /// list after it are empty: the last list present must not be empty
    /// (one encoding per packet).
    fn optional_ranges_lists<const N: usize>(
        &mut self,
        kind: Kind,
    ) -> Result<[Vec<SourceRanges>; N], DecodeError> {
        let mut lists: [Vec<SourceRanges>; N] = std::array::from_fn(|_| Vec::new());
        // Bytes left where the run of empty lists read last began.
        let mut empty_run_from = None;
        for list in lists.iter_mut() {
            let extra = self.remaining();
            if extra == 0 {
                break;
            }
            *list = self.ranges_list()?;
            empty_run_from = match empty_run_from {
                _ if !list.is_empty() => None,
                None => Some(extra),
                run => run,
            };
        }
        match empty_run_from {
            Some(extra) => Err(DecodeError::TrailingBytes { kind, extra }),
            None => Ok(lists),
        }
    }

    fn ranges_list(&mut self) -> Result<Vec<SourceRanges>, DecodeError> {
        let count = self.u16()? as usize;
        self.check_count("source", count, 6)?;
        let mut list = Vec::with_capacity(count);
        for _ in 0..count {
            let source = self.u32()?;
            let nranges = self.u16()? as usize;
            self.check_count("range", nranges, RANGE_LEN)?;
            let mut ranges = Vec::with_capacity(nranges);
            for _ in 0..nranges {
                let (first, last) = (self.u64()?, self.u64()?);
                ranges.push(
                    SeqRange::new(first, last).ok_or(DecodeError::ReversedRange { first, last })?,
                );
            }
            list.push(SourceRanges { source, ranges });
        }
        Ok(list)
    }
}

#[cfg(test)]
mod tests;
