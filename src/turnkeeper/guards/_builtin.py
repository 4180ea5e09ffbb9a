"""The built-in guards. Each reads its settings from the session's GuardConfig and does
nothing when that setting is None, so a session turns a guard off in its config."""

from __future__ import annotations

import msgspec

from turnkeeper.core import (
    FINAL_TURN_LEAD,
    call_key,
    coerce,
    gist,
    key_arguments,
    reply_flaw,
    reply_problem,
    validate,
)
from turnkeeper.guards._answer import answers_after, last_result
from turnkeeper.guards._view import (
    CONTINUE,
    Directive,
    GuardView,
    Halt,
    Reply,
    SelfAnswer,
    Verdict,
    acts_in,
)
from turnkeeper.state import SessionState


def with_last_result(state: SessionState, lead: str) -> str:
    """`lead`, preceded by the gist of the episode's last tool result when there is one
    (see `last_result`): what the session found, not an error it met nor what an earlier
    request found."""
    last = last_result(state)
    return f"{gist(last)}\n\n{lead}" if last else lead


@acts_in("before_call", setting="max_turns")
def max_turns(view: GuardView) -> Verdict:
    """Halt before a model call the episode's `max_turns` does not allow. With its `answer`
    setting, an episode with tool results stops one poll earlier: the last allowed poll is
    its answer after the stop, made with tools withdrawn."""
    state = view.state
    if view.phase != "before_call" or state.guards.max_turns is None:
        return CONTINUE
    if state.polls + 1 == state.max_turns:
        lead = f"I stopped after {state.max_turns} model calls without finishing."
        halt = Halt("max_turns", "max_turns_exceeded", with_last_result(state, lead))
        return Verdict(halt=halt) if answers_after(state, halt) else CONTINUE
    if state.polls < state.max_turns:
        return CONTINUE
    lead = f"I stopped after {state.polls} model calls without finishing."
    return Verdict(halt=Halt("max_turns", "max_turns_exceeded", with_last_result(state, lead)))


@acts_in("before_call", setting="final_turn")
def final_turn(view: GuardView) -> Verdict:
    """On the last poll `max_turns` allows, tell the model to finish now."""
    state = view.state
    if view.phase != "before_call" or state.guards.final_turn is None:
        return CONTINUE
    if state.polls + 1 != state.max_turns:
        return CONTINUE
    terminal = state.spec.terminal_tool
    if terminal is not None:
        text = (
            f"{FINAL_TURN_LEAD} Finish now: call `{terminal}` with your final answer, "
            "using what you already have."
        )
    else:
        text = (
            f"{FINAL_TURN_LEAD} Finish now: answer with what you already have, "
            "and do not call any more tools."
        )
    return Verdict(directives=(Directive("final_turn", text),))


@acts_in("after_response", setting="duplicates")
def duplicate_calls(view: GuardView) -> Verdict:
    """Self-answer a call repeating (name, args) from earlier in the episode or this reply."""
    state = view.state
    reply = view.reply
    if view.phase != "after_response" or reply is None or state.guards.duplicates is None:
        return CONTINUE
    seen = state.seen
    this_reply: set[str] = set()
    answers: list[SelfAnswer] = []
    for call in reply.calls:
        if call.error is not None:
            continue
        tool = state.spec.tool(call.name)
        if tool is not None and tool.repeatable:
            continue
        key = call_key(call.name, call.input)
        if key in seen or key in this_reply:
            message = (
                f"You already called {call.name} with these arguments in this request; "
                "its answer is above. Use that answer, or call a tool with different arguments."
            )
            answers.append(SelfAnswer(call.id, call.name, key_arguments(key), message))
        this_reply.add(key)
    return Verdict(self_answers=tuple(answers)) if answers else CONTINUE


@acts_in("after_response", setting="repair")
def repair(view: GuardView) -> Verdict:
    """Send a bad reply back to the model once, and end the run with an apology at the
    second bad reply in a row. Bad calls (an unknown tool, unreadable or invalid
    arguments) go back as tool errors from whoever runs the tools; a reply without calls
    that is not an answer (unreadable, cut off, or one phrase repeated) gets a directive to
    reply again."""
    state = view.state
    reply = view.reply
    if view.phase != "after_response" or reply is None or state.guards.repair is None:
        return CONTINUE
    # The previous reply first: it was judged before (call_problem remembers), and while it
    # was good, a bad call here needs no judging (whoever runs it sends the tool error).
    previous = reply_problem(state.spec, state.reply_calls, state.last_unreadable)
    if previous is None and not state.last_flawed:
        if reply.calls:
            return CONTINUE
        problem = _problem(state, reply)
        if problem is None:
            return CONTINUE
        text = (
            f"Your last reply could not be used: {problem}. Reply again: call one tool with "
            "its arguments as a JSON object, or answer in a few plain sentences."
        )
        return Verdict(directives=(Directive("repair", text),))
    problem = _problem(state, reply)
    if problem is None:
        return CONTINUE
    if reply.calls or reply.unreadable:
        lead = f"I'm sorry: I could not make a valid tool call ({gist(problem)})."
        return Verdict(halt=Halt("repair", "bad_tool_calls", with_last_result(state, lead)))
    lead = f"I'm sorry: I could not give a usable reply ({gist(problem)})."
    return Verdict(halt=Halt("repair", "bad_reply", with_last_result(state, lead)))


def _problem(state: SessionState, reply: Reply) -> str | None:
    """What makes `reply` bad (see `repair`), or None."""
    problem = reply_problem(state.spec, reply.calls, reply.unreadable)
    if problem is None and not reply.calls:
        return reply_flaw(reply.text, reply.finish_reason)
    return problem


def repairs(state: SessionState, reply: Reply) -> bool:
    """Whether the repair guard takes `reply` as a bad reply without calls: one that other
    guards judging answers leave to it."""
    if state.guards.repair is None or reply.calls:
        return False
    return _problem(state, reply) is not None


@acts_in("before_call", setting="consecutive_errors")
def consecutive_errors(view: GuardView) -> Verdict:
    """Tell the model to fix the error of a tool that has now failed `threshold` times in a row."""
    state = view.state
    config = state.guards.consecutive_errors
    if view.phase != "before_call" or config is None:
        return CONTINUE
    directives: list[Directive] = []
    named: set[str] = set()
    for use, result in view.results:
        count = state.error_counts.get(use.name, 0)
        if not result.is_error or count < config.threshold or use.name in named:
            continue
        named.add(use.name)
        text = (
            f"The tool `{use.name}` has failed {count} times in a row. Its last error was: "
            f"{gist(result.text)}. Fix that error before calling `{use.name}` again: check the "
            "arguments against the tool's schema, or use another tool."
        )
        directives.append(Directive("consecutive_errors", text))
    return Verdict(directives=tuple(directives)) if directives else CONTINUE


@acts_in("before_call", setting="loop")
def loop_detection(view: GuardView) -> Verdict:
    """Flag a new repeat (same call and same answer, or the same reply text) to the model
    `warnings` times; halt at the next repeat after that. A stop that becomes an answer
    after it (see `answers_after`) is not warned of first, unless the repeat is a reply."""
    state = view.state
    config = state.guards.loop
    if view.phase != "before_call" or config is None:
        return CONTINUE
    if state.repeats <= state.warned_repeats:
        return CONTINUE
    what = state.last_repeat or "a call"
    lead = f"I stopped because I was going in circles: {what} kept giving the same answer."
    halt = Halt("loop", "going_in_circles", with_last_result(state, lead))
    # A warning asks the model to use the answers it has or finish; when the stop becomes
    # an answer from those results with tools withdrawn, that is what happens, a call
    # sooner. A repeated reply (the fold's `last_repeat` for it) is still warned of: it may
    # be a bad reply the repair guard sends back.
    repeated_call = state.last_repeat != "the same reply as before"
    if state.warnings < config.warnings and not (repeated_call and answers_after(state, halt)):
        text = (
            f"You are going in circles: {what} gave the same answer as before. Do not repeat "
            "it. Use the answers you already have, try something different, or finish."
        )
        return Verdict(directives=(Directive("loop", text, counts="warning"),))
    return Verdict(halt=halt)


@acts_in("after_response", setting="terminal")
def terminal_tool(view: GuardView) -> Verdict:
    """Finish on a valid call of the terminal tool; with `required`, re-prompt an answer that
    skipped it `max_reprompts` times, then halt."""
    state = view.state
    config = state.guards.terminal
    reply = view.reply
    terminal = state.spec.terminal_tool
    if view.phase != "after_response" or reply is None or config is None or terminal is None:
        return CONTINUE
    for call in reply.calls:
        if call.name != terminal or call.error is not None:
            continue
        tool = state.spec.tool(terminal)
        if tool is None:
            return Verdict(finish=call)
        arguments = coerce(tool.input_schema, call.input)
        if not validate(tool.input_schema, arguments):
            return Verdict(finish=msgspec.structs.replace(call, input=arguments))
    if not config.required or reply.calls or reply.finish_reason != "stop" or repairs(state, reply):
        return CONTINUE
    if state.reprompts < config.max_reprompts:
        text = (
            f"You have not finished. Call `{terminal}` now with your final answer as its "
            "arguments; do not reply with plain text."
        )
        return Verdict(directives=(Directive("terminal", text, counts="reprompt"),))
    said = f" Its last reply: {gist(reply.text)}" if reply.text else ""
    lead = f"The model stopped without calling `{terminal}` after {state.reprompts} reminders."
    message = with_last_result(state, lead + said)
    return Verdict(halt=Halt("terminal", "no_terminal_tool", message))


@acts_in("before_call", setting="budget")
def budget(view: GuardView) -> Verdict:
    """Halt before a model call once the episode has used its token or time budget."""
    state = view.state
    config = state.guards.budget
    if view.phase != "before_call" or config is None:
        return CONTINUE
    used = state.episode_usage.total_tokens
    if config.max_tokens is not None and used >= config.max_tokens:
        lead = f"I stopped: this request used {used} tokens, its budget is {config.max_tokens}."
        return Verdict(halt=Halt("budget", "budget_exceeded", with_last_result(state, lead)))
    started = state.episode_started
    if config.max_seconds is not None and started is not None:
        elapsed = view.now - started
        if elapsed >= config.max_seconds:
            lead = (
                f"I stopped: this request has run {elapsed:.1f} s, "
                f"its budget is {config.max_seconds:g} s."
            )
            return Verdict(halt=Halt("budget", "budget_exceeded", with_last_result(state, lead)))
    return CONTINUE
