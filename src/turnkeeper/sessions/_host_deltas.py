"""The Host's streamed replies: subscribers to a session's deltas, and the sink that hands
each fragment of a model reply to them as it comes. Deltas are never logged."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from turnkeeper.events import TokenDelta
from turnkeeper.providers import DeltaSink
from turnkeeper.sessions._host_base import HostBase, _log
from turnkeeper.sessions._host_records import _Session
from turnkeeper.tools import handled_as_error

DELTA_BUFFER = 1024
"""Deltas a subscriber may fall behind by; past that it misses the newest (a gap in their
`index`) rather than hold up the model call."""


class HostDeltas(HostBase):
    """Subscribers to sessions' deltas (`deltas`, `watch_deltas`), and the sink of a call
    they watch."""

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
        send, receive = anyio.create_memory_object_stream[TokenDelta](DELTA_BUFFER)

        def deliver(delta: TokenDelta) -> None:
            # Behind (DELTA_BUFFER), gone or ended: this one is missed; the log has it all.
            with contextlib.suppress(
                anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError
            ):
                send.send_nowait(delta)

        self._delta_streams.add(send)
        try:
            with receive:
                async with self.watch_deltas(session_id, deliver):
                    yield receive
        finally:
            self._delta_streams.discard(send)
            send.close()

    @asynccontextmanager
    async def watch_deltas(
        self, session_id: str, on_delta: Callable[[TokenDelta], object]
    ) -> AsyncIterator[None]:
        """Call `on_delta` with each fragment of the session's model replies for the
        duration of the block, as `deltas` gives them, but at once, from the model call's
        task: it must not block (a callback that raises is logged and goes on being
        called). UnknownSession if the host has no such session."""
        async with self._use(session_id):
            pass
        watchers = self._delta_watchers.setdefault(session_id, [])
        watchers.append(on_delta)
        try:
            yield
        finally:
            watchers.remove(on_delta)
            if not watchers:
                del self._delta_watchers[session_id]

    def _delta_sink(self, session_id: str, after: int) -> DeltaSink | None:
        """A sink for the session's next model call if anyone watches it, else None."""
        if session_id not in self._delta_watchers:
            return None
        return DeltaSink(self._deliver, session_id, after)

    def _deliver(self, delta: TokenDelta) -> None:
        for on_delta in self._delta_watchers.get(delta.session_id, ()):
            try:
                on_delta(delta)
            except BaseException as exc:
                # A subscriber's failure is not the model call's.
                if not handled_as_error(exc):
                    raise
                _log.error("deltas.watcher_failed", session_id=delta.session_id, error=repr(exc))

    def _end_deltas(self) -> None:
        """End every `deltas` stream (the host stops)."""
        for send in self._delta_streams:
            send.close()
