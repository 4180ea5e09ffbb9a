"""The unreadable flag, read from a live response and from a logged one; the flaws that make a
reply without calls no answer."""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.core import AgentSpec, ToolSpec, ToolUse
from turnkeeper.core._calls import (
    call_problem,
    degenerate,
    is_unreadable,
    logged_unreadable,
    reply_flaw,
)

FLAGS = st.one_of(
    st.fixed_dictionaries({"unreadable": st.sampled_from([True, False, 1, "true", None])}),
    st.sampled_from([True, "unreadable", [True], {}]),
)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["turnkeeper", "id", "x"]), inner, max_size=3)
    ),
    max_leaves=8,
)
RESPONSES = st.dictionaries(
    st.sampled_from(["turnkeeper", "choices", "id", "note", "é"]),
    FLAGS | VALUES,
    max_size=4,
)


@given(RESPONSES)
def test_a_logged_response_is_flagged_as_the_live_one_is(response: dict[str, Any]) -> None:
    assert logged_unreadable(msgspec.Raw(msgspec.json.encode(response))) == is_unreadable(response)


@pytest.mark.parametrize(
    ("spelled", "flagged"),
    [
        (b'{"turnkeeper": {"unreadable": true}}', True),
        (b'{"\\u0074urnkeeper":{"unreadable":true}}', True),
        (b'{"turnkeep\\u0065r":{"unr\\u0065adable":true}}', True),
        (b'{"turnkeeper":{"unreadable":false}}', False),
        (b'{"note":"turnkeeper unreadable true"}', False),
        (b'{"x":{"turnkeeper":{"unreadable":true}}}', False),
        (b'{"choices":[]}', False),
        # Not what this package logs, but what a log written by hand may hold.
        (b'["turnkeeper", {"unreadable": true}]', False),
        (b'"\\u0074urnkeeper"', False),
    ],
)
def test_a_logged_response_is_flagged_however_it_is_spelled(spelled: bytes, flagged: bool) -> None:
    assert logged_unreadable(msgspec.Raw(spelled)) is flagged


@pytest.mark.parametrize(
    "text",
    [
        "I will call finish now. " * 10,
        "the " * 40,
        "Sure! The answer is 391. " + "I hope this helps! " * 8,
        "word " * 2000,
        "x y z " + "a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F " * 5,
        # Stuck inside one word, as SmolLM2-135M was writing an answer's text.
        "final_a_n_s_f_l" + "_a_n_s_f_l" * 30,
        "The answer: " + "abab" * 20,
    ],
)
def test_a_phrase_repeated_over_and_over_is_degenerate(text: str) -> None:
    assert degenerate(text)
    assert reply_flaw(text, "stop") == "it repeats one phrase over and over"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "The answer is 391.",
        "no no no no no no",
        "ha " * 14,
        "The sum is 17 + 23 = 40, and 40 times 2 is 80, so the answer is 80 in the end.",
        "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n| 5 | 6 |\n| 7 | 8 |",
        "Step 1: add 1. Step 2: add 2. Step 3: add 3. Step 4: add 4. Step 5: add 5.",
        "A long answer that only ends in a refrain. " * 1 + "yes yes yes yes yes",
        # One phrase repeated, but in under half of the reply.
        " ".join(f"w{i}" for i in range(40)) + " go on " * 6,
        "hahahahahahahahahahahahahahaha, that is a good one!",
        "The result is 3.3333333333333333333333333333333333333333333 as the tool said, "
        "rounded to two places 3.33, which is what you asked for in the first place.",
        "Results:\n" + "=" * 40 + "\n1. apples\n2. pears\n3. plums\n4. figs\n5. limes",
    ],
)
def test_other_text_is_not_degenerate(text: str) -> None:
    assert not degenerate(text)
    assert reply_flaw(text, "stop") is None


def test_a_reply_cut_off_by_the_token_limit_is_flawed_whatever_it_says() -> None:
    assert reply_flaw("The answer", "length") == "it was cut off by the token limit"
    assert reply_flaw(None, "length") == "it was cut off by the token limit"
    assert reply_flaw(None, "stop") is None
    assert reply_flaw("The answer is 4.", None) is None


@given(st.text(max_size=300))
def test_degenerate_reads_any_text(text: str) -> None:
    assert degenerate(text) in (True, False)


@given(
    unit=st.text("abcxyz_-", min_size=2, max_size=16),
    times=st.integers(40, 80),
    before=st.text("abc ", max_size=20),
)
def test_any_short_string_written_over_and_over_is_degenerate(
    unit: str, times: int, before: str
) -> None:
    assert degenerate(before + unit * times)


@given(
    phrase=st.lists(st.text("abcxyz", min_size=1, max_size=5), min_size=2, max_size=32),
    times=st.integers(8, 40),
)
def test_any_phrase_repeated_eight_times_or_more_is_degenerate(
    phrase: list[str], times: int
) -> None:
    assert degenerate(" ".join(phrase * times))


def test_a_spec_made_where_another_was_gets_its_own_verdict() -> None:
    # A spec collected and another made in its place may get its id (CPython reuses the
    # memory at once, as this loop did until verdicts held their specs): each spec's
    # verdicts are its own all the same.
    use = ToolUse("call_1", "f", {"n": "abc"})

    def spec(kind: str) -> AgentSpec:
        schema = {"type": "object", "properties": {"n": {"type": kind}}, "required": ["n"]}
        return AgentSpec(tools=(ToolSpec("f", "f", schema),))

    for _ in range(100):
        first = spec("integer")
        assert call_problem(first, use) is not None
        del first
        gc.collect()
        assert call_problem(spec("string"), use) is None
