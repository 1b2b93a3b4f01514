"""SQL over the registry: DuckDB reads each Delta table's Arrow dataset (the files of its current
version, listed by deltalake), so no DuckDB extension is downloaded; every table is a view of
the same name. The named queries (compare, history, leaderboard, check) are SQL here too.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import duckdb
import numpy as np

from reprogate.registry import lm as registry_lm
from reprogate.registry.store import Store, is_local
from reprogate.registry.tables import TABLES
from reprogate.utils.errors import UserError
from reprogate.utils.stats import mcnemar

# Lower is better for these; every other metric is ranked highest first.
LOWER_IS_BETTER = (
    "ece_before", "ece_after", "nll", "wrong_action_rate", "false_positive_action_rate",
    *registry_lm.SPLIT_METRICS,  # a language model's losses and perplexity
)  # fmt: skip
WIDEST = 60  # characters of a cell in the printed table


class Result:
    def __init__(self, columns: list[str], rows: list[tuple]):
        self.columns, self.rows = columns, rows

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]

    def render(self, fmt: str = "table") -> str:
        if fmt == "json":
            return json.dumps(self.records(), indent=2, default=str) + "\n"
        if fmt == "csv":
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow(self.columns)
            writer.writerows(self.rows)
            return buf.getvalue()
        cells = [self.columns] + [[_cell(v) for v in r] for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines) + f"\n({len(self.rows)} row{'s' * (len(self.rows) != 1)})\n"


def damage_paragraph(store: Store, damaged: dict[str, str]) -> str:
    which = "; ".join(f"{t} ({why})" for t, why in damaged.items())
    return (
        f"registry: table(s) at {store.uri} cannot be read whole: {which}. `reprogate registry check "
        "--repair` sets the damaged table aside (kept under .damaged/) and rebuilds it from the records "
        "(git and the DVC cache); nothing else is touched."
    )


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    text = str(v).replace("\n", " ")
    return text if len(text) <= WIDEST else text[: WIDEST - 1] + "…"  # --json and --csv keep it whole


class Registry:
    """DuckDB over the tables. Every table is a view made before any query runs; then DuckDB's
    access to files, extensions and other databases is switched off and locked, but for reading
    the tables' own files, so a query (`registry sql` takes any) can read the registry and
    nothing else: no `read_csv('/etc/...')`, no COPY ... TO, no ATTACH, no INSTALL."""

    def __init__(self, store: Store):
        self.store = store
        self.con = duckdb.connect()
        files = {name: self._files(name) for name in TABLES}
        # Only the files of the tables' current versions may be read; nothing may be written.
        self.con.execute("SET allowed_paths = ?", [[f for fs in files.values() for f in fs]])
        try:
            for name, t in TABLES.items():
                self._view(name, t.schema, files[name])
        except duckdb.Error as e:  # a file whose footer cannot be read: say which, and the fix
            damaged = store.damaged(whole=False) or {"?": str(e).splitlines()[0]}
            raise UserError(damage_paragraph(store, damaged)) from None
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")

    def _files(self, name: str) -> list[str]:
        table = self.store.table(name)  # a registry never synced reads as empty tables
        if table is None or not is_local(self.store.uri):
            return []
        return [f.removeprefix("file://") for f in table.file_uris()]

    def _view(self, name: str, schema: Any, files: list[str]) -> None:
        """A local table is DuckDB's own Parquet scan of the files its current Delta version lists
        (lazy, with filters pushed into the scan); a table in object storage is read into Arrow
        through deltalake (DuckDB's readers for s3:// and the like are extensions it would
        download). Not deltalake's lazy dataset: it writes strings as string_view, and pyarrow
        cannot filter those."""
        if files:
            listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            self.con.execute(
                f"CREATE VIEW {name} AS SELECT * FROM read_parquet([{listed}], union_by_name = true)"
            )
            return
        table = None if is_local(self.store.uri) else self.store.table(name)
        has_rows = table is not None and table.file_uris()
        self.con.register(name, table.to_pyarrow_dataset().to_table() if has_rows else schema.empty_table())

    def sql(self, query: str, params: list | None = None) -> Result:
        try:
            rel = self.con.execute(query, params or [])
        except duckdb.Error as e:
            if damaged := self.store.damaged(whole=False):  # footers only: a query's typo lands here too
                raise UserError(damage_paragraph(self.store, damaged)) from None
            tables = ", ".join(TABLES)
            raise UserError(f"registry sql: {str(e).splitlines()[0]} (the tables are {tables}).") from None
        if rel.description is None:
            return Result([], [])
        return Result([d[0] for d in rel.description], rel.fetchall())

    def run_key(self, prefix: str) -> str:
        """A run by the start of its key (as `git` takes a short commit), or one paragraph."""
        found = [r[0] for r in self.con.execute(
            "SELECT run_key FROM runs WHERE starts_with(run_key, ?) ORDER BY run_key", [prefix]
        ).fetchall()]  # fmt: skip
        if len(found) == 1:
            return found[0]
        if not found:
            raise UserError(
                f"registry: no run's key starts with '{prefix}'; list them with "
                '`reprogate registry sql "SELECT run_key, model, commit FROM runs"` (sync first).'
            )
        shown = ", ".join(k[:12] for k in found)
        raise UserError(f"registry: '{prefix}' starts {len(found)} run keys ({shown}); give more of it.")

    def compare(self, a: str, b: str, items: bool = False) -> Result:
        """Paired predictions of two runs on the items both predicted: per set, how many B got
        right that A got wrong (improved), the reverse (regressed), the rest (unchanged), and
        McNemar's exact p for improved against regressed. With `items`, the changed items."""
        ka, kb = self.run_key(a), self.run_key(b)
        pairs = """
            SELECT a."set", a.item_id, a.text, a.gold, a.predicted AS a_predicted, b.predicted AS b_predicted,
                   a.correct AS a_right, b.correct AS b_right
            FROM predictions a JOIN predictions b ON a."set" = b."set" AND a.item_id = b.item_id
            WHERE a.run_key = ? AND b.run_key = ? AND a.correct IS NOT NULL AND b.correct IS NOT NULL"""
        if items:
            return self.sql(
                "SELECT CASE WHEN b_right THEN 'improved' ELSE 'regressed' END AS change, "
                "* EXCLUDE (a_right, b_right) "
                f'FROM ({pairs}) WHERE a_right <> b_right ORDER BY change, "set", item_id',
                [ka, kb],
            )
        per_set = self.con.execute(
            f'SELECT "set", list(a_right), list(b_right) FROM ({pairs}) GROUP BY "set" ORDER BY "set"',
            [ka, kb],
        ).fetchall()
        rows = []
        for name, ra, rb in per_set:
            t = mcnemar(np.array(ra, dtype=bool), np.array(rb, dtype=bool))
            unchanged = t["both_right"] + t["both_wrong"]
            rows.append((name, t["items"], t["fixed"], t["broken"], unchanged, t["p_value"]))
        if not rows:
            raise UserError(
                f"registry compare: runs {ka[:12]} and {kb[:12]} share no labelled item (their "
                "prediction sets differ, or neither has labelled predictions)."
            )
        return Result(["set", "items", "improved", "regressed", "unchanged", "mcnemar_p"], rows)

    def history(self, model: str) -> Result:
        return self.sql(
            """
            SELECT left(r.run_key, 12) AS run, left(r.commit, 7) AS commit, r.committed_at,
                   r.model_version, r.steps, r.heldout_accuracy,
                   max(CASE WHEN e.metric = 'macro_f1' THEN e.value END) AS macro_f1,
                   max(CASE WHEN e.metric = 'ece_after' THEN e.value END) AS ece,
                   max(CASE WHEN e.metric = 'wrong_action_rate' THEN e.value END) AS wrong_action_rate,
                   max(CASE WHEN e.metric = 'bits_per_char' THEN e.value END) AS bits_per_char,
                   bool_or(p.commit IS NOT NULL) AS promoted
            FROM runs r
            LEFT JOIN evaluations e ON e.run_key = r.run_key AND e."set" = r.heldout_set
            LEFT JOIN promotions p ON p.model_version = r.model_version
            WHERE r.model = ?
            GROUP BY ALL ORDER BY r.committed_at NULLS LAST, run""",
            [model],
        )

    def leaderboard(self, set_name: str, metric: str, limit: int = 20) -> Result:
        order = "ASC" if metric in LOWER_IS_BETTER else "DESC"
        return self.sql(
            f"""
            SELECT left(r.run_key, 12) AS run, r.model, r.model_version, e.value, e.ci_low, e.ci_high,
                   e.n, left(r.commit, 7) AS commit
            FROM evaluations e JOIN runs r USING (run_key)
            WHERE e."set" = ? AND e.metric = ?
            ORDER BY e.value {order}, run LIMIT {int(limit)}""",
            [set_name, metric],
        )

    def check(self) -> Result:
        """Rows, duplicate-key groups (the query is in the `duplicates` column's SQL here) and
        current version of every table: what shows a re-import doubled nothing."""
        rows = []
        for name, t in TABLES.items():
            key = ", ".join(f'"{k}"' for k in t.key)
            n = self.sql(f"SELECT count(*) FROM {name}").rows[0][0]
            dups = self.sql(
                f"SELECT count(*) FROM (SELECT {key} FROM {name} GROUP BY {key} HAVING count(*) > 1)"
            ).rows[0][0]
            table = self.store.table(name)
            rows.append((name, ", ".join(t.key), n, dups, table.version() if table else None))
        return Result(["table", "key", "rows", "duplicate_key_groups", "version"], rows)
