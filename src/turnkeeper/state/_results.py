"""Tool results logged once: a `local.tool_results` event refers to the results its
session's `local.tool_result` events already hold instead of holding their text again."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from turnkeeper.core import ReplayError, ToolResult
from turnkeeper.events import ToolResultsReceived, ToolReturned


def results_received(
    returned: Sequence[ToolResult], results: Sequence[ToolResult]
) -> ToolResultsReceived:
    """The event logging `results`, each one that `returned` (the results the session's
    `local.tool_result` events hold, as `SessionState.returned` does) holds the same
    given by position, without its text."""
    if not returned:
        return ToolResultsReceived(results=tuple(results))
    by_id = {result.tool_use_id: result for result in returned}
    stored: list[ToolResult] = []
    logged: list[int] = []
    for index, result in enumerate(results):
        if result.text and by_id.get(result.tool_use_id) == result:
            logged.append(index)
            stored.append(ToolResult(result.tool_use_id, "", result.is_error))
        else:
            stored.append(result)
    return ToolResultsReceived(results=tuple(stored), logged=tuple(logged))


def results_of(
    returned: Iterable[ToolResult | ToolReturned], event: ToolResultsReceived
) -> tuple[ToolResult, ...] | None:
    """The event's results whole, each one it gives by position taken from `returned`
    (the results logged before it, the last of each call counting); None if one of
    those is not there (a damaged or hand-made log)."""
    if not event.logged:
        return event.results
    by_id: dict[str, ToolResult] = {}
    for result in returned:
        if isinstance(result, ToolReturned):
            by_id[result.tool_call_id] = ToolResult(
                result.tool_call_id, result.text, result.is_error
            )
        else:
            by_id[result.tool_use_id] = result
    results = list(event.results)
    for index in event.logged:
        if not 0 <= index < len(results):
            return None
        found = by_id.get(results[index].tool_use_id)
        if found is None:
            return None
        results[index] = found
    return tuple(results)


def whole_results(
    returned: Iterable[ToolResult | ToolReturned], event: ToolResultsReceived, where: str
) -> tuple[ToolResult, ...]:
    """`results_of`, or ReplayError naming `where` (the session and seq) if it is None."""
    results = results_of(returned, event)
    if results is None:
        raise ReplayError(
            f"{where} refers to a tool result (positions {list(event.logged)}) that no "
            "earlier local.tool_result of a pending call holds"
        )
    return results
