"""Spec validation: pydantic and the exported JSON Schema agree; every mistake is explained."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from reprogate.specs.catalog import SPEC_KINDS, json_schemas, load_any
from reprogate.specs.data import DataSpec
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.utils.errors import UserError
from tests.conftest import REPO, run_cli

EXAMPLES = REPO / "tests" / "specs_examples"
GOOD = sorted((EXAMPLES / "good").glob("*.yaml"))
BAD = sorted((EXAMPLES / "bad").glob("*.yaml"))


def _expect(path: Path) -> tuple[str, list[str]]:
    """First line: `# expect: schema|rule | needle | needle ...`."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), f"{path} lacks its '# expect:' header"
    level, *needles = [p.strip() for p in first.removeprefix("# expect:").split("|")]
    return level, needles


def _schema_errors(path: Path) -> list[str]:
    raw = yaml.safe_load(path.read_text())
    kind = raw["kind"] if isinstance(raw.get("kind"), str) and raw["kind"] in SPEC_KINDS else "model"
    schema = json.loads((REPO / "specs" / "schema" / f"{kind}.schema.json").read_text())
    return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(raw)]


def test_enough_bad_examples():
    assert len(BAD) >= 15
    assert {_expect(p)[0] for p in BAD} == {"schema", "rule"}


def test_committed_schema_is_current():
    for kind, schema in json_schemas().items():
        committed = json.loads((REPO / "specs" / "schema" / f"{kind}.schema.json").read_text())
        assert committed == schema, f"specs/schema/{kind}.schema.json is stale: run reprogate schema"


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_good_specs_pass_pydantic_and_jsonschema(path):
    load_any(path)
    assert _schema_errors(path) == []


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_specs_are_rejected_with_a_useful_message(path):
    level, needles = _expect(path)
    with pytest.raises(UserError) as exc:
        load_any(path)
    msg = str(exc.value)
    assert str(path) in msg, "the message must name the file"
    for needle in needles:
        assert needle in msg, f"expected {needle!r} in:\n{msg}"
    schema_errors = _schema_errors(path)
    if level == "schema":
        # The exported JSON Schema catches the same mistake (editors and CI can use it).
        assert schema_errors, f"JSON Schema accepted {path.name} but pydantic rejected it"
    else:
        # Cross-field and cross-file rules live in pydantic only: the schema cannot see them.
        assert schema_errors == [], schema_errors


@pytest.mark.parametrize("path", BAD[:6], ids=lambda p: p.stem)
def test_cli_reports_without_traceback(path):
    proc = run_cli("validate", str(path))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    # Named as the project names it (relative to its root), not where this host keeps it.
    assert str(path.relative_to(REPO)) in proc.stderr and str(REPO) not in proc.stderr


def test_validate_whole_specs_folder():
    proc = run_cli("validate", "specs/", check=True)
    n = len(list((REPO / "specs").rglob("*.yaml")))
    assert f"{n} of {n} spec(s) valid" in proc.stdout


# Validating specs answers in a blink; a model spec that counts in steps needs no trainer either.
LOADS_NO_TORCH = """
import sys
from reprogate.cli.main import main
code = main(["validate", *sys.argv[1:]])
assert "torch" not in sys.modules, "validate loaded torch"
sys.exit(code)
"""


def test_validating_data_and_step_counted_model_specs_does_not_load_torch():
    import subprocess
    import sys

    specs = ["specs/data/banking77.yaml", "specs/models/minilm_pairs.yaml", str(BAD[0].relative_to(REPO))]
    proc = subprocess.run(
        [sys.executable, "-c", LOADS_NO_TORCH, *specs], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr  # BAD[0] is bad
    assert "validate: 2 of 3 spec(s) valid" in proc.stdout


def test_head_size_comes_from_vocabulary():
    data = load_spec(REPO / "specs/data/banking77.yaml", DataSpec)
    assert len(data.labels) == 77
    assert "reverted_card_payment?" in data.labels and "Refund_not_showing_up" in data.labels
    lora = load_spec(EXAMPLES / "good" / "lora_steps.yaml", ModelSpec)
    assert lora.head.num_labels == 78 and lora.head.out_of_scope_class


def test_yaml_syntax_error_names_line(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("kind: model\nfamily: [ngram\n")
    with pytest.raises(UserError, match=r"broken.yaml: not valid YAML at line \d+"):
        load_any(bad)


def test_compile_refuses_an_ensemble_whose_members_are_not_run(tmp_path):
    from tests.conftest import copy_project

    root = copy_project(tmp_path)
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump(dict(params, models=["ngram", "ensemble"])))
    proc = run_cli("compile", cwd=root)
    assert (
        proc.returncode == 2
        and "is built from ['minilm_frozen'], which are not in params.yaml" in proc.stderr
    )


def test_compile_names_a_missing_production_record_and_its_fix(tmp_path):
    from tests.conftest import copy_project

    root = copy_project(tmp_path)
    (root / "models" / "production.json").unlink()
    proc = run_cli("compile", "--check", cwd=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        "production.json is missing" in proc.stderr
        and "git checkout -- models/production.json" in proc.stderr
    )


def _leaves(obj, path=()):
    """Every scalar (and every scalar list) of a parsed spec, with its path."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    else:
        yield path, obj


GOOD_RAW = {p.stem: yaml.safe_load(p.read_text()) for p in GOOD}
GOOD_LEAVES = [(name, path) for name, raw in GOOD_RAW.items() for path, _ in _leaves(raw)]
ODD_VALUES = st.one_of(
    st.sampled_from([0, 1, -1, 2, 64, 0.0, 0.5, 1.5, -0.5, "", "abc", "1", "cpu", "cuda", "mean", "cosine"]),
    st.sampled_from([True, False, None, [], [1], ["a"], {}, {"x": 1}]),
)


@settings(max_examples=300, deadline=None)
@given(where=st.sampled_from(GOOD_LEAVES), value=ODD_VALUES)
def test_exported_schema_never_rejects_a_spec_pydantic_accepts(where, value):
    # An editor using specs/schema/ must not flag a spec that reprogate runs. (The converse
    # does not hold: cross-field and cross-file rules live in pydantic only.)
    name, path = where
    raw = copy.deepcopy(GOOD_RAW[name])
    node = raw
    for key in path[:-1]:
        node = node[key]
    if path:
        node[path[-1]] = value
    kind = raw["kind"] if isinstance(raw.get("kind"), str) and raw["kind"] in SPEC_KINDS else "model"
    try:
        SPEC_KINDS[kind].model_validate(raw, context={"root": REPO})
    except (ValidationError, UserError):
        return
    schema = json.loads((REPO / "specs" / "schema" / f"{kind}.schema.json").read_text())
    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(raw)), (name, path, value)


def test_stages_run_out_of_order_say_what_to_run_first(tmp_path):
    from tests.conftest import copy_project

    root = copy_project(tmp_path)  # a fresh clone: specs and metrics, no data or models
    proc = run_cli("stage", "features", "ngram", cwd=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no prepared data" in proc.stderr and "dvc repro prepare" in proc.stderr
    assert not (root / "data" / "features" / "ngram").exists()
    proc = run_cli("stage", "combine", "ensemble", cwd=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "member 'ngram' has no calibrated model" in proc.stderr and "calibrate@ngram" in proc.stderr


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        ({"modles": ["ngram"]}, ["unknown key 'modles'", "did you mean 'models'?"]),
        ({"models": "ngram"}, ["field 'models'", "valid list"]),
        ({"models": []}, ["field 'models'", "at least 1 item"]),
        ({"data": [1]}, ["field 'data'", "valid string"]),
        ({"mirror": 5}, ["field 'mirror'", "valid list"]),
    ],
)
def test_params_yaml_mistakes_are_named(tmp_path, edit, needles):
    from tests.conftest import copy_project

    root = copy_project(tmp_path)
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump({**params, **edit}))
    proc = run_cli("compile", "--check", cwd=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "params.yaml" in proc.stderr and all(n in proc.stderr for n in needles), proc.stderr
