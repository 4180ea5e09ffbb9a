"""Running tool calls in-process: handler shapes, argument checks, errors as results."""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import anyio
import msgspec

from turnkeeper.core import (
    AgentSpec,
    InputError,
    ToolResult,
    ToolUse,
    call_problem,
    coerce,
    loggable,
)


class ToolContext(msgspec.Struct, frozen=True):
    """What a handler knows about the call it serves. `tool_call_id` is stable across a
    crash and a re-run, so a handler with side effects can dedupe on it."""

    session_id: str
    tool_call_id: str
    name: str

    @property
    def idempotency_key(self) -> str:
        """The same for every run of this call, on any worker, after any takeover: the
        key a handler with side effects dedupes on (the session id and the call id)."""
        return f"{self.session_id}:{self.tool_call_id}"


ToolHandler = Callable[[str, dict[str, Any], ToolContext], Awaitable[Any]]
"""One handler for every tool: `async def handler(name, args, ctx) -> str`."""

ToolFunctions = Mapping[str, Callable[..., Any]]
"""A function per tool name, called with the arguments as keywords: async, or plain (then
run on the event loop, as a single handler that is not async is: for quick work only)."""

Tools = ToolHandler | ToolFunctions

_json = msgspec.json.Encoder()


def as_handler(tools: Tools) -> ToolHandler:
    """One handler for `tools`, given as a single handler or a mapping of name to function."""
    if isinstance(tools, Mapping):
        functions = dict(tools)
        for name, function in functions.items():
            if not callable(function):
                raise InputError(f"tools[{name!r}]: expected a function, got {function!r:.80}")

        async def by_name(name: str, args: dict[str, Any], ctx: ToolContext) -> Any:
            function = functions.get(name)
            if function is None:
                known = ", ".join(sorted(functions)) or "none"
                raise LookupError(f"no handler for tool {name!r} (handled: {known})")
            value = function(**args)
            return await value if inspect.isawaitable(value) else value

        return by_name
    if not callable(tools):
        raise InputError(
            f"tools: expected a handler or a mapping of tool functions, got {tools!r:.80}"
        )
    return tools


check_call = call_problem
"""Why a call must not run, as the tool error the model is sent, or None."""


def coerce_call(spec: AgentSpec, use: ToolUse) -> ToolUse:
    """`use` with its arguments as its handler gets them: with the safe coercions of
    `coerce` for its tool's schema (`"3"` -> 3 for an integer, say); `use` itself when
    nothing changes or the tool is not in the spec."""
    tool = spec.tool(use.name)
    if tool is None:
        return use
    arguments = coerce(tool.input_schema, use.input)
    return use if arguments is use.input else msgspec.structs.replace(use, input=arguments)


def as_text(value: Any) -> str:
    """A handler's return value as the text sent to the model."""
    if isinstance(value, str):
        return loggable(value)
    return _json.encode(value).decode()


def _error_text(exc: BaseException) -> str:
    """What the model is sent for an exception a handler raised: its type and message."""
    try:
        message = str(exc)
    except Exception as broken:
        # A broken __str__ is the handler's failure too: its call still gets a result.
        message = f"(its message could not be made: {type(broken).__name__})"
    return loggable(f"{type(exc).__name__}: {message}")


def handled_as_error(exc: BaseException) -> bool:
    """Whether `exc`, raised by a handler or backend, stands for a failure of that call
    alone: any Exception, and a BaseException that does not stop this task or the process.
    On asyncio, a CancelledError can come from a future that other code cancelled, while
    nothing cancelled this task: it is such a failure. A cancellation of this task (one of
    its scopes is cancelled), KeyboardInterrupt, SystemExit and GeneratorExit are not."""
    if isinstance(exc, Exception):
        return True
    if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
        return False
    return anyio.current_effective_deadline() != -math.inf


_UNBOUNDED = nullcontext()

MAX_TOOL_RESULT_CHARS = 100_000
"""The longest result text a handler's call gives the model by default (as long as the
HTTP API takes from outside): a longer one is cut, with a note saying so."""


def cut_result(result: ToolResult, max_chars: int) -> ToolResult:
    """`result` with its text cut to `max_chars` characters if it is longer, followed by a
    note the model can read saying how much was left out."""
    text = result.text
    if len(text) <= max_chars:
        return result
    left_out = len(text) - max_chars
    note = (
        f"\n[turnkeeper: result cut: {left_out} of its {len(text)} characters are left out "
        f"(a result may have at most {max_chars})]"
    )
    return ToolResult(result.tool_use_id, text[:max_chars] + note, is_error=result.is_error)


async def run_tool(
    handler: ToolHandler,
    use: ToolUse,
    ctx: ToolContext,
    *,
    timeout: float | None = None,
    max_chars: int = MAX_TOOL_RESULT_CHARS,
) -> ToolResult:
    """Run one checked call. A handler that raises, times out or returns something that
    is not text or JSON gives an error result carrying why, never an exception. The
    result's text can always be logged: lone surrogates in it become "?"; and it is at
    most `max_chars` long (see `cut_result`)."""
    value: Any = None
    bound = None if timeout is None else anyio.move_on_after(timeout)
    try:
        # The handler called here, not in a function of its own: a frame less for a
        # session to hold while it waits.
        with bound or _UNBOUNDED:
            value = handler(use.name, use.input, ctx)
            if inspect.isawaitable(value):
                value = await value
        if bound is not None and bound.cancelled_caught:
            return ToolResult(
                use.id, loggable(f"{use.name} timed out after {timeout:g} s"), is_error=True
            )
    except BaseException as exc:
        if not handled_as_error(exc):
            raise
        return cut_result(ToolResult(use.id, _error_text(exc), is_error=True), max_chars)
    try:
        return cut_result(ToolResult(use.id, as_text(value)), max_chars)
    # Any value a handler returns may fail to encode: a foreign type, a lone surrogate, a cycle.
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
        returned = f"{use.name} returned {type(value).__name__}, not text: {exc}"
        return ToolResult(use.id, loggable(returned), is_error=True)


async def run_each(
    func: Callable[[ToolUse], Coroutine[Any, Any, None]],
    uses: Sequence[ToolUse],
    *,
    limit: int | None = None,
) -> None:
    """Run `func` on every call, at most `limit` at a time (all at once without a limit).
    Under a limit the calls start in call order, so serial tools (`limit=1`) run one after
    another in the order the model made them: a task group alone starts its tasks in no
    set order (trio picks at random). A lone call (the usual case) runs inline, since a
    task group costs about a tenth of a turn's CPU time."""
    if len(uses) == 1 or limit == 1:
        for use in uses:
            await func(use)
        return
    if limit is None or limit >= len(uses):
        async with anyio.create_task_group() as group:
            for use in uses:
                group.start_soon(func, use)
        return
    # Each worker takes the next call as it gets free: taking one is atomic between
    # checkpoints, so the calls are taken, and started, in order.
    queue = iter(uses)

    async def worker() -> None:
        for use in queue:
            await func(use)

    async with anyio.create_task_group() as group:
        for _ in range(limit):
            group.start_soon(worker)
