//! The daemon process: client listeners, one task per connection, and the
//! core task that owns the sessions and talks to the cluster engine's node.
//!
//! ```text
//!  client ──frames──▶ reader task ──Input──▶ ┌──────────┐ ──Command──▶ node task
//!  client ◀─frames─── writer task ◀─Frame─── │ core task│ ◀─EventBatch─ (Cluster engine,
//!                     (bounded queue)         └──────────┘                UDP to peer daemons)
//! ```
//!
//! Every task runs on the daemon's one thread (a current-thread runtime):
//! a hand-over between them is a task wake-up, never a wake-up of another
//! thread, which on a virtual machine costs tens of microseconds.
//!
//! Back-pressure: a reader waits when the core's input queue is full, and the
//! core stops taking input while more than `PENDING_MAX` bytes wait for the
//! daemons' group, so a fast sender is blocked (its socket fills), never
//! buffered without bound. A slow *receiver* is disconnected when its
//! outgoing queue (`limits.client_queue` bytes) is full.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use shoal_core::cluster::{self, Cluster, ClusterEvent};
use shoal_core::vsync::{Event, RemovedReason};
use shoal_wire::client::{self, code, Frame, Reason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, oneshot};

use super::config::DaemonConfig;
use super::core::{Core, Output, SessionId};
use crate::{
    AddressBook, Auth, Clock, Command, Control, EventBatch, Mode, Node, NodeConfig, RuntimeStats,
};

/// Bytes of client items the core holds for the daemons' group before it
/// stops reading clients.
const PENDING_MAX: usize = 4 << 20;
/// How long a connection being closed (a slow client) may take to read what
/// was already being written and the reason it is closed.
const CLOSE_GRACE: Duration = Duration::from_secs(30);
/// Under load, items wait for a fuller batch while one of this daemon's
/// batches is being ordered (sequenced, replicated, disseminated), at most
/// this long: a batch per round trip instead of one per client frame. At
/// low load nothing is being ordered and a frame goes at once; a full
/// batch always goes at once.
const HOLD_MAX: Duration = Duration::from_millis(1);
/// Size of the buffers a client's frames are gathered in.
const OUT_CHUNK: usize = 64 * 1024;
/// How long a graceful shutdown waits for its goodbye and its leave.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(3);

/// Why the daemon could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("another daemon is serving {0}")]
    SocketInUse(PathBuf),
    #[error(transparent)]
    Net(#[from] crate::NetError),
    #[error("configuration: {0}")]
    Config(String),
    #[error("cluster settings: {0}")]
    Cluster(#[from] shoal_core::vsync::ConfigError),
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// What connection tasks tell the core.
enum Input {
    Opened {
        id: SessionId,
        frames: mpsc::UnboundedSender<Bytes>,
        queued: Arc<AtomicUsize>,
        close: oneshot::Sender<Option<Frame>>,
        tcp: bool,
    },
    /// The frames one read completed, in order.
    Frames(SessionId, Vec<Frame>),
    Malformed(SessionId, String),
    Gone(SessionId),
}

/// The core task's handle on one connection.
struct Conn {
    frames: mpsc::UnboundedSender<Bytes>,
    /// Bytes queued and not yet written (the writer subtracts), `out`
    /// included.
    queued: Arc<AtomicUsize>,
    close: Option<oneshot::Sender<Option<Frame>>>,
    tcp: bool,
    /// Frames of this round of outputs, handed to the writer as one chunk
    /// when the round ends (one hand-over and one write for many frames).
    out: BytesMut,
}

/// Where the daemon stands; `shoal status` and tests read it from the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// Goodbye sent; waiting for it to come back in the total order.
    SayingGoodbye,
    /// Leave asked; waiting for the view without this daemon.
    Leaving,
}

/// Runs a daemon until SIGTERM or SIGINT (or `stop` fires). Blocks.
pub fn run(config: DaemonConfig, stop: Option<oneshot::Receiver<()>>) -> Result<(), DaemonError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_error("tokio runtime"))?;
    runtime.block_on(serve(config, stop))
}

/// The configured daemons' addresses, sorted: the index is the slot.
fn slots(config: &DaemonConfig) -> (Vec<SocketAddr>, u32) {
    let mut addrs: Vec<SocketAddr> = config.peers.clone();
    addrs.push(config.listen);
    addrs.sort();
    addrs.dedup();
    let slot = addrs
        .iter()
        .position(|a| *a == config.listen)
        .expect("listen is in the list") as u32;
    (addrs, slot)
}

/// An incarnation that differs across restarts: wall-clock time in units of
/// 8 ms (it wraps after about 37 hours, harmlessly: only equality with the
/// previous incarnation of the same slot would matter).
fn incarnation() -> u32 {
    (unix_ms() / 8) as u32
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The membership engine, the address book and this daemon's slot: with
/// `discovery`, the configured slot and a book that learns the others'
/// addresses from their datagrams; else the slots of the sorted static list.
fn membership(
    config: &DaemonConfig,
    cluster_config: cluster::Config,
    incarnation: u32,
    now: shoal_core::Instant,
) -> Result<(Cluster, AddressBook, u32), DaemonError> {
    let seed = |slot: u32| u64::from(incarnation) << 8 | u64::from(slot);
    if config.discovery.is_some() {
        let slot = config
            .slot
            .filter(|s| (*s as usize) < cluster::MAX_SLOTS)
            .ok_or_else(|| DaemonError::Config("`discovery` needs a `slot` in 0..=255".into()))?;
        let engine = Cluster::discovering(slot, incarnation, cluster_config, seed(slot), now)?;
        let book = AddressBook::learning(cluster::SLOT_BITS, slot as usize, config.listen)?;
        return Ok((engine, book, slot));
    }
    let (addrs, slot) = slots(config);
    let engine = Cluster::new(
        slot,
        addrs.len() as u32,
        incarnation,
        cluster_config,
        seed(slot),
        now,
    )?;
    let book = AddressBook::slotted(addrs, cluster::SLOT_BITS)?;
    Ok((engine, book, slot))
}

fn start_node(config: &DaemonConfig) -> Result<Node<Cluster>, DaemonError> {
    let clock = Clock::new();
    let incarnation = incarnation();
    let config_error = |e: super::config::ConfigError| DaemonError::Config(e.to_string());
    // pbcast's first phase goes by IP multicast only with `multicast`;
    // `discovery` alone keeps data on the unicast relay tree.
    let ip_multicast = config.multicast_group().map_err(config_error)?.is_some();
    let mut cluster_config = config.cluster.clone();
    cluster_config.vsync.pbcast.ip_multicast = ip_multicast;
    let (engine, book, slot) = membership(config, cluster_config, incarnation, clock.now())?;
    // `listen`, and the group on `[ip_multicast]`'s interface and TTL.
    let endpoint = config.bind().map_err(config_error)?;
    let mut node_config = NodeConfig::new(book);
    node_config.command_queue_len = 16;
    node_config.faults = config.fault_config(u64::from(incarnation) << 8 | u64::from(slot));
    if node_config.faults.is_active() {
        tracing::warn!(faults = ?node_config.faults, "[faults]: injecting faults on received datagrams (a test aid)");
    }
    node_config.auth = match &config.auth {
        Some(auth) => Some(Auth {
            key: auth
                .cluster_key()
                .map_err(|e| DaemonError::Config(e.to_string()))?,
            mode: if auth.encrypt {
                Mode::Encrypt
            } else {
                Mode::Authenticate
            },
            epoch: unix_ms(),
        }),
        None => {
            tracing::warn!("no [auth] key: datagrams between daemons are not authenticated");
            None
        }
    };
    // The engine runs on the daemon's own (current-thread) runtime, beside
    // the core task and the connections: one thread, so a client's frame
    // reaches the engine, and a delivery the client, without waking
    // another thread.
    let node = Node::spawn_task(engine, endpoint, node_config, clock)?;
    tracing::info!(node = %config.node, slot, id = %node.id(), listen = %config.listen, max_datagram = config.datagram_size(), "daemon started");
    Ok(node)
}

/// Binds the Unix socket, replacing a stale file but never a live daemon's.
fn bind_unix(path: &Path) -> Result<UnixListener, DaemonError> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(DaemonError::SocketInUse(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(io_error(format!("remove stale {}", path.display())))?;
    }
    let listener =
        UnixListener::bind(path).map_err(io_error(format!("bind {}", path.display())))?;
    // Only this user may talk to the daemon (docs/daemon.md).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_error(format!("chmod {}", path.display())))?;
    Ok(listener)
}

async fn serve(
    config: DaemonConfig,
    stop: Option<oneshot::Receiver<()>>,
) -> Result<(), DaemonError> {
    let mut node = start_node(&config)?;
    let unix = bind_unix(&config.socket)?;
    // Where the TCP and metrics listeners are, as bound (a port 0 in the
    // configuration asks for any free port), for `Status`.
    let mut endpoints = Vec::new();
    let tcp = match &config.tcp {
        Some(t) => {
            let listener = TcpListener::bind(t.address)
                .await
                .map_err(io_error(format!("bind {}", t.address)))?;
            endpoints.push(format!("tcp clients on {}", bound(&listener, t.address)?));
            Some(listener)
        }
        None => None,
    };
    let batch_max = config.cluster.vsync.max_payload();
    let core = Core::new(&config.node, config.limits.clone(), batch_max);
    // Each input is what one read of one connection completed (at most
    // 64 KiB of frames, or one large frame).
    let (inputs_tx, inputs_rx) = mpsc::channel(64);
    let limits = client::Limits {
        name_max: config.limits.group_name_len.max(128),
        payload_max: config.limits.message_size,
        ..client::Limits::default()
    };
    let accept = tokio::spawn(accept_loop(unix, tcp, inputs_tx, limits));
    let (scrapes_tx, scrapes_rx) = mpsc::channel(16);
    let metrics = match &config.metrics {
        Some(m) => {
            let listener = TcpListener::bind(m.address)
                .await
                .map_err(io_error(format!("bind metrics {}", m.address)))?;
            endpoints.push(format!("metrics on {}", bound(&listener, m.address)?));
            Some(tokio::spawn(super::metrics::serve(listener, scrapes_tx)))
        }
        None => None,
    };
    let events = node.take_events().expect("taken once");
    let mut task = CoreTask {
        core,
        conns: HashMap::new(),
        commands: node.commands(),
        controls: node.controls(),
        queue_limit: config.limits.client_queue,
        token: config.tcp.as_ref().map(|t| t.token.clone()),
        phase: Phase::Running,
        left: false,
        dirty: Vec::new(),
        endpoints,
    };
    let result = task.run(inputs_rx, events, scrapes_rx, &node, stop).await;
    accept.abort();
    if let Some(m) = metrics {
        m.abort();
    }
    let _ = std::fs::remove_file(&config.socket);
    // Give writers a moment to flush their last frames.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = node.stop().await?;
    tracing::info!(runtime = ?stats.1, "daemon stopped");
    result
}

struct CoreTask {
    core: Core,
    conns: HashMap<SessionId, Conn>,
    commands: mpsc::Sender<Command>,
    controls: mpsc::UnboundedSender<Control<Cluster>>,
    /// `limits.client_queue`: bytes a client may have waiting.
    queue_limit: usize,
    token: Option<String>,
    phase: Phase,
    left: bool,
    /// Connections with frames in `out` (handed over when a round ends).
    dirty: Vec<SessionId>,
    /// Status lines naming the TCP and metrics listeners' bound addresses.
    endpoints: Vec<String>,
}

/// The address `listener` (configured as `configured`) is bound to, logged.
fn bound(listener: &TcpListener, configured: SocketAddr) -> Result<SocketAddr, DaemonError> {
    let address = listener
        .local_addr()
        .map_err(io_error(format!("bind {configured}")))?;
    tracing::info!(%address, "listening");
    Ok(address)
}

async fn signal() -> io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    Ok(())
}

impl CoreTask {
    async fn run(
        &mut self,
        mut inputs: mpsc::Receiver<Input>,
        mut events: mpsc::UnboundedReceiver<EventBatch<ClusterEvent>>,
        mut scrapes: mpsc::Receiver<super::metrics::Scrape>,
        node: &Node<Cluster>,
        stop: Option<oneshot::Receiver<()>>,
    ) -> Result<(), DaemonError> {
        let stop = async move {
            match stop {
                Some(rx) => {
                    let _ = rx.await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::pin!(stop);
        let signals = signal();
        tokio::pin!(signals);
        let mut deadline: Option<tokio::time::Instant> = None;
        // When the oldest item waiting for a batch arrived.
        let mut pending_since: Option<tokio::time::Instant> = None;
        loop {
            let take_inputs = self.core.pending_bytes() < PENDING_MAX;
            // Batching under load (see HOLD_MAX): a batch that is not full
            // goes when none of ours is being ordered, or when its first
            // item has waited HOLD_MAX.
            let pending = self.core.batch_waiting();
            if !pending {
                pending_since = None;
            } else if pending_since.is_none() {
                pending_since = Some(tokio::time::Instant::now());
            }
            let hold_until = pending_since.map(|t| t + HOLD_MAX);
            let have_batch = pending
                && (self.core.full_batch()
                    || self.core.in_flight() == 0
                    || hold_until.is_some_and(|t| t <= tokio::time::Instant::now()));
            let hold = async move {
                match hold_until {
                    Some(at) if !have_batch => tokio::time::sleep_until(at).await,
                    _ => std::future::pending().await,
                }
            };
            let commands = self.commands.clone();
            let wait_deadline = async move {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = &mut stop, if self.phase == Phase::Running => {
                    self.begin_shutdown();
                    deadline = Some(tokio::time::Instant::now() + SHUTDOWN_WAIT);
                }
                _ = &mut signals, if self.phase == Phase::Running => {
                    tracing::info!("signal received: shutting down");
                    self.begin_shutdown();
                    deadline = Some(tokio::time::Instant::now() + SHUTDOWN_WAIT);
                }
                batch = events.recv() => {
                    let Some(batch) = batch else { break };
                    for ev in batch.events {
                        log_event(&ev);
                        if matches!(ev.event, Event::Removed { reason: RemovedReason::Left, .. }) {
                            self.left = true;
                        }
                        self.core.cluster_event(ev.me, ev.event);
                    }
                }
                permit = commands.reserve(), if have_batch => {
                    if let (Ok(permit), Some(batch)) = (permit, self.core.take_batch()) {
                        permit.send(Command::Multicast(batch));
                        pending_since = None;
                    }
                }
                _ = hold => {}
                Some(scrape) = scrapes.recv() => self.scrape(scrape),
                input = inputs.recv(), if take_inputs => {
                    match input {
                        Some(input) => self.input(input),
                        None => break,
                    }
                }
                _ = wait_deadline => {
                    tracing::warn!(phase = ?self.phase, "shutdown step timed out; going on");
                    deadline = self.next_shutdown_step(node);
                    if deadline.is_none() { break; }
                }
            }
            self.send_unsequenced(node);
            self.dispatch();
            match self.phase {
                Phase::SayingGoodbye if self.core.goodbye_delivered() => {
                    deadline = self.next_shutdown_step(node);
                }
                Phase::Leaving if self.left => break,
                _ => {}
            }
            self.dispatch();
        }
        self.core.close_all();
        self.dispatch();
        Ok(())
    }

    /// Unreliable and probabilistic messages go at once, by pbcast alone:
    /// no batching behind the total order, no back-pressure but pbcast's
    /// send window (a refused batch is lost and counted, as those services
    /// allow).
    fn send_unsequenced(&mut self, node: &Node<Cluster>) {
        while let Some(batch) = self.core.take_unsequenced() {
            node.control(move |engine, now, _| {
                let _ = engine.multicast_unsequenced(now, &batch);
            });
        }
    }

    fn begin_shutdown(&mut self) {
        self.core.begin_shutdown();
        self.phase = Phase::SayingGoodbye;
    }

    /// After the goodbye: close the clients and leave the daemons' group.
    fn next_shutdown_step(&mut self, node: &Node<Cluster>) -> Option<tokio::time::Instant> {
        match self.phase {
            Phase::SayingGoodbye => {
                self.core.close_all();
                self.phase = Phase::Leaving;
                if !node.control(|engine, now, _| engine.leave(now)) {
                    return None;
                }
                Some(tokio::time::Instant::now() + SHUTDOWN_WAIT)
            }
            _ => None,
        }
    }

    fn input(&mut self, input: Input) {
        match input {
            Input::Opened {
                id,
                frames,
                queued,
                close,
                tcp,
            } => {
                self.conns.insert(
                    id,
                    Conn {
                        frames,
                        queued,
                        close: Some(close),
                        tcp,
                        out: BytesMut::new(),
                    },
                );
            }
            Input::Frames(id, frames) => {
                for frame in frames {
                    self.frame(id, frame);
                }
            }
            Input::Malformed(id, why) => {
                self.core.closed(id, Reason::Disconnect);
                self.close(
                    id,
                    Some(Frame::Error {
                        code: code::MALFORMED,
                        text: why,
                    }),
                );
            }
            Input::Gone(id) => {
                self.core.closed(id, Reason::Disconnect);
                self.conns.remove(&id);
            }
        }
    }

    fn frame(&mut self, id: SessionId, frame: Frame) {
        match frame {
            Frame::Connect { name, token } => {
                let tcp = self.conns.get(&id).is_some_and(|c| c.tcp);
                let token_ok = !tcp || self.token.as_deref() == Some(token.as_str());
                self.core.connect(id, &name, token_ok);
            }
            Frame::Status => self.status(id),
            frame => self.core.frame(id, frame),
        }
    }

    /// Answers a metrics scrape: the core's figures here, the engine's on
    /// the node thread, which renders and answers.
    fn scrape(&mut self, answer: super::metrics::Scrape) {
        let figures = super::metrics::CoreFigures {
            stats: self.core.stats().clone(),
            clients: self.core.clients() as u64,
            groups: self.core.groups() as u64,
            pending_bytes: self.core.pending_bytes() as u64,
            client_queue_bytes: self
                .conns
                .values()
                .map(|c| c.queued.load(Ordering::Relaxed) as u64)
                .sum(),
        };
        let _ = self
            .controls
            .send(Box::new(move |engine: &mut Cluster, _now, runtime| {
                let _ = answer.send(super::metrics::render(&figures, engine, runtime));
            }));
    }

    /// Answers `Status` with the core's lines and the engine's, gathered on
    /// the node's thread, which sends the reply itself.
    fn status(&mut self, id: SessionId) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let frames = conn.frames.clone();
        let queued = conn.queued.clone();
        let mut lines = self.core.status_lines();
        lines.extend(self.endpoints.iter().cloned());
        let sent = self
            .controls
            .send(Box::new(move |engine: &mut Cluster, now, runtime| {
                lines.extend(engine_lines(engine, now, runtime));
                let mut text = lines.join("\n");
                text.truncate(usize::from(u16::MAX));
                if let Ok(reply) = (Frame::StatusReply { text }).to_vec() {
                    queued.fetch_add(reply.len(), Ordering::Relaxed);
                    let _ = frames.send(Bytes::from(reply));
                }
            }));
        if sent.is_err() {
            self.core.closed(id, Reason::Disconnect);
        }
    }

    fn close(&mut self, id: SessionId, frame: Option<Frame>) {
        self.flush(id);
        if let Some(mut conn) = self.conns.remove(&id) {
            if let Some(close) = conn.close.take() {
                let _ = close.send(frame);
            }
        }
    }

    /// Queues an encoded frame to a client, or disconnects it as slow when
    /// its queue would pass `limits.client_queue` bytes.
    fn queue(&mut self, id: SessionId, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.queued.load(Ordering::Relaxed) + bytes.len() > self.queue_limit {
            self.core.slow(id);
            return;
        }
        conn.queued.fetch_add(bytes.len(), Ordering::Relaxed);
        if conn.out.is_empty() {
            self.dirty.push(id);
        }
        if conn.out.capacity() - conn.out.len() < bytes.len() {
            // Whole chunks of one size: the allocator reuses freed ones
            // (or `out` takes its own back once the writer dropped it).
            conn.out.reserve(bytes.len().max(OUT_CHUNK));
        }
        conn.out.extend_from_slice(bytes);
    }

    /// Hands a connection's frames of this round to its writer.
    fn flush(&mut self, id: SessionId) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.out.is_empty() {
            return;
        }
        // The writer drops the chunk once written; the rest of `out`'s
        // buffer is reused for the next rounds' frames.
        let chunk = conn.out.split().freeze();
        if conn.frames.send(chunk).is_err() {
            self.core.closed(id, Reason::Disconnect);
            self.conns.remove(&id);
        }
    }

    /// Hands the core's outputs to the connections.
    fn dispatch(&mut self) {
        loop {
            let mut outputs = self.core.take_outputs();
            if outputs.list.is_empty() {
                self.core.recycle(outputs);
                break;
            }
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
            self.core.recycle(outputs);
        }
        for id in std::mem::take(&mut self.dirty) {
            self.flush(id);
        }
    }
}

/// `shoal status` lines about the cluster engine and the runtime.
fn engine_lines(engine: &Cluster, now: shoal_core::Instant, runtime: &RuntimeStats) -> Vec<String> {
    let v = engine.vsync();
    let c = engine.stats();
    let s = v.stats();
    let mut lines = vec![
        format!("uptime: {now}"),
        format!(
            "daemons' view: {} ({} members{}){}",
            v.view_id(),
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
                .map(|d| super::core::daemon_name(*d))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        format!("vsync state: {}", v.debug_line()),
        format!(
            "cluster: founded {}, rejoins {}, merges {}, presence sent {} received {}, unsequenced refused {}",
            c.founded, c.rejoins, c.merges, c.presence_sent, c.presence_received, c.unsequenced_refused
        ),
        format!(
            "vsync: delivered {}, views {}, takeovers {}, abandoned {}, repairs sent {} asked {}, malformed {}",
            s.delivered,
            s.views_installed,
            s.takeovers,
            s.newviews_abandoned,
            s.repairs_sent,
            s.repair_requests_sent,
            s.malformed
        ),
        format!(
            "datagrams: sent {} ({} bytes), received {} ({} bytes)",
            runtime.datagrams_sent,
            runtime.bytes_sent,
            runtime.datagrams_received,
            runtime.bytes_received
        ),
        format!(
            "drops: unknown source {}, failed authentication {}, io errors {}, too large {}, slot conflicts {}",
            runtime.unknown_source,
            runtime.auth_dropped,
            runtime.io_errors,
            runtime.too_large,
            runtime.slot_conflicts
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

fn log_event(ev: &ClusterEvent) {
    match &ev.event {
        Event::View(v) => tracing::info!(
            me = %ev.me,
            view = v.id,
            members = ?v.members,
            joined = ?v.joined,
            failed = ?v.failed,
            left = ?v.left,
            first = v.first,
            "daemons' view installed"
        ),
        Event::Removed {
            view,
            reason: RemovedReason::Left,
        } => tracing::info!(me = %ev.me, view, "left the daemons' group"),
        Event::Removed { view, reason } => {
            tracing::warn!(me = %ev.me, view, ?reason, "removed from the daemons' group; rejoining")
        }
        Event::Deliver { .. } | Event::Unsequenced { .. } => {}
    }
}

async fn accept_loop(
    unix: UnixListener,
    tcp: Option<TcpListener>,
    inputs: mpsc::Sender<Input>,
    limits: client::Limits,
) {
    let mut next_id: SessionId = 1;
    loop {
        let tcp_accept = async {
            match &tcp {
                Some(l) => l.accept().await.map(|(s, _)| s),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = unix.accept() => match r {
                Ok((stream, _)) => {
                    let (read, write) = stream.into_split();
                    open(next_id, read, write, false, &inputs, limits).await;
                    next_id += 1;
                }
                Err(e) => tracing::warn!(error = %e, "accept on the Unix socket failed"),
            },
            r = tcp_accept => match r {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    let (read, write) = stream.into_split();
                    open(next_id, read, write, true, &inputs, limits).await;
                    next_id += 1;
                }
                Err(e) => tracing::warn!(error = %e, "accept on the TCP listener failed"),
            },
        }
    }
}

async fn open<R, W>(
    id: SessionId,
    read: R,
    write: W,
    tcp: bool,
    inputs: &mpsc::Sender<Input>,
    limits: client::Limits,
) where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (frames_tx, frames_rx) = mpsc::unbounded_channel();
    let (close_tx, close_rx) = oneshot::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let opened = Input::Opened {
        id,
        frames: frames_tx,
        queued: queued.clone(),
        close: close_tx,
        tcp,
    };
    if inputs.send(opened).await.is_err() {
        return;
    }
    tokio::spawn(writer(write, frames_rx, close_rx, queued));
    tokio::spawn(reader(id, read, inputs.clone(), limits));
}

/// Reads frames and hands them to the core until EOF or a bad frame.
async fn reader<R: tokio::io::AsyncRead + Unpin>(
    id: SessionId,
    mut read: R,
    inputs: mpsc::Sender<Input>,
    limits: client::Limits,
) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        // Every frame this read completed goes to the core as one input.
        let mut frames = Vec::new();
        let mut malformed = None;
        let mut used = 0;
        loop {
            match client::decode(&buf[used..], &limits) {
                Ok(Some((frame, n))) => {
                    used += n;
                    frames.push(frame);
                }
                Ok(None) => break,
                Err(e) => {
                    malformed = Some(e.to_string());
                    break;
                }
            }
        }
        let _ = buf.split_to(used);
        if !frames.is_empty() && inputs.send(Input::Frames(id, frames)).await.is_err() {
            return;
        }
        if let Some(why) = malformed {
            let _ = inputs.send(Input::Malformed(id, why)).await;
            return;
        }
        buf.reserve(64 * 1024);
        match read.read_buf(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = inputs.send(Input::Gone(id)).await;
                return;
            }
            Ok(_) => {}
        }
    }
}

/// Writes queued frames, as many as are ready in one vectored write (no
/// copy into a write buffer); on close, writes the last frame (if any) and
/// shuts the connection.
async fn writer<W: tokio::io::AsyncWrite + Unpin>(
    mut write: W,
    mut frames: mpsc::UnboundedReceiver<Bytes>,
    mut close: oneshot::Receiver<Option<Frame>>,
    queued: Arc<AtomicUsize>,
) {
    let mut chunks: VecDeque<Bytes> = VecDeque::new();
    loop {
        tokio::select! {
            biased;
            last = &mut close => {
                // Frames queued before the close still go first.
                while let Ok(f) = frames.try_recv() {
                    chunks.push_back(f);
                }
                if let Ok(Some(f)) = last {
                    chunks.push_back(Bytes::from(f.to_vec().unwrap_or_default()));
                }
                let _ = write_chunks(&mut write, &mut chunks).await;
                let _ = write.shutdown().await;
                return;
            }
            frame = frames.recv() => {
                let Some(frame) = frame else {
                    let _ = write.shutdown().await;
                    return;
                };
                let mut cost = frame.len();
                chunks.push_back(frame);
                while cost < 256 * 1024 {
                    match frames.try_recv() {
                        Ok(f) => {
                            cost += f.len();
                            chunks.push_back(f);
                        }
                        Err(_) => break,
                    }
                }
                // A client that does not read must not keep this task in
                // a write forever after the core gave up on it: on close,
                // finish these chunks and write the reason if the client
                // reads within CLOSE_GRACE, else drop the connection. Memory
                // stays bounded: nothing more is queued for it.
                // (`write_vectored` is cancel-safe: a dropped write wrote
                // nothing, and `chunks` only advances by what was written.)
                while !chunks.is_empty() {
                    let slices = io_slices(&chunks);
                    tokio::select! {
                        r = write.write_vectored(&slices) => match r {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                drop(slices);
                                advance(&mut chunks, n);
                            }
                        },
                        last = &mut close => {
                            drop(slices);
                            while let Ok(f) = frames.try_recv() {
                                chunks.push_back(f);
                            }
                            if let Ok(Some(f)) = last {
                                chunks.push_back(Bytes::from(f.to_vec().unwrap_or_default()));
                            }
                            let finish = async {
                                write_chunks(&mut write, &mut chunks).await?;
                                write.shutdown().await
                            };
                            let _ = tokio::time::timeout(CLOSE_GRACE, finish).await;
                            return;
                        }
                    }
                }
                queued.fetch_sub(cost, Ordering::Relaxed);
            }
        }
    }
}

/// Slices per vectored write (the kernel's IOV_MAX is 1024).
const IOV_MAX: usize = 64;

/// The first `IOV_MAX` chunks, for one vectored write.
fn io_slices(chunks: &VecDeque<Bytes>) -> Vec<io::IoSlice<'_>> {
    chunks
        .iter()
        .take(IOV_MAX)
        .map(|c| io::IoSlice::new(c))
        .collect()
}

/// Drops the first `n` bytes of `chunks`.
fn advance(chunks: &mut VecDeque<Bytes>, mut n: usize) {
    while n > 0 {
        let Some(front) = chunks.front_mut() else {
            return;
        };
        if n >= front.len() {
            n -= front.len();
            chunks.pop_front();
        } else {
            bytes::Buf::advance(front, n);
            n = 0;
        }
    }
}

/// Writes every chunk.
async fn write_chunks<W: tokio::io::AsyncWrite + Unpin>(
    write: &mut W,
    chunks: &mut VecDeque<Bytes>,
) -> io::Result<()> {
    while !chunks.is_empty() {
        let slices = io_slices(chunks);
        let n = write.write_vectored(&slices).await?;
        drop(slices);
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        advance(chunks, n);
    }
    Ok(())
}
