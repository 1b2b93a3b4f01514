"""Where a spec may reach: the project, the mirror, and the data roots params.yaml allows.

Every path a spec names is resolved (symlinks followed) and must land inside one of these
folders before anything opens it. Checking the resolved path, not the string, is what makes
`../`, absolute paths and a symlink under data/ pointing at /etc all the same refusal.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from reprogate.specs.base import FOLDERS
from reprogate.specs.reading import read_yaml
from reprogate.utils import paths
from reprogate.utils.errors import UserError


def _folders(root: Path, field: str) -> list[Path]:
    """A folder list of params.yaml (validated by the rule Params uses), resolved."""
    params = root / paths.PARAMS
    value = read_yaml(params).get(field) if params.is_file() else None
    try:
        entries = FOLDERS.validate_python(value)
    except ValidationError:
        raise UserError(
            f"{params}: field '{field}' is {value!r}; write a folder path or a list of them, "
            "e.g. ../shared/datasets."
        ) from None
    return [(root / e).resolve() for e in entries]


def mirror_dirs(root: Path) -> list[Path]:
    """REPROGATE_MIRROR (os.pathsep-separated) wins over params.yaml's `mirror`."""
    env = os.environ.get("REPROGATE_MIRROR")
    if env:
        return [(root / e).resolve() for e in env.split(os.pathsep) if e]
    return _folders(root, "mirror")


def allowed_roots(root: Path) -> list[Path]:
    """The project root, the mirror folders and params.yaml's data_roots, resolved."""
    return [root.resolve(), *mirror_dirs(root), *_folders(root, "data_roots")]


def inside(path: Path, roots: list[Path]) -> bool:
    """Whether `path`, after symlinks, lies in one of `roots` (already resolved)."""
    real = path.resolve()
    return any(real == r or real.is_relative_to(r) for r in roots)


def outside_message(shown: str, path: Path, roots: list[Path]) -> str:
    """Why `path` (written `shown` in the spec) is refused, and how to allow it on purpose;
    `roots` as allowed_roots gives them, the project first."""
    real = path.resolve()
    via = "" if real == path.absolute() else f" (it resolves to {real})"
    root = roots[0]
    shown_roots = ["the project folder"] + [os.path.relpath(r, root) for r in roots[1:]]
    return (
        f"{shown} is outside the folders a spec may read{via}; allowed: "
        f"{', '.join(shown_roots)}. Move the files into the project, or, for data kept "
        "on another disk, list that folder under data_roots in params.yaml"
    )


def confine(root: Path, shown: str, path: Path, roots: list[Path] | None = None) -> Path:
    """`path`, resolved, if it lies inside an allowed root; ValueError saying why otherwise."""
    roots = allowed_roots(root) if roots is None else roots
    if not inside(path, roots):
        raise ValueError(outside_message(shown, path, roots))
    return path.resolve()
