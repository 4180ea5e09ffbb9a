"""How much one request to the service may carry or ask for."""

from __future__ import annotations

import math

import msgspec

from turnkeeper.core import InputError


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Bounds on requests. A request over a bound is refused with a 4xx naming the field,
    before anything is read further or changed."""

    max_body_bytes: int = 1_048_576
    """A request body, in bytes (checked on Content-Length and while reading)."""
    max_text_chars: int = 100_000
    """A prompt or a user message, in characters."""
    max_tool_result_chars: int = 100_000
    """One tool result's text, in characters."""
    max_history_messages: int = 1_000
    """The messages of a prior transcript a session is opened from."""
    max_wait_seconds: float = 60.0
    """The longest a long-poll waits; a longer `wait` is cut to this."""
    max_page: int = 1_000
    """The most sessions or events one page holds."""
    body_timeout_seconds: float = 60.0
    """How long a request body may take to arrive in full once the service reads it; a
    client that is slower (or sends part of it and stalls) gets a 408 and is disconnected."""
    header_timeout_seconds: float = 10.0
    """How long a connection may take to send a request's line and headers, counted from
    when it opened or its previous response ended: one that is slower (a request sent a
    byte at a time, or half sent and left) is closed, and so is one idle that long between
    requests. It never cuts a request once its headers are in: long-polls and event
    streams stay open. (`serve` sets it; hypercorn's keep-alive timeout is this bound.)"""

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_text_chars", "max_tool_result_chars", "max_page"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"Limits.{name}: expected an integer >= 1, got {value!r}")
        history = self.max_history_messages
        if isinstance(history, bool) or not isinstance(history, int) or history < 0:
            raise InputError(
                f"Limits.max_history_messages: expected an integer >= 0, got {history!r}"
            )
        wait = self.max_wait_seconds
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
            raise InputError(f"Limits.max_wait_seconds: expected a number, got {wait!r}")
        if wait < 0:
            raise InputError(f"Limits.max_wait_seconds: expected >= 0, got {wait!r}")
        for name in ("body_timeout_seconds", "header_timeout_seconds"):
            seconds = getattr(self, name)
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, int | float)
                or not (math.isfinite(seconds) and seconds > 0)
            ):
                raise InputError(
                    f"Limits.{name}: expected a number of seconds > 0, got {seconds!r}"
                )


DEFAULT_LIMITS = Limits()
