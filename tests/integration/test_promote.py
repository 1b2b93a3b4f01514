"""Promotion: a git commit and tag a reviewer reads, production changing only through it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import IDENTITY, TINY_NGRAM, copy_home, dvc_cmd, git_cmd, run_cli, write_model_spec

_git, _dvc = git_cmd, dvc_cmd


@pytest.fixture(scope="module")
def home(home_pipeline, tmp_path_factory) -> Path:
    return copy_home(home_pipeline, tmp_path_factory.mktemp("promote") / "home")


def test_a_clone_without_the_tags_numbers_the_next_promotion_after_the_committed_ones(tmp_path):
    from reprogate.promote.history import history
    from reprogate.promote.promotion import next_number

    _git(tmp_path, "init", "-q")
    (tmp_path / "models").mkdir()
    record = tmp_path / "models" / "production.json"
    for i in (1, 2, 3):
        record.write_text(json.dumps({"model_version": f"m@{i}"}))
        _git(tmp_path, "add", "-A")
        _git(tmp_path, "commit", "-qm", f"promote m (m@{i}) to production")
    _git(tmp_path, "revert", "--no-edit", "HEAD")  # a rollback is not a promotion
    # Only the first promotion's tag came along (fetched before the others were pushed).
    _git(tmp_path, "tag", "-a", "m#prod#1", "-m", "promote m", "HEAD~3")
    assert next_number(tmp_path, "m") == 4 and next_number(tmp_path, "other") == 1
    assert "2 promotion commit(s) above have no tag in this clone" in history(tmp_path)
    _git(tmp_path, "tag", "-a", "m#prod#7", "-m", "promote m", "HEAD")  # more tags than commits
    assert next_number(tmp_path, "m") == 8


def test_pipeline_writes_predictions_and_a_passing_gate(home):
    ev = json.loads((home / "results/tiny/eval.json").read_text())
    assert set(ev["sets"]) == {"validation", "test", "oos_val", "oos_test", "real", "challenge"}
    assert ev["sets"]["oos_val"]["use"] == "calibrate" and ev["sets"]["oos_test"]["use"] == "evaluate"
    real = [json.loads(x) for x in (home / "predictions/tiny/real.jsonl").read_text().splitlines()]
    assert [r["gold"] for r in real] == ["lights_on", "lights_off", "set_timer", "play_music", "weather"]
    lines = [json.loads(x) for x in (home / "predictions/tiny/test.jsonl").read_text().splitlines()]
    assert len(lines) == ev["sets"]["test"]["n"]
    assert list(lines[0])[:8] == [
        "id",
        "text",
        "gold",
        "predicted",
        "probability",
        "alternatives",
        "route",
        "reasons",
    ]
    assert len(lines[0]["alternatives"]) == 3
    # The file is the evidence behind eval.json: its accuracy is the file's gold == predicted.
    right = sum(x["gold"] == x["predicted"] for x in lines) / len(lines)
    assert right == pytest.approx(ev["sets"]["test"]["accuracy"])
    g = json.loads((home / "results/gate.json").read_text())
    assert g["passed"] and g["chosen"] in ("tiny", "tiny2", "duo"), g["reasons"]
    assert set(g["candidates"]) == {"tiny", "tiny2", "duo"}
    best = max(c["heldout_accuracy"] for c in g["candidates"].values() if c["passed"])
    assert g["candidates"][g["chosen"]]["heldout_accuracy"] == best
    duo = json.loads((home / "metrics/duo/train.json").read_text())
    assert set(duo["weights"]) == {"tiny", "tiny2"} and all(w > 0 for w in duo["weights"].values())
    resume = {r["rule"]: r for r in g["candidates"]["duo"]["rules"]}["resume_equivalence"]
    assert resume["verdict"] == "pass"  # an ensemble's resume evidence is its members' checks
    for name, c in g["candidates"].items():  # the declared real-utterance set has its own rule
        real_rule = {r["rule"]: r for r in c["rules"]}["real_utterance_accuracy"]
        measured = json.loads((home / f"results/{name}/eval.json").read_text())["sets"]["real"]["accuracy"]
        assert real_rule["value"] == measured and real_rule["threshold"] == 0.6
        assert real_rule["verdict"] == ("pass" if measured >= 0.6 else "fail")
    assert json.loads((home / "models/tiny/calibration.json").read_text())["fitted_on"][
        "out_of_scope_sets"
    ] == ["oos_val"]


def test_a_refused_commit_leaves_production_and_the_index_as_they_were(home):
    # A commit hook that says no (or git without an identity): promote must not leave the new
    # record behind, neither in the file nor staged for the next commit someone makes.
    before = (home / "models/production.json").read_bytes()
    head = _git(home, "rev-parse", "HEAD")
    hook = home / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho 'policy: no commits today' >&2\nexit 1\n")
    hook.chmod(0o755)
    try:
        proc = run_cli("promote", cwd=home)
    finally:
        hook.unlink()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "git commit failed (policy: no commits today); production is unchanged" in proc.stderr
    assert (home / "models/production.json").read_bytes() == before
    assert _git(home, "rev-parse", "HEAD") == head and _git(home, "status", "--porcelain").strip() == ""
    assert _git(home, "tag", "--list", "*#prod#*").strip() == ""


def test_promote_refuses_a_dirty_workspace_then_commits_and_tags(home):
    before = (home / "models/production.json").read_bytes()
    (home / "notes.txt").write_text("an uncommitted change\n")
    refused = run_cli("promote", cwd=home)
    assert refused.returncode == 2 and "uncommitted changes" in refused.stderr
    assert (home / "models/production.json").read_bytes() == before
    _git(home, "add", "-A")
    _git(home, "commit", "-qm", "home pipeline results")
    chosen = json.loads((home / "metrics/gate.json").read_text())["chosen"]
    dry = run_cli("promote", "--dry-run", cwd=home, check=True)
    assert "would write models/production.json" in dry.stdout
    assert f"commit and tag {chosen}@v0.0.1 and {chosen}#prod#1" in dry.stdout
    assert (home / "models/production.json").read_bytes() == before
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    done = run_cli("promote", cwd=home, env=env, check=True)
    assert f"tags {chosen}@v0.0.1 and {chosen}#prod#1" in done.stdout
    prod = json.loads((home / "models/production.json").read_text())
    assert prod["model"] == chosen and prod["code_commit"] == _git(home, "rev-parse", "HEAD~1").strip()
    assert f"models/{chosen}/model.safetensors" in prod["artifacts"]
    # The promoted files are kept beside the record (git-ignored): production outlives a retrain.
    kept = home / "models/.promoted" / prod["model_version"] / chosen
    assert (kept / "model.safetensors").read_bytes() == (
        home / f"models/{chosen}/model.safetensors"
    ).read_bytes()
    assert _git(home, "status", "--porcelain").strip() == ""
    message = _git(home, "log", "-1", "--format=%B")
    for rule in (
        "heldout_accuracy",
        "ece",
        "wrong_action_rate",
        "false_positive_action_rate",
        "resume_equivalence",
    ):
        assert f"- {rule}:" in message
    assert _git(home, "tag", "--list", "*#prod#*").split() == [f"{chosen}#prod#1"]
    assert _git(home, "cat-file", "-t", f"{chosen}#prod#1").strip() == "tag"  # annotated
    assert _git(home, "tag", "--points-at", "HEAD").split() == [f"{chosen}#prod#1", f"{chosen}@v0.0.1"]
    assert f"are kept in models/.promoted/{prod['model_version']}" in done.stdout
    published = f"refs/tags/{chosen}@v0.0.1 refs/tags/{chosen}#prod#1` publishes the commit with its tags"
    assert published in done.stdout
    history = run_cli("history", cwd=home, check=True).stdout
    assert f"promote {chosen} ({prod['model_version']}) to production  [files kept]" in history
    # The promotion commit carries the gate judged again against the record it wrote (the gate
    # depends on it): the pipeline is up to date, and the gate chooses the same model.
    changed = _git(home, "show", "--name-only", "--format=", "HEAD").split()
    assert {"models/production.json", "results/gate.json", "dvc.lock"} <= set(changed), changed
    assert json.loads((home / "metrics/gate.json").read_text())["chosen"] == chosen
    assert "not_worse_than_production" in (home / "results/gate.json").read_text()
    assert json.loads(_dvc(home, "status", "--json") or "{}") in ({}, {"code": ["always changed"]})
    status = run_cli("status", cwd=home)
    assert status.returncode == 0, status.stdout + status.stderr
    # The same command again (a retried --push takes this path too): nothing to do, no commit,
    # no tag.
    head = _git(home, "rev-parse", "HEAD")
    again = run_cli("promote", cwd=home, env=env, check=True)
    assert (
        f"nothing to do: {prod['model_version']} (same calibrated policy) is already in production"
        in again.stdout
    )
    assert _git(home, "rev-parse", "HEAD") == head
    assert _git(home, "tag", "--list", "*#prod#*").split() == [f"{chosen}#prod#1"]
    # A rollback is a revert of the promotion commit; history says what each commit put there.
    _git(home, "revert", "--no-edit", "HEAD")
    _git(home, "revert", "--no-edit", "HEAD")
    newest = [line.split(" ", 2)[2] for line in run_cli("history", cwd=home).stdout.splitlines()[:3]]
    restored = f'{prod["model_version"]}  Revert "Revert'
    assert newest[0].startswith(restored) and newest[0].endswith("[files kept]")
    assert newest[1].startswith('(none)  Revert "promote')
    assert newest[2].startswith(f"{prod['model_version']}  promote {chosen}") and "[files kept]" in newest[2]


def test_predict_routes_queries_with_the_production_model(home):
    out = run_cli(
        "predict", "turn on the kitchen lights", "what is the capital of peru", cwd=home, check=True
    )
    first, second = (json.loads(x) for x in out.stdout.splitlines())
    assert first["intent"] == "lights_on" and first["route"] in ("act", "review")
    assert {
        "intent",
        "probability",
        "alternatives",
        "route",
        "reasons",
        "model_version",
        "latency_ms",
    } <= set(first)
    chosen = json.loads((home / "models/production.json").read_text())["model"]
    policy = json.loads((home / f"models/{chosen}/calibration.json").read_text())["policy"]
    for p in (first, second):  # the route follows the calibrated policy, and says why
        assert (p["route"] == "review") == bool(p["reasons"])
        assert ("low_confidence" in p["reasons"]) == (p["probability"] < policy["threshold"])
    (home / "q.txt").write_text("set a timer for 5 minutes\nplay some jazz\n")
    run_cli("predict", "--input", "q.txt", "--output", "out.jsonl", cwd=home, check=True)
    assert len((home / "out.jsonl").read_text().splitlines()) == 2
    bad = run_cli("predict", "", cwd=home)
    assert bad.returncode == 2 and "query 1 on the command line: the query is empty" in bad.stderr
    # An empty line is refused, not skipped, and named by file and line: output i answers input i.
    (home / "gap.txt").write_text("set a timer for 5 minutes\n\nplay some jazz\n")
    bad = run_cli("predict", "--input", "gap.txt", "--output", "gap.jsonl", cwd=home)
    assert bad.returncode == 2 and "gap.txt:2: the query is empty" in bad.stderr
    assert "Traceback" not in bad.stderr and not (home / "gap.jsonl").exists()


def _swap_first_two(labels: Path) -> None:
    names = json.loads(labels.read_text())
    names[0], names[1] = names[1], names[0]
    labels.write_text(json.dumps(names, indent=1) + "\n")


def test_a_swapped_label_in_any_copy_is_refused_and_nothing_answers(home):
    """Every byte predict loads must be what the promotion pins, not only the weights: a
    labels.json with two labels swapped would route a query to the wrong intent and act on it."""
    prod = json.loads((home / "models/production.json").read_text())
    chosen = prod["model"]
    kept = home / "models/.promoted" / prod["model_version"]
    pinned = prod["artifacts"][f"models/{chosen}/labels.json"]
    labels = kept / chosen / "labels.json"
    original = labels.read_bytes()
    try:
        _swap_first_two(labels)
        proc = run_cli("predict", "turn on the kitchen lights", cwd=home)
        said = " ".join(proc.stderr.split())
        assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
        where = labels.relative_to(home)  # commands name paths inside the project from its root
        assert f"{where} has sha256 {hashlib.sha256(labels.read_bytes()).hexdigest()}" in said
        assert f"pins {pinned}" in said
    finally:
        labels.write_bytes(original)
    # A file the promotion never pinned (transformers would read an added tokenizer file) is refused too.
    extra = kept / chosen / "assets" / "added_tokens.json"
    extra.write_text("{}\n")
    try:
        proc = run_cli("predict", "turn on the kitchen lights", cwd=home)
        said = " ".join(proc.stderr.split())
        assert proc.returncode == 2 and f"{extra.relative_to(home)} is a file" in said
    finally:
        extra.unlink()
    # No kept copy and a swapped label in the workspace: the workspace is not production, so the
    # promoted bytes come back from the shipped store instead, and only they answer.
    aside = kept.with_name("aside")
    kept.rename(aside)
    workspace = home / "models" / chosen / "labels.json"
    before = workspace.read_bytes()
    try:
        _swap_first_two(workspace)
        proc = run_cli("predict", "turn on the kitchen lights", cwd=home)
        assert proc.returncode == 0 and f"restoring models/{chosen} of" in proc.stderr
        assert hashlib.sha256((kept / chosen / "labels.json").read_bytes()).hexdigest() == pinned
    finally:
        workspace.write_bytes(before)
        shutil.rmtree(kept, ignore_errors=True)
        aside.rename(kept)
    assert run_cli("predict", "turn on the kitchen lights", cwd=home).returncode == 0


def test_failed_gate_leaves_production_untouched(home):
    before = (home / "models/production.json").read_bytes()
    gate_spec = home / "specs/gate.yaml"
    gate_spec.write_text(
        gate_spec.read_text().replace("heldout_accuracy_min: 0.7", "heldout_accuracy_min: 1.0")
    )
    _dvc(home, "repro", "gate")
    assert json.loads((home / "metrics/gate.json").read_text())["passed"] is False
    _git(home, "add", "-A")
    _git(home, "commit", "-qm", "stricter gate")
    refused = run_cli("promote", cwd=home)
    assert refused.returncode == 2 and "the gate did not pass" in refused.stderr
    assert (home / "models/production.json").read_bytes() == before


def test_an_experiments_candidate_is_promoted_from_its_own_gate_and_ships(home_pipeline, tmp_path):
    """params.yaml `experiments` is a second pipeline with a gate of its own. Before anyone runs
    it, the default gate's choice is promoted as ever (outputs never built in the other pipeline
    are no reason to refuse); `promote --pipeline experiments` promotes what its gate chose, with
    the files experiments/dvc.lock pins shipped, so a fresh clone answers with it."""
    root = copy_home(home_pipeline, tmp_path / "home")
    # Longer and at a higher rate than the default's three (0.85 on the toy test set, each): 1.0
    # there under the pin, so the experiments' gate chooses it over them.
    strong = dict(TINY_NGRAM, seed=7, steps=240, optimizer={"lr": 0.1})
    write_model_spec(root, "strong", dict(strong, checkpoint={"every_steps": 50, "keep": 2}))
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump(dict(params, experiments=["strong"])))
    run_cli("compile", cwd=root, check=True)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "an experiment")
    default = run_cli("promote", "--dry-run", cwd=root)
    assert default.returncode == 0 and "would write models/production.json" in default.stdout, default.stderr
    early = run_cli("promote", "--pipeline", "experiments", cwd=root)
    assert early.returncode == 2 and "results/experiments/gate.json does not exist" in early.stderr
    assert "dvc repro experiments/dvc.yaml" in early.stderr
    _dvc(root, "repro", "experiments/dvc.yaml")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "the experiment, run")
    chosen = json.loads((root / "results/experiments/gate.json").read_text())["chosen"]
    assert chosen == "strong"
    # The pull-request report of the experiments: their gate and both pipelines' stages.
    said = run_cli("report", "--base", "HEAD~1", "--head", "HEAD", "--pipeline", "experiments", "--out",
                   str(tmp_path / "report"), cwd=root, check=True).stdout  # fmt: skip
    assert "chosen strong (base: no gate record)" in said
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert "experiments/dvc.yaml:train@strong" in report["stages"]["added"]
    assert "## Gate of the experiments" in (tmp_path / "report" / "report.md").read_text()
    run_cli("promote", "--pipeline", "experiments", cwd=root, env=IDENTITY, check=True)
    prod = json.loads((root / "models/production.json").read_text())
    assert prod["model"] == "strong" and "models/strong/model.safetensors" in prod["artifacts"]
    assert _git(root, "status", "--porcelain").strip() == ""
    # Both gates depend on the record: the promotion commit judged both again, so neither is stale.
    stale = json.loads(_dvc(root, "status", "--json", "dvc.yaml", "experiments/dvc.yaml") or "{}")
    assert set(stale) <= {"code", "experiments/dvc.yaml:code"}, stale
    assert {"results/gate.json", "results/experiments/gate.json"} <= set(
        _git(root, "show", "--name-only", "--format=", "HEAD").split()
    )
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(root), str(clone))
    said = run_cli("predict", "turn on the lights", cwd=clone, check=True)
    assert json.loads(said.stdout.splitlines()[0])["model_version"] == prod["model_version"]
    assert "restoring models/strong" in said.stderr
