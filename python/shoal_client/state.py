"""State transfer to joiners (as JGroups' ``getState``/``setState``) over the
``agreed`` total order: the same protocol, messages and guarantees as the
Rust ``shoal_client::state`` (``docs/client.md``, "State transfer").

A member keeps state that it changes only by applying the group's messages,
sent ``agreed`` (or ``safe``), in delivery order. A joiner joins the group;
if its first view lists nobody else it founds the state, otherwise it
multicasts a request, and the point of the total order where that request
falls is its *state point*: the member holding the state that sorts first
among the current members snapshots its state when the request is delivered
to it (everything before the point applied, nothing after) and sends it to
the joiner's private group. The joiner drops the group's messages ordered
before its point, holds back those after it, restores the snapshot, then
applies the held-back events in order. A joiner that sees a member leave
while it waits asks again (a new point); :meth:`StateTransfer.retry` asks
again by hand. Message types from :data:`RESERVED_TYPES` up are the
protocol's.

:class:`StateTransfer` is sans-IO: feed it every event with :meth:`handle`
(it calls the replica's methods) and send what :meth:`poll_send` gives
(:func:`send_pending` for the blocking client, :func:`send_pending_async`
for asyncio).
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from ._common import Event
from .codec import Membership, Message, Service

__all__ = [
    "RESERVED_TYPES",
    "Replica",
    "Outgoing",
    "StateTransfer",
    "send_pending",
    "send_pending_async",
]

#: Message types from this one up belong to the state-transfer protocol.
RESERVED_TYPES = 0xFF00
_REQUEST = RESERVED_TYPES
_REPLY = RESERVED_TYPES + 1
_READY = RESERVED_TYPES + 2


class Replica(Protocol):
    """What an application replicates."""

    def apply(self, message: Message) -> None:
        """A message of the group (type below :data:`RESERVED_TYPES`), in
        the group's order, once the state is here."""

    def view(self, view: Membership) -> None:
        """A view of the group, in order with the messages."""

    def snapshot(self) -> bytes:
        """The whole state, as :meth:`restore` takes it."""

    def restore(self, snapshot: bytes) -> None:
        """Replaces the state with a snapshot from another member."""


@dataclass
class Outgoing:
    """A multicast the protocol wants sent, always ``agreed``."""

    groups: list[str]
    mess_type: int
    payload: bytes


def _encode_reply(group: str, nonce: int, ready: list[str], snapshot: bytes) -> bytes:
    def string(s: str) -> bytes:
        data = s.encode()
        return struct.pack(">H", len(data)) + data

    head = string(group) + struct.pack(">QH", nonce, len(ready))
    return head + b"".join(string(r) for r in ready) + snapshot


def _decode_reply(data: bytes) -> tuple[str, int, list[str], bytes] | None:
    pos = 0

    def take(n: int) -> bytes | None:
        nonlocal pos
        if pos + n > len(data):
            return None
        chunk = data[pos : pos + n]
        pos += n
        return chunk

    def string() -> str | None:
        head = take(2)
        if head is None:
            return None
        body = take(struct.unpack(">H", head)[0])
        if body is None:
            return None
        try:
            return body.decode()
        except UnicodeDecodeError:
            return None

    group = string()
    fixed = take(10)
    if group is None or fixed is None:
        return None
    nonce, count = struct.unpack(">QH", fixed)
    ready = []
    for _ in range(count):
        r = string()
        if r is None:
            return None
        ready.append(r)
    return group, nonce, ready, data[pos:]


def _nonce(payload: bytes) -> int | None:
    return struct.unpack(">Q", payload)[0] if len(payload) == 8 else None


class StateTransfer:
    """One member's side of state transfer for one group, for the client
    whose private group is ``me``."""

    def __init__(self, group: str, me: str) -> None:
        self.group = group
        self.me = me
        self._phase = "joining"  # "joining", "waiting", "ready"
        self._nonce = 0
        self._seen = False
        self._members: list[str] = []
        self._ready: set[str] = set()
        self._held: list[Event] = []
        self._last_view: Membership | None = None
        self._out: deque[Outgoing] = deque()
        #: Snapshots this member has sent to joiners.
        self.provided = 0

    @property
    def is_ready(self) -> bool:
        """Whether this member holds the state (restored, or founded)."""
        return self._phase == "ready"

    @property
    def members(self) -> list[str]:
        """The group's members as of the last view handled."""
        return list(self._members)

    def poll_send(self) -> Outgoing | None:
        """The next multicast to send."""
        return self._out.popleft() if self._out else None

    def retry(self) -> None:
        """Asks again for the state, if still waiting: a new state point."""
        if self._phase == "waiting":
            self._request()

    def handle(self, replica: Replica, event: Event) -> Event | None:
        """An event the client received: consumed if it is the group's or
        this protocol's (the replica is called as it says), else given back."""
        if isinstance(event, Membership):
            if event.group != self.group:
                return event
            self._on_view(replica, event)
            return None
        if event.mess_type == _REPLY and event.groups == [self.me]:
            self._on_reply(replica, event)
            return None
        if self.group in event.groups:
            self._on_message(replica, event)
            return None
        return event

    def _on_view(self, replica: Replica, view: Membership) -> None:
        lost = any(m not in view.members for m in self._members)
        self._members = list(view.members)
        self._ready &= set(view.members)
        if self._phase == "joining":
            if self.me not in view.members:
                return
            if view.members == [self.me]:
                self._become_ready()
                replica.view(view)
            else:
                self._last_view = view
                self._request()
        elif self._phase == "waiting":
            if lost:
                self._last_view = view
                self._request()
            elif self._seen:
                self._held.append(view)
            else:
                self._last_view = view
        else:
            replica.view(view)

    def _on_message(self, replica: Replica, m: Message) -> None:
        if self._phase == "joining":
            return
        if self._phase == "waiting":
            if m.mess_type == _REQUEST and m.sender == self.me and _nonce(m.payload) == self._nonce:
                self._held.clear()
                self._seen = True
            elif m.mess_type == _READY:
                self._ready.add(m.sender)
                if self._seen:
                    self._held.append(m)
            elif self._seen:
                self._held.append(m)
            return
        self._on_message_ready(replica, m)

    def _on_message_ready(self, replica: Replica, m: Message) -> None:
        if m.mess_type == _REQUEST:
            nonce = _nonce(m.payload)
            if m.sender != self.me and self._provider() == self.me and nonce is not None:
                self._reply(m.sender, nonce, replica.snapshot())
        elif m.mess_type == _READY:
            self._ready.add(m.sender)
        elif m.mess_type < RESERVED_TYPES:
            replica.apply(m)

    def _provider(self) -> str | None:
        candidates = sorted(r for r in self._ready if r in self._members)
        return candidates[0] if candidates else None

    def _on_reply(self, replica: Replica, m: Message) -> None:
        if self._phase != "waiting" or not self._seen:
            return
        reply = _decode_reply(m.payload)
        if reply is None:
            return
        group, nonce, ready, snapshot = reply
        if group != self.group or nonce != self._nonce:
            return
        replica.restore(snapshot)
        self._ready |= set(ready)
        held, self._held = self._held, []
        self._become_ready()
        if self._last_view is not None:
            replica.view(self._last_view)
            self._last_view = None
        for event in held:
            if isinstance(event, Membership):
                self._members = list(event.members)
                self._ready &= set(event.members)
                replica.view(event)
            else:
                self._on_message_ready(replica, event)

    def _become_ready(self) -> None:
        self._phase = "ready"
        self._ready.add(self.me)
        self._held.clear()
        self._out.append(Outgoing([self.group], _READY, b""))

    def _request(self) -> None:
        self._nonce += 1
        self._phase = "waiting"
        self._seen = False
        self._held.clear()
        self._out.append(Outgoing([self.group], _REQUEST, struct.pack(">Q", self._nonce)))

    def _reply(self, to: str, nonce: int, snapshot: bytes) -> None:
        self.provided += 1
        payload = _encode_reply(self.group, nonce, sorted(self._ready), snapshot)
        self._out.append(Outgoing([to], _REPLY, payload))


def send_pending(client, state: StateTransfer) -> None:  # type: ignore[no-untyped-def]
    """Sends what ``state`` wants sent with the blocking ``client``."""
    while (o := state.poll_send()) is not None:
        client.multicast(Service.AGREED, o.groups, o.payload, self_discard=False,
                         mess_type=o.mess_type)


async def send_pending_async(client, state: StateTransfer) -> None:  # type: ignore[no-untyped-def]
    """Sends what ``state`` wants sent with the asyncio ``client``."""
    while (o := state.poll_send()) is not None:
        await client.multicast(Service.AGREED, o.groups, o.payload, self_discard=False,
                               mess_type=o.mess_type)
