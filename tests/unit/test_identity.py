"""Code identity by meaning: what a comment, a docstring or a reformat leaves alone, and what a
real change moves. DVC compares it (code/<stage>.json) and training's fingerprint holds it."""

from __future__ import annotations

import json

import pytest

from reprogate.pipeline import compile as compile_dvc
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.train import run
from reprogate.utils import imports
from tests.conftest import REPO

BASE = '''"""A module."""

import math


def scale(x, factor=2.0):
    """Scale x."""
    return math.sqrt(x) * factor


class Box:
    """A box."""

    size = 3
'''

SAME = {
    "comment": BASE.replace("import math\n", "import math  # the standard one\n# more\n"),
    "docstring line": BASE.replace('"""Scale x."""', '"""Scale x.\n\n    By factor."""'),
    "blank lines": BASE.replace("\n\ndef", "\n\n\n\ndef"),
    "reformat": BASE.replace(
        "return math.sqrt(x) * factor", "return (\n        math.sqrt(x)\n        * factor\n    )"
    ),
    "module docstring gone": BASE.replace('"""A module."""\n', ""),
    "quote style": BASE.replace('"""A box."""', "'A box, said differently.'"),
}

MOVED = {
    "constant": BASE.replace("size = 3", "size = 4"),
    "default": BASE.replace("factor=2.0", "factor=2.5"),
    "operator": BASE.replace("* factor", "/ factor"),
    "name": BASE.replace("def scale", "def scaled"),
    "statement added": BASE.replace("    size = 3", "    size = 3\n    depth = 1"),
    "string that is not a docstring": BASE.replace("size = 3", "size = 3\n    label = 'a'"),
}


@pytest.mark.parametrize("edit", SAME)
def test_an_edit_that_changes_no_meaning_keeps_the_identity(edit):
    assert imports.source_meaning(SAME[edit]) == imports.source_meaning(BASE)


@pytest.mark.parametrize("edit", MOVED)
def test_a_real_change_moves_the_identity(edit):
    assert imports.source_meaning(MOVED[edit]) != imports.source_meaning(BASE)


def test_training_fingerprint_holds_the_identity_dvc_compares():
    spec = load_spec(REPO / "specs" / "models" / "ngram.yaml", ModelSpec)
    committed = json.loads((REPO / "code" / "train" / "ngram.json").read_text())
    assert run.code_hash(spec) == committed["identity"]
    modules = committed["modules"]
    assert "reprogate.train.trainer" in modules and "reprogate.pipeline.stages.train" in modules
    assert "reprogate.models.ngram" in modules and "reprogate.models.encoder" not in modules


def test_resume_check_covers_the_training_it_runs():
    assert imports.stage_modules("train") <= imports.stage_modules("resume_check")


def test_every_stage_depends_on_its_identity_not_its_source(tmp_path):
    deps = compile_dvc.code("evaluate", None, per_model=True)
    assert deps == ["requirements.lock", "code/evaluate/${item.code}.json"]
    assert compile_dvc.code("gate", None) == ["requirements.lock", "code/gate.json"]
    assert compile_dvc.code("code", None) == []
    assert not any(d.startswith("src/") for d in deps)


def test_a_stage_holds_the_family_parts_its_code_asks_for():
    # Read from the `.part("...")` calls of the code a stage runs, never listed by hand: training
    # asks for the setup, whose code asks for the build and the assets; scoring asks for the scorer.
    from reprogate.records import code
    from reprogate.specs.family import family

    encoder = family("encoder")
    train = code.stage_family_code("train", encoder)
    scoring = code.stage_family_code("evaluate", encoder)
    assert "reprogate.train.run" in train and "reprogate.models.encoder" in train
    assert "reprogate.folder.scorer" not in imports.stage_modules("train") | set(train)
    assert "reprogate.train.run" not in scoring and "reprogate.folder.scorer" in scoring


def test_a_part_named_by_a_value_counts_every_part(tmp_path):
    tree = imports.ast.parse("def f(fam, which):\n    return fam.part(which), fam.part('build')\n")
    assert imports._parts_asked(tree) == sorted({imports.ANY_PART, "build"})


# Issue 51's 24 modules that every stage of the three pipelines ran (those that still exist: the
# encoder's and the export's configs moved to specs/families/, and the walk is reached below).
EVERY_STAGE_ONCE = [
    *(f"specs.{m}" for m in ("base", "data", "lm", "loader", "model", "params", "pipeline", "reading")),
    *(f"specs.{m}" for m in ("roots", "text", "families.encoder", "families.export")),
    "specs",
    *("records", "records.base", "pipeline", "pipeline.context", "pipeline.stages"),
    *(f"utils.{m}" for m in ("archives", "console", "errors", "hashing", "paths")),
    "utils",
]
HARMLESS = (
    lambda s: "# a comment a newcomer adds\n" + s.replace("\n\n\n", "\n\n\n# and one between\n", 1),
    lambda s: s.replace('"""', '"""A docstring line.\n\n', 1) if s.lstrip().startswith('"""') else s,
    lambda s: s.replace("\n\n\n", "\n\n\n\n", 1) + "\n\n",
)


def test_comments_docstrings_and_blank_lines_in_the_shared_modules_leave_every_identity(
    tmp_path, monkeypatch
):
    # All 24 at once, each with all three edits: every committed identity of the three
    # pipelines (code/ serves the default and the experiments, lm/code/ the language model)
    # computes to what it says. tests/integration/test_code_identity.py shows DVC then reruns nothing.
    from reprogate.records import code

    edited = {}
    for name in EVERY_STAGE_ONCE:
        module = f"{imports.PACKAGE}.{name}"
        source = imports.module_file(module)
        assert source is not None, f"{module} is gone: update the list"
        text = source.read_text()
        for edit in HARMLESS:
            text = edit(text)
        assert text != source.read_text()
        copy = tmp_path / module / source.name
        copy.parent.mkdir(parents=True)
        copy.write_text(text)
        edited[module] = copy
    real = imports.module_file
    monkeypatch.setattr(imports, "module_file", lambda m: edited.get(m) or real(m))
    for cached in (imports.meaning, imports.imports, imports._tree):
        cached.cache_clear()
    try:
        for root in (REPO, REPO / "lm"):
            saved = code.saved_files(root)
            assert saved
            for f in saved:
                was = json.loads(f.read_text())
                now = code.current(was["stage"], was.get("family"), was.get("under", []))
                assert now.identity == was["identity"], f"{f.relative_to(REPO)} moved"
    finally:
        for cached in (imports.meaning, imports.imports, imports._tree):
            cached.cache_clear()
