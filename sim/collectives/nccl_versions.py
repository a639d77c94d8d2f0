"""The NCCL release a run used, and the ring constants of its tuning.cc that differ from the latest's.

Published nccl-tests tables come from several NCCL releases, and what tuning.cc says about a ring on
one node changed between them (read in NVIDIA/nccl at each release tag, src/graph/tuning.cc
ncclTopoTuneModel):
- the ring LL bus bandwidth: `busBw * 1.0/4.0` for an all-reduce (1/3 for all-gather and
  reduce-scatter on one node) up to v2.20.5, `busBw * .5` from v2.21.5 on, both within llMaxBws
  (87.7 GB/s on one Ampere node in every release);
- baseLat of the ring's LL and LL128 (3.6 and 10.0 us up to v2.17.1, 6.6 and 14.0 from v2.18.1),
  and hwLat of a ring LL step over NVLink (0.47 us, then 0.6);
- the Ampere bus cap `if (compCap80) busBw = std::min(busBw, 235.0f)`, from v2.7.5 to v2.17.1;
- the ring LL128 per-channel cap: `ll128MaxBwPerCh` per collective up to v2.9.9 (all-reduce 16.9,
  all-gather 18.3, reduce-scatter 15.2 GB/s), 20.0 from v2.10.3 (Ampere's entry of the later
  per-architecture table too).
The layer's bandwidths are these constants (sim.collectives.nccl turns them into rates), so a run
under an older NCCL runs at that NCCL's figures. Only the single-node ring's constants switch: the
tree's, NVLS's and the network's of older releases are not ported (they take the latest's).
"""

from __future__ import annotations

from dataclasses import dataclass

# The release the layer ports (nccl_tuning reads master just after it) and the oldest whose ring constants
# this module has (v2.8.4-1 and v2.9.9-1 differ only in CollNet's)
LATEST = "2.30.7"
LATEST_RELEASE = (2, 30, 7)
OLDEST = (2, 8, 4)

# The first release with each NVLink SHARP algorithm: src/transport/nvls.cc and tuning.cc's NCCL_ALGO_NVLS
# appear in v2.17.1-1, NCCL_ALGO_NVLS_TREE in v2.18.1-1; a run on an older release has neither
FIRST_RELEASE = {"nvls": (2, 17, 1), "nvls_tree": (2, 18, 1)}

# v2.9.9 src/graph/tuning.cc ll128MaxBwPerCh, per collective
LL128_PER_CHANNEL_V2_9_GBps = {"all_reduce": 16.9, "all_gather": 18.3, "reduce_scatter": 15.2}


@dataclass(frozen=True)
class RingConstants:
    """One release's ring constants where they differ between releases (latencies in us, GB/s)."""

    ll_factor_all_reduce: float  # ring LL busBw x this for an all-reduce
    ll_factor_other: float  # ... for all-gather and reduce-scatter on one node
    base_latency_us: tuple[float, float, float] | None  # baseLat, ring (LL, LL128, Simple); None: the latest's
    nvlink_hop_us: tuple[float, float, float] | None  # hwLat NVLINK, ring (LL, LL128, Simple); None: the latest's
    ampere_bus_cap_GBps: float  # an A100 ring's bus bandwidth at most this (inf: no cap)
    ampere_ll128_per_channel_GBps: dict[str, float]  # the ring LL128 per-channel cap, per collective


def parse(version: str) -> tuple[int, int, int]:
    """'2.9.9' -> (2, 9, 9); a release this module has no constants for is an error."""
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"NCCL version {version!r} is not MAJOR.MINOR.PATCH (e.g. 2.18.5)")
    major, minor, patch = (int(p) for p in parts)
    if not OLDEST <= (major, minor, patch) <= LATEST_RELEASE:
        raise ValueError(f"NCCL version {version!r} outside the releases ported (2.8.4 to {LATEST})")
    return major, minor, patch


def ring_constants(version: tuple[int, int, int]) -> RingConstants:
    """The ring constants of tuning.cc in `version` (release boundaries in the module docstring)."""
    old_latency = version < (2, 18, 1)
    quarter = version < (2, 21, 5)
    per_op = version < (2, 10, 3)
    return RingConstants(
        ll_factor_all_reduce=0.25 if quarter else 0.5,
        ll_factor_other=1 / 3 if quarter else 0.5,
        base_latency_us=(3.6, 10.0, 8.4) if old_latency else None,
        nvlink_hop_us=(0.47, 1.9, 3.4) if old_latency else None,
        ampere_bus_cap_GBps=235.0 if old_latency else float("inf"),
        ampere_ll128_per_channel_GBps=LL128_PER_CHANNEL_V2_9_GBps if per_op else {},
    )
