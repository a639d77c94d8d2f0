"""The network of a symmetric run solved once per orbit: one flow stands for a message and its images.

Under sim.scale.symmetry every message moves together with its images, and the shifts that make the
images are automorphisms of the fabric: they map GPUs to GPUs, links to links of the same capacity
and routes to routes. The max-min fair allocation of a flow set is unique, so when the set is
invariant under the shifts so is the allocation: every image of a flow gets the same rate. It can
then be found on the quotient. Keep one flow per orbit of messages, on one link per orbit of links
(the canonical one, the lowest id). An orbit of |G| messages whose route crosses the link orbit O
(|O| links) m times puts m |G| / |O| flows on each of its links, so with r the orbit's rate the
real constraint sum r m |G| / |O| <= capacity is, divided by |G| / |O|, the quotient's

    sum over flow orbits of r m <= capacity x |O| / |G|    (on the canonical link of O)

which is what sim.network.flows fills (a path that crosses an orbit twice lists its link twice). Real loads
and flow counts are the quotient's times |G| / |O| (`per_link`). Link orbits are learnt from the
routes of a message's images: the i-th links of the images' routes form the orbit of the i-th link.
A route that tells images apart (their lengths differ, or a link falls in two orbits) is an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from clustersim.sim.network.routes import Routes


class MessageOrbits:
    """Which messages are images of one another under a group of GPU permutations (`image[k, gpu]`,
    the identity first, acting freely on the GPUs that send)."""

    def __init__(self, image: np.ndarray):
        self.image = image
        self.size, num_gpus = image.shape
        self.inverse = np.empty_like(image)
        for k, perm in enumerate(image):
            self.inverse[k, perm] = np.arange(num_gpus)
        self.rep_of = image.min(axis=0)  # the lowest GPU of each GPU's orbit
        self.shift_of = np.empty(num_gpus, dtype=np.int64)  # k with image[k, rep_of[g]] == g
        reps = np.unique(self.rep_of)
        for k in range(self.size - 1, -1, -1):
            self.shift_of[image[k, reps]] = k

    def keys(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """One number per message, equal for messages that are images of each other: the message
        moved by the shift that takes its source to the orbit's lowest GPU."""
        return self.rep_of[src] * self.image.shape[1] + self.inverse[self.shift_of[src], dst]

    def message_keys(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """`keys`, told apart by occurrence: the j-th message from src to dst and the j-th of each
        of its images share a key, the j-th and the k-th from src to dst do not (a collective's
        channels send the same pair a chunk each, as many flows on the real network)."""
        pair = src.astype(np.int64) * self.image.shape[1] + dst
        order = np.argsort(pair, kind="stable")
        ranked = pair[order]
        position = np.arange(len(pair))
        first = np.maximum.accumulate(np.where(np.r_[True, ranked[1:] != ranked[:-1]], position, 0))
        occurrence = np.empty(len(pair), dtype=np.int64)
        occurrence[order] = position - first
        return self.keys(src, dst) * (int(occurrence.max(initial=0)) + 1) + occurrence

    def members(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every image of each message, message-major: (sources, destinations) of length |G| x F."""
        return self.image[:, src].T.ravel(), self.image[:, dst].T.ravel()

    def closed(self, src: np.ndarray, dst: np.ndarray) -> bool:
        """Whether the messages are whole orbits: every image of each is among them, as often."""
        return bool((np.unique(self.message_keys(src, dst), return_counts=True)[1] == self.size).all())


class Orbits(MessageOrbits):
    """Message orbits, and the link orbits and quotient link capacities of a fabric they move on."""

    def __init__(self, image: np.ndarray, capacity_Bps: np.ndarray):
        super().__init__(image)
        num_links = len(capacity_Bps)
        self.canon = np.arange(num_links)  # link -> its orbit's canonical link
        self.per_link = np.ones(num_links)  # |G| / |O|: real flows per link for one quotient flow
        self.capacity_Bps = capacity_Bps.astype(float)  # the quotient's: capacity x |O| / |G| on canonical links
        self._real_capacity = capacity_Bps
        self._known = np.zeros(num_links, dtype=bool)

    def learn(self, ptr: np.ndarray, links: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """From the routes (CSR) of `count` messages' members (as `members` lists them), learn the
        link orbits they cross; return the first member's route on canonical links (CSR)."""
        lengths = ptr[1:] - ptr[:-1]
        out_ptr = np.zeros(count + 1, dtype=np.int64)
        out: list[np.ndarray] = []
        for j in range(count):
            rows = slice(j * self.size, (j + 1) * self.size)
            if (lengths[rows] != lengths[j * self.size]).any():
                raise ValueError("the routes of a message's images differ in length: the fabric is not symmetric")
            routes = links[ptr[j * self.size] : ptr[(j + 1) * self.size]].reshape(self.size, -1)
            for column in routes.T:
                self._learn_orbit(column)
            out.append(self.canon[routes[0]])
            out_ptr[j + 1] = out_ptr[j] + routes.shape[1]
        return out_ptr, np.concatenate(out) if out else np.zeros(0, np.int64)

    def _learn_orbit(self, column: np.ndarray) -> None:
        """The links `column` (one link of every image's route) are one orbit."""
        orbit = np.unique(column)
        first = orbit[0]
        if self._known[orbit].any():
            if not (
                self._known[orbit].all()
                and (self.canon[orbit] == first).all()
                and self.per_link[first] == self.size / len(orbit)
            ):
                raise ValueError(f"link {first} falls in two orbits: the fabric is not symmetric under the shifts")
            return
        if (self._real_capacity[orbit] != self._real_capacity[first]).any():
            raise ValueError(f"link {first}'s orbit mixes capacities: the fabric is not symmetric under the shifts")
        self._known[orbit] = True
        self.canon[orbit] = first
        self.per_link[orbit] = self.size / len(orbit)
        self.capacity_Bps[first] = self._real_capacity[first] * len(orbit) / self.size

    def routes(self, routes: Routes, src: np.ndarray, dst: np.ndarray) -> tuple:
        """For messages given by a symmetric run, one per orbit among them: (which of them stand
        for their orbits, their src, dst, routed mask, routes on canonical links (CSR, of the
        routed) and latency; each routed orbit's members as (src, dst, route CSR); every member's
        src and dst, orbit-major)."""
        picked = np.unique(self.message_keys(src, dst), return_index=True)[1]
        picked.sort()
        full_src, full_dst = self.members(src[picked], dst[picked])
        routed = full_src != full_dst
        ptr, links, latency = routes.route(full_src, full_dst, routed)
        size = self.size
        flow_ptr, flow_links = self.learn(ptr, links, int(routed[::size].sum()))
        members = []
        for j, first in enumerate(np.flatnonzero(routed)[::size].tolist()):  # each routed orbit's first member
            rows = ptr[j * size : (j + 1) * size + 1]
            members.append(
                (
                    full_src[first : first + size],
                    full_dst[first : first + size],
                    rows - rows[0],
                    links[rows[0] : rows[-1]],
                )
            )
        return (
            picked,
            src[picked],
            dst[picked],
            routed[::size],
            flow_ptr,
            flow_links,
            latency[::size],
            members,
            full_src,
            full_dst,
        )
