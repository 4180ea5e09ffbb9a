"""recheck: determinism of the logged guard events, and what-if under another config."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from turnkeeper.events import (
    AgentSpec,
    GuardConfig,
    LoopDetection,
    ModelResponded,
    ReplayError,
    ToolSpec,
)
from turnkeeper.providers import tool_response
from turnkeeper.sessions import recheck, run

pytestmark = pytest.mark.anyio

SPEC = AgentSpec(tools=(ToolSpec("search"), ToolSpec("status", repeatable=True)))


async def looping_run(*, max_turns: int = 50, guards: GuardConfig | None = None) -> Any:
    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        return tool_response(("status", {"job": 1}))

    async def status(job: int) -> str:
        return "still running"

    return await run(
        SPEC, "wait for job 1", chat, tools={"status": status}, max_turns=max_turns, guards=guards
    )


async def test_a_log_rechecked_under_its_own_guards_agrees() -> None:
    result = await looping_run()
    assert result.stop_reason == "going_in_circles"
    assert recheck(result.events) is None


async def test_loop_guard_off_then_on_reports_the_poll_it_would_halt_at() -> None:
    result = await looping_run(max_turns=6, guards=GuardConfig(loop=None))
    assert result.stop_reason == "max_turns_exceeded"
    divergence = recheck(result.events, guards=GuardConfig())
    assert divergence is not None
    assert divergence.poll == 3
    assert divergence.summary == (
        "would add a directive from loop at poll 3 (the log shows: call the model)"
    )
    halting = recheck(result.events, guards=GuardConfig(loop=LoopDetection(warnings=0)))
    assert halting is not None
    assert halting.summary.startswith("would halt at poll 3: going_in_circles")


async def test_turning_a_guard_off_reports_where_the_log_halted() -> None:
    result = await looping_run()
    divergence = recheck(result.events, guards=GuardConfig(loop=None))
    assert divergence is not None
    assert divergence.summary == (
        "would call the model at poll 3 (the log shows: add a directive from loop)"
    )


async def test_a_log_missing_a_guard_event_is_caught() -> None:
    result = await looping_run()
    kept = [e for e in result.events if e.type != "local.directive"]
    renumbered = [msgspec.structs.replace(e, seq=n) for n, e in enumerate(kept, start=1)]
    divergence = recheck(renumbered)
    assert divergence is not None
    assert divergence.poll == 3
    assert divergence.summary.startswith("would add a directive from loop at poll 3")


async def test_a_log_whose_first_event_is_not_the_opening_is_refused() -> None:
    result = await looping_run()
    with pytest.raises(ReplayError):
        recheck(result.events[1:])


async def test_recheck_needs_the_opening_event() -> None:
    with pytest.raises(ReplayError):
        recheck([])


def test_a_message_queued_while_the_model_was_called_does_not_diverge() -> None:
    from turnkeeper.events import MessageQueued, replay
    from turnkeeper.providers import text_response
    from turnkeeper.sessions import Kickoff, UserMessage, open_session
    from turnkeeper.sessions._poll import begin_poll, emit, end_poll, opened_event

    state = open_session(SPEC)
    events = []
    begun, state, request = begin_poll(state, Kickoff("first"), now=1.0)
    events += begun
    assert request is not None
    queued, state = emit(state, MessageQueued(text="second"), at=1.5)
    events.append(queued)
    ended, state = end_poll(state, text_response("one"), now=2.0)
    events += ended
    begun, state, _ = begin_poll(state, UserMessage("second"), now=3.0)
    events += begun
    assert state.queued == ()
    ended, state = end_poll(state, text_response("two"), now=4.0)
    events += ended
    assert events[0].event == opened_event(open_session(SPEC, session_id=state.session_id))
    assert replay(events) == state
    assert recheck(events) is None


async def test_responses_spelled_another_way_in_the_log_still_agree() -> None:
    result = await looping_run()
    respelled = []
    for envelope in result.events:
        event = envelope.event
        if isinstance(event, ModelResponded):
            # Another writer's spelling of the same JSON.
            spelled = json.dumps(msgspec.json.decode(event.response), indent=1).encode()
            event = msgspec.structs.replace(event, response=msgspec.Raw(spelled))
        respelled.append(msgspec.structs.replace(envelope, event=event))
    assert respelled != list(result.events)
    assert recheck(respelled) is None
    divergence = recheck(respelled, guards=GuardConfig(loop=None))
    original = recheck(result.events, guards=GuardConfig(loop=None))
    assert divergence is not None
    assert original is not None
    assert (divergence.poll, divergence.summary) == (original.poll, original.summary)


@pytest.mark.parametrize("spelled", [b"[1, 2]", b'{"choices": []}', b'{"id": "x"}'])
async def test_a_logged_response_no_poll_would_log_is_a_replay_error(spelled: bytes) -> None:
    result = await looping_run(max_turns=3)
    events = list(result.events)
    index = next(i for i, e in enumerate(events) if isinstance(e.event, ModelResponded))
    logged = events[index]
    assert isinstance(logged.event, ModelResponded)
    events[index] = msgspec.structs.replace(
        logged, event=msgspec.structs.replace(logged.event, response=msgspec.Raw(spelled))
    )
    with pytest.raises(ReplayError, match=rf"seq {logged.seq}: malformed response"):
        recheck(events)
