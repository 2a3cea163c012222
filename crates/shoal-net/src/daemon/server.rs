//! The daemon process: sockets, listeners, clocks and the loop around the
//! daemon engine ([`shoal_core::daemon::Daemon`]), which decides everything
//! else (docs/architecture.md).
//!
//! ```text
//!  client ──frames──▶ reader task ──input──▶ ┌─────────────────────┐ ◀──▶ UDP to peer daemons
//!  client ◀─chunks─── writer task ◀───────── │ node task: Daemon   │
//!                        │  (written)  ───▶  │ engine (sans-IO)    │ ──events──▶ dispatcher
//!                        └──────────────────▶└─────────────────────┘             (this task)
//! ```
//!
//! Every task runs on the daemon's one thread (a current-thread runtime):
//! a hand-over between them is a task wake-up, never a wake-up of another
//! thread, which on a virtual machine costs tens of microseconds.
//!
//! Back-pressure: readers hand frames to the engine through the node's
//! bounded input channel, which the node stops draining while the engine
//! does not accept input (too much waits for the daemons' group), so a
//! fast sender is blocked (its socket fills), never buffered without
//! bound. Writers report the bytes they wrote, so the engine knows each
//! client's queue and applies the slow-client policy.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use shoal_core::daemon::membership::{self, Membership};
use shoal_core::daemon::{
    daemon_name, ClientInput, Daemon, DaemonEvent, MembershipChange, SessionId, Settings,
};
use shoal_core::vsync::RemovedReason;
use shoal_wire::client::{self, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{mpsc, oneshot};

use super::config::DaemonConfig;
use crate::{AddressBook, Auth, Clock, Control, EventBatch, Mode, Node, NodeConfig, RuntimeStats};

/// How long a connection being closed (a slow client) may take to read what
/// was already being written and the reason it is closed.
const CLOSE_GRACE: Duration = Duration::from_secs(30);
/// After the engine said it stopped, writers get this long to flush.
const FLUSH_WAIT: Duration = Duration::from_millis(50);
/// A stop that the engine does not complete (it always should, within its
/// two shutdown steps) is forced after this long.
const STOP_WAIT: Duration = Duration::from_secs(10);

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
    #[error("membership settings: {0}")]
    Membership(#[from] shoal_core::vsync::ConfigError),
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// Runs a daemon until SIGTERM or SIGINT (or `stop` fires). Blocks.
/// SIGHUP is logged and ignored: nothing is reloaded (docs/daemon.md).
pub fn run(config: DaemonConfig, stop: Option<oneshot::Receiver<()>>) -> Result<(), DaemonError> {
    run_with(config, stop, None)
}

/// Called once, when the daemon first accepts clients (it is in a cluster
/// view and knows its groups): the hook for readiness signals.
pub type OnReady = Box<dyn FnOnce() + Send>;

/// [`run`], calling `on_ready` once the daemon accepts clients.
pub fn run_with(
    config: DaemonConfig,
    stop: Option<oneshot::Receiver<()>>,
    on_ready: Option<OnReady>,
) -> Result<(), DaemonError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_error("tokio runtime"))?;
    runtime.block_on(serve(config, stop, on_ready))
}

/// How often the driver asks the engine whether it accepts clients yet.
const READY_POLL: Duration = Duration::from_millis(20);

/// Calls `on_ready` once the engine accepts clients.
async fn watch_ready(controls: mpsc::UnboundedSender<Control<Daemon>>, on_ready: OnReady) {
    loop {
        let (tx, rx) = oneshot::channel();
        let asked = controls.send(Box::new(move |e: &mut Daemon, _, _| {
            let _ = tx.send(e.sessions().ready());
        }));
        if asked.is_err() {
            return;
        }
        match rx.await {
            Ok(true) => {
                on_ready();
                return;
            }
            Ok(false) => tokio::time::sleep(READY_POLL).await,
            Err(_) => return,
        }
    }
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

/// An incarnation that differs across restarts
/// ([`shoal_core::daemon::membership::first_incarnation`]).
fn incarnation() -> u32 {
    shoal_core::daemon::membership::first_incarnation(unix_ms())
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
    cluster_config: membership::Config,
    incarnation: u32,
    now: shoal_core::Instant,
) -> Result<(Membership, AddressBook, u32), DaemonError> {
    let seed = |slot: u32| u64::from(incarnation) << 8 | u64::from(slot);
    if config.discovery.is_some() {
        let slot = config
            .slot
            .filter(|s| (*s as usize) < membership::MAX_SLOTS)
            .ok_or_else(|| DaemonError::Config("`discovery` needs a `slot` in 0..=255".into()))?;
        let engine = Membership::discovering(slot, incarnation, cluster_config, seed(slot), now)?;
        let book = AddressBook::learning(membership::SLOT_BITS, slot as usize, config.listen)?;
        return Ok((engine, book, slot));
    }
    let (addrs, slot) = slots(config);
    let engine = Membership::new(
        slot,
        addrs.len() as u32,
        incarnation,
        cluster_config,
        seed(slot),
        now,
    )?;
    let book = AddressBook::slotted(addrs, membership::SLOT_BITS)?;
    Ok((engine, book, slot))
}

fn start_node(config: &DaemonConfig) -> Result<Node<Daemon>, DaemonError> {
    let clock = Clock::new();
    let incarnation = incarnation();
    let config_error = |e: super::config::ConfigError| DaemonError::Config(e.to_string());
    // pbcast's first phase goes by IP multicast only with `multicast`;
    // `discovery` alone keeps data on the unicast relay tree.
    let ip_multicast = config.multicast_group().map_err(config_error)?.is_some();
    let mut cluster_config = config.cluster.clone();
    cluster_config.vsync.pbcast.ip_multicast = ip_multicast;
    let (engine, book, slot) =
        membership(config, cluster_config.clone(), incarnation, clock.now())?;
    // `listen`, and the group on `[ip_multicast]`'s interface and TTL.
    let endpoint = config.bind().map_err(config_error)?;
    let mut settings = Settings::new(
        &config.node,
        config.limits.clone(),
        cluster_config.vsync.max_payload(),
    );
    settings.token = config.tcp.as_ref().map(|t| t.token.clone());
    settings.epoch_floor = unix_ms() & u64::from(u32::MAX);
    settings.close_grace = CLOSE_GRACE;
    settings.qsm = config.qsm.clone();
    let engine = Daemon::new(settings, engine);
    let mut node_config = NodeConfig::new(book);
    node_config.command_queue_len = 16;
    // Engine datagrams larger than the path go in fragments of its size.
    node_config.path_datagram = Some(config.datagram_size());
    node_config.faults = config.fault_config(u64::from(incarnation) << 8 | u64::from(slot));
    // QSM regions' IP multicast addresses (`[qsm] multicast`), joined on
    // `[ip_multicast]`'s interface.
    node_config.groups = config.socket_options().map_err(config_error)?;
    if node_config.faults.is_active() {
        tracing::warn!(faults = ?node_config.faults, "[faults]: injecting faults on datagrams (a test aid)");
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
    tracing::info!(node = %config.node, slot, id = %daemon_name(node.id()), listen = %config.listen, max_datagram = config.datagram_size(), engine_datagram = config.engine_datagram_size(), "daemon started");
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
    on_ready: Option<OnReady>,
) -> Result<(), DaemonError> {
    let mut node = start_node(&config)?;
    let unix = bind_unix(&config.socket)?;
    // Where the TCP and metrics listeners are, as bound (a port 0 in the
    // configuration asks for any free port), and the daemons' addresses,
    // for `Status`.
    let mut endpoints = vec![
        format!("daemons' UDP on {}", config.listen),
        slot_line(&config),
    ];
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
    let metrics_listener = match &config.metrics {
        Some(m) => {
            let listener = TcpListener::bind(m.address)
                .await
                .map_err(io_error(format!("bind metrics {}", m.address)))?;
            endpoints.push(format!("metrics on {}", bound(&listener, m.address)?));
            Some(listener)
        }
        None => None,
    };
    let endpoints = std::sync::Arc::new(endpoints);
    let metrics = metrics_listener.map(|listener| {
        tokio::spawn(super::metrics::serve(
            listener,
            node.controls(),
            endpoints.clone(),
        ))
    });
    let limits = client::Limits {
        name_max: config.limits.group_name_len.max(128),
        payload_max: decode_payload_max(config.limits.message_size),
        ..client::Limits::default()
    };
    // Until a connection has sent its Connect, its frames are small.
    let connect_limits = client::Limits {
        name_max: limits.name_max.max(255),
        groups_max: 1,
        members_max: 1,
        payload_max: config.limits.connect_frame_max,
    };
    let (conns_tx, conns_rx) = mpsc::unbounded_channel();
    let wiring = Wiring {
        inputs: node.inputs(),
        controls: node.controls(),
        conns: conns_tx,
        limits,
        connect_limits,
        endpoints,
    };
    let accept = tokio::spawn(accept_loop(unix, tcp, wiring));
    let ready = on_ready.map(|f| tokio::spawn(watch_ready(node.controls(), f)));
    let events = node.take_events().expect("taken once");
    let controls = node.controls();
    let result = dispatch(events, conns_rx, controls, stop).await;
    accept.abort();
    if let Some(r) = ready {
        r.abort();
    }
    if let Some(m) = metrics {
        m.abort();
    }
    let _ = std::fs::remove_file(&config.socket);
    // Give writers a moment to flush their last frames.
    tokio::time::sleep(FLUSH_WAIT).await;
    let stats = node.stop().await?;
    tracing::info!(runtime = ?stats.1, "daemon stopped");
    result
}

/// The payload bound the readers decode with: above `message_size`, so that
/// a message somewhat over the limit reaches the engine, which answers it
/// with `LIMIT` and keeps the connection (docs/daemon.md); only a frame
/// beyond this bound (twice the limit, or the limit plus 1 MiB, whichever
/// is larger) is malformed and closes the connection, so a reader never
/// buffers more than this for one frame.
fn decode_payload_max(message_size: usize) -> usize {
    message_size.saturating_add(message_size.max(1 << 20))
}

/// `slots: 0 127.0.0.1:9000 (this daemon), 1 127.0.0.1:9001`: which
/// address each daemon slot (the first number of a daemon id `slot.inc`)
/// stands for, from the static list; with `discovery`, only this one's.
fn slot_line(config: &DaemonConfig) -> String {
    if config.discovery.is_some() {
        let slot = config.slot.map_or("-".to_string(), |s| s.to_string());
        return format!(
            "slots: {slot} {} (this daemon); others learned by discovery",
            config.listen
        );
    }
    let (addrs, me) = slots(config);
    let list: Vec<String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let this = if i as u32 == me { " (this daemon)" } else { "" };
            format!("{i} {a}{this}")
        })
        .collect();
    format!("slots: {}", list.join(", "))
}

/// What the accept loop hands each connection.
#[derive(Clone)]
struct Wiring {
    /// Client input to the engine (bounded: back-pressure).
    inputs: mpsc::Sender<Control<Daemon>>,
    /// Bytes written, to the engine (unbounded: never blocks a writer).
    controls: mpsc::UnboundedSender<Control<Daemon>>,
    /// New connections' writer handles, to the dispatcher.
    conns: mpsc::UnboundedSender<(SessionId, ConnHandle)>,
    limits: client::Limits,
    connect_limits: client::Limits,
    /// Status lines naming the TCP and metrics listeners' bound addresses.
    endpoints: std::sync::Arc<Vec<String>>,
}

/// The dispatcher's handle on one connection's writer (and reader).
struct ConnHandle {
    chunks: mpsc::UnboundedSender<Bytes>,
    close: oneshot::Sender<Closing>,
    /// Dropped with the handle, when the engine closes the connection:
    /// its reader then stops reading (nothing it read would be used).
    _reader: oneshot::Sender<()>,
}

/// Hands the engine's events to the connections' writers, logs daemon
/// membership changes, and asks for a graceful shutdown on a signal (or
/// `stop`); returns once the engine says it stopped.
async fn dispatch(
    mut events: mpsc::UnboundedReceiver<EventBatch<DaemonEvent>>,
    mut conns_rx: mpsc::UnboundedReceiver<(SessionId, ConnHandle)>,
    controls: mpsc::UnboundedSender<Control<Daemon>>,
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
    let mut hangup = hangups();
    let mut conns: HashMap<SessionId, ConnHandle> = HashMap::new();
    let mut stopping: Option<tokio::time::Instant> = None;
    loop {
        let forced = async move {
            match stopping {
                Some(at) => tokio::time::sleep_until(at + STOP_WAIT).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            Some((id, handle)) = conns_rx.recv() => {
                conns.insert(id, handle);
            }
            _ = &mut stop, if stopping.is_none() => {
                stopping = Some(tokio::time::Instant::now());
                let _ = controls.send(Box::new(|e: &mut Daemon, now, _| e.begin_shutdown(now)));
            }
            _ = &mut signals, if stopping.is_none() => {
                tracing::info!("signal received: shutting down");
                stopping = Some(tokio::time::Instant::now());
                let _ = controls.send(Box::new(|e: &mut Daemon, now, _| e.begin_shutdown(now)));
            }
            Some(()) = recv_hangup(&mut hangup) => {
                tracing::warn!(
                    "SIGHUP received: nothing is reloaded (restart the daemon to apply a changed configuration); serving on"
                );
            }
            batch = events.recv() => {
                let Some(batch) = batch else { break };
                // A connection's handle is registered before the engine
                // hears of it: take any still queued before its frames.
                while let Ok((id, handle)) = conns_rx.try_recv() {
                    conns.insert(id, handle);
                }
                for ev in batch.events {
                    match ev {
                        DaemonEvent::Frames(id, chunk) => {
                            if let Some(c) = conns.get(&id) {
                                let _ = c.chunks.send(chunk);
                            }
                        }
                        DaemonEvent::Close(id, last) => {
                            // A slow client's unwritten frames are dropped
                            // at once: the engine stopped counting them
                            // when it gave up on the client, so they must
                            // not wait out the close's grace in memory.
                            let discard = log_close(id, last.as_deref()) == Some(client::code::SLOW_CLIENT);
                            if let Some(c) = conns.remove(&id) {
                                let _ = c.close.send(Closing { last, discard });
                            }
                        }
                        DaemonEvent::Membership { me, event } => log_membership(me, &event),
                        DaemonEvent::Stopped => return Ok(()),
                    }
                }
            }
            _ = forced => {
                tracing::warn!("the engine did not complete its shutdown in time; stopping");
                break;
            }
        }
    }
    Ok(())
}

/// Logs why the engine closes a client connection (the `Error` it sends
/// last): a slow client, a connection that never said who it is, a wrong
/// token, a malformed frame. The shutdown's goodbyes are logged at debug.
/// Returns the error's code.
fn log_close(id: SessionId, last: Option<&[u8]>) -> Option<u16> {
    let Some(Ok(Some((Frame::Error { code, text }, _)))) =
        last.map(|b| client::decode(b, &client::Limits::default()))
    else {
        return None;
    };
    if code == client::code::SHUTDOWN {
        tracing::debug!(session = id, code, %text, "closing a client connection");
    } else {
        tracing::info!(session = id, code, %text, "closing a client connection");
    }
    Some(code)
}

/// How the dispatcher closes a connection's writer.
struct Closing {
    /// The last frame, written after what is queued.
    last: Option<Bytes>,
    /// Drop the queued chunks not begun yet (a slow client: the client is
    /// gone anyway, and the engine no longer counts them).
    discard: bool,
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

/// SIGHUP, if its handler can be installed (then it no longer kills the
/// daemon).
fn hangups() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGHUP");
            None
        }
    }
}

async fn recv_hangup(hangup: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match hangup {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// `shoal status` lines about the runtime (sockets, drops).
fn runtime_lines(runtime: &RuntimeStats) -> Vec<String> {
    vec![
        format!(
            "datagrams: sent {} ({} bytes), received {} ({} bytes)",
            runtime.datagrams_sent,
            runtime.bytes_sent,
            runtime.datagrams_received,
            runtime.bytes_received
        ),
        format!(
            "datagram fragments: sent {} (of {} datagrams larger than the path), received {}, joined into {} datagrams, refused {}, partial datagrams dropped {}",
            runtime.fragments_sent,
            runtime.datagrams_split,
            runtime.fragments_received,
            runtime.datagrams_joined,
            runtime.fragments_refused,
            runtime.partial_dropped
        ),
        format!(
            "receive runs (UDP GRO, several datagrams in one receive): {}, truncated {}",
            runtime.gro_runs, runtime.receive_truncated
        ),
        format!(
            "drops: unknown source {}, failed authentication {}, io errors {}, too large {}, slot conflicts {}",
            runtime.unknown_source,
            runtime.auth_dropped,
            runtime.io_errors,
            runtime.too_large,
            runtime.slot_conflicts
        ),
    ]
}

/// Daemon ids as `shoal status` prints them (`slot.incarnation`).
fn names(ids: &[shoal_core::NodeId]) -> String {
    let names: Vec<String> = ids.iter().map(|id| daemon_name(*id)).collect();
    format!("[{}]", names.join(", "))
}

fn log_membership(me: shoal_core::NodeId, event: &MembershipChange) {
    match event {
        MembershipChange::View(v) => tracing::info!(
            me = %daemon_name(me),
            view = %shoal_core::vsync::display_view(v.id),
            members = %names(&v.members),
            joined = %names(&v.joined),
            failed = %names(&v.failed),
            left = %names(&v.left),
            first = v.first,
            "daemons' view installed"
        ),
        MembershipChange::Removed {
            view,
            reason: RemovedReason::Left,
        } => tracing::info!(
            me = %daemon_name(me),
            view = %shoal_core::vsync::display_view(*view),
            "left the daemons' group"
        ),
        MembershipChange::Removed { view, reason } => {
            let view = shoal_core::vsync::display_view(*view);
            tracing::warn!(me = %daemon_name(me), %view, ?reason, "removed from the daemons' group; rejoining")
        }
    }
}

async fn accept_loop(unix: UnixListener, tcp: Option<TcpListener>, wiring: Wiring) {
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
                    open(next_id, read, write, false, &wiring).await;
                    next_id += 1;
                }
                Err(e) => tracing::warn!(error = %e, "accept on the Unix socket failed"),
            },
            r = tcp_accept => match r {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    let (read, write) = stream.into_split();
                    open(next_id, read, write, true, &wiring).await;
                    next_id += 1;
                }
                Err(e) => tracing::warn!(error = %e, "accept on the TCP listener failed"),
            },
        }
    }
}

/// Hands a client event to the engine through the bounded input channel.
/// Returns false when the daemon has stopped.
async fn input(inputs: &mpsc::Sender<Control<Daemon>>, event: ClientInput) -> bool {
    inputs
        .send(Box::new(move |e: &mut Daemon, now, _| {
            e.handle_client(now, event)
        }))
        .await
        .is_ok()
}

async fn open<R, W>(id: SessionId, read: R, write: W, tcp: bool, wiring: &Wiring)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (chunks_tx, chunks_rx) = mpsc::unbounded_channel();
    let (close_tx, close_rx) = oneshot::channel();
    let (reader_tx, reader_rx) = oneshot::channel();
    // The dispatcher learns of the connection before the engine does.
    let handle = ConnHandle {
        chunks: chunks_tx,
        close: close_tx,
        _reader: reader_tx,
    };
    if wiring.conns.send((id, handle)).is_err() {
        return;
    }
    if !input(&wiring.inputs, ClientInput::Opened { id, tcp }).await {
        return;
    }
    tokio::spawn(writer(
        id,
        write,
        chunks_rx,
        close_rx,
        wiring.controls.clone(),
    ));
    tokio::spawn(reader(id, read, wiring.clone(), reader_rx));
}

/// Reads frames and hands them to the engine until EOF, a bad frame, or
/// the engine closing the connection (`closed` resolves).
///
/// Until the engine has accepted the connection's `Connect` (its token
/// checked), frames are held to the small `connect_limits` (a name and a
/// token: `limits.connect_frame_max`) and at most 4 KiB is buffered, so
/// connections that never authenticate cannot each hold a large partial
/// frame; after a `Connect` the reader reads nothing more until the engine
/// has decided, and stops if it refused.
async fn reader<R: tokio::io::AsyncRead + Unpin>(
    id: SessionId,
    mut read: R,
    wiring: Wiring,
    mut closed: oneshot::Receiver<()>,
) {
    let mut buf = BytesMut::with_capacity(READ_SMALL);
    let mut connected = false;
    // Whether the last read filled the buffer (more is likely waiting).
    let mut busy = false;
    loop {
        // Every frame this read completed goes to the engine as one input.
        let mut frames = Vec::new();
        let mut malformed = None;
        let mut used = 0;
        let mut asked = false;
        while !asked {
            let limits = if connected {
                &wiring.limits
            } else {
                &wiring.connect_limits
            };
            match client::decode(&buf[used..], limits) {
                Ok(Some((frame, n))) => {
                    used += n;
                    asked = !connected
                        && matches!(frame, Frame::Connect { .. } | Frame::ConnectExt { .. });
                    frames.push(frame);
                }
                Ok(None) => break,
                Err(e) if connected => {
                    malformed = Some(e.to_string());
                    break;
                }
                Err(e) => {
                    tracing::info!(session = id, error = %e, "closing a connection: a bad frame before Connect");
                    malformed = Some(format!(
                        "before Connect: {e} (frames are at most {} bytes until the daemon accepts the connection)",
                        wiring.connect_limits.frame_max()
                    ));
                    break;
                }
            }
        }
        let _ = buf.split_to(used);
        if !frames.is_empty() {
            let endpoints = wiring.endpoints.clone();
            let (verdict_tx, verdict_rx) = oneshot::channel();
            let handed = wiring
                .inputs
                .send(Box::new(move |e: &mut Daemon, now, runtime| {
                    for frame in frames {
                        if frame == Frame::Status {
                            let mut extra = runtime_lines(runtime);
                            extra.extend(endpoints.iter().cloned());
                            e.handle_status(now, id, extra);
                        } else {
                            e.handle_client(now, ClientInput::Frame(id, frame));
                        }
                    }
                    let _ = verdict_tx.send(e.sessions().is_connected(id));
                }))
                .await;
            if handed.is_err() {
                return;
            }
            if asked {
                // Accepted: from now on the client's own limits. Refused:
                // the engine closes the connection.
                match verdict_rx.await {
                    Ok(true) => connected = true,
                    _ => return,
                }
            }
        }
        if let Some(why) = malformed {
            let _ = input(&wiring.inputs, ClientInput::Malformed(id, why)).await;
            return;
        }
        if asked {
            // Frames sent right behind the `Connect` may be decoded now.
            continue;
        }
        // A busy sender reads 64 KiB at a time; an idle connection (most
        // of a thousand) holds 4 KiB, not 64.
        if buf.is_empty() && buf.capacity() > READ_SMALL && !busy {
            buf = BytesMut::new();
        }
        buf.reserve(if connected && busy {
            READ_LARGE
        } else {
            READ_SMALL
        });
        let room = buf.capacity() - buf.len();
        let read = tokio::select! {
            r = read.read_buf(&mut buf) => r,
            _ = &mut closed => return,
        };
        match read {
            Ok(0) | Err(_) => {
                let _ = input(&wiring.inputs, ClientInput::Closed(id)).await;
                return;
            }
            Ok(n) => busy = n == room,
        }
    }
}

/// A connection's read buffer while it sends little, and while it sends
/// much (or a frame larger than the buffer is coming).
const READ_SMALL: usize = 4 * 1024;
const READ_LARGE: usize = 64 * 1024;

/// Tells the engine how many bytes of a client's queue were written.
fn written(controls: &mpsc::UnboundedSender<Control<Daemon>>, id: SessionId, n: usize) {
    let _ = controls.send(Box::new(move |e: &mut Daemon, now, _| {
        e.handle_client(now, ClientInput::Written(id, n))
    }));
}

/// Writes queued chunks, as many as are ready in one vectored write (no
/// copy into a write buffer), and reports what it wrote; on close, writes
/// the last frame (if any) and shuts the connection.
async fn writer<W: tokio::io::AsyncWrite + Unpin>(
    id: SessionId,
    mut write: W,
    mut frames: mpsc::UnboundedReceiver<Bytes>,
    mut close: oneshot::Receiver<Closing>,
    controls: mpsc::UnboundedSender<Control<Daemon>>,
) {
    let mut out = Outgoing::default();
    loop {
        tokio::select! {
            biased;
            closing = &mut close => {
                finish(&mut write, &mut out, &mut frames, closing.ok(), (id, &controls)).await;
                return;
            }
            frame = frames.recv() => {
                let Some(frame) = frame else {
                    let _ = write.shutdown().await;
                    return;
                };
                let mut cost = frame.len();
                out.chunks.push_back(frame);
                while cost < 256 * 1024 {
                    match frames.try_recv() {
                        Ok(f) => {
                            cost += f.len();
                            out.chunks.push_back(f);
                        }
                        Err(_) => break,
                    }
                }
                // A client that does not read must not keep this task in
                // a write forever after the engine gave up on it: on close,
                // finish these chunks (a slow client: only the one begun)
                // and write the reason if the client reads within
                // CLOSE_GRACE, else drop the connection. Memory stays
                // bounded: nothing more is queued for it.
                // (`write_vectored` is cancel-safe: a dropped write wrote
                // nothing, and `chunks` only advances by what was written.)
                while !out.chunks.is_empty() {
                    let slices = io_slices(&out.chunks);
                    tokio::select! {
                        r = write.write_vectored(&slices) => match r {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                drop(slices);
                                out.advance(n);
                                written(&controls, id, n);
                            }
                        },
                        closing = &mut close => {
                            drop(slices);
                            finish(&mut write, &mut out, &mut frames, closing.ok(), (id, &controls)).await;
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Chunks waiting to be written to one client.
#[derive(Default)]
struct Outgoing {
    chunks: VecDeque<Bytes>,
    /// Whether the first chunk is partly written (it must then be
    /// finished, or the client would read half a frame).
    begun: bool,
}

impl Outgoing {
    /// Drops the first `n` bytes.
    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                return;
            };
            if n >= front.len() {
                n -= front.len();
                self.chunks.pop_front();
                self.begun = false;
            } else {
                bytes::Buf::advance(front, n);
                self.begun = true;
                n = 0;
            }
        }
    }

    /// Keeps only the chunk begun, if any; returns the bytes dropped.
    fn discard(&mut self) -> usize {
        let keep = usize::from(self.begun);
        let dropped = self.chunks.iter().skip(keep).map(|c| c.len()).sum();
        self.chunks.truncate(keep);
        dropped
    }
}

/// The close of a writer: what is queued (for a slow client, only the
/// chunk begun), then the last frame, within CLOSE_GRACE; then shut. The
/// engine hears what was written or dropped, and that the connection is
/// gone (it counts those bytes until then).
async fn finish<W: tokio::io::AsyncWrite + Unpin>(
    write: &mut W,
    out: &mut Outgoing,
    frames: &mut mpsc::UnboundedReceiver<Bytes>,
    closing: Option<Closing>,
    (id, controls): (SessionId, &mpsc::UnboundedSender<Control<Daemon>>),
) {
    // Chunks queued before the close go first (or go, for a slow client).
    while let Ok(f) = frames.try_recv() {
        out.chunks.push_back(f);
    }
    if let Some(closing) = closing {
        if closing.discard {
            written(controls, id, out.discard());
        }
        out.chunks.extend(closing.last);
    }
    let finish = async {
        write_chunks(write, out).await?;
        write.shutdown().await
    };
    let _ = tokio::time::timeout(CLOSE_GRACE, finish).await;
    out.chunks.clear();
    let _ = controls.send(Box::new(move |e: &mut Daemon, now, _| {
        e.handle_client(now, ClientInput::Closed(id))
    }));
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

/// Writes every chunk.
async fn write_chunks<W: tokio::io::AsyncWrite + Unpin>(
    write: &mut W,
    out: &mut Outgoing,
) -> io::Result<()> {
    while !out.chunks.is_empty() {
        let slices = io_slices(&out.chunks);
        let n = write.write_vectored(&slices).await?;
        drop(slices);
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        out.advance(n);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_over_message_size_still_decodes_so_the_engine_can_answer_limit() {
        assert_eq!(decode_payload_max(1000), 1000 + (1 << 20));
        assert_eq!(decode_payload_max(4 << 20), 8 << 20);
        assert_eq!(decode_payload_max(usize::MAX), usize::MAX);
    }

    #[test]
    fn the_slot_line_names_each_slot_address() {
        let config = DaemonConfig::parse(
            "listen = \"127.0.0.1:9001\"\npeers = [\"127.0.0.1:9002\", \"127.0.0.1:9000\"]\n",
        )
        .unwrap();
        assert_eq!(
            slot_line(&config),
            "slots: 0 127.0.0.1:9000, 1 127.0.0.1:9001 (this daemon), 2 127.0.0.1:9002"
        );
    }
}
