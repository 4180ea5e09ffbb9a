"""Every example in README.md and docs/ runs, as a reader would run it.

The fenced blocks of each page run in order (see tests/docs/blocks.py for what marks a
block that does not): Python blocks in one namespace per page, in a process of their own
(tests/docs/runner.py); shell blocks in one bash per page with `set -euo pipefail`, in
the same folder, with this checkout's `turnkeeper` and `python` first on the PATH. The
model at 127.0.0.1:8080 in an example is the OpenAI-compatible test server, answering by
the plans in tests/docs/model.py; port 8000 in an example is a free port of the page's
own. A `text` block marked as output must match what the example before it printed.
A page with a top-level `await` in a Python block runs once on each anyio backend.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.from_thread
import pytest

import turnkeeper
from tests.docs.blocks import EXAMPLES, Block, PageError, blocks_of
from tests.docs.model import DocsModel, Endless
from tests.providers.openai_server import ChatServer, serve_chat

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNER = Path(__file__).resolve().parent / "docs" / "runner.py"
SOURCE = Path(turnkeeper.__file__).resolve().parents[1]
BLOCK_SECONDS = 300  # the embedded model on a loaded machine is the slowest example
_PORT = re.compile(r"\b(8000|8080)\b")
# Variables of the machine's that would change what an example does.
_UNSET = ("TURNKEEPER_TOKEN", "TURNKEEPER_API_KEY", "OPENAI_API_KEY")


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _has_await(block: Block) -> bool:
    try:
        code = compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return False  # the page's run reports it
    return bool(code.co_flags & inspect.CO_COROUTINE)


def _runs() -> list[Any]:
    """(page, backend) for each page: both backends if a Python block awaits at top level."""
    params = []
    for page in PAGES:
        try:
            blocks = blocks_of(page, page.read_text())
        except PageError:
            blocks = []  # test_every_block_is_an_example_or_marked reports it
        awaits = any(b.language == "python" and _has_await(b) for b in blocks)
        for backend in ("asyncio", "trio") if awaits else ("asyncio",):
            ident = f"{_name(page)}-{backend}" if awaits else _name(page)
            params.append(pytest.param(page, backend, id=ident))
    return params


@pytest.fixture(scope="module")
def docs_model() -> Iterator[ChatServer]:
    """The test chat server, answering by the docs' plans, on its own thread and loop."""
    with (
        anyio.from_thread.start_blocking_portal("trio") as portal,
        portal.wrap_async_context_manager(serve_chat()) as server,
    ):
        server.script = Endless(DocsModel(server))
        yield server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    for key in _UNSET:
        env.pop(key, None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(SOURCE)
    return env


class _Python:
    """The page's Python process (tests/docs/runner.py), started on its first block."""

    def __init__(self, folder: Path, env: dict[str, str], backend: str) -> None:
        with (folder / "python.stderr").open("wb") as sink:
            self.process = subprocess.Popen(
                [sys.executable, str(RUNNER), backend],
                cwd=folder,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=sink,
                text=True,
                start_new_session=True,
            )

    def close(self) -> None:
        """End the input (the runner then exits) and close the pipes."""
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    def run(self, block: Block, code: str) -> dict[str, Any]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None
        assert stdout is not None
        request = {"code": code, "filename": str(block.page), "line": block.line}
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()
        ready, _, _ = select.select([stdout], [], [], BLOCK_SECONDS)
        line = stdout.readline() if ready else ""
        if not line:
            pytest.fail(f"{block.where}: the Python example did not finish (or its process died)")
        answer: dict[str, Any] = json.loads(line)
        return answer


def _end(process: subprocess.Popen[Any]) -> None:
    """Stop the process group a block started (background servers included)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            process.poll()
            time.sleep(0.05)
    process.wait()


class _Shell:
    """The page's bash (`set -euo pipefail`), started on its first shell block: each block
    is sourced in it, so variables, the working folder and background jobs (a server the
    next block uses) carry on to the next block, as in a reader's terminal."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        with (folder / "bash.out").open("wb") as sink:
            self.process = subprocess.Popen(
                ["bash", "--noprofile", "--norc", "-euo", "pipefail", "-s"],
                cwd=folder,
                env=env,
                stdin=subprocess.PIPE,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def run(self, block: Block, code: str) -> str:
        """Source the block; fail with its output unless it ends well, else return it."""
        script = self.folder / f"sh-{block.line}.sh"
        output = self.folder / f"sh-{block.line}.out"
        status = self.folder / f"sh-{block.line}.status"
        script.write_text(code)
        stdin = self.process.stdin
        assert stdin is not None
        # Background jobs of the block keep the shell's (empty) standard input.
        stdin.write(f"source {script} < /dev/null > {output} 2>&1; echo done > {status}\n".encode())
        stdin.flush()
        deadline = time.monotonic() + BLOCK_SECONDS
        while not status.exists():
            if self.process.poll() is not None:
                text = output.read_text() if output.exists() else ""
                pytest.fail(f"{block.where}: the shell example failed (set -e):\n{text}")
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{block.where}: the shell example did not finish:\n{output.read_text()}"
                )
            time.sleep(0.02)
        return output.read_text()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()


def matches(expected: str, actual: str) -> bool:
    """Whether `actual` is `expected`, where `...` in `expected` stands for any text
    (leading and trailing blank space aside)."""
    pattern = ".*?".join(re.escape(part) for part in expected.strip().split("..."))
    return re.fullmatch(pattern, actual.strip(), re.S) is not None


def rewrite(code: str, ports: dict[str, int]) -> str:
    """`code` with each example port replaced by the live one."""
    return _PORT.sub(lambda found: str(ports[found[1]]), code)


def test_every_block_is_an_example_or_marked() -> None:
    """Each page's blocks have a known language, and every marker is well formed and
    followed by an example, so no example can be added without running or a reason."""
    assert PAGES[1:], "docs/ has no pages"
    counts = {"run": 0, "marked": 0}
    for page in PAGES:
        for block in blocks_of(page, page.read_text()):
            if block.language in EXAMPLES:
                counts["marked" if block.not_run else "run"] += 1
                if block.not_run is not None:
                    assert block.not_run.strip(), block.where
    assert counts["run"] > counts["marked"], counts


def test_every_page_is_in_the_site() -> None:
    """mkdocs.yml's nav lists docs/ exactly (mkdocs only notes a page left out)."""
    nav = re.findall(r"^\s*-\s[^:]+:\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == sorted(page.name for page in PAGES[1:])


def test_the_site_builds_and_loads_nothing_from_the_network(tmp_path: Path) -> None:
    """`mkdocs build --strict` passes, and no page loads a script, style or font from
    another host (material's offline plugin would take its shim from a CDN)."""
    env = {**_environment(), "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    done = subprocess.run(build, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    loads = re.compile(
        r"<(?:script|img)[^>]*\ssrc=\"(?:https?:)?//|<link[^>]*\shref=\"(?:https?:)?//"
    )
    pages = sorted(site.glob("*.html"))
    assert len(pages) >= len(PAGES[1:])
    for html in pages:
        assert not loads.search(html.read_text()), html.name


@pytest.mark.parametrize(("page", "backend"), _runs())
def test_the_examples_of_a_page_run(
    page: Path, backend: str, tmp_path: Path, docs_model: ChatServer
) -> None:
    """Each example of the page runs without error, in order, and prints what the page
    shows it printing."""
    blocks = blocks_of(page, page.read_text())
    ports = {"8080": docs_model.port, "8000": _free_port()}
    env = _environment()
    python: _Python | None = None
    shell: _Shell | None = None
    started: list[subprocess.Popen[Any]] = []
    # The output of the example just run, for a block that shows it.
    printed: str | None = None
    try:
        for block in blocks:
            if block.output:
                assert printed is not None, f"{block.where}: output of no example that ran"
                expected = rewrite(block.code, ports)
                assert matches(expected, printed), (
                    f"{block.where}: the example before printed\n{printed}\nnot\n{expected}"
                )
            printed = None
            if block.language not in EXAMPLES or block.not_run is not None:
                continue
            code = rewrite(block.code, ports)
            if block.file is not None:
                (tmp_path / block.file).write_text(code)
            elif block.language == "sh":
                if shell is None:
                    shell = _Shell(tmp_path, env)
                    started.append(shell.process)
                printed = shell.run(block, code)
            else:
                if python is None:
                    python = _Python(tmp_path, env, backend)
                    started.append(python.process)
                answer = python.run(block, code)
                if not answer["ok"]:
                    pytest.fail(
                        f"{block.where}: the Python example raised:\n{answer['error']}\n"
                        f"it printed:\n{answer['output']}"
                    )
                printed = answer["output"]
    finally:
        for runner in (python, shell):
            if runner is not None:
                runner.close()
        for process in started:
            _end(process)


def test_blocks_of_reads_fences_markers_and_languages(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    text = (
        "# Page\n\n```python\nx = 1\n```\n\n<!-- docs: not run: it builds the model -->\n"
        "```sh\nmake demo\n```\n<!-- docs: file tools.py -->\n```python\nT = []\n```\n"
        "- a list\n\n  ```text\n  output\n  ```\n<!-- docs: output -->\n~~~text\n1\n~~~\n"
    )
    blocks = blocks_of(page, text)
    assert [(b.line, b.language, b.code, b.not_run, b.file, b.output) for b in blocks] == [
        (4, "python", "x = 1\n", None, None, False),
        (9, "sh", "make demo\n", "it builds the model", None, False),
        (13, "python", "T = []\n", None, "tools.py", False),
        (18, "text", "output\n", None, None, False),
        (22, "text", "1\n", None, None, True),
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("```\nls\n```\n", "language 'none'"),
        ("```bash\nls\n```\n", "language 'bash'"),
        ("```python\nx = 1\n", "never closed"),
        ("<!-- docs: not run: why -->\ntext\n```sh\nls\n```\n", "not followed by a block"),
        ("<!-- docs: not run: why -->\n", "not followed by a block"),
        ("<!-- docs: skip -->\n```sh\nls\n```\n", "unknown docs marker"),
        ("<!-- docs: not run:   -->\n```sh\nls\n```\n", "unknown docs marker"),
        ("<!-- docs: file x.py -->\n```text\nls\n```\n", "does not fit a text block"),
        ("<!-- docs: output -->\n```python\nx = 1\n```\n", "does not fit a python block"),
    ],
)
def test_blocks_of_refuses_what_would_go_untested(text: str, problem: str) -> None:
    with pytest.raises(PageError, match=re.escape(problem)):
        blocks_of(Path("page.md"), text)


def test_matches_takes_dots_for_any_text() -> None:
    assert matches("session ... opened\n", "  session local_1 opened")
    assert matches("a\n...\nz", "a\nb\nc\nz\n")
    assert not matches("session ... opened", "session local_1 closed")
    assert not matches("a", "ab")


def test_rewrite_puts_the_live_ports_in() -> None:
    code = "curl http://127.0.0.1:8080/v1 --port 8000; echo 18000 80800"
    assert rewrite(code, {"8080": 1234, "8000": 4321}) == (
        "curl http://127.0.0.1:1234/v1 --port 4321; echo 18000 80800"
    )
