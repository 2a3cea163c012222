//! The sites file: what it accepts and each error it names; the adapter's
//! routing of datagrams between the LAN and the WAN; and two sites of
//! daemons over real UDP on loopback in one process (the multi-process
//! test is `crates/shoal/tests/sites.rs`).

use std::time::Duration;

use shoal_core::sites::Event;

use super::*;
use crate::{Clock, Endpoint, Node, SocketOptions};

const GOOD: &str = r#"
[[site]]
name = "east"
daemons = [{ id = 0, addr = "127.0.0.1:4810" }, { id = 1, addr = "127.0.0.1:4811" }]

[[site]]
name = "west"
daemons = [{ id = 2, addr = "[::1]:4810" }]

[[link]]
a = "east"
b = "west"
weight = 10

[engine]
global_window = 50
"#;

fn err(text: &str) -> String {
    SitesPlan::from_toml(text).unwrap_err().to_string()
}

#[test]
fn a_good_file_gives_the_topology_addresses_and_settings() {
    let plan = SitesPlan::from_toml(GOOD).unwrap();
    assert_eq!(plan.topology.sites.len(), 2);
    assert_eq!(plan.topology.sites[0].daemons, vec![NodeId(0), NodeId(1)]);
    assert_eq!(plan.addrs[2], "[::1]:4810".parse().unwrap(), "IPv6 taken");
    let l = plan.topology.links[0];
    assert_eq!((l.a_to_b, l.b_to_a), (Some(10), Some(10)));
    assert_eq!(plan.engine.global_window, 50);
    assert!(plan.engine(1, Instant::ZERO).is_ok());
    assert!(matches!(
        plan.engine(3, Instant::ZERO),
        Err(SitesConfigError::UnknownDaemon(3))
    ));
}

#[test]
fn the_site_membership_is_on_unless_the_file_says_otherwise() {
    let plan = SitesPlan::from_toml(GOOD).unwrap();
    assert!(plan.engine.membership.enabled);
    assert_eq!(
        plan.engine.membership.site_timeout,
        Duration::from_millis(5000)
    );
    let off = format!("{GOOD}\n[membership]\nenabled = false\n");
    assert!(
        !SitesPlan::from_toml(&off)
            .unwrap()
            .engine
            .membership
            .enabled
    );
    let tuned = format!("{GOOD}\n[membership]\nheartbeat_interval = 500\nsite_timeout = 8000\n");
    let m = SitesPlan::from_toml(&tuned).unwrap().engine.membership;
    assert!(m.enabled);
    assert_eq!(m.heartbeat_interval, Duration::from_millis(500));
    assert_eq!(m.site_timeout, Duration::from_millis(8000));
    // Under [engine] it is not a setting: said, not ignored.
    let misplaced = format!("{GOOD}\n[engine.membership]\nenabled = false\n");
    assert!(
        err(&misplaced).contains("membership"),
        "{}",
        err(&misplaced)
    );
    // Below the ring's re-formation after a gateway's crash: refused.
    let short = format!("{GOOD}\n[membership]\nsite_timeout = 2000\n");
    assert!(err(&short).contains("site_timeout"), "{}", err(&short));
    let typo = format!("{GOOD}\n[membership]\nsite_timout = 5000\n");
    assert!(err(&typo).contains("site_timout"), "{}", err(&typo));
}

#[test]
fn every_bad_file_is_refused_with_what_is_wrong() {
    let site =
        |name: &str, daemons: &str| format!("[[site]]\nname = \"{name}\"\ndaemons = [{daemons}]\n");
    let d = |id: u32, port: u16| format!("{{ id = {id}, addr = \"127.0.0.1:{port}\" }}");
    let two = format!("{}{}", site("a", &d(0, 1000)), site("b", &d(1, 1001)));
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "no [[site]]"),
        ("[[site]]\nname = \"a\"\n".into(), "missing field `daemons`"),
        (format!("{}foo = 1\n", site("a", &d(0, 1000))), "unknown field"),
        (site("a", "{ id = 0, addr = \"localhost:1\" }"), "invalid socket address"),
        (site("a", ""), "site \"a\" lists no daemon"),
        (format!("{}{}", site("a", &d(0, 1000)), site("a", &d(1, 1001))), "site \"a\" is listed twice"),
        (site("a", &format!("{}, {}", d(0, 1000), d(0, 1001))), "daemon id 0 is listed twice"),
        (site("a", &format!("{}, {}", d(0, 1000), d(2, 1001))), "1 is missing"),
        (site("a", &format!("{}, {}", d(0, 1000), d(1, 1000))), "127.0.0.1:1000 is listed for two daemons"),
        (site("a", &d(0, 0)), "port 0"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"c\"\nweight = 1\n"), "names site \"c\", which is not listed"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"a\"\nweight = 1\n"), "joins a site to itself"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"b\"\nweight = 1\n[[link]]\na = \"b\"\nb = \"a\"\nweight = 2\n"), "listed twice"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"b\"\nweight = 1\na_to_b = 2\n"), "not both"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"b\"\n"), "carries nothing"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"b\"\na_to_b = 0\n"), "at least 1"),
        (format!("{two}[engine]\nglobal_window = 0\n"), "global_window must be positive"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"b\"\nweight = 1\nloss = 1.0\n"), "loss at least 0 and below 1"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"b\"\nweight = 1\ndelay_ms = -1\n"), "delay_ms must be at least 0"),
        (format!("{two}[engine]\nwindow = 5\n"), "unknown field `window`"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"b\"\nweight = 1\nrate_kbps = 0\n"), "rate_kbps above 0"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"b\"\nweight = 1\nqueue_packets = 0\n"), "queue_packets at least 1"),
        (format!("{two}[[link]]\na = \"a\"\nb = \"b\"\nweight = 1\nprotocol = \"udp\"\n"), "unknown variant `udp`"),
        (format!("{two}[engine.tcp]\nmss = 0\n"), "tcp: mss must be 1..=65535"),
    ];
    for (text, want) in cases {
        let got = err(&text);
        assert!(got.contains(want), "{text:?}: got {got:?}, want {want:?}");
    }
}

const KEY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// Beyond loopback a key is required, as for the daemon.
#[test]
fn a_key_is_required_beyond_loopback() {
    let far = "[[site]]\nname = \"a\"\ndaemons = [{ id = 0, addr = \"192.0.2.1:4810\" }]\n";
    assert!(
        err(far).contains("[auth] is required: 192.0.2.1:4810"),
        "{}",
        err(far)
    );
    let insecure = format!("insecure_no_auth = true\n{far}");
    assert!(SitesPlan::from_toml(&insecure).unwrap().auth.is_none());
    let keyed = format!("{far}[auth]\nkey = \"{KEY}\"\nencrypt = true\n");
    let plan = SitesPlan::from_toml(&keyed).unwrap();
    assert!(matches!(plan.auth, Some((_, crate::Mode::Encrypt))));
    assert!(plan.node_config(1).unwrap().auth.is_some());
    let bad = format!("{far}[auth]\nkey = \"00\"\n");
    assert!(err(&bad).starts_with("[auth]: "), "{}", err(&bad));
    // Loopback needs none.
    assert!(SitesPlan::from_toml(GOOD).unwrap().auth.is_none());
}

#[test]
fn a_missing_file_is_named() {
    let e = SitesPlan::load(Path::new("/nonexistent/sites.toml")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/sites.toml"), "{e}");
}

/// Ring traffic stays in the site; WAN traffic goes to another site's
/// daemon; a datagram from an id outside the topology is counted.
#[test]
fn the_adapter_fans_ring_multicast_out_to_its_site_only() {
    let plan = SitesPlan::from_toml(GOOD).unwrap();
    let mut e = [
        plan.engine(0, Instant::ZERO).unwrap(),
        plan.engine(1, Instant::ZERO).unwrap(),
    ];
    let mut now = Instant::ZERO + Duration::from_millis(1);
    e[0].daemon_mut().connect("#c0#d0");
    e[0].daemon_mut().join(now, "#c0#d0", "g").unwrap();
    // Daemons 0 and 1 pass the token and data between them; what daemon
    // 0 sends elsewhere is noted.
    let mut to = Vec::new();
    for _ in 0..20 {
        now += Duration::from_millis(1);
        for i in 0..2 {
            e[i].handle_timeout(now);
            while let Some(t) = e[i].poll_transmit(now) {
                if i == 0 {
                    to.push(t.destination);
                }
                if t.destination == Destination::Node(NodeId(1 - i as u32)) {
                    e[1 - i].handle_datagram(now, NodeId(i as u32), &t.payload);
                }
            }
        }
    }
    assert!(e[0].stats().lan_fan_out > 0, "the join was multicast");
    assert!(
        to.contains(&Destination::Node(NodeId(1))),
        "ring peer: {to:?}"
    );
    assert!(
        to.contains(&Destination::Node(NodeId(2))),
        "other site's gateway: {to:?}"
    );
    assert!(!to.contains(&Destination::Multicast));
    assert!(!to.contains(&Destination::Node(NodeId(0))));
    e[0].handle_datagram(now, NodeId(7), b"junk");
    assert_eq!(e[0].stats().unknown_sender, 1);
}

/// A link's `delay_ms` and `loss` act on the datagrams that cross it into
/// a daemon, in either direction, and on nothing else: held datagrams
/// reach the engine when due (the timeout says when), a loss of 0.5 drops
/// about half.
#[test]
fn a_links_delay_and_loss_act_on_what_crosses_it() {
    let text = GOOD.replace("weight = 10", "weight = 10\ndelay_ms = 30\nloss = 0.5");
    let plan = SitesPlan::from_toml(&text).unwrap();
    let f = plan.link_faults[&(SiteId(0), SiteId(1))];
    assert_eq!((f.delay, f.loss), (Duration::from_millis(30), 0.5));
    assert_eq!(plan.link_faults[&(SiteId(1), SiteId(0))], f);
    assert!(SitesPlan::from_toml(GOOD).unwrap().link_faults.is_empty());
    let t0 = Instant::ZERO + Duration::from_millis(1);
    // Daemon 2 (site west) hears daemon 0 across the link.
    let mut west = plan.engine(2, Instant::ZERO).unwrap();
    let idle = west.poll_timeout();
    for _ in 0..1000 {
        west.handle_datagram(t0, NodeId(0), b"junk");
    }
    let (dropped, held) = (
        west.stats().link_dropped,
        west.link_layers[&SiteId(0)].held(),
    );
    assert_eq!(dropped + held as u64, 1000);
    assert!((400..600).contains(&dropped), "{dropped} of 1000 dropped");
    let due = t0 + Duration::from_millis(30);
    assert_eq!(west.poll_timeout(), Some(idle.map_or(due, |i| i.min(due))));
    assert_eq!(
        west.daemon().stats().bad_datagrams,
        0,
        "nothing reached the daemon before it was due"
    );
    west.handle_timeout(due);
    assert_eq!(west.stats().link_held, held as u64);
    assert_eq!(
        west.daemon().stats().bad_datagrams,
        held as u64,
        "handed over when due"
    );
    // Daemon 1 (site east) hears daemon 0 on its LAN: untouched.
    let mut east = plan.engine(1, Instant::ZERO).unwrap();
    east.handle_datagram(t0, NodeId(0), b"junk");
    assert_eq!((east.stats().link_dropped, east.stats().link_held), (0, 0));
}

/// A link's `protocol` sets both gateways' link to the other site, and
/// nothing else.
#[test]
fn a_links_protocol_is_set_at_both_ends() {
    let plan = SitesPlan::from_toml(GOOD).unwrap();
    assert!(plan.link_kinds.is_empty(), "Hop by default");
    let text = GOOD.replace("weight = 10", "weight = 10\nprotocol = \"tcp\"");
    let plan = SitesPlan::from_toml(&text).unwrap();
    for (id, other) in [(0, SiteId(1)), (1, SiteId(1)), (2, SiteId(0))] {
        let e = plan.engine(id, Instant::ZERO).unwrap();
        assert_eq!(e.daemon().link_kind(other), LinkKind::Tcp, "daemon {id}");
    }
}

/// A link's `rate_kbps` serialises what crosses it into a daemon: a burst
/// of datagrams leaves the queue one every (bytes + 28) × 8 / rate, and
/// what finds `queue_packets` waiting is dropped.
#[test]
fn a_links_rate_queues_and_drops_what_crosses_it() {
    let text = GOOD.replace(
        "weight = 10",
        "weight = 10\nrate_kbps = 1000\nqueue_packets = 10",
    );
    let plan = SitesPlan::from_toml(&text).unwrap();
    let f = plan.link_faults[&(SiteId(0), SiteId(1))];
    assert_eq!((f.rate_bps, f.queue_packets, f.loss), (Some(1e6), 10, 0.0));
    let mut west = plan.engine(2, Instant::ZERO).unwrap();
    let t0 = Instant::ZERO + Duration::from_millis(1);
    // 97 bytes + 28 = 1000 bits: 1 ms each at 1 Mbit/s.
    for _ in 0..15 {
        west.handle_datagram(t0, NodeId(0), &[0u8; 97]);
    }
    assert_eq!(west.stats().link_queue_dropped, 5);
    assert_eq!(west.link_layers[&SiteId(0)].held(), 10);
    assert_eq!(
        west.link_layers[&SiteId(0)].next_due(),
        Some(t0 + Duration::from_millis(1))
    );
    west.handle_timeout(t0 + Duration::from_micros(5_500));
    assert_eq!(west.stats().link_held, 5, "five through after 5.5 ms");
    // The queue has room again for what left it.
    west.handle_datagram(t0 + Duration::from_micros(5_500), NodeId(0), &[0u8; 97]);
    assert_eq!(west.stats().link_queue_dropped, 5);
    west.handle_timeout(t0 + Duration::from_millis(11));
    assert_eq!(west.stats().link_held, 11);
}

/// Two sites (two daemons and one) on loopback, each daemon a `Node` on
/// its own thread with its own UDP socket, every datagram sealed with a
/// cluster key: a client at each daemon joins, each sends agreed and safe
/// messages, and every client delivers every message in one order, judged
/// by the checker.
#[test]
fn two_sites_over_loopback_udp_deliver_agreed_and_safe() {
    let endpoints: Vec<Endpoint> = (0..3)
        .map(|_| Endpoint::bind_loopback(&SocketOptions::default()).unwrap())
        .collect();
    let text = format!(
        "[[site]]\nname = \"east\"\ndaemons = [{{ id = 0, addr = \"{}\" }}, {{ id = 1, addr = \"{}\" }}]\n\
         [[site]]\nname = \"west\"\ndaemons = [{{ id = 2, addr = \"{}\" }}]\n\
         [[link]]\na = \"east\"\nb = \"west\"\nweight = 1\n\
         [auth]\nkey = \"{KEY}\"\n",
        endpoints[0].local_addr(),
        endpoints[1].local_addr(),
        endpoints[2].local_addr()
    );
    let plan = SitesPlan::from_toml(&text).unwrap();
    let clock = Clock::new();
    let mut nodes: Vec<Node<SiteEngine>> = endpoints
        .into_iter()
        .enumerate()
        .map(|(i, ep)| {
            let engine = plan.engine(i as u32, clock.now()).unwrap();
            Node::spawn(engine, ep, plan.node_config(1).unwrap(), clock).unwrap()
        })
        .collect();
    let mut streams: Vec<_> = nodes.iter_mut().map(|n| n.take_events().unwrap()).collect();
    let names: Vec<String> = (0..3).map(|i| format!("#c0#d{i}")).collect();
    let mut records = Vec::new();
    for (n, name) in nodes.iter().zip(&names) {
        let name = name.clone();
        n.control(move |e, now, _| {
            e.daemon_mut().connect(&name);
            e.daemon_mut().join(now, &name, "g").unwrap();
        });
    }
    // The site membership merges the two sites (each starts alone).
    wait_for_every_site(&nodes);
    std::thread::sleep(Duration::from_millis(300));
    let mut delivered = 0;
    drain(&mut streams, &mut records, &mut delivered);
    let g = vec!["g".to_string()];
    for seq in 1..=20u64 {
        for (n, name) in nodes.iter().zip(&names) {
            let service = if seq % 2 == 0 {
                shoal_core::sites::Service::Safe
            } else {
                shoal_core::sites::Service::Agreed
            };
            records.push(shoal_check::Record::send(name, seq, service.into(), &["g"]));
            let (name, g) = (name.clone(), g.clone());
            n.control(move |e, now, _| {
                let payload = Bytes::copy_from_slice(&seq.to_be_bytes());
                e.daemon_mut()
                    .send(now, &name, service, &g, payload)
                    .unwrap();
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(1500));
    for n in nodes {
        n.shutdown().unwrap();
    }
    drain(&mut streams, &mut records, &mut delivered);
    // The views were recorded before the sends, the deliveries after all
    // of them: each client's records keep their order, except that a
    // send may be recorded before deliveries that preceded it (the
    // checker then assumes less causality, never more).
    let report = shoal_check::check(records);
    assert!(report.is_clean(), "{report}");
    assert_eq!(delivered, 3 * 60, "every client delivers all 60 messages");
}

/// Waits (at most 20 s) until every node's daemon is in a configuration
/// of every site, the change to it complete.
fn wait_for_every_site(nodes: &[Node<SiteEngine>]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let all = nodes.iter().all(|n| {
            let (tx, rx) = std::sync::mpsc::channel();
            n.control(move |e, _, _| {
                let d = e.daemon_mut();
                let (_, sites, changing) = d.configuration();
                let _ = tx.send(!changing && sites.len() == d.topology_sites());
            });
            rx.recv().unwrap_or(false)
        });
        if all {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sites did not merge within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

type Events = tokio::sync::mpsc::UnboundedReceiver<crate::EventBatch<Event>>;

/// Every event handed over so far, as the checker's records.
fn drain(streams: &mut [Events], records: &mut Vec<shoal_check::Record>, delivered: &mut usize) {
    for s in streams {
        while let Ok(batch) = s.try_recv() {
            for ev in batch.events {
                match ev {
                    Event::Deliver {
                        client,
                        sender,
                        service,
                        groups,
                        payload,
                        transitional,
                    } => {
                        *delivered += 1;
                        let seq = u64::from_be_bytes(payload[..8].try_into().unwrap());
                        records.push(shoal_check::Record::Deliver {
                            client,
                            msg: shoal_check::MsgId { sender, seq },
                            service: service.into(),
                            groups,
                            transitional,
                            at_ns: None,
                        });
                    }
                    Event::View {
                        client,
                        group,
                        view_id,
                        members,
                        transitional,
                        ..
                    } => records.push(shoal_check::Record::View {
                        client,
                        group,
                        view_id,
                        members,
                        transitional,
                        quorum: None,
                        at_ns: None,
                    }),
                    Event::Dropped { client } => records.push(shoal_check::Record::Ended {
                        client,
                        reason: "dropped by its daemon".into(),
                        at_ns: None,
                    }),
                }
            }
        }
    }
}

/// A link's `hop_rate_kbps` sets the bucket at both ends, the directed
/// ones each end's own; both forms together, a rate on a TCP link and a
/// rate of 0 are refused.
#[test]
fn a_links_hop_rate_sets_each_ends_bucket() {
    let both = GOOD.replace("weight = 10", "weight = 10\nhop_rate_kbps = 950");
    let plan = SitesPlan::from_toml(&both).unwrap();
    let east = plan.engine(0, Instant::ZERO).unwrap();
    let west = plan.engine(2, Instant::ZERO).unwrap();
    assert_eq!(east.daemon().link_hop_rate(SiteId(1)), 950_000);
    assert_eq!(west.daemon().link_hop_rate(SiteId(0)), 950_000);

    let directed = GOOD.replace(
        "weight = 10",
        "weight = 10\nhop_rate_a_to_b_kbps = 475\nhop_rate_b_to_a_kbps = 1900.5",
    );
    let plan = SitesPlan::from_toml(&directed).unwrap();
    let east = plan.engine(0, Instant::ZERO).unwrap();
    let west = plan.engine(2, Instant::ZERO).unwrap();
    assert_eq!(east.daemon().link_hop_rate(SiteId(1)), 475_000);
    assert_eq!(west.daemon().link_hop_rate(SiteId(0)), 1_900_500);

    let default = SitesPlan::from_toml(GOOD)
        .unwrap()
        .engine(0, Instant::ZERO)
        .unwrap();
    assert_eq!(
        default.daemon().link_hop_rate(SiteId(1)),
        shoal_core::hop::Config::default().rate_bps
    );

    let e = err(&GOOD.replace(
        "weight = 10",
        "weight = 10\nhop_rate_kbps = 950\nhop_rate_a_to_b_kbps = 1",
    ));
    assert!(e.contains("not both"), "{e}");
    let e = err(&GOOD.replace(
        "weight = 10",
        "weight = 10\nprotocol = \"tcp\"\nhop_rate_kbps = 950",
    ));
    assert!(e.contains("does not run Hop"), "{e}");
    let e = err(&GOOD.replace("weight = 10", "weight = 10\nhop_rate_kbps = 0"));
    assert!(e.contains("at least 0.001"), "{e}");
}

/// A site's `uplink_kbps` serialises every datagram its daemon sends to
/// another site (one every (bytes + 28) × 8 / rate, what finds
/// `access_queue_packets` waiting dropped), and `downlink_kbps` every
/// datagram it receives from another site; bad values are refused.
#[test]
fn a_sites_access_link_queues_both_ways() {
    let text = GOOD.replace(
        "name = \"west\"",
        "name = \"west\"\nuplink_kbps = 1000\ndownlink_kbps = 1000\naccess_queue_packets = 10",
    );
    let plan = SitesPlan::from_toml(&text).unwrap();
    let a = plan.access[&SiteId(1)];
    assert_eq!(
        (a.uplink_bps, a.downlink_bps, a.queue_packets),
        (Some(1e6), Some(1e6), 10)
    );
    assert!(!plan.access.contains_key(&SiteId(0)));

    // Uplink: 97 bytes + 28 = 1000 bits, 1 ms each at 1 Mbit/s.
    let mut west = plan.engine(2, Instant::ZERO).unwrap();
    let t0 = Instant::ZERO + Duration::from_millis(1);
    let marked = Bytes::from(vec![0xabu8; 97]);
    for _ in 0..15 {
        west.onto_uplink(t0, NodeId(0), marked.clone());
    }
    assert_eq!(west.stats().uplink_dropped, 5);
    let sent_by = |west: &mut SiteEngine, at: Instant| {
        std::iter::from_fn(|| west.poll_transmit(at))
            .filter(|t| t.payload == marked)
            .count()
    };
    assert_eq!(sent_by(&mut west, t0), 0, "nothing before its last bit");
    assert!(west.poll_timeout().unwrap() <= t0 + Duration::from_millis(1));
    assert_eq!(sent_by(&mut west, t0 + Duration::from_micros(5_500)), 5);
    assert_eq!(sent_by(&mut west, t0 + Duration::from_millis(11)), 5);

    // Downlink: from another site only, before the link's own faults.
    let mut west = plan.engine(2, Instant::ZERO).unwrap();
    for _ in 0..15 {
        west.handle_datagram(t0, NodeId(0), &[0u8; 97]);
    }
    assert_eq!(west.stats().downlink_dropped, 5);
    assert_eq!(west.link_layers[&SiteId(0)].held(), 10);
    west.handle_timeout(t0 + Duration::from_micros(5_500));
    assert_eq!(west.stats().link_held, 5, "five through after 5.5 ms");

    for bad in [
        "uplink_kbps = 0",
        "downlink_kbps = -1",
        "access_queue_packets = 0",
    ] {
        let e = err(&GOOD.replace("name = \"west\"", &format!("name = \"west\"\n{bad}")));
        assert!(e.contains("site \"west\""), "{bad}: {e}");
    }
}
