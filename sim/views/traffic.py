"""traffic.png: who sends how many bytes to whom, as GPU x GPU heatmaps of the flow table: every
message, and beside it the expert-parallel all-to-alls alone when the run has any."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from clustersim.sim.engine.records import EventLog
from clustersim.sim.results.metrics import ALLTOALL_STREAMS, traffic_matrix_bytes

GB = 1e9  # bytes
MAX_CELLS = 512  # per side: more GPUs than this are drawn in blocks (a figure has fewer pixels anyway)
MAX_TICKS = 32  # per side


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


UNIFORM_RATIO = 10.0  # positive cells within this factor of each other read best on a linear scale


def norm_GB(matrices: list[np.ndarray]) -> Normalize:
    """One colour scale (GB) over the positive cells of all panels: linear from 0 when they lie
    within UNIFORM_RATIO of each other (a pipeline's or a ring's even traffic), else logarithmic
    from the smallest to the largest (an all-to-all's hot spots beside light control traffic)."""
    positive = np.concatenate([m[m > 0] for m in matrices]) / GB
    if not len(positive):
        return LogNorm(vmin=1e-9, vmax=1.0)
    low, top = float(positive.min()), float(positive.max())
    return Normalize(vmin=0.0, vmax=top) if top < UNIFORM_RATIO * low else LogNorm(vmin=low, vmax=top)


def gpu_ticks(ax, cells: int, per: int) -> None:
    """Ticks on GPU ids: every cell up to MAX_TICKS cells, else evenly spaced; a cell of a blocked
    heatmap is labelled with its first GPU."""
    step = max(1, -(-cells // MAX_TICKS))
    ticks = list(range(0, cells, step))
    labels = [str(cell * per) for cell in ticks]
    ax.set_xticks(ticks, labels, fontsize=7 if len(ticks) > 16 else 9, rotation=90 if len(ticks) > 16 else 0)
    ax.set_yticks(ticks, labels, fontsize=7 if len(ticks) > 16 else 9)


def plot_traffic(log: EventLog, num_gpus: int, path: str | Path, name: str) -> None:
    """Heatmaps of bytes GPU -> GPU (src GPU rows, dst GPU columns; colour scale in GB, linear or
    log as norm_GB picks, blank where nothing was sent), one per panel of `traffic_panels`; deterministic PNG bytes."""
    panels = traffic_panels(log, num_gpus)
    fig = Figure(figsize=(1.0 + 5.5 * len(panels), 5.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    norm = norm_GB([matrix for _, matrix in panels])
    cmap = colormaps["viridis"].with_extremes(bad="white")
    image = None
    for ax, (title, matrix) in zip(axes, panels):
        total = float(matrix.sum())
        if total > 0:
            image = ax.imshow(np.ma.masked_less_equal(matrix / GB, 0.0), norm=norm, cmap=cmap, interpolation="nearest")
        else:
            ax.text(0.5, 0.5, "no messages", ha="center", va="center", transform=ax.transAxes)
        per = cell_gpus(num_gpus)
        gpu_ticks(ax, matrix.shape[0], per)
        ax.set_xlabel("dst GPU" if per == 1 else f"dst GPUs (blocks of {per})")
        ax.set_ylabel("src GPU" if per == 1 else f"src GPUs (blocks of {per})")
        ax.set_title(f"{title}: {total / GB:.3f} GB", fontsize=10)
    if image is not None:
        scale = "log scale" if isinstance(norm, LogNorm) else "linear scale"
        fig.colorbar(image, ax=list(axes), label=f"bytes sent (GB, {scale})")
    fig.suptitle(f"{name}: bytes GPU -> GPU over the step, {float(panels[0][1].sum()) / GB:.3f} GB in all", fontsize=11)
    fig.savefig(path, metadata={"Software": None})
