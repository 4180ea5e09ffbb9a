"""Prometheus text exposition (format 0.0.4) of the host's sessions and counters."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import get_args

import msgspec

from turnkeeper.sessions import HostStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

STATUSES: tuple[str, ...] = get_args(HostStatus)

COUNTERS: tuple[tuple[str, str], ...] = (
    ("model_calls", "Model calls made."),
    ("chat_retries", "Model calls retried after a transient failure."),
    ("chat_errors", "Model calls that failed after their retries."),
    ("guard_halts", "Sessions stopped by a loop guard."),
    ("tool_errors", "Tool calls that ended in an error result."),
    ("session_crashes", "Session tasks that crashed and were restarted or failed."),
)

QUANTILES = (0.5, 0.9, 0.99)


def render_metrics(
    statuses: Mapping[str, int],
    counters: Mapping[str, int],
    append_seconds: Sequence[float],
    appended: tuple[int, float],
    fleet: FleetFigures | None = None,
    cost: Decimal = Decimal(0),
) -> str:
    """The exposition: sessions by status, each counter as `turnkeeper_<name>_total`, and
    a summary of log append latency: its quantiles over `append_seconds` (the host's
    recent appends), and its `_count` and `_sum` over every append, `appended`; what the
    model calls cost, `cost`; and, of a worker of a fleet, its `fleet` figures."""
    lines = [
        "# HELP turnkeeper_sessions Sessions by status.",
        "# TYPE turnkeeper_sessions gauge",
    ]
    lines.extend(
        f'turnkeeper_sessions{{status="{status}"}} {statuses.get(status, 0)}' for status in STATUSES
    )
    for name, help_text in COUNTERS:
        metric = f"turnkeeper_{name}_total"
        lines += [
            f"# HELP {metric} {help_text}",
            f"# TYPE {metric} counter",
            f"{metric} {counters.get(name, 0)}",
        ]
    lines += [
        "# HELP turnkeeper_cost_total What the model calls cost, by their sessions' pricing "
        "(in its currency; sessions without pricing add nothing).",
        "# TYPE turnkeeper_cost_total counter",
        f"turnkeeper_cost_total {_number(float(cost))}",
        "# HELP turnkeeper_log_append_seconds Event log append latency (quantiles over the "
        "host's recent appends).",
        "# TYPE turnkeeper_log_append_seconds summary",
    ]
    ordered = sorted(append_seconds)
    lines.extend(
        f'turnkeeper_log_append_seconds{{quantile="{q}"}} {_number(quantile(ordered, q))}'
        for q in QUANTILES
    )
    count, total = appended
    lines += [
        f"turnkeeper_log_append_seconds_sum {_number(total)}",
        f"turnkeeper_log_append_seconds_count {count}",
    ]
    if fleet is not None:
        lines += _fleet_lines(fleet)
    return "\n".join(lines) + "\n"


class FleetFigures(msgspec.Struct, frozen=True):
    """What a worker of a fleet adds to its metrics."""

    owned_sessions: int
    inbox_depth: int
    takeovers: int
    fence_losses: int


def _fleet_lines(fleet: FleetFigures) -> list[str]:
    return [
        "# HELP turnkeeper_owned_sessions Sessions this worker owns.",
        "# TYPE turnkeeper_owned_sessions gauge",
        f"turnkeeper_owned_sessions {fleet.owned_sessions}",
        "# HELP turnkeeper_inbox_depth Requests in the inbox of this worker's sessions, not "
        "consumed yet.",
        "# TYPE turnkeeper_inbox_depth gauge",
        f"turnkeeper_inbox_depth {fleet.inbox_depth}",
        "# HELP turnkeeper_takeovers_total Sessions this worker took from a worker whose "
        "lease had expired.",
        "# TYPE turnkeeper_takeovers_total counter",
        f"turnkeeper_takeovers_total {fleet.takeovers}",
        "# HELP turnkeeper_fence_losses_total Writes refused because another worker had "
        "taken the session.",
        "# TYPE turnkeeper_fence_losses_total counter",
        f"turnkeeper_fence_losses_total {fleet.fence_losses}",
    ]


def quantile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile of sorted values; NaN when there are none."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def _number(value: float) -> str:
    return "NaN" if math.isnan(value) else repr(float(value))
