"""The scenario's `cluster.nccl` section: collectives as NCCL runs them (sim.collectives.nccl), each
key a switch, and the NCCL release the run uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from clustersim.sim.collectives import nccl_versions
from clustersim.sim.collectives.nccl_tuning import PROTOCOLS
from clustersim.sim.scenario.fields import Section, one_of

if TYPE_CHECKING:  # what the checked name is to a type checker; built at run time below
    Protocol = str
else:
    Protocol = one_of(("auto", *PROTOCOLS), "NCCL protocol")


class NcclSection(Section):
    """Collectives as NCCL runs them (sim.collectives.nccl): present = on, each key a switch."""

    protocol: Protocol = Field("auto", description="auto (NCCL's size-based choice) or LL, LL128, Simple")
    tree: bool = Field(True, description="NCCL may pick its double-binary-tree all-reduce across nodes")
    nvls: bool = Field(True, description="NVLink SHARP all-reduce where the NVSwitch has it (H100, H200)")
    pxn: bool = Field(True, description="inter-node messages leave through the NIC on the destination's rail")
    copy_engine: bool = Field(False, description="intra-node copies of all_gather / all_to_all by copy engine")
    version: str = Field(
        nccl_versions.LATEST,
        description=f"the NCCL release the run uses (2.8.4 to {nccl_versions.LATEST}): an older one runs the "
        "single-node ring at its own tuning.cc constants (sim.collectives.nccl_versions)",
    )

    @field_validator("version")
    @classmethod
    def _a_release_ported(cls, version: str) -> str:
        nccl_versions.parse(version)  # a ValueError naming the releases ported
        return version
