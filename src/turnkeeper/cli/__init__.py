"""The `turnkeeper` command: run, replay, sessions, export, serve."""

from turnkeeper.cli._main import main

__all__ = ["main"]
