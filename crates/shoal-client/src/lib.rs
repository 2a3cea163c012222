//! The Shoal client library: how an application talks to its local
//! `shoal daemon` (DESIGN.md, "What a user sees"; the wire format is
//! `docs/client-protocol.md`, the codec [`shoal_wire::client`]).
//!
//! An application connects under a private name, joins groups, multicasts
//! to one or several groups with a [`Service`] (the delivery guarantee), and
//! receives [`Message`]s and [`Membership`] views of the groups it joined:
//!
//! ```no_run
//! use shoal_client::{Client, Received, Service};
//!
//! # fn main() -> Result<(), shoal_client::ClientError> {
//! // The daemon's Unix socket at its default path; see `Endpoint` for TCP.
//! let mut client = Client::connect("alice")?;
//! println!("I am {}", client.private_group());
//! client.join("chat")?;
//! client.multicast(Service::Agreed, &["chat"], b"hello")?;
//! loop {
//!     match client.receive()? {
//!         Received::Message(m) => {
//!             println!("{} [{}]: {}", m.sender, m.service.name(), String::from_utf8_lossy(&m.payload));
//!             if m.payload == b"bye" {
//!                 break;
//!             }
//!         }
//!         Received::Membership(v) => println!("{} #{}: {:?}", v.group, v.view_id, v.members),
//!     }
//! }
//! client.disconnect()
//! # }
//! ```
//!
//! - [`Client`] is blocking (one `std` socket). [`Client::split`] gives a
//!   [`SendHalf`] and a [`RecvHalf`], so one thread can multicast while
//!   another receives.
//! - [`tokio::Client`] (feature `tokio`, on by default) has the same
//!   operations as `async fn`s, and splits into owned halves.
//!
//! Errors: an `Error` frame from the daemon comes back as
//! [`ClientError::Daemon`] from `connect` (the daemon refused the
//! connection) or from the next `receive` (it refused an earlier request,
//! such as a multicast with a service it does not implement). The
//! connection survives such an error unless the daemon closes it, in which
//! case the receive after it returns [`ClientError::Disconnected`].
//!
//! Requests are checked against the client's [`Limits`] (the daemon's
//! defaults unless given with `connect_with_limits`) before anything is
//! sent: a daemon would answer an empty or overlong name with a
//! malformed-frame error and close the connection.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use shoal_wire::client::{decode, features, multicast_flags, Frame, LENGTH_LEN, TOKEN_MAX};

pub use shoal_wire::client::{code, default_socket_path, FrameError, Limits, Reason, Service};

pub mod state;

mod blocking;
#[cfg(feature = "tokio")]
pub mod tokio;

pub use blocking::{status, Client, RecvHalf, SendHalf};

/// How long `disconnect` waits for the daemon to close the connection
/// (reporting any error it still had for this client) before giving up.
pub const DISCONNECT_WAIT: Duration = Duration::from_secs(5);

/// Where the daemon serves clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The daemon's Unix socket (no token: the socket's permissions decide
    /// who may connect).
    Unix(PathBuf),
    /// A daemon's TCP listener, with the token it requires.
    Tcp { addr: SocketAddr, token: String },
}

impl Default for Endpoint {
    /// The Unix socket at [`default_socket_path`], where a daemon listens
    /// when not configured otherwise.
    fn default() -> Self {
        Endpoint::Unix(default_socket_path())
    }
}

impl Endpoint {
    /// The token a `Connect` carries: empty over the Unix socket.
    pub fn token(&self) -> &str {
        match self {
            Endpoint::Unix(_) => "",
            Endpoint::Tcp { token, .. } => token,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "{}", path.display()),
            Endpoint::Tcp { addr, .. } => write!(f, "tcp {addr}"),
        }
    }
}

/// A message delivered to a group this client joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The sender's private group (its address, e.g. `#alice#host`).
    pub sender: String,
    /// The guarantee it was sent with.
    pub service: Service,
    /// Every group it was addressed to (it is delivered once to a member
    /// of several).
    pub groups: Vec<String>,
    /// The application's message type (Spread's `mess_type`), as the
    /// sender gave it in [`SendOptions`]; 0 when it gave none.
    pub mess_type: u16,
    pub payload: Vec<u8>,
}

/// Options of one multicast (`multicast_with`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// Spread's SELF_DISCARD: the daemon does not deliver this message
    /// back to this connection (other connections still get it).
    pub self_discard: bool,
    /// A number the receivers get unchanged in [`Message::mess_type`].
    pub mess_type: u16,
}

impl SendOptions {
    fn flags(self) -> u8 {
        if self.self_discard {
            multicast_flags::SELF_DISCARD
        } else {
            0
        }
    }
}

/// Whether the daemon is taking what this client sends (as corosync's
/// `cpg_flow_control_state_get`): see `Client::flow_control`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowControl {
    /// Nothing waits in the client: the daemon took every byte sent.
    Clear,
    /// Bytes of a message accepted by `try_multicast` wait in the client
    /// because the daemon's end of the connection is full (the daemon
    /// reads no faster): `try_multicast` refuses until they are written.
    Blocked { pending_bytes: usize },
}

/// What holds this client's traffic back, on both sides of the connection
/// (`Client::flow_control_state`; corosync's `cpg_flow_control_state_get`
/// says only whether sending is blocked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowControlState {
    /// Bytes of a message `try_multicast` accepted that still wait in this
    /// client (the daemon's end of the connection was full).
    pub client_pending_bytes: usize,
    /// The daemon's answer; `None` when it did not answer in time: it is
    /// not reading this client's socket (back-pressure: it takes no client
    /// input until its queue for the daemons' group drains).
    pub daemon: Option<DaemonFlow>,
}

/// What the daemon holds for one client, when it read the query
/// ([`FlowControlState::daemon`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonFlow {
    /// Whether the daemon takes client input now. While it does not, it
    /// reads no client's socket, and blocking sends wait.
    pub accepting: bool,
    /// This client's messages the daemon holds that the daemons' total
    /// order has not delivered yet (waiting for a batch, being ordered, or
    /// ordered and held back for `safe`).
    pub held_messages: u32,
    /// Their payload bytes.
    pub held_bytes: u64,
    /// Bytes of frames (messages, views) the daemon had queued to this
    /// client and not yet written to its socket. They all come before the
    /// answer, so the client has read them by the time it gets it: this
    /// says how far behind the client was reading.
    pub queued_bytes: u64,
    /// The bound of that queue (`limits.client_queue`): a client whose
    /// queue passes it is disconnected as slow.
    pub queue_limit: u64,
}

impl DaemonFlow {
    fn from_frame(frame: &Frame) -> Option<(u32, DaemonFlow)> {
        match *frame {
            Frame::FlowState {
                nonce,
                accepting,
                held_messages,
                held_bytes,
                queued_bytes,
                queue_limit,
            } => Some((
                nonce,
                DaemonFlow {
                    accepting,
                    held_messages,
                    held_bytes,
                    queued_bytes,
                    queue_limit,
                },
            )),
            _ => None,
        }
    }
}

/// The nonce and member list of a `GroupMembers` answer.
pub(crate) fn members_answer(frame: &Frame) -> Option<(u32, Vec<String>)> {
    match frame {
        Frame::GroupMembers { nonce, members, .. } => Some((*nonce, members.clone())),
        _ => None,
    }
}

/// Whether `receive` drops the frame: an answer to a query nobody waits
/// for any more.
pub(crate) fn stale_answer(frame: &Frame) -> bool {
    matches!(frame, Frame::FlowState { .. } | Frame::GroupMembers { .. })
}

/// How often a flow-control query that waits for its answer tries again to
/// write what is pending (the query may be among it).
pub(crate) const FLOW_STEP: Duration = Duration::from_millis(5);

/// The parts of a private group `#name#daemon`: the private name and the
/// daemon's name.
pub fn split_private_group(private_group: &str) -> Option<(&str, &str)> {
    let rest = private_group.strip_prefix('#')?;
    rest.split_once('#')
}

/// A new view of a group this client joined.
///
/// Besides the full member list, each view says what changed since the
/// previous view of the group this client received: [`Membership::joined`]
/// and [`Membership::left`] (as corosync's `joined_list` and `left_list`,
/// or JGroups' `View.diff`). The client library computes them from
/// consecutive views, so they mean the same whatever the daemon sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub group: String,
    /// Grows with each view of the group; a view is named by `view_id` and
    /// `transitional` together.
    pub view_id: u64,
    /// Why the membership changed.
    pub reason: Reason,
    /// A transitional view (extended virtual synchrony): this client's
    /// daemon is cut off from the rest, and `members` are those still with
    /// it; a regular view follows when the daemons merge again.
    pub transitional: bool,
    /// Whether the daemons of the view hold their configured quorum
    /// (docs/semantics.md). An application that needs a primary component
    /// acts only while it is set.
    pub quorum: bool,
    /// The members' private groups.
    pub members: Vec<String>,
    /// See [`Membership::joined`].
    joined: Vec<String>,
    /// See [`Membership::left`].
    left: Vec<String>,
}

impl Membership {
    /// A view with empty `joined` and `left` lists, as the daemon's frame
    /// has it before the client compares it with the previous view (for
    /// tests, and for applications that make views of their own); add the
    /// lists with [`Membership::with_changes`].
    pub fn new(
        group: impl Into<String>,
        view_id: u64,
        reason: Reason,
        transitional: bool,
        quorum: bool,
        members: Vec<String>,
    ) -> Membership {
        Membership {
            group: group.into(),
            view_id,
            reason,
            transitional,
            quorum,
            members,
            joined: Vec::new(),
            left: Vec::new(),
        }
    }

    /// This view with the given `joined` and `left` lists.
    pub fn with_changes(mut self, joined: Vec<String>, left: Vec<String>) -> Membership {
        self.joined = joined;
        self.left = left;
        self
    }

    /// The members of this view that were not in the previous view of the
    /// group this client received, in the order of [`Membership::members`].
    ///
    /// In the first view after this client joins, only the client itself
    /// (as corosync's CPG says it): a client that was not a member cannot
    /// tell which of the others joined just before it.
    /// After a transitional view, the regular view that follows lists the
    /// members that came back with the merge as joined, besides any that
    /// joined meanwhile.
    pub fn joined(&self) -> &[String] {
        &self.joined
    }

    /// The members of the previous view of the group this client received
    /// that are not in this one, whatever the reason, sorted; `reason`
    /// says why (a view has one reason: [`Membership::disconnected`] and
    /// [`Membership::partitioned`] are this list by reason, as Spread's
    /// `CAUSED_BY_DISCONNECT` and `CAUSED_BY_NETWORK`; with
    /// [`Reason::Leave`] they left the group of their own accord).
    ///
    /// When this client leaves a group, the last view it gets lists itself
    /// here. A transitional view lists here the members this client's
    /// daemon is cut off from (its own clients stay); the regular view
    /// after it lists nobody here for that cut, and its `joined` brings
    /// back those that are members again.
    pub fn left(&self) -> &[String] {
        &self.left
    }

    /// [`Membership::left`] when their connections ended
    /// ([`Reason::Disconnect`]: the client disconnected, crashed, or was
    /// disconnected as slow); empty otherwise.
    pub fn disconnected(&self) -> &[String] {
        match self.reason {
            Reason::Disconnect => &self.left,
            _ => &[],
        }
    }

    /// [`Membership::left`] when the network took them away
    /// ([`Reason::Network`]: their daemon failed, was evicted or is on the
    /// other side of a partition); empty otherwise.
    pub fn partitioned(&self) -> &[String] {
        match self.reason {
            Reason::Network => &self.left,
            _ => &[],
        }
    }
}

/// The last view of each group this client belongs to (its id and
/// members), which each new view is compared with ([`Membership::joined`],
/// [`Membership::left`]) and a membership delta from the daemon is applied
/// to.
#[derive(Debug, Default)]
pub(crate) struct Views {
    last: BTreeMap<String, (u64, Vec<String>)>,
}

impl Views {
    /// Fills in `view`'s joined and left lists (`me` is this client's
    /// private group), and remembers it as the group's last view while
    /// this client is a member.
    pub(crate) fn annotate(&mut self, me: &str, view: &mut Membership) {
        let before: BTreeSet<&str> = match self.last.get(&view.group) {
            Some((_, members)) => members.iter().map(String::as_str).collect(),
            // The first view: everybody but this client was there before.
            None => view
                .members
                .iter()
                .map(String::as_str)
                .filter(|m| *m != me)
                .collect(),
        };
        let now: BTreeSet<&str> = view.members.iter().map(String::as_str).collect();
        view.joined = view
            .members
            .iter()
            .filter(|m| !before.contains(m.as_str()))
            .cloned()
            .collect();
        view.left = before.difference(&now).map(|m| (*m).to_owned()).collect();
        if now.contains(me) {
            self.last
                .insert(view.group.clone(), (view.view_id, view.members.clone()));
        } else {
            self.last.remove(&view.group);
        }
    }

    /// A frame after the handshake, as `receive` returns it.
    pub(crate) fn received(&mut self, me: &str, frame: Frame) -> Result<Received, ClientError> {
        let mut event = match frame {
            Frame::MembershipDelta { .. } => Received::Membership(self.rebuild(frame)?),
            frame => received(frame)?,
        };
        if let Received::Membership(view) = &mut event {
            self.annotate(me, view);
        }
        Ok(event)
    }
}

impl Views {
    /// The whole view a [`Frame::MembershipDelta`] stands for: the last
    /// view of its group, which must be the one it changes, without
    /// `left`, with `joined`, sorted as the daemon's lists are.
    fn rebuild(&self, delta: Frame) -> Result<Membership, ClientError> {
        let Frame::MembershipDelta {
            group,
            view_id,
            previous,
            reason,
            transitional,
            quorum,
            joined,
            left,
        } = delta
        else {
            return Err(unwanted(delta));
        };
        let Some((last, members)) = self.last.get(&group) else {
            return Err(ClientError::Unexpected(
                "MembershipDelta for a group without a view",
            ));
        };
        if *last != previous {
            return Err(ClientError::Unexpected(
                "MembershipDelta of a view other than the last",
            ));
        }
        let gone: BTreeSet<&str> = left.iter().map(String::as_str).collect();
        let mut members: Vec<String> = members
            .iter()
            .filter(|m| !gone.contains(m.as_str()))
            .cloned()
            .chain(joined)
            .collect();
        members.sort();
        members.dedup();
        Ok(Membership::new(
            group,
            view_id,
            reason,
            transitional,
            quorum,
            members,
        ))
    }
}

/// What `receive` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    Message(Message),
    Membership(Membership),
}

/// What can go wrong. Each message includes its cause (no error here has
/// a `source`), so printing one says it all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No daemon answers at the endpoint (no socket, connection refused).
    #[error("cannot reach the daemon at {endpoint}: {error}")]
    Unreachable { endpoint: String, error: io::Error },
    /// The daemon sent an `Error` frame (codes in [`code`]).
    #[error("{text} (code {code})")]
    Daemon { code: u16, text: String },
    /// The daemon closed the connection or said `Disconnect`.
    #[error("disconnected from the daemon")]
    Disconnected,
    /// The daemon sent bytes that are not a valid frame.
    #[error("bad frame from the daemon: {0}")]
    Protocol(FrameError),
    /// The daemon sent a valid frame that has no business here (such as a
    /// second `ConnectOk`).
    #[error("unexpected {0} frame from the daemon")]
    Unexpected(&'static str),
    /// A request this client refused to send (empty or overlong name,
    /// no groups, payload over the limit); nothing was sent.
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("client socket: {0}")]
    Io(io::Error),
    /// `try_multicast` found the connection to the daemon full (a message
    /// accepted earlier is still partly unwritten); nothing was sent. Try
    /// again later, or send blocking.
    #[error("the daemon is not taking more yet (back-pressure); nothing was sent")]
    WouldBlock,
}

impl ClientError {
    /// The code of a [`ClientError::Daemon`] error.
    pub fn code(&self) -> Option<u16> {
        match self {
            ClientError::Daemon { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the connection is gone.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, ClientError::Disconnected)
    }
}

impl From<FrameError> for ClientError {
    fn from(e: FrameError) -> Self {
        ClientError::Protocol(e)
    }
}

impl From<io::Error> for ClientError {
    /// A closed or reset connection is [`ClientError::Disconnected`].
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof => ClientError::Disconnected,
            _ => ClientError::Io(e),
        }
    }
}

// ---- shared by the blocking and async clients ----

/// Bytes read for each `read` call at least.
const CHUNK: usize = 64 * 1024;

/// An outgoing buffer larger than this is given back after its frame is
/// written (it grew for one large payload).
const KEEP_OUT: usize = 4 * CHUNK;

/// Assembles frames from what the socket gives: one buffer with the
/// unconsumed bytes in `start..end`. It grows to the largest frame seen
/// (bounded by the limits, which `decode` checks before any growth).
pub(crate) struct ReadBuf {
    data: Vec<u8>,
    start: usize,
    end: usize,
    limits: Limits,
}

impl ReadBuf {
    pub(crate) fn new(limits: Limits) -> ReadBuf {
        ReadBuf {
            data: Vec::new(),
            start: 0,
            end: 0,
            limits,
        }
    }

    /// The next whole frame in the buffer, if one is there.
    pub(crate) fn frame(&mut self) -> Result<Option<Frame>, FrameError> {
        match decode(&self.data[self.start..self.end], &self.limits)? {
            Some((frame, used)) => {
                self.start += used;
                if self.start == self.end {
                    self.start = 0;
                    self.end = 0;
                }
                Ok(Some(frame))
            }
            None => Ok(None),
        }
    }

    /// Room to read into, enough for the whole frame being assembled when
    /// its length is known (only call after `frame` returned `Ok(None)`, so
    /// that length passed the limits).
    pub(crate) fn spare(&mut self) -> &mut [u8] {
        let pending = self.end - self.start;
        let whole = match self.data[self.start..self.end].first_chunk::<LENGTH_LEN>() {
            Some(prefix) => LENGTH_LEN + u32::from_be_bytes(*prefix) as usize,
            None => LENGTH_LEN,
        };
        let need = whole.max(pending + 1);
        if self.data.len() - self.start < need || self.end == self.data.len() {
            self.data.copy_within(self.start..self.end, 0);
            self.start = 0;
            self.end = pending;
            if self.data.len() < need.max(CHUNK) {
                self.data.resize(need.max(CHUNK), 0);
            }
        }
        &mut self.data[self.end..]
    }

    /// `n` bytes were read into [`ReadBuf::spare`].
    pub(crate) fn filled(&mut self, n: usize) {
        self.end += n;
    }
}

/// The frames a client sends, encoded into a reused buffer after the
/// arguments are checked against the limits.
pub(crate) struct Encoder {
    pub(crate) out: Vec<u8>,
    limits: Limits,
}

impl Encoder {
    pub(crate) fn new(limits: Limits) -> Encoder {
        Encoder {
            out: Vec::new(),
            limits,
        }
    }

    /// Called once the buffer's frame is written.
    pub(crate) fn written(&mut self) {
        self.out.clear();
        if self.out.capacity() > KEEP_OUT {
            self.out = Vec::new();
        }
    }

    fn check_name(&self, what: &str, name: &str) -> Result<(), ClientError> {
        if name.is_empty() {
            return Err(ClientError::Invalid(format!("an empty {what}")));
        }
        if name.len() > self.limits.name_max {
            return Err(ClientError::Invalid(format!(
                "{what} {name:?} is {} bytes; the limit is {}",
                name.len(),
                self.limits.name_max
            )));
        }
        Ok(())
    }

    fn frame(&mut self, frame: &Frame) -> Result<&[u8], ClientError> {
        self.out.clear();
        frame
            .encode(&mut self.out)
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        Ok(&self.out)
    }

    pub(crate) fn connect(&mut self, name: &str, token: &str) -> Result<&[u8], ClientError> {
        self.check_name("private name", name)?;
        if token.len() > TOKEN_MAX {
            return Err(ClientError::Invalid(format!(
                "the token is {} bytes; the limit is {TOKEN_MAX}",
                token.len()
            )));
        }
        // Membership deltas: the library rebuilds each whole view.
        self.frame(&Frame::ConnectExt {
            name: name.to_owned(),
            token: token.to_owned(),
            features: features::MEMBERSHIP_DELTAS,
        })
    }

    pub(crate) fn join(&mut self, group: &str) -> Result<&[u8], ClientError> {
        self.check_name("group name", group)?;
        self.frame(&Frame::Join {
            group: group.to_owned(),
        })
    }

    pub(crate) fn leave(&mut self, group: &str) -> Result<&[u8], ClientError> {
        self.check_name("group name", group)?;
        self.frame(&Frame::Leave {
            group: group.to_owned(),
        })
    }

    pub(crate) fn flow_query(&mut self, nonce: u32) -> Result<&[u8], ClientError> {
        self.frame(&Frame::FlowQuery { nonce })
    }

    pub(crate) fn group_query(&mut self, nonce: u32, group: &str) -> Result<&[u8], ClientError> {
        self.check_name("group name", group)?;
        if group.starts_with('#') {
            return Err(ClientError::Invalid(format!(
                "{group:?} is a private group, not a group one joins"
            )));
        }
        self.frame(&Frame::GroupQuery {
            nonce,
            group: group.to_owned(),
        })
    }

    pub(crate) fn disconnect(&mut self) -> Result<&[u8], ClientError> {
        self.frame(&Frame::Disconnect)
    }

    /// A `Multicast` frame alone in the buffer, without first copying the
    /// payload into a [`Frame`] (see [`Encoder::append_payload`]).
    pub(crate) fn multicast<G: AsRef<str>>(
        &mut self,
        service: Service,
        opts: SendOptions,
        groups: &[G],
        payload: &[u8],
    ) -> Result<&[u8], ClientError> {
        self.out.clear();
        self.check_payload(payload)?;
        self.multicast_head(service, opts, groups)?;
        self.append_payload(0, payload)?;
        Ok(&self.out)
    }

    /// One `Multicast` frame per payload, one after the other in the
    /// buffer, so that a single write hands them all to the daemon. The
    /// groups are checked and the frame's head encoded once; each frame
    /// is a copy of that head with its payload. All or nothing: if one
    /// payload is refused the buffer is left empty and the error names
    /// that payload.
    pub(crate) fn multicast_batch<G: AsRef<str>, P: AsRef<[u8]>>(
        &mut self,
        service: Service,
        opts: SendOptions,
        groups: &[G],
        payloads: &[P],
    ) -> Result<&[u8], ClientError> {
        self.out.clear();
        for (i, payload) in payloads.iter().enumerate() {
            self.check_payload(payload.as_ref()).map_err(|e| match e {
                ClientError::Invalid(why) => {
                    ClientError::Invalid(format!("payload {i} of the batch: {why}"))
                }
                other => other,
            })?;
        }
        if payloads.is_empty() {
            return Ok(&self.out);
        }
        self.multicast_head(service, opts, groups)?;
        let head = self.out.len();
        for (i, payload) in payloads.iter().enumerate() {
            // The first frame's head is in place; the others copy it.
            let start = if i == 0 { 0 } else { self.out.len() };
            if i > 0 {
                self.out.extend_from_within(..head);
            }
            if let Err(e) = self.append_payload(start, payload.as_ref()) {
                self.out.clear();
                return Err(e);
            }
        }
        Ok(&self.out)
    }

    fn check_payload(&self, payload: &[u8]) -> Result<(), ClientError> {
        if payload.len() > self.limits.payload_max {
            return Err(ClientError::Invalid(format!(
                "a payload of {} bytes; the limit is {}",
                payload.len(),
                self.limits.payload_max
            )));
        }
        Ok(())
    }

    /// Checks `groups` and appends a `Multicast` frame with an empty
    /// payload: the head that [`Encoder::append_payload`] completes.
    fn multicast_head<G: AsRef<str>>(
        &mut self,
        service: Service,
        opts: SendOptions,
        groups: &[G],
    ) -> Result<(), ClientError> {
        if groups.is_empty() {
            return Err(ClientError::Invalid(
                "a multicast names at least one group".into(),
            ));
        }
        if groups.len() > self.limits.groups_max {
            return Err(ClientError::Invalid(format!(
                "{} groups; the limit is {}",
                groups.len(),
                self.limits.groups_max
            )));
        }
        for g in groups {
            self.check_name("group name", g.as_ref())?;
        }
        let groups = groups.iter().map(|g| g.as_ref().to_owned()).collect();
        let frame = if opts == SendOptions::default() {
            Frame::Multicast {
                service,
                groups,
                payload: Vec::new(),
            }
        } else {
            Frame::MulticastExt {
                service,
                flags: opts.flags(),
                mess_type: opts.mess_type,
                groups,
                payload: Vec::new(),
            }
        };
        frame
            .encode(&mut self.out)
            .map_err(|e| ClientError::Invalid(e.to_string()))
    }

    /// Completes the head that ends the buffer (the frame starting at
    /// `start`) with `payload`: the payload's length field (the body's
    /// last field) and the frame's length are patched, and the payload
    /// appended.
    fn append_payload(&mut self, start: usize, payload: &[u8]) -> Result<(), ClientError> {
        let too_long = |_| ClientError::Invalid("the frame is too long".into());
        let len = u32::try_from(payload.len()).map_err(too_long)?;
        let at = self.out.len() - 4;
        self.out[at..].copy_from_slice(&len.to_be_bytes());
        self.out.extend_from_slice(payload);
        let frame_len = u32::try_from(self.out.len() - start - LENGTH_LEN).map_err(too_long)?;
        self.out[start..start + LENGTH_LEN].copy_from_slice(&frame_len.to_be_bytes());
        Ok(())
    }
}

impl std::fmt::Debug for ReadBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadBuf")
            .field("buffered", &(self.end - self.start))
            .finish()
    }
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").finish_non_exhaustive()
    }
}

/// The daemon's answer to `Connect`: the private group, or why not.
pub(crate) fn connect_answer(frame: Frame) -> Result<String, ClientError> {
    match frame {
        Frame::ConnectOk { private_group } => Ok(private_group),
        other => Err(unwanted(other)),
    }
}

/// A frame after the handshake as an event, before [`Views::annotate`].
pub(crate) fn received(frame: Frame) -> Result<Received, ClientError> {
    match frame {
        Frame::Message {
            sender,
            service,
            groups,
            payload,
        } => Ok(Received::Message(Message {
            sender,
            service,
            groups,
            mess_type: 0,
            payload,
        })),
        Frame::MessageExt {
            sender,
            service,
            mess_type,
            groups,
            payload,
        } => Ok(Received::Message(Message {
            sender,
            service,
            groups,
            mess_type,
            payload,
        })),
        Frame::Membership {
            group,
            view_id,
            reason,
            transitional,
            quorum,
            members,
        } => Ok(Received::Membership(Membership::new(
            group,
            view_id,
            reason,
            transitional,
            quorum,
            members,
        ))),
        other => Err(unwanted(other)),
    }
}

/// The error a frame other than the one expected stands for.
pub(crate) fn unwanted(frame: Frame) -> ClientError {
    match frame {
        Frame::Error { code, text } => ClientError::Daemon { code, text },
        Frame::Disconnect => ClientError::Disconnected,
        Frame::Connect { .. } => ClientError::Unexpected("Connect"),
        Frame::ConnectOk { .. } => ClientError::Unexpected("ConnectOk"),
        Frame::Join { .. } => ClientError::Unexpected("Join"),
        Frame::Leave { .. } => ClientError::Unexpected("Leave"),
        Frame::Multicast { .. } => ClientError::Unexpected("Multicast"),
        Frame::Message { .. } => ClientError::Unexpected("Message"),
        Frame::MulticastExt { .. } => ClientError::Unexpected("MulticastExt"),
        Frame::MessageExt { .. } => ClientError::Unexpected("MessageExt"),
        Frame::Membership { .. } => ClientError::Unexpected("Membership"),
        Frame::MembershipDelta { .. } => ClientError::Unexpected("MembershipDelta"),
        Frame::ConnectExt { .. } => ClientError::Unexpected("ConnectExt"),
        Frame::Status => ClientError::Unexpected("Status"),
        Frame::StatusReply { .. } => ClientError::Unexpected("StatusReply"),
        Frame::FlowQuery { .. } => ClientError::Unexpected("FlowQuery"),
        Frame::FlowState { .. } => ClientError::Unexpected("FlowState"),
        Frame::GroupQuery { .. } => ClientError::Unexpected("GroupQuery"),
        Frame::GroupMembers { .. } => ClientError::Unexpected("GroupMembers"),
    }
}

/// What `disconnect` makes of a frame arriving while it waits for the
/// daemon to close: `Some` ends the wait with that result.
pub(crate) fn after_disconnect(
    frame: Result<Frame, ClientError>,
) -> Option<Result<(), ClientError>> {
    match frame {
        Ok(Frame::Error { code, text }) => Some(Err(ClientError::Daemon { code, text })),
        Ok(Frame::Disconnect) => Some(Ok(())),
        // Deliveries after the goodbye are dropped.
        Ok(_) => None,
        Err(ClientError::Io(e)) => Some(Err(ClientError::Io(e))),
        // Closed (the expected end), or garbage: either way it is over.
        Err(_) => Some(Ok(())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Vec<Frame> {
        vec![
            Frame::ConnectOk {
                private_group: "#a#h".into(),
            },
            Frame::Message {
                sender: "#b#h".into(),
                service: Service::Fifo,
                groups: vec!["g1".into(), "g2".into()],
                payload: (0..200_000u32).map(|i| i as u8).collect(),
            },
            Frame::Membership {
                group: "g1".into(),
                view_id: 7,
                reason: Reason::Network,
                transitional: true,
                quorum: false,
                members: vec!["#a#h".into(), "#b#h".into()],
            },
            Frame::Error {
                code: code::BAD_GROUP,
                text: "no".into(),
            },
            Frame::Message {
                sender: "#b#h".into(),
                service: Service::Safe,
                groups: vec!["g".into()],
                payload: Vec::new(),
            },
            Frame::Disconnect,
        ]
    }

    /// Feeds a stream of frames through `ReadBuf` in pieces of `step`
    /// bytes (at most what `spare` offers) and checks they come out whole
    /// and in order.
    fn reassemble(step: usize) {
        let want = frames();
        let mut stream = Vec::new();
        for f in &want {
            f.encode(&mut stream).unwrap();
        }
        let mut buf = ReadBuf::new(Limits::default());
        let mut got = Vec::new();
        let mut at = 0;
        while at < stream.len() {
            while let Some(f) = buf.frame().unwrap() {
                got.push(f);
            }
            let spare = buf.spare();
            let n = step.min(spare.len()).min(stream.len() - at);
            spare[..n].copy_from_slice(&stream[at..at + n]);
            buf.filled(n);
            at += n;
        }
        while let Some(f) = buf.frame().unwrap() {
            got.push(f);
        }
        assert_eq!(got, want);
    }

    #[test]
    fn read_buf_reassembles_frames_from_any_piece_size() {
        for step in [1, 2, 3, 5, 7, 64, 1000, 4096, 65_535, 65_536, 1 << 20] {
            reassemble(step);
        }
    }

    #[test]
    fn read_buf_reports_garbage() {
        let mut buf = ReadBuf::new(Limits::default());
        let garbage = [0, 0, 0, 3, 9, 9, 9];
        buf.spare()[..garbage.len()].copy_from_slice(&garbage);
        buf.filled(garbage.len());
        assert_eq!(buf.frame(), Err(FrameError::BadVersion(9)));
    }

    #[test]
    fn multicast_encoding_matches_the_codec() {
        let mut enc = Encoder::new(Limits::default());
        for payload in [Vec::new(), b"hi".to_vec(), vec![7u8; 100_000]] {
            let bytes = enc
                .multicast(
                    Service::Causal,
                    SendOptions::default(),
                    &["a", "bb"],
                    &payload,
                )
                .unwrap()
                .to_vec();
            let want = Frame::Multicast {
                service: Service::Causal,
                groups: vec!["a".into(), "bb".into()],
                payload,
            }
            .to_vec()
            .unwrap();
            assert_eq!(bytes, want);
        }
    }

    #[test]
    fn options_choose_the_extended_frame() {
        let mut enc = Encoder::new(Limits::default());
        let opts = SendOptions {
            self_discard: true,
            mess_type: 300,
        };
        let bytes = enc
            .multicast(Service::Agreed, opts, &["g"], b"p")
            .unwrap()
            .to_vec();
        let want = Frame::MulticastExt {
            service: Service::Agreed,
            flags: multicast_flags::SELF_DISCARD,
            mess_type: 300,
            groups: vec!["g".into()],
            payload: b"p".to_vec(),
        };
        assert_eq!(bytes, want.to_vec().unwrap());
        let typed = Frame::MessageExt {
            sender: "#a#d".into(),
            service: Service::Agreed,
            mess_type: 300,
            groups: vec!["g".into()],
            payload: b"p".to_vec(),
        };
        match received(typed).unwrap() {
            Received::Message(m) => assert_eq!(m.mess_type, 300),
            other => panic!("{other:?}"),
        }
        assert_eq!(split_private_group("#alice#n1"), Some(("alice", "n1")));
        assert_eq!(split_private_group("alice"), None);
    }

    #[test]
    fn a_batch_is_the_frames_of_its_payloads_one_after_the_other() {
        let mut enc = Encoder::new(Limits::default());
        let payloads = [b"one".to_vec(), Vec::new(), vec![9u8; 70_000]];
        let bytes = enc
            .multicast_batch(Service::Fifo, SendOptions::default(), &["g"], &payloads)
            .unwrap()
            .to_vec();
        let mut want = Vec::new();
        for payload in &payloads {
            Frame::Multicast {
                service: Service::Fifo,
                groups: vec!["g".into()],
                payload: payload.clone(),
            }
            .encode(&mut want)
            .unwrap();
        }
        assert_eq!(bytes, want);
        let none: [&[u8]; 0] = [];
        assert!(enc
            .multicast_batch(Service::Fifo, SendOptions::default(), &["g"], &none)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_batch_with_one_refused_payload_sends_nothing() {
        let limits = Limits {
            payload_max: 10,
            ..Limits::default()
        };
        let mut enc = Encoder::new(limits);
        let payloads: [&[u8]; 3] = [b"fine", b"far too long", b"fine"];
        match enc.multicast_batch(Service::Agreed, SendOptions::default(), &["g"], &payloads) {
            Err(ClientError::Invalid(why)) => {
                assert!(why.starts_with("payload 1 of the batch"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        assert!(enc.out.is_empty());
        // The encoder is usable afterwards.
        assert!(!enc
            .multicast(Service::Agreed, SendOptions::default(), &["g"], b"x")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn requests_are_checked_before_sending() {
        let mut enc = Encoder::new(Limits::default());
        let none: [&str; 0] = [];
        assert!(matches!(
            enc.multicast(Service::Agreed, SendOptions::default(), &none, b"x"),
            Err(ClientError::Invalid(_))
        ));
        assert!(matches!(
            enc.multicast(Service::Agreed, SendOptions::default(), &["g", ""], b"x"),
            Err(ClientError::Invalid(_))
        ));
        assert!(matches!(
            enc.multicast(
                Service::Agreed,
                SendOptions::default(),
                &["g"],
                &vec![0; (1 << 20) + 1]
            ),
            Err(ClientError::Invalid(_))
        ));
        assert!(matches!(enc.join(""), Err(ClientError::Invalid(_))));
        assert!(matches!(
            enc.leave(&"x".repeat(129)),
            Err(ClientError::Invalid(_))
        ));
        assert!(matches!(
            enc.connect("me", &"t".repeat(256)),
            Err(ClientError::Invalid(_))
        ));
        assert!(matches!(enc.connect("", ""), Err(ClientError::Invalid(_))));
    }

    fn view(reason: Reason, transitional: bool, members: &[&str]) -> Frame {
        Frame::Membership {
            group: "g".into(),
            view_id: 1,
            reason,
            transitional,
            quorum: !transitional,
            members: members.iter().map(|m| m.to_string()).collect(),
        }
    }

    /// `(joined, left, disconnected, partitioned)` of the view `frame`
    /// makes after the views `views` has seen.
    fn changes(views: &mut Views, frame: Frame) -> [Vec<String>; 4] {
        match views.received("#me#d", frame).unwrap() {
            Received::Membership(v) => [
                v.joined().to_vec(),
                v.left().to_vec(),
                v.disconnected().to_vec(),
                v.partitioned().to_vec(),
            ],
            other => panic!("{other:?}"),
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|m| m.to_string()).collect()
    }

    #[test]
    fn views_say_who_joined_and_who_left_by_reason() {
        let mut views = Views::default();
        let none: Vec<String> = Vec::new();
        // This client's first view: itself joined, the others were there.
        assert_eq!(
            changes(&mut views, view(Reason::Join, false, &["#a#d", "#me#d"])),
            [names(&["#me#d"]), none.clone(), none.clone(), none.clone()]
        );
        assert_eq!(
            changes(
                &mut views,
                view(Reason::Join, false, &["#a#d", "#b#e", "#me#d"])
            ),
            [names(&["#b#e"]), none.clone(), none.clone(), none.clone()]
        );
        assert_eq!(
            changes(&mut views, view(Reason::Leave, false, &["#b#e", "#me#d"])),
            [none.clone(), names(&["#a#d"]), none.clone(), none.clone()]
        );
        assert_eq!(
            changes(&mut views, view(Reason::Disconnect, false, &["#me#d"])),
            [
                none.clone(),
                names(&["#b#e"]),
                names(&["#b#e"]),
                none.clone()
            ]
        );
        // Messages and other groups do not disturb the group's last view.
        let other = Frame::Membership {
            group: "h".into(),
            view_id: 9,
            reason: Reason::Join,
            transitional: false,
            quorum: true,
            members: names(&["#me#d", "#z#d"]),
        };
        assert_eq!(changes(&mut views, other)[0], names(&["#me#d"]));
        assert_eq!(
            changes(&mut views, view(Reason::Join, false, &["#c#e", "#me#d"])),
            [names(&["#c#e"]), none.clone(), none.clone(), none.clone()]
        );
        // This client leaves: it is the one that left; a later join starts
        // afresh.
        assert_eq!(
            changes(&mut views, view(Reason::Leave, false, &["#c#e"])),
            [none.clone(), names(&["#me#d"]), none.clone(), none.clone()]
        );
        assert_eq!(
            changes(&mut views, view(Reason::Join, false, &["#c#e", "#me#d"])),
            [names(&["#me#d"]), none.clone(), none.clone(), none.clone()]
        );
    }

    #[test]
    fn a_transitional_view_lists_the_cut_off_and_the_regular_view_brings_them_back() {
        let mut views = Views::default();
        let none: Vec<String> = Vec::new();
        changes(
            &mut views,
            view(Reason::Join, false, &["#a#d", "#b#e", "#c#f", "#me#d"]),
        );
        // Cut off from daemons e and f: the transitional view keeps this
        // daemon's clients.
        assert_eq!(
            changes(&mut views, view(Reason::Network, true, &["#a#d", "#me#d"])),
            [
                none.clone(),
                names(&["#b#e", "#c#f"]),
                none.clone(),
                names(&["#b#e", "#c#f"])
            ]
        );
        // The merged regular view: e's client is back, f's is gone, a new
        // one came.
        assert_eq!(
            changes(
                &mut views,
                view(Reason::Network, false, &["#a#d", "#b#e", "#me#d", "#n#g"])
            ),
            [names(&["#b#e", "#n#g"]), none.clone(), none.clone(), none]
        );
    }

    #[test]
    fn daemon_error_displays_text_and_code() {
        let e = ClientError::Daemon {
            code: 5,
            text: "service safe is not implemented".into(),
        };
        assert_eq!(e.to_string(), "service safe is not implemented (code 5)");
        assert_eq!(e.code(), Some(5));
    }
}
