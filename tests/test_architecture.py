"""The dependency direction is a test: schedules/ and topologies/ never import sim/, and the
engine and the network never import plotting."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLOTTING = ("matplotlib", "sim.gantt", "sim.plots", "sim.report")
ENGINE_MODULES = ("sim/engine.py", "sim/network.py", "sim/records.py", "sim/metrics.py")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", ["schedules", "topologies"])
def test_core_packages_do_not_import_sim(package):
    files = python_files(package)
    assert files, f"{package}/ has no Python files"
    for path in files:
        bad = {m for m in imported_modules(path) if m == "sim" or m.startswith("sim.")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_topologies_know_nothing_of_schedules():
    for path in python_files("topologies"):
        bad = {m for m in imported_modules(path) if m.startswith("schedules")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("module", ENGINE_MODULES)
def test_engine_does_not_import_plotting(module):
    bad = {m for m in imported_modules(ROOT / module) if m.startswith(PLOTTING)}
    assert not bad, f"{module} imports {sorted(bad)}"


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import sim.engine\nfrom matplotlib import pyplot\n")
    assert {"sim.engine", "matplotlib"} <= imported_modules(bad)
