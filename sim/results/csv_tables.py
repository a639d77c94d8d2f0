"""ranks.csv and links.csv: the per-rank and per-link figures of a run as flat tables, for
spreadsheets and pandas. Pure functions of summary.json and the network's link statistics."""

from __future__ import annotations

import csv
import io

from clustersim.sim.network.records import LinkStats
from clustersim.sim.results.links import link_row
from clustersim.sim.results.memory import CATEGORIES


def rank_rows(summary: dict) -> list[dict[str, object]]:
    """One row per rank: its bubble fraction (of the step), Megatron's bubble over ideal, peak
    in-flight microbatches, exposed communication seconds by parallelism group, memory peak by
    category (bytes), bytes sent per stream (0 where a rank sends nothing on a stream) and, with the
    kernel compute model, compute seconds by kernel class."""
    memory, sent = summary["memory_peak_bytes_per_rank"], summary["comm_bytes_sent_per_rank"]
    exposed = summary["exposed_comm_by_group_s_per_rank"]
    streams = sorted({stream for per_rank in sent.values() for stream in per_rank})
    kernels = summary.get("compute_by_kernel_class_s_per_rank")  # cluster.compute_model: kernel
    return [
        {
            "rank": rank,
            "bubble_fraction": bubble,
            "megatron_bubble_over_ideal": over_ideal,
            "peak_inflight_microbatches": inflight,
            **{f"exposed_{group}_s": seconds for group, seconds in exposed[rank].items()},
            **{f"memory_{c}_bytes": memory[str(rank)][c] for c in (*CATEGORIES, "total")},
            **{f"sent_{stream}_bytes": sent.get(str(rank), {}).get(stream, 0.0) for stream in streams},
            **({f"compute_{c}_s": v for c, v in kernels[rank].items()} if kernels else {}),
        }
        for rank, (bubble, over_ideal, inflight) in enumerate(
            zip(
                summary["bubble_fraction_per_rank"],
                summary["megatron_bubble_over_ideal_per_rank"],
                summary["peak_inflight_microbatches_per_rank"],
            )
        )
    ]


def link_rows(stats: LinkStats) -> list[dict[str, object]]:
    """One row per link that carried bytes, by link id: its figures (sim.results.links.link_row)
    and its bandwidth."""
    return [
        {**link_row(stats, link), "bandwidth_Bps": float(stats.capacity_Bps[link])}
        for link in range(len(stats.names))
        if stats.bytes[link] > 0
    ]


def csv_text(rows: list[dict[str, object]]) -> str:
    """The rows as CSV with a header (floats as Python writes them, so they read back exactly)."""
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()
