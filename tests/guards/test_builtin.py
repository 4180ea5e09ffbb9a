"""The built-in guards, each called directly as the pure function it is.

End-to-end behaviour through poll_turn and run is in tests/sessions; here every guard
gets hand-built views at and around its thresholds.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import (
    AgentSpec,
    Message,
    ToolResult,
    ToolSpec,
    ToolUse,
    Usage,
    call_key,
    duplicate_content,
    gist,
    tool_uses_of,
)
from turnkeeper.guards import (
    CONTINUE,
    Budget,
    ConsecutiveErrors,
    Guard,
    GuardConfig,
    GuardView,
    LoopDetection,
    Phase,
    Reply,
    SelfFeeding,
    TerminalTool,
    Verdict,
    budget,
    consecutive_errors,
    default_guards,
    duplicate_calls,
    final_turn,
    loop_detection,
    max_turns,
    repair,
    self_feeding,
    terminal_tool,
    typed_output,
)
from turnkeeper.sessions import open_session
from turnkeeper.state import SessionState

SEARCH = ToolSpec(
    "search",
    "Search the web",
    {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)
STATUS = ToolSpec("status", "Poll a job's status", repeatable=True)
FINISH = ToolSpec(
    "finish",
    "Give the final answer",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)
SPEC = AgentSpec(system_prompt="Be brief.", tools=(SEARCH, STATUS, FINISH), terminal_tool="finish")
PLAIN = AgentSpec(system_prompt="Be brief.", tools=(SEARCH, STATUS))
# A terminal tool whose schema accepts any object, so only a bad-arguments `error` can stop it.
LAX = AgentSpec(tools=(SEARCH, ToolSpec("finish")), terminal_tool="finish")


def session(
    spec: AgentSpec = SPEC,
    *,
    turns: int = 50,
    guards: GuardConfig | None = None,
    **changes: Any,
) -> SessionState:
    state = open_session(spec, session_id="local_0123456789abcdef", max_turns=turns, guards=guards)
    return msgspec.structs.replace(state, **changes) if changes else state


def reply(*calls: ToolUse, text: str | None = None, finish_reason: str | None = None) -> Reply:
    message: Message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": msgspec.json.encode(c.input).decode()},
            }
            for c in calls
        ]
    reason = finish_reason or ("tool_calls" if calls else "stop")
    return Reply(message, text, calls, reason, Usage(10, 5))


def before(
    state: SessionState,
    *,
    now: float = 0.0,
    results: tuple[tuple[ToolUse, ToolResult], ...] = (),
) -> GuardView:
    return GuardView("before_call", state, now, results=results)


def after(state: SessionState, answer: Reply, *, now: float = 0.0) -> GuardView:
    return GuardView("after_response", state, now, reply=answer)


def failed(use: ToolUse, text: str) -> tuple[ToolUse, ToolResult]:
    return (use, ToolResult(use.id, text, is_error=True))


def tool_answer(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


Q_A = ToolUse("c1", "search", {"q": "a"})
ANSWER = ToolUse("f1", "finish", {"answer": "42"})


def feeding_chain(links: int) -> GuardView:
    """The view after a chain of `search` calls each taking the last one's result."""
    history: list[Message] = [{"role": "user", "content": "go"}]
    results: tuple[tuple[ToolUse, ToolResult], ...] = ()
    for step in range(links + 1):
        use = ToolUse(f"c{step}", "search", {"q": f"r{step - 1}" if step else "start"})
        history += [reply(use).message, tool_answer(use.id, f"r{step}")]
        results = ((use, ToolResult(use.id, f"r{step}")),)
    return before(session(history=tuple(history), polls=links + 1), results=results)


# For each guard: the GuardConfig field that turns it off, and a view on which it acts.
ACTING: dict[str, tuple[Guard, str, GuardView]] = {
    "max_turns": (max_turns, "max_turns", before(session(turns=3, polls=3))),
    "final_turn": (final_turn, "final_turn", before(session(turns=3, polls=2))),
    "duplicate_calls": (
        duplicate_calls,
        "duplicates",
        after(session(seen=frozenset({call_key("search", {"q": "a"})})), reply(Q_A)),
    ),
    "consecutive_errors": (
        consecutive_errors,
        "consecutive_errors",
        before(session(error_counts={"search": 2}), results=(failed(Q_A, "boom"),)),
    ),
    "loop_detection": (loop_detection, "loop", before(session(repeats=1))),
    "self_feeding": (self_feeding, "self_feeding", feeding_chain(3)),
    "repair": (repair, "repair", after(session(), reply(text="cut", finish_reason="length"))),
    "terminal_tool": (terminal_tool, "terminal", after(session(), reply(ANSWER))),
    "typed_output": (
        typed_output,
        "output",
        after(session(AgentSpec(output_schema={"type": "object"})), reply(text="no")),
    ),
    "budget": (
        budget,
        "budget",
        before(
            session(guards=GuardConfig(budget=Budget(max_tokens=10)), episode_usage=Usage(10, 0))
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(ACTING))
def test_each_guard_acts_only_in_its_phase(name: str) -> None:
    guard, _, view = ACTING[name]
    assert guard(view) != CONTINUE
    other: Phase = "after_response" if view.phase == "before_call" else "before_call"
    # Keep a reply in the view, so only the phase differs from what the guard needs.
    moved = msgspec.structs.replace(view, phase=other, reply=view.reply or reply(text="hi"))
    assert guard(moved) == CONTINUE


@pytest.mark.parametrize("name", sorted(ACTING))
def test_each_guard_does_nothing_when_turned_off(name: str) -> None:
    guard, field, view = ACTING[name]
    assert guard(view) != CONTINUE
    config = msgspec.structs.replace(view.state.guards, **{field: None})
    off = msgspec.structs.replace(view, state=msgspec.structs.replace(view.state, guards=config))
    assert guard(off) == CONTINUE


def test_default_config_has_no_budget() -> None:
    state = session(episode_usage=Usage(10**9, 10**9), episode_started=0.0)
    assert budget(before(state, now=10.0**9)) == CONTINUE


# max turns


def test_max_turns_allows_the_last_poll_and_halts_the_one_after() -> None:
    assert max_turns(before(session(turns=3, polls=2))) == CONTINUE
    verdict = max_turns(before(session(turns=3, polls=3)))
    assert verdict.halt is not None
    assert (verdict.halt.guard, verdict.halt.reason) == ("max_turns", "max_turns_exceeded")
    assert "3 model calls" in verdict.halt.message
    assert (verdict.directives, verdict.self_answers, verdict.finish) == ((), (), None)
    assert max_turns(before(session(turns=3, polls=7))).halt is not None


def test_max_turns_of_one_allows_exactly_one_poll() -> None:
    assert max_turns(before(session(turns=1, polls=0))) == CONTINUE
    assert max_turns(before(session(turns=1, polls=1))).halt is not None


# final turn


@pytest.mark.parametrize(("turns", "polls"), [(3, 2), (1, 0), (50, 49)])
def test_final_turn_directive_on_the_last_allowed_poll(turns: int, polls: int) -> None:
    verdict = final_turn(before(session(turns=turns, polls=polls)))
    assert len(verdict.directives) == 1
    assert verdict.directives[0].guard == "final_turn"
    assert verdict.halt is None


@pytest.mark.parametrize("polls", [0, 1, 3, 4])
def test_final_turn_is_silent_on_other_polls(polls: int) -> None:
    assert final_turn(before(session(turns=3, polls=polls))) == CONTINUE


def test_final_turn_names_the_terminal_tool() -> None:
    (directive,) = final_turn(before(session(SPEC, turns=2, polls=1))).directives
    assert "`finish`" in directive.text
    assert "do not call any more tools" not in directive.text


def test_final_turn_without_terminal_tool_says_not_to_call_tools() -> None:
    (directive,) = final_turn(before(session(PLAIN, turns=2, polls=1))).directives
    assert "do not call any more tools" in directive.text
    assert "finish" in directive.text.lower()
    assert "`" not in directive.text


# duplicate calls


def test_duplicate_within_one_reply_answers_only_the_repeat() -> None:
    first = ToolUse("c1", "search", {"q": "a"})
    again = ToolUse("c2", "search", {"q": "a"})
    other = ToolUse("c3", "search", {"q": "b"})
    verdict = duplicate_calls(after(session(), reply(first, other, again)))
    (answer,) = verdict.self_answers
    assert (answer.tool_call_id, answer.name, answer.arguments) == ("c2", "search", '{"q":"a"}')
    assert "search" in answer.message
    assert (verdict.directives, verdict.halt, verdict.finish) == ((), None, None)


def test_duplicate_against_calls_seen_earlier_in_the_episode() -> None:
    state = session(seen=frozenset({call_key("search", {"q": "a"})}))
    fresh = ToolUse("c2", "search", {"q": "b"})
    verdict = duplicate_calls(after(state, reply(fresh, Q_A)))
    assert [a.tool_call_id for a in verdict.self_answers] == ["c1"]


def test_same_arguments_under_another_tool_name_are_not_a_duplicate() -> None:
    state = session(seen=frozenset({call_key("status", {"q": "a"})}))
    assert duplicate_calls(after(state, reply(Q_A))) == CONTINUE


def test_every_further_repeat_in_a_reply_is_answered() -> None:
    calls = [ToolUse(f"c{i}", "search", {"q": "a"}) for i in range(4)]
    verdict = duplicate_calls(after(session(), reply(*calls)))
    assert [a.tool_call_id for a in verdict.self_answers] == ["c1", "c2", "c3"]


def test_repeatable_tool_is_never_self_answered() -> None:
    state = session(seen=frozenset({call_key("status", {})}))
    calls = (ToolUse("s1", "status", {}), ToolUse("s2", "status", {}))
    assert duplicate_calls(after(state, reply(*calls))) == CONTINUE


def test_calls_with_bad_arguments_are_neither_answered_nor_remembered() -> None:
    state = session(seen=frozenset({call_key("search", {})}))
    bad = ToolUse("c1", "search", {}, error="arguments are not valid JSON")
    worse = ToolUse("c2", "search", {}, error="arguments are not valid JSON")
    assert duplicate_calls(after(state, reply(bad, worse))) == CONTINUE
    # A bad call does not make the same call with good (empty) arguments a repeat.
    good = ToolUse("c3", "search", {})
    assert duplicate_calls(after(session(), reply(bad, good))) == CONTINUE


def test_text_reply_has_no_duplicates() -> None:
    state = session(seen=frozenset({call_key("search", {"q": "a"})}))
    assert duplicate_calls(after(state, reply(text="done"))) == CONTINUE


# consecutive errors


def test_consecutive_errors_fire_at_the_threshold_naming_tool_and_error() -> None:
    state = session(error_counts={"search": 2})
    result = failed(Q_A, "HTTP 503 from\n   the search backend")
    verdict = consecutive_errors(before(state, results=(result,)))
    (directive,) = verdict.directives
    assert directive.guard == "consecutive_errors"
    assert "`search`" in directive.text
    assert "2 times" in directive.text
    assert "HTTP 503 from the search backend" in directive.text


def test_consecutive_errors_are_silent_below_the_threshold() -> None:
    state = session(error_counts={"search": 1})
    assert consecutive_errors(before(state, results=(failed(Q_A, "boom"),))) == CONTINUE


def test_consecutive_errors_ignore_a_success() -> None:
    ok = (Q_A, ToolResult("c1", "found it"))
    assert consecutive_errors(before(session(error_counts={}), results=(ok,))) == CONTINUE
    # Counts of another tool do not make this tool's success a failure.
    state = session(error_counts={"status": 5})
    assert consecutive_errors(before(state, results=(ok,))) == CONTINUE


def test_consecutive_errors_name_a_tool_once_per_poll() -> None:
    state = session(error_counts={"search": 3, "status": 2})
    results = (
        failed(ToolUse("c1", "search", {"q": "a"}), "first"),
        failed(ToolUse("s1", "status", {}), "down"),
        failed(ToolUse("c2", "search", {"q": "b"}), "second"),
    )
    directives = consecutive_errors(before(state, results=results)).directives
    assert len(directives) == 2
    assert "`search`" in directives[0].text
    assert "first" in directives[0].text
    assert "3 times" in directives[0].text
    assert "`status`" in directives[1].text
    assert "down" in directives[1].text


@pytest.mark.parametrize(
    ("threshold", "count", "fires"), [(3, 2, False), (3, 3, True), (1, 1, True)]
)
def test_consecutive_errors_threshold_is_configurable(
    threshold: int, count: int, fires: bool
) -> None:
    config = GuardConfig(consecutive_errors=ConsecutiveErrors(threshold=threshold))
    state = session(guards=config, error_counts={"search": count})
    verdict = consecutive_errors(before(state, results=(failed(Q_A, "boom"),)))
    assert bool(verdict.directives) is fires
    if fires:
        assert f"{count} times" in verdict.directives[0].text


# loop detection


def test_loop_warns_on_the_first_repeat_naming_it() -> None:
    state = session(repeats=1, last_repeat='search({"q":"a"})')
    (directive,) = loop_detection(before(state)).directives
    assert directive.guard == "loop"
    assert 'search({"q":"a"})' in directive.text


def test_loop_without_a_named_repeat_says_a_call() -> None:
    (directive,) = loop_detection(before(session(repeats=1))).directives
    assert "a call" in directive.text


def test_loop_halts_at_the_next_repeat_after_a_warning() -> None:
    warned = session(repeats=1, warned_repeats=1, warnings=1, last_repeat="the same reply")
    assert loop_detection(before(warned)) == CONTINUE
    verdict = loop_detection(before(msgspec.structs.replace(warned, repeats=2)))
    assert verdict.halt is not None
    assert (verdict.halt.guard, verdict.halt.reason) == ("loop", "going_in_circles")
    assert "the same reply" in verdict.halt.message
    assert verdict.directives == ()


@pytest.mark.parametrize(("repeats", "warned"), [(0, 0), (1, 1), (2, 3)])
def test_loop_does_nothing_without_a_new_repeat(repeats: int, warned: int) -> None:
    state = session(repeats=repeats, warned_repeats=warned, warnings=0)
    assert loop_detection(before(state)) == CONTINUE


@pytest.mark.parametrize("warnings", [0, 1, 2, 3])
def test_loop_warns_as_often_as_configured_then_halts(warnings: int) -> None:
    state = session(guards=GuardConfig(loop=LoopDetection(warnings=warnings)))
    outcomes: list[str] = []
    for repeats in range(1, 10):
        state = msgspec.structs.replace(state, repeats=repeats)
        verdict = loop_detection(before(state))
        if verdict.halt is not None:
            outcomes.append("halt")
            break
        assert [d.guard for d in verdict.directives] == ["loop"]
        outcomes.append("warn")
        # What folding the logged directive does to the state.
        state = msgspec.structs.replace(
            state, warnings=state.warnings + 1, warned_repeats=state.repeats
        )
    assert outcomes == ["warn"] * warnings + ["halt"]


# terminal tool


def test_valid_terminal_call_finishes_with_that_call() -> None:
    assert terminal_tool(after(session(), reply(ANSWER))) == Verdict(finish=ANSWER)
    search = ToolUse("c1", "search", {"q": "a"})
    assert terminal_tool(after(session(), reply(search, ANSWER))).finish == ANSWER


def test_terminal_call_invalid_by_schema_does_not_finish() -> None:
    invalid = ToolUse("f1", "finish", {"answer": 42})
    assert terminal_tool(after(session(), reply(invalid))) == CONTINUE
    missing = ToolUse("f1", "finish", {})
    assert terminal_tool(after(session(), reply(missing))) == CONTINUE


def test_first_valid_terminal_call_of_several_wins() -> None:
    invalid = ToolUse("f1", "finish", {})
    valid = ToolUse("f2", "finish", {"answer": "yes"})
    later = ToolUse("f3", "finish", {"answer": "no"})
    assert terminal_tool(after(session(), reply(invalid, valid, later))).finish == valid


def test_malformed_terminal_call_does_not_finish() -> None:
    fine = ToolUse("f1", "finish", {})
    assert terminal_tool(after(session(LAX), reply(fine))).finish == fine
    malformed = ToolUse("f1", "finish", {}, error="arguments are not valid JSON")
    assert terminal_tool(after(session(LAX), reply(malformed))) == CONTINUE


def required(reprompts: int = 0, max_reprompts: int = 2, **changes: Any) -> SessionState:
    config = GuardConfig(terminal=TerminalTool(required=True, max_reprompts=max_reprompts))
    return session(guards=config, reprompts=reprompts, **changes)


@pytest.mark.parametrize("reprompts", [0, 1])
def test_required_terminal_tool_reprompts_a_plain_answer(reprompts: int) -> None:
    verdict = terminal_tool(after(required(reprompts), reply(text="It is 42.")))
    (directive,) = verdict.directives
    assert directive.guard == "terminal"
    assert "`finish`" in directive.text
    assert verdict.halt is None


def test_required_terminal_tool_halts_after_max_reprompts() -> None:
    verdict = terminal_tool(after(required(2), reply(text="It is\n 42.")))
    assert verdict.halt is not None
    assert (verdict.halt.guard, verdict.halt.reason) == ("terminal", "no_terminal_tool")
    assert "`finish`" in verdict.halt.message
    assert "2 reminders" in verdict.halt.message
    assert "It is 42." in verdict.halt.message
    assert verdict.directives == ()


def test_required_terminal_tool_with_no_reprompts_halts_at_once() -> None:
    verdict = terminal_tool(after(required(0, max_reprompts=0), reply(text="42")))
    assert verdict.halt is not None
    assert verdict.halt.reason == "no_terminal_tool"


@pytest.mark.parametrize("max_reprompts", [0, 1, 2, 5])
def test_required_terminal_tool_reprompts_exactly_max_reprompts_times(max_reprompts: int) -> None:
    state = required(max_reprompts=max_reprompts)
    outcomes: list[str] = []
    while len(outcomes) <= max_reprompts + 1:
        verdict = terminal_tool(after(state, reply(text="plain")))
        if verdict.halt is not None:
            outcomes.append("halt")
            break
        outcomes.append("reprompt")
        state = msgspec.structs.replace(state, reprompts=state.reprompts + 1)
    assert outcomes == ["reprompt"] * max_reprompts + ["halt"]


def test_terminal_tool_not_required_lets_a_plain_answer_end() -> None:
    assert terminal_tool(after(session(reprompts=9), reply(text="42"))) == CONTINUE


def test_required_terminal_tool_leaves_a_cut_off_reply_alone() -> None:
    verdict = terminal_tool(after(required(2), reply(text="It is", finish_reason="length")))
    assert verdict == CONTINUE


def test_required_terminal_tool_leaves_other_tool_calls_alone() -> None:
    assert terminal_tool(after(required(2), reply(Q_A))) == CONTINUE
    invalid = ToolUse("f1", "finish", {})
    assert terminal_tool(after(required(2), reply(invalid))) == CONTINUE


def test_terminal_tool_guard_needs_a_terminal_tool_in_the_spec() -> None:
    finish_like = ToolUse("f1", "finish", {"answer": "x"})
    assert terminal_tool(after(session(PLAIN), reply(finish_like))) == CONTINUE
    assert terminal_tool(after(session(PLAIN), reply(text="done"))) == CONTINUE


# budget


def with_budget(**changes: Any) -> SessionState:
    config = GuardConfig(budget=Budget(max_tokens=100, max_seconds=30.0))
    return session(guards=config, **changes)


def test_budget_halts_at_the_token_limit() -> None:
    assert budget(before(with_budget(episode_usage=Usage(60, 39)))) == CONTINUE
    verdict = budget(before(with_budget(episode_usage=Usage(60, 40))))
    assert verdict.halt is not None
    assert (verdict.halt.guard, verdict.halt.reason) == ("budget", "budget_exceeded")
    assert "100 tokens" in verdict.halt.message
    assert "budget is 100" in verdict.halt.message


def test_budget_counts_the_episode_not_the_session() -> None:
    state = with_budget(usage=Usage(5000, 5000), episode_usage=Usage(1, 1))
    assert budget(before(state)) == CONTINUE


def test_budget_halts_at_the_time_limit_measured_from_the_view() -> None:
    # `now` is far from the real clock: a guard reading the clock would halt both.
    state = with_budget(episode_started=1000.0)
    assert budget(before(state, now=1029.9)) == CONTINUE
    verdict = budget(before(state, now=1030.0))
    assert verdict.halt is not None
    assert verdict.halt.reason == "budget_exceeded"
    assert "30.0 s" in verdict.halt.message
    assert "budget is 30 s" in verdict.halt.message


def test_budget_time_limit_needs_an_episode_start() -> None:
    assert budget(before(with_budget(episode_started=None), now=10.0**12)) == CONTINUE


@pytest.mark.parametrize(
    ("limits", "usage", "now", "halts"),
    [
        (Budget(max_tokens=5), Usage(9, 9), 10.0**9, True),
        (Budget(max_tokens=50), Usage(9, 9), 10.0**9, False),
        (Budget(max_seconds=1.5), Usage(10**6, 0), 1.5, True),
        (Budget(max_seconds=1.5), Usage(10**6, 0), 1.4, False),
        (Budget(), Usage(10**6, 0), 10.0**9, False),
    ],
)
def test_budget_checks_only_the_limits_that_are_set(
    limits: Budget, usage: Usage, now: float, halts: bool
) -> None:
    state = session(guards=GuardConfig(budget=limits), episode_usage=usage, episode_started=0.0)
    assert (budget(before(state, now=now)).halt is not None) is halts


# halt messages carry the gist of the last tool result

HISTORY: tuple[Message, ...] = (
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "go"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "{}"}},
        ],
    },
    tool_answer("c1", "Paris is the capital\n   of France."),
    tool_answer("c2", duplicate_content("already answered")),
)

HALTING: dict[str, tuple[Guard, GuardConfig, dict[str, Any]]] = {
    "max_turns": (max_turns, GuardConfig(), {"polls": 50}),
    "loop": (loop_detection, GuardConfig(), {"repeats": 2, "warned_repeats": 1, "warnings": 1}),
    "budget": (
        budget,
        GuardConfig(budget=Budget(max_tokens=1)),
        {"episode_usage": Usage(1, 0)},
    ),
}


@pytest.mark.parametrize("name", sorted(HALTING))
def test_halt_message_leads_with_the_last_real_tool_result(name: str) -> None:
    guard, config, changes = HALTING[name]
    bare = guard(before(session(guards=config, **changes)))
    assert bare.halt is not None
    assert "Paris" not in bare.halt.message
    verdict = guard(before(session(guards=config, history=HISTORY, **changes)))
    assert verdict.halt is not None
    assert verdict.halt.message == f"Paris is the capital of France.\n\n{bare.halt.message}"


@pytest.mark.parametrize("name", sorted(HALTING))
def test_halt_message_prefers_a_result_that_has_not_reached_the_model(name: str) -> None:
    guard, config, changes = HALTING[name]
    returned = (ToolResult("c8", "older"), ToolResult("c9", "Lyon,\nnot Paris"))
    state = session(guards=config, history=HISTORY, returned=returned, **changes)
    verdict = guard(before(state))
    assert verdict.halt is not None
    assert verdict.halt.message.startswith("Lyon, not Paris\n\n")


def test_halt_message_cuts_a_long_result_to_its_gist() -> None:
    long = "word " * 500
    history = (*HISTORY[:3], tool_answer("c1", long))
    verdict = max_turns(before(session(history=history, polls=50)))
    assert verdict.halt is not None
    assert verdict.halt.message.startswith(gist(long) + "\n\n")
    assert len(verdict.halt.message) < 500


def test_no_terminal_tool_halt_carries_the_last_tool_result() -> None:
    state = required(2, history=HISTORY)
    verdict = terminal_tool(after(state, reply(text="no idea")))
    assert verdict.halt is not None
    assert verdict.halt.message.startswith("Paris is the capital of France.\n\n")
    assert "no idea" in verdict.halt.message


# purity


names = st.sampled_from(["search", "status", "finish", "other"])
args = st.dictionaries(
    st.sampled_from(["q", "answer", "n"]), st.integers(0, 2) | st.text(max_size=3)
)
uses = st.builds(
    ToolUse,
    id=st.text("abc123", min_size=1, max_size=4),
    name=names,
    input=args,
    error=st.none() | st.just("arguments are not valid JSON"),
)
results = st.lists(
    st.tuples(uses, st.text(max_size=20), st.booleans()).map(
        lambda t: (t[0], ToolResult(t[0].id, t[1], t[2]))
    ),
    max_size=4,
).map(tuple)
replies = st.builds(
    lambda calls, text, reason: reply(*calls, text=text, finish_reason=reason),
    st.lists(uses, max_size=4),
    st.none() | st.text(max_size=20),
    st.sampled_from(["stop", "length", "tool_calls"]),
)
configs = st.builds(
    GuardConfig,
    max_turns=st.sampled_from([None, GuardConfig().max_turns]),
    final_turn=st.sampled_from([None, GuardConfig().final_turn]),
    duplicates=st.sampled_from([None, GuardConfig().duplicates]),
    consecutive_errors=st.none() | st.builds(ConsecutiveErrors, threshold=st.integers(1, 4)),
    loop=st.none() | st.builds(LoopDetection, warnings=st.integers(0, 3)),
    self_feeding=st.none()
    | st.builds(SelfFeeding, max_links=st.integers(1, 3), warnings=st.integers(0, 2)),
    terminal=st.none()
    | st.builds(TerminalTool, required=st.booleans(), max_reprompts=st.integers(0, 3)),
    budget=st.none()
    | st.builds(
        Budget,
        max_tokens=st.none() | st.integers(1, 200),
        max_seconds=st.none() | st.floats(0, 100, exclude_min=True),
    ),
)


@st.composite
def views(draw: st.DrawFn) -> GuardView:
    turns = draw(st.integers(1, 6))
    repeats = draw(st.integers(0, 4))
    spec = draw(st.sampled_from([SPEC, PLAIN, LAX]))
    config = draw(configs)
    if spec.terminal_tool is None and config.terminal is not None and config.terminal.required:
        config = msgspec.structs.replace(config, terminal=TerminalTool())
    state = session(
        spec,
        turns=turns,
        guards=config,
        history=draw(st.sampled_from([(), HISTORY])),
        polls=draw(st.integers(0, turns + 1)),
        repeats=repeats,
        warned_repeats=draw(st.integers(0, repeats + 1)),
        warnings=draw(st.integers(0, 4)),
        last_repeat=draw(st.none() | st.text(max_size=10)),
        error_counts=draw(st.dictionaries(names, st.integers(0, 4))),
        episode_usage=draw(st.builds(Usage, st.integers(0, 150), st.integers(0, 150))),
        episode_started=draw(st.none() | st.floats(0, 50)),
        reprompts=draw(st.integers(0, 4)),
        seen=draw(st.frozensets(uses.map(lambda u: call_key(u.name, u.input)), max_size=4)),
        returned=draw(st.lists(st.builds(ToolResult, st.just("r"), st.text(max_size=10)))),
    )
    phase: Phase = draw(st.sampled_from(["before_call", "after_response"]))
    answer = draw(replies) if phase == "after_response" else None
    return GuardView(phase, state, draw(st.floats(0, 200)), draw(results), answer)


GUARDS: list[Guard] = [
    max_turns,
    self_feeding,
    repair,
    final_turn,
    duplicate_calls,
    consecutive_errors,
    loop_detection,
    terminal_tool,
    budget,
    default_guards,
]


@settings(max_examples=200, deadline=None)
@given(view=views())
def test_every_guard_gives_the_same_verdict_for_the_same_view(view: GuardView) -> None:
    snapshot = copy.deepcopy(view)
    for guard in GUARDS:
        verdict = guard(view)
        assert isinstance(verdict, Verdict)
        assert guard(copy.deepcopy(view)) == verdict
        assert guard(view) == verdict
    assert view == snapshot


def test_repair_halts_with_an_apology_at_the_second_bad_reply_in_a_row() -> None:
    from turnkeeper.guards import repair

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    spec = AgentSpec(tools=(ToolSpec("add", "", schema),))
    start = open_session(spec)
    start = msgspec.structs.replace(
        start, history=(*start.history, {"role": "user", "content": "go"}), request="go"
    )

    def after(*calls: tuple[str, str]) -> Any:
        message = {
            "role": "assistant",
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": "add", "arguments": a}}
                for i, a in calls
            ],
        }
        return msgspec.structs.replace(
            start, history=(*start.history, message), reply_calls=tool_uses_of(message)
        )

    def reply(arguments: dict[str, Any], unreadable: bool = False) -> Reply:
        uses = (ToolUse("c9", "add", arguments),) if not unreadable else ()
        return Reply({"role": "assistant"}, None, uses, "tool_calls", Usage(), unreadable)

    bad_then = after(("c1", '{"a": "x"}'))
    good_then = after(("c1", '{"a": 1}'))
    assert repair(GuardView("after_response", start, 0.0, reply=reply({"a": "x"}))) is CONTINUE
    assert repair(GuardView("after_response", good_then, 0.0, reply=reply({"a": "x"}))) is CONTINUE
    assert repair(GuardView("after_response", bad_then, 0.0, reply=reply({"a": "3"}))) is CONTINUE
    verdict = repair(GuardView("after_response", bad_then, 0.0, reply=reply({"a": "x"})))
    assert verdict.halt is not None
    assert (verdict.halt.guard, verdict.halt.reason) == ("repair", "bad_tool_calls")
    assert verdict.halt.message.startswith("I'm sorry: I could not make a valid tool call")
    assert "$.a" in verdict.halt.message
    unreadable = repair(GuardView("after_response", bad_then, 0.0, reply=reply({}, True)))
    assert unreadable.halt is not None
    off = msgspec.structs.replace(bad_then, guards=GuardConfig(repair=None))
    assert repair(GuardView("after_response", off, 0.0, reply=reply({"a": "x"}))) is CONTINUE


@pytest.mark.parametrize(
    ("links", "acts"), [(1, None), (2, None), (3, "directive"), (4, "halt"), (5, "halt")]
)
def test_self_feeding_warns_past_max_links_then_halts(links: int, acts: str | None) -> None:
    view = feeding_chain(links)
    # Without the answer after the stop, which needs no warning first (below).
    off = GuardConfig(self_feeding=SelfFeeding(answer=False))
    verdict = self_feeding(
        msgspec.structs.replace(view, state=msgspec.structs.replace(view.state, guards=off))
    )
    if links == 3:
        answered = self_feeding(view).halt
        assert answered is not None
        assert answered.reason == "feeding_on_results"
    if acts is None:
        assert verdict is CONTINUE
    elif acts == "directive":
        assert [d.guard for d in verdict.directives] == ["self_feeding"]
    else:
        assert verdict.halt is not None
        assert (verdict.halt.guard, verdict.halt.reason) == ("self_feeding", "feeding_on_results")

    if links == 4:
        # A chain halts when it first gets this long: its first call, the one made from
        # the request, is then the oldest the guard reads, and the halt leads with its result.
        assert verdict.halt is not None
        assert verdict.halt.message.startswith("r0\n\n")


def test_self_feeding_counts_only_the_episodes_replies() -> None:
    view = feeding_chain(4)
    assert self_feeding(view).halt is not None
    fewer = msgspec.structs.replace(view, state=msgspec.structs.replace(view.state, polls=3))
    assert self_feeding(fewer).halt is None


def test_self_feeding_judges_only_right_after_a_tool_step() -> None:
    view = feeding_chain(4)
    assert self_feeding(msgspec.structs.replace(view, results=())) is CONTINUE
