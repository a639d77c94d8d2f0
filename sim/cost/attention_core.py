"""The unfused attention core's kernels (scores, softmax, dropout and context of a/t heads, as
Megatron-LM ran them before flash attention) and how fast they stream HBM.

For b a/t sequences of s tokens, head dim d (Megatron-LM's CoreAttention of 2021-22):

    scores   S = Q K^T, batched b a/t times (s x s x d): writes the (s x s) scores
    softmax  fused scale-mask-softmax over (b a/t s s): read and write (2 dt)
    dropout  read, write and a 1-byte mask (2 dt + 1); none at attention dropout 0
    context  O = P V (s x d x s): reads the (s x s) probabilities

All of them are bound by HBM, not by the tensor cores: the GEMMs' inner dimension is the head dim
(64-128) and their traffic is the s x s matrix. The share of the datasheet bandwidth they reach is
not a copy kernel's (chips.HBM_EFFICIENCY): it is measured for the whole core on the chip
(chips.AttentionMeasurement), and `unfused_hbm_efficiency` turns that measurement into the share
this model's byte counts imply, one for the forward kernels and one for the backward, as
sim.cost.gemm.mainloop_rate does for the matmul ceiling.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from clustersim.sim.cost.kernel import Kernel, Pair
from clustersim.sim.scenario.chips import AttentionMeasurement

if TYPE_CHECKING:
    from clustersim.sim.cost.kernels import LayerKernels


def unfused_core(layer: LayerKernels) -> Pair:
    """The unfused core's forward and backward kernels on this layer's chip and shapes: at the
    measured share of HBM bandwidth where the chip has a measurement, else at a copy kernel's."""
    measured = layer.chip.unfused_attention
    if measured is None:
        return _unfused(layer)
    forward_eff, backward_eff = unfused_hbm_efficiency(layer, measured)
    forward, _ = _unfused(layer.on_chip(dataclasses.replace(layer.chip, hbm_efficiency=forward_eff)))
    _, backward = _unfused(layer.on_chip(dataclasses.replace(layer.chip, hbm_efficiency=backward_eff)))
    return forward, backward


def unfused_hbm_efficiency(layer: LayerKernels, measured: AttentionMeasurement) -> tuple[float, float]:
    """(forward, backward) share of the datasheet HBM bandwidth the unfused core's kernels reach:
    the share at which this model's kernels for the measured shapes, on the measured GPU and
    without launch gaps, take the measured time. Their time falls as the share rises (each is bound
    by HBM, or a GEMM whose epilogue streams through it), so halving the interval finds it."""
    gpu = dataclasses.replace(layer.gpu, name=measured.gpu, hbm_bandwidth_Bps=measured.hbm_bandwidth_Bps)
    shapes = dataclasses.replace(
        layer.sh,
        micro_batch=measured.batch,
        seq_len=measured.seq_len,
        heads=measured.heads,
        hidden=measured.heads * measured.head_dim,
        q_hidden=None,  # the measured heads' width, not the scenario's
        attention_dropout=measured.attention_dropout,
        tp=1,
        dtype_bytes=measured.dtype_bytes,
    )

    def seconds(share: float, backward: bool) -> float:
        chip = dataclasses.replace(layer.chip, hbm_efficiency=share, launch_overhead_s=0.0, unfused_attention=None)
        return _seconds(_unfused(type(layer)(chip, gpu, shapes))[backward])

    def solve(backward: bool, target_s: float) -> float:
        low, high = 1e-3, 1.0
        for _ in range(60):  # 2^-60 of the interval: exact to float precision
            mid = (low + high) / 2
            low, high = (mid, high) if seconds(mid, backward) > target_s else (low, mid)
        return (low + high) / 2

    return solve(False, measured.forward_s), solve(True, measured.backward_s)


def _seconds(kernels: list[Kernel]) -> float:
    return sum(k.time_s for k in kernels)


def _unfused(layer: LayerKernels) -> Pair:
    sh, dt = layer.sh, layer.sh.dtype_bytes
    heads = sh.micro_batch * sh.heads // sh.tp  # (batch x heads) per rank
    s, d = sh.seq_len, sh.head_width
    scores = layer.gemm_pair("scores Q K^T", s, s, d, heads, "attention_core", weights=False)  # (s x s) per head
    softmax = layer.elementwise("softmax", heads * s * s, 2 * dt, 3 * dt, "attention_core")  # fused scale-mask-softmax
    context = layer.gemm_pair("context P V", s, d, s, heads, "attention_core", weights=False)  # (s x d) per head
    if not sh.attention_dropout:
        joined = layer.join(scores, softmax, context)
        return list(joined.forward), list(joined.backward)
    dropout = layer.elementwise("attention dropout", heads * s * s, 2 * dt + 1, 2 * dt + 1, "attention_core")
    joined = layer.join(scores, softmax, dropout, context)
    return list(joined.forward), list(joined.backward)
