//! Throughput of the Ring over real UDP on loopback, the setup of Spread
//! 4.4's figure on this machine (`bench/RESULTS.md`, "Ring over UDP"):
//! `--members` daemons, each a `Node` on its own thread with its own UDP
//! socket on 127.0.0.1 (the ring's multicast goes as unicast to each other
//! member: no IP multicast); member 0 sends `--size`-byte messages as
//! fast as flow control lets it; every member, the sender included,
//! counts the messages it delivers during `--secs` after `--warmup`.
//! Prints one line per member and the slowest member's rate.
//!
//! Two engines:
//! - `--engine ring`: the bare Ring (`shoal_core::ring`), one ring of
//!   `--members`; agreed or safe.
//! - `--engine sites`: one site of `--members` daemons of the sites
//!   engine (`shoal_core::sites`: the Ring plus the site stream, the
//!   total order across sites, groups and the global window), one client
//!   per daemon in one group, the client of daemon 0 sending;
//!   `--global-window N` sets the engine's global window (default 200).
//!
//! Run (release build):
//! `cargo run --release -p shoal-net --example ring_throughput -- --engine ring --members 4`

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use shoal_core::overlay::{Site, Topology};
use shoal_core::ring::{self, Ring, RingId};
use shoal_core::sites::{self, SiteDaemon};
use shoal_core::NodeId;
use shoal_net::sites::SiteEngine;
use shoal_net::{AddressBook, Clock, Endpoint, EventBatch, Node, NodeConfig, SocketOptions};
use tokio::sync::mpsc::UnboundedReceiver;

struct Args {
    engine: String,
    members: usize,
    secs: f64,
    warmup: f64,
    size: usize,
    safe: bool,
    global_window: Option<usize>,
}

fn args() -> Args {
    let mut a = Args {
        engine: "ring".into(),
        members: 4,
        secs: 10.0,
        warmup: 2.0,
        size: 1000,
        safe: false,
        global_window: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--engine" => a.engine = v,
            "--members" => a.members = v.parse().expect("--members N"),
            "--secs" => a.secs = v.parse().expect("--secs S"),
            "--warmup" => a.warmup = v.parse().expect("--warmup S"),
            "--size" => a.size = v.parse().expect("--size BYTES"),
            "--global-window" => a.global_window = Some(v.parse().expect("--global-window N")),
            "--safe" => {
                a.safe = true;
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    assert!(a.members >= 1 && a.size >= 8);
    a
}

fn endpoints(n: usize) -> (Vec<Endpoint>, AddressBook) {
    let eps: Vec<Endpoint> = (0..n)
        .map(|_| Endpoint::bind_loopback(&SocketOptions::default()).expect("bind"))
        .collect();
    let book = AddressBook::new(eps.iter().map(Endpoint::local_addr).collect()).expect("book");
    (eps, book)
}

/// Counts deliveries in the window; returns (delivered in window, total).
fn count<Ev>(
    mut events: UnboundedReceiver<EventBatch<Ev>>,
    is_delivery: impl Fn(&Ev) -> bool + Send + 'static,
    from: std::time::Instant,
    to: std::time::Instant,
) -> std::thread::JoinHandle<(u64, u64)>
where
    Ev: Send + 'static,
{
    std::thread::spawn(move || {
        let (mut window, mut total) = (0u64, 0u64);
        while let Some(batch) = events.blocking_recv() {
            let n = batch.events.iter().filter(|e| is_delivery(e)).count() as u64;
            total += n;
            let now = std::time::Instant::now();
            if now >= from && now < to {
                window += n;
            }
            if now >= to {
                break;
            }
        }
        (window, total)
    })
}

/// The sender: until `to`, hands member 0 a closure that queues as many
/// messages as its engine takes (up to 1000), then sleeps 200 µs (500 µs
/// when none was taken). The same for both engines.
fn feed<E: Send + 'static>(
    to: std::time::Instant,
    make: impl Fn(std::sync::mpsc::Sender<u32>) -> shoal_net::Control<E> + Send + 'static,
    controls: tokio::sync::mpsc::UnboundedSender<shoal_net::Control<E>>,
) {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        while std::time::Instant::now() < to {
            let (tx, rx) = std::sync::mpsc::channel();
            if controls.send(make(tx)).is_err() {
                break;
            }
            match rx.recv() {
                Ok(0) => std::thread::sleep(Duration::from_micros(500)),
                Ok(_) => std::thread::sleep(Duration::from_micros(200)),
                Err(_) => break,
            }
        }
    });
}

fn main() {
    let a = args();
    let clock = Clock::new();
    let start = std::time::Instant::now();
    let from = start + Duration::from_secs_f64(a.warmup);
    let to = from + Duration::from_secs_f64(a.secs);
    let (eps, book) = endpoints(a.members);
    let payload = Bytes::from(vec![7u8; a.size]);
    let counters: Vec<std::thread::JoinHandle<(u64, u64)>>;
    let stop: Box<dyn FnOnce()>;
    match a.engine.as_str() {
        "ring" => {
            let members: Vec<NodeId> = (0..a.members as u32).map(NodeId).collect();
            let mut nodes: Vec<Node<Ring>> = eps
                .into_iter()
                .enumerate()
                .map(|(i, ep)| {
                    let ring = Ring::new(
                        ring::Config::default(),
                        NodeId(i as u32),
                        &members,
                        RingId { seq: 1, rep: 0 },
                        clock.now(),
                    )
                    .expect("ring");
                    Node::spawn(ring, ep, NodeConfig::new(book.clone()), clock).expect("node")
                })
                .collect();
            counters = nodes
                .iter_mut()
                .map(|n| {
                    let ev = n.take_events().expect("events");
                    count(ev, |e| matches!(e, ring::Event::Deliver { .. }), from, to)
                })
                .collect();
            let service = if a.safe {
                ring::Service::Safe
            } else {
                ring::Service::Agreed
            };
            let controls = nodes[0].controls();
            feed(
                to,
                move |accepted| -> shoal_net::Control<Ring> {
                    let p = payload.clone();
                    Box::new(move |r, now, _| {
                        let mut n = 0;
                        while n < 1000 && r.multicast_service(now, service, p.clone()).is_ok() {
                            n += 1;
                        }
                        let _ = accepted.send(n);
                    })
                },
                controls,
            );
            stop = Box::new(move || {
                for n in nodes {
                    let (_, stats) = n.shutdown().expect("shutdown");
                    eprintln!(
                        "  runtime: {} datagrams in, {} out, window_full {}",
                        stats.datagrams_received, stats.datagrams_sent, stats.window_full
                    );
                }
            });
        }
        "sites" => {
            let topo = Arc::new(Topology {
                sites: vec![Site {
                    name: "lan".into(),
                    daemons: (0..a.members as u32).map(NodeId).collect(),
                }],
                links: Vec::new(),
            });
            let mut nodes: Vec<Node<SiteEngine>> = eps
                .into_iter()
                .enumerate()
                .map(|(i, ep)| {
                    let mut config = sites::Config::default();
                    if let Some(w) = a.global_window {
                        config.global_window = w;
                    }
                    let d = SiteDaemon::new(config, topo.clone(), NodeId(i as u32), 1, clock.now())
                        .expect("daemon");
                    let engine = SiteEngine::new(d, &topo);
                    Node::spawn(engine, ep, NodeConfig::new(book.clone()), clock).expect("node")
                })
                .collect();
            for (i, n) in nodes.iter().enumerate() {
                n.control(move |e, now, _| {
                    let name = format!("#c0#d{i}");
                    e.daemon_mut().connect(&name);
                    e.daemon_mut().join(now, &name, "g").expect("join");
                });
            }
            counters = nodes
                .iter_mut()
                .map(|n| {
                    let ev = n.take_events().expect("events");
                    count(ev, |e| matches!(e, sites::Event::Deliver { .. }), from, to)
                })
                .collect();
            let service = if a.safe {
                sites::Service::Safe
            } else {
                sites::Service::Agreed
            };
            let controls = nodes[0].controls();
            let groups = vec!["g".to_string()];
            feed(
                to,
                move |accepted| -> shoal_net::Control<SiteEngine> {
                    let (p, g) = (payload.clone(), groups.clone());
                    Box::new(move |e, now, _| {
                        // Fill the daemon's queue; the global window decides
                        // what goes into the ring.
                        let mut n = 0;
                        while e.daemon().waiting() < 1000
                            && e.daemon_mut()
                                .send(now, "#c0#d0", service, &g, p.clone())
                                .is_ok()
                        {
                            n += 1;
                        }
                        let _ = accepted.send(n);
                    })
                },
                controls,
            );
            stop = Box::new(move || {
                for n in nodes {
                    let (e, stats) = n.shutdown().expect("shutdown");
                    eprintln!(
                        "  runtime: {} datagrams in, {} out; ring tokens {}, window waits {}",
                        stats.datagrams_received,
                        stats.datagrams_sent,
                        e.daemon().ring_stats().tokens,
                        e.daemon().stats().window_waits
                    );
                }
            });
        }
        other => panic!("--engine ring or sites, not {other}"),
    }
    let results: Vec<(u64, u64)> = counters
        .into_iter()
        .map(|c| c.join().expect("counter"))
        .collect();
    stop();
    let mut slowest = f64::MAX;
    for (i, (window, total)) in results.iter().enumerate() {
        let rate = *window as f64 / a.secs;
        slowest = slowest.min(rate);
        println!("member {i}: {rate:.0} msgs/s in the window ({total} delivered in all)");
    }
    println!(
        "engine {} members {} size {} {}: slowest member {:.0} msgs/s",
        a.engine,
        a.members,
        a.size,
        if a.safe { "safe" } else { "agreed" },
        slowest
    );
}
