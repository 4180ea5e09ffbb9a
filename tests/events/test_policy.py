"""Guard configuration: every numeric setting is bounded, in Python and when decoded."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from turnkeeper.events import (
    Budget,
    ConsecutiveErrors,
    GuardConfig,
    InputError,
    LoopDetection,
    SmallModel,
    TerminalTool,
)

# (struct, field, values refused, the smallest value accepted)
BOUNDS: list[tuple[type[msgspec.Struct], str, list[Any], Any]] = [
    (ConsecutiveErrors, "threshold", [0, -1, 1.5, True, "2", None], 1),
    (LoopDetection, "warnings", [-1, -(10**30), 0.5, False, "1", None], 0),
    (TerminalTool, "max_reprompts", [-1, 2.0, True, "2", None], 0),
    (Budget, "max_tokens", [0, -5, 1.5, True, "10"], 1),
    (
        Budget,
        "max_seconds",
        [0, 0.0, -1.5, math.nan, math.inf, -math.inf, 10**400, True, "1"],
        1e-9,
    ),
    (SmallModel, "window_turns", [0, -1, -(2**70), 1.5, True, "3", None], 1),
    (SmallModel, "max_result_chars", [0, -1, 2.5, True, "3", None], 1),
]
REFUSED = [(kind, field, value) for kind, field, values, _ in BOUNDS for value in values]


@pytest.mark.parametrize(("kind", "field", "value"), REFUSED)
def test_an_out_of_range_setting_is_refused_naming_it(
    kind: type[msgspec.Struct], field: str, value: Any
) -> None:
    with pytest.raises(InputError, match=rf"^{kind.__name__}\.{field}: expected "):
        kind(**{field: value})


@pytest.mark.parametrize(("kind", "field", "value"), REFUSED)
def test_an_out_of_range_setting_is_refused_when_decoded(
    kind: type[msgspec.Struct], field: str, value: Any
) -> None:
    # A value of the wrong type, or past what the type holds, is msgspec's to refuse.
    refused = rf"^({kind.__name__}\.{field}: expected |Expected |Number out of range)"
    with pytest.raises(msgspec.ValidationError, match=refused):
        msgspec.convert({field: value}, kind)


def test_the_service_and_cli_path_names_the_field_and_where_it_is() -> None:
    body = b'{"small_model": {"window_turns": -1}}'
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(body, type=GuardConfig)
    assert str(caught.value) == (
        "SmallModel.window_turns: expected an integer >= 1, got -1 - at `$.small_model`"
    )


@pytest.mark.parametrize(("kind", "field", "least"), [(k, f, v) for k, f, _, v in BOUNDS])
def test_the_smallest_meaningful_setting_is_accepted(
    kind: type[msgspec.Struct], field: str, least: Any
) -> None:
    config = kind(**{field: least})
    assert getattr(config, field) == least
    assert msgspec.convert(msgspec.to_builtins(config), kind) == config


def test_defaults_and_large_settings_are_accepted() -> None:
    assert GuardConfig() == msgspec.json.decode(b"{}", type=GuardConfig)
    large = Budget(max_tokens=10**30, max_seconds=1e300)
    assert (large.max_tokens, large.max_seconds) == (10**30, 1e300)
    assert Budget(max_seconds=2).max_seconds == 2
    assert SmallModel(window_turns=10**6).window_turns == 10**6


def test_replace_checks_the_new_value_too() -> None:
    with pytest.raises(InputError, match=r"^LoopDetection\.warnings: "):
        msgspec.structs.replace(LoopDetection(), warnings=-1)


def test_terminal_required_must_be_a_bool() -> None:
    with pytest.raises(InputError, match=r"^TerminalTool\.required: expected true or false"):
        TerminalTool(required="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [("small_model", {"window_turns": 3}), ("loop", LoopDetection), ("budget", SmallModel())],
)
def test_a_guard_config_holds_only_its_own_settings(field: str, value: Any) -> None:
    with pytest.raises(InputError, match=rf"^GuardConfig\.{field}: expected a \w+ or None"):
        GuardConfig(**{field: value})
