"""The Python client against two real ``shoal daemon`` processes on loopback.

The daemon binary is ``$SHOAL_EXE`` (``cargo test -p shoal --test
python_client`` sets it); without it these tests are skipped, saying so.
The configurations are generated as ``crates/shoal/tests/daemons.rs`` does:
``node``, ``socket``, ``listen`` and ``peers`` on 127.0.0.1, a cluster key,
and nothing else that leaves loopback. The daemons are stopped with SIGTERM
when the tests end, whatever happened. Every wait is bounded by a generous
30 s; nothing depends on this machine's speed but how long a test takes.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shoal_client import (  # noqa: E402
    AUTH,
    BAD_GROUP,
    NAME_TAKEN,
    UNAVAILABLE,
    Client,
    Disconnected,
    Membership,
    Message,
    Reason,
    Service,
    ShoalError,
    Unreachable,
    aio,
    status,
)

PATIENCE = 30.0
KEY = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
TOKEN = "sesame"

Event = Message | Membership


def free_port(kind: int) -> int:
    """A port on 127.0.0.1 free a moment ago (UDP or TCP)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """One ``shoal daemon`` process with its generated configuration."""

    def __init__(self, directory: Path, node: str, listen: int, peers: list[int],
                 tcp: int | None) -> None:
        self.node = node
        self.socket = directory / f"{node}.sock"
        self.config = directory / f"{node}.toml"
        self.log = directory / f"{node}.log"
        self.tcp = tcp
        self.proc: subprocess.Popen[bytes] | None = None
        #: Serving clients: from then on SIGTERM must end it cleanly (before,
        #: its signal handler may not be installed yet).
        self.ready = False
        lines = [
            f'node = "{node}"',
            f'socket = "{self.socket}"',
            f'listen = "127.0.0.1:{listen}"',
            "peers = [%s]" % ", ".join(f'"127.0.0.1:{p}"' for p in peers),
            "",
            "[auth]",
            f'key = "{KEY}"',
            "",
            "[cluster]",
            "found_after = 1000",
            "",
            "[cluster.vsync]",
            "view_period = 2000",
        ]
        if tcp is not None:
            lines += ["", "[tcp]", f'address = "127.0.0.1:{tcp}"', f'token = "{TOKEN}"']
        self.config.write_text("\n".join(lines) + "\n")

    def start(self, exe: str) -> None:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [exe, "daemon", "--log", "warn", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def stop(self) -> int | None:
        """SIGTERM, then the exit status (SIGKILL after PATIENCE: None)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(PATIENCE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


class Cluster:
    """Two daemons on loopback, ``a`` with a TCP listener."""

    def __init__(self, exe: str) -> None:
        self.exe = exe
        self.dir = Path(tempfile.mkdtemp(prefix="shoal-py-it-"))
        ports = [free_port(socket.SOCK_DGRAM) for _ in range(2)]
        self.tcp = free_port(socket.SOCK_STREAM)
        self.a = Daemon(self.dir, "a", ports[0], [ports[1]], self.tcp)
        self.b = Daemon(self.dir, "b", ports[1], [ports[0]], None)
        self.daemons = [self.a, self.b]

    def start(self) -> None:
        for d in self.daemons:
            d.start(self.exe)

    def logs(self) -> str:
        return "\n".join(f"--- daemon {d.node} stderr:\n{d.log_tail()}" for d in self.daemons)

    def stop(self) -> None:
        """Stops every daemon with SIGTERM; fails unless each that served
        clients exited 0."""
        codes = {d.node: d.stop() for d in self.daemons}
        logs = self.logs()
        shutil.rmtree(self.dir, ignore_errors=True)
        unclean = {d.node: codes[d.node] for d in self.daemons if d.ready and codes[d.node] != 0}
        if unclean:
            raise AssertionError(f"daemons did not exit cleanly on SIGTERM: {codes}\n{logs}")


def eventually(what: str, attempt: Callable[[], object], logs: Callable[[], str]) -> object:
    """Calls ``attempt`` every 200 ms until it returns something true, at most
    PATIENCE seconds."""
    deadline = time.monotonic() + PATIENCE
    last: object = None
    while time.monotonic() < deadline:
        last = attempt()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {PATIENCE} s (last: {last!r})\n{logs()}")


def connect(daemon: Daemon, name: str) -> Client:
    """Connects, retrying while the daemon is not ready (no socket yet, or
    UNAVAILABLE while it joins its cluster)."""
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            return Client.connect(name, daemon.socket, timeout=PATIENCE)
        except (Unreachable, Disconnected) as e:
            why: Exception = e
        except ShoalError as e:
            if e.code != UNAVAILABLE:
                raise
            why = e
        if time.monotonic() > deadline:
            raise AssertionError(f"daemon {daemon.node} never accepted {name}: {why}")
        time.sleep(0.2)


def until(client: Client, what: str, done: Callable[[Event], bool]) -> list[Event]:
    """Receives until ``done`` holds for an event; the events received."""
    seen: list[Event] = []
    deadline = time.monotonic() + PATIENCE
    while (left := deadline - time.monotonic()) > 0:
        got = client.receive(timeout=left)
        if got is None:
            break
        seen.append(got)
        if done(got):
            return seen
    raise AssertionError(f"{client.private_group}: no {what} within {PATIENCE} s; saw {seen}")


def view(client: Client, group: str, members: int) -> Membership:
    """The first view of ``group`` with exactly ``members`` members."""
    last = until(client, f"view of {group} with {members} members",
                 lambda e: isinstance(e, Membership) and e.group == group
                 and len(e.members) == members)[-1]
    assert isinstance(last, Membership)
    return last


def messages(client: Client, n: int) -> list[Message]:
    """The next ``n`` messages (views in between are skipped)."""
    got: list[Message] = []

    def collect(e: Event) -> bool:
        if isinstance(e, Message):
            got.append(e)
        return len(got) >= n

    until(client, f"{n} messages", collect)
    return got


_names = itertools.count()


@unittest.skipUnless(os.environ.get("SHOAL_EXE"),
                     "SHOAL_EXE is not set: the path of the shoal binary "
                     "(cargo test -p shoal --test python_client sets it)")
class TwoDaemons(unittest.TestCase):
    cluster: Cluster

    @classmethod
    def setUpClass(cls) -> None:
        exe = os.environ["SHOAL_EXE"]
        if not os.access(exe, os.X_OK):
            raise AssertionError(f"SHOAL_EXE={exe} is not an executable")
        cls.cluster = Cluster(exe)
        cls.addClassCleanup(cls.cluster.stop)
        cls.cluster.start()
        for d in cls.cluster.daemons:
            connect(d, f"probe-{d.node}").disconnect()
            d.ready = True
        # Both daemons in one view (not two clusters founded apart).
        for d in cls.cluster.daemons:
            eventually(f"daemon {d.node} sees both daemons",
                       lambda d=d: _daemons_in_view(d) == 2, cls.cluster.logs)

    def setUp(self) -> None:
        self.n = next(_names)

    def client(self, daemon: Daemon, name: str) -> Client:
        c = connect(daemon, f"{name}{self.n}")
        self.addCleanup(c.close)
        return c

    def pair(self, group: str) -> tuple[Client, Client]:
        """alice on daemon a and bob on daemon b, both in ``group``, each
        having seen the view with both."""
        alice = self.client(self.cluster.a, "alice")
        bob = self.client(self.cluster.b, "bob")
        alice.join(group)
        bob.join(group)
        for c in (alice, bob):
            v = view(c, group, 2)
            self.assertEqual(v.members, sorted([alice.private_group, bob.private_group]))
            self.assertEqual(v.reason, Reason.JOIN)
        return alice, bob

    def test_private_groups_name_the_client_and_its_daemon(self) -> None:
        alice, bob = self.pair(f"names{self.n}")
        self.assertEqual(alice.private_group, f"#alice{self.n}#a")
        self.assertEqual(bob.private_group, f"#bob{self.n}#b")

    def test_fifo_messages_arrive_in_order_at_both_daemons(self) -> None:
        group = f"fifo{self.n}"
        alice, bob = self.pair(group)
        sent = [f"fifo {i}".encode() for i in range(20)]
        for payload in sent:
            alice.multicast(Service.FIFO, group, payload)
        for c in (alice, bob):  # the sender is a member: it gets its own too
            got = messages(c, len(sent))
            self.assertEqual([m.payload for m in got], sent)
            self.assertTrue(all(m.sender == alice.private_group for m in got))
            self.assertTrue(all(m.service == Service.FIFO and m.groups == [group] for m in got))

    def test_self_discard_and_message_types_across_daemons(self) -> None:
        group = f"discard{self.n}"
        alice, bob = self.pair(group)
        # A second connection of alice's application on the same daemon.
        alice2 = self.client(self.cluster.a, "alice2-")
        alice2.join(group)
        for c in (alice, bob, alice2):
            view(c, group, 3)
        self.assertEqual((alice.name, alice.daemon), (f"alice{self.n}", "a"))
        alice.set_self_discard(True)
        alice.multicast(Service.AGREED, group, b"1", mess_type=7)
        alice.multicast(Service.FIFO, group, b"2")
        alice.multicast(Service.AGREED, group, bytes(300_000), mess_type=8)  # fragmented
        alice.multicast(Service.AGREED, group, b"4", self_discard=False, mess_type=9)
        want = [(b"1", 7), (b"2", 0), (bytes(300_000), 8), (b"4", 9)]
        for c in (bob, alice2):
            got = messages(c, 4)
            self.assertEqual([(m.payload, m.mess_type) for m in got], want)
        # The sender gets back only the one it did not discard, then nothing.
        self.assertEqual([(m.payload, m.mess_type) for m in messages(alice, 1)], [(b"4", 9)])
        self.assertIsNone(alice.receive(timeout=0.5))

    def test_an_asyncio_joiner_gets_the_state_of_a_blocking_member(self) -> None:
        from shoal_client.state import StateTransfer, send_pending, send_pending_async

        group = f"state{self.n}"

        class Log:
            def __init__(self) -> None:
                self.entries: list[bytes] = []

            def apply(self, m: Message) -> None:
                self.entries.append(m.payload)

            def view(self, v: Membership) -> None:
                pass

            def snapshot(self) -> bytes:
                return b"\n".join(self.entries)

            def restore(self, data: bytes) -> None:
                self.entries = data.split(b"\n") if data else []

        alice = self.client(self.cluster.a, "alice")
        a_state, a_log = StateTransfer(group, alice.private_group), Log()
        alice.join(group)

        def pump(deadline: float, done: Callable[[], bool]) -> None:
            while not done():
                self.assertLess(time.monotonic(), deadline)
                event = alice.receive(timeout=0.02)
                if event is not None:
                    a_state.handle(a_log, event)
                    send_pending(alice, a_state)

        pump(time.monotonic() + PATIENCE, lambda: a_state.is_ready)
        for i in range(50):
            alice.multicast(Service.AGREED, group, f"before {i}".encode(), mess_type=1)

        async def joiner() -> list[bytes]:
            c = await aio.Client.connect(f"bob{self.n}", self.cluster.b.socket)
            st, log = StateTransfer(group, c.private_group), Log()
            await c.join(group)
            while not (st.is_ready and len(log.entries) >= 100):
                event = await c.receive(timeout=PATIENCE)
                self.assertIsNotNone(event)
                st.handle(log, event)
                await send_pending_async(c, st)
            await c.disconnect()
            return log.entries

        result: list[list[bytes]] = []
        thread = threading.Thread(target=lambda: result.append(asyncio.run(joiner())))
        thread.start()
        # Alice keeps writing (and answering the request) while bob joins.
        for i in range(50):
            alice.multicast(Service.AGREED, group, f"during {i}".encode(), mess_type=1)
            event = alice.receive(timeout=0.01)
            if event is not None:
                a_state.handle(a_log, event)
                send_pending(alice, a_state)
        while thread.is_alive():
            event = alice.receive(timeout=0.02)
            if event is not None:
                a_state.handle(a_log, event)
                send_pending(alice, a_state)
        thread.join()
        want = [f"before {i}".encode() for i in range(50)] + [
            f"during {i}".encode() for i in range(50)]
        self.assertEqual(result, [want])
        self.assertEqual(a_state.provided, 1)

    def test_a_batch_arrives_in_order_at_both_daemons(self) -> None:
        group = f"batch{self.n}"
        alice, bob = self.pair(group)
        sent = [f"batch {i}".encode() * 20 for i in range(200)]
        alice.multicast_batch(Service.FIFO, group, sent)
        for c in (alice, bob):
            self.assertEqual([m.payload for m in messages(c, len(sent))], sent)

    def test_agreed_messages_arrive_in_one_order_everywhere(self) -> None:
        group = f"agreed{self.n}"
        alice, bob = self.pair(group)
        for i in range(10):
            alice.multicast(Service.AGREED, [group], f"a{i}".encode())
            bob.multicast(Service.AGREED, [group], f"b{i}".encode())
        orders = [[m.payload for m in messages(c, 20)] for c in (alice, bob)]
        self.assertEqual(orders[0], orders[1])
        for who in (b"a", b"b"):
            mine = [p for p in orders[0] if p.startswith(who)]
            self.assertEqual(mine, [who + str(i).encode() for i in range(10)])

    def test_safe_messages_arrive_in_order(self) -> None:
        group = f"safe{self.n}"
        alice, bob = self.pair(group)
        sent = [f"safe {i}".encode() for i in range(5)]
        for payload in sent:
            bob.multicast(Service.SAFE, group, payload)
        for c in (alice, bob):
            got = messages(c, len(sent))
            self.assertEqual([m.payload for m in got], sent)
            self.assertTrue(all(m.service == Service.SAFE for m in got))

    def test_a_private_group_reaches_that_client_only(self) -> None:
        group = f"priv{self.n}"
        alice, bob = self.pair(group)
        bob.multicast(Service.FIFO, alice.private_group, b"just for alice")
        bob.multicast(Service.AGREED, group, b"for everyone")
        first, second = messages(alice, 2)
        self.assertEqual(
            (first.payload, first.sender, first.groups),
            (b"just for alice", bob.private_group, [alice.private_group]),
        )
        self.assertEqual(second.payload, b"for everyone")
        # bob's next message is the one ordered after the private one.
        self.assertEqual([m.payload for m in messages(bob, 1)], [b"for everyone"])

    def test_a_leave_is_seen_by_both(self) -> None:
        group = f"leave{self.n}"
        alice, bob = self.pair(group)
        bob.leave(group)
        # The leaver hears the view the others install, without itself.
        gone = view(bob, group, 1)
        self.assertEqual((gone.reason, gone.members), (Reason.LEAVE, [alice.private_group]))
        left = view(alice, group, 1)
        self.assertEqual((left.reason, left.members), (Reason.LEAVE, [alice.private_group]))
        self.assertGreater(left.view_id, 0)
        self.assertEqual(gone.view_id, left.view_id)
        # Who left, as each sees it (the library compares consecutive views).
        self.assertEqual((gone.joined, gone.left), ([], [bob.private_group]))
        self.assertEqual((left.joined, left.left), ([], [bob.private_group]))

    def test_a_disconnect_on_leaving_the_with_block_is_seen(self) -> None:
        group = f"with{self.n}"
        alice = self.client(self.cluster.a, "alice")
        alice.join(group)
        view(alice, group, 1)
        with connect(self.cluster.b, f"carol{self.n}") as carol:
            carol.join(group)
            view(carol, group, 2)
        v = view(alice, group, 1)
        self.assertEqual((v.reason, v.members), (Reason.DISCONNECT, [alice.private_group]))
        self.assertEqual(v.disconnected, [f"#carol{self.n}#b"])
        self.assertEqual(v.partitioned, [])

    def test_leaving_a_group_not_joined_raises_and_the_connection_goes_on(self) -> None:
        alice = self.client(self.cluster.a, "alice")
        alice.leave(f"never-joined{self.n}")
        with self.assertRaises(ShoalError) as caught:
            alice.receive(timeout=PATIENCE)
        self.assertEqual(caught.exception.code, BAD_GROUP)
        self.assertTrue(caught.exception.text)
        group = f"after-error{self.n}"
        alice.join(group)
        self.assertEqual(view(alice, group, 1).members, [alice.private_group])

    def test_a_name_taken_on_the_same_daemon_is_refused(self) -> None:
        alice = self.client(self.cluster.a, "dup")
        with self.assertRaises(ShoalError) as caught:
            Client.connect(f"dup{self.n}", self.cluster.a.socket, timeout=PATIENCE)
        self.assertEqual(caught.exception.code, NAME_TAKEN)
        # The same name on the other daemon is another client.
        other = self.client(self.cluster.b, "dup")
        self.assertNotEqual(other.private_group, alice.private_group)

    def test_tcp_needs_the_token(self) -> None:
        address = f"127.0.0.1:{self.cluster.tcp}"
        with self.assertRaises(ShoalError) as caught:
            Client.connect(f"remote{self.n}", tcp=address, token="wrong", timeout=PATIENCE)
        self.assertEqual(caught.exception.code, AUTH)
        with Client.connect(f"remote{self.n}", tcp=address, token=TOKEN,
                            timeout=PATIENCE) as remote:
            self.assertEqual(remote.private_group, f"#remote{self.n}#a")
            group = f"tcp{self.n}"
            remote.join(group)
            view(remote, group, 1)
            remote.multicast(Service.RELIABLE, group, b"over tcp")
            self.assertEqual(messages(remote, 1)[0].payload, b"over tcp")

    def test_status_describes_the_daemon(self) -> None:
        text = status(self.cluster.a.socket, timeout=PATIENCE)
        self.assertTrue(text.startswith("node: a\n"), text)
        self.assertEqual(_daemons_in_view(self.cluster.b), 2)

    def test_flow_control_state_is_answered_by_the_daemon(self) -> None:
        group = f"flow{self.n}"
        alice, bob = self.pair(group)
        for i in range(20):
            alice.multicast(Service.AGREED, group, bytes(1000))
        state = alice.flow_control_state(timeout=PATIENCE)
        self.assertIsNotNone(state.daemon, "the daemon answered")
        self.assertTrue(state.daemon.accepting)
        self.assertEqual(state.daemon.queue_limit, 32 << 20)
        self.assertEqual(state.client_pending_bytes, 0)
        # Bob has not read his copies: they wait in his daemon's queue or
        # his socket; his own query sees what the daemon still holds.
        mine = bob.flow_control_state(timeout=PATIENCE)
        self.assertIsNotNone(mine.daemon)
        self.assertEqual(len(messages(bob, 20)), 20)

    def test_a_client_that_never_joined_sees_the_members_of_a_group(self) -> None:
        group = f"members{self.n}"
        alice, bob = self.pair(group)
        both = sorted([alice.private_group, bob.private_group])
        # Each daemon's table had both when its member heard the view.
        watcher = self.client(self.cluster.b, "watcher")
        self.assertEqual(watcher.members(group, timeout=PATIENCE), both)
        self.assertEqual(watcher.members(f"nobody{self.n}", timeout=PATIENCE), [])

        async def ask() -> list[str] | None:
            c = await aio.Client.connect(f"awatcher{self.n}", self.cluster.a.socket)
            async with c:
                return await c.members(group, timeout=PATIENCE)

        self.assertEqual(asyncio.run(ask()), both)

    def test_the_asyncio_client_talks_to_a_blocking_one(self) -> None:
        group = f"aio{self.n}"
        alice = self.client(self.cluster.a, "alice")
        alice.join(group)
        name = f"async{self.n}"

        async def run() -> list[Event]:
            async with await aio.Client.connect(name, self.cluster.b.socket) as c:
                await c.join(group)
                seen: list[Event] = []
                async with asyncio.timeout(PATIENCE):
                    while True:
                        event = await c.receive()
                        seen.append(event)
                        if isinstance(event, Membership) and len(event.members) == 2:
                            break
                    alice.multicast(Service.CAUSAL, group, b"to async")
                    await c.multicast(Service.AGREED, group, b"from async")
                    while sum(isinstance(e, Message) for e in seen) < 2:
                        seen.append(await c.receive())
                return seen

        seen = asyncio.run(run())
        got = [(m.sender, m.payload) for m in seen if isinstance(m, Message)]
        want = [(f"#{name}#b", b"from async"), (alice.private_group, b"to async")]
        self.assertEqual(sorted(got), sorted(want))
        self.assertEqual(sorted(m.payload for m in messages(alice, 2)),
                         [b"from async", b"to async"])


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class Program:
    """An example program as a process: lines to its stdin, its stdout's
    lines collected by a thread."""

    def __init__(self, daemon: Daemon, *args: str) -> None:
        env = dict(os.environ, SHOAL_SOCKET=str(daemon.socket))
        self.proc = subprocess.Popen(
            [sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=env, text=True, bufsize=1,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait_line(self, start: int, line: str) -> int:
        """Index after the first ``line`` at or after ``start``."""
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            if line in self.lines[start:]:
                return self.lines.index(line, start) + 1
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        err = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
        raise AssertionError(f"no {line!r} in {self.lines[start:]!r}; stderr: {err}")

    def end(self) -> None:
        """Closes stdin; the program must exit 0."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            code = self.proc.wait(PATIENCE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the program did not end") from None
        self._reader.join(PATIENCE)
        err = self.proc.stderr.read() if self.proc.stderr else ""
        if code != 0:
            raise AssertionError(f"exit {code}: {err}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass


@unittest.skipUnless(os.environ.get("SHOAL_EXE"),
                     "SHOAL_EXE is not set: the path of the shoal binary "
                     "(cargo test -p shoal --test python_client sets it)")
class Examples(unittest.TestCase):
    """python/examples run as processes against the two daemons."""

    cluster: Cluster

    @classmethod
    def setUpClass(cls) -> None:
        cls.cluster = Cluster(os.environ["SHOAL_EXE"])
        cls.addClassCleanup(cls.cluster.stop)
        cls.cluster.start()
        for d in cls.cluster.daemons:
            connect(d, f"probe-{d.node}").disconnect()
            d.ready = True
        for d in cls.cluster.daemons:
            eventually(f"daemon {d.node} sees both daemons",
                       lambda d=d: _daemons_in_view(d) == 2, cls.cluster.logs)

    def program(self, daemon: Daemon, *args: str) -> Program:
        p = Program(daemon, *args)
        self.addCleanup(p.kill)
        return p

    def dump(self, p: Program) -> dict[str, str]:
        start = len(p.lines)
        p.send("sync")
        at = p.wait_line(start, "synced")
        p.send("dump")
        end = p.wait_line(at, "end")
        return dict(line.split("=", 1) for line in p.lines[at : end - 1])

    def test_kv_replicas_joining_during_load_agree(self) -> None:
        kv = str(EXAMPLES / "kv.py")
        a, b = self.cluster.a, self.cluster.b
        r1 = self.program(a, kv, "pystore", "r1")
        r2 = r3 = None
        for i in range(400):
            r1.send(f"set k{i} v{i}")
            if i % 3 == 0:
                r1.send(f"del k{i // 2}")
            if i == 80:
                r2 = self.program(b, kv, "pystore", "r2")
            if i == 200:
                r3 = self.program(a, kv, "pystore", "r3")
            if i >= 250 and i % 10 == 0:
                r2.send(f"set w{i} from-r2")
                r3.send(f"set w{i} from-r3")
            if i % 10 == 0:
                time.sleep(0.005)
        assert r2 is not None and r3 is not None
        for p in (r1, r2, r3):
            self.dump(p)
        maps = [self.dump(p) for p in (r1, r2, r3)]
        self.assertEqual(maps[0], maps[1])
        self.assertEqual(maps[0], maps[2])
        want: dict[str, str] = {}
        for i in range(400):
            want[f"k{i}"] = f"v{i}"
            if i % 3 == 0:
                want.pop(f"k{i // 2}", None)
        self.assertEqual({k: v for k, v in maps[0].items() if k.startswith("k")}, want)
        self.assertEqual(len([k for k in maps[0] if k.startswith("w")]), 15)
        for p in (r1, r2, r3):
            p.end()

    def test_workq_does_each_job_once_while_workers_join_and_leave(self) -> None:
        wq = str(EXAMPLES / "workq.py")
        a, b = self.cluster.a, self.cluster.b
        w1 = self.program(a, wq, "worker", "pyjobs", "w1")
        w2 = self.program(b, wq, "worker", "pyjobs", "w2")
        for w in (w1, w2):
            w.wait_line(0, "ready")
        boss = self.program(a, wq, "submit", "pyjobs", "boss")
        w3 = None
        for i in range(200):
            boss.send(f"job-{i}")
            if i == 60:
                w3 = self.program(b, wq, "worker", "pyjobs", "w3")
                w3.wait_line(0, "ready")
            if i == 130:
                w1.end()
            if i % 20 == 0:
                time.sleep(0.01)
        boss.end()
        assert w3 is not None
        deadline = time.monotonic() + PATIENCE
        while True:
            did = [line.split(" ")[1] for w in (w1, w2, w3) for line in w.lines
                   if line.startswith("did ")]
            if len(set(did)) == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(len(set(did)), 200)
        self.assertEqual(len(did), 200, "a job done twice")
        self.assertTrue(any(line.startswith("did ") for line in w3.lines))
        for w in (w2, w3):
            w.end()

    def test_chat_lines_reach_the_other_member(self) -> None:
        chat = str(EXAMPLES / "chat.py")
        a, b = self.cluster.a, self.cluster.b
        alice = self.program(a, chat, "pychat", "alice")
        bob = self.program(b, chat, "pychat", "bob")
        for p in (alice, bob):
            deadline = time.monotonic() + PATIENCE
            while not any("#alice#a" in l and "#bob#b" in l for l in p.lines):
                self.assertLess(time.monotonic(), deadline, p.lines)
                time.sleep(0.02)
        alice.send("hello from alice")
        bob.wait_line(0, "#alice#a: hello from alice")
        alice.wait_line(0, "#alice#a: hello from alice")
        alice.end()
        bob.end()


def _daemons_in_view(daemon: Daemon) -> int:
    """How many daemons ``daemon`` lists in its view (its status text)."""
    try:
        text = status(daemon.socket, timeout=PATIENCE)
    except (Unreachable, Disconnected, ShoalError):
        return 0
    for line in text.splitlines():
        if line.startswith("daemons in view:"):
            listed = line.split(":", 1)[1].strip()
            return len([d for d in listed.split(",") if d.strip()])
    return 0


if __name__ == "__main__":
    unittest.main()
