//! The Ring protocol inside a site (P-Spread §3: "based on the same ideas
//! as Totem"; the rules are Totem's single-ring ordering and membership
//! protocol, Amir, Moser, Melliar-Smith, Agarwal, Ciarfella, TOCS 1995).
//!
//! **Ordering.** The daemons of one LAN form a logical ring; a token
//! circulates, unicast from each member to the next, and only its holder
//! multicasts (IP multicast), stamping each message with the next
//! ring-wide sequence number. The token carries `ring_id`, `token_seq`
//! (bumped at every pass, so a stale or duplicate token is ignored), `seq`
//! (the highest sequence number assigned), `aru` and `aru_id` (all
//! received up to, and who holds it down), `fcc` (messages multicast in the
//! last rotation) and `rtr` (retransmission requests). On the token a
//! member retransmits what others asked for and it holds, adds what it
//! lacks to `rtr`, multicasts at most `max_messages` new messages (fewer if
//! the rotation's total would pass `window_size`), updates `aru` and
//! `fcc`, and passes the token on. It resends a token it passed every
//! `token_retransmit` until it sees the ring move on.
//!
//! **Delivery.** Agreed messages are delivered in sequence order as soon as
//! every earlier one is held. A safe message waits until this member
//! knows every member holds it: the aru it passed at its last visit and
//! the aru it receives now are both at or above the message (no member
//! held the aru below it for a whole rotation). Later messages wait behind
//! it, so agreed and safe share one total order.
//!
//! **Membership** (`membership.rs`). A member that misses the token for
//! `token_timeout`, or hears a join or a member of another ring, enters
//! *gather*: it multicasts joins naming the members it hears (`procs`) and
//! those it gave up on (`fails`), merging the sets of the joins it
//! receives, until every member of `procs − fails` sent it a join with the
//! same sets (consensus); a member silent for `consensus_timeout` is
//! failed. The lowest member of the consensus then sends the *commit
//! token* around the new ring, with a new ring id: on its first rotation
//! every member records its old ring, its aru there and the highest
//! message it holds of it; on the second every member learns all of it
//! and enters *recovery*. In recovery the new ring's token circulates, and
//! members resend, as new-ring messages that carry the old message, every
//! old-ring message above the lowest aru of their old ring's survivors, so
//! each survivor of an old ring ends with every message any of them held.
//! Nothing new is ordered until the representative sees, on two successive
//! visits, no message sent in between, no member with messages left to
//! resend and the aru at the top: it marks the token *installed*, and each
//! member, on the installed token, delivers its old ring's remaining
//! messages (those it can in the old regular configuration, then a
//! *transitional configuration* of the old ring's survivors, then the rest,
//! skipping only messages no survivor held) and installs the new regular
//! configuration. A member whose recovery fails (the token is lost again)
//! keeps its old ring and what it recovered, and gathers again. The
//! representative multicasts a merge-detect message every `merge_timeout`,
//! so rings that can hear each other again merge.
//!
//! **The idle ring** (Corosync's token hold, not in Totem's paper): when
//! the token's `seq` has not moved for `idle_rotations` visits and nothing
//! is owed (aru at the top, no retransmission request, nothing queued),
//! the representative keeps the token for `token_hold` before passing it
//! on, so an idle ring makes a few rotations a second instead of tens of
//! thousands; the other members then resend a token they passed only
//! after `token_hold` more. A member that has something to send on an
//! idle ring multicasts a *hold cancel*, and the representative passes
//! the token on at once (its own message passes it on too).
//!
//! What is not Totem's: a message is garbage collected once it is safe and
//! delivered here; a ring of one member orders its messages at once.

mod log;
mod membership;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
pub use shoal_wire::ring::RingId;
use shoal_wire::ring::{decode, Data, RingPacket, Token, NO_MEMBER, TOKEN_INSTALLED};

use crate::engine::SendError;
use crate::{Destination, Engine, Instant, NodeId, Transmit};
use log::{Log, Mode, Msg, Outgoing};
use membership::{Forming, Gather};

/// Settings of a ring member. The membership timings are Corosync's
/// `totemsrp` defaults (`token`, `join`, `consensus`, `merge`), which
/// Totem's paper leaves to the deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Messages multicast in one rotation of the token, at most (Totem's
    /// window). Ours 256 (Corosync's default 50, Spread's `Window` 160):
    /// four members' full visits, about 400 KB of datagrams per
    /// rotation, a tenth of the runtime's 4 MiB receive buffer.
    pub window_size: u32,
    /// Messages one member multicasts per token visit, at most. Ours 64
    /// (Corosync's default 17, Spread's `PersonalWindow` 20): a visit's
    /// messages to each peer fill one segmented send of the runtime (at
    /// most 64 datagrams). The token's rotation, not the CPU, bounded a
    /// single sender at 17: on three daemons of one host it gave about
    /// 45,000 msgs/s, 64 about 70,000 (`docs/spread.md`, "Side by side
    /// with Spread, through clients"). A `window_size` of at least twice
    /// this gives a lone sender its full visit at every rotation (the
    /// token's `fcc` still counts its previous visit).
    pub max_messages: u32,
    /// How often a member resends the token (or commit token) it passed
    /// while it sees no sign the ring moved on. Corosync derives 238 ms
    /// from its 1 s token timeout; ours is 20 ms, so a token lost on a
    /// LAN costs a few ms of a round instead of a quarter second, well
    /// before `token_timeout` declares the ring broken. Must be below
    /// `token_timeout`.
    #[serde(with = "crate::serde_ms")]
    pub token_retransmit: Duration,
    /// No token for this long: the ring is broken, gather (Totem's token
    /// loss timeout; Corosync's `token`, 1000 ms).
    #[serde(with = "crate::serde_ms")]
    pub token_timeout: Duration,
    /// How often a gathering member multicasts its join again (Corosync's
    /// `join`, 50 ms).
    #[serde(with = "crate::serde_ms")]
    pub join_timeout: Duration,
    /// How long a gathering member waits for the others' agreement before
    /// failing those it has not heard agree (Corosync's `consensus`,
    /// 1.2 × token, 1200 ms).
    #[serde(with = "crate::serde_ms")]
    pub consensus_timeout: Duration,
    /// How often the representative announces its ring so separated rings
    /// that can hear each other merge (Corosync's `merge`, 200 ms).
    #[serde(with = "crate::serde_ms")]
    pub merge_timeout: Duration,
    /// Token visits with the ring's `seq` unchanged (and nothing owed)
    /// after which the ring counts as idle and its representative holds
    /// the token (Corosync's `seqno_unchanged_const`, 30). 0: never hold
    /// (the token circulates continuously).
    pub idle_rotations: u32,
    /// How long the representative of an idle ring keeps the token
    /// before passing it on (Corosync's `hold`, 180 ms). Must be below
    /// `token_timeout` (the others would take a held token for lost). A
    /// member with something to send on an idle ring cancels the hold at
    /// once, so it adds no latency to a message; an idle ring rotates
    /// about once per `token_hold`, and a lost token of an idle ring is
    /// resent after `token_hold + token_retransmit`.
    #[serde(with = "crate::serde_ms")]
    pub token_hold: Duration,
    /// Token visits in a row at which this member held the token's aru
    /// down without raising it (it received none of the messages it
    /// lacks for that many rotations), after which it declares that it
    /// fails to receive and leaves the ring for a ring of its own, so the
    /// others' safe delivery and garbage collection go on (Totem's and
    /// Corosync's `fail_recv_const`, 2500). 0: never.
    pub fail_to_recv_const: u32,
    /// Messages waiting for the token, at most.
    pub send_queue_max: usize,
    /// Largest message payload.
    pub max_payload: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            window_size: 256,
            max_messages: 64,
            token_retransmit: Duration::from_millis(20),
            token_timeout: Duration::from_millis(1000),
            join_timeout: Duration::from_millis(50),
            consensus_timeout: Duration::from_millis(1200),
            merge_timeout: Duration::from_millis(200),
            idle_rotations: 30,
            token_hold: Duration::from_millis(180),
            fail_to_recv_const: 2500,
            send_queue_max: 10_000,
            max_payload: 1400,
        }
    }
}

/// The delivery guarantee of a message (Spread's AGREED and SAFE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Service {
    /// Total order, delivered once every earlier message is held.
    Agreed,
    /// Total order, delivered once every member of the configuration is
    /// known to hold it (or, at a ring change, in the transitional
    /// configuration: every survivor holds it).
    Safe,
}

/// What a member tells its application, in the order it happens
/// (extended virtual synchrony: every message is delivered within a
/// configuration, and a ring's end is announced by a transitional
/// configuration before its last messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message of ring `ring_id`, in that ring's order (`seq`).
    Deliver {
        ring_id: RingId,
        seq: u64,
        sender: NodeId,
        service: Service,
        /// Delivered in the transitional configuration: every member of it
        /// holds the message, but not necessarily every member of the
        /// ring (a safe message here lacks the regular guarantee).
        transitional: bool,
        payload: Bytes,
    },
    /// Ring `ring_id` ended; `members` are its members that go on together
    /// into the next ring. The ring's remaining messages follow.
    Transitional {
        ring_id: RingId,
        members: Vec<NodeId>,
    },
    /// A ring is installed: its messages follow.
    Regular {
        ring_id: RingId,
        members: Vec<NodeId>,
    },
}

/// Why a ring member could not be created. Nothing was created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("this member is not in the member list")]
    NotAMember,
    #[error("window_size and max_messages must be positive")]
    ZeroWindow,
    #[error("token_retransmit must be positive and below token_timeout")]
    BadTimers,
    #[error("token_hold must be below token_timeout")]
    BadHold,
}

/// Counters of one member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub tokens: u64,
    pub token_retransmissions: u64,
    pub retransmissions: u64,
    pub multicasts: u64,
    pub bad_datagrams: u64,
    /// Times this member entered gather.
    pub gathers: u64,
    /// Rings this member installed after the first.
    pub rings_installed: u64,
    /// Old-ring messages this member resent during recovery.
    pub recovery_messages: u64,
    /// Old-ring messages skipped at a ring change because no survivor held
    /// them.
    pub holes: u64,
    /// Times this member (the representative) held the token of an idle
    /// ring.
    pub holds: u64,
    /// Hold cancels this member multicast.
    pub hold_cancels: u64,
    /// Times this member left its ring because it failed to receive
    /// (`Config::fail_to_recv_const`).
    pub failed_to_receive: u64,
}

/// The membership state (Totem's operational, gather, commit, recovery).
#[derive(Debug)]
enum Phase {
    Operational,
    Gather(Gather),
    Commit(Box<Forming>),
    Recovery(Box<Forming>),
}

/// Timers, one deadline each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// Resend the token or commit token this member passed.
    TokenRetransmit,
    /// The token has not come back: the ring is broken.
    TokenLoss,
    /// Multicast the join again.
    Join,
    /// Fail the members that did not agree.
    Consensus,
    /// The representative announces its ring.
    Merge,
    /// The representative passes on the token it held on an idle ring.
    TokenHold,
}
const TIMERS: usize = 6;

/// A token or commit token passed on, kept to resend.
#[derive(Debug)]
struct Passed {
    to: NodeId,
    bytes: Bytes,
    ring: RingId,
    /// A data message of `ring` above this shows the token moved on.
    seq: u64,
}

/// One member of a site's ring.
#[derive(Debug)]
pub struct Ring {
    config: Config,
    me: NodeId,
    now: Instant,
    /// The ring installed last.
    cur: Log,
    phase: Phase,
    /// The highest ring sequence number seen.
    ring_seq_max: u64,
    /// Rings up to this sequence number were formed and abandoned here.
    abandoned_upto: u64,
    queue: VecDeque<Outgoing>,
    /// A ring of one keeps its own token.
    solo: Option<Token>,
    passed: Option<Passed>,
    /// Visits in a row with the token's `seq` unchanged and nothing owed.
    idle_visits: u32,
    /// The token's `seq` as this member last passed it.
    last_seq: u64,
    /// The token of an idle ring, held by its representative.
    held: Option<Token>,
    /// A hold cancel went out since the ring was last busy.
    cancel_sent: bool,
    /// Visits in a row at which this member held the token's aru down and
    /// had not raised it since its previous visit.
    stuck_visits: u32,
    /// The token's aru as this member last received it.
    received_aru: u64,
    /// This member left its last ring for failing to receive, and has not
    /// been in a ring with others since: it sends no merge detect (the
    /// others' merge detects bring it back once it hears them again).
    failed_to_receive: bool,
    timers: [Option<Instant>; TIMERS],
    out: VecDeque<Transmit>,
    events: VecDeque<Event>,
    next_local_id: u64,
    stats: Stats,
}

impl Ring {
    /// Member `me` of an already agreed ring `members` with id `ring_id`
    /// (ring order is ascending id; the lowest creates the first token),
    /// as a site's configuration would start it. Its first event is the
    /// ring's regular configuration.
    pub fn new(
        config: Config,
        me: NodeId,
        members: &[NodeId],
        ring_id: RingId,
        now: Instant,
    ) -> Result<Ring, RingError> {
        let (members, _) = crate::engine::member_list(me, members).ok_or(RingError::NotAMember)?;
        let mut ring = Ring::blank(config, me, Log::new(ring_id, members, me), now)?;
        if ring.cur.is_rep() {
            ring.on_token(ring.first_token(ring_id, TOKEN_INSTALLED));
        }
        ring.after_install();
        Ok(ring)
    }

    /// Member `me` starting alone: it installs a ring of itself and at
    /// once gathers, so it joins whatever ring it hears.
    pub fn start(config: Config, me: NodeId, now: Instant) -> Result<Ring, RingError> {
        let id = RingId { seq: 0, rep: me.0 };
        let mut ring = Ring::blank(config, me, Log::new(id, vec![me], me), now)?;
        ring.after_install();
        ring.solo = Some(ring.first_token(id, TOKEN_INSTALLED));
        ring.enter_gather([]);
        Ok(ring)
    }

    fn blank(config: Config, me: NodeId, cur: Log, now: Instant) -> Result<Ring, RingError> {
        if config.window_size == 0 || config.max_messages == 0 {
            return Err(RingError::ZeroWindow);
        }
        if config.token_retransmit.is_zero() || config.token_retransmit >= config.token_timeout {
            return Err(RingError::BadTimers);
        }
        if config.token_hold >= config.token_timeout {
            return Err(RingError::BadHold);
        }
        let ring_seq_max = cur.id.seq;
        let members = cur.members.clone();
        let mut events = VecDeque::new();
        events.push_back(Event::Regular {
            ring_id: cur.id,
            members,
        });
        Ok(Ring {
            config,
            me,
            now,
            cur,
            phase: Phase::Operational,
            ring_seq_max,
            abandoned_upto: 0,
            queue: VecDeque::new(),
            solo: None,
            passed: None,
            idle_visits: 0,
            last_seq: 0,
            held: None,
            cancel_sent: false,
            stuck_visits: 0,
            received_aru: 0,
            failed_to_receive: false,
            timers: [None; TIMERS],
            out: VecDeque::new(),
            events,
            next_local_id: 0,
            stats: Stats::default(),
        })
    }

    fn first_token(&self, ring_id: RingId, flags: u8) -> Token {
        Token {
            ring_id,
            token_seq: 1,
            seq: 0,
            aru: 0,
            aru_id: NO_MEMBER,
            fcc: 0,
            retrans_id: NO_MEMBER,
            flags,
            rtr: Vec::new(),
        }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Messages held of the installed ring, for delivery or retransmission.
    pub fn held(&self) -> usize {
        self.cur.held.len()
    }

    /// The installed ring and its members.
    pub fn ring(&self) -> (RingId, &[NodeId]) {
        (self.cur.id, &self.cur.members)
    }

    /// Whether the installed ring is ordering messages (not gathering,
    /// committing or recovering).
    pub fn is_operational(&self) -> bool {
        matches!(self.phase, Phase::Operational)
    }

    /// Messages waiting for the token.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Queues a message with the given service.
    pub fn multicast_service(
        &mut self,
        now: Instant,
        service: Service,
        payload: Bytes,
    ) -> Result<u64, SendError> {
        self.now = self.now.max(now);
        if payload.len() > self.config.max_payload {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max: self.config.max_payload,
            });
        }
        if self.queue.len() >= self.config.send_queue_max {
            return Err(SendError::WindowFull);
        }
        self.queue.push_back(Outgoing {
            service,
            payload,
            recovered: None,
        });
        self.next_local_id += 1;
        if let Some(t) = self.solo.take() {
            self.on_token(t);
        }
        self.wake_idle_ring();
        Ok(self.next_local_id)
    }

    fn set_timer(&mut self, timer: Timer, after: Duration) {
        self.timers[timer as usize] = Some(self.now + after);
    }

    fn clear_timer(&mut self, timer: Timer) {
        self.timers[timer as usize] = None;
    }

    fn multicast_packet(&mut self, packet: &RingPacket<'_>) {
        self.out.push_back(Transmit {
            destination: Destination::Multicast,
            payload: Bytes::from(packet.encode()),
        });
    }

    /// Sends a token or commit token to `to` and keeps it to resend.
    fn pass(&mut self, to: NodeId, packet: &RingPacket<'_>, ring: RingId, seq: u64) {
        let bytes = Bytes::from(packet.encode());
        self.out.push_back(Transmit {
            destination: Destination::Node(to),
            payload: bytes.clone(),
        });
        self.passed = Some(Passed {
            to,
            bytes,
            ring,
            seq,
        });
        self.set_timer(Timer::TokenRetransmit, self.retransmit_interval());
    }

    /// How long a passed token waits before it is resent: on an idle ring
    /// the representative may hold it for `token_hold`.
    fn retransmit_interval(&self) -> Duration {
        if self.idle() {
            self.config.token_hold + self.config.token_retransmit
        } else {
            self.config.token_retransmit
        }
    }

    /// Whether the ring is idle, or will be at the representative's next
    /// visit (it counts one visit more than the members after it).
    fn idle(&self) -> bool {
        self.config.idle_rotations > 0 && self.idle_visits + 1 >= self.config.idle_rotations
    }

    /// Counts a visit of the installed ring's token toward idleness.
    fn note_idle(&mut self, t: &Token) {
        let quiet =
            t.seq == self.last_seq && t.aru == t.seq && t.rtr.is_empty() && self.queue.is_empty();
        if quiet {
            self.idle_visits = self.idle_visits.saturating_add(1);
        } else {
            self.idle_visits = 0;
            self.cancel_sent = false;
        }
        self.last_seq = t.seq;
    }

    /// Counts the installed ring's token visits at which this member holds
    /// the token's aru down and has not raised it since its last visit
    /// (Totem's `fail_to_recv_const` rule; Corosync counts the same way,
    /// and it is the member holding the aru down that acts). True once
    /// there were `fail_to_recv_const` of them in a row.
    fn fails_to_receive(&mut self, t: &Token) -> bool {
        let held_down_by_me = t.aru_id == self.me.0 && t.aru < t.seq;
        if held_down_by_me && t.aru == self.received_aru && self.cur.visits() > 0 {
            self.stuck_visits = self.stuck_visits.saturating_add(1);
        } else {
            self.stuck_visits = 0;
        }
        self.received_aru = t.aru;
        self.config.fail_to_recv_const > 0 && self.stuck_visits >= self.config.fail_to_recv_const
    }

    /// Whether the representative keeps the token it was about to pass.
    fn should_hold(&self) -> bool {
        self.cur.is_rep()
            && self.cur.members.len() > 1
            && self.config.idle_rotations > 0
            && self.idle_visits >= self.config.idle_rotations
    }

    /// A message was queued: if the ring is idle, the token must come.
    fn wake_idle_ring(&mut self) {
        if self.held.is_some() {
            self.release_hold();
        } else if self.is_operational() && self.idle() && !self.cancel_sent {
            self.cancel_sent = true;
            self.stats.hold_cancels += 1;
            let packet = RingPacket::HoldCancel {
                sender: self.me.0,
                ring_id: self.cur.id,
            };
            self.multicast_packet(&packet);
        }
    }

    /// The representative passes on the token it held.
    fn release_hold(&mut self) {
        self.clear_timer(Timer::TokenHold);
        if let Some(t) = self.held.take() {
            let successor = self.cur.successor();
            self.pass_token(t, successor);
        }
    }

    fn on_hold_cancel(&mut self, ring_id: RingId) {
        if !self.is_operational() || ring_id != self.cur.id {
            return;
        }
        // Not idle any more: the representative does not hold the token
        // again before the sender has had its turn.
        self.idle_visits = 0;
        self.release_hold();
    }

    fn pass_token(&mut self, t: Token, successor: NodeId) {
        if successor == self.me {
            self.solo = Some(t);
            return;
        }
        let (ring, seq) = (t.ring_id, t.seq);
        self.pass(successor, &RingPacket::Token(t), ring, seq);
        self.set_timer(Timer::TokenLoss, self.config.token_timeout);
    }

    /// A token of the installed ring, or of the ring in recovery.
    fn on_token(&mut self, mut t: Token) {
        let log = match &self.phase {
            Phase::Operational if t.ring_id == self.cur.id => &self.cur,
            Phase::Recovery(f) if t.ring_id == f.log.id => &f.log,
            _ => return,
        };
        if t.token_seq <= log.last_token_seq {
            return;
        }
        if t.token_seq == u64::MAX || log.too_far(t.seq) {
            self.stats.bad_datagrams += 1;
            return;
        }
        self.passed = None;
        self.clear_timer(Timer::TokenRetransmit);
        if let Phase::Recovery(f) = &self.phase {
            if t.installed() {
                self.install();
            } else if f.log.is_rep() && f.ready_to_install(&t) {
                t.flags |= TOKEN_INSTALLED;
                self.install();
            } else {
                self.recovery_visit(t);
                return;
            }
        } else if self.fails_to_receive(&t) {
            self.leave_failing_to_receive();
            return;
        }
        self.cur.visit(
            &self.config,
            self.me,
            &mut t,
            &mut self.queue,
            &mut self.out,
            &mut self.stats,
        );
        self.note_idle(&t);
        if self.should_hold() {
            self.stats.holds += 1;
            self.held = Some(t);
            self.set_timer(Timer::TokenHold, self.config.token_hold);
            self.set_timer(Timer::TokenLoss, self.config.token_timeout);
        } else {
            let successor = self.cur.successor();
            self.pass_token(t, successor);
        }
        self.cur.deliver(Mode::Regular, &mut self.events);
    }

    fn on_data(&mut self, d: Data<'_>) {
        let sender = NodeId(d.sender);
        if let Some(p) = &self.passed {
            if d.ring_id == p.ring && d.seq > p.seq {
                // A message the token's holder after me stamped: it moved on.
                self.passed = None;
                self.clear_timer(Timer::TokenRetransmit);
            }
        }
        let msg = Msg {
            sender,
            service: if d.safe {
                Service::Safe
            } else {
                Service::Agreed
            },
            payload: Bytes::copy_from_slice(d.payload),
            recovered: d.recovered,
        };
        match &mut self.phase {
            Phase::Operational | Phase::Gather(_) if d.ring_id == self.cur.id => {
                if self.cur.too_far(d.seq) {
                    self.stats.bad_datagrams += 1;
                    return;
                }
                if self.cur.insert(d.seq, msg) {
                    self.cur.deliver(Mode::Regular, &mut self.events);
                }
            }
            Phase::Commit(f) | Phase::Recovery(f) if d.ring_id == f.log.id => {
                if f.log.too_far(d.seq) {
                    self.stats.bad_datagrams += 1;
                    return;
                }
                if f.log.insert(d.seq, msg.clone()) {
                    self.absorb(msg);
                }
            }
            Phase::Operational if !self.cur.members.contains(&sender) => {
                self.enter_gather([sender]);
            }
            _ => {}
        }
    }

    /// A recovery message of this member's old ring: the old message is
    /// held in the old ring's store, in the old ring's order.
    fn absorb(&mut self, msg: Msg) {
        let Some(r) = msg.recovered else {
            return;
        };
        if r.ring_id != self.cur.id || self.cur.too_far(r.seq) {
            return;
        }
        let old = Msg {
            sender: NodeId(r.sender),
            service: if r.safe {
                Service::Safe
            } else {
                Service::Agreed
            },
            payload: msg.payload,
            recovered: None,
        };
        if self.cur.insert(r.seq, old) {
            self.cur.deliver(Mode::Regular, &mut self.events);
        }
    }

    fn on_timer(&mut self, timer: Timer) {
        match timer {
            Timer::TokenRetransmit => {
                if let Some(p) = &self.passed {
                    self.stats.token_retransmissions += 1;
                    self.out.push_back(Transmit {
                        destination: Destination::Node(p.to),
                        payload: p.bytes.clone(),
                    });
                    self.set_timer(Timer::TokenRetransmit, self.retransmit_interval());
                }
            }
            Timer::TokenLoss => {
                if !matches!(self.phase, Phase::Gather(_)) {
                    self.enter_gather([]);
                }
            }
            Timer::TokenHold => self.release_hold(),
            Timer::Join => self.send_join(),
            Timer::Consensus => self.on_consensus_timeout(),
            Timer::Merge => {
                if self.is_operational() && self.cur.is_rep() && !self.failed_to_receive {
                    let packet = RingPacket::MergeDetect {
                        sender: self.me.0,
                        ring_id: self.cur.id,
                    };
                    self.multicast_packet(&packet);
                    self.set_timer(Timer::Merge, self.config.merge_timeout);
                }
            }
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
            Ok(RingPacket::Data(d)) => self.on_data(d),
            Ok(RingPacket::Join(j)) => self.on_join(j),
            Ok(RingPacket::MergeDetect { sender, ring_id }) => {
                self.on_merge_detect(NodeId(sender), ring_id)
            }
            Ok(RingPacket::Commit(c)) => self.on_commit(c),
            Ok(RingPacket::HoldCancel { ring_id, .. }) => self.on_hold_cancel(ring_id),
            Err(_) => self.stats.bad_datagrams += 1,
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.now = self.now.max(now);
        for (i, timer) in [
            Timer::TokenRetransmit,
            Timer::TokenLoss,
            Timer::Join,
            Timer::Consensus,
            Timer::Merge,
            Timer::TokenHold,
        ]
        .into_iter()
        .enumerate()
        {
            if self.timers[i].is_some_and(|at| at <= self.now) {
                self.timers[i] = None;
                self.on_timer(timer);
            }
        }
    }

    fn multicast(&mut self, now: Instant, payload: Bytes) -> Result<u64, SendError> {
        self.multicast_service(now, Service::Agreed, payload)
    }

    fn poll_transmit(&mut self, _now: Instant) -> Option<Transmit> {
        self.out.pop_front()
    }

    fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.timers.iter().flatten().min().copied()
    }
}

/// Sorted member list of a set.
fn sorted(set: &BTreeSet<NodeId>) -> Vec<NodeId> {
    set.iter().copied().collect()
}

#[cfg(test)]
impl Ring {
    pub(crate) fn phase_name(&self) -> String {
        match &self.phase {
            Phase::Operational => "op".into(),
            Phase::Gather(g) => format!("gather {g:?}"),
            Phase::Commit(f) => format!("commit {:?}", f.log.id),
            Phase::Recovery(f) => format!("recovery {:?}", f.log.id),
        }
    }
}
