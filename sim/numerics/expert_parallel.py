"""Expert parallelism on the shadow model: an MoE layer's experts spread over ep ranks, each
rank's tokens travelling to their experts and back by all_to_all (the exchanges are real
collectives), and the dispatch traffic a routing implies.
"""

from __future__ import annotations

import numpy as np

from clustersim.sim.collectives.ops import Pieces
from clustersim.sim.numerics.moe import (
    MLP_PARAMS,
    MoEConfig,
    combine,
    combine_backward,
    experts_backward,
    experts_forward,
    experts_of_rank,
    route_group,
)
from clustersim.sim.numerics.routing import Routing


def _expert_major(arrived: np.ndarray) -> np.ndarray:
    """Arrival positions of the received rows, reordered from (source, expert, priority) to
    (expert, source, priority); arrived[src, e] = rows from src for local expert e."""
    starts = (np.cumsum(arrived) - arrived.reshape(-1)).reshape(arrived.shape)  # (ep, epr)
    sources, local_experts = arrived.shape
    return np.concatenate(
        [
            np.arange(starts[src, e], starts[src, e] + arrived[src, e])
            for e in range(local_experts)
            for src in range(sources)
        ]
    )


class ExpertParallelMoE:
    """One EP rank: its tokens' group, its experts (`experts_of_rank`), a replica of W_gate and of
    the shared expert. Expert grads are complete on the owning rank; W_gate and shared-expert
    grads are this rank's partials, which the caller sums over the EP ranks. (Under tensor
    parallelism each TP rank runs this on its share of the tokens, so every grad here is also a
    partial over the TP ranks: TensorParallelStage.grad_sync sums them.)

    `forward(x)` and `backward(dout)` are generators; each exchange is
    `received = yield ("all_to_all", send)` with `received` the pieces 0->r, ..., (n-1)->r
    (sim.collectives.ops). `send` is the counts (cut evenly), or `Pieces(flat, counts_row, shares)`:
    counts_row[j] elements go to rank j and shares[j] is that piece's size as a fraction of the
    exchange's even-routing size (rows to j / the group's nominal rows, `MoEConfig.nominal_rows`),
    which lets a timed run size each piece by the real routing. The combines (3 and 5) are
    `yield ("all_to_all", send, work)`: the rows this rank's experts just processed over their
    even share, how much longer than the cost model's estimate the experts took. In order:

      forward  1. counts   (int64) to rank j: this group's admitted rows for each of j's experts.
                           Element counts alone cannot say which local expert a row is for, so the
                           receiver learns its (source, expert) row counts from this small exchange
                           first. Megatron-core's all_to_all dispatcher gets the same numbers by an
                           all-gather of every rank's per-expert counts, then regroups arrivals by
                           expert (its sort_chunks_by_idxs, our `_expert_major`).
               2. dispatch x rows to their experts' ranks, in (expert, priority) order
               3. combine  expert outputs back, in arrival order; weighted and summed at the source
      backward 4. dispatch dL/d(expert output) rows, cut as in 2
               5. combine  dL/d(expert input) rows, cut as in 3 (the counts of 1 are reused)

    One forward may be pending at a time: backward consumes it.
    """

    def __init__(self, p, name: str, cfg: MoEConfig, ep: int, rank: int):
        self.name, self.cfg, self.ep, self.rank = name, cfg, ep, rank
        self.experts = experts_of_rank(rank, cfg.num_experts, ep)
        owners = [f"expert{e}" for e in self.experts] + (["shared"] if cfg.shared else [])
        names = [f"{name}.gate.w"] + [f"{name}.{o}.{suffix}" for o in owners for suffix in MLP_PARAMS]
        self.params = {n: p[n] for n in names}
        self._pending = None

    def forward(self, x):
        """Generator of exchanges 1-3; returns y (b, s, h) for this rank's tokens x (b, s, h)."""
        if self._pending is not None:
            raise RuntimeError(f"EP rank {self.rank}: a second forward before the backward of the first")
        b, s, h = x.shape
        x2d = x.reshape(-1, h)  # (T, h)
        if self.cfg.group_tokens not in (None, len(x2d)):
            raise ValueError(f"EP rank {self.rank}: {len(x2d)} tokens, but routing groups of {self.cfg.group_tokens}")
        nominal = self.cfg.nominal_rows(len(x2d))
        routing = route_group(self.params, self.name, x2d, self.cfg)
        per_rank = routing.tokens_per_expert.reshape(self.ep, -1)  # (ep, epr): rows for each rank's experts
        received = yield ("all_to_all", per_rank.reshape(-1).astype(np.int64))
        arrived = received.reshape(self.ep, -1)  # (ep, epr): rows from each source for each local expert
        send = (per_rank.sum(axis=1) * h, per_rank.sum(axis=1) / nominal)  # (counts, shares) per destination
        back = (arrived.sum(axis=1) * h, arrived.sum(axis=1) / nominal)
        received = yield ("all_to_all", Pieces(x2d[routing.slot_tokens].reshape(-1), *send))
        order = _expert_major(arrived)
        out, c_experts = experts_forward(
            self.params, self.name, self.experts, received.reshape(-1, h)[order], arrived.sum(axis=0)
        )  # (R, h), expert-major
        in_arrival_order = np.empty_like(out)
        in_arrival_order[order] = out
        work = arrived.sum() / nominal
        out = yield ("all_to_all", Pieces(in_arrival_order.reshape(-1), *back), work)
        y, c_source = combine(self.params, self.name, x2d, routing, out.reshape(-1, h), self.cfg)
        self._pending = (routing, c_source, c_experts, order, send, back, work)
        return y.reshape(b, s, h)

    def backward(self, dout):
        """Generator of exchanges 4-5; returns (dx (b, s, h), grads of this rank's parameters)."""
        if self._pending is None:
            raise RuntimeError(f"EP rank {self.rank}: backward without a forward")
        (routing, c_source, c_experts, order, send, back, work), self._pending = self._pending, None
        h = dout.shape[-1]
        dx, drows, grads = combine_backward(dout.reshape(-1, h), c_source)  # (T, h), (A, h)
        received = yield ("all_to_all", Pieces(drows.reshape(-1), *send))
        dxrows, g_experts = experts_backward(received.reshape(-1, h)[order], c_experts)  # (R, h), expert-major
        in_arrival_order = np.empty_like(dxrows)
        in_arrival_order[order] = dxrows
        dxrows = yield ("all_to_all", Pieces(in_arrival_order.reshape(-1), *back), work)
        np.add.at(dx, routing.slot_tokens, dxrows.reshape(-1, h))
        return dx.reshape(dout.shape), grads | g_experts


def traffic_matrix(routings: list[Routing], ep: int, experts_per_rank: int, bytes_per_token: float) -> np.ndarray:
    """Dispatch bytes (ep, ep): [i, j] = admitted rows of rank i's group for rank j's experts times
    bytes_per_token (the diagonal stays on its rank). The combine moves the transpose."""
    if len(routings) != ep:
        raise ValueError(f"{len(routings)} routings for ep = {ep} ranks")
    for rank, r in enumerate(routings):
        if r.tokens_per_expert.size != ep * experts_per_rank:
            raise ValueError(
                f"rank {rank}: {r.tokens_per_expert.size} experts != ep ({ep}) x experts_per_rank ({experts_per_rank})"
            )
    rows = np.array([r.tokens_per_expert.reshape(ep, experts_per_rank).sum(axis=1) for r in routings])  # (ep, ep)
    return rows * float(bytes_per_token)
