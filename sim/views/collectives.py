"""The busbw-vs-size plot of `clustersim collective --plot`: one line per algorithm, log-log, as
nccl-tests results are usually drawn (busbw comparable to one link's bandwidth at every size)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def draw_busbw(curves: dict[str, tuple[list[int], list[float]]], path: str | Path, title: str) -> None:
    """`curves`: algorithm -> (sizes in bytes, busbw in GB/s); deterministic PNG bytes."""
    fig = Figure(figsize=(8, 5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, (sizes, busbw) in curves.items():
        ax.plot(sizes, busbw, marker="o", markersize=3, label=name, linestyle="--" if name == "auto" else "-")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s, GB = 1e9 bytes)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
