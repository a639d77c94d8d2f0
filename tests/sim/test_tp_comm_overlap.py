"""parallel.megatron.tp_comm_overlap: Transformer Engine's overlap of the sequence-parallel
all-gather and reduce-scatter with the GEMMs beside them (schedules.tp_overlap). One layer's
forward, read off the simulation as the growth of the forward per added layer, is its kernels plus
what its GEMMs do not cover, by the chunking's closed form per sublayer (t = tp, 4 pipeline chunks):

    pre + max(entry (t-1)/t, AG) + entry / t + mid + exit / 4 + max(exit 3/4, RS of 3/4) + RS of 1/4 + post

so with collectives shorter than their GEMMs only the reduce-scatter's last chunk shows, and with
longer ones what the GEMM does not cover too. Off, the collectives block as before. The shadow
model's weights still match one device's."""

import dataclasses

import pytest

from clustersim.schedules.ir import Phase
from clustersim.sim.cost.kernel_times import ENTRY_EXIT, shapes_of
from clustersim.sim.cost.kernels import LayerKernels
from clustersim.sim.run import simulate
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.errors import ScenarioError
from clustersim.sim.scenario.loader import load_scenario_text

TP = 4
SCENARIO = """
name: tp_comm_overlap
cluster: {{gpu: H100-SXM, nodes: 1, gpus_per_node: {gpus}, compute_model: {model},
           topology: {{kind: switch, link_bandwidth: {bandwidth}, link_latency: 1us}}}}
model: {{layers: {layers}, hidden: 8192, heads: 64, ffn: 32768, seq_len: 2048, vocab: 32768}}
training: {{global_batch: {batch}, micro_batch: 1, dtype: bf16, flash_attention: true, recompute: {recompute}}}
parallel: {{tp: {tp}, pp: {pp}, dp: {dp}, zero: {zero}, sequence_parallel: {sp}, megatron: {{{megatron}}}}}
schedule: {schedule}
numerics: {{enabled: {numerics}, hidden: 16, heads: 4, seq_len: 8, vocab: 32, micro_batch: 2}}
"""


def scenario(layers=2, bandwidth="450GB/s", overlap=True, tp=TP, sp=True, model="kernel", pp=1, dp=1, sms="", **more):
    megatron = f"tp_comm_overlap: {str(overlap).lower()}" + (f", tp_comm_overlap_sms: {{{sms}}}" if sms else "")
    settings = {"recompute": "none", "schedule": "1f1b", "numerics": "false", "batch": dp, "zero": 0} | more
    text = SCENARIO.format(
        gpus=tp * pp * dp, model=model, bandwidth=bandwidth, layers=layers, tp=tp, pp=pp, dp=dp,
        sp=str(sp).lower(), megatron=megatron, **settings,
    )  # fmt: skip
    return load_scenario_text(text, "tp_comm_overlap.yaml")


def forward_s(s) -> tuple[float, list]:
    """Rank 0's forward of microbatch 0, first piece's start to last piece's end, and its spans."""
    result = simulate(s)
    start, end = result.log.whole_ops[(0, Phase.F, 0, 0)]
    return end - start, [x for x in result.log.spans if x.rank == 0 and start <= x.start_s < end]


def layer_forward_s(**kw) -> tuple[float, dict]:
    """One layer's forward (2 layers less 1) and the durations of its sublayers' tp collectives:
    all-gathers and reduce-scatters of the (s, b, h) activation, or of 3/4 of it and the 1/4 tail."""
    (two, spans), (one, _) = forward_s(scenario(2, **kw)), forward_s(scenario(1, **kw))
    activation = 2048 * 8192 * 2.0  # bf16 (s, b, h), b = 1
    kinds = {("ALL_GATHER", activation): "AG", ("REDUCE_SCATTER", activation): "RS"}
    kinds |= {("REDUCE_SCATTER", activation * 3 / 4): "RS 3/4", ("REDUCE_SCATTER", activation / 4): "RS 1/4"}
    durations: dict[str, list[float]] = {}
    for x in spans:
        if (kind := kinds.get((str(x.phase), x.nbytes))) is not None and x.stream == "tp":
            durations.setdefault(kind, []).append(x.end_s - x.start_s)
    for d in durations.values():  # one size, one duration (to rounding): nothing else on the links
        assert max(d) - min(d) < 1e-15
    return two - one, {kind: max(d) for kind, d in durations.items()}


def sublayers(s) -> dict[str, dict[str, float]]:
    """Each forward sublayer's kernel seconds: before, at and between its overlapped GEMMs."""
    layer = LayerKernels(CHIPS[s.cluster.gpu], s.gpu_spec, shapes_of(s))
    out = {}
    for name in ("attn", "mlp"):
        kernels = layer.item(name).forward
        names = [k.name for k in kernels]
        e, x = (names.index(n) for n in ENTRY_EXIT[f"F.{name}"])
        seconds = [k.time_s for k in kernels]
        out[name] = {
            "pre": sum(seconds[:e]),
            "entry": seconds[e],
            "mid": sum(seconds[e + 1 : x]),
            "exit": seconds[x],
            "post": sum(seconds[x + 1 :]),
        }
    return out


def closed_form(k: dict[str, float], ag: float, rs: float, tail: float, t: int) -> float:
    first = k["exit"] / 4
    return (
        k["pre"]
        + max(k["entry"] * (t - 1) / t, ag)
        + k["entry"] / t
        + k["mid"]
        + first
        + max(k["exit"] - first, rs)
        + tail
        + k["post"]
    )


@pytest.mark.parametrize("bandwidth, covered", [("450GB/s", True), ("2GB/s", False)])
def test_a_layers_forward_is_its_kernels_plus_what_the_gemms_leave_exposed(bandwidth, covered):
    s = scenario(bandwidth=bandwidth)
    layer_s, d = layer_forward_s(bandwidth=bandwidth)
    ag, rs, tail = d["AG"], d["RS 3/4"], d["RS 1/4"]
    kernels = sublayers(s)
    for k in kernels.values():  # the regime this case is for: every collective shorter than its GEMM, or longer
        assert (ag < k["entry"] * (TP - 1) / TP) == covered and (rs < k["exit"] * 3 / 4) == covered
    expected = sum(closed_form(k, ag, rs, tail, TP) for k in kernels.values())
    assert layer_s == pytest.approx(expected, rel=1e-9)
    all_kernels = sum(sum(k.values()) for k in kernels.values())
    if covered:  # only the last chunk of each reduce-scatter shows
        assert layer_s == pytest.approx(all_kernels + 2 * tail, rel=1e-9)
    else:  # and what the GEMMs leave of the exchanges
        exposed = sum(ag - k["entry"] * (TP - 1) / TP + rs - k["exit"] * 3 / 4 for k in kernels.values())
        assert layer_s == pytest.approx(all_kernels + exposed + 2 * tail, rel=1e-9)


def test_off_the_collectives_block_as_before():
    """Megatron's blocking collectives: kernels plus an all-gather and a reduce-scatter per sublayer."""
    s = scenario(overlap=False)
    layer_s, d = layer_forward_s(overlap=False)
    kernels_s = sum(sum(k.values()) for k in sublayers(s).values())
    assert "RS 1/4" not in d
    assert layer_s == pytest.approx(kernels_s + 2 * (d["AG"] + d["RS"]), rel=1e-9)


def test_a_pipelined_gemm_runs_on_the_sms_its_reduce_scatter_leaves():
    """Transformer Engine's set_sm_margin: the GEMM on (units - num_sm) SMs, its waves more."""
    sms = "proj_fprop: 32, fc2_fprop: 66"
    layer_s, d = layer_forward_s(sms=sms)
    s = scenario(sms=sms)
    kernels = sublayers(s)
    chip = CHIPS[s.cluster.gpu]
    for name, taken in (("attn", 32), ("mlp", 66)):
        narrow = LayerKernels(
            dataclasses.replace(chip, gemm_units=chip.compute_units - taken), s.gpu_spec, shapes_of(s)
        )
        slow = next(k for k in narrow.item(name).forward if k.name == ENTRY_EXIT[f"F.{name}"][1]).time_s
        assert slow > kernels[name]["exit"]
        kernels[name]["exit"] = slow
    expected = sum(closed_form(k, d["AG"], d["RS 3/4"], d["RS 1/4"], TP) for k in kernels.values())
    assert layer_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "schedule, recompute, pp, dp, zero",
    [
        ("1f1b", "none", 2, 2, 1),
        ("zb-h1", "none", 2, 1, 0),
        ("1f1b", "full", 1, 2, 0),
        ("1f1b", "selective", 2, 1, 0),
        ("1f1b", "full", 1, 2, 3),  # ZeRO 3: a unit starts inside a piece
    ],
)
def test_the_shadow_model_still_matches_one_device(schedule, recompute, pp, dp, zero):
    s = scenario(
        2, tp=2, pp=pp, dp=dp, schedule=schedule, recompute=recompute, numerics="true", batch=4 * dp, zero=zero
    )
    assert simulate(s).summary["numerics_max_rel_err"] < 1e-10


@pytest.mark.parametrize(
    "kw, field, message",
    [
        ({"tp": 1, "sp": False}, "tp_comm_overlap", "needs parallel.tp > 1"),
        ({"sp": False}, "tp_comm_overlap", "needs parallel.sequence_parallel"),
        ({"model": "roofline"}, "tp_comm_overlap", "needs cluster.compute_model: kernel"),
        ({"overlap": False, "sms": "proj_fprop: 16"}, "tp_comm_overlap_sms", "needs parallel.megatron.tp_comm"),
        ({"sms": "fc2_fprop: 132"}, "tp_comm_overlap_sms.fc2_fprop", "leaves none of the chip's 132 SMs"),
    ],
)
def test_rejects_impossible_use(kw, field, message):
    with pytest.raises(ScenarioError, match=f"parallel.megatron.{field}.*{message}"):
        scenario(**kw)
