//! One member's core loop: an OS thread with a current-thread tokio runtime
//! that owns the engine ([`Node::spawn`]), or a task of the caller's runtime
//! ([`Node::spawn_task`]; the daemon runs it so, beside its sessions, on one
//! thread).
//!
//! Each turn, in this order (QSM: I/O first):
//!
//! 1. drain the sockets in batches (until `WouldBlock` or `recv_batch_max`
//!    datagrams; with UDP GRO one receive may bring a run of several,
//!    `gro.rs`), passing each datagram through the fault layer to
//!    `handle_datagram`;
//! 2. release delayed datagrams that are due;
//! 3. fire the engine's timer if its deadline passed;
//! 4. accept application multicasts from the command channel until the
//!    engine's send window is full (flow control: the refused payload waits
//!    and is retried after the next input);
//! 5. pull datagrams from `poll_transmit` and send them until the engine has
//!    none or the socket would block (the pull architecture of DESIGN.md: the
//!    engine builds each datagram when the socket can take it);
//! 6. hand the turn's events to the application as one [`EventBatch`].
//!
//! Events and transmissions are drained once per turn, after all of the
//! turn's inputs. The engine queues its outputs, so this changes no
//! protocol decision; it lets the engine pack a turn's worth of messages
//! into few datagrams (and the daemon engine a turn's frames for one client
//! into one chunk). A turn with a single input flushes at once: nothing
//! waits for a batch to fill, so packing adds no latency at low rates.
//!
//! Then the loop sleeps until a socket is readable (or writable, when a send
//! would block), a command arrives, the engine's or the fault layer's next
//! deadline passes, or shutdown is asked for.

use std::collections::{HashSet, VecDeque};
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use shoal_core::engine::SendError;
use shoal_core::fragments::{Reassembler, ReassemblyConfig, Splitter};
use shoal_core::{Destination, Engine, GroupChange, Instant, NodeId};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};

use crate::addr::Learned;
use crate::{
    AddressBook, Clock, ClusterKey, Endpoint, FaultConfig, Faults, Mode, NetError, Opener,
    OpenerConfig, Sealer, Verdict,
};

/// What the application asks a node to do.
#[derive(Debug, Clone)]
pub enum Command {
    /// Multicast this payload to the group (when flow control allows).
    Multicast(Bytes),
}

/// A closure the node runs on its own thread with its engine, the engine
/// time and the runtime's counters: status queries, a graceful leave, any
/// engine-specific command. Answers go back through a channel the closure owns.
pub type Control<E> = Box<dyn FnOnce(&mut E, Instant, &RuntimeStats) + Send>;

/// The events of one turn of the loop, with the time they were handed over.
#[derive(Debug)]
pub struct EventBatch<Ev> {
    /// Engine time at which the runtime handed these events to the channel.
    pub at: Instant,
    pub events: Vec<Ev>,
}

/// Settings of the runtime around one engine.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The static member list; must contain the endpoint's own address.
    pub book: AddressBook,
    /// Injected faults: loss, duplication, delay and jitter of received
    /// datagrams; loss and duplication of sent ones (none by default).
    pub faults: FaultConfig,
    /// Datagrams read from one socket per turn, at most, before timers and
    /// sends get their turn. Default 64.
    pub recv_batch_max: usize,
    /// Application multicasts accepted per turn, at most. Default 256.
    pub command_batch_max: usize,
    /// Capacity of the command channel. Default 4096.
    pub command_queue_len: usize,
    /// Capacity of the input channel ([`Node::inputs`]). Default 64.
    pub input_queue_len: usize,
    /// While the send window is full, retry at least this often even if no
    /// datagram arrives (a silent member stops holding the window after a
    /// timeout the engine does not report). Default 1 ms.
    pub window_retry: Duration,
    /// Seal every datagram sent and open every one received with a cluster
    /// key (`auth.rs`); datagrams that do not open are dropped and counted.
    /// Default none.
    pub auth: Option<Auth>,
    /// After a turn that did work, keep polling (yielding to the runtime,
    /// which polls its I/O driver without sleeping) for this long before
    /// parking. Waking a parked thread costs tens of microseconds on a
    /// virtual machine, several times per round trip; a short spin after
    /// activity avoids it at low load and costs nothing when saturated
    /// (the loop never idles then). Default zero (park at once).
    pub spin: Duration,
    /// Largest UDP payload put on the wire, authentication envelope
    /// included (the path's datagram size). A datagram the engine builds
    /// that would be larger goes as fragments of at most this size
    /// (`shoal_core::fragments`), put together by the receiving node before
    /// its engine sees it. `None` (default): datagrams go as the engine
    /// builds them. Fragments are received and joined either way.
    pub path_datagram: Option<usize>,
    /// Time and memory limits of joining fragments.
    pub reassembly: ReassemblyConfig,
    /// Scope (interface, TTL) and buffers of the socket for the IP
    /// multicast groups the engine joins itself
    /// (`Engine::poll_group_change`; QSM's per-region addresses). Default:
    /// loopback, TTL 0. The engine's datagrams to them leave by the
    /// unicast socket, whose scope the endpoint's options set.
    pub groups: crate::SocketOptions,
}

/// Datagram authentication settings of a node.
#[derive(Clone)]
pub struct Auth {
    pub key: ClusterKey,
    pub mode: Mode,
    /// The sealer's epoch: it must grow across restarts (Unix milliseconds
    /// at start-up); see `Sealer::new`.
    pub epoch: u64,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("mode", &self.mode)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl NodeConfig {
    pub fn new(book: AddressBook) -> NodeConfig {
        NodeConfig {
            book,
            faults: FaultConfig::default(),
            recv_batch_max: 64,
            command_batch_max: 256,
            command_queue_len: 4096,
            input_queue_len: 64,
            window_retry: Duration::from_millis(1),
            auth: None,
            spin: Duration::ZERO,
            path_datagram: None,
            reassembly: ReassemblyConfig::default(),
            groups: crate::SocketOptions::default(),
        }
    }
}

/// Counters of the runtime (the engine keeps its own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    pub turns: u64,
    pub datagrams_received: u64,
    pub bytes_received: u64,
    pub datagrams_sent: u64,
    pub bytes_sent: u64,
    /// Dropped by the fault layer.
    pub fault_drops: u64,
    /// Held back by the fault layer.
    pub fault_delays: u64,
    /// Extra copies made by the fault layer (received datagrams).
    pub fault_duplicates: u64,
    /// Sent datagrams dropped by the fault layer.
    pub fault_send_drops: u64,
    /// Sent datagrams duplicated by the fault layer.
    pub fault_send_duplicates: u64,
    /// This node's own multicasts looped back to it, dropped.
    pub own_filtered: u64,
    /// From an address not in the book, dropped.
    pub unknown_source: u64,
    /// Learning book only: claimed a slot bound to another address, or
    /// came from an address bound to another slot; dropped.
    pub slot_conflicts: u64,
    /// Sends that found the socket buffer full (and waited for it).
    pub send_would_block: u64,
    /// Sends or receives that failed (logged, datagram dropped).
    pub io_errors: u64,
    /// Receives that brought a run of several datagrams at once (UDP GRO;
    /// each datagram is counted in `datagrams_received` too).
    pub gro_runs: u64,
    /// Sends that carried a run of several datagrams at once (UDP GSO:
    /// fragments of a large datagram, or datagrams to one address queued
    /// together; each datagram is counted in `datagrams_sent` too).
    pub segmented_sends: u64,
    /// Receives cut short by the receive buffer (never expected).
    pub receive_truncated: u64,
    /// Application multicasts refused for now by flow control.
    pub window_full: u64,
    /// Application multicasts refused for good (payload too large).
    pub too_large: u64,
    /// Received datagrams that did not open with the cluster key (wrong
    /// key, tampered, replayed, or not sealed at all).
    pub auth_dropped: u64,
    /// Application multicasts taken from the command channel.
    pub commands: u64,
    /// Engine datagrams sent as fragments, and the fragments they made
    /// (counted once each in `datagrams_sent` too).
    pub datagrams_split: u64,
    pub fragments_sent: u64,
    /// Fragments received, and the datagrams joined from them.
    pub fragments_received: u64,
    pub datagrams_joined: u64,
    /// Fragments refused (malformed, wrong sender) and partial datagrams
    /// dropped (timed out, or past the memory bound).
    pub fragments_refused: u64,
    pub partial_dropped: u64,
    /// IP multicast groups the engine asked to join or leave, and how many
    /// of those changes failed (logged; the engine's recovery copes).
    pub group_changes: u64,
    pub group_change_errors: u64,
}

/// A running member. Dropping it stops the node without waiting.
pub struct Node<E: Engine> {
    id: NodeId,
    local_addr: SocketAddr,
    commands: mpsc::Sender<Command>,
    controls: mpsc::UnboundedSender<Control<E>>,
    inputs: mpsc::Sender<Control<E>>,
    events: Option<mpsc::UnboundedReceiver<EventBatch<E::Event>>>,
    shutdown: Option<oneshot::Sender<()>>,
    runner: Option<Runner<E>>,
}

type Outcome<E> = Result<(E, RuntimeStats), NetError>;

/// Where the loop runs.
enum Runner<E> {
    /// Its own OS thread with its own runtime ([`Node::spawn`]).
    Thread(JoinHandle<Outcome<E>>),
    /// A task of the caller's runtime ([`Node::spawn_task`]).
    Task(tokio::task::JoinHandle<Outcome<E>>),
}

impl<E> Node<E>
where
    E: Engine + Send + 'static,
    E::Event: Send + 'static,
{
    /// Starts `engine` on its own thread, on `endpoint`'s sockets.
    pub fn spawn(
        engine: E,
        endpoint: Endpoint,
        config: NodeConfig,
        clock: Clock,
    ) -> Result<Node<E>, NetError> {
        let (mut node, channels, shutdown_rx) = Node::handles(&engine, &endpoint, &config)?;
        let thread = std::thread::Builder::new()
            .name(format!("shoal-{}", node.id))
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(NetError::Runtime)?;
                runtime.block_on(async move {
                    let driver = Driver::new(engine, endpoint, config, clock, channels)?;
                    driver.run(shutdown_rx).await
                })
            })
            .map_err(NetError::Runtime)?;
        node.runner = Some(Runner::Thread(thread));
        Ok(node)
    }

    /// Starts `engine` as a task of the calling tokio runtime instead of a
    /// thread of its own: with a current-thread runtime, the engine and the
    /// application share one thread, and handing a command or an event
    /// over is a task wake-up, not a wake-up of another thread. Must be
    /// called from inside a runtime. Stop it with [`Node::stop`].
    pub fn spawn_task(
        engine: E,
        endpoint: Endpoint,
        config: NodeConfig,
        clock: Clock,
    ) -> Result<Node<E>, NetError> {
        let (mut node, channels, shutdown_rx) = Node::handles(&engine, &endpoint, &config)?;
        let driver = Driver::new(engine, endpoint, config, clock, channels)?;
        node.runner = Some(Runner::Task(tokio::spawn(driver.run(shutdown_rx))));
        Ok(node)
    }

    /// What both ways of starting share: the address check, and the
    /// application's handles (a `Node` not yet running) with the driver's
    /// ends of the channels.
    fn handles(
        engine: &E,
        endpoint: &Endpoint,
        config: &NodeConfig,
    ) -> Result<Handles<E>, NetError> {
        let id = engine.node_id();
        let local_addr = endpoint.local_addr();
        if config.book.addr(id) != Some(local_addr) {
            return Err(NetError::AddressBook(format!(
                "{id} is not listed at its own address {local_addr}"
            )));
        }
        let (command_tx, command_rx) = mpsc::channel(config.command_queue_len.max(1));
        let (event_tx, event_rx) = mpsc::unbounded_channel();
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let (input_tx, input_rx) = mpsc::channel(config.input_queue_len.max(1));
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let node = Node {
            id,
            local_addr,
            commands: command_tx,
            controls: control_tx,
            inputs: input_tx,
            events: Some(event_rx),
            shutdown: Some(shutdown_tx),
            runner: None,
        };
        let channels = Channels {
            commands: command_rx,
            controls: control_rx,
            inputs: input_rx,
            events: event_tx,
        };
        Ok((node, channels, shutdown_rx))
    }
}

impl<E: Engine> Node<E> {
    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where the application sends commands (clone it freely). Closing every
    /// sender does not stop the node: it keeps repairing until shutdown.
    pub fn commands(&self) -> mpsc::Sender<Command> {
        self.commands.clone()
    }

    /// Runs `f` on the node's thread with its engine, between turns. Returns
    /// false when the node has stopped.
    pub fn control(&self, f: impl FnOnce(&mut E, Instant, &RuntimeStats) + Send + 'static) -> bool {
        self.controls.send(Box::new(f)).is_ok()
    }

    /// A handle for [`Node::control`] that can be cloned and moved.
    pub fn controls(&self) -> mpsc::UnboundedSender<Control<E>> {
        self.controls.clone()
    }

    /// Where application input goes (clone it freely): closures run like
    /// controls, but only while the engine accepts input
    /// ([`Engine::accepts_input`]), and the channel is bounded, so a sender
    /// waits while the engine is behind (back-pressure).
    pub fn inputs(&self) -> mpsc::Sender<Control<E>> {
        self.inputs.clone()
    }

    /// The event stream; `None` once taken. The application must keep
    /// reading it: events are never dropped, so an unread stream grows.
    pub fn take_events(&mut self) -> Option<mpsc::UnboundedReceiver<EventBatch<E::Event>>> {
        self.events.take()
    }

    /// Stops the loop and waits for it; returns the engine (for its
    /// statistics) and the runtime's counters. Blocks the calling thread.
    /// A node started with [`Node::spawn_task`] must be stopped with
    /// [`Node::stop`] instead (blocking here would block its own runtime).
    pub fn shutdown(mut self) -> Result<(E, RuntimeStats), NetError> {
        if let Some(tx) = self.shutdown.take() {
            // The loop may already have stopped on an error: ignore.
            let _ = tx.send(());
        }
        match self.runner.take().expect("joined once") {
            Runner::Thread(thread) => thread.join().map_err(|_| NetError::Panicked)?,
            Runner::Task(_) => Err(NetError::Runtime(io::Error::other(
                "a node running as a task is stopped with Node::stop",
            ))),
        }
    }
}

impl<E> Node<E>
where
    E: Engine + Send + 'static,
    E::Event: Send + 'static,
{
    /// Stops the loop and waits for it without blocking the runtime, however
    /// the node was started; returns the engine and the runtime's counters.
    pub async fn stop(mut self) -> Result<(E, RuntimeStats), NetError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.runner.take().expect("joined once") {
            Runner::Thread(thread) => tokio::task::spawn_blocking(move || thread.join())
                .await
                .map_err(|_| NetError::Panicked)?
                .map_err(|_| NetError::Panicked)?,
            Runner::Task(task) => task.await.map_err(|_| NetError::Panicked)?,
        }
    }
}

impl<E: Engine> Drop for Node<E> {
    fn drop(&mut self) {
        // Dropping the shutdown sender stops the loop; the thread is detached.
        self.shutdown.take();
    }
}

/// Why the loop woke up.
enum Wake<E> {
    Io,
    Command(Option<Command>),
    Control(Option<Control<E>>),
    Input(Option<Control<E>>),
    Timer,
    Shutdown,
}

/// The state the loop owns.
struct Driver<E: Engine> {
    engine: E,
    me: NodeId,
    my_addr: SocketAddr,
    unicast: UdpSocket,
    multicast_rx: Option<UdpSocket>,
    group: Option<SocketAddr>,
    /// The socket of the engine's own groups, made at its first join.
    groups_rx: Option<UdpSocket>,
    book: AddressBook,
    faults: Option<Faults>,
    clock: Clock,
    config: NodeConfig,
    commands: mpsc::Receiver<Command>,
    commands_open: bool,
    controls: mpsc::UnboundedReceiver<Control<E>>,
    controls_open: bool,
    inputs: mpsc::Receiver<Control<E>>,
    inputs_open: bool,
    /// An application payload refused by flow control, retried first.
    waiting: Option<Bytes>,
    /// Addressed datagrams pulled from the engine, not yet accepted by the socket.
    outgoing: VecDeque<Outgoing>,
    /// The head of `outgoing` met a full socket buffer.
    blocked: bool,
    events_tx: mpsc::UnboundedSender<EventBatch<E::Event>>,
    events: Vec<E::Event>,
    /// The receive buffer (one datagram, or one run of them with UDP GRO).
    rx: crate::gro::Receiver,
    stats: RuntimeStats,
    warned_no_multicast: bool,
    /// Addresses already warned about for a slot conflict (at most
    /// `CONFLICTS_WARNED`: a flood from many ports does not grow it).
    warned_conflicts: HashSet<SocketAddr>,
    sealer: Option<Sealer>,
    opener: Option<Opener>,
    /// Scratch for sealing and opening.
    sealed: Vec<u8>,
    opened: Vec<u8>,
    /// Cuts datagrams larger than the path (`NodeConfig::path_datagram`).
    splitter: Option<Splitter>,
    /// Runs of equal fragments go in one segmented send (`gso.rs`) while
    /// the kernel takes them.
    gso: bool,
    reassembler: Reassembler,
}

/// Where an engine's datagram goes: a [`Destination`] of `poll_transmit`, or
/// a group of `poll_group_transmit`.
#[derive(Debug, Clone, Copy)]
enum Target {
    Engine(Destination),
    Group(SocketAddr),
}

/// A datagram, or a run of datagrams of `segment` bytes each (the last may
/// be shorter) sent in one call, queued for the socket: the fragments of
/// a large datagram, and datagrams to one address queued one after
/// another (a ring's messages to each peer, then its token).
struct Outgoing {
    to: SocketAddr,
    /// The run's bytes: `payload`, then each of `more` (datagrams
    /// appended one by one; none for a single buffer).
    payload: Bytes,
    more: Vec<Bytes>,
    /// The whole run's length.
    len: usize,
    /// 0: one datagram.
    segment: usize,
}

impl Outgoing {
    fn new(to: SocketAddr, payload: Bytes, segment: usize) -> Outgoing {
        Outgoing {
            to,
            len: payload.len(),
            payload,
            more: Vec::new(),
            segment,
        }
    }

    /// Whether a datagram of `len` bytes may follow the run in the same
    /// segmented send: every datagram so far has the run's segment size,
    /// the new one is no longer, and the run stays within one send.
    fn takes(&self, len: usize) -> bool {
        let segment = if self.segment == 0 {
            self.len
        } else {
            self.segment
        };
        len > 0
            && segment > 0
            && len <= segment
            && self.len.is_multiple_of(segment)
            && self.len / segment < crate::gso::segments_per_send(segment)
            && self.len + len <= crate::gso::MAX_BYTES
    }

    fn append(&mut self, payload: Bytes) {
        if self.segment == 0 {
            self.segment = self.len;
        }
        self.len += payload.len();
        self.more.push(payload);
    }

    /// Whether this is a run of several datagrams (one segmented send).
    fn segmented(&self) -> bool {
        self.segment > 0 && self.len > self.segment
    }

    /// The run's bytes in one buffer.
    fn joined(&self) -> Bytes {
        if self.more.is_empty() {
            return self.payload.clone();
        }
        let mut all = Vec::with_capacity(self.len);
        all.extend_from_slice(&self.payload);
        for b in &self.more {
            all.extend_from_slice(b);
        }
        Bytes::from(all)
    }
}

/// Datagrams pulled from the engine before the queue is sent, at most:
/// datagrams to one address pulled together go in one segmented send.
const PULL_MAX: usize = 256;

/// How far back in the queue a datagram looks for a run to the same
/// address to join (a run further back is left alone; a new one starts).
const JOIN_LOOKBACK: usize = 8;

impl<E: Engine> Driver<E> {
    fn new(
        engine: E,
        endpoint: Endpoint,
        config: NodeConfig,
        clock: Clock,
        channels: Channels<E>,
    ) -> Result<Driver<E>, NetError> {
        let Channels {
            commands,
            controls,
            inputs,
            events: events_tx,
        } = channels;
        let my_addr = endpoint.local_addr();
        let unicast = UdpSocket::from_std(endpoint.unicast).map_err(NetError::Runtime)?;
        let (multicast_rx, group) = match endpoint.multicast {
            Some((socket, group)) => (
                Some(UdpSocket::from_std(socket).map_err(NetError::Runtime)?),
                Some(group.addr()),
            ),
            None => (None, None),
        };
        // Both sockets are read only through `gro::Receiver`, which gives a
        // coalesced run back as its datagrams.
        let gro = crate::gro::enable(&unicast);
        let gro_multicast = multicast_rx.as_ref().map(crate::gro::enable);
        tracing::debug!(node = %engine.node_id(), gro, ?gro_multicast, "UDP GRO");
        let faults = config
            .faults
            .is_active()
            .then(|| Faults::new(config.faults));
        let (sealer, opener) = match &config.auth {
            Some(auth) => {
                let sealer = Sealer::new(&auth.key, auth.mode, engine.node_id().0, auth.epoch)
                    .map_err(|e| NetError::Auth(e.to_string()))?;
                let opener = Opener::new(&auth.key, OpenerConfig::default());
                (Some(sealer), Some(opener))
            }
            None => (None, None),
        };
        // Fragments are sealed one by one, so each leaves room for the
        // envelope. Ids start from the clock, so that a restarted node does
        // not reuse the ids of its last life's partial datagrams at once.
        let envelope = if sealer.is_some() { crate::OVERHEAD } else { 0 };
        let splitter = config.path_datagram.map(|path| {
            let first_id = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u32);
            Splitter::new(engine.node_id(), first_id, path.saturating_sub(envelope))
        });
        let reassembler = Reassembler::new(config.reassembly);
        Ok(Driver {
            me: engine.node_id(),
            engine,
            my_addr,
            unicast,
            multicast_rx,
            group,
            groups_rx: None,
            book: config.book.clone(),
            faults,
            clock,
            config,
            commands,
            commands_open: true,
            controls,
            controls_open: true,
            inputs,
            inputs_open: true,
            waiting: None,
            outgoing: VecDeque::new(),
            blocked: false,
            events_tx,
            events: Vec::new(),
            rx: crate::gro::Receiver::new(),
            stats: RuntimeStats::default(),
            warned_no_multicast: false,
            warned_conflicts: HashSet::new(),
            sealer,
            opener,
            sealed: Vec::new(),
            opened: Vec::new(),
            splitter,
            gso: crate::gso::supported(),
            reassembler,
        })
    }

    async fn run(
        mut self,
        mut shutdown: oneshot::Receiver<()>,
    ) -> Result<(E, RuntimeStats), NetError> {
        tracing::debug!(node = %self.me, addr = %self.my_addr, group = ?self.group, "node started");
        let mut last_work = std::time::Instant::now();
        loop {
            let (busy, worked) = self.turn();
            let spinning = !self.config.spin.is_zero() && {
                let now = std::time::Instant::now();
                if worked {
                    last_work = now;
                }
                now.duration_since(last_work) < self.config.spin
            };
            if busy || spinning {
                // More input is waiting, or may come soon: go round again,
                // but let the runtime's I/O driver (and the runtime's other
                // tasks) run between turns.
                if shutdown_asked(&mut shutdown) {
                    break;
                }
                if !busy {
                    // Spinning: give the CPU to any other runnable thread
                    // (another daemon, a client) first.
                    std::thread::yield_now();
                }
                tokio::task::yield_now().await;
                continue;
            }
            match self.wait(&mut shutdown).await {
                Wake::Shutdown => break,
                Wake::Command(Some(Command::Multicast(payload))) => {
                    self.stats.commands += 1;
                    self.waiting = Some(payload);
                }
                Wake::Command(None) => self.commands_open = false,
                Wake::Control(Some(f)) => self.run_control(f),
                Wake::Control(None) => self.controls_open = false,
                Wake::Input(Some(f)) => self.run_control(f),
                Wake::Input(None) => self.inputs_open = false,
                Wake::Io | Wake::Timer => {}
            }
        }
        tracing::debug!(node = %self.me, stats = ?self.stats, "node stopped");
        Ok((self.engine, self.stats))
    }

    /// One turn of the loop. Returns whether a batch limit was hit (more
    /// input is likely waiting) and whether anything came in or went out.
    fn turn(&mut self) -> (bool, bool) {
        self.stats.turns += 1;
        let before = (
            self.stats.datagrams_received,
            self.stats.datagrams_sent,
            self.stats.commands,
        );
        while let Ok(f) = self.controls.try_recv() {
            self.run_control(f);
        }
        let mut busy = self.accept_inputs();
        busy |= self.receive_all();
        self.release_delayed();
        self.fire_timer();
        busy |= self.accept_commands();
        self.send_pending();
        let handed = self.hand_over_events();
        let after = (
            self.stats.datagrams_received,
            self.stats.datagrams_sent,
            self.stats.commands,
        );
        (busy, handed || before != after)
    }

    fn run_control(&mut self, f: Control<E>) {
        f(&mut self.engine, self.clock.now(), &self.stats);
    }

    /// Runs queued inputs while the engine accepts them, at most
    /// `command_batch_max` per turn. Returns whether that limit was hit.
    fn accept_inputs(&mut self) -> bool {
        for _ in 0..self.config.command_batch_max {
            if !self.inputs_open || !self.engine.accepts_input() {
                return false;
            }
            match self.inputs.try_recv() {
                Ok(f) => {
                    self.stats.commands += 1;
                    self.run_control(f);
                }
                Err(mpsc::error::TryRecvError::Empty) => return false,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.inputs_open = false;
                    return false;
                }
            }
        }
        true
    }

    // ---- 1. receive --------------------------------------------------------

    /// Drains both sockets, a batch from each. Returns whether a batch filled.
    fn receive_all(&mut self) -> bool {
        let mut full = self.receive_batch(Socket::Unicast);
        if self.multicast_rx.is_some() {
            full |= self.receive_batch(Socket::Multicast);
        }
        if self.groups_rx.is_some() {
            full |= self.receive_batch(Socket::Groups);
        }
        full
    }

    fn receive_batch(&mut self, which: Socket) -> bool {
        let mut taken = 0;
        while taken < self.config.recv_batch_max {
            let socket = match which {
                Socket::Unicast => &self.unicast,
                Socket::Multicast => self.multicast_rx.as_ref().expect("checked by caller"),
                Socket::Groups => self.groups_rx.as_ref().expect("checked by caller"),
            };
            match self.rx.receive(socket) {
                Ok(run) => {
                    taken += run.count();
                    self.on_run(run);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    // E.g. an ICMP error reported on the socket: not fatal.
                    self.stats.io_errors += 1;
                    tracing::debug!(node = %self.me, error = %e, "receive failed");
                    return false;
                }
            }
        }
        true
    }

    /// Handles each datagram of a receive in turn.
    fn on_run(&mut self, run: crate::gro::Run) {
        if run.segment > 0 {
            self.stats.gro_runs += 1;
        }
        // The buffer is lent out while the datagrams are handled, which
        // needs the rest of the driver.
        let mut rx = std::mem::take(&mut self.rx);
        for range in run.datagrams() {
            self.on_datagram(&mut rx.buf_mut()[range], run.from);
        }
        self.stats.receive_truncated = rx.truncated;
        self.rx = rx;
    }

    fn on_datagram(&mut self, datagram: &mut [u8], from: SocketAddr) {
        self.stats.datagrams_received += 1;
        self.stats.bytes_received += datagram.len() as u64;
        if from == self.my_addr {
            // Our own IP multicast, looped back: the engine never expects it.
            self.stats.own_filtered += 1;
            return;
        }
        let len = match self.open(from, datagram) {
            Some(len) => len,
            None => {
                self.stats.auth_dropped += 1;
                return;
            }
        };
        let datagram = &datagram[..len];
        let Some(node) = self.sender(from, datagram) else {
            return;
        };
        let now = self.clock.now();
        let copies = self.faults.as_mut().map_or(1, Faults::copies);
        self.stats.fault_duplicates += copies as u64 - 1;
        for _ in 0..copies {
            self.on_copy(now, node, datagram);
        }
    }

    /// Hands one copy of `datagram` from `node` to the engine, or drops or
    /// holds it, as the fault layer decides.
    fn on_copy(&mut self, now: Instant, node: NodeId, datagram: &[u8]) {
        let verdict = match self.faults.as_mut() {
            Some(faults) => faults.judge(now),
            None => Verdict::Deliver,
        };
        match verdict {
            Verdict::Deliver => {
                self.stats
                    .deliver(&mut self.engine, &mut self.reassembler, now, node, datagram);
            }
            Verdict::Drop => self.stats.fault_drops += 1,
            Verdict::DelayUntil(due) => {
                self.stats.fault_delays += 1;
                let faults = self.faults.as_mut().expect("verdict came from it");
                faults.hold(due, node, datagram);
            }
        }
    }

    /// The member that sent the (opened) `datagram` from `from`; a learning
    /// book may bind its slot to `from` first. `None`: dropped and counted.
    fn sender(&mut self, from: SocketAddr, datagram: &[u8]) -> Option<NodeId> {
        let claimed = datagram
            .get(4..8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        if let Some(node) = self.book.sender(from, claimed) {
            return Some(node);
        }
        // Only a well-formed header may bind a slot: without a cluster key,
        // stray bytes on loopback must not take one.
        let learned = match shoal_wire::decode_header(datagram) {
            Ok(_) => self.book.learn(from, claimed),
            Err(_) => Learned::Refused,
        };
        match learned {
            Learned::Bound(node) => {
                tracing::info!(node = %self.me, slot = self.book.slot(node), %from, "learned a daemon's address");
                Some(node)
            }
            Learned::Refused => {
                self.stats.unknown_source += 1;
                tracing::trace!(node = %self.me, %from, "datagram from unknown address");
                None
            }
            conflict => {
                self.slot_conflict(from, conflict);
                None
            }
        }
    }

    /// Counts a slot conflict, warning once per address.
    fn slot_conflict(&mut self, from: SocketAddr, conflict: Learned) {
        self.stats.slot_conflicts += 1;
        if self.warned_conflicts.len() >= CONFLICTS_WARNED || !self.warned_conflicts.insert(from) {
            return;
        }
        match conflict {
            Learned::SlotTaken { slot, by } => tracing::warn!(
                node = %self.me, %from, slot, bound_to = %by,
                "datagram claims a slot bound to another address: dropped (two daemons configured with one slot?)"
            ),
            Learned::AddressTaken { slot, claimed } => tracing::warn!(
                node = %self.me, %from, slot, claimed,
                "datagram claims another slot than its address is bound to: dropped"
            ),
            Learned::Bound(_) | Learned::Refused => {}
        }
    }

    /// Opens a sealed datagram from `from` in place: on success
    /// `datagram[..len]` holds the datagram inside. In a slotted book its
    /// Shoal packet header must name the envelope's sender; in a plain book
    /// (engines with formats of their own, such as the Ring's) the
    /// envelope's sender must be the member listed at `from`.
    fn open(&mut self, from: SocketAddr, datagram: &mut [u8]) -> Option<usize> {
        let Some(opener) = self.opener.as_mut() else {
            return Some(datagram.len());
        };
        let (sender, plain) = match opener.open(datagram, &mut self.opened) {
            Ok(o) => (o.sender, o.datagram.to_vec()),
            Err(e) => {
                tracing::trace!(node = %self.me, error = %e, "datagram refused by authentication");
                return None;
            }
        };
        // The key proves the cluster, not the member: the packet must claim
        // the sealer's own slot (the slot check against the address follows).
        if self.book.is_slotted() {
            let header_sender = plain
                .get(4..8)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))?;
            if self.book.slot(NodeId(header_sender)) != self.book.slot(NodeId(sender)) {
                return None;
            }
        } else if self.book.node(from) != Some(NodeId(sender)) {
            return None;
        }
        datagram[..plain.len()].copy_from_slice(&plain);
        Some(plain.len())
    }

    /// Seals an outgoing datagram when authentication is on.
    fn seal(&mut self, payload: Bytes) -> Option<Bytes> {
        let Some(sealer) = self.sealer.as_mut() else {
            return Some(payload);
        };
        match sealer.seal(&payload, &mut self.sealed) {
            Ok(()) => Some(Bytes::copy_from_slice(&self.sealed)),
            Err(e) => {
                tracing::error!(node = %self.me, error = %e, "cannot seal: datagram dropped");
                None
            }
        }
    }

    // ---- 2. delayed datagrams ---------------------------------------------

    fn release_delayed(&mut self) {
        let Some(faults) = self.faults.as_mut() else {
            return;
        };
        let now = self.clock.now();
        while let Some((from, datagram)) = faults.pop_due(now) {
            let (engine, joiner) = (&mut self.engine, &mut self.reassembler);
            self.stats.deliver(engine, joiner, now, from, &datagram);
        }
    }

    // ---- 3. timers ----------------------------------------------------------

    fn fire_timer(&mut self) {
        let now = self.clock.now();
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
        }
    }

    // ---- 4. application commands -------------------------------------------

    /// Accepts multicasts until the window fills, the channel is empty or
    /// the per-turn limit is reached. Returns whether the limit was reached.
    fn accept_commands(&mut self) -> bool {
        if self.blocked {
            // The socket is full: let the application feel back-pressure.
            return false;
        }
        for _ in 0..self.config.command_batch_max {
            let Some(payload) = self.next_payload() else {
                return false;
            };
            if !self.multicast(payload) {
                return false;
            }
        }
        true
    }

    fn next_payload(&mut self) -> Option<Bytes> {
        if let Some(payload) = self.waiting.take() {
            return Some(payload);
        }
        if !self.commands_open {
            return None;
        }
        match self.commands.try_recv() {
            Ok(Command::Multicast(payload)) => {
                self.stats.commands += 1;
                Some(payload)
            }
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => {
                self.commands_open = false;
                None
            }
        }
    }

    /// Returns false when flow control refused it (it waits in `waiting`).
    fn multicast(&mut self, payload: Bytes) -> bool {
        let now = self.clock.now();
        match self.engine.multicast(now, payload.clone()) {
            Ok(_seq) => true,
            Err(SendError::WindowFull) => {
                self.stats.window_full += 1;
                self.waiting = Some(payload);
                false
            }
            Err(e @ SendError::TooLarge { .. }) => {
                self.stats.too_large += 1;
                tracing::warn!(node = %self.me, error = %e, "multicast refused");
                true
            }
        }
    }

    // ---- 5. send -------------------------------------------------------------

    /// Sends what is queued, pulling more from the engine while the socket
    /// takes it: up to `PULL_MAX` datagrams at a time, so that those to
    /// one address leave together.
    fn send_pending(&mut self) {
        loop {
            while let Some(out) = self.outgoing.front() {
                let segmented = out.segmented();
                let result = if segmented {
                    let bufs: Vec<IoSlice<'_>> = std::iter::once(&out.payload)
                        .chain(out.more.iter())
                        .map(|b| IoSlice::new(b))
                        .collect();
                    crate::gso::send(&self.unicast, out.to, &bufs, out.segment)
                } else {
                    self.unicast.try_send_to(&out.payload, out.to).map(|_| ())
                };
                match result {
                    Ok(()) => {
                        self.stats.datagrams_sent += if segmented {
                            self.stats.segmented_sends += 1;
                            out.len.div_ceil(out.segment) as u64
                        } else {
                            1
                        };
                        self.stats.bytes_sent += out.len as u64;
                        self.outgoing.pop_front();
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.stats.send_would_block += 1;
                        self.blocked = true;
                        return;
                    }
                    Err(e) if segmented => self.gso_refused(e),
                    Err(e) => {
                        // E.g. ECONNREFUSED left by a dead peer's ICMP: drop
                        // this datagram, keep the node running.
                        self.stats.io_errors += 1;
                        tracing::debug!(node = %self.me, to = %out.to, error = %e, "send failed");
                        self.outgoing.pop_front();
                    }
                }
            }
            self.blocked = false;
            if !self.pull_transmits() {
                return;
            }
        }
    }

    /// Queues up to `PULL_MAX` of the engine's datagrams; false if it had
    /// none.
    fn pull_transmits(&mut self) -> bool {
        let now = self.clock.now();
        for pulled in 0..PULL_MAX {
            self.change_groups();
            if let Some(transmit) = self.engine.poll_transmit(now) {
                self.address(Target::Engine(transmit.destination), transmit.payload);
                continue;
            }
            let Some(transmit) = self.engine.poll_group_transmit(now) else {
                return pulled > 0;
            };
            self.address(Target::Group(transmit.group), transmit.payload);
        }
        true
    }

    /// Joins and leaves the groups the engine asks for, on the socket of
    /// the engine's groups (made at the first join). A failure is logged
    /// and counted, never fatal: the engine's recovery repairs what a
    /// member not in the group misses.
    fn change_groups(&mut self) {
        while let Some(change) = self.engine.poll_group_change() {
            self.stats.group_changes += 1;
            let (group, join) = match change {
                GroupChange::Join(g) => (g, true),
                GroupChange::Leave(g) => (g, false),
            };
            if let Err(e) = self.change_group(group, join) {
                self.stats.group_change_errors += 1;
                tracing::warn!(node = %self.me, %group, join, error = %e, "IP multicast group change failed");
            }
        }
    }

    fn change_group(&mut self, group: SocketAddr, join: bool) -> Result<(), NetError> {
        if self.groups_rx.is_none() {
            if !join {
                return Ok(());
            }
            let socket = crate::socket::group_socket(group, &self.config.groups)?;
            self.groups_rx = Some(UdpSocket::from_std(socket).map_err(NetError::Runtime)?);
        }
        let socket = self.groups_rx.as_ref().expect("made above");
        let port = socket.local_addr().map_err(NetError::Runtime)?.port();
        if port != group.port() {
            return Err(NetError::Runtime(io::Error::other(format!(
                "the group socket is bound to port {port}, not {}",
                group.port()
            ))));
        }
        crate::socket::change_group_ref(socket, group, &self.config.groups.multicast, join)
    }

    /// The kernel refused a segmented send: the run at the head of the
    /// queue, and every later one, goes one datagram per call.
    fn gso_refused(&mut self, error: io::Error) {
        if self.gso {
            self.gso = false;
            tracing::info!(node = %self.me, %error, "segmented sends (UDP GSO) refused: one datagram per send from now on");
        }
        let runs: Vec<Outgoing> = self.outgoing.drain(..).collect();
        for out in runs {
            if !out.segmented() {
                self.outgoing
                    .push_back(Outgoing::new(out.to, out.payload, 0));
                continue;
            }
            let all = out.joined();
            for start in (0..all.len()).step_by(out.segment) {
                let end = (start + out.segment).min(all.len());
                self.outgoing
                    .push_back(Outgoing::new(out.to, all.slice(start..end), 0));
            }
        }
    }

    /// Queues a transmit for its socket address(es), in fragments when it
    /// is larger than the path.
    fn address(&mut self, target: Target, payload: Bytes) {
        let Some(splitter) = self.splitter.as_mut() else {
            return self.address_one(target, payload);
        };
        if !splitter.splits(payload.len()) {
            return self.address_one(target, payload);
        }
        let transmit = (target, payload);
        let max = splitter.max();
        let mut fragments = Vec::new();
        let sender = self
            .book
            .is_slotted()
            .then(|| claimed_sender(&transmit.1))
            .flatten()
            .unwrap_or_else(|| self.engine.node_id());
        let count = splitter.split_as(sender, &transmit.1, &mut fragments);
        if count == 0 {
            tracing::warn!(node = %self.me, len = transmit.1.len(), "datagram too large to fragment: dropped");
            return;
        }
        self.stats.datagrams_split += 1;
        self.stats.fragments_sent += count as u64;
        let fragments = Bytes::from(fragments);
        if !self.gso || self.faults.is_some() {
            // One by one: the fault layer judges each datagram on the wire.
            for start in (0..fragments.len()).step_by(max) {
                let end = (start + max).min(fragments.len());
                self.address_one(transmit.0, fragments.slice(start..end));
            }
            return;
        }
        let Some((wire, segment)) = self.seal_run(&fragments, max) else {
            return;
        };
        let run = crate::gso::segments_per_send(segment) * segment;
        for start in (0..wire.len()).step_by(run) {
            let end = (start + run).min(wire.len());
            self.queue(transmit.0, wire.slice(start..end), segment);
        }
    }

    /// Seals each fragment of `fragments` (of `max` bytes, the last
    /// shorter) when authentication is on; returns them back to back and
    /// their size on the wire.
    fn seal_run(&mut self, fragments: &Bytes, max: usize) -> Option<(Bytes, usize)> {
        let Some(sealer) = self.sealer.as_mut() else {
            return Some((fragments.clone(), max));
        };
        let mut wire =
            Vec::with_capacity(fragments.len() + fragments.len().div_ceil(max) * crate::OVERHEAD);
        for fragment in fragments.chunks(max) {
            if let Err(e) = sealer.seal(fragment, &mut self.sealed) {
                tracing::error!(node = %self.me, error = %e, "cannot seal: datagram dropped");
                return None;
            }
            wire.extend_from_slice(&self.sealed);
        }
        Some((Bytes::from(wire), max + crate::OVERHEAD))
    }

    /// Queues one datagram (sealed here) for its socket address(es).
    fn address_one(&mut self, target: Target, payload: Bytes) {
        let Some(payload) = self.seal(payload) else {
            return;
        };
        let copies = self.faults.as_mut().map_or(1, Faults::sent_copies);
        match copies {
            0 => self.stats.fault_send_drops += 1,
            2 => self.stats.fault_send_duplicates += 1,
            _ => {}
        }
        for _ in 0..copies {
            self.queue(target, payload.clone(), 0);
        }
    }

    /// Queues one (sealed) datagram, or a run of `segment`-byte fragments,
    /// for its socket address(es).
    fn queue(&mut self, target: Target, payload: Bytes, segment: usize) {
        let destination = match target {
            Target::Engine(destination) => destination,
            Target::Group(group) => return self.push_outgoing(group, payload, segment),
        };
        let to = match destination {
            Destination::Node(node) => match self.book.addr(node) {
                Some(addr) => addr,
                None => {
                    tracing::warn!(node = %self.me, to = %node, "no address for member");
                    return;
                }
            },
            Destination::Multicast => match self.group {
                Some(group) => group,
                None => return self.fan_out(payload, segment),
            },
        };
        self.push_outgoing(to, payload, segment);
    }

    /// Queues a datagram (or a run of fragments) for `to`. While segmented
    /// sends work, a single datagram joins the last run queued for `to`
    /// when it can (`Outgoing::takes`): the datagrams to each address keep
    /// their order, and those to one address go in one system call.
    fn push_outgoing(&mut self, to: SocketAddr, payload: Bytes, segment: usize) {
        if self.gso && segment == 0 {
            let last = self
                .outgoing
                .iter_mut()
                .rev()
                .take(JOIN_LOOKBACK)
                .find(|o| o.to == to);
            if let Some(run) = last.filter(|run| run.takes(payload.len())) {
                run.append(payload);
                return;
            }
        }
        self.outgoing.push_back(Outgoing::new(to, payload, segment));
    }

    /// The engine wants IP multicast but none is configured: unicast to all.
    fn fan_out(&mut self, payload: Bytes, segment: usize) {
        if !self.warned_no_multicast {
            self.warned_no_multicast = true;
            tracing::warn!(node = %self.me, "engine asked for IP multicast, none configured: unicast fan-out");
        }
        let me = self.book.slot(self.engine.node_id());
        let peers: Vec<SocketAddr> = self
            .book
            .bound()
            .filter(|(i, _)| *i != me)
            .map(|(_, addr)| addr)
            .collect();
        for addr in peers {
            self.push_outgoing(addr, payload.clone(), segment);
        }
    }

    // ---- 6. events -----------------------------------------------------------

    fn drain_events(&mut self) {
        while let Some(event) = self.engine.poll_event() {
            self.events.push(event);
        }
    }

    fn hand_over_events(&mut self) -> bool {
        self.drain_events();
        if self.events.is_empty() {
            return false;
        }
        let batch = EventBatch {
            at: self.clock.now(),
            events: std::mem::take(&mut self.events),
        };
        // The application stopped listening: its loss, keep running.
        let _ = self.events_tx.send(batch);
        true
    }

    // ---- waiting ---------------------------------------------------------------

    /// When the loop must wake even without I/O.
    fn deadline(&self) -> Option<Instant> {
        let engine = self.engine.poll_timeout();
        let delayed = self.faults.as_ref().and_then(Faults::next_due);
        let retry = self
            .waiting
            .is_some()
            .then(|| self.clock.now() + self.config.window_retry);
        [engine, delayed, retry].into_iter().flatten().min()
    }

    async fn wait(&mut self, shutdown: &mut oneshot::Receiver<()>) -> Wake<E> {
        let deadline = self.deadline().map(|t| self.clock.os_instant(t));
        let sleep = async move {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        let take_commands = self.waiting.is_none() && !self.blocked && self.commands_open;
        let take_inputs = self.inputs_open && self.engine.accepts_input();
        tokio::select! {
            biased;
            _ = shutdown => Wake::Shutdown,
            _ = self.unicast.readable() => Wake::Io,
            _ = readable(self.multicast_rx.as_ref()) => Wake::Io,
            _ = readable(self.groups_rx.as_ref()) => Wake::Io,
            _ = self.unicast.writable(), if self.blocked => Wake::Io,
            command = self.commands.recv(), if take_commands => Wake::Command(command),
            control = self.controls.recv(), if self.controls_open => Wake::Control(control),
            input = self.inputs.recv(), if take_inputs => Wake::Input(input),
            _ = sleep => Wake::Timer,
        }
    }
}

impl RuntimeStats {
    /// Hands a received datagram to the engine, or a fragment to the
    /// reassembler (and the datagram to the engine once whole).
    fn deliver<E: Engine>(
        &mut self,
        engine: &mut E,
        reassembler: &mut Reassembler,
        now: Instant,
        from: NodeId,
        datagram: &[u8],
    ) {
        if !shoal_wire::fragment::is_fragment(datagram) {
            engine.handle_datagram(now, from, datagram);
            return;
        }
        let whole = reassembler.handle_fragment(now, from, datagram);
        let r = reassembler.stats();
        self.fragments_received = r.fragments;
        self.datagrams_joined = r.datagrams;
        self.fragments_refused = r.malformed;
        self.partial_dropped = r.timed_out + r.evicted;
        if let Some(whole) = whole {
            // A fresh buffer: the engine may keep slices of it.
            engine.handle_datagram_bytes(now, from, &whole);
        }
    }
}

/// The sender a Shoal packet datagram claims (its header's bytes 4..8), as
/// a receiver reads it from an unfragmented datagram ([`Driver::sender`]).
/// Fragments of the datagram claim the same: a daemon that rejoined under a
/// new incarnation sends under its new id, and the last packets of its old
/// one under the old id. Only with a slotted book: a plain one lists each
/// node under one id, which its fragments claim.
fn claimed_sender(datagram: &[u8]) -> Option<NodeId> {
    let header = shoal_wire::decode_header(datagram).ok()?;
    Some(NodeId(header.sender))
}

/// Addresses a node warns about for slot conflicts, at most (then it only
/// counts them).
const CONFLICTS_WARNED: usize = 64;

/// The channels between a node and its application.
/// A node not yet running, the driver's ends of its channels, and its
/// shutdown signal (`Node::handles`).
type Handles<E> = (Node<E>, Channels<E>, oneshot::Receiver<()>);

struct Channels<E: Engine> {
    commands: mpsc::Receiver<Command>,
    controls: mpsc::UnboundedReceiver<Control<E>>,
    inputs: mpsc::Receiver<Control<E>>,
    events: mpsc::UnboundedSender<EventBatch<E::Event>>,
}

#[derive(Clone, Copy)]
enum Socket {
    Unicast,
    Multicast,
    Groups,
}

async fn readable(socket: Option<&UdpSocket>) -> io::Result<()> {
    match socket {
        Some(socket) => socket.readable().await,
        None => std::future::pending().await,
    }
}

fn shutdown_asked(shutdown: &mut oneshot::Receiver<()>) -> bool {
    !matches!(
        shutdown.try_recv(),
        Err(oneshot::error::TryRecvError::Empty)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(len: usize) -> Outgoing {
        Outgoing::new("127.0.0.1:1".parse().unwrap(), Bytes::from(vec![0; len]), 0)
    }

    #[test]
    fn a_run_takes_datagrams_of_its_size_and_one_shorter_to_close_it() {
        let mut run = out(1_000);
        assert!(run.takes(1_000) && run.takes(1) && !run.takes(1_001) && !run.takes(0));
        run.append(Bytes::from(vec![1; 1_000]));
        assert_eq!((run.segment, run.len), (1_000, 2_000));
        assert!(run.segmented());
        run.append(Bytes::from(vec![2; 300]));
        // Closed by the shorter one.
        assert!(!run.takes(300) && !run.takes(1_000));
        let joined = run.joined();
        assert_eq!(joined.len(), 2_300);
        assert_eq!((joined[999], joined[1_000], joined[2_000]), (0, 1, 2));
    }

    #[test]
    fn a_run_stays_within_one_send() {
        let mut run = out(1_000);
        for _ in 1..crate::gso::MAX_SEGMENTS {
            assert!(run.takes(1_000));
            run.append(Bytes::from(vec![0; 1_000]));
        }
        assert!(!run.takes(1_000) && !run.takes(10));
        let mut big = out(20_000);
        big.append(Bytes::from(vec![0; 20_000]));
        assert!(big.takes(20_000));
        big.append(Bytes::from(vec![0; 20_000]));
        assert!(!big.takes(1));
        // A single datagram of one byte or a fragment run of several.
        assert!(!out(0).takes(0) && !out(0).segmented());
        let fragments = Outgoing::new(
            "127.0.0.1:1".parse().unwrap(),
            Bytes::from(vec![0; 2_944]),
            1_472,
        );
        assert!(fragments.segmented() && fragments.takes(1_472) && !fragments.takes(1_473));
    }
}
