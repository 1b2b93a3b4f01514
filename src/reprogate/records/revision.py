"""What one revision holds: its records, lock file and prediction files, read by `reprogate
report` (two revisions compared) and `reprogate registry sync` (revisions imported).

A revision is a git commit (or the working tree, rev None). Files git tracks (results/,
metrics/, plots/, dvc.lock) are read with `git show`; DVC outputs (prediction files, model
fingerprints) through one DVCFileSystem per revision, which finds them in the local cache or
the remote. Every
record is validated by the same model its writer used. A revision made before results/ existed
kept the complete records under metrics/: those are read from there, so a report can compare
with a base from before this layout.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import yaml

from reprogate.records.base import R, validated
from reprogate.records.evaluation import Evaluation
from reprogate.records.gate import Decision
from reprogate.records.lm import LmEvaluation
from reprogate.records.resume import ResumeRecord
from reprogate.records.train import Fingerprint
from reprogate.specs.family import family
from reprogate.utils import dvc_cli, git, paths
from reprogate.utils.errors import UserError

T = TypeVar("T")
# A JSON record reprogate writes (eval.json, a fingerprint) is at most a few MB; a larger one is
# damaged or hostile, and validating it would hold all of it in memory (a 50 MB field once took
# 4 GB), so it is refused before it is parsed.
MAX_RECORD_CHARS = 16 * 1024 * 1024


def record_size(raw: str | None, where: str, fix: str) -> None:
    """Refuse a record past MAX_RECORD_CHARS, before anything parses it."""
    if raw is not None and len(raw) > MAX_RECORD_CHARS:
        raise UserError(
            f"{where} holds {len(raw):,} characters, more than the {MAX_RECORD_CHARS:,} a record of "
            f"reprogate's takes; {fix}"
        )


@dataclass
class Revision:
    root: Path
    rev: str | None  # None: the working tree
    who: str = "report"  # the command reading it, which its messages name
    part: str = "default"  # whose gate (paths.gate_files); experiments' lock entries are read too
    missing: list[str] = field(default_factory=list)  # what could not be read, said in the report

    @cached_property
    def commit(self) -> str | None:
        if self.rev is None:
            return None
        proc = git.completed(self.root, "rev-parse", "--verify", "-q", f"{self.rev}^{{commit}}")
        if proc.returncode != 0:
            raise UserError(
                f"{self.who}: '{self.rev}' is not a commit of {self.root} (git rev-parse found nothing); "
                "give a branch, tag or commit that exists here (`git fetch` a remote branch first)."
            )
        return proc.stdout.strip()

    @cached_property
    def committed_at(self) -> datetime | None:
        """The commit's committer date (with its offset); None for the working tree."""
        if self.commit is None:
            return None
        return datetime.fromisoformat(git.run(self.root, "show", "-s", "--format=%cI", self.commit))

    @property
    def label(self) -> str:
        if self.rev is None:
            return "working tree"
        return self.commit[:7] if self.commit.startswith(self.rev) else f"{self.rev} ({self.commit[:7]})"

    def text(self, path: Path | str) -> str | None:
        """A git-tracked file as this revision holds it; None when it has none."""
        if self.rev is None:
            p = self.root / path
            return _utf8(p.read_bytes(), path, self.label) if p.is_file() else None
        # `./`: relative to the project (git runs there), which may be a subfolder (lm/) of the
        # repository; a bare path would name the top folder's file of that name.
        raw = git.committed(self.root, Path(path), self.commit)
        return _utf8(raw, path, self.label) if raw is not None else None

    def output(self, path: Path | str) -> str | None:
        """A DVC output as this revision's dvc.lock pins it, from the cache or the remote."""
        if self.rev is None:
            p = self.root / path
            if p.is_file():
                return _utf8(p.read_bytes(), path, self.label)
            self.missing.append(f"{path} (not in the working tree: run `dvc repro` or `dvc pull`)")
            return None
        try:
            raw = self._dvc_fs.read_bytes(self._prefix + Path(path).as_posix())
        except Exception as e:  # noqa: BLE001 - DVC raises many kinds; each means "not here"
            self.missing.append(f"{path} ({type(e).__name__}: not in the DVC cache or remote)")
            return None
        return _utf8(raw, path, self.label)

    @cached_property
    def _dvc_fs(self):
        """This revision's files as DVC sees them: opened once (about a second), then each
        output is read from the cache (or the remote) in milliseconds."""
        from dvc.api import DVCFileSystem

        # Paths from the repository's top; a project in a subfolder (lm/, its own DVC project)
        # is a DVC subrepo there.
        return DVCFileSystem(str(self.root), rev=self.commit, subrepos=True)

    @cached_property
    def _prefix(self) -> str:
        return git.prefix(self.root).strip()

    def record(self, shape: type[R], *candidates: Path) -> R | None:
        """The first of `candidates` this revision has, validated as `shape`: a damaged one is
        named, never passed over for the next."""
        for path in candidates:
            raw = self.text(path)
            if raw is None:
                continue
            fix = "it is not the record reprogate writes. Compare revisions whose records `make repro` wrote."
            where = f"{self.who}: {path} at {self.label}"
            record_size(raw, where, fix)
            return validated(raw, shape, where, fix)
        return None

    @cached_property
    def gate(self) -> Decision | None:
        return self.record(Decision, *paths.gate_files(self.part))

    def evaluation(self, model: str) -> Evaluation | None:
        name = "eval.json"
        return self.record(Evaluation, paths.results_dir(model) / name, paths.metrics_dir(model) / name)

    def is_language_model(self, model: str) -> bool:
        """From the model's spec at this revision (the shape of its eval.json depends on it)."""
        raw = self.text(paths.model_spec(model))
        try:
            spec = yaml.safe_load(raw) if raw else None
        except (yaml.YAMLError, RecursionError):
            return False
        if not isinstance(spec, dict):
            return False
        try:
            return family(spec.get("family")).generates
        except ValueError:  # a family this checkout cannot import: not one of the built-in ones
            return False

    def lm_evaluation(self, model: str) -> LmEvaluation | None:
        name = "eval.json"
        return self.record(LmEvaluation, paths.results_dir(model) / name, paths.metrics_dir(model) / name)

    def resume(self, model: str) -> ResumeRecord | None:
        name = "resume.json"
        return self.record(ResumeRecord, paths.results_dir(model) / name, paths.metrics_dir(model) / name)

    def per_intent(self, model: str) -> dict[str, float]:
        """Intent -> F1 on the held-out test set (plots/<m>/per_intent.json, or the older
        metrics/<m>/per_intent.json keyed by set)."""
        path = paths.plots_dir(model) / "per_intent.json"
        if (raw := self.text(path)) is not None:
            return self._read(path, lambda: {r["intent"]: r["f1"] for r in json.loads(raw)})
        path = paths.metrics_dir(model) / "per_intent.json"
        if (old := self.text(path)) is None:
            return {}
        return self._read(path, lambda: {k: v["f1"] for k, v in json.loads(old).get("test", {}).items()})

    def predictions(self, model: str, split: str = "test") -> dict[str, tuple[str, str, str]]:
        """id -> (text, gold, predicted) of a prediction file; {} when it cannot be read."""
        path = paths.predictions_dir(model) / f"{split}.jsonl"
        raw = self.output(path)

        def parsed() -> dict[str, tuple[str, str, str]]:
            rows = (json.loads(line) for line in (raw or "").splitlines())
            return {str(r["id"]): (r["text"], r["gold"], r["predicted"]) for r in rows}

        return self._read(path, parsed)

    def fingerprint(self, model: str) -> Fingerprint | None:
        path = paths.model_dir(model) / "fingerprint.json"
        raw = self.output(path)
        return self._read(path, lambda: Fingerprint.model_validate_json(raw)) if raw else None

    def _read(self, path: Path, parse: Callable[[], T]) -> T:
        """What `parse` makes of a file of this revision; a file that is not what reprogate wrote
        there (a wrong shape, nesting deeper than any record) is one paragraph naming it."""
        try:
            return parse()
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, yaml.YAMLError) as e:
            said = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise UserError(
                f"{self.who}: {path} at {self.label} is not the file reprogate writes there ({said}). "
                "Compare revisions whose records `make repro` wrote, or rerun the stage that writes it."
            ) from None

    @cached_property
    def lock(self) -> dict[str, Any]:
        """Stage -> its dvc.lock entry (deps, params, outs with their hashes); for the
        experiments, their own lock's too, named as DVC names them (experiments/dvc.yaml:stage)."""
        stages = self._stages(dvc_cli.LOCK)
        if self.part != "default":
            named = dvc_cli.pipeline_file(self.part).as_posix()
            stages |= {
                f"{named}:{k}": v
                for k, v in self._stages(dvc_cli.pipeline_file(self.part, dvc_cli.LOCK)).items()
            }
        return stages

    def _stages(self, lock: Path) -> dict[str, Any]:
        raw = self.text(lock)
        # libyaml's loader when PyYAML has it: a lock file is read per commit of a registry sync.
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        return (
            self._read(lock, lambda: (yaml.load(raw, Loader=loader) or {}).get("stages", {})) if raw else {}
        )

    @cached_property
    def blobs(self) -> dict[str, str]:
        """Path -> git blob id of every file this commit tracks under results/, metrics/ and
        plots/: what its records are, from one `git ls-tree` instead of a `git show` each."""
        listed = git.run(self.root, "ls-tree", "-r", self.commit, "--", "results", "metrics", "plots")
        out = {}
        for line in filter(None, listed.splitlines()):
            meta, path = line.split("\t", 1)
            out[path] = meta.split()[2]
        return out

    def file_sha256(self, path: str) -> str | None:
        raw = self.text(path)
        return hashlib.sha256(raw.encode()).hexdigest() if raw is not None else None


def stage_changes(base: dict[str, Any], head: dict[str, Any]) -> dict[str, list[str]]:
    """Which stages' lock entries differ (they ran again for head), are the same, or were
    added or removed. Compared whole: a dependency, parameter or output hash that moved."""

    def key(entry: dict[str, Any]) -> str:
        return json.dumps(entry, sort_keys=True)

    return {
        "reran": sorted(s for s in head if s in base and key(head[s]) != key(base[s])),
        "unchanged": sorted(s for s in head if s in base and key(head[s]) == key(base[s])),
        "added": sorted(s for s in head if s not in base),
        "removed": sorted(s for s in base if s not in head),
    }


def _utf8(raw: bytes, path: Path | str, label: str) -> str:
    """A record's text; a byte that is not UTF-8 is one paragraph naming the file and where."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise UserError(
            f"{path} at {label}: byte {e.start} (line {line}) is not UTF-8 ({raw[e.start : e.start + 4]!r}); "
            "reprogate writes its records in UTF-8, so this file was damaged or written by something "
            "else: rerun the stage that writes it (`dvc repro`), or restore it from git."
        ) from None
