"""Compaction settings: when a session's older turns are summarised by the model.

Plain data, logged with the spec; what is summarised and when is decided in
`turnkeeper.sessions` (the driver estimates the history's tokens before each model call),
and each summary is logged as an event, so replay rebuilds the same history.
"""

from __future__ import annotations

import msgspec

from turnkeeper.core._checks import check_count
from turnkeeper.core._errors import InputError


class Compaction(msgspec.Struct, frozen=True):
    """Summarise older turns instead of cutting them off.

    Before a model call whose history (its messages, as the chat backend estimates their
    tokens) is past `budget_tokens`, the model is asked in a call of its own for a summary
    of the turns before the last `keep_recent_turns` (a turn: a user message, or an
    assistant message with the tool results answering it), in at most `summary_tokens`
    tokens; that one message takes their place in the history, the current request kept
    after it. The log keeps every message.

    `budget_tokens` None is half the backend's context window when the backend declares
    one (`EmbeddedChat` does), and no compaction when it does not (`OpenAIChat`). Older
    turns are summarised only when they hold more than twice `summary_tokens`, so that a
    summary always replaces more than itself.
    """

    budget_tokens: int | None = None
    keep_recent_turns: int = 4
    summary_tokens: int = 128


def check_compaction(compaction: object, where: str) -> None:
    """Raise InputError, naming the field as `<where>.<setting>`, unless `compaction` is a
    Compaction with every setting in range (`budget_tokens` None or 1 or more, the others 1
    or more)."""
    if not isinstance(compaction, Compaction):
        raise InputError(f"{where}: expected a Compaction or None, got {type(compaction).__name__}")
    if compaction.budget_tokens is not None:
        check_count(f"{where}.budget_tokens", compaction.budget_tokens, 1, optional=True)
    check_count(f"{where}.keep_recent_turns", compaction.keep_recent_turns, 1)
    check_count(f"{where}.summary_tokens", compaction.summary_tokens, 1)
