//! SRM on the tiny virtual-time network of `crate::testnet`.

use std::time::Duration;

use super::*;
use crate::testnet::{self, MS};

type Net = testnet::Net<Srm>;

fn net(n: usize, config: Config, seed: u64) -> Net {
    Net::new(n, seed, |me, members| {
        Srm::new(
            me,
            members,
            config.clone(),
            seed ^ u64::from(me.0),
            Instant::ZERO,
        )
        .unwrap()
    })
}

fn send_stream(net: &mut Net, count: u64, gap_ms: u64) {
    for i in 0..count {
        net.run_until(i * gap_ms);
        net.multicast(0, &i.to_be_bytes()).unwrap();
    }
}

fn sorted(mut seqs: Vec<u64>) -> Vec<u64> {
    seqs.sort_unstable();
    seqs
}

fn has_data(bytes: &[u8], wanted: u64) -> bool {
    shoal_wire::packets(bytes)
        .any(|p| matches!(p, Ok((_, Packet::Data { seq, .. })) if seq == wanted))
}

#[test]
fn every_member_gets_every_message_without_loss() {
    let mut net = net(5, Config::default(), 1);
    send_stream(&mut net, 50, 10);
    net.run_until(2_000);
    for member in 0..5 {
        assert_eq!(
            sorted(net.delivered_seqs(member, 0)),
            (0..50).collect::<Vec<_>>()
        );
    }
    let requests: u64 = net.engines.iter().map(|e| e.stats().packets_sent[2]).sum();
    assert_eq!(requests, 0);
}

#[test]
fn requests_and_repairs_recover_every_loss() {
    for (seed, config) in [(1, Config::default()), (2, Config::adaptive(8))] {
        let mut net = net(8, config, seed);
        net.loss = 0.1;
        send_stream(&mut net, 100, 10);
        net.run_until(30_000);
        for member in 0..8 {
            assert_eq!(
                sorted(net.delivered_seqs(member, 0)),
                (0..100).collect::<Vec<_>>(),
                "seed {seed} member {member}"
            );
            assert_eq!(net.engines[member].pending_requests(), 0);
        }
        let recovered: u64 = net.engines.iter().map(|e| e.stats().recovered).sum();
        assert!(recovered > 0);
    }
}

#[test]
fn sessions_estimate_the_distance() {
    let mut net = net(3, Config::default(), 3);
    net.delay = 7 * MS;
    net.run_until(10_000);
    let d = net.engines[1].distance_to(NodeId(0)).expect("estimated");
    assert_eq!(d, Duration::from_millis(7));
}

#[test]
fn a_lost_tail_is_found_through_session_messages() {
    let mut net = net(3, Config::default(), 4);
    // The last message never reaches member 2 in the first phase.
    net.filter = Some(Box::new(|_, to, bytes| !(to == 2 && has_data(bytes, 4))));
    send_stream(&mut net, 5, 10);
    net.run_until(5_000);
    assert_eq!(sorted(net.delivered_seqs(2, 0)), vec![0, 1, 2, 3, 4]);
}

/// Nine members miss the same message; only the source holds it. Requests
/// from equidistant members are only partly suppressed: fewer than nine
/// requests go out on average, but usually more than one (the equidistant
/// case that defeats SRM's suppression, P001 §C).
#[test]
fn hearing_a_request_suppresses_some_of_the_others() {
    let mut requests = 0;
    let seeds = 0..10u64;
    for seed in seeds.clone() {
        let mut net = net(10, Config::default(), seed);
        net.run_until(3_000); // distances estimated
        net.filter = Some(Box::new(|from, _, bytes| {
            !(from == 0 && has_data(bytes, 0))
        }));
        net.multicast(0, b"x").unwrap();
        net.filter = None;
        net.multicast(0, b"y").unwrap();
        net.run_until(6_000);
        for member in 1..10 {
            assert_eq!(sorted(net.delivered_seqs(member, 0)), vec![0, 1]);
        }
        requests += net
            .engines
            .iter()
            .map(|e| e.stats().packets_sent[2])
            .sum::<u64>();
    }
    let mean = requests as f64 / seeds.count() as f64;
    assert!((1.0..9.0).contains(&mean), "mean requests per loss {mean}");
}

#[test]
fn same_seed_same_run() {
    let run = |seed| {
        let mut net = net(6, Config::adaptive(6), seed);
        net.loss = 0.1;
        send_stream(&mut net, 40, 10);
        net.run_until(5_000);
        net.engines
            .iter()
            .map(|e| format!("{:?} {:?}", e.stats(), e.timer_constants()))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
}

#[test]
fn bad_config_is_refused() {
    let config = Config {
        c1: -1.0,
        ..Config::default()
    };
    let err = Srm::new(NodeId(0), &[NodeId(0)], config, 1, Instant::ZERO).err();
    assert_eq!(err, Some(ConfigError::NotPositive("c1")));
}

#[test]
fn fixed_timers_widen_the_repair_window_with_the_group_as_ns2_does() {
    // ns-2's Agent/SRM/Fixed: D1 = D2 = log10 G; the request timer keeps
    // C1 = C2 = 2 and the ×2 backoff.
    let c = Config::fixed(100);
    assert_eq!((c.c1, c.c2, c.backoff_factor), (2.0, 2.0, 2.0));
    assert!((c.d1 - 2.0).abs() < 1e-12 && (c.d2 - 2.0).abs() < 1e-12);
    assert!(c.adaptive.is_none());
    // The smallest groups keep a positive window.
    for g in [0, 1, 2] {
        assert_eq!(Config::fixed(g).validate(), Ok(()));
        assert!(Config::fixed(g).d1 > 0.0);
    }
}
