"""The runtime's log lines: JSON, with a timestamp, through the standard library's logging."""

from __future__ import annotations

import logging
from typing import Any

import structlog


def json_log(std_log: logging.Logger) -> Any:
    """A structlog logger writing JSON lines, with a timestamp, through `std_log`."""
    return structlog.wrap_logger(
        std_log,
        wrapper_class=structlog.stdlib.BoundLogger,
        processors=[
            # First: a line below the logger's level costs no timestamp and no JSON.
            structlog.stdlib.filter_by_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.JSONRenderer(),
        ],
        # Else every call binds a new logger (about 3 µs).
        cache_logger_on_first_use=True,
    )
