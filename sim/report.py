"""Write a run's outputs into its folder, all or nothing, and print the terminal summary."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from clustersim.schedules.ir import MICROBATCH_PHASES
from clustersim.sim.folder import output_folder
from clustersim.sim.results.csv_tables import csv_text, link_rows, rank_rows
from clustersim.sim.results.links import link_stats
from clustersim.sim.results.memory import capacity_message
from clustersim.sim.results.table import format_table
from clustersim.sim.results.trace import MAX_SPAN_EVENTS, write_trace
from clustersim.sim.run import RunResult

GANTT_MAX_RANKS = 32
PLOTS = ("gantt.png", "links.png", "memory.png", "traffic.png")
OUTPUT_FILES = (
    "summary.json",
    "ranks.csv",
    "links.csv",
    "gantt.png",
    "trace.json",
    "links.png",
    "memory.png",
    "traffic.png",
    "program.txt",
)


SHORTHANDS = {"plots": PLOTS, "tables": ("ranks.csv", "links.csv"), "all": OUTPUT_FILES}


def output_files(chosen: str | None = None, skipped: Collection[str] = ()) -> tuple[str, ...]:
    """The files a run writes, in OUTPUT_FILES order: `chosen` is a comma-separated list of file
    names or SHORTHANDS (None: all of them), less `skipped`; summary.json is always written (it
    marks the folder as a run's and carries the scenario). An unknown name raises ValueError
    listing the valid ones."""
    names = set(OUTPUT_FILES)
    if chosen is not None:
        names = {"summary.json"}
        for name in filter(None, (part.strip() for part in chosen.split(","))):
            if name not in OUTPUT_FILES and name not in SHORTHANDS:
                raise ValueError(f"unknown output {name!r} (valid: {', '.join((*OUTPUT_FILES, *SHORTHANDS))})")
            names |= set(SHORTHANDS.get(name, (name,)))
    return tuple(name for name in OUTPUT_FILES if name in names and (name not in skipped or name == "summary.json"))


def write_outputs(result: RunResult, out_dir: Path, files: Collection[str] = OUTPUT_FILES) -> Path:
    """Write the `files` of OUTPUT_FILES (summary.json always): the tables (ranks.csv, links.csv),
    the plots (gantt, links, memory, traffic PNGs), trace.json and program.txt.

    Everything is written into a fresh hidden sibling folder first and moved into place at the
    end (sim.folder.output_folder: only over a previous run's folder), so a failure never leaves a
    half-written run folder behind. matplotlib is imported only
    when plots are drawn, so a batch run (plots off) never loads it.
    """
    plots = [name for name in PLOTS if name in files]
    with output_folder(out_dir) as tmp, _beside(partial(_write_plots, result, tmp, plots) if plots else None):
        (tmp / "summary.json").write_text(json.dumps(result.summary, indent=2, sort_keys=True, allow_nan=False) + "\n")
        if "ranks.csv" in files:
            (tmp / "ranks.csv").write_text(csv_text(rank_rows(result.summary)))
        if "links.csv" in files:
            (tmp / "links.csv").write_text(csv_text(link_rows(link_stats(result.log))))
        if "trace.json" in files:
            write_trace(
                result.log,
                tmp / "trace.json",
                _gantt_ranks(result) if len(result.log.spans) > MAX_SPAN_EVENTS else None,
                program=result.program,
                memory=result.memory,
                links=link_stats(result.log),
            )
        if "program.txt" in files:
            (tmp / "program.txt").write_text(result.program.to_text() + "\n")
    return Path(out_dir)


@contextmanager
def _beside(work: Callable[[], None] | None) -> Iterator[None]:
    """Run `work` in a forked child while the block runs, and wait for it at the end: the plots
    draw on one core while the trace is written on the other (a fork shares the run's memory,
    nothing is copied or pickled). A failed child fails the block; a failed block stops the child.
    Without fork (Windows, macOS's default) or a second core, `work` runs here, first."""
    if work is None:
        yield
        return
    if (os.cpu_count() or 1) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        work()
        yield
        return
    child = multiprocessing.get_context("fork").Process(target=_quietly, args=(work,), daemon=True)
    child.start()
    try:
        yield
    except BaseException:
        child.terminate()
        child.join()
        raise
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"drawing the plots failed (exit code {child.exitcode}; the child's traceback is above)")


def _quietly(work: Callable[[], None]) -> None:
    """The child's body: Ctrl-C reaches the whole process group, but only the parent answers it
    (it stops the child with SIGTERM, which ends the child at once, with no traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    work()


def _gantt_ranks(result: RunResult) -> list[int] | None:
    """The ranks a big run's Gantt chart and trace keep: one pipeline, in stage order (None: all)."""
    if result.log.num_ranks <= GANTT_MAX_RANKS:
        return None
    placement = result.program.stage_to_rank
    return list(dict.fromkeys(placement[stage] for stage in sorted(placement)))


def _write_plots(result: RunResult, tmp: Path, plots: Collection[str]) -> None:
    """The `plots` of gantt.png, links.png, memory.png and traffic.png (the views import matplotlib)."""
    from clustersim.sim.views.gantt import plot_gantt
    from clustersim.sim.views.links import plot_links
    from clustersim.sim.views.memory import plot_memory
    from clustersim.sim.views.traffic import plot_traffic

    sc = result.scenario
    if "gantt.png" in plots:
        title = (
            f"{sc.name}: {sc.schedule}, pp={sc.parallel.pp}, {sc.num_microbatches} microbatches, "
            f"step {result.summary['step_time_s'] * 1e3:.2f} ms"
        )
        ranks = _gantt_ranks(result)
        if ranks is not None:
            title += f" (pipeline of ranks {', '.join(map(str, ranks))}; {result.log.num_ranks} ranks in all)"
        plot_gantt(result.log, tmp / "gantt.png", title, ranks)
    if "links.png" in plots:
        plot_links(
            link_stats(result.log),
            result.summary["step_time_s"],
            tmp / "links.png",
            f"{sc.name}: utilisation of the hottest links",
            result.graph,
        )
    if "memory.png" in plots:
        plot_memory(
            result.memory,
            sc.gpu_spec.memory_bytes,
            tmp / "memory.png",
            f"{sc.name} (ZeRO {sc.parallel.zero}, dp={sc.parallel.dp})",
        )
    if "traffic.png" in plots:
        plot_traffic(result.log, sc.num_gpus, tmp / "traffic.png", sc.name)


def moe_routing_line(s: dict) -> str | None:
    """What the shadow gate's routing did, and who the expert-parallel groups waited for."""
    numerics = s["numerics"] or {}
    if "tokens_per_expert" not in numerics:
        return None
    line = (
        f"expert {numerics['hottest_expert']} took {100 * numerics['hottest_expert_share']:.1f} % of "
        f"{sum(numerics['tokens_per_expert'])} rows, {100 * numerics['dropped_token_rate']:.1f} % dropped"
    )
    if s["alltoall_straggler_rank"] is not None:
        straggler = str(s["alltoall_straggler_rank"])
        line += (
            f"; rank {straggler} reached {s['alltoall_last_arrivals_per_rank'][straggler]} all-to-alls last "
            "(the straggler)"
        )
    return line


def megatron_bubble_text(over_ideal: float | None) -> str:
    """Megatron's bubble over ideal time beside ours, when the run has pipeline work."""
    return "" if over_ideal is None else f"   (Megatron's bubble / ideal time {100 * over_ideal:.2f} %)"


def breakdown_line(s: dict) -> str:
    """Where the mean rank's step goes: compute, each exposed communication kind, bubble (sum = step)."""
    b = s["time_breakdown_s"]
    parts = [("compute", b["compute"])] + [(f"exposed {k}", v) for k, v in b["exposed_comm"].items() if v > 0]
    parts.append(("bubble", b["bubble"]))
    line = "breakdown        " + ", ".join(f"{name} {v * 1e3:.3f} ms" for name, v in parts)
    groups = [(g, v) for g, v in b.get("exposed_comm_by_group", {}).items() if v > 0]
    if groups:  # the same exposed time by the parallelism it serves
        line += "\nexposed by group " + ", ".join(f"{g} {v * 1e3:.3f} ms" for g, v in groups)
    if "compute_by_kernel_class" in b:  # cluster.compute_model: kernel
        classes = ", ".join(f"{c} {v * 1e3:.3f} ms" for c, v in b["compute_by_kernel_class"].items())
        line += "\ncompute kernels  " + classes
    return line


def terminal_summary(result: RunResult) -> str:
    """A short per-rank table under a few headline figures; a symmetric run's table lists its
    representatives (the other ranks' rows repeat theirs)."""
    s = result.summary
    busy = [0.0] * result.log.num_ranks
    for span in result.log.spans:
        if span.phase in MICROBATCH_PHASES:
            busy[span.rank] += span.duration_s
    rows = [
        {
            "rank": r,
            "busy_ms": busy[r] * 1e3,
            "bubble_pct": 100 * s["bubble_fraction_per_rank"][r],
            "inflight": s["peak_inflight_microbatches_per_rank"][r],
            "memory_gib": s["memory_peak_bytes_per_rank"][str(r)]["total"] / 2**30,
            "sent_mb": sum(s["comm_bytes_sent_per_rank"][str(r)].values()) / 1e6,
        }
        for r in result.log.averaged_ranks
    ]
    table = format_table(
        rows,
        [
            ("rank", "rank", "d"),
            ("busy_ms", "busy (ms)", ".3f"),
            ("bubble_pct", "bubble (%)", ".2f"),
            ("inflight", "peak in-flight mb", "d"),
            ("memory_gib", "peak memory (GiB)", ".2f"),
            ("sent_mb", "sent (MB)", ".1f"),
        ],
    )
    lines = [
        f"step time        {s['step_time_s'] * 1e3:.3f} ms",
        f"bubble (mean)    {100 * s['bubble_fraction_mean']:.2f} % of the step"
        + megatron_bubble_text(s["megatron_bubble_over_ideal_mean"]),
        breakdown_line(s),
        f"TFLOP/s per GPU  {s['tflops_per_gpu']:.1f}   (MFU {100 * s['mfu']:.1f} %)",
    ]
    if s["numerics"] is not None:
        lines.append(
            f"numerics         max abs err {s['numerics_max_abs_err']:.3g}, "
            f"max rel err {s['numerics_max_rel_err']:.3g} vs single-device reference"
        )
    if s["alltoall_time_share"] > 0:
        lines.append(
            f"all-to-all       {100 * s['alltoall_time_share']:.2f} % of rank time "
            f"({s['alltoall_bytes_total'] / 1e9:.3f} GB sent)"
        )
    if s["symmetry"] is not None:
        lines.append(
            f"symmetry         {s['symmetry']['simulated_ranks']} ranks walked, standing for all "
            f"{round(s['symmetry']['simulated_ranks'] * s['symmetry']['images_per_rank'])} (the table lists them); "
            "their images landed "
            f"{s['symmetry']['image_spread_s']:.3g} s apart at most"
        )
    if routing := moe_routing_line(s):
        lines.append(f"routing          {routing}")
    if over := capacity_message(s["memory_peak_bytes_per_rank"], s["memory_capacity_bytes"]):
        lines.append(f"WARNING          {over}")
    return "\n".join(lines) + "\n\n" + table
