"""Spans in the OpenTelemetry GenAI semantic conventions: `invoke_agent` per session
request, `chat` per model call, `execute_tool` per tool call. Prompt, completion, tool
argument and result content is recorded only when `capture_content` is on."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import msgspec
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from turnkeeper.core import ChatError, ToolResult, ToolSpec, ToolUse, decode_arguments, text_of
from turnkeeper.events import (
    AnsweredAfterStop,
    AnswerRequested,
    ChatRetried,
    Compacted,
    CompactionFailed,
    DirectiveInjected,
    DuplicateToolCall,
    Envelope,
    Halted,
    McpFailed,
)
from turnkeeper.tracing._hooks import TracedSession

_json = msgspec.json.Encoder()

# Halts that mean the request failed, rather than a guard ending it on purpose.
_FAILED_STOPS = {"chat_error": "chat_error", "timeout": "timeout"}


class OtelTracer:
    """Opens GenAI spans with an OpenTelemetry tracer."""

    def __init__(
        self, provider: trace.TracerProvider, *, capture_content: bool, provider_name: str
    ) -> None:
        self.tracer = provider.get_tracer("turnkeeper")
        self.capture_content = capture_content
        self.provider_name = provider_name

    @contextmanager
    def agent_span(
        self, state: TracedSession, prompt: str | None, parent: object | None
    ) -> Iterator[_AgentSpan]:
        attributes = self._agent_attributes(state, prompt)
        context = parent if isinstance(parent, otel_context.Context) else None
        with self._span("invoke_agent", SpanKind.INTERNAL, attributes, context) as span:
            yield _AgentSpan(span, self.capture_content)

    def start_agent_span(
        self, state: TracedSession, prompt: str | None, parent: object | None
    ) -> _AgentSpan:
        # A root span without a parent: the task that starts it may be running for another
        # session, whose span is its current one.
        context = parent if isinstance(parent, otel_context.Context) else otel_context.Context()
        span = self.tracer.start_span(
            "invoke_agent",
            context=context,
            kind=SpanKind.INTERNAL,
            attributes=self._agent_attributes(state, prompt),
            record_exception=False,
            set_status_on_exception=False,
        )
        return _AgentSpan(span, self.capture_content)

    def _agent_attributes(self, state: TracedSession, prompt: str | None) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": self.provider_name,
            "gen_ai.conversation.id": state.session_id,
            "gen_ai.request.model": state.spec.model,
        }
        if self.capture_content:
            if state.spec.system_prompt:
                attributes["gen_ai.system_instructions"] = _encode(
                    [{"type": "text", "content": state.spec.system_prompt}]
                )
            if prompt is not None:
                attributes["gen_ai.input.messages"] = _encode(
                    [{"role": "user", "parts": [{"type": "text", "content": prompt}]}]
                )
        return attributes

    @contextmanager
    def chat_span(self, request: dict[str, Any]) -> Iterator[_ChatSpan]:
        model = request.get("model")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider_name,
        }
        if isinstance(model, str):
            attributes["gen_ai.request.model"] = model
        for key, name in (
            ("temperature", "gen_ai.request.temperature"),
            ("top_p", "gen_ai.request.top_p"),
            ("max_tokens", "gen_ai.request.max_tokens"),
            ("seed", "gen_ai.request.seed"),
        ):
            value = request.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attributes[name] = value
        stop = request.get("stop")
        if isinstance(stop, list) and all(isinstance(item, str) for item in stop):
            attributes["gen_ai.request.stop_sequences"] = stop
        if self.capture_content:
            messages = request.get("messages")
            if isinstance(messages, list):
                attributes["gen_ai.input.messages"] = _encode(
                    [_message_parts(m) for m in messages if isinstance(m, dict)]
                )
        name = f"chat {model}" if isinstance(model, str) else "chat"
        with self._span(name, SpanKind.CLIENT, attributes, None) as span:
            yield _ChatSpan(span, self.capture_content)

    @contextmanager
    def tool_span(self, use: ToolUse, tool: ToolSpec | None) -> Iterator[_ToolSpan]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": use.name,
            "gen_ai.tool.call.id": use.id,
            "gen_ai.tool.type": "extension" if tool and tool.mcp_server else "function",
        }
        if tool is not None and tool.description:
            attributes["gen_ai.tool.description"] = tool.description
        if tool is not None and tool.mcp_server is not None:
            attributes["turnkeeper.mcp.server"] = tool.mcp_server
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = _encode(use.input)
        with self._span(f"execute_tool {use.name}", SpanKind.INTERNAL, attributes, None) as span:
            yield _ToolSpan(span, self.capture_content)

    def capture_context(self) -> object:
        return otel_context.get_current()

    @contextmanager
    def _span(
        self,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        context: otel_context.Context | None,
    ) -> Iterator[Span]:
        """A current span that records an exception escaping it as its error."""
        with self.tracer.start_as_current_span(
            name,
            context=context,
            kind=kind,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except Exception as exc:
                status = exc.status if isinstance(exc, ChatError) else None
                span.set_attribute(
                    "error.type", str(status) if status is not None else type(exc).__qualname__
                )
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                raise


class _AgentSpan:
    def __init__(self, span: Span, capture_content: bool) -> None:
        self.span = span
        self.capture_content = capture_content

    def current(self) -> AbstractContextManager[Span]:
        return trace.use_span(self.span, record_exception=False, set_status_on_exception=False)

    def end(self) -> None:
        self.span.end()

    def record(self, events: Sequence[Envelope]) -> None:
        for envelope in events:
            name, attributes = _span_event(envelope, self.capture_content)
            if name is not None:
                self.span.add_event(name, attributes)

    def finish(self, state: TracedSession) -> None:
        usage = state.episode_usage
        self.span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
        self.span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        self.span.set_attribute("turnkeeper.session.status", state.status)
        if state.stop_reason is not None:
            self.span.set_attribute("turnkeeper.stop_reason", state.stop_reason)
        failure = _FAILED_STOPS.get(state.stop_reason or "")
        if failure is None and state.status == "failed":
            failure = "failed"
        if failure is not None:
            self.span.set_attribute("error.type", failure)
            message = state.halt_message if self.capture_content else None
            self.span.set_status(Status(StatusCode.ERROR, message or failure))
        if self.capture_content and state.history:
            last = state.history[-1]
            if last.get("role") == "assistant":
                self.span.set_attribute("gen_ai.output.messages", _encode([_message_parts(last)]))


class _ChatSpan:
    def __init__(self, span: Span, capture_content: bool) -> None:
        self.span = span
        self.capture_content = capture_content

    def response(self, response: dict[str, Any]) -> None:
        span = self.span
        model = response.get("model")
        if isinstance(model, str):
            span.set_attribute("gen_ai.response.model", model)
        response_id = response.get("id")
        if isinstance(response_id, str):
            span.set_attribute("gen_ai.response.id", response_id)
        choices = response.get("choices")
        choices = [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []
        reasons = [c["finish_reason"] for c in choices if isinstance(c.get("finish_reason"), str)]
        if reasons:
            span.set_attribute("gen_ai.response.finish_reasons", reasons)
        usage = response.get("usage")
        if isinstance(usage, dict):
            for key, name in (
                ("prompt_tokens", "gen_ai.usage.input_tokens"),
                ("completion_tokens", "gen_ai.usage.output_tokens"),
            ):
                value = usage.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    span.set_attribute(name, value)
        if self.capture_content:
            outputs = []
            for choice in choices:
                message = choice.get("message")
                if isinstance(message, dict):
                    parts = _message_parts(message)
                    if isinstance(choice.get("finish_reason"), str):
                        parts["finish_reason"] = choice["finish_reason"]
                    outputs.append(parts)
            span.set_attribute("gen_ai.output.messages", _encode(outputs))


class _ToolSpan:
    def __init__(self, span: Span, capture_content: bool) -> None:
        self.span = span
        self.capture_content = capture_content

    def result(self, result: ToolResult, failure: McpFailed | None = None) -> None:
        if self.capture_content:
            self.span.set_attribute("gen_ai.tool.call.result", result.text)
        if result.is_error:
            error_type = failure.reason if failure is not None else "tool_error"
            self.span.set_attribute("error.type", error_type)
            description = result.text if self.capture_content else error_type
            self.span.set_status(Status(StatusCode.ERROR, description))


def _span_event(envelope: Envelope, capture_content: bool) -> tuple[str | None, dict[str, Any]]:
    """The span event that stands for a logged event, if it gets one."""
    event = envelope.event
    attributes: dict[str, Any] = {"turnkeeper.event.seq": envelope.seq}
    if isinstance(event, DirectiveInjected):
        attributes["turnkeeper.guard"] = event.guard
        if capture_content:
            attributes["turnkeeper.directive.text"] = event.text
        return "turnkeeper.guard.directive", attributes
    if isinstance(event, Halted):
        attributes["turnkeeper.guard"] = event.guard
        attributes["turnkeeper.halt.reason"] = event.reason
        if capture_content:
            attributes["turnkeeper.halt.message"] = event.message
        return "turnkeeper.guard.halt", attributes
    if isinstance(event, AnswerRequested | AnsweredAfterStop):
        attributes["turnkeeper.guard"] = event.guard
        attributes["turnkeeper.halt.reason"] = event.reason
        if isinstance(event, AnsweredAfterStop):
            return "turnkeeper.guard.answered_after_stop", attributes
        if capture_content:
            attributes["turnkeeper.directive.text"] = event.text
        return "turnkeeper.guard.answer_requested", attributes
    if isinstance(event, DuplicateToolCall):
        attributes["gen_ai.tool.name"] = event.name
        attributes["gen_ai.tool.call.id"] = event.tool_call_id
        return "turnkeeper.guard.duplicate_tool_call", attributes
    if isinstance(event, ChatRetried):
        attributes["turnkeeper.retry.attempt"] = event.attempt
        attributes["turnkeeper.retry.delay"] = event.delay
        if event.status is not None:
            attributes["error.type"] = str(event.status)
        return "turnkeeper.chat.retry", attributes
    if isinstance(event, Compacted | CompactionFailed):
        attributes["turnkeeper.compaction.estimated_tokens"] = event.estimated
        attributes["turnkeeper.compaction.budget_tokens"] = event.budget
        if isinstance(event, CompactionFailed):
            return "turnkeeper.compaction_failed", attributes
        attributes["turnkeeper.compaction.messages"] = event.end - event.start - len(event.kept)
        return "turnkeeper.compacted", attributes
    if isinstance(event, McpFailed):
        attributes["turnkeeper.mcp.server"] = event.server
        attributes["error.type"] = event.reason
        if event.tool is not None:
            attributes["gen_ai.tool.name"] = event.tool
        if event.tool_call_id is not None:
            attributes["gen_ai.tool.call.id"] = event.tool_call_id
        return "turnkeeper.mcp.error", attributes
    return None, attributes


def _message_parts(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message in the GenAI conventions' message shape (role and parts)."""
    role = message.get("role")
    parts: list[dict[str, Any]] = []
    if role == "tool":
        parts.append(
            {
                "type": "tool_call_response",
                "id": message.get("tool_call_id"),
                "response": text_of(message),
            }
        )
    else:
        text = text_of(message)
        if text:
            parts.append({"type": "text", "content": text})
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments, error = decode_arguments(function.get("arguments"))
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments") if error else arguments,
                }
            )
    return {"role": role if isinstance(role, str) else "user", "parts": parts}


def _encode(value: object) -> str:
    try:
        return _json.encode(value).decode()
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return repr(value)
