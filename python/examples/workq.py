#!/usr/bin/env python3
"""A work queue: submitters multicast jobs to a group of workers, and each
job is done by one worker, as in ``crates/shoal-client/examples/workq.rs``
(same messages: the two interoperate).

    shoal daemon &
    python3 python/examples/workq.py worker jobs w1     # workers
    python3 python/examples/workq.py worker jobs w2
    python3 python/examples/workq.py submit jobs boss   # one job a line on stdin

Jobs, completions and the workers' views are all in the group's agreed
order, so every worker computes the same assignment: a job goes to the
member a hash (FNV-1a) of its id picks among the group's members at that
point of the order. When a worker leaves, the jobs it had not reported done
go to the workers that remain; a worker that joins later gets the jobs not
yet done by state transfer. A worker prints ``ready`` once it holds the
list, then ``did ID PAYLOAD`` per job, and runs until stdin ends. A worker
that fails after doing a job and before its completion is ordered leaves
that job to be done again (at least once).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from shoal_client import Client, Membership, Message, Service  # noqa: E402
from shoal_client.state import StateTransfer, send_pending  # noqa: E402

JOB, DONE = 1, 2


def fnv1a(text: str) -> int:
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) % (1 << 64)
    return h


class Queue:
    """The jobs not done yet, and whose each is (a ``Replica``)."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.members: list[str] = []
        self.pending: dict[str, tuple[str, str]] = {}
        self.todo: list[tuple[str, str]] = []

    def give(self, job: str, payload: str) -> None:
        worker = self.members[fnv1a(job) % len(self.members)] if self.members else ""
        if worker == self.me:
            self.todo.append((job, payload))
        self.pending[job] = (worker, payload)

    def apply(self, m: Message) -> None:
        text = m.payload.decode(errors="replace")
        if m.mess_type == JOB:
            job, _, payload = text.partition(" ")
            self.give(job, payload)
        elif m.mess_type == DONE:
            self.pending.pop(text, None)

    def view(self, v: Membership) -> None:
        self.members = list(v.members)
        for job, (worker, payload) in sorted(self.pending.items()):
            if worker not in self.members:
                self.give(job, payload)

    def snapshot(self) -> bytes:
        return "".join(f"{j}\t{w}\t{p}\n" for j, (w, p) in sorted(self.pending.items())).encode()

    def restore(self, data: bytes) -> None:
        self.pending.clear()
        for line in data.decode(errors="replace").splitlines():
            job, worker, payload = line.split("\t", 2)
            if worker == self.me:
                self.todo.append((job, payload))
            self.pending[job] = (worker, payload)


def work(group: str, name: str) -> int:
    done = threading.Event()

    def read_stdin() -> None:
        for _ in sys.stdin:
            pass
        done.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    client = Client.connect(name, os.environ.get("SHOAL_SOCKET"), timeout=30)
    state = StateTransfer(group, client.private_group)
    jobs = Queue(client.private_group)
    client.join(group)
    said_ready = False
    while not done.is_set():
        event = client.receive(timeout=0.02)
        if event is not None:
            state.handle(jobs, event)
            send_pending(client, state)
        if state.is_ready and not said_ready:
            said_ready = True
            print("ready", flush=True)
        todo, jobs.todo = jobs.todo, []
        for job, payload in todo:
            print(f"did {job} {payload}", flush=True)
            client.multicast(Service.AGREED, group, job.encode(), mess_type=DONE)
    client.disconnect()
    return 0


def submit(group: str, name: str) -> int:
    with Client.connect(name, os.environ.get("SHOAL_SOCKET"), timeout=30) as client:
        for seq, line in enumerate(sys.stdin):
            payload = f"{client.private_group}/{seq} {line.rstrip()}".encode()
            client.multicast(Service.AGREED, group, payload, mess_type=JOB)
    return 0


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] not in ("worker", "submit"):
        print("usage: workq.py worker|submit GROUP NAME", file=sys.stderr)
        return 2
    role, group, name = sys.argv[1:]
    return work(group, name) if role == "worker" else submit(group, name)


if __name__ == "__main__":
    sys.exit(main())
