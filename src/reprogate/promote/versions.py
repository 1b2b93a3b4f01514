"""GTO's version tags: `<artifact>@v<semver>` beside the stage tag `<artifact>#prod#<n>`, both on
the promotion commit, so `gto show` lists the versions of every promoted model and the stage
each is in, and `dvc artifacts get . <artifact> --stage prod` finds its files.

Versions follow `gto register`'s own default: the greatest registered version with its patch
bumped, v0.0.1 first. A clone without the tags (tags are not fetched by every clone) counts the
promotion commits instead, as the stage tag's number does, so a version is never given twice.
"""

from __future__ import annotations

import re
from pathlib import Path

from reprogate.utils import git

SEMVER = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")


def versions(root: Path, name: str) -> list[tuple[int, int, int]]:
    tags = git.run(root, "tag", "--list", f"{name}@v*").splitlines()
    found = [SEMVER.match(t.removeprefix(f"{name}@")) for t in tags]
    return [(int(m[1]), int(m[2]), int(m[3])) for m in found if m]


def next_version(root: Path, name: str, promotions: int) -> str:
    """The version tag of `name`'s next promotion, its `promotions`-th (stage tag number)."""
    major, minor, patch = max(versions(root, name), default=(0, 0, 0))
    bumped = (major, minor, patch + 1)
    return f"{name}@v{'.'.join(map(str, max(bumped, (0, 0, promotions))))}"


def tags_at(root: Path, rev: str = "HEAD") -> list[str]:
    """The GTO tags of a promotion commit: its version tag, then its stage tag."""
    tags = git.run(root, "tag", "--points-at", rev, check=False).splitlines()
    return sorted((t for t in tags if "@v" in t or "#prod#" in t), key=lambda t: "#prod#" in t)
