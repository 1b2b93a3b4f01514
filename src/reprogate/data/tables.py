"""Raw tables -> (id, text, source label) rows, read through `datasets`.

A file that cannot be read as its declared format is a user mistake: the error names the file,
the line where one is known, and the fix, never a traceback.
"""

from __future__ import annotations

import csv
import json
import logging
import tempfile
from pathlib import Path

from reprogate.specs.data import Table
from reprogate.utils import jsonl
from reprogate.utils.errors import UserError


def read_table(t: Table, path: Path) -> list[tuple[str, str, str | None]]:
    """(id, text, source label) for every row; a file that cannot be read as its declared
    format is a user mistake, explained, never a traceback."""
    try:
        rows = _parse_table(t, path)
    except UserError:
        raise
    except Exception as e:  # csv, json, pyarrow and datasets each raise their own kinds
        while e.__cause__ is not None or e.__context__ is not None:  # the parser's own words
            e = e.__cause__ or e.__context__
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise UserError(
            f"{path}: could not be read as format '{t.format}' ({type(e).__name__}: {first}). Check "
            "that the file is UTF-8 text in that format, or set the table's format in the data spec."
        ) from None
    if not rows:
        raise UserError(
            f"{path}: has no rows for this table (format '{t.format}'"
            + (f", keys {t.keys}" if t.format == "clinc_json" else "")
            + "); point the table at a file with data, or remove it from the data spec."
        )
    return rows


def _parse_table(t: Table, path: Path) -> list[tuple[str, str, str | None]]:
    """(id, text, source label) for every row, read through `datasets`."""
    import datasets

    datasets.disable_progress_bars()
    # Quiet: a parse failure is reported once, by read_table, with the file and the fix.
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    logging.getLogger("datasets").setLevel(logging.CRITICAL)
    if t.format == "clinc_json":
        raw = json.loads(path.read_text(encoding="utf-8"))
        missing = [k for k in t.keys if not isinstance(raw, dict) or k not in raw]
        if missing:
            have = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
            raise UserError(f"{path}: has no key {missing[0]!r} (has: {have}); fix the table's keys.")
        items = [(f"{t.file}:{k}:{i}", x[0], x[1]) for k in t.keys for i, x in enumerate(raw[k])]
        ds = datasets.Dataset.from_dict(
            {
                "id": [i for i, _, _ in items],
                "text": [x for _, x, _ in items],
                "label": [y for _, _, y in items],
            }
        )
        return list(zip(ds["id"], ds["text"], ds["label"], strict=True))
    if path.stat().st_size == 0:
        return []
    with tempfile.TemporaryDirectory() as cache:
        if t.format == "csv":
            # utf-8-sig: spreadsheets save "CSV UTF-8" with a BOM, which pandas drops too.
            with open(path, newline="", encoding="utf-8-sig") as f:
                reader = csv.reader(f)
                header = next(reader, [])
                if next(reader, None) is None:
                    return []  # a header and nothing else
            features = datasets.Features({c: datasets.Value("string") for c in header})
            ds = datasets.load_dataset(
                "csv",
                data_files=str(path),
                split="train",
                cache_dir=cache,
                features=features,
                keep_default_na=False,
                na_filter=False,
            )
        else:
            ds = datasets.Dataset.from_dict(_jsonl_columns(t, path))
        for col in (t.text_field, t.label_field):
            if col not in ds.column_names:
                raise UserError(
                    f"{path}: has no column '{col}' (columns: {ds.column_names}); set the "
                    "table's text_field / label_field in the data spec to the right names."
                )
        texts, labels = ds[t.text_field], ds[t.label_field]
    return [
        (f"{t.file}:{i}", x or "", None if y is None else str(y))
        for i, (x, y) in enumerate(zip(texts, labels, strict=True))
    ]


def _jsonl_columns(t: Table, path: Path) -> dict[str, list]:
    """The text and label columns of a JSON Lines file, parsed line by line with Python's json
    so a mistake names its line (pyarrow's reader names a byte offset); lines as jsonl.read_lines
    splits them (on \\n only: JSON allows U+2028 inside a line)."""
    rows = []
    for n, line in enumerate(jsonl.read_lines(path), 1):
        where = f"{path}:{n}"
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(
                f"{where}: not valid JSON ({e.msg}, column {e.colno}); each line of a jsonl file holds "
                "one JSON object."
            ) from None
        if not isinstance(row, dict):
            raise UserError(
                f"{where}: is a JSON {type(row).__name__}, not an object; each line holds one object "
                f"with the keys '{t.text_field}' and '{t.label_field}'."
            )
        for key, kinds in ((t.text_field, (str,)), (t.label_field, (str, int))):
            value = row.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise UserError(
                    f"{where}: '{key}' is {json.dumps(value)[:80]}, not a string; write it as one."
                )
            try:
                str(value).encode("utf-8")
            except UnicodeEncodeError:
                raise UserError(
                    f"{where}: '{key}' holds an unpaired surrogate (a broken \\ud8xx-\\udfxx escape), "
                    "which no UTF-8 text can hold; fix or remove the escape."
                ) from None
        rows.append(row)
    keys = sorted({k for r in rows for k in r})
    for col in (t.text_field, t.label_field):
        if rows and col not in keys:
            raise UserError(
                f"{path}: no line has the key '{col}' (keys: {keys}); set the table's text_field / "
                "label_field in the data spec to the right names."
            )
    label = lambda r: None if r.get(t.label_field) is None else str(r[t.label_field])  # noqa: E731
    return {t.text_field: [r.get(t.text_field) for r in rows], t.label_field: [label(r) for r in rows]}
