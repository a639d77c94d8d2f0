"""What each pipeline stage of a scenario holds, computes and moves, in numbers: its layers,
parameters, FLOPs per work item, and the bytes of its weights, experts, partial gradients and
all-to-all buffers. The program builder (sim.build) and the memory model read them from here.
"""

from __future__ import annotations

from collections.abc import Callable

from clustersim.sim.cost import compute as cost
from clustersim.sim.cost.memory import (
    activation_bytes_per_layer,
    cross_entropy_activation_bytes,
    embedding_activation_bytes,
    head_activation_bytes,
)
from clustersim.sim.scenario.schema import Scenario


def stage_layer_range(scenario: Scenario, stage: int) -> range:
    """The layers of pipeline stage `stage`: parallel.stage_layers' split, or an even one."""
    sizes = scenario.parallel.stage_layers
    if sizes is None:
        per_stage = scenario.model_spec.layers // scenario.parallel.num_stages
        return range(stage * per_stage, (stage + 1) * per_stage)
    start = sum(sizes[:stage])
    return range(start, start + sizes[stage])


def stage_moe_layers(scenario: Scenario, stage: int) -> list[bool]:
    """For each layer of the stage, whether its MLP is a mixture of experts."""
    moe = scenario.model_spec.moe
    return [moe is not None and moe.is_moe_layer(i) for i in stage_layer_range(scenario, stage)]


def stage_params(scenario: Scenario, stage: int) -> float:
    """Parameters of one stage on one rank. There are pp x v stages of layers / (pp x v) layers
    each; stage 0 also holds the embeddings and the last stage (pp x v - 1, on rank pp - 1) the
    final layernorm and LM head; tensor parallelism splits all of it t ways (Megatron shards the
    vocabulary too; the few replicated layernorm and bias parameters are counted split as well)
    but an MoE layer's MLP, which splits its tokens instead: every rank holds its router, shared
    experts and E/ep routed experts whole (`moe_whole_params`)."""
    last = scenario.parallel.num_stages - 1
    return layers_params(scenario, stage_layer_range(scenario, stage), stage == 0, stage == last)


def layers_params(scenario: Scenario, layers: range, embed: bool, head: bool) -> float:
    """`stage_params` of some layers, with the embeddings (`embed`) and the LM head (`head`) or
    without: a stage's, or one ZeRO-3 unit's (sim.cost.units)."""
    m = scenario.model_spec
    params = sum(cost.model_layer_params(m, i) for i in layers)
    moe_layers = sum(m.moe is not None and m.moe.is_moe_layer(i) for i in layers)
    if m.moe is not None:  # every MoE MLP parameter; this rank's come back whole below
        params -= moe_layers * cost.moe_mlp_params(m.hidden, m.moe, m.gated_mlp)
    if embed:
        params += m.vocab * m.hidden  # token embeddings
        params += m.seq_len * m.hidden if m.position_embedding == "learned" else 0  # and a position table
    if head:
        params += m.hidden * m.vocab + 2 * m.hidden  # LM head and final layernorm
    return params / scenario.parallel.tp + _moe_whole_params(scenario, moe_layers)


def layer_activation_bytes(scenario: Scenario) -> float:
    """Bytes one layer keeps per in-flight microbatch (Korthikanti et al.'s count, sim.cost.memory)
    at the scenario's shape, microbatch, tensor and sequence parallelism, recompute and attention."""
    m, p, t = scenario.model_spec, scenario.parallel, scenario.training
    return activation_bytes_per_layer(
        m.seq_len,
        t.micro_batch,
        m.hidden,
        m.heads,
        t=p.tp,
        sp=p.sequence_parallel,
        recompute=t.recompute,
        h_kv=m.kv_hidden,
        h_q=m.q_hidden,
        f=m.ffn,
        gated_mlp=m.gated_mlp,
        flash=t.flash_attention,
        qk_norm=m.qk_norm,
        hidden_dropout=m.hidden_dropout > 0,
        attention_dropout=m.attention_dropout > 0,
    )


def stage_activation_bytes(scenario: Scenario, stage: int, sends_output: bool) -> float:
    """Bytes a stage keeps per in-flight microbatch: its layers', the embedding's on the first stage
    and the LM head's on the last (sim.cost.memory), and its output when `sends_output` (the next
    stage is on another rank) unless Megatron's pipeline output deallocation frees it once sent:
    the (s, b, h) activation, a sequence shard under sequence parallelism."""
    m, p, b = scenario.model_spec, scenario.parallel, scenario.training.micro_batch
    split = p.tp if p.sequence_parallel else 1
    nbytes = len(stage_layer_range(scenario, stage)) * layer_activation_bytes(scenario)
    if stage == 0:
        nbytes += embedding_activation_bytes(m.seq_len, b, m.hidden, p.tp, p.sequence_parallel, m.hidden_dropout > 0)
    if stage == p.num_stages - 1:
        nbytes += head_activation_bytes(m.seq_len, b, m.hidden, m.vocab, p.tp, p.sequence_parallel)
    if sends_output and not p.megatron.deallocate_outputs:
        nbytes += cost.boundary_activation_bytes(b, m.seq_len, m.hidden, scenario.dtype_bytes) / split
    return nbytes


def stage_input_gradient_bytes(scenario: Scenario, stage: int) -> float:
    """The part of `stage_activation_bytes` only the input gradient B reads, which B frees when a
    zero-bubble schedule splits the weight gradient W off: the last stage's cross-entropy softmax
    and targets. (A layer's tensors W does not read are kept until W: an upper bound.)"""
    m, p = scenario.model_spec, scenario.parallel
    if stage != p.num_stages - 1:
        return 0.0
    return cross_entropy_activation_bytes(m.seq_len, scenario.training.micro_batch, m.vocab, p.tp)


def stage_forward_flops(scenario: Scenario, stage: int) -> float:
    """Forward FLOPs of one stage for one microbatch on one rank (the last stage adds the LM
    head; tensor parallelism splits the matmuls t ways)."""
    m, num_stages = scenario.model_spec, scenario.parallel.num_stages
    b = scenario.training.micro_batch
    forward = sum(cost.model_layer_forward_flops(m, b, i) for i in stage_layer_range(scenario, stage))
    if stage == num_stages - 1:
        forward += cost.head_forward_flops(b, m.seq_len, m.hidden, m.vocab)
    return forward / scenario.parallel.tp


def stage_weight_gradient_flops(scenario: Scenario, stage: int) -> float:
    """FLOPs of a stage's weight gradient (W, when a zero-bubble schedule splits the backward) for
    one microbatch on one rank. For a matmul y = x A (forward 2 n k f FLOPs) the input gradient
    dx = dy A^T and the weight gradient dA = x^T dy cost the same 2 n k f each, so W = the forward
    FLOPs of the stage's weight matmuls: its forward less each layer's attention core, Q K^T and
    scores x V (4 b s^2 h_q), which has no weights and whose backward is all input gradient. The
    input gradient B is the rest of the backward (2 x forward + recompute - W)."""
    m = scenario.model_spec
    b = scenario.training.micro_batch
    core = 4.0 * b * m.seq_len * m.seq_len * m.q_hidden / scenario.parallel.tp
    return stage_forward_flops(scenario, stage) - core * len(stage_layer_range(scenario, stage))


def tensor_parallel_item_flops(scenario: Scenario) -> Callable[[str, int], float]:
    """FLOPs on one rank of each work item of a tensor-parallel stage op (see
    schedules.tensor_parallel.tp_stage_plan): a layer's attention or MLP, the LM head, split t
    ways; a backward is twice its forward, plus the attention core again under selective recompute."""
    m, t, tp = scenario.model_spec, scenario.training, scenario.parallel.tp
    b, s, h = t.micro_batch, m.seq_len, m.hidden
    forward = {
        "embed": 0.0,
        "attn": cost.attention_forward_flops(b, s, h, m.kv_hidden, m.q_hidden) / tp,
        "mlp": cost.mlp_forward_flops(b, s, h, m.ffn, m.gated_mlp) / tp,
        "head": cost.head_forward_flops(b, s, h, m.vocab) / tp,
    }
    if m.moe is not None:  # each tp rank routes 1/tp of the tokens; balanced experts: k rows per token
        router = cost.moe_router_flops(b, s, h, m.moe)
        forward["router"] = router / tp
        forward["experts"] = (cost.moe_mlp_forward_flops(b, s, h, m.moe, m.gated_mlp) - router) / tp
    selective = (
        cost.recompute_flops(b, s, h, m.ffn, m.gated_mlp, "selective", h_q=m.q_hidden) / tp
        if t.recompute == "selective"
        else 0.0
    )
    flops = {f"F.{k}": v for k, v in forward.items()} | {f"B.{k}": 2 * v for k, v in forward.items()}
    flops["B.attn"] += selective
    return lambda item, stage: flops[item]


def tensor_parallel_item_weight_flops(scenario: Scenario) -> Callable[[str, int], float]:
    """The weight-gradient FLOPs on one rank of each backward work item (see
    `stage_weight_gradient_flops`): the forward FLOPs of its weight matmuls, an attention item's
    less its core Q K^T and scores x V (4 b s^2 h_q / t), which has no weights."""
    forward = tensor_parallel_item_flops(scenario)
    m, b, tp = scenario.model_spec, scenario.training.micro_batch, scenario.parallel.tp
    core = 4.0 * b * m.seq_len * m.seq_len * m.q_hidden / tp

    def weight(item: str, stage: int) -> float:
        phase, _, name = item.partition(".")
        if phase != "B":
            return 0.0
        return forward(f"F.{name}", stage) - (core if name == "attn" else 0.0)

    return weight


def routed_expert_params(scenario: Scenario, stage: int, experts: int) -> float:
    """Parameters of `experts` routed experts in each of the stage's MoE layers (whole, not split)."""
    m = scenario.model_spec
    if m.moe is None:
        return 0.0
    return sum(stage_moe_layers(scenario, stage)) * experts * cost.mlp_params(m.hidden, m.moe.expert_ffn, m.gated_mlp)


def moe_whole_params(scenario: Scenario, stage: int) -> float:
    """Parameters of the stage's MoE MLPs that every tensor-parallel rank holds whole: each
    layer's h x E router, shared experts and the rank's E/ep routed experts. The tensor-parallel
    group splits an MoE MLP's tokens, not its weights (Megatron-Core's expert tensor parallel 1),
    so each rank's gradients of these are partial sums over the group (`partial_grad_params`)."""
    return _moe_whole_params(scenario, sum(stage_moe_layers(scenario, stage)))


def _moe_whole_params(scenario: Scenario, moe_layers: int) -> float:
    """`moe_whole_params` of `moe_layers` MoE layers."""
    m = scenario.model_spec
    if m.moe is None:
        return 0.0
    expert = cost.mlp_params(m.hidden, m.moe.expert_ffn, m.gated_mlp)
    router_and_shared = m.hidden * m.moe.num_experts + m.moe.shared_experts * expert
    return moe_layers * router_and_shared + moe_layers * (m.moe.num_experts // scenario.parallel.ep) * expert


def expert_bytes(scenario: Scenario, stage: int) -> float:
    """Bytes of the 16-bit routed-expert weights a rank holds for a stage, E/ep per MoE layer,
    whole on every tensor-parallel rank (their gradients, once summed over the tensor-parallel
    group, are reduced among the ranks holding the same experts)."""
    moe, p = scenario.model_spec.moe, scenario.parallel
    return routed_expert_params(scenario, stage, moe.num_experts // p.ep) * 2.0 if moe else 0.0


def alltoall_bytes(scenario: Scenario) -> float:
    """One rank's dispatch (or combine) send buffer: its routed token rows x h x dtype bytes
    (with a capacity factor, every expert's buffer full), spread evenly over the group."""
    m = scenario.model_spec
    if m.moe is None:
        return 0.0
    rows = cost.moe_routed_rows(scenario.training.micro_batch, m.seq_len, m.moe)
    return rows * m.hidden * scenario.dtype_bytes / scenario.parallel.tp


def replicated_params(scenario: Scenario, stage: int) -> float:
    """Parameters every rank of a tensor-parallel group holds whole outside the MoE MLPs: each
    layer's two layernorms (gain and bias), row-parallel attention bias and query and key norms
    (qk_norm), a dense layer's MLP bias, and the final layernorm on the last stage."""
    m, num_stages = scenario.model_spec, scenario.parallel.num_stages
    dense = sum(not moe for moe in stage_moe_layers(scenario, stage))
    layers = len(stage_layer_range(scenario, stage))
    qk_norms = layers * 2 * m.head_width if m.qk_norm else 0
    return (layers * 5 + dense) * m.hidden + qk_norms + (2 * m.hidden if stage == num_stages - 1 else 0)


def partial_grad_params(scenario: Scenario, stage: int) -> float:
    """Parameters whose gradients each tensor-parallel rank computes from its own share of the
    tokens, summed over the group once per step (tp > 1): the MoE MLPs' whole parameters, and
    with sequence parallelism (chunks of the sequence) the replicated ones too."""
    sp = scenario.parallel.sequence_parallel
    return moe_whole_params(scenario, stage) + (replicated_params(scenario, stage) if sp else 0.0)


def weight_bytes(scenario: Scenario, stage: int) -> float:
    """Bytes of a stage's 16-bit weights (= its gradients'), what data parallelism moves."""
    return stage_params(scenario, stage) * 2.0
