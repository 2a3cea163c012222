//! The QSM region engine: one member of one region ([A] §2.2, §3; [B] §4,
//! §5). Every group mapped to the region shares its per-sender sequence
//! numbers and its recovery; per-group state is one small record.
//!
//! - **Dissemination**: a message goes once by the region's IP multicast,
//!   numbered per (sender, region).
//! - **Partitions**: the region's members, in ascending order, are cut into
//!   k = max(1, m / r) partitions of consecutive members (member i is in
//!   partition i·k/m), the first member of each being its leader. Message
//!   `seq` of sender `s` is cached by partition (seq + s) mod k: round robin
//!   over partitions as [B] §4 says, shifted per sender so that two senders
//!   do not load the same partition with the same numbers.
//! - **Token**: the region leader (the lowest member) starts a token every
//!   `token_interval`. Its route visits each partition's members in order,
//!   leader first, then returns to the partition leader ("close"), then
//!   moves on; after the last partition it returns to the region leader
//!   ("finish"). Per sender the token gathers the highest number seen, the
//!   lowest contiguous prefix (receive GC for the next round), and inside a
//!   partition what each member lacks (`wants`, pushed by the members after
//!   it and by the leader at close), what all of them lack (`nak`) and the
//!   first number of the partition's share not held by all (`part_stable`).
//! - **Recovery**: at its visit a member declares lost what it learned of at
//!   least `loss_suspicion` ago and still lacks; it lists it for its
//!   partition mates to push and pulls it from a random member of each other
//!   partition that caches part of it. At close the partition leader NAKs the
//!   sender for its share that no member holds; the sender retransmits those
//!   by unicast to the partition's members. At finish the region leader ACKs
//!   each sender with MaxContiguous + 1 (every message below is held by all
//!   of its caching partition) and the highest number seen; the sender drops
//!   what is ACKed and multicasts again what the whole region missed (sent
//!   long enough ago, above `seen`).
//! - **Pull sending**: `poll_transmit` builds packets when the driver can
//!   send: control (tokens, ACKs, NAKs, pulls) first, then repairs within
//!   `repair_rate`, then new data from the send window.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_wire::qsm::{self as wire, Message, Token, TokenRecord, Want};
use shoal_wire::{packets, Packet, SeqRange};

use super::config::{Config, ConfigError};
use super::regions::{GroupId, RegionId};
use crate::engine::{Destination, Engine, NodeId, SendError, Transmit};
use crate::time::Instant;

/// A region view as the membership service hands it to a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionView {
    pub id: RegionId,
    pub view: u64,
    /// Every member; order does not matter (the engine sorts).
    pub members: Vec<NodeId>,
    /// The groups mapped to the region.
    pub groups: Vec<GroupId>,
}

/// What the application is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message, in per-sender order (FIFO per sender and region).
    Deliver {
        source: NodeId,
        group: GroupId,
        seq: u64,
        payload: Bytes,
        /// It came by repair rather than the first multicast.
        recovered: bool,
    },
}

/// Why [`Qsm::multicast_to`] refused a message; the engine is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MulticastError {
    /// The send window is full (or refilling to its low watermark).
    #[error("send window full")]
    WindowFull,
    /// The group is not mapped to this region.
    #[error("group {0:?} is not in this region")]
    UnknownGroup(GroupId),
}

/// Per-group state, at senders and receivers alike: all a group costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupState {
    pub id: GroupId,
    pub sent: u64,
    pub delivered: u64,
}

/// Counters of one member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub tokens_started: u64,
    pub tokens_finished: u64,
    /// The last token's round trip at the region leader.
    pub token_rtt: Duration,
    /// The largest token sent, bytes.
    pub token_bytes_max: usize,
    pub acks_received: u64,
    pub naks_sent: u64,
    pub pulls_sent: u64,
    pub repairs_sent: u64,
    pub repairs_dropped: u64,
    /// Sender retransmissions by multicast (the whole region missed them).
    pub multicast_retransmissions: u64,
    pub duplicates: u64,
    pub bad_datagrams: u64,
}

/// Memory a member holds for messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Own messages not yet ACKed (including unsent ones).
    pub pending: usize,
    /// Others' messages received out of order, waiting for a gap.
    pub held: usize,
    /// Delivered messages of this member's partition share, kept for repair.
    pub cached: usize,
    /// Payload bytes of all of the above.
    pub payload_bytes: usize,
}

/// A step of the token's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Visit { member: usize, partition: u32 },
    Close { member: usize, partition: u32 },
    Finish,
}

/// Who is where in the current view.
#[derive(Debug, Clone)]
struct Layout {
    region: RegionId,
    view: u64,
    members: Vec<NodeId>,
    me: usize,
    partitions: u32,
    /// Per partition: its members' indices, ascending (leader first).
    partition_members: Vec<Vec<usize>>,
    route: Vec<Step>,
}

impl Layout {
    fn new(me: NodeId, view: &RegionView, replication: u32) -> Option<Layout> {
        let (members, me) = crate::engine::member_list(me, &view.members)?;
        let m = members.len();
        let k = (m / replication as usize).max(1);
        let mut partition_members = vec![Vec::new(); k];
        for i in 0..m {
            partition_members[i * k / m].push(i);
        }
        let mut route = Vec::with_capacity(m + k + 1);
        for (p, list) in partition_members.iter().enumerate() {
            for &member in list {
                route.push(Step::Visit {
                    member,
                    partition: p as u32,
                });
            }
            route.push(Step::Close {
                member: list[0],
                partition: p as u32,
            });
        }
        route.push(Step::Finish);
        Some(Layout {
            region: view.id,
            view: view.view,
            members,
            me,
            partitions: k as u32,
            partition_members,
            route,
        })
    }

    fn my_partition(&self) -> u32 {
        (self.me * self.partitions as usize / self.members.len()) as u32
    }

    /// The partition caching `seq` of `source`.
    fn caching(&self, source: NodeId, seq: u64) -> u32 {
        ((seq.wrapping_add(u64::from(source.0))) % u64::from(self.partitions)) as u32
    }

    fn step_node(&self, step: Step) -> usize {
        match step {
            Step::Visit { member, .. } | Step::Close { member, .. } => member,
            Step::Finish => 0,
        }
    }
}

/// One own message in the send window.
#[derive(Debug, Clone)]
struct Pending {
    group: GroupId,
    payload: Bytes,
    /// When first multicast; `None` until sent.
    sent: Option<Instant>,
}

/// The sending side: the window of own messages from the oldest unACKed.
#[derive(Debug, Default)]
struct Outbound {
    /// Sequence number of `pending[0]`.
    base: u64,
    pending: VecDeque<Pending>,
    /// Next sequence number to transmit for the first time.
    next_sent: u64,
    /// Refusing new messages until the window drains to the low watermark.
    paused: bool,
    /// No multicast retransmission of the tail before then.
    tail_retry_at: Instant,
    /// One past the highest own number another member reported seeing (the
    /// latest ACK's `seen`, kept across rounds; reset by a new view). What
    /// the sender puts in its own token record: see [`Qsm::visit`].
    seen: u64,
}

impl Outbound {
    fn next_seq(&self) -> u64 {
        self.base + self.pending.len() as u64
    }

    fn get(&self, seq: u64) -> Option<&Pending> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.pending.get(i)
    }
}

/// What a member holds of one other sender.
#[derive(Debug, Default)]
struct Inbound {
    /// Every message below has been delivered.
    contig: u64,
    /// One past the highest sequence number known to exist.
    max_seen: u64,
    /// Received above `contig`, waiting for a gap.
    held: BTreeMap<u64, (GroupId, Bytes)>,
    /// Delivered messages of this member's partition share, ascending.
    cache: VecDeque<(u64, GroupId, Bytes)>,
    /// (when, `max_seen` then): loss suspicion's clock.
    marks: VecDeque<(Instant, u64)>,
}

impl Inbound {
    fn get(&self, seq: u64) -> Option<(GroupId, &Bytes)> {
        if let Some((g, p)) = self.held.get(&seq) {
            return Some((*g, p));
        }
        let i = self.cache.partition_point(|(s, _, _)| *s < seq);
        match self.cache.get(i) {
            Some((s, g, p)) if *s == seq => Some((*g, p)),
            _ => None,
        }
    }

    fn see(&mut self, now: Instant, upto: u64) {
        if upto <= self.max_seen {
            return;
        }
        self.max_seen = upto;
        match self.marks.back_mut() {
            Some((at, seen)) if now.saturating_duration_since(*at) < MARK_GRAIN => *seen = upto,
            _ => self.marks.push_back((now, upto)),
        }
    }

    /// Numbers known to exist for at least `suspicion`: candidates for loss.
    fn frontier(&mut self, now: Instant, suspicion: Duration) -> u64 {
        let cutoff = now.saturating_sub(suspicion);
        while self.marks.len() >= 2 && self.marks[1].0 <= cutoff {
            self.marks.pop_front();
        }
        match self.marks.front() {
            Some(&(at, seen)) if at <= cutoff => seen,
            _ => self.contig,
        }
    }

    /// Missing ranges below `frontier`, oldest first, at most `max`.
    fn missing(&self, frontier: u64, max: usize) -> Vec<SeqRange> {
        let mut out = Vec::new();
        if frontier <= self.contig {
            return out;
        }
        let mut from = self.contig;
        for &seq in self.held.range(self.contig..frontier).map(|(s, _)| s) {
            if seq > from {
                out.push(SeqRange {
                    first: from,
                    last: seq - 1,
                });
                if out.len() == max {
                    return out;
                }
            }
            from = seq + 1;
        }
        if from < frontier {
            out.push(SeqRange {
                first: from,
                last: frontier - 1,
            });
        }
        out
    }

    /// The first number of partition `p`'s share (of `k`) this member lacks.
    fn part_next(&self, source: NodeId, p: u32, k: u32) -> u64 {
        let k = u64::from(k);
        let shift = u64::from(source.0) % k;
        let at = (self.contig + shift) % k;
        let mut seq = self.contig + (u64::from(p) + k - at) % k;
        while self.held.contains_key(&seq) {
            seq += k;
        }
        seq
    }

    fn gc(&mut self, below: u64) {
        while self.cache.front().is_some_and(|(s, _, _)| *s < below) {
            self.cache.pop_front();
        }
    }
}

/// Marks of `max_seen` closer than this merge (bounds their number).
const MARK_GRAIN: Duration = Duration::from_millis(10);
/// New messages a rate-capped sender may send back to back.
const DATA_BURST: f64 = 8.0;
/// Repairs one pull, want or NAK is answered with, at most.
const ANSWER_MAX: u64 = 4_096;
/// Sequence numbers one pull or want is scanned for, at most.
const SCAN_MAX: u64 = 65_536;

/// A repair to send when the rate allows.
#[derive(Debug, Clone, Copy)]
struct RepairJob {
    to: Destination,
    source: NodeId,
    seq: u64,
}

/// One member of one QSM region. See the module documentation.
pub struct Qsm {
    me: NodeId,
    config: Config,
    layout: Layout,
    rng: Xoshiro256PlusPlus,
    /// Ascending by id.
    groups: Vec<GroupState>,
    /// Round robin over `groups` for [`Engine::multicast`].
    next_group: usize,
    out: Outbound,
    /// Indexed by `NodeId.0`.
    inbound: Vec<Option<Inbound>>,
    /// Encoded control packets, oldest first.
    control: VecDeque<Transmit>,
    /// Repairs by (not before, order): answers to pulls are paced.
    repairs: BTreeMap<(Instant, u64), RepairJob>,
    repair_order: u64,
    repair_credit: f64,
    repair_refilled: Instant,
    /// `send_rate_max`'s bucket: new messages that may go now.
    data_credit: f64,
    data_refilled: Instant,
    events: VecDeque<Event>,
    /// Region leader: when the next token starts.
    next_token_at: Option<Instant>,
    round: u64,
    /// Region leader: per source, the GC point the next token carries.
    gc_for: BTreeMap<u32, u64>,
    /// (round, hop) of the last token step received and run.
    last_hop: Option<(u64, u32)>,
    /// Region leader: (round, start) of rounds under way.
    rounds: VecDeque<(u64, Instant)>,
    /// Per source: one past the last number the owner said must be
    /// delivered here ([`Qsm::expect`]); pulled from the source itself
    /// until delivered.
    expected: BTreeMap<u32, u64>,
    /// When the next pull of `expected` goes.
    expect_pull_at: Option<Instant>,
    last_now: Instant,
    pub stats: Stats,
}

impl Qsm {
    /// A member `me` of `view`; `seed` feeds its RNG (random pull targets).
    pub fn new(
        me: NodeId,
        view: &RegionView,
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<Qsm, ConfigError> {
        config.validate()?;
        let layout = Layout::new(me, view, config.replication.get())
            .expect("a member is in its own region view");
        let mut groups: Vec<GroupState> = view
            .groups
            .iter()
            .map(|&id| GroupState {
                id,
                sent: 0,
                delivered: 0,
            })
            .collect();
        groups.sort_by_key(|g| g.id);
        groups.dedup_by_key(|g| g.id);
        groups.shrink_to_fit();
        let next_token_at = (layout.me == 0).then(|| now + config.token_interval);
        Ok(Qsm {
            me,
            repair_credit: f64::from(config.repair_burst.get()),
            config,
            layout,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            groups,
            next_group: 0,
            out: Outbound::default(),
            inbound: Vec::new(),
            control: VecDeque::new(),
            repairs: BTreeMap::new(),
            repair_order: 0,
            repair_refilled: now,
            data_credit: 1.0,
            data_refilled: now,
            events: VecDeque::new(),
            next_token_at,
            round: 0,
            gc_for: BTreeMap::new(),
            rounds: VecDeque::new(),
            last_hop: None,
            expected: BTreeMap::new(),
            expect_pull_at: None,
            last_now: now,
            stats: Stats::default(),
        })
    }

    /// Multicasts `payload` to `group` (one of the region's groups).
    pub fn multicast_to(
        &mut self,
        now: Instant,
        group: GroupId,
        payload: Bytes,
    ) -> Result<u64, MulticastError> {
        let _ = self.clock(now);
        let Some(g) = self.group_index(group) else {
            return Err(MulticastError::UnknownGroup(group));
        };
        if !self.can_send() {
            if self.out.pending.len() >= self.config.send_window.get() as usize {
                self.out.paused = true;
            }
            return Err(MulticastError::WindowFull);
        }
        self.groups[g].sent += 1;
        self.groups[g].delivered += 1;
        let seq = self.out.next_seq();
        // A member delivers its own message at once (loopback).
        self.events.push_back(Event::Deliver {
            source: self.me,
            group,
            seq,
            payload: payload.clone(),
            recovered: false,
        });
        self.out.pending.push_back(Pending {
            group,
            payload,
            sent: None,
        });
        Ok(seq)
    }

    /// Where `group`'s record is. A region whose group ids are their
    /// positions (0, 1, 2, ...: the daemon numbers the groups of an
    /// instance so) finds it without a search: at 10,000 groups a search
    /// per message at each end was a measurable part of what many groups
    /// cost.
    fn group_index(&self, group: GroupId) -> Option<usize> {
        let i = group.0 as usize;
        if self.groups.get(i).is_some_and(|g| g.id == group) {
            return Some(i);
        }
        self.groups.binary_search_by_key(&group, |g| g.id).ok()
    }

    /// The membership service installed a new view of this region. State of
    /// senders still present carries over; the token restarts on the new
    /// route.
    pub fn handle_view(&mut self, now: Instant, view: &RegionView) {
        let now = self.clock(now);
        let Some(layout) = Layout::new(self.me, view, self.config.replication.get()) else {
            return;
        };
        self.layout = layout;
        // Who saw what may have left with the old view.
        self.out.seen = 0;
        self.rounds.clear();
        self.last_hop = None;
        self.next_token_at = (self.layout.me == 0).then(|| now + self.config.token_interval);
    }

    /// The owner knows (from elsewhere: the daemon's total order) that
    /// `source` sent every number below `upto`, and waits for them here.
    /// The numbers become known at once (as a token's `max_seen` would make
    /// them), and what is missing is pulled from the source itself now and
    /// every `loss_suspicion` until delivered, without waiting for token
    /// rounds: a round needs every member on the route, and the change that
    /// drops a gone one may be what the owner is waiting to apply (swarm
    /// seed 199 with `--qsm --qsm-hybrid`: a daemon waited at a CUT for a
    /// message of a live sender while the token stalled at a partitioned
    /// member, until the CUT timed out 10 s later).
    pub fn expect(&mut self, now: Instant, source: NodeId, upto: u64) {
        let now = self.clock(now);
        if source == self.me || self.layout.members.binary_search(&source).is_err() {
            return;
        }
        let inbound = self.inbound(source);
        if inbound.contig >= upto {
            return;
        }
        inbound.see(now, upto);
        let e = self.expected.entry(source.0).or_default();
        if *e >= upto {
            return;
        }
        *e = upto;
        self.expect_pull_at = Some(now);
    }

    /// Pulls from each expected source what is still missing below the
    /// number expected.
    fn pull_expected(&mut self, now: Instant) {
        let mut due = Vec::new();
        let max = self.config.pull_ranges_max;
        let inbound = &self.inbound;
        self.expected.retain(|&source, &mut upto| {
            let Some(i) = inbound.get(source as usize).and_then(Option::as_ref) else {
                return false;
            };
            if i.contig >= upto {
                return false;
            }
            due.push((source, i.missing(upto, max)));
            true
        });
        for (source, ranges) in due {
            if ranges.is_empty() {
                continue;
            }
            let message = Message::Pull {
                region: self.layout.region.0,
                source,
                rate: self.config.recovery_rate.get(),
                ranges,
            };
            self.stats.pulls_sent += 1;
            self.send_control(Destination::Node(NodeId(source)), &message);
        }
        self.expect_pull_at = (!self.expected.is_empty()).then(|| now + self.config.loss_suspicion);
    }

    /// Whether the send window takes a message now.
    pub fn can_send(&self) -> bool {
        let unsent = self.out.next_seq() - self.out.next_sent;
        !self.out.paused
            && self.out.pending.len() < self.config.send_window.get() as usize
            && unsent < u64::from(self.config.send_buffer.get())
    }

    /// Messages held for others and own pending ones.
    pub fn memory(&self) -> Memory {
        let mut m = Memory {
            pending: self.out.pending.len(),
            payload_bytes: self.out.pending.iter().map(|p| p.payload.len()).sum(),
            ..Memory::default()
        };
        for i in self.inbound.iter().flatten() {
            m.held += i.held.len();
            m.cached += i.cache.len();
            m.payload_bytes += i.held.values().map(|(_, p)| p.len()).sum::<usize>();
            m.payload_bytes += i.cache.iter().map(|(_, _, p)| p.len()).sum::<usize>();
        }
        m
    }

    /// The groups of the region and their counters.
    pub fn groups(&self) -> &[GroupState] {
        &self.groups
    }

    /// Bytes of state per group: the group table's allocation over its
    /// length (the same table serves sending and receiving; nothing else in
    /// the engine grows with the number of groups).
    pub fn bytes_per_group(&self) -> usize {
        let bytes = self.groups.capacity() * std::mem::size_of::<GroupState>();
        bytes / self.groups.len().max(1)
    }

    /// The current region view's number.
    pub fn view(&self) -> u64 {
        self.layout.view
    }

    fn clock(&mut self, now: Instant) -> Instant {
        self.last_now = self.last_now.max(now);
        self.last_now
    }

    fn inbound(&mut self, source: NodeId) -> &mut Inbound {
        let i = source.0 as usize;
        if self.inbound.len() <= i {
            self.inbound.resize_with(i + 1, || None);
        }
        self.inbound[i].get_or_insert_with(Inbound::default)
    }

    fn send_control(&mut self, to: Destination, message: &Message<'_>) {
        let mut bytes = Vec::with_capacity(message.body_len() + shoal_wire::HEADER_LEN);
        if message.encode(self.me.0, &mut bytes).is_ok() {
            if matches!(message, Message::Token(_)) {
                self.stats.token_bytes_max = self.stats.token_bytes_max.max(bytes.len());
            }
            self.control.push_back(Transmit {
                destination: to,
                payload: Bytes::from(bytes),
            });
        }
    }

    fn queue_repair(&mut self, to: Destination, source: NodeId, seq: u64) {
        let at = self.last_now;
        self.queue_repair_at(at, to, source, seq);
    }

    fn queue_repair_at(&mut self, at: Instant, to: Destination, source: NodeId, seq: u64) {
        if self.repairs.len() >= self.config.repair_queue_max {
            self.stats.repairs_dropped += 1;
            return;
        }
        self.repair_order += 1;
        self.repairs
            .insert((at, self.repair_order), RepairJob { to, source, seq });
    }

    fn on_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8], shared: Option<&Bytes>) {
        for packet in packets(datagram) {
            let Ok((header, Packet::Qsm { kind, body })) = packet else {
                self.stats.bad_datagrams += 1;
                return;
            };
            let Ok(message) = wire::decode(kind, body) else {
                self.stats.bad_datagrams += 1;
                return;
            };
            let own = |payload: &[u8]| match shared {
                Some(d) => d.slice_ref(payload),
                None => Bytes::copy_from_slice(payload),
            };
            let sender = NodeId(header.sender);
            let _ = from;
            match message {
                Message::Data {
                    region,
                    group,
                    seq,
                    payload,
                } if region == self.layout.region.0 => {
                    self.on_message(now, sender, seq, GroupId(group), own(payload), false);
                }
                Message::Repair {
                    region,
                    group,
                    source,
                    seq,
                    payload,
                } if region == self.layout.region.0 => {
                    self.on_message(now, NodeId(source), seq, GroupId(group), own(payload), true);
                }
                Message::Token(token) if token.region == self.layout.region.0 => {
                    self.on_token(now, token);
                }
                Message::Ack { region, next, seen } if region == self.layout.region.0 => {
                    self.on_ack(now, next, seen);
                }
                Message::Nak {
                    region,
                    partition,
                    ranges,
                } if region == self.layout.region.0 => self.on_nak(partition, &ranges),
                Message::Pull {
                    region,
                    source,
                    rate,
                    ranges,
                } if region == self.layout.region.0 => {
                    self.on_pull(now, sender, NodeId(source), rate, &ranges);
                }
                _ => self.stats.bad_datagrams += 1,
            }
        }
    }

    fn on_message(
        &mut self,
        now: Instant,
        source: NodeId,
        seq: u64,
        group: GroupId,
        payload: Bytes,
        recovered: bool,
    ) {
        // Only members of the region send in it: a forged source id must
        // not size the per-source table. A source already known that left
        // the view (a crashed sender) is still repaired among the others.
        let known = self
            .inbound
            .get(source.0 as usize)
            .is_some_and(Option::is_some);
        if source == self.me || self.layout.members.binary_search(&source).is_err() && !known {
            return;
        }
        let mine = self.layout.my_partition();
        let k = u64::from(self.layout.partitions);
        let shift = u64::from(source.0);
        let caches = move |seq: u64| (seq.wrapping_add(shift) % k) as u32 == mine;
        let inbound = self.inbound(source);
        if seq < inbound.contig || inbound.held.contains_key(&seq) {
            self.stats.duplicates += 1;
            return;
        }
        inbound.see(now, seq + 1);
        if seq == inbound.contig && inbound.held.is_empty() {
            // The next in order with nothing held, the usual case: delivered
            // straight, without the held map and the list below (an
            // allocation each per message).
            if caches(seq) {
                inbound.cache.push_back((seq, group, payload.clone()));
            }
            inbound.contig += 1;
            if let Some(g) = self.group_index(group) {
                self.groups[g].delivered += 1;
            }
            self.events.push_back(Event::Deliver {
                source,
                group,
                seq,
                payload,
                recovered,
            });
            return;
        }
        inbound.held.insert(seq, (group, payload));
        let mut delivered = Vec::new();
        while let Some((group, payload)) = inbound.held.remove(&inbound.contig) {
            let at = inbound.contig;
            if caches(at) {
                inbound.cache.push_back((at, group, payload.clone()));
            }
            inbound.contig += 1;
            delivered.push((at, group, payload));
        }
        for (at, group, payload) in delivered {
            if let Some(g) = self.group_index(group) {
                self.groups[g].delivered += 1;
            }
            self.events.push_back(Event::Deliver {
                source,
                group,
                seq: at,
                payload,
                recovered: recovered && at == seq,
            });
        }
    }

    /// The region leader starts a round.
    fn start_round(&mut self, now: Instant) {
        self.round += 1;
        self.stats.tokens_started += 1;
        let mut sources: Vec<u32> = self
            .inbound
            .iter()
            .enumerate()
            .filter(|(_, i)| i.as_ref().is_some_and(|i| i.max_seen > 0))
            .map(|(s, _)| s as u32)
            .collect();
        if self.out.next_sent > 0 {
            sources.push(self.me.0);
            sources.sort_unstable();
        }
        let records = sources
            .into_iter()
            .map(|source| TokenRecord {
                source,
                max_seen: 0,
                stable_next: u64::MAX,
                min_contig: u64::MAX,
                gc_next: self.gc_for.get(&source).copied().unwrap_or(0),
                part_stable: u64::MAX,
                nak: Vec::new(),
                wants: Vec::new(),
            })
            .collect();
        let token = Token {
            region: self.layout.region.0,
            view: self.layout.view,
            round: self.round,
            hop: 0,
            records,
        };
        self.rounds.push_back((self.round, now));
        while self.rounds.len() > 16 {
            self.rounds.pop_front();
        }
        self.run_token(now, token);
    }

    fn on_token(&mut self, now: Instant, token: Token) {
        if token.view != self.layout.view {
            return;
        }
        let Some(&step) = self.layout.route.get(token.hop as usize) else {
            return;
        };
        if self.layout.step_node(step) != self.layout.me {
            return;
        }
        // A copy of a hop already run, or a hop of an older round.
        if self
            .last_hop
            .is_some_and(|last| (token.round, token.hop) <= last)
        {
            return;
        }
        self.last_hop = Some((token.round, token.hop));
        self.run_token(now, token);
    }

    /// Runs the token's steps at this member, then passes it on.
    fn run_token(&mut self, now: Instant, mut token: Token) {
        loop {
            let step = self.layout.route[token.hop as usize];
            match step {
                Step::Visit { partition, .. } => self.visit(now, partition, &mut token.records),
                Step::Close { partition, .. } => self.close(partition, &mut token.records),
                Step::Finish => {
                    self.finish(now, token.round, &token.records);
                    return;
                }
            }
            token.hop += 1;
            let next = self.layout.step_node(self.layout.route[token.hop as usize]);
            if next != self.layout.me {
                let to = Destination::Node(self.layout.members[next]);
                let message = Message::Token(token);
                for _ in 0..self.config.token_copies.get() {
                    self.send_control(to, &message);
                }
                return;
            }
        }
    }

    fn visit(&mut self, now: Instant, partition: u32, records: &mut Vec<TokenRecord>) {
        let k = self.layout.partitions;
        // A sender the region leader has seen nothing of gets no record
        // at the start of a round, so no ACK, and never learns that the
        // whole region missed its messages: a lone message lost at every
        // other member (a daemon that sent one message on an instance and
        // then went on by another) was never recovered, and a flush waited
        // for it until it timed out. The sender adds its own record here:
        // it starts mid-route, so it frees nothing (`stable_next` and
        // `min_contig` 0: the ACK's `next` is 0 and no member collects
        // garbage by it); its ACK's `seen` makes the sender multicast again
        // what nobody reported, and once others hold some, the leader
        // lists the sender from the start of the next round.
        if self.out.next_sent > 0 && !records.iter().any(|r| r.source == self.me.0) {
            records.push(TokenRecord {
                source: self.me.0,
                max_seen: 0,
                stable_next: 0,
                min_contig: 0,
                gc_next: 0,
                part_stable: u64::MAX,
                nak: Vec::new(),
                wants: Vec::new(),
            });
        }
        let (suspicion, max) = (self.config.loss_suspicion, self.config.intervals_max);
        let pull_max = self.config.pull_ranges_max;
        for rec in records.iter_mut() {
            let source = NodeId(rec.source);
            if self.layout.members.binary_search(&source).is_err() {
                continue;
            }
            let (contig, max_seen, missing, part_next) = if source == self.me {
                // The sender holds all it sent, but does not vouch for what
                // the others saw: `max_seen` stays theirs, so the ACK tells
                // the sender when the whole region missed its tail.
                // (Alone in the region, the sender is the region.)
                //
                // What other members reported seeing in earlier rounds it
                // does carry: members visited before the first holder learn
                // of a number only from the record, and when the sender
                // leads the region its visit starts the record. A lone
                // message the leader sent, missed by member 1 and held by
                // member 2, was otherwise never known to member 1 (no
                // later number revealed the gap, and the sender does not
                // resend what another holds): the daemon waited for it at
                // a CUT until the flush timed out (swarm seed 54 with
                // `--qsm --qsm-hybrid`).
                let sent = self.out.next_sent;
                let seen = if self.layout.members.len() == 1 {
                    sent
                } else {
                    self.out.seen.min(sent)
                };
                (sent, seen, Vec::new(), sent + u64::from(k))
            } else {
                let inbound = self.inbound(source);
                inbound.see(now, rec.max_seen);
                inbound.gc(rec.gc_next);
                let frontier = inbound.frontier(now, suspicion);
                let missing = inbound.missing(frontier, pull_max);
                let part_next = inbound.part_next(source, partition, k);
                (inbound.contig, inbound.max_seen, missing, part_next)
            };
            rec.max_seen = rec.max_seen.max(max_seen);
            rec.min_contig = rec.min_contig.min(contig);
            self.push_wants(source, &rec.wants);
            let listed = &missing[..missing.len().min(max)];
            rec.nak = if rec.part_stable == u64::MAX {
                listed.to_vec()
            } else {
                intersect(&rec.nak, listed)
            };
            rec.part_stable = rec.part_stable.min(part_next);
            if !missing.is_empty() {
                rec.wants.push(Want {
                    member: self.me.0,
                    ranges: listed.to_vec(),
                });
                self.pull(source, partition, &missing);
            }
        }
    }

    /// Pushes to members earlier in the partition what they lack and I hold.
    fn push_wants(&mut self, source: NodeId, wants: &[Want]) {
        for want in wants {
            if want.member == self.me.0 {
                continue;
            }
            let to = Destination::Node(NodeId(want.member));
            let mut served = 0;
            for seq in ranges_iter(&want.ranges, SCAN_MAX) {
                if served == ANSWER_MAX {
                    break;
                }
                if self.holds(source, seq) {
                    self.queue_repair(to, source, seq);
                    served += 1;
                }
            }
        }
    }

    /// Asks a random member of each partition caching part of `missing` (a
    /// mate for my own partition's share): tens of members repair a large
    /// gap in parallel ([B] §7 4c).
    fn pull(&mut self, source: NodeId, mine: u32, missing: &[SeqRange]) {
        let k = self.layout.partitions;
        let budget = (f64::from(self.config.recovery_rate.get())
            * self.config.token_interval.as_secs_f64())
        .max(1.0) as u64;
        let missing = &take_seqs(missing, budget);
        let mut wanted = vec![false; k as usize];
        for r in missing {
            let last = r.last.min(r.first.saturating_add(u64::from(k) - 1));
            for seq in r.first..=last {
                wanted[self.layout.caching(source, seq) as usize] = true;
            }
        }
        let me = self.layout.me;
        let mut targets = Vec::new();
        for p in 0..k {
            if !wanted[p as usize] {
                continue;
            }
            // In my own partition, a mate (they cache its share too).
            let list: Vec<usize> = self.layout.partition_members[p as usize]
                .iter()
                .copied()
                .filter(|&i| p != mine || i != me)
                .collect();
            if list.is_empty() {
                continue;
            }
            targets.push(list[self.rng.random_range(0..list.len())]);
        }
        let rate = (self.config.recovery_rate.get() / (targets.len() as u32).max(1)).max(1);
        for pick in targets {
            let to = Destination::Node(self.layout.members[pick]);
            let message = Message::Pull {
                region: self.layout.region.0,
                source: source.0,
                rate,
                ranges: missing.to_vec(),
            };
            self.stats.pulls_sent += 1;
            self.send_control(to, &message);
        }
    }

    fn close(&mut self, partition: u32, records: &mut [TokenRecord]) {
        for rec in records.iter_mut() {
            let source = NodeId(rec.source);
            self.push_wants(source, &rec.wants);
            if !rec.nak.is_empty() {
                self.stats.naks_sent += 1;
                if source == self.me {
                    let nak = std::mem::take(&mut rec.nak);
                    self.on_nak(partition, &nak);
                } else {
                    let message = Message::Nak {
                        region: self.layout.region.0,
                        partition,
                        ranges: std::mem::take(&mut rec.nak),
                    };
                    self.send_control(Destination::Node(source), &message);
                }
            }
            rec.stable_next = rec.stable_next.min(rec.part_stable);
            rec.part_stable = u64::MAX;
            rec.nak.clear();
            rec.wants.clear();
        }
    }

    fn finish(&mut self, now: Instant, round: u64, records: &[TokenRecord]) {
        self.stats.tokens_finished += 1;
        if let Some(&(_, started)) = self.rounds.iter().find(|(r, _)| *r == round) {
            self.stats.token_rtt = now.saturating_duration_since(started);
        }
        for rec in records {
            let next = rec.stable_next.min(rec.max_seen);
            self.gc_for.insert(rec.source, rec.min_contig);
            // The region leader visits first, so the token's `max_seen`
            // comes back to it only here: without learning it now, a tail
            // that only members later on the route got is never known to
            // the leader (the sender does not resend it, others hold it),
            // and with no more traffic it never recovers it. Its next
            // visit carries the number to every member.
            if NodeId(rec.source) != self.me
                && self
                    .layout
                    .members
                    .binary_search(&NodeId(rec.source))
                    .is_ok()
            {
                self.inbound(NodeId(rec.source)).see(now, rec.max_seen);
            }
            if NodeId(rec.source) == self.me {
                self.on_ack(now, next, rec.max_seen);
            } else {
                let message = Message::Ack {
                    region: self.layout.region.0,
                    next,
                    seen: rec.max_seen,
                };
                self.send_control(Destination::Node(NodeId(rec.source)), &message);
            }
        }
    }

    fn on_ack(&mut self, now: Instant, next: u64, seen: u64) {
        self.stats.acks_received += 1;
        self.out.seen = self.out.seen.max(seen.min(self.out.next_sent));
        let next = next.min(self.out.next_sent);
        while self.out.base < next {
            self.out.pending.pop_front();
            self.out.base += 1;
        }
        if self.out.paused && self.out.pending.len() <= self.config.send_window_low as usize {
            self.out.paused = false;
        }
        // The whole region missed the tail: multicast it again.
        if now < self.out.tail_retry_at {
            return;
        }
        let old = now.saturating_sub(self.config.loss_suspicion + self.config.token_interval);
        let from = seen.max(self.out.base);
        let mut any = false;
        for seq in from..self.out.next_sent.min(from + ANSWER_MAX) {
            let Some(p) = self.out.get(seq) else { break };
            if p.sent.is_none_or(|at| at > old) {
                break;
            }
            self.stats.multicast_retransmissions += 1;
            self.queue_repair(Destination::Multicast, self.me, seq);
            any = true;
        }
        if any {
            self.out.tail_retry_at = now + self.config.token_interval * 2;
        }
    }

    /// A partition leader says no member of `partition` holds these: send
    /// them to each of its members.
    fn on_nak(&mut self, partition: u32, ranges: &[SeqRange]) {
        let Some(list) = self.layout.partition_members.get(partition as usize) else {
            return;
        };
        let targets: Vec<NodeId> = list
            .iter()
            .map(|&i| self.layout.members[i])
            .filter(|&n| n != self.me)
            .collect();
        for seq in ranges_iter(ranges, ANSWER_MAX) {
            if self.layout.caching(self.me, seq) != partition || self.out.get(seq).is_none() {
                continue;
            }
            if seq >= self.out.next_sent {
                break;
            }
            for &to in &targets {
                self.queue_repair(Destination::Node(to), self.me, seq);
            }
        }
    }

    /// Answers a pull with what I hold, paced at the asker's `rate`.
    fn on_pull(
        &mut self,
        now: Instant,
        from: NodeId,
        source: NodeId,
        rate: u32,
        ranges: &[SeqRange],
    ) {
        let gap = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
        let mut at = now;
        let mut served = 0;
        for seq in ranges_iter(ranges, SCAN_MAX) {
            if served == ANSWER_MAX {
                break;
            }
            if self.holds(source, seq) {
                self.queue_repair_at(at, Destination::Node(from), source, seq);
                at += gap;
                served += 1;
            }
        }
    }

    fn holds(&self, source: NodeId, seq: u64) -> bool {
        if source == self.me {
            return seq < self.out.next_sent && self.out.get(seq).is_some();
        }
        self.inbound
            .get(source.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(|i| i.get(seq).is_some())
    }

    fn repair_packet(&self, job: RepairJob) -> Option<Transmit> {
        let region = self.layout.region.0;
        let (group, payload) = if job.source == self.me {
            let p = self.out.get(job.seq)?;
            (p.group, p.payload.clone())
        } else {
            let i = self.inbound.get(job.source.0 as usize)?.as_ref()?;
            let (g, p) = i.get(job.seq)?;
            (g, p.clone())
        };
        let message = match job.to {
            Destination::Multicast => Message::Data {
                region,
                group: group.0,
                seq: job.seq,
                payload: &payload,
            },
            Destination::Node(_) => Message::Repair {
                region,
                group: group.0,
                source: job.source.0,
                seq: job.seq,
                payload: &payload,
            },
        };
        let bytes = message.to_vec(self.me.0).ok()?;
        Some(Transmit {
            destination: job.to,
            payload: Bytes::from(bytes),
        })
    }

    fn refill(&mut self, now: Instant) {
        let rate = f64::from(self.config.repair_rate.get());
        let dt = now
            .saturating_duration_since(self.repair_refilled)
            .as_secs_f64();
        self.repair_credit =
            (self.repair_credit + dt * rate).min(f64::from(self.config.repair_burst.get()));
        self.repair_refilled = now;
    }

    fn next_repair(&mut self, now: Instant) -> Option<Transmit> {
        self.refill(now);
        while self.repair_credit >= 1.0 {
            let (&(at, _), _) = self.repairs.first_key_value()?;
            if at > now {
                return None;
            }
            let (_, job) = self.repairs.pop_first()?;
            if let Some(t) = self.repair_packet(job) {
                self.repair_credit -= 1.0;
                self.stats.repairs_sent += 1;
                return Some(t);
            }
        }
        None
    }

    fn next_data(&mut self, now: Instant) -> Option<Transmit> {
        let seq = self.out.next_sent;
        if let Some(rate) = self.config.send_rate_max {
            let rate = f64::from(rate.get());
            let dt = now
                .saturating_duration_since(self.data_refilled)
                .as_secs_f64();
            self.data_credit = (self.data_credit + dt * rate).min(DATA_BURST);
            self.data_refilled = now;
            if self.data_credit < 1.0 || self.out.get(seq).is_none() {
                return None;
            }
            self.data_credit -= 1.0;
        }
        let region = self.layout.region.0;
        let p = self.out.get(seq)?;
        let message = Message::Data {
            region,
            group: p.group.0,
            seq,
            payload: &p.payload,
        };
        let bytes = message.to_vec(self.me.0).ok()?;
        let i = (seq - self.out.base) as usize;
        self.out.pending[i].sent = Some(now);
        self.out.next_sent += 1;
        Some(Transmit {
            destination: Destination::Multicast,
            payload: Bytes::from(bytes),
        })
    }
}

/// Sequence numbers of `ranges`, at most `max`.
fn ranges_iter(ranges: &[SeqRange], max: u64) -> impl Iterator<Item = u64> + '_ {
    ranges
        .iter()
        .flat_map(|r| r.first..=r.last)
        .take(usize::try_from(max).unwrap_or(usize::MAX))
}

/// The first `count` sequence numbers of `ranges`, as ranges.
fn take_seqs(ranges: &[SeqRange], mut count: u64) -> Vec<SeqRange> {
    let mut out = Vec::new();
    for r in ranges {
        if count == 0 {
            break;
        }
        let last = r.last.min(r.first.saturating_add(count - 1));
        out.push(SeqRange {
            first: r.first,
            last,
        });
        count -= last - r.first + 1;
    }
    out
}

/// The intersection of two ascending, disjoint range lists.
fn intersect(a: &[SeqRange], b: &[SeqRange]) -> Vec<SeqRange> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let first = a[i].first.max(b[j].first);
        let last = a[i].last.min(b[j].last);
        if first <= last {
            out.push(SeqRange { first, last });
        }
        if a[i].last < b[j].last {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

impl Engine for Qsm {
    type Event = Event;

    fn node_id(&self) -> NodeId {
        self.me
    }

    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        let now = self.clock(now);
        self.on_datagram(now, from, datagram, None);
    }

    fn handle_datagram_bytes(&mut self, now: Instant, from: NodeId, datagram: &Bytes) {
        let now = self.clock(now);
        self.on_datagram(now, from, datagram, Some(datagram));
    }

    fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock(now);
        if self.expect_pull_at.is_some_and(|at| now >= at) {
            self.pull_expected(now);
        }
        if let Some(at) = self.next_token_at {
            if now >= at {
                let next = at + self.config.token_interval;
                self.next_token_at = Some(if next <= now {
                    now + self.config.token_interval
                } else {
                    next
                });
                self.start_round(now);
            }
        }
    }

    /// Sends to the region's groups in turn (message k to group k mod g, as
    /// [A] §1's multi-group experiment does).
    fn multicast(&mut self, now: Instant, payload: Bytes) -> Result<u64, SendError> {
        let Some(group) = self.groups.get(self.next_group % self.groups.len().max(1)) else {
            return Err(SendError::WindowFull);
        };
        let group = group.id;
        match self.multicast_to(now, group, payload) {
            Ok(seq) => {
                self.next_group = (self.next_group + 1) % self.groups.len();
                Ok(seq)
            }
            Err(_) => Err(SendError::WindowFull),
        }
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        let now = self.clock(now);
        if let Some(t) = self.control.pop_front() {
            return Some(t);
        }
        if let Some(t) = self.next_repair(now) {
            return Some(t);
        }
        self.next_data(now)
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let repair = self.repairs.first_key_value().map(|(&(at, _), _)| {
            let lack = (1.0 - self.repair_credit).max(0.0);
            let secs = lack / f64::from(self.config.repair_rate.get());
            let credit_at =
                self.last_now + Duration::from_secs_f64(secs) + Duration::from_micros(1);
            at.max(credit_at)
        });
        let data = self.config.send_rate_max.and_then(|rate| {
            let unsent = self.out.next_sent < self.out.next_seq();
            (unsent && self.data_credit < 1.0).then(|| {
                let secs = (1.0 - self.data_credit) / f64::from(rate.get());
                self.data_refilled + Duration::from_secs_f64(secs) + Duration::from_micros(1)
            })
        });
        [self.next_token_at, repair, data, self.expect_pull_at]
            .into_iter()
            .flatten()
            .min()
    }
}
