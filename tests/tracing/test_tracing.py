"""Traces in the GenAI semantic conventions, read back with the OpenTelemetry SDK's
in-memory exporter; OTLP export to a collector on 127.0.0.1; no OpenTelemetry import
unless tracing is configured."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import msgspec
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.sessions.host_worker import SPEC as HOST_SPEC
from tests.sessions.host_worker import answer_for, prompt_for, settle, step_text, stepper
from turnkeeper import tracing
from turnkeeper.core import (
    AgentSpec,
    ChatError,
    Compaction,
    GuardConfig,
    MaxTurns,
    McpServer,
    ToolSpec,
)
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import Host, open_session, run

SRC = str(Path(__file__).resolve().parents[2] / "src")
MCP_SERVER = str(Path(__file__).parents[1] / "tools" / "mcp_server.py")
SECRET = "the-prompt-is-private"
SPEC = AgentSpec(
    system_prompt="You add numbers. " + SECRET,
    tools=(ToolSpec("add", "Add two numbers"), ToolSpec("explode")),
    model="tiny-q4",
    temperature=0.2,
    seed=7,
)
CONTENT_KEYS = {
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "turnkeeper.directive.text",
    "turnkeeper.halt.message",
}


async def add(a: int, b: int) -> str:
    return f"{a + b} {SECRET}"


async def explode() -> str:
    raise RuntimeError("kaboom")


def answered(response: dict[str, Any]) -> dict[str, Any]:
    """`response` as a server sends it: with its model and id."""
    return {**response, "model": "tiny-q4-2025", "id": "chatcmpl-1"}


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    monkeypatch.delenv(tracing.CAPTURE_CONTENT_ENV, raising=False)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    yield exporter
    tracing.disable()
    provider.shutdown()


def by_operation(finished: tuple[ReadableSpan, ...], operation: str) -> list[ReadableSpan]:
    return [s for s in finished if (s.attributes or {}).get("gen_ai.operation.name") == operation]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def attrs_of(event: Any) -> dict[str, Any]:
    """A span event's attributes."""
    return dict(event.attributes or {})


def run_script(code: str, env: dict[str, str] | None = None) -> str:
    """Run `code` in a fresh interpreter and return its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": SRC, **(env or {})},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


SESSION = """
import anyio
from turnkeeper.core import AgentSpec, ToolSpec
from turnkeeper.providers import ScriptedChat, text_response, tool_response
from turnkeeper.sessions import run

async def add(a, b):
    return str(a + b)

async def main():
    chat = ScriptedChat([tool_response(("add", {"a": 1, "b": 2})), text_response("3")])
    result = await run(AgentSpec(tools=(ToolSpec("add"),)), "1+2?", chat, tools={"add": add})
    assert result.text == "3"

anyio.run(main, backend="trio")
"""


def test_no_opentelemetry_is_imported_unless_tracing_is_configured() -> None:
    out = run_script(
        "import sys, turnkeeper, turnkeeper.tracing\n"
        + SESSION
        + "\nprint(turnkeeper.tracing.enabled(), sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('opentelemetry', 'mcp')))"
    )
    assert out.split() == ["False", "[]"]


def test_without_the_extra_sessions_run_and_configuring_says_what_to_install() -> None:
    out = run_script(
        textwrap.dedent(
            """
        import sys

        class NoOpenTelemetry:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "opentelemetry":
                    raise ImportError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoOpenTelemetry())
        import os
        from turnkeeper import tracing

        assert tracing.configure_from_env() is False
        for call in (tracing.configure, tracing.configure_from_env):
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:4318"
            try:
                call()
            except tracing.TracingUnavailable as error:
                print(error)
        """
        )
        + SESSION
    )
    lines = out.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "pip install 'turnkeeper[otel]'" in line


@pytest.mark.anyio
async def test_a_session_gives_a_span_tree_in_the_genai_conventions(
    spans: InMemorySpanExporter,
) -> None:
    chat = ScriptedChat(
        [
            answered(tool_response(("add", {"a": 2, "b": 3}), ("explode", {}), usage=(30, 5))),
            answered(text_response("5", usage=(50, 2))),
        ]
    )
    result = await run(SPEC, SECRET, chat, tools={"add": add, "explode": explode})
    assert result.text == "5"
    finished = spans.get_finished_spans()
    [agent] = by_operation(finished, "invoke_agent")
    chats = by_operation(finished, "chat")
    tools = by_operation(finished, "execute_tool")
    assert len(finished) == 1 + 2 + 2
    assert agent.parent is None
    assert agent.context is not None
    for child in (*chats, *tools):
        assert child.parent is not None
        assert child.parent.span_id == agent.context.span_id
        assert child.context is not None
        assert child.context.trace_id == agent.context.trace_id

    assert agent.name == "invoke_agent"
    assert agent.kind == SpanKind.INTERNAL
    assert attrs(agent) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": "openai",
        "gen_ai.conversation.id": result.session_id,
        "gen_ai.request.model": "tiny-q4",
        "gen_ai.usage.input_tokens": 80,
        "gen_ai.usage.output_tokens": 7,
        "turnkeeper.session.status": "idle",
        "turnkeeper.stop_reason": "stop",
    }
    assert agent.status.status_code == StatusCode.UNSET

    first, second = sorted(chats, key=lambda s: s.start_time or 0)
    assert first.name == "chat tiny-q4"
    assert first.kind == SpanKind.CLIENT
    assert attrs(first) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "tiny-q4",
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.seed": 7,
        "gen_ai.response.model": "tiny-q4-2025",
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ("tool_calls",),
        "gen_ai.usage.input_tokens": 30,
        "gen_ai.usage.output_tokens": 5,
    }
    assert attrs(second)["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs(second)["gen_ai.usage.input_tokens"] == 50

    named = {attrs(span)["gen_ai.tool.name"]: span for span in tools}
    assert named["add"].name == "execute_tool add"
    assert named["add"].kind == SpanKind.INTERNAL
    assert attrs(named["add"]) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "add",
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.description": "Add two numbers",
    }
    assert named["add"].status.status_code == StatusCode.UNSET
    assert named["explode"].status.status_code == StatusCode.ERROR
    assert attrs(named["explode"])["error.type"] == "tool_error"

    # No content by default: not the prompt, the system prompt, arguments or results.
    for span in finished:
        values = [*attrs(span).values()]
        values += [v for event in span.events for v in (event.attributes or {}).values()]
        assert not CONTENT_KEYS & set(attrs(span))
        assert not any(SECRET in str(value) for value in values)
        assert SECRET not in (span.status.description or "")


@pytest.mark.anyio
async def test_content_is_recorded_when_the_user_opts_in(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(tracing.CAPTURE_CONTENT_ENV, "true")
    tracing.configure(spans_provider(spans))
    chat = ScriptedChat([tool_response(("add", {"a": 2, "b": 3})), text_response("five")])
    await run(SPEC, "2+3?", chat, tools={"add": add})
    finished = spans.get_finished_spans()
    [agent] = by_operation(finished, "invoke_agent")
    assert json.loads(attrs(agent)["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "2+3?"}]}
    ]
    assert SECRET in attrs(agent)["gen_ai.system_instructions"]
    assert json.loads(attrs(agent)["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "five"}]}
    ]
    first = min(by_operation(finished, "chat"), key=lambda s: s.start_time or 0)
    sent = json.loads(attrs(first)["gen_ai.input.messages"])
    assert [m["role"] for m in sent] == ["system", "user"]
    assert json.loads(attrs(first)["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "call_1", "name": "add", "arguments": {"a": 2, "b": 3}}
            ],
            "finish_reason": "tool_calls",
        }
    ]
    [tool] = by_operation(finished, "execute_tool")
    assert json.loads(attrs(tool)["gen_ai.tool.call.arguments"]) == {"a": 2, "b": 3}
    assert attrs(tool)["gen_ai.tool.call.result"] == f"5 {SECRET}"


def spans_provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.mark.anyio
async def test_guard_directives_and_halts_are_span_events(spans: InMemorySpanExporter) -> None:
    chat = ScriptedChat(
        [tool_response(("add", {"a": 1, "b": n})) for n in range(3)] + [text_response("x")]
    )
    # Without the answer after max_turns' stop, so that the final-turn directive is sent.
    halting = GuardConfig(max_turns=MaxTurns(answer=False))
    result = await run(SPEC, "count", chat, tools={"add": add}, max_turns=2, guards=halting)
    assert result.stop_reason == "max_turns_exceeded"
    [agent] = by_operation(spans.get_finished_spans(), "invoke_agent")
    events = [(event.name, dict(event.attributes or {})) for event in agent.events]
    directives = [a for name, a in events if name == "turnkeeper.guard.directive"]
    halts = [a for name, a in events if name == "turnkeeper.guard.halt"]
    assert [d["turnkeeper.guard"] for d in directives] == ["final_turn"]
    assert [(h["turnkeeper.guard"], h["turnkeeper.halt.reason"]) for h in halts] == [
        ("max_turns", "max_turns_exceeded")
    ]
    assert all(isinstance(a["turnkeeper.event.seq"], int) for _, a in events)
    assert attrs(agent)["turnkeeper.stop_reason"] == "max_turns_exceeded"


@pytest.mark.anyio
async def test_an_answer_after_a_stop_is_two_span_events(spans: InMemorySpanExporter) -> None:
    chat = ScriptedChat([tool_response(("add", {"a": 1, "b": 2})), text_response("1 + 2 = 3")])
    result = await run(SPEC, "count", chat, tools={"add": add}, max_turns=2)
    assert (result.stop_reason, result.text) == ("end_turn", "1 + 2 = 3")
    [agent] = by_operation(spans.get_finished_spans(), "invoke_agent")
    names = [event.name for event in agent.events]
    assert names[-2:] == [
        "turnkeeper.guard.answer_requested",
        "turnkeeper.guard.answered_after_stop",
    ]
    assert dict(agent.events[-1].attributes or {})["turnkeeper.guard"] == "max_turns"


@pytest.mark.anyio
async def test_a_summary_of_older_turns_is_a_chat_span_and_a_span_event(
    spans: InMemorySpanExporter,
) -> None:
    def summary(request: dict[str, Any]) -> dict[str, Any]:
        assert request["tools"] == []
        return text_response("They added numbers.", usage=(80, 5))

    # A window of 200 tokens: past 100, the older turns are summarised.
    chat = ScriptedChat(
        [
            tool_response(("add", {"a": 1, "b": 1})),
            tool_response(("add", {"a": 2, "b": 2})),
            summary,
            text_response("done"),
        ],
        context_window=200,
    )
    spec = msgspec.structs.replace(
        SPEC, compaction=Compaction(keep_recent_turns=1, summary_tokens=8)
    )
    result = await run(spec, "count", chat, tools={"add": add})
    assert result.text == "done"
    finished = spans.get_finished_spans()
    assert len(by_operation(finished, "chat")) == 4
    [agent] = by_operation(finished, "invoke_agent")
    [compacted] = [attrs_of(e) for e in agent.events if e.name == "turnkeeper.compacted"]
    assert compacted["turnkeeper.compaction.budget_tokens"] == 100
    assert compacted["turnkeeper.compaction.estimated_tokens"] > 100
    assert compacted["turnkeeper.compaction.messages"] == 2  # the first call and its result
    assert attrs(agent)["gen_ai.usage.input_tokens"] == result.usage.prompt_tokens >= 80


@pytest.mark.anyio
async def test_a_failed_model_call_is_recorded_on_its_span_and_the_request(
    spans: InMemorySpanExporter,
) -> None:
    chat = ScriptedChat([ChatError("HTTP 400: bad request", transient=False, status=400)])
    result = await run(SPEC, "hi", chat)
    assert result.stop_reason == "chat_error"
    finished = spans.get_finished_spans()
    [call] = by_operation(finished, "chat")
    assert call.status.status_code == StatusCode.ERROR
    assert attrs(call)["error.type"] == "400"
    [exception] = [event for event in call.events if event.name == "exception"]
    assert str((exception.attributes or {})["exception.type"]).endswith("ChatError")
    [agent] = by_operation(finished, "invoke_agent")
    assert agent.status.status_code == StatusCode.ERROR
    assert attrs(agent)["error.type"] == "chat_error"
    halts = [event for event in agent.events if event.name == "turnkeeper.guard.halt"]
    assert [(e.attributes or {})["turnkeeper.halt.reason"] for e in halts] == ["chat_error"]


@pytest.mark.anyio
async def test_a_host_s_model_call_past_the_step_timeout_is_an_error_on_its_span(
    spans: InMemorySpanExporter,
) -> None:
    # The Host's step watch cuts the call short by cancelling the session's task: the
    # call's span still ends with the timeout's ChatError, as `run()`'s does.
    async def never_returns(request: dict[str, Any]) -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with Host(chat=never_returns, step_timeout=0.05) as host:
        session_id = await host.start(HOST_SPEC, "hello")
        info = await settle(host, session_id, timeout=30)
    assert info.status == "errored"
    calls = by_operation(spans.get_finished_spans(), "chat")
    assert calls
    for call in calls:
        assert call.status.status_code == StatusCode.ERROR
        assert call.status.description == "ChatError: the model took longer than 0.05 s"
        assert attrs(call)["error.type"] == "ChatError"
        [exception] = [event for event in call.events if event.name == "exception"]
        assert str(attrs_of(exception)["exception.type"]).endswith("ChatError")


@pytest.mark.anyio
async def test_mcp_tool_calls_are_extension_tools_and_failures_are_recorded(
    spans: InMemorySpanExporter,
) -> None:
    server = McpServer("test", command=sys.executable, args=(MCP_SERVER,), timeout=60)
    chat = ScriptedChat(
        [tool_response(("add", {"a": 1, "b": 2}), ("hang", {})), text_response("ok")]
    )
    await run(AgentSpec(mcp_servers=(server,)), "go", chat, tool_timeout=0.5)
    finished = spans.get_finished_spans()
    named = {
        attrs(span)["gen_ai.tool.name"]: span for span in by_operation(finished, "execute_tool")
    }
    assert attrs(named["add"])["gen_ai.tool.type"] == "extension"
    assert attrs(named["add"])["turnkeeper.mcp.server"] == "test"
    assert named["add"].status.status_code == StatusCode.UNSET
    assert named["hang"].status.status_code == StatusCode.ERROR
    assert attrs(named["hang"])["error.type"] == "timeout"
    [agent] = by_operation(finished, "invoke_agent")
    [mcp_error] = [event for event in agent.events if event.name == "turnkeeper.mcp.error"]
    assert dict(mcp_error.attributes or {}) | {"turnkeeper.event.seq": 0} == {
        "turnkeeper.event.seq": 0,
        "turnkeeper.mcp.server": "test",
        "error.type": "timeout",
        "gen_ai.tool.name": "hang",
        "gen_ai.tool.call.id": "call_2",
    }


@pytest.mark.anyio
async def test_a_captured_context_parents_a_request_served_by_another_task(
    spans: InMemorySpanExporter,
) -> None:
    tracer = spans_provider(spans).get_tracer("orchestrator")
    inbox, outbox = anyio.create_memory_object_stream[object](1)
    state = open_session(SPEC, session_id="local_propagated")

    async def session_task() -> None:
        # Started before the request's span exists, so it does not inherit it.
        parent = await outbox.receive()
        with tracing.agent_span(state, parent=parent):
            await anyio.lowlevel.checkpoint()

    with inbox, outbox:
        async with anyio.create_task_group() as group:
            group.start_soon(session_task)
            with tracer.start_as_current_span("POST /sessions/messages") as request_span:
                await inbox.send(tracing.capture_context())
    [agent] = by_operation(spans.get_finished_spans(), "invoke_agent")
    assert agent.parent is not None
    assert agent.parent.span_id == request_span.get_span_context().span_id
    assert attrs(agent)["gen_ai.conversation.id"] == "local_propagated"


def test_hooks_are_inert_while_tracing_is_off() -> None:
    tracing.disable()
    assert tracing.capture_context() is None
    assert not tracing.enabled()


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP trace collector that keeps what it is sent."""

    received: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_configure_from_env_exports_spans_over_otlp_to_a_collector() -> None:
    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        port = collector.server_address[1]
        out = run_script(
            "from turnkeeper import tracing\n"
            "print(tracing.configure_from_env())\n"
            + SESSION
            + "\nfrom opentelemetry import trace\ntrace.get_tracer_provider().force_flush()\n",
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                "OTEL_SERVICE_NAME": "agents-under-test",
            },
        )
    finally:
        collector.shutdown()
        collector.server_close()
    assert out.split() == ["True"]
    names: list[str] = []
    services: set[str] = set()
    for path, body in _Collector.received:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            for attribute in resource_spans.resource.attributes:
                if attribute.key == "service.name":
                    services.add(attribute.value.string_value)
            for scope_spans in resource_spans.scope_spans:
                assert scope_spans.scope.name == "turnkeeper"
                names += [span.name for span in scope_spans.spans]
    assert sorted(names) == ["chat default", "chat default", "execute_tool add", "invoke_agent"]
    assert services == {"agents-under-test"}


def test_configure_from_env_does_nothing_when_unset_or_disabled() -> None:
    out = run_script(
        """
        import os, sys
        from turnkeeper import tracing
        print(tracing.configure_from_env())
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
        os.environ["OTEL_SDK_DISABLED"] = "true"
        print(tracing.configure_from_env())
        print(any(m.startswith("opentelemetry") for m in sys.modules))
        """,
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""},
    )
    assert out.split() == ["False", "False", "False"]


@pytest.mark.anyio
async def test_a_host_s_requests_each_parent_their_own_spans_while_waiting_for_slots(
    spans: InMemorySpanExporter,
) -> None:
    # With fewer model-call slots than sessions, a session's turns run in several tasks,
    # each started by whichever session gave back the slot: none may take that session's
    # span as its parent.
    async def step(n: int) -> str:
        return step_text(n)

    async with Host(chat=stepper(0.005), tools={"step": step}, max_model_calls=2) as host:
        ids = [await host.start(HOST_SPEC, prompt_for(3, str(i))) for i in range(5)]
        for session_id in ids:
            assert (await settle(host, session_id)).text == answer_for(3)
    finished = spans.get_finished_spans()
    agents = by_operation(finished, "invoke_agent")
    assert sorted(attrs(agent)["gen_ai.conversation.id"] for agent in agents) == sorted(ids)
    owner = {
        agent.context.span_id: attrs(agent)["gen_ai.conversation.id"]
        for agent in agents
        if agent.context is not None
    }
    for agent in agents:
        assert agent.parent is None
    children: dict[str, list[str]] = {session_id: [] for session_id in ids}
    for child in (*by_operation(finished, "chat"), *by_operation(finished, "execute_tool")):
        assert child.parent is not None
        children[owner[child.parent.span_id]].append(child.name)
    # Each request: four model calls (three steps, then the answer) and three tool calls.
    for session_id in ids:
        assert sorted(children[session_id]) == ["chat default"] * 4 + ["execute_tool step"] * 3


@pytest.mark.anyio
async def test_a_host_request_sent_within_a_span_is_its_child(
    spans: InMemorySpanExporter,
) -> None:
    tracer = spans_provider(spans).get_tracer("orchestrator")
    async with Host(chat=ScriptedChat([text_response("hi"), text_response("again")])) as host:
        with tracer.start_as_current_span("POST /v1/sessions") as request_span:
            session_id = await host.start(HOST_SPEC, "hello")
        await settle(host, session_id)
        # A later request with no span around it is a root of its own.
        await host.send(session_id, "more")
        await settle(host, session_id)
    first, second = sorted(
        by_operation(spans.get_finished_spans(), "invoke_agent"), key=lambda s: s.start_time or 0
    )
    assert first.parent is not None
    assert first.parent.span_id == request_span.get_span_context().span_id
    assert second.parent is None
