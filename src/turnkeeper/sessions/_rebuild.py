"""Every session of a log rebuilt in one pass over it: a Host's recovery."""

from __future__ import annotations

from turnkeeper.events import Envelope, EventLog, LogError, SessionState, fold, replay

# Events read at a time: enough that a read's own costs are nothing beside decoding
# them, few enough that a page (about 300 bytes of JSON per event, a few times that
# decoded) stays within tens of megabytes.
_PAGE = 20_000

Rebuilt = tuple[SessionState, Envelope] | LogError
"""A session as its events left it, with its last event; or why they do not replay."""


async def rebuild_all(log: EventLog, *, page: int = _PAGE) -> dict[str, Rebuilt]:
    """Every session in `log`, rebuilt from its events read in order of position, `page`
    events at a time: a session's events in each page are folded on from the state the
    pages before left it in. A session whose events do not replay (a gap in its seqs,
    say) gets its error, and its later events are skipped. LogError if a page cannot be
    read (a damaged row).

    One pass over the log, where a read per session costs a worker-thread round trip
    and a query each.
    """
    rebuilt: dict[str, Rebuilt] = {}
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
        for session_id, events in runs.items():
            before = rebuilt.get(session_id)
            if isinstance(before, LogError):
                continue
            try:
                state = replay(events) if before is None else fold(before[0], events)
            except LogError as exc:
                rebuilt[session_id] = exc
            else:
                rebuilt[session_id] = (state, events[-1])
        if len(found) < page:
            return rebuilt
        after = found[-1][0]
