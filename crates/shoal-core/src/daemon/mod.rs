//! The daemon engine: everything a Shoal daemon decides, as one sans-IO
//! state machine, so that the real daemon (`shoal-net`) and the simulator
//! (`shoal-sim`'s swarm) run the same code.
//!
//! ```text
//!   datagrams ──handle_datagram──▶ ┌────────────┐ ──poll_transmit──▶ datagrams
//!   timeouts  ──handle_timeout───▶ │   Daemon   │ ──poll_event─────▶ client frames, closes,
//!   clients   ──handle_client────▶ │ membership │                    membership changes
//!   (opened, frames, written,      │ + sessions │ ◀─poll_timeout──── next deadline
//!    closed)                       └────────────┘
//! ```
//!
//! Inside: [`membership::Membership`] (daemons finding each other, the
//! daemons' vsync group, eviction and rejoin, merges) and
//! [`sessions::Sessions`] (clients, lightweight groups, services, batches,
//! fragments, snapshots, `safe` hold-back). Around them this module adds
//! what the runtime used to decide: when a batch goes to the total order
//! (the batching hold), flow control towards vsync, the shutdown phases,
//! every client's outgoing queue and the slow-client policy (per client and
//! in total), and the time limit for a connection to say who it is.
//!
//! The driver hands in client connections by [`SessionId`] and the bytes a
//! client's writer managed to write ([`ClientInput::Written`]); the engine
//! hands out encoded frame chunks per client ([`DaemonEvent::Frames`]), so
//! it knows, without a clock or a socket, how many bytes wait for each
//! client.

pub mod membership;
pub mod regions;
pub mod sessions;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use shoal_wire::client::{code, features as client_features, Frame, Reason};

use crate::engine::{Engine, NodeId, SendError, Transmit};
use crate::time::Instant;
use crate::vsync::{Event, RemovedReason, View};
pub use membership::{Membership, MembershipEvent};
pub use regions::{QsmSettings, RegionStats, Regions};
pub use sessions::{daemon_name, Output, SessionId, SessionStats, Sessions};

/// Resource limits of one daemon (`[limits]` in its configuration).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Connected clients at most.
    pub clients: usize,
    /// Groups one client may have joined at once.
    pub groups_per_client: usize,
    /// Longest group name, in bytes.
    pub group_name_len: usize,
    /// Largest multicast payload, in bytes (default 1 MiB).
    pub message_size: usize,
    /// Bytes of frames queued to one client before it is disconnected as
    /// slow (default 32 MiB).
    pub client_queue: usize,
    /// Bytes of frames queued to all clients together (default 128 MiB):
    /// past it, the client with the longest queue is disconnected as slow,
    /// so that a thousand clients that stop reading cannot hold a thousand
    /// times `client_queue`.
    pub clients_queue: usize,
    /// A connection must send its `Connect` within this long (default 10 s).
    #[serde(with = "crate::serde_ms")]
    pub connect_timeout: Duration,
    /// Largest frame a connection may send before its `Connect` is accepted
    /// (default 4 KiB: a name and a token), so that connections that never
    /// authenticate cannot each hold a large partial frame.
    pub connect_frame_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            clients: 1024,
            groups_per_client: 256,
            group_name_len: 128,
            message_size: 1 << 20,
            client_queue: 32 << 20,
            clients_queue: 128 << 20,
            connect_timeout: Duration::from_secs(10),
            connect_frame_max: 4096,
        }
    }
}

/// How the engine runs, beyond its membership's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The daemon's name (in private group names, `#client#node`).
    pub node: String,
    pub limits: Limits,
    /// Largest batch the daemons' group carries in one message.
    pub batch_max: usize,
    /// Under load, items wait for a fuller batch while one of this daemon's
    /// batches is being ordered, at most this long (default 1 ms): a batch
    /// per round trip instead of one per client frame. At low load nothing
    /// is being ordered and a frame goes at once; a full batch always goes
    /// at once.
    pub batch_hold: Duration,
    /// Each step of a graceful shutdown (goodbye ordered, then the leave)
    /// waits at most this long (default 3 s).
    pub shutdown_step: Duration,
    /// While vsync's send window is full, retry at least this often
    /// (default 1 ms).
    pub window_retry: Duration,
    /// How long a driver may take to write what it holds for a closed
    /// connection (its last frames and the reason) before dropping it
    /// (default 30 s): until it reports the connection closed, or this
    /// passes, those bytes count against `limits.clients_queue`.
    pub close_grace: Duration,
    /// Bytes of client items held for the daemons' group before the engine
    /// stops taking client input ([`Engine::accepts_input`]; default 4 MiB).
    pub pending_max: usize,
    /// The token TCP clients must present (`None`: TCP clients refused).
    pub token: Option<String>,
    /// The lowest epoch of view ids this daemon starts from (default 0).
    /// The runtime passes the wall clock in milliseconds (32 bits), the
    /// simulator its virtual time: a restarted daemon that founds a group
    /// alone then never names a view as its earlier life did.
    pub epoch_floor: u64,
    /// `[qsm]`: `reliable` and `fifo` groups carried by QSM regions
    /// (default off).
    pub qsm: QsmSettings,
}

impl Settings {
    pub fn new(node: &str, limits: Limits, batch_max: usize) -> Settings {
        Settings {
            node: node.to_string(),
            limits,
            batch_max,
            batch_hold: Duration::from_millis(1),
            shutdown_step: Duration::from_secs(3),
            window_retry: Duration::from_millis(1),
            close_grace: Duration::from_secs(30),
            pending_max: 4 << 20,
            token: None,
            epoch_floor: 0,
            qsm: QsmSettings::default(),
        }
    }
}

/// What a driver tells the engine about a client connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientInput {
    /// A connection was accepted; `tcp` says whether it came over TCP
    /// (which requires the token).
    Opened { id: SessionId, tcp: bool },
    /// A frame the client sent.
    Frame(SessionId, Frame),
    /// The client sent bytes that are not a frame; the engine closes it.
    Malformed(SessionId, String),
    /// The client's writer wrote this many bytes of its chunks.
    Written(SessionId, usize),
    /// The connection ended (EOF or error); the driver has dropped it.
    Closed(SessionId),
}

/// What the engine asks its driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonEvent {
    /// Write these encoded frames to the client (report them written back
    /// with [`ClientInput::Written`]).
    Frames(SessionId, Bytes),
    /// Write the frames already handed over, then this last frame (if any),
    /// and close the connection; report the bytes written (or dropped)
    /// with [`ClientInput::Written`] and the end with
    /// [`ClientInput::Closed`]: until then, or `close_grace`, they count
    /// against `limits.clients_queue`. The engine has forgotten the
    /// session. When the last frame is an `Error` with code
    /// `SLOW_CLIENT`, the driver drops the chunks it has not begun to
    /// write (reported as written) and finishes only the one begun.
    Close(SessionId, Option<Bytes>),
    /// The daemons' view changed, or this daemon left or lost it (for logs
    /// and observers; the engine has already acted on it).
    Membership { me: NodeId, event: MembershipChange },
    /// A graceful shutdown is complete: the driver may exit.
    Stopped,
}

/// A daemon membership change, as reported in [`DaemonEvent::Membership`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MembershipChange {
    View(View),
    Removed { view: u64, reason: RemovedReason },
}

/// One entry of the daemons' view history ([`Daemon::view_history`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewRecord {
    /// When the engine learned it.
    pub at: Instant,
    pub change: MembershipChange,
    /// Whether the daemons of the view hold their quorum (false when this
    /// daemon was removed).
    pub quorum: bool,
}

/// A client's frames go to its driver in chunks of about this many bytes
/// at most (one frame may be larger): a driver closing a slow client
/// finishes at most the chunk it began.
pub const CHUNK_MAX: usize = 64 * 1024;

/// How many daemon membership changes [`Daemon::view_history`] keeps.
pub const VIEW_HISTORY: usize = 32;

/// Counters of the engine's own decisions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonStats {
    /// Clients disconnected because all queues together passed
    /// `limits.clients_queue` (they are counted in `slow_clients` too).
    pub slow_in_total: u64,
    /// Connections closed for not sending `Connect` in time.
    pub connect_timeouts: u64,
    /// Batches vsync refused for a full send window (retried).
    pub window_full: u64,
    /// Shutdown steps that ran out of time.
    pub shutdown_steps_timed_out: u64,
    /// Batches handed to vsync again after a view change dropped them.
    pub batches_resent: u64,
    /// Batches in flight when this daemon was evicted: the old cluster may
    /// or may not have ordered them, and their senders are not told.
    pub batches_maybe_lost: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// Goodbye sent; waiting for it to come back in the total order.
    SayingGoodbye {
        until: Instant,
    },
    /// Leave asked; waiting for the view without this daemon.
    Leaving {
        until: Instant,
    },
    Stopped,
}

/// One client connection as the engine sees it.
#[derive(Debug)]
struct Conn {
    tcp: bool,
    /// Bytes handed to the driver (or gathered in `out`) not yet written.
    queued: usize,
    /// Frames of this turn, handed over as one chunk at the next drain.
    out: Vec<u8>,
    /// Size of the last chunk handed over (at most `CHUNK_HINT_MAX`): a
    /// turn's first frame reserves that much, so that a chunk of many
    /// frames is not grown by doubling, copying what it holds each time.
    last_chunk: usize,
}

/// The most a client's chunk reserves ahead (`Conn::last_chunk`).
/// (A chunk is handed over once it reaches `CHUNK_MAX`.)
const CHUNK_HINT_MAX: usize = CHUNK_MAX;

/// The daemon engine.
pub struct Daemon {
    settings: Settings,
    membership: Membership,
    sessions: Sessions,
    /// QSM regions (`[qsm]`): inert unless enabled.
    regions: Regions,
    conns: BTreeMap<SessionId, Conn>,
    /// Connections that have not been accepted yet, and when they opened.
    unconnected: BTreeMap<SessionId, Instant>,
    /// Connections with frames in `out`.
    dirty: Vec<SessionId>,
    /// Closed connections whose driver still holds frames for them: the
    /// bytes (still in `queued_total`) and when they stop counting.
    closing: BTreeMap<SessionId, (usize, Instant)>,
    /// Bytes queued to all clients.
    queued_total: usize,
    events: VecDeque<DaemonEvent>,
    phase: Phase,
    /// When the oldest item waiting for a batch arrived (the batching hold).
    pending_since: Option<Instant>,
    /// A batch vsync refused (window full): it goes first.
    refused: Option<Bytes>,
    /// Batches handed to vsync that have not come back in the total order,
    /// oldest first: a view change that drops them puts them back in the
    /// queue (vsync orders only what it delivers before the view; the
    /// rest would be lost silently).
    in_flight: VecDeque<(u64, Bytes)>,
    left: bool,
    last_now: Instant,
    /// The first time the engine was called: `epoch_floor` is the clock's
    /// reading then ([`Daemon::epoch_floor_now`]).
    first_now: Option<Instant>,
    stats: DaemonStats,
    /// The last [`VIEW_HISTORY`] daemon membership changes, oldest first.
    history: VecDeque<ViewRecord>,
}

impl Daemon {
    /// A daemon around `membership` (not yet joined).
    pub fn new(settings: Settings, membership: Membership) -> Daemon {
        let mut sessions =
            Sessions::new(&settings.node, settings.limits.clone(), settings.batch_max);
        sessions.set_epoch_floor(settings.epoch_floor);
        let regions = Regions::new(settings.qsm.clone(), settings.batch_max);
        Daemon {
            settings,
            membership,
            sessions,
            regions,
            conns: BTreeMap::new(),
            unconnected: BTreeMap::new(),
            dirty: Vec::new(),
            closing: BTreeMap::new(),
            queued_total: 0,
            events: VecDeque::new(),
            phase: Phase::Running,
            pending_since: None,
            refused: None,
            in_flight: VecDeque::new(),
            left: false,
            last_now: Instant::ZERO,
            first_now: None,
            stats: DaemonStats::default(),
            history: VecDeque::new(),
        }
    }

    // ---- getters --------------------------------------------------------------

    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// The QSM region layer.
    pub fn regions(&self) -> &Regions {
        &self.regions
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn stats(&self) -> &DaemonStats {
        &self.stats
    }

    /// Bytes queued to all clients and not yet written (closed connections'
    /// included, until their driver has dropped them).
    pub fn client_queue_bytes(&self) -> usize {
        self.queued_total
    }

    /// Bytes queued to client `id` and not yet written (0 for an unknown one).
    pub fn client_queued(&self, id: SessionId) -> usize {
        self.conns.get(&id).map_or(0, |c| c.queued)
    }

    /// The last daemon membership changes this engine saw (at most
    /// [`VIEW_HISTORY`]), oldest first.
    pub fn view_history(&self) -> impl Iterator<Item = &ViewRecord> {
        self.history.iter()
    }

    /// Open connections (connected or not yet).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Whether a graceful shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.phase != Phase::Running
    }

    /// Whether the graceful shutdown is complete.
    pub fn is_stopped(&self) -> bool {
        self.phase == Phase::Stopped
    }

    /// Lines for `shoal status` about this daemon (the driver adds its own).
    pub fn status_lines(&self, now: Instant) -> Vec<String> {
        let mut lines = self.sessions.status_lines();
        lines.extend(membership_lines(&self.membership, now));
        if self.regions.enabled() {
            lines.extend(self.regions.status_lines());
        }
        let s = &self.stats;
        lines.push(format!(
            "client queues: {} bytes; slow in total {}; connect timeouts {}; window full {}",
            self.queued_total, s.slow_in_total, s.connect_timeouts, s.window_full
        ));
        lines.push(format!(
            "batches sent again after a view change or an eviction {}; possibly lost at an eviction {}",
            s.batches_resent, s.batches_maybe_lost
        ));
        lines
    }

    // ---- inputs ---------------------------------------------------------------

    /// Something happened on a client connection.
    pub fn handle_client(&mut self, now: Instant, input: ClientInput) {
        let now = self.advance(now);
        match input {
            ClientInput::Opened { id, tcp } => {
                self.conns.insert(
                    id,
                    Conn {
                        tcp,
                        queued: 0,
                        out: Vec::new(),
                        last_chunk: 0,
                    },
                );
                self.unconnected.insert(id, now);
            }
            ClientInput::Frame(id, frame) => self.client_frame(now, id, frame),
            ClientInput::Malformed(id, why) => {
                self.sessions.closed(id, Reason::Disconnect);
                let error = Frame::Error {
                    code: code::MALFORMED,
                    text: why,
                };
                self.close(id, Some(error));
            }
            ClientInput::Written(id, n) => {
                if let Some(conn) = self.conns.get_mut(&id) {
                    let n = n.min(conn.queued);
                    conn.queued -= n;
                    self.queued_total -= n;
                } else if let Some((held, _)) = self.closing.get_mut(&id) {
                    let n = n.min(*held);
                    *held -= n;
                    self.queued_total -= n;
                    if *held == 0 {
                        self.closing.remove(&id);
                    }
                }
            }
            ClientInput::Closed(id) => {
                self.sessions.closed(id, Reason::Disconnect);
                self.forget(id);
                self.release(id);
            }
        }
        self.pump(now);
    }

    /// `Status` from client `id`, answered with the engine's lines and
    /// `extra` (the runtime's). The reply counts against the client's queue.
    pub fn handle_status(&mut self, now: Instant, id: SessionId, extra: Vec<String>) {
        let now = self.advance(now);
        self.reply_status(now, id, extra);
        self.pump(now);
    }

    /// `shoal status` lines naming every group with its members
    /// (`group NAME: #a#d0, #b#d1`), then this daemon's clients (`client
    /// #a#d0: groups g1,g2; queued N bytes`).
    pub fn table_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (group, members) in self.sessions.group_members() {
            lines.push(format!("group {group}: {}", members.join(", ")));
        }
        for (id, client, groups) in self.sessions.local_clients() {
            let groups = if groups.is_empty() {
                "-".to_string()
            } else {
                groups.join(",")
            };
            let queued = self.client_queued(id);
            lines.push(format!(
                "client {client}: groups {groups}; queued {queued} bytes"
            ));
        }
        lines
    }

    /// Queues a `StatusReply` (the engine's lines, then `extra`, then the
    /// groups and clients, which may be many), cut to what one frame
    /// carries.
    fn reply_status(&mut self, now: Instant, id: SessionId, extra: Vec<String>) {
        let mut lines = self.status_lines(now);
        lines.extend(extra);
        lines.extend(self.table_lines());
        let mut text = lines.join("\n");
        let mut end = text.len().min(usize::from(u16::MAX));
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        if let Ok(bytes) = (Frame::StatusReply { text }).to_vec() {
            self.queue(id, &bytes);
        }
    }

    /// Begins a graceful shutdown: a goodbye in the total order, then the
    /// clients are closed and the daemon leaves its group;
    /// [`DaemonEvent::Stopped`] follows.
    pub fn begin_shutdown(&mut self, now: Instant) {
        let now = self.advance(now);
        if self.phase != Phase::Running {
            return;
        }
        self.sessions.begin_shutdown();
        self.phase = Phase::SayingGoodbye {
            until: now + self.settings.shutdown_step,
        };
        self.pump(now);
    }

    fn advance(&mut self, now: Instant) -> Instant {
        self.first_now.get_or_insert(now);
        self.last_now = self.last_now.max(now);
        self.last_now
    }

    /// `epoch_floor` moved on by the time since the engine started: the
    /// clock's reading now, in milliseconds, as the runtime reads it at
    /// start (32 bits).
    fn epoch_floor_now(&self) -> u64 {
        let since = self
            .last_now
            .saturating_duration_since(self.first_now.unwrap_or(self.last_now));
        self.settings.epoch_floor + since.as_millis() as u64
    }

    fn client_frame(&mut self, now: Instant, id: SessionId, frame: Frame) {
        match frame {
            Frame::Connect { name, token } => self.connect(id, &name, &token, 0),
            Frame::ConnectExt {
                name,
                token,
                features,
            } => self.connect(id, &name, &token, features),
            Frame::Status => self.reply_status(now, id, Vec::new()),
            Frame::FlowQuery { nonce } if self.sessions.is_connected(id) => {
                self.reply_flow(id, nonce)
            }
            // QSM regions: a carried multicast may go by its region.
            frame if self.regions.enabled() => {
                let idle = self.order_idle();
                if let Some((id, frame)) =
                    self.regions
                        .client_frame(now, &mut self.sessions, id, frame, idle)
                {
                    self.sessions.frame(id, frame);
                }
            }
            frame => self.sessions.frame(id, frame),
        }
    }

    /// A connection's `Connect` (or `ConnectExt` with `features`).
    fn connect(&mut self, id: SessionId, name: &str, token: &str, features: u32) {
        let tcp = self.conns.get(&id).is_some_and(|c| c.tcp);
        let token_ok = !tcp || self.settings.token.as_deref() == Some(token);
        self.sessions.connect(id, name, token_ok);
        self.sessions
            .set_deltas(id, features & client_features::MEMBERSHIP_DELTAS != 0);
        self.unconnected.remove(&id);
    }

    /// Answers a client's `FlowQuery`: what this daemon holds of its sends
    /// (waiting for a batch, refused by a full window, being ordered, or
    /// held back for `safe`)
    /// and of its deliveries (its queue, ahead of this answer).
    fn reply_flow(&mut self, id: SessionId, nonce: u32) {
        let in_flight = self
            .refused
            .iter()
            .chain(self.in_flight.iter().map(|(_, b)| b))
            .map(|b| &b[..]);
        let Some((messages, bytes)) = self.sessions.held_for(id, in_flight) else {
            return;
        };
        let queued = self.conns.get(&id).map_or(0, |c| c.queued);
        let answer = Frame::FlowState {
            nonce,
            accepting: self.accepts_input(),
            held_messages: u32::try_from(messages).unwrap_or(u32::MAX),
            held_bytes: bytes,
            queued_bytes: queued as u64,
            queue_limit: self.settings.limits.client_queue as u64,
        };
        if let Ok(frame) = answer.to_vec() {
            self.queue(id, &frame);
        }
    }

    // ---- the work after every input ------------------------------------------

    /// Moves everything along until nothing changes: membership events to
    /// the sessions, batches to the total order, the shutdown's steps, the
    /// sessions' outputs to the clients' queues.
    fn pump(&mut self, now: Instant) {
        loop {
            let mut moved = self.take_membership_events(now);
            if self.regions.enabled() {
                moved |= self.region_work(now);
            }
            while let Some(batch) = self.sessions.take_unsequenced() {
                let _ = self.membership.multicast_unsequenced(now, &batch);
                moved = true;
            }
            moved |= self.send_batches(now);
            moved |= self.shutdown_steps(now);
            moved |= self.dispatch();
            if !moved {
                break;
            }
        }
    }

    // ---- QSM regions (`regions.rs`): the hooks --------------------------------

    /// The next event of the daemons' group to act on: with QSM on, the
    /// region layer may hold it back (a flush, a cut).
    fn next_membership_event(&mut self, now: Instant) -> Option<MembershipEvent> {
        if !self.regions.enabled() {
            return self.membership.poll_event();
        }
        while let Some(ev) = self.membership.poll_event() {
            self.regions.push_event(ev);
        }
        self.regions.next_event(now, &mut self.sessions)
    }

    /// Region deliveries to the sessions, and client frames the region
    /// layer held, on their way. Returns whether anything moved.
    fn region_work(&mut self, now: Instant) -> bool {
        let mut moved = self.regions.deliver_ready(now, &mut self.sessions);
        let idle = self.order_idle();
        for (id, frame) in self.regions.release_held(now, &mut self.sessions, idle) {
            self.sessions.frame(id, frame);
            moved = true;
        }
        moved
    }

    /// Whether none of this daemon's batches waits for or is in flight in
    /// the total order, and no ordered batch is held back for `safe` (a
    /// region message may then go without overtaking one of its clients'
    /// ordered messages).
    fn order_idle(&self) -> bool {
        self.in_flight.is_empty()
            && self.refused.is_none()
            && self.sessions.pending_bytes() == 0
            && self.sessions.held_batches() == 0
    }

    fn take_membership_events(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Some(ev) = self.next_membership_event(now) {
            any = true;
            let change = match &ev.event {
                Event::Deliver {
                    sender, local_id, ..
                } if *sender == ev.me => {
                    if let Some(i) = self.in_flight.iter().position(|(id, _)| id == local_id) {
                        self.in_flight.remove(i);
                    }
                    None
                }
                Event::View(v) => Some(MembershipChange::View(v.clone())),
                Event::Removed { view, reason } => {
                    if *reason == RemovedReason::Left {
                        self.left = true;
                    }
                    Some(MembershipChange::Removed {
                        view: *view,
                        reason: *reason,
                    })
                }
                Event::Deliver { .. } | Event::Unsequenced { .. } => None,
            };
            if let Some(event) = change {
                self.record_view(&event);
                self.events
                    .push_back(DaemonEvent::Membership { me: ev.me, event });
            }
            let view_change = match &ev.event {
                Event::View(v) if !v.first => Some(v.gseq),
                _ => None,
            };
            let evicted = matches!(
                &ev.event,
                Event::Removed {
                    reason: RemovedReason::Dropped,
                    ..
                }
            );
            let left = matches!(
                &ev.event,
                Event::Removed {
                    reason: RemovedReason::Left,
                    ..
                }
            );
            if let Event::View(v) = &ev.event {
                let quorum = self.membership.holds_quorum(v.members.len());
                self.sessions.set_quorum(quorum);
                if v.first && v.members == [ev.me] {
                    // A daemon that founds a group alone starts its view
                    // ids' epoch from the clock, as a restarted one does:
                    // counting on from its old epoch, it named views as its
                    // old cluster had, which went on counting that epoch
                    // with this daemon's slot as owner while its dropped
                    // incarnation was still listed (swarm seed 123 under
                    // loss: one view id, two member lists).
                    self.sessions.set_epoch_floor(self.epoch_floor_now());
                }
            }
            self.sessions.cluster_event(ev.me, ev.event);
            if self.sessions.take_table_lost() {
                self.membership.give_up_group(now);
            }
            if self.regions.enabled() {
                self.regions.after_event(now, &self.sessions);
            }
            if let Some(view_gseq) = view_change {
                // Every member moving into the view delivered the same
                // messages of the old one: what was sequenced in it (before
                // the view's own sequence number) and is still in flight
                // reached none of them. It goes again, first. What vsync has
                // not sequenced yet it still retries, and what it sequenced
                // after the view comes later.
                let vsync = self.membership.vsync();
                let (waiting, again): (Vec<_>, Vec<_>) =
                    self.in_flight.drain(..).partition(|(id, _)| {
                        vsync.awaits_sequence(*id)
                            || vsync.sequence_of(*id).is_none_or(|g| g > view_gseq)
                    });
                self.in_flight = waiting.into();
                let again: Vec<Bytes> = again.into_iter().map(|(_, b)| b).collect();
                self.stats.batches_resent += again.len() as u64;
                self.sessions.requeue(again, false);
            } else if evicted {
                // What the old cluster sequenced may still be delivered
                // there after this daemon's removal, and a batch whose gseq
                // this daemon had not heard may have been sequenced all the
                // same (the notice lost): sending either again from the new
                // incarnation duplicated messages (the swarm found both).
                // Their messages come back to this daemon's clients in
                // their transitional views, as EVS has it
                // (`batches_maybe_lost` counts them: others may or may not
                // have delivered them); group changes in those it had not
                // heard sequenced go again.
                // The refused batch never left: it goes after the rejoin.
                let again: Vec<Bytes> = self.refused.take().into_iter().collect();
                self.stats.batches_resent += again.len() as u64;
                self.sessions.requeue(again, true);
                // The committee sequences a sender's multicasts in order, so
                // every batch before one whose gseq was heard was sequenced.
                let unsequenced = self.membership.unsequenced_at_removal();
                let last_sequenced = self
                    .in_flight
                    .iter()
                    .rposition(|(id, _)| !unsequenced.contains(id));
                let in_flight: Vec<(Bytes, bool)> = self
                    .in_flight
                    .drain(..)
                    .enumerate()
                    .map(|(i, (_, b))| (b, last_sequenced.is_some_and(|l| i <= l)))
                    .collect();
                self.stats.batches_maybe_lost += in_flight.len() as u64;
                self.sessions.cut_off_in_flight(ev.me, in_flight);
            } else if left {
                self.in_flight.clear();
            }
        }
        any
    }

    fn record_view(&mut self, change: &MembershipChange) {
        let quorum = match change {
            MembershipChange::View(v) => self.membership.holds_quorum(v.members.len()),
            MembershipChange::Removed { .. } => false,
        };
        if self.history.len() == VIEW_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(ViewRecord {
            at: self.last_now,
            change: change.clone(),
            quorum,
        });
    }

    /// Hands batches to vsync as the batching hold allows. Returns whether
    /// any went.
    fn send_batches(&mut self, now: Instant) -> bool {
        let mut sent = false;
        if let Some(batch) = self.refused.take() {
            if !self.multicast(now, batch) {
                return false;
            }
            sent = true;
        }
        while self.sessions.batch_waiting() {
            let since = *self.pending_since.get_or_insert(now);
            let go = self.sessions.full_batch()
                || self.sessions.in_flight() == 0
                || now >= since + self.settings.batch_hold;
            if !go {
                break;
            }
            let Some(batch) = self.sessions.take_batch() else {
                break;
            };
            self.pending_since = None;
            sent = true;
            if !self.multicast(now, batch) {
                break;
            }
        }
        if !self.sessions.batch_waiting() {
            self.pending_since = None;
        }
        sent
    }

    /// Returns false when the send window is full (the batch waits).
    fn multicast(&mut self, now: Instant, batch: Bytes) -> bool {
        match self.membership.multicast(now, batch.clone()) {
            Ok(local_id) => {
                self.in_flight.push_back((local_id, batch));
                true
            }
            Err(SendError::WindowFull) => {
                self.stats.window_full += 1;
                self.refused = Some(batch);
                false
            }
            // Batches are cut to `batch_max`, which fits: a configuration
            // bug. The batch is lost, as its messages' senders are not told;
            // counted as malformed.
            Err(SendError::TooLarge { .. }) => true,
        }
    }

    fn shutdown_steps(&mut self, now: Instant) -> bool {
        match self.phase {
            Phase::SayingGoodbye { until } if self.sessions.goodbye_delivered() || now >= until => {
                if now >= until && !self.sessions.goodbye_delivered() {
                    self.stats.shutdown_steps_timed_out += 1;
                }
                self.sessions.close_all();
                self.membership.leave(now);
                self.phase = Phase::Leaving {
                    until: now + self.settings.shutdown_step,
                };
                true
            }
            Phase::Leaving { until }
                if self.left || !self.membership.is_member() || now >= until =>
            {
                if now >= until && !self.left {
                    self.stats.shutdown_steps_timed_out += 1;
                }
                self.phase = Phase::Stopped;
                self.events.push_back(DaemonEvent::Stopped);
                true
            }
            _ => false,
        }
    }

    /// Turns the sessions' outputs into client queue entries. Returns
    /// whether there were any.
    fn dispatch(&mut self) -> bool {
        let mut any = false;
        loop {
            let mut outputs = self.sessions.take_outputs();
            if outputs.list.is_empty() {
                self.sessions.recycle(outputs);
                return any;
            }
            any = true;
            for out in std::mem::take(&mut outputs.list) {
                match out {
                    Output::Send(id, frame) => {
                        if let Ok(bytes) = frame.to_vec() {
                            self.queue(id, &bytes);
                        }
                    }
                    Output::Deliver(ids, range) => {
                        for id in ids {
                            self.queue(id, outputs.frame(&range));
                        }
                    }
                    Output::Close(id, frame) => self.close(id, frame),
                }
            }
            self.sessions.recycle(outputs);
        }
    }

    /// Queues an encoded frame to a client, or disconnects it as slow when
    /// its queue, or all queues together, would pass their limits.
    fn queue(&mut self, id: SessionId, bytes: &[u8]) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        if conn.queued + bytes.len() > self.settings.limits.client_queue {
            self.slow(id);
            return;
        }
        while self.queued_total + bytes.len() > self.settings.limits.clients_queue {
            // The longest queue goes (ties: the lowest id, deterministic).
            let (longest, queued) = self
                .conns
                .iter()
                .map(|(cid, c)| (*cid, c.queued))
                .max_by_key(|(cid, queued)| (*queued, std::cmp::Reverse(*cid)))
                .unwrap_or((id, 0));
            self.stats.slow_in_total += 1;
            if longest == id || queued == 0 {
                self.slow(id);
                return;
            }
            self.slow(longest);
        }
        let conn = self.conns.get_mut(&id).expect("checked");
        conn.queued += bytes.len();
        self.queued_total += bytes.len();
        if conn.out.is_empty() {
            self.dirty.push(id);
            conn.out.reserve(conn.last_chunk.max(bytes.len()));
        }
        conn.out.extend_from_slice(bytes);
        if conn.out.len() >= CHUNK_MAX {
            self.flush(id);
        }
    }

    /// Disconnects a slow client: the sessions forget it (its groups hear it
    /// left), and the connection closes with the reason. Frames not handed
    /// over yet are dropped; those handed over count until the driver has
    /// written or dropped them ([`DaemonEvent::Close`]); nothing more is
    /// queued.
    fn slow(&mut self, id: SessionId) {
        if self.sessions.is_connected(id) {
            self.sessions.slow(id);
            // The close comes back through the sessions' outputs; drop what
            // the driver never had now, so that the total falls at once.
            if let Some(conn) = self.conns.get_mut(&id) {
                self.queued_total -= conn.out.len();
                conn.queued -= conn.out.len();
                conn.out.clear();
            }
        } else {
            let error = Frame::Error {
                code: code::SLOW_CLIENT,
                text: "disconnected: too many bytes waited for this connection".into(),
            };
            self.close(id, Some(error));
        }
    }

    fn close(&mut self, id: SessionId, frame: Option<Frame>) {
        if !self.conns.contains_key(&id) {
            return;
        }
        self.flush(id);
        self.forget(id);
        let last = frame.and_then(|f| f.to_vec().ok()).map(Bytes::from);
        self.events.push_back(DaemonEvent::Close(id, last));
    }

    /// The engine is done with connection `id`. What the driver still holds
    /// for it stays counted ([`Daemon::closing`]) until the driver reports
    /// it written or the connection closed, or `close_grace` has passed.
    fn forget(&mut self, id: SessionId) {
        if let Some(conn) = self.conns.remove(&id) {
            if conn.queued > 0 {
                let until = self.last_now + self.settings.close_grace;
                self.closing.insert(id, (conn.queued, until));
            }
        }
        self.unconnected.remove(&id);
    }

    /// The driver has dropped closed connection `id`: what it held is gone.
    fn release(&mut self, id: SessionId) {
        if let Some((held, _)) = self.closing.remove(&id) {
            self.queued_total -= held;
        }
    }

    fn closing_deadline(&self) -> Option<Instant> {
        self.closing.values().map(|(_, until)| *until).min()
    }

    fn expire_closing(&mut self, now: Instant) {
        let done: Vec<SessionId> = self
            .closing
            .iter()
            .filter(|(_, (_, until))| now >= *until)
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            self.release(id);
        }
    }

    /// Hands a connection's gathered frames over as one chunk.
    fn flush(&mut self, id: SessionId) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.out.is_empty() {
            return;
        }
        conn.last_chunk = conn.out.len().min(CHUNK_HINT_MAX);
        let mut chunk = std::mem::take(&mut conn.out);
        // The queue is counted by length: what waits must not hold much
        // more than that (a reservation larger than this turn's frames).
        if chunk.capacity() > 2 * chunk.len() {
            chunk.shrink_to_fit();
        }
        self.events
            .push_back(DaemonEvent::Frames(id, Bytes::from(chunk)));
    }

    fn flush_dirty(&mut self) {
        for id in std::mem::take(&mut self.dirty) {
            self.flush(id);
        }
    }

    fn connect_deadline(&self) -> Option<Instant> {
        self.unconnected
            .values()
            .min()
            .map(|t| *t + self.settings.limits.connect_timeout)
    }

    fn expire_unconnected(&mut self, now: Instant) {
        let timeout = self.settings.limits.connect_timeout;
        let late: Vec<SessionId> = self
            .unconnected
            .iter()
            .filter(|(_, t)| now >= **t + timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            self.stats.connect_timeouts += 1;
            let error = Frame::Error {
                code: code::PROTOCOL,
                text: format!("no Connect within {} ms", timeout.as_millis()),
            };
            self.close(id, Some(error));
        }
    }

    fn hold_deadline(&self) -> Option<Instant> {
        let since = self.pending_since?;
        self.sessions
            .batch_waiting()
            .then(|| since + self.settings.batch_hold)
    }

    /// Checks the engine's invariants (the simulator calls it in debug
    /// builds): panics when one is broken.
    pub fn check_invariants(&self) {
        let queued: usize = self.conns.values().map(|c| c.queued).sum::<usize>()
            + self.closing.values().map(|(held, _)| held).sum::<usize>();
        assert_eq!(queued, self.queued_total, "client queue total");
        for (id, conn) in &self.conns {
            assert!(
                conn.out.len() <= conn.queued,
                "session {id}: out beyond queued"
            );
            assert!(
                conn.queued <= self.settings.limits.client_queue,
                "session {id}: queue past its limit"
            );
        }
        assert!(
            self.queued_total <= self.settings.limits.clients_queue,
            "client queues past their total"
        );
        self.sessions.check_invariants();
        self.membership.vsync().check_invariants();
    }
}

impl Engine for Daemon {
    type Event = DaemonEvent;

    fn node_id(&self) -> NodeId {
        self.membership.node_id()
    }

    fn handle_datagram(&mut self, now: Instant, from: NodeId, datagram: &[u8]) {
        let now = self.advance(now);
        if self.regions.enabled() && Regions::is_qsm(datagram) {
            let bytes = Bytes::copy_from_slice(datagram);
            self.regions.handle_datagram(now, from, &bytes);
            self.pump(now);
            return;
        }
        self.membership.handle_datagram(now, from, datagram);
        self.pump(now);
    }

    fn handle_datagram_bytes(&mut self, now: Instant, from: NodeId, datagram: &Bytes) {
        let now = self.advance(now);
        if self.regions.enabled() && Regions::is_qsm(datagram) {
            self.regions.handle_datagram(now, from, datagram);
            self.pump(now);
            return;
        }
        self.membership.handle_datagram_bytes(now, from, datagram);
        self.pump(now);
    }

    fn handle_timeout(&mut self, now: Instant) {
        let now = self.advance(now);
        if self.membership.poll_timeout().is_some_and(|t| t <= now) {
            self.membership.handle_timeout(now);
        }
        self.expire_unconnected(now);
        self.expire_closing(now);
        if self.regions.enabled() {
            self.regions.handle_timeout(now);
        }
        self.pump(now);
    }

    /// The daemon takes client frames ([`Daemon::handle_client`]), not raw
    /// payloads: always refused, the engine unchanged.
    fn multicast(&mut self, _now: Instant, payload: Bytes) -> Result<u64, SendError> {
        Err(SendError::TooLarge {
            len: payload.len(),
            max: 0,
        })
    }

    fn poll_transmit(&mut self, now: Instant) -> Option<Transmit> {
        if let Some(t) = self.membership.poll_transmit(now) {
            return Some(t);
        }
        if self.regions.enabled() {
            return self.regions.poll_transmit(now);
        }
        None
    }

    /// Client frames are gathered per client and handed over as one chunk
    /// per client each time the queue of events runs dry.
    fn poll_event(&mut self) -> Option<DaemonEvent> {
        if self.events.is_empty() {
            self.flush_dirty();
        }
        self.events.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let retry = self
            .refused
            .is_some()
            .then(|| self.last_now + self.settings.window_retry);
        let shutdown = match self.phase {
            Phase::SayingGoodbye { until } | Phase::Leaving { until } => Some(until),
            _ => None,
        };
        [
            self.membership.poll_timeout(),
            self.hold_deadline(),
            retry,
            shutdown,
            self.connect_deadline(),
            self.closing_deadline(),
            self.regions.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn accepts_input(&self) -> bool {
        self.sessions.pending_bytes() < self.settings.pending_max && self.regions.accepts_input()
    }

    /// QSM regions' IP multicast addresses (`[qsm] multicast`).
    fn poll_group_change(&mut self) -> Option<crate::engine::GroupChange> {
        if !self.regions.enabled() {
            return None;
        }
        self.regions.poll_group_change()
    }

    fn poll_group_transmit(&mut self, now: Instant) -> Option<crate::engine::GroupTransmit> {
        if !self.regions.enabled() {
            return None;
        }
        self.regions.poll_group_transmit(now)
    }
}

/// `shoal status` lines about the daemons' membership.
fn membership_lines(engine: &Membership, now: Instant) -> Vec<String> {
    let v = engine.vsync();
    let c = engine.stats();
    let s = v.stats();
    let mut lines = vec![
        format!("uptime: {now}"),
        format!(
            "daemons' view: {} ({} members{}){}",
            crate::vsync::display_view(v.view_id()),
            v.members().len(),
            if v.is_primary() {
                ", this daemon is the primary"
            } else {
                ""
            },
            if engine.is_member() {
                ""
            } else {
                " — not a member: joining"
            }
        ),
        format!(
            "committee: {} ({})",
            v.committee().len(),
            v.committee()
                .iter()
                .map(|d| daemon_name(*d))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        format!("vsync state: {}", v.debug_line()),
        format!(
            "membership: founded {}, rejoins {}, merges {}, partitions {}, majorities gone {}, tables lost {}, presence sent {} received {}, unsequenced refused {}",
            c.founded, c.rejoins, c.merges, c.partitions, c.majorities_gone, c.tables_lost, c.presence_sent, c.presence_received, c.unsequenced_refused
        ),
        format!(
            "vsync: delivered {}, views {}, takeovers {}, abandoned {}, silent members asked again {}, repairs sent {} asked {}, malformed {}, foreign answers ignored {}, other groups' messages ignored {}",
            s.delivered,
            s.views_installed,
            s.takeovers,
            s.newviews_abandoned,
            s.view_acks_asked_again,
            s.repairs_sent,
            s.repair_requests_sent,
            s.malformed,
            s.foreign_answers_ignored,
            s.foreign_group_ignored
        ),
    ];
    if let Some(p) = v.pbcast_stats() {
        lines.push(format!(
            "pbcast: originated {}, delivered {}, recovered {}, duplicates {}, lost {}, gossip rounds {}",
            p.originated, p.delivered, p.recovered, p.duplicates, p.lost, p.gossip_rounds
        ));
    }
    lines
}

#[cfg(test)]
mod tests;
