"""The OpenAI-compatible chat server over a chat backend, for `turnkeeper model serve`.

Imported only by that command: the web stack is slow to import.
"""

from __future__ import annotations

import secrets
import signal
import socket
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Final, Literal, cast

import anyio
import msgspec
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.typing import ASGIFramework
from hypercorn.utils import wrap_app
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from turnkeeper.core import (
    MAX_JSON_DEPTH,
    Chat,
    ChatError,
    InputError,
    nests_deeper,
    output_problem,
    schema_problem,
)

MAX_BODY_BYTES: Final = 8 * 1024 * 1024
"""The largest request body taken, in bytes (a history longer than the model's context
window is cut to fit it anyway)."""
_BACKLOG: Final = 128
# Longer than clients keep idle connections pooled (httpx: 5 s), so a client never sends
# on a connection the server is just closing.
_KEEP_ALIVE_SECONDS: Final = 75.0
_JSON: Final = "application/json"
_SAMPLING: Final = ("temperature", "top_p", "stop", "seed", "frequency_penalty", "presence_penalty")
# What the model failing looks like, as opposed to a request that cannot fit it.
_TOO_LONG: Final = ("prompt too long", "does not fit the model's context window")


# The request body, as much of OpenAI's chat completions request as the server uses; other
# fields a client sends (`user`, `metadata`, `parallel_tool_calls`, ...) are ignored.


class _Part(msgspec.Struct, frozen=True):
    type: str
    text: str | None = None


_Content = str | list[_Part]


class _Function(msgspec.Struct, frozen=True):
    name: str
    arguments: str


class _ToolCall(msgspec.Struct, frozen=True):
    id: str
    function: _Function
    type: Literal["function"] = "function"


class _System(msgspec.Struct, frozen=True, tag_field="role", tag="system"):
    content: _Content


class _Developer(msgspec.Struct, frozen=True, tag_field="role", tag="developer"):
    content: _Content


class _User(msgspec.Struct, frozen=True, tag_field="role", tag="user"):
    content: _Content


class _Assistant(msgspec.Struct, frozen=True, tag_field="role", tag="assistant"):
    content: _Content | None = None
    tool_calls: list[_ToolCall] | None = None


class _ToolMessage(msgspec.Struct, frozen=True, tag_field="role", tag="tool"):
    content: _Content
    tool_call_id: str


class _FunctionSpec(msgspec.Struct, frozen=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class _Tool(msgspec.Struct, frozen=True):
    function: _FunctionSpec
    type: Literal["function"] = "function"


class _Named(msgspec.Struct, frozen=True):
    name: str


class _NamedChoice(msgspec.Struct, frozen=True):
    type: Literal["function"]
    function: _Named


_Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
_Count = Annotated[int, msgspec.Meta(ge=1)]


class _ChatRequest(msgspec.Struct, frozen=True):
    messages: Annotated[
        list[_System | _Developer | _User | _Assistant | _ToolMessage], msgspec.Meta(min_length=1)
    ]
    model: str | None = None
    tools: list[_Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | _NamedChoice | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    max_tokens: _Count | None = None
    max_completion_tokens: _Count | None = None
    stop: str | Annotated[list[str], msgspec.Meta(max_length=4)] | None = None
    seed: int | None = None
    frequency_penalty: _Penalty | None = None
    presence_penalty: _Penalty | None = None
    n: _Count | None = None
    stream: bool | None = None
    response_format: dict[str, Any] | None = None


class _Refused(Exception):
    """A request the server refuses: an HTTP status, why, and the body field at fault."""

    def __init__(self, status: int, message: str, param: str | None, kind: str) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def _invalid(message: str, param: str | None) -> _Refused:
    return _Refused(400, message, param, "invalid_request_error")


def _error(status: int, message: str, param: str | None = None, kind: str = "") -> Response:
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""
    kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return Response(msgspec.json.encode(body), status_code=status, media_type=_JSON)


def _json(body: Any) -> Response:
    return Response(msgspec.json.encode(body), media_type=_JSON)


def _param_of(error: msgspec.ValidationError) -> str | None:
    """The body field a msgspec validation message is about (`messages[0].content`)."""
    message = str(error)
    marker = " - at `$"
    if marker not in message:
        return None
    return message.rsplit(marker, 1)[1].rstrip("`").lstrip(".") or None


def model_id(path: str) -> str:
    """The name the server gives the model in the GGUF file `path`: the file's stem."""
    return Path(path).name.removesuffix(".gguf")


def create_model_app(chat: Chat, served: str, *, created: int | None = None) -> Starlette:
    """The Starlette app serving `chat` (an EmbeddedChat, or another backend taking
    OpenAI-shaped requests with `tool_choice`) as the model named `served`."""
    listed = {
        "id": served,
        "object": "model",
        "created": int(time.time()) if created is None else created,
        "owned_by": "turnkeeper",
    }

    async def models(request: Request) -> Response:
        return _json({"object": "list", "data": [listed]})

    async def model(request: Request) -> Response:
        if request.path_params["name"] != served:
            name = request.path_params["name"]
            return _error(404, f"the model {name!r} is not served here; this serves {served!r}")
        return _json(listed)

    async def completions(request: Request) -> Response:
        try:
            body = await _read_body(request)
            asked = _checked(body)
            response = await chat(_backend_request(body, asked))
        except _Refused as refused:
            return _error(refused.status, refused.message, refused.param, refused.kind)
        except ChatError as error:
            if any(mark in error.message for mark in _TOO_LONG):
                return _error(400, error.message, "messages")
            if error.transient:
                return _error(503, error.message)
            if error.message.startswith("request tools"):
                return _error(400, error.message, "tools")
            if error.message.startswith("tool_choice"):
                return _error(400, error.message, "tool_choice")
            return _error(500, error.message)
        return _json(_completion(response, served))

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if status == 405:
            return _error(405, f"{request.method} is not allowed on {request.url.path}")
        return _error(404, f"no such endpoint: {request.method} {request.url.path}")

    return Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{name:path}", model, methods=["GET"]),
            Route("/v1/chat/completions", completions, methods=["POST"]),
        ],
        exception_handlers={404: not_found, 405: not_found},
    )


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _Refused(
            413, f"body: larger than {MAX_BODY_BYTES} bytes", None, "invalid_request_error"
        )
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _Refused(
                    413, f"body: larger than {MAX_BODY_BYTES} bytes", None, "invalid_request_error"
                )
            chunks.append(chunk)
    except ClientDisconnect:
        raise _invalid("body: the client went away while sending it", None) from None
    return b"".join(chunks)


def _checked(body: bytes) -> _ChatRequest:
    """The body as a chat completions request, or why not (naming the field)."""
    try:
        asked = msgspec.json.decode(body, type=_ChatRequest)
    except msgspec.ValidationError as error:
        raise _invalid(str(error), _param_of(error)) from None
    except msgspec.DecodeError as error:
        raise _invalid(f"body: not valid JSON ({error})", None) from None
    except RecursionError:
        raise _invalid("body: nested too deeply", None) from None
    if nests_deeper(msgspec.json.decode(body), MAX_JSON_DEPTH):
        raise _invalid(f"body: nested more than {MAX_JSON_DEPTH} levels deep", None)
    if asked.stream:
        raise _invalid("stream: streaming is not supported here; send stream: false", "stream")
    if asked.n not in (None, 1):
        raise _invalid(f"n: only one choice is generated, got n={asked.n}", "n")
    _check_response_format(asked.response_format)
    for index, tool in enumerate(asked.tools or []):
        parameters = tool.function.parameters
        problem = None if parameters is None else schema_problem(parameters, of="the schema")
        if problem is not None:
            where = f"tools[{index}].function.parameters"
            raise _invalid(f"{where}: the schema cannot be used: {problem}", where)
    names = [tool.function.name for tool in asked.tools or []]
    if asked.tool_choice == "required" and not names:
        raise _invalid(
            'tool_choice: "required" needs tools, and the request has none', "tool_choice"
        )
    if isinstance(asked.tool_choice, _NamedChoice) and asked.tool_choice.function.name not in names:
        name = asked.tool_choice.function.name
        raise _invalid(f"tool_choice: the function {name!r} is not among the tools", "tool_choice")
    called = {
        call.id
        for message in asked.messages
        if isinstance(message, _Assistant)
        for call in message.tool_calls or []
    }
    for index, message in enumerate(asked.messages):
        if isinstance(message, _ToolMessage) and message.tool_call_id not in called:
            raise _invalid(
                f"messages[{index}].tool_call_id: {message.tool_call_id!r} answers no tool call "
                "of an assistant message",
                f"messages[{index}].tool_call_id",
            )
    return asked


def _check_response_format(response_format: dict[str, Any] | None) -> None:
    """Refuse (naming the field) a `response_format` other than text or JSON of a usable
    schema, which the backend makes its answer's grammar (see `InlineTools`)."""
    if response_format is None or response_format.get("type") == "text":
        return
    described = response_format.get("json_schema")
    schema = described.get("schema") if isinstance(described, dict) else None
    if response_format.get("type") != "json_schema" or not isinstance(schema, dict):
        raise _invalid(
            'response_format: only {"type": "text"} and {"type": "json_schema", "json_schema": '
            '{"schema": {...}}} are supported; ask for other structure with tools',
            "response_format",
        )
    where = "response_format.json_schema.schema"
    problem = output_problem(schema, where)
    if problem is not None:
        raise _invalid(problem, where)


def _backend_request(body: bytes, asked: _ChatRequest) -> dict[str, Any]:
    """The request for the backend: the messages and tools as the client sent them."""
    plain: dict[str, Any] = msgspec.json.decode(body)
    request: dict[str, Any] = {"model": asked.model or "default", "messages": plain["messages"]}
    if asked.tools:
        request["tools"] = plain["tools"]
    if asked.tool_choice is not None:
        request["tool_choice"] = plain["tool_choice"]
    for key in _SAMPLING:
        if plain.get(key) is not None:
            request[key] = plain[key]
    if asked.response_format is not None and asked.response_format.get("type") == "json_schema":
        request["response_format"] = plain["response_format"]
    limit = asked.max_completion_tokens or asked.max_tokens
    if limit is not None:
        request["max_tokens"] = limit
    return request


def _completion(response: dict[str, Any], served: str) -> dict[str, Any]:
    """The backend's response as OpenAI's chat completion object."""
    choice = response["choices"][0]
    message = choice["message"]
    reply: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        reply["tool_calls"] = message["tool_calls"]
    usage = response.get("usage") or {}
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    answer = {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": served,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "logprobs": None,
                "finish_reason": choice.get("finish_reason") or "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    if "turnkeeper" in response:
        answer["turnkeeper"] = response["turnkeeper"]
    return answer


def _listen(host: str, port: int) -> tuple[Config, Sockets]:
    """A hypercorn config and its bound, listening socket; InputError if it cannot bind."""
    config = Config()
    config.keep_alive_timeout = _KEEP_ALIVE_SECONDS
    config.accesslog = None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return config, Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])


async def serve_model(
    chat: Chat,
    served: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    ready: Callable[[str], object] | None = None,
) -> None:
    """Serve `chat` as the model `served` on `host`:`port` until SIGINT or SIGTERM (a
    second signal cancels requests in flight); `ready` gets the `/v1` root URL once
    requests are taken. Runs under trio."""
    config, sockets = _listen(host, port)
    bound, bound_port = sockets.insecure_sockets[0].getsockname()[:2]
    shown = f"[{bound}]" if ":" in bound else bound
    stopping = anyio.Event()
    # Starlette's app type and hypercorn's ASGI type differ only in annotations.
    framework = cast(ASGIFramework, create_model_app(chat, served))
    app = wrap_app(framework, config.wsgi_max_body_size, "asgi")
    try:
        async with anyio.create_task_group() as outer:
            outer.start_soon(_watch_signals, stopping, outer.cancel_scope)
            async with anyio.create_task_group() as server:
                await server.start(
                    partial(
                        worker_serve, app, config, sockets=sockets, shutdown_trigger=stopping.wait
                    )
                )
                if ready is not None:
                    ready(f"http://{shown}:{bound_port}/v1")
            # The server has stopped: so does the signal watcher, waiting for a second one.
            outer.cancel_scope.cancel()
    finally:
        for sock in sockets.insecure_sockets:
            sock.close()


async def _watch_signals(stopping: anyio.Event, scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if stopping.is_set():
                scope.cancel()
                return
            stopping.set()
