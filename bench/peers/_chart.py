"""The results chart: per-turn overhead and memory per session, one bar per framework."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The `bench` extra installs these; without it, mypy sees them as Any (hence the ignores).
import matplotlib  # type: ignore[import-not-found, unused-ignore]

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

COLORS = {"turnkeeper": "#2a9d8f"}
PEER_COLOR = "#8d99ae"


def chart(summary: dict[str, Any], path: Path, targets: tuple[float, float]) -> None:
    """Write a PNG with two bar charts, values labelled, to `path`. A dashed line marks
    turnkeeper's target on each: the best peer's value times `targets` (overhead, memory)."""
    measured = [f for f in summary["frameworks"] if f["status"] == "ok"]
    panels = (
        ("per_turn_overhead_us", "per-turn overhead (µs, median)", 1.0, targets[0]),
        ("memory_per_session_bytes", "memory per parked session (KB RSS)", 1 / 1024, targets[1]),
    )
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for axis, (key, title, scale, target) in zip(axes, panels, strict=True):
        shown = [f for f in measured if f[key] is not None]
        names = [f["name"] for f in shown]
        values = [f[key] * scale for f in shown]
        bars = axis.bar(names, values, color=[COLORS.get(n, PEER_COLOR) for n in names])
        axis.set_title(title)
        axis.bar_label(bars, labels=[f"{value:,.1f}" for value in values], padding=2)
        axis.margins(y=0.15)
        peers = [value for name, value in zip(names, values, strict=True) if name != "turnkeeper"]
        if peers and "turnkeeper" in names:
            goal = min(peers) * target
            label = f"turnkeeper's target: best peer / {round(1 / target)}"
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
