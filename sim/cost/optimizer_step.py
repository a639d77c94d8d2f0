"""Megatron-LM's mixed-precision optimizer step as the separate passes over HBM it makes (the
per-kernel compute model's OPT op), and the gradient accumulation a backward pays on top of its
GEMMs: bytes per parameter, read from the code the calibration runs used.

bf16: Megatron-LM of mid-2022 (NVIDIA/Megatron-LM 55ba1f7, the sequence-parallel code of
Korthikanti et al. 2022). arguments.py forces --accumulate-allreduce-grads-in-fp32 for bf16, so
local DDP keeps one contiguous fp32 gradient buffer (model/distributed.py) and the weight-gradient
GEMM accumulates straight into it (--gradient-accumulation-fusion, on by default: mpu/layers.py
wgrad_gemm_accum_fp32), so a backward pays no separate accumulation; no loss scaler without
--loss-scale (optimizer/__init__.py). Per step (training.py train_step, optimizer/optimizer.py
Float16OptimizerWithFloat16Params.step):

    zero_grad_buffer          write the fp32 buffer                                  4
    allreduce_gradients       buffer /= data-parallel size (also at size 1): r+w     8
    copy to main grads        main_grad.float() is the fp32 buffer itself            0
    clip_grad_norm_fp32       multi_tensor_l2norm reads the fp32 gradients           4
    FusedAdam (apex)          read gradient, weight, m, v; write weight, m, v       28
    copy main to model        read the fp32 weight, write the bf16 one               6
                                                                                   = 50

fp16: Megatron-LM v2.5 (August 2021) with NVIDIA's script for Narayanan et al. 2021 Table 1
(examples/sc21: --fp16 --loss-scale 8192 --clip-grad 1.0; local DDP without contiguous buffers,
the default then, for the rows with a pipeline): gradients stay fp16 in param.grad, which
autograd accumulates over microbatches (AccumulateGrad: grad += new, read 2 + 2, write 2, for
every microbatch after the first). The rows without a pipeline ran torch DDP, whose reducer
copies the gradients into its buckets, dividing on the way (PyTorch's c10d reducer.cpp,
copy_grad_to_bucket), and back: 8 B where the first line below counts 12 (about 0.1% of those
steps; one description for both). Per step:

    allreduce_gradients       flatten (r+w 4), /= dp size (4), copy back (4)        12
    copy to main grads        fp16 -> fp32 .float(): read 2, write 4                 6
    unscale, check for inf    _amp_foreach_non_finite_check_and_unscale_: r+w        8
    clip_grad_norm_fp32       multi_tensor_l2norm                                    4
    FusedAdam (apex)                                                                28
    copy main to model        multi_tensor_scale: read 4, write 2                     6
                                                                                   = 64

Left out: the clip itself (multi_tensor_scale, read and write 8) runs only when the norm exceeds
the limit, which depends on the run's gradients; the few scalar all-reduces and .item()
synchronisations between the passes. fp32 (the 2022 code's FP32Optimizer over a contiguous fp32
buffer) pays the bf16 passes but the copy, 44. With ZeRO the OPT op covers the rank's shard, and so do these passes.
"""

from __future__ import annotations

from clustersim.sim.cost import gemm
from clustersim.sim.cost.compute import ADAM_BYTES_PER_PARAM
from clustersim.sim.cost.kernel import Kernel
from clustersim.sim.scenario.chips import ChipSpec
from clustersim.sim.scenario.hardware import GpuSpec

ADAM = ("FusedAdam", 28)
GRAD_NORM = ("gradient norm", 4)
OPTIMIZER_PASSES: dict[str, tuple[tuple[str, int], ...]] = {
    "bf16": (("zero gradient buffer", 4), ("gradient /= dp", 8), GRAD_NORM, ADAM, ("copy to bf16 weights", 6)),
    "fp16": (
        ("gradient flatten, /= dp, copy back", 12),
        ("gradients to fp32", 6),
        ("unscale and check for inf", 8),
        GRAD_NORM,
        ADAM,
        ("copy to fp16 weights", 6),
    ),
    "fp32": (("zero gradient buffer", 4), ("gradient /= dp", 8), GRAD_NORM, ADAM),
}


def accumulation_bytes(dtype: str, first: bool) -> int:
    """Bytes per weight element a backward adds to sum its weight gradients into its stage's
    earlier ones (`first`: its stage's first backward of the step): fp16, autograd's grad += new
    (3 x 2 bytes) after the first; fp32, local DDP's hook main_grad.add_(grad) (3 x 4) on every one
    (no fusion without fp32 accumulation of 16-bit gradients); bf16, none (inside the GEMM)."""
    if dtype == "fp16":
        return 0 if first else 6
    return 12 if dtype == "fp32" else 0


def optimizer_kernels(chip: ChipSpec, gpu: GpuSpec, nbytes: float, dtype: str) -> list[Kernel]:
    """The optimizer step of the parameters an OPT op covers (its bytes are
    ADAM_BYTES_PER_PARAM per parameter, the roofline's count) as Megatron-LM's passes for `dtype`."""
    params = nbytes / ADAM_BYTES_PER_PARAM
    return [
        Kernel(name, "optimizer", "F", gemm.elementwise_time_s(chip, gpu, params * per_param))
        for name, per_param in OPTIMIZER_PASSES[dtype]
    ]


def accumulation_kernels(chip: ChipSpec, gpu: GpuSpec, weights: float, per_weight: int) -> list[Kernel]:
    """One pass over a backward's `weights` weight-gradient elements at `per_weight` bytes each
    (accumulation_bytes), or nothing."""
    if weights * per_weight <= 0:
        return []
    return [
        Kernel("gradient accumulation", "elementwise", "W", gemm.elementwise_time_s(chip, gpu, weights * per_weight))
    ]
