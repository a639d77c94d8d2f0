"""Megatron tensor parallelism (Shoeybi et al. 2019) and sequence parallelism (Korthikanti et al.
2022) on the shadow model: one rank k of a tensor-parallel group of t ranks runs its shard of a
pipeline stage, and every sum or gather over the group is a real collective. The layers (f and g,
column- and row-parallel linears, the vocab-parallel embedding and head) are in
sim/numerics/tp_layers.py; this module puts a stage together from them.

An MoE MLP splits the tokens, not the experts (Megatron-Core with expert tensor parallel 1): inside
f and g, rank k routes chunk k of the microbatch's T = b s tokens, (b, s) order, with whole experts

    Y = g( [0; ...; MoE(X_k); ...; 0] ),   X = f(LN2(x)) = [X_0; ...; X_{t-1}],  X_k (T/t, h)

so its gate, shared expert and experts see only their rank's tokens, and their gradients are
partial sums over the group, summed once per step by `grad_sync`.

`forward`, `backward` and `grad_sync` return generators: when the math needs a collective the
generator yields (kind, this rank's input in sim/collectives/ops.py's meaning) and is sent the
rank's output; its return value (StopIteration.value) is the op's result. A caller drives the t
ranks' generators in lockstep; they share no mutable state.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from clustersim.schedules.zero3 import unit_ranges
from clustersim.sim.numerics.expert_parallel import ExpertParallelMoE
from clustersim.sim.numerics.layers import gelu, gelu_grad
from clustersim.sim.numerics.moe import experts_of_rank, moe_backward, moe_forward
from clustersim.sim.numerics.plan import Sharding
from clustersim.sim.numerics.sharding import is_sharded, shard_params
from clustersim.sim.numerics.stages import StageChecks, stage_layers, stage_param_names
from clustersim.sim.numerics.tp_layers import TensorParallelLayers
from clustersim.sim.numerics.transformer import (
    ShadowConfig,
    attention_core_backward,
    attention_core_forward,
    layernorm_backward,
    layernorm_forward,
)

UNIT_BOUNDARY = "unit"  # what a generator yields where a ZeRO-3 unit ends a piece without a collective


class _MoECache(NamedTuple):
    """What an MoE MLP's backward needs: the expert path's state (an ExpertParallelMoE, or
    moe_forward's caches when ep = 1) and this rank's token rows [lo, lo + rows) of the T."""

    inner: object
    lo: int
    rows: int


class TensorParallelStage(TensorParallelLayers, StageChecks):
    """Tensor-parallel rank k of one pipeline stage (StageModel's layers, interface and checks).

    Activations between stages are (b, s, h), identical on every rank, or with sequence
    parallelism this rank's sequence chunk k (b, s/t, h); stage 0 takes tokens (b, s) on every rank.
    `params` and `grads` hold this rank's shards (`shard_params`).
    """

    def __init__(
        self,
        cfg: ShadowConfig,
        stage: int,
        num_stages: int,
        params: dict[str, np.ndarray],
        num_microbatches: int,
        sharding: Sharding,
        recompute_full: bool = False,
    ):
        """`sharding`: this rank's place in its tensor-parallel group (tp 1 runs no TP
        collective) and its MoE layers' expert-parallel groups (ExpertParallelMoE).
        `recompute_full`: keep only each microbatch's input and run the forward (with its
        collectives) again at the start of the backward."""
        self.ep, self.ep_rank = sharding.ep, sharding.ep_rank
        self.cfg = cfg
        self.stage = stage
        self.num_stages = num_stages
        self.num_microbatches = num_microbatches
        self.tp, self.tp_rank = sharding.tp, sharding.tp_rank
        self.sequence_parallel = sharding.sequence_parallel
        self.recompute_full = recompute_full
        self.layers = stage_layers(cfg, stage, num_stages)
        self.units = unit_ranges(self.layers, sharding.unit_layers)  # ZeRO 3's, or one: the stage
        self.is_first = stage == 0
        self.is_last = stage == num_stages - 1
        self.params = shard_params(params, cfg, stage_param_names(cfg, stage, num_stages), self.tp, self.tp_rank)
        self.grads = {name: np.zeros_like(value) for name, value in self.params.items()}
        self.losses: dict[int, float] = {}
        self.backward_done: set[int] = set()
        self._tapes: dict[int, object] = {}  # mb -> the forward's tape, or (input, targets) to recompute it
        self._weight_grads = {}

    def _where(self, mb: int) -> str:
        return f"stage {self.stage}, tp rank {self.tp_rank}, microbatch {mb}"

    # -- public ops: checked when called, run as generators -----------------------------------------

    def forward(self, mb: int, inp: np.ndarray, targets: np.ndarray | None = None):
        """Generator returning this stage's output activations, or on the last stage (which needs
        `targets` (b, s)) the microbatch's mean token loss (equal on every rank)."""
        self._check_forward(mb, targets)
        if self.sequence_parallel and self.is_first and inp.shape[1] % self.tp:
            raise ValueError(
                f"{self._where(mb)}: sequence parallelism needs tp ({self.tp}) to divide the "
                f"sequence length ({inp.shape[1]})"
            )
        return self._forward(mb, inp, targets if self.is_last else None)

    def backward(self, mb: int, dout: np.ndarray | None, split: bool = False):
        """Generator accumulating this microbatch's gradients and returning dL/d(input) in the
        input's layout (None on stage 0). `dout` is None on the last stage, which seeds 1/m.
        `split`: a zero-bubble B, whose gradients wait for `weight_gradient(mb)`."""
        seed = self._check_backward(mb, dout)
        return self._backward(mb, seed, self._tapes.pop(mb), split)

    def grad_sync(self):
        """Generator summing over the group the gradients each rank computed from its own share of
        the tokens (`partial_grad_names`). Run it once per step, after the last backward and before
        the optimizer (the program has it for tp > 1; over one rank it changes nothing). When every
        gradient is whole (no sequence parallelism, no MoE layer) it yields nothing."""
        for what, missing in (("backward", self.missing_backward()), ("W", self.missing_weight_gradients())):
            if missing:
                raise RuntimeError(
                    f"stage {self.stage}, tp rank {self.tp_rank}: grad_sync before the {what} of microbatches {missing}"
                )
        return self._grad_sync()

    # -- the generators -----------------------------------------------------------------------------

    def _forward(self, mb, inp, targets):
        x, tapes, inputs = inp, [], []
        for k in range(len(self.units)):
            yield from self._unit_boundary(k)
            inputs.append(x)
            x, tape = yield from self._unit_forward(k, x, targets)
            tapes.append(tape)
        self._tapes[mb] = (inputs, targets) if self.recompute_full else tapes
        if self.is_last:
            self.losses[mb] = x
        return x

    def _unit_boundary(self, k: int):
        """Between two ZeRO-3 units (k > 0) with no tensor-parallel collective there to end the
        piece (tp = 1), the program's op ends a piece: yield UNIT_BOUNDARY, resumed with None."""
        if k and self.tp == 1:
            yield (UNIT_BOUNDARY, None)

    def _unit_forward(self, k, x, targets):
        """Unit k's layers on x (the embedding with the first unit, the head with the last)."""
        tape = []
        if self.is_first and k == 0:
            x, cache = yield from self._embed_forward(x)  # (b, s, h) or (b, s/t, h)
            tape.append((self._embed_backward, cache))
        for i in self.units[k]:
            x, cache = yield from self._block_forward(f"layer{i}", x)
            tape.append((self._block_backward, cache))
        if self.is_last and k == len(self.units) - 1:
            x, cache = yield from self._head_forward(x, targets)
            tape.append((self._head_backward, cache))
        return x, tape

    def _backward(self, mb, seed, kept, split):
        """Unit by unit, last to first; under full recompute each unit's forward runs again from
        its kept input just before its backward (per-unit checkpointing). Each unit's gradients
        count as it ends (ZeRO 3 reduce-scatters them then), or wait for W (`split`)."""
        dout, kept_for_w = seed, {}
        for j, k in enumerate(reversed(range(len(self.units)))):
            yield from self._unit_boundary(j)
            if self.recompute_full:
                inputs, targets = kept
                _, tape = yield from self._unit_forward(k, inputs[k], targets)
            else:
                tape = kept[k]
            grads: dict[str, np.ndarray] = {}
            for backward, cache in reversed(tape):
                dout, g = yield from backward(dout, cache)
                grads |= g
            if split:
                kept_for_w |= grads
            else:
                self._accumulate(grads)
        self._backward_done(mb, kept_for_w, split)
        return dout

    def partial_grad_names(self) -> list[str]:
        """The gradients left partial over the group: each MoE layer's gate, shared expert and this
        EP rank's experts (token split); with sequence parallelism also every other replicated
        parameter but embed.pos (layernorm g and b, attn.proj.b, mlp.proj.b, final_ln g and b), as
        they act on sequence chunks. The other EP ranks' experts are left out: this rank never
        runs them, so their gradients are zero here, and summing zeros would only cost bytes the
        program's sum (sim.cost.stages.partial_grad_params: E/ep experts per layer) does not carry."""
        own = (
            {f"expert{e}" for e in experts_of_rank(self.ep_rank, self.cfg.moe.num_experts, self.ep)}
            if self.cfg.moe
            else set()
        )

        def partial(name: str) -> bool:
            if ".moe." in name:  # layer{L}.moe.{gate | shared | expert{e}}.*
                owner = name.split(".")[2]
                return not owner.startswith("expert") or owner in own
            return self.sequence_parallel and not is_sharded(name) and name != "embed.pos"

        return [name for name in self.grads if partial(name)]

    def _grad_sync(self):
        names = self.partial_grad_names()
        if not names:
            return
        total = yield ("all_reduce", np.concatenate([self.grads[n].reshape(-1) for n in names]))
        offset = 0
        for n in names:
            g = self.grads[n]
            g[...] = total[offset : offset + g.size].reshape(g.shape)
            offset += g.size

    def _block_forward(self, n, x):
        """Pre-LN block on x (b, s, h), or (b, s/t, h) under SP, with the attention's heads and the
        MLP's ffn slice of rank k."""
        a, c_ln1 = layernorm_forward(self.params, f"{n}.ln1", x)
        qkv, c_qkv = yield from self._column_forward(f"{n}.attn.qkv", a)  # (b, s, (h + 2 h_kv)/t)
        y, c_att = attention_core_forward(
            qkv, self.cfg.heads // self.tp, (self.cfg.kv_heads or self.cfg.heads) // self.tp
        )
        x = x + (yield from self._row_forward(f"{n}.attn.proj", y))
        m, c_ln2 = layernorm_forward(self.params, f"{n}.ln2", x)
        if int(n[len("layer") :]) in self.cfg.moe_layers:
            y_moe, c_moe = yield from self._moe_forward(f"{n}.moe", m)
            return x + y_moe, (n, c_ln1, c_qkv, c_att, y, c_ln2, c_moe)
        u, c_fc = yield from self._column_forward(f"{n}.mlp.fc", m)  # (b, s, ffn/t)
        x = x + (yield from self._row_forward(f"{n}.mlp.proj", gelu(u)))
        return x, (n, c_ln1, c_qkv, c_att, y, c_ln2, (c_fc, u))

    def _block_backward(self, dout, cache):
        n, c_ln1, c_qkv, c_att, y, c_ln2, mlp = cache
        if isinstance(mlp, _MoECache):
            dm, grads = yield from self._moe_backward(dout, mlp)
        else:
            c_fc, u = mlp
            dg, grads = yield from self._row_backward(f"{n}.mlp.proj", dout, gelu(u))  # (b, s, ffn/t)
            dm, g = yield from self._column_backward(dg * gelu_grad(u), c_fc)
            grads |= g
        dm, g = layernorm_backward(dm, c_ln2)
        dmid = dout + dm  # (b, s, h) or (b, s/t, h)
        grads |= g
        dy, g = yield from self._row_backward(f"{n}.attn.proj", dmid, y)  # (b, s, h/t)
        grads |= g
        da, g = yield from self._column_backward(attention_core_backward(dy, c_att), c_qkv)
        grads |= g
        da, g = layernorm_backward(da, c_ln1)
        return dmid + da, grads | g

    def _moe_forward(self, name, m):
        """Token split inside f and g: rank k's experts path on chunk k of the T = b s tokens;
        m (b, s, h) or (b, s/t, h) -> y (b, s, h) or (b, s/t, h). With ep > 1 the chunk's rows
        travel to their experts' ranks (ExpertParallelMoE), else every expert is here."""
        full = yield from self._enter_tp(m)  # (b, s, h) on every rank
        b, s, h = full.shape
        rows = b * s // self.tp
        lo = self.tp_rank * rows
        mine = full.reshape(-1, h)[lo : lo + rows][None]  # (1, T/t, h)
        if self.ep > 1:
            moe = ExpertParallelMoE(self.params, name, self.cfg.moe, self.ep, self.ep_rank)
            y, cache = (yield from moe.forward(mine)), moe
        else:
            y, cache = moe_forward(self.params, name, mine, self.cfg.moe)  # (1, T/t, h)
        partial = np.zeros_like(full).reshape(-1, h)  # (T, h), zero outside chunk k
        partial[lo : lo + rows] = y[0]
        return (yield from self._leave_tp(partial.reshape(b, s, h))), _MoECache(cache, lo, rows)

    def _moe_backward(self, dout, c: _MoECache):
        """dL/dm from dout (b, s, h) or (b, s/t, h): f's backward gathers (SP), chunk k goes back
        through the experts path, g's backward sums the ranks' partial dm."""
        dfull = yield from self._enter_tp(dout)  # (b, s, h)
        b, s, h = dfull.shape
        dmine = dfull.reshape(-1, h)[c.lo : c.lo + c.rows][None]  # (1, T/t, h)
        if isinstance(c.inner, ExpertParallelMoE):
            dx, grads = yield from c.inner.backward(dmine)
        else:
            dx, grads = moe_backward(dmine, c.inner)  # (1, T/t, h)
        partial = np.zeros_like(dfull).reshape(-1, h)  # (T, h)
        partial[c.lo : c.lo + c.rows] = dx[0]
        return (yield from self._leave_tp(partial.reshape(b, s, h))), grads
