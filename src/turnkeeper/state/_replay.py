"""Rebuild a session's state from its log, with no model calls."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from turnkeeper.core import InputError, ReplayError, SeqError
from turnkeeper.events import Envelope, SessionOpened
from turnkeeper.state._state import SessionState, fold, initial_state


def replay(events: Iterable[Envelope]) -> SessionState:
    """Fold one session's log, from its `local.session_opened`, back into its state."""
    iterator = iter(events)
    first = next(iterator, None)
    if first is None:
        raise ReplayError("nothing to replay: the log holds no events")
    if not isinstance(first.event, SessionOpened):
        raise ReplayError(
            f"session {first.session_id}: seq {first.seq} is {first.type}; "
            "a session's log must start with local.session_opened"
        )
    if first.seq != 1:
        raise SeqError(first.session_id, first.seq, 1)
    try:
        state = initial_state(first.session_id, first.event)
    except InputError as exc:
        raise ReplayError(f"session {first.session_id}: seq 1: {exc}") from None
    return fold(msgspec.structs.replace(state, seq=1), iterator)
