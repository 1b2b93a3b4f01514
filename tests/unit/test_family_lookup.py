"""How a spec's `family:` finds a family written outside reprogate: an entry point of the group
`reprogate.families` in an installed package, or `module:Class`; and what `reprogate validate`
says, in one paragraph, when the name leads nowhere."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import REPO, TINY_NGRAM, make_home_project, run_cli, write_model_spec

BOW = {k: v for k, v in TINY_NGRAM.items() if k != "ngram"} | {"bow_mlp": {"hidden": 16}}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A home project, and an installed package (a dist-info folder on the path) whose entry
    points name the family right (`bow`) and wrong (`broken`: no such class)."""
    root = make_home_project(tmp_path_factory.mktemp("lookup"))
    site = root.parent / "site"
    dist = site / "bow_family-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bow-family\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[reprogate.families]\nbow = bow_mlp:BowMlp\nbroken = bow_mlp:BowMLP\n"
    )
    shutil.copy(REPO / "tests/families/bow_mlp.py", site / "bow_mlp.py")
    return root, {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def _validate(project, family: str):
    root, env = project
    write_model_spec(root, "mine", BOW | {"family": family})
    return run_cli("validate", "specs/models/mine.yaml", cwd=root, env=env)


def test_an_entry_point_of_an_installed_package_names_the_family(project):
    done = _validate(project, "bow")
    assert done.returncode == 0, done.stdout + done.stderr


def test_module_colon_class_of_the_project_names_the_family(project):
    root, _ = project
    shutil.copy(REPO / "tests/families/bow_mlp.py", root / "bow_mlp.py")
    write_model_spec(root, "mine", BOW | {"family": "bow_mlp:BowMlp"})
    try:
        done = run_cli("validate", "specs/models/mine.yaml", cwd=root)  # no PYTHONPATH: the project's own
    finally:
        (root / "bow_mlp.py").unlink()
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "name, said",
    [
        ("bow_mpl", "entry points installed here: bow, broken"),
        ("broken", "module bow_mlp has no 'BowMLP'"),
        ("no_such_module:Family", "importing it failed"),
        ("bow_mlp:Words", "not a reprogate Family"),
    ],
)
def test_a_family_that_leads_nowhere_is_one_paragraph_with_the_fix(project, name, said):
    done = _validate(project, name)
    out = done.stdout + done.stderr
    assert done.returncode != 0 and said in out, out
    assert "Traceback" not in out
    problem = [line for line in out.splitlines() if name in line]
    assert len(problem) == 1, out  # one paragraph: the file, the field, the value and the fix
    assert "mine.yaml" in out and "family" in problem[0]


def test_an_export_of_a_family_without_an_onnx_graph_is_refused_at_validate(project):
    # bow_mlp declares no `onnx`: exporting it, or an ensemble with it as a member, is refused
    # before anything runs, naming the member and the fix.
    root, env = project
    write_model_spec(root, "mine", BOW | {"family": "bow"})
    ensemble = {"kind": "model", "data": "specs/data/home.yaml", "family": "ensemble"}
    write_model_spec(root, "both", ensemble | {"ensemble": {"members": ["tiny", "mine"]}})
    for source, said in (
        ("mine", "'mine' of family bow"),
        ("both", "'both', whose member 'mine' is of family bow"),
    ):
        export = {"kind": "model", "data": "specs/data/home.yaml", "family": "export"}
        write_model_spec(root, "out", export | {"export": {"source": source}})
        done = run_cli("validate", "specs/models/out.yaml", cwd=root, env=env)
        assert done.returncode != 0 and said in done.stdout + done.stderr, done.stdout + done.stderr
        assert "declares no ONNX graph" in done.stdout + done.stderr and "Traceback" not in done.stderr
