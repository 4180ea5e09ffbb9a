"""What a log shared by many workers adds to EventLog: owners, fencing, an inbox, waiting."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from turnkeeper.core import LogError
from turnkeeper.events import Envelope
from turnkeeper.logs._log import EventLog


class FenceLost(LogError):
    """A write to a session this worker does not own: another worker claimed it (its epoch
    moved past the one this worker holds), or it was never this worker's and has a live
    owner. Nothing of the write reached the log; the session's task must stop here."""

    def __init__(self, session_id: str, *, held: int | None, owner: str | None, epoch: int) -> None:
        mine = f"at epoch {held}" if held else "without a claim"
        theirs = f"worker {owner}" if owner is not None else "no worker"
        super().__init__(
            f"session {session_id}: this worker wrote {mine}, but {theirs} owns it "
            f"(epoch {epoch}): nothing was written"
        )
        self.session_id = session_id
        self.held = held
        self.owner = owner
        self.epoch = epoch


class Claim(msgspec.Struct, frozen=True):
    """A session this worker now owns: the epoch its writes are fenced by, its last seq
    when claimed, and the worker it was taken from (None if it had no owner, or this
    worker already held it)."""

    session_id: str
    epoch: int
    last_seq: int
    taken_from: str | None = None


class InboxItem(msgspec.Struct, frozen=True):
    """A request for a session, posted by any worker for the session's owner to consume:
    its kind ("create", "message", "tool_results", "cancel": the poster's and the owner's
    words, which the log does not interpret), its JSON payload, the client's request id,
    and when it was posted (on the database's clock, Unix seconds)."""

    id: int
    session_id: str
    kind: str
    payload: Any
    request_id: str | None
    posted_at: float


class Posted(msgspec.Struct, frozen=True):
    """What `post` did: the item in the inbox, and whether an earlier post with the same
    request id had put it there (then nothing new was posted)."""

    item: InboxItem
    duplicate: bool


class Consumed(msgspec.Struct, frozen=True):
    """An inbox item the owner has consumed: the epoch it consumed it under, and the
    outcome it gave (None for success, else the reason it refused the request)."""

    item_id: int
    epoch: int
    outcome: str | None


class SharedLog(EventLog):
    """An event log that many workers share, each one `SharedLog` opened on the same
    database (`PostgresLog`). A capability the single-process stores (MemoryLog, JsonlLog,
    SqliteLog) do not have: code that can run on either checks `isinstance(log, SharedLog)`.

    Ownership. Each open log is a worker, named `worker_id`, with a lease kept alive by a
    heartbeat on the database's clock. Each session has at most one owner and an epoch
    that every change of owner increases. A log holds the sessions it has claimed, each at
    an epoch (`epoch`), and every append is fenced in its own transaction: it writes only
    if the session's epoch is still the one held, and its rows carry that epoch. Else it
    raises FenceLost, writes nothing, and the log holds the session as lost: every later
    write of it raises FenceLost too until it is claimed again (`claim_session`), so a
    session's task on a worker that lost it cannot write once more. An append of a session
    the log has never held (a new session, or one with no live owner) claims it in the
    same transaction; of one that another live worker owns, raises FenceLost.

    Claims. `claim` is the takeover scan: sessions whose owner's lease has expired, and
    sessions with no owner that have work waiting (released while active, or with inbox
    items), each claimed with its epoch bumped, skipping rows another worker is claiming
    (`FOR UPDATE SKIP LOCKED`). Call it about every second, with jitter. `claim_session`
    claims one session on demand. `release` gives sessions up; `close` releases the rest.

    Inbox. A request for a session another live worker owns is `post`ed to the inbox,
    idempotent on the client's request id; its owner reads `inbox` and consumes each item
    exactly once with `consume`, fenced like an append and in one transaction with the
    events that record what it did. `outcome` tells the poster what came of it.

    Waiting. Each commit wakes waiters on every worker (one notification per commit, not
    per event); a waiter also re-checks the database periodically, so a lost notification
    delays a wake but never loses it. `wait_for_events` waits for a session's next event,
    `wait_for_inbox` for items for this worker's sessions.
    """

    @property
    @abstractmethod
    def worker_id(self) -> str:
        """This worker's name (several workers may share one: each open log is its own)."""

    @property
    @abstractmethod
    def lease(self) -> float:
        """Seconds a worker's claims outlive its last heartbeat."""

    @property
    @abstractmethod
    def lease_held(self) -> bool:
        """Whether this worker's lease is known to be live for a while yet: False once
        heartbeats have failed for long enough that other workers may soon take its
        sessions, and, after that, until a heartbeat has renewed the lease and the log has
        let go of the sessions other workers claimed meanwhile (each then held as lost:
        `epoch` is None). A worker that sees False starts no model call and no tool, and
        trusts nothing it keeps of its sessions (appends stay fenced either way)."""

    @property
    @abstractmethod
    def takeovers(self) -> int:
        """Sessions this log has claimed from a worker whose lease had expired."""

    @property
    @abstractmethod
    def fence_losses(self) -> int:
        """Writes this log refused with FenceLost."""

    @abstractmethod
    def epoch(self, session_id: str) -> int | None:
        """The epoch this log holds the session at; None if it does not hold it."""

    @abstractmethod
    def held(self) -> dict[str, int]:
        """Every session this log holds, with its epoch."""

    @abstractmethod
    async def claim(self, *, limit: int = 100) -> list[Claim]:
        """Claim at most `limit` sessions that need an owner and have no live one (see the
        class); the claims made."""

    @abstractmethod
    async def claim_session(self, session_id: str) -> Claim | None:
        """Claim the session if it has no live owner (or return the claim this log holds);
        None if another live worker owns it (post to the inbox instead). A session with no
        events yet is claimed too: its first append then writes under this claim."""

    @abstractmethod
    async def release(
        self, session_ids: Iterable[str] | None = None, *, active: bool = False
    ) -> list[str]:
        """Give up the sessions (every held session if None); the ones released. `active`
        says whether a session still has work to do: the takeover scan claims an active
        session (or one with inbox items) at once, and leaves one at rest for whichever
        worker next gets a request for it."""

    @abstractmethod
    async def post(
        self, session_id: str, kind: str, payload: Any, *, request_id: str | None = None
    ) -> Posted:
        """Put a request for the session in the inbox and wake its owner. A second post
        with the same request id posts nothing and returns the first's item; one with a
        different kind or payload raises InputError."""

    @abstractmethod
    async def inbox(self, session_id: str | None = None) -> list[InboxItem]:
        """Items not consumed yet, oldest first: the session's, or if None those of every
        session this log holds."""

    @abstractmethod
    async def consume(
        self,
        item: InboxItem,
        events: Sequence[Envelope] = (),
        *,
        expected_seq: int,
        outcome: str | None = None,
    ) -> None:
        """Mark the item consumed and append `events` (its record; may be none), in one
        fenced transaction: both or neither. Raises as `append` does (FenceLost,
        SeqConflict: the session's last seq must be `expected_seq` even with no events),
        and LogError if the item is consumed already or is not the session's."""

    @abstractmethod
    async def outcome(self, item_id: int, *, wait: float = 0.0) -> Consumed | None:
        """What came of an inbox item once consumed; None if it is not consumed after
        waiting up to `wait` seconds. LogError if there is no such item."""

    @abstractmethod
    async def wait_for_events(self, session_id: str, *, after: int, timeout: float) -> bool:
        """Return True once the session has an event past seq `after` (at once if it has),
        False if none came within `timeout` seconds."""

    @abstractmethod
    async def wait_for_inbox(self, timeout: float) -> bool:
        """Return True once items may be waiting for a session this log holds, False
        after `timeout` seconds without."""
