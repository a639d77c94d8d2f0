"""Symmetry: simulate one rank per orbit and move every image's bytes, for production-size runs.

A data-parallel replica and a tensor-parallel shard do exactly what their neighbours do: the same
ops at the same times on their own GPUs. Shifting every rank's coordinates (d, p, t) to
(d + a ep, p, t + b) (mod dp, tp) maps the program onto itself (a multiple of ep keeps the
expert-parallel groups whole), and on a topology those shifts map onto itself (the nodes of a
rail-optimised fat tree with adaptive routing, a switch) every image then sees the same network
as its representative. So the engine walks only the representatives, ranks (d < ep, p, t = 0),
and whenever one of them puts bytes on the network it puts every image's bytes there too: a
message goes out together with its images, a collective runs on every image of its group at
once. Link loads, congestion and the flow table are the full run's; only the walking is saved.

Where the fabric tells replicas apart (blocks straddling leaf groups of a fat tree), those whose
blocks lie on it alike still do the same at the same times when nothing they share can slow one
more than another (a non-blocking tree, sim.build): the images then turn each such class of
blocks round itself, one representative per class, and the network solves one flow per orbit of
the shard shifts alone.

Whether the images really kept pace is checked, not assumed: every image of a message must land
at the same time as its representative (`image_spread_s`, reported in summary.json). A topology
whose routing tells images apart (per-flow ECMP hashing) breaks that, and the run says so; then
`simulate(..., exact=True)` walks every rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from clustersim.schedules.layout import Layout
from clustersim.sim.network.orbits import MessageOrbits
from clustersim.sim.network.records import FlowTable
from clustersim.sim.results.metrics import stream_of_flows


class Symmetry:
    """The images of a layout's ranks, as maps from each rank to its image under each row."""

    def __init__(self, layout: Layout, fabric_step: int | None = None, classes: list[list[int]] | None = None):
        """Rows: each turn j of the replica blocks (ep replicas each) times each shard shift b.
        Default, one class of every block: turn j shifts blocks by j (replica shifts), and
        `fabric_step` (in replicas; default every shift, a switch) says which shifts are also
        automorphisms of the fabric, so the network may solve one flow per orbit of them
        (sim.network.orbits). `classes`: the fabric tells blocks apart (they straddle leaf
        groups), but the blocks of a class lie on it alike; turn j then moves each class's
        k-th block to its (k + j)-th, in every class at once, and only the shard shifts are
        the fabric's. Singleton classes: every replica walked, one shard of each."""
        grid = layout.grid  # (dp, pp, tp) -> rank
        blocks = layout.dp // layout.ep
        classes = classes or [list(range(blocks))]
        turns = math.lcm(*(len(c) for c in classes))
        d, p, t = np.meshgrid(np.arange(layout.dp), np.arange(layout.pp), np.arange(layout.tp), indexing="ij")
        self.image = np.zeros((turns * layout.tp, layout.world), dtype=np.int64)  # [row, rank] -> rank
        self.shifts: list[tuple[int, int]] = []  # (replicas turned, shards shifted) of each row of `image`
        for j in range(turns):
            block_to = np.empty(blocks, dtype=np.int64)
            for members in classes:
                block_to[members] = np.roll(members, -j)
            for b in range(layout.tp):
                row = grid[block_to[d // layout.ep] * layout.ep + d % layout.ep, p, (t + b) % layout.tp]
                self.image[len(self.shifts), grid.reshape(-1)] = row.reshape(-1)
                self.shifts.append((j * layout.ep, b))
        self._groups: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self._pairs: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        firsts = [members[0] * layout.ep + e for members in classes for e in range(layout.ep)]
        self.representatives = sorted(int(r) for r in grid[firsts, :, 0].reshape(-1))
        rep_of = np.empty(layout.world, dtype=np.int64)
        for rep in self.representatives:
            rep_of[self.image[:, rep]] = rep
        self.rep_of = rep_of  # rank -> the representative that stands for it
        step = (fabric_step or layout.ep) if len(classes) == 1 else turns * layout.ep
        self._fabric = [a % step == 0 for a, _ in self.shifts]

    def network_images(self, steps: Iterable[tuple[tuple[int, ...], list]]) -> np.ndarray | None:
        """The shifts under which the network may keep one flow per orbit (sim.network.orbits), as image
        rows: the fabric's, else its replica shifts, else the shard shifts, else None. The flows in
        flight must be whole orbits: a group some shift maps onto itself must run steps that the
        shift maps onto themselves (a ring turned by its own rotation is; halving-doubling is not).
        `steps`: each moving collective on a group that a shift maps onto itself, as its group and
        its steps' (sources, destinations)."""
        fabric = self._fabric
        candidates = [
            fabric,
            [f and b == 0 for f, (_, b) in zip(fabric, self.shifts)],
            [a == 0 for a, _ in self.shifts],
        ]
        steps = list(steps)
        for rows in candidates:
            if sum(rows) == 1:
                continue
            orbits = MessageOrbits(self.image[np.array(rows)])
            if all(orbits.closed(src, dst) for group, pairs in steps for src, dst in self._on_images(group, pairs)):
                return orbits.image
        return None

    def _on_images(self, group: tuple[int, ...], pairs: list) -> Iterable[tuple[np.ndarray, np.ndarray]]:
        """Each step's messages on `group` (GPUs), with the same step on each of the group's images."""
        images = np.array(self.groups(group))  # (images, members): images[k, i] is the image of group[i]
        order = np.argsort(group)
        members = np.asarray(group)[order]
        for src, dst in pairs:
            yield (
                images[:, order[np.searchsorted(members, src)]].ravel(),
                images[:, order[np.searchsorted(members, dst)]].ravel(),
            )

    @property
    def images_per_rank(self) -> int:
        return len(self.image)

    @property
    def world(self) -> int:
        return self.image.shape[1]

    def groups(self, group: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Every distinct image of a process group, the group itself first (a shift may map a
        group onto itself); kept per group, as a run meets the same few groups again and again."""
        if group not in self._groups:
            seen: dict[frozenset, tuple[int, ...]] = {}
            for members in self.image[:, list(group)].tolist():
                seen.setdefault(frozenset(members), tuple(members))
            self._groups[group] = list(seen.values())
        return self._groups[group]

    def pairs(self, src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
        """Every distinct image of a message src -> dst, as (sources, destinations), in row order
        (turning classes of different sizes together meets an image more than once); kept per pair."""
        if (src, dst) not in self._pairs:
            sources, destinations = self.image[:, src], self.image[:, dst]
            _, first = np.unique(sources * self.world + destinations, return_index=True)
            first.sort()
            self._pairs[src, dst] = sources[first], destinations[first]
        return self._pairs[src, dst]

    def expand(self, per_rank: list | dict) -> list | dict:
        """Per-rank values known for the representatives (a list by rank, or a dict by str(rank)
        as summary.json keeps them), filled in for every rank."""
        if isinstance(per_rank, dict):
            return {str(rank): per_rank[str(rep)] for rank, rep in enumerate(self.rep_of.tolist())}
        return [per_rank[rep] for rep in self.rep_of.tolist()]


MAX_IMAGE_ENTRIES = 1 << 24  # the image table's size limit (ranks x rows), 128 MiB


def listable(classes: list[list[int]] | None, blocks: int, entries_per_turn: int) -> list[list[int]]:
    """`classes` of blocks if turning them lists at most MAX_IMAGE_ENTRIES images (a turn per the
    lcm of their sizes, `entries_per_turn` each: coprime sizes make many), else (or None) every
    block its own class."""
    if classes is None or math.lcm(*map(len, classes)) * entries_per_turn > MAX_IMAGE_ENTRIES:
        return [[block] for block in range(blocks)]
    return classes


def image_spread_s(flows: FlowTable) -> float:
    """The largest gap between the landing times of one message's images (0.0 when they kept
    pace): a representative's point-to-point message (stream "send") and its images go out as
    one group, one label, so their end times must agree."""
    streams, stream_of = stream_of_flows(flows, flows.label)
    if "send" not in streams:
        return 0.0
    mask = stream_of == streams.index("send")
    if not mask.any():
        return 0.0
    label, end = flows.label[mask], flows.end_s[mask]
    latest, earliest = np.full(len(flows.labels), -np.inf), np.full(len(flows.labels), np.inf)
    np.maximum.at(latest, label, end)
    np.minimum.at(earliest, label, end)
    sent = np.isfinite(latest)
    return float((latest[sent] - earliest[sent]).max())
