"""`turnkeeper ui LOG`, run as a subprocess: it prints the inspector's address (the token in
its fragment when made up there), serves a JsonlLog directory as another log goes on
writing it, a JSON Lines file, a token from --token-file, stops on SIGINT, and refuses
a log that is not there in one line."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx

from tests.cli.test_main import COMMAND, LIMIT, clean_env, cli
from tests.service.test_catalog import append_session
from turnkeeper.logs import JsonlLog, MemoryLog, encode_jsonl

ADDRESS = re.compile(
    r"turnkeeper inspector on (?P<url>http://127\.0\.0\.1:\d+)/ui/(?:#token=(?P<token>\S+))? "
    r"\(read-only; log: (?P<log>.+)\)\n"
)


@contextmanager
def ui(*args: str, cwd: Path) -> Iterator[tuple[subprocess.Popen[str], re.Match[str]]]:
    """`turnkeeper ui ARGS --port 0`, and its address line."""
    process = subprocess.Popen(
        [*COMMAND, "ui", *args, "--port", "0"],
        cwd=cwd,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = ADDRESS.fullmatch(line)
        assert found, line
        yield process, found
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def listed(url: str, token: str) -> list[str]:
    response = httpx.get(
        f"{url}/v1/inspector/sessions", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text
    return [session["session_id"] for session in response.json()["sessions"]]


def write(directory: Path, *session_ids: str) -> None:
    async def append() -> None:
        async with JsonlLog(directory) as log:
            for session_id in session_ids:
                await append_session(log, session_id)

    anyio.run(append)


def test_ui_serves_a_jsonl_directory_as_another_log_writes_it(tmp_path: Path) -> None:
    write(tmp_path / "log", "first")
    with ui("log", cwd=tmp_path) as (process, found):
        assert found["log"] == "log"
        token = found["token"]
        assert token
        url = found["url"]
        assert httpx.get(f"{url}/ui/").status_code == 200
        assert httpx.get(f"{url}/v1/inspector/sessions").status_code == 401
        assert listed(url, token) == ["first"]
        write(tmp_path / "log", "second")
        for _ in range(100):
            if listed(url, token) == ["second", "first"]:
                break
            time.sleep(0.1)
        assert listed(url, token) == ["second", "first"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=LIMIT) == 0
    # Read only: the directory holds the sessions' files as they were written, and no more.
    assert sorted(
        path.name for path in (tmp_path / "log").iterdir() if path.suffix == ".jsonl"
    ) == [
        "first.jsonl",
        "second.jsonl",
    ]


def test_ui_serves_a_json_lines_file_with_a_token_from_a_file(tmp_path: Path) -> None:
    async def export() -> bytes:
        log = MemoryLog()
        await append_session(log, "exported")
        return encode_jsonl(await log.read("exported"))

    (tmp_path / "one.jsonl").write_bytes(anyio.run(export))
    (tmp_path / "token").write_text("file-token-123\n")
    with ui("one.jsonl", "--token-file", "token", cwd=tmp_path) as (process, found):
        assert found["token"] is None
        assert process.stdout is not None
        assert process.stdout.readline() == "token: from --token-file\n"
        assert listed(found["url"], "file-token-123") == ["exported"]
        source = httpx.get(
            f"{found['url']}/v1/inspector/sessions",
            headers={"Authorization": "Bearer file-token-123"},
        ).json()["source"]
        assert source == "JSON Lines file one.jsonl (read once)"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=LIMIT) == 0


def test_ui_refuses_a_log_that_is_not_there_in_one_line(tmp_path: Path) -> None:
    done = cli("ui", "missing.sqlite", "--port", "0", cwd=tmp_path)
    assert done.code == 2
    assert done.err.strip().splitlines() == [
        "turnkeeper: error: missing.sqlite: no log there (a JsonlLog directory or a SQLite file)"
    ]
    assert not (tmp_path / "missing.sqlite").exists()
    usage = cli("ui", cwd=tmp_path)
    assert usage.code == 2
    assert "the following arguments are required: LOG" in usage.err
