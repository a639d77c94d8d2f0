"""The scenario's parallel.megatron section: Megatron-LM's pipeline optimisations and Transformer
Engine's overlap of the tensor-parallel collectives, each a switch."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from clustersim.sim.scenario.errors import FieldError
from clustersim.sim.scenario.fields import Section

MAX_SMS = 2**16


class OverlapSms(Section):
    """SMs each pipelined reduce-scatter's kernels hold while its GEMM runs on the rest (NeMo's
    ub_cfg: num_sm with set_sm_margin 1, Transformer Engine's _math_sms; schedules.tp_overlap)."""

    proj_fprop: int = Field(0, ge=0, le=MAX_SMS, description="beside the attention output projection")
    fc2_fprop: int = Field(0, ge=0, le=MAX_SMS, description="beside the MLP's second GEMM")


class MegatronSection(Section):
    """Megatron-LM's pipeline optimisations, each a switch, on where Megatron-LM has it on."""

    scatter_gather: bool = Field(
        True,
        description="each tensor-parallel rank sends 1/tp of a pipeline activation (or gradient) and the "
        "receiving group all-gathers it (Megatron-LM's --scatter-gather-tensors-in-pipeline, on by "
        "default; with sequence parallelism the tensor is split already)",
    )
    deallocate_outputs: bool = Field(
        True,
        description="free a stage output's data once it is sent (Megatron-LM's deallocate_pipeline_outputs, "
        "set by its training loop); off: each in-flight microbatch also holds its stage's output",
    )
    blocking_p2p: bool | None = Field(
        None,
        description="a rank's next compute waits for its earlier pipeline sends (Megatron-LM 2021-22: batch_isend_"
        "irecv, wait, torch.cuda.synchronize). Default: on with compute_model kernel, off with the roofline",
    )
    grad_reduce_in_fp32: bool | None = Field(
        None,
        description="gradients accumulated in an FP32 buffer and reduced over data parallelism in FP32: 4 bytes a "
        "gradient, not the 16-bit weights' 2 (Megatron-LM forces --accumulate-allreduce-grads-in-fp32 with "
        "--bf16; Apex DistributedFusedAdam, NeMo's distributed_fused_adam, reduces in its state dtype, FP32, "
        "unless grad_sync_dtype is set). Default: on with bf16 and compute_model kernel, off otherwise",
    )
    overlap_grad_reduce: bool = Field(
        False,
        description="ZeRO 0-2: bucket the gradients by whole layers (parallel.bucket each at least) and "
        "start each bucket's reduction as its layers' part of the last backward ends (Megatron-LM's "
        "--overlap-grad-reduce, off by default); off: after the stage's last backward",
    )
    overlap_param_gather: bool = Field(
        False,
        description="ZeRO 1-2 with overlap_grad_reduce: gather each bucket's updated weights ahead of the next "
        "step's first forward that uses them, one bucket in flight (Megatron-LM's --overlap-param-gather, Apex "
        "DistributedFusedAdam's overlap_param_sync; schedules.param_gather); off: after the optimizer step",
    )
    tp_comm_overlap: bool = Field(
        False,
        description="each sublayer's tensor-parallel all-gather and reduce-scatter beside the GEMM next to it, "
        "as Transformer Engine's userbuffers run them (NeMo's ub_tp_comm_overlap; ring exchange, pipeline of 4 "
        "chunks, bulk: schedules.tp_overlap); needs tp > 1, sequence parallelism, compute_model kernel",
    )
    moe_dispatcher: Literal["alltoall", "flex"] = Field(
        "alltoall",
        description="how an MoE layer's tokens reach their experts (Megatron-Core's --moe-token-dispatcher-type): "
        "alltoall, one copy per (token, expert) in an all-to-all; flex, DeepEP or HybridEP, one copy per remote "
        "node over the network, forwarded over NVLink (sim.collectives.moe_dispatch; needs the NCCL layer)",
    )
    tp_comm_overlap_sms: OverlapSms = Field(
        OverlapSms(),
        description="SMs the pipelined reduce-scatters take from their GEMMs (ub_cfg num_sm where set_sm_margin "
        "is 1; default 0, Transformer Engine's default margin)",
    )


def check_tp_comm_overlap(
    megatron: MegatronSection, tp: int, sequence_parallel: bool, kernel: bool, units: int
) -> None:
    """Transformer Engine overlaps the sequence-parallel all-gathers and reduce-scatters with GEMMs
    of the kernel model (schedules.tp_overlap), on a chip of `units` SMs."""
    field = "parallel.megatron.tp_comm_overlap"
    if not megatron.tp_comm_overlap:
        if megatron.tp_comm_overlap_sms != OverlapSms():
            raise FieldError(f"{field}_sms", f"needs {field}: true")
        return
    if tp == 1:
        raise FieldError(field, "needs parallel.tp > 1 (it overlaps the tensor-parallel collectives)")
    if not sequence_parallel:
        raise FieldError(field, "needs parallel.sequence_parallel (it overlaps all-gathers and reduce-scatters)")
    if not kernel:
        raise FieldError(field, "needs cluster.compute_model: kernel (it overlaps single GEMMs)")
    for name, sms in megatron.tp_comm_overlap_sms.model_dump().items():
        if sms >= units:
            raise FieldError(f"{field}_sms.{name}", f"{sms} leaves none of the chip's {units} SMs to the GEMM")


def check_overlap_param_gather(megatron: MegatronSection, zero: int) -> None:
    """Megatron-LM (megatron/training/arguments.py) allows --overlap-param-gather only with its
    distributed optimizer (ZeRO 1 or 2 here; ZeRO 3 gathers per unit anyway) and
    --overlap-grad-reduce. With dp = 1 nothing is gathered, as nothing is reduced."""
    field = "parallel.megatron.overlap_param_gather"
    if not megatron.overlap_param_gather:
        return
    if zero not in (1, 2):
        raise FieldError(field, f"needs parallel.zero 1 or 2 (the sharded optimizer's weight all-gather), not {zero}")
    if not megatron.overlap_grad_reduce:
        raise FieldError(field, "needs parallel.megatron.overlap_grad_reduce: true (as Megatron-LM requires)")
