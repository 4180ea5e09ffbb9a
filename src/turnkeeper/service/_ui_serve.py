"""`serve_inspector`: the read-only inspector over a log, served by hypercorn on trio,
for a log no Host of this process runs (one `turnkeeper serve` writes, or one copied
off a machine)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import anyio
import trio

from turnkeeper.core import InputError, LogError
from turnkeeper.logs import (
    EventLog,
    JsonlLog,
    MemoryLog,
    PostgresLog,
    SqliteLog,
    is_postgres_url,
    read_jsonl,
)
from turnkeeper.service._auth import resolve_token
from turnkeeper.service._catalog import Catalog, Reopen
from turnkeeper.service._inspector import create_inspector_app, describe
from turnkeeper.service._limits import DEFAULT_LIMITS, Limits
from turnkeeper.service._logging import log as _log
from turnkeeper.service._serve import (
    Listening,
    _listen,
    _listening,
    _only,
    _serve_app,
    _watch_signals,
)

DEFAULT_PORT = 8765


async def serve_inspector(
    log_path: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    ping_seconds: float = 15.0,
    ready: Callable[[Listening], object] | None = None,
) -> None:
    """Serve the inspector's pages and read-only API on `host`:`port` until SIGINT or
    SIGTERM, over the log at `log_path`: a JsonlLog directory, a SQLite file or a
    PostgreSQL URL, read as other processes go on writing it, or a JSON Lines file
    (`turnkeeper export`'s), read once. Nothing is ever written to it. Run it under trio.

    `token` defaults to the TURNKEEPER_TOKEN environment variable, else a new random
    one; `ready` is called with the bound address and the token once requests are
    taken. Raises InputError if it cannot listen there or there is no log at
    `log_path`, LogError if the log cannot be read.
    """
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        raise InputError(
            'serve_inspector runs under trio: anyio.run(..., backend="trio")'
        ) from None
    token = resolve_token(token)
    log, reopen, source = await _open(log_path)
    catalog = Catalog(log, reopen=reopen)
    try:
        config, sockets = _listen(host, port, limits)
    except BaseException:
        await log.close()
        raise
    listening = _listening(sockets.insecure_sockets[0], token)
    stopping = anyio.Event()
    try:
        async with anyio.create_task_group() as outer:
            outer.start_soon(_watch_signals, stopping, outer.cancel_scope)
            app = create_inspector_app(
                catalog,
                token=token,
                source=source,
                limits=limits,
                ping_seconds=ping_seconds,
                stopping=stopping,
            )

            def started() -> None:
                _log.info("inspector.listening", url=listening.url, log=str(log_path))
                if ready is not None:
                    ready(listening)

            await _serve_app(app, config, sockets, stopping, started)
            outer.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise _only(group) from None
    finally:
        for sock in sockets.insecure_sockets:
            sock.close()
        with anyio.CancelScope(shield=True):
            await catalog.log.close()
    _log.info("inspector.stopped")


async def _open(where: str | os.PathLike[str]) -> tuple[EventLog, Reopen | None, str]:
    """The log at `where`, opened to read only; how to open it anew to see what another
    process appended since (None when the open log sees that itself); and what it is."""
    if isinstance(where, str) and is_postgres_url(where):
        # The database shows every worker's appends to one open log.
        shared = await PostgresLog(where, read_only=True).__aenter__()
        return shared, None, describe(shared)
    path = Path(where)
    if await anyio.to_thread.run_sync(path.is_dir):
        directory = JsonlLog(path, read_only=True)

        async def reopen() -> EventLog:
            # A JsonlLog holds what the directory held when it opened.
            return await JsonlLog(path, read_only=True).__aenter__()

        await directory.__aenter__()
        return directory, reopen, describe(directory)
    if not await anyio.to_thread.run_sync(path.is_file):
        raise InputError(f"{path}: no log there (a JsonlLog directory or a SQLite file)")
    if path.suffix == ".jsonl":
        return await _loaded(path), None, f"JSON Lines file {path} (read once)"
    sqlite = await SqliteLog(path, read_only=True).__aenter__()
    return sqlite, None, describe(sqlite)


async def _loaded(path: Path) -> EventLog:
    """A JSON Lines file's events in a log in memory, in the file's order."""
    try:
        read = await anyio.to_thread.run_sync(read_jsonl, path)
    except LogError as exc:
        raise LogError(f"{path}: {exc}") from None
    if read.torn is not None:
        _log.warning("inspector.torn_line", path=str(path), line=read.torn.line)
    log = MemoryLog()
    for envelope in read.events:
        await log.append([envelope], expected_seq=envelope.seq - 1)
    return log
