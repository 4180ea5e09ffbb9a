"""A scripted OpenAI-compatible HTTP/1.1 server on 127.0.0.1, for testing chat backends.

It runs in the test's own event loop (asyncio or trio, through anyio) and speaks HTTP with
h11. Each request to it takes the next behaviour from its script (a reply, a stall, a
hang-up, a gated reply, a stream); with the script empty it answers with `completion()`.
A request with `"stream": true` is answered as a stream of Server-Sent Events, the
chunks of its reply (`chunks_of`), as an OpenAI server streams.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.abc
import h11


def completion(content: str | None = "Hello!", **extra: Any) -> dict[str, Any]:
    """An OpenAI chat-completions response body with one assistant message."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        **extra,
    }


@dataclass(frozen=True)
class Received:
    """A request as the server read it off the wire."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


_answering: ContextVar[Received | None] = ContextVar("answering", default=None)
"""The request being answered on this connection."""


def wants_stream(request: Received | None) -> bool:
    """Whether `request` asked for its reply as a stream."""
    return (
        request is not None
        and isinstance(request.body, dict)
        and request.body.get("stream") is True
    )


def chunks_of(body: dict[str, Any], *, size: int = 4, usage: bool = True) -> list[dict[str, Any]]:
    """The chunks of a server streaming the response `body`: for each choice, a first delta
    (its role and the message's fields given whole), its content `size` characters at a
    time, each tool call (its id, type and name, then its arguments `size` characters at
    a time), and its finish reason; then, with `usage`, a chunk with no choices and the
    usage (which the others have as null, as OpenAI sends it). Each chunk has the body's
    fields in the body's order, and is a `chat.completion.chunk`."""

    def chunk(choices: list[dict[str, Any]], counts: Any = None) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for key, value in body.items():
            if key == "object":
                fields[key] = "chat.completion.chunk"
            elif key == "choices":
                fields[key] = choices
            elif key != "usage":
                fields[key] = value
            elif usage:
                fields[key] = counts
        return fields

    chunks = [
        chunk([part])
        for position, choice in enumerate(body["choices"])
        for part in _choice_chunks(choice.get("index", position), choice, size)
    ]
    if usage and body.get("usage") is not None:
        chunks.append(chunk([], body["usage"]))
    return chunks


def _choice_chunks(index: int, choice: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """The streamed parts of one choice, each a chunk's `choices[0]`, with the choice's
    fields in its order (the message's as the delta)."""
    message = choice["message"]
    content = message.get("content")
    first = {
        key: ("" if isinstance(content, str) else None) if key == "content" else value
        for key, value in message.items()
        if key != "tool_calls"
    }
    deltas: list[dict[str, Any]] = [first]
    deltas.extend({"content": piece} for piece in _pieces(content or "", size))
    for position, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        head = {k: v for k, v in call.items() if k != "function"}
        named = {"index": position, **head, "function": {"name": function["name"], "arguments": ""}}
        deltas.append({"tool_calls": [named]})
        deltas.extend(
            {"tool_calls": [{"index": position, "function": {"arguments": piece}}]}
            for piece in _pieces(function["arguments"], size)
        )
    deltas.append({})

    def part(number: int, delta: dict[str, Any]) -> dict[str, Any]:
        last = number == len(deltas) - 1
        fields: dict[str, Any] = {} if "index" in choice else {"index": index}
        for key, value in choice.items():
            if key == "message":
                fields["delta"] = delta
            elif key == "finish_reason":
                fields[key] = value if last else None
            elif key == "index" or number == 0:
                fields[key] = value
        return fields

    return [part(number, delta) for number, delta in enumerate(deltas)]


def _pieces(text: str, size: int) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)]


def sse(data: dict[str, Any] | str) -> bytes:
    """One Server-Sent Event carrying `data` (a dict as JSON)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


class Behaviour(Protocol):
    async def respond(self, connection: h11.Connection, stream: anyio.abc.ByteStream) -> bool:
        """Answer one request; return whether the connection stays open."""
        ...


@dataclass(frozen=True)
class Reply:
    """Answer with `status` and `body` (a dict is sent as JSON, bytes and str as they are)."""

    status: int = 200
    body: dict[str, Any] | bytes | str = field(default_factory=completion)
    headers: tuple[tuple[str, str], ...] = ()

    async def respond(self, connection: h11.Connection, stream: anyio.abc.ByteStream) -> bool:
        if self.status == 200 and isinstance(self.body, dict) and wants_stream(_answering.get()):
            return await Streamed(self.body, headers=self.headers).respond(connection, stream)
        if isinstance(self.body, dict):
            payload = json.dumps(self.body).encode()
        elif isinstance(self.body, str):
            payload = self.body.encode()
        else:
            payload = self.body
        headers = [
            ("content-type", "application/json"),
            ("content-length", str(len(payload))),
            *self.headers,
        ]
        await stream.send(connection.send(h11.Response(status_code=self.status, headers=headers)))
        await stream.send(connection.send(h11.Data(data=payload)))
        await stream.send(connection.send(h11.EndOfMessage()))
        return True


@dataclass(frozen=True)
class Streamed:
    """Stream `body` as `chunks_of` gives it (each `size` characters), then `data: [DONE]`,
    waiting `delay` seconds before each chunk; `stamp`, a function of the chunk's number,
    makes each content piece (a test server then sends what it is told, the send time,
    say). `chunks`, when given, are sent instead of the body's. With `cut_after`, hang up
    after that many chunks (no [DONE]); with `error`, send that error object as the last
    event instead; with `done` False, end the body without [DONE]."""

    body: dict[str, Any] = field(default_factory=completion)
    size: int = 4
    delay: float = 0.0
    cut_after: int | None = None
    error: dict[str, Any] | None = None
    done: bool = True
    stamp: Callable[[int], str] | None = None
    chunks: tuple[dict[str, Any] | str, ...] | None = None
    headers: tuple[tuple[str, str], ...] = ()

    async def respond(self, connection: h11.Connection, stream: anyio.abc.ByteStream) -> bool:
        asked = _answering.get()
        usage = (
            asked is None
            or not isinstance(asked.body, dict)
            or bool((asked.body.get("stream_options") or {}).get("include_usage"))
        )
        chunks: list[dict[str, Any] | str] = (
            list(self.chunks)
            if self.chunks is not None
            else list(chunks_of(self.body, size=self.size, usage=usage))
        )
        headers = [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
            *self.headers,
        ]
        await stream.send(connection.send(h11.Response(status_code=200, headers=headers)))
        for number, chunk in enumerate(chunks):
            if self.cut_after is not None and number == self.cut_after:
                return False
            if self.delay:
                await anyio.sleep(self.delay)
            if self.stamp is not None and isinstance(chunk, dict):
                delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
                if delta.get("content"):
                    delta["content"] = self.stamp(number)
            await stream.send(connection.send(h11.Data(data=sse(chunk))))
        if self.error is not None:
            await stream.send(connection.send(h11.Data(data=sse({"error": self.error}))))
        elif self.done:
            await stream.send(connection.send(h11.Data(data=sse("[DONE]"))))
        await stream.send(connection.send(h11.EndOfMessage()))
        return True


@dataclass(frozen=True)
class Stall:
    """Never answer (until the server stops): the client's read timeout fires."""

    async def respond(self, connection: h11.Connection, stream: anyio.abc.ByteStream) -> bool:
        await anyio.sleep_forever()
        return False


@dataclass(frozen=True)
class HangUp:
    """Close the connection: at once, or after the headers and `partial` of a longer body."""

    partial: bytes | None = None

    async def respond(self, connection: h11.Connection, stream: anyio.abc.ByteStream) -> bool:
        if self.partial is not None:
            headers = [("content-length", str(len(self.partial) + 100))]
            await stream.send(connection.send(h11.Response(status_code=200, headers=headers)))
            await stream.send(connection.send(h11.Data(data=self.partial)))
        return False


class Gate:
    """Hold every request given this gate until `count` of them have arrived, then reply."""

    def __init__(self, count: int, reply: Reply | None = None) -> None:
        self.count = count
        self.reply = reply or Reply()
        self.arrived = 0
        self._open: anyio.Event | None = None

    async def respond(self, connection: h11.Connection, stream: anyio.abc.ByteStream) -> bool:
        if self._open is None:
            self._open = anyio.Event()
        self.arrived += 1
        if self.arrived >= self.count:
            self._open.set()
        await self._open.wait()
        return await self.reply.respond(connection, stream)


class ChatServer:
    """The running server: its address, its script, and what it received."""

    def __init__(self, port: int, script: list[Behaviour]) -> None:
        self.port = port
        self.script = script
        self.received: list[Received] = []
        self.connections = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def push(self, *behaviours: Behaviour) -> None:
        self.script.extend(behaviours)

    async def handle(self, stream: anyio.abc.ByteStream) -> None:
        self.connections += 1
        connection = h11.Connection(h11.SERVER)
        async with stream:
            try:
                while (received := await _read_request(connection, stream)) is not None:
                    self.received.append(received)
                    _answering.set(received)
                    behaviour = self.script.pop(0) if self.script else Reply()
                    if not await behaviour.respond(connection, stream):
                        return
                    if connection.our_state is h11.MUST_CLOSE:
                        return
                    connection.start_next_cycle()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return


async def _read_request(
    connection: h11.Connection, stream: anyio.abc.ByteStream
) -> Received | None:
    """The next request on the connection, or None when the client closed it."""
    request: h11.Request | None = None
    body = bytearray()
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError:
            return None
        if event is h11.NEED_DATA:
            try:
                data = await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                data = b""
            connection.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage) and request is not None:
            return Received(
                method=request.method.decode(),
                path=request.target.decode(),
                headers={name.decode(): value.decode() for name, value in request.headers},
                body=json.loads(body) if body else None,
            )
        elif isinstance(event, h11.ConnectionClosed):
            return None


@asynccontextmanager
async def serve_chat(*script: Behaviour) -> AsyncIterator[ChatServer]:
    """Run a ChatServer on a free port of 127.0.0.1 for the duration of the block."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    server = ChatServer(port, list(script))
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, server.handle)
        try:
            yield server
        finally:
            tasks.cancel_scope.cancel()
