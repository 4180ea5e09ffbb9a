"""`turnkeeper serve`: the HTTP API for orchestrators, on trio, until SIGINT or SIGTERM."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import anyio
import msgspec

from turnkeeper import tracing
from turnkeeper.cli import _codes
from turnkeeper.cli._backend import chat_backend
from turnkeeper.core import InputError
from turnkeeper.logs import is_postgres_url

if TYPE_CHECKING:
    from turnkeeper.service import Listening


LOG_VARIABLE = "TURNKEEPER_LOG"
DEFAULT_LOG = "turnkeeper.sqlite"
_GC_THRESHOLD = 50_000
_SWITCH_INTERVAL = 0.001


class ServeOptions(msgspec.Struct, frozen=True):
    host: str
    port: int
    log: str | None
    worker_id: str | None
    lease: float
    base_url: str | None
    model: str | None
    token_file: str | None


async def given_token(token_file: str | None) -> str | None:
    """The token from `--token-file` (its first line), else None (the service then takes
    TURNKEEPER_TOKEN, or makes one)."""
    if token_file is None:
        return None
    data = await anyio.Path(Path(token_file)).read_bytes()
    try:
        token = data.decode().strip()
    except UnicodeDecodeError:
        raise InputError(f"--token-file {token_file}: not UTF-8 text") from None
    if not token or "\n" in token:
        raise InputError(f"--token-file {token_file}: expected one line, the token")
    return token


def shown_log(log: str) -> str:
    """The log as printed: a URL without its password."""
    if not is_postgres_url(log):
        return log
    parts = urlsplit(log)
    if parts.password is None:
        return log
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


async def serve_command(options: ServeOptions) -> int:
    """Serve until stopped; print the URL, and the token when it was made up here."""
    # Imported here: the web stack is slow to import and only `serve` needs it.
    from turnkeeper.service import TOKEN_VARIABLE, serve

    tracing.configure_from_env()
    # A worker holds every session's state: with Python's first threshold (700), each
    # turn's short-lived objects set off collections that end in full ones over all of
    # it, which at thousands of sessions take most of the time (see bench/host.py).
    gc.set_threshold(_GC_THRESHOLD, *gc.get_threshold()[1:])
    # The SQLite log's writer thread needs the GIL back after each commit; the event
    # loop's thread, busy with sessions, would otherwise keep it for up to Python's 5 ms
    # switch interval each time, and every append of the round waits that long.
    sys.setswitchinterval(_SWITCH_INTERVAL)
    token = await given_token(options.token_file)
    log = options.log or os.environ.get(LOG_VARIABLE) or DEFAULT_LOG
    made_up = token is None and not os.environ.get(TOKEN_VARIABLE)

    def ready(listening: Listening) -> None:
        print(f"turnkeeper serving on {listening.url}/v1 (log: {shown_log(log)})", flush=True)
        if made_up:
            print(f"token: {listening.token}", flush=True)
        else:
            source = "--token-file" if options.token_file is not None else TOKEN_VARIABLE
            print(f"token: from {source}", flush=True)

    await serve(
        chat=chat_backend(options.base_url, options.model),
        host=options.host,
        port=options.port,
        log_path=log,
        worker_id=options.worker_id,
        lease=options.lease,
        token=token,
        ready=ready,
    )
    return _codes.OK
