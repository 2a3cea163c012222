"""The client protocol's frames (``docs/client-protocol.md``, version 1).

A pure-Python mirror of the Rust codec ``shoal_wire::client``: the same
frames, the same byte layout and the same strict decoding.

A frame is ``length u32`` (big-endian; the bytes after this field), then
``version u8``, ``type u8`` and the body. Strings are ``u16`` length + UTF-8;
lists are ``u16`` count + names; payloads are ``u32`` length + bytes.
:func:`decode` checks every length against what remains and against
:class:`Limits` before using it, and every byte of a frame must be used.
A buffer holding less than a whole frame decodes to ``None`` (read more).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Union

__all__ = [
    "CLIENT_VERSION",
    "LENGTH_LEN",
    "TOKEN_MAX",
    "Code",
    "Service",
    "Reason",
    "Limits",
    "FrameError",
    "Connect",
    "ConnectOk",
    "Join",
    "Leave",
    "Multicast",
    "Message",
    "SELF_DISCARD",
    "Membership",
    "Disconnect",
    "ErrorFrame",
    "Status",
    "StatusReply",
    "FlowQuery",
    "FlowState",
    "GroupQuery",
    "GroupMembers",
    "Frame",
    "encode",
    "decode",
]

#: The client-protocol version this package speaks.
CLIENT_VERSION = 2

#: Bytes of the length prefix.
LENGTH_LEN = 4

#: Longest token a ``Connect`` may carry, in bytes.
TOKEN_MAX = 255

#: Bit of a multicast's ``flags``: Spread's SELF_DISCARD, the daemon does
#: not deliver the message back to the connection that sent it.
SELF_DISCARD = 1

_FLAGS_ALL = SELF_DISCARD

_STRING_MAX = 0xFFFF
_U32_MAX = 0xFFFF_FFFF


class Service(enum.IntEnum):
    """The delivery guarantee of a multicast (its ``u8`` on the wire)."""

    UNRELIABLE = 0
    PROBABILISTIC = 1
    RELIABLE = 2
    FIFO = 3
    CAUSAL = 4
    AGREED = 5
    SAFE = 6

    @property
    def label(self) -> str:
        """The service's name as the CLI and docs spell it (``"agreed"``)."""
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> "Service":
        """The service named ``text`` (``"fifo"``, ``"agreed"``, ...)."""
        try:
            return cls[text.upper()]
        except KeyError:
            names = ", ".join(s.label for s in cls)
            raise ValueError(f"unknown service {text!r}; services: {names}") from None


class Reason(enum.IntEnum):
    """Why a group's membership changed (its ``u8`` on the wire)."""

    JOIN = 0
    LEAVE = 1
    DISCONNECT = 2
    #: A daemon left or failed.
    NETWORK = 3


class Code(enum.IntEnum):
    """Codes of ``Error`` frames (``shoal_wire::client::code``)."""

    #: The frame could not be decoded; the daemon closes the connection.
    MALFORMED = 1
    #: A frame other than ``Connect`` came first, or ``Connect`` came twice.
    PROTOCOL = 2
    #: The private name is already connected to this daemon.
    NAME_TAKEN = 3
    #: The token is missing or wrong (TCP).
    AUTH = 4
    #: The service type is not implemented; nothing was sent.
    UNSUPPORTED_SERVICE = 5
    #: A limit was reached (clients, groups per client, message size).
    LIMIT = 6
    #: Leave of a group this client had not joined, or a bad group name.
    BAD_GROUP = 7
    #: The client read too slowly; its queue filled and it is disconnected.
    SLOW_CLIENT = 8
    #: The daemon is shutting down.
    SHUTDOWN = 9
    #: The daemon is (re)joining its peers; retry later.
    UNAVAILABLE = 10


@dataclass(frozen=True)
class Limits:
    """Bounds the decoder enforces and requests are checked against
    (each a daemon setting; these are the daemon's defaults)."""

    #: Bytes of a private name or group name.
    name_max: int = 128
    #: Groups named in one multicast or message.
    groups_max: int = 64
    #: Members listed in one membership frame.
    members_max: int = 65_535
    #: Payload bytes of one message (1 MiB).
    payload_max: int = 1 << 20

    def frame_max(self) -> int:
        """The largest frame these limits allow (after the length prefix)."""
        names = (2 + self.name_max) * (1 + max(self.groups_max, self.members_max))
        return 2 + 1 + 8 + 8 + 1 + 2 + 2 + 4 + names + self.payload_max


class FrameError(ValueError):
    """Bytes that are not a valid frame, or a frame that cannot be encoded.

    ``kind`` names the irregularity (``"too_long"``, ``"too_short"``,
    ``"bad_version"``, ``"unknown_type"``, ``"truncated"``, ``"over_limit"``,
    ``"bad_utf8"``, ``"empty"``, ``"bad_service"``, ``"bad_reason"``, ``"bad_flags"``,
    ``"trailing_bytes"``); the message is the Rust codec's.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# ---- frames ----


#: ``Connect.features`` bit: membership changes come as
#: :class:`MembershipDelta` where the client has the view they change.
MEMBERSHIP_DELTAS = 1


@dataclass
class Connect:
    """Client → daemon, first frame: a private name unique on the daemon and
    the token a TCP listener requires (empty over the Unix socket)."""

    name: str
    token: str = ""
    #: Protocol features asked for (bits: :data:`MEMBERSHIP_DELTAS`); when
    #: not zero, the frame is a ``ConnectExt`` (type 18).
    features: int = 0


@dataclass
class ConnectOk:
    """Daemon → client: accepted; ``private_group`` is the client's address."""

    private_group: str


@dataclass
class Join:
    """Client → daemon: join ``group``."""

    group: str


@dataclass
class Leave:
    """Client → daemon: leave ``group``."""

    group: str


@dataclass
class Multicast:
    """Client → daemon: send ``payload`` to every member of ``groups``."""

    service: Service
    groups: list[str]
    payload: bytes
    #: Bits: :data:`SELF_DISCARD`. With ``mess_type``, when either is not
    #: zero, the frame is a ``MulticastExt`` (type 12).
    flags: int = 0
    #: The application's message type (Spread's ``mess_type``), ``u16``.
    mess_type: int = 0


@dataclass
class Message:
    """A message delivered to a group this client joined (or to its private
    group)."""

    #: The sender's private group (its address, e.g. ``#alice#host``).
    sender: str
    #: The guarantee it was sent with.
    service: Service
    #: Every group it was addressed to (delivered once to a member of several).
    groups: list[str]
    payload: bytes
    #: The application's message type as the sender gave it (0: none); a
    #: nonzero type travels as a ``MessageExt`` frame (type 13).
    mess_type: int = 0


@dataclass
class Membership:
    """A new view of a group this client joined.

    Besides the full list, the client library says what changed since the
    previous view of the group this client received (``joined``, ``left``;
    as corosync's ``joined_list`` and ``left_list``): computed from
    consecutive views, so they mean the same whatever the daemon sends. The
    codec leaves them empty; they are not part of the frame."""

    group: str
    #: Grows with each view of the group.
    view_id: int
    #: Why the membership changed.
    reason: Reason
    #: The members' private groups.
    members: list[str] = field(default_factory=list)
    #: A transitional view (extended virtual synchrony): this client's
    #: daemon is cut off, and ``members`` are those still with it; a regular
    #: view follows. A view is named by ``view_id`` and this flag together.
    transitional: bool = False
    #: Whether the daemons of the view hold their configured quorum.
    quorum: bool = True
    #: The members of this view that were not in the previous view of the
    #: group this client received, in the order of ``members``. In the first
    #: view after this client joins, only the client itself (not yet a member,
    #: it cannot tell which others joined just before it). The regular view after a transitional one lists the
    #: members that came back with the merge, and any that joined meanwhile.
    joined: list[str] = field(default_factory=list, compare=False)
    #: The members of the previous view this client received that are not in
    #: this one, whatever the reason (``reason`` says why), sorted. When this
    #: client leaves, its last view of the group lists itself. A transitional
    #: view lists the members its daemon is cut off from.
    left: list[str] = field(default_factory=list, compare=False)

    @property
    def disconnected(self) -> list[str]:
        """``left`` when their connections ended (reason ``DISCONNECT``:
        Spread's ``CAUSED_BY_DISCONNECT``); empty otherwise."""
        return self.left if self.reason == Reason.DISCONNECT else []

    @property
    def partitioned(self) -> list[str]:
        """``left`` when the network took them away (reason ``NETWORK``:
        their daemon failed, was evicted or is beyond a partition); empty
        otherwise."""
        return self.left if self.reason == Reason.NETWORK else []


@dataclass
class Disconnect:
    """Either side: the connection ends cleanly."""


@dataclass
class ErrorFrame:
    """Either side: what went wrong (``code`` from :class:`Code`)."""

    code: int
    text: str


@dataclass
class Status:
    """Client → daemon: what is your state? Allowed without ``Connect``."""


@dataclass
class StatusReply:
    """Daemon → client: the answer to ``Status``, human-readable lines."""

    text: str


@dataclass
class FlowQuery:
    """Client → daemon: what do you hold for me? ``nonce`` (``u32``) comes
    back in the answer."""

    nonce: int


@dataclass
class FlowState:
    """Daemon → client: the answer to :class:`FlowQuery`, as things stood
    when the daemon read the query."""

    nonce: int
    #: Whether the daemon takes client input now (else it reads no client).
    accepting: bool
    #: This client's messages the daemon holds, not yet delivered (waiting
    #: for the total order, or held back for ``safe``; ``u32``), and their
    #: payload bytes.
    held_messages: int
    held_bytes: int
    #: Bytes queued to this client, not yet written (all ahead of this
    #: answer), and that queue's bound (past it: disconnected as slow).
    queued_bytes: int
    queue_limit: int


@dataclass
class GroupQuery:
    """Client → daemon: who is in ``group``? Needs no join of the group;
    ``nonce`` (``u32``) comes back in the answer."""

    nonce: int
    group: str


@dataclass
class GroupMembers:
    """Daemon → client: the answer to :class:`GroupQuery`, the members of
    ``group`` in the daemon's table when it read the query (none for a group
    it does not know). ``view_id`` is 0: the daemon does not keep the last
    view's id per group."""

    nonce: int
    group: str
    view_id: int
    members: list[str] = field(default_factory=list)


@dataclass
class MembershipDelta:
    """Daemon → client, only to a client that asked for
    :data:`MEMBERSHIP_DELTAS`: the new view of ``group`` as the change from
    the view this client received last, whose id is ``previous``: its
    members without ``left``, with ``joined``. The client library turns it
    back into a whole :class:`Membership`."""

    group: str
    view_id: int
    previous: int
    reason: Reason
    joined: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    transitional: bool = False
    quorum: bool = True


Frame = Union[
    Connect,
    MembershipDelta,
    ConnectOk,
    Join,
    Leave,
    Multicast,
    Message,
    Membership,
    Disconnect,
    ErrorFrame,
    Status,
    StatusReply,
    FlowQuery,
    FlowState,
    GroupQuery,
    GroupMembers,
]

_CONNECT = 1
_CONNECT_OK = 2
_JOIN = 3
_LEAVE = 4
_MULTICAST = 5
_MESSAGE = 6
_MEMBERSHIP = 7
_DISCONNECT = 8
_ERROR = 9
_STATUS = 10
_STATUS_REPLY = 11
_MULTICAST_EXT = 12
_MESSAGE_EXT = 13
_FLOW_QUERY = 14
_FLOW_STATE = 15
_GROUP_QUERY = 16
_GROUP_MEMBERS = 17
_CONNECT_EXT = 18
_MEMBERSHIP_DELTA = 19

# ---- encoding ----


class _Writer:
    """Appends fields to a frame being encoded."""

    def __init__(self, frame_type: int) -> None:
        self.out = bytearray(LENGTH_LEN)
        self.out += bytes([CLIENT_VERSION, frame_type])

    def u8(self, value: int) -> None:
        self.out += struct.pack(">B", value)

    def u16(self, value: int) -> None:
        self.out += struct.pack(">H", value)

    def u32(self, value: int) -> None:
        self.out += struct.pack(">I", value)

    def u64(self, value: int) -> None:
        self.out += struct.pack(">Q", value)

    def string(self, text: str) -> None:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise FrameError("bad_utf8", f"string {text!r} is not valid UTF-8: {e}") from None
        if len(data) > _STRING_MAX:
            raise FrameError(
                "over_limit", f"string of {len(data)} exceeds the limit {_STRING_MAX}"
            )
        self.u16(len(data))
        self.out += data

    def strings(self, items: list[str]) -> None:
        if len(items) > _STRING_MAX:
            raise FrameError(
                "over_limit", f"list of {len(items)} exceeds the limit {_STRING_MAX}"
            )
        self.u16(len(items))
        for item in items:
            self.string(item)

    def payload(self, data: bytes) -> None:
        if len(data) > _U32_MAX:
            raise FrameError(
                "over_limit", f"payload of {len(data)} exceeds the limit {_U32_MAX}"
            )
        self.out += struct.pack(">I", len(data))
        self.out += data

    def finish(self) -> bytes:
        length = len(self.out) - LENGTH_LEN
        if length > _U32_MAX:
            raise FrameError("too_long", f"frame of {length} bytes exceeds the maximum {_U32_MAX}")
        self.out[:LENGTH_LEN] = struct.pack(">I", length)
        return bytes(self.out)


def _check_range(what: str, value: int, bits: int) -> int:
    """``value`` as an int that fits ``bits`` unsigned bits, or a FrameError."""
    value = int(value)
    if not 0 <= value < (1 << bits):
        raise FrameError("over_limit", f"{what} {value} does not fit in u{bits}")
    return value


def encode(frame: Frame) -> bytes:
    """The frame's bytes, length prefix included.

    Fails (:class:`FrameError`) only if a field does not fit its length field
    (a string over 65,535 bytes, and so on); :class:`Limits` are the
    receiver's business (the client checks requests before encoding them).
    """
    if isinstance(frame, Connect):
        w = _Writer(_CONNECT_EXT if frame.features else _CONNECT)
        w.string(frame.name)
        w.string(frame.token)
        if frame.features:
            w.u32(_check_range("features", frame.features, 32))
    elif isinstance(frame, MembershipDelta):
        w = _Writer(_MEMBERSHIP_DELTA)
        w.string(frame.group)
        w.u64(_check_range("view id", frame.view_id, 64))
        w.u64(_check_range("previous view id", frame.previous, 64))
        w.u8(_check_range("reason", frame.reason, 8))
        w.u8(int(bool(frame.transitional)) | int(bool(frame.quorum)) << 1)
        w.strings(frame.joined)
        w.strings(frame.left)
    elif isinstance(frame, ConnectOk):
        w = _Writer(_CONNECT_OK)
        w.string(frame.private_group)
    elif isinstance(frame, Join):
        w = _Writer(_JOIN)
        w.string(frame.group)
    elif isinstance(frame, Leave):
        w = _Writer(_LEAVE)
        w.string(frame.group)
    elif isinstance(frame, Multicast):
        flags = _check_range("flags", frame.flags, 8)
        mess_type = _check_range("message type", frame.mess_type, 16)
        ext = flags != 0 or mess_type != 0
        w = _Writer(_MULTICAST_EXT if ext else _MULTICAST)
        w.u8(_check_range("service", frame.service, 8))
        if ext:
            w.u8(flags)
            w.u16(mess_type)
        w.strings(frame.groups)
        w.payload(frame.payload)
    elif isinstance(frame, Message):
        mess_type = _check_range("message type", frame.mess_type, 16)
        w = _Writer(_MESSAGE_EXT if mess_type else _MESSAGE)
        w.string(frame.sender)
        w.u8(_check_range("service", frame.service, 8))
        if mess_type:
            w.u16(mess_type)
        w.strings(frame.groups)
        w.payload(frame.payload)
    elif isinstance(frame, Membership):
        w = _Writer(_MEMBERSHIP)
        w.string(frame.group)
        w.u64(_check_range("view id", frame.view_id, 64))
        w.u8(_check_range("reason", frame.reason, 8))
        w.u8(int(bool(frame.transitional)) | int(bool(frame.quorum)) << 1)
        w.strings(frame.members)
    elif isinstance(frame, Disconnect):
        w = _Writer(_DISCONNECT)
    elif isinstance(frame, ErrorFrame):
        w = _Writer(_ERROR)
        w.u16(_check_range("error code", frame.code, 16))
        w.string(frame.text)
    elif isinstance(frame, Status):
        w = _Writer(_STATUS)
    elif isinstance(frame, StatusReply):
        w = _Writer(_STATUS_REPLY)
        w.string(frame.text)
    elif isinstance(frame, FlowQuery):
        w = _Writer(_FLOW_QUERY)
        w.u32(_check_range("nonce", frame.nonce, 32))
    elif isinstance(frame, FlowState):
        w = _Writer(_FLOW_STATE)
        w.u32(_check_range("nonce", frame.nonce, 32))
        w.u8(int(bool(frame.accepting)))
        w.u32(_check_range("held messages", frame.held_messages, 32))
        w.u64(_check_range("held bytes", frame.held_bytes, 64))
        w.u64(_check_range("queued bytes", frame.queued_bytes, 64))
        w.u64(_check_range("queue limit", frame.queue_limit, 64))
    elif isinstance(frame, GroupQuery):
        w = _Writer(_GROUP_QUERY)
        w.u32(_check_range("nonce", frame.nonce, 32))
        w.string(frame.group)
    elif isinstance(frame, GroupMembers):
        w = _Writer(_GROUP_MEMBERS)
        w.u32(_check_range("nonce", frame.nonce, 32))
        w.string(frame.group)
        w.u64(_check_range("view id", frame.view_id, 64))
        w.strings(frame.members)
    else:
        raise TypeError(f"not a client-protocol frame: {frame!r}")
    return w.finish()


# ---- decoding ----


class _Reader:
    """Takes fields off the front of one frame's body, checking each."""

    def __init__(self, body: memoryview, limits: Limits) -> None:
        self.body = body
        self.pos = 0
        self.limits = limits

    def remaining(self) -> int:
        return len(self.body) - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if self.remaining() < n:
            raise FrameError("truncated", f"truncated {what}")
        chunk = self.body[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return struct.unpack(">H", self.take(2, what))[0]

    def u32(self, what: str) -> int:
        return struct.unpack(">I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack(">Q", self.take(8, what))[0]

    def string(self, what: str, max_len: int) -> str:
        length = self.u16(what)
        if length > max_len:
            raise FrameError("over_limit", f"{what} of {length} exceeds the limit {max_len}")
        data = self.take(length, what)
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError:
            raise FrameError("bad_utf8", f"{what} is not valid UTF-8") from None

    def name(self, what: str) -> str:
        text = self.string(what, self.limits.name_max)
        if not text:
            raise FrameError("empty", f"an empty {what}")
        return text

    def names(self, what: str, max_count: int) -> list[str]:
        count = self.u16(what)
        # Each name takes at least 3 bytes: never trust a count beyond that.
        room = self.remaining() // 3
        if count > max_count or count > room:
            limit = min(max_count, room)
            raise FrameError("over_limit", f"{what} of {count} exceeds the limit {limit}")
        return [self.name(what) for _ in range(count)]

    def service(self) -> Service:
        value = self.u8("service")
        try:
            return Service(value)
        except ValueError:
            raise FrameError("bad_service", f"unknown service {value}") from None

    def reason(self) -> Reason:
        value = self.u8("reason")
        try:
            return Reason(value)
        except ValueError:
            raise FrameError("bad_reason", f"unknown membership reason {value}") from None

    def payload(self) -> bytes:
        length = self.u32("payload length")
        limit = self.limits.payload_max
        if length > limit:
            raise FrameError("over_limit", f"payload of {length} exceeds the limit {limit}")
        return bytes(self.take(length, "payload"))


def decode(buf: bytes | bytearray | memoryview, limits: Limits | None = None) -> tuple[Frame, int] | None:
    """Decodes one frame from the front of ``buf``.

    Returns ``None`` if ``buf`` does not yet hold a whole frame, otherwise
    the frame and the number of bytes it used. Raises :class:`FrameError`
    for anything else irregular, as the Rust codec does.
    """
    limits = limits or Limits()
    view = memoryview(buf)
    if len(view) < LENGTH_LEN:
        return None
    (length,) = struct.unpack(">I", view[:LENGTH_LEN])
    maximum = limits.frame_max()
    if length > maximum:
        raise FrameError("too_long", f"frame of {length} bytes exceeds the maximum {maximum}")
    if length < 2:
        raise FrameError("too_short", f"frame too short: {length} bytes")
    if len(view) < LENGTH_LEN + length:
        return None
    frame = _decode_body(view[LENGTH_LEN : LENGTH_LEN + length], limits)
    return frame, LENGTH_LEN + length


def _decode_body(body: memoryview, limits: Limits) -> Frame:
    r = _Reader(body, limits)
    version = r.u8("version")
    if version != CLIENT_VERSION:
        raise FrameError("bad_version", f"unsupported client-protocol version {version}")
    frame_type = r.u8("type")
    decoder = _BODY_DECODERS.get(frame_type)
    if decoder is None:
        raise FrameError("unknown_type", f"unknown frame type {frame_type}")
    frame = decoder(r)
    if r.remaining():
        raise FrameError(
            "trailing_bytes", f"{r.remaining()} bytes left over after the frame's body"
        )
    return frame


def _decode_multicast(r: _Reader) -> Multicast:
    service = r.service()
    groups = r.names("groups", r.limits.groups_max)
    if not groups:
        raise FrameError("empty", "an empty group list")
    return Multicast(service, groups, r.payload())


def _decode_multicast_ext(r: _Reader) -> Multicast:
    service = r.service()
    flags = r.u8("flags")
    if flags & ~_FLAGS_ALL:
        raise FrameError("bad_flags", f"unknown multicast flags {flags:#04x}")
    mess_type = r.u16("message type")
    groups = r.names("groups", r.limits.groups_max)
    if not groups:
        raise FrameError("empty", "an empty group list")
    return Multicast(service, groups, r.payload(), flags, mess_type)


def _decode_message(r: _Reader) -> Message:
    sender = r.name("sender")
    service = r.service()
    groups = r.names("groups", r.limits.groups_max)
    return Message(sender, service, groups, r.payload())


def _decode_message_ext(r: _Reader) -> Message:
    sender = r.name("sender")
    service = r.service()
    mess_type = r.u16("message type")
    groups = r.names("groups", r.limits.groups_max)
    return Message(sender, service, groups, r.payload(), mess_type)


def _decode_membership(r: _Reader) -> Membership:
    group = r.name("group name")
    view_id = r.u64("view id")
    reason = r.reason()
    flags = r.u8("view flags")
    if flags > 3:
        raise FrameError("bad_flags", f"unknown view flags {flags:#x}")
    members = r.names("members", r.limits.members_max)
    return Membership(group, view_id, reason, members, bool(flags & 1), bool(flags & 2))


def _decode_membership_delta(r: _Reader) -> MembershipDelta:
    group = r.name("group name")
    view_id = r.u64("view id")
    previous = r.u64("previous view id")
    reason = r.reason()
    flags = r.u8("view flags")
    if flags > 3:
        raise FrameError("bad_flags", f"unknown view flags {flags:#x}")
    joined = r.names("joined", r.limits.members_max)
    left = r.names("left", r.limits.members_max - len(joined))
    return MembershipDelta(
        group, view_id, previous, reason, joined, left, bool(flags & 1), bool(flags & 2)
    )


def _decode_flow_state(r: _Reader) -> FlowState:
    nonce = r.u32("nonce")
    flags = r.u8("flow flags")
    if flags > 1:
        raise FrameError("bad_flags", f"unknown flow-state flags {flags:#04x}")
    return FlowState(
        nonce, bool(flags), r.u32("held messages"), r.u64("held bytes"),
        r.u64("queued bytes"), r.u64("queue limit"),
    )


_BODY_DECODERS = {
    _CONNECT: lambda r: Connect(r.name("private name"), r.string("token", TOKEN_MAX)),
    _CONNECT_OK: lambda r: ConnectOk(r.name("private group")),
    _JOIN: lambda r: Join(r.name("group name")),
    _LEAVE: lambda r: Leave(r.name("group name")),
    _MULTICAST: _decode_multicast,
    _MESSAGE: _decode_message,
    _MEMBERSHIP: _decode_membership,
    _DISCONNECT: lambda r: Disconnect(),
    _ERROR: lambda r: ErrorFrame(r.u16("error code"), r.string("error text", _STRING_MAX)),
    _STATUS: lambda r: Status(),
    _STATUS_REPLY: lambda r: StatusReply(r.string("status text", _STRING_MAX)),
    _MULTICAST_EXT: _decode_multicast_ext,
    _MESSAGE_EXT: _decode_message_ext,
    _FLOW_QUERY: lambda r: FlowQuery(r.u32("nonce")),
    _FLOW_STATE: _decode_flow_state,
    _GROUP_QUERY: lambda r: GroupQuery(r.u32("nonce"), r.name("group name")),
    _CONNECT_EXT: lambda r: Connect(
        r.name("private name"), r.string("token", TOKEN_MAX), r.u32("features")
    ),
    _MEMBERSHIP_DELTA: _decode_membership_delta,
    _GROUP_MEMBERS: lambda r: GroupMembers(
        r.u32("nonce"), r.name("group name"), r.u64("view id"),
        r.names("members", r.limits.members_max),
    ),
}
