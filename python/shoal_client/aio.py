"""The asyncio client: the blocking :class:`shoal_client.Client`'s
operations as coroutines, on ``asyncio`` streams.

::

    import asyncio
    from shoal_client import Service
    from shoal_client.aio import Client

    async def main() -> None:
        async with await Client.connect("echo") as client:
            await client.join("lobby")
            while True:
                event = await client.receive()
                ...

``receive`` is cancel-safe: cancelled (say, by ``asyncio.wait_for`` or a
task group), it loses no bytes; the next call goes on where it stopped.
"""

from __future__ import annotations

import asyncio
import socket as _socket
from collections import deque
from collections.abc import Iterable
from types import TracebackType

from . import codec
from ._common import (
    CHUNK,
    DISCONNECT_WAIT,
    GONE,
    DaemonFlow,
    Endpoint,
    Event,
    FlowControl,
    FlowControlState,
    Groups,
    PathLike,
    Requests,
    Views,
    connect_answer,
    endpoint,
    malformed,
    split_private_group,
)
from .codec import Limits, Service
from .errors import Disconnected, ShoalClientError, ShoalError, Unreachable, WouldBlock

__all__ = ["Client"]


async def _open(where: Endpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams to the endpoint, or :class:`Unreachable`."""
    try:
        if where.path is not None:
            return await asyncio.open_unix_connection(str(where.path))
        reader, writer = await asyncio.open_connection(where.host, where.port)
    except OSError as e:
        raise Unreachable(str(where), e) from None
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
    return reader, writer


class Client:
    """An asyncio connection to the local ``shoal daemon`` (make one with
    ``await Client.connect(...)``). Several tasks may send at once (each
    request is written whole); one task at a time should receive."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        private_group: str,
        requests: Requests,
        buf: bytearray,
    ) -> None:
        """Use :meth:`Client.connect`."""
        self._reader = reader
        self._writer = writer
        self._private_group = private_group
        self._views = Views(private_group)
        # Frames read while a flow-control query waited, for receive.
        self._backlog: deque[codec.Frame] = deque()
        self._flow_nonce = 0
        self._requests = requests
        self._buf = buf
        self._closed = False
        self._self_discard = False

    @classmethod
    async def connect(
        cls,
        name: str,
        socket: PathLike | None = None,
        *,
        tcp: str | tuple[str, int] | None = None,
        token: str | None = None,
        limits: Limits | None = None,
    ) -> "Client":
        """As the blocking :meth:`shoal_client.Client.connect` (bound it with
        ``asyncio.timeout`` if need be)."""
        limits = limits or Limits()
        where = endpoint(socket, tcp, token)
        requests = Requests(limits)
        hello = requests.connect(name, where.token)
        reader, writer = await _open(where)
        buf = bytearray()
        try:
            writer.write(hello)
            await writer.drain()
            private_group = connect_answer(await _next_frame(reader, buf, limits))
        except GONE:
            writer.close()
            raise Disconnected("the daemon closed the connection") from None
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer, private_group, requests, buf)

    @property
    def private_group(self) -> str:
        """This client's address (``#name#daemon``)."""
        return self._private_group

    @property
    def name(self) -> str:
        """The private name this client connected under."""
        return split_private_group(self._private_group)[0]

    @property
    def daemon(self) -> str:
        """The name of the daemon this client is connected to."""
        return split_private_group(self._private_group)[1]

    def set_self_discard(self, on: bool) -> None:
        """Self-discard for later multicasts that do not say otherwise; see
        :meth:`shoal_client.Client.set_self_discard`."""
        self._self_discard = bool(on)

    def try_multicast(
        self,
        service: Service | int | str,
        groups: Groups,
        payload: bytes,
        *,
        self_discard: bool | None = None,
        mess_type: int = 0,
    ) -> None:
        """As :meth:`multicast`, but never waits (not a coroutine): while the
        connection's write buffer is above its high-water mark (the daemon
        reads no faster; asyncio's ``drain`` would wait) nothing is sent and
        :class:`WouldBlock` is raised; otherwise the message is buffered
        for the event loop to write."""
        if self._closed:
            raise Disconnected("the client is closed")
        discard = self._self_discard if self_discard is None else self_discard
        frame = self._requests.multicast(service, groups, payload, discard, mess_type)
        if self.flow_control().blocked:
            raise WouldBlock()
        self._writer.write(frame)

    def flow_control(self) -> FlowControl:
        """Whether the daemon takes this client's sends: ``blocked`` while
        the connection's write buffer is above its high-water mark."""
        transport = self._writer.transport
        size = transport.get_write_buffer_size()
        _low, high = transport.get_write_buffer_limits()
        return FlowControl(blocked=size > high, pending_bytes=size)

    async def flow_control_state(self, timeout: float = 5.0) -> FlowControlState:
        """What holds this client's traffic back, in the client and in the
        daemon; see :meth:`shoal_client.Client.flow_control_state`. The query
        joins the connection's write buffer; events that arrive while waiting
        are kept for :meth:`receive`. ``client_pending_bytes`` is the write
        buffer's size."""
        if self._closed:
            raise Disconnected("the client is closed")
        self._flow_nonce = (self._flow_nonce + 1) & 0xFFFFFFFF
        nonce = self._flow_nonce
        self._writer.write(codec.encode(codec.FlowQuery(nonce)))
        limits = self._requests.limits
        answer = None
        try:
            async with asyncio.timeout(timeout):
                while answer is None:
                    frame = await _next_frame(self._reader, self._buf, limits)
                    if isinstance(frame, codec.FlowState):
                        if frame.nonce == nonce:
                            answer = DaemonFlow.of(frame)
                    else:
                        self._backlog.append(frame)
        except TimeoutError:
            pass
        except ShoalClientError as e:
            if not isinstance(e, Disconnected):
                await self.close()
            raise
        pending = self._writer.transport.get_write_buffer_size()
        return FlowControlState(pending, answer)

    async def members(self, group: str, timeout: float = 5.0) -> list[str] | None:
        """The members of ``group`` as this client's daemon knows them now,
        without joining it; see :meth:`shoal_client.Client.members`. The
        query joins the connection's write buffer; events that arrive while
        waiting are kept for :meth:`receive`."""
        if self._closed:
            raise Disconnected("the client is closed")
        nonce = (self._flow_nonce + 1) & 0xFFFFFFFF
        query = self._requests.group_query(nonce, group)
        self._flow_nonce = nonce
        self._writer.write(query)
        limits = self._requests.limits
        try:
            async with asyncio.timeout(timeout):
                while True:
                    frame = await _next_frame(self._reader, self._buf, limits)
                    if isinstance(frame, codec.GroupMembers):
                        if frame.nonce == nonce:
                            return list(frame.members)
                    else:
                        self._backlog.append(frame)
        except TimeoutError:
            return None
        except ShoalClientError as e:
            if not isinstance(e, Disconnected):
                await self.close()
            raise

    async def flush(self) -> None:
        """Waits until the write buffer is below its low-water mark."""
        await self._send(b"")

    async def join(self, group: str) -> None:
        """Joins ``group``."""
        await self._send(self._requests.join(group))

    async def leave(self, group: str) -> None:
        """Leaves ``group``."""
        await self._send(self._requests.leave(group))

    async def multicast(
        self,
        service: Service | int | str,
        groups: Groups,
        payload: bytes,
        *,
        self_discard: bool | None = None,
        mess_type: int = 0,
    ) -> None:
        """Sends ``payload`` to every member of ``groups`` with ``service``;
        ``self_discard`` and ``mess_type`` as in the blocking client's."""
        discard = self._self_discard if self_discard is None else self_discard
        await self._send(self._requests.multicast(service, groups, payload, discard, mess_type))

    async def multicast_batch(
        self,
        service: Service | int | str,
        groups: Groups,
        payloads: Iterable[bytes],
        *,
        self_discard: bool | None = None,
    ) -> None:
        """Sends each of ``payloads`` as one message in a single write; see
        :meth:`shoal_client.Client.multicast_batch`."""
        discard = self._self_discard if self_discard is None else self_discard
        await self._send(self._requests.multicast_batch(service, groups, payloads, discard))

    async def receive(self, timeout: float | None = None) -> Event | None:
        """The next :class:`Message` or :class:`Membership`; ``None`` after
        ``timeout`` seconds of silence. Errors as the blocking client's."""
        if self._closed:
            raise Disconnected("the client is closed")
        limits = self._requests.limits
        try:
            async with asyncio.timeout(timeout):
                while True:
                    # Frames a flow-control query read ahead come first;
                    # answers to queries nobody waits for are dropped.
                    if self._backlog:
                        frame = self._backlog.popleft()
                    else:
                        frame = await _next_frame(self._reader, self._buf, limits)
                    if not isinstance(frame, (codec.FlowState, codec.GroupMembers)):
                        break
        except TimeoutError:
            return None
        except ShoalClientError as e:
            if not isinstance(e, Disconnected):
                await self.close()
            raise
        return self._views.event(frame)

    async def disconnect(self) -> None:
        """Says goodbye, waits (at most 5 s) for the daemon to close, closes.
        An error the daemon still had for this client is raised as
        :class:`ShoalError`."""
        if self._closed:
            return
        try:
            await self._send(self._requests.disconnect())
            if self._writer.can_write_eof():
                self._writer.write_eof()
        except (Disconnected, OSError):
            pass
        try:
            async with asyncio.timeout(DISCONNECT_WAIT):
                await self._drain()
        except TimeoutError:
            pass
        finally:
            await self.close()

    async def _drain(self) -> None:
        limits = self._requests.limits
        while True:
            try:
                frame = await _next_frame(self._reader, self._buf, limits)
            except ShoalClientError:
                return
            if isinstance(frame, codec.Disconnect):
                return
            if isinstance(frame, codec.ErrorFrame):
                raise ShoalError(frame.code, frame.text)

    async def close(self) -> None:
        """Closes the connection without a goodbye."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Disconnects; an error from the goodbye is raised only when the
        block itself raised nothing."""
        if exc_type is None:
            await self.disconnect()
            return
        try:
            await self.disconnect()
        except ShoalClientError:
            pass

    async def _send(self, frame: bytes) -> None:
        if self._closed:
            raise Disconnected("the client is closed")
        try:
            if frame:
                self._writer.write(frame)
            await self._writer.drain()
        except GONE:
            raise Disconnected("the daemon closed the connection") from None


async def _next_frame(
    reader: asyncio.StreamReader, buf: bytearray, limits: Limits
) -> codec.Frame:
    """The next frame from ``buf`` topped up from ``reader``. Cancel-safe:
    bytes read stay in ``buf``."""
    while True:
        try:
            decoded = codec.decode(buf, limits)
        except codec.FrameError as e:
            raise malformed(e) from None
        if decoded is not None:
            frame, used = decoded
            del buf[:used]
            return frame
        try:
            data = await reader.read(CHUNK)
        except GONE:
            raise Disconnected("the daemon reset the connection") from None
        if not data:
            raise Disconnected("the daemon closed the connection")
        buf += data
