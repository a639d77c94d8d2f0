"""traffic.png: who sends how many bytes to whom, as GPU x GPU heatmaps of the flow table: every
message, and beside it the expert-parallel all-to-alls alone when the run has any."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from clustersim.sim.engine.records import EventLog
from clustersim.sim.results.metrics import ALLTOALL_STREAMS, traffic_matrix_bytes

GB = 1e9  # bytes
MAX_CELLS = 512  # per side: more GPUs than this are drawn in blocks (a figure has fewer pixels anyway)


def cell_gpus(num_gpus: int) -> int:
    """GPUs per cell of a side of the heatmap."""
    return -(-num_gpus // MAX_CELLS)


def traffic_panels(log: EventLog, num_gpus: int) -> list[tuple[str, np.ndarray]]:
    """(panel title, bytes matrix): all messages, then the all-to-alls' when there are any."""
    block = cell_gpus(num_gpus)
    panels = [("all messages", traffic_matrix_bytes(log, num_gpus, block=block))]
    alltoall = traffic_matrix_bytes(log, num_gpus, ALLTOALL_STREAMS, block=block)
    if alltoall.any():
        panels.append(("expert-parallel all-to-all", alltoall))
    return panels


def log_norm_GB(matrices: list[np.ndarray]) -> LogNorm:
    """One log colour scale (GB) over the positive cells of all panels; a uniform matrix gets a
    decade below its value so its colour is not the bottom of the scale."""
    positive = np.concatenate([m[m > 0] for m in matrices]) / GB
    if not len(positive):
        return LogNorm(vmin=1e-9, vmax=1.0)
    top = float(positive.max())
    return LogNorm(vmin=min(float(positive.min()), top / 10), vmax=top)


def plot_traffic(log: EventLog, num_gpus: int, path: str | Path, name: str) -> None:
    """Heatmaps of bytes GPU -> GPU (src GPU rows, dst GPU columns; log colour scale in GB, blank
    where nothing was sent), one per panel of `traffic_panels`; deterministic PNG bytes."""
    panels = traffic_panels(log, num_gpus)
    fig = Figure(figsize=(1.0 + 5.5 * len(panels), 5.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    norm = log_norm_GB([matrix for _, matrix in panels])
    cmap = colormaps["viridis"].with_extremes(bad="white")
    image = None
    for ax, (title, matrix) in zip(axes, panels):
        total = float(matrix.sum())
        if total > 0:
            image = ax.imshow(np.ma.masked_less_equal(matrix / GB, 0.0), norm=norm, cmap=cmap, interpolation="nearest")
        else:
            ax.text(0.5, 0.5, "no messages", ha="center", va="center", transform=ax.transAxes)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        per = cell_gpus(num_gpus)
        ax.set_xlabel("dst GPU" if per == 1 else f"dst GPUs (blocks of {per})")
        ax.set_ylabel("src GPU" if per == 1 else f"src GPUs (blocks of {per})")
        ax.set_title(f"{title}: {total / GB:.3f} GB", fontsize=10)
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="bytes sent (GB, log scale)")
    fig.suptitle(f"{name}: bytes GPU -> GPU over the step, {float(panels[0][1].sum()) / GB:.3f} GB in all", fontsize=11)
    fig.savefig(path, metadata={"Software": None})
