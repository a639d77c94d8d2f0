"""One kernel as the per-kernel compute model times it: the record every item's kernel list, the
optimizer's passes and the step-time breakdown by kernel class are made of."""

from __future__ import annotations

from dataclasses import dataclass

KERNEL_CLASSES = ("gemm", "attention_core", "elementwise", "optimizer")
Pair = tuple[list["Kernel"], list["Kernel"]]  # a piece's forward kernels and its backward kernels


@dataclass(frozen=True)
class Kernel:
    """One kernel: its class, the part of a step it belongs to (F forward, B input gradient and
    element-wise backward, W weight gradient), its time, the model FLOPs it accounts for
    (Megatron's count: GEMMs and the attention core; 0 for element-wise kernels) and, for a weight
    gradient, the weight's elements (what accumulating it over microbatches moves)."""

    name: str
    klass: str
    part: str
    time_s: float
    flops: float = 0.0
    weights: float = 0.0
