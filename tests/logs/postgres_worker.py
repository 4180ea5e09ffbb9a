"""A worker process holding a PostgresLog, driven line by line on stdin, for tests that
pause it (SIGSTOP) or kill it.

    python -m tests.logs.postgres_worker URL WORKER_ID LEASE

Commands: `append SESSION EXPECTED_SEQ` appends one message numbered on from
EXPECTED_SEQ and prints `ok EPOCH` or `error NAME: TEXT`; `held` prints `held LEASE_HELD
{SESSION: EPOCH, ...}` (JSON); `quit` closes the log.
"""

from __future__ import annotations

import json
import sys

import anyio

from turnkeeper.events import Envelope, MessageReceived
from turnkeeper.logs import PostgresLog


async def serve(url: str, worker_id: str, lease: float) -> None:
    async with PostgresLog(url, worker_id=worker_id, lease=lease) as log:
        print("ready", flush=True)
        while True:
            line = await anyio.to_thread.run_sync(sys.stdin.readline)
            words = line.split()
            if not words or words[0] == "quit":
                return
            if words[0] == "held":
                print(f"held {json.dumps(log.lease_held)} {json.dumps(log.held())}", flush=True)
                continue
            _, session_id, expected = words
            seq = int(expected) + 1
            event = MessageReceived(text=f"{worker_id} wrote {session_id}#{seq}")
            envelope = Envelope(session_id=session_id, seq=seq, at=float(seq), event=event)
            try:
                await log.append([envelope], expected_seq=int(expected))
            except Exception as exc:
                print(f"error {type(exc).__name__}: {exc}", flush=True)
            else:
                print(f"ok {log.epoch(session_id)}", flush=True)


if __name__ == "__main__":
    anyio.run(serve, sys.argv[1], sys.argv[2], float(sys.argv[3]), backend="trio")
