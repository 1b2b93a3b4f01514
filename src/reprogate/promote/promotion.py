"""`reprogate promote`: the only way production changes, as a git commit a reviewer can read.

Refuses unless results/gate.json chose a candidate (`--pipeline experiments`: the experiments'
gate, results/experiments/gate.json), the workspace has no uncommitted change, and `dvc status`
shows every output of that pipeline up to date (so the gate's evidence belongs to this commit).
Then keeps a copy of the model's files in models/.promoted/<version>/ (git-ignored), writes
models/production.json, commits it with every gate rule and value in the message, and
adds an annotated tag in GTO's format `<artifact>#prod#<n>`.
`git log -- models/production.json` is the promotion history (promote/history.py); reverting
a promotion commit is a rollback.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from reprogate.folder.files import model_version, read_calibration
from reprogate.pipeline.kinds import KINDS
from reprogate.predict import requests, shipped
from reprogate.promote import commit as promote_commit
from reprogate.promote.versions import next_version, tags_at
from reprogate.records import code as code_records
from reprogate.records.base import dumps, load, parse
from reprogate.records.data import DataRecord
from reprogate.records.evaluation import Evaluation
from reprogate.records.gate import Decision
from reprogate.records.lm import CorpusRecord
from reprogate.records.production import (
    PROMOTION_STAGE,
    RESTORE_PRODUCTION,
    Promoted,
    PromotionJournal,
    is_promotion,
)
from reprogate.records.train import Fingerprint, ModelConfig
from reprogate.specs.base import spec_hash
from reprogate.specs.catalog import load_any
from reprogate.specs.family import family, load_object
from reprogate.specs.loader import load_params
from reprogate.specs.pipeline import Part
from reprogate.utils import dvc_cli, git, locks, paths
from reprogate.utils.atomic import replace_dir
from reprogate.utils.errors import UserError, read_json
from reprogate.utils.hashing import sha256_file
from reprogate.utils.paths import PRODUCTION, PROMOTED
from reprogate.utils.pause import pause_if

STAGE = PROMOTION_STAGE
# What every file promote reads comes from: the pipeline's outputs.
RERUN = "run `dvc repro` (and `dvc checkout` for a damaged DVC output), commit, and promote again."


def _subject(name: str, version: str) -> str:
    """A promotion commit's subject line; `is_promotion` recognises it."""
    return f"promote {name} ({version}) to production"


def read_decision(root: Path, fix: str, part: Part = "default") -> dict[str, Any]:
    """The gate's decision of pipeline `part` (results/gate.json for the default), or one
    paragraph naming the file, what is wrong with it and `fix`."""
    path = root / paths.gate_files(part)[0]
    if not path.is_file():
        rerun = f"dvc repro {dvc_cli.pipeline_file(part)}"
        raise UserError(f"{path} does not exist: run `{rerun}` (the gate stage) first.")
    decision, why = parse(path, Decision)
    if decision is not None and decision.passed and decision.chosen not in decision.candidates:
        why = f"gate.json chose {decision.chosen!r}, which is not among its candidates"
    if why:
        raise UserError(f"{path}: {why}; it is not the gate's record as written. {fix}")
    return decision.model_dump(mode="json", exclude_unset=True)


def _promoted_since(root: Path, found: dict, gate: dict[str, Any]) -> set[str]:
    """Gates stale only because production changed to the model they chose: the promotion this
    gate asked for was made (the same command again, a retried --push), so not a refusal."""
    prod = read_json(root / PRODUCTION, RESTORE_PRODUCTION) if (root / PRODUCTION).is_file() else {}
    chosen = gate["candidates"][gate["chosen"]]["model_version"]
    if prod.get("model_version") != chosen:
        return set()

    def production_only(why: list) -> bool:
        changed = why[0].get("changed deps", {}) if len(why) == 1 and len(why[0]) == 1 else {}
        return bool(changed) and all(
            k.endswith(paths.PRODUCTION.as_posix()) and v == "modified" for k, v in changed.items()
        )

    return {n for n, why in found.items() if n.split(":")[-1] == "gate" and production_only(why)}


def plan(root: Path, part: Part = "default") -> dict[str, Any]:
    """Everything promote would write, after every refusal check."""
    gate = read_decision(root, RERUN, part)
    if not gate["passed"]:
        raise UserError(
            "promotion refused: the gate did not pass for this workspace: "
            + "; ".join(gate["reasons"])
            + ". Production stays as it is."
        )
    # Files an interrupted promote shipped but never committed are not a change of the workspace:
    # content-addressed, they are committed with the next promotion.
    status = git.run(root, "status", "--porcelain", "--untracked-files=all").splitlines()
    shipped_files = f"{git.prefix(root)}{paths.SHIPPED.as_posix()}/"
    dirty = "\n".join(x for x in status if not (x.startswith("?? ") and x[3:].startswith(shipped_files)))
    if dirty:
        raise UserError(
            "promotion refused: the workspace has uncommitted changes; commit them (with dvc.lock and "
            f"metrics) so the promotion points at a reproducible commit:\n{dirty}"
        )
    # The gate's evidence is this pipeline's (the experiments' build on the default's): a second
    # pipeline nobody has run is not a reason to refuse the first's candidate.
    pipelines = [paths.DVC_YAML] if part == "default" else [paths.DVC_YAML, dvc_cli.pipeline_file(part)]
    # A code/<stage>.json that no longer says what the code means is stale too: the workspace is
    # clean and dvc status finds nothing until stage `code` has run.
    found = dvc_cli.status(root, *pipelines)
    stale = {*found, *(f"code ({s})" for s in code_records.stale(root))} - _promoted_since(root, found, gate)
    if stale:
        raise UserError(
            f"promotion refused: `dvc status` shows stages out of date ({', '.join(sorted(stale))}); "
            f"run `dvc repro {' '.join(map(str, pipelines))}`, commit, and promote again."
        )
    name = gate["chosen"]
    cand = gate["candidates"][name]
    record = _record(root, name, cand)
    n = next_number(root, name)
    lines = [_subject(name, cand["model_version"]), ""]
    for r in cand["rules"]:
        if r["verdict"] == "n/a":
            lines.append(f"- {r['rule']}: n/a ({r.get('note', '')})")
            continue
        value = f"{r['value']:.4f}" if isinstance(r["value"], float) else r["value"]
        note = f" ({r['note']})" if r.get("note") else ""
        lines.append(f"- {r['rule']}: {value} {r['op']} {r['threshold']} -> {r['verdict']}{note}")
    lines += ["", f"gate: {'; '.join(gate['reasons'])}", f"code: {record.code_commit}"]
    tags = {"tag": f"{name}#{STAGE}#{n}", "version_tag": next_version(root, name, n)}
    return {"record": record, **tags, "message": "\n".join(lines)}


def artifacts(root: Path, name: str) -> dict[str, str]:
    """Every file predict and serve load, by sha256: the model's folder and its members'
    (folder/pins.py checks them, on the bytes served, before anything is served)."""
    model_dir = root / paths.model_dir(name)
    members = load(model_dir / "fingerprint.json", Fingerprint, RERUN).members or {}
    folders = [model_dir, *(root / paths.model_dir(m) for m in members)]
    return {
        str(p.relative_to(root)): sha256_file(p)
        for folder in folders
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _common(root: Path, name: str, cand: dict[str, Any]) -> dict[str, Any]:
    """The fields of a production record every kind of model has."""
    params = load_params(root)
    return dict(
        model=name,
        model_version=cand["model_version"],
        artifacts=artifacts(root, name),
        spec_hashes={
            f"specs/models/{name}.yaml": spec_hash(load_any(root / paths.model_spec(name))),
            params.data: spec_hash(load_any(root / params.data)),
            params.gate: spec_hash(load_any(root / params.gate)),
        },
        code_commit=git.run(root, "rev-parse", "HEAD"),
        gate={r["rule"]: {k: r[k] for k in ("value", "op", "threshold", "verdict")} for r in cand["rules"]},
    )


def lm_record(root: Path, name: str, cand: dict[str, Any], config: ModelConfig) -> Promoted:
    """A language model's production record: bits per character instead of accuracy and a
    routing policy; the corpus parts' sha256 as its data."""
    corpus = load(root / paths.DATA_RECORD, CorpusRecord, RERUN)
    return Promoted(
        **_common(root, name, cand),
        data_sha256=corpus.sha256,
        val_bits_per_char=cand["val_bits_per_char"],
        family=config.family,
    )


def _record(root: Path, name: str, cand: dict[str, Any]) -> Promoted:
    """models/production.json for the gate's chosen candidate, from the pipeline's own files: as
    the kind of its family writes one (pipeline/kinds.py)."""
    config = load(root / paths.model_dir(name) / "config.json", ModelConfig, RERUN)
    write = load_object(KINDS[family(config.family).kind].production_record)
    return write(root, name, cand, config)


def classifier_record(root: Path, name: str, cand: dict[str, Any], config: ModelConfig) -> Promoted:
    """A classifier's production record: held-out accuracy and the calibrated routing policy."""
    model_dir = root / paths.model_dir(name)
    data = load(root / paths.DATA_RECORD, DataRecord, RERUN)
    evaluation = load(root / paths.results_dir(name) / "eval.json", Evaluation, RERUN)
    policy = read_calibration(model_dir / "calibration.json").policy
    return Promoted(
        **_common(root, name, cand),
        data_sha256=data.sha256,
        heldout_accuracy=cand["heldout_accuracy"],
        heldout_accuracy_ci95=evaluation.sets["test"].accuracy_ci95,
        calibration={
            "threshold": policy.threshold,
            "margin": policy.margin,
            "temperature": evaluation.temperature,
            **{k: v for k in requests.RULES if (v := getattr(policy, k)) is not None},
        },
        family=config.family,
    )


def keep_promoted(root: Path, name: str, version: str) -> Path:
    """Copy models/<name>/ (and an ensemble's member folders) to models/.promoted/<version>/:
    production then answers from these files after a retrain, and reverting a promotion finds
    the old model's files. Written whole (temporary folder, then rename) before the commit."""
    dest = root / PROMOTED / version
    if dest.is_dir():
        return dest
    fingerprint = load(root / paths.model_dir(name) / "fingerprint.json", Fingerprint, RERUN)
    try:
        with replace_dir(dest) as tmp:
            for folder in [name, *(fingerprint.members or {})]:
                shutil.copytree(root / paths.model_dir(folder), tmp / folder)
                pause_if("promote:copy")
            if (kept := model_version(tmp / name)) != version:
                raise UserError(f"models/{name} holds {kept}, not the gate's {version}; run `dvc repro`.")
    except OSError as e:  # a full disk, say: nothing is committed without the copy
        raise UserError(
            f"promotion refused: could not keep a copy of models/{name} in {dest} ({e.strerror or e}); "
            "free some disk space and promote again. Production is unchanged."
        ) from None
    return dest


def push_outputs(root: Path) -> str:
    """Every output of this commit (the promoted model's among them) and the run-cache, to the
    default DVC remote, before anything of the promotion is written: a failed push leaves
    production as it was, and the same command retries."""
    remote = dvc_cli.default_remote(root)
    if remote is None:
        raise UserError(
            "promote --push needs a DVC remote to push the model's files to, and this project has none: "
            "run `make remote URL=...` (a local folder, s3://, gs://, azure:// or ssh://), commit "
            ".dvc/config, and promote again. Production is unchanged."
        )
    proc = dvc_cli.call(root, "push", "--run-cache")
    if proc.returncode != 0:
        raise UserError(
            f"promotion refused: `dvc push` to remote '{remote}' failed ({dvc_cli.last_error(proc)}); "
            "production is unchanged. Make the remote reachable and writable (`dvc remote list`), then "
            "run `reprogate promote --push` again."
        )
    return f"promote: pushed this commit's outputs and run-cache to DVC remote '{remote}'\n"


def push_commit(root: Path, tags: list[str]) -> str:
    """The promotion commit and its tags to the branch's git remote (its upstream, else origin),
    atomically: the remote takes all or none, so a rejected branch (moved on, protected) never
    leaves a production tag on a commit that is not on the team's branch."""
    tag = " ".join(f"refs/tags/{t}" for t in tags)
    upstream = git.run(root, "rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{u}", check=False)
    remote, _, branch = upstream.partition("/") if upstream else ("origin", "", "")
    branch = branch or git.run(root, "rev-parse", "--abbrev-ref", "HEAD", check=False)
    if remote not in git.run(root, "remote", check=False).split():
        return (
            "promote: no git remote to push to; publish the promotion with "
            f"`git push --atomic <remote> HEAD {tag}` when there is one"
        )
    refs = (f"HEAD:refs/heads/{branch}", *tag.split())
    proc = git.completed(root, "push", "--atomic", remote, *refs)
    if proc.returncode != 0:
        said = [x.strip() for x in proc.stderr.splitlines()]
        lines = [x for x in said if x.startswith(("!", "error", "remote:"))]
        why = "; ".join(lines[:3]) or f"exit {proc.returncode}"
        return (
            f"promote: the promotion is committed and tagged here, and its files are on the DVC remote, "
            f"but {remote} refused the push ({why}), so nothing was published: neither the commit nor the "
            f"tags {', '.join(tags)}; the team's production is unchanged. Bring {branch} up to date with "
            f"{remote}'s, then `git push --atomic {remote} HEAD:{branch} {tag}` (a rebase moves the "
            f"promotion commit: move the tags with it, `git tag -f -a '{tags[-1]}'`)."
        )
    return f"promote: pushed the promotion commit to {remote}/{branch} and tags {', '.join(tags)}, together"


def promote(root: Path, dry_run: bool = False, push: bool = False, part: Part = "default") -> str:
    git_dir = git.git_dir(root)
    if git_dir is None:
        raise UserError(
            f"{root} is not a git repository (or git is missing): a promotion is a git commit a "
            "reviewer reads; run `git init` and commit the project, then promote."
        )
    promote_commit.refuse_detached(root)
    if dry_run:
        said = locks.clear(root, git_dir, dry_run=True)
        if (journal := promote_commit.pending(git_dir)) is not None:
            _same_project(root, journal)
            return (
                said
                + f"would finish the interrupted promotion of {journal.model_version} (tag {journal.tag})"
            )
        return said + _fresh(root, git_dir, dry_run=True, part=part)
    with promote_commit.exclusive(root, git_dir):
        # Said at once: a refusal below must not hide that a lock file was removed.
        print(locks.clear(root, git_dir), end="", flush=True)
        if (journal := promote_commit.pending(git_dir)) is not None:
            _same_project(root, journal)
            pushed = push_outputs(root) if push else ""
            commit = promote_commit.finish(root, git_dir, journal)
            said = pushed + "promote: finished a promotion a killed run had begun.\n" + _done(journal, commit)
            return said + ("\n" + push_commit(root, promote_commit.tags(journal)) if push else "")
        return _fresh(root, git_dir, dry_run=False, push=push, part=part)


def _same_project(root: Path, journal: PromotionJournal) -> None:
    """A journal is finished only by the project it belongs to (the repository may hold two:
    the classifier at its top and the language model in lm/), or the record would land in the
    wrong models/production.json."""
    if journal.project != git.prefix(root):
        where = journal.project or "the repository's top folder"
        raise UserError(
            f"an interrupted promotion of {journal.model_version} in {where} is not finished: run "
            f"`reprogate promote` there first (it finishes it), then promote here."
        )


def _fresh(root: Path, git_dir: Path, dry_run: bool, push: bool = False, part: Part = "default") -> str:
    p = plan(root, part)
    pushed = push_outputs(root) if push and not dry_run else ""
    written = dumps(p["record"])
    record = json.loads(written)
    current = read_json(root / PRODUCTION, RESTORE_PRODUCTION) if (root / PRODUCTION).is_file() else {}
    if (current.get("model_version"), current.get("calibration")) == (
        record["model_version"],
        record.get("calibration"),  # a language model has none
    ):
        # The gate chose what is already in production: another commit and tag would only add
        # noise to the history. On a clone without the kept copy, this makes it.
        since = git.run(root, "log", "-1", "--format=%h %ad", "--date=short", "--", str(PRODUCTION))
        said = (
            f"promote: nothing to do: {record['model_version']} (same calibrated policy) is already in "
            f"production (since {since or 'the workspace'}); no commit, no tag"
        )
        if not (root / PROMOTED / record["model_version"]).is_dir():
            said += (
                f"; {'would keep' if dry_run else 'kept'} its files in {PROMOTED / record['model_version']}"
            )
            if not dry_run:
                keep_promoted(root, record["model"], record["model_version"])
        if pushed:  # a retry after a failed git push: the tag of the promotion in place
            said = pushed + said + "\n" + push_commit(root, tags_at(root) or ["(untagged)"])
        return said
    if dry_run:
        return (
            f"would write {PRODUCTION}, commit and tag {p['version_tag']} and {p['tag']}, and keep a copy "
            f"of models/{record['model']} in {PROMOTED / record['model_version']}:\n\n{p['message']}\n\n"
            + written.rstrip()
        )
    pause_if("promote:planned")
    kept = keep_promoted(root, record["model"], record["model_version"])
    pushed += shipped.ship(root, sorted(d.name for d in kept.iterdir() if d.is_dir()))
    journal = PromotionJournal(
        base=record["code_commit"],  # the commit whose gate, tree and DVC state were checked
        model=record["model"],
        model_version=record["model_version"],
        record=written,
        message=p["message"],
        tag=p["tag"],
        version_tag=p["version_tag"],
        project=git.prefix(root),
    )
    promote_commit.begin(git_dir, journal)
    done = _done(journal, promote_commit.finish(root, git_dir, journal))
    return pushed + done + ("\n" + push_commit(root, promote_commit.tags(journal)) if push else "")


def _done(journal: PromotionJournal, commit: str) -> str:
    return (
        f"promote: {journal.model} is in production (commit {commit[:7]}, tags "
        f"{' and '.join(promote_commit.tags(journal))}); its files "
        f"are kept in {PROMOTED / journal.model_version}. The gate compares candidates with "
        "production, so `dvc repro` reruns it against this one (commit its results/gate.json). "
        f"`git push --atomic origin HEAD {' '.join(f'refs/tags/{t}' for t in promote_commit.tags(journal))}` "
        "publishes the commit with its tags, all or none (`promote --push` does it for you; a plain push "
        "leaves the tags behind)."
    )


def next_number(root: Path, name: str) -> int:
    """GTO's <n> of the next `name#prod#<n>` tag: after every earlier one, counted from the tags
    and from the promotion commits of models/production.json. A clone without the tags (a
    shallow CI checkout, a `git clone` of a branch whose tags were never pushed) would otherwise
    start again at 1 and name a second, different promotion like the first."""
    tags = [t for t in git.run(root, "tag", "--list", f"{name}#{STAGE}#*").splitlines() if t]
    tagged = max((int(t.rsplit("#", 1)[1]) for t in tags if t.rsplit("#", 1)[1].isdigit()), default=0)
    log = git.run(root, "log", "--format=%s", "--", str(PRODUCTION), check=False)
    committed = sum(is_promotion(line, name) for line in log.splitlines())
    return 1 + max(tagged, committed)
