"""Promotion edges a reviewer relies on: no promotion from a detached HEAD (its commit would be on
no branch, and a push would make a branch named HEAD), and `history` marks a production change
that `reprogate promote` did not make as unverified."""

from __future__ import annotations

import json

import pytest

from reprogate.promote.history import history
from reprogate.promote.promotion import promote
from reprogate.utils.errors import UserError
from tests.conftest import git_cmd


def _repo(tmp_path):
    git_cmd(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "models").mkdir()
    record = tmp_path / "models" / "production.json"
    record.write_text(json.dumps({"model": "m", "model_version": "m@1"}))
    git_cmd(tmp_path, "add", "-A")
    git_cmd(tmp_path, "commit", "-qm", "promote m (m@1) to production")
    return record


@pytest.mark.parametrize("dry_run", [False, True], ids=["promote", "dry run"])
def test_a_detached_head_is_refused_before_anything(tmp_path, dry_run):
    _repo(tmp_path)
    git_cmd(tmp_path, "checkout", "-q", "--detach")
    with pytest.raises(UserError, match="HEAD is detached") as e:
        promote(tmp_path, dry_run=dry_run)
    assert "git switch" in str(e.value)


def test_history_marks_a_hand_made_production_change_as_unverified(tmp_path):
    record = _repo(tmp_path)
    record.write_text(json.dumps({"model": "evil", "model_version": "evil@2"}))
    git_cmd(tmp_path, "commit", "-qam", "tidy the record")
    git_cmd(tmp_path, "revert", "--no-edit", "HEAD")
    lines = history(tmp_path).splitlines()
    assert "evil@2  tidy the record  [unverified: not made by promote]" in lines[1]
    assert "unverified" not in lines[0] and "unverified" not in lines[2]  # a revert, a promotion


def test_serving_names_a_production_record_no_promotion_made(tmp_path):
    # predict and serve answer with what HEAD holds, and say when `reprogate promote` did not
    # put it there (its subject, a revert of one, or a promotion tag): as `history` marks it.
    from reprogate.predict.production import unverified

    record = _repo(tmp_path)
    assert unverified(tmp_path) is None  # promote's subject
    record.write_text(json.dumps({"model": "evil", "model_version": "evil@2"}))
    git_cmd(tmp_path, "commit", "-qam", "tidy the record")
    said = unverified(tmp_path)
    assert said and "'tidy the record'" in said and "reprogate history" in said
    git_cmd(tmp_path, "tag", "evil#prod#1")
    assert unverified(tmp_path) is None  # a promotion tag names that commit
    git_cmd(tmp_path, "tag", "-d", "evil#prod#1")
    git_cmd(tmp_path, "revert", "--no-edit", "HEAD")
    assert unverified(tmp_path) is None
