"""The step timeout: a bound on each model call of a session, in `run()` and a Host."""

from __future__ import annotations

from collections.abc import Container
from contextvars import ContextVar
from typing import Any

import anyio

from turnkeeper.core import Chat, check_seconds, wraps_chat
from turnkeeper.providers import step_timeout_error, with_step_timeout

STEP_TIMEOUT = 300.0
"""Seconds a model call may take by default before it fails (None turns the bound off)."""


def check_step_timeout(name: str, seconds: float | None) -> None:
    """Raise InputError, naming `name`, unless `seconds` is None or a number > 0."""
    if seconds is not None:
        check_seconds(name, seconds, positive=True, optional=True)


def timed_chat(chat: Chat, seconds: float | None) -> Chat:
    """`chat` with each call failing after `seconds` (None: `chat` itself): a call that
    takes longer is cancelled and raises a transient ChatError saying so, which a session
    handles as any failed model call (logged as `local.chat_error`)."""
    return chat if seconds is None else with_step_timeout(chat, seconds)


WATCHED_CALL: ContextVar[object | None] = ContextVar("turnkeeper_watched_call", default=None)
"""The call a step watch bounds in this task (see `watched_chat`), while it is made."""


def watched_chat(chat: Chat, seconds: float, in_time: Container[object]) -> Chat:
    """`chat` for calls that a step watch (a Host's) cuts short by cancelling their task
    once `seconds` have passed: a call cancelled while it (`WATCHED_CALL`'s value in its
    task) is no longer `in_time` raises the timeout's ChatError instead, so that what
    wraps this (a trace's span) sees the call fail as `timed_chat`'s would. The task's
    scope stays cancelled: its next checkpoint raises the cancellation again."""

    async def watched(request: dict[str, Any]) -> dict[str, Any]:
        try:
            return await chat(request)
        except anyio.get_cancelled_exc_class():
            call = WATCHED_CALL.get()
            if call is None or call in in_time:
                raise
            raise step_timeout_error(seconds) from None

    return wraps_chat(watched, chat)
