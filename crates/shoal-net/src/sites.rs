//! Spread's sites in real processes: a site daemon
//! (`shoal_core::sites::SiteDaemon`: the Ring inside its site, Hop links
//! between sites' gateways) driven over UDP by the runtime's [`Node`](crate::Node).
//!
//! - [`SitesPlan`] is the configuration: the sites, each daemon's id and
//!   UDP address (any address, IPv4 or IPv6), the overlay links with a
//!   weight per direction, and the engine's settings
//!   (`shoal_core::sites::Config`), read from one TOML file and validated
//!   once, with an error naming what is wrong.
//! - [`SiteEngine`] adapts one daemon to `shoal_core::Engine`, so a `Node`
//!   drives it like any engine (one socket per daemon, the loop, batching,
//!   authentication, fault injection). A datagram from a daemon of this
//!   daemon's own site goes to the Ring (`handle_lan`), one from another
//!   site's daemon to the gateway (`handle_wan`), one from an address not
//!   in the file is dropped by the `Node`. The Ring's multicast goes as
//!   unicast to each other daemon of the site (no IP multicast here).
//!
//! A daemon may start into its running site, or again after a crash: it
//! takes the site's state through its ring (`shoal_core::sites`, `sync.rs`).
//!
//! The configuration of sites is the site membership's
//! (`shoal_core::sites::membership`, on unless the file's `[membership]`
//! says `enabled = false`): each site starts alone and merges with the
//! sites its gateway hears; a site that fails or becomes unreachable is
//! left out after `site_timeout`, and merged back when heard again. With
//! it off, every daemon starts in one configuration of every site and
//! stays in it (a site that becomes unreachable stalls the others).
//! Clients connect to a daemon's Unix
//! socket with the main daemon's client protocol ([`clients`]), or live in
//! the daemon's process and reach it through
//! [`Node::control`](crate::Node::control) closures on the engine
//! ([`SiteEngine::daemon_mut`]).
//!
//! ```toml
//! [[site]]
//! name = "east"
//! daemons = [{ id = 0, addr = "192.0.2.1:4810" }, { id = 1, addr = "192.0.2.2:4810" }]
//!
//! [[site]]
//! name = "west"
//! daemons = [{ id = 2, addr = "[2001:db8::1]:4810" }]
//! # uplink_kbps = 1000   # experiments: the site's access link to the
//! # downlink_kbps = 1000 # WAN, shared by all its links
//!
//! [[link]]
//! a = "east"
//! b = "west"
//! weight = 10            # both directions; or a_to_b / b_to_a
//! # protocol = "tcp"     # the TCP-model baseline instead of Hop
//! # hop_rate_kbps = 1425 # Hop's bucket here (or hop_rate_a_to_b_kbps, ...)
//! # delay_ms = 52        # experiments: delay, loss and a bandwidth
//! # loss = 0.01          # injected per link and direction by the
//! # rate_kbps = 1500     # receiving daemon
//!
//! [engine]               # shoal_core::sites::Config, every field optional
//! global_window = 200
//!
//! [membership]           # the site membership: on by default
//! heartbeat_interval = 250   # ms
//! site_timeout = 5000        # ms
//!
//! [auth]                 # the cluster key, as the daemon's [auth]
//! key_file = "/etc/shoal/sites.key"
//! ```
//!
//! Beyond loopback `[auth]` is required (or `insecure_no_auth = true`):
//! without a key anyone who reaches a daemon's port can forge ring or
//! gateway datagrams.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use shoal_core::engine::SendError;

use shoal_core::overlay::{LinkWeights, Site, SiteId, Topology};
use shoal_core::sites::{self, LinkKind, SiteDaemon, SitesError, Target};
use shoal_core::{Destination, Engine, Instant, NodeId, Transmit};

// The sites engine sizes its datagrams to leave room for this runtime's
// authentication envelope.
const _: () = assert!(crate::auth::OVERHEAD <= shoal_core::sites::SEAL_ALLOWANCE);

use crate::daemon::config::AuthConfig;
use crate::{AddressBook, Auth, ClusterKey, Mode, NetError, NodeConfig};

/// The sites file as written (see the module's example).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SitesFile {
    /// The sites, each with its daemons.
    #[serde(rename = "site", default)]
    pub sites: Vec<SiteEntry>,
    /// Overlay links between sites.
    #[serde(rename = "link", default)]
    pub links: Vec<LinkEntry>,
    /// Every daemon's engine settings (the paper's defaults when left out).
    #[serde(default)]
    pub engine: sites::Config,
    /// The site membership (`shoal_core::sites::membership`): on unless
    /// `enabled = false`; `heartbeat_interval` and `site_timeout` in
    /// milliseconds.
    #[serde(default)]
    pub membership: sites::MembershipConfig,
    /// The cluster key every datagram is sealed with (the daemon's `[auth]`
    /// section: `key` or `key_file`, and `encrypt`).
    #[serde(default)]
    pub auth: Option<AuthConfig>,
    /// Run without `[auth]` although some address is beyond loopback.
    #[serde(default)]
    pub insecure_no_auth: bool,
}

/// One site: the daemons sharing a LAN.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteEntry {
    /// Unique among the sites.
    pub name: String,
    /// At least one.
    pub daemons: Vec<DaemonEntry>,
    /// For experiments: the site's access link to the WAN, shared by all
    /// its overlay links (P-Spread Table 1), in Kbit/s each way. A daemon
    /// of the site serialises every datagram it sends to another site
    /// through an uplink of `uplink_kbps`, and every datagram it receives
    /// from another site through a downlink of `downlink_kbps`, each
    /// behind a drop-tail queue of `access_queue_packets`; the downlink
    /// comes before the link's own `rate_kbps`, `loss` and `delay_ms`.
    /// Only a gateway carries WAN traffic, so the site's access is its
    /// gateway's. Default: no limit.
    pub uplink_kbps: Option<f64>,
    /// For experiments: see `uplink_kbps`.
    pub downlink_kbps: Option<f64>,
    /// Datagrams waiting for the uplink or the downlink, at most; one
    /// more is dropped. Default 100, the simulator's queue.
    pub access_queue_packets: Option<usize>,
}

/// One daemon.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonEntry {
    /// The daemon's id: the ids of a file are 0, 1, ... n−1, each once.
    /// The lowest id of a site's first ring is its gateway.
    pub id: u32,
    /// Where it receives UDP datagrams, from its site and from other sites.
    pub addr: SocketAddr,
}

/// One overlay link between two sites, with a weight per direction
/// (P-Spread §2.2); `weight` sets both.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkEntry {
    pub a: String,
    pub b: String,
    /// Cost both ways; at least 1. Not with `a_to_b` or `b_to_a`.
    pub weight: Option<u32>,
    /// Cost from `a` to `b`; at least 1; leaving it out leaves that
    /// direction out of the overlay.
    pub a_to_b: Option<u32>,
    /// Cost from `b` to `a`.
    pub b_to_a: Option<u32>,
    /// For experiments: milliseconds every datagram crossing this link
    /// (either way) is held by the receiving daemon before its engine
    /// sees it, a one-way link delay. Default 0.
    pub delay_ms: Option<f64>,
    /// For experiments: the fraction, in [0, 1), of the datagrams
    /// crossing this link in each direction that the receiving daemon
    /// drops. Default 0.
    pub loss: Option<f64>,
    /// The link protocol both gateways run on this link: `"hop"` (the
    /// default, P-Spread §3.2) or `"tcp"` (the TCP model, the paper's
    /// baseline; `[engine.tcp]` holds its settings).
    #[serde(default)]
    pub protocol: LinkKind,
    /// For experiments: the link's capacity in each direction, in
    /// Kbit/s (1000 bit/s). The receiving daemon serialises the
    /// datagrams that cross the link into it at this rate (each
    /// datagram's bytes as its engine gets them, without the cluster
    /// key's envelope, plus 28 of IP and UDP), behind a drop-tail queue
    /// of `queue_packets`, before `loss` and `delay_ms` (the simulator's
    /// link model: a lost datagram used the link). Default: no limit.
    pub rate_kbps: Option<f64>,
    /// Datagrams waiting for the link (`rate_kbps`), at most; one more is
    /// dropped. Default 100, the simulator's queue.
    pub queue_packets: Option<usize>,
    /// The rate, in Kbit/s, of Hop's leaky bucket on this link at both
    /// ends (P-Spread §3.2: set per link, for instance each link's share
    /// of its site's uplink). Default: `[engine.hop] rate_bps`. Not with
    /// `hop_rate_a_to_b_kbps` or `hop_rate_b_to_a_kbps`, and not on a
    /// `tcp` link (the TCP model has no bucket).
    pub hop_rate_kbps: Option<f64>,
    /// The bucket's rate at `a`'s end (what `a` sends to `b`), Kbit/s.
    pub hop_rate_a_to_b_kbps: Option<f64>,
    /// The bucket's rate at `b`'s end, Kbit/s.
    pub hop_rate_b_to_a_kbps: Option<f64>,
}

/// Why a sites file was refused. Nothing was started.
#[derive(Debug, thiserror::Error)]
pub enum SitesConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("no [[site]] listed")]
    NoSites,
    #[error("site {0:?} is listed twice")]
    DuplicateSite(String),
    #[error("site {0:?} lists no daemon")]
    EmptySite(String),
    #[error("daemon id {0} is listed twice")]
    DuplicateId(u32),
    #[error("daemon ids must be 0..{count} each once; {missing} is missing")]
    IdsNotDense { count: usize, missing: u32 },
    #[error("address {0} is listed for two daemons")]
    DuplicateAddress(SocketAddr),
    #[error("address {0} has port 0: every daemon needs a fixed port its peers can reach")]
    NoPort(SocketAddr),
    #[error("link {a:?}-{b:?} names site {name:?}, which is not listed")]
    UnknownSite { a: String, b: String, name: String },
    #[error("link {0:?}-{0:?} joins a site to itself")]
    SelfLink(String),
    #[error("link {a:?}-{b:?} is listed twice")]
    DuplicateLink { a: String, b: String },
    #[error("link {a:?}-{b:?}: give `weight`, or `a_to_b` and/or `b_to_a`, not both")]
    WeightAndDirections { a: String, b: String },
    #[error("link {a:?}-{b:?} carries nothing: give `weight`, `a_to_b` or `b_to_a`")]
    NoDirection { a: String, b: String },
    #[error("link {a:?}-{b:?}: weights are at least 1")]
    ZeroWeight { a: String, b: String },
    #[error(
        "link {a:?}-{b:?}: delay_ms must be at least 0 and finite, loss at least 0 and below 1, rate_kbps above 0 and finite, queue_packets at least 1"
    )]
    BadLinkFault { a: String, b: String },
    #[error("link {a:?}-{b:?}: {message}")]
    BadHopRate {
        a: String,
        b: String,
        message: &'static str,
    },
    #[error("site {0:?}: uplink_kbps and downlink_kbps must be above 0 and finite, access_queue_packets at least 1")]
    BadAccess(String),
    #[error("engine settings: {0}")]
    Engine(#[from] SitesError),
    #[error("daemon id {0} is not in the sites file")]
    UnknownDaemon(u32),
    #[error("[auth] is required: {0} is beyond loopback, and without a cluster key anyone who can reach it can forge datagrams. Add [auth] with key_file, or set insecure_no_auth = true to accept the risk")]
    AuthRequired(SocketAddr),
    #[error("[auth]: {0}")]
    Auth(String),
}

/// A validated sites file: what every daemon of the system needs.
#[derive(Debug, Clone)]
pub struct SitesPlan {
    /// The sites and links, as the engine sees them.
    pub topology: Arc<Topology>,
    /// Daemon `i` receives at `addrs[i]`.
    pub addrs: Vec<SocketAddr>,
    /// Every daemon's engine settings.
    pub engine: sites::Config,
    /// The cluster key and whether payloads are encrypted.
    pub auth: Option<(ClusterKey, Mode)>,
    /// Delay, loss and capacity injected per link, by (sending site,
    /// receiving site); links without `delay_ms`, `loss` or `rate_kbps`
    /// are not listed.
    pub link_faults: BTreeMap<(SiteId, SiteId), LinkFault>,
    /// Links that do not run Hop, both directions listed.
    pub link_kinds: BTreeMap<(SiteId, SiteId), LinkKind>,
    /// Hop buckets with their own rate, bit/s, by (sending site,
    /// receiving site).
    pub hop_rates: BTreeMap<(SiteId, SiteId), u64>,
    /// Sites with an emulated access link (`uplink_kbps`,
    /// `downlink_kbps`).
    pub access: BTreeMap<SiteId, Access>,
}

/// A site's emulated access link to the WAN (the sites file's
/// `uplink_kbps`, `downlink_kbps` and `access_queue_packets`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Access {
    /// Bits per second out of the site, if limited.
    pub uplink_bps: Option<f64>,
    /// Bits per second into the site, if limited.
    pub downlink_bps: Option<f64>,
    pub queue_packets: usize,
}

/// What a daemon's transport does to the datagrams one link carries to
/// it (the sites file's `delay_ms`, `loss`, `rate_kbps` and
/// `queue_packets`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkFault {
    pub delay: std::time::Duration,
    pub loss: f64,
    /// Bits per second, if limited.
    pub rate_bps: Option<f64>,
    pub queue_packets: usize,
}

/// A capacity as a daemon emulates it (a link's `rate_kbps`, a site's
/// uplink or downlink): datagrams leave a drop-tail queue one after
/// another at the rate.
#[derive(Debug, Clone)]
struct LinkQueue {
    rate_bps: f64,
    capacity: usize,
    /// When each datagram still in the queue (or on the wire) is through.
    departures: VecDeque<Instant>,
}

/// IP and UDP header bytes a datagram adds on the wire.
const IP_UDP_BYTES: usize = 28;

impl LinkQueue {
    fn new(rate_bps: f64, capacity: usize) -> LinkQueue {
        LinkQueue {
            rate_bps,
            capacity,
            departures: VecDeque::new(),
        }
    }

    /// When a datagram of `len` bytes that arrived at `now` is through
    /// the link, or `None` if the queue is full (dropped).
    fn admit(&mut self, now: Instant, len: usize) -> Option<Instant> {
        while self.departures.front().is_some_and(|d| *d <= now) {
            self.departures.pop_front();
        }
        if self.departures.len() >= self.capacity {
            return None;
        }
        let start = self.departures.back().copied().unwrap_or(now).max(now);
        let bits = ((len + IP_UDP_BYTES) * 8) as f64;
        let done = start + std::time::Duration::from_secs_f64(bits / self.rate_bps);
        self.departures.push_back(done);
        Some(done)
    }
}

impl SitesPlan {
    /// Reads and validates the sites file at `path`.
    pub fn load(path: &Path) -> Result<SitesPlan, SitesConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| SitesConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        SitesPlan::from_toml(&text).map_err(|e| match e {
            SitesConfigError::Parse { message, .. } => SitesConfigError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Parses and validates a sites file's text.
    pub fn from_toml(text: &str) -> Result<SitesPlan, SitesConfigError> {
        let file: SitesFile = toml::from_str(text).map_err(|e| SitesConfigError::Parse {
            path: "sites file".into(),
            message: e.to_string(),
        })?;
        SitesPlan::new(file)
    }

    /// Validates a parsed sites file.
    pub fn new(file: SitesFile) -> Result<SitesPlan, SitesConfigError> {
        if file.sites.is_empty() {
            return Err(SitesConfigError::NoSites);
        }
        let mut index: BTreeMap<&str, u16> = BTreeMap::new();
        let mut by_id: BTreeMap<u32, SocketAddr> = BTreeMap::new();
        let mut seen_addrs = BTreeSet::new();
        let mut topo = Topology::default();
        let mut access = BTreeMap::new();
        for (i, site) in file.sites.iter().enumerate() {
            if index.insert(&site.name, i as u16).is_some() {
                return Err(SitesConfigError::DuplicateSite(site.name.clone()));
            }
            if site.daemons.is_empty() {
                return Err(SitesConfigError::EmptySite(site.name.clone()));
            }
            for d in &site.daemons {
                if by_id.insert(d.id, d.addr).is_some() {
                    return Err(SitesConfigError::DuplicateId(d.id));
                }
                if d.addr.port() == 0 {
                    return Err(SitesConfigError::NoPort(d.addr));
                }
                if !seen_addrs.insert(d.addr) {
                    return Err(SitesConfigError::DuplicateAddress(d.addr));
                }
            }
            if let Some(a) = site_access(site)? {
                access.insert(SiteId(i as u16), a);
            }
            topo.sites.push(Site {
                name: site.name.clone(),
                daemons: site.daemons.iter().map(|d| NodeId(d.id)).collect(),
            });
        }
        let count = by_id.len();
        if let Some(missing) = (0..count as u32).find(|i| !by_id.contains_key(i)) {
            return Err(SitesConfigError::IdsNotDense { count, missing });
        }
        let mut pairs = BTreeSet::new();
        let mut link_faults = BTreeMap::new();
        let mut link_kinds = BTreeMap::new();
        let mut hop_rates = BTreeMap::new();
        for l in &file.links {
            let w = link(l, &index, &mut pairs)?;
            let (ab, ba) = link_hop_rates(l)?;
            hop_rates.extend(ab.map(|r| ((w.a, w.b), r)));
            hop_rates.extend(ba.map(|r| ((w.b, w.a), r)));
            if let Some(f) = link_fault(l)? {
                link_faults.insert((w.a, w.b), f);
                link_faults.insert((w.b, w.a), f);
            }
            if l.protocol != LinkKind::Hop {
                link_kinds.insert((w.a, w.b), l.protocol);
                link_kinds.insert((w.b, w.a), l.protocol);
            }
            topo.links.push(w);
        }
        let auth = match &file.auth {
            Some(a) => {
                let key = a
                    .cluster_key()
                    .map_err(|e| SitesConfigError::Auth(e.to_string()))?;
                let mode = if a.encrypt {
                    Mode::Encrypt
                } else {
                    Mode::Authenticate
                };
                Some((key, mode))
            }
            None => None,
        };
        if auth.is_none() && !file.insecure_no_auth {
            if let Some(a) = by_id.values().find(|a| !a.ip().is_loopback()) {
                return Err(SitesConfigError::AuthRequired(*a));
            }
        }
        let mut file = file;
        file.engine.membership = file.membership.clone();
        // The engine checks its own settings when a daemon is made.
        SiteDaemon::new(
            file.engine.clone(),
            Arc::new(topo.clone()),
            NodeId(0),
            1,
            Instant::ZERO,
        )?;
        Ok(SitesPlan {
            topology: Arc::new(topo),
            addrs: by_id.into_values().collect(),
            engine: file.engine,
            auth,
            link_faults,
            link_kinds,
            hop_rates,
            access,
        })
    }

    /// The runtime's settings for a daemon: the address book and, with a
    /// key, authentication (`epoch`: Unix milliseconds at start-up, rising
    /// across restarts; see `Sealer::new`).
    pub fn node_config(&self, epoch: u64) -> Result<NodeConfig, NetError> {
        let mut config = NodeConfig::new(self.book()?);
        config.auth = self.auth.as_ref().map(|(key, mode)| Auth {
            key: key.clone(),
            mode: *mode,
            epoch,
        });
        Ok(config)
    }

    /// The address book of every daemon (id `i` at `addrs[i]`).
    pub fn book(&self) -> Result<AddressBook, NetError> {
        AddressBook::new(self.addrs.clone())
    }

    /// Daemon `id`'s address.
    pub fn addr(&self, id: u32) -> Result<SocketAddr, SitesConfigError> {
        self.addrs
            .get(id as usize)
            .copied()
            .ok_or(SitesConfigError::UnknownDaemon(id))
    }

    /// Daemon `id`'s engine, started at `now` in the first configuration.
    pub fn engine(&self, id: u32, now: Instant) -> Result<SiteEngine, SitesConfigError> {
        self.addr(id)?;
        let daemon = SiteDaemon::new(
            self.engine.clone(),
            self.topology.clone(),
            NodeId(id),
            1,
            now,
        )?;
        let mut daemon = daemon;
        let mine = daemon.site();
        for (&(_, to), &kind) in self
            .link_kinds
            .iter()
            .filter(|((from, _), _)| *from == mine)
        {
            daemon.set_link_kind(to, kind);
        }
        for (&(_, to), &rate) in self.hop_rates.iter().filter(|((from, _), _)| *from == mine) {
            daemon.set_link_hop_rate(to, Some(rate))?;
        }
        let mut engine = SiteEngine::new(daemon, &self.topology);
        engine.link_faults = self.link_faults.clone();
        engine.access = self.access.get(&mine).copied();
        engine.seed_link_faults(u64::from(id));
        Ok(engine)
    }
}

/// A site's emulated access link, if it has one; refused when out of
/// range.
fn site_access(site: &SiteEntry) -> Result<Option<Access>, SitesConfigError> {
    if site.uplink_kbps.is_none()
        && site.downlink_kbps.is_none()
        && site.access_queue_packets.is_none()
    {
        return Ok(None);
    }
    let rate_ok = |r: Option<f64>| r.is_none_or(|r| r > 0.0 && r.is_finite());
    let queue_packets = site.access_queue_packets.unwrap_or(100);
    if !(rate_ok(site.uplink_kbps) && rate_ok(site.downlink_kbps) && queue_packets > 0) {
        return Err(SitesConfigError::BadAccess(site.name.clone()));
    }
    Ok(Some(Access {
        uplink_bps: site.uplink_kbps.map(|r| r * 1e3),
        downlink_bps: site.downlink_kbps.map(|r| r * 1e3),
        queue_packets,
    }))
}

/// A link's Hop bucket rates in bit/s, (a to b, b to a), where set.
fn link_hop_rates(l: &LinkEntry) -> Result<(Option<u64>, Option<u64>), SitesConfigError> {
    let bad = |message| SitesConfigError::BadHopRate {
        a: l.a.clone(),
        b: l.b.clone(),
        message,
    };
    let (ab, ba) =
        match (
            l.hop_rate_kbps,
            l.hop_rate_a_to_b_kbps,
            l.hop_rate_b_to_a_kbps,
        ) {
            (Some(r), None, None) => (Some(r), Some(r)),
            (None, ab, ba) => (ab, ba),
            _ => return Err(bad(
                "give hop_rate_kbps, or hop_rate_a_to_b_kbps and/or hop_rate_b_to_a_kbps, not both",
            )),
        };
    if (ab.is_some() || ba.is_some()) && l.protocol != LinkKind::Hop {
        return Err(bad("a hop rate on a link that does not run Hop"));
    }
    let bps = |r: Option<f64>| match r {
        None => Ok(None),
        Some(r) if r.is_finite() && r * 1e3 >= 1.0 => Ok(Some((r * 1e3).round() as u64)),
        Some(_) => Err(bad("hop rates are at least 0.001 Kbit/s and finite")),
    };
    Ok((bps(ab)?, bps(ba)?))
}

/// A link's injected faults, if it has any; refused when out of range.
fn link_fault(l: &LinkEntry) -> Result<Option<LinkFault>, SitesConfigError> {
    if l.delay_ms.is_none()
        && l.loss.is_none()
        && l.rate_kbps.is_none()
        && l.queue_packets.is_none()
    {
        return Ok(None);
    }
    let delay = l.delay_ms.unwrap_or(0.0);
    let loss = l.loss.unwrap_or(0.0);
    let rate_ok = l.rate_kbps.is_none_or(|r| r > 0.0 && r.is_finite());
    let queue_packets = l.queue_packets.unwrap_or(100);
    if !(delay >= 0.0
        && delay.is_finite()
        && (0.0..1.0).contains(&loss)
        && rate_ok
        && queue_packets > 0)
    {
        return Err(SitesConfigError::BadLinkFault {
            a: l.a.clone(),
            b: l.b.clone(),
        });
    }
    Ok(Some(LinkFault {
        delay: std::time::Duration::from_secs_f64(delay / 1e3),
        loss,
        rate_bps: l.rate_kbps.map(|r| r * 1e3),
        queue_packets,
    }))
}

fn link(
    l: &LinkEntry,
    index: &BTreeMap<&str, u16>,
    pairs: &mut BTreeSet<(u16, u16)>,
) -> Result<LinkWeights, SitesConfigError> {
    let names = || (l.a.clone(), l.b.clone());
    let site = |name: &String| {
        index
            .get(name.as_str())
            .copied()
            .ok_or_else(|| SitesConfigError::UnknownSite {
                a: l.a.clone(),
                b: l.b.clone(),
                name: name.clone(),
            })
    };
    let (a, b) = (site(&l.a)?, site(&l.b)?);
    if a == b {
        return Err(SitesConfigError::SelfLink(l.a.clone()));
    }
    if !pairs.insert((a.min(b), a.max(b))) {
        let (a, b) = names();
        return Err(SitesConfigError::DuplicateLink { a, b });
    }
    let (a_to_b, b_to_a) = match (l.weight, l.a_to_b, l.b_to_a) {
        (Some(w), None, None) => (Some(w), Some(w)),
        (None, x, y) => (x, y),
        _ => {
            let (a, b) = names();
            return Err(SitesConfigError::WeightAndDirections { a, b });
        }
    };
    if a_to_b.is_none() && b_to_a.is_none() {
        let (a, b) = names();
        return Err(SitesConfigError::NoDirection { a, b });
    }
    if a_to_b == Some(0) || b_to_a == Some(0) {
        let (a, b) = names();
        return Err(SitesConfigError::ZeroWeight { a, b });
    }
    Ok(LinkWeights {
        a: SiteId(a),
        b: SiteId(b),
        a_to_b,
        b_to_a,
    })
}

/// Counters of the adapter (the daemon and the runtime keep their own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SiteEngineStats {
    /// Datagrams from an id outside the topology, dropped.
    pub unknown_sender: u64,
    /// Ring multicasts sent as unicast copies to the site's other daemons.
    pub lan_fan_out: u64,
    /// Datagrams dropped by a link's injected loss (`loss`).
    pub link_dropped: u64,
    /// Datagrams dropped at a full link queue (`rate_kbps`,
    /// `queue_packets`).
    pub link_queue_dropped: u64,
    /// Datagrams held for a link's injected delay (`delay_ms`), and how
    /// late, in microseconds summed, the runtime's timer handed them over
    /// after they were due (the emulated link's delay is `delay_ms` plus
    /// this lateness on average).
    pub link_held: u64,
    pub link_late_us: u64,
    /// Datagrams to other sites dropped at the site's full uplink queue,
    /// and from other sites at its full downlink queue (`uplink_kbps`,
    /// `downlink_kbps`, `access_queue_packets`).
    pub uplink_dropped: u64,
    pub downlink_dropped: u64,
}

/// One site daemon as a `shoal_core::Engine`, for a [`Node`](crate::Node).
#[derive(Debug)]
pub struct SiteEngine {
    daemon: SiteDaemon,
    /// The other daemons of this daemon's site.
    site_peers: Vec<NodeId>,
    /// Each daemon's site, by id.
    site_of: Vec<SiteId>,
    pending: VecDeque<Transmit>,
    stats: SiteEngineStats,
    /// The sites file's per-link delay and loss, by (sending site,
    /// receiving site), and the fault layer of each link into this
    /// daemon's site, by sending site.
    link_faults: BTreeMap<(SiteId, SiteId), LinkFault>,
    link_layers: BTreeMap<SiteId, crate::Faults>,
    /// The capacity of each link into this daemon's site that has one.
    link_queues: BTreeMap<SiteId, LinkQueue>,
    /// This daemon's site's emulated access link, if it has one.
    access: Option<Access>,
    uplink: Option<LinkQueue>,
    downlink: Option<LinkQueue>,
    /// Datagrams to other sites serialised on the uplink, each with the
    /// time its last bit leaves (in that order).
    on_uplink: VecDeque<(Instant, Transmit)>,
}

impl SiteEngine {
    /// Wraps `daemon` of `topology`.
    pub fn new(daemon: SiteDaemon, topology: &Topology) -> SiteEngine {
        let n = topology
            .sites
            .iter()
            .flat_map(|s| s.daemons.iter())
            .map(|d| d.0 as usize + 1)
            .max()
            .unwrap_or(0);
        let mut site_of = vec![SiteId(u16::MAX); n];
        for (i, s) in topology.sites.iter().enumerate() {
            for d in &s.daemons {
                site_of[d.0 as usize] = SiteId(i as u16);
            }
        }
        let me = daemon.node_id();
        let site_peers = topology.sites[usize::from(daemon.site().0)]
            .daemons
            .iter()
            .copied()
            .filter(|d| *d != me)
            .collect();
        SiteEngine {
            daemon,
            site_peers,
            site_of,
            pending: VecDeque::new(),
            stats: SiteEngineStats::default(),
            link_faults: BTreeMap::new(),
            link_layers: BTreeMap::new(),
            link_queues: BTreeMap::new(),
            access: None,
            uplink: None,
            downlink: None,
            on_uplink: VecDeque::new(),
        }
    }

    /// Starts the per-link fault layers (the sites file's `delay_ms` and
    /// `loss`) from `seed`, one generator per link into this daemon's
    /// site, and the site's access link (`uplink_kbps`,
    /// `downlink_kbps`). Call before any datagram arrives.
    pub fn seed_link_faults(&mut self, seed: u64) {
        let mine = self.daemon.site();
        let layer = |from: SiteId, f: Option<&LinkFault>| {
            let config = crate::FaultConfig {
                drop_probability: f.map_or(0.0, |f| f.loss),
                delay: f.map_or(std::time::Duration::ZERO, |f| f.delay),
                seed: seed
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .wrapping_add(u64::from(from.0)),
                ..crate::FaultConfig::default()
            };
            (from, crate::Faults::new(config))
        };
        self.link_layers = self
            .link_faults
            .iter()
            .filter(|((_, to), _)| *to == mine)
            .map(|(&(from, _), f)| layer(from, Some(f)))
            .collect();
        self.link_queues = self
            .link_faults
            .iter()
            .filter(|((_, to), _)| *to == mine)
            .filter_map(|(&(from, _), f)| {
                Some((from, LinkQueue::new(f.rate_bps?, f.queue_packets)))
            })
            .collect();
        let access = self.access;
        let queue = |rate: Option<f64>| {
            let a = access?;
            Some(LinkQueue::new(rate?, a.queue_packets))
        };
        self.uplink = queue(access.and_then(|a| a.uplink_bps));
        self.downlink = queue(access.and_then(|a| a.downlink_bps));
        if self.downlink.is_some() {
            // A datagram the downlink holds is handed over by a link's
            // layer: every other site gets one.
            for from in (0..self.site_count()).map(|s| SiteId(s as u16)) {
                if from != mine && !self.link_layers.contains_key(&from) {
                    let (from, l) = layer(from, None);
                    self.link_layers.insert(from, l);
                }
            }
        }
    }

    fn site_count(&self) -> usize {
        self.site_of
            .iter()
            .filter(|s| s.0 != u16::MAX)
            .map(|s| usize::from(s.0) + 1)
            .max()
            .unwrap_or(0)
    }

    /// The daemon: its counters and state.
    pub fn daemon(&self) -> &SiteDaemon {
        &self.daemon
    }

    /// The daemon, for client requests (`connect`, `join`, `leave`,
    /// `send`); the `Node` drains its outputs after the closure returns.
    pub fn daemon_mut(&mut self) -> &mut SiteDaemon {
        &mut self.daemon
    }

    /// The adapter's counters.
    pub fn stats(&self) -> SiteEngineStats {
        self.stats
    }
}

impl SiteEngine {
    /// Queues a datagram to another site on the emulated uplink: it is
    /// sent when its last bit would leave, or dropped if the queue is full.
    fn onto_uplink(&mut self, now: Instant, to: NodeId, payload: Bytes) {
        let Some(q) = self.uplink.as_mut() else {
            return;
        };
        match q.admit(now, payload.len()) {
            Some(done) => self.on_uplink.push_back((
                done,
                Transmit {
                    destination: Destination::Node(to),
                    payload,
                },
            )),
            None => self.stats.uplink_dropped += 1,
        }
    }
}

impl Engine for SiteEngine {
    type Event = sites::Event;

    fn node_id(&self) -> NodeId {
        self.daemon.node_id()
    }

    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        match self.site_of.get(from.0 as usize) {
            Some(&s) if s == self.daemon.site() => self.daemon.handle_lan(now, from, datagram),
            Some(&s) if s.0 != u16::MAX => {
                if let Some(layer) = self.link_layers.get_mut(&s) {
                    // Through the site's downlink and the link's queue
                    // first (a datagram lost after it used the link), then
                    // loss and delay.
                    let mut through = now;
                    if let Some(q) = self.downlink.as_mut() {
                        match q.admit(through, datagram.len()) {
                            Some(t) => through = t,
                            None => {
                                self.stats.downlink_dropped += 1;
                                return;
                            }
                        }
                    }
                    if let Some(q) = self.link_queues.get_mut(&s) {
                        match q.admit(through, datagram.len()) {
                            Some(t) => through = t,
                            None => {
                                self.stats.link_queue_dropped += 1;
                                return;
                            }
                        }
                    }
                    let queued = through.saturating_duration_since(now);
                    match layer.judge(now) {
                        crate::Verdict::Drop => {
                            self.stats.link_dropped += 1;
                            return;
                        }
                        crate::Verdict::DelayUntil(due) => {
                            layer.hold(due + queued, from, datagram);
                            return;
                        }
                        crate::Verdict::Deliver if !queued.is_zero() => {
                            layer.hold(through, from, datagram);
                            return;
                        }
                        crate::Verdict::Deliver => {}
                    }
                }
                self.daemon.handle_wan(now, from, datagram)
            }
            _ => self.stats.unknown_sender += 1,
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        for layer in self.link_layers.values_mut() {
            while let Some(due) = layer.next_due().filter(|due| *due <= now) {
                let Some((from, datagram)) = layer.pop_due(now) else {
                    break;
                };
                self.stats.link_held += 1;
                self.stats.link_late_us += now.saturating_duration_since(due).as_micros() as u64;
                self.daemon.handle_wan(now, from, &datagram);
            }
        }
        self.daemon.handle_timeout(now);
    }

    /// Not the sites' interface: a client message names its client,
    /// service and groups (`SiteDaemon::send` through
    /// [`SiteEngine::daemon_mut`]). Refused, the engine unchanged.
    fn multicast(&mut self, _now: Instant, payload: Bytes) -> Result<u64, SendError> {
        Err(SendError::TooLarge {
            len: payload.len(),
            max: 0,
        })
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        loop {
            if let Some(t) = self.pending.pop_front() {
                return Some(t);
            }
            if self.on_uplink.front().is_some_and(|(done, _)| *done <= now) {
                return self.on_uplink.pop_front().map(|(_, t)| t);
            }
            let out = self.daemon.poll_transmit()?;
            match out.target {
                Target::Lan(Destination::Multicast) => {
                    self.stats.lan_fan_out += 1;
                    for p in &self.site_peers {
                        self.pending.push_back(Transmit {
                            destination: Destination::Node(*p),
                            payload: out.payload.clone(),
                        });
                    }
                }
                Target::Wan(n) if self.uplink.is_some() => {
                    self.onto_uplink(now, n, out.payload);
                }
                Target::Lan(Destination::Node(n)) | Target::Wan(n) => {
                    return Some(Transmit {
                        destination: Destination::Node(n),
                        payload: out.payload,
                    })
                }
            }
        }
    }

    fn poll_event(&mut self) -> Option<sites::Event> {
        self.daemon.poll_event()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.link_layers
            .values()
            .filter_map(crate::Faults::next_due)
            .chain(self.on_uplink.front().map(|(done, _)| *done))
            .chain(self.daemon.poll_timeout())
            .min()
    }
}

pub mod clients;
#[cfg(test)]
mod tests;
