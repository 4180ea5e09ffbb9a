"""The import-linter contracts in pyproject.toml: the source keeps every one, and each one
breaks on a deliberate violation written into a copy of the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
# A lint takes about a second; this is only there so a hang fails instead of waiting.
LIMIT = 120


def contracts() -> list[dict[str, Any]]:
    config: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())
    found: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return found


def never_cases() -> list[tuple[str, str, str]]:
    """Each "never" contract, broken by its source importing what it must not."""
    return [
        (c["id"], c["source_modules"][0], c["forbidden_modules"][0])
        for c in contracts()
        if c["id"].startswith("never-")
    ]


# (contract id, the package the violation is written in, the module it imports)
CASES = [
    ("layers", "turnkeeper.service", "turnkeeper.cli"),
    ("layers", "turnkeeper.core", "turnkeeper.events"),
    ("side-layers", "turnkeeper.logs", "turnkeeper.tools"),
    ("side-layers", "turnkeeper.tracing", "turnkeeper.sessions"),
    ("side-layers", "turnkeeper.events", "turnkeeper.providers"),
    ("pure-not-side", "turnkeeper.state", "turnkeeper.tracing"),
    ("pure-not-side", "turnkeeper.guards", "turnkeeper.tools"),
    ("side-not-pure", "turnkeeper.tracing", "turnkeeper.state"),
    ("side-not-pure", "turnkeeper.tools", "turnkeeper.guards"),
    ("service-tools", "turnkeeper.service", "turnkeeper.tools"),
    ("private", "turnkeeper.cli", "turnkeeper.sessions._host"),
    ("private", "turnkeeper", "turnkeeper.logs._sqlite_log"),
    ("private", "turnkeeper.logs", "turnkeeper.events._codec"),
    *never_cases(),
]


def lint(src: Path, *contract_ids: str) -> subprocess.CompletedProcess[str]:
    """lint-imports on the tree under `src`, with the project's contracts."""
    selected = [arg for cid in contract_ids for arg in ("--contract", cid)]
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", *selected, str(PYPROJECT)],
        env={**os.environ, "PYTHONPATH": str(src), "COLUMNS": "200"},
        cwd=src,
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )


def test_the_source_keeps_every_contract() -> None:
    done = lint(ROOT / "src")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(contracts())} kept, 0 broken." in done.stdout


def test_every_contract_has_a_violation_case() -> None:
    assert {c["id"] for c in contracts()} == {case[0] for case in CASES}


def test_the_nevers_are_the_architectures() -> None:
    # The "never" list of the package picture (DESIGN.md), as contracts.
    assert {(source, forbidden) for _, source, forbidden in never_cases()} == {
        ("turnkeeper.core", "turnkeeper.events"),
        ("turnkeeper.events", "turnkeeper.state"),
        ("turnkeeper.logs", "turnkeeper.state"),
        ("turnkeeper.logs", "turnkeeper.sessions"),
        ("turnkeeper.state", "turnkeeper.guards"),
        ("turnkeeper.guards", "turnkeeper.sessions"),
        ("turnkeeper.guards", "turnkeeper.providers"),
        ("turnkeeper.guards", "turnkeeper.logs"),
        ("turnkeeper.providers", "turnkeeper.sessions"),
        ("turnkeeper.providers", "turnkeeper.tools"),
        ("turnkeeper.sessions", "turnkeeper.service"),
        ("turnkeeper.sessions", "turnkeeper.cli"),
    }


@pytest.mark.parametrize(("contract_id", "importer", "imported"), CASES)
def test_a_violation_breaks_its_contract(
    tmp_path: Path, contract_id: str, importer: str, imported: str
) -> None:
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "src" / "turnkeeper",
        src / "turnkeeper",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    violation = src.joinpath(*importer.split(".")) / "_violation.py"
    violation.write_text(f'"""A deliberate violation."""\n\nimport {imported}\n')

    done = lint(src, contract_id)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 kept, 1 broken." in done.stdout, done.stdout
    assert f"{importer}._violation" in done.stdout, done.stdout
