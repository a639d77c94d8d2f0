"""Which shadow parameters a tensor-parallel rank holds a piece of, and how the pieces are cut:
Megatron's column-parallel weights by output (qkv by heads within each of q, k, v; fc by ffn;
the LM head and the embedding by vocabulary), row-parallel ones by input (attn proj, mlp proj);
everything else (layernorms, row-parallel biases, MoE layers) whole on every rank."""

from __future__ import annotations

import numpy as np

from clustersim.sim.numerics.transformer import ShadowConfig

# parameter kind -> (dim cut into t pieces, blocks cut alike); rank k keeps piece k of each block
# (q, k and v are three blocks: of widths h, h_kv, h_kv, `_blocks`)
SHARDED = {
    "attn.qkv.w": (-1, 3),
    "attn.qkv.b": (-1, 3),  # column-parallel by heads, within each of q, k, v
    "attn.proj.w": (0, 1),  # row-parallel, the same heads
    "mlp.fc.w": (-1, 1),
    "mlp.fc.b": (-1, 1),  # column-parallel by ffn
    "mlp.proj.w": (0, 1),  # row-parallel, the same ffn slice
    "embed.tok": (0, 1),
    "head.w": (-1, 1),  # vocab-parallel
}


def _kind(name: str) -> str:
    """ "layer3.attn.qkv.w" -> "attn.qkv.w"; non-layer names are their own kind."""
    return name.partition(".")[2] if name.startswith("layer") else name


def is_sharded(name: str) -> bool:
    """Whether each rank holds a piece of parameter `name` (else a whole copy)."""
    return _kind(name) in SHARDED


def _blocks(kind: str, cfg: ShadowConfig, pieces: int) -> int | list[int]:
    """np.split's sections of a parameter of `kind` into its blocks, each cut into `pieces`."""
    _, blocks = SHARDED[kind]
    if kind.startswith("attn.qkv") and cfg.kv_hidden != cfg.hidden:  # q, k, v of unequal widths
        return [cfg.hidden // pieces, (cfg.hidden + cfg.kv_hidden) // pieces]
    return blocks


def check_tp_degree(cfg: ShadowConfig, tp: int) -> None:
    """Raise ValueError unless t divides the heads (and key-value heads), the ffn width and the vocabulary."""
    sizes = {"heads": cfg.heads, "kv_heads": cfg.kv_heads or cfg.heads, "ffn": cfg.ffn, "vocab": cfg.vocab}
    bad = [f"{knob} ({size})" for knob, size in sizes.items() if tp < 1 or size % tp]
    if bad:
        raise ValueError(
            f"tensor-parallel degree {tp} must divide heads ({cfg.heads}), kv_heads, ffn ({cfg.ffn}) and "
            f"vocab ({cfg.vocab}); it does not divide {', '.join(bad)}"
        )


def shard_params(params: dict[str, np.ndarray], cfg: ShadowConfig, names, tp: int, k: int) -> dict[str, np.ndarray]:
    """Rank k's copy of each named parameter: its piece of the sharded ones, the replicated ones whole."""
    check_tp_degree(cfg, tp)
    if not 0 <= k < tp:
        raise ValueError(f"tensor-parallel rank {k} is outside 0..{tp - 1}")
    shards = {}
    for name in names:
        if _kind(name) not in SHARDED:
            shards[name] = params[name].copy()
            continue
        dim, _ = SHARDED[_kind(name)]
        blocks = np.split(params[name], _blocks(_kind(name), cfg, 1), axis=dim)
        shards[name] = np.concatenate([np.split(block, tp, axis=dim)[k] for block in blocks], axis=dim)
    return shards


def unshard_params(shards: list[dict[str, np.ndarray]], cfg: ShadowConfig, tp: int) -> dict[str, np.ndarray]:
    """Inverse of `shard_params` over ranks 0..t-1; replicated parameters are taken from rank 0."""
    check_tp_degree(cfg, tp)
    if len(shards) != tp:
        raise ValueError(f"{len(shards)} shards for a tensor-parallel degree of {tp}")
    full = {}
    for name, value in shards[0].items():
        if _kind(name) not in SHARDED:
            full[name] = value.copy()
            continue
        dim, blocks = SHARDED[_kind(name)]
        per_rank = [np.split(shard[name], _blocks(_kind(name), cfg, tp), axis=dim) for shard in shards]
        full[name] = np.concatenate(
            [np.concatenate([pieces[j] for pieces in per_rank], axis=dim) for j in range(blocks)], axis=dim
        )
    return full
