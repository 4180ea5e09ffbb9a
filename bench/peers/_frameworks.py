"""The frameworks compared, and loading each one's adapter when it is installed."""

from __future__ import annotations

import importlib

from _task import Adapter

FRAMEWORKS: dict[str, tuple[str, frozenset[str]]] = {
    "turnkeeper": ("_turnkeeper", frozenset({"turnkeeper"})),
    "openai-agents": ("_openai_agents", frozenset({"agents", "openai"})),
    "pydantic-ai": ("_pydantic_ai", frozenset({"pydantic_ai", "pydantic"})),
    "langgraph": ("_langgraph", frozenset({"langgraph", "langchain_core"})),
    "langchain": ("_langchain", frozenset({"langchain", "langgraph", "langchain_core"})),
}
"""Each framework's adapter module and the packages it needs."""

PEERS = tuple(name for name in FRAMEWORKS if name != "turnkeeper")


class Missing(Exception):
    """A framework's packages are not installed."""


def load(name: str) -> Adapter:
    """The adapter for framework `name`. Raises Missing when its packages are not installed."""
    module_name, packages = FRAMEWORKS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        top = (error.name or "").partition(".")[0]
        if top not in packages:
            raise
        raise Missing(f"not installed (no module {top!r})") from None
    adapter: Adapter = module.adapter()
    return adapter
