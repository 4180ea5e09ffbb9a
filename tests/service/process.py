"""Run the service (tests/service/server_main.py) as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token-" + "x" * 20


class ServerProcess:
    """`python -m <module>` (default: tests.service.server_main) on a free port, logging to
    `log_path`."""

    def __init__(
        self,
        log_path: Path,
        *,
        stderr_path: Path,
        ping: float = 0.5,
        token: str | None = TOKEN,
        options: Sequence[str] = (),
        module: str = "tests.service.server_main",
    ) -> None:
        """`options`: more of the module's command-line options (server_main's by default)."""
        self.module = module
        self.log_path = log_path
        self.options = tuple(options)
        self.stderr_path = stderr_path
        self.ping = ping
        self.token_given = token
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token = ""

    def start(self) -> Self:
        """Start the server and wait until it takes requests."""
        env = {k: v for k, v in os.environ.items() if k != "TURNKEEPER_TOKEN"}
        if self.token_given is not None:
            env["TURNKEEPER_TOKEN"] = self.token_given
        with self.stderr_path.open("ab") as stderr:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    self.module,
                    "--log",
                    str(self.log_path),
                    "--ping",
                    str(self.ping),
                    *self.options,
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=60)
            raise RuntimeError(f"server did not start:\n{self.stderr_path.read_text()}")
        ready = json.loads(line)
        self.url = ready["url"]
        self.token = ready["token"]
        return self

    def client(self, token: str | None = None) -> httpx.Client:
        """A client sending `Bearer <token>` (the server's by default)."""
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=60,
        )

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=120,
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=200),
        )

    def kill(self) -> None:
        """`kill -9`: no shutdown of any kind."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=60)
        self._close_pipe()

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send `signum` and wait for the exit code."""
        assert self.process is not None
        self.process.send_signal(signum)
        code = self.process.wait(timeout=120)
        self._close_pipe()
        return code

    def _close_pipe(self) -> None:
        assert self.process is not None
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()
        elif self.process is not None:
            self._close_pipe()
