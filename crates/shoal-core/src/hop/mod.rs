//! The Hop link protocol (P-Spread §3.2, Figs. 2-5): a reliable
//! point-to-point protocol between two neighbouring sites of the overlay,
//! built so that reliability adds no latency to the packets that are not
//! lost.
//!
//! - **Link sequence numbers** are assigned by the sending end in the order
//!   packets reach it, not by their source: a packet recovered on the
//!   upstream link is just the next packet on this one (Fig. 5).
//! - **Non-blocking**: the receiving end hands every new packet up at once,
//!   gaps and all ([`Event::Deliver`]); the layer above forwards it on.
//! - **Lazy selective NACKs**: a gap is NACKed after `nack_delay` and again
//!   every `nack_repeat` until the packet arrives. The sender's ACK timer
//!   sends its highest sequence number, first `tail_probe` after data
//!   stops, so a lost tail is found too.
//! - **Cumulative ACKs** from the receiver every `max_packets_between_ack`
//!   packets or `ack_period`, whichever is sooner, free the sender's buffer.
//! - **Rate-based flow control**: a leaky bucket (rate, burst) paces every
//!   data packet; an outstanding window holds back new data but never a
//!   retransmission. Control items (ACKs, NACKs) are not paced: they are
//!   small and overtake data ("emergency vehicles", DESIGN.md).
//! - A packet NACKed more than `max_nacks` times declares the link failed
//!   ([`Event::LinkFailed`]); membership takes it from there.
//!
//! The printed receiver pseudocode (Fig. 4) has three slips (an off-by-one
//! range, a NACK of an empty range, sequential `if`s); this follows the
//! prose, as corrected in the reading notes. One [`Hop`] is one end of a
//! link and carries both directions: it sends its own data and receives
//! the peer's. [`tcp`] models the baseline the paper compares against,
//! TCP connections chained hop by hop, behind the same [`LinkProtocol`]
//! interface.

pub mod config;
pub mod tcp;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use shoal_wire::hop::{self as wire, Item};

pub use config::{Config, ConfigError};

use crate::Instant;

/// What one end of a link tells the layer above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A packet from the peer, handed up on arrival. `recovered` when it
    /// filled a gap (it arrived after a later packet).
    Deliver { payload: Bytes, recovered: bool },
    /// A packet was NACKed more than `max_nacks` times: the link is to be
    /// reported failed to membership. Sent once; the link keeps working.
    LinkFailed,
}

/// Why a message was not accepted. The link is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("message of {len} bytes exceeds the link's {max}")]
    TooLarge { len: usize, max: usize },
    #[error("send queue full: retry once the link drains")]
    QueueFull,
}

/// What the simulator and the daemon need from a link protocol: Hop, or
/// the TCP model it is compared with. Same polling order as every engine:
/// after any input, drain `poll_transmit` and `poll_event`, then ask
/// `poll_timeout`.
pub trait LinkProtocol {
    /// Queues a message for the peer.
    fn send(&mut self, now: Instant, payload: Bytes) -> Result<(), SendError>;
    /// A datagram from the peer arrived. Bad bytes are counted and dropped.
    fn handle_datagram(&mut self, now: Instant, datagram: &[u8]);
    /// `poll_timeout`'s deadline passed (spurious calls are harmless).
    fn handle_timeout(&mut self, now: Instant);
    /// The next datagram for the peer, built from fresh state.
    #[must_use]
    fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>>;
    /// The next event for the layer above.
    #[must_use]
    fn poll_event(&mut self) -> Option<Event>;
    /// When `handle_timeout` should next be called.
    #[must_use]
    fn poll_timeout(&self) -> Option<Instant>;
    /// Messages accepted and not yet sent once.
    fn queued(&self) -> usize;
    /// The largest message `send` accepts.
    fn max_message(&self) -> usize;
    /// Data packets (Hop) or segments (TCP) sent more than once so far.
    fn retransmissions(&self) -> u64;
}

/// Counters of one link end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub data_sent: u64,
    pub retransmissions: u64,
    pub data_received: u64,
    pub duplicates: u64,
    pub recovered: u64,
    pub nacks_sent: u64,
    pub nacks_received: u64,
    pub acks_sent: u64,
    pub bad_datagrams: u64,
}

#[derive(Debug)]
struct Unacked {
    payload: Bytes,
    nacks: u32,
}

/// One end of a Hop link.
#[derive(Debug)]
pub struct Hop {
    config: Config,
    link: u8,
    now: Instant,
    // Sending half.
    queue: VecDeque<Bytes>,
    unacked: BTreeMap<u64, Unacked>,
    retransmit: BTreeSet<u64>,
    next_seq: u64,
    /// The peer's cumulative ACK.
    acked: u64,
    tokens: f64,
    refilled: Instant,
    /// When the last data packet left.
    last_data: Instant,
    /// When the last sender ACK left, if after `last_data`.
    last_ack_sent: Option<Instant>,
    // Receiving half.
    next_expected: u64,
    /// Missing sequence numbers and when each is next NACKed.
    missing: BTreeMap<u64, Instant>,
    since_ack: u32,
    ack_requested: bool,
    last_ack: Instant,
    events: VecDeque<Event>,
    failed: bool,
    stats: Stats,
}

impl Hop {
    /// One end of link `link` (the preamble's link byte), starting at `now`.
    pub fn new(config: Config, link: u8, now: Instant) -> Result<Hop, ConfigError> {
        config.validate()?;
        let tokens = f64::from(config.burst_bytes);
        Ok(Hop {
            config,
            link,
            now,
            queue: VecDeque::new(),
            unacked: BTreeMap::new(),
            retransmit: BTreeSet::new(),
            next_seq: 1,
            acked: 0,
            tokens,
            refilled: now,
            last_data: now,
            last_ack_sent: None,
            next_expected: 1,
            missing: BTreeMap::new(),
            since_ack: 0,
            ack_requested: false,
            last_ack: now,
            events: VecDeque::new(),
            failed: false,
            stats: Stats::default(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Packets sent and not yet acknowledged cumulatively.
    pub fn outstanding(&self) -> u64 {
        self.next_seq - 1 - self.acked
    }

    /// Messages [`LinkProtocol::send`] accepted so far. Every message
    /// becomes one data packet, numbered in the order accepted, so the
    /// last message accepted travels as link sequence number
    /// `accepted()`: a ticket the layer above can hold against
    /// [`Hop::acknowledged`].
    pub fn accepted(&self) -> u64 {
        self.next_seq - 1 + self.queue.len() as u64
    }

    /// The peer's cumulative ACK: every message up to this link sequence
    /// number was handed up at the peer. A message above it is still in
    /// this end's custody: queued, in flight or being recovered.
    pub fn acknowledged(&self) -> u64 {
        self.acked
    }

    /// Sequence numbers this end is waiting for.
    pub fn missing(&self) -> usize {
        self.missing.len()
    }

    /// The receiver's cumulative ACK: every seq up to it arrived.
    fn cumulative(&self) -> u64 {
        self.missing
            .keys()
            .next()
            .map_or(self.next_expected - 1, |first| first - 1)
    }

    /// Gaps wider than this are refused as bad input: an honest sender
    /// never runs further ahead of the receiver than its window.
    fn max_gap(&self) -> u64 {
        4 * u64::from(self.config.window_packets.get()) + 64
    }

    fn advance(&mut self, now: Instant) {
        if now <= self.now {
            return;
        }
        self.now = now;
        let elapsed = (now - self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * self.config.rate_bps as f64 / 8.0)
            .min(f64::from(self.config.burst_bytes));
    }

    fn on_data(&mut self, seq: u64, payload: &[u8]) {
        self.stats.data_received += 1;
        self.since_ack += 1;
        if seq == 0 || seq >= self.cumulative() + 1 + self.max_gap() {
            self.stats.bad_datagrams += 1;
            return;
        }
        let recovered = if seq >= self.next_expected {
            self.mark_missing(self.next_expected, seq - 1);
            self.next_expected = seq + 1;
            false
        } else if self.missing.remove(&seq).is_some() {
            self.stats.recovered += 1;
            // Filling a hole advances the cumulative ACK: tell the sender
            // soon so it frees its buffer and opens its window.
            self.ack_requested = true;
            true
        } else {
            self.stats.duplicates += 1;
            return;
        };
        self.events.push_back(Event::Deliver {
            payload: Bytes::copy_from_slice(payload),
            recovered,
        });
    }

    /// Sequence numbers `first..=last` are missing: NACK them after
    /// `nack_delay`.
    fn mark_missing(&mut self, first: u64, last: u64) {
        let due = self.now + self.config.nack_delay;
        for seq in first..=last {
            self.missing.entry(seq).or_insert(due);
        }
    }

    fn on_ack_sent(&mut self, highest: u64) {
        if highest >= self.cumulative() + 1 + self.max_gap() {
            self.stats.bad_datagrams += 1;
            return;
        }
        if highest >= self.next_expected {
            self.mark_missing(self.next_expected, highest);
            self.next_expected = highest + 1;
        }
        self.ack_requested = true;
    }

    fn on_ack_received(&mut self, upto: u64) {
        let upto = upto.min(self.next_seq - 1);
        if upto <= self.acked {
            return;
        }
        self.acked = upto;
        self.unacked = self.unacked.split_off(&(upto + 1));
        self.retransmit = self.retransmit.split_off(&(upto + 1));
    }

    fn on_nack(&mut self, ranges: &[(u64, u64)]) {
        self.stats.nacks_received += 1;
        for &(first, last) in ranges {
            for (&seq, u) in self.unacked.range_mut(first..=last) {
                u.nacks += 1;
                if u.nacks > self.config.max_nacks.get() && !self.failed {
                    self.failed = true;
                    self.events.push_back(Event::LinkFailed);
                }
                self.retransmit.insert(seq);
            }
        }
    }

    /// Control items due at `now`, most urgent first.
    fn control(&mut self, room: usize) -> Vec<Item<'static>> {
        let mut items = Vec::new();
        let now = self.now;
        let ack_due = self.since_ack >= self.config.max_packets_between_ack.get()
            || self.ack_requested
            || (self.since_ack > 0 && now >= self.last_ack + self.config.ack_period);
        if ack_due {
            items.push(Item::AckReceived {
                upto: self.cumulative(),
            });
            self.since_ack = 0;
            self.ack_requested = false;
            self.last_ack = now;
            self.stats.acks_sent += 1;
        }
        let ranges = self.due_nacks(room.saturating_sub(wire::ACK_LEN * 2));
        if !ranges.is_empty() {
            items.push(Item::Nack { ranges });
            self.stats.nacks_sent += 1;
        }
        if self.ack_sent_due().is_some_and(|due| now >= due) {
            items.push(Item::AckSent {
                highest: self.next_seq - 1,
            });
            self.last_ack_sent = Some(now);
        }
        items
    }

    /// When the sender's ACK is next due: a tail probe after the last data
    /// packet when nothing more waits to be sent, then every `ack_timer`
    /// while packets are unacknowledged.
    fn ack_sent_due(&self) -> Option<Instant> {
        if self.unacked.is_empty() {
            return None;
        }
        // Data still waiting to leave is no tail: the next packet tells
        // the receiver of any gap, and a probe would cost bandwidth.
        let tail = self.queue.is_empty() && self.retransmit.is_empty();
        Some(match self.last_ack_sent {
            None if tail => self.last_data + self.config.tail_probe,
            None => self.last_data + self.config.ack_timer,
            Some(at) => at + self.config.ack_timer,
        })
    }

    /// Missing packets whose NACK is due, as ranges that fit in `room`
    /// bytes; each is NACKed again `nack_repeat` later.
    fn due_nacks(&mut self, room: usize) -> Vec<(u64, u64)> {
        let max_ranges = room.saturating_sub(wire::NACK_HEADER_LEN) / wire::NACK_RANGE_LEN;
        let (now, repeat) = (self.now, self.config.nack_repeat);
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (&seq, due) in self.missing.iter_mut() {
            if *due > now {
                continue;
            }
            let extends = ranges.last().is_some_and(|(_, last)| last + 1 == seq);
            if extends {
                ranges.last_mut().expect("non-empty").1 = seq;
            } else if ranges.len() == max_ranges {
                break;
            } else {
                ranges.push((seq, seq));
            }
            *due = now + repeat;
        }
        ranges
    }

    /// The next data packet flow control lets out, if any: a retransmission
    /// first (it ignores the window), else new data within the window.
    fn next_data(&mut self) -> Option<(u64, Bytes, bool)> {
        if let Some(&seq) = self.retransmit.first() {
            let payload = self.unacked[&seq].payload.clone();
            if !self.bucket_allows(payload.len()) {
                return None;
            }
            self.retransmit.remove(&seq);
            return Some((seq, payload, true));
        }
        let room = self.outstanding() < u64::from(self.config.window_packets.get());
        let len = self.queue.front()?.len();
        if !room || !self.bucket_allows(len) {
            return None;
        }
        let payload = self.queue.pop_front().expect("front exists");
        let seq = self.next_seq;
        self.next_seq += 1;
        self.unacked.insert(
            seq,
            Unacked {
                payload: payload.clone(),
                nacks: 0,
            },
        );
        Some((seq, payload, false))
    }

    fn datagram_len(payload: usize) -> usize {
        wire::PREAMBLE_LEN + wire::DATA_OVERHEAD + payload
    }

    fn bucket_allows(&self, payload: usize) -> bool {
        self.tokens >= Self::datagram_len(payload) as f64
    }

    /// When the bucket will hold enough for the next data packet waiting.
    fn bucket_ready_at(&self) -> Option<Instant> {
        let len = match self.retransmit.first() {
            Some(seq) => self.unacked[seq].payload.len(),
            None if self.outstanding() < u64::from(self.config.window_packets.get()) => {
                self.queue.front()?.len()
            }
            None => return None,
        };
        let short = Self::datagram_len(len) as f64 - self.tokens;
        if short <= 0.0 {
            return Some(self.now);
        }
        // Rounded up by a microsecond so the wake-up finds the tokens there.
        let secs = short * 8.0 / self.config.rate_bps as f64 + 1e-6;
        Some(self.now + std::time::Duration::from_secs_f64(secs))
    }
}

impl LinkProtocol for Hop {
    fn send(&mut self, _now: Instant, payload: Bytes) -> Result<(), SendError> {
        let max = self.config.max_payload();
        if payload.len() > max {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        if self.queue.len() >= self.config.send_queue_max {
            return Err(SendError::QueueFull);
        }
        self.queue.push_back(payload);
        Ok(())
    }

    fn handle_datagram(&mut self, now: Instant, datagram: &[u8]) {
        self.advance(now);
        let Ok((link, items)) = wire::decode(datagram) else {
            self.stats.bad_datagrams += 1;
            return;
        };
        if link != self.link {
            self.stats.bad_datagrams += 1;
            return;
        }
        for item in items {
            match item {
                Item::Data { seq, payload } => self.on_data(seq, payload),
                Item::AckSent { highest } => self.on_ack_sent(highest),
                Item::AckReceived { upto } => self.on_ack_received(upto),
                Item::Nack { ranges } => self.on_nack(&ranges),
            }
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        // Everything due is found by `poll_transmit` from fresh state.
        self.advance(now);
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Vec<u8>> {
        self.advance(now);
        let max = self.config.max_datagram_size;
        let control = self.control(max - wire::PREAMBLE_LEN);
        let control_len: usize = control.iter().map(Item::encoded_len).sum();
        let mut items = control;
        let fits = |payload: usize| {
            wire::PREAMBLE_LEN + control_len + wire::DATA_OVERHEAD + payload <= max
        };
        let data_fits = match self.retransmit.first() {
            Some(seq) => fits(self.unacked[seq].payload.len()),
            None => self.queue.front().is_some_and(|p| fits(p.len())),
        };
        let data = if data_fits || items.is_empty() {
            self.next_data()
        } else {
            None
        };
        if let Some((seq, payload, retransmission)) = &data {
            self.tokens -= Self::datagram_len(payload.len()) as f64;
            self.last_data = self.now;
            self.last_ack_sent = None;
            self.stats.data_sent += 1;
            if *retransmission {
                self.stats.retransmissions += 1;
            }
            items.push(Item::Data {
                seq: *seq,
                payload: payload.as_ref(),
            });
        }
        if items.is_empty() {
            return None;
        }
        Some(wire::encode(self.link, &items).expect("items built within limits"))
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let nack = self.missing.values().min().copied();
        let ack_r = (self.since_ack > 0).then(|| self.last_ack + self.config.ack_period);
        let ack_s = self.ack_sent_due();
        let data = self.bucket_ready_at();
        [nack, ack_r, ack_s, data].into_iter().flatten().min()
    }

    fn queued(&self) -> usize {
        self.queue.len()
    }

    fn max_message(&self) -> usize {
        self.config.max_payload()
    }

    fn retransmissions(&self) -> u64 {
        self.stats.retransmissions
    }
}
