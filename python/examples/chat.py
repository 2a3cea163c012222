#!/usr/bin/env python3
"""A line chat over a Shoal group: type lines, see everyone's (Ctrl-D ends).

    shoal daemon &
    python3 python/examples/chat.py lobby alice        # one terminal
    python3 python/examples/chat.py lobby bob          # another

The daemon's socket is ``$SHOAL_SOCKET`` when set, else the default path.
One thread reads stdin and multicasts (agreed: everyone sees one order);
the main thread prints what arrives.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from shoal_client import Client, Disconnected, Message, Service, ShoalError  # noqa: E402


def send_lines(client: Client, group: str) -> None:
    """Multicasts each line of stdin, then says goodbye."""
    try:
        for line in sys.stdin:
            client.multicast(Service.AGREED, group, line.rstrip("\n").encode())
    except Disconnected:
        return
    client.disconnect()


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: chat.py GROUP NAME", file=sys.stderr)
        return 2
    group, name = sys.argv[1], sys.argv[2]
    client = Client.connect(name, os.environ.get("SHOAL_SOCKET"))
    print(f"connected as {client.private_group}; Ctrl-D leaves", file=sys.stderr)
    client.join(group)
    threading.Thread(target=send_lines, args=(client, group), daemon=True).start()
    while True:
        try:
            event = client.receive()
        except ShoalError as e:
            print(f"error: {e}", file=sys.stderr)
            continue
        except Disconnected:
            return 0
        if isinstance(event, Message):
            print(f"{event.sender}: {event.payload.decode(errors='replace')}")
        else:
            members = ", ".join(event.members)
            print(f"* {event.group} ({event.reason.name.lower()}): {members}")


if __name__ == "__main__":
    sys.exit(main())
