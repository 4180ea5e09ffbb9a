"""`turnkeeper ui LOG`: the session inspector over a log, read-only, on 127.0.0.1."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import msgspec

from turnkeeper.cli import _codes
from turnkeeper.cli._serve import given_token, shown_log

if TYPE_CHECKING:
    from turnkeeper.service import Listening


class UiOptions(msgspec.Struct, frozen=True):
    log: str
    port: int
    token_file: str | None


async def ui_command(options: UiOptions) -> int:
    """Serve the inspector until stopped; print its address (with the token in the
    address's fragment, which no request carries, when the token was made up here)."""
    # Imported here: the web stack is slow to import and only `serve` and `ui` need it.
    from turnkeeper.service import TOKEN_VARIABLE, serve_inspector

    token = await given_token(options.token_file)
    made_up = token is None and not os.environ.get(TOKEN_VARIABLE)

    def ready(listening: Listening) -> None:
        address = f"{listening.url}/ui/"
        if made_up:
            address += f"#token={listening.token}"
        shown = shown_log(options.log)
        print(f"turnkeeper inspector on {address} (read-only; log: {shown})", flush=True)
        if not made_up:
            source = "--token-file" if options.token_file is not None else TOKEN_VARIABLE
            print(f"token: from {source}", flush=True)

    await serve_inspector(options.log, port=options.port, token=token, ready=ready)
    return _codes.OK
