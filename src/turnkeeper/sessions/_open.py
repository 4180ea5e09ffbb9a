"""Open a session: a fresh one from a spec, or one reattached to a prior transcript."""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Sequence
from typing import Any

import msgspec

from turnkeeper.core import (
    AgentSpec,
    GuardConfig,
    InputError,
    check_guards,
    check_spec,
    encodes,
    with_output_schema,
)
from turnkeeper.events import SessionOpened
from turnkeeper.state import SessionState, initial_state

_encoder = msgspec.json.Encoder()
_opened = msgspec.json.Decoder(SessionOpened)


_ID_BYTES = 8
# Random bytes for the ids to come, read 512 ids at a time: a read of the system's
# randomness is a system call, and the event loop's thread lets the GIL go for it, to
# a writer thread that may keep it for a switch interval.
_ids_ahead: list[str] = []
_ids_lock = threading.Lock()
# A forked child reads its own: the parent's ids ahead are the parent's to give.
os.register_at_fork(after_in_child=_ids_ahead.clear)


def check_guards_of(spec: AgentSpec, config: GuardConfig) -> None:
    """InputError if `config` asks of `spec` what it cannot give: a terminal tool required
    of a spec that names none."""
    if config.terminal is not None and config.terminal.required and spec.terminal_tool is None:
        raise InputError("guards.terminal.required: the spec names no terminal_tool")


def new_session_id() -> str:
    """A fresh session id: `local_` and 16 hex characters, from the system's randomness."""
    with _ids_lock:
        if not _ids_ahead:
            block = secrets.token_bytes(_ID_BYTES * 512)
            _ids_ahead.extend(
                block[start : start + _ID_BYTES].hex() for start in range(0, len(block), _ID_BYTES)
            )
        return "local_" + _ids_ahead.pop()


_DEFAULT_GUARDS = GuardConfig()
"""The guards of a session opened without any: valid as they are, checked once here."""
check_guards(_DEFAULT_GUARDS)


def open_session(
    spec: AgentSpec,
    *,
    session_id: str | None = None,
    history: Sequence[dict[str, Any]] | None = None,
    max_turns: int = 50,
    guards: GuardConfig | None = None,
) -> SessionState:
    """A session's initial state (seq 0; its first poll logs `local.session_opened`).

    With a non-empty `history` (a prior transcript, which already holds its system
    message) the session resumes it verbatim; otherwise it starts from the spec's
    system prompt. The spec and guards are checked as new input (`check_spec`,
    `check_guards`); a session read back from a log is not. A spec's output type is
    logged as its JSON Schema (`with_output_schema`).
    """
    if not isinstance(spec, AgentSpec):
        raise InputError(f"spec: expected an AgentSpec, got {type(spec).__name__}")
    spec = with_output_schema(spec)
    check_spec(spec)
    if session_id is not None and (not isinstance(session_id, str) or not session_id.strip()):
        raise InputError(f"session_id: expected a non-empty string, got {session_id!r}")
    if session_id is not None and not encodes(session_id):
        raise InputError(f"session_id: {session_id!r} holds a lone surrogate, which no log holds")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise InputError(f"max_turns: expected a positive integer, got {max_turns!r}")
    if guards is None:
        config = _DEFAULT_GUARDS
    else:
        check_guards(guards)
        config = guards
    check_guards_of(spec, config)
    transcript = _transcript(history)
    resume = bool(transcript)
    if not resume:
        transcript = (
            ({"role": "system", "content": spec.system_prompt},) if spec.system_prompt else ()
        )
    opened = SessionOpened(
        spec=spec, history=transcript, max_turns=max_turns, guards=config, resume=resume
    )
    return initial_state(session_id or new_session_id(), _as_logged(opened))


def _as_logged(opened: SessionOpened) -> SessionOpened:
    """`opened` as the log reads it back: a value JSON does not hold as it is (a tuple, a
    NaN, a set) is kept in its JSON form, so that the live state is the replayed one."""
    try:
        logged = _opened.decode(_encoder.encode(opened))
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.MsgspecError) as exc:
        raise InputError(f"the spec or history cannot be logged as JSON: {exc}") from None
    # The given one if it reads back as itself: sessions started from one spec then share
    # it (and its guards), where each copy costs a few KB.
    return opened if logged == opened else logged


def _transcript(history: Sequence[dict[str, Any]] | None) -> tuple[dict[str, Any], ...]:
    if history is None:
        return ()
    if not isinstance(history, list | tuple):
        raise InputError(f"history: expected a list of messages, got {type(history).__name__}")
    called: set[object] = set()
    for index, message in enumerate(history):
        if not isinstance(message, dict):
            raise InputError(f"history[{index}]: expected a message object, got {message!r:.80}")
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise InputError(f"history[{index}].role: {role!r} is not a chat role")
        content = message.get("content")
        # As chat servers take it: text, a list of content parts (each an object naming its
        # type), or none.
        if not (
            content is None
            or isinstance(content, str)
            or (
                isinstance(content, list)
                and all(
                    isinstance(part, dict) and isinstance(part.get("type"), str) for part in content
                )
            )
        ):
            raise InputError(
                f"history[{index}].content: expected a string, a list of content parts "
                f'(objects with a "type") or null, got {content!r:.80}'
            )
        called |= _check_tool_calls(index, message.get("tool_calls"))
        # As chat servers require: a tool message answers a call made before it.
        if role == "tool" and message.get("tool_call_id") not in called:
            raise InputError(
                f"history[{index}].tool_call_id: {message.get('tool_call_id')!r} answers no "
                "tool call of an earlier assistant message"
            )
    return tuple(history)


def _check_tool_calls(index: int, calls: object) -> set[object]:
    """The ids of the calls, once each is checked to be a call with an id of its own."""
    if calls is None:
        return set()
    if not isinstance(calls, list):
        raise InputError(f"history[{index}].tool_calls: expected a list")
    ids: set[object] = set()
    for position, call in enumerate(calls):
        where = f"history[{index}].tool_calls[{position}]"
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            raise InputError(f"{where}: expected an object with a string id")
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InputError(f"{where}.function: expected an object with a string name")
        # Pending, two calls with one id could not both be answered.
        if call["id"] in ids:
            raise InputError(f"{where}.id: {call['id']!r} is the id of an earlier call here")
        ids.add(call["id"])
    return ids
