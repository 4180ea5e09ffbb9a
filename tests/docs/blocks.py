"""The fenced code blocks of a Markdown page, with the marker comment that may precede each.

A block's language says what the tests do with it: `python` and `sh` blocks are examples
and run; `text` (output) and `json` (data) blocks are shown, never run. A block of any
other language, or of none, is a mistake the tests report. An example that must not run
as it stands, or that is a file other examples use, says so in an HTML comment on the
line before its fence (Markdown renders none of it), and so does a `text` block that is
what the example before it prints:

    <!-- docs: not run: REASON -->    the block is not run, for REASON
    <!-- docs: file NAME -->           the block is written to NAME in the page's folder
    <!-- docs: output -->              the block is the previous example's output, where
                                       `...` stands for any text
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = frozenset({"python", "sh"})
"""Languages of blocks that run."""
SHOWN = frozenset({"text", "json"})
"""Languages of blocks that are output or data, never run."""

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)\s*(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs:\s*(?P<body>.*?)\s*-->\s*$")
_NOT_RUN = re.compile(r"^not run:\s*(?P<reason>\S.*)$")
_FILE = re.compile(r"^file\s+(?P<name>[\w.\-]+)$")
_OUTPUT = "output"


class PageError(Exception):
    """A page whose blocks or markers are malformed; the message names the page and line."""


@dataclass(frozen=True)
class Block:
    """One fenced block: where its code starts (1-based line), its language and code, and
    what its marker says (`not_run` holds the reason, `file` the name, `output` that it is
    the previous example's output), if it has one."""

    page: Path
    line: int
    language: str
    code: str
    not_run: str | None = None
    file: str | None = None
    output: bool = False

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


class _Marker:
    def __init__(self, page: Path, number: int, body: str) -> None:
        self.number = number
        self.not_run: str | None = None
        self.file: str | None = None
        self.output = body == _OUTPUT
        not_run = _NOT_RUN.match(body)
        file = _FILE.match(body)
        if not_run:
            self.not_run = not_run["reason"]
        elif file:
            self.file = file["name"]
        elif not self.output:
            raise PageError(
                f"{page}:{number}: unknown docs marker {body!r} (expected `not run: REASON`, "
                "`file NAME` or `output`)"
            )

    def fits(self, language: str) -> bool:
        return language == "text" if self.output else language in EXAMPLES


def blocks_of(page: Path, text: str) -> list[Block]:
    """Every fenced block of `text` (the page `page`), in order. Raises PageError for a
    block without a known language, an unclosed fence, or a marker not followed by one."""
    lines = text.splitlines()
    found: list[Block] = []
    marker: _Marker | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        number = index + 1
        marked = _MARKER.match(line)
        if marked:
            if marker is not None:
                raise PageError(f"{page}:{marker.number}: a docs marker not followed by a block")
            marker = _Marker(page, number, marked["body"])
            index += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if marker is not None and line.strip():
                raise PageError(f"{page}:{marker.number}: a docs marker not followed by a block")
            index += 1
            continue
        language = fence["info"].strip().split(" ")[0]
        indent = len(fence["indent"])
        close = re.compile(rf"^ *{re.escape(fence['fence'])}\s*$")
        end = index + 1
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        if end == len(lines):
            raise PageError(f"{page}:{number}: a fenced block is never closed")
        if language not in EXAMPLES | SHOWN:
            raise PageError(
                f"{page}:{number}: a block of language {language or 'none'!r}; give it one of "
                f"{', '.join(sorted(EXAMPLES | SHOWN))}"
            )
        code = "\n".join(text_line[indent:] for text_line in lines[index + 1 : end]) + "\n"
        if marker is None:
            found.append(Block(page, number + 1, language, code))
        elif not marker.fits(language):
            raise PageError(
                f"{page}:{marker.number}: a docs marker that does not fit a {language} block"
            )
        else:
            found.append(
                Block(page, number + 1, language, code, marker.not_run, marker.file, marker.output)
            )
        marker = None
        index = end + 1
    if marker is not None:
        raise PageError(f"{page}:{marker.number}: a docs marker not followed by a block")
    return found
