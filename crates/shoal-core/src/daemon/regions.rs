//! `reliable` and `fifo` messages carried by QSM regions, outside the
//! daemons' total order ([A] Ostrowski, Birman, Phanishayee, "QuickSilver
//! Scalable Multicast", §2.1-§3; `docs/qsm.md`, "In the daemon").
//!
//! - **Region views** follow from the group table ([`super::Sessions`]):
//!   joins, leaves and daemon views are applied in the total order, so every
//!   daemon that holds the table computes the same group → daemons map at
//!   the same point, hence the same region (the daemons whose sets of
//!   groups are identical). This daemon runs one [`Qsm`] engine for its
//!   region (an *instance*), plus the retired one while it is flushed.
//! - **Which messages**: `reliable`/`fifo` (the `services` setting) to
//!   public groups that each span only this daemon's region, small enough
//!   for one region datagram. Everything else keeps the total order.
//! - **FIFO across the two paths**: a CUT item in the total order before the
//!   first ordered message after region messages (receivers apply nothing
//!   past it before they delivered the region messages below it); a region
//!   message is sent only when none of the daemon's batches waits for or is
//!   in flight in the order, and carries the global sequence number its
//!   daemon had applied, which a receiver applies before delivering it.
//! - **Flush**: at a *change point* (a batch that changes the group table,
//!   a daemon view that adds or drops daemons) each daemon retires its
//!   instance (client messages go by the total order meanwhile), puts a
//!   REGION_FLUSH item (its next
//!   sequence number, the prefix it delivered of each other source) into
//!   the order, and holds the change and everything after it until it
//!   delivered the retired instance's messages exactly up to each source's
//!   bound: the source's own flush, or, for a daemon gone without one, the
//!   highest prefix any reporter delivered. A flush that cannot finish
//!   within `flush_timeout` completes without the missing messages, which
//!   are counted (`flush_lost`). An instance carries messages only once
//!   every member's OPEN (a CUT at 0) came back in the order; one never
//!   confirmed, of one member, or with no group ends without a flush.
//!
//! Engines number members by daemon slot (a small dense id, which the
//! runtime's slot check accepts as a datagram's sender); the wire's region
//! field names the instance: a hash of the change point that created it and
//! its members, alike at every daemon.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use shoal_wire::client::{Frame, Service};
use shoal_wire::groups::{self, Item};
use shoal_wire::{packets, Packet, HEADER_LEN};

use super::membership::{slot_of, MembershipEvent};
use super::sessions::{SessionId, Sessions};
use crate::engine::{Destination, Engine, GroupChange, GroupTransmit, NodeId, Transmit};
use crate::qsm::{self, GroupId, Qsm, RegionId, RegionView};
use crate::time::Instant;
use crate::vsync::Event;

/// A service a region may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegionService {
    Reliable,
    Fifo,
}

/// `[qsm]` in the daemon's configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QsmSettings {
    /// Carry `services` over regions (default false: every message goes
    /// through the total order).
    pub enabled: bool,
    /// The services regions carry (default `["reliable", "fifo"]`; the
    /// stronger ones need the total order).
    pub services: Vec<RegionService>,
    /// A flush that has not completed after this long completes without
    /// what it still misses, counted as `flush_lost` (default 10 s: a token
    /// interval, several rounds of repair, and a daemon view change).
    #[serde(with = "crate::serde_ms")]
    pub flush_timeout: Duration,
    /// Datagrams for a region instance this daemon has not created yet
    /// (a peer applied the change first) kept at most (default 4,096).
    pub early_max: usize,
    /// Client frames held while a flush pauses input or the engine's send
    /// buffer is full, before the daemon stops reading clients (default
    /// 1,024).
    pub held_max: usize,
    /// Per-region IP multicast ([A] §2.1: one IP multicast address per
    /// region): each region instance of more than one daemon is given the
    /// address `multicast + (instance id mod multicast_addresses)` (the
    /// port as given), its members join it, and its engine's multicasts
    /// (data, and retransmissions the whole region missed) go there once,
    /// sent and received on the interface and TTL of `[ip_multicast]`.
    /// Unset (the default), such a multicast goes as one unicast to each
    /// other member. Two regions that draw one address share it; each
    /// drops the other's datagrams by their region field.
    pub multicast: Option<SocketAddr>,
    /// How many consecutive addresses from `multicast` regions spread over
    /// (default 256; the daemon's configuration keeps them inside the
    /// administratively scoped range).
    pub multicast_addresses: NonZeroU32,
    /// Groups carried by an instance of their own ([A] §2.1's hybrid
    /// per-group mode, for "a limited number of groups"; default none).
    /// Such a group is left out when regions are derived, and the daemons
    /// with a member of it form one more instance that carries it alone:
    /// a group that spans several regions (daemons whose other groups
    /// differ), which would otherwise keep the total order, goes by one
    /// multicast per message (with `multicast` set, to the instance's own
    /// address: the per-group address) and its recovery runs among its
    /// own daemons. Each such group costs its daemons one more token ring
    /// and, with `multicast`, one more address joined; it gives up the
    /// regions' aggregation, so name only a few hot groups. A sender that
    /// moves between two instances sends that one message by the total
    /// order behind a CUT (as between a region and the order), so FIFO
    /// per sender holds across them: alternating at every message gains
    /// nothing.
    pub hybrid: Vec<String>,
    /// The region engine's settings (`qsm::Config`, the papers' defaults),
    /// except `send_buffer`, which is 4,096 here: client frames arrive in
    /// bursts of a socket read, and each one the engine refuses waits in
    /// the daemon instead.
    pub engine: qsm::Config,
}

impl Default for QsmSettings {
    fn default() -> Self {
        QsmSettings {
            enabled: false,
            services: vec![RegionService::Reliable, RegionService::Fifo],
            flush_timeout: Duration::from_secs(10),
            early_max: 4096,
            held_max: 1024,
            multicast: None,
            multicast_addresses: NonZeroU32::new(256).expect("non-zero"),
            hybrid: Vec::new(),
            engine: qsm::Config {
                send_buffer: NonZeroU32::new(4096).expect("non-zero"),
                ..qsm::Config::default()
            },
        }
    }
}

impl QsmSettings {
    /// The IP multicast group of region instance `id`, if configured.
    pub fn region_group(&self, id: u32) -> Option<SocketAddr> {
        let base = self.multicast?;
        let offset = id % self.multicast_addresses.get();
        let ip = match base.ip() {
            IpAddr::V4(ip) => IpAddr::V4(Ipv4Addr::from(u32::from(ip).wrapping_add(offset))),
            IpAddr::V6(ip) => IpAddr::V6(Ipv6Addr::from(
                u128::from(ip).wrapping_add(u128::from(offset)),
            )),
        };
        Some(SocketAddr::new(ip, base.port()))
    }

    fn carries(&self, service: Service) -> bool {
        match service {
            Service::Reliable => self.services.contains(&RegionService::Reliable),
            Service::Fifo => self.services.contains(&RegionService::Fifo),
            _ => false,
        }
    }
}

/// Counters shown by `shoal status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionStats {
    /// Region instances created.
    pub instances: u64,
    pub messages_sent: u64,
    pub messages_delivered: u64,
    /// Multicasts of a carried service that went by the total order
    /// (another region, a private group, too large, batches in flight).
    pub ordered_instead: u64,
    pub cuts_sent: u64,
    pub flushes: u64,
    pub flush_timeouts: u64,
    /// Messages below a flush bound this daemon never got (a timeout).
    pub flush_lost: u64,
    /// Messages received above a gone source's bound: not delivered.
    pub beyond_bound: u64,
    /// Datagrams for unknown instances dropped (buffer full or retired).
    pub early_dropped: u64,
    /// Events handed on as no change point that changed the table's view
    /// id all the same (a region instance outlived a change without a
    /// flush): a bug if ever above 0.
    pub unflushed_changes: u64,
    pub bad_datagrams: u64,
    /// Datagrams sent to a region's IP multicast address.
    pub group_datagrams: u64,
    /// Messages sent on an instance of a `hybrid` group (also counted in
    /// `messages_sent`).
    pub hybrid_sent: u64,
    /// Messages sent by the total order because their sender's previous
    /// region message went by another instance (also counted in
    /// `ordered_instead`).
    pub instance_switches: u64,
}

/// What a reporter said at a flush.
#[derive(Debug, Clone)]
struct Report {
    sent: u64,
    delivered: BTreeMap<u32, u64>,
}

/// A delivery the engine made, waiting for its turn.
struct Waiting {
    seq: u64,
    /// The engine's group id: the position of the message's first group
    /// in the instance's list.
    group: u32,
    payload: Bytes,
}

/// One region instance this daemon is a member of.
struct Instance {
    id: u32,
    /// Carries one `hybrid` group (else: this daemon's region).
    hybrid: bool,
    engine: Qsm,
    /// Daemon ids by slot.
    members: BTreeMap<u32, NodeId>,
    /// Hashes of the groups that span only this region, ascending.
    groups: Vec<u64>,
    /// Where each hash is in `groups`, found without a search: the sender
    /// looks up every message's groups by name, and a binary search over
    /// 10,000 hashes was the largest per-message cost of many groups.
    index: GroupIndex,
    /// The local recipients of `groups[i]` are
    /// `local[local_at[i]..local_at[i + 1]]`: resolved once from the table,
    /// which no change touches during the instance's life (a change retires
    /// it), so that a delivery costs no lookup in the sessions' table of
    /// group names.
    local_at: Vec<u32>,
    local: Vec<SessionId>,
    /// Next sequence number of this daemon's messages.
    next_seq: u64,
    /// Member slots whose OPEN for this instance came back in the total
    /// order (an OPEN is a CUT at sequence number 0).
    opens: BTreeSet<u32>,
    /// Every member's OPEN came back: messages may go by this instance.
    /// Decided at one point of the order, alike at every member, so an
    /// instance that members derived differently (a joiner whose table or
    /// held `safe` batches differ) carries nothing and needs no flush.
    confirmed: bool,
    /// Per source slot: messages handed to the sessions.
    delivered: BTreeMap<u32, u64>,
    /// Engine deliveries not yet handed over (a dependency on the total
    /// order not applied yet, or a flush bound not known yet), in order,
    /// per source slot: FIFO is per source, so one source's message that
    /// waits never holds back another's (a sender's own messages waited
    /// behind a peer's that depended on a later point of the order, and
    /// its next ordered message overtook them).
    waiting: BTreeMap<u32, VecDeque<Waiting>>,
    /// Set when retired: this daemon's report, the others', and the
    /// reporters expected.
    flush: Option<Flush>,
}

struct Flush {
    mine: Report,
    reports: BTreeMap<u32, Report>,
    expected: BTreeSet<u32>,
    /// Every source's bound, fixed at the point of the total order where
    /// the last expected report arrived (alike at every daemon).
    frozen: Option<BTreeMap<u32, u64>>,
}

impl Flush {
    /// Whether a reporter had not delivered some source up to its bound
    /// (or the bounds are not fixed: this daemon gave up waiting).
    fn someone_behind(&self) -> bool {
        let Some(bounds) = &self.frozen else {
            return true;
        };
        self.reports.iter().any(|(reporter, r)| {
            bounds.iter().any(|(source, bound)| {
                let had = if source == reporter {
                    r.sent
                } else {
                    r.delivered.get(source).copied().unwrap_or(0)
                };
                had < *bound
            })
        })
    }

    /// Fixes the bounds once every expected reporter has reported: a
    /// reporter's own `sent`, else the highest prefix reported.
    fn freeze(&mut self) {
        if self.frozen.is_some() || !self.expected.iter().all(|s| self.reports.contains_key(s)) {
            return;
        }
        let mut bounds: BTreeMap<u32, u64> = BTreeMap::new();
        for r in self.reports.values() {
            for (s, n) in &r.delivered {
                let b = bounds.entry(*s).or_default();
                *b = (*b).max(*n);
            }
        }
        for (s, r) in &self.reports {
            bounds.insert(*s, r.sent);
        }
        self.frozen = Some(bounds);
    }
}

impl Instance {
    /// Whether a flush of this instance has nothing to agree on: this
    /// daemon is its only member (its own messages are delivered at once),
    /// or it carries no group (no member could send on it). Every member
    /// derives the same instance, so all of them skip its flush alike.
    fn trivial(&self) -> bool {
        self.members.len() <= 1 || self.groups.is_empty() || !self.confirmed
    }

    /// The local recipients of a message to `groups`, if all are carried.
    /// `first` is where the sender said the first one is in `self.groups`
    /// (the engine's group id): checked against its hash, and looked up
    /// only if it does not match.
    fn recipients(&self, groups: &[&str], first: u32) -> Option<Vec<SessionId>> {
        let mut to = Vec::new();
        for (k, g) in groups.iter().enumerate() {
            let h = group_hash(g);
            let hint = (k == 0)
                .then_some(first as usize)
                .filter(|i| self.groups.get(*i) == Some(&h));
            let i = match hint {
                Some(i) => i,
                None => self.index.find(h)?,
            };
            let (a, b) = (self.local_at[i] as usize, self.local_at[i + 1] as usize);
            to.extend_from_slice(&self.local[a..b]);
        }
        Some(to)
    }

    /// An OPEN of this instance from `sender` came back in the order.
    fn on_open(&mut self, sender: NodeId) {
        let slot = slot_of(sender);
        if self.members.get(&slot) == Some(&sender) {
            self.opens.insert(slot);
        }
        self.confirmed = self.members.keys().all(|s| self.opens.contains(s));
    }

    /// The bound of `source`, once known.
    fn bound(&self, source: u32) -> Option<u64> {
        let flush = self.flush.as_ref()?;
        if let Some(r) = flush.reports.get(&source) {
            return Some(r.sent);
        }
        flush
            .frozen
            .as_ref()
            .map(|b| b.get(&source).copied().unwrap_or(0))
    }

    /// Whether the flush is over here: bounds fixed and every source
    /// delivered up to its bound.
    fn flushed(&self) -> bool {
        let Some(bounds) = self.flush.as_ref().and_then(|f| f.frozen.as_ref()) else {
            return false;
        };
        bounds
            .iter()
            .all(|(s, b)| self.delivered.get(s).copied().unwrap_or(0) >= *b)
    }
}

/// What holds the total order back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// A change point: the retired instances' flushes.
    Change { since: Instant },
    /// A CUT of `source` in instance `instance` up to `upto`.
    Cut {
        instance: u32,
        source: u32,
        upto: u64,
        since: Instant,
    },
}

/// The daemon's QSM layer. The daemon engine routes through it every event
/// of the daemons' group (which it may hold back), every multicast of a
/// carried service, and every QSM datagram.
pub struct Regions {
    settings: QsmSettings,
    /// Hashes of the `hybrid` groups.
    hybrid: BTreeSet<u64>,
    datagram_max: usize,
    me: Option<NodeId>,
    /// The instances messages go by now: this daemon's region (first, if
    /// any) and one per `hybrid` group it has a member of.
    current: Vec<Instance>,
    retired: Vec<Instance>,
    /// Instances flushed here, kept running (token, repairs; deliveries
    /// dropped) until the given time: a peer still flushing one may need
    /// copies only this daemon holds. Dropping them at once left a slower
    /// member nobody to recover from: its flush timed out and lost what it
    /// lacked (a bench receiver lost 5,973 messages this way).
    lingering: VecDeque<(Instance, Instant)>,
    /// Events of the daemons' group not handed on yet, in order.
    queue: VecDeque<MembershipEvent>,
    gate: Option<Gate>,
    /// The global sequence number of the latest event handed on (batch or
    /// view): part of the next instance's id.
    derive_at: u64,
    /// This daemon was removed from its group: gates give way at once.
    removed: bool,
    /// Members of the latest daemon view seen.
    view_members: Vec<NodeId>,
    /// The sessions' view id before an event handed on as no change point
    /// was applied (checked after it, [`RegionStats::unflushed_changes`]).
    watch: Option<u64>,
    /// The latest total-order batch handed to the sessions.
    applied_gseq: u64,
    /// The instance that carried region messages since the last cut or
    /// flush.
    cut_due: Option<u32>,
    /// The OPENs of the instances just derived, not yet put into the order.
    open_due: Vec<u32>,
    /// Client frames waiting (a flush, or the engine's buffer full).
    held: VecDeque<(SessionId, Frame)>,
    /// Flush reports for instances not retired here yet, by instance.
    early_reports: VecDeque<(u32, u32, Report)>,
    /// Datagrams for instances not created yet: (instance, from, packet).
    early: VecDeque<(u32, NodeId, Bytes)>,
    /// Instances retired and dropped (their packets are dropped).
    gone: VecDeque<u32>,
    out: VecDeque<Transmit>,
    /// Datagrams for regions' IP multicast addresses.
    group_out: VecDeque<GroupTransmit>,
    /// The IP multicast groups the driver has been told to join.
    joined: BTreeSet<SocketAddr>,
    last_now: Instant,
    stats: RegionStats,
}

/// Instances remembered as gone.
const GONE_MAX: usize = 64;
/// Flushed instances kept running for peers at most (the oldest go first).
const LINGER_MAX: usize = 8;
/// Flush reports kept for instances not retired here yet.
const EARLY_REPORTS_MAX: usize = 4096;
/// Bytes of a QSM data packet before the payload: header, region, group,
/// seq.
const DATA_OVERHEAD: usize = HEADER_LEN + 16;

impl Regions {
    /// The layer for a daemon whose datagrams carry at most `datagram_max`
    /// bytes.
    pub fn new(settings: QsmSettings, datagram_max: usize) -> Regions {
        let hybrid = settings.hybrid.iter().map(|g| group_hash(g)).collect();
        Regions {
            settings,
            hybrid,
            datagram_max,
            me: None,
            current: Vec::new(),
            retired: Vec::new(),
            lingering: VecDeque::new(),
            queue: VecDeque::new(),
            gate: None,
            derive_at: 0,
            removed: false,
            view_members: Vec::new(),
            watch: None,
            applied_gseq: 0,
            cut_due: None,
            open_due: Vec::new(),
            held: VecDeque::new(),
            early: VecDeque::new(),
            early_reports: VecDeque::new(),
            gone: VecDeque::new(),
            out: VecDeque::new(),
            group_out: VecDeque::new(),
            joined: BTreeSet::new(),
            last_now: Instant::ZERO,
            stats: RegionStats::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    pub fn settings(&self) -> &QsmSettings {
        &self.settings
    }

    pub fn stats(&self) -> &RegionStats {
        &self.stats
    }

    /// The current region instance: (id, members' daemon ids, groups
    /// carried).
    pub fn region(&self) -> Option<(u32, Vec<NodeId>, usize)> {
        let i = self.current.iter().find(|i| !i.hybrid)?;
        Some((i.id, i.members.values().copied().collect(), i.groups.len()))
    }

    /// The current instances of `hybrid` groups: (id, members' daemon ids).
    pub fn hybrid_instances(&self) -> Vec<(u32, Vec<NodeId>)> {
        self.current
            .iter()
            .filter(|i| i.hybrid)
            .map(|i| (i.id, i.members.values().copied().collect()))
            .collect()
    }

    /// Whether a flush or a cut holds the total order back.
    pub fn gated(&self) -> bool {
        self.gate.is_some()
    }

    /// Whether client input should be read (false while frames wait).
    pub fn accepts_input(&self) -> bool {
        self.held.len() < self.settings.held_max
    }

    /// Bytes of state per carried group in this daemon's region layer: the
    /// group list, its local recipients and the engine's group table, by
    /// their allocations (the
    /// sessions' group table, which every daemon has with or without QSM,
    /// is not counted here).
    pub fn bytes_per_group(&self) -> Option<usize> {
        let i = self.current.iter().find(|i| !i.hybrid)?;
        let n = i.groups.len().max(1);
        let own = i.groups.capacity() * std::mem::size_of::<u64>()
            + i.index.slots.capacity() * std::mem::size_of::<Slot>()
            + i.local_at.capacity() * std::mem::size_of::<u32>()
            + i.local.capacity() * std::mem::size_of::<SessionId>();
        Some(own / n + i.engine.bytes_per_group())
    }

    /// Lines for `shoal status`.
    pub fn status_lines(&self) -> Vec<String> {
        if !self.settings.enabled {
            return vec!["qsm: off".into()];
        }
        let s = &self.stats;
        let region = if self.current.is_empty() {
            "none".to_string()
        } else {
            self.current
                .iter()
                .map(|i| {
                    format!(
                        "{}instance {:08x}, {} daemons, {} groups",
                        if i.hybrid { "hybrid " } else { "" },
                        i.id,
                        i.members.len(),
                        i.groups.len()
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        let retired: Vec<String> = self
            .retired
            .iter()
            .map(|i| {
                let f = i.flush.as_ref();
                format!(
                    "{:08x} (members {:?}, expected {:?}, reported {:?}, bounds {})",
                    i.id,
                    i.members.keys().collect::<Vec<_>>(),
                    f.map(|f| f.expected.iter().collect::<Vec<_>>()),
                    f.map(|f| f.reports.keys().collect::<Vec<_>>()),
                    if f.is_some_and(|f| f.frozen.is_some()) {
                        "fixed"
                    } else {
                        "open"
                    }
                )
            })
            .collect();
        let gate = match self.gate {
            None => "open".to_string(),
            Some(Gate::Change { .. }) => "flushing".to_string(),
            Some(Gate::Cut {
                instance,
                source,
                upto,
                ..
            }) => format!("at a cut of {source} in {instance:08x} up to {upto}"),
        };
        vec![
            format!(
                "qsm: region {region}; retired {} {}; {gate}",
                self.retired.len(),
                retired.join(", ")
            ),
            format!(
                "qsm: sent {} (hybrid {}) delivered {} ordered instead {} (instance switches {}); instances {} cuts {} flushes {} (timed out {}, lost {}, beyond bound {}); early dropped {} bad {}; unflushed changes {}; to region addresses {} (joined {})",
                s.messages_sent,
                s.hybrid_sent,
                s.messages_delivered,
                s.ordered_instead,
                s.instance_switches,
                s.instances,
                s.cuts_sent,
                s.flushes,
                s.flush_timeouts,
                s.flush_lost,
                s.beyond_bound,
                s.early_dropped,
                s.bad_datagrams,
                s.unflushed_changes,
                s.group_datagrams,
                self.joined.len()
            ),
        ]
    }

    // ---- the daemons' group -------------------------------------------------------

    /// An event of the daemons' group arrived: it waits in order (flush
    /// reports are read from it at once).
    pub fn push_event(&mut self, ev: MembershipEvent) {
        self.me = Some(ev.me);
        match &ev.event {
            Event::Deliver {
                sender, payload, ..
            } => self.read_reports(*sender, payload),
            Event::View(v) => {
                self.view_members = v.members.clone();
                let alive: BTreeSet<u32> = v.members.iter().map(|d| slot_of(*d)).collect();
                let now = self.last_now;
                let lingering = self.lingering.iter_mut().map(|(i, _)| i);
                for inst in self.retired.iter_mut().chain(lingering) {
                    if let Some(f) = inst.flush.as_mut() {
                        f.expected.retain(|s| alive.contains(s));
                        f.freeze();
                    }
                    // Recovery goes on among the survivors: the token's
                    // route leaves the gone daemons out.
                    let survivors: Vec<NodeId> = inst
                        .members
                        .iter()
                        .filter(|(_, d)| v.members.contains(d))
                        .map(|(s, _)| NodeId(*s))
                        .collect();
                    if survivors.len() < inst.members.len() && !survivors.is_empty() {
                        let view = RegionView {
                            id: RegionId(inst.id),
                            view: inst.engine.view() + 1,
                            members: survivors,
                            groups: Vec::new(),
                        };
                        inst.engine.handle_view(now, &view);
                    }
                }
            }
            Event::Removed { .. } => self.removed = true,
            Event::Unsequenced { .. } => {}
        }
        self.queue.push_back(ev);
    }

    /// OPENs (CUTs at 0) of the current instances, read in order.
    fn read_opens(&mut self, sender: NodeId, payload: &[u8]) {
        if self.current.iter().all(|i| i.confirmed) {
            return;
        }
        let Ok(items) = groups::decode(payload) else {
            return;
        };
        for item in items {
            if let Item::RegionFlush {
                instance,
                cut: true,
                sent: 0,
                ..
            } = item
            {
                if let Some(inst) = self
                    .current
                    .iter_mut()
                    .find(|i| i.id == instance && !i.confirmed)
                {
                    inst.on_open(sender);
                }
            }
        }
    }

    fn read_reports(&mut self, sender: NodeId, payload: &[u8]) {
        let Ok(items) = groups::decode(payload) else {
            return;
        };
        for item in items {
            let Item::RegionFlush {
                instance,
                cut: false,
                sent,
                delivered,
            } = item
            else {
                continue;
            };
            let report = Report {
                sent,
                delivered: delivered.into_iter().collect(),
            };
            match self.retired.iter_mut().find(|i| i.id == instance) {
                Some(inst) => {
                    if let Some(f) = inst.flush.as_mut() {
                        f.reports.entry(slot_of(sender)).or_insert(report);
                        f.freeze();
                    }
                }
                // A peer passed the change point first: kept until this
                // daemon retires the instance there.
                // (Reports of instances this daemon is not in come too; the
                // oldest go first.)
                None if !self.gone.contains(&instance) => {
                    if self.early_reports.len() >= EARLY_REPORTS_MAX {
                        self.early_reports.pop_front();
                    }
                    self.early_reports
                        .push_back((instance, slot_of(sender), report));
                }
                None => {}
            }
        }
    }

    /// The next event to hand to the sessions, unless a gate holds it. A
    /// change point retires the instance and starts a flush here (its
    /// report goes into `sessions`' next batch).
    pub fn next_event(&mut self, now: Instant, sessions: &mut Sessions) -> Option<MembershipEvent> {
        self.last_now = self.last_now.max(now);
        loop {
            if let Some(gate) = self.gate {
                if !self.gate_open(now, gate) {
                    return None;
                }
                self.finish_gate(now, gate, sessions);
                // The change, or the batch with the cut, goes now.
                let ev = self.queue.pop_front()?;
                if matches!(gate, Gate::Cut { .. }) {
                    self.watch_for_change(sessions);
                }
                return Some(self.hand_on(ev));
            }
            let ev = self.queue.front()?;
            if !self.removed && !self.current.is_empty() && Regions::is_change(ev, sessions) {
                // Trivial instances (nothing to agree on) end without a
                // flush round; the others are retired and flushed.
                self.drop_trivial(now, sessions);
                if !self.current.is_empty() {
                    self.retire(now, sessions);
                    self.gate = Some(Gate::Change { since: now });
                }
                continue;
            }
            if !self.removed {
                if let Some(cut) = self.cut_in(ev, now) {
                    self.gate = Some(cut);
                    continue;
                }
            }
            let ev = self.queue.pop_front()?;
            self.watch_for_change(sessions);
            return Some(self.hand_on(ev));
        }
    }

    /// An event goes on as no change point: with an instance current,
    /// [`Regions::after_event`] checks that the table's view id stayed.
    fn watch_for_change(&mut self, sessions: &Sessions) {
        self.watch = (!self.current.is_empty() && !self.removed).then(|| sessions.change_point());
    }

    fn hand_on(&mut self, ev: MembershipEvent) -> MembershipEvent {
        match &ev.event {
            Event::Deliver {
                gseq,
                sender,
                payload,
                ..
            } => {
                self.read_opens(*sender, payload);
                self.applied_gseq = self.applied_gseq.max(*gseq);
                self.derive_at = *gseq;
            }
            Event::View(v) => self.derive_at = v.gseq,
            Event::Removed { .. } => self.reset(),
            Event::Unsequenced { .. } => {}
        }
        ev
    }

    /// After the sessions applied an event: without an instance (after a
    /// change point's flush, or the table just installed), this daemon's
    /// region is derived.
    pub fn after_event(&mut self, now: Instant, sessions: &Sessions) {
        if let Some(before) = self.watch.take() {
            if sessions.change_point() != before && sessions.holds_table() {
                self.stats.unflushed_changes += 1;
            }
        }
        if !sessions.holds_table() {
            return;
        }
        // An instance is replaced only through a flush (`retire`).
        if self.current.is_empty() && self.me.is_some() && !self.removed {
            self.derive(now, sessions);
        }
    }

    /// Whether handing `ev` on may change the group table: a change item
    /// applied at once, held batches with one that its RECEIVED items make
    /// stable, a view that adds or drops daemons, or one that releases held
    /// batches with a change. (A batch with a RECEIVED while batches were
    /// held used to count whatever the held ones carried: under `safe`
    /// traffic nearly every batch, a flush round each.)
    fn is_change(ev: &MembershipEvent, sessions: &Sessions) -> bool {
        match &ev.event {
            Event::Deliver {
                sender, payload, ..
            } => sessions.batch_may_change_table(*sender, payload, changes_table),
            Event::View(v) => {
                !v.first
                    && (!v.joined.is_empty()
                        || !v.left.is_empty()
                        || !v.failed.is_empty()
                        || sessions.held_may_change_table(changes_table))
            }
            Event::Removed { .. } | Event::Unsequenced { .. } => false,
        }
    }

    /// A CUT in `ev` this daemon must wait for.
    fn cut_in(&self, ev: &MembershipEvent, now: Instant) -> Option<Gate> {
        let Event::Deliver {
            sender, payload, ..
        } = &ev.event
        else {
            return None;
        };
        // A sender's own daemon waits too: its own region messages are
        // delivered at once unless a flush holds them, and the ordered
        // message after them must not overtake them.
        if self.current.is_empty() && self.retired.is_empty() {
            return None;
        }
        let items = groups::decode(payload).ok()?;
        let source = slot_of(*sender);
        items.into_iter().find_map(|item| match item {
            Item::RegionFlush {
                instance,
                cut: true,
                sent,
                ..
            } => {
                let inst = self.instance(instance)?;
                let have = inst.delivered.get(&source).copied().unwrap_or(0);
                (have < sent).then_some(Gate::Cut {
                    instance,
                    source,
                    upto: sent,
                    since: now,
                })
            }
            _ => None,
        })
    }

    fn instance(&self, id: u32) -> Option<&Instance> {
        self.current
            .iter()
            .chain(self.retired.iter())
            .find(|i| i.id == id)
    }

    fn gate_open(&mut self, now: Instant, gate: Gate) -> bool {
        if self.removed {
            return true;
        }
        self.expect_waited(now, gate);
        let since = match gate {
            Gate::Change { since } | Gate::Cut { since, .. } => since,
        };
        if now >= since + self.settings.flush_timeout {
            self.stats.flush_timeouts += 1;
            return true;
        }
        match gate {
            Gate::Change { .. } => self.retired.iter().all(Instance::flushed),
            Gate::Cut {
                instance,
                source,
                upto,
                ..
            } => self
                .instance(instance)
                .is_none_or(|i| i.delivered.get(&source).copied().unwrap_or(0) >= upto),
        }
    }

    /// Tells the engines what a gate waits for: a CUT's messages, a
    /// flush's bounds. The engine pulls them from their source at once
    /// instead of learning of them from token rounds, which need every
    /// member of the instance on the route: a daemon waiting at a CUT has
    /// not applied the view that drops a gone member from it (swarm seed
    /// 199 with `--qsm --qsm-hybrid`). Cheap to repeat: an engine ignores
    /// what it was told already.
    fn expect_waited(&mut self, now: Instant, gate: Gate) {
        match gate {
            Gate::Cut {
                instance,
                source,
                upto,
                ..
            } => {
                if let Some(inst) = self
                    .current
                    .iter_mut()
                    .chain(self.retired.iter_mut())
                    .find(|i| i.id == instance)
                {
                    inst.engine.expect(now, NodeId(source), upto);
                }
            }
            Gate::Change { .. } => {
                for inst in &mut self.retired {
                    let slots: Vec<u32> = inst.members.keys().copied().collect();
                    for s in slots {
                        if let Some(b) = inst.bound(s) {
                            inst.engine.expect(now, NodeId(s), b);
                        }
                    }
                }
            }
        }
    }

    /// The gate gives way: a change's retired instances are dropped (what
    /// they still miss below a bound is counted lost; what waits above it is
    /// dropped).
    fn finish_gate(&mut self, now: Instant, gate: Gate, sessions: &mut Sessions) {
        self.gate = None;
        if let Gate::Change { .. } = gate {
            self.deliver_ready(now, sessions);
            for inst in std::mem::take(&mut self.retired) {
                for (s, have) in &inst.delivered {
                    if let Some(b) = inst.bound(*s) {
                        self.stats.flush_lost += b.saturating_sub(*have);
                    }
                }
                self.stats.beyond_bound +=
                    inst.waiting.values().map(|q| q.len() as u64).sum::<u64>();
                self.linger(now, inst);
            }
        }
    }

    /// Keeps a flushed instance's engine running for `flush_timeout`, so
    /// that members still flushing it can recover from this one; not when
    /// every reporter had delivered every source up to its bound when it
    /// reported (the reports are the same at every member): nobody needs a
    /// repair then, the usual case.
    fn linger(&mut self, now: Instant, mut inst: Instance) {
        let behind = inst.flush.as_ref().is_none_or(Flush::someone_behind);
        if !behind || inst.members.len() <= 1 || self.settings.flush_timeout.is_zero() {
            self.forget(inst.id);
            return;
        }
        inst.waiting.clear();
        inst.flush = None;
        self.lingering
            .push_back((inst, now + self.settings.flush_timeout));
        while self.lingering.len() > LINGER_MAX {
            if let Some((old, _)) = self.lingering.pop_front() {
                self.forget(old.id);
            }
        }
    }

    /// Lingering instances whose time is up are dropped.
    fn end_lingering(&mut self, now: Instant) {
        while self
            .lingering
            .front()
            .is_some_and(|(_, until)| *until <= now)
        {
            if let Some((old, _)) = self.lingering.pop_front() {
                self.forget(old.id);
            }
        }
    }

    fn forget(&mut self, id: u32) {
        self.gone.push_back(id);
        while self.gone.len() > GONE_MAX {
            self.gone.pop_front();
        }
        self.early.retain(|(i, _, _)| *i != id);
    }

    /// The trivial current instances end at a change point without a
    /// flush: their own messages (delivered at once) go to the sessions
    /// first.
    fn drop_trivial(&mut self, now: Instant, sessions: &mut Sessions) {
        if !self.current.iter().any(Instance::trivial) {
            return;
        }
        self.deliver_ready(now, sessions);
        let (trivial, kept): (Vec<Instance>, Vec<Instance>) = std::mem::take(&mut self.current)
            .into_iter()
            .partition(Instance::trivial);
        self.current = kept;
        for inst in trivial {
            if self.cut_due == Some(inst.id) {
                self.cut_due = None;
            }
            self.forget(inst.id);
        }
    }

    /// Retires the current instances at a change point: their reports go
    /// into the total order.
    fn retire(&mut self, now: Instant, sessions: &mut Sessions) {
        for inst in std::mem::take(&mut self.current) {
            self.retire_one(now, sessions, inst);
        }
        self.cut_due = None;
    }

    fn retire_one(&mut self, _now: Instant, sessions: &mut Sessions, mut inst: Instance) {
        let me = self.me.map(slot_of).unwrap_or(0);
        let mine = Report {
            sent: inst.next_seq,
            delivered: inst.delivered.clone(),
        };
        let delivered: Vec<(u32, u64)> = mine.delivered.iter().map(|(s, n)| (*s, *n)).collect();
        sessions.push_region_item(&Item::RegionFlush {
            instance: inst.id,
            cut: false,
            sent: inst.next_seq,
            delivered,
        });
        let alive: BTreeSet<NodeId> = self.view_members.iter().copied().collect();
        let settled = sessions.settled_daemons();
        let expected = inst
            .members
            .iter()
            .filter(|(s, d)| **s != me && alive.contains(d) && settled.contains(d))
            .map(|(s, _)| *s)
            .collect();
        let mut reports = BTreeMap::new();
        for (_, slot, r) in self.early_reports.iter().filter(|(i, _, _)| *i == inst.id) {
            reports.entry(*slot).or_insert_with(|| r.clone());
        }
        self.early_reports.retain(|(i, _, _)| *i != inst.id);
        reports.insert(me, mine.clone());
        let mut flush = Flush {
            mine,
            reports,
            expected,
            frozen: None,
        };
        flush.freeze();
        inst.flush = Some(flush);
        self.stats.flushes += 1;
        self.retired.push(inst);
    }

    /// Forgets every instance (this daemon left its group).
    fn reset(&mut self) {
        for inst in self
            .current
            .drain(..)
            .chain(self.retired.drain(..))
            .chain(self.lingering.drain(..).map(|(i, _)| i))
        {
            self.gone.push_back(inst.id);
        }
        self.gate = None;
        self.removed = false;
        self.view_members.clear();
        self.watch = None;
        self.applied_gseq = 0;
        self.cut_due = None;
        self.open_due.clear();
        self.early.clear();
        self.early_reports.clear();
        self.out.clear();
        self.group_out.clear();
    }

    /// Computes this daemon's region (and the instances of its `hybrid`
    /// groups) from the table and starts their instances.
    fn derive(&mut self, now: Instant, sessions: &Sessions) {
        let Some(me) = self.me else {
            return;
        };
        // Per group: its daemons (the table is in group order). `hybrid`
        // groups are left out of the regions: each gets its own instance.
        let mut sets: BTreeMap<NodeId, Vec<u64>> = BTreeMap::new();
        let mut count: BTreeMap<u64, usize> = BTreeMap::new();
        let mut hybrid: BTreeMap<u64, Vec<NodeId>> = BTreeMap::new();
        // Only daemons that hold the whole table take part: a joining
        // daemon creates instances only once it has it, so a group with a
        // member there is not carried until then (its `count` is above the
        // region's size).
        let settled = sessions.settled_daemons();
        sessions.for_each_group_daemon(|group, daemon| {
            let h = group_hash(group);
            *count.entry(h).or_default() += 1;
            if self.hybrid.contains(&h) {
                hybrid.entry(h).or_default().push(daemon);
            } else if settled.contains(&daemon) {
                sets.entry(daemon).or_default().push(h);
            }
        });
        if let Some(mine) = sets.get(&me) {
            let mut by_slot: BTreeMap<u32, NodeId> = BTreeMap::new();
            for (d, set) in &sets {
                if set == mine {
                    // Two incarnations of one slot: the newer (a larger id).
                    let e = by_slot.entry(slot_of(*d)).or_insert(*d);
                    *e = (*e).max(*d);
                }
            }
            let n = by_slot.len();
            let groups: Vec<u64> = mine
                .iter()
                .copied()
                .filter(|h| count.get(h) == Some(&n))
                .collect();
            self.start_instance(now, sessions, me, by_slot, groups, false);
        }
        for (h, daemons) in hybrid {
            // Carried only when every daemon of the group holds the table
            // and this daemon is one of them.
            if !daemons.contains(&me) || !daemons.iter().all(|d| settled.contains(d)) {
                continue;
            }
            let mut by_slot: BTreeMap<u32, NodeId> = BTreeMap::new();
            for d in daemons {
                let e = by_slot.entry(slot_of(d)).or_insert(d);
                *e = (*e).max(d);
            }
            self.start_instance(now, sessions, me, by_slot, vec![h], true);
        }
        // The region first: the sender looks there first.
        self.current.sort_by_key(|i| i.hybrid);
    }

    /// Starts an instance of the daemons `by_slot` for `groups`, unless this
    /// daemon (`me`) is not the member of its slot there.
    fn start_instance(
        &mut self,
        now: Instant,
        sessions: &Sessions,
        me: NodeId,
        by_slot: BTreeMap<u32, NodeId>,
        mut groups: Vec<u64>,
        hybrid: bool,
    ) {
        if by_slot.get(&slot_of(me)) != Some(&me) {
            return;
        }
        groups.sort_unstable();
        groups.dedup();
        groups.shrink_to_fit();
        let (local_at, local) = local_recipients(&groups, sessions);
        let id = instance_id(
            sessions.change_point(),
            self.derive_at,
            by_slot.values(),
            &groups,
        );
        // Two instances of this daemon under one id (a 32-bit hash of
        // different members or groups) would take each other's packets:
        // the later one is not started (its groups keep the total order).
        // Alike at every member: each derives the same instances in the
        // same order.
        if self.current.iter().any(|i| i.id == id) {
            return;
        }
        // The engine knows a group by its position in `groups`, the same at
        // every member (the id covers the list: members that derived
        // different lists never share an instance), so that neither end
        // searches for it per message.
        let view = RegionView {
            id: RegionId(id),
            view: 1,
            members: by_slot.keys().map(|s| NodeId(*s)).collect(),
            groups: (0..groups.len() as u32).map(GroupId).collect(),
        };
        let seed = u64::from(id) << 32 | u64::from(me.0);
        let Ok(engine) = Qsm::new(
            NodeId(slot_of(me)),
            &view,
            self.settings.engine.clone(),
            seed,
            now,
        ) else {
            return;
        };
        self.stats.instances += 1;
        let by_slot_len = by_slot.len();
        if by_slot_len > 1 {
            self.open_due.push(id);
        }
        let mut inst = Instance {
            id,
            hybrid,
            engine,
            members: by_slot,
            index: GroupIndex::new(&groups),
            groups,
            local_at,
            local,
            next_seq: 0,
            opens: BTreeSet::new(),
            confirmed: by_slot_len == 1,
            delivered: BTreeMap::new(),
            waiting: BTreeMap::new(),
            flush: None,
        };
        // What peers sent it before this daemon got here.
        let early: Vec<_> = self
            .early
            .iter()
            .filter(|(i, _, _)| *i == id)
            .cloned()
            .collect();
        self.early.retain(|(i, _, _)| *i != id);
        for (_, from, packet) in early {
            inst.engine.handle_datagram_bytes(now, from, &packet);
        }
        self.current.push(inst);
    }

    // ---- clients ---------------------------------------------------------------------

    /// A client frame. Returns it back when the sessions should take it
    /// (not a carried multicast, or one the region cannot take); a frame
    /// that must wait is kept. `order_idle`: none of this daemon's batches
    /// waits for or is in flight in the total order.
    pub fn client_frame(
        &mut self,
        now: Instant,
        sessions: &mut Sessions,
        session: SessionId,
        frame: Frame,
        order_idle: bool,
    ) -> Option<(SessionId, Frame)> {
        let orders = matches!(
            frame,
            Frame::Multicast { .. }
                | Frame::MulticastExt { .. }
                | Frame::Join { .. }
                | Frame::Leave { .. }
        );
        if !orders {
            return Some((session, frame));
        }
        // A gate (flush or cut) does not hold client frames: during a flush
        // there is no current instance and they go by the total order,
        // behind this daemon's FLUSH item, which receivers apply only after
        // the retired instance's messages. (Holding them starved clients
        // while flushes followed one another, under `safe` traffic.)
        if !self.held.is_empty() {
            self.held.push_back((session, frame));
            return None;
        }
        self.route(now, sessions, session, frame, order_idle)
    }

    /// Frames held (the engine's send buffer full) go on while they can. Returns
    /// those for the sessions, in order.
    pub fn release_held(
        &mut self,
        now: Instant,
        sessions: &mut Sessions,
        order_idle: bool,
    ) -> Vec<(SessionId, Frame)> {
        let mut out = Vec::new();
        let mut idle = order_idle;
        while let Some((session, frame)) = self.held.pop_front() {
            match self.route(now, sessions, session, frame, idle) {
                Some(f) => {
                    // Handed to the sessions: batches wait from now on.
                    idle = false;
                    out.push(f);
                }
                None if self.held.front().is_some() && !self.engine_can_send() => break,
                None => {}
            }
        }
        out
    }

    /// Whether every current engine takes a message (held frames wait
    /// while one is full: they go in order).
    fn engine_can_send(&self) -> bool {
        !self.current.is_empty() && self.current.iter().all(|i| i.engine.can_send())
    }

    fn route(
        &mut self,
        now: Instant,
        sessions: &mut Sessions,
        session: SessionId,
        frame: Frame,
        order_idle: bool,
    ) -> Option<(SessionId, Frame)> {
        let (service, flags, mess_type, groups, payload) = match &frame {
            Frame::Multicast {
                service,
                groups,
                payload,
            } => (*service, 0, 0, groups, payload),
            Frame::MulticastExt {
                service,
                flags,
                mess_type,
                groups,
                payload,
            } => (*service, *flags, *mess_type, groups, payload),
            _ => return Some((session, frame)),
        };
        if !self.settings.carries(service) {
            return self.ordered(sessions, session, frame);
        }
        // Borrowed, not copied: a String per message was one of the
        // allocations on this path.
        let Some(client) = sessions.private_group(session) else {
            return Some((session, frame));
        };
        let encoded = self.eligible(
            order_idle,
            client,
            service,
            (flags, mess_type),
            groups,
            payload,
        );
        let Some((at, group, bytes)) = encoded else {
            self.stats.ordered_instead += 1;
            return self.ordered(sessions, session, frame);
        };
        let inst = &mut self.current[at];
        if self.cut_due.is_some_and(|id| id != inst.id) {
            // This daemon's messages went by another instance since the
            // last cut: this one goes by the total order behind a CUT of
            // it, and the next ones by this instance after it (FIFO per
            // sender across instances, as across a region and the order).
            self.stats.ordered_instead += 1;
            self.stats.instance_switches += 1;
            return self.ordered(sessions, session, frame);
        }
        if !inst.engine.can_send() {
            self.held.push_front((session, frame));
            return None;
        }
        match inst.engine.multicast_to(now, GroupId(group), bytes) {
            Ok(seq) => {
                inst.next_seq = seq + 1;
                self.cut_due = Some(inst.id);
                self.stats.messages_sent += 1;
                if inst.hybrid {
                    self.stats.hybrid_sent += 1;
                }
                None
            }
            Err(_) => {
                self.held.push_front((session, frame));
                None
            }
        }
    }

    /// A frame for the total order: a multicast after region messages goes
    /// behind a CUT.
    fn ordered(
        &mut self,
        sessions: &mut Sessions,
        session: SessionId,
        frame: Frame,
    ) -> Option<(SessionId, Frame)> {
        let message = matches!(frame, Frame::Multicast { .. } | Frame::MulticastExt { .. });
        if message {
            if let Some(id) = self.cut_due.take() {
                if let Some(inst) = self.current.iter().find(|i| i.id == id) {
                    sessions.push_region_item(&Item::RegionFlush {
                        instance: inst.id,
                        cut: true,
                        sent: inst.next_seq,
                        delivered: Vec::new(),
                    });
                    self.stats.cuts_sent += 1;
                }
            }
        }
        Some((session, frame))
    }

    /// The region payload of a multicast an instance can carry: the
    /// instance (its place in `current`), the position of the message's
    /// first group in the instance's list (the engine's group id), and
    /// `after_gseq u64` then a batch of one MESSAGE item. Every group must
    /// be carried by that one instance.
    fn eligible(
        &self,
        order_idle: bool,
        client: &str,
        service: Service,
        (flags, mess_type): (u8, u16),
        groups: &[String],
        payload: &[u8],
    ) -> Option<(usize, u32, Bytes)> {
        if !order_idle || groups.is_empty() {
            return None;
        }
        let mut found: Option<(usize, u32)> = None;
        for g in groups {
            if g.starts_with('#') {
                return None;
            }
            let h = group_hash(g);
            match found {
                Some((at, _)) => {
                    let inst = &self.current[at];
                    inst.index.find(h)?;
                }
                None => {
                    found = self.current.iter().enumerate().find_map(|(at, inst)| {
                        let i = inst.index.find(h)?;
                        Some((at, i as u32))
                    });
                    found?;
                }
            }
        }
        let (at, first) = found?;
        if !self.current[at].confirmed {
            return None;
        }
        let item = Item::Message {
            client,
            service: service as u8,
            flags,
            mess_type,
            groups: groups.iter().map(String::as_str).collect(),
            payload,
        };
        let len = 8 + 2 + item.encoded_len();
        if len + DATA_OVERHEAD > self.datagram_max {
            return None;
        }
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(&self.applied_gseq.to_be_bytes());
        bytes.extend_from_slice(&1u16.to_be_bytes());
        item.encode(&mut bytes).ok()?;
        Some((at, first, Bytes::from(bytes)))
    }

    // ---- deliveries ------------------------------------------------------------------

    /// Hands the engines' deliveries to the sessions as their dependencies
    /// allow. Returns whether any went.
    pub fn deliver_ready(&mut self, _now: Instant, sessions: &mut Sessions) -> bool {
        let mut any = false;
        for instance in std::mem::take(&mut self.open_due) {
            if self.current.iter().any(|i| i.id == instance) {
                sessions.push_region_item(&Item::RegionFlush {
                    instance,
                    cut: true,
                    sent: 0,
                    delivered: Vec::new(),
                });
                any = true;
            }
        }
        let applied = self.applied_gseq;
        let stats = &mut self.stats;
        for inst in self.retired.iter_mut().chain(self.current.iter_mut()) {
            while let Some(qsm::Event::Deliver {
                source,
                seq,
                group,
                payload,
                ..
            }) = inst.engine.poll_event()
            {
                inst.waiting
                    .entry(source.0)
                    .or_default()
                    .push_back(Waiting {
                        seq,
                        group: group.0,
                        payload,
                    });
            }
            any |= drain_waiting(inst, applied, sessions, stats);
        }
        // Flushed: what a lingering engine still delivers is past its
        // bounds (or below them, and delivered already).
        for (inst, _) in self.lingering.iter_mut() {
            while inst.engine.poll_event().is_some() {}
        }
        any
    }

    // ---- datagrams -------------------------------------------------------------------

    /// Whether `datagram` is QSM's (kinds 30-35).
    pub fn is_qsm(datagram: &[u8]) -> bool {
        matches!(packets(datagram).next(), Some(Ok((_, Packet::Qsm { .. }))))
    }

    /// A QSM datagram: each packet goes to the instance its region field
    /// names.
    pub fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &Bytes) {
        let mut at = 0;
        for packet in packets(datagram) {
            let Ok((header, Packet::Qsm { body, .. })) = packet else {
                self.stats.bad_datagrams += 1;
                return;
            };
            let len = HEADER_LEN + header.body_len;
            let bytes = datagram.slice(at..at + len);
            at += len;
            let Some(id) = body
                .get(..4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            else {
                self.stats.bad_datagrams += 1;
                continue;
            };
            let from = NodeId(slot_of(from));
            if let Some(inst) = self
                .current
                .iter_mut()
                .chain(self.retired.iter_mut())
                .chain(self.lingering.iter_mut().map(|(i, _)| i))
                .find(|i| i.id == id)
            {
                inst.engine.handle_datagram_bytes(now, from, &bytes);
            } else if self.gone.contains(&id) || self.early.len() >= self.settings.early_max {
                self.stats.early_dropped += 1;
            } else {
                self.early.push_back((id, from, bytes));
            }
        }
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.end_lingering(now);
        let lingering = self.lingering.iter_mut().map(|(i, _)| i);
        for inst in self
            .current
            .iter_mut()
            .chain(self.retired.iter_mut())
            .chain(lingering)
        {
            if inst.engine.poll_timeout().is_some_and(|t| t <= now) {
                inst.engine.handle_timeout(now);
            }
        }
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let gate = match self.gate {
            Some(Gate::Change { since } | Gate::Cut { since, .. }) => {
                Some(since + self.settings.flush_timeout)
            }
            None => None,
        };
        let linger_end = self.lingering.front().map(|(_, until)| *until);
        self.current
            .iter()
            .chain(self.retired.iter())
            .chain(self.lingering.iter().map(|(i, _)| i))
            .filter_map(|i| i.engine.poll_timeout())
            .chain(gate)
            .chain(linger_end)
            .min()
    }

    /// The next datagram: the engines' packets, packed per destination up
    /// to the datagram size, an engine multicast sent to each other member.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if self.out.is_empty() {
            self.pack(now);
        }
        self.out.pop_front()
    }

    fn pack(&mut self, now: Instant) {
        let me = self.me;
        let max = self.datagram_max;
        // Open datagrams per destination: a short list, searched, and
        // sorted at the end to go out in the order a map would give (a
        // map's node, and a list of destinations per packet, cost
        // allocations per message).
        let mut open: Vec<(NodeId, Vec<u8>)> = Vec::new();
        let mut open_groups: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
        let mut out = Vec::new();
        let settings = &self.settings;
        let lingering = self.lingering.iter_mut().map(|(i, _)| i);
        for inst in self
            .current
            .iter_mut()
            .chain(self.retired.iter_mut())
            .chain(lingering)
        {
            // Confirmed: every member joined the address before its OPEN
            // came back in the order (the driver joins in the turn that
            // derived the instance).
            let group = settings
                .region_group(inst.id)
                .filter(|_| inst.confirmed && inst.members.len() > 1);
            while let Some(t) = inst.engine.poll_transmit(now) {
                if let (Destination::Multicast, Some(g)) = (t.destination, group) {
                    let buf = open_buffer(&mut open_groups, g);
                    if !buf.is_empty() && buf.len() + t.payload.len() > max {
                        self.group_out.push_back(GroupTransmit {
                            group: g,
                            payload: Bytes::from(std::mem::take(buf)),
                        });
                        self.stats.group_datagrams += 1;
                    }
                    buf.extend_from_slice(&t.payload);
                    continue;
                }
                let one = match t.destination {
                    Destination::Node(slot) => Some(inst.members.get(&slot.0).copied()),
                    Destination::Multicast => None,
                };
                let all = one
                    .is_none()
                    .then(|| inst.members.values().copied().filter(|d| Some(*d) != me));
                for d in one.flatten().into_iter().chain(all.into_iter().flatten()) {
                    let buf = open_buffer(&mut open, d);
                    if !buf.is_empty() && buf.len() + t.payload.len() > max {
                        out.push(Transmit {
                            destination: Destination::Node(d),
                            payload: Bytes::from(std::mem::take(buf)),
                        });
                    }
                    buf.extend_from_slice(&t.payload);
                }
            }
        }
        open.sort_unstable_by_key(|(d, _)| *d);
        open_groups.sort_unstable_by_key(|(g, _)| *g);
        for (d, buf) in open {
            if !buf.is_empty() {
                out.push(Transmit {
                    destination: Destination::Node(d),
                    payload: Bytes::from(buf),
                });
            }
        }
        for (g, buf) in open_groups {
            if !buf.is_empty() {
                self.group_out.push_back(GroupTransmit {
                    group: g,
                    payload: Bytes::from(buf),
                });
                self.stats.group_datagrams += 1;
            }
        }
        self.out.extend(out);
    }

    /// The next datagram for a region's IP multicast address.
    pub fn poll_group_transmit(&mut self, now: Instant) -> Option<GroupTransmit> {
        if self.group_out.is_empty() && self.out.is_empty() {
            self.pack(now);
        }
        self.group_out.pop_front()
    }

    /// The next IP multicast group to join or leave: the addresses of the
    /// instances of more than one member this daemon runs (current, being
    /// flushed, lingering), against those joined.
    pub fn poll_group_change(&mut self) -> Option<GroupChange> {
        self.settings.multicast?;
        let wanted: BTreeSet<SocketAddr> = self
            .current
            .iter()
            .chain(self.retired.iter())
            .chain(self.lingering.iter().map(|(i, _)| i))
            .filter(|i| i.members.len() > 1)
            .filter_map(|i| self.settings.region_group(i.id))
            .collect();
        if let Some(g) = self.joined.iter().find(|g| !wanted.contains(g)).copied() {
            self.joined.remove(&g);
            return Some(GroupChange::Leave(g));
        }
        let g = wanted.into_iter().find(|g| !self.joined.contains(g))?;
        self.joined.insert(g);
        Some(GroupChange::Join(g))
    }
}

/// The open datagram for `key` in `open`, made empty if there is none.
fn open_buffer<K: PartialEq>(open: &mut Vec<(K, Vec<u8>)>, key: K) -> &mut Vec<u8> {
    let at = match open.iter().position(|(k, _)| *k == key) {
        Some(at) => at,
        None => {
            open.push((key, Vec::new()));
            open.len() - 1
        }
    };
    &mut open[at].1
}

/// Hands an instance's waiting deliveries on while each may go: its
/// sender's order point applied, and within the flush bound of a retired
/// instance (beyond this daemon's own report only once the bound is known).
/// Each source's queue goes on by itself.
fn drain_waiting(
    inst: &mut Instance,
    applied: u64,
    sessions: &mut Sessions,
    stats: &mut RegionStats,
) -> bool {
    let mut any = false;
    // Source by source in order, without collecting the keys (an
    // allocation per call).
    let mut from = 0;
    while let Some(source) = inst.waiting.range(from..).next().map(|(s, _)| *s) {
        any |= drain_source(inst, source, applied, sessions, stats);
        match source.checked_add(1) {
            Some(next) => from = next,
            None => break,
        }
    }
    // Emptied queues stay (one per source at most): removing one and
    // making it again for the next message cost an allocation per message.
    any
}

fn drain_source(
    inst: &mut Instance,
    source: u32,
    applied: u64,
    sessions: &mut Sessions,
    stats: &mut RegionStats,
) -> bool {
    let mut any = false;
    while let Some(w) = inst.waiting.get(&source).and_then(VecDeque::front) {
        let have = inst.delivered.get(&source).copied().unwrap_or(0);
        let seq = w.seq;
        let after = w
            .payload
            .get(..8)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
        let queue = inst.waiting.get_mut(&source).expect("present");
        if seq < have {
            queue.pop_front();
            continue;
        }
        if let Some(f) = &inst.flush {
            let reported = f.mine.delivered.get(&source).copied().unwrap_or(0);
            if seq >= reported {
                match inst.bound(source) {
                    None => break,
                    Some(b) if seq >= b => {
                        // Beyond the agreed end of a gone source: dropped.
                        inst.waiting.get_mut(&source).expect("present").pop_front();
                        stats.beyond_bound += 1;
                        continue;
                    }
                    Some(_) => {}
                }
            }
        }
        let queue = inst.waiting.get_mut(&source).expect("present");
        let Some(after) = after else {
            queue.pop_front();
            stats.bad_datagrams += 1;
            continue;
        };
        if after > applied {
            break;
        }
        let w = queue.pop_front().expect("front");
        let first = w.group;
        inst.delivered.insert(source, w.seq + 1);
        any = true;
        let Ok(items) = groups::decode(&w.payload[8..]) else {
            stats.bad_datagrams += 1;
            continue;
        };
        for item in items {
            if let Item::Message {
                client,
                service,
                flags,
                mess_type,
                groups,
                payload,
            } = item
            {
                stats.messages_delivered += 1;
                match inst.recipients(&groups, first) {
                    Some(to) => sessions.deliver_region_to(
                        to,
                        client,
                        service,
                        (flags, mess_type),
                        &groups,
                        payload,
                    ),
                    // Not a group of this instance (no member sends one):
                    // the sessions look its members up.
                    None => sessions.deliver_region(
                        client,
                        service,
                        (flags, mess_type),
                        &groups,
                        payload,
                    ),
                }
            }
        }
    }
    any
}

/// Whether applying `item` changes the group table.
fn changes_table(item: &Item<'_>) -> bool {
    matches!(
        item,
        Item::Join { .. }
            | Item::Leave { .. }
            | Item::Gone { .. }
            | Item::Goodbye
            | Item::Snapshot { .. }
            | Item::Table { .. }
    )
}

/// Positions of group hashes in an instance's list: an open-addressing
/// table of (hash, position) slots (position `u32::MAX`: empty), about 1.5
/// slots per group, indexed by the top bits of the hash mixed once more
/// (FNV-1a's top bits cluster for names that differ in their last
/// characters, such as `g00000`..`g09999`: indexed by them directly, the
/// probes ran long and a lookup cost more than the binary search), probed
/// linearly. A slot holds the hash itself, so a lookup reads one slot (its
/// neighbours are on the same cache line) and nothing else: when slots
/// held only the position, the list entry it named was a second read, and
/// at 10,000 groups each of the two was a cache miss on the sender's path
/// (`perf annotate` of `Regions::route`). Only looked up, never iterated.
#[derive(Debug, Default)]
struct GroupIndex {
    slots: Vec<Slot>,
    /// 64 minus log2 of the number of slots.
    shift: u32,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: u64,
    at: u32,
}

const EMPTY: Slot = Slot {
    hash: 0,
    at: u32::MAX,
};

impl GroupIndex {
    fn new(groups: &[u64]) -> GroupIndex {
        if groups.is_empty() {
            return GroupIndex::default();
        }
        let size = (groups.len() + groups.len() / 2 + 1).next_power_of_two();
        let shift = 64 - size.trailing_zeros();
        let mut slots = vec![EMPTY; size];
        for (i, &h) in groups.iter().enumerate() {
            let mut at = Self::home(h, shift);
            while slots[at].at != u32::MAX {
                at = (at + 1) & (size - 1);
            }
            slots[at] = Slot {
                hash: h,
                at: i as u32,
            };
        }
        GroupIndex { slots, shift }
    }

    fn home(h: u64, shift: u32) -> usize {
        // splitmix64's finaliser: every bit of `h` reaches the top bits.
        let mut x = h;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        // A table of one slot has shift 64: `>>` by 64 would overflow.
        x.checked_shr(shift).unwrap_or(0) as usize
    }

    /// Slots read to find `h` (present or not): the test's measure of
    /// clustering.
    #[cfg(test)]
    fn probes(&self, h: u64) -> usize {
        let mask = self.slots.len() - 1;
        let mut at = Self::home(h, self.shift);
        let mut n = 1;
        while self.slots[at].at != u32::MAX && self.slots[at].hash != h {
            at = (at + 1) & mask;
            n += 1;
        }
        n
    }

    /// The position of `h` in the list this index was built from, if
    /// present.
    fn find(&self, h: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut at = Self::home(h, self.shift);
        loop {
            let slot = self.slots[at];
            if slot.at == u32::MAX {
                return None;
            }
            if slot.hash == h {
                return Some(slot.at as usize);
            }
            at = (at + 1) & mask;
        }
    }
}

/// The local recipients of each of `groups` (ascending hashes), as offsets
/// into one list of sessions.
fn local_recipients(groups: &[u64], sessions: &Sessions) -> (Vec<u32>, Vec<SessionId>) {
    let mut pairs: Vec<(usize, SessionId)> = Vec::new();
    sessions.for_each_local_member(|group, session| {
        if let Ok(i) = groups.binary_search(&group_hash(group)) {
            pairs.push((i, session));
        }
    });
    pairs.sort_unstable();
    pairs.dedup();
    let mut at = Vec::with_capacity(groups.len() + 1);
    let mut local = Vec::with_capacity(pairs.len());
    let mut next = pairs.iter().peekable();
    for i in 0..groups.len() {
        at.push(local.len() as u32);
        while let Some((_, s)) = next.next_if(|(j, _)| *j == i) {
            local.push(*s);
        }
    }
    at.push(local.len() as u32);
    (at, local)
}

/// A group name's 64-bit FNV-1a hash: how regions name groups (a collision
/// between two groups' names, about 1 in 10^11 pairs at 10,000 groups,
/// would let a message of one go by the other's region).
pub fn group_hash(name: &str) -> u64 {
    fnv(0xcbf2_9ce4_8422_2325, name.as_bytes())
}

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// An instance's id on the wire: a hash of the view-change counter, the
/// global sequence number of the event after which it was created (two
/// instances of one table, one after a flush that changed nothing, differ),
/// its members and its groups (whose positions the engine uses as group
/// ids).
fn instance_id<'a>(
    change_point: u64,
    gseq: u64,
    members: impl Iterator<Item = &'a NodeId>,
    groups: &[u64],
) -> u32 {
    let mut h = fnv(0xcbf2_9ce4_8422_2325, &change_point.to_be_bytes());
    h = fnv(h, &gseq.to_be_bytes());
    for m in members {
        h = fnv(h, &m.0.to_be_bytes());
    }
    for g in groups {
        h = fnv(h, &g.to_be_bytes());
    }
    (h ^ (h >> 32)) as u32
}

#[cfg(test)]
mod tests;
