"""Pinned raw files: a local mirror first (by file name and sha256), then the pinned source.

Nothing is parsed before its sha256 matches the spec. Downloads land in data/raw/ (git- and
DVC-ignored cache) through a temporary name, so a broken download never looks complete.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from pydantic import ValidationError

from reprogate.errors import UserError
from reprogate.hashing import sha256_file
from reprogate.specs import FOLDERS, HfSource, LocalSource, Origin, UrlSource


def mirror_dirs(root: Path) -> list[Path]:
    """REPROGATE_MIRROR (os.pathsep-separated) wins over params.yaml's `mirror`."""
    env = os.environ.get("REPROGATE_MIRROR")
    if env:
        entries = [e for e in env.split(os.pathsep) if e]
    else:
        params = root / "params.yaml"
        value = (yaml.safe_load(params.read_text()) or {}).get("mirror") if params.is_file() else None
        try:
            entries = FOLDERS.validate_python(value)  # the rule params.yaml is validated with
        except ValidationError:
            raise UserError(
                f"{params}: field 'mirror' is {value!r}; write a folder path or a list of them, "
                "e.g. ../shared/datasets."
            ) from None
    return [(root / e).resolve() for e in entries]


def _from_mirror(name: str, sha: str, mirrors: list[Path]) -> Path | None:
    basename = Path(name).name
    for m in filter(Path.is_dir, mirrors):
        for candidate in sorted(m.rglob(basename)):
            if candidate.is_file() and sha256_file(candidate) == sha:
                return candidate
    return None


def _searched(mirrors: list[Path]) -> str:
    if not mirrors:
        return "no mirror folder is configured"
    return "searched " + ", ".join(f"{m}{'' if m.is_dir() else ' (does not exist)'}" for m in mirrors)


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Redirects keep a token only on the host it was meant for. The hub sends large files to
    a storage host with a signed URL; the token must not travel there (and a second credential
    makes that host refuse the request), as huggingface_hub does through requests."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if (
            new is not None
            and urllib.parse.urlsplit(newurl).hostname != urllib.parse.urlsplit(req.full_url).hostname
        ):
            new.remove_header("Authorization")
        return new


def _download(url: str, dest: Path, sha: str, mirrors: list[Path], headers: dict[str, str]) -> str:
    """Download to `dest` and return the sha256 of what came; a file that does not match `sha`
    is deleted instead of landing in the cache."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.build_opener(_SameHostAuth).open(request, timeout=60) as r, open(tmp, "wb") as f:
            while block := r.read(1 << 20):
                f.write(block)
    except (urllib.error.URLError, OSError) as e:
        tmp.unlink(missing_ok=True)
        raise UserError(
            f"could not download {url} ({e}), and no mirror holds {dest.name} with sha256 {sha} "
            f"({_searched(mirrors)}). This machine may be offline: put the file in a mirror folder "
            "(params.yaml 'mirror', or REPROGATE_MIRROR, which overrides it; looked up by file name "
            "and sha256, in any subfolder) and run again."
        ) from None
    actual = sha256_file(tmp)
    if actual == sha:
        os.replace(tmp, dest)
    else:
        tmp.unlink()
    return actual


def fetch_origin(name: str, origin: Origin, spec_path: Path, root: Path) -> dict[str, Path]:
    """Return a verified local path for every file the origin pins, or raise UserError."""
    mirrors = mirror_dirs(root)
    out: dict[str, Path] = {}
    for fname, sha in origin.files.items():
        src = origin.source
        if isinstance(src, LocalSource):
            path = root / src.path / fname
            where = f"local folder {root / src.path}"
            if not path.is_file():
                raise UserError(
                    f"{spec_path}: origins.{name}.files: {fname} is missing from {where}; "
                    f"put it there or fix origins.{name}.source.path."
                )
            if (actual := sha256_file(path)) != sha:
                raise _mismatch(spec_path, name, fname, f"{path}, from {where}", sha, actual)
        # Mirror, download cache and download are each verified on the way in.
        elif (path := _from_mirror(fname, sha, mirrors)) is None:
            path = root / "data" / "raw" / name / src.revision / fname
            if not (path.is_file() and sha256_file(path) == sha):
                url = _url(src, fname)
                if (actual := _download(url, path, sha, mirrors, _headers(src))) != sha:
                    raise _mismatch(spec_path, name, fname, url, sha, actual)
        out[fname] = path
    return out


def _mismatch(spec_path: Path, name: str, fname: str, where: str, sha: str, actual: str) -> UserError:
    return UserError(
        f"{spec_path}: origins.{name}.files.{fname}: sha256 mismatch ({where}): expected {sha}, "
        f"actual {actual}. The file changed or is the wrong one; restore the pinned file, or if "
        "the new file is intended, review it and put its sha256 in the spec. Nothing was written."
    )


def _url(src: UrlSource | HfSource, fname: str) -> str:
    if isinstance(src, UrlSource):
        return src.url.format(revision=src.revision, file=fname)
    # The variables huggingface_hub itself reads: a mirror endpoint, and a token for gated or
    # private datasets. Either way the file must still match its pinned sha256.
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    return f"{endpoint}/datasets/{src.repo}/resolve/{src.revision}/{urllib.parse.quote(fname)}"


def _headers(src: UrlSource | HfSource) -> dict[str, str]:
    token = os.environ.get("HF_TOKEN") if isinstance(src, HfSource) else None
    return {"Authorization": f"Bearer {token}"} if token else {}
