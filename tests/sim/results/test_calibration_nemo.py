"""The NeMo performance-summary rows of docs/calibration.md count FLOPs as NeMo does: its table prints
both tokens/s and model TFLOP/s per GPU, so NeMo's FLOPs per token times the first must give the second."""

import sys

import pytest

from repo import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from fidelity import MODEL_TFLOPS, ROWS, nemo_flops  # noqa: E402

from clustersim.sim.scenario.loader import load_scenario  # noqa: E402

# NVIDIA/NeMo docs/source/performance/performance_summary.md at 8e3d65dc (NeMo 24.07, DGX-H100,
# FP8), column "Tokens / sec / GPU" of the rows whose "Model TFLOP / sec / GPU" the ROWS carry.
TOKENS_PER_S_PER_GPU = {
    "nemo_gpt3_5b": 23406,
    "nemo_gpt3_20b": 5851,
    "nemo_gpt3_175b_128": 716,
    "nemo_gpt3_175b_512": 825,
    "nemo_llama2_7b": 16934,
    "nemo_llama2_13b": 8715,
    "nemo_llama2_70b": 1728,
    "nemo_nemotron_8b": 12507,
    "nemo_nemotron_22b": 4312,
}


@pytest.mark.parametrize("row", [r for r in ROWS if r.unit == MODEL_TFLOPS], ids=lambda r: r.scenario)
def test_nemo_flops_turn_the_tables_tokens_into_its_tflops(row):
    scenario = load_scenario(ROOT / "scenarios" / "calibration" / f"{row.scenario}.yaml")
    per_token = nemo_flops(scenario, row.vocab) / (scenario.training.global_batch * scenario.model.seq_len)
    tflops = per_token * TOKENS_PER_S_PER_GPU[row.scenario] / 1e12
    rounding = 0.5 + 0.5 * per_token / 1e12  # the table rounds both columns to whole numbers
    assert tflops == pytest.approx(row.published, abs=rounding)
