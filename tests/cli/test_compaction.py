"""The command line on a log holding summaries of older turns: `turnkeeper replay` shows
the compacted history and re-checks it under other guards without calling a model, and
`turnkeeper check` finds it sound."""

from __future__ import annotations

from pathlib import Path

import anyio

from tests.cli.test_main import cli
from tests.sessions.test_compaction import SPEC, Ledger, step
from turnkeeper import run, write_jsonl


def test_replay_and_check_take_a_compacted_log(tmp_path: Path) -> None:
    result = anyio.run(lambda: run(SPEC, "take 8 steps", Ledger(), tools={"step": step}))
    summaries = [e for e in result.events if e.type == "local.compacted"]
    assert summaries
    path = tmp_path / "compacted.jsonl"
    write_jsonl(path, result.events)

    plain = cli("replay", str(path), cwd=tmp_path)
    assert plain.code == 0, plain.err
    lines = plain.out.splitlines()
    assert lines[2].startswith("user: Summary of the conversation so far: The user wants steps")
    assert lines[3] == "user: take 8 steps"
    assert "answer: finished 8 steps" in lines

    for guards in ('{"loop": null}', '{"duplicates": null, "repair": null}'):
        same = cli("replay", str(path), "--guards", guards, cwd=tmp_path)
        assert same.code == 0, same.err
        assert same.out.splitlines()[-1] == (
            "under the given guards: the same outcome at every poll"
        )

    checked = cli("check", str(path), cwd=tmp_path)
    assert checked.code == 0, checked.err
    assert "1 session: 1 sound, 0 damaged" in checked.out
