"""Where sessions open spans. Without `configure` every hook is a no-op that never imports
OpenTelemetry; with it, the hooks hand over to the tracer in `_otel`."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from turnkeeper.core import (
    AgentSpec,
    Chat,
    Message,
    ToolResult,
    ToolSpec,
    ToolUse,
    Usage,
    wraps_chat,
)
from turnkeeper.events import Envelope, McpFailed


class TracedSession(Protocol):
    """What a span reads of a session: the few attributes of `SessionState` it records.
    Structural, so tracing depends on core and events only, not on the state package."""

    @property
    def session_id(self) -> str: ...

    @property
    def spec(self) -> AgentSpec: ...

    @property
    def history(self) -> Sequence[Message]: ...

    @property
    def status(self) -> str: ...

    @property
    def episode_usage(self) -> Usage: ...

    @property
    def stop_reason(self) -> str | None: ...

    @property
    def halt_message(self) -> str | None: ...


class AgentSpan(Protocol):
    """The span of one session request (`invoke_agent`)."""

    def record(self, events: Sequence[Envelope]) -> None:
        """Add the guard directives, halts, duplicate calls, retries and MCP failures among
        `events` as span events."""

    def finish(self, state: TracedSession) -> None:
        """Set what the request ended with: usage, stop reason, and errors."""

    def current(self) -> AbstractContextManager[object]:
        """Make the span the current one (the parent of the spans opened) in this task for
        the block, for a span from `start_agent_span`."""

    def end(self) -> None:
        """End a span from `start_agent_span`."""


class ChatSpan(Protocol):
    """The span of one model call (`chat`)."""

    def response(self, response: dict[str, Any]) -> None:
        """Set the response model, id, finish reasons and token usage."""


class ToolSpan(Protocol):
    """The span of one tool call (`execute_tool`)."""

    def result(self, result: ToolResult, failure: McpFailed | None = None) -> None:
        """Set the call's outcome; an error result marks the span as failed."""


class Tracer(Protocol):
    """What `configure` installs: a factory of the three kinds of spans."""

    def agent_span(
        self, state: TracedSession, prompt: str | None, parent: object | None
    ) -> AbstractContextManager[AgentSpan]: ...

    def start_agent_span(
        self, state: TracedSession, prompt: str | None, parent: object | None
    ) -> AgentSpan: ...

    def chat_span(self, request: dict[str, Any]) -> AbstractContextManager[ChatSpan]: ...

    def tool_span(
        self, use: ToolUse, tool: ToolSpec | None
    ) -> AbstractContextManager[ToolSpan]: ...

    def capture_context(self) -> object: ...


class _NoSpan:
    """Every span when tracing is off: it records nothing."""

    def record(self, events: Sequence[Envelope]) -> None:
        pass

    def finish(self, state: TracedSession) -> None:
        pass

    def current(self) -> AbstractContextManager[object]:
        return _NOTHING_CURRENT

    def end(self) -> None:
        pass

    def response(self, response: dict[str, Any]) -> None:
        pass

    def result(self, result: ToolResult, failure: McpFailed | None = None) -> None:
        pass


_NOTHING_CURRENT = nullcontext()
_NO_SPAN = _NoSpan()
# Reusable, and cheaper to enter than a generator-based context manager: hosts open a
# span per request and per tool call whether tracing is on or not.
_NO_SPAN_CONTEXT = nullcontext(_NO_SPAN)


class _Active:
    """The installed tracer, or None while tracing is off."""

    tracer: Tracer | None = None


def install(tracer: Tracer | None) -> None:
    """Make `tracer` the one every hook uses (None turns tracing off)."""
    _Active.tracer = tracer


def enabled() -> bool:
    """Whether tracing is configured."""
    return _Active.tracer is not None


def agent_span(
    state: TracedSession, *, prompt: str | None = None, parent: object | None = None
) -> AbstractContextManager[AgentSpan]:
    """A span around one session request, from a user message (`prompt`) or a resume to
    the end of the turn. `parent` is a context from `capture_context`, for a request taken
    from another task; by default the span is a child of the current one."""
    tracer = _Active.tracer
    if tracer is None:
        return _NO_SPAN_CONTEXT
    return tracer.agent_span(state, prompt, parent)


def start_agent_span(
    state: TracedSession, *, prompt: str | None = None, parent: object | None = None
) -> AgentSpan:
    """A started span of one session request, as `agent_span` opens, for a request whose
    turns run in more than one task (a Host's): it is not made current, so that no other
    request's spans take it as their parent from a task it was opened in. Each task makes
    it current around the work that opens spans under it (`AgentSpan.current`), and `end`
    ends it. Without `parent` it is a root span."""
    tracer = _Active.tracer
    if tracer is None:
        return _NO_SPAN
    return tracer.start_agent_span(state, prompt, parent)


def traced_chat(chat: Chat) -> Chat:
    """`chat`, with a span around each call while tracing is on."""

    async def traced(request: dict[str, Any]) -> dict[str, Any]:
        tracer = _Active.tracer
        if tracer is None:
            return await chat(request)
        with tracer.chat_span(request) as span:
            response = await chat(request)
            span.response(response)
            return response

    return wraps_chat(traced, chat)


def tool_span(use: ToolUse, tool: ToolSpec | None) -> AbstractContextManager[ToolSpan]:
    """A span around one tool call; `tool` is its spec, when the session has one."""
    tracer = _Active.tracer
    if tracer is None:
        return _NO_SPAN_CONTEXT
    return tracer.tool_span(use, tool)


def capture_context() -> object | None:
    """The current trace context, to pass as `parent` to a span opened in another task
    (None while tracing is off)."""
    tracer = _Active.tracer
    return None if tracer is None else tracer.capture_context()
