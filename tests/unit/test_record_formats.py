"""Fields with a format are checked wherever a record is read: a hand-made production record or
evaluation cannot carry megabytes where a sha256 belongs, an option where a commit belongs, or
anything but NAME@<12 hex> as a model version."""

from __future__ import annotations

import json

import pytest

from reprogate.records.base import load
from reprogate.records.evaluation import Evaluation
from reprogate.records.production import ProductionRecord
from reprogate.utils.errors import UserError

GOOD = {
    "model": "ngram",
    "model_version": "ngram@16da73b46b58",
    "code_commit": "b647c2fe3774d6012def3261d262fd6d88585745",
    "data_sha256": {"test": "a" * 64},
}


@pytest.mark.parametrize(
    "field,value",
    [
        ("code_commit", "-ofoo"),
        ("code_commit", "HEAD"),
        ("model_version", "ngram"),
        ("model_version", "ngram@xyz"),
        ("model_version", "../x@16da73b46b58"),
        ("data_sha256", {"test": "f" * 50_000_000}),
    ],
    ids=["option", "ref", "no digest", "not hex", "path", "50 MB"],
)
def test_a_production_record_with_a_malformed_field_is_refused_by_name(tmp_path, field, value):
    path = tmp_path / "production.json"
    path.write_text(json.dumps({**GOOD, field: value}))
    with pytest.raises(UserError) as e:
        load(path, ProductionRecord, "restore it")
    assert field in str(e.value) and "restore it" in str(e.value)
    assert len(str(e.value)) < 1000  # the value is quoted short, never whole


def test_a_well_formed_production_record_reads():
    assert ProductionRecord.model_validate(GOOD).code_commit == GOOD["code_commit"]


def test_an_evaluation_set_hash_is_64_hex_digits():
    with pytest.raises(ValueError):
        Evaluation.model_validate({"model": "m", "sets": {"test": {"kind": "labelled", "data_sha256": "x"}}})
