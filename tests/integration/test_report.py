"""`reprogate report`: two commits of a real pipeline, and a report that says what their files say.

The base is conftest's home pipeline as committed; the head retrains one candidate with another
seed (`dvc repro`, committed). Every number in the report is checked against the revisions'
own records, prediction files and dvc.lock, read here independently of the report's code.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from scipy.stats import binomtest

from tests.conftest import copy_home, dvc_cmd, git_cmd, run_cli, write_model_spec

# Two revisions of the home pipeline, each built (a minute and a half): `make test-long`, run by CI.
pytestmark = pytest.mark.long


def _at(root: Path, rev: str, path: str) -> dict:
    return json.loads(git_cmd(root, "show", f"{rev}:{path}"))


def _predictions(path: Path) -> dict[str, tuple[str, str]]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return {r["id"]: (r["gold"], r["predicted"]) for r in rows}


@pytest.fixture(scope="module")
def two_commits(home_pipeline, tmp_path_factory) -> tuple[Path, dict, Path]:
    root = copy_home(home_pipeline, tmp_path_factory.mktemp("report") / "home")
    base_predictions = tmp_path_factory.mktemp("base") / "test.jsonl"
    shutil.copy(root / "predictions/tiny/test.jsonl", base_predictions)
    spec = yaml.safe_load((root / "specs/models/tiny.yaml").read_text())
    write_model_spec(root, "tiny", dict(spec, seed=spec["seed"] + 11))
    dvc_cmd(root, "repro")
    git_cmd(root, "add", "-A")
    git_cmd(root, "commit", "-qm", "tiny: another seed")
    out = root.parent / "report"
    said = run_cli("report", "--base", "HEAD~1", "--head", "HEAD", "--out", str(out), cwd=root, check=True)
    assert said.stdout.startswith("report: HEAD (") and "stage(s) reran" in said.stdout
    return root, json.loads((out / "report.json").read_text()), base_predictions


def test_the_gate_section_is_each_revisions_own_decision(two_commits):
    root, r, _ = two_commits
    for side, rev in (("base", "HEAD~1"), ("head", "HEAD")):
        decision = _at(root, rev, "results/gate.json")
        assert r[side]["commit"] == git_cmd(root, "rev-parse", rev).strip()
        assert r["gate"][side]["chosen"] == decision["chosen"]
        assert r["gate"][side]["passed"] == decision["passed"]
        for name, cand in decision["candidates"].items():
            for rule in cand["rules"]:
                row = next(
                    x for x in r["gate"]["rules"] if (x["candidate"], x["rule"]) == (name, rule["rule"])
                )
                assert row[side]["value"] == rule["value"] and row[side]["verdict"] == rule["verdict"]
    flags = [row["changed"] for row in r["gate"]["rules"]]
    assert flags == sorted(flags, reverse=True)  # changed verdicts first


def test_headline_deltas_are_the_records_difference_with_its_direction(two_commits):
    root, r, _ = two_commits
    base = _at(root, "HEAD~1", "results/tiny/eval.json")["sets"]["test"]
    head = _at(root, "HEAD", "results/tiny/eval.json")["sets"]["test"]
    rows = {(x["model"], x["set"], x["metric"]): x for x in r["metrics"]}
    acc = rows[("tiny", "test", "accuracy")]
    assert (acc["base"], acc["head"]) == (base["accuracy"], head["accuracy"])
    assert acc["delta"] == pytest.approx(head["accuracy"] - base["accuracy"])
    ece = rows[("tiny", "test", "ece")]
    assert (ece["base"], ece["head"]) == (base["ece_after"], head["ece_after"])
    if ece["delta"]:
        assert ece["better"] == (ece["delta"] < 0)  # lower is better for calibration error
    untouched = rows[("tiny2", "test", "accuracy")]  # not retrained: the same number
    assert untouched["delta"] == 0 and untouched["better"] is None


def test_paired_counts_and_mcnemar_come_from_the_prediction_files(two_commits):
    root, r, base_file = two_commits
    base, head = _predictions(base_file), _predictions(root / "predictions/tiny/test.jsonl")
    fixed = sum(base[i][1] != g and p == g for i, (g, p) in head.items())
    broken = sum(base[i][1] == g and p != g for i, (g, p) in head.items())
    p = r["paired"]["tiny"]
    assert p["paired"] and p["items"] == len(head) == len(base)
    assert (p["fixed"], p["broken"]) == (fixed, broken)
    expected = binomtest(fixed, fixed + broken, 0.5).pvalue if fixed + broken else 1.0
    assert p["p_value"] == pytest.approx(expected)
    lo, hi = p["delta_ci95"]["accuracy"]
    assert lo <= (fixed - broken) / len(head) <= hi


def test_stages_that_reran_are_the_lock_entries_that_changed(two_commits):
    root, r, _ = two_commits
    before = yaml.safe_load(git_cmd(root, "show", "HEAD~1:dvc.lock"))["stages"]
    after = yaml.safe_load(git_cmd(root, "show", "HEAD:dvc.lock"))["stages"]
    changed = sorted(s for s in after if before.get(s) != after[s])
    assert r["stages"]["reran"] == changed
    assert {"train@tiny", "evaluate@tiny", "combine@duo", "gate"} <= set(changed)
    assert {"prepare", "features@tiny", "train@tiny2"} <= set(r["stages"]["unchanged"])


def test_the_markdown_and_plots_render_the_report(two_commits):
    root, r, _ = two_commits
    out = root.parent / "report"
    md = (out / "report.md").read_text()
    assert md.startswith("<!-- reprogate-report -->\n# reprogate report: HEAD (")
    acc = next(x for x in r["metrics"] if (x["model"], x["set"], x["metric"]) == ("tiny", "test", "accuracy"))
    assert f"| tiny | test | accuracy | {acc['base']:.4f} | {acc['head']:.4f} |" in md
    for section in ("## Gate", "## Paired predictions", "## Stages (from dvc.lock)", "## Resume checks"):
        assert section in md
    assert "train@tiny" in md.split("- reran", 1)[1].split("\n", 1)[0]
    chosen = r["intents"]["model"]
    # DVC's own plots of the chosen candidate (base and head overlaid), beside the report's two.
    declared = {
        Path(next(iter(plot))).stem
        for stage in yaml.safe_load(git_cmd(root, "show", "HEAD:dvc.yaml"))["stages"].values()
        if chosen in stage.get("foreach", {})
        for plot in stage["do"].get("plots", [])
    }
    pngs = {f"{chosen}-{stem}.png" for stem in declared} | {"accuracy.png"}
    pngs |= {"intents.png"} if r["intents"]["moved"] else set()
    assert {p.name for p in out.glob("*.png")} == pngs
    for png in pngs:
        assert f"]({png})" in md and (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert r["resume"][0]["head"]["passed"] is True
    assert r["environment"]["head"]["environment"]["torch"].startswith("2.")


def test_a_clone_without_the_cache_says_what_it_could_not_pair(two_commits, tmp_path):
    root, _, _ = two_commits
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    run_cli(
        "report", "--base", "HEAD~1", "--head", "HEAD", "--out", str(tmp_path / "r"), cwd=clone, check=True
    )
    r = json.loads((tmp_path / "r" / "report.json").read_text())
    assert r["paired"]["tiny"] == {
        "paired": False,
        "why": "no prediction file",
        "base_items": 0,
        "head_items": 0,
    }
    assert any("predictions/tiny/test.jsonl" in m for m in r["missing"])
    assert "## Not available" in (tmp_path / "r" / "report.md").read_text()
    assert r["gate"]["head"]["chosen"]  # what git holds is still compared


def test_an_unknown_base_is_one_paragraph(two_commits, tmp_path):
    root, _, _ = two_commits
    proc = run_cli("report", "--base", "no-such-branch", "--out", str(tmp_path / "r"), cwd=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'no-such-branch' is not a commit" in proc.stderr and not (tmp_path / "r").exists()


HOSTILE = "card_arrival | 1.0 | 1.0 |\n## Approved by security\n<img src=x onerror=alert(1)> [docs](https://evil.example)"


def test_labels_from_records_cannot_add_rows_sections_html_or_links():
    from reprogate.report.markdown import _intents, _stages

    moved = [{"intent": HOSTILE, "base": 0.5, "head": 0.75, "delta": 0.25}]
    lines = _intents({"model": "tiny**x**", "moved": moved}) + _stages(
        {"reran": ["train@x\n# Fake"], "added": [], "removed": [], "unchanged": []}
    )
    md = "\n".join(lines)
    table = [x for x in lines if x.startswith("|")]
    assert len(table) == 3  # header, rule, one row: the label did not end its row
    assert table[2].count(" | ") == 3 and table[2].count("\\|") == 3  # its own bars are text
    headings = [x for x in lines if x.lstrip("- ").startswith("#")]  # none of the records' own
    assert headings == [
        "## Intents that moved most (tiny\\*\\*x\\*\\*, test F1)",
        "## Stages (from dvc.lock)",
    ]
    assert "<img" not in md and "&lt;img" in md and "](" not in md.replace("\\](", "")
    assert "tiny\\*\\*x\\*\\*" in md


def test_out_that_is_a_file_or_holds_a_link_is_refused_and_nothing_is_followed(two_commits, tmp_path):
    root, _, _ = two_commits
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    proc = run_cli("report", "--base", "HEAD~1", "--out", str(a_file), cwd=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "is a file, not a folder" in proc.stderr and a_file.read_text() == "mine\n"

    out, target = tmp_path / "out", tmp_path / "bashrc"
    out.mkdir()
    target.write_text("precious\n")
    (out / "report.md").symlink_to(target)
    proc = run_cli("report", "--base", "HEAD~1", "--out", str(out), cwd=root)
    assert (
        proc.returncode == 2
        and "holds symbolic links where the report writes its files (report.md)" in proc.stderr
    )
    assert target.read_text() == "precious\n" and sorted(p.name for p in out.iterdir()) == ["report.md"]
