"""The blocking and asyncio clients against a fake daemon: a thread on a
Unix socket (or loopback TCP) in a fresh directory, speaking the frames
with the codec. Timeouts only bound a failing test."""

from __future__ import annotations

import shutil
import socket
import sys
import tempfile
import threading
import time
import unittest
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shoal_client import (  # noqa: E402
    BAD_GROUP,
    NAME_TAKEN,
    Client,
    Disconnected,
    InvalidRequest,
    Membership,
    Message,
    ProtocolError,
    Reason,
    Service,
    ShoalError,
    Unreachable,
    WouldBlock,
    aio,
    status,
)
from shoal_client import codec  # noqa: E402

BOUND = 10.0


class Peer:
    """The fake daemon's side of one connection."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.conn.settimeout(BOUND)
        self.buf = b""

    def frame(self) -> codec.Frame | None:
        """The next frame the client sent, or None at EOF."""
        while True:
            decoded = codec.decode(self.buf)
            if decoded is not None:
                frame, used = decoded
                self.buf = self.buf[used:]
                return frame
            data = self.conn.recv(65536)
            if not data:
                return None
            self.buf += data

    def send(self, *frames: codec.Frame) -> None:
        self.conn.sendall(b"".join(codec.encode(f) for f in frames))

    def accept_client(self, private_group: str = "#me#fake") -> codec.Connect:
        """Reads the Connect and answers ConnectOk."""
        hello = self.frame()
        assert isinstance(hello, codec.Connect), hello
        self.send(codec.ConnectOk(private_group))
        return hello


Script = Callable[[Peer], None]


class FakeDaemon:
    """Serves one connection with ``script`` on a thread; ``finish`` joins
    it and re-raises what went wrong there."""

    def __init__(self, script: Script, tcp: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shoal-py-fake-"))
        if tcp:
            self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.listener.bind(("127.0.0.1", 0))
            self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        else:
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.address = str(self.dir / "fake.sock")
            self.listener.bind(self.address)
        self.listener.listen(1)
        self.listener.settimeout(BOUND)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()

    def _run(self, script: Script) -> None:
        try:
            conn, _ = self.listener.accept()
            with conn:
                script(Peer(conn))
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.error = e

    def finish(self) -> None:
        self.thread.join(BOUND)
        self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.thread.is_alive():
            raise AssertionError("the fake daemon's script did not finish")
        if self.error is not None:
            raise self.error


class Blocking(unittest.TestCase):
    def serve(self, script: Script, tcp: bool = False) -> FakeDaemon:
        daemon = FakeDaemon(script, tcp)
        self.addCleanup(daemon.finish)
        return daemon

    def test_handshake_gives_the_private_group(self) -> None:
        got: list[codec.Connect] = []
        d = self.serve(lambda p: got.append(p.accept_client("#alice#h")))
        with Client.connect("alice", d.address, timeout=BOUND) as c:
            self.assertEqual(c.private_group, "#alice#h")
        self.assertEqual(got, [codec.Connect("alice", "", codec.MEMBERSHIP_DELTAS)])

    def test_a_refused_connect_raises_the_daemons_error(self) -> None:
        d = self.serve(lambda p: (p.frame(), p.send(codec.ErrorFrame(3, "name alice is taken"))))
        with self.assertRaises(ShoalError) as caught:
            Client.connect("alice", d.address, timeout=BOUND)
        self.assertEqual((caught.exception.code, caught.exception.text),
                         (NAME_TAKEN, "name alice is taken"))

    def test_closed_before_the_answer_is_disconnected(self) -> None:
        d = self.serve(lambda p: p.frame())
        with self.assertRaises(Disconnected):
            Client.connect("alice", d.address, timeout=BOUND)

    def test_no_daemon_is_unreachable(self) -> None:
        missing = Path(tempfile.gettempdir()) / "shoal-py-no-such-dir" / "none.sock"
        with self.assertRaisesRegex(Unreachable, "cannot reach the daemon at .*none.sock"):
            Client.connect("alice", missing)

    def test_bad_requests_are_refused_before_connecting(self) -> None:
        with self.assertRaisesRegex(InvalidRequest, "empty private name"):
            Client.connect("", "/nonexistent.sock")

    def test_tcp_sends_the_token(self) -> None:
        got: list[codec.Connect] = []
        d = self.serve(lambda p: got.append(p.accept_client()), tcp=True)
        Client.connect("remote", tcp=d.address, token="sesame", timeout=BOUND).disconnect()
        self.assertEqual(got, [codec.Connect("remote", "sesame", codec.MEMBERSHIP_DELTAS)])

    def test_every_request_is_one_frame_in_order(self) -> None:
        seen: list[codec.Frame] = []

        def script(peer: Peer) -> None:
            peer.accept_client()
            while (frame := peer.frame()) is not None:
                seen.append(frame)

        d = self.serve(script)
        with Client.connect("alice", d.address, timeout=BOUND) as c:
            c.join("chat")
            c.multicast(Service.SAFE, ["chat", "#bob#h"], b"\x00hi")
            c.multicast("fifo", "chat", bytes(1 << 20))
            c.leave("chat")
        d.finish()
        self.assertEqual(
            seen,
            [
                codec.Join("chat"),
                codec.Multicast(Service.SAFE, ["chat", "#bob#h"], b"\x00hi"),
                codec.Multicast(Service.FIFO, ["chat"], bytes(1 << 20)),
                codec.Leave("chat"),
                codec.Disconnect(),
            ],
        )

    def test_events_arrive_whole_from_any_piece_size(self) -> None:
        frames = [
            codec.Membership("chat", 1 << 16, Reason.JOIN, ["#a#h", "#b#h"]),
            codec.Message("#b#h", Service.AGREED, ["chat"], bytes(range(256)) * 4096),
            codec.Message("#b#h", Service.FIFO, ["chat", "other"], b""),
        ]
        stream = b"".join(codec.encode(f) for f in frames)

        def script(peer: Peer) -> None:
            peer.accept_client()
            head, rest = stream[:300], stream[300:]
            for i in range(len(head)):  # byte by byte
                peer.conn.sendall(head[i : i + 1])
            for i in range(0, len(rest), 7777):
                peer.conn.sendall(rest[i : i + 7777])
            peer.frame()

        d = self.serve(script)
        with Client.connect("alice", d.address, timeout=BOUND) as c:
            got = [c.receive(timeout=BOUND) for _ in frames]
        self.assertEqual(got, frames)
        self.assertIsInstance(got[0], Membership)
        self.assertIsInstance(got[1], Message)

    def test_views_say_who_joined_and_who_left(self) -> None:
        g = "chat"
        views = [
            codec.Membership(g, 1, Reason.JOIN, ["#a#h", "#me#fake"]),
            codec.Membership(g, 2, Reason.JOIN, ["#a#h", "#b#i", "#me#fake"]),
            codec.Membership(g, 3, Reason.DISCONNECT, ["#b#i", "#me#fake"]),
            codec.Membership(g, 4, Reason.NETWORK, ["#me#fake"], transitional=True,
                             quorum=False),
            codec.Membership(g, 5, Reason.NETWORK, ["#b#i", "#c#j", "#me#fake"]),
            codec.Membership(g, 6, Reason.LEAVE, ["#b#i", "#c#j"]),
            codec.Membership(g, 7, Reason.JOIN, ["#b#i", "#me#fake"]),
        ]

        def script(peer: Peer) -> None:
            peer.accept_client()
            peer.send(*views)
            peer.frame()

        d = self.serve(script)
        with Client.connect("me", d.address, timeout=BOUND) as c:
            got = [c.receive(timeout=BOUND) for _ in views]
        changes = [(v.joined, v.left, v.disconnected, v.partitioned) for v in got]
        self.assertEqual(changes, [
            (["#me#fake"], [], [], []),  # the first view: this client joined
            (["#b#i"], [], [], []),
            ([], ["#a#h"], ["#a#h"], []),
            ([], ["#b#i"], [], ["#b#i"]),  # transitional: cut off from #b#i
            (["#b#i", "#c#j"], [], [], []),  # merged: back, and a newcomer
            ([], ["#me#fake"], [], []),  # this client left
            (["#me#fake"], [], [], []),  # and joins afresh
        ])

    def test_membership_deltas_come_out_as_whole_views(self) -> None:
        g = "chat"
        sent = [
            codec.Membership(g, 1, Reason.JOIN, ["#a#h", "#me#fake"]),
            codec.MembershipDelta(g, 2, 1, Reason.JOIN, joined=["#b#i"]),
            codec.MembershipDelta(g, 3, 2, Reason.DISCONNECT, left=["#a#h"]),
            codec.MembershipDelta(g, 4, 3, Reason.LEAVE, left=["#me#fake"]),
            codec.Membership(g, 5, Reason.JOIN, ["#b#i", "#me#fake"]),
            codec.MembershipDelta(g, 7, 6, Reason.JOIN, joined=["#c#j"]),
        ]

        def script(peer: Peer) -> None:
            peer.accept_client()
            peer.send(*sent)
            peer.frame()

        d = self.serve(script)
        with Client.connect("me", d.address, timeout=BOUND) as c:
            got = [c.receive(timeout=BOUND) for _ in sent[:-1]]
            with self.assertRaises(ProtocolError):
                c.receive(timeout=BOUND)
        self.assertEqual([v.members for v in got], [
            ["#a#h", "#me#fake"],
            ["#a#h", "#b#i", "#me#fake"],
            ["#b#i", "#me#fake"],
            ["#b#i"],
            ["#b#i", "#me#fake"],
        ])
        self.assertEqual([v.view_id for v in got], [1, 2, 3, 4, 5])
        changes = [(v.joined, v.left, v.disconnected) for v in got]
        self.assertEqual(changes, [
            (["#me#fake"], [], []),
            (["#b#i"], [], []),
            ([], ["#a#h"], ["#a#h"]),
            ([], ["#me#fake"], []),
            (["#me#fake"], [], []),
        ])

    def test_receive_times_out_with_none_and_keeps_half_a_frame(self) -> None:
        frame = codec.Message("#b#h", Service.FIFO, ["g"], b"later")
        data = codec.encode(frame)
        go = threading.Event()

        def script(peer: Peer) -> None:
            peer.accept_client()
            peer.conn.sendall(data[:9])
            go.wait(BOUND)
            peer.conn.sendall(data[9:])
            peer.frame()

        d = self.serve(script)
        with Client.connect("alice", d.address, timeout=BOUND) as c:
            start = time.monotonic()
            self.assertIsNone(c.receive(timeout=0.2))
            self.assertGreaterEqual(time.monotonic() - start, 0.2)
            self.assertIsNone(c.receive(timeout=0))
            go.set()
            self.assertEqual(c.receive(timeout=BOUND), frame)

    def test_a_daemon_error_raises_and_the_connection_goes_on(self) -> None:
        after = codec.Message("#b#h", Service.FIFO, ["g"], b"still here")

        def script(peer: Peer) -> None:
            peer.accept_client()
            peer.send(codec.ErrorFrame(7, "not a member of nope"), after)
            peer.frame()

        d = self.serve(script)
        with Client.connect("alice", d.address, timeout=BOUND) as c:
            with self.assertRaises(ShoalError) as caught:
                c.receive(timeout=BOUND)
            self.assertEqual(caught.exception.code, BAD_GROUP)
            self.assertEqual(c.receive(timeout=BOUND), after)

    def test_garbage_is_a_protocol_error_and_closes(self) -> None:
        def script(peer: Peer) -> None:
            peer.accept_client()
            peer.conn.sendall(bytes([0, 0, 0, 3, 9, 9, 9]))
            peer.frame()

        d = self.serve(script)
        c = Client.connect("alice", d.address, timeout=BOUND)
        with self.assertRaisesRegex(ProtocolError,
                                    "malformed frame from the daemon: unsupported client-protocol"
                                    " version 9"):
            c.receive(timeout=BOUND)
        with self.assertRaises(Disconnected):
            c.receive(timeout=BOUND)
        c.disconnect()

    def test_an_unexpected_frame_is_a_protocol_error(self) -> None:
        def script(peer: Peer) -> None:
            peer.accept_client()
            peer.send(codec.ConnectOk("#again#h"))
            peer.frame()

        d = self.serve(script)
        with Client.connect("alice", d.address, timeout=BOUND) as c:
            with self.assertRaisesRegex(ProtocolError, "unexpected ConnectOk frame"):
                c.receive(timeout=BOUND)

    def test_eof_and_disconnect_frame_are_disconnected(self) -> None:
        for goodbye in [lambda p: None, lambda p: p.send(codec.Disconnect())]:
            def script(peer: Peer, goodbye=goodbye) -> None:
                peer.accept_client()
                goodbye(peer)

            d = self.serve(script)
            c = Client.connect("alice", d.address, timeout=BOUND)
            with self.assertRaises(Disconnected):
                c.receive(timeout=BOUND)
            c.close()
            self.assertEqual(list(c), [])  # iteration ends at once

    def test_disconnect_reports_an_error_still_pending(self) -> None:
        def script(peer: Peer) -> None:
            peer.accept_client()
            self.assertEqual(peer.frame(), codec.Disconnect())
            peer.send(codec.Message("#b#h", Service.FIFO, ["g"], b"dropped"),
                      codec.ErrorFrame(5, "refused"))

        d = self.serve(script)
        c = Client.connect("alice", d.address, timeout=BOUND)
        with self.assertRaisesRegex(ShoalError, r"refused \(code 5\)"):
            c.disconnect()
        c.disconnect()  # again: nothing

    def test_status_returns_the_reply_text(self) -> None:
        def script(peer: Peer) -> None:
            self.assertEqual(peer.frame(), codec.Status())
            peer.send(codec.StatusReply("node: fake\nclients: 0"))

        d = self.serve(script)
        self.assertEqual(status(d.address), "node: fake\nclients: 0")


    def test_self_discard_and_types_travel_in_the_extended_frames(self) -> None:
        seen: list[codec.Frame] = []

        def script(peer: Peer) -> None:
            peer.accept_client("#alice#n7")
            for _ in range(3):
                seen.append(peer.frame())
            peer.send(codec.Message("#bob#n7", Service.AGREED, ["g"], b"typed", 42))
            seen.append(peer.frame())

        d = self.serve(script)
        c = Client.connect("alice", d.address, timeout=BOUND)
        self.assertEqual((c.name, c.daemon), ("alice", "n7"))
        c.set_self_discard(True)
        c.multicast(Service.AGREED, "g", b"1")
        c.multicast(Service.AGREED, "g", b"2", self_discard=False, mess_type=42)
        c.set_self_discard(False)
        c.multicast(Service.AGREED, "g", b"3")
        got = c.receive(timeout=BOUND)
        self.assertEqual(got, codec.Message("#bob#n7", Service.AGREED, ["g"], b"typed", 42))
        with self.assertRaises(InvalidRequest):
            c.multicast(Service.AGREED, "g", b"x", mess_type=70000)
        c.disconnect()
        d.finish()
        self.assertEqual(
            seen,
            [
                codec.Multicast(Service.AGREED, ["g"], b"1", codec.SELF_DISCARD, 0),
                codec.Multicast(Service.AGREED, ["g"], b"2", 0, 42),
                codec.Multicast(Service.AGREED, ["g"], b"3"),
                codec.Disconnect(),
            ],
        )

    def test_try_multicast_reports_back_pressure_and_loses_nothing(self) -> None:
        go = threading.Event()
        count: list[int] = []
        seen: list[int] = []

        def script(peer: Peer) -> None:
            peer.accept_client()
            go.wait(BOUND)
            for _ in range(count[0]):
                frame = peer.frame()
                assert isinstance(frame, codec.Multicast), frame
                seen.append(int.from_bytes(frame.payload[:8], "big"))
            assert isinstance(peer.frame(), codec.Disconnect)

        d = self.serve(script)
        c = Client.connect("alice", d.address, timeout=BOUND)
        accepted = 0
        while True:
            payload = accepted.to_bytes(8, "big") + bytes(10_000)
            try:
                c.try_multicast(Service.FIFO, "g", payload)
            except WouldBlock:
                break
            accepted += 1
            self.assertLess(accepted, 100_000, "the socket never filled")
        flow = c.flow_control()
        self.assertTrue(flow.blocked)
        self.assertGreater(flow.pending_bytes, 0)
        count.append(accepted)
        go.set()
        c.flush()
        self.assertFalse(c.flow_control().blocked)
        c.disconnect()
        d.finish()
        self.assertEqual(seen, list(range(accepted)))


class Async(unittest.IsolatedAsyncioTestCase):
    def serve(self, script: Script, tcp: bool = False) -> FakeDaemon:
        daemon = FakeDaemon(script, tcp)
        self.addCleanup(daemon.finish)
        return daemon

    async def test_a_batch_arrives_as_consecutive_multicasts(self) -> None:
        payloads = [bytes([i]) * 700 for i in range(40)]
        seen: list[codec.Frame] = []

        def script(peer: Peer) -> None:
            peer.accept_client("#b#h")
            for _ in payloads:
                seen.append(peer.frame())

        d = self.serve(script)
        async with await aio.Client.connect("b", d.address) as c:
            await c.multicast_batch(Service.FIFO, ["g"], payloads)
            with self.assertRaises(InvalidRequest):
                await c.multicast_batch(Service.FIFO, ["g"], [b"x", bytes((1 << 20) + 1)])
        d.finish()
        self.assertEqual(seen, [codec.Multicast(Service.FIFO, ["g"], p) for p in payloads])

    async def test_requests_and_events(self) -> None:
        seen: list[codec.Frame] = []
        event = codec.Membership("chat", 5, Reason.LEAVE, [])
        error = codec.ErrorFrame(7, "not joined")

        def script(peer: Peer) -> None:
            peer.accept_client("#async#h")
            seen.append(peer.frame())
            seen.append(peer.frame())
            peer.conn.sendall(codec.encode(event)[:5])
            time.sleep(0.3)
            peer.conn.sendall(codec.encode(event)[5:] + codec.encode(error))
            seen.append(peer.frame())

        d = self.serve(script)
        async with await aio.Client.connect("async", d.address) as c:
            self.assertEqual(c.private_group, "#async#h")
            await c.join("chat")
            await c.multicast(Service.AGREED, "chat", b"x")
            self.assertIsNone(await c.receive(timeout=0.05))  # half a frame stays
            got = await c.receive(timeout=BOUND)
            self.assertEqual(got, event)
            # A first view without this client: nothing joined or left.
            self.assertEqual((got.joined, got.left), ([], []))
            with self.assertRaises(ShoalError):
                await c.receive(timeout=BOUND)
        self.assertEqual(
            seen,
            [codec.Join("chat"), codec.Multicast(Service.AGREED, ["chat"], b"x"),
             codec.Disconnect()],
        )

    async def test_refused_and_closed(self) -> None:
        d = self.serve(lambda p: (p.frame(), p.send(codec.ErrorFrame(4, "wrong token"))), tcp=True)
        with self.assertRaisesRegex(ShoalError, "wrong token"):
            await aio.Client.connect("x", tcp=d.address, token="bad")

        def script(peer: Peer) -> None:
            peer.accept_client()

        d2 = self.serve(script)
        c = await aio.Client.connect("y", d2.address)
        with self.assertRaises(Disconnected):
            await c.receive(timeout=BOUND)
        await c.close()


class AsyncOptions(unittest.IsolatedAsyncioTestCase):
    async def test_options_and_back_pressure(self) -> None:
        go = threading.Event()
        count: list[int] = []
        seen: list[codec.Frame] = []

        def script(peer: Peer) -> None:
            peer.accept_client("#a#n3")
            seen.append(peer.frame())
            go.wait(BOUND)
            for _ in range(count[0]):
                frame = peer.frame()
                assert isinstance(frame, codec.Multicast), frame
            seen.append(peer.frame())

        d = FakeDaemon(script)
        self.addCleanup(d.finish)
        c = await aio.Client.connect("a", d.address)
        self.assertEqual((c.name, c.daemon), ("a", "n3"))
        await c.multicast(Service.AGREED, "g", b"t", self_discard=True, mess_type=9)
        accepted = 0
        while True:
            try:
                c.try_multicast(Service.FIFO, "g", bytes(10_000))
            except WouldBlock:
                break
            accepted += 1
            self.assertLess(accepted, 100_000, "the buffer never filled")
        self.assertTrue(c.flow_control().blocked)
        count.append(accepted)
        go.set()
        await c.flush()
        self.assertFalse(c.flow_control().blocked)
        await c.disconnect()
        d.finish()
        self.assertEqual(
            seen,
            [
                codec.Multicast(Service.AGREED, ["g"], b"t", codec.SELF_DISCARD, 9),
                codec.Disconnect(),
            ],
        )


class FlowState(unittest.IsolatedAsyncioTestCase):
    """``flow_control_state``: the query, its answer, events kept meanwhile,
    and a query the daemon does not answer in time."""

    @staticmethod
    def script(peer: Peer) -> None:
        peer.accept_client("#a#h")
        assert peer.frame() == codec.FlowQuery(1)
        peer.send(Message("#b#h", Service.AGREED, ["g"], b"before"),
                  codec.FlowState(1, True, 3, 300, 40, 1 << 25))
        assert peer.frame() == codec.FlowQuery(2)
        assert peer.frame() == codec.Join("g")
        peer.send(codec.FlowState(2, True, 0, 0, 0, 1), Message("#b#h", Service.AGREED,
                                                                 ["g"], b"after"))
        assert isinstance(peer.frame(), codec.Disconnect)

    def check_first(self, state) -> None:  # noqa: ANN001
        self.assertEqual(state.client_pending_bytes, 0)
        self.assertIsNotNone(state.daemon)
        flow = state.daemon
        self.assertEqual((flow.accepting, flow.held_messages, flow.held_bytes,
                          flow.queued_bytes, flow.queue_limit), (True, 3, 300, 40, 1 << 25))

    def test_blocking(self) -> None:
        d = FakeDaemon(self.script)
        self.addCleanup(d.finish)
        with Client.connect("a", d.address, timeout=BOUND) as c:
            self.check_first(c.flow_control_state(BOUND))
            self.assertEqual(c.receive(timeout=BOUND).payload, b"before")
            self.assertIsNone(c.flow_control_state(0.05).daemon)
            c.join("g")
            self.assertEqual(c.receive(timeout=BOUND).payload, b"after")

    async def test_asyncio(self) -> None:
        d = FakeDaemon(self.script)
        self.addCleanup(d.finish)
        async with await aio.Client.connect("a", d.address) as c:
            self.check_first(await c.flow_control_state(BOUND))
            self.assertEqual((await c.receive(timeout=BOUND)).payload, b"before")
            self.assertIsNone((await c.flow_control_state(0.05)).daemon)
            await c.join("g")
            self.assertEqual((await c.receive(timeout=BOUND)).payload, b"after")


class GroupMembers(unittest.IsolatedAsyncioTestCase):
    """``members``: the query, its answer, events kept meanwhile, a query
    the daemon does not answer in time, and names a join refuses."""

    @staticmethod
    def script(peer: Peer) -> None:
        peer.accept_client("#a#h")
        assert peer.frame() == codec.GroupQuery(1, "g")
        peer.send(Message("#b#h", Service.AGREED, ["h"], b"before"),
                  codec.GroupMembers(1, "g", 0, ["#b#h", "#c#k"]))
        assert peer.frame() == codec.GroupQuery(2, "g")
        assert peer.frame() == codec.Join("h")
        peer.send(codec.GroupMembers(2, "g", 0, []),
                  Message("#b#h", Service.AGREED, ["h"], b"after"))
        assert isinstance(peer.frame(), codec.Disconnect)

    def test_blocking(self) -> None:
        d = FakeDaemon(self.script)
        self.addCleanup(d.finish)
        with Client.connect("a", d.address, timeout=BOUND) as c:
            self.assertEqual(c.members("g", BOUND), ["#b#h", "#c#k"])
            self.assertEqual(c.receive(timeout=BOUND).payload, b"before")
            self.assertIsNone(c.members("g", 0.05))
            for bad in ("#b#h", ""):
                with self.assertRaises(InvalidRequest):
                    c.members(bad, BOUND)
            c.join("h")
            self.assertEqual(c.receive(timeout=BOUND).payload, b"after")

    async def test_asyncio(self) -> None:
        d = FakeDaemon(self.script)
        self.addCleanup(d.finish)
        async with await aio.Client.connect("a", d.address) as c:
            self.assertEqual(await c.members("g", BOUND), ["#b#h", "#c#k"])
            self.assertEqual((await c.receive(timeout=BOUND)).payload, b"before")
            self.assertIsNone(await c.members("g", 0.05))
            with self.assertRaises(InvalidRequest):
                await c.members("#b#h", BOUND)
            await c.join("h")
            self.assertEqual((await c.receive(timeout=BOUND)).payload, b"after")


if __name__ == "__main__":
    unittest.main()
