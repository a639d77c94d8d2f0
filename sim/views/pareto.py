"""pareto.png of `clustersim plan` and `sweep`: each simulated candidate's step time against its
memory peak, the Pareto front (no other candidate is both faster and smaller) joined, the GPU's
capacity as a line, the best plan ringed. A pure function of the rows."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from clustersim.sim.results.table import time_unit

GiB = 2**30


def pareto_front(rows: list[dict]) -> list[dict]:
    """The rows no other row beats on both step time and memory peak, by rising memory."""
    ordered = sorted(rows, key=lambda r: (r["memory_peak_bytes"], r["step_time_s"]))
    front: list[dict] = []
    for row in ordered:
        if not front or row["step_time_s"] < front[-1]["step_time_s"]:
            front.append(row)
    return front


def plot_pareto(rows: list[dict], path: str | Path, title: str, best: dict | None = None) -> None:
    """Rows need `label`, `step_time_s`, `memory_peak_bytes`, `memory_capacity_bytes`; deterministic PNG."""
    unit, scale = time_unit(max(r["step_time_s"] for r in rows))
    fig = Figure(figsize=(8, 5.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.scatter(
        [r["memory_peak_bytes"] / GiB for r in rows],
        [r["step_time_s"] * scale for r in rows],
        s=24,
        color="#4c72b0",
        label="simulated candidates",
    )
    front = pareto_front(rows)
    ax.plot(
        [r["memory_peak_bytes"] / GiB for r in front],
        [r["step_time_s"] * scale for r in front],
        color="#dd8452",
        marker="o",
        label="Pareto front",
    )
    for r in front:
        ax.annotate(r["label"], (r["memory_peak_bytes"] / GiB, r["step_time_s"] * scale), fontsize=6, rotation=20)
    ax.axvline(rows[0]["memory_capacity_bytes"] / GiB, color="#c44e52", linestyle="--", label="GPU memory")
    if best is not None:
        ax.scatter(
            [best["memory_peak_bytes"] / GiB],
            [best["step_time_s"] * scale],
            s=160,
            facecolors="none",
            edgecolors="#55a868",
            linewidths=2,
            label="best plan",
        )
    ax.set_xlabel("memory peak of the largest rank (GiB)")
    ax.set_ylabel(f"step time ({unit})")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path, format="png", metadata={"Software": None})
