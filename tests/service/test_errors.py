"""Errors as responses: the field named from msgspec's messages, and the JSON body."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.service import ApiError, CreateSession, ErrorBody, PostToolResults
from turnkeeper.service._errors import field_of, validation_error


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        (CreateSession, {"prompt": 1}, "prompt"),
        (CreateSession, {"spec": {"tools": [{"name": "a b"}]}}, "spec.tools[0].name"),
        (
            CreateSession,
            {"spec": {"tools": [{"name": "a", "input_schema": 3}]}},
            "spec.tools[0].input_schema",
        ),
        (CreateSession, {"spec": {"tools": [{}]}}, "spec.tools[0].name"),
        (CreateSession, {"spec": {"terminal_tool": "x"}}, "spec.terminal_tool"),
        (CreateSession, {"guards": {"loop": {"nope": 1}, "max_turns": "x"}}, "guards.max_turns"),
        (CreateSession, {"unknown": 1}, "unknown"),
        (CreateSession, {"history": [{"role": "user"}, 5]}, "history[1]"),
        (CreateSession, [], "body"),
        (PostToolResults, {}, "results"),
        (PostToolResults, {"results": [{"tool_use_id": "a", "text": 1}]}, "results[0].text"),
        (PostToolResults, {"results": [{"tool_use_id": "a"}]}, "results[0].text"),
    ],
)
def test_validation_errors_name_the_field(
    kind: type[msgspec.Struct], body: Any, field: str
) -> None:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(msgspec.json.encode(body), type=kind)
    error = validation_error(caught.value)
    assert error.status == 422
    assert error.field == field, error.message
    assert error.message == str(caught.value)


@given(st.text())
def test_field_of_any_message_is_a_field_or_body(message: str) -> None:
    field = field_of(message)
    assert field
    assert not field.startswith(".")


def test_an_api_error_is_json_with_its_status_and_headers() -> None:
    response = ApiError(429, "slow down", None, {"Retry-After": "1"}).response()
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "1"
    assert response.headers["content-type"] == "application/json"
    body = msgspec.json.decode(bytes(response.body), type=ErrorBody)
    assert body.error.message == "slow down"
    assert body.error.field is None
