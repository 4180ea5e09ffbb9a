"""The output guard, called directly as the pure function it is: an answer that does not
match the spec's output schema is sent back `max_reprompts` times, then halts."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, GuardConfig, Message, ToolSpec, ToolUse, TypedOutput, Usage
from turnkeeper.guards import (
    CONTINUE,
    GuardView,
    Reply,
    answer_problem,
    default_guards,
    typed_output,
)
from turnkeeper.sessions import open_session
from turnkeeper.state import SessionState

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temperature": {"type": "number"}},
    "required": ["city", "temperature"],
}
SEARCH = ToolSpec("search", "Search", {"type": "object", "properties": {"q": {"type": "string"}}})
SPEC = AgentSpec(tools=(SEARCH,), output_schema=SCHEMA)
GOOD = '{"city": "Paris", "temperature": 12}'
BAD = '{"city": "Paris"}'


def session(
    spec: AgentSpec = SPEC, guards: GuardConfig | None = None, **changes: Any
) -> SessionState:
    state = open_session(spec, session_id="local_0123456789abcdef", guards=guards)
    return msgspec.structs.replace(state, **changes) if changes else state


def reply(text: str | None, finish_reason: str = "stop", *calls: ToolUse) -> Reply:
    message: Message = {"role": "assistant", "content": text}
    return Reply(message, text, calls, finish_reason, Usage(10, 5))


def answer(text: str | None, finish_reason: str = "stop", *calls: ToolUse) -> GuardView:
    return GuardView("after_response", session(), 0.0, reply=reply(text, finish_reason, *calls))


def on(view: GuardView, **changes: Any) -> GuardView:
    return msgspec.structs.replace(view, state=msgspec.structs.replace(view.state, **changes))


def test_an_answer_that_matches_passes() -> None:
    assert typed_output(answer(GOOD)) == CONTINUE
    assert typed_output(answer("```json\n" + GOOD + "\n```")) == CONTINUE


def test_an_answer_that_does_not_match_is_sent_back_saying_why() -> None:
    verdict = typed_output(answer(BAD))
    (directive,) = verdict.directives
    assert (directive.guard, directive.counts, verdict.halt) == ("output", "reprompt", None)
    assert directive.text.startswith(
        "Your answer could not be used: it does not match the output schema: "
        "$: missing required property 'temperature'. Reply again with only a JSON value, "
        "and no other text, that matches the output schema: {"
    )
    # The schema is quoted, so a model without a grammar sees what it must write.
    assert msgspec.json.decode(directive.text.split("output schema: ", 2)[2]) == SCHEMA


def test_prose_is_sent_back_too() -> None:
    (directive,) = typed_output(answer("It is 12 degrees in Paris.")).directives
    assert "it is not a JSON value" in directive.text


@pytest.mark.parametrize("limit", [0, 1, 2, 5])
def test_after_max_reprompts_the_episode_halts_naming_the_problem(limit: int) -> None:
    guards = GuardConfig(output=TypedOutput(max_reprompts=limit))
    view = on(answer(BAD), guards=guards)
    for count in range(limit):
        assert typed_output(on(view, reprompts=count)).directives
    verdict = typed_output(on(view, reprompts=limit))
    assert verdict.halt is not None
    assert (verdict.halt.guard, verdict.halt.reason) == ("output", "invalid_output")
    assert verdict.halt.message == (
        "I'm sorry: my answer did not match the output schema (it does not match the output "
        "schema: $: missing required property 'temperature')."
    )
    assert verdict.directives == ()


def test_the_halt_message_carries_the_last_tool_result() -> None:
    history = ({"role": "user", "content": "Weather?"}, {"role": "tool", "content": "12 C"})
    view = on(answer(BAD), history=history, reprompts=2)
    halt = typed_output(view).halt
    assert halt is not None
    assert halt.message.startswith("12 C\n\nI'm sorry: my answer did not match")


@pytest.mark.parametrize(
    "view",
    [
        # Calls are not an answer; a cut-off or degenerate reply is the repair guard's.
        answer(BAD, "tool_calls", ToolUse("c1", "search", {"q": "x"})),
        answer(BAD, "length"),
        answer("the weather " * 40),
        # No output schema, or the guard turned off.
        GuardView("after_response", session(AgentSpec()), 0.0, reply=reply(BAD)),
        on(answer(BAD), guards=GuardConfig(output=None)),
        GuardView("before_call", session(), 0.0, reply=reply(BAD)),
    ],
)
def test_what_the_guard_leaves_alone(view: GuardView) -> None:
    assert typed_output(view) == CONTINUE


def test_the_default_guards_include_it() -> None:
    verdict = default_guards(answer(BAD))
    assert [directive.guard for directive in verdict.directives] == ["output"]
    assert default_guards(answer(GOOD)) == CONTINUE


def test_answer_problem_reads_the_reply_against_the_schema() -> None:
    assert answer_problem(session(), reply(GOOD)) is None
    assert answer_problem(session(AgentSpec()), reply(BAD)) is None
    problem = answer_problem(session(), reply("[]"))
    assert problem == "it does not match the output schema: $: expected object, got array"


@settings(max_examples=200)
@given(
    st.one_of(st.none(), st.text(max_size=40), st.just(GOOD), st.just(BAD)),
    st.integers(0, 4),
    st.integers(0, 4),
)
def test_the_guard_is_pure_and_bounded(text: str | None, reprompts: int, limit: int) -> None:
    """The same view gets the same verdict; a verdict is a continue, one re-prompt (while
    re-prompts remain) or a halt (once they are spent), never both."""
    guards = GuardConfig(output=TypedOutput(max_reprompts=limit))
    view = on(answer(text), guards=guards, reprompts=reprompts)
    verdict = typed_output(view)
    assert typed_output(view) == verdict
    if verdict == CONTINUE:
        return
    if reprompts < limit:
        assert (len(verdict.directives), verdict.halt) == (1, None)
    else:
        assert verdict.halt is not None
        assert verdict.directives == ()
