"""The chat backend type, and how an HTTP failure becomes a transient or permanent ChatError."""

from __future__ import annotations

import email.utils
import re
from datetime import UTC

from turnkeeper.core import ChatError

_DELTA_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def error_for_status(status: int, detail: str, *, retry_after: float | None = None) -> ChatError:
    """The ChatError for an HTTP error `status`: transient for 408, 429 and 5xx, else permanent.

    `detail` (the body's error message, say) goes into the message; `retry_after` is the
    server's Retry-After in seconds, which `with_retry` waits at least.
    """
    transient = status in (408, 429) or status >= 500
    message = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
    return ChatError(message, transient=transient, status=status, retry_after=retry_after)


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """Seconds to wait from a Retry-After header value, or None when absent or unreadable.

    The value is either delta-seconds (`"120"`; fractions are tolerated) or an HTTP-date,
    read relative to `now` (Unix time in seconds); a date in the past means 0.
    """
    if value is None:
        return None
    text = value.strip()
    if _DELTA_SECONDS.fullmatch(text):
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
        if when.tzinfo is None:
            # An HTTP-date is always GMT; parsedate gives a naive datetime for "-0000".
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return max(0.0, seconds)
