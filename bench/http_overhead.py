"""What OpenAIChat adds to a bare HTTP round trip, at 1 and 100 concurrent sessions.

    python bench/http_overhead.py

Starts an OpenAI-compatible stand-in on 127.0.0.1 (a minimal h11 server in a child
process, answering every POST with the same chat completion) and sends it the same
chat request two ways, alternating in short rounds: through `OpenAIChat` (encode the request,
POST, check and decode the response), and as a bare `httpx` POST of pre-encoded bytes whose
body is read but not decoded, on a pool of the same size. Each session sends its requests
one after another. Prints the median and p99 latency of each and OpenAIChat's overhead.
Figures, not assertions. The target is under 5% at the median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import h11
import httpx
import msgspec

from turnkeeper.providers import OpenAIChat, aclose_shared_client

# sessions: (rounds, requests per round and client). Short rounds, alternating between the
# clients, so that load from elsewhere on the machine falls on both alike.
ROUNDS = {1: (200, 10), 100: (20, 300)}
WARMUP = 300

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {field: {"type": "string", "description": f"The {field}."}},
                "required": [field],
            },
        },
    }
    for name, description, field in [
        ("search_products", "Search the catalogue by keywords.", "query"),
        ("get_weather", "Current weather and the forecast for a city.", "city"),
        ("add_to_cart", "Put a product in the shopping cart.", "product_id"),
    ]
]
REQUEST: dict[str, Any] = {
    "model": "bench",
    "messages": [
        {"role": "system", "content": "You are a shop assistant. Use the tools. " * 4},
        {"role": "user", "content": "Find me running shoes in size 42 and add the best pair."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search_products", "arguments": '{"query": "shoes"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps([{"id": 7}] * 20)},
    ],
    "tools": _TOOLS,
    "temperature": 0.2,
}
RESPONSE: dict[str, Any] = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "bench",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "add_to_cart", "arguments": '{"product_id": "7"}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 412, "completion_tokens": 18, "total_tokens": 430},
}


def serve(port: int) -> None:
    """The stand-in server (run in the child process): HTTP/1.1 keep-alive over asyncio
    streams with h11, as lean as a server gets, so that the client's share shows."""
    body = json.dumps(RESPONSE).encode()
    head = h11.Response(
        status_code=200,
        headers=[("content-type", "application/json"), ("content-length", str(len(body)))],
    )

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        http = h11.Connection(h11.SERVER)
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                http.receive_data(data)
            elif isinstance(event, h11.EndOfMessage):
                writer.write(
                    http.send(head) + http.send(h11.Data(data=body)) + http.send(h11.EndOfMessage())
                )
                await writer.drain()
                http.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                break
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(connection, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def wait_until_up(url: str) -> None:
    async with httpx.AsyncClient() as client:
        for _ in range(200):
            try:
                await client.post(url, content=b"{}")
            except httpx.TransportError:
                await anyio.sleep(0.05)
            else:
                return
    raise SystemExit(f"the bench server at {url} did not start")


Send = Callable[[], Awaitable[Any]]


async def timed(send: Send, sessions: int, total: int) -> list[float]:
    """Latencies of `total` requests sent by `sessions` concurrent sessions."""
    latencies: list[float] = []

    async def session(count: int) -> None:
        for _ in range(count):
            start = time.perf_counter()
            await send()
            latencies.append(time.perf_counter() - start)

    async with anyio.create_task_group() as group:
        for number in range(sessions):
            group.start_soon(session, total // sessions + (number < total % sessions))
    return latencies


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


async def measure(base_url: str) -> None:
    url = base_url + "/chat/completions"
    await wait_until_up(url)
    chat = OpenAIChat(base_url, api_key="bench-key")
    body = msgspec.json.encode(REQUEST)
    headers = {"content-type": "application/json", "authorization": "Bearer bench-key"}
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(limits=limits) as raw_client:

        async def raw() -> bytes:
            response = await raw_client.post(url, content=body, headers=headers)
            return response.content

        async def openai() -> dict[str, Any]:
            return await chat(REQUEST)

        clients: list[tuple[str, Send]] = [("raw httpx", raw), ("OpenAIChat", openai)]
        response_kb = len(json.dumps(RESPONSE)) / 1024
        print(f"request {len(body) / 1024:.1f} KB, response {response_kb:.1f} KB\n")
        print(f"{'sessions':>8}  {'client':<11} {'requests':>8}  {'median ms':>9}  {'p99 ms':>7}")
        for sessions, (rounds, total) in ROUNDS.items():
            samples: dict[str, list[float]] = {name: [] for name, _ in clients}
            for _, send in clients:
                await timed(send, sessions, WARMUP)
            for number in range(rounds):
                # Each client goes first in every other round, so neither gains by order.
                for name, send in clients if number % 2 == 0 else clients[::-1]:
                    samples[name] += await timed(send, sessions, total)
            for name, _ in clients:
                values = samples[name]
                print(
                    f"{sessions:>8}  {name:<11} {len(values):>8}  "
                    f"{statistics.median(values) * 1e3:>9.3f}  {p99(values) * 1e3:>7.3f}"
                )
            base, ours = samples["raw httpx"], samples["OpenAIChat"]
            median_overhead = statistics.median(ours) / statistics.median(base) - 1
            p99_overhead = p99(ours) / p99(base) - 1
            print(
                f"{'':>8}  overhead: median {median_overhead:+.1%}, p99 {p99_overhead:+.1%}"
                " (target: under 5% at the median)\n"
            )
    await aclose_shared_client()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=["trio", "asyncio"], default="trio")
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
        print(
            f"OpenAIChat vs a bare httpx POST to 127.0.0.1:{port}; {args.backend} client;"
            f" {os.cpu_count()} CPUs, load average {load}"
        )
        anyio.run(measure, f"http://127.0.0.1:{port}/v1", backend=args.backend)
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
