//! Virtual synchrony over Bimodal Multicast, with a k-member leader
//! committee: P000 (Gupta, Birman, van Renesse, "Fighting fire with fire")
//! §5.2, Figs 7 to 9. The design, the committee's agreement protocol and its
//! failure assumptions are in `docs/vsync.md`.
//!
//! - **Sending** (Fig 7): the sender's vsync layer sends a Gseq Req carrying
//!   the message to the committee's primary, which replicates it to every
//!   backup, assigns the next global sequence number (gseq) and answers with
//!   a Gseq ack; the sender then disseminates the message with its own
//!   [`Pbcast`]. A sender keeps at most `gseq_window` messages waiting.
//! - **Delivery** in gseq order. A member missing the next gseq asks a
//!   committee member after an adaptive timeout (`member.rs`); idle members
//!   ask once per `idle_solicit_interval`, so a lost tail is found.
//! - **Views** (Fig 8) every `view_period`, and on demand for joins, leaves
//!   and committee changes: Prefreshview by pbcast, AckPrefreshview deferred
//!   at random, `ack_wait`, then a Newview taking the next gseq. Members that
//!   did not acknowledge are dropped. Failures are detected this way only,
//!   as in the paper (the gossip failure detector is not used here).
//! - **Committee** (`committee.rs`): primary-backup with an epoch-stamped
//!   takeover; survives k-1 crashes of committee members.
//!
//! Sans-IO: no clock, no socket, one seeded RNG.

mod committee;
mod config;
mod member;
mod sender;
mod viewchange;

#[cfg(test)]
pub(crate) mod harness;
#[cfg(test)]
mod tests;

pub use config::{Config, ConfigError};
pub use sender::first_local_id;

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_wire::vsync::{self as wire, Message, NewView};
use shoal_wire::{Kind, Packet};

use crate::engine::{Destination, Engine, NodeId, SendError, Transmit};
use crate::pbcast::{self, Pbcast};
use crate::time::Instant;
use committee::Committee;

/// Why the view changed (the most serious reason when there are several).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewReason {
    /// The group's first view, given at creation.
    Initial,
    Failure,
    Leave,
    Join,
    /// The committee itself changed.
    Committee,
    Periodic,
}

/// A membership view as delivered to the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub id: u64,
    /// Ascending.
    pub members: Vec<NodeId>,
    /// Takeover order: `committee[0]` is the primary.
    pub committee: Vec<NodeId>,
    /// The gseq of this view's Newview: messages delivered in this view have
    /// larger gseqs. For a joiner, delivery starts right after it.
    pub gseq: u64,
    pub joined: Vec<NodeId>,
    pub left: Vec<NodeId>,
    /// Removed for not acknowledging the Prefreshview.
    pub failed: Vec<NodeId>,
    pub reason: ViewReason,
    /// This member's first view: the state-transfer hook. The application
    /// fetches the state as of `gseq` before applying later deliveries.
    pub first: bool,
}

/// Why this member is no longer in the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovedReason {
    /// It asked to leave.
    Left,
    /// It did not acknowledge a view change in time (it crashed, slept or
    /// fell behind, P000 §6.2).
    Dropped,
}

/// What a vsync member tells its application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message, in gseq order, once.
    Deliver {
        sender: NodeId,
        /// The id `multicast` returned at the sender.
        local_id: u64,
        gseq: u64,
        payload: Bytes,
    },
    View(View),
    /// This member was removed in view `view`; the engine is inert from now on.
    Removed {
        view: u64,
        reason: RemovedReason,
    },
    /// A message sent with [`Vsync::multicast_unsequenced`]: delivered by
    /// pbcast alone, when it arrives, outside the total order and the views.
    Unsequenced {
        sender: NodeId,
        payload: Bytes,
    },
}

/// Counters of one member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Vsync datagrams refused (bad encoding, spoofed sender).
    pub malformed: u64,
    pub delivered: u64,
    pub duplicates: u64,
    pub repair_requests_sent: u64,
    pub repair_requests_received: u64,
    pub repairs_sent: u64,
    pub gseq_reqs_received: u64,
    pub acks_prefreshview_sent: u64,
    pub views_installed: u64,
    /// Silent members a primary asked once more because it had heard from
    /// them during the view change (`Config::ask_heard_again`).
    pub view_acks_asked_again: u64,
    pub takeovers: u64,
    /// Times this member left the committee on hearing a higher epoch from
    /// a backup (a newer primary exists).
    pub stepped_down: u64,
    /// Takeovers this backup declined because its store lacked records the
    /// primary had announced committed.
    pub takeovers_refused: u64,
    /// View changes this primary abandoned (it left the committee): a
    /// majority's answers showed another proposer's Newview may have been
    /// chosen for that view, one this primary cannot complete.
    pub newviews_abandoned: u64,
    pub vsync_datagrams_sent: u64,
    /// Repair answers from outside the view that this member did not ask
    /// for, ignored (`Vsync::foreign_answer`).
    pub foreign_answers_ignored: u64,
    /// Messages naming a view or a global sequence number of another group
    /// ([`FOREIGN`]), ignored: from a daemon listed in this member's view
    /// that lives in a group of its own.
    pub foreign_group_ignored: u64,
}

/// What a member holds in its buffers ([`Vsync::buffered`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Buffered {
    /// Records in this member's committee store (0 outside the committee):
    /// until every member of the view delivered them (`progress_interval`),
    /// or until the next view change.
    pub committee_records: usize,
    /// Payload bytes of those records.
    pub committee_bytes: usize,
    /// Records that arrived ahead of the next one to deliver.
    pub pending_records: usize,
    /// Messages pbcast keeps for gossip repair (`gc_rounds`).
    pub pbcast_messages: usize,
}

/// Where this member stands in the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Joining,
    Member,
    Removed,
}

/// A record of the history, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    Data {
        sender: NodeId,
        local_id: u64,
        payload: Bytes,
    },
    Newview(NewView),
}

impl Record {
    /// A decoded entry as a record; `own` makes the payload owned (a copy,
    /// or a slice of a shared buffer the entry was decoded from).
    fn from_wire(entry: wire::Entry<'_>, own: impl FnOnce(&[u8]) -> Bytes) -> Record {
        match entry {
            wire::Entry::Data {
                sender,
                local_id,
                payload,
            } => Record::Data {
                sender: NodeId(sender),
                local_id,
                payload: own(payload),
            },
            wire::Entry::Newview(v) => Record::Newview(v),
        }
    }

    fn to_wire(&self) -> wire::Entry<'_> {
        match self {
            Record::Data {
                sender,
                local_id,
                payload,
            } => wire::Entry::Data {
                sender: sender.0,
                local_id: *local_id,
                payload,
            },
            Record::Newview(v) => wire::Entry::Newview(v.clone()),
        }
    }
}

/// The view as this member last installed it.
#[derive(Debug, Clone)]
struct CurrentView {
    id: u64,
    members: Vec<NodeId>,
    committee: Vec<NodeId>,
}

/// One vsync member (and, when it is on the committee, its committee role).
pub struct Vsync {
    me: NodeId,
    config: Config,
    rng: Xoshiro256PlusPlus,
    /// A separate stream for the repair timers' jitter, so that adding it
    /// left every other random choice (ack deferral) as it was.
    repair_rng: Xoshiro256PlusPlus,
    seed: u64,
    last_now: Instant,
    status: Status,
    pbcast: Option<Pbcast>,
    view: CurrentView,
    member: member::MemberState,
    sender: sender::SenderState,
    committee: Option<Committee>,
    /// Vsync control datagrams, sent before pbcast's.
    outbox: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: Stats,
    /// When this member was removed: its multicasts that had no global
    /// sequence number yet (`awaiting_ids` then), kept for the application.
    unsequenced_at_removal: Vec<u64>,
}

fn nodes(ids: &[u32]) -> Vec<NodeId> {
    ids.iter().copied().map(NodeId).collect()
}

/// How far apart two view ids (or two global sequence numbers) must be to
/// belong to two different groups: bases are multiples of 2^40
/// ([`group_base`]), and no member lags its group by 2^39 records or views.
pub const FOREIGN: u64 = 1 << 39;

/// A base for a group founded by `founder` ([`Vsync::new_at`]): one of
/// 2^23 multiples of 2^40 (bit 63 stays clear, so a group has 2^40 records
/// and views before it could reach another base), drawn from the founder
/// and `nonce` (anything that differs between two foundings by the same
/// founder, such as its clock). Two groups formed apart share a base with
/// probability 2^-23.
pub fn group_base(founder: NodeId, nonce: u64) -> u64 {
    // splitmix64's finaliser: every input bit reaches the bits taken.
    let mut z = (u64::from(founder.0) << 32) ^ nonce;
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((z & 0x7F_FFFF) | 1) << 40
}

/// A view id as people read it: the view's number within its group and
/// the group's base ([`group_base`]) in hex, `7 of 2f1a03` (just `7` for a
/// group numbered from 0).
pub fn display_view(id: u64) -> String {
    match id >> 40 {
        0 => id.to_string(),
        group => format!("{} of {group:x}", id & ((1 << 40) - 1)),
    }
}

fn ids(nodes: &[NodeId]) -> Vec<u32> {
    nodes.iter().map(|n| n.0).collect()
}

impl Vsync {
    /// A founding member of the group `members` (view 0, committee = the k
    /// lowest ids, the lowest the primary).
    pub fn new(
        me: NodeId,
        members: &[NodeId],
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<Vsync, ConfigError> {
        Vsync::new_at(me, members, config, seed, now, 0)
    }

    /// [`Vsync::new`], the group's view ids and global sequence numbers
    /// starting at `base` rather than 0. Every founding member must be
    /// given the same. A daemon that founds a group alone gives each group
    /// a base of its own ([`group_base`]), so that two groups formed apart
    /// never number two records or two views alike: a daemon listed in a
    /// view it never installed (a joiner admitted by two groups at once)
    /// still sends as a member of it, and its own group's records and
    /// proposals are then ignored as foreign ([`FOREIGN`]) instead of taken
    /// for the group's (swarm seeds 3972 and 6514).
    pub fn new_at(
        me: NodeId,
        members: &[NodeId],
        config: Config,
        seed: u64,
        now: Instant,
        base: u64,
    ) -> Result<Vsync, ConfigError> {
        let mut members = members.to_vec();
        members.sort_unstable();
        members.dedup();
        if members.is_empty() {
            return Err(ConfigError::NoMembers);
        }
        if members.binary_search(&me).is_err() {
            return Err(ConfigError::NotAMember(me.0));
        }
        let mut engine = Vsync::joining(me, &members, config, seed, now)?;
        let k = engine.config.committee_size.get() as usize;
        let committee: Vec<NodeId> = members.iter().copied().take(k).collect();
        let pb = Pbcast::new(me, &members, engine.config.pbcast.clone(), seed, now)?;
        engine.pbcast = Some(pb);
        engine.status = Status::Member;
        engine.view = CurrentView {
            id: base,
            members: members.clone(),
            committee: committee.clone(),
        };
        if let Some(position) = committee.iter().position(|c| *c == me) {
            let initial = NewView {
                view: base,
                epoch: 0,
                members: ids(&members),
                committee: ids(&committee),
                left: Vec::new(),
                reasons: 0,
            };
            engine.committee = Some(Committee::founding(
                position,
                initial,
                &engine.config,
                now,
                base,
            ));
        }
        engine.events.push_back(Event::View(View {
            id: base,
            members,
            committee,
            gseq: base,
            joined: Vec::new(),
            left: Vec::new(),
            failed: Vec::new(),
            reason: ViewReason::Initial,
            first: true,
        }));
        engine.member.expect_from(base, now);
        Ok(engine)
    }

    /// A process asking to join through `contacts` (any current members; the
    /// committee is best). It delivers nothing until a Newview including it
    /// arrives; its first `View` event has `first: true`.
    pub fn joining(
        me: NodeId,
        contacts: &[NodeId],
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<Vsync, ConfigError> {
        config.validate()?;
        let mut contacts = contacts.to_vec();
        contacts.retain(|c| *c != me);
        Ok(Vsync {
            me,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x5653_594e_4300),
            repair_rng: Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x5245_5041_4952),
            seed,
            last_now: now,
            status: Status::Joining,
            pbcast: None,
            view: CurrentView {
                id: 0,
                members: Vec::new(),
                committee: contacts,
            },
            member: member::MemberState::new(now),
            sender: sender::SenderState::new(me, now),
            committee: None,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
            unsequenced_at_removal: Vec::new(),
            config,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The last view this member installed (empty while joining).
    pub fn members(&self) -> &[NodeId] {
        &self.view.members
    }

    /// The committee of the last view installed, primary first.
    pub fn committee(&self) -> &[NodeId] {
        &self.view.committee
    }

    pub fn view_id(&self) -> u64 {
        self.view.id
    }

    /// Whether this member is the committee's primary.
    pub fn is_primary(&self) -> bool {
        self.committee.as_ref().is_some_and(Committee::is_primary)
    }

    /// How many times this member, as the primary, has asked again for
    /// acknowledgements of its view change for want of a majority, one
    /// `ack_wait` apart (0 without one under way). Counted in asks rather
    /// than time: a primary that slept through the wait has not asked, and
    /// learns first what its group did meanwhile.
    pub fn view_change_unanswered(&self) -> u32 {
        self.committee
            .as_ref()
            .and_then(Committee::view_change)
            .map_or(0, |vc| vc.unanswered)
    }

    /// The next gseq this member will deliver.
    pub fn next_gseq(&self) -> u64 {
        self.member.next
    }

    /// One line of this member's sequencing state, for diagnostics
    /// (`shoal status`): what it delivers next, what waits for a gseq, and
    /// its committee role with the frontiers that gate commits.
    pub fn debug_line(&self) -> String {
        let m = &self.member;
        let mut line = format!(
            "next {} (pending {}, committed known {}), awaiting gseq {}",
            m.next,
            m.pending.len(),
            m.committed_known,
            self.sender.awaiting.len()
        );
        let Some(c) = &self.committee else {
            return line;
        };
        line += &format!(
            "; committee epoch {} base {} committed {} store end {}",
            c.epoch,
            c.base,
            c.committed,
            c.store_end()
        );
        match &c.role {
            committee::Role::Primary(p) => {
                let backups: Vec<String> = p
                    .backups
                    .iter()
                    .map(|(b, r)| format!("{}:{}/{}", b.0, r.acked, r.sent))
                    .collect();
                line += &format!(
                    "; primary next gseq {} fence {:?} view change {:?} held {} backups [{}]",
                    p.next_gseq,
                    p.fence,
                    p.vc.as_ref().map(|v| (v.view, v.decided, v.acks.len())),
                    p.held.len(),
                    backups.join(" ")
                );
            }
            committee::Role::Backup(b) => line += &format!("; backup confirmed {}", b.confirmed),
        }
        line
    }

    /// A multicast would be accepted now.
    pub fn can_send(&self) -> bool {
        self.status == Status::Member
            && self.sender.awaiting.len() < self.config.gseq_window.get() as usize
    }

    /// Pbcast's counters (none while joining or after removal).
    pub fn pbcast_stats(&self) -> Option<&pbcast::Stats> {
        self.pbcast.as_ref().map(Pbcast::stats)
    }

    /// What this member holds in its buffers, for memory metrics.
    pub fn buffered(&self) -> Buffered {
        let store = self.committee.as_ref().map(|c| &c.store);
        let payload_bytes = |r: &Record| match r {
            Record::Data { payload, .. } => payload.len(),
            Record::Newview(_) => 0,
        };
        Buffered {
            committee_records: store.map_or(0, BTreeMap::len),
            committee_bytes: store
                .map_or(0, |s| s.values().map(|r| payload_bytes(&r.record)).sum()),
            pending_records: self.member.pending.len(),
            pbcast_messages: self.pbcast.as_ref().map_or(0, Pbcast::buffered),
        }
    }

    /// Multicasts `payload` by pbcast alone, outside the total order: each
    /// member pbcast reaches (this one too) delivers it once, as
    /// [`Event::Unsequenced`], when it arrives, with pbcast's bimodal
    /// guarantee and no agreement on order or view. For services below
    /// virtual synchrony (the daemons' unreliable and probabilistic). Not
    /// paused by view changes. While this member has no view it refuses
    /// with `WindowFull` (retry).
    pub fn multicast_unsequenced(&mut self, now: Instant, payload: &[u8]) -> Result<(), SendError> {
        let now = self.clamp(now);
        self.check_size(payload.len())?;
        let carried = wire::Carried::Unsequenced { payload };
        let member = self.status == Status::Member;
        let (Some(pb), true, Ok(bytes)) = (self.pbcast.as_mut(), member, carried.to_vec()) else {
            return Err(SendError::WindowFull);
        };
        pb.multicast(now, Bytes::from(bytes))?;
        self.after_input(now);
        Ok(())
    }

    /// Refuses a payload larger than one carried record can hold.
    fn check_size(&self, len: usize) -> Result<(), SendError> {
        let max = self.config.max_payload();
        if len > max {
            return Err(SendError::TooLarge { len, max });
        }
        Ok(())
    }

    /// Asks the committee to remove this member. A `Removed { reason: Left }`
    /// event follows once the view without it is delivered.
    pub fn leave(&mut self, now: Instant) {
        let now = self.clamp(now);
        if self.status == Status::Member {
            self.sender.leaving = true;
            self.sender.leave_next_try = now;
            self.on_sender_timers(now);
        }
    }

    /// Whether this member's multicast `local_id` still waits for its global
    /// sequence number (its Gseq Req is retried across view changes, so it
    /// is not lost by one).
    pub fn awaits_sequence(&self, local_id: u64) -> bool {
        self.sender.awaiting.contains_key(&local_id)
    }

    /// This member's multicasts still waiting for a global sequence number.
    pub fn awaiting_ids(&self) -> Vec<u64> {
        self.sender.awaiting.keys().copied().collect()
    }

    /// After a removal: the multicasts [`Vsync::awaiting_ids`] listed when
    /// this member was removed (the sender's state is reset then).
    pub fn unsequenced_at_removal(&self) -> &[u64] {
        &self.unsequenced_at_removal
    }

    /// The global sequence number this member's multicast `local_id` was
    /// given, while it has not been delivered back (and for two views).
    pub fn sequence_of(&self, local_id: u64) -> Option<u64> {
        self.sender.sequenced.get(&local_id).copied()
    }

    /// Checks internal invariants; panics when one is broken.
    pub fn check_invariants(&self) {
        if let Some(c) = &self.committee {
            c.check_invariants();
        }
        if let Some(first) = self.member.pending.keys().next() {
            assert!(*first >= self.member.next, "pending below next");
        }
        if let Some(p) = &self.pbcast {
            p.check_invariants();
        }
    }

    fn clamp(&mut self, now: Instant) -> Instant {
        self.last_now = self.last_now.max(now);
        self.last_now
    }

    // ---- output helpers ---------------------------------------------------

    /// Queues one vsync packet to `to` (never to this member itself).
    fn send(&mut self, to: NodeId, message: &Message<'_>) {
        self.send_all(to, std::slice::from_ref(message));
    }

    /// Queues vsync packets to `to`, packed into as few datagrams as fit.
    fn send_all(&mut self, to: NodeId, messages: &[Message<'_>]) {
        let encoded = messages.iter().filter_map(|m| m.to_vec().ok()).collect();
        self.send_bodies(to, encoded);
    }

    /// Queues encoded vsync bodies to `to`, packed into as few datagrams as fit.
    fn send_bodies(&mut self, to: NodeId, bodies: Vec<Vec<u8>>) {
        if to == self.me {
            return;
        }
        let max = self.config.pbcast.max_datagram_size;
        let mut datagram = Vec::new();
        for body in &bodies {
            let packet = Packet::Vsync { body };
            if !datagram.is_empty() && datagram.len() + packet.encoded_len() > max {
                self.push_datagram(to, std::mem::take(&mut datagram));
            }
            if packet.encode(self.me.0, &mut datagram).is_err() {
                continue;
            }
        }
        if !datagram.is_empty() {
            self.push_datagram(to, datagram);
        }
    }

    fn push_datagram(&mut self, to: NodeId, datagram: Vec<u8>) {
        self.stats.vsync_datagrams_sent += 1;
        self.outbox.push_back(Transmit {
            destination: Destination::Node(to),
            payload: Bytes::from(datagram),
        });
    }

    /// Multicasts a carried record with this member's pbcast. Returns false
    /// when pbcast refused it (flow control).
    fn pbcast_carried(&mut self, now: Instant, carried: &wire::Carried<'_>) -> bool {
        let (Some(pb), Ok(bytes)) = (self.pbcast.as_mut(), carried.to_vec()) else {
            return false;
        };
        pb.multicast(now, Bytes::from(bytes)).is_ok()
    }

    // ---- input routing ----------------------------------------------------

    fn on_vsync_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        for item in shoal_wire::packets(datagram) {
            let body = match item {
                Ok((header, Packet::Vsync { body })) if header.sender == from.0 => body,
                _ => {
                    self.stats.malformed += 1;
                    return;
                }
            };
            match wire::decode(body) {
                Ok(message) => self.on_message(now, from, message),
                Err(_) => {
                    self.stats.malformed += 1;
                    return;
                }
            }
        }
        self.flush_replica_ack(now);
    }

    /// A repair answer (entries, the frontier, or `Removed`) from outside
    /// this member's view that it did not ask for: another group's
    /// committee member answering a request an earlier process of this
    /// member's slot sent (the runtime routes datagrams by slot; a daemon
    /// that restarts or rejoins takes the slot's traffic under a new id).
    /// Taken in, its records took this member's next gseqs, so its own
    /// group's records at those gseqs were dropped as duplicates and never
    /// delivered here (swarm seed 3350: 42 foreign records, and a
    /// restarted daemon's clients' messages held until a view change, then
    /// delivered out of FIFO order), and a `Removed` would have evicted it.
    /// An answer from outside the view is legitimate only after this member
    /// asked outside its committee (`MemberState::asked_outside`).
    fn foreign_answer(&self, from: NodeId, message: &Message<'_>) -> bool {
        self.status == Status::Member
            && matches!(
                message,
                Message::Entry { .. } | Message::RepairDone { .. } | Message::Removed { .. }
            )
            && !contains(&self.view.members, from)
            && !self.member.asked_outside
    }

    /// Whether `message` names a view or a global sequence number of
    /// another group than this member's ([`FOREIGN`]). Acknowledgements
    /// between committee members are not judged: a stale epoch is answered
    /// with `next` 0.
    fn names_another_group(&self, message: &Message<'_>) -> bool {
        let view = |v: u64| self.foreign_view(v);
        let gseq = |g: u64| self.foreign_gseq(g);
        match message {
            Message::GseqAck { view: v, .. }
            | Message::Removed { view: v }
            | Message::AckPrefreshview { view: v, .. }
            | Message::Accepted { view: v, .. }
            | Message::Outranked { view: v, .. }
            | Message::Prefreshview { view: v, .. } => view(*v),
            Message::Heartbeat(hb) => view(hb.view),
            Message::Accept { newview, .. } => view(newview.view),
            Message::RepairReq { next: g, .. }
            | Message::Entry { gseq: g, .. }
            | Message::RepairDone { committed: g, .. }
            | Message::Replicate { gseq: g, .. }
            | Message::Progress { next: g } => gseq(*g),
            _ => false,
        }
    }

    /// A view id of another group than this member's ([`FOREIGN`]).
    pub(crate) fn foreign_view(&self, view: u64) -> bool {
        self.status == Status::Member && view.abs_diff(self.view.id) >= FOREIGN
    }

    /// A global sequence number of another group than this member's.
    fn foreign_gseq(&self, gseq: u64) -> bool {
        self.status == Status::Member && gseq.abs_diff(self.member.next) >= FOREIGN
    }

    fn on_message(&mut self, now: Instant, from: NodeId, message: Message<'_>) {
        if self.foreign_answer(from, &message) {
            self.stats.foreign_answers_ignored += 1;
            return;
        }
        if self.names_another_group(&message) {
            self.stats.foreign_group_ignored += 1;
            return;
        }
        match message {
            Message::GseqReq {
                sender,
                local_id,
                oldest,
                payload,
            } => self.on_gseq_req(now, from, NodeId(sender), (local_id, oldest), payload),
            Message::GseqAck {
                local_id,
                gseq,
                view,
            } => self.on_gseq_ack(now, local_id, gseq, view),
            Message::RepairReq { next, upto } => self.on_repair_req(from, next, upto),
            Message::Entry { gseq, entry } => self.on_repair_entry(now, gseq, entry),
            Message::RepairDone { committed, .. } => self.on_repair_done(now, from, committed),
            Message::Removed { view } => self.on_removed(view, RemovedReason::Dropped),
            Message::AckPrefreshview {
                view,
                epoch,
                next,
                report,
            } => self.on_ack_prefreshview(now, from, (view, epoch, next), report),
            Message::Join { joiner } => self.on_join(now, from, NodeId(joiner)),
            Message::Leave { member } => self.on_leave(now, from, NodeId(member)),
            Message::Replicate {
                epoch,
                gseq,
                open,
                entry,
            } => self.on_replicate(now, from, epoch, (gseq, open), entry),
            Message::PeerAck { epoch, next } => self.on_peer_ack(now, from, epoch, next),
            Message::Heartbeat(hb) => self.on_heartbeat(now, from, hb),
            Message::ReplicaAck { epoch, next } => self.on_replica_ack(now, from, epoch, next),
            Message::RepairFor {
                requester,
                next,
                upto,
            } => self.on_repair_for(NodeId(requester), next, upto),
            Message::Progress { next } => self.on_progress(from, next),
            Message::Accept {
                epoch,
                gseq,
                newview,
            } => self.on_accept(from, epoch, gseq, newview),
            Message::Accepted { view, epoch } => self.on_accepted(now, from, view, epoch),
            Message::Outranked { view, epoch } => self.on_outranked(now, view, epoch),
            Message::Prefreshview { view, epoch } => self.on_prefreshview(now, view, epoch, from),
        }
    }

    /// Events of the pbcast underneath: carried vsync records.
    fn drain_pbcast(&mut self, now: Instant) {
        loop {
            let Some(event) = self.pbcast.as_mut().and_then(Pbcast::poll_event) else {
                return;
            };
            // Lost events need nothing: the committee repairs (P000 §5.2).
            let pbcast::Event::Deliver {
                source, payload, ..
            } = event
            else {
                continue;
            };
            match wire::decode_carried(&payload) {
                // Of another group ([`FOREIGN`]): from a daemon listed in
                // this member's view that lives in a group of its own.
                Ok(wire::Carried::Sequenced { gseq, .. }) if self.foreign_gseq(gseq) => {
                    self.stats.foreign_group_ignored += 1;
                }
                Ok(wire::Carried::Prefreshview { view, .. }) if self.foreign_view(view) => {
                    self.stats.foreign_group_ignored += 1;
                }
                Ok(wire::Carried::Sequenced { gseq, entry }) => {
                    // A slice of pbcast's delivery, not a copy.
                    let record = Record::from_wire(entry, |p| payload.slice_ref(p));
                    self.on_entry(now, gseq, record)
                }
                Ok(wire::Carried::Prefreshview {
                    view,
                    epoch,
                    primary,
                }) if primary == source.0 => self.on_prefreshview(now, view, epoch, source),
                Ok(wire::Carried::Unsequenced { payload: p }) => {
                    let payload = payload.slice_ref(p);
                    let sender = source;
                    self.events
                        .push_back(Event::Unsequenced { sender, payload });
                }
                _ => self.stats.malformed += 1,
            }
        }
    }

    /// This member is out of the group: tell the application once and go quiet.
    fn on_removed(&mut self, view: u64, reason: RemovedReason) {
        if self.status != Status::Member {
            return;
        }
        self.status = Status::Removed;
        // What pbcast still has to send leaves first: a primary that let
        // itself go has just given it the Newview that says so.
        if let Some(mut pb) = self.pbcast.take() {
            while let Some(t) = pb.poll_transmit(self.last_now) {
                self.outbox.push_back(t);
            }
        }
        self.committee = None;
        self.unsequenced_at_removal = self.awaiting_ids();
        // Local ids go on from where they were (acks still on their way
        // name none of those to come).
        let next_local = self.sender.next_local;
        self.sender = sender::SenderState::new(self.me, self.last_now);
        self.sender.next_local = next_local;
        self.member.pending.clear();
        self.events.push_back(Event::Removed { view, reason });
    }
}

impl Engine for Vsync {
    type Event = Event;

    fn node_id(&self) -> NodeId {
        self.me
    }

    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        let now = self.clamp(now);
        if self.status == Status::Removed {
            return;
        }
        self.note_heard(from);
        match shoal_wire::decode_header(datagram) {
            Ok(header) if header.kind == Kind::Vsync => self.on_vsync_datagram(now, from, datagram),
            Ok(_) => {
                if let Some(pb) = self.pbcast.as_mut() {
                    pb.handle_datagram(now, from, datagram);
                    self.drain_pbcast(now);
                }
            }
            Err(_) => self.stats.malformed += 1,
        }
        self.after_input(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        let now = self.clamp(now);
        if self.status == Status::Removed {
            return;
        }
        if let Some(pb) = self.pbcast.as_mut() {
            if pb.poll_timeout().is_some_and(|t| t <= now) {
                pb.handle_timeout(now);
                self.drain_pbcast(now);
            }
        }
        self.on_member_timers(now);
        self.on_sender_timers(now);
        self.on_committee_timers(now);
        self.after_input(now);
    }

    fn multicast(&mut self, now: Instant, payload: Bytes) -> Result<u64, SendError> {
        let now = self.clamp(now);
        self.check_size(payload.len())?;
        if !self.can_send() {
            return Err(SendError::WindowFull);
        }
        let id = self.originate(now, payload);
        self.after_input(now);
        Ok(id)
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        let now = self.clamp(now);
        if let Some(t) = self.outbox.pop_front() {
            return Some(t);
        }
        self.pbcast.as_mut()?.poll_transmit(now)
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.status == Status::Removed {
            return None;
        }
        let deadlines = [
            self.pbcast.as_ref().and_then(Pbcast::poll_timeout),
            self.member_deadline(),
            self.sender_deadline(),
            self.committee.as_ref().and_then(Committee::deadline),
        ];
        deadlines.into_iter().flatten().min()
    }
}

impl Vsync {
    /// Work every input may have unblocked.
    fn after_input(&mut self, now: Instant) {
        if self.status == Status::Removed {
            return;
        }
        self.retry_dissemination(now);
        if let Some(pb) = self.pbcast.as_mut() {
            // Multicasts made above put pbcast events (own deliveries) in its queue.
            let _ = pb;
            self.drain_pbcast(now);
        }
    }
}

/// Helper for sorted member lists.
fn contains(list: &[NodeId], node: NodeId) -> bool {
    list.binary_search(&node).is_ok()
}

type Store = BTreeMap<u64, committee::Stored>;
