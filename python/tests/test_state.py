"""State transfer over a hand-driven total order (as the Rust tests in
``crates/shoal-client/src/state/tests.rs``): every ordered item reaches
every member in one order; what a member sends joins the order's end."""

from __future__ import annotations

import struct
import sys
import unittest
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shoal_client import Membership, Message, Reason, Service  # noqa: E402
from shoal_client.state import StateTransfer, _decode_reply, _encode_reply  # noqa: E402

G = "g"


class Log:
    def __init__(self) -> None:
        self.entries: list[int] = []

    def apply(self, m: Message) -> None:
        self.entries.append(struct.unpack(">I", m.payload[:4])[0])

    def view(self, v: Membership) -> None:
        pass

    def snapshot(self) -> bytes:
        return b"".join(struct.pack(">I", e) for e in self.entries)

    def restore(self, s: bytes) -> None:
        self.entries = [struct.unpack(">I", s[i : i + 4])[0] for i in range(0, len(s), 4)]


def pg(name: str) -> str:
    return f"#{name}#d"


class Bus:
    def __init__(self) -> None:
        self.members: dict[str, tuple[StateTransfer, Log]] = {}
        self.dead: set[str] = set()
        self.group: list[str] = []
        self.current: list[str] = []
        self.order: deque = deque()
        self.view_id = 0

    def join(self, name: str) -> None:
        p = pg(name)
        self.members[p] = (StateTransfer(G, p), Log())
        self.group = sorted(self.group + [p])
        self.order.append(("view", list(self.group)))

    def leave(self, name: str) -> None:
        p = pg(name)
        self.group.remove(p)
        self.dead.add(p)
        self.order.append(("view", list(self.group)))

    def update(self, name: str, value: int) -> None:
        self.order.append(("msg", pg(name), G, 0, struct.pack(">I", value)))

    def step(self) -> bool:
        if not self.order:
            return False
        item = self.order.popleft()
        if item[0] == "view":
            self.view_id += 1
            self.current = item[1]
            event = Membership(G, self.view_id, Reason.JOIN, list(item[1]))
            recipients = list(item[1])
        else:
            _, sender, to, mess_type, payload = item
            event = Message(sender, Service.AGREED, [to], payload, mess_type)
            recipients = list(self.current) if to == G else [to]
        for r in recipients:
            if r in self.dead:
                continue
            st, log = self.members[r]
            assert st.handle(log, event) is None
            while (o := st.poll_send()) is not None:
                for to in o.groups:
                    self.order.append(("msg", r, to, o.mess_type, o.payload))
        return True

    def settle(self) -> None:
        while self.step():
            pass

    def log(self, name: str) -> list[int]:
        return self.members[pg(name)][1].entries

    def ready(self, name: str) -> bool:
        return self.members[pg(name)][0].is_ready


class StateTransferTests(unittest.TestCase):
    def test_joiners_during_updates_end_with_the_founders_state(self) -> None:
        bus = Bus()
        bus.join("a")
        for i in range(5):
            bus.update("a", i)
        bus.settle()
        bus.join("b")
        bus.update("a", 5)
        bus.join("c")
        for i in range(6, 30):
            bus.update("a", i)
            if i % 5 == 0:
                bus.step()
                bus.step()
        bus.update("b", 100)
        bus.settle()
        want = list(range(30)) + [100]
        for n in "abc":
            self.assertTrue(bus.ready(n))
            self.assertEqual(bus.log(n), want)
        self.assertEqual(bus.members[pg("a")][0].provided, 2)

    def test_a_provider_gone_before_answering_is_replaced(self) -> None:
        bus = Bus()
        bus.join("a")
        bus.update("a", 1)
        bus.settle()
        bus.join("b")
        bus.settle()
        bus.update("a", 2)
        bus.join("j")
        while not (bus.order[0][0] == "msg" and bus.order[0][3] == 0xFF00):
            self.assertTrue(bus.step())
        bus.step()
        bus.order = deque(i for i in bus.order if not (i[0] == "msg" and i[1] == pg("a")))
        bus.leave("a")
        bus.update("b", 3)
        bus.settle()
        self.assertTrue(bus.ready("j"))
        self.assertEqual(bus.log("j"), [1, 2, 3])
        self.assertEqual(bus.members[pg("b")][0].provided, 1)

    def test_random_joins_leaves_and_updates_agree(self) -> None:
        for seed in range(1, 60):
            rng = seed

            def nxt(n: int) -> int:
                nonlocal rng
                rng = (rng * 6364136223846793005 + 1442695040888963407) % (1 << 64)
                return (rng >> 33) % n

            bus = Bus()
            bus.join("m0")
            live = ["m0"]
            joined = 1
            value = 0
            for _ in range(300):
                r = nxt(10)
                if r == 0 and len(live) < 6:
                    name = f"m{joined}"
                    joined += 1
                    bus.join(name)
                    live.append(name)
                elif r == 1 and len(live) > 1:
                    bus.leave(live.pop(1 + nxt(len(live) - 1)))
                elif 2 <= r <= 5:
                    who = live[nxt(len(live))]
                    if bus.ready(who):
                        bus.update(who, value)
                        value += 1
                elif r > 5:
                    for _ in range(nxt(4)):
                        bus.step()
            bus.settle()
            for name in live:
                self.assertTrue(bus.ready(name), f"seed {seed}: {name}")
                self.assertEqual(bus.log(name), bus.log("m0"), f"seed {seed}: {name}")

    def test_the_reply_encoding_matches_the_rust_layout(self) -> None:
        data = _encode_reply("g", 7, ["#a#d", "#b#d"], b"state")
        self.assertEqual(
            data,
            b"\x00\x01g" + struct.pack(">QH", 7, 2) + b"\x00\x04#a#d\x00\x04#b#d" + b"state",
        )
        self.assertEqual(_decode_reply(data), ("g", 7, ["#a#d", "#b#d"], b"state"))
        for cut in range(11):
            self.assertIsNone(_decode_reply(data[:cut]))


if __name__ == "__main__":
    unittest.main()
