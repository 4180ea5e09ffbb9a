"""`turnkeeper model serve`, run as a subprocess on the real default model, with the `openai`
package as the client: models, tool calls, tool results and `content: null`, tool_choice,
usage, bad requests, and a turnkeeper session driving it through OpenAIChat."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest

from tests.cli.test_main import COMMAND, clean_env
from turnkeeper.cli._model_app import MAX_BODY_BYTES, model_id
from turnkeeper.core import AgentSpec, ToolSpec
from turnkeeper.events import ToolCalled
from turnkeeper.providers import OpenAIChat
from turnkeeper.providers._embedded import default_model_path
from turnkeeper.sessions import run

START_WITHIN = 180.0  # seconds: the machine is shared, and the model loads first
SERVED = model_id(default_model_path())
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
ADD = ToolSpec("add", "Add two integers and return the sum.", ADD_SCHEMA)
CAPITAL = ToolSpec(
    "capital_of",
    "The capital city of a country.",
    {"type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]},
)
TOOLS: list[Any] = [ADD.to_openai(), CAPITAL.to_openai()]
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Use the tools to answer."}
QUESTION = {"role": "user", "content": "What is 17 plus 25?"}


class Server:
    def __init__(self, process: subprocess.Popen[str], url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`turnkeeper model serve --port 0` on the default model, and its /v1 URL."""
    log = tmp_path_factory.mktemp("model_serve") / "stderr.log"
    with log.open("w") as errors:
        process = subprocess.Popen(
            [*COMMAND, "model", "serve", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=clean_env(),
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                pytest.fail(f"model serve exited {process.wait()}:\n{log.read_text()}")
            url = line.split(" on ", 1)[1].split(" ", 1)[0]
            yield Server(process, url, log)
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url, api_key="unused", timeout=START_WITHIN) as made:
        yield made


def ask(client: openai.OpenAI, *messages: Any, **fields: Any) -> Any:
    return client.chat.completions.create(
        model="any-name", messages=list(messages), temperature=0.0, **fields
    )


def called(response: Any) -> dict[str, Any]:
    """The assistant message of a response with one tool call, as a request sends it back."""
    [call] = response.choices[0].message.tool_calls
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
        ],
    }


def test_it_says_it_loads_the_model_then_where_it_serves(server: Server) -> None:
    said = server.log.read_text()
    assert f"loading the model {SERVED}" in said
    assert "model loaded in" in said
    assert server.url.startswith("http://127.0.0.1:")
    assert server.url.endswith("/v1")


def test_the_served_model_is_listed(client: openai.OpenAI) -> None:
    [listed] = client.models.list().data
    assert listed.id == SERVED == "SmolLM2-135M-Instruct.Q4_1"
    assert listed.owned_by == "turnkeeper"
    assert client.models.retrieve(SERVED).id == SERVED
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.models.retrieve("gpt-4o")


def test_a_question_with_tools_gets_a_well_formed_call_and_usage(client: openai.OpenAI) -> None:
    response = ask(client, SYSTEM, QUESTION, tools=TOOLS)
    assert response.object == "chat.completion"
    assert response.id.startswith("chatcmpl-")
    assert response.model == SERVED
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "add"
    assert json.loads(call.function.arguments) == {"a": 17, "b": 25}
    usage = response.usage
    assert usage.prompt_tokens > 50  # the tools are in the prompt
    assert 0 < usage.completion_tokens <= 256
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_tool_result_after_a_null_content_call_is_taken(client: openai.OpenAI) -> None:
    first = ask(client, SYSTEM, QUESTION, tools=TOOLS)
    history = [SYSTEM, QUESTION, called(first)]
    result = {"role": "tool", "tool_call_id": history[-1]["tool_calls"][0]["id"], "content": "42"}
    response = ask(client, *history, result, tools=TOOLS)
    message = response.choices[0].message
    if message.tool_calls:
        assert response.choices[0].finish_reason == "tool_calls"
        assert {call.function.name for call in message.tool_calls} <= {"add", "capital_of"}
    else:
        assert isinstance(message.content, str)
    answered = ask(client, *history, result, tools=TOOLS, tool_choice="none")
    assert answered.choices[0].message.tool_calls is None
    assert answered.choices[0].finish_reason == "stop"
    assert "42" in answered.choices[0].message.content


def test_tool_choice_required_and_named_get_a_call(client: openai.OpenAI) -> None:
    hello = {"role": "user", "content": "Hello there!"}
    required = ask(client, SYSTEM, hello, tools=TOOLS, tool_choice="required")
    assert required.choices[0].finish_reason == "tool_calls"
    assert len(required.choices[0].message.tool_calls) == 1
    named = {"type": "function", "function": {"name": "capital_of"}}
    response = ask(client, SYSTEM, hello, tools=TOOLS, tool_choice=named)
    [call] = response.choices[0].message.tool_calls
    assert call.function.name == "capital_of"
    assert set(json.loads(call.function.arguments)) == {"country"}


def test_without_tools_the_reply_is_text(client: openai.OpenAI) -> None:
    response = ask(client, {"role": "user", "content": "Say hello."}, max_tokens=12)
    assert isinstance(response.choices[0].message.content, str)
    assert response.choices[0].message.tool_calls is None
    assert response.choices[0].finish_reason in ("stop", "length")
    assert 0 < response.usage.completion_tokens <= 12


CITY_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["name", "population"],
}


def test_a_request_for_json_of_a_schema_gets_it(client: openai.OpenAI) -> None:
    """The schema is the answer's grammar: the reply is its JSON, as content, never a call,
    with tools offered or not."""
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": CITY_SCHEMA},
    }
    about = {"role": "user", "content": "Tell me about Paris."}
    for tools in (None, TOOLS):
        fields = {"tools": tools} if tools else {}
        response = ask(client, about, response_format=response_format, **fields)
        message = response.choices[0].message
        if message.tool_calls:
            assert {call.function.name for call in message.tool_calls} <= {"add", "capital_of"}
            continue
        answer = json.loads(message.content)
        assert set(answer) == {"name", "population"}
        assert isinstance(answer["population"], int)
        assert response.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"messages": [{"role": "user", "content": 1}]}, "messages[0].content", "Expected"),
        ({"messages": []}, "messages", "length >= 1"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "robot"),
        ({"stream": True}, "stream", "streaming is not supported"),
        ({"n": 2}, "n", "only one choice"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "'nope' is not among the tools",
        ),
        ({"temperature": 5}, "temperature", "<= 2.0"),
        ({"response_format": {"type": "json_object"}}, "response_format", "only"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
            "response_format.json_schema.schema",
            "response_format.json_schema.schema: the schema cannot be used",
        ),
        (
            {"messages": [QUESTION, {"role": "tool", "tool_call_id": "c9", "content": "1"}]},
            "messages[1].tool_call_id",
            "answers no tool call",
        ),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name", ""),
        (
            {
                "tools": [
                    *TOOLS,
                    {"type": "function", "function": {"name": "f", "parameters": {"type": "x"}}},
                ]
            },
            f"tools[{len(TOOLS)}].function.parameters",
            f"tools[{len(TOOLS)}].function.parameters: the schema cannot be used: $: the schema "
            "is invalid",
        ),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field(
    server: Server, fields: dict[str, Any], param: str, says: str
) -> None:
    body = {"model": "m", "messages": [QUESTION], **fields}
    response = httpx.post(f"{server.url}/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert says in error["message"]


def test_bodies_that_are_not_requests_are_refused(server: Server) -> None:
    url = f"{server.url}/chat/completions"
    not_json = httpx.post(url, content=b"{nope", timeout=60)
    assert not_json.status_code == 400
    assert "not valid JSON" in not_json.json()["error"]["message"]
    huge = httpx.post(url, content=b" " * (MAX_BODY_BYTES + 1), timeout=60)
    assert huge.status_code == 413
    assert huge.json()["error"]["message"] == f"body: larger than {MAX_BODY_BYTES} bytes"
    deep = httpx.post(url, content=b"[" * 10_000 + b"]" * 10_000, timeout=60)
    assert deep.status_code == 400
    missing = httpx.get(f"{server.url}/embeddings", timeout=60)
    assert missing.status_code == 404
    assert "no such endpoint" in missing.json()["error"]["message"]
    wrong = httpx.get(url, timeout=60)
    assert wrong.status_code == 405
    # The server still answers after all that.
    assert httpx.get(f"{server.url}/models", timeout=60).status_code == 200


@pytest.mark.anyio
async def test_a_turnkeeper_session_drives_the_served_model(server: Server) -> None:
    sums: list[int] = []

    async def add(a: int, b: int) -> str:
        sums.append(a + b)
        return str(a + b)

    async with httpx.AsyncClient(timeout=START_WITHIN) as http:
        chat = OpenAIChat(server.url, "smollm2", client=http)
        result = await run(
            AgentSpec(system_prompt=SYSTEM["content"], tools=(ADD,), temperature=0.0),
            QUESTION["content"],
            chat,
            tools={"add": add},
            max_turns=3,
        )
    calls = [e.event for e in result.events if isinstance(e.event, ToolCalled)]
    assert calls
    assert (calls[0].name, calls[0].input) == ("add", {"a": 17, "b": 25})
    assert sums[0] == 42


@pytest.mark.anyio
async def test_a_typed_session_drives_the_served_model(server: Server) -> None:
    """A session with an output schema asks the served model for JSON of it, and gets
    its typed output."""

    class City(msgspec.Struct):
        name: str
        population: int

    async with httpx.AsyncClient(timeout=START_WITHIN) as http:
        chat = OpenAIChat(server.url, "smollm2", client=http)
        spec = AgentSpec(system_prompt="You give facts about cities.", output_schema=City)
        result = await run(spec, "Tell me about Paris.", chat, max_turns=3)
    assert (result.terminal, result.stop_reason) == ("end_turn", "end_turn")
    assert isinstance(result.output, City)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_server_cleanly(signum: int) -> None:
    process = subprocess.Popen(
        [*COMMAND, "model", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=clean_env(),
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split(" on ", 1)[1].split(" ", 1)[0]
        assert httpx.get(f"{url}/models", timeout=60).status_code == 200
        process.send_signal(signum)
        assert process.wait(timeout=START_WITHIN) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_a_missing_gguf_file_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [*COMMAND, "model", "serve", "--model", str(tmp_path / "none.gguf"), "--port", "0"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=START_WITHIN,
    )
    assert done.returncode == 2
    assert "no GGUF file at" in done.stderr
    assert done.stdout == ""


def test_a_bad_port_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [*COMMAND, "model", "serve", "--port", "http"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=START_WITHIN,
    )
    assert done.returncode == 2
    assert "--port: expected a port number" in done.stderr
