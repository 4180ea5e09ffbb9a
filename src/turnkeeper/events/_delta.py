"""TokenDelta: a fragment of a model reply as it streams in, handed on and never logged."""

from __future__ import annotations

import msgspec


class TokenDelta(msgspec.Struct, frozen=True, gc=False, omit_defaults=True, tag="delta"):
    """A fragment of a model reply while the model writes it: an ephemeral event, never
    logged (it has no seq). The reply is logged whole, as `local.model_response`, once it
    is complete, exactly as it would be unstreamed; deltas only show it sooner.

    `after` is the seq of the session's last event logged before the model call: the
    reply is logged after it. `attempt` is 1 for the call's first try; a retry of the
    call (a stream cut mid-way is a transient ChatError like any other), or a backend
    taking back what it sent (a reply that turned out unreadable), starts attempt 2, and
    so on, whose deltas start the reply's text over: discard what came before. `index`
    counts the deltas of an attempt from 0; a gap means a subscriber too slow to keep up
    missed some (the logged reply is always whole). `text` is the fragment: of the
    reply's content, or, when `tool_call` is set, of that tool call's JSON arguments.
    `tool_call` is the call's position in the reply (0, 1, ...), and `name` its tool's
    name, on the call's first fragment. On the wire it is an object with `"type":
    "delta"` (unset fields left out).
    """

    session_id: str
    after: int
    attempt: int
    index: int
    text: str = ""
    tool_call: int | None = None
    name: str | None = None
