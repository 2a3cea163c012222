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
