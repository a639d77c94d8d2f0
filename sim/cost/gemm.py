"""How long one kernel takes on one accelerator, from its shape: GEMMs by tiles and waves over the
compute units, element-wise kernels by HBM traffic, flash attention by its matmuls and its
exponentials, every kernel plus a launch gap.

A GEMM C (m x n) = A (m x k) B (k x n), batched `batch` times, runs as output tiles of (tm x tn),
one per compute unit at a time (NVIDIA, "Matrix Multiplication Background User's Guide", sections
2.3 and 3): tiles = batch x ceil(m / tm) x ceil(n / tn), waves = ceil(tiles / units), and each
wave takes one tile's work, 2 tm tn k FLOPs, at a unit's share of the peak times the main loop's
efficiency. Tile quantisation (a partial tile costs a whole one) and wave quantisation (tiles =
units + 1 take two waves) follow. The library picks the tile that finishes first (cuBLAS's
heuristics aim at that); a GEMM too thin to be compute-bound is bound by moving its operands
through HBM instead.

The main loop's efficiency is not a guess: it is the one number that makes this model reproduce
the chip's measured matmul ceiling (sim.scenario.chips.MatmulCeiling) at the shape that reached it.
"""

from __future__ import annotations

import functools
import math

from clustersim.sim.scenario.chips import ChipSpec
from clustersim.sim.scenario.hardware import GpuSpec


def tile_count(m: int, n: int, tile: tuple[int, int], batch: int = 1) -> int:
    """Output tiles of a batch of (m x n) results cut into (tm x tn) tiles, partial ones whole."""
    return batch * math.ceil(m / tile[0]) * math.ceil(n / tile[1])


def waves(tiles: int, units: int) -> int:
    """Rounds of `units` tiles at a time it takes to compute `tiles` tiles (the last may be partial)."""
    return math.ceil(tiles / units)


def _tile_flops(m: int, n: int, k: int, tile: tuple[int, int], units: int, batch: int) -> float:
    """FLOPs one unit computes, wave after wave, for the whole GEMM: waves x 2 tm tn k."""
    return waves(tile_count(m, n, tile, batch), units) * 2.0 * tile[0] * tile[1] * k


@functools.cache
def mainloop_efficiency(chip: ChipSpec, gpu: GpuSpec) -> float:
    """Fraction of a unit's peak a GEMM's main loop sustains: the measured ceiling's FLOPs over its
    time, divided by what this model's waves would do at full peak (its best tile). Raises for a
    chip without a published ceiling."""
    c = chip.matmul_ceiling
    if c is None:
        raise ValueError(f"{gpu.name} has no published matmul measurement: the kernel model cannot time it")
    unit_peak = gpu.peak_flops / chip.compute_units
    ceiling_s = 2.0 * c.m * c.n * c.k / c.flops
    at_peak_s = min(_tile_flops(c.m, c.n, c.k, t, chip.compute_units, 1) for t in chip.tiles) / unit_peak
    return at_peak_s / ceiling_s


def memory_bound_s(chip: ChipSpec, gpu: GpuSpec, nbytes: float) -> float:
    """Time to stream `nbytes` through HBM at the achievable bandwidth."""
    return nbytes / (gpu.hbm_bandwidth_Bps * chip.hbm_efficiency)


def gemm_time_s(
    chip: ChipSpec, gpu: GpuSpec, m: int, n: int, k: int, batch: int = 1, dtype_bytes: int = 2, fp8: bool = False
) -> float:
    """One (batched) GEMM kernel: the best tile's waves at the sustained per-unit rate, or the HBM
    traffic of A, B and C if that is slower, plus the launch gap. `fp8`: A and B in FP8 (1 byte),
    C in `dtype_bytes` (Transformer Engine's FP8 GEMMs write BF16), computed `fp8_speedup` times
    faster than the same tiles and waves in BF16."""
    if min(m, n, k, batch) <= 0:
        return 0.0
    rate = gpu.peak_flops / chip.compute_units * mainloop_efficiency(chip, gpu)  # FLOP/s per unit
    compute_s = min(_tile_flops(m, n, k, t, chip.compute_units, batch) for t in chip.tiles) / rate
    operand_bytes = dtype_bytes
    if fp8:
        compute_s /= fp8_speedup(chip, gpu)
        operand_bytes = 1
    traffic = batch * ((m * k + k * n) * operand_bytes + m * n * dtype_bytes)
    return max(compute_s, memory_bound_s(chip, gpu, traffic)) + chip.launch_overhead_s


def fp8_speedup(chip: ChipSpec, gpu: GpuSpec) -> float:
    """How much faster an FP8 GEMM runs than the same one in BF16: the ratio of the measured FP8
    and BF16 matmul ceilings. Not the datasheet's 2x, and not the FP8 ceiling put through the
    tiles above: the FP8 ceiling's shape (1024 x 9216 x 14336 on H100) would fill its last wave
    less than half under those tiles, yet it is the best shape measured, so FP8 kernels do not
    quantise as the BF16 tiles do; a ratio of ceilings keeps the model's best FP8 shape at the
    measured best. Raises for a chip without a measured FP8 ceiling."""
    if chip.fp8_matmul_ceiling is None or chip.matmul_ceiling is None:
        raise ValueError(f"{gpu.name} has no published FP8 matmul measurement: no FP8 GEMMs")
    return chip.fp8_matmul_ceiling.flops / chip.matmul_ceiling.flops


def elementwise_time_s(chip: ChipSpec, gpu: GpuSpec, nbytes: float) -> float:
    """A memory-bound kernel (norms, activations, dropout, softmax, optimizer): its HBM traffic."""
    return memory_bound_s(chip, gpu, nbytes) + chip.launch_overhead_s if nbytes > 0 else 0.0


FLASH_BLOCK = 128  # query and key rows per block (FlashAttention-2, Dao 2023, arXiv:2307.08691, A100 forward)


def flash_attention_time_s(
    chip: ChipSpec, gpu: GpuSpec, heads: int, s: int, d: int, matmuls: int, exp_passes: int, causal: bool = True
) -> float:
    """One fused attention kernel over `heads` (batch x heads) sequences of s tokens, head dim d:
    each (head, query block) is a tile that walks the key blocks (all, or those at or below the
    diagonal when causal), doing `matmuls` (s_q x s_k x d) products per block pair (2 forward:
    Q K^T and P V; 5 backward) and `exp_passes` exponentials per score. FlashAttention-2 runs its
    softmax between the matmuls, not beside them (Dao 2023 section 3), so the special-function
    time adds: exponentials at chip.exp_per_clock per unit per clock."""
    if chip.exp_per_clock is None:
        raise ValueError(f"{gpu.name}: no special-function rate, no fused-attention model")
    blocks = math.ceil(s / FLASH_BLOCK)
    pairs = blocks * (blocks + 1) // 2 if causal else blocks * blocks  # key blocks per head, summed over query blocks
    units, rate = chip.compute_units, gpu.peak_flops / chip.compute_units * mainloop_efficiency(chip, gpu)
    per_pair = matmuls * 2.0 * FLASH_BLOCK * FLASH_BLOCK * d  # FLOPs of one (query block, key block)
    # tiles are (head, query block); their key-block walks differ in length, spread evenly over the units
    matmul_s = math.ceil(heads * pairs / units) * per_pair / rate
    exp_s = exp_passes * heads * pairs * FLASH_BLOCK * FLASH_BLOCK / (units * chip.exp_per_clock * chip.boost_clock_hz)
    return matmul_s + exp_s + chip.launch_overhead_s
