"""Tensor- and sequence-parallel shadow model == the unsharded StageModel, with real collectives."""

import numpy as np
import pytest

from clustersim.schedules.ir import Phase
from clustersim.schedules.stage_pieces import tp_stage_plan
from clustersim.sim.collectives.ops import reference
from clustersim.sim.numerics.plan import Sharding
from clustersim.sim.numerics.reference import max_errors
from clustersim.sim.numerics.sharding import shard_params, unshard_params
from clustersim.sim.numerics.stages import StageModel
from clustersim.sim.numerics.tensor_parallel import TensorParallelStage
from clustersim.sim.numerics.transformer import ShadowConfig, init_params, param_shapes

CFG = ShadowConfig(layers=2, hidden=16, heads=4, ffn=32, seq_len=8, vocab=24)
BATCH, MICROBATCHES = 2, 2


def tp_collective_kinds(phase, num_layers, first, last, sp, tp, recompute_full=False):
    """The schedule's tensor-parallel collectives inside one dense stage op, in order: what the
    shadow stage must yield, one for one (none for tp = 1)."""
    return [kind for _, kind, _ in tp_stage_plan(phase, num_layers, first, last, sp, recompute_full, tp=tp) if kind]


def randomized_params(cfg, seed):
    """init_params moved well away from init (non-zero biases, gains != 1) so every term is exercised."""
    rng = np.random.default_rng(seed)
    return {name: value + 0.3 * rng.standard_normal(value.shape) for name, value in init_params(cfg, seed).items()}


def lockstep(generators):
    """Advance every rank's generator together, answering each collective with ops.py's numpy
    meaning. Returns (each rank's return value, the kinds yielded in order)."""
    replies, kinds = [None] * len(generators), []
    while True:
        requests, results = [], []
        for gen, reply in zip(generators, replies):
            try:
                requests.append(gen.send(reply))
            except StopIteration as stop:
                results.append(stop.value)
        if results:
            assert len(results) == len(generators), f"ranks stopped at different collectives after {kinds}"
            return results, kinds
        kind = {k for k, _ in requests}
        assert len(kind) == 1, f"ranks disagree on collective {len(kinds)}: {kind}"
        kinds.append(kind.pop())
        replies = reference(kinds[-1], [array for _, array in requests])


def split_seq(x, tp):
    return np.split(x, tp, axis=1)  # (b, s, h) -> t chunks (b, s/t, h)


def run_tensor_parallel(params, tokens, targets, num_stages, tp, sp, recompute, cfg=CFG):
    """Every microbatch forward through the stages, then backward in reverse; the stages' kinds
    are checked against tp_collective_kinds along the way."""
    stages = [
        [
            TensorParallelStage(cfg, s, num_stages, params, MICROBATCHES, Sharding(tp, sp, tp_rank=k), recompute)
            for k in range(tp)
        ]
        for s in range(num_stages)
    ]
    losses, activations, dinputs = [], {}, {}
    for mb in range(MICROBATCHES):
        rows = slice(mb * BATCH, (mb + 1) * BATCH)
        inputs = [tokens[rows]] * tp
        for s, ranks in enumerate(stages):
            last = s == num_stages - 1
            outs, kinds = lockstep([r.forward(mb, x, targets[rows] if last else None) for r, x in zip(ranks, inputs)])
            assert kinds == tp_collective_kinds(Phase.F, len(ranks[0].layers), s == 0, last, sp, tp)
            activations[mb, s], inputs = outs, outs
        assert len(set(outs)) == 1  # the loss is equal on every rank
        losses.append(outs[0])
    for mb in reversed(range(MICROBATCHES)):
        douts = [None] * tp
        for s in reversed(range(num_stages)):
            douts, kinds = lockstep([r.backward(mb, d) for r, d in zip(stages[s], douts)])
            assert kinds == tp_collective_kinds(
                Phase.B, len(stages[s][0].layers), s == 0, s == num_stages - 1, sp, tp, recompute
            )
            dinputs[mb, s] = douts
    grads = {}
    for ranks in stages:
        _, kinds = lockstep([r.grad_sync() for r in ranks])
        assert kinds == (["all_reduce"] if sp else [])
        assert all(not r.pending_microbatches() and not r.missing_backward() for r in ranks)
        grads |= unshard_params([r.grads for r in ranks], cfg, tp)
    return losses, activations, dinputs, grads


def run_reference(params, tokens, targets, num_stages, cfg=CFG):
    stages = [StageModel(cfg, s, num_stages, params, MICROBATCHES) for s in range(num_stages)]
    losses, activations, dinputs = [], {}, {}
    for mb in range(MICROBATCHES):
        rows = slice(mb * BATCH, (mb + 1) * BATCH)
        x = tokens[rows]
        for s, stage in enumerate(stages):
            x = activations[mb, s] = stage.forward(mb, x, targets[rows])
        losses.append(x)
    for mb in reversed(range(MICROBATCHES)):
        d = None
        for s in reversed(range(num_stages)):
            d = dinputs[mb, s] = stages[s].backward(mb, d)
    return losses, activations, dinputs, {n: g for stage in stages for n, g in stage.grads.items()}


def rel_err(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("num_stages", [1, 2])
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sharded_stages_match_unsharded_reference(tp, sp, recompute, num_stages):
    params = randomized_params(CFG, seed=7)
    rng = np.random.default_rng(tp)
    tokens = rng.integers(0, CFG.vocab, size=(MICROBATCHES * BATCH, CFG.seq_len))  # (m b, s)
    targets = rng.integers(0, CFG.vocab, size=tokens.shape)
    losses, acts, dinputs, grads = run_tensor_parallel(params, tokens, targets, num_stages, tp, sp, recompute)
    ref_losses, ref_acts, ref_dinputs, ref_grads = run_reference(params, tokens, targets, num_stages)

    assert np.allclose(losses, ref_losses, rtol=1e-12, atol=0)
    assert set(grads) == set(param_shapes(CFG))
    assert max_errors(grads, ref_grads)[1] < 1e-10
    for mb in range(MICROBATCHES):
        if num_stages == 2:  # the activation and gradient crossing the stage boundary
            want_act, want_d = ref_acts[mb, 0], ref_dinputs[mb, 1]
            got_act, got_d = acts[mb, 0], dinputs[mb, 1]
            if sp:
                want_act, want_d = split_seq(want_act, tp), split_seq(want_d, tp)
            else:
                want_act, want_d = [want_act] * tp, [want_d] * tp
            assert max(rel_err(g, w) for g, w in zip(got_act, want_act)) < 1e-12
            assert max(rel_err(g, w) for g, w in zip(got_d, want_d)) < 1e-10
        assert dinputs[mb, 0] == [None] * tp


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("tp", [1, 2])
def test_grouped_query_stages_match_unsharded_reference(tp, sp):
    """Two key-value heads for four query heads: each rank holds its query heads and their group's
    keys and values, and the sharded stages still reproduce the single-device model."""
    cfg = ShadowConfig(layers=2, hidden=16, heads=4, ffn=32, seq_len=8, vocab=24, kv_heads=2)
    params = randomized_params(cfg, seed=5)
    rng = np.random.default_rng(tp)
    tokens = rng.integers(0, cfg.vocab, size=(MICROBATCHES * BATCH, cfg.seq_len))
    targets = rng.integers(0, cfg.vocab, size=tokens.shape)
    losses, _, _, grads = run_tensor_parallel(params, tokens, targets, 2, tp, sp, True, cfg)
    ref_losses, _, _, ref_grads = run_reference(params, tokens, targets, 2, cfg)
    assert np.allclose(losses, ref_losses, rtol=1e-12, atol=0)
    assert grads["layer0.attn.qkv.w"].shape == (16, 16 + 2 * 8)
    assert max_errors(grads, ref_grads)[1] < 1e-10


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_unshard_inverts_shard_exactly(tp):
    params = randomized_params(CFG, seed=1)
    names = list(param_shapes(CFG))
    shards = [shard_params(params, CFG, names, tp, k) for k in range(tp)]
    assert shards[-1]["layer0.attn.qkv.w"].shape == (CFG.hidden, 3 * CFG.hidden // tp)
    assert shards[-1]["head.w"].shape == (CFG.hidden, CFG.vocab // tp)
    full = unshard_params(shards, CFG, tp)
    assert set(full) == set(params)
    assert all(np.array_equal(full[n], params[n]) for n in params)


def test_qkv_shard_keeps_its_heads_q_k_v_blocks():
    params = randomized_params(CFG, seed=2)
    w = params["layer1.attn.qkv.w"]  # (h, 3h): q | k | v, each head d = h / heads columns
    shard = shard_params(params, CFG, ["layer1.attn.qkv.w"], 2, 1)["layer1.attn.qkv.w"]  # heads 2, 3
    h = CFG.hidden
    assert np.array_equal(
        shard, np.concatenate([w[:, h // 2 : h], w[:, 3 * h // 2 : 2 * h], w[:, 5 * h // 2 :]], axis=1)
    )


@pytest.mark.parametrize(
    "knob, cfg",
    [
        ("heads", ShadowConfig(layers=2, hidden=12, heads=3, ffn=32, seq_len=8, vocab=24)),
        ("ffn", ShadowConfig(layers=2, hidden=16, heads=4, ffn=33, seq_len=8, vocab=24)),
        ("vocab", ShadowConfig(layers=2, hidden=16, heads=4, ffn=32, seq_len=8, vocab=25)),
    ],
)
def test_rejects_tp_not_dividing_heads_ffn_or_vocab(knob, cfg):
    params = init_params(cfg, seed=0)
    with pytest.raises(ValueError, match=rf"does not divide {knob}"):
        TensorParallelStage(cfg, 0, 1, params, 1, Sharding(tp=2))
    with pytest.raises(ValueError, match=rf"does not divide {knob}"):
        shard_params(params, cfg, list(params), 2, 0)


def test_rejects_sequence_not_divisible_by_tp_under_sequence_parallelism():
    stage = TensorParallelStage(CFG, 0, 1, init_params(CFG, seed=0), 1, Sharding(tp=4, sequence_parallel=True))
    tokens = np.zeros((BATCH, 6), dtype=int)
    with pytest.raises(ValueError, match=r"tp \(4\) to divide the sequence length \(6\)"):
        stage.forward(0, tokens, tokens)


def test_rejects_backward_before_forward_and_grad_sync_before_backward():
    stage = TensorParallelStage(CFG, 0, 1, init_params(CFG, seed=0), 1, Sharding(tp=2, sequence_parallel=True))
    with pytest.raises(RuntimeError, match="backward before its forward"):
        stage.backward(0, None)
    with pytest.raises(RuntimeError, match=r"grad_sync before the backward of microbatches \[0\]"):
        stage.grad_sync()
