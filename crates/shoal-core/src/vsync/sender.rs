//! The sending side (P000 Fig 7): Gseq Req to the committee, then pbcast
//! dissemination once the Gseq ack names the message's global sequence
//! number. Also the joiner's and leaver's requests, retried until answered.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use shoal_wire::vsync::{Carried, Entry, Message};

use super::{Record, Status, Vsync};
use crate::engine::{Engine, NodeId};
use crate::time::Instant;

pub(super) struct SenderState {
    pub next_local: u64,
    /// Messages waiting for their Gseq ack, by local id (bounded by
    /// `gseq_window`).
    pub awaiting: BTreeMap<u64, Awaiting>,
    /// This member's messages sequenced and not yet delivered back: local id
    /// to global sequence number (pruned two views after).
    pub sequenced: BTreeMap<u64, u64>,
    /// Which committee member Gseq Reqs go to (an index that rotates on
    /// repeated silence).
    target: usize,
    /// Sequenced messages pbcast refused for now (its flow control).
    disseminate: VecDeque<Bytes>,
    pub leaving: bool,
    pub leave_next_try: Instant,
    join_next_try: Instant,
}

pub(super) struct Awaiting {
    payload: Bytes,
    next_try: Instant,
    tries: u32,
}

/// The local id of member `me`'s first multicast: its node id in the high
/// half, so that no two members' ids meet (one would have to send 2^32
/// multicasts first). Datagrams to a member are routed by its daemon's
/// slot, so a Gseq Ack the committee sends to an earlier incarnation of the
/// slot (a request of its previous life, sequenced late) reaches the
/// incarnation running now. With ids counted from 0 in every incarnation
/// the ack named one of the new incarnation's own multicasts, which took
/// the other's gseq for its own and disseminated its payload under it;
/// members then disagreed on what that gseq carried, and the committee
/// sequenced the message again when its own request came (the swarm's
/// `duplicate` seeds 3608 and 5773). A Gseq Ack names no member, only a
/// local id: distinct ids make one meant for another member name nothing.
pub fn first_local_id(me: NodeId) -> u64 {
    u64::from(me.0) << 32
}

impl SenderState {
    pub fn new(me: NodeId, now: Instant) -> SenderState {
        SenderState {
            next_local: first_local_id(me),
            awaiting: BTreeMap::new(),
            sequenced: BTreeMap::new(),
            target: 0,
            disseminate: VecDeque::new(),
            leaving: false,
            leave_next_try: now,
            join_next_try: now,
        }
    }
}

impl Vsync {
    /// Accepts a multicast (the caller checked the window).
    pub(super) fn originate(&mut self, now: Instant, payload: Bytes) -> u64 {
        let id = self.sender.next_local;
        self.sender.next_local += 1;
        self.sender.awaiting.insert(
            id,
            Awaiting {
                payload,
                next_try: now,
                tries: 0,
            },
        );
        self.send_gseq_reqs(now);
        id
    }

    /// The committee member Gseq Reqs go to now.
    fn gseq_target(&self) -> Option<NodeId> {
        if let Some(c) = &self.committee {
            return Some(c.primary());
        }
        let committee = &self.view.committee;
        (!committee.is_empty()).then(|| committee[self.sender.target % committee.len()])
    }

    /// Sends every Gseq Req whose retry time came, in local-id order (the
    /// committee sequences each sender's messages in that order).
    fn send_gseq_reqs(&mut self, now: Instant) {
        let Some(target) = self.gseq_target() else {
            return;
        };
        let mut rotate = false;
        let mut due = Vec::new();
        for (id, a) in self.sender.awaiting.iter_mut() {
            if a.next_try <= now {
                a.next_try = now + self.config.gseq_retry;
                a.tries += 1;
                rotate |= a.tries % 2 == 0;
                due.push((*id, a.payload.clone()));
            }
        }
        if rotate {
            self.sender.target = self.sender.target.wrapping_add(1);
        }
        let me = self.me;
        // Everything below the lowest local id still awaited was sequenced.
        let oldest = self.sender.awaiting.keys().next().copied().unwrap_or(0);
        if target == me {
            for (local_id, payload) in due {
                self.on_gseq_req(now, me, me, (local_id, oldest), &payload);
            }
            return;
        }
        let messages: Vec<Message<'_>> = due
            .iter()
            .map(|(local_id, payload)| Message::GseqReq {
                sender: me.0,
                local_id: *local_id,
                oldest,
                payload,
            })
            .collect();
        self.send_all(target, &messages);
    }

    /// The committee sequenced one of our messages: disseminate it.
    pub(super) fn on_gseq_ack(&mut self, now: Instant, local_id: u64, gseq: u64, view: u64) {
        let Some(a) = self.sender.awaiting.remove(&local_id) else {
            return;
        };
        self.sender.sequenced.insert(local_id, gseq);
        if !self.view_on_committee(view) {
            let entry = Entry::Data {
                sender: self.me.0,
                local_id,
                payload: &a.payload,
            };
            if let Ok(bytes) = (Carried::Sequenced { gseq, entry }).to_vec() {
                self.sender.disseminate.push_back(Bytes::from(bytes));
            }
            self.retry_dissemination(now);
        }
        let record = Record::Data {
            sender: self.me,
            local_id,
            payload: a.payload,
        };
        self.on_entry(now, gseq, record);
    }

    /// Every member of `view` (the view the message is delivered in) is on
    /// the committee, so each holds the message in its store and delivers it
    /// from there (`Config::committee_delivery`): no pbcast needed. A view
    /// this member has not installed yet is not known to be so.
    fn view_on_committee(&self, view: u64) -> bool {
        self.config.committee_delivery
            && view == self.view.id
            && self
                .view
                .members
                .iter()
                .all(|m| self.view.committee.contains(m))
    }

    pub(super) fn retry_dissemination(&mut self, now: Instant) {
        while let Some(bytes) = self.sender.disseminate.front() {
            let Some(pb) = self.pbcast.as_mut() else {
                self.sender.disseminate.clear();
                return;
            };
            // A clone of `Bytes` shares the buffer: the encoded record is
            // not copied again on its way into pbcast.
            if pb.multicast(now, bytes.clone()).is_err() {
                return;
            }
            self.sender.disseminate.pop_front();
        }
    }

    pub(super) fn sender_deadline(&self) -> Option<Instant> {
        let s = &self.sender;
        match self.status {
            Status::Joining => Some(s.join_next_try),
            Status::Removed => None,
            Status::Member => {
                let leave = s.leaving.then_some(s.leave_next_try);
                let gseq = s.awaiting.values().map(|a| a.next_try).min();
                leave.into_iter().chain(gseq).min()
            }
        }
    }

    pub(super) fn on_sender_timers(&mut self, now: Instant) {
        match self.status {
            Status::Joining if self.sender.join_next_try <= now => self.send_join(now),
            Status::Member => {
                self.send_gseq_reqs(now);
                if self.sender.leaving && self.sender.leave_next_try <= now {
                    self.sender.leave_next_try = now + self.config.join_retry;
                    let to = self.gseq_target();
                    let me = self.me;
                    match to {
                        Some(to) if to != me => self.send(to, &Message::Leave { member: me.0 }),
                        _ => self.on_leave(now, me, me),
                    }
                }
            }
            _ => {}
        }
    }

    /// Joiners ask each contact in turn.
    fn send_join(&mut self, now: Instant) {
        self.sender.join_next_try = now + self.config.join_retry;
        let Some(to) = self.gseq_target() else {
            return;
        };
        self.sender.target = self.sender.target.wrapping_add(1);
        self.send(to, &Message::Join { joiner: self.me.0 });
    }
}
