"""dvc.yaml's code dependencies: every stage depends on code/<stage>.json (a stage that runs for
each model, on code/<stage>/<family>.json), and every module the stage runs is in that identity,
so a real change to it reruns the stage (and nothing else's change does). The closure here is
computed independently of utils/imports.py; where a family's code is, its declaration says."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml

from reprogate.records import code
from reprogate.specs.family import family
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from tests.conftest import REPO


def _spec(model: str) -> Path:
    return REPO / "specs" / "models" / f"{model}.yaml"


PKG = REPO / "src" / "reprogate"
STAGES = PKG / "pipeline" / "stages"
# Modules that pick one of several modules by name at run time: none. A family's parts are named
# by its declaration (specs/families/) and imported where a stage calls them; the stage runner,
# pipeline/runner.py, picks the stage's module and is no stage's dependency.
DISPATCH: set[Path] = set()


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


def _parts_asked(module: Path) -> set[str]:
    """The family parts a module asks for: the constant of each `<x>.part("scorer")` call."""
    calls = [n for n in ast.walk(ast.parse(module.read_text())) if isinstance(n, ast.Call)]
    named = [c.args[0] for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "part"]
    assert all(isinstance(a, ast.Constant) for a in named), f"{module}: a part named by a value"
    return {a.value for a in named}


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
                deps = [d.replace("${item.code}", (item or {}).get("code", "")) for d in deps]
                address = f"{where}{name}@{key}"
                out.append(pytest.param(f"{name}@{key}", st["do"]["cmd"], item, deps, id=address))
    return out


def _identity_files(rel: str) -> set[str]:
    """The source files code/<rel>.json covers, as paths from the repository."""
    modules = json.loads((REPO / "code" / f"{rel}.json").read_text())["modules"]
    out = set()
    for m in modules:
        f = _module_file(m.split(".")[1:])
        out.add(str(f.relative_to(REPO)))
    return out


@pytest.mark.parametrize("stage,cmd,item,deps", _stage_instances())
def test_every_module_a_stage_runs_is_in_its_code_identity(stage, cmd, item, deps):
    name = cmd.split()[2]  # reprogate stage NAME [model]
    if name == "code":
        assert not deps, "stage code runs every time; it depends on nothing"
        return
    start = _with_packages(STAGES / f"{name}.py")
    rel = _rel(cmd, item)
    if item:  # the stage runs its model's family's parts, and those of what it is built from
        built_from = {item[k] for k in ("m1", "m2", "m3", "m4", "source") if k in item}
        families = {item["family"], *(load_spec(_spec(m), ModelSpec).family for m in built_from)}
        # The family's parts the stage's code asks for, and those their code asks for in turn.
        parts: set[str] = set()
        while True:
            for f in families:
                for m in family(f).references_to_code(tuple(parts)):
                    start |= _with_packages(_module_file(m.split(".")[1:]))
            more = {p for f in _closure(start) for p in _parts_asked(f)} - parts
            if not more:
                break
            parts |= more
    needed = {str(f.relative_to(REPO)) for f in _closure(start)} - {"src/reprogate/__init__.py"}
    missing = sorted(needed - _identity_files(rel))
    assert not missing, f"{stage} runs {missing} but code/{rel}.json does not cover them"
    assert f"code/{rel}.json" in deps, f"{stage} would not rerun when its code's meaning changes"
    assert "requirements.lock" in deps, f"{stage} would not rerun when a locked package changes"


@pytest.mark.parametrize("root", [REPO, REPO / "lm"], ids=["default", "lm"])
def test_committed_code_identities_are_current(root):
    # What DVC compares must say what the committed code means: run `reprogate stage code`
    # (or dvc repro) after a change, and commit code/.
    assert code.stale(root) == [], "run `reprogate stage code` (in lm/ too) and commit code/"


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
        runs = _identity_files(_rel(cmd, item))
        assert not JUDGING & runs, f"{stage} reruns when the gate changes: {sorted(JUDGING & runs)}"


def _rel(cmd: str, item: dict | None) -> str:
    """The identity file a stage instance depends on: code/<rel>.json."""
    name = cmd.split()[2]
    return f"{name}/{item['code']}" if item else name


def _dependents(module: str) -> set[str]:
    instances = [(p.values[1], p.values[2]) for p in _stage_instances() if p.values[1].split()[2] != "code"]
    return {cmd.split()[2] for cmd, item in instances if module in _identity_files(_rel(cmd, item))}


def test_a_threshold_edit_reruns_only_the_stages_that_judge():
    # A comment added to the gate spec's module, or to the gate's decision record: `dvc status`
    # then names these stages and no other.
    assert _dependents("src/reprogate/specs/gate.py") <= {"calibrate", "evaluate", "gate"}
    assert _dependents("src/reprogate/records/gate.py") == {"gate"}
    assert _dependents("src/reprogate/pipeline/rules.py") == {"gate"}
    # ... while the code every stage runs is still every stage's dependency
    assert _dependents("src/reprogate/specs/model.py") >= TRAINING_SIDE - {"augment"}
