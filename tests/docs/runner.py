"""Runs a page's Python examples in one namespace, in order, in a process of their own.

    python runner.py BACKEND

Reads one JSON object per line on stdin, `{"code", "filename", "line"}`, runs the code as
if it stood at that line of that file (so a traceback names the page and line), and
answers with one JSON line, `{"ok", "output", "error"}`: what the code printed (to
stdout or stderr), and the traceback if it raised. Code with a top-level `await` (as in
`python -m asyncio`) runs on a new event loop of BACKEND, the way `anyio.run` runs a
program's main function; other code runs as a script would (an `anyio.run(main)` in it
starts its own loop).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import os
import sys
import tempfile
import traceback
from typing import IO, Any

import anyio


async def _awaited(code: Any, namespace: dict[str, Any]) -> None:
    try:
        await eval(code, namespace)
    finally:
        # The pooled HTTP client belongs to this loop: close it before the loop ends.
        providers = sys.modules.get("turnkeeper.providers")
        if providers is not None:
            await providers.aclose_shared_client()


def _run(request: dict[str, Any], namespace: dict[str, Any], backend: str) -> dict[str, Any]:
    # A file, not a StringIO: what an example starts may need its file descriptor (the
    # MCP SDK hands `sys.stderr` to the stdio servers it starts).
    with tempfile.TemporaryFile("w+") as output:
        outcome = _run_into(output, request, namespace, backend)
        output.seek(0)
        return {**outcome, "output": output.read()}


def _run_into(
    output: IO[str], request: dict[str, Any], namespace: dict[str, Any], backend: str
) -> dict[str, Any]:
    try:
        source = "\n" * (request["line"] - 1) + request["code"]
        code = compile(source, request["filename"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            if code.co_flags & inspect.CO_COROUTINE:
                anyio.run(_awaited, code, namespace, backend=backend)
            else:
                exec(code, namespace)
    # An example may raise anything; the page's test reports it.
    except BaseException:
        return {"ok": False, "error": traceback.format_exc()}
    finally:
        output.flush()
    return {"ok": True, "error": None}


def main() -> None:
    backend = sys.argv[1]
    # Answers go to the original stdout; anything else writing to file descriptor 1 (a
    # child process an example starts) goes to stderr instead.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for line in sys.stdin:
        answers.write(json.dumps(_run(json.loads(line), namespace, backend)) + "\n")


if __name__ == "__main__":
    main()
