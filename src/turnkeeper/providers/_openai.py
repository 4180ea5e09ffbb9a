"""OpenAIChat: a chat backend for any OpenAI-compatible server (Ollama, vLLM, llama.cpp, OpenAI)."""

from __future__ import annotations

import math
import os
import re
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import anyio.lowlevel
import httpx
import msgspec

from turnkeeper.core import MAX_JSON_DEPTH, ChatError, InputError, encodes, nests_deeper
from turnkeeper.providers._chat import error_for_status, parse_retry_after
from turnkeeper.providers._stream import DeltaSink, delta_sink

_KEY_VARIABLES = ("TURNKEEPER_API_KEY", "OPENAI_API_KEY")
_DETAIL_CHARS = 300  # of a server's error message quoted in a ChatError
_REDACTED = "[redacted]"
# What HTTP allows in a header value (printable ASCII, spaces and tabs), checked up front
# because an HTTP library quotes a bad value, the key with it, in its error.
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]*")
_KEY = re.compile(r"[\x21-\x7e]+")
# The pool is shared by every session, so it keeps as many idle connections as it may open.
# It is cut into small pools: httpcore spends time quadratic in a pool's connections on
# each request (encode/httpcore#1035), a pause of the event loop of 10 ms and more at 100
# connections, which delays every session's reply and every streamed token; and on each
# request's start and end it checks every idle connection of the pool with a syscall.
# Pools of 4 cost a short streamed call (2 tokens) about a quarter less CPU than pools of
# 13 did (1.5 against 2.1 ms, 100 calls at once).
_POOLS = 25
_LIMITS = httpx.Limits(max_connections=4, max_keepalive_connections=4)  # each, 100 in all
_TOO_DEEP = f"nested more than {MAX_JSON_DEPTH} levels deep"
_EVENT_STREAM = "text/event-stream"
_DONE = b"[DONE]"
# Fields of a streamed message or tool call given once, not in pieces to be joined.
_WHOLE = frozenset({"role", "id", "type", "name"})

_shared: tuple[anyio.lowlevel.EventLoopToken, _Pools] | None = None


class OpenAIChat:
    """A chat backend that POSTs each request to `{base_url}/chat/completions`.

    `base_url` is the API root, e.g. `http://127.0.0.1:8080/v1`. `model`, when given,
    replaces the request's model. The API key is `api_key`, else the environment's
    `TURNKEEPER_API_KEY`, else `OPENAI_API_KEY`; without one no Authorization header is
    sent. The key never appears in a message, repr or event. `timeout` (seconds) applies
    to each of connecting, sending, waiting for a pooled connection and reading.
    `headers` are sent with every request.

    Every OpenAIChat of a process shares 25 pooled `httpx.AsyncClient`s (per event loop;
    close them with `aclose_shared_client()`), 4 connections each, 100 in all, unless
    `client` is given, which the caller then owns. The response JSON is returned
    verbatim. Failures raise ChatError: transient for HTTP 408, 429 (with `retry_after`
    from Retry-After) and 5xx and for timeouts and lost connections; permanent for other
    statuses and for a response that is not JSON, nests more than 128 levels deep or has
    no `choices[0].message`.

    When the call is streamed (a caller wants its deltas: `run(on_delta=...)`, a Host's
    subscriber), the request asks for `stream: true` with `stream_options.include_usage`;
    the Server-Sent Events' chunks are sent to the sink as they come (content, and tool
    calls by their index) and put back together into the response the server would have
    sent unstreamed. A stream that ends before the reply does (no finish reason and no
    `[DONE]`), stalls past `timeout` or carries an error object is a transient ChatError;
    a server that answers a stream request with plain JSON is taken as it is.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        client: httpx.AsyncClient | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._url = _endpoint(base_url)
        self._shown_url = str(self._url.copy_with(username=None, password=None, query=None))
        if model is not None and (not isinstance(model, str) or not model):
            raise InputError(f"OpenAIChat: model must be a non-empty string or None, got {model!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise InputError(f"OpenAIChat: timeout must be a number of seconds, got {timeout!r}")
        if not (math.isfinite(timeout) and timeout > 0):
            raise InputError(f"OpenAIChat: timeout must be finite and > 0, got {timeout!r}")
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise InputError(f"OpenAIChat: client must be an httpx.AsyncClient, got {client!r}")
        self._model = model
        self._timeout = float(timeout)
        self._client = client
        self._key = _find_key(api_key)
        self._headers = _request_headers(headers, self._key)

    def __repr__(self) -> str:
        return f"OpenAIChat({self._shown_url!r}, model={self._model!r})"

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one chat-completions request and return the server's response JSON.

        When the caller streams the call (`delta_sink()`), the request asks for `stream:
        true`; the reply's fragments go to the sink as they arrive, and the chunks are
        put back together into the response the server would have sent unstreamed."""
        sink = delta_sink()
        body = self._encode(request, stream=sink is not None)
        with self._transport_errors(), _client_for(self._client) as client:
            if sink is not None:
                return await self._streamed(client, body, sink)
            response = await client.post(
                self._url, content=body, headers=self._headers, timeout=self._timeout
            )
        if not response.is_success:
            raise self._status_error(response)
        return self._decode(response.content)

    @contextmanager
    def _transport_errors(self) -> Iterator[None]:
        """Turn httpx's failures inside the block into ChatErrors."""
        try:
            yield
        except httpx.TimeoutException as error:
            raise self._error(
                f"timed out after {self._timeout:g} s ({type(error).__name__})", transient=True
            ) from error
        except (httpx.LocalProtocolError, httpx.UnsupportedProtocol) as error:
            raise self._error(f"request failed: {error}", transient=False) from error
        except httpx.TransportError as error:
            reason = str(error) or type(error).__name__
            raise self._error(f"connection failed: {reason}", transient=True) from error
        except httpx.RequestError as error:
            raise self._error(f"request failed: {error}", transient=False) from error

    async def _streamed(
        self, client: httpx.AsyncClient, body: bytes, sink: DeltaSink
    ) -> dict[str, Any]:
        """The response to a streamed request, its fragments sent to `sink` on the way."""
        async with client.stream(
            "POST", self._url, content=body, headers=self._headers, timeout=self._timeout
        ) as response:
            if not response.is_success:
                await response.aread()
                raise self._status_error(response)
            if not response.headers.get("content-type", "").startswith(_EVENT_STREAM):
                # A server that does not stream answers whole: one fragment, then.
                whole = self._decode(await response.aread())
                _send_whole(whole, sink)
                return whole
            reply = _Reply(sink)
            done = False
            failure: ChatError | None = None
            # Read to the end even after [DONE] or a failure: the connection then goes back
            # to the pool, and no generator of the response is left unfinished.
            async for data in _sse_data(response.aiter_bytes()):
                if done or failure is not None:
                    continue
                if data == _DONE:
                    done = True
                    continue
                try:
                    chunk = self._decode_chunk(data)
                except ChatError as error:
                    failure = error
                    continue
                said = _error_message(chunk) if "error" in chunk else None
                if said is not None:
                    failure = self._error(f"the server failed mid-stream: {said}", transient=True)
                    continue
                reply.add(chunk)
        if failure is not None:
            raise failure
        if not (done or reply.finished):
            raise self._error("the stream ended before the reply did", transient=True)
        return self._checked(reply.response())

    def _encode(self, request: dict[str, Any], *, stream: bool) -> bytes:
        if not isinstance(request, Mapping):
            raise InputError(f"OpenAIChat: a request must be a dict, got {type(request).__name__}")
        body = dict(request)
        if self._model is not None:
            body["model"] = self._model
        if not body.get("tools"):
            body.pop("tools", None)
        if stream:
            body["stream"] = True
            # Usage comes in a last chunk of its own, and only when asked for.
            body.setdefault("stream_options", {"include_usage": True})
        try:
            return msgspec.json.encode(body)
        except (TypeError, ValueError, OverflowError, RecursionError) as error:
            raise InputError(f"OpenAIChat: the request cannot be sent as JSON: {error}") from None

    def _decode(self, content: bytes) -> dict[str, Any]:
        try:
            response = msgspec.json.decode(content)
        except msgspec.DecodeError as error:
            raise self._malformed(f"not JSON ({error}): {_shorten(content)}") from None
        except RecursionError:  # msgspec's decoder, on nesting deeper than the stack allows
            raise self._malformed(_TOO_DEEP) from None
        if not isinstance(response, dict):
            raise self._malformed(f"expected a JSON object, got {type(response).__name__}")
        return self._checked(response)

    def _decode_chunk(self, data: bytes) -> dict[str, Any]:
        try:
            chunk = msgspec.json.decode(data)
        except msgspec.DecodeError as error:
            raise self._malformed(
                f"a stream chunk is not JSON ({error}): {_shorten(data)}"
            ) from None
        except RecursionError:
            raise self._malformed(_TOO_DEEP) from None
        if not isinstance(chunk, dict):
            raise self._malformed(f"a stream chunk is a {type(chunk).__name__}, not an object")
        return chunk

    def _checked(self, response: dict[str, Any]) -> dict[str, Any]:
        """`response`, unless it nests too deep or has no `choices[0].message`."""
        # Decoded here, it may still be too deep to log or encode further up the stack.
        if nests_deeper(response, MAX_JSON_DEPTH):
            raise self._malformed(_TOO_DEEP)
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices:
            said = _error_message(response)
            raise self._malformed("no choices" + (f" (the server said: {said})" if said else ""))
        first = choices[0]
        if not isinstance(first, dict) or not isinstance(first.get("message"), dict):
            raise self._malformed("choices[0] has no message object")
        return response

    def _status_error(self, response: httpx.Response) -> ChatError:
        detail = f"{self._redact(_error_detail(response)) or 'empty body'} (POST {self._shown_url})"
        retry_after = parse_retry_after(response.headers.get("retry-after"), now=time.time())
        return error_for_status(response.status_code, detail, retry_after=retry_after)

    def _malformed(self, what: str) -> ChatError:
        return self._error(f"malformed response: {what}", transient=False)

    def _error(self, message: str, *, transient: bool) -> ChatError:
        return ChatError(f"{self._redact(message)} (POST {self._shown_url})", transient=transient)

    def _redact(self, text: str) -> str:
        return text.replace(self._key, _REDACTED) if self._key else text


async def aclose_shared_client() -> None:
    """Close the pooled clients every OpenAIChat without its own `client` uses.

    Call it before the event loop ends; the next request opens new ones.
    """
    global _shared
    if _shared is not None:
        _, pools = _shared
        _shared = None
        await pools.aclose()


class _Pools:
    """The process's pooled clients for one event loop, each opened on first use. A
    request takes the first of those with the fewest requests in flight: calls one at a
    time reuse one connection, and concurrent ones spread over the pools."""

    def __init__(self) -> None:
        self.clients: list[httpx.AsyncClient | None] = [None] * _POOLS
        self.busy = [0] * _POOLS
        # One TLS context for all: each takes tens of ms to make (the CA certificates).
        self.tls: ssl.SSLContext | None = None

    @contextmanager
    def client(self) -> Iterator[httpx.AsyncClient]:
        index = self.busy.index(min(self.busy))
        client = self.clients[index]
        if client is None:
            if self.tls is None:
                self.tls = httpx.create_ssl_context()
            client = self.clients[index] = httpx.AsyncClient(limits=_LIMITS, verify=self.tls)
        self.busy[index] += 1
        try:
            yield client
        finally:
            self.busy[index] -= 1

    async def aclose(self) -> None:
        for client in self.clients:
            if client is not None:
                await client.aclose()


def _client_for(own: httpx.AsyncClient | None) -> AbstractContextManager[httpx.AsyncClient]:
    """`own`, or a pooled client for the running event loop (the pools made on first use)."""
    if own is not None:
        return nullcontext(own)
    global _shared
    loop = anyio.lowlevel.current_token()
    if _shared is None or _shared[0] != loop:
        # A client's connections belong to the loop that opened them; one from a finished
        # loop cannot be used (or closed) from this one.
        _shared = (loop, _Pools())
    return _shared[1].client()


def _endpoint(base_url: str) -> httpx.URL:
    """`{base_url}/chat/completions`; InputError naming base_url if it is no http(s) URL."""
    if not isinstance(base_url, str):
        raise InputError(f"OpenAIChat: base_url must be a string, got {type(base_url).__name__}")
    if not encodes(base_url):
        # A lone surrogate (how Python decodes a non-UTF-8 byte of argv) cannot be quoted.
        raise InputError("OpenAIChat: base_url is not a URL: it is not UTF-8 text")
    try:
        url = httpx.URL(base_url.rstrip("/") + "/chat/completions")
    except httpx.InvalidURL as error:
        raise InputError(f"OpenAIChat: base_url is not a URL: {error}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InputError(
            "OpenAIChat: base_url must be an http:// or https:// URL with a host, "
            "like http://127.0.0.1:8080/v1"
        )
    return url


def _find_key(api_key: str | None) -> str | None:
    if api_key is None:
        api_key = next((os.environ[name] for name in _KEY_VARIABLES if os.environ.get(name)), None)
        source = "the API key from the environment"
    else:
        source = "api_key"
    if api_key is None:
        return None
    if not isinstance(api_key, str) or not _KEY.fullmatch(api_key):
        # The key itself is not quoted, so a bad one cannot leak through this message.
        raise InputError(f"OpenAIChat: {source} must be non-empty printable ASCII without spaces")
    return api_key


def _request_headers(extra: Mapping[str, str] | None, key: str | None) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    for name, value in (extra or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InputError(f"OpenAIChat: headers must map strings to strings, got {name!r}")
        if not _HEADER_VALUE.fullmatch(value):
            raise InputError(f"OpenAIChat: header {name!r} has characters HTTP does not allow")
        headers[name.lower()] = value
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return headers


def _error_detail(response: httpx.Response) -> str:
    """The server's error message: `error.message` from a JSON body, else the body's text."""
    try:
        message = _error_message(msgspec.json.decode(response.content))
    except (msgspec.DecodeError, RecursionError):
        message = None
    return _shorten(response.content) if message is None else _truncate(message)


def _error_message(body: object) -> str | None:
    if not isinstance(body, dict):
        return None
    error = body.get("error", body.get("detail", body.get("message")))
    if isinstance(error, dict):
        error = error.get("message")
    return error if isinstance(error, str) and error else None


def _shorten(content: bytes) -> str:
    return _truncate(content[: 4 * _DETAIL_CHARS].decode("utf-8", "replace").strip())


def _truncate(text: str) -> str:
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS] + "..."


async def _sse_data(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The `data` of each Server-Sent Event in the body `chunks` (its data lines joined by
    newlines); comments and the other fields are skipped. Lines may end in LF, CRLF or CR."""
    buffer = b""
    held_cr = False  # a CR that ended a chunk: the next may begin with its LF
    async for chunk in chunks:
        if held_cr:
            chunk = b"\r" + chunk
        held_cr = chunk.endswith(b"\r")
        if held_cr:
            chunk = chunk[:-1]
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer += chunk
        while (end := buffer.find(b"\n\n")) >= 0:
            block, buffer = buffer[:end], buffer[end + 2 :]
            data = _data_of(block)
            if data is not None:
                yield data
    data = _data_of(buffer)
    if data is not None:
        yield data


def _data_of(block: bytes) -> bytes | None:
    """The data of one event's lines, or None if it has no data line."""
    if block.startswith(b"data: ") and b"\n" not in block:
        return block[6:]  # the common case: one data line
    data = [
        line[6:] if line.startswith(b"data: ") else line[5:]
        for line in block.split(b"\n")
        if line.startswith(b"data:")
    ]
    return b"\n".join(data) if data else None


class _Reply:
    """A streamed reply put back together from its chunks into the unstreamed response:
    each choice's deltas joined into its message (text fields' pieces concatenated, tool
    calls assembled by their index), the chunks' other fields kept as they come. The
    first choice's content and tool calls go to the sink as they arrive."""

    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink
        self.fields: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.calls: dict[int, dict[int, dict[str, Any]]] = {}
        self.named: set[int] = set()

    @property
    def finished(self) -> bool:
        """Whether every choice has its finish reason (the reply is whole)."""
        return bool(self.choices) and all(
            choice.get("finish_reason") is not None for choice in self.choices.values()
        )

    def add(self, chunk: dict[str, Any]) -> None:
        for key, value in chunk.items():
            if key == "choices":
                self.fields.setdefault(key, None)  # its place among the fields
                for choice in value if isinstance(value, list) else ():
                    if isinstance(choice, dict):
                        self._add_choice(choice)
            elif key == "usage":
                if value is not None or key not in self.fields:
                    self.fields[key] = value
            else:
                self.fields.setdefault(key, value)

    def _add_choice(self, choice: dict[str, Any]) -> None:
        index = _index(choice, 0)
        built = self.choices.get(index)
        if built is None:
            built = self.choices[index] = {}
        # In the chunk's order of fields, its delta as the message, so that the response's
        # JSON comes out as the server's unstreamed one would.
        for key, value in choice.items():
            if key == "delta":
                message = built.setdefault("message", {})
                if isinstance(value, dict):
                    self._add_delta(index, message, value)
            elif key == "finish_reason":
                if value is not None or key not in built:
                    built[key] = value
            elif key == "index":
                built.setdefault(key, index)
            else:
                _join(built, key, value)

    def _add_delta(self, choice: int, message: dict[str, Any], delta: dict[str, Any]) -> None:
        for key, value in delta.items():
            if key == "tool_calls" and isinstance(value, list):
                calls = self.calls.setdefault(choice, {})
                for position, part in enumerate(value):
                    if isinstance(part, dict):
                        self._add_call(choice, calls, _index(part, position), part)
            else:
                _join(message, key, value)
        content = delta.get("content")
        if choice == 0 and isinstance(content, str):
            self.sink.text(content)

    def _add_call(
        self, choice: int, calls: dict[int, dict[str, Any]], index: int, part: dict[str, Any]
    ) -> None:
        call = calls.setdefault(index, {})
        for key, value in part.items():
            if key != "index":
                _join(call, key, value)
        if choice != 0:
            return
        function = part.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        if isinstance(name, str) and name and index not in self.named:
            self.named.add(index)
        else:
            name = None
        arguments = function.get("arguments")
        self.sink.tool_call(index, arguments if isinstance(arguments, str) else "", name)

    def response(self) -> dict[str, Any]:
        """The response the chunks make up."""
        choices = []
        for index in sorted(self.choices):
            choice = {"index": index, **self.choices[index]}
            message = choice.setdefault("message", {})
            choice.setdefault("finish_reason", None)
            message.setdefault("role", "assistant")
            message.setdefault("content", None)
            calls = self.calls.get(index)
            if calls:
                message["tool_calls"] = [calls[n] for n in sorted(calls)]
            choices.append(choice)
        response = {**self.fields, "object": "chat.completion", "choices": choices}
        if response.get("usage", 0) is None:
            del response["usage"]  # a server that sent none
        return response


def _index(part: dict[str, Any], default: int) -> int:
    index = part.get("index", default)
    return index if isinstance(index, int) and not isinstance(index, bool) else default


def _join(into: dict[str, Any], key: str, value: Any) -> None:
    """Add a streamed field's `value` to `into`: text pieces are concatenated (but for the
    fields given whole), objects joined field by field, lists extended; a null adds
    nothing to a value there already."""
    held = into.get(key)
    if value is None:
        into.setdefault(key, None)
    elif isinstance(value, str) and isinstance(held, str):
        if key not in _WHOLE:
            into[key] = held + value
        elif not held:
            into[key] = value
    elif isinstance(value, dict):
        if not isinstance(held, dict):
            held = into[key] = {}
        for name, part in value.items():
            _join(held, name, part)
    elif isinstance(value, list):
        if not isinstance(held, list):
            held = into[key] = []
        held.extend(value)
    else:
        into[key] = value


def _send_whole(response: dict[str, Any], sink: DeltaSink) -> None:
    """Send a response that came whole to `sink`: its content, then each tool call."""
    message = response["choices"][0]["message"]
    content = message.get("content")
    if isinstance(content, str):
        sink.text(content)
    calls = message.get("tool_calls")
    for index, call in enumerate(calls if isinstance(calls, list) else ()):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            name, arguments = function.get("name"), function.get("arguments")
            sink.tool_call(
                index,
                arguments if isinstance(arguments, str) else "",
                name if isinstance(name, str) else None,
            )
