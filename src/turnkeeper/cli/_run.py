"""`turnkeeper run`: one session in the terminal, each step shown as it happens."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from turnkeeper import tracing
from turnkeeper.cli import _codes
from turnkeeper.cli._backend import chat_backend
from turnkeeper.cli._guards import parse_guards
from turnkeeper.cli._logs import Recorder
from turnkeeper.cli._render import reply_tail, result_text, step_line
from turnkeeper.cli._toolset import example_tools, load_tools
from turnkeeper.core import (
    AgentSpec,
    Chat,
    ChatError,
    GuardConfig,
    InputError,
    SmallModel,
    text_of,
    wraps_chat,
)
from turnkeeper.events import ChatRetried, Envelope, ModelResponded, TokenDelta, encode_envelope
from turnkeeper.providers import EmbeddedChat, aclose_shared_client
from turnkeeper.sessions import RunResult, run
from turnkeeper.tools import mcp_servers_from_commands

SYSTEM_PROMPT = (
    "You are a helpful assistant. Use a tool when it gives a better answer than you can "
    "alone; otherwise answer directly. Keep answers short."
)
"""The system prompt when `--system` is not given."""


class RunOptions(msgspec.Struct, frozen=True):
    prompt: str
    base_url: str | None
    model: str | None
    tools: str | None
    system: str | None
    max_turns: int
    require_terminal_tool: bool
    guards: str | None
    timeout: float | None
    log: str | None
    json: bool
    mcp: list[str] = []
    seed: int | None = None


class _Output:
    """Where a run's events go: one human line each on stderr, or JSON Lines on stdout.
    On stderr a reply's text is shown as it streams in, on a line its event then ends."""

    def __init__(self, json_lines: bool) -> None:
        self.json_lines = json_lines
        # The streamed text on the open line, and the call and attempt it is of.
        self.streamed: str | None = None
        self.streaming: tuple[int, int] | None = None
        # The retries of the streamed call, shown after its line.
        self.retries: list[str] = []

    def _say(self, line: str) -> None:
        if not self.json_lines:
            print(line, file=sys.stderr, flush=True)

    def model_call(self) -> None:
        self._say("model: thinking…")

    def notice(self, line: str) -> None:
        """A line on stderr in either mode: what the run waits for before its first step."""
        print(line, file=sys.stderr, flush=True)

    def delta(self, delta: TokenDelta) -> None:
        """Show a fragment of the reply's text (tool calls show once they are logged)."""
        if delta.tool_call is not None or not delta.text:
            return
        if self.streaming != (delta.after, delta.attempt):
            # A new call, or a retry of this one, which starts the text over.
            if self.streaming is not None and self.streaming[0] == delta.after:
                sys.stderr.write(" (starting over)")
            self._end_line()
            self.streaming = (delta.after, delta.attempt)
            self.streamed = ""
            sys.stderr.write("model: ")
        sys.stderr.write(delta.text)
        sys.stderr.flush()
        self.streamed = (self.streamed or "") + delta.text

    def _end_line(self) -> None:
        if self.streamed is not None:
            print(file=sys.stderr, flush=True)
        self.streamed = None

    def event(self, envelope: Envelope) -> None:
        if self.json_lines:
            sys.stdout.buffer.write(encode_envelope(envelope) + b"\n")
            sys.stdout.buffer.flush()
            return
        event = envelope.event
        line = step_line(envelope)
        if isinstance(event, ChatRetried) and self.streamed is not None:
            # Logged with the reply, after its text is out: said once its line ends.
            self.retries.append(line or "")
            return
        streamed, self.streaming = self.streamed, None
        if (
            isinstance(event, ModelResponded)
            and streamed is not None
            and not event.message.get("tool_calls")
            and text_of(event.message) == streamed
        ):
            # The line shows the reply already: it ends with what the event adds.
            self.streamed = None
            line = None
            print(reply_tail(event), file=sys.stderr, flush=True)
        self._end_line()
        for retry in self.retries:
            self._say(retry)
        self.retries.clear()
        if line is not None:
            self._say(line)


def _announcing(chat: Chat, output: _Output) -> Chat:
    """`chat`, saying on the terminal when each model call starts (a local model is slow)."""

    async def announced(request: dict[str, Any]) -> dict[str, Any]:
        output.model_call()
        return await chat(request)

    return wraps_chat(announced, chat)


def exit_code(result: RunResult) -> int:
    """OK for an answer or a terminal tool's result, else why the run stopped."""
    if result.terminal == "end_turn":
        return _codes.OK
    if result.stop_reason == "chat_error":
        return _codes.MODEL_FAILED
    return _codes.STOPPED


async def _load(chat: EmbeddedChat, output: _Output) -> None:
    """Load the embedded model before the session starts, saying so: it takes a moment,
    and the first model call would otherwise wait for it without a word."""
    output.notice(f"model: loading {Path(chat.model_path).name} (embedded, once per process)…")
    started = time.perf_counter()
    try:
        await chat.load()
    except ChatError:
        return  # the session's first call fails the same way, and reports it
    output.notice(f"model: loaded in {time.perf_counter() - started:.1f} s")


async def run_command(options: RunOptions) -> int:
    """Run the session, print its steps and then its answer; return the exit code."""
    tools = example_tools() if options.tools is None else load_tools(options.tools)
    if options.require_terminal_tool and tools.terminal is None:
        raise InputError(
            "--require-terminal-tool: the tools have no terminal tool "
            "(add one bare ToolSpec to the --tools list)"
        )
    spec = AgentSpec(
        system_prompt=SYSTEM_PROMPT if options.system is None else options.system,
        tools=tools.specs,
        terminal_tool=tools.terminal,
        model=options.model or "default",
        mcp_servers=mcp_servers_from_commands(options.mcp),
        seed=options.seed,
    )
    tracing.configure_from_env()
    guards = GuardConfig()
    if options.base_url is None:
        # The embedded model is a small one: send it a window of the history, and so on.
        guards = GuardConfig(small_model=SmallModel())
    if options.guards is not None:
        guards = parse_guards(options.guards).over(guards)
    chat = chat_backend(options.base_url, options.model)
    output = _Output(options.json)
    if isinstance(chat, EmbeddedChat) and not chat.loaded:
        await _load(chat, output)
    async with contextlib.AsyncExitStack() as stack:
        recorder = None
        if options.log is not None:
            recorder = await stack.enter_async_context(Recorder(options.log))
        stack.push_async_callback(aclose_shared_client)

        async def on_event(envelope: Envelope) -> None:
            if recorder is not None:
                await recorder.record(envelope)
            output.event(envelope)

        result = await run(
            spec,
            options.prompt,
            _announcing(chat, output),
            tools=tools.functions,
            max_turns=options.max_turns,
            require_terminal_tool=options.require_terminal_tool,
            guards=guards,
            on_event=on_event,
            on_delta=None if options.json else output.delta,
            timeout=options.timeout,
        )
    if not options.json:
        answer = result_text(result.result) if result.result is not None else result.text
        print(answer or f"(no answer: {result.stop_reason})", flush=True)
    return exit_code(result)
