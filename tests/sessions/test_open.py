"""open_session: fresh and reattached sessions, and the errors bad arguments get."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from turnkeeper.core import AgentSpec, GuardConfig, InputError, TerminalTool, ToolSpec
from turnkeeper.events import Envelope
from turnkeeper.logs import decode_jsonl, encode_jsonl
from turnkeeper.sessions import new_session_id, open_session
from turnkeeper.sessions._poll import opened_event
from turnkeeper.state import replay

SPEC = AgentSpec(system_prompt="Be brief.", tools=(ToolSpec("f"),))


def test_fresh_session_starts_from_the_system_prompt() -> None:
    state = open_session(SPEC, max_turns=7)
    assert state.history == ({"role": "system", "content": "Be brief."},)
    assert (state.seq, state.polls, state.max_turns, state.status) == (0, 0, 7, "idle")
    assert not state.resume
    assert state.guards == GuardConfig()


def test_empty_system_prompt_gives_no_system_message() -> None:
    assert open_session(AgentSpec()).history == ()


def test_an_empty_transcript_means_a_fresh_open() -> None:
    state = open_session(SPEC, history=[])
    assert not state.resume
    assert state.history[0]["role"] == "system"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": True}, "max_turns"),
        ({"max_turns": "5"}, "max_turns"),
        ({"session_id": ""}, "session_id"),
        ({"session_id": "  "}, "session_id"),
        ({"session_id": "a\ud800"}, "session_id"),
        ({"guards": {"loop": None}}, "guards"),
        ({"history": "hello"}, "history"),
        ({"history": [{"role": "user", "content": "x"}, "oops"]}, "history[1]"),
        ({"history": [{"role": "robot", "content": "x"}]}, "history[0].role"),
        ({"history": [{"content": "x"}]}, "history[0].role"),
        (
            {"history": [{"role": "assistant", "tool_calls": [{"id": "1", "function": 3}]}]},
            "history",
        ),
        ({"history": [{"role": "tool", "tool_call_id": "1", "content": "x"}]}, "history[0]"),
        (
            {
                "history": [
                    {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f"}}]},
                    {"role": "tool", "tool_call_id": "2", "content": "x"},
                ]
            },
            r"history[1].tool_call_id: '2' answers no tool call",
        ),
        (
            {
                "history": [
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "a", "function": {"name": "f"}},
                            {"id": "a", "function": {"name": "f", "arguments": "{}"}},
                        ],
                    }
                ]
            },
            r"history[0].tool_calls[1].id: 'a' is the id of an earlier call",
        ),
        ({"history": [{"role": "user", "content": {"a": 1}}]}, "history[0].content"),
        ({"history": [{"role": "user", "content": 5}]}, "history[0].content"),
        ({"history": [{"role": "user", "content": [1, 2]}]}, "history[0].content"),
        ({"history": [{"role": "user", "content": [{"text": "hi"}]}]}, "history[0].content"),
        (
            {"history": [{"role": "user", "content": "x", "meta": object()}]},
            "cannot be logged as JSON",
        ),
        ({"guards": GuardConfig(terminal=TerminalTool(required=True))}, "terminal"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        open_session(SPEC, **kwargs)


def test_content_may_be_text_parts_or_none() -> None:
    parts = [{"type": "text", "text": "hi"}]
    history: list[dict[str, Any]] = [{"role": "user", "content": parts}, {"role": "assistant"}]
    assert open_session(SPEC, history=history).history == tuple(history)


def test_spec_must_be_an_agent_spec() -> None:
    with pytest.raises(InputError, match="spec"):
        open_session({"system_prompt": "x"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("last", "status"),
    [
        ({"role": "user", "content": "hi"}, "running"),
        ({"role": "assistant", "content": "hello"}, "idle"),
        ({"role": "tool", "tool_call_id": "1", "content": "ok"}, "running"),
    ],
)
def test_reattached_status_follows_the_transcript(last: dict[str, Any], status: str) -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": "s"}]
    if last["role"] == "tool":
        history.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            }
        )
    history.append(last)
    state = open_session(SPEC, history=history)
    assert state.resume
    assert state.status == status
    assert state.pending == ()


def test_values_json_does_not_hold_as_they_are_open_as_the_log_reads_them() -> None:
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u", "meta": {"tags": ("a",), "w": float("nan"), 1: 2}},
    ]
    schema = {"type": "object", "properties": {"x": {"enum": ("a", "b")}}}
    state = open_session(AgentSpec(tools=(ToolSpec("f", "F", schema),)), history=history)
    assert state.history[1]["meta"] == {"tags": ["a"], "w": None, "1": 2}
    assert state.spec.tools[0].input_schema["properties"]["x"]["enum"] == ["a", "b"]
    logged = [Envelope(state.session_id, 1, 0.0, opened_event(state))]
    replayed = replay(decode_jsonl(encode_jsonl(logged)).events)
    assert (replayed.spec, replayed.history) == (state.spec, state.history)


def test_session_ids_are_fresh_across_reads_of_randomness_and_in_a_forked_child() -> None:
    # More than one read of the system's randomness ahead (512 ids a read).
    ids = [new_session_id() for _ in range(1500)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch("local_[0-9a-f]{16}", session_id) for session_id in ids)
    receive, send = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(send, new_session_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(receive, 100).decode()
    os.close(receive)
    os.close(send)
    # The child does not give the id the parent gives next (the ids it read ahead).
    assert re.fullmatch("local_[0-9a-f]{16}", child)
    assert child != new_session_id()
