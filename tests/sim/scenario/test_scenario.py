"""sim.scenario: the one strict validation point. Every bad input is a one-line ScenarioError
naming the file, the YAML field path and what is wrong (both values for cross-field checks)."""

import copy
import json
import math
import re
from pathlib import Path

import pydantic
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.json_schema import scenario_json_schema
from clustersim.sim.scenario.loader import load_scenario, load_scenario_text, load_scenarios, load_variants_text
from clustersim.sim.scenario.presets import MODELS, MoESpec
from clustersim.sim.scenario.schema import Scenario, ScenarioError
from clustersim.topologies.registry import TOPOLOGIES

from repo import QUICKSTART, SCENARIOS

# A small valid scenario; each bad case below changes one thing.
BASE = {
    "name": "base",
    "cluster": {
        "gpu": "A100-SXM-80GB",
        "nodes": 1,
        "gpus_per_node": 4,
        "topology": {"kind": "switch", "link_bandwidth": "300GB/s", "link_latency": "1us"},
    },
    "model": {"preset": "tiny-8l"},
    "training": {"global_batch": 16, "micro_batch": 2},
    "parallel": {"pp": 4, "tp": 1, "dp": 1},
    "schedule": "1f1b",
}
DELETE = object()


NO_NUMERICS = ("numerics.enabled", False)  # these presets' shapes are checked, not their shadow runs


def variant(*changes) -> str:
    """BASE as YAML text with (dotted path, value) changes applied; value DELETE removes the key."""
    data = copy.deepcopy(BASE)
    for path, value in changes:
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return yaml.safe_dump(data, sort_keys=False)


def assert_rejected(text: str, path: str, reason: str, filename: str = "bad.yaml") -> ScenarioError:
    """The error is one line, `{file}: {path}: {reason}`, with exactly this path."""
    with pytest.raises(ScenarioError, match="^" + re.escape(f"{filename}: {path}: ") + reason) as info:
        load_scenario_text(text, filename)
    err = info.value
    assert "\n" not in str(err)
    assert (err.file, err.path) == (filename, path)
    return err


# --- good input -------------------------------------------------------------------------------


def test_quickstart_loads_with_derived_values(quickstart):
    s = quickstart
    assert s.name == "quickstart"
    assert s.num_gpus == 4
    assert s.num_microbatches == 8  # 32 / (4 x dp 1)
    assert (s.parallel.pp, s.parallel.tp, s.parallel.dp) == (4, 1, 1)
    assert s.schedule == "1f1b"
    assert s.model_spec == MODELS["gpt3-1.3b"]
    assert s.model.preset == "gpt3-1.3b" and s.model.layers == 24
    assert s.gpu_spec == GPUS["A100-SXM-80GB"]
    assert s.cluster.topology.link_bandwidth_Bps == 300e9
    assert s.cluster.topology.link_latency_s == 1e-6
    assert s.dtype_bytes == 2
    assert s.numerics.enabled and s.numerics.hidden % s.numerics.heads == 0
    assert s.output_dir == Path("runs/quickstart")


def test_every_bundled_scenario_loads_and_opens_with_a_question():
    for path in sorted(SCENARIOS.glob("**/*.yaml")):
        assert path.read_text().startswith("#"), f"{path.name} must open with a comment"
        assert load_scenarios(path)


def test_defaults_fill_optional_sections():
    s = load_scenario_text(variant(("parallel", DELETE), ("schedule", DELETE), ("cluster.gpus_per_node", 1)), "d.yaml")
    assert (s.parallel.pp, s.parallel.tp, s.parallel.dp) == (1, 1, 1)
    assert s.schedule == "1f1b"
    assert s.training.dtype == "bf16"
    assert s.numerics.optimizer == "adam" and s.numerics.lr == 1e-3
    assert s.output.dir is None


@pytest.mark.parametrize("preset", sorted(MODELS))
def test_every_preset_is_a_valid_model(preset):
    s = load_scenario_text(
        variant(NO_NUMERICS, ("model", {"preset": preset}), ("parallel", {}), ("cluster.gpus_per_node", 1))
    )
    assert s.model_spec == MODELS[preset]


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_every_gpu_is_selectable_and_sane(gpu):
    spec = load_scenario_text(variant(("cluster.gpu", gpu))).gpu_spec
    assert spec == GPUS[gpu] and spec.name == gpu
    assert spec.peak_flops > 1e14 and spec.memory_bytes > 1e10 and spec.hbm_bandwidth_Bps > 1e12
    assert 0 < spec.efficiency <= 1


def test_explicit_fields_override_the_preset():
    s = load_scenario_text(variant(("model.layers", 12), ("model.gated_mlp", True)))
    assert s.model_spec.layers == 12 and s.model_spec.gated_mlp
    assert s.model_spec.hidden == MODELS["tiny-8l"].hidden


def test_without_preset_ffn_defaults_to_4h():
    model = {"layers": 8, "hidden": 512, "heads": 8, "seq_len": 128, "vocab": 1000}
    s = load_scenario_text(variant(("model", model)))
    assert s.model_spec.ffn == 2048 and s.model.preset is None and not s.model_spec.gated_mlp


def test_moe_preset_keys_are_overridden_one_by_one():
    s = load_scenario_text(
        variant(
            NO_NUMERICS,
            ("model", {"preset": "mixtral-8x7b", "moe": {"top_k": 1, "capacity_factor": 1.25}}),
            ("parallel", {}),
            ("cluster.gpus_per_node", 1),
        )
    )
    assert s.model_spec.moe == MoESpec(num_experts=8, top_k=1, expert_ffn=14336, capacity_factor=1.25)
    assert s.model_spec.hidden == 4096 and s.parallel.ep == 1


def test_moe_null_makes_a_moe_preset_dense():
    s = load_scenario_text(
        variant(
            NO_NUMERICS,  # the preset's 4 query heads per key-value head would need numerics.heads a multiple of 4
            ("model", {"preset": "mixtral-8x7b", "moe": None}),
            ("parallel", {}),
            ("cluster.gpus_per_node", 1),
        )
    )
    assert s.model_spec.moe is None and s.model_spec.ffn == 14336


def test_moe_on_a_dense_preset_takes_expert_ffn_from_ffn_and_defaults():
    s = load_scenario_text(variant(NO_NUMERICS, ("model.moe", {"experts": 8, "top_k": 2})))
    assert s.model_spec.moe == MoESpec(
        num_experts=8, top_k=2, expert_ffn=4096, capacity_factor=None, every=1, first_dense=0, shared_experts=0
    )
    assert s.model_spec.ffn == 4096 and s.model.moe.num_experts == 8
    assert MODELS["tiny-8l"].moe is None  # the preset itself is untouched


def test_moe_without_preset_and_its_yaml_keys_in_the_resolved_scenario():
    model = {
        "layers": 4,
        "hidden": 256,
        "heads": 4,
        "seq_len": 64,
        "vocab": 1000,
        "gated_mlp": True,
        "moe": {"experts": 16, "top_k": 4, "every": 2, "expert_ffn": 128, "shared_experts": 2, "capacity_factor": 1},
    }
    s = load_scenario_text(variant(NO_NUMERICS, ("model", model)))
    assert s.model_spec.ffn == 1024  # 4 x hidden: the dense layers 0 and 2
    assert s.model_spec.moe.capacity_factor == 1.0 and s.model_spec.moe.moe_layers(4) == (1, 3)
    resolved = json.loads(json.dumps(s.resolved()))
    assert resolved["model"]["moe"]["num_experts"] == 16 and resolved["parallel"]["ep"] == 1


def test_expert_parallel_is_carved_out_of_data_parallel():
    """ep divides dp and the experts; the world size stays pp x tp x dp."""
    s = load_scenario_text(
        variant(
            NO_NUMERICS,
            ("model.moe", {"experts": 8, "top_k": 2}),
            ("parallel.pp", 1),
            ("parallel.dp", 4),
            ("parallel.ep", 4),
        )
    )
    assert (s.parallel.dp, s.parallel.ep, s.parallel.world_size) == (4, 4, 4)
    s = load_scenario_text(
        variant(
            NO_NUMERICS,
            ("model.moe", {"experts": 8, "top_k": 2}),
            ("parallel.pp", 1),
            ("parallel.tp", 2),
            ("parallel.dp", 2),
            ("parallel.ep", 2),
        )
    )
    assert (s.parallel.tp, s.parallel.ep) == (2, 2)


def test_gpu_overrides_merge_into_gpu_spec():
    overrides = {"memory": "80GiB", "efficiency": 0.4, "hbm_bandwidth": "2TB/s", "peak_flops": "300TFLOPS"}
    spec = load_scenario_text(variant(("cluster.gpu_overrides", overrides))).gpu_spec
    assert spec.memory_bytes == 80 * 2**30
    assert spec.efficiency == 0.4
    assert spec.hbm_bandwidth_Bps == 2e12
    assert spec.peak_flops == 300e12
    assert spec.name == "A100-SXM-80GB"


def test_si_units_micro_sign_and_yaml12_floats():
    s = load_scenario_text(
        variant(("cluster.topology.link_bandwidth", "3e11B/s"), ("cluster.topology.link_latency", "2\u00b5s"))
        + "numerics: {lr: 1e-3}\n"
    )
    assert s.cluster.topology.link_bandwidth_Bps == 3e11
    assert s.cluster.topology.link_latency_s == 2e-6
    assert s.numerics.lr == 1e-3  # PyYAML alone reads '1e-3' as a string


def test_num_microbatches_divides_by_dp():
    s = load_scenario_text(
        variant(("parallel.pp", 2), ("parallel.dp", 2), ("training.global_batch", 32), ("training.micro_batch", 4))
    )
    assert s.num_microbatches == 4


def test_the_shadow_model_must_shard_like_the_real_one():
    """tp must divide the shadow model's heads and vocabulary (and, with sequence parallelism, its
    sequence), as it divides the real model's."""
    with pytest.raises(ScenarioError, match=r"^<string>: numerics\.heads: 2 is not divisible by parallel\.tp \(4\)"):
        load_scenario_text(variant(("parallel.pp", 1), ("parallel.tp", 4), ("numerics.heads", 2)))
    with pytest.raises(ScenarioError, match=r"^<string>: numerics\.vocab: 30 is not divisible by parallel\.tp \(4\)"):
        load_scenario_text(
            variant(("parallel.pp", 1), ("parallel.tp", 4), ("numerics.heads", 4), ("numerics.vocab", 30))
        )
    with pytest.raises(ScenarioError, match=r"^<string>: numerics\.seq_len: 6 is not divisible by parallel\.tp \(4\)"):
        load_scenario_text(
            variant(
                ("parallel.pp", 1),
                ("parallel.tp", 4),
                ("numerics.heads", 4),
                ("parallel.sequence_parallel", True),
                ("numerics.seq_len", 6),
            )
        )
    ok = load_scenario_text(variant(("parallel.pp", 2), ("parallel.tp", 2)))
    assert ok.parallel.tp == 2 and ok.numerics.enabled


def test_rejects_sequence_parallel_without_tp():
    with pytest.raises(ScenarioError, match=r"^<string>: parallel\.sequence_parallel: needs parallel\.tp > 1"):
        load_scenario_text(variant(("parallel.sequence_parallel", True)))


def test_scenario_is_frozen(quickstart):
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        quickstart.parallel.pp = 2  # type: ignore[misc]


def test_resolved_is_json_serialisable_and_stable():
    a, b = load_scenario(QUICKSTART).resolved(), load_scenario(QUICKSTART).resolved()
    text = json.dumps(a, sort_keys=True)
    assert text == json.dumps(b, sort_keys=True)
    assert json.loads(text) == a
    assert a["cluster"]["topology"]["link_bandwidth_Bps"] == 300e9
    assert a["cluster"]["gpu_spec"]["peak_flops"] == 312e12
    assert a["model"]["layers"] == 24  # preset expanded
    assert a["training"]["num_microbatches"] == 8
    assert a["output"]["dir"] == "runs/quickstart"
    assert list(a) == ["name", "cluster", "model", "training", "parallel", "schedule", "numerics", "output"]


def test_json_schema_is_json_and_covers_every_section():
    schema = json.loads(json.dumps(scenario_json_schema()))
    assert set(schema["properties"]) == {
        "name",
        "cluster",
        "model",
        "training",
        "parallel",
        "schedule",
        "numerics",
        "output",
        "variants",  # a file for `clustersim compare` (sim.scenario.loader.load_variants_text)
    }
    topology = schema["$defs"]["ClusterSection"]["properties"]["topology"]
    assert set(topology["discriminator"]["mapping"]) == set(TOPOLOGIES)  # one section per kind, chosen by kind
    switch = schema["$defs"]["SwitchTopology"]
    bandwidth = switch["properties"]["link_bandwidth"]["anyOf"][0]
    assert bandwidth["type"] == "string" and re.match(bandwidth["pattern"], "300GB/s")
    assert switch["additionalProperties"] is False
    assert "required" not in schema["$defs"]["ModelSection"]  # a preset may supply them all
    moe = schema["$defs"]["MoESection"]
    assert set(moe["properties"]) == {
        "experts",
        "top_k",
        "capacity_factor",
        "every",
        "first_dense",
        "expert_ffn",
        "shared_experts",
        "expert_groups",
        "limited_groups",
    }
    assert moe["additionalProperties"] is False
    assert "ep" in schema["$defs"]["ParallelSection"]["properties"]


# --- bad input: one parametrised table, one rule per row -------------------------------------

BAD = [
    # (id, YAML text, field path, reason regex)
    (
        "unknown_top_level_key",
        variant(("foo", 1)),
        "foo",
        r"unknown key 'foo' \(allowed: name, cluster, model, training, parallel, schedule, numerics, output\)$",
    ),
    (
        "unknown_nested_key",
        variant(("cluster.topology.link_bandwith", "1GB/s")),
        "cluster.topology.link_bandwith",
        r"unknown key 'link_bandwith' \(allowed: kind, link_bandwidth, link_latency\); "
        r"did you mean 'link_bandwidth'\?$",
    ),
    (
        "unknown_override_key",
        variant(("cluster.gpu_overrides.tflops", 1)),
        "cluster.gpu_overrides.tflops",
        r"unknown key 'tflops' \(allowed: peak_flops, memory, hbm_bandwidth, efficiency\); "
        r"did you mean 'peak_flops'\?$",
    ),
    (
        "typo_is_reported_before_the_missing_key",
        variant(("cluster", DELETE), ("clustr", BASE["cluster"])),
        "clustr",
        r"unknown key 'clustr' \(allowed: .*\); did you mean 'cluster'\?$",
    ),
    ("wrong_type_word", variant(("parallel.pp", "four")), "parallel.pp", r"expected an integer, got 'four'$"),
    ("no_coercion_of_digit_strings", variant(("parallel.pp", "4")), "parallel.pp", r"expected an integer, got '4'$"),
    (
        "float_is_not_int",
        variant(("training.micro_batch", 2.0)),
        "training.micro_batch",
        r"expected an integer, got 2\.0$",
    ),
    ("bool_is_not_int", variant(("parallel.pp", True)), "parallel.pp", r"expected an integer, got true$"),
    ("section_not_a_mapping", variant(("cluster", "big")), "cluster", r"expected a mapping, got 'big'$"),
    ("name_wrong_type", variant(("name", 5)), "name", r"expected a string, got 5$"),
    ("name_not_a_folder_name", variant(("name", "my run")), "name", r"'my run' is not a valid name"),
    ("negative_size", variant(("model.layers", -8)), "model.layers", r"must be > 0, got -8$"),
    ("zero_size", variant(("cluster.gpus_per_node", 0)), "cluster.gpus_per_node", r"must be > 0, got 0$"),
    (
        "negative_bandwidth",
        variant(("cluster.topology.link_bandwidth", "-300GB/s")),
        "cluster.topology.link_bandwidth",
        r"must be > 0, got '-300GB/s'$",
    ),
    (
        "zero_bandwidth",
        variant(("cluster.topology.link_bandwidth", "0GB/s")),
        "cluster.topology.link_bandwidth",
        r"must be > 0, got '0GB/s'$",
    ),
    (
        "negative_latency",
        variant(("cluster.topology.link_latency", "-1us")),
        "cluster.topology.link_latency",
        r"must be >= 0, got '-1us'$",
    ),
    (
        "not_a_bandwidth",
        variant(("cluster.topology.link_bandwidth", "3 parsecs")),
        "cluster.topology.link_bandwidth",
        r"'3 parsecs' is not a bandwidth; expected e\.g\. '300GB/s'$",
    ),
    (
        "efficiency_above_one",
        variant(("cluster.gpu_overrides", {"efficiency": 1.5})),
        "cluster.gpu_overrides.efficiency",
        r"must be <= 1, got 1\.5$",
    ),
    (
        "layers_not_divisible_by_pp",
        variant(("parallel.pp", 3), ("cluster.gpus_per_node", 3)),
        "parallel.pp",
        r"3 does not divide model\.layers \(8\)$",
    ),
    (
        "heads_not_divisible_by_tp",
        variant(("parallel.pp", 1), ("parallel.tp", 3), ("cluster.gpus_per_node", 3)),
        "parallel.tp",
        r"3 does not divide model\.heads \(16\)$",
    ),
    (
        "ffn_not_divisible_by_tp",
        variant(("parallel.pp", 1), ("parallel.tp", 4), ("model.ffn", 4098)),
        "parallel.tp",
        r"4 does not divide model\.ffn \(4098\)$",
    ),
    (
        "gpu_count_mismatch",
        variant(("parallel.dp", 2)),
        "parallel",
        re.escape("pp(4) x tp(1) x dp(2) = 8 != 4 GPUs (cluster.nodes 1 x cluster.gpus_per_node 4)") + "$",
    ),
    (
        "fewer_than_one_microbatch",
        variant(("training.global_batch", 1)),
        "training.global_batch",
        re.escape("1 < training.micro_batch (2) x parallel.dp (1) = 2") + ": less than one microbatch",
    ),
    (
        "global_batch_not_divisible",
        variant(("parallel.pp", 2), ("parallel.dp", 2), ("training.global_batch", 12), ("training.micro_batch", 4)),
        "training.global_batch",
        re.escape("12 is not divisible by training.micro_batch (4) x parallel.dp (2) = 8") + "$",
    ),
    (
        "unknown_gpu",
        variant(("cluster.gpu", "V100")),
        "cluster.gpu",
        r"unknown gpu 'V100' \(valid: A100-SXM-80GB, A100-SXM-40GB, H100-SXM, H200, H800-SXM, TPU-v4, TPU-v5p\)$",
    ),
    (
        "unknown_preset",
        variant(("model.preset", "gpt5")),
        "model.preset",
        r"unknown preset 'gpt5' \(valid: gpt3-1\.3b, gpt3-175b, llama2-7b, llama2-13b, tiny-8l, mixtral-8x7b, "
        r"deepseek-v3-like, qwen3-30b-a3b\)$",
    ),
    (
        "unknown_schedule",
        variant(("schedule", "zb-v")),
        "schedule",
        r"unknown schedule 'zb-v' \(valid: gpipe, 1f1b, interleaved, zb-h1, interleaved-zb, zbv, dualpipev, "
        r"looped-bfs\)$",
    ),
    (
        "v_schedule_needs_two_chunks",
        variant(("schedule", "zbv")),
        "parallel.virtual",
        r"schedule 'zbv' runs two chunks per rank in a V: virtual must be 2, got 1$",
    ),
    (
        "unknown_topology_kind",
        variant(("cluster.topology.kind", "hypercube")),
        "cluster.topology.kind",
        rf"unknown topology kind 'hypercube' \(valid: {', '.join(TOPOLOGIES)}\)$",
    ),
    (
        "unknown_dtype",
        variant(("training.dtype", "fp8")),
        "training.dtype",
        r"unknown dtype 'fp8' \(valid: bf16, fp16, fp32\)$",
    ),
    (
        "missing_required_field",
        variant(("training.global_batch", DELETE)),
        "training.global_batch",
        r"required field missing$",
    ),
    ("missing_section", variant(("cluster", DELETE)), "cluster", r"required field missing$"),
    (
        "missing_model_field_without_preset",
        variant(("model", {"layers": 8, "hidden": 1024, "heads": 16, "seq_len": 128})),
        "model.vocab",
        r"required field missing \(or set model\.preset: gpt3-1\.3b",
    ),
    (
        "model_heads_not_dividing_hidden",
        variant(("model.heads", 7)),
        "model.heads",
        r"7 does not divide model\.hidden \(1024\): give model\.head_dim to decouple them$",
    ),
    (
        "numerics_heads_not_dividing_hidden",
        variant(("numerics", {"hidden": 16, "heads": 3})),
        "numerics.heads",
        r"3 does not divide numerics\.hidden \(16\)$",
    ),
    (
        "numerics_unknown_optimizer",
        variant(("numerics", {"optimizer": "lion"})),
        "numerics.optimizer",
        r"unknown optimizer 'lion' \(valid: adam, sgd\)$",
    ),
    # Mixture-of-Experts: model.moe and parallel.ep
    (
        "moe_top_k_above_experts",
        variant(("model.moe", {"experts": 4, "top_k": 5})),
        "model.moe.top_k",
        r"5 > model\.moe\.experts \(4\): a token cannot go to more experts than there are$",
    ),
    (
        "moe_top_k_override_above_the_presets_experts",
        variant(
            ("model", {"preset": "mixtral-8x7b", "moe": {"top_k": 9}}), ("parallel", {}), ("cluster.gpus_per_node", 1)
        ),
        "model.moe.top_k",
        r"9 > model\.moe\.experts \(8\)",
    ),
    (
        "moe_expert_groups_not_dividing_experts",
        variant(("model.moe", {"experts": 8, "top_k": 2, "expert_groups": 3})),
        "model.moe.expert_groups",
        r"3 does not divide model\.moe\.experts \(8\)$",
    ),
    (
        "moe_limited_groups_above_groups",
        variant(("model.moe", {"experts": 8, "top_k": 2, "expert_groups": 4, "limited_groups": 5})),
        "model.moe.limited_groups",
        r"5 > model\.moe\.expert_groups \(4\)$",
    ),
    (
        "moe_limited_groups_too_few_for_top_k",
        variant(("model.moe", {"experts": 8, "top_k": 3, "expert_groups": 4, "limited_groups": 1})),
        "model.moe.limited_groups",
        r"1 blocks of 2 experts hold 2, fewer than model\.moe\.top_k \(3\)$",
    ),
    (
        "moe_zero_capacity_factor",
        variant(("model.moe", {"experts": 4, "top_k": 2, "capacity_factor": 0})),
        "model.moe.capacity_factor",
        r"must be > 0, got 0$",
    ),
    (
        "moe_negative_capacity_factor",
        variant(("model.moe", {"experts": 4, "top_k": 2, "capacity_factor": -1.25})),
        "model.moe.capacity_factor",
        r"must be > 0, got -1\.25$",
    ),
    (
        "moe_infinite_capacity_factor",
        variant(("model.moe", {"experts": 4, "top_k": 2, "capacity_factor": math.inf})),
        "model.moe.capacity_factor",
        r"must be a finite number, got inf$",
    ),
    ("moe_without_experts", variant(("model.moe", {"top_k": 2})), "model.moe.experts", r"required field missing$"),
    (
        "moe_unknown_key",
        variant(("model.moe", {"experts": 4, "top_k": 2, "topk": 1})),
        "model.moe.topk",
        r"unknown key 'topk'",
    ),
    (
        "moe_zero_every",
        variant(("model.moe", {"experts": 4, "top_k": 2, "every": 0})),
        "model.moe.every",
        r"must be > 0, got 0$",
    ),
    (
        "moe_no_moe_layer_left",
        variant(("model.moe", {"experts": 4, "top_k": 2, "first_dense": 8})),
        "model.moe.first_dense",
        re.escape(
            "no MoE layer among model.layers (8): layer i is MoE when i >= "
            "model.moe.first_dense (8) and i % model.moe.every (1) == 0"
        )
        + "$",
    ),
    (
        "moe_every_beyond_the_layers",
        variant(("model.moe", {"experts": 4, "top_k": 2, "every": 9})),
        "model.moe.every",
        r"no MoE layer among model\.layers \(8\)",
    ),
    (
        "ep_on_a_dense_model",
        variant(("parallel.pp", 2), ("parallel.dp", 2), ("parallel.ep", 2)),
        "parallel.ep",
        r"2 needs an MoE model \(set model\.moe\); this model is dense$",
    ),
    (
        "ep_not_dividing_experts",
        variant(("model.moe", {"experts": 6, "top_k": 2}), ("parallel.pp", 1), ("parallel.dp", 4), ("parallel.ep", 4)),
        "parallel.ep",
        r"4 does not divide model\.moe\.experts \(6\)$",
    ),
    (
        "ep_not_dividing_dp",
        variant(("model.moe", {"experts": 8, "top_k": 2}), ("parallel.ep", 2)),
        "parallel.ep",
        r"2 does not divide parallel\.dp \(1\): expert-parallel groups are carved out of the data-parallel group$",
    ),
    (
        "ep_spanning_tp_is_not_modelled",
        variant(("model.moe", {"experts": 8, "top_k": 2}), ("parallel.pp", 2), ("parallel.tp", 2), ("parallel.ep", 2)),
        "parallel.ep",
        r"2 does not divide parallel\.dp \(1\)",
    ),
    ("ep_zero", variant(("parallel.ep", 0)), "parallel.ep", r"must be > 0, got 0$"),
    # tensor parallelism splits an MoE layer's tokens (whole experts on every rank), not expert_ffn
    (
        "tp_not_dividing_moe_tokens",
        variant(
            (
                "model",
                {
                    "layers": 8,
                    "hidden": 512,
                    "heads": 8,
                    "seq_len": 126,
                    "vocab": 1000,
                    "moe": {"experts": 4, "top_k": 2},
                },
            ),
            ("training.micro_batch", 1),
            ("parallel.pp", 1),
            ("parallel.tp", 4),
        ),
        "parallel.tp",
        re.escape(
            "4 does not divide training.micro_batch (1) x model.seq_len (126) = 126 tokens: each "
            "tensor-parallel rank routes 1/tp of a microbatch's tokens to the experts"
        )
        + "$",
    ),
]


@pytest.mark.parametrize("text, path, reason", [row[1:] for row in BAD], ids=[row[0] for row in BAD])
def test_rejects_bad_input(text, path, reason):
    assert_rejected(text, path, reason)


def test_rejects_yaml_syntax_error_with_line_number():
    text = "name: x\ncluster:\n  gpu: [A100\n  nodes: 1\n"
    err = assert_rejected(text, "-", r"invalid YAML at line \d+, column \d+: ")
    assert "line 4" in err.reason or "line 3" in err.reason


def test_rejects_duplicate_keys():
    text = variant() + "name: again\n"
    assert_rejected(text, "-", r"invalid YAML at line \d+, column 1: duplicate key 'name'$")


@pytest.mark.parametrize("text, got", [("- a\n- b\n", "a list"), ("", "an empty file"), ("42\n", "42")])
def test_rejects_top_level_not_a_mapping(text, got):
    assert_rejected(text, "-", r"top level must be a mapping with keys name, cluster, .*; got " + got + "$")


def test_rejects_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ScenarioError, match="^" + re.escape(f"{missing}: -: no such file") + "$"):
        load_scenario(missing)


def test_rejects_a_directory(tmp_path):
    with pytest.raises(ScenarioError, match=re.escape(f"{tmp_path}: -: cannot read")):
        load_scenario(tmp_path)


def test_error_carries_file_path_and_reason():
    err = assert_rejected(
        variant(("parallel.pp", 3), ("cluster.gpus_per_node", 3)),
        "parallel.pp",
        r"3 does",
        filename="scenarios/bad.yaml",
    )
    assert str(err) == "scenarios/bad.yaml: parallel.pp: 3 does not divide model.layers (8)"
    assert err.reason == "3 does not divide model.layers (8)"


def test_scenario_model_validate_applies_the_same_rules():
    """The Python API (no YAML) gets the same checks; only the message wrapping differs."""
    with pytest.raises(ValueError):
        Scenario.model_validate(yaml.safe_load(variant(("parallel.dp", 2))))


# --- robustness: bad input is a ScenarioError, never a traceback --------------------------------

YAML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
FIELD_PATHS = st.sampled_from(
    [
        "name",
        "cluster",
        "cluster.gpu",
        "cluster.nodes",
        "cluster.topology.link_bandwidth",
        "cluster.topology.link_latency",
        "cluster.gpu_overrides",
        "cluster.gpu_overrides.memory",
        "model",
        "model.preset",
        "model.layers",
        "model.hidden",
        "training.global_batch",
        "training.dtype",
        "parallel.pp",
        "parallel.tp",
        "schedule",
        "numerics",
        "numerics.lr",
        "output.dir",
        "extra",
        "model.moe",
        "model.moe.experts",
        "model.moe.top_k",
        "model.moe.capacity_factor",
        "model.moe.every",
        "parallel.ep",
    ]
)


@settings(max_examples=200, deadline=None)
@given(FIELD_PATHS, YAML_VALUES)
def test_any_value_anywhere_is_a_scenario_or_a_one_line_error(path, value):
    try:
        load_scenario_text(variant((path, value)), "fuzz.yaml")
    except ScenarioError as err:
        assert "\n" not in str(err) and str(err).startswith("fuzz.yaml: ")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_any_text_is_a_scenario_or_a_one_line_error(text):
    with pytest.raises(ScenarioError) as info:
        load_scenario_text(text, "fuzz.yaml")
    assert "\n" not in str(info.value)


def test_variants_override_dotted_paths_and_are_named_after_the_file():
    ring_topology = {"kind": "ring", "link_bandwidth": "100GB/s", "link_latency": "1us"}
    text = variant(
        (
            "variants",
            [
                {"name": "ring", "cluster.topology": ring_topology},
                {"name": "fast", "cluster.topology.link_bandwidth": "900GB/s"},
            ],
        )
    )
    ring, fast = load_variants_text(text)
    assert (ring.name, fast.name) == ("base-ring", "base-fast")
    assert ring.cluster.topology.kind == "ring" and ring.cluster.topology.link_bandwidth_Bps == 100e9
    assert fast.cluster.topology.link_bandwidth_Bps == 900e9
    assert fast.cluster.topology.kind == load_scenario_text(variant()).cluster.topology.kind


def test_a_bad_variant_names_the_variant_and_the_field():
    text = variant(("variants", [{"name": "bad", "parallel.pp": 0}]))
    with pytest.raises(ScenarioError, match=r"^<string> \(variants\[0\]: bad\): parallel\.pp: must be > 0"):
        load_variants_text(text)
    with pytest.raises(ScenarioError, match=r"^<string>: variants: .*clustersim compare"):
        load_scenario_text(text)
