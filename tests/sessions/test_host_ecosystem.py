"""The Host with MCP tool servers and OpenTelemetry traces: shared connections closed
on stop, MCP tools called through the protocol, and spans across the Host's tasks."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from turnkeeper import AgentSpec, Host, McpServer, MemoryLog, ToolSpec, replay, tracing
from turnkeeper.core import Chat
from turnkeeper.providers import ScriptedChat, text_response, tool_response

pytestmark = pytest.mark.anyio

SERVER = McpServer(
    "calc",
    command=sys.executable,
    args=(str(Path(__file__).parents[1] / "tools" / "mcp_server.py"),),
    timeout=30,
)
SPEC = AgentSpec(system_prompt="Add with the tool.", mcp_servers=(SERVER,))


@pytest.fixture
def traced() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    yield exporter, provider
    tracing.disable()
    provider.shutdown()


def adding_model() -> Chat:
    """Calls add(2, 3) after each user message, then answers with what it returned."""

    async def chat(request: dict[str, Any]) -> dict[str, Any]:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return text_response(f"2 + 3 = {last['content']}")
        return tool_response(("add", {"a": 2, "b": 3}))

    return chat


async def test_mcp_tools_run_through_the_protocol_on_one_shared_connection() -> None:
    log = MemoryLog()
    async with Host(chat=adding_model(), log=log) as host:
        first = await host.start(SPEC, "What is 2 + 3?")
        second = await host.start(SPEC, "And again?")
        infos = [await host.result(s, wait=60) for s in (first, second)]
        assert [(i.status, i.text) for i in infos] == [("idle", "2 + 3 = 5")] * 2
        assert host._mcp.connections == 1
        events = await log.read(first)
        state = replay(events)
        assert [m["content"] for m in state.history if m["role"] == "tool"] == ["5"]
        assert any(t.name == "add" and t.mcp_server == "calc" for t in state.spec.tools)
    assert host._mcp.connections == 0


async def test_a_server_that_cannot_start_is_an_event_and_a_tool_error() -> None:
    ghost = McpServer("ghost", command="/nonexistent/turnkeeper-mcp")
    spec = AgentSpec(tools=(ToolSpec("note"),), mcp_servers=(ghost,))
    chat = ScriptedChat([tool_response(("add", {"a": 1, "b": 1})), text_response("sorry")])

    async def note() -> str:
        return "noted"

    log = MemoryLog()
    async with Host(chat=chat, log=log, tools={"note": note}) as host:
        session_id = await host.start(spec, "add")
        info = await host.result(session_id, wait=30)
        assert (info.status, info.text) == ("idle", "sorry")
        events = await log.read(session_id)
        assert events[1].type == "local.mcp_error"
        answer = next(m for m in replay(events).history if m["role"] == "tool")["content"]
        assert "unknown tool 'add'" in answer
        assert "ghost" in answer


async def test_host_sessions_are_traced_as_one_request_span_with_children(
    traced: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    spans, provider = traced
    async with Host(chat=adding_model()) as host:
        session_id = await host.start(SPEC, "What is 2 + 3?")
        await host.result(session_id, wait=60)
        with provider.get_tracer("test").start_as_current_span("orchestrator") as parent:
            await host.send(session_id, "again")
        await anyio.lowlevel.checkpoint()
        await host.result(session_id, wait=60)
    finished = spans.get_finished_spans()
    names = [span.name for span in finished]
    agents = [s for s in finished if s.name.startswith("invoke_agent")]
    assert len(agents) == 2, names
    for agent in agents:
        children = [s for s in finished if s.parent and s.parent.span_id == agent.context.span_id]
        kinds = sorted(str((c.attributes or {}).get("gen_ai.operation.name")) for c in children)
        assert kinds == ["chat", "chat", "execute_tool"], names
        assert (agent.attributes or {}).get("gen_ai.conversation.id") == session_id
    second = agents[1]
    assert second.parent is not None
    assert second.parent.span_id == parent.get_span_context().span_id
