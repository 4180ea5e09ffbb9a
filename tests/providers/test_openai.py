"""OpenAIChat against a real OpenAI-compatible HTTP server on 127.0.0.1."""

from __future__ import annotations

import logging
import math
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

from tests.providers.openai_server import (
    Behaviour,
    ChatServer,
    Gate,
    HangUp,
    Reply,
    Stall,
    completion,
    serve_chat,
)
from turnkeeper.core import ChatError, InputError
from turnkeeper.providers import with_retry
from turnkeeper.providers._openai import OpenAIChat, aclose_shared_client
from turnkeeper.providers._report import collecting_events

pytestmark = pytest.mark.anyio

KEY = "sk-test-SECRET-0123456789"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def request(**extra: Any) -> dict[str, Any]:
    return {"model": "spec-model", "messages": MESSAGES, "tools": [], **extra}


def nested(levels: int) -> list[Any]:
    """A list `levels` lists deep: `[[1]]` for 2."""
    value: list[Any] = [1]
    for _ in range(levels - 1):
        value = [value]
    return value


@asynccontextmanager
async def serving(*script: Behaviour) -> AsyncIterator[ChatServer]:
    """A server, and the shared pooled client closed before the event loop ends."""
    async with serve_chat(*script) as server:
        try:
            yield server
        finally:
            await aclose_shared_client()


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNKEEPER_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


async def failure(chat: OpenAIChat) -> ChatError:
    with pytest.raises(ChatError) as caught:
        await chat(request())
    return caught.value


# The request on the wire and the response returned.


async def test_sends_the_request_and_returns_the_response_verbatim() -> None:
    body = completion(
        "Sunny.",
        system_fingerprint="fp_1",
        x_vendor={"queue_ms": 3, "nested": [1, None, "x"]},
    )
    body["choices"][0]["logprobs"] = None
    body["choices"][0]["message"]["reasoning_content"] = "thinking..."
    async with serving(Reply(200, body)) as server:
        chat = OpenAIChat(server.base_url + "/", "served-model", api_key=KEY)
        response = await chat(request(temperature=0.2, max_tokens=64))
    assert response == body
    [received] = server.received
    assert received.method == "POST"
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == f"Bearer {KEY}"
    assert received.headers["content-type"] == "application/json"
    assert received.body == {
        "model": "served-model",
        "messages": MESSAGES,
        "temperature": 0.2,
        "max_tokens": 64,
    }


async def test_sends_tools_and_the_request_model_and_returns_tool_calls() -> None:
    tool_call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    body = completion(None)
    body["choices"][0]["message"]["tool_calls"] = [tool_call]
    body["choices"][0]["finish_reason"] = "tool_calls"
    async with serving(Reply(200, body)) as server:
        chat = OpenAIChat(server.base_url, headers={"X-Trace": "abc"})
        response = await chat(request(tools=TOOLS))
    assert response["choices"][0]["message"]["tool_calls"] == [tool_call]
    [received] = server.received
    assert received.body == {"model": "spec-model", "messages": MESSAGES, "tools": TOOLS}
    assert received.headers["x-trace"] == "abc"
    assert "authorization" not in received.headers


@pytest.mark.parametrize(
    ("environment", "argument", "sent"),
    [
        ({"TURNKEEPER_API_KEY": "sk-tk", "OPENAI_API_KEY": "sk-oa"}, None, "Bearer sk-tk"),
        ({"OPENAI_API_KEY": "sk-oa"}, None, "Bearer sk-oa"),
        ({"TURNKEEPER_API_KEY": "", "OPENAI_API_KEY": "sk-oa"}, None, "Bearer sk-oa"),
        ({"TURNKEEPER_API_KEY": "sk-tk"}, "sk-arg", "Bearer sk-arg"),
        ({}, None, None),
    ],
)
async def test_api_key_comes_from_the_argument_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
    environment: dict[str, str],
    argument: str | None,
    sent: str | None,
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    async with serving() as server:
        await OpenAIChat(server.base_url, api_key=argument)(request())
    assert server.received[0].headers.get("authorization") == sent


# Failures: transient or permanent ChatError.


@pytest.mark.parametrize(
    ("reply", "transient"),
    [
        (Reply(408, {"error": {"message": "request timeout"}}), True),
        (Reply(429, {"error": {"message": "slow down"}}), True),
        (Reply(500, {"error": {"message": "boom"}}), True),
        (Reply(502, "<html>bad gateway</html>"), True),
        (Reply(503, {"error": "loading model"}), True),
        (Reply(400, {"error": {"message": "messages: field required"}}), False),
        (Reply(401, {"error": {"message": "invalid api key", "type": "auth"}}), False),
        (Reply(404, {"detail": "no such model"}), False),
        (Reply(422, "unprocessable"), False),
    ],
    ids=lambda value: str(value.status) if isinstance(value, Reply) else str(value),
)
async def test_http_errors_map_to_transient_or_permanent(reply: Reply, transient: bool) -> None:
    async with serving(reply) as server:
        error = await failure(OpenAIChat(server.base_url))
    assert error.transient is transient
    assert error.status == reply.status
    assert f"HTTP {reply.status}" in error.message
    detail = {
        408: "request timeout",
        429: "slow down",
        500: "boom",
        502: "<html>bad gateway</html>",
        503: "loading model",
        400: "messages: field required",
        401: "invalid api key",
        404: "no such model",
        422: "unprocessable",
    }[reply.status]
    assert detail in error.message
    assert server.base_url + "/chat/completions" in error.message


@pytest.mark.parametrize(("header", "seconds"), [("7", 7.0), ("0.5", 0.5), ("soon", None)])
async def test_429_carries_retry_after(header: str, seconds: float | None) -> None:
    reply = Reply(429, {"error": {"message": "rate limited"}}, headers=(("Retry-After", header),))
    async with serving(reply) as server:
        error = await failure(OpenAIChat(server.base_url))
    assert error.transient
    assert error.retry_after == seconds


async def test_429_retry_after_as_an_http_date() -> None:
    reply = Reply(429, "", headers=(("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT"),))
    async with serving(reply) as server:
        error = await failure(OpenAIChat(server.base_url))
    assert error.retry_after == 0.0  # a date in the past: retry now


async def test_a_long_error_message_is_truncated() -> None:
    async with serving(Reply(400, {"error": {"message": "x" * 5000}})) as server:
        error = await failure(OpenAIChat(server.base_url))
    assert not error.transient
    assert "x" * 300 + "..." in error.message
    assert "x" * 301 not in error.message


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ("<html>not json</html>", "not JSON"),
        ('{"choices": [', "not JSON"),
        (b"\xff\xfe", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({"id": "x", "object": "chat.completion"}, "no choices"),
        ({"choices": []}, "no choices"),
        ({"error": {"message": "model is overloaded"}}, "the server said: model is overloaded"),
        ({"choices": [{"index": 0, "finish_reason": "stop"}]}, "no message"),
        ({"choices": [{"message": "hi"}]}, "no message"),
        ("[" * 100_000, "nested more than 128 levels deep"),
        ('{"choices": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested more than 128 levels deep"),
        # Deep enough to refuse, not so deep that decoding it fails.
        (completion(extra=nested(128)), "nested more than 128 levels deep"),
    ],
)
async def test_a_malformed_response_is_a_permanent_error(
    body: dict[str, Any] | str | bytes, what: str
) -> None:
    async with serving(Reply(200, body)) as server:
        error = await failure(OpenAIChat(server.base_url))
    assert not error.transient
    assert error.message.startswith("malformed response: ")
    assert what in error.message


async def test_a_response_nested_to_the_limit_is_returned_verbatim() -> None:
    body = completion(extra=nested(127))
    async with serving(Reply(200, body)) as server:
        assert await OpenAIChat(server.base_url)(request()) == body


@pytest.mark.parametrize(("status", "transient"), [(500, True), (400, False)])
async def test_an_error_body_nested_too_deep_is_quoted_as_text(
    status: int, transient: bool
) -> None:
    body = '{"error": ' + "[" * 100_000
    async with serving(Reply(status, body)) as server:
        error = await failure(OpenAIChat(server.base_url))
    assert (error.status, error.transient) == (status, transient)
    assert f"HTTP {status}" in error.message
    assert body[:300] + "..." in error.message


async def test_a_slow_response_times_out_as_a_transient_error() -> None:
    async with serving(Stall()) as server:
        error = await failure(OpenAIChat(server.base_url, timeout=0.2))
    assert error.transient
    assert "timed out after 0.2 s (ReadTimeout)" in error.message


@pytest.mark.parametrize(
    "hang_up",
    [HangUp(), HangUp(partial=b'{"choices": [{"message": ')],
    ids=["before-the-response", "mid-body"],
)
async def test_a_dropped_connection_is_a_transient_error(hang_up: HangUp) -> None:
    async with serving(hang_up) as server:
        error = await failure(OpenAIChat(server.base_url))
    assert error.transient
    assert error.message.startswith("connection failed: ")


async def test_a_refused_connection_is_a_transient_error() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()
    try:
        error = await failure(OpenAIChat(f"http://127.0.0.1:{port}/v1"))
    finally:
        await aclose_shared_client()
    assert error.transient
    assert error.message.startswith("connection failed: ")


async def test_the_next_request_after_a_failure_succeeds() -> None:
    async with serving(Reply(500, "down"), HangUp(), Reply()) as server:
        chat = OpenAIChat(server.base_url)
        assert (await failure(chat)).transient
        assert (await failure(chat)).transient
        assert await chat(request()) == completion()


# The API key never shows.


async def test_the_api_key_never_appears_in_errors_reprs_logs_or_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    echoes: list[Behaviour] = [
        Reply(401, {"error": {"message": f"Incorrect API key provided: {KEY}"}}),
        Reply(500, f"upstream rejected Bearer {KEY}"),
        Reply(200, f"<html>{KEY}</html>"),
        Reply(200, {"error": {"message": f"bad key {KEY}"}}),
        Stall(),
    ]
    async with serving(*echoes) as server:
        chat = OpenAIChat(server.base_url, api_key=KEY, timeout=0.2)
        errors = [await failure(chat) for _ in echoes]
        server.push(Reply(503, f"{KEY} overloaded"), Reply(200, completion()))
        with collecting_events() as events:
            await with_retry(chat, sleep=no_sleep)(request())
    assert server.received[0].headers["authorization"] == f"Bearer {KEY}"
    assert "[redacted]" in errors[0].message
    shown = [repr(chat), str(chat), caplog.text, *map(repr, events)]
    for error in errors:
        shown += [str(error), repr(error), "".join(traceback.format_exception(error))]
    assert len(events) == 1
    for text in shown:
        assert KEY not in text


async def no_sleep(seconds: float) -> None:
    assert seconds >= 0


@pytest.mark.parametrize("bad", ["sk with space", "sk-\n-x", "sk-ünicode", ""])
def test_a_key_that_cannot_be_sent_is_refused_without_quoting_it(bad: str) -> None:
    with pytest.raises(InputError, match="non-empty printable ASCII") as caught:
        OpenAIChat("http://127.0.0.1:1/v1", api_key=bad)
    assert "sk" not in str(caught.value)


def test_a_bad_key_from_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk bad")
    with pytest.raises(InputError, match="API key from the environment"):
        OpenAIChat("http://127.0.0.1:1/v1")


# One pooled client for the process.


async def test_instances_share_one_connection_pool() -> None:
    async with serving() as server:
        for index in range(6):
            await OpenAIChat(server.base_url, f"model-{index}")(request())
    assert len(server.received) == 6
    assert server.connections == 1


async def test_concurrent_calls_share_the_pool_and_reuse_its_connections() -> None:
    concurrent = 24
    async with serving() as server:
        chats = [OpenAIChat(server.base_url, f"model-{index % 4}") for index in range(concurrent)]
        responses: list[dict[str, Any]] = []

        async def call(chat: OpenAIChat) -> None:
            responses.append(await chat(request()))

        for _ in range(2):
            # The gate holds every reply until all calls of the wave are in flight at once.
            gate = Gate(concurrent)
            server.push(*[gate] * concurrent)
            async with anyio.create_task_group() as tasks:
                for chat in chats:
                    tasks.start_soon(call, chat)
    assert len(responses) == 2 * concurrent
    # Each wave needs one connection per call in flight; the second reuses the first's.
    assert server.connections == concurrent


async def test_a_given_client_is_used_instead_of_the_shared_one() -> None:
    async with serving() as server, httpx.AsyncClient() as own:
        await OpenAIChat(server.base_url)(request())
        await OpenAIChat(server.base_url, client=own)(request())
        await OpenAIChat(server.base_url, client=own)(request())
        assert server.connections == 2
        await aclose_shared_client()
        assert not own.is_closed
        await OpenAIChat(server.base_url)(request())
        assert server.connections == 3


# Bad arguments.


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"base_url": "ftp://127.0.0.1/v1"}, "http:// or https://"),
        ({"base_url": "127.0.0.1:8080/v1"}, "http:// or https://"),
        ({"base_url": "http://"}, "http:// or https://"),
        ({"base_url": 8080}, "base_url must be a string"),
        # Lone surrogates: how Python decodes the non-UTF-8 bytes of a command line.
        ({"base_url": "http://127.0.0.1:1/\udcff"}, "base_url is not a URL: it is not UTF-8"),
        ({"base_url": "http://127.0.0.1:1/v1?q=\udcff"}, "base_url is not a URL: it is not UTF"),
        ({"base_url": "http://u\udcff:p@127.0.0.1/v1"}, "base_url is not a URL: it is not UTF"),
        ({"base_url": "http://h\udcff.example/v1"}, "base_url is not a URL"),
        ({"model": ""}, "model must be a non-empty string"),
        ({"timeout": 0}, "timeout must be finite and > 0"),
        ({"timeout": -1.0}, "timeout must be finite and > 0"),
        ({"timeout": math.nan}, "timeout must be finite and > 0"),
        ({"timeout": True}, "timeout must be a number"),
        ({"client": "pool"}, "client must be an httpx.AsyncClient"),
        ({"headers": {"X-Bad": "a\nb"}}, "header 'X-Bad'"),
        ({"headers": {"X-Num": 3}}, "headers must map strings to strings"),
    ],
)
def test_bad_arguments_are_input_errors(arguments: dict[str, Any], message: str) -> None:
    settings: dict[str, Any] = {"base_url": "http://127.0.0.1:8080/v1", **arguments}
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        OpenAIChat(**settings)


async def test_a_request_that_is_not_json_is_an_input_error() -> None:
    chat = OpenAIChat("http://127.0.0.1:1/v1")
    with pytest.raises(InputError, match="cannot be sent as JSON"):
        await chat(request(stop={object()}))
    with pytest.raises(InputError, match="must be a dict"):
        await chat([("model", "x")])  # type: ignore[arg-type]


def test_a_base_url_with_non_ascii_text_is_quoted() -> None:
    shown = repr(OpenAIChat("http://127.0.0.1:8080/é/v1"))
    assert shown == "OpenAIChat('http://127.0.0.1:8080/%C3%A9/v1/chat/completions', model=None)"


def test_repr_names_the_endpoint_and_model_only() -> None:
    chat = OpenAIChat("http://user:pw@127.0.0.1:8080/v1/", "m", api_key=KEY)
    assert repr(chat) == "OpenAIChat('http://127.0.0.1:8080/v1/chat/completions', model='m')"
