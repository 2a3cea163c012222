//! Daemons finding each other: a small virtual-time network that routes by
//! slot, as the runtime does, with daemons that start late, crash, restart
//! and sleep.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use bytes::Bytes;

use super::*;

const MS: u64 = 1_000_000;

/// (arrival, order, to slot, from id, bytes)
type InFlight = Reverse<(u64, u64, u32, u32, Bytes)>;

struct Harness {
    daemons: Vec<Option<Membership>>,
    /// Slots whose daemon is asleep (receives nothing, fires no timer).
    asleep: Vec<bool>,
    events: Vec<Vec<Event>>,
    queue: BinaryHeap<InFlight>,
    order: u64,
    now: u64,
    config: Config,
    /// Daemons find each other by multicast ([`Membership::discovering`]).
    discovery: bool,
    /// Every PRESENCE sent: (from slot, destination, `member`).
    presence: Vec<(usize, Destination, bool)>,
    /// While set, datagrams between slots on different sides are lost.
    sides: Option<Vec<u8>>,
}

fn config() -> Config {
    let mut config = Config::default();
    config.vsync.view_period = Duration::from_secs(2);
    config.vsync.committee_size = std::num::NonZeroU32::new(3).unwrap();
    config
}

impl Harness {
    fn new(slots: usize) -> Harness {
        Harness {
            daemons: (0..slots).map(|_| None).collect(),
            asleep: vec![false; slots],
            events: vec![Vec::new(); slots],
            queue: BinaryHeap::new(),
            order: 0,
            now: 0,
            config: config(),
            discovery: false,
            presence: Vec::new(),
            sides: None,
        }
    }

    /// A network of all [`MAX_SLOTS`] slots whose daemons, once started,
    /// discover each other: `Destination::Multicast` reaches every slot.
    fn discovering() -> Harness {
        Harness {
            discovery: true,
            ..Harness::new(MAX_SLOTS)
        }
    }

    fn start(&mut self, slot: u32, incarnation: u32) {
        let n = self.daemons.len() as u32;
        let now = Instant::from_nanos(self.now);
        let config = self.config.clone();
        let daemon = if self.discovery {
            Membership::discovering(slot, incarnation, config, 7, now).unwrap()
        } else {
            Membership::new(slot, n, incarnation, config, 7, now).unwrap()
        };
        self.daemons[slot as usize] = Some(daemon);
        self.events[slot as usize].clear();
        self.drain(slot as usize);
    }

    fn crash(&mut self, slot: usize) {
        self.daemons[slot] = None;
    }

    fn daemon(&self, slot: usize) -> &Membership {
        self.daemons[slot].as_ref().expect("running")
    }

    fn drain(&mut self, i: usize) {
        let now = Instant::from_nanos(self.now);
        let Some(d) = self.daemons[i].as_mut() else {
            return;
        };
        let from = d.node_id().0;
        let mut out = Vec::new();
        while let Some(t) = d.poll_transmit(now) {
            out.push(t);
        }
        while let Some(e) = d.poll_event() {
            self.events[i].push(e.event);
        }
        for t in out {
            if let Ok((_, Packet::Presence { member, .. })) = shoal_wire::decode_packet(&t.payload)
            {
                self.presence.push((i, t.destination, member));
            }
            let targets: Vec<u32> = match t.destination {
                Destination::Node(to) => vec![slot_of(to)],
                Destination::Multicast => (0..self.daemons.len() as u32)
                    .filter(|s| *s as usize != i)
                    .collect(),
            };
            for to in targets {
                self.order += 1;
                let at = self.now + MS;
                self.queue
                    .push(Reverse((at, self.order, to, from, t.payload.clone())));
            }
        }
    }

    fn next_timer(&self) -> Option<(u64, usize)> {
        self.daemons
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.asleep[*i])
            .filter_map(|(i, d)| Some((d.as_ref()?.poll_timeout()?.as_nanos(), i)))
            .min()
    }

    fn run_until(&mut self, until_ms: u64) {
        let until = until_ms * MS;
        for step in 0.. {
            assert!(step < 2_000_000, "no progress at {} ns", self.now);
            let datagram = self.queue.peek().map(|Reverse(q)| q.0);
            let timer = self.next_timer();
            let next = [datagram, timer.map(|t| t.0)].into_iter().flatten().min();
            let Some(at) = next.filter(|t| *t <= until) else {
                break;
            };
            self.now = self.now.max(at);
            let now = Instant::from_nanos(self.now);
            if datagram == Some(at) {
                let Reverse((_, _, to, from, bytes)) = self.queue.pop().unwrap();
                let to = to as usize;
                let from_slot = slot_of(NodeId(from)) as usize;
                if self.asleep[to] || self.sides.as_ref().is_some_and(|s| s[to] != s[from_slot]) {
                    continue;
                }
                if let Some(d) = self.daemons[to].as_mut() {
                    d.handle_datagram(now, NodeId(from), &bytes);
                    self.drain(to);
                }
            } else if let Some((_, i)) = timer {
                self.daemons[i].as_mut().unwrap().handle_timeout(now);
                self.drain(i);
            }
        }
        self.now = self.now.max(until);
    }

    /// Every running daemon's view members, by slot.
    fn views(&self) -> Vec<Option<Vec<NodeId>>> {
        self.daemons
            .iter()
            .map(|d| d.as_ref().map(|d| d.vsync().members().to_vec()))
            .collect()
    }

    fn assert_one_group_of(&self, slots: &[usize]) {
        let first = self.daemon(slots[0]).vsync().members().to_vec();
        let mut in_view: Vec<usize> = first.iter().map(|m| slot_of(*m) as usize).collect();
        in_view.sort_unstable();
        assert_eq!(in_view, slots, "views: {:?}", self.views());
        for s in slots {
            let d = self.daemon(*s);
            assert!(d.is_member(), "slot {s} not a member: {:?}", self.views());
            assert_eq!(
                d.vsync().members(),
                first.as_slice(),
                "views: {:?}",
                self.views()
            );
            assert!(first.contains(&d.node_id()));
        }
    }

    fn delivered(&self, slot: usize) -> Vec<(NodeId, Bytes)> {
        self.events[slot]
            .iter()
            .filter_map(|e| match e {
                Event::Deliver {
                    sender, payload, ..
                } => Some((*sender, payload.clone())),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn daemons_started_together_form_one_group_founded_by_the_lowest_slot() {
    let mut h = Harness::new(3);
    for slot in 0..3 {
        h.start(slot, 100 + slot);
    }
    h.run_until(6_000);
    h.assert_one_group_of(&[0, 1, 2]);
    let founded: Vec<u64> = (0..3).map(|s| h.daemon(s).stats().founded).collect();
    assert_eq!(founded, vec![1, 0, 0]);
}

#[test]
fn a_late_daemon_joins_the_running_group_instead_of_founding_its_own() {
    let mut h = Harness::new(3);
    h.start(2, 5);
    h.run_until(5_000);
    assert!(h.daemon(2).is_member(), "a lone daemon founds a group");
    h.start(0, 6);
    h.start(1, 7);
    h.run_until(12_000);
    h.assert_one_group_of(&[0, 1, 2]);
    assert_eq!(h.daemon(0).stats().founded, 0);
    assert_eq!(h.daemon(1).stats().founded, 0);
}

#[test]
fn a_crashed_daemon_is_dropped_and_rejoins_under_a_new_id_when_restarted() {
    let mut h = Harness::new(3);
    for slot in 0..3 {
        h.start(slot, 1);
    }
    h.run_until(6_000);
    h.assert_one_group_of(&[0, 1, 2]);
    let old = h.daemon(1).node_id();
    h.crash(1);
    h.run_until(12_000);
    h.assert_one_group_of(&[0, 2]);
    h.start(1, 2);
    h.run_until(20_000);
    h.assert_one_group_of(&[0, 1, 2]);
    let new = h.daemon(1).node_id();
    assert_ne!(old, new);
    assert!(!h.daemon(0).vsync().members().contains(&old));
}

#[test]
fn the_primary_crashing_leaves_a_working_group() {
    let mut h = Harness::new(3);
    for slot in 0..3 {
        h.start(slot, 1);
    }
    h.run_until(5_000);
    // The view after the joins made the established members backups (well
    // before the first periodic view at about 5.3 s).
    let committee = h.events[1].iter().rev().find_map(|e| match e {
        Event::View(v) => Some(v.committee.clone()),
        _ => None,
    });
    assert_eq!(committee.map(|c| c.len()), Some(3));
    h.crash(0);
    h.run_until(20_000);
    h.assert_one_group_of(&[1, 2]);
    let now = Instant::from_nanos(h.now);
    h.daemons[1]
        .as_mut()
        .unwrap()
        .multicast(now, Bytes::from_static(b"after"))
        .unwrap();
    h.drain(1);
    h.run_until(22_000);
    for s in [1, 2] {
        assert!(h.delivered(s).iter().any(|(_, p)| &p[..] == b"after"));
    }
}

#[test]
fn an_evicted_daemon_comes_back_under_its_next_incarnation() {
    let mut h = Harness::new(3);
    for slot in 0..3 {
        h.start(slot, 1);
    }
    h.run_until(6_000);
    let old = h.daemon(2).node_id();
    h.asleep[2] = true;
    h.run_until(10_000);
    h.assert_one_group_of(&[0, 1]);
    h.asleep[2] = false;
    h.run_until(20_000);
    h.assert_one_group_of(&[0, 1, 2]);
    assert_eq!(h.daemon(2).stats().rejoins, 1);
    assert_eq!(h.daemon(2).node_id(), daemon_id(2, 2));
    assert_ne!(h.daemon(2).node_id(), old);
    assert!(h.events[2].iter().any(|e| matches!(
        e,
        Event::Removed {
            reason: RemovedReason::Dropped,
            ..
        }
    )));
}

#[test]
fn members_deliver_the_same_messages_in_the_same_order() {
    let mut h = Harness::new(3);
    for slot in 0..3 {
        h.start(slot, 1);
    }
    h.run_until(6_000);
    for round in 0..20u8 {
        for s in 0..3 {
            let now = Instant::from_nanos(h.now);
            let d = h.daemons[s].as_mut().unwrap();
            if d.multicast(now, Bytes::from(vec![s as u8, round])).is_ok() {
                h.drain(s);
            }
        }
        h.run_until(6_000 + u64::from(round) * 10);
    }
    h.run_until(9_000);
    let first = h.delivered(0);
    assert_eq!(first.len(), 60);
    for s in 1..3 {
        assert_eq!(h.delivered(s), first);
    }
}

#[test]
fn ids_carry_slot_and_incarnation() {
    let id = daemon_id(5, 77);
    assert_eq!(slot_of(id), 5);
    assert_eq!(id.0 >> SLOT_BITS, 77);
    assert_eq!(slot_of(daemon_id(3, u32::MAX)), 3);
}

#[test]
fn daemons_discovering_each_other_by_multicast_form_one_group() {
    // Slots far apart in a space of 256: no daemon knows which are running.
    let mut h = Harness::discovering();
    for (slot, incarnation) in [(40, 1), (5, 2), (201, 3)] {
        h.start(slot, incarnation);
    }
    h.run_until(6_000);
    h.assert_one_group_of(&[5, 40, 201]);
    let founded: Vec<u64> = [5, 40, 201]
        .iter()
        .map(|s| h.daemon(*s).stats().founded)
        .collect();
    assert_eq!(founded, vec![1, 0, 0], "the lowest slot founds");
    // Joiners announced themselves to the group only; members answered
    // each joiner by unicast (and probed the group for other groups, once
    // per `merge_probe_interval` each).
    let announced = h.presence.iter().filter(|(_, _, member)| !member);
    assert!(announced
        .clone()
        .all(|(_, to, _)| *to == Destination::Multicast));
    assert!(announced.count() >= 3);
    let answers = h
        .presence
        .iter()
        .filter(|(_, to, member)| *member && matches!(to, Destination::Node(_)));
    assert!(answers.count() > 0);
    let probes = h
        .presence
        .iter()
        .filter(|(_, to, member)| *member && *to == Destination::Multicast);
    // Only the lowest slot probes: at most one a second of membership.
    let probes: Vec<_> = probes.collect();
    assert!(probes.iter().all(|(from, _, _)| *from == 5), "{probes:?}");
    assert!(probes.len() <= 6);
    assert!(h.daemon(5).is_discovering());
}

#[test]
fn a_late_discovering_daemon_joins_and_the_group_delivers_in_one_order() {
    let mut h = Harness::discovering();
    h.start(9, 1);
    h.start(3, 1);
    h.run_until(5_000);
    h.assert_one_group_of(&[3, 9]);
    h.start(0, 1);
    h.run_until(10_000);
    h.assert_one_group_of(&[0, 3, 9]);
    assert_eq!(h.daemon(0).stats().founded, 0, "joined, did not found");
    for (i, s) in [0usize, 3, 9].into_iter().enumerate() {
        let now = Instant::from_nanos(h.now);
        h.daemons[s]
            .as_mut()
            .unwrap()
            .multicast(now, Bytes::from(vec![i as u8]))
            .unwrap();
        h.drain(s);
    }
    h.run_until(12_000);
    let first = h.delivered(0);
    assert_eq!(first.len(), 3);
    for s in [3, 9] {
        assert_eq!(h.delivered(s), first);
    }
}

#[test]
fn a_discovering_daemon_announces_once_per_interval_to_the_group() {
    let config = config();
    let interval = config.presence_interval;
    let mut d = Membership::discovering(7, 1, config, 7, Instant::from_nanos(0)).unwrap();
    let mut now = Instant::from_nanos(0);
    for round in 0..4 {
        d.handle_timeout(now);
        let sent: Vec<Transmit> = std::iter::from_fn(|| d.poll_transmit(now)).collect();
        assert_eq!(sent.len(), 1, "round {round}: {sent:?}");
        assert_eq!(sent[0].destination, Destination::Multicast);
        now += interval;
    }
    assert_eq!(d.stats().presence_sent, 4);
    assert!(!d.is_member());
}

#[test]
fn a_static_daemon_still_announces_to_every_peer_slot() {
    let mut d = Membership::new(1, 4, 1, config(), 7, Instant::from_nanos(0)).unwrap();
    let now = Instant::from_nanos(0);
    d.handle_timeout(now);
    let to: Vec<Destination> = std::iter::from_fn(|| d.poll_transmit(now))
        .map(|t| t.destination)
        .collect();
    let peers = [0, 2, 3].map(|s| Destination::Node(NodeId(s)));
    assert_eq!(to, peers);
    assert!(!d.is_discovering());
}

/// A partition at start-up: {0, 1, 2} and {3, 4} each form a group. Once it
/// heals, the smaller group's members hear the larger's probes and join it,
/// each once, under a new incarnation; the larger group's members stay.
#[test]
fn groups_formed_apart_merge_into_the_larger_once_the_partition_heals() {
    let mut h = Harness::new(5);
    h.sides = Some(vec![0, 0, 0, 1, 1]);
    for slot in 0..5 {
        h.start(slot, 1);
    }
    h.run_until(6_000);
    h.assert_one_group_of(&[0, 1, 2]);
    h.assert_one_group_of(&[3, 4]);
    h.sides = None;
    h.run_until(16_000);
    h.assert_one_group_of(&[0, 1, 2, 3, 4]);
    for slot in 0..5 {
        let merges = h.daemon(slot).stats().merges;
        assert_eq!(merges, u64::from(slot >= 3), "slot {slot}");
    }
    for slot in [3, 4] {
        let removed = h.events[slot].iter().any(|e| {
            matches!(
                e,
                Event::Removed {
                    reason: RemovedReason::Dropped,
                    ..
                }
            )
        });
        assert!(removed, "slot {slot} was not told it left its group");
        assert_eq!(h.daemon(slot).node_id(), daemon_id(slot as u32, 2));
    }
}

/// Two groups of two: the one holding the lower slot wins the tie.
#[test]
fn of_two_groups_of_one_size_the_one_with_the_lowest_slot_absorbs_the_other() {
    let mut h = Harness::new(4);
    h.sides = Some(vec![1, 0, 1, 0]);
    for slot in 0..4 {
        h.start(slot, 1);
    }
    h.run_until(6_000);
    h.assert_one_group_of(&[0, 2]);
    h.assert_one_group_of(&[1, 3]);
    h.sides = None;
    h.run_until(16_000);
    h.assert_one_group_of(&[0, 1, 2, 3]);
    let merged: Vec<u64> = (0..4).map(|s| h.daemon(s).stats().merges).collect();
    assert_eq!(merged, [0, 1, 0, 1]);
}

/// With discovery the probes go to the group; the same merge follows.
#[test]
fn discovering_groups_formed_apart_merge_too() {
    let mut h = Harness::discovering();
    let mut sides = vec![0; MAX_SLOTS];
    sides[9] = 1;
    h.sides = Some(sides);
    for slot in [3, 9, 30] {
        h.start(slot, 1);
    }
    h.run_until(6_000);
    h.assert_one_group_of(&[3, 30]);
    h.assert_one_group_of(&[9]);
    h.sides = None;
    h.run_until(16_000);
    h.assert_one_group_of(&[3, 9, 30]);
    assert_eq!(h.daemon(9).stats().merges, 1);
}

/// Two daemons, one crashes: the survivor's group cannot install a view
/// (a majority of two is two), so after `view_period + partition_grace`
/// without one it leaves it and founds a group of its own, without the
/// quorum under the default policy. The restarted daemon joins it.
#[test]
fn of_two_daemons_the_survivor_of_a_crash_goes_on_and_the_restarted_one_rejoins() {
    let mut h = Harness::new(2);
    h.start(0, 1);
    h.start(1, 1);
    h.run_until(6_000);
    h.assert_one_group_of(&[0, 1]);
    assert!(h.daemon(0).holds_quorum(2));
    h.crash(1);
    // view_period 2 s + grace 5 s after the last view, then founding (2 s).
    h.run_until(20_000);
    h.assert_one_group_of(&[0]);
    assert_eq!(h.daemon(0).stats().partitions, 1);
    assert!(!h.daemon(0).holds_quorum(1), "one of two is no majority");
    h.start(1, 2);
    h.run_until(30_000);
    h.assert_one_group_of(&[0, 1]);
    // The group goes on delivering.
    let before = h.delivered(1).len();
    let now = Instant::from_nanos(h.now);
    h.daemons[0]
        .as_mut()
        .unwrap()
        .multicast(now, Bytes::from_static(b"after"))
        .unwrap();
    h.drain(0);
    h.run_until(32_000);
    assert_eq!(h.delivered(1).len(), before + 1);
}

/// With `two_node`, one daemon of two holds the quorum.
#[test]
fn two_node_gives_a_lone_daemon_of_two_the_quorum() {
    let mut h = Harness::new(2);
    h.config.two_node = true;
    h.start(0, 1);
    assert!(h.daemon(0).holds_quorum(1));
    let mut h = Harness::new(3);
    h.config.two_node = true;
    h.start(0, 1);
    assert!(
        !h.daemon(0).holds_quorum(1),
        "two_node applies to two expected votes only"
    );
    assert!(h.daemon(0).holds_quorum(2));
}

/// A 3/2 partition of one group: the majority side goes on in the old
/// group, the minority side, whose views stop, forms its own group and goes
/// on too; once the partition heals the two merge into one.
#[test]
fn both_sides_of_a_partition_go_on_and_merge_when_it_heals() {
    let mut h = Harness::new(5);
    for slot in 0..5 {
        h.start(slot, 1);
    }
    h.run_until(6_000);
    h.assert_one_group_of(&[0, 1, 2, 3, 4]);
    h.sides = Some(vec![0, 0, 0, 1, 1]);
    h.run_until(25_000);
    h.assert_one_group_of(&[0, 1, 2]);
    h.assert_one_group_of(&[3, 4]);
    for slot in [3, 4] {
        assert!(h.daemon(slot).stats().partitions >= 1, "slot {slot}");
        assert!(!h.daemon(slot).holds_quorum(2));
    }
    assert!(h.daemon(0).holds_quorum(3));
    h.sides = None;
    h.run_until(40_000);
    h.assert_one_group_of(&[0, 1, 2, 3, 4]);
}

/// A primary of another group asks a member of its view that has since
/// restarted (datagrams go by slot, so the new incarnation gets it) to
/// promise a view change far ahead. The member ignores it: had it promised,
/// it would refuse its own primary's every later view change, and its group,
/// installing no view, would be taken as lost after `partition_grace`
/// (this test fails so without the filter).
#[test]
fn a_member_ignores_another_groups_proposals() {
    use shoal_wire::vsync::Message;
    let mut h = Harness::new(3);
    h.start(0, 1);
    h.start(1, 1);
    h.run_until(4_000);
    h.assert_one_group_of(&[0, 1]);
    let view = h.daemon(1).vsync().view_id();
    let foreign = daemon_id(2, 1);
    let mut datagram = Vec::new();
    for body in [
        Message::Prefreshview {
            // Past the next view: a promise for the very view proposed would
            // be answered with OUTRANKED, and the primary would outbid it.
            view: view + 5,
            epoch: u64::MAX / 2,
        },
        Message::Progress { next: 0 },
    ] {
        let body = body.to_vec().unwrap();
        Packet::Vsync { body: &body }
            .encode(foreign.0, &mut datagram)
            .unwrap();
    }
    h.order += 1;
    h.queue.push(Reverse((
        h.now + MS,
        h.order,
        1,
        foreign.0,
        Bytes::from(datagram),
    )));
    // Well past view_period (2 s) + partition_grace (5 s), several times.
    h.run_until(30_000);
    h.assert_one_group_of(&[0, 1]);
    for slot in [0, 1] {
        assert_eq!(h.daemon(slot).stats().partitions, 0, "slot {slot}");
        assert_eq!(h.daemon(slot).stats().rejoins, 0, "slot {slot}");
    }
    assert!(
        h.daemon(1).vsync().view_id() > view + 3,
        "views went on: {} after {view}",
        h.daemon(1).vsync().view_id()
    );
    assert_eq!(h.daemon(1).stats().foreign_proposals_ignored, 1);
}

#[test]
fn a_sequence_ack_meant_for_an_earlier_incarnation_names_no_message_of_this_one() {
    use shoal_wire::vsync::Message;
    let mut h = Harness::new(2);
    h.start(0, 1);
    h.start(1, 2);
    h.run_until(4_000);
    h.assert_one_group_of(&[0, 1]);
    let primary = h.daemon(1).vsync().committee()[0];
    assert_eq!(primary, h.daemon(0).node_id());
    let view = h.daemon(1).vsync().view_id();
    let now = Instant::from_nanos(h.now);
    let d1 = h.daemons[1].as_mut().unwrap();
    let local = d1.multicast(now, Bytes::from_static(b"mine")).unwrap();
    // Slot 1's earlier life (incarnation 1) asked for a sequence number
    // for its first multicast, and the committee answers only now: routed
    // by slot, the ack reaches incarnation 2, whose first multicast is
    // still waiting for its own.
    let earlier = daemon_id(1, 1);
    let ack = Message::GseqAck {
        local_id: vsync::first_local_id(earlier),
        gseq: 1_000,
        view,
    };
    let body = ack.to_vec().unwrap();
    let mut datagram = Vec::new();
    Packet::Vsync { body: &body }
        .encode(primary.0, &mut datagram)
        .unwrap();
    d1.handle_datagram(now, primary, &datagram);
    assert!(
        d1.vsync().awaits_sequence(local),
        "incarnation 2 took the ack for its own multicast {local}"
    );
    h.drain(1);
    h.run_until(6_000);
    for slot in [0, 1] {
        let mine: Vec<u64> = h.events[slot]
            .iter()
            .filter_map(|e| match e {
                Event::Deliver { payload, gseq, .. } if &payload[..] == b"mine" => Some(*gseq),
                _ => None,
            })
            .collect();
        assert_eq!(mine.len(), 1, "slot {slot} delivered it at {mine:?}");
    }
}

#[test]
fn a_member_ignores_a_view_from_another_group() {
    use shoal_wire::vsync::{Entry, Message, NewView};
    let mut h = Harness::new(3);
    h.start(0, 1);
    h.start(1, 1);
    h.run_until(4_000);
    h.assert_one_group_of(&[0, 1]);
    let members = h.daemon(1).vsync().members().to_vec();
    // Another group's primary (slot 2) admits slot 1 on a JOIN it sent
    // before it joined this group: the welcome names the gseq slot 1's own
    // group comes to next.
    let foreign = daemon_id(2, 1);
    let me = h.daemon(1).node_id();
    let mut list = vec![foreign.0, me.0];
    list.sort_unstable();
    let welcome = Message::Entry {
        gseq: h.daemon(1).vsync().next_gseq(),
        entry: Entry::Newview(NewView {
            view: h.daemon(1).vsync().view_id() + 1,
            epoch: 0,
            members: list,
            committee: vec![foreign.0],
            left: Vec::new(),
            reasons: shoal_wire::vsync::REASON_JOIN,
        }),
    };
    let body = welcome.to_vec().unwrap();
    let mut datagram = Vec::new();
    Packet::Vsync { body: &body }
        .encode(foreign.0, &mut datagram)
        .unwrap();
    let now = Instant::from_nanos(h.now);
    h.daemons[1]
        .as_mut()
        .unwrap()
        .handle_datagram(now, foreign, &datagram);
    h.drain(1);
    assert_eq!(h.daemon(1).stats().foreign_views_ignored, 1);
    h.run_until(12_000);
    h.assert_one_group_of(&[0, 1]);
    assert_eq!(h.daemon(1).vsync().members(), members.as_slice());
    for slot in [0, 1] {
        assert_eq!(h.daemon(slot).stats().rejoins, 0, "slot {slot}");
        assert_eq!(h.daemon(slot).stats().partitions, 0, "slot {slot}");
    }
    let foreign_views = h.events[1]
        .iter()
        .filter(|e| matches!(e, Event::View(v) if v.members.contains(&foreign)))
        .count();
    assert_eq!(foreign_views, 0, "slot 1 installed the other group's view");
}

/// Two daemons, the primary stops gracefully: the Newview that lets it go
/// names the other as its successor, and only the leaving primary can send
/// it. It must leave before the daemon turns inert: withheld, the successor
/// never installed that view, took over with it as an uncommitted
/// candidate and asked the old two-member view, whose majority needs the
/// daemon that left, until `view_period + partition_grace` ran out (swarm
/// seeds 4607 and 7910; this test fails so without the fix).
#[test]
fn of_two_daemons_the_primary_stopping_hands_the_group_to_the_other_at_once() {
    let mut h = Harness::new(2);
    h.start(0, 1);
    h.start(1, 1);
    h.run_until(6_000);
    h.assert_one_group_of(&[0, 1]);
    assert!(h.daemon(0).vsync().is_primary());
    let survivor = h.daemon(1).node_id();
    let now = Instant::from_nanos(h.now);
    h.daemons[0].as_mut().unwrap().leave(now);
    h.drain(0);
    let left_at = h.now;
    // The leave's view change takes `change_delay` and an `ack_wait` (1 s),
    // phase 2 a few ms; well within 2 s, and far from 2 s + 5 s.
    h.run_until(left_at / MS + 2_000);
    let left = h.events[0].iter().any(|e| {
        matches!(
            e,
            Event::Removed {
                reason: RemovedReason::Left,
                ..
            }
        )
    });
    assert!(left, "the primary left: {:?}", h.events[0]);
    h.crash(0);
    assert_eq!(h.daemon(1).vsync().members(), &[survivor]);
    assert!(h.daemon(1).vsync().is_primary());
    // And it goes on: views keep coming, no partition is declared.
    h.run_until(left_at / MS + 12_000);
    assert!(h.daemon(1).is_member());
    assert_eq!(h.daemon(1).node_id(), survivor);
    assert_eq!(h.daemon(1).stats().partitions, 0);
    assert_eq!(h.daemon(1).stats().rejoins, 0);
}

/// Four daemons in one group, with a `partition_grace` (60 s) no test
/// below reaches, so that only the rule of a majority gone can break it up.
fn four_in_one_group_with_a_long_grace() -> Harness {
    let mut h = Harness::new(4);
    h.config.partition_grace = Duration::from_secs(60);
    for slot in 0..4 {
        h.start(slot, 1);
    }
    h.run_until(6_000);
    h.assert_one_group_of(&[0, 1, 2, 3]);
    h
}

/// Two of a view of four restart: the two left can never gather the old
/// view's majority a view change needs, so they leave at once (once each
/// successor was heard for `2 × merge_probe_interval`) rather than after
/// `view_period + partition_grace`, and all four form one group again.
#[test]
fn members_leave_a_view_whose_majority_came_back_under_new_ids() {
    let mut h = four_in_one_group_with_a_long_grace();
    h.crash(2);
    h.crash(3);
    h.start(2, 2);
    h.start(3, 2);
    h.run_until(12_000);
    h.assert_one_group_of(&[0, 1, 2, 3]);
    assert_eq!(h.daemon(0).stats().majorities_gone, 1);
    assert_eq!(h.daemon(1).stats().majorities_gone, 1);
}

/// One of a view of four restarting leaves a majority that drops it at the
/// next view change: nobody leaves on its account.
#[test]
fn one_restarted_member_of_four_does_not_break_up_the_group() {
    let mut h = four_in_one_group_with_a_long_grace();
    h.crash(3);
    h.start(3, 2);
    h.run_until(14_000);
    h.assert_one_group_of(&[0, 1, 2, 3]);
    for slot in 0..4 {
        assert_eq!(h.daemon(slot).stats().majorities_gone, 0);
        assert_eq!(h.daemon(slot).stats().partitions, 0);
    }
}

/// Daemons 2 and 3 of a view of four fall silent, and daemons 0 and 1 hear
/// them, under the ids the view lists, as members of a group whose view
/// ids are `view_of_theirs` (a joiner two groups admitted installed the
/// other's view: swarm seed 281 of the harshest shape). Returns daemons 0
/// and 1's counts of majorities gone.
fn two_of_four_heard_as_members_of(view_of_theirs: impl Fn(u64) -> u64) -> (u64, u64) {
    let mut h = four_in_one_group_with_a_long_grace();
    h.asleep[2] = true;
    h.asleep[3] = true;
    let listed: Vec<NodeId> = h.daemon(0).vsync().members().to_vec();
    for t in (6_100..12_000u64).step_by(100) {
        h.run_until(t);
        let ours = h.daemon(0).vsync().view_id();
        for from in listed.iter().filter(|m| slot_of(**m) >= 2) {
            let presence = Packet::Presence {
                member: true,
                view: view_of_theirs(ours),
                size: 3,
                lowest: 2,
            };
            let bytes = Bytes::from(presence.to_vec(from.0).unwrap());
            for to in [0u32, 1] {
                h.order += 1;
                let item = (h.now + MS, h.order, to, from.0, bytes.clone());
                h.queue.push(Reverse(item));
            }
        }
    }
    let gone = |slot| h.daemon(slot).stats().majorities_gone;
    (gone(0), gone(1))
}

/// Fix 50: members of a view of four, two of whose daemons are heard as
/// members of another group, leave at once (as when they restart under
/// new ids) rather than after `view_period + partition_grace`. A listed
/// daemon heard as a member of this very group does not count.
#[test]
fn members_leave_a_view_whose_majority_is_in_another_group() {
    let other_group = |ours: u64| ours ^ (1 << 41);
    assert_eq!(two_of_four_heard_as_members_of(other_group), (1, 1));
    let this_group = |ours: u64| ours;
    assert_eq!(two_of_four_heard_as_members_of(this_group), (0, 0));
}
