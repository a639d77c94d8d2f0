"""The planner's analytical estimate: the memory peak against a closed form and against the
simulator's own memory timeline; the step time against a full simulation."""

from pathlib import Path

import pytest

from clustersim.schedules.pipeline import rank_order
from clustersim.sim.build import build_topology
from clustersim.sim.cost.units import gathered_peak_bytes
from clustersim.sim.plan.estimate import Fabric, estimate, memory_peak_bytes
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

from repo import QUICKSTART

GPT3_175B_ON_8 = """\
name: too_big
cluster: {gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: 8,
          topology: {kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}}
model: {preset: gpt3-175b}
training: {global_batch: 8, micro_batch: 1, recompute: full}
parallel: {tp: 1, pp: 1, dp: 8, zero: 0}
schedule: gpipe
numerics: {enabled: false}
"""


def test_memory_estimate_refuses_gpt3_175b_unsharded():
    """GPT-3 175B whole on each A100-80GB: 16 bytes per parameter (ZeRO paper, mixed-precision
    Adam) with P = 12 L h^2 + 13 L h + (V + s) h (Narayanan et al. 2021, sec 5.1) plus the untied
    LM head V h and final layernorm 2h, and with full recompute one layer input (2 s b h bytes,
    Korthikanti et al. 2022 Table 2) per layer for the one microbatch: about 2.8 TB, far over 80 GB.
    Full recompute checkpoints the layers only: the embedding keeps its int64 token ids and dropout
    mask (8sb + sbh), the head the final layernorm's and its GEMM's 16-bit inputs (4sbh) and
    Megatron's cross-entropy its fp32 softmax over the vocabulary, its bool target mask and int64
    targets (4sbV + 9sb; megatron/core/tensor_parallel/cross_entropy.py, save_for_backward)."""
    scenario = load_scenario_text(GPT3_175B_ON_8)
    L, h, s, V = 96, 12288, 2048, 50257
    params = 12 * L * h**2 + 13 * L * h + (V + s) * h + V * h + 2 * h
    embedding, head = 8 * s + s * h, 4 * s * h + 4 * s * V + 9 * s
    expected = 16 * params + L * 2 * s * 1 * h + embedding + head
    assert memory_peak_bytes(scenario) == pytest.approx(expected, rel=1e-12)
    est = estimate(scenario, Fabric(build_topology(scenario)))
    assert not est.fits and est.memory_peak_bytes > 30 * est.memory_capacity_bytes


@pytest.mark.parametrize(
    "change",
    [
        {},  # 1F1B over 4 stages
        {"parallel: {pp: 2, dp: 4}": "parallel: {pp: 2, dp: 4, zero: 3}"},  # gathered weights, prefetched
        {"parallel: {pp: 2, dp: 4}": "parallel: {pp: 2, virtual: 2, dp: 2, tp: 2}", "1f1b": "interleaved"},
        {"parallel: {pp: 2, dp: 4}": "parallel: {pp: 1, dp: 8, zero: 3}", "1f1b": "gpipe"},
        {"parallel: {pp: 2, dp: 4}": "parallel: {pp: 2, virtual: 2, dp: 4}", "1f1b": "zbv"},  # a V: head on rank 0
        {"1f1b": "zb-h1"},  # W split off: B frees the head's cross-entropy softmax
    ],
)
def test_memory_estimate_equals_the_simulated_peak(small, change):
    """Same formulas as a run's memory timeline, with the schedule's in-flight microbatches."""
    text = Path(small).read_text() if change else QUICKSTART.read_text().replace("enabled: true", "enabled: false")
    for old, new in change.items():
        assert old in text
        text = text.replace(old, new)
    scenario = load_scenario_text(text)
    summary = simulate(scenario).summary
    simulated = max(peak["total"] for peak in summary["memory_peak_bytes_per_rank"].values())
    estimated = memory_peak_bytes(scenario)
    p = scenario.parallel
    if p.zero < 3:
        assert estimated == pytest.approx(simulated, rel=1e-9)
        return
    # ZeRO 3: the gathered units' peak and the activations' are added though they need not coincide
    order = rank_order(scenario.schedule, p.pp, scenario.num_microbatches, p.virtual)
    assert simulated <= estimated * (1 + 1e-9)
    assert estimated - simulated <= max(gathered_peak_bytes(scenario, steps) for steps in order.values())


def test_step_estimate_is_near_the_simulated_step():
    """An estimate ranks candidates: within 10% of the engine on the quickstart (1F1B, pp 4)."""
    scenario = load_scenario_text(QUICKSTART.read_text().replace("enabled: true", "enabled: false"))
    simulated = simulate(scenario).summary["step_time_s"]
    estimated = estimate(scenario, Fabric(build_topology(scenario))).step_time_s
    assert estimated == pytest.approx(simulated, rel=0.10)


def test_step_estimate_follows_the_kernel_compute_model():
    """With cluster.compute_model: kernel the estimate times compute as the run does: within 10%
    of the engine on the quickstart, and nearer to it than the roofline's estimate is."""
    text = QUICKSTART.read_text().replace("enabled: true", "enabled: false")
    roofline = load_scenario_text(text)
    kernel = load_scenario_text(
        text.replace("  gpu: A100-SXM-80GB\n", "  gpu: A100-SXM-80GB\n  compute_model: kernel\n")
    )
    assert kernel.cluster.compute_model == "kernel"
    simulated = simulate(kernel).summary["step_time_s"]
    estimated = estimate(kernel, Fabric(build_topology(kernel))).step_time_s
    assert estimated == pytest.approx(simulated, rel=0.10)
    roofline_estimated = estimate(roofline, Fabric(build_topology(roofline))).step_time_s
    assert abs(estimated - simulated) < abs(roofline_estimated - simulated)
