"""Shared fixtures. tests/ mirrors the packages (tests/sim/network/ tests sim/network/, ...);
helper modules at this level (repo, transfers, finite_differences, symmetric_cases, golden_summaries)
import from any depth, since pytest puts the folder of this rootmost conftest on sys.path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from clustersim.sim.scenario.schema import Scenario

from repo import QUICKSTART

# Property tests draw the same examples on every run (CI cannot fail by the luck of a draw);
# HYPOTHESIS_PROFILE=explore draws new ones each run, for hunting bugs by hand.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture
def quickstart() -> Scenario:
    """The bundled quickstart scenario, loaded (GPT-3 1.3B, 4 pipeline stages, 1F1B, numerics on)."""
    from clustersim.sim.scenario.loader import load_scenario

    return load_scenario(QUICKSTART)


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """A run's output folder that does not exist yet (the CLI creates it)."""
    return tmp_path / "out"
