"""SessionState, and the pure fold that advances it by one event.

Every change to a session's state is the application of one logged event, so
folding a session's log reproduces its live state exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any, Literal

import msgspec

from turnkeeper.core import (
    MAX_ARGUMENT_DEPTH,
    AgentSpec,
    GuardConfig,
    InputError,
    Message,
    ReplayError,
    SeqError,
    ToolResult,
    ToolUse,
    Usage,
    add_costs,
    call_key,
    decode_tool_uses,
    digest,
    duplicate_content,
    error_content,
    key_arguments,
    logged_unreadable,
    reply_flaw,
    text_of,
    tool_message,
    tool_uses_of,
)
from turnkeeper.events import (
    AnsweredAfterStop,
    AnswerRequested,
    ApprovalDecided,
    ApprovalRequested,
    Cancelled,
    Compacted,
    CompactionFailed,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    Failed,
    Forked,
    Halted,
    MessageQueued,
    MessageReceived,
    ModelResponded,
    OutputAccepted,
    ReplyReplaced,
    SessionOpened,
    TerminalToolCalled,
    ToolCalled,
    ToolResultsReceived,
    ToolReturned,
)
from turnkeeper.state._results import results_of, whole_results

Status = Literal["idle", "running", "requires_action", "halted", "cancelled", "failed"]
"""idle: waits for a user message. running: the model should be called (again).
requires_action: waits for the results of `pending`. halted: a guard stopped the episode."""

_compact = msgspec.json.Encoder()

_NONE: frozenset[str] = frozenset()
"""The empty set every state holds for an empty `seen`, `called` or `texts`: each
`frozenset()` is another object (of 216 bytes), and most states have one or two."""


_NO_USAGE = Usage()
"""What a new episode has used so far, shared (as `SessionState`'s default is)."""


def _frozen(items: set[str]) -> frozenset[str]:
    """`items` as a frozenset, the shared one if empty."""
    return frozenset(items) if items else _NONE


class SessionState(msgspec.Struct, frozen=True, gc=False):
    """Everything a session is, immutable. Advanced only by applying events.

    `in_poll` is true between a poll's input and the model's answer: a session rebuilt
    in that window (after a crash) makes that model call again. `reply_calls`,
    `last_unreadable` and `last_flawed` describe the model's last reply in the episode
    (for the repair guard); `last_failure` is the error of the episode's last tool step
    when its last result was an error. `answering` is the stop a guard turned into one
    last model call with tools withdrawn, until its reply ends the episode.
    `queued` holds the messages accepted while the session was busy, oldest first.
    `called` holds the ids of the pending calls (of the model's last reply) whose
    `local.tool_call` is logged: one without a result may have run already.
    `approvals` holds the calls of the last reply whose approval was asked for, each with
    its decision (None while it awaits one). `output` is the episode's typed output, the
    answer's JSON value (see `local.output`); None until an answer matches the schema.
    `compaction_failed` says a summary of older turns failed in this episode (none is
    asked for again until the next request).

    Not tracked by the cycle collector (`gc=False`): it holds only data, which cannot
    point back at it. A Host of 10,000 sessions makes one per event, and each would be
    walked by the young collections it lives through.
    """

    session_id: str
    spec: AgentSpec
    history: tuple[Message, ...]
    max_turns: int = 50
    guards: GuardConfig = GuardConfig()
    resume: bool = False
    seq: int = 0
    status: Status = "idle"
    in_poll: bool = False
    polls: int = 0
    seen: frozenset[str] = _NONE
    error_counts: dict[str, int] = {}
    pending: tuple[ToolUse, ...] = ()
    called: frozenset[str] = _NONE
    approvals: dict[str, ApprovalDecided | None] = {}
    usage: Usage = _NO_USAGE
    episode_usage: Usage = _NO_USAGE
    episode_started: float | None = None
    answers: dict[str, str] = {}
    texts: frozenset[str] = _NONE
    repeats: int = 0
    warnings: int = 0
    warned_repeats: int = 0
    reprompts: int = 0
    last_repeat: str | None = None
    deferred: tuple[Message, ...] = ()
    returned: tuple[ToolResult, ...] = ()
    halt_message: str | None = None
    request: str | None = None
    last_unreadable: bool = False
    last_flawed: bool = False
    last_failure: str | None = None
    reply_calls: tuple[ToolUse, ...] = ()
    answering: AnswerRequested | None = None
    compaction_failed: bool = False
    queued: tuple[str, ...] = ()
    stop_reason: str | None = None
    result: dict[str, Any] | None = None
    output: Any = None

    @property
    def model(self) -> str:
        return self.spec.model

    @property
    def terminal_tool(self) -> str | None:
        return self.spec.terminal_tool


def initial_state(session_id: str, opened: SessionOpened) -> SessionState:
    """The state a `local.session_opened` event describes, before it is logged (seq 0).

    A reattached transcript's last episode (from its last user message on) is remembered
    as a live one would be: its calls are seen, its results' answers and error counts
    kept, and a failure of its last tool step known."""
    history = opened.history
    pending, status = _pending_of(history)
    state = SessionState(
        reply_calls=_last_reply_calls(history),
        session_id=session_id,
        spec=opened.spec,
        history=history,
        max_turns=opened.max_turns,
        guards=_shared_guards(opened.guards),
        resume=opened.resume,
        status=status,
        pending=pending,
    )
    return _remembering(state) if opened.resume else state


_GUARDS: dict[GuardConfig, GuardConfig] = {}
_MOST_GUARDS = 64


def _shared_guards(guards: GuardConfig) -> GuardConfig:
    """`guards`, or an equal GuardConfig a session opened before holds: sessions configured
    alike (most of a host's) share one, which a composed guard recognises at once, and
    none holds a copy of its own. Past `_MOST_GUARDS` configurations told apart, the
    table starts again."""
    shared = _GUARDS.get(guards)
    if shared is not None:
        return shared
    if len(_GUARDS) >= _MOST_GUARDS:
        _GUARDS.clear()
    _GUARDS[guards] = guards
    return guards


def _remembering(state: SessionState) -> SessionState:
    """`state` with its transcript's last episode remembered (see `initial_state`)."""
    history = state.history
    start = next(
        (i + 1 for i in range(len(history) - 1, -1, -1) if history[i].get("role") == "user"), 0
    )
    memory = _Memory(state)
    calls: dict[str, ToolUse] = {}
    for message in history[start:]:
        role = message.get("role")
        if role == "assistant":
            for use in _history_calls(message):
                calls[use.id] = use
                memory.see(call_key(use.name, use.input))
        elif role == "tool":
            called = calls.get(str(message.get("tool_call_id")))
            content = text_of(message)
            if called is None or content is None or content.startswith(_NOT_RESULTS):
                continue
            if content.startswith(_SKIPPED):
                # Never run: a repeat of it is no duplicate.
                memory.forget(call_key(called.name, called.input))
                continue
            error = _error_of(content)
            memory.result(called, content, error is not None, error)
    return memory.put(state)


_NOT_RESULTS = ('{"duplicate":true', '{"ok":true}')
"""How the tool messages that answer a call without its result start: a self-answered
duplicate, a terminal tool's call accepted."""
_SKIPPED = '{"skipped":true'
"""How the notice of a call that was not run starts."""


def _error_of(content: str) -> str | None:
    """The error a tool message reports (`{"error": ..., "isError": true}`): its text, or
    the whole content when the error is not text; None for any other content."""
    if not content.startswith('{"error"'):
        return None
    try:
        decoded = msgspec.json.decode(content)
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deep
        return None
    if not (isinstance(decoded, dict) and decoded.get("isError") is True):
        return None
    error = decoded.get("error")
    # Not str() of anything else: its repr recurses as deep as the value nests.
    return error if isinstance(error, str) else content


def _pending_of(history: tuple[Message, ...]) -> tuple[tuple[ToolUse, ...], Status]:
    """Tool calls of the last assistant message still unanswered, and the status that follows."""
    if not history:
        return (), "idle"
    answered: set[str] = set()
    for message in reversed(history):
        role = message.get("role")
        if role == "tool":
            answered.add(str(message.get("tool_call_id")))
            continue
        if role == "assistant":
            uses = _history_calls(message)
            pending = tuple(use for use in uses if use.id not in answered)
            if pending:
                return pending, "requires_action"
            return (), "running" if uses else "idle"
        break
    last_role = history[-1].get("role")
    return (), "running" if last_role in ("user", "tool") else "idle"


def _last_reply_calls(history: tuple[Message, ...]) -> tuple[ToolUse, ...]:
    """The tool calls of the last assistant message in a reattached history."""
    for message in reversed(history):
        if message.get("role") == "assistant":
            return _history_calls(message)
    return ()


def _history_calls(message: Message) -> tuple[ToolUse, ...]:
    """The tool calls of an assistant message in a given history; InputError if malformed."""
    try:
        return tool_uses_of(message)
    except (KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"history: malformed assistant tool_calls ({exc!r})") from None


def _answer(result: ToolResult) -> Message:
    """The tool message carrying `result` to the model."""
    content = error_content(result.text) if result.is_error else result.text
    return tool_message(result.tool_use_id, content)


def _closed(state: SessionState, why: str) -> tuple[Message, ...]:
    """History with every pending call answered (by its result if it returned, else by a
    notice that it was not run), then any deferred directives."""
    if not state.pending:
        return state.history + state.deferred
    notice = _compact.encode({"skipped": True, "message": why}).decode()
    returned = {result.tool_use_id: result for result in state.returned}
    answers = tuple(
        _answer(returned[use.id]) if use.id in returned else tool_message(use.id, notice)
        for use in state.pending
    )
    return state.history + answers + state.deferred


def apply_event(state: SessionState, envelope: Envelope) -> SessionState:
    """The state after `envelope`; raises SeqError or ReplayError when it does not follow."""
    seq = envelope.seq
    if envelope.session_id != state.session_id or seq != state.seq + 1:
        raise _out_of_order(state.session_id, state.seq + 1, envelope)
    event = envelope.event
    rule = _RULES.get(type(event))
    if rule is None:
        return _replace(state, seq=seq)
    return rule(state, event, envelope)


def _out_of_order(session_id: str, expected: int, envelope: Envelope) -> ReplayError | SeqError:
    """Why `envelope` cannot be the next event of session `session_id` (at seq `expected`)."""
    if envelope.session_id != session_id:
        return ReplayError(
            f"event seq {envelope.seq} belongs to session {envelope.session_id}, not {session_id}"
        )
    return SeqError(session_id, envelope.seq, expected)


_replace = msgspec.structs.replace


def _apply_duplicate(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    pending = tuple(use for use in state.pending if use.id != event.tool_call_id)
    return _replace(
        state,
        seq=envelope.seq,
        history=(
            *state.history,
            tool_message(event.tool_call_id, duplicate_content(event.message)),
        ),
        pending=pending,
        repeats=state.repeats + 1,
        last_repeat=f"{event.name}({event.arguments})",
        status="running" if not pending and state.status == "requires_action" else state.status,
    )


def _apply_directive(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    directive: Message = {"role": "user", "content": event.text}
    changes: dict[str, Any] = {}
    counts = event.counts
    if counts == "warning":
        changes = {"warnings": state.warnings + 1, "warned_repeats": state.repeats}
    elif counts == "reprompt":
        changes = {"reprompts": state.reprompts + 1}
    if state.pending:
        # A directive must not split a tool call from its answer: it follows the answers.
        changes["deferred"] = (*state.deferred, directive)
    else:
        changes["history"] = (*state.history, directive)
    return _replace(
        state,
        seq=envelope.seq,
        status="running" if state.status == "idle" else state.status,
        stop_reason=None,
        **changes,
    )


def _apply_queued(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    return _replace(state, seq=envelope.seq, queued=(*state.queued, event.text))


def _apply_message(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    history = _closed(state, "not run: a new user message arrived")
    queued = state.queued
    if queued and queued[0] == event.text:
        queued = queued[1:]
    return _replace(
        state,
        queued=queued,
        seq=envelope.seq,
        history=(*history, {"role": "user", "content": event.text}),
        deferred=(),
        returned=(),
        halt_message=None,
        request=event.text,
        last_unreadable=False,
        last_flawed=False,
        last_failure=None,
        reply_calls=(),
        answering=None,
        compaction_failed=False,
        status="running",
        in_poll=True,
        polls=0,
        seen=_NONE,
        error_counts={},
        pending=(),
        episode_usage=_NO_USAGE,
        episode_started=envelope.at,
        approvals={},
        answers={},
        texts=_NONE,
        repeats=0,
        warnings=0,
        warned_repeats=0,
        reprompts=0,
        last_repeat=None,
        stop_reason=None,
        result=None,
        output=None,
    )


def _apply_replaced(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    return _replace(
        state,
        seq=envelope.seq,
        history=(*state.history, {"role": "assistant", "content": event.text}),
        reply_calls=(),
    )


def _apply_compacted(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    history = state.history
    start, end, kept = event.start, event.end, event.kept
    if not (
        0 <= start <= end <= len(history)
        and all(start <= index < end for index in kept)
        and list(kept) == sorted(set(kept))
    ):
        raise ReplayError(
            f"session {state.session_id}: seq {envelope.seq} compacts messages {start} to "
            f"{end} keeping {list(kept)}, but the history holds {len(history)}"
        )
    return _replace(
        state,
        seq=envelope.seq,
        history=(
            *history[:start],
            event.message,
            *(history[index] for index in kept),
            *history[end:],
        ),
        usage=state.usage + event.usage,
        episode_usage=state.episode_usage + event.usage,
    )


def _apply_compaction_failed(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    return _replace(
        state,
        seq=envelope.seq,
        compaction_failed=True,
        usage=state.usage + event.usage,
        episode_usage=state.episode_usage + event.usage,
    )


def _apply_halt(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    return _replace(
        state,
        seq=envelope.seq,
        history=_closed(state, f"not run: {event.reason}"),
        deferred=(),
        returned=(),
        pending=(),
        status="halted",
        in_poll=False,
        halt_message=event.message,
        stop_reason=event.reason,
        answering=None,
    )


def _apply_answer_requested(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    history = _closed(state, f"not run: {event.reason}")
    return _replace(
        state,
        seq=envelope.seq,
        history=(*history, {"role": "user", "content": event.text}),
        deferred=(),
        returned=(),
        pending=(),
        reply_calls=(),
        status="running",
        in_poll=True,
        stop_reason=None,
        answering=event,
    )


def _apply_answered(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    return _replace(
        state,
        seq=envelope.seq,
        history=_closed(state, "not run: tools were withdrawn"),
        deferred=(),
        returned=(),
        pending=(),
        reply_calls=(),
        status="idle",
        in_poll=False,
        stop_reason="end_turn",
        answering=None,
    )


def _apply_terminal(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    others = tuple(use for use in state.pending if use.id != event.tool_call_id)
    accepted = tool_message(event.tool_call_id, _compact.encode({"ok": True}).decode())
    return _replace(
        state,
        seq=envelope.seq,
        history=_closed(
            _replace(state, history=(*state.history, accepted), pending=others),
            f"not run: {event.name} ended the run",
        ),
        deferred=(),
        returned=(),
        pending=(),
        status="idle",
        in_poll=False,
        stop_reason="terminal_tool",
        result=event.result,
    )


def _apply_output(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    return _replace(state, seq=envelope.seq, output=event.value)


def _apply_cancel(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    return _replace(
        state,
        seq=envelope.seq,
        history=_closed(state, "not run: the session was cancelled"),
        deferred=(),
        returned=(),
        pending=(),
        status="cancelled",
        in_poll=False,
        stop_reason="cancelled",
    )


def _apply_returned(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    for use in state.pending:
        if use.id == event.tool_call_id:
            result = ToolResult(event.tool_call_id, event.text, event.is_error)
            return _replace(state, seq=envelope.seq, returned=(*state.returned, result))
    return _replace(state, seq=envelope.seq)


def _apply_called(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    for use in state.pending:
        if use.id == event.tool_call_id:
            return _replace(state, seq=envelope.seq, called=state.called | {use.id})
    return _replace(state, seq=envelope.seq)


def _apply_approval_requested(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    pending = {use.id for use in state.pending}
    asked = [call_id for call_id in event.tool_call_ids if call_id in pending]
    approvals = {**state.approvals, **dict.fromkeys(asked)}
    return _replace(state, seq=envelope.seq, approvals=approvals)


def _apply_approval_decided(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    call_id = event.tool_call_id
    if call_id not in state.approvals or state.approvals[call_id] is not None:
        return _replace(state, seq=envelope.seq)
    return _replace(state, seq=envelope.seq, approvals={**state.approvals, call_id: event})


def _apply_failed(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    return _replace(state, seq=envelope.seq, status="failed", in_poll=False, stop_reason="failed")


def _apply_forked(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    # The fork goes on later than its origin stopped at `at_seq`: an open episode's wall
    # clock (the budget guard's) starts again, not counting the time in between.
    started = state.episode_started
    return _replace(
        state, seq=envelope.seq, episode_started=None if started is None else envelope.at
    )


def _apply_opened(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    if envelope.seq != 1:
        raise ReplayError(
            f"session {state.session_id}: seq {envelope.seq} opens the session a second time"
        )
    return _replace(state, seq=envelope.seq)


def _apply_response(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    seq = envelope.seq
    message = event.message
    try:
        uses = tool_uses_of(message)
    except TypeError as exc:
        # Only a hand-made or damaged log gets here: poll_turn checks responses first.
        raise ReplayError(f"session {state.session_id}: seq {seq}: {exc}") from None
    seen = state.seen
    texts = state.texts
    repeats = state.repeats
    last_repeat = state.last_repeat
    flawed = False
    if uses:
        seen = seen | {call_key(use.name, use.input) for use in uses}
        status: Status = "requires_action"
        stop_reason = "tool_use"
    else:
        text = text_of(message)
        flawed = reply_flaw(text, event.finish_reason) is not None
        if text and text.strip():
            mark = digest(" ".join(text.split()))
            if mark in texts:
                repeats += 1
                last_repeat = "the same reply as before"
            else:
                texts = texts | {mark}
        status = "idle"
        stop_reason = event.finish_reason or "unknown"
    return msgspec.structs.replace(
        state,
        seq=seq,
        history=(*state.history, message),
        polls=state.polls + 1,
        seen=seen,
        texts=texts,
        repeats=repeats,
        last_repeat=last_repeat,
        pending=uses,
        called=_NONE,
        approvals={},
        usage=state.usage + event.usage,
        episode_usage=state.episode_usage + event.usage,
        last_unreadable=logged_unreadable(event.response),
        last_flawed=flawed,
        reply_calls=uses,
        status=status,
        in_poll=False,
        stop_reason=stop_reason,
    )


def _apply_results(state: SessionState, event: Any, envelope: Envelope) -> SessionState:
    seq = envelope.seq
    # Most events hold their results whole: nothing to look up, nor a place to name.
    results = (
        whole_results(state.returned, event, f"session {state.session_id}: seq {seq}")
        if event.logged
        else event.results
    )
    by_id = {use.id: use for use in state.pending}
    answered = [result.tool_use_id for result in results]
    if len(answered) != len(by_id) or set(answered) != by_id.keys():
        raise ReplayError(
            f"session {state.session_id}: seq {seq} answers tool calls {answered}, "
            f"but {sorted(by_id)} were pending"
        )
    messages: list[Message] = []
    # Only a result that changes what the episode remembers needs a _Memory: most do not.
    memory: _Memory | None = None
    for result in results:
        message = _answer(result)
        messages.append(message)
        use = by_id[result.tool_use_id]
        if memory is None and not (
            result.is_error
            or state.answers
            or use.name in state.error_counts
            or _can_run_again(state, use.name)
        ):
            continue
        if memory is None:
            memory = _Memory(state)
        error = result.text if result.is_error else None
        memory.result(use, message["content"], result.is_error, error)
    history = state.history + (
        tuple(messages) + state.deferred if state.deferred else tuple(messages)
    )
    changes: dict[str, Any] = {
        "seq": seq,
        "history": history,
        "deferred": (),
        "returned": (),
        "pending": (),
        "status": "running",
        "in_poll": True,
        "stop_reason": None,
    }
    if memory is not None:
        return memory.put(state, **changes)
    # Every result a success the episode need not remember: the step failed in nothing.
    return _replace(state, last_failure=None if messages else state.last_failure, **changes)


class _Memory:
    """What an episode remembers of its calls' results, changed one result at a time: the
    calls seen, the consecutive errors per tool, the answers loop detection compares, the
    repeats it found and the last step's failure. Each field is copied on its first change:
    states share what they do not change."""

    __slots__ = (
        "answers",
        "error_counts",
        "last_failure",
        "last_repeat",
        "repeats",
        "seen",
        "state",
    )

    def __init__(self, state: SessionState) -> None:
        self.state = state
        self.seen: frozenset[str] | set[str] = state.seen
        self.error_counts = state.error_counts
        self.answers = state.answers
        self.repeats = state.repeats
        self.last_repeat = state.last_repeat
        self.last_failure = state.last_failure

    def see(self, key: str) -> None:
        """Remember a call made (by its key)."""
        self._seen().add(key)

    def forget(self, key: str) -> None:
        """Forget a call made (by its key): the same call may run."""
        self._seen().discard(key)

    def _seen(self) -> set[str]:
        seen = self.seen
        if not isinstance(seen, set):
            seen = self.seen = set(seen)
        return seen

    def result(self, use: ToolUse, content: str, is_error: bool, error: str | None) -> None:
        """Remember the result of `use`, sent to the model as `content`; `error` is its error
        text when `is_error`.

        A failed call is no longer seen (its retry, or the corrected call, runs) and its
        answer is remembered, so loop detection judges a repeat by what it returns, as it
        does for every call of a tool that may run twice."""
        name = use.name
        counts = self.error_counts
        if is_error or name in counts:
            if counts is self.state.error_counts:
                counts = self.error_counts = dict(counts)
            if is_error:
                counts[name] = counts.get(name, 0) + 1
            else:
                del counts[name]
        self.last_failure = error if is_error else None
        key: str | None = None
        if is_error:
            key = call_key(name, use.input)
            self.forget(key)
        elif not _can_run_again(self.state, name):
            if not self.answers:
                return
            key = call_key(name, use.input)
            if key not in self.answers:
                return
        if key is None:
            key = call_key(name, use.input)
        answers = self.answers
        if answers is self.state.answers:
            answers = self.answers = dict(answers)
        # The content itself (shared with the history) rather than a digest: no hashing.
        if answers.get(key) == content:
            self.repeats += 1
            self.last_repeat = f"{name}({key_arguments(key)})"
        answers[key] = content

    def put(self, state: SessionState, **changes: Any) -> SessionState:
        """`state` with what this memory holds, and `changes`."""
        return _replace(
            state,
            seen=self.seen if isinstance(self.seen, frozenset) else _frozen(self.seen),
            error_counts=self.error_counts,
            answers=self.answers,
            repeats=self.repeats,
            last_repeat=self.last_repeat,
            last_failure=self.last_failure,
            **changes,
        )


def _can_run_again(state: SessionState, name: str) -> bool:
    """Whether the same call of `name` may run twice in an episode (so its answers are
    worth remembering for loop detection): duplicates are not deduplicated for it."""
    if state.guards.duplicates is None:
        return True
    tool = state.spec.tool(name)
    return tool is not None and tool.repeatable


_Rule = Callable[[SessionState, Any, Envelope], SessionState]

_RULES: dict[type, _Rule] = {
    ModelResponded: _apply_response,
    ToolResultsReceived: _apply_results,
    Compacted: _apply_compacted,
    CompactionFailed: _apply_compaction_failed,
    DuplicateToolCall: _apply_duplicate,
    DirectiveInjected: _apply_directive,
    ReplyReplaced: _apply_replaced,
    MessageReceived: _apply_message,
    MessageQueued: _apply_queued,
    Halted: _apply_halt,
    AnswerRequested: _apply_answer_requested,
    AnsweredAfterStop: _apply_answered,
    TerminalToolCalled: _apply_terminal,
    OutputAccepted: _apply_output,
    Cancelled: _apply_cancel,
    ToolCalled: _apply_called,
    ToolReturned: _apply_returned,
    ApprovalRequested: _apply_approval_requested,
    ApprovalDecided: _apply_approval_decided,
    Failed: _apply_failed,
    SessionOpened: _apply_opened,
    Forked: _apply_forked,
}
"""How each kind of event changes a state; the others change only its seq."""


_Phase = tuple[Status, bool, str | None]
_CALLED: _Phase = ("requires_action", False, "tool_use")
"""A trip's status, in_poll and stop_reason once it applied a response calling tools."""
_RUNNING: _Phase = ("running", True, None)
"""The same once it applied their results: the session runs its next poll."""


class _Trip:
    """The fields of a state that tool round trips change, taken out of it in a form a fold
    can change in place, and put back into it; the messages they add go to `history`, the
    fold's list of the whole history (see `fold`), which stands for the state's own.

    The tokens of the trip's responses are summed once for both usages, the tools' results
    kept as their events until `put` needs them, the last response kept until `put` reads
    its unreadable flag (only the last one's counts), and whether `close` may apply a
    tool's results found once per tool: the state that decides it stays as it is for the
    trip. The calls seen stay the state's own set until a call adds to them (a rule's trip
    most often adds none), and status, in_poll and stop_reason are the state's until a
    response or results set all three (`phase`)."""

    __slots__ = (
        "called",
        "closable",
        "completion_tokens",
        "cost",
        "history",
        "last_failure",
        "last_response",
        "pending",
        "pending_ids",
        "phase",
        "polls",
        "prompt_tokens",
        "reply_calls",
        "returned",
        "seen",
        "state",
    )

    def __init__(self, state: SessionState, history: list[Message]) -> None:
        self.state = state
        self.history = history
        self.polls = state.polls
        self.seen: frozenset[str] | set[str] = state.seen
        pending = state.pending
        self.pending = pending
        # The ids of the pending calls, for the `local.tool_call` and `local.tool_result`
        # events a fold applies in place (a tuple: most replies make one call).
        self.pending_ids = tuple([use.id for use in pending]) if pending else ()
        self.called = set(state.called)
        self.reply_calls = state.reply_calls
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost: Decimal | None = None
        self.last_response: msgspec.Raw | None = None
        self.last_failure = state.last_failure
        # Set once a response or results were applied (`call`, `close`).
        self.phase: _Phase | None = None
        self.returned: list[ToolResult | ToolReturned] = list(state.returned)
        self.closable: set[str] = set()

    def put(self, seq: int, history: tuple[Message, ...] = ()) -> SessionState:
        """The state at `seq` with the round trips applied, holding `history` (a rule's
        state holds none: what the rule adds is then all its state holds)."""
        state = self.state
        phase = self.phase
        if phase is None:
            if len(self.called) == len(state.called) and len(self.returned) == len(state.returned):
                # Nothing applied (calls are only ever added to `called` and results to
                # `returned`, until a response or results clear them).
                return _replace(state, seq=seq, history=history)
            phase = (state.status, state.in_poll, state.stop_reason)
        prompt = self.prompt_tokens
        completion = self.completion_tokens
        usage = state.usage
        episode = state.episode_usage
        seen = self.seen
        return _replace(
            state,
            seq=seq,
            history=history,
            polls=self.polls,
            seen=_frozen(seen) if type(seen) is set else seen,
            pending=self.pending,
            called=_frozen(self.called),
            reply_calls=self.reply_calls,
            usage=Usage(
                usage.prompt_tokens + prompt,
                usage.completion_tokens + completion,
                add_costs(usage.cost, self.cost),
            ),
            episode_usage=Usage(
                episode.prompt_tokens + prompt,
                episode.completion_tokens + completion,
                add_costs(episode.cost, self.cost),
            ),
            last_unreadable=state.last_unreadable
            if self.last_response is None
            else logged_unreadable(self.last_response),
            # A reply the trip applied called tools, so it is not flawed.
            last_flawed=state.last_flawed and self.last_response is None,
            last_failure=self.last_failure,
            status=phase[0],
            in_poll=phase[1],
            stop_reason=phase[2],
            returned=tuple(
                ToolResult(result.tool_call_id, result.text, result.is_error)
                if type(result) is ToolReturned
                else result
                for result in self.returned
            )
            if self.returned
            else (),
        )

    def call(self, event: ModelResponded) -> bool:
        """Apply a model response that calls tools, as `_apply_response` does; False, and
        nothing changed, for any other response."""
        message = event.message
        calls = message.get("tool_calls")
        if not calls:
            return False
        if self.state.approvals:
            # A reply after approvals were asked for: the rule clears them.
            return False
        try:
            # Each message once: nothing to gain from remembering it.
            uses = decode_tool_uses(message)
        except TypeError:
            return False
        seen = self.seen
        if type(seen) is not set:
            seen = self.seen = set(seen)
        seen.update([call_key(use.name, use.input) for use in uses])
        self.pending_ids = tuple([use.id for use in uses])
        self.history.append(message)
        self.polls += 1
        self.pending = self.reply_calls = uses
        if self.called:
            self.called.clear()
        usage = event.usage
        self.prompt_tokens += usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        if usage.cost is not None:
            self.cost = add_costs(self.cost, usage.cost)
        self.last_response = event.response
        self.phase = _CALLED
        return True

    def close(self, event: ToolResultsReceived) -> bool:
        """Apply the results of the pending calls, as `_apply_results` does, when there is
        nothing else to do: results in call order, no error or error count to change, no
        answer loop detection must remember or compare, no deferred directive. False, and
        nothing changed, otherwise."""
        pending = self.pending
        count = len(pending)
        if len(event.results) != count or self.state.deferred:
            return False
        answers = self._answers(event, count)
        if answers is None:
            return False
        closable = self.closable
        for index, (call_id, _, is_error) in enumerate(answers):
            use = pending[index]
            if call_id != use.id or is_error:
                return False
            if use.name not in closable and not self.may_close(use.name):
                return False
        if count > 1 and len({use.id for use in pending}) < count:
            # Two calls of one id: the rule says what is wrong.
            return False
        state_answers = self.state.answers
        if state_answers and any(call_key(use.name, use.input) in state_answers for use in pending):
            return False
        history = self.history
        for call_id, text, _ in answers:
            history.append(tool_message(call_id, text))
        self.returned.clear()
        if answers:
            self.last_failure = None
        self.run_on()
        return True

    def run_on(self) -> None:
        """Leave the calls answered: nothing pending, the session running its next poll."""
        self.pending = ()
        # A call or result logged for one of them from now on belongs to no pending call.
        self.pending_ids = ()
        self.phase = _RUNNING

    def _answers(
        self, event: ToolResultsReceived, count: int
    ) -> list[tuple[str, str, bool]] | None:
        """The event's `count` results whole, as (call id, text, is error), as `results_of`
        gives them; None where it does. Most often each is given by position and the
        `local.tool_result` events came one per pending call, in call order: they are the
        results, found without looking them up."""
        returned = self.returned
        if count < len(_IN_ORDER) and event.logged == _IN_ORDER[count] and len(returned) == count:
            results = event.results
            pending = self.pending
            answers: list[tuple[str, str, bool]] = []
            for index, answer in enumerate(returned):
                call_id = pending[index].id
                if (
                    type(answer) is not ToolReturned
                    or answer.tool_call_id != call_id
                    or results[index].tool_use_id != call_id
                ):
                    break
                answers.append((call_id, answer.text, answer.is_error))
            else:
                return answers
        whole = results_of(returned, event)
        if whole is None:
            return None
        return [(result.tool_use_id, result.text, result.is_error) for result in whole]

    def may_close(self, name: str) -> bool:
        """Whether a result of tool `name` may be applied in place: its error count stays
        as it is and loop detection need not remember its answers (remembered in
        `closable` for the trip once it may)."""
        state = self.state
        if name in state.error_counts or _can_run_again(state, name):
            return False
        self.closable.add(name)
        return True


_IN_ORDER = tuple(tuple(range(count)) for count in range(8))
"""`logged` of a `local.tool_results` event giving each of its `count` results by position."""
_ONE = _IN_ORDER[1]
_decode_json = msgspec.json.Decoder().decode
_canonical = msgspec.json.Encoder(order="sorted").encode
# What decoding a call's arguments, or encoding them canonically, may raise.
_NOT_PLAIN = (
    msgspec.DecodeError,
    msgspec.EncodeError,
    RecursionError,
    OverflowError,
    TypeError,
    ValueError,
)


def _plain_call(call: object) -> tuple[ToolUse, str] | None:
    """A reply's tool call and its call key, as `decode_tool_uses` and `call_key` give
    them, when the call is plain: a dict with a string id and a function dict with a
    string name, and arguments a JSON object as text, nested no deeper than allowed.
    None for anything else, which those functions handle (a fold's shortcut)."""
    if type(call) is not dict:
        return None
    function = call.get("function")
    if type(function) is not dict:
        return None
    try:
        # Indexed: a dict's own lookup, where `get` is a method call.
        call_id = call["id"]
        name = function["name"]
        arguments = function["arguments"]
    except KeyError:
        return None
    if type(call_id) is not str or type(name) is not str or type(arguments) is not str:
        return None
    # Nested deeper than allowed takes more brackets than that, and so more characters.
    if (
        len(arguments) > MAX_ARGUMENT_DEPTH
        and arguments.count("{") + arguments.count("[") > MAX_ARGUMENT_DEPTH
    ):
        return None
    try:
        value = _decode_json(arguments)
        if type(value) is not dict:
            return None
        return ToolUse(call_id, name, value), name + "\x1f" + _canonical(value).decode()
    except _NOT_PLAIN:
        return None


def fold(state: SessionState, events: Iterable[Envelope]) -> SessionState:
    """Apply `events` in order, as `apply_event` does each: replay's loop, in one pass.

    Most events of most sessions are tool round trips: a model response calling tools,
    each call's result, then the results together. The fold applies those to a `_Trip`
    when nothing else is going on, putting it back into the state only for another
    event's rule and at the end: a round trip copies neither the state nor its history.
    The commonest (a reply making one plain call, and its one result) it applies here in
    the loop, without a call; others go to the trip's `call` and `close`. Every other
    event goes through its rule. Rules only ever add messages at the end of the history,
    so a rule gets a state holding none of it, and the messages it adds join the fold's
    list: the history is made once, at the end. A compaction, which replaces older
    messages, gets the whole history and gives the fold a new list.
    """
    session_id = state.session_id
    seq = state.seq
    rules = _RULES
    history = list(state.history)
    trip = _Trip(state, history)
    for envelope in events:
        seq += 1
        if envelope.seq != seq or envelope.session_id != session_id:
            raise _out_of_order(session_id, seq, envelope)
        # Told apart by its type, looked up once: mypy does not narrow by `kind`.
        event: Any = envelope.event
        kind = type(event)
        if kind is ToolCalled:
            # As `_apply_called` does.
            if event.tool_call_id in trip.pending_ids:
                trip.called.add(event.tool_call_id)
            continue
        if kind is ToolReturned:
            # As `_apply_returned` does.
            if event.tool_call_id in trip.pending_ids:
                trip.returned.append(event)
            continue
        if kind is ModelResponded:
            message = event.message
            calls = message.get("tool_calls")
            if type(calls) is list and len(calls) == 1 and not trip.state.approvals:
                # One call, applied as `call` applies it when it is plain.
                plain = _plain_call(calls[0])
                if plain is not None:
                    use, key = plain
                    seen = trip.seen
                    if type(seen) is not set:
                        seen = trip.seen = set(seen)
                    seen.add(key)
                    trip.pending = trip.reply_calls = (use,)
                    trip.pending_ids = (use.id,)
                    history.append(message)
                    trip.polls += 1
                    if trip.called:
                        trip.called.clear()
                    usage = event.usage
                    trip.prompt_tokens += usage.prompt_tokens
                    trip.completion_tokens += usage.completion_tokens
                    if usage.cost is not None:
                        trip.cost = add_costs(trip.cost, usage.cost)
                    trip.last_response = event.response
                    trip.phase = _CALLED
                    continue
            if calls and trip.call(event):
                continue
        elif kind is ToolResultsReceived:
            # One result, given by position, of the one pending call, whose
            # `local.tool_result` came alone: applied as `close` applies it when there is
            # nothing else to do (no error, no answers to compare, no deferred directive).
            pending = trip.pending
            returned = trip.returned
            if (
                len(pending) == 1
                and len(returned) == 1
                and len(event.results) == 1
                and event.logged == _ONE
                and not trip.state.deferred
            ):
                use = pending[0]
                answer = returned[0]
                call_id = use.id
                if (
                    type(answer) is ToolReturned
                    and answer.tool_call_id == call_id
                    and event.results[0].tool_use_id == call_id
                    and not answer.is_error
                    and not trip.state.answers
                    and (use.name in trip.closable or trip.may_close(use.name))
                ):
                    # As `tool_message` makes it.
                    history.append(
                        {"role": "tool", "tool_call_id": call_id, "content": answer.text}
                    )
                    returned.clear()
                    trip.last_failure = None
                    # As `run_on` does.
                    trip.pending = trip.pending_ids = ()
                    trip.phase = _RUNNING
                    continue
            if trip.close(event):
                continue
        elif kind is Compacted:
            # The one rule that changes messages already in the history: it gets them all.
            changed = _apply_compacted(trip.put(seq - 1, tuple(history)), event, envelope)
            history = list(changed.history)
            trip = _Trip(changed, history)
            continue
        rule = rules.get(kind)
        if rule is not None:
            changed = rule(trip.put(seq - 1), event, envelope)
            history += changed.history
            trip = _Trip(changed, history)
    return trip.put(seq, tuple(history))
