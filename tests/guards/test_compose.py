"""compose: order, accumulation, short-circuits, and custom guards next to the defaults."""

from __future__ import annotations

import functools

import msgspec

from turnkeeper.core import AgentSpec, GuardConfig, ToolSpec, ToolUse, Usage, call_key
from turnkeeper.guards import (
    CONTINUE,
    Directive,
    Guard,
    GuardView,
    Halt,
    Phase,
    Reply,
    SelfAnswer,
    Verdict,
    budget,
    compose,
    consecutive_errors,
    correct_reply,
    cost_budget,
    default_guards,
    duplicate_calls,
    final_turn,
    loop_detection,
    max_turns,
    repair,
    restate_request,
    resume_next_step,
    self_feeding,
    terminal_tool,
    typed_output,
)
from turnkeeper.guards._view import acts_in, phases_of, setting_of
from turnkeeper.sessions import open_session
from turnkeeper.state import SessionState

SPEC = AgentSpec(tools=(ToolSpec("search"), ToolSpec("finish")), terminal_tool="finish")


def session(**changes: object) -> SessionState:
    state = open_session(SPEC, session_id="local_0123456789abcdef", max_turns=3)
    return msgspec.structs.replace(state, **changes)


VIEW = GuardView("before_call", session(), 0.0)


class Recorder:
    """A guard that records every view it sees and answers with a fixed verdict."""

    def __init__(self, verdict: Verdict = CONTINUE) -> None:
        self.verdict = verdict
        self.seen: list[GuardView] = []

    def __call__(self, view: GuardView) -> Verdict:
        self.seen.append(view)
        return self.verdict


def directs(text: str) -> Recorder:
    return Recorder(Verdict(directives=(Directive("custom", text),)))


def answers(call_id: str) -> Recorder:
    return Recorder(Verdict(self_answers=(SelfAnswer(call_id, "search", "{}", "seen"),)))


def halts(reason: str, *, answer: str | None = None) -> Recorder:
    extra = (SelfAnswer(answer, "search", "{}", "seen"),) if answer else ()
    return Recorder(Verdict(self_answers=extra, halt=Halt("custom", reason, f"stopped: {reason}")))


def test_guards_run_in_order_and_directives_keep_it() -> None:
    first, second, third = directs("one"), directs("two"), directs("three")
    verdict = compose(first, second, third)(VIEW)
    assert [d.text for d in verdict.directives] == ["one", "two", "three"]
    backwards = compose(third, second, first)(VIEW)
    assert [d.text for d in backwards.directives] == ["three", "two", "one"]
    assert first.seen == second.seen == third.seen == [VIEW, VIEW]


def test_directives_and_self_answers_accumulate() -> None:
    verdict = compose(answers("a"), directs("one"), Recorder(), answers("b"), directs("two"))(VIEW)
    assert [a.tool_call_id for a in verdict.self_answers] == ["a", "b"]
    assert [d.text for d in verdict.directives] == ["one", "two"]
    assert (verdict.halt, verdict.finish) == (None, None)


def test_a_halt_stops_the_guards_after_it() -> None:
    later = directs("never")
    verdict = compose(answers("a"), directs("dropped"), halts("first"), halts("second"), later)(
        VIEW
    )
    assert verdict.halt == Halt("custom", "first", "stopped: first")
    assert later.seen == []
    # Calls already answered stay answered; directives to a stopped episode are moot.
    assert [a.tool_call_id for a in verdict.self_answers] == ["a"]
    assert verdict.directives == ()


def test_a_halting_guard_keeps_its_own_self_answers() -> None:
    verdict = compose(answers("a"), halts("stop", answer="b"))(VIEW)
    assert [a.tool_call_id for a in verdict.self_answers] == ["a", "b"]


def test_a_finish_stops_the_guards_after_it() -> None:
    call = ToolUse("f1", "finish", {"answer": "42"})
    later = halts("too late")
    verdict = compose(answers("a"), Recorder(Verdict(finish=call)), later)(VIEW)
    assert verdict.finish == call
    assert verdict.halt is None
    assert later.seen == []
    assert [a.tool_call_id for a in verdict.self_answers] == ["a"]


def test_nothing_happening_gives_continue_itself() -> None:
    # An empty verdict that is not CONTINUE still composes to CONTINUE.
    assert compose(Recorder(), Recorder(Verdict()))(VIEW) is CONTINUE
    assert compose()(VIEW) is CONTINUE


def test_composed_guards_compose_again() -> None:
    inner = compose(directs("one"), directs("two"))
    verdict = compose(inner, directs("three"))(VIEW)
    assert [d.text for d in verdict.directives] == ["one", "two", "three"]


def test_composed_name_lists_its_guards() -> None:
    assert compose(max_turns, final_turn).__name__ == "compose(max_turns, final_turn)"
    unnamed = functools.partial(final_turn)
    assert compose(max_turns, unnamed).__name__ == "compose(max_turns, guard)"
    assert default_guards.__name__.startswith(
        "compose(max_turns, budget, cost_budget, loop_detection"
    )


def test_custom_guard_adds_to_the_defaults() -> None:
    def no_shouting(view: GuardView) -> Verdict:
        reply = view.reply
        if view.phase != "after_response" or reply is None or not reply.text:
            return CONTINUE
        if not reply.text.isupper():
            return CONTINUE
        return Verdict(directives=(Directive("no_shouting", "Please do not shout."),))

    state = session(seen=frozenset({call_key("search", {"q": "a"})}))
    call = ToolUse("c1", "search", {"q": "a"})
    message = {"role": "assistant", "content": "LOOKING AGAIN", "tool_calls": []}
    reply = Reply(message, "LOOKING AGAIN", (call,), "tool_calls", Usage())
    view = GuardView("after_response", state, 0.0, reply=reply)
    guard = compose(default_guards, no_shouting)
    verdict = guard(view)
    assert verdict.self_answers == duplicate_calls(view).self_answers
    assert [a.tool_call_id for a in verdict.self_answers] == ["c1"]
    assert [d.guard for d in verdict.directives] == ["no_shouting"]
    quiet = msgspec.structs.replace(reply, text="looking again")
    assert guard(msgspec.structs.replace(view, reply=quiet)).directives == ()


def test_custom_halt_before_the_defaults_preempts_them() -> None:
    last_poll = GuardView("before_call", session(polls=2), 0.0)
    assert [d.guard for d in default_guards(last_poll).directives] == ["final_turn"]
    custom = halts("policy")
    verdict = compose(custom, default_guards)(last_poll)
    assert verdict.halt == Halt("custom", "policy", "stopped: policy")
    assert verdict.directives == ()


def test_a_default_halt_stops_a_custom_guard_after_it() -> None:
    spent = GuardView("before_call", session(polls=3), 0.0)
    later = directs("never")
    guard: Guard = compose(default_guards, later)
    verdict = guard(spent)
    assert verdict.halt is not None
    assert verdict.halt.reason == "max_turns_exceeded"
    assert later.seen == []
    # Turned off in the config, the default halt no longer stops it.
    config = GuardConfig(max_turns=None)
    free = msgspec.structs.replace(spent, state=msgspec.structs.replace(spent.state, guards=config))
    assert [d.text for d in guard(free).directives] == ["never"]
    assert later.seen == [free]


PHASE_OF: dict[Guard, Phase] = {
    max_turns: "before_call",
    budget: "before_call",
    loop_detection: "before_call",
    consecutive_errors: "before_call",
    resume_next_step: "before_call",
    restate_request: "before_call",
    final_turn: "before_call",
    duplicate_calls: "after_response",
    repair: "after_response",
    correct_reply: "after_response",
    terminal_tool: "after_response",
}


def test_each_built_in_guard_acts_in_its_one_phase_and_continues_in_the_other() -> None:
    looping = session(repeats=2, warned_repeats=0, polls=3, max_turns=3)
    reply = Reply({"role": "assistant", "content": "done"}, "done", (), "stop", Usage())
    for guard, phase in PHASE_OF.items():
        assert phases_of(guard) == {phase}, guard
        other: Phase = "after_response" if phase == "before_call" else "before_call"
        assert guard(GuardView(other, looping, 0.0, reply=reply)) is CONTINUE, guard
    assert phases_of(default_guards) == {"before_call", "after_response"}


def test_compose_runs_a_marked_guard_only_in_its_phase() -> None:
    marked = Recorder()
    acts_in("after_response")(marked)
    unmarked = Recorder()
    composed = compose(marked, unmarked)
    composed(VIEW)
    assert (marked.seen, unmarked.seen) == ([], [VIEW])
    assert phases_of(compose(max_turns, final_turn)) == {"before_call"}


def test_a_guard_marked_with_its_setting_is_skipped_while_the_setting_is_off() -> None:
    marked = Recorder(Verdict(directives=(Directive("loop", "looping"),)))
    acts_in("before_call", setting="loop")(marked)
    guard = compose(marked)
    on = VIEW
    off = GuardView("before_call", session(guards=GuardConfig(loop=None)), 0.0)
    # Each view after the other: what runs follows the config of the view at hand.
    assert [d.text for d in guard(on).directives] == ["looping"]
    assert guard(off) is CONTINUE
    assert [d.text for d in guard(on).directives] == ["looping"]
    assert marked.seen == [on, on]


BUILT_IN = (*PHASE_OF, self_feeding, cost_budget, typed_output)


def test_each_built_in_guard_names_its_setting_and_continues_without_it() -> None:
    looping = session(repeats=2, warned_repeats=0, polls=3, max_turns=3)
    reply = Reply({"role": "assistant", "content": "done"}, "done", (), "stop", Usage())
    for guard in BUILT_IN:
        setting = setting_of(guard)
        assert setting in GuardConfig.__struct_fields__, guard
        off = msgspec.structs.replace(
            looping, guards=msgspec.structs.replace(looping.guards, **{setting: None})
        )
        for phase in ("before_call", "after_response"):
            assert guard(GuardView(phase, off, 0.0, reply=reply)) is CONTINUE, (guard, phase)
