"""How data parallelism cuts a stage's parameters: each gradient set flattened in parameter-name
order, cut into the program's buckets (numpy.array_split), each bucket cut into the chunks of the
data-parallel ranks reducing it (array_split again). A reduce-scatter leaves rank i with chunk i
of each bucket, the only part its ZeRO optimizer steps and the weight all-gather then spreads.

Under ZeRO 3 a set is flattened unit by unit (schedules.zero3) and each unit is one bucket.

A stage has two gradient sets: "grads" (every parameter but the expert-parallel experts) reduced
over all dp replicas, and "egrads" (this rank's experts, ep > 1) reduced over the dp / ep
replicas holding the same experts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from clustersim.sim.collectives.steps import split_bounds

GRADIENT_SETS = ("grads", "egrads")


def flat(tensors: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    """The named tensors raveled and concatenated, in `names` order: (sum of sizes,)."""
    return np.concatenate([tensors[name].ravel() for name in names]) if names else np.zeros(0)


def unflat(values: np.ndarray, into: dict[str, np.ndarray], names: list[str]) -> None:
    """Inverse of `flat`: write `values` back into the named tensors, in place."""
    offset = 0
    for name in names:
        size = into[name].size
        into[name][...] = values[offset : offset + size].reshape(into[name].shape)
        offset += size


def set_names(names: list[str], what: str, own_experts: set[str] | None) -> list[str]:
    """The names (sorted) in gradient set `what`. `own_experts` ("expert{e}" of this rank) is None
    without expert parallelism: then "grads" is everything and "egrads" nothing; with it,
    "egrads" is this rank's routed experts and "grads" the rest but the other ranks' experts."""
    names = sorted(names)
    if own_experts is None:
        return names if what == "grads" else []
    routed = {n: n.split(".")[2] for n in names if ".moe.expert" in n}  # layer{L}.moe.expert{e}.* -> expert{e}
    return [n for n in names if (n in routed) == (what == "egrads") and routed.get(n, "") in own_experts | {""}]


def unit_of_name(units: list[range]) -> Callable[[str], int]:
    """ZeRO 3: parameter name -> the unit (its layers: `units`, schedules.zero3.unit_ranges) of a
    stage holding it: layer{i}.* its layer's, the embeddings the first, the final layernorm and
    head the last."""
    of_layer = {i: k for k, layers in enumerate(units) for i in layers}

    def unit(name: str) -> int:
        if name.startswith("layer"):
            return of_layer[int(name.partition(".")[0][len("layer") :])]
        return 0 if name.startswith("embed.") else len(units) - 1

    return unit


def unit_sizes(
    tensors: dict[str, np.ndarray], names: list[str], unit: Callable[[str], int], buckets: list[range]
) -> list[int]:
    """Elements of the named tensors in each bucket of whole units (`buckets`: the units of each)."""
    sizes = [0] * (1 + max(map(unit, names)))
    for name in names:
        sizes[unit(name)] += tensors[name].size
    return [sum(sizes[u] for u in units) for units in buckets]


class Buckets:
    """Bucket and chunk bounds of each (gradient set, stage), for `dp` replicas of which every
    `ep` consecutive ones hold different experts. `counts[(set, stage)]`: how many buckets the
    program cuts that set into."""

    def __init__(self, counts: dict[tuple[str, int], int], dp: int, ep: int):
        self.counts, self.dp, self.ep = counts, dp, ep
        self._bounds: dict[tuple[str, int, int], list[tuple[int, int]]] = {}  # (set, stage, size) -> buckets

    def bounds(self, what: str, stage: int, size: int) -> list[tuple[int, int]]:
        """[lo, hi) of each bucket of a flat set of `size` elements."""
        key = (what, stage, size)
        if key not in self._bounds:
            edges = split_bounds(size, self.counts[(what, stage)]).tolist()
            self._bounds[key] = list(zip(edges[:-1], edges[1:]))
        return self._bounds[key]

    def fix(self, what: str, stage: int, sizes: list[int]) -> None:
        """Cut set `what` of a stage at given bucket sizes (ZeRO 3: one bucket per unit, its
        flat parameters) instead of into equal parts."""
        edges = np.cumsum([0, *sizes]).tolist()
        self._bounds[(what, stage, edges[-1])] = list(zip(edges[:-1], edges[1:]))

    def chunk(self, d: int, what: str, lo: int, hi: int) -> tuple[int, int]:
        """Replica d's chunk [lo', hi') of the bucket [lo, hi): its index's piece among the
        replicas reducing set `what` (all dp; for "egrads" the dp / ep holding the same experts)."""
        index, members = (d // self.ep, self.dp // self.ep) if what == "egrads" else (d, self.dp)
        edges = split_bounds(hi - lo, members)
        return lo + int(edges[index]), lo + int(edges[index + 1])
