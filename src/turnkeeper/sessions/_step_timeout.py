"""The step timeout: a bound on each model call of a session, in `run()` and a Host."""

from __future__ import annotations

from turnkeeper.core import Chat, check_seconds
from turnkeeper.providers import with_step_timeout

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
