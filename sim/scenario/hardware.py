"""GPU specs as data, each with its source. A scenario picks one by name and may override fields.

Units are SI (habit 8): FLOP/s, bytes, bytes/s. Peak compute is *dense* BF16/FP16 tensor-core
throughput: NVIDIA datasheets headline the 2:4-sparsity figure, which is twice the dense one,
so a "1,979 TFLOPS*" footnoted "with sparsity" is 989 dense. Memory sizes are the datasheet's
decimal GB (a slight underestimate: an A100-80GB exposes 81920 MiB = 80 GiB); override
`memory` in a scenario to use the exact figure.
"""

from __future__ import annotations

from dataclasses import dataclass

# Fraction of peak a training step achieves on the big matmuls that dominate it. Datasheet peak
# assumes every tensor core busy every cycle at boost clock; real GEMMs lose to tile
# quantisation, wave tails, clock throttling and kernel launch gaps, and the layer FLOPs we
# count (Megatron formulas) also cover attention softmax, layernorms and elementwise ops that
# run far below peak. Measured end-to-end: Megatron-LM reaches ~52% of A100 peak on GPT-3-scale
# models (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
# Clusters", arXiv:2104.04473); PaLM reports 46% MFU (Chowdhery et al. 2022, Table 3).
# 0.5 is that consensus, rounded; a scenario overrides it with gpu_overrides.efficiency.
DEFAULT_EFFICIENCY = 0.5


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator. `peak_flops` is dense BF16/FP16 tensor-core FLOP/s."""

    name: str
    peak_flops: float  # FLOP/s, dense bf16/fp16
    memory_bytes: float  # HBM capacity
    hbm_bandwidth_Bps: float  # HBM bytes/s
    efficiency: float = DEFAULT_EFFICIENCY  # achievable fraction of peak_flops, 0 < e <= 1


_SPECS = (
    # NVIDIA A100 Tensor Core GPU datasheet, "A100 80GB SXM" column:
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    # BF16 Tensor Core 312 TFLOPS (624 with sparsity); 80GB HBM2e; 2,039 GB/s.
    GpuSpec("A100-SXM-80GB", peak_flops=312e12, memory_bytes=80e9, hbm_bandwidth_Bps=2039e9),
    # The same datasheet, "A100 40GB SXM" column: BF16 312 TFLOPS dense; 40GB HBM2; 1,555 GB/s.
    GpuSpec("A100-SXM-40GB", peak_flops=312e12, memory_bytes=40e9, hbm_bandwidth_Bps=1555e9),
    # NVIDIA H100 Tensor Core GPU datasheet, "H100 SXM" column:
    # https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
    # BF16 Tensor Core 1,979 TFLOPS with sparsity -> 989.4 dense (the "NVIDIA H100 Tensor Core
    # GPU Architecture" whitepaper lists 989.4 / 1978.9); 80GB HBM3; 3.35 TB/s.
    GpuSpec("H100-SXM", peak_flops=989.4e12, memory_bytes=80e9, hbm_bandwidth_Bps=3.35e12),
    # NVIDIA H200 product page / datasheet, "H200 SXM" column:
    # https://www.nvidia.com/en-us/data-center/h200/
    # Same GH100 compute as H100 SXM: BF16 1,979 TFLOPS with sparsity -> 989.4 dense;
    # 141GB HBM3e; 4.8 TB/s.
    GpuSpec("H200", peak_flops=989.4e12, memory_bytes=141e9, hbm_bandwidth_Bps=4.8e12),
    # NVIDIA H800 SXM5 (the export variant of H100 SXM: the same GH100 with 132 SMs, BF16 1,979
    # TFLOPS with sparsity -> 989.4 dense, 80GB HBM3 at 3.35 TB/s; NVLink cut to 400 GB/s, which
    # is the fabric's business). DeepSeek-V3 technical report (arXiv:2412.19437) section 3.1
    # trains on it; its NVLink and IB figures are there.
    GpuSpec("H800-SXM", peak_flops=989.4e12, memory_bytes=80e9, hbm_bandwidth_Bps=3.35e12),
    # Google Cloud TPU v4 (cloud.google.com/tpu/docs/v4): peak compute per chip (bf16) 275 TFLOPS;
    # 32 GiB HBM2 at 1,200 GB/s. Two TensorCores of four 128x128 MXUs each.
    GpuSpec("TPU-v4", peak_flops=275e12, memory_bytes=32 * 2**30, hbm_bandwidth_Bps=1200e9),
    # Google Cloud TPU v5p (docs.cloud.google.com/tpu/docs/v5p-training): peak compute per chip
    # (bf16) 459 TFLOPS; HBM2e 95 GB at 2,765 GB/s.
    GpuSpec("TPU-v5p", peak_flops=459e12, memory_bytes=95e9, hbm_bandwidth_Bps=2765e9),
)

# Registry (habit 7): a plain dict; a miss lists the valid names (see sim.scenario).
GPUS: dict[str, GpuSpec] = {spec.name: spec for spec in _SPECS}
