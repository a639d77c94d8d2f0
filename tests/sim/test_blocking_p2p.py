"""parallel.megatron.blocking_p2p: Megatron-LM of 2021-22 ran each pipeline exchange as
batch_isend_irecv, a wait on every request and torch.cuda.synchronize() before the next compute
(megatron/p2p_communication.py `_communicate`), so a send does not overlap the rank's next compute.
The step grows by the closed form of the 1F1B timeline, the weights still match one device, and
the default follows the compute model (on for the kernel model's predictions)."""

import pytest

from clustersim.schedules.ir import Comm, Compute, Send
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: blocking
cluster: {{gpu: A100-SXM-80GB, nodes: 1, gpus_per_node: 2, compute_model: {model},
           topology: {{kind: switch, link_bandwidth: 25GB/s, link_latency: 1us}}}}
model: {{layers: 4, hidden: 1024, heads: 16, ffn: 4096, seq_len: 1024, vocab: 32000}}
training: {{global_batch: 2, micro_batch: 1, dtype: bf16}}
parallel: {{pp: 2, megatron: {{{megatron}}}}}
schedule: 1f1b
numerics: {{hidden: 16, heads: 4, seq_len: 8, vocab: 32, micro_batch: 2}}
"""


def scenario(blocking: bool | None, model: str = "roofline"):
    megatron = "" if blocking is None else f"blocking_p2p: {str(blocking).lower()}"
    return load_scenario_text(SCENARIO.format(megatron=megatron, model=model), "blocking.yaml")


def test_a_blocking_send_delays_the_two_stage_1f1b_step_by_one_transfer():
    """p = 2, m = 2. Rank 0: F0 F1 B0 B1, rank 1: F0 B0 F1 B1, stage times t_F and t_B, each message
    tau < t_F. Overlapped, rank 0's F1 runs beside F0's send and the step is 3 t_F + 3 t_B + 2 tau
    (rank 0's B1 waits for B1's gradient: 3 t_F + 2 t_B + 2 tau). Blocking, F1 on rank 0 starts tau
    late, which reaches rank 1's F1 through its input; and rank 1's F1 also waits for B0's send:
    B1's gradient arrives at 3 t_F + 2 t_B + 3 tau, one tau later."""
    on, off = simulate(scenario(True)), simulate(scenario(False))
    sends = [s for s in off.log.spans if s.phase == Comm.SEND]
    taus = {round(s.end_s - s.start_s, 15) for s in sends}
    assert len(taus) == 1  # every message is one (s, b, h) activation or gradient
    computes = [s for s in off.log.spans if s.rank == 0 and s.label.startswith("F0@")]
    assert max(taus) < computes[0].end_s - computes[0].start_s  # tau < t_F, the timeline above
    assert on.summary["step_time_s"] - off.summary["step_time_s"] == pytest.approx(max(taus), rel=1e-9)
    assert on.summary["numerics_max_rel_err"] < 1e-10


def test_every_compute_after_a_send_waits_for_it():
    program = simulate(scenario(True)).program
    for ops in program.ops.values():
        pending: list[str] = []
        for op in ops:
            if isinstance(op, Send):
                pending.append(op.label)
            elif isinstance(op, Compute):
                assert set(pending) <= set(op.deps), op.label
                pending = []


@pytest.mark.parametrize("model,blocking", [("roofline", False), ("kernel", True)])
def test_unset_it_follows_the_compute_model(model, blocking):
    """Off for the roofline (its closed-form bubbles assume free communication), on for the kernel
    model, which predicts Megatron-LM's runs."""
    assert scenario(None, model).blocking_p2p is blocking
    default, explicit = simulate(scenario(None, model)), simulate(scenario(blocking, model))
    assert default.summary["step_time_s"] == explicit.summary["step_time_s"]
