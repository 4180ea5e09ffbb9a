"""`serve`: the HTTP API and a Host in one trio task tree, served by hypercorn."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from functools import partial
from typing import cast

import anyio
import msgspec
import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.typing import ASGIFramework
from hypercorn.utils import wrap_app
from starlette.applications import Starlette

from turnkeeper.core import InputError
from turnkeeper.logs import EventLog, PostgresLog, SqliteLog, is_postgres_url
from turnkeeper.service._app import create_app
from turnkeeper.service._auth import resolve_token
from turnkeeper.service._limits import DEFAULT_LIMITS, Limits
from turnkeeper.service._logging import log as _log
from turnkeeper.sessions import Chat, FleetHost, Host, Tools

# Orchestrators open many connections at once; hypercorn's default backlog is 100.
_BACKLOG = 1024


class Listening(msgspec.Struct, frozen=True):
    """Where the service listens (the bound port, when 0 was asked for) and its token."""

    url: str
    host: str
    port: int
    token: str


async def serve(
    *,
    chat: Chat,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_path: str | os.PathLike[str] = "turnkeeper.sqlite",
    tools: Tools | None = None,
    token: str | None = None,
    limits: Limits = DEFAULT_LIMITS,
    ping_seconds: float = 15.0,
    ready: Callable[[Listening], object] | None = None,
    worker_id: str | None = None,
    lease: float = 10.0,
) -> None:
    """Serve the HTTP API on `host`:`port` until SIGINT or SIGTERM, with sessions run by
    a Host on `chat` and `tools` and logged to the SQLite file `log_path` (unfinished
    sessions in it resume). Run it under trio: `anyio.run(partial(serve, ...), backend="trio")`.

    With a PostgreSQL URL as `log_path` (`postgresql://...`), it is one worker of a fleet
    on that database: a FleetHost on a PostgresLog named `worker_id` (default: host name
    and process id) holding a lease of `lease` seconds (see docs/postgres.md).

    `token` defaults to the TURNKEEPER_TOKEN environment variable, else a new random
    one; `ready` is called with the bound address and the token once requests are taken.
    On the first signal: stop taking connections, end long-polls and event streams,
    finish requests in flight, stop the Host gracefully and close the log; a second
    signal cancels what is left. Raises InputError if it cannot listen there, LogError
    if the log cannot be opened.
    """
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        raise InputError('serve runs under trio: anyio.run(..., backend="trio")') from None
    token = resolve_token(token)
    config, sockets = _listen(host, port, limits)
    listening = _listening(sockets.insecure_sockets[0], token)
    stopping = anyio.Event()
    try:
        async with _open_log(log_path, worker_id, lease) as log, anyio.create_task_group() as outer:
            outer.start_soon(_watch_signals, stopping, outer.cancel_scope)
            async with _host_on(log, chat, tools) as runtime:
                app = create_app(
                    runtime,
                    token=token,
                    limits=limits,
                    ping_seconds=ping_seconds,
                    stopping=stopping,
                )

                def started() -> None:
                    _log.info("service.listening", url=listening.url)
                    if ready is not None:
                        ready(listening)

                await _serve_app(app, config, sockets, stopping, started)
                _log.info("service.stopping_host")
            outer.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The task groups wrap what the log or the Host raised (at start-up: a table
        # missing, a session that cannot be read back): raised as itself, it is the error
        # a caller looks for, and the CLI prints it as one line.
        raise _only(group) from None
    finally:
        for sock in sockets.insecure_sockets:
            sock.close()
    _log.info("service.stopped")


def _open_log(log_path: str | os.PathLike[str], worker_id: str | None, lease: float) -> EventLog:
    """The log `serve` runs on: a PostgresLog for a PostgreSQL URL, else a SqliteLog."""
    name = os.fspath(log_path)
    if isinstance(name, str) and is_postgres_url(name):
        return PostgresLog(name, worker_id=worker_id, lease=lease)
    return SqliteLog(log_path)


def _host_on(log: EventLog, chat: Chat, tools: Tools | None) -> Host:
    """A Host on `log`: one worker of a fleet on a log many share."""
    if isinstance(log, PostgresLog):
        return FleetHost(chat=chat, log=log, tools=tools)
    return Host(chat=chat, log=log, tools=tools)


def _only(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside `group` and the groups it holds; `group` if it holds more."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    return group if isinstance(inner, BaseExceptionGroup) else inner


async def _serve_app(
    app: Starlette,
    config: Config,
    sockets: Sockets,
    stopping: anyio.Event,
    started: Callable[[], None],
) -> None:
    """Serve `app` on `sockets` until `stopping` is set, calling `started` once it listens."""
    # Starlette's app type and hypercorn's ASGI type differ only in annotations.
    framework = cast(ASGIFramework, app)
    async with anyio.create_task_group() as server:
        await server.start(
            partial(
                worker_serve,
                wrap_app(framework, config.wsgi_max_body_size, "asgi"),
                config,
                sockets=sockets,
                shutdown_trigger=stopping.wait,
            )
        )
        started()


def _listen(host: str, port: int, limits: Limits) -> tuple[Config, Sockets]:
    """A hypercorn config and its bound, listening socket; InputError if it cannot bind."""
    if not isinstance(limits, Limits):
        raise InputError(f"limits: expected Limits, got {type(limits).__name__}")
    if not isinstance(host, str) or not host:
        raise InputError(f"host: expected an address, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InputError(f"port: expected 0 to 65535, got {port!r}")
    config = Config()
    # Hypercorn's keep-alive timer runs from a connection's start, or its last response's
    # end, until a request's headers are in, and data arriving does not restart it: so it
    # is the header timeout too. It does not run while a request is served. (Its
    # read_timeout ends a connection on any silence from the client, so it would cut
    # long-polls and event streams, whose clients send nothing while they wait.) Clients
    # keep idle connections pooled for less than the default (httpx: 5 s), so none sends
    # on one being closed here.
    config.keep_alive_timeout = limits.header_timeout_seconds
    # Bound here rather than by hypercorn, which leaks the socket when the bind fails.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return config, Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])


def _listening(sock: socket.socket, token: str) -> Listening:
    address, port = sock.getsockname()[:2]
    shown = f"[{address}]" if ":" in address else address
    return Listening(url=f"http://{shown}:{port}", host=address, port=port, token=token)


async def _watch_signals(stopping: anyio.Event, scope: anyio.CancelScope) -> None:
    """The first SIGINT/SIGTERM starts a graceful stop; a second one cancels `scope`."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            _log.info("service.signal", signal=signal.Signals(signum).name)
            if stopping.is_set():
                scope.cancel()
                return
            stopping.set()
