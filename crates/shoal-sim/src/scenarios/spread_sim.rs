//! The wide-area simulator behind the `spread-*` scenarios (P-Spread §4):
//! one daemon per site (the paper ran one machine per site), overlay links
//! between neighbouring sites each run by a real link engine of
//! `shoal-core` (Hop, or the TCP model), routes from `shoal_core::overlay`
//! (source-based shortest-path trees with pruning), and the paper's
//! applications: an echo client measuring round trips, a flood at a set
//! rate, and an always-ready sender of reliable messages to every site.
//!
//! Physical links are modelled per direction (bandwidth with serialisation
//! and a drop-tail queue, propagation delay, independent loss). An overlay
//! link crosses one physical link per direction, or several (a site's
//! access link shared by all its overlay links, Table 1). Each daemon has a
//! CPU that spends `per_datagram` on every datagram it receives, and every
//! crossing between a client and its daemon costs `ipc` (the paper's
//! latencies include that IPC, §4.3). Event-driven, seeded, deterministic.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_core::hop::tcp::{TcpConfig, TcpLink};
use shoal_core::hop::{self, Event as LinkEvent, Hop, LinkProtocol};
use shoal_core::overlay::{LinkWeights, Membership, Routes, Site, SiteId, Topology};
use shoal_core::{Instant, NodeId};

use crate::LinkSpec;

/// IP and UDP headers a Hop datagram carries on the wire.
pub const UDP_IP_OVERHEAD: usize = 28;
/// IP header a TCP-model segment carries (its own 19-byte header stands
/// for TCP's 20).
pub const TCP_IP_OVERHEAD: usize = 20;
/// Bytes of the overlay header on every fragment (kind, source,
/// destination, message id, fragment index and count, send time).
pub const OVERLAY_HEADER: usize = 25;

/// Which protocol runs on every overlay link.
#[derive(Debug, Clone, PartialEq)]
pub enum LinkKind {
    Hop(hop::Config),
    Tcp(TcpConfig),
}

impl LinkKind {
    pub fn name(&self) -> &'static str {
        match self {
            LinkKind::Hop(_) => "hop",
            LinkKind::Tcp(c) if c.nagle => "tcp",
            LinkKind::Tcp(_) => "tcp-nodelay",
        }
    }

    fn overhead(&self) -> usize {
        match self {
            LinkKind::Hop(_) => UDP_IP_OVERHEAD,
            LinkKind::Tcp(_) => TCP_IP_OVERHEAD,
        }
    }
}

/// An overlay link: its physical path each way and its routing weights.
#[derive(Debug, Clone)]
pub struct WanLink {
    pub a: usize,
    pub b: usize,
    pub a_to_b: Vec<usize>,
    pub b_to_a: Vec<usize>,
    pub weight_ab: u32,
    pub weight_ba: u32,
}

/// Sites, physical links (one direction each) and the overlay over them.
#[derive(Debug, Clone)]
pub struct Wan {
    pub sites: Vec<String>,
    pub phys: Vec<LinkSpec>,
    pub links: Vec<WanLink>,
}

/// One overlay edge of a directly connected WAN: sites, round trip (ms),
/// capacity each way (bit/s).
#[derive(Debug, Clone, Copy)]
pub struct Edge {
    pub a: usize,
    pub b: usize,
    pub rtt_ms: f64,
    pub bandwidth_bps: f64,
}

/// Hop's leaky bucket runs at this share of its link's capacity: the
/// bucket counts Hop's datagram bytes, the wire adds 28 bytes of IP and
/// UDP to each (2.6% of a 1 KB message), and control items need a little
/// room. At 100% the bottleneck queue grew without bound and overflowed
/// (measured: 1287 instead of about 1380 Kbit/s loss-free on Mae
/// East-UCSB, with retransmissions of queue drops).
pub const HOP_BUCKET_SHARE: f64 = 0.95;

/// Queue of every physical link, in packets.
pub const QUEUE_PACKETS: usize = 100;

impl Wan {
    /// Each overlay edge on its own physical link each way, half the
    /// round trip of propagation delay each, weight 1 (so routes follow
    /// the fewest links, as the paper's hardwired routes did).
    pub fn direct(sites: &[&str], edges: &[Edge], loss: f64) -> Wan {
        let mut phys = Vec::new();
        let mut links = Vec::new();
        for e in edges {
            let spec = LinkSpec {
                bandwidth_bps: e.bandwidth_bps,
                delay_ns: (e.rtt_ms * 1e6 / 2.0) as u64,
                loss,
                queue_packets: QUEUE_PACKETS,
            };
            phys.push(spec);
            phys.push(spec);
            links.push(WanLink {
                a: e.a,
                b: e.b,
                a_to_b: vec![phys.len() - 2],
                b_to_a: vec![phys.len() - 1],
                weight_ab: 1,
                weight_ba: 1,
            });
        }
        Wan {
            sites: sites.iter().map(|s| s.to_string()).collect(),
            phys,
            links,
        }
    }

    /// Sites behind access links: site i reaches the Internet core through
    /// an uplink and a downlink of `access_bps[i]`, shared by all its
    /// overlay links; the core between two sites has the pair's round trip
    /// (`rtt_ms[a][b]`) and ample capacity (1 Gbit/s). Every pair of sites
    /// is a potential overlay link with `weight(a, b)` each way (`None`:
    /// no link).
    pub fn access(
        sites: &[&str],
        access_bps: &[f64],
        rtt_ms: &[[f64; 6]; 6],
        loss: f64,
        weight: impl Fn(usize, usize) -> Option<u32>,
    ) -> Wan {
        let n = sites.len();
        let spec = |bandwidth_bps: f64, delay_ns: u64| LinkSpec {
            bandwidth_bps,
            delay_ns,
            loss,
            queue_packets: QUEUE_PACKETS,
        };
        // Uplinks 0..n, downlinks n..2n; loss once per direction, on the
        // core link only.
        let mut phys: Vec<LinkSpec> = access_bps
            .iter()
            .map(|&b| LinkSpec {
                loss: 0.0,
                ..spec(b, 0)
            })
            .collect();
        phys.extend(access_bps.iter().map(|&b| LinkSpec {
            loss: 0.0,
            ..spec(b, 0)
        }));
        let mut links = Vec::new();
        let pairs = (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b)));
        for (a, b) in pairs {
            let Some(w) = weight(a, b) else {
                continue;
            };
            let delay = (rtt_ms[a][b] * 1e6 / 2.0) as u64;
            phys.push(spec(1e9, delay));
            phys.push(spec(1e9, delay));
            let (ab, ba) = (phys.len() - 2, phys.len() - 1);
            links.push(WanLink {
                a,
                b,
                a_to_b: vec![a, ab, n + b],
                b_to_a: vec![b, ba, n + a],
                weight_ab: w,
                weight_ba: w,
            });
        }
        Wan {
            sites: sites.iter().map(|s| s.to_string()).collect(),
            phys,
            links,
        }
    }

    /// A round trip over the idle overlay path `path` (sites) of a
    /// `bytes`-byte datagram: the sum of each link's ping, as the paper
    /// sums per-link pings for its chain (§4.3). No CPU cost: the kernel
    /// answers a ping.
    pub fn ping_ns(&self, path: &[usize], bytes: usize) -> u64 {
        path.windows(2)
            .map(|w| {
                let (ab, ba) = self.paths(w[0], w[1]);
                [ab, ba]
                    .iter()
                    .flat_map(|p| p.iter())
                    .map(|&l| {
                        let s = &self.phys[l];
                        s.delay_ns + (bytes as f64 * 8.0 / s.bandwidth_bps * 1e9) as u64
                    })
                    .sum::<u64>()
            })
            .sum()
    }

    fn paths(&self, a: usize, b: usize) -> (&[usize], &[usize]) {
        let l = self
            .links
            .iter()
            .find(|l| (l.a, l.b) == (a, b) || (l.a, l.b) == (b, a))
            .expect("adjacent sites");
        if l.a == a {
            (&l.a_to_b, &l.b_to_a)
        } else {
            (&l.b_to_a, &l.a_to_b)
        }
    }

    /// The overlay topology: site i's one daemon is `NodeId(i)`.
    pub fn topology(&self) -> Topology {
        Topology {
            sites: self
                .sites
                .iter()
                .enumerate()
                .map(|(i, name)| Site {
                    name: name.clone(),
                    daemons: vec![NodeId(i as u32)],
                })
                .collect(),
            links: self
                .links
                .iter()
                .map(|l| LinkWeights {
                    a: SiteId(l.a as u16),
                    b: SiteId(l.b as u16),
                    a_to_b: Some(l.weight_ab),
                    b_to_a: Some(l.weight_ba),
                })
                .collect(),
        }
    }
}

/// CPU and IPC costs of a daemon (assumed: the paper gives none).
#[derive(Debug, Clone, Copy)]
pub struct Costs {
    /// CPU per datagram a daemon receives.
    pub per_datagram: Duration,
    /// One crossing between a client and its daemon.
    pub ipc: Duration,
}

impl Default for Costs {
    /// 100 µs per datagram (a 1999 Sparc or Pentium II handling a 1 KB
    /// datagram through a user-level daemon) and 250 µs per IPC crossing
    /// (a local TCP or Unix socket hop and a context switch). Assumed.
    fn default() -> Costs {
        Costs {
            per_datagram: Duration::from_micros(100),
            ipc: Duration::from_micros(250),
        }
    }
}

/// What the applications do in a run.
#[derive(Debug, Clone, Default)]
pub struct Workload {
    /// An echo client at `from` bouncing `count` messages of `size` bytes
    /// off a client at `to`, each sent when the previous echo returned.
    pub echo: Option<Echo>,
    /// A flood from `from` to `to` at `rate_bps` of `size`-byte messages.
    pub flood: Option<Flood>,
    /// `count` messages of `size` bytes from `from` to every other site,
    /// the sender always ready (its daemon's outgoing queues kept full).
    pub stream: Option<Stream>,
}

#[derive(Debug, Clone, Copy)]
pub struct Echo {
    pub from: usize,
    pub to: usize,
    pub size: usize,
    pub count: u64,
    /// Pause between an echo's return and the next send.
    pub gap: Duration,
}

impl Echo {
    /// `count` echoes of `size` bytes, 10 ms apart (the paper's runs were
    /// back to back; the pause keeps one echo's tail from the next).
    pub fn new(from: usize, to: usize, size: usize, count: u64) -> Echo {
        Echo {
            from,
            to,
            size,
            count,
            gap: Duration::from_millis(10),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Flood {
    pub from: usize,
    pub to: usize,
    pub size: usize,
    pub rate_bps: f64,
}

#[derive(Debug, Clone, Copy)]
pub struct Stream {
    pub from: usize,
    pub size: usize,
    pub count: u64,
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Echo round trips, in order.
    pub rtt_ns: Vec<u64>,
    /// Per site: stream messages delivered and when the last one arrived.
    pub stream_delivered: Vec<u64>,
    pub stream_last_ns: Vec<u64>,
    /// When the stream's first message was handed to the source daemon.
    pub stream_start_ns: u64,
    /// Flood messages delivered at the flood's destination.
    pub flood_delivered: u64,
    /// Datagrams and bytes sent on all overlay links (headers included).
    pub datagrams: u64,
    pub bytes: u64,
    /// Hop retransmissions / TCP retransmitted segments, all links.
    pub retransmissions: u64,
    /// Links that declared failure.
    pub failed_links: u64,
    pub events: u64,
}

const KIND_ECHO: u8 = 1;
const KIND_REPLY: u8 = 2;
const KIND_FLOOD: u8 = 3;
const KIND_STREAM: u8 = 4;
const ALL: u16 = u16::MAX;
/// The source keeps this many messages queued per outgoing link.
const STREAM_QUEUE: usize = 64;

#[derive(Debug)]
enum Ev {
    /// A datagram finishes crossing physical link `path[hop]`.
    Arrive {
        from: usize,
        to: usize,
        hop: usize,
        bytes: Vec<u8>,
    },
    /// The receiving daemon's CPU is done with it.
    Process {
        site: usize,
        from: usize,
        bytes: Vec<u8>,
    },
    Wake {
        site: usize,
        generation: u64,
    },
    /// A client hands its daemon a message.
    Originate {
        site: usize,
        kind: u8,
        to: u16,
        id: u64,
        size: usize,
        sent_ns: u64,
    },
    /// The flood's next message is due.
    FloodTick,
}

struct Port {
    peer: usize,
    engine: Box<dyn LinkProtocol + Send>,
    backlog: VecDeque<Bytes>,
}

struct Daemon {
    ports: Vec<Port>,
    port_of: Vec<Option<usize>>,
    busy_until: u64,
    generation: u64,
    armed: Option<u64>,
    /// (source, id) → fragments received.
    partial: BTreeMap<(u16, u64), (u16, u16)>,
}

struct PhysLink {
    spec: LinkSpec,
    busy_until: u64,
    queue: VecDeque<u64>,
}

impl PhysLink {
    fn offer(&mut self, now: u64, len: usize, roll: f64) -> Option<u64> {
        while self.queue.front().is_some_and(|d| *d <= now) {
            self.queue.pop_front();
        }
        if self.queue.len() >= self.spec.queue_packets {
            return None;
        }
        let serialisation = (len as f64 * 8.0 / self.spec.bandwidth_bps * 1e9) as u64;
        let depart = self.busy_until.max(now) + serialisation;
        self.busy_until = depart;
        self.queue.push_back(depart);
        (roll >= self.spec.loss).then_some(depart + self.spec.delay_ns)
    }
}

/// A run: a WAN, a link protocol on every overlay link, and a workload.
pub struct SpreadSim {
    wan: Wan,
    routes: Routes,
    kind: LinkKind,
    costs: Costs,
    work: Workload,
    daemons: Vec<Daemon>,
    phys: Vec<PhysLink>,
    queue: BTreeMap<(u64, u64), Ev>,
    order: u64,
    now: u64,
    rng: Xoshiro256PlusPlus,
    next_id: u64,
    stream_sent: u64,
    out: Outcome,
}

impl SpreadSim {
    pub fn new(wan: Wan, kind: LinkKind, costs: Costs, work: Workload, seed: u64) -> SpreadSim {
        let topology = wan.topology();
        topology.validate().expect("valid WAN");
        let membership = Membership {
            live: (0..wan.sites.len() as u32).map(NodeId).collect(),
            failed_links: Default::default(),
        };
        let routes = Routes::compute(&topology, &membership);
        let n = wan.sites.len();
        let mut daemons: Vec<Daemon> = (0..n)
            .map(|_| Daemon {
                ports: Vec::new(),
                port_of: vec![None; n],
                busy_until: 0,
                generation: 0,
                armed: None,
                partial: BTreeMap::new(),
            })
            .collect();
        // Overlay link directions leaving through each physical link.
        let mut users = vec![0usize; wan.phys.len()];
        for l in &wan.links {
            users[l.a_to_b[0]] += 1;
            users[l.b_to_a[0]] += 1;
        }
        for (i, l) in wan.links.iter().enumerate() {
            for (me, peer, path) in [(l.a, l.b, &l.a_to_b), (l.b, l.a, &l.b_to_a)] {
                // An operator splits the site's own uplink among the
                // overlay links that leave through it (§3.2: the bucket is
                // set per link and can follow a reservation); the far
                // end's access is shared with other senders' links, which
                // no static setting can know, so it counts in full.
                let capacity = path
                    .iter()
                    .enumerate()
                    .map(|(k, &p)| {
                        let share = if k == 0 { users[p] as f64 } else { 1.0 };
                        wan.phys[p].bandwidth_bps / share
                    })
                    .fold(f64::INFINITY, f64::min);
                let engine: Box<dyn LinkProtocol + Send> = match &kind {
                    LinkKind::Hop(config) => Box::new(
                        Hop::new(
                            hop::Config {
                                rate_bps: (capacity * HOP_BUCKET_SHARE) as u64,
                                ..config.clone()
                            },
                            i as u8,
                            Instant::ZERO,
                        )
                        .expect("valid Hop config"),
                    ),
                    LinkKind::Tcp(config) => Box::new(TcpLink::new(config.clone(), Instant::ZERO)),
                };
                let d = &mut daemons[me];
                d.port_of[peer] = Some(d.ports.len());
                d.ports.push(Port {
                    peer,
                    engine,
                    backlog: VecDeque::new(),
                });
            }
        }
        let phys = wan
            .phys
            .iter()
            .map(|&spec| PhysLink {
                spec,
                busy_until: 0,
                queue: VecDeque::new(),
            })
            .collect();
        let mut out = Outcome {
            stream_delivered: vec![0; n],
            stream_last_ns: vec![0; n],
            ..Outcome::default()
        };
        out.stream_start_ns = 0;
        SpreadSim {
            wan,
            routes,
            kind,
            costs,
            work,
            daemons,
            phys,
            queue: BTreeMap::new(),
            order: 0,
            now: 0,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            next_id: 0,
            stream_sent: 0,
            out,
        }
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.order += 1;
        self.queue.insert((at, self.order), ev);
    }

    /// Runs until the workload is done or `limit` of simulated time.
    pub fn run(mut self, limit: Duration) -> Outcome {
        let limit = limit.as_nanos() as u64;
        if let Some(e) = self.work.echo {
            self.send_echo(e, 0);
        }
        if self.work.flood.is_some() {
            self.push(0, Ev::FloodTick);
        }
        if let Some(s) = self.work.stream {
            self.drain(s.from);
        }
        while let Some(((at, _), ev)) = self.queue.pop_first() {
            if at > limit || self.done() {
                break;
            }
            self.now = at;
            self.out.events += 1;
            self.on_event(ev);
        }
        for d in &self.daemons {
            for p in &d.ports {
                self.out.retransmissions += p.engine.retransmissions();
            }
        }
        self.out
    }

    fn done(&self) -> bool {
        let echo_done = self
            .work
            .echo
            .is_none_or(|e| self.out.rtt_ns.len() as u64 >= e.count);
        let stream_done = self.work.stream.is_none_or(|s| {
            self.stream_receivers(s)
                .iter()
                .all(|&i| self.out.stream_delivered[i] >= s.count)
        });
        echo_done && stream_done
    }

    fn on_event(&mut self, ev: Ev) {
        match ev {
            Ev::Arrive {
                from,
                to,
                hop,
                bytes,
            } => self.on_arrive(from, to, hop, bytes),
            Ev::Process { site, from, bytes } => {
                let now = Instant::from_nanos(self.now);
                if let Some(p) = self.daemons[site].port_of[from] {
                    self.daemons[site].ports[p]
                        .engine
                        .handle_datagram(now, &bytes);
                }
                self.drain(site);
            }
            Ev::Wake { site, generation } => {
                if self.daemons[site].generation != generation {
                    return;
                }
                self.daemons[site].armed = None;
                let now = Instant::from_nanos(self.now);
                for p in &mut self.daemons[site].ports {
                    if p.engine.poll_timeout().is_some_and(|t| t <= now) {
                        p.engine.handle_timeout(now);
                    }
                }
                self.drain(site);
            }
            Ev::Originate {
                site,
                kind,
                to,
                id,
                size,
                sent_ns,
            } => {
                self.originate(site, kind, to, id, size, sent_ns);
                self.drain(site);
            }
            Ev::FloodTick => self.on_flood_tick(),
        }
    }

    fn on_arrive(&mut self, from: usize, to: usize, hop: usize, bytes: Vec<u8>) {
        let (path, _) = self.wan.paths(from, to);
        if hop + 1 < path.len() {
            let next = path[hop + 1];
            self.offer(next, from, to, hop + 1, bytes);
            return;
        }
        let d = &mut self.daemons[to];
        let done = d.busy_until.max(self.now) + self.costs.per_datagram.as_nanos() as u64;
        d.busy_until = done;
        self.push(
            done,
            Ev::Process {
                site: to,
                from,
                bytes,
            },
        );
    }

    fn offer(&mut self, phys: usize, from: usize, to: usize, hop: usize, bytes: Vec<u8>) {
        let len = bytes.len() + self.kind.overhead();
        let roll = self.rng.random::<f64>();
        if let Some(at) = self.phys[phys].offer(self.now, len, roll) {
            self.push(
                at,
                Ev::Arrive {
                    from,
                    to,
                    hop,
                    bytes,
                },
            );
        }
    }

    /// A client's message enters its daemon: fragments, routed.
    fn originate(&mut self, site: usize, kind: u8, to: u16, id: u64, size: usize, sent_ns: u64) {
        let room = self.daemons[site].ports[0].engine.max_message() - OVERLAY_HEADER;
        let frags = size.div_ceil(room).max(1) as u16;
        for f in 0..frags {
            let len = if f + 1 == frags {
                size - room * usize::from(frags - 1)
            } else {
                room
            };
            let mut m = Vec::with_capacity(OVERLAY_HEADER + len);
            m.push(kind);
            m.extend_from_slice(&(site as u16).to_be_bytes());
            m.extend_from_slice(&to.to_be_bytes());
            m.extend_from_slice(&id.to_be_bytes());
            m.extend_from_slice(&f.to_be_bytes());
            m.extend_from_slice(&frags.to_be_bytes());
            m.extend_from_slice(&sent_ns.to_be_bytes());
            m.resize(OVERLAY_HEADER + len, 0);
            self.forward(site, Bytes::from(m));
        }
    }

    /// Sends `m` on from `at` along its source's tree (pruned to its
    /// destination when it has one).
    fn forward(&mut self, at: usize, m: Bytes) {
        let src = SiteId(u16::from_be_bytes([m[1], m[2]]));
        let dst = u16::from_be_bytes([m[3], m[4]]);
        let me = SiteId(at as u16);
        let targets: Vec<SiteId> = if dst == ALL {
            self.routes.children(src, me).to_vec()
        } else {
            self.child_towards(src, me, SiteId(dst))
                .into_iter()
                .collect()
        };
        let now = Instant::from_nanos(self.now);
        for t in targets {
            let d = &mut self.daemons[at];
            let port = &mut d.ports[d.port_of[usize::from(t.0)].expect("tree follows links")];
            if !port.backlog.is_empty() || port.engine.send(now, m.clone()).is_err() {
                port.backlog.push_back(m.clone());
            }
        }
    }

    fn child_towards(&self, src: SiteId, at: SiteId, dst: SiteId) -> Option<SiteId> {
        let mut v = dst;
        loop {
            let p = self.routes.parent(src, v)?;
            if p == at {
                return Some(v);
            }
            v = p;
        }
    }

    fn drain(&mut self, site: usize) {
        let now = Instant::from_nanos(self.now);
        loop {
            let mut progress = false;
            for p in 0..self.daemons[site].ports.len() {
                let port = &mut self.daemons[site].ports[p];
                while let Some(m) = port.backlog.front() {
                    if port.engine.send(now, m.clone()).is_err() {
                        break;
                    }
                    port.backlog.pop_front();
                }
                let peer = port.peer;
                let mut out = Vec::new();
                while let Some(d) = port.engine.poll_transmit(now) {
                    out.push(d);
                }
                let mut events = Vec::new();
                while let Some(e) = port.engine.poll_event() {
                    events.push(e);
                }
                progress |= !out.is_empty() || !events.is_empty();
                for d in out {
                    self.out.datagrams += 1;
                    self.out.bytes += (d.len() + self.kind.overhead()) as u64;
                    let first = self.wan.paths(site, peer).0[0];
                    self.offer(first, site, peer, 0, d);
                }
                for e in events {
                    match e {
                        LinkEvent::Deliver { payload, .. } => self.on_message(site, payload),
                        LinkEvent::LinkFailed => self.out.failed_links += 1,
                    }
                }
            }
            if let Some(s) = self.work.stream {
                if s.from == site {
                    progress |= self.top_up_stream(s);
                }
            }
            if !progress {
                break;
            }
        }
        self.arm(site);
    }

    fn arm(&mut self, site: usize) {
        let next = self.daemons[site]
            .ports
            .iter()
            .filter_map(|p| p.engine.poll_timeout())
            .min()
            .map(|t| t.as_nanos().max(self.now));
        let d = &mut self.daemons[site];
        if next.is_none() || next == d.armed {
            return;
        }
        d.generation += 1;
        d.armed = next;
        let generation = d.generation;
        self.push(next.expect("some"), Ev::Wake { site, generation });
    }

    /// A fragment arrived at `site` over a link: forward it on at once
    /// (non-blocking, whatever the link protocol), and deliver it here
    /// when this site is a destination.
    fn on_message(&mut self, site: usize, m: Bytes) {
        if m.len() < OVERLAY_HEADER {
            return;
        }
        self.forward(site, m.clone());
        let kind = m[0];
        let src = u16::from_be_bytes([m[1], m[2]]);
        let dst = u16::from_be_bytes([m[3], m[4]]);
        if dst != ALL && usize::from(dst) != site {
            return;
        }
        let id = u64::from_be_bytes(m[5..13].try_into().expect("8 bytes"));
        let frags = u16::from_be_bytes([m[15], m[16]]);
        let sent_ns = u64::from_be_bytes(m[17..25].try_into().expect("8 bytes"));
        let entry = self.daemons[site]
            .partial
            .entry((src, id))
            .or_insert((0, frags));
        entry.0 += 1;
        if entry.0 < entry.1 {
            return;
        }
        self.daemons[site].partial.remove(&(src, id));
        self.on_complete(site, kind, usize::from(src), id, sent_ns);
    }

    fn on_complete(&mut self, site: usize, kind: u8, src: usize, id: u64, sent_ns: u64) {
        let ipc = self.costs.ipc.as_nanos() as u64;
        match kind {
            KIND_ECHO => {
                let e = self.work.echo.expect("echo running");
                // Daemon → echo client → daemon.
                self.push(
                    self.now + 2 * ipc,
                    Ev::Originate {
                        site,
                        kind: KIND_REPLY,
                        to: src as u16,
                        id,
                        size: e.size,
                        sent_ns,
                    },
                );
            }
            KIND_REPLY => {
                let e = self.work.echo.expect("echo running");
                let back = self.now + ipc;
                self.out.rtt_ns.push(back - sent_ns);
                if (self.out.rtt_ns.len() as u64) < e.count {
                    self.send_echo(e, back + e.gap.as_nanos() as u64);
                }
            }
            KIND_FLOOD => self.out.flood_delivered += 1,
            KIND_STREAM => {
                self.out.stream_delivered[site] += 1;
                self.out.stream_last_ns[site] = self.now + ipc;
            }
            _ => {}
        }
    }

    fn send_echo(&mut self, e: Echo, at: u64) {
        self.next_id += 1;
        let id = self.next_id;
        self.push(
            at + self.costs.ipc.as_nanos() as u64,
            Ev::Originate {
                site: e.from,
                kind: KIND_ECHO,
                to: e.to as u16,
                id,
                size: e.size,
                sent_ns: at,
            },
        );
    }

    fn on_flood_tick(&mut self) {
        let f = self.work.flood.expect("flood running");
        if f.rate_bps <= 0.0 {
            return;
        }
        self.next_id += 1;
        let id = self.next_id;
        self.originate(f.from, KIND_FLOOD, f.to as u16, id, f.size, self.now);
        self.drain(f.from);
        let gap = (f.size as f64 * 8.0 / f.rate_bps * 1e9) as u64;
        self.push(self.now + gap.max(1), Ev::FloodTick);
    }

    /// The sites a stream reaches: every site in its source's tree.
    fn stream_receivers(&self, s: Stream) -> Vec<usize> {
        self.routes
            .tree_order(SiteId(s.from as u16))
            .iter()
            .skip(1)
            .map(|x| usize::from(x.0))
            .collect()
    }

    /// Keeps the stream source's outgoing links fed; true when it sent.
    fn top_up_stream(&mut self, s: Stream) -> bool {
        let me = SiteId(s.from as u16);
        let children: Vec<usize> = self
            .routes
            .children(me, me)
            .iter()
            .map(|c| self.daemons[s.from].port_of[usize::from(c.0)].expect("link"))
            .collect();
        let mut sent = false;
        while self.stream_sent < s.count
            && children.iter().all(|&p| {
                let port = &self.daemons[s.from].ports[p];
                port.engine.queued() + port.backlog.len() < STREAM_QUEUE
            })
        {
            self.stream_sent += 1;
            self.next_id += 1;
            let id = self.next_id;
            self.originate(s.from, KIND_STREAM, ALL, id, s.size, self.now);
            sent = true;
        }
        sent
    }
}

/// The paper's six sites (§4.1), as indices.
pub const MAE_EAST: usize = 0;
pub const UCSB: usize = 1;
pub const OSU: usize = 2;
pub const RUTGERS: usize = 3;
pub const CNDS: usize = 4;
pub const HOPKINS: usize = 5;
pub const SITES: [&str; 6] = ["Mae East", "UCSB", "OSU", "Rutgers", "CNDS", "Hopkins"];

/// WAN capacity of every inter-site link (assumed: the paper gives none;
/// Table 3's loss-free 1.38 Mbit/s on Mae East-UCSB suggests a T1-class
/// path, 1.5 Mbit/s).
pub const WAN_BPS: f64 = 1.5e6;
/// CNDS-Hopkins, two labs of one campus (assumed).
pub const CAMPUS_BPS: f64 = 10e6;

/// The chain of §4.3 (Fig 1): Mae East-UCSB-OSU-Rutgers-CNDS-Hopkins. Only
/// Mae East-UCSB's round trip is in the paper (104 ms, Table 2); the
/// others are assumed from geography (the reading notes' proposal).
pub fn chain_edges() -> Vec<Edge> {
    [
        (MAE_EAST, UCSB, 104.0, WAN_BPS),
        (UCSB, OSU, 60.0, WAN_BPS),
        (OSU, RUTGERS, 25.0, WAN_BPS),
        (RUTGERS, CNDS, 8.0, WAN_BPS),
        (CNDS, HOPKINS, 0.5, CAMPUS_BPS),
    ]
    .into_iter()
    .map(|(a, b, rtt_ms, bandwidth_bps)| Edge {
        a,
        b,
        rtt_ms,
        bandwidth_bps,
    })
    .collect()
}

/// The "Multicast Tree Network" of Fig 1, whose edges the text does not
/// give (the figure is lost). Assumed, built as the paper says, from
/// latency: the two JHU sites together, Mae East the hub of the east
/// coast, UCSB reached through OSU.
pub fn tree_edges() -> Vec<Edge> {
    [
        (MAE_EAST, CNDS, 4.0, WAN_BPS),
        (CNDS, HOPKINS, 0.5, CAMPUS_BPS),
        (MAE_EAST, RUTGERS, 8.0, WAN_BPS),
        (MAE_EAST, OSU, 20.0, WAN_BPS),
        (OSU, UCSB, 60.0, WAN_BPS),
    ]
    .into_iter()
    .map(|(a, b, rtt_ms, bandwidth_bps)| Edge {
        a,
        b,
        rtt_ms,
        bandwidth_bps,
    })
    .collect()
}

/// Background loss per link and direction swept by the latency
/// experiments: the Internet's loss in 1999 is not reported, and with none
/// TCP and Hop behave alike (reading notes).
pub const BACKGROUND_LOSS: [f64; 4] = [0.0, 0.005, 0.01, 0.02];

/// The Hop and TCP link settings every experiment uses: the defaults.
pub fn link_kinds() -> [LinkKind; 2] {
    [
        LinkKind::Hop(hop::Config::default()),
        LinkKind::Tcp(TcpConfig::default()),
    ]
}

/// As [`link_kinds`], plus TCP with Nagle's algorithm off (TCP_NODELAY),
/// for the experiments where Nagle decides the result (Figs 10-11): the
/// paper does not say which Spread used.
pub fn link_kinds_with_nodelay() -> [LinkKind; 3] {
    let [hop, tcp] = link_kinds();
    let nodelay = LinkKind::Tcp(TcpConfig {
        nagle: false,
        ..TcpConfig::default()
    });
    [hop, tcp, nodelay]
}

/// The round trip of a `size`-byte message over the idle `path` if it
/// were sent as back-to-back datagrams of at most `mtu` bytes of payload
/// with nothing else in the way: one datagram's summed per-link ping plus,
/// each way, the time the rest of the message takes at the slowest link.
/// Fig 10's "what can be attributed to the size of the message".
pub fn ideal_rtt_ns(wan: &Wan, path: &[usize], size: usize, mtu: usize) -> u64 {
    let first = size.min(mtu);
    let rest = size - first;
    let slowest = path
        .windows(2)
        .flat_map(|w| {
            let (ab, ba) = wan.paths(w[0], w[1]);
            ab.iter()
                .chain(ba)
                .map(|&l| wan.phys[l].bandwidth_bps)
                .collect::<Vec<_>>()
        })
        .fold(f64::INFINITY, f64::min);
    wan.ping_ns(path, first + 28) + 2 * ((rest as f64 * 8.0 / slowest) * 1e9) as u64
}

/// Round-trip summary in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct RttStats {
    pub min: f64,
    pub avg: f64,
    pub max: f64,
    pub p99: f64,
    pub count: usize,
}

impl RttStats {
    pub fn of(rtt_ns: &[u64]) -> RttStats {
        if rtt_ns.is_empty() {
            return RttStats::default();
        }
        let mut ms: Vec<f64> = rtt_ns.iter().map(|&n| n as f64 / 1e6).collect();
        ms.sort_by(f64::total_cmp);
        let p99 = ms[((ms.len() as f64 * 0.99).ceil() as usize).clamp(1, ms.len()) - 1];
        RttStats {
            min: ms[0],
            avg: ms.iter().sum::<f64>() / ms.len() as f64,
            max: ms[ms.len() - 1],
            p99,
            count: ms.len(),
        }
    }
}

/// Runs an echo test over `wan`, with an optional flood alongside.
pub fn echo_run(
    wan: &Wan,
    kind: &LinkKind,
    echo: Echo,
    flood: Option<Flood>,
    seed: u64,
) -> (RttStats, Outcome) {
    let work = Workload {
        echo: Some(echo),
        flood,
        stream: None,
    };
    let sim = SpreadSim::new(wan.clone(), kind.clone(), Costs::default(), work, seed);
    let out = sim.run(Duration::from_secs(3600));
    (RttStats::of(&out.rtt_ns), out)
}

/// Pushes `(column, value)` pairs as one summary row.
pub fn row(pairs: &[(&str, String)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Figs 6-9: the chain, echoes from `order[0]` to each other site in turn,
/// Hop and TCP at each background loss; RTT and overhead over the summed
/// per-link pings against the number of links crossed.
pub fn chain_figure(
    name: &str,
    order: &[usize],
    scale: super::Scale,
    rtt_plot: &str,
    overhead_plot: &str,
) -> super::Figure {
    use super::figure::Plot;
    use shoal_plot::Series;
    let started = std::time::Instant::now();
    let mut figure = super::Figure::new(name);
    let count = scale.pick(2000, 1000);
    let mut rtt_series: Vec<Series> = Vec::new();
    let mut overhead_series: Vec<Series> = Vec::new();
    let mut ping_points = Vec::new();
    let idle = Wan::direct(&SITES, &chain_edges(), 0.0);
    for k in 1..order.len() {
        let ping = idle.ping_ns(&order[..=k], 1024 + 28) as f64 / 1e6;
        ping_points.push((k as f64, ping));
    }
    rtt_series.push(Series::new("ping (sum of links)", ping_points.clone()));
    for kind in link_kinds() {
        for loss in BACKGROUND_LOSS {
            let wan = Wan::direct(&SITES, &chain_edges(), loss);
            let mut rtt_points = Vec::new();
            let mut overhead_points = Vec::new();
            for (k, &to) in order.iter().enumerate().skip(1) {
                let ping = ping_points[k - 1].1;
                let mut avgs = Vec::new();
                for seed in scale.seeds() {
                    let echo = Echo::new(order[0], to, 1024, count);
                    let (s, out) = echo_run(&wan, &kind, echo, None, seed);
                    figure.wall.events += out.events;
                    let overhead = (s.avg - ping) / ping * 100.0;
                    avgs.push(s.avg);
                    figure.rows.push(row(&[
                        ("protocol", kind.name().into()),
                        ("loss", loss.to_string()),
                        ("seed", seed.to_string()),
                        ("receiver", SITES[to].into()),
                        ("links", k.to_string()),
                        ("echoes", s.count.to_string()),
                        ("ping_ms", format!("{ping:.3}")),
                        ("min_ms", format!("{:.3}", s.min)),
                        ("avg_ms", format!("{:.3}", s.avg)),
                        ("max_ms", format!("{:.3}", s.max)),
                        ("p99_ms", format!("{:.3}", s.p99)),
                        ("overhead_pct", format!("{overhead:.2}")),
                        ("retransmissions", out.retransmissions.to_string()),
                    ]));
                    if s.count as u64 != count {
                        figure.incomplete.push(format!(
                            "{} loss {loss} to {} seed {seed}: {} echoes",
                            kind.name(),
                            SITES[to],
                            s.count
                        ));
                    }
                }
                let avg = avgs.iter().sum::<f64>() / avgs.len() as f64;
                rtt_points.push((k as f64, avg));
                overhead_points.push((k as f64, (avg - ping) / ping * 100.0));
            }
            let label = format!("{} {}% loss", kind.name(), loss * 100.0);
            figure.notes.push(format!(
                "{label:>16}: overhead over ping by links {}",
                overhead_points
                    .iter()
                    .map(|(k, o)| format!("{k}:{o:.1}%"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ));
            if loss == 0.01 || loss == 0.0 {
                rtt_series.push(Series::new(label.clone(), rtt_points));
            }
            overhead_series.push(Series::new(label, overhead_points));
        }
    }
    let from = SITES[order[0]];
    figure.plots.push(Plot::lines(
        format!("{rtt_plot}.svg"),
        format!("chain from {from}: 1024 B echo RTT by receiver"),
        "links from the sender",
        "round trip (ms)",
        rtt_series,
    ));
    figure.plots.push(Plot::lines(
        format!("{overhead_plot}.svg"),
        format!("chain from {from}: RTT overhead over summed ping"),
        "links from the sender",
        "overhead over ping (%)",
        overhead_series,
    ));
    figure.wall.seconds = started.elapsed().as_secs_f64();
    figure
}

/// Tables 3-4: `count` 1 KB messages from `source` to every site of `wan`
/// built at each added loss, Hop and TCP; the slowest receiver's
/// throughput, and that as a share of the loss-free run. `loss_model`
/// "per-direction" drops `p` of the packets in each direction; "both-ends"
/// reads the paper's "on each side of every link" as drops at both ends,
/// `1 - (1 - p)²` per direction.
pub fn loss_table(
    name: &str,
    edges: &[Edge],
    source: usize,
    scale: super::Scale,
    plot_title: &str,
) -> super::Figure {
    use super::figure::Plot;
    use shoal_plot::Series;
    let started = std::time::Instant::now();
    let mut figure = super::Figure::new(name);
    let count = scale.pick(10_000, 2000);
    let mut series = Vec::new();
    for kind in link_kinds() {
        for (model, both_ends) in [("per-direction", false), ("both-ends", true)] {
            let mut points = Vec::new();
            let mut base = None;
            for added in ADDED_LOSS {
                let loss = if both_ends {
                    1.0 - (1.0 - added) * (1.0 - added)
                } else {
                    added
                };
                let wan = Wan::direct(&SITES, edges, loss);
                let mut kbps = Vec::new();
                for seed in scale.seeds() {
                    let work = Workload {
                        stream: Some(Stream {
                            from: source,
                            size: 1024,
                            count,
                        }),
                        ..Workload::default()
                    };
                    let sim =
                        SpreadSim::new(wan.clone(), kind.clone(), Costs::default(), work, seed);
                    let receivers = sim.stream_receivers(Stream {
                        from: source,
                        size: 1024,
                        count,
                    });
                    let out = sim.run(Duration::from_secs(3600));
                    figure.wall.events += out.events;
                    let slowest = receivers
                        .iter()
                        .map(|&r| {
                            let secs = (out.stream_last_ns[r] - out.stream_start_ns) as f64 / 1e9;
                            out.stream_delivered[r] as f64 * 1024.0 * 8.0 / secs.max(1e-9) / 1e3
                        })
                        .fold(f64::INFINITY, f64::min);
                    let delivered = receivers
                        .iter()
                        .map(|&r| out.stream_delivered[r])
                        .min()
                        .unwrap_or(0);
                    // TCP may not finish under heavy loss: that is its
                    // measured result, not a failed run. Hop must finish.
                    if delivered < count && matches!(kind, LinkKind::Hop(_)) {
                        figure.incomplete.push(format!(
                            "{} {model} loss {added} seed {seed}: {delivered} of {count} delivered in an hour",
                            kind.name()
                        ));
                    }
                    kbps.push(slowest);
                    figure.rows.push(row(&[
                        ("protocol", kind.name().into()),
                        ("loss_model", model.into()),
                        ("added_loss", added.to_string()),
                        ("loss_per_direction", format!("{loss:.4}")),
                        ("seed", seed.to_string()),
                        ("messages", count.to_string()),
                        ("slowest_delivered", delivered.to_string()),
                        ("slowest_kbps", format!("{slowest:.2}")),
                        ("retransmissions", out.retransmissions.to_string()),
                        ("failed_links", out.failed_links.to_string()),
                    ]));
                }
                let mean = kbps.iter().sum::<f64>() / kbps.len() as f64;
                let base = *base.get_or_insert(mean);
                let share = mean / base * 100.0;
                for r in figure.rows.iter_mut().rev().take(kbps.len()) {
                    r.push(("pct_of_lossless".into(), format!("{share:.1}")));
                }
                points.push((added * 100.0, share));
                figure.notes.push(format!(
                    "{} {model:>13} added loss {:>4.0}%: {mean:>8.1} Kbit/s = {share:>5.1}% of loss-free",
                    kind.name(),
                    added * 100.0
                ));
            }
            series.push(Series::new(format!("{} ({model})", kind.name()), points));
        }
    }
    figure.plots.push(Plot::lines(
        format!("{name}.svg"),
        plot_title,
        "added loss (%)",
        "throughput, % of loss-free",
        series,
    ));
    figure.wall.seconds = started.elapsed().as_secs_f64();
    figure
}

/// The added loss of Tables 3 and 4.
pub const ADDED_LOSS: [f64; 4] = [0.0, 0.05, 0.10, 0.20];
#[cfg(test)]
mod tests {
    use super::*;

    /// A paced stream over a lossless link never overflows the link's
    /// queue: no packet is lost, none retransmitted, all delivered.
    #[test]
    fn a_lossless_stream_needs_no_retransmission() {
        let edges = [Edge {
            a: MAE_EAST,
            b: UCSB,
            rtt_ms: 104.0,
            bandwidth_bps: WAN_BPS,
        }];
        let wan = Wan::direct(&SITES, &edges, 0.0);
        let work = Workload {
            stream: Some(Stream {
                from: MAE_EAST,
                size: 1024,
                count: 5000,
            }),
            ..Workload::default()
        };
        let sim = SpreadSim::new(wan, link_kinds()[0].clone(), Costs::default(), work, 1);
        let out = sim.run(Duration::from_secs(3600));
        assert_eq!(out.stream_delivered[UCSB], 5000);
        assert_eq!(out.retransmissions, 0);
    }

    #[test]
    fn ping_sums_the_links_both_ways() {
        let wan = Wan::direct(&SITES, &chain_edges(), 0.0);
        let one = wan.ping_ns(&[MAE_EAST, UCSB], 1052);
        // 104 ms of propagation and 2 × 1052 bytes at 1.5 Mbit/s.
        assert_eq!(one, 104_000_000 + 2 * 5_610_666);
        let two = wan.ping_ns(&[MAE_EAST, UCSB, OSU], 1052);
        assert_eq!(two, one + 60_000_000 + 2 * 5_610_666);
    }

    fn stream_kbps(config: hop::Config, loss: f64, count: u64, seed: u64) -> (f64, u64) {
        let edges = [Edge {
            a: MAE_EAST,
            b: UCSB,
            rtt_ms: 104.0,
            bandwidth_bps: WAN_BPS,
        }];
        let wan = Wan::direct(&SITES, &edges, loss);
        let work = Workload {
            stream: Some(Stream {
                from: MAE_EAST,
                size: 1024,
                count,
            }),
            ..Workload::default()
        };
        let out = SpreadSim::new(wan, LinkKind::Hop(config), Costs::default(), work, seed)
            .run(Duration::from_secs(3600));
        let secs = out.stream_last_ns[UCSB] as f64 / 1e9;
        (
            out.stream_delivered[UCSB] as f64 * 8.192 / secs,
            out.retransmissions,
        )
    }

    /// The measurements behind Hop's defaults (`docs/spread.md`):
    /// `cargo test -p shoal-sim hop_settings_sweep -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check: prints the table docs/spread.md quotes"]
    fn hop_settings_sweep() {
        let order = [MAE_EAST, UCSB, OSU, RUTGERS, CNDS, HOPKINS];
        let ping = Wan::direct(&SITES, &chain_edges(), 0.0).ping_ns(&order, 1052) as f64 / 1e6;
        for ms in [0u64, 5, 10, 20, 40] {
            let config = hop::Config {
                nack_delay: Duration::from_millis(ms),
                ..hop::Config::default()
            };
            let wan = Wan::direct(&SITES, &chain_edges(), 0.01);
            let avg: f64 = (1..=2)
                .map(|seed| {
                    let echo = Echo::new(MAE_EAST, HOPKINS, 1024, 2000);
                    echo_run(&wan, &LinkKind::Hop(config.clone()), echo, None, seed)
                        .0
                        .avg
                })
                .sum::<f64>()
                / 2.0;
            eprintln!(
                "nack_delay {ms:>3} ms: chain, 1% loss, overhead over ping {:.2}%",
                (avg - ping) / ping * 100.0
            );
        }
        for ms in [120u64, 150, 250, 500, 1000] {
            let config = hop::Config {
                nack_repeat: Duration::from_millis(ms),
                ..hop::Config::default()
            };
            let (kbps, rtx) = stream_kbps(config, 0.2, 5000, 1);
            eprintln!("nack_repeat {ms:>4} ms: one link, 20% loss: {kbps:.1} Kbit/s, {rtx} retransmissions of 5000");
        }
        for w in [32u32, 64, 128, 256, 1024] {
            let config = hop::Config {
                window_packets: std::num::NonZeroU32::new(w).expect("non-zero"),
                ..hop::Config::default()
            };
            let (kbps, _) = stream_kbps(config, 0.2, 5000, 1);
            let (free, _) = stream_kbps(
                hop::Config {
                    window_packets: std::num::NonZeroU32::new(w).expect("non-zero"),
                    ..hop::Config::default()
                },
                0.0,
                5000,
                1,
            );
            eprintln!(
                "window {w:>5}: one link, 20% loss: {kbps:.1} Kbit/s ({:.1}% of {free:.1})",
                kbps / free * 100.0
            );
        }
    }
}
