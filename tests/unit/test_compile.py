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


# Both pipelines of the project: the default and the slower candidates beside it.
DVC_FILES = (REPO / "dvc.yaml", REPO / "experiments" / "dvc.yaml")


def _stage_instances() -> list:
    out = []
    for dvc_yaml in DVC_FILES:
        where = "" if dvc_yaml.parent == REPO else f"{dvc_yaml.parent.name}:"
        for name, st in yaml.safe_load(dvc_yaml.read_text())["stages"].items():
            if "foreach" not in st:
                out.append(pytest.param(name, st["cmd"], None, st.get("deps", []), id=where + name))
                continue
            for key, item in st["foreach"].items():
                deps = [d.replace("${key}", key) for d in st["do"].get("deps", [])]
                deps = [d.replace("${item.family}", (item or {}).get("family", "")) for d in deps]
                address = f"{where}{name}@{key}"
                out.append(pytest.param(f"{name}@{key}", st["do"]["cmd"], item, deps, id=address))
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


# What a gate rule touches: its threshold (the gate spec), the rule itself, and the records the
# judging stages write. Training must not rerun for any of them (issue: a new rule retrained all).
JUDGING = {
    "src/reprogate/specs/gate.py",
    "src/reprogate/specs/catalog.py",
    "src/reprogate/pipeline/rules.py",
    "src/reprogate/pipeline/kinds.py",
    "src/reprogate/records/evaluation.py",
    "src/reprogate/records/gate.py",
    "src/reprogate/records/production.py",
}
TRAINING_SIDE = {"prepare", "augment", "features", "train", "combine", "export", "resume_check"}


@pytest.mark.parametrize("stage,cmd,item,deps", _stage_instances())
def test_no_training_side_stage_depends_on_the_gate(stage, cmd, item, deps):
    if cmd.split()[2] in TRAINING_SIDE:
        assert not JUDGING & set(deps), f"{stage} reruns when the gate changes: {sorted(JUDGING & set(deps))}"


def _dependents(module: str) -> set[str]:
    return {p.values[0].split("@")[0] for p in _stage_instances() if module in p.values[3]}


def test_a_threshold_edit_reruns_only_the_stages_that_judge():
    # A comment added to the gate spec's module, or to the gate's decision record: `dvc status`
    # then names these stages and no other.
    assert _dependents("src/reprogate/specs/gate.py") <= {"calibrate", "evaluate", "gate"}
    assert _dependents("src/reprogate/records/gate.py") == {"gate"}
    assert _dependents("src/reprogate/pipeline/rules.py") == {"gate"}
    # ... while the code every stage runs is still every stage's dependency
    assert _dependents("src/reprogate/specs/model.py") >= TRAINING_SIDE - {"augment"}
