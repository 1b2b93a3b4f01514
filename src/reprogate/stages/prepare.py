"""Stage `prepare`: pinned raw files -> audited, split, canonical JSONL under data/prepared/.

Order matters: verify every sha256 before parsing anything, fail on any label outside the
vocabulary before writing anything, and count every row that is dropped, by reason.
Outputs are byte-identical for the same spec and raw files.
"""

from __future__ import annotations

import csv
import difflib
import json
import logging
import tempfile
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reprogate import jsonl, paths
from reprogate.atomic import replace_dir
from reprogate.errors import UserError
from reprogate.fetch import fetch_origin
from reprogate.hashing import sha256_file
from reprogate.headline import DataMetrics
from reprogate.pipeline import Context, Result
from reprogate.records import DataRecord, write
from reprogate.specs import DataSpec, Normalization, Pipeline, Table, find_root, load_pipeline, load_spec
from reprogate.text import canonical

PER_MODEL = None


def dvc(p: Pipeline) -> dict[str, Any]:
    return {
        "deps": [],
        "params": [{p.data: None}],
        "outs": ["data/prepared", {"results/data.json": {"cache": False}}],
        "metrics": [{"metrics/data.json": {"cache": False}}],
    }


@dataclass
class Row:
    id: str
    text: str
    label: str | None  # None: out of scope (no intent)
    source_label: str | None = None


@dataclass
class Split:
    rows: list[Row]
    dropped: Counter = field(default_factory=Counter)


def normalize(text: str, n: Normalization) -> str:
    """Key used only for duplicate audits."""
    if n.unicode_form != "none":
        text = unicodedata.normalize(n.unicode_form, text)
    if n.lowercase:
        text = text.casefold()
    if n.strip_punctuation:
        text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text)
    if n.collapse_whitespace:
        text = " ".join(text.split())
    return text


def _read_table(t: Table, path: Path) -> list[tuple[str, str, str | None]]:
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
    # Quiet: a parse failure is reported once, by _read_table, with the file and the fix.
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


def _load(
    spec_path: Path,
    t: Table,
    where: str,
    path: Path,
    vocab: set[str] | None,
    labels: list[str],
) -> Split:
    """Canonicalise one table; `vocab` set means labels must be in it (else error)."""
    split = Split(rows=[])
    bad: list[tuple[str, str]] = []
    for rid, text, label in _read_table(t, path):
        if label in t.exclude_labels:
            split.dropped["excluded_label"] += 1
            continue
        text = canonical(text)
        if not text:
            split.dropped["empty_text"] += 1
            continue
        if vocab is not None and label not in vocab:
            bad.append((rid, label))
            continue
        split.rows.append(Row(rid, text, label if vocab is not None else None, label))
    if bad:
        counts = Counter(lbl for _, lbl in bad)
        worst = ", ".join(f"'{lbl}' ({n} rows{_closest(lbl, labels)})" for lbl, n in counts.most_common(5))
        raise UserError(
            f"{spec_path}: {where} ({path}) has {len(bad)} row(s) whose label is not in the "
            f"spec's 'labels' vocabulary: {worst}; first at row {bad[0][0]}. Nothing was "
            "written and no row was skipped: add the label to 'labels' (the head grows with "
            "it) or fix the data file and its sha256."
        )
    return split


def _closest(label: str | None, labels: list[str]) -> str:
    close = difflib.get_close_matches(str(label), labels, n=1)
    return f", did you mean '{close[0]}'?" if close else ""


def _dedupe(split: Split, key, forbidden: set[str], reason_forbidden: str) -> None:
    kept: list[Row] = []
    first_label: dict[str, str | None] = {}
    for r in split.rows:
        k = key(r.text)
        if k in forbidden:
            split.dropped[reason_forbidden] += 1
        elif k in first_label:
            same = first_label[k] == r.label
            split.dropped["duplicate" if same else "duplicate_with_other_label"] += 1
        else:
            first_label[k] = r.label
            kept.append(r)
    split.rows = kept


def _carve(rows: list[Row], spec: DataSpec) -> tuple[list[Row], list[Row], list[Row]]:
    """Seeded, label-stratified validation and calibration partitions out of train."""
    rng = np.random.default_rng(spec.split.seed)
    groups: dict[str | None, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.label if spec.split.stratify else None, []).append(i)
    order = spec.labels if spec.split.stratify else [None]
    val, cal = set(), set()
    for label in order:
        idx = groups.get(label, [])
        perm = rng.permutation(len(idx))
        n_val = round(spec.split.validation * len(idx))
        n_cal = round(spec.split.calibration * len(idx))
        val.update(idx[j] for j in perm[:n_val])
        cal.update(idx[j] for j in perm[n_val : n_val + n_cal])
    train = [r for i, r in enumerate(rows) if i not in val and i not in cal]
    return train, [rows[i] for i in sorted(val)], [rows[i] for i in sorted(cal)]


def _write_jsonl(path: Path, rows: list[Row]) -> str:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            obj = {"id": r.id, "text": r.text, "label": r.label}
            if r.label is None:
                obj["source_label"] = r.source_label
            f.write(jsonl.line(obj, sort_keys=True))
    return sha256_file(path)


def prepare(
    spec_path: Path, root: Path | None = None, out_dir: Path | None = None, into: Path | None = None
) -> dict:
    """Prepared splits into `out_dir` (data/prepared/), the data record and its headline under
    `into` (the project: results/data.json, metrics/data.json)."""
    root = root or find_root(spec_path.parent)
    out_dir = out_dir or root / paths.PREPARED
    into = into or root
    spec = load_spec(spec_path, DataSpec)

    files = {n: fetch_origin(n, o, spec_path, root) for n, o in spec.origins.items()}
    vocab = set(spec.labels)

    def load(t: Table, where: str, in_vocab: bool) -> Split:
        return _load(spec_path, t, where, files[t.origin][t.file], vocab if in_vocab else None, spec.labels)

    train = load(spec.train, "train", True)
    heldout: dict[str, Split] = {"test": load(spec.test, "test", True)}
    for name, e in spec.eval_sets.items():
        heldout[name] = load(e.table, f"eval_sets.{name}", e.kind == "labelled")
    negatives = Split(rows=[])
    for i, t in enumerate(spec.negatives):
        part = load(t, f"negatives[{i}]", False)
        negatives.rows += part.rows
        negatives.dropped += part.dropped

    key = lambda text: normalize(text, spec.normalization)  # noqa: E731
    audit = {
        "duplicates_within": {
            n: _dup_count(s.rows, key) for n, s in {"train": train, **heldout, "negatives": negatives}.items()
        },
        "overlap_with_train": {n: _overlap(train.rows, s.rows, key) for n, s in heldout.items()},
    }
    heldout_keys = {key(r.text) for s in heldout.values() for r in s.rows}
    if spec.dedupe_train:
        _dedupe(train, key, heldout_keys, "duplicate_of_heldout")
    in_scope_keys = {key(r.text) for r in train.rows} | {key(r.text) for r in heldout["test"].rows}
    _dedupe(negatives, key, heldout_keys | in_scope_keys, "duplicate_of_in_scope_or_heldout")

    tr, val, cal = _carve(train.rows, spec)
    empty = [n for n, rows in {"train": tr, "validation": val, "calibration": cal}.items() if not rows]
    if empty:
        raise UserError(
            f"{spec_path}: split: partition(s) {empty} came out empty ({len(train.rows)} train "
            "rows after audits); lower split.validation / split.calibration or add data."
        )
    missing = [lbl for lbl in spec.labels if not any(r.label == lbl for r in tr)]
    if missing:
        raise UserError(
            f"{spec_path}: labels {missing[:5]} have no train rows left after the split; a "
            "head cannot learn them. Add examples, remove the labels, or lower the fractions."
        )

    outputs = {"train": tr, "validation": val, "calibration": cal, **{n: s.rows for n, s in heldout.items()}}
    if spec.negatives:
        outputs["negatives"] = negatives.rows
    # Built in a sibling folder and swapped in, so a failure never leaves a half-written set.
    with replace_dir(out_dir) as tmp:
        hashes = {n: _write_jsonl(tmp / f"{n}.jsonl", rows) for n, rows in outputs.items()}
        (tmp / "labels.json").write_text(json.dumps(spec.labels, ensure_ascii=False, indent=1) + "\n")

    metrics = {
        "dataset": spec.id,
        "labels": len(spec.labels),
        "rows": {n: len(rows) for n, rows in outputs.items()},
        "dropped": {
            "train": dict(sorted(train.dropped.items())),
            **{n: dict(sorted(s.dropped.items())) for n, s in heldout.items()},
            "negatives": dict(sorted(negatives.dropped.items())),
        },
        "audit": audit,
        "sha256": hashes,
        "raw_sha256": {f"{o}/{f}": s for o, org in spec.origins.items() for f, s in org.files.items()},
    }
    record = DataRecord.model_validate(metrics)
    write(into / paths.DATA_RECORD, record)
    write(into / paths.DATA_METRICS, DataMetrics.of(record))
    return metrics


def _dup_count(rows: list[Row], key) -> int:
    c = Counter(key(r.text) for r in rows)
    return sum(n - 1 for n in c.values() if n > 1)


def _overlap(train: list[Row], other: list[Row], key) -> int:
    keys = {key(r.text) for r in train}
    return sum(1 for r in other if key(r.text) in keys)


def summary(m: dict) -> str:
    rows = ", ".join(f"{n} {c}" for n, c in m["rows"].items())
    dropped = sum(sum(d.values()) for d in m["dropped"].values())
    return f"prepare: {m['dataset']}: {rows}; {dropped} rows dropped (by reason in results/data.json)"


def run(ctx: Context) -> Result:
    return Result(summary(prepare(ctx.spec or ctx.root / load_pipeline(ctx.root).data, ctx.root)))
