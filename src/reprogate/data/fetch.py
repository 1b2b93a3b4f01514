"""Pinned raw files: a local mirror first (by file name and sha256), then the pinned source.

Nothing is parsed before its sha256 matches the spec, and nothing is opened outside the folders
a spec may reach (specs/roots.py): a local file and a mirror hit are resolved and confined
first. Downloads land in data/raw/downloads/<sha256>/ (git- and DVC-ignored cache), a name
built here, never taken from the spec, through a temporary file, so a broken download never
looks complete and no file key can steer a write.
"""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from reprogate.specs.data import HfSource, LocalSource, Origin, UrlSource
from reprogate.specs.roots import allowed_roots, inside, mirror_dirs, outside_message
from reprogate.utils import paths
from reprogate.utils.errors import UserError
from reprogate.utils.hashing import sha256_file


def _from_mirror(name: str, sha: str, mirrors: list[Path]) -> Path | None:
    """A file of that name and sha256 in a mirror; a symlink there that leads out of every
    mirror folder is passed over unopened."""
    basename = Path(name).name
    for m in filter(Path.is_dir, mirrors):
        for candidate in sorted(m.rglob(basename)):
            if candidate.is_file() and inside(candidate, mirrors) and sha256_file(candidate) == sha:
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


def download_path(root: Path, fname: str, sha: str) -> Path:
    """Where a download is cached: below data/raw/, by its sha256; only the file key's last part
    (a plain name, checked by the spec) is kept, for a person reading the folder."""
    return root / paths.RAW / "downloads" / sha / Path(fname).name


def _download(url: str, dest: Path, sha: str, mirrors: list[Path], headers: dict[str, str]) -> str:
    """Download to `dest` and return the sha256 of what came; a file that does not match `sha`
    is deleted instead of landing in the cache."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(name)
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.build_opener(_SameHostAuth).open(request, timeout=60) as r, open(fd, "wb") as f:
            while block := r.read(1 << 20):
                f.write(block)
    except (urllib.error.URLError, OSError, ValueError) as e:
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
    roots = allowed_roots(root)
    out: dict[str, Path] = {}
    for fname, sha in origin.files.items():
        src = origin.source
        if isinstance(src, LocalSource):
            path = _local(spec_path, name, root / src.path, fname, roots)
            if (actual := sha256_file(path)) != sha:
                raise _mismatch(spec_path, name, fname, f"{path}, from local folder {src.path}", sha, actual)
        # Mirror, download cache and download are each verified on the way in.
        elif (path := _from_mirror(fname, sha, mirrors)) is None:
            path = download_path(root, fname, sha)
            if not inside(path.parent, [root.resolve() / paths.RAW]) or path.is_symlink():
                raise UserError(
                    f"{spec_path}: origins.{name}.files.{fname}: the download cache {path} leads out "
                    f"of {root / paths.RAW} through a symlink; remove the link and run again."
                )
            if not (path.is_file() and sha256_file(path) == sha):
                url = _url(src, fname)
                if (actual := _download(url, path, sha, mirrors, _headers(src))) != sha:
                    raise _mismatch(spec_path, name, fname, url, sha, actual)
        out[fname] = path
    return out


def _local(spec_path: Path, name: str, folder: Path, fname: str, roots: list[Path]) -> Path:
    """A local origin's file, resolved inside an allowed root (checked before it is opened)."""
    path = folder / fname
    if not inside(path, roots):
        raise UserError(
            f"{spec_path}: origins.{name}: "
            + outside_message(f"local file {fname} of {folder}", path, roots)
            + ". Nothing was read."
        )
    if not path.is_file():
        raise UserError(
            f"{spec_path}: origins.{name}.files: {fname} is missing from local folder {folder}; "
            f"put it there or fix origins.{name}.source.path."
        )
    return path.resolve()


def _mismatch(spec_path: Path, name: str, fname: str, where: str, sha: str, actual: str) -> UserError:
    return UserError(
        f"{spec_path}: origins.{name}.files.{fname}: sha256 mismatch ({where}): expected {sha}, "
        f"actual {actual}. The file changed or is the wrong one; restore the pinned file, or if "
        "the new file is intended, review it and put its sha256 in the spec. Nothing was written."
    )


def _url(src: UrlSource | HfSource, fname: str) -> str:
    if isinstance(src, UrlSource):
        # Placeholders replaced, not str.format: a template's {file.__class__} must not run.
        quoted = urllib.parse.quote(fname)
        return src.url.replace("{revision}", src.revision).replace("{file}", quoted)
    # The variables huggingface_hub itself reads: a mirror endpoint, and a token for gated or
    # private datasets. Either way the file must still match its pinned sha256.
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    return f"{endpoint}/datasets/{src.repo}/resolve/{src.revision}/{urllib.parse.quote(fname)}"


def _headers(src: UrlSource | HfSource) -> dict[str, str]:
    token = os.environ.get("HF_TOKEN") if isinstance(src, HfSource) else None
    return {"Authorization": f"Bearer {token}"} if token else {}
