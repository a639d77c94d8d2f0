"""The sharded optimizer's weight all-gather overlapped with the next forward (schedules.param_gather,
Apex's overlap_param_sync, Megatron-LM's --overlap-param-gather). Steady state of one step: the
first bucket's gather follows its stage's optimizer step (for the next step), gather j >= 1 starts
as the forward's use of bucket j - 1 does, and each bucket's first forward piece waits for its
gather. On one microbatch, dp 2, every layer its own bucket: the step is shorter by every gather
but the first, which the forward hides when each is shorter than the layer before it. The bytes,
the memory and the weights after the step stay those of the gathers after the optimizer step."""

import pytest

from clustersim.schedules.ir import Collective, Comm, Phase
from clustersim.schedules.tags import ParamBucket
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: param_gather
cluster: {{gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: 2, compute_model: roofline,
           topology: {{kind: switch, link_bandwidth: {bandwidth}, link_latency: 1us}}}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 1024, vocab: 32000}}
training: {{global_batch: 2, micro_batch: 1, dtype: bf16}}
parallel: {{tp: 1, pp: 1, dp: 2, zero: {zero}, bucket: 1MB,
           megatron: {{overlap_grad_reduce: true, overlap_param_gather: {on}}}}}
schedule: 1f1b
numerics: {{hidden: 16, heads: 4, seq_len: 8, vocab: 32, micro_batch: 2}}
"""


def run(on: bool, zero: int = 1, bandwidth: str = "300GB/s"):
    text = SCENARIO.format(on=str(on).lower(), zero=zero, bandwidth=bandwidth)
    return simulate(load_scenario_text(text, "param_gather.yaml"))


def spans(result, phase) -> list:
    """Rank 0's spans of a phase, in the order they ran."""
    return sorted((s for s in result.log.spans if s.rank == 0 and s.phase == phase), key=lambda s: s.start_s)


@pytest.mark.parametrize("zero", [1, 2])
def test_the_step_shortens_by_every_gather_but_the_first(zero):
    on, off = run(True, zero), run(False, zero)
    for result in (on, off):
        assert result.summary["numerics_max_rel_err"] < 1e-10
    gathers, (step,) = spans(on, Comm.ALL_GATHER), spans(on, Phase.OPT)
    assert len(gathers) == 4  # one bucket per layer (the embedding with the first, the head with the last)
    assert spans(on, Phase.F)[0].start_s == 0.0  # the first bucket came with the last step's update
    *ahead, first = gathers  # the next step's first bucket (and the embedding) once the update has run
    assert first.start_s == step.end_s == on.summary["step_time_s"] - (first.end_s - first.start_s)
    hidden = sum(s.end_s - s.start_s for s in ahead)
    assert off.summary["step_time_s"] - on.summary["step_time_s"] == pytest.approx(hidden, rel=1e-9)
    assert sum(s.nbytes for s in gathers) == pytest.approx(sum(s.nbytes for s in spans(off, Comm.ALL_GATHER)))
    assert on.summary["memory_peak_bytes_per_rank"] == off.summary["memory_peak_bytes_per_rank"]


@pytest.mark.parametrize("bandwidth", ["300GB/s", "2GB/s"])
def test_each_gather_starts_as_the_previous_buckets_use_does(bandwidth):
    """Fast link: each gather hides behind the layer before its own; slow link (2 GB/s, a gather
    many times a layer's forward): the forward waits for each one in turn."""
    on = run(True, bandwidth=bandwidth)
    assert on.summary["numerics_max_rel_err"] < 1e-10
    ops = [op for op in on.program.ops[0] if isinstance(op, Collective) and isinstance(op.tag, ParamBucket)]
    *ahead, first = ops  # gathers 1, 2, 3 on the stream first; the next step's first after the update
    span = {s.label: s for s in on.log.spans if s.rank == 0}
    pieces = spans(on, Phase.F)
    users = [next(op for op in on.program.ops[0] if g.label in getattr(op, "deps", ())) for g in ahead]
    assert [u.label for u in users] == [p.label for p in pieces[1:]]  # uses 1, 2, 3: one layer each
    for j, (gather, use) in enumerate(zip(ahead, users), start=1):
        previous_use = span[pieces[j - 1].label]
        assert span[gather.label].start_s == pytest.approx(previous_use.start_s, abs=1e-15)
        assert span[use.label].start_s == max(span[gather.label].end_s, previous_use.end_s)
    waited = span[users[-1].label].start_s - span[ahead[-1].label].end_s
    assert (waited > 0) == (bandwidth == "300GB/s")
