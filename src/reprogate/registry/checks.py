"""What `reprogate registry sync` refuses in a record, before any row of its run is written: a
number that is not finite, a count past any evaluation, two prediction lines with one id, and
a line far past what reprogate writes; a record far past it is refused by
records/revision.record_size, which every reader of a revision shares (a damaged or hostile
file must not take the machine's memory: a 50 MB text field once took 4 GB). Each is one
paragraph naming the file and field; the run is left out whole and the other runs are imported.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from reprogate.utils.errors import UserError

FIX = (
    "it is not the record reprogate writes: rerun the stage that writes it (`dvc repro`), or "
    "restore it from git."
)
MAX_LINE_BYTES = 64 * 1024  # a prediction line is a few hundred bytes
MAX_COUNT = 2**53  # items in a set: exact in a float, far past any evaluation
# Where each table's numbers come from, to name the file a bad one is in.
SOURCES = {
    "evaluations": "results/{m}/eval.json",
    "metrics": "plots/{m}/train.tsv",
    "metrics_raw": "runs/{m}/updates/*.jsonl",
    "predictions": "predictions/{m}/<set>.jsonl",
}


def lines(data: bytes, where: str) -> None:
    for number, line in enumerate(data.split(b"\n"), start=1):
        if len(line) > MAX_LINE_BYTES:
            raise UserError(
                f"{where}:{number}: a line of {len(line):,} bytes, more than the {MAX_LINE_BYTES:,} a "
                f"prediction may take (a text field that long is not a query); {FIX}"
            )


def count(n: int, where: str) -> None:
    if not 0 <= n <= MAX_COUNT:
        raise UserError(
            f"registry: {where} is {n}, not a count of evaluated items (0 to {MAX_COUNT:,}); {FIX}"
        )


def unique_ids(ids: pa.ChunkedArray, where: str) -> None:
    """An item's id is its key: paired comparisons join on it."""
    if pc.count_distinct(ids).as_py() != len(ids):
        counts = pc.value_counts(ids)
        twice = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
        raise UserError(
            f"{where}: id {twice!r} is on more than one line; an item's id is its key (paired "
            f"comparisons join on it), so each line needs its own. {FIX}"
        )


def finite(run_name: str, model: str, run: dict[str, Any], rows: dict[str, pa.Table]) -> None:
    """NaN and infinity are not metrics: a NaN accuracy ranked first in a leaderboard."""
    for name, value in run.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(
                f"registry: run {run_name}: field '{name}' is {value} (from its records under "
                f"results/{model}/ and metrics/{model}/); a metric must be a finite number. {FIX}"
            )
    for table, t in rows.items():
        for column in t.column_names:
            values = t.column(column)
            if not pa.types.is_floating(values.type):
                continue
            bad = pc.invert(pc.fill_null(pc.is_finite(values), True))
            if pc.any(bad).as_py():
                i = pc.index(bad, True).as_py()
                keys = ("set", "metric", "step", "item_id")
                at = {k: v for k, v in t.slice(i, 1).to_pylist()[0].items() if k in keys}
                raise UserError(
                    f"registry: {SOURCES[table].format(m=model)} of run {run_name}: field '{column}' is "
                    f"{values[i].as_py()} at {at}; a metric must be a finite number. {FIX}"
                )
