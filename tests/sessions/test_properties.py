"""Hypothesis properties for the invariants DESIGN.md lists, over generated sessions.

The model strategy generates tool calls (fresh, repeated, malformed), errors from
tools, text replies, malformed responses and chat failures; a driver plays it
through poll_turn as a host would, over several request episodes.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from turnkeeper.core import (
    AgentSpec,
    ChatError,
    Compaction,
    GuardConfig,
    LogError,
    TerminalTool,
    ToolResult,
    ToolSpec,
    TurnkeeperError,
    text_of,
    tool_uses_of,
)
from turnkeeper.events import (
    Compacted,
    CompactionFailed,
    DirectiveInjected,
    Envelope,
    Halted,
    MessageReceived,
    ModelResponded,
    ToolCalled,
    ToolReturned,
)
from turnkeeper.guards import GuardView, Verdict, default_guards
from turnkeeper.logs import decode_jsonl, encode_jsonl
from turnkeeper.providers import text_response, tool_response
from turnkeeper.sessions import (
    Resume,
    UserMessage,
    check_response,
    emit,
    normalize,
    open_session,
    poll_turn,
    recheck,
    run,
)
from turnkeeper.state import SessionState, fold, replay

EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

OBJECT = {"type": "object", "properties": {"q": {"type": "integer"}}}
SPEC = AgentSpec(
    system_prompt="Be brief.",
    tools=(
        ToolSpec("search", "", OBJECT),
        ToolSpec("lookup", "", OBJECT),
        ToolSpec("status", "", OBJECT, repeatable=True),
        ToolSpec("finish", "", OBJECT),
    ),
    terminal_tool="finish",
)
NAMES = ["search", "lookup", "status", "finish"]
COMPACTING = msgspec.structs.replace(
    SPEC, compaction=Compaction(budget_tokens=70, keep_recent_turns=2, summary_tokens=8)
)
"""SPEC, its older turns summarised past a budget a few turns reach."""

call = st.tuples(st.sampled_from(NAMES), st.integers(0, 3))
move = st.one_of(
    st.tuples(st.just("calls"), st.lists(call, min_size=1, max_size=3)),
    st.tuples(st.just("text"), st.sampled_from(["done", "working on it", "done"])),
    st.tuples(st.just("bad_args"), st.sampled_from(["{oops", "[1]", '"x"', ""])),
    st.tuples(st.just("malformed"), st.sampled_from(["no_choices", "not_dict", "bad_calls"])),
    st.tuples(st.just("chat_error"), st.booleans()),
    st.tuples(st.just("length"), st.just("")),
)
summary_moves = st.lists(st.sampled_from(["ok", "ok", "empty", "error", "flaky"]), max_size=8)
"""How the model answers the summary requests of a compacting session, in turn (then "ok")."""
configs = st.builds(
    GuardConfig,
    terminal=st.builds(TerminalTool, required=st.booleans(), max_reprompts=st.integers(0, 2)),
)


def response_for(step: tuple[str, Any]) -> Any:
    kind, value = step
    if kind == "calls":
        return tool_response(*[(name, {"q": q}) for name, q in value])
    if kind == "text":
        return text_response(value)
    if kind == "bad_args":
        return tool_response(("search", value))
    if kind == "length":
        return text_response("partial", finish_reason="length")
    if kind == "chat_error":
        raise ChatError("backend hiccup", transient=value, status=503 if value else 400)
    return {
        "no_choices": {"choices": []},
        "not_dict": {"choices": [{"message": ["x"]}]},
        "bad_calls": {"choices": [{"message": {"tool_calls": [{"function": {"name": 5}}]}}]},
    }[value]


def scripted_model(
    steps: list[tuple[str, Any]], summaries: list[str] | None = None
) -> Callable[[dict[str, Any]], Any]:
    """A model playing `steps`, then answering "done" forever; ids unique per call. Asked
    for a summary (a request without tools), it answers as `summaries` says in turn: a
    summary (`ok`), an empty one, or a permanent or transient ChatError."""
    queue = iter(steps)
    ids = itertools.count(1)
    summary_queue = iter(summaries or ())

    async def chat(request: dict[str, Any]) -> Any:
        if not request["tools"]:
            how = next(summary_queue, "ok")
            if how in ("error", "flaky"):
                raise ChatError("no summary", transient=how == "flaky", status=503)
            return text_response("" if how == "empty" else f"summary of {len(request)} things")
        step = next(queue, ("text", "done"))
        response = response_for(step)
        for choice in response.get("choices") or []:
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict):
                for tool_call in message.get("tool_calls") or []:
                    if isinstance(tool_call, dict) and "id" in tool_call:
                        tool_call["id"] = f"c{next(ids)}"
        return response

    return chat


def tool_answer(name: str, arguments: dict[str, Any]) -> ToolResult:
    """Deterministic tool behaviour: lookup fails on odd q, the rest answer by input."""
    q = arguments.get("q")
    if name == "lookup" and isinstance(q, int) and q % 2:
        return ToolResult("", f"lookup {q} failed", is_error=True)
    return ToolResult("", f"{name} says {q}")


class Drive(msgspec.Struct):
    log: list[Envelope]
    state: SessionState
    views: list[tuple[GuardView, Verdict]]


async def drive(
    steps: list[tuple[str, Any]],
    *,
    episodes: int,
    max_turns: int,
    config: GuardConfig,
    crash_after: frozenset[int] = frozenset(),
    spec: AgentSpec = SPEC,
    summaries: list[str] | None = None,
) -> Drive:
    """Play the model through poll_turn over `episodes` user messages, as a host would.
    After the polls numbered in `crash_after`, the live state is dropped and rebuilt
    from the log, as a restart would. `summaries` is how the model answers summary
    requests (see `scripted_model`), for a `spec` that compacts."""
    views: list[tuple[GuardView, Verdict]] = []

    def recording_guard(view: GuardView) -> Verdict:
        verdict = default_guards(view)
        views.append((view, verdict))
        return verdict

    ticks = itertools.count()

    def clock() -> float:
        return 1_000.0 + next(ticks)

    chat = scripted_model(steps, summaries)
    state = open_session(
        spec, session_id="local_00000000000000aa", max_turns=max_turns, guards=config
    )
    log: list[Envelope] = []
    polls = 0
    for episode in range(episodes):
        given: UserMessage | Resume = UserMessage(f"task {episode}")
        for _ in range(200):
            try:
                events, state = await poll_turn(
                    state, given, chat, guard=recording_guard, clock=clock
                )
            except ChatError as error:
                log.extend(error.events)
                state = fold(state, error.events)
                continue
            log.extend(events)
            polls += 1
            if polls in crash_after:
                state = replay(log)
            turn = normalize(events)
            if turn.terminal != "requires_action":
                break
            results = []
            for use in turn.tool_uses:
                answer = tool_answer(use.name, use.input)
                for event in (
                    ToolCalled(tool_call_id=use.id, name=use.name, input=use.input),
                    ToolReturned(tool_call_id=use.id, text=answer.text, is_error=answer.is_error),
                ):
                    envelope, state = emit(state, event, at=clock())
                    log.append(envelope)
                results.append(ToolResult(use.id, answer.text, answer.is_error))
            given = Resume(turn.tool_uses, tuple(results))
        else:
            raise AssertionError("an episode did not end within 200 polls")
    return Drive(log, state, views)


def check_tool_calls_answered(history: tuple[dict[str, Any], ...]) -> None:
    """Every tool call is answered by exactly one tool message before the next assistant
    message, and no tool message answers anything else."""
    open_ids: list[str] | None = None
    answered: list[str] = []
    for message in (*history, {"role": "assistant"}):
        role = message["role"]
        if role == "assistant":
            if open_ids is not None:
                assert sorted(answered) == sorted(open_ids), (open_ids, answered)
            open_ids = [c["id"] for c in message.get("tool_calls") or []]
            answered = []
        elif role == "tool":
            assert open_ids is not None
            assert message["tool_call_id"] in open_ids
            answered.append(message["tool_call_id"])


def model_calls_per_episode(log: list[Envelope]) -> list[int]:
    counts: list[int] = []
    for envelope in log:
        if isinstance(envelope.event, MessageReceived):
            counts.append(0)
        elif isinstance(envelope.event, ModelResponded):
            counts[-1] += 1
    return counts


@EXAMPLES
@given(
    steps=st.lists(move, max_size=25),
    episodes=st.integers(1, 3),
    max_turns=st.integers(1, 8),
    config=configs,
)
def test_generated_sessions_keep_every_invariant(
    steps: list[tuple[str, Any]], episodes: int, max_turns: int, config: GuardConfig
) -> None:
    result = anyio.run(lambda: drive(steps, episodes=episodes, max_turns=max_turns, config=config))
    assert all(count <= max_turns for count in model_calls_per_episode(result.log))
    check_tool_calls_answered(result.state.history)
    assert [e.seq for e in result.log] == list(range(1, len(result.log) + 1))
    assert replay(result.log) == result.state
    assert replay(decode_jsonl(encode_jsonl(result.log)).events) == result.state
    assert recheck(result.log) is None


@EXAMPLES
@given(
    steps=st.lists(move, max_size=20),
    max_turns=st.integers(1, 6),
    crash_after=st.frozensets(st.integers(1, 30), max_size=5),
)
def test_crash_and_rebuild_from_the_log_changes_nothing(
    steps: list[tuple[str, Any]], max_turns: int, crash_after: frozenset[int]
) -> None:
    config = GuardConfig()
    steady = anyio.run(lambda: drive(steps, episodes=2, max_turns=max_turns, config=config))
    crashed = anyio.run(
        lambda: drive(
            steps, episodes=2, max_turns=max_turns, config=config, crash_after=crash_after
        )
    )
    assert crashed.state == steady.state
    assert crashed.log == steady.log
    assert replay(crashed.log) == crashed.state


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(move, max_size=25),
    summaries=summary_moves,
    episodes=st.integers(1, 3),
    max_turns=st.integers(1, 8),
    crash_after=st.frozensets(st.integers(1, 30), max_size=5),
)
def test_compacted_sessions_replay_to_the_live_state_after_crashes_too(
    steps: list[tuple[str, Any]],
    summaries: list[str],
    episodes: int,
    max_turns: int,
    crash_after: frozenset[int],
) -> None:
    def play(crashes: frozenset[int]) -> Drive:
        return anyio.run(
            lambda: drive(
                steps,
                episodes=episodes,
                max_turns=max_turns,
                config=GuardConfig(),
                crash_after=crashes,
                spec=COMPACTING,
                summaries=list(summaries),
            )
        )

    result = play(frozenset())
    assert all(count <= max_turns for count in model_calls_per_episode(result.log))
    check_tool_calls_answered(result.state.history)
    assert [e.seq for e in result.log] == list(range(1, len(result.log) + 1))
    assert replay(result.log) == result.state
    assert replay(decode_jsonl(encode_jsonl(result.log)).events) == result.state
    assert recheck(result.log) is None
    crashed = play(crash_after)
    assert crashed.log == result.log
    assert crashed.state == result.state


def test_a_long_episode_of_the_generated_sessions_is_compacted() -> None:
    steps: list[tuple[str, Any]] = [("calls", [("search", q)]) for q in range(100, 120)]
    result = anyio.run(
        lambda: drive(
            steps, episodes=1, max_turns=30, config=GuardConfig(), spec=COMPACTING, summaries=[]
        )
    )
    assert sum(isinstance(e.event, Compacted) for e in result.log) >= 3
    assert replay(result.log) == result.state
    failing = anyio.run(
        lambda: drive(
            steps,
            episodes=1,
            max_turns=30,
            config=GuardConfig(),
            spec=COMPACTING,
            summaries=["error"],
        )
    )
    assert [type(e.event) for e in failing.log if "compact" in e.type] == [CompactionFailed]


@EXAMPLES
@given(
    name=st.sampled_from(["search", "status", "lookup"]),
    q=st.integers(0, 3),
    max_turns=st.integers(10, 1000),
)
def test_a_model_repeating_one_call_forever_is_stopped_within_three_calls(
    name: str, q: int, max_turns: int
) -> None:
    steps = [("calls", [(name, q)])] * 1000
    result = anyio.run(lambda: drive(steps, episodes=1, max_turns=max_turns, config=GuardConfig()))
    assert model_calls_per_episode(result.log) == [3]
    halts = [e.event for e in result.log if isinstance(e.event, Halted)]
    assert [(h.guard, h.reason) for h in halts] == [("loop", "going_in_circles")]


@EXAMPLES
@given(
    sizes=st.lists(st.integers(1, 3), min_size=1, max_size=15),
    names=st.lists(st.sampled_from(["search", "lookup", "status"]), min_size=45, max_size=45),
    max_turns=st.integers(1, 20),
)
def test_a_model_whose_calls_are_all_distinct_is_never_stopped_by_loop_guards(
    sizes: list[int], names: list[str], max_turns: int
) -> None:
    fresh = itertools.count(100)
    names_iter = iter(names)
    steps: list[tuple[str, Any]] = [
        ("calls", [(next(names_iter), next(fresh)) for _ in range(size)]) for size in sizes
    ]
    result = anyio.run(lambda: drive(steps, episodes=1, max_turns=max_turns, config=GuardConfig()))
    for envelope in result.log:
        event = envelope.event
        assert not (isinstance(event, Halted) and event.guard in ("loop", "self_feeding"))
        assert not (
            isinstance(event, DirectiveInjected) and event.guard in ("loop", "self_feeding")
        )
        assert not isinstance(event, Halted) or event.reason == "max_turns_exceeded"


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(move, max_size=15), max_turns=st.integers(1, 6))
def test_guards_are_pure(steps: list[tuple[str, Any]], max_turns: int) -> None:
    result = anyio.run(lambda: drive(steps, episodes=2, max_turns=max_turns, config=GuardConfig()))
    for view, verdict in result.views:
        assert default_guards(view) == verdict
        assert default_guards(copy.deepcopy(view)) == verdict


@EXAMPLES
@given(
    steps=st.lists(move, max_size=20),
    max_turns=st.integers(1, 10),
    require=st.booleans(),
)
def test_run_never_exceeds_max_turns_and_answers_every_call(
    steps: list[tuple[str, Any]], max_turns: int, require: bool
) -> None:
    async def tools(name: str, args: dict[str, Any], ctx: object) -> str:
        answer = tool_answer(name, args)
        if answer.is_error:
            raise RuntimeError(answer.text)
        return answer.text

    result = anyio.run(
        lambda: run(
            SPEC,
            "go",
            scripted_model(steps),
            tools=tools,
            max_turns=max_turns,
            require_terminal_tool=require,
        )
    )
    assert result.turns <= max_turns
    assert sum(model_calls_per_episode(list(result.events))) == result.turns
    if result.terminal != "requires_action":
        check_tool_calls_answered(result.transcript)
    assert replay(result.events) == result.state
    assert recheck(result.events) is None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=2000))
def test_any_bytes_as_a_log_raise_only_log_errors(data: bytes) -> None:
    with contextlib.suppress(LogError):
        decode_jsonl(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
envelope_like = st.fixed_dictionaries(
    {
        "session_id": st.sampled_from(["s", "", 3]),
        "seq": st.sampled_from([1, 2, 0, -1, "1"]),
        "at": st.sampled_from([0.0, 1, "x"]),
        "event": st.fixed_dictionaries(
            {
                "type": st.sampled_from(
                    [
                        "local.user_message",
                        "local.model_response",
                        "local.tool_results",
                        "local.session_opened",
                        "x",
                    ]
                )
            },
            optional={
                "text": json_values,
                "response": json_values,
                "message": json_values,
                "results": json_values,
                "spec": json_values,
                "usage": json_values,
                "finish_reason": json_values,
                "history": json_values,
            },
        ),
    }
)


@settings(max_examples=500, deadline=None)
@given(st.lists(envelope_like, max_size=4))
def test_envelope_shaped_json_raises_only_turnkeeper_errors(lines: list[Any]) -> None:
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    with contextlib.suppress(TurnkeeperError):
        replay(decode_jsonl(data).events)


@settings(max_examples=500, deadline=None)
@given(
    json_values
    | st.fixed_dictionaries(
        {
            "choices": st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "message": json_values
                        | st.fixed_dictionaries(
                            {},
                            optional={
                                "content": json_values,
                                "tool_calls": json_values,
                                "role": json_values,
                            },
                        ),
                        "finish_reason": json_values,
                    },
                ),
                max_size=2,
            )
        }
    )
)
def test_any_model_response_raises_only_chat_errors(response: Any) -> None:
    try:
        message, _, _ = check_response(response, call_prefix="call_1")
    except ChatError as error:
        failure = error
    else:
        text_of(message)
        tool_uses_of(message)
        return
    assert failure.message.startswith("malformed response")


def test_model_strategy_reaches_every_kind_of_move() -> None:
    kinds: set[str] = set()

    @settings(max_examples=300, deadline=None)
    @given(move)
    def collect(step: tuple[str, Any]) -> None:
        kinds.add(step[0])

    collect()
    assert kinds == {"calls", "text", "bad_args", "malformed", "chat_error", "length"}


@pytest.mark.parametrize("repeatable", [True, False])
def test_repeated_identical_text_under_reprompts_is_stopped(repeatable: bool) -> None:
    config = GuardConfig(terminal=TerminalTool(required=True, max_reprompts=5))
    result = anyio.run(
        lambda: drive([("text", "same")] * 50, episodes=1, max_turns=50, config=config)
    )
    halts = [e.event for e in result.log if isinstance(e.event, Halted)]
    assert [h.reason for h in halts] == ["going_in_circles"]
    assert model_calls_per_episode(result.log) == [3]
