"""Shared fixtures. tests/ mirrors the packages (tests/sim/network/ tests sim/network/, ...);
helper modules at this level (repo, transfers, finite_differences) import from any depth, since
pytest puts the folder of this rootmost conftest on sys.path."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.sim.scenario.schema import Scenario

from repo import QUICKSTART


@pytest.fixture(scope="session")
def quickstart_text() -> str:
    """The bundled quickstart scenario's YAML, for tests that vary one field of a good file."""
    return QUICKSTART.read_text()


@pytest.fixture
def quickstart() -> Scenario:
    """The bundled quickstart scenario, loaded (GPT-3 1.3B, 4 pipeline stages, 1F1B, numerics on)."""
    from clustersim.sim.scenario.loader import load_scenario

    return load_scenario(QUICKSTART)


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    """A run's output folder that does not exist yet (the CLI creates it)."""
    return tmp_path / "out"
