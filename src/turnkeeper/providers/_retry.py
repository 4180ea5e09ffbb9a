"""Retrying a chat backend's transient failures: backoff, jitter, Retry-After, a deadline."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from turnkeeper.core import Chat, ChatError, InputError, wraps_chat
from turnkeeper.events import ChatRetried
from turnkeeper.providers._report import report_event
from turnkeeper.providers._stream import delta_sink


def with_retry(
    chat: Chat,
    *,
    max_retries: int = 3,
    base_delay: float = 1.0,
    max_delay: float = 30.0,
    deadline: float = 120.0,
    sleep: Callable[[float], Awaitable[Any]] = anyio.sleep,
    clock: Callable[[], float] = time.monotonic,
    jitter: Callable[[], float] = random.random,
) -> Chat:
    """`chat`, retrying a `ChatError` with `transient=True` up to `max_retries` times.

    Before retry n (1, 2, ...) it waits
    `min(max_delay, base_delay * 2 ** (n - 1)) * (0.5 + 0.5 * jitter())`,
    or the error's `retry_after` (the server's Retry-After) when that is longer, even
    beyond `max_delay`. `deadline` (seconds, read with `clock`) bounds the call and its
    retries: when the next wait would end past it, the last error is raised instead. It does
    not cut short an attempt in flight; the backend's own timeout does that.

    Each retry reports one `ChatRetried(attempt=n, delay, error, status)` through
    `report_event` before waiting. When the call is streamed, each retry begins a new
    attempt of its deltas (`DeltaSink.restart`), which start the reply over. A permanent
    ChatError, any other exception and cancellation propagate at once. `sleep`, `clock`
    and `jitter` (a number in [0, 1]) are there so tests can run without waiting.
    """
    _check_settings(max_retries, base_delay, max_delay, deadline)

    async def chat_with_retry(request: dict[str, Any]) -> dict[str, Any]:
        start = clock()
        backoff = min(max_delay, base_delay)
        attempt = 0
        while True:
            try:
                return await chat(request)
            except ChatError as error:
                if not error.transient or attempt == max_retries:
                    raise
                attempt += 1
                delay = backoff * (0.5 + 0.5 * _draw(jitter))
                if error.retry_after is not None:
                    delay = max(delay, error.retry_after)
                if clock() - start + delay > deadline:
                    raise
                report_event(
                    ChatRetried(
                        attempt=attempt, delay=delay, error=error.message, status=error.status
                    )
                )
                # Doubling step by step (rather than 2 ** n) cannot overflow for any max_retries.
                backoff = min(max_delay, backoff * 2)
            await sleep(delay)
            sink = delta_sink()
            if sink is not None:
                # What the failed attempt streamed is not the reply: the retry's starts over.
                sink.restart()

    return wraps_chat(chat_with_retry, chat)


def _check_settings(max_retries: int, base_delay: float, max_delay: float, deadline: float) -> None:
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise InputError(f"with_retry: max_retries must be an int >= 0, got {max_retries!r}")
    for name, value in (("base_delay", base_delay), ("max_delay", max_delay)):
        if not _is_number(value) or value < 0:
            raise InputError(f"with_retry: {name} must be a finite number >= 0, got {value!r}")
    if not _is_number(deadline) or deadline <= 0:
        raise InputError(f"with_retry: deadline must be a finite number > 0, got {deadline!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _draw(jitter: Callable[[], float]) -> float:
    value = jitter()
    if not 0.0 <= value <= 1.0:
        raise InputError(f"with_retry: jitter() must return a number in [0, 1], got {value!r}")
    return value
