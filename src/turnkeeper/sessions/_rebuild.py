"""Sessions rebuilt from one pass over a log, page by page: a Host's recovery."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from turnkeeper.core import LogError
from turnkeeper.events import Envelope
from turnkeeper.logs import EventLog
from turnkeeper.state import SessionState, fold, replay

# Events read at a time: enough that a read's own costs are nothing beside decoding
# them, few enough that a page (about 300 bytes of JSON per event, a few times that
# decoded) stays within tens of megabytes.
_PAGE = 20_000

Rebuilt = tuple[SessionState, Envelope] | LogError
"""A session as its events left it, with its last event; or why they do not replay."""


async def runs_by_page(
    log: EventLog, *, page: int = _PAGE
) -> AsyncIterator[dict[str, list[Envelope]]]:
    """Every event in `log`, in order of position, `page` at a time: each page as the run
    of events it holds of each session, in order of each session's last event in it.
    LogError if a page cannot be read (a damaged row).

    One pass over the log, where a read per session costs a worker-thread round trip
    and a query each.
    """
    after = 0
    while True:
        found = await log.read_all(after=after, limit=page)
        runs: dict[str, list[Envelope]] = {}
        for _, envelope in found:
            run = runs.get(envelope.session_id)
            if run is None:
                runs[envelope.session_id] = [envelope]
            else:
                run.append(envelope)
        # Ordered by last event: the order in which the sessions were last used.
        last_first = dict.fromkeys(envelope.session_id for _, envelope in reversed(found))
        yield {session_id: runs[session_id] for session_id in reversed(last_first)}
        if len(found) < page:
            return
        after = found[-1][0]


def rebuilt_on(state: SessionState | None, events: Sequence[Envelope]) -> Rebuilt:
    """The session `events` (the next run of its events) leave it in, folded on from
    `state` (None: the run is the start of the session); or why they do not replay (a
    gap in its seqs, say)."""
    try:
        return (replay(events) if state is None else fold(state, events)), events[-1]
    except LogError as exc:
        return exc
