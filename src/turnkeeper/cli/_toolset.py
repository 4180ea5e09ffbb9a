"""Tools for `turnkeeper run`: the examples, or a user's list loaded from `module:object`.

The object is a list (or tuple) whose items are `(ToolSpec, async function)` pairs, plus at
most one bare ToolSpec: the terminal tool, which has no function because calling it ends
the run with its arguments as the result.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from turnkeeper.core import InputError, ToolSpec
from turnkeeper.tools import EXAMPLE_TOOLS

ToolFunction = Callable[..., Awaitable[Any]]


class Toolset(msgspec.Struct, frozen=True):
    """Tool specs in order, the function of each non-terminal one, and the terminal tool."""

    specs: tuple[ToolSpec, ...]
    functions: dict[str, ToolFunction]
    terminal: str | None


def _is_async(function: object) -> bool:
    """An async function, or an object whose `__call__` is one."""
    return callable(function) and (
        inspect.iscoroutinefunction(function)
        or inspect.iscoroutinefunction(type(function).__call__)
    )


def toolset(tools: object, where: str) -> Toolset:
    """Check the documented shape of `tools` and split it; InputError names what is wrong."""
    if not isinstance(tools, list | tuple):
        raise InputError(
            f"{where}: expected a list of (ToolSpec, async function) pairs, "
            f"got {type(tools).__name__}"
        )
    specs: list[ToolSpec] = []
    functions: dict[str, ToolFunction] = {}
    terminal: str | None = None
    for index, item in enumerate(tools):
        if isinstance(item, ToolSpec):
            if terminal is not None:
                raise InputError(
                    f"{where}[{index}]: a second bare ToolSpec ({item.name!r}); only the "
                    f"terminal tool has no function, and that is {terminal!r}"
                )
            terminal = item.name
            specs.append(item)
            continue
        if not (
            isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[0], ToolSpec)
        ):
            raise InputError(
                f"{where}[{index}]: expected a (ToolSpec, async function) pair or a ToolSpec, "
                f"got {item!r:.80}"
            )
        spec, function = item
        if not _is_async(function):
            raise InputError(f"{where}[{index}]: the function of {spec.name!r} must be async")
        specs.append(spec)
        functions[spec.name] = function
    names = [spec.name for spec in specs]
    for name in names:
        if names.count(name) > 1:
            raise InputError(f"{where}: tool {name!r} is listed twice")
    return Toolset(tuple(specs), functions, terminal)


def example_tools() -> Toolset:
    """The example tools: calculator, convert_units, count_text, current_time, capital_of,
    and finish (the terminal tool)."""
    return toolset(EXAMPLE_TOOLS, "EXAMPLE_TOOLS")


def load_tools(reference: str) -> Toolset:
    """The tools named by `module:object` (the module is imported; the working directory
    is on the import path, as with `python -m`)."""
    where = f"--tools {reference}"
    module_name, colon, attribute = reference.partition(":")
    if not colon or not module_name or not attribute:
        raise InputError(f"--tools: expected MODULE:OBJECT, got {reference!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    # Importing runs the user's code, which may raise anything.
    except Exception as exc:
        raise InputError(
            f"{where}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    value: object = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise InputError(f"{where}: {module_name!r} has no attribute {attribute!r}") from None
    return toolset(value, where)
