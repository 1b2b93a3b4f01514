"""Every input is bounded: a spec, a query file, a query. Refused early, in bounded memory and
time, with the file and line named; nothing half-written is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from reprogate.specs.catalog import load_any
from reprogate.specs.reading import read_yaml
from reprogate.utils import queries
from reprogate.utils.errors import UserError
from tests.conftest import REPO, TINY_NGRAM, make_home_project, run_cli, write_model_spec

# The classic "billion laughs": 469 bytes that expand to 9**9 strings.
BOMB = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)


def _peak(fn) -> tuple[int, Exception | None]:
    """Peak bytes Python allocated while `fn` ran, and what it raised."""
    tracemalloc.start()
    raised = None
    try:
        fn()
    except Exception as e:  # the refusal under test
        raised = e
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, raised


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    from reprogate.predict import calibrate
    from reprogate.train import job
    from reprogate.train import run as training

    root = make_home_project(tmp_path_factory.mktemp("bounded"))
    job.train(
        root, training.Paths.for_model(root, "tiny"), training.Setup, skip_plan=True, log=lambda s: None
    )
    calibrate.calibrate(root, "tiny", root / "specs" / "gate.yaml")
    return root


def test_an_alias_bomb_is_refused_in_bounded_memory_and_time(tmp_path):
    spec = tmp_path / "bomb.yaml"
    spec.write_text("kind: model\n" + BOMB)
    assert len(BOMB) < 500
    started = time.monotonic()
    peak, raised = _peak(lambda: load_any(spec))
    assert isinstance(raised, UserError) and time.monotonic() - started < 5
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB to refuse a 469-byte file"
    assert "aliases expand to more than 10000 nodes" in str(raised) and str(spec) in str(raised)
    proc = run_cli("validate", str(spec))
    assert proc.returncode == 1 and "aliases expand" in proc.stderr and "Traceback" not in proc.stderr


def test_an_alias_bomb_in_params_yaml_stops_compile(tmp_path):
    root = make_home_project(tmp_path)
    (root / "params.yaml").write_text((root / "params.yaml").read_text() + BOMB)
    proc = run_cli("compile", cwd=root)
    assert (
        proc.returncode == 2
        and "params.yaml: not valid YAML" in proc.stderr
        and "aliases expand" in proc.stderr
    )
    assert not (root / "dvc.yaml").exists()


def test_a_node_that_contains_itself_is_refused(tmp_path):
    spec = tmp_path / "loop.yaml"
    spec.write_text("kind: model\nloop: &x [1, *x]\n")
    with pytest.raises(UserError, match=r"alias \*x refers to a node that contains it"):
        read_yaml(spec)


def test_anchors_a_person_writes_still_work(tmp_path):
    root = make_home_project(tmp_path)
    spec = root / "specs" / "data" / "home.yaml"
    text = spec.read_text()
    old_train = "train: {origin: home, file: train.csv, text_field: utterance, label_field: intent}"
    old_test = "test: {origin: home, file: test.csv, text_field: utterance, label_field: intent}"
    assert old_train in text and old_test in text
    text = text.replace(old_train, old_train.replace("train: {", "train: &table {"))
    spec.write_text(text.replace(old_test, "test: {<<: *table, file: test.csv}"))
    loaded = load_any(spec)
    assert loaded.test.file == "test.csv" and loaded.test.text_field == "utterance"


def test_a_spec_over_the_size_bound_is_refused_without_reading_it_whole(tmp_path):
    spec = tmp_path / "huge.yaml"
    with open(spec, "w") as f:
        f.write("kind: data\nlabels:\n")
        for i in range(200_000):
            f.write(f"  - intent_{i}\n")
    assert spec.stat().st_size > 2 * 2**20
    started = time.monotonic()
    peak, raised = _peak(lambda: load_any(spec))
    assert isinstance(raised, UserError) and "over 1024 KiB" in str(raised)
    assert time.monotonic() - started < 2 and peak < 3 * 2**20


def _no_output_left(root: Path) -> None:
    assert not (root / "out.jsonl").exists() and not list(root.glob(".out.jsonl*"))


def test_predict_refuses_a_file_without_newlines_after_one_bounded_read(project):
    sparse = project / "one-gigabyte.txt"
    with open(sparse, "wb") as f:
        f.truncate(2**30)  # 1 GiB of zero bytes and no newline (sparse: no disk used)
    started = time.monotonic()
    peak, raised = _peak(lambda: queries.open_input(sparse, queries.MAX_QUERY_CHARS))
    assert isinstance(raised, UserError) and "one-gigabyte.txt:1: the query is over 1000 characters" in str(
        raised
    )
    assert peak < 16 * 2**20 and time.monotonic() - started < 5
    proc = run_cli(
        "predict", "--input", str(sparse), "--output", "out.jsonl", "--model", "models/tiny", cwd=project
    )
    assert proc.returncode == 2 and ":1: the query is over 1000 characters" in proc.stderr
    _no_output_left(project)
    sparse.unlink()


def test_a_long_line_is_named_by_its_number_and_no_partial_output_is_left(project):
    lines = ["turn on the hall lights", "play some jazz", "set a timer for 5 minutes", "x" * 5000, "weather"]
    (project / "q.txt").write_text("\n".join(lines) + "\n")
    for output in (["--output", "out.jsonl"], []):
        proc = run_cli("predict", "--input", "q.txt", *output, "--model", "models/tiny", cwd=project)
        assert proc.returncode == 2 and "q.txt:4: the query is over 1000 characters" in proc.stderr
        assert "--max-chars" in proc.stderr and proc.stdout == ""  # not even to stdout
        _no_output_left(project)
    done = run_cli(
        "predict",
        "--input",
        "q.txt",
        "--max-chars",
        "6000",
        "--model",
        "models/tiny",
        cwd=project,
        check=True,
    )
    assert [json.loads(x)["text"] for x in done.stdout.splitlines()] == lines


def test_the_bound_holds_for_jsonl_queries_and_the_command_line(project):
    (project / "q.jsonl").write_text(
        json.dumps({"text": "hello"}) + "\n" + json.dumps({"text": "é" * 1001}) + "\n"
    )
    proc = run_cli("predict", "--input", "q.jsonl", "--model", "models/tiny", cwd=project)
    assert proc.returncode == 2 and "q.jsonl:2: the query is over 1000 characters" in proc.stderr
    proc = run_cli("predict", "y" * 1001, "--model", "models/tiny", cwd=project)
    assert proc.returncode == 2 and "query 1 on the command line: the query is over 1000" in proc.stderr
    ok = run_cli("predict", "é" * 1000, "--model", "models/tiny", cwd=project, check=True)
    assert len(ok.stdout.splitlines()) == 1


def test_reading_queries_streams_in_bounded_memory(tmp_path):
    path = tmp_path / "many.txt"
    with open(path, "w") as f:
        for i in range(200_000):
            f.write(f"query number {i} about my card\n")
    peak, raised = _peak(lambda: queries.open_input(path, 1000))
    assert raised is None and peak < 4 * 2**20, (
        f"{peak / 2**20:.1f} MiB for a {path.stat().st_size >> 20} MiB file"
    )
    assert queries.open_input(path, 1000) == 200_000


def test_healthz_clears_a_reload_error_once_the_record_is_restored(project):
    from fastapi.testclient import TestClient

    from reprogate.folder.files import model_version
    from reprogate.serve.app import create_app

    record = project / "models" / "production.json"
    from reprogate.promote.promotion import artifacts

    version = model_version(project / "models" / "tiny")
    tiny = {"model_version": version, "artifacts": artifacts(project, "tiny")}
    good = json.dumps({"model": "tiny", **tiny})
    record.write_text(good)
    with TestClient(create_app(project, watch_interval=3600)) as client:
        holder = client.app.state.holder
        record.write_text(json.dumps({"model": "gone", "model_version": "gone@1"}))
        assert not holder.check()
        health = client.get("/healthz").json()
        assert health["reload_error"] and "models/gone" in health["reload_error"]
        assert str(project) not in health["reload_error"]  # no host path in what clients see
        record.write_text(good)  # restored: `git checkout HEAD -- models/production.json`
        assert not holder.check()
        assert client.get("/healthz").json()["reload_error"] is None
        version = client.get("/version").json()
        assert version["files"] == "models/tiny" and str(project) not in json.dumps(version)


def test_user_facing_errors_name_paths_relative_to_the_project(project):
    write_model_spec(project, "broken", dict(TINY_NGRAM, steps="many"))
    proc = run_cli("validate", "specs/", cwd=project)
    assert proc.returncode == 1 and "specs/models/broken.yaml" in proc.stderr
    assert str(project) not in proc.stderr
    (project / "specs" / "models" / "broken.yaml").unlink()


def test_deep_nesting_in_a_spec_or_a_record_is_one_paragraph(tmp_path):
    from reprogate.utils.errors import read_json

    spec = tmp_path / "deep.yaml"
    spec.write_text("a: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(UserError) as e:
        read_yaml(spec)
    assert "nests deeper" in str(e.value) and str(spec) in str(e.value)
    record = tmp_path / "gate.json"
    record.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(UserError) as e:
        read_json(record, "restore it")
    assert "nests deeper" in str(e.value) and "restore it" in str(e.value)


def test_a_callers_numpy_feature_list_does_not_stop_numpy_from_loading(tmp_path):
    # NPY_ENABLE_CPU_FEATURES beside the pin's NPY_DISABLE_CPU_FEATURES: numpy would refuse to
    # import; the pin owns numpy's dispatch and removes it.
    env = {**os.environ, "NPY_ENABLE_CPU_FEATURES": "AVX2"}
    code = "\n".join(
        [
            "import pathlib",
            "from reprogate.runtime import numerics",
            "numerics.pin(pathlib.Path('.'))",
            "import numpy",
        ]
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_deep_nesting_in_what_verify_and_report_read_is_one_paragraph(tmp_path):
    # A rebuilt JSON output, a dvc.lock, a revision's per-intent scores nested past Python's
    # depth: 'different', a refused lock, one paragraph; never a RecursionError.
    import yaml

    from reprogate.pipeline.verify import compare_file
    from reprogate.records.revision import Revision
    from reprogate.utils import dvc_cli

    deep = "[" * 100000 + "]" * 100000
    (tmp_path / "eval.json").write_text(deep)
    assert compare_file("eval.json", b"{}", tmp_path / "eval.json", 0.0).verdict == "different"
    with pytest.raises(yaml.YAMLError, match="nests deeper"):
        dvc_cli.lock_outputs("stages: " + "[" * 20000 + "]" * 20000)
    (tmp_path / "plots" / "m").mkdir(parents=True)
    (tmp_path / "plots" / "m" / "per_intent.json").write_text(deep)
    with pytest.raises(UserError, match=r"plots/m/per_intent.json at working tree is not the file"):
        Revision(tmp_path, None).per_intent("m")
