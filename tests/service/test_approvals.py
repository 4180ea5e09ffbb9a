"""Tool approval over HTTP, on `turnkeeper serve` run as a subprocess against the scripted
chat server: a call whose tool wants approval parks the session in `awaiting_approval`;
`POST /v1/sessions/{id}/approvals` approves or denies it; a denial reaches the model as
a tool error; bad decisions are refused naming what is wrong; a server started again on
the log still has the session awaiting approval."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.cli.test_main import COMMAND, chat_server, clean_env, reply
from turnkeeper.providers import text_response, tool_response

TOKEN = "approvals-token-" + "x" * 20
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REFUND = {
    "name": "refund",
    "description": "Refund an order",
    "input_schema": {
        "type": "object",
        "properties": {"order": {"type": "integer"}, "amount": {"type": "number"}},
        "required": ["order", "amount"],
    },
    # Refunds of 100 or more wait for a person.
    "approval": {"properties": {"amount": {"minimum": 100}}},
}
SPEC = {"system_prompt": "You refund orders.", "tools": [REFUND]}
WAIT = 60


@contextmanager
def served(log: Path, base_url: str, stderr: Path) -> Iterator[httpx.Client]:
    """`turnkeeper serve` on a free port, logging to `log`, and a client of its API."""
    with stderr.open("a") as errors:
        process = subprocess.Popen(
            [*COMMAND, "serve", "--port", "0", "--log", str(log), "--base-url", base_url],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=clean_env(TURNKEEPER_TOKEN=TOKEN),
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("turnkeeper serving on "), stderr.read_text()
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        with httpx.Client(base_url=url, headers=AUTH, timeout=WAIT + 30) as client:
            yield client
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()
    assert "Traceback" not in stderr.read_text()


def settled(client: httpx.Client, session_id: str) -> dict[str, Any]:
    response = client.get(f"/sessions/{session_id}", params={"wait": WAIT})
    assert response.status_code == 200
    info: dict[str, Any] = response.json()
    return info


def test_a_call_is_denied_over_http_and_the_model_is_told(tmp_path: Path) -> None:
    script = [
        reply(tool_response(("refund", {"order": 7, "amount": 250}, "call_1"))),
        reply(text_response("I could not refund order 7.")),
    ]
    with (
        chat_server(*script) as model,
        served(tmp_path / "log.sqlite", model.base_url, tmp_path / "stderr.log") as client,
    ):
        created = client.post("/sessions", json={"spec": SPEC, "prompt": "Refund order 7"})
        assert created.status_code == 201
        session_id = created.json()["session_id"]
        info = settled(client, session_id)
        assert info["status"] == "awaiting_approval"
        assert [(use["id"], use["input"]) for use in info["awaiting"]] == [
            ("call_1", {"order": 7, "amount": 250})
        ]
        assert info["pending"] == []
        assert len(model.received) == 1

        # Results cannot be posted before the call is approved; nor decisions on other calls.
        results = {"results": [{"tool_use_id": "call_1", "text": "done"}]}
        refused = client.post(f"/sessions/{session_id}/tool_results", json=results)
        assert refused.status_code == 409
        assert "not waiting for tool results" in refused.json()["error"]["message"]
        other = {"decisions": [{"tool_call_id": "call_9", "approved": True}]}
        unknown = client.post(f"/sessions/{session_id}/approvals", json=other)
        assert unknown.status_code == 422
        assert unknown.json()["error"]["field"] == "decisions"
        assert "['call_9'] do not await approval" in unknown.json()["error"]["message"]
        typo = {"decisions": [{"tool_call_id": "call_1", "approved": True, "reson": "ok"}]}
        misspelt = client.post(f"/sessions/{session_id}/approvals", json=typo)
        assert misspelt.status_code == 422
        assert misspelt.json()["error"]["field"] == "decisions[0].reson"

        deny = {"decisions": [{"tool_call_id": "call_1", "approved": False, "reason": "too much"}]}
        decided = client.post(f"/sessions/{session_id}/approvals", json=deny)
        assert decided.status_code == 202
        info = settled(client, session_id)
        assert info["status"] == "idle"
        assert info["text"] == "I could not refund order 7."
        again = client.post(f"/sessions/{session_id}/approvals", json=deny)
        assert again.status_code == 409
        events = client.get(f"/sessions/{session_id}/events").json()["events"]
    kinds = [envelope["event"]["type"] for envelope in events]
    assert "local.tool_call" not in kinds
    decision = events[kinds.index("local.approval_decided")]["event"]
    assert decision == {
        "type": "local.approval_decided",
        "tool_call_id": "call_1",
        "approved": False,
        "reason": "too much",
    }
    told = model.received[1].body["messages"][-1]
    assert told["role"] == "tool"
    assert told["tool_call_id"] == "call_1"
    error = json.loads(told["content"])
    assert error["isError"] is True
    assert "denied approval: too much" in error["error"]


def test_an_approved_call_waits_for_its_result_even_across_a_restart(tmp_path: Path) -> None:
    log = tmp_path / "log.sqlite"
    script = [
        reply(tool_response(("refund", {"order": 8, "amount": 900}, "call_2"))),
        reply(text_response("Refunded order 8.")),
    ]
    with chat_server(*script) as model:
        with served(log, model.base_url, tmp_path / "stderr.log") as client:
            created = client.post("/sessions", json={"spec": SPEC, "prompt": "Refund order 8"})
            session_id = created.json()["session_id"]
            assert settled(client, session_id)["status"] == "awaiting_approval"
        # A server started again on the log: the session still awaits approval.
        with served(log, model.base_url, tmp_path / "stderr.log") as client:
            info = client.get(f"/sessions/{session_id}").json()
            assert info["status"] == "awaiting_approval"
            approve = {"decisions": [{"tool_call_id": "call_2", "approved": True}]}
            decided = client.post(f"/sessions/{session_id}/approvals", json=approve)
            assert decided.status_code == 202
            # The orchestrator runs the refund tool: approved, it waits for the result.
            info = settled(client, session_id)
            assert info["status"] == "requires_action"
            assert [use["id"] for use in info["pending"]] == ["call_2"]
            results = {"results": [{"tool_use_id": "call_2", "text": "refunded"}]}
            posted = client.post(f"/sessions/{session_id}/tool_results", json=results)
            assert posted.status_code == 202
            assert settled(client, session_id)["text"] == "Refunded order 8."
            metrics = client.get("/metrics").text
    assert 'turnkeeper_sessions{status="awaiting_approval"} 0' in metrics
    assert model.received[1].body["messages"][-1]["content"] == "refunded"
