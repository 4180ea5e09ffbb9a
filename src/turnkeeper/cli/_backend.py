"""The chat backend the command line uses: an OpenAI-compatible server, or the embedded model."""

from __future__ import annotations

from turnkeeper.core import Chat
from turnkeeper.providers import OpenAIChat, with_retry


def chat_backend(base_url: str | None, model: str | None) -> Chat:
    """OpenAIChat on `base_url` asking for `model` (transient failures retried), or, without
    a URL, the embedded model in this process (no server, no key): the GGUF file `model`,
    else the default weights."""
    if base_url is None:
        # Imported here: it loads llama.cpp, which a run against a server does not need.
        from turnkeeper.providers import EmbeddedChat

        return EmbeddedChat(model)
    return with_retry(OpenAIChat(base_url, model))
