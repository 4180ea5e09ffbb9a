"""The HTTP API for orchestrators: Starlette over a Host, served by hypercorn on trio."""

from turnkeeper.service._app import create_app
from turnkeeper.service._auth import TOKEN_VARIABLE
from turnkeeper.service._errors import ApiError
from turnkeeper.service._limits import DEFAULT_LIMITS, Limits
from turnkeeper.service._openapi import openapi_document
from turnkeeper.service._schemas import (
    Created,
    CreateSession,
    ErrorBody,
    ErrorDetail,
    EventPage,
    Health,
    PostMessage,
    PostToolResults,
    SessionPage,
)
from turnkeeper.service._serve import Listening, serve

__all__ = [
    "DEFAULT_LIMITS",
    "TOKEN_VARIABLE",
    "ApiError",
    "CreateSession",
    "Created",
    "ErrorBody",
    "ErrorDetail",
    "EventPage",
    "Health",
    "Limits",
    "Listening",
    "PostMessage",
    "PostToolResults",
    "SessionPage",
    "create_app",
    "openapi_document",
    "serve",
]
