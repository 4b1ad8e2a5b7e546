"""The package's layout as its docs draw it (docs/architecture.md): the core never imports the views and each
phase runs passes of ``passes/`` only."""

from __future__ import annotations

import ast
import pathlib

import dcnb._src
from dcnb._src import passes

SRC = pathlib.Path(dcnb._src.__file__).parent
#: the IPython extension is where a cell meets both: it makes the session and displays its widget
FRONT_DOORS = {"magic.py"}


def _imported(path: pathlib.Path) -> set[str]:
    """The dcnb modules ``path`` imports, as dotted names under ``dcnb._src`` (relative imports resolved)."""
    package = ["dcnb", "_src", *path.relative_to(SRC).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m.startswith("dcnb._src")}


def test_the_core_never_imports_the_views():
    core = [p for p in SRC.rglob("*.py") if "views" not in p.relative_to(SRC).parts and p.name not in FRONT_DOORS]
    assert len(core) > 40
    offenders = {
        str(p.relative_to(SRC)): sorted(m for m in _imported(p) if m.startswith("dcnb._src.views"))
        for p in core
    }
    assert {path: views for path, views in offenders.items() if views} == {}


def test_the_layout_check_resolves_relative_imports():
    # the check above reads imports by path: a relative import of a view from the core resolves to views/
    probe = SRC / "session.py"
    assert "dcnb._src.diff" in _imported(probe) and not any("views" in m for m in _imported(probe))
    assert any(m.startswith("dcnb._src.views") for m in _imported(SRC / "magic.py"))


def test_every_build_phase_names_only_modules_of_passes():
    for phase in (passes.CPU_BUILD, passes.CUDA_BUILD, passes.ON_IMPORT, passes.BEFORE_AUTODIFF,
                  passes.AFTER_AUTODIFF, passes.AFTER_AUTO_OPTIMIZE):
        for p in phase:
            assert p.run.__module__.startswith("dcnb._src.passes."), p.name
