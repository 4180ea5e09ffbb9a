"""The service's structured log (JSON lines through the stdlib logger `turnkeeper.service`)."""

from __future__ import annotations

import logging

import structlog

log = structlog.wrap_logger(
    logging.getLogger("turnkeeper.service"),
    wrapper_class=structlog.stdlib.BoundLogger,
    processors=[
        structlog.processors.TimeStamper(fmt="iso"),
        structlog.processors.format_exc_info,
        structlog.processors.JSONRenderer(),
    ],
)
