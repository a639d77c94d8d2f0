"""parallel.megatron: Megatron-LM's pipeline optimisations, each a switch. Scatter/gather sends 1/t
of each pipeline message per tensor-parallel rank and all-gathers it on receipt (Megatron-LM,
megatron/p2p_communication.py `_communicate`, before it moved into Megatron-Core); output
deallocation frees a stage's output once sent (megatron/core/pipeline_parallel/schedules.py
`deallocate_output_tensor`); overlap_grad_reduce buckets the gradients by whole layers and starts
each bucket as its layers' part of the last backward ends (megatron/core/distributed/
param_and_grad_buffer.py). The weights still match one device, and the bytes and the memory move
by the closed forms."""

import pytest

from clustersim.schedules.ir import Collective, Phase, Recv
from clustersim.schedules.tags import GradBucket, GradSync, StageInput
from clustersim.schedules.zero3 import unit_buckets
from clustersim.sim.cost.compute import boundary_activation_bytes
from clustersim.sim.cost.stages import weight_bytes
from clustersim.sim.cost.units import layer_bytes
from clustersim.sim.run import simulate
from clustersim.sim.scenario.errors import ScenarioError
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: megatron_options
cluster: {{gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: {gpus},
           topology: {{kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}}}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 1024, vocab: 32000}}
training: {{global_batch: 4, micro_batch: 1, dtype: bf16}}
parallel: {{tp: {tp}, pp: 2, dp: {dp}, zero: {zero}, sequence_parallel: {sp}, bucket: 40MB, megatron: {{{megatron}}}}}
schedule: 1f1b
numerics: {{hidden: 16, heads: 4, seq_len: 8, vocab: 32, micro_batch: 2}}
"""
MESSAGE_BYTES = boundary_activation_bytes(1, 1024, 1024, 2)  # one (s, b, h) bf16 activation


def run(tp: int = 2, sp: bool = False, dp: int = 1, zero: int = 0, **megatron: bool):
    switches = ", ".join(f"{key}: {str(value).lower()}" for key, value in megatron.items())
    text = SCENARIO.format(gpus=2 * tp * dp, tp=tp, dp=dp, zero=zero, sp=str(sp).lower(), megatron=switches)
    return simulate(load_scenario_text(text, "megatron_options.yaml"))


@pytest.mark.parametrize("tp", [2, 4])
def test_scatter_gather_sends_one_tp_th_and_gathers_it_over_the_group(tp):
    on, off = run(tp, scatter_gather=True), run(tp, scatter_gather=False)
    for result in (on, off):
        assert result.summary["numerics_max_rel_err"] < 1e-10
    for rank in map(str, range(2 * tp)):  # 4 microbatches: 4 activations or 4 gradients sent per rank
        assert off.summary["comm_bytes_sent_per_rank"][rank]["send"] == 4 * MESSAGE_BYTES
        assert on.summary["comm_bytes_sent_per_rank"][rank]["send"] == 4 * MESSAGE_BYTES / tp
    recvs = [op for op in on.program.ops[0] if isinstance(op, Recv)]
    gathers = [op for op in on.program.ops[0] if isinstance(op, Collective) and isinstance(op.tag, StageInput)]
    assert len(recvs) == len(gathers) == 4  # stage 0 receives the 4 gradients
    assert all(g.deps == (r.label,) and g.nbytes == MESSAGE_BYTES for r, g in zip(recvs, gathers))


def test_with_sequence_parallelism_scatter_gather_changes_nothing():
    """The message is each rank's sequence shard already (Megatron-LM skipped the split then)."""
    on, off = run(sp=True, scatter_gather=True), run(sp=True, scatter_gather=False)
    assert on.program.to_text() == off.program.to_text()


def test_without_output_deallocation_each_in_flight_microbatch_also_holds_its_stage_output():
    on, off = run(deallocate_outputs=True), run(deallocate_outputs=False)
    for rank in range(2):  # stage 0 (ranks 0, 1) sends its output; 1F1B holds 2 microbatches there
        inflight = on.summary["peak_inflight_microbatches_per_rank"][rank]
        gained = (
            off.summary["memory_peak_bytes_per_rank"][str(rank)]["activations"]
            - on.summary["memory_peak_bytes_per_rank"][str(rank)]["activations"]
        )
        assert inflight == 2 and gained == inflight * MESSAGE_BYTES
    last = str(2)  # the last stage sends no output
    assert off.summary["memory_peak_bytes_per_rank"][last] == on.summary["memory_peak_bytes_per_rank"][last]


def test_overlapped_buckets_are_whole_layers_taken_last_to_first():
    """Megatron-LM's param_and_grad_buffer: parameters in backward order until a bucket holds at
    least bucket_size; here units of 10, 20, 30, 40 bytes in buckets of at least 45."""
    assert unit_buckets([10.0, 20.0, 30.0, 40.0], 45.0) == [range(0, 2), range(2, 4)]
    assert unit_buckets([10.0, 20.0, 30.0, 40.0], 1e9) == [range(0, 4)]
    assert unit_buckets([10.0, 20.0], 1.0) == [range(0, 1), range(1, 2)]


@pytest.mark.parametrize("zero", [0, 1, 2])
@pytest.mark.parametrize("tp,sp", [(1, False), (2, True)])
def test_overlapped_gradient_reduction_starts_inside_the_last_backward(zero, tp, sp):
    on, off = run(tp, sp, dp=2, zero=zero, overlap_grad_reduce=True), run(tp, sp, dp=2, zero=zero)
    for result in (on, off):
        assert result.summary["numerics_max_rel_err"] < 1e-10
    scenario = on.scenario
    for stage, rank in on.program.stage_to_rank.items():
        reduces = [op for op in on.program.ops[rank] if isinstance(op, Collective) and isinstance(op.tag, GradBucket)]
        groups = unit_buckets(layer_bytes(scenario, stage), 40e6)
        assert [r.tag.bucket for r in reduces] == list(reversed(range(len(groups))))  # the backward's order
        assert sum(r.nbytes for r in reduces) == pytest.approx(weight_bytes(scenario, stage), rel=1e-12)
        for result in (on, off):  # the same bytes on the wire: 2 (N-1)/N of the gradients, N = 2
            assert result.summary["comm_bytes_sent_per_rank"][str(rank)]["dp"] == pytest.approx(
                weight_bytes(scenario, stage), rel=1e-9
            )
        last_backward = max(s.end_s for s in on.log.spans if s.rank == rank and s.phase == Phase.B)
        first = min(s.start_s for s in on.log.spans if s.rank == rank and s.label == reduces[0].label)
        if len(groups) > 1:  # Megatron-LM sums the tensor-parallel gradients after (finalize_model_grads)
            assert first < last_backward
    exposed = [result.summary["time_breakdown_s"]["exposed_comm_by_group"]["DP"] for result in (on, off)]
    assert exposed[0] < exposed[1]
    if tp == 1:  # with tensor parallelism the early reductions share the links with the backward's
        # collectives and sends and can delay them (here 10 us of a 4 ms step): no faster step promised
        assert on.summary["step_time_s"] <= off.summary["step_time_s"]


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("overlap", [False, True])
def test_the_tensor_parallel_gradient_sum_follows_the_data_parallel_reduction(zero, overlap):
    """Megatron-Core's finalize_model_grads: finish_grad_sync (every bucket reduced over data
    parallelism), then _allreduce_layernorm_grads (the sequence-parallel layernorms' gradients
    summed over the tensor-parallel group), then the optimizer step."""
    result = run(2, True, dp=2, zero=zero, overlap_grad_reduce=overlap)
    assert result.summary["numerics_max_rel_err"] < 1e-10
    for rank, ops in result.program.ops.items():
        spans = {s.label: s for s in result.log.spans if s.rank == rank}
        for op in ops:
            if isinstance(op, Collective) and isinstance(op.tag, GradSync):
                reduced = [
                    spans[o.label].end_s
                    for o in ops
                    if isinstance(o, Collective) and isinstance(o.tag, GradBucket) and o.tag.stage == op.tag.stage
                ]
                assert reduced and spans[op.label].start_s >= max(reduced), (rank, op.label)


def test_rejects_overlap_with_expert_parallelism():
    text = SCENARIO.format(gpus=4, tp=1, dp=2, zero=0, sp="false", megatron="overlap_grad_reduce: true")
    text = text.replace("vocab: 32000}", "vocab: 32000, moe: {experts: 2, top_k: 1}}").replace(
        "dp: 2,", "dp: 2, ep: 2,"
    )
    with pytest.raises(ScenarioError, match="parallel.megatron.overlap_grad_reduce"):
        load_scenario_text(text, "moe.yaml")


@pytest.mark.parametrize(
    "zero,megatron,reason",
    [
        (0, "overlap_grad_reduce: true, overlap_param_gather: true", "needs parallel.zero 1 or 2"),
        (3, "overlap_param_gather: true", "needs parallel.zero 1 or 2"),
        (1, "overlap_param_gather: true", "needs parallel.megatron.overlap_grad_reduce: true"),
    ],
)
def test_rejects_overlapped_param_gather_without_a_sharded_optimizer_and_overlapped_reduction(zero, megatron, reason):
    """Megatron-LM's arguments.py: --overlap-param-gather needs the distributed optimizer and
    --overlap-grad-reduce."""
    text = SCENARIO.format(gpus=4, tp=1, dp=2, zero=zero, sp="false", megatron=megatron)
    with pytest.raises(ScenarioError, match=f"parallel.megatron.overlap_param_gather.*{reason}"):
        load_scenario_text(text, "param_gather.yaml")
