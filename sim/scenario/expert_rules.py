"""The scenario's rules for expert parallelism: how ep, tp and dp must divide an MoE model's
experts and tokens, and what is not modelled with it yet."""

from __future__ import annotations

from clustersim.sim.scenario.errors import FieldError
from clustersim.sim.scenario.model import ModelSection
from clustersim.sim.scenario.sections import NumericsSection, ParallelSection, TrainingSection


def check_expert_parallel(
    model: ModelSection, seq_len: int, parallel: ParallelSection, training: TrainingSection, numerics: NumericsSection
) -> None:
    """Layout rule (DeepSpeed-MoE; Megatron-Core's expert parallelism with expert tensor parallel
    1): the dp ranks holding one (stage, tp shard) form dp / ep expert-parallel groups of ep
    consecutive dp indices; EP rank r of a group holds experts r E/ep .. (r + 1) E/ep - 1 of
    every MoE layer whole. A tensor-parallel group splits an MoE layer's tokens, not its
    experts: each of its tp ranks routes and dispatches 1/tp of a microbatch's tokens, so tp
    must divide them, and the experts' gradients are summed over the tp ranks, then reduced
    among the dp / ep ranks holding the same experts (which also share their ZeRO shards). So
    ep must divide both dp and the expert count. (Megatron-Core can also spread the experts
    over the tp ranks, ep | dp x tp; that layout is not modelled.)"""
    m, p, t, n = model, parallel, training, numerics
    if m.moe is None:
        if p.ep > 1:
            raise FieldError("parallel.ep", f"{p.ep} needs an MoE model (set model.moe); this model is dense")
        if n.hot_expert_bias:
            raise FieldError("numerics.hot_expert_bias", "needs an MoE model (set model.moe); this model is dense")
        if p.megatron.moe_dispatcher != "alltoall":
            raise FieldError(
                "parallel.megatron.moe_dispatcher", "needs an MoE model (set model.moe); this model is dense"
            )
        return
    if m.moe.num_experts % p.ep:
        raise FieldError("parallel.ep", f"{p.ep} does not divide model.moe.experts ({m.moe.num_experts})")
    if p.dp % p.ep:
        raise FieldError(
            "parallel.ep",
            (
                f"{p.ep} does not divide parallel.dp ({p.dp}): expert-parallel groups are carved out of the "
                "data-parallel group"
            ),
        )
    if (t.micro_batch * seq_len) % p.tp:
        raise FieldError(
            "parallel.tp",
            (
                f"{p.tp} does not divide training.micro_batch ({t.micro_batch}) x model.seq_len "
                f"({seq_len}) = {t.micro_batch * seq_len} tokens: each "
                "tensor-parallel rank routes 1/tp of a microbatch's tokens to the experts"
            ),
        )
    if p.ep > 1 and p.zero == 3:
        raise FieldError(
            "parallel.zero",
            "3 with parallel.ep > 1 is not modelled yet (ZeRO 3 gathers of "
            "expert weights among the ranks holding them); use zero 0, 1 or 2",
        )
    if p.ep > 1 and p.megatron.overlap_grad_reduce:
        raise FieldError(
            "parallel.megatron.overlap_grad_reduce",
            "with parallel.ep > 1 is not modelled yet (the experts' gradients are bucketed on their own); turn it off",
        )
    if n.enabled and (n.micro_batch * n.seq_len) % p.tp:
        raise FieldError(
            "numerics.seq_len",
            (
                f"{n.seq_len} x numerics.micro_batch ({n.micro_batch}) = {n.micro_batch * n.seq_len} tokens is "
                f"not divisible by parallel.tp ({p.tp}): each tensor-parallel rank of the shadow model routes "
                "1/tp of a microbatch's tokens"
            ),
        )
    if n.enabled and m.moe.shared_experts > 1:  # what the shadow model's experts can do so far
        raise FieldError(
            "numerics.enabled",
            "the shadow model's experts do not support more than one shared "
            "expert yet: set numerics.enabled: false (the MoE layers are still timed)",
        )
