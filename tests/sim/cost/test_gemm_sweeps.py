"""The GEMM model (sim.cost.gemm) against every shape of the published cuBLASLt sweeps
(sim.scenario.gemm_sweeps, Azure/AI-benchmarking-guide) and against the best-of-search MAMF rows.

Each sweep's largest square GEMM is the chip's ceiling (the main loop's rate comes from it, so that
row is exact by construction); every other row is a prediction. The bounds, by shape:
- every dimension >= 4096 (training's GEMMs: m = tokens per microbatch, n and k = h/t to 4h/t):
  5%, the spread of repeated measurements of one shape (the H200's 16384^3 reads 1.2% above its
  32768^3, which cannot be: more of the same work per tile).
- 802816 x 192 x 768 (one thin GEMM; n = 192 fills 128-wide tiles 75%): 5% as well.
- 2048^3: one or three waves, 16%. On the A100 the model's best tile, 128x128, runs 256 tiles in 3
  waves of 108 (79% full) and the model is 15% slow: cuBLAS ran a kernel outside the three tiles
  the model knows (the measurement implies waves over 90% full). On the H100 and H200 one wave of
  128 tiles runs 13 us of main loop, so the fixed costs the model leaves out (filling the pipeline,
  the first loads' latency) are a few percent: +3% and +6%.
- a dimension of 1024 (kernels of 5-8 us): the model is fast by up to 61%, because those fixed
  costs are then a third of the time; asserted only as "never slower than measured, and at most
  1.65x faster", which is what the model is worth there.
"""

import sys

import pytest

from clustersim.sim.cost import gemm
from clustersim.sim.scenario import gemm_sweeps
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.hardware import GPUS

from repo import ROOT

SWEEPS = gemm_sweeps.BY_GPU


def modelled_flops(name: str, m: int, n: int, k: int, fp8: bool) -> float:
    """The model's FLOP/s at one shape, launch gap included (the sweeps time calls back to back)."""
    return 2.0 * m * n * k / gemm.gemm_time_s(CHIPS[name], GPUS[name], m, n, k, fp8=fp8)


def bound(m: int, n: int, k: int) -> tuple[float, float]:
    """(lowest, highest) allowed ratio of modelled to measured FLOP/s for this shape."""
    if min(m, n, k) >= 4096 or (m, n, k) == (802816, 192, 768):
        return 0.95, 1.05
    if min(m, n, k) >= 2048:
        return 0.84, 1.16
    return 1.0, 1.65


CASES = [(name, row) for name, sweep in SWEEPS.items() for row in sweep.rows]


@pytest.mark.parametrize("name,row", CASES, ids=[f"{name}-{r[0]}x{r[1]}x{r[2]}" for name, r in CASES])
def test_every_published_shape_within_its_bound(name, row):
    m, n, k, measured = row
    sweep = SWEEPS[name]
    low, high = bound(m, n, k)
    ratio = modelled_flops(name, m, n, k, fp8=sweep.input_bytes == 1) / measured
    assert low <= ratio <= high, f"{name} {m}x{n}x{k}: model / measured = {ratio:.3f}"


def test_the_sweeps_are_the_chips_ceilings():
    """The anchor is the sweep's largest square GEMM, at the output width the sweep wrote."""
    for name, ceiling in (
        ("A100-SXM-80GB", CHIPS["A100-SXM-80GB"].matmul_ceiling),
        ("H100-SXM", CHIPS["H100-SXM"].fp8_matmul_ceiling),
        ("H200", CHIPS["H200"].fp8_matmul_ceiling),
    ):
        m, n, k, flops = SWEEPS[name].largest_square()
        assert (ceiling.m, ceiling.n, ceiling.k, ceiling.flops, ceiling.output_bytes) == (m, n, k, flops, 2)


def test_short_k_pays_its_epilogue_as_the_h100_sweep_shows():
    """8192^3 and 6144 x 12288 x 12288 both fill their last wave of 128x256 tiles 97%; the sweep
    measures the longer k 4.8% faster (1351.4 against 1290.1 TFLOPS). Main loops alone would give
    the two the same rate; the epilogue, one wave's 132 tiles of 64 KiB written per 128 x 256 x k
    of main loop, makes the difference, and the model's is within a point of the measured one."""
    short = modelled_flops("H100-SXM", 8192, 8192, 8192, fp8=True)
    long = modelled_flops("H100-SXM", 6144, 12288, 12288, fp8=True)
    assert long / short == pytest.approx(1351.4 / 1290.1, abs=0.01)


# Stas Bekman's MAMF table (stas00/ml-engineering compute/accelerator/README.md, two editions):
# mamf-finder.py times each torch.mm (or torch._scaled_mm) call alone, between a 256 MiB write that
# flushes L2 and a copy into C, and reports the best shape of a search. A GEMM that holds the GPU a
# fraction of the time runs at a clock the power limit would not allow it back to back (Horace He
# measured 258 TFLOPS with random inputs and 295 with zeros on one A100: power sets the clock), and
# the best of thousands of shapes is an upper tail. So the sustained model sits below every row,
# by up to 27% (H200 FP8 at 1280 x 4096 x 12032: 160 tiles of 128x256 in two waves of 132, 61%
# full, where MAMF's search found its best; Hopper's persistent kernels evidently do not quantise
# there, which the model, fitted to Azure's sweeps of square shapes, does not know).
MAMF_ROWS = [
    ("A100-SXM-80GB", (6912, 16384, 2048), 267.9e12, False),  # A100 SXM, CUDA 12.1
    ("A100-SXM-80GB", (1024, 10240, 5120), 271.2e12, False),  # A100 SXM, torch 2.6.0+cu126
    ("A100-SXM-80GB", (2304, 5120, 1536), 256.4e12, False),  # A100 PCIe (108 SMs, 1410 MHz), CUDA 12.1
    ("A100-SXM-80GB", (2048, 5120, 6144), 252.9e12, False),  # A100 PCIe, torch 2.5.1+cu124
    ("H100-SXM", (6144, 17920, 2816), 792.1e12, False),  # H100 SXM, CUDA 12.1
    ("H100-SXM", (11264, 19712, 1536), 821.0e12, False),  # GH200 (132 SMs), CUDA 12.1
    ("H100-SXM", (1024, 15360, 4096), 828.6e12, False),  # GH200 900 W, torch 2.6.0+cu126
    ("H100-SXM", (1024, 9216, 14336), 1402.6e12, True),  # H100 SXM FP8, torch 2.7.0+cu126
    ("H100-SXM", (1024, 14336, 14336), 1535.0e12, True),  # GH200 900 W FP8, torch 2.6.0+cu126
    ("H200", (1280, 4096, 12032), 1453.4e12, True),  # H200 SXM FP8, torch 2.7.1+cu128
]


@pytest.mark.parametrize("name,shape,measured,fp8", MAMF_ROWS)
def test_the_sustained_model_is_below_the_best_of_search_mamf_rows(name, shape, measured, fp8):
    ratio = modelled_flops(name, *shape, fp8=fp8) / measured
    assert 0.72 <= ratio <= 1.0


def test_the_calibration_doc_prints_the_model_as_it_is():
    """docs/calibration.md's GEMM table is what bench/gemm_sweeps.py prints now (--write wrote it)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gemm_sweeps import BEGIN, DOC, END, table

    doc = DOC.read_text()
    assert doc[doc.index(BEGIN) + len(BEGIN) : doc.index(END)].strip() == table()
