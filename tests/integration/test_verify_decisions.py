"""`reprogate verify` on predictions: the commit's are DVC outputs, read from the project's cache,
and compared with the rebuild's item by item, intent and route (pipeline/decisions.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from reprogate.pipeline.verify import DECISIONS_CHANGED, verify
from tests.conftest import BIN, git_cmd


def _line(item: str, intent: str, route: str, p: float) -> str:
    return json.dumps(
        {"id": item, "text": "t", "gold": "a", "predicted": intent, "probability": p, "alternatives": [],
         "route": route, "reasons": [], "model_version": "m@1"}
    )  # fmt: skip


def _predictions(folder: Path, lines: list[str]) -> None:
    (folder / "predictions" / "m").mkdir(parents=True, exist_ok=True)
    (folder / "predictions" / "m" / "test.jsonl").write_text("\n".join(lines) + "\n")


def _project(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "params.yaml").write_text("data: d\nmodels: [m]\ngate: g\n")
    (root / "dvc.yaml").write_text("stages:\n  evaluate:\n    cmd: 'true'\n    outs:\n    - predictions/m\n")
    _predictions(root, [_line("1", "a", "act", 0.9), _line("2", "b", "review", 0.4)])


def test_moved_probabilities_with_the_same_answers_hold_and_a_new_route_does_not(tmp_path):
    root = tmp_path / "repo"
    _project(root)
    git_cmd(root, "init", "-q")
    dvc = str(BIN / "dvc")
    subprocess.run([dvc, "init", "-q"], cwd=root, check=True)
    subprocess.run([dvc, "commit", "-f", "-q"], cwd=root, check=True, capture_output=True)
    git_cmd(root, "add", "-A")
    git_cmd(root, "commit", "-qm", "c")

    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(root, rebuilt, ignore=shutil.ignore_patterns(".git", ".dvc"))
    _predictions(rebuilt, [_line("1", "a", "act", 0.9000001), _line("2", "b", "review", 0.4)])
    status, said = verify(root, "HEAD", rebuilt, 1e-6)
    assert status == 3 and "different         predictions/m" in said
    assert "decisions: predictions' intents and routes held (2 equal)" in said

    _predictions(rebuilt, [_line("1", "a", "act", 0.9), _line("2", "b", "act", 0.4)])
    status, said = verify(root, "HEAD", rebuilt, 1e-6)
    assert status == DECISIONS_CHANGED
    assert "predictions/m/test.jsonl 2: ('b', 'review') -> ('b', 'act')" in said

    shutil.rmtree(root / ".dvc" / "cache")  # the commit's predictions are nowhere here
    status, said = verify(root, "HEAD", rebuilt, 1e-6)
    assert status == 3 and "predictions' intents and routes not checked" in said and "dvc pull" in said
