"""The production model: the record promote commits, the files it pins, and a servable model.

`reprogate predict` and `reprogate serve` answer with the record HEAD holds (in a git
repository; a deployed copy without git has only its file) and refuse a working-tree record
that differs from it: that is a promotion not yet committed, or a hand edit, and answering with
it would serve a model no commit names. They answer only with the files the record pins: the
copy promote kept under models/.promoted/<version>/, or the workspace's models/ when it still
holds exactly those files (after a retrain it holds a candidate, which must not answer under
production's version).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reprogate.export.scorer import ExportScorer
from reprogate.folder import manifest
from reprogate.folder.files import model_version, read_calibration
from reprogate.folder.pins import Pins, verified
from reprogate.folder.scorer import Scorer
from reprogate.predict import requests, shipped
from reprogate.predict.calibration import Policy, prediction, probabilities
from reprogate.predict.scorers import open_scorer
from reprogate.records.base import load, validated
from reprogate.records.production import (
    PROMOTION_STAGE,
    RESTORE_PRODUCTION,
    ProductionRecord,
    Promoted,
    is_promotion,
)
from reprogate.records.train import Fingerprint
from reprogate.specs.pipeline import PARTS
from reprogate.utils import dvc_cli, git, paths
from reprogate.utils.atomic import replace_dir
from reprogate.utils.errors import UserError
from reprogate.utils.text import canonical


@dataclass(frozen=True)
class Loaded:
    """One servable model: never mutated, so a request can keep using it after a swap."""

    name: str
    version: str
    scorer: Scorer | ExportScorer
    policy: Policy
    record: ProductionRecord | None
    source_sha256: str | None
    # Whether promote made the commit that put the record there, and why not (provenance; None,
    # None: a model folder asked for by path). Served all the same, and said (predict, /version).
    verified: bool | None = None
    unverified: str | None = None

    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        start = time.perf_counter()
        # Scored and cut into clauses as evaluation's prepared texts are: in canonical form. The
        # answer echoes each text as it was sent.
        folded = [canonical(t) for t in texts]
        probs = probabilities(self.scorer.text_logits(folded), self.policy.temperature)
        extra = self.policy.request_reasons(folded, probs, self.scorer)
        ms = round((time.perf_counter() - start) * 1000, 3)
        return [
            {
                "text": t,
                **prediction(p, self.scorer.labels, self.policy, self.scorer.oos_index, more),
                "model_version": self.version,
                "latency_ms": ms,
            }
            for t, p, more in zip(texts, probs, extra, strict=True)
        ]


# Said wherever the record is refused as it stands.
RESTORE = f"{RESTORE_PRODUCTION[0].upper()}{RESTORE_PRODUCTION[1:]}"


@dataclass(frozen=True)
class Sources:
    """models/production.json as the working tree and, in a git repository, HEAD hold it; read
    once, so the identity a server watches and the record it loads are the same bytes."""

    here: bytes | None
    head: bytes | None
    git_dir: Path | None

    @classmethod
    def read(cls, root: Path) -> Sources:
        path = root / paths.PRODUCTION
        here = path.read_bytes() if path.is_file() else None
        git_dir = git.git_dir(root)
        return cls(here, git.committed(root, paths.PRODUCTION) if git_dir else None, git_dir)

    def identity(self) -> str | None:
        """Changes with a promotion, a revert or an edit; None when there is no record at all."""
        parts = [self.here] + ([self.head] if self.git_dir else [])
        if all(p is None for p in parts):
            return None
        return hashlib.sha256(json.dumps([p.hex() if p else None for p in parts]).encode()).hexdigest()

    def committed(self, root: Path) -> bytes:
        """The record HEAD holds, which must be what the working tree holds."""
        if self.git_dir is None or self.head == self.here:  # a deployed copy has only its file
            return self.here if self.here is not None else b"{}"  # none at all: nothing promoted
        path = root / paths.PRODUCTION
        if (self.git_dir / git.PROMOTION_JOURNAL).is_file():
            raise UserError(
                f"{path}: a promotion was interrupted before it was committed and tagged; production "
                "answers only with a committed record: run `reprogate promote` to finish it."
            )
        here, head = self.here, self.head
        state = (
            "is missing" if here is None else "is not committed" if head is None else "differs from HEAD's"
        )
        raise UserError(
            f"{path} {state}: production answers only with the record HEAD holds, so nothing answers "
            f"with a model no commit names. {RESTORE}; a revert or a merge of it is committed like "
            "any change."
        )


def made_by_promote(subject: str, tagged: bool) -> bool:
    """Whether a commit that changed production.json is promote's (its subject, or an annotated
    promotion tag on it) or a revert of one: what `history` and serving call verified."""
    return is_promotion(subject) or subject.startswith("Revert ") or tagged


def provenance(root: Path) -> tuple[bool | None, str | None]:
    """(verified, why not) of HEAD's production record: verified when the commit that last
    changed it has promote's subject, is a revert, or carries an annotated promotion tag (as
    `reprogate history` marks them); None when nothing can be checked (a copy without git, a
    shallow clone whose history stops before that commit). A hand-made commit can put any record
    there: it is served all the same, and said."""
    git_dir = git.git_dir(root)
    if git_dir is None:
        return None, "a copy without git history: only the record's own hashes are checked"
    line = git.run(root, "log", "-1", "--format=%H %s", "--", str(paths.PRODUCTION), check=False).strip()
    commit, _, subject = line.partition(" ")
    # A shallow clone's oldest commit stands for all history before it: it "changed" every file.
    boundary = (git_dir / "shallow").read_text().split() if (git_dir / "shallow").is_file() else []
    if not line or commit in boundary:
        return None, "a shallow clone: the commit that last changed the record is not in it"
    listed = git.run(root, "tag", "--points-at", commit, "--list", f"*#{PROMOTION_STAGE}#*",
                     "--format=%(*objectname)", check=False)  # fmt: skip
    if made_by_promote(subject, tagged=bool(listed.strip())):  # annotated tags only, as history
        return True, None
    return False, (
        f"{paths.PRODUCTION} was last changed by {commit[:12]} ({subject[:60]!r}), which `reprogate "
        "promote` did not make (no promotion subject or tag); `reprogate history` lists it"
    )


def production_sha256(root: Path) -> str | None:
    """Identity of the production record now (see Sources)."""
    return Sources.read(root).identity()


def pins_of(root: Path, record: Promoted) -> Pins:
    """Every file of the promoted model and its members, as the promotion commit pins them: the
    record's sha256s and the md5s of that commit's dvc.lock (none in a copy without git)."""
    commit = record.code_commit
    md5: dict[str, str] = {}
    if commit and git.git_dir(root):
        for lock in (dvc_cli.pipeline_file(part, dvc_cli.LOCK) for part in PARTS):
            try:
                md5 |= {k: v for k, v in dvc_cli.lock_outputs(git.committed(root, lock, commit)).items() if v}
            except (yaml.YAMLError, AttributeError, TypeError, KeyError):
                continue  # a damaged lock pins nothing; the record's own sha256s still must hold
    where = f"{paths.PRODUCTION} (and dvc.lock at {commit[:12]})" if md5 and commit else str(paths.PRODUCTION)
    return Pins(record.artifacts or {}, md5, where)


@dataclass(frozen=True)
class Opened:
    """The promoted model's folder and its members' as read once and verified: what is served."""

    dir: Path
    files: manifest.Files
    members_dir: Path
    members: dict[str, manifest.Files]


def _opened(record: Promoted, model_dir: Path, members_dir: Path, pins: Pins, since: str) -> Opened | str:
    """`model_dir` (with its members in `members_dir`) read once and checked against the
    promotion, or why it is not the promoted model: every byte of every file the model and its
    members load against what the promotion pins, the version (weights, an ensemble's members)
    and the calibrated policy, all from the bytes read."""
    files, why = verified(model_dir, record.model, pins)
    calibrated = not record.generates  # a language model has no routing policy
    if not any(files.has(w) for w in paths.WEIGHTS) or (calibrated and not files.has("calibration.json")):
        return f"{model_dir} is not built"
    if why:
        return f"{why}, {since}"
    if (now := model_version(files)) != record.model_version:
        return f"{model_dir} holds {now}, {since}"
    pinned_policy = record.calibration
    if pinned_policy:
        levels = {k: getattr(pinned_policy, k) for k in requests.RULES}
        kept = Policy(pinned_policy.temperature, pinned_policy.threshold, pinned_policy.margin, **levels)
        raw = files.json("calibration.json")
        if Policy.of(read_calibration(model_dir / "calibration.json", raw)) != kept:
            return f"{model_dir}/calibration.json was refitted, {since}"
    members: dict[str, manifest.Files] = {}
    for member in files.record("fingerprint.json", Fingerprint).members or {}:
        members[member], why = verified(members_dir / member, member, pins)
        if why:
            return f"{why}, {since}"
    return Opened(model_dir, files, members_dir, members)


def production_files(root: Path, record: Promoted) -> Opened:
    """The promoted model, read and verified: the kept copy if there is one, else the
    workspace's models/ if it still holds exactly the promoted files, else a kept copy restored
    from the files shipped with the project (models/shipped)."""
    version, name = record.model_version, record.model
    kept = root / paths.PROMOTED / version
    pins = pins_of(root, record)
    if not (kept / name).is_dir():
        here = _opened(record, root / paths.model_dir(name), root / paths.MODELS, pins, "retrained since")
        if isinstance(here, Opened):
            return here
        _restore_shipped(root, record, kept, here, pins)
    opened = _opened(record, kept / name, kept, pins, "changed after the promotion")
    if isinstance(opened, str):
        raise UserError(
            f"{root / paths.PRODUCTION} pins {version}, but its kept copy {opened}. Delete {kept} to "
            f"fall back to the workspace's models/{name}, or promote again after a passing gate."
        )
    return opened


def _restore_shipped(root: Path, record: Promoted, kept: Path, why: str, pins: Pins) -> None:
    """The kept copy, from the shipped remote at the promotion's commit; or the paragraph with
    the two ways a clone gets the promoted files."""
    name, version, commit = record.model, record.model_version, record.code_commit
    try:
        if not (root / paths.SHIPPED).is_dir() or not commit:
            raise LookupError(
                f"this checkout has no {paths.SHIPPED}/" if commit else "the record names no commit"
            )
        with replace_dir(kept) as tmp:
            shipped.restore(root, commit, name, tmp / name)
            members = load(tmp / name / "fingerprint.json", Fingerprint, "restored from models/shipped")
            for member in members.members or {}:
                shipped.restore(root, commit, member, tmp / member)
            if isinstance(wrong := _opened(record, tmp / name, tmp, pins, "not the promoted files"), str):
                raise LookupError(wrong)
    except (LookupError, OSError, UserError) as e:
        raise UserError(
            f"{root / paths.PRODUCTION} pins {version}, but {why}, there is no copy in "
            f"{paths.PROMOTED / version} (promote keeps one), and the files shipped with the project do "
            f"not have it ({e}). Either rebuild the promotion's commit bitwise (`git checkout "
            f"{(commit or 'COMMIT')[:12]} && make repro`; a commit made under the numeric pin rebuilds on "
            f"any CPU that meets it), or get the files from whoever promoted it (`reprogate promote` "
            f"ships them in {paths.SHIPPED}; commit and push that folder). To serve the workspace's "
            f"model instead: --model models/{name}."
        ) from None


def read_promoted(root: Path, sources: Sources) -> Promoted:
    """The committed production record with a model in it, or one paragraph saying what is wrong."""
    path = root / paths.PRODUCTION
    try:
        raw = json.loads(sources.committed(root).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); {RESTORE_PRODUCTION}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path} is not a production record; {RESTORE_PRODUCTION}")
    if not raw.get("model"):
        raise UserError(
            f"{path}: no model in production yet; run `reprogate promote` after a "
            "passing gate, or pass --model models/NAME."
        )
    return validated(raw, Promoted, str(path), f"it is not the record `reprogate promote` wrote. {RESTORE}.")


def load_servable(root: Path, model_dir: Path | None = None, device: str = "auto") -> Loaded:
    """The production model (or `model_dir`) with its calibration, loaded on `device` and
    warmed up. Used by `reprogate predict` and `reprogate serve`."""
    record: Promoted | None = None
    source = None
    if model_dir is None:
        sources = Sources.read(root)
        source = sources.identity()
        record = read_promoted(root, sources)
        opened = production_files(root, record)
    else:
        opened = Opened(model_dir, manifest.Files.read(model_dir), model_dir.parent, {})
        if not opened.files.has("config.json"):
            near = {str(c.parent) for d in (model_dir, model_dir.parent) for c in d.glob("*/config.json")}
            raise UserError(
                f"--model {model_dir}: no trained model in that folder; give one of "
                f"{', '.join(sorted(near)) or 'the model folders `dvc repro` writes under models/'}."
            )
    model_dir, files = opened.dir, opened.files
    if not files.has("calibration.json"):
        raise UserError(
            f"{model_dir}: no calibration.json; run `dvc repro calibrate@{model_dir.name}` first."
        )
    scorer = open_scorer(
        root, model_dir.name, model_dir, device, opened.members_dir, files=files, members=opened.members
    )
    loaded = Loaded(
        name=model_dir.name,
        version=record.model_version if record else model_version(files),
        scorer=scorer,
        policy=Policy.of(read_calibration(model_dir / "calibration.json", files.json("calibration.json"))),
        record=record,
        source_sha256=source,
        **(dict(zip(("verified", "unverified"), provenance(root), strict=True)) if record else {}),
    )
    try:
        loaded.predict(["warm up"])  # first-call costs (allocations, lazy imports) happen here
    except Exception as e:  # noqa: BLE001 - ONNX Runtime's own errors derive from Exception alone
        if not type(e).__module__.startswith("onnxruntime"):
            raise
        said = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise UserError(
            f"{model_dir}/model.onnx: ONNX Runtime cannot load it ({type(e).__name__}: {said}); the file "
            f"is damaged or not an export. `dvc checkout {model_dir}` restores what DVC cached, or "
            f"`dvc repro export@{model_dir.name}` exports it again."
        ) from None
    return loaded
