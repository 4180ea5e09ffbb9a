"""Reading Server-Sent Events in tests: events and comments, in order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec


class SseEvent(msgspec.Struct, frozen=True):
    """One event (`id`, `event`, `data`), or a comment when `comment` is set."""

    id: str | None = None
    event: str | None = None
    data: str | None = None
    comment: str | None = None


def parse_sse(lines: Iterable[str]) -> Iterator[SseEvent]:
    """Events and comments from the lines of a stream (without line endings)."""
    fields: dict[str, str] = {}
    for line in lines:
        if line == "":
            if fields:
                yield SseEvent(fields.get("id"), fields.get("event"), fields.get("data"))
            fields = {}
        elif line.startswith(":"):
            yield SseEvent(comment=line[1:].strip())
        else:
            name, _, value = line.partition(":")
            assert name in ("id", "event", "data"), f"unexpected SSE field in {line!r}"
            assert name not in fields, f"field {name} twice in one event"
            fields[name] = value.removeprefix(" ")
