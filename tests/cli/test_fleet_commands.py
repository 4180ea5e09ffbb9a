"""The command line on a fleet's PostgreSQL database: `serve --log URL` (or
TURNKEEPER_LOG) as a worker, and `sessions`, `replay`, `export`, `check` reading it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from tests.cli.test_ui import listed, ui
from tests.service.server_main import LOOKUP_SPEC, chat, lookup
from turnkeeper.cli import main
from turnkeeper.cli._serve import shown_log
from turnkeeper.logs import PostgresLog
from turnkeeper.sessions import FleetHost

NO_MODEL = "http://127.0.0.1:9/v1"
SERVE = (sys.executable, "-m", "turnkeeper.cli", "serve")
TOKEN = "fleet-cli-token-" + "x" * 20


async def two_sessions(url: str) -> list[str]:
    async with (
        PostgresLog(url, worker_id="maker") as log,
        FleetHost(chat=chat, log=log, tools={"lookup": lookup}) as host,
    ):
        made = [await host.start(LOOKUP_SPEC, prompt) for prompt in ("a", "b")]
        for session_id in made:
            await host.result(session_id, wait=30)
    return made


def test_sessions_replay_export_and_check_read_a_fleets_database(
    postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = anyio.run(two_sessions, postgres_url, backend="trio")
    assert main(["sessions", "--log", postgres_url]) == 0
    listed = capsys.readouterr().out
    assert all(session_id in listed for session_id in made)
    assert main(["replay", postgres_url, "--session", made[0]]) == 0
    assert "answer: A-0 | A-1" in capsys.readouterr().out
    out = tmp_path / "all.jsonl"
    assert main(["export", "--log", postgres_url, "--output", str(out)]) == 0
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert {event["session_id"] for event in exported} == set(made)
    assert main(["check", postgres_url]) == 0
    assert "2 sessions: 2 sound, 0 damaged" in capsys.readouterr().out


def test_serve_is_a_worker_of_the_database_in_turnkeeper_log(postgres_url: str) -> None:
    env = {**os.environ, "TURNKEEPER_LOG": postgres_url, "TURNKEEPER_TOKEN": TOKEN}
    process = subprocess.Popen(
        [*SERVE, "--port", "0", "--base-url", NO_MODEL, "--worker-id", "cli-1", "--lease", "3"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "turnkeeper serving on" in line
        base = line.split()[3]
        metrics = httpx.get(
            base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ).text
        assert "turnkeeper_owned_sessions 0" in metrics
        assert "turnkeeper_takeovers_total 0" in metrics
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        if process.stdout is not None:
            process.stdout.close()


def test_a_urls_password_is_not_printed() -> None:
    shown = shown_log("postgresql://fleet:s3cret@db.internal/turnkeeper")
    assert "s3cret" not in shown
    assert shown == "postgresql://fleet:***@db.internal/turnkeeper"
    assert shown_log("turnkeeper.sqlite") == "turnkeeper.sqlite"


def test_ui_serves_the_inspector_over_a_fleets_database(postgres_url: str, tmp_path: Path) -> None:
    made = anyio.run(two_sessions, postgres_url, backend="trio")
    with ui(postgres_url, cwd=tmp_path) as (_, found):
        assert found["log"] == shown_log(postgres_url)
        assert set(made) <= set(listed(found["url"], found["token"]))
