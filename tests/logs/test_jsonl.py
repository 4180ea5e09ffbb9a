"""JSON Lines codec: round trips, torn tails, corrupt lines, seq checks, files, hostile bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, LogCorrupt, LogError, SeqError, ToolResult, ToolSpec, Usage
from turnkeeper.events import (
    AnyEvent,
    Cancelled,
    DirectiveInjected,
    Envelope,
    MessageReceived,
    ModelResponded,
    ToolResultsReceived,
    encode_envelope,
)
from turnkeeper.logs._jsonl import (
    JsonlRead,
    _decode_lines,
    check_sequence,
    decode_jsonl,
    encode_jsonl,
    read_jsonl,
    write_jsonl,
)
from turnkeeper.sessions import open_session, opened_event

SPEC = AgentSpec(system_prompt="You help.", tools=(ToolSpec("search"),), model="tiny")
CALL = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q":"ü"}'}}


def session_log(session_id: str = "a") -> list[Envelope]:
    """A valid six-event log of one session."""
    opened = opened_event(open_session(SPEC, session_id=session_id))
    message = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    events: list[AnyEvent] = [
        opened,
        MessageReceived(text="find ü\nand more"),
        ModelResponded(
            response=msgspec.Raw(
                msgspec.json.encode(
                    {"choices": [{"message": message, "finish_reason": "tool_calls"}]}
                )
            ),
            message=message,
            finish_reason="tool_calls",
            usage=Usage(10, 2),
        ),
        ToolResultsReceived(results=(ToolResult("c1", "found it"),)),
        DirectiveInjected(guard="final_turn", text="Finish now."),
        Cancelled(reason="done"),
    ]
    return [Envelope(session_id, seq, 100.0 + seq, event) for seq, event in enumerate(events, 1)]


LOG = session_log()
DATA = encode_jsonl(LOG)


def numbered(session_id: str, *seqs: int) -> list[Envelope]:
    return [Envelope(session_id, seq, 0.0, MessageReceived(text=f"m{seq}")) for seq in seqs]


def test_round_trip() -> None:
    read = decode_jsonl(DATA)
    assert read == JsonlRead(events=tuple(LOG), torn=None)
    assert DATA.endswith(b"\n")
    assert DATA.count(b"\n") == len(LOG)
    assert DATA.split(b"\n")[:-1] == [encode_envelope(envelope) for envelope in LOG]


def test_empty_input_holds_no_events() -> None:
    assert decode_jsonl(b"") == JsonlRead(events=())
    assert encode_jsonl([]) == b""


def test_a_torn_last_line_is_reported_and_skipped() -> None:
    extra = encode_envelope(Envelope("a", 7, 0.0, MessageReceived(text="cut short")))
    cut = extra[: len(extra) // 2]
    read = decode_jsonl(DATA + cut)
    assert read.events == tuple(LOG)
    assert read.torn is not None
    assert read.torn.line == len(LOG) + 1
    assert read.torn.data == cut
    assert read.torn.error.startswith(f"line {len(LOG) + 1}: not an event envelope")


def test_a_log_that_is_only_a_torn_line() -> None:
    read = decode_jsonl(DATA[:25])
    assert read.events == ()
    assert read.torn is not None
    assert read.torn.line == 1


def test_a_torn_line_keeps_only_its_first_200_bytes() -> None:
    long = encode_envelope(Envelope("a", 7, 0.0, MessageReceived(text="x" * 1000)))[:-3]
    read = decode_jsonl(DATA + long)
    assert read.torn is not None
    assert read.torn.data == long[:200]


def test_a_complete_last_line_without_its_newline_is_an_event() -> None:
    read = decode_jsonl(DATA[:-1])
    assert read.events == tuple(LOG)
    assert read.torn is None


@pytest.mark.parametrize("index", [0, 2, len(LOG) - 1])
def test_a_bad_line_that_is_not_the_torn_tail_raises_naming_it(index: int) -> None:
    lines = DATA.split(b"\n")
    lines[index] = lines[index][:-4]
    with pytest.raises(LogCorrupt) as caught:
        decode_jsonl(b"\n".join(lines))
    assert caught.value.line == index + 1
    assert str(caught.value).startswith(f"line {index + 1}: not an event envelope")


def test_an_invalid_middle_line_raises_even_with_a_torn_tail() -> None:
    lines = DATA.split(b"\n")
    lines[1] = b'{"session_id": "a"}'
    with pytest.raises(LogCorrupt, match=r"^line 2: .*missing required field `seq`"):
        decode_jsonl(b"\n".join(lines) + b'{"sess')


def test_blank_lines_are_ignored_but_counted() -> None:
    lines = DATA.split(b"\n")
    spaced = b"\n".join([b"", lines[0], b"   ", b"\t", lines[1], b"", *lines[2:]])
    assert decode_jsonl(spaced).events == tuple(LOG)
    with pytest.raises(LogCorrupt, match=r"^line 4: "):
        decode_jsonl(b"\n\n" + lines[0] + b"\nnot json\n")


def test_crlf_line_endings_decode() -> None:
    assert decode_jsonl(DATA.replace(b"\n", b"\r\n")).events == tuple(LOG)


def test_a_gap_raises_naming_session_and_seq() -> None:
    with pytest.raises(SeqError) as caught:
        decode_jsonl(encode_jsonl(numbered("sess-x", 1, 2, 4)))
    error = caught.value
    assert (error.session_id, error.seq, error.expected) == ("sess-x", 4, 3)
    assert str(error) == "session sess-x: seq 4 leaves a gap (expected seq 3)"


def test_a_repeated_seq_raises_naming_session_and_seq() -> None:
    with pytest.raises(SeqError) as caught:
        decode_jsonl(encode_jsonl(numbered("sess-y", 1, 2, 3, 2)))
    assert str(caught.value) == "session sess-y: seq 2 repeats an earlier seq (expected seq 4)"
    with pytest.raises(SeqError, match="session sess-y: seq 1 repeats"):
        decode_jsonl(encode_jsonl(numbered("sess-y", 1, 1)))


def test_a_first_event_that_is_not_seq_1_raises() -> None:
    with pytest.raises(SeqError) as caught:
        decode_jsonl(encode_jsonl(numbered("late", 2, 3)))
    assert (caught.value.session_id, caught.value.seq, caught.value.expected) == ("late", 2, 1)


def test_sessions_interleave_in_one_file() -> None:
    a, b = session_log("a"), session_log("b")
    mixed = [a[0], b[0], b[1], a[1], a[2], b[2], b[3], a[3], a[4], a[5], b[4], b[5]]
    read = decode_jsonl(encode_jsonl(mixed))
    assert read.events == tuple(mixed)
    broken = [*mixed[:6], *mixed[7:]]
    with pytest.raises(SeqError, match=r"^session b: seq 5 leaves a gap"):
        decode_jsonl(encode_jsonl(broken))


def test_check_seq_false_accepts_any_numbering() -> None:
    envelopes = [*numbered("a", 3, 3, 1), *numbered("b", 9)]
    assert decode_jsonl(encode_jsonl(envelopes), check_seq=False).events == tuple(envelopes)


def test_check_sequence_can_start_mid_log() -> None:
    check_sequence(numbered("a", 5, 6, 7), from_start=False)
    with pytest.raises(SeqError, match="session a: seq 8 leaves a gap"):
        check_sequence(numbered("a", 5, 6, 8), from_start=False)
    with pytest.raises(SeqError, match="session a: seq 5"):
        check_sequence(numbered("a", 5, 6, 7))


def test_write_and_read_a_file(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    write_jsonl(path, LOG)
    assert path.read_bytes() == DATA
    assert read_jsonl(path) == JsonlRead(events=tuple(LOG))
    write_jsonl(str(path), LOG[:2])
    assert read_jsonl(str(path)).events == tuple(LOG[:2])


def test_read_a_file_with_a_torn_tail_and_unchecked_seqs(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(encode_jsonl(numbered("a", 2, 5)) + b'{"session_id":"a","se')
    with pytest.raises(SeqError):
        read_jsonl(path)
    read = read_jsonl(path, check_seq=False)
    assert [e.seq for e in read.events] == [2, 5]
    assert read.torn is not None
    assert read.torn.line == 3


@pytest.mark.parametrize("data", ["text", None, 5, [DATA]])
def test_input_that_is_not_bytes_raises_log_corrupt(data: Any) -> None:
    with pytest.raises(LogCorrupt, match=f"expected bytes, got {type(data).__name__}"):
        decode_jsonl(data)


def test_bytearray_and_memoryview_are_accepted() -> None:
    assert decode_jsonl(bytearray(DATA)).events == tuple(LOG)
    assert decode_jsonl(memoryview(DATA)).events == tuple(LOG)


def test_invalid_utf8_raises_log_corrupt_naming_the_line() -> None:
    bad = DATA.replace("ü".encode(), b"\xff\xfe", 1)
    assert bad != DATA
    with pytest.raises(LogCorrupt, match=r"^line 2: .*UTF-8"):
        decode_jsonl(bad)


def test_deeply_nested_json_is_log_corrupt_not_recursion_error() -> None:
    with pytest.raises(LogCorrupt, match=r"^line 1: "):
        decode_jsonl(b"[" * 100_000 + b"\n")
    deep = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    wire = json.loads(encode_envelope(LOG[2]))
    wire["seq"] = 1
    wire["event"]["response"] = {"deep": "PLACEHOLDER"}
    line = json.dumps(wire).encode().replace(b'"PLACEHOLDER"', deep)
    with pytest.raises(LogCorrupt, match=r"^line 1: "):
        decode_jsonl(line + b"\n")
    torn = decode_jsonl(b"[" * 100_000).torn
    assert torn is not None
    assert torn.line == 1


def _failed_line(at: bytes = b"0", seq: bytes = b"1") -> bytes:
    return (
        b'{"session_id":"s","seq":'
        + seq
        + b',"at":'
        + at
        + b',"event":{"type":"local.failed","error":"x"}}\n'
    )


def test_out_of_range_numbers_raise_log_errors() -> None:
    for at in (b"1e999", b"-1e999"):
        with pytest.raises(LogCorrupt, match=r"out of range - at `\$\.at`"):
            decode_jsonl(_failed_line(at=at))
    with pytest.raises(SeqError, match="seq 99999999999999999999999 leaves a gap"):
        decode_jsonl(_failed_line(seq=b"99999999999999999999999"))
    assert (
        decode_jsonl(_failed_line(at=b"123456789012345678901234567890")).events[0].at
        == 1.2345678901234568e29
    )


mutation = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, len(DATA)), st.just(0)),
    st.tuples(st.just("flip"), st.integers(0, len(DATA) - 1), st.integers(1, 255)),
    st.tuples(st.just("delete"), st.integers(0, len(DATA) - 1), st.integers(1, 40)),
    st.tuples(st.just("insert"), st.integers(0, len(DATA)), st.integers(0, 255)),
)


def mutate(data: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    for kind, position, value in mutations:
        position = min(position, len(data))
        if kind == "truncate":
            data = data[:position]
        elif kind == "flip" and position < len(data):
            data = data[:position] + bytes([data[position] ^ value]) + data[position + 1 :]
        elif kind == "delete":
            data = data[:position] + data[position + value :]
        elif kind == "insert":
            data = data[:position] + bytes([value]) + data[position:]
    return data


@settings(max_examples=500, deadline=None)
@given(st.lists(mutation, min_size=1, max_size=4), st.booleans())
def test_a_damaged_valid_log_raises_only_log_errors(
    mutations: list[tuple[str, int, int]], check_seq: bool
) -> None:
    try:
        read = decode_jsonl(mutate(DATA, mutations), check_seq=check_seq)
    except LogError:
        return
    for envelope in read.events:
        assert envelope.seq >= 1
        assert envelope.session_id


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(DATA)))
def test_a_log_cut_anywhere_reads_as_its_complete_lines(cut: int) -> None:
    read = decode_jsonl(DATA[:cut])
    kept = DATA[:cut].count(b"\n")
    # A cut just before a newline leaves a whole object, which is not torn.
    whole = cut < len(DATA) and DATA[cut : cut + 1] == b"\n"
    assert read.events == tuple(LOG[: kept + whole])
    if whole or cut == 0 or DATA[cut - 1 : cut] == b"\n":
        assert read.torn is None
    else:
        assert read.torn is not None
        assert read.torn.line == kept + 1


def line_by_line(data: bytes) -> JsonlRead | str:
    """What decode_jsonl's careful path makes of `data`: each line on its own."""
    lines = data.split(b"\n")
    complete = lines[-1] == b""
    if complete:
        lines.pop()
    try:
        return _decode_lines(lines, complete)
    except LogError as exc:
        return f"{type(exc).__name__}: {exc}"


@settings(max_examples=500, deadline=None)
@given(st.lists(mutation, max_size=3))
def test_decoding_a_whole_log_at_once_reads_as_line_by_line(
    mutations: list[tuple[str, int, int]],
) -> None:
    data = mutate(DATA + DATA.replace(b'"a"', b'"b"'), mutations)
    try:
        read: JsonlRead | str = decode_jsonl(data, check_seq=False)
    except LogError as exc:
        read = f"{type(exc).__name__}: {exc}"
    assert read == line_by_line(data)
