//! A virtual-time driver of a whole system of sites: every daemon a
//! [`SiteDaemon`], each site's LAN (a delay and independent loss per
//! receiver), WAN links per direction (propagation delay, serialisation
//! at a bandwidth behind a drop-tail queue, independent loss), crashes,
//! and partitions of sites that also hand each component its new
//! configuration. It is a driver, like the simulator: it holds no clock
//! (time is the events' own) and draws loss from its own seeded
//! generator, so a seed reproduces a run. The tests beside this module
//! and the simulator's `spread-sites` scenario use it, with the helpers
//! below: [`full_mesh`] builds their sites and links, [`records`] turns a
//! history into the checker's records.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::{Config, Event, LinkKind, Out, Service, SiteDaemon, Target};
use crate::overlay::{LinkWeights, Site, SiteId, Topology};
use crate::{Destination, Instant, NodeId};

/// One direction of a WAN link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WanLink {
    /// One-way propagation delay.
    pub delay: Duration,
    /// Serialisation rate.
    pub bandwidth_bps: u64,
    /// Independent loss probability per datagram.
    pub loss: f64,
}

/// The world's settings.
#[derive(Debug, Clone)]
pub struct WorldConfig {
    /// Every daemon's settings.
    pub daemon: Config,
    /// LAN delay per datagram.
    pub lan_delay: Duration,
    /// LAN loss per receiver.
    pub lan_loss: f64,
    /// Datagrams queued on a WAN link for longer than this are dropped
    /// (a drop-tail queue measured in time).
    pub wan_queue: Duration,
    /// IP and UDP header bytes added to every WAN datagram.
    pub wan_overhead: usize,
    /// The protocol every gateway link runs (Hop, or the TCP model).
    pub link_kind: LinkKind,
    pub seed: u64,
}

impl Default for WorldConfig {
    fn default() -> WorldConfig {
        WorldConfig {
            daemon: Config::default(),
            lan_delay: Duration::from_micros(100),
            lan_loss: 0.0,
            wan_queue: Duration::from_millis(500),
            wan_overhead: 28,
            link_kind: LinkKind::Hop,
            seed: 1,
        }
    }
}

/// One record of a client's history, with the virtual time it happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Rec {
    Send {
        at: Instant,
        client: String,
        seq: u64,
        service: Service,
        groups: Vec<String>,
    },
    Deliver {
        at: Instant,
        client: String,
        sender: String,
        seq: u64,
        service: Service,
        groups: Vec<String>,
        transitional: bool,
    },
    View {
        at: Instant,
        client: String,
        group: String,
        view_id: u64,
        members: Vec<String>,
        transitional: bool,
    },
    Ended {
        at: Instant,
        client: String,
    },
}

#[derive(Debug)]
enum Ev {
    Datagram {
        to: usize,
        from: NodeId,
        lan: bool,
        bytes: Bytes,
    },
    Wake(usize),
}

/// Counters of the world.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorldStats {
    pub wan_datagrams: u64,
    pub wan_bytes: u64,
    pub wan_lost: u64,
    pub wan_queue_drops: u64,
    pub lan_datagrams: u64,
    pub events: u64,
    /// Deliveries whose payload is not the one sent (`payload_for`).
    pub corrupt: u64,
    /// The longest datagram any daemon sent (LAN or WAN), in bytes.
    pub largest_datagram: usize,
}

/// The payload of a client's message `seq` of `size` bytes: its sequence
/// number, its length (from 16 bytes), then a pattern of both, so that a
/// delivery shows whether it is whole.
fn payload_for(seq: u64, size: usize) -> Vec<u8> {
    let mut payload = vec![0u8; size.max(8)];
    payload[..8].copy_from_slice(&seq.to_be_bytes());
    if size >= 16 {
        payload[8..16].copy_from_slice(&(size as u64).to_be_bytes());
        for (i, b) in payload.iter_mut().enumerate().skip(16) {
            *b = (i as u64).wrapping_mul(31).wrapping_add(seq) as u8;
        }
    }
    payload
}

/// Whether `payload` is a message `payload_for` made.
fn is_whole(payload: &[u8]) -> bool {
    let Some(seq) = payload.get(..8) else {
        return false;
    };
    let seq = u64::from_be_bytes(seq.try_into().expect("8 bytes"));
    match payload.get(8..16) {
        None => payload[8..].iter().all(|b| *b == 0),
        Some(size) => {
            let size = u64::from_be_bytes(size.try_into().expect("8 bytes"));
            size == payload.len() as u64 && payload == payload_for(seq, payload.len())
        }
    }
}

/// Sites of daemons joined by WAN links, in virtual time.
pub struct World {
    now: Instant,
    config: WorldConfig,
    topo: Arc<Topology>,
    daemons: Vec<Option<SiteDaemon>>,
    site_of: Vec<SiteId>,
    wan: BTreeMap<(SiteId, SiteId), WanLink>,
    busy: BTreeMap<(SiteId, SiteId), Instant>,
    component: Vec<u32>,
    queue: BTreeMap<(Instant, u64), Ev>,
    order: u64,
    wake: Vec<Option<Instant>>,
    rng: Xoshiro256PlusPlus,
    next_epoch: u32,
    clients: BTreeMap<String, (NodeId, u64)>,
    history: Vec<Rec>,
    stats: WorldStats,
}

/// Sites of `per_site[i]` daemons each (numbered from 0, site by site),
/// site `i` named `name(i)`, joined by a full mesh: `link(a, b)` (with
/// `a < b`) gives the weight of the overlay link and the WAN link, the same
/// in both directions. The topology and the links, for [`World::new`].
pub fn full_mesh(
    per_site: &[u32],
    name: impl Fn(usize) -> String,
    link: impl Fn(usize, usize) -> (u32, WanLink),
) -> (Topology, BTreeMap<(SiteId, SiteId), WanLink>) {
    let mut topo = Topology::default();
    let mut next = 0;
    for (i, n) in per_site.iter().enumerate() {
        topo.sites.push(Site {
            name: name(i),
            daemons: (next..next + n).map(NodeId).collect(),
        });
        next += n;
    }
    let mut wan = BTreeMap::new();
    let sites = per_site.len();
    for a in 0..sites {
        for b in a + 1..sites {
            let (weight, wan_link) = link(a, b);
            let (sa, sb) = (SiteId(a as u16), SiteId(b as u16));
            topo.links.push(LinkWeights {
                a: sa,
                b: sb,
                a_to_b: Some(weight),
                b_to_a: Some(weight),
            });
            wan.insert((sa, sb), wan_link);
            wan.insert((sb, sa), wan_link);
        }
    }
    (topo, wan)
}

/// The checker's name for a service.
pub fn check_service(service: Service) -> shoal_check::Service {
    service.into()
}

/// A history as the checker's records (a crash ends its clients'
/// sessions with the reason "daemon crashed").
pub fn records(history: &[Rec]) -> Vec<shoal_check::Record> {
    use shoal_check::{MsgId, Record};
    history
        .iter()
        .map(|r| match r {
            Rec::Send {
                at,
                client,
                seq,
                service,
                groups,
            } => Record::Send {
                client: client.clone(),
                msg: MsgId {
                    sender: client.clone(),
                    seq: *seq,
                },
                service: check_service(*service),
                groups: groups.clone(),
                at_ns: Some(at.as_nanos()),
            },
            Rec::Deliver {
                at,
                client,
                sender,
                seq,
                service,
                groups,
                transitional,
            } => Record::Deliver {
                client: client.clone(),
                msg: MsgId {
                    sender: sender.clone(),
                    seq: *seq,
                },
                service: check_service(*service),
                groups: groups.clone(),
                transitional: *transitional,
                at_ns: Some(at.as_nanos()),
            },
            Rec::View {
                at,
                client,
                group,
                view_id,
                members,
                transitional,
            } => Record::View {
                client: client.clone(),
                group: group.clone(),
                view_id: *view_id,
                members: members.clone(),
                transitional: *transitional,
                quorum: None,
                at_ns: Some(at.as_nanos()),
            },
            Rec::Ended { at, client } => Record::Ended {
                client: client.clone(),
                reason: "daemon crashed".into(),
                at_ns: Some(at.as_nanos()),
            },
        })
        .collect()
}

/// The client's name as the checker wants it: its private-group name.
/// `d` with every link to another site set to `kind`.
fn with_link_kind(mut d: SiteDaemon, kind: LinkKind, sites: usize) -> SiteDaemon {
    let own = d.site();
    for s in (0..sites as u16).map(SiteId).filter(|s| *s != own) {
        d.set_link_kind(s, kind);
    }
    d
}

pub fn client_name(client: u32, node: NodeId) -> String {
    format!("#c{client}#d{}", node.0)
}

impl World {
    /// Every daemon of `topology` (daemons numbered 0..n, each in one
    /// site), WAN links `wan` per direction (a missing direction carries
    /// nothing), all sites in configuration 1.
    pub fn new(
        topology: Topology,
        wan: BTreeMap<(SiteId, SiteId), WanLink>,
        config: WorldConfig,
    ) -> World {
        let topo = Arc::new(topology);
        let n = topo
            .sites
            .iter()
            .flat_map(|s| s.daemons.iter())
            .map(|d| d.0 as usize + 1)
            .max()
            .unwrap_or(0);
        let mut site_of = vec![SiteId(u16::MAX); n];
        for (i, s) in topo.sites.iter().enumerate() {
            for d in &s.daemons {
                site_of[d.0 as usize] = SiteId(i as u16);
            }
        }
        let daemons = (0..n as u32)
            .map(|i| {
                SiteDaemon::new(
                    config.daemon.clone(),
                    topo.clone(),
                    NodeId(i),
                    1,
                    Instant::ZERO,
                )
                .ok()
                .map(|d| with_link_kind(d, config.link_kind, topo.sites.len()))
            })
            .collect();
        let mut w = World {
            now: Instant::ZERO,
            rng: Xoshiro256PlusPlus::seed_from_u64(config.seed),
            config,
            component: vec![0; topo.sites.len()],
            topo,
            daemons,
            site_of,
            wan,
            busy: BTreeMap::new(),
            queue: BTreeMap::new(),
            order: 0,
            wake: vec![None; n],
            next_epoch: 2,
            clients: BTreeMap::new(),
            history: Vec::new(),
            stats: WorldStats::default(),
        };
        for i in 0..n {
            w.after(i);
        }
        w
    }

    pub fn now(&self) -> Instant {
        self.now
    }

    pub fn stats(&self) -> WorldStats {
        self.stats
    }

    pub fn daemon(&self, node: NodeId) -> Option<&SiteDaemon> {
        self.daemons.get(node.0 as usize).and_then(Option::as_ref)
    }

    /// Every client's records, in the order they happened.
    pub fn history(&self) -> &[Rec] {
        &self.history
    }

    /// The checker's verdict on the history so far.
    pub fn check(&self) -> shoal_check::Report {
        shoal_check::check(records(&self.history))
    }

    /// Connects client `client` of daemon `node`; returns its name.
    pub fn connect(&mut self, node: NodeId, client: u32) -> String {
        let name = client_name(client, node);
        if let Some(d) = self.daemons[node.0 as usize].as_mut() {
            d.connect(&name);
            self.clients.insert(name.clone(), (node, 0));
        }
        name
    }

    /// `client` joins `group`.
    pub fn join(&mut self, client: &str, group: &str) {
        let Some(&(node, _)) = self.clients.get(client) else {
            return;
        };
        let now = self.now;
        if let Some(d) = self.daemons[node.0 as usize].as_mut() {
            let _ = d.join(now, client, group);
        }
        self.after(node.0 as usize);
    }

    /// `client` sends a `size`-byte message (its sequence number first);
    /// returns the sequence number, or None if its daemon refused it.
    pub fn send(
        &mut self,
        client: &str,
        service: Service,
        groups: &[String],
        size: usize,
    ) -> Option<u64> {
        let &(node, last) = self.clients.get(client)?;
        let seq = last + 1;
        let payload = payload_for(seq, size);
        let now = self.now;
        let d = self.daemons[node.0 as usize].as_mut()?;
        d.send(now, client, service, groups, Bytes::from(payload))
            .ok()?;
        self.clients.insert(client.to_string(), (node, seq));
        self.history.push(Rec::Send {
            at: now,
            client: client.to_string(),
            seq,
            service,
            groups: groups.to_vec(),
        });
        self.after(node.0 as usize);
        Some(seq)
    }

    /// `client` leaves `group`.
    pub fn leave(&mut self, client: &str, group: &str) {
        let Some(&(node, _)) = self.clients.get(client) else {
            return;
        };
        let now = self.now;
        if let Some(d) = self.daemons[node.0 as usize].as_mut() {
            let _ = d.leave(now, client, group);
        }
        self.after(node.0 as usize);
    }

    /// Daemon `node` crashes; its clients' sessions end.
    pub fn crash(&mut self, node: NodeId) {
        self.daemons[node.0 as usize] = None;
        let gone: Vec<String> = self
            .clients
            .iter()
            .filter(|(_, (n, _))| *n == node)
            .map(|(c, _)| c.clone())
            .collect();
        for c in gone {
            self.clients.remove(&c);
            self.history.push(Rec::Ended {
                at: self.now,
                client: c,
            });
        }
    }

    /// Daemon `node` (crashed, or never started) starts afresh, as a
    /// daemon process started into its running site: it joins its site's
    /// ring and takes the site's state before its clients can do anything.
    pub fn restart(&mut self, node: NodeId) {
        let i = node.0 as usize;
        if self.daemons[i].is_some() {
            return;
        }
        let d = SiteDaemon::new(
            self.config.daemon.clone(),
            self.topo.clone(),
            node,
            1,
            self.now,
        );
        self.daemons[i] = d
            .ok()
            .map(|d| with_link_kind(d, self.config.link_kind, self.topo.sites.len()));
        self.wake[i] = None;
        self.after(i);
    }

    /// Splits the sites into `components` (every site in one): WAN
    /// datagrams cross no component boundary from now on, and each
    /// component's daemons are handed their new configuration, with an
    /// epoch of its own, if their component changed (unless the site
    /// membership is on: then the gateways find it themselves).
    pub fn partition(&mut self, components: &[Vec<SiteId>]) {
        let old = self.component.clone();
        for (c, sites) in components.iter().enumerate() {
            for s in sites {
                self.component[usize::from(s.0)] = c as u32;
            }
        }
        if self.config.daemon.membership.enabled {
            // The gateways find the new configuration themselves.
            return;
        }
        for sites in components {
            let same = |a: &SiteId, b: &SiteId| {
                (old[usize::from(a.0)] == old[usize::from(b.0)])
                    == (self.component[usize::from(a.0)] == self.component[usize::from(b.0)])
            };
            let changed = self
                .topo
                .sites
                .iter()
                .enumerate()
                .any(|(i, _)| sites.iter().any(|s| !same(s, &SiteId(i as u16))));
            if !changed {
                continue;
            }
            let epoch = self.next_epoch;
            self.next_epoch += 1;
            for s in sites {
                for d in self.topo.sites[usize::from(s.0)].daemons.clone() {
                    let now = self.now;
                    if let Some(dm) = self.daemons[d.0 as usize].as_mut() {
                        dm.handle_site_view(now, epoch, sites);
                    }
                    self.after(d.0 as usize);
                }
            }
        }
    }

    /// Runs every event up to `until`.
    pub fn run_until(&mut self, until: Instant) {
        while let Some((&(at, _), _)) = self.queue.first_key_value() {
            if at > until {
                break;
            }
            let ((at, _), ev) = self.queue.pop_first().expect("first exists");
            self.now = self.now.max(at);
            self.stats.events += 1;
            self.handle(ev);
        }
        self.now = self.now.max(until);
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Datagram {
                to,
                from,
                lan,
                bytes,
            } => {
                let Some(d) = self.daemons[to].as_mut() else {
                    return;
                };
                if lan {
                    d.handle_lan(now, from, &bytes);
                } else {
                    d.handle_wan(now, from, &bytes);
                }
                self.after(to);
            }
            Ev::Wake(i) => {
                if self.wake[i] != Some(now) {
                    return;
                }
                self.wake[i] = None;
                if let Some(d) = self.daemons[i].as_mut() {
                    d.handle_timeout(now);
                }
                self.after(i);
            }
        }
    }

    fn push(&mut self, at: Instant, ev: Ev) {
        self.order += 1;
        self.queue.insert((at, self.order), ev);
    }

    /// Drains daemon `i`'s outputs and schedules its next wake-up.
    fn after(&mut self, i: usize) {
        let mut outs = Vec::new();
        let mut events = Vec::new();
        let next = {
            let Some(d) = self.daemons[i].as_mut() else {
                return;
            };
            while let Some(o) = d.poll_transmit() {
                outs.push(o);
            }
            while let Some(e) = d.poll_event() {
                events.push(e);
            }
            d.poll_timeout()
        };
        for o in outs {
            self.transmit(i, o);
        }
        for e in events {
            self.record(e);
        }
        if let Some(t) = next {
            let t = t.max(self.now);
            if self.wake[i] != Some(t) {
                self.wake[i] = Some(t);
                self.push(t, Ev::Wake(i));
            }
        }
    }

    fn transmit(&mut self, i: usize, o: Out) {
        let from = NodeId(i as u32);
        let site = self.site_of[i];
        self.stats.largest_datagram = self.stats.largest_datagram.max(o.payload.len());
        match o.target {
            Target::Lan(dest) => {
                let to: Vec<usize> = match dest {
                    Destination::Multicast => self.topo.sites[usize::from(site.0)]
                        .daemons
                        .iter()
                        .map(|d| d.0 as usize)
                        .filter(|d| *d != i)
                        .collect(),
                    Destination::Node(n) => vec![n.0 as usize],
                };
                for t in to {
                    if self.site_of.get(t) != Some(&site) {
                        continue;
                    }
                    self.stats.lan_datagrams += 1;
                    if self.config.lan_loss > 0.0 && self.rng.random::<f64>() < self.config.lan_loss
                    {
                        continue;
                    }
                    let at = self.now + self.config.lan_delay;
                    self.push(
                        at,
                        Ev::Datagram {
                            to: t,
                            from,
                            lan: true,
                            bytes: o.payload.clone(),
                        },
                    );
                }
            }
            Target::Wan(n) => self.transmit_wan(i, n, o.payload),
        }
    }

    fn transmit_wan(&mut self, i: usize, to: NodeId, bytes: Bytes) {
        let (a, Some(&b)) = (self.site_of[i], self.site_of.get(to.0 as usize)) else {
            return;
        };
        let Some(link) = self.wan.get(&(a, b)).copied() else {
            return;
        };
        if self.component[usize::from(a.0)] != self.component[usize::from(b.0)] {
            return;
        }
        self.stats.wan_datagrams += 1;
        let size = bytes.len() + self.config.wan_overhead;
        self.stats.wan_bytes += size as u64;
        let ser = Duration::from_nanos(size as u64 * 8 * 1_000_000_000 / link.bandwidth_bps.max(1));
        let busy = self.busy.get(&(a, b)).copied().unwrap_or(Instant::ZERO);
        let start = busy.max(self.now);
        if start.saturating_duration_since(self.now) > self.config.wan_queue {
            self.stats.wan_queue_drops += 1;
            return;
        }
        let done = start + ser;
        self.busy.insert((a, b), done);
        if link.loss > 0.0 && self.rng.random::<f64>() < link.loss {
            self.stats.wan_lost += 1;
            return;
        }
        self.push(
            done + link.delay,
            Ev::Datagram {
                to: to.0 as usize,
                from: NodeId(i as u32),
                lan: false,
                bytes,
            },
        );
    }

    fn record(&mut self, e: Event) {
        let at = self.now;
        match e {
            Event::Deliver {
                client,
                sender,
                service,
                groups,
                payload,
                transitional,
            } => {
                let seq = payload
                    .get(..8)
                    .map_or(0, |b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
                if !is_whole(&payload) {
                    self.stats.corrupt += 1;
                }
                self.history.push(Rec::Deliver {
                    at,
                    client,
                    sender,
                    seq,
                    service,
                    groups,
                    transitional,
                });
            }
            Event::View {
                client,
                group,
                view_id,
                members,
                transitional,
                ..
            } => self.history.push(Rec::View {
                at,
                client,
                group,
                view_id,
                members,
                transitional,
            }),
            Event::Dropped { client } => {
                self.clients.remove(&client);
                self.history.push(Rec::Ended { at, client });
            }
        }
    }
}
