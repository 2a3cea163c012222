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
/// timeout) stalls the sender once the window is full: P000 Fig 1's
/// mechanism (§2.1). Across seeds, with 2% loss: while the member sleeps the
/// sender gets at most W messages out, then is refused (`WindowFull`, with
/// exactly W unstable) until the sleeper wakes; then it resumes, everything
/// is delivered everywhere in FIFO order, and nobody is suspected.
#[test]
fn a_sleeping_member_stalls_the_sender_once_the_window_fills() {
    const SLEEP: std::ops::Range<u64> = 500..900;
    for seed in 0..20 {
        let config = Config::default();
        let window = u64::from(config.window.get());
        let mut net = net(4, seed, config);
        net.loss = 0.02;
        let asleep = Rc::new(Cell::new(false));
        let flag = asleep.clone();
        net.filter = Some(Box::new(move |from, to, _| {
            !(flag.get() && (from == 3 || to == 3))
        }));
        let mut sent = 0u64;
        let mut sent_while_asleep = 0u64;
        let mut refused_full_window = 0u64;
        let mut stalled_at_wake = None;
        let mut sent_at_wake = 0;
        for t in 0..2_000u64 {
            asleep.set(SLEEP.contains(&t));
            net.run_until(t);
            if t == SLEEP.end {
                sent_at_wake = sent;
                stalled_at_wake = Some(net.with(0, |e, _| (e.can_send(), e.unstable())));
            }
            let payload = Bytes::copy_from_slice(&sent.to_be_bytes());
            match net.with(0, |e, now| e.multicast(now, payload)) {
                Ok(_) => {
                    sent += 1;
                    if asleep.get() {
                        sent_while_asleep += 1;
                    }
                }
                Err(SendError::WindowFull) if asleep.get() => {
                    let unstable = net.with(0, |e, _| e.unstable());
                    assert_eq!(unstable, window, "seed {seed}: refused below W");
                    refused_full_window += 1;
                }
                Err(SendError::WindowFull) => {}
                Err(e) => panic!("seed {seed}: {e}"),
            }
        }
        net.loss = 0.0;
        net.run_until(4_000);
        assert!(
            sent_while_asleep <= window,
            "seed {seed}: sent {sent_while_asleep} while a member slept (W = {window})"
        );
        // The sleeper's reports stopped, so the window, once full, stayed
        // full: at the end of the sleep the sender was still stalled.
        assert_eq!(
            stalled_at_wake,
            Some((false, window)),
            "seed {seed}: (can send, unstable) as the member woke"
        );
        assert!(
            refused_full_window >= (SLEEP.end - SLEEP.start) - window,
            "seed {seed}: refused only {refused_full_window} times during the sleep"
        );
        // Resumed: well past one more window in the 1.1 s after waking.
        assert!(
            sent - sent_at_wake > 4 * window,
            "seed {seed}: the sender resumed: {sent_at_wake} -> {sent}"
        );
        for member in 0..4 {
            assert_eq!(
                delivered(&net, member, 0),
                (0..sent).collect::<Vec<_>>(),
                "seed {seed} m{member}"
            );
            assert!(views(&net, member).is_empty(), "seed {seed} m{member}");
        }
    }
}

/// A crashed member (here also a sender) is suspected after the failure
/// timeout; a flush installs a view without it at every survivor, the
/// survivors delivered the same messages of every stream in the old view,
/// and the other sender continues in the new one.
#[test]
fn a_crash_triggers_a_flush_and_a_view_change_then_sending_resumes() {
    for seed in 0..20 {
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

/// A peer that has not reported for `retransmit_timeout` is resent only the
/// messages it has had that long to acknowledge: a report still queued at a
/// busy sender must not turn the newest messages into retransmissions.
#[test]
fn only_messages_older_than_the_timeout_are_retransmitted() {
    use std::time::Duration;
    let members = [NodeId(0), NodeId(1)];
    let config = Config::default();
    let timeout = config.retransmit_timeout;
    let at = |ms: u64| Instant::ZERO + Duration::from_millis(ms);
    let mut sender = Traditional::new(NodeId(0), &members, config, Instant::ZERO).unwrap();
    let send = |sender: &mut Traditional, ms: u64| {
        sender.multicast(at(ms), Bytes::from_static(b"m")).unwrap();
        while sender.poll_transmit(at(ms)).is_some() {}
    };
    send(&mut sender, 0);
    send(&mut sender, 90);
    // The peer never reports. At 110 ms only the first message is due.
    sender.handle_timeout(at(110));
    assert_eq!(sender.stats().retransmits_sent, 1);
    // A round later, the second one has had its time too.
    sender.handle_timeout(at(110) + timeout);
    assert_eq!(sender.stats().retransmits_sent, 3);
}
