"""`reprogate plan` of a whole pipeline: each stage projected before `dvc repro` runs it."""

from __future__ import annotations

import json
import re

import pytest

from reprogate.pipeline import compile as compile_dvc
from reprogate.pipeline import projection
from reprogate.records.base import write
from reprogate.records.runlog import append
from tests.conftest import TINY_NGRAM, make_home_project, run_cli, write_model_spec


@pytest.fixture
def home(tmp_path):
    root = make_home_project(tmp_path / "home")
    (root / "models").mkdir()
    (root / "models" / "production.json").write_text('{"model": null}\n')
    compile_dvc.compile_dvc(root, check=False)
    return root


def _table(root, **stages):
    table = projection.StageTable(
        commit=None,
        measured_at="2026-12-04",
        cpu="the table's machine",
        cores=2,
        probe_s=projection.probe(),  # the same speed as here: the factor is about 1
        startup_s=4.0,
        stages={a: projection.StageTime(**s) for a, s in stages.items()},
    )
    write(root / projection.TABLE, table)
    return table


def test_every_stage_is_projected_from_its_last_run_here_or_the_scaled_table(home):
    _table(home, prepare={"seconds": 10.0}, **{"train@tiny": {"seconds": 30.0, "updates": 6}})
    # This machine ran calibrate@tiny before: its own run log wins over any table.
    append(home, home / "logs" / "calibrate@tiny.jsonl", "calibrate@tiny", {"wall_s": 7.5})
    rows, table, factor = projection.project(home, compile_dvc.paths.DVC_YAML, everything=True)
    by = {r.address: r for r in rows}
    assert list(by) == projection.instances(home, compile_dvc.paths.DVC_YAML)
    assert by["calibrate@tiny"].seconds == pytest.approx(7.5 + 4.0)
    assert by["prepare"].seconds == pytest.approx((10.0 + 4.0) * factor)
    # The spec now plans 12 updates where the table measured 6: twice the training time.
    assert by["train@tiny"].seconds == pytest.approx((30.0 * 12 / 6 + 4.0) * factor)
    assert "12 updates / 6" in by["train@tiny"].source
    assert by["gate"].seconds is None and "never measured" in by["gate"].source
    said = projection.describe(home, compile_dvc.paths.DVC_YAML, everything=True).splitlines()
    unknown = sum(r.seconds is None for r in rows)
    assert re.fullmatch(rf"plan: dvc.yaml: {len(rows)} stages .*, about [\d.]+ min on this machine plus "
                        rf"{unknown} never measured", said[0])  # fmt: skip
    assert len(said) == len(rows) + 2 and "this machine takes" in said[-1]


def test_the_table_is_written_from_a_full_run_and_the_cli_prints_the_projection(home):
    addresses = projection.instances(home, compile_dvc.paths.DVC_YAML)
    refused = run_cli("plan", "--write-table", "100", cwd=home)
    assert refused.returncode == 2 and "no run log of" in refused.stderr and "Traceback" not in refused.stderr
    for a in addresses:
        append(home, home / "logs" / f"{a}.jsonl", a, {"wall_s": 2.0})
    (home / "metrics" / "tiny").mkdir(parents=True)
    (home / "metrics" / "tiny" / "train.json").write_text(
        json.dumps(
            {
                "steps": 12,
                "epochs": 1,
                "examples": 96,
                "final_loss": 1.0,
                "validation_accuracy": 0.5,
                "truncated_texts": 0,
            }  # fmt: skip
        )
    )
    run_cli("plan", "--write-table", "100", cwd=home, check=True)
    table = json.loads((home / projection.TABLE).read_text())
    assert table["stages"]["train@tiny"] == {"seconds": 2.0, "updates": 12}
    assert table["startup_s"] == pytest.approx((100 - 2.0 * len(addresses)) / len(addresses), abs=0.01)
    out = run_cli("plan", "--all", cwd=home, check=True).stdout
    assert out.startswith(f"plan: dvc.yaml: {len(addresses)} stages (all, as `dvc repro -f`), about ")
    assert "its last run here" in out
    write_model_spec(home, "tiny", {**TINY_NGRAM, "steps": 24})  # the run logs still answer first
    assert "its last run here" in run_cli("plan", "--all", cwd=home, check=True).stdout
