#!/usr/bin/env python3
"""A replicated key-value store: every replica applies the updates in the
group's agreed order; a replica that joins later gets the state from a
member (state transfer, :mod:`shoal_client.state`), then the updates after it.

    shoal daemon &
    python3 python/examples/kv.py store r1      # one terminal
    python3 python/examples/kv.py store r2      # another, any time

Commands on stdin, one a line: ``set KEY VALUE``, ``del KEY``, ``get KEY``
(prints ``KEY=VALUE`` or ``KEY?``), ``dump`` (every pair sorted, then
``end``), ``sync`` (prints ``synced`` once every update this replica sent
before it has been applied here). Commands wait until the replica holds the
state. The same protocol and message types as the Rust example
(``crates/shoal-client/examples/kv.rs``): the two can serve one store. The
daemon's socket is ``$SHOAL_SOCKET`` when set, else the default path.
"""

from __future__ import annotations

import os
import queue
import struct
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from shoal_client import Client, Membership, Message, Service  # noqa: E402
from shoal_client.state import StateTransfer, send_pending  # noqa: E402

SET, DEL, SYNC = 1, 2, 3


class Store:
    """The replicated map (a :class:`shoal_client.state.Replica`)."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.map: dict[str, str] = {}
        self.synced: set[bytes] = set()

    def apply(self, m: Message) -> None:
        text = m.payload.decode(errors="replace")
        if m.mess_type == SET:
            key, _, value = text.partition(" ")
            self.map[key] = value
        elif m.mess_type == DEL:
            self.map.pop(text, None)
        elif m.mess_type == SYNC and m.sender == self.me:
            self.synced.add(m.payload)

    def view(self, v: Membership) -> None:
        pass

    def snapshot(self) -> bytes:
        out = bytearray()
        for k, v in sorted(self.map.items()):
            for s in (k.encode(), v.encode()):
                out += struct.pack(">I", len(s)) + s
        return bytes(out)

    def restore(self, data: bytes) -> None:
        self.map.clear()
        pos, items = 0, []
        while pos + 4 <= len(data):
            (n,) = struct.unpack(">I", data[pos : pos + 4])
            items.append(data[pos + 4 : pos + 4 + n].decode(errors="replace"))
            pos += 4 + n
        for k, v in zip(items[::2], items[1::2]):
            self.map[k] = v


def main() -> int:
    group = sys.argv[1] if len(sys.argv) > 1 else "store"
    name = sys.argv[2] if len(sys.argv) > 2 else f"kv-{os.getpid()}"
    lines: queue.Queue[str | None] = queue.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read_stdin, daemon=True).start()
    client = Client.connect(name, os.environ.get("SHOAL_SOCKET"), timeout=30)
    state = StateTransfer(group, client.private_group)
    store = Store(client.private_group)
    client.join(group)

    def pump() -> None:
        event = client.receive(timeout=0.02)
        if event is not None:
            state.handle(store, event)
            send_pending(client, state)

    waiting: list[str] = []
    open_ = True
    syncs = 0
    while open_ or waiting:
        pump()
        while True:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is None:
                open_ = False
                break
            waiting.append(line)
        if not state.is_ready:
            continue
        for line in waiting:
            cmd, _, rest = line.partition(" ")
            if cmd == "set":
                client.multicast(Service.AGREED, group, rest.encode(), mess_type=SET)
            elif cmd == "del":
                client.multicast(Service.AGREED, group, rest.encode(), mess_type=DEL)
            elif cmd == "get":
                print(f"{rest}={store.map[rest]}" if rest in store.map else f"{rest}?")
            elif cmd == "dump":
                for k in sorted(store.map):
                    print(f"{k}={store.map[k]}")
                print("end")
            elif cmd == "sync":
                syncs += 1
                token = struct.pack(">Q", syncs)
                client.multicast(Service.AGREED, group, token, mess_type=SYNC)
                while token not in store.synced:
                    pump()
                print("synced")
            elif cmd:
                print(f"unknown command {cmd!r}")
            sys.stdout.flush()
        waiting = []
    client.disconnect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
