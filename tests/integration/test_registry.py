"""`reprogate registry`: a real pipeline's records in Delta Lake tables, imported idempotently.

The project is conftest's home pipeline (tiny, tiny2, the duo ensemble; committed), promoted
once. Every count is checked against the files the stages wrote, read here independently; the
tables are read back with a second reader that knows only the Delta protocol (the JSON commit
log and the Parquet files it names), as Spark would.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import duckdb
import numpy as np
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest

from reprogate.registry.tables import TABLES
from reprogate.utils.stats import binomial_half_p, mcnemar
from tests.conftest import BIN, copy_home, git_cmd, run_cli

MODELS = ("tiny", "tiny2", "duo")


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _check(root: Path) -> dict[str, dict]:
    said = run_cli("registry", "check", "--json", cwd=root, check=True)
    return {r["table"]: r for r in json.loads(said.stdout)}


def _sql(root: Path, query: str) -> list[dict]:
    return json.loads(run_cli("registry", "sql", query, "--json", cwd=root, check=True).stdout)


def _protocol_rows(table: Path) -> list[dict]:
    """The table as the Delta protocol defines it, read without deltalake: replay the commit log
    (add minus remove), then read the Parquet files it leaves with DuckDB."""
    live: set[str] = set()
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live.add(action["add"]["path"])
            if "remove" in action:
                live.discard(action["remove"]["path"])
    if not live:
        return []
    files = [str(table / p) for p in sorted(live)]
    rel = duckdb.sql(f"SELECT * FROM read_parquet({files!r})")
    return [dict(zip(rel.columns, r, strict=True)) for r in rel.fetchall()]


@pytest.fixture(scope="module")
def synced(home_pipeline, tmp_path_factory) -> Path:
    root = copy_home(home_pipeline, tmp_path_factory.mktemp("registry") / "home")
    run_cli("promote", cwd=root, check=True)
    said = run_cli("registry", "sync", cwd=root, check=True)
    assert "runs +3" in said.stdout and "table version(s) committed" in said.stdout
    return root


def test_every_table_holds_what_the_records_say(synced):
    root, check = synced, _check(synced)
    predictions = sum(len(_lines(f)) for m in MODELS for f in (root / "predictions" / m).glob("*.jsonl"))
    assert check["predictions"]["rows"] == predictions
    assert check["runs"]["rows"] == 3
    steps = sum(len((root / f"plots/{m}/train.tsv").read_text().splitlines()) - 1 for m in ("tiny", "tiny2"))
    assert check["metrics"]["rows"] == 2 * steps  # loss and lr per step
    assert check["metrics_raw"]["rows"] >= check["metrics"]["rows"]
    gate = json.loads((root / "results/gate.json").read_text())
    assert check["gate_decisions"]["rows"] == sum(
        max(1, len(c["rules"])) for c in gate["candidates"].values()
    )
    assert check["promotions"]["rows"] == 1
    (promotion,) = _sql(root, "SELECT * FROM promotions")
    production = json.loads((root / "models/production.json").read_text())
    assert promotion["model_version"] == production["model_version"]
    assert promotion["commit"] == git_cmd(root, "rev-parse", "HEAD").strip()
    assert promotion["tag"] == git_cmd(root, "tag", "--points-at", "HEAD").split()[0]
    for m in MODELS:
        evaluation = json.loads((root / f"results/{m}/eval.json").read_text())
        (run,) = _sql(root, f"SELECT * FROM runs WHERE model = '{m}'")
        assert run["model_version"] == evaluation["model_version"]
        test = evaluation["sets"]["test"]
        rows = _sql(
            root, f"SELECT * FROM evaluations WHERE run_key = '{run['run_key']}' AND \"set\" = 'test'"
        )
        by_metric = {r["metric"]: r for r in rows}
        assert by_metric["accuracy"]["value"] == test["accuracy"]
        assert [by_metric["accuracy"]["ci_low"], by_metric["accuracy"]["ci_high"]] == test["accuracy_ci95"]
    stage_runs = sum(len(f.read_text().splitlines()) for f in (root / "logs").glob("*.jsonl"))
    assert check["stage_runs"]["rows"] == stage_runs
    assert all(r["duplicate_key_groups"] == 0 for r in check.values())


def test_spark_reads_the_tables_protocol_1_2_utc_and_a_second_reader_agrees(synced):
    for name, t in TABLES.items():
        table = DeltaTable(str(synced / "registry" / name))
        protocol = table.protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), name
        assert not protocol.reader_features and not protocol.writer_features
        # Delta's `timestamp` is UTC; `timestamp_ntz` would be a table feature Spark opts into.
        delta_types = {f["name"]: f["type"] for f in json.loads(table.schema().to_json())["fields"]}
        for f in t.schema:
            if str(f.type).startswith("timestamp"):
                assert delta_types[f.name] == "timestamp", (name, f.name)
        ours = table.to_pyarrow_table().to_pylist()
        theirs = _protocol_rows(synced / "registry" / name)
        assert len(theirs) == len(ours), name
        keys = [sorted(tuple(str(r[k]) for k in t.key) for r in rows) for rows in (theirs, ours)]
        assert keys[0] == keys[1], name


def test_a_second_sync_commits_nothing(synced):
    before = _check(synced)
    said = run_cli("registry", "sync", cwd=synced, check=True)
    assert "nothing new" in said.stdout and "0 table version(s) committed" in said.stdout
    assert _check(synced) == before


def test_a_commits_records_date_the_runs_and_add_none(synced):
    head = git_cmd(synced, "rev-parse", "HEAD~1").strip()  # the pipeline's commit, before promoting
    said = run_cli("registry", "sync", "--rev", "HEAD~1", cwd=synced, check=True)
    assert "3 run(s) dated to an older commit" in said.stdout, said.stdout
    runs = _sql(synced, 'SELECT model, "commit" FROM runs')
    assert {r["commit"] for r in runs} == {head} and len(runs) == 3
    assert "0 run(s) dated" in run_cli("registry", "sync", "--rev", "HEAD~1", cwd=synced, check=True).stdout


def test_compare_pairs_the_same_items_as_the_prediction_files(synced):
    keys = {r["model"]: r["run_key"] for r in _sql(synced, "SELECT model, run_key FROM runs")}
    said = run_cli(
        "registry", "compare", keys["tiny"][:10], keys["tiny2"][:10], "--json", cwd=synced, check=True
    )
    rows = {r["set"]: r for r in json.loads(said.stdout)}
    for name in ("test", "validation"):
        a = {r["id"]: r["gold"] == r["predicted"] for r in _lines(synced / f"predictions/tiny/{name}.jsonl")}
        b = {r["id"]: r["gold"] == r["predicted"] for r in _lines(synced / f"predictions/tiny2/{name}.jsonl")}
        ids = sorted(a)
        expected = mcnemar(np.array([a[i] for i in ids]), np.array([b[i] for i in ids]))
        got = rows[name]
        assert (got["items"], got["improved"], got["regressed"]) == (
            len(ids),
            expected["fixed"],
            expected["broken"],
        )
        assert got["unchanged"] == expected["both_right"] + expected["both_wrong"]
        assert got["mcnemar_p"] == pytest.approx(expected["p_value"], abs=1e-6)
    items = run_cli(
        "registry", "compare", keys["tiny"], keys["tiny2"], "--items", "--csv", cwd=synced, check=True
    )
    changed = items.stdout.splitlines()[1:]
    assert len(changed) == sum(r["improved"] + r["regressed"] for r in rows.values())
    assert run_cli("registry", "compare", "zzzz", keys["tiny2"], cwd=synced).returncode == 2


def test_history_and_leaderboard(synced):
    history = json.loads(run_cli("registry", "history", "tiny", "--json", cwd=synced, check=True).stdout)
    assert len(history) == 1 and history[0]["steps"] == 60
    board = json.loads(
        run_cli("registry", "leaderboard", "test", "accuracy", "--json", cwd=synced, check=True).stdout
    )
    values = [r["value"] for r in board]
    assert len(board) == 3 and values == sorted(values, reverse=True)
    table = run_cli("registry", "leaderboard", "test", "ece_after", cwd=synced, check=True).stdout
    assert table.splitlines()[-1] == "(3 rows)"


def test_a_resumed_run_keeps_its_repeated_updates_raw_and_one_value_per_step(synced, tmp_path):
    root = copy_home(synced, tmp_path / "home")
    (run,) = _sql(root, "SELECT run_key FROM runs WHERE model = 'tiny'")
    shutil.rmtree(root / "runs/tiny/checkpoints")  # train again from nothing, killed at step 30
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "REPROGATE_PAUSE_AT": "step:30"}
    proc = subprocess.Popen([str(BIN / "reprogate"), "stage", "train", "tiny"], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert any("REPROGATE-PAUSED step:30" in line for line in proc.stdout)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    run_cli("stage", "train", "tiny", cwd=root, check=True)  # resumes from the step-20 checkpoint
    said = run_cli("registry", "sync", cwd=root, check=True)
    assert "metrics_raw +140" in said.stdout, said.stdout  # 30 + 40 updates, loss and lr each
    counts = _sql(root, f"""SELECT step, count(*) AS n FROM metrics_raw WHERE run_key = '{run["run_key"]}'
                          AND name = 'loss' GROUP BY step ORDER BY step""")  # fmt: skip
    assert [c["n"] for c in counts] == [2] * 20 + [3] * 10 + [2] * 30
    canonical = _sql(
        root, f"SELECT step, value FROM metrics WHERE run_key = '{run['run_key']}' AND name = 'loss'"
    )
    assert len(canonical) == 60  # the same run (bitwise the same model): one value per step
    last = _sql(root, f"""SELECT step, value FROM metrics_raw WHERE run_key = '{run["run_key"]}'
                        AND name = 'loss'
                        QUALIFY row_number() OVER (PARTITION BY step ORDER BY seq DESC) = 1""")  # fmt: skip
    kept = dict(sorted((r["step"], r["value"]) for r in canonical))  # train.tsv: 6 decimals
    assert {r["step"]: pytest.approx(kept[r["step"]], abs=1e-6) for r in last} == {
        r["step"]: r["value"] for r in last
    }


def test_two_syncs_at_once_lose_and_double_nothing(synced, tmp_path):
    # Against one sync of the same copy (a copy has one commit: the history the fixture synced,
    # its promotion commit's gate record among it, is not in it).
    root, alone = copy_home(synced, tmp_path / "home"), copy_home(synced, tmp_path / "alone")
    for r in (root, alone):
        shutil.rmtree(r / "registry")
    run_cli("registry", "sync", cwd=alone, check=True)
    procs = [
        subprocess.Popen(
            [str(BIN / "reprogate"), "registry", "sync"],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, out + err
    got, want = _check(root), _check(alone)
    assert {t: r["rows"] for t, r in got.items()} == {t: r["rows"] for t, r in want.items()}
    assert all(r["duplicate_key_groups"] == 0 for r in got.values())


def test_a_damaged_record_is_named_and_nothing_of_its_run_is_written(synced, tmp_path):
    root = copy_home(synced, tmp_path / "home")
    shutil.rmtree(root / "registry")
    path = root / "results/tiny2/eval.json"
    record = json.loads(path.read_text())
    record["sets"]["test"]["accuracy"] = "high"
    path.write_text(json.dumps(record))
    said = run_cli("registry", "sync", cwd=root)
    assert said.returncode == 2 and "Traceback" not in said.stderr
    assert "results/tiny2/eval.json" in said.stderr and "sets.test" in said.stderr
    assert "Nothing of run tiny2" in said.stderr
    assert {r["model"] for r in _sql(root, "SELECT model FROM runs")} == {"tiny", "duo"}
    versions = _sql(
        root, "SELECT count(*) AS n FROM predictions p JOIN runs r USING (run_key) WHERE model = 'tiny2'"
    )
    assert versions == [{"n": 0}]


def test_an_unwritable_registry_is_one_paragraph_and_no_table(synced, tmp_path):
    root = copy_home(synced, tmp_path / "home")
    params = root / "params.yaml"
    params.write_text(params.read_text().replace("registry: registry", "registry: README.md/registry"))
    said = run_cli("registry", "sync", cwd=root)
    assert said.returncode == 2 and "Traceback" not in said.stderr
    assert "cannot write to" in said.stderr and "registry:" in said.stderr
    assert len(said.stderr.strip().splitlines()) == 1
    assert run_cli("registry", "sql", "SELECT * FROM runs", cwd=root).returncode == 0


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_the_exact_mcnemar_p_is_scipys_binomial_test(kn):
    k, n = kn
    expected = binomtest(k, n, 0.5).pvalue if n else 1.0
    if expected < 1e-250:  # scipy's floats give out there (it says 0.0); integers do not
        assert 0 <= binomial_half_p(k, n) < 1e-250
    else:
        assert binomial_half_p(k, n) == pytest.approx(expected, rel=1e-9)


def _damage(root: Path, how: str) -> str:
    """Damage one record of run tiny2 in the working tree; the field the refusal must name."""
    if how in ("nan", "huge_n"):
        path = root / "results/tiny2/eval.json"
        record = json.loads(path.read_text())
        field = "accuracy" if how == "nan" else "n"
        record["sets"]["test"][field] = float("nan") if how == "nan" else 10**30
        path.write_text(json.dumps(record))  # Python writes NaN, as a careless writer would
        return "is nan" if how == "nan" else "'sets.test.n' is 1000000000000000000000000000000"
    if how == "huge_record":  # valid in shape, past any record reprogate writes
        path = root / "results/tiny2/eval.json"
        record = json.loads(path.read_text())
        record["model_version"] = "x" * (17 << 20)
        path.write_text(json.dumps(record))
        return "results/tiny2/eval.json at working tree holds 17,8"
    path = root / "predictions/tiny2/test.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    if how == "not_utf8":
        path.write_bytes(lines[0] + lines[1].replace(b'"text": "', b'"text": "\xff', 1) + b"".join(lines[2:]))
        return "is not UTF-8"
    if how == "duplicate_id":
        path.write_bytes(b"".join(lines) + lines[0])
        return "is on more than one line"
    row = json.loads(lines[0])
    row["text"] = "x" * (50 << 20)  # 50 MB in one field
    path.write_bytes(json.dumps(row).encode() + b"\n" + b"".join(lines[1:]))
    return "a line of 52,4"


@pytest.mark.parametrize("how", ["nan", "huge_n", "not_utf8", "duplicate_id", "huge_string", "huge_record"])
def test_a_hostile_record_is_one_paragraph_and_only_its_run_is_left_out(synced, tmp_path, how):
    root = copy_home(synced, tmp_path / "home")
    shutil.rmtree(root / "registry")
    said_field = _damage(root, how)
    proc = subprocess.run(
        [str(BIN / "reprogate"), "registry", "sync"], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert said_field in proc.stderr and "Nothing of run tiny2" in proc.stderr, proc.stderr[-2000:]
    assert {r["model"] for r in _sql(root, "SELECT model FROM runs")} == {"tiny", "duo"}
    assert _sql(
        root, "SELECT count(*) AS n FROM evaluations e JOIN runs r USING (run_key) WHERE model = 'tiny2'"
    ) == [{"n": 0}]
    assert all(r["duplicate_key_groups"] == 0 for r in _check(root).values())
    board = _sql(root, "SELECT value FROM evaluations WHERE metric = 'accuracy' AND NOT isfinite(value)")
    assert board == []


def test_a_truncated_table_file_is_named_and_check_repair_rebuilds_it_from_the_records(synced, tmp_path):
    root = copy_home(synced, tmp_path / "home")
    before = _sql(root, 'SELECT run_key, "set", item_id, predicted FROM predictions ORDER BY ALL')
    [data] = sorted((root / "registry" / "predictions").glob("*.parquet"))[:1]
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # a disk that filled mid-write
    for args in (("sql", "SELECT count(*) FROM predictions"), ("sync",), ("check",)):
        proc = run_cli("registry", *args, cwd=root)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert "predictions (" in proc.stderr and "reprogate registry check --repair" in proc.stderr
    said = run_cli("registry", "check", "--repair", cwd=root, check=True).stdout
    assert "registry: predictions (" in said and "set aside at" in said and "rebuilt predictions" in said
    kept = list((root / "registry" / ".damaged").iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("predictions-")  # the damaged table is kept
    assert _sql(root, 'SELECT run_key, "set", item_id, predicted FROM predictions ORDER BY ALL') == before
    assert "nothing to repair" in run_cli("registry", "check", "--repair", cwd=root, check=True).stdout


@pytest.mark.parametrize(
    "query",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "COPY (SELECT 1 AS x) TO '{out}'",
        "ATTACH '{out}' AS other",
        "SET enable_external_access = true",
        "INSTALL httpfs",
    ],
)
def test_registry_sql_reads_the_tables_and_nothing_else(synced, tmp_path, query):
    out = tmp_path / "written.csv"
    proc = run_cli("registry", "sql", query.format(out=out), cwd=synced)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "registry sql:" in proc.stderr and not out.exists()
    assert _sql(synced, "SELECT count(*) AS n FROM runs") == [{"n": 3}]  # the tables still read
