"""`turnkeeper serve` as a subprocess: what stops it from starting is one line on stderr
and exit code 2, as for the other commands, never a traceback."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest

from tests.service.process import TOKEN
from tests.sessions.test_host_quarantine import KINDS, make_log, sqlite_damage
from turnkeeper.logs import SqliteLog

# Never called: serve fails before any session asks the model anything.
NO_MODEL = "http://127.0.0.1:9/v1"
COMMAND = (sys.executable, "-m", "turnkeeper.cli", "serve", "--base-url", NO_MODEL)


def serve(tmp_path: Path, log: str, port: int = 0) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "TURNKEEPER_TOKEN"}
    return subprocess.run(
        [*COMMAND, "--log", log, "--port", str(port)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def a_log(path: Path) -> None:
    async def make() -> None:
        async with SqliteLog(path):
            pass

    anyio.run(make)


def without_sessions_table(tmp_path: Path) -> str:
    a_log(tmp_path / "log.sqlite")
    with sqlite3.connect(tmp_path / "log.sqlite") as db:
        db.execute("DROP TABLE sessions")
    return "log.sqlite"


def without_events_table(tmp_path: Path) -> str:
    a_log(tmp_path / "log.sqlite")
    with sqlite3.connect(tmp_path / "log.sqlite") as db:
        db.execute("DROP TABLE events")
    return "log.sqlite"


def not_a_database(tmp_path: Path) -> str:
    (tmp_path / "log.sqlite").write_bytes(b"not SQLite at all\n" * 500)
    return "log.sqlite"


def a_directory(tmp_path: Path) -> str:
    (tmp_path / "logs").mkdir()
    return "logs"


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (without_sessions_table, "log.sqlite: no such table: sessions"),
        (without_events_table, "log.sqlite: no such table: events"),
        (not_a_database, "log.sqlite: not a readable SQLite event log"),
        (a_directory, "logs: unable to open database file"),
    ],
)
def test_a_log_serve_cannot_start_on_is_one_line_and_exit_2(
    tmp_path: Path, make: Callable[[Path], str], problem: str
) -> None:
    done = serve(tmp_path, make(tmp_path))
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("turnkeeper: error: ")
    assert problem in line


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve(tmp_path, "log.sqlite", port)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"turnkeeper: error: cannot listen on 127.0.0.1 port {port}: Address already in use\n"
    )
    assert not (tmp_path / "log.sqlite").exists()


def test_serve_starts_on_a_log_with_sessions_it_cannot_rebuild_and_lists_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.sqlite"
    damaged = {f"damaged-{kind}": kind for kind in KINDS}
    anyio.run(make_log, path, [*damaged, "good"])
    for session_id, kind in damaged.items():
        sqlite_damage(kind, session_id)(path)
    env = {**os.environ, "TURNKEEPER_TOKEN": TOKEN}
    with subprocess.Popen(
        [*COMMAND, "--log", str(path), "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            first = process.stdout.readline()
            assert first.startswith("turnkeeper serving on "), first
            url = first.split()[3]
            headers = {"Authorization": f"Bearer {TOKEN}"}
            with httpx.Client(base_url=url.removesuffix("/v1"), headers=headers) as client:
                listed = client.get("/v1/sessions").json()["sessions"]
                metrics = client.get("/v1/metrics").text
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
            assert process.stderr is not None
            stderr = process.stderr.read()
    statuses = {info["session_id"]: info["status"] for info in listed}
    assert statuses == dict.fromkeys(damaged, "unreadable") | {"good": "idle"}
    assert f'turnkeeper_sessions{{status="unreadable"}} {len(damaged)}' in metrics
    assert code == 0, stderr
    assert "Traceback" not in stderr
