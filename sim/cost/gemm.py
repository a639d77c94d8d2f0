"""How long one kernel takes on one accelerator, from its shape: GEMMs by tiles and waves over the
compute units, element-wise kernels by HBM traffic, every kernel plus a launch gap (fused attention:
sim.cost.flash_attention).

A GEMM C (m x n) = A (m x k) B (k x n), batched `batch` times, runs as output tiles of (tm x tn),
one per compute unit at a time (NVIDIA, "Matrix Multiplication Background User's Guide", sections
2.3 and 3): tiles = batch x ceil(m / tm) x ceil(n / tn), waves = ceil(tiles / units). Each wave
runs its tiles' main loops, 2 tm tn k FLOPs each at a unit's sustained rate, and then their
epilogues, which write the wave's finished tiles to HBM: a unit holding one output tile at a time
(the guide's section 3.2) starts its next main loop only after that store, and the wave's units
store at once, so a wave's epilogue takes min(tiles, units) x tm x tn x output bytes at the
achievable HBM bandwidth. That per-tile cost is why short-k GEMMs fall short of long ones: on an
H100 in FP8 a 128 x 256 tile's main loop at k = 2048 takes 13 us and its wave's epilogue 3 us
(Azure's cuBLASLt sweep, sim.scenario.gemm_sweeps: 2048^3 runs at 73% of 32768^3's rate). Tile
quantisation (a partial tile costs a whole one) and wave quantisation (tiles = units + 1 take two
waves) follow. The library picks the tile that finishes first (cuBLAS's heuristics aim at that);
a GEMM too thin to be compute-bound is bound by moving its operands through HBM instead.

The main loop's rate is not a guess: it is the one number that makes this model reproduce the
chip's measured matmul ceiling (sim.scenario.chips.MatmulCeiling) at the shape that reached it,
in BF16 and, from its own ceiling, in FP8.
"""

from __future__ import annotations

import functools
import math

from clustersim.sim.scenario.chips import ChipSpec, MatmulCeiling
from clustersim.sim.scenario.hardware import GpuSpec


def tile_count(m: int, n: int, tile: tuple[int, int], batch: int = 1) -> int:
    """Output tiles of a batch of (m x n) results cut into (tm x tn) tiles, partial ones whole."""
    return batch * math.ceil(m / tile[0]) * math.ceil(n / tile[1])


def waves(tiles: int, units: int) -> int:
    """Rounds of `units` tiles at a time it takes to compute `tiles` tiles (the last may be partial)."""
    return math.ceil(tiles / units)


def epilogue_s(chip: ChipSpec, gpu: GpuSpec, tile: tuple[int, int], tiles: int, output_bytes: int) -> float:
    """One wave's epilogue: its min(tiles, units) output tiles written to HBM at once."""
    return memory_bound_s(chip, gpu, min(tiles, chip.compute_units) * tile[0] * tile[1] * output_bytes)


def _tiled_s(chip: ChipSpec, gpu: GpuSpec, shape: tuple[int, int, int, int], rate: float, output_bytes: int) -> float:
    """The (m, n, k, batch) GEMM's waves of main loop at `rate` FLOP/s per unit and epilogue, best tile."""
    m, n, k, batch = shape
    units = chip.gemm_units or chip.compute_units  # fewer when a collective holds some (ChipSpec.gemm_units)
    best = math.inf
    for tile in chip.tiles:
        count = tile_count(m, n, tile, batch)
        wave_s = 2.0 * tile[0] * tile[1] * k / rate + epilogue_s(chip, gpu, tile, min(count, units), output_bytes)
        best = min(best, waves(count, units) * wave_s)
    return best


def _ceiling(chip: ChipSpec, gpu: GpuSpec, fp8: bool) -> MatmulCeiling:
    """The measured ceiling the main loop's rate comes from; raises for a chip without one."""
    c = chip.fp8_matmul_ceiling if fp8 else chip.matmul_ceiling
    if c is None:
        what = "FP8 matmul measurement: no FP8 GEMMs" if fp8 else "matmul measurement: the kernel model cannot time it"
        raise ValueError(f"{gpu.name} has no published {what}")
    return c


@functools.cache
def mainloop_rate(chip: ChipSpec, gpu: GpuSpec, fp8: bool = False) -> float:
    """FLOP/s one unit's main loop sustains (BF16, or FP8 inputs): the rate at which this model's
    time at the measured ceiling's shape equals the measured time. Each tile's time falls as the
    rate rises, so the model's (their minimum) meets the measurement at the least of the rates
    that make each tile meet it."""
    c = _ceiling(chip, gpu, fp8)
    measured_s = 2.0 * c.m * c.n * c.k / c.flops
    rates = []
    for tile in chip.tiles:
        count = tile_count(c.m, c.n, tile)
        w = waves(count, chip.compute_units)
        mainloop_s = measured_s - w * epilogue_s(chip, gpu, tile, count, c.output_bytes)
        if mainloop_s > 0:
            rates.append(w * 2.0 * tile[0] * tile[1] * c.k / mainloop_s)
    if not rates:
        raise ValueError(f"{gpu.name}: the measured ceiling is faster than its epilogues alone")
    return min(rates)


def memory_bound_s(chip: ChipSpec, gpu: GpuSpec, nbytes: float) -> float:
    """Time to stream `nbytes` through HBM at the achievable bandwidth."""
    return nbytes / (gpu.hbm_bandwidth_Bps * chip.hbm_efficiency)


def gemm_time_s(
    chip: ChipSpec,
    gpu: GpuSpec,
    m: int,
    n: int,
    k: int,
    batch: int = 1,
    dtype_bytes: int = 2,
    fp8: bool = False,
    accumulate_fp32: bool = False,
    split_accumulator: bool = False,
) -> float:
    """One (batched) GEMM kernel: the best tile's waves of main loop and epilogue, or the HBM
    traffic of A, B and C if that is slower, plus the launch gap. `fp8`: A and B in FP8 (1 byte),
    C in `dtype_bytes` (Transformer Engine's FP8 GEMMs write BF16), the main loop at the rate the
    FP8 ceiling gives. `accumulate_fp32`: C = C + A B into an FP32 C (a weight gradient summed into
    its FP32 buffer by the GEMM, Megatron's gradient-accumulation fusion), so the epilogue reads
    and writes 4 bytes per result. `split_accumulator` (FP8): the main loop promotes its partial sums
    to FP32 as it goes, chip.fp8_split_accumulation times slower."""
    if min(m, n, k, batch) <= 0:
        return 0.0
    result_bytes = 8 if accumulate_fp32 else dtype_bytes
    rate = mainloop_rate(chip, gpu, fp8) / (chip.fp8_split_accumulation if fp8 and split_accumulator else 1.0)
    compute_s = _tiled_s(chip, gpu, (m, n, k, batch), rate, result_bytes)
    operand_bytes = 1 if fp8 else dtype_bytes
    traffic = batch * ((m * k + k * n) * operand_bytes + m * n * result_bytes)
    return max(compute_s, memory_bound_s(chip, gpu, traffic)) + chip.launch_overhead_s


def elementwise_time_s(chip: ChipSpec, gpu: GpuSpec, nbytes: float) -> float:
    """A memory-bound kernel (norms, activations, dropout, softmax, optimizer): its HBM traffic."""
    return memory_bound_s(chip, gpu, nbytes) + chip.launch_overhead_s if nbytes > 0 else 0.0
