"""recheck: determinism of the logged guard events, and what-if under another config."""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.sessions.test_properties import SPEC as TOOLS_SPEC
from turnkeeper.core import (
    AgentSpec,
    Budget,
    ChatError,
    GuardConfig,
    InputError,
    LoopDetection,
    ReplayError,
    SmallModel,
    TerminalTool,
    ToolResult,
    ToolSpec,
)
from turnkeeper.events import (
    AnyEvent,
    Cancelled,
    ChatRetried,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    Failed,
    Halted,
    MessageQueued,
    MessageReceived,
    ModelResponded,
    ReplyReplaced,
    TerminalToolCalled,
    ToolCalled,
    ToolResultsReceived,
    ToolReturned,
)
from turnkeeper.logs import MemoryLog
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Host, Resume, UserMessage, open_session, recheck, run
from turnkeeper.sessions._poll import begin_poll, end_poll, failure_events
from turnkeeper.sessions._run import RUNNER, TURN_GUARD
from turnkeeper.state import fold, replay

pytestmark = pytest.mark.anyio

SPEC = AgentSpec(tools=(ToolSpec("search"), ToolSpec("status", repeatable=True)))


WARN_THEN_HALT = GuardConfig(loop=LoopDetection(answer=False))
"""Loop detection without the answer after its stop: it warns, then halts."""


async def looping_run(*, max_turns: int = 50, guards: GuardConfig = WARN_THEN_HALT) -> Any:
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
    divergence = recheck(result.events, guards=WARN_THEN_HALT)
    assert divergence is not None
    assert divergence.poll == 3
    assert divergence.summary == (
        "would add a directive from loop at poll 3 (the log shows: call the model)"
    )
    halting = recheck(
        result.events, guards=GuardConfig(loop=LoopDetection(warnings=0, answer=False))
    )
    assert halting is not None
    assert halting.summary.startswith("would halt at poll 3: going_in_circles")
    answering = recheck(result.events, guards=GuardConfig())
    assert answering is not None
    assert answering.summary == (
        "would ask for an answer without tools after loop (going_in_circles) at poll 3 "
        "(the log shows: call the model)"
    )


async def test_turning_a_guard_off_reports_where_the_log_halted() -> None:
    result = await looping_run()
    divergence = recheck(result.events, guards=GuardConfig(loop=None))
    assert divergence is not None
    assert divergence.summary == (
        "would call the model at poll 3 (the log shows: add a directive from loop)"
    )


async def test_a_terminal_tool_required_of_a_spec_with_none_is_refused() -> None:
    result = await looping_run()
    required = GuardConfig(terminal=TerminalTool(required=True))
    with pytest.raises(InputError, match=r"guards\.terminal\.required: the spec names no"):
        recheck(result.events, guards=required)


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
    from turnkeeper.events import MessageQueued
    from turnkeeper.providers import text_response
    from turnkeeper.sessions import Kickoff, UserMessage, open_session
    from turnkeeper.sessions._poll import begin_poll, emit, end_poll, opened_event
    from turnkeeper.state import replay

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


async def search(q: int) -> str:
    return f"found {q}"


def calling_an_unknown_tool() -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
    """A model that calls a tool the spec does not have, with new arguments each time."""
    calls = itertools.count(1)

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        n = next(calls)
        return tool_response(("no_such_tool", {"x": n}, f"call_{n}"))

    return chat


async def test_turning_off_the_guard_that_halted_after_a_reply_is_a_divergence() -> None:
    result = await run(SPEC, "look it up", calling_an_unknown_tool(), tools={"search": search})
    assert (result.stop_reason, result.turns) == ("bad_tool_calls", 2)
    assert recheck(result.events) is None
    divergence = recheck(result.events, guards=GuardConfig(repair=None))
    assert divergence is not None
    assert divergence.poll == 2
    assert divergence.summary == (
        "would let the model's reply stand at poll 2 (the log shows: halt: bad_tool_calls)"
    )
    assert isinstance(divergence.logged[0], ModelResponded)
    assert isinstance(divergence.logged[-1], Halted)
    assert divergence.derived == divergence.logged[:-1]


async def test_duplicates_off_or_on_against_the_log_is_a_divergence_either_way() -> None:
    twice = ("search", {"q": 1})
    script = [tool_response(twice, twice), text_response("found 1")]
    deduped = await run(SPEC, "go", ScriptedChat(script), tools={"search": search})
    assert "local.duplicate_tool_call" in [e.type for e in deduped.events]
    fewer = recheck(deduped.events, guards=GuardConfig(duplicates=None))
    assert fewer is not None
    assert (fewer.poll, fewer.summary) == (
        1,
        "would let the model's reply stand at poll 1 "
        "(the log shows: self-answer the repeated call of search)",
    )
    ran_twice = await run(
        SPEC,
        "go",
        ScriptedChat(script),
        tools={"search": search},
        guards=GuardConfig(duplicates=None),
    )
    assert recheck(ran_twice.events) is None
    more = recheck(ran_twice.events, guards=GuardConfig())
    assert more is not None
    assert (more.poll, more.summary) == (
        1,
        "would self-answer the repeated call of search at poll 1 "
        "(the log shows: let the model's reply stand)",
    )


async def test_the_same_guard_acting_otherwise_names_what_differs() -> None:
    calls = itertools.count()

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        return tool_response(("search", {"q": next(calls)}), usage=(10, 5))

    budget = Budget(max_tokens=25, answer=False)
    result = await run(
        SPEC, "go", chat, tools={"search": search}, guards=GuardConfig(budget=budget)
    )
    assert result.stop_reason == "budget_exceeded"
    wider = GuardConfig(budget=Budget(max_tokens=30, answer=False))
    divergence = recheck(result.events, guards=wider)
    assert divergence is not None
    assert divergence.summary == (
        "would halt at poll 3: budget_exceeded as the log shows, "
        "but its local.halted differs in message"
    )


async def test_a_log_ending_partway_through_a_step_is_read_as_its_guards_would_go_on() -> None:
    # Cut short between two appends, as a stopped process leaves a log: before the loop
    # guard's halt after a poll's input, and before the repair guard's after a reply.
    looped = await looping_run(guards=GuardConfig(loop=LoopDetection(warnings=0, answer=False)))
    repaired = await run(SPEC, "look it up", calling_an_unknown_tool(), tools={"search": search})
    for result, off, summary in (
        (
            looped,
            GuardConfig(loop=None),
            "would call the model at poll 3 (the log shows: halt: going_in_circles)",
        ),
        (
            repaired,
            GuardConfig(repair=None),
            "would let the model's reply stand at poll 2 (the log shows: halt: bad_tool_calls)",
        ),
    ):
        events = list(result.events)
        assert isinstance(events[-1].event, Halted)
        cut = events[:-1]
        assert recheck(cut) is None
        divergence = recheck(cut, guards=off)
        assert divergence is not None
        assert divergence.summary == summary


async def test_a_log_that_ends_after_a_reply_is_compared_as_it_is() -> None:
    twice = ("search", {"q": 1})
    script = [tool_response(twice, twice)]
    deduped = await run(SPEC, "go", ScriptedChat(script))
    assert deduped.events[-1].type == "local.duplicate_tool_call"
    assert recheck(deduped.events) is None
    fewer = recheck(deduped.events, guards=GuardConfig(duplicates=None))
    assert fewer is not None
    assert fewer.summary.startswith("would let the model's reply stand at poll 1")
    kept = await run(SPEC, "go", ScriptedChat(script), guards=GuardConfig(duplicates=None))
    assert kept.events[-1].type == "local.model_response"
    assert recheck(kept.events) is None
    more = recheck(kept.events, guards=GuardConfig())
    assert more is not None
    assert more.summary.startswith("would self-answer the repeated call of search at poll 1")


async def status_tool(job: int) -> str:
    return "still running"


async def hosted(
    chat: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
    act: Callable[[Host, str], Awaitable[None]],
    **options: Any,
) -> list[Envelope]:
    """The log a Host writes of one session on `chat`, driven by `act`."""
    log = MemoryLog()
    async with Host(
        chat=chat, log=log, tools={"status": status_tool}, restart_backoff=0, **options
    ) as host:
        session_id = await host.start(SPEC, "wait for job 1")
        with anyio.fail_after(10):
            await act(host, session_id)
            await host.result(session_id)
        return await log.read(session_id)


class Gate:
    """A model that waits in its first call until `opened`, then plays `replies`."""

    def __init__(self, *replies: dict[str, Any]) -> None:
        self.replies = iter(replies)
        self.entered = anyio.Event()
        self.opened = anyio.Event()

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.entered.set()
        await self.opened.wait()
        return next(self.replies)


async def failed_then_cancelled() -> list[Envelope]:
    async def act(host: Host, session_id: str) -> None:
        assert (await host.result(session_id)).status == "errored"
        await host.cancel(session_id)

    return await hosted(ScriptedChat([ChatError("HTTP 400", transient=False, status=400)]), act)


async def cancelled_during_the_call() -> list[Envelope]:
    gate = Gate()

    async def act(host: Host, session_id: str) -> None:
        await gate.entered.wait()
        await host.cancel(session_id)

    return await hosted(gate, act)


async def crash_loop() -> list[Envelope]:
    async def crashing(request: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the backend is on fire")

    async def act(host: Host, session_id: str) -> None:
        assert (await host.result(session_id)).status == "failed"

    return await hosted(crashing, act, max_restarts=1)


async def retried_after_a_failure() -> list[Envelope]:
    chat = ScriptedChat([ChatError("HTTP 503", transient=True, status=503), text_response("ok")])

    async def act(host: Host, session_id: str) -> None:
        assert (await host.result(session_id)).status == "errored"
        await host.retry(session_id)

    return await hosted(chat, act)


async def queued_during_the_call() -> list[Envelope]:
    gate = Gate(text_response("one"), text_response("two"))

    async def act(host: Host, session_id: str) -> None:
        await gate.entered.wait()
        await host.send(session_id, "and then?")
        gate.opened.set()

    return await hosted(gate, act)


async def halted_then_asked_again() -> list[Envelope]:
    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        if request["messages"][-1] == {"role": "user", "content": "thanks"}:
            return text_response("you're welcome")
        return tool_response(("status", {"job": 1}))

    async def act(host: Host, session_id: str) -> None:
        assert (await host.result(session_id)).status == "halted"
        await host.send(session_id, "thanks")

    return await hosted(chat, act)


async def run_failing_at_once() -> list[Envelope]:
    chat = ScriptedChat([ChatError("HTTP 400", transient=False, status=400)])
    return list((await run(SPEC, "wait for job 1", chat)).events)


async def run_timing_out_in_a_call() -> list[Envelope]:
    async def slow(request: dict[str, Any]) -> dict[str, Any]:
        if len(request["messages"]) > 2:
            await anyio.sleep(10)
        return tool_response(("status", {"job": 1}))

    result = await run(SPEC, "wait for job 1", slow, tools={"status": status_tool}, timeout=0.1)
    return list(result.events)


async def run_stopped_by_its_turn_guard() -> list[Envelope]:
    result = await run(
        SPEC,
        "wait for job 1",
        ScriptedChat([tool_response(("status", {"job": 1}))] * 3),
        tools={"status": status_tool},
        turn_guard=lambda usage, turns: "enough" if turns == 2 else None,
    )
    return list(result.events)


WRITTEN: dict[Callable[[], Awaitable[list[Envelope]]], list[str]] = {
    failed_then_cancelled: ["local.chat_error", "local.cancelled"],
    cancelled_during_the_call: ["local.user_message", "local.cancelled"],
    crash_loop: ["local.user_message", "local.failed"],
    retried_after_a_failure: ["local.chat_error", "local.model_response"],
    queued_during_the_call: ["local.user_message", "local.model_response"],
    halted_then_asked_again: ["local.user_message", "local.model_response"],
    run_failing_at_once: ["local.chat_error", "local.halted"],
    run_timing_out_in_a_call: ["local.tool_results", "local.halted"],
    run_stopped_by_its_turn_guard: ["local.model_response", "local.halted"],
}


@pytest.mark.parametrize("write", list(WRITTEN), ids=lambda write: write.__name__)
async def test_unchanged_guards_agree_with_every_log_a_host_or_a_run_writes(
    write: Callable[[], Awaitable[list[Envelope]]],
) -> None:
    events = await write()
    assert [e.type for e in events[-2:]] == WRITTEN[write]
    opened = replay(events[:1])
    assert recheck(events) is None
    assert recheck(events, guards=opened.guards) is None


# Generated logs: what a Host or a run writes, cut short anywhere.

NAMES = ["search", "lookup", "status", "finish", "unknown"]

calls = st.tuples(
    st.just("calls"),
    st.lists(st.tuples(st.sampled_from(NAMES), st.integers(0, 2)), min_size=1, max_size=3),
)
# Mostly tool calls, few of them distinct: repeats, errors and loops come up often.
reply = st.one_of(
    calls,
    calls,
    calls,
    st.tuples(st.just("text"), st.sampled_from(["done", "working on it"])),
    st.tuples(st.just("bad_args"), st.sampled_from(["{oops", '{"q": "x"}'])),
    st.tuples(st.just("malformed"), st.just("")),
    st.tuples(st.just("chat_error"), st.booleans()),
)
ENDINGS: dict[str, AnyEvent] = {
    "cancel": Cancelled(reason="cancelled by request"),
    "fail": Failed(error="crashed"),
    "timeout": Halted(guard=RUNNER, reason="timeout", message="too slow"),
    "turn_guard": Halted(guard=TURN_GUARD, reason="turn_guard", message="enough"),
}
"""What may end a session's log from outside: a cancel, a crash loop, a run's stops."""
# What happens before the session's next step: mostly nothing.
outside = st.sampled_from(["step"] * 40 + ["queue", *ENDINGS])
configs = st.builds(
    GuardConfig,
    terminal=st.builds(TerminalTool, required=st.booleans(), max_reprompts=st.integers(0, 1)),
    loop=st.sampled_from([LoopDetection(), LoopDetection(warnings=0), None]),
    duplicates=st.sampled_from([GuardConfig().duplicates, None]),
    budget=st.one_of(st.none(), st.builds(Budget, max_tokens=st.integers(20, 120))),
    small_model=st.one_of(st.none(), st.just(SmallModel())),
)


def response_for(step: tuple[str, Any], ids: Iterator[int]) -> dict[str, Any]:
    kind, value = step
    usage = (10, 5)
    if kind == "calls":
        return tool_response(*[(name, {"q": q}, f"c{next(ids)}") for name, q in value], usage=usage)
    if kind == "text":
        return text_response(value, usage=usage)
    if kind == "bad_args":
        return tool_response(("search", value, f"c{next(ids)}"), usage=usage)
    if kind == "chat_error":
        raise ChatError("backend hiccup", transient=value, status=503 if value else 400)
    return {"choices": []}


def tool_result(use_id: str, name: str, arguments: dict[str, Any]) -> ToolResult:
    """lookup always fails; the others answer by their input."""
    if name == "lookup":
        return ToolResult(use_id, "lookup is down", is_error=True)
    return ToolResult(use_id, f"{name} says {arguments.get('q')}")


def written(data: st.DataObject, config: GuardConfig, max_turns: int) -> list[Envelope]:
    """A session's log as a Host or a run writes it, through the same pure steps: the model's
    replies and failures (a Host makes a failed call again, a run halts), and what happens
    meanwhile (a queued message, a cancel, a crash loop's failure, a run's timeout or turn
    guard), drawn from `data`; then maybe cut short, as a process stopped between two
    appends leaves it."""
    ticks = itertools.count()
    ids = itertools.count(1)
    state = open_session(
        TOOLS_SPEC, session_id="local_00000000000000ab", max_turns=max_turns, guards=config
    )
    log: list[Envelope] = []

    def log_all(events: Sequence[Envelope]) -> None:
        nonlocal state
        log.extend(events)
        state = fold(state, events)

    def now() -> float:
        return 1_000.0 + next(ticks)

    def log_one(event: AnyEvent) -> None:
        log_all([Envelope(state.session_id, state.seq + 1, now(), event)])

    log_all(begin_poll(state, UserMessage("task 0"), now=now())[0])
    episodes = 1
    for _ in range(40):
        happening = data.draw(outside)
        if happening == "queue":
            log_one(MessageQueued(text=f"task {len(log)}"))
            continue
        if happening in ENDINGS:
            log_one(ENDINGS[happening])
            break
        if state.in_poll:
            reported = [
                ChatRetried(attempt=n, delay=0.5, error="HTTP 503", status=503)
                for n in range(1, data.draw(st.integers(0, 2)) + 1)
            ]
            response: dict[str, Any] | None = None
            at = now()
            try:
                response = response_for(data.draw(reply), ids)
                events, _ = end_poll(state, response, now=at, reported=reported)
            except ChatError as error:
                log_all(failure_events(state, error, reported, at=at, response=response))
                if data.draw(st.booleans()):
                    log_one(Halted(guard=RUNNER, reason="chat_error", message=error.message))
                    break
                continue
            log_all(events)
        elif state.status == "requires_action":
            results = []
            for use in state.pending:
                result = tool_result(use.id, use.name, use.input)
                log_one(ToolCalled(tool_call_id=use.id, name=use.name, input=use.input))
                log_one(
                    ToolReturned(tool_call_id=use.id, text=result.text, is_error=result.is_error)
                )
                results.append(result)
            log_all(begin_poll(state, Resume(state.pending, tuple(results)), now=now())[0])
        elif state.status == "running":
            log_all(begin_poll(state, Resume(), now=now())[0])  # every call self-answered
        elif episodes < 3 or state.queued:
            text = state.queued[0] if state.queued else f"task {episodes}"
            episodes += 1
            log_all(begin_poll(state, UserMessage(text), now=now())[0])
        else:
            break
    assert replay(log) == state
    if data.draw(st.booleans()):
        return log[: data.draw(st.integers(1, len(log)))]
    return log


def guard_of(event: AnyEvent) -> str | None:
    """The GuardConfig field of the guard that derived `event`, if a guard did."""
    if isinstance(event, DuplicateToolCall):
        return "duplicates"
    if isinstance(event, TerminalToolCalled):
        return "terminal"
    if isinstance(event, Halted) and event.guard in (RUNNER, TURN_GUARD):
        return None
    if isinstance(event, DirectiveInjected | Halted | ReplyReplaced):
        return event.guard
    return None


def first_polls(events: Sequence[Envelope]) -> dict[str, int]:
    """For each guard with an event in the log, the poll of its first one."""
    polls: dict[str, int] = {}
    poll = 0
    for envelope in events:
        if isinstance(envelope.event, MessageReceived | ToolResultsReceived):
            poll += 1
        name = guard_of(envelope.event)
        if name is not None:
            polls.setdefault(name, poll)
    return polls


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), config=configs, max_turns=st.integers(1, 8))
def test_unchanged_guards_never_diverge_and_turning_off_one_that_acted_always_does(
    data: st.DataObject, config: GuardConfig, max_turns: int
) -> None:
    events = written(data, config, max_turns)
    assert recheck(events) is None
    assert recheck(events, guards=config) is None
    for name, poll in first_polls(events).items():
        divergence = recheck(events, guards=msgspec.structs.replace(config, **{name: None}))
        assert divergence is not None, name
        assert divergence.poll <= poll, name
