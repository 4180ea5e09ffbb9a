"""A worker of a fleet for the fault test: `python -m tests.service.fleet_main --log URL
--worker-id NAME --lease SECONDS --record FILE`.

The service of tests/service/server_main.py (its deterministic model and specs) as one
worker on the PostgreSQL database at URL. Its `lookup` tool takes a while and appends a
line to FILE as it starts, `<key looked up> <worker>`: every real execution, on any
worker, for the test to count (the driver makes each key one call's). Prints one JSON
line `{"url", "token", "port", "pid"}` once it takes requests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from functools import partial

import anyio

from tests.service.server_main import LIMITS, chat
from turnkeeper.service import Listening, serve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease", type=float, required=True)
    parser.add_argument("--record", required=True)
    args = parser.parse_args()

    async def lookup(key: str) -> str:
        line = f"{key} {args.worker_id}\n".encode()
        # One write of an O_APPEND file: whole lines, whatever the other workers write.
        descriptor = os.open(args.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)
        await anyio.sleep(random.uniform(0.05, 0.3))
        return key.upper()

    def ready(listening: Listening) -> None:
        print(
            json.dumps(
                {
                    "url": listening.url,
                    "token": listening.token,
                    "port": listening.port,
                    "pid": os.getpid(),
                }
            )
        )
        sys.stdout.flush()

    anyio.run(
        partial(
            serve,
            chat=chat,
            port=0,
            log_path=args.log,
            tools={"lookup": lookup},
            limits=LIMITS,
            ping_seconds=1.0,
            ready=ready,
            worker_id=args.worker_id,
            lease=args.lease,
        ),
        backend="trio",
    )


if __name__ == "__main__":
    main()
