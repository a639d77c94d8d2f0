"""summary.json: the documented keys (README, "Outputs"), each a function of the event log, the
memory timeline and the numerics' verdict."""

from __future__ import annotations

from clustersim.schedules.ir import Program
from clustersim.sim.cost.kernel import KERNEL_CLASSES
from clustersim.sim.cost.kernel_times import KernelTimes
from clustersim.sim.engine.records import EventLog
from clustersim.sim.results import metrics
from clustersim.sim.results.breakdown import message_departures, step_breakdown
from clustersim.sim.results.links import hottest_links, link_row, link_stats
from clustersim.sim.results.memory import MemoryTimeline, memory_peaks, ranks_over_capacity
from clustersim.sim.scale.symmetry import Symmetry, image_spread_s
from clustersim.sim.scenario.schema import Scenario


def summarize(
    scenario: Scenario,
    program: Program,
    log: EventLog,
    memory: MemoryTimeline,
    numerics: dict | None,
    symmetry: Symmetry | None = None,
) -> dict:
    """The documented summary.json keys (see README, "Outputs"). With `symmetry` the log holds the
    representatives' spans only (and every image's flows): per-rank figures are theirs, copied to
    their images, and rank averages count each representative for all its images."""
    gpus, gpu = scenario.num_gpus, scenario.gpu_spec
    expand = symmetry.expand if symmetry is not None else (lambda per_rank: per_rank)
    walked = len(symmetry.representatives) if symmetry is not None else gpus  # whose spans the log holds
    step_s = metrics.step_time_s(log)
    tflops = metrics.tflops_per_gpu(log, walked)  # every rank computes what its representative does
    breakdown = step_breakdown(log, step_s, message_departures(program, log))
    bubbles = [0.0] * log.num_ranks
    for rank, bubble_s in zip(log.averaged_ranks, breakdown.bubble_s.tolist()):
        bubbles[rank] = bubble_s / step_s if step_s > 0 else 0.0
    by_group: list[dict[str, float]] = [{} for _ in range(log.num_ranks)]
    for group, seconds in breakdown.exposed_by_group_s.items():
        for rank, s in zip(log.averaged_ranks, seconds.tolist()):
            by_group[rank][group] = s
    megatron = metrics.megatron_bubble_over_ideal_per_rank(log)
    over_ideal = [x for x in (megatron[rank] for rank in log.averaged_ranks) if x is not None]
    peaks = expand(memory_peaks(memory))
    if not isinstance(peaks, dict):  # expand keeps a dict by str(rank) one (it is annotated list | dict)
        raise TypeError(f"memory peaks expanded to a {type(peaks).__name__}, not a dict by rank")
    means = breakdown.means()
    by_class = kernel_classes(scenario, program, log)
    return {
        "scenario_name": scenario.name,
        "step_time_s": step_s,
        "time_breakdown_s": {
            "compute": means["compute_s"],
            "exposed_comm": means["exposed_comm_s"],
            "exposed_comm_by_group": means["exposed_by_group_s"],
            "bubble": means["bubble_s"],
        }
        | ({"compute_by_kernel_class": by_class["mean"]} if by_class else {}),
        **({"compute_by_kernel_class_s_per_rank": expand(by_class["per_rank"])} if by_class else {}),
        "bubble_fraction_per_rank": expand(bubbles),
        "exposed_comm_by_group_s_per_rank": expand(by_group),
        "bubble_fraction_mean": means["bubble_s"] / step_s if step_s > 0 else 0.0,
        "megatron_bubble_over_ideal_per_rank": expand(megatron),
        "megatron_bubble_over_ideal_mean": sum(over_ideal) / len(over_ideal) if over_ideal else None,
        "tflops_per_gpu": tflops,
        "mfu": tflops * 1e12 / gpu.peak_flops,
        "peak_inflight_microbatches_per_rank": expand(metrics.peak_inflight_microbatches_per_rank(log)),
        "num_microbatches": scenario.num_microbatches,
        "numerics_max_abs_err": numerics["max_abs_err"] if numerics else None,
        "numerics_max_rel_err": numerics["max_rel_err"] if numerics else None,
        "numerics": numerics,
        "hottest_links": hottest_links_summary(log),
        "memory_peak_bytes_per_rank": peaks,
        "memory_capacity_bytes": gpu.memory_bytes,
        "memory_over_capacity_ranks": ranks_over_capacity(peaks, gpu.memory_bytes),
        "comm_bytes_sent_per_rank": metrics.bytes_sent_per_rank(log),
        **alltoall_summary(log, gpus),
        "symmetry": {
            "simulated_ranks": walked,
            "images_per_rank": gpus / walked,  # on average: classes of replicas differ in size
            "image_spread_s": image_spread_s(log.flows),
        }
        if symmetry is not None
        else None,
        "scenario": scenario.resolved(),
    }


def kernel_classes(scenario: Scenario, program: Program, log: EventLog) -> dict | None:
    """With cluster.compute_model: kernel, each rank's compute seconds by kernel class
    (sim.cost.kernels.KERNEL_CLASSES, from its ops) and their mean over ranks; else None."""
    if scenario.cluster.compute_model != "kernel":
        return None
    times, ranks = KernelTimes(scenario), log.averaged_ranks
    held = {rank: times.by_class_s(program, rank) for rank in ranks}
    mean = {c: sum(held[r][c] for r in ranks) / len(ranks) for c in KERNEL_CLASSES}
    return {"mean": mean, "per_rank": [held.get(rank) for rank in range(log.num_ranks)]}


TRAFFIC_MATRIX_MAX_GPUS = 64  # a bigger matrix is no longer readable in summary.json (traffic.png shows it)


def alltoall_summary(log: EventLog, num_gpus: int) -> dict:
    """The all-to-alls' share of the step, their bytes on the network, and their GPU x GPU
    traffic matrix (null with no all-to-all or more than TRAFFIC_MATRIX_MAX_GPUS GPUs)."""
    small = num_gpus <= TRAFFIC_MATRIX_MAX_GPUS
    matrix = metrics.traffic_matrix_bytes(log, num_gpus, metrics.ALLTOALL_STREAMS, block=1 if small else num_gpus)
    total = float(matrix.sum())
    return {
        "alltoall_time_share": metrics.alltoall_time_share(log),
        "alltoall_bytes_total": total,
        "alltoall_traffic_matrix_bytes": matrix.tolist() if total > 0 and small else None,
    }


def hottest_links_summary(log: EventLog, count: int = 10) -> list[dict]:
    """The most utilised links, hottest first (sim.results.links.link_row for each)."""
    stats = link_stats(log)
    return [link_row(stats, link) for link in hottest_links(stats, count).tolist()]
