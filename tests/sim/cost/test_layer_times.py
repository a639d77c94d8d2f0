"""bench/layer_times.py reads one layer's time off the simulation as the growth of a pass per added
layer: it must be the layer's kernels plus its tensor-parallel collectives, nothing of the
embedding or the head."""

import sys

import pytest

from repo import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from layer_times import EXPERIMENTS, layer_ms, scenario_of  # noqa: E402

from clustersim.sim.cost.kernel_times import shapes_of  # noqa: E402
from clustersim.sim.cost.kernels import LayerKernels  # noqa: E402
from clustersim.sim.run import simulate  # noqa: E402
from clustersim.sim.scenario.chips import CHIPS  # noqa: E402


def test_a_layers_forward_is_its_kernels_and_its_two_all_reduces():
    """Baseline (no recompute, no sequence parallelism): Megatron's layer forward is attention and
    MLP kernels with one all-reduce of the (s, b, h) activation after each (Shoeybi et al. 2019)."""
    baseline = EXPERIMENTS[0]
    assert (baseline.recompute, baseline.sequence_parallel) == ("none", False)
    scenario = scenario_of(baseline, 2, "kernel")
    layer = LayerKernels(CHIPS[scenario.cluster.gpu], scenario.gpu_spec, shapes_of(scenario))
    kernels_s = sum(k.time_s for item in ("attn", "mlp") for k in layer.item(item).forward)
    activation_bytes = scenario.training.micro_batch * scenario.model.seq_len * scenario.model.hidden * 2
    all_reduce_s = next(
        s.duration_s
        for s in simulate(scenario).log.spans
        if s.rank == 0 and s.stream == "tp" and s.nbytes == activation_bytes
    )
    forward_ms, _ = layer_ms(baseline, "kernel")
    assert forward_ms == pytest.approx(1e3 * (kernels_s + 2 * all_reduce_s), rel=1e-9)
