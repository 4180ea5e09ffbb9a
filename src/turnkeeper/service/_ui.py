"""The inspector's pages: static HTML, CSS and JavaScript from the package (no build
step, nothing from the network), served under /ui/ with a Content-Security-Policy that
lets them run no script and no style but their own files'.

The pages hold no data: they read it from the JSON API with the bearer token, which
the person types once and the tab keeps in sessionStorage (no cookie), so the pages
themselves need no token.
"""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from turnkeeper.service._errors import error_response

UI_PREFIX = "/ui"

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
_HEADERS = {
    # No inline script, style attribute or eval, and nothing from elsewhere: text the
    # model wrote cannot run even if a page slipped and made markup of it.
    "Content-Security-Policy": (
        "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # Revalidated on each load, so a new version's pages are never mixed with old scripts.
    "Cache-Control": "no-cache",
}


def _assets() -> dict[str, tuple[bytes, str]]:
    """Every file of the static folder, by name, with its media type."""
    found: dict[str, tuple[bytes, str]] = {}
    for entry in (files("turnkeeper.service") / "static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            found[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return found


def ui_mount() -> Mount:
    """The pages under /ui/: the session list at /ui/, a session at /ui/sessions/{id}, and
    their files under /ui/static/."""
    assets = _assets()

    def page(name: str) -> Response:
        body, media_type = assets[name]
        return Response(body, media_type=media_type, headers=_HEADERS)

    async def session_list(request: Request) -> Response:
        return page("index.html")

    async def session(request: Request) -> Response:
        return page("session.html")

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in assets or name.endswith(".html"):
            return error_response(404, f"no file {name!r} among the inspector's", None)
        return page(name)

    return Mount(
        UI_PREFIX,
        routes=[
            Route("/", session_list, methods=["GET", "HEAD"]),
            Route("/sessions/{session_id}", session, methods=["GET", "HEAD"]),
            Route("/static/{name}", asset, methods=["GET", "HEAD"]),
        ],
    )
