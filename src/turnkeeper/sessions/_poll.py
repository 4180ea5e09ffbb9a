"""The pure halves of a poll, around its model call: `begin_poll` and `end_poll`.

They take the time as an argument; the model-call driver (`_driver.py`, with
`poll_turn`) is the shell that reads the clock and awaits the chat backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import Any

import msgspec

from turnkeeper.core import (
    MAX_JSON_DEPTH,
    AgentSpec,
    ChatError,
    InputError,
    Message,
    ToolResult,
    ToolUse,
    Usage,
    degenerate,
    is_unreadable,
    nests_deeper,
    read_answer,
    text_of,
    tool_uses_of,
)
from turnkeeper.events import (
    AnsweredAfterStop,
    AnswerRequested,
    AnyEvent,
    ChatFailed,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    Halted,
    MessageReceived,
    ModelResponded,
    OutputAccepted,
    ReplyReplaced,
    SessionOpened,
    TerminalToolCalled,
)
from turnkeeper.guards import (
    Guard,
    GuardView,
    Halt,
    Reply,
    answer_messages,
    answer_request,
    answers_after,
    default_guards,
    grounded,
    output_halt,
    window,
)
from turnkeeper.sessions._inputs import Input, Kickoff, Resume, UserMessage
from turnkeeper.sessions._plain import is_plain_json
from turnkeeper.state import SessionState, apply_event, results_received

_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder(dict[str, Any]).decode
_second = itemgetter(1)


def opened_event(state: SessionState) -> SessionOpened:
    """The `local.session_opened` event that describes a state at seq 0."""
    return SessionOpened(
        spec=state.spec,
        history=state.history,
        max_turns=state.max_turns,
        guards=state.guards,
        resume=state.resume,
    )


def emit(state: SessionState, event: AnyEvent, *, at: float) -> tuple[Envelope, SessionState]:
    """Envelope `event` as the session's next seq and apply it."""
    envelope = Envelope(state.session_id, state.seq + 1, at, event)
    return envelope, apply_event(state, envelope)


class _Log:
    """Events of one poll being built, with the state they lead to."""

    def __init__(self, state: SessionState) -> None:
        self.state = state
        self.events: list[Envelope] = []

    def push(self, event: AnyEvent, at: float) -> None:
        envelope, self.state = emit(self.state, event, at=at)
        self.events.append(envelope)


def begin_poll(
    state: SessionState, input: Input, *, now: float, guard: Guard = default_guards
) -> tuple[list[Envelope], SessionState, dict[str, Any] | None]:
    """Apply the input and the before-call guards. Returns the events, the state, and the
    request to send to the model, or None when a guard halted the episode.

    A halt that qualifies (see `answers_after`) is logged as `local.answer_requested`
    instead: the request is then the last call, with tools withdrawn. A state whose
    answer call is due (`answering`, in a poll) is finished by `Resume()`: no input, no
    guards, only that call's request."""
    if state.answering is not None and state.in_poll and _is_empty_resume(input):
        return [], state, build_request(state)
    log = _Log(state)
    if state.seq == 0:
        log.push(opened_event(state), now)
    results: tuple[tuple[ToolUse, ToolResult], ...] = ()
    if isinstance(input, Kickoff | UserMessage):
        text = input.prompt if isinstance(input, Kickoff) else input.text
        if not isinstance(text, str):
            raise InputError(f"message text: expected a string, got {type(text).__name__}")
        if state.pending:
            raise InputError(
                f"session {state.session_id} is waiting for the results of tool calls "
                f"{', '.join(use.id for use in state.pending)}; resume with them first"
            )
        log.push(MessageReceived(text=text), now)
    elif isinstance(input, Resume):
        results = _match_results(state, input)
        # Each result logged once: one its `local.tool_result` holds is given by position.
        log.push(results_received(state.returned, tuple(map(_second, results))), now)
    else:
        raise InputError(f"input: expected Kickoff, UserMessage or Resume, got {input!r:.80}")
    verdict = guard(GuardView("before_call", log.state, now, results=results))
    if verdict.halt is not None:
        if _push_stop(log, verdict.halt, now):
            return log.events, log.state, build_request(log.state)
        return log.events, log.state, None
    for directive in verdict.directives:
        log.push(
            DirectiveInjected(guard=directive.guard, text=directive.text, counts=directive.counts),
            now,
        )
    return log.events, log.state, build_request(log.state)


def _is_empty_resume(input: Input) -> bool:
    return isinstance(input, Resume) and not input.results and not input.tool_uses


def _push_stop(log: _Log, halt: Halt, now: float) -> bool:
    """Log the stop `halt`: as a request for one last answer when it qualifies (True), else
    as `local.halted` (False)."""
    if answers_after(log.state, halt):
        log.push(answer_request(log.state, halt), now)
        return True
    log.push(Halted(guard=halt.guard, reason=halt.reason, message=halt.message), now)
    return False


def _match_results(state: SessionState, resume: Resume) -> tuple[tuple[ToolUse, ToolResult], ...]:
    """Pair each pending tool use with its result, in call order; reject anything else."""
    pending = state.pending
    if resume.tool_uses and resume.tool_uses is not pending:
        given = [getattr(use, "id", use) for use in resume.tool_uses]
        if sorted(map(str, given)) != sorted(use.id for use in pending):
            raise InputError(
                f"Resume.tool_uses: {given} are not the pending tool calls "
                f"{[use.id for use in pending]}"
            )
    results = resume.results
    if isinstance(results, tuple | list) and len(results) == len(pending):
        # The usual case, checked cheaply: one result per pending call, in call order.
        pairs = []
        for use, result in zip(pending, results, strict=True):
            if (
                type(result) is not ToolResult
                or type(result.text) is not str
                or result.tool_use_id != use.id
            ):
                break
            pairs.append((use, result))
        else:
            return tuple(pairs)
    by_id = check_results(state.session_id, [use.id for use in pending], results)
    return tuple((use, by_id[use.id]) for use in pending)


_RESULT_FIELDS = (("tool_use_id", str), ("text", str), ("is_error", bool))


def check_results(
    session_id: str, expected: Sequence[str], results: Iterable[object]
) -> dict[str, ToolResult]:
    """`results` by call id, if they answer each of `expected` exactly once; otherwise
    InputError naming the unknown, repeated and missing ids."""
    by_id: dict[str, ToolResult] = {}
    repeated: list[str] = []
    unknown: list[str] = []
    if isinstance(results, str | bytes | dict) or not isinstance(results, Iterable):
        raise InputError(f"results: expected a list of ToolResult, got {type(results).__name__}")
    for index, result in enumerate(results):
        if not isinstance(result, ToolResult):
            raise InputError(f"results[{index}]: expected ToolResult, got {result!r:.80}")
        for field, kind in _RESULT_FIELDS:
            if not isinstance(getattr(result, field), kind):
                raise InputError(
                    f"results[{index}].{field}: expected {kind.__name__}, "
                    f"got {getattr(result, field)!r:.80}"
                )
        if result.tool_use_id in by_id:
            repeated.append(result.tool_use_id)
        elif result.tool_use_id not in expected:
            unknown.append(result.tool_use_id)
        by_id[result.tool_use_id] = result
    missing = [use_id for use_id in expected if use_id not in by_id]
    problems = []
    if unknown:
        problems.append(f"unknown tool call ids {unknown}")
    if repeated:
        problems.append(f"more than one result for {repeated}")
    if missing:
        problems.append(f"no result for {missing}")
    if problems:
        raise InputError(f"session {session_id}: tool results rejected: {'; '.join(problems)}")
    return by_id


_formats: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}


def _response_format(schema: dict[str, Any]) -> dict[str, Any]:
    """The `response_format` asking for JSON of the output schema, built once per schema."""
    cached = _formats.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    if len(_formats) >= 256:
        _formats.clear()
    shaped = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    _formats[id(schema)] = (schema, shaped)
    return shaped


def prompt_messages(state: SessionState) -> tuple[Message, ...]:
    """The messages of the state's next model call, before the small-model window cuts
    them: its history, or, for the answer after a stop, what `answer_messages` gives."""
    return state.history if state.answering is None else answer_messages(state, state.history)


def build_request(state: SessionState) -> dict[str, Any]:
    """The chat request for the state's history. Backends must not mutate it. A spec with
    an `output_schema` asks for JSON of it (`response_format`, as OpenAI's API has it):
    the schema then constrains the model's text, not its tool calls."""
    spec = state.spec
    history = prompt_messages(state)
    messages = window(history, state) if state.guards.small_model else list(history)
    request: dict[str, Any] = {
        "model": spec.model,
        "messages": messages,
        "tools": spec.openai_tools,
    }
    if state.answering is not None:
        # The answer after a stop: tools withdrawn.
        request["tool_choice"] = "none"
    if isinstance(spec.output_schema, dict):
        request["response_format"] = _response_format(spec.output_schema)
    request.update(spec.sampling())
    return request


def end_poll(
    state: SessionState,
    response: object,
    *,
    now: float,
    guard: Guard = default_guards,
    reported: Iterable[AnyEvent] = (),
) -> tuple[list[Envelope], SessionState]:
    """Apply the model's response and the after-response guards. Raises ChatError
    ("malformed response: ...") when the response is not chat-completions shaped.

    The reply to an answer after a stop (`state.answering`) meets no guard: with text it
    is the episode's answer (`local.answered_after_stop`); without text, with one phrase
    repeated, or holding none of the episode's results (see `grounded`), the episode
    halts as the stop would have.

    With an `output_schema`, an answer that no guard acted on is the typed output
    (`local.output`) if it matches the schema; one that does not (the `output` guard
    being off, or out of re-prompts in the answer after a stop) halts the episode."""
    response, logged = _as_logged(response)
    message, finish_reason, usage = check_response(response, call_prefix=f"call_{state.seq + 1}")
    usage = priced(usage, state.spec)
    if state.answering is not None:
        return _end_answer(
            state, state.answering, logged, message, finish_reason, usage, now, reported
        )
    reply = Reply(
        message,
        text_of(message),
        tool_uses_of(message),
        finish_reason,
        usage,
        is_unreadable(response),
    )
    verdict = guard(GuardView("after_response", state, now, reply=reply))
    log = _Log(state)
    for event in reported:
        log.push(event, now)
    log.push(
        ModelResponded(response=logged, message=message, finish_reason=finish_reason, usage=usage),
        now,
    )
    for answer in verdict.self_answers:
        log.push(
            DuplicateToolCall(
                tool_call_id=answer.tool_call_id,
                name=answer.name,
                arguments=answer.arguments,
                message=answer.message,
            ),
            now,
        )
    if verdict.halt is not None:
        _push_stop(log, verdict.halt, now)
    elif verdict.finish is not None:
        use = verdict.finish
        log.push(TerminalToolCalled(tool_call_id=use.id, name=use.name, result=use.input), now)
    elif verdict.directives:
        for directive in verdict.directives:
            log.push(
                DirectiveInjected(
                    guard=directive.guard, text=directive.text, counts=directive.counts
                ),
                now,
            )
    elif verdict.replacement is not None and not reply.calls:
        replacement = verdict.replacement
        log.push(ReplyReplaced(guard=replacement.guard, text=replacement.text), now)
    schema = state.spec.output_schema
    if (
        isinstance(schema, dict)
        and verdict.halt is None
        and verdict.finish is None
        and not verdict.directives
        and not reply.calls
        and finish_reason == "stop"
    ):
        said = reply.text if verdict.replacement is None else verdict.replacement.text
        value, problem = read_answer(schema, said)
        if problem is None:
            log.push(OutputAccepted(value=value), now)
        else:
            halt = output_halt(log.state, problem)
            log.push(Halted(guard=halt.guard, reason=halt.reason, message=halt.message), now)
    return log.events, log.state


def _end_answer(
    state: SessionState,
    stop: AnswerRequested,
    logged: msgspec.Raw,
    message: Message,
    finish_reason: str | None,
    usage: Usage,
    now: float,
    reported: Iterable[AnyEvent],
) -> tuple[list[Envelope], SessionState]:
    """The events of the reply to an answer after `stop`, and the state they lead to."""
    log = _Log(state)
    for event in reported:
        log.push(event, now)
    log.push(
        ModelResponded(response=logged, message=message, finish_reason=finish_reason, usage=usage),
        now,
    )
    text = text_of(message)
    answered = (
        text is not None and bool(text.strip()) and not degenerate(text) and grounded(state, text)
    )
    schema = state.spec.output_schema
    value: Any = None
    if answered and isinstance(schema, dict):
        value, problem = read_answer(schema, text)
        answered = problem is None
    if answered:
        log.push(AnsweredAfterStop(guard=stop.guard, reason=stop.reason), now)
        if isinstance(schema, dict):
            log.push(OutputAccepted(value=value), now)
    else:
        log.push(Halted(guard=stop.guard, reason=stop.reason, message=stop.message), now)
    return log.events, log.state


def unanswered(state: SessionState) -> Halted | None:
    """The halt an episode ends with when the model call of its answer after a stop
    fails for good: the stop's own, with its gist; None when no such call is due."""
    stop = state.answering
    if stop is None:
        return None
    return Halted(guard=stop.guard, reason=stop.reason, message=stop.message)


def _as_logged(response: object) -> tuple[dict[str, Any], msgspec.Raw]:
    """The response as the log reads it back, and its JSON. A backend other than OpenAIChat
    may hand over anything: a value JSON does not hold as it is (a tuple, a NaN, a key
    that is not a string) is kept in its JSON form, so that the live state is the
    replayed one; and one nested deeper than MAX_JSON_DEPTH is refused, as logging it
    (and reading it back) would recurse as deep as the stack goes."""
    if not isinstance(response, dict):
        raise _malformed(f"expected a JSON object, got {type(response).__name__}")
    try:
        encoded = _json.encode(response)
    except RecursionError:
        # Nested (or looping) deeper than encoding recurses: deeper than allowed, then.
        if nests_deeper(response, MAX_JSON_DEPTH):
            raise _malformed(_TOO_DEEP) from None
        raise
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        if nests_deeper(response, MAX_JSON_DEPTH):
            raise _malformed(_TOO_DEEP) from None
        raise _malformed(f"it cannot be logged as JSON ({exc})") from None
    # Each level opens a bracket: with no more brackets than levels allowed (as in nearly
    # every response), there is nothing to walk.
    brackets = encoded.count(b"{") + encoded.count(b"[")
    if brackets > MAX_JSON_DEPTH and nests_deeper(response, MAX_JSON_DEPTH):
        raise _malformed(_TOO_DEEP)
    # Reading a short response back from its JSON takes less time than walking it to see
    # whether it reads back as it is (`is_plain_json`); a long one takes more.
    if len(encoded) <= _READ_BACK_BYTES or not is_plain_json(response, MAX_JSON_DEPTH):
        response = _decode(encoded)
    return response, msgspec.Raw(encoded)


_TOO_DEEP = f"it nests more than {MAX_JSON_DEPTH} levels deep"
_READ_BACK_BYTES = 4096


def _malformed(what: str) -> ChatError:
    return ChatError(f"malformed response: {what}", transient=False)


def check_response(response: object, *, call_prefix: str) -> tuple[Message, str | None, Usage]:
    """The assistant message, finish reason and usage of a chat-completions response.

    Tool calls without a usable id get `<call_prefix>_<index>`, and a missing role or
    call type is filled in, in a copy; the response itself is never changed.
    """
    if not isinstance(response, dict):
        raise _malformed(f"expected a JSON object, got {type(response).__name__}")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _malformed("no choices")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise _malformed("choices[0] is not an object")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _malformed("choices[0] has no message")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise _malformed(f"choices[0].message.content is {type(content).__name__}")
    calls = message.get("tool_calls")
    changed = message.get("role") != "assistant"
    if calls is not None:
        if not isinstance(calls, list):
            raise _malformed("choices[0].message.tool_calls is not a list")
        fixed_calls, fixed = _check_calls(calls, call_prefix)
        changed = changed or fixed
    if changed:
        message = {**message, "role": "assistant"}
        if calls is not None:
            message["tool_calls"] = fixed_calls
    finish_reason = choice.get("finish_reason")
    return message, finish_reason if isinstance(finish_reason, str) else None, _usage(response)


def _check_calls(calls: list[Any], call_prefix: str) -> tuple[list[Any], bool]:
    """The tool calls with ids and types filled in, and whether any needed it (the list
    itself when none did)."""
    fixed: list[Any] | None = None
    ids: set[str] = set()
    # A made-up id must not be one the model gave another call of the reply, earlier or
    # later: two pending calls with one id could not both be answered. Gathered only when
    # an id is made up: most replies need none.
    given: set[str] | None = None
    for index, call in enumerate(calls):
        if not isinstance(call, dict):
            raise _malformed(f"choices[0].message.tool_calls[{index}] is not an object")
        function = call.get("function")
        if not isinstance(function, dict):
            raise _malformed(f"choices[0].message.tool_calls[{index}].function is missing")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _malformed(f"choices[0].message.tool_calls[{index}].function.name is missing")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id or call_id in ids:
            if given is None:
                given = {
                    other["id"]
                    for other in calls
                    if isinstance(other, dict) and isinstance(other.get("id"), str)
                }
            call_id = f"{call_prefix}_{index}"
            while call_id in given or call_id in ids:
                call_id += "_"
            call = {**call, "id": call_id}
            fixed = fixed if fixed is not None else calls[:index]
        if call.get("type") != "function":
            call = {**call, "type": "function"}
            fixed = fixed if fixed is not None else calls[:index]
        ids.add(call_id)
        if fixed is not None:
            fixed.append(call)
    return (calls, False) if fixed is None else (fixed, True)


def priced(usage: Usage, spec: AgentSpec) -> Usage:
    """`usage` with its cost by the spec's pricing (as it was, with none)."""
    pricing = spec.pricing
    if pricing is None:
        return usage
    cost = pricing.cost(usage.prompt_tokens, usage.completion_tokens)
    return Usage(usage.prompt_tokens, usage.completion_tokens, cost)


def _usage(response: dict[str, Any]) -> Usage:
    usage = response.get("usage")
    if not isinstance(usage, dict):
        return Usage()
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    return Usage(
        prompt if type(prompt) is int and prompt >= 0 else 0,
        completion if type(completion) is int and completion >= 0 else 0,
    )


def _storable(response: object) -> object:
    """`response` if it can be logged as JSON, else its repr, so nothing the model sent is
    lost; one nested too deeply for either is only described."""
    if nests_deeper(response, MAX_JSON_DEPTH):
        return f"a {type(response).__name__} nested more than {MAX_JSON_DEPTH} levels deep"
    try:
        _json.encode(response)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return repr(response)[:10_000]
    return response


def failure_events(
    state: SessionState,
    error: ChatError,
    reported: Iterable[AnyEvent] = (),
    *,
    at: float,
    response: object = None,
) -> tuple[Envelope, ...]:
    """The events a failed model call logs (what the backend reported, then
    `local.chat_error`), numbered after `state`. The state they lead to differs from
    `state` only in its seq."""
    log = _Log(state)
    if state.seq == 0:
        log.push(opened_event(state), at)
    for event in reported:
        log.push(event, at)
    log.push(
        ChatFailed(
            error=error.message,
            transient=error.transient,
            status=error.status,
            response=_storable(response),
        ),
        at,
    )
    return tuple(log.events)
