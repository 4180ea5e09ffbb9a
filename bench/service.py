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
(an httpx client each, as separate orchestrators would be, in a third process) opens its
session's event stream, then posts messages one after another; each delta it reads is
timed against the time in its text. Two kinds of SSE client are measured in turn, each
on sessions of its own: httpx's `stream` read with `aiter_lines`, and a lean one (h11 on
a socket of its own, the frames parsed as the SSE spec says), which costs the clients'
process less CPU on the same 2 cores. Run `python bench/service.py --streaming` for
this part alone.
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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import h11
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
STREAM_CLIENTS = ("httpx", "h11")


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


# One TLS context for every client, as in any process with many clients: each takes tens
# of ms of CPU to make (the CA certificates), which 100 clients starting at once would
# spend in the run's first seconds.
_TLS = httpx.create_ssl_context()


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


class _SseStream:
    """The lean client's stream: a GET over HTTP/1.1 on a connection of its own (h11, the
    HTTP parser under httpx, on an anyio socket, without httpx's layers), its body parsed
    into events as the SSE spec says: lines ending in LF, CRLF or CR, `data` lines joined
    by newlines, comments and other fields skipped, an event with no data not dispatched.
    It works against any HTTP/1.1 server (chunked or not)."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self._stream = stream
        self._connection = h11.Connection(h11.CLIENT)

    @classmethod
    @asynccontextmanager
    async def open(
        cls, url: str, path: str, headers: dict[str, str]
    ) -> AsyncIterator[AsyncIterator[tuple[str, str]]]:
        """Send the GET, read the response's head (a 200 or an error), and give its
        events, each as (event name, data)."""
        base = httpx.URL(url)
        async with await anyio.connect_tcp(base.host, base.port or 80) as stream:
            sse = cls(stream)
            request = h11.Request(
                method="GET",
                target=path,
                headers=[("Host", base.netloc.decode()), *headers.items()],
            )
            sent = sse._connection.send(request) or b""
            await stream.send(sent + (sse._connection.send(h11.EndOfMessage()) or b""))
            head = await sse._next()
            if not isinstance(head, h11.Response) or head.status_code != 200:
                raise RuntimeError(f"GET {path}: {head!r}")
            yield sse._events()

    async def _next(self) -> object:
        """The next h11 event of the response (reading as it needs)."""
        while (event := self._connection.next_event()) is h11.NEED_DATA:
            try:
                self._connection.receive_data(await self._stream.receive())
            except anyio.EndOfStream:
                self._connection.receive_data(b"")
        return event

    async def _events(self) -> AsyncIterator[tuple[str, str]]:
        buffer = b""  # a line not yet ended
        after_cr = False  # the last read ended in CR: the next may begin with its LF
        name, data = "", list[str]()
        while isinstance(body := await self._next(), h11.Data):
            chunk = bytes(body.data)
            if after_cr and chunk.startswith(b"\n"):
                chunk = chunk[1:]
            if not chunk:
                continue
            after_cr = chunk.endswith(b"\r")
            lines = (buffer + chunk).splitlines()
            buffer = b"" if chunk.endswith((b"\n", b"\r")) else lines.pop()
            for line in lines:
                if not line:
                    if data:
                        yield name or "message", "\n".join(data)
                    name, data = "", []
                elif not line.startswith(b":"):
                    field, _, value = line.decode().partition(":")
                    value = value.removeprefix(" ")
                    if field == "event":
                        name = value
                    elif field == "data":
                        data.append(value)


async def _httpx_events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str]]:
    """The httpx client's events, each as (event name, data), from the body's lines."""
    name, data = "", list[str]()
    async for line in lines:
        if not line:
            if data:
                yield name or "message", "\n".join(data)
            name, data = "", []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)


@asynccontextmanager
async def _event_stream(
    kind: str, client: httpx.AsyncClient, url: str, path: str
) -> AsyncIterator[AsyncIterator[tuple[str, str]]]:
    """The session's event stream, open (its response's head read), by the `kind` of
    client: httpx's `stream` with `aiter_lines`, or the lean `_SseStream`."""
    headers = {"Last-Event-ID": "1", "Accept": "text/event-stream"}
    if kind == "httpx":
        async with client.stream("GET", path, headers=headers) as response:
            response.raise_for_status()
            yield _httpx_events(response.aiter_lines())
    else:
        headers["Authorization"] = f"Bearer {TOKEN}"
        async with _SseStream.open(url, path, headers) as events:
            yield events


async def _streaming_client(
    kind: str, url: str, seconds: list[float], started: float, deadline: float
) -> None:
    """One session, a client of its own: its stream open, messages one after another
    until `deadline`, each delta's latency (after the warm-up) added to `seconds`."""
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120, verify=_TLS
    ) as client:
        created = await client.post("/v1/sessions", json={"spec": {"system_prompt": "Stream."}})
        created.raise_for_status()
        path = f"/v1/sessions/{created.json()['session_id']}"
        async with _event_stream(kind, client, url, path + "/events/stream") as events:
            n = 0
            while time.perf_counter() < deadline:
                n += 1
                posted = await client.post(path + "/messages", json={"text": f"more {n}"})
                posted.raise_for_status()
                async for name, data in events:
                    if name == "delta":
                        now = time.monotonic()
                        sent = float(json.loads(data)["text"])
                        if time.perf_counter() - started > STREAM_WARM_UP:
                            seconds.append(now - sent)
                    elif name == "local.model_response":
                        break


async def measure_streaming(kind: str, url: str) -> tuple[float, list[float]]:
    """Every session's client at once, for `STREAM_SECONDS`: the seconds measured after
    the warm-up, and each delta's latency."""
    seconds: list[float] = []
    started = time.perf_counter()
    deadline = started + STREAM_SECONDS
    async with anyio.create_task_group() as group:
        for _ in range(STREAM_SESSIONS):
            group.start_soon(_streaming_client, kind, url, seconds, started, deadline)
    return time.perf_counter() - started - STREAM_WARM_UP, seconds


def _cpu_seconds(pid: int) -> float:
    """The user and system CPU time process `pid` has used (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _contention() -> str:
    """The load average, and the share of time some task waited for a CPU (Linux's
    pressure stall information), where the kernel gives it."""
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    try:
        some = Path("/proc/pressure/cpu").read_text().split()[1].removeprefix("avg10=")
    except (OSError, IndexError):
        return load
    return f"{load}; {some}%"


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
        print()
        print(
            f"streamed replies: {STREAM_SESSIONS} sessions, each reply {STREAM_TOKENS} tokens "
            f"{STREAM_INTERVAL * 1e3:g} ms apart, from a stand-in model server (a process of "
            "its own) through OpenAIChat and the service to SSE clients (a process of their "
            "own), each client kind in turn, on new sessions"
        )
        print(
            f"{'client':<6}  {'deltas/s':>8}  {'p50 ms':>6}  {'p99 ms':>6}  "
            "CPU s: stand-in  service  clients  | CPU us per delta: service  clients  | "
            "load average, CPU pressure (some avg10)"
        )
        for kind in STREAM_CLIENTS:
            contention = _contention()
            before = [_cpu_seconds(stand_in.pid), _cpu_seconds(server.pid), time.process_time()]
            elapsed, seconds = anyio.run(measure_streaming, kind, url, backend="trio")
            after = [_cpu_seconds(stand_in.pid), _cpu_seconds(server.pid), time.process_time()]
            used = [b - a for a, b in zip(before, after, strict=True)]
            p50, p99 = statistics.median(seconds) * 1e3, percentile(seconds, 0.99) * 1e3
            print(
                f"{kind:<6}  {len(seconds) / elapsed:>8.0f}  {p50:>6.1f}  {p99:>6.1f}  "
                f"{used[0]:>15.2f}  {used[1]:>7.2f}  {used[2]:>7.2f}  | "
                f"{used[1] / len(seconds) * 1e6:>24.0f}  {used[2] / len(seconds) * 1e6:>7.0f}  | "
                f"{contention}",
                flush=True,
            )
        print(f"target: p99 under {STREAM_TARGET_MS:g} ms")
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
