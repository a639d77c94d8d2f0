"""Rank layout: rank <-> (dp, pp, tp) coordinates and the process groups that follow from them.

    grid = np.arange(world).reshape(sizes in ORDER)   # the last axis varies fastest
    rank of (d, p, t) = grid transposed to (dp, pp, tp) at [d, p, t]

With the default order ("dp", "pp", "tp") the tensor-parallel ranks are consecutive, so a TP
group stays inside a node (Megatron's default); groups are slices of the grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

AXES = ("dp", "pp", "tp")
DEFAULT_ORDER = ("dp", "pp", "tp")  # slowest to fastest varying


@dataclass(frozen=True)
class Layout:
    """The (dp, pp, tp) rank grid; `order` lists the axes from slowest to fastest varying."""

    dp: int
    pp: int
    tp: int
    order: tuple[str, ...] = DEFAULT_ORDER
    ep: int = 1  # expert-parallel degree, carved out of dp: ep consecutive data-parallel indices

    def __post_init__(self):
        if sorted(self.order) != sorted(AXES):
            raise ValueError(f"layout order {self.order} must name each of {AXES} once")
        for axis in (*AXES, "ep"):
            if getattr(self, axis) < 1:
                raise ValueError(f"{axis} must be >= 1, got {getattr(self, axis)}")
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp ({self.dp})")

    @property
    def world(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def grid(self) -> np.ndarray:
        """(dp, pp, tp) array of ranks."""
        sizes = [getattr(self, axis) for axis in self.order]
        laid = np.arange(self.world).reshape(sizes)
        return laid.transpose([self.order.index(axis) for axis in AXES])

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp) index of a rank."""
        d, p, t = np.argwhere(self.grid == rank)[0]
        return int(d), int(p), int(t)

    def dp_group(self, pp: int, tp: int) -> tuple[int, ...]:
        """The ranks that hold the same layers and shard (they reduce gradients together)."""
        return tuple(int(r) for r in self.grid[:, pp, tp])

    def pp_group(self, dp: int, tp: int) -> tuple[int, ...]:
        """One pipeline: the ranks of stages 0..pp-1 of replica `dp`, shard `tp`."""
        return tuple(int(r) for r in self.grid[dp, :, tp])

    def tp_group(self, dp: int, pp: int) -> tuple[int, ...]:
        return tuple(int(r) for r in self.grid[dp, pp, :])

    def ep_group(self, dp: int, pp: int, tp: int) -> tuple[int, ...]:
        """The ranks that hold one copy of all experts between them (DeepSpeed-MoE's layout): the ep
        consecutive data-parallel indices around `dp`, same stage and shard; an MoE layer's tokens
        travel among them."""
        first = dp // self.ep * self.ep
        return tuple(int(r) for r in self.grid[first : first + self.ep, pp, tp])

    def expert_dp_group(self, dp: int, pp: int, tp: int) -> tuple[int, ...]:
        """The ranks that hold the same experts (every ep-th data-parallel index): they reduce the
        experts' gradients together."""
        return tuple(int(r) for r in self.grid[dp % self.ep :: self.ep, pp, tp])
