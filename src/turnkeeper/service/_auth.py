"""Bearer-token authentication for every route but the public ones (health)."""

from __future__ import annotations

import hmac
import os
import secrets

from starlette.types import ASGIApp, Receive, Scope, Send

from turnkeeper.core import InputError
from turnkeeper.service._errors import error_response

TOKEN_VARIABLE = "TURNKEEPER_TOKEN"
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="turnkeeper"'}


def resolve_token(token: str | None) -> str:
    """`token`, else the TURNKEEPER_TOKEN environment variable, else a new random token."""
    if token is None:
        token = os.environ.get(TOKEN_VARIABLE) or secrets.token_urlsafe(32)
    check_token(token)
    return token


def check_token(token: str) -> None:
    """Raise InputError unless `token` can be sent in an Authorization header."""
    if not isinstance(token, str) or not token:
        raise InputError("token: expected a non-empty string")
    if not token.isascii() or not token.isprintable() or " " in token:
        raise InputError("token: only printable ASCII characters without spaces are allowed")


def bearer_problem(authorization: bytes | None, token: bytes) -> str | None:
    """Why an Authorization header value does not carry `token`, or None if it does."""
    if authorization is None:
        return "missing Authorization header; send `Authorization: Bearer <token>`"
    scheme, _, credentials = authorization.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return "Authorization: expected the Bearer scheme"
    # Constant-time, so response timing does not reveal how much of a guess was right.
    if not hmac.compare_digest(credentials.strip(), token):
        return "Authorization: wrong token"
    return None


class BearerAuth:
    """ASGI middleware: HTTP requests outside `public` paths, and paths under none of the
    `public_prefixes`, need `Bearer <token>`."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        public: frozenset[str],
        public_prefixes: tuple[str, ...] = (),
    ) -> None:
        check_token(token)
        self.app = app
        self.token = token.encode()
        self.public = public
        self.public_prefixes = public_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._public(scope["path"]):
            header = next(
                (value for name, value in scope["headers"] if name == b"authorization"), None
            )
            problem = bearer_problem(header, self.token)
            if problem is not None:
                response = error_response(401, problem, "Authorization", _CHALLENGE)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _public(self, path: str) -> bool:
        return path in self.public or path.startswith(self.public_prefixes)
