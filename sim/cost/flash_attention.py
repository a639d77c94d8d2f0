"""One fused (flash) attention kernel's time, forward or backward, from its shape: tiles walk
their partner blocks doing block matmuls and exponentials, then store their results as a GEMM's
wave does (sim.cost.gemm), at a matmul rate measured on the chip for that pass.

A tile is a (head, 128-row block): the forward's a query block, which walks the key blocks (all,
or those at or below the diagonal when causal) doing 2 (128 x 128 x d) matmuls per pair (Q K^T,
P V) and one exponential per score, then stores its O rows and their log-sum-exp; the backward's
a key block (FlashAttention-2's backward, Dao 2023, arXiv:2307.08691, section 3.1.2), which walks
the query blocks doing 5 per pair (S = Q K^T again, dP = dO V^T, dV += P^T dO, dK += dS^T Q,
dQ += dS K) and the exponentials of P again, then stores its dK and dV rows. The pairs spread
evenly over the compute units; the exponentials run between the matmuls, not beside them (Dao
2023, section 3); each wave of min(tiles, units) tiles ends by storing its results at the
achievable HBM bandwidth.

The backward does more than the forward per FLOP (its dQ sums through global memory, it keeps
two accumulators, its tiles are smaller), so each pass has its own matmul rate: the one that makes
this model reproduce the chip's measured run of that pass (sim.scenario.chips.FusedAttentionRun),
as sim.cost.gemm.mainloop_rate does for GEMMs. A chip without a measured run uses the GEMM main
loop's rate for both, an upper bound (on the H100 7% above the forward's measured rate and 48%
above the backward's).
"""

from __future__ import annotations

import functools
import math

from clustersim.sim.cost.gemm import mainloop_rate, memory_bound_s, waves
from clustersim.sim.scenario.chips import ChipSpec, FusedAttentionRun
from clustersim.sim.scenario.hardware import GpuSpec

BLOCK = 128  # query and key rows per block (FlashAttention-2, Dao 2023, arXiv:2307.08691, A100 forward)
MATMULS = {False: 2, True: 5}  # block matmuls per (query block, key block) pair: forward, backward
LSE_BYTES = 4  # one fp32 log-sum-exp per query row, stored with the forward's O


def _result_bytes(backward: bool, d: int, dtype_bytes: int) -> int:
    """What one tile stores when its walk ends: O and the log-sum-exp rows, or dK and dV."""
    return 2 * BLOCK * d * dtype_bytes if backward else BLOCK * (d * dtype_bytes + LSE_BYTES)


def _parts_s(
    chip: ChipSpec, gpu: GpuSpec, shape: tuple[int, int, int, int], backward: bool, causal: bool
) -> tuple[float, float]:
    """(matmul FLOPs on the busiest unit, seconds of everything else) of one kernel over `shape`
    = (heads: batch x heads sequences, s, d, dtype bytes)."""
    heads, s, d, dtype_bytes = shape
    if chip.exp_per_clock is None:
        raise ValueError(f"{gpu.name}: no special-function rate, no fused-attention model")
    blocks = math.ceil(s / BLOCK)
    pairs = blocks * (blocks + 1) // 2 if causal else blocks * blocks  # partner blocks per head, summed over tiles
    units, tiles = chip.compute_units, heads * blocks
    busiest_flops = math.ceil(heads * pairs / units) * MATMULS[backward] * 2.0 * BLOCK * BLOCK * d
    exp_s = heads * pairs * BLOCK * BLOCK / (units * chip.exp_per_clock * chip.boost_clock_hz)
    store_s = memory_bound_s(chip, gpu, min(tiles, units) * _result_bytes(backward, d, dtype_bytes))
    return busiest_flops, exp_s + waves(tiles, units) * store_s + chip.launch_overhead_s


def measured_s(run: FusedAttentionRun) -> float:
    """The run's time from its throughput, in the FlashAttention benchmarks' count (Dao-AILab/
    flash-attention benchmarks/benchmark_flash_attention.py): forward 4 b h s^2 d FLOPs, halved
    when causal; backward 2.5 times the forward."""
    forward_flops = 4.0 * run.batch * run.heads * run.seq_len**2 * run.head_dim / (2 if run.causal else 1)
    return forward_flops * (2.5 if run.backward else 1.0) / run.flops


@functools.cache
def pass_rate(chip: ChipSpec, gpu: GpuSpec, backward: bool) -> float:
    """FLOP/s of one unit's block matmuls in this pass: the rate at which the model's time of the
    chip's measured run equals the measurement, else the GEMM main loop's."""
    runs = [r for r in chip.fused_attention if r.backward == backward]
    if not runs:
        return mainloop_rate(chip, gpu)
    run = runs[0]
    shape = (run.batch * run.heads, run.seq_len, run.head_dim, run.dtype_bytes)
    busiest_flops, other_s = _parts_s(chip, gpu, shape, backward, run.causal)
    if measured_s(run) <= other_s:
        raise ValueError(f"{gpu.name}: the measured fused attention is faster than its stores and exponentials")
    return busiest_flops / (measured_s(run) - other_s)


def time_s(
    chip: ChipSpec, gpu: GpuSpec, heads: int, s: int, d: int, backward: bool, causal: bool = True, dtype_bytes: int = 2
) -> float:
    """One fused attention kernel, forward or backward, over `heads` (batch x heads) sequences of
    s tokens with head dim d."""
    busiest_flops, other_s = _parts_s(chip, gpu, (heads, s, d, dtype_bytes), backward, causal)
    return busiest_flops / pass_rate(chip, gpu, backward) + other_s
