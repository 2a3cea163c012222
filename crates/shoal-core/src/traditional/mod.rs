//! The traditional virtual-synchrony stack, the baseline P000 measures the
//! non-traditional one against (P000 §2.1, Fig 1; Isis/Horus style): every
//! member acknowledges every message to everyone, a sender buffers each
//! multicast until every member of the view has it, and may have at most
//! `window` of them outstanding (flow control: one slow member throttles the
//! whole group, which is the effect Fig 1 shows). A member that stays silent
//! for `fail_timeout` is suspected and a flush installs a view without it.
//!
//! The protocol, per member:
//! - **Data.** The first phase goes by IP multicast (or unicast fan-out).
//!   Receivers deliver each source's messages in FIFO order.
//! - **Stability.** Every member multicasts a STATUS per source ("I hold all
//!   of S below `next`") after `ack_every` new messages or `ack_delay`, and at
//!   least every `heartbeat_interval` (it doubles as the heartbeat). So
//!   everyone knows what everyone holds: the all-to-all traffic whose O(n²)
//!   cost P000 §2 describes.
//! - **Retransmission.** A member that holds messages a peer lacks, and is
//!   their source (or their source has failed), unicasts them as
//!   RETRANSMITs when the peer has made no progress for `retransmit_timeout`.
//! - **Flush (P000 §2.1, "a flush with a view change on every failure").**
//!   The coordinator (lowest-id unsuspected member of the view) proposes the
//!   view without the suspects. Members stop originating, relay the failed
//!   members' messages until every survivor holds the same prefix of every
//!   stream, then acknowledge; the coordinator installs the view and sending
//!   resumes. Survivors that move together therefore delivered the same
//!   messages in the old view.
//!
//! Wire: DATA, STATUS, RETRANSMIT and, for the flush, vsync control
//! messages (a proposed `Newview` as `Entry { gseq: 0 }`, the flush
//! acknowledgement as `AckPrefreshview`, the installed view as
//! `Entry { gseq: 1 }`).
//!
//! Limits: no quorum (a partition splits the group, as in early Horus); a
//! falsely suspected member is not told and will suspect the others in turn;
//! joins are not supported (the membership issue's vsync-over-pbcast stack
//! has them).

mod config;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use shoal_wire::vsync::{self as wire, Entry, Message, NewView};
use shoal_wire::Packet;

pub use config::{Config, ConfigError};

use crate::engine::{member_list, Destination, Engine, NodeId, SendError, Transmit};
use crate::time::Instant;

/// What the application is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Deliver {
        source: NodeId,
        seq: u64,
        payload: Bytes,
    },
    /// A new view was installed after a flush.
    View { id: u64, members: Vec<NodeId> },
}

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub delivered: u64,
    pub retransmits_sent: u64,
    pub duplicates: u64,
    pub window_full: u64,
    pub views_installed: u64,
    pub malformed: u64,
}

/// One source's stream as this member holds it.
#[derive(Debug, Default)]
struct Stream {
    /// Everything below is delivered.
    next: u64,
    /// The messages below `next` this member still keeps (at most the last
    /// `window` plus what is not yet stable), oldest first, from `kept_from`.
    kept: VecDeque<Bytes>,
    kept_from: u64,
    /// Received ahead of a gap.
    ahead: BTreeMap<u64, Bytes>,
    /// New messages since the last STATUS for this source.
    unreported: u32,
}

impl Stream {
    fn get(&self, seq: u64) -> Option<&Bytes> {
        let i = seq.checked_sub(self.kept_from)?;
        self.kept.get(usize::try_from(i).ok()?)
    }
}

/// A flush in progress.
#[derive(Debug, Clone)]
struct Flush {
    view: NewView,
    /// Coordinator only: who acknowledged.
    oks: Vec<NodeId>,
    ok_sent_at: Option<Instant>,
}

pub struct Traditional {
    me: NodeId,
    config: Config,
    /// All members ever known (index = position); streams are per index.
    all: Vec<NodeId>,
    my_index: usize,
    view_id: u64,
    /// Indices of the current view's members.
    view: Vec<usize>,
    streams: Vec<Stream>,
    /// known[peer][source]: the peer holds all of source below this.
    known: Vec<Vec<u64>>,
    /// When each peer last made progress on each source (for retransmission).
    progress_at: Vec<Vec<Instant>>,
    /// When each of my own kept messages was sent, aligned with
    /// `streams[my_index].kept`.
    sent_at: VecDeque<Instant>,
    last_heard: Vec<Instant>,
    suspected: Vec<bool>,
    flush: Option<Flush>,
    /// The last view this member installed as coordinator, re-sent to a
    /// member whose flush acknowledgement shows it missed the install.
    installed: Option<NewView>,
    next_status: Instant,
    next_status_due: Option<Instant>,
    out: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: Stats,
    last_now: Instant,
}

impl Traditional {
    pub fn new(
        me: NodeId,
        members: &[NodeId],
        config: Config,
        now: Instant,
    ) -> Result<Traditional, ConfigError> {
        config.validate()?;
        let (all, my_index) = member_list(me, members).ok_or(ConfigError::NotAMember(me.0))?;
        let n = all.len();
        Ok(Traditional {
            me,
            view_id: 0,
            view: (0..n).collect(),
            streams: (0..n).map(|_| Stream::default()).collect(),
            known: vec![vec![0; n]; n],
            progress_at: vec![vec![now; n]; n],
            sent_at: VecDeque::new(),
            last_heard: vec![now; n],
            suspected: vec![false; n],
            flush: None,
            installed: None,
            next_status: now,
            next_status_due: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: Stats::default(),
            last_now: now,
            config,
            all,
            my_index,
        })
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The current view: id and members.
    pub fn view(&self) -> (u64, Vec<NodeId>) {
        (
            self.view_id,
            self.view.iter().map(|&i| self.all[i]).collect(),
        )
    }

    /// Messages of mine some member of the view does not hold yet.
    pub fn unstable(&self) -> u64 {
        let mine = self.streams[self.my_index].next;
        mine - self.stable_point(self.my_index)
    }

    pub fn can_send(&self) -> bool {
        self.flush.is_none() && self.unstable() < u64::from(self.config.window.get())
    }

    fn index_of(&self, node: NodeId) -> Option<usize> {
        self.all.binary_search(&node).ok()
    }

    /// Everything of `source` below this is held by every view member.
    fn stable_point(&self, source: usize) -> u64 {
        let mine = self.streams[source].next;
        self.view
            .iter()
            .filter(|&&p| p != self.my_index)
            .map(|&p| self.known[p][source])
            .fold(mine, u64::min)
    }

    fn coordinator(&self) -> usize {
        self.view
            .iter()
            .copied()
            .find(|&i| !self.suspected[i])
            .unwrap_or(self.my_index)
    }

    // ---- sending -----------------------------------------------------------

    fn send_packet(&mut self, destination: Destination, packet: &Packet<'_>) {
        match packet.to_vec(self.me.0) {
            Ok(bytes) => self.out.push_back(Transmit {
                destination,
                payload: Bytes::from(bytes),
            }),
            Err(_) => self.stats.malformed += 1,
        }
    }

    /// To every other member of the view, by multicast or fan-out.
    fn send_to_view(&mut self, packet: &Packet<'_>) {
        match packet.to_vec(self.me.0) {
            Ok(bytes) => self.send_datagram_to_view(Bytes::from(bytes)),
            Err(_) => self.stats.malformed += 1,
        }
    }

    fn send_control(&mut self, to: usize, message: &Message<'_>) {
        let Ok(body) = message.to_vec() else {
            self.stats.malformed += 1;
            return;
        };
        let packet = Packet::Vsync { body: &body };
        self.send_packet(Destination::Node(self.all[to]), &packet);
    }

    /// STATUS packets for every stream with something to report (or, as
    /// the heartbeat, every stream that has started), packed into as few
    /// datagrams as fit. At least one goes out as a heartbeat.
    fn send_status(&mut self, now: Instant, heartbeat: bool) {
        let max = self.config.max_datagram_size;
        let mut datagram: Vec<u8> = Vec::new();
        let mut datagrams = Vec::new();
        for source in 0..self.streams.len() {
            let s = &mut self.streams[source];
            let report = s.unreported > 0 || (heartbeat && s.next > 0);
            if !report {
                continue;
            }
            s.unreported = 0;
            let packet = Packet::Status {
                source: self.all[source].0,
                next: s.next,
            };
            if datagram.len() + packet.encoded_len() > max && !datagram.is_empty() {
                datagrams.push(std::mem::take(&mut datagram));
            }
            if packet.encode(self.me.0, &mut datagram).is_err() {
                self.stats.malformed += 1;
            }
        }
        if datagram.is_empty() && heartbeat {
            // Nothing sent yet by anyone: a heartbeat about our own stream.
            let packet = Packet::Status {
                source: self.me.0,
                next: 0,
            };
            let _ = packet.encode(self.me.0, &mut datagram);
        }
        if !datagram.is_empty() {
            datagrams.push(datagram);
        }
        for d in datagrams {
            self.send_datagram_to_view(Bytes::from(d));
        }
        self.next_status = now + self.config.heartbeat_interval;
        self.next_status_due = None;
    }

    fn send_datagram_to_view(&mut self, payload: Bytes) {
        if self.config.ip_multicast {
            self.out.push_back(Transmit {
                destination: Destination::Multicast,
                payload,
            });
            return;
        }
        let peers: Vec<NodeId> = self
            .view
            .iter()
            .filter(|&&p| p != self.my_index)
            .map(|&p| self.all[p])
            .collect();
        for p in peers {
            self.out.push_back(Transmit {
                destination: Destination::Node(p),
                payload: payload.clone(),
            });
        }
    }

    // ---- receiving ---------------------------------------------------------

    fn on_message(&mut self, now: Instant, source: usize, seq: u64, payload: Bytes) {
        let window = u64::from(self.config.window.get());
        let s = &mut self.streams[source];
        if seq < s.next || s.ahead.contains_key(&seq) {
            self.stats.duplicates += 1;
            return;
        }
        if seq > s.next + 4 * window {
            // Impossible under the window: a forged or corrupt sequence.
            self.stats.malformed += 1;
            return;
        }
        s.ahead.insert(seq, payload);
        while let Some(payload) = s.ahead.remove(&s.next) {
            if s.kept.is_empty() {
                s.kept_from = s.next;
            }
            s.kept.push_back(payload.clone());
            self.events.push_back(Event::Deliver {
                source: self.all[source],
                seq: s.next,
                payload,
            });
            self.stats.delivered += 1;
            s.next += 1;
            s.unreported += 1;
        }
        let s = &self.streams[source];
        if s.unreported >= self.config.ack_every.get() {
            self.send_status(now, false);
        } else if s.unreported > 0 && self.next_status_due.is_none() {
            self.next_status_due = Some(now + self.config.ack_delay);
        }
    }

    fn on_status(&mut self, now: Instant, from: usize, source: usize, next: u64) {
        let k = &mut self.known[from][source];
        if next > *k {
            *k = next;
            self.progress_at[from][source] = now;
        }
        self.collect(source);
    }

    /// Drops kept messages every view member holds, keeping the last
    /// `window` (a failed source's recent messages may still be relayed).
    fn collect(&mut self, source: usize) {
        let window = u64::from(self.config.window.get());
        let stable = self.stable_point(source);
        let s = &mut self.streams[source];
        let keep_from = stable.min(s.next.saturating_sub(window));
        while s.kept_from < keep_from && !s.kept.is_empty() {
            s.kept.pop_front();
            s.kept_from += 1;
            if source == self.my_index {
                self.sent_at.pop_front();
            }
        }
    }

    fn on_control(&mut self, now: Instant, from: usize, body: &[u8]) {
        let Ok(message) = wire::decode(body) else {
            self.stats.malformed += 1;
            return;
        };
        match message {
            Message::Entry {
                gseq,
                entry: Entry::Newview(v),
            } => match gseq {
                0 => self.on_flush_request(now, from, v),
                1 => self.on_install(now, from, v),
                _ => self.stats.malformed += 1,
            },
            Message::AckPrefreshview { view, .. } => self.on_flush_ok(now, from, view),
            _ => self.stats.malformed += 1,
        }
    }

    // ---- failure detection and flush -------------------------------------

    fn check_failures(&mut self, now: Instant) {
        let timeout = self.config.fail_timeout;
        let mut newly = false;
        for &p in &self.view {
            if p != self.my_index && !self.suspected[p] && self.last_heard[p] + timeout <= now {
                self.suspected[p] = true;
                newly = true;
            }
        }
        if newly && self.coordinator() == self.my_index {
            self.propose(now);
        }
    }

    /// The coordinator proposes the view without the suspects.
    fn propose(&mut self, now: Instant) {
        let members: Vec<u32> = self
            .view
            .iter()
            .filter(|&&i| !self.suspected[i])
            .map(|&i| self.all[i].0)
            .collect();
        let left: Vec<u32> = self
            .view
            .iter()
            .filter(|&&i| self.suspected[i])
            .map(|&i| self.all[i].0)
            .collect();
        let view = NewView {
            view: self.view_id + 1,
            epoch: 0,
            members,
            committee: vec![self.me.0],
            left,
            reasons: wire::REASON_FAILURE,
        };
        self.flush = Some(Flush {
            view: view.clone(),
            oks: Vec::new(),
            ok_sent_at: None,
        });
        self.broadcast_proposal(&view);
        self.try_flush_ok(now);
    }

    fn broadcast_proposal(&mut self, view: &NewView) {
        let message = Message::Entry {
            gseq: 0,
            entry: Entry::Newview(view.clone()),
        };
        for m in view.members.clone() {
            if let Some(i) = self.index_of(NodeId(m)).filter(|i| *i != self.my_index) {
                self.send_control(i, &message);
            }
        }
    }

    fn on_flush_request(&mut self, now: Instant, from: usize, v: NewView) {
        if v.view <= self.view_id || !v.members.contains(&self.me.0) {
            return;
        }
        if self.flush.as_ref().is_some_and(|f| f.view.view > v.view) {
            return;
        }
        for m in &v.left {
            if let Some(i) = self.index_of(NodeId(*m)) {
                self.suspected[i] = true;
            }
        }
        let _ = from;
        let same = self.flush.as_ref().is_some_and(|f| f.view == v);
        if !same {
            self.flush = Some(Flush {
                view: v,
                oks: Vec::new(),
                ok_sent_at: None,
            });
        }
        self.try_flush_ok(now);
    }

    /// Survivors: every stream of the old view is held identically by all
    /// survivors (as far as this member knows).
    fn flush_complete_here(&self, survivors: &[usize]) -> bool {
        self.view.iter().all(|&source| {
            let mine = self.streams[source].next;
            survivors
                .iter()
                .filter(|&&p| p != self.my_index)
                .all(|&p| self.known[p][source] == mine)
        })
    }

    fn survivors(&self, v: &NewView) -> Vec<usize> {
        v.members
            .iter()
            .filter_map(|m| self.index_of(NodeId(*m)))
            .collect()
    }

    fn try_flush_ok(&mut self, now: Instant) {
        let Some(f) = self.flush.clone() else {
            return;
        };
        let survivors = self.survivors(&f.view);
        if !self.flush_complete_here(&survivors) {
            return;
        }
        if f.ok_sent_at
            .is_some_and(|at| at + self.config.retransmit_timeout > now)
        {
            return;
        }
        let coordinator = self.index_of(NodeId(f.view.committee[0]));
        if let Some(flush) = self.flush.as_mut() {
            flush.ok_sent_at = Some(now);
        }
        match coordinator {
            Some(c) if c == self.my_index => self.on_flush_ok(now, c, f.view.view),
            Some(c) => {
                let ok = Message::AckPrefreshview {
                    view: f.view.view,
                    epoch: 0,
                    next: 0,
                    report: None,
                };
                self.send_control(c, &ok);
            }
            None => {}
        }
    }

    fn on_flush_ok(&mut self, now: Instant, from: usize, view: u64) {
        let me = self.me;
        if let Some(v) = self.installed.clone().filter(|v| v.view == view) {
            let install = Message::Entry {
                gseq: 1,
                entry: Entry::Newview(v),
            };
            self.send_control(from, &install);
            return;
        }
        let Some(f) = self.flush.as_mut() else {
            return;
        };
        if f.view.view != view || f.view.committee.first() != Some(&me.0) {
            return;
        }
        let node = self.all[from];
        if !f.oks.contains(&node) {
            f.oks.push(node);
        }
        let done = f.view.members.iter().all(|m| f.oks.contains(&NodeId(*m)));
        if !done {
            return;
        }
        let v = f.view.clone();
        let install = Message::Entry {
            gseq: 1,
            entry: Entry::Newview(v.clone()),
        };
        for m in &v.members {
            if let Some(i) = self.index_of(NodeId(*m)).filter(|i| *i != self.my_index) {
                self.send_control(i, &install);
            }
        }
        self.install(now, &v);
        self.installed = Some(v);
    }

    fn on_install(&mut self, now: Instant, _from: usize, v: NewView) {
        if v.view <= self.view_id || !v.members.contains(&self.me.0) {
            return;
        }
        self.install(now, &v);
    }

    fn install(&mut self, now: Instant, v: &NewView) {
        self.view_id = v.view;
        self.view = self.survivors(v);
        self.view.sort_unstable();
        self.flush = None;
        for &p in &self.view {
            self.last_heard[p] = now;
        }
        self.stats.views_installed += 1;
        self.events.push_back(Event::View {
            id: v.view,
            members: self.view.iter().map(|&i| self.all[i]).collect(),
        });
    }

    // ---- retransmission --------------------------------------------------

    /// Sends a lagging peer what it lacks of the streams this member serves:
    /// its own, and (during a flush) those of failed members.
    fn retransmit(&mut self, now: Instant) {
        let timeout = self.config.retransmit_timeout;
        let burst = u64::from(self.config.retransmit_burst.get());
        let peers: Vec<usize> = match &self.flush {
            Some(f) => self.survivors(&f.view),
            None => self.view.clone(),
        };
        let sources: Vec<usize> = (0..self.streams.len())
            .filter(|&s| s == self.my_index || (self.suspected[s] && self.flush.is_some()))
            .collect();
        for source in sources {
            let mine = self.streams[source].next;
            // Only what a peer has had `timeout` to acknowledge is resent.
            // A busy sender (unicast fan-out, CPU- or link-bound) holds
            // reports in its backlog; counting the newest messages as lost
            // resent up to a window to every member each round, which
            // pushed it further behind until heartbeats missed their
            // deadline and it suspected everyone (P000 Fig 1's meltdown,
            // docs/reproduction.md).
            let due = if source == self.my_index {
                let s = &self.streams[source];
                s.kept_from + self.sent_at.partition_point(|at| *at + timeout <= now) as u64
            } else {
                mine
            };
            for &p in &peers {
                if p == self.my_index {
                    continue;
                }
                let has = self.known[p][source];
                // `due` <= `mine`: nothing due means nothing lacked either.
                if has >= due || self.progress_at[p][source] + timeout > now {
                    continue;
                }
                self.progress_at[p][source] = now;
                for seq in has..due.min(has + burst) {
                    let Some(payload) = self.streams[source].get(seq).cloned() else {
                        continue;
                    };
                    let packet = Packet::Retransmit {
                        source: self.all[source].0,
                        seq,
                        payload: &payload,
                    };
                    self.send_packet(Destination::Node(self.all[p]), &packet);
                    self.stats.retransmits_sent += 1;
                }
            }
        }
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        let window = u64::from(self.config.window.get());
        assert!(
            self.flush.is_some() || self.unstable() <= window,
            "window exceeded"
        );
    }
}

impl Engine for Traditional {
    type Event = Event;

    fn node_id(&self) -> NodeId {
        self.me
    }

    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        let now = self.clamp(now);
        let Some(from_index) = self.index_of(from).filter(|i| *i != self.my_index) else {
            self.stats.malformed += 1;
            return;
        };
        self.last_heard[from_index] = now;
        for item in shoal_wire::packets(datagram) {
            let Ok((header, packet)) = item else {
                self.stats.malformed += 1;
                return;
            };
            if header.sender != from.0 {
                self.stats.malformed += 1;
                return;
            }
            match packet {
                Packet::Data { seq, payload } => {
                    self.on_message(now, from_index, seq, Bytes::copy_from_slice(payload));
                }
                Packet::Retransmit {
                    source,
                    seq,
                    payload,
                } => {
                    if let Some(source) = self.index_of(NodeId(source)) {
                        self.on_message(now, source, seq, Bytes::copy_from_slice(payload));
                    }
                }
                Packet::Status { source, next } => {
                    if let Some(source) = self.index_of(NodeId(source)) {
                        self.on_status(now, from_index, source, next);
                    }
                }
                Packet::Vsync { body } => self.on_control(now, from_index, body),
                _ => self.stats.malformed += 1,
            }
        }
        self.try_flush_ok(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        let now = self.clamp(now);
        if now >= self.next_status || self.next_status_due.is_some_and(|t| t <= now) {
            let heartbeat = now >= self.next_status;
            self.send_status(now, heartbeat);
        }
        self.check_failures(now);
        self.retransmit(now);
        if let Some(f) = self.flush.clone() {
            // Proposals and acknowledgements are repeated until the view
            // is installed (any of them may be lost).
            if f.view.committee.first() == Some(&self.me.0) && f.ok_sent_at.is_some() {
                self.broadcast_proposal(&f.view);
            }
            if let Some(flush) = self.flush.as_mut() {
                flush.ok_sent_at = flush
                    .ok_sent_at
                    .filter(|at| *at + self.config.retransmit_timeout > now);
            }
            self.try_flush_ok(now);
        }
    }

    fn multicast(&mut self, now: Instant, payload: Bytes) -> Result<u64, SendError> {
        let now = self.clamp(now);
        let max = self
            .config
            .max_datagram_size
            .saturating_sub(shoal_wire::HEADER_LEN + 8);
        if payload.len() > max {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        if !self.can_send() {
            self.stats.window_full += 1;
            return Err(SendError::WindowFull);
        }
        let me = self.my_index;
        let seq = self.streams[me].next;
        let packet = Packet::Data {
            seq,
            payload: &payload,
        };
        self.send_to_view(&packet);
        // The sender holds its own message like any receiver.
        self.sent_at.push_back(now);
        self.on_message(now, me, seq, payload);
        for &p in &self.view.clone() {
            if p != me && self.known[p][me] == seq {
                self.progress_at[p][me] = now;
            }
        }
        Ok(seq)
    }

    fn poll_transmit(&mut self, _now: Instant) -> Option<Transmit> {
        self.out.pop_front()
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let retransmit =
            self.last_now + self.config.retransmit_timeout.min(self.config.fail_timeout) / 4;
        [
            Some(self.next_status),
            self.next_status_due,
            Some(retransmit),
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

impl Traditional {
    fn clamp(&mut self, now: Instant) -> Instant {
        self.last_now = self.last_now.max(now);
        self.last_now
    }
}
