"""How soon a long-poll (`Host.events(after=..., wait=...)`) returns after a new event.

    python bench/host_longpoll.py [--wakes 200] [--sessions 0 100]

A poller waits on one session's events; another task sends that session a message,
while sibling sessions talk to the same model (50 ms per reply) without pause.
Per backend and count of busy sibling sessions, prints median, p99 and max of:
  durable -> returned: from the moment the message's event is durable in SQLite (its
                       append returned) to the moment the long-poll returns it;
  send -> returned:    from `send` to the long-poll returning (adds the actor's work and
                       the SQLite commit).
Figures, not assertions.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from turnkeeper.core import AgentSpec
from turnkeeper.events import Envelope
from turnkeeper.logs import SqliteLog
from turnkeeper.providers import text_response
from turnkeeper.sessions import Host

SPEC = AgentSpec(system_prompt="Answer briefly.")


class TimedLog(SqliteLog):
    """A SqliteLog noting when each event became durable (its append returned)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.durable_at: dict[tuple[str, int], float] = {}

    async def append(self, events: Sequence[Envelope], *, expected_seq: int) -> None:
        await super().append(events, expected_seq=expected_seq)
        now = time.perf_counter()
        for envelope in events:
            self.durable_at[(envelope.session_id, envelope.seq)] = now


async def answer(request: dict[str, Any]) -> dict[str, Any]:
    """A model that takes 50 ms per reply, as a fast remote model would."""
    await anyio.sleep(0.05)
    return text_response("ok")


async def chatter(host: Host, session_id: str, stop: anyio.Event) -> None:
    """A sibling session kept busy, so the log has other appends to group-commit."""
    count = 0
    while not stop.is_set():
        count += 1
        await host.send(session_id, f"busy {count}")
        await host.result(session_id)


async def measure(wakes: int, siblings: int) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as directory:
        log = TimedLog(Path(directory) / "longpoll.db")
        async with log, Host(chat=answer, log=log) as host:
            session_id = await host.start(SPEC, "warm up")
            await host.result(session_id)
            others = [await host.start(SPEC, "warm up") for _ in range(siblings)]
            stop = anyio.Event()
            after_durable: list[float] = []
            after_send: list[float] = []
            async with anyio.create_task_group() as background:
                for other in others:
                    background.start_soon(chatter, host, other, stop)
                for index in range(wakes):
                    last = (await host.status(session_id)).seq
                    returned: list[float] = []

                    async def poll(last: int = last, returned: list[float] = returned) -> None:
                        found = await host.events(session_id, after=last, wait=5)
                        returned.append(time.perf_counter())
                        if not found or found[0].seq != last + 1:
                            raise RuntimeError(f"long-poll returned {found!r:.200} at {last}")

                    async with anyio.create_task_group() as group:
                        group.start_soon(poll)
                        await anyio.sleep(0.002)  # let the poller park
                        sent = time.perf_counter()
                        await host.send(session_id, f"message {index}")
                    await host.result(session_id)
                    # A poller woken for another reason may read the event in the instant
                    # between its commit and the append returning: that counts as 0.
                    durable = log.durable_at[(session_id, last + 1)]
                    after_durable.append(max(0.0, returned[0] - durable))
                    after_send.append(returned[0] - sent)
                stop.set()
    return after_durable, after_send


def summary(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (
        f"median {1000 * statistics.median(ordered):6.2f} ms   "
        f"p99 {1000 * p99:6.2f} ms   max {1000 * ordered[-1]:6.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wakes", type=int, default=200)
    parser.add_argument("--sessions", type=int, nargs="+", default=[0, 100])
    args = parser.parse_args()
    print(f"long-poll wake latency on SqliteLog, {args.wakes} wakes each")
    for backend in ("trio", "asyncio"):
        for siblings in args.sessions:
            durable, sent = anyio.run(measure, args.wakes, siblings, backend=backend)
            print(f"{backend:7} with {siblings:4} busy sibling sessions")
            print(f"  durable -> returned  {summary(durable)}")
            print(f"  send    -> returned  {summary(sent)}")


if __name__ == "__main__":
    main()
