//! Two link ends over a simulated wire in virtual time: delay, seeded
//! loss per direction, and a filter that drops chosen datagrams.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::tcp::{TcpConfig, TcpLink};
use super::*;

type Filter = Box<dyn FnMut(usize, &[u8]) -> bool>;

struct Pipe<L> {
    ends: [L; 2],
    delay: Duration,
    loss: [f64; 2],
    rng: Xoshiro256PlusPlus,
    wire: BTreeMap<(Instant, u64), (usize, Vec<u8>)>,
    order: u64,
    now: Instant,
    /// Per receiving end: (arrival time, payload, recovered).
    delivered: [Vec<(Instant, Bytes, bool)>; 2],
    failed: [bool; 2],
    /// Called with (sending end, datagram); true drops it.
    drop: Option<Filter>,
    sent: [u64; 2],
}

impl<L: LinkProtocol> Pipe<L> {
    fn new(ends: [L; 2], delay_ms: u64, loss: f64, seed: u64) -> Pipe<L> {
        Pipe {
            ends,
            delay: Duration::from_millis(delay_ms),
            loss: [loss; 2],
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            wire: BTreeMap::new(),
            order: 0,
            now: Instant::ZERO,
            delivered: [Vec::new(), Vec::new()],
            failed: [false; 2],
            drop: None,
            sent: [0; 2],
        }
    }

    fn send(&mut self, from: usize, payload: &[u8]) {
        self.ends[from]
            .send(self.now, Bytes::copy_from_slice(payload))
            .unwrap();
        self.drain(from);
    }

    fn drain(&mut self, at: usize) {
        while let Some(d) = self.ends[at].poll_transmit(self.now) {
            self.sent[at] += 1;
            let dropped = self.drop.as_mut().is_some_and(|f| f(at, &d));
            if !dropped && self.rng.random::<f64>() >= self.loss[at] {
                self.order += 1;
                self.wire
                    .insert((self.now + self.delay, self.order), (1 - at, d));
            }
        }
        while let Some(ev) = self.ends[at].poll_event() {
            match ev {
                Event::Deliver { payload, recovered } => {
                    self.delivered[at].push((self.now, payload, recovered))
                }
                Event::LinkFailed => self.failed[at] = true,
            }
        }
    }

    fn run_until(&mut self, until: Instant) {
        loop {
            let wire = self.wire.keys().next().map(|k| k.0);
            let timers = [0, 1].map(|i| self.ends[i].poll_timeout());
            let next = [wire, timers[0], timers[1]].into_iter().flatten().min();
            let Some(next) = next.filter(|t| *t <= until) else {
                break;
            };
            self.now = self.now.max(next);
            if wire == Some(next) {
                let (_, (to, d)) = self.wire.pop_first().expect("due");
                self.ends[to].handle_datagram(self.now, &d);
                self.drain(to);
            }
            for (i, timer) in timers.into_iter().enumerate() {
                if timer == Some(next) {
                    self.ends[i].handle_timeout(self.now);
                }
                self.drain(i);
            }
        }
        self.now = until;
    }
}

fn ms(x: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(x)
}

fn hop_pair(config: Config) -> [Hop; 2] {
    [0, 1].map(|_| Hop::new(config.clone(), 7, Instant::ZERO).unwrap())
}

fn msg(i: u32) -> Vec<u8> {
    let mut m = i.to_be_bytes().to_vec();
    m.resize(1000, i as u8);
    m
}

fn ids(d: &[(Instant, Bytes, bool)]) -> Vec<u32> {
    d.iter()
        .map(|(_, p, _)| u32::from_be_bytes(p[..4].try_into().unwrap()))
        .collect()
}

#[test]
fn without_loss_every_message_arrives_once_in_order_with_no_nack() {
    let mut p = Pipe::new(hop_pair(Config::default()), 20, 0.0, 1);
    for i in 0..100 {
        p.send(0, &msg(i));
    }
    p.run_until(ms(2000));
    assert_eq!(ids(&p.delivered[1]), (0..100).collect::<Vec<_>>());
    let (s, r) = (p.ends[0].stats(), p.ends[1].stats());
    assert_eq!((s.retransmissions, r.nacks_sent, r.duplicates), (0, 0, 0));
    assert_eq!(
        p.ends[0].outstanding(),
        0,
        "cumulative ACKs freed the buffer"
    );
}

#[test]
fn a_gap_does_not_hold_back_later_packets() {
    let mut p = Pipe::new(hop_pair(Config::default()), 50, 0.0, 1);
    // Drop link packet 2 the first time only.
    let mut dropped = false;
    p.drop = Some(Box::new(move |from, d| {
        let drop = from == 0 && !dropped && matches!(wire_first_data(d), Some(2));
        dropped |= drop;
        drop
    }));
    for i in 0..3 {
        p.send(0, &msg(i));
    }
    p.run_until(ms(1000));
    assert_eq!(ids(&p.delivered[1]), vec![0, 2, 1]);
    let arrival = |k: usize| p.delivered[1][k].0;
    assert_eq!(arrival(1), arrival(0), "packet 3 is handed up on arrival");
    assert!(p.delivered[1][2].2, "packet 2 is marked recovered");
    // Recovered after nack_delay and one round trip.
    let recovery = arrival(2) - arrival(0);
    assert!(
        recovery >= Duration::from_millis(110) && recovery < Duration::from_millis(130),
        "{recovery:?}"
    );
}

#[test]
fn a_message_is_in_custody_until_the_peer_acknowledges_its_ticket() {
    let mut p = Pipe::new(hop_pair(Config::default()), 50, 0.0, 1);
    // Link packet 2 is lost once: it stays in the sender's custody until
    // recovered, while later ones arrive.
    let mut dropped = false;
    p.drop = Some(Box::new(move |from, d| {
        let drop = from == 0 && !dropped && matches!(wire_first_data(d), Some(2));
        dropped |= drop;
        drop
    }));
    assert_eq!(p.ends[0].accepted(), 0);
    for i in 0..3 {
        p.send(0, &msg(i));
        assert_eq!(
            p.ends[0].accepted(),
            u64::from(i) + 1,
            "ticket of message {i}"
        );
    }
    // Packets 1 and 3 arrived (at 50 ms); packet 2 is NACKed after 10 ms
    // and recovered a round trip later.
    p.run_until(ms(100));
    assert_eq!(ids(&p.delivered[1]), vec![0, 2]);
    assert!(p.ends[0].acknowledged() < 2, "ticket 2 still in custody");
    p.run_until(ms(1000));
    assert_eq!(ids(&p.delivered[1]), vec![0, 2, 1]);
    assert_eq!(p.ends[0].acknowledged(), 3, "every ticket acknowledged");
}

fn wire_first_data(d: &[u8]) -> Option<u64> {
    let (_, items) = shoal_wire::hop::decode(d).ok()?;
    items.iter().find_map(|i| match i {
        shoal_wire::hop::Item::Data { seq, .. } => Some(*seq),
        _ => None,
    })
}

#[test]
fn a_lost_tail_is_found_by_the_sender_ack() {
    let mut p = Pipe::new(hop_pair(Config::default()), 20, 0.0, 1);
    let mut dropped = false;
    p.drop = Some(Box::new(move |from, d| {
        let drop = from == 0 && !dropped && wire_first_data(d) == Some(5);
        dropped |= drop;
        drop
    }));
    for i in 0..5 {
        p.send(0, &msg(i));
    }
    p.run_until(ms(1000));
    assert_eq!(ids(&p.delivered[1]), vec![0, 1, 2, 3, 4]);
    assert_eq!(p.ends[0].stats().retransmissions, 1);
}

#[test]
fn heavy_loss_both_ways_delivers_everything_exactly_once() {
    for seed in 0..5 {
        let mut p = Pipe::new(hop_pair(Config::default()), 30, 0.2, seed);
        for i in 0..300 {
            p.send(0, &msg(i));
            p.send(1, &msg(1000 + i));
        }
        p.run_until(ms(60_000));
        let mut got = ids(&p.delivered[1]);
        got.sort_unstable();
        assert_eq!(got, (0..300).collect::<Vec<_>>(), "seed {seed}");
        let mut back = ids(&p.delivered[0]);
        back.sort_unstable();
        assert_eq!(back, (1000..1300).collect::<Vec<_>>(), "seed {seed}");
        assert!(p.ends[1].stats().duplicates <= p.ends[0].stats().retransmissions);
        assert!(!p.failed[0] && !p.failed[1], "seed {seed}");
    }
}

#[test]
fn the_leaky_bucket_paces_data() {
    let config = Config {
        rate_bps: 800_000, // 100 bytes per ms
        burst_bytes: 2000,
        ..Config::default()
    };
    let mut p = Pipe::new(hop_pair(config), 10, 0.0, 1);
    for i in 0..101 {
        p.send(0, &msg(i));
    }
    p.run_until(ms(5000));
    // 1015-byte datagrams at 100 bytes/ms after a 2000-byte burst: the
    // hundredth after the first leaves about 1015 ms later.
    let first = p.delivered[1][0].0;
    let last = p.delivered[1][100].0;
    let span = (last - first).as_secs_f64() * 1e3;
    assert!((990.0..=1030.0).contains(&span), "{span} ms");
}

#[test]
fn the_window_holds_new_data_but_not_retransmissions() {
    let config = Config {
        window_packets: std::num::NonZeroU32::new(10).unwrap(),
        ..Config::default()
    };
    let mut p = Pipe::new(hop_pair(config), 10, 0.0, 1);
    // The receiver's datagrams never arrive: no ACK frees the window.
    p.drop = Some(Box::new(|from, _| from == 1));
    for i in 0..50 {
        p.send(0, &msg(i));
    }
    p.run_until(ms(1000));
    assert_eq!(p.ends[0].outstanding(), 10);
    assert_eq!(p.delivered[1].len(), 10);
    assert_eq!(p.ends[0].queued(), 40);
    // A NACK for packet 3 (and no ACK): it is resent although the window
    // is full, and nothing new goes with it.
    let sender = &mut p.ends[0];
    let nack = shoal_wire::hop::encode(
        7,
        &[shoal_wire::hop::Item::Nack {
            ranges: vec![(3, 3)],
        }],
    )
    .unwrap();
    let now = ms(1001);
    sender.handle_datagram(now, &nack);
    let mut seqs = Vec::new();
    while let Some(d) = sender.poll_transmit(now) {
        seqs.extend(wire_first_data(&d));
    }
    assert_eq!(seqs, vec![3]);
    assert_eq!(sender.outstanding(), 10);
    assert_eq!(sender.stats().retransmissions, 1);
}

#[test]
fn too_many_nacks_declare_the_link_failed() {
    let config = Config {
        max_nacks: std::num::NonZeroU32::new(3).unwrap(),
        ..Config::default()
    };
    let mut p = Pipe::new(hop_pair(config), 10, 0.0, 1);
    // Packet 2 never gets through.
    p.drop = Some(Box::new(|from, d| {
        from == 0 && wire_first_data(d) == Some(2)
    }));
    for i in 0..3 {
        p.send(0, &msg(i));
    }
    p.run_until(ms(600));
    assert!(!p.failed[0], "3 NACKs are allowed");
    p.run_until(ms(2000));
    assert!(p.failed[0], "the fourth NACK fails the link");
}

#[test]
fn a_message_larger_than_a_datagram_is_refused() {
    let mut h = Hop::new(Config::default(), 0, Instant::ZERO).unwrap();
    let max = h.max_message();
    assert!(h.send(Instant::ZERO, Bytes::from(vec![0; max])).is_ok());
    assert!(matches!(
        h.send(Instant::ZERO, Bytes::from(vec![0; max + 1])),
        Err(SendError::TooLarge { .. })
    ));
}

fn tcp_pair() -> [TcpLink; 2] {
    [0, 1].map(|_| TcpLink::new(TcpConfig::default(), Instant::ZERO))
}

#[test]
fn tcp_delivers_in_order_and_a_loss_holds_back_what_follows() {
    let mut p = Pipe::new(tcp_pair(), 50, 0.0, 1);
    let mut dropped = false;
    // The segment carrying the second message (bytes 1004..) is lost once.
    p.drop = Some(Box::new(move |from, d| {
        let seq = u64::from_be_bytes(d[1..9].try_into().unwrap());
        let drop = from == 0 && !dropped && d.len() > 19 && seq == 1004;
        dropped |= drop;
        drop
    }));
    for i in 0..6 {
        p.send(0, &msg(i));
    }
    p.run_until(ms(3000));
    assert_eq!(ids(&p.delivered[1]), (0..6).collect::<Vec<_>>());
    let t = |k: usize| p.delivered[1][k].0;
    assert!(
        t(1) - t(0) >= Duration::from_millis(100),
        "message 1 waits a round trip for its retransmission"
    );
    assert_eq!(t(2), t(1), "then the held messages go up in one burst");
    assert!(p.ends[0].retransmissions >= 1);
}

#[test]
fn tcp_survives_heavy_loss() {
    let mut p = Pipe::new(tcp_pair(), 30, 0.1, 3);
    for i in 0..200 {
        p.send(0, &msg(i));
    }
    p.run_until(ms(120_000));
    assert_eq!(ids(&p.delivered[1]), (0..200).collect::<Vec<_>>());
    assert!(p.ends[0].timeouts + p.ends[0].retransmissions > 0);
}

proptest! {
    #[test]
    fn arbitrary_datagrams_never_panic_either_link(datagrams in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..80), 0..20)) {
        let mut hop = Hop::new(Config::default(), 0, Instant::ZERO).unwrap();
        let mut tcp = TcpLink::new(TcpConfig::default(), Instant::ZERO);
        for (i, mut d) in datagrams.into_iter().enumerate() {
            let now = ms(i as u64);
            tcp.handle_datagram(now, &d);
            if d.len() >= 4 {
                d[..4].copy_from_slice(&[0x48, 0x50, 1, 0]);
            }
            hop.handle_datagram(now, &d);
            while hop.poll_transmit(now).is_some() {}
            while tcp.poll_transmit(now).is_some() {}
            while hop.poll_event().is_some() {}
            while tcp.poll_event().is_some() {}
        }
    }
}

/// At 20% loss each way, with a round trip (104 ms) inside `nack_repeat`,
/// the sender resends only what was lost: no packet arrives twice, and
/// retransmissions are about p/(1-p) of the packets.
#[test]
fn heavy_loss_draws_no_duplicate_retransmission() {
    let config = Config {
        rate_bps: 1_425_000,
        ..Config::default()
    };
    let mut p = Pipe::new(hop_pair(config), 52, 0.2, 1);
    for i in 0..3000 {
        p.send(0, &msg(i));
    }
    p.run_until(ms(60_000));
    assert_eq!(p.delivered[1].len(), 3000);
    assert_eq!(p.ends[1].stats().duplicates, 0);
    let r = p.ends[0].stats().retransmissions as f64 / 3000.0;
    assert!((0.2..0.3).contains(&r), "{r}");
}

/// P-Spread Fig 5: on A→B packet m2 is lost, on B→C m1. B forwards m3 and
/// m4 at once, numbering B→C in arrival order (m1 = 1, m3 = 2, m4 = 3) and
/// the recovered m2 as 4; C never sees a gap for m2, and hands m3 and m4 up
/// before m1 and m2 arrive.
#[test]
fn fig5_each_link_numbers_packets_in_arrival_order() {
    let mut ab = Pipe::new(hop_pair(Config::default()), 20, 0.0, 1);
    let mut bc = Pipe::new(hop_pair(Config::default()), 20, 0.0, 2);
    let mut dropped_ab = false;
    ab.drop = Some(Box::new(move |from, d| {
        let drop = from == 0 && !dropped_ab && wire_first_data(d) == Some(2);
        dropped_ab |= drop;
        drop
    }));
    let mut dropped_bc = false;
    bc.drop = Some(Box::new(move |from, d| {
        let drop = from == 0 && !dropped_bc && wire_first_data(d) == Some(1);
        dropped_bc |= drop;
        drop
    }));
    for i in 1..=4 {
        ab.send(0, &msg(i));
    }
    let mut forwarded = 0;
    for t in 0..1000 {
        ab.run_until(ms(t));
        while forwarded < ab.delivered[1].len() {
            let payload = ab.delivered[1][forwarded].1.clone();
            bc.send(0, &payload);
            forwarded += 1;
        }
        bc.run_until(ms(t));
    }
    assert_eq!(ids(&ab.delivered[1]), vec![1, 3, 4, 2]);
    assert_eq!(ids(&bc.delivered[1]), vec![3, 4, 1, 2]);
    let recovered: Vec<bool> = bc.delivered[1].iter().map(|d| d.2).collect();
    assert_eq!(
        recovered,
        vec![false, false, true, false],
        "m1 fills a gap on B→C; m2 is just the next packet there"
    );
    assert_eq!(bc.ends[1].stats().recovered, 1);
    assert_eq!(bc.ends[0].stats().retransmissions, 1);
}
