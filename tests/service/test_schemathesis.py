"""Schemathesis drives the real server (hypercorn on 127.0.0.1 over a real Host and SQLite
log) from the OpenAPI document it serves: requests the document allows must be taken,
ones it refuses must be refused with a documented 4xx, and every response must match its
documented status, headers, media type and schema. Stateless (each operation alone: the
coverage cases and generated ones) and stateful (sequences along the document's links,
from a session just created), with bounded examples."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis.errors import Flaky
from schemathesis.errors import FailureGroup
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.service.process import TOKEN, ServerProcess
from tests.service.server_main import LIMITS
from turnkeeper.service import openapi_document

AnyCase = schemathesis.Case[Any]
# Long-polls wait little, so a generated `wait` does not hold the test up.
SERVER_LIMITS = msgspec.structs.replace(LIMITS, max_wait_seconds=0.2)
SERVED = msgspec.json.decode(msgspec.json.encode(openapi_document(SERVER_LIMITS)))
REQUEST_SECONDS = 30
STREAM_SECONDS = 1
EXAMPLES = 15
STEPS = 6


def document_less_mcp_servers() -> dict[str, Any]:
    """The served document, less the spec's `mcp_servers`: the server would start the
    commands and open the URLs that generated data names."""
    document: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(SERVED))
    document["components"]["schemas"]["AgentSpecInput"]["properties"].pop("mcp_servers")
    return document


# schemathesis's own list of the statuses that reject bad data, and 413: a body past the
# size the document states is refused before it is read (generated bad data can be long).
REJECTIONS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
schema = schemathesis.openapi.from_dict(
    document_less_mcp_servers(),
    config=schemathesis.Config.from_dict(
        {
            "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},
            "checks": {"negative_data_rejection": {"expected-statuses": [*REJECTIONS, "5xx"]}},
        }
    ),
)

# The rules the document states in words, as JSON Schema cannot (a terminal tool among
# the tools, a result for each pending call...): a request that breaks one is schema-valid
# and still refused, with a 422 naming the field the rule is about.
RULES: dict[str, list[tuple[str, str]]] = {
    "POST /v1/sessions": [
        (r"spec\.terminal_tool", "is not one of the tools"),
        (r"spec\.tools", "is listed twice"),
        (r"spec\.tools", "names MCP server"),
        (r"spec\.tools\[\d+\]\.input_schema", "cannot be used"),
        (r"spec\.tools\[\d+\]\.approval", "cannot be used"),
        (r"guards\.terminal\.required", "names no terminal_tool"),
        (r"history\[\d+\]\.tool_call_id", "answers no tool call"),
        (r"history\[\d+\]\.tool_calls\[\d+\]\.id", "is the id of an earlier call"),
        (r"prompt", "the history ends in tool calls with no results"),
        (r"spec\.pricing\.\w+", "decimal places"),
        (r"spec\.output_schema", "cannot be used"),
        (r"spec\.output_schema", "not both"),
    ],
    "POST /v1/sessions/{session_id}/fork": [
        (r"at_seq", "expected an integer from 1 to"),
        (r"at_seq", "cuts short the step"),
        (r"at_seq", "would take no messages"),
    ],
    "POST /v1/sessions/{session_id}/tool_results": [(r"results", "")],
    "POST /v1/sessions/{session_id}/approvals": [(r"decisions", "")],
    "GET /v1/sessions": [(r"cursor", "is not the next_cursor of a page")],
}


def accepted_unless_a_stated_rule(ctx: Any, response: Any, case: AnyCase) -> None:
    """schemathesis's `positive_data_acceptance`, but for a 422 naming one of `RULES`, and
    a 413 for a body past the size the document states (generated data that the schema
    allows can be longer: the size is said in words)."""
    if response.status_code == 413:
        body = response.request.body or b""
        size = len(body.encode() if isinstance(body, str) else body)
        if size > SERVER_LIMITS.max_body_bytes:
            return
    if response.status_code == 422:
        error = response.json()["error"]
        for field, words in RULES.get(case.operation.label, []):
            if re.fullmatch(field, error["field"] or "") and words in error["message"]:
                return
    positive_data_acceptance(ctx, response, case)


CHECKS: dict[str, Any] = {
    "excluded_checks": [positive_data_acceptance],
    "additional_checks": [accepted_unless_a_stated_rule],
}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("schemathesis")
    options = ["--max-wait", str(SERVER_LIMITS.max_wait_seconds)]
    with ServerProcess(
        folder / "log.sqlite", stderr_path=folder / "stderr.log", options=options
    ) as server:
        with server.client() as client:
            assert client.get("/v1/openapi.json").json() == SERVED
        yield server
        assert "Traceback" not in Path(server.stderr_path).read_text()


def call_kwargs(server: ServerProcess, case: AnyCase) -> dict[str, Any]:
    # An event stream never ends: schemathesis reads it for this long.
    streams = case.operation.path.endswith("/stream")
    return {"base_url": server.url, "timeout": STREAM_SECONDS if streams else REQUEST_SECONDS}


@schema.parametrize()
@settings(max_examples=EXAMPLES, suppress_health_check=list(HealthCheck))
def test_each_operation_answers_as_documented(case: AnyCase, target: ServerProcess) -> None:
    case.call_and_validate(**call_kwargs(target, case), **CHECKS)


class Sequences(schema.as_state_machine()):  # type: ignore[misc]
    """Sequences of calls along the document's links (and the ones schemathesis infers
    from the response schemas), each response checked as it comes."""

    server: ClassVar[ServerProcess]
    found: ClassVar[list[FailureGroup]] = []

    def get_call_kwargs(self, case: AnyCase) -> dict[str, Any]:
        return call_kwargs(self.server, case)

    def validate_response(self, response: Any, case: AnyCase, **kwargs: Any) -> None:
        try:
            case.validate_response(response, **CHECKS, transport_kwargs=kwargs)
        except FailureGroup as failure:
            self.found.append(failure)
            raise


def test_sequences_of_operations_answer_as_documented(target: ServerProcess) -> None:
    Sequences.server = target
    try:
        Sequences.run(
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=STEPS,
                suppress_health_check=list(HealthCheck),
            )
        )
    except Flaky:
        # Hypothesis replays a sequence to the server, whose sessions have moved on since
        # (an id now taken, a longer list), so it may answer otherwise: not a failure of
        # its own, but a failure that came first still is one.
        if Sequences.found:
            raise Sequences.found[0] from None


def test_the_stream_is_documented_as_what_it_serves(target: ServerProcess) -> None:
    operation = SERVED["paths"]["/v1/sessions/{session_id}/events/stream"]["get"]
    with target.client() as client:
        session_id = client.post("/v1/sessions", json={"prompt": "p"}).json()["session_id"]
        with client.stream("GET", f"/v1/sessions/{session_id}/events/stream") as response:
            assert response.status_code == 200
            media = response.headers["content-type"].partition(";")[0]
            assert list(operation["responses"]["200"]["content"]) == [media]
            assert next(response.iter_lines()).startswith("id: 1")
