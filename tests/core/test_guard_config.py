"""Guard configuration: `check_guards` bounds every numeric setting of new input, while
decoding takes what a log holds as it is."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest

from turnkeeper.core._errors import InputError
from turnkeeper.core._guard_config import (
    Budget,
    ConsecutiveErrors,
    GuardConfig,
    LoopDetection,
    SelfFeeding,
    SmallModel,
    TerminalTool,
    check_guards,
)

# (guard, its kind, setting, values refused, the smallest value accepted)
BOUNDS: list[tuple[str, type[msgspec.Struct], str, list[Any], Any]] = [
    ("consecutive_errors", ConsecutiveErrors, "threshold", [0, -1, 1.5, True, "2", None], 1),
    ("loop", LoopDetection, "warnings", [-1, -(10**30), 0.5, False, "1", None], 0),
    ("self_feeding", SelfFeeding, "max_links", [0, -1, 1.5, True, "2", None], 1),
    ("self_feeding", SelfFeeding, "warnings", [-1, 0.5, False, "1", None], 0),
    ("terminal", TerminalTool, "max_reprompts", [-1, 2.0, True, "2", None], 0),
    ("budget", Budget, "max_tokens", [0, -5, 1.5, True, "10"], 1),
    (
        "budget",
        Budget,
        "max_seconds",
        [0, 0.0, -1.5, math.nan, math.inf, -math.inf, 10**400, True, "1"],
        1e-9,
    ),
    ("small_model", SmallModel, "window_turns", [0, -1, -(2**70), 1.5, True, "3", None], 1),
    ("small_model", SmallModel, "max_result_chars", [0, -1, 2.5, True, "3", None], 1),
]
REFUSED = [
    (guard, kind, field, value) for guard, kind, field, values, _ in BOUNDS for value in values
]
# Out of range, but of the type a log holds: what a log written before the bounds may hold.
LOGGED: list[tuple[str, str, Any]] = [
    ("consecutive_errors", "threshold", 0),
    ("loop", "warnings", -1),
    ("self_feeding", "max_links", 0),
    ("terminal", "max_reprompts", -1),
    ("budget", "max_tokens", 0),
    ("budget", "max_seconds", 0.0),
    ("budget", "max_seconds", -1.5),
    ("small_model", "window_turns", 0),
    ("small_model", "window_turns", -1),
    ("small_model", "max_result_chars", 0),
]


@pytest.mark.parametrize(("guard", "kind", "field", "value"), REFUSED)
def test_an_out_of_range_setting_is_refused_naming_it(
    guard: str, kind: type[msgspec.Struct], field: str, value: Any
) -> None:
    setting: Any = kind(**{field: value})
    config = GuardConfig(**{guard: setting})
    with pytest.raises(InputError, match=rf"^guards\.{guard}\.{field}: expected "):
        check_guards(config)


@pytest.mark.parametrize(("guard", "field", "value"), LOGGED)
def test_an_out_of_range_setting_decodes_as_logged(guard: str, field: str, value: Any) -> None:
    raw = msgspec.json.encode({guard: {field: value}})
    config = msgspec.json.decode(raw, type=GuardConfig)
    assert getattr(getattr(config, guard), field) == value
    with pytest.raises(InputError, match=rf"^guards\.{guard}\.{field}: expected "):
        check_guards(config)


def test_the_message_names_the_setting_and_the_value() -> None:
    config = GuardConfig(small_model=SmallModel(window_turns=-1))
    with pytest.raises(InputError) as caught:
        check_guards(config)
    assert str(caught.value) == (
        "guards.small_model.window_turns: expected an integer >= 1, got -1"
    )


@pytest.mark.parametrize(
    ("guard", "kind", "field", "least"), [(g, k, f, v) for g, k, f, _, v in BOUNDS]
)
def test_the_smallest_meaningful_setting_is_accepted(
    guard: str, kind: type[msgspec.Struct], field: str, least: Any
) -> None:
    setting: Any = kind(**{field: least})
    config = GuardConfig(**{guard: setting})
    check_guards(config)
    assert msgspec.convert(msgspec.to_builtins(config), GuardConfig) == config


def test_defaults_and_large_settings_are_accepted() -> None:
    check_guards(GuardConfig())
    check_guards(
        GuardConfig(
            budget=Budget(max_tokens=10**30, max_seconds=1e15),
            small_model=SmallModel(window_turns=10**6),
        )
    )
    check_guards(GuardConfig(budget=Budget(max_seconds=2)))


def test_settings_as_logged_are_not_checked_but_a_changed_guard_is() -> None:
    logged = msgspec.json.decode(
        b'{"loop": {"warnings": -1}, "budget": {"max_tokens": 0}}', type=GuardConfig
    )
    check_guards(logged, since=logged)
    turned_off = msgspec.structs.replace(logged, budget=None)
    check_guards(turned_off, since=logged)
    changed = msgspec.structs.replace(logged, small_model=SmallModel(max_result_chars=0))
    with pytest.raises(InputError, match=r"^guards\.small_model\.max_result_chars: "):
        check_guards(changed, since=logged)
    with pytest.raises(InputError, match=r"^guards\.loop\.warnings: "):
        check_guards(logged, since=GuardConfig())


def test_terminal_required_must_be_a_bool() -> None:
    config = GuardConfig(terminal=TerminalTool(required="yes"))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^guards\.terminal\.required: expected true or false"):
        check_guards(config)


@pytest.mark.parametrize(
    ("field", "value"),
    [("small_model", {"window_turns": 3}), ("loop", LoopDetection), ("budget", SmallModel())],
)
def test_a_guard_config_holds_only_its_own_settings(field: str, value: Any) -> None:
    with pytest.raises(InputError, match=rf"^guards\.{field}: expected a \w+ or None"):
        check_guards(GuardConfig(**{field: value}))


def test_only_a_guard_config_is_checked() -> None:
    with pytest.raises(InputError, match=r"^guards: expected a GuardConfig, got dict$"):
        check_guards({"loop": None})  # type: ignore[arg-type]


def test_a_config_logged_before_self_feeding_existed_reads_with_it_on() -> None:
    # As a log written before the field was added holds a configuration: without it.
    logged = msgspec.to_builtins(GuardConfig(loop=LoopDetection(warnings=3)))
    del logged["self_feeding"]
    config = msgspec.convert(logged, GuardConfig)
    assert config == GuardConfig(loop=LoopDetection(warnings=3))
    assert config.self_feeding == SelfFeeding(max_links=2, warnings=1)
    check_guards(config)


def test_self_feeding_is_turned_off_with_none() -> None:
    config = msgspec.json.decode(b'{"self_feeding": null}', type=GuardConfig)
    assert config.self_feeding is None
    check_guards(config)
