"""The errors turnkeeper raises. Everything it raises on bad input derives from TurnkeeperError."""

from __future__ import annotations

import math
from typing import Any

from turnkeeper.core._text import loggable


class TurnkeeperError(Exception):
    """Base class of every error turnkeeper raises on purpose. Its text escapes lone
    surrogates (`\\udcff`), so it can always be printed or logged."""

    def __str__(self) -> str:
        # Session ids, paths and inputs named in a message may hold lone surrogates (a
        # name decoded with surrogateescape, say), which no UTF-8 stream can carry.
        text = super().__str__()
        return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode()


class InputError(TurnkeeperError, ValueError):
    """An input to a session (a message, tool results, a transcript, a spec) is invalid."""


class ChatError(TurnkeeperError):
    """A chat backend failed. `transient` says whether the same request may succeed later.

    When raised out of `poll_turn`, `events` holds what the failed poll should log
    (retries and a `local.chat_error`), numbered after the state's last seq.

    What it carries is logged, so it is kept loggable whatever a backend passes: the
    message as text with each lone surrogate (from a name decoded with surrogateescape,
    say) made "?", a status only if it is an int, a retry_after only if it is a finite
    number of seconds.
    """

    def __init__(
        self,
        message: str,
        *,
        transient: bool,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        text = loggable(message if isinstance(message, str) else str(message))
        super().__init__(text)
        self.message = text
        self.transient = bool(transient)
        self.status = status if type(status) is int else None
        finite = (
            isinstance(retry_after, int | float)
            and not isinstance(retry_after, bool)
            and math.isfinite(retry_after)
        )
        self.retry_after = float(retry_after) if finite and retry_after is not None else None
        # Envelopes (turnkeeper.events), which core, the ground floor, does not import.
        self.events: tuple[Any, ...] = ()

    def __repr__(self) -> str:
        return f"ChatError({self.message!r}, transient={self.transient!r}, status={self.status!r})"


class LogError(TurnkeeperError):
    """An event log cannot be read or written as asked."""


class UnloggableEvent(LogError, InputError):
    """An event cannot be logged as it is: it does not encode (a lone surrogate in a
    text, say) or would not read back as itself (a NaN time, a field of the wrong type).
    Bad input, not a failing log: the log holds nothing of the append."""


class LogCorrupt(LogError):
    """Bytes in a log are not a valid event envelope."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        where = f"line {line}: " if line is not None else ""
        super().__init__(f"{where}{message}")
        self.line = line


class SeqError(LogError):
    """A session's events are not numbered 1, 2, 3... without gaps or repeats."""

    def __init__(self, session_id: str, seq: int, expected: int) -> None:
        what = "repeats an earlier seq" if seq < expected else "leaves a gap"
        super().__init__(f"session {session_id}: seq {seq} {what} (expected seq {expected})")
        self.session_id = session_id
        self.seq = seq
        self.expected = expected


class ReplayError(LogError):
    """A sequence of events does not describe one valid session."""
