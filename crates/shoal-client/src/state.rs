//! State transfer to joiners (as JGroups' `getState`/`setState`), an
//! application-level protocol on top of the `agreed` total order. It needs
//! nothing from the daemon beyond what every client has: joins, views and
//! messages of a group are delivered to every member in one order.
//!
//! A member keeps some state (a [`Replica`]) that it changes only by
//! applying the group's messages, sent with [`Service::Agreed`] (or
//! `Safe`), in the order they are delivered. A joiner:
//!
//! 1. joins the group. If the first view that lists it lists nobody else,
//!    it starts from the empty state (it founded the group);
//! 2. otherwise it multicasts a *state request* to the group (agreed). The
//!    point where that request falls in the total order is the *state
//!    point*: the joiner drops the group's messages ordered before it (the
//!    state will contain them) and holds back those ordered after it;
//! 3. exactly one member (see below) takes a snapshot when the request is
//!    delivered to it, that is, after applying every message ordered
//!    before the state point and none after, and sends it to the joiner's
//!    private group;
//! 4. the joiner restores the snapshot, then applies the held-back
//!    messages and views in order, and from then on is a member like the
//!    others: it announces that it holds the state (a *ready* message) and
//!    may itself answer later requests.
//!
//! Who answers: each member tracks the members that hold the state (the
//! *ready* set: members that announced it, as ordered, plus itself from the
//! moment it has the state; the snapshot carries the provider's set). The
//! member of the ready set that sorts first among the current members
//! answers. Members agree on that set except for a member's own
//! announcement still in flight, so a request may get two answers, never
//! none while a member holding the state stays; the joiner takes the answer
//! to its current request and ignores any other.
//!
//! If the provider leaves or fails before its answer arrives, the joiner
//! sees a view without some member while it waits and asks again: the new
//! request is a new state point, and what was held back before it is
//! dropped (the new snapshot contains it). [`StateTransfer::retry`] asks
//! again by hand (a driver calls it when an answer takes too long, as when
//! every member holding the state left). Joiners that join at once each
//! get their own answer; a joiner never answers before it holds the state.
//!
//! Reserved: the group's messages with a message type from
//! [`RESERVED_TYPES`] up are this protocol's; applications use lower types.
//! The state's messages must be `agreed` or `safe`: other services are not
//! ordered with the state point.
//!
//! [`StateTransfer`] is sans-IO: it is fed every event the client receives
//! ([`StateTransfer::handle`]) and calls the [`Replica`]'s methods; the
//! multicasts it wants sent come out of [`StateTransfer::poll_send`]. The
//! blocking and tokio clients send them with `send_pending`.

use std::collections::{BTreeSet, VecDeque};

use crate::{Membership, Message, Received, SendOptions, Service};

/// Message types from this one up belong to the state-transfer protocol.
pub const RESERVED_TYPES: u16 = 0xFF00;
const REQUEST: u16 = RESERVED_TYPES;
const REPLY: u16 = RESERVED_TYPES + 1;
const READY: u16 = RESERVED_TYPES + 2;

/// What an application replicates.
pub trait Replica {
    /// A message of the group (type below [`RESERVED_TYPES`]), in the
    /// group's order, once the state is here.
    fn apply(&mut self, message: &Message);
    /// A view of the group, in order with the messages. A joiner gets the
    /// view current at its state point right after `restore`.
    fn view(&mut self, _view: &Membership) {}
    /// The whole state, as `restore` will take it.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces the state with a snapshot from another member.
    fn restore(&mut self, snapshot: &[u8]);
}

/// A multicast [`StateTransfer`] wants sent (always `agreed`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub groups: Vec<String>,
    pub mess_type: u16,
    pub payload: Vec<u8>,
}

impl Outgoing {
    /// The options to send it with.
    pub fn options(&self) -> SendOptions {
        SendOptions {
            self_discard: false,
            mess_type: self.mess_type,
        }
    }

    /// Its service: the total order.
    pub const SERVICE: Service = Service::Agreed;
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Joined; waiting for the first view that lists this member.
    Joining,
    /// Asked with `nonce`; `seen` once the request came back (the state
    /// point).
    Waiting { nonce: u64, seen: bool },
    /// Holds the state.
    Ready,
}

/// One member's side of state transfer for one group.
#[derive(Debug)]
pub struct StateTransfer {
    group: String,
    me: String,
    phase: Phase,
    next_nonce: u64,
    members: Vec<String>,
    ready: BTreeSet<String>,
    /// Events after the state point, while waiting for the snapshot.
    held: VecDeque<Received>,
    /// The latest view before the state point.
    last_view: Option<Membership>,
    out: VecDeque<Outgoing>,
    /// Snapshots this member sent (for tests and status).
    provided: u64,
}

impl StateTransfer {
    /// For `group`, for the client whose private group is `me`. Join the
    /// group after (or before: nothing happens until a view lists `me`).
    pub fn new(group: &str, me: &str) -> StateTransfer {
        StateTransfer {
            group: group.to_owned(),
            me: me.to_owned(),
            phase: Phase::Joining,
            next_nonce: 1,
            members: Vec::new(),
            ready: BTreeSet::new(),
            held: VecDeque::new(),
            last_view: None,
            out: VecDeque::new(),
            provided: 0,
        }
    }

    /// Whether this member holds the state (restored, or founded).
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// Snapshots this member has sent to joiners.
    pub fn provided(&self) -> u64 {
        self.provided
    }

    /// The group's members as of the last view handled.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// The next multicast to send.
    #[must_use]
    pub fn poll_send(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// Asks again for the state, if still waiting: a new state point.
    pub fn retry(&mut self) {
        if matches!(self.phase, Phase::Waiting { .. }) {
            self.request();
        }
    }

    /// An event the client received. Events of this protocol and of the
    /// group are consumed (the replica is called as they say); any other
    /// event is given back.
    pub fn handle<R: Replica>(&mut self, replica: &mut R, event: Received) -> Option<Received> {
        match &event {
            Received::Membership(v) if v.group == self.group => {
                self.on_view(replica, event);
                None
            }
            Received::Message(m) if m.mess_type == REPLY && m.groups == [self.me.as_str()] => {
                if let Received::Message(m) = event {
                    self.on_reply(replica, m);
                }
                None
            }
            Received::Message(m) if m.groups.contains(&self.group) => {
                self.on_message(replica, event);
                None
            }
            _ => Some(event),
        }
    }

    fn on_view<R: Replica>(&mut self, replica: &mut R, event: Received) {
        let Received::Membership(view) = &event else {
            return;
        };
        let lost = self.members.iter().any(|m| !view.members.contains(m));
        self.members.clone_from(&view.members);
        self.ready.retain(|r| view.members.contains(r));
        match self.phase {
            Phase::Joining => {
                if !view.members.contains(&self.me) {
                    return;
                }
                if view.members == [self.me.clone()] {
                    // Nobody else: no state exists; this member founds it.
                    self.become_ready();
                    replica.view(view);
                } else {
                    self.last_view = Some(view.clone());
                    self.request();
                }
            }
            Phase::Waiting { seen, .. } => {
                if lost {
                    // The provider may be gone: ask again (a new point).
                    self.last_view = Some(view.clone());
                    self.request();
                } else if seen {
                    self.held.push_back(event);
                } else {
                    self.last_view = Some(view.clone());
                }
            }
            Phase::Ready => replica.view(view),
        }
    }

    fn on_message<R: Replica>(&mut self, replica: &mut R, event: Received) {
        let Received::Message(m) = &event else {
            return;
        };
        match self.phase {
            Phase::Joining => {}
            Phase::Waiting { nonce, seen } => {
                if m.mess_type == REQUEST
                    && m.sender == self.me
                    && nonce_of(&m.payload) == Some(nonce)
                {
                    // The state point: what came before is in the state.
                    self.held.clear();
                    self.phase = Phase::Waiting { nonce, seen: true };
                } else if m.mess_type == READY {
                    self.ready.insert(m.sender.clone());
                    if seen {
                        self.held.push_back(event);
                    }
                } else if seen {
                    self.held.push_back(event);
                }
            }
            Phase::Ready => self.on_message_ready(replica, m),
        }
    }

    fn on_message_ready<R: Replica>(&mut self, replica: &mut R, m: &Message) {
        match m.mess_type {
            REQUEST => {
                if m.sender != self.me && self.provider() == Some(&self.me) {
                    if let Some(nonce) = nonce_of(&m.payload) {
                        let snapshot = replica.snapshot();
                        self.reply(&m.sender, nonce, &snapshot);
                    }
                }
            }
            READY => {
                self.ready.insert(m.sender.clone());
            }
            t if t >= RESERVED_TYPES => {}
            _ => replica.apply(m),
        }
    }

    /// The member that answers requests now: the first of the ready set
    /// among the current members.
    fn provider(&self) -> Option<&String> {
        self.ready.iter().find(|r| self.members.contains(r))
    }

    fn on_reply<R: Replica>(&mut self, replica: &mut R, m: Message) {
        let Phase::Waiting { nonce, seen: true } = self.phase else {
            return;
        };
        let Some(reply) = Reply::decode(&m.payload) else {
            return;
        };
        if reply.group != self.group || reply.nonce != nonce {
            return;
        }
        replica.restore(reply.snapshot);
        self.ready
            .extend(reply.ready.into_iter().map(str::to_owned));
        let held = std::mem::take(&mut self.held);
        self.become_ready();
        if let Some(view) = self.last_view.take() {
            replica.view(&view);
        }
        // The held-back events, as a member holding the state takes them
        // (a request among them may be this member's to answer).
        for event in held {
            match event {
                Received::Membership(v) => {
                    self.members.clone_from(&v.members);
                    self.ready.retain(|r| v.members.contains(r));
                    replica.view(&v);
                }
                Received::Message(m) => self.on_message_ready(replica, &m),
            }
        }
    }

    fn become_ready(&mut self) {
        self.phase = Phase::Ready;
        self.ready.insert(self.me.clone());
        self.held.clear();
        self.out.push_back(Outgoing {
            groups: vec![self.group.clone()],
            mess_type: READY,
            payload: Vec::new(),
        });
    }

    fn request(&mut self) {
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        self.phase = Phase::Waiting { nonce, seen: false };
        self.held.clear();
        self.out.push_back(Outgoing {
            groups: vec![self.group.clone()],
            mess_type: REQUEST,
            payload: nonce.to_be_bytes().to_vec(),
        });
    }

    fn reply(&mut self, to: &str, nonce: u64, snapshot: &[u8]) {
        let ready: Vec<&str> = self.ready.iter().map(String::as_str).collect();
        let reply = Reply {
            group: &self.group,
            nonce,
            ready,
            snapshot,
        };
        self.provided += 1;
        let payload = reply.encode();
        self.out.push_back(Outgoing {
            groups: vec![to.to_owned()],
            mess_type: REPLY,
            payload,
        });
    }
}

fn nonce_of(payload: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(*payload.first_chunk::<8>()?)).filter(|_| payload.len() == 8)
}

/// A snapshot on its way: group, nonce, the provider's ready set, state.
struct Reply<'a> {
    group: &'a str,
    nonce: u64,
    ready: Vec<&'a str>,
    snapshot: &'a [u8],
}

impl<'a> Reply<'a> {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.snapshot.len() + 64);
        let string = |out: &mut Vec<u8>, s: &str| {
            out.extend_from_slice(&(s.len() as u16).to_be_bytes());
            out.extend_from_slice(s.as_bytes());
        };
        string(&mut out, self.group);
        out.extend_from_slice(&self.nonce.to_be_bytes());
        out.extend_from_slice(&(self.ready.len() as u16).to_be_bytes());
        for r in &self.ready {
            string(&mut out, r);
        }
        out.extend_from_slice(self.snapshot);
        out
    }

    fn decode(mut b: &'a [u8]) -> Option<Reply<'a>> {
        fn take<'b>(b: &mut &'b [u8], n: usize) -> Option<&'b [u8]> {
            let (head, tail) = (b.get(..n)?, b.get(n..)?);
            *b = tail;
            Some(head)
        }
        fn string<'b>(b: &mut &'b [u8]) -> Option<&'b str> {
            let len = u16::from_be_bytes(take(b, 2)?.try_into().ok()?);
            std::str::from_utf8(take(b, usize::from(len))?).ok()
        }
        let group = string(&mut b)?;
        let nonce = u64::from_be_bytes(take(&mut b, 8)?.try_into().ok()?);
        let count = u16::from_be_bytes(take(&mut b, 2)?.try_into().ok()?);
        let ready = (0..count).map(|_| string(&mut b)).collect::<Option<_>>()?;
        Some(Reply {
            group,
            nonce,
            ready,
            snapshot: b,
        })
    }
}

impl crate::Client {
    /// Sends what `state` wants sent (blocking).
    pub fn send_pending(&mut self, state: &mut StateTransfer) -> Result<(), crate::ClientError> {
        while let Some(o) = state.poll_send() {
            self.multicast_with(Outgoing::SERVICE, &o.groups, &o.payload, o.options())?;
        }
        Ok(())
    }
}

#[cfg(feature = "tokio")]
impl crate::tokio::Client {
    /// Sends what `state` wants sent.
    pub async fn send_pending(
        &mut self,
        state: &mut StateTransfer,
    ) -> Result<(), crate::ClientError> {
        while let Some(o) = state.poll_send() {
            self.multicast_with(Outgoing::SERVICE, &o.groups, &o.payload, o.options())
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
