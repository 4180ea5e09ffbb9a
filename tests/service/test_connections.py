"""Connections to the real server, as raw sockets: one that never finishes its request's
headers (half a request line, or a request sent a byte at a time) is closed once the
header timeout is up, and so is one idle that long between requests, while a long-poll and
an event stream, whose clients send nothing while they wait, stay open past it."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import msgspec

from tests.service.process import ServerProcess
from tests.service.server_main import LOOKUP_SPEC
from turnkeeper.service import EventPage
from turnkeeper.sessions import SessionInfo

HEADER_TIMEOUT = 1.0
HALF_SENT = 100
TRICKLING = 5
# How long the test waits for anything before it fails: far past the header timeout, so a
# loaded machine does not fail it, and far short of the 75 s the server once allowed.
PATIENCE = 45.0


@contextmanager
def connected(server: ServerProcess, count: int) -> Iterator[list[socket.socket]]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with ExitStack() as stack:
        yield [
            stack.enter_context(socket.create_connection((host, int(port)), timeout=PATIENCE))
            for _ in range(count)
        ]


def request(server: ServerProcess, path: str) -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {server.token}\r\n\r\n"
    ).encode()


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (read without blocking; what it sent is
    dropped)."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def read_until(sock: socket.socket, marker: bytes, received: bytearray) -> None:
    """Read from `sock` into `received` until it holds `marker`."""
    deadline = time.monotonic() + PATIENCE
    while marker not in received:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        data = sock.recv(65536)
        assert data, f"closed before {marker!r}: {bytes(received[-300:])!r}"
        received += data


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """The head and body of the response on `sock` (the body by its Content-Length)."""
    received = bytearray()
    read_until(sock, b"\r\n\r\n", received)
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    (length,) = [
        int(line.split(b":", 1)[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    ]
    rest = bytearray(body)
    while len(rest) < length:
        data = sock.recv(65536)
        assert data, "closed mid-body"
        rest += data
    return head, bytes(rest)


def test_unfinished_requests_are_closed_and_long_polls_and_streams_are_not(
    tmp_path: Path,
) -> None:
    options = ["--header-timeout", str(HEADER_TIMEOUT)]
    with (
        ServerProcess(
            tmp_path / "log.sqlite", stderr_path=tmp_path / "err", options=options
        ) as server,
        server.client() as client,
    ):
        body = {"spec": msgspec.to_builtins(LOOKUP_SPEC), "prompt": "p"}
        session_id = client.post("/v1/sessions", json=body).json()["session_id"]
        while True:
            info = msgspec.json.decode(
                client.get(f"/v1/sessions/{session_id}", params={"wait": 10}).content,
                type=SessionInfo,
            )
            if info.status != "running":
                break
        events = f"/v1/sessions/{session_id}/events"
        with (
            connected(server, 3) as (poll, stream, idle),
            connected(server, HALF_SENT) as half_sent,
            connected(server, TRICKLING) as trickling,
        ):
            poll.sendall(request(server, f"{events}?after={info.seq}&wait=30"))
            stream.sendall(request(server, f"{events}/stream?after={info.seq}"))
            streamed = bytearray()
            read_until(stream, b": ping", streamed)  # the stream is open, and idle
            idle.sendall(request(server, "/v1/healthz"))
            answered = bytearray()
            read_until(idle, b'{"status":"ok"}', answered)
            for sock in half_sent:
                sock.sendall(b"GET /v1/sessi")
            # A byte each round, too few rounds to finish before the test gives up.
            slow = b"GET /v1/healthz HTTP/1.1\r\nX-Padding: " + b"x" * 1000 + b"\r\n\r\n"
            sent = 0
            open_ones = {*half_sent, *trickling, idle}
            deadline = time.monotonic() + PATIENCE
            while open_ones and time.monotonic() < deadline:
                for sock in trickling:
                    if sock in open_ones:
                        try:
                            sock.sendall(slow[sent : sent + 1])
                        except (BrokenPipeError, ConnectionResetError):
                            open_ones.discard(sock)
                sent += 1
                open_ones -= {sock for sock in open_ones if closed_by_server(sock)}
                time.sleep(0.1)
            assert not open_ones, f"{len(open_ones)} connections still open"
            assert sent < len(slow)
            # Both waited past the header timeout; each still gets the next event.
            posted = client.post(f"/v1/sessions/{session_id}/messages", json={"text": "more"})
            assert posted.status_code == 202
            read_until(stream, b"event: local.user_message", streamed)
            head, page = read_response(poll)
            assert head.startswith(b"HTTP/1.1 200")
            assert msgspec.json.decode(page, type=EventPage).events[0].type == "local.user_message"
