"""The errors: a ChatError keeps only what its events can log."""

from __future__ import annotations

import pytest

from turnkeeper.core._errors import ChatError, InputError, LogError, TurnkeeperError


def test_a_chat_errors_lone_surrogates_become_question_marks() -> None:
    error = ChatError(b"upstream said \xff".decode("utf-8", "surrogateescape"), transient=True)
    assert error.message == str(error) == "upstream said ?"
    assert ChatError("plain, café", transient=True).message == "plain, café"


@pytest.mark.parametrize(
    ("given", "kept"),
    [((429, 2.5), (429, 2.5)), ((True, 3), (None, 3.0)), (("503", float("nan")), (None, None))],
)
def test_a_chat_error_keeps_a_status_and_retry_after_only_of_the_right_kinds(
    given: tuple[object, object], kept: tuple[int | None, float | None]
) -> None:
    status, retry_after = given
    error = ChatError("x", transient=1, status=status, retry_after=retry_after)  # type: ignore[arg-type]
    assert (error.status, error.retry_after, error.transient) == (*kept, True)
    assert ChatError("x", transient=False, retry_after=float("inf")).retry_after is None


def test_a_chat_error_message_that_is_not_text_is_made_text() -> None:
    assert ChatError(404, transient=False).message == "404"  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", [LogError, InputError, TurnkeeperError])
def test_an_errors_text_escapes_lone_surrogates(kind: type[TurnkeeperError]) -> None:
    text = str(kind("session a\udcff, café"))
    assert text == "session a\\udcff, café"
    text.encode("utf-8")
