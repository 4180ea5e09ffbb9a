"""Typed output through the public API: `run()` and the Host with `AgentSpec(output_schema=
...)`, against the OpenAI-compatible test server on 127.0.0.1 (OpenAIChat over HTTP). The
answer must match the schema; one that does not is sent back to the model, a bounded
number of times, then ends the run `invalid_output`; the log holds the JSON Schema, and
replay and recheck rebuild the same session from it alone."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.providers.openai_server import ChatServer, Reply, serve_chat
from turnkeeper.core import (
    AgentSpec,
    GuardConfig,
    InputError,
    ToolSpec,
    TypedOutput,
    output_json_schema,
)
from turnkeeper.events import (
    AnsweredAfterStop,
    DirectiveInjected,
    Envelope,
    Halted,
    OutputAccepted,
    SessionOpened,
    ToolCalled,
)
from turnkeeper.logs import MemoryLog, SqliteLog
from turnkeeper.providers import (
    InlineTools,
    OpenAIChat,
    ScriptedChat,
    text_response,
    tool_response,
)
from turnkeeper.providers._openai import aclose_shared_client
from turnkeeper.sessions import Host, RunResult, recheck, run
from turnkeeper.state import replay

pytestmark = pytest.mark.anyio


class Weather(msgspec.Struct):
    city: str
    temperature: float
    conditions: Literal["sunny", "rain"]


@dataclasses.dataclass
class Person:
    name: str
    age: int


WEATHER_TOOL = ToolSpec(
    "get_weather",
    "The weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
SPEC = AgentSpec(system_prompt="Report the weather.", tools=(WEATHER_TOOL,), output_schema=Weather)
PARIS = '{"city": "Paris", "temperature": 12, "conditions": "rain"}'


async def get_weather(city: str) -> str:
    return f"{city}: 12 C, rain"


@asynccontextmanager
async def model(*replies: dict[str, Any]) -> AsyncIterator[tuple[ChatServer, OpenAIChat]]:
    """The test server answering with `replies` in turn, and an OpenAIChat talking to it."""
    async with serve_chat(*(Reply(body=reply) for reply in replies)) as server:
        try:
            yield server, OpenAIChat(server.base_url, "test-model")
        finally:
            await aclose_shared_client()


def events_of(result: RunResult, kind: type[Any]) -> list[Any]:
    return [e.event for e in result.events if isinstance(e.event, kind)]


def consistent(events: list[Envelope] | tuple[Envelope, ...], state: Any) -> None:
    assert replay(events) == state
    assert recheck(events) is None


async def test_run_decodes_the_answer_into_the_struct_and_logs_its_schema() -> None:
    async with model(tool_response(("get_weather", {"city": "Paris"})), text_response(PARIS)) as (
        server,
        chat,
    ):
        result = await run(SPEC, "Weather in Paris?", chat, tools={"get_weather": get_weather})
    assert (result.terminal, result.stop_reason) == ("end_turn", "end_turn")
    assert result.output == Weather("Paris", 12.0, "rain")
    assert result.text == PARIS
    assert events_of(result, OutputAccepted) == [
        OutputAccepted(value={"city": "Paris", "temperature": 12, "conditions": "rain"})
    ]
    schema = output_json_schema(Weather)
    # Every request asked for JSON of the schema, as OpenAI's API has it.
    for received in server.received:
        assert received.body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
    (opened,) = events_of(result, SessionOpened)
    assert opened.spec.output_schema == schema
    assert result.state.output == {"city": "Paris", "temperature": 12, "conditions": "rain"}
    consistent(result.events, result.state)


async def test_a_dataclass_decodes_and_a_json_schema_gives_json() -> None:
    answer = '{"name": "Ada", "age": 36}'
    async with model(text_response(answer), text_response(answer)) as (_, chat):
        typed = await run(AgentSpec(output_schema=Person), "Who?", chat)
        schema = {"type": "object", "properties": {"age": {"type": "integer"}}}
        plain = await run(AgentSpec(output_schema=schema), "Who?", chat)
    assert typed.output == Person("Ada", 36)
    assert plain.output == {"name": "Ada", "age": 36}
    consistent(plain.events, plain.state)


async def test_a_bad_answer_is_sent_back_until_it_matches() -> None:
    async with model(
        text_response("It is 12 degrees and raining in Paris."),
        text_response('{"city": "Paris", "temperature": "warm", "conditions": "rain"}'),
        text_response("```json\n" + PARIS + "\n```"),
    ) as (server, chat):
        result = await run(SPEC, "Weather in Paris?", chat)
    assert (result.terminal, result.turns) == ("end_turn", 3)
    assert result.output == Weather("Paris", 12.0, "rain")
    directives = events_of(result, DirectiveInjected)
    assert [(d.guard, d.counts) for d in directives] == [("output", "reprompt")] * 2
    assert directives[0].text.startswith("Your answer could not be used: it is not a JSON value.")
    assert directives[1].text.startswith(
        "Your answer could not be used: it does not match the output schema: "
        "$.temperature: expected number, got string."
    )
    # The model read why, and the schema, before its next reply.
    last_sent = server.received[2].body["messages"][-1]
    assert (last_sent["role"], last_sent["content"]) == ("user", directives[1].text)
    consistent(result.events, result.state)


@pytest.mark.parametrize("limit", [0, 1, 2])
async def test_re_prompts_are_bounded_then_the_run_ends_naming_the_problem(limit: int) -> None:
    bad = text_response('{"city": "Paris"}')
    guards = GuardConfig(output=TypedOutput(max_reprompts=limit))
    async with model(*[bad] * (limit + 1)) as (server, chat):
        result = await run(SPEC, "Weather in Paris?", chat, guards=guards)
    assert (result.terminal, result.stop_reason, result.output) == (
        "terminated",
        "invalid_output",
        None,
    )
    assert result.turns == limit + 1 == len(server.received)
    assert result.text == (
        "I'm sorry: my answer did not match the output schema (it does not match the output "
        "schema: $: missing required property 'temperature'; $: missing required property "
        "'conditions')."
    )
    assert [(h.guard, h.reason) for h in events_of(result, Halted)] == [
        ("output", "invalid_output")
    ]
    assert result.state.output is None
    consistent(result.events, result.state)


async def test_with_the_guard_off_the_first_bad_answer_ends_the_run() -> None:
    async with model(text_response("sunny")) as (_, chat):
        result = await run(SPEC, "Weather?", chat, guards=GuardConfig(output=None))
    assert (result.stop_reason, result.turns) == ("invalid_output", 1)
    assert [(h.guard, h.reason) for h in events_of(result, Halted)] == [
        ("output", "invalid_output")
    ]
    assert "it is not a JSON value" in (result.text or "")
    consistent(result.events, result.state)


async def test_an_answer_the_schema_admits_but_the_type_does_not_ends_the_run() -> None:
    class Meeting(msgspec.Struct):
        title: str
        at: datetime.datetime

    async with model(text_response('{"title": "Standup", "at": "tomorrow at 9"}')) as (_, chat):
        result = await run(AgentSpec(output_schema=Meeting), "When is standup?", chat)
    assert (result.terminal, result.stop_reason, result.output) == (
        "terminated",
        "invalid_output",
        None,
    )
    assert result.text is not None
    assert result.text.startswith(
        "I'm sorry: my answer matched the output schema but not the type Meeting (Invalid "
        "RFC3339 encoded datetime"
    )
    # The answer matched the schema (logged), then the run's own halt: replay and recheck
    # (which leaves the run's halts to it) agree with the log.
    assert [e.type for e in result.events][-2:] == ["local.output", "local.halted"]
    consistent(result.events, result.state)


async def test_a_date_msgspec_cannot_decode_is_repaired() -> None:
    class Meeting(msgspec.Struct):
        title: str
        on: datetime.date

    async with model(
        text_response('{"title": "Standup", "on": "next Tuesday"}'),
        text_response('{"title": "Standup", "on": "2024-03-05"}'),
    ) as (_, chat):
        result = await run(AgentSpec(output_schema=Meeting), "When is standup?", chat)
    assert result.output == Meeting("Standup", datetime.date(2024, 3, 5))
    (directive,) = events_of(result, DirectiveInjected)
    assert directive.text.startswith(
        "Your answer could not be used: it does not match the output schema: "
        '$.on: "next Tuesday" is not a valid date.'
    )
    consistent(result.events, result.state)


async def test_a_json_answer_after_a_stop_is_the_typed_output() -> None:
    """The model repeats a call until the loop guard stops it; the answer after the stop,
    tools withdrawn, is asked for as JSON of the schema and is the run's output."""

    def reply(request: dict[str, Any]) -> dict[str, Any]:
        if request.get("tool_choice") == "none":
            assert (
                "Give it as only JSON that matches the output schema."
                in (request["messages"][-1]["content"])
            )
            return text_response(PARIS)
        return tool_response(("get_weather", {"city": "Paris"}))

    chat = ScriptedChat([reply] * 6)
    result = await run(SPEC, "Weather in Paris?", chat, tools={"get_weather": get_weather})
    assert (result.terminal, result.output) == ("end_turn", Weather("Paris", 12.0, "rain"))
    assert [e.type for e in result.events][-2:] == ["local.answered_after_stop", "local.output"]
    (after,) = events_of(result, AnsweredAfterStop)
    assert after.guard == "loop"
    consistent(result.events, result.state)


async def test_prose_after_a_stop_halts_as_the_stop_would_have() -> None:
    def reply(request: dict[str, Any]) -> dict[str, Any]:
        if request.get("tool_choice") == "none":
            return text_response("It is 12 C and raining in Paris.")
        return tool_response(("get_weather", {"city": "Paris"}))

    result = await run(
        SPEC, "Weather in Paris?", ScriptedChat([reply] * 6), tools={"get_weather": get_weather}
    )
    assert (result.terminal, result.stop_reason, result.output) == (
        "terminated",
        "going_in_circles",
        None,
    )
    assert not events_of(result, OutputAccepted)
    consistent(result.events, result.state)


async def test_a_json_answer_is_not_taken_for_a_tool_call() -> None:
    """With calls read from the reply text (InlineTools, as for a small local model), an
    answer whose JSON has a `name` (even that of a tool) and arguments-like fields is the
    answer, not a call; a call of an offered tool in the same form is still a call."""
    person = ToolSpec("lookup", "Look a person up", {"type": "object"})
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "arguments": {"type": "array"}},
        "required": ["name"],
    }
    spec = AgentSpec(tools=(person,), output_schema=schema)
    chat = InlineTools(
        ScriptedChat(
            [
                text_response('{"name": "lookup", "arguments": {"who": "Ada"}}'),
                text_response('{"name": "Ada", "arguments": ["math"]}'),
            ]
        )
    )

    async def lookup(**_: Any) -> str:
        return "Ada Lovelace"

    result = await run(spec, "Who is Ada?", chat, tools={"lookup": lookup})
    assert [call.name for call in events_of(result, ToolCalled)] == ["lookup"]
    assert (result.terminal, result.output) == ("end_turn", {"name": "Ada", "arguments": ["math"]})
    consistent(result.events, result.state)


async def test_bad_output_schemas_are_refused_before_any_call() -> None:
    finish = ToolSpec("finish", "Finish", {"type": "object"})
    chat = ScriptedChat([])
    for spec, message in [
        (AgentSpec(output_schema={"type": "objekt"}), "spec.output_schema: the schema cannot"),
        (AgentSpec(output_schema=3.5), "spec.output_schema: expected a JSON Schema object"),  # type: ignore[arg-type]
        (
            AgentSpec(tools=(finish,), terminal_tool="finish", output_schema=Weather),
            "spec.output_schema: the spec's terminal_tool",
        ),
    ]:
        with pytest.raises(InputError) as raised:
            await run(spec, "Go", chat)
        assert str(raised.value).startswith(message)
    assert chat.calls == 0


async def test_the_host_decodes_into_the_type_it_was_given(tmp_path: Path) -> None:
    path = tmp_path / "typed.sqlite"
    async with model(
        tool_response(("get_weather", {"city": "Paris"})),
        text_response(PARIS),
        text_response('{"city": "Oslo", "temperature": -3, "conditions": "sunny"}'),
    ) as (_, chat):
        async with (
            SqliteLog(path) as log,
            Host(chat=chat, log=log, tools={"get_weather": get_weather}) as host,
        ):
            session_id = await host.start(SPEC, "Weather in Paris?")
            info = await host.result(session_id, wait=30)
            assert (info.status, info.stop_reason) == ("idle", "stop")
            assert info.output == Weather("Paris", 12.0, "rain")
            assert info.text == PARIS
            assert (await host.status(session_id)).output == Weather("Paris", 12.0, "rain")
            events = await host.events(session_id)
            consistent(events, replay(events))
        # A host started later on the log knows no type: it gives the JSON, until a session
        # is started on it with the type.
        async with SqliteLog(path) as log, Host(chat=chat, log=log) as host:
            info = await host.status(session_id)
            assert info.output == {"city": "Paris", "temperature": 12, "conditions": "rain"}
            other = await host.start(AgentSpec(output_schema=Weather), "Weather in Oslo?")
            assert (await host.result(other, wait=30)).output == Weather("Oslo", -3.0, "sunny")
            assert (await host.status(session_id)).output == Weather("Paris", 12.0, "rain")


async def test_the_host_repairs_and_bounds_a_bad_answer() -> None:
    async with (
        model(
            text_response("Paris, 12 C"),
            text_response('{"city": "Paris", "temperature": 12}'),
            text_response("still not it"),
        ) as (server, chat),
        Host(chat=chat, log=MemoryLog()) as host,
    ):
        session_id = await host.start(SPEC, "Weather in Paris?")
        info = await host.result(session_id, wait=30)
        events = await host.events(session_id)
    assert (info.status, info.stop_reason, info.output) == ("halted", "invalid_output", None)
    assert info.text == (
        "I'm sorry: my answer did not match the output schema (it is not a JSON value)."
    )
    assert len(server.received) == 3
    guards = [e.event.guard for e in events if isinstance(e.event, DirectiveInjected)]
    assert guards == ["output", "output"]
    consistent(events, replay(events))


async def test_the_host_ends_a_session_whose_answer_is_not_of_its_type() -> None:
    class Meeting(msgspec.Struct):
        at: datetime.datetime

    async with model(text_response('{"at": "soon"}')) as (_, chat), Host(chat=chat) as host:
        session_id = await host.start(AgentSpec(output_schema=Meeting), "When?")
        info = await host.result(session_id, wait=30)
        events = await host.events(session_id)
    assert (info.status, info.stop_reason, info.output) == ("halted", "invalid_output", None)
    assert info.text is not None
    assert "not the type Meeting" in info.text
    assert [e.type for e in events][-2:] == ["local.output", "local.halted"]
    consistent(events, replay(events))


async def test_a_follow_up_gets_its_own_output() -> None:
    async with (
        model(
            text_response(PARIS),
            text_response('{"city": "Oslo", "temperature": -3, "conditions": "sunny"}'),
        ) as (_, chat),
        Host(chat=chat) as host,
    ):
        session_id = await host.start(SPEC, "Weather in Paris?")
        assert (await host.result(session_id, wait=30)).output == Weather("Paris", 12, "rain")
        await host.send(session_id, "And in Oslo?")
        info = await host.result(session_id, wait=30)
    assert info.output == Weather("Oslo", -3.0, "sunny")


async def test_host_start_refuses_a_bad_output_schema_and_logs_nothing() -> None:
    log = MemoryLog()
    async with Host(chat=ScriptedChat([]), log=log) as host:
        with pytest.raises(InputError, match=r"^spec\.output_schema: the schema cannot be used"):
            await host.start(AgentSpec(output_schema={"required": "city"}), "Go")
        assert await host.sessions() == []


REPLIES = {
    "good": lambda: text_response(PARIS),
    "fenced": lambda: text_response(f"```json\n{PARIS}\n```"),
    "partial": lambda: text_response('{"city": "Paris"}'),
    "prose": lambda: text_response("Paris: 12 C, rain"),
    "call": lambda: tool_response(("get_weather", {"city": "Paris"})),
    "other call": lambda: tool_response(("get_weather", {"city": "Lyon"})),
    "cut off": lambda: text_response('{"city": "Pa', finish_reason="length"),
}


@settings(max_examples=60)
@given(st.lists(st.sampled_from(sorted(REPLIES)), min_size=1, max_size=8), st.integers(0, 3))
async def test_any_session_ends_typed_or_says_why_and_replays(kinds: list[str], limit: int) -> None:
    """Whatever the model replies, the run makes no more output re-prompts than allowed;
    it answers with output that matches the schema, or ends saying why (never with an
    answer that does not match); and the log replays and re-checks to the same session."""
    # Then good answers: the session always gets a reply.
    chat = ScriptedChat([REPLIES[kind]() for kind in [*kinds, *["good"] * 50]])
    guards = GuardConfig(output=TypedOutput(max_reprompts=limit))
    result = await run(SPEC, "Weather?", chat, tools={"get_weather": get_weather}, guards=guards)
    directives = [d for d in events_of(result, DirectiveInjected) if d.guard == "output"]
    assert len(directives) <= limit
    if result.terminal == "end_turn":
        assert result.output == Weather("Paris", 12.0, "rain")
        assert len(events_of(result, OutputAccepted)) == 1
    else:
        assert result.output is None
        assert result.text
        if result.stop_reason == "invalid_output":
            assert len(directives) == limit
    consistent(result.events, result.state)
