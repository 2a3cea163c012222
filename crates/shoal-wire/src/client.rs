//! The client protocol: frames between an application (the client library)
//! and its local daemon, over a Unix socket or TCP (`docs/client-protocol.md`).
//!
//! A frame is `length u32` (big-endian; the bytes after this field), then
//! `version u8`, `type u8` and the body. Strings are `u16` length + UTF-8;
//! lists are `u16` count + items; payloads are `u32` length + bytes.
//! Decoding is strict: every length is checked against what remains and
//! against [`Limits`] before anything is allocated, and every byte of a frame
//! must be used. A stream decoder ([`decode`]) reports an incomplete frame as
//! `Ok(None)` so the caller reads more.

use thiserror::Error;

/// The client-protocol version this crate speaks.
pub const CLIENT_VERSION: u8 = 2;

/// Bytes of the length prefix.
pub const LENGTH_LEN: usize = 4;

/// Delivery guarantee of a multicast (DESIGN.md, "What a user sees").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Service {
    Unreliable = 0,
    /// pbcast's bimodal guarantee, no membership agreement.
    Probabilistic = 1,
    Reliable = 2,
    Fifo = 3,
    Causal = 4,
    Agreed = 5,
    Safe = 6,
}

impl Service {
    pub const ALL: [Service; 7] = [
        Service::Unreliable,
        Service::Probabilistic,
        Service::Reliable,
        Service::Fifo,
        Service::Causal,
        Service::Agreed,
        Service::Safe,
    ];

    pub fn from_u8(v: u8) -> Option<Service> {
        Service::ALL.get(usize::from(v)).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            Service::Unreliable => "unreliable",
            Service::Probabilistic => "probabilistic",
            Service::Reliable => "reliable",
            Service::Fifo => "fifo",
            Service::Causal => "causal",
            Service::Agreed => "agreed",
            Service::Safe => "safe",
        }
    }
}

impl std::str::FromStr for Service {
    type Err = String;
    fn from_str(s: &str) -> Result<Service, String> {
        Service::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Service::ALL.iter().map(|v| v.name()).collect();
                format!("unknown service {s:?}; services: {}", names.join(", "))
            })
    }
}

/// Why a group's membership changed (as Spread reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Reason {
    Join = 0,
    Leave = 1,
    Disconnect = 2,
    Network = 3,
}

impl Reason {
    fn from_u8(v: u8) -> Option<Reason> {
        [
            Reason::Join,
            Reason::Leave,
            Reason::Disconnect,
            Reason::Network,
        ]
        .get(usize::from(v))
        .copied()
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Client → daemon, first frame: a private name unique on this daemon,
    /// and the token a TCP listener requires (empty over the Unix socket;
    /// at most 255 bytes).
    Connect {
        name: String,
        token: String,
    },
    /// Daemon → client: accepted; `private_group` is the client's address.
    ConnectOk {
        private_group: String,
    },
    Join {
        group: String,
    },
    Leave {
        group: String,
    },
    /// Client → daemon: send `payload` to every member of `groups`.
    Multicast {
        service: Service,
        groups: Vec<String>,
        payload: Vec<u8>,
    },
    /// Daemon → client: a message for a group this client joined.
    Message {
        sender: String,
        service: Service,
        groups: Vec<String>,
        payload: Vec<u8>,
    },
    /// Client → daemon: a multicast with options: `flags` (bits of
    /// [`multicast_flags`]; unknown bits are refused) and the
    /// application's message type (Spread's `mess_type`), which the
    /// receivers get in [`Frame::MessageExt`]. A client sends the plain
    /// [`Frame::Multicast`] when both are zero.
    MulticastExt {
        service: Service,
        flags: u8,
        mess_type: u16,
        groups: Vec<String>,
        payload: Vec<u8>,
    },
    /// Daemon → client: a message sent with a nonzero `mess_type` (one
    /// of type zero comes as the plain [`Frame::Message`]).
    MessageExt {
        sender: String,
        service: Service,
        mess_type: u16,
        groups: Vec<String>,
        payload: Vec<u8>,
    },
    /// Daemon → client: the new membership of `group`.
    ///
    /// A view is named by `(view_id, transitional)`: every member of a
    /// regular view hears the same id and list. A transitional view
    /// (extended virtual synchrony) lists the members this client still
    /// moves with while its daemon is cut off; the next regular view
    /// follows. `quorum` says whether the daemons of the view hold the
    /// quorum their configuration asks for (docs/semantics.md).
    Membership {
        group: String,
        view_id: u64,
        reason: Reason,
        transitional: bool,
        quorum: bool,
        members: Vec<String>,
    },
    /// Either side: the connection ends cleanly.
    Disconnect,
    /// Either side: what went wrong; the daemon closes after sending one
    /// for a malformed frame.
    Error {
        code: u16,
        text: String,
    },
    /// Client → daemon: what is your state? Allowed without `Connect`.
    Status,
    /// Daemon → client: the answer to `Status`, human-readable lines.
    StatusReply {
        text: String,
    },
    /// Client → daemon: what do you hold for me? (as corosync's
    /// `cpg_flow_control_state_get`). `nonce` comes back in the answer, so
    /// that a late answer to an earlier query is told apart.
    FlowQuery {
        nonce: u32,
    },
    /// Daemon → client: the answer to `FlowQuery`, as things stood when the
    /// daemon read the query.
    FlowState {
        nonce: u32,
        /// Whether the daemon takes client input now (its items waiting
        /// for the daemons' total order are below its bound); while not,
        /// it stops reading its clients' sockets.
        accepting: bool,
        /// This client's messages the daemon holds that the total order
        /// has not delivered yet (waiting for a batch, being ordered, or
        /// ordered and held back for `safe`).
        held_messages: u32,
        /// Their payload bytes.
        held_bytes: u64,
        /// Bytes of frames queued to this client, not yet written to its
        /// socket (all of them ahead of this answer).
        queued_bytes: u64,
        /// The queue's bound (`limits.client_queue`): past it the client
        /// is disconnected as slow.
        queue_limit: u64,
    },
    /// Client → daemon: who is in `group`? (as corosync's
    /// `cpg_membership_get`). Needs no join of the group; `nonce` comes
    /// back in the answer.
    GroupQuery {
        nonce: u32,
        group: String,
    },
    /// Daemon → client: the answer to `GroupQuery`, as the daemon's table
    /// stood when it read the query: the members of `group` and the id of
    /// the last regular view it announced for the group; an unknown or
    /// empty group has no members and `view_id` 0.
    GroupMembers {
        nonce: u32,
        group: String,
        view_id: u64,
        members: Vec<String>,
    },
    /// Client → daemon, first frame, instead of [`Frame::Connect`]: the
    /// same, and the protocol features this client asks for (bits of
    /// [`features`]). A daemon ignores bits it does not know, so a client
    /// must still understand every frame a plain `Connect` gets.
    ConnectExt {
        name: String,
        token: String,
        features: u32,
    },
    /// Daemon → client, only to a client that asked for
    /// [`features::MEMBERSHIP_DELTAS`]: the new membership of `group` as
    /// the change from the view of the group this client received last,
    /// whose id is `previous` (always a regular view). The members are
    /// that view's, without `left`, with `joined`; the other fields mean
    /// what they mean in [`Frame::Membership`]. A client with no view of
    /// the group, or whose last one is not `previous`, is out of step
    /// with its daemon (a protocol error).
    MembershipDelta {
        group: String,
        view_id: u64,
        previous: u64,
        reason: Reason,
        transitional: bool,
        quorum: bool,
        joined: Vec<String>,
        left: Vec<String>,
    },
}

/// Where a daemon serves clients when not configured otherwise, and where a
/// client looks for it: `$XDG_RUNTIME_DIR/shoal.sock`, else
/// `/tmp/shoal-<uid>.sock` (the uid read from `/proc/self`, so two users
/// never share a socket).
pub fn default_socket_path() -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => std::path::PathBuf::from(dir).join("shoal.sock"),
        _ => {
            let uid = std::fs::metadata("/proc/self")
                .map(|m| m.uid().to_string())
                .unwrap_or_else(|_| "user".to_string());
            std::path::PathBuf::from(format!("/tmp/shoal-{uid}.sock"))
        }
    }
}

/// Bits of a [`Frame::MulticastExt`]'s `flags`.
pub mod multicast_flags {
    /// Spread's SELF_DISCARD: the sender's own connection does not get the
    /// message back (other connections of the same application do).
    pub const SELF_DISCARD: u8 = 1;
    /// Every bit defined so far.
    pub const ALL: u8 = SELF_DISCARD;
}

/// Bits of a [`Frame::ConnectExt`]'s `features`.
pub mod features {
    /// Membership changes come as [`super::Frame::MembershipDelta`] (what
    /// changed) where the client has the view they change, instead of the
    /// whole member list each time.
    pub const MEMBERSHIP_DELTAS: u32 = 1;
    /// Every bit defined so far.
    pub const ALL: u32 = MEMBERSHIP_DELTAS;
}

/// Longest token a `Connect` may carry, in bytes.
pub const TOKEN_MAX: usize = 255;

/// Codes of `Error` frames (the text says more).
pub mod code {
    /// The frame could not be decoded; the daemon closes the connection.
    pub const MALFORMED: u16 = 1;
    /// A frame other than `Connect` came first, or `Connect` came twice.
    pub const PROTOCOL: u16 = 2;
    /// The private name is already connected to this daemon.
    pub const NAME_TAKEN: u16 = 3;
    /// The token is missing or wrong (TCP).
    pub const AUTH: u16 = 4;
    /// The service type is not implemented; nothing was sent.
    pub const UNSUPPORTED_SERVICE: u16 = 5;
    /// A limit was reached (clients, groups per client, message size).
    pub const LIMIT: u16 = 6;
    /// Leave of a group this client had not joined, or a bad group name.
    pub const BAD_GROUP: u16 = 7;
    /// The client read too slowly; its queue filled and it is disconnected.
    pub const SLOW_CLIENT: u16 = 8;
    /// The daemon is shutting down.
    pub const SHUTDOWN: u16 = 9;
    /// The daemon lost its membership and is rejoining; retry later.
    pub const UNAVAILABLE: u16 = 10;
}

const CONNECT: u8 = 1;
const CONNECT_OK: u8 = 2;
const JOIN: u8 = 3;
const LEAVE: u8 = 4;
const MULTICAST: u8 = 5;
const MESSAGE: u8 = 6;
const MEMBERSHIP: u8 = 7;
const DISCONNECT: u8 = 8;
const ERROR: u8 = 9;
const STATUS: u8 = 10;
const STATUS_REPLY: u8 = 11;
const MULTICAST_EXT: u8 = 12;
const MESSAGE_EXT: u8 = 13;
const FLOW_QUERY: u8 = 14;
const FLOW_STATE: u8 = 15;
const GROUP_QUERY: u8 = 16;
const GROUP_MEMBERS: u8 = 17;
const CONNECT_EXT: u8 = 18;
const MEMBERSHIP_DELTA: u8 = 19;

/// Bounds the decoder enforces (each a daemon setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of a private name or group name.
    pub name_max: usize,
    /// Groups named in one multicast or message.
    pub groups_max: usize,
    /// Members listed in one membership frame.
    pub members_max: usize,
    /// Payload bytes of one message (DESIGN: default 1 MiB).
    pub payload_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            name_max: 128,
            groups_max: 64,
            members_max: 65_535,
            payload_max: 1 << 20,
        }
    }
}

impl Limits {
    /// The largest frame these limits allow (after the length prefix).
    pub fn frame_max(&self) -> usize {
        // version, type, service, sender, groups, payload, with slack for
        // a membership list (a delta's two view ids and two list counts).
        let names = (2 + self.name_max) * (1 + self.groups_max.max(self.members_max));
        2 + 1 + 8 + 8 + 1 + 2 + 2 + 4 + names + self.payload_max
    }
}

/// A frame that cannot be decoded, or encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the maximum {max}")]
    TooLong { len: usize, max: usize },
    #[error("frame too short: {0} bytes")]
    TooShort(usize),
    #[error("unsupported client-protocol version {0}")]
    BadVersion(u8),
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    #[error("truncated {what}")]
    Truncated { what: &'static str },
    #[error("{what} of {len} exceeds the limit {max}")]
    OverLimit {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{0} is not valid UTF-8")]
    BadUtf8(&'static str),
    #[error("an empty {0}")]
    Empty(&'static str),
    #[error("unknown service {0}")]
    BadService(u8),
    #[error("unknown view flags {0:#x}")]
    BadViewFlags(u8),
    #[error("unknown membership reason {0}")]
    BadReason(u8),
    #[error("unknown multicast flags {0:#04x}")]
    BadFlags(u8),
    #[error("unknown flow-state flags {0:#04x}")]
    BadFlowFlags(u8),
    #[error("{0} bytes left over after the frame's body")]
    TrailingBytes(usize),
}

/// Decodes one frame from the front of `buf`: `Ok(None)` if `buf` does not
/// yet hold a whole frame, otherwise the frame and the bytes it used.
pub fn decode(buf: &[u8], limits: &Limits) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(prefix) = buf.first_chunk::<LENGTH_LEN>() else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(*prefix) as usize;
    let max = limits.frame_max();
    if len > max {
        return Err(FrameError::TooLong { len, max });
    }
    if len < 2 {
        return Err(FrameError::TooShort(len));
    }
    let Some(body) = buf.get(LENGTH_LEN..LENGTH_LEN + len) else {
        return Ok(None);
    };
    let frame = decode_body(body, limits)?;
    Ok(Some((frame, LENGTH_LEN + len)))
}

fn decode_body(body: &[u8], limits: &Limits) -> Result<Frame, FrameError> {
    let mut r = Reader { rest: body, limits };
    let version = r.u8("version")?;
    if version != CLIENT_VERSION {
        return Err(FrameError::BadVersion(version));
    }
    let frame = match r.u8("type")? {
        CONNECT => Frame::Connect {
            name: r.name("private name")?,
            token: r.string("token", TOKEN_MAX)?,
        },
        CONNECT_OK => Frame::ConnectOk {
            private_group: r.name("private group")?,
        },
        JOIN => Frame::Join {
            group: r.name("group name")?,
        },
        LEAVE => Frame::Leave {
            group: r.name("group name")?,
        },
        MULTICAST => {
            let service = r.service()?;
            let groups = r.names("groups", limits.groups_max)?;
            if groups.is_empty() {
                return Err(FrameError::Empty("group list"));
            }
            Frame::Multicast {
                service,
                groups,
                payload: r.payload()?,
            }
        }
        MESSAGE => Frame::Message {
            sender: r.name("sender")?,
            service: r.service()?,
            groups: r.names("groups", limits.groups_max)?,
            payload: r.payload()?,
        },
        MULTICAST_EXT => {
            let service = r.service()?;
            let flags = r.u8("flags")?;
            if flags & !multicast_flags::ALL != 0 {
                return Err(FrameError::BadFlags(flags));
            }
            let mess_type = r.u16("message type")?;
            let groups = r.names("groups", limits.groups_max)?;
            if groups.is_empty() {
                return Err(FrameError::Empty("group list"));
            }
            Frame::MulticastExt {
                service,
                flags,
                mess_type,
                groups,
                payload: r.payload()?,
            }
        }
        MESSAGE_EXT => Frame::MessageExt {
            sender: r.name("sender")?,
            service: r.service()?,
            mess_type: r.u16("message type")?,
            groups: r.names("groups", limits.groups_max)?,
            payload: r.payload()?,
        },
        MEMBERSHIP => {
            let group = r.name("group name")?;
            let view_id = r.u64("view id")?;
            let (reason, transitional, quorum) = r.reason_and_flags()?;
            Frame::Membership {
                group,
                view_id,
                reason,
                transitional,
                quorum,
                members: r.names("members", limits.members_max)?,
            }
        }
        DISCONNECT => Frame::Disconnect,
        ERROR => Frame::Error {
            code: r.u16("error code")?,
            text: r.string("error text", usize::from(u16::MAX))?,
        },
        STATUS => Frame::Status,
        STATUS_REPLY => Frame::StatusReply {
            text: r.string("status text", usize::from(u16::MAX))?,
        },
        FLOW_QUERY => Frame::FlowQuery {
            nonce: r.u32("nonce")?,
        },
        FLOW_STATE => {
            let nonce = r.u32("nonce")?;
            let flags = r.u8("flow flags")?;
            if flags > 1 {
                return Err(FrameError::BadFlowFlags(flags));
            }
            Frame::FlowState {
                nonce,
                accepting: flags & 1 != 0,
                held_messages: r.u32("held messages")?,
                held_bytes: r.u64("held bytes")?,
                queued_bytes: r.u64("queued bytes")?,
                queue_limit: r.u64("queue limit")?,
            }
        }
        GROUP_QUERY => Frame::GroupQuery {
            nonce: r.u32("nonce")?,
            group: r.name("group name")?,
        },
        GROUP_MEMBERS => Frame::GroupMembers {
            nonce: r.u32("nonce")?,
            group: r.name("group name")?,
            view_id: r.u64("view id")?,
            members: r.names("members", limits.members_max)?,
        },
        CONNECT_EXT => Frame::ConnectExt {
            name: r.name("private name")?,
            token: r.string("token", TOKEN_MAX)?,
            features: r.u32("features")?,
        },
        MEMBERSHIP_DELTA => {
            let group = r.name("group name")?;
            let view_id = r.u64("view id")?;
            let previous = r.u64("previous view id")?;
            let (reason, transitional, quorum) = r.reason_and_flags()?;
            let joined = r.names("joined", limits.members_max)?;
            let left = r.names("left", limits.members_max - joined.len())?;
            Frame::MembershipDelta {
                group,
                view_id,
                previous,
                reason,
                transitional,
                quorum,
                joined,
                left,
            }
        }
        other => return Err(FrameError::UnknownType(other)),
    };
    if !r.rest.is_empty() {
        return Err(FrameError::TrailingBytes(r.rest.len()));
    }
    Ok(frame)
}

struct Reader<'a> {
    rest: &'a [u8],
    limits: &'a Limits,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], FrameError> {
        if self.rest.len() < n {
            return Err(FrameError::Truncated { what });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, FrameError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, FrameError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, FrameError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, FrameError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    fn string(&mut self, what: &'static str, max: usize) -> Result<String, FrameError> {
        let len = usize::from(self.u16(what)?);
        if len > max {
            return Err(FrameError::OverLimit { what, len, max });
        }
        let bytes = self.take(len, what)?;
        let s = std::str::from_utf8(bytes).map_err(|_| FrameError::BadUtf8(what))?;
        Ok(s.to_owned())
    }

    fn name(&mut self, what: &'static str) -> Result<String, FrameError> {
        let name = self.string(what, self.limits.name_max)?;
        if name.is_empty() {
            return Err(FrameError::Empty(what));
        }
        Ok(name)
    }

    fn names(&mut self, what: &'static str, max: usize) -> Result<Vec<String>, FrameError> {
        let count = usize::from(self.u16(what)?);
        // Each name takes at least 3 bytes: never trust a count beyond that.
        if count > max || count > self.rest.len() / 3 {
            return Err(FrameError::OverLimit {
                what,
                len: count,
                max: max.min(self.rest.len() / 3),
            });
        }
        (0..count).map(|_| self.name(what)).collect()
    }

    /// A view's reason `u8` and flags `u8` (transitional, quorum).
    fn reason_and_flags(&mut self) -> Result<(Reason, bool, bool), FrameError> {
        let reason = self.u8("reason")?;
        let reason = Reason::from_u8(reason).ok_or(FrameError::BadReason(reason))?;
        let flags = self.u8("view flags")?;
        if flags > 3 {
            return Err(FrameError::BadViewFlags(flags));
        }
        Ok((reason, flags & 1 != 0, flags & 2 != 0))
    }

    fn service(&mut self) -> Result<Service, FrameError> {
        let v = self.u8("service")?;
        Service::from_u8(v).ok_or(FrameError::BadService(v))
    }

    fn payload(&mut self) -> Result<Vec<u8>, FrameError> {
        let len = self.u32("payload length")? as usize;
        let max = self.limits.payload_max;
        if len > max {
            return Err(FrameError::OverLimit {
                what: "payload",
                len,
                max,
            });
        }
        Ok(self.take(len, "payload")?.to_vec())
    }
}

/// Appends a `Message` frame built from borrowed parts (a `MessageExt`
/// when `mess_type` is not zero): the same bytes as the frame's `encode`,
/// without first copying the payload into a frame (a daemon encodes a
/// message once for all its local recipients).
pub fn encode_message(
    sender: &str,
    service: Service,
    mess_type: u16,
    groups: &[&str],
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    let start = out.len();
    out.extend_from_slice(&[0; LENGTH_LEN]);
    out.push(CLIENT_VERSION);
    let mut w = Writer { out };
    w.u8(if mess_type == 0 { MESSAGE } else { MESSAGE_EXT });
    w.string(sender)?;
    w.u8(service as u8);
    if mess_type != 0 {
        w.out.extend_from_slice(&mess_type.to_be_bytes());
    }
    let count = u16::try_from(groups.len()).map_err(|_| FrameError::OverLimit {
        what: "list",
        len: groups.len(),
        max: usize::from(u16::MAX),
    })?;
    w.out.extend_from_slice(&count.to_be_bytes());
    groups.iter().try_for_each(|g| w.string(g))?;
    w.payload(payload)?;
    finish_length(out, start)
}

fn finish_length(out: &mut [u8], start: usize) -> Result<(), FrameError> {
    let len = out.len() - start - LENGTH_LEN;
    let len = u32::try_from(len).map_err(|_| FrameError::TooLong {
        len,
        max: u32::MAX as usize,
    })?;
    out[start..start + LENGTH_LEN].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

impl Frame {
    /// Appends the frame, length prefix included. Fails if a field does not
    /// fit its length field (names over 65,535 bytes, and so on); `limits`
    /// are the receiver's business.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let start = out.len();
        out.extend_from_slice(&[0; LENGTH_LEN]);
        out.push(CLIENT_VERSION);
        let mut w = Writer { out };
        match self {
            Frame::Connect { name, token } => {
                w.u8(CONNECT);
                w.string(name)?;
                w.string(token)?;
            }
            Frame::ConnectOk { private_group } => {
                w.u8(CONNECT_OK);
                w.string(private_group)?;
            }
            Frame::Join { group } => {
                w.u8(JOIN);
                w.string(group)?;
            }
            Frame::Leave { group } => {
                w.u8(LEAVE);
                w.string(group)?;
            }
            Frame::Multicast {
                service,
                groups,
                payload,
            } => {
                w.u8(MULTICAST);
                w.u8(*service as u8);
                w.strings(groups)?;
                w.payload(payload)?;
            }
            Frame::Message {
                sender,
                service,
                groups,
                payload,
            } => {
                w.u8(MESSAGE);
                w.string(sender)?;
                w.u8(*service as u8);
                w.strings(groups)?;
                w.payload(payload)?;
            }
            Frame::MulticastExt {
                service,
                flags,
                mess_type,
                groups,
                payload,
            } => {
                w.u8(MULTICAST_EXT);
                w.u8(*service as u8);
                w.u8(*flags);
                w.out.extend_from_slice(&mess_type.to_be_bytes());
                w.strings(groups)?;
                w.payload(payload)?;
            }
            Frame::MessageExt {
                sender,
                service,
                mess_type,
                groups,
                payload,
            } => {
                w.u8(MESSAGE_EXT);
                w.string(sender)?;
                w.u8(*service as u8);
                w.out.extend_from_slice(&mess_type.to_be_bytes());
                w.strings(groups)?;
                w.payload(payload)?;
            }
            Frame::Membership {
                group,
                view_id,
                reason,
                transitional,
                quorum,
                members,
            } => {
                w.u8(MEMBERSHIP);
                w.string(group)?;
                w.out.extend_from_slice(&view_id.to_be_bytes());
                w.u8(*reason as u8);
                w.u8(u8::from(*transitional) | u8::from(*quorum) << 1);
                w.strings(members)?;
            }
            Frame::Disconnect => w.u8(DISCONNECT),
            Frame::Error { code, text } => {
                w.u8(ERROR);
                w.out.extend_from_slice(&code.to_be_bytes());
                w.string(text)?;
            }
            Frame::Status => w.u8(STATUS),
            Frame::StatusReply { text } => {
                w.u8(STATUS_REPLY);
                w.string(text)?;
            }
            Frame::FlowQuery { nonce } => {
                w.u8(FLOW_QUERY);
                w.out.extend_from_slice(&nonce.to_be_bytes());
            }
            Frame::FlowState {
                nonce,
                accepting,
                held_messages,
                held_bytes,
                queued_bytes,
                queue_limit,
            } => {
                w.u8(FLOW_STATE);
                w.out.extend_from_slice(&nonce.to_be_bytes());
                w.u8(u8::from(*accepting));
                w.out.extend_from_slice(&held_messages.to_be_bytes());
                for v in [held_bytes, queued_bytes, queue_limit] {
                    w.out.extend_from_slice(&v.to_be_bytes());
                }
            }
            Frame::GroupQuery { nonce, group } => {
                w.u8(GROUP_QUERY);
                w.out.extend_from_slice(&nonce.to_be_bytes());
                w.string(group)?;
            }
            Frame::GroupMembers {
                nonce,
                group,
                view_id,
                members,
            } => {
                w.u8(GROUP_MEMBERS);
                w.out.extend_from_slice(&nonce.to_be_bytes());
                w.string(group)?;
                w.out.extend_from_slice(&view_id.to_be_bytes());
                w.strings(members)?;
            }
            Frame::ConnectExt {
                name,
                token,
                features,
            } => {
                w.u8(CONNECT_EXT);
                w.string(name)?;
                w.string(token)?;
                w.out.extend_from_slice(&features.to_be_bytes());
            }
            Frame::MembershipDelta {
                group,
                view_id,
                previous,
                reason,
                transitional,
                quorum,
                joined,
                left,
            } => {
                w.u8(MEMBERSHIP_DELTA);
                w.string(group)?;
                w.out.extend_from_slice(&view_id.to_be_bytes());
                w.out.extend_from_slice(&previous.to_be_bytes());
                w.u8(*reason as u8);
                w.u8(u8::from(*transitional) | u8::from(*quorum) << 1);
                w.strings(joined)?;
                w.strings(left)?;
            }
        }
        finish_length(out, start)
    }

    pub fn to_vec(&self) -> Result<Vec<u8>, FrameError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }
}

struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    fn string(&mut self, s: &str) -> Result<(), FrameError> {
        let len = u16::try_from(s.len()).map_err(|_| FrameError::OverLimit {
            what: "string",
            len: s.len(),
            max: usize::from(u16::MAX),
        })?;
        self.out.extend_from_slice(&len.to_be_bytes());
        self.out.extend_from_slice(s.as_bytes());
        Ok(())
    }

    fn strings(&mut self, list: &[String]) -> Result<(), FrameError> {
        let count = u16::try_from(list.len()).map_err(|_| FrameError::OverLimit {
            what: "list",
            len: list.len(),
            max: usize::from(u16::MAX),
        })?;
        self.out.extend_from_slice(&count.to_be_bytes());
        list.iter().try_for_each(|s| self.string(s))
    }

    fn payload(&mut self, p: &[u8]) -> Result<(), FrameError> {
        let len = u32::try_from(p.len()).map_err(|_| FrameError::OverLimit {
            what: "payload",
            len: p.len(),
            max: u32::MAX as usize,
        })?;
        self.out.extend_from_slice(&len.to_be_bytes());
        self.out.extend_from_slice(p);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn name() -> impl Strategy<Value = String> + Clone {
        "[a-zA-Z0-9_#.-]{1,24}"
    }

    fn service() -> impl Strategy<Value = Service> {
        (0u8..7).prop_map(|v| Service::from_u8(v).unwrap())
    }

    fn frame() -> impl Strategy<Value = Frame> {
        let payload = proptest::collection::vec(any::<u8>(), 0..300);
        let groups = proptest::collection::vec(name(), 1..5);
        prop_oneof![
            (name(), "[a-z0-9]{0,16}").prop_map(|(name, token)| Frame::Connect { name, token }),
            name().prop_map(|private_group| Frame::ConnectOk { private_group }),
            name().prop_map(|group| Frame::Join { group }),
            name().prop_map(|group| Frame::Leave { group }),
            (service(), groups.clone(), payload.clone()).prop_map(|(service, groups, payload)| {
                Frame::Multicast {
                    service,
                    groups,
                    payload,
                }
            }),
            (name(), service(), groups.clone(), payload.clone()).prop_map(
                |(sender, service, groups, payload)| Frame::Message {
                    sender,
                    service,
                    groups,
                    payload,
                }
            ),
            (
                service(),
                0u8..=multicast_flags::ALL,
                any::<u16>(),
                groups.clone(),
                payload.clone()
            )
                .prop_map(|(service, flags, mess_type, groups, payload)| {
                    Frame::MulticastExt {
                        service,
                        flags,
                        mess_type,
                        groups,
                        payload,
                    }
                }),
            (name(), service(), any::<u16>(), groups.clone(), payload).prop_map(
                |(sender, service, mess_type, groups, payload)| Frame::MessageExt {
                    sender,
                    service,
                    mess_type,
                    groups,
                    payload,
                }
            ),
            (name(), any::<u64>(), 0u8..4, 0u8..4, groups).prop_map(
                |(group, view_id, r, flags, members)| Frame::Membership {
                    group,
                    view_id,
                    reason: Reason::from_u8(r).unwrap(),
                    transitional: flags & 1 != 0,
                    quorum: flags & 2 != 0,
                    members,
                }
            ),
            Just(Frame::Disconnect),
            (any::<u16>(), ".{0,40}").prop_map(|(code, text)| Frame::Error { code, text }),
            Just(Frame::Status),
            ".{0,40}".prop_map(|text| Frame::StatusReply { text }),
            any::<u32>().prop_map(|nonce| Frame::FlowQuery { nonce }),
            (
                any::<u32>(),
                any::<bool>(),
                any::<u32>(),
                any::<(u64, u64, u64)>()
            )
                .prop_map(|(nonce, accepting, held_messages, (a, b, c))| {
                    Frame::FlowState {
                        nonce,
                        accepting,
                        held_messages,
                        held_bytes: a,
                        queued_bytes: b,
                        queue_limit: c,
                    }
                }),
            (any::<u32>(), name()).prop_map(|(nonce, group)| Frame::GroupQuery { nonce, group }),
            (
                any::<u32>(),
                name(),
                any::<u64>(),
                proptest::collection::vec(name(), 0..4)
            )
                .prop_map(|(nonce, group, view_id, members)| Frame::GroupMembers {
                    nonce,
                    group,
                    view_id,
                    members,
                }),
            (name(), "[a-z0-9]{0,16}", any::<u32>()).prop_map(|(name, token, features)| {
                Frame::ConnectExt {
                    name,
                    token,
                    features,
                }
            }),
            (
                name(),
                any::<(u64, u64)>(),
                0u8..4,
                0u8..4,
                proptest::collection::vec(name(), 0..4),
                proptest::collection::vec(name(), 0..4)
            )
                .prop_map(|(group, (view_id, previous), r, flags, joined, left)| {
                    Frame::MembershipDelta {
                        group,
                        view_id,
                        previous,
                        reason: Reason::from_u8(r).unwrap(),
                        transitional: flags & 1 != 0,
                        quorum: flags & 2 != 0,
                        joined,
                        left,
                    }
                }),
        ]
    }

    #[test]
    fn encode_message_matches_the_frame_encoding() {
        let frame = Frame::Message {
            sender: "#a#n".into(),
            service: Service::Fifo,
            groups: vec!["g".into(), "h".into()],
            payload: b"payload".to_vec(),
        };
        let mut out = Vec::new();
        encode_message("#a#n", Service::Fifo, 0, &["g", "h"], b"payload", &mut out).unwrap();
        assert_eq!(out, frame.to_vec().unwrap());
        let typed = Frame::MessageExt {
            sender: "#a#n".into(),
            service: Service::Agreed,
            mess_type: 513,
            groups: vec!["g".into()],
            payload: b"p".to_vec(),
        };
        out.clear();
        encode_message("#a#n", Service::Agreed, 513, &["g"], b"p", &mut out).unwrap();
        assert_eq!(out, typed.to_vec().unwrap());
    }

    #[test]
    fn flow_frames_have_the_documented_bytes() {
        let query = Frame::FlowQuery { nonce: 7 };
        assert_eq!(query.to_vec().unwrap(), [0, 0, 0, 6, 2, 14, 0, 0, 0, 7]);
        let state = Frame::FlowState {
            nonce: 1,
            accepting: true,
            held_messages: 2,
            held_bytes: 3,
            queued_bytes: 4,
            queue_limit: 5,
        };
        let mut want = vec![0, 0, 0, 35, 2, 15, 0, 0, 0, 1, 1, 0, 0, 0, 2];
        for v in [3u64, 4, 5] {
            want.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(state.to_vec().unwrap(), want);
    }

    #[test]
    fn group_frames_have_the_documented_bytes() {
        let query = Frame::GroupQuery {
            nonce: 7,
            group: "g".into(),
        };
        assert_eq!(
            query.to_vec().unwrap(),
            [0, 0, 0, 9, 2, 16, 0, 0, 0, 7, 0, 1, b'g']
        );
        let members = Frame::GroupMembers {
            nonce: 1,
            group: "g".into(),
            view_id: 5,
            members: vec!["#a#n".into(), "#b#n".into()],
        };
        let mut want = vec![0, 0, 0, 31, 2, 17, 0, 0, 0, 1, 0, 1, b'g'];
        want.extend_from_slice(&5u64.to_be_bytes());
        want.extend_from_slice(&[0, 2, 0, 4]);
        want.extend_from_slice(b"#a#n");
        want.extend_from_slice(&[0, 4]);
        want.extend_from_slice(b"#b#n");
        assert_eq!(members.to_vec().unwrap(), want);
        // The group name is checked as a join's: an empty one is refused.
        assert!(decode(&raw(&[16, 0, 0, 0, 7, 0, 0]), &Limits::default()).is_err());
    }

    #[test]
    fn delta_frames_have_the_documented_bytes() {
        let connect = Frame::ConnectExt {
            name: "a".into(),
            token: String::new(),
            features: features::MEMBERSHIP_DELTAS,
        };
        assert_eq!(
            connect.to_vec().unwrap(),
            [0, 0, 0, 11, 2, 18, 0, 1, b'a', 0, 0, 0, 0, 0, 1]
        );
        let delta = Frame::MembershipDelta {
            group: "g".into(),
            view_id: 9,
            previous: 8,
            reason: Reason::Join,
            transitional: false,
            quorum: true,
            joined: vec!["#b#n".into()],
            left: vec![],
        };
        let mut want = vec![0, 0, 0, 33, 2, 19, 0, 1, b'g'];
        want.extend_from_slice(&9u64.to_be_bytes());
        want.extend_from_slice(&8u64.to_be_bytes());
        want.extend_from_slice(&[0, 2, 0, 1, 0, 4]);
        want.extend_from_slice(b"#b#n");
        want.extend_from_slice(&[0, 0]);
        assert_eq!(delta.to_vec().unwrap(), want);
        // Both lists together are held to `members_max`.
        let limits = Limits {
            members_max: 1,
            ..Limits::default()
        };
        let two = Frame::MembershipDelta {
            group: "g".into(),
            view_id: 9,
            previous: 8,
            reason: Reason::Join,
            transitional: false,
            quorum: true,
            joined: vec!["#b#n".into()],
            left: vec!["#c#n".into()],
        };
        assert!(decode(&two.to_vec().unwrap(), &limits).is_err());
    }

    proptest! {
        #[test]
        fn decode_of_encode_is_identity(f in frame()) {
            let bytes = f.to_vec().unwrap();
            let (back, used) = decode(&bytes, &Limits::default()).unwrap().unwrap();
            prop_assert_eq!(back, f);
            prop_assert_eq!(used, bytes.len());
        }

        #[test]
        fn every_prefix_is_incomplete_not_an_error(f in frame()) {
            let bytes = f.to_vec().unwrap();
            for cut in 0..bytes.len() {
                prop_assert_eq!(decode(&bytes[..cut], &Limits::default()), Ok(None));
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes, &Limits::default());
        }
    }

    /// A frame: length prefix, version, then `rest`.
    fn raw(rest: &[u8]) -> Vec<u8> {
        let mut out = ((rest.len() + 1) as u32).to_be_bytes().to_vec();
        out.push(CLIENT_VERSION);
        out.extend_from_slice(rest);
        out
    }

    #[test]
    fn malformed_frames_are_refused_with_their_error() {
        let limits = Limits::default();
        let join = |name: &[u8]| {
            let mut b = vec![JOIN];
            b.extend_from_slice(&(name.len() as u16).to_be_bytes());
            b.extend_from_slice(name);
            raw(&b)
        };
        let mut long = u32::MAX.to_be_bytes().to_vec();
        long.extend_from_slice(&[1, 1]);
        let mut bad_version = raw(&[DISCONNECT]);
        bad_version[4] = 9;
        let cases: Vec<(&str, Vec<u8>, FrameError)> = vec![
            (
                "length beyond the maximum",
                long,
                FrameError::TooLong {
                    len: u32::MAX as usize,
                    max: limits.frame_max(),
                },
            ),
            ("zero length", vec![0, 0, 0, 0], FrameError::TooShort(0)),
            ("other version", bad_version, FrameError::BadVersion(9)),
            ("unknown type", raw(&[77]), FrameError::UnknownType(77)),
            (
                "truncated name",
                raw(&[JOIN, 0, 5, b'a']),
                FrameError::Truncated { what: "group name" },
            ),
            ("empty name", join(b""), FrameError::Empty("group name")),
            (
                "name over the limit",
                join(&[b'a'; 129]),
                FrameError::OverLimit {
                    what: "group name",
                    len: 129,
                    max: 128,
                },
            ),
            (
                "bad UTF-8",
                join(&[0xFF, 0xFE]),
                FrameError::BadUtf8("group name"),
            ),
            (
                "trailing bytes",
                raw(&[DISCONNECT, 0]),
                FrameError::TrailingBytes(1),
            ),
            (
                "unknown service",
                raw(&[MULTICAST, 9, 0, 1, 0, 1, b'g', 0, 0, 0, 0]),
                FrameError::BadService(9),
            ),
            (
                "no groups",
                raw(&[MULTICAST, 3, 0, 0, 0, 0, 0, 0]),
                FrameError::Empty("group list"),
            ),
            (
                "group count beyond the bytes",
                raw(&[MULTICAST, 3, 0xFF, 0xFF]),
                FrameError::OverLimit {
                    what: "groups",
                    len: 65_535,
                    max: 0,
                },
            ),
            (
                "payload over the limit",
                raw(&[MULTICAST, 3, 0, 1, 0, 1, b'g', 0x00, 0x20, 0x00, 0x01]),
                FrameError::OverLimit {
                    what: "payload",
                    len: (1 << 21) + 1,
                    max: 1 << 20,
                },
            ),
            (
                "unknown multicast flags",
                raw(&[MULTICAST_EXT, 3, 0x82, 0, 1, 0, 1, 0, 1, b'g', 0, 0, 0, 0]),
                FrameError::BadFlags(0x82),
            ),
            (
                "extended multicast with no groups",
                raw(&[MULTICAST_EXT, 3, 1, 0, 1, 0, 0, 0, 0, 0, 0]),
                FrameError::Empty("group list"),
            ),
            (
                "unknown flow flags",
                raw(&[FLOW_STATE, 0, 0, 0, 1, 2]),
                FrameError::BadFlowFlags(2),
            ),
            (
                "flow query cut short",
                raw(&[FLOW_QUERY, 0, 0]),
                FrameError::Truncated { what: "nonce" },
            ),
            (
                "unknown reason",
                raw(&[MEMBERSHIP, 0, 1, b'g', 0, 0, 0, 0, 0, 0, 0, 1, 7, 0, 0]),
                FrameError::BadReason(7),
            ),
        ];
        for (what, bytes, error) in cases {
            assert_eq!(decode(&bytes, &limits), Err(error), "{what}");
        }
    }

    #[test]
    fn two_frames_back_to_back_decode_one_at_a_time() {
        let mut bytes = Frame::Join { group: "g".into() }.to_vec().unwrap();
        Frame::Disconnect.encode(&mut bytes).unwrap();
        let limits = Limits::default();
        let (first, used) = decode(&bytes, &limits).unwrap().unwrap();
        assert_eq!(first, Frame::Join { group: "g".into() });
        let (second, _) = decode(&bytes[used..], &limits).unwrap().unwrap();
        assert_eq!(second, Frame::Disconnect);
    }

    #[test]
    fn services_parse_by_name() {
        for s in Service::ALL {
            assert_eq!(s.name().parse::<Service>(), Ok(s));
        }
        assert!("totally-ordered".parse::<Service>().is_err());
    }
}
