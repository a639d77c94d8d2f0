"""clustersim against published training runs and collective benchmarks: docs/calibration.md.

Every training row is a real run from a paper, a scenario in scenarios/calibration/ that opens
with its source and the configuration as published. Every scenario runs the per-kernel compute
model (cluster.compute_model: kernel: one description per GPU type, sim/scenario/chips.py), never
a per-row setting; `--compute-model roofline` runs them all on the roofline instead (one efficiency
per GPU type, sim/scenario/hardware.py). The collectives rows (nccl-tests bus
bandwidths) are bench/nccl_tests.py's, and the per-layer rows (Korthikanti et al. 2022 Table 4)
bench/layer_times.py's, imported here so the median and worst error cover all of them; the
collectives section of docs/calibration.md is bench/nccl_tests.py's to write.

Three kinds of published figure: the step time (Korthikanti et al. 2022 give seconds per
iteration), tokens per second per GPU (Megatron-Bridge's table: global batch x sequence over the
step time and the GPUs) and achieved TFLOP/s per GPU (Narayanan et al. 2021 Table 1). For the last,
clustersim's figure is the paper's own FLOP count divided by the simulated step time and the GPU
count, so both sides count the same FLOPs: the paper's appendix, equation (3), for a GPT model with
activation recomputation, F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h)).

    python bench/fidelity.py             # every row, one table, median and worst error, run time
    python bench/fidelity.py --small     # only the fast rows (tests/sim/results/test_calibration.py)
    python bench/fidelity.py --write     # also rewrite the training and layer tables in docs/calibration.md
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import layer_times  # bench/layer_times.py, beside this file
import nccl_tests  # bench/nccl_tests.py, beside this file

from clustersim.sim.cli import check_resources
from clustersim.sim.run import simulate
from clustersim.sim.scenario.hardware import GPUS
from clustersim.sim.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "calibration.md"
BEGIN, END = "<!-- training table: bench/fidelity.py --write -->", "<!-- end of training table -->"
LAYER_BEGIN, LAYER_END = "<!-- layer table: bench/fidelity.py --write -->", "<!-- end of layer table -->"

NARAYANAN = "Narayanan et al. 2021 (SC21, arXiv:2104.04473) Table 1"
KORTHIKANTI = "Korthikanti et al. 2022 (arXiv:2205.05198) Table 5"
NEMO = "NeMo 24.07 performance summary (NVIDIA/NeMo docs/source/performance/performance_summary.md), DGX-H100 FP8"
BRIDGE = "Megatron-Bridge performance summary (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md)"
MODEL_TFLOPS = "model TFLOP/s"  # per GPU, NeMo's FLOP count (nemo_flops)
TOKENS = "tokens/s"  # per GPU: global batch x sequence / step time / GPUs


@dataclass(frozen=True)
class Row:
    source: str
    configuration: str
    published: float
    unit: str  # "s" (step time), "TFLOP/s" (per GPU, the paper's FLOP count), MODEL_TFLOPS (NeMo's) or TOKENS
    scenario: str  # scenarios/calibration/<scenario>.yaml
    small: bool = False  # seconds to simulate: rerun by the test suite
    vocab: int = 0  # MODEL_TFLOPS rows: the vocabulary NeMo's FLOP count uses for the model's family


def _table1(size: str, layout: str, tflops: float, scenario: str, small: bool = False) -> Row:
    return Row(NARAYANAN, f"{size}, {layout}, full recompute", tflops, "TFLOP/s", scenario, small)


def _table5(model: str, layout: str, mode: str, seconds: float, scenario: str, small: bool = False) -> Row:
    column = "" if mode == "selective" else ", Full Recompute"
    return Row(KORTHIKANTI + column, f"{model}, {layout}, {mode} recompute", seconds, "s", scenario, small)


# NeMo's LLM_VOCAB_SIZE_MAP (NVIDIA/NeMo nemo/collections/common/parts/perf_metrics_utils.py): the
# vocabulary its FLOP count uses per model family, not the model's padded one.
NEMO_VOCAB = {"GPT3": 51200, "LLAMA2": 32000, "Nemotron": 256000}


def _nemo(model: str, layout: str, tflops: float, scenario: str, small: bool = False) -> Row:
    vocab = NEMO_VOCAB[model.split("-")[0]]
    return Row(NEMO, f"{model}, {layout}, FP8", tflops, MODEL_TFLOPS, scenario, small, vocab)


def _bridge(container: str, model: str, tokens: float, scenario: str) -> Row:
    return Row(f"{BRIDGE}, NeMo {container}, DGX-H100 FP8", f"{model}, FP8", tokens, TOKENS, f"bridge_{scenario}")


ROWS = [
    _table1("1.7B", "32 A100, TP 1, DP 32, batch 512", 137, "megatron_1_7b", small=True),
    _table1("3.6B", "64 A100, TP 2, DP 32, batch 512", 138, "megatron_3_6b"),
    _table1("7.5B", "128 A100, TP 4, DP 32, batch 512", 142, "megatron_7_5b"),
    _table1("18.4B", "256 A100, TP 8, DP 32, batch 1024", 135, "megatron_18b", small=True),
    _table1("39.1B", "512 A100, TP 8, PP 2, DP 32, batch 1536", 138, "megatron_39b"),
    _table1("76.1B", "1,024 A100, TP 8, PP 4 x 3, DP 32, batch 1792", 140, "megatron_76b"),
    _table1("145.6B", "1,536 A100, TP 8, PP 8 x 2, DP 24, batch 2304", 148, "megatron_145b"),
    _table1("310.1B", "1,920 A100, TP 8, PP 16 x 2, DP 15, batch 2160", 155, "megatron_310b"),
    _table1("529.6B", "2,520 A100, TP 8, PP 35 x 3, DP 9, batch 2520", 163, "megatron_530b"),
    _table1("1008.0B", "3,072 A100, TP 8, PP 64, DP 6, batch 3072", 163, "megatron_1t"),
    _table5("22B", "8 A100, TP 8 + SP", "selective", 1.10, "k22b_selective", small=True),
    _table5("22B", "8 A100, TP 8", "full", 1.42, "k22b_full", small=True),
    _table5("175B", "64 A100, TP 8 + SP, PP 8 x 3", "selective", 13.75, "k175b_selective"),
    _table5("175B", "64 A100, TP 8, PP 8 x 3", "full", 18.13, "k175b_full"),
    _table5("530B", "280 A100, TP 8 + SP, PP 35 x 3", "selective", 37.83, "k530b_selective"),
    _table5("530B", "280 A100, TP 8, PP 35 x 3", "full", 49.05, "k530b_full"),
    _table5("1T", "512 A100, TP 8 + SP, PP 64", "selective", 71.49, "k1t_selective"),
    _table5("1T", "512 A100, TP 8, PP 64", "full", 94.42, "k1t_full"),
    _nemo("GPT3-5B", "64 H100, TP 1, DP 64, batch 2048", 765, "nemo_gpt3_5b", small=True),
    _nemo("GPT3-20B", "64 H100, TP 2 + SP, DP 32, batch 256", 750, "nemo_gpt3_20b"),
    _nemo("GPT3-175B", "128 H100, TP 4 + SP, PP 8 x 6, DP 4, batch 256", 771, "nemo_gpt3_175b_128"),
    _nemo("GPT3-175B", "512 H100, TP 4 + SP, PP 8 x 6, DP 16, batch 2048", 888, "nemo_gpt3_175b_512"),
    _nemo("LLAMA2-7B", "8 H100, TP 1, DP 8, batch 128", 780, "nemo_llama2_7b", small=True),
    _nemo("LLAMA2-13B", "16 H100, TP 1, PP 4 x 10, DP 4, batch 128", 760, "nemo_llama2_13b"),
    _nemo("LLAMA2-70B", "64 H100, TP 4 + SP, PP 4 x 20, DP 4, batch 128, 8 query groups", 768, "nemo_llama2_70b"),
    _nemo("Nemotron-8B", "64 H100, TP 2 + SP, DP 32, batch 256", 643, "nemo_nemotron_8b"),
    _nemo("Nemotron-22B", "64 H100, TP 2 + SP, PP 4 x 10, DP 8, batch 256", 562, "nemo_nemotron_22b"),
    _bridge(
        "26.04.01", "LLAMA3-70B, 64 H100, TP 4 + SP, PP 8 x 5, DP 2, batch 256, 8 query groups", 1664, "llama3_70b"
    ),
    _bridge(
        "26.06",
        "Qwen3-30B-A3B (MoE, 128 experts, top 8), 16 H100, EP 16, DP 16, batch 1024, HybridEP",
        8826,
        "qwen3_30b_a3b",
    ),
]


def megatron_flops(scenario) -> float:
    """FLOPs of one iteration by Narayanan et al. 2021's equation (3) (full recompute): the figure
    their Table 1 divides by time and GPUs."""
    m, batch = scenario.model, scenario.training.global_batch
    s, h, layers, vocab = m.seq_len, m.hidden, m.layers, m.vocab
    return 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (16 * layers * h))


def nemo_flops(scenario, vocab: int) -> float:
    """FLOPs of one iteration as NeMo counted them for its 24.07 performance summary's "Model TFLOP /
    sec / GPU" (NVIDIA/NeMo nemo/collections/common/metrics/perf_metrics.py at d8995496, "log
    TFLOPs", 2024-08-04, FLOPsMeasurementCallback): _gpt3() (24 B s h^2 + 4 B s^2 h) 3 l + 6 B s h V,
    _llama2() and _nemotron() B s l h^2 (12 + 12 g / a + c f / h + 12 s / h + 6 V / (l h)), none
    with recompute or causal halving; written here as one, B s l h^2 (12 + 12 g / a + c f / h + 12 s / h +
    6 V / (l h)), c = 12 for two MLP matrices (GPT-3, Nemotron) and 18 for Llama's three, g the
    query groups (model.kv_heads; g = a: multi-head, where 12 + 12 g / a is GPT-3's 24), V NeMo's
    vocabulary for the family (NEMO_VOCAB). The 24.07 table's
    825 tokens/s x this count per token = 888 TFLOP/s for GPT3-175B at 512 GPUs, as printed (a test
    checks every row)."""
    m, batch = scenario.model, scenario.training.global_batch
    s, h, layers = m.seq_len, m.hidden, m.layers
    mlp, groups = 18 if m.gated_mlp else 12, m.kv_heads or m.heads
    attention = 12 + 12 * groups / m.heads
    return batch * s * layers * h**2 * (attention + mlp * m.ffn / h + 12 * s / h + 6 * vocab / (layers * h))


def simulated(row: Row, max_memory: str | None = None, compute_model: str | None = None) -> tuple[float, float]:
    """(the row's figure, its step seconds) from clustersim: the figure is the step time, or the
    paper's FLOPs per GPU per second (TFLOP/s). `max_memory` refuses a run whose estimate exceeds
    it, as the CLI's --max-memory does; `compute_model` replaces the scenario's
    cluster.compute_model (roofline or kernel) for every row alike. The roofline has neither FP8
    nor the tensor-parallel collectives' overlap with the GEMMs (a scenario asking for them with it
    is an error), so on it those rows run BF16 with their collectives blocking."""
    path = ROOT / "scenarios" / "calibration" / f"{row.scenario}.yaml"
    scenario = load_scenario(path)
    if compute_model is not None:
        cluster = scenario.cluster.model_copy(update={"compute_model": compute_model})
        scenario = scenario.model_copy(update={"cluster": cluster})
    if scenario.cluster.compute_model == "roofline":
        megatron = scenario.parallel.megatron.model_copy(update={"tp_comm_overlap": False})
        parallel = scenario.parallel.model_copy(update={"megatron": megatron})
        training = scenario.training.model_copy(update={"fp8": False})
        scenario = scenario.model_copy(update={"parallel": parallel, "training": training})
    if max_memory is not None:
        check_resources(str(path), scenario, max_memory)
    step_s = simulate(scenario).summary["step_time_s"]
    if row.unit == "s":
        return step_s, step_s
    if row.unit == TOKENS:
        return scenario.training.global_batch * scenario.model_spec.seq_len / step_s / scenario.num_gpus, step_s
    flops = nemo_flops(scenario, row.vocab) if row.unit == MODEL_TFLOPS else megatron_flops(scenario)
    return flops / step_s / scenario.num_gpus / 1e12, step_s


def run_row(row: Row, max_memory: str, compute_model: str | None = None) -> dict:
    """Simulate one row in a child process of its own (its peak RSS is its own, and what one row
    allocates is returned to the system before the next): its figure, step time, wall seconds,
    CPU seconds (user + system: what the shared machine's load changes least) and peak RSS bytes;
    {"error": the child's last line} when it fails (e.g. refused by max_memory)."""
    command = [sys.executable, __file__, "--child", row.scenario, "--max-memory", max_memory]
    command += ["--compute-model", compute_model] if compute_model else []
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _child(scenario: str, max_memory: str, compute_model: str | None) -> None:
    """run_row's child: print the row's figures as one JSON line."""
    start, cpu_start = time.perf_counter(), time.process_time()
    value, step_s = simulated(next(row for row in ROWS if row.scenario == scenario), max_memory, compute_model)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"value": value, "step_time_s": step_s, "wall_s": wall_s, "cpu_s": cpu_s, "peak_rss_bytes": peak}))


def error(row: Row, value: float) -> float:
    """Relative error of the simulated figure, (simulated - published) / published."""
    return (value - row.published) / row.published


def training_table(rows: list[Row], values: list[float], compute_model: str | None = None) -> str:
    """The training rows as docs/calibration.md prints them, with their median and worst error;
    `compute_model`: the one that replaced the scenarios' own (None: theirs, the kernel model)."""
    lines = ["| source | configuration | published | simulated | error |", "| --- | --- | ---: | ---: | ---: |"]
    for row, value in zip(rows, values):
        lines.append(
            f"| {row.source} | {row.configuration} | {row.published:.2f} {row.unit} | "
            f"{value:.2f} {row.unit} | {error(row, value):+.1%} |"
        )
    errors = [abs(error(row, value)) for row, value in zip(rows, values)]
    model = (
        f"the roofline (A100 efficiency {GPUS['A100-SXM-80GB'].efficiency} of peak for every FLOP; no FP8: "
        "the H100 rows in BF16)"
        if compute_model == "roofline"
        else "the per-kernel model (each scenario's cluster.compute_model: kernel)"
    )
    lines.append(
        f"\nTraining rows: {len(rows)}; median absolute error {statistics.median(errors):.1%}, worst "
        f"{max(errors):.1%}. Every row runs {model}."
    )
    return "\n".join(lines)


def collective_lines(rows: list[nccl_tests.Row]) -> tuple[list[str], list[float]]:
    """bench/nccl_tests.py's rows in this table's columns, and their absolute errors."""
    lines, errors = [], []
    for row in rows:
        busbw, _, _ = nccl_tests.simulated(row)
        err = nccl_tests.error(row, busbw)
        errors.append(abs(err))
        lines.append(
            f"| {row.source} | {row.configuration} | {row.published_GBps:.2f} GB/s | {busbw:.2f} GB/s | {err:+.1%} |"
        )
    return lines, errors


def write_doc(table: str, layer_table: str) -> None:
    """Put the training and per-layer tables between their markers in docs/calibration.md."""
    text = DOC.read_text()
    for begin, end, body in ((BEGIN, END, table), (LAYER_BEGIN, LAYER_END, layer_table)):
        head, rest = text.split(begin)
        _, tail = rest.split(end)
        text = f"{head}{begin}\n{body}\n{end}{tail}"
    DOC.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="only the rows the test suite reruns")
    parser.add_argument("--write", action="store_true", help="rewrite the training table in docs/calibration.md")
    parser.add_argument("--max-memory", default="12GB", help="refuse a row estimated above SIZE (default 12GB)")
    parser.add_argument(
        "--compute-model",
        choices=["roofline", "kernel"],
        help="run every training row with this cluster.compute_model (default: each scenario's own)",
    )
    parser.add_argument("--child", choices=[row.scenario for row in ROWS], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.max_memory, args.compute_model)
        return 0
    start = time.perf_counter()
    rows, values = [], []
    for row in (row for row in ROWS if row.small or not args.small):
        result = run_row(row, args.max_memory, args.compute_model)
        if "error" in result:
            print(f"{row.scenario}: not simulated: {result['error']}", file=sys.stderr)
            continue
        rows.append(row)
        values.append(result["value"])
        print(
            f"{row.scenario}: {result['value']:.2f} {row.unit} in {result['wall_s']:.1f} s, "
            f"peak RSS {result['peak_rss_bytes'] / 2**30:.1f} GiB",
            file=sys.stderr,
        )
    table = training_table(rows, values, args.compute_model)
    layers = layer_times.rows(args.compute_model)  # seconds, all of them: every run is small
    layer_table = layer_times.table(layers)
    lines, errors = collective_lines([row for row in nccl_tests.ROWS if row.small or not args.small])
    errors += [abs(error(row, value)) for row, value in zip(rows, values)]
    errors += [abs(layer_times.error(published, value)) for _, published, value in layers]
    print(table.split("\n\n")[0])
    print("\n".join(layer_table.splitlines()[2:-2]))
    print("\n".join(lines))
    print(
        f"\nAll {len(errors)} rows: median absolute error {statistics.median(errors):.1%}, worst {max(errors):.1%}; "
        f"run time {time.perf_counter() - start:.0f} s (`python bench/fidelity.py{' --small' if args.small else ''}`)."
    )
    if args.write:
        write_doc(table, layer_table)
    return 1 if len(rows) < len([row for row in ROWS if row.small or not args.small]) else 0


if __name__ == "__main__":
    sys.exit(main())
