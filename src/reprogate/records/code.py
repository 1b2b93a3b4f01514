"""code/<stage>.json (CodeIdentity) -- code -> DVC (every other stage depends on its own file),
train's fingerprint, promote.

A stage's code identity is the meaning of the modules it runs (utils/imports.py: their syntax
trees without docstrings or comments). DVC compares this file, not the source bytes, so a
comment reruns nothing and a real change reruns exactly the stages whose modules it touches.
"""

from __future__ import annotations

from pathlib import Path

from reprogate.records.base import Record, parse
from reprogate.utils import imports, paths


class CodeIdentity(Record):
    stage: str
    identity: str  # sha256 over the modules' meanings, in module order
    modules: dict[str, str]  # module -> sha256 of its meaning


def current(stage: str) -> CodeIdentity:
    identity, meanings = imports.stage_identity(stage)
    return CodeIdentity(stage=stage, identity=identity, modules=meanings)


def changed(old: CodeIdentity | None, new: CodeIdentity) -> list[str]:
    """The modules whose meaning differs (added or removed ones too), by name."""
    before = old.modules if old else {}
    return sorted(m for m in before.keys() | new.modules.keys() if before.get(m) != new.modules.get(m))


def stale(root: Path) -> list[str]:
    """The stages whose committed code/<stage>.json no longer says what their code means: a
    plain `git status` cannot tell, and DVC only finds out when stage `code` runs."""
    out = []
    for f in sorted((root / paths.CODE).glob("*.json")):
        saved, _ = parse(f, CodeIdentity)
        if saved is None or saved.identity != imports.stage_identity(f.stem)[0]:
            out.append(f.stem)
    return out
