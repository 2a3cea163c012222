"""What the blocking and asyncio clients share: endpoints, request checks
and encoding (the Rust ``Encoder``), and what received frames mean."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from . import codec
from .codec import Limits, Membership, Message, Service
from .errors import Disconnected, InvalidRequest, ProtocolError, ShoalError

#: Seconds ``disconnect`` waits for the daemon to close the connection.
DISCONNECT_WAIT = 5.0

#: Bytes asked of the socket per read, at least.
CHUNK = 64 * 1024

Event = Union[Message, Membership]
Groups = Union[str, Iterable[str]]
PathLike = Union[str, "os.PathLike[str]"]


def default_socket_path() -> Path:
    """Where a daemon serves clients when not configured otherwise:
    ``$XDG_RUNTIME_DIR/shoal.sock``, else ``/tmp/shoal-<uid>.sock`` (the uid
    read from ``/proc/self``, as the Rust library does)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "shoal.sock"
    try:
        uid = str(os.stat("/proc/self").st_uid)
    except OSError:
        uid = "user"
    return Path(f"/tmp/shoal-{uid}.sock")


@dataclass(frozen=True)
class Endpoint:
    """Where the daemon serves clients: a Unix socket path, or a TCP
    ``(host, port)`` with the token its listener requires."""

    path: Path | None = None
    host: str | None = None
    port: int | None = None
    token: str = ""

    def __str__(self) -> str:
        if self.path is not None:
            return str(self.path)
        return f"tcp {self.host}:{self.port}"


def parse_tcp_address(address: str | tuple[str, int]) -> tuple[str, int]:
    """``"host:port"``, ``"[::1]:port"`` or a ``(host, port)`` tuple."""
    if isinstance(address, tuple):
        host, port = address
        return str(host), int(port)
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise InvalidRequest(f"TCP address {address!r} is not host:port")
    port = int(port_text)
    if not 0 < port < 65536:
        raise InvalidRequest(f"TCP address {address!r}: port {port} is out of range")
    return host.removeprefix("[").removesuffix("]"), port


def endpoint(
    socket: PathLike | None, tcp: str | tuple[str, int] | None, token: str | None
) -> Endpoint:
    """The endpoint a ``connect`` call names: the Unix socket (``socket``,
    else the default path) without a token, or ``tcp`` with ``token``."""
    if tcp is not None:
        if socket is not None:
            raise InvalidRequest("give a Unix socket or a TCP address, not both")
        host, port = parse_tcp_address(tcp)
        return Endpoint(host=host, port=port, token=token or "")
    if token:
        raise InvalidRequest("a token is for a TCP listener; the Unix socket takes none")
    path = Path(socket) if socket is not None else default_socket_path()
    return Endpoint(path=path)


class Requests:
    """Checks requests against the limits, then encodes them."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def check_name(self, what: str, name: str) -> None:
        if not isinstance(name, str):
            raise InvalidRequest(f"a {what} is a str, not {type(name).__name__}")
        if not name:
            raise InvalidRequest(f"an empty {what}")
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > self.limits.name_max:
            raise InvalidRequest(
                f"{what} {name!r} is {size} bytes; the limit is {self.limits.name_max}"
            )

    def encode(self, frame: codec.Frame) -> bytes:
        try:
            return codec.encode(frame)
        except codec.FrameError as e:
            raise InvalidRequest(str(e)) from None

    def connect(self, name: str, token: str) -> bytes:
        self.check_name("private name", name)
        size = len(token.encode("utf-8", "surrogatepass"))
        if size > codec.TOKEN_MAX:
            raise InvalidRequest(f"the token is {size} bytes; the limit is {codec.TOKEN_MAX}")
        # Membership deltas: the library rebuilds each whole view (Views).
        return self.encode(codec.Connect(name, token, codec.MEMBERSHIP_DELTAS))

    def join(self, group: str) -> bytes:
        self.check_name("group name", group)
        return self.encode(codec.Join(group))

    def leave(self, group: str) -> bytes:
        self.check_name("group name", group)
        return self.encode(codec.Leave(group))

    def group_query(self, nonce: int, group: str) -> bytes:
        self.check_name("group name", group)
        if group.startswith("#"):
            raise InvalidRequest(f"{group!r} is a private group, not a group one joins")
        return self.encode(codec.GroupQuery(nonce, group))

    def disconnect(self) -> bytes:
        return self.encode(codec.Disconnect())

    def multicast(
        self,
        service: Service | int | str,
        groups: Groups,
        payload: bytes,
        self_discard: bool = False,
        mess_type: int = 0,
    ) -> bytes:
        service = as_service(service)
        if not isinstance(mess_type, int) or not 0 <= mess_type <= 0xFFFF:
            raise InvalidRequest(f"a message type is a u16 (0 to 65535), not {mess_type!r}")
        names = [groups] if isinstance(groups, str) else list(groups)
        if not names:
            raise InvalidRequest("a multicast names at least one group")
        if len(names) > self.limits.groups_max:
            raise InvalidRequest(f"{len(names)} groups; the limit is {self.limits.groups_max}")
        for name in names:
            self.check_name("group name", name)
        data = as_payload(payload)
        if len(data) > self.limits.payload_max:
            raise InvalidRequest(
                f"a payload of {len(data)} bytes; the limit is {self.limits.payload_max}"
            )
        flags = codec.SELF_DISCARD if self_discard else 0
        return self.encode(codec.Multicast(service, names, data, flags, mess_type))

    def multicast_batch(
        self,
        service: Service | int | str,
        groups: Groups,
        payloads: Iterable[bytes],
        self_discard: bool = False,
    ) -> bytes:
        """One ``Multicast`` frame per payload, concatenated for one write.
        All or nothing: a refused payload raises :class:`InvalidRequest`
        naming it, and nothing is encoded."""
        names = groups if isinstance(groups, str) else list(groups)
        frames = []
        for i, payload in enumerate(payloads):
            try:
                frames.append(self.multicast(service, names, payload, self_discard))
            except InvalidRequest as e:
                raise InvalidRequest(f"payload {i} of the batch: {e}") from None
        return b"".join(frames)


@dataclass(frozen=True)
class FlowControl:
    """Whether the daemon is taking what this client sends (as corosync's
    ``cpg_flow_control_state_get``): ``blocked`` while bytes of a message
    accepted by ``try_multicast`` wait in the client because the daemon's
    end of the connection is full."""

    blocked: bool
    pending_bytes: int = 0


@dataclass(frozen=True)
class DaemonFlow:
    """What the daemon holds for this client, when it read the query (the
    daemon's answer to ``flow_control_state``)."""

    #: Whether the daemon takes client input now (while not, it reads no
    #: client's socket and blocking sends wait).
    accepting: bool
    #: This client's messages the daemon holds that the daemons' total order
    #: has not delivered yet (waiting for a batch, being ordered, or
    #: ordered and held back for ``safe``).
    held_messages: int
    #: Their payload bytes.
    held_bytes: int
    #: Bytes of frames the daemon had queued to this client, not yet written
    #: to its socket; all of them come before the answer (how far behind
    #: this client was reading).
    queued_bytes: int
    #: That queue's bound (``limits.client_queue``): past it, the client is
    #: disconnected as slow.
    queue_limit: int

    @classmethod
    def of(cls, frame: codec.FlowState) -> "DaemonFlow":
        return cls(frame.accepting, frame.held_messages, frame.held_bytes,
                   frame.queued_bytes, frame.queue_limit)


@dataclass(frozen=True)
class FlowControlState:
    """What holds this client's traffic back, in the client and in the
    daemon (``flow_control_state``)."""

    #: Bytes accepted by ``try_multicast`` (and the query itself, if not yet
    #: written) that still wait in this client.
    client_pending_bytes: int
    #: The daemon's answer; ``None`` when it did not answer in time: it is not
    #: reading this client's socket (back-pressure).
    daemon: DaemonFlow | None


#: Seconds between tries to write what is pending while a flow-control query
#: waits for its answer.
FLOW_STEP = 0.005


def split_private_group(private_group: str) -> tuple[str, str]:
    """``(name, daemon)`` of a private group ``#name#daemon``."""
    name, _, daemon = private_group.removeprefix("#").partition("#")
    return name, daemon


def as_service(service: Service | int | str) -> Service:
    """A :class:`Service` from itself, its number or its name."""
    if isinstance(service, str):
        try:
            return Service.parse(service)
        except ValueError as e:
            raise InvalidRequest(str(e)) from None
    try:
        return Service(service)
    except ValueError:
        raise InvalidRequest(f"unknown service {service!r}") from None


def as_payload(payload: bytes | bytearray | memoryview) -> bytes:
    """The payload's bytes; a ``str`` is refused (encode it first)."""
    if isinstance(payload, str):
        raise InvalidRequest("a payload is bytes; encode the str first (text.encode())")
    try:
        return bytes(memoryview(payload).cast("B"))
    except TypeError:
        raise InvalidRequest(f"a payload is bytes, not {type(payload).__name__}") from None


def connect_answer(frame: codec.Frame) -> str:
    """The private group of a ``ConnectOk``; the error another frame means."""
    if isinstance(frame, codec.ConnectOk):
        return frame.private_group
    raise unwanted(frame)


def event(frame: codec.Frame) -> Event:
    """A frame after the handshake, as an event (before :class:`Views`)."""
    if isinstance(frame, (Message, Membership)):
        return frame
    raise unwanted(frame)


class Views:
    """The last view of each group this client belongs to (its id and
    members), which each new view is compared with (``Membership.joined``
    and ``left``) and a membership delta from the daemon is applied to."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.last: dict[str, tuple[int, list[str]]] = {}

    def annotate(self, view: Membership) -> None:
        """Fills in ``view.joined`` and ``view.left``, and remembers the view
        as the group's last while this client is a member."""
        previous = self.last.get(view.group)
        if previous is None:
            # The first view: everybody but this client was there before.
            before = {m for m in view.members if m != self.me}
        else:
            before = set(previous[1])
        now = set(view.members)
        view.joined = [m for m in view.members if m not in before]
        view.left = sorted(before - now)
        if self.me in now:
            self.last[view.group] = (view.view_id, list(view.members))
        else:
            self.last.pop(view.group, None)

    def rebuild(self, delta: codec.MembershipDelta) -> Membership:
        """The whole view a delta stands for: the group's last view, which
        must be the one it changes, without ``left``, with ``joined``."""
        last = self.last.get(delta.group)
        if last is None:
            raise ProtocolError("MembershipDelta for a group without a view")
        if last[0] != delta.previous:
            raise ProtocolError("MembershipDelta of a view other than the last")
        gone = set(delta.left)
        members = sorted({m for m in last[1] if m not in gone} | set(delta.joined))
        return Membership(
            delta.group, delta.view_id, delta.reason, members, delta.transitional, delta.quorum
        )

    def event(self, frame: codec.Frame) -> Event:
        """A frame after the handshake, as ``receive`` returns it."""
        if isinstance(frame, codec.MembershipDelta):
            frame = self.rebuild(frame)
        got = event(frame)
        if isinstance(got, Membership):
            self.annotate(got)
        return got


def unwanted(frame: codec.Frame) -> Exception:
    """The error a frame other than the one expected stands for."""
    if isinstance(frame, codec.ErrorFrame):
        return ShoalError(frame.code, frame.text)
    if isinstance(frame, codec.Disconnect):
        return Disconnected("the daemon said Disconnect")
    return ProtocolError(f"unexpected {type(frame).__name__} frame from the daemon")


def malformed(error: codec.FrameError) -> ProtocolError:
    """The error for bytes from the daemon that are not a frame."""
    return ProtocolError(f"malformed frame from the daemon: {error}")


#: OS errors that mean the connection is gone.
GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)
