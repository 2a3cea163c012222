//! The client socket of a site daemon: applications connect over a Unix
//! stream socket with the main daemon's client protocol
//! (`docs/client-protocol.md`, codec `shoal_wire::client`), so the Rust and
//! Python client libraries work unchanged. `docs/spread.md`, "Clients of a
//! site daemon", says what of the protocol a site daemon serves.
//!
//! One task per connection reads its frames and hands each request to the
//! engine ([`SiteEngine::daemon_mut`] in a [`Node`](crate::Node) control
//! closure), one task writes what the daemon has for it; the site daemon's
//! events reach a connection through [`ClientServer::dispatch`].
//!
//! Back-pressure: a connection's multicast waits for the engine's answer
//! before the next frame is read; while the daemon's request queue is full
//! (`send_queue_max`) the connection retries and reads nothing more, so a
//! fast sender is slowed by its socket, not refused. A client that reads
//! too slowly (more than `client_queue` bytes queued to it) is sent
//! `SLOW_CLIENT` and disconnected.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use shoal_core::sites::{ClientError, Event, Service, ViewReason};
use shoal_wire::client::{self, code, Frame, Limits, Reason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, Notify};

use super::SiteEngine;
use crate::Control;

/// Settings of the client socket.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// Where the Unix socket is made (mode 0600: only this user's
    /// processes may connect).
    pub socket: PathBuf,
    /// The daemon's name in private groups: a client `name` is
    /// `#name#<daemon_name>`, unique across the sites.
    pub daemon_name: String,
    /// Clients connected at once, at most.
    pub max_clients: usize,
    /// Bytes queued to a client and not yet written, at most; past it the
    /// client is disconnected as slow (the main daemon's
    /// `limits.client_queue`, 32 MiB).
    pub client_queue: usize,
    /// Frame limits (names, groups, payload).
    pub limits: Limits,
}

impl ClientSettings {
    /// The defaults for daemon `daemon_name` serving at `socket`.
    pub fn new(socket: PathBuf, daemon_name: String) -> ClientSettings {
        ClientSettings {
            socket,
            daemon_name,
            max_clients: 1000,
            client_queue: 32 << 20,
            limits: Limits::default(),
        }
    }
}

/// Counters of the client socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub connections: u64,
    pub messages_in: u64,
    pub frames_out: u64,
    /// Events for a client no connection holds any more (it disconnected
    /// while they were on their way), dropped.
    pub orphaned: u64,
    /// Clients disconnected because they read too slowly.
    pub slow: u64,
    /// Times a multicast waited because the daemon's queue was full.
    pub queue_full_waits: u64,
}

/// What waits to be written to one client: its frames back to back, in
/// the order they were queued. The daemon's events are encoded straight
/// into it, and the connection's writer takes all of it in one write: one
/// copy of a message per client, no allocation per frame, one system call
/// and one wake-up of the client per batch.
#[derive(Default)]
struct Outbox {
    state: Mutex<Pending>,
    ready: Notify,
}

#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    /// Bytes the writer took and has not written yet.
    writing: usize,
    /// Nothing more is queued: what came before is written, then the
    /// connection closes.
    close: bool,
}

impl Outbox {
    /// Queues what `encode` appends (nothing if it fails: a frame over
    /// the codec's limits, which the client could not decode either).
    /// With `limit`, a frame that would leave more than `limit` bytes
    /// unwritten is not queued: the client is told it is too slow and the
    /// connection closes (false).
    fn queue<E>(
        &self,
        limit: Option<usize>,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> bool {
        let mut p = self.state.lock().expect("lock");
        if p.close {
            return true;
        }
        let start = p.buf.len();
        if encode(&mut p.buf).is_err() {
            p.buf.truncate(start);
            return true;
        }
        let slow = limit.is_some_and(|limit| p.buf.len() + p.writing > limit);
        if slow {
            p.buf.truncate(start);
            p.buf.extend_from_slice(&error_bytes(
                code::SLOW_CLIENT,
                "the client read too slowly: its queue filled",
            ));
            p.close = true;
        }
        drop(p);
        self.ready.notify_one();
        !slow
    }

    /// Queues an encoded frame.
    fn push(&self, frame: &[u8]) {
        self.queue(None, |buf| {
            buf.extend_from_slice(frame);
            Ok::<(), ()>(())
        });
    }

    /// Writes what is queued, then closes the connection.
    fn close(&self) {
        self.state.lock().expect("lock").close = true;
        self.ready.notify_one();
    }
}

/// A connected client, as the dispatcher reaches it.
struct Conn {
    id: u64,
    out: Arc<Outbox>,
    /// Wakes the connection's reader to end the session (slow client).
    kill: Arc<Notify>,
}

impl Conn {
    /// Queues what `encode` writes; false if the client is over its queue
    /// bound (it is then told so and closed).
    fn send<E>(&self, limit: usize, encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>) -> bool {
        if self.out.queue(Some(limit), encode) {
            return true;
        }
        self.kill.notify_one();
        false
    }
}

#[derive(Default)]
struct Shared {
    /// Private group → connection.
    conns: BTreeMap<String, Conn>,
    next_id: u64,
    stats: ClientStats,
}

/// A site daemon's client socket. Made inside a tokio runtime; its accept
/// loop and connections are tasks of that runtime.
pub struct ClientServer {
    settings: Arc<ClientSettings>,
    shared: Arc<Mutex<Shared>>,
    accept: tokio::task::JoinHandle<()>,
}

impl ClientServer {
    /// Binds the socket (a stale file is replaced, a live daemon's never)
    /// and starts accepting; requests go to the engine through `controls`.
    pub fn bind(
        settings: ClientSettings,
        controls: mpsc::UnboundedSender<Control<SiteEngine>>,
    ) -> io::Result<ClientServer> {
        let listener = bind_unix(&settings.socket)?;
        let settings = Arc::new(settings);
        let shared = Arc::new(Mutex::new(Shared::default()));
        let accept = tokio::spawn(accept_loop(
            listener,
            settings.clone(),
            shared.clone(),
            controls,
        ));
        Ok(ClientServer {
            settings,
            shared,
            accept,
        })
    }

    /// Whether `client` (a private group) is one of this socket's clients.
    pub fn serves(&self, client: &str) -> bool {
        self.shared.lock().expect("lock").conns.contains_key(client)
    }

    /// Hands a site daemon's event to its client's connection. An event
    /// for a client no connection holds (it disconnected meanwhile) is
    /// counted and dropped.
    pub fn dispatch(&self, event: Event) {
        let mut shared = self.shared.lock().expect("lock");
        let limit = self.settings.client_queue;
        let client = match &event {
            Event::Deliver { client, .. }
            | Event::View { client, .. }
            | Event::Dropped { client } => client,
        };
        let Some(conn) = shared.conns.get(client) else {
            shared.stats.orphaned += 1;
            return;
        };
        let sent = match event {
            // A message is encoded from the event's own bytes.
            Event::Deliver {
                sender,
                service,
                groups,
                payload,
                ..
            } => conn.send(limit, |buf| {
                let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
                client::encode_message(&sender, wire_service(service), 0, &groups, &payload, buf)
            }),
            other => {
                let (_, frame) = frame_of(other);
                conn.send(limit, |buf| frame.encode(buf))
            }
        };
        if sent {
            shared.stats.frames_out += 1;
        } else {
            shared.stats.slow += 1;
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> ClientStats {
        self.shared.lock().expect("lock").stats
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        self.shared.lock().expect("lock").conns.len()
    }
}

impl Drop for ClientServer {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.settings.socket);
    }
}

/// The client-protocol frame of a site daemon's event, and its client.
fn frame_of(event: Event) -> (String, Frame) {
    match event {
        Event::Deliver {
            client,
            sender,
            service,
            groups,
            payload,
            ..
        } => (
            client,
            Frame::Message {
                sender,
                service: wire_service(service),
                groups,
                payload: payload.to_vec(),
            },
        ),
        Event::View {
            client,
            group,
            view_id,
            members,
            transitional,
            reason,
        } => (
            client,
            Frame::Membership {
                group,
                view_id,
                reason: match reason {
                    ViewReason::Join => Reason::Join,
                    ViewReason::Leave => Reason::Leave,
                    ViewReason::Network => Reason::Network,
                },
                transitional,
                // Sites have no quorum setting: every view holds it.
                quorum: true,
                members,
            },
        ),
        Event::Dropped { client } => (
            client,
            Frame::Error {
                code: code::UNAVAILABLE,
                text: "the daemon gave up its site state for another member's; this client's groups were left".into(),
            },
        ),
    }
}

fn wire_service(s: Service) -> client::Service {
    match s {
        Service::Unreliable => client::Service::Unreliable,
        Service::Reliable => client::Service::Reliable,
        Service::Fifo => client::Service::Fifo,
        Service::Causal => client::Service::Causal,
        Service::Agreed => client::Service::Agreed,
        Service::Safe => client::Service::Safe,
    }
}

fn site_service(s: client::Service) -> Option<Service> {
    Some(match s {
        client::Service::Unreliable => Service::Unreliable,
        client::Service::Probabilistic => return None,
        client::Service::Reliable => Service::Reliable,
        client::Service::Fifo => Service::Fifo,
        client::Service::Causal => Service::Causal,
        client::Service::Agreed => Service::Agreed,
        client::Service::Safe => Service::Safe,
    })
}

fn error_bytes(code: u16, text: &str) -> Bytes {
    let mut buf = Vec::new();
    Frame::Error {
        code,
        text: text.into(),
    }
    .encode(&mut buf)
    .expect("an error frame encodes");
    Bytes::from(buf)
}

/// Binds the Unix socket, replacing a stale file but never a live daemon's.
fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another daemon is serving {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

async fn accept_loop(
    listener: UnixListener,
    settings: Arc<ClientSettings>,
    shared: Arc<Mutex<Shared>>,
    controls: mpsc::UnboundedSender<Control<SiteEngine>>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(session(
                    stream,
                    settings.clone(),
                    shared.clone(),
                    controls.clone(),
                ));
            }
            Err(e) => {
                tracing::warn!("site client socket: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn writer(mut w: tokio::net::unix::OwnedWriteHalf, out: Arc<Outbox>) {
    // A buffer larger than this is given back after its write, so that a
    // burst does not keep its memory for the connection's life.
    const KEEP_MAX: usize = 1 << 20;
    let mut taken = Vec::new();
    loop {
        let close = {
            let mut p = out.state.lock().expect("lock");
            std::mem::swap(&mut p.buf, &mut taken);
            p.writing = taken.len();
            p.close
        };
        if !taken.is_empty() {
            if w.write_all(&taken).await.is_err() {
                break;
            }
            taken.clear();
            if taken.capacity() > KEEP_MAX {
                taken = Vec::new();
            }
            out.state.lock().expect("lock").writing = 0;
            continue;
        }
        if close {
            break;
        }
        out.ready.notified().await;
    }
    // Nothing more is queued to a connection that ended.
    out.close();
    let _ = w.shutdown().await;
}

/// How long a multicast waits before asking a full daemon queue again.
const QUEUE_RETRY: Duration = Duration::from_millis(2);

/// One connection: the handshake, then its requests until it ends.
async fn session(
    stream: UnixStream,
    settings: Arc<ClientSettings>,
    shared: Arc<Mutex<Shared>>,
    controls: mpsc::UnboundedSender<Control<SiteEngine>>,
) {
    let (mut r, w) = stream.into_split();
    let tx = Arc::new(Outbox::default());
    let kill = Arc::new(Notify::new());
    tokio::spawn(writer(w, tx.clone()));
    let send = |frame: Frame| {
        tx.queue(None, |buf| frame.encode(buf));
    };
    let fail = |code: u16, text: String| {
        tx.push(&error_bytes(code, &text));
        tx.close();
    };
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut me: Option<(u64, String)> = None;
    let mut joined: BTreeSet<String> = BTreeSet::new();
    // Multicasts read and not yet handed to the engine: consecutive ones
    // go in one hand-over (one round trip to the daemon's loop, not one
    // per message), before any other frame is acted on.
    let mut batch = Batch::default();
    'conn: loop {
        // Every whole frame held, then more bytes.
        loop {
            let frame = match client::decode(&buf, &settings.limits) {
                Ok(Some((frame, used))) => {
                    let _ = buf.split_to(used);
                    frame
                }
                Ok(None) => break,
                Err(e) => {
                    fail(code::MALFORMED, e.to_string());
                    break 'conn;
                }
            };
            let multicast = matches!(frame, Frame::Multicast { .. } | Frame::MulticastExt { .. });
            if (!multicast || batch.is_full())
                && !hand_over(&controls, &tx, &shared, &me, &mut batch).await
            {
                break 'conn;
            }
            match (&me, frame) {
                (_, Frame::Status) => {
                    let (otx, orx) = oneshot::channel();
                    let name = settings.daemon_name.clone();
                    let sent = controls.send(Box::new(move |e: &mut SiteEngine, _, _| {
                        let d = e.daemon();
                        let (epoch, sites, changing) = d.configuration();
                        let names: Vec<&str> = sites.iter().map(|s| d.site_name(*s)).collect();
                        let h = d.hop_stats();
                        let a = e.stats();
                        let _ = otx.send(format!(
                            "site daemon {name} (id {}, site {})\nlive {}\ngateway {}\nconfiguration epoch {epoch}, sites {}{}\nrequests waiting {}\noutstanding {}\nmessages sent in parts {}, parts refused {}\nhop links: data sent {}, retransmissions {}, received {}, recovered {}, nacks sent {}\nemulated links (experiments): link drops {}, link queue drops {}, uplink drops {}, downlink drops {}\n",
                            d.node_id().0,
                            d.site_name(d.site()),
                            d.is_live(),
                            d.is_gateway(),
                            names.join(", "),
                            if changing { " (changing)" } else { "" },
                            d.waiting(),
                            d.outstanding(),
                            d.stats().sent_in_parts,
                            d.stats().parts_refused,
                            h.data_sent,
                            h.retransmissions,
                            h.data_received,
                            h.recovered,
                            h.nacks_sent,
                            a.link_dropped,
                            a.link_queue_dropped,
                            a.uplink_dropped,
                            a.downlink_dropped,
                        ));
                    }))
                    .is_ok();
                    let text = match (sent, orx.await) {
                        (true, Ok(t)) => t,
                        _ => "the daemon is stopping\n".into(),
                    };
                    let clients = shared.lock().expect("lock").conns.len();
                    send(Frame::StatusReply {
                        text: format!("{text}clients {clients}\n"),
                    });
                }
                (None, Frame::Connect { name, .. } | Frame::ConnectExt { name, .. }) => {
                    // The Unix socket's permissions decide who connects:
                    // the token is not checked (as the main daemon's).
                    if name.contains('#') {
                        fail(code::PROTOCOL, "a private name must not contain '#'".into());
                        break 'conn;
                    }
                    let pg = format!("#{name}#{}", settings.daemon_name);
                    let id = {
                        let mut s = shared.lock().expect("lock");
                        if s.conns.contains_key(&pg) {
                            drop(s);
                            fail(code::NAME_TAKEN, format!("{name:?} is connected already"));
                            break 'conn;
                        }
                        if s.conns.len() >= settings.max_clients {
                            drop(s);
                            fail(
                                code::LIMIT,
                                format!("{} clients are connected", settings.max_clients),
                            );
                            break 'conn;
                        }
                        s.next_id += 1;
                        s.stats.connections += 1;
                        let id = s.next_id;
                        s.conns.insert(
                            pg.clone(),
                            Conn {
                                id,
                                out: tx.clone(),
                                kill: kill.clone(),
                            },
                        );
                        id
                    };
                    let c = pg.clone();
                    controls
                        .send(Box::new(move |e: &mut SiteEngine, _, _| {
                            e.daemon_mut().connect(&c)
                        }))
                        .ok();
                    send(Frame::ConnectOk {
                        private_group: pg.clone(),
                    });
                    me = Some((id, pg));
                }
                (None, _) => {
                    fail(code::PROTOCOL, "the first frame must be Connect".into());
                    break 'conn;
                }
                (Some(_), Frame::Connect { .. } | Frame::ConnectExt { .. }) => {
                    fail(code::PROTOCOL, "Connect twice".into());
                    break 'conn;
                }
                (Some(_), Frame::Disconnect) => break 'conn,
                (Some((_, pg)), Frame::Join { group }) => {
                    if let Some(why) = bad_group(&group, &settings.limits) {
                        send(Frame::Error {
                            code: code::BAD_GROUP,
                            text: why,
                        });
                        continue;
                    }
                    if !joined.insert(group.clone()) {
                        continue;
                    }
                    request(&controls, &tx, pg, Request::Join(group));
                }
                (Some((_, pg)), Frame::Leave { group }) => {
                    if !joined.remove(&group) {
                        send(Frame::Error {
                            code: code::BAD_GROUP,
                            text: format!("not a member of {group:?}"),
                        });
                        continue;
                    }
                    request(&controls, &tx, pg, Request::Leave(group));
                }
                (Some(_), frame @ (Frame::Multicast { .. } | Frame::MulticastExt { .. })) => {
                    let (service, flags, mess_type, groups, payload) = match frame {
                        Frame::Multicast {
                            service,
                            groups,
                            payload,
                        } => (service, 0, 0, groups, payload),
                        Frame::MulticastExt {
                            service,
                            flags,
                            mess_type,
                            groups,
                            payload,
                        } => (service, flags, mess_type, groups, payload),
                        _ => unreachable!("matched above"),
                    };
                    let Some(service) = site_service(service) else {
                        send(Frame::Error {
                            code: code::UNSUPPORTED_SERVICE,
                            text: "a site daemon has no probabilistic service; nothing was sent"
                                .into(),
                        });
                        continue;
                    };
                    if flags != 0 || mess_type != 0 {
                        send(Frame::Error {
                            code: code::UNSUPPORTED_SERVICE,
                            text: "a site daemon carries no message type and no self-discard; nothing was sent".into(),
                        });
                        continue;
                    }
                    shared.lock().expect("lock").stats.messages_in += 1;
                    batch.push(service, groups, Bytes::from(payload));
                }
                (Some(_), Frame::FlowQuery { .. } | Frame::GroupQuery { .. }) => {
                    send(Frame::Error {
                        code: code::PROTOCOL,
                        text: "a site daemon answers no flow or group queries".into(),
                    });
                }
                (Some(_), Frame::Error { .. }) => {}
                (Some(_), _) => {
                    fail(code::PROTOCOL, "a frame only a daemon sends".into());
                    break 'conn;
                }
            }
        }
        // Nothing more to decode: what was read goes to the engine before
        // waiting for more.
        if !hand_over(&controls, &tx, &shared, &me, &mut batch).await {
            break 'conn;
        }
        tokio::select! {
            n = r.read_buf(&mut buf) => match n {
                Ok(0) | Err(_) => break 'conn,
                Ok(_) => {}
            },
            _ = kill.notified() => break 'conn,
        }
    }
    if let Some((id, pg)) = me {
        // What the client sent before the connection ended is sent, as
        // if each frame had been acted on as it was read.
        let _ = submit(&controls, &tx, &shared, &pg, &mut batch).await;
        let mut s = shared.lock().expect("lock");
        if s.conns.get(&pg).is_some_and(|c| c.id == id) {
            s.conns.remove(&pg);
        }
        drop(s);
        controls
            .send(Box::new(move |e: &mut SiteEngine, now, _| {
                e.daemon_mut().disconnect(now, &pg)
            }))
            .ok();
    }
    tx.close();
}

/// Multicasts a connection read, in order, not yet handed to the engine.
#[derive(Default)]
struct Batch {
    items: VecDeque<(Service, Vec<String>, Bytes)>,
    bytes: usize,
}

impl Batch {
    /// A hand-over carries at most this many messages or bytes.
    const MAX_ITEMS: usize = 256;
    const MAX_BYTES: usize = 1 << 20;

    fn push(&mut self, service: Service, groups: Vec<String>, payload: Bytes) {
        self.bytes += payload.len();
        self.items.push_back((service, groups, payload));
    }

    fn is_full(&self) -> bool {
        self.items.len() >= Self::MAX_ITEMS || self.bytes >= Self::MAX_BYTES
    }
}

/// The daemon's loop is gone.
struct Stopped;

/// Hands the batch of a connected client (`me`) to the engine; false,
/// the client told and its connection closing, if the daemon is
/// stopping.
async fn hand_over(
    controls: &mpsc::UnboundedSender<Control<SiteEngine>>,
    tx: &Arc<Outbox>,
    shared: &Mutex<Shared>,
    me: &Option<(u64, String)>,
    batch: &mut Batch,
) -> bool {
    let Some((_, client)) = me else {
        return true;
    };
    if submit(controls, tx, shared, client, batch).await.is_ok() {
        return true;
    }
    tx.push(&error_bytes(code::SHUTDOWN, "the daemon is stopping"));
    tx.close();
    false
}

/// Hands the batch's multicasts to the engine, in order, in one closure
/// per try: while the daemon's request queue is full the rest waits
/// `QUEUE_RETRY` and is handed over again (so the client is slowed, not
/// refused, and its messages keep their order); a message the engine
/// refuses otherwise (too large) gets an `Error` frame and the rest goes
/// on.
async fn submit(
    controls: &mpsc::UnboundedSender<Control<SiteEngine>>,
    tx: &Arc<Outbox>,
    shared: &Mutex<Shared>,
    client: &str,
    batch: &mut Batch,
) -> Result<(), Stopped> {
    while !batch.items.is_empty() {
        let (otx, orx) = oneshot::channel();
        let mut items = std::mem::take(&mut batch.items);
        let (c, tx) = (client.to_string(), tx.clone());
        let asked = controls
            .send(Box::new(move |e: &mut SiteEngine, now, _| {
                let d = e.daemon_mut();
                while let Some((service, groups, payload)) = items.pop_front() {
                    match d.send(now, &c, service, &groups, payload.clone()) {
                        Ok(()) => {}
                        Err(ClientError::QueueFull) => {
                            items.push_front((service, groups, payload));
                            break;
                        }
                        Err(e) => {
                            tx.push(&error_bytes(code::LIMIT, &e.to_string()));
                        }
                    }
                }
                let _ = otx.send(items);
            }))
            .is_ok();
        let left = if asked { orx.await.ok() } else { None };
        let Some(left) = left else {
            return Err(Stopped);
        };
        if !left.is_empty() {
            shared.lock().expect("lock").stats.queue_full_waits += 1;
            tokio::time::sleep(QUEUE_RETRY).await;
        }
        batch.items = left;
    }
    batch.bytes = 0;
    Ok(())
}

/// Why `group` cannot be joined, if it cannot.
fn bad_group(group: &str, limits: &Limits) -> Option<String> {
    if group.starts_with('#') {
        Some("names starting with '#' are private groups; they cannot be joined".into())
    } else if group.len() > limits.name_max {
        Some(format!("a group name is at most {} bytes", limits.name_max))
    } else {
        None
    }
}

enum Request {
    Join(String),
    Leave(String),
}

/// Hands a join or leave to the engine; a refusal comes back to the
/// client as an `Error` frame.
fn request(
    controls: &mpsc::UnboundedSender<Control<SiteEngine>>,
    tx: &Arc<Outbox>,
    client: &str,
    r: Request,
) {
    let (client, tx) = (client.to_string(), tx.clone());
    controls
        .send(Box::new(move |e: &mut SiteEngine, now, _| {
            let d = e.daemon_mut();
            let result = match &r {
                Request::Join(g) => d.join(now, &client, g),
                Request::Leave(g) => d.leave(now, &client, g),
            };
            if let Err(e) = result {
                tx.push(&error_bytes(code::LIMIT, &e.to_string()));
            }
        }))
        .ok();
}
