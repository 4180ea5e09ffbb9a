"""PostgresLog beyond the conformance suite: its schema, a failing database, damaged rows,
group commit, and the SharedLog capability (ownership, fencing, claims, the inbox,
notifications), with two or three logs as workers on one database, really concurrent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

from tests.logs.test_logs import envelope, run
from turnkeeper.core import InputError, LogCorrupt, LogError, SeqError
from turnkeeper.events import MessageQueued, MessageReceived
from turnkeeper.logs import (
    Claim,
    Consumed,
    FenceLost,
    InboxItem,
    PostgresLog,
    SeqConflict,
    SharedLog,
)
from turnkeeper.logs._postgres_schema import VERSION, channel_of
from turnkeeper.logs._postgres_writer import IN_FLIGHT

ROOT = Path(__file__).resolve().parents[2]


def query(url: str, text: str, parameters: tuple[Any, ...] | dict[str, Any] = ()) -> list[Any]:
    """Run one statement on its own connection; its rows (none for a statement without)."""
    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute(text, parameters)
        return cursor.fetchall() if cursor.description is not None else []


async def query_async(url: str, text: str, parameters: tuple[Any, ...] = ()) -> list[Any]:
    return await anyio.to_thread.run_sync(partial(query, url, text, parameters))


async def expire(url: str, log: PostgresLog) -> None:
    """Make the worker look dead to the others, as a paused one would: its heartbeat
    stops and its lease is past."""
    log._stop.set()
    assert log._heartbeat is not None
    await anyio.to_thread.run_sync(log._heartbeat.join)
    await query_async(
        url,
        "UPDATE turnkeeper_workers SET expires = now() - interval '1 second' WHERE id = %s",
        (log._worker,),
    )


async def eventually(check: Callable[[], Awaitable[object]], seconds: float = 60) -> object:
    """What `check` returns once it is truthy, asked every tenth of a second (at most for
    `seconds`, so that a bug fails the test instead of hanging it)."""
    with anyio.fail_after(seconds):
        while True:
            found = await check()
            if found:
                return found
            await anyio.sleep(0.1)


def rows_of(url: str, session_id: str) -> list[tuple[int, int]]:
    """The session's events as stored: (seq, epoch) in seq order."""
    return [
        (seq, epoch)
        for seq, epoch in query(
            url,
            "SELECT seq, epoch FROM turnkeeper_events WHERE session_id = %s ORDER BY seq",
            (session_id,),
        )
    ]


# -- the schema ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_log_makes_its_schema_once_and_workers_opening_at_once_share_it(
    postgres_url: str,
) -> None:
    logs = [PostgresLog(postgres_url, worker_id=f"w{index}") for index in range(4)]
    async with anyio.create_task_group() as group:
        for log in logs:
            group.start_soon(log.sessions)
    assert query(postgres_url, "SELECT version FROM turnkeeper_schema") == [(VERSION,)]
    await logs[0].append(run("s1", 1, 2), expected_seq=0)
    assert await logs[3].read("s1") == run("s1", 1, 2)
    for log in logs:
        await log.close()
    async with PostgresLog(postgres_url) as reopened:
        assert await reopened.read("s1") == run("s1", 1, 2)
    assert query(postgres_url, "SELECT version FROM turnkeeper_schema") == [(VERSION,)]


@pytest.mark.anyio
async def test_a_newer_schema_or_tables_of_another_program_are_refused(
    postgres_url: str,
) -> None:
    async with PostgresLog(postgres_url) as log:
        await log.append(run("s1", 1, 1), expected_seq=0)
    query(postgres_url, "UPDATE turnkeeper_schema SET version = %s", (VERSION + 1,))
    with pytest.raises(LogError, match=f"schema version {VERSION + 1} is not one this"):
        await PostgresLog(postgres_url).sessions()
    query(postgres_url, "DROP TABLE turnkeeper_schema")
    with pytest.raises(LogError, match="has a turnkeeper_events table but no turnkeeper_sch"):
        await PostgresLog(postgres_url).sessions()
    assert query(postgres_url, "SELECT count(*) FROM turnkeeper_events") == [(1,)]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"url": 5}, "url: expected a PostgreSQL URL"),
        ({"url": "host=a port"}, "url: not a PostgreSQL URL or conninfo string"),
        ({"lease": 0}, "lease"),
        ({"lease": float("nan")}, "lease"),
        ({"requery": -1}, "requery"),
        ({"max_connections": 1}, "max_connections"),
        ({"worker_id": ""}, "worker_id: expected a non-empty UTF-8 string"),
        ({"worker_id": "w\udcff"}, "worker_id: expected a non-empty UTF-8 string"),
    ],
)
def test_bad_arguments_raise_input_error_naming_them(
    postgres_url: str, arguments: dict[str, Any], message: str
) -> None:
    given: dict[str, Any] = {"url": postgres_url, **arguments}
    with pytest.raises(InputError, match=message):
        PostgresLog(**given)


def test_the_repr_shows_where_the_log_is_without_the_password() -> None:
    log = PostgresLog("postgresql://alice:secret@127.0.0.1:5433/fleet")
    assert "secret" not in repr(log)
    assert "alice" in repr(log)
    assert "fleet" in repr(log)


# -- a failing database ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_server_that_cannot_be_reached_is_a_log_error(tmp_path: Path) -> None:
    log = PostgresLog(f"host={tmp_path} dbname=none connect_timeout=2")
    with pytest.raises(LogError, match=f"PostgreSQL .*{tmp_path}"):
        await log.sessions()


@pytest.mark.anyio
async def test_connections_the_server_drops_fail_their_work_and_the_log_goes_on(
    postgres_url: str,
) -> None:
    async with PostgresLog(postgres_url) as log:
        await log.append(run("s1", 1, 1), expected_seq=0)
        # Every connection of this schema's logs, the listener's too, is cut.
        kill = """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
            WHERE pid <> pg_backend_pid() AND datname = current_database()
            AND backend_type = 'client backend'"""
        await query_async(postgres_url, kill)
        # Reads go on, on connections made anew.
        assert await log.read("s1") == run("s1", 1, 1)
        # A writer thread's connection is dead: its next round fails, saying that the
        # append may have been logged (a commit cut short cannot tell), then it connects
        # anew. Each writer thread fails at most once.
        failures: list[LogError] = []
        seq = 1
        while seq < 2 + IN_FLIGHT:
            try:
                await log.append([envelope("s1", seq + 1)], expected_seq=seq)
            except LogError as exc:
                failures.append(exc)
                seq = await log.last_seq("s1")
            else:
                seq += 1
        assert len(failures) <= IN_FLIGHT
        for failure in failures:
            assert type(failure) is LogError
            assert "may or may not have been logged" in str(failure)
        assert await log.read("s1") == run("s1", 1, seq)


@pytest.mark.anyio
async def test_a_failing_statement_fails_the_appends_of_its_round_with_a_log_error(
    postgres_url: str,
) -> None:
    async with PostgresLog(postgres_url) as log:
        await log.append(run("s1", 1, 1), expected_seq=0)
        await query_async(postgres_url, "ALTER TABLE turnkeeper_events RENAME TO gone")
        with pytest.raises(LogError, match=r"PostgreSQL .*turnkeeper_events"):
            await log.append([envelope("s1", 2)], expected_seq=1)
        with pytest.raises(LogError, match="turnkeeper_events"):
            await log.read("s1")
        await query_async(postgres_url, "ALTER TABLE gone RENAME TO turnkeeper_events")
        assert await log.last_seq("s1") == 1
        await log.append([envelope("s1", 2)], expected_seq=1)


# -- damaged rows ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "error", "message"),
    [
        (
            "UPDATE turnkeeper_events SET body = 'not json' WHERE seq = 2",
            LogCorrupt,
            "session s1 seq 2: not an event envelope",
        ),
        (
            "UPDATE turnkeeper_events SET body = replace(body, '\"seq\":2', '\"seq\":9') "
            "WHERE seq = 2",
            LogCorrupt,
            "session s1 seq 2: body holds session s1 seq 9 instead",
        ),
        ("DELETE FROM turnkeeper_events WHERE seq = 2", SeqError, "seq 3 leaves a gap"),
    ],
)
@pytest.mark.anyio
async def test_rows_changed_by_hand_are_reported_naming_the_row(
    postgres_url: str, damage: str, error: type[LogError], message: str
) -> None:
    async with PostgresLog(postgres_url) as log:
        await log.append(run("s1", 1, 3), expected_seq=0)
        await query_async(postgres_url, damage)
        with pytest.raises(error, match=message):
            await log.read("s1")
        if error is LogCorrupt:
            with pytest.raises(LogCorrupt, match=message):
                await log.read_all()


@pytest.mark.anyio
async def test_a_body_holding_newlines_by_hand_still_reads_as_the_json_it_is(
    postgres_url: str,
) -> None:
    async with PostgresLog(postgres_url) as log:
        await log.append(run("s1", 1, 3), expected_seq=0)
        await query_async(
            postgres_url,
            "UPDATE turnkeeper_events SET body = replace(body, ',', E',\\n') WHERE seq = 2",
        )
        assert await log.read("s1") == run("s1", 1, 3)
        assert [e for _, e in await log.read_all()] == run("s1", 1, 3)


@pytest.mark.anyio
async def test_an_events_table_ahead_of_the_sessions_table_fails_the_round_as_corrupt(
    postgres_url: str,
) -> None:
    async with PostgresLog(postgres_url) as log:
        await log.append(run("s1", 1, 2), expected_seq=0)
        await query_async(postgres_url, "UPDATE turnkeeper_sessions SET last_seq = 1")
        with pytest.raises(LogCorrupt, match="events table holds seqs past"):
            await log.append([envelope("s1", 2)], expected_seq=1)


# -- group commit and durability -------------------------------------------------------------


@pytest.mark.anyio
async def test_appends_that_arrive_together_share_rounds_and_a_notification_each(
    postgres_url: str,
) -> None:
    async with PostgresLog(postgres_url) as log:
        await log.sessions()
        with psycopg.connect(postgres_url, autocommit=True) as listening:
            channel = channel_of(listening)
            listening.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            async with anyio.create_task_group() as group:
                for index in range(100):
                    group.start_soon(partial(log.append, run(f"s{index}", 1, 2), expected_seq=0))
            notes = list(listening.notifies(timeout=1.0))
        assert 1 <= log.commits < 100
        # One notification per round, naming the round's sessions.
        assert len(notes) == log.commits
        named = {session for note in notes for session in json.loads(note.payload)["s"]}
        assert named == {f"s{index}" for index in range(100)}


@pytest.mark.anyio
async def test_a_rounds_rows_and_outcomes_are_stored_as_given(postgres_url: str) -> None:
    # The writer packs a round's arrays itself: every column as the envelope has it, text
    # that is not ASCII, an empty outcome beside a NULL one, in rounds of several appends.
    sessions = ["s-plain", "s-café ☕", "s-" + "x" * 300]
    async with (
        PostgresLog(postgres_url, worker_id="a") as a,
        PostgresLog(postgres_url, worker_id="b") as b,
    ):
        await a.sessions()
        appended = {
            session_id: [
                envelope(session_id, 1, at=1_800_000_000.123456 + index),
                envelope(session_id, 2, MessageQueued(text="é"), at=0.5 + index),
            ]
            for index, session_id in enumerate(sessions)
        }
        async with anyio.create_task_group() as group:
            for events in appended.values():
                group.start_soon(partial(a.append, events, expected_seq=0))
        items = [
            (await b.post(session_id, "cancel", {"n": index})).item
            for index, session_id in enumerate(sessions)
        ]
        outcomes = [None, "", "refusé: déjà fini"]
        async with anyio.create_task_group() as group:
            for item, outcome in zip(items, outcomes, strict=True):
                group.start_soon(partial(a.consume, item, expected_seq=2, outcome=outcome))
        for item, outcome in zip(items, outcomes, strict=True):
            assert await b.outcome(item.id) == Consumed(item.id, 1, outcome)
        for session_id, events in appended.items():
            stored = query(
                postgres_url,
                "SELECT seq, epoch, at, type FROM turnkeeper_events WHERE session_id = %s "
                "ORDER BY seq",
                (session_id,),
            )
            assert stored == [(event.seq, 1, event.at, event.type) for event in events]
            assert {type_ for _, _, _, type_ in stored} == {
                "local.user_message",
                "local.message_queued",
            }
            assert await b.read(session_id) == events


@pytest.mark.anyio
async def test_racing_writers_of_many_sessions_keep_each_sessions_positions_in_seq_order(
    postgres_url: str,
) -> None:
    sessions = [f"s{index:02d}" for index in range(20)]
    written: dict[str, int] = dict.fromkeys(sessions, 0)

    async def writer(log: PostgresLog, session_id: str) -> None:
        done = 0
        while done < 5:
            seq = await log.last_seq(session_id)
            try:
                await log.append([envelope(session_id, seq + 1)], expected_seq=seq)
            except SeqConflict:
                continue
            done += 1
            written[session_id] += 1

    async with PostgresLog(postgres_url) as log:
        async with anyio.create_task_group() as group:
            for session_id in sessions:
                for _ in range(3):
                    group.start_soon(writer, log, session_id)
        assert set(written.values()) == {15}
        everything = await log.read_all()
        for session_id in sessions:
            assert await log.read(session_id) == run(session_id, 1, 15)
            assert [e.seq for _, e in everything if e.session_id == session_id] == list(
                range(1, 16)
            )
        positions = [position for position, _ in everything]
        assert positions == list(range(1, 20 * 15 + 1))


@pytest.mark.anyio
async def test_commits_are_flushed_whatever_the_servers_default(postgres_url: str) -> None:
    schema = schema_of(postgres_url)
    options = f"-c search_path={schema} -c synchronous_commit=off"
    lax = psycopg.conninfo.make_conninfo(postgres_url, options=options)
    async with PostgresLog(lax) as log:
        await log.append(run("s1", 1, 1), expected_seq=0)
        with log._pool.connection() as connection:
            assert connection.execute("SHOW synchronous_commit").fetchone() == ("on",)
            assert connection.execute("SELECT current_schema()").fetchone() == (schema,)


def schema_of(url: str) -> str:
    row = query(url, "SELECT current_schema()")
    name: str = row[0][0]
    return name


# -- ownership and fencing -------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_session_belongs_to_the_worker_that_made_it_and_others_are_fenced_out(
    postgres_url: str,
) -> None:
    async with (
        PostgresLog(postgres_url, worker_id="a") as a,
        PostgresLog(postgres_url, worker_id="b") as b,
    ):
        assert isinstance(a, SharedLog)
        await a.append(run("s1", 1, 2), expected_seq=0)
        assert a.epoch("s1") == 1
        assert a.held() == {"s1": 1}
        with pytest.raises(FenceLost, match=r"session s1: .*without a claim, but worker a owns"):
            await b.append([envelope("s1", 3)], expected_seq=2)
        assert await b.claim_session("s1") is None
        assert b.held() == {}
        assert b.fence_losses == 1
        # Another worker reads it all the same, and a appends on.
        assert await b.read("s1") == run("s1", 1, 2)
        await a.append([envelope("s1", 3)], expected_seq=2)
        assert await a.claim_session("s1") == Claim("s1", 1, 3)
    assert rows_of(postgres_url, "s1") == [(1, 1), (2, 1), (3, 1)]


@pytest.mark.anyio
async def test_a_stale_owners_appends_write_nothing_once_its_session_has_moved(
    postgres_url: str,
) -> None:
    async with (
        PostgresLog(postgres_url, worker_id="a") as a,
        PostgresLog(postgres_url, worker_id="b") as b,
    ):
        await a.append(run("s1", 1, 2), expected_seq=0)
        await expire(postgres_url, a)
        claims = await b.claim()
        assert claims == [Claim("s1", 2, 2, taken_from="a")]
        assert b.takeovers == 1
        with pytest.raises(FenceLost, match=r"wrote at epoch 1, but worker b owns it \(epoch 2\)"):
            await a.append([envelope("s1", 3)], expected_seq=2)
        assert a.epoch("s1") is None
        # Lost for good: not even claimed back by an append, until claimed again.
        with pytest.raises(FenceLost):
            await a.append([envelope("s1", 3)], expected_seq=2)
        assert a.fence_losses == 2
        await b.append([envelope("s1", 3)], expected_seq=2)
        assert rows_of(postgres_url, "s1") == [(1, 1), (2, 1), (3, 2)]


def start_worker(url: str, worker_id: str, *, lease: float) -> subprocess.Popen[str]:
    """A worker process (tests/logs/postgres_worker.py) on the log at `url`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.logs.postgres_worker", url, worker_id, str(lease)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.anyio
async def test_a_worker_paused_past_its_lease_writes_nothing_when_it_resumes(
    postgres_url: str,
) -> None:
    worker = start_worker(postgres_url, "paused", lease=1.0)
    assert worker.stdin is not None
    assert worker.stdout is not None
    stdin, stdout = worker.stdin, worker.stdout

    async def ask(line: str) -> str:
        stdin.write(line + "\n")
        stdin.flush()
        return (await anyio.to_thread.run_sync(stdout.readline)).strip()

    try:
        assert (await anyio.to_thread.run_sync(stdout.readline)).strip() == "ready"
        assert await ask("append s1 0") == "ok 1"
        os.kill(worker.pid, signal.SIGSTOP)
        async with PostgresLog(postgres_url, worker_id="b") as b:
            claim = await eventually(partial(b.claim_session, "s1"))
            assert claim == Claim("s1", 2, 1, taken_from="paused")
            await b.append([envelope("s1", 2)], expected_seq=1)
            os.kill(worker.pid, signal.SIGCONT)
            answer = await ask("append s1 2")
            assert answer.startswith("error FenceLost: session s1: this worker wrote at epoch 1")
            assert await ask("append s1 1") == answer
            assert await b.read("s1") == [
                envelope("s1", 1, MessageReceived(text="paused wrote s1#1")),
                envelope("s1", 2),
            ]
        assert rows_of(postgres_url, "s1") == [(1, 1), (2, 2)]
        stdin.write("quit\n")
        stdin.flush()
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
        stdin.close()
        stdout.close()
        worker.wait()


@pytest.mark.anyio
async def test_a_worker_resumed_after_a_lapse_lets_go_of_the_sessions_taken_meanwhile(
    postgres_url: str,
) -> None:
    worker = start_worker(postgres_url, "paused", lease=1.0)
    assert worker.stdin is not None
    assert worker.stdout is not None
    stdin, stdout = worker.stdin, worker.stdout

    async def ask(line: str) -> str:
        stdin.write(line + "\n")
        stdin.flush()
        return (await anyio.to_thread.run_sync(stdout.readline)).strip()

    async def renewed() -> dict[str, int] | None:
        _, lease_held, held = (await ask("held")).split(" ", 2)
        found: dict[str, int] = json.loads(held)
        return found if json.loads(lease_held) else None

    try:
        assert (await anyio.to_thread.run_sync(stdout.readline)).strip() == "ready"
        assert await ask("append taken 0") == "ok 1"
        assert await ask("append kept 0") == "ok 1"
        os.kill(worker.pid, signal.SIGSTOP)
        async with PostgresLog(postgres_url, worker_id="b") as b:
            # Only one of its sessions moves while it is paused.
            claim = await eventually(partial(b.claim_session, "taken"))
            assert claim == Claim("taken", 2, 1, taken_from="paused")
            os.kill(worker.pid, signal.SIGCONT)
            # Once its lease is held again, it holds only what is still its own...
            assert await eventually(renewed) == {"kept": 1}
            # ...and a write of the other is fenced out without reaching the database.
            answer = await ask("append taken 1")
            assert answer == (
                "error FenceLost: session taken: this worker wrote at epoch 1, but worker b "
                "owns it (epoch 2): nothing was written"
            )
            assert await ask("append kept 1") == "ok 1"
            assert b.fence_losses == 0
        assert rows_of(postgres_url, "taken") == [(1, 1)]
        assert rows_of(postgres_url, "kept") == [(1, 1), (2, 1)]
        stdin.write("quit\n")
        stdin.flush()
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
        stdin.close()
        stdout.close()
        worker.wait()


@pytest.mark.anyio
async def test_two_workers_scanning_at_once_each_take_a_dead_workers_session_once(
    postgres_url: str,
) -> None:
    sessions = [f"s{index:02d}" for index in range(60)]
    async with (
        PostgresLog(postgres_url, worker_id="dead") as dead,
        PostgresLog(postgres_url, worker_id="b") as b,
        PostgresLog(postgres_url, worker_id="c") as c,
    ):
        for session_id in sessions:
            await dead.append(run(session_id, 1, 1), expected_seq=0)
        await expire(postgres_url, dead)
        taken: dict[str, list[Claim]] = {"b": [], "c": []}

        async def scan(log: PostgresLog) -> None:
            while claims := await log.claim(limit=7):
                taken[log.worker_id].extend(claims)

        async with anyio.create_task_group() as group:
            group.start_soon(scan, b)
            group.start_soon(scan, c)
        claimed = [claim.session_id for claims in taken.values() for claim in claims]
        assert sorted(claimed) == sessions
        assert all(claim.epoch == 2 for claims in taken.values() for claim in claims)
        assert set(b.held()) | set(c.held()) == set(sessions)
        assert not set(b.held()) & set(c.held())
        assert b.takeovers + c.takeovers == 60
        owners = query(
            postgres_url,
            "SELECT w.name, count(*) FROM turnkeeper_sessions t "
            "JOIN turnkeeper_workers w ON w.id = t.owner GROUP BY w.name",
        )
        assert dict(owners) == {name: len(claims) for name, claims in taken.items() if claims}


@pytest.mark.anyio
async def test_a_graceful_stop_releases_sessions_and_active_ones_are_taken_at_once(
    postgres_url: str,
) -> None:
    async with PostgresLog(postgres_url, worker_id="b") as b:
        async with PostgresLog(postgres_url, worker_id="a") as a:
            for session_id in ("busy", "idle", "kept"):
                await a.append(run(session_id, 1, 1), expected_seq=0)
            assert await a.release(["idle"], active=False) == ["idle"]
            assert a.held() == {"busy": 1, "kept": 1}
            assert await a.release(["not-mine"]) == []
            # The worker holding them is alive: nothing to take.
            assert await b.claim() == []
        # Closed: what it still held is released active, and its worker row is gone.
        assert query(postgres_url, "SELECT name FROM turnkeeper_workers") == [("b",)]
        claims = await b.claim()
        assert sorted(claims, key=lambda claim: claim.session_id) == [
            Claim("busy", 2, 1),
            Claim("kept", 2, 1),
        ]
        assert b.takeovers == 0
        # The session at rest is claimed when a request comes for it.
        assert await b.claim_session("idle") == Claim("idle", 2, 1)
        assert await b.claim_session("new") == Claim("new", 0, 0)
        assert b.epoch("new") is None
        await b.append([envelope("new", 1)], expected_seq=0)
        assert b.epoch("new") == 1


@pytest.mark.anyio
async def test_the_lease_is_renewed_on_the_database_clock_and_lost_when_heartbeats_stop(
    postgres_url: str,
) -> None:
    async with PostgresLog(postgres_url, worker_id="a", lease=1.0) as a:
        assert a.lease_held
        await anyio.sleep(1.5)
        assert a.lease_held
        [(live,)] = await query_async(
            postgres_url, "SELECT expires > now() FROM turnkeeper_workers WHERE name = 'a'"
        )
        assert live
        a._stop.set()
        await anyio.sleep(1.0)
        assert not a.lease_held


@pytest.mark.anyio
async def test_a_worker_taken_for_dead_and_forgotten_registers_again_and_is_fenced(
    postgres_url: str,
) -> None:
    async with PostgresLog(postgres_url, worker_id="a", lease=0.4) as a:
        await a.append(run("s1", 1, 1), expected_seq=0)
        await query_async(postgres_url, "DELETE FROM turnkeeper_workers")
        await eventually(partial(query_async, postgres_url, "SELECT id FROM turnkeeper_workers"))
        assert a.lease_held
        with pytest.raises(FenceLost, match="but no worker owns it"):
            await a.append([envelope("s1", 2)], expected_seq=1)
        assert await a.claim_session("s1") == Claim("s1", 2, 1)
        await a.append([envelope("s1", 2)], expected_seq=1)
    assert rows_of(postgres_url, "s1") == [(1, 1), (2, 2)]


@pytest.mark.anyio
async def test_a_read_only_log_is_no_worker_and_refuses_writes(postgres_url: str) -> None:
    async with PostgresLog(postgres_url) as writer:
        await writer.append(run("s1", 1, 1), expected_seq=0)
        async with PostgresLog(postgres_url, read_only=True) as reader:
            assert not reader.writable
            assert not reader.lease_held
            assert await reader.read("s1") == run("s1", 1, 1)
            for write in (
                reader.append([envelope("s1", 2)], expected_seq=1),
                reader.claim(),
                reader.claim_session("s1"),
                reader.release(),
                reader.wait_for_inbox(0),
            ):
                with pytest.raises(LogError, match="this log only reads: it was opened read_only"):
                    await write
        assert query(postgres_url, "SELECT count(*) FROM turnkeeper_workers") == [(1,)]


# -- the inbox -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_request_posted_on_another_worker_is_consumed_once_by_the_owner(
    postgres_url: str,
) -> None:
    async with (
        PostgresLog(postgres_url, worker_id="a") as a,
        PostgresLog(postgres_url, worker_id="b") as b,
    ):
        await a.append(run("s1", 1, 1), expected_seq=0)
        woken = anyio.Event()

        async def owner_waits() -> None:
            assert await a.wait_for_inbox(30)
            woken.set()

        async with anyio.create_task_group() as group:
            group.start_soon(owner_waits)
            posted = await b.post("s1", "message", {"text": "hi"}, request_id="r-1")
            await woken.wait()
        assert not posted.duplicate
        assert posted.item.payload == {"text": "hi"}
        [item] = await a.inbox()
        assert item == posted.item
        assert await b.inbox("s1") == [item]
        again = await b.post("s1", "message", {"text": "hi"}, request_id="r-1")
        assert again.duplicate
        assert again.item.id == item.id
        with pytest.raises(InputError, match="request_id 'r-1': already used for another"):
            await b.post("s1", "message", {"text": "other"}, request_id="r-1")
        assert await b.outcome(item.id) is None

        queued = envelope("s1", 2, MessageQueued(text="hi"))
        await a.consume(item, [queued], expected_seq=1)
        assert await a.inbox() == []
        assert await b.outcome(item.id) == Consumed(item.id, 1, None)
        assert await b.read("s1", after=1) == [queued]
        with pytest.raises(LogError, match=f"inbox items {item.id}: one is consumed already"):
            await a.consume(item, [envelope("s1", 3)], expected_seq=2)
        assert await a.last_seq("s1") == 2
        # After its consumption, its request id still says it was posted.
        assert (await b.post("s1", "message", {"text": "hi"}, request_id="r-1")).duplicate
    assert query(postgres_url, "SELECT inbox_pending FROM turnkeeper_sessions") == [(0,)]


@pytest.mark.anyio
async def test_an_inbox_item_is_consumed_only_under_the_current_epoch(
    postgres_url: str,
) -> None:
    async with (
        PostgresLog(postgres_url, worker_id="a") as a,
        PostgresLog(postgres_url, worker_id="b") as b,
    ):
        await a.append(run("s1", 1, 1), expected_seq=0)
        posted = await b.post("s1", "cancel", {"reason": "stop"})
        [item] = await a.inbox("s1")
        with pytest.raises(SeqConflict):
            await a.consume(item, expected_seq=0, outcome="refused")
        await expire(postgres_url, a)
        assert [claim.session_id for claim in await b.claim()] == ["s1"]
        with pytest.raises(FenceLost):
            await a.consume(item, [envelope("s1", 2)], expected_seq=1)
        assert await b.inbox() == [posted.item]
        await b.consume(item, expected_seq=1, outcome="already finished")
        assert await a.outcome(item.id) == Consumed(item.id, 2, "already finished")
        assert rows_of(postgres_url, "s1") == [(1, 1)]


@pytest.mark.anyio
async def test_an_inbox_item_for_a_session_at_rest_makes_it_claimable(
    postgres_url: str,
) -> None:
    async with (
        PostgresLog(postgres_url, worker_id="a") as a,
        PostgresLog(postgres_url, worker_id="b") as b,
    ):
        await a.append(run("s1", 1, 1), expected_seq=0)
        await a.release(active=False)
        assert await b.claim() == []
        await a.post("s1", "message", {"text": "later"})
        assert await b.claim() == [Claim("s1", 2, 1)]
        [item] = await b.inbox()
        assert item.kind == "message"


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"session_id": ""}, LogError, "session_id must be a non-empty string"),
        ({"kind": ""}, InputError, "kind: expected a non-empty UTF-8 string"),
        ({"kind": 3}, InputError, "kind: expected"),
        ({"request_id": ""}, InputError, "request_id: expected"),
        ({"request_id": "r\udcff"}, InputError, "request_id: expected"),
        ({"payload": object()}, InputError, "payload: cannot be JSON"),
        ({"payload": "\ud800"}, InputError, "payload: "),
    ],
)
@pytest.mark.anyio
async def test_bad_posts_raise_a_clear_error_and_post_nothing(
    postgres_url: str, arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    given: dict[str, Any] = {"session_id": "s1", "kind": "message", "payload": {}, **arguments}
    async with PostgresLog(postgres_url) as log:
        with pytest.raises(error, match=message):
            await log.post(
                given["session_id"],
                given["kind"],
                given["payload"],
                request_id=given.get("request_id"),
            )
        assert await log.inbox("s1") == []


@pytest.mark.anyio
async def test_consuming_checks_its_item_and_events(postgres_url: str) -> None:
    async with PostgresLog(postgres_url) as log:
        await log.append(run("s1", 1, 1), expected_seq=0)
        await log.append(run("s2", 1, 1), expected_seq=0)
        posted = await log.post("s1", "message", {"text": "x"})
        with pytest.raises(LogError, match="its events must be too, not s2's"):
            await log.consume(posted.item, [envelope("s2", 2)], expected_seq=1)
        forged = InboxItem(posted.item.id, "s2", "message", {}, None, 0.0)
        with pytest.raises(LogError, match="one is consumed already or is not this session's"):
            await log.consume(forged, [envelope("s2", 2)], expected_seq=1)
        with pytest.raises(LogError, match="expected_seq must be an int >= 0"):
            await log.consume(posted.item, expected_seq=-1)
        with pytest.raises(LogError, match="no inbox item 999"):
            await log.outcome(999)
        assert await log.last_seq("s2") == 1
        assert await log.inbox("s1") == [posted.item]


# -- waiting -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_waiter_on_another_worker_wakes_when_the_owner_commits(
    postgres_url: str,
) -> None:
    async with (
        PostgresLog(postgres_url, worker_id="a") as a,
        PostgresLog(postgres_url, worker_id="b", requery=3600) as b,
    ):
        await a.append(run("s1", 1, 1), expected_seq=0)
        assert await b.wait_for_events("s1", after=0, timeout=0)
        assert not await b.wait_for_events("s1", after=1, timeout=0)
        results: list[bool] = []

        async def waits() -> None:
            results.append(await b.wait_for_events("s1", after=1, timeout=60))

        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(waits)
            await anyio.sleep(0.2)
            await a.append([envelope("s1", 2)], expected_seq=1)
        assert results == [True, True, True]
        assert not await b.wait_for_events("s1", after=2, timeout=0.1)


@pytest.mark.anyio
async def test_a_waiter_wakes_by_re_querying_when_no_notification_comes(
    postgres_url: str,
) -> None:
    async with PostgresLog(postgres_url, worker_id="b", requery=0.2) as b:
        async with PostgresLog(postgres_url, worker_id="a") as a:
            await a.append(run("s1", 1, 1), expected_seq=0)
        woke: list[bool] = []

        async def waits() -> None:
            woke.append(await b.wait_for_events("s1", after=1, timeout=60))

        async with anyio.create_task_group() as group:
            group.start_soon(waits)
            await anyio.sleep(0.1)
            # A change that sends no notification, as if the notification were lost.
            await query_async(postgres_url, "UPDATE turnkeeper_sessions SET last_seq = 2")
        assert woke == [True]


@pytest.mark.anyio
async def test_a_listener_whose_connection_is_killed_listens_again(postgres_url: str) -> None:
    async with (
        PostgresLog(postgres_url, worker_id="a") as a,
        PostgresLog(postgres_url, worker_id="b", requery=3600) as b,
    ):
        await a.append(run("s1", 1, 1), expected_seq=0)
        kill = """SELECT pg_terminate_backend(pid) FROM pg_stat_activity
            WHERE query LIKE 'LISTEN %%' AND pid <> pg_backend_pid()"""
        assert await query_async(postgres_url, kill)
        listening = "SELECT 1 FROM pg_stat_activity WHERE query LIKE 'LISTEN %%'"
        await eventually(partial(query_async, postgres_url, listening))
        woke: list[bool] = []

        async def waits() -> None:
            woke.append(await b.wait_for_events("s1", after=1, timeout=60))

        async with anyio.create_task_group() as group:
            group.start_soon(waits)
            await anyio.sleep(0.2)
            await a.append([envelope("s1", 2)], expected_seq=1)
        assert woke == [True]


@pytest.mark.anyio
async def test_a_poster_waits_for_the_outcome_of_its_request(postgres_url: str) -> None:
    async with (
        PostgresLog(postgres_url, worker_id="a") as a,
        PostgresLog(postgres_url, worker_id="b", requery=3600) as b,
    ):
        await a.append(run("s1", 1, 1), expected_seq=0)
        posted = await b.post("s1", "tool_results", {"results": []})
        outcomes: list[Consumed | None] = []

        async def waits() -> None:
            outcomes.append(await b.outcome(posted.item.id, wait=60))

        async with anyio.create_task_group() as group:
            group.start_soon(waits)
            assert await a.wait_for_inbox(60)
            [item] = await a.inbox()
            await a.consume(item, expected_seq=1, outcome="not waiting for tool results")
        assert outcomes == [Consumed(item.id, 1, "not waiting for tool results")]
        assert await b.outcome(item.id, wait=0.05) == outcomes[0]
        assert not await a.wait_for_inbox(0.05)
