"""The loader's guards (issue 16): every input that used to crash, hang or exhaust memory is now a
one-line ScenarioError naming the field path and the limit. One test per crash class, each feeding
the exact bad input."""

import re
import time

import pytest

from clustersim.sim.cli import main
from clustersim.sim.scenario.loader import load_scenario, load_scenario_text, load_variants_text
from clustersim.sim.scenario.schema import ScenarioError
from clustersim.sim.scenario.spec import SpecError, parse_spec
from clustersim.sim.scenario.strict_yaml import MAX_DEPTH

from repo import QUICKSTART

GOOD = QUICKSTART.read_text()  # quickstart.yaml: block style, one key per line


def swap(old: str, new: str) -> str:
    """quickstart.yaml with one line's text replaced (the line must be there)."""
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


def rejected(text: str, path: str, reason: str) -> ScenarioError:
    """Loading `text` fails with exactly `bad.yaml: {path}: {reason...}` on one short line."""
    with pytest.raises(ScenarioError, match="^" + re.escape(f"bad.yaml: {path}: ") + reason) as info:
        load_scenario_text(text, "bad.yaml")
    assert "\n" not in str(info.value) and len(str(info.value)) < 700
    return info.value


# --- RecursionError on deeply nested YAML -----------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "name: " + "[" * 100_000 + "]" * 100_000 + "\n",  # flow lists
        "name: " + "{a: " * 5_000 + "1" + "}" * 5_000 + "\n",  # flow mappings
        "".join(" " * i + "a:\n" for i in range(200)) + " " * 200 + "b: 1\n",  # block mappings
    ],
    ids=["lists", "mappings", "block"],
)
def test_rejects_nesting_deeper_than_the_limit(text):
    rejected(text, "-", rf"invalid YAML at line \d+, column \d+: nested more than {MAX_DEPTH} levels deep$")


def test_nesting_within_the_limit_is_an_ordinary_error():
    text = swap("name: quickstart", "name: " + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2))
    rejected(text, "name", "expected a string, got a list$")


# --- alias bombs ("billion laughs") -----------------------------------------------------------

BOMB = "\n".join(
    ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
)


def test_rejects_a_billion_laughs_before_expanding_it():
    """10^9 strings from ten lines: refused from the node graph, within a second, never built."""
    text = BOMB + "\n" + swap("  link_bandwidth: 300GB/s", "  link_bandwidth: *a9")
    start = time.perf_counter()
    rejected(text, "-", r"invalid YAML at line \d+, column \d+: more than 100,000 values once aliases are expanded")
    assert time.perf_counter() - start < 2


def test_an_aliased_list_in_a_unit_field_is_named_not_printed():
    """The crash of issue 16: the unit parser's error printed the expanded value (3.2 GB). A bomb
    under the size limit (10^4 values) is now 'a list', the message short."""
    small = ", ".join(line.split(": ", 1)[1] for line in BOMB.splitlines()[:4])  # &a0 [...] .. &a3: 10^4 strings
    text = swap("  link_bandwidth: 300GB/s", f"  link_bandwidth: [{small}]")
    rejected(text, "cluster.topology.link_bandwidth", r"a list is not a bandwidth; expected e\.g\. '300GB/s'$")


def test_rejects_an_alias_inside_itself():
    rejected(swap("name: quickstart", "name: &loop [*loop]"), "-", r".*an alias refers to a value that contains it$")


def test_rejects_a_file_of_more_than_a_mebibyte(tmp_path):
    huge = tmp_path / "huge.yaml"
    huge.write_text(GOOD + "# " + "x" * 2**20 + "\n")
    with pytest.raises(ScenarioError, match=r"huge\.yaml: -: more than 1,048,576 characters"):
        load_scenario(huge)


def test_rejects_a_lone_surrogate():
    """Found by the fuzz test: "\\ud800" reads as a str pydantic cannot encode (UnicodeEncodeError)."""
    rejected(
        swap("name: quickstart", 'name: "q\\ud800"'), "name", r"'q\\ud800' holds a lone surrogate, which is not text$"
    )


# --- huge integers (OverflowError, MemoryError) -----------------------------------------------


@pytest.mark.parametrize(
    "old, new, path, reason",
    [
        (
            "  preset: gpt3-1.3b",
            "  preset: gpt3-1.3b\n  layers: 1000000000000000000000000000000",
            "model.layers",
            r"must be <= 100,000, got 1000000000000000000000000000000$",
        ),
        (
            "global_batch: 32",
            "global_batch: 9223372036854775808",
            "training.global_batch",
            r"must be <= 1,099,511,627,776, got 9223372036854775808$",
        ),
        ("  preset: gpt3-1.3b", "  preset: gpt3-1.3b\n  hidden: 4294967296", "model.hidden", "must be <= 1,048,576"),
        ("  preset: gpt3-1.3b", "  preset: gpt3-1.3b\n  vocab: 1e30", "model.vocab", "expected an integer, got 1e"),
        ("  dp: 1", "  dp: 1\n  virtual: 100000000", "parallel.virtual", "must be <= 1,024"),
        ("nodes: 1", "nodes: 100000000000000000000", "cluster.nodes", "must be <= 1,048,576"),
        (
            "numerics:",
            "numerics:\n  seed: 100000000000000000000",
            "numerics.seed",
            "must be <= 9,223,372,036,854,775,807",
        ),
        ("numerics:", "numerics:\n  hidden: 1048576", "numerics.hidden", "must be <= 4,096"),
    ],
    ids=["layers_1e30", "global_batch_2_63", "hidden", "vocab_float", "virtual", "nodes", "seed", "shadow"],
)
def test_rejects_huge_integers_with_the_bound(old, new, path, reason):
    rejected(swap(old, new), path, reason)


def test_rejects_an_integer_beyond_any_float_in_a_unit_field():
    """Found by the fuzz test: float(10**400) raised OverflowError inside the unit parser."""
    text = swap("link_latency: 1us", "link_latency: 1" + "0" * 400)
    rejected(text, "cluster.topology.link_latency", r"an integer of about 400 digits is not a time: it must be finite$")


def test_rejects_an_integer_too_long_to_read():
    """Python refuses int() of more than 4,300 digits (a ValueError inside PyYAML)."""
    text = swap("global_batch: 32", "global_batch: " + "9" * 5000)
    rejected(text, "-", r"invalid YAML: a value cannot be read: Exceeds the limit")


def test_a_huge_key_is_cut_short():
    err = rejected(GOOD + "9" * 1000 + ": 1\n", "9" * 77 + "...", r"keys must be strings, got '9{76}\.\.\.$")
    assert len(str(err)) < 200


def test_rejects_a_huge_topology_count():
    text = re.sub(r"(?m)^ *link_bandwidth: .*\n", "", GOOD.replace("kind: switch", "kind: fattree"))
    text = text.replace("  link_latency: 1us", "  link_latency: 1us\n    leaf_radix: 1000000000000000000000000000000")
    rejected(text, "cluster.topology.leaf_radix", r"must be <= 1,048,576, got 1000000000000000000000000000000$")


# --- infinite and absurd floats (Infinity in summary.json, hangs) -----------------------------


@pytest.mark.parametrize(
    "old, new, path, reason",
    [
        ("numerics:", "numerics:\n  lr: .inf", "numerics.lr", "must be a finite number, got inf$"),
        ("numerics:", "numerics:\n  lr: .nan", "numerics.lr", "must be a finite number, got nan$"),
        ("numerics:", "numerics:\n  lr: 1e300", "numerics.lr", "must be <= 100, got 1e"),
        ("numerics:", "numerics:\n  hot_expert_bias: 1e300", "numerics.hot_expert_bias", r"must be <= 1e\+06"),
        (
            "link_bandwidth: 300GB/s",
            "link_bandwidth: 1e300GB/s",
            "cluster.topology.link_bandwidth",
            r"must be <= 1PB/s, got '1e300GB/s'$",
        ),
        (
            "link_bandwidth: 300GB/s",
            "link_bandwidth: 1e400GB/s",
            "cluster.topology.link_bandwidth",
            r"must be <= 1PB/s, got '1e400GB/s'$",  # inf, once scaled
        ),
        (
            "link_bandwidth: 300GB/s",
            "link_bandwidth: 1e-300GB/s",
            "cluster.topology.link_bandwidth",
            r"must be >= 1B/s, got '1e-300GB/s'$",
        ),
        (
            "link_latency: 1us",
            "link_latency: 1e300s",
            "cluster.topology.link_latency",
            r"must be <= 10s, got '1e300s'$",
        ),
        (
            "  gpu: A100-SXM-80GB",
            "  gpu: A100-SXM-80GB\n  gpu_overrides: {peak_flops: 1e300TFLOPS}",
            "cluster.gpu_overrides.peak_flops",
            r"must be <= 1EFLOPS, got '1e300TFLOPS'$",
        ),
        (
            "  gpu: A100-SXM-80GB",
            "  gpu: A100-SXM-80GB\n  gpu_overrides: {peak_flops: .inf}",
            "cluster.gpu_overrides.peak_flops",
            r"inf is not a compute rate: it must be finite$",
        ),
        (
            "  gpu: A100-SXM-80GB",
            "  gpu: A100-SXM-80GB\n  gpu_overrides: {hbm_bandwidth: 1e30TB/s}",
            "cluster.gpu_overrides.hbm_bandwidth",
            r"must be <= 1PB/s",
        ),
        (
            "  gpu: A100-SXM-80GB",
            "  gpu: A100-SXM-80GB\n  gpu_overrides: {efficiency: .nan}",
            "cluster.gpu_overrides.efficiency",
            r"must be a finite number, got nan$",
        ),
        (
            "  gpu: A100-SXM-80GB",
            "  gpu: A100-SXM-80GB\n  gpu_overrides: {memory: 1e30PiB}",
            "cluster.gpu_overrides.memory",
            r"must be <= 1PiB, got '1e30PiB'$",
        ),
    ],
    ids=[
        "lr_inf",
        "lr_nan",
        "lr_1e300",
        "hot_expert_bias",
        "bandwidth_1e300",
        "bandwidth_1e400",
        "bandwidth_tiny",
        "latency_1e300",
        "peak_flops_1e300",
        "peak_flops_inf",
        "hbm_bandwidth",
        "efficiency_nan",
        "memory",
    ],
)
def test_rejects_infinite_and_absurd_floats(old, new, path, reason):
    rejected(swap(old, new), path, reason)


def test_rejects_an_integer_beyond_any_float_among_topology_keys():
    """Found by the fuzz test: math.isfinite(10**400) raised OverflowError."""
    text = swap("kind: switch", "kind: torus").replace(
        "  link_latency: 1us", "  link_latency: 1us\n    axes: [1" + "0" * 400 + "]"
    )
    rejected(text, "cluster.topology.axes", r"must be <= 1,048,576, got an integer of about 400 digits$")


def test_rejects_an_infinite_topology_ratio():
    text = re.sub(r"(?m)^ *link_bandwidth: .*\n", "", GOOD.replace("kind: switch", "kind: fattree"))
    text = text.replace("  link_latency: 1us", "  link_latency: 1us\n    oversubscription: .inf")
    rejected(text, "cluster.topology.oversubscription", r"must be a finite number, got inf$")


def test_rejects_an_infinite_capacity_factor():
    text = swap("  preset: gpt3-1.3b", "  preset: gpt3-1.3b\n  moe: {experts: 4, top_k: 2, capacity_factor: 1e300}")
    rejected(text, "model.moe.capacity_factor", r"must be <= 1000")


# --- bare numbers for bandwidths and times ----------------------------------------------------


@pytest.mark.parametrize(
    "old, new, path, reason",
    [
        (
            "link_bandwidth: 300GB/s",
            "link_bandwidth: 300",
            "cluster.topology.link_bandwidth",
            r"300 has no unit: add one \(B/s, kB/s, MB/s, GB/s, TB/s, or b/s \.\.\. Tb/s for bits\), "
            r"e\.g\. '300GB/s' or '300B/s'$",
        ),
        (
            "link_bandwidth: 300GB/s",
            "link_bandwidth: '300'",
            "cluster.topology.link_bandwidth",
            r"'300' has no unit: add one",
        ),
        (
            "link_latency: 1us",
            "link_latency: 1e-6",
            "cluster.topology.link_latency",
            r"1e-06 has no unit: add one \(s, ms, us, ns, ps\), e\.g\. '1e-06us' or '1e-06s'$",
        ),
        (
            "  gpu: A100-SXM-80GB",
            "  gpu: A100-SXM-80GB\n  gpu_overrides: {hbm_bandwidth: 2039000000000}",
            "cluster.gpu_overrides.hbm_bandwidth",
            r"2039000000000 has no unit",
        ),
    ],
    ids=["bandwidth_int", "bandwidth_str", "latency", "hbm_bandwidth"],
)
def test_rejects_a_bare_number_for_a_bandwidth_or_a_time(old, new, path, reason):
    rejected(swap(old, new), path, reason)


def test_a_zero_latency_needs_no_unit():
    assert load_scenario_text(swap("link_latency: 1us", "link_latency: 0")).cluster.topology.link_latency_s == 0.0


def test_a_bare_number_in_a_variant_or_a_spec_is_rejected_too():
    text = GOOD + "variants:\n  - {name: slow, cluster.topology.link_bandwidth: 25}\n"
    with pytest.raises(ScenarioError, match=r"cluster\.topology\.link_bandwidth: 25 has no unit"):
        load_variants_text(text)
    with pytest.raises(SpecError, match=r"link_latency: 5 has no unit"):
        parse_spec("ring:4,link_bandwidth=1GB/s,link_latency=5")
    assert parse_spec("ring:4,link_bandwidth_Bps=1e9,link_latency_s=1e-6")  # the name says the unit


# --- names and paths the file system refuses (OSError) ----------------------------------------


def test_rejects_a_300_character_name():
    rejected(swap("name: quickstart", "name: " + "a" * 300), "name", r"at most 100 characters, got 300$")


@pytest.mark.parametrize("name", [".", ".."])
def test_rejects_a_name_that_is_a_special_folder(name):
    rejected(swap("name: quickstart", f"name: '{name}'"), "name", rf"'{re.escape(name)}' is not a valid name")


@pytest.mark.parametrize(
    "value, reason",
    [
        ('"runs/a\\0b"', r"contains a NUL byte \(\\x00\), which no file system allows: 'runs/a\\x00b'$"),
        ("runs/" + "d" * 300, r"has a folder name longer than 255 bytes, which file systems refuse$"),
        ("'x" + "/y" * 3000 + "'", r"at most 4,096 characters, got 6,001$"),
        ("''", r"must name a folder, got ''$"),
    ],
    ids=["nul", "long_folder_name", "long_path", "empty"],
)
def test_rejects_an_output_dir_the_file_system_refuses(value, reason):
    rejected(GOOD + f"output: {{dir: {value}}}\n", "output.dir", reason)


def test_a_nul_byte_in_the_scenario_path_is_an_error():
    with pytest.raises(ScenarioError, match=r"^a\\x00b\.yaml: -: cannot read"):
        load_scenario("a\0b.yaml")


def test_the_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: " + "[" * 10_000 + "]" * 10_000 + "\n")
    assert main(["run", str(deep), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nested more than 64 levels deep" in err
    assert not (tmp_path / "out").exists()


def test_rejects_a_cluster_of_more_gpus_than_a_fabric_may_have():
    """800,000 GPUs passes every per-field bound, but its graph would exhaust memory."""
    rejected(
        swap("nodes: 1\n", "nodes: 100000\n").replace("gpus_per_node: 4", "gpus_per_node: 8"),
        "cluster.nodes",
        "100,000 x cluster.gpus_per_node 8 = 800,000 GPUs: more than the 131,072 a fabric may have",
    )


@pytest.mark.parametrize("spec", ["torus:100000x100000", "switch:10000000", "fattree:nodes=20000,gpus_per_node=8"])
def test_rejects_a_topology_spec_of_more_gpus_than_a_fabric_may_have(spec):
    """`clustersim topology torus:100000x100000` used to build for ever: refused before building."""
    started = time.monotonic()
    with pytest.raises(SpecError, match="GPUs: more than the 131,072 a fabric may have"):
        parse_spec(spec)
    assert time.monotonic() - started < 1.0


def test_a_long_variant_name_is_cut_in_the_error():
    """Found by the fuzz test: a variant's name went whole into the error's file part."""
    text = GOOD + "variants:\n  - {name: " + "v" * 5000 + ", cluster.gpus_per_node: 3}\n"
    with pytest.raises(ScenarioError) as info:
        load_variants_text(text, "bad.yaml")
    assert str(info.value).startswith("bad.yaml (variants[0]: vvv") and len(str(info.value)) < 700
