"""dvc.yaml's code dependencies: every module a stage runs is one of its deps, so a change to
it reruns the stage (and nothing else's change does)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

PKG = REPO / "src" / "reprogate"
STAGES = PKG / "pipeline" / "stages"
# Modules that pick one of several modules by name at run time: only their module-level
# imports always run. The picked module is the family's own (models/<family>.py). (The stage
# runner, pipeline/runner.py, picks the stage's module and is no stage's dependency.)
DISPATCH = {PKG / "models" / "__init__.py"}


def _module_file(parts: list[str]) -> Path:
    p = PKG.joinpath(*parts)
    return p / "__init__.py" if p.is_dir() else p.with_suffix(".py")


def _with_packages(f: Path) -> set[Path]:
    """A module and the __init__.py of each package above it (Python runs them first); the
    top-level reprogate/__init__.py is empty and no stage's dependency."""
    out, d = {f}, f.parent
    while d != PKG:
        out.add(d / "__init__.py")
        d = d.parent
    return out


def _imports(module: Path) -> set[Path]:
    tree = ast.parse(module.read_text())
    nodes = tree.body if module in DISPATCH else list(ast.walk(tree))
    out: set[Path] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "reprogate":
            base = node.module.split(".")[1:]
            for alias in node.names:
                sub = _module_file([*base, alias.name])  # `from reprogate.models import ngram`
                out |= _with_packages(sub if sub.is_file() else _module_file(base))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("reprogate."):
                    out |= _with_packages(_module_file(alias.name.split(".")[1:]))
    return out


def _closure(start: set[Path]) -> set[Path]:
    seen, todo = set(), list(start)
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += _imports(f)
    return seen


def _stage_instances() -> list:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    out = []
    for name, st in stages.items():
        if "foreach" not in st:
            out.append(pytest.param(name, st["cmd"], None, st.get("deps", []), id=name))
            continue
        for key, item in st["foreach"].items():
            deps = [d.replace("${key}", key) for d in st["do"].get("deps", [])]
            deps = [d.replace("${item.family}", (item or {}).get("family", "")) for d in deps]
            out.append(pytest.param(f"{name}@{key}", st["do"]["cmd"], item, deps, id=f"{name}@{key}"))
    return out


@pytest.mark.parametrize("stage,cmd,item,deps", _stage_instances())
def test_every_module_a_stage_runs_is_a_dependency(stage, cmd, item, deps):
    name = cmd.split()[2]  # reprogate stage NAME [model]
    start = _with_packages(STAGES / f"{name}.py")
    if item and item.get("family") and item["family"] != "export":  # models.FAMILIES picks by family
        start.add(PKG / "models" / f"{item['family']}.py")
    needed = {str(f.relative_to(REPO)) for f in _closure(start)} - {"src/reprogate/__init__.py"}
    missing = sorted(needed - set(deps))
    assert not missing, f"{stage} runs {missing} but dvc.yaml does not list them: see compile.py"
    assert "requirements.lock" in deps, f"{stage} would not rerun when a locked package changes"
