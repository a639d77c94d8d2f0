"""The sharded optimizer's weight all-gather overlapped with the next forward (schedules.param_gather,
Megatron-LM's --overlap-param-gather, Apex's overlap_param_sync): gather 0 at the step's start,
gather j + 1 starting as the forward's use of bucket j starts, each bucket's first forward piece
after its gather. On one microbatch, dp 2, every layer its own bucket: with the switch the step is
shorter by every gather but the first, which the forward hides when each is shorter than the layer
before it; the bytes, the memory and the weights after the step stay those of the gathers after
the optimizer step."""

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


def gathers(result, rank: int = 0) -> list:
    """The rank's weight all-gather spans, in the order they ran."""
    spans = [s for s in result.log.spans if s.rank == rank and s.phase == Comm.ALL_GATHER]
    return sorted(spans, key=lambda s: s.start_s)


@pytest.mark.parametrize("zero", [1, 2])
def test_the_step_shortens_by_every_gather_but_the_first(zero):
    on, off = run(True, zero), run(False, zero)
    for result in (on, off):
        assert result.summary["numerics_max_rel_err"] < 1e-10
    ran = gathers(on)
    assert len(ran) == 4  # one bucket per layer (the embedding with the first, the head with the last)
    first_forward = min(s.start_s for s in on.log.spans if s.rank == 0 and s.phase == Phase.F)
    assert first_forward == ran[0].end_s  # only the first gather is exposed: the forward waits for it
    hidden = sum(s.end_s - s.start_s for s in ran[1:])
    assert off.summary["step_time_s"] - on.summary["step_time_s"] == pytest.approx(hidden, rel=1e-9)
    for result in (on, off):  # the same bytes on the wire: (N-1)/N of the weights gathered, N = 2
        assert sum(s.nbytes for s in gathers(result)) == pytest.approx(sum(s.nbytes for s in gathers(off)), rel=1e-12)
    assert on.summary["memory_peak_bytes_per_rank"] == off.summary["memory_peak_bytes_per_rank"]


@pytest.mark.parametrize("bandwidth", ["300GB/s", "2GB/s"])
def test_each_gather_starts_as_the_previous_buckets_use_does(bandwidth):
    """Fast link: each gather hides behind the layer before its own; slow link (2 GB/s, a gather
    several times a layer's forward): the forward waits for each one in turn."""
    on = run(True, bandwidth=bandwidth)
    assert on.summary["numerics_max_rel_err"] < 1e-10
    ops = [op for op in on.program.ops[0] if isinstance(op, Collective) and isinstance(op.tag, ParamBucket)]
    span = {s.label: s for s in on.log.spans if s.rank == 0}
    uses = [next(op for op in on.program.ops[0] if g.label in getattr(op, "deps", ())) for g in ops]
    pieces = [s for s in on.log.spans if s.rank == 0 and s.phase == Phase.F]
    for j, (gather, use) in enumerate(zip(ops, uses)):
        assert use.phase == Phase.F and use.microbatch == 0
        before = [s.end_s for s in pieces if s.end_s <= span[use.label].start_s]
        assert span[use.label].start_s == max([span[gather.label].end_s, *before])
        if j > 0:  # it waits for the previous gather and the compute before that one's use
            assert span[gather.label].start_s == pytest.approx(span[uses[j - 1].label].start_s, abs=1e-15)
    waited = span[uses[-1].label].start_s - span[ops[-1].label].end_s
    assert (waited > 0) == (bandwidth == "300GB/s")
