"""The command line: bad input is one line on stderr naming file and field, exit 2, nothing written;
the schedule and schema commands print what the README promises."""

import json
import re
import subprocess
import sys

import pytest

from clustersim.sim.cli import main
from clustersim.sim.folder import MARKER
from clustersim.sim.report import OUTPUT_FILES

from repo import ROOT

GOOD = (ROOT / "scenarios" / "quickstart.yaml").read_text()

BAD_INPUTS = [
    # (case, YAML text or None for a missing file, field path, reason pattern)
    ("unknown_top_key", GOOD + "colour: blue\n", "colour", "unknown key 'colour'"),
    ("unknown_nested_key", GOOD.replace("nodes: 1", "nodes: 1\n  racks: 2"), "cluster.racks", "unknown key 'racks'"),
    ("wrong_type", GOOD.replace("pp: 4 ", "pp: four "), "parallel.pp", "expected an integer, got 'four'"),
    ("negative_size", GOOD.replace("micro_batch: 4 ", "micro_batch: -4 "), "training.micro_batch", "must be > 0"),
    ("zero_bandwidth", GOOD.replace("300GB/s", "0GB/s"), "cluster.topology.link_bandwidth", "> 0"),
    ("bad_unit", GOOD.replace("300GB/s", "300 parsecs"), "cluster.topology.link_bandwidth", "not a bandwidth"),
    (
        "layers_not_divisible_by_pp",
        GOOD.replace("pp: 4 ", "pp: 5 ").replace("gpus_per_node: 4", "gpus_per_node: 5"),
        "parallel.pp",
        r"5 does not divide model.layers \(24\)",
    ),
    (
        "gpu_count_mismatch",
        GOOD.replace("gpus_per_node: 4", "gpus_per_node: 8"),
        "parallel",
        r"pp\(4\) x tp\(1\) x dp\(1\) = 4 != 8 GPUs",
    ),
    (
        "microbatches_below_one",
        GOOD.replace("global_batch: 32", "global_batch: 2"),
        "training.global_batch",
        "less than one microbatch",
    ),
    (
        "global_batch_not_divisible",
        GOOD.replace("global_batch: 32", "global_batch: 30"),
        "training.global_batch",
        r"30 is not divisible by training.micro_batch \(4\)",
    ),
    ("unknown_gpu", GOOD.replace("A100-SXM-80GB", "B300"), "cluster.gpu", "B300"),
    ("unknown_preset", GOOD.replace("gpt3-1.3b", "gpt5"), "model.preset", "unknown preset 'gpt5'"),
    ("unknown_schedule", GOOD.replace("schedule: 1f1b", "schedule: zigzag"), "schedule", "zigzag"),
    (
        "virtual_without_interleaved",
        GOOD.replace("dp: 1", "dp: 1\n  virtual: 2"),
        "parallel.virtual",
        r"schedule '1f1b' runs one stage per rank: virtual must be 1, got 2 \(several chunks per rank: interleaved, "
        r"interleaved-zb, zbv, dualpipev, looped-bfs\)",
    ),
    (
        "layers_not_divisible_by_pp_x_virtual",
        GOOD.replace("dp: 1", "dp: 1\n  virtual: 4").replace("schedule: 1f1b", "schedule: interleaved"),
        "parallel.virtual",
        r"parallel.pp \(4\) x parallel.virtual \(4\) = 16 stages does not divide model.layers \(24\)",
    ),
    (
        "interleaved_microbatches_not_multiple_of_pp",
        GOOD.replace("dp: 1", "dp: 1\n  virtual: 2")
        .replace("schedule: 1f1b", "schedule: interleaved")
        .replace("global_batch: 32", "global_batch: 24"),
        "training.global_batch",
        r"= 6 microbatches: interleaved schedule needs microbatches \(6\) to be a multiple of pp \(4\)",
    ),
    ("yaml_syntax", GOOD.replace("nodes: 1", "nodes: [1"), "-", "invalid YAML at line"),
    ("not_a_mapping", "- just\n- a list\n", "-", "top level must be a mapping"),
    ("missing_file", None, "-", "no such file"),
    ("zero_stage_out_of_range", GOOD.replace("  dp: 1", "  dp: 1\n  zero: 4"), "parallel.zero", "<= 3"),
    (
        "layout_order_repeats_an_axis",
        GOOD.replace("  dp: 1", "  dp: 1\n  order: [dp, dp, tp]"),
        "parallel.order",
        "must name dp, pp and tp once each",
    ),
    ("zero_bucket", GOOD.replace("  dp: 1", "  dp: 1\n  bucket: 0MB"), "parallel.bucket", "> 0"),
    (
        "heads_not_divisible_by_tp",
        GOOD.replace("  tp: 1", "  tp: 3").replace("gpus_per_node: 4", "gpus_per_node: 12"),
        "parallel.tp",
        r"3 does not divide model.heads \(16\)",
    ),
    (
        "sequence_parallel_without_tp",
        GOOD.replace("  dp: 1", "  dp: 1\n  sequence_parallel: true"),
        "parallel.sequence_parallel",
        "needs parallel.tp > 1",
    ),
    (
        "shadow_heads_not_divisible_by_tp",
        GOOD.replace("  tp: 1", "  tp: 4").replace("gpus_per_node: 4", "gpus_per_node: 16") + "  heads: 2\n",
        "numerics.heads",
        r"2 is not divisible by parallel.tp \(4\)",
    ),
    (
        "shadow_seq_not_divisible_by_tp",
        GOOD.replace("  tp: 1", "  tp: 2\n  sequence_parallel: true").replace("gpus_per_node: 4", "gpus_per_node: 8")
        + "  seq_len: 7\n",
        "numerics.seq_len",
        r"7 is not divisible by parallel.tp \(2\)",
    ),
    (
        "moe_top_k_above_experts",
        GOOD.replace("  preset: gpt3-1.3b", "  moe: {experts: 8, top_k: 9}\n  preset: gpt3-1.3b"),
        "model.moe.top_k",
        r"9 > model.moe.experts \(8\)",
    ),
    (
        "moe_zero_capacity_factor",
        GOOD.replace("  preset: gpt3-1.3b", "  moe: {experts: 8, top_k: 2, capacity_factor: 0}\n  preset: gpt3-1.3b"),
        "model.moe.capacity_factor",
        "must be > 0, got 0",
    ),
    ("ep_on_a_dense_model", GOOD.replace("  dp: 1", "  dp: 1\n  ep: 2"), "parallel.ep", "needs an MoE model"),
    (
        "ep_not_dividing_experts",
        GOOD.replace("  preset: gpt3-1.3b", "  moe: {experts: 6, top_k: 2}\n  preset: gpt3-1.3b")
        .replace("  dp: 1", "  dp: 4\n  ep: 4")
        .replace("gpus_per_node: 4", "gpus_per_node: 16"),
        "parallel.ep",
        r"4 does not divide model.moe.experts \(6\)",
    ),
    (
        "ep_not_dividing_dp",
        GOOD.replace("  preset: gpt3-1.3b", "  moe: {experts: 8, top_k: 2}\n  preset: gpt3-1.3b").replace(
            "  dp: 1", "  dp: 1\n  ep: 2"
        ),
        "parallel.ep",
        r"2 does not divide parallel.dp \(1\): expert-parallel groups are carved out of the data-parallel group",
    ),
    (
        "moe_shadow_tokens_not_divisible_by_tp",
        GOOD.replace("  preset: gpt3-1.3b", "  moe: {experts: 8, top_k: 2}\n  preset: gpt3-1.3b")
        .replace("  pp: 4", "  pp: 2")
        .replace("  tp: 1", "  tp: 2")
        + "  seq_len: 7\n  micro_batch: 1\n",
        "numerics.seq_len",
        r"7 x numerics.micro_batch \(1\) = 7 tokens is not divisible by parallel.tp \(2\): each "
        "tensor-parallel rank of the shadow model routes 1/tp of a microbatch's tokens$",
    ),
    (
        "hot_expert_on_a_dense_model",
        GOOD.replace("  enabled: true", "  enabled: true\n  hot_expert_bias: 0.1"),
        "numerics.hot_expert_bias",
        "needs an MoE model",
    ),
]


@pytest.mark.parametrize("case,text,field,reason", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, case, text, field, reason):
    path = tmp_path / f"{case}.yaml"
    if text is not None:
        path.write_text(text)
    out = tmp_path / "out"
    assert main(["run", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"clustersim: error: {path}: {field}: "), err
    assert __import__("re").search(reason, err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ([path.name] if text is not None else [])


def test_bad_input_from_a_real_process_has_no_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("pp: 4 ", "pp: 0 "))
    proc = subprocess.run(
        [sys.executable, "-m", "clustersim.sim.cli", "run", str(path), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr == f"clustersim: error: {path}: parallel.pp: must be > 0, got 0\n"
    assert not (tmp_path / "out").exists()


def test_schedule_json_lists_every_compute_op_in_order(capsys):
    assert main(["schedule", "--kind", "1f1b", "--pp", "2", "--microbatches", "2", "--json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    as_text = {r: [f"{o['phase']}{o['microbatch']}@{o['stage']}" for o in ops] for r, ops in ranks.items()}
    # 1F1B, p=2: stage 0 warms up with one forward; stage 1 alternates from the start
    assert as_text == {"0": ["F0@0", "F1@0", "B0@0", "B1@0"], "1": ["F0@1", "B0@1", "F1@1", "B1@1"]}


def test_schedule_grid_has_one_row_per_rank(capsys):
    assert main(["schedule", "--kind", "gpipe", "--pp", "3", "--microbatches", "2"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows == ["rank 0 | F0@0 F1@0 B0@0 B1@0", "rank 1 | F0@1 F1@1 B0@1 B1@1", "rank 2 | F0@2 F1@2 B0@2 B1@2"]


@pytest.mark.parametrize(
    "kind,pp,virtual,m",
    [
        ("zb-h1", 4, 1, 8),
        ("interleaved-zb", 4, 2, 8),
        ("zbv", 4, 2, 8),
        ("dualpipev", 3, 2, 10),
        ("looped-bfs", 4, 2, 8),
    ],
)
def test_schedule_json_lists_the_pytorch_runtimes_order_with_w(capsys, kind, pp, virtual, m):
    """--json gives each rank's F, B and W with microbatch and global stage in executed order: the
    order of the fixture PyTorch's runtime produced (tests/schedules/torch_orders)."""
    argv = ["schedule", "--kind", kind, "--pp", str(pp), "--virtual", str(virtual), "--microbatches", str(m), "--json"]
    assert main(argv) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    fixture = json.loads((ROOT / "tests" / "schedules" / "torch_orders" / f"{kind}.json").read_text())
    want = next(s["ranks"] for s in fixture["shapes"] if (s["pp"], s["virtual"], s["microbatches"]) == (pp, virtual, m))
    assert {r: [[o["phase"], o["microbatch"], o["stage"]] for o in ops] for r, ops in ranks.items()} == want


def test_interleaved_schedule_json_puts_chunk_c_of_rank_r_on_stage_c_p_plus_r(capsys):
    p, v, m = 4, 3, 8
    assert (
        main(
            [
                "schedule",
                "--kind",
                "interleaved",
                "--pp",
                str(p),
                "--virtual",
                str(v),
                "--microbatches",
                str(m),
                "--json",
            ]
        )
        == 0
    )
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    assert sorted(ranks) == [str(r) for r in range(p)]
    for r, ops in ranks.items():
        rank = int(r)
        assert sorted({o["stage"] for o in ops}) == [rank + c * p for c in range(v)]
        assert len(ops) == 2 * v * m  # one forward and one backward per (chunk, microbatch)
        first_backward = next(i for i, o in enumerate(ops) if o["phase"] == "B")
        assert first_backward == min(2 * (p - rank - 1) + (v - 1) * p, v * m) + 1  # warm-up, then one F


# Derived by hand from Megatron's rule, p = 2, v = 2, m = 4 (8 forwards and 8 backwards per rank).
# The k-th forward is chunk (k // 2) % 2 of microbatch (k // 4) * 2 + k % 2:
#   k     0  1  2  3  4  5  6  7
#   chunk 0  0  1  1  0  0  1  1
#   mb    0  1  0  1  2  3  2  3
# the k-th backward the same microbatch on chunk 1 - chunk. Chunk c of rank r is stage 2c + r.
# Warm-up forwards: rank 0: 2 (2 - 0 - 1) + (2 - 1) 2 = 4; rank 1: 0 + 2 = 2. Then F(w + k), B(k)
# pairs until the forwards run out, then the remaining backwards.
#   rank 0: F0..F3 = F0@0 F1@0 F0@2 F1@2 | F4 B0 = F2@0 B0@2 | F5 B1 = F3@0 B1@2 | F6 B2 = F2@2 B0@0
#           | F7 B3 = F3@2 B1@0 | B4..B7 = B2@2 B3@2 B2@0 B3@0
#   rank 1: F0 F1 = F0@1 F1@1 | F2 B0 = F0@3 B0@3 | F3 B1 = F1@3 B1@3 | F4 B2 = F2@1 B0@1
#           | F5 B3 = F3@1 B1@1 | F6 B4 = F2@3 B2@3 | F7 B5 = F3@3 B3@3 | B6 B7 = B2@1 B3@1
INTERLEAVED_P2_V2_M4 = """\
rank 0 | F0@0 F1@0 F0@2 F1@2 F2@0 B0@2 F3@0 B1@2 F2@2 B0@0 F3@2 B1@0 B2@2 B3@2 B2@0 B3@0
rank 1 | F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 F3@1 B1@1 F2@3 B2@3 F3@3 B3@3 B2@1 B3@1
"""


def test_interleaved_schedule_grid_is_megatrons_order(capsys):
    assert main(["schedule", "--kind", "interleaved", "--pp", "2", "--virtual", "2", "--microbatches", "4"]) == 0
    assert capsys.readouterr().out == INTERLEAVED_P2_V2_M4


@pytest.mark.parametrize(
    "argv,flag,reason",
    [
        (
            ["--kind", "interleaved", "--pp", "4", "--virtual", "2", "--microbatches", "6"],
            "--microbatches",
            r"interleaved schedule needs microbatches \(6\) to be a multiple of pp \(4\)",
        ),
        (
            ["--kind", "1f1b", "--pp", "4", "--virtual", "2", "--microbatches", "8"],
            "--virtual",
            r"schedule '1f1b' runs one stage per rank: virtual must be 1, got 2",
        ),
        (
            ["--kind", "interleaved", "--pp", "4", "--virtual", "0", "--microbatches", "8"],
            "--virtual",
            r"must be >= 1, got 0",
        ),
    ],
)
def test_schedule_rejects_what_it_cannot_schedule_in_one_line(capsys, argv, flag, reason):
    assert main(["schedule", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"clustersim: error: (command line): {flag}: "), err
    assert re.search(reason, err), err


def test_schedule_rejects_zero_microbatches(capsys):
    assert main(["schedule", "--kind", "gpipe", "--pp", "3", "--microbatches", "0"]) == 2
    assert "--microbatches: must be >= 1" in capsys.readouterr().err


def test_schema_is_json_with_every_section(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert {"cluster", "model", "training", "parallel", "schedule", "numerics", "output"} <= set(schema["properties"])


def test_a_batch_run_writes_only_the_summary_and_tables_and_never_imports_matplotlib(tmp_path):
    """`run --no-plots --no-trace --no-program`: summary.json and the CSV tables alone, and `-X importtime` (which
    lists every module the process imported) shows no matplotlib."""
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-X",
        "importtime",
        "-m",
        "clustersim.sim.cli",
        "run",
        str(ROOT / "scenarios" / "quickstart.yaml"),
    ]
    proc = subprocess.run(
        [*cmd, "-o", str(out), "--no-plots", "--no-trace", "--no-program"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "clustersim.sim.run" in imported  # the listing is the one we think it is
    assert not [m for m in imported if m.startswith("matplotlib")]
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "links.csv", "ranks.csv", "summary.json"]
    assert "wrote" in proc.stdout and "summary.json" in proc.stdout.splitlines()[-1]


@pytest.mark.parametrize(
    "outputs,written",
    [
        ("summary.json", ["summary.json"]),
        ("tables", ["links.csv", "ranks.csv", "summary.json"]),
        ("gantt.png, program.txt", ["gantt.png", "program.txt", "summary.json"]),
    ],
)
def test_outputs_writes_the_files_named_and_always_the_summary(tmp_path, capsys, outputs, written):
    out = tmp_path / "out"
    assert main(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "-o", str(out), "--outputs", outputs]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, *written])
    assert capsys.readouterr().out.splitlines()[-1].endswith(" ".join(sorted(written, key=OUTPUT_FILES.index)))


def test_outputs_rejects_an_unknown_name_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "-o", str(out), "--outputs", "gantt"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--outputs: unknown output 'gantt'" in err and "gantt.png" in err
    assert not out.exists()


def test_format_csv_puts_only_the_rank_table_on_stdout(tmp_path, capsys):
    out = tmp_path / "out"
    args = ["run", str(ROOT / "scenarios" / "quickstart.yaml"), "-o", str(out), "--outputs", "tables"]
    assert main([*args, "--format", "csv"]) == 0
    stdout = capsys.readouterr().out
    assert stdout == (out / "ranks.csv").read_text()  # the same table the file holds, and nothing else


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, which JSON does not have (Python writes them unless told not to)."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_every_json_a_run_writes_is_valid_json(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", str(ROOT / "scenarios" / "quickstart.yaml"), "-o", str(out), "--outputs", "trace.json"]) == 0
    for name in ("summary.json", "trace.json"):
        assert strict_json((out / name).read_text())
