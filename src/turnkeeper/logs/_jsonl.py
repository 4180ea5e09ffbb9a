"""JSON Lines: one envelope per line, for export, import and the JSONL log."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import msgspec

from turnkeeper.core import LogCorrupt, SeqError
from turnkeeper.events import Envelope, decode_envelope, decode_envelopes, encode_envelope


class TornTail(msgspec.Struct, frozen=True):
    """An unfinished last line (a write cut short), skipped when the log was read."""

    line: int
    data: bytes
    error: str


class JsonlRead(msgspec.Struct, frozen=True):
    """What a JSON Lines log held: its events, and the torn last line if there was one."""

    events: tuple[Envelope, ...]
    torn: TornTail | None = None


def encode_jsonl(events: Iterable[Envelope]) -> bytes:
    """Envelopes as JSON Lines, each line ending in a newline."""
    return b"".join(encode_envelope(envelope) + b"\n" for envelope in events)


def check_sequence(events: Iterable[Envelope], *, from_start: bool = True) -> None:
    """Raise SeqError unless each session's seqs run 1, 2, 3... (or on from their first)."""
    last: dict[str, int] = {}
    for envelope in events:
        previous = last.get(envelope.session_id)
        if previous is None:
            if from_start and envelope.seq != 1:
                raise SeqError(envelope.session_id, envelope.seq, 1)
        elif envelope.seq != previous + 1:
            raise SeqError(envelope.session_id, envelope.seq, previous + 1)
        last[envelope.session_id] = envelope.seq


def decode_jsonl(data: bytes | bytearray | memoryview, *, check_seq: bool = True) -> JsonlRead:
    """Envelopes from JSON Lines.

    A last line without its newline that does not decode is a torn write: it is
    reported in `torn` and skipped. Any other bad line raises LogCorrupt naming it;
    with `check_seq`, a gap or repeat in a session's seqs raises SeqError.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise LogCorrupt(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    # Lines, each but an unfinished last one with its newline (white space to a decoder):
    # a BytesIO finds them with memchr, three times as fast as bytes.split's byte loop.
    lines = io.BytesIO(data).readlines()
    complete = data.endswith(b"\n") or not data
    try:
        # Every line an envelope, as in a log this package wrote: one pass, no line numbers.
        events = decode_envelopes(lines)
    except LogCorrupt:
        read = _decode_lines(lines, complete)
    else:
        read = JsonlRead(events=tuple(events))
    if check_seq:
        check_sequence(read.events)
    return read


def _decode_lines(lines: list[bytes], complete: bool) -> JsonlRead:
    """Envelopes from lines (each with or without its newline) that are not all
    envelopes: blank lines are skipped, a bad line raises LogCorrupt naming it, unless it
    is the torn last line (see decode_jsonl)."""
    events: list[Envelope] = []
    torn: TornTail | None = None
    for index, line in enumerate(lines):
        number = index + 1
        # Decoded without its newline, an unfinished value reads as cut short.
        raw = line.removesuffix(b"\n")
        if not raw.strip():
            continue
        try:
            events.append(decode_envelope(raw, line=number))
        except LogCorrupt as exc:
            if complete or index != len(lines) - 1:
                raise
            torn = TornTail(line=number, data=raw[:200], error=str(exc))
    return JsonlRead(events=tuple(events), torn=torn)


def write_jsonl(path: str | Path, events: Iterable[Envelope]) -> None:
    """Write envelopes to `path` as JSON Lines, replacing what was there."""
    Path(path).write_bytes(encode_jsonl(events))


def read_jsonl(path: str | Path, *, check_seq: bool = True) -> JsonlRead:
    """Read a JSON Lines log from `path` (see decode_jsonl)."""
    return decode_jsonl(Path(path).read_bytes(), check_seq=check_seq)
