"""The command line: subcommands, their options, and one-line errors for bad arguments."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

from turnkeeper.core import InputError


class UsageError(InputError):
    """The command line is wrong; the message is the one line to show."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


_LOG_HELP = "a .jsonl, JsonlLog directory or SQLite log, or a postgresql://... URL"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {text!r}")
    return value


def _text(what: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"expected {what}, got an empty string")
        return text

    return check


def _backend_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-url",
        type=_text("a URL"),
        metavar="URL",
        help="an OpenAI-compatible API root, e.g. http://127.0.0.1:8080/v1 (key from "
        "TURNKEEPER_API_KEY or OPENAI_API_KEY); default: the embedded model",
    )
    parser.add_argument(
        "--model",
        type=_text("a model"),
        metavar="M",
        help="the model name sent to --base-url; without it, a GGUF file to run embedded "
        "(default: SmolLM2-135M-Instruct)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The `turnkeeper` argument parser."""
    parser = _Parser(
        prog="turnkeeper",
        description="Run, replay and serve LLM tool-calling agent sessions.",
        epilog="Exit codes: 0 answered / same outcome / no damage, 1 stopped without an answer "
        "/ outcome would differ / damage found, 2 bad arguments, 3 the model failed, "
        "130 interrupted, 141 the output's reader stopped reading.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run", help="run one session in the terminal", description="Run one session, live."
    )
    run.add_argument("prompt", type=_text("a prompt"), help="what to ask")
    _backend_options(run)
    run.add_argument(
        "--tools",
        type=_text("MODULE:OBJECT"),
        metavar="MODULE:OBJECT",
        help="the tools: a list of (ToolSpec, async function) pairs and at most one bare "
        "ToolSpec, the terminal tool; default: the example tools",
    )
    run.add_argument("--system", metavar="PROMPT", help="the system prompt")
    run.add_argument(
        "--max-turns", type=_positive_int, default=10, metavar="N", help="model calls (default 10)"
    )
    run.add_argument(
        "--require-terminal-tool",
        action="store_true",
        help="the run must end by calling the terminal tool",
    )
    run.add_argument(
        "--guards",
        type=_text("a JSON object or file"),
        metavar="CONFIG",
        help="guard settings to change, as JSON or a JSON file, e.g. "
        '\'{"loop": null, "budget": {"max_tokens": 20000}}\' (null turns a guard off)',
    )
    run.add_argument("--timeout", type=_seconds, metavar="S", help="stop after S seconds")
    run.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="the sampling seed sent with each model call (the spec's seed; default: the "
        "backend's own, 0 for the embedded model)",
    )
    run.add_argument(
        "--log", type=_text("a path"), metavar="PATH", help="record the session (.jsonl or SQLite)"
    )
    run.add_argument("--json", action="store_true", help="print every event as JSON Lines instead")
    run.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="'CMD ARGS'",
        help="an MCP server to start (stdio) and take tools from; may be repeated",
    )

    replay = commands.add_parser(
        "replay",
        help="rebuild a logged session; re-check it under other guards",
        description="Rebuild a session from its log and print its history and outcome.",
    )
    replay.add_argument("log", type=_text("a path or URL"), metavar="LOG", help=_LOG_HELP)
    replay.add_argument("--session", type=_text("a session id"), metavar="ID")
    replay.add_argument(
        "--guards",
        type=_text("a JSON object or file"),
        metavar="CONFIG",
        help="guard settings to change from the logged ones (JSON, or a JSON file): report "
        "the first poll where the outcome would differ, without calling any model",
    )

    sessions = commands.add_parser("sessions", help="list the sessions in a log, or show one")
    sessions.add_argument("session", nargs="?", type=_text("a session id"), metavar="ID")
    sessions.add_argument(
        "--log", type=_text("a path or URL"), required=True, metavar="LOG", help=_LOG_HELP
    )

    export = commands.add_parser("export", help="write a session (or all) as JSON Lines")
    export.add_argument(
        "--log", type=_text("a path or URL"), required=True, metavar="LOG", help=_LOG_HELP
    )
    export.add_argument("--session", type=_text("a session id"), metavar="ID")
    export.add_argument(
        "-o", "--output", type=_text("a path"), metavar="FILE", help="default: standard output"
    )

    check = commands.add_parser(
        "check",
        help="look for damage in a log, session by session",
        description="Check a log: SQLite's integrity_check (for a SQLite file), every "
        "session's seq chain, and a replay of each session. Prints a table; exits 1 if "
        "anything is damaged.",
    )
    check.add_argument(
        "log",
        type=_text("a path or URL"),
        metavar="LOG",
        help="a JsonlLog directory, .jsonl or SQLite log, or a postgresql://... URL",
    )

    fork = commands.add_parser(
        "fork",
        help="write a fork of a logged session into its log",
        description="Add to the log a new session whose events begin as the first AT_SEQ "
        "events of SESSION, then local.forked; print its id. A host on the log (turnkeeper "
        "serve) goes on with it from there.",
    )
    fork.add_argument("log", type=_text("a path"), metavar="LOG", help=_LOG_HELP)
    fork.add_argument("session", type=_text("a session id"), metavar="SESSION")
    fork.add_argument("at_seq", type=_positive_int, metavar="AT_SEQ", help="the seq to fork at")
    fork.add_argument(
        "--new-id", type=_text("a session id"), metavar="ID", help="default: a new one"
    )

    serve = commands.add_parser("serve", help="serve the HTTP API for orchestrators")
    serve.add_argument("--host", type=_text("a host"), default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8000)
    serve.add_argument(
        "--log",
        type=_text("a path or URL"),
        metavar="LOG",
        help="the SQLite event log, or postgresql://... to be one worker of a fleet on that "
        "database (default: TURNKEEPER_LOG, else turnkeeper.sqlite)",
    )
    serve.add_argument(
        "--worker-id",
        type=_text("a name"),
        metavar="NAME",
        help="this worker's name in the fleet (default: host name and process id)",
    )
    serve.add_argument(
        "--lease",
        type=_seconds,
        default=10.0,
        metavar="SECONDS",
        help="how long a worker's sessions outlive its last heartbeat (default: 10)",
    )
    _backend_options(serve)
    serve.add_argument(
        "--token-file",
        type=_text("a path"),
        metavar="PATH",
        help="a file holding the bearer token (default: TURNKEEPER_TOKEN, else a new one)",
    )
    model = commands.add_parser("model", help="serve the embedded model to other frameworks")
    model_commands = model.add_subparsers(dest="model_command", required=True, metavar="COMMAND")
    model_serve = model_commands.add_parser(
        "serve",
        help="serve the embedded model as an OpenAI-compatible /v1/chat/completions",
        description="Serve the embedded model over HTTP as OpenAI chat completions, with "
        "tool calls made well-formed by a grammar, until SIGINT or SIGTERM.",
    )
    model_serve.set_defaults(command="model serve")
    model_serve.add_argument("--host", type=_text("a host"), default="127.0.0.1")
    model_serve.add_argument("--port", type=_port, default=8080, help="default 8080; 0 picks one")
    model_serve.add_argument(
        "--model",
        type=_text("a path"),
        metavar="GGUF",
        help="the GGUF file to serve (default: SmolLM2-135M-Instruct)",
    )
    model_serve.add_argument(
        "--chat-format",
        type=_text("a chat format"),
        metavar="NAME",
        help="a llama-cpp-python chat format, for weights whose GGUF has no chat template",
    )

    ui = commands.add_parser(
        "ui",
        help="serve the session inspector over a log, read-only, on 127.0.0.1",
        description="Serve the session inspector (the session list and each session's "
        "timeline, live, and the what-if re-check) over a log, in the browser, on "
        "127.0.0.1. It only reads the log, so it can run beside the process writing it. "
        "Prints the address to open.",
    )
    ui.add_argument(
        "log",
        type=_text("a path or URL"),
        metavar="LOG",
        help="a JsonlLog directory, SQLite file or PostgreSQL URL (read as it grows), or a "
        ".jsonl file",
    )
    ui.add_argument("--port", type=_port, default=8765, help="default 8765; 0 for any free one")
    ui.add_argument(
        "--token-file",
        type=_text("a path"),
        metavar="PATH",
        help="a file holding the bearer token (default: TURNKEEPER_TOKEN, else a new one, "
        "given in the printed address)",
    )
    return parser
