"""A session its log cannot rebuild is quarantined: on real SQLite files and JsonlLog
directories damaged each way (no events left, a gap in the seqs, a row that does not
decode, a row that does not replay), a Host starts, shows that session as "unreadable"
with why (logged once), refuses every action on it, counts it apart, and every other
session of the log recovers and runs."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tests.sessions.host_worker import SPEC, answer_for, prompt_for, settle, step_tool, stepper
from turnkeeper.core import InputError
from turnkeeper.logs import EventLog, JsonlLog, SqliteLog
from turnkeeper.sessions import Host, SessionUnreadable

pytestmark = pytest.mark.anyio

NAMES = ("good", "damaged", "also-good")
STEPS = 2


def open_log(path: Path) -> EventLog:
    return SqliteLog(path) if path.suffix == ".sqlite" else JsonlLog(path)


async def make_log(path: Path, names: Sequence[str] = NAMES) -> None:
    """Finished sessions of STEPS steps each, one of each name."""
    async with open_log(path) as log, Host(chat=stepper(), log=log, tools=step_tool()) as host:
        for name in names:
            await host.start(SPEC, prompt_for(STEPS, name), session_id=name)
            await settle(host, name)


def sqlite_damage(kind: str, session_id: str = "damaged") -> Callable[[Path], None]:
    """Damage one session of a SQLite log file the `kind` way, as byte damage or a hand
    edit could."""
    where = f"WHERE session_id = '{session_id}'"
    statements = {
        "no_events": f"DELETE FROM events {where}",
        "gap": f"DELETE FROM events {where} AND seq = 3",
        "bad_row": f"UPDATE events SET body = x'7b' {where} AND seq = 2",
        # Its second row opens the session again (the first row's body, decoding fine).
        "no_replay": "UPDATE events SET type = 'local.session_opened', body = (SELECT body "
        f"FROM events {where} AND seq = 1) {where} AND seq = 2",
    }

    def damage(path: Path) -> None:
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute(statements[kind])
        connection.close()

    return damage


def jsonl_damage(kind: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        file = path / "damaged.jsonl"
        lines = file.read_bytes().splitlines()
        if kind == "no_events":
            lines = []
        elif kind == "gap":
            del lines[2]
        elif kind == "bad_row":
            lines[1] = b"{"
        else:
            opened = json.loads(lines[0])
            lines[1] = json.dumps({**opened, "seq": 2}).encode()
        file.write_bytes(b"".join(line + b"\n" for line in lines))

    return damage


KINDS = ("no_events", "gap", "bad_row", "no_replay")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
async def test_a_host_quarantines_the_damaged_session_and_runs_the_others(
    tmp_path: Path, backend: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / ("log.sqlite" if backend == "sqlite" else "log")
    await make_log(path)
    (sqlite_damage if backend == "sqlite" else jsonl_damage)(kind)(path)
    caplog.set_level(logging.ERROR, logger="turnkeeper.host")

    async with open_log(path) as log, Host(chat=stepper(), log=log, tools=step_tool()) as host:
        info = await host.status("damaged")
        assert (info.status, info.seq, info.pending) == ("unreadable", 0, ())
        assert info.error is not None
        assert "damaged" in info.error
        for call in (
            host.send("damaged", "hello"),
            host.cancel("damaged"),
            host.retry("damaged"),
            host.events("damaged"),
        ):
            with pytest.raises(SessionUnreadable, match="session damaged cannot be rebuilt"):
                await call
        with pytest.raises(InputError, match="already exists"):
            await host.start(SPEC, "again", session_id="damaged")
        assert await host.statuses() == {"idle": 2, "unreadable": 1}
        # The others recover and run on.
        for name in ("good", "also-good"):
            await host.send(name, prompt_for(1, name))
            assert (await settle(host, name)).text == answer_for(1)
        assert (await host.status("damaged")).status == "unreadable"

    said = [
        json.loads(record.getMessage())
        for record in caplog.records
        if record.name == "turnkeeper.host" and "session.unreadable" in record.getMessage()
    ]
    assert [line["session_id"] for line in said] == ["damaged"]
