"""Waiting on a PostgreSQL log: tasks wait on topics, which a listening thread wakes."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any

import anyio
import msgspec
import psycopg
from psycopg import sql

# A topic: ("s", session id) for a session's events, ("c", item id) for an inbox item's
# outcome, ("i", None) for items for this worker's sessions.
Topic = tuple[str, Hashable]
_notice = msgspec.json.Decoder(dict[str, list[Any] | None])
_LAST_SEQS = "SELECT session_id, last_seq FROM turnkeeper_sessions WHERE session_id = ANY(%s)"
# How long the listening thread waits for a notification before it looks at whether it
# is closing (and whether a re-check is due).
_LISTEN_SLICE = 0.2


class _Waiter:
    """A task waiting on a topic: woken by setting its event (on the event loop)."""

    __slots__ = ("after", "event", "topic")

    def __init__(self, topic: Topic, after: int) -> None:
        self.topic = topic
        self.after = after
        self.event = anyio.Event()


class Waiters:
    """Tasks waiting on topics, for the listening thread to wake."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_topic: dict[Topic, set[_Waiter]] = {}

    async def wait(
        self, topic: Topic, after: int, check: Callable[[], Awaitable[bool]], timeout: float
    ) -> bool:
        """Return True once `check` does, checking again each time the topic is woken;
        False once `timeout` seconds have passed without."""
        if await check():
            return True
        if timeout == 0:
            return False
        waiter = _Waiter(topic, after)
        with self._lock:
            self._by_topic.setdefault(topic, set()).add(waiter)
        try:
            with anyio.move_on_after(timeout):
                while True:
                    # A fresh event before each check: a wake during the check is kept.
                    waiter.event = anyio.Event()
                    if await check():
                        return True
                    await waiter.event.wait()
            return False
        finally:
            with self._lock:
                waiting = self._by_topic[topic]
                waiting.discard(waiter)
                if not waiting:
                    del self._by_topic[topic]

    def waiting(self) -> bool:
        """In any thread: whether any task waits."""
        return bool(self._by_topic)

    def of(self, topics: Iterable[Topic]) -> list[_Waiter]:
        """In any thread: the waiters on `topics`."""
        with self._lock:
            return [w for topic in topics for w in self._by_topic.get(topic, ())]

    def of_kind(self, kind: str) -> list[_Waiter]:
        """In any thread: the waiters on every topic of `kind`."""
        with self._lock:
            return [w for topic, ws in self._by_topic.items() if topic[0] == kind for w in ws]

    @staticmethod
    def wake(waiters: list[_Waiter]) -> None:
        """On the event loop: wake each waiter (to check again)."""
        for waiter in waiters:
            waiter.event.set()


class Listener:
    """A thread that listens on the log's channel and wakes the waiters of what each
    notification names (a commit's sessions and consumed items, an inbox post); every
    `requery` seconds, and after connecting again, it looks at the database itself for
    every waiter, so a notification lost (a dropped connection, say) only delays a wake."""

    def __init__(
        self, url: str, where: str, channel: str, requery: float, waiters: Waiters
    ) -> None:
        self._url = url
        self._channel = channel
        self._requery = requery
        self._waiters = waiters
        self._token = anyio.lowlevel.current_token()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._listen, name=f"turnkeeper listener {where}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Tell the thread to stop (it sees it within a slice of its wait, or at the next
        notification)."""
        self._stop.set()

    async def close(self) -> None:
        """Stop listening, and wait for the thread to end."""
        self._stop.set()
        await anyio.to_thread.run_sync(self._thread.join)

    def _listen(self) -> None:
        connection: psycopg.Connection[Any] | None = None
        due = time.monotonic() + self._requery
        try:
            while not self._stop.is_set():
                try:
                    if connection is None:
                        connection = psycopg.connect(self._url, autocommit=True)
                        listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))
                        connection.execute(listen)
                        # Listening only now: whatever came before is looked for.
                        due = time.monotonic()
                    timeout = max(0.0, min(_LISTEN_SLICE, due - time.monotonic()))
                    notes = list(connection.notifies(timeout=timeout, stop_after=1))
                    if notes:
                        notes += connection.notifies(timeout=0)
                        # With nobody waiting, nobody to wake: a waiter checks for itself
                        # once it is registered, so what came before is not missed.
                        if self._waiters.waiting():
                            self._woken([note.payload for note in notes], connection)
                    if time.monotonic() >= due:
                        self._recheck(connection)
                        due = time.monotonic() + self._requery
                except psycopg.Error:
                    if connection is not None:
                        connection.close()
                        connection = None
                    self._stop.wait(min(1.0, self._requery))
        except anyio.RunFinishedError:
            # The event loop has gone: nobody waits any more.
            pass
        finally:
            if connection is not None:
                connection.close()

    def _woken(self, payloads: list[str], connection: psycopg.Connection[Any]) -> None:
        """Wake the waiters of what the notifications name; look at every session waited
        on if one names too much to list."""
        topics: set[Topic] = set()
        for payload in payloads:
            if payload == "*":
                self._recheck(connection)
                continue
            try:
                notice = _notice.decode(payload)
            except msgspec.DecodeError:
                continue
            topics.update(("s", session_id) for session_id in notice.get("s") or ())
            topics.update(("c", item) for item in notice.get("c") or ())
            if notice.get("i"):
                topics.add(("i", None))
        self._wake(self._waiters.of(topics))

    def _recheck(self, connection: psycopg.Connection[Any]) -> None:
        """Wake the waiters of sessions whose last seq has passed what they wait after, and
        every waiter of another kind (to look for itself)."""
        waiting = self._waiters.of_kind("s")
        woken = self._waiters.of_kind("c") + self._waiters.of_kind("i")
        if waiting:
            sessions = list({waiter.topic[1] for waiter in waiting})
            last = dict(connection.execute(_LAST_SEQS, (sessions,)).fetchall())
            woken += [w for w in waiting if last.get(w.topic[1], 0) > w.after]
        self._wake(woken)

    def _wake(self, waiters: list[_Waiter]) -> None:
        if waiters:
            token = self._token
            token.backend_class.run_sync_soon(Waiters.wake, (waiters,), token.native_token)
