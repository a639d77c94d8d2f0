"""Grouped-query attention in the shadow model against multi-head attention, the reference it is
defined by (Ainslie et al. 2023): query head j reads the keys and values of group j // (a / g), so
it is multi-head attention whose K and V repeat each group's for its heads; the query gradients
are the same, a group's key and value gradients the sums over its heads."""

import numpy as np

from clustersim.sim.numerics.sharding import shard_params
from clustersim.sim.numerics.transformer import (
    ShadowConfig,
    attention_core_backward,
    attention_core_forward,
    init_params,
)

B, S, HEADS, KV, D = 2, 5, 4, 2, 3


def test_grouped_query_attention_is_multi_head_attention_with_shared_keys_and_values():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((B, S, n * D)) for n in (HEADS, KV, KV))

    def repeat(t):  # (b, s, g d) -> (b, s, a d): each group's head once per query head it serves
        return t.reshape(B, S, KV, 1, D).repeat(HEADS // KV, axis=3).reshape(B, S, HEADS * D)

    y, cache = attention_core_forward(np.concatenate([q, k, v], axis=-1), HEADS, KV)
    y_mha, cache_mha = attention_core_forward(np.concatenate([q, repeat(k), repeat(v)], axis=-1), HEADS)
    np.testing.assert_allclose(y, y_mha, rtol=1e-13, atol=0)
    dy = rng.standard_normal(y.shape)
    grads = np.split(attention_core_backward(dy, cache), [HEADS * D, (HEADS + KV) * D], axis=-1)
    grads_mha = np.split(attention_core_backward(dy, cache_mha), 3, axis=-1)
    np.testing.assert_allclose(grads[0], grads_mha[0], rtol=1e-13, atol=1e-15)
    for grouped, per_head in zip(grads[1:], grads_mha[1:]):
        summed = per_head.reshape(B, S, KV, HEADS // KV, D).sum(axis=3).reshape(B, S, KV * D)
        np.testing.assert_allclose(grouped, summed, rtol=1e-12, atol=1e-15)


def test_a_rank_holds_its_query_heads_and_their_groups_keys_and_values():
    """h 16, 4 query heads and 2 key-value heads of 4: tensor-parallel rank 1 of 2 holds query
    heads 2 and 3 (columns 8-15) and group 1's k and v (columns 20-23 and 28-31)."""
    cfg = ShadowConfig(layers=1, hidden=16, heads=4, ffn=32, seq_len=4, vocab=8, kv_heads=2)
    params = init_params(cfg, 0)
    w = params["layer0.attn.qkv.w"]
    assert w.shape == (16, 32)
    shard = shard_params(params, cfg, ["layer0.attn.qkv.w"], 2, 1)["layer0.attn.qkv.w"]
    np.testing.assert_array_equal(shard, np.concatenate([w[:, 8:16], w[:, 20:24], w[:, 28:32]], axis=1))
