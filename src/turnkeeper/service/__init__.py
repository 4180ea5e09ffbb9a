"""The HTTP API for orchestrators (Starlette over a Host, served by hypercorn on trio) and
the session inspector's pages."""

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
    Recheck,
    RecheckRequest,
    SessionList,
    SessionPage,
    SessionView,
)
from turnkeeper.service._serve import Listening, serve
from turnkeeper.service._summary import ListedStatus, SessionSummary
from turnkeeper.service._ui_serve import serve_inspector

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
    "ListedStatus",
    "Listening",
    "PostMessage",
    "PostToolResults",
    "Recheck",
    "RecheckRequest",
    "SessionList",
    "SessionPage",
    "SessionSummary",
    "SessionView",
    "create_app",
    "openapi_document",
    "serve",
    "serve_inspector",
]
