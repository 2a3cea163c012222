"""The Python client against two ``shoal site`` daemons (Spread's sites) on
loopback: each site has one daemon, whose ``--socket`` serves the same
client protocol as ``shoal daemon``. The binary is ``$SHOAL_EXE`` (``cargo
test -p shoal --test python_client`` sets it); without it the test is
skipped, saying so. The daemons stop on their own (``--run-for``) and are
killed when the test ends, whatever happened.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shoal_client import Client, Membership, Message, Service, ShoalError, Unreachable  # noqa: E402

PATIENCE = 30.0


def free_udp() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipUnless(os.environ.get("SHOAL_EXE"), "SHOAL_EXE is not set")
class TwoSites(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="shoal-py-sites-")
        d = Path(self.dir.name)
        config = d / "sites.toml"
        config.write_text(
            f'[[site]]\nname = "a"\ndaemons = [{{ id = 0, addr = "127.0.0.1:{free_udp()}" }}]\n\n'
            f'[[site]]\nname = "b"\ndaemons = [{{ id = 1, addr = "127.0.0.1:{free_udp()}" }}]\n\n'
            '[[link]]\na = "a"\nb = "b"\nweight = 1\n'
        )
        self.sockets = [d / f"d{i}.sock" for i in range(2)]
        self.procs = [
            subprocess.Popen(
                [os.environ["SHOAL_EXE"], "site", "--config", str(config), "--id", str(i),
                 "--socket", str(self.sockets[i]), "--run-for", "60"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for i in range(2)
        ]

    def tearDown(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.dir.cleanup()

    def connect(self, i: int, name: str) -> Client:
        deadline = time.monotonic() + PATIENCE
        while True:
            try:
                return Client.connect(name, self.sockets[i], timeout=5.0)
            except (ShoalError, Unreachable, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def until(self, c: Client, done) -> list:
        got = []
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            e = c.receive(timeout=0.1)
            if e is not None:
                got.append(e)
                if done(e):
                    return got
        self.fail(f"waited {PATIENCE} s; got {got}")

    def test_join_multicast_and_views_across_sites(self) -> None:
        a, b = self.connect(0, "py"), self.connect(1, "py")
        self.assertEqual([a.private_group, b.private_group], ["#py#d0", "#py#d1"])
        for c in (a, b):
            c.join("g")
        for c in (a, b):
            self.until(c, lambda e: isinstance(e, Membership) and len(e.members) == 2)
        a.multicast(Service.AGREED, ["g"], b"from a")
        b.multicast(Service.SAFE, ["g"], b"from b")
        orders = []
        for c in (a, b):
            got: list = []
            while len(got) < 2:
                e = self.until(c, lambda e: isinstance(e, Message))[-1]
                got.append((e.sender, e.payload))
            orders.append(got)
        self.assertEqual(orders[0], orders[1], "one total order")
        self.assertEqual(sorted(p for _, p in orders[0]), [b"from a", b"from b"])
        b.leave("g")
        v = self.until(a, lambda e: isinstance(e, Membership) and len(e.members) == 1)[-1]
        self.assertEqual(v.members, ["#py#d0"])
        a.disconnect()
        b.disconnect()


if __name__ == "__main__":
    unittest.main()
