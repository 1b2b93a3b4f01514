"""code/<stage>.json and code/<stage>/<family>.json (CodeIdentity) -- code -> DVC (every other
stage depends on its own file), train's fingerprint, promote.

A stage's code identity is the meaning of the modules it runs (utils/imports.py: their syntax
trees without docstrings or comments). A stage that runs for each model has one file per model
family: the modules of the stage and those its family's declaration names (specs/family.py), and,
for a family built from other candidates (an ensemble, an export), those of their families. DVC
compares these files, not the source bytes, so a comment reruns nothing and a real change reruns
exactly the stages whose modules it touches: an edit to one family's code, that family's stages.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from reprogate.records.base import Record, parse
from reprogate.specs.family import Family, family
from reprogate.utils import imports, paths


class CodeIdentity(Record):
    stage: str
    identity: str  # sha256 over the modules' meanings, in module order
    modules: dict[str, str]  # module -> sha256 of its meaning
    # The family as the specs name it, and those of the candidates it is built from: enough to
    # compute the identity again from this file alone (`stale`).
    family: str | None = None
    under: list[str] = []


def family_code(
    declared: Family, under: Iterable[Family] = (), parts: Iterable[str] | None = None
) -> tuple[str, ...]:
    """The modules a stage that runs `parts` of a family (None: all) runs for a model of
    `declared`, built from models of `under`."""
    chosen = None if parts is None else tuple(parts)
    return tuple(sorted({m for f in (declared, *under) for m in f.references_to_code(chosen)}))


def stage_family_code(stage: str, declared: Family, under: Iterable[Family] = ()) -> tuple[str, ...]:
    """The modules of a family (and of those it is built from) that `stage` runs: the parts its
    code asks for by name (`.part("scorer")`), and those the code of those parts asks for in
    turn, until nothing new is asked (read from the source, never listed by hand)."""
    under = tuple(under)
    asked = imports.parts_asked(imports.stage_modules(stage))
    while True:
        mods = family_code(declared, under, asked)
        more = imports.parts_asked(imports.closure(*mods))
        if asked is None or (more is not None and more <= asked):
            return mods
        asked = None if more is None else asked | more


def current(stage: str, named: str | None = None, under: Iterable[str] = ()) -> CodeIdentity:
    """What `stage` means now, for models of the family `named` (None: a stage of the pipeline)."""
    extra = stage_family_code(stage, family(named), [family(u) for u in under]) if named else ()
    identity, meanings = imports.stage_identity(stage, extra)
    return CodeIdentity(
        stage=stage, identity=identity, modules=meanings, family=named, under=sorted(set(under))
    )


def changed(old: CodeIdentity | None, new: CodeIdentity) -> list[str]:
    """The modules whose meaning differs (added or removed ones too), by name."""
    before = old.modules if old else {}
    return sorted(m for m in before.keys() | new.modules.keys() if before.get(m) != new.modules.get(m))


def saved_files(root: Path) -> list[Path]:
    """Every identity file under code/: code/<stage>.json and code/<stage>/<family>.json."""
    folder = root / paths.CODE
    return sorted([*folder.glob("*.json"), *folder.glob("*/*.json")])


def stale(root: Path) -> list[str]:
    """The identities whose committed file no longer says what their code means (`train/ngram`):
    a plain `git status` cannot tell, and DVC only finds out when stage `code` has run."""
    out = []
    folder = root / paths.CODE
    for f in saved_files(root):
        saved, _ = parse(f, CodeIdentity)
        try:
            now = saved and current(saved.stage, saved.family, saved.under)
        except ValueError:  # its family no longer resolves here: what it means is unknown
            now = None
        if saved is None or now is None or saved.identity != now.identity:
            out.append(f.relative_to(folder).with_suffix("").as_posix())
    return out
