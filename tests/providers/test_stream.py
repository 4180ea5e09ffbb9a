"""Streaming OpenAIChat against the real OpenAI-compatible test server on 127.0.0.1: the
reply's fragments as deltas, the streamed response put back together as the unstreamed
one, and a stream cut mid-way as a transient failure that a retry starts over."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.providers.openai_server import (
    Behaviour,
    ChatServer,
    Reply,
    Streamed,
    chunks_of,
    completion,
    serve_chat,
)
from turnkeeper.core import ChatError
from turnkeeper.events import ChatRetried, TokenDelta
from turnkeeper.providers import (
    DeltaSink,
    OpenAIChat,
    aclose_shared_client,
    collecting_events,
    delta_sink,
    streaming_to,
    with_retry,
)
from turnkeeper.providers._openai import _Reply, _sse_data

pytestmark = pytest.mark.anyio

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}]}


def calls_body(*calls: tuple[str, str], content: str | None = None) -> dict[str, Any]:
    """A response with tool calls `(name, arguments JSON)`, ids call_0, call_1, ..."""
    body = completion(content, id="chatcmpl-7", created=1_700_000_000, system_fingerprint="fp")
    message = body["choices"][0]["message"]
    message["tool_calls"] = [
        {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": args}}
        for n, (name, args) in enumerate(calls)
    ]
    body["choices"][0]["finish_reason"] = "tool_calls"
    return body


@asynccontextmanager
async def serving(*script: Behaviour) -> AsyncIterator[ChatServer]:
    async with serve_chat(*script) as server:
        try:
            yield server
        finally:
            await aclose_shared_client()


async def streamed(chat: Any, request: dict[str, Any] = REQUEST) -> tuple[Any, list[TokenDelta]]:
    """The response to a streamed call, and the deltas it sent."""
    deltas: list[TokenDelta] = []
    with streaming_to(DeltaSink(deltas.append, "s1", 4)):
        response = await chat(request)
    return response, deltas


def content_of(deltas: list[TokenDelta]) -> str:
    return "".join(d.text for d in deltas if d.tool_call is None)


async def test_a_streamed_reply_is_the_response_the_server_gives_unstreamed() -> None:
    body = completion("It is sunny in Paris, 21 degrees.", id="chatcmpl-1", created=5)
    async with serving(Reply(body=body), Reply(body=body)) as server:
        chat = OpenAIChat(server.base_url)
        whole = await chat(REQUEST)
        response, deltas = await streamed(chat)
    assert response == whole == body
    assert content_of(deltas) == body["choices"][0]["message"]["content"]
    assert len(deltas) > 1
    assert [d.index for d in deltas] == list(range(len(deltas)))
    assert {(d.session_id, d.after, d.attempt) for d in deltas} == {("s1", 4, 1)}
    plain, asked = server.received[0].body, server.received[1].body
    assert "stream" not in plain
    assert "stream_options" not in plain
    assert asked == {**plain, "stream": True, "stream_options": {"include_usage": True}}


async def test_tool_call_fragments_are_assembled_by_index() -> None:
    body = calls_body(
        ("get_weather", '{"city": "Paris", "unit": "celsius"}'),
        ("get_time", '{"zone": "Europe/Paris"}'),
        content="Checking.",
    )
    async with serving(Streamed(body, size=3)) as server:
        response, deltas = await streamed(OpenAIChat(server.base_url))
    assert response == body
    assert content_of(deltas) == "Checking."
    for position, call in enumerate(body["choices"][0]["message"]["tool_calls"]):
        parts = [d for d in deltas if d.tool_call == position]
        assert "".join(d.text for d in parts) == call["function"]["arguments"]
        assert [d.name for d in parts if d.name] == [call["function"]["name"]]
        assert parts[0].name == call["function"]["name"]


async def test_interleaved_tool_calls_go_back_to_their_index() -> None:
    def part(index: int, **function: str) -> dict[str, Any]:
        call: dict[str, Any] = {"index": index, "function": function}
        if "name" in function:
            call.update(id=f"call_{index}", type="function")
        return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}

    chunks = (
        {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        part(1, name="b", arguments='{"y"'),
        part(0, name="a", arguments='{"x"'),
        part(1, arguments=": 2}"),
        part(0, arguments=": 1}"),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    )
    async with serving(Streamed(chunks=chunks)) as server:
        response, deltas = await streamed(OpenAIChat(server.base_url))
    calls = response["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("call_0", "a", '{"x": 1}'),
        ("call_1", "b", '{"y": 2}'),
    ]
    assert [(d.tool_call, d.name, d.text) for d in deltas] == [
        (1, "b", '{"y"'),
        (0, "a", '{"x"'),
        (1, None, ": 2}"),
        (0, None, ": 1}"),
    ]


async def test_every_field_of_every_choice_is_kept() -> None:
    body = completion("first", id="x", created=1, service_tier="default", system_fingerprint="f")
    logprobs = {"content": [{"token": "fi", "logprob": -0.1}, {"token": "rst", "logprob": -0.2}]}
    body["choices"][0].update(logprobs=logprobs)
    body["choices"][0]["message"]["refusal"] = None
    second = {
        "index": 1,
        "message": {"role": "assistant", "content": "second reply"},
        "finish_reason": "length",
    }
    body["choices"].append(second)
    chunks = chunks_of(body, size=2)
    # A server gives each token's logprobs with its piece of text.
    first_parts = [c for c in chunks if c["choices"] and c["choices"][0]["index"] == 0]
    first_parts[0]["choices"][0]["logprobs"] = {"content": logprobs["content"][:1]}
    first_parts[1]["choices"][0]["logprobs"] = {"content": logprobs["content"][1:]}
    async with serving(Streamed(chunks=tuple(chunks))) as server:
        response, deltas = await streamed(OpenAIChat(server.base_url))
    assert response == body
    assert content_of(deltas) == "first"  # the first choice's text only


async def test_a_stream_cut_mid_way_is_transient_and_the_retry_starts_over() -> None:
    body = completion("All of the reply, this time.")
    async with serving(Streamed(body, cut_after=3), Streamed(body)) as server:
        chat = with_retry(OpenAIChat(server.base_url), base_delay=0)
        with collecting_events() as reported:
            response, deltas = await streamed(chat)
    assert response == body
    first = [d for d in deltas if d.attempt == 1]
    second = [d for d in deltas if d.attempt == 2]
    assert first
    assert len(first) < len(second)
    assert [d.index for d in second] == list(range(len(second)))
    assert content_of(second) == body["choices"][0]["message"]["content"]
    assert [type(e) for e in reported] == [ChatRetried]


# A body that ends cleanly with neither its finish reason (nor usage) nor [DONE].
_UNFINISHED = Streamed(chunks=tuple(chunks_of(completion("no end"), size=2)[:-2]), done=False)


@pytest.mark.parametrize(
    ("behaviour", "said"),
    [
        (Streamed(completion("cut"), cut_after=2), "connection failed"),
        (_UNFINISHED, "the stream ended before the reply did"),
        (Streamed(completion("oops"), error={"message": "the GPU fell over"}), "GPU fell over"),
    ],
)
async def test_a_stream_that_does_not_finish_is_a_transient_error(
    behaviour: Streamed, said: str
) -> None:
    async with serving(behaviour) as server:
        with pytest.raises(ChatError) as caught:
            await streamed(OpenAIChat(server.base_url))
    assert caught.value.transient
    assert said in caught.value.message
    assert server.base_url in caught.value.message


async def test_a_finished_stream_without_done_is_whole() -> None:
    body = completion("finished")
    async with serving(Streamed(body, done=False)) as server:
        response, _ = await streamed(OpenAIChat(server.base_url))
    assert response == body


async def test_a_stream_stalled_mid_way_times_out_transiently() -> None:
    async with serving(Streamed(completion("slow"), delay=0.5)) as server:
        with pytest.raises(ChatError) as caught:
            await streamed(OpenAIChat(server.base_url, timeout=0.1))
    assert caught.value.transient
    assert "timed out after 0.1 s" in caught.value.message


@pytest.mark.parametrize(
    ("chunk", "said"),
    [
        ("not json at all", "a stream chunk is not JSON"),
        ("[1, 2]", "a stream chunk is a list, not an object"),
    ],
)
async def test_a_chunk_that_is_no_object_is_a_permanent_error(chunk: str, said: str) -> None:
    first = chunks_of(completion("x"))[0]
    async with serving(Streamed(chunks=(first, chunk))) as server:
        with pytest.raises(ChatError) as caught:
            await streamed(OpenAIChat(server.base_url))
    assert not caught.value.transient
    assert f"malformed response: {said}" in caught.value.message


@pytest.mark.parametrize(("status", "transient"), [(503, True), (400, False)])
async def test_an_error_status_on_a_streamed_request_is_as_unstreamed(
    status: int, transient: bool
) -> None:
    body = {"error": {"message": "no such model"}}
    async with serving(Reply(status, body), Reply(status, body)) as server:
        chat = OpenAIChat(server.base_url)
        with pytest.raises(ChatError) as plain:
            await chat(REQUEST)
        with pytest.raises(ChatError) as stream:
            await streamed(chat)
    assert stream.value.message == plain.value.message
    assert "no such model" in stream.value.message
    assert stream.value.transient is plain.value.transient is transient
    assert stream.value.status == status


async def test_a_server_that_answers_whole_gives_one_fragment() -> None:
    body = calls_body(("get_weather", '{"city": "Oslo"}'), content="Looking.")
    whole = Reply(body=json.dumps(body), headers=())  # a str body is sent as it is, JSON
    async with serving(whole) as server:
        response, deltas = await streamed(OpenAIChat(server.base_url))
    assert response == body
    assert [(d.tool_call, d.name, d.text) for d in deltas] == [
        (None, None, "Looking."),
        (0, "get_weather", '{"city": "Oslo"}'),
    ]


async def test_without_a_sink_nothing_is_streamed() -> None:
    assert delta_sink() is None
    async with serving(Reply()) as server:
        await OpenAIChat(server.base_url)(REQUEST)
    assert "stream" not in server.received[0].body


def test_a_sink_sends_no_empty_fragment_and_a_restart_begins_a_new_attempt() -> None:
    got: list[TokenDelta] = []
    sink = DeltaSink(got.append, "s", 0)
    sink.text("")
    sink.tool_call(0, "")
    sink.text("a")
    sink.tool_call(0, "", "lookup")
    sink.restart()
    sink.text("b")
    assert [(d.attempt, d.index, d.text, d.tool_call, d.name) for d in got] == [
        (1, 0, "a", None, None),
        (1, 1, "", 0, "lookup"),
        (2, 0, "b", None, None),
    ]


_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
_calls = st.lists(
    st.tuples(st.sampled_from(["a", "lookup", "get_weather"]), _text.map(json.dumps)),
    max_size=3,
)


@given(content=st.none() | _text, calls=_calls, size=st.integers(1, 7))
def test_any_reply_put_back_together_is_the_reply(
    content: str | None, calls: list[tuple[str, str]], size: int
) -> None:
    body = calls_body(*calls, content=content) if calls else completion(content, id="i")
    got: list[TokenDelta] = []
    reply = _Reply(DeltaSink(got.append, "s", 0))
    for chunk in chunks_of(body, size=size):
        reply.add(chunk)
    assert reply.finished
    assert reply.response() == body
    assert content_of(got) == (content or "")
    for position, (name, arguments) in enumerate(calls):
        parts = [d for d in got if d.tool_call == position]
        assert (parts[0].name, "".join(d.text for d in parts)) == (name, arguments)


_payloads = st.lists(
    st.lists(
        st.text(st.characters(codec="ascii", exclude_characters="\r\n"), max_size=12),
        min_size=1,
        max_size=3,
    ),
    max_size=5,
)


@given(
    payloads=_payloads,
    ending=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_sse_data_is_read_whatever_the_line_endings_and_chunks(
    payloads: list[list[str]], ending: str, cuts: list[int]
) -> None:
    """Each event's data lines (joined by newlines), with comments and other fields
    between, cut anywhere into chunks."""
    body = f": a comment{ending}{ending}"
    for lines in payloads:
        body += f"event: x{ending}" + "".join(f"data: {line}{ending}" for line in lines) + ending
    raw = body.encode()
    points = sorted({0, len(raw), *(cut for cut in cuts if cut < len(raw))})
    chunks = [raw[a:b] for a, b in itertools.pairwise(points)]

    async def read() -> list[bytes]:
        async def source() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        return [data async for data in _sse_data(source())]

    got = anyio.run(read)
    assert got == ["\n".join(lines).encode() for lines in payloads]
