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
    # put it there (its subject, a revert of one, or an annotated promotion tag), as `history`
    # marks it; where nothing can be checked (no git, a shallow clone) they say that instead.
    from types import SimpleNamespace

    from reprogate.predict.production import provenance
    from reprogate.serve.version import promotion

    record = _repo(tmp_path)
    assert provenance(tmp_path) == (True, None)  # promote's subject
    record.write_text(json.dumps({"model": "evil", "model_version": "evil@2"}))
    git_cmd(tmp_path, "commit", "-qam", "tidy the record")
    verified, said = provenance(tmp_path)
    assert verified is False and "'tidy the record'" in said and "reprogate history" in said
    shown = promotion(SimpleNamespace(record={}, verified=verified, unverified=said))
    assert shown == {"verified": False, "why": said}
    git_cmd(tmp_path, "tag", "evil#prod#1")  # a lightweight tag names nothing, as in history
    assert provenance(tmp_path)[0] is False
    git_cmd(tmp_path, "tag", "-a", "evil#prod#2", "-m", "promote")
    assert provenance(tmp_path) == (True, None)
    git_cmd(tmp_path, "tag", "-d", "evil#prod#2")
    git_cmd(tmp_path, "revert", "--no-edit", "HEAD")
    assert provenance(tmp_path) == (True, None)
    shallow = tmp_path / "shallow"
    git_cmd(tmp_path, "clone", "-q", "--depth", "1", f"file://{tmp_path}", str(shallow))
    assert provenance(shallow)[0] is None and "shallow clone" in provenance(shallow)[1]
    (tmp_path / ".git").rename(tmp_path / "git-moved")
    assert provenance(tmp_path)[0] is None
