"""`reprogate verify [REV]`: does a commit reproduce here? Rebuild it and say, per output.

The commit is checked out in a temporary git worktree and rebuilt from nothing with its own
code (PYTHONPATH names the worktree's src/) under its own pinned numeric environment, with a
DVC cache of its own and no run-cache, so nothing is restored instead of recomputed. Each
output of the commit's dvc.lock is then one of:
- bitwise: the file's own bytes hash to the md5 of the commit's dvc.lock (never the rebuild's
  dvc.lock, which a copy could forge);
- within tolerance: a JSON file whose every string is equal and every number within
  `--tolerance` (the largest difference and the field it is in are said);
- different: anything else (a binary that differs, a JSON field that changed kind or text);
- missing: not in the rebuild at all.
Then whether the decisions held (pipeline/decisions.py): every prediction's intent and route,
every gate verdict and the chosen candidate. `--rebuilt DIR` compares a rebuild made elsewhere
(a fresh clone after `make repro`) instead.
Exit status: 0 all bitwise, 1 some only within tolerance, 3 something different or missing,
4 a decision changed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reprogate.pipeline import decisions
from reprogate.runtime import numerics
from reprogate.specs.roots import mirror_dirs
from reprogate.utils import dvc_cli, git, paths
from reprogate.utils.errors import UserError

EXIT = {"bitwise": 0, "within tolerance": 1, "different": 3, "missing": 3}
# A decision that moved (an intent, a route, a gate verdict) is worse than any bits.
DECISIONS_CHANGED = 4
# Outputs bitwise or within tolerance, but a decision could not be compared (the commit's
# predictions in no cache, say): a caller must not read that as "held".
DECISIONS_UNCHECKED = 5
# The largest difference of a JSON number still called equal (docs/reproducibility.md says why).
DEFAULT_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Verdict:
    path: str
    verdict: str  # bitwise | within tolerance | different
    detail: str = ""


def _numbers(a: Any, b: Any, where: str = "") -> tuple[float, str] | None:
    """The largest |a - b| over two JSON trees of one shape, with its field; None if they differ
    in anything but numbers."""
    if isinstance(a, bool) or isinstance(b, bool) or not all(isinstance(x, int | float) for x in (a, b)):
        if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
            found = [_numbers(a[k], b[k], f"{where}.{k}" if where else str(k)) for k in a]
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            found = [_numbers(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))]
        else:
            return (0.0, where) if a == b else None
        if any(f is None for f in found):
            return None
        return max(found, default=(0.0, where), key=lambda f: f[0])
    if math.isnan(a) and math.isnan(b):
        return 0.0, where
    return abs(float(a) - float(b)), where


def compare_file(path: str, committed: bytes | None, rebuilt: Path, tolerance: float) -> Verdict:
    """A committed file and its rebuild that do not hash alike: within tolerance or different."""
    if rebuilt.is_dir():
        return Verdict(path, "different", "other files or bytes in the folder")
    if committed is None or not path.endswith(".json"):
        return Verdict(path, "different", "other bytes")
    try:
        diff = _numbers(json.loads(committed), json.loads(rebuilt.read_bytes()))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # deeper than any record
        diff = None
    if diff is None:
        return Verdict(path, "different", "a field other than a number changed")
    moved, field = diff
    kind = "within tolerance" if moved <= tolerance else "different"
    return Verdict(path, kind, f"max difference {moved:.3g} in {field} (tolerance {tolerance:g})")


def committed_outputs(root: Path, rev: str, part: str = "default") -> dict[str, str | None]:
    """The outputs of `rev`'s dvc.lock (of pipeline `part`) with their md5s, or a paragraph when
    it is unreadable."""
    lock = dvc_cli.pipeline_file(part, dvc_cli.LOCK)
    try:
        want = dvc_cli.lock_outputs(git.committed(root, lock, rev))
    except (yaml.YAMLError, AttributeError, TypeError, KeyError) as e:
        raise UserError(
            f"{rev}: {lock} at that commit is not a dvc.lock DVC wrote ({type(e).__name__}); "
            "verify a commit whose dvc.lock `dvc repro` wrote."
        ) from None
    if not want:
        raise UserError(f"{rev}: no {lock} with outputs at that commit; nothing to verify.")
    return want


def compare(root: Path, rev: str, rebuilt: Path, tolerance: float, part: str = "default") -> list[Verdict]:
    """`rebuilt` (a project folder after `dvc repro`) against commit `rev` of the project at `root`:
    every output hashed from its own bytes, never read from the rebuild's dvc.lock (which anyone
    can copy)."""
    out = []
    for path, md5 in sorted(committed_outputs(root, rev, part).items()):
        got = dvc_cli.output_md5(rebuilt / path)
        if got is None:
            out.append(Verdict(path, "missing", "not in the rebuilt folder"))
        elif got == md5:
            out.append(Verdict(path, "bitwise"))
        else:
            out.append(compare_file(path, git.committed(root, Path(path), rev), rebuilt / path, tolerance))
    return out


def launcher(tree: Path, into: Path) -> Path:
    """A `reprogate` command running the commit's own entry point (its pyproject's script, which
    an older commit names differently from this one's), on this environment's Python. The folder
    holding it goes first on PATH, so DVC's `reprogate stage ...` lines run the commit's code."""
    try:
        scripts = tomllib.loads((tree / "pyproject.toml").read_text())["project"]["scripts"]
        module, _, func = scripts["reprogate"].partition(":")
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        raise UserError(
            f"verify: {tree / 'pyproject.toml'} names no `reprogate` script ({e}); that commit is not a "
            "reprogate project this command can rebuild."
        ) from None
    bin_dir = into / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "reprogate"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
    script.chmod(0o755)
    return bin_dir


def _run_to_the_end(cmd: list[str], cwd: Path, env: dict[str, str]) -> int:
    """Run the rebuild's `dvc repro` in a process group of its own; if verify is stopped while it
    runs, stop the group (dvc and the stage it runs) before the worktree under them is removed,
    so no orphan keeps training in a deleted folder or writes a traceback after verify ended."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=sys.stderr, start_new_session=True)
    try:
        return proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        # Whatever of the group outlived dvc (a stage that ignores SIGTERM) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def rebuild(root: Path, rev: str, into: Path, part: str = "default") -> Path:
    """Check `rev` out in a worktree under `into` and `dvc repro` pipeline `part` from nothing
    (with what it reads of the other); the project folder of the rebuild."""
    tree = into / "tree"
    git.run(root, "worktree", "add", "--detach", str(tree), rev)
    project = tree / git.prefix(root)
    mirrors = [m for m in mirror_dirs(root) if m.is_dir()]
    # This process's pin is not passed on: the commit's own entry point sets its own (an older
    # commit, made before pins existed, runs as it ran then).
    env = {k: v for k, v in os.environ.items() if k not in numerics.VARIABLES}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(tree / "src"), os.environ.get("PYTHONPATH", "")]),
        "PATH": os.pathsep.join(
            [str(launcher(tree, into)), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
        ),
        **({"REPROGATE_MIRROR": os.pathsep.join(map(str, mirrors))} if mirrors else {}),
    }
    # Its own cache (the worktree's .dvc/cache is new) and no run-cache: computed, not restored.
    print(f"verify: rebuilding {rev} in {project} (dvc repro, from nothing)", file=sys.stderr, flush=True)
    target = str(dvc_cli.pipeline_file(part))
    returncode = _run_to_the_end([dvc_cli.executable(), "repro", "--no-run-cache", target], project, env)
    if returncode != 0:
        raise UserError(
            f"verify: `dvc repro` of {rev} failed in {project} (exit {returncode}; its output is "
            "above). The commit does not rebuild here at all: fix what it says, or verify another commit."
        )
    return project


WORKSPACE = "reprogate-verify-"  # the temporary folder of one rebuild: the worktree and its cache
OWNER = "owner.pid"  # in it: the verify process that made it


def remove_worktree(root: Path, tree: Path) -> None:
    """Remove a rebuild's worktree, also one that `git worktree add` left locked: a verify
    stopped while git was still checking the commit out ends its git, whose worktree then stays
    locked ("initializing"), and git removes a locked worktree only when forced twice."""
    git.run(root, "worktree", "remove", "--force", "--force", str(tree), check=False)


def clean_leftovers(root: Path) -> list[str]:
    """Remove the rebuild folders of verify runs that were killed (SIGKILL, a closed terminal)
    before they could clean up, and their git worktrees; what was removed, to be said."""
    said = []
    for folder in sorted(Path(tempfile.gettempdir()).glob(f"{WORKSPACE}*")):
        try:
            pid = int((folder / OWNER).read_text())
            os.kill(pid, 0)
            continue  # its verify is still running
        except ProcessLookupError:
            pass
        except (OSError, ValueError):
            if not (folder / "tree").exists():
                continue  # not a rebuild folder verify made
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
        remove_worktree(root, folder / "tree")
        shutil.rmtree(folder, ignore_errors=True)
        said.append(f"verify: removed {folder} ({size / 1e6:.0f} MB), left by a verify that was stopped")
    git.run(root, "worktree", "prune", check=False)
    return said


def _stop_cleanly(signum, frame) -> None:
    raise SystemExit(128 + signum)  # runs the finally blocks, which remove the worktree


def _decisions(root: Path, commit: str, rebuilt: Path, part: str) -> list[decisions.Held]:
    gate = paths.gate_files(part)[0]
    held = [decisions.gate(gate, git.committed(root, gate, commit), rebuilt)]
    folders = [p for p in committed_outputs(root, commit, part) if p.startswith("predictions/")]
    return held + ([decisions.predictions(root, commit, folders, rebuilt)] if folders else [])


def check_rebuilt(root: Path, rebuilt: Path, part: str, flag: str) -> None:
    """A folder given as a rebuild must be a project that `make repro` ran in, and not this
    project's own workspace (whose outputs are the commit's by construction, through a link or
    not): else one paragraph, before anything is compared."""
    make = "make repro" if part == "default" else f"make repro-{part}"
    fix = f"run `{make}` in a clone of the commit and give its folder"
    locks = [dvc_cli.LOCK, *([dvc_cli.pipeline_file(part, dvc_cli.LOCK)] if part != "default" else [])]
    missing = [str(f) for f in [*locks, Path("params.yaml")] if not (rebuilt / f).is_file()]
    if missing:
        raise UserError(
            f"{flag} {rebuilt}: no {' and '.join(missing)} there, so it is not a rebuilt project; {fix}."
        )
    if rebuilt.resolve() == root.resolve():
        raise UserError(
            f"{flag} {rebuilt}: that is this project's own workspace ({root.resolve()}), not a rebuild: "
            f"its outputs are the commit's without anything being rerun; {fix}."
        )


def verify(
    root: Path, rev: str, rebuilt: Path | None, tolerance: float, part: str = "default"
) -> tuple[int, str]:
    """(exit status, report) for commit `rev`'s pipeline `part` (default, or experiments): per
    output of its dvc.lock, and whether the decisions held (its gate's, its predictions)."""
    commit = git.run(root, "rev-parse", "--verify", f"{rev}^{{commit}}", check=False)
    if not commit:
        raise UserError(f"verify: '{rev}' is not a commit of {root}; give a commit, branch or tag.")
    if rebuilt is not None:
        check_rebuilt(root, rebuilt, part, "verify --rebuilt")
        verdicts = compare(root, commit, rebuilt, tolerance, part)
        held = _decisions(root, commit, rebuilt, part)
    else:
        for line in clean_leftovers(root):
            print(line, file=sys.stderr)
        signal.signal(signal.SIGTERM, _stop_cleanly)
        with tempfile.TemporaryDirectory(prefix=WORKSPACE) as tmp:
            (Path(tmp) / OWNER).write_text(str(os.getpid()))
            try:
                project = rebuild(root, commit, Path(tmp), part)
                verdicts = compare(root, commit, project, tolerance, part)
                held = _decisions(root, commit, project, part)
            finally:
                remove_worktree(root, Path(tmp) / "tree")
    lines = [f"{v.verdict:<17} {v.path}" + (f"  ({v.detail})" if v.detail else "") for v in verdicts]
    counts = {k: sum(v.verdict == k for v in verdicts) for k in EXIT}
    worst = max((v.verdict for v in verdicts), key=EXIT.__getitem__)
    lines += [h.line() for h in held]
    lines.append(
        f"verify: {commit[:12]}: {counts['bitwise']} bitwise, {counts['within tolerance']} within "
        f"tolerance, {counts['different']} different, {counts['missing']} missing of {len(verdicts)} "
        f"outputs; decisions {decisions.summary(held)}"
    )
    said = decisions.summary(held)
    status = EXIT[worst]
    if said == "changed":
        status = DECISIONS_CHANGED
    elif said == "unchecked" and status < EXIT["different"]:
        status = DECISIONS_UNCHECKED
    return status, "\n".join(lines)
