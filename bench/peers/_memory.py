"""Memory per live session: one framework, many concurrent sessions parked in a tool call.

run.py runs this in a fresh process for each measurement, so no framework measured
earlier leaves freed memory behind for a later one to reuse:

    python bench/peers/_memory.py FRAMEWORK SESSIONS ROUND_TRIPS

Each session parks inside its tool call halfway through its round trips, and once all
of them are parked the process reads its resident memory (RSS, from /proc/self/statm)
after a garbage collection, and compares it with the same reading just before the
sessions started. Then the sessions are released, finish, and are checked. A first,
smaller batch warms the framework up (lazy imports, caches) outside the measurement.
Prints one JSON object: {"rss_bytes": resident bytes per parked session}.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys

from _frameworks import load
from _task import (
    CURRENT,
    Adapter,
    Ended,
    Parking,
    Session,
    WrongWork,
    check_session,
    prompt,
)

MAX_TURNS = 50
WARM_UP_SESSIONS = 20


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        resident_pages = int(statm.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


async def _one(adapter: Adapter, session: Session, parking: Parking) -> Ended:
    CURRENT.set(session)
    try:
        return await adapter.session(prompt(session.round_trips), MAX_TURNS)
    except BaseException as error:
        parking.fail(error)
        raise


async def parked_bytes(adapter: Adapter, sessions: int, round_trips: int) -> float:
    """Resident bytes per session while `sessions` sessions are parked mid-run."""
    parking = Parking(sessions)
    states = [
        Session(round_trips, parking=parking, park_at=round_trips // 2) for _ in range(sessions)
    ]
    gc.collect()
    before = rss_bytes()
    tasks = [asyncio.create_task(_one(adapter, state, parking)) for state in states]
    await parking.all_parked.wait()
    if parking.failure is not None:
        parking.release()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise WrongWork(f"{adapter.name}: a session failed before parking: {parking.failure!r}")
    gc.collect()
    during = rss_bytes()
    parking.release()
    ends = await asyncio.gather(*tasks, return_exceptions=True)
    for state, end in zip(states, ends, strict=True):
        if isinstance(end, BaseException):
            raise WrongWork(f"{adapter.name}: a session failed: {end!r}") from end
        check_session(adapter.name, state, end)
    return (during - before) / sessions


async def measure(name: str, sessions: int, round_trips: int) -> dict[str, float]:
    """Warm framework `name` up, then measure `sessions` parked sessions."""
    adapter = load(name)
    await parked_bytes(adapter, WARM_UP_SESSIONS, round_trips)
    return {"rss_bytes": await parked_bytes(adapter, sessions, round_trips)}


def main() -> None:
    name, sessions, round_trips = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(asyncio.run(measure(name, sessions, round_trips))))


if __name__ == "__main__":
    main()
