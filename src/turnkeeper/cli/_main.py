"""The `turnkeeper` command: run, replay, sessions, export, check, fork, serve, ui, model
serve.

Exit codes: 0 the run answered (replay: the outcome would be the same; check: no damage);
1 the run was stopped without an answer (replay --guards: the outcome would differ; check:
the log is damaged); 2 bad arguments, files, logs or configuration; 3 the model failed;
130 interrupted.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TextIO, cast

import anyio
import msgspec
import structlog

from turnkeeper.cli import _codes
from turnkeeper.cli._check import CheckOptions, check_command
from turnkeeper.cli._fork import ForkOptions, fork_command
from turnkeeper.cli._inspect import (
    ExportOptions,
    ReplayOptions,
    SessionsOptions,
    export_command,
    replay_command,
    sessions_command,
)
from turnkeeper.cli._model import ModelServeOptions, model_serve_command
from turnkeeper.cli._parser import UsageError, build_parser
from turnkeeper.cli._run import RunOptions, run_command
from turnkeeper.cli._serve import ServeOptions, serve_command
from turnkeeper.cli._ui import UiOptions, ui_command
from turnkeeper.core import TurnkeeperError

_COMMANDS: dict[str, tuple[type[msgspec.Struct], Callable[[Any], Awaitable[int]]]] = {
    "run": (RunOptions, run_command),
    "replay": (ReplayOptions, replay_command),
    "sessions": (SessionsOptions, sessions_command),
    "export": (ExportOptions, export_command),
    "check": (CheckOptions, check_command),
    "fork": (ForkOptions, fork_command),
    "serve": (ServeOptions, serve_command),
    "ui": (UiOptions, ui_command),
    "model serve": (ModelServeOptions, model_serve_command),
}


class _CurrentStderr:
    """sys.stderr as it is at each write: a caller (a test's capture, say) may swap it
    after `main` has configured the logs, and a log line must not go to a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: the process's); return the exit code."""
    if not structlog.is_configured():
        # What the logs warn of goes to stderr: stdout is the command's output (a table,
        # JSON Lines), which a log line must not break.
        structlog.configure(
            logger_factory=structlog.PrintLoggerFactory(cast(TextIO, _CurrentStderr()))
        )
    try:
        namespace = build_parser().parse_args(argv)
        options_type, command = _COMMANDS[namespace.command]
        options = msgspec.convert(vars(namespace), options_type)
        code = anyio.run(partial(_interruptible, command, options), backend="trio")
        # Here, not at exit: a reader gone by then is caught below.
        sys.stdout.flush()
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return _codes.USAGE
    except BrokenPipeError:
        _drop_stdout()
        return _codes.CLOSED_PIPE
    except (TurnkeeperError, OSError) as exc:
        print(f"turnkeeper: error: {exc}", file=sys.stderr)
        return _codes.USAGE
    except KeyboardInterrupt:
        code = None
    if code is None:
        print("turnkeeper: interrupted", file=sys.stderr)
        return _codes.INTERRUPTED
    return code


def _drop_stdout() -> None:
    """Point stdout at /dev/null: its reader is gone, and Python's flush of it at exit would
    report the broken pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


async def _interruptible(command: Callable[[Any], Awaitable[int]], options: Any) -> int | None:
    """Run `command(options)` and return its exit code, or None if Ctrl-C stopped it.

    The first SIGINT cancels the command, so it unwinds as a cancellation does (its log
    flushed, its streams closed) rather than from wherever in its code the signal landed:
    a KeyboardInterrupt there can leave a response's generator unclosed, which Python
    then reports on stderr at exit. A second SIGINT, during that unwinding, interrupts at
    once. A command that handles SIGINT itself (serve, ui) takes the first one while its
    own receiver is open."""
    interrupted = False
    code: int | None = None

    async def cancel_on_sigint(scope: anyio.CancelScope) -> None:
        nonlocal interrupted
        with anyio.open_signal_receiver(signal.SIGINT) as signals:
            async for _ in signals:
                interrupted = True
                scope.cancel()
                return

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(cancel_on_sigint, group.cancel_scope)
            code = await command(options)
            group.cancel_scope.cancel()
    except BaseExceptionGroup as failures:
        # The command's own error (or a second Ctrl-C), as main() reports it.
        if len(failures.exceptions) == 1:
            raise failures.exceptions[0] from None
        raise
    return None if interrupted else code
