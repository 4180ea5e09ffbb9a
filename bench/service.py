"""Sessions through the HTTP API: sessions/s, and requests/s with p50/p99 latency for
create, post message and long-poll, at 1, 50 and 200 concurrent clients; then streamed
replies: the time from a token leaving the model server to an SSE client receiving it,
p50/p99, with 100 sessions streaming at once.

The server is `turnkeeper.service.serve` in a subprocess (trio, hypercorn, a SQLite log
in a temporary folder, durable appends) on a scripted model that answers at once, so
the figures are the service's own cost. Each client loops for a few seconds: create a
session, long-poll its events until the answer, post a follow-up message, long-poll
until that answer.

For streaming, the model is a stand-in OpenAI-compatible server in a process of its own,
streaming each reply as `STREAM_TOKENS` chunks (`data: {...}` SSE, one every
`STREAM_INTERVAL` s), each chunk's text the time it was sent (`time.monotonic()`, one
clock for every process on Linux); the service is `turnkeeper serve --base-url` on it, a
second process (OpenAIChat with retries, as deployed). Each of `STREAM_SESSIONS` clients
(httpx, a client each, as separate orchestrators would be) opens its session's event
stream, then posts messages one after another; each delta it reads is timed against the
time in its text. Run `python bench/service.py --streaming` for this part alone.
Figures, not assertions. Run: `python bench/service.py`.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx

from turnkeeper.providers import text_response
from turnkeeper.service import Limits, Listening, serve

SECONDS = 5.0
CLIENTS = (1, 50, 200)
TOKEN = "bench-token"
STREAM_SESSIONS = 100
STREAM_TOKENS = 30
STREAM_INTERVAL = 0.03
STREAM_SECONDS = 10.0
STREAM_WARM_UP = 1.0
STREAM_TARGET_MS = 20.0


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
        stream_main(folder)


# -- streamed replies ------------------------------------------------------------------------


def _sse_chunk(data: str) -> bytes:
    """`data: ...` as one SSE event in one HTTP chunk."""
    event = f"data: {data}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(event), event)


def _piece(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return json.dumps({"id": "chatcmpl-b", "object": "chat.completion.chunk", "choices": [choice]})


async def _stand_in_connection(stream: anyio.abc.ByteStream) -> None:
    """Answer each chat-completions request on the connection with a stream of
    `STREAM_TOKENS` pieces, each the time it is sent."""
    buffer = b""
    async with stream:
        while True:
            try:
                while b"\r\n\r\n" not in buffer:
                    buffer += await stream.receive()
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                found = re.search(rb"content-length: *([0-9]+)", head, re.IGNORECASE)
                length = int(found[1]) if found else 0
                while len(buffer) < length:
                    buffer += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return
            buffer = buffer[length:]
            await stream.send(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + _sse_chunk(_piece({"role": "assistant"}))
            )
            for _ in range(STREAM_TOKENS):
                await anyio.sleep(STREAM_INTERVAL)
                await stream.send(_sse_chunk(_piece({"content": f"{time.monotonic():.6f} "})))
            usage = {"prompt_tokens": 10, "completion_tokens": STREAM_TOKENS}
            ending = json.dumps({"id": "chatcmpl-b", "choices": [], "usage": usage})
            await stream.send(
                _sse_chunk(_piece({}, "stop"))
                + _sse_chunk(ending)
                + _sse_chunk("[DONE]")
                + b"0\r\n\r\n"
            )


def run_stand_in() -> None:
    """The stand-in model server: serve until killed, printing its base URL."""

    async def main() -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        print(json.dumps({"url": f"http://127.0.0.1:{port}/v1"}), flush=True)
        await listener.serve(_stand_in_connection)

    anyio.run(main, backend="trio")


async def _streaming_client(
    url: str, seconds: list[float], started: float, deadline: float
) -> None:
    """One session, a client of its own: its stream open, messages one after another
    until `deadline`, each delta's latency (after the warm-up) added to `seconds`."""
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120
    ) as client:
        created = await client.post("/v1/sessions", json={"spec": {"system_prompt": "Stream."}})
        created.raise_for_status()
        path = f"/v1/sessions/{created.json()['session_id']}"
        async with client.stream(
            "GET", path + "/events/stream", headers={"Last-Event-ID": "1"}
        ) as response:
            lines = response.aiter_lines()
            n = 0
            while time.perf_counter() < deadline:
                n += 1
                posted = await client.post(path + "/messages", json={"text": f"more {n}"})
                posted.raise_for_status()
                event = None
                async for line in lines:
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "delta":
                        now = time.monotonic()
                        sent = float(json.loads(line[6:])["text"])
                        if time.perf_counter() - started > STREAM_WARM_UP:
                            seconds.append(now - sent)
                    elif line.startswith("data: ") and event == "local.model_response":
                        break


async def measure_streaming(url: str) -> tuple[float, list[float]]:
    """Every session's client at once, for `STREAM_SECONDS`: the seconds measured after
    the warm-up, and each delta's latency."""
    seconds: list[float] = []
    started = time.perf_counter()
    deadline = started + STREAM_SECONDS
    async with anyio.create_task_group() as group:
        for _ in range(STREAM_SESSIONS):
            group.start_soon(_streaming_client, url, seconds, started, deadline)
    return time.perf_counter() - started - STREAM_WARM_UP, seconds


def _cpu_seconds(pid: int) -> float:
    """The user and system CPU time process `pid` has used (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stream_main(folder: str) -> None:
    stand_in = subprocess.Popen([sys.executable, __file__, "--stand-in"], stdout=subprocess.PIPE)
    server = None
    try:
        assert stand_in.stdout is not None
        model_url = json.loads(stand_in.stdout.readline())["url"]
        log_path = str(Path(folder) / "stream.sqlite")
        server = subprocess.Popen(
            [
                *(sys.executable, "-m", "turnkeeper.cli", "serve", "--port", "0"),
                *("--log", log_path),
                *("--base-url", model_url, "--model", "stand-in"),
            ],
            stdout=subprocess.PIPE,
            env={**os.environ, "TURNKEEPER_TOKEN": TOKEN},
            text=True,
        )
        assert server.stdout is not None
        # "turnkeeper serving on http://HOST:PORT/v1 (log: ...)"
        url = server.stdout.readline().split()[3].removesuffix("/v1")
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        print()
        print(
            f"streamed replies: {STREAM_SESSIONS} sessions, each reply {STREAM_TOKENS} tokens "
            f"{STREAM_INTERVAL * 1e3:g} ms apart, from a stand-in model server (a process of "
            "its own) through OpenAIChat and the service to httpx SSE clients"
        )
        print(f"load average {load} (the three processes share the CPUs)")
        before = [_cpu_seconds(stand_in.pid), _cpu_seconds(server.pid), time.process_time()]
        elapsed, seconds = anyio.run(measure_streaming, url, backend="trio")
        after = [_cpu_seconds(stand_in.pid), _cpu_seconds(server.pid), time.process_time()]
        p50 = statistics.median(seconds) * 1e3
        p99 = percentile(seconds, 0.99) * 1e3
        print(
            f"token leaves the model server -> SSE client has it: {len(seconds)} deltas "
            f"({len(seconds) / elapsed:.0f}/s), p50 {p50:.1f} ms, p99 {p99:.1f} ms "
            f"(target: p99 under {STREAM_TARGET_MS:g} ms)"
        )
        used = [b - a for a, b in zip(before, after, strict=True)]
        print(
            "CPU seconds over the run: stand-in {:.2f}, service {:.2f}, clients {:.2f}".format(
                *used
            )
        )
    finally:
        for process in (server, stand_in):
            if process is not None:
                process.terminate()
                process.wait(timeout=60)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        run_server(sys.argv[2])
    elif sys.argv[1:2] == ["--stand-in"]:
        run_stand_in()
    elif sys.argv[1:2] == ["--streaming"]:
        with tempfile.TemporaryDirectory() as folder:
            stream_main(folder)
    else:
        main()
