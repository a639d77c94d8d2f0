"""The tree's rules, derived from the tree itself (no module list to fall out of date):
schedules/ and topologies/ never import sim/; topologies/ knows nothing of schedules/; only
sim/views/ imports matplotlib, and everything else reaches the views lazily (inside a function);
the op IR knows nothing of symmetry; every package is installed; modules stay short."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_PACKAGES = ("sim", "schedules", "topologies")
VIEWS = "clustersim.sim.views"
PLOTTING = ("matplotlib", VIEWS)
MAX_LINES = 300  # soft ceiling (../shared/STYLE.md); a longer module says why in its docstring
LONG_REASON = "Longer than 300 lines:"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("clustersim", *(parts[:-1] if parts[-1] == "__init__" else parts)))


MODULES = {module_name(p): p for top in TOP_PACKAGES for p in sorted((ROOT / top).rglob("*.py"))}


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    """Absolute module names a file imports (module-level statements only, if asked)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(
                f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in MODULES
            )
    return names


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_tree_is_seen():
    assert {"clustersim.sim.run", "clustersim.schedules.ir", "clustersim.topologies.schema"} <= set(MODULES)


@pytest.mark.parametrize("package", ["clustersim.schedules", "clustersim.topologies"])
def test_core_packages_do_not_import_sim(package):
    for name, path in MODULES.items():
        if under(name, package):
            bad = {m for m in imports(path) if under(m, "clustersim.sim") or under(m, "sim")}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_topologies_know_nothing_of_schedules():
    for name, path in MODULES.items():
        if under(name, "clustersim.topologies"):
            bad = {m for m in imports(path) if under(m, "clustersim.schedules")}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_only_views_import_plotting_and_others_reach_them_lazily():
    for name, path in MODULES.items():
        if under(name, VIEWS):
            continue
        eager = {m for m in imports(path, top_level_only=True) if m.startswith(PLOTTING)}
        assert not eager, f"{path.relative_to(ROOT)} imports {sorted(eager)} when it is imported"
        matplotlib = {m for m in imports(path) if under(m, "matplotlib")}
        assert not matplotlib, f"{path.relative_to(ROOT)} imports matplotlib: only sim/views/ may"


def test_the_op_ir_knows_nothing_of_symmetry():
    ir = MODULES["clustersim.schedules.ir"]
    text = ir.read_text().lower()
    for word in ("symmetr", "orbit", "image", "representative"):
        assert word not in text, f"schedules/ir.py mentions {word!r}: symmetry is sim/scale/'s business"


def test_every_package_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert set(config["packages"]) == packages
    for top in TOP_PACKAGES:
        assert config["package-dir"][f"clustersim.{top}"] == top
        assert (ROOT / top / "py.typed").exists(), f"{top}/ needs a py.typed marker for mypy"


def test_modules_stay_short_or_say_why():
    for path in MODULES.values():
        lines = path.read_text().count("\n")
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert lines <= MAX_LINES or LONG_REASON in doc, (
            f"{path.relative_to(ROOT)} has {lines} lines: split it, or say why in its docstring ({LONG_REASON!r})"
        )


def test_tests_mirror_the_packages():
    """tests/sim/network/ holds the tests of sim/network/, and so on: every test folder is a package."""
    for folder in sorted(p for p in (ROOT / "tests").rglob("*") if p.is_dir() and any(p.glob("test_*.py"))):
        package = folder.relative_to(ROOT / "tests")
        if package.parts:
            assert (ROOT / package / "__init__.py").exists(), f"tests/{package}/ mirrors no package {package}/"


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import clustersim.sim.engine\nfrom matplotlib import pyplot\ndef f():\n    import numpy\n")
    assert {"clustersim.sim.engine", "matplotlib"} <= imports(bad)
    assert "numpy" in imports(bad) and "numpy" not in imports(bad, top_level_only=True)
