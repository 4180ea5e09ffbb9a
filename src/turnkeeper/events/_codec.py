"""The envelope codec: one envelope as JSON, and many back from their JSON texts."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from turnkeeper.core import LogCorrupt
from turnkeeper.events._events import Envelope

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Envelope)
_array_decoder = msgspec.json.Decoder(list[Envelope])
_DATA = (bytes, bytearray, memoryview, str)
# What msgspec raises, besides DecodeError, on input it cannot turn into Python objects.
_DECODE_FAILURES = (msgspec.DecodeError, RecursionError, MemoryError, OverflowError, UnicodeError)


def encode_envelope(envelope: Envelope) -> bytes:
    """One envelope as a JSON object (no newline)."""
    return _encoder.encode(envelope)


def decode_envelope(data: bytes | str, *, line: int | None = None) -> Envelope:
    """One envelope from JSON; anything else raises LogCorrupt."""
    if not isinstance(data, _DATA):
        raise LogCorrupt(f"expected bytes or str, got {type(data).__name__}", line=line)
    try:
        return _decoder.decode(data)
    except _DECODE_FAILURES as exc:
        raise _not_envelopes(exc, line) from None


def decode_envelopes(parts: Sequence[bytes], *, encoded_here: bool = False) -> list[Envelope]:
    """Envelopes from JSON texts of one envelope each.

    A part that is not exactly one envelope (cut short, say, or two values) raises
    LogCorrupt, naming no part: decode the parts one by one to find it. Each part decodes
    alone, so no part can complete another, except parts `encoded_here` (by
    `encode_envelope`), whole by construction: they decode joined into one JSON array.
    """
    try:
        if encoded_here:
            return _array_decoder.decode(b"[" + b",".join(parts) + b"]")
        decode = _decoder.decode
        return [decode(part) for part in parts]
    except TypeError:
        raise LogCorrupt("expected bytes for every part") from None
    except _DECODE_FAILURES as exc:
        raise _not_envelopes(exc, None) from None


def _not_envelopes(exc: Exception, line: int | None) -> LogCorrupt:
    detail = exc if isinstance(exc, msgspec.DecodeError) else type(exc).__name__
    return LogCorrupt(f"not an event envelope: {detail}", line=line)
