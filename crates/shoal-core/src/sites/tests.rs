//! Whole systems of sites in virtual time ([`harness::World`]), judged by
//! the history checker (`shoal-check`), plus what the checker cannot see:
//! every message reaches every member, the window bounds what is
//! outstanding, a seed reproduces a run.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;

use super::harness::{full_mesh, Rec, WanLink, World, WorldConfig};
use super::*;
use crate::overlay::Site;

fn ms(n: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(n)
}

/// `sites` sites of `per_site` daemons, a full mesh of WAN links with
/// one-way delay 5 + 5·|a−b| ms at 10 Mbit/s.
fn world(sites: u16, per_site: u32, seed: u64, loss: f64) -> World {
    let config = WorldConfig {
        seed,
        ..WorldConfig::default()
    };
    world_with(sites, per_site, loss, config)
}

fn world_with(sites: u16, per_site: u32, loss: f64, config: WorldConfig) -> World {
    let (topo, wan) = full_mesh(
        &vec![per_site; usize::from(sites)],
        |s| format!("site{s}"),
        |a, b| {
            let delay = 5 + 5 * (b - a) as u64;
            let link = WanLink {
                delay: Duration::from_millis(delay),
                bandwidth_bps: 10_000_000,
                loss,
            };
            (delay as u32, link)
        },
    );
    World::new(topo, wan, config)
}

fn check(w: &World) -> shoal_check::Report {
    assert_eq!(w.stats().corrupt, 0, "a delivery was not the message sent");
    w.check()
}

/// One client per daemon, all in group "g", joined at time 0.
fn clients(w: &mut World, daemons: u32) -> Vec<String> {
    let names: Vec<String> = (0..daemons).map(|d| w.connect(NodeId(d), 0)).collect();
    for c in &names {
        w.join(c, "g");
    }
    names
}

/// Every client sends `rounds` messages, cycling through the services,
/// one round every `gap` from `start`.
fn traffic(w: &mut World, names: &[String], start: u64, rounds: u64, gap: u64) {
    let g = vec!["g".to_string()];
    for r in 0..rounds {
        w.run_until(ms(start + r * gap));
        for (i, c) in names.iter().enumerate() {
            let service = Service::ALL[(r as usize + i) % Service::ALL.len()];
            w.send(c, service, &g, 100);
        }
    }
}

/// (client, sender, seq) of every delivery.
fn delivered(w: &World) -> BTreeSet<(String, String, u64)> {
    w.history()
        .iter()
        .filter_map(|r| match r {
            Rec::Deliver {
                client,
                sender,
                seq,
                ..
            } => Some((client.clone(), sender.clone(), *seq)),
            _ => None,
        })
        .collect()
}

fn sends(w: &World) -> Vec<(String, u64, Service)> {
    w.history()
        .iter()
        .filter_map(|r| match r {
            Rec::Send {
                client,
                seq,
                service,
                ..
            } => Some((client.clone(), *seq, *service)),
            _ => None,
        })
        .collect()
}

#[test]
fn every_service_reaches_every_member_in_order() {
    for seed in 1..=3 {
        let mut w = world(3, 2, seed, 0.0);
        let names = clients(&mut w, 6);
        traffic(&mut w, &names, 500, 30, 20);
        w.run_until(ms(5000));
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        let got = delivered(&w);
        for (sender, seq, _) in sends(&w) {
            for c in &names {
                assert!(
                    got.contains(&(c.clone(), sender.clone(), seq)),
                    "seed {seed}: {c} lacks {sender}/{seq}"
                );
            }
        }
        assert_eq!(report.summary.deliveries, 6 * 6 * 30);
    }
}

#[test]
fn lossy_wan_still_delivers_everything() {
    for seed in 1..=3 {
        let mut w = world(3, 2, seed, 0.05);
        let names = clients(&mut w, 6);
        traffic(&mut w, &names, 500, 20, 20);
        w.run_until(ms(8000));
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        // Unreliable messages are carried by the same reliable links.
        assert_eq!(report.summary.deliveries, 6 * 6 * 20, "seed {seed}");
    }
}

/// The global total order: every client sees the agreed and safe
/// messages in one order, and a safe message only once every site holds
/// it (so never before an agreed one sent at the same moment from the
/// same daemon is delivered at the farthest site).
#[test]
fn agreed_and_safe_share_one_order() {
    let mut w = world(3, 2, 7, 0.0);
    let names = clients(&mut w, 6);
    let g = vec!["g".to_string()];
    w.run_until(ms(500));
    for c in &names {
        w.send(c, Service::Agreed, &g, 100);
        w.send(c, Service::Safe, &g, 100);
    }
    w.run_until(ms(3000));
    let mut orders: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    for r in w.history() {
        if let Rec::Deliver {
            client,
            sender,
            seq,
            ..
        } = r
        {
            orders
                .entry(client.clone())
                .or_default()
                .push((sender.clone(), *seq));
        }
    }
    let first = orders.values().next().unwrap().clone();
    assert_eq!(first.len(), 12);
    for o in orders.values() {
        assert_eq!(*o, first);
    }
    assert!(check(&w).is_clean());
}

#[test]
fn gateway_crash_moves_the_gateway_and_loses_nothing() {
    for seed in 1..=3 {
        let mut w = world(3, 3, seed, 0.0);
        let names = clients(&mut w, 9);
        traffic(&mut w, &names, 500, 10, 20);
        // Daemon 3 is site 1's gateway.
        assert!(w.daemon(NodeId(3)).unwrap().is_gateway());
        w.crash(NodeId(3));
        let live: Vec<String> = names
            .iter()
            .filter(|c| !c.ends_with("#d3"))
            .cloned()
            .collect();
        traffic(&mut w, &live, 800, 20, 20);
        w.run_until(ms(8000));
        assert!(w.daemon(NodeId(4)).unwrap().is_gateway());
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        let got = delivered(&w);
        for (sender, seq, _) in sends(&w)
            .into_iter()
            .filter(|(s, _, _)| !s.ends_with("#d3"))
        {
            for c in &live {
                assert!(
                    got.contains(&(c.clone(), sender.clone(), seq)),
                    "seed {seed}: {c} lacks {sender}/{seq}"
                );
            }
        }
    }
}

#[test]
fn partition_and_merge_keep_evs() {
    for seed in 1..=4 {
        let mut w = world(4, 2, seed, 0.01);
        let names = clients(&mut w, 8);
        traffic(&mut w, &names, 500, 15, 10);
        let a = vec![SiteId(0), SiteId(1)];
        let b = vec![SiteId(2), SiteId(3)];
        w.partition(&[a.clone(), b.clone()]);
        traffic(&mut w, &names, 700, 30, 20);
        w.run_until(ms(3000));
        for d in [0u32, 5] {
            let (_, sites, changing) = w.daemon(NodeId(d)).unwrap().configuration();
            assert_eq!(sites.len(), 2, "seed {seed}: daemon {d} split");
            assert!(!changing, "seed {seed}");
        }
        w.partition(&[vec![SiteId(0), SiteId(1), SiteId(2), SiteId(3)]]);
        traffic(&mut w, &names, 3100, 20, 20);
        w.run_until(ms(9000));
        let (_, sites, changing) = w.daemon(NodeId(0)).unwrap().configuration();
        assert_eq!(sites.len(), 4, "seed {seed}: merged");
        assert!(!changing, "{}", w.daemon(NodeId(0)).unwrap().dump());
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        // After the merge every message sent after it reaches everyone.
        let got = delivered(&w);
        let last: Vec<_> = sends(&w).into_iter().rev().take(8 * 10).collect();
        for (sender, seq, _) in last {
            for c in &names {
                assert!(got.contains(&(c.clone(), sender.clone(), seq)));
            }
        }
        let trans = w
            .history()
            .iter()
            .filter(|r| {
                matches!(
                    r,
                    Rec::View {
                        transitional: true,
                        ..
                    }
                )
            })
            .count();
        assert!(trans >= 16, "seed {seed}: {trans} transitional views");
    }
}

/// A slow site holds back every sender: its markers come late, so no
/// daemon has more than the global window outstanding.
#[test]
fn global_window_throttles_senders_to_a_slow_site() {
    let slow = WanLink {
        delay: Duration::from_millis(20),
        bandwidth_bps: 200_000,
        loss: 0.0,
    };
    let (topo, wan) = full_mesh(&[1, 1], |s| format!("s{s}"), |_, _| (1, slow));
    let mut config = WorldConfig::default();
    config.daemon.global_window = 20;
    config.daemon.hop.rate_bps = 150_000;
    config.daemon.hop.burst_bytes = 2000;
    let mut w = World::new(topo, wan, config);
    let a = w.connect(NodeId(0), 0);
    let b = w.connect(NodeId(1), 0);
    w.join(&a, "g");
    w.join(&b, "g");
    w.run_until(ms(500));
    let g = vec!["g".to_string()];
    let mut max_out = 0;
    for i in 0..400 {
        w.send(&a, Service::Agreed, &g, 500);
        w.run_until(ms(500 + i));
        max_out = max_out.max(w.daemon(NodeId(0)).unwrap().outstanding());
    }
    assert!(max_out <= 20, "outstanding {max_out}");
    assert!(w.daemon(NodeId(0)).unwrap().waiting() > 100);
    assert!(w.daemon(NodeId(0)).unwrap().stats().window_waits > 0);
    w.run_until(ms(30_000));
    assert_eq!(w.daemon(NodeId(0)).unwrap().waiting(), 0);
    let report = check(&w);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.summary.deliveries, 800);
}

/// The spacing of markers (`marker_interval`) does not hold a fast
/// sender: its messages leave the global window only as markers announce
/// them held, and at one marker per 15 ms a window of 20 would pass 1,333
/// messages a second. A marker follows every quarter window of data, so
/// 2,000 messages through one site of two daemons (no WAN) take about a
/// tenth of what the interval alone would allow (1.5 s).
#[test]
fn markers_keep_pace_with_a_fast_sender() {
    let (topo, wan) = full_mesh(&[2], |s| format!("s{s}"), |_, _| unreachable!());
    let mut config = WorldConfig::default();
    config.daemon.global_window = 20;
    let mut w = World::new(topo, wan, config);
    let names = clients(&mut w, 2);
    w.run_until(ms(500));
    let g = vec!["g".to_string()];
    for _ in 0..2000 {
        w.send(&names[0], Service::Agreed, &g, 100).expect("queued");
    }
    w.run_until(ms(3000));
    let report = check(&w);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.summary.deliveries, 4000);
    let last = w
        .history()
        .iter()
        .filter_map(|r| match r {
            Rec::Deliver { at, .. } => Some(*at),
            _ => None,
        })
        .max()
        .unwrap();
    let took = last.saturating_duration_since(ms(500));
    assert!(took < Duration::from_millis(300), "took {took:?}");
    assert!(w.daemon(NodeId(0)).unwrap().stats().window_waits > 0);
}

#[test]
fn joins_and_leaves_are_views_everywhere() {
    let mut w = world(3, 1, 2, 0.0);
    let names = clients(&mut w, 3);
    w.run_until(ms(1000));
    w.join(&names[0], "h");
    w.join(&names[2], "h");
    w.run_until(ms(1500));
    let g = vec!["h".to_string()];
    w.send(&names[0], Service::Agreed, &g, 10);
    w.run_until(ms(2000));
    // Leave through the daemon.
    w.leave(&names[2], "h");
    w.run_until(ms(2500));
    let views_h = |w: &World| {
        w.history()
            .iter()
            .filter(|r| matches!(r, Rec::View { group, .. } if group == "h"))
            .count()
    };
    // Two joins (1 + 2 views), then a leave (1 view to the one left, and
    // the same view to the leaver, without itself, as the client protocol
    // has it).
    assert_eq!(views_h(&w), 5);
    let leaver_last = w.history().iter().rev().find_map(|r| match r {
        Rec::View {
            client, members, ..
        } if *client == names[2] => Some(members.clone()),
        _ => None,
    });
    assert_eq!(leaver_last, Some(vec![names[0].clone()]));
    let report = check(&w);
    assert!(report.is_clean(), "{report}");
}

#[test]
fn a_seed_reproduces_the_run() {
    let run = || {
        let mut w = world(3, 2, 11, 0.02);
        let names = clients(&mut w, 6);
        traffic(&mut w, &names, 500, 10, 15);
        w.partition(&[vec![SiteId(0)], vec![SiteId(1), SiteId(2)]]);
        traffic(&mut w, &names, 700, 10, 15);
        w.run_until(ms(4000));
        w.history().to_vec()
    };
    assert_eq!(run(), run());
}

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Element::decode(&bytes);
        let _ = codec::RingMsg::decode(&bytes);
        let _ = codec::WanMsg::decode(&bytes);
        let _ = codec::parse_wan(&bytes);
    }

    #[test]
    fn elements_round_trip(seq in 1u64..1000, ts in 0u64..1000, n in 0usize..4) {
        let e = Element {
            origin: SiteId(3),
            epoch: 9,
            seq,
            ts,
            sender: NodeId(4),
            body: Body::Flush {
                new_epoch: 10,
                sites: vec![SiteId(1); n],
                holds: vec![seq; n],
                decided: (n % 2 == 1).then(|| (9, vec![SiteId(2); n])),
            },
        };
        prop_assert_eq!(Element::decode(&e.encode()).unwrap(), e);
    }
}

#[test]
fn a_daemon_fed_garbage_keeps_working() {
    let mut d = SiteDaemon::new(
        Config::default(),
        std::sync::Arc::new(Topology {
            sites: vec![Site {
                name: "x".into(),
                daemons: vec![NodeId(0)],
            }],
            links: Vec::new(),
        }),
        NodeId(0),
        1,
        Instant::ZERO,
    )
    .unwrap();
    for junk in [&[][..], &[0, 0, 0, 0, 1, 0, 0][..], &[1; 40][..]] {
        d.handle_wan(ms(1), NodeId(0), junk);
        d.handle_lan(ms(1), NodeId(1), junk);
    }
    d.connect("#c0#d0");
    d.join(ms(2), "#c0#d0", "g").unwrap();
    d.handle_timeout(ms(3));
    let mut views = 0;
    while let Some(e) = d.poll_event() {
        views += usize::from(matches!(e, Event::View { .. }));
    }
    assert_eq!(views, 1);
}

/// Found by the fuzz target `sites_handle_datagram`: a gateway message
/// naming a site outside the topology (a status's destination, an
/// element's origin or destination) indexed the routes out of bounds. It
/// is now counted as bad and dropped; so is a forged timestamp at the top
/// of the range, which overflowed the site's Lamport clock.
#[test]
fn gateway_messages_naming_unknown_sites_are_dropped() {
    use super::codec::{wan_header, WanMsg, TREE, WAN_HOP};
    let (topo, _) = full_mesh(
        &[1, 2],
        |s| format!("s{s}"),
        |_, _| {
            let link = WanLink {
                delay: Duration::from_millis(1),
                bandwidth_bps: 1_000_000,
                loss: 0.0,
            };
            (1, link)
        },
    );
    let mut d = SiteDaemon::new(
        Config::default(),
        std::sync::Arc::new(topo),
        NodeId(0),
        1,
        Instant::ZERO,
    )
    .unwrap();
    assert!(d.is_gateway());
    d.connect("#c0#d0");
    d.join(ms(1), "#c0#d0", "g").unwrap();
    let element = |origin: u16, ts: u64| {
        Element {
            origin: SiteId(origin),
            epoch: 1,
            seq: 1,
            ts,
            sender: NodeId(2),
            body: Body::Join {
                client: "#x".into(),
                group: "g".into(),
            },
        }
        .encode()
    };
    let forged = [
        WanMsg::Status {
            dest: 93,
            site: SiteId(1),
            epoch: 1,
            holds: vec![0, 0],
        },
        WanMsg::Status {
            dest: 0,
            site: SiteId(93),
            epoch: 1,
            holds: vec![u64::MAX, u64::MAX],
        },
        WanMsg::Elem {
            dest: 93,
            element: element(1, 1),
        },
        WanMsg::Elem {
            dest: TREE,
            element: element(93, 1),
        },
    ];
    for (i, msg) in forged.iter().enumerate() {
        let payload = msg.encode();
        let items = [shoal_wire::hop::Item::Data {
            seq: i as u64 + 1,
            payload: &payload,
        }];
        let mut datagram = wan_header(WAN_HOP, 1, SiteId(1));
        datagram.extend_from_slice(&shoal_wire::hop::encode(0, &items).unwrap());
        d.handle_wan(ms(2 + i as u64), NodeId(2), &datagram);
    }
    assert_eq!(d.stats().bad_datagrams, 4, "each unknown site counted");
    // A foreign element stamped u64::MAX reaches the stream (through
    // the gateway's ring); the daemon's own next element must not
    // overflow the clock.
    let top = WanMsg::Elem {
        dest: TREE,
        element: element(1, u64::MAX),
    }
    .encode();
    let items = [shoal_wire::hop::Item::Data {
        seq: forged.len() as u64 + 1,
        payload: &top,
    }];
    let mut datagram = wan_header(WAN_HOP, 1, SiteId(1));
    datagram.extend_from_slice(&shoal_wire::hop::encode(0, &items).unwrap());
    d.handle_wan(ms(10), NodeId(2), &datagram);
    d.join(ms(11), "#c0#d0", "h").unwrap();
    d.handle_timeout(ms(50));
    while d.poll_transmit().is_some() {}
    while d.poll_event().is_some() {}
}

/// The first time `client` was given a view of "g".
fn joined_at(w: &World, client: &str) -> Option<Instant> {
    w.history().iter().find_map(|r| match r {
        Rec::View {
            at,
            client: c,
            group,
            ..
        } if c == client && group == "g" => Some(*at),
        _ => None,
    })
}

/// Every message sent at or after `from` by a client in `senders` reached
/// every client in `to`.
fn all_reached(w: &World, senders: &[String], to: &[String], from: Instant, seed: u64) {
    let got = delivered(w);
    let mut n = 0;
    for r in w.history() {
        let Rec::Send {
            at, client, seq, ..
        } = r
        else {
            continue;
        };
        if *at < from || !senders.contains(client) {
            continue;
        }
        n += 1;
        for c in to {
            assert!(
                got.contains(&(c.clone(), client.clone(), *seq)),
                "seed {seed}: {c} lacks {client}/{seq}"
            );
        }
    }
    assert!(n > 0, "seed {seed}: nothing sent after {from:?}");
}

/// A daemon that starts after its site's ring formed without it (here
/// daemon 3 of site 1, 3.5 s late: daemon 2 gives up on it after the
/// token timeout and then the consensus timeout, 2.2 s) joins the ring,
/// takes the site's state from a member, and its client, joining then,
/// gets every message sent after its join, and everyone gets its
/// messages; the checker finds nothing.
#[test]
fn a_daemon_started_late_takes_its_sites_state() {
    for seed in 1..=3 {
        let mut w = world(3, 2, seed, 0.0);
        w.crash(NodeId(3));
        let names: Vec<String> = [0u32, 1, 2, 4, 5]
            .iter()
            .map(|&d| w.connect(NodeId(d), 0))
            .collect();
        for c in &names {
            w.join(c, "g");
        }
        traffic(&mut w, &names, 500, 150, 20);
        w.restart(NodeId(3));
        w.run_until(ms(3600));
        let late = w.connect(NodeId(3), 0);
        w.join(&late, "g");
        let mut all = names.clone();
        all.push(late.clone());
        traffic(&mut w, &all, 3600, 50, 20);
        w.run_until(ms(9000));
        let d3 = w.daemon(NodeId(3)).unwrap();
        assert!(d3.is_live(), "seed {seed}: {}", d3.dump());
        assert_eq!(
            d3.stats().snapshots_taken,
            1,
            "seed {seed}: {:?} {:?} / {:?}",
            d3.stats(),
            d3.ring_stats(),
            w.daemon(NodeId(2)).unwrap().stats()
        );
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        let at = joined_at(&w, &late).expect("the late client joined");
        assert!(at < ms(6500), "seed {seed}: joined at {at:?}");
        all_reached(&w, &all, &all, at, seed);
    }
}

/// A daemon that crashes and restarts: once after its ring re-formed
/// without it (the site's gateway, daemon 2: the gateway moves to daemon 3
/// and stays there when daemon 2 is back), once before its ring noticed
/// (daemon 5, back after 100 ms). Nothing is lost for the others, the
/// restarted daemons' new clients get everything after their join. (The
/// gateway's crash stalls every site for about 3 s: the token timeout,
/// the consensus timeout, then the resend timeout on the new gateway's
/// links; the restarted clients' joins are ordered after it.)
#[test]
fn a_restarted_daemon_rejoins_its_site() {
    for seed in 1..=3 {
        let mut w = world(3, 2, seed, 0.0);
        let names = clients(&mut w, 6);
        traffic(&mut w, &names, 500, 25, 20);
        assert!(w.daemon(NodeId(2)).unwrap().is_gateway());
        w.crash(NodeId(2));
        w.crash(NodeId(5));
        let live: Vec<String> = names
            .iter()
            .filter(|c| !c.ends_with("#d2") && !c.ends_with("#d5"))
            .cloned()
            .collect();
        traffic(&mut w, &live, 1000, 5, 20);
        w.restart(NodeId(5));
        traffic(&mut w, &live, 1100, 95, 20);
        w.restart(NodeId(2));
        w.run_until(ms(3200));
        let back: Vec<String> = [2u32, 5].iter().map(|&d| w.connect(NodeId(d), 1)).collect();
        for c in &back {
            w.join(c, "g");
        }
        let mut all = live.clone();
        all.extend(back.iter().cloned());
        traffic(&mut w, &all, 3200, 150, 20);
        w.run_until(ms(12_000));
        assert!(w.daemon(NodeId(3)).unwrap().is_gateway(), "seed {seed}");
        assert!(!w.daemon(NodeId(2)).unwrap().is_gateway(), "seed {seed}");
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        all_reached(&w, &live, &live, ms(500), seed);
        let at = back
            .iter()
            .map(|c| joined_at(&w, c).expect("joined"))
            .max()
            .unwrap();
        all_reached(&w, &all, &all, at, seed);
    }
}

/// Site-level failure detection: a daemon that stops answering is noticed
/// by its ring's token loss (token timeout, then the consensus timeout for
/// its join), the ring re-forms without it, its clients leave every
/// group, a gateway among them is replaced by the lowest daemon left, and
/// the configuration of sites (so the overlay's routes) stays. Here, at
/// once and with 1% LAN loss, site 1 loses daemon 4 (not its gateway) and
/// site 2 its gateway, daemon 6; 4 seeds.
#[test]
fn crashed_daemons_leave_their_sites_and_routes_stay() {
    for seed in 1..=4 {
        let (topo, wan) = full_mesh(
            &[3, 3, 3],
            |s| format!("site{s}"),
            |a, b| {
                let delay = 5 + 5 * (b - a) as u64;
                let link = WanLink {
                    delay: Duration::from_millis(delay),
                    bandwidth_bps: 10_000_000,
                    loss: 0.0,
                };
                (delay as u32, link)
            },
        );
        let config = WorldConfig {
            seed,
            lan_loss: 0.01,
            ..WorldConfig::default()
        };
        let mut w = World::new(topo, wan, config);
        let names = clients(&mut w, 9);
        traffic(&mut w, &names, 500, 25, 20);
        assert!(w.daemon(NodeId(6)).unwrap().is_gateway());
        w.crash(NodeId(4));
        w.crash(NodeId(6));
        let live: Vec<String> = names
            .iter()
            .filter(|c| !c.ends_with("#d4") && !c.ends_with("#d6"))
            .cloned()
            .collect();
        traffic(&mut w, &live, 1000, 250, 20);
        w.run_until(ms(10_000));
        assert!(w.daemon(NodeId(7)).unwrap().is_gateway(), "seed {seed}");
        assert!(w.daemon(NodeId(3)).unwrap().is_gateway(), "seed {seed}");
        for d in [0u32, 1, 2, 3, 5, 7, 8] {
            let (epoch, sites, changing) = w.daemon(NodeId(d)).unwrap().configuration();
            assert_eq!((epoch, sites.len(), changing), (1, 3, false), "seed {seed}");
        }
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        all_reached(&w, &live, &live, ms(0), seed);
        // The longest pause in site 0's ordered deliveries: the crashed
        // gateway's.
        let at: Vec<Instant> = w
            .history()
            .iter()
            .filter_map(|r| match r {
                Rec::Deliver {
                    at,
                    client,
                    service,
                    ..
                } if client == &names[0] && *service >= Service::Agreed => Some(*at),
                _ => None,
            })
            .collect();
        let (gap, from) = at
            .windows(2)
            .map(|p| (p[1].saturating_duration_since(p[0]), p[0]))
            .max()
            .unwrap();
        eprintln!("seed {seed}: longest pause of agreed/safe at daemon 0: {gap:?} from {from:?}");
        // Every live client's last view of "g" is the live clients.
        for c in &live {
            let last = w
                .history()
                .iter()
                .rev()
                .find_map(|r| match r {
                    Rec::View {
                        client, members, ..
                    } if client == c => Some(members.clone()),
                    _ => None,
                })
                .unwrap();
            let mut want = live.clone();
            want.sort();
            assert_eq!(last, want, "seed {seed}: {c}'s last view");
        }
    }
}

/// The state round's ring messages decode to themselves, and a hello
/// with no lineage must carry a zero, a snapshot part an index below its
/// count (the fuzz target `sites_decode` asks every decoded message to
/// re-encode to its bytes).
#[test]
fn hellos_and_snapshot_parts_round_trip() {
    use codec::RingMsg;
    let ring = RingId { seq: 7, rep: 3 };
    for m in [
        RingMsg::Hello {
            ring,
            lineage: None,
        },
        RingMsg::Hello {
            ring,
            lineage: Some(0),
        },
        RingMsg::Snapshot {
            ring,
            index: 2,
            count: 3,
            bytes: Bytes::from_static(b"state"),
        },
    ] {
        assert_eq!(RingMsg::decode(&m.encode()).unwrap(), m);
    }
    let mut none_with_lineage = RingMsg::Hello {
        ring,
        lineage: None,
    }
    .encode()
    .to_vec();
    *none_with_lineage.last_mut().unwrap() = 1;
    assert!(RingMsg::decode(&none_with_lineage).is_err());
    let past_count = RingMsg::Snapshot {
        ring,
        index: 2,
        count: 2,
        bytes: Bytes::new(),
    };
    assert!(RingMsg::decode(&past_count.encode()).is_err());
}

/// A message addressed to a client's private group (its name, `#c#d`)
/// reaches that client only, wherever its daemon is, in the total order
/// (the client protocol lets a multicast name private groups).
#[test]
fn a_private_group_reaches_only_its_client() {
    let mut w = world(2, 2, 5, 0.0);
    let names = clients(&mut w, 4);
    w.run_until(ms(1000));
    let to = vec![names[3].clone()];
    for service in [Service::Reliable, Service::Agreed, Service::Safe] {
        w.send(&names[0], service, &to, 16).expect("sent");
    }
    w.run_until(ms(2000));
    let got: Vec<&str> = w
        .history()
        .iter()
        .filter_map(|r| match r {
            Rec::Deliver { client, groups, .. } if *groups == to => Some(client.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(got, vec![names[3].as_str(); 3]);
}

/// Two sites of one daemon each over one link of Table 3's shape (52 ms,
/// 1.5 Mbit/s) losing `loss` of its packets each way.
fn two_sites_over_a_lossy_link(loss: f64) -> (Topology, BTreeMap<(SiteId, SiteId), WanLink>) {
    full_mesh(
        &[1, 1],
        |s| format!("site{s}"),
        |_, _| {
            let link = WanLink {
                delay: Duration::from_millis(52),
                bandwidth_bps: 1_500_000,
                loss,
            };
            (1, link)
        },
    )
}

/// The sequence numbers `client` delivered, in order.
fn delivered_seqs(w: &World, client: &str) -> Vec<u64> {
    w.history()
        .iter()
        .filter_map(|r| match r {
            Rec::Deliver { client: c, seq, .. } if c == client => Some(*seq),
            _ => None,
        })
        .collect()
}

/// One link of 104 ms round trip at 20% loss each way (P-Spread Table 3's
/// worst case), saturated by a client sending 1000-byte reliable
/// messages faster than the link's rate: every message arrives, in order,
/// checker clean, and the source does not spend the link on copies.
///
/// At 20% loss each way a Hop NACK round (NACK there, retransmission
/// back) fails with probability 0.36, so about 1.7% of lost packets take
/// four rounds or more (over a second) to recover. The far site's
/// contiguous count of the source's stream stalls behind such a packet
/// past `resend_timeout`, and the status exchange (`on_status`) used to
/// resend everything after the count, up to 256 elements, while the link
/// still carried all of them (267 and 217 elements resent by daemon 0 in
/// seeds 1 and 3). Now it resends only the element the count waits on
/// and what the live link no longer carries.
#[test]
fn a_saturated_lossy_link_delivers_everything() {
    for seed in 1..=3 {
        let (topo, wan) = two_sites_over_a_lossy_link(0.2);
        let mut config = WorldConfig {
            seed,
            ..WorldConfig::default()
        };
        config.daemon.hop.rate_bps = 1_425_000;
        let mut w = World::new(topo, wan, config);
        let names = clients(&mut w, 2);
        let g = vec!["g".to_string()];
        // Faster than the link: the global window holds the rest at the
        // daemon, and Hop's queue stays full, as in the real run.
        for i in 0..2000 {
            w.run_until(ms(500 + i * 2));
            w.send(&names[0], Service::Reliable, &g, 1000)
                .expect("accepted");
        }
        w.run_until(ms(60_000));
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        assert_eq!(report.summary.deliveries, 2 * 2000, "seed {seed}");
        let order = delivered_seqs(&w, &names[1]);
        assert_eq!(order, (1..=2000).collect::<Vec<u64>>(), "seed {seed}");
        for d in [0, 1] {
            let stats = w.daemon(NodeId(d)).unwrap().stats();
            eprintln!(
                "seed {seed}, daemon {d}: {} elements resent by status, {} left to Hop",
                stats.resent, stats.resend_skipped
            );
        }
        // The source's own stream: about 4000 elements (messages and
        // markers). A stall costs one copy, not the link's backlog.
        let resent = w.daemon(NodeId(0)).unwrap().stats().resent;
        assert!(resent <= 10, "seed {seed}: daemon 0 resent {resent}");
    }
}

/// A link running the TCP model (P-Spread's baseline) instead of Hop
/// carries the sites engine's elements: 300 reliable messages over one
/// lossy link (5% each way, 52 ms, 1.5 Mbit/s) all arrive, in order, and
/// the checker finds nothing; the link retransmitted (TCP repaired the
/// losses, not only the status exchange).
#[test]
fn a_tcp_link_carries_every_message_in_order() {
    for seed in 1..=2 {
        let (topo, wan) = two_sites_over_a_lossy_link(0.05);
        let config = WorldConfig {
            seed,
            link_kind: LinkKind::Tcp,
            ..WorldConfig::default()
        };
        let mut w = World::new(topo, wan, config);
        let names = clients(&mut w, 2);
        let g = vec!["g".to_string()];
        for i in 0..300 {
            w.run_until(ms(500 + i * 5));
            w.send(&names[0], Service::Reliable, &g, 1000)
                .expect("accepted");
        }
        w.run_until(ms(60_000));
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        let order = delivered_seqs(&w, &names[1]);
        assert_eq!(order, (1..=300).collect::<Vec<u64>>(), "seed {seed}");
        let d0 = w.daemon(NodeId(0)).unwrap();
        assert_eq!(d0.link_kind(SiteId(1)), LinkKind::Tcp);
        assert!(
            d0.hop_stats().retransmissions > 0,
            "seed {seed}: TCP repaired losses"
        );
        assert_eq!(d0.hop_stats().nacks_received, 0, "no Hop on the link");
    }
}

/// The receiving site's own elements (its markers) are not resent because
/// the statuses about them are stale. On a link saturated one way the
/// source's statuses used to travel as Hop data behind about a second of
/// queued messages, so the far site saw its own elements unconfirmed for
/// `resend_timeout` and resent them (182-183 per run with real daemons at
/// 0% loss); they now go straight to the neighbour, outside Hop's queue.
#[test]
fn statuses_to_a_neighbour_do_not_wait_behind_its_data() {
    for seed in 1..=2 {
        let (_, resent_far) = table3_resends(seed, 0.0);
        assert_eq!(
            resent_far, 0,
            "seed {seed}: the receiving daemon resent {resent_far}"
        );
    }
}

/// P-Spread Table 3 in virtual time, through the whole sites engine: two
/// sites of one daemon, one WAN link (52 ms each way, 1.5 Mbit/s, loss
/// `loss` per direction), Hop's bucket at 1,425,000 bit/s, a client at
/// daemon 0 keeping the daemon's queue full of 1024-byte reliable
/// messages. Client payload delivered at daemon 1 from 5 s to 25 s, in
/// Kbit/s, and the elements daemon 0 resent by status.
fn table3_run(seed: u64, loss: f64, kind: LinkKind) -> (f64, u64) {
    let (w, names) = table3_world(seed, loss, 25_000, kind);
    let (a, b) = (ms(5_000), ms(25_000));
    let n = w
        .history()
        .iter()
        .filter(|r| matches!(r, Rec::Deliver { client, at, .. } if *client == names[1] && *at >= a && *at < b))
        .count();
    let kbps = n as f64 * 1024.0 * 8.0 / 20.0 / 1000.0;
    (kbps, w.daemon(NodeId(0)).unwrap().stats().resent)
}

/// Elements resent by status by daemon 0 (the source) and daemon 1 (the
/// receiving site) in 10 s of `table3_world`.
fn table3_resends(seed: u64, loss: f64) -> (u64, u64) {
    let (w, _) = table3_world(seed, loss, 10_000, LinkKind::Hop);
    let r = |d| w.daemon(NodeId(d)).unwrap().stats().resent;
    (r(0), r(1))
}

/// The world of `table3_run`, run for `to` ms of sending, its link
/// running `kind`.
fn table3_world(seed: u64, loss: f64, to: u64, kind: LinkKind) -> (World, Vec<String>) {
    let (topo, wan) = two_sites_over_a_lossy_link(loss);
    let mut config = WorldConfig {
        seed,
        link_kind: kind,
        ..WorldConfig::default()
    };
    config.daemon.hop.rate_bps = 1_425_000;
    config.daemon.max_payload = 1024;
    let mut w = World::new(topo, wan, config);
    let names = clients(&mut w, 2);
    let g = vec!["g".to_string()];
    for step in 0..=to / 10 {
        w.run_until(ms(500 + step * 10));
        while w.daemon(NodeId(0)).unwrap().waiting() < 300 {
            w.send(&names[0], Service::Reliable, &g, 1024)
                .expect("accepted");
        }
    }
    (w, names)
}

/// `cargo test -p shoal-core table3_virtual_time -- --ignored --nocapture`
#[test]
#[ignore = "a measurement: prints Table 3 through the sites engine in virtual time"]
fn table3_virtual_time() {
    for (kind, seed) in [LinkKind::Hop, LinkKind::Tcp]
        .into_iter()
        .flat_map(|k| (1..=3).map(move |s| (k, s)))
    {
        let (base, _) = table3_run(seed, 0.0, kind);
        let mut line = format!("{kind:?} seed {seed}: 0%: {base:.1} Kbit/s");
        for loss in [0.05, 0.1, 0.2] {
            let (k, resent) = table3_run(seed, loss, kind);
            line += &format!(
                "; {:.0}%: {:.1} ({:.1}%, {resent} resent)",
                loss * 100.0,
                k,
                100.0 * k / base
            );
        }
        eprintln!("{line}");
    }
}

/// The six sites of P-Spread's Fig 1 tree, one daemon each, joined by the
/// five links the simulator assumes (`spread_sim::tree_edges`: round trip
/// ms and bandwidth), `loss` each way on every link.
fn fig1_tree(loss: f64) -> (Topology, BTreeMap<(SiteId, SiteId), WanLink>) {
    const EDGES: [(u16, u16, u64, u64); 5] = [
        (0, 4, 4000, 1_500_000),
        (4, 5, 500, 10_000_000),
        (0, 3, 8000, 1_500_000),
        (0, 2, 20_000, 1_500_000),
        (2, 1, 60_000, 1_500_000),
    ];
    let mut topo = Topology::default();
    for i in 0..6u32 {
        topo.sites.push(Site {
            name: format!("site{i}"),
            daemons: vec![NodeId(i)],
        });
    }
    let mut wan = BTreeMap::new();
    for (a, b, rtt_us, bandwidth_bps) in EDGES {
        let (sa, sb) = (SiteId(a), SiteId(b));
        let weight = (rtt_us / 1000).max(1) as u32;
        topo.links.push(crate::overlay::LinkWeights {
            a: sa,
            b: sb,
            a_to_b: Some(weight),
            b_to_a: Some(weight),
        });
        let link = WanLink {
            delay: Duration::from_micros(rtt_us / 2),
            bandwidth_bps,
            loss,
        };
        wan.insert((sa, sb), link);
        wan.insert((sb, sa), link);
    }
    (topo, wan)
}

/// P-Spread Table 4 through the sites engine in virtual time: 1024-byte
/// reliable messages from site 0 (Mae East, the root) as fast as its
/// daemon takes them, for 25 s; per receiving site, the Kbit/s its client
/// delivered between 5 and 25 s, and the markers every daemon made.
fn table4_run(seed: u64, loss: f64, config: WorldConfig) -> (Vec<f64>, u64, u64) {
    let (topo, wan) = fig1_tree(loss);
    let mut config = WorldConfig { seed, ..config };
    config.daemon.hop.rate_bps = 1_425_000;
    config.daemon.max_payload = 1024;
    let mut w = World::new(topo, wan, config);
    let names = clients(&mut w, 6);
    let g = vec!["g".to_string()];
    for step in 0..=25_000 / 10 {
        w.run_until(ms(500 + step * 10));
        while w.daemon(NodeId(0)).unwrap().waiting() < 300 {
            w.send(&names[0], Service::Reliable, &g, 1024)
                .expect("accepted");
        }
    }
    let (a, b) = (ms(5_000), ms(25_000));
    let kbps = names[1..]
        .iter()
        .map(|name| {
            let n = w
                .history()
                .iter()
                .filter(|r| matches!(r, Rec::Deliver { client, at, .. } if client == name && *at >= a && *at < b))
                .count();
            n as f64 * 1024.0 * 8.0 / 20.0 / 1000.0
        })
        .collect();
    let markers = (0..6)
        .map(|d| w.daemon(NodeId(d)).map_or(0, |x| x.stats().markers))
        .sum();
    let resent = (0..6)
        .map(|d| w.daemon(NodeId(d)).map_or(0, |x| x.stats().resent))
        .sum();
    (kbps, markers, resent)
}

/// `cargo test -p shoal-core table4_virtual_time -- --ignored --nocapture`
#[test]
#[ignore = "a measurement: prints Table 4 through the sites engine in virtual time"]
fn table4_virtual_time() {
    let intervals: Vec<u64> = std::env::var("SHOAL_MARKER_INTERVALS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![MARKER_INTERVAL_MS]);
    for interval in intervals {
        for seed in 1..=2 {
            let mut config = WorldConfig::default();
            config.daemon.marker_interval = Duration::from_millis(interval);
            let mut base = 0.0;
            for loss in [0.0, 0.05, 0.1, 0.2] {
                let (kbps, markers, resent) = table4_run(seed, loss, config.clone());
                let slowest = kbps.iter().copied().fold(f64::INFINITY, f64::min);
                if loss == 0.0 {
                    base = slowest;
                }
                eprintln!(
                    "marker interval {interval} ms, seed {seed}, loss {loss}: slowest {slowest:.1} Kbit/s ({:.1}%), per site {kbps:.0?}, markers {markers}, resent {resent}",
                    100.0 * slowest / base
                );
            }
        }
    }
}

/// A site's markers are `marker_interval` apart under a steady stream
/// (without it the receiving site sends one per message), and a lone
/// message after a quiet spell is delivered no later for it.
#[test]
fn markers_are_spaced_and_a_lone_message_does_not_wait() {
    let run = |interval_ms: u64| {
        let (topo, wan) = two_sites_over_a_lossy_link(0.0);
        let mut config = WorldConfig::default();
        config.daemon.marker_interval = Duration::from_millis(interval_ms);
        let mut w = World::new(topo, wan, config);
        let names = clients(&mut w, 2);
        let g = vec!["g".to_string()];
        // A lone message first, after the joins settled.
        w.run_until(ms(2_000));
        w.send(&names[0], Service::Agreed, &g, 100).unwrap();
        w.run_until(ms(3_000));
        let markers_before = w.daemon(NodeId(1)).unwrap().stats().markers;
        // Then a steady stream: a message every 2 ms for 1 s.
        for k in 0..500 {
            w.run_until(ms(3_000 + 2 * k));
            w.send(&names[0], Service::Agreed, &g, 100).unwrap();
        }
        w.run_until(ms(6_000));
        let stream_markers = w.daemon(NodeId(1)).unwrap().stats().markers - markers_before;
        let lone_at = w
            .history()
            .iter()
            .find_map(|r| match r {
                Rec::Deliver { at, client, .. } if *client == names[1] => Some(*at),
                _ => None,
            })
            .expect("the lone message delivered");
        let delivered = w
            .history()
            .iter()
            .filter(|r| matches!(r, Rec::Deliver { client, .. } if *client == names[1]))
            .count();
        assert_eq!(delivered, 501, "interval {interval_ms} ms");
        (stream_markers, lone_at)
    };
    let (unspaced, lone_unspaced) = run(0);
    let (spaced, lone_spaced) = run(15);
    // 1 s of stream: at most one marker per 15 ms, and a few around it.
    assert!(spaced <= 1_000 / 15 + 5, "{spaced} markers");
    assert!(unspaced > 2 * spaced, "{unspaced} against {spaced}");
    assert_eq!(lone_spaced, lone_unspaced);
}

// ---- large messages (sites/parts.rs) --------------------------------------

/// Sizes from under a datagram to 300 KB.
const LARGE: [usize; 5] = [900, 1_500, 9_000, 60_000, 300_000];

/// Every client sends `rounds` messages of the `LARGE` sizes in turn,
/// cycling through the services.
fn large_traffic(w: &mut World, names: &[String], start: u64, rounds: u64, gap: u64) {
    sized_traffic(w, names, start, rounds, gap, &LARGE);
}

fn sized_traffic(
    w: &mut World,
    names: &[String],
    start: u64,
    rounds: u64,
    gap: u64,
    sizes: &[usize],
) {
    let g = vec!["g".to_string()];
    for r in 0..rounds {
        w.run_until(ms(start + r * gap));
        for (i, c) in names.iter().enumerate() {
            let service = Service::ALL[(r as usize + i) % Service::ALL.len()];
            let size = sizes[(r as usize + 2 * i) % sizes.len()];
            w.send(c, service, &g, size).expect("accepted");
        }
    }
}

/// Messages up to 300 KB, every service, three sites over lossy links
/// (5% each way): each arrives whole at every member (the harness checks
/// every byte), in the services' orders, checker clean. They went in
/// parts in the ring and over Hop.
#[test]
fn large_messages_arrive_whole_everywhere() {
    for seed in 1..=2 {
        let mut w = world(3, 2, seed, 0.05);
        let names = clients(&mut w, 6);
        large_traffic(&mut w, &names, 500, 10, 100);
        w.run_until(ms(30_000));
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        assert_eq!(report.summary.deliveries, 6 * 6 * 10, "seed {seed}");
        let stats = w.daemon(NodeId(0)).unwrap().stats();
        assert!(stats.sent_in_parts > 0, "seed {seed}: {stats:?}");
        assert_eq!(stats.parts_refused, 0, "seed {seed}: {stats:?}");
        let hop = w.daemon(NodeId(0)).unwrap().hop_stats();
        assert!(hop.retransmissions > 0, "seed {seed}: parts were repaired");
        // Every datagram fits a 1,500-byte MTU with the runtime's seal.
        let largest = w.stats().largest_datagram;
        assert!(largest <= 1472 - SEAL_ALLOWANCE, "seed {seed}: {largest} B");
        assert!(
            largest >= 1400,
            "seed {seed}: parts fill datagrams ({largest} B)"
        );
    }
}

/// A message above `max_payload` is refused with the limit; a
/// configuration whose largest message cannot fit the ring's queue is
/// refused at start.
#[test]
fn a_message_above_the_limit_is_refused() {
    let mut w = world(2, 1, 1, 0.0);
    let names = clients(&mut w, 2);
    w.run_until(ms(500));
    let max = Config::default().max_payload;
    let g = vec!["g".to_string()];
    assert!(w.send(&names[0], Service::Agreed, &g, max).is_some());
    assert!(w.send(&names[0], Service::Agreed, &g, max + 1).is_none());
    let (topo, _) = full_mesh(&[1], |s| format!("s{s}"), |_, _| unreachable!());
    let mut config = Config::default();
    config.ring.send_queue_max = 100;
    let err = SiteDaemon::new(config, Arc::new(topo), NodeId(0), 1, Instant::ZERO);
    assert!(
        matches!(err, Err(SitesError::PayloadTooLarge { .. })),
        "{err:?}"
    );
}

/// A daemon that crashes while its large message is in its ring, part
/// of it delivered: the members going on either all take the message
/// (its last part was delivered before the ring changed) or all drop
/// what they had of it (the sender left), so the checker finds nothing;
/// whatever else was sent arrives. Crash moments spread over the
/// message's time in the ring; in some of them a member held part of it.
#[test]
fn a_sender_crashing_mid_message_leaves_no_partial_delivery() {
    let mut cut = 0;
    for (k, crash_after_us) in [300u64, 700, 1_500, 3_000, 6_000].into_iter().enumerate() {
        let seed = k as u64 + 1;
        let mut w = world(2, 3, seed, 0.0);
        let names = clients(&mut w, 6);
        w.run_until(ms(1000));
        let g = vec!["g".to_string()];
        // Daemon 1 is not its site's gateway.
        assert!(!w.daemon(NodeId(1)).unwrap().is_gateway());
        w.send(&names[1], Service::Agreed, &g, 500_000)
            .expect("accepted");
        w.run_until(ms(1000) + Duration::from_micros(crash_after_us));
        if w.daemon(NodeId(0)).unwrap().parts_in_progress() > 0 {
            cut += 1;
        }
        w.crash(NodeId(1));
        let live: Vec<String> = names
            .iter()
            .filter(|c| !c.ends_with("#d1"))
            .cloned()
            .collect();
        large_traffic(&mut w, &live, 1100, 5, 200);
        w.run_until(ms(15_000));
        let report = check(&w);
        assert!(
            report.is_clean(),
            "crash after {crash_after_us} us: {report}"
        );
        all_reached(&w, &live, &live, ms(1100), seed);
    }
    assert!(cut > 0, "no crash fell inside the message");
}

/// A daemon started while large messages stream through its site takes
/// the site's state, parts of a message in progress included, and its
/// client gets every message after its join, whole.
#[test]
fn a_daemon_joining_mid_message_takes_the_parts_in_progress() {
    // A slow LAN (1 ms a datagram) keeps a 120 KB message's 87 ring
    // parts in flight for several rotations of the token, so that the
    // join's change of ring often falls inside one.
    const SIZES: [usize; 3] = [1_000, 1_000, 120_000];
    let mut carried = 0;
    for seed in 1..=4 {
        let config = WorldConfig {
            seed,
            lan_delay: Duration::from_millis(1),
            ..WorldConfig::default()
        };
        let mut w = world_with(2, 3, 0.0, config);
        w.crash(NodeId(1));
        let names: Vec<String> = [0u32, 2, 3]
            .iter()
            .map(|&d| w.connect(NodeId(d), 0))
            .collect();
        for c in &names {
            w.join(c, "g");
        }
        // The last round, at 3.4 s, has daemon 0's client send 120 KB;
        // daemon 1 starts while its parts go round.
        sized_traffic(&mut w, &names, 500, 30, 100, &SIZES);
        w.run_until(ms(3400 + 2 * seed));
        w.restart(NodeId(1));
        sized_traffic(&mut w, &names, 3500, 26, 100, &SIZES);
        let late = w.connect(NodeId(1), 0);
        w.join(&late, "g");
        let mut all = names.clone();
        all.push(late.clone());
        sized_traffic(&mut w, &all, 6100, 10, 100, &SIZES);
        w.run_until(ms(20_000));
        let d1 = w.daemon(NodeId(1)).unwrap();
        assert!(d1.is_live(), "seed {seed}");
        assert_eq!(d1.stats().snapshots_taken, 1, "seed {seed}");
        carried += d1.parts_adopted();
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        let at = joined_at(&w, &late).expect("joined");
        all_reached(&w, &all, &all, at, seed);
    }
    assert!(carried > 0, "no snapshot carried a message in progress");
}

/// Over a TCP-model link a large element goes whole (its stream takes
/// messages up to 1 MiB), in order, checker clean.
#[test]
fn a_tcp_link_carries_large_messages() {
    let (topo, wan) = two_sites_over_a_lossy_link(0.02);
    let config = WorldConfig {
        seed: 1,
        link_kind: LinkKind::Tcp,
        ..WorldConfig::default()
    };
    let mut w = World::new(topo, wan, config);
    let names = clients(&mut w, 2);
    let g = vec!["g".to_string()];
    for i in 0..20 {
        w.run_until(ms(500 + i * 100));
        let size = LARGE[i as usize % LARGE.len()];
        w.send(&names[0], Service::Fifo, &g, size)
            .expect("accepted");
    }
    w.run_until(ms(60_000));
    let report = check(&w);
    assert!(report.is_clean(), "{report}");
    let order = delivered_seqs(&w, &names[1]);
    assert_eq!(order, (1..=20).collect::<Vec<u64>>());
}

/// Many seeds of large messages under loss, a crashed sender's daemon
/// and a restart, and (even seeds) a partition of the sites and a merge
/// (every other one within 300 ms of the split),
/// judged by the checker and byte for byte: `SHOAL_SEEDS`
/// seeds (20 by default). Ignored: a sweep, not a unit test
/// (`cargo test --release -p shoal-core sites::tests::large_message_sweep
/// -- --ignored --exact`; `SHOAL_SWEEP_SMALL=1` for 100-byte messages).
#[test]
#[ignore]
fn large_message_sweep() {
    let seeds: u64 = std::env::var("SHOAL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let from: u64 = std::env::var("SHOAL_SEED_FROM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    // `SHOAL_SWEEP_SMALL=1`: 100-byte messages instead.
    let sizes: &[usize] = if std::env::var("SHOAL_SWEEP_SMALL").is_ok() {
        &[100]
    } else {
        &LARGE
    };
    // `SHOAL_SWEEP_MEMBERSHIP=1`: the site membership finds the
    // configurations (the partitions only cut the WAN).
    let membership = std::env::var("SHOAL_SWEEP_MEMBERSHIP").is_ok();
    for seed in from..=seeds {
        sweep_seed_with(seed, sizes, membership);
    }
}

/// Seeds of `large_message_sweep` that found bugs, kept. Seed 4: a merge
/// handed to a site still closing its stream for the partition before:
/// its flush for the merge was dropped, and the sites that had moved on
/// stopped resending the departed site's elements it still lacked; every
/// site stalled. Seeds 386 and 914, 100-byte messages, a merge 40 ms
/// after the split: a site took in, after its own flush, an element of
/// the departed site that no staying site's flush held, and delivered in
/// the regular configuration what the other staying site (which never
/// had that element) delivered in the transitional one
/// (`SiteDaemon::acceptance_cap`).
#[test]
fn large_message_sweep_pinned_seeds() {
    sweep_seed(4, &LARGE);
    for seed in [386, 914] {
        sweep_seed(seed, &[100]);
    }
}

/// A few seeds of the sweep with the site membership finding every
/// configuration (`SHOAL_SWEEP_MEMBERSHIP=1` runs a thousand): among them
/// splits noticed and merged, and merges that come while the split is
/// being noticed (seeds 2, 6, 10: 4.84, 4.92 and 5.0 s after the split,
/// around `site_timeout`).
#[test]
fn membership_sweep_seeds() {
    for seed in 1..=12 {
        sweep_seed_with(seed, &[100], true);
    }
    // Seed 16: site 0's gateway restarted while its ring's queue was
    // full of large messages' parts; its round's hello or the snapshot's
    // parts were refused by the queue and lost, and it never took the
    // site's state (`flush_round_out`).
    for seed in [2, 4, 16] {
        sweep_seed_with(seed, &LARGE, true);
    }
}

/// One seed of `large_message_sweep`.
fn sweep_seed(seed: u64, sizes: &[usize]) {
    sweep_seed_with(seed, sizes, false);
}

/// One seed of `large_message_sweep`, the configurations found by the
/// site membership or handed over by the harness.
fn sweep_seed_with(seed: u64, sizes: &[usize], membership: bool) {
    let mut config = WorldConfig {
        seed,
        lan_delay: Duration::from_micros(100 + 100 * (seed % 10)),
        lan_loss: 0.01 * (seed % 3) as f64,
        ..WorldConfig::default()
    };
    config.daemon.membership.enabled = membership;
    // The merge of the seeds that split: with the membership, after the
    // split was noticed (`site_timeout`, 5 s).
    let merge_at = if membership { 12_000 } else { 7000 };
    let mut w = world_with(3, 3, 0.02 * (seed % 4) as f64, config);
    let names = clients(&mut w, 9);
    sized_traffic(&mut w, &names, 500, 6, 150, sizes);
    // A daemon that is not its site's gateway dies mid-stream, and
    // comes back.
    let victim = NodeId(1 + 3 * (seed % 3) as u32);
    w.crash(victim);
    let mut live: Vec<String> = names
        .iter()
        .filter(|c| !c.ends_with(&format!("#d{}", victim.0)))
        .cloned()
        .collect();
    sized_traffic(&mut w, &live, 1500, 6, 150, sizes);
    w.restart(victim);
    sized_traffic(&mut w, &live, 2500, 10, 150, sizes);
    if seed.is_multiple_of(2) {
        // Half the seeds also split the sites while large messages
        // cross, and merge them again.
        w.partition(&[vec![SiteId(0), SiteId(1)], vec![SiteId(2)]]);
        if seed % 4 == 2 {
            // The merge comes while the split's flushes are under way.
            let split_at = w.now();
            // With the membership, around the moment the split is
            // noticed (`site_timeout`, 5 s).
            let wait = if membership {
                4800 + 20 * (seed % 32)
            } else {
                20 * (seed % 16)
            };
            w.run_until(split_at + Duration::from_millis(wait));
            w.partition(&[vec![SiteId(0), SiteId(1), SiteId(2)]]);
            sized_traffic(&mut w, &live, 4100, 10, 150, sizes);
        } else {
            let split_at = w.now();
            sized_traffic(&mut w, &live, 4100, 10, 150, sizes);
            if membership && seed.is_multiple_of(8) {
                // Site 0's gateway (the leader) dies while the split is
                // noticed and the change made, and comes back.
                w.run_until(split_at + Duration::from_millis(4500 + 40 * (seed % 32)));
                w.crash(NodeId(0));
                live.retain(|c| !c.ends_with("#d0"));
                w.run_until(w.now() + Duration::from_millis(3000));
                w.restart(NodeId(0));
            }
            w.run_until(ms(merge_at));
            w.partition(&[vec![SiteId(0), SiteId(1), SiteId(2)]]);
        }
        sized_traffic(&mut w, &live, merge_at + 100, 10, 150, sizes);
    }
    // And once every change is over.
    sized_traffic(&mut w, &live, 15_000, 10, 150, sizes);
    w.run_until(ms(40_000));
    let report = check(&w);
    let merged = w
        .daemon(NodeId(0))
        .is_some_and(|d| d.configuration().1.len() == 3 && !d.configuration().2);
    if (!report.is_clean() || !merged) && std::env::var("SHOAL_SWEEP_DUMP").is_ok() {
        for d in 0..9 {
            if let Some(x) = w.daemon(NodeId(d)) {
                eprintln!(
                    "daemon {d}: live {} gw {} conf {:?} stats {:?}\n{}",
                    x.is_live(),
                    x.is_gateway(),
                    x.configuration(),
                    x.stats(),
                    x.dump()
                );
            }
        }
    }
    assert!(report.is_clean(), "seed {seed}: {report}");
    let (_, sites, changing) = w.daemon(NodeId(0)).unwrap().configuration();
    assert!(sites.len() == 3 && !changing, "seed {seed}: not merged");
    let after = if seed.is_multiple_of(2) {
        ms(merge_at + 100)
    } else {
        ms(1500)
    };
    // Every message but an unreliable one (which a change of
    // configuration may drop), sent once its sender was in its last
    // regular view, reaches every live client.
    let got = delivered(&w);
    let settled = |client: &str| {
        w.history()
            .iter()
            .filter_map(|r| match r {
                Rec::View {
                    at,
                    client: c,
                    transitional: false,
                    ..
                } if c == client => Some(*at),
                _ => None,
            })
            .max()
            .unwrap_or(Instant::ZERO)
    };
    let mut checked = 0;
    for r in w.history() {
        let Rec::Send {
            at,
            client,
            seq,
            service,
            ..
        } = r
        else {
            continue;
        };
        if *at < after
            || *at < settled(client)
            || !live.contains(client)
            || *service == Service::Unreliable
        {
            continue;
        }
        checked += 1;
        for c in &live {
            assert!(
                got.contains(&(c.clone(), client.clone(), *seq)),
                "seed {seed}: {c} lacks {client}/{seq}"
            );
        }
    }
    assert!(checked > 0, "seed {seed}: nothing sent in the last views");
    let changes = w.daemon(NodeId(0)).unwrap().stats().configurations;
    if membership {
        // The membership found the first configuration of all three
        // and, on even seeds, the split and the merge (or, merging
        // before the split was noticed, no change at all).
        let commits = (0..9)
            .filter_map(|d| w.daemon(NodeId(d)))
            .map(|d| d.stats().commits_taken)
            .max();
        assert!(commits >= Some(1), "seed {seed}: no commit taken");
    }
    eprintln!(
        "seed {seed}: clean, {} deliveries, {changes} changes of configuration at daemon 0",
        report.summary.deliveries
    );
}

/// The site membership finds the configurations itself: three sites of
/// two daemons start alone and merge; both daemons of site 2 crash
/// (`site_timeout` later sites 0 and 1 are a configuration of their
/// own and keep delivering); they start again with no state, their site
/// alone in a configuration of its own, and merge back. The checker
/// finds nothing, across seeds and WAN loss.
#[test]
fn the_membership_leaves_out_a_failed_site_and_merges_it_back() {
    for seed in 1..=4u64 {
        let mut config = WorldConfig {
            seed,
            ..WorldConfig::default()
        };
        config.daemon.membership.enabled = true;
        let mut w = world_with(3, 2, 0.02 * (seed % 3) as f64, config);
        w.run_until(ms(1000));
        for d in 0..6 {
            let (_, sites, changing) = w.daemon(NodeId(d)).unwrap().configuration();
            assert!(sites.len() == 3 && !changing, "seed {seed}: no first merge");
        }
        let names = clients(&mut w, 6);
        traffic(&mut w, &names, 1500, 10, 50);
        w.crash(NodeId(4));
        w.crash(NodeId(5));
        let live: Vec<String> = names[..4].to_vec();
        traffic(&mut w, &live, 2100, 30, 100);
        w.run_until(ms(9000));
        for d in 0..4 {
            let (_, sites, changing) = w.daemon(NodeId(d)).unwrap().configuration();
            assert_eq!(
                sites,
                &[SiteId(0), SiteId(1)],
                "seed {seed}: site 2 left out"
            );
            assert!(!changing, "seed {seed}");
        }
        w.restart(NodeId(4));
        w.restart(NodeId(5));
        w.run_until(ms(13_000));
        for d in 0..6 {
            let (_, sites, changing) = w.daemon(NodeId(d)).unwrap().configuration();
            assert!(
                sites.len() == 3 && !changing,
                "seed {seed}: not merged back"
            );
        }
        let back = vec![w.connect(NodeId(4), 1)];
        w.join(&back[0], "g");
        traffic(&mut w, &live, 13_500, 10, 50);
        w.run_until(ms(18_000));
        let report = check(&w);
        assert!(report.is_clean(), "seed {seed}: {report}");
        // Every message sent after the merge reaches the live clients and
        // the restarted site's new one.
        let got = delivered(&w);
        for r in w.history() {
            if let Rec::Send {
                at,
                client,
                seq,
                service,
                ..
            } = r
            {
                if *at >= ms(13_500) && *service != Service::Unreliable {
                    for c in live.iter().chain(&back) {
                        assert!(
                            got.contains(&(c.clone(), client.clone(), *seq)),
                            "seed {seed}: {c} lacks {client}/{seq}"
                        );
                    }
                }
            }
        }
        let st = w.daemon(NodeId(0)).unwrap().stats();
        assert!(st.commits_made >= 3, "seed {seed}: {st:?}");
    }
}
