"""What a promotion pins of a model folder's files, and the one check against it, made on the
files as read once (folder/manifest.py), so the bytes checked are the bytes then served.

The pins: the sha256 of each file of the promoted model's folder (models/production.json
`artifacts`; a promotion made from now on lists its members' folders too) and the md5 DVC
recorded for every output of every stage (dvc.lock at the commit the promotion was made from,
which covers an ensemble's members in any case). A folder is servable only when every file in
it is pinned and equal, and every pinned file is there: a labels.json with two labels swapped, a
refitted calibration, an extra tokenizer file, all are refused before a scorer is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reprogate.folder.manifest import Files
from reprogate.utils import dvc_cli, paths


@dataclass(frozen=True)
class Pins:
    sha256: dict[str, str]  # project-relative path -> sha256 (production.json artifacts)
    md5: dict[str, str] = field(default_factory=dict)  # dvc.lock outputs (a folder's ends in .dir)
    where: str = "models/production.json"  # said in every refusal

    def of(self, name: str) -> tuple[dict[str, str], dict[str, str]]:
        """(sha256 pins, md5 pins) of models/<name>/'s files, relative to that folder."""
        prefix = f"{paths.model_dir(name).as_posix()}/"
        cut = lambda d: {k[len(prefix) :]: v for k, v in d.items() if k.startswith(prefix) and v}  # noqa: E731
        return cut(self.sha256), cut(self.md5)


def mismatch(files: Files, name: str, pins: Pins) -> str | None:
    """Why `files` (read from a copy of models/<name>/) are not byte for byte what `pins` say,
    or None. Every hash is of the bytes read, which are the bytes a scorer then loads."""
    sha, md5 = pins.of(name)
    folder = files.dir
    if not sha and not md5:
        return f"{pins.where} pins no file of models/{name}/, so none of {folder} may be served"
    dirs = {d.removesuffix("/"): v for d, v in md5.items() if v.endswith(".dir")}
    for rel in files.data:
        here = folder / rel
        if rel in sha and (got := files.sha256(rel)) != sha[rel]:
            return f"{here} has sha256 {got}, but {pins.where} pins {sha[rel]}"
        if rel in md5 and rel not in dirs and (got := files.md5(rel)) != md5[rel]:
            return f"{here} has md5 {got}, but {pins.where} pins {md5[rel]}"
        # The record lists every file of a folder it pins; dvc.lock may pin a whole folder.
        listed = rel in sha or (not sha and (rel in md5 or any(rel.startswith(f"{d}/") for d in dirs)))
        if not listed:
            return f"{here} is a file {pins.where} does not pin"
    missing = sorted((set(sha) | set(md5) - set(dirs)) - set(files.data))
    missing += sorted(d for d in dirs if not files.under(d))
    if missing:
        return f"{folder / missing[0]} is missing, though {pins.where} pins it"
    for d, want in dirs.items():
        if (got := dvc_cli.tree_md5(files.under(d))) != want:
            return f"{folder / d}/ hashes to {got} as DVC hashes a folder, but {pins.where} pins {want}"
    return None


def verified(folder: Path, name: str, pins: Pins) -> tuple[Files, str | None]:
    """models/<name>/'s copy at `folder`, read once and checked against `pins`: (files, why not)."""
    files = Files.read(folder)
    return files, mismatch(files, name, pins)
