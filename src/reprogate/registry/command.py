"""`reprogate registry`: every run, metric and paired prediction in Delta Lake tables, by SQL.

sync      reads the records of the working tree (and of commits, with --rev or --all-commits)
          and MERGEs them by content key into the tables at params.yaml's `registry:`
sql       any SELECT over the tables (DuckDB), as a table, --json or --csv
compare   two runs' paired predictions: improved, regressed, unchanged, McNemar's p
history   a model's runs, oldest commit first, with their held-out numbers
leaderboard  runs ranked on one set and metric
check     rows, duplicate-key groups and version of every table
optimize  compact small files and vacuum old ones (OPTIMIZE / VACUUM)

Read in this order: registry_tables (rows, keys, schemas) -> registry_collect (records of one
revision as rows) -> registry_store (Delta tables, keyed MERGE) -> registry_query (DuckDB) ->
this file (the commands).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reprogate.utils import git, paths
from reprogate.utils.errors import UserError

NOTES = 10  # notes printed (runs left out, and why) unless --verbose
# Git-tracked files whose change means the working tree's records are not HEAD's.
RECORD_PATHS = ("dvc.lock", "results", "metrics", "plots", "params.yaml", "specs")


def _sources(root: Path, revs: list[str], all_commits: bool) -> list:
    """The revisions to read, oldest commit first, then the working tree."""
    from reprogate.records.revision import Revision

    if all_commits:
        revs = (
            git.run(root, "rev-list", "--all", "--abbrev-commit", "--topo-order", "--reverse").split()
            if git.head(root)
            else []
        )
    commits: dict[str, Revision] = {}
    for r in revs:
        rev = Revision(root, r, who="registry")
        commits.setdefault(rev.commit, rev)
    ordered = (
        sorted(commits.values(), key=lambda r: r.committed_at) if not all_commits else list(commits.values())
    )
    return [*ordered, Revision(root, None, who="registry")]


def _stamp(root: Path, rev) -> dict[str, Any]:
    """The commit a revision's records are at: its own, or for the working tree HEAD when none
    of the record files differ from it (None otherwise: records no commit holds yet)."""
    from reprogate.records.revision import Revision

    if rev.rev is None:
        head = git.head(root) if git.git_dir(root) is not None else None
        changed = head and git.run(
            root, "--no-optional-locks", "status", "--porcelain", "--", *RECORD_PATHS, check=False
        )
        rev = Revision(root, head, who=rev.who) if head and not changed else rev
    return {"commit": rev.commit, "committed_at": rev.committed_at}


def _older(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """Whether `new` names an older commit for the same row than `old` does."""
    if new["commit"] is None:
        return False
    return old["commit"] is None or new["committed_at"] < old["committed_at"]


def _same_run(old, new):
    """One bundle for a run found at several revisions: the oldest commit's stamp, and the rows
    of the one with the raw update log (only the working tree has it)."""
    if old is None:
        return new
    raw = [len(b.rows["metrics_raw"]) if "metrics_raw" in b.rows else -1 for b in (old, new)]
    keep = new if raw[1] > raw[0] else old
    keep.run = new.run if _older(new.run, old.run) else old.run
    return keep


def _promotions(root: Path) -> list[dict[str, Any]]:
    """Every promotion commit on any branch: its tag and the record it committed."""
    from reprogate.records.production import ProductionRecord, is_promotion

    if git.git_dir(root) is None or not git.head(root):
        return []
    log = git.run(root, "log", "--all", "--format=%H%x1f%cI%x1f%s", "--", str(paths.PRODUCTION))
    rows = []
    for line in filter(None, log.splitlines()):
        commit, when, subject = line.split("\x1f", 2)
        if not is_promotion(subject):
            continue
        shown = git.run(root, "show", f"{commit}:{paths.PRODUCTION}", check=False)
        try:
            record = ProductionRecord.model_validate_json(shown)
        except ValueError:
            record = ProductionRecord()  # a record no longer readable: the commit still counts
        tags = git.run(root, "tag", "--points-at", commit).split()
        rows.append(
            {"commit": commit, "committed_at": datetime.fromisoformat(when), "subject": subject,
             "tag": tags[0] if tags else None, "model": record.model, "model_version": record.model_version,
             "heldout_accuracy": record.heldout_accuracy, "code_commit": record.code_commit}
        )  # fmt: skip
    return rows


def _stage_runs(root: Path, notes: list[str]) -> list[dict[str, Any]]:
    """logs/<stage>.jsonl of the working tree: one row per run of a stage (its telemetry)."""
    from reprogate.records.runlog import read

    rows = []
    for log in sorted((root / paths.LOGS).glob("*.jsonl")):
        entries, bad = read(log)
        if bad:
            notes.append(f"{log.relative_to(root)}: lines {bad} are not run-log entries, left out")
        for e in entries:
            t = e.telemetry
            rows.append(
                {"stage": e.stage, "host": e.host, "finished_at": e.finished_at,
                 "model": e.stage.split("@", 1)[1] if "@" in e.stage else None,
                 "code_commit": e.code_commit, "code_dirty": e.code_dirty, "wall_s": t.get("wall_s"),
                 "peak_rss_gb": t.get("peak_rss_gb"), "examples_per_s": t.get("examples_per_s"),
                 "train_key": t.get("train_key"), "telemetry": json.dumps(t, sort_keys=True)}
            )  # fmt: skip
    return rows


def _new(store, table: str, rows: list[dict[str, Any]], dated: bool = False) -> list[dict[str, Any]]:
    """The rows whose key the table lacks (and, for `dated` tables, those naming an older commit)."""
    from reprogate.registry.tables import TABLES

    key = TABLES[table].key
    columns = list(key) + (["commit", "committed_at"] if dated else [])
    held = {tuple(r[k] for k in key): r for r in store.read(table, columns).to_pylist()}
    return [r for r in rows if (k := tuple(r[c] for c in key)) not in held or (dated and _older(r, held[k]))]


def _write(store, runs: dict, gate: list, promotions: list, stage_runs: list) -> dict[str, int]:
    """Child tables first, `runs` last: a run listed there has every row it owns."""
    import pyarrow as pa

    from reprogate.registry.tables import RUN_TABLES, TABLES

    for name in TABLES:
        store.ensure(name)
    run_rows = _new(store, "runs", [b.run for b in runs.values()], dated=True)
    inserted = {}
    for name in RUN_TABLES:
        # A held run brings only raw updates its log gained since (trained again, or resumed, to
        # the same result); the MERGE skips the seqs the table has.
        parts = [b.rows[name] for b in runs.values() if name in b.rows and b.rows[name].num_rows]
        inserted[name] = store.merge(name, pa.concat_tables(parts)) if parts else 0
    for name, rows, dated in (("gate_decisions", gate, True), ("promotions", promotions, False),
                              ("stage_runs", stage_runs, False)):  # fmt: skip
        todo = _new(store, name, rows, dated)
        table = pa.Table.from_pylist(todo, schema=TABLES[name].schema)
        inserted[name] = store.merge(name, table, ["commit", "committed_at"] if dated else None)
    table = pa.Table.from_pylist(run_rows, schema=TABLES["runs"].schema)
    inserted["runs"] = store.merge("runs", table, ["commit", "committed_at"])
    inserted["runs_redated"] = len(run_rows) - inserted["runs"]
    return inserted


def _held(store) -> dict[str, int]:
    """Run key -> raw metric rows, of every run the registry lists."""
    listed = store.read("runs", ["run_key"]).column("run_key").to_pylist()
    logged = Counter(store.read("metrics_raw", ["run_key"]).column("run_key").to_pylist())
    return {k: logged[k] for k in listed}


def _note(message: str) -> None:
    print(message, file=sys.stderr)


def sync(
    root: Path, revs: list[str], all_commits: bool = False, verbose: bool = False, log=_note, rebuild=False
) -> str:
    """`rebuild`: read every run's records whole, as if the registry held none (what `check
    --repair` does after setting a damaged table aside); the keyed MERGE adds only what is missing."""
    from tqdm import tqdm

    from reprogate.registry.collect import collect
    from reprogate.registry.query import damage_paragraph
    from reprogate.registry.store import Store
    from reprogate.specs.loader import load_params

    store = Store.at(root, load_params(root).registry)
    store.check_writable()
    if damaged := store.damaged(whole=False):
        raise UserError(damage_paragraph(store, damaged))
    sources = _sources(root, revs, all_commits)
    synced_at, seen, runs, gate = datetime.now(UTC), set(), {}, {}
    held = {} if rebuild else _held(store)
    problems, notes, same = [], [], 0
    for rev in tqdm(sources, desc="registry: read", unit="revision", disable=len(sources) < 3):
        got = collect(rev, {**_stamp(root, rev), "synced_at": synced_at}, seen, held)
        for b in got.runs:
            runs[b.run["run_key"]] = _same_run(runs.get(b.run["run_key"]), b)
        for row in got.gate:
            k = (row["gate_key"], row["candidate"], row["rule"])
            gate[k] = row if k not in gate or _older(row, gate[k]) else gate[k]
        problems += got.problems
        notes += got.notes
        same += got.same
    before = store.versions()
    n = _write(store, runs, list(gate.values()), _promotions(root), _stage_runs(root, notes))
    for note in notes if verbose else notes[:NOTES]:
        log(f"registry: note: {note}")
    if len(notes) > NOTES and not verbose:
        log(f"registry: note: ... and {len(notes) - NOTES} more like these (--verbose lists them all)")
    committed = sum(1 for k, v in store.versions().items() if v != before[k])
    where = f"{len(sources) - 1} commit(s) and the working tree" if len(sources) > 1 else "the working tree"
    added = ", ".join(f"{k} +{v}" for k, v in n.items() if v and k != "runs_redated")
    line = (
        f"registry: {len(runs)} run(s) read from {where} ({same} more the same as an earlier commit's); "
        f"{added or 'nothing new'}; {n['runs_redated']} run(s) dated to an older commit; "
        f"{committed} table version(s) committed at {store.uri}"
    )
    if problems:
        raise UserError(
            "\n\n".join([*problems, line + f"; {len(problems)} record(s) above were not imported."])
        )
    return line


def command(root: Path, args: argparse.Namespace) -> str:
    """What `reprogate registry ACTION ...` prints."""
    if args.action == "sync":
        return sync(root, args.rev, args.all_commits, args.verbose) + "\n"
    from reprogate.registry.query import Registry
    from reprogate.registry.store import Store
    from reprogate.specs.loader import load_params

    store = Store.at(root, load_params(root).registry)
    if args.action == "optimize":
        done = store.optimize()
        return "".join(f"registry: {t}: {v['files_removed']} files compacted into {v['files_added']}, "
                       f"{v['vacuumed']} old files removed\n" for t, v in done.items())  # fmt: skip
    if args.action == "check" and args.repair:
        return repair(root, store)
    reg = Registry(store)
    if args.action == "sql":
        result = reg.sql(args.query)
    elif args.action == "compare":
        result = reg.compare(args.run_a, args.run_b, items=args.items)
    elif args.action == "history":
        result = reg.history(args.model)
    elif args.action == "leaderboard":
        result = reg.leaderboard(args.set, args.metric, args.limit)
    else:
        result = reg.check()
    return result.render(args.format)


def repair(root: Path, store) -> str:
    """Set every table that cannot be read whole aside (under .damaged/, kept) and rebuild it
    from the records of every commit (git and the DVC cache)."""
    damaged = store.damaged(whole=True)
    if not damaged:
        return "registry: every table reads whole; nothing to repair\n"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    moved = [f"registry: {t} ({why}) set aside at {store.set_aside(t, stamp)}" for t, why in damaged.items()]
    said = sync(root, [], all_commits=True, rebuild=True)
    return "\n".join([*moved, said, f"registry: rebuilt {', '.join(damaged)} from the records"]) + "\n"


def add_parser(sub) -> argparse.ArgumentParser:
    rg = sub.add_parser("registry", help="runs, metrics and paired predictions in Delta Lake tables, by SQL")
    actions = rg.add_subparsers(dest="action", required=True)
    sy = actions.add_parser(
        "sync", help="MERGE the records of the working tree (and commits) into the tables"
    )
    sy.add_argument("--rev", nargs="+", default=[], metavar="REV", help="also these commits (branches, tags)")
    sy.add_argument("--all-commits", action="store_true", help="also every commit of every branch")
    sy.add_argument("--verbose", action="store_true", help=f"every note, not the first {NOTES}")
    q = actions.add_parser("sql", help='any query, e.g. "SELECT model, count(*) FROM runs GROUP BY model"')
    q.add_argument("query")
    c = actions.add_parser("compare", help="paired predictions of two runs: improved, regressed, McNemar's p")
    c.add_argument("run_a", help="a run key, or its first characters")
    c.add_argument("run_b")
    c.add_argument("--items", action="store_true", help="list the items that changed instead")
    h = actions.add_parser("history", help="a model's runs, oldest commit first")
    h.add_argument("model")
    lb = actions.add_parser("leaderboard", help="runs ranked on one evaluation set and metric")
    lb.add_argument("set", help="test, validation, oos_test, ...")
    lb.add_argument("metric", help="accuracy, macro_f1, ece_after, wrong_action_rate, ...")
    lb.add_argument("--limit", type=int, default=20)
    ck = actions.add_parser("check", help="rows, duplicate-key groups and version of every table")
    ck.add_argument(
        "--repair",
        action="store_true",
        help="set a table that cannot be read whole aside and rebuild it from the records of every commit",
    )
    actions.add_parser("optimize", help="compact small files, vacuum files older than a week")
    for p in (q, c, h, lb, actions.choices["check"]):
        p.add_argument("--format", choices=("table", "json", "csv"), default="table")
        p.add_argument(
            "--json", dest="format", action="store_const", const="json", help="same as --format json"
        )
        p.add_argument("--csv", dest="format", action="store_const", const="csv", help="same as --format csv")
    return rg
