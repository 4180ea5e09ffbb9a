"""Fork and cost over HTTP, against the service as a real subprocess: a session forked
at a call waiting for its result goes on on its own, the fork's errors are the documented
4xx naming the field, and a priced session's cost is in its status and in /v1/metrics.
Every response is checked against the OpenAPI document."""

from __future__ import annotations

from decimal import Decimal

import httpx
import msgspec
import pytest

from tests.service.process import ServerProcess
from tests.service.prometheus import parse_exposition
from tests.service.server_main import ASK_SPEC, LIMITS, LOOKUP_SPEC, answer_for
from tests.service.test_openapi import check
from tests.service.test_serve import all_events, create, settled
from turnkeeper.core import Pricing
from turnkeeper.events import Forked
from turnkeeper.service import openapi_document

FORK = "/v1/sessions/{session_id}/fork"
DOCUMENT = openapi_document(LIMITS)


def fork(client: httpx.Client, session_id: str, body: dict[str, object]) -> httpx.Response:
    response = client.post(f"/v1/sessions/{session_id}/fork", json=body)
    check(response, FORK, "post")
    return response


def test_a_fork_at_a_waiting_call_goes_on_on_its_own(server: ServerProcess) -> None:
    with server.client() as client:
        origin = create(client, {"spec": msgspec.to_builtins(ASK_SPEC), "prompt": "q"})
        waiting = settled(client, origin)
        assert waiting.status == "requires_action"
        response = fork(client, origin, {"at_seq": waiting.seq, "new_id": "q-fork"})
        assert response.status_code == 201, response.text
        forked = response.json()
        assert (forked["session_id"], forked["status"]) == ("q-fork", "requires_action")
        assert [call["id"] for call in forked["pending"]] == [waiting.pending[0].id]
        posted = client.post(
            "/v1/sessions/q-fork/tool_results",
            json={"results": [{"tool_use_id": waiting.pending[0].id, "text": "blue"}]},
        )
        assert posted.status_code == 202, posted.text
        assert settled(client, "q-fork").text == answer_for("q", "blue")
        # The origin waits still, and its log is as it was.
        assert settled(client, origin).status == "requires_action"
        assert len(all_events(client, origin)) == waiting.seq
        events = all_events(client, "q-fork")
        assert events[waiting.seq].event == Forked(origin=origin, at_seq=waiting.seq)
        origin_events = all_events(client, origin)
        assert [e.event for e in events[: waiting.seq]] == [e.event for e in origin_events]
        # A fork with no id given gets a new one.
        again = fork(client, origin, {"at_seq": 2})
        assert again.status_code == 201
        assert again.json()["session_id"] not in (origin, "q-fork")


def test_bad_forks_are_refused_naming_the_field(server: ServerProcess) -> None:
    with server.client() as client:
        origin = create(client, {"spec": msgspec.to_builtins(LOOKUP_SPEC), "prompt": "b"})
        done = settled(client, origin)
        cases: list[tuple[str, dict[str, object], int, str, str]] = [
            ("nobody", {"at_seq": 1}, 404, "session_id", "no session nobody"),
            (origin, {"at_seq": done.seq + 1}, 422, "at_seq", "expected an integer from 1 to"),
            (origin, {"at_seq": 0}, 422, "at_seq", "at_seq"),
            (origin, {"at_seq": 2, "new_id": origin}, 409, "new_id", "origin session itself"),
            (origin, {"at_seq": 2, "new_id": "../x"}, 422, "new_id", "matching regex"),
            (origin, {"at_seq": 2, "new": "x"}, 422, "new", "unknown field"),
        ]
        for session_id, body, status, field, words in cases:
            response = fork(client, session_id, body)
            assert response.status_code == status, (body, response.text)
            error = response.json()["error"]
            assert error["field"] == field, error
            assert words in error["message"], error
        taken = fork(client, origin, {"at_seq": 2, "new_id": "b-copy"})
        assert taken.status_code == 201
        again = fork(client, origin, {"at_seq": 2, "new_id": "b-copy"})
        assert again.status_code == 409
        assert again.json()["error"]["field"] == "new_id"


def test_a_priced_sessions_cost_is_in_its_status_and_the_metrics(server: ServerProcess) -> None:
    pricing = Pricing(input_per_million=2.5, output_per_million=10)
    spec = msgspec.to_builtins(msgspec.structs.replace(LOOKUP_SPEC, pricing=pricing))
    with server.client() as client:
        before = metric(client)
        session_id = create(client, {"spec": spec, "prompt": "c"})
        info = settled(client, session_id)
        usage = info.usage
        assert usage.cost == pricing.cost(usage.prompt_tokens, usage.completion_tokens)
        assert usage.cost is not None
        raw = client.get(f"/v1/sessions/{session_id}").json()["usage"]
        assert Decimal(raw["cost"]) == usage.cost
        assert metric(client) - before == pytest.approx(float(usage.cost))


def metric(client: httpx.Client) -> float:
    response = client.get("/v1/metrics")
    assert response.status_code == 200
    samples, types = parse_exposition(response.text)
    assert types["turnkeeper_cost_total"] == "counter"
    return samples[("turnkeeper_cost_total", ())]
