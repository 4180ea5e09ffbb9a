"""The SQLite log's checkpointer: a thread that copies the WAL into the database file
beside the writer, so that commits do not wait for it."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from turnkeeper.core import LogError

# The writer's own automatic checkpoint, in WAL pages: a backstop, ten times SQLite's
# default (see `Checkpointer`).
WRITER_CHECKPOINT_PAGES = 10_000
# Seconds between two checkpoints while commits go on: each copies what the commits
# since the one before wrote, and syncs the database file once.
_PAUSE = 0.05


class Checkpointer:
    """Runs passive checkpoints in a thread of its own, once a commit has been noted and
    at most every `_PAUSE` seconds, on a connection it opens with `connect`. The thread
    starts at the first commit noted, and opens the connection for its first
    checkpoint: a log only read starts neither.

    SQLite checkpoints in the commit that takes the WAL past its threshold (1,000
    pages): that commit, and every append gathering for the next, waits for the copy
    and a sync of the database file. A Host's steady state fills 1,000 pages several
    times a second (an append touches a page of the session index per session), so
    that was most of its slow commits. A passive checkpoint on another connection
    copies beside the writer and holds up no commit.

    The WAL starts over only when a transaction begins with every frame copied, which
    a checkpoint running beside a busy writer seldom leaves. So the writer keeps its own
    automatic checkpoint, at `WRITER_CHECKPOINT_PAGES`: then the frames since the last
    passive checkpoint are all it copies, and the WAL starts over. Under sustained load
    the WAL file therefore grows to that many pages (about 40 MB), and SQLite keeps the
    file at that size to write over.

    A checkpoint that fails, or a connection that does not open, loses nothing (the
    frames stay in the WAL for the next), and a failing disk fails the writer's commits
    too, which report it: the error is dropped here.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], path: Path) -> None:
        self.checkpoints = 0
        self._connect = connect
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._due = False
        self._closing = False
        self._thread = threading.Thread(
            target=self._serve, name=f"turnkeeper SQLite checkpointer {path}", daemon=True
        )

    def note_commit(self) -> None:
        """In the writer thread: a transaction has committed."""
        with self._lock:
            # A thread's ident is set once `start` has returned, and not if it failed.
            if self._thread.ident is None and not self._closing:
                try:
                    self._thread.start()
                except RuntimeError:
                    # No thread to be had: the commit stands, and the writer's own
                    # checkpoint is the backstop until a later commit starts one.
                    return
            if not self._due:
                self._due = True
                self._work.notify()

    def close(self) -> None:
        """Stop the thread, which closes its connection (blocks until it has); in the
        thread that notes the commits."""
        with self._lock:
            self._closing = True
            self._work.notify()
        if self._thread.ident is not None:
            self._thread.join()

    def _serve(self) -> None:
        try:
            while self._next():
                try:
                    if self._connection is None:
                        self._connection = self._connect()
                    self._connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except (sqlite3.Error, LogError):
                    continue
                self.checkpoints += 1
        finally:
            if self._connection is not None:
                self._connection.close()

    def _next(self) -> bool:
        """Wait `_PAUSE` seconds, then for a commit; False once closing."""
        with self._work:
            self._work.wait_for(lambda: self._closing, timeout=_PAUSE)
            self._work.wait_for(lambda: self._due or self._closing)
            self._due = False
            return not self._closing
