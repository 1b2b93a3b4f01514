"""What stage `prepare` runs: the data spec's pinned tables read, checked, normalised and split
into data/prepared/ (pipeline/stages/prepare.py declares it to DVC)."""

from __future__ import annotations

import difflib
import json
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reprogate.data.fetch import fetch_origin
from reprogate.data.tables import read_table
from reprogate.records.base import write
from reprogate.records.data import DataMetrics, DataRecord
from reprogate.specs.data import DataSpec, EvalSet, Normalization, Table
from reprogate.specs.loader import find_root, load_spec
from reprogate.utils import jsonl, paths
from reprogate.utils.atomic import replace_dir
from reprogate.utils.errors import UserError
from reprogate.utils.hashing import sha256_file
from reprogate.utils.text import canonical


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


def _load(spec_path: Path, t: Table, where: str, path: Path, allowed: Allowed | None) -> Split:
    """Canonicalise one table; with `allowed`, every row's label must be one of its values
    (else error), and it is the row's intent when `allowed.intents`."""
    split = Split(rows=[])
    bad: list[tuple[str, str]] = []
    for rid, text, label in read_table(t, path):
        if label in t.exclude_labels:
            split.dropped["excluded_label"] += 1
            continue
        text = canonical(text)
        if not text:
            split.dropped["empty_text"] += 1
            continue
        if allowed is not None and label not in allowed.values:
            bad.append((rid, label))
            continue
        split.rows.append(Row(rid, text, label if allowed and allowed.intents else None, label))
    if bad:
        counts = Counter(lbl for _, lbl in bad)
        worst = ", ".join(
            f"'{lbl}' ({n} rows{_closest(lbl, allowed.values)})" for lbl, n in counts.most_common(5)
        )
        raise UserError(
            f"{spec_path}: {where} ({path}) has {len(bad)} row(s) whose {t.label_field} is not in the "
            f"spec's '{allowed.field}': {worst}; first at row {bad[0][0]}. Nothing was written and no "
            f"row was skipped: {allowed.fix} or fix the data file and its sha256."
        )
    return split


@dataclass
class Allowed:
    """The values a table's label column may hold, where the spec declares them, and the fix."""

    values: list[str]
    field: str
    fix: str
    intents: bool = True  # the values are intents (else: a challenge set's kinds)


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
    p = spec.split
    val, cal = _seeded_parts(rows, p.seed, [p.validation, p.calibration], spec.labels if p.stratify else None)
    train = [r for i, r in enumerate(rows) if i not in val and i not in cal]
    return train, [rows[i] for i in sorted(val)], [rows[i] for i in sorted(cal)]


def _seeded_parts(
    rows: list[Row], seed: int, shares: list[float], strata: list[str] | None
) -> list[set[int]]:
    """Row indices of each share, drawn per stratum (the rows' source label, in `strata`'s
    order) or over all rows (None), from one seeded generator."""
    rng = np.random.default_rng(seed)
    groups: dict[str | None, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.source_label if strata is not None else None, []).append(i)
    parts: list[set[int]] = [set() for _ in shares]
    for group in strata if strata is not None else [None]:
        idx = groups.get(group, [])
        perm = rng.permutation(len(idx))
        start = 0
        for part, share in zip(parts, shares, strict=True):
            n = round(share * len(idx))
            part.update(idx[j] for j in perm[start : start + n])
            start += n
    return parts


def _dev_test(name: str, e: EvalSet, split: Split, spec: DataSpec) -> dict[str, list[Row]]:
    """A set's prepared parts: itself, or <name>_dev and <name>_test by its seeded split."""
    if e.split is None:
        return {name: split.rows}
    strata = (e.kinds if e.kind == "challenge" else spec.labels) if e.split.stratify else None
    (dev,) = _seeded_parts(split.rows, e.split.seed, [e.split.dev], strata)
    parts = {
        f"{name}_dev": [r for i, r in enumerate(split.rows) if i in dev],
        f"{name}_test": [r for i, r in enumerate(split.rows) if i not in dev],
    }
    empty = [n for n, rows in parts.items() if not rows]
    if empty:
        raise UserError(
            f"eval_sets.{name}.split: part(s) {empty} came out empty ({len(split.rows)} rows); set "
            "split.dev between 0 and 1 so that both parts keep rows, or add rows."
        )
    return parts


def _write_jsonl(path: Path, rows: list[Row]) -> str:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            obj = {"id": r.id, "text": r.text, "label": r.label}
            if r.label is None:
                obj["source_label"] = r.source_label
            f.write(jsonl.line(obj, sort_keys=True))
    return sha256_file(path)


def _load_all(spec: DataSpec, spec_path: Path, root: Path) -> tuple[Split, dict[str, Split], Split]:
    """Every table of the spec, canonicalised: train, the held-out test and each evaluation
    set as declared (before any dev/test split), and the negatives."""
    files = {n: fetch_origin(n, o, spec_path, root) for n, o in spec.origins.items()}

    def load(t: Table, where: str, allowed: Allowed | None) -> Split:
        return _load(spec_path, t, where, files[t.origin][t.file], allowed)

    intents = Allowed(spec.labels, "labels", "add the label to 'labels' (the head grows with it)")
    train = load(spec.train, "train", intents)
    declared: dict[str, Split] = {"test": load(spec.test, "test", intents)}
    for name, e in spec.eval_sets.items():
        where = f"eval_sets.{name}"
        allowed = {
            "real_utterance": intents,
            "challenge": Allowed(e.kinds, f"{where}.kinds", f"add the kind to {where}.kinds", False),
            "out_of_scope": None,
        }[e.kind]
        declared[name] = load(e.table, where, allowed)
    negatives = Split(rows=[])
    for i, t in enumerate(spec.negatives):
        part = load(t, f"negatives[{i}]", None)
        negatives.rows += part.rows
        negatives.dropped += part.dropped
    return train, declared, negatives


def prepare(
    spec_path: Path, root: Path | None = None, out_dir: Path | None = None, into: Path | None = None
) -> dict:
    """Prepared splits into `out_dir` (data/prepared/), the data record and its headline under
    `into` (the project: results/data.json, metrics/data.json)."""
    root = root or find_root(spec_path.parent)
    out_dir = out_dir or root / paths.PREPARED
    into = into or root
    spec = load_spec(spec_path, DataSpec)

    train, declared, negatives = _load_all(spec, spec_path, root)
    heldout = {"test": declared["test"].rows}
    for name, e in spec.eval_sets.items():
        heldout.update(_dev_test(name, e, declared[name], spec))

    key = lambda text: normalize(text, spec.normalization)  # noqa: E731
    audit = {
        # Before any dev/test split, so a text in both parts of a set counts as a duplicate.
        "duplicates_within": {
            n: _dup_count(s.rows, key)
            for n, s in {"train": train, **declared, "negatives": negatives}.items()
        },
        "overlap_with_train": {n: _overlap(train.rows, rows, key) for n, rows in heldout.items()},
    }
    heldout_keys = {key(r.text) for rows in heldout.values() for r in rows}
    if spec.dedupe_train:
        _dedupe(train, key, heldout_keys, "duplicate_of_heldout")
    in_scope_keys = {key(r.text) for r in train.rows} | {key(r.text) for r in heldout["test"]}
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

    outputs = {"train": tr, "validation": val, "calibration": cal, **heldout}
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
            **{n: dict(sorted(s.dropped.items())) for n, s in declared.items()},
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
