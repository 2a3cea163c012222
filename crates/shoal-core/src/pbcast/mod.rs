//! Bimodal Multicast ("pbcast"): P001 §B (Ozkasap, Xiao, Birman, "Scalability
//! of Two Reliable Multicast Protocols") and P000 §3 (Gupta, Birman, van
//! Renesse, "Fighting fire with fire").
//!
//! Two phases:
//!
//! 1. **Unreliable dissemination.** A new message goes out once, by IP
//!    multicast when the transport offers it (`Config::ip_multicast`),
//!    otherwise by a unicast fan-out to every member, or down a unicast
//!    relay tree rooted at the source (`Config::relay_fanout`). Receivers
//!    buffer it.
//! 2. **Anti-entropy gossip.** Every round (100 ms, not synchronised across
//!    members) a member picks one member at random and sends it a *digest* of
//!    its buffer: per source, the ranges of sequence numbers it holds. The
//!    receiver *pulls* (solicits) what the gossiper holds and it lacks, and
//!    *pushes* young messages the gossiper lacks (P000 §3: push for young,
//!    pull for old). Retransmissions are unicast and limited per round.
//!
//! Messages are collected `gc_rounds` rounds after they arrived (P001 §C: about
//! 1 s). Delivery is FIFO per source or unordered. A gap that can no longer be
//! repaired (known for `lost_after_rounds` rounds, and at least
//! `lost_evidence_min` digests since showed the gossiper no longer held it)
//! becomes an explicit [`Event::Lost`]: the application is never left
//! guessing.
//!
//! Flow control is Shoal's addition (the papers simulate fixed rates):
//! receivers report their progress to each source with small STATUS packets,
//! and a source keeps at most `send_window` messages beyond the lowest
//! progress among members it heard from recently. A silent member stops
//! counting after `flow_silence_timeout`, so one perturbed member does not
//! stall the group.

mod config;
mod hierarchy;
mod log;
mod outbox;
mod sources;

pub use config::{Config, ConfigError, Delivery, GossipMode, MulticastRepair, MIN_DATAGRAM_SIZE};
pub use hierarchy::{GossipTree, TreeTargets};

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_wire::{Packet, SeqRange, SourceRanges};

use crate::engine::{Destination, Engine, MemberList, NodeId, SendError, Transmit};

/// What one digest makes a member solicit of one source: first asks, and
/// asks again.
type Pulled = (Option<SourceRanges>, Option<SourceRanges>);
use crate::ranges::RangeBuilder;
use crate::time::Instant;
use log::{Inserted, Ready, SourceLog};
use outbox::{Control, Outbox};
use sources::{Logs, Progress, Progresses};

/// What a pbcast member tells its application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message, delivered once.
    Deliver {
        source: NodeId,
        seq: u64,
        payload: Bytes,
        /// It came by a retransmission (gossip repair), not the first phase.
        recovered: bool,
    },
    /// These messages of `source` can no longer be repaired: they were
    /// collected everywhere this member asked. Never silence.
    Lost { source: NodeId, range: SeqRange },
}

/// Counters of one member. Packet counters are indexed by `Kind::index()`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub packets_sent: [u64; shoal_wire::KIND_COUNT],
    pub packets_received: [u64; shoal_wire::KIND_COUNT],
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub bytes_sent: u64,
    /// Datagrams refused: bad encoding, a spoofed or unknown sender.
    pub malformed: u64,
    /// Messages this member multicast.
    pub originated: u64,
    /// Messages delivered to the application (including its own).
    pub delivered: u64,
    /// Of those, the ones that arrived by retransmission.
    pub recovered: u64,
    pub duplicates: u64,
    /// Messages reported in `Lost` events.
    pub lost: u64,
    /// Retransmissions sent by IP multicast (pbcast-IPMC, pbcast-grb).
    pub retransmits_multicast: u64,
    /// Retransmissions pushed to a gossiper that lacked them (unsolicited).
    pub retransmits_pushed: u64,
    /// Retransmissions not sent because the round's budget was spent.
    pub retransmits_suppressed: u64,
    pub gossip_rounds: u64,
}

/// How far past the known end one packet may extend a source's log: bounds
/// the memory a forged or corrupt sequence number can claim.
const LOG_EXTENSION_MAX: u64 = 1 << 20;

/// One pbcast member.
///
/// Laid out in declaration order (`repr(C)`), the fields every datagram
/// and timer reads first: in a simulated group of 10^4 members no
/// member's engine is in cache when its next datagram comes, and each
/// cache line of it touched is a miss, so the clock, the member list, the
/// inline log of the (usually single) source, the busy and gappy sets,
/// the event queue and the counters sit together at the start rather than
/// wherever the compiler put them. The order decides nothing else.
#[repr(C)]
pub struct Pbcast {
    last_now: Instant,
    next_round: Instant,
    next_status: Instant,
    my_index: usize,
    me: NodeId,
    retransmit_budget: u32,
    /// Sorted, deduplicated (shared with the other engines of the view);
    /// its positions index `logs` and `progress`.
    members: MemberList,
    /// Logs of the sources this member has heard of.
    logs: Logs,
    /// Sources whose log is not idle, and those with gaps: in a large group
    /// most members never send, and a round or a digest must not cost O(n).
    busy: BTreeSet<usize>,
    gappy: BTreeSet<usize>,
    events: VecDeque<Event>,
    stats: Stats,
    config: Config,
    rng: Xoshiro256PlusPlus,
    /// Flow-control progress of the members that reported some.
    progress: Progresses,
    outbox: Outbox,
    /// How gossip targets are chosen: uniformly, or weighted (hierarchical
    /// gossip).
    targets: Targets,
    /// Solicitations received in the current window, per message, and when
    /// the first came (pbcast-IPMC).
    solicitations: BTreeMap<Key, (u32, Instant)>,
    /// Messages retransmitted by multicast in the current window, and when.
    multicast_recently: BTreeMap<Key, Instant>,
    /// Recently retransmitted messages (pbcast-grb's repair bits).
    repair_bits: BTreeMap<Key, RepairBit>,
    /// First-phase messages new to this member in the datagram being
    /// handled, to pass on down their source's relay tree.
    relay_new: Vec<Key>,
    /// How long repairs take to answer a solicitation here.
    repair_rtt: RoundTrip,
    /// How long a push takes to follow the digest that invited it.
    push_rtt: RoundTrip,
}

/// RFC 6298's estimator of a round trip: smoothed mean and mean deviation,
/// empty until the first sample.
#[derive(Debug, Clone, Copy, Default)]
struct RoundTrip {
    smoothed: Option<(Duration, Duration)>,
}

impl RoundTrip {
    fn sample(&mut self, rtt: Duration) {
        self.smoothed = Some(match self.smoothed {
            None => (rtt, rtt / 2),
            Some((srtt, rttvar)) => {
                let deviation = srtt.abs_diff(rtt);
                (srtt * 7 / 8 + rtt / 8, rttvar * 3 / 4 + deviation / 4)
            }
        });
    }

    /// srtt + 4 × rttvar, within `[min, max]`; `min` before any sample.
    fn timeout(&self, min: Duration, max: Duration) -> Duration {
        self.smoothed
            .map_or(min, |(srtt, rttvar)| (srtt + rttvar * 4).clamp(min, max))
    }
}

/// (source index, sequence number).
type Key = (usize, u64);

/// How a member chooses whom to gossip to.
enum Targets {
    /// Uniformly among the other members.
    Uniform,
    /// Cumulative weights by member index ([`Pbcast::set_gossip_weights`]).
    PerMember(Vec<f64>),
    /// Weights per distance class in a shared tree
    /// ([`Pbcast::set_gossip_tree`]).
    Tree(Box<TreeTargets>),
}

/// How a message reached this member.
#[derive(Clone, Copy)]
enum Via {
    /// IP multicast or the relay tree.
    FirstPhase,
    /// A retransmission answering a solicitation (this member's, or by
    /// multicast another's) from member `by`.
    Answer { by: usize },
    /// Pushed by member `by`, whom this member's digest showed the gap.
    Push { by: usize },
}

impl Via {
    fn repaired_by(self) -> Option<usize> {
        match self {
            Via::FirstPhase => None,
            Via::Answer { by } | Via::Push { by } => Some(by),
        }
    }
}

/// What one digest says of one source: the ranges it holds, the runs it
/// lacks beyond them, and the missing messages whose push it awaits.
struct Advert {
    source: usize,
    held: Vec<SeqRange>,
    lacking: Vec<SeqRange>,
    awaited: Vec<SeqRange>,
}

#[derive(Clone, Copy)]
enum AdvertList {
    Held,
    Lacking,
    Awaited,
}

impl Advert {
    fn new(source: usize) -> Advert {
        Advert {
            source,
            held: Vec::new(),
            lacking: Vec::new(),
            awaited: Vec::new(),
        }
    }

    fn list(&mut self, which: AdvertList) -> &mut Vec<SeqRange> {
        match which {
            AdvertList::Held => &mut self.held,
            AdvertList::Lacking => &mut self.lacking,
            AdvertList::Awaited => &mut self.awaited,
        }
    }
}

/// What a member knows of a message's recent unicast retransmissions.
#[derive(Debug, Clone, Copy, Default)]
struct RepairBit {
    /// When this member last sent one (it gossips these).
    sent: Option<Instant>,
    /// When it last heard, by gossip, that another member sent one.
    heard: Option<Instant>,
}

impl RepairBit {
    fn latest(&self) -> Option<Instant> {
        self.sent.max(self.heard)
    }
}

impl Pbcast {
    /// A member `me` of the static group `members` (which must contain `me`).
    /// `seed` drives every random choice; `now` is the creation time.
    pub fn new(
        me: NodeId,
        members: &[NodeId],
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<Pbcast, ConfigError> {
        Pbcast::with_members(me, MemberList::new(members), config, seed, now)
    }

    /// As [`Pbcast::new`], sharing `members` with whoever else holds it (a
    /// simulator's thousands of engines of one view): the engine keeps no
    /// state per member until that member sends or reports to it.
    pub fn with_members(
        me: NodeId,
        members: MemberList,
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<Pbcast, ConfigError> {
        config.validate()?;
        let my_index = members.index_of(me).ok_or(ConfigError::NotAMember(me.0))?;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        // Rounds are not synchronised across members (P001 §B).
        let first_round = now + config.gossip_interval.mul_f64(rng.random::<f64>());
        let mut logs = Logs::new(true);
        logs.insert(my_index, SourceLog::default());
        Ok(Pbcast {
            me,
            my_index,
            members,
            rng,
            logs,
            busy: BTreeSet::new(),
            gappy: BTreeSet::new(),
            progress: Progresses::new(now),
            outbox: Outbox::default(),
            events: VecDeque::new(),
            stats: Stats::default(),
            last_now: now,
            next_round: first_round,
            next_status: now + config.status_interval,
            retransmit_budget: config.retransmits_per_round_max,
            repair_rtt: RoundTrip::default(),
            push_rtt: RoundTrip::default(),
            targets: Targets::Uniform,
            solicitations: BTreeMap::new(),
            multicast_recently: BTreeMap::new(),
            repair_bits: BTreeMap::new(),
            relay_new: Vec::new(),
            config,
        })
    }

    /// A member joining a group whose members are already sending: it
    /// receives their messages from the first one that reaches it onwards
    /// (the layer above transfers earlier state).
    pub fn new_joining(
        me: NodeId,
        members: &[NodeId],
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<Pbcast, ConfigError> {
        let mut engine = Pbcast::new(me, members, config, seed, now)?;
        // Every other source's log starts unanchored; this member's own
        // log (created at construction) stays anchored at 0.
        let own = std::mem::take(engine.logs.entry(engine.my_index));
        engine.logs = Logs::new(false);
        engine.logs.insert(engine.my_index, own);
        Ok(engine)
    }

    /// Replaces the member list (a new view). Members that stay keep their
    /// state; new members start with an empty log from sequence number 0
    /// (they are new senders); removed members' messages are forgotten.
    /// Gossip weights are reset to uniform.
    pub fn set_members(&mut self, now: Instant, members: &[NodeId]) -> Result<(), ConfigError> {
        let members = MemberList::new(members);
        let my_index = members
            .index_of(self.me)
            .ok_or(ConfigError::NotAMember(self.me.0))?;
        let old = std::mem::replace(&mut self.members, members);
        let new_index = |source: usize| self.members.index_of(old[source]);
        self.logs.remap(new_index);
        self.progress.remap(new_index);
        // Members new to this view: a log from 0 (they are new senders) and
        // progress heard now. Members that stay without an entry keep the
        // empty log and the progress they had.
        let joined = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| old.index_of(**m).is_none())
            .map(|(i, _)| i);
        for i in joined {
            if !self.logs.absent_anchored() {
                self.logs.insert(i, SourceLog::default());
            }
            self.progress.insert(
                i,
                Progress {
                    next: 0,
                    heard: now,
                },
            );
        }
        let remap = |(source, seq): Key| new_index(source).map(|n| (n, seq));
        self.solicitations = remap_keys(std::mem::take(&mut self.solicitations), remap);
        self.multicast_recently = remap_keys(std::mem::take(&mut self.multicast_recently), remap);
        self.repair_bits = remap_keys(std::mem::take(&mut self.repair_bits), remap);
        self.outbox.retransmits.retain_mut(|r| {
            let moved = new_index(r.source as usize);
            r.source = moved.unwrap_or(0) as u32;
            moved.is_some()
        });
        self.my_index = my_index;
        self.targets = Targets::Uniform;
        self.retrack_all();
        Ok(())
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// How long this member now waits before asking again for a message it
    /// solicited: `solicit_retry`, stretched to the measured repair round
    /// trip up to `solicit_retry_max`.
    pub fn solicit_retry(&self) -> Duration {
        self.repair_rtt
            .timeout(self.config.solicit_retry, self.config.solicit_retry_max)
    }

    pub fn members(&self) -> &[NodeId] {
        &self.members
    }

    /// Flow control allows a multicast now.
    pub fn can_send(&self, now: Instant) -> bool {
        let Some(window) = self.config.send_window else {
            return true;
        };
        let next = self.logs.get(self.my_index).end();
        next - self.slowest_recent_progress(now).min(next) < u64::from(window.get())
    }

    /// Lowest progress reported by a member heard from recently.
    fn slowest_recent_progress(&self, now: Instant) -> u64 {
        let others = self.members.len() - 1;
        self.progress
            .slowest_recent(others, now, self.config.flow_silence_timeout)
            .unwrap_or(u64::MAX)
    }

    /// Hierarchical gossip (P001 §D): pick gossip targets with these weights
    /// instead of uniformly. Members left out get weight 0; this member's own
    /// weight is ignored. See [`hierarchical_weights`].
    pub fn set_gossip_weights(&mut self, weights: &[(NodeId, f64)]) -> Result<(), ConfigError> {
        let mut by_index = vec![0.0; self.members.len()];
        for &(node, weight) in weights {
            if !(weight.is_finite() && weight >= 0.0) {
                return Err(ConfigError::BadWeight(node.0));
            }
            if let Some(i) = self.index_of(node).filter(|i| *i != self.my_index) {
                by_index[i] = weight;
            }
        }
        let mut total = 0.0;
        let cumulative = by_index
            .into_iter()
            .map(|w| {
                total += w;
                total
            })
            .collect();
        self.targets = Targets::PerMember(cumulative);
        Ok(())
    }

    /// Hierarchical gossip (P001 §D) held per distance class: a member at
    /// hop distance `d` in `tree` weighs `base^-d` (`base`: the tree's
    /// branching factor, P001's `k`), as with [`hierarchical_weights`],
    /// but this member keeps one weight per distance, not per member, and
    /// the tree is shared by the whole group (see [`GossipTree`]). The
    /// tree's members must be this group's members; reset to uniform by
    /// [`Pbcast::set_members`].
    pub fn set_gossip_tree(
        &mut self,
        tree: std::sync::Arc<GossipTree>,
        base: f64,
    ) -> Result<(), ConfigError> {
        if tree.len() != self.members.len() {
            return Err(ConfigError::BadTree(format!(
                "{} members in the tree, {} in the group",
                tree.len(),
                self.members.len()
            )));
        }
        self.targets = Targets::Tree(Box::new(TreeTargets::new(tree, self.me, base)?));
        Ok(())
    }

    /// Messages held in the buffer (all sources), for memory metrics.
    pub fn buffered(&self) -> usize {
        self.logs.iter().map(|(_, log)| log.held()).sum()
    }

    /// Whether this member buffers message `seq` of `source` (and could
    /// retransmit it); for diagnostics and tests.
    pub fn holds(&self, source: NodeId, seq: u64) -> bool {
        self.index_of(source)
            .is_some_and(|i| self.logs.get(i).holds(seq))
    }

    /// Checks internal invariants; panics when one is broken (tests and the
    /// simulator call this).
    pub fn check_invariants(&self) {
        for (source, log) in self.logs.iter() {
            log.check_invariants();
            assert_eq!(self.busy.contains(&source), !log.is_idle(), "busy set");
            assert_eq!(self.gappy.contains(&source), log.has_missing(), "gappy set");
            assert_eq!(
                (log.in_busy, log.in_gappy),
                (!log.is_idle(), log.has_missing()),
                "the log's record of the sets"
            );
        }
        // A source without a log is idle and has no gaps.
        for source in self.busy.iter().chain(&self.gappy) {
            assert!(
                self.logs.iter().any(|(s, _)| s == *source),
                "tracked without a log"
            );
        }
    }

    /// Keeps `busy` and `gappy` in step with one source's log. The log
    /// remembers whether the sets hold it, so that a message that changes
    /// neither (most) costs no search of them. A source without a log is
    /// in neither.
    fn track(&mut self, source: usize) {
        let Some(log) = self.logs.get_mut(source) else {
            return;
        };
        let busy = !log.is_idle();
        if busy != log.in_busy {
            log.in_busy = busy;
            if busy {
                self.busy.insert(source);
            } else {
                self.busy.remove(&source);
            }
        }
        let gappy = log.has_missing();
        if gappy != log.in_gappy {
            log.in_gappy = gappy;
            if gappy {
                self.gappy.insert(source);
            } else {
                self.gappy.remove(&source);
            }
        }
    }

    fn retrack_all(&mut self) {
        self.busy.clear();
        self.gappy.clear();
        for (_, log) in self.logs.iter_mut() {
            log.in_busy = false;
            log.in_gappy = false;
        }
        let sources: Vec<usize> = self.logs.iter().map(|(source, _)| source).collect();
        for source in sources {
            self.track(source);
        }
    }

    fn index_of(&self, node: NodeId) -> Option<usize> {
        self.members.index_of(node)
    }

    /// Time never runs backwards inside the engine.
    fn clamp(&mut self, now: Instant) -> Instant {
        self.last_now = self.last_now.max(now);
        self.last_now
    }

    // ---- inputs ----------------------------------------------------------

    fn receive(&mut self, now: Instant, from: NodeId, datagram: &[u8], shared: Option<&Bytes>) {
        let now = self.clamp(now);
        self.stats.datagrams_received += 1;
        let Some(from_index) = self.index_of(from).filter(|i| *i != self.my_index) else {
            self.stats.malformed += 1;
            return;
        };
        for item in shoal_wire::packets(datagram) {
            match item {
                Ok((header, packet)) if header.sender == from.0 => {
                    self.stats.packets_received[header.kind.index()] += 1;
                    self.on_packet(now, from_index, packet, shared);
                }
                _ => {
                    self.stats.malformed += 1;
                    break;
                }
            }
        }
        self.queue_relays();
    }

    /// Whether first-phase messages go down a relay tree.
    fn relaying(&self) -> bool {
        !self.config.ip_multicast && self.config.relay_fanout > 0
    }

    /// This member's children in the relay tree of `source`: the member list
    /// rotated to start at the source, in heap order with `relay_fanout`
    /// children per position.
    fn relay_children(&self, source: usize) -> Vec<NodeId> {
        let n = self.members.len();
        let fanout = self.config.relay_fanout as usize;
        if fanout == 0 {
            return Vec::new();
        }
        let position = (self.my_index + n - source) % n;
        let first = position.saturating_mul(fanout).saturating_add(1);
        (first..first.saturating_add(fanout).min(n))
            .map(|child| self.members[(source + child) % n])
            .collect()
    }

    /// Passes the datagram's new first-phase messages on to this member's
    /// children, one child at a time so that each child's copies pack.
    fn queue_relays(&mut self) {
        if self.relay_new.is_empty() {
            return;
        }
        let mut new = std::mem::take(&mut self.relay_new);
        new.sort_unstable();
        for group in new.chunk_by(|a, b| a.0 == b.0) {
            let source = group[0].0;
            for child in self.relay_children(source) {
                self.outbox
                    .relays
                    .extend(group.iter().map(|&(_, seq)| outbox::RelayCopy {
                        to: child,
                        source: source as u32,
                        seq,
                    }));
            }
        }
        new.clear();
        self.relay_new = new;
    }

    /// `shared`, when the caller has one, is the datagram the packet was
    /// decoded from: payloads become slices of it instead of copies.
    fn on_packet(&mut self, now: Instant, from: usize, packet: Packet<'_>, shared: Option<&Bytes>) {
        let own = |payload: &[u8]| match shared {
            Some(datagram) => datagram.slice_ref(payload),
            None => Bytes::copy_from_slice(payload),
        };
        match packet {
            Packet::Data { seq, payload } => {
                let payload = own(payload);
                self.on_first_phase(now, from, seq, payload);
            }
            Packet::Relay {
                source,
                seq,
                payload,
            } => {
                if let Some(source) = self.index_of(NodeId(source)) {
                    let payload = own(payload);
                    self.on_first_phase(now, source, seq, payload);
                }
            }
            Packet::Retransmit {
                source,
                seq,
                payload,
            }
            | Packet::Push {
                source,
                seq,
                payload,
            } => {
                let via = if matches!(packet, Packet::Push { .. }) {
                    Via::Push { by: from }
                } else {
                    Via::Answer { by: from }
                };
                if let Some(source) = self.index_of(NodeId(source)) {
                    self.on_message(now, source, seq, own(payload), via);
                }
            }
            Packet::Gossip {
                digest,
                repaired,
                lacking,
                awaited,
            } => {
                self.on_repair_bits(now, &repaired);
                self.on_gossip(now, from, &digest, &lacking, &awaited);
            }
            Packet::Solicit { wanted, again } => self.on_solicit(now, from, &wanted, &again),
            Packet::Status { source, next } => {
                if source == self.me.0 {
                    let p = self.progress.entry(from);
                    p.next = p.next.max(next);
                    p.heard = now;
                }
            }
            // Other protocols' packets: not part of pbcast.
            Packet::Session(_)
            | Packet::Heartbeat { .. }
            | Packet::Vsync { .. }
            | Packet::Qsm { .. }
            | Packet::Presence { .. } => {}
        }
    }

    /// A message of the first phase: from its source or down its relay tree.
    fn on_first_phase(&mut self, now: Instant, source: usize, seq: u64, payload: Bytes) {
        let new = self.on_message(now, source, seq, payload, Via::FirstPhase);
        if new && self.relaying() && source != self.my_index {
            self.relay_new.push((source, seq));
        }
    }

    /// Returns whether the message was new.
    fn on_message(
        &mut self,
        now: Instant,
        source: usize,
        seq: u64,
        payload: Bytes,
        via: Via,
    ) -> bool {
        let log = self.logs.entry(source);
        let inserted = log.insert(seq, payload, now, via.repaired_by(), LOG_EXTENSION_MAX);
        self.track(source);
        match inserted {
            Inserted::Duplicate => {
                self.stats.duplicates += 1;
                false
            }
            Inserted::New {
                answered_after,
                pushed_after,
            } => {
                // A push times the digest that drew it; an answer (unicast,
                // or another member's multicast repair) the solicitation.
                let (timed, rtt) = match via {
                    Via::Push { .. } => (&mut self.push_rtt, pushed_after),
                    Via::Answer { .. } => (&mut self.repair_rtt, answered_after),
                    Via::FirstPhase => (&mut self.repair_rtt, None),
                };
                if let Some(rtt) = rtt {
                    timed.sample(rtt);
                }
                self.deliver_ready(source, Some(seq));
                self.maybe_report_progress(source);
                true
            }
        }
    }

    /// Hands deliverable messages of `source` to the application.
    fn deliver_ready(&mut self, source: usize, arrived: Option<u64>) {
        let node = self.members[source];
        let log = self.logs.entry(source);
        match self.config.delivery {
            Delivery::Fifo => {
                while let Some(ready) = log.take_next_fifo() {
                    push_delivery(&mut self.events, &mut self.stats, node, ready);
                }
            }
            Delivery::Unordered => {
                if let Some(ready) = arrived.and_then(|seq| log.take_unordered(seq)) {
                    push_delivery(&mut self.events, &mut self.stats, node, ready);
                }
            }
        }
    }

    /// Flow control: tell a source how far this member got, every
    /// `status_every` new messages (the timer covers the rest).
    fn maybe_report_progress(&mut self, source: usize) {
        if self.config.send_window.is_none() || source == self.my_index {
            return;
        }
        if self.logs.get(source).unreported >= self.config.status_every.get() {
            self.queue_status(source);
        }
    }

    fn queue_status(&mut self, source: usize) {
        let log = self.logs.entry(source);
        log.unreported = 0;
        self.outbox.control.push_back(Control::Status {
            to: self.members[source],
            next: log.cursor(),
        });
    }

    /// A digest arrived: pull what the gossiper has and I lack, push young
    /// messages it lacks (the gaps in its digest, and what it says it lacks
    /// beyond it, except what it says it awaits), and count evidence for
    /// declaring gaps lost.
    fn on_gossip(
        &mut self,
        now: Instant,
        from: usize,
        digest: &[SourceRanges],
        lacking: &[SourceRanges],
        awaited: &[SourceRanges],
    ) {
        let (mut wanted, mut again) = (Vec::new(), Vec::new());
        // Ascending by source (a digest names a few sources: a sorted
        // vector, not a map allocated per digest).
        let mut adverts: Vec<Advert> = Vec::new();
        for (list, field) in [
            (digest, AdvertList::Held),
            (lacking, AdvertList::Lacking),
            (awaited, AdvertList::Awaited),
        ] {
            for entry in list {
                let Some(source) = self.index_of(NodeId(entry.source)) else {
                    continue;
                };
                let i = match adverts.binary_search_by_key(&source, |a| a.source) {
                    Ok(i) => i,
                    Err(i) => {
                        adverts.insert(i, Advert::new(source));
                        i
                    }
                };
                adverts[i].list(field).extend_from_slice(&entry.ranges);
            }
        }
        for advert in &mut adverts {
            advert.held.sort_unstable();
            advert.awaited.sort_unstable();
            let source = advert.source;
            let highest = advert
                .held
                .iter()
                .chain(&advert.lacking)
                .map(|r| r.last)
                .max();
            if let Some(highest) = highest {
                self.logs
                    .entry(source)
                    .learn_up_to(highest, now, LOG_EXTENSION_MAX);
                self.track(source);
            }
            if self.config.mode != GossipMode::Push {
                if let Some((first, repeat)) = self.pull(now, from, source, &advert.held) {
                    wanted.extend(first);
                    again.extend(repeat);
                }
            }
            if self.config.mode != GossipMode::Pull {
                self.push(now, from, advert);
            }
        }
        for &source in &self.gappy {
            let log = self.logs.entry(source);
            match adverts.binary_search_by_key(&source, |a| a.source) {
                Ok(i) => log.note_digest(&adverts[i].held, &adverts[i].lacking),
                Err(_) => log.note_digest(&[], &[]),
            }
        }
        if !wanted.is_empty() || !again.is_empty() {
            let to = self.members[from];
            self.outbox
                .control
                .push_back(Control::Solicit { to, wanted, again });
        }
    }

    /// Ranges to solicit from the gossiper `from` that advertised `ranges`
    /// of `source`: (asked for the first time, asked again).
    fn pull(
        &mut self,
        now: Instant,
        from: usize,
        source: usize,
        ranges: &[SeqRange],
    ) -> Option<Pulled> {
        let retry = self.solicit_retry();
        if !self.logs.get(source).has_missing() {
            return None;
        }
        let log = self.logs.entry(source);
        let max = self.config.retransmits_per_round_max as usize;
        let (mut first, mut again) = (RangeBuilder::default(), RangeBuilder::default());
        // Only the multicast-repair variants tell repeats apart; plain
        // pbcast's solicitations stay one list.
        let apart = self.config.multicast_repair != MulticastRepair::Off;
        let mut taken = 0;
        for range in ranges {
            let out = log::Asks {
                of: from,
                first: &mut first,
                again: apart.then_some(&mut again),
            };
            log.solicit(*range, now, retry, max, out, &mut taken);
        }
        let room = self.solicit_ranges_max();
        let mut first = first.finish();
        crate::ranges::truncate_keep_last(&mut first, room);
        let mut again = again.finish();
        crate::ranges::truncate_keep_last(&mut again, room - first.len());
        let node = self.members[source].0;
        let entry = |ranges: Vec<SeqRange>| {
            (!ranges.is_empty()).then_some(SourceRanges {
                source: node,
                ranges,
            })
        };
        let pulled = (entry(first), entry(again));
        (pulled.0.is_some() || pulled.1.is_some()).then_some(pulled)
    }

    /// Pushes young messages of the advertised source that the gossiper
    /// `to` lacks and does not await.
    fn push(&mut self, now: Instant, to: usize, advert: &Advert) {
        let budget = self.retransmit_budget as usize;
        let source = advert.source;
        let seqs = self.logs.get(source).young_missing_at_peer(
            &advert.held,
            &advert.lacking,
            &advert.awaited,
            now,
            self.config.push_age_max,
            self.config.gossip_interval,
            budget,
        );
        for seq in seqs {
            let to = Destination::Node(self.members[to]);
            if self.queue_retransmit(to, source, seq, true) {
                self.stats.retransmits_pushed += 1;
            }
        }
    }

    /// A solicitation: `wanted` asked of anyone for the first time, `again`
    /// asked before (the solicitor's retry).
    fn on_solicit(
        &mut self,
        now: Instant,
        from: usize,
        wanted: &[SourceRanges],
        again: &[SourceRanges],
    ) {
        for (list, first_ask) in [(wanted, true), (again, false)] {
            for entry in list {
                let Some(source) = self.index_of(NodeId(entry.source)) else {
                    continue;
                };
                for range in &entry.ranges {
                    self.answer_solicit(now, from, source, *range, first_ask);
                }
            }
        }
    }

    fn answer_solicit(
        &mut self,
        now: Instant,
        to: usize,
        source: usize,
        range: SeqRange,
        first_ask: bool,
    ) {
        let log = self.logs.get(source);
        let Some(last) = log.end().checked_sub(1).map(|end| range.last.min(end)) else {
            return;
        };
        for seq in range.first.max(log.base())..=last {
            if !self.logs.get(source).holds(seq) {
                continue;
            }
            let Some(destination) = self.repair_destination(now, to, (source, seq), first_ask)
            else {
                continue;
            };
            // Budget spent: the solicitor will ask again in a later round.
            if !self.queue_retransmit(destination, source, seq, false) {
                return;
            }
        }
    }

    /// Unicast to the solicitor, or multicast (pbcast-IPMC / grb), or
    /// nothing when a multicast of it left within the window. Only a
    /// `first_ask` is evidence of one more member missing the message: a
    /// solicitor asking again (its first repair lost or still queued) is
    /// the same member, so its ask counts towards neither IPMC's threshold
    /// nor grb's "someone else was already repaired" (P001 §B: multicast
    /// where *multi-participant* loss is suspected).
    fn repair_destination(
        &mut self,
        now: Instant,
        to: usize,
        key: Key,
        first_ask: bool,
    ) -> Option<Destination> {
        let unicast = Destination::Node(self.members[to]);
        if self.config.multicast_repair == MulticastRepair::Off || !self.config.ip_multicast {
            return Some(unicast);
        }
        if self.multicast_recently.contains_key(&key) {
            return None;
        }
        let grb = self.config.multicast_repair == MulticastRepair::Grb;
        let (count, _) = self.solicitations.entry(key).or_insert((0, now));
        if first_ask {
            *count += 1;
        }
        let repaired_elsewhere = first_ask
            && grb
            && self
                .repair_bits
                .get(&key)
                .is_some_and(|b| b.heard.is_some());
        if *count >= self.config.multicast_repair_threshold.get() || repaired_elsewhere {
            self.multicast_recently.insert(key, now);
            return Some(Destination::Multicast);
        }
        if grb {
            self.repair_bits.entry(key).or_default().sent = Some(now);
        }
        Some(unicast)
    }

    /// pbcast-grb: remember what others say was recently retransmitted.
    fn on_repair_bits(&mut self, now: Instant, repaired: &[SourceRanges]) {
        if self.config.multicast_repair != MulticastRepair::Grb {
            return;
        }
        for entry in repaired {
            let Some(source) = self.index_of(NodeId(entry.source)) else {
                continue;
            };
            for range in entry
                .ranges
                .iter()
                .take(usize::from(self.config.digest_ranges_max))
            {
                let last = range.last.min(range.first.saturating_add(1024));
                for seq in range.first..=last {
                    self.repair_bits.entry((source, seq)).or_default().heard = Some(now);
                }
            }
        }
    }

    /// Queues one retransmission (`pushed` unasked, else an answer) if the
    /// round's budget allows.
    fn queue_retransmit(
        &mut self,
        destination: Destination,
        source: usize,
        seq: u64,
        pushed: bool,
    ) -> bool {
        if self.retransmit_budget == 0 {
            self.stats.retransmits_suppressed += 1;
            return false;
        }
        self.retransmit_budget -= 1;
        self.outbox.retransmits.push_back(outbox::Retransmit {
            destination,
            source: source as u32,
            seq,
            pushed,
        });
        true
    }

    /// Ranges that fit one solicitation (two lists of one source each).
    fn solicit_ranges_max(&self) -> usize {
        let room = self.config.max_datagram_size - shoal_wire::HEADER_LEN - 2 * (2 + 6);
        usize::from(self.config.digest_ranges_max).min(room / shoal_wire::RANGE_LEN)
    }

    // ---- timers ----------------------------------------------------------

    /// One gossip round: collect garbage, give up on dead gaps, gossip.
    fn on_round(&mut self, now: Instant) {
        self.stats.gossip_rounds += 1;
        self.retransmit_budget = self.config.retransmits_per_round_max;
        let window = self.config.gossip_interval * self.config.multicast_repair_window_rounds.get();
        self.solicitations
            .retain(|_, (_, first)| *first + window > now);
        self.multicast_recently.retain(|_, at| *at + window > now);
        let memory = self.config.gossip_interval * self.config.repair_memory_rounds.get();
        self.repair_bits.retain(|_, bit| {
            bit.sent = bit.sent.filter(|at| *at + memory > now);
            bit.heard = bit.heard.filter(|at| *at + memory > now);
            bit.latest().is_some()
        });
        let gc_period = self.config.gc_period();
        let lost_wait = self.config.gossip_interval * self.config.lost_after_rounds.get();
        let busy: Vec<usize> = self.busy.iter().copied().collect();
        for source in busy {
            self.logs.entry(source).collect_garbage(now, gc_period);
            self.give_up_dead_gaps(now, source, lost_wait);
            self.track(source);
        }
        for _ in 0..self.config.gossip_fanout.get() {
            if let Some(target) = self.random_other_member() {
                let awaited = self.invite_pushes(now, target);
                self.outbox.control.push_back(Control::Gossip {
                    to: target,
                    awaited,
                });
            }
        }
    }

    /// The digest about to leave invites pushes of this member's gaps; per
    /// source, the gaps whose push was invited within the hold, so not
    /// invited again yet (see [`Pbcast::invite_hold`]).
    fn invite_pushes(&mut self, now: Instant, target: NodeId) -> Vec<SourceRanges> {
        let hold = self.invite_hold();
        let to = self.index_of(target).expect("a member");
        let mut awaited = Vec::new();
        for &source in &self.gappy {
            let ranges = self.logs.entry(source).invite(now, hold, to);
            if !ranges.is_empty() {
                awaited.push(SourceRanges {
                    source: self.members[source].0,
                    ranges,
                });
            }
        }
        awaited
    }

    /// How long a push invited by a digest is awaited before the gap is
    /// offered for pushing again: the push round trip's timeout (srtt +
    /// 4 × rttvar, RFC 6298, over the times from a digest to the push it
    /// drew) up to `push_hold_max`; nothing before the first measurement.
    /// Timed on pushes, not on answers to solicitations: with pbcast-grb a
    /// member whose ask was lost often gets the message a round later by
    /// another member's multicast repair from the member it asked, which
    /// reads as a round trip of a round (P001 Fig 7: holds of 100-300 ms on
    /// a LAN, and messages lost for want of pushes). Where a repair comes back within a round this
    /// changes nothing (every digest invites every gap, as before); behind
    /// a queue that holds repairs for several rounds, it keeps a member's
    /// successive partners from each pushing the same messages into the
    /// queue (P001 Fig 8: pushes across a saturated root link were 94% of
    /// the retransmissions of a collapsed run).
    pub fn invite_hold(&self) -> Duration {
        self.push_rtt
            .timeout(Duration::ZERO, self.config.push_hold_max)
    }

    /// Declares unrepairable gaps lost. In FIFO order each `Lost` event is
    /// emitted where the gap sits in the stream, between the deliveries
    /// before and after it.
    fn give_up_dead_gaps(&mut self, now: Instant, source: usize, wait: Duration) {
        let evidence = self.config.lost_evidence_min;
        match self.config.delivery {
            Delivery::Fifo => {
                while let Some(range) = self
                    .logs
                    .entry(source)
                    .declare_lost_at_cursor(now, wait, evidence)
                {
                    self.report_lost(source, range);
                    self.deliver_ready(source, None);
                }
            }
            Delivery::Unordered => {
                for range in self.logs.entry(source).declare_lost(now, wait, evidence) {
                    self.report_lost(source, range);
                }
            }
        }
    }

    fn report_lost(&mut self, source: usize, range: SeqRange) {
        self.stats.lost += range.len();
        self.events.push_back(Event::Lost {
            source: self.members[source],
            range,
        });
    }

    fn random_other_member(&mut self) -> Option<NodeId> {
        let n = self.members.len();
        if n < 2 {
            return None;
        }
        match &self.targets {
            Targets::Uniform => {}
            Targets::PerMember(cumulative) => {
                let total = *cumulative.last()?;
                if total > 0.0 {
                    let x = self.rng.random::<f64>() * total;
                    let index = cumulative.partition_point(|c| *c <= x).min(n - 1);
                    return Some(self.members[index]);
                }
            }
            Targets::Tree(targets) => {
                if let Some(target) = targets.pick(&mut self.rng) {
                    return Some(target);
                }
            }
        }
        let pick = self.rng.random_range(0..n - 1);
        let index = if pick >= self.my_index {
            pick + 1
        } else {
            pick
        };
        Some(self.members[index])
    }

    fn on_status_timer(&mut self) {
        let unreported: Vec<usize> = self
            .logs
            .iter()
            .filter(|(source, log)| *source != self.my_index && log.unreported > 0)
            .map(|(source, _)| source)
            .collect();
        for source in unreported {
            self.queue_status(source);
        }
    }

    /// A gossip packet: the digest, plus pbcast-grb's repair bits in up to a
    /// quarter of the datagram, the runs lacking at the buffer's edges in up
    /// to an eighth, and the `awaited` gaps in up to a quarter (cut, the
    /// rest may be pushed again: a duplicate, never a loss).
    fn gossip_packet(&self, mut awaited: Vec<SourceRanges>) -> Packet<'static> {
        let room = self.config.max_datagram_size - shoal_wire::HEADER_LEN - 4;
        let grb = self.config.multicast_repair == MulticastRepair::Grb;
        let repaired = if grb {
            self.repaired_ranges(room / 4 / (6 + shoal_wire::RANGE_LEN))
        } else {
            Vec::new()
        };
        let lacking = self.lacking_at_edges(room / 8 / (6 + 2 * shoal_wire::RANGE_LEN));
        fit_in_bytes(&mut awaited, room / 4 - 4);
        let mut packet = Packet::Gossip {
            digest: Vec::new(),
            repaired,
            lacking,
            awaited,
        };
        // The other lists' own length (the empty digest's count taken off).
        let used = packet.body_len() - 2;
        if let Packet::Gossip { digest, .. } = &mut packet {
            *digest = self.digest(room + 2 - used);
        }
        packet
    }

    /// Per source, the runs of messages this member knows exist and lacks
    /// at the ends of its buffer (at most `max_sources` sources): the gaps a
    /// digest cannot show, since a gossiper reads the digest's highest
    /// message as the end of what this member has heard of, and its lowest
    /// as the start of what it has not collected.
    fn lacking_at_edges(&self, max_sources: usize) -> Vec<SourceRanges> {
        self.gappy
            .iter()
            .filter_map(|&source| {
                let ranges = self.logs.get(source).missing_edges();
                (!ranges.is_empty()).then(|| SourceRanges {
                    source: self.members[source].0,
                    ranges,
                })
            })
            .take(max_sources)
            .collect()
    }

    /// pbcast-grb's repair bits as ranges per source, at most `max_ranges`.
    fn repaired_ranges(&self, max_ranges: usize) -> Vec<SourceRanges> {
        let mut list: Vec<SourceRanges> = Vec::new();
        let mut total = 0;
        // Only its own: a bit passed on would carry no age and could
        // circulate for as long as members keep passing it (and, in P001
        // Fig 8, a quarter of every gossip crossing the root was such bits).
        let own = self
            .repair_bits
            .iter()
            .filter(|(_, bit)| bit.sent.is_some());
        for (&(source, seq), _) in own {
            let node = self.members[source].0;
            if let Some(entry) = list.last_mut().filter(|e| e.source == node) {
                let last = entry.ranges.last_mut().expect("entries start non-empty");
                if last.last + 1 == seq {
                    last.last = seq;
                    continue;
                }
                if total < max_ranges {
                    entry.ranges.push(SeqRange::single(seq));
                    total += 1;
                }
                continue;
            }
            if total >= max_ranges {
                break;
            }
            list.push(SourceRanges {
                source: node,
                ranges: vec![SeqRange::single(seq)],
            });
            total += 1;
        }
        list
    }

    /// The digest of this member's buffer, sized to fit one datagram.
    /// `room`: bytes available for the digest list, count included.
    fn digest(&self, room: usize) -> Vec<SourceRanges> {
        let mut room = room.saturating_sub(2);
        let max_ranges = usize::from(self.config.digest_ranges_max);
        let mut digest = Vec::new();
        for &source in &self.busy {
            let (node, log) = (&self.members[source], self.logs.get(source));
            if log.held() == 0 {
                continue;
            }
            let mut ranges = log.held_ranges();
            let fit = room.saturating_sub(6) / shoal_wire::RANGE_LEN;
            crate::ranges::truncate_keep_last(&mut ranges, max_ranges.min(fit));
            if ranges.is_empty() {
                break;
            }
            room -= 6 + shoal_wire::RANGE_LEN * ranges.len();
            digest.push(SourceRanges {
                source: node.0,
                ranges,
            });
        }
        digest
    }
}

/// Cuts `list` to at most `bytes` encoded (per source 6 bytes, per range
/// `RANGE_LEN`), keeping its first sources and ranges.
fn fit_in_bytes(list: &mut Vec<SourceRanges>, bytes: usize) {
    let mut left = bytes;
    let mut keep = 0;
    for entry in list.iter_mut() {
        let ranges = left.saturating_sub(6) / shoal_wire::RANGE_LEN;
        if ranges == 0 {
            break;
        }
        entry.ranges.truncate(ranges);
        left -= 6 + shoal_wire::RANGE_LEN * entry.ranges.len();
        keep += 1;
    }
    list.truncate(keep);
}

fn remap_keys<V>(map: BTreeMap<Key, V>, remap: impl Fn(Key) -> Option<Key>) -> BTreeMap<Key, V> {
    map.into_iter()
        .filter_map(|(key, value)| remap(key).map(|k| (k, value)))
        .collect()
}

/// Gossip weights 1/k^d (P001 §B, hierarchical gossip): `k` the tree's
/// branching factor, `d` the tree distance to each member. With two equal
/// clusters this puts a quarter of the weight on the far cluster.
pub fn hierarchical_weights(distances: &[(NodeId, u32)], branching: f64) -> Vec<(NodeId, f64)> {
    distances
        .iter()
        .map(|&(node, d)| (node, branching.powi(-(d as i32))))
        .collect()
}

fn push_delivery(events: &mut VecDeque<Event>, stats: &mut Stats, source: NodeId, ready: Ready) {
    stats.delivered += 1;
    stats.recovered += u64::from(ready.recovered);
    events.push_back(Event::Deliver {
        source,
        seq: ready.seq,
        payload: ready.payload,
        recovered: ready.recovered,
    });
}

impl Engine for Pbcast {
    type Event = Event;

    fn node_id(&self) -> NodeId {
        self.me
    }

    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        self.receive(now, from, datagram, None);
    }

    fn handle_datagram_bytes(&mut self, now: Instant, from: NodeId, datagram: &Bytes) {
        self.receive(now, from, datagram, Some(datagram));
    }

    fn handle_timeout(&mut self, now: Instant) {
        let now = self.clamp(now);
        if now >= self.next_round {
            self.on_round(now);
            // After a long sleep, resume the rhythm instead of catching up.
            self.next_round = (self.next_round + self.config.gossip_interval).max(now);
            if self.next_round == now {
                self.next_round = now + self.config.gossip_interval;
            }
        }
        if now >= self.next_status {
            if self.config.send_window.is_some() {
                self.on_status_timer();
            }
            self.next_status = now + self.config.status_interval;
        }
    }

    fn multicast(&mut self, now: Instant, payload: Bytes) -> Result<u64, SendError> {
        let now = self.clamp(now);
        let max = self.config.max_payload();
        if payload.len() > max {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        if !self.can_send(now) {
            return Err(SendError::WindowFull);
        }
        let me = self.my_index;
        let seq = self.logs.get(me).end();
        let log = self.logs.entry(me);
        log.insert(seq, payload, now, None, 1);
        log.unreported = 0;
        self.track(me);
        self.stats.originated += 1;
        self.outbox.fresh.push_back(seq);
        self.deliver_ready(me, Some(seq));
        Ok(seq)
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        let now = self.clamp(now);
        let transmit = outbox::assemble(self, now)?;
        self.stats.datagrams_sent += 1;
        self.stats.bytes_sent += transmit.payload.len() as u64;
        Some(transmit)
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let status = self.config.send_window.map(|_| self.next_status);
        Some(status.map_or(self.next_round, |s| s.min(self.next_round)))
    }
}

#[cfg(test)]
mod tests;
