//! Traditional-stack tests on the virtual-time test network.

use std::cell::Cell;
use std::rc::Rc;

use bytes::Bytes;

use super::*;
use crate::testnet;

type Net = testnet::Net<Traditional>;

fn net(n: usize, seed: u64, config: Config) -> Net {
    let mut net = Net::new(n, seed, |me, members| {
        Traditional::new(me, members, config.clone(), Instant::ZERO).unwrap()
    });
    net.check = Some(Traditional::check_invariants);
    net
}

/// Tries to multicast from `from`; false if flow control refused.
fn send(net: &mut Net, from: usize, tag: u64) -> bool {
    net.with(from, |e, now| {
        e.multicast(now, Bytes::copy_from_slice(&tag.to_be_bytes()))
            .is_ok()
    })
}

fn delivered(net: &Net, member: usize, source: u32) -> Vec<u64> {
    net.events[member]
        .iter()
        .filter_map(|e| match e {
            Event::Deliver { source: s, seq, .. } if s.0 == source => Some(*seq),
            _ => None,
        })
        .collect()
}

fn views(net: &Net, member: usize) -> Vec<(u64, Vec<NodeId>)> {
    net.events[member]
        .iter()
        .filter_map(|e| match e {
            Event::View { id, members } => Some((*id, members.clone())),
            _ => None,
        })
        .collect()
}

/// Every member delivers every message of every sender once, in FIFO
/// order, under loss, across seeds; nobody is falsely suspected.
#[test]
fn every_message_is_delivered_in_fifo_order_under_loss() {
    for seed in 0..20 {
        let mut net = net(5, seed, Config::default());
        net.loss = 0.05;
        let mut sent = [0u64; 3];
        for t in 0..3_000u64 {
            net.run_until(t);
            for (sender, count) in sent.iter_mut().enumerate() {
                if *count < 300 && send(&mut net, sender, *count) {
                    *count += 1;
                }
            }
        }
        net.loss = 0.0;
        net.run_until(6_000);
        assert_eq!(sent, [300; 3], "seed {seed}: senders finished");
        for member in 0..5 {
            for source in 0..3 {
                let got = delivered(&net, member, source);
                assert_eq!(
                    got,
                    (0..300).collect::<Vec<_>>(),
                    "seed {seed} m{member} s{source}"
                );
            }
            assert!(
                views(&net, member).is_empty(),
                "seed {seed}: no view change"
            );
        }
    }
}

/// A member that sleeps (drops everything, shorter than the failure
/// timeout) stalls the sender once the window is full; the group resumes
/// when it wakes, with no view change: P000 Fig 1's mechanism.
#[test]
fn a_sleeping_member_stalls_the_sender_once_the_window_fills() {
    let config = Config::default();
    let window = u64::from(config.window.get());
    let mut net = net(4, 1, config);
    let asleep = Rc::new(Cell::new(false));
    let flag = asleep.clone();
    net.filter = Some(Box::new(move |from, to, _| {
        !(flag.get() && (from == 3 || to == 3))
    }));
    let mut sent = 0u64;
    let mut sent_while_asleep = 0u64;
    for t in 0..2_000u64 {
        asleep.set((500..900).contains(&t));
        net.run_until(t);
        if send(&mut net, 0, sent) {
            sent += 1;
            if asleep.get() {
                sent_while_asleep += 1;
            }
        }
    }
    net.run_until(4_000);
    assert!(
        sent_while_asleep <= window,
        "sent {sent_while_asleep} while a member slept (window {window})"
    );
    assert!(sent > 1_000, "the sender resumed: {sent}");
    for member in 0..4 {
        assert_eq!(delivered(&net, member, 0).len() as u64, sent, "m{member}");
        assert!(views(&net, member).is_empty());
    }
}

/// A crashed member (here also a sender) is suspected after the failure
/// timeout; a flush installs a view without it at every survivor, the
/// survivors delivered the same messages of every stream in the old view,
/// and the other sender continues in the new one.
#[test]
fn a_crash_triggers_a_flush_and_a_view_change_then_sending_resumes() {
    for seed in 0..10 {
        let mut net = net(5, seed, Config::default());
        net.loss = 0.02;
        let crashed = Rc::new(Cell::new(false));
        let flag = crashed.clone();
        net.filter = Some(Box::new(move |from, to, _| {
            !(flag.get() && (from == 4 || to == 4))
        }));
        let mut sent = [0u64; 5];
        let mut sent_at_crash = 0;
        for t in 0..5_000u64 {
            if t == 1_000 {
                crashed.set(true);
                sent_at_crash = sent[0];
            }
            net.run_until(t);
            for sender in [0, 4] {
                if (sender != 4 || t < 1_000) && send(&mut net, sender, sent[sender]) {
                    sent[sender] += 1;
                }
            }
        }
        net.loss = 0.0;
        net.run_until(8_000);
        let survivors = [0usize, 1, 2, 3];
        let expected_view: Vec<NodeId> = survivors.iter().map(|&i| NodeId(i as u32)).collect();
        let crashed_stream = delivered(&net, 0, 4);
        for &m in &survivors {
            assert_eq!(
                views(&net, m),
                vec![(1, expected_view.clone())],
                "seed {seed} m{m}"
            );
            assert_eq!(
                delivered(&net, m, 4),
                crashed_stream,
                "seed {seed}: same cut of m4"
            );
            assert_eq!(
                delivered(&net, m, 0).len() as u64,
                sent[0],
                "seed {seed} m{m}"
            );
        }
        // Blocked from the crash until the flush (about the 1 s failure
        // timeout), then sending again.
        assert!(
            sent[0] > sent_at_crash + 500,
            "seed {seed}: sender 0 continued ({sent_at_crash} -> {})",
            sent[0]
        );
        assert_eq!(
            crashed_stream,
            (0..crashed_stream.len() as u64).collect::<Vec<_>>(),
            "a prefix of the crashed stream"
        );
    }
}

#[test]
fn bad_config_and_foreign_datagrams_are_refused() {
    let bad = Config {
        fail_timeout: std::time::Duration::from_millis(50),
        ..Config::default()
    };
    assert!(Traditional::new(NodeId(0), &[NodeId(0)], bad, Instant::ZERO).is_err());
    let mut e = Traditional::new(
        NodeId(0),
        &[NodeId(0), NodeId(1)],
        Config::default(),
        Instant::ZERO,
    )
    .unwrap();
    e.handle_datagram(Instant::ZERO, NodeId(9), b"garbage");
    e.handle_datagram(Instant::ZERO, NodeId(1), b"garbage");
    assert_eq!(e.stats().malformed, 2);
    assert!(e.poll_event().is_none());
}
