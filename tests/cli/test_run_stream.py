"""`turnkeeper run` prints a reply's text as it streams in, as a real subprocess against
the streaming OpenAI-compatible test server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.cli.test_main import COMMAND, LIMIT, chat_server, clean_env
from tests.providers.openai_server import Streamed, completion

ANSWER = "2 + 3 = 5, and that is all there is to it."


def test_run_prints_the_tokens_as_they_come_then_ends_the_line(tmp_path: Path) -> None:
    slow = Streamed(completion(ANSWER), size=3, delay=0.2)
    with chat_server(slow) as server:
        process = subprocess.Popen(
            [*COMMAND, "run", "What is 2+3?", "--base-url", server.base_url],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stderr is not None
        shown = b""
        while b"model: 2 + 3" not in shown:
            piece = os.read(process.stderr.fileno(), 1024)
            assert piece, shown.decode()
            shown += piece
        # The first tokens are on the terminal while the model still writes the rest.
        assert process.poll() is None
        assert ANSWER.encode() not in shown
        out, err = process.communicate(timeout=LIMIT)
    assert process.returncode == 0
    lines = (shown + err).decode().splitlines()
    assert lines[-2:] == ["model: thinking…", f"model: {ANSWER} [5+2 tokens]"]
    assert out.decode() == ANSWER + "\n"
    assert server.received[0].body["stream"] is True


def test_a_retried_stream_starts_a_new_line(tmp_path: Path) -> None:
    reply = completion(ANSWER)
    with chat_server(Streamed(reply, size=3, cut_after=4), Streamed(reply, size=3)) as server:
        done = subprocess.run(
            [*COMMAND, "run", "What is 2+3?", "--base-url", server.base_url],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            timeout=LIMIT,
            check=False,
        )
    assert done.returncode == 0
    lines = done.stderr.decode().splitlines()
    assert lines[-4:-1] == [
        "model: thinking…",
        "model: 2 + 3 = 5 (starting over)",
        f"model: {ANSWER} [5+2 tokens]",
    ]
    assert lines[-1].startswith("retry 1 in ")
    assert "connection failed" in lines[-1]
