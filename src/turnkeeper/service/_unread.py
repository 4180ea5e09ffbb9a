"""Closing connections whose request body the app did not read to the end."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class CloseUnreadBodies:
    """ASGI middleware: a response sent before the request body was read to the end
    (a refusal: no token, too large, wrong content type, no such route) says
    `Connection: close`. The server drops such a connection after the response anyway;
    saying so keeps a client from sending its next request on it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        unread = headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers

        async def receiving() -> Message:
            nonlocal unread
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                unread = False
            return message

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and unread:
                message = {**message, "headers": [*message["headers"], (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receiving, sending)
