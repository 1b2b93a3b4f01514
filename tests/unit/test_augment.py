"""Stage augment: readable variants of train rows, seeded, never equal to an evaluated row."""

from __future__ import annotations

import json

import numpy as np
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from reprogate.data import augment
from reprogate.specs.data import DataSpec
from reprogate.specs.loader import load_spec
from tests.conftest import make_home_project, run_cli

texts = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=80)


@settings(max_examples=200, deadline=None)
@given(text=texts, seed=st.integers(0, 2**32 - 1))
def test_every_variant_is_a_function_of_text_and_seed(text, seed):
    names = list(augment.TRANSFORMS)
    once = augment.variant(text, names, np.random.default_rng(seed))
    again = augment.variant(text, names, np.random.default_rng(seed))
    assert once == again
    out, applied = once
    assert set(applied) <= set(names) and len(applied) == len(set(applied))
    assert bool(applied) == (out != text)  # a rule is named only when it changed the text


def test_the_rules_do_what_their_names_say():
    rng = np.random.default_rng(0)
    assert augment.contractions("I do not have it", rng) in {"I dont have it", "I don't have it"}
    swapped = augment.TRANSFORMS["currencies"]("can I pay in euros or $", rng)
    assert "euros" not in swapped and "$" not in swapped
    moved = augment.TRANSFORMS["countries"]("my card does not work in Spain", rng)
    assert "Spain" not in moved and any(c in moved for c in augment.COUNTRIES)
    assert augment.TRANSFORMS["countries"]("no country here", rng) is None
    slip = augment.typos("where is my replacement", rng)
    assert slip != "where is my replacement"  # one or two words slip, each keeping its first letter
    assert [w[0] for w in slip.split()] == ["w", "i", "m", "r"]
    assert augment.fillers("Where is my card?", rng) in {
        *(o + "where is my card" for o in augment.OPENERS),
        *("Where is my card" + c for c in augment.CLOSERS),
    }


def test_the_stage_writes_readable_pinned_variants_that_leak_no_evaluated_row(tmp_path):
    root = make_home_project(tmp_path)
    data_path = root / "specs/data/home.yaml"
    spec = yaml.safe_load(data_path.read_text())
    spec["augment"] = {"seed": 7, "copies": 2}
    data_path.write_text(yaml.safe_dump(spec))
    run_cli("stage", "augment", cwd=root, check=True)
    out = root / "data/augmented/train.jsonl"
    first = out.read_bytes()
    rows = [json.loads(x) for x in first.decode().splitlines()]
    prepared = (root / "data/prepared/train.jsonl").read_text().splitlines()
    train = {r["id"]: r for r in map(json.loads, prepared)}
    assert rows and all(r["source_id"] in train for r in rows)
    for r in rows:  # each variant says where it came from and which rules changed it
        source = train[r["source_id"]]
        assert r["label"] == source["label"] and r["source_text"] == source["text"]
        assert r["transforms"] and r["text"] != r["source_text"]
    data = load_spec(data_path, DataSpec)
    key = lambda t: augment.normalize(t, data.normalization)  # noqa: E731
    evaluated = {
        key(json.loads(x)["text"])
        for f in (root / "data/prepared").glob("*.jsonl")
        if f.stem != "train"
        for x in f.read_text().splitlines()
    }
    assert not evaluated & {key(r["text"]) for r in rows}
    record = json.loads((root / "metrics/augment.json").read_text())
    assert record["rows"] == len(rows) and record["source_rows"] == len(train) and record["copies"] == 2
    run_cli("stage", "augment", cwd=root, check=True)
    assert out.read_bytes() == first  # seeded: the same bytes on every run

    tiny = yaml.safe_load((root / "specs/models/tiny.yaml").read_text())
    (root / "specs/models/tiny.yaml").write_text(yaml.safe_dump(dict(tiny, augment=True)))
    run_cli("stage", "train", "tiny", cwd=root, check=True)
    trained = json.loads((root / "metrics/tiny/train.json").read_text())
    assert trained["examples"] == len(train) + len(rows)


def test_a_model_that_asks_for_augmented_rows_without_them_is_told_what_to_add(tmp_path):
    root = make_home_project(tmp_path)
    spec = yaml.safe_load((root / "specs/models/tiny.yaml").read_text())
    (root / "specs/models/tiny.yaml").write_text(yaml.safe_dump(dict(spec, augment=True)))
    said = run_cli("validate", "specs/models/tiny.yaml", cwd=root)
    assert said.returncode != 0 and "Traceback" not in said.stderr
    said = said.stdout + said.stderr
    assert "augment is true but the data spec specs/data/home.yaml has no 'augment' section" in said
