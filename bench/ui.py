"""The inspector with a large log: the session list's time to first render with 100,000
sessions in a SQLite log, and a session page's with a 2,000-event session.

`turnkeeper ui LOG` serves the log (read-only, in a subprocess); Chromium (Debian's, driven
by Playwright, as the browser tests drive it) opens the pages. A page marks its first
render (`performance.mark`) once its data is in and drawn: the figure is that mark's
time from the start of the navigation (HTML, scripts, the API's answer and drawing the
DOM). "Cold" is the first look at the list after the inspector starts, while it has
not read the log yet (its first answer holds what it read in 0.3 s, and the page reads
on); "indexed" is when the page says the whole log is read; "warm" is a reload after
that. Each warm figure is the median of five loads (min-max after it). The log is
made first (sessions cloned from a few real ones: answered, with a tool round trip,
waiting on a tool, halted by a guard, errored) unless `--log` names one made before.

Run: `python bench/ui.py [--sessions 100000] [--events 2000] [--log PATH]`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import anyio.abc
import httpx
import msgspec
from playwright.sync_api import Page, sync_playwright

from turnkeeper.core import AgentSpec, ToolResult, ToolSpec
from turnkeeper.events import ChatFailed, Envelope, ToolCalled, ToolReturned
from turnkeeper.logs import SqliteLog
from turnkeeper.providers import text_response, tool_response
from turnkeeper.sessions import Resume, UserMessage, begin_poll, emit, end_poll, open_session
from turnkeeper.state import SessionState

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TOKEN = "bench-ui-token"
LONG = "long-session"
RUNS = 5
TARGET_MS = 1000.0
WORKERS = 256
LOOKUP = ToolSpec(
    "lookup",
    "Look a key up.",
    {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
)
SPEC = AgentSpec(system_prompt="Look things up.", tools=(LOOKUP,))


def answered(session_id: str) -> list[Envelope]:
    state = open_session(SPEC, session_id=session_id)
    events, state, _ = begin_poll(state, UserMessage("What is the capital of France?"), now=0.0)
    after, _ = end_poll(state, text_response("Paris.", usage=(52, 3)), now=0.8)
    return events + after


def round_trip(state: SessionState, key: str, at: float) -> tuple[list[Envelope], SessionState]:
    """A model call of `lookup`, run as a Host runs a tool, and its results sent back."""
    events, state = end_poll(state, tool_response(("lookup", {"key": key})), now=at)
    (use,) = state.pending
    called, state = emit(state, ToolCalled(use.id, use.name, use.input), at=at + 0.01)
    returned, state = emit(state, ToolReturned(use.id, key.upper()), at=at + 0.05)
    results = (ToolResult(use.id, key.upper()),)
    begun, state, _ = begin_poll(state, Resume(state.pending, results), now=at + 0.06)
    return [*events, called, returned, *begun], state


def with_a_tool(session_id: str) -> list[Envelope]:
    state = open_session(SPEC, session_id=session_id)
    events, state, _ = begin_poll(state, UserMessage("Look up the order status"), now=0.0)
    trip, state = round_trip(state, "order-1", 0.5)
    after, _ = end_poll(state, text_response("It shipped.", usage=(140, 9)), now=1.4)
    return events + trip + after


def waiting(session_id: str) -> list[Envelope]:
    spec = AgentSpec(system_prompt="Ask.", tools=(ToolSpec("ask_human", "Ask.", {}),))
    state = open_session(spec, session_id=session_id)
    events, state, _ = begin_poll(state, UserMessage("Which invoice?"), now=0.0)
    after, _ = end_poll(state, tool_response(("ask_human", {})), now=0.6)
    return events + after


def halted(session_id: str) -> list[Envelope]:
    state = open_session(SPEC, session_id=session_id)
    events, state, request = begin_poll(state, UserMessage("Find it"), now=0.0)
    at = 0.0
    while request is not None and state.status != "halted":
        at += 0.5
        reply, state = end_poll(state, tool_response(("lookup", {"key": "same"})), now=at)
        events += reply
        if state.status not in ("requires_action", "running"):
            break
        results = tuple(ToolResult(use.id, "SAME") for use in state.pending)
        begun, state, request = begin_poll(state, Resume(state.pending, results), now=at)
        events += begun
    return events


def errored(session_id: str) -> list[Envelope]:
    state = open_session(SPEC, session_id=session_id)
    events, state, _ = begin_poll(state, UserMessage("Summarize the report"), now=0.0)
    failed, _ = emit(state, ChatFailed(error="connection refused", transient=True), at=3.0)
    return [*events, failed]


TEMPLATES = [answered, with_a_tool, answered, with_a_tool, waiting, halted, errored, answered]


def long_session(events: int) -> list[Envelope]:
    """A session of at least `events` events: tool round trips with distinct keys."""
    state = open_session(SPEC, session_id=LONG, max_turns=events)
    log, state, _ = begin_poll(state, UserMessage("Walk every key"), now=0.0)
    at = 0.0
    while len(log) < events:
        at += 0.2
        trip, state = round_trip(state, f"key-{len(log)}", at)
        log += trip
    after, _ = end_poll(state, text_response("Walked them all.", usage=(900, 20)), now=at + 1)
    return log + after


async def make_log(path: Path, sessions: int, events: int) -> None:
    """`sessions` sessions cloned from the templates, their times spread over a day, the
    most recent last; and the long session. Appended concurrently (group commit)."""
    templates = [template(f"t{n}") for n, template in enumerate(TEMPLATES)]
    start = time.time() - 86_400
    step = 86_000 / sessions
    send, receive = anyio.create_memory_object_stream[list[Envelope]](WORKERS * 4)

    async def worker(
        log: SqliteLog, batches: anyio.abc.ObjectReceiveStream[list[Envelope]]
    ) -> None:
        async with batches:
            async for batch in batches:
                await log.append(batch, expected_seq=0)

    async with SqliteLog(path) as log, anyio.create_task_group() as group:
        async with receive:
            for _ in range(WORKERS):
                group.start_soon(worker, log, receive.clone())
        async with send:
            for n in range(sessions):
                kind = n % len(TEMPLATES)
                session_id = f"s{n:06d}-{TEMPLATES[kind].__name__}"
                at = start + n * step
                await send.send(
                    [
                        msgspec.structs.replace(e, session_id=session_id, at=at + e.at)
                        for e in templates[kind]
                    ]
                )
            now = time.time() - 200
            await send.send(
                [msgspec.structs.replace(e, at=now + e.at) for e in long_session(events)]
            )


@contextmanager
def inspector(log: Path) -> Iterator[tuple[str, int]]:
    """`turnkeeper ui LOG` on a free port; its URL and process id."""
    env = {**os.environ, "TURNKEEPER_TOKEN": TOKEN}
    command = [sys.executable, "-m", "turnkeeper.cli", "ui", str(log), "--port", "0"]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        found = re.search(r"on (http://\S+)/ui/", process.stdout.readline())
        assert found, "the inspector did not start"
        yield found[1], process.pid
    finally:
        process.terminate()
        process.wait(timeout=60)
        if process.stdout is not None:
            process.stdout.close()


def mark(page: Page, name: str) -> float:
    """When the page made the mark `name`, in ms from the start of its navigation."""
    # Functions, not strings: the page's policy lets no string be evaluated as script.
    found = "(name) => performance.getEntriesByName(name).length > 0"
    page.wait_for_function(found, arg=name, timeout=120_000)
    value: float = page.evaluate("(name) => performance.getEntriesByName(name)[0].startTime", name)
    return value


def loads(page: Page, url: str, name: str) -> list[float]:
    times = []
    for _ in range(RUNS):
        page.goto(url)
        times.append(mark(page, name))
    return times


def row(what: str, times: list[float]) -> None:
    median = statistics.median(times)
    verdict = "under 1 s" if median < TARGET_MS else "OVER 1 s"
    spread = f"{min(times):.0f}-{max(times):.0f}"
    print(f"{what:<58} {median:>7.0f} ms  ({spread})  {verdict}", flush=True)


def api_ms(client: httpx.Client, path: str) -> float:
    """The median time of the inspector's list request `path`, alone (server side)."""
    times = []
    for _ in range(20):
        started = time.perf_counter()
        client.get(path).raise_for_status()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=2_000)
    parser.add_argument("--log", type=Path, help="a log made by an earlier run (else made now)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        log = args.log or Path(folder) / "ui.sqlite"
        if not log.exists():
            started = time.perf_counter()
            anyio.run(make_log, log, args.sessions, args.events, backend="trio")
            print(f"made {log} in {time.perf_counter() - started:.1f} s", flush=True)
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"{os.cpu_count()} CPUs, load average {load}; Chromium headless, 1360x860")
        with inspector(log) as (url, pid), sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1360, "height": 860})
            list_page = f"{url}/ui/"
            started = time.perf_counter()
            page.goto(f"{list_page}#token={TOKEN}")
            cold = mark(page, "turnkeeper:list-rendered")
            page.wait_for_function(
                "() => !document.getElementById('summary').textContent.includes('reading the log')",
                timeout=600_000,
            )
            indexed = time.perf_counter() - started
            summary = page.locator("#summary").text_content()
            print(f"list: {summary}")
            print(f"{'list, cold (the first look, before the log is read)':<58} {cold:>7.0f} ms")
            print(f"{'list, cold: until the whole log is read':<58} {indexed * 1e3:>7.0f} ms")
            row("list, warm: first page", loads(page, list_page, "turnkeeper:list-rendered"))
            row(
                "list, warm: filtered by a status (halted)",
                loads(page, f"{list_page}?status=halted", "turnkeeper:list-rendered"),
            )
            row(
                "list, warm: searched by id (099)",
                loads(page, f"{list_page}?q=099", "turnkeeper:list-rendered"),
            )
            session = f"{url}/ui/sessions/{LONG}"
            times = loads(page, session, "turnkeeper:session-rendered")
            drawn = page.locator("#timeline > li").count()
            row(f"session page, {drawn:,} events", times)
            browser.close()
            status = Path(f"/proc/{pid}/status").read_text()
            peak = re.search(r"VmHWM:\s+(\d+) kB", status)
            if peak:
                print(f"the inspector's peak RSS: {int(peak[1]) / 1024:.0f} MB")
            with httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
            ) as client:
                print("the list request alone (median of 20):")
                for what, path in [
                    ("first page", "/v1/inspector/sessions?limit=50"),
                    ("a status (halted)", "/v1/inspector/sessions?limit=50&status=halted"),
                    ("a search (099)", "/v1/inspector/sessions?limit=50&search=099"),
                ]:
                    print(f"  {what:<20} {api_ms(client, path):>7.1f} ms")


if __name__ == "__main__":
    main()
