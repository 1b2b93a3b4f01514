"""`reprogate verify [REV]`: does a commit reproduce here? Rebuild it and say, per output.

The commit is checked out in a temporary git worktree and rebuilt from nothing with its own
code (PYTHONPATH names the worktree's src/) under its own pinned numeric environment, with a
DVC cache of its own and no run-cache, so nothing is restored instead of recomputed. Each
output of the commit's dvc.lock is then one of:
- bitwise: the same md5 as the commit's dvc.lock;
- within tolerance: a JSON file whose every string is equal and every number within
  `--tolerance` (the largest difference and the field it is in are said);
- different: anything else (a binary that differs, a JSON field that changed kind or text).
`--rebuilt DIR` compares a rebuild made elsewhere (a fresh clone after `make repro`) instead.
Exit status: 0 all bitwise, 1 some only within tolerance, 3 something different.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprogate.runtime import numerics
from reprogate.specs.roots import mirror_dirs
from reprogate.utils import dvc_cli, git
from reprogate.utils.errors import UserError

DVC_LOCK = Path("dvc.lock")
EXIT = {"bitwise": 0, "within tolerance": 1, "different": 3}
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
    if not rebuilt.is_file():
        return Verdict(path, "different", "not rebuilt")
    if committed is None or not path.endswith(".json"):
        return Verdict(path, "different", "other bytes")
    try:
        diff = _numbers(json.loads(committed), json.loads(rebuilt.read_bytes()))
    except (json.JSONDecodeError, UnicodeDecodeError):
        diff = None
    if diff is None:
        return Verdict(path, "different", "a field other than a number changed")
    moved, field = diff
    kind = "within tolerance" if moved <= tolerance else "different"
    return Verdict(path, kind, f"max difference {moved:.3g} in {field} (tolerance {tolerance:g})")


def compare(root: Path, rev: str, rebuilt: Path, tolerance: float) -> list[Verdict]:
    """`rebuilt` (a project folder after `dvc repro`) against commit `rev` of the project at `root`."""
    want = dvc_cli.lock_outputs(git.committed(root, DVC_LOCK, rev))
    if not want:
        raise UserError(f"{rev}: no {DVC_LOCK} with outputs at that commit; nothing to verify.")
    got = dvc_cli.lock_outputs((rebuilt / DVC_LOCK).read_text() if (rebuilt / DVC_LOCK).is_file() else "")
    out = []
    for path, md5 in sorted(want.items()):
        if got.get(path) == md5 and md5 is not None:
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


def rebuild(root: Path, rev: str, into: Path) -> Path:
    """Check `rev` out in a worktree under `into` and `dvc repro` it from nothing; the project
    folder of the rebuild."""
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
    proc = subprocess.run(
        [dvc_cli.executable(), "repro", "--no-run-cache"], cwd=project, env=env, stdout=sys.stderr
    )
    if proc.returncode != 0:
        raise UserError(
            f"verify: `dvc repro` of {rev} failed in {project} (exit {proc.returncode}; its output is "
            "above). The commit does not rebuild here at all: fix what it says, or verify another commit."
        )
    return project


def verify(root: Path, rev: str, rebuilt: Path | None, tolerance: float) -> tuple[int, str]:
    """(exit status, report) for commit `rev`."""
    commit = git.run(root, "rev-parse", "--verify", f"{rev}^{{commit}}", check=False)
    if not commit:
        raise UserError(f"verify: '{rev}' is not a commit of {root}; give a commit, branch or tag.")
    if rebuilt is not None:
        if not (rebuilt / DVC_LOCK).is_file():
            raise UserError(f"verify --rebuilt {rebuilt}: no {DVC_LOCK} there; run `make repro` in it first.")
        verdicts = compare(root, commit, rebuilt, tolerance)
    else:
        with tempfile.TemporaryDirectory(prefix="reprogate-verify-") as tmp:
            try:
                verdicts = compare(root, commit, rebuild(root, commit, Path(tmp)), tolerance)
            finally:
                git.run(root, "worktree", "remove", "--force", str(Path(tmp) / "tree"), check=False)
    lines = [f"{v.verdict:<17} {v.path}" + (f"  ({v.detail})" if v.detail else "") for v in verdicts]
    counts = {k: sum(v.verdict == k for v in verdicts) for k in EXIT}
    worst = max((v.verdict for v in verdicts), key=EXIT.__getitem__)
    lines.append(
        f"verify: {commit[:12]}: {counts['bitwise']} bitwise, {counts['within tolerance']} within "
        f"tolerance, {counts['different']} different of {len(verdicts)} outputs"
    )
    return EXIT[worst], "\n".join(lines)
