//! The Ring protocol inside a site (P-Spread §3: "based on the same ideas
//! as Totem"): the daemons of one LAN form a logical ring; a token
//! circulates, unicast from each member to the next, and only its holder
//! multicasts (IP multicast), stamping each message with the next ring-wide
//! sequence number. Every member delivers in sequence order, so all deliver
//! the same messages in the same total order.
//!
//! The token carries (Totem's fields): `ring_id`, `token_seq` (bumped at
//! every pass, so a stale or duplicate token is ignored), `seq` (the
//! highest sequence number assigned), `aru` and `aru_id` (all received up
//! to, and who holds it down), `fcc` (messages multicast in the last
//! rotation) and `rtr` (retransmission requests). On the token a member:
//! retransmits what others asked for and it holds; adds what it lacks to
//! `rtr`; multicasts at most `max_messages` new messages, fewer if the
//! rotation's total would pass `window_size`; updates `aru` and `fcc`; and
//! passes the token on. It resends a token it passed every
//! `token_retransmit` until it sees the ring move on (a message newer than
//! the token it passed, or the next token), so a lost token does not stop
//! the ring.
//!
//! Not here: membership (forming a ring, detecting a failed member, the
//! recovery of Totem's membership protocol) and safe delivery; the ring is
//! fixed at creation. Messages are garbage collected once the `aru` seen on
//! two successive visits covers them.

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use shoal_wire::ring::{decode, RingPacket, Token, NO_MEMBER};

use crate::engine::SendError;
use crate::{Destination, Engine, Instant, NodeId, Transmit};

/// How far past this member's aru a sequence number may be: a member
/// that far behind has lost the ring (membership's business), and a
/// number beyond it is refused as forged, which keeps arithmetic and the
/// held map bounded.
const MAX_AHEAD: u64 = 1 << 32;

/// Settings of a ring member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Messages multicast in one rotation of the token, at most (Totem's
    /// window; Corosync's default 50).
    pub window_size: u32,
    /// Messages one member multicasts per token visit, at most
    /// (Corosync's default 17).
    pub max_messages: u32,
    /// How often a member resends the token it passed while it sees no
    /// sign the ring moved on. Corosync derives 238 ms from its 1 s token
    /// timeout; ours, 20 ms, is for a LAN without the membership protocol
    /// that would otherwise notice a lost token.
    #[serde(with = "crate::serde_ms")]
    pub token_retransmit: Duration,
    /// Messages waiting for the token, at most.
    pub send_queue_max: usize,
    /// Largest message payload.
    pub max_payload: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            window_size: 50,
            max_messages: 17,
            token_retransmit: Duration::from_millis(20),
            send_queue_max: 10_000,
            max_payload: 1400,
        }
    }
}

/// What a member delivers: every message of the ring, in `seq` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Deliver {
        seq: u64,
        sender: NodeId,
        payload: Bytes,
    },
}

/// Why a ring could not be formed. Nothing was created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("a ring needs at least two members including this one")]
    TooFewMembers,
    #[error("window_size and max_messages must be positive")]
    ZeroWindow,
}

/// Counters of one member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub tokens: u64,
    pub token_retransmissions: u64,
    pub retransmissions: u64,
    pub multicasts: u64,
    pub bad_datagrams: u64,
}

/// One member of a ring.
#[derive(Debug)]
pub struct Ring {
    config: Config,
    me: NodeId,
    members: Vec<NodeId>,
    index: usize,
    ring_id: u64,
    now: Instant,
    queue: VecDeque<Bytes>,
    /// Messages held, for delivery and retransmission.
    held: BTreeMap<u64, (NodeId, Bytes)>,
    /// Every message up to this one is held or delivered.
    my_aru: u64,
    delivered: u64,
    last_token_seq: u64,
    /// The token this member passed, and when to resend it.
    passed: Option<(Token, Instant)>,
    sent_last_visit: u32,
    /// `aru` at this member's previous token visit.
    previous_aru: u64,
    out: VecDeque<Transmit>,
    events: VecDeque<Event>,
    next_local_id: u64,
    stats: Stats,
}

impl Ring {
    /// Member `me` of the ring `members` (ring order is ascending id). The
    /// lowest member creates the first token.
    pub fn new(
        config: Config,
        me: NodeId,
        members: &[NodeId],
        ring_id: u64,
        now: Instant,
    ) -> Result<Ring, RingError> {
        let (members, index) =
            crate::engine::member_list(me, members).ok_or(RingError::TooFewMembers)?;
        if members.len() < 2 {
            return Err(RingError::TooFewMembers);
        }
        if config.window_size == 0 || config.max_messages == 0 {
            return Err(RingError::ZeroWindow);
        }
        let mut ring = Ring {
            config,
            me,
            members,
            index,
            ring_id,
            now,
            queue: VecDeque::new(),
            held: BTreeMap::new(),
            my_aru: 0,
            delivered: 0,
            last_token_seq: 0,
            passed: None,
            sent_last_visit: 0,
            previous_aru: 0,
            out: VecDeque::new(),
            events: VecDeque::new(),
            next_local_id: 0,
            stats: Stats::default(),
        };
        if index == 0 {
            ring.on_token(Token {
                ring_id,
                token_seq: 1,
                seq: 0,
                aru: 0,
                aru_id: NO_MEMBER,
                fcc: 0,
                rtr: Vec::new(),
            });
        }
        Ok(ring)
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Messages held for delivery or retransmission.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    fn successor(&self) -> NodeId {
        self.members[(self.index + 1) % self.members.len()]
    }

    fn on_token(&mut self, mut t: Token) {
        if t.ring_id != self.ring_id || t.token_seq <= self.last_token_seq {
            return;
        }
        if t.token_seq == u64::MAX || t.seq > self.my_aru + MAX_AHEAD {
            // Sequence numbers no ring reaches: a forged token.
            self.stats.bad_datagrams += 1;
            return;
        }
        self.stats.tokens += 1;
        self.last_token_seq = t.token_seq;
        self.passed = None;
        let retransmitted = self.answer_requests(&mut t);
        self.request_missing(&mut t);
        let budget = self
            .config
            .max_messages
            .saturating_sub(retransmitted)
            .min(self.config.window_size.saturating_sub(t.fcc));
        let mut sent = 0;
        while sent < budget {
            let Some(payload) = self.queue.pop_front() else {
                break;
            };
            t.seq += 1;
            self.multicast_data(t.seq, self.me, payload.clone());
            self.held.insert(t.seq, (self.me, payload));
            sent += 1;
        }
        self.advance_aru();
        self.update_aru(&mut t);
        t.fcc = (t.fcc + sent + retransmitted).saturating_sub(self.sent_last_visit);
        self.sent_last_visit = sent + retransmitted;
        self.collect_garbage(t.aru);
        t.token_seq += 1;
        self.pass(t);
        self.deliver();
    }

    /// Retransmits what the token asks for and this member holds; returns
    /// how many.
    fn answer_requests(&mut self, t: &mut Token) -> u32 {
        let mut count = 0;
        let mut still = Vec::new();
        for &seq in &t.rtr {
            match self.held.get(&seq) {
                Some((sender, payload)) if count < self.config.max_messages => {
                    let (sender, payload) = (*sender, payload.clone());
                    self.multicast_data(seq, sender, payload);
                    self.stats.retransmissions += 1;
                    count += 1;
                }
                _ => still.push(seq),
            }
        }
        t.rtr = still;
        count
    }

    fn request_missing(&mut self, t: &mut Token) {
        let asked: BTreeSet<u64> = t.rtr.iter().copied().collect();
        for seq in self.my_aru + 1..=t.seq {
            if t.rtr.len() >= 1000 {
                break;
            }
            if !self.held.contains_key(&seq) && seq > self.delivered && !asked.contains(&seq) {
                t.rtr.push(seq);
            }
        }
    }

    /// Totem's aru rule: lower it to mine, or raise it if I held it down.
    fn update_aru(&mut self, t: &mut Token) {
        let me = self.me.0;
        if self.my_aru < t.aru || t.aru_id == me || t.aru_id == NO_MEMBER {
            t.aru = self.my_aru;
            t.aru_id = if self.my_aru >= t.seq { NO_MEMBER } else { me };
        }
    }

    /// Forgets messages every member holds: below the aru of this visit
    /// and of the last one, and delivered here.
    fn collect_garbage(&mut self, aru: u64) {
        let stable = aru.min(self.previous_aru).min(self.delivered);
        self.previous_aru = aru;
        self.held = self.held.split_off(&(stable + 1));
    }

    fn pass(&mut self, t: Token) {
        let bytes = RingPacket::Token(t.clone()).encode();
        self.out.push_back(Transmit {
            destination: Destination::Node(self.successor()),
            payload: Bytes::from(bytes),
        });
        self.passed = Some((t, self.now + self.config.token_retransmit));
    }

    fn multicast_data(&mut self, seq: u64, sender: NodeId, payload: Bytes) {
        let bytes = RingPacket::Data {
            ring_id: self.ring_id,
            seq,
            sender: sender.0,
            payload: &payload,
        }
        .encode();
        self.stats.multicasts += 1;
        self.out.push_back(Transmit {
            destination: Destination::Multicast,
            payload: Bytes::from(bytes),
        });
    }

    fn on_data(&mut self, seq: u64, sender: u32, payload: &[u8]) {
        if seq > self.my_aru + MAX_AHEAD {
            self.stats.bad_datagrams += 1;
            return;
        }
        if let Some((t, _)) = &self.passed {
            // A message the token's holder after me stamped: it moved on.
            if seq > t.seq {
                self.passed = None;
            }
        }
        if seq <= self.delivered || self.held.contains_key(&seq) {
            return;
        }
        self.held
            .insert(seq, (NodeId(sender), Bytes::copy_from_slice(payload)));
        self.advance_aru();
        self.deliver();
    }

    fn advance_aru(&mut self) {
        while self.held.contains_key(&(self.my_aru + 1)) {
            self.my_aru += 1;
        }
    }

    fn deliver(&mut self) {
        while self.delivered < self.my_aru {
            self.delivered += 1;
            let (sender, payload) = self.held[&self.delivered].clone();
            self.events.push_back(Event::Deliver {
                seq: self.delivered,
                sender,
                payload,
            });
        }
    }
}

impl Engine for Ring {
    type Event = Event;

    fn node_id(&self) -> NodeId {
        self.me
    }

    fn handle_datagram(&mut self, now: Instant, _from: NodeId, datagram: &[u8]) {
        self.now = self.now.max(now);
        match decode(datagram) {
            Ok(RingPacket::Token(t)) => self.on_token(t),
            Ok(RingPacket::Data {
                ring_id,
                seq,
                sender,
                payload,
            }) if ring_id == self.ring_id => self.on_data(seq, sender, payload),
            _ => self.stats.bad_datagrams += 1,
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.now = self.now.max(now);
        let Some((t, at)) = self.passed.take() else {
            return;
        };
        if at > self.now {
            self.passed = Some((t, at));
            return;
        }
        self.stats.token_retransmissions += 1;
        self.pass(t);
    }

    fn multicast(&mut self, _now: Instant, payload: Bytes) -> Result<u64, SendError> {
        if payload.len() > self.config.max_payload {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max: self.config.max_payload,
            });
        }
        if self.queue.len() >= self.config.send_queue_max {
            return Err(SendError::WindowFull);
        }
        self.queue.push_back(payload);
        self.next_local_id += 1;
        Ok(self.next_local_id)
    }

    fn poll_transmit(&mut self, _now: Instant) -> Option<Transmit> {
        self.out.pop_front()
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.passed.as_ref().map(|(_, at)| *at)
    }
}
