"""One run, in explicit phases: build (topology, program, numerics), run (the engine), post-process
(metrics into a summary). Writing files is sim.report's job; this module returns data only, so a
notebook gets the same numbers as the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx
import simpy

from schedules.ir import Compute, Program
from schedules.pipeline import build_program, rank_order, stage_ranks
from schedules.validate import validate
from sim import cost, metrics
from sim.engine import run_program
from sim.links_plot import hottest_links
from sim.network import Network
from sim.numerics.pipeline import PipelineNumerics
from sim.numerics.transformer import ShadowConfig
from sim.records import EventLog
from sim.scenario import Scenario
from topologies.registry import TOPOLOGIES

def build_topology(scenario: Scenario) -> nx.DiGraph:
    """The scenario's network graph: the registry's builder, given the keys its kind takes
    (sim.scenario.TOPOLOGY_KEYS) and the cluster's sizes."""
    c, t = scenario.cluster, scenario.cluster.topology
    link = {"bandwidth_Bps": t.link_bandwidth_Bps, "latency_s": t.link_latency_s}
    node = {"gpus_per_node": c.gpus_per_node, "nvlink_bandwidth_Bps": t.nvlink_bandwidth_Bps,
            "nic_bandwidth_Bps": t.nic_bandwidth_Bps, "latency_s": t.link_latency_s}
    if t.kind in ("switch", "ring"):
        args = {"num_gpus": c.num_gpus, **link}
    elif t.kind in ("torus", "mesh"):
        args = {"axes": tuple(t.axes), **link, **({"wrap": t.wrap} if t.kind == "torus" else {})}
    elif t.kind == "dgx":
        args = node
    else:  # fattree
        args = {"nodes": c.nodes, **node, "leaf_radix": t.leaf_radix, "oversubscription": t.oversubscription,
                "tiers": t.tiers, "load_balance": t.load_balance}
    return TOPOLOGIES[t.kind](**args)


@dataclass(frozen=True)
class RunResult:
    """Everything one run produced: the scenario, the program it ran, the log, and the summary."""

    scenario: Scenario
    program: Program
    graph: nx.DiGraph
    log: EventLog
    summary: dict


def stage_to_rank(scenario: Scenario) -> dict[int, int]:
    """Pipeline stage c x pp + r runs on rank r (chunk c of v = parallel.virtual; v = 1: stage s on
    rank s; tp = dp = 1 for now)."""
    return stage_ranks(scenario.parallel.pp, scenario.parallel.virtual)


def stage_costs(scenario: Scenario, stage: int) -> tuple[float, float, float]:
    """(forward FLOPs, backward FLOPs, optimizer bytes touched) of one stage for one microbatch.

    There are pp x v stages of layers / (pp x v) layers each; stage 0 also holds the embeddings
    and the last stage (pp x v - 1, on rank pp - 1) the final layernorm and LM head."""
    m, num_stages = scenario.model_spec, scenario.parallel.num_stages
    b = scenario.training.micro_batch
    layers = m.layers // num_stages
    forward = layers * cost.layer_forward_flops(b, m.seq_len, m.hidden, m.ffn, m.gated_mlp)
    params = layers * cost.layer_params(m.hidden, m.ffn, m.gated_mlp)
    if stage == 0:
        params += (m.vocab + m.seq_len) * m.hidden  # token and position embeddings
    if stage == num_stages - 1:
        forward += cost.head_forward_flops(b, m.seq_len, m.hidden, m.vocab)
        params += m.hidden * m.vocab + 2 * m.hidden  # LM head and final layernorm
    return forward, 2 * forward, params * cost.ADAM_BYTES_PER_PARAM


def make_program(scenario: Scenario) -> Program:
    """The validated per-rank op lists for the scenario's schedule."""
    p, m = scenario.parallel, scenario.model_spec
    costs = [stage_costs(scenario, stage) for stage in range(p.num_stages)]
    act_bytes = cost.boundary_activation_bytes(scenario.training.micro_batch, m.seq_len, m.hidden,
                                               scenario.dtype_bytes)
    order = rank_order(scenario.schedule, p.pp, scenario.num_microbatches, p.virtual)
    program = build_program(order, scenario.num_microbatches, stage_to_rank(scenario), act_bytes,
                            forward_flops=lambda s: costs[s][0], backward_flops=lambda s: costs[s][1],
                            optimizer_bytes=lambda s: costs[s][2])
    validate(program)
    return program


def compute_time_fn(scenario: Scenario) -> Callable[[Compute], float]:
    """Roofline: an op takes as long as the slower of its FLOPs and its memory traffic."""
    gpu = scenario.gpu_spec
    return lambda op: max(cost.compute_time_s(op.flops, gpu.peak_flops, gpu.efficiency),
                          cost.memory_time_s(op.nbytes, gpu.hbm_bandwidth_Bps))


def make_numerics(scenario: Scenario) -> PipelineNumerics | None:
    """The shadow model: the real layer count and stage split (pp x v stages), a tiny hidden size."""
    n = scenario.numerics
    if not n.enabled:
        return None
    cfg = ShadowConfig(layers=scenario.model_spec.layers, hidden=n.hidden, heads=n.heads, ffn=4 * n.hidden,
                       seq_len=n.seq_len, vocab=n.vocab, dtype=n.dtype)
    return PipelineNumerics(cfg, scenario.parallel.num_stages, scenario.num_microbatches, n.micro_batch,
                            stage_to_rank(scenario), n.seed, n.optimizer, n.lr)


def simulate(scenario: Scenario) -> RunResult:
    """Build, run and post-process one scenario."""
    program = make_program(scenario)
    graph = build_topology(scenario)
    network = Network(simpy.Environment(), graph)
    numerics = make_numerics(scenario)
    log = run_program(program, network, compute_time_fn(scenario), numerics=numerics)
    return RunResult(scenario, program, graph, log, summarize(scenario, log, numerics.finish() if numerics else None))


def summarize(scenario: Scenario, log: EventLog, numerics: dict | None) -> dict:
    """The documented summary.json keys (see README, "Outputs")."""
    gpus, gpu = scenario.num_gpus, scenario.gpu_spec
    bubbles = metrics.bubble_ratio_per_rank(log)
    return {
        "scenario_name": scenario.name,
        "step_time_s": metrics.step_time_s(log),
        "bubble_ratio_per_rank": bubbles,
        "bubble_ratio_mean": sum(bubbles) / len(bubbles),
        "tflops_per_gpu": metrics.tflops_per_gpu(log, gpus),
        "mfu": metrics.mfu(log, gpus, gpu.peak_flops),
        "peak_inflight_microbatches_per_rank": metrics.peak_inflight_microbatches_per_rank(log),
        "num_microbatches": scenario.num_microbatches,
        "numerics_max_abs_err": numerics["max_abs_err"] if numerics else None,
        "numerics_max_rel_err": numerics["max_rel_err"] if numerics else None,
        "numerics": numerics,
        "hottest_links": hottest_links_summary(log),
        "scenario": scenario.resolved(),
    }


def hottest_links_summary(log: EventLog, count: int = 10) -> list[dict]:
    """The most utilised links: name, bytes, busy time, utilisation (bytes / (bandwidth x step)),
    peak concurrent flows."""
    stats = log.links
    return [{"link": stats.names[l], "bytes": float(stats.bytes[l]), "busy_s": float(stats.busy_s[l]),
             "utilisation": float(stats.utilisation[l]), "peak_flows": int(stats.peak_flows[l])}
            for l in hottest_links(stats, count).tolist()]
