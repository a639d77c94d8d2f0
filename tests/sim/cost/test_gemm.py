"""The GEMM and element-wise kernel times of sim.cost.gemm: wave and tile quantisation in closed
form, and published matmul measurements at shapes the model was not derived from."""

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
    """One tile shape only: n = 128 x units is one wave, 128 x (units + 1) two of the same length
    (k = 8192 keeps both compute-bound: 237 MB of operands take 147 us, a wave 216 us)."""
    chip = dataclasses.replace(A100, tiles=((256, 128),), launch_overhead_s=0.0)
    one = gemm.gemm_time_s(chip, A100_GPU, 256, 128 * 108, 8192)
    two = gemm.gemm_time_s(chip, A100_GPU, 256, 128 * 109, 8192)
    assert two == pytest.approx(2 * one, rel=1e-12)


def test_the_library_picks_the_tile_that_finishes_first():
    """109 tiles of 256x128 take 2 waves; 218 tiles of 128x128 take 3 waves of half the work: 1.5."""
    chip = dataclasses.replace(A100, launch_overhead_s=0.0)
    one = gemm.gemm_time_s(chip, A100_GPU, 256, 128 * 108, 8192)
    spilled = gemm.gemm_time_s(chip, A100_GPU, 256, 128 * 109, 8192)
    assert spilled == pytest.approx(1.5 * one, rel=1e-12)


def test_the_main_loop_efficiency_reproduces_the_measured_ceiling():
    for chip, gpu in ((A100, A100_GPU), (H100, H100_GPU)):
        c = chip.matmul_ceiling
        t = gemm.gemm_time_s(dataclasses.replace(chip, launch_overhead_s=0.0), gpu, c.m, c.n, c.k)
        assert 2 * c.m * c.n * c.k / t == pytest.approx(c.flops, rel=1e-12)


@pytest.mark.parametrize(
    "chip,gpu,shape,measured",
    [
        # stas00/ml-engineering compute/accelerator/README.md, MAMF table: A100 PCIe (the same 108
        # SMs at 1410 MHz) 256.4 TFLOPS at 2304x5120x1536, a shape where 360 tiles of 256x128 would
        # fill 4 waves of 108 only 83%: the model must pick 128x128 (720 tiles, 7 waves, 95%).
        (A100, A100_GPU, (2304, 5120, 1536), 256.4e12),
        # The same table's GH200 row (the H100 of a Grace Hopper module, 132 SMs): 821.0 TFLOPS at
        # 11264x19712x1536. A GH200 may draw more power than an H100 SXM, so the bound is wider.
        (H100, H100_GPU, (11264, 19712, 1536), 821.0e12),
    ],
)
def test_published_matmul_throughput_within_five_percent(chip, gpu, shape, measured):
    m, n, k = shape
    predicted = 2 * m * n * k / gemm.gemm_time_s(chip, gpu, m, n, k)
    assert predicted == pytest.approx(measured, rel=0.05)


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


def test_causal_flash_attention_walks_half_the_blocks_and_adds_its_exponentials():
    """16 heads of s = 128 x 8 tokens: 8 x 9 / 2 = 36 block pairs per head (not 64), their
    exponentials at 16 per clock per SM beside the two matmuls per pair."""
    chip = dataclasses.replace(A100, launch_overhead_s=0.0)
    heads, s, d = 16, 1024, 128
    pairs = heads * 36
    rate = A100_GPU.peak_flops / 108 * gemm.mainloop_efficiency(A100, A100_GPU)
    matmul_s = -(-pairs // 108) * 2 * 2.0 * 128 * 128 * d / rate
    exp_s = pairs * 128 * 128 / (108 * 16 * 1.41e9)
    assert gemm.flash_attention_time_s(chip, A100_GPU, heads, s, d, 2, 1) == pytest.approx(matmul_s + exp_s, rel=1e-12)


def test_a_chip_without_a_measured_ceiling_has_no_kernel_model():
    with pytest.raises(ValueError, match="no published matmul measurement"):
        gemm.gemm_time_s(CHIPS["TPU-v4"], GPUS["TPU-v4"], 1024, 1024, 1024)
