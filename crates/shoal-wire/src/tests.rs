use super::*;
use proptest::prelude::*;

fn header(kind: u8, sender: u32, body_len: u32) -> Vec<u8> {
    let mut out = MAGIC.to_be_bytes().to_vec();
    out.push(VERSION);
    out.push(kind);
    out.extend_from_slice(&sender.to_be_bytes());
    out.extend_from_slice(&body_len.to_be_bytes());
    out
}

fn with_body(mut head: Vec<u8>, body: &[u8]) -> Vec<u8> {
    head.extend_from_slice(body);
    head
}

fn data(seq: u64, payload: &[u8]) -> Vec<u8> {
    Packet::Data { seq, payload }.to_vec(7).unwrap()
}

#[test]
fn malformed_packets_are_rejected_with_their_error() {
    let good = data(3, b"hello");
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    let mut bad_version = good.clone();
    bad_version[2] = 9;
    let mut trailing_data_len = good.clone();
    trailing_data_len.push(0);
    let reversed = {
        let mut body = 1u16.to_be_bytes().to_vec();
        body.extend_from_slice(&5u32.to_be_bytes());
        body.extend_from_slice(&1u16.to_be_bytes());
        body.extend_from_slice(&9u64.to_be_bytes());
        body.extend_from_slice(&4u64.to_be_bytes());
        with_body(header(Kind::Gossip as u8, 1, body.len() as u32), &body)
    };
    let huge_source_count = {
        let body = 0xFFFFu16.to_be_bytes();
        with_body(header(Kind::Solicit as u8, 1, 2), &body)
    };
    let huge_range_count = {
        let mut body = 1u16.to_be_bytes().to_vec();
        body.extend_from_slice(&5u32.to_be_bytes());
        body.extend_from_slice(&0xFFFFu16.to_be_bytes());
        with_body(header(Kind::Gossip as u8, 1, body.len() as u32), &body)
    };
    let status_with_extra = with_body(header(Kind::Status as u8, 1, 13), &[0; 13]);
    let huge_echo_count = {
        let mut body = 5u64.to_be_bytes().to_vec();
        body.extend_from_slice(&0u16.to_be_bytes());
        body.extend_from_slice(&0x1000u16.to_be_bytes());
        with_body(header(Kind::Session as u8, 1, body.len() as u32), &body)
    };

    let cases: Vec<(&str, Vec<u8>, DecodeError)> = vec![
        ("empty", vec![], DecodeError::Empty),
        (
            "short header",
            good[..5].to_vec(),
            DecodeError::Truncated {
                needed: 4,
                available: 1,
            },
        ),
        ("bad magic", bad_magic, DecodeError::BadMagic(0x5848)),
        (
            "bad version",
            bad_version,
            DecodeError::UnsupportedVersion(9),
        ),
        (
            "unknown kind",
            header(42, 1, 0),
            DecodeError::UnknownKind(42),
        ),
        (
            "oversized length",
            header(Kind::Data as u8, 1, 70_000),
            DecodeError::Oversized {
                declared: 70_000,
                max: MAX_BODY_LEN,
            },
        ),
        (
            "body shorter than declared",
            good[..good.len() - 1].to_vec(),
            DecodeError::Truncated {
                needed: good.len(),
                available: good.len() - 1,
            },
        ),
        (
            "data body without a sequence number",
            with_body(header(Kind::Data as u8, 1, 4), &[0; 4]),
            DecodeError::Truncated {
                needed: 8,
                available: 4,
            },
        ),
        (
            "trailing garbage after a packet",
            trailing_data_len,
            DecodeError::Truncated {
                needed: 2,
                available: 1,
            },
        ),
        (
            "reversed range",
            reversed,
            DecodeError::ReversedRange { first: 9, last: 4 },
        ),
        (
            "source count larger than the body",
            huge_source_count,
            DecodeError::CountTooLarge {
                what: "source",
                count: 0xFFFF,
                available: 0,
            },
        ),
        (
            "range count larger than the body",
            huge_range_count,
            DecodeError::CountTooLarge {
                what: "range",
                count: 0xFFFF,
                available: 0,
            },
        ),
        (
            "presence with a flag other than 0 or 1",
            with_body(
                header(Kind::Presence as u8, 1, 9),
                &[2, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            DecodeError::BadFlag(2),
        ),
        (
            "status with an extra byte",
            status_with_extra,
            DecodeError::TrailingBytes {
                kind: Kind::Status,
                extra: 1,
            },
        ),
        (
            "session echo count larger than the body",
            huge_echo_count,
            DecodeError::CountTooLarge {
                what: "echo",
                count: 0x1000,
                available: 0,
            },
        ),
    ];
    for (name, bytes, expected) in cases {
        let result: Result<Vec<_>, _> = packets(&bytes).collect();
        assert_eq!(result.err(), Some(expected), "case {name}");
    }
}

#[test]
fn a_solicitation_without_repeats_is_one_list() {
    let wanted = vec![SourceRanges {
        source: 5,
        ranges: vec![SeqRange::single(9)],
    }];
    let one = Packet::Solicit {
        wanted: wanted.clone(),
        again: Vec::new(),
    }
    .to_vec(1)
    .unwrap();
    assert_eq!(one.len(), HEADER_LEN + 2 + 6 + RANGE_LEN);
    // The same list again as `again`: a second list follows.
    let both = Packet::Solicit {
        wanted: wanted.clone(),
        again: wanted.clone(),
    }
    .to_vec(1)
    .unwrap();
    let (_, decoded) = decode_packet(&both).unwrap();
    assert_eq!(
        decoded,
        Packet::Solicit {
            wanted: wanted.clone(),
            again: wanted
        }
    );
    // An empty second list is not how an empty `again` is written.
    assert_an_empty_optional_list_is_refused(Kind::Solicit, &one);
}

/// `encoded` with an empty list (a zero count) appended fails to decode:
/// an optional trailing list is left out when empty, never written empty.
fn assert_an_empty_optional_list_is_refused(kind: Kind, encoded: &[u8]) {
    let mut body = encoded[HEADER_LEN..].to_vec();
    body.extend_from_slice(&0u16.to_be_bytes());
    let padded = with_body(header(kind as u8, 1, body.len() as u32), &body);
    assert_eq!(
        decode_packet(&padded).unwrap_err(),
        DecodeError::TrailingBytes { kind, extra: 2 }
    );
}

/// A gossip without `lacking` is the two lists it always was; with it, a
/// third follows, and an empty third list is refused as trailing bytes.
#[test]
fn a_gossip_lacking_nothing_is_two_lists() {
    let digest = vec![SourceRanges {
        source: 5,
        ranges: vec![SeqRange::new(0, 8).unwrap()],
    }];
    let two = Packet::Gossip {
        digest: digest.clone(),
        repaired: Vec::new(),
        lacking: Vec::new(),
        awaited: Vec::new(),
    }
    .to_vec(1)
    .unwrap();
    assert_eq!(two.len(), HEADER_LEN + (2 + 6 + RANGE_LEN) + 2);
    let lacking = vec![SourceRanges {
        source: 5,
        ranges: vec![SeqRange::single(9)],
    }];
    let three = Packet::Gossip {
        digest: digest.clone(),
        repaired: Vec::new(),
        lacking: lacking.clone(),
        awaited: Vec::new(),
    };
    let bytes = three.to_vec(1).unwrap();
    assert_eq!(bytes.len(), two.len() + 2 + 6 + RANGE_LEN);
    assert_eq!(decode_packet(&bytes).unwrap().1, three);
    assert_an_empty_optional_list_is_refused(Kind::Gossip, &two);
    assert_an_empty_optional_list_is_refused(Kind::Gossip, &bytes);
}

/// A gossip awaiting pushes but lacking nothing at its edges writes its
/// third list empty and the fourth after it; two empty lists at the end
/// are refused.
#[test]
fn a_gossip_awaiting_pushes_is_four_lists() {
    let list = |seq| {
        vec![SourceRanges {
            source: 5,
            ranges: vec![SeqRange::single(seq)],
        }]
    };
    let four = Packet::Gossip {
        digest: list(3),
        repaired: Vec::new(),
        lacking: Vec::new(),
        awaited: list(2),
    };
    let bytes = four.to_vec(1).unwrap();
    let two_lists = HEADER_LEN + (2 + 6 + RANGE_LEN) + 2;
    assert_eq!(bytes.len(), two_lists + 2 + (2 + 6 + RANGE_LEN));
    assert_eq!(decode_packet(&bytes).unwrap().1, four);
    let mut body = bytes[HEADER_LEN..two_lists].to_vec();
    body.extend_from_slice(&[0, 0, 0, 0]);
    let padded = with_body(header(Kind::Gossip as u8, 1, body.len() as u32), &body);
    assert_eq!(
        decode_packet(&padded).unwrap_err(),
        DecodeError::TrailingBytes {
            kind: Kind::Gossip,
            extra: 4
        }
    );
}

#[test]
fn decode_packet_refuses_a_second_packet() {
    let mut two = data(1, b"a");
    two.extend(data(2, b"b"));
    assert_eq!(
        decode_packet(&two).err(),
        Some(DecodeError::TrailingBytes {
            kind: Kind::Data,
            extra: HEADER_LEN + 9
        })
    );
}

#[test]
fn packed_datagram_yields_every_packet_in_order() {
    let mut datagram = data(1, b"one");
    Packet::Status { source: 3, next: 9 }
        .encode(7, &mut datagram)
        .unwrap();
    datagram.extend(data(2, b"two"));
    let decoded: Vec<_> = packets(&datagram).map(|r| r.unwrap().1).collect();
    assert_eq!(
        decoded,
        vec![
            Packet::Data {
                seq: 1,
                payload: b"one"
            },
            Packet::Status { source: 3, next: 9 },
            Packet::Data {
                seq: 2,
                payload: b"two"
            },
        ]
    );
}

#[test]
fn encode_refuses_an_oversized_body() {
    let payload = vec![0; MAX_BODY_LEN];
    let err = Packet::Data {
        seq: 0,
        payload: &payload,
    }
    .to_vec(0)
    .unwrap_err();
    assert_eq!(
        err,
        EncodeError::TooLarge {
            len: MAX_BODY_LEN + 8,
            max: MAX_BODY_LEN
        }
    );
}

fn arb_range() -> impl Strategy<Value = SeqRange> {
    (any::<u64>(), any::<u64>()).prop_map(|(a, b)| SeqRange::new(a.min(b), a.max(b)).unwrap())
}

fn arb_list() -> impl Strategy<Value = Vec<SourceRanges>> {
    prop::collection::vec(
        (any::<u32>(), prop::collection::vec(arb_range(), 0..8))
            .prop_map(|(source, ranges)| SourceRanges { source, ranges }),
        0..6,
    )
}

#[derive(Debug, Clone)]
enum Owned {
    Data(u64, Vec<u8>),
    Gossip([Vec<SourceRanges>; 4]),
    Solicit(Vec<SourceRanges>, Vec<SourceRanges>),
    Retransmit(u32, u64, Vec<u8>),
    Status(u32, u64),
    Session(Session),
    Heartbeat(Vec<HeartbeatEntry>),
    Vsync(Vec<u8>),
    Presence(bool, u64, u32, u32),
    Relay(u32, u64, Vec<u8>),
    Push(u32, u64, Vec<u8>),
}

impl Owned {
    fn packet(&self) -> Packet<'_> {
        match self {
            Owned::Data(seq, p) => Packet::Data {
                seq: *seq,
                payload: p,
            },
            Owned::Gossip([d, r, l, a]) => Packet::Gossip {
                digest: d.clone(),
                repaired: r.clone(),
                lacking: l.clone(),
                awaited: a.clone(),
            },
            Owned::Solicit(w, a) => Packet::Solicit {
                wanted: w.clone(),
                again: a.clone(),
            },
            Owned::Retransmit(s, seq, p) => Packet::Retransmit {
                source: *s,
                seq: *seq,
                payload: p,
            },
            Owned::Status(s, n) => Packet::Status {
                source: *s,
                next: *n,
            },
            Owned::Session(session) => Packet::Session(session.clone()),
            Owned::Heartbeat(entries) => Packet::Heartbeat {
                entries: entries.clone(),
            },
            Owned::Vsync(body) => Packet::Vsync { body },
            Owned::Presence(member, view, size, lowest) => Packet::Presence {
                member: *member,
                view: *view,
                size: *size,
                lowest: *lowest,
            },
            Owned::Relay(s, seq, p) => Packet::Relay {
                source: *s,
                seq: *seq,
                payload: p,
            },
            Owned::Push(s, seq, p) => Packet::Push {
                source: *s,
                seq: *seq,
                payload: p,
            },
        }
    }
}

fn arb_packet() -> impl Strategy<Value = Owned> {
    let payload = prop::collection::vec(any::<u8>(), 0..300);
    prop_oneof![
        (any::<u64>(), payload.clone()).prop_map(|(s, p)| Owned::Data(s, p)),
        (arb_list(), arb_list(), arb_list(), arb_list())
            .prop_map(|(d, r, l, a)| Owned::Gossip([d, r, l, a])),
        (arb_list(), arb_list()).prop_map(|(w, a)| Owned::Solicit(w, a)),
        (any::<u32>(), any::<u64>(), payload.clone())
            .prop_map(|(a, s, p)| Owned::Retransmit(a, s, p)),
        (any::<u32>(), any::<u64>(), payload.clone()).prop_map(|(a, s, p)| Owned::Relay(a, s, p)),
        (any::<u32>(), any::<u64>(), payload).prop_map(|(a, s, p)| Owned::Push(a, s, p)),
        (any::<u32>(), any::<u64>()).prop_map(|(s, n)| Owned::Status(s, n)),
        (
            any::<u64>(),
            prop::collection::vec((any::<u32>(), any::<u64>()), 0..5),
            prop::collection::vec((any::<u32>(), any::<u64>(), any::<u64>()), 0..5),
        )
            .prop_map(|(sent_ns, highest, echoes)| Owned::Session(Session {
                sent_ns,
                highest,
                echoes: echoes
                    .into_iter()
                    .map(|(peer, echoed_ns, held_ns)| Echo {
                        peer,
                        echoed_ns,
                        held_ns
                    })
                    .collect(),
            })),
        prop::collection::vec(any::<u8>(), 0..40).prop_map(Owned::Vsync),
        (any::<bool>(), any::<u64>(), any::<u32>(), any::<u32>())
            .prop_map(|(m, v, s, l)| Owned::Presence(m, v, s, l)),
        prop::collection::vec((any::<u32>(), any::<u32>(), any::<u64>()), 0..6).prop_map(|v| {
            Owned::Heartbeat(
                v.into_iter()
                    .map(|(member, incarnation, heartbeat)| HeartbeatEntry {
                        member,
                        incarnation,
                        heartbeat,
                    })
                    .collect(),
            )
        }),
    ]
}

proptest! {
    #[test]
    fn decode_inverts_encode(sender in any::<u32>(), owned in prop::collection::vec(arb_packet(), 1..5)) {
        let mut datagram = Vec::new();
        for p in &owned {
            p.packet().encode(sender, &mut datagram).unwrap();
        }
        let decoded: Vec<_> = packets(&datagram).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(decoded.len(), owned.len());
        for ((header, packet), original) in decoded.iter().zip(&owned) {
            prop_assert_eq!(header.sender, sender);
            prop_assert_eq!(packet, &original.packet());
            prop_assert_eq!(header.body_len, original.packet().body_len());
        }
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        for item in packets(&bytes) {
            let _ = item;
        }
    }

    #[test]
    fn decoding_mutated_packets_never_panics(owned in arb_packet(), index in any::<usize>(), byte in any::<u8>()) {
        let mut bytes = owned.packet().to_vec(1).unwrap();
        let i = index % bytes.len();
        bytes[i] = byte;
        for item in packets(&bytes) {
            let _ = item;
        }
    }
}
