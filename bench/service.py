"""Sessions through the HTTP API: sessions/s, and requests/s with p50/p99 latency for
create, post message and long-poll, at 1, 50 and 200 concurrent clients.

The server is `turnkeeper.service.serve` in a subprocess (trio, hypercorn, a SQLite log
in a temporary folder, durable appends) on a scripted model that answers at once, so
the figures are the service's own cost. Each client loops for a few seconds: create a
session, long-poll its events until the answer, post a follow-up message, long-poll
until that answer. Figures, not assertions. Run: `python bench/service.py`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx

from turnkeeper.providers import text_response
from turnkeeper.service import Limits, Listening, serve

SECONDS = 5.0
CLIENTS = (1, 50, 200)
TOKEN = "bench-token"


async def scripted(request: dict[str, Any]) -> dict[str, Any]:
    """The model: answers the last user message at once."""
    prompt = next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")
    return text_response(f"ok: {prompt}", usage=(len(prompt), 3))


def run_server(log_path: str) -> None:
    """The server side: serve until signalled, printing the ready line."""

    def ready(listening: Listening) -> None:
        print(json.dumps({"url": listening.url}), flush=True)

    anyio.run(
        partial(
            serve,
            chat=scripted,
            port=0,
            log_path=log_path,
            token=TOKEN,
            limits=Limits(),
            ready=ready,
        ),
        backend="trio",
    )


class Timings:
    """Latencies per operation, and sessions completed."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {"create": [], "message": [], "long-poll": []}
        self.sessions = 0

    async def timed(self, name: str, request: Any) -> httpx.Response:
        started = time.perf_counter()
        response: httpx.Response = await request
        self.seconds[name].append(time.perf_counter() - started)
        response.raise_for_status()
        return response


async def until_answered(client: httpx.AsyncClient, timings: Timings, path: str, after: int) -> int:
    """Long-poll the session's events until a model answer arrives; the last seq."""
    while True:
        response = await timings.timed(
            "long-poll", client.get(path, params={"after": after, "wait": 30})
        )
        page = response.json()
        after = page["next_after"]
        if any(e["event"]["type"] == "local.model_response" for e in page["events"]):
            return after


async def client_loop(client: httpx.AsyncClient, timings: Timings, deadline: float) -> None:
    n = 0
    while time.perf_counter() < deadline:
        n += 1
        created = await timings.timed(
            "create", client.post("/v1/sessions", json={"prompt": f"hello {n}"})
        )
        session_id = created.json()["session_id"]
        events = f"/v1/sessions/{session_id}/events"
        seq = await until_answered(client, timings, events, 0)
        await timings.timed(
            "message",
            client.post(f"/v1/sessions/{session_id}/messages", json={"text": f"again {n}"}),
        )
        await until_answered(client, timings, events, seq)
        timings.sessions += 1


async def measure(url: str, clients: int) -> tuple[float, Timings]:
    timings = Timings()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        limits=limits,
        timeout=120,
    ) as client:
        started = time.perf_counter()
        deadline = started + SECONDS
        async with anyio.create_task_group() as group:
            for _ in range(clients):
                group.start_soon(client_loop, client, timings, deadline)
        return time.perf_counter() - started, timings


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def report(clients: int, elapsed: float, timings: Timings) -> None:
    cells = [f"{clients:>7}", f"{timings.sessions / elapsed:>10.1f}"]
    for name in ("create", "message", "long-poll"):
        seconds = timings.seconds[name]
        cells.append(
            f"{len(seconds) / elapsed:>7.0f} {statistics.median(seconds) * 1e3:>7.1f} "
            f"{percentile(seconds, 0.99) * 1e3:>7.1f}"
        )
    print("  ".join(cells), flush=True)


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        log_path = str(Path(folder) / "bench.sqlite")
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", log_path], stdout=subprocess.PIPE
        )
        try:
            assert server.stdout is not None
            url = json.loads(server.stdout.readline())["url"]
            load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
            print(f"service on {url}, SQLite log (durable appends), scripted model")
            print(f"{os.cpu_count()} CPUs, load average {load} (client and server share them)")
            print(f"each client loops {SECONDS:g} s: create, long-poll, message, long-poll")
            head = ["clients", "sessions/s"] + [
                f"{name:>9} req/s  p50 ms  p99 ms" for name in ("create", "message", "long-poll")
            ]
            print("  ".join(head))
            for clients in CLIENTS:
                elapsed, timings = anyio.run(measure, url, clients, backend="trio")
                report(clients, elapsed, timings)
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        run_server(sys.argv[2])
    else:
        main()
