"""Human-readable lines for events, histories and outcomes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, assert_type

import msgspec

from turnkeeper.core import AgentSpec, Message, last_answer, text_of, tool_uses_of
from turnkeeper.events import (
    AnsweredAfterStop,
    AnswerRequested,
    ApprovalDecided,
    ApprovalRequested,
    Cancelled,
    ChatFailed,
    ChatRetried,
    Compacted,
    CompactionFailed,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    Failed,
    Forked,
    Halted,
    McpFailed,
    MessageQueued,
    MessageReceived,
    ModelResponded,
    OutputAccepted,
    ReplyReplaced,
    SessionOpened,
    TerminalToolCalled,
    ToolCalled,
    ToolMayHaveRun,
    ToolResultsReceived,
    ToolReturned,
)
from turnkeeper.state import SessionState, awaiting_approval

_GIST = 200  # characters of a text shown on one line
_compact = msgspec.json.Encoder()
_MCP_REASONS = {
    "start_failed": "could not start",
    "died": "went away",
    "timeout": "timed out",
    "error": "broke the protocol",
}


def gist(text: str | None, limit: int = _GIST) -> str:
    """`text` on one line, cut to `limit` characters."""
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _json(value: Any) -> str:
    try:
        return _compact.encode(value).decode()
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return repr(value)


def _calls(message: Message) -> str:
    try:
        uses = tool_uses_of(message)
    except TypeError:
        return "malformed tool calls"
    return ", ".join(f"{use.name}({_json(use.input)})" for use in uses)


def opened_line(session_id: str, spec: AgentSpec) -> str:
    """The line saying a session opened, with its model and tools."""
    tools = ", ".join(tool.name for tool in spec.tools) or "none"
    return f"session {session_id} (model {spec.model}; tools: {tools})"


def user_line(text: str) -> str:
    """The line showing a user message."""
    return f"user: {gist(text)}"


def step_line(envelope: Envelope) -> str | None:
    """One line saying what `envelope` did, or None for an event not worth a line."""
    event = envelope.event
    if isinstance(event, SessionOpened):
        return opened_line(envelope.session_id, event.spec)
    if isinstance(event, MessageReceived):
        return user_line(event.text)
    if isinstance(event, MessageQueued):
        return f"queued: {gist(event.text)}"
    if isinstance(event, DirectiveInjected):
        return f"guard {event.guard}: {gist(event.text)}"
    if isinstance(event, ModelResponded):
        if event.message.get("tool_calls"):
            return f"model: calls {gist(_calls(event.message))} {_usage(event)}"
        said = gist(text_of(event.message)) or "(no text)"
        return f"model: {said}{reply_tail(event)}"
    if isinstance(event, ReplyReplaced):
        return f"guard {event.guard}: answer replaced with: {gist(event.text)}"
    if isinstance(event, Compacted):
        summarised = event.end - event.start - len(event.kept)
        return (
            f"compacted: {_count(summarised, 'older message')} summarised "
            f"(~{event.estimated} tokens, over the {event.budget} budget): "
            f"{gist(text_of(event.message))}"
        )
    if isinstance(event, CompactionFailed):
        return (
            f"compaction failed (~{event.estimated} tokens, over the {event.budget} budget): "
            f"{gist(event.error)}; the history is cut instead"
        )
    if isinstance(event, McpFailed):
        what = _MCP_REASONS.get(event.reason, event.reason)
        tool = f" (calling {event.tool})" if event.tool else ""
        return f"MCP server {event.server} {what}{tool}: {gist(event.error)}"
    if isinstance(event, DuplicateToolCall):
        return f"guard duplicates: {event.name}({gist(event.arguments)}) repeats an earlier call"
    if isinstance(event, ChatRetried):
        return f"retry {event.attempt} in {event.delay:.1f} s: {gist(event.error)}"
    if isinstance(event, ChatFailed):
        return f"model failed: {gist(event.error)}"
    if isinstance(event, ToolCalled):
        return f"tool {event.name}({gist(_json(event.input))})"
    if isinstance(event, ToolReturned):
        return f"  {'error' if event.is_error else '->'} {gist(event.text)}"
    if isinstance(event, ToolMayHaveRun):
        return f"tool {event.name} again: it may have run before (no result was logged)"
    if isinstance(event, ApprovalRequested):
        return f"awaiting approval: {', '.join(event.tool_call_ids)}"
    if isinstance(event, ApprovalDecided):
        decided = "approved" if event.approved else "denied"
        why = f": {gist(event.reason)}" if event.reason else ""
        return f"{decided} {event.tool_call_id}{why}"
    if isinstance(event, Halted):
        return f"halted by {event.guard} ({event.reason}): {gist(event.message)}"
    if isinstance(event, AnswerRequested):
        return (
            f"guard {event.guard} ({event.reason}): stopped; asking for an answer from the "
            "tool results, tools withdrawn"
        )
    if isinstance(event, AnsweredAfterStop):
        return f"answered after {event.guard} ({event.reason})"
    if isinstance(event, TerminalToolCalled):
        return f"finished with {event.name}({gist(_json(event.result))})"
    if isinstance(event, OutputAccepted):
        return f"typed output: {gist(_json(event.value))}"
    if isinstance(event, Cancelled):
        return f"cancelled: {gist(event.reason)}"
    if isinstance(event, Failed):
        return f"failed: {gist(event.error)}"
    if isinstance(event, Forked):
        return f"forked from session {event.origin} at seq {event.at_seq}"
    assert_type(event, ToolResultsReceived)  # every other kind has its line above
    return None


def reply_tail(event: ModelResponded) -> str:
    """What the line of a reply without tool calls shows after its text: why it stopped,
    unless it finished, and its usage."""
    stopped = "" if event.finish_reason == "stop" else f" (stopped: {event.finish_reason})"
    return f"{stopped} {_usage(event)}"


def _usage(event: ModelResponded) -> str:
    usage = f"[{event.usage.prompt_tokens}+{event.usage.completion_tokens} tokens]"
    if event.usage.cost is not None:
        usage = f"{usage[:-1]}, cost {event.usage.cost}]"
    return usage


def _indented(text: str) -> str:
    """`text` with its lines after the first indented, so each block reads as one."""
    return "\n".join(f"  {line}" if line.strip() else "" for line in text.splitlines()).strip()


def history_lines(history: Sequence[Message]) -> Iterator[str]:
    """Each message of a history, in full, one block per message."""
    for message in history:
        role = message.get("role", "?")
        text = text_of(message)
        if role == "assistant":
            parts = [_indented(text)] if text else []
            if message.get("tool_calls"):
                parts.append(f"calls {_calls(message)}")
            yield f"assistant: {' | '.join(parts) or '(empty)'}"
        elif role == "tool":
            yield f"tool [{message.get('tool_call_id')}]: {_indented(text or '')}"
        else:
            yield f"{role}: {_indented(text or '')}"


def answer_of(state: SessionState) -> str | None:
    """What the session ended with: its result, halt message or last assistant text."""
    if state.result is not None:
        return result_text(state.result)
    if state.halt_message is not None:
        return state.halt_message
    return last_answer(state.history)


def result_text(result: dict[str, Any]) -> str:
    """A terminal tool's result: its one text field as is, else JSON."""
    values = list(result.values())
    if len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return _json(result)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def outcome_lines(state: SessionState) -> Iterator[str]:
    """The session's status, stop reason, polls and usage, then what it ended with."""
    usage = state.usage
    reason = f" ({state.stop_reason})" if state.stop_reason else ""
    yield (
        f"outcome: {state.status}{reason} after {_count(state.polls, 'model call')} this "
        f"episode; {usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens"
        + ("" if usage.cost is None else f", cost {usage.cost}")
    )
    awaiting = awaiting_approval(state)
    if awaiting:
        yield f"awaiting approval: {', '.join(use.name for use in awaiting)}"
    elif state.pending:
        yield f"waiting for tool results: {', '.join(use.name for use in state.pending)}"
    answer = answer_of(state)
    if answer:
        label = "result" if state.result is not None else "answer"
        if state.halt_message is not None:
            label = "message"
        yield f"{label}: {_indented(answer)}"
