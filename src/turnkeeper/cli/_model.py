"""`turnkeeper model serve`: the embedded model as an OpenAI-compatible chat server.

`POST /v1/chat/completions` runs the request on EmbeddedChat, so a framework that speaks
OpenAI chat completions gets well-formed tool calls from a tiny GGUF model: the tools go
into the prompt and a grammar admits only a call of an offered tool or an answer (see
`turnkeeper.providers.InlineTools`). `tool_choice` is honoured ("none" withdraws the tools,
"required" withdraws the answer, a named function is the only one offered); tool results
and assistant messages with `content: null` are taken as OpenAI sends them; usage is the
model's own token count. `GET /v1/models` lists the one model served, which answers
whatever model name a request gives. One generation runs at a time; other requests wait.
Streaming is refused with a 400 naming `stream`. Bad requests get a 4xx with an
OpenAI-shaped error naming the field (`param`).
"""

from __future__ import annotations

import sys
import time

import msgspec

from turnkeeper.cli import _codes
from turnkeeper.core import ChatError


class ModelServeOptions(msgspec.Struct, frozen=True):
    host: str
    port: int
    model: str | None
    chat_format: str | None


async def model_serve_command(options: ModelServeOptions) -> int:
    """Load the model, then serve it until stopped; say what it does on stderr and the URL
    on stdout."""
    # Imported here: the web stack and llama.cpp are slow to import, and only this needs them.
    from turnkeeper.cli._model_app import model_id, serve_model
    from turnkeeper.providers import EmbeddedChat

    chat = EmbeddedChat(options.model, chat_format=options.chat_format)
    served = model_id(chat.model_path)
    print(
        f"turnkeeper: loading the model {served} ({chat.model_path})…", file=sys.stderr, flush=True
    )
    started = time.perf_counter()
    try:
        await chat.load()
    except ChatError as error:
        print(f"turnkeeper: error: {error}", file=sys.stderr, flush=True)
        return _codes.MODEL_FAILED
    print(
        f"turnkeeper: model loaded in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
        flush=True,
    )

    def ready(url: str) -> None:
        print(f"turnkeeper serving {served} on {url} (OpenAI chat completions)", flush=True)

    await serve_model(chat, served, host=options.host, port=options.port, ready=ready)
    return _codes.OK
