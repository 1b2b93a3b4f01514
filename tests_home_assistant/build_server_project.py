"""Run by the Home Assistant tests with the project's own Python (.venv, 3.11), not Home
Assistant's: a small project trained from the repository's home fixture, with `tiny` in
production and `tiny2` trained beside it (what a promotion during the tests switches to).

    .venv/bin/python tests_home_assistant/build_server_project.py DEST
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reprogate.folder.files import model_version  # noqa: E402
from reprogate.predict import calibrate  # noqa: E402
from reprogate.promote.promotion import artifacts  # noqa: E402
from reprogate.train import job  # noqa: E402
from reprogate.train import run as training  # noqa: E402
from tests.conftest import TINY_NGRAM, make_home_project, write_model_spec  # noqa: E402

SPECS = {
    "tiny": dict(TINY_NGRAM, steps=120, checkpoint={"every_steps": 40, "keep": 1}),
    "tiny2": dict(TINY_NGRAM, seed=11, ngram={"buckets": 2048, "dim": 8}, steps=120,
                  checkpoint={"every_steps": 40, "keep": 1}),
}  # fmt: skip


def promote_file(root: Path, name: str) -> str:
    """models/production.json as `reprogate promote` leaves it for the server (the fields it
    reads), replaced atomically like a git checkout of the file."""
    version = model_version(root / "models" / name)
    record = {
        "model": name,
        "model_version": version,
        "artifacts": artifacts(root, name),  # every file the server loads, by sha256: serve checks them
        "code_commit": "0" * 40,
        "data_sha256": {"train": "0" * 64},
    }
    tmp = root / "models" / "production.json.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(root / "models" / "production.json")
    return version


def main(dest: Path) -> None:
    root = make_home_project(dest)
    for name, spec in SPECS.items():
        write_model_spec(root, name, spec)
        job.train(
            root, training.Paths.for_model(root, name), training.Setup, skip_plan=True, log=lambda s: None
        )
        calibrate.calibrate(root, name, root / "specs" / "gate.yaml")
    versions = {name: model_version(root / "models" / name) for name in SPECS}
    promote_file(root, "tiny")
    print(json.dumps(versions))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--promote":
        print(promote_file(Path.cwd(), sys.argv[2]))
    else:
        main(Path(sys.argv[1]))
