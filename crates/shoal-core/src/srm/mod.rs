//! Scalable Reliable Multicast (SRM), the baseline pbcast is measured against
//! (P001 §B; P000 §2.4; Floyd et al., "A reliable multicast framework for
//! light-weight sessions"). Constants follow ns-2 (notes, Appendix A).
//!
//! - Data, requests and repairs all go by IP multicast.
//! - A member that detects a loss (a later sequence number, or a session
//!   message naming a higher one) waits U[C1·d, (C1+C2)·d] (d = its distance
//!   to the source) and multicasts a request, then waits again with the
//!   interval multiplied by the backoff factor, up to `request_backoff_limit`.
//! - Hearing someone else's request for the same data suppresses (backs off)
//!   a pending request; an "ignore" window of half the new interval stops one
//!   burst of requests from backing off many times.
//! - A member holding the data answers a request after U[D1·d, (D1+D2)·d]
//!   (d = distance to the requester) unless it hears a repair first; after a
//!   repair it ignores requests for the same data for 3·d (hold-down).
//! - Session messages every 1 s ±10% carry the highest sequence number seen
//!   per source (tail-loss detection) and timestamp echoes from which each
//!   member estimates distances (EWMA, α = 0.25) without synchronised clocks.
//!
//! Delivery is unordered (SRM leaves framing and order to the application)
//! and SRM never gives up on a loss: it has no `Lost` event. Messages are
//! kept for the whole session so that any member can repair any loss.
//!
//! Wire use: DATA for data, SOLICIT (one single-sequence range) for requests,
//! RETRANSMIT for repairs, SESSION for session messages.

mod adaptive;
mod config;

pub use config::{Adaptive, Config, ConfigError};

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use shoal_wire::{Echo, Packet, SeqRange, Session, SourceRanges};

use crate::engine::{member_list, Destination, Engine, NodeId, SendError, Transmit};
use crate::pbcast::{Event, Stats};
use crate::time::Instant;
use adaptive::Tuner;

/// (source index, sequence number).
type Key = (usize, u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    Request,
    Repair,
}

/// A loss waiting for its repair.
#[derive(Debug)]
struct PendingRequest {
    detected: Instant,
    deadline: Instant,
    backoffs: u32,
    ignore_until: Instant,
    /// Requests sent or heard for this loss.
    requests_seen: u32,
    first_request: Option<Instant>,
}

/// A repair this member will send unless it hears one first.
#[derive(Debug)]
struct PendingRepair {
    deadline: Instant,
    requester: usize,
    requested_at: Instant,
}

/// After a repair: requests ignored until `until`; repairs counted as
/// duplicates for the adaptive averages.
#[derive(Debug)]
struct HoldDown {
    until: Instant,
    repairs_seen: u32,
}

/// One SRM member.
pub struct Srm {
    me: NodeId,
    my_index: usize,
    members: Vec<NodeId>,
    config: Config,
    rng: Xoshiro256PlusPlus,
    /// Per source: messages by sequence number (kept for the whole session).
    store: Vec<Vec<Option<Bytes>>>,
    /// Per source: one past the highest sequence number known to exist.
    known_end: Vec<u64>,
    requests: BTreeMap<Key, PendingRequest>,
    repairs: BTreeMap<Key, PendingRepair>,
    hold_downs: BTreeMap<Key, HoldDown>,
    timers: BTreeSet<(Instant, TimerKind, Key)>,
    /// Per member: smoothed one-way distance estimate.
    distance: Vec<Option<Duration>>,
    /// Per member: its last session's timestamp and when it arrived here.
    heard_session: Vec<Option<(u64, Instant)>>,
    echo_cursor: usize,
    next_session: Instant,
    tuner: Tuner,
    outbox: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: Stats,
    last_now: Instant,
}

impl Srm {
    pub fn new(
        me: NodeId,
        members: &[NodeId],
        config: Config,
        seed: u64,
        now: Instant,
    ) -> Result<Srm, ConfigError> {
        config.validate()?;
        let (members, my_index) = member_list(me, members).ok_or(ConfigError::NotAMember(me.0))?;
        let n = members.len();
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let first_session = now + config.session_interval.mul_f64(rng.random::<f64>());
        Ok(Srm {
            me,
            my_index,
            tuner: Tuner::new(&config, n),
            config,
            rng,
            store: vec![Vec::new(); n],
            known_end: vec![0; n],
            requests: BTreeMap::new(),
            repairs: BTreeMap::new(),
            hold_downs: BTreeMap::new(),
            timers: BTreeSet::new(),
            distance: vec![None; n],
            heard_session: vec![None; n],
            echo_cursor: 0,
            next_session: first_session,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
            last_now: now,
            members,
        })
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Current timer constants (C1, C2, D1, D2): fixed, or as adapted.
    pub fn timer_constants(&self) -> [f64; 4] {
        self.tuner.constants()
    }

    /// This member's distance estimate to `node`, if it has one.
    pub fn distance_to(&self, node: NodeId) -> Option<Duration> {
        self.distance[self.index_of(node)?]
    }

    /// Losses waiting for a repair.
    pub fn pending_requests(&self) -> usize {
        self.requests.len()
    }

    fn index_of(&self, node: NodeId) -> Option<usize> {
        self.members.binary_search(&node).ok()
    }

    fn distance_or_default(&self, member: usize) -> Duration {
        self.distance[member].unwrap_or(self.config.initial_distance)
    }

    fn holds(&self, (source, seq): Key) -> bool {
        self.store[source]
            .get(seq as usize)
            .is_some_and(Option::is_some)
    }

    fn multicast_packet(&mut self, packet: &Packet<'_>) {
        let Ok(bytes) = packet.to_vec(self.me.0) else {
            return;
        };
        self.stats.packets_sent[packet.kind().index()] += 1;
        self.outbox.push_back(Transmit {
            destination: Destination::Multicast,
            payload: Bytes::from(bytes),
        });
    }

    // ---- timers --------------------------------------------------------

    fn set_timer(&mut self, kind: TimerKind, key: Key, old: Option<Instant>, at: Instant) {
        if let Some(old) = old {
            self.timers.remove(&(old, kind, key));
        }
        self.timers.insert((at, kind, key));
    }

    /// U[lo·d, (lo+width)·d] × factor.
    fn random_delay(&mut self, lo: f64, width: f64, d: Duration, factor: f64) -> Duration {
        let u: f64 = self.rng.random();
        d.mul_f64((lo + width * u) * factor)
    }

    fn request_delay(&mut self, source: usize, backoffs: u32) -> Duration {
        let [c1, c2, _, _] = self.tuner.constants();
        let factor = self.config.backoff_factor.powi(backoffs as i32);
        let d = self.distance_or_default(source);
        self.random_delay(c1, c2, d, factor)
    }

    // ---- receiving -------------------------------------------------------

    /// Notes that messages of `source` below `end` exist; opens requests for
    /// the ones not here.
    fn learn_end(&mut self, now: Instant, source: usize, end: u64) {
        if source == self.my_index {
            return;
        }
        let from = self.known_end[source];
        // Bound the work a forged sequence number can cause.
        let end = end.min(from + (1 << 16));
        self.known_end[source] = self.known_end[source].max(end);
        for seq in from..end {
            if !self.holds((source, seq)) {
                self.on_loss_detected(now, (source, seq));
            }
        }
    }

    fn on_loss_detected(&mut self, now: Instant, key: Key) {
        if self.requests.contains_key(&key) {
            return;
        }
        self.tuner.before_request_timer();
        let deadline = now + self.request_delay(key.0, 0);
        self.requests.insert(
            key,
            PendingRequest {
                detected: now,
                deadline,
                backoffs: 0,
                ignore_until: now,
                requests_seen: 0,
                first_request: None,
            },
        );
        self.set_timer(TimerKind::Request, key, None, deadline);
    }

    fn on_message(&mut self, now: Instant, key: Key, payload: Bytes, recovered: bool) {
        let (source, seq) = key;
        if self.holds(key) || source == self.my_index {
            self.stats.duplicates += 1;
            return;
        }
        let slots = &mut self.store[source];
        if slots.len() <= seq as usize {
            slots.resize(seq as usize + 1, None);
        }
        slots[seq as usize] = Some(payload.clone());
        self.learn_end(now, source, seq + 1);
        if let Some(pending) = self.requests.remove(&key) {
            self.timers
                .remove(&(pending.deadline, TimerKind::Request, key));
            let delay = pending.first_request.unwrap_or(now) - pending.detected;
            let d = self.distance_or_default(source);
            self.tuner
                .request_done(pending.requests_seen, delay.as_secs_f64() / d.as_secs_f64());
        }
        self.stats.delivered += 1;
        self.stats.recovered += u64::from(recovered);
        self.events.push_back(Event::Deliver {
            source: self.members[source],
            seq,
            payload,
            recovered,
        });
    }

    fn on_request(&mut self, now: Instant, from: usize, key: Key) {
        if key.0 != self.my_index {
            self.learn_end(now, key.0, key.1 + 1);
        }
        if self.holds(key) {
            self.schedule_repair(now, from, key);
        } else if self.requests.contains_key(&key) {
            self.back_off_request(now, key);
        }
    }

    /// Someone else asked first: suppress our own request (SRM's backoff).
    fn back_off_request(&mut self, now: Instant, key: Key) {
        let limit = self.config.request_backoff_limit;
        let pending = self.requests.get_mut(&key).expect("caller checked");
        pending.requests_seen += 1;
        pending.first_request.get_or_insert(now);
        if now < pending.ignore_until {
            return;
        }
        pending.backoffs = (pending.backoffs + 1).min(limit);
        let (old, backoffs) = (pending.deadline, pending.backoffs);
        let delay = self.request_delay(key.0, backoffs);
        let pending = self.requests.get_mut(&key).expect("still there");
        pending.deadline = now + delay;
        pending.ignore_until = now + delay / 2;
        self.set_timer(TimerKind::Request, key, Some(old), now + delay);
    }

    fn schedule_repair(&mut self, now: Instant, requester: usize, key: Key) {
        let in_hold_down = self.hold_downs.get(&key).is_some_and(|h| now < h.until);
        if in_hold_down || self.repairs.contains_key(&key) {
            return;
        }
        self.tuner.before_repair_timer();
        let [_, _, d1, d2] = self.tuner.constants();
        let d = self.distance_or_default(requester);
        let deadline = now + self.random_delay(d1, d2, d, 1.0);
        self.repairs.insert(
            key,
            PendingRepair {
                deadline,
                requester,
                requested_at: now,
            },
        );
        self.set_timer(TimerKind::Repair, key, None, deadline);
    }

    fn on_repair(&mut self, now: Instant, key: Key, payload: Bytes) {
        if let Some(pending) = self.repairs.remove(&key) {
            // Someone else repaired first: suppress ours.
            self.timers
                .remove(&(pending.deadline, TimerKind::Repair, key));
            self.start_hold_down(now, key, pending.requester, pending.requested_at);
        } else if let Some(hold) = self.hold_downs.get_mut(&key) {
            hold.repairs_seen += 1;
        }
        self.on_message(now, key, payload, true);
    }

    fn start_hold_down(&mut self, now: Instant, key: Key, requester: usize, requested_at: Instant) {
        let d = self.distance_or_default(requester);
        let until = now + d.mul_f64(self.config.repair_holddown_distances);
        let delay = (now - requested_at).as_secs_f64() / d.as_secs_f64();
        self.tuner.repair_delay(delay);
        if let Some(old) = self.hold_downs.insert(
            key,
            HoldDown {
                until,
                repairs_seen: 1,
            },
        ) {
            self.tuner.repair_done(old.repairs_seen);
        }
    }

    fn on_session(&mut self, now: Instant, from: usize, session: &Session) {
        self.heard_session[from] = Some((session.sent_ns, now));
        if let Some(echo) = session.echoes.iter().find(|e| e.peer == self.me.0) {
            let rtt = now
                .as_nanos()
                .saturating_sub(echo.echoed_ns)
                .saturating_sub(echo.held_ns);
            self.update_distance(from, Duration::from_nanos(rtt / 2));
        }
        for &(source, highest) in &session.highest {
            if let Some(source) = self.index_of(NodeId(source)) {
                self.learn_end(now, source, highest.saturating_add(1));
            }
        }
    }

    fn update_distance(&mut self, member: usize, sample: Duration) {
        let alpha = self.config.distance_alpha;
        let sample = sample.max(Duration::from_micros(1));
        self.distance[member] = Some(match self.distance[member] {
            None => sample,
            Some(old) => old.mul_f64(1.0 - alpha) + sample.mul_f64(alpha),
        });
    }

    // ---- timer expiry --------------------------------------------------

    fn on_request_timer(&mut self, now: Instant, key: Key) {
        let Some(pending) = self.requests.get_mut(&key) else {
            return;
        };
        pending.requests_seen += 1;
        pending.first_request.get_or_insert(now);
        pending.backoffs = (pending.backoffs + 1).min(self.config.request_backoff_limit);
        let backoffs = pending.backoffs;
        self.tuner.sent_request();
        let request = Packet::Solicit {
            wanted: vec![SourceRanges {
                source: self.members[key.0].0,
                ranges: vec![SeqRange::single(key.1)],
            }],
            again: Vec::new(),
        };
        self.multicast_packet(&request);
        let delay = self.request_delay(key.0, backoffs);
        let pending = self.requests.get_mut(&key).expect("still there");
        pending.deadline = now + delay;
        pending.ignore_until = now + delay / 2;
        self.timers.insert((now + delay, TimerKind::Request, key));
    }

    fn on_repair_timer(&mut self, now: Instant, key: Key) {
        let Some(pending) = self.repairs.remove(&key) else {
            return;
        };
        let Some(payload) = self.store[key.0].get(key.1 as usize).cloned().flatten() else {
            return;
        };
        self.tuner.sent_repair();
        let repair = Packet::Retransmit {
            source: self.members[key.0].0,
            seq: key.1,
            payload: &payload,
        };
        self.multicast_packet(&repair);
        self.start_hold_down(now, key, pending.requester, pending.requested_at);
    }

    fn on_session_timer(&mut self, now: Instant) {
        let highest = (0..self.members.len())
            .filter_map(|i| {
                let end = if i == self.my_index {
                    self.store[i].len() as u64
                } else {
                    self.known_end[i]
                };
                end.checked_sub(1).map(|h| (self.members[i].0, h))
            })
            .collect();
        let session = Session {
            sent_ns: now.as_nanos(),
            highest,
            echoes: self.rotating_echoes(now),
        };
        self.multicast_packet(&Packet::Session(session));
        let jitter = self.config.session_jitter;
        let factor = 1.0 - jitter + 2.0 * jitter * self.rng.random::<f64>();
        self.next_session = now + self.config.session_interval.mul_f64(factor);
        self.expire_hold_downs(now);
    }

    /// Timestamp echoes for up to `session_echoes_max` peers, rotating.
    fn rotating_echoes(&mut self, now: Instant) -> Vec<Echo> {
        let n = self.members.len();
        let mut echoes = Vec::new();
        for _ in 0..n {
            if echoes.len() >= self.config.session_echoes_max {
                break;
            }
            let i = self.echo_cursor % n;
            self.echo_cursor = (self.echo_cursor + 1) % n;
            if let Some((sent_ns, heard)) = self.heard_session[i] {
                echoes.push(Echo {
                    peer: self.members[i].0,
                    echoed_ns: sent_ns,
                    held_ns: (now - heard).as_nanos() as u64,
                });
            }
        }
        echoes
    }

    fn expire_hold_downs(&mut self, now: Instant) {
        let expired: Vec<Key> = self
            .hold_downs
            .iter()
            .filter(|(_, h)| h.until <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in expired {
            if let Some(hold) = self.hold_downs.remove(&key) {
                self.tuner.repair_done(hold.repairs_seen);
            }
        }
    }
}

impl Engine for Srm {
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
        self.last_now = self.last_now.max(now);
        let now = self.last_now;
        while let Some(&(at, kind, key)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            match kind {
                TimerKind::Request => self.on_request_timer(now, key),
                TimerKind::Repair => self.on_repair_timer(now, key),
            }
        }
        if now >= self.next_session {
            self.on_session_timer(now);
        }
    }

    fn multicast(&mut self, now: Instant, payload: Bytes) -> Result<u64, SendError> {
        self.last_now = self.last_now.max(now);
        let max = shoal_wire::MAX_BODY_LEN - 12;
        if payload.len() > max {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        let me = self.my_index;
        let seq = self.store[me].len() as u64;
        self.store[me].push(Some(payload.clone()));
        self.stats.originated += 1;
        self.multicast_packet(&Packet::Data {
            seq,
            payload: &payload,
        });
        self.stats.delivered += 1;
        self.events.push_back(Event::Deliver {
            source: self.me,
            seq,
            payload,
            recovered: false,
        });
        Ok(seq)
    }

    fn poll_transmit(&mut self, _now: Instant) -> Option<Transmit> {
        let transmit = self.outbox.pop_front()?;
        self.stats.datagrams_sent += 1;
        self.stats.bytes_sent += transmit.payload.len() as u64;
        Some(transmit)
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let timer = self.timers.first().map(|t| t.0);
        Some(timer.map_or(self.next_session, |t| t.min(self.next_session)))
    }
}

impl Srm {
    /// `shared`, when the caller has one, is the datagram itself: stored
    /// payloads become slices of it instead of copies.
    fn receive(&mut self, now: Instant, from: NodeId, datagram: &[u8], shared: Option<&Bytes>) {
        self.last_now = self.last_now.max(now);
        let now = self.last_now;
        self.stats.datagrams_received += 1;
        let Some(from_index) = self.index_of(from).filter(|i| *i != self.my_index) else {
            self.stats.malformed += 1;
            return;
        };
        for item in shoal_wire::packets(datagram) {
            let Ok((header, packet)) = item.map_err(|_| ()) else {
                self.stats.malformed += 1;
                return;
            };
            if header.sender != from.0 {
                self.stats.malformed += 1;
                return;
            }
            self.stats.packets_received[header.kind.index()] += 1;
            self.on_packet(now, from_index, packet, shared);
        }
    }

    fn on_packet(&mut self, now: Instant, from: usize, packet: Packet<'_>, shared: Option<&Bytes>) {
        let own = |payload: &[u8]| match shared {
            Some(datagram) => datagram.slice_ref(payload),
            None => Bytes::copy_from_slice(payload),
        };
        match packet {
            Packet::Data { seq, payload } => {
                self.on_message(now, (from, seq), own(payload), false);
            }
            Packet::Retransmit {
                source,
                seq,
                payload,
            } => {
                if let Some(source) = self.index_of(NodeId(source)) {
                    self.on_repair(now, (source, seq), own(payload));
                }
            }
            Packet::Solicit { wanted, .. } => {
                for entry in wanted {
                    let Some(source) = self.index_of(NodeId(entry.source)) else {
                        continue;
                    };
                    for range in entry.ranges.iter().take(64) {
                        for seq in range.first..=range.last.min(range.first + 63) {
                            self.on_request(now, from, (source, seq));
                        }
                    }
                }
            }
            Packet::Session(session) => self.on_session(now, from, &session),
            Packet::Gossip { .. }
            | Packet::Status { .. }
            | Packet::Heartbeat { .. }
            | Packet::Vsync { .. }
            | Packet::Qsm { .. }
            | Packet::Presence { .. }
            | Packet::Relay { .. }
            | Packet::Push { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests;
