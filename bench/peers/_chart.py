"""The results chart: one bar chart per measure with a target, one bar per framework."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The `bench` extra installs these; without it, mypy sees them as Any (hence the ignores).
import matplotlib  # type: ignore[import-not-found, unused-ignore]

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

COLORS = {"turnkeeper": "#2a9d8f"}
PEER_COLOR = "#8d99ae"


@dataclass(frozen=True)
class Panel:
    """One bar chart: the measure `key`, its title, the scale it is shown at, and
    turnkeeper's target as a ratio to the best peer."""

    key: str
    title: str
    scale: float
    target: float


def chart(summary: dict[str, Any], path: Path, panels: list[Panel]) -> None:
    """Write a PNG with a bar chart per panel, values labelled, to `path`. A dashed line
    marks turnkeeper's target on each: the best peer's value times the panel's target."""
    measured = [f for f in summary["frameworks"] if f["status"] == "ok"]
    columns = 2
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(12, 4.2 * rows), squeeze=False)
    for axis in axes.flat[len(panels) :]:
        axis.set_visible(False)
    for axis, panel in zip(axes.flat, panels, strict=False):
        shown = [f for f in measured if f["measures"][panel.key] is not None]
        names = [f["name"] for f in shown]
        values = [f["measures"][panel.key] * panel.scale for f in shown]
        bars = axis.bar(names, values, color=[COLORS.get(n, PEER_COLOR) for n in names])
        axis.set_title(panel.title, fontsize=10)
        axis.bar_label(bars, labels=[f"{value:,.1f}" for value in values], padding=2)
        axis.margins(y=0.15)
        peers = [value for name, value in zip(names, values, strict=True) if name != "turnkeeper"]
        if peers and "turnkeeper" in names:
            goal = min(peers) * panel.target
            label = f"turnkeeper's target: best peer / {round(1 / panel.target)}"
            axis.axhline(goal, color="#e76f51", linestyle="--", linewidth=1, label=label)
            axis.legend(loc="upper left", fontsize=8, frameon=False)
        axis.tick_params(axis="x", labelrotation=15)
    machine = summary["machine"]
    figure.suptitle(
        f"turnkeeper vs peers, zero-latency scripted model — {machine['cpu']}, "
        f"{machine['cores']} cores, {machine['python']}, {summary['date'][:10]}",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
