"""Every `local.*` event, as frozen msgspec Structs with explicit stable tags, and the envelope."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from turnkeeper.core import AgentSpec, GuardConfig, Message, ToolResult, Usage


class Event(msgspec.Struct, frozen=True, gc=False, tag_field="type"):
    """Base of every event; the `type` tag on the wire is the class's explicit `tag`.

    Events and envelopes are not tracked by the cycle collector (`gc=False`): they hold
    only data that cannot point back at them, and a log read or replay makes thousands,
    which the collector would otherwise walk again and again (a fifth to a half of the
    time of reading a log).
    """


class SessionOpened(Event, frozen=True, tag="local.session_opened"):
    """A session began: everything needed to rebuild its initial state."""

    spec: AgentSpec
    history: tuple[Message, ...]
    max_turns: int
    guards: GuardConfig
    resume: bool


class MessageReceived(Event, frozen=True, tag="local.user_message"):
    """A user message arrived; it starts a new request episode. It takes the oldest queued
    message off the queue when that is the same text (the host delivers them in order)."""

    text: str


class MessageQueued(Event, frozen=True, tag="local.message_queued"):
    """A message accepted while the session was busy, logged before the sender hears back so
    it survives a crash; a `local.user_message` delivers it when the session is free."""

    text: str


class ToolResultsReceived(Event, frozen=True, tag="local.tool_results", omit_defaults=True):
    """The results of the pending tool uses, in call order (possibly none).

    Each text is logged once: `logged` holds the positions in `results` of those whose
    `local.tool_result`, earlier in the session, holds the same result; their text here is
    empty, and `turnkeeper.state.results_of` gives them whole. (A log written before
    `logged` holds every text here too, and reads the same.)
    """

    results: tuple[ToolResult, ...]
    logged: tuple[int, ...] = ()


Counts = Literal["warning", "reprompt"]
"""What a directive counts in the session's state: a loop warning (`warnings`, and the
repeats it warned of) or a re-prompt (`reprompts`) for the terminal tool, or for an answer
that does not match the output schema (a spec has one or the other)."""

LEGACY_COUNTS: dict[str, Counts] = {"loop": "warning", "terminal": "reprompt"}
"""What a directive logged without `counts` (before the field existed) counts, by the guard
that sent it: the fold then told them apart by these names."""


class DirectiveInjected(Event, frozen=True, tag="local.directive"):
    """A guard added a user directive to the history. `guard` names the guard; `counts`
    says what the directive counts in the state (None: nothing). Left out (as in a log
    written before the field existed), it is what `LEGACY_COUNTS` gives for the guard."""

    guard: str
    text: str
    counts: Counts | msgspec.UnsetType | None = msgspec.UNSET

    def __post_init__(self) -> None:
        if self.counts is msgspec.UNSET:
            msgspec.structs.force_setattr(self, "counts", LEGACY_COUNTS.get(self.guard))


class ModelResponded(Event, frozen=True, tag="local.model_response"):
    """The model answered. `response` is verbatim; `message` is what history holds.

    `response` is the backend's response as encoded JSON, as it is logged (an object,
    when this package logged it): `msgspec.json.decode(event.response)` gives the dict.
    Nothing that rebuilds a state needs more of it than one flag, so a read does not
    build its dicts and lists: that was most of the cost of decoding a log, and of the
    collector's walks after. (Nor is it checked when read: a check in Python would cost
    a third of what is saved.)
    """

    response: msgspec.Raw
    message: Message
    finish_reason: str | None
    usage: Usage

    def __repr__(self) -> str:
        # msgspec.Raw's own repr shows only an address.
        return (
            f"ModelResponded(response=Raw({bytes(self.response)!r}), message={self.message!r}, "
            f"finish_reason={self.finish_reason!r}, usage={self.usage!r})"
        )


class Compacted(Event, frozen=True, tag="local.compacted"):
    """Older turns were summarised by the model, in a call of its own, before the poll's
    model call: `message` (the summary, as a user message) takes the place of the history's
    messages from index `start` up to `end` (not included), but for those at the indexes
    `kept` (the current request), which follow it in their order.

    `estimated` is the history's size in tokens, as the backend estimated it, that was past
    `budget`. `response` is the summary call's response verbatim, as encoded JSON (as a
    `local.model_response` keeps it); `usage` its tokens and cost, which the session's
    usage counts.
    """

    start: int
    end: int
    kept: tuple[int, ...]
    message: Message
    estimated: int
    budget: int
    response: msgspec.Raw
    usage: Usage

    def __repr__(self) -> str:
        # msgspec.Raw's own repr shows only an address.
        return (
            f"Compacted(start={self.start!r}, end={self.end!r}, kept={self.kept!r}, "
            f"message={self.message!r}, estimated={self.estimated!r}, budget={self.budget!r}, "
            f"response=Raw({bytes(self.response)!r}), usage={self.usage!r})"
        )


class CompactionFailed(Event, frozen=True, tag="local.compaction_failed"):
    """The summary call of a compaction failed, or gave no summary to use (`error` says
    which): the history goes to the model as it is, cut as it would be without compaction
    (by the small-model window, or the backend's prompt fitting), and no summary is asked
    for again until the next request. `estimated` and `budget` are as a `local.compacted`'s;
    `usage` is the call's, if it answered; `response` what it answered, if it was not used
    (as `local.chat_error` keeps it)."""

    error: str
    estimated: int
    budget: int
    transient: bool = False
    status: int | None = None
    usage: Usage = Usage()
    response: Any = None


class DuplicateToolCall(Event, frozen=True, tag="local.duplicate_tool_call"):
    """A call repeating (name, args) from earlier in the episode was self-answered, not run."""

    tool_call_id: str
    name: str
    arguments: str
    message: str


class ReplyReplaced(Event, frozen=True, tag="local.reply_replaced"):
    """A guard replaced the model's answer (one that only echoed an earlier tool result)
    with `text`; the model's own reply stays in the log and the history."""

    guard: str
    text: str


class ChatRetried(Event, frozen=True, tag="local.chat_retry"):
    """A transient chat failure; the request is retried after `delay` seconds."""

    attempt: int
    delay: float
    error: str
    status: int | None = None


class ChatFailed(Event, frozen=True, tag="local.chat_error"):
    """The chat backend failed for good this poll; the state is as it was before it."""

    error: str
    transient: bool
    status: int | None = None
    response: Any = None


class ToolCalled(Event, frozen=True, tag="local.tool_call"):
    """A tool handler is about to run (logged first, so a handler can dedupe on the id)."""

    tool_call_id: str
    name: str
    input: dict[str, Any]


class ToolMayHaveRun(Event, frozen=True, tag="local.tool_may_have_run"):
    """A call about to run again whose `local.tool_call` is logged with no result after it
    (the session's task crashed, its host was killed, or another worker owned it): its
    handler may have run already (at least once is all a log can promise;
    `ToolContext.idempotency_key` lets a handler dedupe)."""

    tool_call_id: str
    name: str


class ToolReturned(Event, frozen=True, tag="local.tool_result"):
    """A tool handler finished."""

    tool_call_id: str
    text: str
    is_error: bool = False


class ApprovalRequested(Event, frozen=True, tag="local.approval_requested"):
    """Calls of the model's last reply need approval before they run (their tools'
    `approval` policy says so for their arguments): the session waits for a decision on
    each (`local.approval_decided`) before any call of the reply runs."""

    tool_call_ids: tuple[str, ...]


class ApprovalDecided(Event, frozen=True, tag="local.approval_decided"):
    """A call awaiting approval was approved (it runs) or denied (it does not; the model
    gets a tool error saying so, with `reason` if one was given)."""

    tool_call_id: str
    approved: bool
    reason: str | None = None


class McpFailed(Event, frozen=True, tag="local.mcp_error"):
    """An MCP server failed: it could not start (`start_failed`), went away (`died`), did not
    answer a call in time (`timeout`) or broke the protocol (`error`). A failed call names
    its tool and call id; the model gets the error as that call's result."""

    server: str
    reason: str
    error: str
    tool: str | None = None
    tool_call_id: str | None = None


class Halted(Event, frozen=True, tag="local.halted"):
    """A guard or the runner stopped the episode. `message` is what the user is told."""

    guard: str
    reason: str
    message: str


class AnswerRequested(Event, frozen=True, tag="local.answer_requested"):
    """A guard stopped an episode that has tool results (`guard` and `reason` as a halt
    names them): instead of halting, the session makes one last model call with tools
    withdrawn, `text` asking it to answer from those results. Calls of the last reply
    still pending are answered as not run. `message` is the halt's, told to the user if
    that call gives no answer."""

    guard: str
    reason: str
    message: str
    text: str


class AnsweredAfterStop(Event, frozen=True, tag="local.answered_after_stop"):
    """The reply to the call an `local.answer_requested` asked for is the episode's
    answer: it ends `end_turn`. `guard` and `reason` name the stop that led to it."""

    guard: str
    reason: str


class TerminalToolCalled(Event, frozen=True, tag="local.terminal"):
    """The model called the terminal tool; its arguments are the run's result."""

    tool_call_id: str
    name: str
    result: dict[str, Any]


class OutputAccepted(Event, frozen=True, tag="local.output"):
    """The episode's answer matched the spec's `output_schema`: `value` is the JSON value
    its text gives (after the safe coercions), the session's typed output."""

    value: Any


class Cancelled(Event, frozen=True, tag="local.cancelled"):
    """The session was cancelled from outside."""

    reason: str


class Forked(Event, frozen=True, tag="local.forked"):
    """This session began as a fork of session `origin`: the events before this one are
    the first `at_seq` of `origin`'s, as they were logged there (under this session's id).
    From here on it runs on its own, an open episode's wall clock starting again now. A
    call logged as about to run with no result by `at_seq` may have run in the origin: it
    runs again here, `local.tool_may_have_run` first."""

    origin: str
    at_seq: int


class Failed(Event, frozen=True, tag="local.failed"):
    """The session crashed too often and was given up."""

    error: str


AnyEvent = (
    SessionOpened
    | MessageReceived
    | MessageQueued
    | ToolResultsReceived
    | DirectiveInjected
    | ModelResponded
    | Compacted
    | CompactionFailed
    | DuplicateToolCall
    | ReplyReplaced
    | ChatRetried
    | ChatFailed
    | ToolCalled
    | ToolMayHaveRun
    | ToolReturned
    | ApprovalRequested
    | ApprovalDecided
    | McpFailed
    | Halted
    | AnswerRequested
    | AnsweredAfterStop
    | TerminalToolCalled
    | OutputAccepted
    | Cancelled
    | Forked
    | Failed
)


class Envelope(msgspec.Struct, frozen=True, gc=False):
    """One logged event: `seq` is 1, 2, 3... per session, `at` is Unix time in seconds."""

    session_id: Annotated[str, msgspec.Meta(min_length=1)]
    seq: Annotated[int, msgspec.Meta(ge=1)]
    at: float
    event: AnyEvent

    @property
    def type(self) -> str:
        """The event's stable tag, such as `local.model_response`."""
        tag = type(self.event).__struct_config__.tag
        assert isinstance(tag, str)
        return tag
