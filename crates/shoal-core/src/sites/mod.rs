//! Spread's service across sites (P-Spread §2.1-§2.5; views by Extended
//! Virtual Synchrony, Moser, Amir, Melliar-Smith, Agarwal, ICDCS 1994).
//! `docs/spread.md`, "End to end across sites", has the design.
//!
//! One [`SiteDaemon`] is one daemon. The daemons of a site run the Ring
//! ([`crate::ring`]) on their LAN; the ring's delivery order is the same
//! at each of them, and each turns it into the same *site stream*: its
//! own site's elements numbered in ring order and stamped with a Lamport
//! timestamp, and other sites' elements, which the site's gateway took in
//! from the WAN and multicast in the ring. The gateway (the lowest daemon
//! of the site's first ring, then, when it leaves, the lowest of those
//! holding the site's state) forwards its site's elements over Hop links
//! ([`crate::hop`]) down the site's source tree ([`crate::overlay`]) and
//! passes other sites' elements on, on arrival. A link may run the TCP
//! model instead ([`crate::hop::tcp`], P-Spread's baseline:
//! [`SiteDaemon::set_link_kind`]).
//!
//! Delivery, the same decision at every daemon of a configuration:
//! - unreliable: when the element enters the stream;
//! - reliable, fifo, causal, agreed: in the total order of (timestamp,
//!   site), once every site of the configuration has been heard from at or
//!   past the timestamp; reliable and fifo are not delivered earlier,
//!   because group views change at points of that same order and a
//!   message must fall in the same view everywhere;
//! - safe: in the same order, once every site has announced (a marker, a
//!   ring SAFE message) that all its daemons hold it.
//!
//! A daemon starting into a running site (or again after a crash) takes
//! the site's state from a member through the ring (`sync.rs`).
//!
//! Joins and leaves are single elements in the total order (lightweight
//! groups). A configuration of sites is handed to each daemon by its
//! driver ([`SiteDaemon::handle_site_view`]); the change itself (flush,
//! recovery of departed sites' messages, transitional and regular views)
//! is this module's.

pub mod codec;
pub mod harness;
pub mod membership;
mod parts;
mod sync;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::hop::tcp::{TcpConfig, TcpLink};
use crate::hop::{self, Hop, LinkProtocol};
use crate::overlay::{Membership, Routes, SiteId, Topology};
use crate::ring::{self, Ring, RingId};
use crate::{Destination, Engine, Instant, NodeId};
pub use codec::{Body, Element, Malformed};
use codec::{RingMsg, WanMsg, RING_PART_HEADER, TREE, WAN_PART_HEADER};
pub use membership::MembershipConfig;
use membership::SiteMembership;
use parts::{part_count, RingParts, WanParts, ELEMENT_ALLOWANCE};
use sync::{Round, Standing};

/// A message's service (Spread's service types), weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Service {
    Unreliable,
    Reliable,
    Fifo,
    Causal,
    Agreed,
    Safe,
}

impl Service {
    /// Every service, weakest first.
    pub const ALL: [Service; 6] = [
        Service::Unreliable,
        Service::Reliable,
        Service::Fifo,
        Service::Causal,
        Service::Agreed,
        Service::Safe,
    ];
}

impl From<Service> for shoal_check::Service {
    fn from(service: Service) -> shoal_check::Service {
        match service {
            Service::Unreliable => shoal_check::Service::Unreliable,
            Service::Reliable => shoal_check::Service::Reliable,
            Service::Fifo => shoal_check::Service::Fifo,
            Service::Causal => shoal_check::Service::Causal,
            Service::Agreed => shoal_check::Service::Agreed,
            Service::Safe => shoal_check::Service::Safe,
        }
    }
}

/// Settings of a daemon in a site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The Ring inside the site.
    pub ring: ring::Config,
    /// Every Hop link of the gateway.
    pub hop: hop::Config,
    /// Every link of the gateway set to the TCP model
    /// ([`LinkKind::Tcp`]; P-Spread's baseline, §3.1, §4.3), the model's
    /// defaults (`hop::tcp::TcpConfig`).
    pub tcp: TcpConfig,
    /// Messages a daemon originated that are not yet known held at every
    /// site, at most; more wait at the daemon (P-Spread §2.1's global
    /// window; the paper gives no size). 200: at the paper's largest
    /// round trip (104 ms) it lets one daemon send about 2000 msgs/s.
    pub global_window: usize,
    /// How often a gateway tells every site what its site holds, so that
    /// lost elements are resent (after a gateway change or a
    /// configuration change reset the links). Ours: a few WAN round trips.
    #[serde(with = "crate::serde_ms")]
    pub status_interval: Duration,
    /// How often a gateway names itself to its neighbours' gateways.
    #[serde(with = "crate::serde_ms")]
    pub beacon_interval: Duration,
    /// A site's markers (it was heard from: what its ordered elements wait
    /// for at every other site) are at least this far apart. A marker
    /// follows data taken in, and every site's markers cross the whole
    /// WAN, so without a spacing a site that receives N messages a second
    /// sends about N markers, each to every site: on P-Spread's tree of
    /// six sites, 1.5 Mbit/s links carried more markers than data and
    /// the loss-free stream fell to 60% of one link's. The spacing adds at
    /// most this much to an ordered message's wait. 0: one marker per
    /// batch of data taken in, as before.
    #[serde(with = "crate::serde_ms")]
    pub marker_interval: Duration,
    /// A site whose count of another site's elements has not risen for
    /// this long is resent what it lacks; an element resent is not resent
    /// again sooner. Above a round trip plus the time a slow link takes
    /// to carry a window.
    #[serde(with = "crate::serde_ms")]
    pub resend_timeout: Duration,
    /// Largest client payload (1 MiB, as the main daemon's
    /// `message_size`). A message longer than a datagram goes in parts,
    /// in the ring and over the WAN (`sites/parts.rs`); its parts must
    /// fit the ring's `send_queue_max`.
    pub max_payload: usize,
    /// Client messages, joins and leaves waiting at a daemon, at most.
    pub send_queue_max: usize,
    /// The largest UDP payload a daemon sends: 1,472 bytes (a 1,500-byte
    /// MTU less IP and UDP headers). Ring datagrams (a recovery's
    /// included) and WAN datagrams (Hop's, in the WAN header) fit it with
    /// `SEAL_ALLOWANCE` to spare for the runtime's authentication
    /// envelope: a message that would not goes in parts, and the links'
    /// Hop datagrams are cut to it (`hop.max_datagram_size` is the
    /// smaller of its own and what this leaves).
    pub max_datagram: usize,
    /// The site membership (`membership.rs`): gateways detect sites
    /// that fail or become unreachable and agree on the configuration.
    /// Off by default in the engine (the simulator's figures hand
    /// configurations over as partitions); a sites file sets it from its
    /// own `[membership]` table, on unless it says otherwise.
    #[serde(skip)]
    pub membership: MembershipConfig,
}

/// Bytes every datagram leaves for the runtime's seal (`shoal-net`'s
/// authentication envelope, 30 bytes), keyed or not.
pub const SEAL_ALLOWANCE: usize = 30;

impl Default for Config {
    fn default() -> Config {
        Config {
            ring: ring::Config::default(),
            hop: hop::Config::default(),
            tcp: TcpConfig::default(),
            global_window: 200,
            status_interval: Duration::from_millis(100),
            beacon_interval: Duration::from_millis(100),
            marker_interval: Duration::from_millis(MARKER_INTERVAL_MS),
            resend_timeout: Duration::from_millis(1000),
            max_payload: 1 << 20,
            send_queue_max: 10_000,
            max_datagram: 1472,
            membership: MembershipConfig {
                enabled: false,
                ..MembershipConfig::default()
            },
        }
    }
}

/// What a daemon tells its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `client` (of this daemon) receives a message.
    Deliver {
        client: String,
        sender: String,
        service: Service,
        groups: Vec<String>,
        payload: Bytes,
        /// Delivered in a transitional configuration (EVS).
        transitional: bool,
    },
    /// `client` (of this daemon) installs a view of `group`. A client
    /// that leaves gets the view the members that stay get (without
    /// itself), and no more of the group.
    View {
        client: String,
        group: String,
        view_id: u64,
        members: Vec<String>,
        transitional: bool,
        /// Why the membership changed.
        reason: ViewReason,
    },
    /// `client` (of this daemon) is disconnected: the daemon gave up its
    /// site state for another member's (its site had split and merged
    /// again), and the client's history is not the site's. It has left
    /// every group.
    Dropped { client: String },
}

/// Why a group's view changed (the client protocol's membership reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewReason {
    /// A client joined.
    Join,
    /// A client left, or disconnected from its daemon (its daemon leaves
    /// each of its groups for it: the two look alike here).
    Leave,
    /// A daemon left its site's ring (its clients left with it), or the
    /// configuration of sites changed (transitional views, and the first
    /// regular view of a configuration).
    Network,
}

/// Where a datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// On the site's LAN (the Ring's datagrams).
    Lan(Destination),
    /// Across the WAN to another site's daemon.
    Wan(NodeId),
}

/// A datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Out {
    pub target: Target,
    pub payload: Bytes,
}

/// Why a daemon could not be created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SitesError {
    #[error("daemon is in no site of the topology")]
    NoSite,
    #[error(transparent)]
    Ring(#[from] ring::RingError),
    #[error(transparent)]
    Hop(#[from] hop::ConfigError),
    #[error("global_window must be positive")]
    ZeroWindow,
    #[error("tcp: {0}")]
    Tcp(&'static str),
    #[error("max_datagram {0} leaves no room for ring and Hop headers (at least 576)")]
    DatagramTooSmall(usize),
    #[error("max_payload {max_payload} needs {parts} ring messages, above the ring's send_queue_max {queue}")]
    PayloadTooLarge {
        max_payload: usize,
        parts: usize,
        queue: usize,
    },
    #[error("membership: site_timeout {timeout:?} must exceed the ring's token_timeout plus consensus_timeout ({reform:?}, the time a site's ring takes to re-form after its gateway crashed) and heartbeat_interval {heartbeat:?}")]
    SiteTimeout {
        timeout: Duration,
        reform: Duration,
        heartbeat: Duration,
    },
}

/// Why a client request was refused. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("payload of {len} bytes exceeds {max}")]
    TooLarge { len: usize, max: usize },
    #[error("the client's and groups' names take {len} bytes, above {max}")]
    NamesTooLong { len: usize, max: usize },
    #[error("too many requests wait at this daemon")]
    QueueFull,
    #[error("no such client at this daemon")]
    UnknownClient,
}

/// Counters of one daemon.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub bad_datagrams: u64,
    /// Elements resent after a status showed them missing.
    pub resent: u64,
    /// Elements a status showed missing and not resent, because the live
    /// Hop link toward that site still had them in its custody (queued,
    /// in flight or being recovered): Hop delivers them.
    pub resend_skipped: u64,
    /// Elements of a departed site dropped because no member site held them.
    pub truncated: u64,
    pub markers: u64,
    pub configurations: u64,
    /// Times this daemon became gateway.
    pub gateway_takeovers: u64,
    /// Client requests that waited for the global window.
    pub window_waits: u64,
    /// Rings in which this daemon founded its site's state (no member
    /// held one).
    pub foundings: u64,
    /// Times this daemon handed its site's state to members joining.
    pub snapshots_sent: u64,
    /// Times this daemon took its site's state from another member.
    pub snapshots_taken: u64,
    /// Times this daemon dropped its state (and clients) for another's.
    pub states_given_up: u64,
    /// Rings that ended before this daemon, holding no state, got one.
    pub rounds_abandoned: u64,
    /// Messages sent in parts (in the ring or over a link).
    pub sent_in_parts: u64,
    /// Parts refused: out of order, or a message longer than allowed.
    pub parts_refused: u64,
    /// Ring messages not queued for lack of room in the ring's queue.
    pub ring_refused: u64,
    /// Configurations this gateway committed as the site membership's
    /// leader, and commits its site acted on.
    pub commits_made: u64,
    pub commits_taken: u64,
    /// Flushes of a commit dropped: the site was no longer in the
    /// configuration the commit expected it in (the leader commits again).
    pub stale_commits: u64,
    /// Flushes that closed the stream again for a newer commit while an
    /// older change had not completed.
    pub superseded: u64,
}

/// One site's stream within one configuration, as taken in here.
#[derive(Debug, Default)]
struct Stream {
    /// The next element expected (elements are numbered from 1).
    next: u64,
    early: BTreeMap<u64, Element>,
    last_ts: u64,
    /// Elements waiting for their place in the total order.
    ordered: VecDeque<Element>,
    /// The site's latest marker: what all its daemons hold.
    announced: Vec<u64>,
    flush: Option<(u32, Vec<SiteId>, Vec<u64>)>,
    state: Option<Vec<(String, String, NodeId)>>,
}

/// A configuration of sites.
#[derive(Debug)]
struct Conf {
    epoch: u32,
    sites: Vec<SiteId>,
    streams: Vec<Stream>,
    /// Regular views given and ordered delivery running.
    installed: bool,
}

impl Conf {
    fn new(epoch: u32, sites: &[SiteId], installed: bool) -> Conf {
        let mut sites = sites.to_vec();
        sites.sort_unstable();
        sites.dedup();
        let streams = sites
            .iter()
            .map(|_| Stream {
                next: 1,
                announced: vec![0; sites.len()],
                ..Stream::default()
            })
            .collect();
        Conf {
            epoch,
            sites,
            streams,
            installed,
        }
    }

    fn index(&self, site: SiteId) -> Option<usize> {
        self.sites.binary_search(&site).ok()
    }

    fn holds(&self) -> Vec<u64> {
        self.streams.iter().map(|s| s.next - 1).collect()
    }

    /// Every site announced it holds element `seq` of site `i`.
    fn stable(&self, i: usize, seq: u64) -> bool {
        self.streams.iter().all(|s| s.announced[i] >= seq)
    }
}

/// A change of configuration this daemon's site has flushed for.
#[derive(Debug, Clone)]
struct Pending {
    epoch: u32,
    sites: Vec<SiteId>,
    /// The sites that end the old configuration together: of the new
    /// one's, those coming from the old one.
    staying: Vec<SiteId>,
    /// Committed by the site membership: a newer commit supersedes it
    /// while it is incomplete (a driver's change waits instead).
    decided: bool,
    /// This site's first element of the new configuration (its members
    /// of every group), made once the site holds everything the change
    /// needs: every other site of the new configuration waits for it
    /// before it completes the change (the second phase).
    state: Option<Element>,
}

impl Pending {
    fn stays(&self, site: &SiteId) -> bool {
        self.staying.contains(site)
    }
}

/// Which protocol a gateway's link to a neighbouring site runs. Both
/// ends must run the same (a sites file sets both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// The Hop link protocol (P-Spread §3.2): non-blocking forwarding,
    /// lazy selective NACKs, a leaky bucket (`Config::hop`).
    #[default]
    Hop,
    /// The TCP model (`hop::tcp`, `Config::tcp`): in order only,
    /// Reno/NewReno congestion control, no rate setting. The paper's
    /// baseline; its segments go in UDP datagrams like Hop's.
    Tcp,
}

/// One end of a gateway's link: Hop or the TCP model.
#[derive(Debug)]
enum LinkEnd {
    Hop(Hop),
    Tcp(TcpLink),
}

impl LinkEnd {
    fn protocol(&mut self) -> &mut dyn LinkProtocol {
        match self {
            LinkEnd::Hop(h) => h,
            LinkEnd::Tcp(t) => t,
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self {
            LinkEnd::Hop(h) => h.poll_timeout(),
            LinkEnd::Tcp(t) => t.poll_timeout(),
        }
    }

    /// The ticket of the last message accepted: Hop's link sequence
    /// number, TCP's stream offset of the message's end.
    fn accepted(&self) -> u64 {
        match self {
            LinkEnd::Hop(h) => h.accepted(),
            LinkEnd::Tcp(t) => t.accepted(),
        }
    }

    /// Every ticket up to this one was handed up at the peer (Hop) or
    /// arrived there (TCP's cumulative ACK).
    fn acknowledged(&self) -> u64 {
        match self {
            LinkEnd::Hop(h) => h.acknowledged(),
            LinkEnd::Tcp(t) => t.acknowledged(),
        }
    }

    /// Hop's counters; a TCP-model link counts only retransmissions.
    fn stats(&self) -> hop::Stats {
        match self {
            LinkEnd::Hop(h) => h.stats(),
            LinkEnd::Tcp(t) => hop::Stats {
                retransmissions: t.retransmissions,
                ..hop::Stats::default()
            },
        }
    }
}

/// One end of a link (Hop or the TCP model) to a neighbouring site's
/// gateway.
#[derive(Debug)]
struct Link {
    peer: NodeId,
    end: LinkEnd,
    /// Which link this is: a link started afresh (new peer gateway, new
    /// configuration) gets a new number, and tickets of the old one mean
    /// nothing on it.
    instance: u64,
}

/// A request of a local client waiting for the ring.
#[derive(Debug)]
struct Request {
    body: Body,
    data: bool,
}

/// One daemon of a site.
#[derive(Debug)]
pub struct SiteDaemon {
    config: Config,
    topo: Arc<Topology>,
    me: NodeId,
    site: SiteId,
    now: Instant,
    ring: Ring,
    /// Whether this daemon holds its site's state, and the state round
    /// open in its ring (`sync.rs`).
    standing: Standing,
    round: Option<Round>,
    first_epoch: u32,
    /// The site's daemons and its gateway, as the site state has them.
    site_members: Vec<NodeId>,
    site_gateway: Option<NodeId>,
    gateway: bool,
    // WAN: gateway only.
    links: BTreeMap<SiteId, Link>,
    /// Neighbouring sites whose link is not Hop.
    link_kinds: BTreeMap<SiteId, LinkKind>,
    /// Neighbouring sites whose Hop link's leaky bucket runs at its own
    /// rate (bit/s) instead of `config.hop.rate_bps`.
    hop_rates: BTreeMap<SiteId, u64>,
    link_epoch: u32,
    view_sites: Vec<SiteId>,
    routes: Routes,
    inject_next: BTreeMap<(u32, SiteId), u64>,
    inject_early: BTreeMap<(u32, SiteId, u64), Bytes>,
    /// An element waits in `inject_early` for room in the ring's queue.
    inject_stalled: bool,
    marker_in_flight: bool,
    /// The next marker may not be made before this (`marker_interval`).
    marker_not_before: Instant,
    sent_upto: BTreeMap<(SiteId, u32, SiteId), u64>,
    /// This site's elements handed to a Hop link: (epoch, seq, the
    /// link's site) to (link instance, Hop ticket). While the ticket is
    /// above the link's acknowledged point, Hop still carries the element.
    custody: BTreeMap<(u32, u64, SiteId), (u64, u64)>,
    links_made: u64,
    /// What each site last said it holds, per configuration, and since when.
    last_status: BTreeMap<(SiteId, u32), Vec<(u64, Instant)>>,
    last_clear: Instant,
    status_at: Instant,
    beacon_at: Instant,
    // The site stream: the same at every daemon of the site.
    clock: u64,
    conf: Conf,
    prev: Option<Conf>,
    future: BTreeMap<u32, Vec<Element>>,
    pending: Option<Pending>,
    own_closed: bool,
    /// A configuration handed over while the stream was closed for an
    /// earlier one (`flush_deferred`).
    deferred: Option<Pending>,
    held_own: Vec<(NodeId, Body)>,
    data_since_marker: bool,
    /// Data elements taken in since the last marker (gateway only, not
    /// site state): a marker goes at the latest after a quarter of
    /// `global_window` of them.
    data_count: usize,
    store: BTreeMap<(u32, SiteId, u64), Bytes>,
    groups: BTreeMap<String, BTreeSet<String>>,
    client_daemon: BTreeMap<String, NodeId>,
    view_counter: BTreeMap<String, u64>,
    // Local clients.
    local: BTreeSet<String>,
    queue: VecDeque<Request>,
    in_ring: usize,
    mine_unstable: VecDeque<u64>,
    out: VecDeque<Out>,
    events: VecDeque<Event>,
    stats: Stats,
    /// Ring messages arriving in parts (site state).
    ring_parts: RingParts,
    /// Elements arriving in parts over the WAN (gateway only).
    wan_parts: WanParts,
    /// The site membership, at the gateway when it is on.
    membership: Option<SiteMembership>,
    /// The change this gateway sent its site's state for (not site state:
    /// a new gateway asks again).
    state_asked: Option<u32>,
    /// A flush the ring's queue refused, to send when it has room.
    flush_unsent: Option<Body>,
    /// The open state round's messages the ring's queue has not taken
    /// yet (`sync.rs`).
    round_out: VecDeque<RingMsg>,
    /// Messages in progress taken with a snapshot.
    #[cfg(test)]
    parts_adopted: usize,
}

/// View ids: unique per configuration (the driver gives each
/// configuration its own epoch), rising within it.
/// A configuration's transitional views take `(epoch, old epoch)`, unique
/// to the pair (a merge ends two old configurations in one new one, a
/// partition one old in two new); its regular views count up from
/// `(epoch, REGULAR)`, above every transitional id.
/// The configuration a site starts in (or starts again in, its state
/// lost): every site, with the driver's `epoch`; with the site membership
/// on, the site alone, with an epoch of its own (`membership.rs`), and
/// the membership merges it with the others. A whole site that restarts
/// then never takes up a stream the others remember.
fn first_configuration(
    config: &Config,
    topo: &Topology,
    site: SiteId,
    epoch: u32,
) -> (u32, Vec<SiteId>) {
    if config.membership.enabled {
        (membership::first_epoch(site), vec![site])
    } else {
        (epoch, (0..topo.sites.len() as u16).map(SiteId).collect())
    }
}

fn view_id(epoch: u32, n: u64) -> u64 {
    (u64::from(epoch) << 32) | n
}

/// `Config::marker_interval`'s default, chosen by measurement (docs/spread.md).
const MARKER_INTERVAL_MS: u64 = 15;

const REGULAR: u64 = 1 << 31;

/// The TCP model's settings a link can run with: a segment's length is
/// 16 bits, and the timeout's floor is not above its ceiling.
fn validate_tcp(tcp: &TcpConfig) -> Result<(), SitesError> {
    if tcp.mss == 0 || tcp.mss > usize::from(u16::MAX) {
        return Err(SitesError::Tcp("mss must be 1..=65535"));
    }
    if tcp.rto_min > tcp.rto_max || tcp.rto_min.is_zero() {
        return Err(SitesError::Tcp(
            "rto_min must be positive and at most rto_max",
        ));
    }
    if tcp.send_queue_max == 0 || tcp.receive_window_bytes == 0 {
        return Err(SitesError::Tcp(
            "send_queue_max and receive_window_bytes must be positive",
        ));
    }
    Ok(())
}

/// The longest message the ring carries whole: its own limit, or less
/// if a recovery's datagram of it and the seal would pass `max_datagram`.
fn ring_single_max(config: &Config) -> usize {
    config.ring.max_payload.min(
        config
            .max_datagram
            .saturating_sub(SEAL_ALLOWANCE + shoal_wire::ring::DATA_OVERHEAD_MAX),
    )
}

/// Elements resent to one site for one source per status, at most.
const RESEND_MAX: u64 = 256;

impl SiteDaemon {
    /// Daemon `me` of `topology`, with every site's daemons up, in the
    /// first configuration (all sites, `epoch`).
    pub fn new(
        config: Config,
        topology: Arc<Topology>,
        me: NodeId,
        epoch: u32,
        now: Instant,
    ) -> Result<SiteDaemon, SitesError> {
        if config.global_window == 0 {
            return Err(SitesError::ZeroWindow);
        }
        let m = &config.membership;
        let reform = config.ring.token_timeout + config.ring.consensus_timeout;
        if m.enabled && (m.site_timeout <= reform || m.site_timeout <= m.heartbeat_interval) {
            return Err(SitesError::SiteTimeout {
                timeout: m.site_timeout,
                reform,
                heartbeat: m.heartbeat_interval,
            });
        }
        if !(576..=65_507).contains(&config.max_datagram) {
            return Err(SitesError::DatagramTooSmall(config.max_datagram));
        }
        let mut config = config;
        config.hop.max_datagram_size = config
            .hop
            .max_datagram_size
            .min(config.max_datagram - SEAL_ALLOWANCE - codec::WAN_HEADER_LEN);
        config.hop.validate()?;
        validate_tcp(&config.tcp)?;
        let parts = part_count(
            config.max_payload + ELEMENT_ALLOWANCE,
            ring_single_max(&config).saturating_sub(RING_PART_HEADER),
        );
        if parts > config.ring.send_queue_max || ring_single_max(&config) <= RING_PART_HEADER {
            return Err(SitesError::PayloadTooLarge {
                max_payload: config.max_payload,
                parts,
                queue: config.ring.send_queue_max,
            });
        }
        let site = topology.site_of(me).ok_or(SitesError::NoSite)?;
        let daemons = topology.sites[usize::from(site.0)].daemons.clone();
        // A daemon never assumes its site's ring: it may be starting into
        // a running one, or again after a crash. It gathers (Totem's
        // join), and the ring forms with whoever answers. A site of one
        // daemon has no one to ask.
        let ring = if daemons.len() > 1 {
            Ring::start(config.ring.clone(), me, now)?
        } else {
            Ring::new(
                config.ring.clone(),
                me,
                &[me],
                RingId { seq: 1, rep: me.0 },
                now,
            )?
        };
        let (epoch, first_sites) = first_configuration(&config, &topology, site, epoch);
        let routes = routes_for(&topology, &first_sites);
        let mut d = SiteDaemon {
            config,
            topo: topology,
            me,
            site,
            now,
            ring,
            standing: Standing::Fresh,
            round: None,
            first_epoch: epoch,
            site_members: Vec::new(),
            site_gateway: None,
            gateway: false,
            links: BTreeMap::new(),
            link_kinds: BTreeMap::new(),
            hop_rates: BTreeMap::new(),
            link_epoch: epoch,
            view_sites: first_sites.clone(),
            routes,
            inject_next: BTreeMap::new(),
            inject_early: BTreeMap::new(),
            inject_stalled: false,
            marker_in_flight: false,
            marker_not_before: now,
            sent_upto: BTreeMap::new(),
            custody: BTreeMap::new(),
            links_made: 0,
            last_status: BTreeMap::new(),
            last_clear: now,
            status_at: now,
            beacon_at: now,
            clock: 0,
            conf: Conf::new(epoch, &first_sites, true),
            prev: None,
            future: BTreeMap::new(),
            pending: None,
            own_closed: false,
            deferred: None,
            held_own: Vec::new(),
            data_since_marker: false,
            data_count: 0,
            store: BTreeMap::new(),
            groups: BTreeMap::new(),
            client_daemon: BTreeMap::new(),
            view_counter: BTreeMap::new(),
            local: BTreeSet::new(),
            queue: VecDeque::new(),
            in_ring: 0,
            mine_unstable: VecDeque::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
            ring_parts: RingParts::default(),
            wan_parts: WanParts::default(),
            membership: None,
            state_asked: None,
            flush_unsent: None,
            round_out: VecDeque::new(),
            #[cfg(test)]
            parts_adopted: 0,
        };
        d.pump();
        Ok(d)
    }

    /// The site state a daemon starts with (and founds a site with).
    fn reset_state(&mut self) {
        let (epoch, sites) =
            first_configuration(&self.config, &self.topo, self.site, self.first_epoch);
        self.clock = 0;
        self.conf = Conf::new(epoch, &sites, true);
        self.prev = None;
        self.future.clear();
        self.pending = None;
        self.own_closed = false;
        self.deferred = None;
        self.held_own.clear();
        self.data_since_marker = false;
        self.store.clear();
        self.groups.clear();
        self.client_daemon.clear();
        self.view_counter.clear();
        self.site_members.clear();
        self.site_gateway = None;
        self.ring_parts.clear();
    }

    pub fn node_id(&self) -> NodeId {
        self.me
    }

    /// Whether the site membership (`membership.rs`) decides the
    /// configurations.
    pub fn membership_enabled(&self) -> bool {
        self.config.membership.enabled
    }

    /// The name of `site` in the topology (`"?"` for a site outside it).
    pub fn site_name(&self, site: SiteId) -> &str {
        self.topo
            .sites
            .get(usize::from(site.0))
            .map_or("?", |s| s.name.as_str())
    }

    /// How many sites the topology has.
    pub fn topology_sites(&self) -> usize {
        self.topo.sites.len()
    }

    /// Whether this daemon holds its site's state and is live in its
    /// ring (no state round open): its clients' requests go out.
    pub fn is_live(&self) -> bool {
        self.round.is_none() && self.standing != Standing::Fresh
    }

    pub fn site(&self) -> SiteId {
        self.site
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Whether this daemon is its site's gateway now.
    pub fn is_gateway(&self) -> bool {
        self.gateway
    }

    /// The configuration installed here (epoch and sites) and whether a
    /// change is under way.
    pub fn configuration(&self) -> (u32, &[SiteId], bool) {
        (
            self.conf.epoch,
            &self.conf.sites,
            self.pending.is_some() || !self.conf.installed,
        )
    }

    /// Messages this daemon originated and not yet known held everywhere,
    /// plus those in its ring's queue (what the global window counts).
    pub fn outstanding(&self) -> usize {
        self.in_ring + self.mine_unstable.len()
    }

    /// Client requests waiting at this daemon.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// Elements kept for resending.
    pub fn stored(&self) -> usize {
        self.store.len()
    }

    /// Sets the protocol of the link to neighbouring site `site` (Hop by
    /// default). A link already running starts afresh with it.
    pub fn set_link_kind(&mut self, site: SiteId, kind: LinkKind) {
        if kind == LinkKind::Hop {
            self.link_kinds.remove(&site);
        } else {
            self.link_kinds.insert(site, kind);
        }
        if let Some(peer) = self.links.get(&site).map(|l| l.peer) {
            self.new_link(site, peer);
        }
    }

    /// Sets the rate (bit/s) of the leaky bucket of the Hop link to
    /// neighbouring site `site` (P-Spread §3.2: set per link, for
    /// instance an even share of the site's uplink among its links);
    /// `None` goes back to `config.hop.rate_bps`. A link already running
    /// starts afresh with it. Refused (nothing changed) when 0.
    pub fn set_link_hop_rate(
        &mut self,
        site: SiteId,
        rate_bps: Option<u64>,
    ) -> Result<(), SitesError> {
        match rate_bps {
            Some(rate_bps) => {
                self.link_hop_config_with(rate_bps).validate()?;
                self.hop_rates.insert(site, rate_bps);
            }
            None => {
                self.hop_rates.remove(&site);
            }
        }
        if let Some(peer) = self.links.get(&site).map(|l| l.peer) {
            self.new_link(site, peer);
        }
        Ok(())
    }

    fn link_hop_config_with(&self, rate_bps: u64) -> hop::Config {
        hop::Config {
            rate_bps,
            ..self.config.hop.clone()
        }
    }

    /// The rate (bit/s) of the leaky bucket of the Hop link to
    /// neighbouring site `site`.
    pub fn link_hop_rate(&self, site: SiteId) -> u64 {
        self.link_hop_config(site).rate_bps
    }

    /// The Hop settings of the link to neighbouring site `site`.
    fn link_hop_config(&self, site: SiteId) -> hop::Config {
        match self.hop_rates.get(&site) {
            Some(&rate_bps) => self.link_hop_config_with(rate_bps),
            None => self.config.hop.clone(),
        }
    }

    /// The protocol of the link to neighbouring site `site`.
    pub fn link_kind(&self, site: SiteId) -> LinkKind {
        self.link_kinds.get(&site).copied().unwrap_or_default()
    }

    /// The counters of this gateway's links now, summed (links reset
    /// by a gateway or configuration change start again from zero);
    /// TCP-model links add only their retransmissions.
    pub fn hop_stats(&self) -> hop::Stats {
        let mut t = hop::Stats::default();
        for l in self.links.values() {
            let s = l.end.stats();
            t.data_sent += s.data_sent;
            t.retransmissions += s.retransmissions;
            t.data_received += s.data_received;
            t.duplicates += s.duplicates;
            t.recovered += s.recovered;
            t.nacks_sent += s.nacks_sent;
            t.nacks_received += s.nacks_received;
            t.acks_sent += s.acks_sent;
            t.bad_datagrams += s.bad_datagrams;
        }
        t
    }

    /// The Ring engine's counters.
    pub fn ring_stats(&self) -> ring::Stats {
        self.ring.stats()
    }

    /// A client connects to this daemon.
    pub fn connect(&mut self, client: &str) {
        self.local.insert(client.to_string());
    }

    /// A client disconnects: it leaves its groups.
    pub fn disconnect(&mut self, now: Instant, client: &str) {
        self.now = self.now.max(now);
        let joined: Vec<String> = self
            .groups
            .iter()
            .filter(|(_, m)| m.contains(client))
            .map(|(g, _)| g.clone())
            .collect();
        for g in joined {
            let _ = self.leave(now, client, &g);
        }
        self.local.remove(client);
    }

    /// `client` joins `group`: one element in the total order.
    pub fn join(&mut self, now: Instant, client: &str, group: &str) -> Result<(), ClientError> {
        let body = Body::Join {
            client: client.to_string(),
            group: group.to_string(),
        };
        self.request(now, client, body, false)
    }

    /// `client` leaves `group`.
    pub fn leave(&mut self, now: Instant, client: &str, group: &str) -> Result<(), ClientError> {
        let body = Body::Leave {
            client: client.to_string(),
            group: group.to_string(),
        };
        self.request(now, client, body, false)
    }

    /// `client` multicasts `payload` to `groups` with `service`.
    pub fn send(
        &mut self,
        now: Instant,
        client: &str,
        service: Service,
        groups: &[String],
        payload: Bytes,
    ) -> Result<(), ClientError> {
        if payload.len() > self.config.max_payload {
            return Err(ClientError::TooLarge {
                len: payload.len(),
                max: self.config.max_payload,
            });
        }
        let names = client.len() + groups.iter().map(|g| g.len() + 4).sum::<usize>();
        if names > ELEMENT_ALLOWANCE / 2 {
            return Err(ClientError::NamesTooLong {
                len: names,
                max: ELEMENT_ALLOWANCE / 2,
            });
        }
        let body = Body::Data {
            client: client.to_string(),
            service,
            groups: groups.to_vec(),
            payload,
        };
        self.request(now, client, body, true)
    }

    fn request(
        &mut self,
        now: Instant,
        client: &str,
        body: Body,
        data: bool,
    ) -> Result<(), ClientError> {
        self.now = self.now.max(now);
        if !self.local.contains(client) {
            return Err(ClientError::UnknownClient);
        }
        if self.queue.len() >= self.config.send_queue_max {
            return Err(ClientError::QueueFull);
        }
        self.queue.push_back(Request { body, data });
        self.pump();
        Ok(())
    }

    /// The driver's new configuration of sites: `sites` (this daemon's
    /// among them), with an `epoch` above every earlier one and unique to
    /// this configuration. Only the gateway acts on it: it resets its
    /// links and closes its site's stream with a flush.
    pub fn handle_site_view(&mut self, now: Instant, epoch: u32, sites: &[SiteId]) {
        self.now = self.now.max(now);
        self.hand_over(epoch, sites, None);
        self.pump();
    }

    /// The gateway starts a change of configuration: links reset for the
    /// new one, and a flush in the site's stream. `decided`: the site
    /// membership's commit (`Body::Flush`).
    fn hand_over(&mut self, epoch: u32, sites: &[SiteId], decided: Option<(u32, Vec<SiteId>)>) {
        if !self.gateway || epoch <= self.link_epoch {
            return;
        }
        let mut sites = sites.to_vec();
        sites.sort_unstable();
        sites.dedup();
        self.link_epoch = epoch;
        self.view_sites = sites.clone();
        self.routes = routes_for(&self.topo, &sites);
        self.links.clear();
        self.sent_upto.clear();
        self.custody.clear();
        // Elements held for a gap were received on the old links; what
        // the site will hold is what it holds now plus what is resent.
        self.inject_early.clear();
        self.open_links();
        let flush = Body::Flush {
            new_epoch: epoch,
            sites,
            holds: Vec::new(),
            decided,
        };
        self.flush_unsent = None;
        if !self.ring_send(RingMsg::Own(flush.clone()), ring::Service::Agreed) {
            // The ring's queue is full: sent as soon as it has room.
            self.flush_unsent = Some(flush);
        }
    }

    /// A datagram from the site's LAN (the Ring's).
    pub fn handle_lan(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        self.now = self.now.max(now);
        self.ring.handle_datagram(now, from, datagram);
        self.pump();
    }

    /// A datagram from another site.
    pub fn handle_wan(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        self.now = self.now.max(now);
        let Ok((kind, epoch, site, rest)) = codec::parse_wan(datagram) else {
            self.stats.bad_datagrams += 1;
            return;
        };
        if kind == codec::WAN_ALIVE {
            self.on_alive(from, site, rest);
            self.pump();
            return;
        }
        if !self.gateway || epoch != self.link_epoch || !self.view_sites.contains(&site) {
            return;
        }
        if self.topo.site_of(from) != Some(site) {
            self.stats.bad_datagrams += 1;
            return;
        }
        self.peer_seen(site, from);
        if kind == codec::WAN_HOP {
            if let Some(l) = self.links.get_mut(&site) {
                l.end.protocol().handle_datagram(now, rest);
            }
        } else if kind == codec::WAN_STATUS {
            match WanMsg::decode(rest) {
                Ok(WanMsg::Status { dest, .. }) if dest == self.site.0 => {
                    self.on_wan_msg(Bytes::copy_from_slice(rest))
                }
                _ => self.stats.bad_datagrams += 1,
            }
        }
        self.pump();
    }

    /// `poll_timeout`'s deadline passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.now = self.now.max(now);
        self.ring.handle_timeout(now);
        for l in self.links.values_mut() {
            l.end.protocol().handle_timeout(now);
        }
        if self.gateway && self.now >= self.beacon_at {
            self.send_beacons();
        }
        self.run_membership();
        if self.now >= self.status_at {
            if self.gateway {
                self.send_status();
            } else {
                self.status_at = self.now + self.config.status_interval;
            }
            // Every daemon forgets what every site holds: a daemon that
            // is not the gateway would otherwise keep every element.
            self.gc();
        }
        self.pump();
    }

    /// The next datagram to send.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Out> {
        self.out.pop_front()
    }

    /// The next event for a local client.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When `handle_timeout` should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.ring.poll_timeout();
        for l in self.links.values() {
            t = min_opt(t, l.end.poll_timeout());
        }
        if let Some(m) = self.membership.as_ref().filter(|_| self.gateway) {
            t = min_opt(t, Some(m.next_beat));
        }
        if self.gateway {
            t = min_opt(t, Some(self.beacon_at));
            if self.marker_wanted() && self.marker_not_before > self.now {
                t = min_opt(t, Some(self.marker_not_before));
            }
        }
        min_opt(t, Some(self.status_at))
    }

    // ---- plumbing -------------------------------------------------------

    /// Runs every engine's outputs through this daemon until none is left.
    fn pump(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(ev) = self.ring.poll_event() {
                progressed = true;
                self.on_ring_event(ev);
            }
            self.flush_round_out();
            self.release_requests();
            if self.gateway {
                let room = self.ring.queued() < self.config.ring.send_queue_max;
                if let Some(f) = self.flush_unsent.clone().filter(|_| room) {
                    if self.ring_send(RingMsg::Own(f), ring::Service::Agreed) {
                        self.flush_unsent = None;
                    }
                }
                if self.inject_stalled {
                    self.retry_inject();
                }
                progressed |= self.pump_links();
                self.maybe_marker();
            }
            while let Some(t) = self.ring.poll_transmit(self.now) {
                progressed = true;
                self.out.push_back(Out {
                    target: Target::Lan(t.destination),
                    payload: t.payload,
                });
            }
            if !progressed {
                break;
            }
        }
    }

    fn pump_links(&mut self) -> bool {
        let mut progressed = false;
        let sites: Vec<SiteId> = self.links.keys().copied().collect();
        for site in sites {
            while let Some(ev) = self
                .links
                .get_mut(&site)
                .and_then(|l| l.end.protocol().poll_event())
            {
                progressed = true;
                if let hop::Event::Deliver { payload, .. } = ev {
                    self.on_wan_msg(payload);
                }
            }
            let Some(l) = self.links.get_mut(&site) else {
                continue;
            };
            let header = codec::wan_header(codec::WAN_HOP, self.link_epoch, self.site);
            while let Some(d) = l.end.protocol().poll_transmit(self.now) {
                progressed = true;
                let mut buf = header.clone();
                buf.extend_from_slice(&d);
                self.out.push_back(Out {
                    target: Target::Wan(l.peer),
                    payload: Bytes::from(buf),
                });
            }
        }
        progressed
    }

    /// Queues `msg` in the ring, in parts if it is longer than a ring
    /// message, all or nothing; false if the ring's queue had no room.
    /// Own requests wait for room (`release_requests`); a foreign element
    /// refused is injected again later (`inject`).
    fn ring_send(&mut self, msg: RingMsg, service: ring::Service) -> bool {
        self.ring_send_bytes(msg.encode(), service)
    }

    fn ring_send_bytes(&mut self, bytes: Bytes, service: ring::Service) -> bool {
        if bytes.len() <= ring_single_max(&self.config) {
            let sent = self
                .ring
                .multicast_service(self.now, service, bytes)
                .is_ok();
            self.stats.ring_refused += u64::from(!sent);
            return sent;
        }
        let share = self.ring_share();
        let count = part_count(bytes.len(), share);
        if !self.ring_has_room(bytes.len()) {
            self.stats.ring_refused += 1;
            return false;
        }
        self.stats.sent_in_parts += 1;
        for index in 0..count {
            let from = index * share;
            let part = RingMsg::Part {
                index: index as u32,
                count: count as u32,
                bytes: bytes.slice(from..(from + share).min(bytes.len())),
            };
            let queued = self
                .ring
                .multicast_service(self.now, service, part.encode());
            debug_assert!(queued.is_ok(), "room was checked");
        }
        true
    }

    /// A ring message's share of a part.
    fn ring_share(&self) -> usize {
        ring_single_max(&self.config) - RING_PART_HEADER
    }

    /// Whether the ring's queue takes a message of `len` bytes.
    fn ring_has_room(&self, len: usize) -> bool {
        let count = if len <= ring_single_max(&self.config) {
            1
        } else {
            part_count(len, self.ring_share())
        };
        self.ring.queued() + count <= self.config.ring.send_queue_max
    }

    /// Hands waiting client requests to the ring while the window allows.
    fn release_requests(&mut self) {
        while let Some(r) = self.queue.front() {
            if self.own_closed || self.pending.is_some() || !self.conf.installed || !self.is_live()
            {
                return;
            }
            if r.data && self.outstanding() >= self.config.global_window {
                self.stats.window_waits += 1;
                return;
            }
            let r = self.queue.pop_front().expect("front exists");
            let msg = RingMsg::Own(r.body);
            let bytes = msg.encode();
            if !self.ring_has_room(bytes.len()) {
                let RingMsg::Own(body) = msg else {
                    unreachable!("built above")
                };
                self.queue.push_front(Request { body, data: r.data });
                return;
            }
            if r.data {
                self.in_ring += 1;
            }
            self.ring_send_bytes(bytes, ring::Service::Agreed);
        }
    }

    // ---- the ring's order -> the site stream ----------------------------

    fn on_ring_event(&mut self, ev: ring::Event) {
        match ev {
            ring::Event::Deliver {
                sender, payload, ..
            } => {
                if self.round.is_some() {
                    self.round_delivery(sender, payload);
                } else {
                    self.apply(sender, &payload);
                }
            }
            ring::Event::Regular { ring_id, members } => self.start_round(ring_id, members),
            ring::Event::Transitional { .. } => {}
        }
        self.progress();
    }

    /// A ring message in this daemon's site state.
    fn apply(&mut self, sender: NodeId, payload: &[u8]) {
        if self.standing == Standing::Fresh {
            return;
        }
        // Decoded once; a part is put together first, and the whole
        // decoded then.
        let msg = match RingMsg::decode(payload) {
            Ok(RingMsg::Part {
                index,
                count,
                bytes,
            }) => {
                let max = self.config.max_payload + ELEMENT_ALLOWANCE;
                match self.ring_parts.push(sender, index, count, &bytes, max) {
                    Ok(Some(whole)) => RingMsg::decode(&whole),
                    Ok(None) => return,
                    Err(_) => {
                        self.stats.parts_refused += 1;
                        return;
                    }
                }
            }
            other => other,
        };
        match msg {
            Ok(RingMsg::Own(body)) => {
                if sender == self.me && matches!(body, Body::Data { .. }) {
                    self.in_ring = self.in_ring.saturating_sub(1);
                }
                self.ingest_own(sender, body)
            }
            Ok(RingMsg::Foreign(bytes)) => match Element::decode(&bytes) {
                Ok(e) => self.ingest_foreign(e),
                Err(_) => self.stats.bad_datagrams += 1,
            },
            // A round's, sent for a ring that ended before it went out.
            Ok(RingMsg::Hello { .. } | RingMsg::Snapshot { .. }) => {}
            // Parts are never nested.
            Ok(RingMsg::Part { .. }) => self.stats.bad_datagrams += 1,
            Err(_) => self.stats.bad_datagrams += 1,
        }
    }

    fn become_gateway(&mut self) {
        self.stats.gateway_takeovers += 1;
        if self.config.membership.enabled {
            self.membership = Some(SiteMembership::new(
                self.config.membership.clone(),
                self.site,
                self.me,
                self.now,
            ));
        }
        self.marker_in_flight = false;
        self.link_epoch = self.link_epoch.max(self.conf.epoch);
        if let Some(p) = &self.pending {
            self.link_epoch = self.link_epoch.max(p.epoch);
            self.view_sites = p.sites.clone();
        } else {
            self.view_sites = self.conf.sites.clone();
        }
        self.routes = routes_for(&self.topo, &self.view_sites);
        self.inject_next.clear();
        self.inject_early.clear();
        self.wan_parts.clear();
        for conf in [Some(&self.conf), self.prev.as_ref()].into_iter().flatten() {
            for (i, s) in conf.sites.iter().enumerate() {
                self.inject_next
                    .insert((conf.epoch, *s), conf.streams[i].next);
            }
        }
        self.open_links();
        // The site's state for the change under way went out through the
        // old gateway's links, which are gone: again through these.
        self.state_asked = None;
        if let Some(e) = self.pending.as_ref().and_then(|p| p.state.clone()) {
            let bytes = e.encode();
            self.forward(&e, &bytes, TREE);
        }
    }

    /// An element of this site, in ring order: number and stamp it.
    fn ingest_own(&mut self, sender: NodeId, body: Body) {
        if self.own_closed {
            match body {
                Body::State { members } => {
                    self.ingest_state(sender, members);
                    return;
                }
                Body::Marker { .. } => {
                    // Ordered after the flush: it announces nothing.
                    self.marker_in_flight = false;
                    return;
                }
                Body::Flush {
                    decided: Some((from, _)),
                    new_epoch,
                    ..
                } if from == self.conf.epoch
                    && self.pending.as_ref().is_some_and(|p| new_epoch > p.epoch) =>
                {
                    // The site membership committed a newer configuration
                    // while this site was closing its stream for an
                    // earlier one that has not completed: the stream is
                    // closed again, for the newer one (below).
                }
                Body::Flush {
                    decided: Some(_), ..
                } => {
                    // A commit about a configuration this site is no
                    // longer in: the membership commits again.
                    self.stats.stale_commits += 1;
                    return;
                }
                Body::Flush {
                    new_epoch, sites, ..
                } => {
                    // A newer configuration came while this site was still
                    // closing its stream for the last: its flush waits
                    // until the stream reopens in that one (the same at
                    // every daemon of the site: ring order).
                    if self.pending.as_ref().is_none_or(|p| new_epoch > p.epoch)
                        && self.deferred.as_ref().is_none_or(|d| new_epoch > d.epoch)
                    {
                        self.deferred = Some(Pending {
                            epoch: new_epoch,
                            sites,
                            staying: Vec::new(),
                            decided: false,
                            state: None,
                        });
                    }
                    return;
                }
                other => {
                    self.held_own.push((sender, other));
                    return;
                }
            }
        } else if matches!(body, Body::State { .. }) {
            return;
        } else if let Body::Flush {
            decided: Some((from, _)),
            ..
        } = &body
        {
            if *from != self.conf.epoch {
                self.stats.stale_commits += 1;
                return;
            }
        }
        let i = self
            .conf
            .index(self.site)
            .expect("own site in its configuration");
        let mut body = body;
        match &mut body {
            Body::Marker { holds } | Body::Flush { holds, .. } => *holds = self.conf.holds(),
            _ => {}
        }
        // Saturating: a forged timestamp near the top must not panic.
        self.clock = self.clock.saturating_add(1);
        let e = Element {
            origin: self.site,
            epoch: self.conf.epoch,
            seq: self.conf.streams[i].next,
            ts: self.clock,
            sender,
            body,
        };
        if sender == self.me && matches!(e.body, Body::Data { .. }) {
            self.mine_unstable.push_back(e.seq);
        }
        if let Body::Flush {
            new_epoch,
            sites,
            decided,
            ..
        } = &e.body
        {
            self.own_closed = true;
            if self.pending.is_some() {
                self.stats.superseded += 1;
            }
            let staying = match decided {
                Some((_, staying)) => staying.clone(),
                None => sites
                    .iter()
                    .filter(|s| self.conf.index(**s).is_some())
                    .copied()
                    .collect(),
            };
            self.pending = Some(Pending {
                epoch: *new_epoch,
                sites: sites.clone(),
                staying,
                decided: decided.is_some(),
                state: None,
            });
        }
        if let Body::Marker { .. } = e.body {
            self.marker_in_flight = false;
            self.data_since_marker = false;
            self.data_count = 0;
        }
        let bytes = e.encode();
        if self.gateway {
            self.forward(&e, &bytes, TREE);
        }
        self.store.insert((e.epoch, e.origin, e.seq), bytes);
        self.accept(e);
    }

    /// This site's state for the change it is closing its stream for, in
    /// ring order: the first element of its stream in the new
    /// configuration, if the site now holds everything the change needs
    /// (decided here, at every daemon of the site alike); sent on at
    /// once. Otherwise (too early, or the change was superseded since the
    /// gateway asked) dropped: the gateway asks again.
    fn ingest_state(&mut self, sender: NodeId, members: Vec<(String, String, NodeId)>) {
        let Some(p) = self.pending.clone() else {
            return;
        };
        if p.state.is_some() || self.has_all(&p).is_none() {
            return;
        }
        self.clock = self.clock.saturating_add(1);
        let e = Element {
            origin: self.site,
            epoch: p.epoch,
            seq: 1,
            ts: self.clock,
            sender,
            body: Body::State { members },
        };
        let bytes = e.encode();
        if self.gateway {
            self.forward(&e, &bytes, TREE);
        }
        self.store.insert((e.epoch, e.origin, e.seq), bytes);
        if let Some(p) = self.pending.as_mut() {
            p.state = Some(e);
        }
    }

    /// The stream reopened in a configuration: a newer one handed over
    /// meanwhile is flushed for now (by the gateway; every daemon forgets
    /// it once that flush is in the stream).
    fn flush_deferred(&mut self) {
        let Some(d) = self.deferred.take() else {
            return;
        };
        if d.epoch <= self.conf.epoch {
            return;
        }
        if self.gateway {
            let flush = Body::Flush {
                new_epoch: d.epoch,
                sites: d.sites,
                holds: Vec::new(),
                decided: None,
            };
            self.ring_send(RingMsg::Own(flush), ring::Service::Agreed);
        }
    }

    fn ingest_foreign(&mut self, e: Element) {
        self.clock = self.clock.max(e.ts);
        if e.epoch == self.conf.epoch {
            self.insert(e);
        } else if e.epoch > self.conf.epoch {
            self.future.entry(e.epoch).or_default().push(e);
        }
    }

    /// Files a foreign element of the installed configuration in its
    /// stream, in sequence.
    fn insert(&mut self, e: Element) {
        let Some(i) = self.conf.index(e.origin) else {
            return;
        };
        if e.origin == self.site || e.seq < self.conf.streams[i].next {
            return;
        }
        self.conf.streams[i].early.insert(e.seq, e);
        self.take_in_order(i);
    }

    /// Takes in the elements of stream `i` that are next in sequence, as
    /// far as [`Self::acceptance_cap`] allows.
    fn take_in_order(&mut self, i: usize) {
        // Called for every stream at every step: the cap (a pass over the
        // streams) only when the next element is waiting.
        let s = &self.conf.streams[i];
        if s.early
            .first_key_value()
            .is_none_or(|(seq, _)| *seq != s.next)
        {
            return;
        }
        let cap = self.acceptance_cap(i);
        loop {
            let s = &mut self.conf.streams[i];
            if s.next > cap {
                break;
            }
            let Some(e) = s.early.remove(&s.next) else {
                break;
            };
            let bytes = e.encode();
            self.store.insert((e.epoch, e.origin, e.seq), bytes);
            self.accept(e);
        }
    }

    /// How far this daemon may take in the stream of site `i` of its
    /// configuration. Once its own site has flushed for a change, a
    /// departed site's elements count only as far as some staying site's
    /// flush shows it held them: only those are in every staying site's
    /// old configuration (`check_transition` waits for them, and
    /// truncates the rest). An element beyond, taken in here, would let
    /// this site deliver in the regular configuration what another
    /// staying site, which never had it, delivers in the transitional one
    /// (a merge right after a split, `large_message_sweep` seeds 386 and
    /// 914). It waits in `early` until a flush covers it or the
    /// configuration ends. Before its own flush, whatever a site takes
    /// in is below that flush's holds.
    fn acceptance_cap(&self, i: usize) -> u64 {
        let Some(p) = &self.pending else {
            return u64::MAX;
        };
        let conf = &self.conf;
        if p.stays(&conf.sites[i]) {
            return u64::MAX;
        }
        conf.sites
            .iter()
            .zip(&conf.streams)
            .filter_map(|(site, s)| match &s.flush {
                Some((epoch, _, holds))
                    if *epoch == p.epoch && p.stays(site) && holds.len() == conf.sites.len() =>
                {
                    Some(holds[i])
                }
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// The next element of its site's stream.
    fn accept(&mut self, e: Element) {
        let i = self
            .conf
            .index(e.origin)
            .expect("site of the configuration");
        let s = &mut self.conf.streams[i];
        s.next = e.seq + 1;
        s.last_ts = s.last_ts.max(e.ts);
        match &e.body {
            Body::Marker { holds } => {
                if holds.len() == s.announced.len() {
                    s.announced = holds.clone();
                }
            }
            Body::Flush {
                new_epoch,
                sites,
                holds,
                ..
            } => s.flush = Some((*new_epoch, sites.clone(), holds.clone())),
            Body::State { members } => s.state = Some(members.clone()),
            Body::Data {
                service: Service::Unreliable,
                ..
            } => {
                self.data_since_marker = true;
                self.data_count += 1;
                if self.conf.installed {
                    self.deliver(&e, false);
                }
            }
            _ => {
                self.data_since_marker = true;
                self.data_count += 1;
                s.ordered.push_back(e);
            }
        }
    }

    // ---- delivery -------------------------------------------------------

    /// Whatever the ingestion made possible: ordered deliveries, the end
    /// of a configuration, the start of the next.
    fn progress(&mut self) {
        // A staying site's flush may have raised what departed sites'
        // streams may take in.
        for i in 0..self.conf.streams.len() {
            self.take_in_order(i);
        }
        // Installed first: a configuration must not end with what it
        // could deliver in its regular views delivered in the
        // transitional one because its last site state came in the same
        // step as the flush that ends it.
        self.check_install();
        self.deliver_ordered();
        self.check_transition();
        self.check_install();
        self.drop_stable_mine();
    }

    /// The head of the total order, if it may be delivered now in the
    /// regular configuration.
    fn next_ordered(&self) -> Option<usize> {
        let conf = &self.conf;
        let (i, e) = conf
            .streams
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.ordered.front().map(|e| (i, e)))
            .min_by_key(|(_, e)| e.key())?;
        let heard = conf
            .streams
            .iter()
            .all(|s| !s.ordered.is_empty() || s.flush.is_some() || s.last_ts >= e.ts);
        if !heard {
            return None;
        }
        if let Body::Data {
            service: Service::Safe,
            ..
        } = e.body
        {
            if !conf.stable(i, e.seq) {
                return None;
            }
        }
        Some(i)
    }

    fn deliver_ordered(&mut self) {
        if !self.conf.installed {
            return;
        }
        while let Some(i) = self.next_ordered() {
            let e = self.conf.streams[i].ordered.pop_front().expect("head");
            self.deliver(&e, false);
        }
    }

    fn deliver(&mut self, e: &Element, transitional: bool) {
        match &e.body {
            Body::Data {
                client,
                service,
                groups,
                payload,
            } => {
                let mut to = BTreeSet::new();
                for g in groups {
                    if let Some(m) = self.groups.get(g) {
                        to.extend(m.iter().filter(|c| self.local.contains(*c)).cloned());
                    } else if g.starts_with('#') && self.local.contains(g) {
                        // A private group: the client it names.
                        to.insert(g.clone());
                    }
                }
                for c in to {
                    self.events.push_back(Event::Deliver {
                        client: c,
                        sender: client.clone(),
                        service: *service,
                        groups: groups.clone(),
                        payload: payload.clone(),
                        transitional,
                    });
                }
            }
            Body::Join { client, group } => {
                self.client_daemon.insert(client.clone(), e.sender);
                let m = self.groups.entry(group.clone()).or_default();
                if m.insert(client.clone()) && !transitional {
                    self.emit_view(group, ViewReason::Join);
                }
            }
            Body::Leave { client, group } => {
                let m = self.groups.entry(group.clone()).or_default();
                if m.remove(client) && !transitional {
                    let id = self.emit_view(group, ViewReason::Leave);
                    // The leaver hears the view the others get, then no
                    // more of the group (a disconnected client is gone
                    // from `local` already).
                    if self.local.contains(client) {
                        self.events.push_back(Event::View {
                            client: client.clone(),
                            group: group.clone(),
                            view_id: id,
                            members: self.groups[group].iter().cloned().collect(),
                            transitional: false,
                            reason: ViewReason::Leave,
                        });
                    }
                }
            }
            Body::Gone { node } => {
                let gone: BTreeSet<String> = self
                    .client_daemon
                    .iter()
                    .filter(|(_, d)| *d == node)
                    .map(|(c, _)| c.clone())
                    .collect();
                let changed: Vec<String> = self
                    .groups
                    .iter_mut()
                    .filter_map(|(g, m)| {
                        let before = m.len();
                        m.retain(|c| !gone.contains(c));
                        (m.len() != before).then(|| g.clone())
                    })
                    .collect();
                if !transitional {
                    for g in changed {
                        self.emit_view(&g, ViewReason::Network);
                    }
                }
            }
            _ => {}
        }
    }

    /// A new regular view of `group` (a join, leave or departure) for its
    /// local members.
    /// Returns the view's id.
    fn emit_view(&mut self, group: &str, reason: ViewReason) -> u64 {
        let n = self
            .view_counter
            .entry(group.to_string())
            .or_insert(REGULAR);
        *n += 1;
        let id = view_id(self.conf.epoch, *n);
        self.views_to_locals(group, id, false, None, reason);
        id
    }

    fn views_to_locals(
        &mut self,
        group: &str,
        id: u64,
        transitional: bool,
        members: Option<Vec<String>>,
        reason: ViewReason,
    ) {
        let members =
            members.unwrap_or_else(|| self.groups[group].iter().cloned().collect::<Vec<_>>());
        for c in members.iter().filter(|c| self.local.contains(*c)) {
            self.events.push_back(Event::View {
                client: c.clone(),
                group: group.to_string(),
                view_id: id,
                members: members.clone(),
                transitional,
                reason,
            });
        }
    }

    fn drop_stable_mine(&mut self) {
        let Some(i) = self.conf.index(self.site) else {
            return;
        };
        while let Some(&seq) = self.mine_unstable.front() {
            if !self.conf.stable(i, seq) {
                break;
            }
            self.mine_unstable.pop_front();
        }
    }

    // ---- configuration changes -----------------------------------------

    /// The old configuration ends here once every staying site's flush is
    /// in and, of every departed site, all that any staying site held.
    ///
    /// Two phases. First every staying site's flush and, of every site
    /// that left, all that any staying site held ([`Self::has_all`]): the
    /// site then puts its state in the new configuration's stream (the
    /// gateway asks; `ingest_state`). Then every site's state of the new
    /// configuration: each of them holds everything its own change
    /// needs, so whatever this site delivers at the change, each of them
    /// delivers too, even if it never completes this change (a newer one
    /// supersedes it there, `membership.rs`); and the new configuration's
    /// regular views are given at once, never left waiting for a site
    /// that went elsewhere.
    fn check_transition(&mut self) {
        let Some(p) = self.pending.clone() else {
            return;
        };
        let Some(max_hold) = self.has_all(&p) else {
            return;
        };
        if p.state.is_none() {
            if self.gateway && self.state_asked != Some(p.epoch) && self.send_state() {
                self.state_asked = Some(p.epoch);
            }
            return;
        }
        if p.sites.iter().all(|s| self.has_state_of(&p, *s)) {
            self.complete_transition(&p, &max_hold);
        }
    }

    /// Whether site `site`'s state for change `p` is in here (its first
    /// element of the new configuration; this site's own once made).
    fn has_state_of(&self, p: &Pending, site: SiteId) -> bool {
        if site == self.site {
            return p.state.is_some();
        }
        self.future.get(&p.epoch).is_some_and(|v| {
            v.iter()
                .any(|e| e.origin == site && matches!(e.body, Body::State { .. }))
        })
    }

    /// Whether this site holds everything change `p` needs: every staying
    /// site's flush for it and, of every site that left, all that any of
    /// them held. Returns those counts.
    fn has_all(&self, p: &Pending) -> Option<Vec<u64>> {
        let mut max_hold = vec![0u64; self.conf.sites.len()];
        for (i, site) in self.conf.sites.iter().enumerate() {
            if !p.stays(site) {
                continue;
            }
            match &self.conf.streams[i].flush {
                Some((e, _, holds)) if *e == p.epoch && holds.len() == max_hold.len() => {
                    for (m, h) in max_hold.iter_mut().zip(holds) {
                        *m = (*m).max(*h);
                    }
                }
                _ => return None,
            }
        }
        for (i, site) in self.conf.sites.iter().enumerate() {
            if !p.stays(site) && self.conf.streams[i].next - 1 < max_hold[i] {
                return None;
            }
        }
        Some(max_hold)
    }

    fn complete_transition(&mut self, p: &Pending, max_hold: &[u64]) {
        self.stats.configurations += 1;
        // What the old regular configuration allows was delivered as it
        // became possible; the rest goes in the transitional one.
        let staying: Vec<SiteId> = self
            .conf
            .sites
            .iter()
            .filter(|s| p.stays(s))
            .copied()
            .collect();
        let tid = view_id(p.epoch, u64::from(self.conf.epoch));
        // The transitional configuration is what the old and the new
        // regular ones share (EVS): the clients of the staying sites that
        // are still members once the old configuration has delivered
        // everything (each staying site's state for the new one says so;
        // a client whose leave, or whose daemon's departure, is delivered
        // in the transitional configuration is not in it).
        let next = self.states_of(p);
        let groups: Vec<String> = self.groups.keys().cloned().collect();
        for g in &groups {
            let members: Vec<String> = self.groups[g]
                .iter()
                .filter(|c| self.client_site(c).is_some_and(|s| staying.contains(&s)))
                .filter(|c| next.contains(&(g.clone(), (*c).clone())))
                .cloned()
                .collect();
            self.views_to_locals(g, tid, true, Some(members), ViewReason::Network);
        }
        let mut rest = Vec::new();
        for (i, s) in self.conf.streams.iter_mut().enumerate() {
            for e in s.ordered.drain(..) {
                if e.seq <= max_hold[i] || p.stays(&e.origin) {
                    rest.push(e);
                } else {
                    self.stats.truncated += 1;
                }
            }
        }
        rest.sort_by_key(Element::key);
        for e in &rest {
            self.deliver(e, true);
        }
        self.switch_to(p);
    }

    /// Every (group, client) the sites' states for change `p` list (all
    /// are in when it completes).
    fn states_of(&self, p: &Pending) -> BTreeSet<(String, String)> {
        let theirs = self.future.get(&p.epoch).into_iter().flatten();
        theirs
            .chain(p.state.as_ref())
            .filter_map(|e| match &e.body {
                Body::State { members } => Some(members),
                _ => None,
            })
            .flatten()
            .map(|(g, c, _)| (g.clone(), c.clone()))
            .collect()
    }

    fn switch_to(&mut self, p: &Pending) {
        let old = std::mem::replace(&mut self.conf, Conf::new(p.epoch, &p.sites, false));
        self.store
            .retain(|(e, _, _), _| *e == old.epoch || *e >= p.epoch);
        self.last_status
            .retain(|(_, e), _| *e == old.epoch || *e >= p.epoch);
        self.wan_parts.forget_before(old.epoch);
        self.prev = Some(old);
        self.pending = None;
        self.mine_unstable.clear();
        self.view_counter.clear();
        self.data_since_marker = false;
        self.data_count = 0;
        self.future.retain(|e, _| *e >= p.epoch);
        if let Some(early) = self.future.remove(&p.epoch) {
            for e in early {
                self.insert(e);
            }
        }
        if self.gateway {
            for s in &p.sites {
                self.inject_next.entry((p.epoch, *s)).or_insert(1);
            }
        }
        // The stream reopens, with this site's state as its first element.
        if let Some(e) = p.state.clone() {
            self.accept(e);
        }
        self.own_closed = false;
        self.flush_deferred();
        for (sender, body) in std::mem::take(&mut self.held_own) {
            self.ingest_own(sender, body);
        }
    }

    fn client_site(&self, client: &str) -> Option<SiteId> {
        self.client_daemon
            .get(client)
            .and_then(|d| self.topo.site_of(*d))
    }

    /// The gateway asks its ring to open the site's stream in the new
    /// configuration with its daemons' members of every group
    /// (`ingest_state`). False if the ring's queue had no room (asked
    /// again at the next step).
    fn send_state(&mut self) -> bool {
        let members = self.own_final_members();
        self.ring_send(RingMsg::Own(Body::State { members }), ring::Service::Agreed)
    }

    /// This site's clients in each group once the closing configuration
    /// has delivered all of this site's elements: what is delivered, and
    /// the joins, leaves and departures of the site's own stream still
    /// waiting (every one of them is delivered at the change, in the
    /// regular or the transitional configuration, and a closed stream
    /// takes no more). The same whenever it is computed after the flush.
    fn own_final_members(&self) -> Vec<(String, String, NodeId)> {
        let mut daemon_of = self.client_daemon.clone();
        let mut members: BTreeSet<(String, String)> = BTreeSet::new();
        for (g, m) in &self.groups {
            for c in m {
                members.insert((g.clone(), c.clone()));
            }
        }
        if let Some(i) = self.conf.index(self.site) {
            for e in &self.conf.streams[i].ordered {
                match &e.body {
                    Body::Join { client, group } => {
                        daemon_of.insert(client.clone(), e.sender);
                        members.insert((group.clone(), client.clone()));
                    }
                    Body::Leave { client, group } => {
                        members.remove(&(group.clone(), client.clone()));
                    }
                    Body::Gone { node } => {
                        members.retain(|(_, c)| daemon_of.get(c) != Some(node));
                    }
                    _ => {}
                }
            }
        }
        members
            .into_iter()
            .filter_map(|(g, c)| {
                let d = *daemon_of.get(&c)?;
                (self.topo.site_of(d) == Some(self.site)).then_some((g, c, d))
            })
            .collect()
    }

    /// The new configuration's regular views, once every site's state is in.
    fn check_install(&mut self) {
        if self.conf.installed || self.conf.streams.iter().any(|s| s.state.is_none()) {
            return;
        }
        let mut groups: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for s in &self.conf.streams {
            for (g, c, d) in s.state.as_ref().expect("checked") {
                groups.entry(g.clone()).or_default().insert(c.clone());
                self.client_daemon.insert(c.clone(), *d);
            }
        }
        self.groups = groups;
        self.conf.installed = true;
        let id = view_id(self.conf.epoch, REGULAR);
        let names: Vec<String> = self.groups.keys().cloned().collect();
        for g in names {
            self.views_to_locals(&g, id, false, None, ViewReason::Network);
        }
        self.deliver_ordered();
    }

    // ---- the site membership (gateway) ---------------------------------

    /// Where this site stands, for its `Alive`s.
    fn membership_local(&self) -> membership::Local {
        membership::Local {
            from: self.conf.epoch,
            latest: self.link_epoch.max(self.conf.epoch),
            settled: self.pending.is_none() && !self.own_closed && self.conf.installed,
            conf_sites: self.conf.sites.clone(),
        }
    }

    /// The gateway's membership step: its `Alive` when due, a commit as
    /// leader, and a commit for its site handed over.
    fn run_membership(&mut self) {
        if !self.gateway {
            return;
        }
        let local = self.membership_local();
        let now = self.now;
        let Some(m) = self.membership.as_mut() else {
            return;
        };
        let mut beat = now >= m.next_beat;
        if m.decide(now, &local).is_some() {
            self.stats.commits_made += 1;
            // Out at once: the members act on it from this `Alive`.
            beat = true;
        }
        let alive = beat.then(|| m.beat(now, &local));
        let commit = m.commit_for_me(now, &local);
        if let Some(a) = alive {
            self.flood_alive(&a.encode(), None);
        }
        if let Some(c) = commit {
            self.stats.commits_taken += 1;
            let staying: Vec<SiteId> = c
                .sites
                .iter()
                .filter(|(_, from)| *from == local.from)
                .map(|(s, _)| *s)
                .collect();
            self.hand_over(c.epoch, &c.site_ids(), Some((local.from, staying)));
        }
    }

    /// An `Alive` from `node` of neighbouring site `site` (its gateway,
    /// or one passing another site's on).
    fn on_alive(&mut self, node: NodeId, site: SiteId, bytes: &[u8]) {
        if !self.gateway || self.membership.is_none() {
            return;
        }
        if self.topo.site_of(node) != Some(site) || !self.topo_linked(site) {
            self.stats.bad_datagrams += 1;
            return;
        }
        let Ok(alive) = membership::Alive::decode(bytes) else {
            self.stats.bad_datagrams += 1;
            return;
        };
        let now = self.now;
        let fresh = self
            .membership
            .as_mut()
            .is_some_and(|m| m.on_alive(now, alive));
        if fresh {
            self.flood_alive(bytes, Some(site));
            self.run_membership();
        }
    }

    /// Sends an `Alive` to every neighbouring site but `except`: to its
    /// gateway when known, else to each of its daemons.
    fn flood_alive(&mut self, alive: &[u8], except: Option<SiteId>) {
        let mut buf = codec::wan_header(codec::WAN_ALIVE, 0, self.site);
        buf.extend_from_slice(alive);
        let payload = Bytes::from(buf);
        let now = self.now;
        let neighbours: Vec<SiteId> = (0..self.topo.sites.len() as u16)
            .map(SiteId)
            .filter(|s| *s != self.site && Some(*s) != except && self.topo_linked(*s))
            .collect();
        for s in neighbours {
            let known = self
                .membership
                .as_ref()
                .and_then(|m| m.sender_of(s, now))
                .or_else(|| self.links.get(&s).map(|l| l.peer));
            let targets = match known {
                Some(n) => vec![n],
                None => self.topo.sites[usize::from(s.0)].daemons.clone(),
            };
            for n in targets {
                self.out.push_back(Out {
                    target: Target::Wan(n),
                    payload: payload.clone(),
                });
            }
        }
    }

    // ---- the gateway ----------------------------------------------------

    fn open_links(&mut self) {
        let neighbours: Vec<SiteId> = self
            .view_sites
            .iter()
            .filter(|s| **s != self.site && self.topo_linked(**s))
            .copied()
            .collect();
        for s in neighbours {
            if self.links.contains_key(&s) {
                continue;
            }
            let peer = self.default_gateway(s);
            self.new_link(s, peer);
        }
        self.send_beacons();
    }

    fn topo_linked(&self, other: SiteId) -> bool {
        self.topo.links.iter().any(|l| {
            (l.a == self.site && l.b == other && (l.a_to_b.is_some() || l.b_to_a.is_some()))
                || (l.b == self.site && l.a == other && (l.a_to_b.is_some() || l.b_to_a.is_some()))
        })
    }

    fn default_gateway(&self, site: SiteId) -> NodeId {
        self.topo.sites[usize::from(site.0)]
            .daemons
            .iter()
            .min()
            .copied()
            .unwrap_or(NodeId(0))
    }

    fn new_link(&mut self, site: SiteId, peer: NodeId) {
        let end = match self.link_kind(site) {
            LinkKind::Hop => LinkEnd::Hop(
                Hop::new(self.link_hop_config(site), 0, self.now).expect("validated when set"),
            ),
            LinkKind::Tcp => LinkEnd::Tcp(TcpLink::new(self.config.tcp.clone(), self.now)),
        };
        self.links_made += 1;
        let instance = self.links_made;
        self.links.insert(
            site,
            Link {
                peer,
                end,
                instance,
            },
        );
        self.sent_upto.retain(|(t, _, _), _| *t != site);
        self.custody.retain(|(_, _, s), _| *s != site);
    }

    /// A datagram from `node` of `site`: if it is a new gateway there,
    /// the link starts afresh with it.
    fn peer_seen(&mut self, site: SiteId, node: NodeId) {
        let known = self.links.get(&site).map(|l| l.peer);
        if known != Some(node) && self.topo_linked(site) {
            self.new_link(site, node);
        }
    }

    fn send_beacons(&mut self) {
        self.beacon_at = self.now + self.config.beacon_interval;
        let header = codec::wan_header(codec::WAN_BEACON, self.link_epoch, self.site);
        for l in self.links.values() {
            self.out.push_back(Out {
                target: Target::Wan(l.peer),
                payload: Bytes::from(header.clone()),
            });
        }
    }

    /// Sends `bytes` (element `e`) on: down its origin's tree, or toward
    /// site `dest`.
    fn forward(&mut self, e: &Element, bytes: &Bytes, dest: u16) {
        let key = (e.epoch, e.origin, e.seq);
        let own = e.origin == self.site;
        for next in self.next_sites(e.origin, dest) {
            let ticket = self.link_send_element(next, dest, key, bytes);
            if own {
                self.take_custody(e.epoch, e.seq, next, ticket);
            }
        }
    }

    /// The neighbouring sites an element of `origin` goes to from here:
    /// its tree's children (`dest == TREE`), or the next hop to `dest`.
    fn next_sites(&self, origin: SiteId, dest: u16) -> Vec<SiteId> {
        if dest == TREE {
            self.routes.children(origin, self.site).to_vec()
        } else {
            self.routes
                .next_hop(self.site, SiteId(dest))
                .into_iter()
                .collect()
        }
    }

    /// Sends element `key` (`bytes`) toward `dest` on the link to `site`:
    /// whole if the link's messages hold it, else in parts of a Hop
    /// message each (sized for Hop, the smaller, so that a part fits any
    /// link it is forwarded on). The ticket of its last part, None if the
    /// link refused one (the status exchange resends the element).
    fn link_send_element(
        &mut self,
        site: SiteId,
        dest: u16,
        key: parts::ElementKey,
        bytes: &Bytes,
    ) -> Option<(u64, u64)> {
        let max = self.links.get_mut(&site)?.end.protocol().max_message();
        if bytes.len() + codec::WAN_ELEM_HEADER <= max {
            let msg = WanMsg::Elem {
                dest,
                element: bytes.clone(),
            };
            return self.link_send(site, msg.encode());
        }
        let share = self.config.hop.max_payload() - WAN_PART_HEADER;
        let count = part_count(bytes.len(), share);
        self.stats.sent_in_parts += 1;
        let mut ticket = None;
        for index in 0..count {
            let from = index * share;
            let msg = WanMsg::Part {
                dest,
                origin: key.1,
                epoch: key.0,
                seq: key.2,
                index: index as u32,
                count: count as u32,
                bytes: bytes.slice(from..(from + share).min(bytes.len())),
            };
            ticket = Some(self.link_send(site, msg.encode())?);
        }
        ticket
    }

    /// Sends `msg` on the link to `site`; returns the link instance and
    /// Hop's ticket for it if the link took it.
    fn link_send(&mut self, site: SiteId, msg: Bytes) -> Option<(u64, u64)> {
        let l = self.links.get_mut(&site)?;
        // A full link queue drops; the status exchange resends.
        l.end.protocol().send(self.now, msg).ok()?;
        Some((l.instance, l.end.accepted()))
    }

    /// Notes that the link to `site` carries this site's element `seq`
    /// (or, if it refused it, forgets an earlier note).
    fn take_custody(&mut self, epoch: u32, seq: u64, site: SiteId, ticket: Option<(u64, u64)>) {
        match ticket {
            Some(t) => {
                self.custody.insert((epoch, seq, site), t);
            }
            None => {
                self.custody.remove(&(epoch, seq, site));
            }
        }
    }

    /// Whether this site's element `seq` of `epoch` is still carried by
    /// the live Hop link to `site`: handed to this very link (not one
    /// since started afresh) and not yet acknowledged by its peer.
    fn in_custody(&self, epoch: u32, seq: u64, site: SiteId) -> bool {
        let (Some(&(instance, ticket)), Some(l)) =
            (self.custody.get(&(epoch, seq, site)), self.links.get(&site))
        else {
            return false;
        };
        l.instance == instance && ticket > l.end.acknowledged()
    }

    /// Whether `site` names a site of the topology (WAN messages name
    /// sites; routes exist only for the topology's).
    fn known_site(&self, site: u16) -> bool {
        usize::from(site) < self.topo.sites.len()
    }

    fn on_wan_msg(&mut self, payload: Bytes) {
        match WanMsg::decode(&payload) {
            Ok(WanMsg::Elem { dest, .. }) if dest != TREE && !self.known_site(dest) => {
                self.stats.bad_datagrams += 1;
            }
            Ok(WanMsg::Part { dest, origin, .. })
                if (dest != TREE && !self.known_site(dest)) || !self.known_site(origin.0) =>
            {
                self.stats.bad_datagrams += 1;
            }
            Ok(WanMsg::Part {
                dest,
                origin,
                epoch,
                seq,
                index,
                count,
                bytes,
            }) => self.on_wan_part(payload, dest, (epoch, origin, seq), index, count, bytes),
            Ok(WanMsg::Status { dest, site, .. })
                if !self.known_site(dest) || !self.known_site(site.0) =>
            {
                self.stats.bad_datagrams += 1;
            }
            Ok(WanMsg::Elem { dest, element }) => self.on_wan_elem(dest, element),
            Ok(WanMsg::Status {
                dest,
                site,
                epoch,
                holds,
            }) => {
                if dest == self.site.0 {
                    self.on_status(site, epoch, &holds);
                } else {
                    let msg = WanMsg::Status {
                        dest,
                        site,
                        epoch,
                        holds,
                    };
                    if let Some(next) = self.routes.next_hop(self.site, SiteId(dest)) {
                        self.link_send(next, msg.encode());
                    }
                }
            }
            Err(_) => self.stats.bad_datagrams += 1,
        }
    }

    /// A part of another site's element: passed on at once, as the
    /// whole element would be, and kept here until the element is whole
    /// if this site takes the element in.
    fn on_wan_part(
        &mut self,
        raw: Bytes,
        dest: u16,
        key: parts::ElementKey,
        index: u32,
        count: u32,
        bytes: Bytes,
    ) {
        if key.1 == self.site {
            return;
        }
        for next in self.next_sites(key.1, dest) {
            self.link_send(next, raw.clone());
        }
        if dest != TREE && dest != self.site.0 {
            return;
        }
        let max = self.config.max_payload + ELEMENT_ALLOWANCE;
        let whole = match self.wan_parts.push(key, index, count, bytes, max) {
            Ok(Some(whole)) => whole,
            Ok(None) => return,
            Err(_) => {
                self.stats.parts_refused += 1;
                return;
            }
        };
        match Element::decode(&whole) {
            Ok(e) if (e.epoch, e.origin, e.seq) == key => self.inject(e, whole),
            _ => self.stats.bad_datagrams += 1,
        }
    }

    fn on_wan_elem(&mut self, dest: u16, bytes: Bytes) {
        let Ok(e) = Element::decode(&bytes) else {
            self.stats.bad_datagrams += 1;
            return;
        };
        if !self.known_site(e.origin.0) {
            self.stats.bad_datagrams += 1;
            return;
        }
        if e.origin == self.site {
            return;
        }
        if dest == TREE {
            self.forward(&e, &bytes, TREE);
        } else if dest != self.site.0 {
            self.forward(&e, &bytes, dest);
            return;
        }
        self.inject(e, bytes);
    }

    /// Multicasts another site's element in this site's ring, in its
    /// origin's order.
    fn inject(&mut self, e: Element, bytes: Bytes) {
        let oldest = self.prev.as_ref().map_or(self.conf.epoch, |p| p.epoch);
        if e.epoch < oldest {
            return;
        }
        let key = (e.epoch, e.origin);
        let next = *self.inject_next.entry(key).or_insert(1);
        if e.seq < next {
            return;
        }
        if e.seq > next {
            if self.inject_early.len() < 4 * self.config.hop.window_packets.get() as usize {
                self.inject_early.insert((e.epoch, e.origin, e.seq), bytes);
            }
            return;
        }
        let mut seq = e.seq;
        let mut bytes = bytes;
        loop {
            if !self.ring_send(RingMsg::Foreign(bytes.clone()), ring::Service::Agreed) {
                // The ring's queue is full: kept, and injected when it
                // has room (`retry_inject`).
                self.inject_early.insert((key.0, key.1, seq), bytes);
                self.inject_stalled = true;
                break;
            }
            seq += 1;
            match self.inject_early.remove(&(key.0, key.1, seq)) {
                Some(b) => bytes = b,
                None => break,
            }
        }
        self.inject_next.insert(key, seq);
    }

    /// Injects the elements the ring's queue refused, once it has room.
    fn retry_inject(&mut self) {
        self.inject_stalled = false;
        let heads: Vec<(u32, SiteId, u64)> = self
            .inject_next
            .iter()
            .map(|(&(epoch, site), &next)| (epoch, site, next))
            .collect();
        for head in heads {
            let Some(len) = self.inject_early.get(&head).map(Bytes::len) else {
                continue;
            };
            if !self.ring_has_room(len + 1) {
                self.inject_stalled = true;
                return;
            }
            let bytes = self.inject_early.remove(&head).expect("present");
            match Element::decode(&bytes) {
                Ok(e) => self.inject(e, bytes),
                Err(_) => self.stats.bad_datagrams += 1,
            }
        }
    }

    /// After taking in data, the site says it was heard from (and what it
    /// holds) with a marker, one at a time.
    fn maybe_marker(&mut self) {
        // The spacing saves the WAN markers; it must not hold senders:
        // a daemon's messages leave its global window only as markers
        // announce them held, so under a stream faster than a quarter
        // window per interval (13,000 msgs/s at 200 and 15 ms) a marker
        // follows every quarter window of data instead.
        let due = self.now >= self.marker_not_before
            || self.data_count >= (self.config.global_window / 4).max(1);
        if self.marker_wanted() && due {
            self.marker_in_flight = true;
            self.marker_not_before = self.now + self.config.marker_interval;
            self.stats.markers += 1;
            self.ring_send(
                RingMsg::Own(Body::Marker { holds: Vec::new() }),
                ring::Service::Safe,
            );
        }
    }

    /// Data came in since the last marker, none is in flight, and the
    /// site's stream is open: a marker is due once `marker_interval`
    /// allows.
    fn marker_wanted(&self) -> bool {
        self.data_since_marker
            && !self.marker_in_flight
            && !self.own_closed
            && self.pending.is_none()
            && self.conf.installed
    }

    fn send_status(&mut self) {
        self.status_at = self.now + self.config.status_interval;
        if self.now.saturating_duration_since(self.last_clear) >= self.config.resend_timeout {
            self.sent_upto.clear();
            self.last_clear = self.now;
        }
        let mut statuses = vec![(self.conf.epoch, self.conf.holds())];
        if let Some(p) = self.pending.as_ref().filter(|p| p.state.is_some()) {
            // The change's second phase: which sites' states of the new
            // configuration are in here (each is its stream's first
            // element), so that one lost with a link is resent.
            let holds = p
                .sites
                .iter()
                .map(|s| u64::from(self.has_state_of(p, *s)))
                .collect();
            statuses.push((p.epoch, holds));
        }
        for (epoch, holds) in statuses {
            self.send_status_for(epoch, &holds);
        }
    }

    fn send_status_for(&mut self, epoch: u32, holds: &[u64]) {
        let targets: Vec<SiteId> = self
            .view_sites
            .iter()
            .filter(|s| **s != self.site)
            .copied()
            .collect();
        for t in targets {
            let msg = WanMsg::Status {
                dest: t.0,
                site: self.site,
                epoch,
                holds: holds.to_vec(),
            };
            // A neighbour's gateway gets it at once, outside the link's
            // queue: behind a second of queued data on a saturated link it
            // would report counts a second old, and the neighbour would
            // resend its own elements as stalled although the link had
            // long delivered them. A status repeats every
            // `status_interval`, so it needs no Hop reliability. Sites
            // further away get it through the links.
            if let Some(l) = self.links.get(&t) {
                let mut buf = codec::wan_header(codec::WAN_STATUS, self.link_epoch, self.site);
                buf.extend_from_slice(&msg.encode());
                self.out.push_back(Out {
                    target: Target::Wan(l.peer),
                    payload: Bytes::from(buf),
                });
            } else if let Some(next) = self.routes.next_hop(self.site, t) {
                self.link_send(next, msg.encode());
            }
        }
    }

    /// Site `t` holds `holds` of configuration `epoch`: resend it what it
    /// lacks of this site's elements, and of sites that left, where it
    /// made no progress for `resend_timeout` (elements still in flight on
    /// a slow link are not lost; a reset link stops progress).
    fn on_status(&mut self, t: SiteId, epoch: u32, holds: &[u64]) {
        let now = self.now;
        let since: Vec<Instant> = {
            let entry = self.last_status.entry((t, epoch)).or_default();
            entry.resize(holds.len(), (0, now));
            for (e, h) in entry.iter_mut().zip(holds) {
                if e.0 != *h {
                    *e = (*h, now);
                }
            }
            entry.iter().map(|e| e.1).collect()
        };
        if self.pending.as_ref().is_some_and(|p| p.epoch == epoch) {
            self.resend_own_state(t, epoch, holds, &since);
            return;
        }
        let conf = if self.conf.epoch == epoch {
            &self.conf
        } else if let Some(p) = self.prev.as_ref().filter(|p| p.epoch == epoch) {
            p
        } else {
            return;
        };
        if holds.len() != conf.sites.len() {
            self.stats.bad_datagrams += 1;
            return;
        }
        // A status about the configuration this daemon left comes from a
        // site still finishing that change: it may lack elements of a
        // site that has since moved on (and dropped them) while it is
        // back in this daemon's view (a merge right after a partition),
        // so every holder resends there, not only the origin.
        let finishing = epoch != self.conf.epoch;
        let mut sends = Vec::new();
        for (i, x) in conf.sites.iter().enumerate() {
            if *x != self.site && self.view_sites.contains(x) && !finishing {
                continue;
            }
            let stalled = now.saturating_duration_since(since[i]) >= self.config.resend_timeout;
            if !stalled {
                continue;
            }
            let mine = conf.streams[i].next - 1;
            let sent = self.sent_upto.get(&(t, epoch, *x)).copied().unwrap_or(0);
            let from = holds[i].max(sent).saturating_add(1);
            if from <= mine {
                sends.push((*x, holds[i] + 1, from, mine.min(from + RESEND_MAX - 1)));
            }
        }
        let next = self.routes.next_hop(self.site, t);
        for (x, head, from, to) in sends {
            for seq in from..=to {
                // What the live link still carries arrives without a
                // copy (a copy would cost the link's rate, and under loss
                // the far site's count stalls on one slow packet while
                // the link carries hundreds behind it). The element the
                // count waits on is resent all the same: Hop may be slow
                // to recover it (at 20% loss each way a NACK round fails
                // with probability 0.36), and a copy races it.
                if x == self.site
                    && seq != head
                    && next.is_some_and(|n| self.in_custody(epoch, seq, n))
                {
                    self.stats.resend_skipped += 1;
                    continue;
                }
                if let Some(b) = self.store.get(&(epoch, x, seq)).cloned() {
                    self.stats.resent += 1;
                    if let Some(n) = next {
                        let ticket = self.link_send_element(n, t.0, (epoch, x, seq), &b);
                        if x == self.site {
                            self.take_custody(epoch, seq, n, ticket);
                        }
                    }
                }
            }
            self.sent_upto.insert((t, epoch, x), to);
        }
    }

    /// Site `t` lacks this site's state of the change both are making
    /// (its status about the new configuration, `send_status`): resent
    /// once the count has not moved for `resend_timeout`.
    fn resend_own_state(&mut self, t: SiteId, epoch: u32, holds: &[u64], since: &[Instant]) {
        let Some(p) = self.pending.as_ref() else {
            return;
        };
        let Some(i) = p.sites.iter().position(|s| *s == self.site) else {
            return;
        };
        if p.state.is_none() || holds.len() != p.sites.len() || holds[i] > 0 {
            return;
        }
        let stalled = self.now.saturating_duration_since(since[i]) >= self.config.resend_timeout;
        let key = (t, epoch, self.site);
        if !stalled || self.sent_upto.get(&key).is_some_and(|s| *s >= 1) {
            return;
        }
        let Some(b) = self.store.get(&(epoch, self.site, 1)).cloned() else {
            return;
        };
        if let Some(n) = self.routes.next_hop(self.site, t) {
            self.stats.resent += 1;
            self.link_send_element(n, t.0, (epoch, self.site, 1), &b);
            self.sent_upto.insert(key, 1);
        }
    }

    /// Forgets elements every site of the configuration holds.
    fn gc(&mut self) {
        let conf = &self.conf;
        let mut floor = vec![u64::MAX; conf.sites.len()];
        for s in &conf.streams {
            for (f, a) in floor.iter_mut().zip(&s.announced) {
                *f = (*f).min(*a);
            }
        }
        let epoch = conf.epoch;
        let sites = conf.sites.clone();
        self.store.retain(|(e, x, seq), _| {
            *e != epoch || sites.binary_search(x).map_or(true, |i| *seq > floor[i])
        });
        // Links are started afresh at a change of configuration: notes of
        // an older one mean nothing.
        let own = conf.index(self.site).map_or(u64::MAX, |i| floor[i]);
        self.custody
            .retain(|(e, seq, _), _| *e == epoch && *seq > own);
    }
}

#[cfg(test)]
impl SiteDaemon {
    /// Senders whose ring message is partly delivered here.
    pub(crate) fn parts_in_progress(&self) -> usize {
        self.ring_parts.len()
    }

    /// Messages in progress this daemon took with a snapshot.
    pub(crate) fn parts_adopted(&self) -> usize {
        self.parts_adopted
    }

    pub(crate) fn dump(&self) -> String {
        let streams: Vec<String> = self
            .conf
            .streams
            .iter()
            .map(|s| {
                format!(
                    "next {} early {} ts {} ordered {} ann {:?} flush {:?} state {}",
                    s.next,
                    s.early.len(),
                    s.last_ts,
                    s.ordered.len(),
                    s.announced,
                    s.flush.as_ref().map(|f| f.0),
                    s.state.is_some()
                )
            })
            .collect();
        format!(
            "d{} gw {} epoch {} installed {} pending {:?} closed {} held {} queue {} links {:?}\n  {}",
            self.me.0,
            self.gateway,
            self.conf.epoch,
            self.conf.installed,
            self.pending.as_ref().map(|p| p.epoch),
            self.own_closed,
            self.held_own.len(),
            self.queue.len(),
            self.links.iter().map(|(s, l)| (s.0, l.peer.0)).collect::<Vec<_>>(),
            streams.join("\n  ")
        )
    }
}

fn min_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Routes over the sites of a configuration.
fn routes_for(topo: &Topology, sites: &[SiteId]) -> Routes {
    let live = sites
        .iter()
        .flat_map(|s| topo.sites[usize::from(s.0)].daemons.iter().copied())
        .collect();
    Routes::compute(
        topo,
        &Membership {
            live,
            failed_links: BTreeSet::new(),
        },
    )
}
