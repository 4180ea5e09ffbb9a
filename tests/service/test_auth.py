"""Bearer tokens: what the header must carry, and where the token comes from."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.core import InputError
from turnkeeper.service._auth import (
    TOKEN_VARIABLE,
    bearer_problem,
    check_token,
    resolve_token,
)

TOKEN = b"s3cret-token"


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (None, "missing Authorization"),
        (b"", "Bearer scheme"),
        (b"Basic s3cret-token", "Bearer scheme"),
        (b"s3cret-token", "Bearer scheme"),
        (b"Bearer", "wrong token"),
        (b"Bearer s3cret", "wrong token"),
        (b"Bearer s3cret-token-and-more", "wrong token"),
        (b"Bearer S3CRET-TOKEN", "wrong token"),
    ],
)
def test_a_header_without_the_token_says_why(header: bytes | None, problem: str) -> None:
    found = bearer_problem(header, TOKEN)
    assert found is not None
    assert problem in found


@pytest.mark.parametrize(
    "header", [b"Bearer s3cret-token", b"bearer s3cret-token", b"BEARER  s3cret-token "]
)
def test_the_token_under_any_case_of_the_scheme_passes(header: bytes) -> None:
    assert bearer_problem(header, TOKEN) is None


@given(st.binary())
def test_only_the_exact_token_passes(credentials: bytes) -> None:
    passed = bearer_problem(b"Bearer " + credentials, TOKEN) is None
    assert passed == (credentials.strip() == TOKEN)


def test_the_token_comes_from_the_argument_then_the_environment_then_chance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TOKEN_VARIABLE, "from-env")
    assert resolve_token("given") == "given"
    assert resolve_token(None) == "from-env"
    monkeypatch.delenv(TOKEN_VARIABLE)
    generated = resolve_token(None)
    assert len(generated) >= 32
    assert resolve_token(None) != generated
    check_token(generated)


@pytest.mark.parametrize("token", ["", "two words", "tab\there", "ünïcode", "line\nbreak"])
def test_tokens_that_cannot_travel_in_a_header_are_refused(token: str) -> None:
    with pytest.raises(InputError, match="token"):
        check_token(token)


def test_a_bad_token_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_VARIABLE, "has space")
    with pytest.raises(InputError, match="token"):
        resolve_token(None)
