"""The `turnkeeper` command's exit codes."""

from __future__ import annotations

from typing import Final

OK: Final = 0
"""run: the model answered (or called the terminal tool). replay --guards: same outcome.
check: no damage found."""

STOPPED: Final = 1
"""run: a guard or the runner stopped the session without an answer (max turns, going in
circles, no terminal tool, budget, timeout). replay --guards: the outcome would differ."""

DAMAGED: Final = 1
"""check: the log is damaged (a session, or the file itself)."""

USAGE: Final = 2
"""A bad argument, option, file, log or configuration; nothing was run."""

MODEL_FAILED: Final = 3
"""run: the model could not be reached or failed for good (after retries)."""

INTERRUPTED: Final = 130
"""Interrupted (Ctrl-C)."""

CLOSED_PIPE: Final = 141
"""What read the output stopped reading it (`turnkeeper sessions ... | head`): the command
ends there, quietly, with the code a shell gives a process that SIGPIPE ended (128 + 13)."""
