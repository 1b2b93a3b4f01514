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


def test_models_whose_features_are_equal_share_one_features_stage_and_no_others_do():
    from reprogate.specs.pipeline import Pipeline, features_source

    frozen = load_spec(_spec("minilm_frozen"), ModelSpec)
    screened = load_spec(_spec("minilm_screened"), ModelSpec)
    other_layers = screened.model_copy(
        update={
            "screened": screened.screened.model_copy(
                update={"encoder": frozen.encoder.model_copy(update={"layers": 3})}
            )
        }
    )
    augmented = screened.model_copy(update={"augment": True})
    models = {
        "minilm_frozen": frozen,
        "s": screened,
        "layers3": other_layers,
        "aug": augmented,
        "aug2": augmented,
    }
    p = Pipeline(REPO, frozen.data, models, "specs/gate.yaml")
    assert features_source(p, "s") == "minilm_frozen"  # the frozen encoder's embeddings, once
    assert features_source(p, "minilm_frozen") == "minilm_frozen"
    assert features_source(p, "layers3") == "layers3"  # other layers pooled: other features
    assert features_source(p, "aug") == "aug"  # it encodes the augmented rows too
    assert features_source(p, "aug2") == "aug"
    ngram = load_spec(_spec("ngram"), ModelSpec)
    assert (
        features_source(Pipeline(REPO, ngram.data, {"a": ngram, "b": ngram}, "specs/gate.yaml"), "b") == "b"
    )


def test_a_model_reads_another_models_features_only_where_they_are_the_same_features():
    """Over both committed pipelines: compile's sharing and the runtime's agree, the stage that
    writes a model's features is declared once and is a dependency of the model's stages, and
    its featurizer key and splits are the model's own (checked where the encoder is installed)."""
    from reprogate import models as families
    from reprogate.data.prepared import splits
    from reprogate.models.base import feature_key
    from reprogate.specs.pipeline import features_name, features_source, load_pipeline

    p = load_pipeline(REPO, "experiments")
    stages = {}
    for f in ("dvc.yaml", "experiments/dvc.yaml"):
        stages.update({(f, n): s for n, s in yaml.safe_load((REPO / f).read_text())["stages"].items()})
    owners = [m for (_, n), s in stages.items() if n == "features" for m in s["foreach"]]
    assert len(owners) == len(set(owners))  # no model's features are written by two stages
    shared = 0
    for name, spec in p.models.items():
        if not spec.trained:
            continue
        source = features_source(p, name)
        assert features_name(REPO, name) == source and source in owners
        for (_, stage), s in stages.items():
            if stage in ("train", "calibrate", "evaluate", "resume_check") and name in s["foreach"]:
                assert s["foreach"][name]["features"] == source
                assert "data/features/${item.features}" in s["do"]["deps"]
        if source == name or spec.family_def.missing_extra(spec, REPO):
            continue
        other = p.models[source]
        keys = [feature_key(families.build(m, 2, REPO)[1]) for m in (spec, other)]
        assert keys[0] == keys[1] and splits(REPO, spec) == splits(REPO, other)
        shared += 1
    assert shared >= 3  # minilm_screened, minilm_two_in_one and minilm_flagged read minilm_frozen's
