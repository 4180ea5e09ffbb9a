"""run: one session to completion, with in-process tools."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from typing import Any

import anyio
import msgspec

from turnkeeper.core import (
    AgentSpec,
    Chat,
    ChatError,
    GuardConfig,
    InputError,
    Message,
    TerminalTool,
    ToolResult,
    ToolUse,
    Usage,
    check_count,
    check_seconds,
    output_type,
    with_output_schema,
)
from turnkeeper.events import (
    AnyEvent,
    ApprovalDecided,
    Envelope,
    Halted,
    McpFailed,
    ModelResponded,
    TokenDelta,
    ToolCalled,
    ToolReturned,
)
from turnkeeper.guards import Guard, default_guards, with_last_result
from turnkeeper.providers import DeltaSink
from turnkeeper.sessions._driver import answer, call_model, compact
from turnkeeper.sessions._inputs import Input, Kickoff, Resume
from turnkeeper.sessions._logging import json_log
from turnkeeper.sessions._normalize import Terminal, TurnResult, normalize
from turnkeeper.sessions._open import open_session
from turnkeeper.sessions._poll import begin_poll, build_request, emit, opened_event, unanswered
from turnkeeper.sessions._step_timeout import STEP_TIMEOUT, check_step_timeout, timed_chat
from turnkeeper.sessions._tool_runner import ToolRunner
from turnkeeper.sessions._typed import decoded
from turnkeeper.state import SessionState, approval_request, awaiting_approval, denial
from turnkeeper.tools import (
    MAX_TOOL_RESULT_CHARS,
    McpPool,
    McpTools,
    Tools,
    check_call,
    coerce_call,
    handled_as_error,
)
from turnkeeper.tracing import AgentSpan, agent_span, traced_chat

TurnGuard = Callable[[Usage, int], str | None]
"""Called after each model call with the run's usage and model calls so far; a returned
string halts the run with that message."""

EventCallback = Callable[[Envelope], Any]
"""Called with each event as it happens; may be async. A timeout or cancel of the run waits
for the events of a step to be all handed over, so what it records has no gap."""

DeltaCallback = Callable[[TokenDelta], object]
"""Called with each fragment of a model reply as it streams in (see `TokenDelta`), from the
model call's task: it must not block (hand the delta on, print it). Not awaited; one that
raises is logged and goes on being called, so the reply is not lost."""

_log = json_log(logging.getLogger("turnkeeper.run"))

Approver = Callable[[ToolUse], bool | str | Awaitable[bool | str]]
"""Called with each tool call awaiting approval, in call order; may be async. True approves
it; False denies it, and a string denies it with that reason (the model is told)."""

RUNNER = "runner"
TURN_GUARD = "turn_guard"
RUNNER_HALTS = frozenset({RUNNER, TURN_GUARD})
"""The `guard` names of the halts a run logs itself (a model failure, its timeout, its
turn_guard), which no guard derives."""


class RunResult(msgspec.Struct, frozen=True):
    """How a run ended. `transcript` reattaches (`run(..., history=transcript)`), `result`
    holds the terminal tool's arguments, `turns` counts model calls. `output` is the typed
    output of a spec with an `output_schema`, when the run answered (`end_turn`): the
    answer's JSON value, or an instance of the type given as the schema."""

    terminal: Terminal | str
    stop_reason: str
    session_id: str
    text: str | None
    tool_uses: tuple[ToolUse, ...]
    usage: Usage
    turns: int
    events: tuple[Envelope, ...]
    transcript: tuple[Message, ...]
    result: dict[str, Any] | None
    state: SessionState
    output: Any = None


_NOTHING = nullcontext()


class _Runner:
    """The state of one run, and the events it has produced."""

    def __init__(
        self, state: SessionState, on_event: EventCallback | None, clock: Callable[[], float]
    ):
        self.state = state
        self.events: list[Envelope] = []
        self.on_event = on_event
        self.clock = clock
        self.span: AgentSpan | None = None

    async def record(self, events: Sequence[Envelope]) -> None:
        """Take `events` as the run's next and hand each to `on_event`."""
        self.events.extend(events)
        if self.span is not None:
            self.span.record(events)
        if self.on_event is not None:
            # Shielded: a timeout or cancel cutting this short would leave the log that
            # on_event writes without the rest, and the next event (the timeout's halt)
            # would follow a gap.
            with anyio.CancelScope(shield=True):
                for envelope in events:
                    outcome = self.on_event(envelope)
                    if inspect.isawaitable(outcome):
                        await outcome

    async def emit(self, event: AnyEvent) -> None:
        envelope, self.state = emit(self.state, event, at=self.clock())
        await self.record((envelope,))

    async def poll(
        self, given: Input, chat: Chat, on_delta: DeltaCallback | None, guard: Guard
    ) -> tuple[Sequence[Envelope], Sequence[Envelope], ChatError | None]:
        """One poll on `given`: its input and guard events, then (unless a guard stopped
        it) its model call's answer, each logged; and the call's failure, or None. A
        method of its own, so that the call's request and response go with it: a run
        parked in a tool call holds neither."""
        # The poll's input and guard events are logged before its model call, as a Host
        # logs them: a log cut short during the call (a timeout, a failure, Ctrl-C) still
        # opens the session and holds the prompt.
        begun, self.state, request = begin_poll(self.state, given, now=self.clock(), guard=guard)
        await self.record(begun)
        if request is None:
            return begun, (), None
        compaction, self.state = await compact(chat, self.state, clock=self.clock)
        if compaction:
            await self.record(compaction)
            request = build_request(self.state)
        sink = None
        if on_delta is not None:
            sink = DeltaSink(_delivering(on_delta), self.state.session_id, self.state.seq)
        called = await call_model(chat, request, sink)
        answered = answer(called, self.state, guard=guard, clock=self.clock)
        await self.record(answered.events)
        self.state = answered.state
        return begun, answered.events, answered.failure


class _RunCalls:
    """What a run logs around each tool call (`ToolCalls`): the call, an MCP server's
    failure and the result, each as it happens."""

    def __init__(self, runner: _Runner, spec: AgentSpec, mcp_tools: McpTools | None) -> None:
        self.runner = runner
        self.spec = spec
        self.mcp_tools = mcp_tools

    def refusal(self, use: ToolUse) -> str | None:
        denied = denial(self.runner.state, use)
        if denied is not None:
            return denied
        mcp_tools = self.mcp_tools
        return check_call(self.spec, use) if mcp_tools is None else mcp_tools.refusal(use)

    async def starting(self, use: ToolUse) -> ToolUse:
        use = coerce_call(self.spec, use)
        await self.runner.emit(ToolCalled(tool_call_id=use.id, name=use.name, input=use.input))
        return use

    async def failed(self, failure: McpFailed) -> None:
        await self.runner.emit(failure)

    async def finished(self, use: ToolUse, result: ToolResult, *, ran: bool) -> None:
        if ran:
            await self.runner.emit(
                ToolReturned(tool_call_id=use.id, text=result.text, is_error=result.is_error)
            )


async def run(
    spec: AgentSpec,
    prompt: str | None,
    chat: Chat,
    *,
    tools: Tools | None = None,
    max_turns: int = 50,
    require_terminal_tool: bool = False,
    max_reprompts: int = 2,
    guards: GuardConfig | None = None,
    guard: Guard = default_guards,
    turn_guard: TurnGuard | None = None,
    on_event: EventCallback | None = None,
    on_delta: DeltaCallback | None = None,
    timeout: float | None = None,
    history: Sequence[dict[str, Any]] | None = None,
    session_id: str | None = None,
    tool_concurrency: int = 8,
    tool_timeout: float | None = None,
    step_timeout: float | None = STEP_TIMEOUT,
    max_tool_result_chars: int = MAX_TOOL_RESULT_CHARS,
    clock: Callable[[], float] = time.time,
    mcp: McpPool | None = None,
    approve: Approver | None = None,
) -> RunResult:
    """Run a session until the model answers, calls the terminal tool, a guard halts it,
    `max_turns` is spent, `timeout` seconds pass, or it needs tools it was not given.

    `tools` is one async handler `(name, args, ctx) -> str` or a mapping of tool name to
    a function (async, or plain for quick work) called with the arguments as keywords;
    a call of a tool the mapping does not name, and no MCP server serves, stops the run
    with the reply's calls in `tool_uses`, none run (as without `tools`). Tools run at most
    `tool_concurrency` at a time and their results go back in call order. A handler
    that raises becomes an error result for the model. With `history` (a transcript
    from a previous run) the session continues it; `prompt` may then be None.

    The tools of the spec's `mcp_servers` are listed when the session opens and called
    through the protocol, on the connections of `mcp` (a pool shared with other
    sessions) or of a pool of the run's own. Without `tools`, the run still calls them,
    and stops for results from outside only when another tool is called.

    `step_timeout` bounds each model call (300 s unless set; None: no bound): a call that
    takes longer fails as a chat error does, logged, and halts the run. A handler's result
    longer than `max_tool_result_chars` is cut, with a note the model reads saying so.
    A tool's own `timeout` bounds its calls instead of `tool_timeout`.

    With `on_delta`, each model call is streamed (by a backend that can stream:
    OpenAIChat, EmbeddedChat): `on_delta` gets the reply's fragments as they come, each a
    `TokenDelta`, while `on_event` still gets the whole reply once, as it is logged.

    Calls whose tool's `approval` wants it are each given to `approve` before any call
    of their reply runs; a denied call is answered with a tool error saying so. Without
    `approve`, the run stops at such calls (terminal `awaiting_approval`, the calls in
    `tool_uses`); run again on its transcript with `approve` to go on.

    A spec whose `output_schema` is a type is logged with that type's JSON Schema, and the
    answer is decoded into it (`RunResult.output`); an answer the schema admits and the
    type does not (a naive datetime's schema is any string) ends the run `invalid_output`.
    """
    config = guards if guards is not None else GuardConfig()
    if require_terminal_tool or max_reprompts != 2:
        config = msgspec.structs.replace(
            config,
            terminal=TerminalTool(required=require_terminal_tool, max_reprompts=max_reprompts),
        )
    # All checked before anything runs, as a Host checks its own: a bad value found later
    # would fail the run after a model call was paid for.
    for name, function in (("chat", chat), ("guard", guard), ("clock", clock)):
        if not callable(function):
            raise InputError(f"{name}: expected a function, got {function!r:.80}")
    for name, hook in (
        ("turn_guard", turn_guard),
        ("on_event", on_event),
        ("on_delta", on_delta),
        ("approve", approve),
    ):
        if hook is not None and not callable(hook):
            raise InputError(f"{name}: expected a function or None, got {hook!r:.80}")
    if inspect.iscoroutinefunction(on_delta):
        raise InputError(
            "on_delta: expected a plain function (called as each fragment comes, not "
            "awaited), got an async one"
        )
    check_count("tool_concurrency", tool_concurrency, 1)
    if tool_timeout is not None:
        check_seconds("tool_timeout", tool_timeout, positive=True, optional=True)
    if timeout is not None:
        check_seconds("timeout", timeout, positive=True, optional=True)
    check_step_timeout("step_timeout", step_timeout)
    check_count("max_tool_result_chars", max_tool_result_chars, 1)
    tool_runner = ToolRunner(
        tools, timeout=tool_timeout, limit=tool_concurrency, max_chars=max_tool_result_chars
    )
    kind = None
    if isinstance(spec, AgentSpec):
        kind = output_type(spec.output_schema)
        spec = with_output_schema(spec)
    own_pool = None
    if isinstance(spec, AgentSpec) and spec.mcp_servers and mcp is None:
        own_pool = McpPool()
    # A pool entered only when the run needs one of its own: an exit stack would cost every
    # run 0.8 KB, held while it waits in a tool call.
    async with own_pool or _NOTHING:
        mcp_tools: McpTools | None = None
        if isinstance(spec, AgentSpec) and spec.mcp_servers:
            pool = mcp if mcp is not None else own_pool
            assert pool is not None
            mcp_tools = await pool.open(spec)
            spec = mcp_tools.spec
        state = open_session(
            spec, session_id=session_id, history=history, max_turns=max_turns, guards=config
        )
        runner = _Runner(state, on_event, clock)
        with agent_span(state, prompt=prompt) as span:
            runner.span = span
            traced = traced_chat(timed_chat(chat, step_timeout))
            if mcp_tools is not None and mcp_tools.events:
                # Start-up failures are logged after the session's opening event.
                await runner.emit(opened_event(state))
                for failure in mcp_tools.events:
                    await runner.emit(failure)
            asked = approval_request(runner.state)
            if asked is not None:
                # A transcript ending in calls that need approval.
                if runner.state.seq == 0:
                    await runner.emit(opened_event(runner.state))
                await runner.emit(asked)
            turns = 0
            turn: TurnResult | None = None
            next_input: Input | None
            if prompt is not None:
                next_input = Kickoff(prompt)
            elif state.status == "running":
                next_input = Resume()
            elif state.status == "requires_action":
                next_input = None
            else:
                raise InputError("prompt: nothing to continue in the history; give a prompt")
            pending = state.pending
            # No cancel scope without a timeout: 0.7 KB held while the run waits.
            bound = None if timeout is None else anyio.move_on_after(timeout)
            with bound or _NOTHING:
                while True:
                    if next_input is None:
                        if not await _decide(runner, approve):
                            break
                        calls = _RunCalls(runner, spec, mcp_tools)
                        if not all(_runs_here(use, tool_runner, calls) for use in pending):
                            break
                        results = await tool_runner.run(
                            pending,
                            calls,
                            session_id=runner.state.session_id,
                            spec=spec,
                            mcp=mcp_tools,
                        )
                        next_input = Resume(pending, tuple(results))
                    begun, events, chat_failure = await runner.poll(
                        next_input, traced, on_delta, guard
                    )
                    if chat_failure is not None:
                        lead = f"The model failed: {chat_failure.message}"
                        message = with_last_result(runner.state, lead)
                        await runner.emit(
                            unanswered(runner.state)
                            or Halted(guard=RUNNER, reason="chat_error", message=message)
                        )
                        turn = None
                        break
                    turn = normalize((*begun, *events))
                    turns += sum(isinstance(envelope.event, ModelResponded) for envelope in events)
                    if turn.terminal != "requires_action":
                        break
                    if turn_guard is not None:
                        verdict = turn_guard(runner.state.usage, turns)
                        if verdict is not None:
                            await runner.emit(
                                Halted(guard=TURN_GUARD, reason="turn_guard", message=verdict)
                            )
                            turn = None
                            break
                    pending = turn.tool_uses
                    next_input = None if pending else Resume()
            if bound is not None and bound.cancelled_caught:
                lead = f"I stopped because the run took longer than its {timeout:g} s timeout."
                with anyio.CancelScope(shield=True):
                    await runner.emit(
                        Halted(
                            guard=RUNNER,
                            reason="timeout",
                            message=with_last_result(runner.state, lead),
                        )
                    )
                turn = None
            output = runner.state.output if turn is not None and turn.typed else None
            if kind is not None and turn is not None and turn.typed:
                output, undecoded = decoded(runner.state, kind)
                if undecoded is not None:
                    halt = Halted(guard=RUNNER, reason="invalid_output", message=undecoded)
                    await runner.emit(halt)
                    turn = None
            runner.span.finish(runner.state)
            return _result(runner, turn, turns, output)


def _delivering(on_delta: DeltaCallback) -> Callable[[TokenDelta], None]:
    """`on_delta`, with what it raises logged instead: a fault of the callback must not
    lose the reply it is shown (a model call paid for), as a Host's watchers' do not."""

    def deliver(delta: TokenDelta) -> None:
        try:
            on_delta(delta)
        except BaseException as exc:
            if not handled_as_error(exc):
                raise
            _log.error("run.on_delta_failed", session_id=delta.session_id, error=repr(exc))

    return deliver


def _runs_here(use: ToolUse, tool_runner: ToolRunner, calls: _RunCalls) -> bool:
    """Whether the run answers this call itself: by its handler, by an MCP server, or as a
    bad call (with an error, without running it), as a Host does."""
    if tool_runner.handles(use.name):
        return True
    mcp_tools = calls.mcp_tools
    if mcp_tools is not None and mcp_tools.serves(use.name):
        return True
    return calls.refusal(use) is not None


async def _decide(runner: _Runner, approve: Approver | None) -> bool:
    """Ask `approve` about each call awaiting approval and log its decision; False if
    calls await approval and there is no `approve` to ask."""
    awaiting = awaiting_approval(runner.state)
    if not awaiting:
        return True
    if approve is None:
        return False
    for use in awaiting:
        decided = approve(use)
        if inspect.isawaitable(decided):
            decided = await decided
        if isinstance(decided, str):
            event = ApprovalDecided(tool_call_id=use.id, approved=False, reason=decided)
        elif isinstance(decided, bool):
            event = ApprovalDecided(tool_call_id=use.id, approved=decided)
        else:
            raise InputError(
                f"approve: expected True, False or a reason for the denial, got {decided!r:.80}"
            )
        await runner.emit(event)
    return True


def _result(runner: _Runner, turn: TurnResult | None, turns: int, output: Any) -> RunResult:
    state = runner.state
    text: str | None
    tool_uses: tuple[ToolUse, ...] = ()
    result: dict[str, Any] | None = None
    if turn is None:
        last = runner.events[-1].event if runner.events else None
        if isinstance(last, Halted):
            terminal, reason, text = "terminated", last.reason, last.message
        else:
            terminal, reason, text, tool_uses = "requires_action", "tool_use", None, state.pending
    else:
        terminal, reason, text = turn.terminal, turn.stop_reason, turn.text
        tool_uses, result = turn.tool_uses, turn.result
        if terminal == "requires_action":
            tool_uses = state.pending
        if terminal == "terminated" and not (text and text.strip()):
            text = with_last_result(state, f"The run ended ({reason}) without an answer.")
    awaiting = awaiting_approval(state) if terminal == "requires_action" else ()
    if awaiting:
        terminal, reason, tool_uses = "awaiting_approval", "awaiting_approval", awaiting
    return RunResult(
        terminal=terminal,
        stop_reason=reason,
        session_id=state.session_id,
        text=text,
        tool_uses=tool_uses,
        usage=state.usage,
        turns=turns,
        events=tuple(runner.events),
        transcript=state.history,
        result=result,
        state=state,
        output=output if terminal == "end_turn" else None,
    )
