//! A site's ring over a simulated LAN in virtual time: multicast reaches
//! each other member independently through a lossy wire, the token is
//! unicast through the same loss, every datagram takes `delay`.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use proptest::prelude::*;

use super::*;

struct Lan {
    members: Vec<Ring>,
    wire: BTreeMap<(Instant, u64), (usize, usize, Bytes)>,
    order: u64,
    loss: f64,
    delay: Duration,
    rng: Xoshiro256PlusPlus,
    now: Instant,
    delivered: Vec<Vec<(u64, NodeId, Bytes)>>,
}

impl Lan {
    fn new(n: u32, loss: f64, seed: u64, config: Config) -> Lan {
        let ids: Vec<NodeId> = (0..n).map(NodeId).collect();
        let members = ids
            .iter()
            .map(|&me| Ring::new(config.clone(), me, &ids, 7, Instant::ZERO).unwrap())
            .collect();
        let mut lan = Lan {
            members,
            wire: BTreeMap::new(),
            order: 0,
            loss,
            delay: Duration::from_micros(100),
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            now: Instant::ZERO,
            delivered: vec![Vec::new(); n as usize],
        };
        for i in 0..n as usize {
            lan.drain(i);
        }
        lan
    }

    fn drain(&mut self, i: usize) {
        while let Some(t) = self.members[i].poll_transmit(self.now) {
            let targets: Vec<usize> = match t.destination {
                Destination::Node(n) => vec![n.0 as usize],
                Destination::Multicast => (0..self.members.len()).filter(|&j| j != i).collect(),
            };
            for j in targets {
                if self.rng.random::<f64>() >= self.loss {
                    self.order += 1;
                    self.wire.insert(
                        (self.now + self.delay, self.order),
                        (i, j, t.payload.clone()),
                    );
                }
            }
        }
        while let Some(Event::Deliver {
            seq,
            sender,
            payload,
        }) = self.members[i].poll_event()
        {
            self.delivered[i].push((seq, sender, payload));
        }
    }

    fn run_until(&mut self, until: Instant, done: impl Fn(&Lan) -> bool) {
        while !done(self) {
            let wire = self.wire.keys().next().map(|k| k.0);
            let timer = self
                .members
                .iter()
                .enumerate()
                .filter_map(|(i, m)| m.poll_timeout().map(|t| (t, i)))
                .min();
            let next = [wire, timer.map(|t| t.0)].into_iter().flatten().min();
            let Some(next) = next.filter(|t| *t <= until) else {
                break;
            };
            self.now = next;
            if wire == Some(next) {
                let (_, (from, to, bytes)) = self.wire.pop_first().expect("due");
                self.members[to].handle_datagram(self.now, NodeId(from as u32), &bytes);
                self.drain(to);
            } else if let Some((_, i)) = timer {
                self.members[i].handle_timeout(self.now);
                self.drain(i);
            }
        }
    }
}

fn payload(member: usize, k: u32) -> Bytes {
    Bytes::from(format!("m{member}-{k}"))
}

/// Every member delivers the same messages in the same order, every
/// message sent is delivered, and each sender's messages keep its order.
fn check_total_order(lan: &Lan, expected: usize) {
    let first = &lan.delivered[0];
    assert_eq!(first.len(), expected);
    for (i, d) in lan.delivered.iter().enumerate() {
        assert_eq!(d, first, "member {i} differs");
    }
    for (k, (seq, _, _)) in first.iter().enumerate() {
        assert_eq!(*seq, k as u64 + 1, "sequence numbers are dense");
    }
    let mut last: BTreeMap<NodeId, u32> = BTreeMap::new();
    for (_, sender, p) in first {
        let k: u32 = std::str::from_utf8(p)
            .unwrap()
            .split('-')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        if let Some(prev) = last.insert(*sender, k) {
            assert!(k > prev, "sender order");
        }
    }
}

fn run(n: u32, per_member: u32, loss: f64, seed: u64) -> Lan {
    let mut lan = Lan::new(n, loss, seed, Config::default());
    for i in 0..n as usize {
        for k in 0..per_member {
            lan.members[i].multicast(lan.now, payload(i, k)).unwrap();
        }
    }
    let expected = (n * per_member) as usize;
    lan.run_until(Instant::ZERO + Duration::from_secs(600), |l| {
        l.delivered.iter().all(|d| d.len() >= expected)
    });
    lan
}

#[test]
fn without_loss_every_member_delivers_everything_in_one_order() {
    let lan = run(4, 100, 0.0, 1);
    check_total_order(&lan, 400);
    assert_eq!(
        lan.members
            .iter()
            .map(|m| m.stats().retransmissions)
            .sum::<u64>(),
        0
    );
}

#[test]
fn total_order_holds_under_loss_across_seeds() {
    let mut tokens_resent = 0;
    for (loss, seeds) in [(0.01, 0..10), (0.05, 10..20), (0.2, 20..25)] {
        for seed in seeds {
            let lan = run(5, 60, loss, seed);
            check_total_order(&lan, 300);
            tokens_resent += lan
                .members
                .iter()
                .map(|m| m.stats().token_retransmissions)
                .sum::<u64>();
        }
    }
    assert!(tokens_resent > 0, "tokens were lost and resent");
}

#[test]
fn the_window_limits_a_rotation() {
    let config = Config {
        window_size: 10,
        max_messages: 8,
        ..Config::default()
    };
    let mut lan = Lan::new(3, 0.0, 1, config);
    for i in 0..3 {
        for k in 0..50 {
            lan.members[i].multicast(lan.now, payload(i, k)).unwrap();
        }
    }
    // One visit sends at most max_messages; a rotation at most about the
    // window: after the first rotation no more than 10 + 8 are out.
    lan.run_until(Instant::ZERO + Duration::from_micros(350), |_| false);
    let out: u64 = lan.members.iter().map(|m| m.stats().multicasts).sum();
    assert!(out <= 18, "{out}");
    lan.run_until(Instant::ZERO + Duration::from_secs(10), |l| {
        l.delivered.iter().all(|d| d.len() >= 150)
    });
    check_total_order(&lan, 150);
}

#[test]
fn delivered_messages_are_forgotten() {
    let lan = run(3, 200, 0.0, 2);
    check_total_order(&lan, 600);
    // Two more rotations would free everything; at most a rotation's worth
    // is still held when the last delivery happens.
    for m in &lan.members {
        assert!(m.held() <= 2 * 50, "{}", m.held());
    }
}

#[test]
fn a_ring_needs_two_members() {
    assert_eq!(
        Ring::new(Config::default(), NodeId(0), &[NodeId(0)], 1, Instant::ZERO).err(),
        Some(RingError::TooFewMembers)
    );
}

proptest! {
    /// Arbitrary datagrams, some shaped as ring packets: no panic, and what
    /// is delivered stays in sequence order.
    #[test]
    fn arbitrary_datagrams_never_break_a_member(datagrams in prop::collection::vec((prop::collection::vec(any::<u8>(), 0..120), 0u8..3), 0..30)) {
        let members = [NodeId(0), NodeId(1), NodeId(2)];
        let mut ring = Ring::new(Config::default(), NodeId(1), &members, 7, Instant::ZERO).unwrap();
        let mut last = 0;
        for (i, (mut d, kind)) in datagrams.into_iter().enumerate() {
            if d.len() >= 12 && kind > 0 {
                d[..4].copy_from_slice(&[0x52, 0x47, 1, kind]);
                d[4..12].copy_from_slice(&7u64.to_be_bytes());
            }
            let now = Instant::ZERO + Duration::from_millis(i as u64 * 7);
            ring.handle_datagram(now, NodeId(0), &d);
            ring.handle_timeout(now);
            while ring.poll_transmit(now).is_some() {}
            while let Some(Event::Deliver { seq, .. }) = ring.poll_event() {
                prop_assert_eq!(seq, last + 1);
                last = seq;
            }
        }
    }
}
