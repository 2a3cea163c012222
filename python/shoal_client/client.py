"""The blocking client, on a standard-library socket."""

from __future__ import annotations

import select
import socket as _socket
from collections import deque
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from . import codec
from ._common import (
    CHUNK,
    DISCONNECT_WAIT,
    FLOW_STEP,
    GONE,
    Endpoint,
    DaemonFlow,
    Event,
    FlowControl,
    FlowControlState,
    Groups,
    PathLike,
    Requests,
    Views,
    connect_answer,
    default_socket_path,
    endpoint,
    malformed,
    split_private_group,
    unwanted,
)
from .codec import Limits, Service
from .errors import Disconnected, ShoalClientError, ShoalError, Unreachable, WouldBlock

__all__ = ["Client", "status"]


def _open(where: Endpoint, timeout: float | None) -> _socket.socket:
    """A connected socket to the endpoint, blocking, or :class:`Unreachable`."""
    try:
        if where.path is not None:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(str(where.path))
            except BaseException:
                sock.close()
                raise
        else:
            sock = _socket.create_connection((where.host, where.port), timeout=timeout)
            # Each request is one write; do not hold it back.
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
    except OSError as e:
        raise Unreachable(str(where), e) from None
    sock.settimeout(None)
    return sock


def _socket_failure(sock: _socket.socket, error: OSError) -> ShoalClientError:
    """What an OS error on the client's socket means: this side closed it
    (another thread's ``close``), or a fault of the socket itself."""
    if sock.fileno() == -1:
        return Disconnected("the client is closed")
    return ShoalClientError(f"client socket: {error}")


class _FrameReader:
    """Assembles frames from what the socket gives, one buffer growing to
    the largest frame seen (bounded by the limits, which ``decode`` checks
    before the frame's bytes are awaited)."""

    def __init__(self, sock: _socket.socket, limits: Limits) -> None:
        self.sock = sock
        self.limits = limits
        self.buf = bytearray()
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)

    def next_frame(self, deadline: float | None) -> codec.Frame | None:
        """The next frame, or ``None`` once ``deadline`` (a
        ``time.monotonic()`` value) passed. A frame half arrived stays
        buffered for the next call."""
        while True:
            try:
                decoded = codec.decode(self.buf, self.limits)
            except codec.FrameError as e:
                raise malformed(e) from None
            if decoded is not None:
                frame, used = decoded
                del self.buf[:used]
                return frame
            if deadline is not None and not self._wait_readable(deadline):
                return None
            self._read()

    def _wait_readable(self, deadline: float) -> bool:
        """Whether the socket has bytes (or EOF) before ``deadline``."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return bool(self.poller.poll(0))
            if self.poller.poll(max(1, int(left * 1000 + 0.999))):
                return True

    def _read(self) -> None:
        """Reads what the socket has (blocking until something or EOF)."""
        want = CHUNK
        if len(self.buf) >= codec.LENGTH_LEN:
            whole = codec.LENGTH_LEN + int.from_bytes(self.buf[: codec.LENGTH_LEN], "big")
            want = max(CHUNK, whole - len(self.buf))
        try:
            data = self.sock.recv(want)
        except GONE:
            raise Disconnected("the daemon reset the connection") from None
        except OSError as e:
            raise _socket_failure(self.sock, e) from e
        if not data:
            raise Disconnected("the daemon closed the connection")
        self.buf += data


class Client:
    """A blocking connection to the local ``shoal daemon``.

    Make one with :meth:`Client.connect`. Requests (``join``, ``leave``,
    ``multicast``) are not answered: the daemon reports a refusal with an
    ``Error`` frame, which the next :meth:`receive` raises as
    :class:`ShoalError`.

    One thread may send while another receives (each direction has its own
    lock; a request is one frame, written whole).
    """

    def __init__(
        self,
        sock: _socket.socket,
        private_group: str,
        reader: _FrameReader,
        requests: Requests,
    ) -> None:
        """Use :meth:`Client.connect`."""
        self._sock = sock
        self._private_group = private_group
        self._views = Views(private_group)
        # Frames read while a flow-control query waited, for receive.
        self._backlog: deque[codec.Frame] = deque()
        self._flow_nonce = 0
        self._reader = reader
        self._requests = requests
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._said_goodbye = False
        self._closed = False
        self._self_discard = False
        # Bytes of messages try_multicast accepted that the socket has not
        # taken yet; every send writes them first.
        self._pending = bytearray()

    @classmethod
    def connect(
        cls,
        name: str,
        socket: PathLike | None = None,
        *,
        tcp: str | tuple[str, int] | None = None,
        token: str | None = None,
        limits: Limits | None = None,
        timeout: float | None = None,
    ) -> "Client":
        """Connects under the private ``name`` (unique on that daemon).

        ``socket`` is the daemon's Unix socket (default: :func:`default_socket_path`);
        or ``tcp`` is a ``"host:port"`` TCP listener, with its ``token``.
        ``limits`` are the daemon's if it was configured with other than the
        defaults. ``timeout`` bounds the connection and the handshake
        (seconds; ``None``: wait).

        Raises :class:`ShoalError` when the daemon refuses (name taken, wrong
        token, daemon unavailable: retry), :class:`Unreachable` when nothing
        listens there, :class:`InvalidRequest` for a bad name or token.
        """
        limits = limits or Limits()
        where = endpoint(socket, tcp, token)
        requests = Requests(limits)
        hello = requests.connect(name, where.token)
        sock = _open(where, timeout)
        try:
            reader = _FrameReader(sock, limits)
            sock.sendall(hello)
            deadline = None if timeout is None else time.monotonic() + timeout
            frame = reader.next_frame(deadline)
            if frame is None:
                raise Disconnected(f"no answer from the daemon within {timeout} s")
            private_group = connect_answer(frame)
        except GONE:
            sock.close()
            raise Disconnected("the daemon closed the connection") from None
        except BaseException:
            sock.close()
            raise
        return cls(sock, private_group, reader, requests)

    @property
    def private_group(self) -> str:
        """This client's address (``#name#daemon``): the sender of its
        messages and its entry in membership lists."""
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
        """Self-discard for every later :meth:`multicast` and
        :meth:`multicast_batch` that does not say otherwise (Spread's
        SELF_DISCARD): the daemon does not deliver them back to this
        connection; the same application's other connections still get them."""
        self._self_discard = bool(on)

    def fileno(self) -> int:
        """The socket's descriptor (to wait on it with ``select``; bytes may
        already be buffered, so try ``receive(timeout=0)`` too)."""
        return self._sock.fileno()

    def join(self, group: str) -> None:
        """Joins ``group``; a :class:`Membership` including this client follows."""
        self._send(self._requests.join(group))

    def leave(self, group: str) -> None:
        """Leaves ``group``; a :class:`Membership` without this client follows."""
        self._send(self._requests.leave(group))

    def multicast(
        self,
        service: Service | int | str,
        groups: Groups,
        payload: bytes,
        *,
        self_discard: bool | None = None,
        mess_type: int = 0,
    ) -> None:
        """Sends ``payload`` to every member of ``groups`` (one group name or
        several: one message, delivered once to a member of several) with
        the guarantee ``service``. The sender need not be a member. A group
        may be a private group (``#name#daemon``).

        ``self_discard`` (default: the connection's, :meth:`set_self_discard`)
        keeps the message from coming back to this connection; ``mess_type``
        (0 to 65535) reaches the receivers as :attr:`Message.mess_type`."""
        discard = self._self_discard if self_discard is None else self_discard
        self._send(self._requests.multicast(service, groups, payload, discard, mess_type))

    def try_multicast(
        self,
        service: Service | int | str,
        groups: Groups,
        payload: bytes,
        *,
        self_discard: bool | None = None,
        mess_type: int = 0,
    ) -> None:
        """As :meth:`multicast`, but never waits: if the daemon's end of the
        connection is full (what was accepted before is not all written),
        nothing is sent and :class:`WouldBlock` is raised. Otherwise the
        message is accepted: written now, or, when the socket takes only
        part of it, the rest kept here and written first by the next send
        (or by :meth:`flush`)."""
        discard = self._self_discard if self_discard is None else self_discard
        frame = self._requests.multicast(service, groups, payload, discard, mess_type)
        with self._send_lock:
            if self._write_now(self._pending):
                raise WouldBlock()
            self._pending += frame
            self._write_now(self._pending)

    def flow_control(self) -> FlowControl:
        """Whether the daemon takes this client's sends, after trying (without
        waiting) to write what :meth:`try_multicast` left pending."""
        with self._send_lock:
            left = self._write_now(self._pending)
        return FlowControl(blocked=left > 0, pending_bytes=left)

    def flow_control_state(self, timeout: float = 5.0) -> FlowControlState:
        """What holds this client's traffic back, in the client and in the
        daemon: a ``FlowQuery`` and the daemon's answer. The query goes after
        what this client already sent (the daemon answers when it reads that
        far), written without blocking; waiting for the answer (at most
        ``timeout`` seconds) this keeps writing what is pending. Events that
        arrive meanwhile are kept, in order, for :meth:`receive`. No answer in
        time gives ``daemon`` ``None`` (the daemon is not reading this client);
        a late answer is dropped."""
        self._flow_nonce = (self._flow_nonce + 1) & 0xFFFFFFFF
        nonce = self._flow_nonce
        query = codec.encode(codec.FlowQuery(nonce))
        flow = self._await_answer(query, nonce, codec.FlowState, timeout)
        return FlowControlState(len(self._pending), None if flow is None else DaemonFlow.of(flow))

    def members(self, group: str, timeout: float = 5.0) -> list[str] | None:
        """The members of ``group`` as this client's daemon knows them now,
        without joining it (as corosync's ``cpg_membership_get``): a
        ``GroupQuery`` and the daemon's answer, the members' private groups in
        the order of a view's list; empty for a group nobody joined. ``None``
        when the daemon did not answer within ``timeout`` seconds (it is not
        reading this client). As :meth:`flow_control_state`, it keeps writing
        what is pending while it waits and keeps events arriving meanwhile, in
        order, for :meth:`receive`; a late answer is dropped. A name a join
        refuses raises :class:`InvalidRequest`."""
        nonce = (self._flow_nonce + 1) & 0xFFFFFFFF
        query = self._requests.group_query(nonce, group)
        self._flow_nonce = nonce
        answer = self._await_answer(query, nonce, codec.GroupMembers, timeout)
        return None if answer is None else list(answer.members)

    def _await_answer(self, query: bytes, nonce: int, kind: type, timeout: float):
        """Queues ``query`` and waits (at most ``timeout`` seconds) for the
        ``kind`` frame numbered ``nonce``, writing what is pending meanwhile;
        other frames are kept, in order, for :meth:`receive`, and late
        answers to earlier queries dropped. ``None``: no answer in time."""
        with self._send_lock:
            self._pending += query
        deadline = time.monotonic() + timeout
        with self._recv_lock:
            while True:
                with self._send_lock:
                    self._write_now(self._pending)
                step = min(deadline, time.monotonic() + FLOW_STEP)
                try:
                    frame = self._reader.next_frame(step)
                except ShoalClientError as e:
                    if not isinstance(e, Disconnected):
                        self.close()
                    raise
                if isinstance(frame, kind):
                    if frame.nonce == nonce:
                        return frame
                elif frame is not None:
                    self._backlog.append(frame)
                elif time.monotonic() >= deadline:
                    return None

    def flush(self) -> None:
        """Writes what :meth:`try_multicast` left pending, waiting as needed."""
        self._send(b"")

    def _write_now(self, pending: bytearray) -> int:
        """Writes what the socket takes of ``pending`` now (removing it);
        returns the bytes left. Call with the send lock held."""
        if self._closed:
            raise Disconnected("the client is closed")
        while pending:
            try:
                n = self._sock.send(pending, _socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except GONE:
                raise Disconnected("the daemon closed the connection") from None
            except OSError as e:
                raise _socket_failure(self._sock, e) from e
            del pending[:n]
        return len(pending)

    def multicast_batch(
        self,
        service: Service | int | str,
        groups: Groups,
        payloads: Iterable[bytes],
        *,
        self_discard: bool | None = None,
    ) -> None:
        """Sends each of ``payloads`` as one message, as :meth:`multicast`
        would one after the other, in a single write: the daemon orders
        them as consecutive messages of this client. All or nothing: if
        one payload is refused, :class:`InvalidRequest` names it and
        nothing is sent."""
        discard = self._self_discard if self_discard is None else self_discard
        self._send(self._requests.multicast_batch(service, groups, payloads, discard))

    def receive(self, timeout: float | None = None) -> Event | None:
        """The next :class:`Message` or :class:`Membership`; ``None`` after
        ``timeout`` seconds of silence (``None``: wait for ever).

        Raises :class:`ShoalError` for an ``Error`` frame from the daemon,
        :class:`Disconnected` when the connection is gone, and
        :class:`ProtocolError` for bytes that are not a frame (the
        connection is then closed: it cannot be read further).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._recv_lock:
            if self._closed:
                raise Disconnected("the client is closed")
            while True:
                # Frames a flow-control query read ahead come first; answers
                # to queries nobody waits for any more are dropped.
                if self._backlog:
                    frame = self._backlog.popleft()
                else:
                    try:
                        frame = self._reader.next_frame(deadline)
                    except ShoalClientError as e:
                        if not isinstance(e, Disconnected):
                            self.close()
                        raise
                if not isinstance(frame, (codec.FlowState, codec.GroupMembers)):
                    break
        return None if frame is None else self._views.event(frame)

    def __iter__(self) -> Iterator[Event]:
        """Every event until the connection ends (``Disconnected`` ends the
        loop; a :class:`ShoalError` is raised)."""
        while True:
            try:
                got = self.receive()
            except Disconnected:
                return
            if got is not None:
                yield got

    def disconnect(self) -> None:
        """Says goodbye and waits (at most :data:`DISCONNECT_WAIT`, 5 s) for
        the daemon to close the connection, then closes the socket. Messages
        still arriving are dropped; an error the daemon still had for this
        client is raised as :class:`ShoalError`. Calling it again does nothing.
        """
        if self._closed or self._said_goodbye:
            self.close()
            return
        try:
            self._send(self._requests.disconnect())
            self._said_goodbye = True
            self._sock.shutdown(_socket.SHUT_WR)
        except (Disconnected, OSError):
            pass  # Already closed: the daemon may still have said why.
        try:
            self._drain(time.monotonic() + DISCONNECT_WAIT)
        finally:
            self.close()

    def _drain(self, deadline: float) -> None:
        """Reads until the daemon closes, raising an error it sends."""
        if not self._recv_lock.acquire(timeout=DISCONNECT_WAIT):
            return  # Another thread is receiving: it will see the end.
        try:
            while True:
                try:
                    frame = self._reader.next_frame(deadline)
                except ShoalClientError:
                    return  # Closed (the expected end), or garbage: over.
                if frame is None or isinstance(frame, codec.Disconnect):
                    return
                if isinstance(frame, codec.ErrorFrame):
                    raise ShoalError(frame.code, frame.text)
        finally:
            self._recv_lock.release()

    def close(self) -> None:
        """Closes the socket without a goodbye (the daemon sees the client
        disconnect all the same)."""
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Disconnects; an error from the goodbye is raised only when the
        block itself raised nothing."""
        if exc_type is None:
            self.disconnect()
            return
        try:
            self.disconnect()
        except ShoalClientError:
            pass

    def _send(self, frame: bytes) -> None:
        with self._send_lock:
            if self._closed:
                raise Disconnected("the client is closed")
            try:
                if self._pending:
                    self._sock.sendall(self._pending)
                    self._pending.clear()
                if frame:
                    self._sock.sendall(frame)
            except GONE:
                raise Disconnected("the daemon closed the connection") from None
            except OSError as e:
                raise _socket_failure(self._sock, e) from e

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<shoal_client.Client {self._private_group} {state}>"


def status(socket: PathLike | None = None, timeout: float = 10.0) -> str:
    """The daemon's state (view, peers, clients, groups, counters), one item
    per line, as ``shoal status`` prints it. ``socket`` defaults to
    :func:`default_socket_path`. No ``Connect`` is needed."""
    where = Endpoint(path=default_socket_path() if socket is None else Path(socket))
    sock = _open(where, timeout)
    try:
        sock.sendall(codec.encode(codec.Status()))
        frame = _FrameReader(sock, Limits()).next_frame(time.monotonic() + timeout)
    finally:
        sock.close()
    if frame is None:
        raise Disconnected(f"no status from the daemon within {timeout} s")
    if isinstance(frame, codec.StatusReply):
        return frame.text
    raise unwanted(frame)


