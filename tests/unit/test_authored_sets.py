"""What people actually say: the authored real-utterance and challenge sets, their seeded
dev/test split and how the gate judges them (how evaluate measures them, on a built pipeline:
tests/integration/test_authored_evaluation.py)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from reprogate.data.prepare import prepare
from reprogate.pipeline.stages import gate
from reprogate.specs.data import DataSpec
from reprogate.specs.gate import GateSpec
from reprogate.specs.loader import load_spec
from reprogate.utils.errors import UserError
from tests.conftest import REPO, make_home_project

AUTHORED = REPO / "data" / "authored"
BANKING = REPO / "specs" / "data" / "banking77.yaml"


def _csv(path: Path) -> list[dict]:
    return list(csv.DictReader(path.read_text(encoding="utf-8").splitlines()))


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def _dataset_texts(mirror: Path) -> list[str]:
    texts = [r["text"] for f in ("train.csv", "test.csv") for r in _csv(mirror / "banking77" / f)]
    clinc = json.loads(next(mirror.glob("clinc150/**/data_full.json")).read_text())
    return texts + [x[0] for rows in clinc.values() for x in rows]


def test_authored_sets_are_written_not_copied(mirror):
    """No authored line is a BANKING77 or CLINC150 row, exactly or nearly (word overlap), and
    the sets are as large as promised: 3 per intent, 120 challenge queries of three kinds."""
    real = _csv(AUTHORED / "real_utterances.csv")
    challenge = _csv(AUTHORED / "challenge.csv")
    labels = load_spec(BANKING, DataSpec).labels
    assert Counter(r["label"] for r in real) == dict.fromkeys(labels, 3)
    assert Counter(r["kind"] for r in challenge) == {"unrelated": 40, "ambiguous": 40, "multi_intent": 40}
    dataset = [_words(t) for t in _dataset_texts(mirror)]
    ours = [_words(r["text"]) for r in real + challenge]
    assert len(set(ours)) == len(ours), "an authored line repeats another"
    exact = set(dataset)
    for text in ours:
        assert text not in exact, f"{text!r} is a dataset row"
    # Word-set overlap of every authored line with every dataset row at once: |A & B| from a
    # sparse product, |A | B| = |A| + |B| - |A & B|.
    vocab: dict[str, int] = {}
    ours_m, theirs_m = (_bags([set(t.split()) for t in texts], vocab) for texts in (ours, dataset))
    theirs_m.resize((theirs_m.shape[0], len(vocab)))
    ours_m.resize((ours_m.shape[0], len(vocab)))
    inter = (ours_m @ theirs_m.T).toarray()
    union = np.asarray(ours_m.sum(1)) + np.asarray(theirs_m.sum(1)).T - inter
    nearest = (inter / union).max(1)
    worst = int(nearest.argmax())
    why = f"{ours[worst]!r} is nearly a dataset row (word overlap {nearest[worst]:.2f})"
    assert nearest[worst] < 0.8, why


def _bags(bags: list[set[str]], vocab: dict[str, int]):
    from scipy.sparse import csr_matrix

    rows, cols = [], []
    for i, bag in enumerate(bags):
        for w in bag:
            rows.append(i)
            cols.append(vocab.setdefault(w, len(vocab)))
    return csr_matrix(([1] * len(rows), (rows, cols)), shape=(len(bags), len(vocab)), dtype=np.int32)


@pytest.fixture(scope="module")
def banking(tmp_path_factory, mirror):
    os.environ["REPROGATE_MIRROR"] = str(mirror)
    out = tmp_path_factory.mktemp("authored")
    return out, prepare(BANKING, REPO, out / "prepared", out)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_real_utterances_split_by_seed_into_dev_and_test(banking, tmp_path):
    out, m = banking
    dev, test = (_rows(out / "prepared" / f"real_{p}.jsonl") for p in ("dev", "test"))
    assert m["rows"]["real_dev"] == 77 and m["rows"]["real_test"] == 154
    # One of each intent's three in dev, two in test; disjoint; every authored row in one of them.
    assert Counter(r["label"] for r in dev) == dict.fromkeys(load_spec(BANKING, DataSpec).labels, 1)
    assert len({r["label"] for r in test}) == 77 and not {r["id"] for r in dev} & {r["id"] for r in test}
    assert len({r["id"] for r in dev + test}) == 231
    assert m["audit"]["overlap_with_train"]["real_dev"] == 0 == m["audit"]["overlap_with_train"]["real_test"]
    c_dev, c_test = (_rows(out / "prepared" / f"challenge_{p}.jsonl") for p in ("dev", "test"))
    assert all(r["label"] is None for r in c_dev + c_test)  # no intent: acting on one is a mistake
    # A third of each kind in the dev part (the request rules' design may look at it), the rest judged.
    kinds = ("unrelated", "ambiguous", "multi_intent")
    assert Counter(r["source_label"] for r in c_dev) == dict.fromkeys(kinds, 14)
    assert Counter(r["source_label"] for r in c_test) == dict.fromkeys(kinds, 26)
    assert not {r["id"] for r in c_dev} & {r["id"] for r in c_test}
    # Another seed, another split; the same seed, the same bytes.
    spec = yaml.safe_load(BANKING.read_text())
    spec["eval_sets"]["real"]["split"]["seed"] += 1
    shutil.copytree(AUTHORED, tmp_path / "data" / "authored")  # a local origin is the project's own
    other = tmp_path / "banking77.yaml"
    other.write_text(yaml.safe_dump(spec, sort_keys=False))
    prepare(other, REPO, tmp_path / "prepared", tmp_path)
    moved = {r["id"] for r in _rows(tmp_path / "prepared" / "real_dev.jsonl")} ^ {r["id"] for r in dev}
    assert (
        moved
        and (tmp_path / "prepared" / "train.jsonl").read_bytes()
        == (out / "prepared" / "train.jsonl").read_bytes()
    )
    spec["eval_sets"]["real"]["split"]["seed"] -= 1
    other.write_text(yaml.safe_dump(spec, sort_keys=False))
    prepare(other, REPO, tmp_path / "prepared", tmp_path)
    assert (tmp_path / "prepared" / "real_dev.jsonl").read_bytes() == (
        out / "prepared" / "real_dev.jsonl"
    ).read_bytes()


def test_a_challenge_kind_not_declared_is_an_error_that_names_it(tmp_path):
    root = make_home_project(tmp_path / "home")
    challenge = root / "raw" / "challenge.csv"
    challenge.write_text(challenge.read_text().replace("the lights,ambiguous", "the lights,ambigous"))
    spec = root / "specs" / "data" / "home.yaml"
    sha = hashlib.sha256(challenge.read_bytes()).hexdigest()
    text = spec.read_text()
    spec.write_text(re.sub(r"challenge.csv: [0-9a-f]{64}", f"challenge.csv: {sha}", text))
    before = sorted(p.name for p in (root / "data" / "prepared").iterdir())
    with pytest.raises(UserError) as e:
        prepare(spec, root)
    msg = str(e.value)
    assert "eval_sets.challenge" in msg and "'eval_sets.challenge.kinds'" in msg
    assert "'ambigous' (1 rows, did you mean 'ambiguous'?)" in msg and "Nothing was written" in msg
    assert sorted(p.name for p in (root / "data" / "prepared").iterdir()) == before


def _ev(**sets) -> dict:
    test = {"kind": "labelled", "accuracy": 0.95, "accuracy_ci95": [0.94, 0.96], "ece_after": 0.02}
    oos = {"kind": "out_of_scope", "use": "evaluate", "false_positive_action_rate": 0.0}
    return {
        "model_version": "m@1",
        "sets": {"test": dict(test, wrong_action_rate=0.0), "oos_test": oos, **sets},
    }


def _challenge(acted: dict[str, int], n: int = 10, use: str = "evaluate") -> dict:
    by_kind = {k: {"n": n, "acted": a, "action_rate": a / n} for k, a in acted.items()}
    total = sum(acted.values())
    return {"kind": "challenge", "use": use, "n": n * len(acted), "acted": total,
            "action_rate": total / (n * len(acted)), "by_kind": by_kind}  # fmt: skip


def _decide(tmp_path: Path, ev: dict, gate_yaml: str) -> dict:
    (tmp_path / "results" / "m").mkdir(parents=True, exist_ok=True)
    (tmp_path / "results" / "m" / "eval.json").write_text(json.dumps(ev))
    (tmp_path / "results" / "m" / "resume.json").write_text(json.dumps({"passed": True}))
    (tmp_path / "specs").mkdir(exist_ok=True)
    (tmp_path / "specs" / "gate.yaml").write_text(gate_yaml)
    r = gate.decide(tmp_path, ["m"], tmp_path / "specs" / "gate.yaml")
    return {x["rule"]: x for x in r["candidates"]["m"]["rules"]}


def test_gate_holds_challenge_and_real_test_but_not_the_dev_part(tmp_path):
    real_dev = {"kind": "real_utterance", "use": "calibrate", "accuracy": 0.2}
    real_test = {"kind": "real_utterance", "use": "evaluate", "accuracy": 0.97}
    spec = "kind: gate\nthresholds: {real_utterance_accuracy_min: 0.95, challenge_action_rate_max: 0.05}\n"
    ev = _ev(real_dev=real_dev, real_test=real_test, challenge=_challenge({"unrelated": 0, "ambiguous": 2}))
    rules = _decide(tmp_path, ev, spec)
    # The dev part may have been tuned on: its numbers are reported, never judged.
    assert rules["real_utterance_accuracy"]["value"] == 0.97
    assert rules["real_utterance_accuracy"]["verdict"] == "pass"
    assert rules["challenge_action_rate"] == {
        "rule": "challenge_action_rate", "value": 0.1, "op": "<=", "threshold": 0.05, "verdict": "fail",
        "note": "highest of ['challenge']: challenge (acted on: unrelated 0/10, ambiguous 2/10)",
    }  # fmt: skip
    ev["sets"]["challenge"] = _challenge({"unrelated": 0, "ambiguous": 0})
    assert _decide(tmp_path, ev, spec)["challenge_action_rate"]["verdict"] == "pass"
    # No challenge set, or no limit: the rule does not apply, and says why.
    del ev["sets"]["challenge"]
    assert _decide(tmp_path, ev, spec)["challenge_action_rate"]["verdict"] == "n/a"
    ev["sets"]["challenge"] = _challenge({"ambiguous": 9})
    rules = _decide(tmp_path, ev, "kind: gate\n")
    assert rules["challenge_action_rate"]["verdict"] == "n/a"


def test_each_kind_of_challenge_query_has_a_rule_of_its_own(tmp_path):
    spec = (
        "kind: gate\nthresholds: {challenge_action_rate_max: 0.5,"
        " challenge_action_rate_max_by_kind: {unrelated: 0.0, ambiguous: 0.05, multi_intent: 0.05}}\n"
    )
    ev = _ev(challenge=_challenge({"unrelated": 1, "ambiguous": 0}))
    ev["sets"]["challenge_dev"] = dict(_challenge({"unrelated": 5}), use="calibrate")  # never judged
    rules = _decide(tmp_path, ev, spec)
    assert rules["challenge_action_rate"]["verdict"] == "pass"  # 1 of 20 overall ...
    assert rules["challenge_action_rate[unrelated]"] == {  # ... but one unrelated query acted on
        "rule": "challenge_action_rate[unrelated]", "value": 0.1, "op": "<=", "threshold": 0.0,
        "verdict": "fail",
        "note": "highest of ['challenge']: challenge, 1 of 10 unrelated queries acted on",
    }  # fmt: skip
    assert rules["challenge_action_rate[ambiguous]"]["verdict"] == "pass"
    missing = rules["challenge_action_rate[multi_intent]"]  # no evidence is not a pass
    assert missing["verdict"] == "fail"
    assert missing["note"] == "no judged challenge set has multi_intent queries"
    limits = load_spec(REPO / "specs" / "gate.yaml", GateSpec).thresholds.challenge_action_rate_max_by_kind
    assert limits == {"unrelated": 0.0, "ambiguous": 0.05, "multi_intent": 0.05}
    assert load_spec(REPO / "specs" / "gate.yaml", GateSpec).thresholds.challenge_action_rate_max == 0.05


def test_spec_names_the_dev_and_test_parts():
    sets = load_spec(BANKING, DataSpec).prepared_sets()
    assert sets["real_dev"] == ("real_utterance", "calibrate") and sets["real_test"] == (
        "real_utterance",
        "evaluate",
    )
    assert sets["challenge_dev"] == ("challenge", "calibrate") and "real" not in sets
    assert sets["challenge_test"] == ("challenge", "evaluate") and "challenge" not in sets
