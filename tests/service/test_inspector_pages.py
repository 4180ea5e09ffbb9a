"""The inspector's pages in a real browser (Chromium, driven by Playwright) against a real
`turnkeeper serve` (tests/service/inspector_server.py, a scripted model) and a real
`turnkeeper ui` beside it, checked by what the pages show: the list, its counts, filter,
search and live updates; a timeline with guard interventions and the raw JSON of an
event; the live tail; a what-if divergence marked on the timeline; sending a message,
posting tool results, cancelling and retrying from the page; model and user text shown
as text, running nothing; and the token form after a 401.

With TURNKEEPER_SCREENSHOTS=1 in the environment, the list and a session page are
saved to docs/ (the screenshots the docs show).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.service.browser import Watched, chromium
from tests.service.inspector_server import MARKUP
from tests.service.process import ROOT, ServerProcess

DOCS = ROOT / "docs"
TIMEOUT_MS = 20_000
SPEC = {
    "system_prompt": "Look things up; ask when unsure.",
    "tools": [
        {
            "name": "lookup",
            "description": "Look a key up.",
            "input_schema": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
        {
            "name": "ask_human",
            "description": "Ask the person running the session.",
            "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
        },
    ],
}
SESSIONS = {
    "weather-lookup-7f3a": "What is the weather in Lyon?",
    "orders-summary-19c2": "Summarize yesterday's orders",
    "invoice-check-a81e": "ask which invoice do you mean?",
    "loop-demo-5b07": "loop until stopped",
    "markup-reply-c4d9": "markup please",
    "upstream-down-e210": "down",
    "report-draft-3e77": "steps 3",
}


def setup_module() -> None:
    expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("inspector")
    with ServerProcess(
        folder / "log.sqlite",
        stderr_path=folder / "stderr.log",
        module="tests.service.inspector_server",
    ) as running:
        with running.client() as client:
            for session_id, prompt in SESSIONS.items():
                create(client, prompt, session_id)
            for session_id in SESSIONS:
                client.get(f"/v1/sessions/{session_id}", params={"wait": 20})
        yield running
        assert "Traceback" not in Path(running.stderr_path).read_text()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    tab = Watched(browser)
    yield tab
    tab.close()
    assert tab.unexpected_errors() == []
    assert [status for status in tab.statuses if status[0] >= 500] == []


def create(client: httpx.Client, prompt: str, session_id: str) -> str:
    body: dict[str, Any] = {"spec": SPEC, "prompt": prompt, "session_id": session_id}
    if prompt.startswith("loop"):
        # Its stop a halt, not an answer after it: the pages show a halted session.
        body["guards"] = {"loop": {"answer": False}}
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    return session_id


def settled(client: httpx.Client, session_id: str) -> dict[str, Any]:
    info: dict[str, Any] = client.get(f"/v1/sessions/{session_id}", params={"wait": 20}).json()
    return info


def visit(page: Page, server: ServerProcess, path: str, token: str | None = None) -> None:
    """Open `path` with the token given as `turnkeeper ui` gives it (the fragment)."""
    page.goto(f"{server.url}{path}#token={token or server.token}")


def row(page: Page, session_id: str) -> Any:
    return page.locator(f'#sessions tbody tr[data-session="{session_id}"]')


def shot(page: Page, name: str, height: int = 860) -> None:
    """The page from its top, `height` pixels of it, in docs/ when screenshots are asked
    for (else only taken)."""
    page.evaluate("window.scrollTo(0, 0)")
    data = page.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": 1360, "height": height})
    assert data.startswith(b"\x89PNG")
    if os.environ.get("TURNKEEPER_SCREENSHOTS"):
        (DOCS / name).write_bytes(data)


def test_the_list_counts_filters_searches_and_updates_live(
    server: ServerProcess, watched: Watched
) -> None:
    page = watched.page
    visit(page, server, "/ui/")
    for session_id in SESSIONS:
        expect(row(page, session_id)).to_be_visible()
    expect(row(page, "loop-demo-5b07").locator(".badge")).to_have_text("halted")
    expect(row(page, "invoice-check-a81e").locator(".badge")).to_have_text("requires action")
    expect(row(page, "upstream-down-e210").locator(".badge")).to_have_text("errored")
    expect(page.locator('.chip[data-status="halted"] .count')).to_have_text("1")
    expect(page.locator('.chip[data-status="all"] .count')).to_have_text(str(len(SESSIONS)))
    shot(page, "inspector-list.png")

    page.locator('.chip[data-status="halted"]').click()
    expect(page.locator("#sessions tbody tr")).to_have_count(1)
    expect(row(page, "loop-demo-5b07")).to_be_visible()
    assert "status=halted" in page.url
    page.locator('.chip[data-status="all"]').click()
    expect(page.locator("#sessions tbody tr")).to_have_count(len(SESSIONS))

    page.locator("#search").fill("ORDERS")
    expect(page.locator("#sessions tbody tr")).to_have_count(1)
    expect(row(page, "orders-summary-19c2")).to_be_visible()
    expect(page.locator("#summary")).to_contain_text("1–1 of 1")
    page.locator("#search").fill("")
    expect(page.locator("#sessions tbody tr")).to_have_count(len(SESSIONS))

    # A session started after the page opened shows up on its own, at the top.
    with server.client() as client:
        settled(client, create(client, "a newcomer", "newcomer-0001"))
    expect(page.locator("#sessions tbody tr").first).to_have_attribute(
        "data-session", "newcomer-0001"
    )
    expect(page.locator('.chip[data-status="all"] .count')).to_have_text(str(len(SESSIONS) + 1))


def test_a_timeline_shows_each_step_and_the_guards_that_stepped_in(
    server: ServerProcess, watched: Watched
) -> None:
    page = watched.page
    visit(page, server, "/ui/sessions/loop-demo-5b07")
    timeline = page.locator("#timeline")
    expect(page.locator("#title .badge")).to_have_text("halted")
    expect(timeline.locator(".kind-session-opened .title")).to_have_text("Session opened")
    expect(timeline.locator(".kind-user-message").first).to_contain_text("loop until stopped")
    reply = timeline.locator(".kind-model-response").first
    expect(reply.locator(".meta")).to_have_text("40 in · 6 out · tool_calls")
    expect(reply).to_contain_text("Calls lookup")
    expect(timeline.locator(".kind-tool-result").first).to_contain_text("SAME")
    guards = timeline.locator(".event.guard")
    expect(guards.filter(has_text="Guard: duplicates").first).to_be_visible()
    expect(guards.filter(has_text="added a directive").first).to_contain_text("going in circles")
    halted = timeline.locator(".kind-halted")
    expect(halted.locator(".title")).to_have_text("Guard: loop")
    expect(halted.locator(".meta")).to_have_text("halted: going_in_circles")
    expect(page.locator("#facts")).to_contain_text("120 in · 18 out")

    halted.locator(".raw-toggle").click()
    raw = json.loads(halted.locator("pre.raw").text_content() or "")
    assert raw["event"]["type"] == "local.halted"
    assert raw["event"]["reason"] == "going_in_circles"
    halted.locator(".raw-toggle").click()
    expect(halted.locator("pre.raw")).to_have_count(0)


def test_the_live_tail_draws_events_as_the_session_logs_them(
    server: ServerProcess, watched: Watched
) -> None:
    page = watched.page
    with server.client() as client:
        session_id = create(client, "ask which report?", "tail-ask-0001")
        info = settled(client, session_id)
        assert info["status"] == "requires_action"
        visit(page, server, f"/ui/sessions/{session_id}")
        timeline = page.locator("#timeline > li")
        expect(timeline).to_have_count(3)
        expect(page.locator("#live")).to_be_visible()
        (call,) = info["pending"]
        client.post(
            f"/v1/sessions/{session_id}/tool_results",
            json={"results": [{"tool_use_id": call["id"], "text": "steps 3"}]},
        )
    # The results, then the model's answer, come over the stream without a reload.
    expect(page.locator("#timeline .kind-tool-results")).to_contain_text("steps 3")
    expect(page.locator("#timeline .kind-model-response").last).to_contain_text("answer to")
    expect(page.locator("#title .badge")).to_have_text("idle")


def test_what_if_marks_the_poll_where_the_outcome_would_differ(
    server: ServerProcess, watched: Watched
) -> None:
    page = watched.page
    visit(page, server, "/ui/sessions/loop-demo-5b07")
    box = page.locator("#guards")
    expect(box).to_have_value(re.compile('"loop"'))
    logged = json.loads(box.input_value())

    page.locator("#whatif-form button").click()
    expect(page.locator("#whatif-answer")).to_contain_text("The same at every poll")
    expect(page.locator("#timeline .diverges")).to_have_count(0)

    box.fill(json.dumps({**logged, "loop": None}))
    page.locator("#whatif-form button").click()
    answer = page.locator("#whatif-answer")
    expect(answer).to_contain_text("Poll 3 (event #9)")
    expect(answer).to_contain_text("would call the model at poll 3")
    marked = page.locator("#timeline .diverges")
    expect(marked).to_have_count(1)
    expect(marked).to_have_attribute("data-seq", "9")
    expect(marked.locator(".diverge-note")).to_have_text(
        "What if: would call the model at poll 3 (the log shows: add a directive from loop)"
    )
    shot(page, "inspector-session.png", height=1500)

    box.fill(json.dumps({**logged, "loop": {"warnings": -1}}))
    page.locator("#whatif-form button").click()
    expect(answer).to_contain_text("guards.loop.warnings")
    box.fill("{not json")
    page.locator("#whatif-form button").click()
    expect(answer).to_contain_text("Not JSON")


def test_a_message_tool_results_a_retry_and_a_cancel_from_the_page(
    server: ServerProcess, watched: Watched
) -> None:
    page = watched.page
    with server.client() as client:
        session_id = create(client, "ask which colour?", "act-ask-0001")
        settled(client, session_id)
        visit(page, server, f"/ui/sessions/{session_id}")
        form = page.locator("#results-form")
        expect(form).to_be_visible()
        expect(form.locator(".pending")).to_contain_text("ask_human")
        form.locator("textarea").fill("blue")
        form.locator("button[type=submit]").click()
        expect(page.locator("#timeline .kind-model-response").last).to_contain_text(
            "answer to 'ask which colour?' from blue"
        )
        expect(page.locator("#title .badge")).to_have_text("idle")
        expect(form).to_be_hidden()

        page.locator("#message").fill("ask again, which size?")
        page.locator("#message-form button").click()
        expect(page.locator("#timeline .kind-user-message").last).to_contain_text("which size?")
        expect(page.locator("#title .badge")).to_have_text("requires action")

        page.locator("#cancel").click()
        expect(page.locator("#timeline .kind-cancelled")).to_contain_text("cancelled by request")
        expect(page.locator("#title .badge")).to_have_text("cancelled")
        expect(page.locator("#cancel")).to_be_disabled()
        assert settled(client, session_id)["status"] == "cancelled"

        visit(page, server, "/ui/sessions/upstream-down-e210")
        expect(page.locator("#title .badge")).to_have_text("errored")
        failures = page.locator("#timeline .kind-chat-error")
        expect(failures).to_have_count(1)
        page.locator("#retry").click()
        # The model is still down: the retried call fails again, and says so.
        expect(failures).to_have_count(2)
        expect(page.locator("#action-status")).to_have_text("Retry: done.")


def test_text_from_a_model_or_a_user_is_shown_as_text_and_runs_nothing(
    server: ServerProcess, watched: Watched
) -> None:
    page = watched.page
    prompt = 'markup <b>bold</b><img src="y" onerror="window.__pwned = 3">'
    with server.client() as client:
        settled(client, create(client, prompt, "markup-user-0001"))
    visit(page, server, "/ui/")
    expect(row(page, "markup-user-0001").locator(".prompt")).to_have_text(
        'markup <b>bold</b><img src="y" onerror="window.__pwned = 3">'
    )
    visit(page, server, "/ui/sessions/markup-reply-c4d9")
    reply = page.locator("#timeline .kind-model-response .text")
    expect(reply).to_have_text(f"Here it is: {MARKUP}")
    visit(page, server, "/ui/sessions/markup-user-0001")
    expect(page.locator("#timeline .kind-user-message .text")).to_have_text(prompt)
    expect(page.locator("#timeline .kind-model-response")).to_have_count(1)
    assert page.locator("main img, main script, main b").count() == 0
    assert page.evaluate("window.__pwned") is None
    headers = httpx.get(f"{server.url}/ui/").headers
    assert headers["content-security-policy"].startswith("default-src 'self'")


def test_without_the_token_the_service_says_401_and_the_page_asks_for_it(
    server: ServerProcess, watched: Watched
) -> None:
    page = watched.page
    page.goto(f"{server.url}/ui/")
    form = page.locator("#token")
    expect(form).to_be_visible()
    expect(page.locator("#token-why")).to_contain_text("missing Authorization header")
    expect(page.locator("#sessions tbody tr")).to_have_count(0)
    page.locator("#token-input").fill("not-the-token")
    page.locator("#token-form button").click()
    expect(page.locator("#token-why")).to_have_text("Authorization: wrong token")
    expect(form).to_be_visible()
    refused = [url for status, url in watched.statuses if status == 401]
    assert len(refused) == 2
    assert all("/v1/inspector/sessions" in url for url in refused)
    page.locator("#token-input").fill(server.token)
    page.locator("#token-form button").click()
    expect(form).to_be_hidden()
    expect(row(page, "loop-demo-5b07")).to_be_visible()
    # Kept in the tab, not in a cookie: a reload needs no token typed.
    assert page.context.cookies() == []
    page.reload()
    expect(row(page, "loop-demo-5b07")).to_be_visible()


def test_turnkeeper_ui_reads_the_log_turnkeeper_serve_writes(
    server: ServerProcess, watched: Watched
) -> None:
    command = [sys.executable, "-m", "turnkeeper.cli", "ui", str(server.log_path), "--port", "0"]
    env = {k: v for k, v in os.environ.items() if k != "TURNKEEPER_TOKEN"}
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as ui:
        assert ui.stdout is not None
        line = ui.stdout.readline()
        address = r"(http://127\.0\.0\.1:\d+/ui/#token=\S+)"
        found = re.fullmatch(rf"turnkeeper inspector on {address} \(read-only; log: .+\)\n", line)
        assert found, line
        page = watched.page
        page.goto(found[1])
        expect(row(page, "loop-demo-5b07").locator(".badge")).to_have_text("halted")
        expect(page.locator("#source")).to_contain_text("read-only · SQLite log")
        with server.client() as client:
            settled(client, create(client, "ask from afar?", "far-ask-0001"))
        expect(row(page, "far-ask-0001").locator(".badge")).to_have_text("requires action")
        row(page, "far-ask-0001").locator("a").click()
        expect(page.locator("#read-only")).to_be_visible()
        expect(page.locator("#actions")).to_be_hidden()
        expect(page.locator("#timeline > li")).to_have_count(3)
        with server.client() as client:
            (call,) = client.get("/v1/sessions/far-ask-0001").json()["pending"]
            client.post(
                "/v1/sessions/far-ask-0001/tool_results",
                json={"results": [{"tool_use_id": call["id"], "text": "from here"}]},
            )
        expect(page.locator("#timeline .kind-model-response").last).to_contain_text("from here")
        page.goto("about:blank")  # before its server stops, the tail would reconnect to it
        ui.send_signal(signal.SIGINT)
        assert ui.wait(timeout=30) == 0


def test_a_summary_of_older_turns_shows_in_the_timeline(
    server: ServerProcess, watched: Watched
) -> None:
    spec = {
        **SPEC,
        "compaction": {"budget_tokens": 100, "keep_recent_turns": 2, "summary_tokens": 10},
    }
    with server.client() as client:
        response = client.post(
            "/v1/sessions", json={"spec": spec, "prompt": "long 6", "session_id": "long-task-9d41"}
        )
        assert response.status_code == 201, response.text
        assert settled(client, "long-task-9d41")["text"] == "looked up 6 parts"
    page = watched.page
    visit(page, server, "/ui/sessions/long-task-9d41")
    summaries = page.locator("#timeline .kind-compacted")
    expect(summaries.first.locator(".title")).to_have_text("Older turns summarised")
    expect(summaries.first.locator(".meta")).to_contain_text("over the 100 budget · 60 in · 12 out")
    expect(summaries.first.locator(".event-body")).to_contain_text(
        "Summary of the conversation so far: The user asked for lookups;"
    )
    summaries.first.locator(".raw-toggle").click()
    raw = json.loads(summaries.first.locator("pre.raw").text_content() or "")
    assert raw["event"]["type"] == "local.compacted"
    assert raw["event"]["budget"] == 100
