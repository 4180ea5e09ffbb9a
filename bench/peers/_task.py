"""The agent task every framework runs, its scripted model's moves, and its one tool.

The task: fetch the values at indexes 0 .. N-1 with the `fetch` tool, one call per model
turn, then answer with their sum. The scripted model reads the last tool result in the
conversation to pick the next index, and adds up every tool result it was sent to write
the answer, so a framework that skips a tool or drops a result fails the check.

Each session runs with its own `Session` in the context (`CURRENT`); the model and the
tool count what they did there, so the harness checks each framework's work.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ParamSpec, Protocol, TypeVar

SYSTEM_PROMPT = "You add up values. Fetch each value with the fetch tool, then answer with the sum."
TOOL_NAME = "fetch"
TOOL_DESCRIPTION = "Fetch the value stored at an index."
TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"i": {"type": "integer", "description": "The index to fetch."}},
    "required": ["i"],
    "additionalProperties": False,
}
PROMPT_TOKENS = 100
COMPLETION_TOKENS = 10
"""The usage every scripted reply reports, as a real model would (so no framework
estimates it)."""


def prompt(round_trips: int) -> str:
    return f"Fetch the values at indexes 0 to {round_trips - 1} and tell me their sum."


def value(index: int) -> int:
    return (index * 7919 + 13) % 1000


def result_text(index: int) -> str:
    return f"value {index} = {value(index)}"


def answer(total: int) -> str:
    return f"The sum is {total}."


def expected_answer(round_trips: int) -> str:
    return answer(sum(value(index) for index in range(round_trips)))


def arguments_json(index: int) -> str:
    return f'{{"i": {index}}}'


class CapReached(Exception):
    """The looping model was called more times than the cap: the framework did not stop it."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"the looping model reached its cap of {cap} calls")
        self.cap = cap


class Parking:
    """Holds sessions inside their tool call until all of them are there and `release`.
    `all_parked` is also set when a session fails (`fail`), so nobody waits forever."""

    def __init__(self, sessions: int) -> None:
        self.expected = sessions
        self.parked = 0
        self.failure: BaseException | None = None
        self.all_parked = asyncio.Event()
        self.released = asyncio.Event()

    async def park(self) -> None:
        self.parked += 1
        if self.parked == self.expected:
            self.all_parked.set()
        await self.released.wait()

    def release(self) -> None:
        self.released.set()

    def fail(self, error: BaseException) -> None:
        self.failure = error
        self.all_parked.set()


@dataclass
class Session:
    """What one session should do, and what its model and tool did.

    `loop_cap` set: the model repeats `fetch(i=0)` forever, and raises CapReached past
    `loop_cap` calls. `parking` set: the tool call at index `park_at` waits there.
    `model_ns` is the time spent inside the scripted model, to show it is negligible;
    `calls_in_threads` counts the tool calls run outside the main thread.
    """

    round_trips: int
    loop_cap: int | None = None
    parking: Parking | None = None
    park_at: int = -1
    model_calls: int = 0
    model_ns: int = 0
    calls: list[int] = field(default_factory=list)
    calls_in_threads: int = 0


CURRENT: ContextVar[Session] = ContextVar("CURRENT")


@dataclass(frozen=True)
class Call:
    """The scripted model calls `fetch(i=index)` with the call id `call_id`."""

    call_id: str
    index: int


def next_move(last_result: str | None, results: Callable[[], Iterable[str]]) -> Call | str:
    """The scripted model's reply: the next call, or the final answer text.

    `last_result` is the text of the tool result that ends the conversation (None when
    it ends with the user's prompt); `results` gives the texts of all tool results sent,
    read only for the final answer so each call costs O(1).
    """
    session = CURRENT.get()
    session.model_calls += 1
    call_id = f"call_{session.model_calls}"
    if session.loop_cap is not None:
        if session.model_calls > session.loop_cap:
            raise CapReached(session.loop_cap)
        return Call(call_id, 0)
    index = 0 if last_result is None else _index_of(last_result) + 1
    if index < session.round_trips:
        return Call(call_id, index)
    return answer(sum(_value_of(text) for text in results()))


P = ParamSpec("P")
R = TypeVar("R")


def scripted_model(
    model: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """`model` (a framework's scripted-model function), adding its time to `model_ns`."""

    @functools.wraps(model)
    async def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        start = time.perf_counter_ns()
        try:
            return await model(*args, **kwargs)
        finally:
            CURRENT.get().model_ns += time.perf_counter_ns() - start

    return timed


def _index_of(text: str) -> int:
    return int(text.split(" ", 2)[1])


def _value_of(text: str) -> int:
    return int(text.rsplit(" ", 1)[1])


async def fetch(i: int) -> str:
    """Fetch the value stored at an index.

    Args:
        i: The index to fetch.
    """
    session = CURRENT.get()
    session.calls.append(i)
    if session.parking is not None and i == session.park_at:
        await session.parking.park()
    return result_text(i)


def fetch_sync(i: int) -> str:
    """Fetch the value stored at an index.

    Args:
        i: The index to fetch.
    """
    session = CURRENT.get()
    session.calls.append(i)
    session.calls_in_threads += threading.current_thread() is not threading.main_thread()
    return result_text(i)


@dataclass(frozen=True)
class Ended:
    """How a session ended: its final text and, in words, what stopped it."""

    text: str
    how: str


class Adapter(Protocol):
    """One framework running the task: `session` runs the agent on `prompt` to its end,
    with the scripted model and the `fetch` tool, in the current `Session`'s context,
    allowing at most `max_turns` model calls (None: the framework's default limit).

    With `sync_tool`, the tool is `fetch_sync`, a plain function, run the way the
    framework runs one by default (each peer hands it to a worker thread, so the
    turnkeeper adapter does too: a plain function may block)."""

    name: str
    version: str

    async def session(
        self, prompt: str, max_turns: int | None, *, sync_tool: bool = False
    ) -> Ended: ...


class WrongWork(Exception):
    """A framework's session did not do the task's work."""


def check_session(framework: str, session: Session, ended: Ended) -> None:
    """Raise WrongWork unless the session ran every tool call once, in order, made one
    model call per round trip plus the answer, and returned the expected answer."""
    rounds = session.round_trips
    problems = []
    if session.calls != list(range(rounds)):
        problems.append(f"tool calls {session.calls}, expected {list(range(rounds))}")
    if session.model_calls != rounds + 1:
        problems.append(f"{session.model_calls} model calls, expected {rounds + 1}")
    if ended.text != expected_answer(rounds):
        problems.append(f"answer {ended.text!r}, expected {expected_answer(rounds)!r}")
    if problems:
        raise WrongWork(f"{framework}: {'; '.join(problems)}")
