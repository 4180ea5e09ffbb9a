"""OpenAIChat against a real OpenAI-compatible server: llama-cpp-python's, on the embedded model."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from turnkeeper.core import AgentSpec, GuardConfig, SmallModel, ToolSpec
from turnkeeper.events import ToolCalled, ToolReturned
from turnkeeper.providers import InlineTools, OpenAIChat
from turnkeeper.providers._embedded import default_model_path
from turnkeeper.sessions import check_response, run

MODEL = "smollm2"
START_WITHIN = 180.0  # seconds: the machine is shared, and the server loads the model first
ADD = ToolSpec(
    "add",
    "Add two integers and return the sum.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until_serving(server: subprocess.Popen[bytes], base_url: str, log: Path) -> None:
    deadline = time.monotonic() + START_WITHIN
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"llama_cpp.server exited with {server.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{base_url}/models", timeout=5.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail(f"llama_cpp.server did not answer within {START_WITHIN:g} s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The /v1 root of llama-cpp-python's server running the default embedded model."""
    port = free_port()
    log = tmp_path_factory.mktemp("llama_server") / "server.log"
    command = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        default_model_path(),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "2048",
    ]
    with log.open("wb") as output:
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}/v1"
            wait_until_serving(server, url, log)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@pytest.mark.anyio
async def test_a_request_gets_an_openai_shaped_response(base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        chat = OpenAIChat(base_url, MODEL, client=client)
        response = await chat(
            {
                "model": "default",
                "messages": [{"role": "user", "content": "Say hello."}],
                "tools": [],
                "temperature": 0.0,
                "max_tokens": 16,
            }
        )

    message, finish_reason, usage = check_response(response, call_prefix="c")
    assert response["object"] == "chat.completion"
    assert response["model"] == MODEL
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str)
    assert message["content"].strip()
    assert finish_reason in ("stop", "length")
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 16


@pytest.mark.anyio
async def test_a_run_with_inline_tools_calls_the_tool_and_ends_cleanly(base_url: str) -> None:
    calls: list[tuple[int, int]] = []

    async def add(a: int, b: int) -> str:
        calls.append((a, b))
        return str(a + b)

    spec = AgentSpec(
        system_prompt="You are a helpful assistant. Use the tools to answer.",
        tools=(ADD,),
        temperature=0.0,
        max_tokens=48,
    )
    async with httpx.AsyncClient() as client:
        chat = InlineTools(OpenAIChat(base_url, MODEL, client=client), grammar=True)
        result = await run(
            spec,
            "What is 17 plus 25?",
            chat,
            tools={"add": add},
            max_turns=6,
            guards=GuardConfig(small_model=SmallModel()),
        )

    events = [envelope.event for envelope in result.events]
    called = [event for event in events if isinstance(event, ToolCalled)]
    returned = [event for event in events if isinstance(event, ToolReturned)]
    assert calls
    assert [(event.name, event.input) for event in called] == [
        ("add", {"a": a, "b": b}) for a, b in calls
    ]
    assert [event.text for event in returned] == [str(a + b) for a, b in calls]
    for event in returned:
        answer = {"role": "tool", "tool_call_id": event.tool_call_id, "content": event.text}
        assert answer in result.transcript
    assert result.turns >= 2
    assert result.stop_reason != "max_turns_exceeded"
    assert result.stop_reason in ("end_turn", "terminal_tool", "going_in_circles")
    assert result.text is not None
    assert str(sum(calls[-1])) in result.text
