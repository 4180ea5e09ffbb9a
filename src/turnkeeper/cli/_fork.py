"""`turnkeeper fork`: write a fork of a logged session into the same log."""

from __future__ import annotations

import sys
import time

import msgspec

from turnkeeper.cli import _codes
from turnkeeper.cli._logs import append_session, load_log
from turnkeeper.core import InputError
from turnkeeper.sessions import fork_events


class ForkOptions(msgspec.Struct, frozen=True):
    log: str
    session: str
    at_seq: int
    new_id: str | None


async def fork_command(options: ForkOptions) -> int:
    """Append to the log a new session whose events begin as the session's first
    `at_seq`, then `local.forked`; print its id. A host on the log goes on with it."""
    loaded = await load_log(options.log)
    if loaded.warning is not None:
        print(f"turnkeeper: warning: {loaded.warning}", file=sys.stderr)
    origin, events = loaded.session(options.session, options.log)
    new_id = options.new_id
    if new_id is not None and (new_id in loaded.sessions or new_id in loaded.unreadable):
        raise InputError(f"--new-id: {options.log} holds a session {new_id} already")
    forked, state = fork_events(events, options.at_seq, new_id, at=time.time())
    await append_session(options.log, forked)
    print(state.session_id)
    print(
        f"forked session {origin} at seq {options.at_seq} as {state.session_id} "
        f"({state.status}); a host on {options.log} goes on with it",
        file=sys.stderr,
    )
    return _codes.OK
