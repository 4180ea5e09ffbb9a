"""fork_events: the log of a new session that begins as the first events of another's.

Pure: the caller gives the time of the `local.forked` event and appends what it returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from turnkeeper.core import InputError
from turnkeeper.events import Envelope, Forked, ToolMayHaveRun
from turnkeeper.sessions._driver import asking_approval
from turnkeeper.sessions._open import new_session_id
from turnkeeper.sessions._poll import emit
from turnkeeper.sessions._recheck import by_guards
from turnkeeper.state import SessionState, replay


def fork_events(
    events: Sequence[Envelope], at_seq: int, new_id: str | None = None, *, at: float
) -> tuple[list[Envelope], SessionState]:
    """The events of a fork of the session whose whole log is `events`: its first `at_seq`
    events, as they were logged, under the id `new_id` (a new one if None), then a
    `local.forked` naming the origin and `at_seq`; and the state they lead to.

    InputError, naming `at_seq`, when it is not a seq of the session, when it cuts a step
    short (the guard events logged with the step at `at_seq` follow it, or it is the mark
    of a call about to run again, logged with the call), or when the session is cancelled
    or failed there (a fork of it would take no messages). A fork at a reply whose calls
    want approval, before the reply's `local.approval_requested`, ends by asking for it."""
    if not events:
        raise InputError("fork: the origin session has no events")
    origin = events[0].session_id
    last = events[-1].seq
    if isinstance(at_seq, bool) or not isinstance(at_seq, int) or not 1 <= at_seq <= last:
        raise InputError(
            f"at_seq: expected an integer from 1 to {last} (the last seq of session {origin}), "
            f"got {at_seq!r:.80}"
        )
    if new_id is None:
        new_id = new_session_id()
    elif not isinstance(new_id, str) or not new_id.strip():
        raise InputError(f"new_id: expected a non-empty string, got {new_id!r:.80}")
    if new_id == origin:
        raise InputError(f"new_id: {new_id} is the origin session itself")
    if isinstance(events[at_seq - 1].event, ToolMayHaveRun):
        raise InputError(
            f"at_seq: seq {at_seq} of session {origin} marks a call about to run again, "
            f"logged with the call: fork at seq {at_seq - 1} or {at_seq + 1}"
        )
    if at_seq < len(events) and by_guards(events[at_seq].event):
        step = at_seq
        while step > 1 and by_guards(events[step - 1].event):
            step -= 1
        end = at_seq
        while end < len(events) and by_guards(events[end].event):
            end += 1
        raise InputError(
            f"at_seq: seq {at_seq} of session {origin} cuts short the step at seq {step}: "
            f"the guard events its step logged go on to seq {end}; fork at seq {step - 1} "
            f"(before the step) or {end} (after it)"
        )
    prefix = [msgspec.structs.replace(envelope, session_id=new_id) for envelope in events[:at_seq]]
    state = replay(prefix)
    if state.status in ("cancelled", "failed"):
        raise InputError(
            f"at_seq: session {origin} is {state.status} at seq {at_seq}, and a fork of it "
            "would take no messages; fork at an earlier seq"
        )
    forked, state = emit(state, Forked(origin=origin, at_seq=at_seq), at=at)
    # Forked between a reply and its `local.approval_requested`: the fork asks for the
    # approvals its calls want, as the reply's own step did, so none runs unapproved.
    return asking_approval([*prefix, forked], state)
