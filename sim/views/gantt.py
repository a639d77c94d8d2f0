"""Gantt chart of an EventLog: one row per rank, one lane per stream, a pure function of the record.

Layout, top to bottom: rank 0 first; within a rank the compute lane (full height), then every other
stream that has drawn spans (send, then the rest by name; thinner; receives are left out). Time runs
left to right in us, ms or s, picked from the makespan. White space inside a compute lane is idle
time: the pipeline bubble.

Drawing uses one PolyCollection per phase (not one artist per span) so thousands of spans stay
fast, and the PNG is byte-identical for the same log (no timestamp or version in its metadata).
In a dense chart (boxes too narrow for outlines) boxes of one phase in one lane closer than a
pixel are drawn as one: hundreds of thousands of spans cost what the pixels they cover do.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from clustersim.schedules.ir import MICROBATCH_PHASES, Comm, Phase
from clustersim.sim.engine.records import EventLog, Span
from clustersim.sim.results.table import time_unit

COMPUTE_STREAM = "compute"
STREAM_ORDER = (COMPUTE_STREAM, "send", "recv")  # then any other stream, by name

# phase -> (face colour, alpha); unknown phases (collectives, ...) take PALETTE in name order.
PHASE_STYLE: dict[str, tuple[str, float]] = {
    Phase.F: ("#3b6fb6", 1.0),
    Phase.B: ("#3f9b57", 1.0),
    Phase.W: ("#a6d96a", 1.0),  # a zero-bubble schedule's weight gradient, a lighter green than its B
    Phase.OPT: ("#c0504d", 1.0),
    Comm.SEND: ("#d9954a", 0.75),
    Comm.RECV: ("#9b8fc4", 0.35),  # mostly waiting for the peer, so drawn lightly
}
PALETTE = ("#8c6bb1", "#e377c2", "#17becf", "#bcbd22", "#8c564b", "#7f7f7f", "#2ca02c", "#ff7f0e")
PHASE_ORDER = (Phase.F, Phase.B, Phase.W, Phase.OPT, Comm.SEND, Comm.RECV)
# A receive's span is mostly waiting for its peer; the message's time on the wire is the sender's
# SEND span, so receives are left out of the chart (they stay in the Perfetto trace).
HIDDEN_PHASES = (Comm.RECV,)
LABELLED_PHASES = MICROBATCH_PHASES  # microbatch number written inside the box when it fits
MAX_TEXT_LABELS = 2000

COMPUTE_LANE_H = 1.0  # lane heights in y units
COMM_LANE_H = 0.55
RANK_GAP = 0.35
INCH_PER_UNIT = 0.3
FIG_W_IN = 14.0
MAX_FIG_H_IN = 36.0
DPI = 110


def stream_sort_key(stream: str) -> tuple[int, str]:
    """compute, send, recv first (in that order), then any other stream by name."""
    if stream in STREAM_ORDER:
        return STREAM_ORDER.index(stream), ""
    return len(STREAM_ORDER), stream


def phase_colours(phases: set[str]) -> dict[str, tuple[str, float]]:
    """A fixed colour per known phase; unknown phases get PALETTE entries in name order."""
    known = [p for p in PHASE_ORDER if p in phases]
    extra = sorted(phases - set(PHASE_STYLE))
    styles: dict[str, tuple[str, float]] = {p: PHASE_STYLE[p] for p in known}
    styles.update({p: (PALETTE[i % len(PALETTE)], 0.85) for i, p in enumerate(extra)})
    return styles


def lane_layout(log: EventLog, ranks: list[int] | None = None) -> list[tuple[int, str, float, float]]:
    """(rank, stream, y_top, height) per lane, top to bottom, for `ranks` in that order (default:
    every rank in rank order); every rank has a compute lane."""
    shown = list(ranks) if ranks is not None else list(range(log.num_ranks))
    streams: dict[int, set[str]] = {r: {COMPUTE_STREAM} for r in shown}
    for span in _drawn(log, shown):
        streams[span.rank].add(span.stream)
    lanes, y = [], 0.0
    for rank in shown:
        for stream in sorted(streams[rank], key=stream_sort_key):
            height = COMPUTE_LANE_H if stream == COMPUTE_STREAM else COMM_LANE_H
            lanes.append((rank, stream, y, height))
            y += height
        y += RANK_GAP
    return lanes


def _drawn(log: EventLog, ranks: list[int] | None = None) -> list[Span]:
    keep = set(ranks) if ranks is not None else None
    return [span for span in log.spans if span.phase not in HIDDEN_PHASES and (keep is None or span.rank in keep)]


def _lane_label(rank: int, stream: str) -> str:
    return f"rank {rank}" if stream == COMPUTE_STREAM else f"r{rank} {stream}"


def _runs(spans: list[Span], scale: float, join: float) -> dict[tuple[int, str, str], list[tuple[float, float]]]:
    """(rank, stream, phase) -> the x extents of its boxes in time order, boxes closer than `join`
    merged into one (0: none merged)."""
    runs: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    for span in sorted(spans, key=lambda s: (s.rank, s.stream, s.phase, s.start_s)) if join else spans:
        lane = runs.setdefault((span.rank, span.stream, span.phase), [])
        x0, x1 = span.start_s * scale, span.end_s * scale
        if join and lane and x0 - lane[-1][1] < join:
            lane[-1] = (lane[-1][0], max(lane[-1][1], x1))
        else:
            lane.append((x0, x1))
    return runs


def _box(x0: float, x1: float, y_top: float, height: float, min_width: float) -> list[tuple[float, float]]:
    """A box's rectangle, at least `min_width` wide (about a pixel) so short messages still show."""
    pad = 0.08 if height >= COMPUTE_LANE_H else 0.12
    x1 = max(x1, x0 + min_width)
    y0, y1 = y_top + pad, y_top + height - pad
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


CHAR_WIDTH_EM = 0.55  # mean width of a DejaVu Sans character, in ems


def plot_gantt(log: EventLog, path: str | Path, title: str, ranks: list[int] | None = None) -> None:
    """Write a PNG Gantt chart of `log` to `path` (see the module docstring for the layout), of
    `ranks` only, in that order, when given."""
    lanes = lane_layout(log, ranks)
    total_h = lanes[-1][2] + lanes[-1][3] if lanes else 1.0
    fig_h = min(MAX_FIG_H_IN, max(3.0, total_h * INCH_PER_UNIT + 1.15))
    fig = Figure(figsize=(FIG_W_IN, fig_h), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.075, 0.65 / fig_h, 0.8, 1.0 - 1.15 / fig_h))  # inches kept for x label/title
    pt_per_unit = (1.0 - 1.15 / fig_h) * fig_h * 72.0 / total_h
    tick_pt = max(3.0, min(9.0, 0.55 * pt_per_unit))

    makespan = log.makespan_s
    unit, scale = time_unit(makespan)
    x_max = max(makespan * scale, 1e-12) * 1.01
    lane_of = {(rank, stream): (y, h) for rank, stream, y, h in lanes}

    spans = _drawn(log, ranks)
    styles = phase_colours({s.phase for s in spans})
    edge_lw = _edge_width(log, ax, x_max / scale)
    pixel = x_max / (FIG_W_IN * DPI)
    verts: dict[str, list] = {p: [] for p in styles}
    for (rank, stream, phase), runs in _runs(spans, scale, pixel if edge_lw == 0.0 else 0.0).items():
        y, h = lane_of[(rank, stream)]
        verts[phase].extend(_box(x0, x1, y, h, pixel) for x0, x1 in runs)
    for phase, (colour, alpha) in styles.items():
        edge = "none" if phase in (Comm.SEND, Comm.RECV) or edge_lw == 0.0 else "#222222"
        ax.add_collection(
            PolyCollection(verts[phase], facecolors=colour, edgecolors=edge, linewidths=edge_lw, alpha=alpha, zorder=2)
        )

    _label_microbatches(ax, log, lane_of, scale, x_max, pt_per_unit)
    ax.set_xlim(0.0, x_max)
    ax.set_ylim(total_h, 0.0)  # rank 0 on top
    ax.set_yticks([y + h / 2 for _, _, y, h in lanes])
    ax.set_yticklabels([_lane_label(r, s) for r, s, _, _ in lanes], fontsize=tick_pt)
    ax.tick_params(axis="y", length=0)
    for _, stream, y, _ in lanes[1:]:
        if stream == COMPUTE_STREAM:  # separator between ranks
            ax.axhline(y - RANK_GAP / 2, color="#bbbbbb", linewidth=0.6, zorder=1)
    ax.grid(axis="x", color="#e6e6e6", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    ax.set_xlabel(f"time ({unit})")
    full = f"{title}    makespan {makespan * scale:.4g} {unit}"
    chars = int(0.8 * FIG_W_IN * 72 / (10 * CHAR_WIDTH_EM))  # what fits above the axes at 10 pt
    ax.set_title("\n".join(textwrap.wrap(full, chars, max_lines=2, placeholder=" ...")), fontsize=10)
    handles = [Patch(facecolor=c, alpha=a, edgecolor="#222222", linewidth=0.4, label=p) for p, (c, a) in styles.items()]
    if handles:
        ax.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            fontsize=9,
            frameon=False,
            title="phase",
            title_fontsize=9,
        )
    if not log.spans:
        ax.text(0.5, 0.5, "no spans recorded", transform=ax.transAxes, ha="center", va="center")
    fig.savefig(path, format="png", metadata={"Software": None})


def _edge_width(log: EventLog, ax, x_span_s: float) -> float:
    """Box outline width in points, thinner as boxes get narrower so dense lanes keep their colour."""
    busy = [s.duration_s for s in log.spans if s.duration_s > 0 and s.phase not in (Comm.SEND, Comm.RECV)]
    if not busy:
        return 0.4
    mean_box_pt = sum(busy) / len(busy) / x_span_s * ax.get_position().width * FIG_W_IN * 72.0
    return 0.0 if mean_box_pt < 2.0 else min(0.4, 0.05 * mean_box_pt)


def _label_microbatches(ax, log: EventLog, lane_of, scale: float, x_max: float, pt_per_unit: float) -> None:
    """Write the microbatch number inside F/B boxes wide enough to hold it (at most MAX_TEXT_LABELS)."""
    boxes = [
        s
        for s in log.spans
        if s.phase in LABELLED_PHASES and s.microbatch is not None and (s.rank, s.stream) in lane_of
    ]  # only the drawn lanes
    if not boxes or len(boxes) > MAX_TEXT_LABELS:
        return
    axes_w_pt = ax.get_position().width * FIG_W_IN * 72.0
    placed = []  # (x, y, text, largest font that fits the box)
    for span in boxes:
        text = str(span.microbatch)
        y, h = lane_of[(span.rank, span.stream)]
        width_pt = span.duration_s * scale / x_max * axes_w_pt
        fit_pt = min(0.5 * pt_per_unit * h, (width_pt - 2.0) / (0.64 * len(text)))
        placed.append(((span.start_s + span.end_s) / 2 * scale, y + h / 2, text, fit_pt))
    fits = sorted(f for *_, f in placed)
    font_pt = round(min(8.0, max(5.5, fits[len(fits) // 2])) * 2) / 2  # one size for the whole chart
    for x, y, text, fit_pt in placed:
        if fit_pt >= font_pt:
            ax.text(x, y, text, ha="center", va="center", fontsize=font_pt, color="white", zorder=3, clip_on=True)
