//! Daemon membership: how daemons that know
//! only each other's addresses come to form one vsync group, and how a
//! restarted or evicted daemon gets back in.
//!
//! Vsync ([`crate::vsync`]) needs a founding member list or a contact that is
//! already a member. Daemons have neither: each is configured with the
//! addresses of its peers, and any subset of them may be running. This
//! engine wraps one [`Vsync`] member and adds:
//!
//! - **Identities with an incarnation.** A daemon is `slot` (its index in
//!   the sorted list of configured addresses, so every daemon agrees on it)
//!   plus an incarnation in the high bits of its [`NodeId`]. A daemon that
//!   restarts, or is evicted and rejoins, comes back under a new id, so the
//!   group never confuses it with the member it replaces: the old id is
//!   dropped at the next view change like any silent member, the new one
//!   joins. The runtime routes by slot ([`slot_of`]), so what another
//!   group's primary still sends to an earlier incarnation reaches the
//!   current one: a member ignores view-change proposals (PREFRESHVIEW,
//!   ACCEPT) from daemons outside its view, or it would promise them a
//!   (view, epoch) that makes it refuse its own primary.
//! - **Presence.** While it has no group, a daemon sends a PRESENCE packet
//!   (`member: false`) to every peer slot each `presence_interval`. Members
//!   answer with `member: true` (rate-limited per joiner), which tells the
//!   joiner a group exists and whom to ask to join: it then runs a vsync
//!   joiner with that member as its contact.
//! - **Discovery** ([`Membership::discovering`]). Without a configured peer
//!   list, a daemon's slot is configured, any of the [`MAX_SLOTS`] slots
//!   may be running, and the presence goes once per interval to
//!   [`Destination::Multicast`] (the runtime's discovery group) instead of
//!   to every peer slot. The runtime learns each slot's address from the
//!   datagrams it receives, so members answer by unicast as before.
//! - **Founding.** A daemon that, for `found_after`, has heard from no
//!   member and from no joining daemon with a lower slot founds a group of
//!   its own. Daemons started together thus converge on the lowest slot
//!   running, and the others join it. Two groups can still form if the
//!   daemons cannot hear each other for `found_after` (a partition at
//!   start-up, or the group split and each side went on).
//! - **Merging.** Every `merge_probe_interval` the member with the view's
//!   lowest slot sends a member PRESENCE, with the view's size and lowest
//!   slot, to every peer slot outside the view (to the discovery group with
//!   discovery). A member
//!   that keeps hearing, for two probe intervals, members of another group
//!   that ranks before its own (more members; on a tie, the lower lowest
//!   slot) leaves its group and joins that one through the member it heard,
//!   under its next incarnation, as an evicted daemon does. Every member of
//!   the losing group does so on its own; the winning group's members only
//!   see joins. (Waiting two intervals keeps a member from acting on a
//!   probe sent by a member of its own group whose view is a step ahead.)
//!
//! Sans-IO: no clock, no socket; randomness only in the wrapped engine.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use shoal_wire::{Kind, Packet};

use crate::engine::{Destination, Engine, NodeId, SendError, Transmit};
use crate::time::Instant;
use crate::vsync::{self, group_base, Event, RemovedReason, Vsync};

/// A view member's slot heard from as gone from this group
/// ([`Membership::note_successor`]).
#[derive(Debug, Clone, Copy)]
struct Heard {
    id: NodeId,
    first: Instant,
    last: Instant,
    /// Under the id the view lists, as a member of another group.
    elsewhere: bool,
}

/// Low bits of a [`NodeId`] that hold the daemon's slot.
pub const SLOT_BITS: u32 = 8;
/// Daemons one cluster can name.
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;
const INCARNATION_MASK: u32 = u32::MAX >> SLOT_BITS;

/// The slot (configured address index) of a daemon's id.
pub fn slot_of(id: NodeId) -> u32 {
    id.0 & (MAX_SLOTS as u32 - 1)
}

/// The id of incarnation `incarnation` (taken modulo 2^24) of slot `slot`.
pub fn daemon_id(slot: u32, incarnation: u32) -> NodeId {
    debug_assert!((slot as usize) < MAX_SLOTS);
    NodeId(((incarnation & INCARNATION_MASK) << SLOT_BITS) | slot)
}

/// The first incarnation of a daemon process started at `unix_ms`: the
/// time in units of 8 ms. An eviction moves a running daemon to the next
/// incarnation, so a restart must start past every incarnation the
/// previous process of its slot used; counting restarts 1, 2, 3 would give
/// the restarted process the id its predecessor took at its first rejoin,
/// and peers still holding state for that id would take the newcomer's
/// first messages for old ones. Wraps after about 37 hours (2^24 units),
/// harmlessly: only equality with the predecessor's recent ids matters.
pub fn first_incarnation(unix_ms: u64) -> u32 {
    (unix_ms / 8) as u32
}

/// Settings of the cluster membership.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The daemons' vsync group.
    pub vsync: vsync::Config,
    /// A daemon that heard from no member and no lower joining slot for
    /// this long founds a group. Default 2 s: several presence rounds.
    #[serde(with = "crate::serde_ms")]
    pub found_after: Duration,
    /// A daemon without a group announces itself this often. Default 250 ms.
    #[serde(with = "crate::serde_ms")]
    pub presence_interval: Duration,
    /// The member with the view's lowest slot probes peers outside the view
    /// this often, so that groups formed apart merge. Default 1 s.
    #[serde(with = "crate::serde_ms")]
    pub merge_probe_interval: Duration,
    /// A member that has installed no view for `vsync.view_period` plus
    /// this long takes its group as lost to a partition (its primary
    /// cannot gather a majority, or is on the other side), and so does a
    /// primary that has asked this long for its view change's majority (in
    /// asks, one `ack_wait` apart): it leaves it
    /// and forms a group with the daemons it still reaches, which keeps
    /// serving its clients (extended virtual synchrony: every component
    /// goes on; the quorum flag says which holds a majority). Default 5 s.
    #[serde(with = "crate::serde_ms")]
    pub partition_grace: Duration,
    /// How many daemons make a quorum's whole: a view holds the quorum
    /// with more than half of them. 0 (the default) counts the configured
    /// daemons; with discovery there is no such count, and every view is
    /// reported as holding the quorum unless this is set.
    pub expected_votes: u32,
    /// With two expected votes, one daemon alone holds the quorum (as
    /// Corosync votequorum's `two_node`). Default false.
    pub two_node: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            vsync: vsync::Config::default(),
            found_after: Duration::from_secs(2),
            presence_interval: Duration::from_millis(250),
            merge_probe_interval: Duration::from_secs(1),
            partition_grace: Duration::from_secs(5),
            expected_votes: 0,
            two_node: false,
        }
    }
}

impl Config {
    /// The settings a daemon runs with unless configured otherwise (and the
    /// simulator's swarm with it): a committee of 3, so that one daemon's
    /// failure does not stop the cluster (P000 §6 measures k = 1);
    /// datagrams up to 65,000 bytes (loopback); progress every 100 ms;
    /// committee members deliver from their own stores; a silent member
    /// heard from during a view change is asked once more.
    pub fn daemon_defaults() -> Config {
        let mut c = Config::default();
        c.vsync.committee_size = std::num::NonZeroU32::new(3).expect("non-zero");
        c.vsync.pbcast.max_datagram_size = 65_000;
        c.vsync.progress_interval = Duration::from_millis(100);
        c.vsync.committee_delivery = true;
        c.vsync.ask_heard_again = true;
        c
    }
}

/// A vsync event, with the id this daemon had when it happened (the id
/// changes when an evicted daemon rejoins).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipEvent {
    pub me: NodeId,
    pub event: Event,
}

/// Counters of the cluster layer (vsync keeps its own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub presence_sent: u64,
    pub presence_received: u64,
    /// Groups this daemon founded.
    pub founded: u64,
    /// Times this daemon was evicted and started over under a new id.
    pub rejoins: u64,
    /// Join requests from other joiners, ignored while joining.
    pub joins_ignored: u64,
    /// Times this daemon left its group to join one that ranks before it.
    pub merges: u64,
    /// Times this daemon left a group that installed no view for too long
    /// (cut off from its majority) to form one with the daemons it reaches.
    pub partitions: u64,
    /// Times this daemon, joining, saw every member that could send it the
    /// table leave before it did, and started over ([`Membership::give_up_group`]).
    pub tables_lost: u64,
    /// Times this daemon left a group whose view lists a majority of
    /// daemons that have since come back under another id
    /// ([`Membership::majority_gone_deadline`]).
    pub majorities_gone: u64,
    /// Unsequenced multicasts refused (pbcast's send window full, or no
    /// view yet): lost at the sender, as their services allow.
    pub unsequenced_refused: u64,
    /// View-change proposals (PREFRESHVIEW, ACCEPT) from a daemon outside
    /// this daemon's view, ignored: another group's primary asking an
    /// earlier incarnation of this slot.
    pub foreign_proposals_ignored: u64,
    /// Views (a Newview in an ENTRY: a joiner's welcome, or a repair) from
    /// a daemon outside this daemon's view while it is a member, ignored:
    /// another group's primary admitting this daemon on a JOIN it sent
    /// before it founded or joined a group of its own.
    pub foreign_views_ignored: u64,
}

#[derive(Debug, Clone)]
enum Phase {
    Joining {
        since: Instant,
        next_presence: Instant,
        /// Last presence of a joining daemon with a lower slot.
        lower_heard: Option<Instant>,
        /// Last presence of any member.
        member_heard: Option<Instant>,
        /// The member the vsync joiner asks, and when it last answered.
        contact: Option<(Instant, NodeId)>,
    },
    Member,
    /// Left on request; inert.
    Left,
}

/// One daemon's membership engine.
pub struct Membership {
    slot: u32,
    /// Other configured slots (empty with discovery).
    peers: Vec<u32>,
    /// Presence goes to the discovery group, not to each peer slot.
    discovery: bool,
    incarnation: u32,
    config: Config,
    seed: u64,
    inner: Vsync,
    phase: Phase,
    /// Last presence answer sent to each joining slot.
    answered: BTreeMap<u32, Instant>,
    /// While a member: when the next merge probe is due.
    next_probe: Option<Instant>,
    /// Members of other groups heard since this view was installed, with
    /// when each was first heard.
    foreign: BTreeMap<NodeId, Instant>,
    /// While a member: slots of this view's members heard from under
    /// another id (restarted, or rejoined elsewhere), or under the id the
    /// view lists as a member of another group, with the id heard and when
    /// it was first and last heard. The daemon the view lists is gone for
    /// good.
    successors: BTreeMap<u32, Heard>,
    /// When this daemon last installed a view (while a member).
    last_view_at: Instant,
    outbox: VecDeque<Transmit>,
    events: VecDeque<MembershipEvent>,
    /// When this daemon was last dropped from its group: its multicasts
    /// that had no global sequence number yet (the old group never ordered
    /// them, so they may go again from the new incarnation).
    unsequenced_at_removal: Vec<u64>,
    stats: Stats,
}

impl Membership {
    /// Daemon `slot` of `slots` configured daemons, first incarnation
    /// `incarnation` (the caller makes it differ across restarts, e.g. from
    /// the wall clock).
    pub fn new(
        slot: u32,
        slots: u32,
        incarnation: u32,
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<Membership, vsync::ConfigError> {
        assert!(
            slot < slots && slots as usize <= MAX_SLOTS,
            "slot {slot} of {slots} (at most {MAX_SLOTS})"
        );
        let me = daemon_id(slot, incarnation);
        let inner = Vsync::joining(me, &[], config.vsync.clone(), seed ^ u64::from(me.0), now)?;
        Ok(Membership {
            slot,
            peers: (0..slots).filter(|s| *s != slot).collect(),
            discovery: false,
            incarnation,
            seed,
            inner,
            phase: Phase::Joining {
                since: now,
                next_presence: now,
                lower_heard: None,
                member_heard: None,
                contact: None,
            },
            answered: BTreeMap::new(),
            next_probe: None,
            foreign: BTreeMap::new(),
            successors: BTreeMap::new(),
            last_view_at: now,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            unsequenced_at_removal: Vec::new(),
            stats: Stats::default(),
            config,
        })
    }

    /// Daemon `slot` of a cluster whose daemons find each other by IP
    /// multicast: any of the [`MAX_SLOTS`] slots may be running, and while
    /// joining this daemon announces itself once per `presence_interval`
    /// to [`Destination::Multicast`]. Everything else is as with [`Membership::new`].
    pub fn discovering(
        slot: u32,
        incarnation: u32,
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<Membership, vsync::ConfigError> {
        let mut cluster = Membership::new(slot, MAX_SLOTS as u32, incarnation, config, seed, now)?;
        cluster.peers.clear();
        cluster.discovery = true;
        Ok(cluster)
    }

    /// Whether this daemon finds its peers by IP multicast.
    pub fn is_discovering(&self) -> bool {
        self.discovery
    }

    /// The wrapped vsync member (its view, counters).
    pub fn vsync(&self) -> &Vsync {
        &self.inner
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The local ids (of the incarnation that was dropped) of the
    /// multicasts that had not been sequenced when this daemon was last
    /// dropped from its group.
    pub fn unsequenced_at_removal(&self) -> &[u64] {
        &self.unsequenced_at_removal
    }

    /// Whether a view of `size` daemons holds the quorum (see
    /// [`Config::expected_votes`]): the same answer at every daemon of the
    /// view, since it depends on the view's size and the configuration only.
    pub fn holds_quorum(&self, size: usize) -> bool {
        let expected = match self.config.expected_votes {
            0 if self.discovery => return true,
            0 => self.peers.len() as u32 + 1,
            n => n,
        };
        let size = size as u32;
        (self.config.two_node && expected == 2 && size >= 1) || size * 2 > expected
    }

    /// Whether this daemon is in a group now.
    pub fn is_member(&self) -> bool {
        matches!(self.phase, Phase::Member)
    }

    /// Multicasts `payload` by pbcast alone, outside the total order
    /// ([`Vsync::multicast_unsequenced`]); a refusal is counted.
    pub fn multicast_unsequenced(&mut self, now: Instant, payload: &[u8]) -> Result<(), SendError> {
        let result = self.inner.multicast_unsequenced(now, payload);
        if result.is_err() {
            self.stats.unsequenced_refused += 1;
        }
        self.drain_inner(now);
        result
    }

    /// Leaves the group (graceful shutdown). A `Removed { Left }` event
    /// follows once the group installed a view without this daemon. A
    /// primary hands over to its first backup (with `committee_size = 1` it
    /// first takes one into the committee; docs/vsync.md).
    pub fn leave(&mut self, now: Instant) {
        let me = self.inner.node_id();
        match self.phase {
            // Alone in its view: there is nobody to install a view without
            // it, so it has left at once (a lone daemon's shutdown used to
            // wait for a view that never came).
            Phase::Member if self.inner.members() == [me] => {
                self.phase = Phase::Left;
                self.events.push_back(MembershipEvent {
                    me,
                    event: Event::Removed {
                        view: self.inner.view_id(),
                        reason: RemovedReason::Left,
                    },
                });
            }
            Phase::Member => self.inner.leave(now),
            Phase::Joining { .. } => self.phase = Phase::Left,
            Phase::Left => {}
        }
    }

    fn send_presence(&mut self, to: NodeId, member: bool) {
        self.send_presence_to(Destination::Node(to), member);
    }

    fn send_presence_to(&mut self, destination: Destination, member: bool) {
        let view = self.inner.view_id();
        let (size, lowest) = if member { self.rank() } else { (0, 0) };
        let packet = Packet::Presence {
            member,
            view,
            size,
            lowest,
        };
        if let Ok(bytes) = packet.to_vec(self.inner.node_id().0) {
            self.stats.presence_sent += 1;
            self.outbox.push_back(Transmit {
                destination,
                payload: Bytes::from(bytes),
            });
        }
    }

    /// One round of presence while joining: to the discovery group, or to
    /// every configured peer slot.
    fn announce(&mut self) {
        if self.discovery {
            self.send_presence_to(Destination::Multicast, false);
            return;
        }
        for slot in self.peers.clone() {
            self.send_presence(NodeId(slot), false);
        }
    }

    /// This daemon's group's rank: its size and lowest slot.
    fn rank(&self) -> (u32, u32) {
        let members = self.inner.members();
        let lowest = members.iter().map(|m| slot_of(*m)).min().unwrap_or(0);
        (members.len() as u32, lowest)
    }

    /// Probes every peer slot outside the view (or the discovery group).
    /// Only the view's lowest slot probes: every member of another group
    /// hears it, and one prober per group keeps the cost at one datagram
    /// per peer outside the view per interval, whatever the group's size.
    fn probe(&mut self) {
        if self.rank().1 != self.slot {
            return;
        }
        if self.discovery {
            self.send_presence_to(Destination::Multicast, true);
            return;
        }
        let inside: Vec<u32> = self.inner.members().iter().map(|m| slot_of(*m)).collect();
        for slot in self.peers.clone() {
            if !inside.contains(&slot) {
                self.send_presence(NodeId(slot), true);
            }
        }
    }

    /// A member heard a member of another group: it joins that group if the
    /// group ranks before its own and it has kept hearing of it.
    fn on_foreign_member(&mut self, now: Instant, from: NodeId, theirs: (u32, u32)) {
        if self.inner.members().contains(&from) {
            return;
        }
        let first = *self.foreign.entry(from).or_insert(now);
        let (size, lowest) = self.rank();
        let ranks_before = theirs.0 > size || (theirs.0 == size && theirs.1 < lowest);
        let settled = now.saturating_duration_since(first) >= self.config.merge_probe_interval * 2;
        if ranks_before && settled {
            self.merge_into(now, from);
        }
    }

    fn on_presence(
        &mut self,
        now: Instant,
        from: NodeId,
        (member, view): (bool, u64),
        theirs: (u32, u32),
    ) {
        self.stats.presence_received += 1;
        if slot_of(from) == self.slot {
            return;
        }
        if self.is_member() {
            self.note_successor(now, from, member.then_some(view));
        }
        let interval = self.config.presence_interval;
        match &mut self.phase {
            Phase::Joining {
                lower_heard,
                member_heard,
                contact,
                ..
            } => {
                if member {
                    *member_heard = Some(now);
                    // Keep asking the same member while it answers; switch
                    // when it has been silent for a few presence rounds.
                    let switch = match *contact {
                        None => true,
                        Some((_, who)) if who == from => false,
                        Some((at, _)) => now.saturating_duration_since(at) >= interval * 4,
                    };
                    if switch || contact.is_some_and(|(_, who)| who == from) {
                        *contact = Some((now, from));
                    }
                    if switch {
                        self.join_through(now, from);
                    }
                } else if slot_of(from) < self.slot {
                    *lower_heard = Some(now);
                }
            }
            Phase::Member if member => self.on_foreign_member(now, from, theirs),
            Phase::Member => {
                let slot = slot_of(from);
                let due = self
                    .answered
                    .get(&slot)
                    .is_none_or(|at| now.saturating_duration_since(*at) >= interval / 2);
                if due {
                    self.answered.insert(slot, now);
                    self.send_presence(from, true);
                }
            }
            _ => {}
        }
    }

    /// Notes `from` if its slot's member in this view has another id: that
    /// daemon restarted, or was evicted and rejoined, so the id the view
    /// lists will never acknowledge a view change again. Or if `from` is
    /// listed but says it is a member of another group (`member_of`, a
    /// view id of another group's numbering, [`vsync::FOREIGN`]): a joiner
    /// two groups admitted installed the other's view and ignores this
    /// group's proposals, so it will not acknowledge one either (swarm
    /// seed 281 of the harshest shape: a primary whose view of four listed
    /// two such daemons waited out `view_period + partition_grace`, 25 s,
    /// and its group merged too late to converge).
    fn note_successor(&mut self, now: Instant, from: NodeId, member_of: Option<u64>) {
        let slot = slot_of(from);
        let elsewhere = member_of.is_some_and(|v| self.inner.foreign_view(v));
        let gone = self
            .inner
            .members()
            .iter()
            .any(|m| slot_of(*m) == slot && (*m != from || elsewhere));
        if !gone {
            return;
        }
        let fresh = Heard {
            id: from,
            first: now,
            last: now,
            elsewhere,
        };
        let heard = self.successors.entry(slot).or_insert(fresh);
        if heard.id == from && heard.elsewhere == elsewhere {
            heard.last = now;
        } else {
            *heard = fresh;
        }
    }

    /// When this member takes its group as lost because too many of its
    /// view's daemons came back under another id: with at most half of the
    /// view left, no view change can gather the majority of the old view it
    /// needs (viewchange.rs), so the group would wait out
    /// `view_period + partition_grace` for nothing (swarm seeds 9, 55 and 86
    /// of the harshest shape: 20 s stalled after the faults ended). A
    /// successor counts once heard twice, `presence_interval` apart (one
    /// stray datagram of an older incarnation must not count), and from
    /// `2 × merge_probe_interval` after it was first heard, so that a
    /// member a step behind its group, which moved on without those
    /// daemons, has time to install the view that drops them.
    fn majority_gone_deadline(&self) -> Option<Instant> {
        // Polled with every timeout: nothing to count in the usual case.
        if !self.is_member() || self.successors.is_empty() {
            return None;
        }
        let members = self.inner.members();
        let needed = (members.len() - members.len() / 2).max(1);
        let settle = self.config.merge_probe_interval * 2;
        let mut due: Vec<Instant> = self
            .successors
            .iter()
            .filter(|(slot, h)| {
                h.last >= h.first + self.config.presence_interval
                    && members
                        .iter()
                        .any(|m| slot_of(*m) == **slot && (*m != h.id || h.elsewhere))
            })
            .map(|(_, h)| h.first + settle)
            .collect();
        if due.len() < needed {
            return None;
        }
        due.sort();
        Some(due[needed - 1])
    }

    /// Restarts the vsync joiner with `contact` (a member) to ask.
    fn join_through(&mut self, now: Instant, contact: NodeId) {
        let me = self.inner.node_id();
        if let Ok(inner) = Vsync::joining(
            me,
            &[contact],
            self.config.vsync.clone(),
            self.seed ^ u64::from(me.0),
            now,
        ) {
            self.inner = inner;
        }
    }

    fn found(&mut self, now: Instant) {
        let me = self.inner.node_id();
        // Its view ids and records numbered apart from any other group's
        // (`vsync::group_base`): a joiner two groups admitted at once is
        // listed in both, and each group's members must not take the
        // other's records or proposals for their own (swarm seeds 3972,
        // 6514).
        let nonce = self.seed ^ now.as_nanos() ^ (self.stats.founded << 56);
        if let Ok(inner) = Vsync::new_at(
            me,
            &[me],
            self.config.vsync.clone(),
            self.seed ^ u64::from(me.0),
            now,
            group_base(me, nonce),
        ) {
            self.stats.founded += 1;
            self.inner = inner;
        }
    }

    /// Starts over under the next incarnation after an eviction.
    fn rejoin(&mut self, now: Instant) {
        self.stats.rejoins += 1;
        let members: Vec<NodeId> = self.inner.members().to_vec();
        self.start_over(now, members, None);
    }

    /// Leaves a group that has installed no view for too long: cut off
    /// from its majority, it would never install one. It starts over as a
    /// joiner, and the daemons it still reaches, which do the same, form a
    /// group (the lowest slot founds it, as at start-up). Clients see what
    /// an eviction shows them.
    fn leave_lost_group(&mut self, now: Instant) {
        self.stats.partitions += 1;
        self.drop_out_to_its_members(now);
    }

    /// Leaves the group and starts over asking its members.
    fn drop_out_to_its_members(&mut self, now: Instant) {
        let members: Vec<NodeId> = self.inner.members().to_vec();
        self.drop_out(now, members, None);
    }

    /// Leaves the group on the daemon engine's word: it joined, and every
    /// member that could send it the table of clients and groups left before
    /// it came (the sessions' `take_table_lost`), so it would wait for ever.
    /// It starts over under its next incarnation, as a daemon whose group
    /// was lost does; the daemons in the same plight do the same, and the
    /// lowest slot founds a group the others join.
    pub fn give_up_group(&mut self, now: Instant) {
        if !self.is_member() {
            return;
        }
        self.stats.tables_lost += 1;
        self.drop_out_to_its_members(now);
    }

    /// When a member takes its group as lost ([`Config::partition_grace`]):
    /// no view for a view period and the grace.
    fn partition_deadline(&self) -> Option<Instant> {
        self.is_member().then(|| {
            self.last_view_at + self.config.vsync.view_period + self.config.partition_grace
        })
    }

    /// Whether this daemon, as the primary, has asked for its view
    /// change's acknowledgements for `partition_grace` without a majority
    /// (asks one `ack_wait` apart). Such a primary waits on for ever, and
    /// its group, while it stays, ranks as many members as its view lists:
    /// another group formed meanwhile by the daemons it lost merges into
    /// it, and blocks too (seed 4166: a primary alone with a crashed member
    /// of a view of two; the daemons restarted meanwhile left their group
    /// for its, 25 s apart). In asks, not time since the change began: a
    /// primary that slept through the grace would leave at once on waking,
    /// before hearing that its group had moved on (seed 3911).
    fn stalled_as_primary(&self) -> bool {
        let wait = self.config.vsync.ack_wait.max(Duration::from_millis(1));
        let asks = self
            .config
            .partition_grace
            .as_nanos()
            .div_ceil(wait.as_nanos());
        let unanswered = u128::from(self.inner.view_change_unanswered());
        self.is_member() && unanswered >= asks.max(1)
    }

    /// Leaves this group for the one `contact` is a member of (see the
    /// module docs, "Merging"). Clients see what an eviction shows them.
    fn merge_into(&mut self, now: Instant, contact: NodeId) {
        self.stats.merges += 1;
        self.drop_out(now, vec![contact], Some(contact));
    }

    /// Leaves the group on this daemon's own decision, as an eviction
    /// would: what vsync had not sequenced is noted, the engine hears
    /// `Removed { Dropped }`, and a joiner starts under the next incarnation.
    fn drop_out(&mut self, now: Instant, contacts: Vec<NodeId>, contact: Option<NodeId>) {
        let me = self.inner.node_id();
        self.unsequenced_at_removal = self.inner.awaiting_ids();
        let event = Event::Removed {
            view: self.inner.view_id(),
            reason: RemovedReason::Dropped,
        };
        self.events.push_back(MembershipEvent { me, event });
        self.start_over(now, contacts, contact);
    }

    /// A vsync joiner under the next incarnation asking `contacts`.
    fn start_over(&mut self, now: Instant, contacts: Vec<NodeId>, contact: Option<NodeId>) {
        self.incarnation = self.incarnation.wrapping_add(1);
        let me = daemon_id(self.slot, self.incarnation);
        let contacts: Vec<NodeId> = contacts.into_iter().filter(|m| *m != me).collect();
        self.next_probe = None;
        self.foreign.clear();
        self.successors.clear();
        if let Ok(inner) = Vsync::joining(
            me,
            &contacts,
            self.config.vsync.clone(),
            self.seed ^ u64::from(me.0),
            now,
        ) {
            self.inner = inner;
        }
        self.phase = Phase::Joining {
            since: now,
            next_presence: now,
            lower_heard: None,
            member_heard: contact.map(|_| now),
            contact: contact.map(|c| (now, c)),
        };
    }

    /// Moves the inner engine's events out, tracking the phase.
    fn drain_inner(&mut self, now: Instant) {
        while let Some(event) = self.inner.poll_event() {
            let me = self.inner.node_id();
            match &event {
                Event::View(v) => {
                    self.last_view_at = now;
                    if v.first {
                        self.phase = Phase::Member;
                        self.next_probe = Some(now + self.config.merge_probe_interval);
                    }
                    self.foreign.clear();
                    self.successors.clear();
                }
                Event::Removed {
                    reason: RemovedReason::Dropped,
                    ..
                } => {
                    // vsync reset its sender state when it removed us.
                    self.unsequenced_at_removal = self.inner.unsequenced_at_removal().to_vec();
                    self.events.push_back(MembershipEvent { me, event });
                    self.rejoin(now);
                    continue;
                }
                Event::Removed {
                    reason: RemovedReason::Left,
                    ..
                } => {
                    // What vsync still has to send goes before the phase
                    // turns inert (`poll_transmit` then sends only the
                    // outbox): a primary that let itself go has just handed
                    // pbcast the Newview that removes it, naming its
                    // successor, and nobody else can send it. Withheld, the
                    // successor never installed that view; it took over
                    // with the Newview as an uncommitted candidate and asked
                    // the old view, whose majority the leaver was part of,
                    // for ever (a two-daemon view waited out
                    // `view_period + partition_grace`).
                    while let Some(t) = self.inner.poll_transmit(now) {
                        self.outbox.push_back(t);
                    }
                    self.phase = Phase::Left;
                }
                _ => {}
            }
            self.events.push_back(MembershipEvent { me, event });
        }
    }

    /// While a member: probe for other groups.
    fn member_timers(&mut self, now: Instant) {
        if self.partition_deadline().is_some_and(|t| t <= now) || self.stalled_as_primary() {
            self.leave_lost_group(now);
            return;
        }
        if self.majority_gone_deadline().is_some_and(|t| t <= now) {
            self.stats.majorities_gone += 1;
            self.leave_lost_group(now);
            return;
        }
        if !self.is_member() || self.next_probe.is_none_or(|t| t > now) {
            return;
        }
        self.probe();
        self.next_probe = Some(now + self.config.merge_probe_interval);
    }

    /// While joining: announce, and found a group when nobody answers.
    fn joining_timers(&mut self, now: Instant) {
        let Phase::Joining { next_presence, .. } = self.phase else {
            return;
        };
        if next_presence <= now {
            self.announce();
            if let Phase::Joining { next_presence, .. } = &mut self.phase {
                *next_presence = now + self.config.presence_interval;
            }
        }
        if self.found_deadline().is_some_and(|t| t <= now) {
            self.found(now);
        }
    }

    fn joining_deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Joining { next_presence, .. } => {
                Some((*next_presence).min(self.found_deadline()?))
            }
            _ => None,
        }
    }

    /// When founding is next considered: `found_after` past the start and
    /// past the last sign of a member or a lower joining slot.
    fn found_deadline(&self) -> Option<Instant> {
        let Phase::Joining {
            since,
            lower_heard,
            member_heard,
            ..
        } = &self.phase
        else {
            return None;
        };
        let last = [Some(*since), *lower_heard, *member_heard]
            .into_iter()
            .flatten()
            .max()?;
        Some(last + self.config.found_after)
    }
}

/// Whether a datagram is a vsync JOIN (another joiner's request).
fn is_join(datagram: &[u8]) -> bool {
    matches!(
        shoal_wire::decode_packet(datagram),
        Ok((_, Packet::Vsync { body })) if matches!(shoal_wire::vsync::decode(body), Ok(shoal_wire::vsync::Message::Join { .. }))
    )
}

/// Whether a vsync packet is a proposal sent to one member (a direct
/// PREFRESHVIEW or an ACCEPT): a member that answers it promises the
/// proposer not to acknowledge a lower (view, epoch).
fn is_proposal(packet: &Packet<'_>) -> bool {
    use shoal_wire::vsync::Message;
    matches!(
        packet,
        Packet::Vsync { body } if matches!(
            shoal_wire::vsync::decode(body),
            Ok(Message::Prefreshview { .. } | Message::Accept { .. })
        )
    )
}

/// Whether a vsync packet carries a view (a Newview in an ENTRY: a
/// joiner's welcome, or a repair).
fn is_view_entry(packet: &Packet<'_>) -> bool {
    use shoal_wire::vsync::{Entry, Message};
    matches!(
        packet,
        Packet::Vsync { body } if matches!(
            shoal_wire::vsync::decode(body),
            Ok(Message::Entry { entry: Entry::Newview(_), .. })
        )
    )
}

/// `datagram` without the proposals ([`is_proposal`]) and views
/// ([`is_view_entry`]) packed in it, and how many of each there were;
/// `None` when it holds neither (or does not decode: vsync counts that).
fn without_foreign(datagram: &[u8]) -> Option<(Vec<u8>, u64, u64)> {
    let packets: Vec<_> = shoal_wire::packets(datagram)
        .collect::<Result<_, _>>()
        .ok()?;
    let proposals = packets.iter().filter(|(_, p)| is_proposal(p)).count() as u64;
    let views = packets.iter().filter(|(_, p)| is_view_entry(p)).count() as u64;
    if proposals + views == 0 {
        return None;
    }
    let mut rest = Vec::new();
    for (header, packet) in packets
        .iter()
        .filter(|(_, p)| !is_proposal(p) && !is_view_entry(p))
    {
        packet.encode(header.sender, &mut rest).ok()?;
    }
    Some((rest, proposals, views))
}

impl Engine for Membership {
    type Event = MembershipEvent;

    fn node_id(&self) -> NodeId {
        self.inner.node_id()
    }

    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        if matches!(self.phase, Phase::Left) {
            return;
        }
        if let Ok((
            header,
            Packet::Presence {
                member,
                view,
                size,
                lowest,
            },
        )) = shoal_wire::decode_packet(datagram)
        {
            if header.kind == Kind::Presence && header.sender == from.0 {
                self.on_presence(now, from, (member, view), (size, lowest));
            }
            return;
        }
        if matches!(self.phase, Phase::Joining { .. }) && is_join(datagram) {
            // A joiner would forward it to its contact, which may forward it
            // back: only members handle joins.
            self.stats.joins_ignored += 1;
            return;
        }
        // Another group's proposer: datagrams are routed by slot, so a
        // primary asking a member of its view that has since restarted or
        // rejoined elsewhere under a new incarnation reaches that slot's
        // new incarnation. Promising to it would make this member refuse
        // its own primary's lower (view, epoch) for good: its group would
        // install no view again and be taken as lost. (A proposer of this
        // daemon's own group is always in its view, unless this daemon
        // lags a view behind; it then answers once it has caught up.)
        //
        // Nor does a member take a view from outside its view: a primary
        // that admits this daemon on a JOIN it sent before it founded a
        // group of its own (the primary was asleep, say) sends it a
        // welcome, which it would file in its own group's order at that
        // gseq, as if its group had installed that view, while its own
        // primary gives the same gseqs to its messages (swarm seed 7518:
        // a message sent just after was delivered nowhere). The other
        // group drops it as failed, and the groups merge as any two do. A
        // member a view behind takes its views from its own committee.
        let foreign = self.is_member() && !self.inner.members().contains(&from);
        if let Some((rest, proposals, views)) = foreign.then(|| without_foreign(datagram)).flatten()
        {
            self.stats.foreign_proposals_ignored += proposals;
            self.stats.foreign_views_ignored += views;
            if !rest.is_empty() {
                self.inner.handle_datagram(now, from, &rest);
                self.drain_inner(now);
            }
            return;
        }
        self.inner.handle_datagram(now, from, datagram);
        self.drain_inner(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        if matches!(self.phase, Phase::Left) {
            return;
        }
        if self.inner.poll_timeout().is_some_and(|t| t <= now) {
            self.inner.handle_timeout(now);
        }
        // A view the timeout installed counts before the partition check.
        self.drain_inner(now);
        self.joining_timers(now);
        self.member_timers(now);
        self.drain_inner(now);
    }

    fn multicast(&mut self, now: Instant, payload: Bytes) -> Result<u64, SendError> {
        let result = self.inner.multicast(now, payload);
        self.drain_inner(now);
        result
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if let Some(t) = self.outbox.pop_front() {
            return Some(t);
        }
        if matches!(self.phase, Phase::Left) {
            return None;
        }
        self.inner.poll_transmit(now)
    }

    fn poll_event(&mut self) -> Option<MembershipEvent> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if matches!(self.phase, Phase::Left) {
            return None;
        }
        let probe = self.next_probe.filter(|_| self.is_member());
        [
            self.inner.poll_timeout(),
            self.joining_deadline(),
            probe,
            self.partition_deadline(),
            self.majority_gone_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

#[cfg(test)]
mod tests;
