"""The promoted model's exact bytes, shipped with the project: a read-only DVC remote inside it.

A fresh clone must answer `reprogate predict` with the committed production model. A model built
under the numeric pin rebuilds bitwise on any CPU that meets it (`make repro` at the promotion's
commit); one that does not (a promotion made before the pin, on other hardware, or from a commit
the workspace has moved past) must travel with the project. So `reprogate promote` pushes the
promoted model's files (an ensemble's members too) to the DVC remote `shipped`, a folder inside
the repository (models/shipped/, DVC's own content-addressed layout, declared in .dvc/config),
and commits what it added together with the record. Nothing else writes there: for everyone
else it is a read-only remote that comes with `git clone`.

`predict` and `serve` restore from it with `dvc get` at the promotion's commit (DVC reads that
commit's dvc.lock, so every file comes back under the md5 the commit recorded), into the kept
copy under models/.promoted/<version>/, when neither that copy nor the workspace holds the
promoted files.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from reprogate.specs.pipeline import PARTS
from reprogate.utils import dvc_cli, paths
from reprogate.utils.errors import UserError

REMOTE = "shipped"


def declared(root: Path) -> bool:
    """Does the project declare the shipped remote (in its committed .dvc/config)?"""
    proc = dvc_cli.call(root, "remote", "list")
    return proc.returncode == 0 and any(line.split()[:1] == [REMOTE] for line in proc.stdout.splitlines())


def outputs_under(root: Path, folders: list[str]) -> list[str]:
    """The dvc.lock outputs inside models/<folder>/ for each folder (a model's files are the
    outputs of several stages: train writes the weights, calibrate the policy), in the default
    pipeline's lock or the experiments' (an experiment's ensemble has members in both)."""
    outs: dict[str, str | None] = {}
    for lock in (root / dvc_cli.pipeline_file(part, dvc_cli.LOCK) for part in PARTS):
        outs |= dvc_cli.lock_outputs(lock.read_text() if lock.is_file() else None)
    prefixes = [f"{paths.model_dir(f).as_posix()}/" for f in folders]
    found = sorted(p for p in outs if any(p.startswith(x) for x in prefixes))
    missing = [f for f, x in zip(folders, prefixes, strict=True) if not any(p.startswith(x) for p in found)]
    if missing:
        raise UserError(
            f"promotion refused: dvc.lock records no outputs under "
            f"{', '.join(f'models/{m}/' for m in missing)}, so their files cannot be shipped with the "
            "project; run `dvc repro`, commit dvc.lock, and promote again. Production is unchanged."
        )
    return found


def ship(root: Path, folders: list[str]) -> str:
    """Push the files of models/<folder>/ for each folder to the shipped remote; what to say.
    Called before anything of the promotion is written: a failure leaves production as it was."""
    if not declared(root):
        return (
            f"promote: this project declares no DVC remote '{REMOTE}', so the promoted files are not "
            "shipped with it: a fresh clone answers only if `make repro` rebuilds them bitwise. "
            f"`dvc remote add {REMOTE} {paths.SHIPPED.as_posix()}` (then commit .dvc/config) ships "
            "them with every promotion.\n"
        )
    targets = outputs_under(root, folders)
    proc = dvc_cli.call(root, "push", "-r", REMOTE, *targets)
    if proc.returncode != 0:
        raise UserError(
            f"promotion refused: `dvc push -r {REMOTE}` of the promoted files to {paths.SHIPPED} failed "
            f"({dvc_cli.last_error(proc)}); production is unchanged. Free disk space or fix the folder's "
            "permissions, then promote again."
        )
    return f"promote: shipped the files of {', '.join(f'models/{f}' for f in folders)} in {paths.SHIPPED}\n"


def restore(root: Path, commit: str, folder: str, dest: Path) -> None:
    """models/<folder>/ as commit `commit` recorded it, from the shipped remote, into `dest`."""
    store = root / paths.SHIPPED  # present: production checks before making the kept copy
    source = paths.model_dir(folder).as_posix()
    print(f"reprogate: restoring {source} of {commit[:12]} from {paths.SHIPPED}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="reprogate-shipped-") as tmp:
        # The commit's own .dvc/config may predate the remote: this one is merged over it.
        config = Path(tmp) / "config"
        config.write_text(
            f"[core]\n    remote = {REMOTE}\n['remote \"{REMOTE}\"']\n    url = {store.resolve()}\n"
        )
        proc = dvc_cli.call(
            root, "get", str(root), source, "--rev", commit, "--config", str(config), "-o", str(dest)
        )
    if proc.returncode != 0:
        raise LookupError(f"`dvc get` of {source} at {commit[:12]} failed: {dvc_cli.last_error(proc)}")
