use super::*;
use crate::testnet::{self, Node};

impl Node for FailureDetector {
    type Ev = FdEvent;
    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        FailureDetector::handle_datagram(self, now, from, datagram)
    }
    fn handle_timeout(&mut self, now: Instant) {
        FailureDetector::handle_timeout(self, now)
    }
    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        FailureDetector::poll_transmit(self, now)
    }
    fn poll_event(&mut self) -> Option<FdEvent> {
        FailureDetector::poll_event(self)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        FailureDetector::poll_timeout(self)
    }
}

type Net = testnet::Net<FailureDetector>;

/// Every member starts knowing only member 0.
fn net(n: usize, config: Config, seed: u64) -> Net {
    Net::new(n, seed, |me, _| {
        let contacts = [NodeId(0)];
        FailureDetector::new(
            me,
            1,
            &contacts,
            config.clone(),
            seed ^ u64::from(me.0),
            Instant::ZERO,
        )
        .unwrap()
    })
}

fn all(n: u32) -> Vec<NodeId> {
    (0..n).map(NodeId).collect()
}

#[test]
fn members_discover_each_other_from_one_contact() {
    let mut net = net(20, Config::default(), 1);
    net.loss = 0.1;
    net.run_until(3_000);
    for fd in &net.engines {
        assert_eq!(fd.live_members(), all(20));
    }
}

#[test]
fn a_crashed_member_is_suspected_then_forgotten_and_nobody_else_is() {
    for seed in 0..5 {
        let mut net = net(20, Config::default(), seed);
        net.loss = 0.1;
        net.run_until(3_000);
        // Member 7 crashes at 3 s: nothing in or out.
        net.filter = Some(Box::new(|from, to, _| from != 7 && to != 7));
        net.run_until(30_000);
        for (i, events) in net.events.iter().enumerate().filter(|(i, _)| *i != 7) {
            let suspected: Vec<NodeId> = events
                .iter()
                .filter_map(|e| match e {
                    FdEvent::Suspected(n) => Some(*n),
                    _ => None,
                })
                .collect();
            assert_eq!(suspected, vec![NodeId(7)], "seed {seed} member {i}");
            assert!(events.contains(&FdEvent::Forgotten(NodeId(7))));
            let mut expected = all(20);
            expected.retain(|n| n.0 != 7);
            assert_eq!(net.engines[i].live_members(), expected);
        }
    }
}

#[test]
fn suspicion_comes_after_fail_after_and_not_much_later() {
    let mut net = net(10, Config::default(), 3);
    net.run_until(2_000);
    net.filter = Some(Box::new(|from, to, _| from != 4 && to != 4));
    net.run_until(6_900);
    assert!(!net.engines[0].is_suspected(NodeId(4)), "too early");
    net.run_until(8_000);
    assert!(net.engines[0].is_suspected(NodeId(4)), "too late");
}

#[test]
fn a_restarted_member_is_alive_again() {
    let mut net = net(5, Config::default(), 4);
    net.run_until(2_000);
    net.filter = Some(Box::new(|from, to, _| from != 2 && to != 2));
    net.run_until(8_000);
    assert!(net.engines[0].is_suspected(NodeId(2)));
    let now = net.now();
    net.engines[2] =
        FailureDetector::new(NodeId(2), 2, &[NodeId(0)], Config::default(), 9, now).unwrap();
    net.filter = None;
    net.run_until(10_000);
    assert!(!net.engines[0].is_suspected(NodeId(2)));
    assert!(net.events[0].contains(&FdEvent::Alive(NodeId(2))));
}

#[test]
fn per_member_load_does_not_grow_with_the_group() {
    let max_entries = 40;
    let config = Config {
        entries_per_gossip_max: max_entries,
        ..Config::default()
    };
    let largest = shoal_wire::HEADER_LEN + 2 + shoal_wire::HEARTBEAT_ENTRY_LEN * 40;
    for n in [10, 200] {
        let mut net = net(n, config.clone(), 5);
        net.run_until(10_000);
        for fd in &net.engines {
            let stats = fd.stats();
            assert_eq!(stats.datagrams_sent, stats.rounds, "one gossip per round");
            assert!(stats.bytes_sent <= stats.rounds * largest as u64);
        }
        // Even with bounded gossips, everyone learned of everyone.
        assert_eq!(net.engines[n - 1].live_members(), all(n as u32));
    }
}

#[test]
fn cleanup_must_exceed_fail() {
    let config = Config {
        cleanup_after: Duration::from_secs(1),
        ..Config::default()
    };
    assert!(matches!(
        config.validate(),
        Err(ConfigError::CleanupBeforeFail { .. })
    ));
}
