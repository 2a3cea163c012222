//! One ring's messages as a member holds them: the store by sequence
//! number, the member's aru, what it has delivered, what it knows to be
//! safe, and the token visit (Totem's rules for the token's `aru`, `rtr`
//! and `fcc`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use shoal_wire::ring::{Data, Recovered, RingId, RingPacket, Token, NO_MEMBER};

use super::{Config, Event, Service, Stats};
use crate::{Destination, NodeId, Transmit};

/// How far past this member's aru a sequence number may be: a member
/// that far behind has lost the ring, and a number beyond it is refused as
/// forged, which keeps arithmetic and the held map bounded.
pub(super) const MAX_AHEAD: u64 = 1 << 32;

/// Retransmission requests one member adds to a token, at most.
const RTR_MAX: usize = 1000;

/// A message held by a member.
#[derive(Debug, Clone)]
pub(super) struct Msg {
    pub sender: NodeId,
    pub service: Service,
    pub payload: Bytes,
    /// On a recovery message: the old ring's message it carries. Its
    /// place in this ring's order is a placeholder, never delivered.
    pub recovered: Option<Recovered>,
}

/// A message waiting for the token.
#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    pub service: Service,
    pub payload: Bytes,
    pub recovered: Option<Recovered>,
}

/// How far a delivery pass may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// In the ring's regular configuration: in order, stopping at the
    /// first gap and at a safe message not yet known to be safe.
    Regular,
    /// In the transitional configuration at the ring's end: everything
    /// held, in order, skipping the gaps no survivor could fill.
    Transitional,
}

/// One ring, as this member sees it.
#[derive(Debug)]
pub(super) struct Log {
    pub id: RingId,
    /// In ring order (ascending id); the first is the representative.
    pub members: Vec<NodeId>,
    index: usize,
    pub held: BTreeMap<u64, Msg>,
    /// Every message up to this one is held or delivered.
    pub my_aru: u64,
    /// The highest sequence number held.
    pub high: u64,
    /// Delivered (or skipped) up to here.
    pub delivered: u64,
    /// Every member is known to hold every message up to here.
    pub safe_upto: u64,
    pub last_token_seq: u64,
    visits: u64,
    /// The token as this member last passed it.
    pub passed_seq: u64,
    pub passed_aru: u64,
    pub passed_retrans_none: bool,
    sent_last_visit: u32,
}

impl Log {
    /// `members` sorted, without repeats, containing `me`.
    pub fn new(id: RingId, members: Vec<NodeId>, me: NodeId) -> Log {
        let index = members.binary_search(&me).expect("a member of its ring");
        Log {
            id,
            members,
            index,
            held: BTreeMap::new(),
            my_aru: 0,
            high: 0,
            delivered: 0,
            safe_upto: 0,
            last_token_seq: 0,
            visits: 0,
            passed_seq: 0,
            passed_aru: 0,
            passed_retrans_none: true,
            sent_last_visit: 0,
        }
    }

    pub fn successor(&self) -> NodeId {
        self.members[(self.index + 1) % self.members.len()]
    }

    pub fn is_rep(&self) -> bool {
        self.index == 0
    }

    pub fn visits(&self) -> u64 {
        self.visits
    }

    /// Holds a message; false when it was held or delivered already.
    pub fn insert(&mut self, seq: u64, msg: Msg) -> bool {
        if seq <= self.delivered || self.held.contains_key(&seq) {
            return false;
        }
        self.held.insert(seq, msg);
        self.high = self.high.max(seq);
        while self.held.contains_key(&(self.my_aru + 1)) {
            self.my_aru += 1;
        }
        true
    }

    /// Whether a sequence number is so far ahead it can only be forged.
    pub fn too_far(&self, seq: u64) -> bool {
        seq > self.my_aru.saturating_add(MAX_AHEAD)
    }

    /// The token visit: retransmit what others asked for, ask for what
    /// this member lacks, multicast from `queue` within the flow-control
    /// budget, update `aru` and `fcc`, learn what is safe, forget what
    /// every member holds and has delivered. The caller passes the token.
    pub fn visit(
        &mut self,
        config: &Config,
        me: NodeId,
        t: &mut Token,
        queue: &mut VecDeque<Outgoing>,
        out: &mut VecDeque<Transmit>,
        stats: &mut Stats,
    ) {
        stats.tokens += 1;
        self.last_token_seq = t.token_seq;
        let received_aru = t.aru;
        let retransmitted = self.answer_requests(config, t, out, stats);
        self.request_missing(t);
        let budget = config
            .max_messages
            .saturating_sub(retransmitted)
            .min(config.window_size.saturating_sub(t.fcc));
        let mut sent = 0;
        while sent < budget {
            let Some(o) = queue.pop_front() else {
                break;
            };
            t.seq += 1;
            let msg = Msg {
                sender: me,
                service: o.service,
                payload: o.payload,
                recovered: o.recovered,
            };
            out.push_back(self.data_transmit(t.seq, &msg));
            stats.multicasts += 1;
            self.insert(t.seq, msg);
            sent += 1;
        }
        if self.visits > 0 {
            // Between this member's last pass and this receipt, no member
            // held the token's aru below min(both): every member holds it.
            let safe = self.passed_aru.min(received_aru).min(self.my_aru);
            self.safe_upto = self.safe_upto.max(safe);
        }
        if self.members.len() == 1 {
            self.safe_upto = self.my_aru;
        }
        self.update_aru(me, t);
        t.fcc = (t.fcc + sent + retransmitted).saturating_sub(self.sent_last_visit);
        self.sent_last_visit = sent + retransmitted;
        self.collect_garbage();
        self.visits += 1;
        self.passed_seq = t.seq;
        self.passed_aru = t.aru;
        t.token_seq += 1;
    }

    /// Retransmits what the token asks for and this member holds; returns
    /// how many. Requests for messages every member is known to hold are
    /// dropped (someone asked, then got it another way).
    fn answer_requests(
        &mut self,
        config: &Config,
        t: &mut Token,
        out: &mut VecDeque<Transmit>,
        stats: &mut Stats,
    ) -> u32 {
        let mut count = 0;
        let mut still = Vec::new();
        for &seq in &t.rtr {
            if seq <= self.safe_upto {
                continue;
            }
            match self.held.get(&seq) {
                Some(msg) if count < config.max_messages => {
                    out.push_back(self.data_transmit(seq, msg));
                    stats.retransmissions += 1;
                    count += 1;
                }
                _ => still.push(seq),
            }
        }
        t.rtr = still;
        count
    }

    fn request_missing(&self, t: &mut Token) {
        let asked: BTreeSet<u64> = t.rtr.iter().copied().collect();
        let mut added = 0;
        for seq in self.my_aru + 1..=t.seq {
            if added >= RTR_MAX {
                break;
            }
            if !self.held.contains_key(&seq) && seq > self.delivered && !asked.contains(&seq) {
                t.rtr.push(seq);
                added += 1;
            }
        }
    }

    /// Totem's aru rule: lower it to mine, or raise it if I held it down.
    fn update_aru(&self, me: NodeId, t: &mut Token) {
        if self.my_aru < t.aru || t.aru_id == me.0 || t.aru_id == NO_MEMBER {
            t.aru = self.my_aru;
            t.aru_id = if self.my_aru >= t.seq {
                NO_MEMBER
            } else {
                me.0
            };
        }
    }

    /// Forgets messages every member holds and this one has delivered.
    fn collect_garbage(&mut self) {
        let stable = self.safe_upto.min(self.delivered);
        if self
            .held
            .first_key_value()
            .is_some_and(|(s, _)| *s <= stable)
        {
            self.held = self.held.split_off(&(stable + 1));
        }
    }

    pub fn data_transmit(&self, seq: u64, msg: &Msg) -> Transmit {
        let bytes = RingPacket::Data(Data {
            ring_id: self.id,
            seq,
            sender: msg.sender.0,
            safe: msg.service == Service::Safe,
            recovered: msg.recovered,
            payload: &msg.payload,
        })
        .encode();
        Transmit {
            destination: Destination::Multicast,
            payload: Bytes::from(bytes),
        }
    }

    /// Delivers what `mode` allows; returns the gaps skipped.
    pub fn deliver(&mut self, mode: Mode, events: &mut VecDeque<Event>) -> u64 {
        let mut holes = 0;
        loop {
            let next = self.delivered + 1;
            match self.held.get(&next) {
                Some(m) if m.recovered.is_some() => {}
                Some(m) => {
                    if mode == Mode::Regular && m.service == Service::Safe && next > self.safe_upto
                    {
                        break;
                    }
                    events.push_back(Event::Deliver {
                        ring_id: self.id,
                        seq: next,
                        sender: m.sender,
                        service: m.service,
                        transitional: mode == Mode::Transitional,
                        payload: m.payload.clone(),
                    });
                }
                None if mode == Mode::Transitional && next <= self.high => holes += 1,
                None => break,
            }
            self.delivered = next;
        }
        holes
    }
}
