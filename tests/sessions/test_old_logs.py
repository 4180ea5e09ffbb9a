"""A log written before a guard setting, sampling param or tool schema was checked still
reads, replays and resumes with the value it holds; a new session with that value is
refused, naming the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.logs.test_logs import KINDS, factory
from turnkeeper.core import AgentSpec, GuardConfig, InputError, ToolSpec
from turnkeeper.events import (
    Envelope,
    MessageReceived,
    SessionOpened,
    decode_envelope,
    encode_envelope,
)
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Host, open_session, recheck, run
from turnkeeper.state import SessionState, replay

pytestmark = pytest.mark.anyio

# (the field as new input names it, a value an earlier version logged there)
OLD_VALUES: list[tuple[str, Any]] = [
    ("guards.consecutive_errors.threshold", 0),
    ("guards.loop.warnings", -1),
    ("guards.terminal.max_reprompts", -1),
    ("guards.budget.max_tokens", 0),
    ("guards.budget.max_seconds", 0.0),
    ("guards.small_model.window_turns", -1),
    ("guards.small_model.max_result_chars", 0),
    ("spec.temperature", 5),
    ("spec.top_p", 0),
    ("spec.max_tokens", 0),
    ("spec.seed", 2**63),
    ("spec.tools[0].input_schema", {"type": "foo"}),
]
_STEP = re.compile(r"(\w+)(?:\[(\d+)\])?")


def opened_holding(field: str, value: Any, session_id: str = "old") -> Envelope:
    """A session's opening event holding `value` at `field`, decoded from JSON as a log
    written by an earlier version gives it (no check of today's refuses it)."""
    spec = AgentSpec(tools=(ToolSpec("lookup"),))
    opened = SessionOpened(spec=spec, history=(), max_turns=5, guards=GuardConfig(), resume=False)
    raw = msgspec.to_builtins(Envelope(session_id, 1, 1.0, opened))
    where: Any = raw["event"]
    *steps, last = field.split(".")
    for step in steps:
        found = _STEP.fullmatch(step)
        assert found is not None
        name, index = found.groups()
        if where.get(name) is None:  # a guard off by default, turned on to hold the value
            where[name] = {}
        where = where[name]
        if index is not None:
            where = where[int(index)]
    where[last] = value
    return decode_envelope(msgspec.json.encode(raw))


def held(holder: SessionOpened | SessionState, field: str) -> Any:
    """The value at `field` (as `opened_holding` names it) of `holder`."""
    value: Any = holder
    for step in field.split("."):
        found = _STEP.fullmatch(step)
        assert found is not None
        name, index = found.groups()
        value = getattr(value, name)
        if index is not None:
            value = value[int(index)]
    return value


@pytest.mark.parametrize(("field", "value"), OLD_VALUES)
def test_the_opening_event_decodes_with_the_value_as_logged(field: str, value: Any) -> None:
    envelope = opened_holding(field, value)
    assert isinstance(envelope.event, SessionOpened)
    assert held(envelope.event, field) == value


@pytest.mark.parametrize(("field", "value"), OLD_VALUES)
def test_a_new_session_with_the_value_is_refused_naming_the_field(field: str, value: Any) -> None:
    opened = opened_holding(field, value).event
    assert isinstance(opened, SessionOpened)
    with pytest.raises(InputError, match=rf"^{re.escape(field)}: "):
        open_session(opened.spec, guards=opened.guards)


@pytest.mark.parametrize("kind", KINDS)
async def test_every_log_reads_and_replays_such_sessions(kind: str, tmp_path: Path) -> None:
    make = factory(kind, tmp_path)
    sessions = {
        f"old{index}": [
            opened_holding(field, value, f"old{index}"),
            Envelope(f"old{index}", 2, 2.0, MessageReceived(text="hi")),
        ]
        for index, (field, value) in enumerate(OLD_VALUES)
    }
    async with make() as log:
        for events in sessions.values():
            await log.append(events, expected_seq=0)
        read = {session_id: await log.read(session_id) for session_id in sessions}
    if kind != "memory":  # read back from the file, by a log opened on it afresh
        async with make() as log:
            read = {session_id: await log.read(session_id) for session_id in sessions}
    for index, (field, value) in enumerate(OLD_VALUES):
        events = read[f"old{index}"]
        assert events == sessions[f"old{index}"]
        assert held(replay(events), field) == value
        assert recheck(events) is None


async def test_a_host_resumes_such_a_session(tmp_path: Path) -> None:
    make = factory("sqlite", tmp_path)
    opened = opened_holding("guards.small_model.window_turns", -1)
    async with make() as log:
        await log.append([opened], expected_seq=0)
    chat = ScriptedChat([text_response("still here")])
    async with make() as log, Host(chat=chat, log=log) as host:
        await host.send("old", "hello again")
        info = await host.result("old", wait=10)
        assert (info.status, info.text) == ("idle", "still here")


async def test_a_log_written_before_self_feeding_existed_reads_and_replays_as_before() -> None:
    # A session whose model feeds a tool its own results, logged as a version without the
    # self_feeding setting wrote it: the opening event's guards lack the field.
    async def sqrt(x: float) -> str:
        return str(x**0.5)

    spec = AgentSpec(tools=(ToolSpec("sqrt"),))
    chat = ScriptedChat(
        [
            tool_response(("sqrt", {"x": 256.0})),
            tool_response(("sqrt", {"x": 16.0})),
            text_response("2"),
        ]
    )
    result = await run(spec, "sqrt?", chat, tools={"sqrt": sqrt})
    lines = [msgspec.json.decode(encode_envelope(envelope)) for envelope in result.events]
    del lines[0]["event"]["guards"]["self_feeding"]
    old = [decode_envelope(msgspec.json.encode(line)) for line in lines]
    opened = old[0].event
    assert isinstance(opened, SessionOpened)
    assert opened.guards == GuardConfig()
    assert replay(old) == result.state
    assert recheck(old) is None
