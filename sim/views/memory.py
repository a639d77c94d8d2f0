"""memory.png: every rank's memory over the step, a pure function of a MemoryTimeline.

Top panel: each rank's total as a step line (the worst ranks coloured and labelled, the rest thin
grey), with the GPU's capacity dashed. Below: the worst few ranks (highest total peak, ties by rank
id), one small panel each, their categories stacked (weights, gradients, optimizer, activations,
other) under the same dashed capacity. Bytes in GiB, time in us, ms or s. The PNG is
byte-identical for the same timeline (no timestamp or version in its metadata).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from clustersim.sim.results.memory import CATEGORIES, MemoryTimeline, RankMemory
from clustersim.sim.results.table import time_unit

GIB = 2.0**30
WORST_RANKS = 4
CATEGORY_COLOURS = {
    "weights": "#3b6fb6",
    "gradients": "#3f9b57",
    "optimizer": "#c0504d",
    "activations": "#d9954a",
    "other": "#9b8fc4",
}
WORST_COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd")
CAPACITY_STYLE = {"color": "#222222", "linestyle": "--", "linewidth": 1.0}


def worst_ranks(timeline: MemoryTimeline, count: int = WORST_RANKS) -> list[RankMemory]:
    """The `count` ranks with the highest total peak, highest first (ties by rank id)."""
    return sorted(timeline.ranks, key=lambda r: (-r.peaks["total"], r.rank))[:count]


def _steps(times: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(2n - 1, 2) vertices of a post-step line through (times, values)."""
    x = np.repeat(times, 2)[1:]
    y = np.repeat(values, 2)[:-1]
    return np.column_stack([x, y])


def plot_memory(timeline: MemoryTimeline, capacity_bytes: float | None, path: str | Path, title: str) -> None:
    """Write memory.png (see the module docstring); `capacity_bytes` None leaves out the dashed line."""
    worst = worst_ranks(timeline)
    rows = 1 + len(worst)
    fig = Figure(figsize=(12, 3.2 + 2.0 * len(worst)), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(rows, 1, height_ratios=[1.6] + [1.0] * len(worst))
    unit, scale = time_unit(timeline.makespan_s)
    x_max = max(timeline.makespan_s * scale, 1e-12)
    peak = max((r.peaks["total"] for r in timeline.ranks), default=0.0)
    y_max = max(peak, capacity_bytes or 0.0, 1.0) / GIB * 1.08

    ax = fig.add_subplot(grid[0])
    coloured = {r.rank: WORST_COLOURS[i % len(WORST_COLOURS)] for i, r in enumerate(worst)}
    others = [_steps(r.times_s * scale, r.total / GIB) for r in timeline.ranks if r.rank not in coloured]
    if others:
        ax.add_collection(LineCollection(others, colors="#aaaaaa", linewidths=0.7, zorder=2))
    for r in worst:
        xy = _steps(r.times_s * scale, r.total / GIB)
        ax.plot(
            xy[:, 0],
            xy[:, 1],
            color=coloured[r.rank],
            linewidth=1.4,
            zorder=3,
            label=f"rank {r.rank} (peak {r.peaks['total'] / GIB:.2f} GiB)",
        )
    if others:
        ax.plot([], [], color="#aaaaaa", linewidth=0.7, label=f"other {len(others)} ranks")
    _capacity(ax, capacity_bytes, label=True)
    ax.set_xlim(0.0, x_max)
    ax.set_ylim(0.0, y_max)
    ax.set_ylabel("total (GiB)")
    ax.set_title(f"{title}: memory per rank, total over time", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    ax.grid(color="#e6e6e6", linewidth=0.6, zorder=0)

    for i, r in enumerate(worst):
        sub = fig.add_subplot(grid[1 + i], sharex=ax)
        sub.stackplot(
            r.times_s * scale,
            *(r.bytes[:, j] / GIB for j in range(len(CATEGORIES))),
            step="post",
            colors=[CATEGORY_COLOURS[c] for c in CATEGORIES],
            labels=CATEGORIES,
            linewidth=0.0,
            zorder=2,
        )
        _capacity(sub, capacity_bytes, label=False)
        sub.set_ylim(0.0, y_max)
        sub.set_ylabel("GiB")
        sub.set_title(
            f"rank {r.rank}: peak {r.peaks['total'] / GIB:.2f} GiB at {r.peak_time_s * scale:.4g} {unit}",
            fontsize=9,
            loc="left",
        )
        sub.grid(color="#e6e6e6", linewidth=0.6, zorder=0)
        if i == 0:
            sub.legend(
                loc="upper left",
                bbox_to_anchor=(1.005, 1.0),
                fontsize=8,
                frameon=False,
                title="category",
                title_fontsize=8,
            )
    fig.axes[-1].set_xlabel(f"time ({unit})")
    if not timeline.ranks:
        ax.text(0.5, 0.5, "no ranks", transform=ax.transAxes, ha="center", va="center")
    fig.savefig(path, format="png", metadata={"Software": None})


def _capacity(ax, capacity_bytes: float | None, label: bool) -> None:
    if capacity_bytes is not None:
        ax.axhline(
            capacity_bytes / GIB,
            zorder=4,
            **CAPACITY_STYLE,
            label=f"GPU memory {capacity_bytes / GIB:.1f} GiB" if label else None,
        )
