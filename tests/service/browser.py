"""A real browser for the inspector's tests: Debian's Chromium, driven by Playwright.

Playwright's own browser download is not reachable here, so it drives the system's
`/usr/bin/chromium` (`make test` installs it when missing and it runs as root; otherwise
it says in one line what is missing, and so does `chromium()`: the tests are never
skipped). Headless, and with nothing that would reach the network.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, ConsoleMessage, Page, ViewportSize, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT: ViewportSize = {"width": 1360, "height": 860}


@contextmanager
def chromium() -> Iterator[Browser]:
    """Chromium, headless, for as long as the block runs."""
    if not CHROMIUM.exists():
        raise RuntimeError(
            f"the browser tests need Chromium at {CHROMIUM}: `apt-get install chromium` "
            "as root (`make test` does it when it runs as root)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


class Watched:
    """A page of its own (a new context: its own sessionStorage), with the console's
    errors and the page's uncaught exceptions kept, and every response's status."""

    def __init__(self, browser: Browser) -> None:
        self.context = browser.new_context(viewport=VIEWPORT)
        self.page: Page = self.context.new_page()
        self.errors: list[str] = []
        self.statuses: list[tuple[int, str]] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))
        self.page.on("response", lambda r: self.statuses.append((r.status, r.url)))

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def unexpected_errors(self) -> list[str]:
        """The console's errors but the failed loads of the responses a test expects (a
        401 the page was shown without a token)."""
        return [
            error
            for error in self.errors
            if not error.startswith("Failed to load resource: the server responded with a status")
        ]

    def close(self) -> None:
        self.context.close()
