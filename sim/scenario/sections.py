"""The scenario's sections other than the model: cluster, training, parallel, numerics, output."""

from __future__ import annotations

import dataclasses
import math
from pathlib import PurePath
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, field_validator, model_validator

from clustersim.sim.collectives.nccl import SYSTEM_OF_GPU, NcclConfig
from clustersim.sim.cost.memory import RECOMPUTE_MODES
from clustersim.sim.scenario.chips import CHIPS
from clustersim.sim.scenario.errors import FieldError, show_value
from clustersim.sim.scenario.fields import Bandwidth, Bytes, Flops, Section, one_of
from clustersim.sim.scenario.hardware import GPUS, GpuSpec
from clustersim.sim.scenario.megatron_section import MegatronSection
from clustersim.sim.scenario.nccl_section import NcclSection
from clustersim.sim.scenario.topology import TopologySection
from clustersim.topologies.kind import MAX_GPUS, FitError, Shape
from clustersim.topologies.registry import TOPOLOGIES

# Sane maxima (STYLE habit 6: every number bounded, the bound in the message). Far above any real
# run, low enough that products of them stay exact integers and finite floats.
MAX_NODES = 2**20
MAX_GPUS_PER_NODE = 2**16
MAX_GLOBAL_BATCH = 2**40
MAX_DEGREE = 2**20  # pp, tp, dp, ep
MAX_VIRTUAL = 1024
MAX_SHADOW_SIZE = 4096  # the shadow model is computed in numpy: small by design
MAX_LR = 100.0
MAX_BIAS = 1e6
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux
MAX_NAME_BYTES = 255  # one folder name (NAME_MAX)

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
NUMERICS_DTYPES = ("float64", "float32")
OPTIMIZERS = ("adam", "sgd")
if TYPE_CHECKING:  # what the checked names are to a type checker; built at run time below
    GpuName = str
    Dtype = str
    NumericsDtype = str
    OptimizerName = str
    Recompute = str
else:
    GpuName = one_of(GPUS, "gpu")
    Dtype = one_of(DTYPE_BYTES, "dtype")
    NumericsDtype = one_of(NUMERICS_DTYPES, "numerics dtype")
    OptimizerName = one_of(OPTIMIZERS, "optimizer")
    Recompute = one_of(RECOMPUTE_MODES, "recompute mode")


class GpuOverrides(Section):
    """Any GpuSpec field; names match GpuSpec so they merge with dataclasses.replace."""

    peak_flops: Flops | None = None
    memory_bytes: Bytes | None = Field(None, alias="memory")
    hbm_bandwidth_Bps: Bandwidth | None = Field(None, alias="hbm_bandwidth")
    efficiency: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)


class ClusterSection(Section):
    gpu: GpuName
    gpu_overrides: GpuOverrides = GpuOverrides()
    nodes: int = Field(1, gt=0, le=MAX_NODES)
    gpus_per_node: int = Field(gt=0, le=MAX_GPUS_PER_NODE)
    topology: TopologySection
    nccl: NcclSection | None = Field(None, description="run collectives as NCCL does (absent: textbook algorithms)")
    compute_model: Literal["roofline", "kernel"] = Field(
        "roofline",
        description="roofline: FLOPs / (peak x gpu efficiency); kernel: each layer as its kernels, "
        "GEMMs by tiles and waves, element-wise kernels by HBM traffic (sim.cost.kernels)",
    )

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @model_validator(mode="after")
    def _topology_fits(self) -> ClusterSection:
        """At most MAX_GPUS GPUs, and the kind's own rule (torus axes multiply to the GPU count,
        dgx is one node, ...)."""
        if self.num_gpus > MAX_GPUS:
            reason = f"{self.nodes:,} x cluster.gpus_per_node {self.gpus_per_node:,} = {self.num_gpus:,} GPUs"
            raise FieldError("nodes", f"{reason}: more than the {MAX_GPUS:,} a fabric may have")
        try:
            TOPOLOGIES[self.topology.kind].fits(self.topology, Shape(self.nodes, self.gpus_per_node))
        except FitError as exc:
            raise FieldError(exc.key, str(exc)) from None
        if self.nccl is not None and self.gpu not in SYSTEM_OF_GPU:
            raise FieldError("nccl", f"NCCL's constants are known for {', '.join(SYSTEM_OF_GPU)}, not {self.gpu}")
        if self.nccl is not None and not TOPOLOGIES[self.topology.kind].nvswitch_nodes:
            kinds = " or ".join(name for name, kind in TOPOLOGIES.items() if kind.nvswitch_nodes)
            raise FieldError("nccl", f"needs NVSwitch nodes (topology kind {kinds}), not {self.topology.kind}")
        if self.compute_model == "kernel" and CHIPS[self.gpu].matmul_ceiling is None:
            measured = ", ".join(name for name, chip in CHIPS.items() if chip.matmul_ceiling is not None)
            raise FieldError(
                "compute_model", f"kernel needs a measured matmul ceiling: known for {measured}, not {self.gpu}"
            )
        return self

    @property
    def nccl_config(self) -> NcclConfig | None:
        """The NCCL layer's settings, None when cluster.nccl is absent."""
        if self.nccl is None:
            return None
        return NcclConfig(SYSTEM_OF_GPU[self.gpu], **self.nccl.model_dump())

    @property
    def gpu_spec(self) -> GpuSpec:
        """The GPUS entry with every non-null override applied."""
        overrides = {k: v for k, v in self.gpu_overrides.model_dump().items() if v is not None}
        return dataclasses.replace(GPUS[self.gpu], **overrides)


class TrainingSection(Section):
    global_batch: int = Field(gt=0, le=MAX_GLOBAL_BATCH, description="sequences per optimizer step")
    micro_batch: int = Field(gt=0, le=MAX_GLOBAL_BATCH, description="sequences per microbatch")
    dtype: Dtype = "bf16"
    recompute: Recompute = Field(
        "none",
        description="activation recomputation: none, selective (attention "
        "core, Korthikanti et al.), full (whole layer)",
    )
    flash_attention: bool = Field(
        False,
        description="the attention core as one fused flash-attention kernel: its time (cluster.compute_model: "
        "kernel) and its memory (no s x s scores kept, under either compute model)",
    )
    fp8: bool = Field(
        False,
        description="the transformer layers' linear GEMMs on FP8 operands, as Transformer Engine runs them "
        "(cluster.compute_model: kernel, a GPU with FP8 tensor cores)",
    )

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


class ParallelSection(Section):
    pp: int = Field(1, gt=0, le=MAX_DEGREE, description="pipeline-parallel stages")
    tp: int = Field(1, gt=0, le=MAX_DEGREE, description="tensor-parallel ranks (Megatron column/row split)")
    sequence_parallel: bool = Field(
        False,
        description="split layernorm/dropout regions along the sequence: "
        "all-reduces become reduce-scatter + all-gather",
    )
    dp: int = Field(1, gt=0, le=MAX_DEGREE, description="data-parallel replicas")
    virtual: int = Field(1, gt=0, le=MAX_VIRTUAL, description="virtual pipeline chunks per rank (interleaved schedule)")
    zero: int = Field(
        0,
        ge=0,
        le=3,
        description="ZeRO stage: 0 plain data parallel, 1 optimizer state, 2 + gradients, 3 + weights sharded over dp",
    )
    bucket: Bytes | None = Field(
        None,
        description="gradient bucket size, e.g. '25MiB' (PyTorch DDP's default); default as Megatron-LM: each "
        "model chunk's whole gradient buffer in one reduction with megatron.overlap_grad_reduce off, else "
        "buckets of max(40M, 1M x dp) parameters' gradients",
    )
    zero3_unit_layers: int = Field(
        1,
        gt=0,
        le=MAX_DEGREE,
        description="ZeRO 3: layers per unit gathered at once and reduce-scattered together (FSDP's "
        "wrapping unit; default one decoder layer, the embedding with the first, the head with the last)",
    )
    zero3_prefetch: int = Field(
        1,
        ge=0,
        le=MAX_DEGREE,
        description="ZeRO 3: units gathered ahead of the one computing (FSDP's forward/backward prefetch: 1)",
    )
    order: list[Literal["dp", "pp", "tp"]] = Field(
        ["dp", "pp", "tp"], description="rank layout, slowest to fastest varying axis (default: tp innermost)"
    )
    ep: int = Field(
        1,
        gt=0,
        le=MAX_DEGREE,
        description="expert-parallel degree: each MoE layer's experts are spread over ep "
        "ranks carved out of the data-parallel group (ep divides dp and "
        "model.moe.experts); each tensor-parallel rank holds its experts whole and routes "
        "1/tp of the tokens",
    )

    stage_layers: list[Annotated[int, Field(gt=0)]] | None = Field(
        None,
        description="the transformer layers of each pipeline stage (model chunk), first to last, summing to "
        "model.layers: an uneven split, as Megatron-Core's pipeline_model_parallel_layout or "
        "--decoder-first/last-pipeline-num-layers make one; absent: model.layers split evenly",
    )
    megatron: MegatronSection = Field(MegatronSection(), description="Megatron-LM's pipeline optimisations")

    @field_validator("order")
    @classmethod
    def _order_names_each_axis_once(cls, value: list[str]) -> list[str]:
        if sorted(value) != ["dp", "pp", "tp"]:
            raise ValueError(f"must name dp, pp and tp once each, got {value}")
        return value

    @property
    def bucket_bytes(self) -> float:
        """The gradient bucket size: `bucket`, or as Megatron-LM sizes it (Megatron-Core
        DistributedDataParallel.__init__: bucket_size = max(40,000,000, 1,000,000 x dp) parameters,
        "set to infinity if overlap_grad_reduce is False"), of 16-bit gradients (2 bytes each, as
        sim.cost.stages.weight_bytes counts what data parallelism moves)."""
        if self.bucket is not None:
            return self.bucket
        return max(40e6, 1e6 * self.dp) * 2.0 if self.megatron.overlap_grad_reduce else math.inf

    @property
    def scatter_gather_messages(self) -> bool:
        """Whether pipeline messages travel as tp chunks, all-gathered on receipt (Megatron's scatter/
        gather, megatron.scatter_gather; with sequence parallelism they are split already)."""
        return self.megatron.scatter_gather and self.tp > 1 and not self.sequence_parallel

    @property
    def world_size(self) -> int:
        return self.pp * self.tp * self.dp

    @property
    def num_stages(self) -> int:
        """Pipeline stages: pp x virtual (chunk c of rank r is stage c x pp + r)."""
        return self.pp * self.virtual


class NumericsSection(Section):
    """The small shadow model really computed in numpy to prove the strategy correct."""

    enabled: bool = True
    hidden: int = Field(16, gt=0, le=MAX_SHADOW_SIZE)
    heads: int = Field(2, gt=0, le=MAX_SHADOW_SIZE)
    seq_len: int = Field(8, gt=0, le=MAX_SHADOW_SIZE)
    vocab: int = Field(32, gt=0, le=MAX_SHADOW_SIZE)
    micro_batch: int = Field(2, gt=0, le=MAX_SHADOW_SIZE, description="shadow rows per microbatch")
    seed: int = Field(0, ge=0, le=2**63 - 1)
    dtype: NumericsDtype = "float64"
    optimizer: OptimizerName = "adam"
    lr: float = Field(1e-3, gt=0, le=MAX_LR, allow_inf_nan=False)
    hot_expert_bias: float = Field(
        0.0,
        ge=0,
        le=MAX_BIAS,
        allow_inf_nan=False,
        description=(
            "added to expert 0's routing score when choosing experts (not to its weight): a skewed "
            "router whose expert 0 is hot; MoE models only"
        ),
    )

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> NumericsSection:
        if self.hidden % self.heads:
            raise FieldError("heads", f"{self.heads} does not divide numerics.hidden ({self.hidden})")
        return self


class OutputSection(Section):
    dir: str | None = Field(None, max_length=MAX_PATH_CHARS, description="output folder (default runs/<name>)")

    @field_validator("dir")
    @classmethod
    def _dir_is_a_path(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.strip():
            raise ValueError(f"must name a folder, got {show_value(value)}")
        if "\x00" in value:
            raise ValueError(f"contains a NUL byte (\\x00), which no file system allows: {show_value(value)}")
        if any(len(part.encode()) > MAX_NAME_BYTES for part in PurePath(value).parts):
            raise ValueError(f"has a folder name longer than {MAX_NAME_BYTES} bytes, which file systems refuse")
        return value
