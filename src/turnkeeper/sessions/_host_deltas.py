"""The Host's streamed replies: subscribers to a session's deltas, and the sink that hands
each fragment of a model reply to them as it comes. Deltas are never logged."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from turnkeeper.events import TokenDelta
from turnkeeper.providers import DeltaSink
from turnkeeper.sessions._host_base import HostBase
from turnkeeper.sessions._host_records import _Session

DELTA_BUFFER = 1024
"""Deltas a subscriber may fall behind by; past that it misses the newest (a gap in their
`index`) rather than hold up the model call."""


class HostDeltas(HostBase):
    """Subscribers to sessions' deltas (`deltas`), and the sink of a call they watch."""

    if TYPE_CHECKING:

        def _use(self, session_id: str) -> AbstractAsyncContextManager[_Session]: ...

    @asynccontextmanager
    async def deltas(self, session_id: str) -> AsyncIterator[MemoryObjectReceiveStream[TokenDelta]]:
        """The fragments of the session's model replies as they stream in, each a
        `TokenDelta`, for the duration of the block:

            async with host.deltas(session_id) as deltas:
                async for delta in deltas:
                    print(delta.text, end="")

        While any block is open on the session, each of its model calls that starts is
        streamed (a call already in flight is not); otherwise calls are made unstreamed.
        Deltas are not logged: the whole reply still is, as `local.model_response`, which
        `events` gives. A subscriber more than 1024 deltas behind misses the newest (a gap
        in `index`). The stream ends when the host stops. UnknownSession if the host has
        no such session.
        """
        async with self._use(session_id):
            pass
        send, receive = anyio.create_memory_object_stream[TokenDelta](DELTA_BUFFER)
        watchers = self._watchers.setdefault(session_id, [])
        watchers.append(send)
        try:
            with receive:
                yield receive
        finally:
            watchers.remove(send)
            if not watchers:
                del self._watchers[session_id]
            send.close()

    def _delta_sink(self, session_id: str, after: int) -> DeltaSink | None:
        """A sink for the session's next model call if anyone watches it, else None."""
        if session_id not in self._watchers:
            return None
        return DeltaSink(self._deliver, session_id, after)

    def _deliver(self, delta: TokenDelta) -> None:
        for send in self._watchers.get(delta.session_id, ()):
            # Behind (DELTA_BUFFER), gone or ended: this one is missed; the log has it all.
            with contextlib.suppress(
                anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError
            ):
                send.send_nowait(delta)

    def _end_deltas(self) -> None:
        """End every subscriber's stream (the host stops)."""
        for watchers in self._watchers.values():
            for send in watchers:
                send.close()
