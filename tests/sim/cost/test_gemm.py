"""The GEMM and element-wise kernel times of sim.cost.gemm: wave and tile quantisation and the
epilogue in closed form (the published sweeps are test_gemm_sweeps.py's)."""

import dataclasses

import pytest

from clustersim.sim.cost import gemm
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.hardware import GPUS

A100, A100_GPU = CHIPS["A100-SXM-80GB"], GPUS["A100-SXM-80GB"]
H100, H100_GPU = CHIPS["H100-SXM"], GPUS["H100-SXM"]


def test_one_tile_more_than_units_takes_two_waves():
    assert gemm.waves(108, 108) == 1
    assert gemm.waves(109, 108) == 2
    assert gemm.waves(216, 108) == 2
    assert gemm.tile_count(257, 128, (256, 128)) == 2  # a partial tile costs a whole one
    assert gemm.tile_count(256, 128, (256, 128), batch=3) == 3


def test_gemm_time_doubles_when_the_tiles_spill_into_a_second_wave():
    """One tile shape only: n = 128 x units is one wave, 128 x (units + 1) two of the same length,
    each a full wave's main loops and epilogue (k = 8192 keeps both compute-bound: 237 MB of
    operands take 147 us, a wave 228 us)."""
    chip = dataclasses.replace(A100, tiles=((256, 128),), launch_overhead_s=0.0)
    one = gemm.gemm_time_s(chip, A100_GPU, 256, 128 * 108, 8192)
    two = gemm.gemm_time_s(chip, A100_GPU, 256, 128 * 109, 8192)
    assert two == pytest.approx(2 * one, rel=1e-12)


def test_the_library_picks_the_tile_that_finishes_first():
    """109 tiles of 256x128 take 2 waves; 218 tiles of 128x128 take 3 waves of half the work and
    half the epilogue: 1.5."""
    chip = dataclasses.replace(A100, launch_overhead_s=0.0)
    one = gemm.gemm_time_s(chip, A100_GPU, 256, 128 * 108, 8192)
    spilled = gemm.gemm_time_s(chip, A100_GPU, 256, 128 * 109, 8192)
    assert spilled == pytest.approx(1.5 * one, rel=1e-12)


@pytest.mark.parametrize(
    "name,fp8", [("A100-SXM-80GB", False), ("H100-SXM", False), ("H100-SXM", True), ("H200", True)]
)
def test_the_main_loop_rate_reproduces_the_measured_ceiling(name, fp8):
    chip, gpu = CHIPS[name], GPUS[name]
    c = chip.fp8_matmul_ceiling if fp8 else chip.matmul_ceiling
    t = gemm.gemm_time_s(dataclasses.replace(chip, launch_overhead_s=0.0), gpu, c.m, c.n, c.k, fp8=fp8)
    assert 2 * c.m * c.n * c.k / t == pytest.approx(c.flops, rel=1e-12)


def test_a_wave_is_its_main_loops_then_its_epilogue():
    """One wave of 108 tiles of 256x128 at k = 8192: each unit's 2 x 256 x 128 x 8192 FLOPs at the
    main loop's rate, then 108 x 256 x 128 results of 2 bytes written at the achievable HBM
    bandwidth (1.61 TB/s, Azure's BabelStream Copy on an A100 80 GB): 7.08 MB in 4.40 us."""
    chip = dataclasses.replace(A100, tiles=((256, 128),), launch_overhead_s=0.0)
    mainloop_s = 2.0 * 256 * 128 * 8192 / gemm.mainloop_rate(chip, A100_GPU)
    epilogue_s = 108 * 256 * 128 * 2 / 1.61e12
    assert gemm.gemm_time_s(chip, A100_GPU, 256, 128 * 108, 8192) == pytest.approx(mainloop_s + epilogue_s, rel=1e-12)


def test_a_gemm_of_few_tiles_writes_only_those():
    """Ten tiles: the epilogue writes ten tiles' results, not a full wave's."""
    chip = dataclasses.replace(A100, tiles=((256, 128),), launch_overhead_s=0.0)
    mainloop_s = 2.0 * 256 * 128 * 8192 / gemm.mainloop_rate(chip, A100_GPU)
    epilogue_s = 10 * 256 * 128 * 2 / 1.61e12
    assert gemm.gemm_time_s(chip, A100_GPU, 256, 1280, 8192) == pytest.approx(mainloop_s + epilogue_s, rel=1e-12)


def test_horace_hes_2022_cublas_measurement_within_two_percent():
    """The A100 rows ran 2021-22 cuBLAS: Horace He measured 8192^3 at 258 TFLOPS with randn inputs
    (thonking.ai, "Strangely, Matrix Multiplications on GPUs Run Faster When Given 'Predictable'
    Data!", a 2022 run); the model, anchored on Azure's 2024 sweep, is within 2% of it."""
    m = n = k = 8192
    assert 2 * m * n * k / gemm.gemm_time_s(A100, A100_GPU, m, n, k) == pytest.approx(258e12, rel=0.02)


def test_a_thin_gemm_is_bound_by_its_hbm_traffic():
    """(128 x 512) x (512 x 13824): one wave of 128x128 tiles computes in 6.8 us, its 17.8 MB of
    operands take 11.1 us to stream."""
    m, n, k = 128, 13824, 512
    traffic = (m * k + k * n + m * n) * 2
    expected = traffic / (A100_GPU.hbm_bandwidth_Bps * A100.hbm_efficiency) + A100.launch_overhead_s
    assert gemm.gemm_time_s(A100, A100_GPU, m, n, k) == pytest.approx(expected, rel=1e-12)


def test_an_elementwise_kernel_streams_at_the_achievable_bandwidth():
    """At BabelStream's Copy rate on an A100 80 GB (1.61 TB/s, Azure's ND A100 v4 page) plus the launch gap."""
    nbytes = 1e9
    expected = nbytes / 1.61e12 + 1e-6
    assert gemm.elementwise_time_s(A100, A100_GPU, nbytes) == pytest.approx(expected, rel=1e-12)
    assert gemm.elementwise_time_s(A100, A100_GPU, 0.0) == 0.0


def test_a_chip_without_a_measured_ceiling_has_no_kernel_model():
    with pytest.raises(ValueError, match="no published matmul measurement"):
        gemm.gemm_time_s(CHIPS["TPU-v4"], GPUS["TPU-v4"], 1024, 1024, 1024)


def test_an_accumulating_gemm_reads_and_writes_fp32_results_in_its_epilogue():
    """A weight gradient added into its FP32 buffer (C = C + A B, Megatron's gradient-accumulation
    fusion): the same main loops, and an epilogue of 4 bytes read and 4 written per result, four
    times the 2 bytes a BF16 result writes: 108 x 256 x 128 x 8 bytes, 17.6 us at 1.61 TB/s."""
    chip = dataclasses.replace(A100, tiles=((256, 128),), launch_overhead_s=0.0)
    mainloop_s = 2.0 * 256 * 128 * 8192 / gemm.mainloop_rate(chip, A100_GPU)
    epilogue_s = 108 * 256 * 128 * 8 / 1.61e12
    accumulating = gemm.gemm_time_s(chip, A100_GPU, 256, 128 * 108, 8192, accumulate_fp32=True)
    assert accumulating == pytest.approx(mainloop_s + epilogue_s, rel=1e-12)
