"""OpenTelemetry traces in the GenAI semantic conventions, off until configured.

Install the extra (`pip install 'turnkeeper[otel]'`) and call `configure(provider)`, or
`configure_from_env()` to export over OTLP to the collector named by the standard
`OTEL_EXPORTER_OTLP_*` variables. Until then nothing imports OpenTelemetry.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from turnkeeper.core import TurnkeeperError
from turnkeeper.tracing._hooks import (
    AgentSpan,
    ChatSpan,
    ToolSpan,
    TracedSession,
    agent_span,
    capture_context,
    enabled,
    install,
    start_agent_span,
    tool_span,
    traced_chat,
)

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI instrumentations' switch for recording message content: `true` turns it on."""

_EXTRA_HINT = "install turnkeeper with the otel extra: pip install 'turnkeeper[otel]'"


class TracingUnavailable(TurnkeeperError):
    """Tracing was asked for, but OpenTelemetry is not installed."""


def configure(
    tracer_provider: TracerProvider | None = None,
    *,
    capture_content: bool | None = None,
    provider_name: str = "openai",
) -> None:
    """Trace sessions with `tracer_provider` (by default the global one).

    Prompts, completions, directive texts and tool arguments and results are recorded
    only with `capture_content` (default: the `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`
    variable is `true`). `provider_name` is `gen_ai.provider.name`: `openai` fits the
    OpenAI-compatible chat API the backends speak.
    """
    try:
        from opentelemetry import trace

        from turnkeeper.tracing._otel import OtelTracer
    except ImportError as exc:
        raise TracingUnavailable(f"OpenTelemetry is not installed; {_EXTRA_HINT}") from exc
    if capture_content is None:
        capture_content = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    install(OtelTracer(provider, capture_content=capture_content, provider_name=provider_name))


def configure_from_env() -> bool:
    """Export traces over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and `OTEL_SDK_DISABLED` is not `true`:
    installs an SDK tracer provider as the global one and configures tracing with it.
    Returns whether it did; it imports nothing when the variables are unset."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    ):
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            f"OTEL_EXPORTER_OTLP_ENDPOINT is set, but the OpenTelemetry SDK or its OTLP "
            f"exporter is not installed; {_EXTRA_HINT}"
        ) from exc
    defaults = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "turnkeeper"}
    provider = SdkTracerProvider(resource=Resource.create(defaults))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    configure(provider)
    return True


def disable() -> None:
    """Turn tracing off again."""
    install(None)


__all__ = [
    "CAPTURE_CONTENT_ENV",
    "AgentSpan",
    "ChatSpan",
    "ToolSpan",
    "TracedSession",
    "TracingUnavailable",
    "agent_span",
    "capture_context",
    "configure",
    "configure_from_env",
    "disable",
    "enabled",
    "start_agent_span",
    "tool_span",
    "traced_chat",
]
