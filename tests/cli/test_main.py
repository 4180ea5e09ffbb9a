"""The `turnkeeper` command, run as a subprocess: run (live, --json, --log, --tools), replay
(plain and under other guards), sessions, export, serve, bad arguments, and the embedded
default model."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import httpx
import msgspec
import pytest

from tests.providers.openai_server import Behaviour, ChatServer, Reply, Stall, serve_chat
from tests.sessions.test_host_quarantine import KINDS, make_log, sqlite_damage
from tests.sessions.test_old_logs import OLD_VALUES, opened_holding
from turnkeeper.core import AgentSpec, Budget, GuardConfig
from turnkeeper.events import (
    AnsweredAfterStop,
    Envelope,
    Halted,
    MessageReceived,
    ModelResponded,
    SessionOpened,
    decode_envelope,
)
from turnkeeper.logs import JsonlLog, SqliteLog, encode_jsonl, read_jsonl
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import run

COMMAND = (sys.executable, "-m", "turnkeeper.cli")
# Every subprocess ends well within this unless something hangs.
LIMIT = 300


class Done(msgspec.Struct, frozen=True):
    code: int
    out: str
    err: str


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without keys or tokens that would change what the command does."""
    hidden = ("TURNKEEPER_API_KEY", "OPENAI_API_KEY", "TURNKEEPER_TOKEN")
    env = {key: value for key, value in os.environ.items() if key not in hidden}
    return {**env, **extra}


def cli(*args: str, cwd: Path) -> Done:
    done = subprocess.run(
        [*COMMAND, *args], cwd=cwd, env=clean_env(), capture_output=True, timeout=LIMIT
    )
    return Done(done.returncode, done.stdout.decode(), done.stderr.decode())


@contextmanager
def chat_server(*script: Behaviour) -> Iterator[ChatServer]:
    """The scripted chat server, run on trio in a thread of its own while the test (and the
    command it starts) go on in this one."""
    with (
        anyio.from_thread.start_blocking_portal("trio") as portal,
        portal.wrap_async_context_manager(serve_chat(*script)) as server,
    ):
        yield server


def reply(response: dict[str, Any]) -> Reply:
    return Reply(body={**response, "usage": {"prompt_tokens": 10, "completion_tokens": 3}})


def calls(server: ChatServer) -> list[list[dict[str, Any]]]:
    """The messages of each request the chat server received."""
    return [request.body["messages"] for request in server.received]


def events_of(jsonl: str) -> list[Envelope]:
    return [decode_envelope(line) for line in jsonl.splitlines()]


ADD = tool_response(("calculator", {"expression": "2+3"}, "call_1"))
ANSWER = text_response("2 + 3 = 5")


# run


def test_run_shows_each_step_live_then_the_answer(tmp_path: Path) -> None:
    with chat_server(reply(ADD), reply(ANSWER)) as server:
        done = cli("run", "What is 2+3?", "--base-url", server.base_url, cwd=tmp_path)
    assert (done.code, done.out) == (0, "2 + 3 = 5\n")
    steps = done.err.splitlines()
    assert steps[0].startswith("session local_")
    assert (
        "tools: calculator, convert_units, count_text, current_time, capital_of, finish"
        in (steps[0])
    )
    assert steps[1:] == [
        "user: What is 2+3?",
        "model: thinking…",
        'model: calls calculator({"expression":"2+3"}) [10+3 tokens]',
        'tool calculator({"expression":"2+3"})',
        "  -> 5",
        "model: thinking…",
        "model: 2 + 3 = 5 [10+3 tokens]",
    ]
    # The example calculator really ran: its answer went back to the model.
    assert calls(server)[1][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}
    assert server.received[0].body["tools"][0]["function"]["name"] == "calculator"


def test_run_json_prints_every_event_as_json_lines(tmp_path: Path) -> None:
    with chat_server(reply(ADD), reply(ANSWER)) as server:
        done = cli(
            "run",
            "What is 2+3?",
            "--base-url",
            server.base_url,
            "--model",
            "tiny-1b",
            "--system",
            "Be exact.",
            "--json",
            cwd=tmp_path,
        )
    assert (done.code, done.err) == (0, "")
    assert server.received[0].body["model"] == "tiny-1b"
    assert calls(server)[0][:2] == [
        {"role": "system", "content": "Be exact."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    events = events_of(done.out)
    assert [envelope.seq for envelope in events] == list(range(1, len(events) + 1))
    assert [envelope.type for envelope in events] == [
        "local.session_opened",
        "local.user_message",
        "local.model_response",
        "local.tool_call",
        "local.tool_result",
        "local.tool_results",
        "local.model_response",
    ]
    last = events[-1].event
    assert isinstance(last, ModelResponded)
    assert last.message == {"role": "assistant", "content": "2 + 3 = 5"}


def test_run_exits_3_when_the_model_fails(tmp_path: Path) -> None:
    refusal = Reply(status=400, body={"error": {"message": "no such model"}})
    with chat_server(refusal) as server:
        done = cli("run", "hi", "--base-url", server.base_url, cwd=tmp_path)
    assert done.code == 3
    assert "model failed: HTTP 400: no such model" in done.err
    assert "halted by runner (chat_error)" in done.err
    assert done.out.startswith("The model failed: HTTP 400: no such model")


def test_run_retries_a_transient_failure_and_shows_the_retry(tmp_path: Path) -> None:
    busy = Reply(status=503, body={"error": {"message": "busy"}}, headers=(("retry-after", "0"),))
    with chat_server(busy, reply(ANSWER)) as server:
        done = cli("run", "hi", "--base-url", server.base_url, cwd=tmp_path)
    assert (done.code, done.out) == (0, "2 + 3 = 5\n")
    assert "retry 1 in " in done.err
    assert "HTTP 503: busy" in done.err
    assert len(server.received) == 2


def test_run_guards_change_only_the_guards_they_name(tmp_path: Path) -> None:
    with chat_server(reply(ADD), reply(ANSWER)) as server:
        done = cli(
            "run",
            "What is 2+3?",
            "--base-url",
            server.base_url,
            "--guards",
            '{"budget": {"max_tokens": 5}}',
            "--json",
            cwd=tmp_path,
        )
    # The spent budget still allows the answer after its stop, tools withdrawn.
    assert done.code == 0
    events = events_of(done.out)
    opened = events[0].event
    assert isinstance(opened, SessionOpened)
    assert opened.guards == GuardConfig(budget=Budget(max_tokens=5))
    last = events[-1].event
    assert last == AnsweredAfterStop(guard="budget", reason="budget_exceeded")
    assert len(server.received) == 2
    assert server.received[1].body["tool_choice"] == "none"
    with chat_server(reply(ADD), reply(ANSWER)) as server:
        off = '{"budget": {"max_tokens": 5, "answer": false}}'
        done = cli(
            "run", "What is 2+3?", "--base-url", server.base_url, "--guards", off, cwd=tmp_path
        )
    assert done.code == 1
    assert "halted by budget (budget_exceeded)" in done.err
    assert len(server.received) == 1


def test_run_exits_1_when_its_timeout_stops_it(tmp_path: Path) -> None:
    with chat_server(Stall()) as server:
        done = cli("run", "hi", "--base-url", server.base_url, "--timeout", "0.5", cwd=tmp_path)
    assert done.code == 1
    assert "halted by runner (timeout)" in done.err
    assert done.out.startswith("I stopped because the run took longer than its 0.5 s timeout.")


def test_ctrl_c_stops_a_run_with_exit_130_and_keeps_its_log(tmp_path: Path) -> None:
    # The second model call hangs; interrupt it.
    out, err = interrupted(tmp_path, "c.jsonl", [reply(ADD), Stall()], lines=7)
    assert (out, err) == ("", "turnkeeper: interrupted\n")
    logged = [envelope.type for envelope in read_jsonl(tmp_path / "c.jsonl").events]
    # The poll the interrupted call was for is logged before the call.
    assert logged[-3:] == ["local.tool_call", "local.tool_result", "local.tool_results"]


def interrupted(
    tmp_path: Path, log: str, replies: list[Behaviour], *, lines: int
) -> tuple[str, str]:
    """Run "What is 2+3?" logging to `log` against a model that gives `replies`, send
    SIGINT once `lines` lines of stderr are out (the last "model: thinking…"), and return
    what the run printed after, once it has exited 130."""
    with chat_server(*replies) as server:
        process = subprocess.Popen(
            [*COMMAND, "run", "What is 2+3?", "--base-url", server.base_url, "--log", log],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        seen = [process.stderr.readline() for _ in range(lines)]
        assert seen[-1] == "model: thinking…\n"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=LIMIT)
    assert process.returncode == 130
    return out, err


@pytest.mark.parametrize("stop", ["timeout", "model failure", "ctrl-c"])
def test_a_run_stopped_in_its_first_model_call_logs_a_session_that_replays(
    tmp_path: Path, stop: str
) -> None:
    log = "first.jsonl"
    if stop == "ctrl-c":
        interrupted(tmp_path, log, [Stall()], lines=3)
    else:
        failing = Reply(status=400, body={"error": {"message": "no such model"}})
        with chat_server(Stall() if stop == "timeout" else failing) as server:
            args = ["--timeout", "0.5"] if stop == "timeout" else []
            done = cli(
                "run",
                "What is 2+3?",
                "--base-url",
                server.base_url,
                "--log",
                log,
                *args,
                cwd=tmp_path,
            )
        assert done.code == (1 if stop == "timeout" else 3)
    logged = [envelope.type for envelope in read_jsonl(tmp_path / log).events]
    assert logged[:2] == ["local.session_opened", "local.user_message"]
    replayed = cli("replay", log, "--guards", "{}", cwd=tmp_path)
    assert replayed.code == 0
    assert "user: What is 2+3?" in replayed.out.splitlines()
    assert replayed.out.splitlines()[-1] == (
        "under the given guards: the same outcome at every poll"
    )


USER_TOOLS = """
from turnkeeper import ToolSpec

async def shout(text: str) -> str:
    return text.upper()

SHOUT = ToolSpec(
    "shout",
    "Upper-case a text.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)
DONE = ToolSpec(
    "done",
    "Finish.",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)
TOOLS = [(SHOUT, shout), DONE]
NOT_ASYNC = [(SHOUT, print)]
TWO_TERMINALS = [DONE, SHOUT]
"""


def test_run_loads_user_tools_and_ends_on_their_terminal_tool(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(USER_TOOLS)
    script = [
        reply(tool_response(("shout", {"text": "hi"}, "call_1"))),
        reply(text_response("I shouted.")),
        reply(tool_response(("done", {"answer": "HI"}, "call_2"))),
    ]
    with chat_server(*script) as server:
        done = cli(
            "run",
            "Shout hi",
            "--base-url",
            server.base_url,
            "--tools",
            "mytools:TOOLS",
            "--require-terminal-tool",
            cwd=tmp_path,
        )
    assert (done.code, done.out) == (0, "HI\n")
    assert "guard terminal: You have not finished. Call `done` now" in done.err
    assert 'finished with done({"answer":"HI"})' in done.err
    assert [tool["function"]["name"] for tool in server.received[0].body["tools"]] == [
        "shout",
        "done",
    ]
    assert calls(server)[1][-1]["content"] == "HI"


# a recorded log: replay, replay under other guards, sessions, export


def same_call(number: int) -> Reply:
    return reply(tool_response(("capital_of", {"country": "France"}, f"call_{number}")))


def record_loop(tmp_path: Path, log: str) -> Done:
    """A model that asks the same thing forever, recorded with loop detection off (and
    without the answer after max_turns' stop)."""
    with chat_server(*[same_call(number) for number in range(1, 11)]) as server:
        return cli(
            "run",
            "What is the capital of France?",
            "--base-url",
            server.base_url,
            "--guards",
            '{"loop": null, "max_turns": {"answer": false}}',
            "--max-turns",
            "5",
            "--log",
            str(tmp_path / log),
            cwd=tmp_path,
        )


@pytest.mark.parametrize("log", ["loop.jsonl", "loop.sqlite"])
def test_a_recorded_loop_replays_and_would_halt_under_other_guards(
    tmp_path: Path, log: str
) -> None:
    done = record_loop(tmp_path, log)
    assert done.code == 1
    assert "halted by max_turns (max_turns_exceeded)" in done.err
    assert done.err.count("guard duplicates: capital_of") == 4
    path = str(tmp_path / log)

    plain = cli("replay", path, cwd=tmp_path)
    assert plain.code == 0
    lines = plain.out.splitlines()
    assert lines[0].startswith("session local_")
    assert "user: What is the capital of France?" in lines
    assert 'assistant: calls capital_of({"country":"France"})' in lines
    assert "tool [call_1]: Paris" in lines
    assert lines[-4].startswith("outcome: halted (max_turns_exceeded) after 5 model calls")
    assert lines[-3:] == [
        "message: Paris",
        "",
        "  I stopped after 5 model calls without finishing.",
    ]

    same = cli("replay", path, "--guards", '{"loop": null}', cwd=tmp_path)
    assert same.code == 0
    assert same.out.splitlines()[-1] == "under the given guards: the same outcome at every poll"

    halting = cli(
        "replay", path, "--guards", '{"loop": {"warnings": 0, "answer": false}}', cwd=tmp_path
    )
    assert halting.code == 1
    assert halting.out.splitlines()[-1] == (
        "under the given guards: would halt at poll 3: going_in_circles "
        "(the log shows: call the model)"
    )

    unchanged = cli("replay", path, "--guards", "{}", cwd=tmp_path)
    assert unchanged.code == 0
    assert unchanged.out.splitlines()[-1].endswith("the same outcome at every poll")

    no_dedup = cli("replay", path, "--guards", '{"duplicates": null}', cwd=tmp_path)
    assert no_dedup.code == 1
    assert no_dedup.out.splitlines()[-1] == (
        "under the given guards: would let the model's reply stand at poll 2 "
        "(the log shows: self-answer the repeated call of capital_of)"
    )

    (tmp_path / "loop-on.json").write_text('{"loop": {}}')
    warning = cli("replay", path, "--guards", str(tmp_path / "loop-on.json"), cwd=tmp_path)
    assert warning.code == 1
    # Loop detection on, its stop answered: the repeat leads to the answer, not a warning.
    assert warning.out.splitlines()[-1] == (
        "under the given guards: would ask for an answer without tools after loop "
        "(going_in_circles) at poll 3 (the log shows: call the model)"
    )


def test_replay_under_guards_names_the_halt_of_a_guard_turned_off(tmp_path: Path) -> None:
    unknown = [reply(tool_response(("no_such_tool", {"x": n}, f"call_{n}"))) for n in (1, 2)]
    with chat_server(*unknown) as server:
        done = cli(
            "run", "Look it up", "--base-url", server.base_url, "--log", "bad.jsonl", cwd=tmp_path
        )
    assert done.code == 1
    assert "halted by repair (bad_tool_calls)" in done.err
    same = cli("replay", "bad.jsonl", "--guards", "{}", cwd=tmp_path)
    assert same.code == 0
    off = cli("replay", "bad.jsonl", "--guards", '{"repair": null}', cwd=tmp_path)
    assert off.code == 1
    assert off.out.splitlines()[-1] == (
        "under the given guards: would let the model's reply stand at poll 2 "
        "(the log shows: halt: bad_tool_calls)"
    )


def test_sessions_lists_and_shows_and_export_writes_jsonl(tmp_path: Path) -> None:
    log = str(tmp_path / "runs.sqlite")
    with chat_server(reply(ADD), reply(ANSWER), reply(text_response("Hello."))) as server:
        first = cli(
            "run", "What is 2+3?", "--base-url", server.base_url, "--log", log, "--json",
            cwd=tmp_path,
        )  # fmt: skip
        second = cli("run", "Hi", "--base-url", server.base_url, "--log", log, cwd=tmp_path)
    assert (first.code, second.code) == (0, 0)
    recorded = events_of(first.out)
    first_id = recorded[0].session_id

    listing = cli("sessions", "--log", log, cwd=tmp_path)
    assert listing.code == 0
    header, *rows = listing.out.splitlines()
    assert header.split() == ["ID", "STATUS", "POLLS", "LAST"]
    assert len(rows) == 2
    assert rows[0].split()[:3] == [first_id, "idle", "2"]
    assert rows[0].endswith("2 + 3 = 5")
    assert rows[1].endswith("Hello.")

    shown = cli("sessions", first_id, "--log", log, cwd=tmp_path)
    assert shown.code == 0
    assert "  user: What is 2+3?" in shown.out.splitlines()
    assert "     4 local.tool_call  tool calculator" in shown.out
    assert shown.out.splitlines()[-1].startswith("     7 local.model_response  model: 2 + 3 = 5")

    # The log holds exactly what the run printed as it happened.
    exported = cli("export", "--log", log, "--session", first_id, cwd=tmp_path)
    assert exported.code == 0
    assert exported.out == first.out

    everything = cli("export", "--log", log, "-o", "all.jsonl", cwd=tmp_path)
    assert (everything.code, everything.out) == (0, "")
    sessions = {envelope.session_id for envelope in read_jsonl(tmp_path / "all.jsonl").events}
    assert len(sessions) == 2
    assert first_id in sessions

    # An exported file is a log in its own right.
    replayed = cli("replay", "all.jsonl", "--session", first_id, cwd=tmp_path)
    assert replayed.code == 0
    assert replayed.out.splitlines()[-1] == "answer: 2 + 3 = 5"
    ambiguous = cli("replay", "all.jsonl", cwd=tmp_path)
    assert ambiguous.code == 2
    assert "holds 2 sessions: pick one with --session ID" in ambiguous.err


async def record_sessions(path: Path, names: Sequence[str]) -> None:
    """One short session per name in the SQLite log at `path`."""
    async with SqliteLog(path) as log:
        for name in names:
            result = await run(AgentSpec(), f"hi {name}", ScriptedChat([text_response("hello")]))
            events = [Envelope(name, e.seq, e.at, e.event) for e in result.events]
            await log.append(events, expected_seq=0)


def test_a_damaged_session_spoils_only_itself_for_the_commands(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    anyio.run(record_sessions, path, ["good", "damaged"])
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("UPDATE events SET body = x'7b' WHERE session_id = 'damaged' AND seq = 2")
    connection.close()
    log = str(path)

    listing = cli("sessions", "--log", log, cwd=tmp_path)
    assert listing.code == 0
    rows = [row.split()[:2] for row in listing.out.splitlines()[1:]]
    assert rows == [["good", "idle"], ["damaged", "unreadable"]]
    for command in (
        ["sessions", "good", "--log", log],
        ["export", "--log", log, "--session", "good"],
        ["replay", log, "--session", "good"],
    ):
        assert cli(*command, cwd=tmp_path).code == 0, command
    for command in (
        ["sessions", "damaged", "--log", log],
        ["export", "--log", log],
        ["replay", log, "--session", "damaged"],
    ):
        done = cli(*command, cwd=tmp_path)
        assert done.code == 2, command
        assert "session damaged seq 2" in done.err, command


def test_reading_an_empty_file_leaves_it_empty(tmp_path: Path) -> None:
    (tmp_path / "empty.db").write_bytes(b"")
    for command in (["sessions", "--log", "empty.db"], ["replay", "empty.db"]):
        done = cli(*command, cwd=tmp_path)
        assert done.code == 2
        assert "empty.db: an empty file, not a log" in done.err
    assert (tmp_path / "empty.db").read_bytes() == b""


@pytest.mark.parametrize("log", ["old.jsonl", "old.sqlite"])
def test_a_log_holding_values_new_input_may_not_still_lists_and_replays(
    tmp_path: Path, log: str
) -> None:
    events = [
        envelope
        for index, (field, value) in enumerate(OLD_VALUES)
        for envelope in (
            opened_holding(field, value, f"old{index}"),
            Envelope(f"old{index}", 2, 2.0, MessageReceived(text="hi")),
        )
    ]
    if log.endswith(".jsonl"):
        (tmp_path / log).write_bytes(encode_jsonl(events))
    else:

        async def write() -> None:
            async with SqliteLog(tmp_path / log) as sqlite:
                for start in range(0, len(events), 2):
                    await sqlite.append(events[start : start + 2], expected_seq=0)

        anyio.run(write)
    listing = cli("sessions", "--log", log, cwd=tmp_path)
    assert listing.code == 0, listing.err
    rows = listing.out.splitlines()[1:]
    assert len(rows) == len(OLD_VALUES)
    assert all(row.split()[1] == "running" for row in rows), listing.out
    for index in range(len(OLD_VALUES)):
        shown = cli("replay", log, "--session", f"old{index}", cwd=tmp_path)
        assert shown.code == 0, shown.err
        assert "user: hi" in shown.out.splitlines()
    # A change to another guard is checked; the logged window stands.
    window = OLD_VALUES.index(("guards.small_model.window_turns", -1))
    other = cli(
        "replay", log, "--session", f"old{window}", "--guards", '{"loop": null}', cwd=tmp_path
    )
    assert other.code == 0, other.err


def test_a_torn_jsonl_log_is_replayed_with_a_warning_and_not_appended_to(
    tmp_path: Path,
) -> None:
    log = tmp_path / "torn.jsonl"
    with chat_server(reply(ANSWER)) as server:
        done = cli("run", "hi", "--base-url", server.base_url, "--log", str(log), cwd=tmp_path)
        assert done.code == 0
        with log.open("ab") as file:
            file.write(b'{"session_id": "local_x", "seq"')
        replayed = cli("replay", str(log), cwd=tmp_path)
        assert replayed.code == 0
        assert "warning: " in replayed.err
        assert "skipped the unfinished last line 4" in replayed.err
        again = cli("run", "hi", "--base-url", server.base_url, "--log", str(log), cwd=tmp_path)
    assert again.code == 2
    assert "line 4 is unfinished" in again.err
    assert len(server.received) == 1


@pytest.mark.parametrize("name", ["runs.sqlite", "runs"])
def test_run_to_a_log_another_writer_holds_fails_before_any_model_call(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    if name == "runs":
        path.mkdir()
    held = JsonlLog(path) if name == "runs" else SqliteLog(path)
    with (
        chat_server(reply(ANSWER)) as server,
        anyio.from_thread.start_blocking_portal("trio") as portal,
        portal.wrap_async_context_manager(held),
    ):
        assert held.writable
        done = cli("run", "hi", "--base-url", server.base_url, "--log", name, cwd=tmp_path)
        assert done.code == 2, done.err
        (line,) = done.err.splitlines()
        assert line.startswith(
            f"turnkeeper: error: --log {name}: this log is not written here: another log "
            "writes it (it holds the writer lock "
        )
        assert line.endswith("); pick another log")
        assert done.out == ""
        assert server.received == []


# serve


def test_serve_prints_its_url_and_token_and_stops_on_sigint(tmp_path: Path) -> None:
    command = [*COMMAND, "serve", "--port", "0", "--log", "s.sqlite"]
    with chat_server() as chat:
        process = subprocess.Popen(
            [*command, "--base-url", chat.base_url],
            cwd=tmp_path,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert process.stdout is not None
            first, second = process.stdout.readline(), process.stdout.readline()
            assert first.startswith("turnkeeper serving on http://127.0.0.1:")
            assert first.endswith("/v1 (log: s.sqlite)\n")
            url = first.split()[3]
            token = second.strip().removeprefix("token: ")
            with httpx.Client() as client:
                health = client.get(f"{url}/healthz")
                refused = client.get(f"{url}/sessions")
                listed = client.get(f"{url}/sessions", headers={"Authorization": f"Bearer {token}"})
            assert health.status_code == 200
            assert refused.status_code == 401
            assert (listed.status_code, listed.json()["sessions"]) == (200, [])
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=LIMIT) == 0
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()
    assert (tmp_path / "s.sqlite").is_file()


# bad arguments

TOOL_SHAPE = "expected a (ToolSpec, async function) pair or a ToolSpec"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "turnkeeper: error: the following arguments are required: COMMAND"),
        (("fly",), "argument COMMAND: invalid choice: 'fly'"),
        (("run",), "turnkeeper run: error: the following arguments are required: prompt"),
        (("run", " "), "argument prompt: expected a prompt, got an empty string"),
        (("run", "hi", "--max-turns", "0"), "argument --max-turns: expected a positive integer"),
        (("run", "hi", "--max-turns", "x"), "argument --max-turns: expected a positive integer"),
        (("run", "hi", "--timeout", "nan"), "argument --timeout: expected a number of seconds"),
        (("run", "hi", "--colour"), "unrecognized arguments: --colour"),
        (("run", "hi", "--tools", "mytools"), "--tools: expected MODULE:OBJECT, got 'mytools'"),
        (("run", "hi", "--tools", "nowhere:X"), "cannot import 'nowhere': ModuleNotFoundError"),
        (("run", "hi", "--tools", "mytools:MISSING"), "'mytools' has no attribute 'MISSING'"),
        (("run", "hi", "--tools", "mytools:SHOUT"), "expected a list of (ToolSpec, async"),
        (("run", "hi", "--tools", "mytools:NOT_ASYNC"), "the function of 'shout' must be async"),
        (("run", "hi", "--tools", "mytools:TWO_TERMINALS"), "a second bare ToolSpec ('shout')"),
        (("run", "hi", "--tools", "os:environ"), "expected a list of (ToolSpec, async"),
        (("run", "hi", "--tools", "mytools:DONE.name"), "expected a list of (ToolSpec, async"),
        (("run", "hi", "--base-url", "ftp://x"), "OpenAIChat"),
        (("run", "hi", "--guards", '{"loops": null}'), "unknown field `$.loops` (expected one"),
        (("run", "hi", "--guards", '{"loop": {"warnings": "2"}}'), "at `$.loop.warnings`"),
        (
            ("run", "hi", "--guards", '{"small_model": {"window_turns": -1}}'),
            "--guards: guards.small_model.window_turns: expected an integer >= 1, got -1",
        ),
        (
            ("replay", "good.jsonl", "--guards", '{"budget": {"max_seconds": 0}}'),
            "--guards: guards.budget.max_seconds: expected a number of seconds over 0 to 1e15",
        ),
        (("run", "hi", "--guards", "{nope"), "--guards: not valid JSON"),
        (("run", "hi", "--guards", "nofile.json"), "neither a JSON object nor a file"),
        (("replay",), "the following arguments are required: LOG"),
        (("replay", "missing.jsonl"), "missing.jsonl: no such log file"),
        (("replay", "bad.jsonl"), "bad.jsonl"),
        (("replay", "good.jsonl", "--session", "local_nope"), "holds no session 'local_nope'"),
        (("replay", "good.jsonl", "--guards", "[]"), "neither a JSON object nor a file"),
        (("sessions",), "the following arguments are required: --log"),
        (("sessions", "--log", "missing.sqlite"), "missing.sqlite: no such log file"),
        (("sessions", "local_nope", "--log", "good.jsonl"), "holds no session 'local_nope'"),
        (("export",), "the following arguments are required: --log"),
        (("export", "--log", "good.jsonl", "--session", "x"), "holds no session 'x'"),
        (("serve", "--port", "70000"), "argument --port: expected a port number"),
        (("serve", "--token-file", "missing"), "missing"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(
    tmp_path: Path, args: Sequence[str], message: str
) -> None:
    (tmp_path / "mytools.py").write_text(USER_TOOLS)
    (tmp_path / "bad.jsonl").write_text("not json\n")
    (tmp_path / "good.jsonl").write_bytes(GOOD_LOG)
    done = cli(*args, cwd=tmp_path)
    assert done.code == 2, done
    assert done.out == ""
    assert len(done.err.splitlines()) == 1, done.err
    assert done.err.startswith("turnkeeper")
    assert message in done.err


NOT_UTF8_GUARDS = b'{"loop": {"x\xff": 1}}'
SOME_URL = b"http://127.0.0.1:9/v1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            (b"serve", b"--port", b"0", b"--base-url", SOME_URL, b"--token-file", b"binary.tok"),
            "--token-file binary.tok: not UTF-8 text",
        ),
        ((b"replay", b"good.jsonl", b"--guards", NOT_UTF8_GUARDS), "--guards: not valid JSON"),
        ((b"run", b"hi", b"--guards", NOT_UTF8_GUARDS), "--guards: not valid JSON: not UTF-8"),
        (
            (b"run", b"hi", b"--base-url", b"http://127.0.0.1:1/\xff", b"--model", b"m"),
            "OpenAIChat: base_url is not a URL: it is not UTF-8 text",
        ),
    ],
)
def test_bytes_that_are_not_utf8_are_one_line_and_exit_2(
    tmp_path: Path, args: tuple[bytes, ...], message: str
) -> None:
    (tmp_path / "binary.tok").write_bytes(b"\xff\xfetoken\n")
    (tmp_path / "good.jsonl").write_bytes(GOOD_LOG)
    done = subprocess.run(
        [*map(os.fsencode, COMMAND), *args],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        timeout=LIMIT,
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert done.stdout == b""
    assert len(err.splitlines()) == 1, err
    assert err.startswith("turnkeeper: error: ")
    assert message in err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["binary.tok", "good.jsonl"]


def test_require_terminal_tool_needs_a_terminal_tool(tmp_path: Path) -> None:
    (tmp_path / "mytools.py").write_text(USER_TOOLS + "\nNO_TERMINAL = [(SHOUT, shout)]\n")
    done = cli(
        "run", "hi", "--tools", "mytools:NO_TERMINAL", "--require-terminal-tool", cwd=tmp_path
    )
    assert done.code == 2
    assert "--require-terminal-tool: the tools have no terminal tool" in done.err


def test_help_lists_the_commands_and_exit_codes(tmp_path: Path) -> None:
    done = cli("--help", cwd=tmp_path)
    assert done.code == 0
    for command in ("run", "replay", "sessions", "export", "serve"):
        assert f"    {command} " in done.out
    assert "2 bad arguments" in " ".join(done.out.split())


GOOD_LOG = encode_jsonl(
    [
        Envelope(
            "local_a",
            1,
            1.0,
            SessionOpened(
                spec=AgentSpec(), history=(), max_turns=5, guards=GuardConfig(), resume=False
            ),
        )
    ]
)


# the embedded default


def test_run_with_no_server_and_no_key_generates_with_the_embedded_model(tmp_path: Path) -> None:
    done = cli("run", "What is 2+3?", "--log", "embedded.jsonl", cwd=tmp_path)
    # A 135M model: an answer (0) or a guard's clean stop (1), never a failure.
    assert done.code in (0, 1), done.err
    assert done.out.strip()
    events = read_jsonl(tmp_path / "embedded.jsonl").events
    opened = events[0].event
    assert isinstance(opened, SessionOpened)
    assert opened.guards.small_model is not None
    responses = [e.event for e in events if isinstance(e.event, ModelResponded)]
    assert responses
    assert all(response.usage.completion_tokens > 0 for response in responses)
    assert "model: thinking…" in done.err
    halts = [e.event for e in events if isinstance(e.event, Halted)]
    assert all(halt.reason != "max_turns_exceeded" for halt in halts)


def test_run_takes_tools_from_an_mcp_server_given_on_the_command_line(tmp_path: Path) -> None:
    server_script = Path(__file__).parents[1] / "tools" / "mcp_server.py"
    echo = tool_response(("echo", {"text": "hi", "times": 2}, "call_1"))
    with chat_server(reply(echo), reply(text_response("hihi"))) as server:
        done = cli(
            "run",
            "Echo hi twice.",
            "--base-url",
            server.base_url,
            "--mcp",
            f"{sys.executable} {server_script}",
            cwd=tmp_path,
        )
    assert (done.code, done.out) == (0, "hihi\n")
    offered = [tool["function"]["name"] for tool in server.received[0].body["tools"]]
    assert "echo" in offered
    assert "calculator" in offered
    assert calls(server)[1][-1]["content"] == "hi hi"


@pytest.mark.parametrize("kind", KINDS)
def test_the_session_list_shows_a_session_damaged_any_way_as_unreadable(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "log.sqlite"
    anyio.run(make_log, path, ["good", "damaged"])
    sqlite_damage(kind)(path)
    listing = cli("sessions", "--log", str(path), cwd=tmp_path)
    assert listing.code == 0, listing.err
    rows = [row.split()[:2] for row in listing.out.splitlines()[1:]]
    assert sorted(rows) == [["damaged", "unreadable"], ["good", "idle"]]


# reading a log: its own files, lost rows, a reader gone


@pytest.mark.parametrize("kind", ["sqlite", "directory", "jsonl file"])
def test_export_refuses_to_write_over_its_own_log(tmp_path: Path, kind: str) -> None:
    log = tmp_path / {"sqlite": "log.sqlite", "directory": "log", "jsonl file": "log.jsonl"}[kind]
    if kind == "jsonl file":
        log.write_bytes(encode_jsonl(anyio.run(session_events, "only")))
    else:
        anyio.run(make_log, log)
    files = {path: path.read_bytes() for path in sorted(tmp_path.rglob("*")) if path.is_file()}
    targets = [log] if kind != "directory" else [log / "order.idx", log / "new.jsonl"]
    if kind == "sqlite":
        targets.append(tmp_path / "log.sqlite-wal")
    for target in targets:
        done = cli("export", "--log", str(log), "-o", str(target), cwd=tmp_path)
        assert done.code == 2, done
        assert done.err == (
            f"turnkeeper: error: --output: {target} is the log {log} or one of its files; "
            "export writes a new file\n"
        )
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == files


def test_a_session_whose_sessions_row_is_gone_is_unreadable_not_left_out(tmp_path: Path) -> None:
    log = tmp_path / "log.sqlite"
    anyio.run(make_log, log)
    with sqlite3.connect(log) as db:
        db.execute("DELETE FROM sessions WHERE session_id = 'damaged'")
    exported = cli("export", "--log", str(log), "-o", "all.jsonl", cwd=tmp_path)
    assert exported.code == 2
    assert "damaged: " in exported.err
    assert "the sessions table does not list it" in exported.err
    assert not (tmp_path / "all.jsonl").exists()
    listing = cli("sessions", "--log", str(log), cwd=tmp_path)
    rows = {line.split()[0]: line.split()[1] for line in listing.out.splitlines()[1:]}
    assert rows["damaged"] == "unreadable"
    assert {status for name, status in rows.items() if name != "damaged"} == {"idle"}


@pytest.mark.parametrize(
    "command",
    [
        ("sessions", "--log", "log.sqlite"),
        ("sessions", "good", "--log", "log.sqlite"),
        ("export", "--log", "log.sqlite", "--session", "good"),
        ("replay", "log.sqlite", "--session", "good"),
    ],
    ids=lambda command: command[0] + (" good" if "good" in command else ""),
)
def test_a_reader_that_stops_reading_ends_the_command_quietly(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    anyio.run(make_log, tmp_path / "log.sqlite")
    reading = subprocess.Popen(
        [*COMMAND, *command], cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert reading.stdout is not None
    assert reading.stderr is not None
    reading.stdout.close()  # as `| head` does once it has its lines
    with reading.stderr:
        err = reading.stderr.read()
    assert (reading.wait(timeout=LIMIT), err) == (141, b"")


async def session_events(session_id: str) -> list[Envelope]:
    chat = ScriptedChat([text_response("Hello.")])
    result = await run(AgentSpec(), "Hi", chat, session_id=session_id)
    return list(result.events)
