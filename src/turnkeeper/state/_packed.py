"""A session state packed small: the parts that grow with the session (its history, the calls
and texts it has seen) kept as one msgpack blob, for a session at rest.

A message in memory is a tree of dicts, lists and strings, about 500 bytes for a tool call;
as msgpack it is about 70. A Host holds thousands of sessions at rest and reads few of them
again, so it keeps each packed until it is used (see `_Session` in `sessions/`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from turnkeeper.state._state import _NONE, SessionState

_Parts = tuple[tuple[dict[str, Any], ...], frozenset[str], frozenset[str]]
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Parts)
# What msgspec raises on a value msgpack cannot hold (an int past 64 bits, a lone
# surrogate, an object of another type) or on a tree nested past the stack.
_UNPACKABLE = (
    msgspec.EncodeError,
    msgspec.DecodeError,
    TypeError,
    ValueError,
    OverflowError,
    RecursionError,
)


class PackedState(msgspec.Struct, frozen=True, gc=False):
    """A state with its history, `seen` and `texts` emptied (`rest`), and those three as
    msgpack (`parts`). `unpack_state` gives the state back, equal to the one packed."""

    rest: SessionState
    parts: bytes


def pack_state(state: SessionState) -> PackedState | None:
    """`state` packed, or None if its parts would not come back equal: a value msgpack
    holds as another one (a tuple comes back a list) or not at all (a NaN is unequal to
    itself; an int past 64 bits does not encode). A live state never holds one, since a
    session keeps what it logs in its JSON form, but a packed state must be exact."""
    parts = (state.history, state.seen, state.texts)
    try:
        packed = _encoder.encode(parts)
        exact = _decoder.decode(packed) == parts
    except _UNPACKABLE:
        return None
    if not exact:
        return None
    rest = msgspec.structs.replace(state, history=(), seen=_NONE, texts=_NONE)
    return PackedState(rest, packed)


def unpack_state(packed: PackedState) -> SessionState:
    """The state `packed` holds."""
    history, seen, texts = _decoder.decode(packed.parts)
    return msgspec.structs.replace(
        packed.rest,
        history=history,
        seen=seen or _NONE,
        texts=texts or _NONE,
    )
