"""Megatron's tensor-parallel layers on the shadow model (Shoeybi et al. 2019; sequence
parallelism, Korthikanti et al. 2022), as generators that yield their collectives:

    column-parallel  Y_k = X W_k,  W = [W_0 ... W_{t-1}]     (qkv by heads, fc by ffn, head by vocab)
    row-parallel     Y = sum_k X_k W_k + b,  W = [W_0; ...; W_{t-1}]   (attn proj, mlp proj)

Each column-parallel layer is entered through f and each row-parallel one left through g:
f = identity forward / all-reduce backward, g = all-reduce forward / identity backward. With
sequence parallelism the activations outside those regions are split along the sequence, f becomes
an all-gather (reduce-scatter backward) and g a reduce-scatter (all-gather backward). f and g are
each other's backward, so `_enter_tp` and `_leave_tp` below serve both directions. The
vocab-parallel embedding and LM head (with its cross-entropy) are here too: they are the same
column split, by vocabulary.

A generator yields (kind, this rank's input in sim/collectives/ops.py's meaning) and is sent the
rank's output; `TensorParallelStage` builds a stage from these layers.
"""

from __future__ import annotations

import numpy as np

from clustersim.sim.numerics.layers import linear_backward, linear_forward
from clustersim.sim.numerics.transformer import layernorm_backward, layernorm_forward


def _seq_major(x):
    """(b, s, h) -> flat (s, b, h), so an array_split into t chunks cuts sequence ranges."""
    return x.transpose(1, 0, 2).reshape(-1)


def _batch_major(flat, b, h):
    """Inverse of `_seq_major` for any sequence length."""
    return flat.reshape(-1, b, h).transpose(1, 0, 2)  # (b, s', h)


def _flat2(x):
    return x.reshape(-1, x.shape[-1])  # (b*s, last)


class TensorParallelLayers:
    """Tensor-parallel rank `tp_rank` of a group of `tp`: the layers that talk to the group.
    Subclasses set tp, tp_rank, sequence_parallel and params (this rank's shards)."""

    tp: int
    tp_rank: int
    sequence_parallel: bool
    params: dict[str, np.ndarray]

    # -- f and g ------------------------------------------------------------------------------------

    def _enter_tp(self, x):
        """f: before a column-parallel layer; SP gathers the sequence chunks (b, s/t, h) -> (b, s, h)."""
        if self.tp == 1 or not self.sequence_parallel:
            return x
        b, _, h = x.shape
        return _batch_major((yield ("all_gather", _seq_major(x))), b, h)

    def _leave_tp(self, x):
        """g: after a row-parallel layer, sum the ranks' partial (b, s, h); SP keeps chunk k (b, s/t, h)."""
        if self.tp == 1:
            return x
        if not self.sequence_parallel:
            return (yield ("all_reduce", x))
        b, _, h = x.shape
        return _batch_major((yield ("reduce_scatter", _seq_major(x))), b, h)

    # -- pieces: forward (out, cache) and backward (dx, grads), each a generator --------------------

    def _column_forward(self, name, x):
        return linear_forward(self.params, name, (yield from self._enter_tp(x)))  # (b, s, out/t)

    def _column_backward(self, dout, cache):
        dx, grads = linear_backward(dout, cache)  # dx partial (b, s, h)
        return (yield from self._leave_tp(dx)), grads

    def _row_forward(self, name, x):
        """Y = sum_k X_k W_k, then + b once: x (b, s, in/t) -> (b, s, h) or (b, s/t, h)."""
        return (yield from self._leave_tp(x @ self.params[f"{name}.w"])) + self.params[f"{name}.b"]

    def _row_backward(self, name, dout, x):
        """The bias gradient sums `dout` as it comes (a sequence chunk under SP: partial)."""
        dfull = yield from self._enter_tp(dout)  # (b, s, h)
        grads = {f"{name}.w": _flat2(x).T @ _flat2(dfull), f"{name}.b": _flat2(dout).sum(axis=0)}
        return dfull @ self.params[f"{name}.w"].T, grads  # (b, s, in/t)

    def _embed_forward(self, tokens):
        """Rank k looks up its vocab rows (zeros elsewhere), rank 0 adds the positions, g sums."""
        rows = self.params["embed.tok"].shape[0]
        local = tokens - self.tp_rank * rows  # (b, s)
        inside = (local >= 0) & (local < rows)
        x = np.where(inside[..., None], self.params["embed.tok"][np.where(inside, local, 0)], 0)  # (b, s, h)
        if self.tp_rank == 0:
            x = x + self.params["embed.pos"][: tokens.shape[1]]
        return (yield from self._leave_tp(x)), (local, inside)

    def _embed_backward(self, dout, cache):
        local, inside = cache
        dout = yield from self._enter_tp(dout)  # (b, s, h)
        dtok = np.zeros_like(self.params["embed.tok"])  # (V/t, h)
        np.add.at(dtok, local[inside], dout[inside])
        dpos = np.zeros_like(self.params["embed.pos"])  # (seq_len, h), whole on every rank
        dpos[: local.shape[1]] = dout.sum(axis=0)
        return None, {"embed.tok": dtok, "embed.pos": dpos}

    def _head_forward(self, x, targets):
        """Final LN, vocab-parallel logits z_k (b, s, V/t), and the cross-entropy from one all-gather
        of each rank's (logsumexp z_k, z_k[target] or 0): lse = logsumexp over ranks, z[target] = sum."""
        y, c_ln = layernorm_forward(self.params, "final_ln", x)
        y = yield from self._enter_tp(y)  # (b, s, h)
        z = y @ self.params["head.w"]  # (b, s, V/t)
        local = targets - self.tp_rank * z.shape[-1]
        inside = (local >= 0) & (local < z.shape[-1])
        zmax = z.max(axis=-1)  # (b, s)
        lse_k = zmax + np.log(np.exp(z - zmax[..., None]).sum(axis=-1))  # (b, s)
        picked = np.take_along_axis(z, np.where(inside, local, 0)[..., None], axis=-1)[..., 0]  # (b, s)
        parts = np.stack([lse_k, np.where(inside, picked, 0)]).reshape(-1)  # (2 b s,)
        if self.tp > 1:
            parts = yield ("all_gather", parts)
        parts = parts.reshape(self.tp, 2, *targets.shape)  # (t, 2, b, s)
        top = parts[:, 0].max(axis=0)
        lse = top + np.log(np.exp(parts[:, 0] - top).sum(axis=0))  # (b, s)
        loss = float((lse - parts[:, 1].sum(axis=0)).mean())
        return loss, (c_ln, y, z, lse, local, inside)

    def _head_backward(self, seed, cache):
        """dz_k = (softmax_k - onehot_k) seed / N with N = b s; the head's input gradient is partial."""
        c_ln, y, z, lse, local, inside = cache
        onehot = np.zeros_like(z)
        np.put_along_axis(onehot, np.where(inside, local, 0)[..., None], inside[..., None].astype(z.dtype), axis=-1)
        dz = (np.exp(z - lse[..., None]) - onehot) * (seed / lse.size)  # (b, s, V/t)
        dw = _flat2(y).T @ _flat2(dz)  # (h, V/t)
        dx = yield from self._leave_tp(dz @ self.params["head.w"].T)  # (b, s, h) or (b, s/t, h)
        dx, g_ln = layernorm_backward(dx, c_ln)
        return dx, g_ln | {"head.w": dw}
