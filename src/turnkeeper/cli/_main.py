"""The `turnkeeper` command: run, replay, sessions, export, check, fork, serve, ui, model
serve.

Exit codes: 0 the run answered (replay: the outcome would be the same; check: no damage);
1 the run was stopped without an answer (replay --guards: the outcome would differ; check:
the log is damaged); 2 bad arguments, files, logs or configuration; 3 the model failed;
130 interrupted.
"""

from __future__ import annotations

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
        code: int = anyio.run(partial(command, options), backend="trio")
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return _codes.USAGE
    except (TurnkeeperError, OSError) as exc:
        print(f"turnkeeper: error: {exc}", file=sys.stderr)
        return _codes.USAGE
    except KeyboardInterrupt:
        print("turnkeeper: interrupted", file=sys.stderr)
        return _codes.INTERRUPTED
    return code
