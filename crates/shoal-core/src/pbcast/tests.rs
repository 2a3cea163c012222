//! Engine tests on a tiny virtual-time network (no simulator, no tokio).

use std::num::NonZeroU32;
use std::time::Duration;

use super::*;
use crate::engine::Destination;
use crate::testnet;
use shoal_wire::Kind;

type Net = testnet::Net<Pbcast>;

/// Members 0..n running pbcast with `config`, invariants checked every step.
fn net(n: usize, config: Config, seed: u64) -> Net {
    let mut net = Net::new(n, seed, |me, members| {
        Pbcast::new(
            me,
            members,
            config.clone(),
            seed ^ u64::from(me.0),
            Instant::ZERO,
        )
        .unwrap()
    });
    net.check = Some(Pbcast::check_invariants);
    net
}

fn paper_config() -> Config {
    Config {
        ip_multicast: true,
        send_window: None,
        ..Config::default()
    }
}

/// Sends `count` messages from member 0, one every `gap_ms`.
fn send_stream(net: &mut Net, count: u64, gap_ms: u64) {
    for i in 0..count {
        net.run_until(i * gap_ms);
        net.multicast(0, &i.to_be_bytes()).unwrap();
    }
}

#[test]
fn every_member_delivers_every_message_in_order_without_loss() {
    for ip_multicast in [true, false] {
        let config = Config {
            ip_multicast,
            ..paper_config()
        };
        let mut net = net(5, config, 1);
        send_stream(&mut net, 100, 1);
        net.run_until(3_000);
        for member in 0..5 {
            assert_eq!(net.delivered_seqs(member, 0), (0..100).collect::<Vec<_>>());
            assert!(net.lost(member).is_empty());
        }
        assert_eq!(net.engines[1].stats().recovered, 0);
    }
}

#[test]
fn gossip_repairs_losses_and_delivery_stays_fifo() {
    for seed in 0..10 {
        let mut net = net(8, paper_config(), seed);
        net.loss = 0.1;
        send_stream(&mut net, 200, 2);
        net.run_until(6_000);
        let recovered: u64 = net.engines.iter().map(|e| e.stats().recovered).sum();
        assert!(recovered > 0, "seed {seed}: loss must have needed repair");
        for member in 0..8 {
            assert_eq!(
                net.delivered_seqs(member, 0),
                (0..200).collect::<Vec<_>>(),
                "seed {seed} member {member}"
            );
        }
    }
}

#[test]
fn pull_only_and_push_only_both_repair() {
    for mode in [GossipMode::Pull, GossipMode::Push, GossipMode::PushPull] {
        let config = Config {
            mode,
            ..paper_config()
        };
        let mut net = net(6, config, 3);
        net.loss = 0.05;
        send_stream(&mut net, 100, 5);
        net.run_until(8_000);
        for member in 0..6 {
            assert_eq!(
                net.delivered_seqs(member, 0),
                (0..100).collect::<Vec<_>>(),
                "{mode:?} member {member}"
            );
        }
        // Push-only sends only PUSH packets, pull-only only RETRANSMIT
        // (answers); every push counted is a PUSH packet.
        let total = |count: &dyn Fn(&Stats) -> u64| -> u64 {
            net.engines.iter().map(|e| count(e.stats())).sum()
        };
        let pushed = total(&|s| s.retransmits_pushed);
        let push_packets = total(&|s| s.packets_sent[Kind::Push.index()]);
        let answers = total(&|s| s.packets_sent[Kind::Retransmit.index()]);
        assert_eq!(pushed, push_packets, "{mode:?}");
        match mode {
            GossipMode::Pull => assert!(pushed == 0 && answers > 0),
            GossipMode::Push => assert!(pushed > 0 && answers == 0),
            GossipMode::PushPull => assert!(pushed > 0 && answers > 0),
        }
    }
}

#[test]
fn unordered_delivery_does_not_wait_for_gaps() {
    let config = Config {
        delivery: Delivery::Unordered,
        ..paper_config()
    };
    let mut net = net(3, config, 4);
    // Member 2 misses the first data datagram; the second still reaches it at once.
    net.filter = Some(Box::new(|from, to, bytes| {
        !(from == 0 && to == 2 && bytes_has_data_seq(bytes, 0))
    }));
    net.multicast(0, b"a").unwrap();
    net.multicast(0, b"b").unwrap();
    net.run_until(5);
    assert_eq!(net.delivered_seqs(2, 0), vec![1]);
    net.filter = None;
    net.run_until(2_000);
    assert_eq!(net.delivered_seqs(2, 0), vec![1, 0]);
}

fn bytes_has_data_seq(bytes: &[u8], wanted: u64) -> bool {
    shoal_wire::packets(bytes).any(|p| match p {
        Ok((_, Packet::Data { seq, .. })) => seq == wanted,
        Ok((_, Packet::Retransmit { seq, .. } | Packet::Push { seq, .. })) => seq == wanted,
        _ => false,
    })
}

#[test]
fn an_unrepairable_gap_becomes_an_explicit_lost_event() {
    let mut net = net(4, paper_config(), 5);
    // Nobody but the sender ever gets message 0, by data or by retransmission.
    net.filter = Some(Box::new(|from, _, bytes| {
        !(from == 0 && bytes_has_data_seq(bytes, 0))
    }));
    send_stream(&mut net, 3, 10);
    net.run_until(6_000);
    for member in 1..4 {
        assert_eq!(
            net.lost(member),
            vec![SeqRange::single(0)],
            "member {member}"
        );
        assert_eq!(net.delivered_seqs(member, 0), vec![1, 2]);
        assert_eq!(net.engines[member].stats().lost, 1);
    }
    // The sender delivered its own message and lost nothing.
    assert_eq!(net.delivered_seqs(0, 0), vec![0, 1, 2]);
    assert!(net.lost(0).is_empty());
}

fn has_data_seq(bytes: &[u8], wanted: u64) -> bool {
    shoal_wire::packets(bytes)
        .any(|p| matches!(p, Ok((_, Packet::Data { seq, .. })) if seq == wanted))
}

fn has_gossip(bytes: &[u8]) -> bool {
    shoal_wire::packets(bytes).any(|p| matches!(p, Ok((_, Packet::Gossip { .. }))))
}

fn has_solicit(bytes: &[u8]) -> bool {
    shoal_wire::packets(bytes).any(|p| matches!(p, Ok((_, Packet::Solicit { .. }))))
}

/// A member that missed the first or the last message of a burst has no
/// held message on that side of the gap, so its digest cannot show it (a
/// partner reads the digest's ends as "collected below" and "not heard of
/// above"); its gossip says what it lacks there, and partners push the
/// message. Here its solicitations never arrive, so a push is its only way
/// to get it.
///
/// Nor can a member that never heard of the last message say it lacks it
/// (here no digest reaches it); once the source has been quiet for a round,
/// partners push what lies above its digest's top.
#[test]
fn a_member_that_missed_either_end_of_a_burst_has_it_pushed() {
    for (missed, deaf) in [(0, false), (2, false), (2, true)] {
        let mut net = net(4, paper_config(), 7);
        net.filter = Some(Box::new(move |from, to, bytes| {
            let missed_to_three = to == 3 && has_data_seq(bytes, missed);
            let three_asks = from == 3 && has_solicit(bytes);
            let gossip_to_three = deaf && to == 3 && has_gossip(bytes);
            !(missed_to_three || three_asks || gossip_to_three)
        }));
        send_stream(&mut net, 3, 10);
        net.run_until(3_000);
        assert_eq!(
            net.delivered_seqs(3, 0),
            vec![0, 1, 2],
            "missed {missed}, deaf {deaf}"
        );
        assert!(net.lost(3).is_empty());
        assert!(net.engines[3].stats().recovered >= 1);
    }
}

/// A member whose own collection reached its oldest gap keeps the message
/// before it, so its digests still show the gap and partners push the
/// message (again its solicitations never arrive).
#[test]
fn a_gap_stays_visible_after_its_neighbours_are_collected() {
    let mut net = net(4, paper_config(), 8);
    let has_retransmit = |bytes: &[u8]| {
        shoal_wire::packets(bytes)
            .any(|p| matches!(p, Ok((_, Packet::Retransmit { .. } | Packet::Push { .. }))))
    };
    // Until member 3's copy of message 0 is due for collection (1 s after
    // it arrived), nothing repairs message 1 at member 3.
    net.filter = Some(Box::new(move |from, to, bytes| {
        let to_three = to == 3 && (has_data_seq(bytes, 1) || has_retransmit(bytes));
        let three_asks = from == 3 && has_solicit(bytes);
        !(to_three || three_asks)
    }));
    net.multicast(0, b"0").unwrap();
    net.run_until(500);
    net.multicast(0, b"1").unwrap();
    net.run_until(510);
    net.multicast(0, b"2").unwrap();
    net.run_until(1_050);
    assert_eq!(net.delivered_seqs(3, 0), vec![0], "FIFO: 2 waits for 1");
    // The others' copies of message 1 are young until 1.5 s: pushed on
    // member 3's gossip only if that gossip still shows the gap.
    net.filter = Some(Box::new(|from, to, bytes| {
        let one_to_three = to == 3 && has_data_seq(bytes, 1);
        let three_asks = from == 3 && has_solicit(bytes);
        !(one_to_three || three_asks)
    }));
    net.run_until(4_000);
    assert_eq!(net.delivered_seqs(3, 0), vec![0, 1, 2]);
    assert!(net.lost(3).is_empty());
}

#[test]
fn messages_are_collected_after_gc_rounds() {
    let mut net = net(3, paper_config(), 6);
    send_stream(&mut net, 10, 1);
    net.run_until(500);
    assert_eq!(net.engines[1].buffered(), 10);
    // 10 rounds of 100 ms after arrival, plus one round of slack.
    net.run_until(1_200);
    assert_eq!(net.engines[1].buffered(), 0);
    assert_eq!(net.engines[0].buffered(), 0);
}

#[test]
fn retransmissions_per_round_are_bounded() {
    let config = Config {
        retransmits_per_round_max: 5,
        mode: GossipMode::Pull,
        ..paper_config()
    };
    let mut net = net(2, config, 7);
    // Member 1 misses the whole first phase.
    net.filter = Some(Box::new(|from, _, bytes| {
        !(from == 0
            && shoal_wire::packets(bytes).any(|p| matches!(p, Ok((_, Packet::Data { .. })))))
    }));
    send_stream(&mut net, 50, 0);
    net.run_until(250);
    let sent = net.engines[0].stats().packets_sent[Kind::Retransmit.index()];
    let rounds = net.engines[0].stats().gossip_rounds;
    assert!(
        sent <= 5 * (rounds + 1),
        "{sent} retransmits in {rounds} rounds"
    );
    net.run_until(3_000);
    assert_eq!(net.delivered_seqs(1, 0), (0..50).collect::<Vec<_>>());
}

#[test]
fn small_messages_are_packed_and_a_lone_message_leaves_alone() {
    let config = Config {
        max_datagram_size: 1472,
        ..paper_config()
    };
    let mut e = Pbcast::new(NodeId(0), &[NodeId(0), NodeId(1)], config, 1, Instant::ZERO).unwrap();
    for _ in 0..100 {
        e.multicast(Instant::ZERO, Bytes::from_static(&[7; 100]))
            .unwrap();
    }
    let mut datagrams = Vec::new();
    while let Some(t) = e.poll_transmit(Instant::ZERO) {
        assert!(t.payload.len() <= 1472);
        datagrams.push(t);
    }
    // 120 bytes per packet: 12 fit in 1472 bytes.
    assert_eq!(datagrams.len(), 9);
    let packets: usize = datagrams
        .iter()
        .map(|d| shoal_wire::packets(&d.payload).count())
        .sum();
    assert_eq!(packets, 100);
    e.multicast(Instant::ZERO, Bytes::from_static(b"one"))
        .unwrap();
    let lone = e.poll_transmit(Instant::ZERO).unwrap();
    assert_eq!(shoal_wire::packets(&lone.payload).count(), 1);
}

#[test]
fn flow_control_blocks_a_sender_until_receivers_report() {
    let config = Config {
        send_window: NonZeroU32::new(10),
        status_every: NonZeroU32::new(5).unwrap(),
        ..paper_config()
    };
    let mut net = net(3, config, 8);
    for i in 0..10 {
        net.multicast(0, &[i]).unwrap();
    }
    assert_eq!(net.multicast(0, b"x"), Err(SendError::WindowFull));
    assert!(!net.engines[0].can_send(net.now()));
    net.run_until(30);
    assert!(net.engines[0].can_send(net.now()));
    net.multicast(0, b"x").unwrap();
}

#[test]
fn a_silent_member_stops_holding_the_window() {
    let config = Config {
        send_window: NonZeroU32::new(10),
        ..paper_config()
    };
    let mut net = net(3, config, 9);
    // Member 2 hears nothing at all.
    net.filter = Some(Box::new(|_, to, _| to != 2));
    for i in 0..10 {
        net.multicast(0, &[i]).unwrap();
    }
    net.run_until(100);
    assert!(!net.engines[0].can_send(net.now()));
    net.run_until(1_100);
    assert!(net.engines[0].can_send(net.now()));
}

#[test]
fn bad_datagrams_are_counted_and_dropped() {
    let mut e = Pbcast::new(
        NodeId(0),
        &[NodeId(0), NodeId(1)],
        paper_config(),
        1,
        Instant::ZERO,
    )
    .unwrap();
    e.handle_datagram(Instant::ZERO, NodeId(1), b"garbage");
    // A valid packet claiming another sender than the one it came from.
    let spoofed = Packet::Data {
        seq: 0,
        payload: b"x",
    }
    .to_vec(1)
    .unwrap();
    e.handle_datagram(Instant::ZERO, NodeId(9), &spoofed);
    let mismatched = Packet::Data {
        seq: 0,
        payload: b"x",
    }
    .to_vec(0)
    .unwrap();
    e.handle_datagram(Instant::ZERO, NodeId(1), &mismatched);
    assert_eq!(e.stats().malformed, 3);
    assert!(e.poll_event().is_none());
}

#[test]
fn oversized_payload_is_refused() {
    let mut e = Pbcast::new(NodeId(0), &[NodeId(0)], paper_config(), 1, Instant::ZERO).unwrap();
    let max = e.config().max_payload();
    let err = e.multicast(Instant::ZERO, Bytes::from(vec![0; max + 1]));
    assert_eq!(err, Err(SendError::TooLarge { len: max + 1, max }));
    assert!(e
        .multicast(Instant::ZERO, Bytes::from(vec![0; max]))
        .is_ok());
}

#[test]
fn a_member_must_be_in_its_own_member_list() {
    let err = Pbcast::new(NodeId(5), &[NodeId(0)], Config::default(), 1, Instant::ZERO).err();
    assert_eq!(err, Some(ConfigError::NotAMember(5)));
}

#[test]
fn same_seed_gives_the_same_run() {
    let run = |seed| {
        let mut net = net(6, paper_config(), seed);
        net.loss = 0.1;
        send_stream(&mut net, 50, 3);
        net.run_until(3_000);
        net.engines
            .iter()
            .map(|e| format!("{:?}", e.stats()))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(11), run(11));
    assert_ne!(run(11), run(12));
}

#[test]
fn gossip_rounds_follow_the_interval() {
    let mut e = Pbcast::new(
        NodeId(0),
        &[NodeId(0), NodeId(1)],
        paper_config(),
        1,
        Instant::ZERO,
    )
    .unwrap();
    let mut now = Instant::ZERO;
    for _ in 0..50 {
        now = e.poll_timeout().unwrap();
        e.handle_timeout(now);
        while e.poll_transmit(now).is_some() {}
    }
    // 50 rounds of 100 ms, starting within the first interval.
    assert!(now >= Instant::ZERO + Duration::from_millis(4_900));
    assert!(now < Instant::ZERO + Duration::from_millis(5_000));
    assert_eq!(e.stats().gossip_rounds, 50);
}

/// Only the source holds message 0 at first, so several members solicit it
/// from the source in the same round.
fn run_with_message_zero_withheld(config: Config, seed: u64) -> Net {
    let mut net = net(10, config, seed);
    net.filter = Some(Box::new(|from, _, bytes| {
        !(from == 0
            && shoal_wire::packets(bytes)
                .any(|p| matches!(p, Ok((_, Packet::Data { seq: 0, .. })))))
    }));
    net.multicast(0, b"zero").unwrap();
    net.filter = None;
    send_stream_from(&mut net, 1, 20, 5);
    net.run_until(4_000);
    for member in 0..10 {
        assert_eq!(net.delivered_seqs(member, 0), (0..20).collect::<Vec<_>>());
    }
    net
}

fn send_stream_from(net: &mut Net, first: u64, end: u64, gap_ms: u64) {
    for i in first..end {
        net.run_until(i * gap_ms);
        net.multicast(0, &i.to_be_bytes()).unwrap();
    }
}

#[test]
fn plain_pbcast_never_multicasts_a_retransmission() {
    let net = run_with_message_zero_withheld(paper_config(), 1);
    let multicast: u64 = net
        .engines
        .iter()
        .map(|e| e.stats().retransmits_multicast)
        .sum();
    assert_eq!(multicast, 0);
}

#[test]
fn ipmc_and_grb_multicast_retransmissions_of_widely_missed_messages() {
    for variant in [MulticastRepair::Ipmc, MulticastRepair::Grb] {
        let mut multicast = 0;
        for seed in 0..5 {
            let config = Config {
                multicast_repair: variant,
                ..paper_config()
            };
            let net = run_with_message_zero_withheld(config, seed);
            multicast += net
                .engines
                .iter()
                .map(|e| e.stats().retransmits_multicast)
                .sum::<u64>();
        }
        assert!(multicast > 0, "{variant:?}");
    }
}

/// A solicitation from `from` for member 0's message `seq`: a first ask,
/// or an ask again.
fn solicit_of_zero(from: u32, seq: u64, first_ask: bool) -> Vec<u8> {
    let wanted = vec![SourceRanges {
        source: 0,
        ranges: vec![SeqRange::single(seq)],
    }];
    let (wanted, again) = if first_ask {
        (wanted, Vec::new())
    } else {
        (Vec::new(), wanted)
    };
    Packet::Solicit { wanted, again }.to_vec(from).unwrap()
}

/// A gossip from `from` that reports, as repair bits, `range` of `source`.
fn gossip_of_repairs(from: u32, source: u32, range: SeqRange) -> Vec<u8> {
    let repaired = vec![SourceRanges {
        source,
        ranges: vec![range],
    }];
    Packet::Gossip {
        digest: Vec::new(),
        repaired,
        lacking: Vec::new(),
        awaited: Vec::new(),
    }
    .to_vec(from)
    .unwrap()
}

/// Where member 0 sends the retransmissions its pending input caused.
fn retransmit_destinations(e: &mut Pbcast, now: Instant) -> Vec<Destination> {
    let mut out = Vec::new();
    while let Some(t) = e.poll_transmit(now) {
        let mut packets = shoal_wire::packets(&t.payload);
        if packets.any(|p| matches!(p, Ok((_, Packet::Retransmit { .. } | Packet::Push { .. })))) {
            out.push(t.destination);
        }
    }
    out
}

/// Member 0 of three, holding its own message 0, with pbcast-IPMC or grb.
fn holder_of_message_zero(variant: MulticastRepair) -> Pbcast {
    let config = Config {
        multicast_repair: variant,
        ..paper_config()
    };
    let members = [NodeId(0), NodeId(1), NodeId(2)];
    let mut e = Pbcast::new(NodeId(0), &members, config, 1, Instant::ZERO).unwrap();
    e.multicast(Instant::ZERO, Bytes::from_static(b"m"))
        .unwrap();
    while e.poll_transmit(Instant::ZERO).is_some() {}
    e
}

#[test]
fn grb_gossips_the_repairs_it_sent_not_those_it_heard_of() {
    let mut e = holder_of_message_zero(MulticastRepair::Grb);
    let now = Instant::ZERO;
    e.handle_datagram(
        now,
        NodeId(2),
        &gossip_of_repairs(2, 1, SeqRange::new(3, 5).unwrap()),
    );
    let Packet::Gossip { repaired, .. } = e.gossip_packet(Vec::new()) else {
        unreachable!()
    };
    assert!(repaired.is_empty(), "heard of, not sent: {repaired:?}");
    e.handle_datagram(now, NodeId(1), &solicit_of_zero(1, 0, true));
    assert_eq!(
        retransmit_destinations(&mut e, now),
        [Destination::Node(NodeId(1))]
    );
    let Packet::Gossip { repaired, .. } = e.gossip_packet(Vec::new()) else {
        unreachable!()
    };
    assert_eq!(
        repaired,
        vec![SourceRanges {
            source: 0,
            ranges: vec![SeqRange::single(0)]
        }]
    );
}

#[test]
fn a_member_asking_again_is_not_a_second_member_missing_the_message() {
    let now = Instant::ZERO;
    // Where `e` sends its answer to `from`'s ask for message 0.
    let answer = |e: &mut Pbcast, from: u32, first_ask: bool| {
        e.handle_datagram(now, NodeId(from), &solicit_of_zero(from, 0, first_ask));
        retransmit_destinations(e, now)
    };
    let unicast = [Destination::Node(NodeId(1))];
    // IPMC, threshold 2: the same member twice gets unicasts; a second
    // member's first ask makes the second solicitation that multicasts.
    let mut e = holder_of_message_zero(MulticastRepair::Ipmc);
    assert_eq!(answer(&mut e, 1, true), unicast);
    assert_eq!(answer(&mut e, 1, false), unicast);
    assert_eq!(answer(&mut e, 2, true), [Destination::Multicast]);
    // grb: having heard that someone else repaired it, a repeat is still
    // answered by unicast, a first ask by multicast.
    let mut e = holder_of_message_zero(MulticastRepair::Grb);
    e.handle_datagram(
        now,
        NodeId(2),
        &gossip_of_repairs(2, 0, SeqRange::single(0)),
    );
    assert_eq!(answer(&mut e, 1, false), unicast);
    assert_eq!(answer(&mut e, 1, true), [Destination::Multicast]);
}

#[test]
fn gossip_weights_steer_the_choice_of_target() {
    let members: Vec<NodeId> = (0..5).map(NodeId).collect();
    let mut e = Pbcast::new(NodeId(0), &members, paper_config(), 1, Instant::ZERO).unwrap();
    e.set_gossip_weights(&[(NodeId(3), 1.0)]).unwrap();
    for _ in 0..50 {
        let now = e.poll_timeout().unwrap();
        e.handle_timeout(now);
        while let Some(t) = e.poll_transmit(now) {
            assert_eq!(t.destination, Destination::Node(NodeId(3)));
        }
    }
    assert_eq!(
        e.set_gossip_weights(&[(NodeId(2), f64::NAN)]),
        Err(ConfigError::BadWeight(2))
    );
}

/// A gossip tree steers the choice of target like per-member weights: with
/// a steep base nearly every digest goes to the one member next door, and
/// the tree must hold the group's members.
#[test]
fn a_gossip_tree_steers_the_choice_of_target() {
    let members: Vec<NodeId> = (0..5).map(NodeId).collect();
    // A chain 0 - 1 - 2 with members 0 and 1 at nodes 0 and 1, the others
    // at node 2 (two hops from member 0).
    let parents = [None, Some(0), Some(1)];
    let at = [0, 1, 2, 2, 2];
    let placed: Vec<(NodeId, usize)> = members.iter().copied().zip(at).collect();
    let tree = std::sync::Arc::new(GossipTree::new(&parents, &placed).unwrap());
    let mut e = Pbcast::new(NodeId(0), &members, paper_config(), 1, Instant::ZERO).unwrap();
    e.set_gossip_tree(tree.clone(), 1e9).unwrap();
    let mut to = Vec::new();
    for _ in 0..50 {
        let now = e.poll_timeout().unwrap();
        e.handle_timeout(now);
        while let Some(t) = e.poll_transmit(now) {
            to.push(t.destination);
        }
    }
    assert!(to.len() >= 40, "{to:?}");
    assert!(
        to.iter().all(|d| *d == Destination::Node(NodeId(1))),
        "{to:?}"
    );
    // A member two hops away with base 1 (uniform) reaches everyone.
    let mut far = Pbcast::new(NodeId(3), &members, paper_config(), 2, Instant::ZERO).unwrap();
    far.set_gossip_tree(tree, 1.0).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let now = far.poll_timeout().unwrap();
        far.handle_timeout(now);
        while let Some(t) = far.poll_transmit(now) {
            match t.destination {
                Destination::Node(n) => seen.insert(n.0),
                other => panic!("gossip to {other:?}"),
            };
        }
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![0, 1, 2, 4]);
    // The tree must hold the group's members.
    let small = std::sync::Arc::new(GossipTree::new(&parents, &placed[..2]).unwrap());
    assert!(matches!(
        e.set_gossip_tree(small, 3.0),
        Err(ConfigError::BadTree(_))
    ));
}

#[test]
fn hierarchical_weights_fall_off_with_tree_distance() {
    let weights = hierarchical_weights(&[(NodeId(1), 1), (NodeId(2), 2), (NodeId(3), 0)], 3.0);
    assert_eq!(
        weights,
        vec![
            (NodeId(1), 1.0 / 3.0),
            (NodeId(2), 1.0 / 9.0),
            (NodeId(3), 1.0)
        ]
    );
}

#[test]
fn members_can_be_added_and_removed() {
    let mut net = net(4, paper_config(), 21);
    send_stream(&mut net, 10, 2);
    net.run_until(500);
    // Member 3 leaves the view of members 0..3; member 0 keeps sending.
    let now = net.now();
    for i in 0..3 {
        net.engines[i]
            .set_members(now, &[NodeId(0), NodeId(1), NodeId(2)])
            .unwrap();
    }
    net.filter = Some(Box::new(|from, to, _| from != 3 && to != 3));
    send_stream_from(&mut net, 10, 20, 60);
    net.run_until(3_000);
    for member in 0..3 {
        assert_eq!(net.delivered_seqs(member, 0), (0..20).collect::<Vec<_>>());
        assert!(net.lost(member).is_empty());
    }
    assert_eq!(
        net.engines[1].set_members(now, &[NodeId(0)]),
        Err(ConfigError::NotAMember(1))
    );
}

#[test]
fn a_joiner_starts_at_the_first_message_it_receives() {
    let members: Vec<NodeId> = (0..3).map(NodeId).collect();
    let mut joiner =
        Pbcast::new_joining(NodeId(2), &members, paper_config(), 1, Instant::ZERO).unwrap();
    for seq in 40..43u64 {
        let data = Packet::Data { seq, payload: b"x" }.to_vec(0).unwrap();
        joiner.handle_datagram(Instant::ZERO, NodeId(0), &data);
    }
    let delivered: Vec<u64> = std::iter::from_fn(|| joiner.poll_event())
        .filter_map(|e| match e {
            Event::Deliver { seq, .. } => Some(seq),
            Event::Lost { .. } => None,
        })
        .collect();
    assert_eq!(delivered, vec![40, 41, 42]);
    joiner.check_invariants();
}

/// The skeleton's guarantee on the tiny network: 50 members, 10% loss on
/// every datagram, 1000 messages at 100/s, every member delivers every message
/// exactly once, in FIFO order, for 20 seeds. (The simulator repeats this on a
/// star topology with per-link loss.)
#[test]
fn fifty_members_ten_percent_loss_twenty_seeds() {
    for seed in 100..120 {
        let mut net = net(50, paper_config(), seed);
        net.check = None; // invariants are checked once at the end: 50 engines per step is slow
        net.loss = 0.1;
        send_stream(&mut net, 1000, 10);
        net.run_until(14_000);
        for member in 0..50 {
            assert_eq!(
                net.delivered_seqs(member, 0),
                (0..1000).collect::<Vec<_>>(),
                "seed {seed} member {member}"
            );
            net.engines[member].check_invariants();
        }
    }
}

#[test]
fn lost_events_take_their_place_in_fifo_order() {
    let mut net = net(3, paper_config(), 31);
    // Nobody but the sender ever gets messages 0 and 2.
    net.filter = Some(Box::new(|from, _, bytes| {
        !(from == 0 && (bytes_has_data_seq(bytes, 0) || bytes_has_data_seq(bytes, 2)))
    }));
    send_stream(&mut net, 4, 10);
    net.run_until(6_000);
    let order: Vec<String> = net.events[1]
        .iter()
        .map(|e| match e {
            Event::Deliver { seq, .. } => format!("d{seq}"),
            Event::Lost { range, .. } => format!("l{}-{}", range.first, range.last),
        })
        .collect();
    assert_eq!(order, vec!["l0-0", "d1", "l2-2", "d3"]);
}

#[test]
fn a_shared_datagram_is_delivered_as_a_slice_not_a_copy() {
    let members = [NodeId(0), NodeId(1)];
    let engine = |me| Pbcast::new(me, &members, paper_config(), 7, Instant::ZERO).unwrap();
    let mut sender = engine(NodeId(0));
    sender
        .multicast(Instant::ZERO, Bytes::from_static(b"hello"))
        .unwrap();
    let datagram = sender.poll_transmit(Instant::ZERO).unwrap().payload;

    let mut copied = engine(NodeId(1));
    copied.handle_datagram(Instant::ZERO, NodeId(0), &datagram);
    let mut shared = engine(NodeId(1));
    shared.handle_datagram_bytes(Instant::ZERO, NodeId(0), &datagram);

    let (Some(Event::Deliver { payload: a, .. }), Some(Event::Deliver { payload: b, .. })) =
        (copied.poll_event(), shared.poll_event())
    else {
        panic!("both paths deliver the message");
    };
    assert_eq!(a, b);
    let inside = datagram.as_ptr_range();
    assert!(inside.contains(&b.as_ptr()), "shared path keeps a slice");
    assert!(!inside.contains(&a.as_ptr()), "plain path copies");
}

fn relay_config(fanout: u32) -> Config {
    Config {
        ip_multicast: false,
        relay_fanout: fanout,
        ..paper_config()
    }
}

/// Without loss the relay tree alone reaches everyone: nothing is
/// recovered, every member delivers in order, and each source and relay
/// sends at most `fanout` first-phase copies per message instead of n - 1.
#[test]
fn a_relay_tree_reaches_every_member_with_bounded_fanout() {
    let (n, fanout, count) = (40, 3, 50);
    for source in [0, 17] {
        let mut net = net(n, relay_config(fanout), 7);
        for i in 0..count {
            net.run_until(i * 5);
            net.multicast(source, &i.to_be_bytes()).unwrap();
        }
        net.run_until(3_000);
        for member in 0..n {
            assert_eq!(
                net.delivered_seqs(member, source as u32),
                (0..count).collect::<Vec<_>>(),
                "source {source} member {member}"
            );
            assert_eq!(net.engines[member].stats().recovered, 0, "member {member}");
        }
        let first_phase = |e: &Pbcast| {
            e.stats().packets_sent[Kind::Data.index()] + e.stats().packets_sent[Kind::Relay.index()]
        };
        for member in 0..n {
            let sent = first_phase(&net.engines[member]);
            assert!(
                sent <= u64::from(fanout) * count,
                "member {member} sent {sent}"
            );
        }
        let total: u64 = net.engines.iter().map(first_phase).sum();
        assert_eq!(
            total,
            (n as u64 - 1) * count,
            "one first-phase copy per member"
        );
    }
}

/// Losses in the tree cut off a relay's whole subtree for a message; gossip
/// repairs them like any other loss.
#[test]
fn gossip_repairs_what_a_relay_tree_loses() {
    for seed in 0..5 {
        let mut net = net(30, relay_config(2), seed);
        net.loss = 0.05;
        send_stream(&mut net, 100, 5);
        net.run_until(8_000);
        let recovered: u64 = net.engines.iter().map(|e| e.stats().recovered).sum();
        assert!(recovered > 0, "seed {seed}");
        for member in 0..30 {
            assert_eq!(
                net.delivered_seqs(member, 0),
                (0..100).collect::<Vec<_>>(),
                "seed {seed} member {member}"
            );
        }
    }
}

/// With a cap above the floor, the retry after a solicitation follows the
/// repair round trip: the floor on a fast network, about the round trip on
/// a slow one, never past the cap. With the default cap (the floor) it is
/// fixed.
#[test]
fn the_solicitation_retry_stretches_to_the_repair_round_trip() {
    let config = Config {
        solicit_retry_max: Duration::from_millis(200),
        ..paper_config()
    };
    let (floor, cap) = (config.solicit_retry, config.solicit_retry_max);
    let retries = |one_way_ms: u64| -> Vec<Duration> {
        let mut net = net(6, config.clone(), 3);
        net.delay = one_way_ms * testnet::MS;
        net.loss = 0.1;
        send_stream(&mut net, 1000, 5);
        net.run_until(10_000);
        for member in 1..6 {
            assert_eq!(net.delivered_seqs(member, 0), (0..1000).collect::<Vec<_>>());
        }
        net.engines.iter().map(Pbcast::solicit_retry).collect()
    };
    for retry in retries(1) {
        assert_eq!(retry, floor, "a 2 ms round trip keeps the floor");
    }
    let slow = retries(40);
    for retry in &slow[1..] {
        assert!(
            *retry >= Duration::from_millis(80) && *retry <= cap,
            "an 80 ms round trip: {retry:?}"
        );
    }
    let fixed = Config {
        solicit_retry_max: floor,
        ..config
    };
    assert_eq!(fixed, Config { ..paper_config() }, "fixed by default");
    let mut net = net(6, fixed, 3);
    net.delay = 40 * testnet::MS;
    net.loss = 0.1;
    send_stream(&mut net, 1000, 5);
    net.run_until(10_000);
    for e in &net.engines {
        assert_eq!(e.solicit_retry(), floor);
    }
}

#[test]
fn a_retry_cap_below_the_floor_is_refused() {
    let config = Config {
        solicit_retry_max: Duration::from_millis(10),
        ..paper_config()
    };
    assert!(matches!(
        config.validate(),
        Err(ConfigError::SolicitRetryRange { .. })
    ));
}

/// Where a repair takes longer than a round to come back, a member's next
/// digest lists the gaps whose push it already invited as awaited, and
/// its next partner does not push them again: the member that missed a
/// burst (and whose solicitations are lost, so pushes alone repair it)
/// gets fewer duplicates, and still everything.
#[test]
fn a_push_on_its_way_is_awaited_not_pushed_again() {
    let burst_missed = |push_hold_max: Duration| -> (u64, u64) {
        let config = Config {
            push_hold_max,
            ..paper_config()
        };
        let mut net = net(6, config, 11);
        net.delay = 70 * testnet::MS;
        // Some loss first, repaired by pushes alone, so that push round
        // trips are measured.
        net.loss = 0.05;
        net.filter = Some(Box::new(|from, _, bytes| {
            !(from == 3 && has_solicit(bytes))
        }));
        send_stream(&mut net, 200, 5);
        net.run_until(2_000);
        net.loss = 0.0;
        let before = net.engines[3].stats().clone();
        net.filter = Some(Box::new(|from, to, bytes| {
            let missed = to == 3 && (200..240).any(|seq| has_data_seq(bytes, seq));
            !(missed || (from == 3 && has_solicit(bytes)))
        }));
        for i in 200..300 {
            net.run_until(1_000 + i * 5);
            net.multicast(0, &i.to_be_bytes()).unwrap();
        }
        net.run_until(8_000);
        assert_eq!(net.delivered_seqs(3, 0), (0..300).collect::<Vec<_>>());
        let after = net.engines[3].stats();
        (
            after.duplicates - before.duplicates,
            after.recovered - before.recovered,
        )
    };
    let (held, recovered_held) = burst_missed(Duration::from_millis(500));
    let (unheld, recovered_unheld) = burst_missed(Duration::ZERO);
    assert!(recovered_held >= 40 && recovered_unheld >= 40);
    assert!(
        unheld >= 20 && held * 2 <= unheld,
        "duplicates at the member that missed the burst: {held} with the hold, {unheld} without"
    );
}

/// A member of a huge group holds state only for the members it hears
/// from: its own log and the log of the one source sending.
#[test]
fn a_member_of_a_large_group_keeps_state_only_for_active_sources() {
    let members = MemberList::dense(1_000_000);
    let mut e =
        Pbcast::with_members(NodeId(7), members.clone(), paper_config(), 1, Instant::ZERO).unwrap();
    let data = Packet::Data {
        seq: 0,
        payload: b"x",
    }
    .to_vec(123_456)
    .unwrap();
    e.handle_datagram(Instant::ZERO, NodeId(123_456), &data);
    let sources: Vec<usize> = e.logs.iter().map(|(source, _)| source).collect();
    assert_eq!(sources, vec![7, 123_456]);
    assert!(matches!(
        e.poll_event(),
        Some(Event::Deliver { seq: 0, .. })
    ));
    // The member list is the caller's, not a copy.
    assert!(std::ptr::eq(e.members().as_ptr(), members.as_ptr()));
    e.check_invariants();
}

/// Flow control counts members never heard from as at 0 until they fall
/// silent, as if each had reported 0 when the engine was created.
#[test]
fn members_never_heard_from_hold_the_window_until_silent() {
    let config = Config {
        send_window: NonZeroU32::new(2),
        ..paper_config()
    };
    let silence = config.flow_silence_timeout;
    let members: Vec<NodeId> = (0..3).map(NodeId).collect();
    let mut e = Pbcast::new(NodeId(0), &members, config, 1, Instant::ZERO).unwrap();
    let now = Instant::ZERO;
    e.multicast(now, Bytes::from_static(b"a")).unwrap();
    e.multicast(now, Bytes::from_static(b"b")).unwrap();
    assert_eq!(
        e.multicast(now, Bytes::from_static(b"c")),
        Err(SendError::WindowFull)
    );
    // Member 1 reports it has both; member 2, never heard from, holds the
    // window.
    let heard = now + silence / 2;
    let status = Packet::Status { source: 0, next: 2 }.to_vec(1).unwrap();
    e.handle_datagram(heard, NodeId(1), &status);
    assert!(!e.can_send(heard));
    // Once member 2 has been silent for the timeout, member 1 alone counts.
    let later = now + silence;
    assert!(e.can_send(later));
    e.multicast(later, Bytes::from_static(b"c")).unwrap();
    e.multicast(later, Bytes::from_static(b"d")).unwrap();
    assert!(!e.can_send(later));
    // And once member 1 is silent too, nobody holds it.
    assert!(e.can_send(heard + silence));
}

/// A joiner's view change: members new to the view are new senders, their
/// logs anchored at 0, while the members it joined keep unanchored logs.
#[test]
fn a_joiner_anchors_members_new_to_a_later_view_at_zero() {
    let members: Vec<NodeId> = (0..3).map(NodeId).collect();
    let mut joiner =
        Pbcast::new_joining(NodeId(2), &members, paper_config(), 1, Instant::ZERO).unwrap();
    let four: Vec<NodeId> = (0..4).map(NodeId).collect();
    joiner.set_members(Instant::ZERO, &four).unwrap();
    // Member 3's message 1 arrives first: message 0 is missing.
    let data = Packet::Data {
        seq: 1,
        payload: b"y",
    }
    .to_vec(3)
    .unwrap();
    joiner.handle_datagram(Instant::ZERO, NodeId(3), &data);
    assert_eq!(joiner.poll_event(), None);
    // Member 0's message 5 is the first the joiner sees of it: delivered.
    let data = Packet::Data {
        seq: 5,
        payload: b"x",
    }
    .to_vec(0)
    .unwrap();
    joiner.handle_datagram(Instant::ZERO, NodeId(0), &data);
    assert!(matches!(
        joiner.poll_event(),
        Some(Event::Deliver { seq: 5, .. })
    ));
    joiner.check_invariants();
}
