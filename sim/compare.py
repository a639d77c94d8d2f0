"""`clustersim compare`: where each scenario's step time goes, side by side.

The step-time breakdown of rank r over [0, T] (T = the step time) gives every instant one owner:
  compute_r          = |union of r's compute spans (F, B, OPT)|
  exposed_r[K]       = |instants r computes nothing while a span of kind K is active on r|, where
                       K is a collective kind (the span's phase in lower case) or "p2p" (SEND/RECV);
                       if several kinds are active at once the first in EXPOSED_KINDS wins
  bubble_r           = T - compute_r - sum_K exposed_r[K]   (no compute, no communication on r)
so compute_r + sum_K exposed_r[K] + bubble_r = T by construction, and so do the means over ranks.
It is one sweep over the sorted span ends (numpy): 2 million spans take about 2 s, most of it
reading the Span tuples.

A RECV is posted as soon as its stream gets to it and then waits for the producer, so its span
holds the pipeline's wait as well as the transfer. Given `sent_s` (see message_departures), a RECV
counts only from when its message left the sender: waiting for a stage upstream stays bubble, the
message in flight is exposed p2p. A collective counts from when the rank joins it, so waiting for
the group's last member is exposed communication of that kind (as NCCL's kernel time would show it).

Unlike summary.json's bubble_ratio (idle F/B time over the pipeline window), this bubble counts
the whole step and takes communication out of it: idle time under a collective is "exposed
communication", not bubble. (Could move to sim.metrics; it lives here while compare is its only user.)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless; no pyplot global state

import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from clustersim.schedules.ir import COLLECTIVE_KINDS, PHASES, Collective, Comm, Program, Recv, Send  # noqa: E402
from clustersim.sim.engine.records import EventLog  # noqa: E402
from clustersim.sim.report import output_folder  # noqa: E402
from clustersim.sim.run import RunResult  # noqa: E402
from clustersim.sim.views.gantt import time_unit  # noqa: E402

# Priority when several kinds are active on an idle rank: the fixed five first, then the
# remaining collective kinds in schedules.ir order (each kept separate).
EXPOSED_KINDS = ("all_to_all", "all_reduce", "reduce_scatter", "all_gather", "p2p")
EXPOSED_KINDS += tuple(k for k in COLLECTIVE_KINDS if k not in EXPOSED_KINDS)
P2P_PHASES = (Comm.SEND, Comm.RECV)
HOTTEST = 3
OUTPUT_FILES = ("compare.json", "compare.md", "compare.png")
COLOURS = {
    "compute": "#4c72b0",
    "all_to_all": "#c44e52",
    "all_reduce": "#dd8452",
    "reduce_scatter": "#8172b3",
    "all_gather": "#937860",
    "p2p": "#55a868",
    "broadcast": "#da8bc3",
    "reduce": "#8c8c8c",
    "bubble": "#dddddd",
}
LINK_COLOURS = ("#c44e52", "#dd8452", "#f0b27a")  # hottest, second, third


@dataclass(frozen=True)
class Breakdown:
    """Per-rank seconds (arrays of num_ranks): compute, exposed communication by kind, bubble,
    and `in_kind_s[K]` = |union of r's spans of kind K| whether compute hides them or not."""

    step_time_s: float
    compute_s: np.ndarray
    exposed_s: dict[str, np.ndarray]
    bubble_s: np.ndarray
    in_kind_s: dict[str, np.ndarray]

    def means(self) -> dict:
        """Means over ranks; bubble is the remainder, so the identity holds for the means too."""
        compute, exposed = float(self.compute_s.mean()), {k: float(v.mean()) for k, v in self.exposed_s.items()}
        return {
            "compute_s": compute,
            "bubble_s": self.step_time_s - compute - sum(exposed.values()),
            "exposed_comm_s": exposed,
        }


def category_of(phase: str) -> int:
    """0 for compute, 1 + the index in EXPOSED_KINDS for communication; an unknown phase is an error."""
    if phase in PHASES:
        return 0
    kind = "p2p" if phase in P2P_PHASES else phase.lower()
    if kind not in EXPOSED_KINDS:
        raise ValueError(
            f"span phase {phase!r} is neither compute {PHASES}, p2p {P2P_PHASES} nor a collective "
            f"kind in capitals ({', '.join(k.upper() for k in COLLECTIVE_KINDS)})"
        )
    return 1 + EXPOSED_KINDS.index(kind)


SpanKey = tuple[int, str, str]  # (rank, stream, label)


def message_departures(program: Program, log: EventLog) -> dict[SpanKey, float]:
    """RECV span key -> start of the matching SEND span (when the message left its sender); the
    program pairs them: a Recv of tag g from peer p on rank r meets p's Send of g to r."""
    send_of = {
        (rank, op.peer, op.tag): (rank, op.stream, op.label)
        for rank, ops in program.ops.items()
        for op in ops
        if isinstance(op, Send)
    }
    send_start = {(s.rank, s.stream, s.label): s.start_s for s in log.spans if s.phase == Comm.SEND}
    return {
        (rank, op.stream, op.label): send_start[send_of[(op.peer, rank, op.tag)]]
        for rank, ops in program.ops.items()
        for op in ops
        if isinstance(op, Recv) and send_of.get((op.peer, rank, op.tag)) in send_start
    }


def step_breakdown(
    log: EventLog, step_time_s: float | None = None, sent_s: dict[SpanKey, float] | None = None
) -> Breakdown:
    """The breakdown of the module docstring, by a sweep over every span's start (+1) and end (-1);
    a RECV named in `sent_s` starts at max(its start, sent_s[its key]) (None: RECVs count whole).

    Events sorted by (rank, time) cut each rank's timeline into segments; the running sum of a
    category's +1/-1 says whether it is active on a segment (every span closes on its own rank, so
    the sums return to 0 between ranks and need no reset; the order of events at one instant only
    matters on segments of length 0). A segment belongs to the lowest active category (compute,
    then EXPOSED_KINDS in order); segment lengths summed per rank with bincount give the unions
    and the exposed times.
    """
    step = log.makespan_s if step_time_s is None else step_time_s
    n, spans, ranks_n = len(log.spans), log.spans, log.num_ranks
    codes: dict[str, int] = {}
    code = np.fromiter((codes.setdefault(s.phase, len(codes)) for s in spans), np.int64, n)
    category = np.array([category_of(p) for p in codes], dtype=np.int64)[code] if n else code
    rank = np.fromiter((s.rank for s in spans), np.int64, n)
    start = np.fromiter((s.start_s for s in spans), float, n)
    if sent_s:
        start = np.maximum(
            start,
            np.fromiter(
                (
                    sent_s.get((s.rank, s.stream, s.label), s.start_s) if s.phase == Comm.RECV else s.start_s
                    for s in spans
                ),
                float,
                n,
            ),
        )
    start = np.clip(start, 0.0, step)
    end = np.clip(np.fromiter((s.end_s for s in spans), float, n), start, step)

    time, rank, category = np.concatenate([start, end]), np.concatenate([rank, rank]), np.tile(category, 2)
    delta = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    order = np.lexsort((time, rank))  # (2n,) events by rank, then time
    time, rank, category, delta = time[order], rank[order], category[order], delta[order]
    seg_rank = rank[:-1]  # (2n - 1,) segment i runs from event i to event i + 1
    seg_s = np.where(rank[1:] == seg_rank, np.diff(time), 0.0)
    owner = np.full(len(seg_s), -1, dtype=np.int64)
    union = np.zeros((1 + len(EXPOSED_KINDS), ranks_n))
    for cat in np.unique(category)[::-1].tolist():  # lowest category last, so it wins
        active = np.cumsum(np.where(category == cat, delta, 0))[:-1] > 0
        union[cat] = np.bincount(seg_rank[active], weights=seg_s[active], minlength=ranks_n)[:ranks_n]
        owner[active] = cat
    exposed = {
        k: np.bincount(seg_rank[owner == 1 + i], weights=seg_s[owner == 1 + i], minlength=ranks_n)[:ranks_n]
        for i, k in enumerate(EXPOSED_KINDS)
    }
    ranks = log.averaged_ranks  # a symmetric run's representatives stand for every rank
    exposed = {k: v[ranks] for k, v in exposed.items()}
    return Breakdown(
        step,
        union[0][ranks],
        exposed,
        step - union[0][ranks] - sum(exposed.values()),
        {k: union[1 + i][ranks] for i, k in enumerate(EXPOSED_KINDS)},
    )


def alltoall_sizes(program: Program) -> dict[SpanKey, tuple[int, float]]:
    """(rank, stream, label) -> (group size n, S = the bytes the rank sends, nccl-tests' size) of
    every all-to-all op; an uneven all-to-all's nbytes is an (n, n) matrix whose rank row it sends."""
    sizes = {}
    for rank, ops in program.ops.items():
        for op in ops:
            if isinstance(op, Collective) and op.kind == "all_to_all":
                nbytes = np.asarray(op.nbytes, dtype=float)
                sent = float(nbytes[op.group.index(rank)].sum()) if nbytes.ndim == 2 else float(nbytes)
                sizes[(rank, op.stream, op.label)] = (len(op.group), sent)
    return sizes


def alltoall_busbw_GBps(log: EventLog, sizes: dict[SpanKey, tuple[int, float]]) -> float | None:
    """nccl-tests' bus bandwidth of the all-to-alls taken together, sum S x (n - 1) / n over sum t in
    GB/s (1e9 B/s): S a rank's send bytes, n the group size, t the span (from the rank joining to
    the end, so waiting for the last member counts). Summed, not averaged per span, so a few tiny
    exchanges (an MoE layer's expert counts) do not swamp the token traffic. None when there is no
    all-to-all of positive length."""
    moved = seconds = 0.0
    for span in log.spans:
        if span.phase == Comm.ALL_TO_ALL and span.duration_s > 0:
            n, sent = sizes[(span.rank, span.stream, span.label)]
            moved += sent * (n - 1) / n
            seconds += span.duration_s
    return moved / seconds / 1e9 if seconds > 0 else None


def compare_row(result: RunResult) -> dict:
    """One scenario's compare.json object (keys in the README's order)."""
    s = result.summary
    b = step_breakdown(result.log, s["step_time_s"], message_departures(result.program, result.log))
    means = b.means()
    return {
        "name": result.scenario.name,
        "step_time_s": s["step_time_s"],
        "compute_s": means["compute_s"],
        "bubble_s": means["bubble_s"],
        "exposed_comm_s": means["exposed_comm_s"],
        "alltoall_time_s": float(b.in_kind_s["all_to_all"].mean()),
        "allreduce_time_s": float(b.in_kind_s["all_reduce"].mean()),
        "bubble_ratio_mean": s["bubble_ratio_mean"],
        "mfu": s["mfu"],
        "hottest_links": s["hottest_links"][:HOTTEST],
        "alltoall_busbw_GBps": alltoall_busbw_GBps(result.log, alltoall_sizes(result.program)),
    }


def shown_kinds(rows: list[dict]) -> list[str]:
    """Communication kinds exposed in at least one scenario, in priority order."""
    return [k for k in EXPOSED_KINDS if any(r["exposed_comm_s"][k] > 0 for r in rows)]


def markdown(rows: list[dict]) -> str:
    """The compare table, then who is fastest and by what ratio."""
    unit, scale = time_unit(max(r["step_time_s"] for r in rows))
    kinds = shown_kinds(rows)
    head = [
        "scenario",
        f"step ({unit})",
        f"compute ({unit})",
        *(f"exposed {k} ({unit})" for k in kinds),
        f"bubble ({unit})",
        "MFU (%)",
        "all-to-all busbw (GB/s)",
    ]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for r in rows:
        times = (r["step_time_s"], r["compute_s"], *(r["exposed_comm_s"][k] for k in kinds), r["bubble_s"])
        busbw = r["alltoall_busbw_GBps"]
        cells = [
            r["name"],
            *(f"{v * scale:.3f}".replace("-0.000", "0.000") for v in times),
            f"{100 * r['mfu']:.1f}",
            "-" if busbw is None else f"{busbw:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + faster_line(rows, unit, scale) + "\n"


def faster_line(rows: list[dict], unit: str, scale: float) -> str:
    """'A is the fastest: 1.25x faster than B (8.000 ms vs 10.000 ms)'; ratio = slower step / faster step."""
    fast = min(rows, key=lambda r: r["step_time_s"])  # the first listed wins a tie
    others = [r for r in rows if r is not fast]
    parts = [
        f"{r['step_time_s'] / fast['step_time_s']:.2f}x faster than {r['name']} "
        f"({fast['step_time_s'] * scale:.3f} {unit} vs {r['step_time_s'] * scale:.3f} {unit})"
        if fast["step_time_s"] > 0
        else f"no slower than {r['name']}"
        for r in others
    ]
    return f"**{fast['name']}** is the fastest: " + "; ".join(parts)


def plot_compare(rows: list[dict], path: str | Path) -> None:
    """Stacked step-time bars (compute, exposed comm by kind, bubble) beside each scenario's
    hottest links' utilisation; deterministic PNG bytes."""
    unit, scale = time_unit(max(r["step_time_s"] for r in rows))
    fig = Figure(figsize=(6 + 2.2 * len(rows), 5.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.3]})
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for part in ["compute", *shown_kinds(rows), "bubble"]:
        values = (
            np.array([r["exposed_comm_s"][part] if part in EXPOSED_KINDS else r[f"{part}_s"] for r in rows]) * scale
        )
        label = part if part in ("compute", "bubble") else f"exposed {part}"
        left.bar(x, values, 0.6, bottom=bottom, color=COLOURS.get(part, "#999999"), label=label)
        bottom += values
    left.set_xticks(x, [r["name"] for r in rows], fontsize=8)
    left.set_ylabel(f"mean per rank ({unit})")
    left.set_title("where the step goes", fontsize=10)
    left.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.06), ncols=3, frameon=False)
    width = 0.8 / HOTTEST
    for i, r in enumerate(rows):
        for j, link in enumerate(r["hottest_links"]):
            xj = i - 0.4 + width * (j + 0.5)
            pct = 100 * link["utilisation"]
            right.bar(xj, pct, width * 0.9, color=LINK_COLOURS[j % len(LINK_COLOURS)])
            right.text(xj, pct + 1.0, f"{link['link']} {pct:.0f}%", rotation=90, ha="center", va="bottom", fontsize=7)
        if not r["hottest_links"]:
            right.text(i, 1.0, "no traffic", rotation=90, ha="center", va="bottom", fontsize=7)
    right.set_xticks(x, [r["name"] for r in rows], fontsize=8)
    right.set_xlim(-0.6, len(rows) - 0.4)
    right.set_ylim(0, 125)  # room for the labels above a fully used link
    right.set_ylabel("utilisation over the step (%)")
    right.set_title(f"{HOTTEST} hottest links per scenario", fontsize=10)
    fig.savefig(path, format="png", metadata={"Software": None})


def default_dir(names: list[str]) -> Path:
    return Path("runs") / ("compare-" + "-vs-".join(re.sub(r"[^A-Za-z0-9_.-]+", "_", n) for n in names))


def write_compare(results: list[RunResult], out_dir: Path) -> tuple[Path, str]:
    """Write compare.json, compare.md and compare.png, all or nothing (sim.report.output_folder);
    return the folder and the table."""
    rows = [compare_row(r) for r in results]
    table = markdown(rows)
    with output_folder(out_dir) as tmp:
        (tmp / "compare.json").write_text(json.dumps(rows, indent=2) + "\n")
        (tmp / "compare.md").write_text(table)
        plot_compare(rows, tmp / "compare.png")
    return Path(out_dir), table
