"""End to end: a scenario runs through the engine, its numerics match one device, and a rerun is
byte-identical."""

import json

import pytest

from clustersim.schedules.ir import Send
from clustersim.sim.cli import main
from clustersim.sim.cost.stages import stage_params
from clustersim.sim.run import simulate
from clustersim.sim.scenario.loader import load_scenario_text

SCENARIO = """
name: e2e
cluster:
  gpu: A100-SXM-80GB
  nodes: 1
  gpus_per_node: {pp}
  topology: {{kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}}
model: {{layers: 4, hidden: 512, heads: 8, seq_len: 256, vocab: 1000}}
training: {{global_batch: {m}, micro_batch: 1}}
parallel: {{pp: {pp}}}
schedule: {schedule}
numerics: {{hidden: 8, heads: 2, seq_len: 6, vocab: 11, micro_batch: 2, optimizer: {optimizer}, lr: 0.01}}
"""


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp", [1, 2, 4])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_pipelined_step_matches_single_device_reference(schedule, pp, optimizer):
    scenario = load_scenario_text(SCENARIO.format(pp=pp, m=6, schedule=schedule, optimizer=optimizer), "e2e.yaml")
    summary = simulate(scenario).summary
    assert summary["numerics"]["params_compared"] > 0
    assert summary["numerics_max_rel_err"] < 1e-10
    assert summary["numerics"]["loss"] == pytest.approx(summary["numerics"]["reference_loss"], rel=1e-12)


def interleaved_scenario(pp: int, virtual: int, m: int, optimizer: str = "adam", layers: int = 4):
    text = SCENARIO.format(pp=pp, m=m, schedule="interleaved", optimizer=optimizer)
    text = text.replace("layers: 4,", f"layers: {layers},").replace(
        f"parallel: {{pp: {pp}}}", f"parallel: {{pp: {pp}, virtual: {virtual}}}"
    )
    return load_scenario_text(text, "interleaved.yaml")


@pytest.mark.parametrize("pp,virtual,m", [(2, 2, 6), (4, 1, 6), (1, 4, 3)])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_interleaved_step_matches_single_device_reference(pp, virtual, m, optimizer):
    """Chunk c of rank r is stage c x pp + r; 4 layers / (pp x v) per stage, numerics on pp x v stages."""
    result = simulate(interleaved_scenario(pp, virtual, m, optimizer))
    assert result.program.num_stages == pp * virtual
    assert result.program.stage_to_rank == {c * pp + r: r for c in range(virtual) for r in range(pp)}
    summary = result.summary
    assert summary["numerics"]["params_compared"] > 0
    assert summary["numerics_max_rel_err"] < 1e-10
    assert summary["numerics"]["loss"] == pytest.approx(summary["numerics"]["reference_loss"], rel=1e-12)


def test_interleaved_pp4_v2_matches_reference_and_wraps_from_the_last_rank_to_the_first():
    result = simulate(interleaved_scenario(pp=4, virtual=2, m=8, layers=8))
    assert result.summary["numerics_max_rel_err"] < 1e-10
    # 8 stages, 7 boundaries, each crossed by 8 activations and 8 gradients; stage 3 -> 4 is rank 3 -> 0
    assert len(result.log.flows) == 2 * 8 * 7
    sends = {(rank, op.peer) for rank, ops in result.program.ops.items() for op in ops if isinstance(op, Send)}
    assert sends == {(r, (r + 1) % 4) for r in range(4)} | {(r, (r - 1) % 4) for r in range(4)}


def test_run_writes_every_output_and_is_byte_identical_twice(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(pp=4, m=8, schedule="1f1b", optimizer="adam"))
    assert main(["run", str(path), "-o", str(tmp_path / "a")]) == 0
    assert main(["run", str(path), "-o", str(tmp_path / "b")]) == 0
    for name in ("summary.json", "gantt.png", "trace.json", "program.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["peak_inflight_microbatches_per_rank"] == [4, 3, 2, 1]
    assert "step time" in capsys.readouterr().out


def test_step_time_is_the_closed_form_for_a_balanced_pipeline():
    """With a negligible LM head (vocab 1) and near-free links (1 PB/s, the maximum; no latency), every stage
    costs the same, so the bubble is (p-1)/(m+p-1) and the step (m+p-1)(t_F + t_B) + t_OPT."""
    text = (
        SCENARIO.format(pp=4, m=8, schedule="1f1b", optimizer="adam")
        .replace("vocab: 1000", "vocab: 1")
        .replace("300GB/s", "1PB/s")
        .replace("1us", "0us")
    )
    scenario = load_scenario_text(text, "e2e.yaml")
    summary = simulate(scenario).summary
    gpu = scenario.gpu_spec
    t_f = (24 * 256 * 512**2 + 4 * 256**2 * 512) / (gpu.peak_flops * gpu.efficiency)  # Megatron, one layer
    # the last stage's head (2bsh x vocab 1) adds 1.5e-4 of a layer: the ratio is off by about that
    for ratio in summary["megatron_bubble_over_ideal_per_rank"]:  # t_pb / t_id = (p - 1) / m
        assert ratio == pytest.approx(3 / 8, rel=5e-4)
    # the bubble as a share of the step: no compute and no communication on the rank, the
    # optimizer step included in the step, so below (p - 1) / (m + p - 1) = 3 / 11 of the pipeline window
    b = summary["time_breakdown_s"]
    assert b["compute"] + b["bubble"] + sum(b["exposed_comm"].values()) == pytest.approx(summary["step_time_s"])
    assert summary["bubble_fraction_mean"] == pytest.approx(b["bubble"] / summary["step_time_s"])
    assert 0 < summary["bubble_fraction_mean"] < 3 / 11
    assert summary["step_time_s"] > (8 + 4 - 1) * 3 * t_f


TOPOLOGIES = {
    "ring": "{kind: ring, link_bandwidth: 100GB/s, link_latency: 1us}",
    "torus": "{kind: torus, axes: [2, 2], link_bandwidth: 100GB/s, link_latency: 1us}",
    "mesh": "{kind: mesh, axes: [4], link_bandwidth: 100GB/s, link_latency: 1us}",
    "fattree": "{kind: fattree, nic_bandwidth: 50GB/s, leaf_radix: 1, link_latency: 1us}",
}


@pytest.mark.parametrize("kind", sorted(TOPOLOGIES))
def test_pipeline_runs_and_stays_correct_on_every_fabric(kind):
    text = SCENARIO.format(pp=4, m=6, schedule="1f1b", optimizer="adam")
    text = text.replace(
        "topology: {kind: switch, link_bandwidth: 300GB/s, link_latency: 1us}", f"topology: {TOPOLOGIES[kind]}"
    )
    if kind == "fattree":  # 2 nodes x 2 GPUs, one leaf per node: stage 1 -> 2 crosses a spine
        text = text.replace("nodes: 1", "nodes: 2").replace("gpus_per_node: 4", "gpus_per_node: 2")
    scenario = load_scenario_text(text, f"{kind}.yaml")
    result = simulate(scenario)
    assert result.summary["numerics_max_rel_err"] < 1e-10
    # every stage boundary message went over the fabric, and the hottest link carried bytes
    act_bytes = 256 * 1 * 512 * 2  # s x b x h x bf16
    assert len(result.log.flows) == 2 * 6 * 3 and {f.nbytes for f in result.log.flows} == {act_bytes}
    assert result.summary["hottest_links"][0]["bytes"] >= act_bytes


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_data_parallel_scenario_matches_one_device_and_sends_the_zero_volume(zero):
    text = SCENARIO.format(pp=2, m=6, schedule="1f1b", optimizer="adam")
    text = text.replace("parallel: {pp: 2}", f"parallel: {{pp: 2, dp: 2, zero: {zero}, bucket: 1MB}}")
    text = text.replace("training: {global_batch: 6,", "training: {global_batch: 12,")
    text = text.replace("gpus_per_node: 2", "gpus_per_node: 4")
    scenario = load_scenario_text(text, "dp.yaml")
    result = simulate(scenario)
    assert result.summary["numerics"]["replicas"] == 2
    assert result.summary["numerics_max_rel_err"] < 1e-10
    # every rank sends 2 (N-1)/N of its stage's 16-bit gradients on the dp stream (N = 2), x 1.5 under
    # ZeRO 3 with one gather per forward and backward (m = 6 of each) instead of one of each
    for stage in range(2):
        sent = result.summary["comm_bytes_sent_per_rank"][str(stage)]["dp"]
        grads = 2.0 * (stage_params(scenario, stage))
        expected = grads if zero < 3 else grads / 2 * (1 + 2 * 6)
        assert sent == pytest.approx(expected, rel=1e-9)


def test_strict_memory_refuses_a_run_that_does_not_fit(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    path.write_text(
        SCENARIO.format(pp=2, m=4, schedule="gpipe", optimizer="adam")
        .replace("training: {global_batch: 4, micro_batch: 1}", "training: {global_batch: 4, micro_batch: 1}")
        .replace(
            "model: {layers: 4, hidden: 512, heads: 8, seq_len: 256, vocab: 1000}",
            "model: {layers: 4, hidden: 16384, heads: 128, seq_len: 8192, vocab: 1000}",
        )
        .replace("numerics: {", "numerics: {enabled: false, ")
    )
    assert main(["run", str(path), "-o", str(tmp_path / "out"), "--strict-memory"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"clustersim: error: {path}: cluster.gpu: memory: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_full_recompute_adds_a_forward_to_each_backward_and_keeps_only_layer_inputs():
    base = (
        SCENARIO.format(pp=4, m=8, schedule="1f1b", optimizer="adam")
        .replace("vocab: 1000", "vocab: 1")
        .replace("300GB/s", "1PB/s")
        .replace("1us", "0us")
        .replace("numerics: {", "numerics: {enabled: false, ")
    )
    plain = simulate(load_scenario_text(base, "a.yaml")).summary
    full = simulate(
        load_scenario_text(base.replace("micro_batch: 1}", "micro_batch: 1, recompute: full}"), "b.yaml")
    ).summary
    # balanced stages, free links: step = (m + p - 1)(t_F + t_B) + t_OPT, and t_B grows by t_F
    t_f = (24 * 256 * 512**2 + 4 * 256**2 * 512) / (312e12 * 0.5)  # one layer per stage, A100 at 50%
    assert full["step_time_s"] - plain["step_time_s"] == pytest.approx(11 * t_f, rel=1e-3)
    assert full["mfu"] < plain["mfu"]  # same model FLOPs, longer step
    # activations per layer: 2sbh (Korthikanti et al. Table 2) instead of sbh(34 + 5as/h)
    sbh = 256 * 1 * 512
    drop = (sbh * (34 + 5 * 8 * 256 / 512) - 2 * sbh) * 4  # rank 0 holds 4 microbatches of 1 layer
    assert (
        plain["memory_peak_bytes_per_rank"]["0"]["activations"] - full["memory_peak_bytes_per_rank"]["0"]["activations"]
    ) == pytest.approx(drop, rel=1e-12)


@pytest.mark.parametrize("zero", [0, 3])
def test_full_recompute_reruns_the_forward_and_still_matches_one_device(zero):
    text = SCENARIO.format(pp=2, m=4, schedule="1f1b", optimizer="adam")
    text = text.replace("parallel: {pp: 2}", f"parallel: {{pp: 2, dp: 2, zero: {zero}}}")
    text = text.replace(
        "training: {global_batch: 4, micro_batch: 1}", "training: {global_batch: 8, micro_batch: 1, recompute: full}"
    )
    text = text.replace("gpus_per_node: 2", "gpus_per_node: 4")
    result = simulate(load_scenario_text(text, "recompute.yaml"))
    assert result.summary["numerics_max_rel_err"] < 1e-10


@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_sends_megatrons_per_layer_volume(sp):
    """Per microbatch and layer, 2 all-reduces of the (s, b, h) activation in the forward and 2 in
    the backward (Shoeybi et al. 2019), plus the vocab-parallel embedding's all-reduce (first stage,
    forward) and the head's input gradient (last stage, backward); sequence parallelism sends the
    same as reduce-scatter + all-gather (Korthikanti et al. 2022). A ring all-reduce over t ranks
    sends 2 (t - 1)/t of the buffer from each rank, a reduce-scatter or all-gather (t - 1)/t. The
    last stage also gathers every rank's 2 fp32 cross-entropy statistics per token, and sequence
    parallelism sums the replicated parameters' bf16 gradients (6h per layer, 2h more for the final
    layernorm) once per step. Without it, Megatron's scatter/gather (parallel.megatron) all-gathers
    each received pipeline message over the group: one more activation's gather per microbatch."""
    text = (
        SCENARIO.format(pp=2, m=4, schedule="1f1b", optimizer="adam")
        .replace("parallel: {pp: 2}", f"parallel: {{pp: 2, tp: 2, sequence_parallel: {str(sp).lower()}}}")
        .replace("gpus_per_node: 2", "gpus_per_node: 4")
        .replace("numerics: {", "numerics: {enabled: false, ")
    )
    summary = simulate(load_scenario_text(text, "tp.yaml")).summary
    t, m, layers, s_, b, h = 2, 4, 2, 256, 1, 512  # tp, microbatches, layers per stage, the model's sizes
    unit = (t - 1) / t * s_ * b * h * 2  # a reduce-scatter or all-gather of one bf16 activation
    per_microbatch = (2 + 8 * layers) * unit + (0 if sp else unit)  # (1 + 4 L) all-reduces, the message
    loss_gather = (t - 1) / t * t * 2 * b * s_ * 4
    sync = 2 * (t - 1) / t * 2 * (6 * h * layers) if sp else 0.0
    last_sync = 2 * (t - 1) / t * 2 * (6 * h * layers + 2 * h) if sp else 0.0
    expected = {0: m * per_microbatch + sync, 2: m * (per_microbatch + loss_gather) + last_sync}
    for rank in range(4):
        assert summary["comm_bytes_sent_per_rank"][str(rank)]["tp"] == pytest.approx(expected[rank // 2 * 2], rel=1e-9)
    # the matmuls are split two ways: each rank does half a stage's model FLOPs
    one = simulate(
        load_scenario_text(
            SCENARIO.format(pp=2, m=4, schedule="1f1b", optimizer="adam").replace(
                "numerics: {", "numerics: {enabled: false, "
            ),
            "a.yaml",
        )
    ).summary
    assert summary["tflops_per_gpu"] * summary["step_time_s"] * 2 == pytest.approx(
        one["tflops_per_gpu"] * one["step_time_s"], rel=1e-9
    )


def test_a_plot_that_fails_in_its_child_fails_the_run_and_leaves_no_folder(quickstart, out_dir, monkeypatch):
    """The plots are drawn in a forked child beside the trace (sim.report._beside): the child's
    failure must fail write_outputs, and output_folder must leave nothing behind."""
    from clustersim.sim import report

    def broken(result, folder):
        raise OSError("disk full while drawing")

    monkeypatch.setattr(report, "_write_plots", broken)
    with pytest.raises((RuntimeError, OSError), match="drawing"):
        report.write_outputs(simulate(quickstart), out_dir)
    assert not out_dir.exists()
    assert not list(out_dir.parent.iterdir())  # no hidden half-written sibling either
